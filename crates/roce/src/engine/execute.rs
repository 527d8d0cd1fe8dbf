//! Executing in-sequence requests: opcode-sequence and length rules, then SEND into receive
//! WRs, RDMA WRITE into checked memory, RDMA READ and atomics (with responder resources).
//! Every check happens before memory is touched: a rejected packet changes nothing.

use super::local::{capacity, resolve, scatter};
use super::psn::Psn;
use super::replies::{ReadReply, Reply};
use super::resources::{Resource, ResourceKind};
use super::responder::{InMessage, Responder, Step};
use super::sendop::packets_for;
use super::stats::RcStats;
use super::{imm_from_wire, MAX_MESSAGE, MAX_MESSAGE_PACKETS};
use crate::engine::error::RequestError;
use softrdma_verbs::mr::MrInner;
use softrdma_verbs::wr::wc_flags;
use softrdma_verbs::QpHost;
use softrdma_verbs::{Access, WcOpcode, WcStatus, WorkCompletion};
use softrdma_wire::roce::{AtomicEth, RoceOpcode, RocePacket};
use std::sync::{Arc, Mutex};

/// Serialises atomics on registered memory across all QPs of the process (one lock per fork
/// generation: a child never waits for the parent's progress thread, see `softrdma_verbs::fork`).
static ATOMIC_LOCK: softrdma_verbs::fork::PerProcess<Mutex<()>> = softrdma_verbs::fork::PerProcess::new();

impl Responder {
    /// Executes the request at the expected PSN.
    pub(super) fn execute(
        &mut self,
        psn: Psn,
        pkt: &RocePacket<'_>,
        qp: &dyn QpHost,
        stats: &mut RcStats,
    ) -> Result<Step, RequestError> {
        let op = pkt.headers.bth.opcode;
        self.check_sequence(op)?;
        self.check_length(op, pkt.payload.len())?;
        if op.is_send() {
            self.exec_send(pkt, qp)
        } else if op.is_write() {
            self.exec_write(pkt, qp)
        } else if op == RoceOpcode::RcReadRequest {
            self.exec_read(psn, pkt, qp)
        } else if op.is_atomic() {
            self.exec_atomic(psn, pkt, qp, stats)
        } else {
            Err(RequestError::OpcodeSequence {
                got: op,
                in_progress: "none",
            })
        }
    }

    /// MIDDLE/LAST only continue the message in progress; nothing else may interrupt it.
    fn check_sequence(&self, op: RoceOpcode) -> Result<(), RequestError> {
        use RoceOpcode::*;
        let ok = match &self.cur {
            Some(InMessage::Send { .. }) => matches!(op, RcSendMiddle | RcSendLast | RcSendLastImm | RcSendLastInv),
            Some(InMessage::Write { .. }) => matches!(op, RcWriteMiddle | RcWriteLast | RcWriteLastImm),
            None => !(op.is_middle() || op.is_last()),
        };
        if ok {
            return Ok(());
        }
        Err(RequestError::OpcodeSequence {
            got: op,
            in_progress: self.cur.as_ref().map_or("none", InMessage::name),
        })
    }

    /// FIRST/MIDDLE carry exactly one MTU, LAST 1..=MTU, ONLY at most one MTU.
    fn check_length(&self, op: RoceOpcode, len: usize) -> Result<(), RequestError> {
        let mtu = self.cfg.mtu;
        let detail = if (op.is_first() || op.is_middle()) && len != mtu {
            "FIRST/MIDDLE payload is not one full MTU"
        } else if op.is_last() && (len == 0 || len > mtu) {
            "LAST payload is empty or larger than the MTU"
        } else if op.is_only() && len > mtu {
            "ONLY payload is larger than the MTU"
        } else {
            return Ok(());
        };
        Err(RequestError::Length { op, detail })
    }

    fn qp_allows(qp: &dyn QpHost, need: Access, what: &'static str) -> Result<(), RequestError> {
        if qp.attr().qp_access_flags.contains(need) {
            Ok(())
        } else {
            Err(RequestError::QpAccess(what))
        }
    }

    fn exec_send(&mut self, pkt: &RocePacket<'_>, qp: &dyn QpHost) -> Result<Step, RequestError> {
        let h = &pkt.headers;
        let op = h.bth.opcode;
        if op.starts_message() {
            let Some(recv) = qp.take_recv() else {
                return Ok(Step::Rnr);
            };
            let checked = resolve(&recv.sg_list, qp, true);
            let wr_id = recv.wr_id;
            // Held in `cur` from here on, so a rejection completes it.
            self.cur = Some(InMessage::Send {
                recv,
                dst: Vec::new(),
                capacity: 0,
                received: 0,
            });
            let pieces = checked.map_err(|e| RequestError::RecvBuffer {
                wr_id,
                lkey: e.lkey,
                err: e.err,
            })?;
            if let Some(InMessage::Send { dst, capacity: cap, .. }) = self.cur.as_mut() {
                *cap = capacity(&pieces);
                *dst = pieces;
            }
        }
        let Some(InMessage::Send {
            recv,
            dst,
            capacity,
            received,
        }) = self.cur.as_mut()
        else {
            return Err(RequestError::OpcodeSequence {
                got: op,
                in_progress: "none",
            });
        };
        let end = *received + pkt.payload.len() as u64;
        if end > MAX_MESSAGE {
            return Err(RequestError::Length {
                op,
                detail: "SEND longer than 2^31 bytes",
            });
        }
        if end > *capacity {
            return Err(RequestError::RecvTooSmall {
                len: end,
                capacity: *capacity,
            });
        }
        if !scatter(dst, *received as usize, pkt.payload) {
            return Err(RequestError::RecvBuffer {
                wr_id: recv.wr_id,
                lkey: 0,
                err: softrdma_verbs::mr::KeyError::Bounds,
            });
        }
        *received = end;
        if !op.ends_message() {
            return Ok(Step::Placed);
        }
        let mut wc = WorkCompletion::new(recv.wr_id, WcStatus::Success, WcOpcode::Recv, qp.qpn());
        wc.byte_len = end as u32;
        wc.solicited = h.bth.solicited;
        wc.src_qp = self.cfg.dest_qpn;
        if let Some(imm) = h.imm {
            wc.wc_flags |= wc_flags::WITH_IMM;
            wc.imm_data = imm_from_wire(imm);
        }
        if let Some(rkey) = h.ieth {
            qp.invalidate_remote(rkey)
                .map_err(|err| RequestError::Invalidate { rkey, err })?;
            wc.wc_flags |= wc_flags::WITH_INV;
            wc.imm_data = rkey;
        }
        self.cur = None;
        self.out.recv_done(wc);
        self.bump_msn();
        Ok(Step::Placed)
    }

    fn exec_write(&mut self, pkt: &RocePacket<'_>, qp: &dyn QpHost) -> Result<Step, RequestError> {
        let h = &pkt.headers;
        let op = h.bth.opcode;
        let len = pkt.payload.len() as u64;
        if op.starts_message() {
            let reth = h.reth.ok_or(RequestError::MissingHeader(op))?;
            Self::qp_allows(qp, Access::REMOTE_WRITE, "RDMA WRITE")?;
            let total = u64::from(reth.dma_len);
            if total > MAX_MESSAGE {
                return Err(RequestError::Length {
                    op,
                    detail: "DMA length exceeds 2^31",
                });
            }
            if op.is_only() && len != total {
                return Err(RequestError::Length {
                    op,
                    detail: "ONLY payload differs from the DMA length",
                });
            }
            if op.is_first() && total <= self.cfg.mtu as u64 {
                return Err(RequestError::Length {
                    op,
                    detail: "FIRST of a message that fits one packet",
                });
            }
            // The immediate's receive WR first: without one nothing is consumed or written.
            let recv = if op.has_imm() {
                match qp.take_recv() {
                    Some(r) => Some(r),
                    None => return Ok(Step::Rnr),
                }
            } else {
                None
            };
            self.cur = Some(InMessage::Write {
                target: None,
                total,
                placed: 0,
                recv,
            });
            if total > 0 {
                let checked = qp
                    .check_remote(reth.rkey, reth.va, total, Access::REMOTE_WRITE)
                    .map_err(|err| RequestError::RemoteKey {
                        rkey: reth.rkey,
                        va: reth.va,
                        len: total,
                        err,
                    })?;
                if let Some(InMessage::Write { target, .. }) = self.cur.as_mut() {
                    *target = Some(checked);
                }
            }
        }
        let Some(InMessage::Write {
            target,
            total,
            placed,
            recv,
        }) = self.cur.as_mut()
        else {
            return Err(RequestError::OpcodeSequence {
                got: op,
                in_progress: "none",
            });
        };
        let end = *placed + len;
        if end > *total || (op.ends_message() && end != *total) {
            return Err(RequestError::Length {
                op,
                detail: "payload does not add up to the DMA length",
            });
        }
        if op == RoceOpcode::RcWriteLastImm && recv.is_none() {
            match qp.take_recv() {
                Some(r) => *recv = Some(r),
                // Nothing written: the requester resends this LAST after the RNR wait.
                None => return Ok(Step::Rnr),
            }
        }
        if len > 0 {
            let written = target
                .as_ref()
                .is_some_and(|(mr, off)| mr.region.write(off + *placed as usize, pkt.payload));
            if !written {
                return Err(RequestError::RemoteKey {
                    rkey: h.reth.map_or(0, |r| r.rkey),
                    va: 0,
                    len,
                    err: softrdma_verbs::mr::KeyError::Bounds,
                });
            }
        }
        *placed = end;
        if !op.ends_message() {
            return Ok(Step::Placed);
        }
        let total = *total;
        if let Some(InMessage::Write { recv: Some(recv), .. }) = self.cur.take() {
            let mut wc = WorkCompletion::new(recv.wr_id, WcStatus::Success, WcOpcode::RecvRdmaWithImm, qp.qpn());
            wc.byte_len = total as u32;
            wc.solicited = h.bth.solicited;
            wc.src_qp = self.cfg.dest_qpn;
            wc.wc_flags |= wc_flags::WITH_IMM;
            wc.imm_data = h.imm.map_or(0, imm_from_wire);
            self.out.recv_done(wc);
        }
        self.bump_msn();
        Ok(Step::Placed)
    }

    fn check_resources(&self) -> Result<(), RequestError> {
        if self.replies.originals() >= self.cfg.ird {
            return Err(RequestError::TooManyReads { ird: self.cfg.ird });
        }
        Ok(())
    }

    fn exec_read(&mut self, psn: Psn, pkt: &RocePacket<'_>, qp: &dyn QpHost) -> Result<Step, RequestError> {
        let op = pkt.headers.bth.opcode;
        let reth = pkt.headers.reth.ok_or(RequestError::MissingHeader(op))?;
        Self::qp_allows(qp, Access::REMOTE_READ, "RDMA READ")?;
        self.check_resources()?;
        let len = u64::from(reth.dma_len);
        let npkts = packets_for(len, self.cfg.mtu);
        if len > MAX_MESSAGE || npkts > MAX_MESSAGE_PACKETS {
            return Err(RequestError::Length {
                op,
                detail: "DMA length exceeds the message limit",
            });
        }
        let target = if len == 0 {
            None
        } else {
            Some(
                qp.check_remote(reth.rkey, reth.va, len, Access::REMOTE_READ)
                    .map_err(|err| RequestError::RemoteKey {
                        rkey: reth.rkey,
                        va: reth.va,
                        len,
                        err,
                    })?,
            )
        };
        let npkts = npkts as u32;
        // C9-148: a READ counts as a message when it is accepted.
        let msn = self.bump_msn();
        self.history.push(Resource {
            first_psn: psn,
            npkts,
            msn,
            kind: ResourceKind::Read {
                va: reth.va,
                rkey: reth.rkey,
                len: reth.dma_len,
            },
        });
        self.replies.push(Reply::Read(ReadReply {
            target,
            len: reth.dma_len,
            first_psn: psn,
            npkts,
            sent: 0,
            msn,
            original: true,
        }));
        Ok(Step::Replied { npkts })
    }

    fn exec_atomic(
        &mut self,
        psn: Psn,
        pkt: &RocePacket<'_>,
        qp: &dyn QpHost,
        stats: &mut RcStats,
    ) -> Result<Step, RequestError> {
        let op = pkt.headers.bth.opcode;
        let a = pkt.headers.atomic.ok_or(RequestError::MissingHeader(op))?;
        Self::qp_allows(qp, Access::REMOTE_ATOMIC, "atomic")?;
        if a.va % 8 != 0 {
            return Err(RequestError::Misaligned(a.va));
        }
        self.check_resources()?;
        let (mr, off) =
            qp.check_remote(a.rkey, a.va, 8, Access::REMOTE_ATOMIC)
                .map_err(|err| RequestError::RemoteKey {
                    rkey: a.rkey,
                    va: a.va,
                    len: 8,
                    err,
                })?;
        let orig = atomic_rmw(&mr, off, op == RoceOpcode::RcCompareSwap, &a).ok_or(RequestError::RemoteKey {
            rkey: a.rkey,
            va: a.va,
            len: 8,
            err: softrdma_verbs::mr::KeyError::Bounds,
        })?;
        stats.atomics_executed += 1;
        let msn = self.bump_msn();
        self.history.push(Resource {
            first_psn: psn,
            npkts: 1,
            msn,
            kind: ResourceKind::Atomic { orig },
        });
        self.replies.push(Reply::Atomic {
            psn,
            msn,
            orig,
            original: true,
        });
        Ok(Step::Replied { npkts: 1 })
    }
}

/// Compare-and-swap or fetch-and-add on the 8 bytes at `off` (host byte order, as the
/// application sees them); returns the original value. None if out of bounds.
fn atomic_rmw(mr: &Arc<MrInner>, off: usize, cmp_swap: bool, a: &AtomicEth) -> Option<u64> {
    let _guard = ATOMIC_LOCK
        .get_or_init(|| Mutex::new(()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut cur = [0u8; 8];
    if !mr.region.read(off, &mut cur) {
        return None;
    }
    let orig = u64::from_ne_bytes(cur);
    let new = if cmp_swap {
        if orig == a.compare {
            a.swap_add
        } else {
            orig
        }
    } else {
        orig.wrapping_add(a.swap_add)
    };
    if new != orig && !mr.region.write(off, &new.to_ne_bytes()) {
        return None;
    }
    Some(orig)
}
