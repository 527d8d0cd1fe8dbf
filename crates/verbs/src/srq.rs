//! Shared receive queues.

use crate::async_event::{AsyncElement, AsyncEventKind};
use crate::pd::Pd;
use crate::wr::{RecvWr, Sge};
use crate::{bail, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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
    /// Process-unique id (names the SRQ in async events).
    pub id: u64,
    pd: Pd,
    /// The fork generation that created it (see `fork`).
    fork_gen: u32,
    attr: Mutex<SrqAttr>,
    queue: Mutex<VecDeque<RecvWr>>,
    /// QPs attached.
    pub users: AtomicU32,
    /// Counted against the device's `max_srq`.
    _charge: crate::quota::Charge,
}

impl SrqInner {
    /// Takes the next receive WQE. An armed limit (`srq_limit` > 0) that the queue falls
    /// below fires `IBV_EVENT_SRQ_LIMIT_REACHED` once and disarms.
    pub fn take(&self) -> Option<RecvWr> {
        let (wr, left) = {
            let mut q = self.queue.lock().ok()?;
            let wr = q.pop_front()?;
            (wr, q.len())
        };
        let fired = self.attr.lock().is_ok_and(|mut a| {
            let fire = a.srq_limit > 0 && (left as u32) < a.srq_limit;
            if fire {
                a.srq_limit = 0;
            }
            fire
        });
        if fired {
            self.pd
                .context()
                .async_events()
                .post(AsyncEventKind::SrqLimitReached, AsyncElement::Srq(self.id));
        }
        Some(wr)
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
        if attr.srq_limit > attr.max_wr {
            bail!(
                Inval,
                "create_srq: srq_limit {} exceeds max_wr {}",
                attr.srq_limit,
                attr.max_wr
            );
        }
        let charge = pd.context().charge(crate::quota::ObjKind::Srq, "create_srq")?;
        pd.inner().qp_count.fetch_add(1, Ordering::Relaxed);
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Ok(Srq {
            inner: Arc::new(SrqInner {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                pd: pd.clone(),
                fork_gen: crate::fork::generation(),
                attr: Mutex::new(attr),
                queue: Mutex::new(VecDeque::new()),
                users: AtomicU32::new(0),
                _charge: charge,
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
        if crate::fork::is_stale(self.inner.fork_gen) {
            return Err((0, crate::fork::stale_error("post_srq_recv")));
        }
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

    /// Sets the limit (`IBV_SRQ_LIMIT`, arming the limit event; 0 disarms).
    pub fn modify_limit(&self, limit: u32) -> Result<()> {
        self.modify(None, Some(limit))
    }

    /// `ibv_modify_srq`: a new `max_wr` (`IBV_SRQ_MAX_WR`, as Linux rxe: at least the WRs
    /// posted now and the limit, at most the device's `max_srq_wr`) and/or a new limit
    /// (`IBV_SRQ_LIMIT`, at most `max_wr`).
    pub fn modify(&self, max_wr: Option<u32>, limit: Option<u32>) -> Result<()> {
        let dev_max = self.inner.pd.context().device().attr().max_srq_wr as u32;
        let posted = self.len() as u32;
        let Ok(mut a) = self.inner.attr.lock() else {
            bail!(Io, "modify_srq: poisoned")
        };
        let new_max = max_wr.unwrap_or(a.max_wr);
        let new_limit = limit.unwrap_or(a.srq_limit);
        if let Some(m) = max_wr {
            if m == 0 || m > dev_max {
                bail!(Inval, "modify_srq: max_wr {m} outside 1..={dev_max}");
            }
            if m < posted {
                bail!(Inval, "modify_srq: max_wr {m} is below the {posted} WRs posted now");
            }
        }
        if new_limit > new_max {
            bail!(Inval, "modify_srq: limit {new_limit} exceeds max_wr {new_max}");
        }
        a.max_wr = new_max;
        a.srq_limit = new_limit;
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
