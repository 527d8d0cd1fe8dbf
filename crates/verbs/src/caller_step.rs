//! Progress on the caller's thread: what an application thread that polls an empty CQ may
//! do itself instead of waiting for the progress thread.
//!
//! Polling applications (perftest, UCX, MPI) spin on `ibv_poll_cq`. When the completion they
//! wait for is a packet still sitting in a socket, waking the progress thread to read it costs
//! a cross-CPU wakeup (tens of µs on a VM). So a transport registers a step here: a bounded,
//! non-blocking receive-and-process round that takes its locks with `try_lock` (the progress
//! thread may be doing the same work: then the step does nothing). [`Cq::poll`](crate::cq::Cq::poll)
//! runs the steps when it finds nothing, and looks again.
//!
//! A thread that blocks for a completion event (`ibv_get_cq_event`) waits on the transports'
//! sockets too ([`wait_fds`]), and runs the steps itself when one becomes readable: the event
//! then costs one wakeup (the packet's) instead of two (the progress thread's, then the
//! channel's). It tells the transports when it starts and stops waiting ([`Waiting`]), so a
//! transport can keep the progress thread off those sockets meanwhile, and when a round of
//! steps is over ([`after_ready`]), so a transport can send what its step owes (the peer may be
//! waiting for that ACK).

use crate::fork::PerProcess;
use std::os::fd::RawFd;
use std::sync::{Arc, RwLock};

/// A transport's receive step for a polling caller.
pub trait CallerStep: Send + Sync {
    /// One bounded, non-blocking round; true if it processed anything.
    fn step(&self) -> bool;

    /// The fds whose readability means work for this transport (appended to `out`).
    fn wait_fds(&self, _out: &mut Vec<RawFd>) {}

    /// A bounded, non-blocking round for a waiting caller whose `ready` fds (some of them
    /// this transport's [`wait_fds`](CallerStep::wait_fds)) became readable; true if it
    /// processed anything. By default, [`step`](CallerStep::step).
    fn step_ready(&self, _ready: &[RawFd]) -> bool {
        self.step()
    }

    /// After [`step_ready`](CallerStep::step_ready) (of every transport), before the waiting
    /// caller returns with its event or waits on: a transport sends what the step owes.
    fn after_ready(&self) {}

    /// A thread starts blocking on this transport's [`wait_fds`](CallerStep::wait_fds) (and
    /// will run [`step_ready`](CallerStep::step_ready) when one is readable).
    fn waiter_enters(&self) {}

    /// That thread stops: `linger`, it found its event (it may well come back soon); else it
    /// stops watching the fds (someone else must read them now).
    fn waiter_leaves(&self, _linger: bool) {}
}

type Steps = Arc<Vec<Arc<dyn CallerStep>>>;

/// The steps, replaced as a whole when one is added: a poll clones one `Arc`, never the list.
static STEPS: PerProcess<RwLock<Steps>> = PerProcess::new();

/// Registers a step for the life of the process (of this fork generation).
pub fn add(step: Arc<dyn CallerStep>) {
    let mut list = STEPS
        .get_or_init(|| RwLock::new(Arc::new(Vec::new())))
        .write()
        .unwrap_or_else(|p| p.into_inner());
    let mut next: Vec<Arc<dyn CallerStep>> = list.as_ref().clone();
    next.push(step);
    *list = Arc::new(next);
}

/// Calls `f` on every registered step (a snapshot of the list, no lock held during the
/// calls); true if any call returned true. Every step is called.
fn each(mut f: impl FnMut(&dyn CallerStep) -> bool) -> bool {
    let Some(steps) = STEPS.get() else { return false };
    let list: Steps = steps.read().unwrap_or_else(|p| p.into_inner()).clone();
    list.iter().fold(false, |any, s| f(s.as_ref()) | any)
}

/// Calls `f` on every registered step (see [`each`]).
fn for_each(mut f: impl FnMut(&dyn CallerStep)) {
    each(|s| {
        f(s);
        false
    });
}

/// The fds of every registered step (see [`CallerStep::wait_fds`]), read afresh on each call:
/// a transport may close a socket between two waits.
pub fn wait_fds() -> Vec<RawFd> {
    let mut out = Vec::new();
    for_each(|s| s.wait_fds(&mut out));
    out
}

/// Runs every registered step for a waiting caller whose `ready` fds became readable; true
/// if one processed anything.
pub fn run_ready(ready: &[RawFd]) -> bool {
    each(|s| s.step_ready(ready))
}

/// A thread blocked on [`wait_fds`] (see [`CallerStep::waiter_enters`]); dropping it is
/// [`Waiting::leave`] with `linger`.
#[derive(Debug)]
pub struct Waiting {
    linger: bool,
}

impl Waiting {
    /// Tells every step that a thread starts waiting on its fds.
    pub fn enter() -> Waiting {
        for_each(|s| s.waiter_enters());
        Waiting { linger: true }
    }

    /// Tells every step that the thread stopped waiting (see [`CallerStep::waiter_leaves`]).
    pub fn leave(mut self, linger: bool) {
        self.linger = linger;
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let linger = self.linger;
        for_each(|s| s.waiter_leaves(linger));
    }
}

/// Tells every step that a waiting caller's [`run_ready`] round is over (see
/// [`CallerStep::after_ready`]).
pub fn after_ready() {
    for_each(|s| s.after_ready());
}

/// Runs every registered step once; true if one processed anything.
pub fn run() -> bool {
    each(|s| s.step())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Count(AtomicU32);

    impl CallerStep for Count {
        fn step(&self) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst) == 0
        }
    }

    #[test]
    fn a_registered_step_runs_and_reports_its_work() {
        let c = Arc::new(Count(AtomicU32::new(0)));
        add(c.clone());
        assert!(run(), "the first round did something");
        assert!(c.0.load(Ordering::SeqCst) >= 1);
        let before = c.0.load(Ordering::SeqCst);
        run();
        assert!(c.0.load(Ordering::SeqCst) > before);
    }
}
