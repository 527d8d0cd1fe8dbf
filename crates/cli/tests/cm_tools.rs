//! End-to-end tests of `softrdma cmatose` and `softrdma rping` over loopback: the built binary
//! runs as server and client; children are reaped on drop and every wait is bounded.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a whole tool run may take in these tests.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// A free TCP port on 127.0.0.1 (bound, then released for the tool to use).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// A running `softrdma`, killed and reaped on drop; stdout lines stream to `lines`.
struct Proc {
    child: Child,
    lines: Receiver<String>,
    stdout: Vec<String>,
    out_thread: Option<JoinHandle<()>>,
    err_thread: Option<JoinHandle<String>>,
}

/// What a finished run printed.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Proc {
    /// Starts `softrdma ARGS`, with `SOFTRDMA_CONFIG` set to `config` if given.
    fn spawn(args: &[&str], config: Option<&PathBuf>) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_softrdma"));
        cmd.args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match config {
            Some(p) => cmd.env("SOFTRDMA_CONFIG", p),
            None => cmd.env_remove("SOFTRDMA_CONFIG"),
        };
        let mut child = cmd.spawn().expect("spawn softrdma");
        let out = child.stdout.take().expect("stdout");
        let mut err = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        let out_thread = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let err_thread = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Proc {
            child,
            lines,
            stdout: Vec::new(),
            out_thread: Some(out_thread),
            err_thread: Some(err_thread),
        }
    }

    /// Waits for a stdout line containing `needle`.
    fn wait_line(&mut self, needle: &str, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let line = self.lines.recv_timeout(left).ok()?;
            self.stdout.push(line.clone());
            if line.contains(needle) {
                return Some(line);
            }
        }
    }

    /// Waits for the exit (killing the child after `limit`) and collects its output.
    fn finish(mut self, limit: Duration) -> Finished {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "softrdma did not exit within {limit:?}; stdout so far: {:?}",
                    self.stdout
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let elapsed = start.elapsed();
        if let Some(t) = self.out_thread.take() {
            let _ = t.join();
        }
        self.stdout.extend(self.lines.try_iter());
        let stderr = self.err_thread.take().and_then(|t| t.join().ok()).unwrap_or_default();
        Finished {
            status,
            stdout: self.stdout.join("\n"),
            stderr,
            elapsed,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `softrdma ARGS` to completion.
fn run(args: &[&str], config: Option<&PathBuf>) -> Finished {
    Proc::spawn(args, config).finish(RUN_LIMIT)
}

fn assert_ok(who: &str, f: &Finished) {
    assert!(
        f.status.success(),
        "{who} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        f.status,
        f.stdout,
        f.stderr
    );
}

/// Runs a cmatose server with `server_args` and a client with `client_args` on a fresh port.
fn cmatose_pair(server_args: &[&str], client_args: &[&str]) -> (Finished, Finished) {
    let port = free_port().to_string();
    let mut sargs = vec!["cmatose", "--verify", "-p", &port];
    sargs.extend_from_slice(server_args);
    let mut server = Proc::spawn(&sargs, None);
    let listening = server.wait_line("cmatose: listening on", Duration::from_secs(10));
    assert!(listening.is_some(), "the cmatose server did not report listening");
    let mut cargs = vec!["cmatose", "--verify", "-p", &port];
    cargs.extend_from_slice(client_args);
    let client = run(&cargs, None);
    let server = server.finish(RUN_LIMIT);
    (server, client)
}

#[test]
fn cmatose_one_connection_over_loopback() {
    let (server, client) = cmatose_pair(&["-b", "127.0.0.1"], &["-s", "127.0.0.1"]);
    assert_ok("server", &server);
    assert_ok("client", &client);
    for line in [
        "cmatose: starting server",
        "data transfers complete",
        "cmatose: disconnecting",
    ] {
        assert!(server.stdout.contains(line), "{}", server.stdout);
    }
    assert!(
        server
            .stdout
            .contains("remote peers can connect to: none (bound to a loopback address"),
        "{}",
        server.stdout
    );
    for line in [
        "cmatose: connecting",
        "receiving data transfers",
        "sending replies",
        "test complete",
        "return status 0",
    ] {
        assert!(client.stdout.contains(line), "{}", client.stdout);
    }
}

#[test]
fn cmatose_fifty_connections_hundred_messages() {
    let (server, client) = cmatose_pair(
        &["-c", "50", "-C", "100"],
        &["-s", "127.0.0.1", "-c", "50", "-C", "100"],
    );
    assert_ok("server", &server);
    assert_ok("client", &client);
    assert!(server.stdout.contains("return status 0"), "{}", server.stdout);
    let listen = server
        .stdout
        .lines()
        .find(|l| l.contains("listening on"))
        .unwrap_or_default();
    assert!(!listen.contains("127.0.0.1"), "loopback is never advertised: {listen}");
}

#[test]
fn rping_hundred_validated_pings() {
    let port = free_port().to_string();
    let mut server = Proc::spawn(
        &["rping", "-s", "-a", "127.0.0.1", "-p", &port, "-C", "100", "-V", "-v"],
        None,
    );
    let listening = server.wait_line("rping: listening on", Duration::from_secs(10));
    assert!(listening.is_some(), "the rping server did not report listening");
    let client = run(
        &["rping", "-c", "-a", "127.0.0.1", "-p", &port, "-C", "100", "-V", "-v"],
        None,
    );
    let server = server.finish(RUN_LIMIT);
    assert_ok("client", &client);
    assert_ok("server", &server);
    let pings: Vec<&str> = client.stdout.lines().filter(|l| l.starts_with("ping data: ")).collect();
    assert_eq!(pings.len(), 100, "{}", client.stdout);
    assert_eq!(
        pings[0],
        "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    assert!(pings[99].starts_with("ping data: rdma-ping-99: jklm"), "{}", pings[99]);
    let served = server
        .stdout
        .lines()
        .filter(|l| l.starts_with("server ping data: "))
        .count();
    assert_eq!(served, 100, "{}", server.stdout);
}

/// A config file naming only `siw_lo` with loopback disabled; removed on drop.
struct NoLoopbackConfig(PathBuf);

impl NoLoopbackConfig {
    fn new(tag: &str) -> NoLoopbackConfig {
        let path = std::env::temp_dir().join(format!("softrdma-cm-tools-{}-{tag}.toml", std::process::id()));
        let text = "[[device]]\nname = \"siw_lo\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\nloopback = false\n";
        std::fs::write(&path, text).expect("write config");
        NoLoopbackConfig(path)
    }
}

impl Drop for NoLoopbackConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn assert_fast_failure(what: &str, f: &Finished, prefix: &str, step: &str) {
    assert!(!f.status.success(), "{what} succeeded: {}", f.stdout);
    assert!(f.elapsed < Duration::from_secs(1), "{what} took {:?}", f.elapsed);
    let err = f.stderr.trim_end();
    assert!(err.starts_with(prefix), "{what}: {err}");
    for needle in [step, "siw_lo", "loopback disabled"] {
        assert!(err.contains(needle), "{what}: stderr lacks {needle:?}: {err}");
    }
}

#[test]
fn loopback_disabled_fails_fast_on_both_sides() {
    let cfg = NoLoopbackConfig::new("noloop");
    let port = free_port().to_string();
    let server = run(&["cmatose", "-b", "127.0.0.1", "-p", &port], Some(&cfg.0));
    assert_fast_failure("cmatose server", &server, "softrdma cmatose: ", "bind");
    let client = run(&["cmatose", "-s", "127.0.0.1", "-p", &port], Some(&cfg.0));
    assert_fast_failure("cmatose client", &client, "softrdma cmatose: ", "resolve");
    let server = run(&["rping", "-s", "-a", "127.0.0.1", "-p", &port], Some(&cfg.0));
    assert_fast_failure("rping server", &server, "softrdma rping: ", "bind");
    let client = run(
        &["rping", "-c", "-a", "127.0.0.1", "-p", &port, "-C", "1"],
        Some(&cfg.0),
    );
    assert_fast_failure("rping client", &client, "softrdma rping: ", "resolve");
}

#[test]
fn client_without_listener_is_rejected_fast() {
    let port = free_port().to_string();
    let c = run(&["cmatose", "-s", "127.0.0.1", "-p", &port], None);
    assert!(!c.status.success());
    assert!(c.elapsed < Duration::from_secs(2), "took {:?}", c.elapsed);
    assert!(c.stdout.contains("RDMA_CM_EVENT_REJECTED, error: -111"), "{}", c.stdout);
    assert!(
        c.stderr.contains("RDMA_CM_EVENT_REJECTED, status -111: ") && c.stderr.contains("connection refused"),
        "{}",
        c.stderr
    );
    let r = run(&["rping", "-c", "-a", "127.0.0.1", "-p", &port, "-C", "1"], None);
    assert!(!r.status.success());
    assert!(r.elapsed < Duration::from_secs(2), "took {:?}", r.elapsed);
    assert!(r.stderr.contains("RDMA_CM_EVENT_REJECTED"), "{}", r.stderr);
}

#[test]
fn cmatose_connect_timeout_reports_unreachable() {
    // A TCP listener that never answers the MPA request: connection setup cannot finish.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port().to_string();
    let c = run(
        &["cmatose", "-s", "127.0.0.1", "-p", &port, "--timeout-ms", "300"],
        None,
    );
    drop(silent);
    assert!(!c.status.success());
    assert!(c.elapsed < Duration::from_secs(2), "took {:?}", c.elapsed);
    assert!(
        c.stderr.contains("RDMA_CM_EVENT_UNREACHABLE, status -110"),
        "{}",
        c.stderr
    );
}

#[test]
fn rping_rejects_sizes_outside_rpings_range() {
    let r = run(&["rping", "-c", "-a", "127.0.0.1", "-S", "25"], None);
    assert!(!r.status.success());
    assert!(r.stderr.contains("valid range is 26 to 65535"), "{}", r.stderr);
}
