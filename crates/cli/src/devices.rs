//! `softrdma devices [--json] [-v]`: list the RDMA devices (soft-iWARP `siw_*`, soft-RoCE
//! `rxe_*`) and their loopback capability; `-v` adds each device's GID table with the types.

use std::io::Write;

use clap::Args;
use serde_json::{json, Value};
use softrdma_verbs::device::{format_guid, list_devices, DeviceInfo, Gid, GidType, IfAddr};

use crate::CmdResult;

/// Options of `softrdma devices`.
#[derive(Args)]
pub struct DevicesArgs {
    /// Print a JSON array instead of a table (it always includes the GID tables).
    #[arg(long)]
    json: bool,
    /// After the table, list every device's GIDs with their types.
    #[arg(short, long)]
    verbose: bool,
}

/// Lists the devices on stdout.
pub fn run(args: &DevicesArgs) -> CmdResult {
    let devices = list_devices()?;
    let mut out = if args.json {
        serde_json::to_string_pretty(&Value::Array(devices.iter().map(to_json).collect()))?
    } else if args.verbose {
        format!("{}\n\n{}", table(&devices), gid_tables(&devices))
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

/// A GID as `ibv_devinfo -v` prints it: the IPv6 text for a RoCE v2 GID (`::ffff:127.0.0.1`),
/// eight hex groups otherwise.
fn gid_string(gid: Gid, ty: GidType) -> String {
    match ty {
        GidType::RoceV2 => std::net::Ipv6Addr::from(gid.0).to_string(),
        GidType::Ib | GidType::RoceV1 => gid.to_string(),
    }
}

/// `(index, GID text, type)` of every GID of `dev`.
fn gid_rows(dev: &DeviceInfo) -> Vec<(usize, String, GidType)> {
    dev.gids()
        .into_iter()
        .enumerate()
        .filter_map(|(i, g)| dev.gid_type(i).map(|t| (i, gid_string(g, t), t)))
        .collect()
}

/// The verbose section: one line per GID, `rxe_lo  GID[0]  ::ffff:127.0.0.1  RoCE v2`.
fn gid_tables(devices: &[DeviceInfo]) -> String {
    let width = devices.iter().map(|d| d.name.len()).max().unwrap_or(0);
    let mut lines = Vec::new();
    for d in devices {
        let rows = gid_rows(d);
        if rows.is_empty() {
            lines.push(format!("{:<width$}  no GIDs (the netdev has no address)", d.name));
        }
        for (i, text, ty) in rows {
            lines.push(format!("{:<width$}  GID[{i}]  {text}  {ty}", d.name));
        }
    }
    lines.join("\n")
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
        "gids": gid_rows(dev)
            .into_iter()
            .map(|(i, gid, ty)| json!({ "index": i, "gid": gid, "type": ty.as_str() }))
            .collect::<Vec<Value>>(),
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
            transport: if name.starts_with("rxe") {
                TransportKind::Roce
            } else {
                TransportKind::Iwarp
            },
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
            "gids",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["loopback_reason"], Value::Null);
        assert_eq!(v["node_guid"], "0000:00ff:fe00:0001");
        assert_eq!(v["gid0"], "0200:0000:0001:0000:0000:0000:0000:0000");
        assert_eq!(v["gids"][0]["type"], "IB");
    }

    #[test]
    fn roce_devices_list_their_gids_with_types() {
        let d = dev("rxe_eth0", true);
        let v = to_json(&d);
        assert_eq!(v["transport"], "roce");
        assert_eq!(v["gids"][0]["gid"], "::ffff:198.18.0.1");
        assert_eq!(v["gids"][0]["type"], "RoCE v2");
        assert_eq!(v["gids"][1]["gid"], "fe80::1");
        let text = gid_tables(&[dev("siw_eth0", true), d]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[0],
            "siw_eth0  GID[0]  0200:0000:0001:0000:0000:0000:0000:0000  IB"
        );
        assert_eq!(lines[1], "rxe_eth0  GID[0]  ::ffff:198.18.0.1  RoCE v2");
        assert_eq!(lines[2], "rxe_eth0  GID[1]  fe80::1  RoCE v2");
        assert!(table(&[dev("rxe_eth0", true)])
            .lines()
            .nth(1)
            .unwrap()
            .contains(" roce "));
    }
}
