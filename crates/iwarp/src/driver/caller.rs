//! Soft-iWARP connections read by an application thread that blocks for a completion event
//! (`ibv_get_cq_event`, see `softrdma_verbs::caller_step`).
//!
//! Such a thread waits on the connections' sockets as well as on its channel. When one
//! becomes readable, it receives and processes what came itself, exactly as the progress
//! thread would (under the connection's lock, taken with `try_lock`: if the progress thread
//! is inside the connection, the waiting thread leaves it alone). The completion and its
//! event then cost one wakeup instead of two.
//!
//! A polling caller (`ibv_poll_cq` that found nothing) runs a non-blocking round of the
//! reactor while connections are open (`Reactor::polling_round`): one `epoll_wait` over every
//! socket, and what is ready is handled on its thread, as the progress thread would. A waiting
//! thread watches at most [`WAIT_FDS_MAX`] connections: with more, the progress thread serves
//! them.

use super::conn::{Phase, TcpConn};
use softrdma_verbs::caller_step::CallerStep;
use softrdma_verbs::fork::PerProcess;
use softrdma_verbs::progress::Event;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, Weak};

/// Connections beyond which a waiting thread no longer watches them itself.
pub(crate) const WAIT_FDS_MAX: usize = 64;

/// The established connections of this process (of its fork generation).
#[derive(Default)]
struct Established(Mutex<Vec<Weak<TcpConn>>>);

impl Established {
    /// Whether a connection is open (without pruning: that is for [`Established::live`]).
    fn any(&self) -> bool {
        let list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().any(|w| w.strong_count() > 0)
    }

    fn live(&self) -> Vec<Arc<TcpConn>> {
        let mut list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    }
}

static CONNS: PerProcess<Arc<Established>> = PerProcess::new();

/// Makes an established connection readable by waiting callers.
pub(crate) fn add(conn: &Arc<TcpConn>) {
    let conns = CONNS.get_or_init(|| {
        let conns = Arc::new(Established::default());
        softrdma_verbs::caller_step::add(Arc::new(Step(conns.clone())));
        conns
    });
    let mut list = conns.0.lock().unwrap_or_else(|p| p.into_inner());
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(conn));
}

struct Step(Arc<Established>);

impl CallerStep for Step {
    /// A polling caller's round of the reactor, while a connection is open (see the module).
    fn step(&self) -> bool {
        self.0.any() && softrdma_verbs::progress::Reactor::existing().is_some_and(|r| r.polling_round())
    }

    fn wait_fds(&self, out: &mut Vec<RawFd>) {
        let live = self.0.live();
        if live.len() > WAIT_FDS_MAX {
            return;
        }
        out.extend(live.iter().filter(|c| c.is_established()).map(|c| c.fd()));
    }

    fn step_ready(&self, ready: &[RawFd]) -> bool {
        let mut any = false;
        for conn in self.0.live() {
            if ready.contains(&conn.fd()) {
                any |= conn.receive_for_caller();
            }
        }
        any
    }
}

impl TcpConn {
    /// Whether the connection carries RDMA traffic now (not closed, handshake over).
    fn is_established(&self) -> bool {
        match self.try_lock() {
            Some(st) => matches!(st.phase, Phase::Established { .. }),
            // Someone is inside: it is alive; a stale fd only wakes the waiter once.
            None => true,
        }
    }

    /// What the progress thread does when the socket is readable, on the caller's thread,
    /// unless another thread is inside the connection; true if it ran.
    fn receive_for_caller(&self) -> bool {
        let Some(mut st) = self.try_lock() else { return false };
        if !matches!(st.phase, Phase::Established { .. }) {
            return false;
        }
        self.on_established(
            &mut st,
            Event {
                readable: true,
                ..Event::default()
            },
        );
        true
    }
}
