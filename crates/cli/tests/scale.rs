//! Scale (issue #6, part 4), iWARP over 127.0.0.1, through softrdma-cm:
//! - one process pair holds 1,000 established RC connections and moves data on every one
//!   (a 4 KiB WRITE and a SEND per connection, both checked byte for byte by the server, which
//!   ACKs each); RSS and fds per connection are printed (README: "Faults, scale and soak");
//! - 2,000 connection attempts arrive at a listener at once: each one establishes or gets a
//!   clean reject (backlog full: REJECTED -ECONNREFUSED) or timeout, nothing hangs, data moves on
//!   every established one, and the listener works afterwards (20 new connections, verified).

mod common;

use common::{bin, Logged};
use std::sync::Mutex;
use std::time::Duration;

/// The two tests are heavy on fds and CPU: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn scale_run(client_args: &[&str]) -> serde_json::Value {
    scale_run_with(&[], client_args)
}

/// `env` is a prefix like `["env", "SOFTRDMA_TRANSPORTS=roce"]` for both processes.
fn scale_run_with(env: &[&str], client_args: &[&str]) -> serde_json::Value {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut sargv = env.to_vec();
    sargv.extend_from_slice(&[bin(), "scale", "-b", "127.0.0.1", "-p", "0"]);
    let mut server = Logged::spawn(&sargv);
    let port = server.port(Duration::from_secs(10)).to_string();
    let mut argv = env.to_vec();
    argv.extend_from_slice(&[bin(), "scale", "127.0.0.1", "-p", &port, "--json", "--timeout", "60"]);
    argv.extend_from_slice(client_args);
    let mut client = Logged::spawn(&argv);
    let status = client
        .wait_exit(Duration::from_secs(200))
        .unwrap_or_else(|| panic!("scale client {client_args:?} hangs: {}", client.output()));
    let out = client.output();
    assert!(status.success(), "scale client {client_args:?} failed: {out}");
    assert!(server.running(), "the scale server died: {}", server.output());
    out.lines()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .unwrap_or_else(|| panic!("no JSON summary: {out}"))
}

fn num(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {v}"))
}

#[test]
fn thousand_connections_between_two_processes() {
    let v = scale_run(&["-c", "1000"]);
    for k in [
        "established",
        "verified",
        "disconnected",
        "server_live",
        "server_verified",
    ] {
        assert!(num(&v, k) >= 1000.0, "{k}: {v}");
    }
    assert_eq!(num(&v, "server_errors"), 0.0, "{v}");
    // One TCP socket per connection on each side, nothing else.
    assert!(num(&v, "client_fds_per_conn") <= 1.01, "{v}");
    assert!(num(&v, "server_fds_per_conn") <= 1.01, "{v}");
    // Generous bounds (the engine reserves 256 KiB RX + 640 KiB TX per connection, touched on use).
    assert!(num(&v, "client_rss_per_conn_kib") < 512.0, "{v}");
    assert!(num(&v, "server_rss_per_conn_kib") < 512.0, "{v}");
    assert_eq!(v["client_fds_end"], v["client_fds_base"], "fds leaked: {v}");
    eprintln!(
        "1000 RC connections: setup {:.2} s, data {:.2} s; client {:.1} KiB and {:.2} fds per connection, server {:.1} KiB and {:.2} fds",
        num(&v, "setup_s"),
        num(&v, "data_s"),
        num(&v, "client_rss_per_conn_kib"),
        num(&v, "client_fds_per_conn"),
        num(&v, "server_rss_per_conn_kib"),
        num(&v, "server_fds_per_conn")
    );
}

/// The same over soft-RoCE: RC QPs on UDP, connected by the IB CM. No fd per connection: the
/// process's UDP endpoint carries every QP (and closes the extra home ports it opened).
#[test]
fn thousand_roce_connections_between_two_processes() {
    let v = scale_run_with(&["env", "SOFTRDMA_TRANSPORTS=roce"], &["-c", "1000"]);
    for k in [
        "established",
        "verified",
        "disconnected",
        "server_live",
        "server_verified",
    ] {
        assert!(num(&v, k) >= 1000.0, "{k}: {v}");
    }
    assert_eq!(num(&v, "server_errors"), 0.0, "{v}");
    assert!(num(&v, "client_rss_per_conn_kib") < 512.0, "{v}");
    assert!(num(&v, "server_rss_per_conn_kib") < 512.0, "{v}");
    assert_eq!(v["client_fds_end"], v["client_fds_base"], "fds leaked: {v}");
    eprintln!(
        "1000 RoCE RC connections: setup {:.2} s; client {:.1} KiB and {:.2} fds per connection, server {:.1} KiB and {:.2} fds",
        num(&v, "setup_s"),
        num(&v, "client_rss_per_conn_kib"),
        num(&v, "client_fds_per_conn"),
        num(&v, "server_rss_per_conn_kib"),
        num(&v, "server_fds_per_conn")
    );
}

#[test]
fn listener_survives_two_thousand_attempts_at_once() {
    let v = scale_run(&["-c", "2000", "--window", "0", "--allow-rejects", "--after", "20"]);
    let (up, rej, unr) = (num(&v, "established"), num(&v, "rejected"), num(&v, "unreachable"));
    assert_eq!(up + rej + unr, 2000.0, "every attempt has an outcome: {v}");
    assert_eq!(
        num(&v, "hung") + num(&v, "connect_errors") + num(&v, "other_failures"),
        0.0,
        "{v}"
    );
    assert!(up >= 1000.0, "fewer than the backlog established: {v}");
    assert_eq!(num(&v, "verified"), up, "{v}");
    assert_eq!(num(&v, "after_verified"), 20.0, "the listener stopped working: {v}");
    eprintln!(
        "2000 attempts at once: {up} established, {rej} rejected (backlog full), {unr} timed out, setup {:.2} s; 20 more afterwards: all verified",
        num(&v, "setup_s")
    );
}

/// Issue #6 with the RoCE CM: three hosts (network namespaces on a bridge) open 500 RC
/// connections at once to one listener on a fourth; every one establishes and moves verified data.
#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn five_hundred_roce_connections_from_three_hosts() {
    let Some(lan) = common::lan::Lan::or_skip_with(4) else {
        return;
    };
    let roce = ["env", "SOFTRDMA_TRANSPORTS=roce"];
    let mut sargv = lan.exec(0);
    sargv.extend_from_slice(&roce);
    sargv.extend_from_slice(&[bin(), "scale", "-b", &lan.addrs[0], "-p", "0"]);
    let mut server = Logged::spawn(&sargv);
    let port = server.port(Duration::from_secs(10)).to_string();
    let counts = ["167", "167", "166"];
    let mut clients: Vec<Logged> = (1..=3)
        .map(|i| {
            let mut argv = lan.exec(i);
            argv.extend_from_slice(&roce);
            argv.extend_from_slice(&[
                bin(),
                "scale",
                &lan.addrs[0],
                "-p",
                &port,
                "-c",
                counts[i - 1],
                "--json",
                "--timeout",
                "60",
            ]);
            Logged::spawn(&argv)
        })
        .collect();
    let mut total = 0.0;
    for (i, c) in clients.iter_mut().enumerate() {
        let status = c
            .wait_exit(Duration::from_secs(200))
            .unwrap_or_else(|| panic!("client on host {} hangs: {}", i + 1, c.output()));
        let out = c.output();
        assert!(status.success(), "client on host {} failed: {out}", i + 1);
        let v = out
            .lines()
            .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .unwrap_or_else(|| panic!("no JSON summary: {out}"));
        let want: f64 = counts[i].parse().unwrap_or(0.0);
        assert_eq!(num(&v, "established"), want, "{v}");
        assert_eq!(num(&v, "verified"), want, "{v}");
        total += num(&v, "established");
    }
    assert_eq!(total, 500.0);
    assert!(server.running(), "the scale server died: {}", server.output());
}
