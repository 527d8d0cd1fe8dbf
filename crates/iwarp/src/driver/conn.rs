//! One TCP connection: connect or accept, the MPA exchange, then the engine's data path.

use super::conn_guard::{deliver, ConnGuard};
use super::listen::ListenShared;
use super::{ConnEvent, ConnectParams, EventSink};
use crate::engine::{Engine, EngineConfig, Phase as EnginePhase};
use crate::handshake::{self, MpaParams, ReplyOutcome};
use socket2::{Domain, Protocol, Socket, Type};
use softrdma_verbs::memory::socket_io::{recv_scatter, send_gather, GatherError};
use softrdma_verbs::progress::{Event, Interest, Reactor, Source, Token};
use softrdma_verbs::qp::QpInner;
use softrdma_verbs::{bail, Errno, Error, Qp, QpDriver, QpState, Result};
use std::io::{ErrorKind, Read};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

/// Bytes read from a socket per readiness event before yielding to other connections.
const RX_BUDGET: usize = 8 << 20;

/// Hands bytes that arrived with the MPA exchange to a new engine, all of them, in order.
pub(crate) fn feed(engine: &mut Engine, mut bytes: &[u8]) {
    while !bytes.is_empty() && engine.phase() == EnginePhase::Running {
        let space = engine.rx_space();
        let n = bytes.len().min(space.len());
        space[..n].copy_from_slice(&bytes[..n]);
        engine.rx_commit(n);
        bytes = &bytes[n..];
    }
}

pub(crate) enum Phase {
    Connecting {
        deadline: Instant,
        params: MpaParams,
        qp: Arc<QpInner>,
    },
    AwaitReply {
        deadline: Instant,
        params: MpaParams,
        qp: Arc<QpInner>,
    },
    AwaitRequest {
        deadline: Instant,
        timeout: std::time::Duration,
        listener: Weak<ListenShared>,
    },
    AwaitAccept {
        request: softrdma_wire::MpaFrame,
    },
    Established {
        engine: Box<Engine>,
        /// The QP the engine serves (the engine sees it only as a [`QpHost`](softrdma_verbs::QpHost)).
        qp: Arc<QpInner>,
    },
    Closed,
}

impl Phase {
    /// The bound of a handshake phase.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self {
            Phase::Connecting { deadline, .. }
            | Phase::AwaitReply { deadline, .. }
            | Phase::AwaitRequest { deadline, .. } => Some(*deadline),
            _ => None,
        }
    }
}

pub(crate) struct ConnState {
    pub(crate) phase: Phase,
    pub(crate) sock: Option<Socket>,
    /// Handshake bytes to send before any FPDU.
    out: Vec<u8>,
    /// Bytes read but not yet consumed by the handshake.
    pub(crate) inbuf: Vec<u8>,
    sink: Option<EventSink>,
    disconnect: bool,
    writing: bool,
    /// Set when the engine stopped (a Terminate is queued) but its last bytes cannot leave:
    /// the connection closes at this instant even if the peer never reads them.
    pub(crate) linger: Option<Instant>,
    /// When the engine's held first FPDUs may leave (`Engine::release_tx`): the RTR delay of
    /// a peer-to-peer initiator, or a responder's grace after its Reply was acknowledged.
    tx_release: Option<Instant>,
    /// When the peer's bytes last arrived (see [`super::FIN_GRACE`]).
    last_rx: Option<Instant>,
    /// Until when a local disconnect holds its FIN ([`super::FIN_GRACE`]; counted in
    /// `FINS_HELD`). Fixed when the hold starts: later bytes from the peer do not extend it.
    fin_held: Option<Instant>,
}

impl ConnState {
    pub(crate) fn set_out(&mut self, bytes: Vec<u8>) {
        self.out = bytes;
    }

    pub(crate) fn set_sink(&mut self, sink: EventSink) {
        self.sink = Some(sink);
    }

    /// Sends the pending handshake bytes (a reject fits the socket buffer) and closes.
    pub(crate) fn flush_blocking_then_close(&mut self, conn: &TcpConn) {
        let _ = TcpConn::flush_out(self);
        conn.close(self, None);
    }
}

/// A connection registered with the progress thread.
pub(crate) struct TcpConn {
    me: Weak<TcpConn>,
    reactor: &'static Arc<Reactor>,
    token: OnceLock<Token>,
    fd: i32,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    st: Mutex<ConnState>,
    /// Times the progress thread called this connection (a busy loop shows here).
    pub(crate) wakeups: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for TcpConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpConn({} -> {})", self.local, self.peer)
    }
}

/// The owner's handle on a connection: it is the QP's transport driver, and it disconnects.
#[derive(Debug, Clone)]
pub struct ConnHandle {
    pub(crate) conn: Arc<TcpConn>,
}

impl QpDriver for ConnHandle {
    fn kick(&self) {
        if let Some(t) = self.conn.token.get() {
            self.conn.reactor.kick(*t);
        }
    }

    /// New sends go into the socket on the poster's thread when no other thread is inside
    /// the connection (else the progress thread sends them): the same round the progress
    /// thread runs, without reading.
    fn posted(&self) {
        let sent = match self.conn.try_lock() {
            Some(mut st) => match st.phase {
                Phase::Established { .. } => {
                    self.conn.on_established(&mut st, Event::default());
                    true
                }
                // Nothing goes out any more: the progress thread would find nothing to do.
                Phase::Closed => true,
                _ => false,
            },
            None => false,
        };
        if !sent {
            self.kick();
        }
    }
}

impl ConnHandle {
    /// Closes the connection: the QP moves to ERR and outstanding work flushes. On the
    /// caller's thread when no other thread is inside the connection (as a post), else on the
    /// progress thread.
    pub fn disconnect(&self) {
        self.conn.lock().disconnect = true;
        self.posted();
    }

    /// Local address of the TCP connection.
    pub fn local_addr(&self) -> SocketAddr {
        self.conn.local
    }

    /// Peer address of the TCP connection.
    pub fn peer_addr(&self) -> SocketAddr {
        self.conn.peer
    }

    /// Engine counters (zero before establishment).
    pub fn stats(&self) -> crate::engine::Stats {
        match &self.conn.lock().phase {
            Phase::Established { engine, .. } => engine.stats,
            _ => Default::default(),
        }
    }

    /// True once the connection is closed.
    pub fn is_closed(&self) -> bool {
        matches!(self.conn.lock().phase, Phase::Closed)
    }
}

impl softrdma_verbs::stats::CounterSource for TcpConn {
    fn qp_stats(&self) -> Option<softrdma_verbs::stats::QpStats> {
        let st = self.lock();
        let Phase::Established { engine, qp } = &st.phase else {
            return None;
        };
        Some(softrdma_verbs::stats::QpStats::of(qp, "iwarp", engine.stats.counters()))
    }
}

impl TcpConn {
    /// Makes the established connection visible: its counters to `softrdma stat`, its socket
    /// to a thread that waits for a completion event (`caller`).
    pub(crate) fn publish(self: &Arc<Self>) {
        let weak: Weak<dyn softrdma_verbs::stats::CounterSource> = Arc::downgrade(self) as _;
        softrdma_verbs::stats::register(weak);
        super::caller::add(self);
    }
}

fn addr_domain(a: &SocketAddr) -> Domain {
    if a.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    }
}

impl TcpConn {
    /// The state; the engine's reports are delivered when the guard drops.
    pub(crate) fn lock(&self) -> ConnGuard<'_> {
        ConnGuard(self.st.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The state, unless another thread holds it.
    pub(crate) fn try_lock(&self) -> Option<ConnGuard<'_>> {
        match self.st.try_lock() {
            Ok(st) => Some(ConnGuard(st)),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(ConnGuard(p.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The socket's fd (registered with the progress thread while the connection is open).
    pub(crate) fn fd(&self) -> i32 {
        self.fd
    }

    pub(crate) fn register(
        sock: Socket,
        local: SocketAddr,
        peer: SocketAddr,
        phase: Phase,
        sink: Option<EventSink>,
        interest: Interest,
    ) -> Result<Arc<TcpConn>> {
        let reactor = Reactor::global()?;
        let fd = sock.as_raw_fd();
        let conn = Arc::new_cyclic(|me| TcpConn {
            me: me.clone(),
            reactor,
            token: OnceLock::new(),
            fd,
            local,
            peer,
            st: Mutex::new(ConnState {
                phase,
                sock: Some(sock),
                out: Vec::new(),
                inbuf: Vec::new(),
                sink,
                disconnect: false,
                writing: interest.write,
                linger: None,
                tx_release: None,
                last_rx: None,
                fin_held: None,
            }),
            wakeups: std::sync::atomic::AtomicU64::new(0),
        });
        // The fd may be ready at once. Its first event must not run before the token is known
        // (an interest change made then was lost, and a connection whose write interest stayed
        // on woke the progress thread in a loop forever): hold the state lock, which `on_event`
        // takes first, until the token is set.
        let hold = conn.lock();
        let token = reactor
            .register(fd, interest, conn.clone())
            .map_err(|e| Error::os(format!("iWARP connection {local} -> {peer}: epoll"), &e))?;
        let _ = conn.token.set(token);
        drop(hold);
        Ok(conn)
    }

    pub(crate) fn token(&self) -> Option<Token> {
        self.token.get().copied()
    }

    pub(crate) fn set_timer(&self, deadline: Instant) {
        if let Some(t) = self.token() {
            self.reactor.set_timer(t, deadline);
        }
    }

    /// Withdraws the handshake's bound once the handshake is over (an idle connection must
    /// not wake the progress thread for it later).
    pub(crate) fn end_handshake_timer(&self, phase: &Phase) {
        if let (Some(t), Some(d)) = (self.token(), phase.deadline()) {
            self.reactor.cancel_timer(t, d);
        }
    }

    pub(crate) fn kick(&self) {
        if let Some(t) = self.token() {
            self.reactor.kick(t);
        }
    }

    fn emit(st: &ConnState, ev: ConnEvent) {
        if let Some(s) = &st.sink {
            s(ev);
        }
    }

    /// Closes the socket and leaves the reactor. Emits `ev` if given.
    /// The stream is reset (RST, no FIN) when the engine can no longer frame it.
    pub(crate) fn close(&self, st: &mut ConnState, ev: Option<ConnEvent>) {
        let reset = matches!(&st.phase, Phase::Established { engine, .. } if engine.wants_reset());
        if let Phase::Established { engine, qp } = &mut st.phase {
            engine.local_error("connection closed");
            // The flush completions, before the engine goes with the phase.
            deliver(engine);
            qp.detach_driver();
        }
        st.phase = Phase::Closed;
        if st.fin_held.take().is_some() {
            super::FINS_HELD.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
        if let Some(sock) = st.sock.take() {
            if reset {
                // SO_LINGER 0: close() sends RST and drops what is unsent.
                let _ = sock.set_linger(Some(std::time::Duration::ZERO));
            } else {
                let _ = sock.shutdown(std::net::Shutdown::Both);
            }
            if let Some(t) = self.token() {
                self.reactor.deregister(t, Some(self.fd));
            }
            drop(sock);
        }
        if let Some(ev) = ev {
            Self::emit(st, ev);
        }
        st.sink = None;
    }

    /// Sets the connection's epoll interest, keeping `st.writing` in step (never set it around this).
    pub(crate) fn set_write_interest(&self, st: &mut ConnState, write: bool, read: bool) {
        if st.writing != write || !read {
            st.writing = write;
            if let Some(t) = self.token() {
                self.reactor.set_interest(t, self.fd, Interest { read, write });
            }
        }
    }

    /// Turns read interest on and write interest off: a passive connection, whose reading
    /// was off while the application decided, starts carrying traffic.
    pub(crate) fn read_from_now(&self, st: &mut ConnState) {
        st.writing = false;
        if let Some(t) = self.token() {
            self.reactor.set_interest(t, self.fd, Interest::READ);
        }
    }

    /// Writes handshake bytes; returns false on a fatal socket error.
    fn flush_out(st: &mut ConnState) -> std::io::Result<bool> {
        let Some(sock) = st.sock.as_ref() else { return Ok(false) };
        while !st.out.is_empty() {
            match super::send_nosignal(sock, &st.out) {
                Ok(n) => {
                    st.out.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads into `inbuf` what is available, up to one whole MPA frame (what follows the
    /// Reply stays in the socket for the engine). Ok(true) on EOF.
    fn read_some(st: &mut ConnState) -> std::io::Result<bool> {
        let Some(sock) = st.sock.as_ref() else { return Ok(true) };
        let mut buf = [0u8; 4096];
        loop {
            let want = super::listen::MAX_MPA_FRAME
                .saturating_sub(st.inbuf.len())
                .min(buf.len());
            if want == 0 {
                return Ok(false);
            }
            match (&*sock).read(&mut buf[..want]) {
                Ok(0) => return Ok(true),
                Ok(n) => st.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn on_connecting(&self, st: &mut ConnState, ev: Event) {
        let (deadline, params, qp) = match &st.phase {
            Phase::Connecting { deadline, params, qp } => (*deadline, params.clone(), qp.clone()),
            _ => return,
        };
        let peer = self.peer;
        let err = st.sock.as_ref().and_then(|s| s.take_error().ok().flatten());
        if let Some(e) = err {
            let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
            let ev = if errno == Errno::ConnRefused {
                ConnEvent::Rejected {
                    errno,
                    private_data: Vec::new(),
                    reason: format!("connect to {peer}: connection refused (nothing listens on that port)"),
                    nothing_listens: true,
                }
            } else {
                ConnEvent::Unreachable {
                    errno,
                    reason: format!("connect to {peer}: {e}"),
                }
            };
            return self.close(st, Some(ev));
        }
        if ev.writable {
            let me = st
                .sock
                .as_ref()
                .and_then(|s| s.local_addr().ok())
                .and_then(|a| a.as_socket());
            if me == Some(peer) {
                // TCP simultaneous-open onto our own port: nothing listens there.
                let reason = format!("connect to {peer}: connection refused (nothing listens on that port; the connection looped back onto its own socket)");
                return self.close(
                    st,
                    Some(ConnEvent::Rejected {
                        errno: Errno::ConnRefused,
                        private_data: Vec::new(),
                        reason,
                        nothing_listens: true,
                    }),
                );
            }
            match handshake::build_request(&params) {
                Ok(req) => st.out = req,
                Err(e) => return self.close(st, Some(ConnEvent::ConnectError { reason: e.msg })),
            }
            st.phase = Phase::AwaitReply { deadline, params, qp };
            self.set_write_interest(st, false, true);
            if let Err(e) = Self::flush_out(st) {
                let reason = format!("connect to {peer}: {e}");
                self.close(
                    st,
                    Some(ConnEvent::Unreachable {
                        errno: Errno::ConnReset,
                        reason,
                    }),
                );
            }
        } else if Instant::now() >= deadline {
            self.close(
                st,
                Some(ConnEvent::Unreachable {
                    errno: Errno::TimedOut,
                    reason: format!("connect to {peer}: no answer within the connect timeout"),
                }),
            );
        }
    }

    fn on_await_reply(&self, st: &mut ConnState, ev: Event) {
        let (deadline, params, qp) = match &st.phase {
            Phase::AwaitReply { deadline, params, qp } => (*deadline, params.clone(), qp.clone()),
            _ => return,
        };
        let peer = self.peer;
        if let Err(e) = Self::flush_out(st) {
            return self.close(
                st,
                Some(ConnEvent::Rejected {
                    errno: Errno::ConnReset,
                    private_data: Vec::new(),
                    reason: format!("connect to {peer}: {e}"),
                    nothing_listens: false,
                }),
            );
        }
        let eof = match Self::read_some(st) {
            Ok(eof) => eof,
            Err(e) => {
                return self.close(
                    st,
                    Some(ConnEvent::Rejected {
                        errno: Errno::ConnReset,
                        private_data: Vec::new(),
                        reason: format!("connect to {peer}: {e}"),
                        nothing_listens: false,
                    }),
                )
            }
        };
        match handshake::parse_reply(&st.inbuf, &params) {
            Ok(Some((ReplyOutcome::Rejected(pd), _))) => {
                let reason = format!("connect to {peer}: the peer rejected the connection");
                self.close(
                    st,
                    Some(ConnEvent::Rejected {
                        errno: Errno::ConnRefused,
                        private_data: pd,
                        reason,
                        nothing_listens: false,
                    }),
                )
            }
            Ok(Some((ReplyOutcome::Accepted(neg), used))) => {
                let rest = st.inbuf.split_off(used);
                st.inbuf.clear();
                let cfg = EngineConfig {
                    crc: neg.crc,
                    ird: neg.ird,
                    ord: neg.ord,
                    initiator: true,
                    rtr: neg.rtr,
                };
                // Keep the first FPDU (or the RTR) out of a Linux siw responder's accept window
                // (handshake docs).
                st.tx_release = Some(Instant::now() + handshake::RTR_DELAY);
                let Some(conn) = self.self_arc() else { return };
                conn.publish();
                let handle = ConnHandle { conn };
                if let Err(e) = qp.connect_established(Arc::new(handle), neg.ord.min(255) as u8, neg.ird.min(255) as u8)
                {
                    return self.close(st, Some(ConnEvent::ConnectError { reason: e.msg }));
                }
                let mut engine = Box::new(Engine::new(qp.clone(), cfg));
                feed(&mut engine, &rest);
                tracing::debug!(%peer, crc = neg.crc, rtr = ?neg.rtr, ird = neg.ird, ord = neg.ord, "iWARP connection established (active)");
                self.end_handshake_timer(&st.phase);
                st.phase = Phase::Established { engine, qp };
                Self::emit(
                    st,
                    ConnEvent::Established {
                        private_data: neg.peer_private_data,
                        ird: neg.ird,
                        ord: neg.ord,
                    },
                );
                self.on_established(
                    st,
                    Event {
                        kicked: true,
                        ..Event::default()
                    },
                );
            }
            Ok(None) if eof || ev.error => {
                let reason = format!("connect to {peer}: the peer closed the connection during MPA setup");
                self.close(
                    st,
                    Some(ConnEvent::Rejected {
                        errno: Errno::ConnReset,
                        private_data: Vec::new(),
                        reason,
                        nothing_listens: false,
                    }),
                )
            }
            Ok(None) => {
                if Instant::now() >= deadline {
                    let reason = format!("connect to {peer}: no MPA reply within the connect timeout");
                    self.close(
                        st,
                        Some(ConnEvent::Unreachable {
                            errno: Errno::TimedOut,
                            reason,
                        }),
                    )
                }
            }
            Err(e) => self.close(
                st,
                Some(ConnEvent::ConnectError {
                    reason: format!("connect to {peer}: {}", e.msg),
                }),
            ),
        }
    }

    /// A strong handle to this connection (the reactor keeps it alive while registered).
    pub(crate) fn self_arc(&self) -> Option<Arc<TcpConn>> {
        self.me.upgrade()
    }

    /// The data path: read, hand to the engine, write what it produced.
    pub(crate) fn on_established(&self, st: &mut ConnState, ev: Event) {
        let ConnState {
            phase,
            sock,
            out,
            last_rx,
            ..
        } = st;
        let Phase::Established { engine, .. } = phase else {
            return;
        };
        let Some(sock) = sock.as_ref() else { return };
        let mut closed: Option<String> = None;
        // Handshake bytes (the MPA Reply) go first.
        while !out.is_empty() {
            match super::send_nosignal(sock, out) {
                Ok(n) => {
                    out.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    closed = Some(format!("send failed: {e}"));
                    break;
                }
            }
        }
        if ev.readable || ev.error || ev.kicked {
            let mut budget = RX_BUDGET;
            while budget > 0 && engine.phase() == EnginePhase::Running {
                let got = {
                    let mut parts = Vec::with_capacity(2);
                    engine.rx_scatter(&mut parts);
                    recv_scatter(sock.as_fd(), &mut parts, libc::MSG_DONTWAIT)
                };
                match got {
                    Ok(0) => {
                        closed = Some("the peer closed the connection".into());
                        break;
                    }
                    Ok(n) => {
                        engine.rx_received(n);
                        // Completions as they happen, not after the whole budget.
                        deliver(engine);
                        budget = budget.saturating_sub(n);
                        let now = Instant::now();
                        *last_rx = Some(now);
                        super::note_rx(now);
                    }
                    Err(GatherError::Revoked { .. }) => engine.rx_direct_lost("its memory region was deregistered"),
                    Err(GatherError::Io(e)) if e.raw_os_error() == Some(libc::EFAULT) => {
                        engine.rx_direct_lost("its pages are no longer mapped writable")
                    }
                    Err(GatherError::Io(e)) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(GatherError::Io(e)) if e.kind() == ErrorKind::Interrupted => {}
                    Err(GatherError::Io(e)) => {
                        closed = Some(format!("connection lost: {e}"));
                        break;
                    }
                }
            }
            // After a Terminate nothing more is processed. Read and drop what the peer still
            // sends, so that unread bytes or its FIN do not keep the socket readable (which would
            // wake the progress thread in a loop), and notice when it closes.
            let mut discard = [0u8; 16384];
            while budget > 0 && closed.is_none() && engine.phase() != EnginePhase::Running {
                match (&*sock).read(&mut discard) {
                    Ok(0) => closed = Some("the peer closed the connection".into()),
                    Ok(n) => budget = budget.saturating_sub(n),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => closed = Some(format!("connection lost: {e}")),
                }
            }
            if budget == 0 {
                self.kick();
            }
        }
        if st.disconnect && closed.is_none() && !self.hold_fin(st) {
            closed = Some("disconnected locally".into());
        }
        let ConnState {
            phase,
            sock,
            out,
            tx_release,
            ..
        } = st;
        let Phase::Established { engine, .. } = phase else {
            return;
        };
        let Some(sock) = sock.as_ref() else { return };
        let mut blocked = !out.is_empty();
        if !blocked && engine.tx_release_pending() {
            self.pace_first_fpdu(engine, tx_release);
        }
        if !blocked {
            loop {
                engine.fill_tx();
                let sent = {
                    let mut parts = Vec::with_capacity(32);
                    engine.tx_gather(&mut parts);
                    if parts.is_empty() {
                        break;
                    }
                    send_gather(sock.as_fd(), &parts, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
                };
                match sent {
                    Ok(n) => {
                        engine.tx_consumed(n);
                        deliver(engine);
                    }
                    Err(GatherError::Revoked { index }) => {
                        engine.tx_memory_lost(index, "its memory region was deregistered")
                    }
                    Err(GatherError::Io(e)) if e.raw_os_error() == Some(libc::EFAULT) => {
                        engine.tx_memory_lost(0, "its pages are no longer mapped readable")
                    }
                    Err(GatherError::Io(e)) if e.kind() == ErrorKind::WouldBlock => {
                        blocked = true;
                        break;
                    }
                    Err(GatherError::Io(e)) if e.kind() == ErrorKind::Interrupted => {}
                    Err(GatherError::Io(e)) => {
                        closed.get_or_insert(format!("send failed: {e}"));
                        break;
                    }
                }
            }
        }
        if engine.wants_reset() {
            let why = engine.close_reason.clone().unwrap_or_default();
            tracing::warn!(peer = %self.peer, %why, "resetting the iWARP connection");
            return self.close(st, Some(ConnEvent::Disconnected { reason: why }));
        }
        let engine_done = engine.phase() != EnginePhase::Running && !engine.wants_tx();
        if let Some(reason) = closed {
            // SENDs and WRITEs the socket took have completed already; the rest flushes.
            engine.peer_closed(&reason);
            let why = engine.close_reason.clone().unwrap_or(reason);
            tracing::debug!(peer = %self.peer, %why, "iWARP connection closed");
            return self.close(st, Some(ConnEvent::Disconnected { reason: why }));
        }
        if engine_done {
            // A local flush (the application disconnected, or moved or destroyed the QP):
            // the FIN may wait. A Terminate has its own linger below.
            let local = engine.phase() == EnginePhase::Closed;
            if (st.disconnect || local) && self.hold_fin(st) {
                return;
            }
            let ConnState { phase, .. } = st;
            let Phase::Established { engine, .. } = phase else {
                return;
            };
            let why = engine
                .close_reason
                .clone()
                .unwrap_or_else(|| "QP moved to the error state".into());
            // Let the Terminate reach the peer before the FIN.
            return self.close(st, Some(ConnEvent::Disconnected { reason: why }));
        }
        if engine.phase() != EnginePhase::Running {
            // The Terminate waits behind bytes the peer does not read. Wait for it a bounded time.
            let now = Instant::now();
            match st.linger {
                None => {
                    st.linger = Some(now + super::TERMINATE_LINGER);
                    self.set_timer(now + super::TERMINATE_LINGER);
                }
                Some(at) if now >= at => {
                    let why = engine.close_reason.clone().unwrap_or_default();
                    tracing::warn!(peer = %self.peer, %why, linger = ?super::TERMINATE_LINGER, "the peer did not read our Terminate: closing the connection");
                    let reason = format!(
                        "{why} (the Terminate was not delivered: the peer read nothing for {:?})",
                        super::TERMINATE_LINGER
                    );
                    return self.close(st, Some(ConnEvent::Disconnected { reason }));
                }
                Some(_) => {}
            }
        }
        self.set_write_interest(st, blocked, true);
    }
}

impl TcpConn {
    /// True while a local disconnect's FIN waits for [`super::FIN_GRACE`] after the peer's
    /// last bytes (the peer's stack may not have retired the WR that sent them); arms the
    /// timer that ends the wait.
    fn hold_fin(&self, st: &mut ConnState) -> bool {
        let until = match st.fin_held {
            Some(at) => Some(at),
            None => {
                let at = st.last_rx.map(|t| t + super::FIN_GRACE);
                if at.is_some_and(|at| Instant::now() < at) {
                    st.fin_held = at;
                    super::FINS_HELD.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                }
                st.fin_held
            }
        };
        match until {
            Some(at) if Instant::now() < at => {
                self.set_timer(at);
                true
            }
            _ => false,
        }
    }

    /// Releases the engine's held first FPDUs when their time came, or sets a timer for it.
    /// A responder's grace starts once the peer's TCP acknowledged the MPA Reply (the only
    /// bytes sent so far), so that a delayed or retransmitted Reply cannot arrive together
    /// with the first FPDU (see `crate::handshake`).
    fn pace_first_fpdu(&self, engine: &mut Engine, tx_release: &mut Option<Instant>) {
        let now = Instant::now();
        let at = match *tx_release {
            Some(at) => at,
            None => {
                let acked = softrdma_verbs::progress::socket_unacked(self.fd).is_none_or(|u| u == 0);
                if !acked {
                    self.set_timer(now + ACK_POLL);
                    return;
                }
                let at = now + handshake::FIRST_SEND_GRACE;
                *tx_release = Some(at);
                at
            }
        };
        if now >= at {
            tracing::trace!(peer = %self.peer, "first FPDUs released");
            engine.release_tx();
        } else {
            self.set_timer(at);
        }
    }
}

/// How often a responder looks whether its MPA Reply was acknowledged.
const ACK_POLL: std::time::Duration = std::time::Duration::from_millis(2);

impl Source for TcpConn {
    fn on_event(&self, _token: Token, ev: Event) {
        self.wakeups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut st = self.lock();
        match st.phase {
            Phase::Connecting { .. } => self.on_connecting(&mut st, ev),
            Phase::AwaitReply { .. } => self.on_await_reply(&mut st, ev),
            Phase::AwaitRequest { .. } => {
                if let Some(d) = super::listen::on_await_request(self, &mut st, ev) {
                    drop(st);
                    super::listen::deliver(d);
                }
            }
            Phase::AwaitAccept { .. } => {
                // Read interest is off while the application decides, so only a hang-up or an
                // error is reported here. Both are level-triggered: close now, or they would
                // wake the progress thread in a loop until the decision. `accept` then fails
                // with ECONNRESET.
                if ev.error || ev.readable {
                    tracing::debug!(peer = %self.peer, "the peer hung up before its connection request was decided: closing");
                    self.close(&mut st, None);
                }
            }
            Phase::Established { .. } => self.on_established(&mut st, ev),
            Phase::Closed => {}
        }
    }
}

/// Starts an active connection for `qp` to `dst`. Events go to `sink`.
pub fn connect(qp: &Qp, dst: SocketAddr, params: ConnectParams, sink: EventSink) -> Result<ConnHandle> {
    check_connectable(qp, dst, &params)?;
    // Non-blocking and close-on-exec (socket2 adds SOCK_CLOEXEC) from socket() itself.
    let sock = Socket::new(addr_domain(&dst), Type::STREAM.nonblocking(), Some(Protocol::TCP))
        .map_err(|e| Error::os(format!("connect to {dst}: socket"), &e))?;
    if let Some(src) = params.src {
        // As siw's active side: the port is usable again at once after the connection.
        let _ = sock.set_reuse_address(true);
        sock.bind(&src.into())
            .map_err(|e| Error::os(format!("connect to {dst}: bind {src}"), &e))?;
    }
    connect_checked(sock, qp, dst, params, sink)
}

/// What [`connect`] and [`connect_socket`] refuse before they touch the network: private data
/// too long, a QP that is not soft-iWARP's, or one in a state that cannot connect.
fn check_connectable(qp: &Qp, dst: SocketAddr, params: &ConnectParams) -> Result<()> {
    handshake::check_private_data(&params.private_data)?;
    super::check_iwarp_qp(qp, &format!("connect to {dst}"))?;
    match qp.state() {
        QpState::Init | QpState::Rtr => {}
        QpState::Rts if qp.inner().driver().is_none() => {}
        s => bail!(
            Inval,
            "connect QP {} to {dst}: the QP is in {s}; it must be INIT or RTR",
            qp.qpn()
        ),
    }
    Ok(())
}

/// Like [`connect`], from a socket the caller already created (and possibly bound, e.g. to
/// keep a port reserved since `rdma_bind_addr`), close-on-exec as socket2 and std create
/// them, non-blocking or not.
pub fn connect_socket(
    sock: Socket,
    qp: &Qp,
    dst: SocketAddr,
    params: ConnectParams,
    sink: EventSink,
) -> Result<ConnHandle> {
    check_connectable(qp, dst, &params)?;
    // std's way: one ioctl (FIONBIO), where socket2's is fcntl F_GETFL then F_SETFL.
    let sock = std::net::TcpStream::from(sock);
    sock.set_nonblocking(true).map_err(|e| Error::os("O_NONBLOCK", &e))?;
    connect_checked(Socket::from(sock), qp, dst, params, sink)
}

/// [`connect_socket`] once [`check_connectable`] passed.
fn connect_checked(
    sock: Socket,
    qp: &Qp,
    dst: SocketAddr,
    params: ConnectParams,
    sink: EventSink,
) -> Result<ConnHandle> {
    sock.set_nodelay(true).map_err(|e| Error::os("TCP_NODELAY", &e))?;
    if let Some(tos) = params.tos {
        if dst.is_ipv4() {
            let _ = sock.set_tos(tos as u32);
        }
    }
    match sock.connect(&dst.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(Error::os(format!("connect to {dst}"), &e)),
    }
    let local = sock.local_addr().ok().and_then(|a| a.as_socket()).unwrap_or(dst);
    let deadline = Instant::now() + params.timeout;
    let mpa = MpaParams {
        private_data: params.private_data,
        ird: params.ird,
        ord: params.ord,
        crc: params.crc,
        p2p: params.p2p,
    };
    let phase = Phase::Connecting {
        deadline,
        params: mpa,
        qp: qp.inner().clone(),
    };
    let conn = TcpConn::register(
        sock,
        local,
        dst,
        phase,
        Some(sink),
        Interest {
            read: true,
            write: true,
        },
    )?;
    conn.set_timer(deadline);
    Ok(ConnHandle { conn })
}

/// Connects and waits for the outcome. On success returns the handle and the peer's private data.
pub fn connect_blocking(qp: &Qp, dst: SocketAddr, params: ConnectParams) -> Result<(ConnHandle, Vec<u8>)> {
    let timeout = params.timeout;
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    let sink: EventSink = Arc::new(move |ev| {
        if let Ok(t) = tx.lock() {
            let _ = t.send(ev);
        }
    });
    let handle = connect(qp, dst, params, sink)?;
    match rx.recv_timeout(timeout + std::time::Duration::from_secs(1)) {
        Ok(ConnEvent::Established { private_data, .. }) => Ok((handle, private_data)),
        Ok(ConnEvent::Rejected { errno, reason, .. }) => Err(Error::new(errno, reason)),
        Ok(ConnEvent::Unreachable { errno, reason }) => Err(Error::new(errno, reason)),
        Ok(ConnEvent::ConnectError { reason }) => Err(Error::new(Errno::Proto, reason)),
        Ok(ConnEvent::Disconnected { reason }) => Err(Error::new(Errno::ConnReset, reason)),
        Err(_) => {
            handle.disconnect();
            Err(Error::new(
                Errno::TimedOut,
                format!("connect to {dst}: no outcome within {timeout:?}"),
            ))
        }
    }
}
