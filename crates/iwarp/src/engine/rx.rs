//! Receive: FPDUs from the stream → placement, receive completions, READ responses, Terminates.

use super::term::{read_error, tagged_error};
use super::{Engine, Phase, Piece, ReadResp, RecvInProgress};
use softrdma_verbs::mr::{KeyError, MrInner};
use softrdma_verbs::wr::wc_flags;
use softrdma_verbs::{Access, WcOpcode, WcStatus, WorkCompletion};
use softrdma_wire::{
    parse_fpdu, term, DdpHeader, Opcode, ReadRequest, SegmentHeader, TermLayer, Terminate, WireError, QN_READ_REQUEST,
    QN_SEND, QN_TERMINATE,
};
use std::sync::Arc;

/// Scatters `data` into `pieces` starting at byte `at` of the buffer list.
fn scatter(pieces: &[Piece], mut at: usize, mut data: &[u8]) -> bool {
    for p in pieces {
        if data.is_empty() {
            break;
        }
        if at >= p.len {
            at -= p.len;
            continue;
        }
        let take = (p.len - at).min(data.len());
        if !p.mr.region.write(p.off + at, &data[..take]) {
            return false;
        }
        data = &data[take..];
        at = 0;
    }
    data.is_empty()
}

/// The receive buffer of a new connection.
pub(super) const RX_BUFFER_START: usize = 16 * 1024;
/// The size the receive buffer doubles to while receives fill it.
const RX_BUFFER_BATCH: usize = 256 * 1024;
/// The free space a receive from the socket gets at least ([`Engine::rx_scatter`]).
pub(super) const RX_FREE_MIN: usize = 4 * 1024;

impl Engine {
    /// Free space to read socket bytes into (at least 64 KiB). (A driver that reads into it
    /// alone forgoes direct placement: see [`Engine::rx_scatter`].)
    pub fn rx_space(&mut self) -> &mut [u8] {
        self.grow_rx(64 * 1024);
        &mut self.rx[self.rx_len..]
    }

    /// Makes at least `min_free` bytes of the receive buffer free; doubles it (up to
    /// [`RX_BUFFER_BATCH`]) after a receive that filled it, so that a stream of FPDUs takes
    /// few receive calls, while a connection that never streams keeps a small buffer
    /// (allocating, zeroing and faulting in 256 KiB for each new connection was a fifth of a
    /// CM cycle's time).
    pub(super) fn grow_rx(&mut self, min_free: usize) {
        let free = self.rx.len() - self.rx_len;
        if free < min_free || (self.rx_filled && self.rx.len() < RX_BUFFER_BATCH) {
            let grow = (self.rx.len() * 2).max(self.rx_len + min_free);
            self.rx.resize(grow, 0);
        }
        self.rx_filled = false;
    }

    /// `n` bytes were read into [`Engine::rx_space`]: process every complete FPDU.
    pub fn rx_commit(&mut self, n: usize) {
        self.stats.rx_bytes += n as u64;
        self.rx_len = (self.rx_len + n).min(self.rx.len());
        self.rx_filled = self.rx_len == self.rx.len();
        let pos = self.direct_from_buffer(0);
        let pos = self.skip_trailer(pos);
        let mut pos = self.check_trailer(pos);
        while self.phase == Phase::Running && self.direct.is_none() && self.crc_pending.is_none() {
            let buf = &self.rx[pos..self.rx_len];
            match parse_fpdu(buf, self.cfg.crc) {
                Ok(None) => {
                    pos = self.try_direct(pos);
                    break;
                }
                Ok(Some(f)) => {
                    let (start, len, wire) = (pos + 2, f.ulpdu.len(), f.wire_len);
                    // Take the ULPDU out of the buffer borrow for the handler.
                    let ulpdu = std::mem::take(&mut self.rx);
                    self.on_ulpdu(&ulpdu[start..start + len]);
                    self.rx = ulpdu;
                    pos += wire;
                    self.stats.rx_fpdus += 1;
                }
                Err(WireError::BadCrc { got, computed }) => self.mpa_crc_error(got, computed, ""),
                Err(e) => {
                    self.send_terminate(
                        (TermLayer::Llp, term::llp::MPA, term::llp::TCP_STREAM_LOST),
                        None,
                        format!("bad FPDU: {e}"),
                    );
                }
            }
        }
        if self.phase != Phase::Running {
            self.rx_len = 0;
            return;
        }
        self.rx.copy_within(pos..self.rx_len, 0);
        self.rx_len -= pos;
    }

    /// An FPDU whose CRC field (`got`) is not the CRC computed over it: the Terminate of
    /// RFC 5044 (LLP, MPA, CRC error), whether the FPDU was buffered or placed directly
    /// (`note` says which, for the reason).
    pub(super) fn mpa_crc_error(&mut self, got: u32, computed: u32, note: &str) {
        let why = format!("MPA CRC error: FPDU carries {got:#010x}, computed {computed:#010x}{note}");
        self.send_terminate((TermLayer::Llp, term::llp::MPA, term::llp::CRC_ERROR), None, why);
    }

    fn on_ulpdu(&mut self, ulpdu: &[u8]) {
        self.tx_enabled = true;
        self.await_rtr = false;
        let (hdr, hlen) = match SegmentHeader::parse(ulpdu) {
            Ok(h) => h,
            Err(e) => {
                // RFC 5041 §7.2 has an "invalid DDP version" code for each buffer model; the
                // T bit still tells which one the segment claims (as Linux siw reads it).
                let tagged = ulpdu.first().is_some_and(|c| c & 0x80 != 0);
                let codes = match e {
                    WireError::BadDdpVersion(_) if tagged => (
                        TermLayer::Ddp,
                        term::ddp::TAGGED_BUFFER,
                        term::ddp::tagged::INVALID_DDP_VERSION,
                    ),
                    WireError::BadDdpVersion(_) => (
                        TermLayer::Ddp,
                        term::ddp::UNTAGGED_BUFFER,
                        term::ddp::untagged::INVALID_DDP_VERSION,
                    ),
                    WireError::BadRdmapVersion(_) => (
                        TermLayer::Rdmap,
                        term::rdmap::REMOTE_OPERATION,
                        term::rdmap::INVALID_RDMAP_VERSION,
                    ),
                    WireError::UnknownOpcode(_) => (
                        TermLayer::Rdmap,
                        term::rdmap::REMOTE_OPERATION,
                        term::rdmap::UNEXPECTED_OPCODE,
                    ),
                    _ => (TermLayer::Ddp, term::ddp::CATASTROPHIC, 0),
                };
                return self.send_terminate(codes, Some(ulpdu), format!("malformed segment: {e}"));
            }
        };
        let payload = &ulpdu[hlen..];
        match (hdr.opcode, hdr.ddp) {
            (Opcode::RdmaWrite, DdpHeader::Tagged { stag, to }) => self.on_write(stag, to, payload, ulpdu),
            (Opcode::ReadResponse, DdpHeader::Tagged { stag: _, to }) => {
                self.on_read_response(to, hdr.last, payload, ulpdu)
            }
            (Opcode::ReadRequest, DdpHeader::Untagged { qn, msn, mo, .. }) => {
                self.on_read_request(qn, msn, mo, payload, ulpdu)
            }
            (Opcode::Terminate, DdpHeader::Untagged { qn, .. }) => {
                if qn != QN_TERMINATE {
                    return self.untagged_error(
                        term::ddp::untagged::INVALID_QN,
                        ulpdu,
                        format!("Terminate on queue {qn}"),
                    );
                }
                match Terminate::parse(payload) {
                    Ok(t) => self.on_terminate(t),
                    Err(e) => {
                        let why = format!("peer sent an unparsable Terminate: {e}");
                        self.fail_all(None, WcStatus::WrFlushErr, 0, why);
                    }
                }
            }
            (
                op,
                DdpHeader::Untagged {
                    inval_stag,
                    qn,
                    msn,
                    mo,
                },
            ) => self.on_send(op, inval_stag, qn, msn, mo, hdr.last, payload, ulpdu),
            (op, _) => self.send_terminate(
                (
                    TermLayer::Rdmap,
                    term::rdmap::REMOTE_OPERATION,
                    term::rdmap::UNEXPECTED_OPCODE,
                ),
                Some(ulpdu),
                format!("opcode {op:?} with the wrong DDP model"),
            ),
        }
    }

    fn untagged_error(&mut self, code: u8, ulpdu: &[u8], why: String) {
        self.send_terminate((TermLayer::Ddp, term::ddp::UNTAGGED_BUFFER, code), Some(ulpdu), why);
    }

    fn on_write(&mut self, stag: u32, to: u64, payload: &[u8], ulpdu: &[u8]) {
        if payload.is_empty() {
            return;
        }
        let (qp_ok, checked) = self.write_check(stag, to, payload.len());
        match checked {
            Ok((mr, off)) => {
                if mr.region.write(off, payload) {
                    self.stats.rx_placed += payload.len() as u64;
                } else {
                    // Deregistered while the segment was placed, or its memory unmapped.
                    self.write_target_lost(stag, to, payload.len(), ulpdu, None);
                }
            }
            Err(e) => {
                let why = format!(
                    "RDMA WRITE to STag {stag:#x} TO {to:#x} len {}: {e}{}",
                    payload.len(),
                    if qp_ok { "" } else { " (QP lacks REMOTE_WRITE)" }
                );
                self.send_terminate(tagged_error(e), Some(ulpdu), why);
            }
        }
    }

    /// The checks an RDMA WRITE of `len` bytes gets: whether the QP allows remote writes, and
    /// the STag's target (a QP without REMOTE_WRITE answers `Rights`).
    pub(super) fn write_check(
        &self,
        stag: u32,
        to: u64,
        len: usize,
    ) -> (bool, Result<(Arc<MrInner>, usize), KeyError>) {
        let qp_ok = self.qp.attr().qp_access_flags.contains(Access::REMOTE_WRITE);
        let checked = if qp_ok {
            self.qp.check_remote(stag, to, len as u64, Access::REMOTE_WRITE)
        } else {
            Err(KeyError::Rights)
        };
        (qp_ok, checked)
    }

    /// A WRITE's target memory became inaccessible while its payload was placed: the
    /// Terminate (invalid STag) naming the segment `header`; `cause` says how, if known.
    pub(super) fn write_target_lost(&mut self, stag: u32, to: u64, len: usize, header: &[u8], cause: Option<&str>) {
        let why = format!(
            "RDMA WRITE to STag {stag:#x} TO {to:#x} len {len}: the MR's memory is no longer accessible{}",
            cause.map(|c| format!(" ({c})")).unwrap_or_default()
        );
        self.send_terminate(tagged_error(KeyError::InvalidKey), Some(header), why);
    }

    /// The oldest READ's sink became inaccessible while its response arrived: the Terminate
    /// naming the segment `header`; `cause` says how, if known.
    pub(super) fn read_sink_lost(&mut self, header: &[u8], cause: Option<&str>) {
        let (placed, total) = self.orq.front().map_or((0, 0), |e| (e.placed, e.total));
        let why = format!(
            "READ sink became inaccessible after {placed} of {total} bytes{}",
            cause.map(|c| format!(" ({c})")).unwrap_or_default()
        );
        self.send_terminate(
            (TermLayer::Rdmap, term::rdmap::LOCAL_CATASTROPHIC, 0),
            Some(header),
            why,
        );
    }

    /// `len` more bytes of the oldest READ's response are placed; its last segment completes
    /// it (and everything before it).
    pub(super) fn read_response_placed(&mut self, len: usize, last: bool) {
        let Some(entry) = self.orq.front_mut() else { return };
        entry.placed += len;
        if last {
            let seq = entry.seq;
            self.orq.pop_front();
            self.inflight.confirm_through(seq, self.qp.qpn(), &mut self.out);
        }
    }

    fn on_read_request(&mut self, qn: u32, msn: u32, mo: u32, payload: &[u8], ulpdu: &[u8]) {
        if qn != QN_READ_REQUEST {
            return self.untagged_error(
                term::ddp::untagged::INVALID_QN,
                ulpdu,
                format!("READ request on queue {qn}"),
            );
        }
        if msn != self.rreq_msn_expected {
            return self.untagged_error(
                term::ddp::untagged::INVALID_MSN_RANGE,
                ulpdu,
                format!("READ request MSN {msn}, expected {}", self.rreq_msn_expected),
            );
        }
        if mo != 0 {
            return self.untagged_error(term::ddp::untagged::INVALID_MO, ulpdu, format!("READ request MO {mo}"));
        }
        let rr = match ReadRequest::parse(payload) {
            Ok(r) => r,
            Err(e) => {
                return self.send_terminate(
                    (
                        TermLayer::Rdmap,
                        term::rdmap::REMOTE_OPERATION,
                        term::rdmap::CATASTROPHIC_STREAM,
                    ),
                    Some(ulpdu),
                    format!("bad READ request: {e}"),
                )
            }
        };
        self.rreq_msn_expected = self.rreq_msn_expected.wrapping_add(1);
        if self.irq.len() >= self.cfg.ird.max(1) as usize {
            return self.send_terminate(
                (
                    TermLayer::Rdmap,
                    term::rdmap::REMOTE_OPERATION,
                    term::rdmap::CATASTROPHIC_STREAM,
                ),
                Some(ulpdu),
                format!("more than IRD {} READ requests outstanding", self.cfg.ird.max(1)),
            );
        }
        let src = if rr.size == 0 {
            None
        } else {
            let qp_ok = self.qp.attr().qp_access_flags.contains(Access::REMOTE_READ);
            let checked = if qp_ok {
                self.qp
                    .check_remote(rr.src_stag, rr.src_to, rr.size as u64, Access::REMOTE_READ)
            } else {
                Err(softrdma_verbs::mr::KeyError::Rights)
            };
            match checked {
                Ok((mr, off)) => Some((mr, off)),
                Err(e) => {
                    let why = format!(
                        "RDMA READ of STag {:#x} TO {:#x} len {}: {e}",
                        rr.src_stag, rr.src_to, rr.size
                    );
                    return self.send_terminate(read_error(e), Some(ulpdu), why);
                }
            }
        };
        let (mr, off) = match src {
            Some((mr, off)) => (Some(mr), off),
            None => (None, 0),
        };
        self.irq.push_back(ReadResp {
            src: mr,
            off,
            len: rr.size as usize,
            sink_stag: rr.sink_stag,
            sink_to: rr.sink_to,
        });
    }

    fn on_read_response(&mut self, to: u64, last: bool, payload: &[u8], ulpdu: &[u8]) {
        let Some(entry) = self.orq.front_mut() else {
            return self.send_terminate(
                (
                    TermLayer::Rdmap,
                    term::rdmap::REMOTE_OPERATION,
                    term::rdmap::UNEXPECTED_OPCODE,
                ),
                Some(ulpdu),
                "READ response with no READ outstanding".into(),
            );
        };
        let at = entry.offset_of(to);
        let fits = entry.fits(at, payload.len());
        if fits && !scatter(&entry.dst, at, payload) {
            // The READ's local sink was deregistered (or unmapped) while data arrived.
            return self.read_sink_lost(ulpdu, None);
        }
        if !fits {
            let why = format!(
                "READ response at offset {at} len {} outside the {}-byte sink",
                payload.len(),
                entry.total
            );
            return self.send_terminate(
                (TermLayer::Ddp, term::ddp::TAGGED_BUFFER, term::ddp::tagged::BASE_BOUNDS),
                Some(ulpdu),
                why,
            );
        }
        self.stats.rx_placed += payload.len() as u64;
        self.read_response_placed(payload.len(), last);
    }

    #[allow(clippy::too_many_arguments)]
    fn on_send(
        &mut self,
        op: Opcode,
        inval_stag: u32,
        qn: u32,
        msn: u32,
        mo: u32,
        last: bool,
        payload: &[u8],
        ulpdu: &[u8],
    ) {
        if !self.send_accept(qn, msn, mo, payload.len(), ulpdu) {
            return;
        }
        let Some(r) = self.cur_recv.as_ref() else { return };
        if !scatter(&r.dst, r.received, payload) {
            // The receive buffer's MR was deregistered (or its memory unmapped) mid-message.
            return self.recv_buffer_lost(ulpdu, None);
        }
        self.stats.rx_placed += payload.len() as u64;
        self.send_placed(op, inval_stag, payload.len(), last, ulpdu);
    }

    /// The checks a SEND segment of `len` payload bytes gets before its payload is placed
    /// (its queue, MSN and MO; for a first segment, the receive WR it takes, whose SGEs must be
    /// valid; the receive buffer's capacity). They depend on the header alone, so direct
    /// placement makes them when the header has arrived. False: the segment failed them, and
    /// its Terminate (with the receive WR's completion, if one was taken) is sent.
    pub(super) fn send_accept(&mut self, qn: u32, msn: u32, mo: u32, len: usize, ulpdu: &[u8]) -> bool {
        if qn != QN_SEND {
            self.untagged_error(term::ddp::untagged::INVALID_QN, ulpdu, format!("SEND on queue {qn}"));
            return false;
        }
        if msn != self.recv_msn {
            self.untagged_error(
                term::ddp::untagged::INVALID_MSN_RANGE,
                ulpdu,
                format!("SEND MSN {msn}, expected {}", self.recv_msn),
            );
            return false;
        }
        if self.cur_recv.is_none() {
            if mo != 0 {
                self.untagged_error(
                    term::ddp::untagged::INVALID_MO,
                    ulpdu,
                    format!("first SEND segment has MO {mo}"),
                );
                return false;
            }
            let Some(wqe) = self.qp.take_recv() else {
                let why = format!("SEND (MSN {msn}, {len} bytes) arrived with no receive buffer posted");
                self.untagged_error(term::ddp::untagged::INVALID_MSN_NO_BUFFER, ulpdu, why);
                return false;
            };
            let mut dst = Vec::new();
            let mut capacity = 0usize;
            for s in wqe.sg_list.iter().filter(|s| s.length > 0) {
                match self.qp.check_local(s.lkey, s.addr, s.length as u64, true) {
                    Ok((mr, off)) => dst.push(Piece {
                        mr,
                        off,
                        len: s.length as usize,
                    }),
                    Err(e) => {
                        let mut wc =
                            WorkCompletion::new(wqe.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, self.qp.qpn());
                        wc.byte_len = 0;
                        self.out.recv_done(wc);
                        let why = format!("receive WR {:#x}: lkey {:#x}: {e}", wqe.wr_id, s.lkey);
                        self.send_terminate((TermLayer::Rdmap, term::rdmap::LOCAL_CATASTROPHIC, 0), Some(ulpdu), why);
                        return false;
                    }
                }
                capacity += s.length as usize;
            }
            self.cur_recv = Some(RecvInProgress {
                wqe,
                dst,
                capacity,
                received: 0,
            });
        }
        let Some((received, capacity)) = self.cur_recv.as_ref().map(|r| (r.received, r.capacity)) else {
            return false;
        };
        if mo as usize != received {
            self.untagged_error(
                term::ddp::untagged::INVALID_MO,
                ulpdu,
                format!("SEND segment MO {mo}, expected {received}"),
            );
            return false;
        }
        let end = received + len;
        if end > capacity {
            let Some(r) = self.cur_recv.take() else { return false };
            let mut wc = WorkCompletion::new(r.wqe.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, self.qp.qpn());
            wc.byte_len = end as u32;
            self.out.recv_done(wc);
            let why = format!(
                "SEND of at least {end} bytes does not fit the {}-byte receive buffer (WR {:#x})",
                r.capacity, r.wqe.wr_id
            );
            self.untagged_error(term::ddp::untagged::MSG_TOO_LONG, ulpdu, why);
            return false;
        }
        true
    }

    /// The receive WR of the SEND in progress became inaccessible while a segment (`header`)
    /// was placed: it completes with LOC_PROT_ERR and the Terminate names the segment; `cause`
    /// says how, if known.
    pub(super) fn recv_buffer_lost(&mut self, header: &[u8], cause: Option<&str>) {
        let Some(r) = self.cur_recv.take() else { return };
        let mut wc = WorkCompletion::new(r.wqe.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, self.qp.qpn());
        wc.byte_len = 0;
        self.out.recv_done(wc);
        let why = format!(
            "receive WR {:#x}: its buffer became inaccessible after {} bytes{}",
            r.wqe.wr_id,
            r.received,
            cause.map(|c| format!(" ({c})")).unwrap_or_default()
        );
        self.send_terminate(
            (TermLayer::Rdmap, term::rdmap::LOCAL_CATASTROPHIC, 0),
            Some(header),
            why,
        );
    }

    /// `len` more bytes of the SEND in progress are placed (after [`Engine::send_accept`]); its
    /// last segment completes the receive WR (a SEND with Invalidate invalidates its STag
    /// first; `header`, the segment's, for the Terminate if that fails).
    pub(super) fn send_placed(&mut self, op: Opcode, inval_stag: u32, len: usize, last: bool, header: &[u8]) {
        let Some(r) = self.cur_recv.as_mut() else { return };
        r.received += len;
        if !last {
            return;
        }
        let Some(r) = self.cur_recv.take() else { return };
        self.recv_msn = self.recv_msn.wrapping_add(1);
        let mut wc = WorkCompletion::new(r.wqe.wr_id, WcStatus::Success, WcOpcode::Recv, self.qp.qpn());
        wc.byte_len = r.received as u32;
        wc.solicited = matches!(op, Opcode::SendSe | Opcode::SendSeInvalidate);
        if matches!(op, Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
            if let Err(e) = self.qp.invalidate_remote(inval_stag) {
                self.out.recv_done(wc);
                let why = format!("SEND with invalidate of STag {inval_stag:#x}: {e}");
                return self.send_terminate(
                    (
                        TermLayer::Rdmap,
                        term::rdmap::REMOTE_OPERATION,
                        term::rdmap::STAG_CANNOT_INVALIDATE,
                    ),
                    Some(header),
                    why,
                );
            }
            wc.wc_flags |= wc_flags::WITH_INV;
            wc.imm_data = inval_stag;
        }
        self.out.recv_done(wc);
    }
}
