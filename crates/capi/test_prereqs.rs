// Shared by the build scripts of softrdma-capi and softrdma-cli (`include!`).

/// Tells the integration tests, as cfgs, what this machine lacks: `softrdma_unprivileged` (not
/// root, or no iproute2: no network namespaces) and `softrdma_no_capture_tools` (no dumpcap,
/// tshark or nft) and `softrdma_no_consumers` (python3-pyverbs, ucx-utils, libucx-dev, openmpi-bin, libopenmpi-dev,
/// libfabric-bin or libfabric-dev missing: the programs the drop-in's ABI is checked against). Tests that need them are then reported as ignored with the reason
/// (`#[cfg_attr(softrdma_unprivileged, ignore = "...")]`). Under `CI` nothing is set: there they
/// run, and fail if the machine cannot.
fn test_prerequisites() {
    println!("cargo::rustc-check-cfg=cfg(softrdma_unprivileged)");
    println!("cargo::rustc-check-cfg=cfg(softrdma_no_capture_tools)");
    println!("cargo::rustc-check-cfg=cfg(softrdma_no_consumers)");
    println!("cargo::rerun-if-env-changed=CI");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=USER");
    if std::env::var_os("CI").is_some() {
        return;
    }
    let ok = |script: &str| {
        std::process::Command::new("sh")
            .args(["-c", script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok(r#"[ "$(id -u)" = 0 ] && command -v ip"#) {
        println!("cargo::rustc-cfg=softrdma_unprivileged");
    }
    if !ok("command -v dumpcap && command -v tshark && command -v nft") {
        println!("cargo::rustc-cfg=softrdma_no_capture_tools");
    }
    let l = "/usr/lib/x86_64-linux-gnu";
    let consumers = format!(
        "[ -d /usr/lib/python3/dist-packages/pyverbs ] && [ -e {l}/ucx/libuct_ib.so.0 ] && \
         [ -e {l}/openmpi/lib/openmpi3/mca_btl_openib.so ] && [ -e {l}/openmpi/include/mpi.h ] && \
         [ -e {l}/libfabric.so.1 ] && command -v fi_pingpong && command -v mpicc && \
         [ -e /usr/include/ucp/api/ucp.h ] && [ -e /usr/include/rdma/fabric.h ]"
    );
    if !ok(&consumers) {
        println!("cargo::rustc-cfg=softrdma_no_consumers");
    }
}
