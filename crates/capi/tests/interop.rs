//! Rust and C on one wire: `softrdma rping` and `softrdma cmatose` (the Rust API) against the
//! unmodified Debian `rping` and `ucmatose` (C, over the drop-in library), in both directions; and `ucmatose` / `rping` over the
//! drop-in library between two hosts (network namespaces joined by veth, 198.18.0.0/15).

mod common;

use common::{binary, free_port, wait_listening, Proc, Run, TIMEOUT};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The `softrdma` CLI of this workspace (cargo builds every binary before running tests).
fn softrdma() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("softrdma");
    assert!(p.is_file(), "{} not built (run `cargo build --workspace`)", p.display());
    p
}

fn ok(what: &str, r: &Run) {
    assert_eq!(r.code, Some(0), "{what}: {}", r.describe());
}

fn pings(r: &Run) -> usize {
    r.stdout.lines().filter(|l| l.contains("ping data")).count()
}

#[test]
fn rust_rping_client_against_c_rping_server() {
    let port = free_port();
    let p = port.to_string();
    let mut srv = Proc::start(Command::new(binary("rping")).args(["-s", "-a", "127.0.0.1", "-p", &p, "-V"]));
    wait_listening(&mut srv, port);
    let cli = Proc::start(Command::new(softrdma()).args([
        "rping",
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &p,
        "-C",
        "50",
        "-V",
        "-v",
    ]))
    .wait(TIMEOUT);
    let srv = srv.wait_or(TIMEOUT, &cli.describe());
    ok("softrdma rping client", &cli);
    ok("C rping server", &srv);
    assert_eq!(pings(&cli), 50, "{}", cli.describe());
}

#[test]
fn c_rping_client_against_rust_rping_server() {
    let port = free_port();
    let p = port.to_string();
    let mut srv = Proc::start(Command::new(softrdma()).args(["rping", "-s", "-a", "127.0.0.1", "-p", &p, "-V"]));
    wait_listening(&mut srv, port);
    let cli =
        Proc::start(Command::new(binary("rping")).args(["-c", "-a", "127.0.0.1", "-p", &p, "-C", "50", "-V", "-v"]))
            .wait(TIMEOUT);
    let srv = srv.wait_or(TIMEOUT, &cli.describe());
    ok("C rping client", &cli);
    ok("softrdma rping server", &srv);
    assert_eq!(pings(&cli), 50, "{}", cli.describe());
}

/// ucmatose's closing line for a passing run.
fn passed(r: &Run) -> bool {
    r.stdout.contains("return status 0")
}

/// `softrdma cmatose` and Debian's `ucmatose` with their usual flags: 10 messages of 100 bytes
/// each way (ucmatose sends its buffers unfilled, so the Rust side checks lengths, not bytes).
fn cmatose_pair(rust_server: bool) -> (Run, Run) {
    let port = free_port();
    let p = port.to_string();
    let mut srv = if rust_server {
        Proc::start(Command::new(softrdma()).args(["cmatose", "-b", "127.0.0.1", "-p", &p]))
    } else {
        Proc::start(Command::new(binary("ucmatose")).args(["-b", "127.0.0.1", "-p", &p]))
    };
    wait_listening(&mut srv, port);
    let cli = if rust_server {
        Proc::start(Command::new(binary("ucmatose")).args(["-s", "127.0.0.1", "-p", &p]))
    } else {
        Proc::start(Command::new(softrdma()).args(["cmatose", "-s", "127.0.0.1", "-p", &p]))
    }
    .wait(TIMEOUT);
    let srv = srv.wait_or(TIMEOUT, &cli.describe());
    (srv, cli)
}

#[test]
fn rust_cmatose_client_against_c_ucmatose_server() {
    let (srv, cli) = cmatose_pair(false);
    ok("softrdma cmatose client", &cli);
    ok("C ucmatose server", &srv);
    assert!(
        passed(&cli) && passed(&srv),
        "{}\n--- server\n{}",
        cli.describe(),
        srv.describe()
    );
    assert!(srv.stdout.contains("data transfers complete"), "{}", srv.describe());
}

#[test]
fn c_ucmatose_client_against_rust_cmatose_server() {
    let (srv, cli) = cmatose_pair(true);
    ok("C ucmatose client", &cli);
    ok("softrdma cmatose server", &srv);
    assert!(
        passed(&cli) && passed(&srv),
        "{}\n--- server\n{}",
        cli.describe(),
        srv.describe()
    );
    assert!(cli.stdout.contains("data transfers complete"), "{}", cli.describe());
}

/// Two hosts joined by a veth pair; deleted on drop.
struct Hosts {
    a: String,
    b: String,
    addr_a: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    fn new(tag: &str) -> Result<Hosts, String> {
        let pid = std::process::id();
        let k = (pid % 200) + 30;
        let (a, b) = (format!("srci{tag}{pid}a"), format!("srci{tag}{pid}b"));
        let h = Hosts {
            a: a.clone(),
            b: b.clone(),
            addr_a: format!("198.19.{k}.1"),
        };
        ip(&["netns", "add", &a])?;
        ip(&["netns", "add", &b])?;
        let (va, vb) = (format!("c{tag}{pid}a"), format!("c{tag}{pid}b"));
        ip(&[
            "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b,
        ])?;
        for (ns, dev, addr) in [(&a, &va, format!("198.19.{k}.1")), (&b, &vb, format!("198.19.{k}.2"))] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(h)
    }

    fn or_skip(tag: &str) -> Option<Hosts> {
        match Hosts::new(tag) {
            Ok(h) => Some(h),
            // Without root the test is reported as ignored (crates/capi/test_prereqs.rs).
            Err(e) => panic!("cannot create network namespaces: {e}"),
        }
    }

    fn cmd(&self, ns: &str, tool: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(binary(tool)).args(args);
        c
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// Runs the client (in host b) until the server (in host a) is up: retries while REJECTED.
fn across(h: &Hosts, server: Command, client_tool: &str, client_args: &[&str]) -> (Run, Run) {
    let mut server = server;
    let srv = Proc::start(&mut server);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let cli = loop {
        let cli = Proc::start(&mut h.cmd(&h.b, client_tool, client_args)).wait(TIMEOUT);
        if cli.code == Some(0) || std::time::Instant::now() > deadline {
            break cli;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let srv = srv.wait_or(TIMEOUT, &cli.describe());
    (srv, cli)
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn ucmatose_and_rping_between_two_hosts() {
    let Some(h) = Hosts::or_skip("u") else { return };
    let a = h.addr_a.clone();
    let (srv, cli) = across(
        &h,
        h.cmd(&h.a, "ucmatose", &["-b", &a, "-p", "7471", "-C", "50"]),
        "ucmatose",
        &["-s", &a, "-p", "7471", "-C", "50"],
    );
    ok("ucmatose server (host a)", &srv);
    ok("ucmatose client (host b)", &cli);
    let (srv, cli) = across(
        &h,
        h.cmd(&h.a, "rping", &["-s", "-a", &a, "-p", "7174", "-V"]),
        "rping",
        &["-c", "-a", &a, "-p", "7174", "-C", "50", "-V", "-v"],
    );
    ok("rping server (host a)", &srv);
    ok("rping client (host b)", &cli);
    assert_eq!(pings(&cli), 50, "{}", cli.describe());
}
