//! The crate's examples run as tests: the same code as `cargo run --example`, so an example that
//! stops working (or stops verifying its data) fails `cargo test`.

#[allow(dead_code)] // its `main` is not called here
#[path = "../examples/cm_client_server.rs"]
mod cm_client_server;

#[test]
fn cm_client_server_example_over_iwarp() {
    cm_client_server::run(false, 50, 1024).unwrap_or_else(|e| panic!("cm_client_server: {e}"));
}

#[test]
fn cm_client_server_example_over_roce() {
    cm_client_server::run(true, 50, 1024).unwrap_or_else(|e| panic!("cm_client_server: {e}"));
}
