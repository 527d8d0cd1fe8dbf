//! `softrdma stat [--json] [--pid PID]`: live counters of every process using softrdma on this
//! host (in this network namespace), per device and per QP, for both transports.
//!
//! Each process serves its counters on an abstract Unix socket (`softrdma_verbs::stats`);
//! this asks each one and prints a table, or one JSON object.

use std::collections::BTreeMap;
use std::io::Write;

use clap::Args;
use serde_json::json;
use softrdma_verbs::stats::{query, serving_pids, ProcessStats, QpCounters};

use crate::CmdResult;

/// Options of `softrdma stat`.
#[derive(Args)]
pub struct StatArgs {
    /// Print one JSON object: {"processes": [...], "devices": [...]}.
    #[arg(long)]
    json: bool,
    /// Only this process.
    #[arg(long)]
    pid: Option<u32>,
}

/// Queries the processes and prints their counters.
pub fn run(args: &StatArgs) -> CmdResult {
    let pids = match args.pid {
        Some(p) => vec![p],
        None => serving_pids(),
    };
    let mut procs: Vec<ProcessStats> = Vec::new();
    for pid in pids {
        match query(pid) {
            Ok(p) => procs.push(p),
            // A process that exited (or is not ours) between the listing and the query.
            Err(e) if args.pid.is_some() => {
                return Err(
                    format!("process {pid}: no softrdma counters ({e}); is it using softrdma, as your user?").into(),
                )
            }
            Err(e) => tracing::debug!(pid, %e, "softrdma stat: skipped"),
        }
    }
    let devices = per_device(&procs);
    let out = if args.json {
        let devices: Vec<_> = devices
            .iter()
            .map(|((name, transport), (qps, c))| json!({"device": name, "transport": transport, "qps": qps, "counters": c}))
            .collect();
        serde_json::to_string_pretty(&json!({ "processes": procs, "devices": devices }))? + "\n"
    } else {
        table(&procs, &devices)
    };
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

type DeviceTotals = BTreeMap<(String, String), (usize, QpCounters)>;

fn per_device(procs: &[ProcessStats]) -> DeviceTotals {
    let mut m = DeviceTotals::new();
    for q in procs.iter().flat_map(|p| &p.qps) {
        let e = m.entry((q.device.clone(), q.transport.clone())).or_default();
        e.0 += 1;
        e.1 += q.counters;
    }
    m
}

const HEAD: [&str; 10] = [
    "TX_PKTS", "RX_PKTS", "TX_BYTES", "RX_BYTES", "RETRANS", "TIMEOUTS", "NAKS_TX", "NAKS_RX", "RNR", "ERRORS",
];

fn cells(c: &QpCounters) -> [u64; 10] {
    [
        c.tx_packets,
        c.rx_packets,
        c.tx_bytes,
        c.rx_bytes,
        c.retransmissions,
        c.timeouts,
        c.naks_sent,
        c.naks_received,
        c.rnr,
        c.errors,
    ]
}

fn row(lead: &[String], c: &QpCounters) -> String {
    let mut s = format!(
        "{:<8} {:<16} {:<12} {:>8} {:<4} {:<6}",
        lead[0], lead[1], lead[2], lead[3], lead[4], lead[5]
    );
    for v in cells(c) {
        s += &format!(" {v:>12}");
    }
    s + "\n"
}

fn table(procs: &[ProcessStats], devices: &DeviceTotals) -> String {
    if procs.is_empty() {
        return "no process is using softrdma (in this network namespace)\n".into();
    }
    let header: Vec<String> = ["PID", "COMMAND", "DEVICE", "QPN", "TYPE", "STATE"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut out = format!(
        "{:<8} {:<16} {:<12} {:>8} {:<4} {:<6}",
        header[0], header[1], header[2], header[3], header[4], header[5]
    );
    for h in HEAD {
        out += &format!(" {h:>12}");
    }
    out += "\n";
    for p in procs {
        for q in &p.qps {
            let lead = [
                p.pid.to_string(),
                p.command.clone(),
                q.device.clone(),
                q.qpn.to_string(),
                q.qp_type.clone(),
                q.state.clone(),
            ];
            out += &row(&lead, &q.counters);
        }
    }
    out += "\n";
    for ((name, transport), (qps, c)) in devices {
        let lead = [
            "total".to_string(),
            format!("{qps} QP(s)"),
            name.clone(),
            String::new(),
            String::new(),
            transport.clone(),
        ];
        out += &row(&lead, c);
    }
    out
}
