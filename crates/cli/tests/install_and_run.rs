//! Use outside the repository: `cargo xtask install --prefix DIR` lays out `DIR/bin/softrdma`
//! and `DIR/lib/softrdma/`; that binary's `env` prints the `export` line and its `run` starts
//! Debian's unmodified `ibv_devices` over the drop-in. A binary with no drop-in beside it says
//! where it looked and how to get one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    dir
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `cargo xtask install --debug --prefix <prefix>` (debug: the build the tests already made).
fn install(prefix: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    if std::env::var("RUSTFLAGS").is_ok_and(|f| f.contains("sanitizer")) {
        // scripts/asan.sh runs the tests with its instrumented build's settings; what a user
        // installs is the plain build
        for v in [
            "RUSTFLAGS",
            "RUSTDOCFLAGS",
            "RUSTC_BOOTSTRAP",
            "CARGO_TARGET_DIR",
            "CARGO_ENCODED_RUSTFLAGS",
        ] {
            cargo.env_remove(v);
        }
    }
    let out = cargo
        .current_dir(&root)
        .args(["xtask", "install", "--debug", "--prefix"])
        .arg(prefix)
        .output()
        .expect("run cargo xtask install");
    assert!(out.status.success(), "cargo xtask install failed\n{}", text(&out));
}

#[test]
fn installed_softrdma_runs_unmodified_programs() {
    let prefix = tmp("install");
    install(&prefix);
    let bin = prefix.join("bin/softrdma");
    let lib = prefix
        .join("lib/softrdma")
        .canonicalize()
        .expect("the installed lib/softrdma");

    let env = Command::new(&bin)
        .arg("env")
        .env_remove("SOFTRDMA_DROPIN_DIR")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&env.stdout).into_owned();
    assert!(env.status.success(), "{}", text(&env));
    let want = format!(
        "export LD_LIBRARY_PATH='{}'\"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\"",
        lib.display()
    );
    assert!(printed.lines().any(|l| l == want), "want {want}\n{}", text(&env));
    // what a user's shell does with it
    let shell = Command::new("sh")
        .arg("-c")
        .arg(format!("eval \"$('{}' env)\" && ibv_devices", bin.display()))
        .env_remove("SOFTRDMA_DROPIN_DIR")
        .output()
        .unwrap();
    assert!(
        shell.status.success() && String::from_utf8_lossy(&shell.stdout).contains("siw_lo"),
        "{}",
        text(&shell)
    );

    let run = Command::new(&bin)
        .args(["run", "--", "ibv_devices"])
        .env_remove("SOFTRDMA_DROPIN_DIR")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && out.contains("siw_lo") && out.contains("rxe_lo"),
        "{}",
        text(&run)
    );

    let missing = Command::new(&bin)
        .args(["run", "--", "no-such-program-here"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(127), "{}", text(&missing));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("cannot run no-such-program-here"),
        "{}",
        text(&missing)
    );
    let _ = std::fs::remove_dir_all(&prefix);
}

#[test]
fn without_a_drop_in_env_says_how_to_get_one() {
    let prefix = tmp("no-dropin");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    let bin = prefix.join("bin/softrdma");
    std::fs::copy(env!("CARGO_BIN_EXE_softrdma"), &bin).unwrap();
    for args in [&["env"][..], &["run", "--", "ibv_devices"][..]] {
        let out = Command::new(&bin)
            .args(args)
            .env_remove("SOFTRDMA_DROPIN_DIR")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            err.contains("no drop-in library found")
                && err.contains("lib/softrdma")
                && err.contains("cargo xtask install"),
            "{}",
            text(&out)
        );
    }
    let bad = Command::new(&bin)
        .arg("env")
        .env("SOFTRDMA_DROPIN_DIR", &prefix)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("SOFTRDMA_DROPIN_DIR="),
        "{}",
        text(&bad)
    );
    let _ = std::fs::remove_dir_all(&prefix);
}
