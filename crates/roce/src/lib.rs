//! soft-RoCEv2: the IBTA transport (BTH/RETH/AETH/DETH/ImmDt/AtomicETH + ICRC) over UDP.
//!
//! - [`engine`]: sans-I/O state machines, one per QP: RC requester/responder/completer
//!   (PSNs, ACK coalescing, NAK and go-back-N, RNR, retransmission, duplicate detection with
//!   replayed READ/atomic responses) and UD. Driven in unit tests with simulated time.
//! - [`driver`]: the process-wide UDP endpoint that feeds the engines from the progress
//!   thread, allocates QP numbers and demultiplexes packets between processes.
//! - [`gsi`]: QP1, the CM's MADs; [`liveness`]: peer-loss reports to the CM.
#![warn(missing_docs)]

pub mod driver;
pub mod engine;
pub mod gsi;
pub mod liveness;
