//! `softrdma`: the command-line tool of the softrdma userspace RDMA stack.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod cmatose;
mod devices;
mod dropin;
mod perf;
mod rdma_view;
mod rping;
mod scale;
mod shell;
mod soak;

/// Errors a subcommand reports; `main` prints them as `softrdma: <message>` and exits 1.
type CmdResult = Result<(), Box<dyn std::error::Error>>;

/// softrdma: a userspace RDMA stack with soft-iWARP devices over TCP.
#[derive(Parser)]
#[command(name = "softrdma", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List RDMA devices: name, transport, netdev, addresses, port state, loopback capability.
    Devices(devices::DevicesArgs),
    /// Bandwidth and latency tests (perftest-style): server without ADDR, client with it.
    Perf(perf::PerfArgs),
    /// RDMA CM connection and ping-pong test (rdma-core's ucmatose): server without -s.
    Cmatose(cmatose::CmatoseArgs),
    /// RDMA CM ping-pong with SEND, RDMA READ and RDMA WRITE (rdma-core's rping).
    Rping(rping::RpingArgs),
    /// Mixed SEND/WRITE/READ with random connects and disconnects, every byte verified.
    Soak(soak::SoakArgs),
    /// Many RC connections between two processes (and connection bursts at a listener).
    Scale(scale::ScaleArgs),
    /// Print the shell lines that make programs load softrdma: eval "$(softrdma env)".
    Env(dropin::EnvArgs),
    /// Run an unmodified RDMA program over softrdma: softrdma run -- ibv_devinfo -v.
    Run(dropin::RunArgs),
    /// Print shell completions: softrdma completions bash > ~/.local/share/bash-completion/completions/softrdma.
    Completions(shell::CompletionsArgs),
    /// Print the man page (roff): softrdma man | man -l -.
    Man(shell::ManArgs),
}

fn main() -> ExitCode {
    init_tracing();
    let cli = Cli::parse();
    let result: CmdResult = match cli.command {
        Command::Devices(args) => devices::run(&args),
        Command::Perf(args) => perf::run(&args),
        Command::Cmatose(args) => return cmatose::run(&args),
        Command::Rping(args) => return rping::run(&args),
        Command::Soak(args) => soak::run(&args),
        Command::Scale(args) => scale::run(&args),
        Command::Env(args) => dropin::env(&args),
        Command::Run(args) => return dropin::run(&args),
        Command::Completions(args) => shell::completions(&args, Cli::command()),
        Command::Man(args) => shell::man(&args, Cli::command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings and errors).
fn init_tracing() {
    use tracing_subscriber::{filter::LevelFilter, EnvFilter};
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
