//! [`PlainQp`]: a [`QpHost`] over plain data, with no device, PD or CQ behind it.
//!
//! Work queues are vectors, completions and async events are collected in order, and keys
//! live in the QP's own table (checked by the same rules as the process's table:
//! [`mr::local_match`], [`mr::remote_match`]). An engine test posts work, moves packets or bytes
//! between two engines itself, and reads what completed; nothing runs in the background.
//!
//! The QP behaves as a real one with its transport driver attached (an engine serves it):
//! posting to it in ERR queues the WR for the engine to flush, as `Qp::post_send` does then.
//! After [`PlainQp::detach`] (the driver dropped its engine) posts in ERR flush at once.

mod post;
#[cfg(test)]
mod post_tests;
mod srq;

pub use srq::PlainSrq;

use super::{KeyMatch, QpHost};
use crate::async_event::AsyncEventKind;
use crate::memory::MemRegion;
use crate::mr::{self, KeyError, MrInner};
use crate::qp::{QpAttr, SendWqe};
use crate::qp_state::QpState;
use crate::wr::{Access, MwBind, RecvWr, WcOpcode, WcStatus, WorkCompletion};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The protection domain every [`PlainQp::register`]ed region belongs to.
pub const PLAIN_PD: u64 = 1;

/// A QP host over vectors and a private key table.
#[derive(Debug)]
pub struct PlainQp {
    qpn: u32,
    srq: Option<Arc<PlainSrq>>,
    inner: Mutex<Plain>,
}

#[derive(Debug)]
struct Plain {
    state: QpState,
    attr: QpAttr,
    sq: VecDeque<SendWqe>,
    rq: VecDeque<RecvWr>,
    /// Send WRs posted and not yet completed (a real QP's send-queue slots).
    sends_outstanding: u32,
    /// An engine serves the QP (false after [`PlainQp::detach`]).
    served: bool,
    send_wcs: Vec<WorkCompletion>,
    recv_wcs: Vec<WorkCompletion>,
    events: Vec<AsyncEventKind>,
    keys: HashMap<u32, Arc<MrInner>>,
}

/// Keys unique in the process, as the process's table's are: a key of one [`PlainQp`] never
/// names a region of another by accident.
fn next_key() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0x100);
    loop {
        let key = NEXT.fetch_add(0x100, Ordering::Relaxed);
        if key != 0 {
            return key;
        }
    }
}

impl PlainQp {
    /// QP `qpn` in `state` with attributes `attr` (the engine's configuration is separate).
    pub fn new(qpn: u32, state: QpState, attr: QpAttr) -> Arc<PlainQp> {
        PlainQp::build(qpn, state, attr, None)
    }

    /// Like [`PlainQp::new`], taking its receive WRs from `srq` (shared with other QPs).
    pub fn with_srq(qpn: u32, state: QpState, attr: QpAttr, srq: Arc<PlainSrq>) -> Arc<PlainQp> {
        PlainQp::build(qpn, state, attr, Some(srq))
    }

    fn build(qpn: u32, state: QpState, attr: QpAttr, srq: Option<Arc<PlainSrq>>) -> Arc<PlainQp> {
        Arc::new(PlainQp {
            qpn,
            srq,
            inner: Mutex::new(Plain {
                state,
                attr,
                sq: VecDeque::new(),
                rq: VecDeque::new(),
                sends_outstanding: 0,
                served: true,
                send_wcs: Vec::new(),
                recv_wcs: Vec::new(),
                events: Vec::new(),
                keys: HashMap::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Plain> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the state (as `modify_qp` would, without its checks; its transport then syncs).
    pub fn set_state(&self, state: QpState) {
        self.lock().state = state;
    }

    /// A zeroed region of `len` bytes in [`PLAIN_PD`] with `access`; its lkey and rkey are
    /// equal and unique in the process.
    pub fn register(&self, len: usize, access: Access) -> Arc<MrInner> {
        self.register_in(PLAIN_PD, len, access)
    }

    /// Like [`PlainQp::register`], in protection domain `pd` instead: the process's table
    /// holds every PD's keys, so a request naming one of another PD finds it and is refused
    /// ([`KeyError::WrongPd`]).
    pub fn register_in(&self, pd: u64, len: usize, access: Access) -> Arc<MrInner> {
        let region = MemRegion::allocate(len);
        let key = next_key();
        let iova = region.addr();
        let mr = Arc::new(MrInner::region(key, pd, iova, access, region));
        self.lock().keys.insert(key, mr.clone());
        mr
    }

    /// Forgets a key (as `ibv_dereg_mr` does for the table).
    pub fn deregister(&self, key: u32) {
        self.lock().keys.remove(&key);
    }

    /// Send WRs posted and not yet completed or retired (`QpInner::sends_outstanding`).
    pub fn sends_outstanding(&self) -> u32 {
        self.lock().sends_outstanding
    }

    /// The engine is gone (as `QpInner::detach_driver`): in ERR, what is queued flushes now,
    /// and later posts flush at once.
    pub fn detach(&self) {
        let (sends, recvs) = {
            let mut p = self.lock();
            p.served = false;
            if p.state != QpState::Err {
                return;
            }
            (p.sq.drain(..).collect(), p.rq.drain(..).collect())
        };
        self.flush(sends, recvs);
    }

    /// Send-side completions so far, taken.
    pub fn take_send_wcs(&self) -> Vec<WorkCompletion> {
        std::mem::take(&mut self.lock().send_wcs)
    }

    /// Receive completions so far, taken.
    pub fn take_recv_wcs(&self) -> Vec<WorkCompletion> {
        std::mem::take(&mut self.lock().recv_wcs)
    }

    /// Async events reported so far, in order.
    pub fn events(&self) -> Vec<AsyncEventKind> {
        self.lock().events.clone()
    }
}

impl QpHost for PlainQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        self.lock().state
    }

    fn attr(&self) -> QpAttr {
        self.lock().attr
    }

    fn pop_send_if(&self, accept: &mut dyn FnMut(&SendWqe) -> bool) -> Option<SendWqe> {
        let mut p = self.lock();
        if p.state != QpState::Rts || !accept(p.sq.front()?) {
            return None;
        }
        p.sq.pop_front()
    }

    fn take_recv(&self) -> Option<RecvWr> {
        match &self.srq {
            Some(srq) => srq.take(),
            None => self.lock().rq.pop_front(),
        }
    }

    fn complete_send(&self, wc: WorkCompletion, signaled: bool) {
        let mut p = self.lock();
        p.sends_outstanding = p.sends_outstanding.saturating_sub(1);
        if signaled || wc.status != WcStatus::Success {
            p.send_wcs.push(wc);
        }
    }

    fn complete_recv(&self, wc: WorkCompletion) {
        self.lock().recv_wcs.push(wc);
    }

    fn enter_error(&self) -> (Vec<SendWqe>, Vec<RecvWr>) {
        let mut p = self.lock();
        let entered = p.state != QpState::Err;
        p.state = QpState::Err;
        // A QP on an SRQ takes no more WQEs from it (as QpInner reports it).
        if entered && self.srq.is_some() {
            p.events.push(AsyncEventKind::QpLastWqeReached);
        }
        (p.sq.drain(..).collect(), p.rq.drain(..).collect())
    }

    fn flush(&self, sends: Vec<SendWqe>, recvs: Vec<RecvWr>) {
        for w in sends {
            let op = w.wr.opcode.map(|o| o.wc_opcode()).unwrap_or(WcOpcode::Send);
            let wc = WorkCompletion::new(w.wr.wr_id, WcStatus::WrFlushErr, op, self.qpn);
            self.complete_send(wc, w.signaled);
        }
        for r in recvs {
            let wc = WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            self.complete_recv(wc);
        }
    }

    fn report_fatal(&self) {
        self.lock().events.push(AsyncEventKind::QpFatal);
    }

    fn report_comm_established(&self) {
        self.lock().events.push(AsyncEventKind::CommEst);
    }

    fn check_local(&self, lkey: u32, addr: u64, len: u64, write: bool) -> Result<KeyMatch, KeyError> {
        let found = self.lock().keys.get(&lkey).cloned().ok_or(KeyError::InvalidKey)?;
        mr::local_match(found, lkey, PLAIN_PD, addr, len, write)
    }

    fn check_remote(&self, rkey: u32, addr: u64, len: u64, need: Access) -> Result<KeyMatch, KeyError> {
        let found = self.lock().keys.get(&rkey).cloned().ok_or(KeyError::InvalidKey)?;
        mr::remote_match(found, rkey, PLAIN_PD, self.qpn, addr, len, need)
    }

    fn invalidate_remote(&self, rkey: u32) -> Result<(), KeyError> {
        let found = self.lock().keys.get(&rkey).cloned().ok_or(KeyError::InvalidKey)?;
        found.remote_valid.store(false, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    fn bind_mw(&self, bind: &MwBind) -> Result<(), String> {
        Err(format!(
            "memory window {:#x}: a PlainQp has no windows (they live in the process's key table)",
            bind.mw_rkey
        ))
    }

    fn invalidate_mw(&self, _rkey: u32) -> Result<(), KeyError> {
        Err(KeyError::InvalidKey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::{SendFlags, SendWr, Sge};

    #[test]
    fn keys_follow_the_process_tables_rules() {
        let qp = PlainQp::new(7, QpState::Rts, QpAttr::default());
        let mr = qp.register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let base = mr.region.addr();
        assert!(qp.check_local(mr.lkey, base, 64, true).is_ok());
        assert_eq!(
            qp.check_local(mr.lkey, base + 1, 64, false).err(),
            Some(KeyError::Bounds)
        );
        assert_eq!(
            qp.check_remote(mr.rkey, base, 8, Access::REMOTE_READ).err(),
            Some(KeyError::Rights)
        );
        assert_eq!(
            qp.check_local(mr.lkey ^ 0x100, base, 1, false).err(),
            Some(KeyError::InvalidKey)
        );
        qp.invalidate_remote(mr.rkey).unwrap();
        assert_eq!(
            qp.check_remote(mr.rkey, base, 8, Access::REMOTE_WRITE).err(),
            Some(KeyError::InvalidKey)
        );
        qp.deregister(mr.lkey);
        assert_eq!(
            qp.check_local(mr.lkey, base, 1, false).err(),
            Some(KeyError::InvalidKey)
        );
    }

    #[test]
    fn queues_complete_in_order_and_flush() {
        let qp = PlainQp::new(9, QpState::Rts, QpAttr::default());
        let sge = Sge {
            addr: 0,
            length: 0,
            lkey: 0,
        };
        let mut wr = SendWr::send(1, vec![sge]);
        wr.flags = SendFlags::SIGNALED;
        qp.post_send(wr);
        qp.post_send(SendWr::send(2, vec![]));
        qp.post_recv(RecvWr {
            wr_id: 3,
            sg_list: vec![],
        });
        assert_eq!(qp.pop_send_if(&mut |w| w.wr.wr_id == 1).map(|w| w.signaled), Some(true));
        qp.complete_send(WorkCompletion::new(1, WcStatus::Success, WcOpcode::Send, 9), true);
        let (s, r) = qp.enter_error();
        assert_eq!(qp.state(), QpState::Err);
        assert_eq!(qp.pop_send_if(&mut |_| true).map(|w| w.wr.wr_id), None);
        qp.flush(s, r);
        let sends: Vec<(u64, WcStatus)> = qp.take_send_wcs().iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(sends, vec![(1, WcStatus::Success), (2, WcStatus::WrFlushErr)]);
        let recvs: Vec<(u64, WcStatus)> = qp.take_recv_wcs().iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(recvs, vec![(3, WcStatus::WrFlushErr)]);
    }
}
