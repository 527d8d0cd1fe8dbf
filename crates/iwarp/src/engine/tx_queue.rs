//! The bytes an engine produced for the socket, in stream order.
//!
//! FPDU framing (MPA length, DDP and RDMAP headers, pad, CRC) and copied payloads are the
//! engine's own bytes. A payload slice of at least [`ZERO_COPY_MIN`] bytes stays in its MR: the
//! driver sends it from there ([`softrdma_verbs::memory::socket_io`]), so the kernel's copy into
//! the socket is the only one (as siw sends pages). With MPA CRC the CRC32c is computed over
//! the FPDU's parts when it is queued ([`TxQueue::crc_since`], the MR ranges read through
//! 4 KiB guarded copies), as siw computes it over the pages it then hands to TCP: an
//! application that changes a buffer before its send completed (which the verbs leave
//! undefined) then gets the peer's Terminate for a CRC error rather than changed data.

use softrdma_verbs::memory::socket_io::{Gather, MAX_GATHER_PARTS};
use softrdma_verbs::mr::MrInner;
use softrdma_wire::Crc32c;
use std::collections::VecDeque;
use std::sync::Arc;

/// Payload slices shorter than this are copied (a copy is cheaper than an extra iovec and lease).
pub(crate) const ZERO_COPY_MIN: usize = 4096;

/// One run of queued bytes.
#[derive(Debug)]
enum Part {
    /// `len` bytes of the queue's own buffer from `start`.
    Own { start: usize, len: usize },
    /// A range of registered memory, sent from the MR.
    Mem {
        mr: Arc<MrInner>,
        off: usize,
        len: usize,
        /// Stream offset of the first byte of the FPDU it belongs to.
        fpdu: u64,
        /// The in-flight entry of its message (none for a Read Response).
        msg: Option<u64>,
    },
}

impl Part {
    fn len(&self) -> usize {
        match self {
            Part::Own { len, .. } | Part::Mem { len, .. } => *len,
        }
    }
}

/// A registered-memory part that could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LostPart {
    /// Stream offset of its FPDU's first byte.
    pub fpdu: u64,
    /// Its message's in-flight entry (none for a Read Response).
    pub msg: Option<u64>,
}

/// Where the queue stood before an FPDU was started (to undo it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    own: usize,
    parts: usize,
    queued: usize,
}

/// The queue.
#[derive(Debug, Default)]
pub(crate) struct TxQueue {
    own: Vec<u8>,
    parts: VecDeque<Part>,
    /// Bytes of the front part the socket already took.
    head_taken: usize,
    /// Bytes queued and not yet taken.
    queued: usize,
    /// Stream offset of the first byte not yet taken.
    written: u64,
}

/// Own bytes consumed before the buffer is compacted (while parts remain queued).
const COMPACT_AT: usize = 1 << 20;

impl TxQueue {
    /// An empty queue with room for `capacity` own bytes.
    pub fn with_capacity(capacity: usize) -> TxQueue {
        TxQueue {
            own: Vec::with_capacity(capacity),
            ..TxQueue::default()
        }
    }

    /// Bytes queued and not yet taken by the socket.
    pub fn len(&self) -> usize {
        self.queued
    }

    /// True when the socket took everything.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Stream offset of the first byte not yet taken (bytes handed to the socket so far).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Stream offset just past the last queued byte.
    pub fn end(&self) -> u64 {
        self.written + self.queued as u64
    }

    /// Where the queue stands now.
    pub fn mark(&self) -> Mark {
        Mark {
            own: self.own.len(),
            parts: self.parts.len(),
            queued: self.queued,
        }
    }

    /// Removes everything appended since `m`.
    pub fn rollback(&mut self, m: Mark) {
        self.parts.truncate(m.parts);
        self.own.truncate(m.own);
        if let Some(Part::Own { start, len }) = self.parts.back_mut() {
            *len = (*len).min(m.own - *start);
        }
        self.queued = m.queued;
    }

    /// The CRC32c of every byte appended since `m`, own bytes and registered memory in stream
    /// order; None if a memory part could not be read (revoked, or its memory faulted).
    pub fn crc_since(&self, m: Mark) -> Option<u32> {
        let mut crc = Crc32c::default();
        // The part that was last at `m` may have grown since (own bytes merge); a memory part
        // there is an earlier FPDU's.
        let first = m.parts.saturating_sub(1);
        for (i, part) in self.parts.iter().enumerate().skip(first) {
            match part {
                Part::Own { start, len } => {
                    let from = (*start).max(m.own);
                    if from < start + len {
                        crc.update(&self.own[from..start + len]);
                    }
                }
                Part::Mem { .. } if i < m.parts => {}
                Part::Mem { mr, off, len, .. } => {
                    if !mr.region.read_chunks(*off, *len, |c| crc.update(c)) {
                        return None;
                    }
                }
            }
        }
        Some(crc.finish())
    }

    /// Appends own bytes.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        let start = self.own.len();
        self.own.extend_from_slice(bytes);
        self.own_grew(start, bytes.len());
    }

    /// Appends the own bytes `fill` writes, or nothing if it returns false.
    pub fn push_with(&mut self, fill: impl FnOnce(&mut Vec<u8>) -> bool) -> bool {
        let start = self.own.len();
        if !fill(&mut self.own) {
            self.own.truncate(start);
            return false;
        }
        self.own_grew(start, self.own.len() - start);
        true
    }

    /// Records that own bytes `[start, start + n)` were appended.
    fn own_grew(&mut self, start: usize, n: usize) {
        if n == 0 {
            return;
        }
        match self.parts.back_mut() {
            Some(Part::Own { start: s, len }) if *s + *len == start => *len += n,
            _ => self.parts.push_back(Part::Own { start, len: n }),
        }
        self.queued += n;
    }

    /// Appends a range of registered memory, to be sent from the MR.
    pub fn push_mem(&mut self, mr: Arc<MrInner>, off: usize, len: usize, fpdu: u64, msg: Option<u64>) {
        if len == 0 {
            return;
        }
        self.parts.push_back(Part::Mem {
            mr,
            off,
            len,
            fpdu,
            msg,
        });
        self.queued += len;
    }

    /// The next parts to send, from the first byte not yet taken.
    pub fn gather<'a>(&'a self, out: &mut Vec<Gather<'a>>) {
        out.extend(self.views().take(MAX_GATHER_PARTS));
    }

    /// Every queued part, from the first byte not yet taken.
    fn views(&self) -> impl Iterator<Item = Gather<'_>> {
        self.parts.iter().enumerate().map(|(i, part)| {
            let skip = if i == 0 { self.head_taken } else { 0 };
            match part {
                Part::Own { start, len } => Gather::Bytes(&self.own[start + skip..start + len]),
                Part::Mem { mr, off, len, .. } => Gather::Region {
                    region: &mr.region,
                    offset: off + skip,
                    len: len - skip,
                },
            }
        })
    }

    /// The socket took `n` bytes.
    pub fn consumed(&mut self, n: usize) {
        let n = n.min(self.queued);
        self.queued -= n;
        self.written += n as u64;
        let mut left = n;
        while left > 0 {
            let Some(front) = self.parts.front() else { break };
            let rest = front.len() - self.head_taken;
            if left < rest {
                self.head_taken += left;
                break;
            }
            left -= rest;
            self.head_taken = 0;
            self.parts.pop_front();
        }
        self.compact();
    }

    /// Frees own bytes the socket took: all of them once nothing own is queued, else the
    /// taken prefix once it is large.
    fn compact(&mut self) {
        let first_own = self.parts.iter().find_map(|p| match p {
            Part::Own { start, .. } => Some(*start),
            Part::Mem { .. } => None,
        });
        match first_own {
            None => self.own.clear(),
            Some(s) if s >= COMPACT_AT && s * 2 >= self.own.len() => {
                self.own.drain(..s);
                for p in self.parts.iter_mut() {
                    if let Part::Own { start, .. } = p {
                        *start -= s;
                    }
                }
            }
            Some(_) => {}
        }
    }

    /// The memory part at `index` of the last [`TxQueue::gather`], if it is one.
    pub fn mem_part(&self, index: usize) -> Option<LostPart> {
        match self.parts.get(index)? {
            Part::Mem { fpdu, msg, .. } => Some(LostPart { fpdu: *fpdu, msg: *msg }),
            Part::Own { .. } => None,
        }
    }

    /// Drops every byte from stream offset `at` on (`at` not before [`TxQueue::written`]).
    pub fn truncate_at(&mut self, at: u64) {
        let keep = at.saturating_sub(self.written).min(self.queued as u64) as usize;
        let mut pos = 0usize; // bytes before the current part, from the first untaken byte
        let mut kept_parts = 0;
        for (i, part) in self.parts.iter_mut().enumerate() {
            let avail = part.len() - if i == 0 { self.head_taken } else { 0 };
            if pos + avail <= keep {
                pos += avail;
                kept_parts += 1;
                continue;
            }
            let cut = keep - pos;
            if cut > 0 {
                match part {
                    Part::Own { len, .. } | Part::Mem { len, .. } => *len -= avail - cut,
                }
                kept_parts += 1;
            }
            break;
        }
        self.parts.truncate(kept_parts);
        if self.parts.is_empty() {
            self.head_taken = 0;
        }
        self.queued = keep;
        let own_end = self.parts.iter().rev().find_map(|p| match p {
            Part::Own { start, len } => Some(start + len),
            Part::Mem { .. } => None,
        });
        self.own.truncate(own_end.unwrap_or(0));
    }

    /// Drops everything queued.
    pub fn clear(&mut self) {
        self.truncate_at(self.written);
    }

    /// Every queued byte, copied (tests compare streams).
    #[cfg(test)]
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.queued);
        for part in self.views() {
            assert!(part.append_to(&mut out), "memory part unreadable");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_verbs::qp_host::PlainQp;
    use softrdma_verbs::{Access, QpAttr, QpState};

    fn mr(bytes: &[u8]) -> Arc<MrInner> {
        let qp = PlainQp::new(1, QpState::Rts, QpAttr::default());
        let mr = qp.register(bytes.len(), Access::LOCAL_WRITE);
        assert!(mr.region.write(0, bytes));
        mr
    }

    /// own "ab", mem "0123456789", own "cd" (merged with nothing: a mem part sits between).
    fn queue() -> (TxQueue, Arc<MrInner>) {
        let m = mr(b"0123456789");
        let mut q = TxQueue::default();
        q.push_bytes(b"a");
        q.push_bytes(b"b");
        q.push_mem(m.clone(), 0, 10, 0, Some(4));
        q.push_bytes(b"cd");
        (q, m)
    }

    #[test]
    fn own_bytes_merge_and_consumption_walks_the_parts() {
        let (mut q, _m) = queue();
        let mut parts = Vec::new();
        q.gather(&mut parts);
        assert_eq!(parts.len(), 3, "adjacent own bytes are one part");
        drop(parts);
        assert_eq!((q.len(), q.end()), (14, 14));
        q.consumed(5);
        assert_eq!(q.to_vec(), b"3456789cd");
        assert_eq!(q.written(), 5);
        assert_eq!(q.mem_part(0), Some(LostPart { fpdu: 0, msg: Some(4) }));
        q.consumed(9);
        assert!(
            q.is_empty() && q.own.is_empty(),
            "own bytes are freed once all were taken"
        );
    }

    #[test]
    fn truncation_cuts_inside_a_part_and_rollback_undoes_an_fpdu() {
        let (mut q, _m) = queue();
        q.consumed(1);
        q.truncate_at(6);
        assert_eq!(q.to_vec(), b"b0123");
        assert_eq!(q.end(), 6);
        let m = q.mark();
        q.push_bytes(b"xyz");
        q.push_mem(mr(b"q").clone(), 0, 1, 6, None);
        q.rollback(m);
        assert_eq!(q.to_vec(), b"b0123");
        q.push_bytes(b"!");
        assert_eq!(q.to_vec(), b"b0123!");
        q.clear();
        assert_eq!((q.len(), q.written(), q.to_vec()), (0, 1, Vec::new()));
    }

    #[test]
    fn the_crc_since_a_mark_covers_own_and_memory_parts_in_order() {
        let (mut q, m) = queue();
        let mark = q.mark();
        q.push_bytes(b"ef");
        q.push_mem(m.clone(), 2, 5, 14, None);
        q.push_bytes(b"g");
        assert_eq!(q.crc_since(mark), Some(softrdma_wire::crc32c(b"ef23456g")));
        // A mark after a memory part: that part is not this FPDU's.
        let (mut q, m) = queue();
        q.push_mem(m.clone(), 0, 3, 14, None);
        let mark = q.mark();
        q.push_bytes(b"h");
        assert_eq!(q.crc_since(mark), Some(softrdma_wire::crc32c(b"h")));
        m.region.revoke();
        q.push_mem(m, 0, 1, 18, None);
        assert_eq!(q.crc_since(mark), None, "a revoked region has no CRC");
    }

    #[test]
    fn a_long_taken_prefix_of_own_bytes_is_compacted() {
        let m = mr(&[1; 8]);
        let mut q = TxQueue::default();
        q.push_bytes(&vec![7; COMPACT_AT]);
        q.push_mem(m, 0, 8, 0, None);
        q.push_bytes(b"tail");
        q.consumed(COMPACT_AT + 2);
        assert_eq!(q.own.len(), 4, "the taken megabyte is gone");
        assert_eq!(q.to_vec(), [1, 1, 1, 1, 1, 1, b't', b'a', b'i', b'l']);
    }
}
