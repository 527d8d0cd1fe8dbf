//! `softrdma devices [--json]`: list the RDMA devices and their loopback capability.

use std::io::Write;

use clap::Args;
use serde_json::{json, Value};
use softrdma_verbs::device::{format_guid, list_devices, DeviceInfo, IfAddr};

use crate::CmdResult;

/// Options of `softrdma devices`.
#[derive(Args)]
pub struct DevicesArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists the devices on stdout.
pub fn run(args: &DevicesArgs) -> CmdResult {
    let devices = list_devices()?;
    let mut out = if args.json {
        serde_json::to_string_pretty(&Value::Array(devices.iter().map(to_json).collect()))?
    } else {
        table(&devices)
    };
    out.push('\n');
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// An address as users type it: `192.0.2.1`, `::1`, `fe80::1%eth0`.
fn addr_string(dev: &DeviceInfo, a: &IfAddr) -> String {
    if a.scope_id != 0 {
        format!("{}%{}", a.ip, dev.netdev)
    } else {
        a.ip.to_string()
    }
}

fn addresses(dev: &DeviceInfo) -> Vec<String> {
    dev.addrs.iter().map(|a| addr_string(dev, a)).collect()
}

fn loopback_cell(dev: &DeviceInfo) -> String {
    match (dev.loopback, &dev.loopback_reason) {
        (true, _) => "yes".to_owned(),
        (false, Some(reason)) => format!("no ({reason})"),
        (false, None) => "no".to_owned(),
    }
}

fn to_json(dev: &DeviceInfo) -> Value {
    json!({
        "name": dev.name,
        "transport": dev.transport.as_str(),
        "netdev": dev.netdev,
        "ifindex": dev.ifindex,
        "addresses": addresses(dev),
        "port_state": dev.port_state.as_str(),
        "mtu": dev.mtu,
        "loopback": dev.loopback,
        "loopback_reason": dev.loopback_reason,
        "node_guid": format_guid(dev.node_guid()),
        "gid0": dev.gid(0).map(|g| g.to_string()),
    })
}

fn table(devices: &[DeviceInfo]) -> String {
    const HEADER: [&str; 7] = ["NAME", "TRANSPORT", "NETDEV", "ADDRESSES", "PORT", "MTU", "LOOPBACK"];
    let rows: Vec<[String; 7]> = devices
        .iter()
        .map(|d| {
            let addrs = addresses(d);
            [
                d.name.clone(),
                d.transport.to_string(),
                d.netdev.clone(),
                if addrs.is_empty() {
                    "-".to_owned()
                } else {
                    addrs.join(",")
                },
                d.port_state.to_string(),
                d.mtu.to_string(),
                loopback_cell(d),
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header = HEADER.map(str::to_owned);
    let lines: Vec<String> = std::iter::once(&header)
        .chain(&rows)
        .map(|row| {
            let cells: Vec<String> = row.iter().zip(widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_verbs::device::{PortState, TransportKind};

    fn dev(name: &str, loopback: bool) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            transport: TransportKind::Iwarp,
            netdev: "eth0".into(),
            ifindex: 2,
            loopback,
            addrs: vec![
                IfAddr {
                    ip: "198.18.0.1".parse().unwrap(),
                    prefix_len: 15,
                    scope_id: 0,
                },
                IfAddr {
                    ip: "fe80::1".parse().unwrap(),
                    prefix_len: 64,
                    scope_id: 2,
                },
            ],
            mtu: 1500,
            mac: [2, 0, 0, 0, 0, 1],
            speed_mbps: None,
            port_state: PortState::Active,
            loopback_reason: (!loopback).then(|| "loopback disabled by config".to_owned()),
            is_loopback_netdev: false,
        }
    }

    #[test]
    fn table_has_all_columns() {
        let t = table(&[dev("siw_eth0", false)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("NAME      TRANSPORT  NETDEV  ADDRESSES"));
        assert!(lines[1].contains("198.18.0.1,fe80::1%eth0"));
        assert!(lines[1].contains("ACTIVE"));
        assert!(lines[1].ends_with("no (loopback disabled by config)"));
    }

    #[test]
    fn json_has_all_keys() {
        let v = to_json(&dev("siw_eth0", true));
        for key in [
            "name",
            "transport",
            "netdev",
            "ifindex",
            "addresses",
            "port_state",
            "mtu",
            "loopback",
            "loopback_reason",
            "node_guid",
            "gid0",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["loopback_reason"], Value::Null);
        assert_eq!(v["node_guid"], "0000:00ff:fe00:0001");
        assert_eq!(v["gid0"], "0200:0000:0001:0000:0000:0000:0000:0000");
    }
}
