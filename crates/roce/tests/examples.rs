//! The crate's examples run as tests: the same code as `cargo run --example`, so an example that
//! stops working (or stops verifying its data) fails `cargo test`.

#[allow(dead_code)] // its `main` is not called here
#[path = "../examples/rc_pingpong.rs"]
mod rc_pingpong;

#[test]
fn rc_pingpong_example_verifies_every_message() {
    let t = rc_pingpong::run(200, 4096).unwrap_or_else(|e| panic!("rc_pingpong: {e}"));
    eprintln!("200 round trips in {t:?}");
}
