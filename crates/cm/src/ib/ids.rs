//! Numbers the IB CM makes up: communication / SIDR request IDs (which say which process owns
//! them), transaction IDs and starting PSNs (random 24-bit, as rdma_cm's `seq_num`).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

/// A pseudo-random 64-bit value (SipHash with the process's random keys over a counter and
/// the time); not for secrets, only so numbers differ between connections and processes.
pub fn random_u64() -> u64 {
    static STATE: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    static N: AtomicU32 = AtomicU32::new(0);
    let mut h = STATE.get_or_init(RandomState::new).build_hasher();
    h.write_u32(N.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// A random starting PSN (24 bits).
pub fn random_psn() -> u32 {
    (random_u64() & 0xff_ffff) as u32
}

/// Communication IDs `counter << 16 | port`: `port` is the driver's [`comm_id_port`] (MADs for
/// the ID reach this process), the counter is never 0.
///
/// [`comm_id_port`]: softrdma_roce::gsi::comm_id_port
#[derive(Debug)]
pub struct IdAlloc {
    port: u16,
    next: AtomicU32,
    tid_hi: u32,
    tid_next: AtomicU32,
}

impl IdAlloc {
    /// IDs for home port `port`, starting at a random counter.
    pub fn new(port: u16) -> IdAlloc {
        let r = random_u64();
        IdAlloc {
            port,
            next: AtomicU32::new(r as u32),
            tid_hi: (r >> 32) as u32,
            tid_next: AtomicU32::new(1),
        }
    }

    /// The next ID for which `in_use` is false.
    pub fn comm_id(&self, in_use: impl Fn(u32) -> bool) -> u32 {
        loop {
            let hi = (self.next.fetch_add(1, Ordering::Relaxed) & 0xffff) as u16;
            if hi == 0 {
                continue;
            }
            let id = (u32::from(hi) << 16) | u32::from(self.port);
            if !in_use(id) {
                return id;
            }
        }
    }

    /// A fresh transaction ID.
    pub fn tid(&self) -> u64 {
        (u64::from(self.tid_hi) << 32) | u64::from(self.tid_next.fetch_add(1, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_the_port_and_skip_used_ones() {
        let a = IdAlloc::new(0xc351);
        let first = a.comm_id(|_| false);
        assert_eq!(first & 0xffff, 0xc351);
        assert_ne!(first >> 16, 0);
        let next = a.comm_id(|id| id == ((first & 0xffff_0000).wrapping_add(0x1_0000) | 0xc351));
        assert_eq!(next & 0xffff, 0xc351);
        assert_ne!(next, first);
        for _ in 0..70_000 {
            assert_ne!(a.comm_id(|_| false) >> 16, 0);
        }
        assert_ne!(a.tid(), a.tid());
        assert!(random_psn() <= 0xff_ffff);
    }
}
