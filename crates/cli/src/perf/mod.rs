//! `softrdma perf`: perftest-style bandwidth and latency tests over softrdma devices.
//!
//! Server when ADDR is absent, client otherwise. Each size runs on its own connection; the
//! client's MPA private data says which test, size and iteration count, and the reply carries
//! the server buffer's address and rkey. Every run ends with a verify pass unless `--no-verify`.

mod client;
mod endpoint;
mod link;
mod proto;
mod roce_link;
mod server;

use clap::{Args, ValueEnum};
use std::net::IpAddr;

/// Which test to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Test {
    /// SEND bandwidth.
    SendBw,
    /// RDMA WRITE bandwidth.
    WriteBw,
    /// RDMA READ bandwidth.
    ReadBw,
    /// SEND ping-pong latency.
    SendLat,
    /// RDMA WRITE ping-pong latency (memory polling).
    WriteLat,
    /// RDMA READ latency.
    ReadLat,
}

impl Test {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Test::SendBw => "send-bw",
            Test::WriteBw => "write-bw",
            Test::ReadBw => "read-bw",
            Test::SendLat => "send-lat",
            Test::WriteLat => "write-lat",
            Test::ReadLat => "read-lat",
        }
    }

    fn is_bw(self) -> bool {
        matches!(self, Test::SendBw | Test::WriteBw | Test::ReadBw)
    }

    fn id(self) -> u8 {
        self as u8 + 1
    }

    fn from_id(id: u8) -> Option<Test> {
        [
            Test::SendBw,
            Test::WriteBw,
            Test::ReadBw,
            Test::SendLat,
            Test::WriteLat,
            Test::ReadLat,
        ]
        .get(id.checked_sub(1)? as usize)
        .copied()
    }
}

/// Arguments of `softrdma perf`.
#[derive(Debug, Args)]
pub struct PerfArgs {
    /// The test.
    #[arg(value_enum)]
    pub test: Test,
    /// Server address to connect to; without it, run as the server.
    pub addr: Option<IpAddr>,
    /// TCP port (0 = any free port, server only).
    #[arg(short, long, default_value_t = 18515)]
    pub port: u16,
    /// Message sizes in bytes, comma separated.
    #[arg(short, long, value_delimiter = ',', default_values_t = vec![65536usize])]
    pub size: Vec<usize>,
    /// Iterations per size.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u32,
    /// Device name (default: the device that owns the address, else the first device).
    #[arg(short, long)]
    pub device: Option<String>,
    /// Server bind address.
    #[arg(short, long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Print one JSON object per size.
    #[arg(long)]
    pub json: bool,
    /// Skip the data verification pass.
    #[arg(long)]
    pub no_verify: bool,
    /// Request MPA CRC32c on every FPDU.
    #[arg(long)]
    pub mpa_crc: bool,
    /// Connection setup timeout in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Sleep on completion events (a completion channel) instead of polling the CQ, as
    /// perftest's `-e`: what a blocking application pays. Memory-polling waits (write-lat)
    /// still poll.
    #[arg(short, long)]
    pub events: bool,
}

/// Runs the subcommand.
pub fn run(args: &PerfArgs) -> crate::CmdResult {
    if args.size.is_empty() || args.size.iter().any(|&s| s == 0 || s > 1 << 30) {
        return Err("perf: sizes must be between 1 and 1073741824 bytes".into());
    }
    if args.iters == 0 {
        return Err("perf: -n must be at least 1".into());
    }
    match args.addr {
        Some(addr) => client::run(args, addr),
        None => server::run(args),
    }
}
