//! Driver-level counters (per process), for tools, tests and `SOFTRDMA_STATS=1`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters.
#[derive(Debug, Default)]
pub(crate) struct DriverCounters {
    pub(crate) rx_datagrams: AtomicU64,
    pub(crate) tx_datagrams: AtomicU64,
    pub(crate) tx_errors: AtomicU64,
    pub(crate) icrc_errors: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) unknown_qpn: AtomicU64,
    pub(crate) wrong_source: AtomicU64,
    pub(crate) gsi_dropped: AtomicU64,
    pub(crate) unsupported: AtomicU64,
    pub(crate) forwarded_in: AtomicU64,
    pub(crate) forwarded_out: AtomicU64,
}

/// A snapshot of the driver's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// UDP datagrams received (directly or forwarded).
    pub rx_datagrams: u64,
    /// Datagrams sent.
    pub tx_datagrams: u64,
    /// Sends the kernel refused (counted as losses).
    pub tx_errors: u64,
    /// Datagrams dropped for a bad ICRC.
    pub icrc_errors: u64,
    /// Datagrams too short or with an undecodable header.
    pub malformed: u64,
    /// Datagrams for a QP that does not exist (here or in any process on this host).
    pub unknown_qpn: u64,
    /// RC packets from an address other than the QP's peer.
    pub wrong_source: u64,
    /// MADs for QP1 dropped because no CM handles them.
    pub gsi_dropped: u64,
    /// Datagrams of a kind this driver does not handle (IPv6).
    pub unsupported: u64,
    /// Datagrams another process handed to this one.
    pub forwarded_in: u64,
    /// Datagrams this process handed to another.
    pub forwarded_out: u64,
}

impl DriverCounters {
    pub(crate) fn snapshot(&self) -> DriverStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DriverStats {
            rx_datagrams: g(&self.rx_datagrams),
            tx_datagrams: g(&self.tx_datagrams),
            tx_errors: g(&self.tx_errors),
            icrc_errors: g(&self.icrc_errors),
            malformed: g(&self.malformed),
            unknown_qpn: g(&self.unknown_qpn),
            wrong_source: g(&self.wrong_source),
            gsi_dropped: g(&self.gsi_dropped),
            unsupported: g(&self.unsupported),
            forwarded_in: g(&self.forwarded_in),
            forwarded_out: g(&self.forwarded_out),
        }
    }
}
