//! softrdma build tasks, run as `cargo xtask <task>`.
//!
//! `dropin [--debug] [--out DIR]`: builds the drop-in C library (`softrdma-capi`, release
//! unless `--debug`) and fills a directory (default `target/dropin`, or `target/dropin-debug`)
//! with `libsoftrdma.so` and the symlinks `libibverbs.so.1`, `librdmacm.so.1`, `libmlx5.so.1`
//! and `libefa.so.1` pointing at it. The last line of stdout is the directory's absolute path:
//!
//! ```sh
//! LD_LIBRARY_PATH=$(cargo xtask dropin | tail -1) ibv_devinfo -v
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The names rdma-core binaries load (DT_NEEDED), all served by the one object. Symlinks, not
/// copies: two copies would be loaded as two libraries with separate global state.
const LINKS: [&str; 4] = ["libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"];
/// The cdylib file name (`[lib] name = "softrdma"`).
const LIB: &str = "libsoftrdma.so";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("dropin") => dropin(&args[1..]),
        Some("-h" | "--help") | None => {
            println!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(format!("unknown task `{other}`\n{}", usage())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> &'static str {
    "usage: cargo xtask dropin [--debug] [--out DIR]\n  \
     builds the drop-in C library and prints the directory to put in LD_LIBRARY_PATH"
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

fn dropin(args: &[String]) -> Result<(), String> {
    let mut release = true;
    let mut out: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--debug" => release = false,
            "--release" => release = true,
            "--out" => out = Some(it.next().ok_or("--out needs a directory")?.into()),
            other => return Err(format!("unknown option `{other}`\n{}", usage())),
        }
    }

    let root = workspace_root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root).args(["build", "-p", "softrdma-capi"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build -p softrdma-capi failed ({status})"));
    }

    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let target = if target.is_absolute() {
        target
    } else {
        root.join(target)
    };
    let built = target.join(if release { "release" } else { "debug" }).join(LIB);
    if !built.is_file() {
        return Err(format!("{} was not produced by the build", built.display()));
    }
    let dir = out.unwrap_or_else(|| target.join(if release { "dropin" } else { "dropin-debug" }));
    populate(&built, &dir)?;
    let dir = dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?;
    println!("{}", dir.display());
    Ok(())
}

/// Copies `lib` into `dir` as `libsoftrdma.so` (write to a temporary name, then rename, so a
/// process that has the old file mapped keeps a consistent copy) and (re)creates the symlinks.
fn populate(lib: &Path, dir: &Path) -> Result<(), String> {
    let err = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    std::fs::create_dir_all(dir).map_err(|e| err("cannot create", dir, e))?;
    let tmp = dir.join(format!(".{LIB}.tmp"));
    std::fs::copy(lib, &tmp).map_err(|e| err("cannot copy to", &tmp, e))?;
    let dst = dir.join(LIB);
    std::fs::rename(&tmp, &dst).map_err(|e| err("cannot rename to", &dst, e))?;
    for name in LINKS {
        let link = dir.join(name);
        match std::fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("cannot remove", &link, e)),
        }
        std::os::unix::fs::symlink(LIB, &link).map_err(|e| err("cannot create symlink", &link, e))?;
    }
    Ok(())
}
