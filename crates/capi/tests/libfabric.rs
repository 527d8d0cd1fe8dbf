//! libfabric's verbs provider (Debian's libfabric1 / libfabric-bin 1.17, unmodified) over
//! softrdma, under `softrdma run`, in network namespaces joined by veth (198.18.0.0/15):
//!
//! - `fi_info -p verbs` lists an `FI_EP_MSG` domain and the `verbs;ofi_rxm` `FI_EP_RDM`
//!   domains for the soft-iWARP and the soft-RoCE device of the namespace's interface;
//! - `fi_pingpong -p verbs -e msg` and `-e rdm` (verbs;ofi_rxm) run between two processes of
//!   one host and between two hosts, over iWARP and over RoCE, every size of `-S all`, with
//!   `-c` (the receiver checks every buffer against the pattern; a mismatch fails the run).
//! - a server killed (SIGKILL) mid-run fails its client within 30 s (`-e msg` over both
//!   transports, `-e rdm` over RoCE; not `-e rdm` over iWARP, see the test);
//! - devices with `loopback = false`: within one host the server fails at once with
//!   softrdma's reason; between hosts `-e rdm` runs over them.
//! - 100 cycles of fi_getinfo (verbs), fi_fabric, fi_domain and their closes in one process
//!   leave no fd or thread behind (`tests/c/fi_cycles.c`, on `rxe_lo`; no root needed).
//!
//! Each host's `SOFTRDMA_CONFIG` lists only the device of the transport under test, on its
//! veth (not on `lo`): libfabric never lists a device on `lo` for MSG endpoints (it skips
//! the interface named `lo`), and a verbs MSG server with no address (fi_pingpong's) binds
//! "localhost", keeping only the domain of the device that address binds to (softrdma's
//! loopback device, LOOPBACK.md R5). Between hosts, fi_pingpong's server sends its client the
//! address it bound, so its host resolves `localhost` to its veth address
//! (`/etc/netns/<ns>/hosts`, which `ip netns exec` mounts over `/etc/hosts`); see the README.
//!
//! Needs root (namespaces) and libfabric-bin; reported as ignored without them.

mod common;
mod multihost;

use common::{compile_c_linked, dropin_dir, free_port, wait_listening_in_ns, Proc, Run};
use multihost::Hosts;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Bound on each fi_pingpong run (a run of every size takes a few seconds over RoCE).
const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// The tests of this file run one at a time: fi_pingpong polls, and two pairs at once on two
/// cores only starve each other's progress threads.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `softrdma` CLI of this workspace (cargo builds every binary before running tests).
fn softrdma() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("softrdma");
    assert!(p.is_file(), "{} not built (run `cargo build --workspace`)", p.display());
    p
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Iwarp,
    Roce,
}

impl Transport {
    fn device(self, netdev: &str) -> String {
        match self {
            Transport::Iwarp => format!("siw_{netdev}"),
            Transport::Roce => format!("rxe_{netdev}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Transport::Iwarp => "iwarp",
            Transport::Roce => "roce",
        }
    }
}

/// A `SOFTRDMA_CONFIG` with one device of `t` on `netdev`.
fn config(t: Transport, netdev: &str) -> PathBuf {
    config_with(t, netdev, true)
}

/// [`config`], with the device's `loopback` setting.
fn config_with(t: Transport, netdev: &str, loopback: bool) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("libfabric");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{netdev}-{loopback}.toml", t.name()));
    let text = format!(
        "[[device]]\nname = \"{}\"\ntransport = \"{}\"\nnetdev = \"{netdev}\"\nloopback = {loopback}\n",
        t.device(netdev),
        t.name()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `softrdma run -- args` in namespace `ns`, with `cfg` as the device list.
fn in_ns(h: &Hosts, ns: &str, cfg: &Path, args: &[&str]) -> Command {
    let mut run_args = vec!["run", "--"];
    run_args.extend_from_slice(args);
    let mut c = h.cmd(ns, softrdma(), &run_args);
    c.env("SOFTRDMA_DROPIN_DIR", dropin_dir())
        .env("SOFTRDMA_CONFIG", cfg)
        .env_remove("SOFTRDMA_TRANSPORTS")
        .env_remove("FI_PROVIDER");
    c
}

/// `/etc/netns/<ns>/hosts` naming `addr` `localhost` (mounted over /etc/hosts by
/// `ip netns exec`); removed on drop.
struct LocalhostIs {
    dir: PathBuf,
}

impl LocalhostIs {
    fn new(ns: &str, addr: &str) -> LocalhostIs {
        let dir = Path::new("/etc/netns").join(ns);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let g = LocalhostIs { dir };
        std::fs::write(g.dir.join("hosts"), format!("{addr} localhost\n")).unwrap();
        g
    }
}

impl Drop for LocalhostIs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The rows of fi_pingpong's table: (size column, #sent, #ack).
fn rows(out: &str) -> Vec<(String, String, String)> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 3 && f[0].as_bytes()[0].is_ascii_digit())
        .map(|f| (f[0].to_string(), f[1].to_string(), f[2].to_string()))
        .collect()
}

/// fi_pingpong `-e ep` over `t`: server in `server_ns` (device on `server_if`), client in
/// `client_ns` (device on `client_if`) connecting to `server_addr`. Both must exit 0 having
/// exchanged every size of `-S all` `ITERS` times with `-c`.
#[allow(clippy::too_many_arguments)]
fn pingpong(
    h: &Hosts,
    t: Transport,
    ep: &str,
    server_ns: &str,
    server_if: &str,
    client_ns: &str,
    client_if: &str,
    server_addr: &str,
    loopback: bool,
) {
    const ITERS: &str = "4";
    let port = free_port();
    let p = port.to_string();
    let (sdev, cdev) = (t.device(server_if), t.device(client_if));
    let common = ["fi_pingpong", "-p", "verbs", "-e", ep, "-c", "-S", "all", "-I", ITERS];
    let mut sargs = common.to_vec();
    sargs.extend(["-d", &sdev, "-B", &p]);
    let mut cargs = common.to_vec();
    cargs.extend(["-d", &cdev, "-P", &p, server_addr]);
    let what = format!("fi_pingpong -e {ep} over {t:?} ({sdev} ⇐ {cdev})");
    let mut server = Proc::start(&mut in_ns(h, server_ns, &config_with(t, server_if, loopback), &sargs));
    wait_listening_in_ns(&mut server, port);
    let mut client = Proc::start(&mut in_ns(h, client_ns, &config_with(t, client_if, loopback), &cargs));
    let deadline = Instant::now() + RUN_TIMEOUT;
    while !client.exited() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !client.exited() {
        let (c, s) = (client.kill(), server.kill());
        panic!(
            "{what} still running after {RUN_TIMEOUT:?} (a hang)\n--- client\n{}\n--- server\n{}",
            c.describe(),
            s.describe()
        );
    }
    let client = client.wait(Duration::from_secs(1));
    let server = server.wait_or(
        if client.code == Some(0) {
            RUN_TIMEOUT
        } else {
            Duration::from_secs(5)
        },
        &format!("\n--- client\n{}", client.describe()),
    );
    check(&what, &client, &server);
    check(&what, &server, &client);
}

/// One side's run: exit 0, and a table row for each size from 1 byte to 1 MiB (and beyond)
/// with every message sent and acknowledged.
fn check(what: &str, r: &Run, peer: &Run) {
    let ctx = || format!("{what}\n{}\n--- peer\n{}", r.describe(), peer.describe());
    assert_eq!(r.code, Some(0), "{}", ctx());
    let rows = rows(&r.stdout);
    for size in ["1", "64", "4k", "64k", "1m", "4m"] {
        assert!(rows.iter().any(|(s, _, _)| s == size), "no row for {size} B\n{}", ctx());
    }
    for (size, sent, ack) in &rows {
        assert!(
            sent == "4" && ack == "=4",
            "{size} B: sent {sent}, acknowledged {ack}\n{}",
            ctx()
        );
    }
    assert!(
        !r.stderr.contains("[error]") && !r.stdout.contains("[error]"),
        "an error was printed\n{}",
        ctx()
    );
}

/// `fi_info -p verbs` (no node) in host a with `t`'s device: the MSG domain, and RDM over
/// ofi_rxm on it.
fn fi_info_lists(h: &Hosts, t: Transport, extra: &[&str]) {
    let dev = t.device(&h.veth_a);
    let mut args = vec!["fi_info", "-p", "verbs"];
    args.extend_from_slice(extra);
    let r = Proc::start(&mut in_ns(h, &h.a, &config(t, &h.veth_a), &args)).wait(Duration::from_secs(30));
    assert_eq!(r.code, Some(0), "{}", r.describe());
    // fi_info prints one block per fi_info: "provider: P\n    fabric: ..\n    domain: D\n ..."
    let blocks: Vec<(String, String, String)> = r
        .stdout
        .split("provider: ")
        .skip(1)
        .map(|b| {
            let field = |k: &str| {
                b.lines()
                    .find_map(|l| l.trim().strip_prefix(k).map(|v| v.trim().to_string()))
                    .unwrap_or_default()
            };
            (
                b.lines().next().unwrap_or_default().trim().to_string(),
                field("domain:"),
                field("type:"),
            )
        })
        .collect();
    let has = |prov: &str, ty: &str| blocks.iter().any(|(p, d, t)| p == prov && *d == dev && t == ty);
    assert!(
        has("verbs", "FI_EP_MSG"),
        "no MSG domain {dev} ({extra:?})\n{}",
        r.describe()
    );
    assert!(
        has("verbs;ofi_rxm", "FI_EP_RDM"),
        "no verbs;ofi_rxm RDM domain {dev} ({extra:?})\n{}",
        r.describe()
    );
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs libfabric-bin (and the other consumers)")]
fn fi_info_lists_msg_and_rdm_domains() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("i") else { return };
    for t in [Transport::Iwarp, Transport::Roce] {
        fi_info_lists(&h, t, &[]);
        fi_info_lists(&h, t, &["-s", &h.addr_a]);
    }
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs libfabric-bin (and the other consumers)")]
fn fi_pingpong_msg_and_rdm_within_one_host() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("o") else { return };
    for t in [Transport::Iwarp, Transport::Roce] {
        for ep in ["msg", "rdm"] {
            pingpong(&h, t, ep, &h.a, &h.veth_a, &h.a, &h.veth_a, &h.addr_a, true);
        }
    }
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs libfabric-bin (and the other consumers)")]
fn fi_pingpong_msg_and_rdm_between_two_hosts() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("b") else { return };
    let _localhost = LocalhostIs::new(&h.a, &h.addr_a);
    for t in [Transport::Iwarp, Transport::Roce] {
        for ep in ["msg", "rdm"] {
            pingpong(&h, t, ep, &h.a, &h.veth_a, &h.b, &h.veth_b, &h.addr_a, true);
        }
    }
}

/// The pid of the running `fi_pingpong` whose command line has `marker` as an argument.
fn pingpong_pid(marker: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_pp = args.first().is_some_and(|a| a.ends_with(b"fi_pingpong"));
        (is_pp && args.contains(&marker.as_bytes())).then_some(pid)
    })
}

/// An endless `fi_pingpong -e ep` over `t` in host a; the server is killed (SIGKILL) after
/// 3 s of traffic: the client must fail (an error completion) within 30 s.
fn killed_server(h: &Hosts, t: Transport, ep: &str) {
    let port = free_port();
    let p = port.to_string();
    let dev = t.device(&h.veth_a);
    let cfg = config(t, &h.veth_a);
    let common = [
        "fi_pingpong",
        "-p",
        "verbs",
        "-e",
        ep,
        "-d",
        &dev,
        "-S",
        "65536",
        "-I",
        "100000000",
    ];
    let mut sargs = common.to_vec();
    sargs.extend(["-B", &p]);
    let mut cargs = common.to_vec();
    cargs.extend(["-P", &p, &h.addr_a]);
    let what = format!("fi_pingpong -e {ep} over {t:?}, server killed");
    let mut server = Proc::start(&mut in_ns(h, &h.a, &cfg, &sargs));
    wait_listening_in_ns(&mut server, port);
    let mut client = Proc::start(&mut in_ns(h, &h.a, &cfg, &cargs));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !client.exited(),
        "{what}: the client ended before the kill\n{}",
        client.kill().describe()
    );
    let pid = pingpong_pid(&p).unwrap_or_else(|| panic!("{what}: no fi_pingpong with -B {p}"));
    // SAFETY: kill(2) on a pid just read from /proc; no memory involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "{what}: kill {pid}");
    let killed_at = Instant::now();
    let bound = Duration::from_secs(30);
    while !client.exited() && killed_at.elapsed() < bound {
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = killed_at.elapsed();
    let server = server.wait(Duration::from_secs(10));
    let client = if client.exited() {
        client.wait(Duration::from_secs(1))
    } else {
        let c = client.kill();
        panic!(
            "{what}: the client still runs {bound:?} after the kill\n{}",
            c.describe()
        );
    };
    assert!(
        client.code.is_some_and(|c| c != 0) && (client.stderr.contains("[error]") || client.stdout.contains("[error]")),
        "{what}: the client must fail with an error\n{}\n--- server\n{}",
        client.describe(),
        server.describe()
    );
    eprintln!("{what}: the client failed {took:?} after the kill");
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs libfabric-bin (and the other consumers)")]
fn a_killed_server_fails_the_client_in_bounded_time() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("k") else { return };
    // RDM is not here: ofi_rxm does not fail a posted receive when a peer's connection dies
    // (it just closes that connection), so a client caught with nothing outstanding but its
    // receive waits forever. Over iWARP that is always the case (a SEND completes once TCP has
    // it, as on siw); over RoCE it depends on the moment of the kill (a SEND still waiting for
    // its ACK fails after the retries, 8.6 s): one CI run in several hung. See the README.
    for (t, ep) in [(Transport::Iwarp, "msg"), (Transport::Roce, "msg")] {
        killed_server(&h, t, ep);
    }
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs libfabric-bin (and the other consumers)")]
fn devices_without_loopback_refuse_one_host_and_serve_two() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("l") else { return };
    // Within one host: fi_pingpong's server binds "localhost", which no device serves; it
    // fails at once, softrdma saying why (SOFTRDMA_DEBUG=1), and exits (no signal, no hang).
    for t in [Transport::Iwarp, Transport::Roce] {
        let dev = t.device(&h.veth_a);
        let cfg = config_with(t, &h.veth_a, false);
        let port = free_port().to_string();
        let mut c = in_ns(
            &h,
            &h.a,
            &cfg,
            &["fi_pingpong", "-p", "verbs", "-e", "msg", "-d", &dev, "-B", &port],
        );
        c.env("SOFTRDMA_DEBUG", "1");
        let mut server = Proc::start(&mut c);
        wait_listening_in_ns(&mut server, port.parse().unwrap());
        // fi_pingpong calls fi_getinfo once its control connection is up
        let mut poke = h.cmd(
            &h.a,
            "bash",
            &["-c", &format!("exec 3<>/dev/tcp/{}/{port}; sleep 2", h.addr_a)],
        );
        let _poke = Proc::start(&mut poke);
        let r = server.wait(Duration::from_secs(15));
        assert!(
            matches!(r.code, Some(c) if c != 0),
            "{t:?}: the server must fail with an exit status\n{}",
            r.describe()
        );
        assert!(
            r.stderr.contains("no loopback-capable RDMA device") && r.stderr.contains("loopback disabled by config"),
            "{t:?}: softrdma must say why\n{}",
            r.describe()
        );
        assert!(
            r.stdout.contains("fi_getinfo()") || r.stderr.contains("fi_getinfo()"),
            "{}",
            r.describe()
        );
    }
    // Between hosts they serve (fi_pingpong's server host names its veth address localhost).
    let _localhost = LocalhostIs::new(&h.a, &h.addr_a);
    for t in [Transport::Iwarp, Transport::Roce] {
        pingpong(&h, t, "rdm", &h.a, &h.veth_a, &h.b, &h.veth_b, &h.addr_a, false);
    }
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs libfabric-dev (and the other consumers)")]
fn init_close_cycles_leave_no_fd_or_thread() {
    // 1 warm-up + 100 cycles of fi_getinfo (verbs), fi_fabric, fi_domain, closes and
    // fi_freeinfo in one process (tests/c/fi_cycles.c), on one device rxe_lo (on `lo`:
    // libfabric gives it a DGRAM domain); no namespaces needed
    let exe = compile_c_linked("fi_cycles", &["-lfabric".as_ref()]);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("libfabric");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("rxe_lo.toml");
    std::fs::write(
        &cfg,
        "[[device]]\nname = \"rxe_lo\"\ntransport = \"roce\"\nnetdev = \"lo\"\n",
    )
    .unwrap();
    let mut c = Command::new(softrdma());
    c.args(["run", "--"])
        .arg(&exe)
        .arg("100")
        .env("SOFTRDMA_DROPIN_DIR", dropin_dir())
        .env("SOFTRDMA_CONFIG", &cfg)
        .env_remove("FI_PROVIDER");
    let r = Proc::start(&mut c).wait(Duration::from_secs(60));
    assert!(
        r.code == Some(0) && r.stdout.contains("PASSED: 0 failure(s)") && r.stdout.contains("rxe_lo-dgram"),
        "{}",
        r.describe()
    );
    eprintln!(
        "{}",
        r.stdout
            .lines()
            .filter(|l| l.starts_with("after"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
