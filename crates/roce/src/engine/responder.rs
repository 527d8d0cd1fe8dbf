//! The responder: request packets in PSN order → execution (`execute.rs`) and replies
//! (`replies.rs`); out-of-sequence NAKs, duplicate handling with READ/atomic replay, ACK
//! coalescing, and rejection (NAK + QP to ERR) of invalid requests.

use super::config::RcConfig;
use super::error::{RcError, RequestError};
use super::local::Piece;
use super::psn::Psn;
use super::replies::{ReadReply, Replies, Reply, READ_FAILURE_KEY_ERROR};
use super::resources::{ResourceKind, Resources};
use super::stats::RcStats;
use softrdma_verbs::mr::MrInner;
use softrdma_verbs::qp_host::QpOutputs;
use softrdma_verbs::QpHost;
use softrdma_verbs::{Access, RecvWr, WcOpcode, WorkCompletion};
use softrdma_wire::roce::{NakCode, RoceOpcode, RocePacket, MSN_MASK};
use std::sync::Arc;

/// A plain ACK is sent after this many unacknowledged request packets even without AckReq.
pub(crate) const ACK_COALESCE: u32 = 32;
/// Replies queued beyond IRD before duplicate-triggered replays are dropped.
const REPLAY_SLACK: usize = 64;

/// A multi-packet message being received.
#[derive(Debug)]
pub(crate) enum InMessage {
    /// A SEND into a receive WR.
    Send {
        /// The receive WR it consumes.
        recv: RecvWr,
        /// Its checked buffers.
        dst: Vec<Piece>,
        /// Their total size.
        capacity: u64,
        /// Bytes placed so far.
        received: u64,
    },
    /// An RDMA WRITE into a checked remote range.
    Write {
        /// Target memory and offset of the first byte (`None` when the length is 0).
        target: Option<(Arc<MrInner>, usize)>,
        /// DMA length from the RETH.
        total: u64,
        /// Bytes placed so far.
        placed: u64,
        /// The receive WR a WRITE with immediate consumes.
        recv: Option<RecvWr>,
    },
}

impl InMessage {
    /// Name for error messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            InMessage::Send { .. } => "SEND",
            InMessage::Write { .. } => "RDMA WRITE",
        }
    }

    /// The receive WR the message holds, if any.
    fn into_recv(self) -> Option<RecvWr> {
        match self {
            InMessage::Send { recv, .. } => Some(recv),
            InMessage::Write { recv, .. } => recv,
        }
    }
}

/// What executing an in-sequence request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Data placed (SEND/WRITE packet): acknowledged by a (coalesced) ACK.
    Placed,
    /// A READ/atomic whose responses (using `npkts` PSNs) are queued.
    Replied {
        /// PSNs the responses use.
        npkts: u32,
    },
    /// No receive WR: refused with an RNR NAK, nothing consumed.
    Rnr,
}

/// What a failing QP still sends of its queued replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeepReplies {
    /// Nothing (reset, or the peer is gone).
    Nothing,
    /// The NAK of the request that failed the QP (queued already).
    FinalNak,
    /// An ACK at the head of the queue (the application moved the QP to ERR).
    OwedAck,
}

/// The receive side of an RC QP.
#[derive(Debug)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub(super) epsn: Psn,
    /// Message sequence number: messages completed (24 bits).
    pub(super) msn: u32,
    /// The message in progress.
    pub(super) cur: Option<InMessage>,
    /// A PSN sequence NAK covers the current gap.
    nak_sent: bool,
    /// Request packets executed since the last ACK.
    unacked: u32,
    /// Remembered READ/atomic requests.
    pub(super) history: Resources,
    /// Outgoing responses.
    pub(super) replies: Replies,
    pub(super) cfg: RcConfig,
    /// Completions made since the engine last collected them (`RcEngine::collect`).
    pub(super) out: QpOutputs,
}

impl Responder {
    /// A responder expecting `cfg.rq_psn`.
    pub(crate) fn new(cfg: &RcConfig) -> Responder {
        let ird = cfg.ird as usize;
        Responder {
            epsn: Psn::new(cfg.rq_psn),
            msn: 0,
            cur: None,
            nak_sent: false,
            unacked: 0,
            history: Resources::new(ird),
            replies: Replies::new(ird + REPLAY_SLACK),
            cfg: cfg.clone(),
            out: QpOutputs::default(),
        }
    }

    /// Handles a request packet addressed to this QP (headers already checked against the
    /// opcode). An error means the request was rejected: a NAK is queued and the QP must go
    /// to ERR.
    pub(crate) fn handle_request(
        &mut self,
        pkt: &RocePacket<'_>,
        qp: &dyn QpHost,
        stats: &mut RcStats,
    ) -> Result<(), RcError> {
        let bth = &pkt.headers.bth;
        let psn = Psn::new(bth.psn);
        let d = psn.diff(self.epsn);
        if d > 0 {
            stats.out_of_sequence_dropped += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                self.replies.push(Reply::Nak {
                    psn: self.epsn,
                    msn: self.msn,
                    code: NakCode::PsnSequenceError,
                });
            }
            return Ok(());
        }
        if d < 0 {
            stats.duplicates += 1;
            return self.duplicate(psn, pkt, qp);
        }
        self.nak_sent = false;
        match self.execute(psn, pkt, qp, stats) {
            Ok(Step::Placed) => {
                self.epsn = psn.add(1);
                self.unacked += 1;
                if bth.ack_req || self.unacked >= ACK_COALESCE {
                    self.unacked = 0;
                    self.replies.push_ack(psn, self.msn);
                }
                Ok(())
            }
            Ok(Step::Replied { npkts }) => {
                self.epsn = psn.add(npkts);
                self.unacked = 0;
                Ok(())
            }
            Ok(Step::Rnr) => {
                self.unacked = 0;
                self.replies.push(Reply::Rnr {
                    psn,
                    msn: self.msn,
                    timer: self.cfg.min_rnr_timer,
                });
                Ok(())
            }
            Err(err) => Err(self.reject(psn, err, qp)),
        }
    }

    /// A request behind the expected PSN: SEND/WRITE are acknowledged again, READs are
    /// answered again from memory, atomics get their saved result.
    fn duplicate(&mut self, psn: Psn, pkt: &RocePacket<'_>, qp: &dyn QpHost) -> Result<(), RcError> {
        let h = &pkt.headers;
        let op = h.bth.opcode;
        if op.is_send() || op.is_write() {
            self.replies.push_ack(self.epsn.sub(1), self.msn);
            return Ok(());
        }
        let Some(res) = self.history.find(psn).copied() else {
            // Forgotten (class D): drop; the requester's retries run out.
            return Ok(());
        };
        match (op, res.kind) {
            (RoceOpcode::RcReadRequest, ResourceKind::Read { va, rkey, len }) => {
                let Some(reth) = h.reth else { return Ok(()) };
                let k = psn.offset_from(res.first_psn);
                let skip = u64::from(k) * self.cfg.mtu as u64;
                let consistent = reth.rkey == rkey
                    && reth.va.checked_sub(va) == Some(skip)
                    && u64::from(reth.dma_len) + skip == u64::from(len);
                if !consistent {
                    return Ok(());
                }
                let target = if reth.dma_len == 0 {
                    None
                } else {
                    // Read memory again, as on first execution: the key may be gone by now.
                    match qp.check_remote(rkey, reth.va, u64::from(reth.dma_len), Access::REMOTE_READ) {
                        Ok(t) => Some(t),
                        Err(err) => {
                            let err = RequestError::RemoteKey {
                                rkey,
                                va: reth.va,
                                len: u64::from(reth.dma_len),
                                err,
                            };
                            return Err(self.reject(psn, err, qp));
                        }
                    }
                };
                self.replies.end_reads_covering(psn);
                self.replies.push(Reply::Read(ReadReply {
                    target,
                    len: reth.dma_len,
                    first_psn: psn,
                    npkts: res.npkts - k,
                    sent: 0,
                    msn: res.msn,
                    original: false,
                }));
            }
            (RoceOpcode::RcCompareSwap | RoceOpcode::RcFetchAdd, ResourceKind::Atomic { orig })
                if psn == res.first_psn =>
            {
                self.replies.push(Reply::Atomic {
                    psn,
                    msn: res.msn,
                    orig,
                    original: false,
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// Rejects the request at `psn`: a consumed receive WR completes in error, the NAK is
    /// the only reply left to send, and the caller moves the QP to ERR.
    pub(crate) fn reject(&mut self, psn: Psn, err: RequestError, qp: &dyn QpHost) -> RcError {
        if let Some(recv) = self.cur.take().and_then(InMessage::into_recv) {
            self.out.recv_done(WorkCompletion::new(
                recv.wr_id,
                err.recv_status(),
                WcOpcode::Recv,
                qp.qpn(),
            ));
        }
        self.replies.reset(Some(Reply::Nak {
            psn,
            msn: self.msn,
            code: err.nak_code(),
        }));
        RcError::Rejected { psn: psn.get(), err }
    }

    /// Writes the next response packet into `out`. An error means a READ could not read its
    /// source memory; the request is then rejected.
    pub(crate) fn poll_transmit(
        &mut self,
        qp: &dyn QpHost,
        stats: &mut RcStats,
        out: &mut Vec<u8>,
    ) -> Result<bool, RcError> {
        let (mtu, dest, pkey) = (self.cfg.mtu, self.cfg.dest_qpn, self.cfg.pkey);
        match self.replies.emit_next(mtu, dest, pkey, stats, out) {
            Ok(sent) => Ok(sent),
            Err(f) => {
                let err = RequestError::RemoteKey {
                    rkey: 0,
                    va: 0,
                    len: 0,
                    err: READ_FAILURE_KEY_ERROR,
                };
                Err(self.reject(f.psn, err, qp))
            }
        }
    }

    /// Whether replies (ACKs, NAKs, READ responses) wait to be sent.
    pub(crate) fn has_replies(&self) -> bool {
        !self.replies.is_empty()
    }

    /// The QP failed: hands back the receive WR of a message in progress (to flush first)
    /// and drops the replies, except what `keep` names.
    pub(crate) fn abort(&mut self, keep: KeepReplies) -> Option<RecvWr> {
        match keep {
            KeepReplies::FinalNak => {}
            KeepReplies::OwedAck => self.replies.keep_owed_ack(),
            KeepReplies::Nothing => self.replies.reset(None),
        }
        self.history.clear();
        self.cur.take().and_then(InMessage::into_recv)
    }

    /// Its sequence state in one line, for `softrdma stat` (diagnosing a stalled QP).
    pub(crate) fn summary(&self) -> String {
        let cur = match &self.cur {
            Some(InMessage::Send { received, capacity, .. }) => format!(" in SEND {received}/{capacity} B"),
            Some(InMessage::Write { placed, total, .. }) => format!(" in WRITE {placed}/{total} B"),
            None => String::new(),
        };
        format!(
            "epsn {} msn {}{cur} unacked {}{} replies {}",
            self.epsn,
            self.msn,
            self.unacked,
            if self.nak_sent { " nak sent" } else { "" },
            self.replies.len()
        )
    }

    /// True when no reply waits.
    pub(crate) fn idle(&self) -> bool {
        self.replies.is_empty()
    }

    /// Advances the MSN after a completed message.
    pub(super) fn bump_msn(&mut self) -> u32 {
        self.msn = (self.msn + 1) & MSN_MASK;
        self.msn
    }
}
