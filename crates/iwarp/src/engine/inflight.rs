//! In-order completion of send-side work.
//!
//! iWARP acknowledges nothing at the RDMAP layer. As Linux siw (and the iWARP verbs), a SEND or
//! RDMA WRITE completes at the source once all of its bytes were handed to the LLP: the entry
//! is done when the socket took the stream byte just past its last FPDU. An RDMA READ is done
//! when its last Read Response segment was placed. Completions leave in posting order, so a
//! SEND or WRITE behind an outstanding READ waits for that READ. A Terminate or a broken
//! stream completes the entry it names with its error and flushes everything not yet
//! completed.

use softrdma_verbs::qp_host::QpOutputs;
use softrdma_verbs::{WcOpcode, WcStatus, WorkCompletion};
use std::collections::VecDeque;

/// What an in-flight entry stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An untagged SEND with this MSN.
    Send { msn: u32 },
    /// A tagged RDMA WRITE to this STag.
    Write { stag: u32 },
    /// An RDMA READ whose request had this MSN (queue 1).
    Read { msn: u32 },
    /// The zero-length READ sent as peer-to-peer RTR; no completion, no SQ slot.
    Rtr { msn: u32 },
}

/// One sent work request awaiting confirmation.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Sequence number (increasing).
    pub seq: u64,
    /// The kind.
    pub kind: Kind,
    /// From the WR.
    pub wr_id: u64,
    /// Bytes of the message.
    pub byte_len: u32,
    /// Completion owed on success.
    pub signaled: bool,
    /// Complete (SEND/WRITE: taken by the socket; READ: response placed).
    pub done: bool,
    /// Completion opcode.
    pub op: WcOpcode,
    /// Stream offset just past the message's last byte, once it was all produced.
    pub end: u64,
}

impl Entry {
    fn opcode(&self) -> WcOpcode {
        self.op
    }

    fn is_rtr(&self) -> bool {
        matches!(self.kind, Kind::Rtr { .. })
    }
}

/// The in-flight list.
#[derive(Debug, Default)]
pub struct Inflight {
    entries: VecDeque<Entry>,
    next_seq: u64,
}

impl Inflight {
    /// Appends an entry; returns its sequence number.
    pub fn push(&mut self, kind: Kind, wr_id: u64, byte_len: u32, signaled: bool) -> u64 {
        let op = match kind {
            Kind::Send { .. } => WcOpcode::Send,
            Kind::Write { .. } => WcOpcode::RdmaWrite,
            Kind::Read { .. } | Kind::Rtr { .. } => WcOpcode::RdmaRead,
        };
        self.push_op(kind, op, wr_id, byte_len, signaled)
    }

    /// Appends an entry with an explicit completion opcode.
    pub fn push_op(&mut self, kind: Kind, op: WcOpcode, wr_id: u64, byte_len: u32, signaled: bool) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.push_back(Entry {
            seq,
            kind,
            wr_id,
            byte_len,
            signaled,
            done: false,
            op,
            end: u64::MAX,
        });
        seq
    }

    /// Records where message `seq` ended in the stream.
    pub fn set_end(&mut self, seq: u64, end: u64) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.seq == seq) {
            e.end = end;
        }
    }

    /// The socket took the stream up to offset `written`: SENDs and WRITEs that ended within
    /// it are complete. Returns true if one became complete.
    pub fn written_through(&mut self, written: u64) -> bool {
        let mut any = false;
        for e in self.entries.iter_mut() {
            if !e.done && matches!(e.kind, Kind::Send { .. } | Kind::Write { .. }) && e.end <= written {
                e.done = true;
                any = true;
            }
        }
        any
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A READ (or the RTR READ) with sequence `seq` completed: it and everything before it is
    /// complete (RFC 5040 orders a Read Response after every message sent before its request).
    pub fn confirm_through(&mut self, seq: u64, qpn: u32, out: &mut QpOutputs) {
        for e in self.entries.iter_mut() {
            if e.seq > seq {
                break;
            }
            e.done = true;
        }
        self.release(qpn, out);
    }

    /// Marks every SEND/WRITE that precedes `seq` as confirmed (the peer processed them).
    pub fn confirm_before(&mut self, seq: u64) {
        for e in self.entries.iter_mut() {
            if e.seq >= seq {
                break;
            }
            if matches!(e.kind, Kind::Send { .. } | Kind::Write { .. }) {
                e.done = true;
            }
        }
    }

    /// Completes confirmed entries from the head, in order.
    pub fn release(&mut self, qpn: u32, out: &mut QpOutputs) {
        while self.entries.front().is_some_and(|e| e.done) {
            let Some(e) = self.entries.pop_front() else { break };
            if e.is_rtr() {
                continue;
            }
            let mut wc = WorkCompletion::new(e.wr_id, WcStatus::Success, e.opcode(), qpn);
            wc.byte_len = e.byte_len;
            out.send_done(wc, e.signaled);
        }
    }

    /// Finds the entry a Terminate names among those not yet complete. A Terminate that
    /// names no message (`named` false) falls back to the oldest incomplete one; one that
    /// names a SEND or WRITE already completed (its bytes had left) has no target.
    pub fn find_target(&self, named: bool, pred: impl Fn(&Kind) -> bool) -> Option<u64> {
        let found = self.entries.iter().find(|e| !e.done && pred(&e.kind));
        match found {
            Some(e) => Some(e.seq),
            None if !named => self.entries.iter().find(|e| !e.done && !e.is_rtr()).map(|e| e.seq),
            None => None,
        }
    }

    /// Completes what is complete at the head, then entry `seq` with `status` (what precedes
    /// it in the stream was processed by the peer), and flushes the rest: an entry behind the
    /// failed one, or behind an unanswered READ, flushes even if its bytes had left (the peer
    /// stopped processing before it).
    pub fn fail(&mut self, seq: Option<u64>, status: WcStatus, vendor_err: u32, qpn: u32, out: &mut QpOutputs) {
        if let Some(seq) = seq {
            self.confirm_before(seq);
        }
        self.release(qpn, out);
        while let Some(e) = self.entries.pop_front() {
            if e.is_rtr() {
                continue;
            }
            let st = if Some(e.seq) == seq {
                status
            } else {
                WcStatus::WrFlushErr
            };
            let mut wc = WorkCompletion::new(e.wr_id, st, e.opcode(), qpn);
            if st != WcStatus::WrFlushErr {
                wc.vendor_err = vendor_err;
            }
            out.send_done(wc, true);
        }
    }
}
