//! How long the IB CM waits and how often it retries: rdma_cm's defaults, the environment
//! (`SOFTRDMA_CM_TIMEOUT_MS`, `SOFTRDMA_CM_RETRIES`) and per-id options.

use softrdma_wire::ibcm::{cm_req_timeout_ms, cm_timeout_ms, CMA_CM_RESPONSE_TIMEOUT, CMA_MAX_CM_RETRIES};
use std::time::Duration;

/// Environment variable: the wait for an answer to each REQ, REP, DREQ or SIDR_REQ, in ms.
pub const TIMEOUT_ENV: &str = softrdma_verbs::settings::CM_TIMEOUT_MS.name;
/// Environment variable: how often a REQ, REP, DREQ or SIDR_REQ is sent again (0..=15).
pub const RETRIES_ENV: &str = softrdma_verbs::settings::CM_RETRIES.name;

/// Packet lifetime exponent rdma_cm uses on RoCE (`CMA_IBOE_PACKET_LIFETIME`, ≈268 ms).
pub const ROCE_PACKET_LIFETIME: u8 = 16;

/// The IB CM's timers for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Wait for the answer to each try (REP/MRA after a REQ, RTU after a REP, DREP after a DREQ).
    pub response: Duration,
    /// Tries after the first one.
    pub retries: u8,
    /// How long a closed connection's IDs stay reserved (TIMEWAIT).
    pub timewait: Duration,
    /// Bound on the whole connection setup on the active side (REQ to REP, SIDR_REQ to SIDR_REP).
    pub give_up: Option<Duration>,
}

impl Timing {
    /// rdma_cm's values on RoCE: 2 · packet lifetime + CM response timeout 20 (4.6 s) per try,
    /// 15 retries, TIMEWAIT of one ACK timeout (packet lifetime + 1, 512 ms).
    #[cfg(test)]
    pub fn kernel() -> Timing {
        Timing::kernel_with_plt(ROCE_PACKET_LIFETIME)
    }

    /// [`Timing::kernel`] for packet lifetime exponent `plt` (rdma_cm uses the ACK timeout
    /// minus one when RDMA_OPTION_ID_ACK_TIMEOUT is set).
    pub fn kernel_with_plt(plt: u8) -> Timing {
        Timing {
            response: Duration::from_millis(cm_req_timeout_ms(plt, CMA_CM_RESPONSE_TIMEOUT)),
            retries: CMA_MAX_CM_RETRIES,
            timewait: Duration::from_millis(cm_timeout_ms(plt.saturating_add(1))),
            give_up: None,
        }
    }

    /// The timings of an id: rdma_cm's (with the packet lifetime its ACK timeout implies),
    /// then `SOFTRDMA_CM_TIMEOUT_MS` / `SOFTRDMA_CM_RETRIES` (read once per process), then the
    /// id's own options. A shorter response timeout also shortens TIMEWAIT.
    pub fn for_id(ack_timeout: Option<u8>, response: Option<Duration>, retries: Option<u8>) -> Timing {
        static ENV: std::sync::OnceLock<(Option<Duration>, Option<u64>)> = std::sync::OnceLock::new();
        let (env_response, env_retries) = *ENV.get_or_init(|| {
            use softrdma_verbs::settings::{CM_RETRIES, CM_TIMEOUT_MS};
            (
                CM_TIMEOUT_MS.parse::<u64>().map(Duration::from_millis),
                CM_RETRIES.parse::<u64>(),
            )
        });
        let plt = ack_timeout.map_or(ROCE_PACKET_LIFETIME, |t| t.saturating_sub(1));
        Timing::kernel_with_plt(plt)
            .with(env_response, env_retries)
            .with(response, retries.map(u64::from))
    }

    /// These timings with a response timeout and retry count, where given.
    pub fn with(mut self, response: Option<Duration>, retries: Option<u64>) -> Timing {
        if let Some(r) = response {
            self.response = r.max(Duration::from_millis(1));
            self.timewait = self.timewait.min(self.response);
        }
        if let Some(n) = retries {
            self.retries = n.min(15) as u8;
        }
        self
    }

    /// The CM timeout exponent (5 bits) announcing `response` to the peer: the smallest one
    /// whose [`cm_timeout_ms`] covers it, at most rdma_cm's 20.
    pub fn response_exponent(&self) -> u8 {
        exponent_for(self.response).min(CMA_CM_RESPONSE_TIMEOUT)
    }
}

/// The smallest CM timeout exponent (8..=31) whose [`cm_timeout_ms`] is at least `d`.
pub fn exponent_for(d: Duration) -> u8 {
    let ms = d.as_millis().min(u128::from(u64::MAX)) as u64;
    (8..=31u8).find(|&e| cm_timeout_ms(e) >= ms).unwrap_or(31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_defaults() {
        let t = Timing::kernel();
        assert_eq!(t.response, Duration::from_millis(4096 + 2 * 256));
        assert_eq!(t.retries, 15);
        assert_eq!(t.timewait, Duration::from_millis(512));
        assert_eq!(t.response_exponent(), 20);
        // RDMA_OPTION_ID_ACK_TIMEOUT 14: packet lifetime 13 (32 ms).
        let a = Timing::kernel_with_plt(13);
        assert_eq!(a.response, Duration::from_millis(4096 + 2 * 32));
        assert_eq!(a.timewait, Duration::from_millis(64));
        let o = Timing::for_id(Some(14), Some(Duration::from_millis(50)), Some(2));
        assert_eq!(
            (o.response, o.retries, o.timewait),
            (Duration::from_millis(50), 2, Duration::from_millis(50))
        );
    }

    #[test]
    fn overrides_and_exponents() {
        let t = Timing::kernel().with(Some(Duration::from_millis(200)), Some(99));
        assert_eq!(t.response, Duration::from_millis(200));
        assert_eq!(t.retries, 15);
        assert_eq!(t.timewait, Duration::from_millis(200));
        assert_eq!(t.response_exponent(), 16);
        assert_eq!(exponent_for(Duration::ZERO), 8);
        assert_eq!(exponent_for(Duration::from_millis(1)), 8);
        assert_eq!(exponent_for(Duration::from_millis(3)), 10);
        assert_eq!(exponent_for(Duration::from_secs(1 << 30)), 31);
        let z = Timing::kernel().with(Some(Duration::ZERO), Some(0));
        assert_eq!((z.response, z.retries), (Duration::from_millis(1), 0));
    }
}
