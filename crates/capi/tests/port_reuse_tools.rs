//! Issue #13 with the Debian tools over the drop-in library, on the default device list (no
//! `SOFTRDMA_CONFIG`, no `SOFTRDMA_TRANSPORTS`: siw_lo, rxe_lo and the host's others): a
//! listener's port is usable again at once after a connection closed from the server side
//! (TCP TIME_WAIT on it), as with the kernel's rdma_cm. `ucmatose -b` runs twice in a row on
//! one port, and perftest `-R`, which listens on its port twice (a first rdma_cm connection
//! exchanges the parameters, then the test's own), runs between two processes, also with
//! `-d rxe_lo`. Every child is bounded by a timeout; servers are waited for on their TCP
//! listener (the iWARP side of a wildcard or 127.0.0.1 listener).

mod common;

use common::{binary, free_port, wait_listening, Proc, Run, TIMEOUT};
use std::process::Command;

fn cmd(name: &str, args: &[&str]) -> Command {
    let mut c = Command::new(binary(name));
    c.args(args)
        .env_remove("SOFTRDMA_CONFIG")
        .env_remove("SOFTRDMA_TRANSPORTS");
    c
}

/// Starts `server`, waits until it listens on TCP `port`, runs `client`, waits for both.
fn pair(mut server: Command, mut client: Command, port: u16) -> (Run, Run) {
    let mut srv = Proc::start(&mut server);
    wait_listening(&mut srv, port);
    let cli = Proc::start(&mut client).wait(TIMEOUT);
    let srv = srv.wait_or(TIMEOUT, &format!("\n=== the client:\n{}", cli.describe()));
    (srv, cli)
}

fn assert_ok(what: &str, r: &Run, peer: &Run) {
    assert_eq!(
        r.code,
        Some(0),
        "{what}: {}\n=== the peer:\n{}",
        r.describe(),
        peer.describe()
    );
}

#[test]
fn ucmatose_twice_in_a_row_on_one_port() {
    let port = free_port();
    let p = port.to_string();
    for run in 1..=2 {
        let (srv, cli) = pair(
            cmd("ucmatose", &["-b", "127.0.0.1", "-p", &p]),
            cmd("ucmatose", &["-s", "127.0.0.1", "-p", &p]),
            port,
        );
        assert_ok(&format!("ucmatose server, run {run}"), &srv, &cli);
        assert_ok(&format!("ucmatose client, run {run}"), &cli, &srv);
        assert!(
            srv.stdout.contains("data transfers complete") && srv.stdout.contains("return status 0"),
            "run {run}: {}",
            srv.describe()
        );
    }
}

fn perftest(tool: &str, extra: &[&str]) {
    let port = free_port();
    let p = port.to_string();
    let mut args = vec!["-R", "-p", &p, "-n", "200", "-s", "65536"];
    args.extend_from_slice(extra);
    let mut client_args = args.clone();
    client_args.push("127.0.0.1");
    let (srv, cli) = pair(cmd(tool, &args), cmd(tool, &client_args), port);
    assert_ok(&format!("{tool} server"), &srv, &cli);
    assert_ok(&format!("{tool} client"), &cli, &srv);
    for r in [&srv, &cli] {
        assert!(r.stdout.contains("Data ex. method : rdma_cm"), "{}", r.describe());
        assert!(
            r.stdout.lines().any(|l| l.split_whitespace().nth(1) == Some("200")),
            "{tool}: no result line:\n{}",
            r.describe()
        );
    }
}

#[test]
fn ib_send_bw_rdma_cm_on_the_default_devices() {
    perftest("ib_send_bw", &[]);
}

#[test]
fn ib_write_bw_rdma_cm_on_the_default_devices() {
    perftest("ib_write_bw", &[]);
}

/// The README's line without `SOFTRDMA_TRANSPORTS=roce`: the rdma_cm picks the first
/// loopback-capable device for 127.0.0.1 (siw_lo on the default list), whatever `-d` says.
#[test]
fn ib_send_bw_rdma_cm_with_d_rxe_lo_on_the_default_devices() {
    perftest("ib_send_bw", &["-d", "rxe_lo"]);
}

#[test]
fn ib_write_bw_rdma_cm_with_d_rxe_lo_on_the_default_devices() {
    perftest("ib_write_bw", &["-d", "rxe_lo"]);
}
