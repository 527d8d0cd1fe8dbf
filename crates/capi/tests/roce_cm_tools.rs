//! Debian's rdma_cm tools over the drop-in library on the soft-RoCE device `rxe_lo`: ucmatose,
//! rping (also `-q`, a QP the tool moves itself with `rdma_init_qp_attr` and completes with
//! `rdma_establish`), udaddy (RDMA_PS_UDP over SIDR), mckey (multicast over `lo`) and perftest
//! with `-R` (rdma_cm connections). Every pair runs on 127.0.0.1 with `SOFTRDMA_TRANSPORTS=roce`
//! set on the child processes only, so the CM picks `rxe_lo` and connects with IB CM MADs.
//!
//! An rdma_cm listener on a RoCE device holds no TCP socket, so `wait_listening` cannot see
//! it: the tests wait for the listener's service claim instead, the abstract Unix socket the
//! soft-RoCE driver binds for each listened-on service ID (`/proc/net/unix`), and for mckey's
//! receiver for its IGMP membership on `lo` (`/proc/net/igmp`). Every wait is bounded.

mod common;

use common::{binary, free_port, Proc, Run, TIMEOUT};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// RDMA_PS_TCP and RDMA_PS_UDP: the upper half of an rdma_cm service ID.
const PS_TCP: u16 = 0x0106;
const PS_UDP: u16 = 0x0111;
/// Bound on a server's start-up (until it listens or joins).
const READY_LIMIT: Duration = Duration::from_secs(10);

fn cmd(name: &str, args: &[&str]) -> Command {
    let mut c = Command::new(binary(name));
    c.args(args)
        .env("SOFTRDMA_TRANSPORTS", "roce")
        .env("SOFTRDMA_DEBUG", "1")
        .env_remove("SOFTRDMA_CONFIG");
    c
}

/// True once some process listens on RoCE service `(ps, port)` (in this namespace).
fn rxe_listening(ps: u16, port: u16) -> bool {
    common::rxe_listening(None, ps, port)
}

/// True once `lo` is a member of IPv4 multicast `group` (a receiver's QP joined it).
fn lo_joined(group: [u8; 4]) -> bool {
    // The kernel prints each group as the hex of its network-order bytes read natively.
    let hex = format!("{:08X}", u32::from_ne_bytes(group));
    let igmp = std::fs::read_to_string("/proc/net/igmp").unwrap_or_default();
    let mut on_lo = false;
    for line in igmp.lines().skip(1) {
        if !line.starts_with(char::is_whitespace) {
            on_lo = line.split_whitespace().nth(1) == Some("lo");
        } else if on_lo && line.split_whitespace().next() == Some(hex.as_str()) {
            return true;
        }
    }
    false
}

/// Waits until `ready()` (bounded); kills the server and fails with its output otherwise.
fn wait_ready(server: Proc, what: &str, ready: impl Fn() -> bool) -> Proc {
    let deadline = Instant::now() + READY_LIMIT;
    while !ready() {
        if Instant::now() > deadline {
            let r = server.kill();
            panic!("the server did not {what} within {READY_LIMIT:?}\n{}", r.describe());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    server
}

/// Starts `server`, waits until `ready()`, runs `client` to completion, then waits for the
/// server. Returns (server, client).
fn pair(mut server: Command, mut client: Command, what: &str, ready: impl Fn() -> bool) -> (Run, Run) {
    let srv = wait_ready(Proc::start(&mut server), what, ready);
    let cli = Proc::start(&mut client).wait(TIMEOUT);
    let srv = srv.wait_or(TIMEOUT, &format!("\n=== the client:\n{}", cli.describe()));
    (srv, cli)
}

fn assert_ok(what: &str, r: &Run, peer: &Run) {
    assert_eq!(
        r.code,
        Some(0),
        "{what}: {}\n=== the peer:\n{}",
        r.describe(),
        peer.describe()
    );
}

/// No failing library call was printed (`SOFTRDMA_DEBUG=1`).
fn assert_quiet(what: &str, r: &Run) {
    assert!(
        !r.stderr.contains("softrdma:"),
        "{what}: no library diagnostics expected:\n{}",
        r.describe()
    );
}

fn ucmatose(extra: &[&str]) {
    ucmatose_on("127.0.0.1", extra)
}

fn ucmatose_on(addr: &str, extra: &[&str]) {
    let port = free_port();
    let p = port.to_string();
    let mut s = vec!["-b", addr, "-p", &p];
    let mut c = vec!["-s", addr, "-p", &p];
    s.extend_from_slice(extra);
    c.extend_from_slice(extra);
    let (srv, cli) = pair(cmd("ucmatose", &s), cmd("ucmatose", &c), "listen", || {
        rxe_listening(PS_TCP, port)
    });
    assert_ok("ucmatose server", &srv, &cli);
    assert_ok("ucmatose client", &cli, &srv);
    assert!(
        srv.stdout.contains("data transfers complete") && srv.stdout.contains("return status 0"),
        "{}",
        srv.describe()
    );
    assert!(cli.stdout.contains("return status 0"), "{}", cli.describe());
    assert_quiet("ucmatose server", &srv);
    assert_quiet("ucmatose client", &cli);
}

#[test]
fn ucmatose_one_connection() {
    ucmatose(&[]);
}

#[test]
fn ucmatose_four_connections_of_ten_messages() {
    ucmatose(&["-c", "4", "-C", "10"]);
}

/// IB CM MADs and the connections over IPv6 (`::1`, rxe_lo's GID 1).
#[test]
fn ucmatose_over_ipv6_loopback() {
    ucmatose_on("::1", &["-c", "2", "-C", "10"]);
}

fn rping(extra: &[&str]) {
    rping_on("127.0.0.1", extra)
}

fn rping_on(addr: &str, extra: &[&str]) {
    let port = free_port();
    let p = port.to_string();
    let mut s = vec!["-s", "-a", addr, "-p", &p, "-v", "-V", "-C", "5"];
    let mut c = vec!["-c", "-a", addr, "-p", &p, "-v", "-V", "-C", "5"];
    s.extend_from_slice(extra);
    c.extend_from_slice(extra);
    let (srv, cli) = pair(cmd("rping", &s), cmd("rping", &c), "listen", || {
        rxe_listening(PS_TCP, port)
    });
    assert_ok("rping server", &srv, &cli);
    assert_ok("rping client", &cli, &srv);
    let pings: Vec<&str> = cli.stdout.lines().filter(|l| l.starts_with("ping data: ")).collect();
    assert_eq!(pings.len(), 5, "{}", cli.describe());
    for (i, line) in pings.iter().enumerate() {
        assert!(line.starts_with(&format!("ping data: rdma-ping-{i}: ")), "{line}");
    }
    assert!(
        srv.stdout.contains("server ping data: rdma-ping-4: "),
        "{}",
        srv.describe()
    );
    assert_quiet("rping server", &srv);
    assert_quiet("rping client", &cli);
}

#[test]
fn rping_five_verified_pings() {
    rping(&[]);
}

#[test]
fn rping_over_ipv6_loopback() {
    rping_on("::1", &[]);
}

/// `-q`: the tools create their QPs with `ibv_create_qp`, name them in `conn_param.qp_num`,
/// move them with `rdma_init_qp_attr` (server before `rdma_accept`, client after
/// CONNECT_RESPONSE) and finish with `rdma_establish`.
#[test]
fn rping_with_self_created_qps() {
    rping(&["-q"]);
}

/// udaddy's server listens on the fixed port 7174 (its `-p` is the port space): one run at a
/// time in this binary.
static UDADDY: Mutex<()> = Mutex::new(());

#[test]
fn udaddy_over_sidr() {
    udaddy_on("127.0.0.1");
}

/// SIDR and the UD datagrams over IPv6.
#[test]
fn udaddy_over_sidr_over_ipv6_loopback() {
    udaddy_on("::1");
}

fn udaddy_on(addr: &str) {
    let _one = UDADDY.lock().unwrap_or_else(|p| p.into_inner());
    let (srv, cli) = pair(
        cmd("udaddy", &["-b", addr]),
        cmd("udaddy", &["-s", addr]),
        "listen",
        || rxe_listening(PS_UDP, 7174),
    );
    assert_ok("udaddy server", &srv, &cli);
    assert_ok("udaddy client", &cli, &srv);
    for r in [&srv, &cli] {
        assert!(
            r.stdout.contains("data transfers complete") && r.stdout.contains("return status 0"),
            "{}",
            r.describe()
        );
        assert_quiet("udaddy", r);
    }
}

/// A multicast group of its own for each run (239.0.0.0/8, organisation-local): from the
/// process id, the clock and a counter, so parallel tests and test processes do not share one.
fn group() -> [u8; 4] {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::UNIX_EPOCH.elapsed().unwrap_or_default().subsec_micros();
    let x = std::process::id().wrapping_mul(2_654_435_761) ^ t ^ n.wrapping_mul(40_503);
    let [a, b, c, _] = x.to_le_bytes();
    [239, a, b, c.max(1)]
}

/// mckey over `lo`: the receiver joins (its UD QP attached, IGMP membership on `lo`), then the
/// sender joins, waits its 3 s and sends 10 datagrams to the group's address vector from the
/// MULTICAST_JOIN event (QPN 0xFFFFFF, Q_Key 0x01234567); the receiver gets all 10.
fn mckey(sender_extra: &[&str]) {
    let g = group();
    let addr = format!("{}.{}.{}.{}", g[0], g[1], g[2], g[3]);
    let mut s = vec!["-m", &addr, "-b", "127.0.0.1", "-s"];
    s.extend_from_slice(sender_extra);
    let (srv, cli) = pair(
        cmd("mckey", &["-m", &addr, "-b", "127.0.0.1"]),
        cmd("mckey", &s),
        "join the group",
        || lo_joined(g),
    );
    assert_ok("mckey receiver", &srv, &cli);
    assert_ok("mckey sender", &cli, &srv);
    let joined = format!("mckey: joined dgid: ::ffff:{addr} mlid 0x0 sl 0");
    for r in [&srv, &cli] {
        assert!(
            r.stdout.contains(&joined) && r.stdout.contains("data transfers complete"),
            "{}",
            r.describe()
        );
        assert_quiet("mckey", r);
    }
    assert!(srv.stdout.contains("receiving data transfers"), "{}", srv.describe());
    assert!(!lo_joined(g), "the group is left when the receiver is done");
}

#[test]
fn mckey_receiver_and_sender() {
    mckey(&[]);
}

/// `-o`: the sender joins as a send-only full member, its QP not attached to the group.
#[test]
fn mckey_send_only_sender() {
    mckey(&["-o"]);
}

/// `-l` asks for a QP that does not receive its own multicast (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB):
/// refused with EOPNOTSUPP and a reason, not ignored.
#[test]
fn mckey_without_loopback_is_refused() {
    let g = group();
    let addr = format!("{}.{}.{}.{}", g[0], g[1], g[2], g[3]);
    let r = Proc::start(&mut cmd("mckey", &["-m", &addr, "-b", "127.0.0.1", "-s", "-l"])).wait(TIMEOUT);
    assert_ne!(r.code, Some(0), "{}", r.describe());
    assert!(
        r.stderr.contains("IBV_QP_CREATE_BLOCK_SELF_MCAST_LB")
            && r.stderr.contains("mckey: unable to create QP: Operation not supported"),
        "{}",
        r.describe()
    );
}

/// perftest with `-R`: a first rdma_cm connection exchanges the parameters, then the test's
/// own connection; the server listens twice on the same port.
fn perftest(tool: &str, extra: &[&str]) {
    let port = free_port();
    let p = port.to_string();
    let mut args = vec!["-R", "-d", "rxe_lo", "-p", &p, "-n", "200"];
    args.extend_from_slice(extra);
    let mut client_args = args.clone();
    client_args.push("127.0.0.1");
    let (srv, cli) = pair(cmd(tool, &args), cmd(tool, &client_args), "listen", || {
        rxe_listening(PS_TCP, port)
    });
    assert_ok(&format!("{tool} server"), &srv, &cli);
    assert_ok(&format!("{tool} client"), &cli, &srv);
    for r in [&srv, &cli] {
        assert!(
            r.stdout.contains("Data ex. method : rdma_cm") && r.stdout.contains("rdma_cm QPs\t : ON"),
            "{}",
            r.describe()
        );
    }
    // The result line (`#bytes #iterations ...` then the numbers): both sides of a bandwidth
    // test print it, only the client of a latency test.
    let reporters = if tool.ends_with("_bw") {
        vec![&srv, &cli]
    } else {
        vec![&cli]
    };
    for r in reporters {
        assert!(
            r.stdout.lines().any(|l| l.split_whitespace().nth(1) == Some("200")),
            "{tool}: no result line:\n{}",
            r.describe()
        );
    }
}

#[test]
fn ib_send_bw_with_rdma_cm() {
    perftest("ib_send_bw", &["-s", "65536"]);
}

#[test]
fn ib_write_bw_with_rdma_cm() {
    perftest("ib_write_bw", &["-s", "65536"]);
}

#[test]
fn ib_read_bw_with_rdma_cm() {
    perftest("ib_read_bw", &["-s", "65536"]);
}

#[test]
fn ib_send_lat_with_rdma_cm() {
    perftest("ib_send_lat", &[]);
}

#[test]
fn ib_write_lat_with_rdma_cm() {
    perftest("ib_write_lat", &[]);
}

#[test]
fn ib_read_lat_with_rdma_cm() {
    perftest("ib_read_lat", &[]);
}

// ---- A client killed mid-transfer (issue #6): no DREQ can leave a SIGKILLed process.

/// Bound within which the server learns that its killed client is gone and exits: keepalive
/// (2 s) + timer grid (0.25 s) + (retry_count 7 + 1) × the rdma_cm ACK timeout (18: 1.07 s),
/// plus slack for a loaded machine.
const KILLED_PEER_BOUND: Duration = Duration::from_secs(16);

/// Starts `tool`'s server and client (`server`, `client` arguments), lets them move data for
/// 1.5 s, SIGKILLs the client and waits (bounded) for the server. Returns the server's run and
/// how long after the kill it ended.
fn kill_client_mid_transfer(tool: &str, port: u16, server: &[&str], client: &[&str]) -> (Run, Duration) {
    let srv = wait_ready(Proc::start(&mut cmd(tool, server)), "listen", || {
        rxe_listening(PS_TCP, port)
    });
    let mut cli = Proc::start(&mut cmd(tool, client));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!cli.exited(), "{tool}: the client ended before the kill");
    let killed = Instant::now();
    let cli = cli.kill();
    let srv = srv.wait_or(
        KILLED_PEER_BOUND,
        &format!("\n=== the killed client:\n{}", cli.describe()),
    );
    let took = killed.elapsed();
    eprintln!("{tool}: client killed, server exited {:?} after {took:?}", srv.code);
    (srv, took)
}

#[test]
fn rping_server_ends_when_its_client_is_killed() {
    let port = free_port();
    let p = port.to_string();
    let (srv, _) = kill_client_mid_transfer(
        "rping",
        port,
        &["-s", "-a", "127.0.0.1", "-p", &p, "-v"],
        &["-c", "-a", "127.0.0.1", "-p", &p, "-v", "-C", "100000000"],
    );
    // rping's server ends either way: status 0 when DISCONNECTED comes while it waits for the
    // next ping, "rping server failed" when a ping's RDMA READ or WRITE fails first.
    let all = format!("{}{}", srv.stdout, srv.stderr);
    assert!(
        srv.code == Some(0) || all.contains("rping server failed"),
        "{}",
        srv.describe()
    );
    assert!(
        srv.stdout.contains("server ping data: rdma-ping-"),
        "{}",
        srv.describe()
    );
}

#[test]
fn ib_send_bw_server_ends_when_its_client_is_killed() {
    let port = free_port();
    let p = port.to_string();
    let args = ["-R", "-d", "rxe_lo", "-p", &p, "-s", "65536", "-n", "100000000"];
    let mut client = args.to_vec();
    client.push("127.0.0.1");
    let (srv, _) = kill_client_mid_transfer("ib_send_bw", port, &args, &client);
    // Only receives were posted: they flush (status 5, IBV_WC_WR_FLUSH_ERR).
    let all = format!("{}{}", srv.stdout, srv.stderr);
    assert!(
        srv.code.is_some_and(|c| c != 0) && all.contains("Failed status 5"),
        "{}",
        srv.describe()
    );
}
