//! Fork support: `ibv_fork_init`, `ibv_is_fork_initialized`, `ibv_dontfork_range` and
//! `ibv_dofork_range`, and the library's own `pthread_atfork` handlers.
//!
//! A child of a process that used the library gets a fresh library state
//! (`softrdma_verbs::fork`): its first context, QP or cm id starts its own progress thread,
//! soft-RoCE endpoint and IB CM, and the parent's objects are not live objects in the child
//! (EINVAL; the data path of an inherited QP or CQ fails with EIO or polls nothing). The
//! device objects stay valid: a device list taken before `fork` opens in the child. The
//! parent's sockets are closed in the child, so the parent's listeners, port claims and
//! connections end when the parent ends them.
//!
//! A kernel RDMA driver pins registered pages, so a fork that makes them copy-on-write would
//! leave the device writing pages the parent no longer sees; rdma-core marks them
//! `MADV_DONTFORK` unless the kernel copies pinned pages at fork. softrdma pins nothing: its
//! transport reads and writes registered memory through the process's own mappings, which a
//! fork does not take from the parent. So fork protection is unneeded, exactly what
//! rdma-core answers on a kernel with copy-on-fork (`IBV_FORK_UNNEEDED`).

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::Once;

thread_local! {
    /// The device locks, held by the forking thread across `fork`.
    static HELD: RefCell<Option<crate::device::DeviceHold>> = const { RefCell::new(None) };
}

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        let hold = crate::device::hold_for_fork();
        HELD.with(|h| *h.borrow_mut() = Some(hold));
    });
}

extern "C" fn release() {
    let _ = std::panic::catch_unwind(|| {
        HELD.with(|h| h.borrow_mut().take());
    });
}

/// Installs the fork handlers, once: the verbs crate's (fresh per-process state in a child)
/// and this crate's (the device registry's locks). Called on the first device lookup, before
/// any object exists.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        softrdma_verbs::fork::install();
        // SAFETY: two `extern "C" fn()` handlers that never unwind (each catches panics);
        // pthread_atfork only stores the pointers. Registered after the verbs handlers, so
        // this prepare runs first: the device locks are taken before the reactor's.
        let r = unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(release)) };
        if r != 0 {
            crate::error::debug_note(&format!(
                "pthread_atfork failed ({r}): a fork during a device lookup could hang the child"
            ));
        }
    });
}

/// `enum ibv_fork_status` `IBV_FORK_UNNEEDED`.
const IBV_FORK_UNNEEDED: c_int = 2;

c_fn! {
    /// `int ibv_fork_init(void)`: 0, nothing to set up.
    fn ibv_fork_init() -> c_int {
        0
    }

    /// `enum ibv_fork_status ibv_is_fork_initialized(void)`: `IBV_FORK_UNNEEDED`.
    fn ibv_is_fork_initialized() -> c_int {
        IBV_FORK_UNNEEDED
    }

    /// `int ibv_dontfork_range(void *base, size_t size)`: 0, nothing is pinned.
    fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
        0
    }

    /// `int ibv_dofork_range(void *base, size_t size)`: 0, nothing is pinned.
    fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
        0
    }
}
