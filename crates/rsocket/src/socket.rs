//! One rsocket: the connection state machine over a CM id, and the blocking, non-blocking
//! and polling forms of every call.
//!
//! The socket's number is the fd of its own CM event channel (as rdma-core's is), so it never
//! collides with the process's other descriptors. Progress (CM events, completions, credits)
//! runs on the caller's thread inside each call; a blocking call arms the CQ and sleeps in
//! `poll(2)` on the completion channel and the event channel.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use softrdma_cm::{CmEvent, CmId, CmOption, ConnParam, EventChannel, EventType, PortSpace};
use softrdma_verbs::{Mr, Pd};

use crate::conn::Conn;
use crate::error::{Result, RsError};
use crate::flow::OLAP_START;
use crate::options::Options;
use crate::wire::{ctrl, ConnData, RsIomap, RsSge};

/// How long address and route resolution may take (rdma-core starts at 1 s and retries).
const RESOLVE_MS: i32 = 2000;
/// The longest single sleep of a blocking call before it looks again.
const NAP: Duration = Duration::from_millis(200);
/// How long `rclose` waits for the peer to take the last messages.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Init,
    Bound,
    Listening,
    Resolving,
    Routing,
    Connecting,
    Accepting,
    Connected,
    Disconnected,
    Failed,
}

/// One of this socket's `riomap` regions.
struct Mapping {
    index: Option<u32>,
    offset: u64,
    addr: u64,
    len: usize,
    mr: Option<Mr>,
    announced: bool,
}

struct Inner {
    state: State,
    family: i32,
    opts: Options,
    nonblock: bool,
    id: Option<CmId>,
    conn: Option<Conn>,
    readable: bool,
    writable: bool,
    err: i32,
    why: String,
    requests: VecDeque<CmEvent>,
    mappings: Vec<Mapping>,
    peer: Option<SocketAddr>,
}

/// An rsocket.
pub struct RSocket {
    chan: EventChannel,
    inner: Mutex<Inner>,
}

fn err(errno: i32, msg: impl Into<String>) -> RsError {
    RsError::new(errno, msg)
}

impl std::fmt::Debug for RSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rsocket {}", self.fd())
    }
}

impl RSocket {
    /// `rsocket(domain, type, protocol)`: a stream socket (`SOCK_STREAM`, TCP or 0).
    ///
    /// As rdma-core, `type` takes no flags (`SOCK_CLOEXEC`, `SOCK_NONBLOCK`): such calls fail
    /// with ENOTSUP, which is also how librspreload's `socket()` hands them to the kernel. This
    /// matters here: softrdma's own TCP and UDP sockets (made with `SOCK_CLOEXEC`) then stay
    /// kernel sockets under `LD_PRELOAD=librspreload.so`.
    pub fn new(domain: i32, ty: i32, protocol: i32) -> Result<Arc<RSocket>> {
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return Err(err(
                libc::EOPNOTSUPP,
                format!("rsocket: address family {domain} is not supported (AF_INET and AF_INET6 are)"),
            ));
        }
        if ty == libc::SOCK_DGRAM {
            return Err(err(
                libc::EOPNOTSUPP,
                "rsocket: datagram rsockets (SOCK_DGRAM over UD QPs) are not implemented in softrdma; use SOCK_STREAM",
            ));
        }
        if ty != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
            return Err(err(
                libc::EOPNOTSUPP,
                format!("rsocket: type {ty} protocol {protocol}: rsockets are SOCK_STREAM (no type flags) over TCP semantics"),
            ));
        }
        let chan = EventChannel::new()?;
        let id = CmId::create(Some(&chan), PortSpace::Tcp)?;
        Ok(Arc::new(RSocket {
            chan,
            inner: Mutex::new(Inner {
                state: State::Init,
                family: domain,
                opts: Options::default(),
                nonblock: false,
                id: Some(id),
                conn: None,
                readable: false,
                writable: false,
                err: 0,
                why: String::new(),
                requests: VecDeque::new(),
                mappings: Vec::new(),
                peer: None,
            }),
        }))
    }

    /// The socket's number (its event channel's fd).
    pub fn fd(&self) -> RawFd {
        self.chan.fd()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn name(&self) -> String {
        format!("rsocket {}", self.fd())
    }

    fn id(g: &Inner, what: &str, name: &str) -> Result<CmId> {
        g.id.clone()
            .ok_or_else(|| err(libc::EBADF, format!("{what} on {name}: the socket is closed")))
    }

    /// `rbind`.
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        let mut g = self.lock();
        if g.state != State::Init {
            return Err(err(libc::EINVAL, format!("rbind on {}: already bound", self.name())));
        }
        let id = Self::id(&g, "rbind", &self.name())?;
        if g.opts.reuseaddr {
            id.set_option(CmOption::ReuseAddr(true))?;
        }
        if addr.is_ipv6() && g.opts.v6only {
            id.set_option(CmOption::AfOnly(true))?;
        }
        id.bind_addr(addr)?;
        g.state = State::Bound;
        Ok(())
    }

    /// `rlisten`.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        let mut g = self.lock();
        match g.state {
            State::Bound => {}
            State::Listening => return Ok(()),
            _ => {
                return Err(err(
                    libc::EINVAL,
                    format!("rlisten on {}: bind the socket first (rbind)", self.name()),
                ))
            }
        }
        let id = Self::id(&g, "rlisten", &self.name())?;
        id.listen(backlog.max(1))?;
        g.state = State::Listening;
        Ok(())
    }

    /// `raccept`: the next connection, as a new socket; EAGAIN when non-blocking and none waits.
    pub fn accept(&self) -> Result<Arc<RSocket>> {
        loop {
            let mut g = self.lock();
            if g.state != State::Listening {
                return Err(err(
                    libc::EINVAL,
                    format!("raccept on {}: the socket is not listening", self.name()),
                ));
            }
            self.progress(&mut g);
            while let Some(ev) = g.requests.pop_front() {
                let opts = g.opts;
                let nonblock = g.nonblock;
                match Self::take_request(ev, opts, nonblock, g.family) {
                    Ok(s) => return Ok(s),
                    Err(e) => tracing::warn!("raccept on {}: dropped a connection request: {e}", self.name()),
                }
            }
            if g.nonblock {
                return Err(RsError::again("raccept"));
            }
            self.sleep(g);
        }
    }

    fn take_request(ev: CmEvent, opts: Options, nonblock: bool, family: i32) -> Result<Arc<RSocket>> {
        let id = ev.id.clone();
        let mut param = ev.param.clone();
        ev.ack();
        let peer = match ConnData::decode(&param.private_data) {
            Ok(p) => p,
            Err(e) => {
                let _ = id.reject(&[]);
                let _ = id.destroy();
                return Err(err(libc::EPROTO, e.to_string()));
            }
        };
        let chan = EventChannel::new()?;
        id.migrate(Some(&chan))?;
        let built = Conn::create(&id, &opts.sizes).and_then(|mut conn| {
            conn.start(&peer);
            param.private_data = conn.conn_data().encode().to_vec();
            id.accept(Some(&param))?;
            Ok(conn)
        });
        let conn = match built {
            Ok(c) => c,
            Err(e) => {
                let _ = id.reject(&[]);
                let _ = id.destroy_qp();
                let _ = id.destroy();
                return Err(e);
            }
        };
        let peer_addr = id.peer_addr();
        Ok(Arc::new(RSocket {
            chan,
            inner: Mutex::new(Inner {
                state: State::Accepting,
                family,
                opts,
                nonblock,
                id: Some(id),
                conn: Some(conn),
                readable: true,
                writable: false,
                err: 0,
                why: String::new(),
                requests: VecDeque::new(),
                mappings: Vec::new(),
                peer: peer_addr,
            }),
        }))
    }

    /// `rconnect`: EINPROGRESS when non-blocking (finish with `rpoll` POLLOUT, then SO_ERROR).
    pub fn connect(&self, dst: SocketAddr) -> Result<()> {
        let mut g = self.lock();
        match g.state {
            State::Init | State::Bound => {
                let id = Self::id(&g, "rconnect", &self.name())?;
                if g.state == State::Init && g.opts.reuseaddr {
                    id.set_option(CmOption::ReuseAddr(true))?;
                }
                let src = id.local_addr().filter(|_| g.state == State::Bound);
                id.resolve_addr(src, dst, RESOLVE_MS)?;
                g.state = State::Resolving;
                g.peer = Some(dst);
            }
            State::Resolving | State::Routing | State::Connecting => {
                return Err(err(
                    libc::EALREADY,
                    format!("rconnect on {}: a connect is in progress", self.name()),
                ))
            }
            State::Connected | State::Accepting => {
                return Err(err(
                    libc::EISCONN,
                    format!("rconnect on {}: already connected", self.name()),
                ))
            }
            _ => {
                return Err(err(
                    libc::EINVAL,
                    format!("rconnect on {}: the socket cannot connect in its state", self.name()),
                ))
            }
        }
        loop {
            self.progress(&mut g);
            match g.state {
                State::Connected => return Ok(()),
                State::Failed => {
                    g.err = 0;
                    return Err(err(
                        g.err_or(libc::ECONNREFUSED),
                        format!("rconnect on {}: {}", self.name(), g.why),
                    ));
                }
                _ if g.nonblock => {
                    return Err(err(
                        libc::EINPROGRESS,
                        format!("rconnect on {}: in progress", self.name()),
                    ))
                }
                _ => {}
            }
            self.sleep(g);
            g = self.lock();
        }
    }

    /// Sends (`rsend`); `dontwait` is MSG_DONTWAIT.
    pub fn send(&self, buf: &[u8], dontwait: bool) -> Result<usize> {
        self.write_with("rsend", buf, dontwait, |stream, left, _, olen| {
            Ok(stream.next_chunk(left, olen))
        })
    }

    /// The loop of `rsend` and `riowrite`: progress, announce pending mappings, post the
    /// chunks `next` makes of the rest of `buf` (it gets the bytes left, those done, and the
    /// send's chunk limit), then return what went, fail, or sleep until more can go. An error
    /// of `next` after some bytes went returns those bytes.
    fn write_with(
        &self,
        call: &str,
        buf: &[u8],
        dontwait: bool,
        mut next: impl FnMut(&mut crate::flow::Stream, usize, usize, &mut u32) -> Result<Option<crate::flow::Chunk>>,
    ) -> Result<usize> {
        let mut done = 0usize;
        let mut olen = OLAP_START;
        loop {
            let mut g = self.lock();
            self.progress(&mut g);
            g.writable_or_err(&self.name(), call)?;
            if g.state == State::Connected {
                self.announce_mappings(&mut g)?;
                let conn = g
                    .conn
                    .as_mut()
                    .ok_or_else(|| err(libc::ENOTCONN, format!("{call}: no connection")))?;
                while done < buf.len() {
                    let Some(stream) = conn.stream.as_mut() else { break };
                    let chunk = match next(stream, buf.len() - done, done, &mut olen) {
                        Ok(Some(chunk)) => chunk,
                        Ok(None) => break,
                        Err(_) if done > 0 => return Ok(done),
                        Err(e) => return Err(e),
                    };
                    let end = done + chunk.len as usize;
                    conn.send_chunk(&chunk, &buf[done..end])?;
                    done = end;
                }
            }
            if done == buf.len() {
                return Ok(done);
            }
            if dontwait || g.nonblock {
                return if done > 0 { Ok(done) } else { Err(RsError::again(call)) };
            }
            self.sleep(g);
        }
    }

    /// Receives (`rrecv`): 0 at the end of the stream.
    pub fn recv(&self, buf: &mut [u8], dontwait: bool, peek: bool, waitall: bool) -> Result<usize> {
        let mut done = 0usize;
        loop {
            let mut g = self.lock();
            self.progress(&mut g);
            let has_data = g
                .conn
                .as_ref()
                .and_then(|c| c.stream.as_ref())
                .is_some_and(|s| s.has_data());
            if has_data {
                let conn = g
                    .conn
                    .as_mut()
                    .ok_or_else(|| err(libc::ENOTCONN, "rrecv: no connection"))?;
                done += conn.read_into(&mut buf[done..], peek)?;
                self.progress(&mut g); // credits for what was consumed
                if done == buf.len() || !waitall || peek {
                    return Ok(done);
                }
                continue;
            }
            match g.state {
                State::Connected | State::Accepting if g.readable => {}
                State::Resolving | State::Routing | State::Connecting => {}
                State::Connected | State::Accepting | State::Disconnected => return Ok(done),
                State::Failed => {
                    return if done > 0 {
                        Ok(done)
                    } else {
                        Err(err(
                            g.err_or(libc::ECONNRESET),
                            format!("rrecv on {}: the connection failed: {}", self.name(), g.why),
                        ))
                    }
                }
                _ => {
                    return Err(err(
                        libc::ENOTCONN,
                        format!("rrecv on {}: the socket is not connected", self.name()),
                    ))
                }
            }
            if buf.is_empty() {
                return Ok(0);
            }
            if dontwait || g.nonblock {
                return if done > 0 {
                    Ok(done)
                } else {
                    Err(RsError::again("rrecv"))
                };
            }
            self.sleep(g);
        }
    }

    /// `rshutdown(how)`.
    pub fn shutdown(&self, how: i32) -> Result<()> {
        let mut g = self.lock();
        self.progress(&mut g);
        if !matches!(g.state, State::Connected | State::Accepting) {
            return match g.state {
                State::Disconnected | State::Failed => Ok(()),
                _ => Err(err(
                    libc::ENOTCONN,
                    format!("rshutdown on {}: not connected", self.name()),
                )),
            };
        }
        let what = match how {
            libc::SHUT_RDWR => {
                g.readable = false;
                g.writable = false;
                ctrl::DISCONNECT
            }
            libc::SHUT_WR => {
                g.writable = false;
                if g.readable {
                    ctrl::SHUTDOWN
                } else {
                    ctrl::DISCONNECT
                }
            }
            libc::SHUT_RD => {
                g.readable = false;
                if g.writable {
                    return Ok(());
                }
                ctrl::DISCONNECT
            }
            _ => return Err(err(libc::EINVAL, format!("rshutdown on {}: how = {how}", self.name()))),
        };
        let deadline = Instant::now() + CLOSE_DRAIN;
        loop {
            let posted = match g.conn.as_mut() {
                Some(conn) => match conn.stream.as_mut().and_then(|s| s.ctrl_posts(what)) {
                    Some(posts) => {
                        conn.post(&posts, &[])?;
                        true
                    }
                    None => false,
                },
                None => true,
            };
            if posted || Instant::now() >= deadline {
                break;
            }
            self.sleep(g);
            g = self.lock();
            self.progress(&mut g);
        }
        // wait (bounded) until every send, the control message included, has completed
        while Instant::now() < deadline {
            self.progress(&mut g);
            let done = g
                .conn
                .as_ref()
                .and_then(|c| c.stream.as_ref())
                .is_none_or(|s| s.sends_done());
            if done || g.state == State::Failed {
                break;
            }
            self.sleep(g);
            g = self.lock();
        }
        if what == ctrl::DISCONNECT {
            g.state = State::Disconnected;
        }
        Ok(())
    }

    /// `rclose`: shuts down, disconnects and frees everything.
    pub fn close(&self) -> Result<()> {
        let connected = matches!(self.lock().state, State::Connected | State::Accepting);
        if connected {
            let _ = self.shutdown(libc::SHUT_RDWR);
        }
        let mut g = self.lock();
        let id = g.id.take();
        let conn = g.conn.take();
        let mappings = std::mem::take(&mut g.mappings);
        let requests = std::mem::take(&mut g.requests);
        drop(g);
        for r in requests {
            let rid = r.id.clone();
            r.ack();
            let _ = rid.reject(&[]);
            let _ = rid.destroy();
        }
        if let Some(id) = id {
            if connected {
                let _ = id.disconnect();
            }
            let _ = id.destroy_qp();
            // deregister before the PD goes
            drop(mappings);
            drop(conn);
            id.destroy()?;
        }
        Ok(())
    }

    /// `rfcntl(F_SETFL, O_NONBLOCK)` and `F_GETFL`.
    pub fn set_nonblocking(&self, on: bool) {
        self.lock().nonblock = on;
    }

    /// True when O_NONBLOCK is set.
    pub fn nonblocking(&self) -> bool {
        self.lock().nonblock
    }

    /// `rsetsockopt`.
    pub fn setsockopt(&self, level: i32, name: i32, val: &[u8]) -> Result<()> {
        let mut g = self.lock();
        let connected = g.conn.is_some();
        g.opts.set(level, name, val, connected)?;
        Ok(())
    }

    /// `rgetsockopt`.
    pub fn getsockopt(&self, level: i32, name: i32) -> Result<Vec<u8>> {
        let mut g = self.lock();
        if (level, name) == (libc::SOL_SOCKET, libc::SO_ERROR) {
            self.progress(&mut g);
            let e = std::mem::take(&mut g.err);
            return Ok(e.to_ne_bytes().to_vec());
        }
        g.opts.get(level, name)
    }

    /// The error SO_ERROR would report, without clearing it (0: none).
    pub fn pending_error(&self) -> i32 {
        self.lock().err
    }

    /// `rgetsockname`.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        let g = self.lock();
        let id = Self::id(&g, "rgetsockname", &self.name())?;
        Ok(id.local_addr().unwrap_or_else(|| unspecified(g.family)))
    }

    /// `rgetpeername`: ENOTCONN before a connection.
    pub fn peer_addr(&self) -> Result<SocketAddr> {
        let g = self.lock();
        match g.state {
            State::Connected | State::Accepting | State::Disconnected => {}
            _ => {
                return Err(err(
                    libc::ENOTCONN,
                    format!("rgetpeername on {}: not connected", self.name()),
                ))
            }
        }
        let id = Self::id(&g, "rgetpeername", &self.name())?;
        id.peer_addr()
            .or(g.peer)
            .ok_or_else(|| err(libc::ENOTCONN, "rgetpeername: no peer"))
    }

    /// The `poll(2)` events this socket has now, of `events` (POLLIN, POLLOUT; POLLHUP and
    /// POLLERR always).
    pub fn poll_events(&self, events: i16) -> i16 {
        let mut g = self.lock();
        self.progress(&mut g);
        let mut rev = 0i16;
        match g.state {
            State::Listening if !g.requests.is_empty() => rev |= libc::POLLIN,
            State::Connected | State::Accepting | State::Disconnected | State::Failed => {
                let stream = g.conn.as_ref().and_then(|c| c.stream.as_ref());
                if stream.is_some_and(|s| s.has_data()) || !g.readable {
                    rev |= libc::POLLIN;
                }
                if g.state == State::Connected && g.writable && stream.is_some_and(|s| s.can_send()) {
                    rev |= libc::POLLOUT;
                }
                match g.state {
                    State::Disconnected => rev |= libc::POLLHUP,
                    State::Failed => rev |= libc::POLLERR | libc::POLLHUP,
                    _ => {}
                }
            }
            State::Init | State::Bound => rev |= libc::POLLOUT & events | libc::POLLHUP,
            _ => {}
        }
        rev & (events | libc::POLLHUP | libc::POLLERR)
    }

    /// Arms the socket's wake-ups (for `rpoll`) and looks once more: the fds that become
    /// readable when something changes, or `None` if something changed meanwhile (look at
    /// [`RSocket::poll_events`] again, then call this again before sleeping).
    ///
    /// The look after the arming matters twice: a completion that raced the arming raises
    /// no readiness of its own, and taking its event disarms the CQ again, so sleeping then
    /// would wait for an event that never comes.
    pub fn wait_fds(&self) -> Option<Vec<RawFd>> {
        let mut g = self.lock();
        let mut fds = vec![self.chan.fd()];
        let mut armed = false;
        if let Some(conn) = g.conn.as_mut() {
            if conn.arm().is_ok() {
                fds.push(conn.event_fd());
                armed = true;
            }
        }
        if !self.still_armed_and_quiet(&mut g, armed) {
            return None;
        }
        Some(fds)
    }

    /// After arming (`armed`: the CQ was armed): true if nothing happened and the CQ is still
    /// armed, so that sleeping on the channels is safe. A stale event (for completions
    /// already polled) taken now also disarms the CQ: the caller must arm again first.
    fn still_armed_and_quiet(&self, g: &mut Inner, armed: bool) -> bool {
        !self.progress(g) && (!armed || g.conn.as_ref().is_some_and(|c| c.is_armed()))
    }

    /// Sleeps until something may have changed: arms the CQ, looks once more (a completion
    /// that raced the arming ends the nap at once), then polls both channels.
    fn sleep(&self, mut g: MutexGuard<'_, Inner>) {
        let cq_channel = g.conn.as_mut().and_then(|c| c.arm().ok().map(|_| c.channel.clone()));
        if !self.still_armed_and_quiet(&mut g, cq_channel.is_some()) {
            return;
        }
        drop(g);
        let mut fds = vec![self.chan.as_fd()];
        if let Some(c) = &cq_channel {
            fds.push(c.as_fd());
        }
        crate::poll::sleep_on(&fds, Some(NAP));
    }

    /// Applies CM events and completions, and grants credits; true if anything happened.
    fn progress(&self, g: &mut Inner) -> bool {
        let mut activity = false;
        while let Ok(ev) = self.chan.get_event(Some(Duration::ZERO)) {
            activity = true;
            self.on_cm_event(g, ev);
        }
        let connected = matches!(g.state, State::Connected | State::Accepting);
        let Some(conn) = g.conn.as_mut() else { return activity };
        conn.drain_event();
        match conn.poll(connected) {
            Ok(p) => {
                activity |= p.completions > 0;
                if p.disconnect || p.shutdown || p.failed.is_some() {
                    tracing::debug!(socket = self.fd(), state = ?g.state, ?p, "rsocket: the peer ended the stream");
                }
                if p.disconnect {
                    g.state = State::Disconnected;
                    g.readable = false;
                    g.writable = false;
                } else if p.shutdown {
                    if g.writable {
                        g.readable = false;
                    } else {
                        g.state = State::Disconnected;
                    }
                }
                if let Some(status) = p.failed {
                    if matches!(g.state, State::Connected | State::Accepting) {
                        g.fail(
                            libc::ECONNRESET,
                            format!("a work request completed with {}", status.as_str()),
                        );
                    }
                }
            }
            Err(e) => {
                activity = true;
                g.fail(e.errno, e.msg);
            }
        }
        if matches!(g.state, State::Connected | State::Accepting) {
            if let Some(conn) = g.conn.as_mut() {
                while let Some(posts) = conn.stream.as_mut().and_then(|s| s.credits_due()) {
                    if let Err(e) = conn.post(&posts, &[]) {
                        g.fail(e.errno, e.msg);
                        break;
                    }
                }
            }
        }
        activity
    }

    fn on_cm_event(&self, g: &mut Inner, ev: CmEvent) {
        tracing::debug!(socket = self.fd(), state = ?g.state, event = %ev.event, status = ev.status, "rsocket: cm event");
        let status = ev.status;
        let reason = if ev.reason.is_empty() {
            ev.event.as_str().to_string()
        } else {
            format!("{} ({})", ev.event.as_str(), ev.reason)
        };
        match (ev.event, g.state) {
            (EventType::ConnectRequest, State::Listening) => g.requests.push_back(ev),
            (EventType::AddrResolved, State::Resolving) => {
                ev.ack();
                let r = g.id.as_ref().map(|id| id.resolve_route(RESOLVE_MS));
                match r {
                    Some(Ok(())) => g.state = State::Routing,
                    Some(Err(e)) => g.fail(e.errno.raw(), e.msg),
                    None => {}
                }
            }
            (EventType::RouteResolved, State::Routing) => {
                ev.ack();
                if let Err(e) = self.start_connect(g) {
                    g.fail(e.errno, e.msg);
                }
            }
            (EventType::Established, State::Connecting) => {
                let data = ev.param.private_data.clone();
                ev.ack();
                match ConnData::decode(&data) {
                    Ok(peer) => {
                        if let Some(conn) = g.conn.as_mut() {
                            conn.start(&peer);
                        }
                        g.state = State::Connected;
                        g.readable = true;
                        g.writable = true;
                    }
                    Err(e) => {
                        g.fail(libc::EPROTO, e.to_string());
                        if let Some(id) = g.id.as_ref() {
                            let _ = id.disconnect();
                        }
                    }
                }
            }
            (EventType::Established, State::Accepting) => {
                ev.ack();
                g.state = State::Connected;
                g.writable = true;
            }
            (EventType::Disconnected, State::Connected | State::Accepting) => {
                ev.ack();
                // what already arrived stays readable; the stream ends after it
                g.state = State::Disconnected;
                g.readable = false;
                g.writable = false;
            }
            (
                EventType::AddrError
                | EventType::RouteError
                | EventType::ConnectError
                | EventType::Unreachable
                | EventType::Rejected,
                State::Resolving | State::Routing | State::Connecting | State::Accepting,
            ) => {
                ev.ack();
                let errno = match ev_errno(status) {
                    Some(e) => e,
                    None if reason.contains("REJECTED") => libc::ECONNREFUSED,
                    None => libc::ECONNREFUSED,
                };
                g.fail(errno, reason);
            }
            (EventType::DeviceRemoval, _) => {
                ev.ack();
                g.fail(libc::ENODEV, reason);
            }
            _ => ev.ack(),
        }
    }

    fn start_connect(&self, g: &mut Inner) -> Result<()> {
        let id = Self::id(g, "rconnect", &self.name())?;
        let conn = Conn::create(&id, &g.opts.sizes)?;
        let iwarp = conn.is_iwarp();
        let param = ConnParam {
            private_data: conn.conn_data().encode().to_vec(),
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            // rdma-core: iWARP peers may issue an RDMA READ while connecting
            initiator_depth: u8::from(iwarp),
            ..ConnParam::default()
        };
        g.conn = Some(conn);
        id.connect(&param)?;
        g.state = State::Connecting;
        Ok(())
    }

    fn announce_mappings(&self, g: &mut Inner) -> Result<()> {
        let Inner { conn, mappings, .. } = g;
        let Some(conn) = conn.as_mut() else { return Ok(()) };
        for m in mappings.iter_mut().filter(|m| !m.announced) {
            let (Some(index), Some(mr)) = (m.index, m.mr.as_ref()) else {
                m.announced = true;
                continue;
            };
            let Some(stream) = conn.stream.as_mut() else { break };
            let entry = RsIomap {
                offset: m.offset,
                sge: RsSge {
                    addr: m.addr,
                    key: mr.rkey(),
                    length: m.len as u32,
                },
            };
            let Some(posts) = stream.iomap_posts(index, entry) else {
                break;
            };
            conn.post(&posts, &[])?;
            m.announced = true;
        }
        Ok(())
    }

    /// `riomap`: lets the peer write `[addr, addr + len)` at `offset` (-1: the address) with
    /// `riowrite`. `register` registers the memory in the socket's PD.
    pub fn iomap(
        &self,
        addr: u64,
        len: usize,
        writable: bool,
        offset: i64,
        register: impl FnOnce(&Pd) -> softrdma_verbs::Result<Mr>,
    ) -> Result<i64> {
        let mut g = self.lock();
        let Some(conn) = g.conn.as_ref() else {
            return Err(err(
                libc::EINVAL,
                format!("riomap on {}: the socket is not connected", self.name()),
            ));
        };
        let entries = conn.stream.as_ref().map_or(0, |s| s.remote_iomap_entries());
        let mr = register(conn.pd())?;
        let offset = if offset == -1 { addr as i64 } else { offset };
        let index = if writable {
            let used: Vec<u32> = g.mappings.iter().filter_map(|m| m.index).collect();
            let Some(free) = (0..entries).find(|i| !used.contains(i)) else {
                return Err(err(
                    libc::ENOMEM,
                    format!(
                        "riomap on {}: the peer's iomap table has {entries} entries, all in use (the peer sets its size with RDMA_IOMAPSIZE)",
                        self.name()
                    ),
                ));
            };
            Some(free)
        } else {
            None
        };
        g.mappings.push(Mapping {
            index,
            offset: offset as u64,
            addr,
            len,
            mr: Some(mr),
            announced: index.is_none(),
        });
        Ok(offset)
    }

    /// `riounmap`: EINVAL when no mapping starts at `addr` with `len`.
    pub fn iounmap(&self, addr: u64, len: usize) -> Result<()> {
        let mut g = self.lock();
        let Some(i) = g.mappings.iter().position(|m| m.addr == addr && m.len == len) else {
            return Err(err(
                libc::EINVAL,
                format!("riounmap on {}: no mapping of {len} bytes at {addr:#x}", self.name()),
            ));
        };
        let m = g.mappings.remove(i);
        if let Some(mr) = m.mr {
            mr.dereg()?;
        }
        Ok(())
    }

    /// `riowrite`: writes into the peer's mapped region at `offset`.
    pub fn iowrite(&self, buf: &[u8], offset: u64, dontwait: bool) -> Result<usize> {
        let name = self.name();
        self.write_with("riowrite", buf, dontwait, |stream, left, done, olen| {
            let at = offset + done as u64;
            stream.next_direct(left, at, olen).map_err(|crate::flow::Unmapped| {
                err(
                    libc::EINVAL,
                    format!(
                        "riowrite on {name}: the peer mapped nothing at offset {at} (riomap on the other side first)"
                    ),
                )
            })
        })
    }
}

impl Inner {
    fn fail(&mut self, errno: i32, why: impl Into<String>) {
        let why = why.into();
        tracing::debug!(errno, %why, "rsocket: the connection failed");
        self.state = State::Failed;
        self.err = errno;
        self.why = why;
        self.readable = false;
        self.writable = false;
    }

    fn err_or(&self, dflt: i32) -> i32 {
        if self.err != 0 {
            self.err
        } else {
            dflt
        }
    }

    fn writable_or_err(&self, name: &str, what: &str) -> Result<()> {
        match self.state {
            State::Connected if self.writable => Ok(()),
            State::Accepting | State::Resolving | State::Routing | State::Connecting => Ok(()),
            State::Failed => Err(err(
                self.err_or(libc::ECONNRESET),
                format!("{what} on {name}: the connection failed: {}", self.why),
            )),
            State::Connected | State::Disconnected => Err(err(
                libc::EPIPE,
                format!("{what} on {name}: the connection is shut down for writing"),
            )),
            _ => Err(err(
                libc::ENOTCONN,
                format!("{what} on {name}: the socket is not connected"),
            )),
        }
    }
}

fn ev_errno(status: i32) -> Option<i32> {
    (status < 0).then_some(-status)
}

fn unspecified(family: i32) -> SocketAddr {
    if family == libc::AF_INET6 {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
    } else {
        SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0))
    }
}
