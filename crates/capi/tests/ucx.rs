//! UCX (Debian's ucx-utils 1.13, unmodified) over softrdma's RoCE devices, started by
//! `softrdma run`, which gives each process the `/dev/infiniband` nodes and sysfs files UCX
//! looks for. `ucx_info -d` lists `rxe_lo` with `rc_verbs` and `ud_verbs`; `ucx_perftest` runs
//! between two processes over each: UCT active messages and puts, UCP tag matching. UCX declines
//! iWARP devices by design. ucx_perftest does not check the data it moves.
//!
//! Between two hosts (network namespaces joined by veth, 198.18.0.0/15; root only): UCT
//! `rc_verbs` puts and active messages, UCT `ud_verbs` active messages and UCP tag matching
//! at 8 B, 4 KiB and 1 MiB (each where UCX has the operation at that size); UCP over a
//! sockaddr connection made by UCX's rdmacm connection manager (`tests/c/ucx_sockaddr.c`: tag
//! messages checked byte by byte both ways, a 1 MiB put and a 4,099-byte get checked);
//! devices with `loopback = false` under the rdmacm connection manager. In one host: 100
//! UCX init/cleanup cycles in one process with no fd or thread left behind
//! (`tests/c/ucx_cycles.c`; libfabric's are in `libfabric.rs`).
//!
//! A peer killed (SIGKILL) mid-transfer, in one host and between two: the survivor of an
//! endless ucx_perftest must fail, non-zero and saying why, within 60 s (UCT `rc_verbs` and
//! `ud_verbs`; between hosts also UCP over `rc_verbs,ud_verbs` and over `ud_verbs`); a UCP
//! survivor idle at the kill (`tag_lat`, error handling on) must report the dead endpoint.

mod common;
mod multihost;

use common::{
    compile_c_linked, dropin_dir, free_port, rxe_listening, softrdma, wait_listening, wait_listening_in_ns, Proc, Run,
    TIMEOUT,
};
use multihost::Hosts;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `softrdma run -- <args>` with the drop-in of this test run and `env`.
fn run_cmd(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(softrdma());
    c.arg("run")
        .arg("--")
        .args(args)
        .env("SOFTRDMA_DROPIN_DIR", dropin_dir())
        .envs(env.iter().copied());
    c
}

/// A ucx_perftest server and client (each under `softrdma run`); the client's output.
fn perftest(args: &[&str], env: &[(&str, &str)]) -> Run {
    let port = free_port();
    let p = port.to_string();
    let mut server_args = vec!["ucx_perftest", "-p", &p];
    server_args.extend_from_slice(args);
    let mut server = Proc::start(&mut run_cmd(&server_args, env));
    wait_listening(&mut server, port);
    let mut client_args = vec!["ucx_perftest", "127.0.0.1", "-p", &p];
    client_args.extend_from_slice(args);
    let client = Proc::start(&mut run_cmd(&client_args, env)).wait(TIMEOUT);
    let server = server.wait_or(TIMEOUT, &client.describe());
    assert!(
        client.code == Some(0) && server.code == Some(0) && client.stdout.contains("Final:"),
        "ucx_perftest {args:?} {env:?} failed\n--- client\n{}\n--- server\n{}",
        client.describe(),
        server.describe()
    );
    client
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn ucx_info_lists_rxe_lo_with_rc_and_ud_verbs() {
    let r = Proc::start(&mut run_cmd(&["ucx_info", "-d"], &[])).wait(TIMEOUT);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let out = &r.stdout;
    for tl in ["rc_verbs", "ud_verbs"] {
        let listed = out
            .split("#      Transport: ")
            .any(|s| s.starts_with(tl) && s.contains("Device: rxe_lo:1"));
        assert!(listed, "{tl} on rxe_lo:1 not listed\n{}", r.describe());
    }
    assert!(
        !out.contains("Device: siw_lo:1"),
        "UCX declines iWARP\n{}",
        r.describe()
    );
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn ucx_info_lists_the_devices_for_an_unprivileged_user() {
    // the drop-in and the binary must be readable by nobody: they are under the target
    // directory, which cargo creates world-readable
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(softrdma())
        .args(["run", "--", "ucx_info", "-d"])
        .env("SOFTRDMA_DROPIN_DIR", dropin_dir());
    let r = Proc::start(&mut c).wait(TIMEOUT);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(r.stdout.contains("Device: rxe_lo:1"), "{}", r.describe());
    assert!(!r.stderr.contains("will not list"), "{}", r.describe());
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn uct_rc_verbs_active_messages_and_puts() {
    let d = ["-d", "rxe_lo:1", "-x", "rc_verbs", "-n", "200"];
    for extra in [
        &["-t", "am_lat", "-s", "8"][..],
        &["-t", "am_bw", "-s", "4096", "-D", "bcopy"],
        &["-t", "put_lat", "-s", "8"],
        &["-t", "put_bw", "-s", "4096", "-D", "bcopy"],
        &["-t", "put_bw", "-s", "1048576", "-D", "zcopy"],
    ] {
        perftest(&[&d[..], extra].concat(), &[]);
    }
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn uct_ud_verbs_active_messages() {
    let d = ["-d", "rxe_lo:1", "-x", "ud_verbs", "-n", "200"];
    for extra in [
        &["-t", "am_lat", "-s", "8"][..],
        &["-t", "am_bw", "-s", "4000", "-D", "bcopy"],
    ] {
        perftest(&[&d[..], extra].concat(), &[]);
    }
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn ucp_tag_matching_over_rc_and_ud() {
    for tls in ["rc_verbs,ud_verbs", "ud_verbs"] {
        let env = [("UCX_TLS", tls), ("UCX_NET_DEVICES", "rxe_lo:1")];
        for extra in [
            &["-t", "tag_lat", "-s", "8", "-n", "200"][..],
            &["-t", "tag_bw", "-s", "4096", "-n", "200"],
            &["-t", "tag_bw", "-s", "1048576", "-n", "20"],
        ] {
            perftest(extra, &env);
        }
    }
}

/// A `SOFTRDMA_CONFIG` with one device, `rxe_lo` on `lo`.
fn rxe_lo_config() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ucx");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rxe_lo.toml");
    std::fs::write(
        &path,
        "[[device]]\nname = \"rxe_lo\"\ntransport = \"roce\"\nnetdev = \"lo\"\n",
    )
    .unwrap();
    path
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs libucx-dev (and the other consumers)")]
fn ucx_init_cleanup_cycles_leave_no_fd_or_thread() {
    // 1 warm-up + 100 cycles of ucp_init, two workers, an endpoint between them over
    // rc_verbs/ud_verbs on rxe_lo, a checked 4 KiB message, cleanup (tests/c/ucx_cycles.c)
    let exe = compile_c_linked("ucx_cycles", &["-lucp".as_ref(), "-lucs".as_ref()]);
    let cfg = rxe_lo_config();
    let mut c = run_cmd(
        &[exe.to_str().unwrap(), "100"],
        &[("UCX_TLS", "rc_verbs,ud_verbs"), ("UCX_NET_DEVICES", "rxe_lo:1")],
    );
    c.env("SOFTRDMA_CONFIG", &cfg);
    let r = Proc::start(&mut c).wait(Duration::from_secs(120));
    assert!(
        r.code == Some(0) && r.stdout.contains("PASSED: 0 failure(s)"),
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

// ---- between two hosts ----------------------------------------------------------------

/// The multi-host tests run one at a time (two cores: two pairs of polling UCX processes
/// only starve each other).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The RoCE device of every host: the same name on both, because ucx_perftest's client sends
/// its parameters, `-d` included, to the server, which opens that device name.
const HOST_DEV: &str = "rxe_host";

/// A `SOFTRDMA_CONFIG` with one RoCE device [`HOST_DEV`] on `netdev`.
fn host_config(netdev: &str, loopback: bool) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ucx");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{netdev}-{loopback}.toml"));
    let text = format!(
        "[[device]]\nname = \"{HOST_DEV}\"\ntransport = \"roce\"\nnetdev = \"{netdev}\"\nloopback = {loopback}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `softrdma run -- args` in namespace `ns` with the device list `cfg` and `env`.
fn in_host(h: &Hosts, ns: &str, cfg: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut run_args = vec!["run", "--"];
    run_args.extend_from_slice(args);
    let mut c = h.cmd(ns, softrdma(), &run_args);
    c.env("SOFTRDMA_DROPIN_DIR", dropin_dir())
        .env("SOFTRDMA_CONFIG", cfg)
        .env_remove("SOFTRDMA_TRANSPORTS")
        .envs(env.iter().copied());
    c
}

/// ucx_perftest with `args`: server in host a, client in host b; both must exit 0 and the
/// client print its "Final:" line. Returns that line.
fn perftest_between(h: &Hosts, args: &[&str], env: &[(&str, &str)]) -> String {
    let port = free_port();
    let p = port.to_string();
    let (cfg_a, cfg_b) = (host_config(&h.veth_a, true), host_config(&h.veth_b, true));
    let mut sargs = vec!["ucx_perftest", "-p", &p];
    sargs.extend_from_slice(args);
    let mut server = Proc::start(&mut in_host(h, &h.a, &cfg_a, &sargs, env));
    wait_listening_in_ns(&mut server, port);
    let mut cargs = vec!["ucx_perftest", &h.addr_a, "-p", &p];
    cargs.extend_from_slice(args);
    let client = Proc::start(&mut in_host(h, &h.b, &cfg_b, &cargs, env)).wait(TIMEOUT);
    let server = server.wait_or(TIMEOUT, &client.describe());
    let fin = client
        .stdout
        .lines()
        .find(|l| l.starts_with("Final:"))
        .map(str::to_owned);
    assert!(
        client.code == Some(0) && server.code == Some(0) && fin.is_some(),
        "ucx_perftest {args:?} {env:?} between hosts failed\n--- client\n{}\n--- server\n{}",
        client.describe(),
        server.describe()
    );
    let fin = fin.unwrap();
    eprintln!("{args:?} {env:?}: {fin} ({:?})", client.elapsed);
    fin
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn uct_rc_verbs_between_two_hosts() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("u") else { return };
    let d = ["-d", "rxe_host:1", "-x", "rc_verbs"];
    // am_bw stops at 4 KiB: rc_verbs active messages go up to the segment size (8 KiB,
    // "larger than max supported (8255)" beyond); puts of 1 MiB are zcopy.
    for extra in [
        &["-t", "put_lat", "-s", "8", "-n", "1000"][..],
        &["-t", "put_lat", "-s", "4096", "-D", "bcopy", "-n", "200"],
        &["-t", "put_lat", "-s", "1048576", "-D", "zcopy", "-n", "20"],
        &["-t", "put_bw", "-s", "8", "-n", "1000"],
        &["-t", "put_bw", "-s", "4096", "-D", "bcopy", "-n", "200"],
        &["-t", "put_bw", "-s", "1048576", "-D", "zcopy", "-n", "20"],
        &["-t", "am_bw", "-s", "8", "-n", "1000"],
        &["-t", "am_bw", "-s", "4096", "-D", "bcopy", "-n", "200"],
    ] {
        perftest_between(&h, &[&d[..], extra].concat(), &[]);
    }
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn uct_ud_verbs_between_two_hosts() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("v") else { return };
    let d = ["-d", "rxe_host:1", "-x", "ud_verbs"];
    // UD has no puts, and its active messages fit one packet: the veth's MTU (1500) gives a
    // 1024-byte path MTU, 1016 bytes of message ("larger than max supported (1016)").
    for extra in [
        &["-t", "am_lat", "-s", "8", "-n", "1000"][..],
        &["-t", "am_bw", "-s", "8", "-n", "1000"],
        &["-t", "am_bw", "-s", "1000", "-D", "bcopy", "-n", "200"],
    ] {
        perftest_between(&h, &[&d[..], extra].concat(), &[]);
    }
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn ucp_tag_matching_between_two_hosts() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("w") else { return };
    for tls in ["rc_verbs,ud_verbs", "ud_verbs"] {
        let env = [("UCX_TLS", tls), ("UCX_NET_DEVICES", "rxe_host:1")];
        for test in ["tag_lat", "tag_bw"] {
            for (size, n) in [("8", "1000"), ("4096", "200"), ("1048576", "20")] {
                perftest_between(&h, &["-t", test, "-s", size, "-n", n], &env);
            }
        }
    }
}

/// `tests/c/ucx_sockaddr.c`, built once per test binary.
fn ucx_sockaddr() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| compile_c_linked("ucx_sockaddr", &["-lucp".as_ref(), "-lucs".as_ref()]))
}

/// UCX's environment for a sockaddr connection through its rdmacm connection manager only.
const RDMACM_ENV: [(&str, &str); 4] = [
    ("UCX_SOCKADDR_TLS_PRIORITY", "rdmacm"),
    ("UCX_TLS", "rc_verbs,ud_verbs"),
    ("UCX_NET_DEVICES", "rxe_host:1"),
    ("UCX_LOG_LEVEL", "debug"),
];

/// Waits (10 s at most) until the process `server` listens with rdma_cm on soft-RoCE TCP
/// port `port` (RDMA_PS_TCP) in its namespace.
fn wait_rdmacm_listening(server: &mut Proc, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !rxe_listening(Some(server.pid()), 0x0106, port) {
        assert!(!server.exited(), "the server exited before listening");
        assert!(
            Instant::now() < deadline,
            "no rdma_cm listener on port {port} after 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// ucx_sockaddr server in `server_ns` on `server_addr` and client in `client_ns`: both pass
/// their checks, and UCX says it used the rdmacm connection manager.
fn sockaddr_session(h: &Hosts, server_ns: &str, server_cfg: &Path, client_ns: &str, client_cfg: &Path, addr: &str) {
    let exe = ucx_sockaddr().to_str().unwrap();
    let port = free_port();
    let p = port.to_string();
    let mut server = Proc::start(&mut in_host(
        h,
        server_ns,
        server_cfg,
        &[exe, "server", addr, &p],
        &RDMACM_ENV,
    ));
    wait_rdmacm_listening(&mut server, port);
    let client = Proc::start(&mut in_host(
        h,
        client_ns,
        client_cfg,
        &[exe, "client", addr, &p],
        &RDMACM_ENV,
    ))
    .wait(TIMEOUT);
    let server = server.wait_or(TIMEOUT, &client.describe());
    let ctx = || format!("--- client\n{}\n--- server\n{}", client.describe(), server.describe());
    for r in [&client, &server] {
        assert!(
            r.code == Some(0) && r.stdout.contains("PASSED: 0 failure(s)"),
            "ucx_sockaddr failed\n{}",
            ctx()
        );
        let log = format!("{}{}", r.stdout, r.stderr);
        assert!(log.contains("lane[0]: cm rdmacm"), "no rdmacm CM lane\n{}", ctx());
    }
    let passed = |r: &Run, what: &str| r.stdout.lines().any(|l| l.starts_with("ok   ") && l.contains(what));
    for (r, what) in [
        (&client, "1048576 B x 5: every byte echoed checked"),
        (&server, "1048576 B x 5: every byte received checked"),
        (&client, "ucp_put_nbx of 1 MiB"),
        (&client, "ucp_get_nbx of 4099 bytes at an odd offset"),
        (&server, "every byte of the 1 MiB put arrived"),
    ] {
        assert!(passed(r, what), "no passing check {what:?}\n{}", ctx());
    }
    let slog = format!("{}{}", server.stdout, server.stderr);
    assert!(
        slog.contains("connection request on the rdmacm sockaddr transport"),
        "the server's request did not come through rdmacm\n{}",
        ctx()
    );
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs libucx-dev (and the other consumers)")]
fn ucp_sockaddr_over_the_rdmacm_connection_manager() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("x") else { return };
    let (cfg_a, cfg_b) = (host_config(&h.veth_a, true), host_config(&h.veth_b, true));
    // both in host a (the device's own address), then between the hosts
    sockaddr_session(&h, &h.a, &cfg_a, &h.a, &cfg_a, &h.addr_a);
    sockaddr_session(&h, &h.a, &cfg_a, &h.b, &cfg_b, &h.addr_a);
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs libucx-dev (and the other consumers)")]
fn devices_without_loopback_under_ucx() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("y") else { return };
    let (cfg_a, cfg_b) = (host_config(&h.veth_a, false), host_config(&h.veth_b, false));
    let exe = ucx_sockaddr().to_str().unwrap();
    let mut env = RDMACM_ENV.to_vec();
    env.push(("SOFTRDMA_DEBUG", "1"));
    let reason = "no loopback-capable RDMA device (rxe_host: loopback disabled by config)";
    // A listener on 127.0.0.1: no device may serve it. UCX refuses the listener (it reads
    // rdma_bind_addr's EADDRNOTAVAIL as "Device is busy"), softrdma says why, nothing crashes.
    let p = free_port().to_string();
    let r = Proc::start(&mut in_host(&h, &h.a, &cfg_a, &[exe, "server", "127.0.0.1", &p], &env))
        .wait(Duration::from_secs(15));
    assert!(
        r.code == Some(1) && r.stdout.contains("FAIL ucp_listener_create") && r.stderr.contains(reason),
        "a listener on 127.0.0.1 must fail, saying why\n{}",
        r.describe()
    );
    // A client of 127.0.0.1 (a server listening on the veth address, as it may): the
    // connection fails in bounded time with an error status, softrdma saying why.
    let port = free_port();
    let p = port.to_string();
    let mut server = Proc::start(&mut in_host(&h, &h.a, &cfg_a, &[exe, "server", &h.addr_a, &p], &env));
    wait_rdmacm_listening(&mut server, port);
    let c = Proc::start(&mut in_host(&h, &h.a, &cfg_a, &[exe, "client", "127.0.0.1", &p], &env))
        .wait(Duration::from_secs(25));
    let s = server.kill();
    assert!(
        c.code == Some(1) && c.stdout.contains("FAILED:") && c.stderr.contains(reason),
        "a client of 127.0.0.1 must fail, saying why\n{}\n--- server\n{}",
        c.describe(),
        s.describe()
    );
    // A client of the host's own veth address: the device may not loop back (LOOPBACK.md R6),
    // rdma_cm answers ADDR_ERROR; UCX says "Destination is unreachable", softrdma why.
    let port = free_port();
    let p = port.to_string();
    let mut server = Proc::start(&mut in_host(&h, &h.a, &cfg_a, &[exe, "server", &h.addr_a, &p], &env));
    wait_rdmacm_listening(&mut server, port);
    let c = Proc::start(&mut in_host(&h, &h.a, &cfg_a, &[exe, "client", &h.addr_a, &p], &env))
        .wait(Duration::from_secs(25));
    let s = server.kill();
    assert!(
        c.code == Some(1)
            && c.stdout.contains("FAILED:")
            && c.stderr.contains("RDMA_CM_EVENT_ADDR_ERROR")
            && c.stderr.contains("cannot loop back (loopback disabled by config)"),
        "a client of the host's own address must fail, saying why\n{}\n--- server\n{}",
        c.describe(),
        s.describe()
    );
    // Between the hosts the same devices serve.
    sockaddr_session(&h, &h.a, &cfg_a, &h.b, &cfg_b, &h.addr_a);
}

// ---- a peer killed mid-transfer ---------------------------------------------------------

/// How long a survivor may take to fail once its peer is dead.
const KILLED_PEER_BOUND: Duration = Duration::from_secs(60);

/// An endless ucx_perftest (the server started by `server`, the client by `client`, each given
/// the port; `listening` waits for the server): once the client has moved data for 5 s the
/// server is killed (SIGKILL), and the client must
/// then fail, non-zero, within [`KILLED_PEER_BOUND`], printing `error`. Returns how long it
/// took after the kill.
fn killed_server(
    listening: fn(&mut Proc, u16),
    server: &mut dyn FnMut(&str) -> Command,
    client: &mut dyn FnMut(&str) -> Command,
    error: &str,
) -> Duration {
    let port = free_port();
    let p = port.to_string();
    let mut srv = Proc::start(&mut server(&p));
    listening(&mut srv, port);
    let mut cli = Proc::start(&mut client(&p));
    std::thread::sleep(Duration::from_secs(5));
    assert!(!cli.exited(), "the client ended before the kill");
    let killed_at = Instant::now();
    let s = srv.kill();
    let c = cli.wait_or(KILLED_PEER_BOUND, &format!("\n--- the killed server\n{}", s.describe()));
    let took = killed_at.elapsed();
    let ctx = || format!("--- client\n{}\n--- the killed server\n{}", c.describe(), s.describe());
    assert!(
        c.stdout.contains("[thread 0]") && !c.stdout.contains("Final:"),
        "the client was not mid-transfer at the kill\n{}",
        ctx()
    );
    assert!(c.code != Some(0), "the client succeeded\n{}", ctx());
    assert!(
        format!("{}{}", c.stdout, c.stderr).contains(error),
        "the client did not report {error:?}\n{}",
        ctx()
    );
    assert!(took < KILLED_PEER_BOUND, "the client took {took:?}\n{}", ctx());
    took
}

/// An endless transfer (`-n` of 10^9): what each killed-peer test runs.
const ENDLESS: [&str; 2] = ["-n", "1000000000"];

/// What the survivor reports: rc_verbs sees its send completion fail once the QP's retries
/// run out (UCX's `UCX_RC_VERBS_TIMEOUT` 1 s, `UCX_RC_VERBS_RETRY_COUNT` 7: about 8 s);
/// ud_verbs, which has no acknowledgements from the NIC, times its endpoint out itself
/// (`UCX_UD_VERBS_TIMEOUT`, 30 s by default, 10 s here).
const RC_DEAD: &str = "send completion with error: transport retry counter exceeded";
const UD_DEAD: &str = "unhandled timeout error";
const UD_TIMEOUT: (&str, &str) = ("UCX_UD_VERBS_TIMEOUT", "10s");

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn a_killed_peer_fails_the_survivor_in_bounded_time() {
    let _serial = one_at_a_time();
    for (args, env, error) in [
        (
            &[
                "-d", "rxe_lo:1", "-x", "rc_verbs", "-t", "put_bw", "-s", "4096", "-D", "bcopy",
            ][..],
            &[][..],
            RC_DEAD,
        ),
        (
            &[
                "-d", "rxe_lo:1", "-x", "ud_verbs", "-t", "am_bw", "-s", "1000", "-D", "bcopy",
            ],
            &[UD_TIMEOUT],
            UD_DEAD,
        ),
    ] {
        let args = [args, &ENDLESS[..]].concat();
        let took = killed_server(
            wait_listening,
            &mut |p| {
                let mut a = vec!["ucx_perftest", "-p", p];
                a.extend_from_slice(&args);
                run_cmd(&a, env)
            },
            &mut |p| {
                let mut a = vec!["ucx_perftest", "127.0.0.1", "-p", p];
                a.extend_from_slice(&args);
                run_cmd(&a, env)
            },
            error,
        );
        eprintln!("{args:?} {env:?}: the client failed {took:?} after the kill");
    }
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn a_killed_peer_fails_the_survivor_between_two_hosts() {
    let _serial = one_at_a_time();
    let Some(h) = Hosts::or_skip("k") else { return };
    let (cfg_a, cfg_b) = (host_config(&h.veth_a, true), host_config(&h.veth_b, true));
    let ucp = [("UCX_TLS", "rc_verbs,ud_verbs"), ("UCX_NET_DEVICES", "rxe_host:1")];
    let ucp_ud = [("UCX_TLS", "ud_verbs"), ("UCX_NET_DEVICES", "rxe_host:1"), UD_TIMEOUT];
    for (args, env, error) in [
        (
            &[
                "-d",
                "rxe_host:1",
                "-x",
                "rc_verbs",
                "-t",
                "put_bw",
                "-s",
                "4096",
                "-D",
                "bcopy",
            ][..],
            &[][..],
            RC_DEAD,
        ),
        (
            &[
                "-d",
                "rxe_host:1",
                "-x",
                "ud_verbs",
                "-t",
                "am_bw",
                "-s",
                "1000",
                "-D",
                "bcopy",
            ],
            &[UD_TIMEOUT],
            UD_DEAD,
        ),
        // UCP: tag messages over rc_verbs (wired up through ud_verbs), then over ud_verbs
        (&["-t", "tag_bw", "-s", "4096"], &ucp[..], RC_DEAD),
        (&["-t", "tag_bw", "-s", "4096"], &ucp_ud[..], UD_DEAD),
    ] {
        let args = [args, &ENDLESS[..]].concat();
        let took = killed_server(
            wait_listening_in_ns,
            &mut |p| {
                let mut a = vec!["ucx_perftest", "-p", p];
                a.extend_from_slice(&args);
                in_host(&h, &h.a, &cfg_a, &a, env)
            },
            &mut |p| {
                let mut a = vec!["ucx_perftest", &h.addr_a, "-p", p];
                a.extend_from_slice(&args);
                in_host(&h, &h.b, &cfg_b, &a, env)
            },
            error,
        );
        eprintln!("{args:?} {env:?}: the client failed {took:?} after the kill");
    }
}

/// The UCX log time (`[1796447617.517742] ...`, seconds since the epoch) of the first line
/// of `out` containing `what`.
fn log_time(out: &str, what: &str) -> Option<std::time::SystemTime> {
    let line = out.lines().find(|l| l.contains(what))?;
    let stamp = line.strip_prefix('[')?.split(']').next()?;
    let secs: f64 = stamp.trim().parse().ok()?;
    Some(std::time::UNIX_EPOCH + Duration::from_secs_f64(secs))
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn a_killed_peer_of_an_idle_ucp_endpoint_is_reported() {
    // UCP tag_lat: the survivor usually waits for a pong with nothing in flight, so no send
    // of its own can fail. Without error handling it waits for ever (by hand: still waiting
    // 70 s after the kill; UCX logged the QP's IBV_EVENT_QP_FATAL and nothing more). With it
    // (`-e`), UCP's keepalive (UCX_KEEPALIVE_INTERVAL, 20 s by default, 5 s here) checks the
    // endpoint, the check's send runs out of retries and UCP calls the error handler,
    // "Endpoint timeout": about 8.6 s after the kill here, 48 s in a run with the default
    // interval. ucx_perftest's handler only logs it and keeps waiting, so the client runs
    // under `timeout` (65 s, 60 after the kill) and the log line's time is checked. One run
    // of five with 30 s after the kill saw no error in that time (not understood yet).
    let _serial = one_at_a_time();
    let env = [
        ("UCX_TLS", "rc_verbs,ud_verbs"),
        ("UCX_NET_DEVICES", "rxe_lo:1"),
        ("UCX_KEEPALIVE_INTERVAL", "5s"),
    ];
    let args = ["-t", "tag_lat", "-s", "8", "-e", "-n", "1000000000"];
    let port = free_port();
    let p = port.to_string();
    let mut sargs = vec!["ucx_perftest", "-p", &p];
    sargs.extend_from_slice(&args);
    let mut srv = Proc::start(&mut run_cmd(&sargs, &env));
    wait_listening(&mut srv, port);
    let mut cargs = vec!["timeout", "-s", "KILL", "65", "ucx_perftest", "127.0.0.1", "-p", &p];
    cargs.extend_from_slice(&args);
    let mut cli = Proc::start(&mut run_cmd(&cargs, &env));
    std::thread::sleep(Duration::from_secs(5));
    assert!(!cli.exited(), "the client ended before the kill");
    let killed_at = std::time::SystemTime::now();
    let s = srv.kill();
    let c = cli.wait_or(
        Duration::from_secs(70),
        &format!("\n--- the killed server\n{}", s.describe()),
    );
    let ctx = || format!("--- client\n{}\n--- the killed server\n{}", c.describe(), s.describe());
    assert!(
        c.stdout.contains("[thread 0]") && !c.stdout.contains("Final:"),
        "the client was not mid-run at the kill\n{}",
        ctx()
    );
    assert_ne!(c.code, Some(0), "the client succeeded\n{}", ctx());
    let all = format!("{}{}", c.stdout, c.stderr);
    let at = log_time(&all, "error handler called with status")
        .unwrap_or_else(|| panic!("the client reported no error\n{}", ctx()));
    let took = at.duration_since(killed_at).unwrap_or_default();
    let fatal = log_time(&all, "local work queue catastrophic error").and_then(|t| t.duration_since(killed_at).ok());
    eprintln!("tag_lat -e: the error handler ran {took:?} after the kill (QP_FATAL after {fatal:?})");
    assert!(
        took < KILLED_PEER_BOUND,
        "the error came {took:?} after the kill\n{}",
        ctx()
    );
}
