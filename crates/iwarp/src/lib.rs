//! soft-iWARP: RDMAP (RFC 5040) over DDP (RFC 5041) over MPA (RFC 5044, RFC 6581) over kernel TCP.
//!
//! - [`handshake`]: the MPA connection setup, sans-I/O.
//! - [`engine`]: the per-QP protocol engine, sans-I/O.
//! - [`driver`]: the thin socket layer on the process's progress thread, and the
//!   transport-level `listen` / `connect` / `accept` / `reject` API.

pub mod driver;
pub mod engine;
pub mod handshake;

pub use driver::{
    connect, connect_blocking, connect_socket, ConnEvent, ConnHandle, ConnRequest, ConnectParams, EventSink, Listener,
};

pub use handshake::MAX_PRIVATE_DATA;
