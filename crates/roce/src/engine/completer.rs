//! The completer: ACKs, NAKs, READ responses and atomic ACKs → in-order completions,
//! go-back-N on sequence NAKs and implied NAKs, RNR waits, the ACK timeout and retry counts.

use super::error::{nak_status, RcError};
use super::local::scatter;
use super::psn::Psn;
use super::requester::Requester;
use super::sendop::LocalOp;
use super::sendop::{OpKind, SendOp};
use super::stats::RcStats;
use super::timers::rnr_timer;
use softrdma_verbs::QpHost;
use softrdma_verbs::{WcStatus, WorkCompletion};
use softrdma_wire::roce::{AethKind, NakCode, RoceOpcode, RocePacket};
use std::time::Instant;

impl Requester {
    /// Handles a response packet (ACK, atomic ACK, READ response) addressed to this QP.
    pub(crate) fn handle_response(
        &mut self,
        now: Instant,
        pkt: &RocePacket<'_>,
        qp: &dyn QpHost,
        stats: &mut RcStats,
    ) -> Result<(), RcError> {
        let h = &pkt.headers;
        let psn = Psn::new(h.bth.psn);
        if psn.before(self.una) || !psn.before(self.sent_hi) {
            stats.stale_responses += 1;
            return Ok(());
        }
        if h.aeth.is_some_and(|a| matches!(a.kind(), AethKind::Reserved(_))) {
            stats.dropped_invalid += 1;
            return Ok(());
        }
        match h.bth.opcode {
            RoceOpcode::RcAck => {
                let Some(aeth) = h.aeth else {
                    stats.dropped_invalid += 1;
                    return Ok(());
                };
                self.on_ack(now, psn, aeth.kind(), aeth.syndrome, qp, stats)
            }
            RoceOpcode::RcAtomicAck => match (h.aeth, h.atomic_ack) {
                (Some(a), Some(ack)) if a.is_ack() => self.on_atomic_ack(now, psn, ack.orig, qp, stats),
                _ => {
                    stats.dropped_invalid += 1;
                    Ok(())
                }
            },
            op if op.is_read_response() => {
                if h.aeth.is_some_and(|a| !a.is_ack()) {
                    stats.dropped_invalid += 1;
                    return Ok(());
                }
                self.on_read_response(now, psn, op, pkt.payload, qp, stats)
            }
            _ => {
                stats.dropped_invalid += 1;
                Ok(())
            }
        }
    }

    fn on_ack(
        &mut self,
        now: Instant,
        psn: Psn,
        kind: AethKind,
        syndrome: u8,
        qp: &dyn QpHost,
        stats: &mut RcStats,
    ) -> Result<(), RcError> {
        stats.naks_received.count_aeth(kind);
        match kind {
            AethKind::Ack { .. } => {
                stats.acks_received += 1;
                self.ack_through(now, psn, qp, stats)
            }
            AethKind::RnrNak { timer } => {
                // Everything before the refused PSN was executed.
                self.ack_through(now, psn.sub(1), qp, stats)?;
                if psn != self.una || self.rnr_waiting() {
                    return Ok(());
                }
                self.rnr_wait(now, psn, timer, qp, stats)
            }
            AethKind::Nak(NakCode::PsnSequenceError) => {
                self.ack_through(now, psn.sub(1), qp, stats)?;
                if psn == self.una && !self.rnr_waiting() && self.rewound_for != Some(psn) {
                    self.window_shrink();
                    self.rewind(psn);
                    self.rewound_for = Some(psn);
                    self.ack_timer.restart(now);
                }
                Ok(())
            }
            AethKind::Nak(code) => Err(self.fail_at(psn, code, syndrome, qp)),
            AethKind::Reserved(_) => Ok(()),
        }
    }

    /// Completes SEND/WRITE ops whose PSNs are all at or before `target` (a cumulative ACK).
    /// Meeting an unanswered READ/atomic the responder is already past is an implied NAK.
    fn ack_through(&mut self, now: Instant, target: Psn, qp: &dyn QpHost, stats: &mut RcStats) -> Result<(), RcError> {
        if target.before(self.una) {
            return Ok(());
        }
        let from = self.una;
        let mut progressed = false;
        while let Some(op) = self.ops.front() {
            if op.local.is_some() {
                self.run_local_front(qp)?;
                continue;
            }
            if op.failed.is_some() {
                break;
            }
            if op.is_rd_atomic() {
                if !op.first_psn.after(target) {
                    self.implied_nak(now, stats);
                }
                break;
            }
            if !op.last_psn().after(target) {
                self.una = op.end_psn();
                progressed = true;
                self.complete_front(qp);
                continue;
            }
            if !op.first_psn.after(target) {
                self.una = target.add(1);
                progressed = true;
            }
            break;
        }
        if progressed {
            self.on_progress(now, from);
        }
        self.complete_ready(qp)
    }

    /// A response showed that the oldest READ/atomic's responses were lost: resend from `una`.
    fn implied_nak(&mut self, now: Instant, stats: &mut RcStats) {
        if self.rnr_waiting() || self.rewound_for == Some(self.una) {
            return;
        }
        stats.implied_naks += 1;
        self.window_shrink();
        self.rewind(self.una);
        self.rewound_for = Some(self.una);
        self.ack_timer.restart(now);
    }

    fn on_atomic_ack(
        &mut self,
        now: Instant,
        psn: Psn,
        orig: u64,
        qp: &dyn QpHost,
        stats: &mut RcStats,
    ) -> Result<(), RcError> {
        self.ack_through(now, psn.sub(1), qp, stats)?;
        let Some(op) = self.ops.front() else {
            return Ok(());
        };
        if psn != self.una || !matches!(op.kind, OpKind::Atomic { .. }) || op.first_psn != psn {
            stats.stale_responses += 1;
            return Ok(());
        }
        if !scatter(&op.sink, 0, &orig.to_ne_bytes()) {
            return Err(self.fail_front_local("atomic result buffer no longer writable", qp));
        }
        let from = self.una;
        self.una = psn.add(1);
        self.complete_front(qp);
        self.on_progress(now, from);
        self.complete_ready(qp)
    }

    fn on_read_response(
        &mut self,
        now: Instant,
        psn: Psn,
        opcode: RoceOpcode,
        payload: &[u8],
        qp: &dyn QpHost,
        stats: &mut RcStats,
    ) -> Result<(), RcError> {
        // A response for a later PSN acknowledges the requests before it.
        self.ack_through(now, psn.sub(1), qp, stats)?;
        let mtu = self.cfg.mtu as u64;
        let Some(op) = self.ops.front_mut() else {
            return Ok(());
        };
        if psn != self.una || op.kind != OpKind::Read || !op.contains(psn) {
            stats.stale_responses += 1;
            return Ok(());
        }
        let k = psn.offset_from(op.first_psn);
        let off = u64::from(k) * mtu;
        let len = payload.len() as u64;
        let total = u64::from(op.len);
        let valid = match opcode {
            // A retried READ's responses start over with FIRST/ONLY at any offset.
            RoceOpcode::RcReadResponseFirst => len == mtu && off + len < total,
            RoceOpcode::RcReadResponseMiddle => k > 0 && len == mtu && off + len < total,
            RoceOpcode::RcReadResponseLast => k > 0 && len > 0 && len <= mtu && off + len == total,
            RoceOpcode::RcReadResponseOnly => len <= mtu && off + len == total,
            _ => false,
        };
        if !valid {
            stats.dropped_invalid += 1;
            return Ok(());
        }
        if !scatter(&op.sink, off as usize, payload) {
            return Err(self.fail_front_local("READ sink buffer no longer writable", qp));
        }
        op.placed_pkts = k + 1;
        let done = opcode.ends_message();
        let from = self.una;
        self.una = psn.add(1);
        if done {
            self.complete_front(qp);
        }
        self.on_progress(now, from);
        self.complete_ready(qp)
    }

    /// `una` moved forward from `from`: reset the retry counters and the timer, grow the
    /// window, and never resend what was just acknowledged.
    fn on_progress(&mut self, now: Instant, from: Psn) {
        self.window_grow(self.una.offset_from(from));
        self.retry_left = self.cfg.retry_cnt;
        self.rnr_left = self.cfg.rnr_retry;
        self.rewound_for = None;
        if self.next_psn.before(self.una) {
            self.rewind(self.una);
        }
        if self.una == self.sent_hi || self.rnr_waiting() {
            // Nothing outstanding, or paused: the timer restarts with the next transmission.
            self.ack_timer.stop();
        } else {
            self.ack_timer.restart(now);
        }
    }

    fn rnr_wait(
        &mut self,
        now: Instant,
        psn: Psn,
        timer: u8,
        qp: &dyn QpHost,
        stats: &mut RcStats,
    ) -> Result<(), RcError> {
        if self.rnr_left == 0 {
            let wr_id = self.fail_front(WcStatus::RnrRetryExcErr, 0, qp);
            return Err(RcError::RnrRetryExceeded {
                wr_id,
                retries: self.cfg.rnr_retry,
            });
        }
        if !self.rnr_infinite() {
            self.rnr_left -= 1;
        }
        stats.rnr_waits += 1;
        self.rewind(psn);
        self.ack_timer.stop();
        self.rnr_until = Some(now.checked_add(rnr_timer(timer)).unwrap_or(now));
        Ok(())
    }

    /// Handles the RNR wait's end and the ACK timeout.
    pub(crate) fn handle_timeout(&mut self, now: Instant, qp: &dyn QpHost, stats: &mut RcStats) -> Result<(), RcError> {
        if let Some(until) = self.rnr_until {
            if now < until {
                return Ok(());
            }
            self.end_rnr_wait();
        }
        if !self.ack_timer.expired(now) {
            return Ok(());
        }
        if self.una == self.sent_hi {
            self.ack_timer.stop();
            return Ok(());
        }
        stats.timeouts += 1;
        if self.retry_left == 0 {
            let wr_id = self.fail_front(WcStatus::RetryExcErr, 0, qp);
            return Err(RcError::RetryExceeded {
                wr_id,
                retries: self.cfg.retry_cnt,
            });
        }
        self.retry_left -= 1;
        self.rewound_for = None;
        self.window_shrink();
        self.rewind(self.una);
        self.ack_timer.restart(now);
        Ok(())
    }

    /// Completes the oldest op successfully.
    fn complete_front(&mut self, qp: &dyn QpHost) {
        if let Some(op) = self.pop_front() {
            self.out
                .send_done(op.completion(WcStatus::Success, qp.qpn()), op.signaled);
        }
    }

    /// Completes the oldest op with an error status; returns its wr_id.
    fn fail_front(&mut self, status: WcStatus, vendor_err: u32, qp: &dyn QpHost) -> u64 {
        match self.pop_front() {
            Some(op) => {
                self.out
                    .send_done(error_completion(&op, status, vendor_err, qp.qpn()), true);
                op.wr_id
            }
            None => 0,
        }
    }

    fn fail_front_local(&mut self, why: &str, qp: &dyn QpHost) -> RcError {
        let wr_id = self.fail_front(WcStatus::LocProtErr, 0, qp);
        RcError::LocalWr {
            wr_id,
            status: WcStatus::LocProtErr,
            detail: why.to_string(),
        }
    }

    /// An error NAK for `psn`: the requests before it were executed (SEND/WRITE complete,
    /// an unanswered READ/atomic flushes), the one holding `psn` fails with the NAK's status.
    fn fail_at(&mut self, psn: Psn, code: NakCode, syndrome: u8, qp: &dyn QpHost) -> RcError {
        let status = nak_status(code).unwrap_or(WcStatus::RemOpErr);
        while let Some(op) = self.ops.front() {
            if op.contains(psn) || op.failed.is_some() || self.ops.len() == 1 {
                break;
            }
            if op.is_rd_atomic() {
                self.fail_front(WcStatus::WrFlushErr, 0, qp);
            } else {
                self.complete_front(qp);
            }
        }
        let wr_id = self.fail_front(status, u32::from(syndrome), qp);
        RcError::RemoteNak {
            wr_id,
            psn: psn.get(),
            code,
        }
    }

    /// If the oldest op failed locally, complete it in error now (everything before it has
    /// completed) and report the QP failure.
    pub(super) fn complete_ready(&mut self, qp: &dyn QpHost) -> Result<(), RcError> {
        while self.ops.front().is_some_and(|op| op.local.is_some()) {
            self.run_local_front(qp)?;
        }
        let Some((status, detail)) = self.ops.front().and_then(|op| op.failed.clone()) else {
            return Ok(());
        };
        let wr_id = self.fail_front(status, 0, qp);
        Err(RcError::LocalWr { wr_id, status, detail })
    }

    /// Executes the oldest op, a local one (everything before it has completed), and
    /// completes it; a failed bind or invalidation completes with MW_BIND_ERR and fails the QP.
    fn run_local_front(&mut self, qp: &dyn QpHost) -> Result<(), RcError> {
        let Some(local) = self.ops.front().and_then(|op| op.local) else {
            return Ok(());
        };
        let done = match local {
            LocalOp::Bind(b) => qp.bind_mw(&b),
            LocalOp::Invalidate(rkey) => qp
                .invalidate_mw(rkey)
                .map_err(|e| format!("LOCAL_INV of rkey {rkey:#x}: {e} (only memory windows can be invalidated)")),
        };
        match done {
            Ok(()) => {
                self.complete_front(qp);
                Ok(())
            }
            Err(detail) => {
                let wr_id = self.fail_front(WcStatus::MwBindErr, 0, qp);
                Err(RcError::LocalWr {
                    wr_id,
                    status: WcStatus::MwBindErr,
                    detail,
                })
            }
        }
    }
}

/// The completion of `op` failed with `status`.
fn error_completion(op: &SendOp, status: WcStatus, vendor_err: u32, qpn: u32) -> WorkCompletion {
    let mut wc: WorkCompletion = op.completion(status, qpn);
    wc.vendor_err = vendor_err;
    wc
}
