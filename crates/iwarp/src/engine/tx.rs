//! Transmit: send queue → DDP segments in FPDUs.

use super::inflight::Kind;
use super::tx_queue::{TxQueue, ZERO_COPY_MIN};
use super::{
    Engine, OrqEntry, Payload, Phase, Piece, ReadResp, Rtr, TxHeader, TxMsg, MAX_SEGMENT_PAYLOAD, TX_HIGH_WATER,
};
use softrdma_verbs::memory::socket_io::Gather;
use softrdma_verbs::mr::MrInner;
use softrdma_verbs::qp::SendWqe;
use softrdma_verbs::{SendFlags, WcOpcode, WcStatus, WrOpcode};
use softrdma_wire::{fpdu_pad_len, DdpHeader, Opcode, ReadRequest, SegmentHeader, QN_READ_REQUEST, QN_SEND};
use std::sync::Arc;

impl Engine {
    /// The next bytes for the socket, as parts for one gathered send
    /// ([`softrdma_verbs::memory::socket_io::send_gather`]); empty when nothing is queued.
    pub fn tx_gather<'a>(&'a self, out: &mut Vec<Gather<'a>>) {
        self.txq.gather(out);
    }

    /// Bytes queued for the socket.
    pub fn tx_queued(&self) -> usize {
        self.txq.len()
    }

    /// Every byte queued for the socket, copied (tests wire engines back to back).
    #[cfg(test)]
    pub(crate) fn tx_bytes(&self) -> Vec<u8> {
        self.txq.to_vec()
    }

    /// The socket took `n` bytes. SENDs and WRITEs whose last byte is now taken complete
    /// (in posting order, behind any READ still waiting for its response).
    pub fn tx_consumed(&mut self, n: usize) {
        self.stats.tx_bytes += n as u64;
        self.txq.consumed(n);
        if self.phase == Phase::Running && self.inflight.written_through(self.txq.written()) {
            self.inflight.release(self.qp.qpn(), &mut self.out);
        }
    }

    /// True while bytes wait for the socket.
    pub fn wants_tx(&self) -> bool {
        !self.txq.is_empty()
    }

    /// True once the stream can no longer be framed (part of an FPDU went out and the rest
    /// cannot follow): the driver resets the connection instead of closing it.
    pub fn wants_reset(&self) -> bool {
        self.reset
    }

    /// The driver could not send registered memory the queue names: part `index` of the last
    /// [`Engine::tx_gather`] was deregistered, or (EFAULT, `index` 0) its pages were no longer
    /// readable. `cause` says which. If nothing of that part's FPDU went out, the FPDU and
    /// everything after it are dropped and the message fails as if its memory had been gone
    /// when it was segmented; otherwise the stream is broken and the connection is reset.
    pub fn tx_memory_lost(&mut self, index: usize, cause: &str) {
        let lost = self.txq.mem_part(index);
        let why = format!(
            "QP {}: the memory of a message being sent became inaccessible ({cause})",
            self.qp.qpn()
        );
        match lost {
            Some(l) if l.fpdu >= self.txq.written() => {
                self.txq.truncate_at(l.fpdu);
                self.memory_gone(l.msg, why);
            }
            _ => {
                self.txq.clear();
                self.reset = true;
                let why = format!("{why}; part of its FPDU had been sent, so the connection is reset");
                tracing::warn!(qpn = self.qp.qpn(), %why, "local protection error");
                let target = lost.and_then(|l| l.msg);
                let status = if target.is_some() {
                    WcStatus::LocProtErr
                } else {
                    WcStatus::WrFlushErr
                };
                self.fail_all(target, status, 0, why);
            }
        }
    }

    /// Appends one FPDU carrying `hdr` and `payload_len` bytes produced by `fill`.
    pub(crate) fn emit_segment(&mut self, hdr: &SegmentHeader, payload_len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        self.try_emit_segment(hdr, payload_len, None, |out| {
            out.own(fill);
            true
        });
    }

    /// [`Engine::emit_segment`] with a `fill` that can fail (registered memory that became
    /// inaccessible): then nothing is appended and it returns false. `msg` is the in-flight
    /// entry of the message the payload belongs to.
    fn try_emit_segment(
        &mut self,
        hdr: &SegmentHeader,
        payload_len: usize,
        msg: Option<u64>,
        fill: impl FnOnce(&mut SegmentPayload<'_>) -> bool,
    ) -> bool {
        let mark = self.txq.mark();
        let fpdu = self.txq.end();
        let mut h = [0u8; 18];
        let hlen = hdr.write_to(&mut h);
        let ulpdu_len = hlen + payload_len;
        self.txq.push_bytes(&(ulpdu_len as u16).to_be_bytes());
        self.txq.push_bytes(&h[..hlen]);
        let mut payload = SegmentPayload {
            q: &mut self.txq,
            fpdu,
            msg,
        };
        if !fill(&mut payload) {
            self.txq.rollback(mark);
            return false;
        }
        debug_assert_eq!(self.txq.end() - fpdu, (2 + ulpdu_len) as u64);
        self.txq.push_bytes(&[0u8; 3][..fpdu_pad_len(ulpdu_len)]);
        let crc = if self.cfg.crc {
            // Over the FPDU as queued: framing and payload, from the MR where it stays there.
            let Some(crc) = self.txq.crc_since(mark) else {
                self.txq.rollback(mark);
                return false;
            };
            crc
        } else {
            0
        };
        self.txq.push_bytes(&crc.to_le_bytes());
        self.stats.tx_fpdus += 1;
        true
    }

    /// Produces FPDUs until the TX buffer is full or no work is ready.
    pub fn fill_tx(&mut self) {
        if self.phase != Phase::Running {
            return;
        }
        if self.qp.state() == softrdma_verbs::QpState::Err {
            self.local_error("QP moved to the error state");
            return;
        }
        if !self.tx_enabled {
            return;
        }
        if let Some(rtr) = self.rtr_pending.take() {
            self.send_rtr(rtr);
        }
        while self.txq.len() < TX_HIGH_WATER && self.phase == Phase::Running {
            if self.cur.is_some() {
                self.continue_message();
                continue;
            }
            if let Some(rr) = self.irq.pop_front() {
                self.start_read_response(rr);
                continue;
            }
            let ord = self.cfg.ord.max(1) as usize;
            let orq_len = self.orq.len();
            let wqe = self.qp.pop_send_if(&mut |w| {
                let is_read = w.wr.opcode == Some(WrOpcode::RdmaRead);
                let fenced = w.wr.flags.contains(SendFlags::FENCE) && orq_len > 0;
                !(fenced || is_read && orq_len >= ord)
            });
            match wqe {
                Some(w) => self.start_wqe(w),
                None => break,
            }
        }
    }

    /// The peer-to-peer RTR (RFC 6581 §9): a zero-length RDMA WRITE (STag 0; a zero-length
    /// WRITE places nothing and checks no STag) or a zero-length RDMA READ, whose empty Read
    /// Response completes nothing.
    fn send_rtr(&mut self, rtr: Rtr) {
        if rtr == Rtr::Write {
            let hdr = SegmentHeader {
                last: true,
                opcode: Opcode::RdmaWrite,
                ddp: DdpHeader::Tagged { stag: 0, to: 0 },
            };
            self.emit_segment(&hdr, 0, |_| {});
            return;
        }
        let msn = self.rreq_msn;
        self.rreq_msn = self.rreq_msn.wrapping_add(1);
        let seq = self.inflight.push(Kind::Rtr { msn }, 0, 0, false);
        self.orq.push_back(OrqEntry {
            seq,
            sink_to: 0,
            total: 0,
            placed: 0,
            dst: Vec::new(),
        });
        self.emit_read_request(
            msn,
            ReadRequest {
                sink_stag: 0,
                sink_to: 0,
                size: 0,
                src_stag: 0,
                src_to: 0,
            },
        );
    }

    fn emit_read_request(&mut self, msn: u32, rr: ReadRequest) {
        let hdr = SegmentHeader {
            last: true,
            opcode: Opcode::ReadRequest,
            ddp: DdpHeader::Untagged {
                inval_stag: 0,
                qn: QN_READ_REQUEST,
                msn,
                mo: 0,
            },
        };
        self.emit_segment(&hdr, softrdma_wire::READ_REQUEST_LEN, |out| rr.emit(out));
    }

    /// Resolves local SGEs; `write` asks for LOCAL_WRITE (READ sinks).
    fn resolve(&self, wqe: &SendWqe, write: bool) -> Result<Vec<Piece>, String> {
        wqe.wr
            .sg_list
            .iter()
            .filter(|s| s.length > 0)
            .map(|s| {
                self.qp
                    .check_local(s.lkey, s.addr, s.length as u64, write)
                    .map(|(mr, off)| Piece {
                        mr,
                        off,
                        len: s.length as usize,
                    })
                    .map_err(|e| format!("lkey {:#x} addr {:#x} len {}: {e}", s.lkey, s.addr, s.length))
            })
            .collect()
    }

    fn local_failure(&mut self, wqe: &SendWqe, status: WcStatus, why: String) {
        tracing::warn!(qpn = self.qp.qpn(), wr_id = wqe.wr.wr_id, %why, "local work request error");
        let op = wqe.wr.opcode.map(|o| o.wc_opcode()).unwrap_or(WcOpcode::Send);
        // Everything sent before it is flushed too; report this WR's error first in order.
        let seq = self.inflight.push_op(Kind::Send { msn: 0 }, op, wqe.wr.wr_id, 0, true);
        self.fail_all(
            Some(seq),
            status,
            0,
            format!("QP {}: WR {:#x}: {why}", self.qp.qpn(), wqe.wr.wr_id),
        );
    }

    fn start_wqe(&mut self, wqe: SendWqe) {
        let Some(op) = wqe.wr.opcode else { return };
        if op == WrOpcode::RdmaRead {
            return self.start_read(wqe);
        }
        let payload = match wqe.inline.clone() {
            Some(data) => Payload::Inline(data),
            None => match self.resolve(&wqe, false) {
                Ok(p) => Payload::Pieces(p),
                Err(why) => return self.local_failure(&wqe, WcStatus::LocProtErr, why),
            },
        };
        let total = wqe.wr.total_len() as usize;
        let (header, kind) = match op {
            WrOpcode::RdmaWrite => (
                TxHeader::Tagged {
                    opcode: Opcode::RdmaWrite,
                    stag: wqe.wr.rkey,
                    to: wqe.wr.remote_addr,
                },
                Kind::Write { stag: wqe.wr.rkey },
            ),
            WrOpcode::Send | WrOpcode::SendWithInv => {
                let solicited = wqe.wr.flags.contains(SendFlags::SOLICITED);
                let inval = op == WrOpcode::SendWithInv;
                let opcode = match (solicited, inval) {
                    (false, false) => Opcode::Send,
                    (true, false) => Opcode::SendSe,
                    (false, true) => Opcode::SendInvalidate,
                    (true, true) => Opcode::SendSeInvalidate,
                };
                let msn = self.send_msn;
                self.send_msn = self.send_msn.wrapping_add(1);
                (
                    TxHeader::Untagged {
                        opcode,
                        msn,
                        inval_stag: if inval { wqe.wr.invalidate_rkey } else { 0 },
                    },
                    Kind::Send { msn },
                )
            }
            other => {
                return self.local_failure(
                    &wqe,
                    WcStatus::LocQpOpErr,
                    format!("opcode {other:?} is not supported on iWARP"),
                );
            }
        };
        let seq = self.inflight.push(kind, wqe.wr.wr_id, total as u32, wqe.signaled);
        self.cur = Some(TxMsg {
            header,
            payload,
            total,
            sent: 0,
            seq: Some(seq),
        });
        self.continue_message();
    }

    fn start_read(&mut self, wqe: SendWqe) {
        let dst = match self.resolve(&wqe, true) {
            Ok(d) => d,
            Err(why) => return self.local_failure(&wqe, WcStatus::LocProtErr, why),
        };
        let total = wqe.wr.total_len() as usize;
        let (sink_stag, sink_to) = wqe.wr.sg_list.first().map(|s| (s.lkey, s.addr)).unwrap_or((0, 0));
        let msn = self.rreq_msn;
        self.rreq_msn = self.rreq_msn.wrapping_add(1);
        let seq = self
            .inflight
            .push(Kind::Read { msn }, wqe.wr.wr_id, total as u32, wqe.signaled);
        self.orq.push_back(OrqEntry {
            seq,
            sink_to,
            total,
            placed: 0,
            dst,
        });
        self.emit_read_request(
            msn,
            ReadRequest {
                sink_stag,
                sink_to,
                size: total as u32,
                src_stag: wqe.wr.rkey,
                src_to: wqe.wr.remote_addr,
            },
        );
    }

    fn start_read_response(&mut self, rr: ReadResp) {
        let payload = match rr.src {
            Some(mr) => Payload::Pieces(vec![Piece {
                mr,
                off: rr.off,
                len: rr.len,
            }]),
            None => Payload::Inline(Vec::new()),
        };
        self.cur = Some(TxMsg {
            header: TxHeader::Tagged {
                opcode: Opcode::ReadResponse,
                stag: rr.sink_stag,
                to: rr.sink_to,
            },
            payload,
            total: rr.len,
            sent: 0,
            seq: None,
        });
        self.continue_message();
    }

    /// Emits the next segment of the current message.
    fn continue_message(&mut self) {
        let Some(mut msg) = self.cur.take() else { return };
        let chunk = (msg.total - msg.sent).min(MAX_SEGMENT_PAYLOAD);
        let last = msg.sent + chunk == msg.total;
        let ddp = match msg.header {
            TxHeader::Untagged { msn, inval_stag, .. } => DdpHeader::Untagged {
                inval_stag,
                qn: QN_SEND,
                msn,
                mo: msg.sent as u32,
            },
            TxHeader::Tagged { stag, to, .. } => DdpHeader::Tagged {
                stag,
                to: to.wrapping_add(msg.sent as u64),
            },
        };
        let opcode = match msg.header {
            TxHeader::Untagged { opcode, .. } | TxHeader::Tagged { opcode, .. } => opcode,
        };
        let hdr = SegmentHeader { last, opcode, ddp };
        let from = msg.sent;
        let payload = &msg.payload;
        if !self.try_emit_segment(&hdr, chunk, msg.seq, |out| gather(payload, from, chunk, out)) {
            return self.source_memory_gone(msg);
        }
        msg.sent += chunk;
        if !last {
            self.cur = Some(msg);
        } else if let Some(seq) = msg.seq {
            let end = self.txq.end();
            self.inflight.set_end(seq, end);
        }
    }
}

impl Engine {
    /// The memory a message was being sent from is no longer accessible (its MR was
    /// deregistered, or the application unmapped it) while it was segmented.
    fn source_memory_gone(&mut self, msg: TxMsg) {
        let why = format!(
            "QP {}: the memory of a message being sent became inaccessible after {} of {} bytes",
            self.qp.qpn(),
            msg.sent,
            msg.total
        );
        self.memory_gone(msg.seq, why);
    }

    /// A SEND or WRITE (in-flight entry `msg`) fails with LOC_PROT_ERR and the QP goes to
    /// ERR; a READ response (`msg` none) ends in a Terminate (the peer's READ fails with a
    /// remote access error), as if the STag had been invalid from the start. The stream is
    /// framed: whatever of the message was queued has been dropped.
    fn memory_gone(&mut self, msg: Option<u64>, why: String) {
        match msg {
            Some(seq) => {
                tracing::warn!(qpn = self.qp.qpn(), %why, "local protection error");
                self.fail_all(Some(seq), WcStatus::LocProtErr, 0, why);
            }
            None => self.send_terminate(
                super::term::read_error(softrdma_verbs::mr::KeyError::InvalidKey),
                None,
                why,
            ),
        }
    }
}

/// The payload of one FPDU being built: copied into the queue, or (slices of at least
/// [`ZERO_COPY_MIN`] bytes) left in the MR to be sent from there.
pub(crate) struct SegmentPayload<'a> {
    q: &'a mut TxQueue,
    fpdu: u64,
    msg: Option<u64>,
}

impl SegmentPayload<'_> {
    /// Appends bytes the engine produces.
    fn own(&mut self, fill: impl FnOnce(&mut Vec<u8>)) {
        self.q.push_with(|out| {
            fill(out);
            true
        });
    }

    /// Appends `len` bytes of `mr` at region offset `off`; false if the memory is gone.
    fn region(&mut self, mr: &Arc<MrInner>, off: usize, len: usize) -> bool {
        if len >= ZERO_COPY_MIN {
            if mr.region.is_revoked() {
                return false;
            }
            self.q.push_mem(mr.clone(), off, len, self.fpdu, self.msg);
            return true;
        }
        self.q.push_with(|out| mr.region.append_to(off, len, out))
    }
}

/// Appends `len` bytes of `payload` starting at byte `from`; false (with a prefix possibly
/// appended) if registered memory could not be read.
fn gather(payload: &Payload, mut from: usize, mut len: usize, out: &mut SegmentPayload<'_>) -> bool {
    match payload {
        Payload::Inline(d) => {
            out.own(|o| o.extend_from_slice(&d[from..from + len]));
            true
        }
        Payload::Pieces(pieces) => {
            for p in pieces {
                if len == 0 {
                    break;
                }
                if from >= p.len {
                    from -= p.len;
                    continue;
                }
                let take = (p.len - from).min(len);
                // Bounds were checked when the WR was resolved: a false return means the
                // region was revoked (deregistered) or its memory faulted.
                if !out.region(&p.mr, p.off + from, take) {
                    return false;
                }
                len -= take;
                from = 0;
            }
            true
        }
    }
}
