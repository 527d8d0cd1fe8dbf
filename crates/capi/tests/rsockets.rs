//! rsockets over the drop-in: rdma-core's own rsocket programs (Debian's `rstream`,
//! `riostream` and `rcopy`, unmodified) and unmodified TCP programs under
//! `LD_PRELOAD=librspreload.so`, over soft-iWARP and soft-RoCE, on 127.0.0.1 and between two
//! hosts (network namespaces joined by veth, 198.18.0.0/15). Every byte is checked:
//! `rstream -T v` and `riostream -T v` verify each transfer, `rcopy` copies a random file that
//! is compared afterwards, and `tcp_check` (tests/c, plain sockets) checks a pattern.
//! The same programs against Linux's own rsocket (kernel siw and rxe) are in `kernel_peer`.
//!
//! The namespace tests need root and iproute2 and are reported as ignored without them.

mod common;
mod multihost;

use common::{binary, compile_c_linked, dropin_dir, free_port, is_listening, listening_in, rxe_listening, Proc, Run};
use multihost::Hosts;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Bound on each program run.
const BOUND: Duration = Duration::from_secs(90);
/// rdma_cm's port space of stream ids (RDMA_PS_TCP), as soft-RoCE names its listeners.
const PS_TCP: u16 = 0x0106;
/// librspreload, from Debian's librdmacm1.
const PRELOAD: &str = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";

/// The tests of this file run one at a time: rstream spins (MSG_DONTWAIT) on both sides, and
/// two pairs at once on two cores only starve each other.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Iwarp,
    Roce,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Iwarp => "iwarp",
            Transport::Roce => "roce",
        }
    }

    fn device(self, netdev: &str) -> String {
        match self {
            Transport::Iwarp => format!("siw_{netdev}"),
            Transport::Roce => format!("rxe_{netdev}"),
        }
    }
}

/// A `SOFTRDMA_CONFIG` with one device of `t` on `netdev`.
fn config(t: Transport, netdev: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rsockets");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{netdev}.toml", t.name()));
    let text = format!(
        "[[device]]\nname = \"{}\"\ntransport = \"{}\"\nnetdev = \"{netdev}\"\n",
        t.device(netdev),
        t.name()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Where a program runs: this host (`None`) or a namespace, with its device list.
struct Side<'a> {
    hosts: Option<&'a Hosts>,
    ns: String,
    cfg: PathBuf,
}

impl Side<'_> {
    fn cmd(&self, prog: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
        let mut c = match self.hosts {
            Some(h) => h.cmd(&self.ns, prog, args),
            None => {
                let mut c = Command::new(prog);
                c.args(args);
                c
            }
        };
        c.env("LD_LIBRARY_PATH", dropin_dir())
            .env("SOFTRDMA_CONFIG", &self.cfg)
            .env_remove("SOFTRDMA_TRANSPORTS");
        c
    }
}

/// Waits until the server listens on `port` over `t` (iWARP: a TCP listener; RoCE: the
/// soft-RoCE service claim), in its own namespace.
fn listening(mut server: Proc, t: Transport, port: u16) -> Proc {
    let pid = server.pid();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ready = match t {
            Transport::Roce => rxe_listening(Some(pid), PS_TCP, port),
            Transport::Iwarp => listening_in(&format!("/proc/{pid}/net"), port),
        };
        if ready {
            return server;
        }
        if server.exited() {
            let r = server.kill();
            panic!("the server exited before listening on {port}\n{}", r.describe());
        }
        assert!(
            Instant::now() < deadline,
            "the server does not listen on {port} after 15 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `server` (waiting until it listens), then `client`; both must exit 0 within
/// [`BOUND`]. Returns (server, client).
fn pair(t: Transport, port: u16, mut server: Command, mut client: Command, what: &str) -> (Run, Run) {
    let srv = listening(Proc::start(&mut server), t, port);
    let cli = Proc::start(&mut client).wait(BOUND);
    let srv = if cli.code == Some(0) {
        srv.wait_or(BOUND, &format!("\n--- client\n{}", cli.describe()))
    } else {
        srv.kill()
    };
    assert_eq!(
        (cli.code, srv.code),
        (Some(0), Some(0)),
        "{what} over {t:?}\n--- client\n{}\n--- server\n{}",
        cli.describe(),
        srv.describe()
    );
    (srv, cli)
}

/// rstream and riostream with `-T v` (every transfer verified): a run of small messages
/// (the inline path) and one of 1 MiB messages (the receive ring wraps, credits return).
fn streams(t: Transport, server: &Side, client: &Side, server_addr: &str) {
    for prog in ["rstream", "riostream"] {
        for (size, count) in [("64", "2000"), ("1048576", "40")] {
            let port = free_port();
            let p = port.to_string();
            let args = ["-p", &p, "-S", size, "-C", count, "-T", "v"];
            let mut sargs = vec!["-b", server_addr];
            sargs.extend(args);
            let mut cargs = vec!["-s", server_addr];
            cargs.extend(args);
            let (s, c) = pair(
                t,
                port,
                server.cmd(binary(prog), &sargs),
                client.cmd(binary(prog), &cargs),
                &format!("{prog} -S {size} -C {count} -T v"),
            );
            for r in [&s, &c] {
                assert!(
                    r.stdout.lines().any(|l| l.starts_with("custom")),
                    "{prog}: no result line\n{}",
                    r.describe()
                );
            }
        }
    }
}

/// rcopy of a 6 MB random file; the copy must be identical.
fn rcopy(t: Transport, server: &Side, client: &Side, server_addr: &str) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rsockets");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("rcopy-src-{}", std::process::id()));
    let dst = dir.join(format!("rcopy-dst-{}-{}", std::process::id(), t.name()));
    let mut data = vec![0u8; 6_000_000];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ u64::from(std::process::id());
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(&src, &data).unwrap();
    let _ = std::fs::remove_file(&dst);
    let port = free_port();
    let p = port.to_string();
    let srv = listening(Proc::start(&mut server.cmd(binary("rcopy"), &["-p", &p])), t, port);
    let target = format!("{server_addr}:{}", dst.display());
    let cli = Proc::start(&mut client.cmd(binary("rcopy"), &[src.to_str().unwrap(), &target, "-p", &p])).wait(BOUND);
    // the rcopy server serves forever: stop it once the client is done
    let srv = srv.kill();
    assert_eq!(
        cli.code,
        Some(0),
        "rcopy over {t:?}\n--- client\n{}\n--- server\n{}",
        cli.describe(),
        srv.describe()
    );
    let copy = std::fs::read(&dst).unwrap_or_default();
    assert!(
        copy == data,
        "rcopy over {t:?}: the copy differs ({} of {} bytes)\n{}",
        copy.len(),
        data.len(),
        cli.describe()
    );
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&dst);
}

fn lo(t: Transport) -> Side<'static> {
    Side {
        hosts: None,
        ns: String::new(),
        cfg: config(t, "lo"),
    }
}

#[test]
fn rstream_riostream_and_rcopy_on_loopback() {
    let _serial = one_at_a_time();
    for t in [Transport::Iwarp, Transport::Roce] {
        streams(t, &lo(t), &lo(t), "127.0.0.1");
        rcopy(t, &lo(t), &lo(t), "127.0.0.1");
    }
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn rstream_riostream_and_rcopy_between_two_hosts() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("r") else { return };
    for t in [Transport::Iwarp, Transport::Roce] {
        let a = Side {
            hosts: Some(&h),
            ns: h.a.clone(),
            cfg: config(t, &h.veth_a),
        };
        let b = Side {
            hosts: Some(&h),
            ns: h.b.clone(),
            cfg: config(t, &h.veth_b),
        };
        streams(t, &a, &b, &h.addr_a);
        rcopy(t, &a, &b, &h.addr_a);
    }
}

/// `side.cmd(...)` with librspreload preloaded.
fn preloaded(side: &Side, prog: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
    let mut c = side.cmd(prog, args);
    c.env("LD_PRELOAD", PRELOAD);
    c
}

#[test]
fn unmodified_tcp_programs_over_rsockets_with_librspreload() {
    let _serial = one_at_a_time();
    assert!(
        Path::new(PRELOAD).is_file(),
        "{PRELOAD} is missing (install librdmacm1)"
    );
    let tcp_check = compile_c_linked("tcp_check", &[]);
    for t in [Transport::Iwarp, Transport::Roce] {
        let side = lo(t);
        // tcp_check: plain sockets, 64 MB with every byte checked
        let port = free_port();
        let p = port.to_string();
        let bytes = "64000000";
        let srv = listening(
            Proc::start(&mut preloaded(&side, &tcp_check, &["server", "127.0.0.1", &p, bytes])),
            t,
            port,
        );
        if t == Transport::Roce {
            // the program's listen() went to an rsocket over soft-RoCE, not to the kernel
            assert!(
                !is_listening(port),
                "tcp_check's listener is a kernel TCP socket: librspreload did not take it"
            );
        }
        let cli = Proc::start(&mut preloaded(&side, &tcp_check, &["client", "127.0.0.1", &p, bytes])).wait(BOUND);
        let srv = srv.wait_or(BOUND, &format!("\n--- client\n{}", cli.describe()));
        assert_eq!(
            (cli.code, srv.code),
            (Some(0), Some(0)),
            "tcp_check under librspreload over {t:?}\n--- client\n{}\n--- server\n{}",
            cli.describe(),
            srv.describe()
        );
        // iperf3 (no data check of its own): its control connection (the JSON exchange) and its
        // data stream, both rsockets; the server stops reading when the 2 s are up, so it may
        // count up to a receive buffer less than the client wrote
        let port = free_port();
        let p = port.to_string();
        let srv = listening(
            Proc::start(&mut preloaded(&side, "iperf3", &["-s", "-1", "-p", &p])),
            t,
            port,
        );
        let cli = Proc::start(&mut preloaded(
            &side,
            "iperf3",
            &["-c", "127.0.0.1", "-p", &p, "-t", "2", "-J"],
        ))
        .wait(BOUND);
        let srv = srv.wait_or(BOUND, &format!("\n--- client\n{}", cli.describe()));
        assert_eq!(
            (cli.code, srv.code),
            (Some(0), Some(0)),
            "iperf3 under librspreload over {t:?}\n--- client\n{}\n--- server\n{}",
            cli.describe(),
            srv.describe()
        );
        let report: serde_json::Value =
            serde_json::from_str(&cli.stdout).unwrap_or_else(|e| panic!("iperf3 -J: {e}\n{}", cli.describe()));
        let sent = report["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0);
        let received = report["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
        assert!(
            sent > 1_000_000 && received <= sent && received + (4 << 20) >= sent,
            "iperf3 over {t:?}: sent {sent}, the server received {received}\n{}",
            cli.describe()
        );
    }
}
