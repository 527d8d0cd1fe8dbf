//! The QP as its transport engine sees it: everything an engine may ask of the verbs layer,
//! and nothing more.
//!
//! The RoCE and iWARP engines are state machines: packets and timer events go in, packets,
//! deadlines and completions come out. What they need from outside is small: the next send
//! and receive WQE, the QP's state and attributes, and the keys of its protection domain (the
//! only way they reach memory). [`QpHost`] is that surface. What they report (completions,
//! flushes, async events) they return as values ([`QpOutputs`]), which their driver delivers
//! through the sink methods of [`QpHost`] (`complete_send`, `complete_recv`, `flush`,
//! `report_*`). [`QpInner`] implements it over the real queues, CQs and the process's key
//! table; [`PlainQp`] implements it over plain vectors and a map of keys, so an engine test
//! constructs an engine without a device, a PD or a CQ.

mod outputs;
mod plain;

pub use outputs::{QpOutput, QpOutputs};
pub use plain::{PlainQp, PlainSrq, PLAIN_PD};

use crate::mr::{KeyError, MrInner};

use crate::qp::{QpAttr, QpInner, SendWqe};
use crate::qp_state::QpState;
use crate::wr::{Access, MwBind, RecvWr, WorkCompletion};
use std::sync::Arc;

/// A checked key: the region and the byte offset of the requested address in it.
pub type KeyMatch = (Arc<MrInner>, usize);

/// What a transport engine needs from its QP.
pub trait QpHost: Send + Sync + std::fmt::Debug {
    /// The QP number.
    fn qpn(&self) -> u32;
    /// Current state.
    fn state(&self) -> QpState;
    /// Current attributes.
    fn attr(&self) -> QpAttr;

    /// Takes the next send WQE if the QP is in RTS and `accept` approves the head.
    fn pop_send_if(&self, accept: &mut dyn FnMut(&SendWqe) -> bool) -> Option<SendWqe>;
    /// Takes the next receive WQE (from the SRQ if the QP has one).
    fn take_recv(&self) -> Option<RecvWr>;
    /// Reports a send-side completion (queued only if `signaled` or failed); like `flush` and
    /// `report_*`, called by the driver that delivers an engine's [`QpOutputs`], not by it.
    fn complete_send(&self, wc: WorkCompletion, signaled: bool);
    /// Reports a receive completion.
    fn complete_recv(&self, wc: WorkCompletion);
    /// Moves to ERR and hands back the queued WQEs, for [`QpHost::flush`], in order.
    fn enter_error(&self) -> (Vec<SendWqe>, Vec<RecvWr>);
    /// Completes queued WQEs with WR_FLUSH_ERR.
    fn flush(&self, sends: Vec<SendWqe>, recvs: Vec<RecvWr>);
    /// `IBV_EVENT_QP_FATAL`: the transport failed the QP.
    fn report_fatal(&self);
    /// `IBV_EVENT_COMM_EST`: the first request arrived in RTR.
    fn report_comm_established(&self);

    /// An SGE's key, in this QP's protection domain: `[addr, addr+len)` inside the region,
    /// and LOCAL_WRITE when `write`.
    fn check_local(&self, lkey: u32, addr: u64, len: u64, write: bool) -> Result<KeyMatch, KeyError>;
    /// A request's key, arriving at this QP: key valid, same PD, rights `need`, bounds (and a
    /// type-2 window bound to this QP).
    fn check_remote(&self, rkey: u32, addr: u64, len: u64, need: Access) -> Result<KeyMatch, KeyError>;
    /// SEND_WITH_INV's invalidation of `rkey` (an rkey of this PD).
    fn invalidate_remote(&self, rkey: u32) -> Result<(), KeyError>;
    /// A memory window bind, executed in send-queue order. The error says why.
    fn bind_mw(&self, bind: &MwBind) -> Result<(), String>;
    /// LOCAL_INV of a memory window's `rkey`.
    fn invalidate_mw(&self, rkey: u32) -> Result<(), KeyError>;
}

impl QpHost for QpInner {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        QpInner::state(self)
    }

    fn attr(&self) -> QpAttr {
        QpInner::attr(self)
    }

    fn pop_send_if(&self, accept: &mut dyn FnMut(&SendWqe) -> bool) -> Option<SendWqe> {
        QpInner::pop_send_if(self, accept)
    }

    fn take_recv(&self) -> Option<RecvWr> {
        QpInner::take_recv(self)
    }

    fn complete_send(&self, wc: WorkCompletion, signaled: bool) {
        QpInner::complete_send(self, wc, signaled)
    }

    fn complete_recv(&self, wc: WorkCompletion) {
        QpInner::complete_recv(self, wc)
    }

    fn enter_error(&self) -> (Vec<SendWqe>, Vec<RecvWr>) {
        QpInner::enter_error(self)
    }

    fn flush(&self, sends: Vec<SendWqe>, recvs: Vec<RecvWr>) {
        QpInner::flush(self, sends, recvs)
    }

    fn report_fatal(&self) {
        QpInner::report_fatal(self)
    }

    fn report_comm_established(&self) {
        QpInner::report_comm_established(self)
    }

    fn check_local(&self, lkey: u32, addr: u64, len: u64, write: bool) -> Result<KeyMatch, KeyError> {
        crate::mr::check_local(lkey, self.pd.id(), addr, len, write)
    }

    fn check_remote(&self, rkey: u32, addr: u64, len: u64, need: Access) -> Result<KeyMatch, KeyError> {
        crate::mr::check_remote(rkey, self.pd.id(), self.qpn, addr, len, need)
    }

    fn invalidate_remote(&self, rkey: u32) -> Result<(), KeyError> {
        crate::mr::invalidate_remote(rkey, self.pd.id())
    }

    fn bind_mw(&self, bind: &MwBind) -> Result<(), String> {
        crate::mw::bind(bind, self.pd.id(), self.qpn)
    }

    fn invalidate_mw(&self, rkey: u32) -> Result<(), KeyError> {
        crate::mw::invalidate(rkey, self.pd.id())
    }
}
