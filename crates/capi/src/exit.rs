//! What the library does while the process exits: its destructor lets the last connection
//! teardown leave the process, and the blocking event calls of other threads wait for the exit
//! instead of failing on the objects the exiting thread destroyed.

use crate::error::CError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;
use std::time::Duration;

/// Longest wait at exit for the IB CM's last MADs.
const EXIT_FLUSH_LIMIT: Duration = Duration::from_millis(500);

/// Set when `exit` starts running its handlers: the process is exiting.
static EXITING: AtomicBool = AtomicBool::new(false);

/// An `atexit` handler: from now on the process is exiting.
extern "C" fn mark_exiting() {
    EXITING.store(true, Ordering::Release);
}

/// Registers [`mark_exiting`] once. Called when the application creates what the blocking
/// event calls wait on (a CM event channel, a completion channel, a device context): from
/// `main` or a later thread, so the handler runs as soon as `exit` starts, before every
/// destructor. glibc registers the destructors' runner (`_dl_fini`) just before `main`, so a
/// handler registered while the library loads (a constructor) would run only after them: too
/// late for a thread's call that comes while the application's own destructors or this
/// library's run.
pub(crate) fn watch_for_exit() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: atexit (glibc's, with this library's __dso_handle: a dlclose runs it) with
        // a plain `extern "C" fn()` that only stores an atomic. If it refuses (no memory), the
        // destructor sets the mark.
        let _ = unsafe { libc::atexit(mark_exiting) };
    });
}

/// The library's destructor (process exit): lets the IB CM MADs queued last (the DREP of an
/// `rdma_disconnect` after DISCONNECTED, the DREQ of an `rdma_destroy_id`) leave the process
/// before it ends, as the kernel's CM would still send them (`softrdma_cm::flush_mads`), and
/// lets iWARP FINs held by `softrdma_iwarp::driver::FIN_GRACE` go out, and gives connections
/// the application never closed the same grace (the exit would close those sockets at once).
extern "C" fn flush_cm_at_exit() {
    // Set by `mark_exiting` already, unless the application never created a channel or
    // context, or `atexit` refused it.
    EXITING.store(true, Ordering::Release);
    let _ = std::panic::catch_unwind(|| {
        softrdma_iwarp::driver::wait_fin_grace_at_exit(softrdma_iwarp::driver::FIN_GRACE * 2);
        softrdma_cm::flush_mads(EXIT_FLUSH_LIMIT)
    });
}

#[used]
#[link_section = ".fini_array"]
static FLUSH_CM_AT_EXIT: extern "C" fn() = flush_cm_at_exit;

/// For a blocking event call (`rdma_get_cm_event`, `ibv_get_cq_event`, `ibv_get_async_event`)
/// whose channel or context is not live: `e`, unless the process is exiting, in which case the
/// calling thread waits until the exit ends it, and this never returns.
///
/// The pattern is common: an event thread loops on the call while `main` destroys the
/// channel and returns (rping of rdma-core 44 does, without joining its cm_thread). Under the
/// kernel's librdmacm the exit ends such a thread before it calls again; this library's
/// destructor waits for the last MADs and FINs first (up to half a second), and a thread
/// that failed the call meanwhile would end the process with its own exit status (rping:
/// `exit(-1)`, status 255).
pub(crate) fn unless_exiting(e: CError) -> CError {
    if EXITING.load(Ordering::Acquire) {
        loop {
            std::thread::park();
        }
    }
    e
}
