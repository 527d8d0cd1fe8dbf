//! The soft-RoCE receive path: an RC engine (responder, and requester with work in flight) and
//! a UD engine with registered MRs and posted receives, fed a hostile sequence of RoCE
//! datagrams with simulated time. Input format, symbolic QPNs and keys and the invariants are
//! documented in `softrdma_fuzz::roce` (fuzz/src/roce.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    softrdma_fuzz::roce::run_input(data);
});
