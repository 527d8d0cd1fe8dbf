//! The CM across three hosts (network namespaces on a bridge, 198.18.0.0/15), and the loopback
//! contract where hosts meet: R4, R9, R11, R12 of ../shared/LOOPBACK.md.

mod common;

use common::lan::Lan;
use common::{bin, run_bounded, Reap};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PORT: &str = "7471";

/// Starts `softrdma <args>` inside host `i` and waits for its first stdout line containing `ready`.
fn server(lan: &Lan, i: usize, args: &[&str], ready: &str) -> Reap {
    let mut argv = lan.exec(i);
    argv.push(bin());
    argv.extend_from_slice(args);
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let out = child.stdout.take().expect("stdout");
    let child = Reap(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(ready) => return child,
            Ok(_) => {}
            Err(_) => panic!("server {args:?} in {} never printed {ready:?}", lan.hosts[i]),
        }
    }
}

fn client(lan: &Lan, i: usize, args: &[&str], timeout: Duration) -> (bool, String, Duration) {
    let mut argv = lan.exec(i);
    argv.push(bin());
    argv.extend_from_slice(args);
    let t = Instant::now();
    let out = run_bounded(&argv, timeout);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, t.elapsed())
}

/// Sends an MPA Request from host `i` to `dst` (no local bind) and returns the reply's verdict.
fn mpa_probe(lan: &Lan, i: usize, dst: &str) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let exe = exe.to_string_lossy().to_string();
    let mut argv = lan.exec(i);
    argv.extend_from_slice(&[&exe, "--ignored", "--exact", "mpa_probe_child", "--nocapture"]);
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .env("SOFTRDMA_PROBE_DST", dst)
        .output()
        .expect("probe");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("PROBE "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs inside a namespace for `mpa_probe`: TCP connect, MPA Request, print the reply.
#[test]
#[ignore = "helper run by the multi-host tests inside a namespace"]
fn mpa_probe_child() {
    use softrdma_iwarp::handshake::{build_request, parse_reply, MpaParams, ReplyOutcome};
    use std::io::{Read, Write};
    let dst: std::net::SocketAddr = std::env::var("SOFTRDMA_PROBE_DST").expect("dst").parse().expect("addr");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut s = loop {
        match std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => {
                println!("PROBE TCP-ERROR {e}");
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    println!(
        "PROBE CONNECTED local {} peer {}",
        s.local_addr().expect("local"),
        s.peer_addr().expect("peer")
    );
    let params = MpaParams {
        private_data: b"probe".to_vec(),
        ird: 1,
        ord: 1,
        crc: false,
        p2p: false,
    };
    s.write_all(&build_request(&params).expect("request")).expect("send");
    s.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Ok(Some((out, _))) = parse_reply(&buf, &params) {
            match out {
                ReplyOutcome::Rejected(pd) => println!("PROBE REJECTED {}", String::from_utf8_lossy(&pd)),
                ReplyOutcome::Accepted(_) => println!("PROBE ACCEPTED"),
            }
            return;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => {
                println!("PROBE CLOSED without a reply");
                return;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn cross_host_connect_and_data() {
    let Some(lan) = Lan::or_skip() else { return };
    let h1 = lan.addrs[0].clone();
    let srv = server(
        &lan,
        0,
        &["cmatose", "--verify", "-b", &h1, "-p", PORT, "-c", "2", "-C", "20"],
        "listening",
    );
    let (ok, text, _) = client(
        &lan,
        1,
        &["cmatose", "--verify", "-s", &h1, "-p", PORT, "-c", "2", "-C", "20"],
        Duration::from_secs(60),
    );
    assert!(ok, "cmatose across hosts failed:\n{text}");
    let mut srv = srv;
    assert!(srv.0.wait().expect("server").success());
    // rping from the third host: SEND, RDMA READ and RDMA WRITE across the bridge, validated.
    let mut argv = lan.exec(0);
    argv.extend_from_slice(&[bin(), "rping", "-s", "-a", &h1, "-p", "7174", "-C", "20", "-V"]);
    let mut rsrv = Reap(
        Command::new(argv[0])
            .args(&argv[1..])
            .stdout(Stdio::null())
            .spawn()
            .expect("rping server"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (ok, text, _) = client(
            &lan,
            2,
            &["rping", "-c", "-a", &h1, "-p", "7174", "-C", "20", "-V", "-v"],
            Duration::from_secs(60),
        );
        if ok {
            break text;
        }
        assert!(
            Instant::now() < deadline && text.contains("REJECTED"),
            "rping across hosts failed:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(text.lines().filter(|l| l.contains("ping data")).count(), 20, "{text}");
    assert!(rsrv.0.wait().expect("rping server").success());
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn r4_loopback_listener_is_unreachable_from_another_host() {
    let Some(lan) = Lan::or_skip() else { return };
    let _srv = server(&lan, 0, &["cmatose", "-b", "127.0.0.2", "-p", PORT], "listening");
    // Plain: another host asks for h1's real address on that port: nothing listens there.
    let dst = format!("{}:{PORT}", lan.addrs[0]);
    let (ok, text, took) = client(
        &lan,
        1,
        &["cmatose", "-s", &lan.addrs[0], "-p", PORT],
        Duration::from_secs(20),
    );
    assert!(!ok && text.contains("REJECTED"), "{dst}: {text}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // Misrouted: another host's packets to 127.0.0.2 do reach h1's socket; the CM refuses them.
    lan.route_loopback_across(1, 0, "127.0.0.2").expect("route");
    let probe = mpa_probe(&lan, 1, &format!("127.0.0.2:{PORT}"));
    assert!(
        probe.contains("PROBE CONNECTED"),
        "the misroute did not reach h1: {probe}"
    );
    assert!(
        probe.contains("PROBE REJECTED") && probe.contains("only connections from this host"),
        "{probe}"
    );
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn r12_remote_request_naming_loopback_is_rejected() {
    let Some(lan) = Lan::or_skip() else { return };
    let _srv = server(&lan, 0, &["cmatose", "-p", PORT], "listening");
    lan.route_loopback_across(1, 0, "127.0.0.2").expect("route");
    let probe = mpa_probe(&lan, 1, &format!("127.0.0.2:{PORT}"));
    assert!(probe.contains("PROBE CONNECTED"), "{probe}");
    assert!(
        probe.contains("PROBE REJECTED") && probe.contains("names loopback address 127.0.0.2"),
        "{probe}"
    );
    // The same listener still serves a proper request from that host.
    let (ok, text, _) = client(
        &lan,
        1,
        &["cmatose", "-s", &lan.addrs[0], "-p", PORT],
        Duration::from_secs(30),
    );
    assert!(ok, "{text}");
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn r11_a_handed_loopback_address_means_the_own_host() {
    let Some(lan) = Lan::or_skip() else { return };
    // h1 serves on every address; h2 is (wrongly) told "127.0.0.1:7471".
    let mut h1 = server(&lan, 0, &["cmatose", "-p", PORT], "listening");
    let (ok, text, took) = client(
        &lan,
        1,
        &["cmatose", "-s", "127.0.0.1", "-p", PORT],
        Duration::from_secs(20),
    );
    assert!(!ok && text.contains("REJECTED"), "expected REJECTED at once:\n{text}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Now something on h2 listens on that port: the same address reaches h2's own listener, silently.
    let mut h2 = server(&lan, 1, &["cmatose", "-b", "127.0.0.1", "-p", PORT], "listening");
    let (ok, text, _) = client(
        &lan,
        1,
        &["cmatose", "-s", "127.0.0.1", "-p", PORT],
        Duration::from_secs(30),
    );
    assert!(ok, "{text}");
    assert!(
        h2.0.wait().expect("h2 server").success(),
        "h2's own listener served the connection"
    );
    assert!(
        h1.0.try_wait().expect("h1").is_none(),
        "h1 never saw a connection and still waits"
    );
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn r9_no_answer_is_unreachable_within_the_bound() {
    let Some(lan) = Lan::or_skip() else { return };
    let (ok, text, took) = client(
        &lan,
        1,
        &["cmatose", "-s", &lan.nobody, "-p", PORT, "--timeout-ms", "1000"],
        Duration::from_secs(20),
    );
    assert!(!ok && text.contains("UNREACHABLE"), "{text}");
    assert!(text.contains("-110") || text.contains("ETIMEDOUT"), "{text}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
}
