//! In-order completion of send-side work.
//!
//! iWARP acknowledges nothing at the RDMAP layer, so a SEND or RDMA WRITE is only known to be
//! placed once a later RDMA READ response arrives: RFC 5040 orders a Read Response after every
//! message sent before its Read Request. softrdma therefore keeps sent WRs here and completes
//! them when a READ (the application's, or an internal zero-length "fence" READ) comes back,
//! or with the error named by a Terminate. Completions leave in posting order.

use softrdma_verbs::qp::QpInner;
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
    /// An internal zero-length READ (RTR or completion fence); no completion, no SQ slot.
    Fence { msn: u32 },
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
    /// Confirmed (placed / read back).
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

    fn is_fence(&self) -> bool {
        matches!(self.kind, Kind::Fence { .. })
    }
}

/// The in-flight list.
#[derive(Debug, Default)]
pub struct Inflight {
    entries: VecDeque<Entry>,
    next_seq: u64,
    /// Signaled SEND/WRITE entries after the last READ or fence.
    unconfirmed_signaled: usize,
}

impl Inflight {
    /// Appends an entry; returns its sequence number.
    pub fn push(&mut self, kind: Kind, wr_id: u64, byte_len: u32, signaled: bool) -> u64 {
        let op = match kind {
            Kind::Send { .. } => WcOpcode::Send,
            Kind::Write { .. } => WcOpcode::RdmaWrite,
            Kind::Read { .. } | Kind::Fence { .. } => WcOpcode::RdmaRead,
        };
        self.push_op(kind, op, wr_id, byte_len, signaled)
    }

    /// Appends an entry with an explicit completion opcode.
    pub fn push_op(&mut self, kind: Kind, op: WcOpcode, wr_id: u64, byte_len: u32, signaled: bool) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        match kind {
            Kind::Send { .. } | Kind::Write { .. } => {
                if signaled {
                    self.unconfirmed_signaled += 1;
                }
            }
            Kind::Read { .. } | Kind::Fence { .. } => self.unconfirmed_signaled = 0,
        }
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

    /// The peer closed cleanly having acknowledged `acked` stream bytes: SENDs and WRITEs
    /// that ended within them were placed.
    pub fn confirm_sent_within(&mut self, acked: u64) {
        for e in self.entries.iter_mut() {
            if matches!(e.kind, Kind::Send { .. } | Kind::Write { .. }) && e.end <= acked {
                e.done = true;
            }
        }
    }

    /// True if a fence READ would confirm signaled work.
    pub fn wants_fence(&self) -> bool {
        self.unconfirmed_signaled > 0
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A READ (or fence) with sequence `seq` completed: it and everything before it is confirmed.
    pub fn confirm_through(&mut self, seq: u64, qp: &QpInner) {
        for e in self.entries.iter_mut() {
            if e.seq > seq {
                break;
            }
            e.done = true;
        }
        self.release(qp);
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
    pub fn release(&mut self, qp: &QpInner) {
        while self.entries.front().is_some_and(|e| e.done) {
            let Some(e) = self.entries.pop_front() else { break };
            if e.is_fence() {
                continue;
            }
            let mut wc = WorkCompletion::new(e.wr_id, WcStatus::Success, e.opcode(), qp.qpn);
            wc.byte_len = e.byte_len;
            qp.complete_send(wc, e.signaled);
        }
    }

    /// Finds the entry a Terminate names; falls back to the oldest unconfirmed one.
    pub fn find_target(&self, pred: impl Fn(&Kind) -> bool) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| !e.done && pred(&e.kind))
            .or_else(|| self.entries.iter().find(|e| !e.done && !e.is_fence()))
            .map(|e| e.seq)
    }

    /// Completes entry `seq` with `status` (after releasing what precedes it) and flushes the rest.
    pub fn fail(&mut self, seq: Option<u64>, status: WcStatus, vendor_err: u32, qp: &QpInner) {
        if let Some(seq) = seq {
            self.confirm_before(seq);
            self.release(qp);
        }
        while let Some(e) = self.entries.pop_front() {
            if e.is_fence() {
                continue;
            }
            let st = if Some(e.seq) == seq {
                status
            } else if e.done {
                WcStatus::Success
            } else {
                WcStatus::WrFlushErr
            };
            let mut wc = WorkCompletion::new(e.wr_id, st, e.opcode(), qp.qpn);
            if st == WcStatus::Success {
                wc.byte_len = e.byte_len;
                qp.complete_send(wc, e.signaled);
                continue;
            }
            if st != WcStatus::WrFlushErr {
                wc.vendor_err = vendor_err;
            }
            qp.complete_send(wc, true);
        }
        self.unconfirmed_signaled = 0;
    }
}
