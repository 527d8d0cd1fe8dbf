//! `rdma_set_option` options, plus softrdma's own timeouts.

use std::time::Duration;

/// An option for [`crate::CmId::set_option`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmOption {
    /// RDMA_OPTION_ID_TOS: IP type of service.
    Tos(u8),
    /// RDMA_OPTION_ID_REUSEADDR.
    ReuseAddr(bool),
    /// RDMA_OPTION_ID_AFONLY (IPv6 ids only see IPv6).
    AfOnly(bool),
    /// RDMA_OPTION_ID_ACK_TIMEOUT (4.096 µs · 2^t); RC ids only, before connect/accept.
    AckTimeout(u8),
    /// softrdma: bound on connection setup (TCP connect + MPA exchange). Default 10 s.
    ConnectTimeout(Duration),
    /// softrdma: bound on address resolution. Default: the `timeout_ms` of `resolve_addr`.
    ResolveTimeout(Duration),
}

/// Current option values of an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// TOS, if set.
    pub tos: Option<u8>,
    /// REUSEADDR.
    pub reuse_addr: bool,
    /// AFONLY, if set.
    pub af_only: Option<bool>,
    /// ACK timeout, if set.
    pub ack_timeout: Option<u8>,
    /// Connection setup bound.
    pub connect_timeout: Duration,
    /// Address resolution bound, if set.
    pub resolve_timeout: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tos: None,
            reuse_addr: false,
            af_only: None,
            ack_timeout: None,
            connect_timeout: softrdma_iwarp::driver::DEFAULT_TIMEOUT,
            resolve_timeout: None,
        }
    }
}
