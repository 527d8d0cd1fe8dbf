//! A connection's lock. The engine reports completions, flushes and async events as values
//! (`Engine::take_outputs`); whoever held the lock delivers them to the QP when it lets go,
//! so that every path through the engine (the progress thread, a waiting caller, a post, a
//! close) hands them over in the order they were made, before another thread gets in.

use super::conn::{ConnState, Phase};
use crate::engine::Engine;
use std::ops::{Deref, DerefMut};
use std::sync::MutexGuard;

/// The locked state of a connection; delivers the engine's reports when dropped.
pub(crate) struct ConnGuard<'a>(pub(super) MutexGuard<'a, ConnState>);

impl Deref for ConnGuard<'_> {
    type Target = ConnState;

    fn deref(&self) -> &ConnState {
        &self.0
    }
}

impl DerefMut for ConnGuard<'_> {
    fn deref_mut(&mut self) -> &mut ConnState {
        &mut self.0
    }
}

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        if let Phase::Established { engine, .. } = &mut self.0.phase {
            deliver(engine);
        }
    }
}

/// Hands the engine's reports to its QP, oldest first.
pub(crate) fn deliver(engine: &mut Engine) {
    engine.take_outputs().deliver(&**engine.qp());
}
