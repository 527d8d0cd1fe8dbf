//! The soft-iWARP receive path: a responder engine with registered MRs and posted receives,
//! fed a hostile TCP byte stream in input-chosen chunks. Input format, symbolic STags and
//! the invariants are documented in `softrdma_fuzz::rx` (fuzz/src/lib.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    softrdma_fuzz::rx::run_input(data);
});
