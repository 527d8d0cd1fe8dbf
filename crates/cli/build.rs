//! The integration tests' prerequisites as cfgs (test_prereqs.rs: a symlink to ../capi/test_prereqs.rs,
//! so that `cargo package` ships a copy), plus this crate's own: `softrdma_no_groff` (no `groff`
//! to render the man page with; tests/shell_docs.rs then still checks its roff structure).

include!("test_prereqs.rs");

fn main() {
    test_prerequisites();
    println!("cargo::rustc-check-cfg=cfg(softrdma_no_groff)");
    if std::env::var_os("CI").is_none()
        && !std::process::Command::new("sh")
            .args(["-c", "command -v groff"])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    {
        println!("cargo::rustc-cfg=softrdma_no_groff");
    }
}
