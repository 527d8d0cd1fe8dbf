//! Typed reasons for rejected requests and for a QP entering the error state.

use softrdma_verbs::mr::KeyError;
use softrdma_verbs::WcStatus;
use softrdma_wire::roce::{NakCode, RoceOpcode};

/// Why the responder refused an in-sequence request (answered with a NAK; the QP then goes
/// to the error state, IBTA class C/J).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A MIDDLE/LAST without its FIRST, or a new message while one is in progress.
    #[error("opcode {got:?} out of sequence (message in progress: {in_progress})")]
    OpcodeSequence {
        /// The opcode received.
        got: RoceOpcode,
        /// What was in progress ("none", "SEND", "RDMA WRITE").
        in_progress: &'static str,
    },
    /// The packet does not carry the extension headers its opcode requires.
    #[error("{0:?} packet without its extension headers")]
    MissingHeader(RoceOpcode),
    /// A payload or DMA length that breaks the segmentation rules.
    #[error("{op:?}: {detail}")]
    Length {
        /// The opcode received.
        op: RoceOpcode,
        /// Which rule was broken.
        detail: &'static str,
    },
    /// The QP's access flags do not allow the operation.
    #[error("the QP does not allow remote {0}")]
    QpAccess(&'static str),
    /// The R_Key check failed (key, protection domain, rights or bounds).
    #[error("R_Key {rkey:#x} VA {va:#x} length {len}: {err}")]
    RemoteKey {
        /// The R_Key.
        rkey: u32,
        /// Start address.
        va: u64,
        /// Length.
        len: u64,
        /// What failed.
        err: KeyError,
    },
    /// An atomic whose address is not 8-byte aligned.
    #[error("atomic VA {0:#x} is not 8-byte aligned")]
    Misaligned(u64),
    /// More RDMA READ/atomic requests than the responder resources (IRD).
    #[error("more than {ird} RDMA READ/atomic requests outstanding")]
    TooManyReads {
        /// The responder resources.
        ird: u32,
    },
    /// A SEND longer than the receive WR's buffers.
    #[error("SEND of at least {len} bytes exceeds the {capacity}-byte receive buffer")]
    RecvTooSmall {
        /// Bytes of the message so far.
        len: u64,
        /// Bytes the receive WR holds.
        capacity: u64,
    },
    /// The receive WR names memory it may not write.
    #[error("receive WR {wr_id:#x}, lkey {lkey:#x}: {err}")]
    RecvBuffer {
        /// The receive WR.
        wr_id: u64,
        /// The bad lkey.
        lkey: u32,
        /// What failed.
        err: KeyError,
    },
    /// SEND with Invalidate named a key this QP may not invalidate.
    #[error("SEND with invalidate of R_Key {rkey:#x}: {err}")]
    Invalidate {
        /// The key.
        rkey: u32,
        /// What failed.
        err: KeyError,
    },
}

impl RequestError {
    /// The NAK code the requester is sent.
    pub fn nak_code(&self) -> NakCode {
        match self {
            RequestError::RemoteKey { .. } => NakCode::RemoteAccessError,
            RequestError::RecvBuffer { .. } => NakCode::RemoteOperationalError,
            RequestError::OpcodeSequence { .. }
            | RequestError::MissingHeader(_)
            | RequestError::Length { .. }
            | RequestError::QpAccess(_)
            | RequestError::Misaligned(_)
            | RequestError::TooManyReads { .. }
            | RequestError::RecvTooSmall { .. }
            | RequestError::Invalidate { .. } => NakCode::InvalidRequest,
        }
    }

    /// The status of a receive WR the rejected message had consumed.
    pub fn recv_status(&self) -> WcStatus {
        match self {
            RequestError::RecvTooSmall { .. } => WcStatus::LocLenErr,
            RequestError::RecvBuffer { .. } => WcStatus::LocProtErr,
            RequestError::RemoteKey { .. } => WcStatus::RemAccessErr,
            _ => WcStatus::RemInvReqErr,
        }
    }
}

/// The completion status a requester reports for a NAK code (None: not an error NAK).
pub fn nak_status(code: NakCode) -> Option<WcStatus> {
    match code {
        NakCode::PsnSequenceError => None,
        NakCode::InvalidRequest | NakCode::InvalidRdRequest => Some(WcStatus::RemInvReqErr),
        NakCode::RemoteAccessError => Some(WcStatus::RemAccessErr),
        NakCode::RemoteOperationalError => Some(WcStatus::RemOpErr),
    }
}

/// Why an RC engine moved its QP to the error state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RcError {
    /// The application (or destroy) moved the QP to ERR; everything was flushed.
    #[error("the QP was moved to the error state")]
    Flushed,
    /// A send WR failed before reaching the wire (bad lkey, too long, unsupported opcode).
    #[error("work request {wr_id:#x} failed locally ({status:?}): {detail}")]
    LocalWr {
        /// The WR.
        wr_id: u64,
        /// Its completion status.
        status: WcStatus,
        /// What was wrong.
        detail: String,
    },
    /// The peer answered a request with an error NAK.
    #[error("peer NAK {code:?} for PSN {psn:#08x} (work request {wr_id:#x})")]
    RemoteNak {
        /// The WR the NAK'd packet belongs to.
        wr_id: u64,
        /// The NAK'd PSN.
        psn: u32,
        /// The NAK code.
        code: NakCode,
    },
    /// No acknowledgement after the transport retries.
    #[error("no acknowledgement after {retries} retries (work request {wr_id:#x})")]
    RetryExceeded {
        /// The oldest unacknowledged WR.
        wr_id: u64,
        /// The retry count that ran out.
        retries: u8,
    },
    /// The QP had nothing outstanding and its keepalive probes went unanswered: the peer
    /// process is gone (or the path to it).
    #[error("the peer stopped answering: nothing heard for {silent:?}, {probes} keepalive probes unanswered")]
    PeerUnresponsive {
        /// Probes sent (the first and the resends).
        probes: u8,
        /// Time since the peer was last heard from.
        silent: std::time::Duration,
    },
    /// Still receiver-not-ready after the RNR retries.
    #[error("receiver not ready after {retries} RNR retries (work request {wr_id:#x})")]
    RnrRetryExceeded {
        /// The WR the peer kept refusing.
        wr_id: u64,
        /// The RNR retry count that ran out.
        retries: u8,
    },
    /// This side's responder rejected a request (a NAK was sent).
    #[error("rejected request PSN {psn:#08x}: {err}")]
    Rejected {
        /// The request's PSN.
        psn: u32,
        /// Why.
        err: RequestError,
    },
}

impl RcError {
    /// True if the peer stopped answering (transport retries or keepalive probes ran out):
    /// the connection is gone, as after a DREQ.
    pub fn peer_lost(&self) -> bool {
        matches!(self, RcError::RetryExceeded { .. } | RcError::PeerUnresponsive { .. })
    }
}
