//! Asynchronous events of a device context (`ibv_get_async_event`): QP, CQ, SRQ, port and
//! device events, queued in memory behind an eventfd (made on first use) that is readable while events are
//! pending, so `poll`/`epoll` on it work and a reader honours the fd's O_NONBLOCK flag (the
//! same scheme as completion channels).

use crate::{Errno, Error, Result};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock};

/// `enum ibv_event_type`, with its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum AsyncEventKind {
    /// A CQ overflowed (`IBV_EVENT_CQ_ERR`).
    CqErr = 0,
    /// A QP went to the error state because of a transport or local error
    /// (`IBV_EVENT_QP_FATAL`).
    QpFatal = 1,
    /// The responder saw an invalid request (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr = 2,
    /// The responder saw an access violation (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessErr = 3,
    /// The first packet arrived at a QP in RTR (`IBV_EVENT_COMM_EST`).
    CommEst = 4,
    /// A QP in SQD has no outstanding send work (`IBV_EVENT_SQ_DRAINED`).
    SqDrained = 5,
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal = 8,
    /// The port's link came up (`IBV_EVENT_PORT_ACTIVE`).
    PortActive = 9,
    /// The port's link went down (`IBV_EVENT_PORT_ERR`).
    PortErr = 10,
    /// `IBV_EVENT_SRQ_ERR`.
    SrqErr = 14,
    /// An armed SRQ fell below its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached = 15,
    /// A QP attached to an SRQ went to the error state and takes no more WQEs from it
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached = 16,
    /// The port's GID table changed (`IBV_EVENT_GID_CHANGE`).
    GidChange = 18,
}

impl AsyncEventKind {
    /// The `enum ibv_event_type` value.
    pub fn value(self) -> u32 {
        self as u32
    }
}

/// What an event is about (`ibv_async_event.element`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncElement {
    /// A QP, by number.
    Qp(u32),
    /// A CQ, by its process-unique id.
    Cq(u64),
    /// An SRQ, by its process-unique id.
    Srq(u64),
    /// A port.
    Port(u8),
    /// The device.
    Device,
}

/// One event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The event type.
    pub kind: AsyncEventKind,
    /// Its object.
    pub element: AsyncElement,
}

/// A context's event queue. Cloning shares it.
#[derive(Debug, Clone)]
pub struct AsyncEvents {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Made on first use ([`AsyncEvents::fd`]): a context nobody asks for events (the Rust
    /// API's per-connection contexts) holds no descriptor.
    fd: OnceLock<OwnedFd>,
    queue: Mutex<VecDeque<AsyncEvent>>,
}

/// Events queued beyond this are dropped (an application that never reads them must not grow
/// the process without bound; the kernel's uverbs queue is bounded the same way).
const MAX_QUEUED: usize = 4096;

impl AsyncEvents {
    /// A new, empty queue (its eventfd is made when first asked for).
    pub fn new() -> Result<AsyncEvents> {
        Ok(AsyncEvents {
            inner: Arc::new(Inner {
                fd: OnceLock::new(),
                queue: Mutex::new(VecDeque::new()),
            }),
        })
    }

    /// The fd to poll for readability (`ibv_context.async_fd`), made on the first call
    /// (readable at once if events are queued).
    pub fn fd(&self) -> Result<RawFd> {
        if let Some(fd) = self.inner.fd.get() {
            return Ok(fd.as_raw_fd());
        }
        let q = self
            .inner
            .queue
            .lock()
            .map_err(|_| Error::new(Errno::Io, "async events: queue poisoned"))?;
        if let Some(fd) = self.inner.fd.get() {
            return Ok(fd.as_raw_fd());
        }
        // SAFETY: plain eventfd creation; the result is checked.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(Error::os("async events: eventfd", &std::io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh descriptor we own. Creators hold the queue lock, so the
        // cell is still empty and `set` succeeds.
        let _ = self.inner.fd.set(unsafe { OwnedFd::from_raw_fd(raw) });
        if !q.is_empty() {
            Self::signal(raw);
        }
        Ok(raw)
    }

    fn signal(fd: RawFd) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our own eventfd.
        unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Queues an event and makes the fd readable.
    pub fn post(&self, kind: AsyncEventKind, element: AsyncElement) {
        let Ok(mut q) = self.inner.queue.lock() else { return };
        if q.len() >= MAX_QUEUED {
            tracing::warn!(?kind, ?element, "async event queue full ({MAX_QUEUED}): event dropped");
            return;
        }
        tracing::debug!(?kind, ?element, "async event");
        q.push_back(AsyncEvent { kind, element });
        if let Some(fd) = self.inner.fd.get() {
            Self::signal(fd.as_raw_fd());
        }
    }

    /// Drops the queued events that `pred` selects (their object is being destroyed: the
    /// kernel discards them the same way).
    pub fn discard(&self, pred: impl Fn(&AsyncEvent) -> bool) {
        let Ok(mut q) = self.inner.queue.lock() else { return };
        q.retain(|e| !pred(e));
        if q.is_empty() {
            self.drain_fd();
        }
    }

    fn drain_fd(&self) {
        let Some(fd) = self.inner.fd.get() else { return };
        let fd = fd.as_raw_fd();
        let mut v: u64 = 0;
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one valid pollfd with a zero timeout.
        if unsafe { libc::poll(&mut pfd, 1, 0) } > 0 {
            // SAFETY: reading 8 bytes into a valid u64 from our eventfd, which is readable.
            unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
    }

    fn try_pop(&self) -> Option<AsyncEvent> {
        let mut q = self.inner.queue.lock().ok()?;
        let e = q.pop_front();
        if q.is_empty() {
            self.drain_fd();
        }
        e
    }

    /// Takes the next event, waiting for one unless the application set O_NONBLOCK on the fd
    /// (then EAGAIN when none is pending).
    pub fn get(&self) -> Result<AsyncEvent> {
        loop {
            if let Some(e) = self.try_pop() {
                return Ok(e);
            }
            let fd = self.fd()?;
            // SAFETY: F_GETFL on our own fd.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                return Err(Error::new(Errno::Again, "get_async_event: no event pending"));
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polling one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, -1) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(Error::os("get_async_event: poll", &e));
                }
            }
        }
    }

    /// Events queued now (for tests and diagnostics).
    pub fn pending(&self) -> usize {
        self.inner.queue.lock().map(|q| q.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one valid pollfd with a zero timeout.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }

    #[test]
    fn the_fd_is_readable_exactly_while_events_are_queued() {
        let ev = AsyncEvents::new().unwrap();
        ev.post(AsyncEventKind::CqErr, AsyncElement::Cq(1));
        // The fd is made on first use, readable at once for the event queued before.
        let fd = ev.fd().unwrap();
        assert!(readable(fd));
        assert_eq!(ev.get().unwrap().element, AsyncElement::Cq(1));
        assert!(!readable(fd));
        ev.post(AsyncEventKind::QpFatal, AsyncElement::Qp(7));
        ev.post(AsyncEventKind::SrqLimitReached, AsyncElement::Srq(3));
        assert!(readable(fd));
        assert_eq!(ev.get().unwrap().element, AsyncElement::Qp(7));
        assert!(readable(fd));
        assert_eq!(ev.get().unwrap().kind, AsyncEventKind::SrqLimitReached);
        assert!(!readable(fd));
        // SAFETY: F_SETFL on our own fd.
        unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) };
        assert_eq!(ev.get().unwrap_err().errno, Errno::Again);
    }

    #[test]
    fn discarded_events_are_not_delivered() {
        let ev = AsyncEvents::new().unwrap();
        ev.post(AsyncEventKind::QpFatal, AsyncElement::Qp(7));
        ev.discard(|e| e.element == AsyncElement::Qp(7));
        assert_eq!(ev.pending(), 0);
        assert!(!readable(ev.fd().unwrap()));
    }
}
