//! IB CM MADs (0..300 bytes) through `CmMad::parse` and the IB CM's connection and SIDR
//! machines (the `softrdma-cm` sources, compiled into the harness). Input format and
//! invariants are documented in `softrdma_fuzz::ibcm` (fuzz/src/ibcm/mod.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    softrdma_fuzz::ibcm::run_input(data);
});
