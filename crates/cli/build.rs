//! The integration tests' prerequisites as cfgs (test_prereqs.rs: a symlink to ../capi/test_prereqs.rs,
//! so that `cargo package` ships a copy).

include!("test_prereqs.rs");

fn main() {
    test_prerequisites();
}
