//! [`PlainSrq`]: a shared receive queue for [`PlainQp`](super::PlainQp)s, with no PD behind it.

use crate::wr::{RecvWr, Sge};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

/// Receive WRs that every QP made with [`PlainQp::with_srq`](super::PlainQp::with_srq) on it
/// takes from, in posting order. No limit event: a test reads [`PlainSrq::len`] instead.
#[derive(Debug, Default)]
pub struct PlainSrq {
    queue: Mutex<VecDeque<RecvWr>>,
}

impl PlainSrq {
    /// An empty queue.
    pub fn new() -> Arc<PlainSrq> {
        Arc::new(PlainSrq::default())
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<RecvWr>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a receive WR.
    pub fn post_recv(&self, wr: RecvWr) {
        self.lock().push_back(wr);
    }

    /// Queues a receive WR of one SGE (`Srq::post_recv_one`).
    pub fn post_recv_one(&self, wr_id: u64, sge: Sge) {
        self.post_recv(RecvWr {
            wr_id,
            sg_list: vec![sge],
        });
    }

    /// WRs queued.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no WR is queued.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The next WR, for a QP's receive.
    pub(super) fn take(&self) -> Option<RecvWr> {
        self.lock().pop_front()
    }
}
