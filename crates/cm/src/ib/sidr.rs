//! Service ID resolution (SIDR, IBTA vol. 1 §12.11) as sans-I/O machines: rdma_cm's
//! "connect" for UD ids (RDMA_PS_UDP).
//!
//! [`SidrClient`]: SIDR_REQ sent, resent every `response` (at most `retries` times, within
//! `give_up`) until the SIDR_REP with its request ID arrives. [`SidrServer`]: one received
//! request; a duplicate SIDR_REQ is ignored while the consumer decides and answered with the
//! same SIDR_REP afterwards (until the entry expires).

use super::conn::{Action, Actions};
use super::timing::Timing;
use softrdma_wire::ibcm::{CmMad, CmMessage, SidrRep, SidrReq};
use std::time::Instant;

/// How a SIDR exchange ended on the active side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SidrOutcome {
    /// The SIDR_REP (any status).
    Reply(Box<SidrRep>),
    /// No SIDR_REP after every try.
    TimedOut,
}

/// The active side of one SIDR exchange.
#[derive(Debug, Clone)]
pub struct SidrClient {
    req: CmMad,
    request_id: u32,
    left: u8,
    timing: Timing,
    deadline: Option<Instant>,
    give_up: Option<Instant>,
}

impl SidrClient {
    /// Sends `req` (its `request_id` set to `request_id`).
    pub fn start(request_id: u32, tid: u64, mut req: SidrReq, timing: Timing, now: Instant) -> (SidrClient, Actions) {
        req.request_id = request_id;
        let m = CmMad {
            tid,
            msg: CmMessage::SidrReq(req),
        };
        let give_up = timing.give_up.map(|d| now + d);
        let first = now + timing.response;
        let c = SidrClient {
            req: m.clone(),
            request_id,
            left: timing.retries,
            timing,
            deadline: Some(give_up.map_or(first, |g| first.min(g))),
            give_up,
        };
        (c, vec![Action::Send(m)])
    }

    /// When [`SidrClient::on_timer`] must run next (None once finished).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// True once a reply arrived or every try timed out.
    pub fn finished(&self) -> bool {
        self.deadline.is_none()
    }

    /// A SIDR_REP arrived; `Some` if it answers this request.
    pub fn on_rep(&mut self, rep: &SidrRep) -> Option<SidrOutcome> {
        if self.finished() || rep.request_id != self.request_id {
            return None;
        }
        self.deadline = None;
        Some(SidrOutcome::Reply(Box::new(rep.clone())))
    }

    /// Timer: resend, or give up.
    pub fn on_timer(&mut self, now: Instant) -> (Actions, Option<SidrOutcome>) {
        match self.deadline {
            Some(d) if d <= now => {}
            _ => return (Vec::new(), None),
        }
        if self.left == 0 || self.give_up.is_some_and(|g| g <= now) {
            self.deadline = None;
            return (Vec::new(), Some(SidrOutcome::TimedOut));
        }
        self.left -= 1;
        let next = now + self.timing.response;
        self.deadline = Some(self.give_up.map_or(next, |g| next.min(g)));
        (vec![Action::Send(self.req.clone())], None)
    }

    /// The consumer destroyed its id: stop.
    pub fn cancel(&mut self) {
        self.deadline = None;
    }
}

/// The passive side of one SIDR request.
#[derive(Debug, Clone)]
pub struct SidrServer {
    request_id: u32,
    tid: u64,
    service_id: u64,
    reply: Option<CmMad>,
    keep: std::time::Duration,
    deadline: Option<Instant>,
    done: bool,
}

impl SidrServer {
    /// A SIDR_REQ arrived (tid `tid`); the answer is remembered for `timing.response` times
    /// the tries, so duplicates of a request whose reply was lost get it again.
    pub fn new(tid: u64, req: &SidrReq, timing: Timing) -> SidrServer {
        SidrServer {
            request_id: req.request_id,
            tid,
            service_id: req.service_id,
            reply: None,
            keep: timing.response * (u32::from(timing.retries) + 1),
            deadline: None,
            done: false,
        }
    }

    /// True while the consumer has not answered.
    pub fn pending(&self) -> bool {
        self.reply.is_none() && !self.done
    }

    /// True once the entry can be forgotten.
    pub fn finished(&self) -> bool {
        self.done
    }

    /// When [`SidrServer::on_timer`] must run.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The consumer answers: `rep` gets the request ID, service ID and TID.
    pub fn answer(&mut self, mut rep: SidrRep, now: Instant) -> Result<Actions, &'static str> {
        if !self.pending() {
            return Err("no SIDR request to answer");
        }
        rep.request_id = self.request_id;
        rep.service_id = self.service_id;
        let m = CmMad {
            tid: self.tid,
            msg: CmMessage::SidrRep(rep),
        };
        self.reply = Some(m.clone());
        self.deadline = Some(now + self.keep);
        Ok(vec![Action::Send(m)])
    }

    /// A duplicate SIDR_REQ: the remembered answer, if any.
    pub fn on_dup(&self) -> Actions {
        self.reply.clone().map(Action::Send).into_iter().collect()
    }

    /// Timer: the remembered answer expires.
    pub fn on_timer(&mut self, now: Instant) {
        if self.deadline.is_some_and(|d| d <= now) {
            self.deadline = None;
            self.done = true;
        }
    }

    /// The consumer's id is gone without an answer: `rep` (a reject) if still pending.
    pub fn abandon(&mut self, rep: SidrRep, now: Instant) -> Actions {
        let out = self.answer(rep, now).unwrap_or_default();
        self.done = true;
        self.deadline = None;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::ibcm::SidrStatus;
    use std::time::Duration;

    const R: Duration = Duration::from_millis(50);

    fn t(retries: u8) -> Timing {
        Timing {
            response: R,
            retries,
            timewait: R,
            give_up: None,
        }
    }

    #[test]
    fn client_resends_then_times_out() {
        let now = Instant::now();
        let (mut c, acts) = SidrClient::start(0x0001_4000, 3, SidrReq::default(), t(2), now);
        let [Action::Send(m)] = &acts[..] else { panic!() };
        let CmMessage::SidrReq(r) = &m.msg else { panic!() };
        assert_eq!(r.request_id, 0x0001_4000);
        assert_eq!(c.on_timer(now + R / 2), (Vec::new(), None));
        assert_eq!(c.on_timer(now + R).0.len(), 1);
        assert_eq!(c.on_timer(now + 2 * R).0.len(), 1);
        assert_eq!(c.on_timer(now + 3 * R), (Vec::new(), Some(SidrOutcome::TimedOut)));
        assert!(c.finished());
        assert_eq!(c.on_rep(&SidrRep::default()), None);
    }

    #[test]
    fn client_takes_only_its_reply_and_respects_give_up() {
        let now = Instant::now();
        let tm = Timing {
            give_up: Some(Duration::from_millis(70)),
            ..t(5)
        };
        let (mut c, _) = SidrClient::start(9, 3, SidrReq::default(), tm, now);
        let other = SidrRep {
            request_id: 10,
            ..SidrRep::default()
        };
        assert_eq!(c.on_rep(&other), None);
        assert_eq!(c.on_timer(now + R).0.len(), 1);
        assert_eq!(c.deadline(), Some(now + Duration::from_millis(70)));
        assert_eq!(
            c.on_timer(now + Duration::from_millis(70)).1,
            Some(SidrOutcome::TimedOut)
        );
        let (mut c, _) = SidrClient::start(9, 3, SidrReq::default(), tm, now);
        let mine = SidrRep {
            request_id: 9,
            status: SidrStatus::Reject,
            ..SidrRep::default()
        };
        assert_eq!(c.on_rep(&mine), Some(SidrOutcome::Reply(Box::new(mine.clone()))));
        assert_eq!(c.on_rep(&mine), None, "a duplicate reply is ignored");
    }

    #[test]
    fn server_answers_duplicates_then_forgets() {
        let now = Instant::now();
        let req = SidrReq {
            request_id: 77,
            service_id: 0x0111_1234,
            ..SidrReq::default()
        };
        let mut s = SidrServer::new(5, &req, t(1));
        assert!(s.pending());
        assert!(s.on_dup().is_empty(), "no answer yet: duplicates are ignored");
        let acts = s
            .answer(
                SidrRep {
                    qpn: 0x42,
                    qkey: 0x0123_4567,
                    ..SidrRep::default()
                },
                now,
            )
            .unwrap();
        let [Action::Send(m)] = &acts[..] else { panic!() };
        let CmMessage::SidrRep(rep) = &m.msg else { panic!() };
        assert_eq!(
            (m.tid, rep.request_id, rep.service_id, rep.qpn),
            (5, 77, 0x0111_1234, 0x42)
        );
        assert_eq!(s.on_dup(), acts);
        assert!(s.answer(SidrRep::default(), now).is_err());
        s.on_timer(now + R);
        assert!(!s.finished());
        s.on_timer(now + 2 * R);
        assert!(s.finished());
        let mut s = SidrServer::new(5, &req, t(1));
        let acts = s.abandon(
            SidrRep {
                status: SidrStatus::Reject,
                ..SidrRep::default()
            },
            now,
        );
        assert_eq!(acts.len(), 1);
        assert!(s.finished() && !s.pending());
    }
}
