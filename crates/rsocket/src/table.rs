//! The process's rsockets, by number.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::{Arc, LazyLock, Mutex};

use crate::error::{Result, RsError};
use crate::socket::RSocket;

static SOCKETS: LazyLock<Mutex<HashMap<RawFd, Arc<RSocket>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn table() -> std::sync::MutexGuard<'static, HashMap<RawFd, Arc<RSocket>>> {
    SOCKETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers a new socket; returns its number.
pub fn insert(s: Arc<RSocket>) -> RawFd {
    let fd = s.fd();
    table().insert(fd, s);
    fd
}

/// The socket numbered `fd`, if it is one.
pub fn lookup(fd: RawFd) -> Option<Arc<RSocket>> {
    table().get(&fd).cloned()
}

/// The socket numbered `fd`, or EBADF naming the call.
pub fn get(fd: RawFd, call: &str) -> Result<Arc<RSocket>> {
    lookup(fd).ok_or_else(|| RsError::new(libc::EBADF, format!("{call}: {fd} is not an rsocket")))
}

/// Removes the socket numbered `fd` (`rclose`).
pub fn remove(fd: RawFd, call: &str) -> Result<Arc<RSocket>> {
    table()
        .remove(&fd)
        .ok_or_else(|| RsError::new(libc::EBADF, format!("{call}: {fd} is not an rsocket")))
}
