//! The integration tests' prerequisites as cfgs (test_prereqs.rs: a symlink to ../capi/test_prereqs.rs,
//! so that `cargo package` ships a copy), plus this crate's own: `softrdma_no_groff` (no `groff`
//! to render the man page with; tests/shell_docs.rs then still checks its roff structure) and
//! `softrdma_no_debootstrap` (no `debootstrap` to build the clean Debian 12 roots of
//! tests/dockerfile_chroot.rs with).

include!("test_prereqs.rs");

fn main() {
    test_prerequisites();
    println!("cargo::rustc-check-cfg=cfg(softrdma_no_groff)");
    println!("cargo::rustc-check-cfg=cfg(softrdma_no_debootstrap)");
    if std::env::var_os("CI").is_some() {
        return;
    }
    let missing = |tool: &str| {
        !std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if missing("groff") {
        println!("cargo::rustc-cfg=softrdma_no_groff");
    }
    // debootstrap lives in /usr/sbin, which a user's PATH may lack
    if missing("debootstrap") && !std::path::Path::new("/usr/sbin/debootstrap").exists() {
        println!("cargo::rustc-cfg=softrdma_no_debootstrap");
    }
}
