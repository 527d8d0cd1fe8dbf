//! Verbs-only programs on an iWARP device fail fast, as they do on Linux siw, and say what to
//! do. ibv_rc_pingpong and perftest without `-R` exchange QPNs over their own socket and move
//! their QPs to RTS by hand; an iWARP QP gets to RTS only through its rdma_cm connection, so
//! that `ibv_modify_qp` is EINVAL (siw's answer) with a one-line hint, instead of a QP in RTS
//! whose sends never leave. With no `-d` the tools take the first device, `siw_lo`.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

const HINT: &str = "siw_lo is iWARP, and an iWARP QP reaches RTS only through its rdma_cm connection";

/// A server/client pair of `tool` with `args` (plus `-p port`), with `env` for both.
fn pair(tool: &str, args: &[&str], env: &[(&str, &str)]) -> (Run, Run) {
    let port = free_port().to_string();
    let mut server = Proc::start(
        Command::new(binary(tool))
            .args(args)
            .args(["-p", &port])
            .envs(env.iter().copied()),
    );
    wait_listening(&mut server, port.parse().unwrap());
    let client = Proc::start(
        Command::new(binary(tool))
            .args(args)
            .args(["-p", &port, "127.0.0.1"])
            .envs(env.iter().copied()),
    )
    .wait(TIMEOUT);
    let server = server.wait_or(TIMEOUT, &client.describe());
    (server, client)
}

fn fails_fast_with_the_hint(tool: &str, args: &[&str]) {
    let (server, client) = pair(tool, args, &[]);
    let both = format!("{}\n--- client\n{}", server.describe(), client.describe());
    assert_ne!(server.code, Some(0), "{both}");
    assert_ne!(client.code, Some(0), "{both}");
    assert!(
        client.elapsed < Duration::from_secs(2),
        "the client took {:?}\n{both}",
        client.elapsed
    );
    let stderr = format!("{}{}", server.stderr, client.stderr);
    assert!(stderr.contains(HINT), "no hint on stderr\n{both}");
    assert!(stderr.contains("use an rxe_* device"), "{both}");
    assert_eq!(
        stderr.lines().filter(|l| l.contains(HINT)).count(),
        stderr.lines().filter(|l| l.contains("softrdma:")).count(),
        "one line per failed call, nothing else from softrdma\n{both}"
    );
    let out = format!("{}{}{}", server.stdout, server.stderr, client.stdout + &client.stderr);
    assert!(out.contains("Failed to modify QP to RTS"), "{both}");
}

#[test]
fn ibv_rc_pingpong_without_flags_fails_fast_on_siw() {
    fails_fast_with_the_hint("ibv_rc_pingpong", &["-n", "5"]);
}

#[test]
fn ibv_rc_pingpong_with_gid_0_fails_fast_on_siw() {
    fails_fast_with_the_hint("ibv_rc_pingpong", &["-g", "0", "-n", "5"]);
}

#[test]
fn ib_write_bw_without_a_device_fails_fast_on_siw() {
    fails_fast_with_the_hint("ib_write_bw", &["-n", "5"]);
}

#[test]
fn softrdma_quiet_silences_the_hint() {
    let (server, client) = pair("ibv_rc_pingpong", &["-n", "5"], &[("SOFTRDMA_QUIET", "1")]);
    let both = format!("{}\n--- client\n{}", server.describe(), client.describe());
    assert_ne!(server.code, Some(0), "{both}");
    assert!(
        !format!("{}{}", server.stderr, client.stderr).contains("softrdma:"),
        "{both}"
    );
    assert!(server.stderr.contains("Failed to modify QP to RTS"), "{both}");
}
