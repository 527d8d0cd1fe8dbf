//! softrdma's RDMA connection manager: librdmacm semantics as a Rust API, over the soft-iWARP
//! device, with the loopback contract of ../shared/LOOPBACK.md.
//!
//! - [`EventChannel`] and [`CmEvent`]: `rdma_event_channel`, `rdma_get_cm_event`, `rdma_ack_cm_event`.
//! - [`CmId`]: `rdma_cm_id` and its calls; without a channel an id is synchronous.
//! - [`addr`]: what an address means and which device serves it (R1–R6, R11, R12).

pub mod addr;
mod devices;
mod event;
mod id;
mod options;
mod param;
mod state;

pub use addr::advertised_addresses;
pub use event::{CmEvent, EventChannel, EventType};
pub use id::{CmId, MAX_BACKLOG};
pub use options::{CmOption, Options};
pub use param::ConnParam;
pub use state::{CmState, PortSpace};

/// Largest private data on iWARP connections through the CM (the ucma ABI limit, as Linux).
pub const MAX_PRIVATE_DATA: usize = 256;
