//! Three test hosts on one LAN: network namespaces h1..h3, each with a veth into a fourth
//! namespace that holds a bridge. Addresses 198.18.K.1..3/24 (198.18.0.0/15). All of it is
//! created by the test and deleted on drop.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Runs `ip` (or any command) and reports failures with stderr.
pub fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The LAN.
pub struct Lan {
    /// Namespace names of the hosts.
    pub hosts: Vec<String>,
    /// Their addresses (same order).
    pub addrs: Vec<String>,
    /// An address on the LAN where no host answers.
    pub nobody: String,
    switch: String,
}

impl Lan {
    /// Builds the LAN; `Err` says why (e.g. not root).
    pub fn new() -> Result<Lan, String> {
        Lan::with_hosts(3)
    }

    /// Builds the LAN with `n` hosts (198.18.K.1..n).
    pub fn with_hosts(count: usize) -> Result<Lan, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let k = (pid.wrapping_mul(7).wrapping_add(n * 31)) % 250 + 1;
        let tag = format!("{pid}x{n}");
        let switch = format!("srsw{tag}");
        let mut lan = Lan {
            hosts: Vec::new(),
            addrs: Vec::new(),
            nobody: format!("198.18.{k}.99"),
            switch: switch.clone(),
        };
        sh(&["ip", "netns", "add", &switch])?;
        sh(&["ip", "-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        sh(&["ip", "-n", &switch, "link", "set", "br0", "up"])?;
        for i in 1..=count {
            let host = format!("srh{i}{tag}");
            sh(&["ip", "netns", "add", &host])?;
            lan.hosts.push(host.clone());
            let (inner, outer) = (format!("eth{i}"), format!("p{i}{tag}"));
            let outer: String = outer.chars().take(15).collect();
            sh(&[
                "ip", "link", "add", &inner, "netns", &host, "type", "veth", "peer", "name", &outer, "netns", &switch,
            ])?;
            sh(&["ip", "-n", &switch, "link", "set", &outer, "master", "br0"])?;
            sh(&["ip", "-n", &switch, "link", "set", &outer, "up"])?;
            let addr = format!("198.18.{k}.{i}");
            sh(&["ip", "-n", &host, "addr", "add", &format!("{addr}/24"), "dev", &inner])?;
            sh(&["ip", "-n", &host, "link", "set", &inner, "up"])?;
            sh(&["ip", "-n", &host, "link", "set", "lo", "up"])?;
            lan.addrs.push(addr);
        }
        Ok(lan)
    }

    /// Builds the LAN, or explains the skip; under CI a failure fails the test.
    pub fn or_skip() -> Option<Lan> {
        Lan::or_skip_with(3)
    }

    /// [`Lan::or_skip`] with `n` hosts.
    pub fn or_skip_with(n: usize) -> Option<Lan> {
        match Lan::with_hosts(n) {
            Ok(l) => Some(l),
            // Without root the test is reported as ignored (crates/capi/test_prereqs.rs).
            Err(e) => panic!("cannot create network namespaces: {e}"),
        }
    }

    /// `ip netns exec <host i>` prefix.
    pub fn exec(&self, i: usize) -> Vec<&str> {
        vec!["ip", "netns", "exec", &self.hosts[i]]
    }

    /// Lets host `from` send to `loopback_ip` (a 127.x address) through host `to`, and host
    /// `to` accept it: the misconfiguration under which a remote request names a loopback address.
    pub fn route_loopback_across(&self, from: usize, to: usize, loopback_ip: &str) -> Result<(), String> {
        let (f, t) = (&self.hosts[from], &self.hosts[to]);
        let (fdev, tdev) = (format!("eth{}", from + 1), format!("eth{}", to + 1));
        for (ns, dev) in [(t, &tdev), (f, &fdev)] {
            // Accept 127/8 on the veth and do not drop it as martian or by reverse-path checks.
            for iface in ["all", dev.as_str()] {
                for setting in ["route_localnet=1", "rp_filter=0"] {
                    let key = format!("net.ipv4.conf.{iface}.{setting}");
                    sh(&["ip", "netns", "exec", ns, "sysctl", "-qw", &key])?;
                }
            }
        }
        sh(&[
            "ip",
            "-n",
            f,
            "rule",
            "add",
            "pref",
            "10",
            "to",
            loopback_ip,
            "lookup",
            "100",
        ])?;
        let via = &self.addrs[to];
        let src = &self.addrs[from];
        sh(&[
            "ip",
            "-n",
            f,
            "route",
            "add",
            &format!("{loopback_ip}/32"),
            "via",
            via,
            "dev",
            &fdev,
            "src",
            src,
            "table",
            "100",
        ])?;
        sh(&["ip", "-n", f, "rule", "del", "pref", "0", "lookup", "local"])?;
        sh(&["ip", "-n", f, "rule", "add", "pref", "20", "lookup", "local"])
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = sh(&["ip", "netns", "del", h]);
        }
        let _ = sh(&["ip", "netns", "del", &self.switch]);
    }
}
