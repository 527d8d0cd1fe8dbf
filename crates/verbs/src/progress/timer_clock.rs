//! The reactor's timers reach its epoll set through one timerfd, armed for the earliest
//! deadline. Setting a timer is then a `timerfd_settime` on the setter's thread (when the new
//! deadline is the earliest) rather than a wakeup of the progress thread to shorten its
//! `epoll_wait`: a handshake that sets its bound does not wake the progress thread, and an
//! application thread running a round (`caller_round`) finds no waker set for it.

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// A monotonic timerfd, non-blocking.
pub(super) struct TimerClock {
    fd: TimerFd,
}

impl TimerClock {
    pub(super) fn new() -> std::io::Result<TimerClock> {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        Ok(TimerClock { fd })
    }

    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_fd().as_raw_fd()
    }

    /// Fires (the fd becomes readable) at `at`; `None` disarms. Re-arming also clears a
    /// pending expiry.
    pub(super) fn arm(&self, at: Option<Instant>) {
        let r = match at {
            // A zero expiry would disarm: a deadline already past fires in a nanosecond.
            Some(at) => {
                let left = at
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_nanos(1));
                self.fd
                    .set(Expiration::OneShot(TimeSpec::from(left)), TimerSetTimeFlags::empty())
            }
            None => self.fd.unset(),
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, "timerfd_settime failed: reactor timers may fire late");
        }
    }

    /// Consumes an expiry, so that the fd is no longer readable.
    pub(super) fn clear(&self) {
        let _ = self.fd.wait();
    }
}
