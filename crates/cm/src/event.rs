//! CM events and the event channel (`rdma_event_channel`): an fd readable while events wait.

use crate::id::{CmId, IdInner};
use crate::param::{ConnParam, UdParam};
use softrdma_verbs::progress::Reactor;
use softrdma_verbs::{Errno, Error, Result};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Event types (`enum rdma_cm_event_type`, same numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EventType {
    /// Address resolution succeeded.
    AddrResolved = 0,
    /// Address resolution failed.
    AddrError = 1,
    /// Route resolution succeeded.
    RouteResolved = 2,
    /// Route resolution failed.
    RouteError = 3,
    /// A connection request arrived on a listener (carries a new id).
    ConnectRequest = 4,
    /// Active side without a QP: the peer accepted.
    ConnectResponse = 5,
    /// Connection setup failed.
    ConnectError = 6,
    /// The peer did not answer.
    Unreachable = 7,
    /// The peer rejected (status: -ECONNREFUSED on iWARP).
    Rejected = 8,
    /// The connection is up.
    Established = 9,
    /// The connection is down.
    Disconnected = 10,
    /// The device went away.
    DeviceRemoval = 11,
    /// Multicast join done.
    MulticastJoin = 12,
    /// Multicast error.
    MulticastError = 13,
    /// Address change.
    AddrChange = 14,
    /// Time-wait ended.
    TimewaitExit = 15,
}

impl EventType {
    /// `rdma_event_str` text.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            EventType::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            EventType::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            EventType::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            EventType::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            EventType::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            EventType::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            EventType::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            EventType::Rejected => "RDMA_CM_EVENT_REJECTED",
            EventType::Established => "RDMA_CM_EVENT_ESTABLISHED",
            EventType::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            EventType::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            EventType::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            EventType::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            EventType::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            EventType::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One CM event (`struct rdma_cm_event`). Acknowledge it with [`CmEvent::ack`] (or drop it).
#[derive(Debug)]
pub struct CmEvent {
    /// The id the event is for (for CONNECT_REQUEST: the new passive id).
    pub id: CmId,
    /// For CONNECT_REQUEST: the listening id.
    pub listen_id: Option<CmId>,
    /// What happened.
    pub event: EventType,
    /// 0, a negative errno, or a transport-specific positive reason.
    pub status: i32,
    /// Connection parameters (private data, resources) for connection events.
    pub param: ConnParam,
    /// Human-readable detail (address, device, reason), for errors.
    pub reason: String,
    /// For UD ids (RDMA_PS_UDP over RoCE): CONNECT_REQUEST and ESTABLISHED carry
    /// `rdma_cm_event.param.ud` (this, with `param.private_data`) instead of `param.conn`.
    pub ud: Option<UdParam>,
    acked: bool,
}

impl CmEvent {
    pub(crate) fn new(id: CmId, event: EventType, status: i32) -> CmEvent {
        CmEvent {
            id,
            listen_id: None,
            event,
            status,
            param: ConnParam::default(),
            reason: String::new(),
            ud: None,
            acked: false,
        }
    }

    /// Acknowledges the event (`rdma_ack_cm_event`); `destroy` waits for this.
    pub fn ack(mut self) {
        self.do_ack();
    }

    fn do_ack(&mut self) {
        if !self.acked {
            self.acked = true;
            // A CONNECT_REQUEST counts against its listener (as in librdmacm), others their id.
            match &self.listen_id {
                Some(l) if self.event == EventType::ConnectRequest => l.inner().event_acked(),
                _ => self.id.inner().event_acked(),
            }
        }
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        self.do_ack();
    }
}

#[derive(Debug)]
pub(crate) struct ChannelInner {
    fd: OwnedFd,
    queue: Mutex<Queue>,
    arrived: Condvar,
}

/// A channel's events, and what its waiters and its fd know of them.
#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<CmEvent>,
    /// Threads waiting on `arrived` (a push without them makes no `futex` call).
    waiters: u32,
    /// The eventfd's counter is not zero (written by a push, read when the queue empties).
    signalled: bool,
}

/// An event channel (`rdma_event_channel`). Cloning shares it.
///
/// Ids created on a channel report what happens to them as [`CmEvent`]s; wait with
/// [`EventChannel::get_event`], or poll [`EventChannel::fd`] in an event loop.
///
/// ```
/// use softrdma_cm::{CmId, EventChannel, EventType, PortSpace};
/// use std::time::Duration;
///
/// let events = EventChannel::new()?;
/// assert!(events.get_event(Some(Duration::from_millis(10))).is_err()); // nothing yet
/// let id = CmId::create(Some(&events), PortSpace::Tcp)?;
/// id.resolve_addr(None, "127.0.0.1:7471".parse().expect("an address"), 2000)?;
/// let ev = events.get_event(Some(Duration::from_secs(10)))?;
/// assert_eq!((ev.event, ev.status, &ev.id), (EventType::AddrResolved, 0, &id));
/// ev.ack(); // rdma_ack_cm_event; dropping an event acknowledges it too
/// id.destroy()?;
/// # Ok::<(), softrdma_verbs::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl PartialEq for EventChannel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl EventChannel {
    /// Creates a channel (`rdma_create_event_channel`).
    pub fn new() -> Result<EventChannel> {
        // SAFETY: plain eventfd creation; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::os(
                "rdma_create_event_channel: eventfd",
                &std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventChannel {
            inner: Arc::new(ChannelInner {
                fd,
                queue: Mutex::new(Queue::default()),
                arrived: Condvar::new(),
            }),
        })
    }

    /// The fd to poll for readability.
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    pub(crate) fn push(&self, ev: CmEvent) {
        let Ok(mut q) = self.inner.queue.lock() else { return };
        tracing::debug!(event = %ev.event, status = ev.status, "cm event");
        q.events.push_back(ev);
        if q.waiters > 0 {
            self.inner.arrived.notify_all();
        }
        if !q.signalled {
            q.signalled = true;
            let one: u64 = 1;
            // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
            unsafe { libc::write(self.fd(), &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    /// Makes the fd unreadable again (the queue is empty). Only this channel reads its
    /// eventfd (applications poll it, as librdmacm's), so a counter that was written is still
    /// there and the read does not block.
    fn drain_fd(&self, q: &mut Queue) {
        if std::mem::take(&mut q.signalled) {
            let mut v: u64 = 0;
            // SAFETY: reading 8 bytes into a valid u64 from our eventfd, whose counter is set.
            unsafe { libc::read(self.fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
    }

    fn pop_where(&self, pred: &dyn Fn(&CmEvent) -> bool) -> Option<CmEvent> {
        let mut q = self.inner.queue.lock().ok()?;
        self.pop_locked(&mut q, pred)
    }

    fn pop_locked(&self, q: &mut Queue, pred: &dyn Fn(&CmEvent) -> bool) -> Option<CmEvent> {
        let i = q.events.iter().position(pred)?;
        let ev = q.events.remove(i);
        if q.events.is_empty() {
            self.drain_fd(q);
        }
        ev
    }

    /// Takes the next event (`rdma_get_cm_event`). `None` blocks; a zero timeout (or an fd set
    /// O_NONBLOCK by the application) returns EAGAIN when nothing waits.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<CmEvent> {
        self.get_matching(timeout, &|_| true)
    }

    pub(crate) fn get_matching(&self, timeout: Option<Duration>, pred: &dyn Fn(&CmEvent) -> bool) -> Result<CmEvent> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let lock = || {
            self.inner
                .queue
                .lock()
                .map_err(|_| Error::new(Errno::Io, "rdma_get_cm_event: channel poisoned"))
        };
        let mut q = lock()?;
        // An fd the application set O_NONBLOCK on (as with librdmacm's) never blocks. Read
        // once, when no event is pending (a queued event needs no syscall).
        let mut nonblock = None;
        // While nothing waits on the channel, this thread runs the reactor's rounds itself
        // (see `wait_driving`), until one finds nothing to do.
        let mut driving = true;
        let mut drive: Option<softrdma_verbs::progress::Driving<'static>> = None;
        loop {
            if let Some(ev) = self.pop_locked(&mut q, pred) {
                return Ok(ev);
            }
            let nonblock = *nonblock.get_or_insert_with(|| {
                // SAFETY: F_GETFL on our own fd.
                let flags = unsafe { libc::fcntl(self.fd(), libc::F_GETFL) };
                flags >= 0 && flags & libc::O_NONBLOCK != 0
            });
            let wait = match deadline {
                _ if nonblock => Some(Duration::ZERO),
                None => None,
                Some(d) => Some(d.saturating_duration_since(Instant::now())),
            };
            if matches!(wait, Some(w) if w.is_zero()) {
                return Err(Error::new(Errno::Again, "rdma_get_cm_event: no event pending"));
            }
            if driving && q.events.is_empty() {
                if let Some(reactor) = Reactor::existing() {
                    drop(q);
                    drive.get_or_insert_with(|| reactor.drive());
                    driving = self.wait_driving(reactor, wait);
                    if !driving {
                        if let Some(d) = drive.take() {
                            d.hand_back();
                        }
                    }
                    q = lock()?;
                    continue;
                }
            }
            // Every `push` notifies a waiter: a blocked caller sleeps until an event arrives.
            q.waiters += 1;
            q = match wait {
                None => self.inner.arrived.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(w) => match self.inner.arrived.wait_timeout(q, w) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                },
            };
            q.waiters -= 1;
        }
    }

    /// Waits up to `wait` (`None`: no bound) for an event on the channel or for readiness in
    /// the reactor; runs the reactor's round on this thread when it is the latter. The events
    /// of a connection handshake come from rounds (a socket became readable or writable), so
    /// the caller then handles them without waking the progress thread and being woken by it.
    /// False when the round found nothing to do (the progress thread was there first): the
    /// caller then waits on the channel alone, and the progress thread serves the sources.
    fn wait_driving(&self, reactor: &Reactor, wait: Option<Duration>) -> bool {
        let ms = wait.map_or(-1, |w| w.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
        let mut fds = [
            libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: reactor.ready_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: a live array of two pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if r < 0 {
            return std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
        }
        if fds[0].revents != 0 || fds[1].revents == 0 {
            return true;
        }
        reactor.caller_round()
    }

    /// Moves the events of `id` (and, for a listener, its connection requests) to `to`;
    /// returns how many moved.
    pub(crate) fn move_all_of(&self, id: &Arc<IdInner>, to: &EventChannel) -> u32 {
        let mut n = 0;
        while let Some(ev) = self.pop_where(&|e| {
            Arc::ptr_eq(e.id.inner(), id) || e.listen_id.as_ref().is_some_and(|l| Arc::ptr_eq(l.inner(), id))
        }) {
            // Count what `id` itself is waiting to see acked (a request counts on its listener).
            let counted_on = match &ev.listen_id {
                Some(l) if ev.event == EventType::ConnectRequest => l.inner(),
                _ => ev.id.inner(),
            };
            if Arc::ptr_eq(counted_on, id) {
                n += 1;
            }
            to.push(ev);
        }
        n
    }

    /// Drops this id's queued events (for `rdma_destroy_id`: dropped, they count as acked).
    pub(crate) fn discard_events_of(&self, id: &Arc<IdInner>) {
        while let Some(ev) = self.pop_where(&|e| Arc::ptr_eq(e.id.inner(), id)) {
            drop(ev);
        }
    }

    /// Drops queued CONNECT_REQUESTs of `listener` (their ids are destroyed).
    pub(crate) fn take_requests_of(&self, listener: &Arc<IdInner>) -> Vec<CmEvent> {
        let mut out = Vec::new();
        while let Some(ev) = self.pop_where(&|e| e.listen_id.as_ref().is_some_and(|l| Arc::ptr_eq(l.inner(), listener)))
        {
            out.push(ev);
        }
        out
    }
}

impl std::os::fd::AsFd for EventChannel {
    /// The eventfd that is readable while events wait on the channel.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.inner.fd)
    }
}
