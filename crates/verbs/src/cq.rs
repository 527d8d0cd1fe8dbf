//! Completion queues.
//!
//! Producers (the progress thread) push completions under a short mutex; a poller takes them
//! with no syscall and no wakeup on its path. Arming (`req_notify`) makes the next qualifying
//! completion post one event to the completion channel.

use crate::async_event::{AsyncElement, AsyncEventKind, AsyncEvents};
use crate::channel::CompChannel;
use crate::wr::WorkCompletion;
use crate::{bail, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    No,
    Next,
    Solicited,
}

#[derive(Debug)]
struct CqState {
    entries: VecDeque<WorkCompletion>,
    armed: Armed,
    overflowed: bool,
    /// QPs destroyed while attached: a completion of theirs that a transport still produces
    /// (a flush of a WQE it was working on) is dropped, as after `ibv_destroy_qp` in the
    /// kernel no new completion of the QP appears. Its number leaves the set when a new QP
    /// with that number attaches.
    destroyed: std::collections::HashSet<u32>,
}

/// Shared CQ state.
#[derive(Debug)]
pub struct CqInner {
    id: u64,
    /// The fork generation that created it (see `fork`).
    fork_gen: u32,
    /// Entries it holds (`ibv_resize_cq` changes it).
    capacity: AtomicUsize,
    state: Mutex<CqState>,
    /// The context's async events (the overflow reports `IBV_EVENT_CQ_ERR`).
    events: Option<AsyncEvents>,
    channel: Option<CompChannel>,
    events_acked: AtomicU32,
    events_delivered: AtomicU32,
    /// QPs and SRQs that use this CQ.
    pub users: AtomicU32,
    /// Signaled send WRs posted to QPs on this CQ whose completion has not arrived yet (a
    /// hint for `resize`; a WR lost with its QP leaves it high, which only delays a resize).
    in_flight: AtomicU32,
    /// Counted against the device's `max_cq` (None for CQs made outside a context).
    _charge: Option<crate::quota::Charge>,
    /// The QPs whose completions come here, by QP number (moved to ERR on an overrun).
    qps: Mutex<std::collections::HashMap<u32, std::sync::Weak<crate::qp::QpInner>>>,
}

impl CqInner {
    /// Appends a completion; posts a channel event if armed for it. Returns false on overflow.
    ///
    /// An overrun is an error, as IBTA says (and Linux rxe's `rxe_cq_post` does): the
    /// completion that does not fit is logged (naming the CQ, the QP and the WR), the first
    /// overrun raises `IBV_EVENT_CQ_ERR`, and every QP whose completions come to this CQ
    /// moves to ERR, so its outstanding work flushes into whatever room polling makes.
    pub fn push(self: &Arc<Self>, wc: WorkCompletion) -> bool {
        let notify = {
            let Ok(mut st) = self.state.lock() else { return false };
            if st.destroyed.contains(&wc.qp_num) {
                tracing::debug!(cq = self.id, qpn = wc.qp_num, wr_id = wc.wr_id, status = ?wc.status, "completion of a destroyed QP dropped");
                return true;
            }
            let capacity = self.capacity.load(Ordering::Relaxed);
            if st.entries.len() >= capacity {
                tracing::error!(
                    cq = self.id,
                    capacity,
                    qpn = wc.qp_num,
                    wr_id = wc.wr_id,
                    status = ?wc.status,
                    "CQ overrun: completion dropped"
                );
                let first = !st.overflowed;
                st.overflowed = true;
                drop(st);
                if first {
                    if let Some(ev) = &self.events {
                        ev.post(AsyncEventKind::CqErr, AsyncElement::Cq(self.id));
                    }
                }
                let qps: Vec<_> = self
                    .qps
                    .lock()
                    .map(|m| m.values().filter_map(std::sync::Weak::upgrade).collect())
                    .unwrap_or_default();
                for qp in qps {
                    qp.cq_overrun(self.id);
                }
                return false;
            }
            st.entries.push_back(wc);
            let fire = match st.armed {
                Armed::Next => true,
                Armed::Solicited => wc.solicited || wc.status != crate::wr::WcStatus::Success,
                Armed::No => false,
            };
            if fire {
                st.armed = Armed::No;
            }
            fire
        };
        if notify {
            if let Some(ch) = &self.channel {
                self.events_delivered.fetch_add(1, Ordering::Relaxed);
                ch.inner.notify(Arc::downgrade(self));
            }
        }
        true
    }

    /// Process-unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// QP `qp` sends completions here (an overrun moves it to ERR).
    pub(crate) fn attach_qp(&self, qp: &Arc<crate::qp::QpInner>) {
        if let Ok(mut st) = self.state.lock() {
            st.destroyed.remove(&qp.qpn);
        }
        if let Ok(mut m) = self.qps.lock() {
            m.insert(qp.qpn, Arc::downgrade(qp));
        }
    }

    /// QP `qpn` is destroyed: from now on no completion of it enters this CQ (under the state
    /// lock, so a push racing the destroy either lands before it returns or not at all).
    pub(crate) fn detach_qp(&self, qpn: u32) {
        if let Ok(mut st) = self.state.lock() {
            st.destroyed.insert(qpn);
        }
        if let Ok(mut m) = self.qps.lock() {
            m.remove(&qpn);
        }
    }

    /// A signaled send WR was posted: its completion will come here.
    pub fn completion_expected(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// The completion of a signaled send WR arrived.
    pub fn completion_arrived(&self) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    }
}

/// How long `resize` waits for completions of send WRs already posted.
pub const RESIZE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A completion queue (`ibv_cq`). Cloning shares it.
///
/// Work requests complete into CQs, in order per queue. Here a receive is flushed when its QP
/// moves to the error state (a real transfer: softrdma-roce's `rc_pingpong` example):
///
/// ```
/// use softrdma_verbs::qp_state::{attr_mask, AttrRules};
/// use softrdma_verbs::*;
///
/// let ctx = Context::open_by_name("siw_lo")?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(16, None)?;
/// assert!(cq.poll_one().is_none());
/// let init = QpInitAttr::rc(&cq, 4, 4);
/// let qp = Qp::new(&pd, init, AttrRules::Iwarp)?;
/// qp.modify(&QpAttr { qp_state: Some(QpState::Init), ..QpAttr::default() }, attr_mask::STATE)?;
/// let mr = pd.alloc_mr(256, Access::LOCAL_WRITE)?;
/// qp.post_recv_one(7, mr.sge(0, 256))?;
/// qp.modify(&QpAttr { qp_state: Some(QpState::Err), ..QpAttr::default() }, attr_mask::STATE)?;
/// let wc = cq.wait_for(1, std::time::Duration::from_secs(5));
/// assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::WrFlushErr));
/// # Ok::<(), softrdma_verbs::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Cq {
    inner: Arc<CqInner>,
}

impl Cq {
    pub(crate) fn new(
        cqe: u32,
        max: u32,
        channel: Option<CompChannel>,
        events: Option<AsyncEvents>,
        charge: Option<crate::quota::Charge>,
    ) -> Result<Cq> {
        if cqe == 0 || cqe > max {
            bail!(Inval, "create_cq: {cqe} entries requested; the device allows 1..={max}");
        }
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Ok(Cq {
            inner: Arc::new(CqInner {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                fork_gen: crate::fork::generation(),
                capacity: AtomicUsize::new(cqe as usize),
                events,
                state: Mutex::new(CqState {
                    entries: VecDeque::with_capacity(cqe.min(4096) as usize),
                    armed: Armed::No,
                    overflowed: false,
                    destroyed: std::collections::HashSet::new(),
                }),
                channel,
                events_acked: AtomicU32::new(0),
                events_delivered: AtomicU32::new(0),
                users: AtomicU32::new(0),
                in_flight: AtomicU32::new(0),
                _charge: charge,
                qps: Mutex::new(std::collections::HashMap::new()),
            }),
        })
    }

    pub(crate) fn from_inner(inner: Arc<CqInner>) -> Cq {
        Cq { inner }
    }

    /// Shared state (for producers).
    pub fn inner(&self) -> &Arc<CqInner> {
        &self.inner
    }

    /// Capacity in entries.
    pub fn capacity(&self) -> usize {
        self.inner.capacity.load(Ordering::Relaxed)
    }

    /// Removes the completions of QP `qpn` (its move to RESET: as hardware providers clean
    /// their CQs then, so a QP reused after an error does not find its old flushes).
    pub fn purge_qp(&self, qpn: u32) {
        if let Ok(mut st) = self.inner.state.lock() {
            st.entries.retain(|wc| wc.qp_num != qpn);
        }
    }

    /// Changes the capacity (`ibv_resize_cq`) to at least `cqe` entries, up to the device's
    /// `max`: EINVAL outside `1..=max` or below the completions queued now (as Linux rxe).
    /// Completions of signaled send WRs already posted are first waited for (at most
    /// [`RESIZE_WAIT`]), so that the count does not depend on how fast they arrive.
    pub fn resize(&self, cqe: u32, max: u32) -> Result<()> {
        if cqe == 0 || cqe > max {
            bail!(Inval, "resize_cq: {cqe} entries requested; the device allows 1..={max}");
        }
        let deadline = std::time::Instant::now() + RESIZE_WAIT;
        loop {
            let queued = self.inner.state.lock().map(|st| st.entries.len()).unwrap_or(0);
            let coming = self.inner.in_flight.load(Ordering::Acquire) as usize;
            if coming == 0 || queued + coming <= cqe as usize || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let Ok(st) = self.inner.state.lock() else {
            bail!(Io, "resize_cq: CQ poisoned")
        };
        if (cqe as usize) < st.entries.len() {
            bail!(
                Inval,
                "resize_cq: {cqe} entries cannot hold the {} completions queued now",
                st.entries.len()
            );
        }
        self.inner.capacity.store(cqe as usize, Ordering::Relaxed);
        Ok(())
    }

    /// True for a CQ inherited through `fork`: it is not polled in this process (its
    /// completions belong to the parent's threads, see `fork`).
    pub fn is_stale(&self) -> bool {
        crate::fork::is_stale(self.inner.fork_gen)
    }

    /// Takes up to `out.len()` completions; returns how many (`ibv_poll_cq`); none from a CQ
    /// created before a `fork` ([`Cq::is_stale`]).
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        if self.is_stale() {
            return 0;
        }
        let mut n = self.take(out);
        // Nothing yet: receive on this thread what may be waiting in a socket (see
        // `caller_step`), and look once more.
        if n == 0 && !out.is_empty() && crate::caller_step::run() {
            n = self.take(out);
        }
        yield_if_spinning(n == 0);
        n
    }

    fn take(&self, out: &mut [WorkCompletion]) -> usize {
        let Ok(mut st) = self.inner.state.lock() else { return 0 };
        let n = out.len().min(st.entries.len());
        for slot in out.iter_mut().take(n) {
            if let Some(wc) = st.entries.pop_front() {
                *slot = wc;
            }
        }
        n
    }

    /// Takes one completion, if any.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        if self.is_stale() {
            return None;
        }
        let mut wc = self.inner.state.lock().ok()?.entries.pop_front();
        if wc.is_none() && crate::caller_step::run() {
            wc = self.inner.state.lock().ok()?.entries.pop_front();
        }
        yield_if_spinning(wc.is_none());
        wc
    }

    /// True once a completion was dropped because the CQ was full.
    pub fn overflowed(&self) -> bool {
        self.inner.state.lock().map(|s| s.overflowed).unwrap_or(true)
    }

    /// Arms the CQ (`ibv_req_notify_cq`): the next completion (or the next solicited or error
    /// completion) posts one event to the channel. Completions already queued do not fire.
    /// Without a channel arming succeeds and has no effect.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.is_stale() {
            return Err(crate::fork::stale_error("req_notify_cq"));
        }
        // A CQ without a channel accepts arming (as rdma-core's providers do); nothing fires.
        let Ok(mut st) = self.inner.state.lock() else {
            bail!(Io, "req_notify_cq: CQ {} state poisoned", self.inner.id)
        };
        st.armed = match (st.armed, solicited_only) {
            (Armed::Next, _) | (_, false) => Armed::Next,
            _ => Armed::Solicited,
        };
        Ok(())
    }

    /// Acknowledges `n` events taken with `get_cq_event`.
    pub fn ack_events(&self, n: u32) {
        self.inner.events_acked.fetch_add(n, Ordering::Relaxed);
    }

    /// Events delivered but not yet acknowledged.
    pub fn unacked_events(&self) -> u32 {
        self.inner
            .events_delivered
            .load(Ordering::Relaxed)
            .saturating_sub(self.inner.events_acked.load(Ordering::Relaxed))
    }

    /// Destroys the CQ: EBUSY while a QP or SRQ uses it.
    pub fn destroy(self) -> Result<()> {
        let users = self.inner.users.load(Ordering::Relaxed);
        if users > 0 {
            bail!(Busy, "destroy_cq {}: still used by {users} QP(s)", self.inner.id);
        }
        Ok(())
    }

    /// Polls until `n` completions arrived or `timeout` passed (for tests and tools).
    pub fn wait_for(&self, n: usize, timeout: std::time::Duration) -> Vec<WorkCompletion> {
        let deadline = std::time::Instant::now() + timeout;
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            match self.poll_one() {
                Some(wc) => got.push(wc),
                None if std::time::Instant::now() >= deadline => break,
                None => std::thread::sleep(std::time::Duration::from_micros(200)),
            }
        }
        got
    }
}

/// Empty polls in a row after which a spinning poller yields its CPU once.
const SPIN_BEFORE_YIELD: u32 = 64;

/// Applications spin on `ibv_poll_cq` (perftest does); the completions they wait for come from
/// the progress thread, which on a machine with few CPUs may need the very CPU they spin on.
/// Every [`SPIN_BEFORE_YIELD`] empty polls in a row, the polling thread yields once.
fn yield_if_spinning(empty: bool) {
    thread_local! {
        static EMPTY_POLLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    EMPTY_POLLS.with(|c| {
        if !empty {
            c.set(0);
            return;
        }
        let n = c.get() + 1;
        if n >= SPIN_BEFORE_YIELD {
            c.set(0);
            std::thread::yield_now();
        } else {
            c.set(n);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::{WcOpcode, WcStatus};
    use std::time::Duration;

    fn wc(id: u64, solicited: bool) -> WorkCompletion {
        let mut w = WorkCompletion::new(id, WcStatus::Success, WcOpcode::Recv, 1);
        w.solicited = solicited;
        w
    }

    fn readable(fd: i32, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    #[test]
    fn no_completion_of_a_destroyed_qp_enters_the_cq() {
        let cq = Cq::new(4, 16, None, None, None).unwrap();
        cq.inner().push(wc(1, false)); // QP 1, alive
        cq.inner().detach_qp(1); // ibv_destroy_qp of QP 1
        assert!(cq.inner().push(wc(2, false)), "a late flush is no overrun");
        let mut out = [wc(0, false); 4];
        assert_eq!(cq.poll(&mut out), 1, "what came before the destroy stays");
        assert_eq!(out[0].wr_id, 1);
        assert_eq!(cq.poll(&mut out), 0, "nothing of QP 1 after its destroy");
    }

    #[test]
    fn armed_cq_posts_one_event_to_a_pollable_channel() {
        let ch = CompChannel::new().unwrap();
        let cq = Cq::new(4, 16, Some(ch.clone()), None, None).unwrap();
        cq.inner().push(wc(1, false));
        assert!(!readable(ch.fd(), 0), "an unarmed CQ must not fire");
        assert_eq!(
            ch.get_cq_event(Some(Duration::ZERO)).unwrap_err().errno,
            crate::Errno::Again
        );
        cq.req_notify(false).unwrap();
        cq.inner().push(wc(2, false));
        cq.inner().push(wc(3, false));
        assert!(readable(ch.fd(), 1000));
        let got = ch.get_cq_event(Some(Duration::from_secs(1))).unwrap();
        assert_eq!(got.inner().id(), cq.inner().id());
        assert!(!readable(ch.fd(), 0), "one event per arming");
        assert_eq!(cq.unacked_events(), 1);
        got.ack_events(1);
        assert_eq!(cq.unacked_events(), 0);
        let mut out = [wc(0, false); 8];
        assert_eq!(cq.poll(&mut out), 3);
        assert_eq!(out[2].wr_id, 3);
    }

    #[test]
    fn solicited_arming_waits_for_a_solicited_completion_and_overflow_is_reported() {
        let ch = CompChannel::new().unwrap();
        let cq = Cq::new(2, 16, Some(ch.clone()), None, None).unwrap();
        cq.req_notify(true).unwrap();
        cq.inner().push(wc(1, false));
        assert!(!readable(ch.fd(), 0));
        cq.inner().push(wc(2, true));
        assert!(readable(ch.fd(), 1000));
        assert!(!cq.inner().push(wc(3, false)));
        assert!(cq.overflowed());
        assert_eq!(Cq::new(0, 16, None, None, None).unwrap_err().errno, crate::Errno::Inval);
        assert_eq!(cq.req_notify(false).map_err(|e| e.errno), Ok(()));
        let no_channel = Cq::new(1, 16, None, None, None).unwrap();
        no_channel.req_notify(false).unwrap();
        assert!(no_channel.inner().push(wc(9, false)));
    }
}
