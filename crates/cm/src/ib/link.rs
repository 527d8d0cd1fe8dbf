//! One IB CM exchange bound to its rdma_cm id: the sans-I/O machine ([`Conn`], [`SidrClient`]
//! or [`SidrServer`]), the addresses it talks to, and what the QP needs. Every step runs under
//! the link's lock and carries out its actions (MADs sent, reports delivered) before the lock
//! is released, so the peer sees messages and the consumer sees events in machine order.

use super::agent::{Agent, Work};
use super::conn::{Action, Actions, Conn};
use super::mad_io;
use super::qp_setup::RcPath;
use super::report;
use super::sidr::{SidrClient, SidrServer};
use super::timing::Timing;
use crate::id::IdInner;
use softrdma_roce::gsi::GsiPeer;
use softrdma_wire::ibcm::{CmMad, CmMessage, Req, SidrRep, SidrStatus};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

/// The machine of a link (one per link, behind its lock; the size difference is harmless).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Kind {
    /// An RC connection (REQ/REP/RTU/DREQ/DREP).
    Rc(Conn),
    /// An active UD id's SIDR_REQ.
    SidrClient(SidrClient),
    /// A SIDR_REQ a listener received.
    SidrServer(SidrServer),
}

/// A link's state (under its lock).
#[derive(Debug)]
pub(crate) struct LinkState {
    pub(crate) kind: Kind,
    /// The rdma_cm id the events go to.
    pub(crate) id: Weak<IdInner>,
    /// Our address (MADs leave from it).
    pub(crate) local: IpAddr,
    /// The peer's address (MADs go to its QP1).
    pub(crate) remote: IpAddr,
    /// The peer's rdma_cm address (for messages).
    pub(crate) peer: SocketAddr,
    /// QP parameters gathered from both sides.
    pub(crate) path: RcPath,
    /// Passive: the REQ.
    pub(crate) req: Option<Box<Req>>,
    /// The duplicate-detection key (passive side).
    pub(crate) remote_key: Option<(IpAddr, u32, bool)>,
    /// Our node GUID (ARI of a REJ timeout).
    pub(crate) guid: u64,
    /// Timers.
    pub(crate) timing: Timing,
    /// The Q_Key a UD peer must answer with.
    pub(crate) qkey: u32,
    /// The timer the agent has queued for this link.
    pub(crate) scheduled: Option<Instant>,
    /// The id is gone: no more reports.
    pub(crate) abandoned: bool,
}

impl LinkState {
    /// When the machine's timer runs next.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match &self.kind {
            Kind::Rc(c) => c.deadline(),
            Kind::SidrClient(c) => c.deadline(),
            Kind::SidrServer(s) => s.deadline(),
        }
    }

    /// True once the exchange is over for good.
    pub(crate) fn finished(&self) -> bool {
        match &self.kind {
            Kind::Rc(c) => c.finished(),
            Kind::SidrClient(c) => c.finished(),
            Kind::SidrServer(s) => s.finished(),
        }
    }

    /// Sends MADs and delivers reports (which may produce further actions).
    pub(crate) fn execute(&mut self, acts: Actions, now: Instant) {
        let mut q: VecDeque<Action> = acts.into();
        while let Some(a) = q.pop_front() {
            match a {
                Action::Send(m) => mad_io::send(self.local, self.remote, &m),
                Action::Report(r) => q.extend(report::deliver(self, r, now)),
            }
        }
    }
}

/// A link (shared by the agent's tables and the id).
#[derive(Debug)]
pub(crate) struct Link {
    /// Our communication ID (or SIDR request ID).
    pub(crate) local_id: u32,
    st: Mutex<LinkState>,
}

impl Link {
    pub(crate) fn new(local_id: u32, st: LinkState) -> Arc<Link> {
        Arc::new(Link {
            local_id,
            st: Mutex::new(st),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the state, carries out its actions, reschedules; returns `f`'s value.
    pub(crate) fn step<R>(&self, agent: &Agent, f: impl FnOnce(&mut LinkState, Instant) -> (Actions, R)) -> R {
        let mut ls = self.lock();
        let now = Instant::now();
        let (acts, r) = f(&mut ls, now);
        ls.execute(acts, now);
        agent.settle(self, &mut ls);
        r
    }

    /// True if this is the RC connection of QP `qpn` to `peer`.
    pub(crate) fn serves_qp(&self, qpn: u32, peer: IpAddr) -> bool {
        let ls = self.lock();
        matches!(&ls.kind, Kind::Rc(c) if c.local_qpn() == qpn) && ls.remote == peer
    }

    /// A MAD the agent routed here.
    pub(crate) fn on_mad(&self, agent: &Agent, peer: GsiPeer, m: &CmMad) {
        self.step(agent, |ls, now| {
            if peer.remote != ls.remote {
                tracing::debug!(from = %peer.remote, expected = %ls.remote, "IB CM: MAD from the wrong peer ignored");
                return (Vec::new(), ());
            }
            let (acts, out) = match (&mut ls.kind, &m.msg) {
                (Kind::Rc(c), _) => (c.on_mad(m, now), None),
                (Kind::SidrClient(c), CmMessage::SidrRep(rep)) => (Vec::new(), c.on_rep(rep)),
                (Kind::SidrServer(s), CmMessage::SidrReq(_)) => (s.on_dup(), None),
                _ => (Vec::new(), None),
            };
            if let Some(out) = out {
                report::sidr_outcome(ls, out);
            }
            (acts, ())
        })
    }

    /// The agent's timer for this link fired.
    pub(crate) fn on_timer(&self, agent: &Agent) {
        self.step(agent, |ls, now| {
            ls.scheduled = None;
            let (acts, out) = match &mut ls.kind {
                Kind::Rc(c) => (c.on_timer(now), None),
                Kind::SidrClient(c) => c.on_timer(now),
                Kind::SidrServer(s) => {
                    s.on_timer(now);
                    (Vec::new(), None)
                }
            };
            if let Some(out) = out {
                report::sidr_outcome(ls, out);
            }
            (acts, ())
        })
    }

    /// The id is destroyed (or dropped): withdraw as Linux `cm_destroy_id` does. Idempotent.
    pub(crate) fn abandon(&self, agent: &Agent) {
        self.step(agent, |ls, now| {
            if ls.abandoned {
                return (Vec::new(), ());
            }
            ls.abandoned = true;
            let tid = agent.ids.tid();
            let guid = ls.guid.to_be_bytes();
            let acts = match &mut ls.kind {
                Kind::Rc(c) => c.destroy(tid, &guid, now),
                Kind::SidrClient(c) => {
                    c.cancel();
                    Vec::new()
                }
                Kind::SidrServer(s) => s.abandon(
                    SidrRep {
                        status: SidrStatus::Reject,
                        ..SidrRep::default()
                    },
                    now,
                ),
            };
            (acts, ())
        })
    }
}

/// An id's hold on its link. Dropping it without [`Link::abandon`] (an id dropped without
/// `destroy`) has the worker withdraw the connection.
#[derive(Debug)]
pub(crate) struct IbHandle {
    pub(crate) link: Arc<Link>,
}

impl Drop for IbHandle {
    fn drop(&mut self) {
        if let Some(a) = Agent::existing() {
            a.push(Work::Abandon(self.link.clone()));
        }
    }
}
