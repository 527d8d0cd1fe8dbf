//! The connection machine with simulated time: the whole life of a connection, the loss of
//! each message, duplicates, timeouts and rejects.

use super::*;
use softrdma_wire::ibcm::{CmMad, CmMessage, Rej, RejReason, Rep, Req, REJ_PRIVATE_LEN};
use std::time::{Duration, Instant};

const A_ID: u32 = 0x0001_1111;
const B_ID: u32 = 0x0002_2222;
const RESP: Duration = Duration::from_millis(100);

fn timing(retries: u8) -> Timing {
    Timing {
        response: RESP,
        retries,
        timewait: Duration::from_millis(30),
        give_up: None,
    }
}

fn req() -> Req {
    Req {
        local_qpn: 0x11,
        starting_psn: 0x100,
        ..Req::default()
    }
}

fn sent(acts: &Actions) -> Vec<CmMad> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Send(m) => Some(m.clone()),
            Action::Report(_) => None,
        })
        .collect()
}

fn reports(acts: &Actions) -> Vec<Report> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Report(r) => Some(r.clone()),
            Action::Send(_) => None,
        })
        .collect()
}

fn one(acts: &Actions) -> CmMad {
    let s = sent(acts);
    assert_eq!(s.len(), 1, "expected one MAD, got {acts:?}");
    s[0].clone()
}

/// Two machines, connected up to ESTABLISHED; returns them and the time.
struct Pair {
    a: Conn,
    b: Conn,
    now: Instant,
}

fn handshake(t: Timing) -> Pair {
    let now = Instant::now();
    let (mut a, acts) = Conn::active(A_ID, 7, req(), t, now);
    let m = one(&acts);
    let CmMessage::Req(r) = &m.msg else { panic!("{m:?}") };
    assert_eq!(r.local_comm_id, A_ID);
    assert_eq!(a.state(), State::ReqSent);
    assert_eq!(a.deadline(), Some(now + RESP));
    let mut b = Conn::passive(B_ID, m.tid, r, t);
    assert_eq!((b.state(), b.remote_id()), (State::ReqRcvd, A_ID));
    let acts = b.accept(Rep::default(), RESP, t.retries, now).unwrap();
    let rep = one(&acts);
    let CmMessage::Rep(p) = &rep.msg else { panic!() };
    assert_eq!((p.local_comm_id, p.remote_comm_id, rep.tid), (B_ID, A_ID, 7));
    assert_eq!(b.state(), State::RepSent);
    let acts = a.on_mad(&rep, now);
    assert!(sent(&acts).is_empty());
    assert!(matches!(&reports(&acts)[..], [Report::Rep(_)]));
    assert_eq!((a.state(), a.remote_id(), a.deadline()), (State::RepRcvd, B_ID, None));
    let rtu = one(&a.rtu(b"").unwrap());
    assert!(matches!(rtu.msg, CmMessage::Rtu(_)));
    assert_eq!(a.state(), State::Established);
    assert_eq!(reports(&b.on_mad(&rtu, now)), vec![Report::Established]);
    assert_eq!((b.state(), b.deadline()), (State::Established, None));
    Pair { a, b, now }
}

#[test]
fn whole_life_with_disconnect_and_timewait() {
    let Pair { mut a, mut b, now } = handshake(timing(3));
    let dreq = one(&a.disconnect(99, now).unwrap());
    assert_eq!(a.state(), State::DreqSent);
    let CmMessage::Dreq(d) = &dreq.msg else { panic!() };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (A_ID, B_ID));
    let acts = b.on_mad(&dreq, now);
    assert_eq!(reports(&acts), vec![Report::Disconnected { timed_out: false }]);
    assert!(sent(&acts).is_empty(), "the consumer sends the DREP");
    assert_eq!(b.state(), State::DreqRcvd);
    // A duplicate DREQ while the consumer has not answered changes nothing.
    assert!(b.on_mad(&dreq, now).is_empty());
    let drep = one(&b.disconnect(0, now).unwrap());
    assert_eq!(drep.tid, 99, "DREP echoes the DREQ's TID");
    assert_eq!(b.state(), State::Timewait);
    let acts = a.on_mad(&drep, now);
    assert_eq!(reports(&acts), vec![Report::Disconnected { timed_out: false }]);
    assert_eq!(a.state(), State::Timewait);
    // TIMEWAIT ends after its time, not before.
    assert!(a.on_timer(now + Duration::from_millis(29)).is_empty());
    let t = now + Duration::from_millis(30);
    assert_eq!(reports(&a.on_timer(t)), vec![Report::TimewaitExit]);
    assert_eq!(reports(&b.on_timer(t)), vec![Report::TimewaitExit]);
    assert!(a.finished() && b.finished());
    assert!(a.disconnect(1, t).is_err());
}

#[test]
fn lost_req_is_resent_then_unreachable() {
    let now = Instant::now();
    let (mut a, _) = Conn::active(A_ID, 1, req(), timing(2), now);
    let mut t = now;
    for i in 0..2 {
        assert!(
            a.on_timer(t + RESP - Duration::from_millis(1)).is_empty(),
            "early timer"
        );
        t += RESP;
        let m = one(&a.on_timer(t));
        assert!(matches!(m.msg, CmMessage::Req(_)), "try {i}");
        assert_eq!(a.deadline(), Some(t + RESP));
    }
    t += RESP;
    let acts = a.on_timer(t);
    assert!(sent(&acts).is_empty(), "no REJ after a plain timeout");
    assert_eq!(reports(&acts), vec![Report::Unreachable]);
    assert_eq!(t - now, 3 * RESP);
    assert!(a.finished());
    assert_eq!(a.deadline(), None);
}

#[test]
fn give_up_bounds_the_setup() {
    let now = Instant::now();
    let t = Timing {
        give_up: Some(Duration::from_millis(250)),
        ..timing(15)
    };
    let (mut a, _) = Conn::active(A_ID, 1, req(), t, now);
    assert_eq!(one(&a.on_timer(now + RESP)).tid, 1);
    assert_eq!(one(&a.on_timer(now + 2 * RESP)).tid, 1);
    assert_eq!(a.deadline(), Some(now + Duration::from_millis(250)));
    assert_eq!(
        reports(&a.on_timer(now + Duration::from_millis(250))),
        vec![Report::Unreachable]
    );
    // An MRA does not extend past the bound either.
    let (mut a, _) = Conn::active(A_ID, 1, req(), t, now);
    let mra = CmMad {
        tid: 1,
        msg: CmMessage::Mra(Mra {
            local_comm_id: B_ID,
            remote_comm_id: A_ID,
            message_mraed: CM_MSG_REQ,
            service_timeout: 20,
            ..Mra::default()
        }),
    };
    assert!(a.on_mad(&mra, now).is_empty());
    assert_eq!(a.state(), State::MraReqRcvd);
    assert_eq!(a.deadline(), Some(now + Duration::from_millis(250)));
}

#[test]
fn duplicate_req_gets_mra_then_rep() {
    let now = Instant::now();
    let (mut a, acts) = Conn::active(A_ID, 5, req(), timing(3), now);
    let reqm = one(&acts);
    let CmMessage::Req(r) = &reqm.msg else { panic!() };
    let mut b = Conn::passive(B_ID, 5, r, timing(3));
    // The consumer is slow: the retransmitted REQ is answered with an MRA.
    let resent = one(&a.on_timer(now + RESP));
    let mra = one(&b.on_mad(&resent, now + RESP));
    let CmMessage::Mra(m) = &mra.msg else { panic!("{mra:?}") };
    assert_eq!(
        (m.message_mraed, m.local_comm_id, m.remote_comm_id),
        (CM_MSG_REQ, B_ID, A_ID)
    );
    assert_eq!(b.state(), State::MraReqSent);
    // The MRA stretches the active side's wait by the service timeout.
    let t = now + RESP;
    assert!(a.on_mad(&mra, t).is_empty());
    assert_eq!(a.state(), State::MraReqRcvd);
    let wait = Duration::from_millis(cm_timeout_ms(m.service_timeout)) + RESP;
    assert_eq!(a.deadline(), Some(t + wait));
    assert!(a.on_timer(t + RESP).is_empty());
    // Accept in MRA_REQ_SENT; a REQ duplicate now gets the REP again.
    let rep = one(&b.accept(Rep::default(), RESP, 3, t).unwrap());
    assert_eq!(one(&b.on_mad(&resent, t)), rep);
    assert!(matches!(&reports(&a.on_mad(&rep, t))[..], [Report::Rep(_)]));
    // A REQ from another connection is not a duplicate.
    let other = CmMad {
        tid: 9,
        msg: CmMessage::Req(Req {
            local_comm_id: 0x0009_9999,
            ..req()
        }),
    };
    assert!(b.on_mad(&other, t).is_empty());
}

#[test]
fn lost_rep_and_lost_rtu_recover() {
    let now = Instant::now();
    let (mut a, acts) = Conn::active(A_ID, 5, req(), timing(3), now);
    let CmMessage::Req(r) = &one(&acts).msg else { panic!() };
    let mut b = Conn::passive(B_ID, 5, r, timing(3));
    let _lost_rep = b.accept(Rep::default(), RESP, 3, now).unwrap();
    // The REQ is retransmitted (REP lost) and answered with the REP again.
    let req2 = one(&a.on_timer(now + RESP));
    let rep = one(&b.on_mad(&req2, now + RESP));
    assert!(matches!(&reports(&a.on_mad(&rep, now + RESP))[..], [Report::Rep(_)]));
    let _lost_rtu = a.rtu(b"").unwrap();
    // RTU lost: the passive side resends the REP; the established active side resends the RTU.
    let rep2 = one(&b.on_timer(now + 2 * RESP));
    assert_eq!(rep2, rep);
    let rtu = one(&a.on_mad(&rep2, now + 2 * RESP));
    assert!(matches!(rtu.msg, CmMessage::Rtu(_)));
    assert_eq!(reports(&b.on_mad(&rtu, now + 2 * RESP)), vec![Report::Established]);
    // A late duplicate RTU is ignored.
    assert!(b.on_mad(&rtu, now + 2 * RESP).is_empty());
}

#[test]
fn rep_unanswered_rejects_with_timeout_and_reports_unreachable() {
    let now = Instant::now();
    let mut b = Conn::passive(
        B_ID,
        5,
        &Req {
            local_comm_id: A_ID,
            ..req()
        },
        timing(1),
    );
    b.accept(Rep::default(), RESP, 1, now).unwrap();
    assert!(matches!(one(&b.on_timer(now + RESP)).msg, CmMessage::Rep(_)));
    let acts = b.on_timer(now + 2 * RESP);
    let CmMessage::Rej(rej) = &one(&acts).msg else {
        panic!("{acts:?}")
    };
    assert_eq!(
        (rej.reason, rej.local_comm_id, rej.remote_comm_id),
        (RejReason::Timeout, B_ID, A_ID)
    );
    assert_eq!(reports(&acts), vec![Report::Unreachable]);
    assert!(b.finished());
}

#[test]
fn mra_for_rep_while_the_active_consumer_is_slow() {
    let now = Instant::now();
    let (mut a, acts) = Conn::active(A_ID, 5, req(), timing(3), now);
    let CmMessage::Req(r) = &one(&acts).msg else { panic!() };
    let mut b = Conn::passive(B_ID, 5, r, timing(3));
    let rep = one(&b.accept(Rep::default(), RESP, 3, now).unwrap());
    a.on_mad(&rep, now);
    // No RTU yet (QP-less active side waiting for rdma_establish): the REP comes again.
    let rep2 = one(&b.on_timer(now + RESP));
    let mra = one(&a.on_mad(&rep2, now + RESP));
    let CmMessage::Mra(m) = &mra.msg else { panic!() };
    assert_eq!(m.message_mraed, CM_MSG_REP);
    assert_eq!(a.state(), State::MraRepSent);
    assert!(b.on_mad(&mra, now + RESP).is_empty());
    assert_eq!(b.state(), State::MraRepRcvd);
    assert!(b.deadline().unwrap() > now + 2 * RESP);
    let rtu = one(&a.rtu(b"").unwrap());
    assert_eq!(reports(&b.on_mad(&rtu, now + RESP)), vec![Report::Established]);
}

#[test]
fn consumer_reject_carries_reason_and_private_data() {
    let now = Instant::now();
    let (mut a, acts) = Conn::active(A_ID, 5, req(), timing(3), now);
    let CmMessage::Req(r) = &one(&acts).msg else { panic!() };
    let mut b = Conn::passive(B_ID, 5, r, timing(3));
    let rej = one(&b.reject(RejReason::ConsumerDefined, b"go away", now).unwrap());
    assert_eq!(b.state(), State::Timewait);
    assert!(b.accept(Rep::default(), RESP, 3, now).is_err());
    assert!(b.reject(RejReason::ConsumerDefined, b"", now).is_err());
    // A REQ retransmission crossing the REJ gets the same REJ, not a new request.
    let dup = CmMad {
        tid: 5,
        msg: CmMessage::Req(*r),
    };
    assert_eq!(one(&b.on_mad(&dup, now)), rej);
    // The end of TIMEWAIT after a reject is not reported (no disconnect happened).
    assert!(b.on_timer(now + Duration::from_millis(30)).is_empty());
    assert!(b.finished());
    let acts = a.on_mad(&rej, now);
    let [Report::Rejected { reason, private_data }] = &reports(&acts)[..] else {
        panic!("{acts:?}")
    };
    assert_eq!(*reason, RejReason::ConsumerDefined);
    assert_eq!(private_data.len(), REJ_PRIVATE_LEN);
    assert_eq!(&private_data[..7], b"go away");
    assert!(private_data[7..].iter().all(|&b| b == 0));
    assert!(a.finished());
    assert_eq!(a.deadline(), None);
}

#[test]
fn driver_rej_for_an_unclaimed_service() {
    let now = Instant::now();
    let (mut a, _) = Conn::active(A_ID, 5, req(), timing(3), now);
    let rej = CmMad {
        tid: 5,
        msg: CmMessage::Rej(Rej {
            local_comm_id: 0,
            remote_comm_id: A_ID,
            reason: RejReason::InvalidServiceId,
            ..Rej::default()
        }),
    };
    // A REJ for somebody else is ignored.
    let mut wrong = rej.clone();
    if let CmMessage::Rej(r) = &mut wrong.msg {
        r.remote_comm_id = A_ID + 0x10000;
    }
    assert!(a.on_mad(&wrong, now).is_empty());
    let acts = a.on_mad(&rej, now);
    assert!(matches!(
        &reports(&acts)[..],
        [Report::Rejected {
            reason: RejReason::InvalidServiceId,
            ..
        }]
    ));
}

#[test]
fn destroy_while_req_sent_sends_rej_timeout_with_ari() {
    let now = Instant::now();
    let (mut a, acts) = Conn::active(A_ID, 5, req(), timing(3), now);
    let CmMessage::Req(r) = &one(&acts).msg else { panic!() };
    let mut b = Conn::passive(B_ID, 5, r, timing(3));
    let guid = 0x0102_0304_0506_0708u64.to_be_bytes();
    let acts = a.destroy(6, &guid, now);
    let rej = one(&acts);
    let CmMessage::Rej(j) = &rej.msg else { panic!() };
    assert_eq!(
        (j.reason, j.message_rejected, &j.ari[..]),
        (RejReason::Timeout, CM_MSG_REQ, &guid[..])
    );
    assert!(reports(&acts).is_empty());
    assert!(a.finished());
    // The passive side learns it through the REJ (sent with our ID and its still unknown one).
    let acts = b.on_mad(&rej, now);
    assert!(acts.is_empty(), "remote_comm_id 0 does not name B");
    let mut fixed = rej.clone();
    if let CmMessage::Rej(j) = &mut fixed.msg {
        j.remote_comm_id = B_ID;
    }
    assert!(matches!(
        &reports(&b.on_mad(&fixed, now))[..],
        [Report::Rejected {
            reason: RejReason::Timeout,
            ..
        }]
    ));
}

#[test]
fn destroy_in_each_state() {
    let Pair { mut a, mut b, now } = handshake(timing(3));
    // Connected: one DREQ, then TIMEWAIT at once; no reports.
    let acts = a.destroy(50, &[], now);
    assert!(matches!(one(&acts).msg, CmMessage::Dreq(_)));
    assert_eq!(a.state(), State::Timewait);
    let dreq = one(&acts);
    b.on_mad(&dreq, now);
    // DREQ waiting: destroy answers with the DREP.
    let acts = b.destroy(0, &[], now);
    assert!(matches!(one(&acts).msg, CmMessage::Drep(_)));
    assert_eq!(b.state(), State::Timewait);
    // A passive request nobody answered: REJ consumer defined.
    let mut c = Conn::passive(
        B_ID,
        5,
        &Req {
            local_comm_id: A_ID,
            ..req()
        },
        timing(3),
    );
    let CmMessage::Rej(j) = one(&c.destroy(0, &[], now)).msg else {
        panic!()
    };
    assert_eq!(j.reason, RejReason::ConsumerDefined);
    assert!(c.finished());
    // Idle and TIMEWAIT: nothing.
    assert!(c.destroy(0, &[], now).is_empty());
    assert!(a.destroy(0, &[], now).is_empty());
}

#[test]
fn stale_req_in_timewait_is_rejected() {
    let Pair { mut a, mut b, now } = handshake(timing(3));
    let dreq = one(&a.disconnect(40, now).unwrap());
    b.on_mad(&dreq, now);
    b.disconnect(0, now).unwrap();
    let old = CmMad {
        tid: 7,
        msg: CmMessage::Req(Req {
            local_comm_id: A_ID,
            ..req()
        }),
    };
    let CmMessage::Rej(j) = one(&b.on_mad(&old, now)).msg else {
        panic!()
    };
    assert_eq!(j.reason, RejReason::StaleConn);
}

#[test]
fn lost_dreq_and_lost_drep() {
    let Pair { mut a, mut b, now } = handshake(timing(2));
    let _lost = a.disconnect(40, now).unwrap();
    let dreq = one(&a.on_timer(now + RESP));
    assert_eq!(dreq.tid, 40);
    b.on_mad(&dreq, now + RESP);
    let _lost_drep = b.disconnect(0, now + RESP).unwrap();
    // DREP lost: the DREQ comes again; TIMEWAIT answers with the DREP again.
    let dreq = one(&a.on_timer(now + 2 * RESP));
    let drep = one(&b.on_mad(&dreq, now + 2 * RESP));
    assert!(matches!(drep.msg, CmMessage::Drep(_)));
    assert_eq!(
        reports(&a.on_mad(&drep, now + 2 * RESP)),
        vec![Report::Disconnected { timed_out: false }]
    );
    // Every DREQ lost: DISCONNECTED (timed out) after the retries, then TIMEWAIT.
    let Pair { mut a, now, .. } = handshake(timing(1));
    a.disconnect(40, now).unwrap();
    one(&a.on_timer(now + RESP));
    let acts = a.on_timer(now + 2 * RESP);
    assert_eq!(reports(&acts), vec![Report::Disconnected { timed_out: true }]);
    assert_eq!(a.state(), State::Timewait);
    assert_eq!(
        reports(&a.on_timer(now + 2 * RESP + Duration::from_millis(30))),
        vec![Report::TimewaitExit]
    );
}

#[test]
fn simultaneous_disconnects() {
    let Pair { mut a, mut b, now } = handshake(timing(3));
    let dreq_a = one(&a.disconnect(1, now).unwrap());
    let dreq_b = one(&b.disconnect(2, now).unwrap());
    let acts = a.on_mad(&dreq_b, now);
    let drep_a = one(&acts);
    assert_eq!(reports(&acts), vec![Report::Disconnected { timed_out: false }]);
    let acts = b.on_mad(&dreq_a, now);
    let drep_b = one(&acts);
    assert_eq!(reports(&acts), vec![Report::Disconnected { timed_out: false }]);
    // The crossing DREPs change nothing more: both are in TIMEWAIT already.
    assert!(a.on_mad(&drep_b, now).is_empty());
    assert!(b.on_mad(&drep_a, now).is_empty());
    assert_eq!((a.state(), b.state()), (State::Timewait, State::Timewait));
}

#[test]
fn disconnect_before_rtu_and_mismatched_ids() {
    let now = Instant::now();
    let (mut a, acts) = Conn::active(A_ID, 5, req(), timing(3), now);
    let CmMessage::Req(r) = &one(&acts).msg else { panic!() };
    let mut b = Conn::passive(B_ID, 5, r, timing(3));
    let rep = one(&b.accept(Rep::default(), RESP, 3, now).unwrap());
    a.on_mad(&rep, now);
    a.rtu(b"").unwrap();
    // The RTU is lost and the active side disconnects at once: the DREQ closes REP_SENT.
    let dreq = one(&a.disconnect(8, now).unwrap());
    let mut bad = dreq.clone();
    if let CmMessage::Dreq(d) = &mut bad.msg {
        d.local_comm_id ^= 1;
    }
    assert!(b.on_mad(&bad, now).is_empty());
    assert_eq!(
        reports(&b.on_mad(&dreq, now)),
        vec![Report::Disconnected { timed_out: false }]
    );
    assert_eq!((b.state(), b.deadline()), (State::DreqRcvd, None));
    // A REP for another ID never reaches the active side's logic.
    let mut stray = rep.clone();
    if let CmMessage::Rep(p) = &mut stray.msg {
        p.remote_comm_id = 77;
    }
    assert!(a.on_mad(&stray, now).is_empty());
}

#[test]
fn peer_lost_sends_one_dreq_and_reports_once() {
    let Pair { mut a, mut b, now } = handshake(timing(3));
    assert_eq!(a.local_qpn(), 0x11, "from the REQ");
    assert_eq!(b.local_qpn(), 0, "the REP in the handshake carried QPN 0");
    let acts = a.peer_lost(5, "keepalive unanswered".into(), now);
    let dreq = one(&acts);
    assert!(matches!(dreq.msg, CmMessage::Dreq(_)));
    assert_eq!(
        reports(&acts),
        vec![Report::PeerLost {
            why: "keepalive unanswered".into()
        }]
    );
    assert_eq!(
        (a.state(), a.deadline()),
        (State::Timewait, Some(now + Duration::from_millis(30)))
    );
    // No DREQ resends, no second report; the consumer's disconnect has nothing left to do.
    assert!(a.peer_lost(6, "again".into(), now).is_empty());
    assert!(a.disconnect(7, now).is_err());
    // A peer that could still hear answers with a DREP, which TIMEWAIT ignores.
    let drep = one(&b
        .on_mad(&dreq, now)
        .into_iter()
        .chain(b.disconnect(0, now).unwrap())
        .collect());
    assert!(a.on_mad(&drep, now).is_empty());
    assert_eq!(
        reports(&a.on_timer(now + Duration::from_millis(30))),
        vec![Report::TimewaitExit]
    );
    // Before ESTABLISHED there is no connection to lose.
    let (mut c, _) = Conn::active(A_ID + 1, 8, req(), timing(3), now);
    assert!(c.peer_lost(9, "x".into(), now).is_empty());
    assert_eq!(c.state(), State::ReqSent);
}
