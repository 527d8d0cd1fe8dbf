//! The soft-RoCE UDP driver: one endpoint per process feeds the per-QP engines from the
//! progress thread.
//!
//! # Demultiplexing between processes
//!
//! RoCEv2 packets go to UDP port 4791 and name only a destination QP number, yet several
//! processes on one host (and several devices in one process) each own some QPs. Options:
//!
//! 1. **One UDP port per QP** (derived from the QPN): trivial demux, but the wire no longer
//!    uses 4791, so real RoCE peers and Wireshark stop recognising it.
//! 2. **A per-host daemon** owning 4791 that relays to processes: standard wire, but every
//!    packet takes an extra hop, and the daemon is one more thing to install and keep alive.
//! 3. **`SO_REUSEPORT` on 4791 in every process, plus forwarding** (chosen): every softrdma
//!    process binds `0.0.0.0:4791` in one reuse group; the kernel hands each datagram to one
//!    member by a hash of its addresses and ports. A QPN is `index << 16 | home port`, where
//!    the home port is a UDP port the owning process holds, so a member that receives another
//!    process's packet forwards it to that port on 127.0.0.1, with the original addresses, if an
//!    abstract socket marks the port as a softrdma home port (a packet may name any port). One process per host (the cross-host case) never forwards;
//!    on a shared host a flow is either always direct or always one local hop.
//!
//! Everything is sent from the home socket, unconnected with `IP_PMTUDISC_DO`, so the kernel
//! writes IPv4 ID 0 and DF, which the ICRC covers. Received ICRCs are checked assuming the
//! same (ID 0; DF or not): a peer that sends random IDs (some NICs) would fail the check.

mod endpoint;
mod forward;
mod gso;
mod hold;
mod mads;
mod net;
mod qpn;
mod slot;
mod stats;

pub use mads::ServiceClaim;
pub use qpn::{make_qpn, split_qpn, MULTICAST_QPN, QPS_PER_PORT};
pub use stats::DriverStats;

use endpoint::Endpoint;
use slot::{RoceQp, Slot};
use softrdma_verbs::qp_state::AttrRules;
use softrdma_verbs::{Pd, Qp, QpInitAttr, QpTransport, Result};
use std::sync::Arc;

/// Creates a QP on a soft-RoCE device (`ibv_create_qp` on an `rxe_` device). Its number comes
/// from this process's endpoint, which is started (sockets bound) on first use.
pub fn create_qp(pd: &Pd, init: QpInitAttr) -> Result<Qp> {
    let ep = Endpoint::global()?;
    let (home, qpn) = ep.alloc_qpn()?;
    let slot = Arc::new(Slot::new(qpn, home, &ep));
    let transport: Arc<dyn QpTransport> = Arc::new(RoceQp { slot: slot.clone() });
    match Qp::with_transport(pd, init, AttrRules::Ibta, Some((qpn, transport))) {
        Ok(qp) => {
            slot.bind_qp(qp.inner());
            let counters: std::sync::Weak<dyn softrdma_verbs::stats::CounterSource> = Arc::downgrade(&slot) as _;
            softrdma_verbs::stats::register(counters);
            ep.insert(slot);
            Ok(qp)
        }
        Err(e) => {
            ep.insert(slot);
            ep.remove(qpn);
            Err(e)
        }
    }
}

/// This process's driver counters (zero if no soft-RoCE QP was ever created).
pub fn driver_stats() -> DriverStats {
    Endpoint::existing()
        .map(|ep| ep.counters.snapshot())
        .unwrap_or_default()
}

/// The endpoint, for the QP1 (CM) interface in [`crate::gsi`].
pub(crate) fn endpoint_for_gsi() -> Result<Arc<Endpoint>> {
    Endpoint::global()
}
