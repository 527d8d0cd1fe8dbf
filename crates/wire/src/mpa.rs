//! MPA connection setup frames: Request / Reply (RFC 5044 §7.1) with the
//! RFC 6581 enhanced-setup IRD/ORD block.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +---------------------------------------------------------------+
//! |        Key: "MPA ID Req Frame" or "MPA ID Rep Frame" (16)     |
//! +-+-+-+-+-------+---------------+-------------------------------+
//! |M|C|R|E| Res   |     Rev       |          PD_Length            |
//! +-+-+-+-+-------+---------------+-------------------------------+
//! |P|Z|      IRD (14)             |W|R|       ORD (14)            |  <- only if E, rev 2
//! +-+-+---------------------------+-+-+---------------------------+
//! |            Private data (PD_Length bytes in total, <= 512)    |
//! ```
//!
//! The four reserved flag bits are ignored on receive (Linux siw uses one of
//! them) and sent as zero.

use crate::error::{be16, WireError};

/// Key that starts an MPA Request frame.
pub const MPA_REQ_KEY: [u8; 16] = *b"MPA ID Req Frame";
/// Key that starts an MPA Reply frame.
pub const MPA_REP_KEY: [u8; 16] = *b"MPA ID Rep Frame";
/// Fixed header: key (16) + flags (1) + revision (1) + PD_Length (2).
pub const MPA_HEADER_LEN: usize = 20;
/// Largest PD_Length on the wire; includes the 4-byte RFC 6581 IRD/ORD block.
pub const MPA_MAX_PD_LEN: usize = 512;
/// Length of the RFC 6581 IRD/ORD block at the start of the private data.
pub const IRD_ORD_LEN: usize = 4;

const FLAG_MARKERS: u8 = 0x80;
const FLAG_CRC: u8 = 0x40;
const FLAG_REJECT: u8 = 0x20;
const FLAG_ENHANCED: u8 = 0x10;
const IRD_ORD_MASK: u16 = 0x3FFF;

/// Whether a frame is the initiator's Request or the responder's Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpaKind {
    /// `MPA ID Req Frame`.
    Request,
    /// `MPA ID Rep Frame`.
    Reply,
}

impl MpaKind {
    /// The 16-byte key that identifies this kind on the wire.
    pub fn key(self) -> &'static [u8; 16] {
        match self {
            MpaKind::Request => &MPA_REQ_KEY,
            MpaKind::Reply => &MPA_REP_KEY,
        }
    }
}

/// RFC 6581 enhanced connection setup block (first 4 bytes of private data when rev 2 and the 0x10 flag are set).
///
/// `ird` and `ord` are 14-bit fields; [`IrdOrd::to_bytes`] drops higher bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Read queue depth offered (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth requested (14 bits).
    pub ord: u16,
    /// Peer-to-peer mode with a Ready-To-Receive message (0x8000 of the IRD word).
    pub peer_to_peer: bool,
    /// RTR may be a zero-length Send (0x4000 of the IRD word).
    pub zero_length_rtr: bool,
    /// RTR may be a zero-length RDMA Write (0x8000 of the ORD word).
    pub write_rtr: bool,
    /// RTR may be a zero-length RDMA Read (0x4000 of the ORD word).
    pub read_rtr: bool,
}

impl IrdOrd {
    /// Decodes the 4-byte block.
    pub fn from_bytes(b: [u8; 4]) -> IrdOrd {
        let ird = u16::from_be_bytes([b[0], b[1]]);
        let ord = u16::from_be_bytes([b[2], b[3]]);
        IrdOrd {
            ird: ird & IRD_ORD_MASK,
            ord: ord & IRD_ORD_MASK,
            peer_to_peer: ird & 0x8000 != 0,
            zero_length_rtr: ird & 0x4000 != 0,
            write_rtr: ord & 0x8000 != 0,
            read_rtr: ord & 0x4000 != 0,
        }
    }

    /// Encodes the 4-byte block.
    pub fn to_bytes(&self) -> [u8; 4] {
        let bit = |set: bool, v: u16| if set { v } else { 0 };
        let ird = (self.ird & IRD_ORD_MASK) | bit(self.peer_to_peer, 0x8000) | bit(self.zero_length_rtr, 0x4000);
        let ord = (self.ord & IRD_ORD_MASK) | bit(self.write_rtr, 0x8000) | bit(self.read_rtr, 0x4000);
        let [a, b] = ird.to_be_bytes();
        let [c, d] = ord.to_be_bytes();
        [a, b, c, d]
    }
}

/// One MPA Request or Reply frame.
///
/// A revision-2 Request with enhanced setup (RFC 6581), as a soft-iWARP initiator sends it
/// right after the TCP connect, read back from a stream that arrives in two pieces:
///
/// ```
/// use softrdma_wire::{IrdOrd, MpaFrame, MpaKind};
///
/// let req = MpaFrame {
///     kind: MpaKind::Request,
///     markers: false,
///     crc: true,
///     reject: false,
///     revision: 2,
///     enhanced: Some(IrdOrd { ird: 16, ord: 16, ..IrdOrd::default() }),
///     private_data: b"rdma_cm private data".to_vec(),
/// };
/// let mut wire = Vec::new();
/// req.emit(&mut wire)?;
/// assert_eq!(wire.len(), req.wire_len());
/// assert_eq!(MpaFrame::parse(&wire[..10])?, None); // more bytes needed
/// assert_eq!(MpaFrame::parse(&wire)?, Some((req, wire.len())));
/// # Ok::<(), softrdma_wire::WireError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaFrame {
    /// Request or Reply.
    pub kind: MpaKind,
    /// M flag (0x80): markers wanted.
    pub markers: bool,
    /// C flag (0x40): CRC32c wanted.
    pub crc: bool,
    /// R flag (0x20): the responder rejects the connection (Reply only).
    pub reject: bool,
    /// Rev field: 1 for RFC 5044, 2 for RFC 6581.
    pub revision: u8,
    /// Enhanced-setup flag (0x10) and its IRD/ORD block; requires revision 2.
    pub enhanced: Option<IrdOrd>,
    /// User private data, WITHOUT the IrdOrd block.
    pub private_data: Vec<u8>,
}

impl MpaFrame {
    /// Parses one frame at the start of `buf`. Ok(None) = need more bytes. Ok(Some((frame, consumed))).
    ///
    /// Errors: BadMpaKey (as soon as the available bytes differ from both keys),
    /// PrivateDataTooLong (PD_Length > 512, detected from the header alone, before the data arrives),
    /// Malformed (enhanced flag with PD_Length < 4, or enhanced flag with revision != 2).
    pub fn parse(buf: &[u8]) -> Result<Option<(MpaFrame, usize)>, WireError> {
        let seen = &buf[..buf.len().min(16)];
        let kind = if MPA_REQ_KEY.starts_with(seen) {
            MpaKind::Request
        } else if MPA_REP_KEY.starts_with(seen) {
            MpaKind::Reply
        } else {
            return Err(WireError::BadMpaKey);
        };
        if buf.len() < MPA_HEADER_LEN {
            return Ok(None);
        }
        let flags = buf[16];
        let revision = buf[17];
        let pd_len = usize::from(be16(buf, 18));
        if pd_len > MPA_MAX_PD_LEN {
            return Err(WireError::PrivateDataTooLong(pd_len));
        }
        let is_enhanced = flags & FLAG_ENHANCED != 0;
        if is_enhanced && revision != 2 {
            return Err(WireError::Malformed("MPA enhanced flag needs revision 2"));
        }
        if is_enhanced && pd_len < IRD_ORD_LEN {
            return Err(WireError::Malformed("MPA enhanced frame without IRD/ORD block"));
        }
        let total = MPA_HEADER_LEN + pd_len;
        if buf.len() < total {
            return Ok(None);
        }
        let pd = &buf[MPA_HEADER_LEN..total];
        let (enhanced, private_data) = if is_enhanced {
            let block = [pd[0], pd[1], pd[2], pd[3]];
            (Some(IrdOrd::from_bytes(block)), pd[IRD_ORD_LEN..].to_vec())
        } else {
            (None, pd.to_vec())
        };
        let frame = MpaFrame {
            kind,
            markers: flags & FLAG_MARKERS != 0,
            crc: flags & FLAG_CRC != 0,
            reject: flags & FLAG_REJECT != 0,
            revision,
            enhanced,
            private_data,
        };
        Ok(Some((frame, total)))
    }

    /// Appends the frame. Err(PrivateDataTooLong) if 4*enhanced + private_data.len() > 512.
    ///
    /// Also Err(Malformed) for `enhanced` with a revision other than 2, which
    /// [`MpaFrame::parse`] would reject. Nothing is appended on error.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let pd_len = self.pd_len();
        if pd_len > MPA_MAX_PD_LEN {
            return Err(WireError::PrivateDataTooLong(pd_len));
        }
        if self.enhanced.is_some() && self.revision != 2 {
            return Err(WireError::Malformed("MPA enhanced flag needs revision 2"));
        }
        let flag = |set: bool, f: u8| if set { f } else { 0 };
        let flags = flag(self.markers, FLAG_MARKERS)
            | flag(self.crc, FLAG_CRC)
            | flag(self.reject, FLAG_REJECT)
            | flag(self.enhanced.is_some(), FLAG_ENHANCED);
        out.reserve(self.wire_len());
        out.extend_from_slice(self.kind.key());
        out.push(flags);
        out.push(self.revision);
        // pd_len <= 512 was checked above.
        out.extend_from_slice(&(pd_len as u16).to_be_bytes());
        if let Some(io) = &self.enhanced {
            out.extend_from_slice(&io.to_bytes());
        }
        out.extend_from_slice(&self.private_data);
        Ok(())
    }

    /// Bytes [`MpaFrame::emit`] appends: 20 + 4 (if enhanced) + private data.
    pub fn wire_len(&self) -> usize {
        MPA_HEADER_LEN + self.pd_len()
    }

    /// PD_Length as it goes on the wire (IRD/ORD block included).
    fn pd_len(&self) -> usize {
        self.private_data.len() + if self.enhanced.is_some() { IRD_ORD_LEN } else { 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    // samples/good/iwarp_rfc6581.pcap: rev 2, C + enhanced, P2P, write RTR.
    const REQ_V2: &str = "4d504120494420526571204672616d65500200148010801077697265636865636b20726571207064";
    const REP_V2: &str = "4d504120494420526570204672616d65500200148008800877697265636865636b20726570207064";
    // samples/good/iwarp_rfc5044_terminate.pcap: rev 1, C.
    const REQ_V1: &str = "4d504120494420526571204672616d6540010006763120726571";
    const REP_V1: &str = "4d504120494420526570204672616d6540010006763120726570";

    fn roundtrip(bytes: &[u8]) -> MpaFrame {
        let (f, used) = MpaFrame::parse(bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(f.wire_len(), bytes.len());
        let mut out = Vec::new();
        f.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
        f
    }

    #[test]
    fn golden_rfc6581() {
        let req = roundtrip(&hex(REQ_V2));
        assert_eq!(req.kind, MpaKind::Request);
        assert!(req.crc && !req.markers && !req.reject);
        assert_eq!(req.revision, 2);
        let io = req.enhanced.unwrap();
        assert_eq!((io.ird, io.ord), (16, 16));
        assert!(io.peer_to_peer && io.write_rtr && !io.zero_length_rtr && !io.read_rtr);
        assert_eq!(req.private_data, b"wirecheck req pd");

        let rep = roundtrip(&hex(REP_V2));
        assert_eq!(rep.kind, MpaKind::Reply);
        let io = rep.enhanced.unwrap();
        assert_eq!((io.ird, io.ord), (8, 8));
        assert_eq!(rep.private_data, b"wirecheck rep pd");
    }

    #[test]
    fn golden_rfc5044() {
        let req = roundtrip(&hex(REQ_V1));
        assert_eq!(
            req,
            MpaFrame {
                kind: MpaKind::Request,
                markers: false,
                crc: true,
                reject: false,
                revision: 1,
                enhanced: None,
                private_data: b"v1 req".to_vec(),
            }
        );
        assert_eq!(roundtrip(&hex(REP_V1)).kind, MpaKind::Reply);
    }

    #[test]
    fn incremental_and_coalesced() {
        let req = hex(REQ_V2);
        for cut in 0..req.len() {
            assert_eq!(MpaFrame::parse(&req[..cut]), Ok(None), "cut {cut}");
        }
        // Frame followed by the first FPDU bytes: consumed stops at the frame.
        let mut buf = req.clone();
        buf.extend_from_slice(&[0x00, 0x0e, 0xc1]);
        assert_eq!(MpaFrame::parse(&buf).unwrap().unwrap().1, req.len());
    }

    #[test]
    fn errors() {
        assert_eq!(MpaFrame::parse(b"GET / HTTP/1.1\r\n"), Err(WireError::BadMpaKey));
        assert_eq!(MpaFrame::parse(b"MPA ID X"), Err(WireError::BadMpaKey));
        assert_eq!(MpaFrame::parse(b"MPA ID Re"), Ok(None));
        // PD_Length 513 is rejected from the 20-byte header alone.
        let mut h = MPA_REQ_KEY.to_vec();
        h.extend_from_slice(&[0x40, 1, 0x02, 0x01]);
        assert_eq!(MpaFrame::parse(&h), Err(WireError::PrivateDataTooLong(513)));
        // Enhanced with rev 1, and enhanced without room for IRD/ORD.
        let mut h = MPA_REP_KEY.to_vec();
        h.extend_from_slice(&[0x50, 1, 0, 4]);
        assert!(matches!(MpaFrame::parse(&h), Err(WireError::Malformed(_))));
        let mut h = MPA_REP_KEY.to_vec();
        h.extend_from_slice(&[0x50, 2, 0, 3]);
        assert!(matches!(MpaFrame::parse(&h), Err(WireError::Malformed(_))));
    }

    #[test]
    fn reserved_flags_ignored() {
        let mut b = hex(REQ_V1);
        b[16] |= 0x08; // siw's GSO experiment bit
        let (f, _) = MpaFrame::parse(&b).unwrap().unwrap();
        assert!(f.crc && f.enhanced.is_none());
    }

    #[test]
    fn emit_limits() {
        let mut f = MpaFrame {
            kind: MpaKind::Reply,
            markers: true,
            crc: false,
            reject: true,
            revision: 2,
            enhanced: Some(IrdOrd::default()),
            private_data: vec![7; 508],
        };
        let mut out = Vec::new();
        f.emit(&mut out).unwrap();
        assert_eq!(out.len(), 20 + 512);
        assert_eq!(MpaFrame::parse(&out).unwrap().unwrap().0, f);
        f.private_data.push(0);
        let mut out = Vec::new();
        assert_eq!(f.emit(&mut out), Err(WireError::PrivateDataTooLong(513)));
        f.enhanced = None;
        f.emit(&mut out).unwrap();
        assert_eq!(&out[18..20], &[0x01, 0xfd]); // 509
        assert_eq!(out[16], 0xa0);
        let mut out = Vec::new();
        f.revision = 1;
        f.private_data.clear();
        f.enhanced = Some(IrdOrd::default());
        assert!(matches!(f.emit(&mut out), Err(WireError::Malformed(_))));
        assert!(out.is_empty());
    }

    #[test]
    fn ird_ord_bits() {
        let all = IrdOrd {
            ird: 0x3FFF,
            ord: 1,
            peer_to_peer: true,
            zero_length_rtr: true,
            write_rtr: false,
            read_rtr: true,
        };
        assert_eq!(all.to_bytes(), [0xff, 0xff, 0x40, 0x01]);
        assert_eq!(IrdOrd::from_bytes(all.to_bytes()), all);
        let wide = IrdOrd {
            ird: 0xFFFF,
            ..IrdOrd::default()
        };
        assert_eq!(wide.to_bytes(), [0x3f, 0xff, 0, 0]);
    }
}
