//! The files that show softrdma used outside this repository stay consistent with it: the
//! root `Dockerfile` and the GitHub Actions workflow for downstream projects
//! (`examples/github-actions/rdma-ci.yml`). This checks what they install and run against the
//! README's apt line, the `cargo xtask` tasks and `softrdma --help`, and that the YAML has the
//! workflow's shape. The workflow is not run here (no GitHub runner); the Dockerfile is built
//! and run without docker by `dockerfile_chroot.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The Debian packages of the README's apt-get line (scripts/readme-commands.sh --packages).
fn readme_packages() -> Vec<String> {
    let out = Command::new(root().join("scripts/readme-commands.sh"))
        .arg("--packages")
        .output()
        .expect("run scripts/readme-commands.sh");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The `softrdma` subcommands `--help` lists.
fn subcommands() -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("--help")
        .output()
        .expect("softrdma --help");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The packages an `apt-get install` line names (words after `install` that are not options,
/// up to the end of the shell command).
fn apt_packages(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    let mut pkgs = Vec::new();
    for line in joined.lines() {
        if let Some(i) = line.find("apt-get install") {
            pkgs.extend(
                line[i + "apt-get install".len()..]
                    .split_whitespace()
                    .take_while(|w| !["&&", ";", "|"].contains(w))
                    .filter(|w| !w.starts_with('-'))
                    .map(str::to_owned),
            );
        }
    }
    pkgs
}

/// Every `softrdma WORD` on a command line (not a comment) of `text` names a real subcommand.
fn check_softrdma_calls(what: &str, text: &str) {
    let subs = subcommands();
    let mut seen = 0;
    // commands only: not comments, not a step's `name:` (prose)
    for line in text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim_start().starts_with("- name:"))
    {
        let line = line.split(" #").next().unwrap_or(line); // a trailing comment
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || "'\"();&|".contains(c))
            .filter(|w| !w.is_empty())
            .collect();
        for pair in words.windows(2) {
            if pair[0] == "softrdma" && pair[1].chars().all(|c| c.is_ascii_lowercase()) {
                assert!(
                    subs.iter().any(|s| s == pair[1]),
                    "{what} runs `softrdma {}`, which is not a subcommand: {subs:?}\n{line}",
                    pair[1]
                );
                seen += 1;
            }
        }
    }
    assert!(seen > 0, "{what} runs no softrdma subcommand");
}

#[test]
fn dockerfile_matches_the_readme_and_the_build() {
    let docker = read("Dockerfile");
    let froms: Vec<&str> = docker.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert!(
        !froms.is_empty() && froms.iter().all(|l| l.starts_with("FROM debian:bookworm")),
        "{froms:?}"
    );
    let readme = readme_packages();
    let installed = apt_packages(&docker);
    // the runtime tools are the README's (the build stage adds only a compiler and curl)
    for tool in ["ibverbs-utils", "rdmacm-utils", "perftest"] {
        assert!(readme.iter().any(|p| p == tool), "README's apt line lacks {tool}");
        assert!(
            installed.iter().any(|p| p == tool),
            "the Dockerfile does not install {tool}: {installed:?}"
        );
    }
    assert!(
        docker.contains("RUN cargo xtask install --prefix /usr/local"),
        "the Dockerfile does not install with cargo xtask install"
    );
    assert!(
        read("xtask/src/main.rs").contains("Some(\"install\")"),
        "cargo xtask has no install task"
    );
    // the last stage runs as a user that is not root, and ends with the smoke command
    let last = &docker[docker.rfind("\nFROM ").expect("a final stage")..];
    let user = last
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER in the final stage");
    assert!(!["root", "0"].contains(&user.trim()), "USER {user}");
    assert!(last.contains("useradd"), "the user is created in the final stage");
    let cmd = last.lines().rev().find(|l| l.starts_with("CMD ")).expect("a CMD");
    assert_eq!(cmd, r#"CMD ["softrdma", "run", "--", "ibv_devinfo"]"#);
    assert!(
        read(".dockerignore").lines().any(|l| l == "target"),
        ".dockerignore keeps target/ out of the context"
    );
    assert!(
        read("README.md").contains("docker build -t softrdma ."),
        "the README documents docker build"
    );
}

#[test]
fn downstream_workflow_is_a_workflow_that_installs_and_runs_softrdma() {
    let wf = read("examples/github-actions/rdma-ci.yml");
    assert!(!wf.contains('\t'), "YAML forbids tabs in indentation");
    for key in ["name:", "on:", "jobs:"] {
        assert!(wf.lines().any(|l| l.starts_with(key)), "no top-level `{key}`");
    }
    assert!(
        wf.contains("container: debian:bookworm"),
        "the job runs in Debian 12 (rdma-core 44, the drop-in's ABI)"
    );
    // every `- name:` / `- uses:` step sits at one indentation, with `run:` bodies below it
    let steps: Vec<usize> = wf
        .lines()
        .filter(|l| l.trim_start().starts_with("- name:") || l.trim_start().starts_with("- uses:"))
        .map(|l| l.len() - l.trim_start().len())
        .collect();
    assert!(
        steps.len() >= 4 && steps.iter().all(|&i| i == steps[0]),
        "steps {steps:?}"
    );
    let readme = readme_packages();
    for tool in [
        "ibverbs-utils",
        "rdmacm-utils",
        "perftest",
        "libibverbs-dev",
        "librdmacm-dev",
    ] {
        assert!(readme.iter().any(|p| p == tool), "README's apt line lacks {tool}");
        assert!(
            apt_packages(&wf).iter().any(|p| p == tool),
            "the workflow does not install {tool}"
        );
    }
    assert!(
        wf.contains("cargo xtask install --prefix"),
        "the workflow installs with cargo xtask install"
    );
    assert!(
        wf.contains("softrdma run -- "),
        "the workflow runs programs under softrdma run"
    );
    check_softrdma_calls("the workflow", &wf);
    // the verbs-only pingpong uses the flags the README gives for it
    assert!(wf.contains("ibv_rc_pingpong -d rxe_lo -g 0"));
    assert!(
        read("README.md").contains("examples/github-actions/rdma-ci.yml"),
        "the README points at the workflow"
    );
}
