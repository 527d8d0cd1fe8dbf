//! A peer killed with SIGKILL mid-transfer surfaces on the other side within 2 s:
//! outstanding work flushes, the client exits non-zero and says why. No hang.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Reap(Child);
impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_softrdma")
}

#[test]
fn killed_server_surfaces_within_two_seconds() {
    let mut server = Command::new(bin())
        .args(["perf", "write-bw", "-b", "127.0.0.1", "-p", "0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let stderr = server.stderr.take().expect("stderr");
    let mut server = Reap(server);
    let mut line = String::new();
    BufReader::new(stderr).read_line(&mut line).expect("listening line");
    let port = line.trim().rsplit(':').next().expect("port").to_string();
    let client = Command::new(bin())
        .args([
            "perf",
            "write-bw",
            "127.0.0.1",
            "-p",
            &port,
            "-s",
            "1048576",
            "-n",
            "10000000",
            "--no-verify",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn client");
    let mut client = Reap(client);
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        client.0.try_wait().expect("try_wait").is_none(),
        "the client ended before the kill"
    );
    server.0.kill().expect("kill -9 server");
    let killed_at = Instant::now();
    let status = loop {
        if let Some(s) = client.0.try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(2),
            "client still running 2 s after the server was killed"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    if let Some(mut e) = client.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(!status.success(), "client succeeded after its peer died");
    assert!(err.contains("Flushed") || err.contains("failed"), "stderr: {err}");
}
