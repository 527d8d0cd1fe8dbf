//! Sleeping until one of a socket's channels fires.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};

/// Sleeps until one of `fds` is readable, or `timeout` passes (`None`: no limit).
pub fn sleep_on(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) {
    let mut pfds: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)).collect();
    let t = match timeout {
        None => PollTimeout::NONE,
        Some(d) => PollTimeout::try_from(d).unwrap_or(PollTimeout::MAX),
    };
    // EINTR and the like just end the nap; the caller looks again.
    let _ = nix::poll::poll(&mut pfds, t);
}
