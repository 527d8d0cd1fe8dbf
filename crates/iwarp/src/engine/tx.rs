//! Transmit: send queue → DDP segments in FPDUs.

use super::inflight::Kind;
use super::{
    Engine, OrqEntry, Payload, Phase, Piece, ReadResp, Rtr, TxHeader, TxMsg, MAX_SEGMENT_PAYLOAD, TX_HIGH_WATER,
};
use softrdma_verbs::qp::SendWqe;
use softrdma_verbs::{SendFlags, WcOpcode, WcStatus, WrOpcode};
use softrdma_wire::{crc32c, fpdu_pad_len, DdpHeader, Opcode, ReadRequest, SegmentHeader, QN_READ_REQUEST, QN_SEND};

impl Engine {
    /// Bytes ready for the socket.
    pub fn tx_pending(&self) -> &[u8] {
        &self.tx[self.tx_off..]
    }

    /// The socket took `n` bytes. SENDs and WRITEs whose last byte is now taken complete
    /// (in posting order, behind any READ still waiting for its response).
    pub fn tx_consumed(&mut self, n: usize) {
        self.stats.tx_bytes += n as u64;
        self.tx_off = (self.tx_off + n).min(self.tx.len());
        if self.tx_off == self.tx.len() {
            self.tx_base += self.tx.len() as u64;
            self.tx.clear();
            self.tx_off = 0;
        }
        if self.phase == Phase::Running && self.inflight.written_through(self.tx_written()) {
            let qp = self.qp.clone();
            self.inflight.release(&*qp);
        }
    }

    /// True if more could be produced right now (used to decide on re-polling).
    pub fn wants_tx(&self) -> bool {
        self.tx_off < self.tx.len()
    }

    /// Appends one FPDU carrying `hdr` and `payload_len` bytes produced by `fill`.
    pub(crate) fn emit_segment(&mut self, hdr: &SegmentHeader, payload_len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        self.try_emit_segment(hdr, payload_len, |out| {
            fill(out);
            true
        });
    }

    /// [`Engine::emit_segment`] with a `fill` that can fail (registered memory that became
    /// inaccessible): then nothing is appended and it returns false.
    fn try_emit_segment(
        &mut self,
        hdr: &SegmentHeader,
        payload_len: usize,
        fill: impl FnOnce(&mut Vec<u8>) -> bool,
    ) -> bool {
        let start = self.tx.len();
        self.tx.extend_from_slice(&[0, 0]);
        let mut h = [0u8; 18];
        let hlen = hdr.write_to(&mut h);
        self.tx.extend_from_slice(&h[..hlen]);
        let before = self.tx.len();
        if !fill(&mut self.tx) {
            self.tx.truncate(start);
            return false;
        }
        debug_assert_eq!(self.tx.len() - before, payload_len);
        let ulpdu_len = self.tx.len() - start - 2;
        self.tx[start..start + 2].copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
        let pad = fpdu_pad_len(ulpdu_len);
        self.tx.extend(std::iter::repeat_n(0u8, pad));
        let crc = if self.cfg.crc { crc32c(&self.tx[start..]) } else { 0 };
        self.tx.extend_from_slice(&crc.to_le_bytes());
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
        while self.tx.len() - self.tx_off < TX_HIGH_WATER && self.phase == Phase::Running {
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
        if !self.try_emit_segment(&hdr, chunk, |out| gather(payload, from, chunk, out)) {
            return self.source_memory_gone(msg);
        }
        msg.sent += chunk;
        if !last {
            self.cur = Some(msg);
        } else if let Some(seq) = msg.seq {
            let end = self.tx_base + self.tx.len() as u64;
            self.inflight.set_end(seq, end);
        }
    }
}

impl Engine {
    /// The memory a message was being sent from is no longer accessible (its MR was
    /// deregistered, or the application unmapped it): a SEND or WRITE fails with
    /// LOC_PROT_ERR and the QP goes to ERR; a READ response ends in a Terminate (the peer's
    /// READ fails with a remote access error), as if the STag had been invalid from the start.
    fn source_memory_gone(&mut self, msg: TxMsg) {
        let why = format!(
            "QP {}: the memory of a message being sent became inaccessible after {} of {} bytes",
            self.qp.qpn(),
            msg.sent,
            msg.total
        );
        match msg.seq {
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

/// Appends `len` bytes of `payload` starting at byte `from`; false (with a prefix possibly
/// appended) if registered memory could not be read.
fn gather(payload: &Payload, mut from: usize, mut len: usize, out: &mut Vec<u8>) -> bool {
    match payload {
        Payload::Inline(d) => {
            out.extend_from_slice(&d[from..from + len]);
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
                if !p.mr.region.append_to(p.off + from, take, out) {
                    return false;
                }
                len -= take;
                from = 0;
            }
            true
        }
    }
}
