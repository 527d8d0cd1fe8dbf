//! Open MPI 4.1.4 (Debian's openmpi-bin, unmodified) with `--mca pml ucx --mca osc ucx`
//! over softrdma's soft-RoCE device `rxe_lo`, started by `softrdma run` (which gives mpirun
//! and its ranks the `/dev/infiniband` nodes and sysfs files UCX looks for).
//!
//! `tests/c/mpi_check.c` (compiled with mpicc) checks every byte it moves: ping-pong from 1 B
//! to 1 MiB, MPI_Allreduce, MPI_Alltoall, an Isend/Irecv/Waitall ring, and one-sided
//! MPI_Put/MPI_Get under fences and under a lock. Nothing else can carry the data: the BTLs
//! are `self` only, `UCX_TLS` allows `rc_verbs`, `ud_verbs` and `self` (no shared memory, no
//! TCP), and UCX's own log must show each rank's endpoint to its peer, for tag matching and
//! for RMA, on `rc_verbs/rxe_lo:1`. The same job without softrdma fails (UCX has no verbs
//! device, so `pml ucx` cannot be selected).
//!
//! Needs openmpi-bin and libopenmpi-dev (mpicc); reported as ignored without the consumers.

mod common;

use common::{dropin_dir, Proc, Run};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Bound on one job (it takes about a second); mpirun itself is stopped by `timeout` a little
/// earlier, so that it takes its ranks down with it.
const JOB_TIMEOUT: Duration = Duration::from_secs(120);
const MPIRUN_TIMEOUT_S: &str = "100";

/// The `softrdma` CLI of this workspace (cargo builds every binary before running tests).
fn softrdma() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("softrdma");
    assert!(p.is_file(), "{} not built (run `cargo build --workspace`)", p.display());
    p
}

/// `tests/c/mpi_check.c` built with mpicc.
fn mpi_check() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mpi_check");
    let r = common::run(
        Command::new("mpicc")
            .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&out)
            .arg(&src),
    );
    assert_eq!(
        r.code,
        Some(0),
        "mpicc failed (libopenmpi-dev installed?)\n{}",
        r.describe()
    );
    out
}

/// The mpirun command line: 2 ranks, UCX for point-to-point and one-sided, no BTL but
/// `self`, UCX restricted to the verbs transports (and `self`) on `rxe_lo`.
fn mpirun_args(exe: &Path) -> Vec<String> {
    let mut v: Vec<String> = [
        "timeout",
        "-k",
        "5",
        MPIRUN_TIMEOUT_S,
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "2",
        "--mca",
        "pml",
        "ucx",
        "--mca",
        "osc",
        "ucx",
        "--mca",
        "btl",
        "self",
        "-x",
        "UCX_TLS=rc_verbs,ud_verbs,self",
        "-x",
        "UCX_NET_DEVICES=rxe_lo:1",
        "-x",
        "UCX_LOG_LEVEL=info",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push(exe.display().to_string());
    v
}

/// The UCX `ep_cfg` lines of each rank (by pid), from UCX's info log.
fn ep_cfgs(out: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut m: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for l in out.lines().filter(|l| l.contains("ep_cfg[")) {
        // "[time] [host:pid :thread]  ucp_worker.c:N UCX  INFO    ep_cfg[1]: tag(rc_verbs/rxe_lo:1)"
        let pid = l
            .split(']')
            .nth(1)
            .and_then(|s| s.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cfg = l.split("ep_cfg[").nth(1).unwrap_or_default().to_string();
        m.entry(pid).or_default().push(cfg);
    }
    m
}

fn job(cmd: &mut Command) -> Run {
    Proc::start(cmd.env_remove("OMPI_MCA_pml").env_remove("UCX_TLS")).wait(JOB_TIMEOUT)
}

#[test]
#[cfg_attr(
    softrdma_no_consumers,
    ignore = "needs openmpi-bin and libopenmpi-dev (and the other consumers)"
)]
fn mpi_job_over_pml_ucx_on_rxe_lo_checks_its_data() {
    let exe = mpi_check();
    let args = mpirun_args(&exe);
    let r = job(Command::new(softrdma())
        .arg("run")
        .arg("--")
        .args(&args)
        .env("SOFTRDMA_DROPIN_DIR", dropin_dir()));
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(r.stdout.contains("PASSED: 0 failure(s)"), "{}", r.describe());
    for check in [
        "ping-pong of 1 bytes",
        "ping-pong of 1048576 bytes",
        "MPI_Allreduce",
        "MPI_Alltoall",
        "Isend/Irecv ring",
        "MPI_Put of 1048576 bytes",
        "MPI_Get of 1048576 bytes",
        "under MPI_Win_lock",
    ] {
        assert!(
            r.stdout.lines().any(|l| l.starts_with("ok   ") && l.contains(check)),
            "no passing check {check:?}\n{}",
            r.describe()
        );
    }
    // Each rank's endpoint to the other rank: tag matching (pml ucx) and RMA (osc ucx) over
    // rc_verbs on rxe_lo, and no endpoint of either over anything but rc_verbs and self.
    let all = format!("{}{}", r.stdout, r.stderr);
    let cfgs = ep_cfgs(&all);
    assert_eq!(cfgs.len(), 2, "expected the ep_cfg lines of 2 ranks\n{}", r.describe());
    for (pid, lines) in &cfgs {
        for want in ["tag(rc_verbs/rxe_lo:1)", "rma(rc_verbs/rxe_lo:1)"] {
            assert!(
                lines.iter().any(|l| l.contains(want)),
                "rank {pid}: no endpoint with {want}: {lines:?}\n{}",
                r.describe()
            );
        }
        for l in lines {
            let rest = l
                .replace("rc_verbs/rxe_lo:1", "")
                .replace("ud_verbs/rxe_lo:1", "")
                .replace("self/memory0", "");
            assert!(
                !rest.contains('/'),
                "rank {pid}: an endpoint over another transport: {l}\n{}",
                r.describe()
            );
        }
    }
}

#[test]
#[cfg_attr(
    softrdma_no_consumers,
    ignore = "needs openmpi-bin and libopenmpi-dev (and the other consumers)"
)]
fn the_same_job_without_softrdma_fails() {
    // Proves the job above needs softrdma's device: with the system's libraries (no RDMA
    // device on this host) UCX has neither transport, and pml ucx cannot be selected.
    if Path::new("/sys/class/infiniband")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        panic!("this host has kernel RDMA devices: the job could run without softrdma");
    }
    let exe = mpi_check();
    let args = mpirun_args(&exe);
    // Bounded by the `timeout` in front of mpirun; without the drop-in in LD_LIBRARY_PATH.
    let r = Command::new(&args[0])
        .args(&args[1..])
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("OMPI_MCA_pml")
        .env_remove("UCX_TLS")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run mpirun");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(!r.status.success(), "the job ran without softrdma:\n{out}");
    assert!(out.contains("PML ucx cannot be selected"), "{out}");
    assert!(!out.contains("PASSED"), "{out}");
}
