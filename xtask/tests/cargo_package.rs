//! The library crates are publishable: `cargo package --workspace` (every member but xtask)
//! packs each crate and builds it from its `.crate` alone, the path dependencies resolved
//! against the crates packed just before (cargo's local registry overlay); each archive carries
//! both license texts and the README, and its manifest the fields crates.io shows.
//!
//! `cargo package` runs in a sandbox of its own ([`PackageSandbox`]): its own CARGO_HOME and
//! its own target directory.
//! - CARGO_HOME: cargo extracts each crate of the overlay registry once, under
//!   `$CARGO_HOME/registry/src/-<hash of the registry's path>/`, and reuses the extraction
//!   whenever a crate of the same name and version comes again. A clone at the same path (CI's)
//!   would then build today's crates against the sources of an earlier run.
//! - Target directory: with another CARGO_HOME the dependencies' sources have other paths, so
//!   the verification rebuilds them under the same file names; in the workspace's target
//!   directory that replaced the rlibs the workspace's doctests (run last) link against.

use std::path::{Path, PathBuf};
use std::process::Command;

const CRATES: [&str; 8] = [
    "softrdma-wire",
    "softrdma-verbs",
    "softrdma-iwarp",
    "softrdma-roce",
    "softrdma-cm",
    "softrdma-rsocket",
    "softrdma-capi",
    "softrdma-cli",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    // scripts/asan.sh runs the tests with its instrumented build's settings; a package is
    // checked with the plain build
    if std::env::var("RUSTFLAGS").is_ok_and(|f| f.contains("sanitizer")) {
        for v in [
            "RUSTFLAGS",
            "RUSTDOCFLAGS",
            "RUSTC_BOOTSTRAP",
            "CARGO_TARGET_DIR",
            "CARGO_ENCODED_RUSTFLAGS",
        ] {
            c.env_remove(v);
        }
    }
    c
}

/// A CARGO_HOME and a target directory for one `cargo package` run: the registry index and
/// the downloaded `.crate`s are the user's (symlinked, nothing is downloaded twice), the
/// extracted sources and every build output are new. Removed on drop.
struct PackageSandbox(PathBuf);

impl PackageSandbox {
    fn new() -> Self {
        let home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
            .expect("CARGO_HOME or HOME");
        let dir = std::env::temp_dir().join(format!("softrdma-package-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sandbox = PackageSandbox(dir);
        std::fs::create_dir_all(sandbox.home().join("registry")).expect("create the run's CARGO_HOME");
        for shared in ["registry/index", "registry/cache"] {
            let from = home.join(shared);
            if from.exists() {
                std::os::unix::fs::symlink(&from, sandbox.home().join(shared)).expect("link the registry");
            }
        }
        for file in ["config.toml", "config", "credentials.toml"] {
            if home.join(file).exists() {
                std::os::unix::fs::symlink(home.join(file), sandbox.home().join(file)).expect("link config");
            }
        }
        sandbox
    }

    fn home(&self) -> PathBuf {
        self.0.join("home")
    }

    fn target(&self) -> PathBuf {
        self.0.join("target")
    }
}

impl Drop for PackageSandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tar_list(archive: &Path) -> Vec<String> {
    let out = Command::new("tar").arg("-tzf").arg(archive).output().expect("run tar");
    assert!(out.status.success(), "tar -tzf {}", archive.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn tar_read(archive: &Path, member: &str) -> String {
    let out = Command::new("tar")
        .arg("-xzOf")
        .arg(archive)
        .arg(member)
        .output()
        .expect("run tar");
    assert!(out.status.success(), "tar -xzOf {} {member}", archive.display());
    String::from_utf8(out.stdout).expect("UTF-8 member")
}

#[test]
fn every_crate_packages_and_builds_from_its_archive() {
    let sandbox = PackageSandbox::new();
    let out = cargo()
        .env("CARGO_HOME", sandbox.home())
        .env("CARGO_TARGET_DIR", sandbox.target())
        .args(["package", "--workspace", "--exclude", "xtask", "--allow-dirty"])
        .output()
        .expect("run cargo package");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo package --workspace failed:\n{stderr}");
    for krate in CRATES {
        assert!(
            stderr.contains(&format!("Verifying {krate} v")),
            "{krate} was not verified:\n{stderr}"
        );
    }

    let version = env!("CARGO_PKG_VERSION");
    let dir = sandbox.target().join("package");
    for krate in CRATES {
        let archive = dir.join(format!("{krate}-{version}.crate"));
        let files = tar_list(&archive);
        let prefix = format!("{krate}-{version}/");
        for want in ["Cargo.toml", "LICENSE-MIT", "LICENSE-APACHE", "README.md"] {
            assert!(
                files.iter().any(|f| *f == format!("{prefix}{want}")),
                "{} lacks {want}: {files:?}",
                archive.display()
            );
        }
        let license = tar_read(&archive, &format!("{prefix}LICENSE-APACHE"));
        assert!(
            license.contains("Apache License") && license.contains("Version 2.0"),
            "{krate}: LICENSE-APACHE"
        );
        let manifest = tar_read(&archive, &format!("{prefix}Cargo.toml"));
        for field in [
            "description = ",
            "license = \"MIT OR Apache-2.0\"",
            "rust-version = ",
            "readme = \"README.md\"",
        ] {
            assert!(
                manifest.contains(field),
                "{krate}'s packaged Cargo.toml lacks `{field}`:\n{manifest}"
            );
        }
        // every softrdma dependency is a versioned one crates.io can resolve
        for (i, _) in manifest.match_indices("[dependencies.softrdma-") {
            let table = &manifest[i..];
            let table = &table[..table[1..].find("\n[").map_or(table.len(), |e| e + 1)];
            assert!(
                table.contains(&format!("version = \"{version}\"")),
                "{krate}: unversioned {table}"
            );
        }
    }
}
