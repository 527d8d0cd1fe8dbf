//! The unmodified Debian rdmacm-utils binaries (`ucmatose`, `rping`, `rdma_server` /
//! `rdma_client`, `cmtime`) over the drop-in library on loopback: server and client both run
//! with `LD_LIBRARY_PATH` set to the drop-in directory, each bounded by a timeout and killed if
//! the test fails; ports are picked by binding 127.0.0.1:0.
//!
//! Each test uses a `SOFTRDMA_CONFIG` with one loopback-capable device on `lo`, so the result
//! does not depend on the host's interfaces.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{binary, free_port, lo_config, wait_listening, Proc, Run, TIMEOUT};

fn config() -> &'static Path {
    static CONFIG: OnceLock<PathBuf> = OnceLock::new();
    CONFIG.get_or_init(|| lo_config("capi-cm-tools", ""))
}

fn cmd(name: &str, args: &[&str]) -> Command {
    let mut c = Command::new(binary(name));
    c.args(args).env("SOFTRDMA_CONFIG", config());
    c
}

/// Starts `server`, waits until it listens on `port`, runs `client` to completion, then waits
/// for the server (or kills it if `server_exits` is false). Returns (server, client).
fn pair(server: Command, client: Command, port: u16, server_exits: bool) -> (Run, Run) {
    let mut server = server;
    let mut srv = Proc::start(&mut server);
    wait_listening(&mut srv, port);
    let mut client = client;
    let cli = Proc::start(&mut client).wait(TIMEOUT);
    let srv = if server_exits {
        srv.wait_or(TIMEOUT, &format!("\n=== the client:\n{}", cli.describe()))
    } else {
        srv.kill()
    };
    (srv, cli)
}

fn assert_ok(what: &str, r: &Run) {
    assert_eq!(r.code, Some(0), "{what}: {}", r.describe());
}

fn ucmatose(extra: &[&str]) {
    let port = free_port();
    let p = port.to_string();
    let mut s = vec!["-b", "127.0.0.1", "-p", &p];
    let mut c = vec!["-s", "127.0.0.1", "-p", &p];
    s.extend_from_slice(extra);
    c.extend_from_slice(extra);
    let (srv, cli) = pair(cmd("ucmatose", &s), cmd("ucmatose", &c), port, true);
    assert_ok("ucmatose server", &srv);
    assert_ok("ucmatose client", &cli);
    assert!(
        srv.stdout.contains("data transfers complete") && srv.stdout.contains("return status 0"),
        "{}",
        srv.describe()
    );
    assert!(cli.stdout.contains("return status 0"), "{}", cli.describe());
    assert!(
        !srv.stderr.contains("softrdma:") && !cli.stderr.contains("softrdma:"),
        "no library diagnostics expected:\n{}\n{}",
        srv.describe(),
        cli.describe()
    );
}

#[test]
fn ucmatose_one_connection() {
    ucmatose(&[]);
}

#[test]
fn ucmatose_twenty_connections_of_200_messages_of_1k() {
    ucmatose(&["-c", "20", "-C", "200", "-S", "1024"]);
}

#[test]
fn rping_100_verified_pings() {
    let port = free_port();
    let p = port.to_string();
    let (srv, cli) = pair(
        cmd("rping", &["-s", "-a", "127.0.0.1", "-p", &p, "-C", "100", "-V", "-v"]),
        cmd("rping", &["-c", "-a", "127.0.0.1", "-p", &p, "-C", "100", "-V", "-v"]),
        port,
        true,
    );
    assert_ok("rping server", &srv);
    assert_ok("rping client", &cli);
    let pings: Vec<&str> = cli.stdout.lines().filter(|l| l.starts_with("ping data: ")).collect();
    assert_eq!(pings.len(), 100, "{}", cli.describe());
    for (i, line) in pings.iter().enumerate() {
        assert!(line.starts_with(&format!("ping data: rdma-ping-{i}: ")), "{line}");
    }
    assert!(
        srv.stdout.contains("server ping data: rdma-ping-99: "),
        "{}",
        srv.describe()
    );
}

#[test]
fn rdma_server_and_rdma_client() {
    let port = free_port();
    let p = port.to_string();
    let (srv, cli) = pair(
        cmd("rdma_server", &["-p", &p]),
        cmd("rdma_client", &["-s", "127.0.0.1", "-p", &p]),
        port,
        true,
    );
    assert_ok("rdma_server", &srv);
    assert_ok("rdma_client", &cli);
    assert!(srv.stdout.contains("rdma_server: end 0"), "{}", srv.describe());
    assert!(cli.stdout.contains("rdma_client: end 0"), "{}", cli.describe());
}

#[test]
fn cmtime_100_connections() {
    let port = free_port();
    let p = port.to_string();
    // The cmtime server serves until killed.
    let (srv, cli) = pair(
        cmd("cmtime", &["-b", "127.0.0.1", "-p", &p]),
        cmd("cmtime", &["-s", "127.0.0.1", "-p", &p, "-c", "100"]),
        port,
        false,
    );
    assert_ok("cmtime client", &cli);
    for step in [
        "create id",
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ] {
        assert!(
            cli.stdout.lines().any(|l| l.starts_with(step) && l.contains(':')),
            "{step} missing:\n{}",
            cli.describe()
        );
    }
    assert!(
        !cli.stdout.contains("error") && !cli.stdout.contains("failing"),
        "{}",
        cli.describe()
    );
    assert!(!srv.stdout.contains("failing connection request"), "{}", srv.describe());
}

#[test]
fn loopback_disabled_fails_fast() {
    let cfg = lo_config("capi-cm-tools-noloop", "loopback = false\n");
    let port = free_port().to_string();
    let cases = [
        (
            ["-b", "127.0.0.1", "-p", &port],
            "bind address failed: Cannot assign requested address",
        ),
        (["-s", "127.0.0.1", "-p", &port], "failure getting addr: No such device"),
    ];
    for (args, message) in cases {
        let mut c = Command::new(binary("ucmatose"));
        c.args(args).env("SOFTRDMA_CONFIG", &cfg);
        let r = Proc::start(&mut c).wait(Duration::from_secs(5));
        assert!(r.code.is_some_and(|c| c != 0), "{args:?}: {}", r.describe());
        assert!(r.elapsed < Duration::from_secs(1), "{args:?}: {}", r.describe());
        assert!(r.stderr.contains(message), "{args:?}: {}", r.describe());
    }
}

/// With no RDMA device at all the tools fail as they do over rdma-core on a host without
/// devices (abi.md section 1): librdmacm's initialisation fails with ENODEV.
#[test]
fn no_devices_fail_like_rdma_core() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-cm-tools-empty");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("devices.toml");
    std::fs::write(&cfg, "").unwrap();
    let cases: [(&str, &[&str], i32, &str); 3] = [
        ("ucmatose", &["-s", "127.0.0.1"], 1, "No RDMA devices were detected"),
        ("rping", &["-c", "-a", "127.0.0.1"], 19, "No RDMA devices were detected"),
        ("rdma_client", &["-s", "127.0.0.1"], 255, ""),
    ];
    for (name, args, code, message) in cases {
        let mut c = Command::new(binary(name));
        c.args(args).env("SOFTRDMA_CONFIG", &cfg);
        let r = Proc::start(&mut c).wait(Duration::from_secs(10));
        assert_eq!(r.code, Some(code), "{name}: {}", r.describe());
        assert!(r.stderr.contains(message), "{name}: {}", r.describe());
    }
    let mut c = Command::new(binary("rdma_client"));
    c.args(["-s", "127.0.0.1"]).env("SOFTRDMA_CONFIG", &cfg);
    let r = Proc::start(&mut c).wait(Duration::from_secs(10));
    // rdma_getaddrinfo's -1 reads as EAI_BADFLAGS through gai_strerror, as with rdma-core.
    assert!(
        r.stdout.contains("rdma_getaddrinfo: Bad value for ai_flags"),
        "{}",
        r.describe()
    );
}

/// `rping -q`: the application creates its QPs with `ibv_create_qp`, names them in
/// `conn_param.qp_num`, drives INIT/RTR/RTS itself with `rdma_init_qp_attr`, and the client
/// finishes with CONNECT_RESPONSE + `rdma_establish`.
#[test]
fn rping_with_self_created_qps() {
    let port = free_port();
    let p = port.to_string();
    let (srv, cli) = pair(
        cmd("rping", &["-s", "-q", "-a", "127.0.0.1", "-p", &p, "-V"]),
        cmd(
            "rping",
            &["-c", "-q", "-a", "127.0.0.1", "-p", &p, "-C", "20", "-V", "-v"],
        ),
        port,
        true,
    );
    assert_ok("rping -q server", &srv);
    assert_ok("rping -q client", &cli);
    assert_eq!(
        cli.stdout.lines().filter(|l| l.starts_with("ping data: ")).count(),
        20,
        "{}",
        cli.describe()
    );
}
