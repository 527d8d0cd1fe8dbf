//! Completion channels: an fd that is readable while CQ events are pending.
//!
//! The fd is an eventfd. The event list itself lives in memory; the eventfd only carries
//! readiness, so `poll`/`epoll` on it work and `get_cq_event` honours the fd's O_NONBLOCK flag.

use crate::cq::CqInner;
use crate::{Errno, Error, Result};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct ChannelInner {
    fd: OwnedFd,
    events: Mutex<VecDeque<Weak<CqInner>>>,
}

impl ChannelInner {
    /// Queues an event for `cq` and makes the fd readable.
    pub(crate) fn notify(&self, cq: Weak<CqInner>) {
        let Ok(mut q) = self.events.lock() else { return };
        q.push_back(cq);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our own eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    fn drain_fd(&self) {
        let mut v: u64 = 0;
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one valid pollfd with a zero timeout.
        let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
        if ready > 0 {
            // SAFETY: reading 8 bytes into a valid u64 from our eventfd, which is readable.
            unsafe { libc::read(self.fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
    }
}

/// A completion channel (`ibv_comp_channel`). Cloning shares it.
#[derive(Debug, Clone)]
pub struct CompChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl CompChannel {
    pub(crate) fn new() -> Result<CompChannel> {
        // SAFETY: plain eventfd creation; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::os(
                "create_comp_channel: eventfd",
                &std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(CompChannel {
            inner: Arc::new(ChannelInner {
                fd,
                events: Mutex::new(VecDeque::new()),
            }),
        })
    }

    /// The fd to poll for readability.
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    fn try_pop(&self) -> Option<Arc<CqInner>> {
        let mut q = self.inner.events.lock().ok()?;
        while let Some(w) = q.pop_front() {
            if q.is_empty() {
                self.inner.drain_fd();
            }
            if let Some(cq) = w.upgrade() {
                return Some(cq);
            }
        }
        None
    }

    /// Waits for the next CQ event (`ibv_get_cq_event`). `None` timeout blocks; a zero timeout,
    /// or an fd the application set O_NONBLOCK on, returns EAGAIN when nothing is pending.
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<crate::cq::Cq> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(cq) = self.try_pop() {
                return Ok(crate::cq::Cq::from_inner(cq));
            }
            // SAFETY: F_GETFL on our own fd.
            let flags = unsafe { libc::fcntl(self.fd(), libc::F_GETFL) };
            let nonblock = flags >= 0 && flags & libc::O_NONBLOCK != 0;
            let wait_ms = match deadline {
                _ if nonblock => 0,
                None => -1,
                Some(d) => d
                    .saturating_duration_since(std::time::Instant::now())
                    .as_millis()
                    .min(i32::MAX as u128) as i32,
            };
            if wait_ms == 0 {
                return Err(Error::new(Errno::Again, "get_cq_event: no completion event pending"));
            }
            let mut pfd = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polling one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(Error::os("get_cq_event: poll", &e));
                }
            }
        }
    }
}

impl std::os::fd::AsFd for CompChannel {
    /// The eventfd that becomes readable when an armed CQ of this channel gets a completion.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.inner.fd)
    }
}
