//! CM timeouts: the 5-bit exponents carried in REQ/MRA fields, and rdma_cm's defaults.

/// CM response timeout exponent rdma_cm puts in REQ/REP (`CMA_CM_RESPONSE_TIMEOUT`, ≈4.3 s).
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;
/// Max CM retries rdma_cm puts in a REQ (`CMA_MAX_CM_RETRIES`).
pub const CMA_MAX_CM_RETRIES: u8 = 15;

/// Converts a CM timeout exponent to milliseconds the way the Linux IB CM does:
/// `1 << max(exp - 8, 0)`, a power-of-two approximation of 4.096 µs · 2^exp
/// (exp 20 → 4096 ms for the exact 4295 ms).
///
/// The wire fields are 5 bits wide; larger exponents are clamped to 31.
pub fn cm_timeout_ms(exp: u8) -> u64 {
    1u64 << exp.min(31).saturating_sub(8)
}

/// How long the active side waits for a REP/MRA after sending a REQ:
/// twice the path's packet lifetime plus the peer's CM response time
/// (both exponents, see [`cm_timeout_ms`]).
pub fn cm_req_timeout_ms(packet_life_time: u8, remote_cm_response_timeout: u8) -> u64 {
    2 * cm_timeout_ms(packet_life_time) + cm_timeout_ms(remote_cm_response_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponents() {
        assert_eq!(cm_timeout_ms(0), 1);
        assert_eq!(cm_timeout_ms(8), 1);
        assert_eq!(cm_timeout_ms(9), 2);
        assert_eq!(cm_timeout_ms(CMA_CM_RESPONSE_TIMEOUT), 4096);
        assert_eq!(cm_timeout_ms(31), 1 << 23);
        assert_eq!(cm_timeout_ms(255), 1 << 23);
        assert_eq!(cm_req_timeout_ms(18, 20), 2 * 1024 + 4096);
        // The approximation stays within a factor of 2 of 4.096 µs · 2^exp from exp 8 on.
        for exp in 8..=31u32 {
            let exact_ms = 4.096e-3 * f64::from(2u32.pow(exp.min(31)));
            let approx = cm_timeout_ms(exp as u8) as f64;
            assert!(approx <= exact_ms && exact_ms < 2.0 * approx + 1.0, "{exp}");
        }
    }
}
