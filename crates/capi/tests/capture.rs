//! `softrdma capture` records same-host traffic of both transports in a pcapng that the wire
//! oracle (`tools/wirecheck`, Wireshark underneath) decodes and passes: `ibv_rc_pingpong` on
//! `rxe_lo` (soft-RoCE to per-process UDP ports, readdressed to 4791 in the file) and `rping`
//! on `siw_lo` (soft-iWARP on TCP), unmodified, over the drop-in.

mod common;
mod multihost;

use common::{dropin_dir, free_port, softrdma, Proc, TIMEOUT};
use multihost::{wirecheck, wirecheck_path, Hosts};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[test]
#[cfg_attr(softrdma_unprivileged, ignore = "needs root: dumpcap captures on lo (CI runs it)")]
#[cfg_attr(
    softrdma_no_capture_tools,
    ignore = "needs dumpcap, tshark and nftables (apt-get install tshark nftables)"
)]
fn capture_of_same_host_roce_and_iwarp_passes_wirecheck() {
    let checker = wirecheck_path().expect("tools/wirecheck/wirecheck is in the repository");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("same-host.pcapng");
    let (pp, rp) = (free_port(), free_port());
    // Both pairs, one after the other; the script fails if any of the four tools fails.
    let script = format!(
        "ibv_rc_pingpong -d rxe_lo -g 0 -n 50 -s 4096 -p {pp} & sleep 0.5; \
         ibv_rc_pingpong -d rxe_lo -g 0 -n 50 -s 4096 -p {pp} 127.0.0.1 || exit 1; wait $! || exit 2; \
         rping -s -a 127.0.0.1 -p {rp} -C 5 & sleep 0.5; \
         rping -c -a 127.0.0.1 -p {rp} -C 5 -V || exit 3; wait $! || exit 4"
    );
    let r = Proc::start(
        Command::new(softrdma())
            .arg("capture")
            .arg("-w")
            .arg(&file)
            .args(["--", "sh", "-c", &script])
            .env("LD_LIBRARY_PATH", dropin_dir()),
    )
    .wait(TIMEOUT + Duration::from_secs(30));
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let readdressed = readdressed(&r.stderr);
    assert!(
        readdressed >= 200,
        "same-host RoCE datagrams readdressed: {}",
        r.describe()
    );
    let report = wirecheck(&checker, &file, &["roce", "iwarp"]);
    assert!(report.contains("icrc_bad=0"), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Same-host soft-RoCE sends a run of equal-size packets as one `UDP_SEGMENT` send, with
/// packet `k`'s ICRC computed for IPv4 Identification `k` (the roce driver's `gso.rs`). Here
/// the kernel itself says which IDs it writes: in a namespace whose `lo` takes no GSO frames
/// (`gso_max_segs 1`), the stack segments every run before the capture sees it, so each
/// captured datagram carries the header the kernel made. Every RoCE datagram must still
/// verify (the capture readdresses only those whose ICRC fits their real header), and the
/// runs must show (IDs 1..3 of 4-packet messages).
#[test]
#[cfg_attr(softrdma_unprivileged, ignore = "needs root: namespaces, dumpcap on lo (CI runs it)")]
#[cfg_attr(
    softrdma_no_capture_tools,
    ignore = "needs dumpcap, tshark and nftables (apt-get install tshark nftables)"
)]
fn kernel_segmented_gso_runs_carry_the_icrc_of_their_ipv4_ids() {
    let checker = wirecheck_path().expect("tools/wirecheck/wirecheck is in the repository");
    let Some(h) = Hosts::or_skip("g") else { return };
    let set = Command::new("ip")
        .args(["-n", &h.a, "link", "set", "dev", "lo", "gso_max_segs", "1"])
        .status()
        .unwrap();
    assert!(set.success(), "ip link set lo gso_max_segs 1");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("capture-gso-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("segmented.pcapng");
    let pp = free_port();
    // 50 round trips of 4 KiB at MTU 1024: 4-packet SENDs, each a GSO run.
    let script = format!(
        "ibv_rc_pingpong -d rxe_lo -g 0 -m 1024 -n 50 -s 4096 -p {pp} & sleep 0.5; \
         ibv_rc_pingpong -d rxe_lo -g 0 -m 1024 -n 50 -s 4096 -p {pp} 127.0.0.1 || exit 1; wait $! || exit 2"
    );
    let file_arg = file.to_string_lossy().into_owned();
    let r = Proc::start(
        h.cmd(
            &h.a,
            softrdma(),
            &["capture", "-w", &file_arg, "--", "sh", "-c", &script],
        )
        .env("LD_LIBRARY_PATH", dropin_dir()),
    )
    .wait(TIMEOUT + Duration::from_secs(30));
    assert_eq!(r.code, Some(0), "{}", r.describe());
    // 400 data packets and their ACKs; the readdressing checked each ICRC.
    let readdressed = readdressed(&r.stderr);
    assert!(
        readdressed >= 450,
        "RoCE datagrams with a verified ICRC: {}",
        r.describe()
    );
    let ids = Command::new("tshark")
        .args([
            "-r",
            &file_arg,
            "-Y",
            "udp.dstport == 4791 && ip.id == 3",
            "-T",
            "fields",
            "-e",
            "ip.id",
        ])
        .output()
        .unwrap();
    let id3 = String::from_utf8_lossy(&ids.stdout).lines().count();
    assert!(id3 >= 90, "the 4th packet of each run has ID 3 ({id3} found)");
    let report = wirecheck(&checker, &file, &["roce"]);
    assert!(report.contains("icrc_bad=0"), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// How many datagrams `softrdma capture` says it readdressed (whose ICRC it verified): the
/// number after "; " in its summary line, 0 if there is none.
fn readdressed(stderr: &str) -> u64 {
    stderr
        .split("; ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
