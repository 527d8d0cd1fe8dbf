//! `softrdma stat --json` shows the live counters of running perftest pairs over the drop-in:
//! `ib_write_bw` on the soft-RoCE device `rxe_lo` and `ib_write_bw -R` (rdma_cm) on the
//! soft-iWARP device `siw_lo`, each side a separate process.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

/// The QPs `softrdma stat --json` reports for `pid` on `device`.
fn qps_of(stat: &Value, pid: u32, device: &str) -> Vec<Value> {
    stat["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["pid"].as_u64() == Some(u64::from(pid)))
        .flat_map(|p| p["qps"].as_array().cloned().unwrap_or_default())
        .filter(|q| q["device"] == device)
        .collect()
}

fn counter(q: &Value, name: &str) -> u64 {
    q["counters"][name].as_u64().unwrap_or(0)
}

/// Runs an `ib_write_bw` pair for a few seconds and, while it runs, asks `softrdma stat --json`
/// until both processes show an RC QP on `device` that moved data (one way: the passive side
/// of an iWARP WRITE stream sends nothing; TCP acknowledges) and, over RoCE, its engine's
/// sequence state.
fn counters_of_a_running_pair(device: &str, transport: &str, extra: &[&str]) {
    let port = free_port().to_string();
    let mut args = vec!["-d", device, "-D", "4", "-p", port.as_str()];
    args.extend_from_slice(extra);
    let mut server = Proc::start(Command::new(binary("ib_write_bw")).args(&args));
    wait_listening(&mut server, port.parse().unwrap());
    let client = Proc::start(Command::new(binary("ib_write_bw")).args(&args).arg("127.0.0.1"));
    let (spid, cpid) = (server.pid(), client.pid());
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut last = String::new();
    let seen = loop {
        let r = run(Command::new(softrdma()).args(["stat", "--json"]));
        assert_eq!(r.code, Some(0), "{}", r.describe());
        let stat: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
        let moved = |pid| {
            qps_of(&stat, pid, device).iter().any(|q| {
                q["transport"] == transport
                    && q["qp_type"] == "RC"
                    && counter(q, "tx_packets") + counter(q, "rx_packets") > 100
                    && counter(q, "tx_bytes") + counter(q, "rx_bytes") > 1 << 20
                    // a RoCE RC QP also shows its protocol state (PSNs, queued work, timers)
                    && (transport != "roce"
                        || q["engine"]
                            .as_str()
                            .is_some_and(|e| e.starts_with("sq: una ") && e.contains("; rq: epsn ")))
            })
        };
        if moved(spid) && moved(cpid) {
            let totals = stat["devices"].as_array().cloned().unwrap_or_default();
            assert!(
                totals
                    .iter()
                    .any(|d| d["device"] == device && d["qps"].as_u64() >= Some(2)),
                "per-device totals: {stat:#}"
            );
            break true;
        }
        last = r.stdout;
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let client = client.wait(TIMEOUT);
    let server = server.wait_or(TIMEOUT, &client.describe());
    assert!(
        client.code == Some(0) && server.code == Some(0),
        "{}\n{}",
        client.describe(),
        server.describe()
    );
    assert!(
        seen,
        "both ib_write_bw processes ({spid}, {cpid}) with moving counters on {device}:\n{last}"
    );
}

#[test]
fn stat_shows_a_running_ib_write_bw_pair_over_rxe() {
    counters_of_a_running_pair("rxe_lo", "roce", &[]);
}

#[test]
fn stat_shows_a_running_ib_write_bw_pair_over_siw_with_rdma_cm() {
    counters_of_a_running_pair("siw_lo", "iwarp", &["-R"]);
}
