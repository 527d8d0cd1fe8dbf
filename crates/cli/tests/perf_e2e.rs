//! `softrdma perf` between two processes on 127.0.0.1: every test at 1 B, 4 KiB and 1 MiB, data verified.

mod common;

use common::{check_results, run_bounded, start_server};
use std::time::Duration;

fn run(test: &str, extra: &[&str]) {
    let mut sargs = vec!["perf", test, "-b", "127.0.0.1", "-p", "0"];
    sargs.extend_from_slice(extra);
    let (mut server, port) = start_server(&[], &sargs);
    let port = port.to_string();
    let iters = if test.ends_with("-bw") { "40" } else { "30" };
    let mut cargs = vec![
        common::bin(),
        "perf",
        test,
        "127.0.0.1",
        "-p",
        &port,
        "-s",
        "1,4096,1048576",
        "-n",
        iters,
        "--json",
    ];
    cargs.extend_from_slice(extra);
    let out = run_bounded(&cargs, Duration::from_secs(120));
    check_results(test, &out, &[1, 4096, 1048576]);
    let status = server.0.wait().expect("server exit");
    assert!(status.success(), "{test}: server failed");
}

#[test]
fn send_bw() {
    run("send-bw", &[]);
}

#[test]
fn write_bw() {
    run("write-bw", &[]);
}

#[test]
fn read_bw() {
    run("read-bw", &[]);
}

#[test]
fn send_lat() {
    run("send-lat", &[]);
}

#[test]
fn write_lat() {
    run("write-lat", &[]);
}

#[test]
fn read_lat() {
    run("read-lat", &[]);
}

#[test]
fn with_mpa_crc() {
    run("write-bw", &["--mpa-crc"]);
    run("send-lat", &["--mpa-crc"]);
}

#[test]
fn with_completion_events() {
    // `--events`: both sides sleep on a completion channel (perftest's -e), iWARP and RoCE.
    run("send-lat", &["--events"]);
    run("send-bw", &["--events"]);
    run("send-lat", &["--events", "-d", "rxe_lo"]);
}

#[test]
fn nothing_listening_is_refused_at_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let started = std::time::Instant::now();
    let out = run_bounded(
        &[common::bin(), "perf", "write-bw", "127.0.0.1", "-p", &port],
        Duration::from_secs(10),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("127.0.0.1:{port}")) && err.contains("refused"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// The same six tests over the soft-RoCE device (RC over UDP; the QPs connected as perftest
/// connects them, through an exchange of QPN, PSN and GID over TCP).
#[test]
fn every_test_over_rxe() {
    for test in common::TESTS {
        run(test, &["-d", "rxe_lo"]);
    }
}

/// `SOFTRDMA_POLL` was retired: set, it changes nothing (the run completes, data verified)
/// and the user is told once that it is ignored, and why.
#[test]
fn the_retired_poll_variable_is_ignored_with_a_notice() {
    let env = ["env", "SOFTRDMA_POLL=1"];
    let (mut server, port) = start_server(&env, &["perf", "send-lat", "-b", "127.0.0.1", "-p", "0"]);
    let port = port.to_string();
    let out = run_bounded(
        &[
            env[0],
            env[1],
            common::bin(),
            "perf",
            "send-lat",
            "127.0.0.1",
            "-p",
            &port,
            "-s",
            "8",
            "-n",
            "30",
            "--json",
        ],
        Duration::from_secs(60),
    );
    check_results("send-lat", &out, &[8]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("SOFTRDMA_POLL is set but ignored: retired").count(),
        1,
        "{err}"
    );
    assert!(server.0.wait().expect("server exit").success());
}
