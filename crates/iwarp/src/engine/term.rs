//! Terminate messages: building them for local errors and mapping received ones to statuses.

use super::{Engine, Phase};
use softrdma_verbs::mr::KeyError;
use softrdma_verbs::WcStatus;
use softrdma_wire::{term, DdpHeader, Opcode, SegmentHeader, TermLayer, Terminate};

/// The completion status a requester reports for a received Terminate.
///
/// Protection errors (bad STag, bounds, rights, PD) are REM_ACCESS_ERR; a message longer than
/// the posted receive buffer is REM_INV_REQ_ERR; everything else (no receive buffer posted,
/// bad opcode or version, stream errors) is REM_OP_ERR.
pub fn terminate_status(t: &Terminate) -> WcStatus {
    match t.layer {
        TermLayer::Rdmap if t.etype == term::rdmap::REMOTE_PROTECTION => WcStatus::RemAccessErr,
        TermLayer::Ddp if t.etype == term::ddp::TAGGED_BUFFER => WcStatus::RemAccessErr,
        TermLayer::Ddp if t.etype == term::ddp::UNTAGGED_BUFFER && t.ecode == term::ddp::untagged::MSG_TOO_LONG => {
            WcStatus::RemInvReqErr
        }
        _ => WcStatus::RemOpErr,
    }
}

/// `vendor_err` value carrying the Terminate's layer, type and code.
pub fn vendor_err(t: &Terminate) -> u32 {
    ((t.layer as u32) << 16) | ((t.etype as u32) << 8) | t.ecode as u32
}

/// Terminate fields for a failed tagged access (RDMA WRITE placement or READ source).
pub fn tagged_error(e: KeyError) -> (TermLayer, u8, u8) {
    match e {
        KeyError::InvalidKey => (
            TermLayer::Ddp,
            term::ddp::TAGGED_BUFFER,
            term::ddp::tagged::INVALID_STAG,
        ),
        KeyError::Bounds => (TermLayer::Ddp, term::ddp::TAGGED_BUFFER, term::ddp::tagged::BASE_BOUNDS),
        KeyError::WrongPd => (
            TermLayer::Ddp,
            term::ddp::TAGGED_BUFFER,
            term::ddp::tagged::STAG_NOT_ASSOC,
        ),
        KeyError::Rights => (
            TermLayer::Rdmap,
            term::rdmap::REMOTE_PROTECTION,
            term::rdmap::ACCESS_RIGHTS,
        ),
    }
}

/// Terminate fields for a failed READ source check (RDMAP remote protection, RFC 5040 §7).
pub fn read_error(e: KeyError) -> (TermLayer, u8, u8) {
    let code = match e {
        KeyError::InvalidKey => term::rdmap::INVALID_STAG,
        KeyError::Bounds => term::rdmap::BASE_BOUNDS,
        KeyError::Rights => term::rdmap::ACCESS_RIGHTS,
        KeyError::WrongPd => term::rdmap::STAG_NOT_ASSOC,
    };
    (TermLayer::Rdmap, term::rdmap::REMOTE_PROTECTION, code)
}

impl Engine {
    /// Sends a Terminate naming the offending segment, moves the QP to ERR and stops.
    /// `offending` is the ULPDU that caused it (its DDP and RDMAP headers are echoed).
    pub(crate) fn send_terminate(
        &mut self,
        (layer, etype, ecode): (TermLayer, u8, u8),
        offending: Option<&[u8]>,
        why: String,
    ) {
        if self.phase != Phase::Running {
            return;
        }
        let mut t = Terminate::new(layer, etype, ecode);
        if let Some(ulpdu) = offending {
            if let Ok((h, hlen)) = SegmentHeader::parse(ulpdu) {
                // Wireshark sizes the echoed DDP header by the error type (1 = tagged), not by its
                // T bit; echo a tagged header only with that type so captures decode cleanly.
                let tagged = matches!(h.ddp, DdpHeader::Tagged { .. });
                let decodable = !tagged || etype == 1;
                if decodable {
                    t.ddp_header = Some(ulpdu[..hlen].to_vec());
                }
                if decodable && h.opcode == Opcode::ReadRequest && ulpdu.len() >= hlen + softrdma_wire::READ_REQUEST_LEN
                {
                    t.rdmap_header = Some(ulpdu[hlen..hlen + softrdma_wire::READ_REQUEST_LEN].to_vec());
                }
            }
        }
        tracing::warn!(qpn = self.qp.qpn(), terminate = %t.describe(), %why, "sending Terminate");
        // Drop the partly sent message: nothing after the Terminate may follow it.
        self.cur = None;
        let msn = self.term_msn;
        self.term_msn = self.term_msn.wrapping_add(1);
        let hdr = SegmentHeader::terminate(msn);
        let len = t.wire_len();
        self.emit_segment(&hdr, len, |out| t.emit(out));
        self.stats.terminates_sent += 1;
        self.fail_all(None, WcStatus::WrFlushErr, 0, why);
        self.phase = Phase::Terminating;
    }

    /// Handles a Terminate from the peer: the WR it names fails, the rest flush.
    pub(crate) fn on_terminate(&mut self, t: Terminate) {
        self.stats.terminates_received += 1;
        let status = terminate_status(&t);
        let named = t
            .ddp_header
            .as_deref()
            .and_then(|h| SegmentHeader::parse(h).ok())
            .map(|(h, _)| h);
        use super::inflight::Kind;
        let exact = self.inflight.find_target(named.is_some(), |k| match (named, k) {
            (
                Some(SegmentHeader {
                    ddp: DdpHeader::Tagged { stag, .. },
                    opcode: Opcode::RdmaWrite,
                    ..
                }),
                Kind::Write { stag: s },
            ) => stag == *s,
            (
                Some(SegmentHeader {
                    ddp: DdpHeader::Untagged { qn: 0, msn, .. },
                    ..
                }),
                Kind::Send { msn: m },
            ) => msn == *m,
            (
                Some(SegmentHeader {
                    ddp: DdpHeader::Untagged { qn: 1, msn, .. },
                    ..
                }),
                Kind::Read { msn: m },
            ) => msn == *m,
            _ => false,
        });
        // Linux siw copies a READ's length into the MSN of the Read Request it sends back: one
        // that matches no READ by MSN names the oldest outstanding READ, the one the peer was
        // serving (READs are answered in order).
        let target = exact.or_else(|| match named? {
            SegmentHeader {
                ddp: DdpHeader::Untagged { qn: 1, .. },
                ..
            } => self.inflight.find_target(true, |k| matches!(k, Kind::Read { .. })),
            _ => None,
        });
        let why = format!("QP {}: peer sent Terminate: {}", self.qp.qpn(), t.describe());
        tracing::warn!(qpn = self.qp.qpn(), terminate = %t.describe(), "received Terminate");
        self.fail_all(target, status, vendor_err(&t), why);
    }
}
