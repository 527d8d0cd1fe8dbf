//! The socket side of soft-iWARP: TCP connections driven by the progress thread.
//!
//! This layer is deliberately thin: it moves bytes between kernel TCP sockets and the
//! sans-I/O [`crate::handshake`] and [`crate::engine`], and turns socket outcomes into
//! [`ConnEvent`]s. The rdma_cm semantics (issue 3) sit on top of this API.

mod caller;
mod conn;
mod conn_guard;
mod listen;
#[cfg(test)]
mod tests;

pub use conn::{connect, connect_blocking, connect_socket, ConnHandle};
pub use listen::{ConnRequest, Listener, ACCEPT_RETRY, REQUEST_TIMEOUT};

use softrdma_verbs::Errno;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Sends on a connected TCP socket with `MSG_NOSIGNAL`: a peer that is gone gives EPIPE, never
/// SIGPIPE (socket2's `Write for &Socket` passes flags 0, which would kill a C program with
/// the default SIGPIPE disposition). Every write of the iWARP driver goes through here.
pub(crate) fn send_nosignal(sock: &socket2::Socket, buf: &[u8]) -> std::io::Result<usize> {
    sock.send_with_flags(buf, libc::MSG_NOSIGNAL)
}

/// Where a connection stands, reported to the owner's callback on the progress thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// The connection is up and the QP is in RTS.
    Established {
        /// The peer's private data (active side: from the MPA Reply; passive side: from the Request).
        private_data: Vec<u8>,
        /// Negotiated incoming READ limit.
        ird: u32,
        /// Negotiated outgoing READ limit.
        ord: u32,
    },
    /// The peer refused: an MPA reject (with its private data), or nothing listens (TCP RST).
    Rejected {
        /// ECONNREFUSED, or ECONNRESET when the peer closed during setup.
        errno: Errno,
        /// The peer's private data (empty when nothing listens).
        private_data: Vec<u8>,
        /// What happened, naming the address.
        reason: String,
        /// True when nothing listened (TCP refused the connection); false for an MPA reject
        /// or a peer that closed during setup.
        nothing_listens: bool,
    },
    /// No answer within the timeout, or no route.
    Unreachable {
        /// ETIMEDOUT or EHOSTUNREACH/ENETUNREACH.
        errno: Errno,
        /// What happened, naming the address.
        reason: String,
    },
    /// The handshake failed for a protocol reason.
    ConnectError {
        /// What happened.
        reason: String,
    },
    /// An established connection ended (locally, by the peer, or by a Terminate). The QP is in ERR.
    Disconnected {
        /// Why.
        reason: String,
    },
}

/// The callback that receives a connection's events. Runs on the progress thread: keep it short.
pub type EventSink = Arc<dyn Fn(ConnEvent) + Send + Sync>;

/// Parameters of one side of a connection.
#[derive(Debug, Clone)]
pub struct ConnectParams {
    /// Private data for the peer (at most 512 bytes; more is EINVAL).
    pub private_data: Vec<u8>,
    /// RDMA READs accepted at once as responder (responder_resources).
    pub ird: u32,
    /// RDMA READs outstanding at once as requester (initiator_depth).
    pub ord: u32,
    /// Ask for MPA CRC32c. Defaults to `SOFTRDMA_MPA_CRC=1` in the environment.
    pub crc: bool,
    /// Bound on TCP connect plus the MPA exchange (active side).
    pub timeout: Duration,
    /// Local address to bind before connecting (active side).
    pub src: Option<SocketAddr>,
    /// IP type of service for the TCP connection (IPv4).
    pub tos: Option<u8>,
    /// Active side: request MPA peer-to-peer mode (an RTR before the responder sends), for
    /// responders that need it. Off by default, as Linux siw; defaults to
    /// `SOFTRDMA_IWARP_P2P=1` in the environment ([`p2p_from_env`]). The start-up rules are in
    /// [`crate::handshake`].
    pub p2p: bool,
}

/// `SOFTRDMA_IWARP_P2P=1`: active connections request MPA peer-to-peer mode. The one place
/// the variable is read.
pub fn p2p_from_env() -> bool {
    softrdma_verbs::settings::IWARP_P2P.is_on()
}

/// Default connection setup bound.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for ConnectParams {
    fn default() -> Self {
        ConnectParams {
            private_data: Vec::new(),
            ird: 16,
            ord: 16,
            crc: softrdma_verbs::settings::MPA_CRC.is_on(),
            timeout: DEFAULT_TIMEOUT,
            src: None,
            tos: None,
            p2p: p2p_from_env(),
        }
    }
}

/// How long a connection that sent a Terminate waits for the peer to take it. A peer that
/// stops reading cannot hold the connection (and its fd) longer than this.
pub const TERMINATE_LINGER: Duration = Duration::from_secs(5);

/// A local disconnect within this time of the peer's last bytes holds its FIN until the time
/// is up. Linux siw completes a SEND only after its TX thread retires the WQE, and the peer's
/// FIN flushes a WQE not yet retired with LOC_QP_OP_ERR (`siw_sq_flush`), even though its bytes
/// were delivered and answered: perftest `-R`'s last handshake SEND failed that way in about a
/// third of the runs against a kernel in a TCG guest, where softrdma answered and closed within
/// half a millisecond. Applications see DISCONNECTED this much later at most.
pub const FIN_GRACE: Duration = Duration::from_millis(20);

/// Connections whose FIN is held by [`FIN_GRACE`] now.
pub(crate) static FINS_HELD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// When any connection of the process last received bytes, in nanoseconds after [`rx_epoch`]
/// (0: never). A process that exits without disconnecting closes its sockets at once, so its
/// destructor waits out [`FIN_GRACE`] after this (see [`wait_fin_grace_at_exit`]).
static LAST_RX_NANOS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn rx_epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// Records that a connection received bytes now.
pub(crate) fn note_rx(now: std::time::Instant) {
    let nanos = now.saturating_duration_since(rx_epoch()).as_nanos().max(1);
    LAST_RX_NANOS.store(
        u64::try_from(nanos).unwrap_or(u64::MAX),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// At process exit: waits until every held FIN left ([`wait_held_fins`]) and until
/// [`FIN_GRACE`] passed since any connection's last received bytes, so that the exit's implicit
/// close of a connection the application never disconnected (perftest `-R` exits so after its
/// last handshake) does not reach a Linux siw peer before it retired the WR that sent them.
/// Waits at most `limit` in all.
pub fn wait_fin_grace_at_exit(limit: Duration) {
    let start = std::time::Instant::now();
    wait_held_fins(limit);
    let last = LAST_RX_NANOS.load(std::sync::atomic::Ordering::Relaxed);
    if last == 0 {
        return;
    }
    let until = rx_epoch() + Duration::from_nanos(last) + FIN_GRACE;
    let until = until.min(start + limit);
    let now = std::time::Instant::now();
    if until > now {
        std::thread::sleep(until - now);
    }
}

/// Waits (at most `limit`) until no connection holds its FIN: the process's exit would close
/// the sockets at once (the library's destructor calls this).
pub fn wait_held_fins(limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while FINS_HELD.load(std::sync::atomic::Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Refuses a QP of a soft-RoCE device: soft-iWARP's MPA connection would drive it with the
/// iWARP engine over TCP, not the RoCE transport its device promises.
pub(crate) fn check_iwarp_qp(qp: &softrdma_verbs::Qp, what: &str) -> softrdma_verbs::Result<()> {
    let ctx = qp.inner().pd.context();
    let dev = ctx.device();
    if dev.transport != softrdma_verbs::device::TransportKind::Iwarp {
        softrdma_verbs::bail!(
            Inval,
            "{what}: QP {} belongs to {}, a soft-RoCE device; soft-iWARP connects only QPs of siw devices \
             (connect a RoCE QP with rdma_cm, or move it to RTR and RTS with the peer's QPN and GID)",
            qp.qpn(),
            dev.name
        );
    }
    Ok(())
}
