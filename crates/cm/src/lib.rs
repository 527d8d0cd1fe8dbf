//! softrdma's RDMA connection manager: librdmacm semantics as a Rust API, over the soft-iWARP
//! device (MPA over TCP) and the soft-RoCE device (IB CM MADs on QP1, as the Linux IB CM), with
//! the loopback contract of ../shared/LOOPBACK.md.
//!
//! - [`EventChannel`] and [`CmEvent`]: `rdma_event_channel`, `rdma_get_cm_event`, `rdma_ack_cm_event`.
//! - [`CmId`]: `rdma_cm_id` and its calls; without a channel an id is synchronous.
//! - [`addr`]: what an address means and which device serves it (R1–R6, R11, R12).
//!
//! An id whose device is an `rxe_` one (chosen by bind/resolve from the address; restrict the
//! choice with [`CmOption::Transport`] or `SOFTRDMA_TRANSPORTS`) connects with IB CM MADs:
//! REQ/REP/RTU with the 36-byte CMA header, REJ (REJECTED status = reason: 8 nothing listens,
//! 28 `reject`), DREQ/DREP then TIMEWAIT_EXIT, and SIDR for [`PortSpace::Udp`] (ESTABLISHED
//! carries [`CmEvent::ud`]). The CM moves the id's QP through INIT/RTR/RTS itself; an id
//! without a QP gets CONNECT_RESPONSE and finishes with [`CmId::establish`]. A listener hears
//! both transports when devices of both serve its address. UD ids join IPv4 multicast groups
//! with [`CmId::join_multicast`] (no SA: MULTICAST_JOIN comes at once, as the kernel does on
//! RoCE).

pub mod addr;
mod devices;
mod event;
mod ib;
mod id;
mod options;
mod param;
mod ports;
mod state;

pub use addr::advertised_addresses;
pub use event::{CmEvent, EventChannel, EventType};
pub use id::{CmId, MAX_BACKLOG};
pub use options::{CmOption, Options};
pub use param::{ConnParam, UdParam};
pub use state::{CmState, PortSpace};

/// Largest private data on iWARP connections through the CM (the ucma ABI limit, as Linux).
pub const MAX_PRIVATE_DATA: usize = 256;

/// Private-data limits on RoCE ids (the IB CM fields, as Linux): `rdma_connect` 56 bytes (REQ,
/// after the 36-byte CMA header; 180 for UD ids, SIDR_REQ), `rdma_accept` 196 (REP; 136 for
/// UD, SIDR_REP), `rdma_reject` 148 (REJ; 136 for UD). Events report the whole field.
pub mod roce_limits {
    pub use crate::ib::privdata::{
        REJ_USER_LEN as REJECT, REP_USER_LEN as ACCEPT, REQ_USER_LEN as CONNECT, SIDR_REP_USER_LEN as UD_ACCEPT,
        SIDR_REQ_USER_LEN as UD_CONNECT,
    };
}

/// The QPN multicast sends go to (`param.ud.qp_num` of MULTICAST_JOIN, 0xFFFFFF).
pub use ib::mcast::MULTICAST_QPN;
/// Waits (at most `limit`) until the IB CM MADs this process sent so far have left it; true
/// once they have (or when the process never used the RoCE CM). The soft-RoCE driver hands
/// MADs for this host to its progress thread, so a DREQ or DREP sent just before the process
/// exits (`rdma_destroy_id` of a connected id, `rdma_disconnect` after DISCONNECTED) would be
/// lost with it and the peer would wait for its DREQ retries: call this before exiting (the
/// drop-in library does, from its destructor).
pub fn flush_mads(limit: std::time::Duration) -> bool {
    ib::agent::Agent::existing().is_none_or(|a| a.flush(limit))
}

/// Starts this process's IB CM, the connection manager of RoCE ids (a source of the progress
/// thread that lives as long as the process, like the soft-RoCE endpoint's sockets). The first
/// RoCE `rdma_listen`, `rdma_connect` or `rdma_accept` starts it anyway; a leak check that
/// takes a baseline of the process's resources calls this before it.
pub fn start_ib_cm() -> softrdma_verbs::Result<()> {
    ib::agent::Agent::get().map(drop)
}

/// Q_Key of RDMA_PS_UDP ids (`RDMA_UDP_QKEY`, 0x01234567): SIDR_REP carries it.
pub use ib::qp_setup::RDMA_UDP_QKEY;
/// Environment variables of the RoCE connection manager: `SOFTRDMA_CM_TIMEOUT_MS` (wait for each
/// answer to a REQ, REP, DREQ or SIDR_REQ) and `SOFTRDMA_CM_RETRIES` (sends after the first).
pub use ib::timing::{RETRIES_ENV as CM_RETRIES_ENV, TIMEOUT_ENV as CM_TIMEOUT_ENV};
