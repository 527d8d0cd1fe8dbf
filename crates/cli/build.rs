//! The integration tests' prerequisites as cfgs (see ../capi/test_prereqs.rs).

include!("../capi/test_prereqs.rs");

fn main() {
    test_prerequisites();
}
