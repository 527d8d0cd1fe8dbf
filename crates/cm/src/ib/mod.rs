//! The rdma_cm over soft-RoCE: IB CM MADs (REQ/REP/RTU/REJ/MRA/DREQ/DREP, SIDR_REQ/SIDR_REP)
//! on QP1, with rdma_cm's 36-byte CMA header, as the Linux IB CM and rdma_cm do.
//!
//! - [`conn`], [`sidr`]: the per-connection machines, sans I/O (unit-tested with simulated
//!   time); [`timing`]: their timers and retries.
//! - [`agent`]: the process's CM (a source of the progress thread, no thread of its own),
//!   fed by the driver's MAD handler;
//!   [`link`]: one exchange bound to its id; [`report`]: machine reports to CM events.
//! - [`listen`] (REQ → CONNECT_REQUEST), [`active`] (connect, establish), [`passive`]
//!   (accept, reject), [`close`] (disconnect, destroy): the rdma_cm calls on RoCE ids.
//! - [`privdata`]: private-data limits and the CMA header; [`qp_setup`]: the QP attributes
//!   the CM applies; [`ids`]: communication IDs, TIDs, PSNs; [`mad_io`]: the driver.
//! - [`mcast`]: `rdma_join_multicast` / `rdma_leave_multicast` (no SA: joins complete at once).

pub(crate) mod active;
pub(crate) mod agent;
pub(crate) mod close;
pub(crate) mod conn;
pub(crate) mod ids;
pub(crate) mod link;
pub(crate) mod listen;
pub(crate) mod mad_io;
pub(crate) mod mcast;
pub(crate) mod passive;
pub(crate) mod privdata;
pub(crate) mod qp_setup;
pub(crate) mod report;
pub(crate) mod sidr;
pub(crate) mod timing;

pub(crate) use link::IbHandle;
pub(crate) use listen::ListenGuard;

use crate::state::PortSpace;
use softrdma_verbs::{bail, Qp, QpType, Result};
use softrdma_wire::ibcm::PortSpace as WirePs;

/// The service-ID port space of an rdma_cm port space.
pub(crate) fn wire_ps(ps: PortSpace) -> Result<WirePs> {
    Ok(match ps {
        PortSpace::Tcp => WirePs::Tcp,
        PortSpace::Udp => WirePs::Udp,
        PortSpace::Ib => WirePs::Ib,
        PortSpace::Ipoib => bail!(Inval, "RDMA_PS_IPOIB is not supported"),
    })
}

/// True when an id connects with SIDR (UD) rather than REQ/REP (RC): RDMA_PS_UDP, or
/// RDMA_PS_IB with a UD QP.
pub(crate) fn is_ud(ps: PortSpace, qp: Option<&Qp>) -> bool {
    ps == PortSpace::Udp || (ps == PortSpace::Ib && qp.is_some_and(|q| q.inner().qp_type == QpType::Ud))
}
