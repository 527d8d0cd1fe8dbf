//! What a transport engine reports about its QP, as values: completions, flushes and async
//! events. The engine appends them while it handles a packet, a timer or new work, and its
//! driver hands them to the QP ([`QpOutputs::deliver`]) before it lets go of the engine, so
//! they reach the CQs in the order the engine made them. An engine test reads them directly.

use super::QpHost;
use crate::qp::SendWqe;
use crate::wr::{RecvWr, WorkCompletion};

/// One report of an engine about its QP.
#[derive(Debug)]
pub enum QpOutput {
    /// A send-side WR finished: queued on the send CQ if `signaled` or failed.
    SendDone {
        /// The completion.
        wc: WorkCompletion,
        /// The WR asked for a completion (or the QP signals all).
        signaled: bool,
    },
    /// A receive WR finished.
    RecvDone(WorkCompletion),
    /// WQEs taken from the queues when the QP entered ERR ([`QpHost::enter_error`]): each
    /// completes with WR_FLUSH_ERR, sends first.
    Flush {
        /// The send WQEs, in order.
        sends: Vec<SendWqe>,
        /// The receive WRs, in order.
        recvs: Vec<RecvWr>,
    },
    /// `IBV_EVENT_QP_FATAL`: the transport failed the QP.
    Fatal,
    /// `IBV_EVENT_COMM_EST`: the first request arrived in RTR.
    CommEstablished,
}

/// An engine's reports since its driver last delivered them, oldest first.
#[derive(Debug, Default)]
pub struct QpOutputs(Vec<QpOutput>);

impl QpOutputs {
    /// A send-side completion.
    pub fn send_done(&mut self, wc: WorkCompletion, signaled: bool) {
        self.0.push(QpOutput::SendDone { wc, signaled });
    }

    /// A receive completion.
    pub fn recv_done(&mut self, wc: WorkCompletion) {
        self.0.push(QpOutput::RecvDone(wc));
    }

    /// WR_FLUSH_ERR completions for WQEs taken from the queues (nothing when both are empty).
    pub fn flush(&mut self, sends: Vec<SendWqe>, recvs: Vec<RecvWr>) {
        if !sends.is_empty() || !recvs.is_empty() {
            self.0.push(QpOutput::Flush { sends, recvs });
        }
    }

    /// `IBV_EVENT_QP_FATAL`.
    pub fn fatal(&mut self) {
        self.0.push(QpOutput::Fatal);
    }

    /// `IBV_EVENT_COMM_EST`.
    pub fn comm_established(&mut self) {
        self.0.push(QpOutput::CommEstablished);
    }

    /// Nothing to deliver.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Moves every report of `other` to the end of this one.
    pub fn append(&mut self, other: &mut QpOutputs) {
        self.0.append(&mut other.0);
    }

    /// Takes the reports, leaving this empty.
    pub fn take(&mut self) -> QpOutputs {
        QpOutputs(std::mem::take(&mut self.0))
    }

    /// The reports, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &QpOutput> {
        self.0.iter()
    }

    /// Hands every report to `qp`, oldest first.
    pub fn deliver(self, qp: &dyn QpHost) {
        for out in self.0 {
            match out {
                QpOutput::SendDone { wc, signaled } => qp.complete_send(wc, signaled),
                QpOutput::RecvDone(wc) => qp.complete_recv(wc),
                QpOutput::Flush { sends, recvs } => qp.flush(sends, recvs),
                QpOutput::Fatal => qp.report_fatal(),
                QpOutput::CommEstablished => qp.report_comm_established(),
            }
        }
    }
}
