//! Ending an IB CM connection: `rdma_disconnect` (QP to ERR, then DREQ, or the DREP when the
//! peer's DREQ came first) and `rdma_destroy_id` (Linux `cm_destroy_id`).

use super::agent::Agent;
use super::conn::State;
use super::link::{IbHandle, Kind};
use super::qp_setup;
use crate::event::EventType;
use crate::id::CmId;
use crate::state::CmState;
use softrdma_verbs::{bail, Result};

/// `rdma_disconnect` on a RoCE id. Waits (sync ids) for DISCONNECTED when it sent a DREQ.
pub(crate) fn disconnect(id: &CmId) -> Result<()> {
    let (link, qp, state) = {
        let st = id.lock();
        let Some(h) = &st.ib else {
            bail!(Inval, "rdma_disconnect: the id has no connection");
        };
        (h.link.clone(), st.qp.clone(), st.state)
    };
    if !matches!(state, CmState::Connect | CmState::Disconnect) {
        bail!(Inval, "rdma_disconnect: the id is in {state}, not connected");
    }
    if matches!(link.lock().kind, Kind::SidrClient(_) | Kind::SidrServer(_)) {
        bail!(Inval, "rdma_disconnect: UD ids have no connection to disconnect");
    }
    if let Some(q) = &qp {
        qp_setup::to_error(q);
    }
    let agent = Agent::get()?;
    let tid = agent.ids.tid();
    let sent_dreq = link.step(&agent, |ls, now| {
        let Kind::Rc(c) = &mut ls.kind else {
            return (Vec::new(), false);
        };
        let dreq = matches!(c.state(), State::Established | State::RepSent | State::MraRepRcvd);
        // Like the kernel, a disconnect with nothing to send (not connected yet, or already
        // closed) succeeds without effect.
        (c.disconnect(tid, now).unwrap_or_default(), dreq)
    });
    if sent_dreq {
        id.wait_sync(&[EventType::Disconnected])?;
    }
    Ok(())
}

/// Withdraws the id's connection at `rdma_destroy_id` (REJ, DREQ or DREP as its state needs;
/// no more events).
pub(crate) fn destroy(h: IbHandle) {
    match Agent::get() {
        Ok(agent) => h.link.abandon(&agent),
        Err(e) => tracing::warn!("rdma_destroy_id: IB CM: {e}"),
    }
}
