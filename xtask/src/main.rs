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
//!
//! `install [--prefix DIR] [--debug]`: builds the CLI and the drop-in (release unless
//! `--debug`) and installs `DIR/bin/softrdma` and `DIR/lib/softrdma/` (the library and its
//! symlinks; default `DIR` is `~/.local`). `softrdma env` and `softrdma run` find that directory
//! from the binary's own path:
//!
//! ```sh
//! cargo xtask install && ~/.local/bin/softrdma run -- ibv_devinfo -v
//! ```
//!
//! `abi [--check]`: regenerates the drop-in's ABI tables from the installed rdma-core (see
//! `abi.rs`).
//!
//! `dropin --asan [--release] [--out DIR]`: the same library built with AddressSanitizer (debug
//! unless `--release`) on the stable toolchain: `RUSTC_BOOTSTRAP=1`, `RUSTFLAGS` plus
//! `-Zsanitizer=address -Cforce-frame-pointers=yes`, `--target <host triple>` (so build scripts
//! and proc macros stay uninstrumented) and its own target directory (`target/asan`, or
//! `$CARGO_TARGET_DIR/asan`) so the normal build is not invalidated; default output
//! `target/dropin-asan` (`target/dropin-asan-release`). On Linux rustc does not link the ASan
//! runtime into a cdylib, so the program that loads it must get one first:
//!
//! ```sh
//! LD_PRELOAD=$(gcc -print-file-name=libasan.so) LD_LIBRARY_PATH=$(cargo xtask dropin --asan | tail -1) ibv_devinfo -v
//! ```
//!
//! `scripts/asan.sh tools` does this for the Debian tools.

mod abi;

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
        Some("install") => install(&args[1..]),
        Some("abi") => abi::run(&args[1..]),
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
    "usage: cargo xtask dropin [--debug] [--asan] [--release] [--out DIR]\n  \
     builds the drop-in C library and prints the directory to put in LD_LIBRARY_PATH\n  \
     --asan: AddressSanitizer build (debug unless --release); run programs with\n  \
     LD_PRELOAD=$(gcc -print-file-name=libasan.so)\n\
     usage: cargo xtask install [--prefix DIR] [--debug]\n  \
     installs DIR/bin/softrdma and the drop-in in DIR/lib/softrdma (DIR: ~/.local)\n\
     usage: cargo xtask abi [--check]\n  \
     regenerates crates/capi/abi/exports.txt and crates/capi/src/generated_stubs.rs from the\n  \
     installed rdma-core libraries (--check: fail if they are out of date)"
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (relative to the workspace) or `target`.
fn target_dir(root: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    if target.is_absolute() {
        target
    } else {
        root.join(target)
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

fn dropin(args: &[String]) -> Result<(), String> {
    let mut release: Option<bool> = None;
    let mut asan = false;
    let mut out: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--debug" => release = Some(false),
            "--release" => release = Some(true),
            "--asan" => asan = true,
            "--out" => out = Some(it.next().ok_or("--out needs a directory")?.into()),
            other => return Err(format!("unknown option `{other}`\n{}", usage())),
        }
    }
    // Release by default; an ASan build is debug by default (exact stacks, no inlining).
    let release = release.unwrap_or(!asan);

    let root = workspace_root();
    let target = target_dir(&root);
    let profile = if release { "release" } else { "debug" };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root).arg("build");
    // The ASan build selects `--workspace --lib` (which includes the cdylib) rather than
    // `-p softrdma-capi`: the package selection of `cargo test --workspace`, hence the same
    // dependency features, so it reuses scripts/asan.sh's instrumented test build instead of
    // rebuilding every dependency.
    cmd.args(if asan {
        &["--workspace", "--lib"][..]
    } else {
        &["-p", "softrdma-capi"][..]
    });
    if release {
        cmd.arg("--release");
    }
    let built = if asan {
        let triple = host_triple()?;
        let asan_target = target.join("asan");
        let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
        for f in ASAN_RUSTFLAGS {
            if !flags.split_whitespace().any(|x| x == f) {
                if !flags.is_empty() {
                    flags.push(' ');
                }
                flags.push_str(f);
            }
        }
        cmd.args(["--target", &triple])
            .env("CARGO_TARGET_DIR", &asan_target)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("RUSTFLAGS", &flags)
            .env_remove("CARGO_ENCODED_RUSTFLAGS");
        eprintln!(
            "xtask: RUSTC_BOOTSTRAP=1 RUSTFLAGS=\"{flags}\" CARGO_TARGET_DIR={} cargo build --workspace --lib --target {triple}{}",
            asan_target.display(),
            if release { " --release" } else { "" }
        );
        asan_target.join(&triple).join(profile).join(LIB)
    } else {
        target.join(profile).join(LIB)
    };
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build of softrdma-capi failed ({status})"));
    }
    if !built.is_file() {
        return Err(format!("{} was not produced by the build", built.display()));
    }
    let default_dir = match (asan, release) {
        (false, true) => "dropin",
        (false, false) => "dropin-debug",
        (true, false) => "dropin-asan",
        (true, true) => "dropin-asan-release",
    };
    let dir = out.unwrap_or_else(|| target.join(default_dir));
    populate(&built, &dir)?;
    let dir = dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?;
    if asan {
        eprintln!("xtask: ASan build: preload the runtime, e.g. LD_PRELOAD=$(gcc -print-file-name=libasan.so)");
    }
    println!("{}", dir.display());
    Ok(())
}

/// `install`: the CLI in `PREFIX/bin`, the drop-in in `PREFIX/lib/softrdma`.
fn install(args: &[String]) -> Result<(), String> {
    let mut release = true;
    let mut prefix: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--debug" => release = false,
            "--prefix" => prefix = Some(it.next().ok_or("--prefix needs a directory")?.into()),
            other => return Err(format!("unknown option `{other}`\n{}", usage())),
        }
    }
    let prefix = match prefix {
        Some(p) => p,
        None => PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set: give --prefix DIR")?).join(".local"),
    };
    let root = workspace_root();
    let target = target_dir(&root);
    let profile = if release { "release" } else { "debug" };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "-p", "softrdma-cli", "-p", "softrdma-capi"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo build of softrdma-cli and softrdma-capi failed ({status})"
        ));
    }
    let bin_dir = prefix.join("bin");
    std::fs::create_dir_all(&bin_dir).map_err(|e| format!("cannot create {}: {e}", bin_dir.display()))?;
    let built = target.join(profile).join("softrdma");
    let tmp = bin_dir.join(".softrdma.tmp");
    std::fs::copy(&built, &tmp).map_err(|e| format!("cannot copy {} to {}: {e}", built.display(), tmp.display()))?;
    let bin = bin_dir.join("softrdma");
    std::fs::rename(&tmp, &bin).map_err(|e| format!("cannot rename to {}: {e}", bin.display()))?;
    let lib_dir = prefix.join("lib").join("softrdma");
    populate(&target.join(profile).join(LIB), &lib_dir)?;
    eprintln!("xtask: installed {} and {}/", bin.display(), lib_dir.display());
    eprintln!(
        "xtask: run programs with `{} run -- CMD`, or eval \"$({} env)\"",
        bin.display(),
        bin.display()
    );
    println!("{}", prefix.display());
    Ok(())
}

/// What `--asan` adds to `RUSTFLAGS` (frame pointers: complete, cheap ASan stack traces).
const ASAN_RUSTFLAGS: [&str; 2] = ["-Zsanitizer=address", "-Cforce-frame-pointers=yes"];

/// The host triple (`rustc -vV`): the explicit `--target` of an ASan build.
fn host_triple() -> Result<String, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("cannot run rustc -vV: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_owned())
        .ok_or_else(|| "rustc -vV printed no `host:` line".to_owned())
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
