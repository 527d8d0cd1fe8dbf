//! The responder's outgoing packets, in PSN order: ACKs (coalesced), NAKs, atomic ACKs and
//! READ responses (generated one packet at a time, reading memory at transmit time).

use super::psn::Psn;
use super::sendop::Position;
use super::stats::RcStats;
use softrdma_verbs::mr::{KeyError, MrInner};
use softrdma_wire::roce::{push_pad, Aeth, AtomicAckEth, Bth, NakCode, RoceHeaders, RoceOpcode, AETH_CREDITS_INVALID};
use std::collections::VecDeque;
use std::sync::Arc;

/// READ responses still to send for one request (new or replayed).
#[derive(Debug, Clone)]
pub(crate) struct ReadReply {
    /// Source memory and the offset of the first byte; `None` for a zero-length READ.
    pub target: Option<(Arc<MrInner>, usize)>,
    /// Bytes to send.
    pub len: u32,
    /// PSN of the first response packet.
    pub first_psn: Psn,
    /// Response packets in all.
    pub npkts: u32,
    /// Response packets already sent.
    pub sent: u32,
    /// MSN carried in the AETHs.
    pub msn: u32,
    /// A first execution (counts against IRD), not a replay.
    pub original: bool,
}

/// One queued response.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// Positive ACK through `psn`.
    Ack { psn: Psn, msn: u32 },
    /// NAK of `psn`.
    Nak { psn: Psn, msn: u32, code: NakCode },
    /// RNR NAK of `psn` with a timer code.
    Rnr { psn: Psn, msn: u32, timer: u8 },
    /// Atomic ACK with the original remote value.
    Atomic {
        psn: Psn,
        msn: u32,
        orig: u64,
        original: bool,
    },
    /// READ responses.
    Read(ReadReply),
}

impl Reply {
    fn is_original(&self) -> bool {
        match self {
            Reply::Atomic { original, .. } => *original,
            Reply::Read(r) => r.original,
            _ => false,
        }
    }
}

/// What a read failure at transmit time hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadFailure {
    /// The response packet's PSN.
    pub psn: Psn,
}

/// The queue.
#[derive(Debug)]
pub(crate) struct Replies {
    queue: VecDeque<Reply>,
    /// Queued first executions of READ/atomic requests (bounded by IRD).
    originals: u32,
    /// Queue length beyond which duplicate-triggered replies are dropped.
    cap: usize,
}

impl Replies {
    /// An empty queue that takes at most `cap` replay-triggered replies.
    pub(crate) fn new(cap: usize) -> Replies {
        Replies {
            queue: VecDeque::new(),
            originals: 0,
            cap,
        }
    }

    /// READ/atomic first executions whose responses are not all sent.
    pub(crate) fn originals(&self) -> u32 {
        self.originals
    }

    /// Replies queued.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues an ACK, replacing a queued ACK at the tail (the newer one covers it).
    pub(crate) fn push_ack(&mut self, psn: Psn, msn: u32) {
        if let Some(Reply::Ack { psn: p, msn: m }) = self.queue.back_mut() {
            *p = psn;
            *m = msn;
            return;
        }
        self.queue.push_back(Reply::Ack { psn, msn });
    }

    /// Queues a reply. Replays are refused (false) once the queue is long; a NAK equal to
    /// the one at the tail is not queued twice.
    pub(crate) fn push(&mut self, reply: Reply) -> bool {
        let same_nak = match (self.queue.back(), &reply) {
            (Some(Reply::Nak { psn: a, code: x, .. }), Reply::Nak { psn: b, code: y, .. }) => a == b && x == y,
            (Some(Reply::Rnr { psn: a, .. }), Reply::Rnr { psn: b, .. }) => a == b,
            _ => false,
        };
        if same_nak {
            return false;
        }
        let original = reply.is_original();
        if !original && !matches!(reply, Reply::Nak { .. } | Reply::Rnr { .. }) && self.queue.len() >= self.cap {
            return false;
        }
        if original {
            self.originals += 1;
        }
        self.queue.push_back(reply);
        true
    }

    /// Drops everything (the QP failed), keeping only `final_nak` if given.
    pub(crate) fn reset(&mut self, final_nak: Option<Reply>) {
        self.queue.clear();
        self.originals = 0;
        self.queue.extend(final_nak);
    }

    /// A READ is being replayed from `psn`: queued READ responses whose PSN range holds it are
    /// dropped, sent or not. The requester restarts at `psn` because it has everything before
    /// it, and it discards every response of the old stream from there on, so sending them only
    /// delays the replay (as Linux rxe, which redirects the stream to the replayed range).
    pub(crate) fn end_reads_covering(&mut self, psn: Psn) {
        let mut dropped_originals = 0;
        self.queue.retain(|r| match r {
            Reply::Read(rr) if psn.in_range(rr.first_psn, rr.npkts) => {
                dropped_originals += u32::from(rr.original);
                false
            }
            _ => true,
        });
        self.originals = self.originals.saturating_sub(dropped_originals);
    }

    /// The application moved the QP to ERR: keeps only an ACK at the head of the queue. The
    /// messages it acknowledges are executed and completed here already; without it their
    /// requester would flush WRs its peer received.
    pub(crate) fn keep_owed_ack(&mut self) {
        let ack = match self.queue.front() {
            Some(r @ Reply::Ack { .. }) => Some(r.clone()),
            _ => None,
        };
        self.reset(ack);
    }

    /// Writes the next response packet into `out`. Ok(false): nothing queued.
    /// Err: a READ's source memory could not be read (the PSN of that response).
    pub(crate) fn emit_next(
        &mut self,
        mtu: usize,
        dest_qpn: u32,
        pkey: u16,
        stats: &mut RcStats,
        out: &mut Vec<u8>,
    ) -> Result<bool, ReadFailure> {
        let Some(front) = self.queue.front_mut() else {
            return Ok(false);
        };
        let bth = |op: RoceOpcode, psn: Psn| {
            let mut b = Bth::new(op, dest_qpn, psn.get());
            b.pkey = pkey;
            b
        };
        let mut finished = true;
        // A READ response's payload: (memory, offset, length, PSN), read straight behind the headers.
        let mut source = None;
        let headers = match front {
            Reply::Ack { psn, msn } => {
                stats.acks_sent += 1;
                let mut h = RoceHeaders::new(bth(RoceOpcode::RcAck, *psn));
                h.aeth = Some(Aeth::ack(*msn, AETH_CREDITS_INVALID));
                h
            }
            Reply::Nak { psn, msn, code } => {
                stats.naks_sent.count(*code);
                let mut h = RoceHeaders::new(bth(RoceOpcode::RcAck, *psn));
                h.aeth = Some(Aeth::nak(*msn, *code));
                h
            }
            Reply::Rnr { psn, msn, timer } => {
                stats.naks_sent.rnr += 1;
                let mut h = RoceHeaders::new(bth(RoceOpcode::RcAck, *psn));
                h.aeth = Some(Aeth::rnr_nak(*msn, *timer));
                h
            }
            Reply::Atomic { psn, msn, orig, .. } => {
                let mut h = RoceHeaders::new(bth(RoceOpcode::RcAtomicAck, *psn));
                h.aeth = Some(Aeth::ack(*msn, AETH_CREDITS_INVALID));
                h.atomic_ack = Some(AtomicAckEth { orig: *orig });
                h
            }
            Reply::Read(r) => {
                let k = r.sent;
                let psn = r.first_psn.add(k);
                let off = (k as usize).saturating_mul(mtu);
                let len = (r.len as usize).saturating_sub(off).min(mtu);
                if let Some((mr, base)) = &r.target {
                    source = Some((mr, base.saturating_add(off), len, psn));
                }
                let pos = Position::of(k, r.npkts);
                let op = match pos {
                    Position::Only => RoceOpcode::RcReadResponseOnly,
                    Position::First => RoceOpcode::RcReadResponseFirst,
                    Position::Middle => RoceOpcode::RcReadResponseMiddle,
                    Position::Last => RoceOpcode::RcReadResponseLast,
                };
                let mut h = RoceHeaders::new(bth(op, psn));
                if pos != Position::Middle {
                    h.aeth = Some(Aeth::ack(r.msn, AETH_CREDITS_INVALID));
                }
                r.sent += 1;
                finished = r.sent >= r.npkts;
                stats.read_responses_sent += 1;
                h
            }
        };
        out.clear();
        let len = source.map_or(0, |(_, _, len, _)| len);
        headers.emit_headers(len, out);
        if let Some((mr, at, len, psn)) = source {
            if !mr.region.append_to(at, len, out) {
                out.clear();
                return Err(ReadFailure { psn });
            }
        }
        push_pad(out, len);
        if finished {
            if let Some(done) = self.queue.pop_front() {
                if done.is_original() {
                    self.originals = self.originals.saturating_sub(1);
                }
            }
        }
        Ok(true)
    }
}

/// The key error a failed read of registered memory stands for.
pub(crate) const READ_FAILURE_KEY_ERROR: KeyError = KeyError::Bounds;
