//! QP1: CM MADs to and from the process's connection manager.
//!
//! MADs travel as UD SEND_ONLY packets to QP 1 with the GSI Q_Key (0x80010000), like every
//! RoCE CM. Arriving ones are routed between the processes of a host by what they carry:
//! - REQ and SIDR_REQ by **service ID**: a listener holds a [`ServiceClaim`], an abstract Unix
//!   socket named after the ID, so any process can find (and forward to) the owner. When
//!   nobody on the host claims the ID, the driver answers itself: REJ reason 8 (invalid
//!   service ID) for a REQ, SIDR_REP status UNSUPPORTED for a SIDR_REQ, as the kernel does.
//! - every other CM message by the **receiver's communication ID**, whose low 16 bits are the
//!   owner's home port ([`comm_id_port`]), forwarded like any other packet for that process.

use crate::driver::endpoint_for_gsi;
use softrdma_verbs::Result;
use std::net::IpAddr;
use std::sync::Arc;

pub use crate::driver::ServiceClaim;

/// The addresses of a received MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GsiPeer {
    /// This host's address the MAD was sent to.
    pub local: IpAddr,
    /// The sender's address.
    pub remote: IpAddr,
}

/// The process's CM: receives every MAD addressed to it.
pub trait MadHandler: Send + Sync {
    /// A 256-byte MAD arrived. Called on the progress thread; must not block.
    fn on_mad(&self, peer: GsiPeer, mad: &[u8]);
}

/// Installs the process's CM (replacing any earlier one) and starts the endpoint.
pub fn set_handler(h: Arc<dyn MadHandler>) -> Result<()> {
    endpoint_for_gsi()?.set_mad_handler(h);
    Ok(())
}

/// Sends a MAD from `local` to QP1 at `remote`. Callable from any thread.
pub fn send_mad(local: IpAddr, remote: IpAddr, mad: &[u8; 256]) -> Result<()> {
    endpoint_for_gsi()?.send_mad(local, remote, mad)
}

/// The value for the low 16 bits of every local communication ID and SIDR request ID: MADs
/// addressed to such an ID reach this process.
pub fn comm_id_port() -> Result<u16> {
    endpoint_for_gsi()?.comm_id_port()
}

/// Makes this process the host's listener for `service_id` (EADDRINUSE if another process
/// already is). Dropping the claim releases it.
pub fn claim_service(service_id: u64) -> Result<ServiceClaim> {
    endpoint_for_gsi()?.claim_service(service_id)
}
