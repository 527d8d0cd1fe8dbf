//! `softrdma`: the command-line tool of the softrdma userspace RDMA stack.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod capture;
mod cmatose;
mod devices;
mod dropin;
mod perf;
mod rdma_view;
mod rping;
mod scale;
mod shell;
mod soak;
mod stat;

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
    /// Live counters of every process using softrdma: per device and per QP, both transports.
    Stat(stat::StatArgs),
    /// Record this host's softrdma traffic (lo) in a pcapng Wireshark decodes: capture -w F -- CMD.
    Capture(capture::CaptureArgs),
    /// Print shell completions: softrdma completions bash > ~/.local/share/bash-completion/completions/softrdma.
    Completions(shell::CompletionsArgs),
    /// Print the man page (roff): softrdma man | man -l -.
    Man(shell::ManArgs),
}

/// The command line, with the environment variables in `--help` (and the man page).
fn cli_command() -> clap::Command {
    Cli::command().after_long_help(softrdma_verbs::settings::help_text())
}

fn main() -> ExitCode {
    init_tracing();
    let cli = match cli_command().try_get_matches().and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result: CmdResult = match cli.command {
        Command::Devices(args) => devices::run(&args),
        Command::Perf(args) => perf::run(&args),
        Command::Cmatose(args) => return cmatose::run(&args),
        Command::Rping(args) => return rping::run(&args),
        Command::Soak(args) => soak::run(&args),
        Command::Scale(args) => scale::run(&args),
        Command::Env(args) => dropin::env(&args),
        Command::Run(args) => return dropin::run(&args),
        Command::Stat(args) => stat::run(&args),
        Command::Capture(args) => match capture::run(&args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Completions(args) => shell::completions(&args, cli_command()),
        Command::Man(args) => shell::man(&args, cli_command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, filtered by `SOFTRDMA_LOG`, else `RUST_LOG` (default: warnings and
/// errors): the library's setup (`softrdma_verbs::logging`).
fn init_tracing() {
    softrdma_verbs::logging::init(softrdma_verbs::logging::LogUser::Tool);
}
