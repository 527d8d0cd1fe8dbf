//! softrdma verbs core: the transport-independent verbs objects.
//!
//! Devices come from the host's interfaces (or `SOFTRDMA_CONFIG`), and each opened
//! [`Context`] hands out protection domains, memory regions, completion queues,
//! completion channels, queue pairs and shared receive queues. A transport (soft-iWARP,
//! later soft-RoCE) drives a QP's queues through the [`QpDriver`] seam; this crate owns the
//! queues, the QP state machine, the memory-key table and the completion path.

pub mod ah;
pub mod async_event;
pub mod caller_step;
pub mod channel;
pub mod context;
pub mod cq;
pub mod device;
mod error;
pub mod fork;
pub mod fork_gate;
pub mod logging;
pub mod memory;
pub mod mr;
pub mod mw;
pub mod pd;
pub mod port_watch;
pub mod progress;
pub mod qp;
pub mod qp_host;
pub mod qp_state;
pub mod quota;
pub mod settings;
pub mod srq;
pub mod stats;
pub mod wr;

pub use ah::Ah;
pub use async_event::{AsyncElement, AsyncEvent, AsyncEventKind, AsyncEvents};
pub use channel::CompChannel;
pub use context::Context;
pub use cq::Cq;
pub use error::{Errno, Error, Result};
pub use mr::Mr;
pub use pd::Pd;
pub use qp::{AhAttr, Qp, QpAttr, QpCap, QpDriver, QpInitAttr, QpTransport};
pub use qp_host::QpHost;
pub use qp_state::{QpState, QpType};
pub use srq::{Srq, SrqAttr};
pub use wr::{Access, RecvWr, SendFlags, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion, WrOpcode};
