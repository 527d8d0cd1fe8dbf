//! Harness shared by the `softrdma perf` end-to-end tests (`perf_loopback`, `perf_netns`, `wire_capture`).
//!
//! Every child runs in its own process group and sits in a [`Proc`] guard that kills the group and reaps
//! the child on drop, so a failing or panicking test leaves no process behind. Every wait is bounded.
#![allow(dead_code)] // each test binary uses a different subset

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// The `softrdma` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_softrdma");
/// How long a server may take to print its `listening on` line.
pub const SERVER_START: Duration = Duration::from_secs(10);
/// How long a client may run.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server may take to exit after its client finished.
pub const SERVER_EXIT: Duration = Duration::from_secs(20);
/// The exact prefix of the server's one line on stderr once it listens.
pub const LISTENING: &str = "softrdma perf: listening on ";

/// True when the environment variable `CI` is set to something other than empty, `0` or `false`.
pub fn in_ci() -> bool {
    matches!(std::env::var("CI"), Ok(v) if !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// Reports that `test` cannot run here: prints a `SKIP` line, or panics when running in CI.
pub fn skip(test: &str, why: &str) {
    if in_ci() {
        panic!("{test}: cannot run, and CI is set so this is a failure, not a skip: {why}");
    }
    eprintln!("SKIP {test}: {why}");
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `prog` is an executable file in one of the `PATH` directories.
pub fn in_path(prog: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(prog)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// `n` distinct TCP ports that were free on 127.0.0.1 a moment ago.
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")).collect();
    listeners.iter().map(|l| l.local_addr().expect("local_addr").port()).collect()
}

/// Lines of one output stream of a child, read by a thread and handed over a channel.
struct Pipe {
    rx: Receiver<String>,
    text: String,
    eof: bool,
}

impl Pipe {
    fn new<R: Read + Send + 'static>(stream: R) -> Pipe {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(String::from_utf8_lossy(&buf).into_owned()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Pipe { rx, text: String::new(), eof: false }
    }

    /// The next line (newline included), or `None` at end of stream or once `deadline` has passed.
    fn line_before(&mut self, deadline: Instant) -> Option<String> {
        if self.eof {
            return None;
        }
        match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                self.text.push_str(&line);
                Some(line)
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.eof = true;
                None
            }
            Err(RecvTimeoutError::Timeout) => None,
        }
    }

    /// Everything read, after waiting for end of stream until `deadline` at most.
    fn drain(&mut self, deadline: Instant) -> String {
        while self.line_before(deadline).is_some() {}
        self.text.clone()
    }
}

/// What a finished (or killed) child left behind.
pub struct Finished {
    pub name: String,
    pub argv: Vec<String>,
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.is_some_and(|s| s.success())
    }

    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
}

impl fmt::Display for Finished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match (self.timed_out, self.status) {
            (true, _) => "TIMED OUT (killed)".to_string(),
            (false, Some(s)) => s.to_string(),
            (false, None) => "unknown status".to_string(),
        };
        writeln!(f, "== {}: {status}\n   command: {}", self.name, self.argv.join(" "))?;
        writeln!(f, "-- stdout --\n{}", self.stdout.trim_end())?;
        write!(f, "-- stderr --\n{}", self.stderr.trim_end())
    }
}

/// A running child in its own process group; dropping it kills the group and reaps the child.
pub struct Proc {
    pub name: String,
    argv: Vec<String>,
    child: Child,
    stdout: Pipe,
    stderr: Pipe,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Starts `argv` with stdin from /dev/null and stdout/stderr collected.
    pub fn spawn(name: &str, argv: &[&str]) -> Proc {
        let mut child = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot start {argv:?}: {e}"));
        let stdout = Pipe::new(child.stdout.take().expect("piped stdout"));
        let stderr = Pipe::new(child.stderr.take().expect("piped stderr"));
        Proc { name: name.to_string(), argv: argv.iter().map(|s| s.to_string()).collect(), child, stdout, stderr, status: None }
    }

    /// Kills the child's process group (unless the child already exited) and reaps the child.
    fn kill(&mut self) {
        if self.status.is_some() {
            return;
        }
        if let Ok(Some(status)) = self.child.try_wait() {
            self.status = Some(status);
            return;
        }
        // The child leads its own group (process_group(0)), so this also ends what it started
        // (dumpcap under wirecheck, a shell's servers) and nothing else.
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: plain kill(2) on the process group this guard created.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.kill();
        self.status = self.child.wait().ok();
    }

    fn finished(&mut self, timed_out: bool) -> Finished {
        let deadline = Instant::now() + Duration::from_secs(5);
        Finished {
            name: self.name.clone(),
            argv: self.argv.clone(),
            status: self.status,
            timed_out,
            stdout: self.stdout.drain(deadline),
            stderr: self.stderr.drain(deadline),
        }
    }

    /// Waits up to `timeout` for the child to exit; on timeout kills it. `Err` means it timed out.
    pub fn wait_for(&mut self, timeout: Duration) -> Result<Finished, Finished> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.status = Some(status);
                    return Ok(self.finished(false));
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    self.kill();
                    return Err(self.finished(true));
                }
                Err(e) => panic!("{}: wait failed: {e}", self.name),
            }
        }
    }

    /// Waits up to `timeout` for the child to exit; on timeout kills it and panics with its output.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Finished {
        self.wait_for(timeout)
            .unwrap_or_else(|out| panic!("{} did not finish within {timeout:?}\n{out}", self.name))
    }

    /// Kills the child now and returns what it printed.
    pub fn kill_now(&mut self) -> Finished {
        self.kill();
        self.finished(false)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `argv` to completion; panics (after killing it) if it takes longer than `timeout`.
pub fn run(name: &str, argv: &[&str], timeout: Duration) -> Finished {
    Proc::spawn(name, argv).wait_timeout(timeout)
}

/// A `softrdma perf` server that has printed its `listening on` line.
pub struct Server {
    pub proc: Proc,
    pub ip: String,
    pub port: u16,
}

/// Starts a server (`argv` may start with a wrapper such as `ip netns exec NS`) and waits up to
/// [`SERVER_START`] for `softrdma perf: listening on <ip>:<port>` on its stderr.
pub fn start_server(name: &str, argv: &[&str]) -> Server {
    let mut proc = Proc::spawn(name, argv);
    let deadline = Instant::now() + SERVER_START;
    while let Some(line) = proc.stderr.line_before(deadline) {
        let Some(addr) = line.trim_end().strip_prefix(LISTENING) else {
            continue;
        };
        let (ip, port) = addr.rsplit_once(':').unwrap_or_else(|| panic!("{name}: no port in {line:?}"));
        let port: u16 = port.parse().unwrap_or_else(|_| panic!("{name}: bad port in {line:?}"));
        assert_ne!(port, 0, "{name}: the listening line must show the bound port, not 0: {line:?}");
        let ip = ip.trim_start_matches('[').trim_end_matches(']').to_string();
        return Server { proc, ip, port };
    }
    let out = proc.kill_now();
    panic!("{name}: no `{LISTENING}<ip>:<port>` line on stderr within {SERVER_START:?} (or it exited)\n{out}");
}

/// One JSON object per non-empty stdout line.
pub fn json_lines(out: &Finished) -> Vec<Map<String, Value>> {
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match serde_json::from_str(l) {
            Ok(Value::Object(map)) => map,
            Ok(other) => panic!("{}: stdout line is JSON but not an object: {other}\n{out}", out.name),
            Err(e) => panic!("{}: stdout line is not JSON ({e}): {l:?}\n{out}", out.name),
        })
        .collect()
}

fn positive(obj: &Map<String, Value>, key: &str, ctx: &str) -> f64 {
    let v = obj.get(key).and_then(Value::as_f64).unwrap_or_else(|| panic!("{ctx}: `{key}` missing or not a number"));
    assert!(v.is_finite() && v > 0.0, "{ctx}: `{key}` = {v} is not a positive number");
    v
}

/// Checks the client's `--json` output: one object per size, the right keys, verified data, positive rates.
pub fn check_perf_json(test: &str, out: &Finished, sizes: &[u64], iters: u64) -> Vec<Map<String, Value>> {
    let objs = json_lines(out);
    assert_eq!(objs.len(), sizes.len(), "{test}: want one JSON object per size {sizes:?}\n{out}");
    let mut seen: Vec<u64> = Vec::new();
    for obj in &objs {
        let ctx = format!("{test}: JSON object {}\n{out}", Value::Object(obj.clone()));
        assert_eq!(obj.get("test").and_then(Value::as_str), Some(test), "{ctx}: `test`");
        let size = obj.get("size").and_then(Value::as_u64).unwrap_or_else(|| panic!("{ctx}: `size`"));
        seen.push(size);
        assert_eq!(obj.get("iterations").and_then(Value::as_u64), Some(iters), "{ctx}: `iterations`");
        assert_eq!(obj.get("verified"), Some(&Value::Bool(true)), "{ctx}: `verified`");
        if test.ends_with("-bw") {
            positive(obj, "gbit_per_s", &ctx);
            positive(obj, "msg_per_s", &ctx);
        } else {
            let p50 = positive(obj, "p50_us", &ctx);
            let p99 = positive(obj, "p99_us", &ctx);
            assert!(p99 >= p50, "{ctx}: p99_us < p50_us");
        }
    }
    let mut want = sizes.to_vec();
    want.sort_unstable();
    seen.sort_unstable();
    assert_eq!(seen, want, "{test}: sizes in the JSON output\n{out}");
    objs
}

/// Where and how to run one server/client pair.
pub struct Pair<'a> {
    pub test: &'a str,
    /// Address the server binds and the client connects to.
    pub addr: &'a str,
    /// Prepended to the server's command line (e.g. `ip netns exec A`).
    pub server_wrap: &'a [&'a str],
    /// Prepended to the client's command line.
    pub client_wrap: &'a [&'a str],
    /// Extra flags for both sides (e.g. `--mpa-crc`).
    pub extra: &'a [&'a str],
    pub sizes: &'a [u64],
    pub iters: u64,
}

/// Runs a server (`-p 0`) and a client against it; asserts both exit 0 and the JSON is right.
pub fn run_pair(p: &Pair<'_>) -> Vec<Map<String, Value>> {
    let test = p.test;
    let mut sargv: Vec<&str> = p.server_wrap.to_vec();
    sargv.extend([BIN, "perf", test, "-b", p.addr, "-p", "0"]);
    sargv.extend_from_slice(p.extra);
    let mut server = start_server(&format!("{test} server"), &sargv);
    assert_eq!(server.ip, p.addr, "{test}: server reports the bind address");

    let port = server.port.to_string();
    let sizes = p.sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let iters = p.iters.to_string();
    let mut cargv: Vec<&str> = p.client_wrap.to_vec();
    cargv.extend([BIN, "perf", test, p.addr, "-p", &port, "-s", &sizes, "-n", &iters, "--json"]);
    cargv.extend_from_slice(p.extra);
    let client = run(&format!("{test} client"), &cargv, CLIENT_TIMEOUT);

    let grace = if client.success() { SERVER_EXIT } else { Duration::from_secs(3) };
    let srv = server.proc.wait_for(grace).unwrap_or_else(|out| out);
    assert!(client.success() && srv.success(), "{test}: client and server must both exit 0\n{client}\n{srv}");
    check_perf_json(test, &client, p.sizes, p.iters)
}
