//! The sans-I/O RoCE transport engines, one per QP, in the style of quinn-proto: packets and
//! timer events go in, packets, deadlines and completions come out. The engines never touch a
//! socket, a thread, a CQ or a clock; the caller passes `now`, and takes the completions and
//! async events as values (`take_outputs`) to deliver them.
//!
//! - [`RcEngine`]: a reliable connected QP: requester (`requester.rs`: segmentation, PSN
//!   window, ORD, fences, AckReq), completer (`completer.rs`: cumulative ACKs, READ responses,
//!   atomic ACKs, NAKs, go-back-N, RNR waits, ACK timeout) and responder (`responder.rs`,
//!   `execute.rs`, `replies.rs`, `resources.rs`: in-order execution, duplicate replay, ACK
//!   coalescing, NAKs) and keepalive (`keepalive.rs`: probes from an idle QP find a peer
//!   that died without a DREQ).
//! - [`UdEngine`]: an unreliable datagram QP (`ud.rs`, `grh.rs`).
//!
//! Packets are the IB transport part of a RoCEv2 datagram: BTH through pad, without the ICRC
//! (the driver appends and checks it).

mod completer;
mod config;
mod error;
mod execute;
mod grh;
mod keepalive;
mod local;
mod psn;
mod replies;
mod requester;
mod resources;
mod responder;
mod sendop;
mod stats;
mod timers;
mod ud;

#[cfg(test)]
mod tests;

pub use config::{
    RcConfig, UdConfig, DEFAULT_WINDOW, INITIAL_WINDOW, MAX_MTU, MAX_WINDOW, MIN_MTU, MIN_WINDOW, RNR_RETRY_INFINITE,
};
pub use error::{nak_status, RcError, RequestError};
pub use keepalive::DEFAULT_KEEPALIVE;
pub use psn::Psn;
pub use stats::{NakCounts, RcStats, UdStats};
pub use timers::{ib_timeout, rnr_timer};
pub use ud::{UdEngine, UdSource, UdTransmit, GRH_LEN};

use config::pkey_matches;
use keepalive::Keepalive;
use requester::Requester;
use responder::{KeepReplies, Responder};
use softrdma_verbs::qp_host::QpOutputs;
use softrdma_verbs::QpHost;
use softrdma_verbs::QpState;
use softrdma_wire::roce::{pad_len, RocePacket};
use std::sync::Arc;
use std::time::Instant;
pub(crate) use timers::earliest;

/// Largest message (IBTA: 2^31 bytes).
pub const MAX_MESSAGE: u64 = 1 << 31;
/// Most packets (PSNs) one message may use, a quarter of the PSN space so that every PSN
/// comparison stays unambiguous (1 GiB at MTU 256, the full 2 GiB from MTU 512).
pub const MAX_MESSAGE_PACKETS: u64 = 1 << 22;

/// Immediate data as the wire carries it, from a WR's `imm_data` (which holds the bytes in
/// network order, as `__be32` does in C).
pub(crate) fn imm_to_wire(wr_imm: u32) -> u32 {
    u32::from_be_bytes(wr_imm.to_ne_bytes())
}

/// A completion's `imm_data` (network-order bytes, as `__be32`) from the wire value.
pub(crate) fn imm_from_wire(wire: u32) -> u32 {
    u32::from_ne_bytes(wire.to_be_bytes())
}

/// True if a packet's headers, padding and payload are consistent with its opcode.
pub(crate) fn well_formed(pkt: &RocePacket<'_>) -> bool {
    let h = &pkt.headers;
    h.matches_opcode()
        && usize::from(h.bth.pad_count) == pad_len(pkt.payload.len())
        && (pkt.payload.is_empty() || h.bth.opcode.has_payload())
}

/// The transport engine of one RC QP.
#[derive(Debug)]
pub struct RcEngine {
    qp: Arc<dyn QpHost>,
    cfg: RcConfig,
    req: Requester,
    resp: Responder,
    keepalive: Keepalive,
    stats: RcStats,
    /// Why the QP went to ERR, once it did.
    error: Option<RcError>,
    /// In-flight and queued work has been flushed (the QP is in ERR).
    flushed: bool,
    /// The QP was reset: everything dropped, the engine is finished.
    reset: bool,
    /// The application destroyed the QP: only an owed ACK may still leave.
    destroyed: bool,
    /// Alternates requests and responses so neither side starves.
    responses_first: bool,
    /// COMM_EST was reported (a request arrived in RTR).
    comm_established: bool,
    /// Completions, flushes and async events for the driver to deliver ([`RcEngine::take_outputs`]).
    out: QpOutputs,
}

impl RcEngine {
    /// An engine for `qp` (moving to RTR or RTS) with `cfg`, usually from
    /// [`RcConfig::from_qp_attr`]. Out-of-range settings are clamped.
    pub fn new(qp: Arc<dyn QpHost>, cfg: RcConfig) -> RcEngine {
        let cfg = cfg.sanitized();
        RcEngine {
            req: Requester::new(&cfg),
            resp: Responder::new(&cfg),
            keepalive: Keepalive::new(cfg.keepalive),
            qp,
            cfg,
            stats: RcStats::default(),
            error: None,
            flushed: false,
            reset: false,
            destroyed: false,
            responses_first: true,
            comm_established: false,
            out: QpOutputs::default(),
        }
    }

    /// What the engine reported since the last call, oldest first: completions, flushes and
    /// async events. The driver delivers them to the QP ([`QpOutputs::deliver`]) before it
    /// lets another thread into the engine, so that they stay in order.
    pub fn take_outputs(&mut self) -> QpOutputs {
        self.collect();
        self.out.take()
    }

    /// Whether [`RcEngine::take_outputs`] has anything (a check cheap enough for every packet).
    pub fn has_outputs(&self) -> bool {
        !self.out.is_empty() || !self.req.out.is_empty() || !self.resp.out.is_empty()
    }

    /// Appends the requester's and the responder's completions to the engine's (after each
    /// call into one of them, so that the order is the order they were made in).
    fn collect(&mut self) {
        self.out.append(&mut self.req.out);
        self.out.append(&mut self.resp.out);
    }

    /// The QP this engine serves.
    pub fn qp(&self) -> &Arc<dyn QpHost> {
        &self.qp
    }

    /// The settings in use (after clamping).
    pub fn config(&self) -> &RcConfig {
        &self.cfg
    }

    /// Handles one packet addressed to this QP (ICRC already checked by the caller).
    /// Packets for another QP or P_Key, or whose headers do not match their opcode, are
    /// dropped and counted.
    pub fn handle_packet(&mut self, now: Instant, pkt: &RocePacket<'_>) {
        if self.stopped() {
            return;
        }
        self.stats.rx_packets += 1;
        let bth = &pkt.headers.bth;
        if bth.dest_qp != self.cfg.local_qpn || !pkey_matches(bth.pkey, self.cfg.pkey) || !well_formed(pkt) {
            self.stats.dropped_invalid += 1;
            return;
        }
        self.keepalive.heard(now);
        let op = bth.opcode;
        let result = if op.is_ud() {
            self.stats.dropped_invalid += 1;
            Ok(())
        } else if op.is_response() {
            let r = self.req.handle_response(now, pkt, &*self.qp, &mut self.stats);
            self.collect();
            r
        } else if matches!(
            self.qp.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            if !self.comm_established && self.qp.state() == QpState::Rtr {
                // The first request reached a QP still in RTR: IBV_EVENT_COMM_EST (the CM has
                // not seen the RTU yet; rdma_notify may move it on).
                self.comm_established = true;
                self.out.comm_established();
            }
            let r = self.resp.handle_request(pkt, &*self.qp, &mut self.stats);
            self.collect();
            r
        } else {
            self.stats.dropped_invalid += 1;
            Ok(())
        };
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// Clears `out` and writes the next packet to send into it (BTH through pad, no ICRC).
    /// False: nothing to send now (call again after the next event or timeout).
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        out.clear();
        if self.stopped() {
            // After a rejected request, the NAK still goes out.
            return self.transmit_final(out);
        }
        for turn in 0..2 {
            let responses = self.responses_first == (turn == 0);
            let result = if responses {
                self.resp.poll_transmit(&*self.qp, &mut self.stats, out)
            } else {
                self.req.poll_transmit(now, &*self.qp, &mut self.stats, out)
            };
            self.collect();
            match result {
                Ok(true) => {
                    self.responses_first = !responses;
                    self.stats.tx_packets += 1;
                    if !responses {
                        self.keepalive.busy();
                    }
                    return true;
                }
                Ok(false) => {}
                Err(e) => {
                    self.fail(e);
                    return self.transmit_final(out);
                }
            }
        }
        if !self.req.idle() {
            self.keepalive.busy();
            return false;
        }
        if matches!(self.qp.state(), QpState::Rts | QpState::Sqd) {
            self.keepalive.start(now);
        }
        let (una, dest, pkey) = (self.req.una, self.cfg.dest_qpn, self.cfg.pkey);
        if self.keepalive.poll_transmit(una, dest, pkey, out) {
            self.stats.keepalive_probes += 1;
            self.stats.tx_packets += 1;
            return true;
        }
        false
    }

    fn transmit_final(&mut self, out: &mut Vec<u8>) -> bool {
        if self.reset {
            return false;
        }
        let result = self.resp.poll_transmit(&*self.qp, &mut self.stats, out);
        self.collect();
        match result {
            Ok(true) => {
                self.stats.tx_packets += 1;
                true
            }
            _ => false,
        }
    }

    /// When [`RcEngine::handle_timeout`] should next be called (ACK timeout, end of an RNR
    /// wait, keepalive), if ever: the earlier of [`RcEngine::transport_timeout`] and
    /// [`RcEngine::keepalive_due`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        earliest(self.transport_timeout(), self.keepalive_due())
    }

    /// The requester's ACK timeout or RNR wait, or the resend of an unanswered keepalive
    /// probe: every deadline except [`RcEngine::keepalive_due`].
    pub fn transport_timeout(&self) -> Option<Instant> {
        if self.flushed || self.reset {
            return None;
        }
        if self.req.idle() {
            earliest(
                self.req.poll_timeout(),
                self.keepalive.retry_deadline(self.req.cfg.ack_timeout),
            )
        } else {
            self.req.poll_timeout()
        }
    }

    /// When this QP, idle and silent since, sends its first keepalive probe. A driver with
    /// many QPs may round it up to batch its timers: the probe goes out at the first
    /// [`RcEngine::handle_timeout`] at or after it.
    pub fn keepalive_due(&self) -> Option<Instant> {
        if self.flushed || self.reset || !self.keepalive_applies() {
            return None;
        }
        self.keepalive.due(self.req.cfg.ack_timeout)
    }

    /// True while keepalive watches the peer: the QP can send (RTS or SQD) and the requester
    /// has nothing in flight (its ACK timer watches the peer otherwise).
    fn keepalive_applies(&self) -> bool {
        self.req.idle() && matches!(self.qp.state(), QpState::Rts | QpState::Sqd)
    }

    /// Processes expired timers: retransmission after an ACK timeout (or RETRY_EXC_ERR when
    /// the retries are used up), resumption after an RNR wait, keepalive probes (or
    /// [`RcError::PeerUnresponsive`] when they go unanswered).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.stopped() {
            return;
        }
        let mut result = self.req.handle_timeout(now, &*self.qp, &mut self.stats);
        self.collect();
        if result.is_ok() && self.keepalive_applies() {
            let (timeout, retries) = (self.req.cfg.ack_timeout, self.req.cfg.retry_cnt);
            result = self.keepalive.on_timeout(now, timeout, retries);
        }
        if let Err(e) = result {
            if e.peer_lost() {
                tracing::debug!(qpn = self.qp.qpn(), error = %e, "RC peer lost");
            }
            self.fail(e);
        }
    }

    /// Call after the application changed the QP (modify, post to an ERR QP, destroy).
    /// ERR: in-flight WRs flush first, then queued ones, in order. RESET: everything is
    /// dropped without completions. RTS/SQD: the send-side attributes of that transition
    /// (`sq_psn` if nothing was sent yet, `timeout`, `retry_cnt`, `rnr_retry`,
    /// `max_rd_atomic`, `min_rnr_timer`) are taken from the QP, so an engine created at RTR
    /// starts sending correctly; new work is then picked up by `poll_transmit`.
    pub fn sync_state(&mut self, now: Instant) {
        if self.stopped() {
            return;
        }
        if matches!(self.qp.state(), QpState::Rts | QpState::Sqd) {
            self.keepalive.start(now);
            let attr = self.qp.attr();
            self.req.apply_rts_attrs(&attr);
            self.resp.cfg.min_rnr_timer = attr.min_rnr_timer & 0x1f;
            self.cfg = RcConfig {
                min_rnr_timer: self.resp.cfg.min_rnr_timer,
                ..self.req.cfg.clone()
            };
        }
    }

    /// The application destroyed the QP: every WR is dropped without a completion (as
    /// `ibv_destroy_qp` does) and no packet is handled any more; `poll_transmit` then yields only
    /// the ACK the responder still owes, if one is queued. The messages it acknowledges were
    /// executed and completed here; without it the requester would retry them until its retry
    /// count is exhausted (RETRY_EXC_ERR on a WR its peer received), unless the CM's DREQ
    /// reached it first.
    pub fn destroy(&mut self) {
        self.destroyed = true;
        self.req.discard();
        self.resp.abort(KeepReplies::OwedAck);
    }

    /// True once the QP is in ERR with everything flushed and the last NAK sent (or the QP
    /// was reset): the driver may drop the engine.
    pub fn is_closed(&self) -> bool {
        self.reset || ((self.flushed || self.destroyed) && self.resp.idle())
    }

    /// Counters.
    pub fn stats(&self) -> RcStats {
        self.stats
    }

    /// The requester's congestion window now: how many PSNs past the oldest unacknowledged
    /// one it may have in flight (see `requester`).
    pub fn send_window(&self) -> u32 {
        self.req.cwnd
    }

    /// The requester's and the responder's sequence state in one line (PSNs, queued work,
    /// timers), for `softrdma stat --json`: what a stalled QP is waiting for.
    pub fn summary(&self, now: Instant) -> String {
        let error = match &self.error {
            Some(e) => format!("; failed: {e}"),
            None => String::new(),
        };
        format!("sq: {}; rq: {}{error}", self.req.summary(now), self.resp.summary())
    }

    /// Whether [`RcEngine::poll_transmit`] may have a packet now; false only when it certainly
    /// has not (nothing unsent, no reply owed, no WR queued, the QP not failing). Keepalive
    /// probes are not counted: they come from timers.
    pub fn may_transmit(&self) -> bool {
        self.reset
            || self.error.is_some()
            || self.qp.state() == QpState::Err
            || self.resp.has_replies()
            || self.req.may_transmit(&*self.qp)
    }

    /// Why the QP went to ERR, if it did.
    pub fn error(&self) -> Option<&RcError> {
        self.error.as_ref()
    }

    /// Follows the QP state; true if the engine must not process anything (ERR or RESET).
    fn stopped(&mut self) -> bool {
        if self.reset || self.destroyed {
            return true;
        }
        match self.qp.state() {
            QpState::Err => {
                if self.flushed {
                    // WRs posted to the ERR QP since: flush them too.
                    let (sends, recvs) = self.qp.enter_error();
                    self.out.flush(sends, recvs);
                } else {
                    self.fail(RcError::Flushed);
                }
                true
            }
            QpState::Reset => {
                self.reset = true;
                self.req.discard();
                self.resp.abort(KeepReplies::Nothing);
                true
            }
            _ => self.flushed,
        }
    }

    /// Moves the QP to ERR: the failed WR (if any) has completed already; in-flight WRs flush,
    /// then the queued ones, then the receive side. The QP is in ERR before the first flush
    /// completion (as rxe's completer moves it before it flushes): an application that polled
    /// every completion and then queries the QP finds ERR.
    fn fail(&mut self, e: RcError) {
        let keep = match e {
            RcError::Rejected { .. } => KeepReplies::FinalNak,
            RcError::Flushed => KeepReplies::OwedAck,
            _ => KeepReplies::Nothing,
        };
        if !matches!(e, RcError::Flushed) {
            tracing::debug!(qpn = self.qp.qpn(), error = %e, "RC QP to error state");
        }
        let (sends, recvs) = self.qp.enter_error();
        self.req.flush(&*self.qp);
        self.collect();
        if !matches!(e, RcError::Flushed) && !self.flushed {
            self.out.fatal();
        }
        let mut all_recvs: Vec<_> = self.resp.abort(keep).into_iter().collect();
        self.collect();
        all_recvs.extend(recvs);
        self.out.flush(sends, all_recvs);
        self.error.get_or_insert(e);
        self.flushed = true;
    }
}
