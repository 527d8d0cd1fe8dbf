//! `softrdma perf` between two hosts: network namespaces joined by veth (198.18.0.0/15).

mod common;

use common::netns::pair_or_skip;
use common::{check_results, run_bounded, start_server, TESTS};
use std::time::Duration;

#[test]
#[cfg_attr(
    softrdma_unprivileged,
    ignore = "needs root and iproute2: it creates network namespaces (CI runs it)"
)]
fn every_perf_test_across_two_namespaces() {
    let Some(hosts) = pair_or_skip("p") else { return };
    for test in TESTS {
        let (mut server, port) = start_server(
            &["ip", "netns", "exec", &hosts.a],
            &["perf", test, "-b", &hosts.addr_a, "-p", "0"],
        );
        let port = port.to_string();
        let argv = [
            "ip",
            "netns",
            "exec",
            &hosts.b,
            common::bin(),
            "perf",
            test,
            &hosts.addr_a,
            "-p",
            &port,
            "-s",
            "1,4096,1048576",
            "-n",
            "20",
            "--json",
        ];
        let out = run_bounded(&argv, Duration::from_secs(120));
        check_results(test, &out, &[1, 4096, 1048576]);
        assert!(server.0.wait().expect("server exit").success(), "{test}: server failed");
    }
}
