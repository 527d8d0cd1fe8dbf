//! Which thread watches the UDP sockets while an application thread is blocked in
//! `ibv_get_cq_event`.
//!
//! Such a thread polls the sockets itself (`softrdma_verbs::caller_step`). If the progress
//! thread watches them too, the same datagram wakes both; the progress thread usually takes it,
//! and the completion then costs a second wakeup (the channel's). So while at least one thread
//! waits on the sockets, the endpoint takes them out of the progress thread's epoll set.
//!
//! Putting them back (`epoll_ctl`, about a microsecond per socket) between the completion and
//! the application would slow every round trip, so they stay out for a short lease after the
//! last waiter leaves: an application that comes back to wait within it (a ping-pong does)
//! costs no system call. When the lease runs out with nobody waiting, the progress thread puts
//! them back. A waiter that stops watching the sockets for another reason (the receive lock was
//! taken) gives them back at once: nobody else would read them.
//!
//! Pure state: the endpoint applies what [`SocketHold`] returns.

use std::time::{Duration, Instant};

/// How long the sockets stay with the waiters after the last one left.
pub(crate) const LEASE: Duration = Duration::from_micros(500);

/// What the endpoint does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldAction {
    /// Nothing.
    None,
    /// Take the sockets out of the progress thread's epoll set.
    Take,
    /// Give them back to the progress thread.
    GiveBack,
    /// Arm the progress thread's timer for this deadline (the lease's end).
    Arm(Instant),
}

/// The waiters and the lease.
#[derive(Debug, Default)]
pub(crate) struct SocketHold {
    waiters: u32,
    /// The sockets are out of the progress thread's epoll set.
    taken: bool,
    /// When the lease ends (set when the last waiter leaves).
    lease_until: Option<Instant>,
    /// A timer for the lease's end is armed.
    armed: bool,
}

impl SocketHold {
    /// A thread starts waiting on the sockets.
    pub(crate) fn enter(&mut self) -> HoldAction {
        self.waiters += 1;
        self.lease_until = None;
        if self.taken {
            HoldAction::None
        } else {
            self.taken = true;
            HoldAction::Take
        }
    }

    /// A thread stops waiting on the sockets; `linger`: it found its event (keep them for the
    /// lease), else it gives up on them (the progress thread must read them now).
    pub(crate) fn leave(&mut self, linger: bool, now: Instant) -> HoldAction {
        self.waiters = self.waiters.saturating_sub(1);
        if self.waiters > 0 || !self.taken {
            return HoldAction::None;
        }
        if !linger {
            return self.give_back();
        }
        self.lease_until = Some(now + LEASE);
        if self.armed {
            HoldAction::None
        } else {
            self.armed = true;
            HoldAction::Arm(now + LEASE)
        }
    }

    /// The progress thread's timer fired.
    pub(crate) fn on_timer(&mut self, now: Instant) -> HoldAction {
        if !self.armed {
            return HoldAction::None;
        }
        self.armed = false;
        match self.lease_until {
            _ if self.waiters > 0 || !self.taken => HoldAction::None,
            Some(until) if until > now => {
                self.armed = true;
                HoldAction::Arm(until)
            }
            _ => self.give_back(),
        }
    }

    /// Whether the sockets are out of the progress thread's epoll set.
    #[cfg(test)]
    pub(crate) fn taken(&self) -> bool {
        self.taken
    }

    fn give_back(&mut self) -> HoldAction {
        self.taken = false;
        self.lease_until = None;
        HoldAction::GiveBack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_waiter_takes_the_sockets_and_the_lease_gives_them_back_when_nobody_returns() {
        let t0 = Instant::now();
        let mut h = SocketHold::default();
        assert_eq!(h.enter(), HoldAction::Take);
        assert_eq!(h.enter(), HoldAction::None, "a second waiter finds them taken");
        assert_eq!(h.leave(true, t0), HoldAction::None, "one still waits");
        assert_eq!(h.leave(true, t0), HoldAction::Arm(t0 + LEASE));
        assert!(h.taken());
        assert_eq!(
            h.on_timer(t0 + LEASE / 2),
            HoldAction::Arm(t0 + LEASE),
            "early: re-armed"
        );
        assert_eq!(h.on_timer(t0 + LEASE), HoldAction::GiveBack);
        assert!(!h.taken());
        assert_eq!(h.on_timer(t0 + LEASE * 2), HoldAction::None, "no timer was armed");
    }

    #[test]
    fn a_waiter_back_within_the_lease_costs_no_system_call_and_extends_it() {
        let t0 = Instant::now();
        let mut h = SocketHold::default();
        assert_eq!(h.enter(), HoldAction::Take);
        assert_eq!(h.leave(true, t0), HoldAction::Arm(t0 + LEASE));
        // A ping-pong: back after 50 µs, many times; one timer stays armed.
        let mut t = t0;
        for _ in 0..20 {
            t += Duration::from_micros(50);
            assert_eq!(h.enter(), HoldAction::None);
            assert_eq!(
                h.on_timer(t),
                HoldAction::None,
                "a waiter is there: the lease ends later"
            );
            t += Duration::from_micros(1);
            assert_eq!(
                h.leave(true, t),
                HoldAction::Arm(t + LEASE),
                "the fired timer is armed again"
            );
        }
        assert!(h.taken());
        assert_eq!(h.on_timer(t + LEASE), HoldAction::GiveBack);
    }

    #[test]
    fn a_waiter_that_gives_up_on_the_sockets_gives_them_back_at_once() {
        let t0 = Instant::now();
        let mut h = SocketHold::default();
        assert_eq!(h.enter(), HoldAction::Take);
        assert_eq!(h.leave(false, t0), HoldAction::GiveBack);
        assert!(!h.taken());
        assert_eq!(h.enter(), HoldAction::Take, "the next waiter takes them again");
        assert_eq!(h.leave(true, t0), HoldAction::Arm(t0 + LEASE));
        // Given up while a lease timer is armed: the timer finds nothing to do.
        assert_eq!(h.enter(), HoldAction::None);
        assert_eq!(h.leave(false, t0), HoldAction::GiveBack);
        assert_eq!(h.on_timer(t0 + LEASE), HoldAction::None);
        assert!(!h.taken());
    }
}
