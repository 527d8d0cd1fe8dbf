//! Live counters for `softrdma stat`: every QP of this process, readable by another process.
//!
//! Each transport registers its live QPs as [`CounterSource`]s. The first opened device (or
//! the first registration) starts a small server: one thread blocked in `accept` on the abstract Unix socket
//! `@softrdma-stat-<pid>` (so it costs no CPU while nobody asks, and vanishes with the
//! process). A client that connects gets one JSON [`ProcessStats`] and the connection closes.
//! Only a peer of the same user (or root) is answered. `softrdma stat` finds the processes by
//! their socket names in `/proc/net/unix`. Abstract sockets belong to a network namespace: a
//! process in another one is seen from inside it.

use crate::fork::{CloseInChild, PerProcess};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The abstract socket name prefix (`@` in `/proc/net/unix`).
pub const SOCKET_PREFIX: &str = "softrdma-stat-";

/// One QP's counters, in the shape common to both transports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCounters {
    /// Packets (RoCE) or FPDUs (iWARP) sent, retransmissions included.
    pub tx_packets: u64,
    /// Packets or FPDUs received.
    pub rx_packets: u64,
    /// Bytes sent on the wire (RoCE: UDP payloads; iWARP: the TCP stream).
    pub tx_bytes: u64,
    /// Bytes received from the wire.
    pub rx_bytes: u64,
    /// Packets sent again (RoCE go-back-N; iWARP leaves this to TCP: 0).
    pub retransmissions: u64,
    /// ACK timeouts that fired (RoCE).
    pub timeouts: u64,
    /// NAKs sent as responder (RoCE), RNR NAKs included.
    pub naks_sent: u64,
    /// NAKs received as requester (RoCE), RNR NAKs included.
    pub naks_received: u64,
    /// RNR NAKs sent or received (RoCE).
    pub rnr: u64,
    /// Errors: packets dropped as invalid, error NAKs, Terminates sent or received.
    pub errors: u64,
}

impl std::ops::AddAssign for QpCounters {
    fn add_assign(&mut self, o: QpCounters) {
        self.tx_packets += o.tx_packets;
        self.rx_packets += o.rx_packets;
        self.tx_bytes += o.tx_bytes;
        self.rx_bytes += o.rx_bytes;
        self.retransmissions += o.retransmissions;
        self.timeouts += o.timeouts;
        self.naks_sent += o.naks_sent;
        self.naks_received += o.naks_received;
        self.rnr += o.rnr;
        self.errors += o.errors;
    }
}

/// One QP as `softrdma stat` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpStats {
    /// Device name, e.g. `rxe_lo`.
    pub device: String,
    /// `iwarp` or `roce`.
    pub transport: String,
    /// QP number.
    pub qpn: u32,
    /// QP type, e.g. `RC`.
    pub qp_type: String,
    /// QP state, e.g. `RTS`.
    pub state: String,
    /// The counters.
    pub counters: QpCounters,
    /// The transport engine's protocol state in one line (RoCE RC: PSNs, queued work,
    /// timers), when the transport can tell: what a stalled QP is waiting for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

impl QpStats {
    /// The row of `qp` (device, number, type and state from the QP) with these counters.
    pub fn of(qp: &crate::qp::QpInner, transport: &str, counters: QpCounters) -> QpStats {
        QpStats {
            device: qp.pd.context().device().name.clone(),
            transport: transport.into(),
            qpn: qp.qpn,
            qp_type: format!("{:?}", qp.qp_type).to_uppercase(),
            state: qp.state().to_string(),
            counters,
            engine: None,
        }
    }
}

/// What one process answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// Process id.
    pub pid: u32,
    /// Its command name (`/proc/self/comm`).
    pub command: String,
    /// Its live QPs.
    pub qps: Vec<QpStats>,
}

/// A live QP whose counters can be read (implemented by each transport's driver).
pub trait CounterSource: Send + Sync {
    /// The QP's current counters; None once it is gone.
    fn qp_stats(&self) -> Option<QpStats>;
}

/// The live QPs, once per fork generation (a child starts empty; see `crate::fork`).
fn registry() -> &'static Mutex<Vec<Weak<dyn CounterSource>>> {
    static R: PerProcess<Mutex<Vec<Weak<dyn CounterSource>>>> = PerProcess::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

/// Adds a live QP; it leaves the registry when its last strong reference goes. Starts the
/// server on the first registration of this process (again in a forked child).
pub fn register(source: Weak<dyn CounterSource>) {
    let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
    r.retain(|w| w.strong_count() > 0);
    r.push(source);
    drop(r);
    ensure_server();
}

/// The counters of every live QP of this process.
pub fn snapshot() -> ProcessStats {
    let sources: Vec<Arc<dyn CounterSource>> = {
        let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|w| w.strong_count() > 0);
        r.iter().filter_map(Weak::upgrade).collect()
    };
    let mut qps: Vec<QpStats> = sources.iter().filter_map(|s| s.qp_stats()).collect();
    qps.sort_by(|a, b| (&a.device, a.qpn).cmp(&(&b.device, b.qpn)));
    ProcessStats {
        pid: std::process::id(),
        command: std::fs::read_to_string("/proc/self/comm")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
        qps,
    }
}

/// The pid the server runs for (0: none yet); a forked child starts its own.
static SERVER_PID: AtomicU32 = AtomicU32::new(0);

/// Whether this fork generation's counter socket was started (see [`ensure_server`]).
static STARTED: crate::fork::PerProcess<()> = crate::fork::PerProcess::new();

/// Starts this process's counter socket (once per process; again in a forked child). Every
/// device open calls it: the check is an atomic load (no `getpid`).
pub(crate) fn ensure_server() {
    STARTED.get_or_init(start_server);
}

fn start_server() {
    let pid = std::process::id();
    SERVER_PID.store(pid, Ordering::Release);
    let name = format!("{SOCKET_PREFIX}{pid}");
    let listener = match SocketAddr::from_abstract_name(name.as_bytes()).and_then(|a| UnixListener::bind_addr(&a)) {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(%e, "softrdma stat: no counter socket for this process");
            return;
        }
    };
    // A forked child must not keep the parent's socket open (it serves its own).
    let listener = CloseInChild::new(listener);
    let spawned = std::thread::Builder::new()
        .name("softrdma-stat".into())
        .spawn(move || serve(&listener));
    if let Err(e) = spawned {
        tracing::debug!(%e, "softrdma stat: no counter thread for this process");
    }
}

fn serve(listener: &UnixListener) {
    let me = nix::unistd::getuid();
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _round = crate::fork_gate::busy();
        if SERVER_PID.load(Ordering::Acquire) != std::process::id() {
            return;
        }
        if !peer_allowed(&conn, me) {
            continue;
        }
        let _ = conn.set_write_timeout(Some(std::time::Duration::from_secs(1)));
        if let Ok(json) = serde_json::to_vec(&snapshot()) {
            let _ = conn.write_all(&json);
        }
    }
}

fn peer_allowed(conn: &UnixStream, me: nix::unistd::Uid) -> bool {
    match nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(cred) => cred.uid() == 0 || cred.uid() == me.as_raw(),
        Err(_) => false,
    }
}

/// Reads one process's counters from its socket (what `softrdma stat` does).
pub fn query(pid: u32) -> std::io::Result<ProcessStats> {
    use std::io::Read;
    let addr = SocketAddr::from_abstract_name(format!("{SOCKET_PREFIX}{pid}").as_bytes())?;
    let mut conn = UnixStream::connect_addr(&addr)?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    let mut buf = Vec::new();
    conn.read_to_end(&mut buf)?;
    serde_json::from_slice(&buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The pids of processes that serve counters, from `/proc/net/unix`.
pub fn serving_pids() -> Vec<u32> {
    let Ok(text) = std::fs::read_to_string("/proc/net/unix") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|p| p.strip_prefix('@')?.strip_prefix(SOCKET_PREFIX)?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(u32);
    impl CounterSource for Fake {
        fn qp_stats(&self) -> Option<QpStats> {
            Some(QpStats {
                device: "rxe_test".into(),
                transport: "roce".into(),
                qpn: self.0,
                qp_type: "RC".into(),
                state: "RTS".into(),
                counters: QpCounters {
                    tx_packets: u64::from(self.0),
                    ..Default::default()
                },
                engine: None,
            })
        }
    }

    #[test]
    fn another_process_reads_the_live_qps() {
        let a: Arc<dyn CounterSource> = Arc::new(Fake(17));
        let b: Arc<dyn CounterSource> = Arc::new(Fake(18));
        register(Arc::downgrade(&a));
        register(Arc::downgrade(&b));
        drop(b);
        let pid = std::process::id();
        assert!(serving_pids().contains(&pid));
        let got = query(pid).unwrap();
        assert_eq!(got.pid, pid);
        let mine: Vec<_> = got.qps.iter().filter(|q| q.device == "rxe_test").collect();
        assert_eq!(mine.len(), 1, "{got:?}");
        assert_eq!((mine[0].qpn, mine[0].counters.tx_packets), (17, 17));
        drop(a);
    }
}
