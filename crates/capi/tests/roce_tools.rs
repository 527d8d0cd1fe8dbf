//! Debian's verbs-only tools over the drop-in library on the soft-RoCE device `rxe_lo`:
//! ibv_rc_pingpong, ibv_ud_pingpong and perftest without `-R` exchange QPN/PSN/GID over their
//! own TCP socket and connect QPs by hand, so they exercise the RoCE transport without any CM.

mod common;

use common::*;
use std::process::Command;

fn ok(what: &str, r: &Run, peer: &Run) {
    assert_eq!(
        r.code,
        Some(0),
        "{what} failed\n{}\n--- peer\n{}",
        r.describe(),
        peer.describe()
    );
}

/// Runs a server/client pair of `tool` with `args` (plus `-p port`), both on rxe_lo.
fn pair(tool: &str, server_args: &[&str], client_args: &[&str]) -> (Run, Run) {
    let port = free_port().to_string();
    let mut server = Proc::start(Command::new(binary(tool)).args(server_args).args(["-p", &port]));
    wait_listening(&mut server, port.parse().unwrap());
    let client = Proc::start(
        Command::new(binary(tool))
            .args(client_args)
            .args(["-p", &port, "127.0.0.1"]),
    )
    .wait(TIMEOUT);
    let server = server.wait_or(TIMEOUT, &client.describe());
    (server, client)
}

#[test]
fn ibv_rc_pingpong_over_rxe() {
    let args = ["-d", "rxe_lo", "-g", "0", "-n", "200", "-s", "8192"];
    let (server, client) = pair("ibv_rc_pingpong", &args, &args);
    ok("ibv_rc_pingpong server", &server, &client);
    ok("ibv_rc_pingpong client", &client, &server);
    assert!(client.stdout.contains("200 iters"), "{}", client.describe());
}

/// GID 1 of rxe_lo is `::1` (IPv4 GIDs first, then IPv6 ones): RoCE over IPv6.
#[test]
fn ibv_rc_pingpong_over_ipv6_loopback() {
    let args = ["-d", "rxe_lo", "-g", "1", "-n", "200", "-s", "8192"];
    let (server, client) = pair("ibv_rc_pingpong", &args, &args);
    ok("ibv_rc_pingpong server", &server, &client);
    ok("ibv_rc_pingpong client", &client, &server);
    assert!(client.stdout.contains("GID ::1"), "{}", client.describe());
    assert!(client.stdout.contains("200 iters"), "{}", client.describe());
}

#[test]
fn ibv_ud_pingpong_over_ipv6_loopback() {
    let args = ["-d", "rxe_lo", "-g", "1", "-n", "200", "-s", "2048"];
    let (server, client) = pair("ibv_ud_pingpong", &args, &args);
    ok("ibv_ud_pingpong server", &server, &client);
    ok("ibv_ud_pingpong client", &client, &server);
    assert!(client.stdout.contains("GID ::1"), "{}", client.describe());
    assert!(client.stdout.contains("200 iters"), "{}", client.describe());
}

#[test]
fn ibv_rc_pingpong_without_gid_says_what_to_do() {
    // Without -g the tools send an all-zero GID and no GRH: RoCE cannot route that, and
    // the error must say so instead of hanging.
    let args = ["-d", "rxe_lo", "-n", "5"];
    let (server, client) = pair("ibv_rc_pingpong", &args, &args);
    assert_ne!(client.code, Some(0), "{}", client.describe());
    let all = format!("{}{}{}{}", client.stdout, client.stderr, server.stdout, server.stderr);
    assert!(all.contains("Failed to modify QP to RTR"), "{all}");
}

#[test]
fn ibv_ud_pingpong_over_rxe() {
    let args = ["-d", "rxe_lo", "-g", "0", "-n", "200", "-s", "2048"];
    let (server, client) = pair("ibv_ud_pingpong", &args, &args);
    ok("ibv_ud_pingpong server", &server, &client);
    ok("ibv_ud_pingpong client", &client, &server);
    assert!(client.stdout.contains("200 iters"), "{}", client.describe());
}

#[test]
fn perftest_without_rdma_cm_over_rxe() {
    for (tool, extra) in [
        ("ib_send_bw", &["-n", "200"][..]),
        ("ib_write_bw", &["-n", "200"][..]),
        ("ib_read_bw", &["-n", "200"][..]),
        ("ib_send_lat", &["-n", "200"][..]),
        ("ib_write_lat", &["-n", "200"][..]),
        ("ib_read_lat", &["-n", "200"][..]),
    ] {
        let mut args = vec!["-d", "rxe_lo", "-s", "65536"];
        args.extend_from_slice(extra);
        let (server, client) = pair(tool, &args, &args);
        ok(&format!("{tool} server"), &server, &client);
        ok(&format!("{tool} client"), &client, &server);
    }
}
