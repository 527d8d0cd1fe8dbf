//! Faults (issue #6, part 3), on the iWARP transport unless named (the RoCE kill -9 and
//! peer-loss tests are in `crates/capi/tests/roce_*.rs` and `crates/cm/tests/roce_cm.rs`).
//!
//! - kill -9 of either side mid-transfer (`softrdma perf` WRITE, READ and SEND, bandwidth and
//!   the WRITE/SEND latency tests): the survivor's outstanding work requests complete with an
//!   error status within [`BOUND`], and it exits non-zero naming the failed WR. Exception, by
//!   design of the perf protocol: in write-bw / read-bw the server has no WR outstanding (the
//!   client drives every one) and cannot tell a killed client from one that finished, so it
//!   ends within the bound with status 0, as after a finished run.
//! - kill -9 of a `softrdma soak` client with mixed traffic in flight: the soak server keeps
//!   serving (the next client verifies every byte, the server counts zero mismatches).
//! - A network-namespace link taken down for 2 s during a soak, then brought back: TCP rides
//!   through; the run completes with every byte verified and no WR failed.
//! - 2 % random loss (nftables inside one namespace, both directions, per segment) during a
//!   1 GiB transfer of mixed SEND/WRITE/READ (`SOFTRDMA_LOSS_TEST_MIB` shortens it): completes,
//!   every byte verified on the receiving side (server: SEND and WRITE data; client: READ data).
//!   The same over soft-RoCE.
//! - Over soft-RoCE, 30 % of the connection manager's datagrams (UDP to QP 1) dropped both ways:
//!   connections and the final DONE exchange still complete (the IB CM sends a lost message
//!   again), and the client gets the server's counters.

mod common;

use common::netns::{pair_or_skip, NsPair};
use common::{bin, Logged};
use std::time::{Duration, Instant};

/// Bound within which a survivor's outstanding work completes and its process exits.
const BOUND: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Server,
    Client,
}

/// What the survivor did after its peer was killed.
struct Survivor {
    success: bool,
    output: String,
    after: Duration,
}

/// Runs `softrdma perf TEST` between two processes on 127.0.0.1, SIGKILLs `victim` mid-transfer
/// and waits (bounded) for the survivor.
fn kill_mid_transfer(test: &str, victim: Side) -> Survivor {
    let mut server = Logged::spawn(&[bin(), "perf", test, "-b", "127.0.0.1", "-p", "0"]);
    let port = server.port(Duration::from_secs(10)).to_string();
    let size = if test.ends_with("-lat") { "4096" } else { "1048576" };
    let mut client = Logged::spawn(&[
        bin(),
        "perf",
        test,
        "127.0.0.1",
        "-p",
        &port,
        "-s",
        size,
        "-n",
        "1000000000",
        "--no-verify",
    ]);
    // Mid-transfer: connected and moving data (the run would take hours).
    std::thread::sleep(Duration::from_millis(800));
    assert!(client.running(), "{test}: the client ended early: {}", client.output());
    assert!(server.running(), "{test}: the server ended early: {}", server.output());
    let (dead, alive) = match victim {
        Side::Server => (&mut server, &mut client),
        Side::Client => (&mut client, &mut server),
    };
    dead.child.0.kill().expect("kill -9");
    let killed = Instant::now();
    let _ = dead.child.0.wait();
    let status = alive.wait_exit(BOUND).unwrap_or_else(|| {
        panic!(
            "{test}: the surviving {:?} still runs {BOUND:?} after its peer was killed: {}",
            if victim == Side::Server {
                Side::Client
            } else {
                Side::Server
            },
            alive.output()
        )
    });
    Survivor {
        success: status.success(),
        after: killed.elapsed(),
        output: alive.output(),
    }
}

/// The survivor failed, within the bound, naming a WR that completed with an error (or the
/// connection that went down under a WRITE it waited for).
fn assert_failed_cleanly(test: &str, who: &str, s: &Survivor) {
    assert!(
        !s.success,
        "{test}: the {who} succeeded after its peer was killed: {}",
        s.output
    );
    let flushed = s.output.contains("failed: Work Request Flushed Error")
        || s.output.contains("the connection went down while waiting");
    assert!(flushed, "{test}: the {who}'s message names no failed WR: {}", s.output);
    eprintln!(
        "{test}: {who} exited {:?} after the kill: {}",
        s.after,
        s.output.lines().last().unwrap_or("")
    );
}

#[test]
fn server_killed_mid_transfer() {
    for test in ["write-bw", "read-bw", "send-bw", "write-lat", "send-lat"] {
        let s = kill_mid_transfer(test, Side::Server);
        assert_failed_cleanly(test, "client", &s);
        assert!(
            s.output.contains(&format!("perf {test} size")) && s.output.contains("against 127.0.0.1:"),
            "{test}: the client's message names neither the test nor the server: {}",
            s.output
        );
    }
}

#[test]
fn client_killed_mid_transfer() {
    // The server has WRs outstanding: receives (send-bw, send-lat), WRITEs (write-lat).
    for test in ["send-bw", "send-lat", "write-lat"] {
        let s = kill_mid_transfer(test, Side::Client);
        assert_failed_cleanly(test, "server", &s);
    }
    // One-sided: nothing outstanding on the server; it sees DISCONNECTED and ends in time.
    for test in ["write-bw", "read-bw"] {
        let s = kill_mid_transfer(test, Side::Client);
        eprintln!(
            "{test}: server (no WR outstanding) ended {:?} after the kill, success={}",
            s.after, s.success
        );
    }
}

/// The summary object a `softrdma soak --json` client printed.
fn soak_summary(out: &str) -> serde_json::Value {
    out.lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v.get("ok").is_some())
        })
        .unwrap_or_else(|| panic!("no soak summary in: {out}"))
}

fn assert_soak_clean(what: &str, v: &serde_json::Value, out: &str, server: &mut Logged) {
    let clean = v["ok"] == true
        && v["mismatches"] == 0
        && v["errors"] == 0
        && v["server"]["mismatches"] == 0
        && v["server"]["errors"] == 0
        && v["server"]["verified_bytes"].as_u64().unwrap_or(0) > 0;
    if !clean {
        panic!("{what}: {v}\n--- client:\n{out}\n--- server:\n{}", server.output());
    }
}

#[test]
fn soak_client_killed_server_keeps_serving() {
    let mut server = Logged::spawn(&[bin(), "soak", "--server", "-b", "127.0.0.1", "-p", "0"]);
    let port = server.port(Duration::from_secs(10)).to_string();
    let mut victim = Logged::spawn(&[
        bin(),
        "soak",
        "127.0.0.1",
        "-p",
        &port,
        "--seconds",
        "600",
        "--qps",
        "3",
        "--progress",
        "1",
    ]);
    // Traffic in flight on every QP slot, then SIGKILL.
    assert!(
        victim.wait_line("batches", Duration::from_secs(15)).is_some(),
        "{}",
        victim.output()
    );
    victim.child.0.kill().expect("kill -9");
    let _ = victim.child.0.wait();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        server.running(),
        "the soak server died with its client: {}",
        server.output()
    );
    let mut next = Logged::spawn(&[
        bin(),
        "soak",
        "127.0.0.1",
        "-p",
        &port,
        "--seconds",
        "3",
        "--qps",
        "2",
        "--json",
        "--progress",
        "0",
    ]);
    let status = next
        .wait_exit(Duration::from_secs(60))
        .expect("the second client hangs");
    let out = next.output();
    assert!(status.success(), "{out}\n--- server:\n{}", server.output());
    assert_soak_clean("after a killed client", &soak_summary(&out), &out, &mut server);
    // The DONE request ends the server; no mismatch and no error, the killed client's included.
    let s = server.wait_exit(BOUND).expect("the soak server did not end after DONE");
    assert!(s.success(), "{}", server.output());
}

/// `ip netns exec NS softrdma soak --server -b ADDR -p 0`, and its port.
fn soak_server_in(ns: &str, addr: &str) -> (Logged, String) {
    soak_server_with(ns, addr, &[], &[])
}

/// The same with an `env` prefix (e.g. `SOFTRDMA_TRANSPORTS=roce`) and more server arguments.
fn soak_server_with(ns: &str, addr: &str, env: &[&str], extra: &[&str]) -> (Logged, String) {
    let mut argv = vec!["ip", "netns", "exec", ns, "env"];
    argv.extend_from_slice(env);
    argv.extend_from_slice(&[bin(), "soak", "--server", "-b", addr, "-p", "0"]);
    argv.extend_from_slice(extra);
    let mut s = Logged::spawn(&argv);
    let port = s.port(Duration::from_secs(10)).to_string();
    (s, port)
}

fn sh(args: &[&str]) {
    common::lan::sh(args).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn link_down_for_two_seconds_and_back() {
    let Some(hosts) = pair_or_skip("ld") else { return };
    let (mut server, port) = soak_server_in(&hosts.a, &hosts.addr_a);
    // Connections live for the whole run (no reconnects while the link is down: a resolve
    // without a route is an immediate, correct error, not what this test is about).
    let mut client = Logged::spawn(&[
        "ip",
        "netns",
        "exec",
        &hosts.b,
        bin(),
        "soak",
        &hosts.addr_a,
        "-p",
        &port,
        "--seconds",
        "12",
        "--qps",
        "2",
        "--max-batches",
        "0",
        // No deliberate abort at the end: its flushed WRs would hide one the outage caused.
        "--abort-pct",
        "0",
        "--max-size",
        "65536",
        "--progress",
        "1",
        "--json",
    ]);
    assert!(
        client.wait_line("batches", Duration::from_secs(15)).is_some(),
        "{}",
        client.output()
    );
    std::thread::sleep(Duration::from_secs(2));
    sh(&["ip", "-n", &hosts.a, "link", "set", &hosts.veth_a, "down"]);
    let down_at = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    sh(&["ip", "-n", &hosts.a, "link", "set", &hosts.veth_a, "up"]);
    let up_after = down_at.elapsed();
    let before = progress_batches(client.poll_lines());
    // 12 s run + the batch in flight when it ends + DONE.
    let status = client
        .wait_exit(Duration::from_secs(12 + 30 + 10))
        .expect("the soak client hangs after the link came back");
    let out = client.output();
    assert!(status.success(), "{out}\n--- server:\n{}", server.output());
    let v = soak_summary(&out);
    assert_soak_clean("link down and up", &v, &out, &mut server);
    assert_eq!(v["flushed"], 0, "a WR failed although TCP should ride through: {v}");
    // The outage was real: some 1-s progress interval moved no batch at all.
    let counts = progress_counts(&client.lines);
    assert!(
        counts.windows(2).any(|w| w[0] == w[1]),
        "traffic never stalled; was the link down? progress: {counts:?}"
    );
    let total = v["batches"].as_u64().unwrap_or(0);
    assert!(
        total > before + 10,
        "no traffic after the link came back ({before} batches when it came up, {total} at the end)"
    );
    eprintln!(
        "link down {up_after:?}: {before} batches before it came back, {total} at the end, {} bytes, 0 mismatches",
        v["bytes"]
    );
    let s = server.wait_exit(BOUND).expect("the soak server did not end after DONE");
    assert!(s.success(), "{}", server.output());
}

/// The batch counts of the soak client's progress lines, in order.
fn progress_counts(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter(|l| l.starts_with("soak: "))
        .filter_map(|l| l.split("batches ").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect()
}

/// The batch count of the last progress line.
fn progress_batches(lines: &[String]) -> u64 {
    progress_counts(lines).last().copied().unwrap_or(0)
}

/// Drops `percent` % of the IP packets entering and leaving namespace `b` (segment by
/// segment: with GSO off, nftables sees wire-sized packets, not 64 KiB aggregates).
fn lossy(hosts: &NsPair, percent: u32) {
    sh(&["ip", "-n", &hosts.b, "link", "set", &hosts.veth_b, "gso_max_segs", "1"]);
    sh(&["ip", "-n", &hosts.a, "link", "set", &hosts.veth_a, "gso_max_segs", "1"]);
    let rules = format!(
        "table inet srloss {{\n\
         chain in {{ type filter hook input priority 0; policy accept; numgen random mod 100 < {percent} counter drop; }}\n\
         chain out {{ type filter hook output priority 0; policy accept; numgen random mod 100 < {percent} counter drop; }}\n\
         }}\n"
    );
    load_nft(hosts, &rules);
}

/// Loads nftables `rules` into namespace `b`.
fn load_nft(hosts: &NsPair, rules: &str) {
    // One file per namespace: the loss tests run in parallel in this process.
    let file = std::env::temp_dir().join(format!("softrdma-loss-{}.nft", hosts.b));
    std::fs::write(&file, rules).expect("write the nft rules");
    let f = file.to_string_lossy().to_string();
    let r = common::lan::sh(&["ip", "netns", "exec", &hosts.b, "nft", "-f", &f]);
    let _ = std::fs::remove_file(&file);
    if let Err(e) = r {
        panic!("nftables is needed for the loss tests (apt-get install nftables): {e}");
    }
}

/// Drops `percent` % of the RoCE datagrams to QP 1 (the IB CM's MADs) leaving and entering
/// namespace `b`; the rest passes. Counted like [`lossy`]'s (table `srloss`).
fn lossy_cm(hosts: &NsPair, percent: u32) {
    // @th,104,24: the BTH's destination QP (UDP header 8 bytes + BTH byte 5, 24 bits).
    let m = format!("udp dport 4791 @th,104,24 1 numgen random mod 100 < {percent} counter drop;");
    let rules = format!(
        "table inet srloss {{\n\
         chain in {{ type filter hook input priority 0; policy accept; {m} }}\n\
         chain out {{ type filter hook output priority 0; policy accept; {m} }}\n\
         }}\n"
    );
    load_nft(hosts, &rules);
}

/// Packets the loss rules dropped so far.
fn dropped(hosts: &NsPair) -> u64 {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &hosts.b, "nft", "list", "table", "inet", "srloss"])
        .output()
        .expect("nft list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split("counter packets ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(
    softrdma_no_capture_tools,
    ignore = "needs dumpcap, tshark and nftables (apt-get install tshark nftables)"
)]
fn two_percent_loss_transfer_verified() {
    loss_transfer("ls", "siw_", &[], &[]);
}

/// The same over soft-RoCE: go-back-N retransmission (NAK on a PSN gap, the ACK timeout for a
/// lost tail or ACK) under the same loss. Both sides use ACK timeout 14 (67 ms) instead of
/// rdma_cm's default 18 (1.07 s), so a lost tail costs 67 ms, as on a tuned fabric. Likewise
/// the CM's response timeout is 1 s (`SOFTRDMA_CM_TIMEOUT_MS`) instead of rdma_cm's 4.4 s: the
/// CM's MADs (REQ, REP, DREQ, DREP) cross the same lossy link, and a lost DREQ retried after
/// 4.4 s made DISCONNECTED miss the soak's 5 s bound (seen once in session 10).
///
/// Found and fixed on the way: the soak END that asks the server to disconnect overtook the
/// batch's READs, and the server's QP in ERR never replays a lost READ response (now fenced; see
/// the soak module and the engine test `responder_in_err_never_replays_a_read...`). Seen in
/// earlier sessions and ignored for a while: WRs that ran out of transport retries under load,
/// the server process handling no packet for 0.6 s (8 ACK timeouts of 67 ms are 0.54 s). Not
/// seen since the fork-gate, idle-wakeup and caller-step changes: no RETRY_EXC_ERR in 15 runs
/// (session 10), 12 of them with 2 to 4 CPU hogs running, 9 beside the siw loss test; the one
/// failure was the DISCONNECTED overrun fixed above. If it comes back,
/// `softrdma stat --pid` on the stalled side shows which QP stopped (TIMEOUTS, RETRANS).
#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(
    softrdma_no_capture_tools,
    ignore = "needs dumpcap, tshark and nftables (apt-get install tshark nftables)"
)]
fn two_percent_loss_transfer_verified_over_roce() {
    let ack = ["--ack-timeout", "14"];
    let env = ["SOFTRDMA_TRANSPORTS=roce", "SOFTRDMA_CM_TIMEOUT_MS=1000"];
    loss_transfer("lr", "rxe_", &env, &ack);
}

/// The soak's last exchange carries the server's counters to the client in the DONE reply.
/// It used to be a REJ sent once by a server that then exited: a lost REJ left the client's
/// retried requests unanswered (UNREACHABLE; seen once in the ASan run of the 2 % loss test).
/// Now the server accepts with the counters and stays until the client disconnects, so the CM
/// sends a lost reply again. With 30 % of CM datagrams dropped, every connect needs retries.
#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(
    softrdma_no_capture_tools,
    ignore = "needs dumpcap, tshark and nftables (apt-get install tshark nftables)"
)]
fn roce_cm_datagrams_lost_connections_and_done_still_complete() {
    let Some(hosts) = pair_or_skip("lc") else { return };
    lossy_cm(&hosts, 30);
    let env = ["SOFTRDMA_TRANSPORTS=roce", "SOFTRDMA_CM_TIMEOUT_MS=200"];
    let (mut server, port) = soak_server_with(&hosts.a, &hosts.addr_a, &env, &[]);
    let mut argv = vec!["ip", "netns", "exec", &hosts.b, "env"];
    argv.extend_from_slice(&env);
    argv.extend_from_slice(&[
        bin(),
        "soak",
        &hosts.addr_a,
        "-p",
        &port,
        "--seconds",
        "3",
        "--qps",
        "2",
        "--max-size",
        "65536",
        "--json",
    ]);
    let mut client = Logged::spawn(&argv);
    let status = client
        .wait_exit(Duration::from_secs(120))
        .expect("the soak client hangs with CM datagrams lost");
    let out = client.output();
    assert!(status.success(), "{out}\n--- server:\n{}", server.output());
    let v = soak_summary(&out);
    assert_soak_clean("30 % CM loss", &v, &out, &mut server);
    assert!(
        v["device"].as_str().unwrap_or_default().starts_with("rxe_"),
        "the soak did not run over soft-RoCE: {v}"
    );
    let drops = dropped(&hosts);
    assert!(drops > 0, "the rules dropped no CM datagram");
    eprintln!("30 % CM loss: {drops} CM datagrams dropped, the client has the server's counters");
    let s = server.wait_exit(BOUND).expect("the soak server did not end after DONE");
    assert!(s.success(), "{}", server.output());
}

/// A 1 GiB soak (`SOFTRDMA_LOSS_TEST_MIB` MiB) between two namespaces, 2 % of packets dropped
/// in each direction, on a device whose name starts with `device` (`siw_`, `rxe_`); `env` and
/// `extra` (soak arguments) go to both processes.
fn loss_transfer(tag: &str, device: &str, env: &[&str], extra: &[&str]) {
    let Some(hosts) = pair_or_skip(tag) else { return };
    // 1 GiB; `SOFTRDMA_LOSS_TEST_MIB` shortens it where only memory safety is checked
    // (scripts/asan.sh).
    let mib: u64 = std::env::var("SOFTRDMA_LOSS_TEST_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let bytes: u64 = mib << 20;
    lossy(&hosts, 2);
    let (mut server, port) = soak_server_with(&hosts.a, &hosts.addr_a, env, extra);
    let bytes_s = bytes.to_string();
    let started = Instant::now();
    let mut argv = vec!["ip", "netns", "exec", &hosts.b, "env"];
    argv.extend_from_slice(env);
    argv.extend_from_slice(&[
        bin(),
        "soak",
        &hosts.addr_a,
        "-p",
        &port,
        "--bytes",
        &bytes_s,
        "--seconds",
        "600",
        "--min-size",
        "65536",
        "--max-size",
        "1048576",
        "--qps",
        "2",
        "--progress",
        "5",
        "--json",
    ]);
    argv.extend_from_slice(extra);
    let mut client = Logged::spawn(&argv);
    let status = client
        .wait_exit(Duration::from_secs(600))
        .expect("the transfer did not finish in time");
    let out = client.output();
    assert!(status.success(), "{out}\n--- server:\n{}", server.output());
    let v = soak_summary(&out);
    assert_soak_clean("2 % loss", &v, &out, &mut server);
    let used = v["device"].as_str().unwrap_or_default();
    assert!(
        used.starts_with(device),
        "the transfer ran on {used:?}, not a {device}* device: {v}"
    );
    let moved = v["bytes"].as_u64().unwrap_or(0);
    assert!(moved >= bytes, "only {moved} of {bytes} bytes moved: {v}");
    let drops = dropped(&hosts);
    assert!(drops > 100, "the loss rules dropped only {drops} packets");
    eprintln!(
        "2 % loss over {used}: {moved} bytes (SEND/WRITE/READ) in {:?}, {drops} packets dropped, server verified {} bytes, 0 mismatches",
        started.elapsed(),
        v["server"]["verified_bytes"]
    );
    let s = server.wait_exit(BOUND).expect("the soak server did not end after DONE");
    assert!(s.success(), "{}", server.output());
}
