//! Soak (issue #6, part 5): `softrdma soak` — mixed SEND/WRITE/READ of random sizes on 4 QP
//! slots with random connects and disconnects (clean, server-initiated, and with a batch in
//! flight), every byte verified, RSS sampled after warm-up and at the end, fds and
//! progress-thread sources back to their starting count. 60 s under CI, 20 s otherwise
//! (`SOFTRDMA_SOAK_SECS` overrides);
//! `softrdma soak --seconds 600` is the 10-minute run by hand.

mod common;

use common::{bin, Logged};
use std::time::Duration;

#[test]
fn mixed_traffic_with_churn_every_byte_verified_flat_memory() {
    // `SOFTRDMA_SOAK_SECS` shortens it where only memory safety is checked (scripts/asan.sh).
    let secs = std::env::var("SOFTRDMA_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if std::env::var("CI").is_ok() { 60 } else { 20 });
    soak(&[], secs);
}

/// The same over soft-RoCE (`rxe_lo`: RC over UDP, IB CM); shorter, the iWARP run is the long one.
#[test]
fn mixed_traffic_with_churn_over_roce() {
    soak(&["env", "SOFTRDMA_TRANSPORTS=roce"], 20);
}

fn soak(env: &[&str], secs: u64) {
    let s = secs.to_string();
    let mut argv = env.to_vec();
    argv.extend_from_slice(&[
        bin(),
        "soak",
        "--seconds",
        &s,
        "--qps",
        "4",
        "--json",
        "--progress",
        "10",
    ]);
    let mut soak = Logged::spawn(&argv);
    let status = soak
        .wait_exit(Duration::from_secs(secs + 60))
        .unwrap_or_else(|| panic!("soak hangs: {}", soak.output()));
    let out = soak.output();
    let v = out
        .lines()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v.get("ok").is_some())
        })
        .unwrap_or_else(|| panic!("no soak summary: {out}"));
    assert!(status.success(), "{out}");
    assert_eq!(v["ok"], true, "{out}");
    assert_eq!(v["mismatches"], 0, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["server"]["mismatches"], 0, "{v}");
    assert_eq!(v["server"]["errors"], 0, "{v}");
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {v}"));
    for k in ["sends", "writes", "reads"] {
        assert!(n(k) > 100, "too few {k}: {v}");
    }
    assert!(n("connections") > 20, "too little churn: {v}");
    assert!(
        n("aborts") + n("server_disconnects") > 0,
        "no disconnect with work in flight: {v}"
    );
    assert_eq!(n("fds_after"), n("fds_before"), "{v}");
    assert_eq!(n("sources_after"), n("sources_before"), "{v}");
    // Flat memory: the tool fails the run past 20 MiB or 20 % growth after warm-up; restate it.
    let (warm, end) = (n("rss_warm_kib"), n("rss_end_kib"));
    assert!(end <= warm + (20 * 1024).max(warm / 5), "RSS {warm} -> {end} KiB: {v}");
    eprintln!(
        "soak {secs} s: {} connections, {} SEND / {} WRITE / {} READ, {} bytes, {} flushed around {} aborts and {} server disconnects (slowest {} ms); RSS {} KiB after warm-up, {} KiB at the end; 0 mismatches",
        n("connections"),
        n("sends"),
        n("writes"),
        n("reads"),
        n("bytes"),
        n("flushed"),
        n("aborts"),
        n("server_disconnects"),
        v["max_flush_ms"],
        warm,
        end
    );
}
