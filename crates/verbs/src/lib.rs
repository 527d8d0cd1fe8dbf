//! softrdma verbs core: the transport-independent verbs objects.
//!
//! Devices come from the host's interfaces (or `SOFTRDMA_CONFIG`), and each opened
//! [`Context`] hands out protection domains, memory regions, completion queues,
//! completion channels, queue pairs and shared receive queues. A transport (soft-iWARP,
//! later soft-RoCE) drives a QP's queues; this crate owns the queues, the QP state machine,
//! the memory-key table and the completion path.

pub mod device;
mod error;

pub use error::{Errno, Error, Result};
