//! What the machines report becomes rdma_cm events (Linux `cma_ib_handler` /
//! `cma_sidr_rep_handler`, plus librdmacm's QP handling on CONNECT_RESPONSE): the active side
//! moves its QP to RTR/RTS and sends the RTU on a REP; failures move the QP to ERR.

use super::conn::{Actions, Report};
use super::link::{Kind, LinkState};
use super::qp_setup::{self, ah_attr};
use super::sidr::SidrOutcome;
use crate::event::EventType;
use crate::id::IdInner;
use crate::param::{ConnParam, UdParam};
use crate::state::CmState;
use softrdma_wire::ibcm::{RejReason, Rep, SidrStatus};
use std::sync::Arc;
use std::time::Instant;

fn reason_text(reason: RejReason) -> String {
    format!("REJ reason {} ({reason})", reason.as_u16())
}

/// Delivers one report of an RC connection; returns the machine's further actions.
pub(crate) fn deliver(ls: &mut LinkState, r: Report, now: Instant) -> Actions {
    if ls.abandoned {
        return Vec::new();
    }
    let Some(id) = ls.id.upgrade() else {
        return Vec::new();
    };
    let peer = ls.peer;
    match r {
        Report::Rep(rep) => on_rep(ls, &id, &rep, now),
        Report::Established => {
            if id.lock().state == CmState::Connect {
                id.post(EventType::Established, 0, ConnParam::default(), String::new(), None);
            }
            Vec::new()
        }
        Report::Rejected { reason, private_data } => {
            if reason == RejReason::InvalidServiceId && super::active::retry_unclaimed(ls, &id) {
                return Vec::new();
            }
            qp_error(&id);
            let why = format!("connection to {peer} rejected: {}", reason_text(reason));
            tracing::debug!("{why}");
            let param = ConnParam {
                private_data,
                ..ConnParam::default()
            };
            id.post(EventType::Rejected, i32::from(reason.as_u16()), param, why, None);
            Vec::new()
        }
        Report::Unreachable => {
            qp_error(&id);
            let t = ls.timing;
            let why = format!(
                "{peer}: no answer from its IB CM (each try waits {} ms, {} retries{})",
                t.response.as_millis(),
                t.retries,
                t.give_up
                    .map(|g| format!(", setup bounded to {} ms", g.as_millis()))
                    .unwrap_or_default()
            );
            id.post(
                EventType::Unreachable,
                -libc::ETIMEDOUT,
                ConnParam::default(),
                why,
                None,
            );
            Vec::new()
        }
        Report::PeerLost { why } => {
            let why = format!("{peer} stopped answering ({why}); the connection is down");
            tracing::debug!("{why}");
            disconnected(&id, -libc::ETIMEDOUT, why);
            Vec::new()
        }
        Report::Disconnected { timed_out } => {
            if timed_out {
                let why = format!("{peer}: no DREP, disconnected after the DREQ retries");
                disconnected(&id, -libc::ETIMEDOUT, why);
            } else {
                disconnected(&id, 0, String::new());
            }
            Vec::new()
        }
        Report::TimewaitExit => {
            if id.lock().state == CmState::Disconnect {
                id.post(EventType::TimewaitExit, 0, ConnParam::default(), String::new(), None);
            }
            Vec::new()
        }
    }
}

/// DISCONNECTED (once, and only on a connected id) with `status` and `why`.
fn disconnected(id: &Arc<IdInner>, status: i32, why: String) {
    {
        let mut st = id.lock();
        if st.disconnected || st.state != CmState::Connect {
            return;
        }
        st.disconnected = true;
        st.state = CmState::Disconnect;
    }
    // The peer moved its QP to ERR before its DREQ (or stopped answering): nothing posted
    // here can complete any more, so flush it now, as a closed iWARP stream does, instead of
    // leaving receives waiting until the application disconnects.
    qp_error(id);
    id.post(EventType::Disconnected, status, ConnParam::default(), why, None);
}

fn qp_error(id: &Arc<IdInner>) {
    let qp = id.lock().qp.clone();
    if let Some(q) = qp {
        qp_setup::to_error(&q);
    }
}

/// Active side, REP received: the QP goes to RTR and RTS, then the RTU and ESTABLISHED; an id
/// without a QP gets CONNECT_RESPONSE and completes with `establish`.
fn on_rep(ls: &mut LinkState, id: &Arc<IdInner>, rep: &Rep, now: Instant) -> Actions {
    let p = &mut ls.path;
    p.remote_qpn = rep.local_qpn;
    p.remote_psn = rep.starting_psn;
    p.responder_resources = p.responder_resources.min(rep.initiator_depth);
    p.initiator_depth = p.initiator_depth.min(rep.responder_resources);
    p.rnr_retry = rep.rnr_retry_count;
    // The passive side's view, mirrored (as the IB CM reports a REP).
    let param = ConnParam {
        private_data: rep.private_data.to_vec(),
        responder_resources: rep.initiator_depth,
        initiator_depth: rep.responder_resources,
        flow_control: u8::from(rep.end_to_end_flow_control),
        retry_count: 0,
        rnr_retry_count: rep.rnr_retry_count,
        srq: rep.srq,
        qp_num: rep.local_qpn,
    };
    let path = ls.path;
    let Kind::Rc(conn) = &mut ls.kind else {
        return Vec::new();
    };
    let qp = id.lock().qp.clone();
    let Some(qp) = qp else {
        id.post(EventType::ConnectResponse, 0, param, String::new(), None);
        return Vec::new();
    };
    match qp_setup::bring_up_rc(&qp, &path) {
        Ok(()) => {
            let acts = conn.rtu(&[]).unwrap_or_default();
            id.post(EventType::Established, 0, param, String::new(), None);
            acts
        }
        Err(e) => {
            qp_setup::to_error(&qp);
            let acts = conn.reject(RejReason::ConsumerDefined, &[], now).unwrap_or_default();
            let why = format!("connection to {}: QP {} to RTS: {e}", ls.peer, qp.qpn());
            id.post(EventType::ConnectError, -e.errno.raw(), ConnParam::default(), why, None);
            acts
        }
    }
}

/// The end of an active UD id's SIDR exchange: ESTABLISHED with the peer's QPN, Q_Key and
/// address, or UNREACHABLE (SIDR status, -EINVAL for a wrong Q_Key, -ETIMEDOUT).
pub(crate) fn sidr_outcome(ls: &mut LinkState, out: SidrOutcome) {
    if ls.abandoned {
        return;
    }
    let Some(id) = ls.id.upgrade() else { return };
    let peer = ls.peer;
    match out {
        SidrOutcome::Reply(rep) if rep.status == SidrStatus::Success && rep.qkey != ls.qkey => {
            let why = format!("{peer}: SIDR_REP with Q_Key {:#x}, expected {:#x}", rep.qkey, ls.qkey);
            id.post(EventType::Unreachable, -libc::EINVAL, ConnParam::default(), why, None);
        }
        SidrOutcome::Reply(rep) if rep.status == SidrStatus::Success => {
            let ud = UdParam {
                qp_num: rep.qpn,
                qkey: rep.qkey,
                ah_attr: ah_attr(ls.remote, ls.path.sgid_index, ls.path.traffic_class),
            };
            let param = ConnParam {
                private_data: rep.private_data.to_vec(),
                qp_num: rep.qpn,
                ..ConnParam::default()
            };
            id.post_ud(EventType::Established, 0, param, String::new(), None, Some(ud));
        }
        SidrOutcome::Reply(rep) => {
            let why = format!("{peer}: SIDR_REP status {} ({})", rep.status.as_u8(), rep.status);
            let param = ConnParam {
                private_data: rep.private_data.to_vec(),
                ..ConnParam::default()
            };
            id.post(EventType::Unreachable, i32::from(rep.status.as_u8()), param, why, None);
        }
        SidrOutcome::TimedOut => {
            let t = ls.timing;
            let why = format!(
                "{peer}: no SIDR_REP (each try waits {} ms, {} retries{})",
                t.response.as_millis(),
                t.retries,
                t.give_up
                    .map(|g| format!(", setup bounded to {} ms", g.as_millis()))
                    .unwrap_or_default()
            );
            id.post(
                EventType::Unreachable,
                -libc::ETIMEDOUT,
                ConnParam::default(),
                why,
                None,
            );
        }
    }
}
