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
    ///
    /// While it blocks, it also waits on the transports' sockets (`caller_step::wait_fds`):
    /// when one becomes readable, this thread receives and processes what came (as a polling
    /// caller does), so the event it may produce needs no second wakeup. A transport may keep
    /// the progress thread off its sockets meanwhile (`CallerStep::waiter_enters`; soft-RoCE
    /// does), and sends what the step owes before this thread returns or waits on
    /// (`CallerStep::after_ready`).
    /// If another thread is processing at that moment (the step finds its lock taken), the
    /// next wait is on the channel alone, until something arrives on it, and the sockets go
    /// back to the progress thread.
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<crate::cq::Cq> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut with_sockets = true;
        // While this thread waits on the transports' sockets (they may hand them over).
        let mut waiting: Option<crate::caller_step::Waiting> = None;
        // A `run_ready` round whose end the transports have not been told yet.
        let mut stepped = false;
        loop {
            let event = self.try_pop();
            if std::mem::take(&mut stepped) {
                crate::caller_step::after_ready();
            }
            if let Some(cq) = event {
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
            let sockets = if with_sockets {
                waiting.get_or_insert_with(crate::caller_step::Waiting::enter);
                crate::caller_step::wait_fds()
            } else {
                Vec::new()
            };
            let mut pfds: Vec<libc::pollfd> = std::iter::once(self.fd())
                .chain(sockets)
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: `pfds` is a live array of `pfds.len()` pollfds.
            let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, wait_ms) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(Error::os("get_cq_event: poll", &e));
                }
                continue;
            }
            let ready: Vec<RawFd> = pfds[1..].iter().filter(|p| p.revents != 0).map(|p| p.fd).collect();
            stepped = !ready.is_empty();
            with_sockets = !stepped || crate::caller_step::run_ready(&ready);
            if !with_sockets {
                if let Some(w) = waiting.take() {
                    w.leave(false);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller_step::{self, CallerStep};
    use crate::cq::Cq;
    use crate::wr::{WcOpcode, WcStatus, WorkCompletion};
    use std::os::unix::net::UnixDatagram;
    use std::time::Instant;

    /// A transport whose packets arrive on a socket that no progress thread watches: only a
    /// caller step reads it, and each datagram completes one receive into `cq`.
    struct SocketStep {
        rx: UnixDatagram,
        cq: Cq,
    }

    impl CallerStep for SocketStep {
        fn step(&self) -> bool {
            let mut buf = [0u8; 8];
            let mut any = false;
            while let Ok(n) = self.rx.recv(&mut buf) {
                let wr_id = buf.get(..n).and_then(|b| b.first()).copied().unwrap_or(0);
                self.cq.inner().push(WorkCompletion::new(
                    u64::from(wr_id),
                    WcStatus::Success,
                    WcOpcode::Recv,
                    77,
                ));
                any = true;
            }
            any
        }

        fn wait_fds(&self, out: &mut Vec<RawFd>) {
            out.push(self.rx.as_raw_fd());
        }
    }

    #[test]
    fn a_blocked_get_cq_event_processes_what_arrives_on_a_transport_socket_itself() {
        let ch = CompChannel::new().unwrap();
        let cq = Cq::new(4, 16, Some(ch.clone()), None, None).unwrap();
        cq.req_notify(false).unwrap();
        let (rx, tx) = UnixDatagram::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        caller_step::add(Arc::new(SocketStep { rx, cq: cq.clone() }));
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            tx.send(&[5]).unwrap();
            tx
        });
        let start = Instant::now();
        let got = ch
            .get_cq_event(Some(Duration::from_secs(10)))
            .expect("the waiting thread read the datagram and the event followed");
        assert!(start.elapsed() < Duration::from_secs(10));
        assert_eq!(got.inner().id(), cq.inner().id());
        got.ack_events(1);
        let wc = cq.poll_one().expect("the completion the step produced");
        assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Success));
        drop(sender.join().unwrap());
    }
}
