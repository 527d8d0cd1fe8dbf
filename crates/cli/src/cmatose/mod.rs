//! `softrdma cmatose`: rdma-core's `ucmatose` (RDMA CM connection and ping-pong test) over
//! softrdma-cm.
//!
//! Server without `-s`: binds `-b`, listens, accepts `-c` connections (a QP per
//! CONNECT_REQUEST, every receive posted before the accept), sends `-C` messages of `-S` bytes
//! on each, receives as many, disconnects and waits for DISCONNECTED on all. Client with `-s`:
//! resolves address and route, connects `-c` times, receives, replies, and waits for the
//! server's disconnect. All ids share one event channel. Received messages are verified
//! against a per-message pattern. Any failure prints `softrdma cmatose: <reason>` and exits
//! non-zero.

mod client;
mod node;
mod server;

pub(crate) use server::remote_addresses;

use clap::Args;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `softrdma cmatose` (ucmatose's options).
#[derive(Debug, Args)]
pub struct CmatoseArgs {
    /// Server address (or host name) to connect to; without it, run as the server.
    #[arg(short = 's', long = "server", value_name = "SERVER")]
    pub server: Option<String>,
    /// Local address to bind to (server default: 0.0.0.0; client: the source address).
    #[arg(short = 'b', long = "bind", value_name = "BIND")]
    pub bind: Option<String>,
    /// Port (server: 0 picks a free one).
    #[arg(short = 'p', long = "port", default_value_t = 7471)]
    pub port: u16,
    /// Number of connections.
    #[arg(short = 'c', long = "connections", default_value_t = 1)]
    pub connections: u32,
    /// Messages each side sends (and receives) per connection.
    #[arg(short = 'C', long = "messages", default_value_t = 10)]
    pub messages: u32,
    /// Size of each message in bytes (0: no data transfer).
    #[arg(short = 'S', long = "size", default_value_t = 100)]
    pub size: u32,
    /// Type of service (client ids).
    #[arg(short = 't', long = "tos")]
    pub tos: Option<u8>,
    /// QP ACK timeout exponent (4.096 us * 2^N).
    #[arg(short = 'a', long = "ack-timeout")]
    pub ack_timeout: Option<u8>,
    /// Bound on connection setup of each client id (RDMA CM connect timeout), in milliseconds.
    #[arg(long = "timeout-ms")]
    pub timeout_ms: Option<u64>,
    /// Print every RDMA CM event as it arrives.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// Check every received byte against the message pattern this tool sends (both sides must
    /// be `softrdma cmatose`: rdma-core's ucmatose sends its buffers as they are, unfilled).
    #[arg(long = "verify")]
    pub verify: bool,
}

/// Set by `-v`: print each CM event.
static VERBOSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Prints `ev` when `-v` was given.
pub(crate) fn trace_event(ev: &softrdma_cm::CmEvent) {
    if VERBOSE.load(std::sync::atomic::Ordering::Relaxed) {
        let show = |a: Option<SocketAddr>| a.map(|a| a.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "cmatose: {} (status {}) {} -> {}",
            ev.event,
            ev.status,
            show(ev.id.local_addr()),
            show(ev.id.peer_addr())
        );
    }
}

/// Most bytes of message buffers the test allocates (both directions, all connections).
const MAX_BUFFER_BYTES: u64 = 1 << 30;

/// Largest connection count (the CM backlog limit).
const MAX_CONNECTIONS: u32 = softrdma_cm::MAX_BACKLOG;

/// How long the data phase may make no progress before the test fails.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the test failed: the reason printed after `softrdma cmatose: `, and the status for
/// the `return status` line (a negative errno or an event status, as ucmatose reports).
#[derive(Debug)]
pub(crate) struct Failure {
    pub reason: String,
    pub status: i32,
}

impl Failure {
    /// A failure with status -1.
    pub fn new(reason: impl Into<String>) -> Failure {
        Failure {
            reason: reason.into(),
            status: -1,
        }
    }

    /// A library error with what was being done.
    pub fn verbs(what: &str, e: &softrdma_verbs::Error) -> Failure {
        Failure {
            reason: format!("{what}: {e}"),
            status: -e.errno.raw(),
        }
    }
}

/// What the data phase moves: `count` messages of `size` bytes per connection; `verify`
/// checks their contents (lengths are always checked).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Messages {
    pub count: u32,
    pub size: u32,
    pub verify: bool,
}

/// Period of the message pattern (a prime, so neighbouring messages differ everywhere).
const PERIOD: usize = 251;

/// `0..PERIOD` twice: every `PERIOD`-byte window of the pattern is one slice of it.
const CYCLE: [u8; 2 * PERIOD] = {
    let mut t = [0u8; 2 * PERIOD];
    let mut i = 0;
    while i < 2 * PERIOD {
        t[i] = (i % PERIOD) as u8;
        i += 1;
    }
    t
};

impl Messages {
    /// Where message `index` starts in the cycle.
    fn phase(index: u32) -> usize {
        ((u64::from(index) * 131 + 7) % PERIOD as u64) as usize
    }

    /// Pieces of message `index`: (offset in the message, expected bytes).
    fn pieces(index: u32, len: usize) -> impl Iterator<Item = (usize, &'static [u8])> {
        let phase = Self::phase(index);
        (0..len).step_by(PERIOD).map(move |off| {
            let n = PERIOD.min(len - off);
            let k = (off + phase) % PERIOD;
            (off, &CYCLE[k..k + n])
        })
    }

    /// Writes message `index` into `out` (its length is the message size).
    pub fn fill(index: u32, out: &mut [u8]) {
        for (off, piece) in Self::pieces(index, out.len()) {
            out[off..off + piece.len()].copy_from_slice(piece);
        }
    }

    /// The first byte of `got` that differs from message `index`, with the expected value.
    pub fn mismatch(index: u32, got: &[u8]) -> Option<(usize, u8)> {
        Self::pieces(index, got.len()).find_map(|(off, piece)| {
            let chunk = &got[off..off + piece.len()];
            (chunk != piece).then(|| {
                let j = chunk.iter().zip(piece).position(|(a, b)| a != b).unwrap_or(0);
                (off + j, piece[j])
            })
        })
    }
}

/// Runs the subcommand; prints ucmatose's closing lines and, on failure, the reason.
pub fn run(args: &CmatoseArgs) -> ExitCode {
    VERBOSE.store(args.verbose, std::sync::atomic::Ordering::Relaxed);
    let result = check(args).and_then(|msgs| match &args.server {
        Some(server) => client::run(args, server, msgs),
        None => server::run(args, msgs),
    });
    println!("test complete");
    match result {
        Ok(()) => {
            println!("return status 0");
            ExitCode::SUCCESS
        }
        Err(f) => {
            println!("return status {}", f.status);
            eprintln!("softrdma cmatose: {}", f.reason);
            ExitCode::FAILURE
        }
    }
}

/// Checks the arguments; a zero size means no messages (as ucmatose).
fn check(args: &CmatoseArgs) -> Result<Messages, Failure> {
    if args.connections == 0 || args.connections > MAX_CONNECTIONS {
        return Err(Failure::new(format!(
            "-c {}: the connection count must be between 1 and {MAX_CONNECTIONS}",
            args.connections
        )));
    }
    let count = if args.size == 0 { 0 } else { args.messages };
    let msgs = Messages {
        count,
        size: args.size,
        verify: args.verify,
    };
    let total = 2 * u64::from(args.connections) * u64::from(count) * u64::from(args.size);
    if total > MAX_BUFFER_BYTES {
        return Err(Failure::new(format!(
            "-c {} -C {} -S {} needs {total} bytes of message buffers; the limit is {MAX_BUFFER_BYTES}",
            args.connections, args.messages, args.size
        )));
    }
    let max_wr = softrdma_verbs::device::limits::MAX_QP_WR as u32;
    if count > max_wr {
        return Err(Failure::new(format!(
            "-C {count}: at most {max_wr} messages per connection (the device's QP depth)"
        )));
    }
    Ok(msgs)
}

/// Resolves an address or host name to a socket address (`getaddrinfo`, first answer).
pub(crate) fn resolve_host(host: &str, port: u16) -> Result<SocketAddr, Failure> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let mut addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| Failure::new(format!("getaddrinfo {host}: {e}")))?;
    addrs
        .next()
        .ok_or_else(|| Failure::new(format!("getaddrinfo {host}: no address")))
}

/// The next CM event on `channel`, waiting at most `limit`; `what` says what was awaited.
pub(crate) fn next_event(
    channel: &softrdma_cm::EventChannel,
    limit: Duration,
    what: impl FnOnce() -> String,
) -> Result<softrdma_cm::CmEvent, Failure> {
    channel
        .get_event(Some(limit.max(Duration::from_millis(1))))
        .inspect(trace_event)
        .map_err(|e| match e.errno {
            softrdma_verbs::Errno::Again => Failure {
                reason: format!("{}: no RDMA CM event within {limit:?}", what()),
                status: -libc::ETIMEDOUT,
            },
            _ => Failure::verbs(&format!("{}: rdma_get_cm_event", what()), &e),
        })
}

/// An error event (ADDR_ERROR, ROUTE_ERROR, CONNECT_ERROR, UNREACHABLE, REJECTED, ...):
/// printed as ucmatose does, and returned with its name, status and the library's reason.
pub(crate) fn event_failure(label: &str, ev: &softrdma_cm::CmEvent) -> Failure {
    println!("cmatose: event: {}, error: {}", ev.event, ev.status);
    let mut reason = if ev.reason.is_empty() {
        "no reason given".to_string()
    } else {
        ev.reason.clone()
    };
    let said = &ev.param.private_data;
    if !said.is_empty() && said.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        reason.push_str(&format!(" (the peer says: {})", String::from_utf8_lossy(said)));
    }
    Failure {
        reason: format!("{label}: {}, status {}: {reason}", ev.event, ev.status),
        status: if ev.status == 0 { -1 } else { ev.status },
    }
}

#[cfg(test)]
mod tests {
    use super::Messages;

    #[test]
    fn messages_differ_everywhere_and_corruption_is_found() {
        let (mut a, mut b) = (vec![0u8; 600], vec![0u8; 600]);
        Messages::fill(0, &mut a);
        Messages::fill(1, &mut b);
        assert_eq!(&a[..3], &[7, 8, 9]);
        assert_eq!(a[244], 0, "the pattern wraps at 251");
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        assert_eq!(Messages::mismatch(0, &a), None);
        let want = a[300];
        a[300] ^= 0x40;
        assert_eq!(Messages::mismatch(0, &a), Some((300, want)));
    }
}
