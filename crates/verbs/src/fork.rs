//! fork(2): a child process gets a fresh, working library state.
//!
//! Threads do not survive `fork`: a child of a process that has used softrdma has no progress
//! thread, no IB CM worker and no port watcher, and any lock one of those threads held at the
//! fork stays locked in the child for good. So every process-wide singleton of the library
//! (the reactor, the soft-RoCE endpoint, the IB CM agent, the key table, the C library's
//! registries of live objects, ...) is a [`PerProcess`] value: one instance per *fork
//! generation*. The generation is the process's fork depth since the library was first used;
//! the `pthread_atfork` child handler increments it, so the child's first use of each
//! singleton creates a new one (with its own threads and sockets) and never touches the
//! parent's copy, whose locks may be held by threads that do not exist. The parent's copies
//! are leaked in the child, never dropped: their destructors would talk to threads and
//! sockets that are not the child's.
//!
//! Objects the parent created (contexts, QPs, CQs, cm ids) are unusable in the child, as with
//! a kernel RDMA device: their data-path calls fail at once (see [`is_stale`]) and the C
//! library no longer counts them as live objects (EINVAL).
//!
//! The child must not keep the parent's sockets open either: a listening TCP socket or a port
//! claim would outlive the parent's `close`, and a connection would not see its FIN. The
//! reactor's registered fds and the fds tracked with [`CloseInChild`] are replaced with
//! `/dev/null` in the child (the fd numbers stay taken, so a leaked owner never closes a
//! descriptor the child opened later). The parent's sockets themselves are untouched.
//!
//! The handlers are installed on the first use of any per-process value ([`install`]).
//! `prepare` waits for the helper threads' rounds to end ([`crate::fork_gate`]) and parks the
//! progress thread between two rounds (so that none holds an allocator lock at the fork, see
//! `progress::ForkHold`), then takes the reactor's lock and the tracked-fd lock (both leaf
//! locks), so the child finds consistent tables; `parent` releases them; `child` does only
//! async-signal-safe work (`open`, `dup3`, `close`, atomics) besides unlocking.

use std::cell::RefCell;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock, PoisonError};

/// Fork generations served without a lock; deeper ones use [`PerProcess`]'s locked list.
const DEPTH: usize = 8;

static GENERATION: AtomicU32 = AtomicU32::new(0);

/// The process's fork generation: 0 in the process that first used the library, one more in
/// each child of a process that had used it.
pub fn generation() -> u32 {
    GENERATION.load(Ordering::Acquire)
}

/// True if an object created in generation `created` belongs to an ancestor process (it was
/// inherited through `fork` and no thread drives it here).
pub fn is_stale(created: u32) -> bool {
    created != generation()
}

/// The error for a call on an object inherited from the parent process.
pub fn stale_error(what: &str) -> crate::Error {
    crate::Error::new(
        crate::Errno::Io,
        format!("{what}: the object was created before fork(); a child process must open its own context and objects"),
    )
}

/// A process-wide value, created lazily once per fork generation (see the module docs).
pub struct PerProcess<T: 'static> {
    slots: [OnceLock<T>; DEPTH],
    /// Generations past [`DEPTH`]: leaked values by generation. Its lock is taken only there,
    /// so a fork while another thread holds it can only trouble a process nested that deep.
    deeper: Mutex<Vec<(u32, &'static T)>>,
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    /// An empty value (for a `static`).
    pub const fn new() -> Self {
        PerProcess {
            slots: [const { OnceLock::new() }; DEPTH],
            deeper: Mutex::new(Vec::new()),
        }
    }

    /// This process's value, created with `init` on first use (installing the fork handlers).
    pub fn get_or_init(&'static self, init: impl FnOnce() -> T) -> &'static T {
        let g = generation();
        match self.slots.get(g as usize) {
            Some(slot) => {
                if let Some(v) = slot.get() {
                    return v;
                }
                install();
                slot.get_or_init(init)
            }
            None => {
                let mut d = self.deeper.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(&(_, v)) = d.iter().find(|(gen, _)| *gen == g) {
                    return v;
                }
                install();
                let v: &'static T = Box::leak(Box::new(init()));
                d.push((g, v));
                v
            }
        }
    }

    /// This process's value if it was created.
    pub fn get(&'static self) -> Option<&'static T> {
        let g = generation();
        match self.slots.get(g as usize) {
            Some(slot) => slot.get(),
            None => self
                .deeper
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .find(|(gen, _)| *gen == g)
                .map(|&(_, v)| v),
        }
    }
}

impl<T: Send + Sync + 'static> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Library fds that no reactor source owns, to be replaced in a child (see [`CloseInChild`]).
static TRACKED: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());

fn tracked() -> MutexGuard<'static, Vec<RawFd>> {
    TRACKED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An fd-owning value (a port claim, a marker socket) that a child process must not keep
/// open: its fd is replaced with `/dev/null` in the child. Dropping it stops the tracking
/// before the fd is closed.
#[derive(Debug)]
pub struct CloseInChild<T: AsRawFd> {
    inner: T,
}

impl<T: AsRawFd> CloseInChild<T> {
    /// Tracks `inner`'s fd until this value is dropped.
    pub fn new(inner: T) -> Self {
        tracked().push(inner.as_raw_fd());
        CloseInChild { inner }
    }
}

impl<T: AsRawFd> std::ops::Deref for CloseInChild<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsRawFd> Drop for CloseInChild<T> {
    fn drop(&mut self) {
        // Runs before `inner` is dropped (closed): the fd leaves the list while it is ours.
        let fd = self.inner.as_raw_fd();
        let mut t = tracked();
        if let Some(i) = t.iter().position(|&x| x == fd) {
            t.swap_remove(i);
        }
    }
}

/// Locks held from `prepare` to `parent`/`child` (on the forking thread).
struct Held {
    gate: crate::fork_gate::Closed,
    tracked: MutexGuard<'static, Vec<RawFd>>,
    reactor: Option<crate::progress::ForkHold>,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        // Order: the helper threads' gate (their rounds may take the other two locks), then
        // the reactor (its lock is a leaf: nothing holding it waits for the tracked list),
        // then the tracked list.
        let gate = crate::fork_gate::close();
        let reactor = crate::progress::ForkHold::take();
        let tracked = tracked();
        HELD.with(|h| *h.borrow_mut() = Some(Held { gate, tracked, reactor }));
    });
}

extern "C" fn parent() {
    let _ = std::panic::catch_unwind(|| {
        HELD.with(|h| h.borrow_mut().take());
    });
}

extern "C" fn child() {
    let _ = std::panic::catch_unwind(|| {
        let held = HELD.with(|h| h.borrow_mut().take());
        if let Some(mut held) = held {
            held.gate.forget_rounds();
            let mut fds: Vec<RawFd> = std::mem::take(&mut *held.tracked);
            if let Some(r) = &held.reactor {
                fds.extend(r.fds());
            }
            replace_with_dev_null(&fds);
            drop(held);
        }
        GENERATION.fetch_add(1, Ordering::AcqRel);
    });
}

/// Points each fd at `/dev/null` (the child's copy only; the parent's sockets are unchanged).
fn replace_with_dev_null(fds: &[RawFd]) {
    if fds.is_empty() {
        return;
    }
    // SAFETY: open(2) of a constant NUL-terminated path; the result is checked.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if null < 0 {
        // No /dev/null: close them instead (a leaked owner could then close a reused number,
        // but keeping the parent's sockets open in the child is the worse outcome).
        for &fd in fds {
            // SAFETY: `fd` is a library fd inherited from the parent; nothing else uses it here.
            unsafe { libc::close(fd) };
        }
        return;
    }
    for &fd in fds {
        if fd != null {
            // SAFETY: dup3 onto an fd the library owns; the old open file (the parent's
            // socket) is only released in this process.
            unsafe { libc::dup3(null, fd, libc::O_CLOEXEC) };
        }
    }
    // SAFETY: `null` was opened above and is not used after this.
    unsafe { libc::close(null) };
}

/// Installs the `pthread_atfork` handlers (once per process; inherited by children).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: three `extern "C" fn()` handlers that never unwind (each catches panics);
        // pthread_atfork only stores the pointers.
        let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if r != 0 {
            tracing::warn!(
                errno = r,
                "pthread_atfork failed: a forked child will not get a fresh softrdma state"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_process_is_created_once_per_generation() {
        static V: PerProcess<AtomicU32> = PerProcess::new();
        let a = V.get_or_init(|| AtomicU32::new(7));
        a.fetch_add(1, Ordering::Relaxed);
        let b = V.get_or_init(|| AtomicU32::new(100));
        assert!(std::ptr::eq(a, b));
        assert_eq!(b.load(Ordering::Relaxed), 8);
        assert!(V.get().is_some());
        assert!(!is_stale(generation()));
        assert!(is_stale(generation() + 1));
    }

    #[test]
    fn close_in_child_untracks_on_drop() {
        let (a, _b) = std::os::unix::net::UnixDatagram::pair().expect("socketpair");
        let fd = a.as_raw_fd();
        let c = CloseInChild::new(a);
        assert!(tracked().contains(&fd));
        drop(c);
        assert!(!tracked().contains(&fd));
    }
}
