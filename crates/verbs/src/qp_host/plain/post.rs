//! Posting to a [`PlainQp`]: the checks `Qp::post_send` and `Qp::post_recv` make that an
//! engine can observe (the state, an SRQ, inline data copied at post time), without a CQ.

use super::PlainQp;
use crate::bail;
use crate::qp::SendWqe;
use crate::qp_host::QpHost;
use crate::qp_state::QpState;
use crate::wr::{RecvWr, SendFlags, SendWr, WrOpcode};
use crate::{Error, Result};

impl PlainQp {
    /// Queues a send WR (signaled if it asks to be), as `Qp::post_send` on a QP whose driver
    /// is attached: EINVAL before RTS; in ERR the engine flushes it (after
    /// [`PlainQp::detach`], it flushes at once). An INLINE WR's bytes are copied now, through
    /// this QP's keys. Queue sizes are not limited.
    pub fn try_post_send(&self, wr: SendWr) -> Result<()> {
        let state = self.state();
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            bail!(
                Inval,
                "post_send on QP {}: the QP is in {state}; sends need RTS",
                self.qpn
            );
        }
        let inline = self.inline_bytes(&wr)?;
        let signaled = wr.flags.contains(SendFlags::SIGNALED);
        let wqe = SendWqe { wr, inline, signaled };
        let flush_now = {
            let mut p = self.lock();
            p.sends_outstanding += 1;
            if p.state == QpState::Err && !p.served {
                Some(wqe)
            } else {
                p.sq.push_back(wqe);
                None
            }
        };
        if let Some(wqe) = flush_now {
            self.flush(vec![wqe], Vec::new());
        }
        Ok(())
    }

    /// [`PlainQp::try_post_send`] for a WR the test knows is valid.
    ///
    /// # Panics
    /// If the post is refused (the QP before RTS, an unreadable inline SGE).
    pub fn post_send(&self, wr: SendWr) {
        if let Err(e) = self.try_post_send(wr) {
            panic!("{e}");
        }
    }

    /// Queues a receive WR, as `Qp::post_recv` on a QP whose driver is attached: EINVAL in
    /// RESET or on a QP with an SRQ; in ERR the engine flushes it (after
    /// [`PlainQp::detach`], it flushes at once).
    pub fn try_post_recv(&self, wr: RecvWr) -> Result<()> {
        let flush_now = {
            let mut p = self.lock();
            if p.state == QpState::Reset {
                bail!(Inval, "post_recv on QP {}: the QP is in RESET", self.qpn);
            }
            if self.srq.is_some() {
                bail!(
                    Inval,
                    "post_recv on QP {}: the QP uses an SRQ; post to the SRQ",
                    self.qpn
                );
            }
            if p.state == QpState::Err && !p.served {
                Some(wr)
            } else {
                p.rq.push_back(wr);
                None
            }
        };
        if let Some(wr) = flush_now {
            self.flush(Vec::new(), vec![wr]);
        }
        Ok(())
    }

    /// [`PlainQp::try_post_recv`] for a WR the test knows is valid.
    ///
    /// # Panics
    /// If the post is refused (the QP in RESET, or on an SRQ).
    pub fn post_recv(&self, wr: RecvWr) {
        if let Err(e) = self.try_post_recv(wr) {
            panic!("{e}");
        }
    }

    /// The payload of an INLINE WR (not a READ), gathered from its SGEs through this QP's
    /// keys; `None` for any other WR.
    fn inline_bytes(&self, wr: &SendWr) -> Result<Option<Vec<u8>>> {
        if !wr.flags.contains(SendFlags::INLINE) || wr.opcode == Some(WrOpcode::RdmaRead) {
            return Ok(None);
        }
        let mut data = Vec::new();
        for s in &wr.sg_list {
            let (mr, off) = self
                .check_local(s.lkey, s.addr, u64::from(s.length), false)
                .map_err(|e| {
                    Error::inval(format!(
                        "post_send on QP {}: inline SGE lkey {:#x}: {e}",
                        self.qpn, s.lkey
                    ))
                })?;
            if !mr.region.append_to(off, s.length as usize, &mut data) {
                bail!(
                    Fault,
                    "post_send on QP {}: inline SGE lkey {:#x}: the region is not readable",
                    self.qpn,
                    s.lkey
                );
            }
        }
        Ok(Some(data))
    }
}
