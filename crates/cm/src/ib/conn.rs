//! One IB CM connection as a sans-I/O state machine (IBTA vol. 1 §12.9, Linux cm.c).
//!
//! Active side: IDLE → REQ_SENT (→ MRA_REQ_RCVD) → REP_RCVD → ESTABLISHED (RTU sent).
//! Passive side: REQ_RCVD (→ MRA_REQ_SENT on a duplicate REQ) → REP_SENT (→ MRA_REP_RCVD)
//! → ESTABLISHED (RTU received). Either side: ESTABLISHED → DREQ_SENT / DREQ_RCVD → TIMEWAIT
//! → IDLE. REQ, REP and DREQ are sent again until answered, at most `retries` times, each
//! after `response`; duplicates are answered (REP → RTU again, REQ → MRA or REP again,
//! DREQ in TIMEWAIT → DREP again, REQ in TIMEWAIT → REJ stale connection).
//!
//! Inputs are messages the agent routed here, timer expiries and the consumer's calls, each
//! with the current time; outputs are [`Action`]s: MADs to send to the peer and [`Report`]s
//! for the rdma_cm layer. Nothing here reads a clock or touches a socket.

use super::timing::Timing;
use softrdma_wire::ibcm::{
    cm_timeout_ms, CmMad, CmMessage, Drep, Dreq, Mra, Rej, RejReason, Rep, Req, Rtu, CM_MSG_OTHER, CM_MSG_REP,
    CM_MSG_REQ, REJ_PRIVATE_LEN, RTU_PRIVATE_LEN,
};
use std::time::{Duration, Instant};

/// Connection states (Linux `enum ib_cm_state`, the ones rdma_cm reaches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No connection (new, failed, or after TIMEWAIT).
    Idle,
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: the peer said (MRA) it needs more time for the REQ.
    MraReqRcvd,
    /// Active: REP received, RTU not sent yet.
    RepRcvd,
    /// Active: REP received twice; an MRA told the peer to wait.
    MraRepSent,
    /// Passive: REQ received, the consumer has not answered.
    ReqRcvd,
    /// Passive: as REQ_RCVD, and a duplicate REQ was answered with an MRA.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Passive: the peer said (MRA) it needs more time for the REP.
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, the consumer has not answered (DREP).
    DreqRcvd,
    /// Closed; the communication IDs stay reserved for a while.
    Timewait,
}

/// What the rdma_cm layer learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Active: the peer accepted (move the QP to RTR/RTS, then call [`Conn::rtu`]).
    Rep(Box<Rep>),
    /// Passive: RTU received.
    Established,
    /// The peer rejected (REQ_SENT, REP_RCVD, REP_SENT, ...).
    Rejected {
        /// REJ reason.
        reason: RejReason,
        /// REJ private data (148 bytes).
        private_data: Vec<u8>,
    },
    /// REQ or REP unanswered after every try (`timed_out`), or the overall bound passed.
    Unreachable,
    /// DREQ received, DREP received, DREQ received while DREQ_SENT, or the DREQ timed out
    /// (`timed_out`: the kernel reports -ETIMEDOUT then).
    Disconnected {
        /// No DREP came.
        timed_out: bool,
    },
    /// The QP's transport found the peer gone (retries or keepalive probes unanswered);
    /// `why` says how. The connection is over, as after a DREQ that timed out.
    PeerLost {
        /// What the transport saw.
        why: String,
    },
    /// TIMEWAIT is over.
    TimewaitExit,
}

/// One output. (Actions live for one step; boxing the MAD would buy nothing.)
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum Action {
    /// Send this MAD to the peer.
    Send(CmMad),
    /// Tell the rdma_cm layer.
    Report(Report),
}

/// Outputs of one step.
pub type Actions = Vec<Action>;

/// The message being retransmitted.
#[derive(Debug, Clone)]
struct Retry {
    mad: CmMad,
    left: u8,
    every: Duration,
}

/// One connection.
#[derive(Debug, Clone)]
pub struct Conn {
    active: bool,
    state: State,
    local_id: u32,
    remote_id: u32,
    remote_qpn: u32,
    /// Our QP number (from the REQ we sent or the REP we sent; 0 until then).
    local_qpn: u32,
    tid: u64,
    dreq_tid: u64,
    timing: Timing,
    retry: Option<Retry>,
    deadline: Option<Instant>,
    give_up: Option<Instant>,
    /// Our answer to duplicates: RTU (dup REP), MRA (dup REQ), REP (dup REQ), DREP (dup DREQ).
    answer: Option<CmMad>,
    mra_timeout: u8,
    /// TIMEWAIT follows a disconnect (its end is reported) rather than a reject or destroy.
    report_timewait: bool,
}

fn mad(tid: u64, msg: impl Into<CmMessage>) -> CmMad {
    CmMad { tid, msg: msg.into() }
}

fn pd_array<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    out
}

impl Conn {
    /// Active side: sends `req` (its `local_comm_id` set to `local_id`) and waits for REP.
    pub fn active(local_id: u32, tid: u64, mut req: Req, timing: Timing, now: Instant) -> (Conn, Actions) {
        req.local_comm_id = local_id;
        let local_qpn = req.local_qpn;
        let m = mad(tid, req);
        let mut c = Conn {
            active: true,
            state: State::ReqSent,
            local_id,
            remote_id: 0,
            remote_qpn: 0,
            local_qpn,
            tid,
            dreq_tid: 0,
            timing,
            retry: None,
            deadline: None,
            give_up: timing.give_up.map(|d| now + d),
            answer: None,
            mra_timeout: timing.response_exponent(),
            report_timewait: false,
        };
        c.start_retry(m.clone(), now);
        (c, vec![Action::Send(m)])
    }

    /// Passive side: `req` arrived (tid `tid`); the consumer answers with accept or reject.
    pub fn passive(local_id: u32, tid: u64, req: &Req, timing: Timing) -> Conn {
        Conn {
            active: false,
            state: State::ReqRcvd,
            local_id,
            remote_id: req.local_comm_id,
            remote_qpn: req.local_qpn,
            local_qpn: 0,
            tid,
            dreq_tid: 0,
            timing,
            retry: None,
            deadline: None,
            give_up: None,
            answer: None,
            mra_timeout: timing.response_exponent(),
            report_timewait: false,
        }
    }

    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// True on the side that sent the REQ.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The peer's communication ID (0 until known).
    #[cfg(test)]
    pub fn remote_id(&self) -> u32 {
        self.remote_id
    }

    /// Our QP number, once a REQ or REP carried it.
    pub fn local_qpn(&self) -> u32 {
        self.local_qpn
    }

    /// When [`Conn::on_timer`] must run next.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// True once the connection is over for good (IDLE): its IDs can be forgotten.
    pub fn finished(&self) -> bool {
        self.state == State::Idle
    }

    fn start_retry(&mut self, m: CmMad, now: Instant) {
        let every = self.timing.response;
        self.retry = Some(Retry {
            mad: m,
            left: self.timing.retries,
            every,
        });
        self.set_deadline(now + every);
    }

    fn set_deadline(&mut self, at: Instant) {
        self.deadline = Some(match self.give_up {
            Some(g) if matches!(self.state, State::ReqSent | State::MraReqRcvd) => at.min(g),
            _ => at,
        });
    }

    fn stop(&mut self) {
        self.retry = None;
        self.deadline = None;
    }

    fn enter_idle(&mut self) {
        self.stop();
        self.state = State::Idle;
    }

    /// Enters TIMEWAIT; `report`: its end becomes [`Report::TimewaitExit`] (after a
    /// disconnect, not after a reject).
    fn enter_timewait(&mut self, now: Instant, report: bool) {
        self.retry = None;
        self.state = State::Timewait;
        self.report_timewait = report;
        self.deadline = Some(now + self.timing.timewait);
    }

    fn rej(&self, reason: RejReason, message_rejected: u8, private_data: &[u8], ari: &[u8]) -> CmMad {
        mad(
            self.tid,
            Rej {
                local_comm_id: self.local_id,
                remote_comm_id: self.remote_id,
                message_rejected,
                reason,
                ari: ari.to_vec(),
                private_data: pd_array::<REJ_PRIVATE_LEN>(private_data),
            },
        )
    }

    fn mra(&self, message_mraed: u8) -> CmMad {
        mad(
            self.tid,
            Mra {
                local_comm_id: self.local_id,
                remote_comm_id: self.remote_id,
                message_mraed,
                service_timeout: self.mra_timeout,
                ..Mra::default()
            },
        )
    }

    /// A timer expired (or may have: early calls do nothing).
    pub fn on_timer(&mut self, now: Instant) -> Actions {
        match self.deadline {
            Some(d) if d <= now => {}
            _ => return Vec::new(),
        }
        match self.state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd | State::DreqSent => {
                let gave_up = self.give_up.is_some_and(|g| g <= now) && !matches!(self.state, State::DreqSent);
                let Some(r) = self.retry.as_mut().filter(|r| r.left > 0 && !gave_up) else {
                    return self.exhausted(now);
                };
                r.left -= 1;
                let (m, every) = (r.mad.clone(), r.every);
                self.state = match self.state {
                    State::MraReqRcvd => State::ReqSent,
                    State::MraRepRcvd => State::RepSent,
                    s => s,
                };
                self.set_deadline(now + every);
                vec![Action::Send(m)]
            }
            State::Timewait => {
                self.enter_idle();
                if self.report_timewait {
                    vec![Action::Report(Report::TimewaitExit)]
                } else {
                    Vec::new()
                }
            }
            _ => {
                self.deadline = None;
                Vec::new()
            }
        }
    }

    /// Every try went unanswered.
    fn exhausted(&mut self, now: Instant) -> Actions {
        match self.state {
            State::ReqSent | State::MraReqRcvd => {
                self.enter_idle();
                vec![Action::Report(Report::Unreachable)]
            }
            State::RepSent | State::MraRepRcvd => {
                let rej = self.rej(RejReason::Timeout, CM_MSG_OTHER, &[], &[]);
                self.enter_idle();
                vec![Action::Send(rej), Action::Report(Report::Unreachable)]
            }
            State::DreqSent => {
                self.enter_timewait(now, true);
                vec![Action::Report(Report::Disconnected { timed_out: true })]
            }
            _ => Vec::new(),
        }
    }

    /// A message for this connection arrived (the agent routed it by communication ID, or,
    /// for a duplicate REQ, by the peer's address and communication ID).
    pub fn on_mad(&mut self, m: &CmMad, now: Instant) -> Actions {
        match &m.msg {
            CmMessage::Req(r) => self.on_dup_req(r),
            CmMessage::Mra(mra) => self.on_mra(mra, now),
            CmMessage::Rej(rej) => self.on_rej(rej),
            CmMessage::Rep(rep) => self.on_rep(m.tid, rep),
            CmMessage::Rtu(rtu) => {
                if rtu.remote_comm_id != self.local_id || rtu.local_comm_id != self.remote_id {
                    return Vec::new();
                }
                if matches!(self.state, State::RepSent | State::MraRepRcvd) {
                    self.stop();
                    self.answer = None;
                    self.state = State::Established;
                    return vec![Action::Report(Report::Established)];
                }
                Vec::new()
            }
            CmMessage::Dreq(d) => self.on_dreq(m.tid, d, now),
            CmMessage::Drep(d) => {
                if d.remote_comm_id != self.local_id || d.local_comm_id != self.remote_id {
                    return Vec::new();
                }
                if self.state == State::DreqSent {
                    self.enter_timewait(now, true);
                    return vec![Action::Report(Report::Disconnected { timed_out: false })];
                }
                Vec::new()
            }
            CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => Vec::new(),
        }
    }

    fn on_dup_req(&mut self, r: &Req) -> Actions {
        if self.active || r.local_comm_id != self.remote_id {
            return Vec::new();
        }
        match self.state {
            State::ReqRcvd | State::MraReqSent => {
                self.state = State::MraReqSent;
                vec![Action::Send(self.mra(CM_MSG_REQ))]
            }
            State::RepSent | State::MraRepRcvd => match &self.retry {
                Some(r) => vec![Action::Send(r.mad.clone())],
                None => Vec::new(),
            },
            // A REQ we rejected gets the same REJ; any other is stale.
            State::Timewait => match &self.answer {
                Some(
                    m @ CmMad {
                        msg: CmMessage::Rej(_), ..
                    },
                ) => vec![Action::Send(m.clone())],
                _ => vec![Action::Send(self.rej(RejReason::StaleConn, CM_MSG_REQ, &[], &[]))],
            },
            _ => Vec::new(),
        }
    }

    fn on_mra(&mut self, mra: &Mra, now: Instant) -> Actions {
        if mra.remote_comm_id != self.local_id {
            return Vec::new();
        }
        let wait = Duration::from_millis(cm_timeout_ms(mra.service_timeout)) + self.timing.response;
        match (self.state, mra.message_mraed) {
            (State::ReqSent, CM_MSG_REQ) => {
                self.remote_id = mra.local_comm_id;
                self.state = State::MraReqRcvd;
                self.set_deadline(now + wait);
            }
            (State::RepSent, CM_MSG_REP) if mra.local_comm_id == self.remote_id => {
                self.state = State::MraRepRcvd;
                self.set_deadline(now + wait);
            }
            _ => {}
        }
        Vec::new()
    }

    fn on_rej(&mut self, rej: &Rej) -> Actions {
        if rej.remote_comm_id != self.local_id {
            return Vec::new();
        }
        // Before the REP, the peer's ID may be unknown (the driver's REJ for an unclaimed
        // service carries 0); afterwards it must match.
        let known = !matches!(self.state, State::ReqSent | State::MraReqRcvd);
        if known && rej.local_comm_id != self.remote_id {
            return Vec::new();
        }
        match self.state {
            State::ReqSent
            | State::MraReqRcvd
            | State::RepRcvd
            | State::MraRepSent
            | State::ReqRcvd
            | State::MraReqSent
            | State::RepSent
            | State::MraRepRcvd => {
                self.enter_idle();
                vec![Action::Report(Report::Rejected {
                    reason: rej.reason,
                    private_data: rej.private_data.to_vec(),
                })]
            }
            _ => Vec::new(),
        }
    }

    fn on_rep(&mut self, tid: u64, rep: &Rep) -> Actions {
        if !self.active || rep.remote_comm_id != self.local_id {
            return Vec::new();
        }
        match self.state {
            State::ReqSent | State::MraReqRcvd => {
                self.stop();
                self.remote_id = rep.local_comm_id;
                self.remote_qpn = rep.local_qpn;
                self.tid = tid;
                self.state = State::RepRcvd;
                vec![Action::Report(Report::Rep(Box::new(*rep)))]
            }
            _ if rep.local_comm_id != self.remote_id => Vec::new(),
            State::RepRcvd | State::MraRepSent => {
                self.state = State::MraRepSent;
                vec![Action::Send(self.mra(CM_MSG_REP))]
            }
            State::Established => self.answer.clone().map(Action::Send).into_iter().collect(),
            _ => Vec::new(),
        }
    }

    fn on_dreq(&mut self, tid: u64, d: &Dreq, now: Instant) -> Actions {
        if d.remote_comm_id != self.local_id || d.local_comm_id != self.remote_id {
            return Vec::new();
        }
        let drep = mad(
            tid,
            Drep {
                local_comm_id: self.local_id,
                remote_comm_id: self.remote_id,
                ..Drep::default()
            },
        );
        match self.state {
            State::Established | State::RepSent | State::MraRepRcvd => {
                self.stop();
                self.dreq_tid = tid;
                self.state = State::DreqRcvd;
                vec![Action::Report(Report::Disconnected { timed_out: false })]
            }
            State::DreqSent => {
                self.answer = Some(drep.clone());
                self.enter_timewait(now, true);
                vec![
                    Action::Send(drep),
                    Action::Report(Report::Disconnected { timed_out: false }),
                ]
            }
            State::Timewait => vec![Action::Send(drep)],
            _ => Vec::new(),
        }
    }

    /// Passive: the consumer accepts; sends `rep` (IDs filled in). The REP is sent again
    /// every `every` until the RTU, at most `retries` times.
    pub fn accept(
        &mut self,
        mut rep: Rep,
        every: Duration,
        retries: u8,
        now: Instant,
    ) -> Result<Actions, &'static str> {
        if self.active || !matches!(self.state, State::ReqRcvd | State::MraReqSent) {
            return Err("no connection request to accept");
        }
        rep.local_comm_id = self.local_id;
        rep.remote_comm_id = self.remote_id;
        self.local_qpn = rep.local_qpn;
        let m = mad(self.tid, rep);
        self.state = State::RepSent;
        self.retry = Some(Retry {
            mad: m.clone(),
            left: retries,
            every,
        });
        self.set_deadline(now + every);
        Ok(vec![Action::Send(m)])
    }

    /// The consumer refuses: the passive side a REQ, the active side a REP (REJ with
    /// `reason` and up to 148 bytes of private data).
    pub fn reject(&mut self, reason: RejReason, private_data: &[u8], now: Instant) -> Result<Actions, &'static str> {
        let msg = match self.state {
            State::ReqRcvd | State::MraReqSent => CM_MSG_REQ,
            State::RepRcvd | State::MraRepSent => CM_MSG_REP,
            _ => return Err("no connection request or reply to reject"),
        };
        // TIMEWAIT keeps the REJ for a REQ or REP that crosses it.
        let m = self.rej(reason, msg, private_data, &[]);
        self.answer = Some(m.clone());
        self.enter_timewait(now, false);
        Ok(vec![Action::Send(m)])
    }

    /// Active: the QP is ready; sends the RTU (up to 224 bytes of private data).
    pub fn rtu(&mut self, private_data: &[u8]) -> Result<Actions, &'static str> {
        if !matches!(self.state, State::RepRcvd | State::MraRepSent) {
            return Err("no connection reply to complete");
        }
        let m = mad(
            self.tid,
            Rtu {
                local_comm_id: self.local_id,
                remote_comm_id: self.remote_id,
                private_data: pd_array::<RTU_PRIVATE_LEN>(private_data),
            },
        );
        self.answer = Some(m.clone());
        self.state = State::Established;
        Ok(vec![Action::Send(m)])
    }

    /// The consumer disconnects: a DREQ (with `tid`) when connected, the DREP when the
    /// peer's DREQ is waiting.
    pub fn disconnect(&mut self, tid: u64, now: Instant) -> Result<Actions, &'static str> {
        match self.state {
            State::Established | State::RepSent | State::MraRepRcvd => {
                let m = mad(
                    tid,
                    Dreq {
                        local_comm_id: self.local_id,
                        remote_comm_id: self.remote_id,
                        remote_qpn: self.remote_qpn,
                        ..Dreq::default()
                    },
                );
                self.dreq_tid = tid;
                self.answer = None;
                self.state = State::DreqSent;
                self.start_retry(m.clone(), now);
                Ok(vec![Action::Send(m)])
            }
            State::DreqRcvd => {
                let m = mad(
                    self.dreq_tid,
                    Drep {
                        local_comm_id: self.local_id,
                        remote_comm_id: self.remote_id,
                        ..Drep::default()
                    },
                );
                self.answer = Some(m.clone());
                self.enter_timewait(now, true);
                Ok(vec![Action::Send(m)])
            }
            _ => Err("not connected"),
        }
    }

    /// The QP's transport found the peer gone (`why`): a DREQ goes out once, in case the
    /// peer can still hear it, and the connection enters TIMEWAIT with a
    /// [`Report::PeerLost`]. A dead process cannot send the DREQ its kernel would send on a
    /// real fabric; this stands in for it. Ignored unless connected.
    pub fn peer_lost(&mut self, tid: u64, why: String, now: Instant) -> Actions {
        if !matches!(self.state, State::Established | State::RepSent | State::MraRepRcvd) {
            return Vec::new();
        }
        let mut out = self.disconnect(tid, now).unwrap_or_default();
        self.enter_timewait(now, true);
        out.push(Action::Report(Report::PeerLost { why }));
        out
    }

    /// The consumer destroys its id (Linux `cm_destroy_id`): an unanswered REQ is withdrawn
    /// with REJ timeout (ARI: `ari`, the local CA GUID), a pending request or reply is rejected
    /// (consumer defined), a connection sends DREQ (once) or the waiting DREP. No reports.
    pub fn destroy(&mut self, tid: u64, ari: &[u8], now: Instant) -> Actions {
        match self.state {
            State::ReqSent | State::MraReqRcvd => {
                let m = self.rej(RejReason::Timeout, CM_MSG_REQ, &[], ari);
                self.enter_idle();
                vec![Action::Send(m)]
            }
            State::ReqRcvd | State::MraReqSent => {
                let m = self.rej(RejReason::ConsumerDefined, CM_MSG_REQ, &[], &[]);
                self.enter_idle();
                vec![Action::Send(m)]
            }
            State::RepRcvd | State::MraRepSent | State::RepSent | State::MraRepRcvd => {
                let msg = if self.active { CM_MSG_REP } else { CM_MSG_OTHER };
                let m = self.rej(RejReason::ConsumerDefined, msg, &[], &[]);
                self.enter_timewait(now, false);
                vec![Action::Send(m)]
            }
            State::Established => {
                let mut out = self.disconnect(tid, now).unwrap_or_default();
                self.enter_timewait(now, false);
                out.retain(|a| matches!(a, Action::Send(_)));
                out
            }
            State::DreqSent => {
                self.enter_timewait(now, false);
                Vec::new()
            }
            State::DreqRcvd => {
                let out = self.disconnect(tid, now).unwrap_or_default();
                self.report_timewait = false;
                out
            }
            State::Timewait | State::Idle => Vec::new(),
        }
    }
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
