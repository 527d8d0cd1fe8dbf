//! Helpers for the end-to-end CLI tests: child processes that are always reaped, bounded waits.
#![allow(dead_code)]

pub mod lan;
pub mod netns;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_softrdma")
}

/// Kills and reaps the child on drop, so a failing test leaves no process behind.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a `softrdma perf` server (`prefix` runs it, e.g. `ip netns exec NS`) and returns it with its port.
pub fn start_server(prefix: &[&str], args: &[&str]) -> (Reap, u16) {
    let mut argv: Vec<&str> = prefix.to_vec();
    argv.push(bin());
    argv.extend_from_slice(args);
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn server");
    let stderr = child.stderr.take().expect("server stderr");
    let child = Reap(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("server {args:?} did not report its port within 10 s"));
        if let Some(rest) = line.split("listening on ").nth(1) {
            let port = rest
                .rsplit(':')
                .next()
                .and_then(|p| p.trim().parse().ok())
                .expect("port in the listening line");
            return (child, port);
        }
    }
}

/// Runs a command to completion within `timeout` (killed and failed otherwise).
pub fn run_bounded(argv: &[&str], timeout: Duration) -> Output {
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (mut out, mut err) = (
        child.stdout.take().expect("stdout"),
        child.stderr.take().expect("stderr"),
    );
    let o = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let mut child = Reap(child);
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("try_wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "{argv:?} did not finish within {timeout:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: o.join().unwrap_or_default(),
        stderr: e.join().unwrap_or_default(),
    }
}

/// Parses the client's JSON lines and checks one verified object per size.
pub fn check_results(test: &str, out: &Output, sizes: &[u64]) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{test}: client failed: {stderr}\n{stdout}");
    let objs: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(objs.len(), sizes.len(), "{test}: {stdout}");
    for (o, &size) in objs.iter().zip(sizes) {
        assert_eq!(o["test"], test);
        assert_eq!(o["size"], size);
        assert_eq!(o["verified"], true, "{o}");
        assert!(o["iterations"].as_u64().unwrap_or(0) > 0);
        let keys: &[&str] = if test.ends_with("-bw") {
            &["gbit_per_s", "msg_per_s"]
        } else {
            &["p50_us", "p99_us"]
        };
        for k in keys {
            assert!(o[*k].as_f64().is_some_and(|v| v > 0.0), "{test}: {k} missing in {o}");
        }
    }
}

pub const TESTS: [&str; 6] = ["send-bw", "write-bw", "read-bw", "send-lat", "write-lat", "read-lat"];
