//! Two test hosts: network namespaces joined by a veth pair, addresses from 198.18.0.0/15.
//! Created by the test, deleted on drop.

use std::process::Command;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A pair of namespaces `a` (198.18.K.1) and `b` (198.18.K.2).
pub struct NsPair {
    pub a: String,
    pub b: String,
    pub addr_a: String,
    pub addr_b: String,
    /// The veth ends: `veth_a` lives in `a`, `veth_b` in `b`.
    pub veth_a: String,
    pub veth_b: String,
}

impl NsPair {
    /// Creates the pair; `Err` says why (e.g. not root).
    pub fn new(tag: &str) -> Result<NsPair, String> {
        let pid = std::process::id();
        let k = (pid % 250) + 1;
        let a = format!("srd{tag}{pid}a");
        let b = format!("srd{tag}{pid}b");
        let (va, vb) = (format!("v{pid}a"), format!("v{pid}b"));
        let pair = NsPair {
            a: a.clone(),
            b: b.clone(),
            addr_a: format!("198.18.{k}.1"),
            addr_b: format!("198.18.{k}.2"),
            veth_a: va.clone(),
            veth_b: vb.clone(),
        };
        ip(&["netns", "add", &a])?;
        ip(&["netns", "add", &b])?;
        ip(&[
            "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b,
        ])?;
        for (ns, dev, addr) in [(&a, &va, &pair.addr_a), (&b, &vb, &pair.addr_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }
}

impl Drop for NsPair {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// Creates a pair, or explains the skip; under CI a failure to create one fails the test.
pub fn pair_or_skip(tag: &str) -> Option<NsPair> {
    match NsPair::new(tag) {
        Ok(p) => Some(p),
        // Without root the test is reported as ignored (crates/capi/test_prereqs.rs).
        Err(e) => panic!("cannot create network namespaces: {e}"),
    }
}
