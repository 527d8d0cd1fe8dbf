//! The fork gate: the library's own helper threads hold no allocator lock when the process forks.
//!
//! A child inherits only the thread that called `fork`. A lock that another thread held at
//! that moment stays held in the child for good. glibc's malloc takes its own locks around
//! `fork`, but other allocators do not (AddressSanitizer's in GCC 12, for one): a library
//! thread caught inside `malloc` at the fork would leave the child's next allocation waiting
//! forever.
//!
//! So the library's helper threads (the port watcher, the counter server, the IB CM worker, a
//! connect retry) do each round of work inside [`busy`], and the `pthread_atfork` prepare
//! handler closes the gate ([`close`]): it waits, bounded by [`CLOSE_WAIT`], until no round is
//! in progress, and keeps new rounds waiting until the fork is over ([`Closed`] is dropped).
//! The progress thread parks by its own means (`progress::ForkHold`), without a lock on its
//! fast path. Sleeping and blocking between rounds happen outside the gate.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How long a fork waits for the rounds in progress to end before it goes ahead regardless.
pub const CLOSE_WAIT: Duration = Duration::from_secs(2);

struct Gate {
    /// A fork is in progress: no new round starts.
    closed: bool,
    /// Rounds in progress.
    busy: u32,
}

static GATE: Mutex<Gate> = Mutex::new(Gate { closed: false, busy: 0 });
static CHANGED: Condvar = Condvar::new();

fn gate() -> MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One round of a helper thread's work; the round ends when this is dropped.
#[must_use = "the round ends when the guard is dropped"]
pub struct Busy(());

/// Starts a round of work (waits while a fork is in progress).
pub fn busy() -> Busy {
    let mut g = gate();
    while g.closed {
        g = CHANGED.wait(g).unwrap_or_else(PoisonError::into_inner);
    }
    g.busy += 1;
    Busy(())
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut g = gate();
        g.busy = g.busy.saturating_sub(1);
        if g.busy == 0 {
            CHANGED.notify_all();
        }
    }
}

/// The closed gate, held by the forking thread from `prepare` to `parent` / `child`. Holding
/// the gate's lock across the fork also means that no thread is inside it at the fork.
pub(crate) struct Closed {
    gate: Option<MutexGuard<'static, Gate>>,
}

/// Closes the gate: waits until no round is in progress (bounded by [`CLOSE_WAIT`]).
pub(crate) fn close() -> Closed {
    let mut g = gate();
    g.closed = true;
    let (g, _) = CHANGED
        .wait_timeout_while(g, CLOSE_WAIT, |g| g.busy > 0)
        .unwrap_or_else(PoisonError::into_inner);
    Closed { gate: Some(g) }
}

impl Closed {
    /// In the child: the rounds of the parent's threads never end here (those threads do not
    /// exist), so they are forgotten.
    pub(crate) fn forget_rounds(&mut self) {
        if let Some(g) = self.gate.as_mut() {
            g.busy = 0;
        }
    }
}

impl Drop for Closed {
    /// Opens the gate again.
    fn drop(&mut self) {
        if let Some(mut g) = self.gate.take() {
            g.closed = false;
            drop(g);
            CHANGED.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn close_waits_for_a_round_and_holds_new_ones_back() {
        let round = busy();
        let closer = std::thread::spawn(move || {
            let t0 = Instant::now();
            let closed = close();
            (t0.elapsed(), closed.gate.as_ref().map(|g| g.busy))
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(round);
        let (waited, busy_at_fork) = closer.join().expect("closer");
        assert!(waited >= Duration::from_millis(40), "close returned after {waited:?}");
        assert_eq!(busy_at_fork, Some(0));

        let closed = close();
        let started = Arc::new(AtomicBool::new(false));
        let s = started.clone();
        let worker = std::thread::spawn(move || {
            let _round = busy();
            s.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !started.load(Ordering::SeqCst),
            "a round started while the gate was closed"
        );
        drop(closed);
        worker.join().expect("worker");
        assert!(started.load(Ordering::SeqCst));
    }
}
