//! Helpers for the cross-host RoCE tests: two hosts (network namespaces joined by veth,
//! 198.18.0.0/15), random loss with nftables, captures with dumpcap checked by wirecheck,
//! the `SOFTRDMA_STATS=1` counters, and child processes of the test binary that speak a line
//! protocol on stdin/stdout. Everything is deleted on drop, also when a test panics.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// True under CI (`CI` set): a missing prerequisite fails the test instead of skipping it.
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// A prerequisite is missing: the test fails, saying which. (Tests that need root or the
/// capture tools are reported as ignored beforehand, see crates/capi/test_prereqs.rs; reaching
/// this means something else is missing.)
pub fn skip(why: &str) -> bool {
    panic!("cannot run{}: {why}", if under_ci() { " under CI" } else { "" });
}

/// True if `prog` is on `PATH`.
pub fn have(prog: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

fn run_ok(prog: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("{prog}: {e}"))?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{prog} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run_ok("ip", args, None).map(|_| ())
}

/// Two hosts `a` (198.18.K.1) and `b` (198.18.K.2): network namespaces joined by a veth pair.
/// Each namespace is a host of its own, so RoCE packets between them go to UDP 4791.
pub struct Hosts {
    pub a: String,
    pub b: String,
    pub addr_a: String,
    pub addr_b: String,
    /// IPv6 addresses (ULA `fd52:4f43:K::1` and `::2`), after [`Hosts::add_ipv6`]; empty before.
    pub addr6_a: String,
    pub addr6_b: String,
    /// Link-local IPv6 addresses (`fe80::52:1` and `fe80::52:2`), after [`Hosts::add_ipv6`].
    pub ll_a: String,
    pub ll_b: String,
    /// The veth ends: `veth_a` lives in `a`, `veth_b` in `b`.
    pub veth_a: String,
    pub veth_b: String,
}

impl Hosts {
    /// Creates the pair; `tag` (1–2 characters) keeps the names of concurrent tests apart.
    pub fn new(tag: &str) -> Result<Hosts, String> {
        let pid = std::process::id();
        let k = pid % 250 + 1;
        let h = Hosts {
            a: format!("srm{tag}{pid}a"),
            b: format!("srm{tag}{pid}b"),
            addr_a: format!("198.18.{k}.1"),
            addr_b: format!("198.18.{k}.2"),
            addr6_a: String::new(),
            addr6_b: String::new(),
            ll_a: String::new(),
            ll_b: String::new(),
            veth_a: format!("m{tag}{pid}a"),
            veth_b: format!("m{tag}{pid}b"),
        };
        ip(&["netns", "add", &h.a])?;
        // From here on, Drop deletes whatever was made.
        ip(&["netns", "add", &h.b])?;
        ip(&[
            "link", "add", &h.veth_a, "netns", &h.a, "type", "veth", "peer", "name", &h.veth_b, "netns", &h.b,
        ])?;
        for (ns, dev, addr) in [(&h.a, &h.veth_a, &h.addr_a), (&h.b, &h.veth_b, &h.addr_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        h.wait_running()?;
        Ok(h)
    }

    /// Gives both veth ends an IPv6 address of one /64 and a link-local one (`nodad`: usable
    /// at once). After the IPv4 address and before the link-local ones, the global one is
    /// GID 1 of each host's RoCE device.
    pub fn add_ipv6(&mut self) -> Result<(), String> {
        let k = std::process::id() % 250 + 1;
        self.addr6_a = format!("fd52:4f43:{k:x}::1");
        self.addr6_b = format!("fd52:4f43:{k:x}::2");
        self.ll_a = "fe80::52:1".into();
        self.ll_b = "fe80::52:2".into();
        for (ns, dev, addr, ll) in [
            (&self.a, &self.veth_a, &self.addr6_a, &self.ll_a),
            (&self.b, &self.veth_b, &self.addr6_b, &self.ll_b),
        ] {
            for a in [format!("{addr}/64"), format!("{ll}/64")] {
                ip(&["-n", ns, "-6", "addr", "add", &a, "dev", dev, "nodad"])?;
            }
        }
        Ok(())
    }

    /// The GID index of `ip` on RoCE device `dev` of host `ns`, as the device lists it there.
    pub fn gid_index(&self, ns: &str, dev: String, ip: &str) -> Option<usize> {
        let ip: std::net::IpAddr = ip.parse().ok()?;
        self.in_ns(ns, move || {
            softrdma_verbs::device::find_device(&dev)
                .ok()
                .and_then(|d| d.gid_index_of(ip))
        })
    }

    /// Runs `f` on a thread that joined namespace `ns` (sockets it makes stay there).
    pub fn in_ns<T: Send + 'static>(&self, ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{ns}");
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns on a valid namespace fd; it changes only this (short-lived) thread.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap()
    }

    /// Waits (10 s at most) until both veth ends are RUNNING as the devices see them: a port
    /// is ACTIVE only then, and the kernel sets the flag up to a second after `link set up`.
    fn wait_running(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        for (ns, dev) in [(&self.a, &self.veth_a), (&self.b, &self.veth_b)] {
            loop {
                let want = dev.clone();
                let running = self.in_ns(ns, move || {
                    softrdma_verbs::device::list_interfaces()
                        .map(|l| l.iter().any(|i| i.name == want && i.flags.up && i.flags.running))
                        .unwrap_or(false)
                });
                if running {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("{dev} in {ns} is not RUNNING after 10 s"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// The pair, or None after saying why not (not root); under CI a failure fails the test.
    pub fn or_skip(tag: &str) -> Option<Hosts> {
        match Hosts::new(tag) {
            Ok(h) => Some(h),
            Err(e) => {
                skip(&format!("cannot create network namespaces ({e}); run as root"));
                None
            }
        }
    }

    /// The soft-RoCE device of host `a` (`rxe_<veth>`).
    pub fn dev_a(&self) -> String {
        format!("rxe_{}", self.veth_a)
    }

    /// The soft-RoCE device of host `b`.
    pub fn dev_b(&self) -> String {
        format!("rxe_{}", self.veth_b)
    }

    /// `prog args...` to be run in namespace `ns`.
    pub fn cmd(&self, ns: &str, prog: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(prog).args(args);
        c
    }

    /// A UDP socket bound in namespace `ns` (made on a thread that joined it; the socket
    /// stays in that namespace).
    pub fn udp_socket_in(&self, ns: &str) -> UdpSocket {
        self.in_ns(ns, || UdpSocket::bind("0.0.0.0:0").unwrap())
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// Random loss with nftables inside one namespace: `percent`% of the UDP datagrams to port
/// 4791 that enter it and `percent`% of those that leave it are dropped (so both directions
/// of every flow through that host lose packets: requests, responses and ACKs). The table
/// goes away with the namespace.
pub struct Loss {
    ns: String,
}

impl Loss {
    pub const TABLE: &'static str = "srm_loss";

    pub fn add(ns: &str, percent: u32) -> Result<Loss, String> {
        let rules = format!(
            "table inet {t} {{\n\
             \x20 chain in {{ type filter hook input priority 0; udp dport 4791 numgen random mod 100 < {percent} counter drop; }}\n\
             \x20 chain out {{ type filter hook output priority 0; udp dport 4791 numgen random mod 100 < {percent} counter drop; }}\n\
             }}\n",
            t = Loss::TABLE
        );
        run_ok("ip", &["netns", "exec", ns, "nft", "-f", "-"], Some(&rules))?;
        Ok(Loss { ns: ns.to_string() })
    }

    /// Packets dropped so far (both chains).
    pub fn dropped(&self) -> u64 {
        let out = run_ok(
            "ip",
            &["netns", "exec", &self.ns, "nft", "list", "table", "inet", Loss::TABLE],
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        out.lines()
            .filter_map(|l| {
                let rest = &l[l.find("counter packets ")? + "counter packets ".len()..];
                rest.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum()
    }

    /// Stops dropping (the counters stay).
    pub fn stop(&self) {
        for chain in ["in", "out"] {
            let _ = run_ok(
                "ip",
                &[
                    "netns",
                    "exec",
                    &self.ns,
                    "nft",
                    "flush",
                    "chain",
                    "inet",
                    Loss::TABLE,
                    chain,
                ],
                None,
            );
        }
    }
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `../shared/wirecheck/wirecheck` next to the workspace (as in CI), if present.
pub fn wirecheck_path() -> Option<PathBuf> {
    ["../shared/wirecheck/wirecheck", "tools/wirecheck/wirecheck"]
        .into_iter()
        .map(|rel| workspace_root().join(rel))
        .find(|p| p.is_file())
}

/// Where captures are written.
pub fn capture_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("roce-multihost-captures");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// UDP port the capture canaries go to (discard); the capture filter includes it.
const CANARY_PORT: u16 = 9;

/// dumpcap on `veth_a` inside host `a`, recording RoCE (UDP 4791). Readiness and completeness
/// are proven with canary datagrams from host `b` (dumpcap announces itself before it is live
/// and writes in batches): started only once the first canary is in the file, stopped only
/// after a final one is.
pub struct Capture {
    pub file: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    canary: UdpSocket,
    to: String,
}

impl Capture {
    pub fn start(h: &Hosts, name: &str) -> Capture {
        let file = capture_dir().join(format!("{name}-{}.pcapng", std::process::id()));
        let log = file.with_extension("dumpcap.log");
        let _ = std::fs::remove_file(&file);
        let filter = format!("udp port 4791 or udp dst port {CANARY_PORT}");
        let child = h
            .cmd(
                &h.a,
                "dumpcap",
                &[
                    "-q",
                    "-i",
                    &h.veth_a,
                    "-s",
                    "0",
                    "-B",
                    "64",
                    "-f",
                    &filter,
                    "-w",
                    file.to_str().unwrap(),
                ],
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("dumpcap: {e}"));
        let mut cap = Capture {
            file,
            log,
            child: Some(child),
            canary: h.udp_socket_in(&h.b),
            to: format!("{}:{CANARY_PORT}", h.addr_a),
        };
        if !cap.canary_seen("start") {
            panic!("the capture did not become live within 15 s: {}", cap.log_text());
        }
        cap
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends canaries tagged `tag` until one shows up in the capture file (15 s at most).
    fn canary_seen(&mut self, tag: &str) -> bool {
        let mark = format!("softrdma-canary-{}-{tag}", std::process::id());
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("dumpcap exited ({st}): {}", self.log_text());
            }
            let _ = self.canary.send_to(mark.as_bytes(), &self.to);
            std::thread::sleep(Duration::from_millis(50));
            let data = std::fs::read(&self.file).unwrap_or_default();
            if data.windows(mark.len()).any(|w| w == mark.as_bytes()) {
                return true;
            }
        }
        false
    }

    /// Waits for the final canary, stops dumpcap (SIGINT) and checks it dropped nothing.
    pub fn stop(mut self) -> PathBuf {
        std::thread::sleep(Duration::from_millis(500));
        let flushed = self.canary_seen("end");
        let mut child = self.child.take().unwrap();
        // SAFETY: signalling our own child, which has not been reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = self.log_text();
        assert!(flushed, "the final canary never reached {}: {log}", self.file.display());
        // "Packets received/dropped on interface 'x': 123/0 (pcap:0/dumpcap:0/flushed:0/...)"
        let dropped = log
            .lines()
            .find_map(|l| {
                let rest = &l[l.find("received/dropped on interface")?..];
                let counts = rest.split("': ").nth(1)?.split_whitespace().next()?;
                counts.split('/').nth(1)?.parse::<u64>().ok()
            })
            .unwrap_or_else(|| panic!("no drop count in the dumpcap log: {log}"));
        assert_eq!(dropped, 0, "dumpcap dropped packets: the capture is incomplete\n{log}");
        let _ = std::fs::remove_file(&self.log);
        self.file.clone()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs wirecheck on `file` with `--expect` for each of `expect`; panics with its report
/// unless it passes. Returns the report.
pub fn wirecheck(checker: &Path, file: &Path, expect: &[&str]) -> String {
    let mut cmd = Command::new("python3");
    cmd.arg(checker).arg(file);
    for e in expect {
        cmd.args(["--expect", e]);
    }
    // tshark is slow on a loaded machine: a generous bound.
    let out = crate::common::Proc::start(&mut cmd).wait(Duration::from_secs(150));
    assert_eq!(
        out.code,
        Some(0),
        "wirecheck {} {expect:?} failed (capture kept)\n{}",
        file.display(),
        out.describe()
    );
    out.stdout
}

/// One QP's engine counters, as printed at destroy with `SOFTRDMA_STATS=1`.
#[derive(Debug, Default, Clone, Copy)]
pub struct QpStats {
    pub tx_packets: u64,
    pub rx_packets: u64,
    pub retransmitted_packets: u64,
    pub timeouts: u64,
    pub implied_naks: u64,
    pub psn_sequence_naks_received: u64,
    pub psn_sequence_naks_sent: u64,
    pub duplicates: u64,
    pub out_of_sequence_dropped: u64,
}

fn field(s: &str, name: &str) -> u64 {
    let key = format!("{name}: ");
    s.find(&key)
        .and_then(|at| {
            let rest = &s[at + key.len()..];
            let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
        .unwrap_or(0)
}

/// Every `softrdma: QP .. stats: RcStats { .. }` line of `stderr`.
pub fn parse_stats(stderr: &str) -> Vec<QpStats> {
    stderr
        .lines()
        .filter_map(|l| Some(&l[l.find("stats: RcStats {")?..]))
        .map(|s| {
            let sent = s.find("naks_sent: NakCounts {").map_or("", |i| &s[i..]);
            let recv = s.find("naks_received: NakCounts {").map_or("", |i| &s[i..]);
            QpStats {
                tx_packets: field(s, "tx_packets"),
                rx_packets: field(s, "rx_packets"),
                retransmitted_packets: field(s, "retransmitted_packets"),
                timeouts: field(s, "timeouts"),
                implied_naks: field(s, "implied_naks"),
                psn_sequence_naks_received: field(recv, "psn_sequence"),
                psn_sequence_naks_sent: field(sent, "psn_sequence"),
                duplicates: field(s, "duplicates"),
                out_of_sequence_dropped: field(s, "out_of_sequence_dropped"),
            }
        })
        .collect()
}

/// Sum of several QPs' counters.
pub fn total(stats: &[QpStats]) -> QpStats {
    let mut t = QpStats::default();
    for s in stats {
        t.tx_packets += s.tx_packets;
        t.rx_packets += s.rx_packets;
        t.retransmitted_packets += s.retransmitted_packets;
        t.timeouts += s.timeouts;
        t.implied_naks += s.implied_naks;
        t.psn_sequence_naks_received += s.psn_sequence_naks_received;
        t.psn_sequence_naks_sent += s.psn_sequence_naks_sent;
        t.duplicates += s.duplicates;
        t.out_of_sequence_dropped += s.out_of_sequence_dropped;
    }
    t
}

/// Prefix of protocol lines a child prints (libtest may print on the same line before it).
pub const MARK: &str = "@@ ";

/// A child process of this test binary, started in a namespace, that talks in lines:
/// it reads commands on stdin and prints `@@ `-prefixed lines on stdout. Killed on drop.
pub struct Peer {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    err_thread: Option<JoinHandle<()>>,
}

impl Peer {
    /// Runs test `test` of this binary in namespace `ns` with `env` (which must make the test
    /// act as the child).
    pub fn spawn(h: &Hosts, ns: &str, name: &str, test: &str, env: &[(&str, String)]) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = h.cmd(ns, exe, &[test, "--exact", "--nocapture", "--test-threads=1"]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let mut stderr_pipe = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                seen2.lock().unwrap().push(l.clone());
                if let Some(at) = l.find(MARK) {
                    let _ = tx.send(l[at + MARK.len()..].to_string());
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let stderr2 = stderr.clone();
        let err_thread = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                stderr2.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Peer {
            name: name.to_string(),
            stdin: child.stdin.take(),
            child,
            lines: rx,
            seen,
            stderr,
            err_thread: Some(err_thread),
        }
    }

    /// What the child printed so far (stdout and stderr), for failure messages.
    pub fn transcript(&self) -> String {
        format!(
            "--- {} stdout\n{}\n--- {} stderr\n{}",
            self.name,
            self.seen.lock().unwrap().join("\n"),
            self.name,
            self.stderr.lock().unwrap()
        )
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends one command line.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin closed");
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .unwrap_or_else(|e| panic!("{}: cannot write {line:?}: {e}\n{}", self.name, self.transcript()));
    }

    /// The rest of the next protocol line that starts with `word` (others are skipped);
    /// panics after `timeout`, or if the child says `error ...`. `context` is added to the
    /// failure message (e.g. the other peer's transcript).
    pub fn expect(&self, word: &str, timeout: Duration, context: &dyn Fn() -> String) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix("error ") {
                        panic!("{} failed: {rest}\n{}\n{}", self.name, self.transcript(), context());
                    }
                    if l == word {
                        return String::new();
                    }
                    if let Some(rest) = l.strip_prefix(&format!("{word} ")) {
                        return rest.to_string();
                    }
                }
                Err(e) => {
                    // Give the stderr reader a moment to catch up before reporting.
                    std::thread::sleep(Duration::from_millis(100));
                    panic!(
                        "{}: no {word:?} line within {timeout:?} ({e})\n{}\n{}",
                        self.name,
                        self.transcript(),
                        context()
                    )
                }
            }
        }
    }

    /// SIGKILL now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits for the exit (bounded); returns the status and the whole stderr.
    pub fn finish(mut self, timeout: Duration) -> (ExitStatus, String) {
        self.stdin.take();
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{} did not exit within {timeout:?}\n{}", self.name, self.transcript());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(t) = self.err_thread.take() {
            let _ = t.join();
        }
        (status, self.stderr())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
