//! Peer loss: an RC QP whose peer stopped answering (transport retries or keepalive probes ran
//! out, see `engine/keepalive.rs`) is reported to the connection manager, which ends the
//! connection as if the peer's DREQ had come: a dead process cannot send one, though its
//! kernel would on a real fabric.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};

/// Receives peer-loss reports (the process's CM).
pub trait PeerLostHandler: Send + Sync {
    /// QP `qpn`'s peer at `peer` stopped answering; `why` says how it was found. The QP is in
    /// ERR with its work flushed. Called on the progress thread; must not block.
    fn on_peer_lost(&self, qpn: u32, peer: IpAddr, why: &str);
}

/// The handler of each fork generation (a forked child's CM installs its own).
static HANDLER: softrdma_verbs::fork::PerProcess<RwLock<Option<Arc<dyn PeerLostHandler>>>> =
    softrdma_verbs::fork::PerProcess::new();

fn handler() -> &'static RwLock<Option<Arc<dyn PeerLostHandler>>> {
    HANDLER.get_or_init(|| RwLock::new(None))
}

/// Installs the process's peer-loss handler (replacing any earlier one).
pub fn set_peer_lost_handler(h: Arc<dyn PeerLostHandler>) {
    *handler().write().unwrap_or_else(|p| p.into_inner()) = Some(h);
}

/// Tells the handler, if there is one.
pub(crate) fn report(qpn: u32, peer: IpAddr, why: &str) {
    let h = handler().read().unwrap_or_else(|p| p.into_inner()).clone();
    match h {
        Some(h) => h.on_peer_lost(qpn, peer, why),
        None => tracing::debug!(qpn, %peer, "soft-RoCE: peer lost ({why}); no connection manager to tell"),
    }
}
