//! Unit tests: engines on `PlainQp` hosts (no device, PD or CQ) wired back to back through a
//! simulated network (seeded loss, duplication, reordering, delay) with a simulated clock.

use crate::engine::{RcEngine, UdEngine};

/// Hands what an RC engine reported to its host, as the driver does after each call.
pub(super) fn deliver(e: &mut RcEngine) {
    e.take_outputs().deliver(&**e.qp());
}

/// [`deliver`] for a UD engine.
pub(super) fn deliver_ud(e: &mut UdEngine) {
    e.take_outputs().deliver(&**e.qp());
}

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
