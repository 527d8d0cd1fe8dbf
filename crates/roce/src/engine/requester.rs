//! The requester: send WRs → request packets, with the PSN window, ORD, fences, AckReq
//! placement and go-back-N retransmission. Responses are handled in `completer.rs`.

use super::config::{RcConfig, INITIAL_WINDOW, MIN_WINDOW, RNR_RETRY_INFINITE};
use super::error::RcError;
use super::psn::Psn;
use super::sendop::{OpKind, Position, SendOp};
use super::stats::RcStats;
use super::timers::{earliest, ib_timeout, AckTimer};
use softrdma_verbs::qp::{QpAttr, SendWqe};
use softrdma_verbs::qp_host::QpOutputs;
use softrdma_verbs::QpHost;
use softrdma_verbs::{QpState, SendFlags, WcStatus, WrOpcode};
use softrdma_wire::roce::{push_pad, AtomicEth, Bth, Reth, RoceHeaders, RoceOpcode};
use std::collections::VecDeque;
use std::time::Instant;

/// The send side of an RC QP.
#[derive(Debug)]
pub(crate) struct Requester {
    /// WRs taken from the send queue and not yet completed, oldest first, contiguous in PSN.
    pub(super) ops: VecDeque<SendOp>,
    /// Index of the first op with packets left to (re)send.
    pub(super) cursor: usize,
    /// PSN of the next packet to (re)send.
    pub(super) next_psn: Psn,
    /// PSN the next new WR starts at.
    pub(super) tail_psn: Psn,
    /// Oldest unacknowledged PSN.
    pub(super) una: Psn,
    /// One past the highest PSN ever sent: responses must lie in `[una, sent_hi)`.
    pub(super) sent_hi: Psn,
    /// READ/atomic ops in `ops` (limited by ORD).
    pub(super) rd_atomic: u32,
    /// Packets sent since the last one with AckReq.
    pub(super) since_ackreq: u32,
    /// Transport retries left before RETRY_EXC_ERR.
    pub(super) retry_left: u8,
    /// RNR retries left before RNR_RETRY_EXC_ERR.
    pub(super) rnr_left: u8,
    /// The retransmission timer.
    pub(super) ack_timer: AckTimer,
    /// Sending is paused until then after an RNR NAK.
    pub(super) rnr_until: Option<Instant>,
    /// `una` when a NAK or an implied NAK last rewound: one rewind per gap.
    pub(super) rewound_for: Option<Psn>,
    /// A WR was taken from the send queue: the starting PSN is fixed.
    started: bool,
    /// The congestion window: how many PSNs past `una` may be in flight now, at most
    /// `cfg.window`. It starts at [`INITIAL_WINDOW`], grows by every PSN acknowledged, and
    /// halves (to no less than [`MIN_WINDOW`]) when a loss makes the requester resend. A
    /// go-back-N resend costs up to a window of packets, so a lossy path runs with a small
    /// window and a clean one with a large one, which rides out a receiver's scheduling
    /// delays (`ib_write_bw` over rxe_lo: 128 → 512 PSNs, +20 %).
    pub(super) cwnd: u32,
    pub(super) cfg: RcConfig,
    /// Completions made since the engine last collected them (`RcEngine::collect`).
    pub(super) out: QpOutputs,
}

impl Requester {
    /// A requester starting at `cfg.sq_psn`.
    pub(crate) fn new(cfg: &RcConfig) -> Requester {
        let psn = Psn::new(cfg.sq_psn);
        Requester {
            ops: VecDeque::new(),
            cursor: 0,
            next_psn: psn,
            tail_psn: psn,
            una: psn,
            sent_hi: psn,
            rd_atomic: 0,
            since_ackreq: 0,
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            ack_timer: AckTimer::new(cfg.ack_timeout),
            rnr_until: None,
            rewound_for: None,
            started: false,
            cwnd: cfg.window.clamp(1, INITIAL_WINDOW),
            cfg: cfg.clone(),
            out: QpOutputs::default(),
        }
    }

    /// Takes the send-side attributes set at RTR→RTS (and SQD→RTS): ACK timeout, retry
    /// counts, ORD, and the starting PSN if nothing was sent yet.
    pub(crate) fn apply_rts_attrs(&mut self, attr: &QpAttr) {
        self.cfg.ack_timeout = ib_timeout(attr.timeout);
        self.cfg.retry_cnt = attr.retry_cnt.min(7);
        self.cfg.rnr_retry = attr.rnr_retry.min(RNR_RETRY_INFINITE);
        self.cfg.ord = u32::from(attr.max_rd_atomic);
        self.ack_timer.set_timeout(self.cfg.ack_timeout);
        if !self.started {
            let psn = Psn::new(attr.sq_psn);
            self.cfg.sq_psn = psn.get();
            (self.next_psn, self.tail_psn, self.una, self.sent_hi) = (psn, psn, psn, psn);
            self.retry_left = self.cfg.retry_cnt;
            self.rnr_left = self.cfg.rnr_retry;
        }
    }

    /// When the requester next needs `handle_timeout`.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.rnr_until {
            Some(t) => Some(t),
            None => earliest(self.ack_timer.deadline(), None),
        }
    }

    /// Writes the next request packet into `out` (cleared by the caller). Ok(false): nothing
    /// may be sent now. An error means the QP must go to ERR (the failed WR has completed).
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        qp: &dyn QpHost,
        stats: &mut RcStats,
        out: &mut Vec<u8>,
    ) -> Result<bool, RcError> {
        if let Some(until) = self.rnr_until {
            if now < until {
                return Ok(false);
            }
            self.end_rnr_wait();
        }
        if !matches!(qp.state(), QpState::Rts | QpState::Sqd) {
            return Ok(false);
        }
        loop {
            if let Some(op) = self.ops.get(self.cursor) {
                if op.failed.is_some() {
                    // Completes in error once everything before it has.
                    return Ok(false);
                }
                if op.next_pkt >= op.npkts {
                    self.cursor += 1;
                    continue;
                }
                if self.next_psn.offset_from(self.una) >= self.cwnd {
                    return Ok(false);
                }
                if self.emit(now, stats, out) {
                    return Ok(true);
                }
                // The source memory went away under a sent WR: it fails in order.
                self.complete_ready(qp)?;
                continue;
            }
            if self.tail_psn.offset_from(self.una) >= self.cwnd {
                return Ok(false);
            }
            let (rd_atomic, ord) = (self.rd_atomic, self.cfg.ord.max(1));
            let Some(wqe) = qp.pop_send_if(&mut |w| admit(w, rd_atomic, ord)) else {
                return Ok(false);
            };
            if !self.started {
                // The QP is in RTS (checked above), but the engine may not have synced since it
                // got there (the state can change between a sync and this call): the first WR
                // starts with the RTS attributes (sq_psn, ACK timeout, retry counts, ORD),
                // never with the RTR-time defaults.
                self.apply_rts_attrs(&qp.attr());
            }
            self.started = true;
            let op = SendOp::prepare(wqe, qp, self.cfg.mtu, self.tail_psn);
            self.tail_psn = op.end_psn();
            if op.is_rd_atomic() {
                self.rd_atomic += 1;
            }
            self.ops.push_back(op);
            self.complete_ready(qp)?;
        }
    }

    /// Emits the next packet of `ops[cursor]`. False if its source bytes could not be read
    /// (the op is then marked failed).
    fn emit(&mut self, now: Instant, stats: &mut RcStats, out: &mut Vec<u8>) -> bool {
        let mtu = self.cfg.mtu;
        let window = self.cwnd;
        let Some(op) = self.ops.get_mut(self.cursor) else {
            return false;
        };
        let k = op.next_pkt;
        let psn = op.first_psn.add(k);
        let pos = Position::of(k, op.npkts);
        let (opcode, after) = match op.kind {
            OpKind::Send { imm, inv } => (send_opcode(pos, imm.is_some(), inv.is_some()), k + 1),
            OpKind::Write { imm } => (write_opcode(pos, imm.is_some()), k + 1),
            OpKind::Read => (RoceOpcode::RcReadRequest, op.npkts),
            OpKind::Atomic { cmp_swap: true } => (RoceOpcode::RcCompareSwap, op.npkts),
            OpKind::Atomic { cmp_swap: false } => (RoceOpcode::RcFetchAdd, op.npkts),
        };
        let off = k as usize * mtu;
        let len = match op.kind {
            OpKind::Send { .. } | OpKind::Write { .. } => (op.len as usize).saturating_sub(off).min(mtu),
            _ => 0,
        };
        let next_psn = op.first_psn.add(after);
        let since_ackreq = self.since_ackreq + 1;
        let ends = pos.ends() || op.is_rd_atomic();
        let ack_req = ends || since_ackreq >= (window / 2).max(1) || next_psn.offset_from(self.una) >= window;
        let mut bth = Bth::new(opcode, self.cfg.dest_qpn, psn.get());
        bth.pkey = self.cfg.pkey;
        bth.ack_req = ack_req;
        bth.solicited = op.solicited && pos.ends() && !op.is_rd_atomic();
        let mut h = RoceHeaders::new(bth);
        match op.kind {
            OpKind::Send { imm, inv } if pos.ends() => {
                h.imm = imm;
                h.ieth = inv;
            }
            OpKind::Write { imm } => {
                if matches!(pos, Position::First | Position::Only) {
                    h.reth = Some(Reth {
                        va: op.remote_addr,
                        rkey: op.rkey,
                        dma_len: op.len,
                    });
                }
                if pos.ends() {
                    h.imm = imm;
                }
            }
            OpKind::Read => {
                // A retried READ asks only for the part not yet received.
                h.reth = Some(Reth {
                    va: op.remote_addr.wrapping_add(off as u64),
                    rkey: op.rkey,
                    dma_len: op.len.saturating_sub(off as u32),
                });
            }
            OpKind::Atomic { cmp_swap } => {
                h.atomic = Some(AtomicEth {
                    va: op.remote_addr,
                    rkey: op.rkey,
                    swap_add: if cmp_swap { op.swap } else { op.compare_add },
                    compare: if cmp_swap { op.compare_add } else { 0 },
                });
            }
            OpKind::Send { .. } => {}
        }
        // The payload goes from the source buffers straight behind the headers.
        out.clear();
        h.emit_headers(len, out);
        if len > 0 && !op.payload.gather(off, len, out) {
            out.clear();
            op.failed = Some((WcStatus::LocProtErr, "source buffer no longer readable".into()));
            return false;
        }
        push_pad(out, len);
        self.since_ackreq = if ack_req { 0 } else { since_ackreq };
        op.next_pkt = after;
        if psn.before(self.sent_hi) {
            stats.retransmitted_packets += 1;
        }
        self.next_psn = next_psn;
        if next_psn.after(self.sent_hi) {
            self.sent_hi = next_psn;
        }
        self.ack_timer.start_if_stopped(now);
        true
    }

    /// Resends from `to` (go-back-N): the op holding `to` resumes there, later ones restart.
    /// `n` more PSNs were acknowledged: the window grows by as many.
    pub(super) fn window_grow(&mut self, n: u32) {
        self.cwnd = self.cwnd.saturating_add(n).min(self.cfg.window.max(1));
    }

    /// A loss (a sequence NAK, a missing READ response, an ACK timeout): the window halves.
    pub(super) fn window_shrink(&mut self) {
        self.cwnd = (self.cwnd / 2).max(self.cfg.window.clamp(1, MIN_WINDOW));
    }

    pub(super) fn rewind(&mut self, to: Psn) {
        let mut found = None;
        for (i, op) in self.ops.iter_mut().enumerate() {
            if found.is_some() {
                op.next_pkt = 0;
            } else if op.failed.is_some() {
                found = Some(i);
            } else if op.contains(to) {
                op.next_pkt = to.offset_from(op.first_psn);
                found = Some(i);
            }
        }
        self.cursor = found.unwrap_or(self.ops.len());
        self.next_psn = to;
        self.since_ackreq = 0;
    }

    /// Removes the oldest op, keeping the cursor and the ORD count in step.
    pub(super) fn pop_front(&mut self) -> Option<SendOp> {
        let op = self.ops.pop_front()?;
        self.cursor = self.cursor.saturating_sub(1);
        if op.is_rd_atomic() {
            self.rd_atomic = self.rd_atomic.saturating_sub(1);
        }
        Some(op)
    }

    /// The QP went to ERR: every op left completes with WR_FLUSH_ERR, oldest first.
    pub(crate) fn flush(&mut self, qp: &dyn QpHost) {
        while let Some(op) = self.pop_front() {
            self.out.send_done(op.completion(WcStatus::WrFlushErr, qp.qpn()), true);
        }
        self.cursor = 0;
        self.rnr_until = None;
        self.ack_timer.stop();
        self.next_psn = self.tail_psn;
        self.una = self.tail_psn;
        self.sent_hi = self.tail_psn;
    }

    /// The QP was reset: drop everything without completions.
    pub(crate) fn discard(&mut self) {
        self.ops.clear();
        self.rd_atomic = 0;
        self.flush_timers();
    }

    fn flush_timers(&mut self) {
        self.cursor = 0;
        self.rnr_until = None;
        self.ack_timer.stop();
    }

    /// The RNR wait is over: resend from the refused PSN; the ACK timer restarts with it.
    pub(super) fn end_rnr_wait(&mut self) {
        self.rnr_until = None;
        self.ack_timer.stop();
    }

    /// True when no WR is in flight or queued here (the send queue may still hold some).
    pub(crate) fn idle(&self) -> bool {
        self.ops.is_empty()
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) may have something to send (a packet
    /// not yet or no longer sent, or a WR waiting in the send queue); false only when
    /// it certainly has not.
    pub(crate) fn may_transmit(&self, qp: &dyn QpHost) -> bool {
        let unsent = self
            .ops
            .iter()
            .skip(self.cursor)
            .any(|op| op.failed.is_none() && op.next_pkt < op.npkts);
        let mut queued = false;
        // A peek: the filter sees the head WQE and refuses it.
        let _ = qp.pop_send_if(&mut |_| {
            queued = true;
            false
        });
        unsent || queued
    }

    /// Its sequence state in one line, for `softrdma stat` (diagnosing a stalled QP).
    pub(crate) fn summary(&self, now: Instant) -> String {
        let ms = |t: Option<Instant>| match t {
            Some(t) if t > now => format!("in {} ms", (t - now).as_millis()),
            Some(_) => "due".into(),
            None => "off".into(),
        };
        format!(
            "una {} next {} sent_hi {} tail {} window {}/{} ops {} (cursor {}) ack timer {} retries left {}{}",
            self.una,
            self.next_psn,
            self.sent_hi,
            self.tail_psn,
            self.cwnd,
            self.cfg.window,
            self.ops.len(),
            self.cursor,
            ms(self.ack_timer.deadline()),
            self.retry_left,
            match self.rnr_until {
                Some(t) => format!(" rnr wait {}", ms(Some(t))),
                None => String::new(),
            }
        )
    }

    /// True while RNR-waiting.
    pub(super) fn rnr_waiting(&self) -> bool {
        self.rnr_until.is_some()
    }

    /// The RNR retry count from the configuration (7 = infinite).
    pub(super) fn rnr_infinite(&self) -> bool {
        self.cfg.rnr_retry == RNR_RETRY_INFINITE
    }
}

/// Whether the send queue's head may start now: FENCE waits for earlier READ/atomics,
/// and at most `ord` of those are outstanding.
fn admit(w: &SendWqe, rd_atomic: u32, ord: u32) -> bool {
    let rd = matches!(
        w.wr.opcode,
        Some(WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd)
    );
    if w.wr.flags.contains(SendFlags::FENCE) && rd_atomic > 0 {
        return false;
    }
    !(rd && rd_atomic >= ord)
}

fn send_opcode(pos: Position, imm: bool, inv: bool) -> RoceOpcode {
    use RoceOpcode::*;
    match pos {
        Position::First => RcSendFirst,
        Position::Middle => RcSendMiddle,
        Position::Last if imm => RcSendLastImm,
        Position::Last if inv => RcSendLastInv,
        Position::Last => RcSendLast,
        Position::Only if imm => RcSendOnlyImm,
        Position::Only if inv => RcSendOnlyInv,
        Position::Only => RcSendOnly,
    }
}

fn write_opcode(pos: Position, imm: bool) -> RoceOpcode {
    use RoceOpcode::*;
    match pos {
        Position::First => RcWriteFirst,
        Position::Middle => RcWriteMiddle,
        Position::Last if imm => RcWriteLastImm,
        Position::Last => RcWriteLast,
        Position::Only if imm => RcWriteOnlyImm,
        Position::Only => RcWriteOnly,
    }
}
