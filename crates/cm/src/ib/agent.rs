//! The process's IB CM agent: receives MADs from the soft-RoCE driver (QP1), keeps the table
//! of connections (by communication ID) and listeners (by service ID), and feeds MADs and
//! timer expiries into the per-connection machines. It has no thread of its own: it is a
//! source of the progress thread's reactor ([`softrdma_verbs::progress`]), kicked when work
//! comes and woken by the reactor's timers, so that a MAD is handled in the same progress
//! round that received it (no cross-thread wakeup) and an idle agent never wakes.
//!
//! The driver calls [`Handler::on_mad`] (and [`Handler::on_peer_lost`]) on the progress
//! thread, inside its own round; it only queues the MAD (or the report) and kicks the agent,
//! whose round comes next. The
//! agent parses it and steps the connection (under the connection's lock, which also orders
//! the MADs it sends and the events it posts). Locks are taken in the order connection →
//! tables → queue → reactor, never the other way round; an id's lock is never held while a
//! connection's is taken.

use super::ids::IdAlloc;
use super::link::{Link, LinkState};
use super::mad_io;
use softrdma_roce::gsi::{GsiPeer, MadHandler, ServiceClaim};
use softrdma_roce::liveness::PeerLostHandler;
use softrdma_verbs::progress::{Event, Reactor, Source, Token};
use softrdma_verbs::{Error, Result};
use softrdma_wire::ibcm::{CmMad, CmMessage, Drep, Rej, RejReason, CM_MSG_REP, MAD_LEN};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// At most this many work items or timers in one progress round (then the agent kicks itself
/// and lets the reactor's other sources run).
const ROUND_LIMIT: usize = 64;

/// Work for the agent.
pub(crate) enum Work {
    /// A MAD from the driver.
    Mad(GsiPeer, Box<[u8; MAD_LEN]>),
    /// An id holding this connection was dropped without `destroy`: withdraw it.
    Abandon(Arc<Link>),
    /// The RC QP `qpn` found its peer at the address gone (the driver says why).
    PeerLost(u32, IpAddr, String),
}

#[derive(Default)]
struct Queue {
    work: VecDeque<Work>,
    /// Connection timers: (when, local communication ID).
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    /// The reactor timer armed for the earliest of these (an earlier one re-arms it; a
    /// later-armed timer that fires early only runs an empty round).
    armed: Option<Instant>,
}

/// What the agent does next.
enum Next {
    Work(Work),
    Timer(u32),
}

impl Queue {
    /// The next thing due at `now`: work first, then an expired timer.
    fn pop(&mut self, now: Instant) -> Option<Next> {
        if let Some(w) = self.work.pop_front() {
            return Some(Next::Work(w));
        }
        let Reverse((t, id)) = self.timers.peek().copied()?;
        (t <= now).then(|| {
            self.timers.pop();
            Next::Timer(id)
        })
    }

    /// The earliest timer.
    fn earliest(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// True if `at` needs the reactor's timer re-armed (nothing armed that is still ahead
    /// and no later than `at`); then records it as armed.
    fn arm(&mut self, at: Instant, now: Instant) -> bool {
        let needed = self.armed.is_none_or(|a| a <= now || at < a);
        if needed {
            self.armed = Some(at);
        }
        needed
    }
}

/// A registered listen.
pub(crate) struct ListenEntry {
    pub(crate) token: u64,
    pub(crate) service_id: u64,
    pub(crate) bound: std::net::IpAddr,
    pub(crate) af_only: bool,
    pub(crate) backlog: u32,
    pub(crate) id: Weak<crate::id::IdInner>,
}

/// Connections, listeners and service claims.
#[derive(Default)]
pub(crate) struct Tables {
    pub(crate) links: HashMap<u32, Arc<Link>>,
    /// Passive connections and SIDR requests by (peer address, peer's ID, is SIDR): finds
    /// duplicates.
    pub(crate) by_remote: HashMap<(IpAddr, u32, bool), Arc<Link>>,
    pub(crate) listeners: Vec<ListenEntry>,
    pub(crate) claims: HashMap<u64, (ServiceClaim, usize)>,
    pub(crate) next_token: u64,
}

/// The agent (one per process).
pub(crate) struct Agent {
    pub(crate) ids: IdAlloc,
    tables: Mutex<Tables>,
    queue: Mutex<Queue>,
    /// This process's reactor, and the agent's token in it.
    reactor: &'static Arc<Reactor>,
    token: OnceLock<Token>,
    /// The port in this process's communication IDs.
    port: u16,
    /// The process that started the agent (a forked child has no progress thread to flush).
    pid: u32,
    /// Flush barriers ([`Agent::flush`]): the last token issued, and the highest one that came
    /// back through the driver.
    barrier_next: AtomicU32,
    barrier_seen: Mutex<u32>,
    barrier_cv: Condvar,
}

/// What the driver calls.
struct Handler(Weak<Agent>);

/// The agent as a source of the progress thread's reactor.
struct Driven(Weak<Agent>);

impl Source for Driven {
    fn on_event(&self, _token: Token, _ev: Event) {
        if let Some(a) = self.0.upgrade() {
            a.round();
        }
    }
}

impl MadHandler for Handler {
    fn on_mad(&self, peer: GsiPeer, mad: &[u8]) {
        let Some(a) = self.0.upgrade() else { return };
        let Ok(bytes) = <[u8; MAD_LEN]>::try_from(mad.get(..MAD_LEN).unwrap_or(&[])) else {
            return;
        };
        if let Some(token) = barrier_token(peer, &bytes) {
            let mut seen = lock(&a.barrier_seen);
            *seen = (*seen).max(token);
            a.barrier_cv.notify_all();
            return;
        }
        a.push(Work::Mad(peer, Box::new(bytes)));
    }
}

impl PeerLostHandler for Handler {
    fn on_peer_lost(&self, qpn: u32, peer: IpAddr, why: &str) {
        if let Some(a) = self.0.upgrade() {
            a.push(Work::PeerLost(qpn, peer, why.to_string()));
        }
    }
}

/// The token of a flush barrier: a DREP from this host to a communication ID whose counter
/// half is 0 (never allocated, see [`IdAlloc`]), carrying the token as its local ID.
fn barrier_token(peer: GsiPeer, mad: &[u8; MAD_LEN]) -> Option<u32> {
    if !peer.remote.is_loopback() {
        return None;
    }
    match CmMad::parse(mad).ok()?.msg {
        CmMessage::Drep(d) if d.remote_comm_id >> 16 == 0 => Some(d.local_comm_id),
        _ => None,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The agent of each fork generation: a forked child starts its own, on its own reactor (see
/// `softrdma_verbs::fork`).
static AGENT: softrdma_verbs::fork::PerProcess<std::result::Result<Arc<Agent>, Error>> =
    softrdma_verbs::fork::PerProcess::new();

impl Agent {
    /// The agent, started on first use (driver endpoint, MAD handler, reactor source).
    pub(crate) fn get() -> Result<Arc<Agent>> {
        AGENT.get_or_init(Agent::start).clone()
    }

    /// The agent if it was started.
    pub(crate) fn existing() -> Option<Arc<Agent>> {
        AGENT.get().and_then(|r| r.as_ref().ok()).cloned()
    }

    fn start() -> Result<Arc<Agent>> {
        let port = mad_io::comm_id_port()?;
        let reactor = Reactor::global()?;
        let agent = Arc::new(Agent {
            ids: IdAlloc::new(port),
            tables: Mutex::new(Tables::default()),
            queue: Mutex::new(Queue::default()),
            reactor,
            token: OnceLock::new(),
            port,
            pid: std::process::id(),
            barrier_next: AtomicU32::new(0),
            barrier_seen: Mutex::new(0),
            barrier_cv: Condvar::new(),
        });
        let token = reactor.add(Arc::new(Driven(Arc::downgrade(&agent))));
        let _ = agent.token.set(token);
        let handler = Arc::new(Handler(Arc::downgrade(&agent)));
        mad_io::set_handler(handler.clone())?;
        mad_io::set_peer_lost_handler(handler);
        Ok(agent)
    }

    /// Waits (at most `limit`) until every MAD this process sent before the call has left it:
    /// the soft-RoCE driver hands MADs for this host to its progress thread, in order, so a
    /// barrier MAD sent to ourselves comes back only after them. True once it came back.
    pub(crate) fn flush(&self, limit: Duration) -> bool {
        if std::process::id() != self.pid {
            return true;
        }
        let token = self.barrier_next.fetch_add(1, Ordering::Relaxed).wrapping_add(1).max(1);
        let m = CmMad {
            tid: u64::from(token),
            msg: CmMessage::Drep(Drep {
                local_comm_id: token,
                remote_comm_id: u32::from(self.port),
                ..Drep::default()
            }),
        };
        mad_io::send(IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(Ipv4Addr::LOCALHOST), &m);
        let seen = lock(&self.barrier_seen);
        let (seen, _) = self
            .barrier_cv
            .wait_timeout_while(seen, limit, |seen| *seen < token)
            .unwrap_or_else(|p| p.into_inner());
        *seen >= token
    }

    pub(crate) fn tables(&self) -> MutexGuard<'_, Tables> {
        lock(&self.tables)
    }

    /// Queues work for the agent's next progress round.
    pub(crate) fn push(&self, w: Work) {
        lock(&self.queue).work.push_back(w);
        if let Some(t) = self.token.get() {
            self.reactor.kick(*t);
        }
    }

    /// Runs `link`'s timer at `at`.
    pub(crate) fn schedule(&self, at: Instant, local_id: u32) {
        let mut q = lock(&self.queue);
        q.timers.push(Reverse((at, local_id)));
        self.arm(&mut q, at);
    }

    /// Arms the reactor's timer for `at` if nothing armed covers it.
    fn arm(&self, q: &mut Queue, at: Instant) {
        if q.arm(at, Instant::now()) {
            if let Some(t) = self.token.get() {
                self.reactor.set_timer(*t, at);
            }
        }
    }

    /// A free communication / SIDR request ID.
    pub(crate) fn alloc_id(&self) -> u32 {
        let t = self.tables();
        self.ids.comm_id(|id| t.links.contains_key(&id))
    }

    /// Registers a connection (and its duplicate-detection key).
    pub(crate) fn insert(&self, link: &Arc<Link>, remote_key: Option<(IpAddr, u32, bool)>) {
        let mut t = self.tables();
        t.links.insert(link.local_id, link.clone());
        if let Some(k) = remote_key {
            t.by_remote.insert(k, link.clone());
        }
    }

    /// Forgets a finished connection.
    pub(crate) fn remove(&self, local_id: u32, remote_key: Option<(IpAddr, u32, bool)>) {
        let mut t = self.tables();
        t.links.remove(&local_id);
        if let Some(k) = remote_key {
            if t.by_remote.get(&k).is_some_and(|l| l.local_id == local_id) {
                t.by_remote.remove(&k);
            }
        }
    }

    fn link(&self, local_id: u32) -> Option<Arc<Link>> {
        self.tables().links.get(&local_id).cloned()
    }

    /// One progress round: the queued work and the expired timers, at most [`ROUND_LIMIT`]
    /// of them; then a kick for what is left, or the reactor's timer for the next deadline.
    fn round(self: &Arc<Self>) {
        for _ in 0..ROUND_LIMIT {
            let Some(next) = lock(&self.queue).pop(Instant::now()) else {
                break;
            };
            match next {
                Next::Work(Work::Mad(peer, mad)) => self.on_mad(peer, &mad[..]),
                Next::Work(Work::Abandon(link)) => link.abandon(self),
                Next::Work(Work::PeerLost(qpn, peer, why)) => self.on_peer_lost(qpn, peer, why),
                Next::Timer(id) => {
                    if let Some(l) = self.link(id) {
                        l.on_timer(self);
                    }
                }
            }
        }
        let mut q = lock(&self.queue);
        let now = Instant::now();
        let Some(t) = self.token.get() else { return };
        if !q.work.is_empty() || q.earliest().is_some_and(|at| at <= now) {
            drop(q);
            self.reactor.kick(*t);
        } else if let Some(at) = q.earliest() {
            self.arm(&mut q, at);
        }
    }

    fn on_mad(self: &Arc<Self>, peer: GsiPeer, bytes: &[u8]) {
        let m = match CmMad::parse(bytes) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(from = %peer.remote, "IB CM: dropped a malformed MAD: {e}");
                return;
            }
        };
        tracing::debug!(from = %peer.remote, to = %peer.local, attr = m.msg.attr().name(), tid = m.tid, "IB CM: received");
        let target = match &m.msg {
            CmMessage::Req(r) => return super::listen::on_req(self, peer, m.tid, r),
            CmMessage::SidrReq(r) => return super::listen::on_sidr_req(self, peer, m.tid, r),
            CmMessage::SidrRep(r) => r.request_id,
            CmMessage::Rep(r) => r.remote_comm_id,
            CmMessage::Rtu(r) => r.remote_comm_id,
            CmMessage::Rej(r) => r.remote_comm_id,
            CmMessage::Mra(r) => r.remote_comm_id,
            CmMessage::Dreq(r) => r.remote_comm_id,
            CmMessage::Drep(r) => r.remote_comm_id,
        };
        match self.link(target) {
            Some(l) => l.on_mad(self, peer, &m),
            None => self.unknown(peer, &m),
        }
    }

    /// Ends the connection whose QP found its peer gone (none: the QP was not the CM's).
    fn on_peer_lost(&self, qpn: u32, peer: IpAddr, why: String) {
        let links: Vec<Arc<Link>> = self.tables().links.values().cloned().collect();
        let Some(link) = links.into_iter().find(|l| l.serves_qp(qpn, peer)) else {
            tracing::debug!(qpn, %peer, "IB CM: peer lost on a QP without a connection");
            return;
        };
        let tid = self.ids.tid();
        link.step(self, |ls, now| match &mut ls.kind {
            super::link::Kind::Rc(c) => (c.peer_lost(tid, why, now), ()),
            _ => (Vec::new(), ()),
        });
    }

    /// A message for a connection this process does not (or no longer) know.
    fn unknown(&self, peer: GsiPeer, m: &CmMad) {
        let reply = match &m.msg {
            // Linux cm.c: a REP nobody waits for is rejected (invalid communication ID)...
            CmMessage::Rep(r) => CmMessage::Rej(Rej {
                local_comm_id: r.remote_comm_id,
                remote_comm_id: r.local_comm_id,
                message_rejected: CM_MSG_REP,
                reason: RejReason::InvalidCommId,
                ..Rej::default()
            }),
            // ... and a DREQ for a forgotten connection still gets its DREP.
            CmMessage::Dreq(d) => CmMessage::Drep(Drep {
                local_comm_id: d.remote_comm_id,
                remote_comm_id: d.local_comm_id,
                ..Drep::default()
            }),
            _ => return,
        };
        mad_io::send(peer.local, peer.remote, &CmMad { tid: m.tid, msg: reply });
    }

    /// After a step: reschedule the connection's timer, or forget it once it is over.
    pub(crate) fn settle(&self, link: &Link, ls: &mut LinkState) {
        if ls.finished() {
            self.remove(link.local_id, ls.remote_key);
            return;
        }
        match ls.deadline() {
            Some(d) if ls.scheduled != Some(d) => {
                ls.scheduled = Some(d);
                self.schedule(d, link.local_id);
            }
            Some(_) => {}
            None => ls.scheduled = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer_of(n: Option<Next>) -> Option<u32> {
        match n {
            Some(Next::Timer(id)) => Some(id),
            _ => None,
        }
    }

    #[test]
    fn work_comes_first_then_expired_timers() {
        let t0 = Instant::now();
        let mut q = Queue::default();
        q.timers.push(Reverse((t0 + Duration::from_millis(5), 2)));
        q.timers.push(Reverse((t0, 1)));
        q.work
            .push_back(Work::PeerLost(3, IpAddr::V4(Ipv4Addr::LOCALHOST), String::new()));
        assert!(matches!(q.pop(t0), Some(Next::Work(Work::PeerLost(3, ..)))));
        assert_eq!(timer_of(q.pop(t0)), Some(1));
        // Nothing else is due at t0: the next timer is still ahead.
        assert!(q.pop(t0).is_none());
        assert_eq!(q.earliest(), Some(t0 + Duration::from_millis(5)));
        assert_eq!(timer_of(q.pop(t0 + Duration::from_millis(9))), Some(2));
        assert!(q.pop(t0 + Duration::from_secs(9)).is_none());
        assert_eq!(q.earliest(), None);
    }

    #[test]
    fn the_reactor_timer_is_armed_only_when_nothing_armed_covers_the_deadline() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = Queue::default();
        assert!(q.arm(t0 + ms(10), t0), "nothing armed yet");
        assert!(!q.arm(t0 + ms(20), t0), "a later deadline: the armed timer comes first");
        assert!(!q.arm(t0 + ms(10), t0), "the same deadline");
        assert!(q.arm(t0 + ms(5), t0), "an earlier one");
        assert_eq!(q.armed, Some(t0 + ms(5)));
        assert!(q.arm(t0 + ms(20), t0 + ms(6)), "the armed timer has fired");
    }
}
