//! Local buffers: SGEs checked against the key table once (lkey, PD, bounds, LOCAL_WRITE),
//! then gathered from or scattered into by byte offset.

use softrdma_verbs::mr::{KeyError, MrInner};
use softrdma_verbs::QpHost;
use softrdma_verbs::Sge;
use std::sync::Arc;

/// A checked, contiguous piece of a local buffer.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    mr: Arc<MrInner>,
    off: usize,
    len: usize,
}

/// A failed SGE check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SgeError {
    /// The SGE's lkey.
    pub lkey: u32,
    /// What failed.
    pub err: KeyError,
}

impl std::fmt::Display for SgeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lkey {:#x}: {}", self.lkey, self.err)
    }
}

/// Checks every non-empty SGE of a list; `write` requires LOCAL_WRITE (receive and READ sinks).
pub(crate) fn resolve(sges: &[Sge], qp: &dyn QpHost, write: bool) -> Result<Vec<Piece>, SgeError> {
    sges.iter()
        .filter(|s| s.length > 0)
        .map(|s| {
            qp.check_local(s.lkey, s.addr, u64::from(s.length), write)
                .map(|(mr, off)| Piece {
                    mr,
                    off,
                    len: s.length as usize,
                })
                .map_err(|err| SgeError { lkey: s.lkey, err })
        })
        .collect()
}

/// Total bytes of a checked buffer list.
pub(crate) fn capacity(pieces: &[Piece]) -> u64 {
    pieces.iter().map(|p| p.len as u64).sum()
}

/// The bytes of an outgoing message.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    /// Copied at post time (IBV_SEND_INLINE).
    Inline(Vec<u8>),
    /// Checked SGEs, read at transmit time.
    Pieces(Vec<Piece>),
}

impl Payload {
    /// Appends `len` bytes starting at byte `from` of the message to `out`.
    /// False (with `out` unchanged) if the range leaves the message.
    pub(crate) fn gather(&self, from: usize, len: usize, out: &mut Vec<u8>) -> bool {
        match self {
            Payload::Inline(d) => match from.checked_add(len).and_then(|end| d.get(from..end)) {
                Some(bytes) => {
                    out.extend_from_slice(bytes);
                    true
                }
                None => false,
            },
            Payload::Pieces(pieces) => gather(pieces, from, len, out),
        }
    }
}

/// Appends `len` bytes starting at byte `at` of the buffer list to `out`.
/// False (with `out` unchanged) if the range leaves the buffers.
pub(crate) fn gather(pieces: &[Piece], mut at: usize, mut len: usize, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    for p in pieces {
        if len == 0 {
            break;
        }
        if at >= p.len {
            at -= p.len;
            continue;
        }
        let take = (p.len - at).min(len);
        if !p.mr.region.append_to(p.off + at, take, out) {
            out.truncate(start);
            return false;
        }
        len -= take;
        at = 0;
    }
    if len != 0 {
        out.truncate(start);
        return false;
    }
    true
}

/// Copies `data` into the buffer list starting at byte `at`. False if it does not fit
/// (checked before anything is written).
pub(crate) fn scatter(pieces: &[Piece], at: usize, data: &[u8]) -> bool {
    let fits = at
        .checked_add(data.len())
        .is_some_and(|end| end as u64 <= capacity(pieces));
    if !fits {
        return false;
    }
    let (mut at, mut data) = (at, data);
    for p in pieces {
        if data.is_empty() {
            break;
        }
        if at >= p.len {
            at -= p.len;
            continue;
        }
        let take = (p.len - at).min(data.len());
        if !p.mr.region.write(p.off + at, &data[..take]) {
            return false;
        }
        data = &data[take..];
        at = 0;
    }
    data.is_empty()
}
