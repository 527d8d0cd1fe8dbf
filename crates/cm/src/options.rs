//! `rdma_set_option` options, plus softrdma's own timeouts.

use softrdma_verbs::device::TransportKind;
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
    /// softrdma: bound on connection setup (TCP connect + MPA exchange on iWARP; REQ to REP,
    /// or SIDR_REQ to SIDR_REP, on RoCE). Default 10 s.
    ConnectTimeout(Duration),
    /// softrdma: bound on address resolution. Default: the `timeout_ms` of `resolve_addr`.
    ResolveTimeout(Duration),
    /// softrdma: only devices of this transport serve the id (bind, resolve, listen); `None`
    /// (the default) means every device, in device-list order. Set it before bind/resolve.
    Transport(Option<TransportKind>),
    /// softrdma, RoCE: the IB CM's wait for each answer (REP after a REQ, RTU after a REP,
    /// DREP after a DREQ, SIDR_REP). Default: `SOFTRDMA_CM_TIMEOUT_MS`, else 4.6 s as rdma_cm.
    CmResponseTimeout(Duration),
    /// softrdma, RoCE: how often the IB CM sends a REQ, REP, DREQ or SIDR_REQ again (0..=15).
    /// Default: `SOFTRDMA_CM_RETRIES`, else 15 as rdma_cm.
    CmRetries(u8),
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
    /// The transport the id is restricted to, if any.
    pub transport: Option<TransportKind>,
    /// IB CM response timeout, if set.
    pub cm_response_timeout: Option<Duration>,
    /// IB CM retries, if set.
    pub cm_retries: Option<u8>,
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
            transport: None,
            cm_response_timeout: None,
            cm_retries: None,
        }
    }
}
