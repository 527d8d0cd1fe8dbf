//! Shared receive queues.

use crate::pd::Pd;
use crate::wr::{RecvWr, Sge};
use crate::{bail, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// SRQ sizes (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Receive WRs it can hold.
    pub max_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// Limit event threshold (0 = disarmed).
    pub srq_limit: u32,
}

/// Shared SRQ state.
#[derive(Debug)]
pub struct SrqInner {
    pd: Pd,
    attr: Mutex<SrqAttr>,
    queue: Mutex<VecDeque<RecvWr>>,
    /// QPs attached.
    pub users: AtomicU32,
}

impl SrqInner {
    /// Takes the next receive WQE.
    pub fn take(&self) -> Option<RecvWr> {
        self.queue.lock().ok()?.pop_front()
    }
}

/// A shared receive queue (`ibv_srq`). Cloning shares it.
#[derive(Debug, Clone)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

impl Srq {
    /// Creates an SRQ in `pd`.
    pub fn new(pd: &Pd, attr: SrqAttr) -> Result<Srq> {
        let dev = pd.context().device().attr();
        if attr.max_wr == 0 || attr.max_wr > dev.max_srq_wr as u32 {
            bail!(
                Inval,
                "create_srq: max_wr {} outside 1..={}",
                attr.max_wr,
                dev.max_srq_wr
            );
        }
        if attr.max_sge == 0 || attr.max_sge > dev.max_srq_sge as u32 {
            bail!(
                Inval,
                "create_srq: max_sge {} outside 1..={}",
                attr.max_sge,
                dev.max_srq_sge
            );
        }
        pd.inner().qp_count.fetch_add(1, Ordering::Relaxed);
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: pd.clone(),
                attr: Mutex::new(attr),
                queue: Mutex::new(VecDeque::new()),
                users: AtomicU32::new(0),
            }),
        })
    }

    /// Shared state.
    pub fn inner(&self) -> &Arc<SrqInner> {
        &self.inner
    }

    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }

    /// Posts receive WRs (`ibv_post_srq_recv`); on error, the index of the bad WR.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, crate::Error)> {
        let attr = self.query();
        let Ok(mut q) = self.inner.queue.lock() else {
            return Err((0, crate::Error::new(crate::Errno::Io, "post_srq_recv: SRQ poisoned")));
        };
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sg_list.len() > attr.max_sge as usize {
                return Err((
                    i,
                    crate::Error::inval(format!(
                        "post_srq_recv: {} SGEs exceed the SRQ's max_sge {}",
                        wr.sg_list.len(),
                        attr.max_sge
                    )),
                ));
            }
            if q.len() >= attr.max_wr as usize {
                return Err((
                    i,
                    crate::Error::new(
                        crate::Errno::NoMem,
                        format!("post_srq_recv: SRQ full ({} WRs)", attr.max_wr),
                    ),
                ));
            }
            q.push_back(wr.clone());
        }
        Ok(())
    }

    /// Convenience: post one receive of one SGE.
    pub fn post_recv_one(&self, wr_id: u64, sge: Sge) -> crate::Result<()> {
        self.post_recv(&[RecvWr {
            wr_id,
            sg_list: vec![sge],
        }])
        .map_err(|(_, e)| e)
    }

    /// Current attributes.
    pub fn query(&self) -> SrqAttr {
        self.inner.attr.lock().map(|a| *a).unwrap_or_default()
    }

    /// Sets the limit (`IBV_SRQ_LIMIT`); resizing is not supported (EINVAL).
    pub fn modify_limit(&self, limit: u32) -> Result<()> {
        let Ok(mut a) = self.inner.attr.lock() else {
            bail!(Io, "modify_srq: poisoned")
        };
        if limit > a.max_wr {
            bail!(Inval, "modify_srq: limit {limit} exceeds max_wr {}", a.max_wr);
        }
        a.srq_limit = limit;
        Ok(())
    }

    /// Number of posted, unconsumed WRs.
    pub fn len(&self) -> usize {
        self.inner.queue.lock().map(|q| q.len()).unwrap_or(0)
    }

    /// True when no WR is posted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Destroys: EBUSY while QPs use it.
    pub fn destroy(self) -> Result<()> {
        let users = self.inner.users.load(Ordering::Relaxed);
        if users > 0 {
            bail!(Busy, "destroy_srq: still used by {users} QP(s)");
        }
        self.inner.pd.inner().qp_count.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
}
