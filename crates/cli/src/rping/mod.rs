//! `softrdma rping`: rdma-core's `rping` (RDMA CM connection and RDMA ping-pong test) over
//! softrdma-cm, wire-compatible with the C tool.
//!
//! Each ping: the client SENDs its start buffer's `struct rping_rdma_info`; the server RDMA
//! READs it and SENDs a go-ahead; the client SENDs its sink buffer's info; the server RDMA
//! WRITEs the data into the sink and SENDs a go-ahead. `-V` compares start and sink, `-v`
//! prints the data. The server serves one client and ends when it disconnects.

mod client;
mod conn;
mod proto;
mod server;

use clap::{ArgGroup, Args};
use std::process::ExitCode;
use std::time::Duration;

/// Default TCP port, as rping.
const DEFAULT_PORT: u16 = 7174;

/// How long one step of a ping (or connection setup) may take before the test fails.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments of `softrdma rping` (rping's options).
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("role").required(true).args(["server", "client"])))]
pub struct RpingArgs {
    /// Run as the server.
    #[arg(short = 's')]
    pub server: bool,
    /// Run as the client.
    #[arg(short = 'c')]
    pub client: bool,
    /// Server: address to bind (default 0.0.0.0). Client: the server's address.
    #[arg(short = 'a', value_name = "ADDR")]
    pub addr: Option<String>,
    /// Client: source address to bind.
    #[arg(short = 'I', value_name = "ADDR")]
    pub source: Option<String>,
    /// Port.
    #[arg(short = 'p', default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Pings to run (client; 0 = until interrupted). The server runs until the client leaves.
    #[arg(short = 'C', default_value_t = 0)]
    pub count: u32,
    /// Ping data size in bytes (26 to 65535).
    #[arg(short = 'S', default_value_t = 64)]
    pub size: u32,
    /// Display ping data (the server also prints where it listens).
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Validate ping data (client).
    #[arg(short = 'V')]
    pub validate: bool,
    /// Display debug information.
    #[arg(short = 'd')]
    pub debug: bool,
}

/// Runs the subcommand; failures print `softrdma rping: <reason>` and exit non-zero.
pub fn run(args: &RpingArgs) -> ExitCode {
    let result = proto::check_size(args.size).and_then(|()| {
        if args.server {
            server::run(args)
        } else {
            client::run(args)
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(reason) => {
            eprintln!("softrdma rping: {reason}");
            ExitCode::FAILURE
        }
    }
}
