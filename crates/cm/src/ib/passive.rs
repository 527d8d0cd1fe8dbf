//! The passive side's answer: `rdma_accept` (QP to RTR/RTS, then REP; or SIDR_REP with the UD
//! QPN and Q_Key) and `rdma_reject` (REJ consumer defined; SIDR_REP status REJECT).

use super::agent::Agent;
use super::conn::{Actions, State};
use super::link::{Kind, Link, LinkState};
use super::privdata::{self, REJ_USER_LEN, REP_USER_LEN, SIDR_REP_USER_LEN};
use super::qp_setup::{self, RDMA_UDP_QKEY};
use crate::event::EventType;
use crate::id::{resources, CmId};
use crate::param::ConnParam;
use crate::state::CmState;
use softrdma_verbs::device::DeviceInfo;
use softrdma_verbs::{bail, Error, Qp, Result};
use softrdma_wire::ibcm::{
    cm_req_timeout_ms, RejReason, Rep, SidrRep, SidrStatus, REP_PRIVATE_LEN, SIDR_REP_PRIVATE_LEN,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Target ACK delay the REP announces (exponent; ≈134 ms, soft-RoCE acknowledges promptly).
const TARGET_ACK_DELAY: u8 = 15;

fn field<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    out
}

struct Held {
    link: Arc<Link>,
    qp: Option<Qp>,
    dev: DeviceInfo,
    req_param: ConnParam,
    /// RDMA_OPTION_ID_ACK_TIMEOUT set on the id itself.
    ack_timeout: Option<u8>,
}

/// The id's pending request (state CONNECT with an IB CM link).
fn held(id: &CmId, op: &str) -> Result<Held> {
    let st = id.lock();
    let (Some(h), Some(dev)) = (&st.ib, &st.device) else {
        bail!(Inval, "{op}: the id is in {} and holds no connection request", st.state);
    };
    if st.state != CmState::Connect {
        bail!(Inval, "{op}: the id is in {} and holds no connection request", st.state);
    }
    Ok(Held {
        link: h.link.clone(),
        qp: st.qp.clone(),
        dev: dev.clone(),
        req_param: st.req_param.clone().unwrap_or_default(),
        ack_timeout: st.opts.ack_timeout,
    })
}

/// `rdma_accept` on a RoCE id: the passive side of a REQ or SIDR_REQ; or, on the active side
/// after CONNECT_RESPONSE, `rdma_establish`.
pub(crate) fn accept(id: &CmId, param: Option<&ConnParam>) -> Result<()> {
    let h = held(id, "rdma_accept")?;
    let agent = Agent::get()?;
    let active = matches!(&h.link.lock().kind, Kind::Rc(c) if c.is_active());
    if active {
        return super::active::establish(id);
    }
    // rdma_accept(NULL): the request's values, clamped to the device (librdmacm: 7 retries).
    let attr = h.dev.attr();
    let default = ConnParam {
        responder_resources: i32::from(h.req_param.responder_resources).min(attr.max_qp_rd_atom.max(1)) as u8,
        initiator_depth: i32::from(h.req_param.initiator_depth).min(attr.max_qp_init_rd_atom.max(1)) as u8,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    };
    let p = param.unwrap_or(&default);
    let rc = h.link.step(&agent, |ls, now| -> (Actions, Result<bool>) {
        let r = match &ls.kind {
            Kind::Rc(_) => accept_rc(ls, &h, p, now),
            Kind::SidrServer(_) => accept_ud(ls, &h, p, now),
            Kind::SidrClient(_) => Err(Error::inval("rdma_accept: an active UD id has nothing to accept")),
        };
        match r {
            Ok((acts, rc)) => (acts, Ok(rc)),
            Err(e) => (Vec::new(), Err(e)),
        }
    })?;
    if rc {
        id.wait_sync(&[EventType::Established])
    } else {
        Ok(())
    }
}

fn accept_rc(ls: &mut LinkState, h: &Held, p: &ConnParam, now: Instant) -> Result<(Actions, bool)> {
    let Kind::Rc(conn) = &mut ls.kind else { unreachable!() };
    if conn.is_active() || !matches!(conn.state(), State::ReqRcvd | State::MraReqSent) {
        bail!(
            Inval,
            "rdma_accept: the id holds no connection request (it was answered or withdrawn)"
        );
    }
    privdata::check("rdma_accept", "REP", p.private_data.len(), REP_USER_LEN)?;
    let attr = h.dev.attr();
    let rr = resources(p.responder_resources, attr.max_qp_rd_atom, "responder_resources")?.min(255) as u8;
    let depth = resources(p.initiator_depth, attr.max_qp_init_rd_atom, "initiator_depth")?.min(255) as u8;
    let qpn = match &h.qp {
        Some(q) => q.qpn(),
        None if p.qp_num != 0 => p.qp_num,
        None => bail!(
            Inval,
            "rdma_accept: the id has no QP and conn_param.qp_num names none (rdma_create_qp first)"
        ),
    };
    ls.path.responder_resources = rr;
    ls.path.initiator_depth = depth;
    if let Some(t) = h.ack_timeout {
        ls.path.ack_timeout = t;
    }
    if let Some(qp) = &h.qp {
        if let Err(e) = qp_setup::bring_up_rc(qp, &ls.path) {
            // As the kernel: the QP goes to ERR and the peer gets REJ consumer defined.
            qp_setup::to_error(qp);
            let acts = conn.reject(RejReason::ConsumerDefined, &[], now).unwrap_or_default();
            ls.execute(acts, now);
            return Err(e);
        }
    }
    let (every, retries) = match ls.req.as_deref() {
        Some(req) => {
            let plt = req.primary_path.local_ack_timeout.saturating_sub(1);
            let theirs = Duration::from_millis(cm_req_timeout_ms(plt, req.local_cm_response_timeout));
            (
                ls.timing.response.min(theirs),
                ls.timing.retries.min(req.max_cm_retries),
            )
        }
        None => (ls.timing.response, ls.timing.retries),
    };
    let rep = Rep {
        local_qpn: qpn,
        starting_psn: ls.path.local_psn,
        responder_resources: rr,
        initiator_depth: depth,
        target_ack_delay: TARGET_ACK_DELAY,
        end_to_end_flow_control: p.flow_control != 0,
        rnr_retry_count: p.rnr_retry_count & 7,
        srq: p.srq,
        local_ca_guid: ls.guid,
        private_data: field::<REP_PRIVATE_LEN>(&p.private_data),
        ..Rep::default()
    };
    let acts = conn
        .accept(rep, every.max(Duration::from_millis(1)), retries, now)
        .map_err(|e| Error::inval(format!("rdma_accept: {e}")))?;
    Ok((acts, true))
}

fn accept_ud(ls: &mut LinkState, h: &Held, p: &ConnParam, now: Instant) -> Result<(Actions, bool)> {
    let Kind::SidrServer(s) = &mut ls.kind else {
        unreachable!()
    };
    privdata::check("rdma_accept", "SIDR_REP", p.private_data.len(), SIDR_REP_USER_LEN)?;
    let qpn = match &h.qp {
        Some(q) => q.qpn(),
        None if p.qp_num != 0 => p.qp_num,
        None => bail!(
            Inval,
            "rdma_accept: the UD id has no QP and conn_param.qp_num names none (rdma_create_qp first)"
        ),
    };
    let rep = SidrRep {
        status: SidrStatus::Success,
        qpn,
        qkey: RDMA_UDP_QKEY,
        private_data: field::<SIDR_REP_PRIVATE_LEN>(&p.private_data),
        ..SidrRep::default()
    };
    let acts = s
        .answer(rep, now)
        .map_err(|e| Error::inval(format!("rdma_accept: {e}")))?;
    Ok((acts, false))
}

/// `rdma_reject` on a RoCE id: REJ reason 28 with up to 148 bytes, or SIDR_REP REJECT with
/// up to 136.
pub(crate) fn reject(id: &CmId, private_data: &[u8]) -> Result<()> {
    let h = held(id, "rdma_reject")?;
    let agent = Agent::get()?;
    h.link.step(&agent, |ls, now| -> (Actions, Result<()>) {
        let r = match &mut ls.kind {
            Kind::Rc(c) => privdata::check("rdma_reject", "REJ", private_data.len(), REJ_USER_LEN).and_then(|()| {
                c.reject(RejReason::ConsumerDefined, private_data, now)
                    .map_err(|e| Error::inval(format!("rdma_reject: {e}")))
            }),
            Kind::SidrServer(s) => privdata::check("rdma_reject", "SIDR_REP", private_data.len(), SIDR_REP_USER_LEN)
                .and_then(|()| {
                    let rep = SidrRep {
                        status: SidrStatus::Reject,
                        private_data: field::<SIDR_REP_PRIVATE_LEN>(private_data),
                        ..SidrRep::default()
                    };
                    s.answer(rep, now)
                        .map_err(|e| Error::inval(format!("rdma_reject: {e}")))
                }),
            Kind::SidrClient(_) => Err(Error::inval("rdma_reject: the id holds no connection request")),
        };
        match r {
            Ok(acts) => (acts, Ok(())),
            Err(e) => (Vec::new(), Err(e)),
        }
    })?;
    id.lock().state = CmState::Disconnect;
    Ok(())
}
