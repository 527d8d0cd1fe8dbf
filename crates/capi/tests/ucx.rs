//! UCX (Debian's ucx-utils 1.13, unmodified) over softrdma's RoCE devices, started by
//! `softrdma run`, which gives each process the `/dev/infiniband` nodes and sysfs files UCX
//! looks for. `ucx_info -d` lists `rxe_lo` with `rc_verbs` and `ud_verbs`; `ucx_perftest` runs
//! between two processes over each: UCT active messages and puts, UCP tag matching. UCX declines
//! iWARP devices by design. ucx_perftest does not check the data it moves.

mod common;

use common::{dropin_dir, free_port, softrdma, wait_listening, Proc, Run, TIMEOUT};
use std::process::Command;

/// `softrdma run -- <args>` with the drop-in of this test run and `env`.
fn run_cmd(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(softrdma());
    c.arg("run")
        .arg("--")
        .args(args)
        .env("SOFTRDMA_DROPIN_DIR", dropin_dir())
        .envs(env.iter().copied());
    c
}

/// A ucx_perftest server and client (each under `softrdma run`); the client's output.
fn perftest(args: &[&str], env: &[(&str, &str)]) -> Run {
    let port = free_port();
    let p = port.to_string();
    let mut server_args = vec!["ucx_perftest", "-p", &p];
    server_args.extend_from_slice(args);
    let mut server = Proc::start(&mut run_cmd(&server_args, env));
    wait_listening(&mut server, port);
    let mut client_args = vec!["ucx_perftest", "127.0.0.1", "-p", &p];
    client_args.extend_from_slice(args);
    let client = Proc::start(&mut run_cmd(&client_args, env)).wait(TIMEOUT);
    let server = server.wait_or(TIMEOUT, &client.describe());
    assert!(
        client.code == Some(0) && server.code == Some(0) && client.stdout.contains("Final:"),
        "ucx_perftest {args:?} {env:?} failed\n--- client\n{}\n--- server\n{}",
        client.describe(),
        server.describe()
    );
    client
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn ucx_info_lists_rxe_lo_with_rc_and_ud_verbs() {
    let r = Proc::start(&mut run_cmd(&["ucx_info", "-d"], &[])).wait(TIMEOUT);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let out = &r.stdout;
    for tl in ["rc_verbs", "ud_verbs"] {
        let listed = out
            .split("#      Transport: ")
            .any(|s| s.starts_with(tl) && s.contains("Device: rxe_lo:1"));
        assert!(listed, "{tl} on rxe_lo:1 not listed\n{}", r.describe());
    }
    assert!(
        !out.contains("Device: siw_lo:1"),
        "UCX declines iWARP\n{}",
        r.describe()
    );
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn ucx_info_lists_the_devices_for_an_unprivileged_user() {
    // the drop-in and the binary must be readable by nobody: they are under the target
    // directory, which cargo creates world-readable
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(softrdma())
        .args(["run", "--", "ucx_info", "-d"])
        .env("SOFTRDMA_DROPIN_DIR", dropin_dir());
    let r = Proc::start(&mut c).wait(TIMEOUT);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(r.stdout.contains("Device: rxe_lo:1"), "{}", r.describe());
    assert!(!r.stderr.contains("will not list"), "{}", r.describe());
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn uct_rc_verbs_active_messages_and_puts() {
    let d = ["-d", "rxe_lo:1", "-x", "rc_verbs", "-n", "200"];
    for extra in [
        &["-t", "am_lat", "-s", "8"][..],
        &["-t", "am_bw", "-s", "4096", "-D", "bcopy"],
        &["-t", "put_lat", "-s", "8"],
        &["-t", "put_bw", "-s", "4096", "-D", "bcopy"],
        &["-t", "put_bw", "-s", "1048576", "-D", "zcopy"],
    ] {
        perftest(&[&d[..], extra].concat(), &[]);
    }
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn uct_ud_verbs_active_messages() {
    let d = ["-d", "rxe_lo:1", "-x", "ud_verbs", "-n", "200"];
    for extra in [
        &["-t", "am_lat", "-s", "8"][..],
        &["-t", "am_bw", "-s", "4000", "-D", "bcopy"],
    ] {
        perftest(&[&d[..], extra].concat(), &[]);
    }
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs ucx-utils (and the other consumers)")]
fn ucp_tag_matching_over_rc_and_ud() {
    for tls in ["rc_verbs,ud_verbs", "ud_verbs"] {
        let env = [("UCX_TLS", tls), ("UCX_NET_DEVICES", "rxe_lo:1")];
        for extra in [
            &["-t", "tag_lat", "-s", "8", "-n", "200"][..],
            &["-t", "tag_bw", "-s", "4096", "-n", "200"],
            &["-t", "tag_bw", "-s", "1048576", "-n", "20"],
        ] {
            perftest(extra, &env);
        }
    }
}
