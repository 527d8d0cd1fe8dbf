//! RDMAP Terminate message (RFC 5040 §4.8), the payload of an untagged QN=2 segment.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-------+-------+---------------+-+-+-+-------------------------+
//! | Layer | EType |  Error Code   |M|D|R|   Reserved (13 bits)    |
//! +-------+-------+---------------+-+-+-+-------------------------+
//! | DDP Segment Length (if M or D)|  Terminated DDP header (if D) |
//! +-------------------------------+  14 or 18 bytes by its T bit |
//! |  ...  Terminated RDMAP header (if R): 28-byte Read Request    |
//! ```
//!
//! The 16-bit length slot directly precedes the terminated DDP header, as it
//! does in the FPDU the error was found in. It is present when D is set (the
//! layout Wireshark decodes; Linux siw sets M, D and R, in its own bit order) and
//! when M is set (Intel nes/i40iw send M alone with just the length). The
//! value is only meaningful with M ("DDP Segment Length valid"): with D but no
//! M it is sent as zero and ignored on receive. Reserved bits and bytes after
//! the last present field are ignored on receive.
//!
//! Linux siw declares the control word as C bitfields in a `__be32`, so on a
//! little-endian host it sends Layer in the *low* nibble of the first byte and
//! EType in the high one, and M, D, R in bits 0, 1, 2 of the third byte (a
//! READ with a bad STag, as captured from Linux 6.1 siw: `10 00 07 00`, then
//! the length slot and both copied headers). RFC senders never set those three
//! reserved bits; when they are set and the RFC's HdrCt bits are clear, the
//! message is read in siw's order. A siw Terminate without copied headers
//! (RDMAP catastrophic, LLP errors) cannot be told apart and is read in the
//! RFC's order; both readings of those map to the same completion status.

use crate::ddp::{DDP_TAGGED_HDR_LEN, DDP_UNTAGGED_HDR_LEN};
use crate::error::{be16, need, WireError};
use crate::rdmap::{term, READ_REQUEST_LEN};

/// Fixed part of a Terminate message: layer/etype, code, HdrCt + reserved.
pub const TERMINATE_HDR_LEN: usize = 4;
const HDRCT_M: u8 = 0x80;
const HDRCT_D: u8 = 0x40;
const HDRCT_R: u8 = 0x20;
/// Where Linux siw's little-endian bitfields put M, D and R (see the module text).
const SIW_LE_M: u8 = 0x01;
const SIW_LE_D: u8 = 0x02;
const SIW_LE_R: u8 = 0x04;

/// The layer that detected the error (high nibble of the first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermLayer {
    /// RDMAP (RFC 5040).
    Rdmap = 0,
    /// DDP (RFC 5041).
    Ddp = 1,
    /// Lower layer: MPA / TCP (RFC 5044).
    Llp = 2,
}

impl TermLayer {
    /// Decodes the 4-bit layer value; others are Malformed.
    pub fn from_u8(v: u8) -> Result<TermLayer, WireError> {
        match v {
            0 => Ok(TermLayer::Rdmap),
            1 => Ok(TermLayer::Ddp),
            2 => Ok(TermLayer::Llp),
            _ => Err(WireError::Malformed("unknown Terminate layer")),
        }
    }

    /// Short name: "RDMAP", "DDP" or "LLP".
    pub fn name(self) -> &'static str {
        match self {
            TermLayer::Rdmap => "RDMAP",
            TermLayer::Ddp => "DDP",
            TermLayer::Llp => "LLP",
        }
    }
}

/// Terminate message (RFC 5040 §4.8), the payload of an untagged QN=2 segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminate {
    /// Layer that detected the error.
    pub layer: TermLayer,
    /// Error type (4 bits; see [`term`]).
    pub etype: u8,
    /// Error code (see [`term`]).
    pub ecode: u8,
    /// M flag: the DDP Segment Length of the offending segment.
    pub ddp_segment_len: Option<u16>,
    /// D flag: the terminated DDP header, 14 or 18 bytes by its T bit.
    pub ddp_header: Option<Vec<u8>>,
    /// R flag: the terminated RDMAP header (28 bytes, a Read Request).
    pub rdmap_header: Option<Vec<u8>>,
}

impl Terminate {
    /// A Terminate without any copied headers.
    pub fn new(layer: TermLayer, etype: u8, ecode: u8) -> Terminate {
        Terminate {
            layer,
            etype,
            ecode,
            ddp_segment_len: None,
            ddp_header: None,
            rdmap_header: None,
        }
    }

    /// Parses a Terminate payload (the ULPDU after the 18-byte untagged header).
    pub fn parse(b: &[u8]) -> Result<Terminate, WireError> {
        need("Terminate header", b, TERMINATE_HDR_LEN)?;
        let siw_le = b[2] & (HDRCT_M | HDRCT_D | HDRCT_R) == 0 && b[2] & (SIW_LE_M | SIW_LE_D | SIW_LE_R) != 0;
        let (layer, etype, hdrct) = if siw_le {
            let bit = |set: u8, f: u8| if b[2] & set != 0 { f } else { 0 };
            let hdrct = bit(SIW_LE_M, HDRCT_M) | bit(SIW_LE_D, HDRCT_D) | bit(SIW_LE_R, HDRCT_R);
            (b[0] & 0x0F, b[0] >> 4, hdrct)
        } else {
            (b[0] >> 4, b[0] & 0x0F, b[2])
        };
        let mut t = Terminate::new(TermLayer::from_u8(layer)?, etype, b[1]);
        let mut at = TERMINATE_HDR_LEN;
        if hdrct & (HDRCT_M | HDRCT_D) != 0 {
            need("Terminate DDP Segment Length", b, at + 2)?;
            if hdrct & HDRCT_M != 0 {
                t.ddp_segment_len = Some(be16(b, at));
            }
            at += 2;
        }
        if hdrct & HDRCT_D != 0 {
            const WHAT: &str = "terminated DDP header";
            need(WHAT, b, at + 1)?;
            let len = if b[at] & 0x80 != 0 {
                DDP_TAGGED_HDR_LEN
            } else {
                DDP_UNTAGGED_HDR_LEN
            };
            need(WHAT, b, at + len)?;
            t.ddp_header = Some(b[at..at + len].to_vec());
            at += len;
        }
        if hdrct & HDRCT_R != 0 {
            need("terminated RDMAP header", b, at + READ_REQUEST_LEN)?;
            t.rdmap_header = Some(b[at..at + READ_REQUEST_LEN].to_vec());
        }
        Ok(t)
    }

    /// Appends the message. `etype` is truncated to 4 bits; the copied headers
    /// are written as given (callers supply 14/18 and 28 bytes).
    pub fn emit(&self, out: &mut Vec<u8>) {
        let flag = |set: bool, f: u8| if set { f } else { 0 };
        let hdrct = flag(self.ddp_segment_len.is_some(), HDRCT_M)
            | flag(self.ddp_header.is_some(), HDRCT_D)
            | flag(self.rdmap_header.is_some(), HDRCT_R);
        out.reserve(self.wire_len());
        out.push(((self.layer as u8) << 4) | (self.etype & 0x0F));
        out.push(self.ecode);
        out.push(hdrct);
        out.push(0);
        if hdrct & (HDRCT_M | HDRCT_D) != 0 {
            out.extend_from_slice(&self.ddp_segment_len.unwrap_or(0).to_be_bytes());
        }
        if let Some(h) = &self.ddp_header {
            out.extend_from_slice(h);
        }
        if let Some(h) = &self.rdmap_header {
            out.extend_from_slice(h);
        }
    }

    /// Bytes [`Terminate::emit`] appends.
    pub fn wire_len(&self) -> usize {
        let slot = self.ddp_segment_len.is_some() || self.ddp_header.is_some();
        TERMINATE_HDR_LEN
            + if slot { 2 } else { 0 }
            + self.ddp_header.as_ref().map_or(0, Vec::len)
            + self.rdmap_header.as_ref().map_or(0, Vec::len)
    }

    /// Human text, e.g. "RDMAP remote protection error: invalid STag".
    pub fn describe(&self) -> String {
        let layer = self.layer.name();
        let Some(etype) = term::etype_name(self.layer, self.etype) else {
            return format!("{layer} error type {:#x}, code {:#04x}", self.etype, self.ecode);
        };
        match term::code_name(self.layer, self.etype, self.ecode) {
            Some(code) => format!("{layer} {etype}: {code}"),
            None => format!("{layer} {etype}: code {:#04x}", self.ecode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ddp::SegmentHeader;
    use crate::fpdu::{emit_fpdu, parse_fpdu};
    use crate::rdmap::Opcode;
    use crate::testutil::hex;

    /// samples/good/iwarp_rfc5044_terminate.pcap: RDMAP remote protection /
    /// invalid STag, D set (M clear) with the length slot 0x000e, then the
    /// 14-byte tagged header of the offending RDMA Write.
    const GOLDEN_FPDU: &str =
        "002641470000000000000002000000010000000001004000000ec14000dead000000000000001000001530b5";

    #[test]
    fn golden_terminate() {
        let fpdu = hex(GOLDEN_FPDU);
        let f = parse_fpdu(&fpdu, true).unwrap().unwrap();
        let (hdr, n) = SegmentHeader::parse(f.ulpdu).unwrap();
        assert_eq!(hdr.opcode, Opcode::Terminate);
        let payload = &f.ulpdu[n..];
        let t = Terminate::parse(payload).unwrap();
        assert_eq!(t.layer, TermLayer::Rdmap);
        assert_eq!(t.etype, term::rdmap::REMOTE_PROTECTION);
        assert_eq!(t.ecode, term::rdmap::INVALID_STAG);
        assert_eq!(t.ddp_segment_len, None); // M clear: slot not valid
        assert_eq!(t.ddp_header, Some(hex("c14000dead000000000000001000")));
        assert_eq!(t.rdmap_header, None);
        assert_eq!(t.describe(), "RDMAP remote protection error: invalid STag");
        // Re-emit: identical except the slot, which is zero when M is clear.
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(out.len(), payload.len());
        assert_eq!(&out[..4], &payload[..4]);
        assert_eq!(&out[4..6], &[0, 0]);
        assert_eq!(&out[6..], &payload[6..]);
        // With M set the whole FPDU round-trips byte for byte.
        let t = Terminate {
            ddp_segment_len: Some(0x000e),
            ..t
        };
        let mut body = Vec::new();
        hdr.emit(&mut body);
        t.emit(&mut body);
        let mut again = Vec::new();
        emit_fpdu(&[&body], true, &mut again).unwrap();
        assert_eq!(Terminate::parse(&body[n..]).unwrap(), t);
        assert_eq!(body[n + 2], 0xC0);
        body[n + 2] = 0x40;
        let mut orig = Vec::new();
        emit_fpdu(&[&body], true, &mut orig).unwrap();
        assert_eq!(orig, fpdu);
    }

    fn read_request_term() -> Terminate {
        let ddp = hex("414100000000000000010000000700000000");
        Terminate {
            layer: TermLayer::Rdmap,
            etype: term::rdmap::REMOTE_PROTECTION,
            ecode: term::rdmap::BASE_BOUNDS,
            ddp_segment_len: Some(46),
            ddp_header: Some(ddp),
            rdmap_header: Some((0..28).collect()),
        }
    }

    #[test]
    fn roundtrip_all_flags() {
        let t = read_request_term();
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(out.len(), 4 + 2 + 18 + 28);
        assert_eq!(out.len(), t.wire_len());
        assert_eq!(&out[..6], &[0x01, 0x01, 0xE0, 0x00, 0x00, 46]);
        assert_eq!(Terminate::parse(&out).unwrap(), t);
        for cut in 0..out.len() {
            assert!(matches!(
                Terminate::parse(&out[..cut]),
                Err(WireError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn flag_combinations() {
        // M only: just the length (Intel style).
        let mut t = Terminate::new(TermLayer::Ddp, term::ddp::UNTAGGED_BUFFER, 5);
        t.ddp_segment_len = Some(9000);
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(out, [0x12, 0x05, 0x80, 0x00, 0x23, 0x28]);
        assert_eq!(Terminate::parse(&out).unwrap(), t);
        // No flags: 4 bytes; trailing bytes and reserved bits are ignored.
        let t = Terminate::new(TermLayer::Llp, term::llp::MPA, term::llp::CRC_ERROR);
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(out, [0x20, 0x02, 0x00, 0x00]);
        out[3] = 0xff;
        out.extend_from_slice(&[1, 2, 3]);
        assert_eq!(Terminate::parse(&out).unwrap(), t);
        // R only.
        let mut t = Terminate::new(TermLayer::Rdmap, 2, 0xff);
        t.rdmap_header = Some(vec![0xab; 28]);
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(out.len(), 32);
        assert_eq!(Terminate::parse(&out).unwrap(), t);
    }

    /// The Terminate Linux 6.1 siw (x86) sent for a READ whose source STag
    /// 0xfffffe42 it never gave out (kernel_peer `peer_error::iw-bad-rkey`):
    /// its little-endian bit order, then the length slot, the Read Request's
    /// untagged DDP header (siw puts the READ's length, 0x1000, in its MSN) and
    /// its RDMAP header.
    const SIW_LE_TERMINATE: &str = "1000070000004141000000000000000100001000000000003758790000005\
         5bfbae2610000001000fffffe420000000000001000";

    #[test]
    fn linux_siw_little_endian_terminate() {
        let b = hex(SIW_LE_TERMINATE);
        let t = Terminate::parse(&b).unwrap();
        assert_eq!(t.layer, TermLayer::Rdmap);
        assert_eq!(t.etype, term::rdmap::REMOTE_PROTECTION);
        assert_eq!(t.ecode, term::rdmap::INVALID_STAG);
        assert_eq!(t.ddp_segment_len, Some(0));
        assert_eq!(t.ddp_header, Some(b[6..24].to_vec()));
        let rreq = t.rdmap_header.as_deref().unwrap();
        assert_eq!(rreq.len(), 28);
        assert_eq!(&rreq[16..20], &[0xff, 0xff, 0xfe, 0x42]); // the source STag
        assert_eq!(t.describe(), "RDMAP remote protection error: invalid STag");
        // What softrdma sends for the same error is the RFC's order, and reads back the same.
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(&out[..4], &[0x01, 0x00, 0xE0, 0x00]);
        assert_eq!(Terminate::parse(&out).unwrap(), t);
        // Only the low three bits mark siw's order: other reserved bits change nothing.
        let mut rfc = out.clone();
        rfc[2] |= 0x18;
        rfc[3] = 0xff;
        assert_eq!(Terminate::parse(&rfc).unwrap(), t);
    }

    #[test]
    fn errors_and_describe() {
        assert!(matches!(
            Terminate::parse(&[0x30, 0, 0, 0]),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            Terminate::parse(&[0x01, 0]),
            Err(WireError::Truncated { need: 4, .. })
        ));
        let d = |l, e, c| Terminate::new(l, e, c).describe();
        assert_eq!(
            d(TermLayer::Ddp, 2, 6),
            "DDP untagged buffer error: invalid DDP version"
        );
        assert_eq!(d(TermLayer::Llp, 0, 2), "LLP MPA error: MPA CRC error");
        assert_eq!(
            d(TermLayer::Rdmap, 0, 0xff),
            "RDMAP local catastrophic error: unspecified error"
        );
        assert_eq!(d(TermLayer::Rdmap, 2, 0x42), "RDMAP remote operation error: code 0x42");
        assert_eq!(d(TermLayer::Ddp, 7, 1), "DDP error type 0x7, code 0x01");
    }
}
