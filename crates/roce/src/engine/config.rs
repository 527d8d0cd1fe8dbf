//! Per-QP settings the engines are built with, taken from the QP attributes at RTR/RTS.

use super::keepalive::DEFAULT_KEEPALIVE;
use super::timers::ib_timeout;
use softrdma_verbs::QpAttr;
use softrdma_wire::roce::{DEFAULT_PKEY, PSN_MASK, QPN_MASK};
use std::time::Duration;

/// Smallest path MTU (IB MTU 256).
pub const MIN_MTU: usize = 256;
/// Largest path MTU (IB MTU 4096).
pub const MAX_MTU: usize = 4096;
/// Default largest number of unacknowledged request PSNs in flight. The requester starts
/// with [`INITIAL_WINDOW`] and grows toward it while nothing is lost (see `requester`).
/// 2048 (8 MiB at MTU 4096): `ib_write_bw` over rxe_lo +12 % against 512 (interleaved A/B,
/// 9 runs each, 3,658 → 4,110 MB/s mean, no retransmission); a loss halves it.
pub const DEFAULT_WINDOW: u32 = 2048;
/// The window a requester starts with, and the most it sends before its first ACK (rxe's
/// `RXE_MAX_UNACKED_PSNS`, the whole of its window).
pub const INITIAL_WINDOW: u32 = 128;
/// The least a loss halves the window to (unless the configured window is smaller).
pub const MIN_WINDOW: u32 = 16;
/// Largest window accepted: far below 2^23, so PSN comparisons stay unambiguous.
pub const MAX_WINDOW: u32 = 1 << 16;
/// The value of `rnr_retry` that means "retry forever".
pub const RNR_RETRY_INFINITE: u8 = 7;

/// Settings of one RC QP's engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RcConfig {
    /// This QP's number (24 bits).
    pub local_qpn: u32,
    /// The connected peer QP's number (24 bits).
    pub dest_qpn: u32,
    /// First PSN this side sends (`sq_psn`).
    pub sq_psn: u32,
    /// First PSN this side expects (`rq_psn`).
    pub rq_psn: u32,
    /// Path MTU in payload bytes, 256..=4096 (clamped).
    pub mtu: usize,
    /// Local ACK timeout; `None` (IB timeout 0) waits forever.
    pub ack_timeout: Option<Duration>,
    /// Transport retries after an ACK timeout before RETRY_EXC_ERR (0..=7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs before RNR_RETRY_EXC_ERR (0..=6; 7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code this side advertises in its RNR NAKs (IB encoding 0..=31).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READ/atomic requests this side may have (initiator depth).
    pub ord: u32,
    /// Incoming RDMA READ/atomic requests this side serves at once (responder resources).
    pub ird: u32,
    /// Partition key put in (and required of) every packet.
    pub pkey: u16,
    /// Largest number of unacknowledged request packets (PSNs) in flight.
    pub window: u32,
    /// Idle time after which an RTS QP with nothing outstanding probes its peer (see
    /// `keepalive.rs`); `None` never probes.
    pub keepalive: Option<Duration>,
}

impl RcConfig {
    /// The settings for QP `qpn` from its attributes (after RTR, or RTS for the send side)
    /// and the path MTU in bytes (`ibv_mtu_to_num(attr.path_mtu)`, limited by the link).
    pub fn from_qp_attr(qpn: u32, attr: &QpAttr, mtu_bytes: usize) -> RcConfig {
        RcConfig {
            local_qpn: qpn & QPN_MASK,
            dest_qpn: attr.dest_qp_num & QPN_MASK,
            sq_psn: attr.sq_psn & PSN_MASK,
            rq_psn: attr.rq_psn & PSN_MASK,
            mtu: mtu_bytes.clamp(MIN_MTU, MAX_MTU),
            ack_timeout: ib_timeout(attr.timeout),
            retry_cnt: attr.retry_cnt.min(7),
            rnr_retry: attr.rnr_retry.min(RNR_RETRY_INFINITE),
            min_rnr_timer: attr.min_rnr_timer & 0x1f,
            ord: u32::from(attr.max_rd_atomic),
            ird: u32::from(attr.max_dest_rd_atomic),
            // softrdma devices have one P_Key, the default, at index 0.
            pkey: DEFAULT_PKEY,
            window: DEFAULT_WINDOW,
            keepalive: Some(DEFAULT_KEEPALIVE),
        }
    }

    /// The same settings with every field forced into its valid range.
    pub(crate) fn sanitized(mut self) -> RcConfig {
        self.local_qpn &= QPN_MASK;
        self.dest_qpn &= QPN_MASK;
        self.sq_psn &= PSN_MASK;
        self.rq_psn &= PSN_MASK;
        self.mtu = self.mtu.clamp(MIN_MTU, MAX_MTU);
        self.retry_cnt = self.retry_cnt.min(7);
        self.rnr_retry = self.rnr_retry.min(RNR_RETRY_INFINITE);
        self.min_rnr_timer &= 0x1f;
        self.window = self.window.clamp(1, MAX_WINDOW);
        self
    }
}

/// Settings of one UD QP's engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdConfig {
    /// This QP's number (24 bits).
    pub local_qpn: u32,
    /// The QP's Q_Key: incoming datagrams must carry it; WRs may ask to send it.
    pub qkey: u32,
    /// Partition key put in (and required of) every packet.
    pub pkey: u16,
    /// Path MTU in payload bytes: the largest datagram payload (clamped to 256..=4096).
    pub mtu: usize,
}

/// True if two P_Keys match (IBTA 10.9.3): equal low 15 bits, and not both limited members.
pub(crate) fn pkey_matches(a: u16, b: u16) -> bool {
    (a & 0x7fff) == (b & 0x7fff) && (a | b) & 0x8000 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_attr_and_sanitize() {
        let attr = QpAttr {
            dest_qp_num: 0x0123_4567,
            sq_psn: 0x0fff_fffe,
            rq_psn: 5,
            timeout: 14,
            retry_cnt: 9,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 8,
            ..QpAttr::default()
        };
        let c = RcConfig::from_qp_attr(0x0100_0011, &attr, 100_000);
        assert_eq!((c.local_qpn, c.dest_qpn), (0x11, 0x23_4567));
        assert_eq!((c.sq_psn, c.rq_psn), (0xff_fffe, 5));
        assert_eq!(c.mtu, MAX_MTU);
        assert_eq!(c.ack_timeout, Some(Duration::from_nanos(4096 << 14)));
        assert_eq!((c.retry_cnt, c.rnr_retry, c.min_rnr_timer), (7, 7, 12));
        assert_eq!((c.ord, c.ird, c.pkey, c.window), (4, 8, DEFAULT_PKEY, DEFAULT_WINDOW));
        assert_eq!(c.keepalive, Some(DEFAULT_KEEPALIVE));
        let s = RcConfig {
            mtu: 1,
            window: 0,
            rnr_retry: 200,
            ..c
        }
        .sanitized();
        assert_eq!((s.mtu, s.window, s.rnr_retry), (MIN_MTU, 1, 7));
    }

    #[test]
    fn pkeys() {
        assert!(pkey_matches(0xffff, 0xffff));
        assert!(pkey_matches(0x7fff, 0xffff));
        assert!(!pkey_matches(0x7fff, 0x7fff));
        assert!(!pkey_matches(0xffff, 0x8001));
    }
}
