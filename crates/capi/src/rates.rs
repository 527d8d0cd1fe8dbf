//! The static-rate helpers: `ibv_rate_to_mult`, `mult_to_ibv_rate`, `ibv_rate_to_mbps` and
//! `mbps_to_ibv_rate` (`tests/dropin.rs` compares them with Debian's libibverbs).

use std::ffi::c_int;

/// `(enum ibv_rate, multiple of 2.5 Gb/s or 0 if the rate is not one, Mb/s)`.
const RATES: [(c_int, c_int, c_int); 23] = [
    (2, 1, 2_500),        // IBV_RATE_2_5_GBPS
    (5, 2, 5_000),        // IBV_RATE_5_GBPS
    (3, 4, 10_000),       // IBV_RATE_10_GBPS
    (6, 8, 20_000),       // IBV_RATE_20_GBPS
    (4, 12, 30_000),      // IBV_RATE_30_GBPS
    (7, 16, 40_000),      // IBV_RATE_40_GBPS
    (8, 24, 60_000),      // IBV_RATE_60_GBPS
    (9, 32, 80_000),      // IBV_RATE_80_GBPS
    (10, 48, 120_000),    // IBV_RATE_120_GBPS
    (11, 0, 14_062),      // IBV_RATE_14_GBPS (FDR 1x)
    (12, 0, 56_250),      // IBV_RATE_56_GBPS
    (13, 0, 112_500),     // IBV_RATE_112_GBPS
    (14, 0, 168_750),     // IBV_RATE_168_GBPS
    (15, 0, 25_781),      // IBV_RATE_25_GBPS (EDR 1x)
    (16, 0, 103_125),     // IBV_RATE_100_GBPS
    (17, 0, 206_250),     // IBV_RATE_200_GBPS
    (18, 0, 309_375),     // IBV_RATE_300_GBPS
    (19, 11, 28_125),     // IBV_RATE_28_GBPS
    (20, 20, 53_125),     // IBV_RATE_50_GBPS
    (21, 160, 425_000),   // IBV_RATE_400_GBPS
    (22, 240, 637_500),   // IBV_RATE_600_GBPS
    (23, 320, 850_000),   // IBV_RATE_800_GBPS
    (24, 480, 1_275_000), // IBV_RATE_1200_GBPS
];

/// `IBV_RATE_MAX`: the answer for a value that is no rate.
const IBV_RATE_MAX: c_int = 0;

c_fn! {
    /// `int ibv_rate_to_mult(enum ibv_rate rate)`: the multiple of 2.5 Gb/s, or -1.
    fn ibv_rate_to_mult(rate: c_int) -> c_int {
        RATES.iter().find(|r| r.0 == rate && r.1 != 0).map_or(-1, |r| r.1)
    }

    /// `enum ibv_rate mult_to_ibv_rate(int mult)`: IBV_RATE_MAX if `mult` is none.
    fn mult_to_ibv_rate(mult: c_int) -> c_int {
        RATES.iter().find(|r| r.1 == mult && r.1 != 0).map_or(IBV_RATE_MAX, |r| r.0)
    }

    /// `int ibv_rate_to_mbps(enum ibv_rate rate)`: Mb/s, or -1.
    fn ibv_rate_to_mbps(rate: c_int) -> c_int {
        RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
    }

    /// `enum ibv_rate mbps_to_ibv_rate(int mbps)`: IBV_RATE_MAX if `mbps` is none.
    fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
        RATES.iter().find(|r| r.2 == mbps).map_or(IBV_RATE_MAX, |r| r.0)
    }
}
