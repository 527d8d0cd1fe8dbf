//! Rounds of the reactor run by an application thread that waits for something only a
//! round can produce (a CM event: `rdma_get_cm_event`).
//!
//! Such a thread would otherwise sleep until the progress thread has run, and then be woken
//! by it: two cross-CPU wakeups per step of a connection handshake. Instead it declares
//! itself ([`Reactor::drive`]), waits on the sources' epoll set as well ([`Reactor::ready_fd`])
//! and, when that is readable, runs the round itself ([`Reactor::caller_round`]): the fd
//! events waiting now, dispatched to their sources exactly as the progress thread would.
//! While a thread drives, the sources' readiness no longer wakes the progress thread (their
//! set leaves the one it waits on), nor do kicks (they signal an eventfd inside the set); the
//! timers stay with it. The set stays out for a short linger after the last driver stopped
//! ([`DRIVE_LINGER`]), for the thread that takes its CM events one after another.
//!
//! A thread that polls a CQ runs such rounds too when soft-iWARP connections are open
//! ([`Reactor::polling_round`]): each connection is its own socket, and one `epoll_wait` on
//! the set looks at all of them.
//!
//! Rounds never overlap: each holds the reactor's turn from its `epoll_wait` to the end of
//! its calls, so a source is never called for readiness another round already handled.

use super::{Event, Reactor, Source, State, Token};
use std::cell::Cell;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

/// How long the sources stay with the application's threads after the last one stopped
/// driving (see [`Reactor::drive`]).
pub const DRIVE_LINGER: Duration = Duration::from_micros(500);

/// The most fd events one caller round dispatches.
const CALLER_ROUND_EVENTS: usize = 64;

thread_local! {
    /// This thread is calling sources (a source that waits for a CM event must not start a
    /// round of its own: the turn is taken).
    static IN_ROUND: Cell<bool> = const { Cell::new(false) };
}

/// The reactor's turn, held while a round calls its sources.
pub(super) struct Turn<'a> {
    _held: MutexGuard<'a, ()>,
}

/// Whether this thread is inside a round (calling sources).
pub(super) fn in_round() -> bool {
    IN_ROUND.with(Cell::get)
}

impl Turn<'_> {
    /// Calls each source, marking this thread as inside a round meanwhile.
    pub(super) fn dispatch(&self, calls: Vec<(Arc<dyn Source>, Token, Event)>) {
        struct Inside;
        impl Drop for Inside {
            fn drop(&mut self) {
                IN_ROUND.with(|r| r.set(false));
            }
        }
        IN_ROUND.with(|r| r.set(true));
        let _inside = Inside;
        for (s, token, ev) in calls {
            s.on_event(token, ev);
        }
    }
}

impl Reactor {
    /// Waits for the end of any round under way, and keeps others from starting.
    pub(super) fn take_turn(&self) -> Turn<'_> {
        Turn {
            _held: self.turn.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// The turn, unless a round is under way.
    fn try_take_turn(&self) -> Option<Turn<'_>> {
        match self.turn.try_lock() {
            Ok(held) => Some(Turn { _held: held }),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(Turn { _held: p.into_inner() }),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Dispatches the fd events waiting now on this thread, under `turn`, and then the kicks
    /// pending, those its calls made included (a MAD handed to the IB CM: they would
    /// otherwise wake another thread). One pass: the kicks that pass makes are signalled for
    /// the next round, of whichever thread serves the sources then, which keeps this one
    /// bounded. False if it called no source. The timers stay with the progress thread.
    fn round_under(&self, turn: Turn<'_>) -> bool {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; CALLER_ROUND_EVENTS];
        let n = self.harvest(&mut events, 0);
        let calls = self.collect(&events[..n], false);
        let mut any = !calls.is_empty();
        turn.dispatch(calls);
        let mut kicked = Vec::new();
        self.take_kicks(&mut self.lock(), &mut kicked);
        any |= !kicked.is_empty();
        turn.dispatch(kicked);
        drop(turn);
        let mut st = self.lock();
        let wake = self.route_kicks(&mut st);
        drop(st);
        if wake {
            self.wake();
        }
        any
    }

    /// The sources' epoll set: readable while a registered fd has an event waiting. For
    /// `poll` by a thread that then runs [`Reactor::caller_round`].
    pub fn ready_fd(&self) -> BorrowedFd<'_> {
        self.epfd.as_fd()
    }

    /// One non-blocking round on the calling thread (see the module): the fd events waiting
    /// now, dispatched to their sources. Waits for a round under way on another thread to end
    /// first. False if it called no source (the events were handled already, or they were
    /// for sources that are gone): the caller should then leave the work to the progress
    /// thread rather than poll the epoll set again at once.
    pub fn caller_round(&self) -> bool {
        if IN_ROUND.with(Cell::get) || self.lock().fork_pause {
            return false;
        }
        self.round_under(self.take_turn())
    }

    /// A polling caller's round (`ibv_poll_cq` found nothing, see `caller_step`): like
    /// [`Reactor::caller_round`], but it never waits. If a round is under way on another
    /// thread (the progress thread's, usually: the same events), or a fork is, it does nothing.
    /// Costs one `epoll_wait` when nothing is ready, and then leaves the turn alone: a poller
    /// that took it on every empty poll would make the progress thread sleep on it (ib_write_lat
    /// over siw_lo, whose application polls memory, lost its fast mode so). True if it called
    /// a source.
    pub fn polling_round(&self) -> bool {
        // Whether anything is ready: one event tells. Level-triggered, so it stays ready for
        // the round.
        let mut one = [libc::epoll_event { events: 0, u64: 0 }];
        if IN_ROUND.with(Cell::get) || self.harvest(&mut one, 0) == 0 {
            return false;
        }
        let Some(turn) = self.try_take_turn() else { return false };
        if self.lock().fork_pause {
            return false;
        }
        // Harvested again under the turn: what another round handled meanwhile is gone.
        self.round_under(turn)
    }
}

/// An application thread that runs rounds ([`Reactor::drive`]); dropping it hands the
/// sources back to the progress thread.
pub struct Driving<'a> {
    reactor: &'a Reactor,
    /// Whether the sources stay out of the progress thread's reach for [`DRIVE_LINGER`]
    /// after the last driver (see [`Driving::hand_back`]).
    linger: bool,
}

impl Driving<'_> {
    /// Stops driving and, if no other thread drives, hands the sources back to the
    /// progress thread at once, without the linger: for a thread that will not run rounds
    /// again soon (its round found nothing to do, and it now waits for something else).
    pub fn hand_back(mut self) {
        self.linger = false;
    }
}

impl Reactor {
    /// Declares that the calling thread runs rounds until the guard is dropped: the sources'
    /// readiness stops waking the progress thread (with the first such thread), and wakes it
    /// again [`DRIVE_LINGER`] after the last one stopped, unless a thread drives again by
    /// then; what became ready meanwhile is reported to it at once. A thread that takes its
    /// CM events one after another (connect, then wait; accept, then wait) keeps the
    /// handshakes' sockets through the short gaps between its waits, where the progress
    /// thread would otherwise be woken to handle them and then wake it.
    pub fn drive(&self) -> Driving<'_> {
        let mut st = self.lock();
        st.drivers += 1;
        if st.drivers == 1 && st.linger.take().is_none() {
            self.sources_wake_progress(false);
        }
        Driving {
            reactor: self,
            linger: true,
        }
    }

    /// Puts the sources' set back into the progress thread's once the linger after the last
    /// driver is over; true if it did.
    pub(super) fn end_linger_if_due(&self, st: &mut State) -> bool {
        if st.linger.is_some_and(|until| until <= Instant::now()) {
            st.linger = None;
            self.sources_wake_progress(true);
            return true;
        }
        false
    }

    /// Puts the sources' set into the progress thread's (`wake`) or takes it out.
    fn sources_wake_progress(&self, wake: bool) {
        // Adding a set that is ready reports it at once, so nothing that arrived in between
        // is missed.
        let r = if wake {
            super::epoll_add(&self.outer, self.epfd.as_raw_fd(), super::SOURCES)
        } else {
            super::epoll_del(&self.outer, self.epfd.as_raw_fd())
        };
        if let Err(error) = r {
            tracing::warn!(%error, wake, "epoll_ctl on the reactor's sources set failed");
        }
    }
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        let mut st = self.reactor.lock();
        st.drivers -= 1;
        if st.drivers > 0 {
            return;
        }
        if !self.linger {
            self.reactor.sources_wake_progress(true);
        } else {
            // The timerfd, armed unless it fires sooner already, ends the linger on the
            // progress thread (`end_linger_if_due`); it re-arms for a linger a later driver
            // pushed out.
            let until = Instant::now() + DRIVE_LINGER;
            st.linger = Some(until);
            self.reactor.arm_by(&mut st, until);
        }
    }
}
