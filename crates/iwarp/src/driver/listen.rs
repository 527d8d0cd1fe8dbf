//! Listening sockets and incoming connection requests.

use super::conn::{ConnHandle, ConnState, Phase, TcpConn};
use super::{ConnEvent, ConnectParams, EventSink};
use crate::engine::{Engine, EngineConfig};
use crate::handshake::{self, MpaParams};
use socket2::{Domain, Protocol, Socket, Type};
use softrdma_verbs::progress::{Event, Interest, Reactor, Source, Token};
use softrdma_verbs::{bail, Error, Qp, QpDriver, QpState, Result};
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The largest MPA Request or Reply: the 20-byte header and 512 bytes of private data.
pub(crate) const MAX_MPA_FRAME: usize = softrdma_wire::MPA_HEADER_LEN + softrdma_wire::MPA_MAX_PD_LEN;

/// How long an accepted TCP connection may take to send its MPA Request, by default
/// ([`Listener::set_request_timeout`] changes it per listener). A peer that connects and then
/// sends nothing, or only part of a request, is closed after this long.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

type RequestSink = Box<dyn Fn(ConnRequest) + Send + Sync>;

pub(crate) struct ListenShared {
    me: Weak<ListenShared>,
    reactor: &'static Arc<Reactor>,
    token: OnceLock<Token>,
    sock: Mutex<Option<Socket>>,
    fd: i32,
    local: SocketAddr,
    backlog: usize,
    pending: AtomicUsize,
    /// Bound on the MPA Request, in milliseconds.
    request_timeout_ms: AtomicU64,
    /// `accept` failed for lack of resources; retrying on a timer.
    paused: AtomicBool,
    on_request: RequestSink,
}

/// How long a listener waits before accepting again after `accept` failed for lack of
/// resources (EMFILE, ENFILE, ENOBUFS, ENOMEM). Meanwhile it leaves the readiness alone, so the
/// connections waiting in the kernel's queue do not wake the progress thread in a loop.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(100);

impl Source for ListenShared {
    fn on_event(&self, _token: Token, ev: Event) {
        let Ok(guard) = self.sock.lock() else { return };
        let Some(sock) = guard.as_ref() else { return };
        if self.paused.load(Ordering::Acquire) && !ev.timer {
            return;
        }
        loop {
            // Non-blocking and close-on-exec from accept4 itself: no fcntl per connection.
            match sock.accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) {
                Ok((s, peer)) => {
                    self.resume();
                    let peer = peer.as_socket().unwrap_or(self.local);
                    if let Err(e) = self.start_handshake(s, peer) {
                        tracing::warn!(listener = %self.local, %peer, error = %e, "cannot track incoming connection");
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.resume();
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // One connection failed (reset while queued, refused by a firewall hook): next.
                Err(e)
                    if e.kind() == ErrorKind::ConnectionAborted
                        || matches!(e.raw_os_error(), Some(libc::EPROTO | libc::EPERM)) =>
                {
                    tracing::debug!(listener = %self.local, error = %e, "accept: connection dropped");
                }
                Err(e) => {
                    // EMFILE and friends. The listening socket stays readable, so retrying at
                    // once would spin the progress thread: stop watching it and retry later.
                    if !self.paused.swap(true, Ordering::AcqRel) {
                        tracing::warn!(
                            listener = %self.local,
                            error = %e,
                            retry = ?ACCEPT_RETRY,
                            "accept failed: not accepting connections until it succeeds again"
                        );
                        self.set_read_interest(false);
                    }
                    if let Some(t) = self.token.get() {
                        self.reactor.set_timer(*t, Instant::now() + ACCEPT_RETRY);
                    }
                    break;
                }
            }
        }
    }
}

impl ListenShared {
    fn set_read_interest(&self, read: bool) {
        if let Some(t) = self.token.get() {
            self.reactor.set_interest(*t, self.fd, Interest { read, write: false });
        }
    }

    /// Leaves the paused state after `accept` worked (or found the queue empty) again.
    fn resume(&self) {
        if self.paused.swap(false, Ordering::AcqRel) {
            tracing::info!(listener = %self.local, "accepting connections again");
            self.set_read_interest(true);
        }
    }

    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.load(Ordering::Relaxed))
    }

    /// `s` is non-blocking and close-on-exec (accepted so).
    fn start_handshake(&self, s: Socket, peer: SocketAddr) -> Result<()> {
        let _ = s.set_nodelay(true);
        let local = s.local_addr().ok().and_then(|a| a.as_socket()).unwrap_or(self.local);
        let timeout = self.request_timeout();
        let deadline = Instant::now() + timeout;
        let phase = Phase::AwaitRequest {
            deadline,
            timeout,
            listener: self.me.clone(),
        };
        let conn = TcpConn::register(s, local, peer, phase, None, Interest::READ)?;
        conn.set_timer(deadline);
        Ok(())
    }
}

/// Called on the progress thread while a passive connection waits for the MPA Request.
/// A request ready for its listener's callback, delivered once the connection lock is released
/// (the callback may reject or drop the request, which takes that lock).
pub(crate) type Delivery = (Arc<ListenShared>, ConnRequest);

/// Delivers a request to its listener (call without holding the connection's lock).
pub(crate) fn deliver((l, req): Delivery) {
    (l.on_request)(req);
}

pub(crate) fn on_await_request(conn: &TcpConn, st: &mut ConnState, ev: Event) -> Option<Delivery> {
    let Phase::AwaitRequest {
        deadline,
        timeout,
        listener,
    } = &st.phase
    else {
        return None;
    };
    let (deadline, timeout, listener) = (*deadline, *timeout, listener.clone());
    let mut buf = [0u8; 4096];
    let mut eof = false;
    if let Some(sock) = st.sock.as_ref() {
        // Never more than one whole MPA frame: anything the peer sends after its request stays
        // in the socket for the engine, and a peer cannot grow this buffer or keep the
        // progress thread here by sending without pause.
        loop {
            let want = MAX_MPA_FRAME.saturating_sub(st.inbuf.len()).min(buf.len());
            if want == 0 {
                break;
            }
            match std::io::Read::read(&mut &*sock, &mut buf[..want]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => st.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
    }
    match handshake::parse_request(&st.inbuf) {
        Ok(Some((frame, used))) => {
            st.inbuf.drain(..used);
            let Some(l) = listener.upgrade() else {
                reject_now(conn, st, frame.revision, "the listener was closed");
                return None;
            };
            if frame.markers {
                // No application could accept it (the reply cannot agree to markers): reject
                // at once, as Linux siw does, instead of handing over a request that can only fail.
                tracing::warn!(listener = %l.local, peer = %conn.peer, "MPA request asks for markers, which softrdma does not implement: rejecting");
                reject_now(conn, st, frame.revision, "markers requested");
                return None;
            }
            if l.pending.load(Ordering::Acquire) >= l.backlog {
                tracing::warn!(listener = %l.local, peer = %conn.peer, backlog = l.backlog, "backlog full: rejecting connection request");
                reject_now(conn, st, frame.revision, "backlog full");
                return None;
            }
            l.pending.fetch_add(1, Ordering::AcqRel);
            let req = ConnRequest {
                conn: conn.self_arc(),
                private_data: frame.private_data.clone(),
                ird: frame.enhanced.map(|e| e.ird as u32).unwrap_or(0),
                ord: frame.enhanced.map(|e| e.ord as u32).unwrap_or(0),
                peer_addr: conn.peer,
                local_addr: conn.local,
                listener: Arc::downgrade(&l),
                decided: false,
            };
            conn.end_handshake_timer(&st.phase);
            st.phase = Phase::AwaitAccept { request: frame };
            conn.set_write_interest(st, false, false);
            return Some((l, req));
        }
        Ok(None) if eof || ev.error => conn.close(st, None),
        Ok(None) => {
            if Instant::now() >= deadline {
                tracing::warn!(local = %conn.local, peer = %conn.peer, ?timeout, "no complete MPA request within the handshake timeout: closing the connection");
                conn.close(st, None);
            }
        }
        Err(e) => {
            tracing::warn!(peer = %conn.peer, error = %e, "bad MPA request: closing");
            conn.close(st, None);
        }
    }
    None
}

fn reject_now(conn: &TcpConn, st: &mut ConnState, revision: u8, why: &str) {
    if let Ok(bytes) = handshake::build_reject(revision, &[]) {
        if let Some(sock) = st.sock.as_ref() {
            let _ = super::send_nosignal(sock, &bytes);
        }
    }
    tracing::debug!(peer = %conn.peer, why, "connection request rejected");
    conn.close(st, None);
}

/// A listening iWARP endpoint (a TCP listener on `addr`).
pub struct Listener {
    shared: Arc<ListenShared>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Listener({})", self.shared.local)
    }
}

impl Listener {
    /// Listens on `addr`; each connection request that completes its MPA Request goes to
    /// `on_request` (on the progress thread). At most `backlog` requests may await a decision;
    /// more are rejected.
    pub fn bind(
        addr: SocketAddr,
        backlog: u32,
        on_request: impl Fn(ConnRequest) + Send + Sync + 'static,
    ) -> Result<Listener> {
        let domain = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
        let sock = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| Error::os(format!("listen on {addr}: socket"), &e))?;
        sock.set_reuse_address(true)
            .map_err(|e| Error::os("SO_REUSEADDR", &e))?;
        if addr.is_ipv6() {
            let _ = sock.set_only_v6(false);
        }
        sock.bind(&addr.into())
            .map_err(|e| Error::os(format!("listen on {addr}: bind"), &e))?;
        Listener::from_socket(sock, backlog, on_request)
    }

    /// Listens on an already bound socket (e.g. the one `rdma_bind_addr` reserved).
    pub fn from_socket(
        sock: Socket,
        backlog: u32,
        on_request: impl Fn(ConnRequest) + Send + Sync + 'static,
    ) -> Result<Listener> {
        let reactor = Reactor::global()?;
        let _ = sock.set_cloexec(true);
        let addr = sock
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| Error::inval("listen: the socket is not bound to an IP address"))?;
        let backlog = if backlog == 0 { 1024 } else { backlog.min(1 << 16) };
        sock.listen(backlog.max(128) as i32)
            .map_err(|e| Error::os(format!("listen on {addr}"), &e))?;
        sock.set_nonblocking(true).map_err(|e| Error::os("O_NONBLOCK", &e))?;
        let local = sock.local_addr().ok().and_then(|a| a.as_socket()).unwrap_or(addr);
        let fd = sock.as_raw_fd();
        let shared = Arc::new_cyclic(|me| ListenShared {
            me: me.clone(),
            reactor,
            token: OnceLock::new(),
            sock: Mutex::new(Some(sock)),
            fd,
            local,
            backlog: backlog as usize,
            pending: AtomicUsize::new(0),
            request_timeout_ms: AtomicU64::new(REQUEST_TIMEOUT.as_millis() as u64),
            paused: AtomicBool::new(false),
            on_request: Box::new(on_request),
        });
        // As for connections: the first event waits (on the socket lock) until the token is set.
        let hold = shared.sock.lock();
        let token = reactor
            .register(fd, Interest::READ, shared.clone())
            .map_err(|e| Error::os(format!("listen on {addr}: epoll"), &e))?;
        let _ = shared.token.set(token);
        drop(hold);
        Ok(Listener { shared })
    }

    /// Listens and queues requests on a channel (for blocking callers).
    pub fn bind_queue(addr: SocketAddr, backlog: u32) -> Result<(Listener, std::sync::mpsc::Receiver<ConnRequest>)> {
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = Mutex::new(tx);
        let l = Listener::bind(addr, backlog, move |req| {
            if let Ok(t) = tx.lock() {
                let _ = t.send(req);
            }
        })?;
        Ok((l, rx))
    }

    /// The bound address (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// Bounds the time an accepted TCP connection has to deliver its whole MPA Request
    /// (default [`REQUEST_TIMEOUT`]); connections accepted from now on are closed when it passes.
    pub fn set_request_timeout(&self, timeout: Duration) {
        let ms = timeout.as_millis().clamp(1, u64::MAX as u128) as u64;
        self.shared.request_timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// Requests delivered but not yet accepted or rejected.
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::Acquire)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(t) = self.shared.token.get() {
            self.shared.reactor.deregister(*t, Some(self.shared.fd));
        }
        if let Ok(mut s) = self.shared.sock.lock() {
            s.take();
        }
    }
}

/// An incoming connection whose MPA Request arrived. Accept it with a QP, or reject it.
/// Dropping it undecided rejects it.
pub struct ConnRequest {
    conn: Option<Arc<TcpConn>>,
    /// The initiator's private data.
    pub private_data: Vec<u8>,
    /// The initiator's IRD (0 for MPA revision 1).
    pub ird: u32,
    /// The initiator's ORD (0 for MPA revision 1).
    pub ord: u32,
    /// The initiator's address.
    pub peer_addr: SocketAddr,
    /// The local address the request arrived on.
    pub local_addr: SocketAddr,
    listener: Weak<ListenShared>,
    decided: bool,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConnRequest({} -> {})", self.peer_addr, self.local_addr)
    }
}

impl ConnRequest {
    #[cfg(test)]
    pub(crate) fn conn(&self) -> Option<&Arc<TcpConn>> {
        self.conn.as_ref()
    }

    fn decide(&mut self) {
        if !self.decided {
            self.decided = true;
            if let Some(l) = self.listener.upgrade() {
                l.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Accepts with `qp` (in INIT or RTR): sends the MPA Reply and moves the QP to RTS.
    /// The `Established` event is delivered to `sink` before this returns.
    pub fn accept(mut self, qp: &Qp, params: ConnectParams, sink: EventSink) -> Result<ConnHandle> {
        handshake::check_private_data(&params.private_data)?;
        super::check_iwarp_qp(qp, &format!("accept from {}", self.peer_addr))?;
        match qp.state() {
            QpState::Init | QpState::Rtr => {}
            QpState::Rts if qp.inner().driver().is_none() => {}
            s => bail!(
                Inval,
                "accept from {} on QP {}: the QP is in {s}; it must be INIT or RTR",
                self.peer_addr,
                qp.qpn()
            ),
        }
        self.decide();
        let Some(conn) = self.conn.take() else {
            bail!(ConnReset, "accept from {}: connection gone", self.peer_addr)
        };
        let mut st = conn.lock();
        let Phase::AwaitAccept { request } = &st.phase else {
            bail!(
                ConnReset,
                "accept from {}: the peer closed the connection before it was accepted",
                self.peer_addr
            );
        };
        let mpa = MpaParams {
            private_data: params.private_data,
            ird: params.ird,
            ord: params.ord,
            crc: params.crc,
            // The responder follows the request; its own setting does not apply.
            p2p: false,
        };
        let handle = ConnHandle { conn: conn.clone() };
        let revision = request.revision;
        let settled = handshake::build_accept(request, &mpa).and_then(|(reply, neg)| {
            qp.inner()
                .connect_established(Arc::new(handle.clone()), neg.ord.min(255) as u8, neg.ird.min(255) as u8)?;
            Ok((reply, neg))
        });
        let (reply, neg) = match settled {
            Ok(v) => v,
            Err(e) => {
                // The request is decided: refuse it on the wire and close, rather than leave
                // the connection open with nobody to time it out.
                tracing::warn!(peer = %self.peer_addr, error = %e, "accept failed: rejecting the connection");
                if let Ok(bytes) = handshake::build_reject(revision, &[]) {
                    st.set_out(bytes);
                }
                st.flush_blocking_then_close(&conn);
                return Err(e);
            }
        };
        let cfg = EngineConfig {
            crc: neg.crc,
            ird: neg.ird,
            ord: neg.ord,
            initiator: false,
            rtr: neg.rtr,
        };
        let mut engine = Box::new(Engine::new(qp.inner().clone(), cfg));
        let early = std::mem::take(&mut st.inbuf);
        super::conn::feed(&mut engine, &early);
        st.set_out(reply);
        st.set_sink(sink.clone());
        st.phase = Phase::Established {
            engine,
            qp: qp.inner().clone(),
        };
        conn.publish();
        // Reading was off while the application decided.
        conn.read_from_now(&mut st);
        drop(st);
        sink(ConnEvent::Established {
            private_data: neg.peer_private_data,
            ird: neg.ird,
            ord: neg.ord,
        });
        // The Reply goes out from this thread, as a post would (the data path sends it before
        // any FPDU, and turns write interest on if the socket cannot take it all).
        handle.posted();
        Ok(handle)
    }

    /// Rejects with an MPA Reply that has the reject flag and `private_data`.
    pub fn reject(mut self, private_data: &[u8]) -> Result<()> {
        handshake::check_private_data(private_data)?;
        self.decide();
        let Some(conn) = self.conn.take() else { return Ok(()) };
        let mut st = conn.lock();
        let rev = match &st.phase {
            Phase::AwaitAccept { request } => request.revision,
            _ => return Ok(()),
        };
        let bytes = handshake::build_reject(rev, private_data)?;
        st.set_out(bytes);
        st.flush_blocking_then_close(&conn);
        Ok(())
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if self.conn.is_some() {
            let conn = self.conn.take();
            self.decide();
            if let Some(conn) = conn {
                let mut st = conn.lock();
                let rev = match &st.phase {
                    Phase::AwaitAccept { request } => request.revision,
                    _ => 2,
                };
                if let Ok(bytes) = handshake::build_reject(rev, &[]) {
                    st.set_out(bytes);
                }
                st.flush_blocking_then_close(&conn);
            }
        }
    }
}
