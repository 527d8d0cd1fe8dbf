//! Helpers for the end-to-end CLI tests: child processes that are always reaped, bounded waits.
#![allow(dead_code)]

pub mod lan;
pub mod netns;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
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

/// A child process whose stdout and stderr lines are collected as they come; killed and reaped
/// on drop (through [`Reap`]).
pub struct Logged {
    pub child: Reap,
    rx: mpsc::Receiver<String>,
    /// Every line read so far.
    pub lines: Vec<String>,
}

impl Logged {
    /// Spawns `argv` (e.g. `["ip", "netns", "exec", NS, bin(), ...]`).
    pub fn spawn(argv: &[&str]) -> Logged {
        let mut child = Command::new(argv[0])
            .args(&argv[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(l);
            }
        });
        Logged {
            child: Reap(child),
            rx,
            lines: Vec::new(),
        }
    }

    /// Waits for a line containing `pat` (bounded) and returns it.
    pub fn wait_line(&mut self, pat: &str, timeout: Duration) -> Option<String> {
        if let Some(l) = self.lines.iter().find(|l| l.contains(pat)) {
            return Some(l.clone());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self.rx.recv_timeout(left).ok()?;
            self.lines.push(l.clone());
            if l.contains(pat) {
                return Some(l);
            }
        }
    }

    /// The port of the child's "listening on ADDR:PORT" line (bounded).
    pub fn port(&mut self, timeout: Duration) -> u16 {
        let line = self
            .wait_line("listening on ", timeout)
            .unwrap_or_else(|| panic!("no 'listening on' line within {timeout:?}: {:?}", self.lines));
        line.rsplit(':')
            .next()
            .and_then(|p| p.trim().parse().ok())
            .expect("port in the listening line")
    }

    /// Waits up to `timeout` for the child to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.0.try_wait().expect("try_wait") {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Takes the lines printed so far without waiting.
    pub fn poll_lines(&mut self) -> &[String] {
        while let Ok(l) = self.rx.try_recv() {
            self.lines.push(l);
        }
        &self.lines
    }

    /// True while the child runs.
    pub fn running(&mut self) -> bool {
        self.child.0.try_wait().expect("try_wait").is_none()
    }

    /// Everything printed so far (after the child exited: everything), one line each.
    pub fn output(&mut self) -> String {
        // The reader threads end at EOF; give them a moment to deliver the last lines.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.rx.recv_timeout(Duration::from_millis(50)) {
                Ok(l) => self.lines.push(l),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(_) if Instant::now() >= deadline => break,
                Err(_) if self.child.0.try_wait().ok().flatten().is_none() => break,
                Err(_) => {}
            }
        }
        self.lines.join("\n")
    }
}
