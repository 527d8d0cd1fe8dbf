//! Unit tests: real verbs objects on a test device, engines wired back to back through a
//! simulated network (seeded loss, duplication, reordering, delay) with a simulated clock.

mod fuzz;
mod harness;
mod net;
mod plain_host;
mod rc_basic;
mod rc_errors;
mod rc_keepalive;
mod rc_lossy;
mod rc_recovery;
mod ud;
