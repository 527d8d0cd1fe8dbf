//! The IB CM's only contact with the soft-RoCE driver: its QP1 (`softrdma_roce::gsi`) and its
//! peer-loss reports (`softrdma_roce::liveness`).

use softrdma_roce::gsi::{self, MadHandler, ServiceClaim};
use softrdma_roce::liveness::{self, PeerLostHandler};
use softrdma_verbs::Result;
use softrdma_wire::ibcm::CmMad;
use std::net::IpAddr;
use std::sync::Arc;

/// Sends `m` from `local` to the GSI of `remote`; failures are logged (the CM's retries cover
/// a lost MAD like any other).
pub fn send(local: IpAddr, remote: IpAddr, m: &CmMad) {
    tracing::debug!(%local, %remote, attr = m.msg.attr().name(), tid = m.tid, "IB CM: send");
    if let Err(e) = gsi::send_mad(local, remote, &m.emit()) {
        tracing::warn!(%local, %remote, "IB CM: cannot send {}: {e}", m.msg.attr().name());
    }
}

/// The low 16 bits of this process's communication IDs.
pub fn comm_id_port() -> Result<u16> {
    gsi::comm_id_port()
}

/// Installs the process's MAD handler.
pub fn set_handler(h: Arc<dyn MadHandler>) -> Result<()> {
    gsi::set_handler(h)
}

/// Claims a service ID for this process (EADDRINUSE if another process holds it).
pub fn claim(service_id: u64) -> Result<ServiceClaim> {
    gsi::claim_service(service_id)
}

/// Installs the process's peer-loss handler.
pub fn set_peer_lost_handler(h: Arc<dyn PeerLostHandler>) {
    liveness::set_peer_lost_handler(h);
}
