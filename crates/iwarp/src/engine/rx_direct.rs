//! Direct placement: the payload of a large segment (an RDMA WRITE, a Read Response into a
//! READ's sink, or a SEND into its receive buffer) goes from the socket straight into the
//! target MR, as siw places received payload.
//!
//! When the buffered bytes end inside such an FPDU and its header has arrived, the engine
//! makes the checks the complete FPDU would get (a WRITE: the STag over the whole payload; a
//! Read Response: the oldest READ's next offset, inside one SGE of its sink; a SEND: its
//! queue, MSN and MO, the receive WR it takes and that WR's capacity, then the next offset
//! inside one SGE), places the payload bytes already buffered, and offers the rest of the
//! payload as the first part of the next receive ([`Engine::rx_scatter`], then
//! [`Engine::rx_received`]). Without MPA CRC the pad and CRC field after it are skipped when
//! they arrive; a Read Response's READ, or a SEND's receive WR, completes then if it was the
//! last segment. With MPA CRC the CRC32c runs over the FPDU as it arrives (the length field,
//! the header and buffered payload from the buffer, the placed payload read back from the MR
//! in 4 KiB pieces, as siw computes it over the pages it placed into), and the READ or receive
//! WR completes only once the CRC field matched; a mismatch is the buffered path's Terminate
//! (MPA CRC error), the placed bytes stay (as in siw), and the WR is flushed, not completed.
//! A WRITE or Read Response that fails a check, a segment spanning two SGEs, or a payload
//! under [`DIRECT_MIN`] waits in the buffer for the whole FPDU as before, so its error is
//! found and reported as before. A SEND's checks depend on its header alone: one that fails
//! them gets its Terminate (and its receive WR's completion) when the header arrives, with the
//! same codes and message as the whole FPDU would. A target that became inaccessible while
//! the payload arrives (deregistered, or unmapped: EFAULT, with the stream left unread) ends in
//! the Terminate a buffered segment would get.

use super::{Engine, Phase, Piece};
use softrdma_verbs::memory::socket_io::Scatter;
use softrdma_verbs::mr::MrInner;
use softrdma_wire::{
    fpdu_wire_len, Crc32c, DdpHeader, Opcode, SegmentHeader, DDP_TAGGED_HDR_LEN, DDP_UNTAGGED_HDR_LEN, FPDU_CRC_LEN,
};
use std::sync::Arc;

/// Smallest payload placed directly (below it, one copy costs less than the extra
/// receive call the split makes).
pub(crate) const DIRECT_MIN: usize = 16 * 1024;

/// A payload being received into its MR.
#[derive(Debug)]
pub(crate) struct Direct {
    mr: Arc<MrInner>,
    /// Region offset of the next payload byte.
    off: usize,
    /// Payload bytes still to come.
    left: usize,
    /// Pad and CRC field after the payload.
    trailer: usize,
    /// With MPA CRC: the CRC32c of the FPDU's bytes so far.
    crc: Option<Crc32c>,
    /// The segment's DDP and RDMAP header (a Terminate echoes it).
    header: Vec<u8>,
    /// Payload length.
    len: usize,
    kind: Kind,
}

/// What the payload is.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Write {
        stag: u32,
        to: u64,
    },
    /// For the oldest READ outstanding; `last`: its final segment.
    ReadResponse {
        last: bool,
    },
    /// A segment of the SEND in progress (its receive WR taken, its checks made); `last`: the
    /// message's final segment.
    Send {
        op: Opcode,
        inval_stag: u32,
        last: bool,
    },
}

impl Engine {
    /// Where the next socket bytes go: the receive buffer (at least 4 KiB, more while
    /// receives fill it); or, while a
    /// payload is placed directly, the rest of it in its MR, then only its pad and CRC field
    /// and the next FPDU's header in the buffer. A stream of large WRITEs then takes one
    /// receive call per FPDU and no copy: each call ends where the next payload starts.
    pub fn rx_scatter<'a>(&'a mut self, out: &mut Vec<Scatter<'a>>) {
        self.grow_rx(super::rx::RX_FREE_MIN);
        let Engine { direct, rx, rx_len, .. } = self;
        let mut end = rx.len();
        if let Some(d) = direct {
            out.push(Scatter::Region {
                region: &d.mr.region,
                offset: d.off,
                len: d.left,
            });
            // The next FPDU's header is most likely of the same kind (a stream of SENDs or
            // of WRITEs): read exactly that far. If it is not, a WRITE's tagged header comes
            // with 4 payload bytes (copied), or a SEND's untagged one is short (its segment is
            // then buffered, as after any short segment).
            let next_header = match d.kind {
                Kind::Send { .. } => DDP_UNTAGGED_HDR_LEN,
                _ => DDP_TAGGED_HDR_LEN,
            };
            end = end.min(*rx_len + d.trailer + 2 + next_header);
        }
        out.push(Scatter::Bytes(&mut rx[*rx_len..end]));
    }

    /// `n` bytes arrived through [`Engine::rx_scatter`]: the direct part first, then the buffer.
    pub fn rx_received(&mut self, n: usize) {
        let direct = self.direct.as_ref().map_or(0, |d| d.left.min(n));
        if direct > 0 {
            self.stats.rx_bytes += direct as u64;
            if !self.fold_placed(direct) {
                self.rx_direct_lost("it could not be read back for the MPA CRC");
            } else {
                self.direct_placed(direct);
            }
        }
        if n > direct {
            self.rx_commit(n - direct);
        }
    }

    /// The MR part of [`Engine::rx_scatter`] could not be written (`cause`): the segment ends
    /// in the Terminate a buffered one would get.
    pub fn rx_direct_lost(&mut self, cause: &str) {
        let Some(d) = self.direct.take() else { return };
        match d.kind {
            Kind::Write { stag, to } => self.write_target_lost(stag, to, d.len, &d.header, Some(cause)),
            Kind::ReadResponse { .. } => self.read_sink_lost(&d.header, Some(cause)),
            Kind::Send { .. } => self.recv_buffer_lost(&d.header, Some(cause)),
        }
    }

    /// With MPA CRC, folds the next `n` payload bytes, just placed in the MR, into the FPDU's
    /// CRC (read back through [`softrdma_verbs::memory::MemRegion::read_chunks`]). False if
    /// the MR could not be read.
    fn fold_placed(&mut self, n: usize) -> bool {
        match self.direct.as_mut() {
            Some(Direct {
                mr,
                off,
                crc: Some(crc),
                ..
            }) => mr.region.read_chunks(*off, n, |c| crc.update(c)),
            _ => true,
        }
    }

    /// `n` more payload bytes are in the MR (and, with CRC, in its CRC).
    fn direct_placed(&mut self, n: usize) {
        let Some(d) = self.direct.as_mut() else { return };
        d.off += n;
        d.left -= n;
        self.stats.rx_placed += n as u64;
        if d.left > 0 {
            return;
        }
        let Some(d) = self.direct.take() else {
            return;
        };
        if d.crc.is_some() {
            // Completes once the CRC field arrived and matched (`check_trailer`).
            self.crc_pending = Some(d);
            return;
        }
        self.rx_skip = d.trailer;
        self.direct_done(d);
    }

    /// A directly placed FPDU is whole (and its CRC, if any, matched).
    fn direct_done(&mut self, d: Direct) {
        self.stats.rx_fpdus += 1;
        match d.kind {
            Kind::Write { .. } => {}
            Kind::ReadResponse { last } => self.read_response_placed(d.len, last),
            Kind::Send { op, inval_stag, last } => self.send_placed(op, inval_stag, d.len, last, &d.header),
        }
    }

    /// Buffered bytes from `pos` on that belong to a direct placement still open (a caller
    /// that read into the buffer only): placed with one copy. Returns the new position.
    pub(super) fn direct_from_buffer(&mut self, pos: usize) -> usize {
        let Some(d) = &mut self.direct else { return pos };
        let take = d.left.min(self.rx_len - pos);
        let bytes = &self.rx[pos..pos + take];
        if !d.mr.region.write(d.off, bytes) {
            self.rx_direct_lost("a copy into it failed");
            return self.rx_len;
        }
        if let Some(crc) = &mut d.crc {
            crc.update(bytes);
        }
        self.direct_placed(take);
        pos + take
    }

    /// The pad and CRC field of a directly placed FPDU, from `pos` on. Returns the new position.
    pub(super) fn skip_trailer(&mut self, pos: usize) -> usize {
        let skip = self.rx_skip.min(self.rx_len - pos);
        self.rx_skip -= skip;
        pos + skip
    }

    /// With MPA CRC, the pad and CRC field of a directly placed FPDU, once all of it is
    /// buffered from `pos` on: a match completes what the FPDU completes, a mismatch is the
    /// Terminate a buffered FPDU would get. Returns the new position (`pos` while the field is
    /// incomplete; [`Engine::rx_commit`] keeps those bytes and waits).
    pub(super) fn check_trailer(&mut self, pos: usize) -> usize {
        let Some(d) = &self.crc_pending else { return pos };
        if self.rx_len - pos < d.trailer {
            return pos;
        }
        let Some(mut d) = self.crc_pending.take() else {
            return pos;
        };
        let pad = d.trailer - FPDU_CRC_LEN;
        let field = &self.rx[pos + pad..pos + d.trailer];
        let got = u32::from_le_bytes([field[0], field[1], field[2], field[3]]);
        let mut crc = d.crc.take().unwrap_or_default();
        crc.update(&self.rx[pos..pos + pad]);
        let computed = crc.finish();
        if got != computed {
            self.stats.rx_fpdus += 1;
            self.mpa_crc_error(got, computed, " (payload placed directly into its MR)");
        } else {
            self.direct_done(d);
        }
        pos + pad + FPDU_CRC_LEN
    }

    /// The buffer from `pos` holds the start of an FPDU, not all of it: if it is a large WRITE,
    /// Read Response or SEND that passes its checks, start placing it directly. Returns the new position.
    pub(super) fn try_direct(&mut self, pos: usize) -> usize {
        if self.phase != Phase::Running || self.direct.is_some() || self.rx_skip > 0 || self.crc_pending.is_some() {
            return pos;
        }
        let buf = &self.rx[pos..self.rx_len];
        let Some((len, rest)) = buf.split_first_chunk::<2>() else {
            return pos;
        };
        let ulpdu_len = usize::from(u16::from_be_bytes(*len));
        let Ok((h, hlen)) = SegmentHeader::parse(rest) else {
            return pos;
        };
        let Some(payload_len) = ulpdu_len.checked_sub(hlen) else {
            return pos;
        };
        let have = rest.len() - hlen;
        if payload_len < DIRECT_MIN || have >= payload_len {
            return pos;
        }
        let header = rest[..hlen].to_vec();
        // As for every FPDU received (see `on_ulpdu`): the peer has started sending (a
        // Terminate for a SEND that fails its checks here must not wait for that).
        self.tx_enabled = true;
        self.await_rtr = false;
        let (target, kind) = match (h.opcode, h.ddp) {
            (Opcode::RdmaWrite, DdpHeader::Tagged { stag, to }) => {
                (self.write_check(stag, to, payload_len).1.ok(), Kind::Write { stag, to })
            }
            (Opcode::ReadResponse, DdpHeader::Tagged { to, .. }) => (
                self.read_response_target(to, payload_len),
                Kind::ReadResponse { last: h.last },
            ),
            (
                op @ (Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate),
                DdpHeader::Untagged {
                    inval_stag,
                    qn,
                    msn,
                    mo,
                },
            ) => (
                self.send_target(qn, msn, mo, payload_len, &header),
                Kind::Send {
                    op,
                    inval_stag,
                    last: h.last,
                },
            ),
            _ => return pos,
        };
        let Some((mr, off)) = target else { return pos };
        let start = pos + 2 + hlen;
        if !mr.region.write(off, &self.rx[start..self.rx_len]) {
            return pos;
        }
        // The CRC so far: the length field, the header and the payload bytes buffered.
        let crc = self.cfg.crc.then(|| {
            let mut c = Crc32c::default();
            c.update(&self.rx[pos..self.rx_len]);
            c
        });
        self.stats.rx_placed += have as u64;
        self.direct = Some(Direct {
            mr,
            off: off + have,
            left: payload_len - have,
            trailer: fpdu_wire_len(ulpdu_len) - 2 - ulpdu_len,
            crc,
            header,
            len: payload_len,
            kind,
        });
        self.rx_len
    }

    /// A SEND segment's target: its checks ([`Engine::send_accept`], which takes the receive WR
    /// for a first segment and sends the Terminate of a segment that fails them), then the
    /// receive buffer at the message's next offset, if the payload lies inside one SGE. A
    /// segment that spans two SGEs is left to the buffered path, whose checks then pass again.
    fn send_target(&mut self, qn: u32, msn: u32, mo: u32, len: usize, header: &[u8]) -> Option<(Arc<MrInner>, usize)> {
        if !self.send_accept(qn, msn, mo, len, header) {
            return None;
        }
        let r = self.cur_recv.as_ref()?;
        inside_one_piece(&r.dst, r.received, len)
    }

    /// A Read Response's target: the oldest READ's sink at its next offset (`on_read_response`'s
    /// check), if the payload lies inside one SGE.
    fn read_response_target(&self, to: u64, len: usize) -> Option<(Arc<MrInner>, usize)> {
        let entry = self.orq.front()?;
        let at = entry.offset_of(to);
        if !entry.fits(at, len) {
            return None;
        }
        inside_one_piece(&entry.dst, at, len)
    }
}

/// Where `len` bytes at offset `at` of a scatter list (a READ's sink, a receive WR's buffer)
/// go, if they lie inside one piece: its MR and the region offset.
fn inside_one_piece(pieces: &[Piece], mut at: usize, len: usize) -> Option<(Arc<MrInner>, usize)> {
    for p in pieces {
        if at < p.len {
            return (at + len <= p.len).then(|| (p.mr.clone(), p.off + at));
        }
        at -= p.len;
    }
    None
}
