//! The root `Dockerfile`, built and run where there is no docker daemon (issue #15): every
//! stage is a clean Debian 12 root (debootstrap minbase, cached under /var/cache/softrdma/),
//! its instructions run as written in their own mount and PID namespaces, then the image's
//! `CMD` and every `docker run --rm softrdma ...` line of the README run in the final root as
//! its unprivileged `USER`, with only `lo` in their network namespace: Debian's unmodified
//! `ibv_devinfo`, `ibv_devices`, `rping` and `ucmatose` over softrdma.
//!
//! `scripts/dockerfile-chroot.sh` does the work and lists what it substitutes (the host's Rust
//! toolchain and crate cache, read-only, instead of rustup and crates.io, which are unreachable
//! here); this test bounds it and checks its report.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// debootstrap (first run only), two apt-get installs and a release build (from scratch on the
/// first run; later runs reuse the cached target directory): well inside this.
const BOUND: Duration = Duration::from_secs(25 * 60);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root: debootstrap, chroot, mount and network namespaces (CI runs it)"
)]
#[cfg_attr(
    softrdma_no_debootstrap,
    ignore = "needs debootstrap (apt-get install debootstrap) to build a clean Debian 12 root"
)]
fn dockerfile_builds_and_runs_in_a_clean_debian12_root() {
    let started = Instant::now();
    // Its own process group: a timeout kills the script and everything it started.
    let mut child = Command::new(root().join("scripts/dockerfile-chroot.sh"))
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run scripts/dockerfile-chroot.sh");
    let (tx, rx) = mpsc::channel::<String>();
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let tx2 = tx.clone();
    let readers = [
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        }),
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(l);
            }
        }),
    ];
    let mut lines = Vec::new();
    let status = loop {
        while let Ok(l) = rx.try_recv() {
            lines.push(l);
        }
        if let Some(s) = child.try_wait().expect("try_wait") {
            break Some(s);
        }
        if started.elapsed() > BOUND {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for r in readers {
        let _ = r.join();
    }
    lines.extend(rx.try_iter());
    // After a kill, the script could not remove its work directory: do it here (its mounts
    // lived in namespaces that ended with its processes).
    if let Some(work) = lines.iter().find_map(|l| l.strip_prefix("==> work directory: ")) {
        let work = Path::new(work.trim());
        if work.starts_with(std::env::temp_dir()) && work.exists() {
            let _ = std::fs::remove_dir_all(work);
        }
    }
    let log = lines.join("\n");
    let status =
        status.unwrap_or_else(|| panic!("scripts/dockerfile-chroot.sh did not finish within {BOUND:?}:\n{log}"));
    assert!(
        status.success(),
        "scripts/dockerfile-chroot.sh failed ({status}):\n{log}"
    );
    let has = |s: &str| lines.iter().any(|l| l.contains(s));
    assert!(
        has("==> dockerfile-chroot: OK"),
        "no OK line from scripts/dockerfile-chroot.sh:\n{log}"
    );
    // What the Dockerfile promises, seen in the output: both stages built, the rdma-core tools
    // listed softrdma's devices, rping and ucmatose finished, as the image's non-root user.
    for want in [
        "RUN cargo xtask install --prefix /usr/local",
        "hca_id:\tsiw_lo",
        "hca_id:\trxe_lo",
        "docker run --rm softrdma softrdma run -- ibv_devices",
        "rping -c -a 127.0.0.1 -C 10 -V",
        "server DISCONNECT EVENT",
        "ucmatose -s 127.0.0.1",
        "return status 0",
        "README docker run line(s) passed as",
    ] {
        assert!(has(want), "expected `{want}` in the output:\n{log}");
    }
    eprintln!(
        "Dockerfile built and run in clean Debian 12 roots in {:?}",
        started.elapsed()
    );
}
