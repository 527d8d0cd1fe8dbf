//! IB timer encodings and the requester's two timers: the ACK (retransmission) timer and the
//! RNR wait. Sans-I/O: the engine reports deadlines and the caller passes `now`.

use std::time::{Duration, Instant};

/// The local ACK timeout for the IB 5-bit exponent `exp`: 4.096 µs × 2^exp;
/// 0 means "infinite" (`None`). Exponents above 31 are treated as 31.
pub fn ib_timeout(exp: u8) -> Option<Duration> {
    if exp == 0 {
        return None;
    }
    Some(Duration::from_nanos(4096u64 << exp.min(31)))
}

/// RNR NAK timer values (IBTA vol. 1, table 45) in units of 10 µs, indexed by the 5-bit code.
const RNR_TIMER_10US: [u32; 32] = [
    65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
    6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The receiver-not-ready wait for an RNR timer code (IBTA table 45): 0 = 655.36 ms,
/// 1 = 0.01 ms, 2 = 0.02 ms, ... 31 = 491.52 ms. Only the low 5 bits of `code` count.
pub fn rnr_timer(code: u8) -> Duration {
    Duration::from_micros(u64::from(RNR_TIMER_10US[usize::from(code & 0x1f)]) * 10)
}

/// The retransmission timer: runs while request packets are unacknowledged.
#[derive(Debug, Clone)]
pub(crate) struct AckTimer {
    timeout: Option<Duration>,
    started: Option<Instant>,
}

impl AckTimer {
    /// A stopped timer firing `timeout` after a start (`None`: never fires).
    pub(crate) fn new(timeout: Option<Duration>) -> AckTimer {
        AckTimer { timeout, started: None }
    }

    /// Changes the timeout (a running timer keeps its start).
    pub(crate) fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    /// Starts the timer unless it runs already.
    pub(crate) fn start_if_stopped(&mut self, now: Instant) {
        if self.started.is_none() {
            self.started = Some(now);
        }
    }

    /// (Re)starts the timer at `now`.
    pub(crate) fn restart(&mut self, now: Instant) {
        self.started = Some(now);
    }

    /// Stops the timer.
    pub(crate) fn stop(&mut self) {
        self.started = None;
    }

    /// When it fires, if running and finite.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let started = self.started?;
        started.checked_add(self.timeout?)
    }

    /// True if it fired by `now`.
    pub(crate) fn expired(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }
}

/// The earlier of two optional instants.
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        assert_eq!(ib_timeout(0), None);
        assert_eq!(ib_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(ib_timeout(14), Some(Duration::from_nanos(67_108_864)));
        assert_eq!(ib_timeout(40), ib_timeout(31));
        assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer(1), Duration::from_micros(10));
        assert_eq!(rnr_timer(5), Duration::from_micros(60));
        assert_eq!(rnr_timer(14), Duration::from_micros(1_280));
        assert_eq!(rnr_timer(31), Duration::from_micros(491_520));
        assert_eq!(rnr_timer(32 + 1), rnr_timer(1));
        for w in RNR_TIMER_10US[1..].windows(2) {
            assert!(w[0] < w[1]);
        }
    }

    #[test]
    fn ack_timer() {
        let t0 = Instant::now();
        let mut t = AckTimer::new(Some(Duration::from_millis(5)));
        assert_eq!(t.deadline(), None);
        t.start_if_stopped(t0);
        t.start_if_stopped(t0 + Duration::from_millis(1));
        assert_eq!(t.deadline(), Some(t0 + Duration::from_millis(5)));
        assert!(!t.expired(t0 + Duration::from_millis(4)));
        assert!(t.expired(t0 + Duration::from_millis(5)));
        t.restart(t0 + Duration::from_millis(3));
        assert_eq!(t.deadline(), Some(t0 + Duration::from_millis(8)));
        t.stop();
        assert!(!t.expired(t0 + Duration::from_secs(9)));
        let mut never = AckTimer::new(None);
        never.restart(t0);
        assert_eq!(never.deadline(), None);
        assert_eq!(earliest(Some(t0), None), Some(t0));
        assert_eq!(earliest(Some(t0 + Duration::from_millis(1)), Some(t0)), Some(t0));
    }
}
