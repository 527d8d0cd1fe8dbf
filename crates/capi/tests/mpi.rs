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
//! A rank killed (SIGKILL) mid-job while the others wait for it: mpirun must end the job
//! within 30 s with an error naming the dead rank, and leave no rank behind.
//!
//! Across hosts: a 4-rank job on three hosts (2 ranks on the first, 1 on each other), network
//! namespaces whose veths (198.18.0.0/15) meet on a bridge, each host with one soft-RoCE
//! device on its veth. mpirun runs in the first; Open MPI's rsh launcher starts the daemons of
//! the others through an agent script (`plm_rsh_agent`) that runs them with `ip netns exec`
//! under `softrdma run`. Every rank's endpoints must be on rc_verbs over its own host's
//! device. The same job with its last rank, alone on the third host, killed (SIGKILL) while
//! the other three wait for it: mpirun must end within 30 s, naming rank 3 on that host, with
//! no rank left running. These need root (namespaces).
//!
//! Needs openmpi-bin and libopenmpi-dev (mpicc); reported as ignored without the consumers.

mod common;
mod multihost;

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

/// The tests of this file run one at a time: each job keeps both cores busy, and the
/// killed-rank test looks for leftover ranks of the shared program.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// `tests/c/mpi_check.c` built with mpicc, once per test binary (the tests run in parallel
/// and must not rewrite a program another one is running).
fn mpi_check() -> PathBuf {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mpi_check-{}", std::process::id()));
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
    })
    .clone()
}

/// The mpirun command line: 2 ranks, UCX for point-to-point and one-sided, no BTL but
/// `self`, UCX restricted to the verbs transports (and `self`) on `rxe_lo`.
fn mpirun_args(exe: &Path) -> Vec<String> {
    mpirun_args_with(exe, &["-np", "2", "-x", "UCX_NET_DEVICES=rxe_lo:1"])
}

/// [`mpirun_args`] with `extra` instead of the rank count and device.
fn mpirun_args_with(exe: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "timeout",
        "-k",
        "5",
        MPIRUN_TIMEOUT_S,
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
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
        "UCX_LOG_LEVEL=info",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.push(exe.display().to_string());
    v
}

/// Checks a finished job: exit 0, every check of mpi_check passed, and `ranks` ranks each
/// with endpoints for tag matching and RMA on rc_verbs over the device `dev_of(pid)` names
/// and on nothing but rc_verbs, ud_verbs and self.
fn check_job(r: &Run, ranks: usize, devs: &[String]) {
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
    let all = format!("{}{}", r.stdout, r.stderr);
    let cfgs = ep_cfgs(&all);
    assert_eq!(
        cfgs.len(),
        ranks,
        "expected the ep_cfg lines of {ranks} ranks\n{}",
        r.describe()
    );
    for (pid, lines) in &cfgs {
        let dev = devs
            .iter()
            .find(|d| lines.iter().any(|l| l.contains(&format!("rc_verbs/{d}:1"))))
            .unwrap_or_else(|| {
                panic!(
                    "rank {pid}: no rc_verbs endpoint on {devs:?}: {lines:?}\n{}",
                    r.describe()
                )
            });
        for want in [format!("tag(rc_verbs/{dev}:1)"), format!("rma(rc_verbs/{dev}:1)")] {
            assert!(
                lines.iter().any(|l| l.contains(&want)),
                "rank {pid}: no endpoint with {want}: {lines:?}\n{}",
                r.describe()
            );
        }
        for l in lines {
            let rest = l
                .replace(&format!("rc_verbs/{dev}:1"), "")
                .replace(&format!("ud_verbs/{dev}:1"), "")
                .replace("self/memory0", "");
            assert!(
                !rest.contains('/'),
                "rank {pid}: an endpoint over another transport or device: {l}\n{}",
                r.describe()
            );
        }
    }
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
    let _serial = one_at_a_time();
    let exe = mpi_check();
    let args = mpirun_args(&exe);
    let r = job(Command::new(softrdma())
        .arg("run")
        .arg("--")
        .args(&args)
        .env("SOFTRDMA_DROPIN_DIR", dropin_dir()));
    check_job(&r, 2, &["rxe_lo".to_string()]);
}

#[test]
#[cfg_attr(
    softrdma_no_consumers,
    ignore = "needs openmpi-bin and libopenmpi-dev (and the other consumers)"
)]
fn the_same_job_without_softrdma_fails() {
    let _serial = one_at_a_time();
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

/// The agent Open MPI's rsh launcher runs as `AGENT HOST CMD...`: CMD (the daemon) in the
/// namespace of HOST, with that host's device list, under `softrdma run`, bounded.
fn agent(hosts: &[(String, String, PathBuf)]) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mpi-agent-{}.sh", std::process::id()));
    let mut cases = String::new();
    for (addr, ns, cfg) in hosts {
        cases.push_str(&format!("{addr}) ns={ns}; cfg={};;\n", cfg.display()));
    }
    let text = format!(
        "#!/bin/sh\n\
         host=$1; shift\n\
         case \"$host\" in\n\
         {cases}\
         *) echo \"mpi agent: unknown host $host\" >&2; exit 1;;\n\
         esac\n\
         export SOFTRDMA_CONFIG=\"$cfg\"\n\
         exec ip netns exec \"$ns\" {softrdma} run -- timeout -k 5 {t} sh -c \"$*\"\n",
        softrdma = softrdma().display(),
        t = MPIRUN_TIMEOUT_S,
    );
    std::fs::write(&path, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Three hosts on one Ethernet: namespaces `h1`..`h3`, each with a veth (198.19.K.1..3/24)
/// whose peer is a port of a bridge in a fourth namespace. Everything is deleted on drop.
struct ThreeHosts {
    ns: Vec<String>,
    bridge_ns: String,
    veths: Vec<String>,
    addrs: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
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

impl ThreeHosts {
    fn new() -> Result<ThreeHosts, String> {
        let pid = std::process::id();
        let k = pid % 250 + 1;
        let mut t = ThreeHosts {
            ns: Vec::new(),
            bridge_ns: format!("srmpi{pid}br"),
            veths: Vec::new(),
            addrs: Vec::new(),
        };
        ip(&["netns", "add", &t.bridge_ns])?;
        ip(&["-n", &t.bridge_ns, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &t.bridge_ns, "link", "set", "br0", "up"])?;
        for i in 1..=3 {
            let (ns, veth, port) = (
                format!("srmpi{pid}h{i}"),
                format!("mp{pid}h{i}"),
                format!("mp{pid}p{i}"),
            );
            ip(&["netns", "add", &ns])?;
            t.ns.push(ns.clone());
            ip(&[
                "link",
                "add",
                &veth,
                "netns",
                &ns,
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "netns",
                &t.bridge_ns,
            ])?;
            ip(&["-n", &t.bridge_ns, "link", "set", &port, "master", "br0", "up"])?;
            let addr = format!("198.19.{k}.{i}");
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &veth])?;
            ip(&["-n", &ns, "link", "set", &veth, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            t.veths.push(veth);
            t.addrs.push(addr);
        }
        // a port is ACTIVE once its interface is running (the kernel takes up to a second)
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        for (ns, veth) in t.ns.iter().zip(&t.veths) {
            loop {
                let out = Command::new("ip")
                    .args(["-n", ns, "-o", "link", "show", "dev", veth])
                    .output()
                    .map_err(|e| e.to_string())?;
                let text = String::from_utf8_lossy(&out.stdout);
                if text.contains("LOWER_UP") && text.contains("state UP") {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    return Err(format!("{veth} in {ns} is not up after 10 s: {text}"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(t)
    }
}

impl Drop for ThreeHosts {
    fn drop(&mut self) {
        for ns in self.ns.iter().chain([&self.bridge_ns]) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// A `SOFTRDMA_CONFIG` with one soft-RoCE device on `netdev`.
fn roce_config(netdev: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mpi");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("rxe-{netdev}.toml"));
    std::fs::write(
        &path,
        format!("[[device]]\nname = \"rxe_{netdev}\"\ntransport = \"roce\"\nnetdev = \"{netdev}\"\n"),
    )
    .unwrap();
    path
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(
    softrdma_no_consumers,
    ignore = "needs openmpi-bin and libopenmpi-dev (and the other consumers)"
)]
fn mpi_job_of_four_ranks_across_three_hosts() {
    let _serial = one_at_a_time();
    let Some((r, devs, _, _)) = three_host_job(None) else {
        return;
    };
    check_job(&r, 4, &devs);
    // 2 ranks on the first host, 1 on each of the others
    let all = format!("{}{}", r.stdout, r.stderr);
    for (dev, want) in devs.iter().zip([2, 1, 1]) {
        let on_dev = ep_cfgs(&all)
            .values()
            .filter(|lines| lines.iter().any(|l| l.contains(&format!("tag(rc_verbs/{dev}:1)"))))
            .count();
        assert_eq!(on_dev, want, "ranks on {dev}: {on_dev}\n{}", r.describe());
    }
}

/// The 4-rank job of mpi_check (with `arg`) across [`ThreeHosts`], 2 + 1 + 1 ranks: what it
/// printed, the hosts' device names and addresses and how long it took; `None` if namespaces cannot be
/// created (the test is skipped). The hosts are gone when it returns.
fn three_host_job(arg: Option<&str>) -> Option<(Run, Vec<String>, Vec<String>, Duration)> {
    let t = match ThreeHosts::new() {
        Ok(t) => t,
        Err(e) => {
            multihost::skip(&format!("cannot create network namespaces ({e}); run as root"));
            return None;
        }
    };
    let exe = mpi_check();
    let hosts: Vec<(String, String, PathBuf)> = (0..3)
        .map(|i| (t.addrs[i].clone(), t.ns[i].clone(), roce_config(&t.veths[i])))
        .collect();
    let agent = agent(&hosts);
    let host_list = format!("{}:2,{}:1,{}:1", t.addrs[0], t.addrs[1], t.addrs[2]);
    let subnet = format!("{}/24", t.addrs[0]);
    let agent_s = agent.display().to_string();
    let mut args = mpirun_args_with(
        &exe,
        &[
            "-np",
            "4",
            "--host",
            &host_list,
            "--mca",
            "plm_rsh_agent",
            &agent_s,
            "--mca",
            "oob_tcp_if_include",
            &subnet,
            // Open MPI's rtc/hwloc maps the topology into a shared segment at an address it
            // picks from a hole in each daemon's address space; a remote orted died there once
            // in CI (SIGSEGV in hwloc_shmem_topology_write, before any rank or RDMA). The ranks
            // are not bound, so the daemons do without it.
            "--mca",
            "rtc",
            "^hwloc",
        ],
    );
    args.extend(arg.map(str::to_string));
    let mut run_args = vec!["run".to_string(), "--".to_string()];
    run_args.extend(args);
    let started = std::time::Instant::now();
    let r = job(Command::new("ip")
        .args(["netns", "exec", &t.ns[0]])
        .arg(softrdma())
        .args(&run_args)
        .env("SOFTRDMA_DROPIN_DIR", dropin_dir())
        .env("SOFTRDMA_CONFIG", &hosts[0].2));
    let took = started.elapsed();
    let _ = std::fs::remove_file(&agent);
    let devs: Vec<String> = t.veths.iter().map(|v| format!("rxe_{v}")).collect();
    Some((r, devs, t.addrs.clone(), took))
}

/// Asserts that a job whose last rank was killed (mpi_check "kill-rank-1") ended in bounded
/// time with an error naming the killed rank, and that no rank of `exe` is left running.
fn check_killed_job(r: &Run, took: Duration, exe: &Path) {
    assert!(
        r.stdout.contains("ping-pong of 1048576 bytes") && r.stdout.contains("the last rank dies now"),
        "the job did not get to the kill\n{}",
        r.describe()
    );
    assert_ne!(r.code, Some(0), "{}", r.describe());
    assert_ne!(r.code, Some(124), "mpirun hung until its timeout\n{}", r.describe());
    assert!(
        took < Duration::from_secs(30),
        "the job took {took:?} to end\n{}",
        r.describe()
    );
    let all = format!("{}{}", r.stdout, r.stderr);
    assert!(
        all.contains("exited on signal 9"),
        "mpirun did not report the killed rank\n{}",
        r.describe()
    );
    assert!(!all.contains("received from a dead rank"), "{}", r.describe());
    // no rank left running (the namespaces share this process's pid namespace)
    let exe_s = exe.display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path().join("exe")).ok())
        .map(|p| p.display().to_string())
        .filter(|p| *p == exe_s)
        .collect();
    assert!(left.is_empty(), "ranks still running: {left:?}");
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
#[cfg_attr(
    softrdma_no_consumers,
    ignore = "needs openmpi-bin and libopenmpi-dev (and the other consumers)"
)]
fn a_killed_remote_rank_ends_the_job_across_three_hosts_in_bounded_time() {
    let _serial = one_at_a_time();
    // the last rank, rank 3, is the only one on the third host: it kills itself after the
    // ping-pong while ranks 0-2 (on the first and second hosts) wait in MPI_Recv for it
    let Some((r, _, addrs, took)) = three_host_job(Some("kill-rank-1")) else {
        return;
    };
    eprintln!("the job ended {took:?} after it started (code {:?})", r.code);
    check_killed_job(&r, took, &mpi_check());
    assert!(
        r.stdout
            .lines()
            .filter(|l| l.contains("the last rank dies now"))
            .count()
            == 4,
        "not every rank got to the kill\n{}",
        r.describe()
    );
    let dead = "process rank 3 with PID";
    let node = format!("on node {} exited on signal 9", addrs[2]);
    assert!(
        r.stderr.contains(dead) && r.stderr.contains(&node),
        "mpirun did not name rank 3 on the third host\n{}",
        r.describe()
    );
}

#[test]
#[cfg_attr(
    softrdma_no_consumers,
    ignore = "needs openmpi-bin and libopenmpi-dev (and the other consumers)"
)]
fn a_killed_rank_ends_the_job_in_bounded_time() {
    let _serial = one_at_a_time();
    let exe = mpi_check();
    let mut args = mpirun_args(&exe);
    args.push("kill-rank-1".into());
    let started = std::time::Instant::now();
    let r = job(Command::new(softrdma())
        .arg("run")
        .arg("--")
        .args(&args)
        .env("SOFTRDMA_DROPIN_DIR", dropin_dir()));
    let took = started.elapsed();
    check_killed_job(&r, took, &exe);
}
