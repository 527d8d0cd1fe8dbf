//! softrdma rsockets: librdmacm's socket API (`rsocket`, `rconnect`, `rsend`, `rpoll`,
//! `riomap`, ...) over softrdma's RC QPs, speaking rdma-core's rsocket protocol, so that a
//! softrdma rsocket talks to a Linux rdma-core rsocket on either transport.
//!
//! - [`wire`]: the protocol's bytes (connection data, messages, buffer descriptors).
//! - [`flow`]: credits, the receive ring and the send window, sans I/O.
//! - [`conn`]: a connection's QP, CQ and buffers, applying what [`flow`] decides.
//! - [`socket`]: the socket state machine over a CM id (connect, accept, shutdown, ...).
//! - [`options`]: `rsetsockopt` / `rgetsockopt`.
//! - [`table`]: the process's sockets by number.
//!
//! Stream sockets only: datagram rsockets (UD QPs) are refused with EPROTONOSUPPORT.

pub mod conn;
mod error;
pub mod flow;
pub mod options;
mod poll;
pub mod socket;
pub mod table;
pub mod wire;

pub use error::{Result, RsError};
pub use socket::RSocket;
