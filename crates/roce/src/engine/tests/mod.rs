//! Unit tests: engines on `PlainQp` hosts (no device, PD or CQ) wired back to back through a
//! simulated network (seeded loss, duplication, reordering, delay) with a simulated clock.

mod app_view;
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
