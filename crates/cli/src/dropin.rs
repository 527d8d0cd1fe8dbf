//! `softrdma env` and `softrdma run`: point unmodified programs at the drop-in
//! `libibverbs.so.1` / `librdmacm.so.1`.
//!
//! The drop-in directory is found, in order, at `$SOFTRDMA_DROPIN_DIR`, `<bin>/../lib/softrdma`
//! (what `cargo xtask install` lays out), and `<bin>/../dropin` or `<bin>/../dropin-debug` (a
//! repository's `target/`, filled by `cargo xtask dropin`). `run` also gives the command the
//! `/dev/infiniband` nodes UCX looks for (`crate::rdma_view`).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Args;

/// The names a drop-in directory must serve.
const NEEDED: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];

/// Why no drop-in directory was found.
#[derive(Debug, thiserror::Error)]
pub enum DropinError {
    #[error("SOFTRDMA_DROPIN_DIR={0} has no libibverbs.so.1 and librdmacm.so.1 (make it with `cargo xtask dropin --out DIR`)")]
    BadOverride(String),
    #[error("no drop-in library found (looked in {0}); install one with `cargo xtask install` (or `cargo xtask dropin` in the repository), or set SOFTRDMA_DROPIN_DIR")]
    NotFound(String),
    #[error("cannot find this program's own path: {0}")]
    NoExe(std::io::Error),
}

/// `softrdma env`: prints the shell lines that make programs load softrdma.
#[derive(Args)]
pub struct EnvArgs {}

/// `softrdma run`: runs a program over softrdma.
#[derive(Args)]
pub struct RunArgs {
    /// Do not provide `/dev/infiniband/softrdma<N>` and `/sys/class/infiniband` (for UCX) in a
    /// private mount namespace.
    #[arg(long)]
    no_dev_nodes: bool,
    /// The program and its arguments (after `--`), e.g. `softrdma run -- ibv_devinfo -v`.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// The drop-in directory (see the module documentation).
pub fn locate() -> Result<PathBuf, DropinError> {
    if let Some(dir) = softrdma_verbs::settings::DROPIN_DIR.os() {
        let dir = PathBuf::from(dir);
        return if serves(&dir) {
            Ok(absolute(&dir))
        } else {
            Err(DropinError::BadOverride(dir.display().to_string()))
        };
    }
    let exe = std::env::current_exe().map_err(DropinError::NoExe)?;
    let bin_dir = exe.parent().unwrap_or(Path::new("/"));
    let up = bin_dir.parent().unwrap_or(bin_dir);
    let candidates = [up.join("lib/softrdma"), up.join("dropin"), up.join("dropin-debug")];
    candidates
        .iter()
        .find(|d| serves(d))
        .map(|d| absolute(d))
        .ok_or_else(|| {
            let list: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
            DropinError::NotFound(list.join(", "))
        })
}

fn serves(dir: &Path) -> bool {
    NEEDED.iter().all(|n| dir.join(n).is_file())
}

fn absolute(dir: &Path) -> PathBuf {
    dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())
}

/// `LD_LIBRARY_PATH` with `dir` first.
fn library_path(dir: &Path) -> OsString {
    let mut v = dir.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// Prints `export LD_LIBRARY_PATH=...` for `eval "$(softrdma env)"`.
pub fn env(_args: &EnvArgs) -> crate::CmdResult {
    let dir = locate()?;
    let quoted = shell_quote(&dir.display().to_string());
    println!("# softrdma drop-in libibverbs.so.1 / librdmacm.so.1: {}", dir.display());
    println!("export LD_LIBRARY_PATH={quoted}\"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\"");
    Ok(())
}

/// Replaces this process with the command, the drop-in first in `LD_LIBRARY_PATH`.
pub fn run(args: &RunArgs) -> ExitCode {
    let dir = match locate() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("softrdma: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !args.no_dev_nodes {
        // UCX lists a verbs device only if its /dev/infiniband node exists (crate::rdma_view)
        match crate::rdma_view::provide(crate::rdma_view::node_count()) {
            Ok(p) => tracing::debug!("softrdma run: device nodes: {p:?}"),
            Err(e) if softrdma_verbs::settings::QUIET.is_on() => {
                tracing::debug!("softrdma run: no device nodes: {e}")
            }
            Err(e) => eprintln!(
                "softrdma run: UCX will not list softrdma devices: no /dev/infiniband nodes or sysfs files: {e}"
            ),
        }
    }
    let (prog, rest) = match args.command.split_first() {
        Some(p) => p,
        None => return ExitCode::FAILURE,
    };
    let err = Command::new(prog)
        .args(rest)
        .env("LD_LIBRARY_PATH", library_path(&dir))
        .exec();
    eprintln!("softrdma: cannot run {}: {err}", Path::new(prog).display());
    // As the shells: 127 when the program is not found, 126 when it cannot be run.
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// `s` in single quotes for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes_and_spaces() {
        assert_eq!(shell_quote("/a b/it's"), r"'/a b/it'\''s'");
    }
}
