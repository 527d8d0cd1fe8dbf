//! DDP segment header (RFC 5041 §4) together with the RDMAP control byte
//! (RFC 5040 §4.1), which is the second byte of every DDP header.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-------+---+---+---+-------+-------------------------------+
//! |T|L| Rsvd  |DV |RV |Rsv|Opcode | Tagged: STag (32), TO (64)    |
//! +-+-+-------+---+---+---+-------+ Untagged: RsvdULP/Inval STag  |
//! |                               |  (32), QN, MSN, MO (32 each)  |
//! ```

use crate::error::{be32, be64, need, WireError};
use crate::rdmap::Opcode;

/// Tagged header: ctrl (2) + STag (4) + TO (8).
pub const DDP_TAGGED_HDR_LEN: usize = 14;
/// Untagged header: ctrl (2) + RsvdULP/Inval STag (4) + QN (4) + MSN (4) + MO (4).
pub const DDP_UNTAGGED_HDR_LEN: usize = 18;
/// Untagged queue for Send messages.
pub const QN_SEND: u32 = 0;
/// Untagged queue for RDMA Read Request messages.
pub const QN_READ_REQUEST: u32 = 1;
/// Untagged queue for Terminate messages.
pub const QN_TERMINATE: u32 = 2;
/// The only DDP version (DV) defined, RFC 5041.
pub const DDP_VERSION: u8 = 1;
/// The only RDMAP version (RV) defined, RFC 5040.
pub const RDMAP_VERSION: u8 = 1;

const T_FLAG: u8 = 0x80;
const L_FLAG: u8 = 0x40;
const DDP_RSVD: u8 = 0x3C;
const DV_MASK: u8 = 0x03;
const RDMAP_RSVD: u8 = 0x30;
const OPCODE_MASK: u8 = 0x0F;

/// The buffer-model specific part of a DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpHeader {
    /// Tagged buffer model (T=1): the data sink's STag and Tagged Offset.
    Tagged {
        /// Data sink steering tag.
        stag: u32,
        /// Data sink tagged offset.
        to: u64,
    },
    /// Untagged buffer model (T=0).
    Untagged {
        /// RsvdULP: the STag to invalidate for Send with Invalidate, otherwise 0.
        inval_stag: u32,
        /// Queue number ([`QN_SEND`], [`QN_READ_REQUEST`], [`QN_TERMINATE`]).
        qn: u32,
        /// Message sequence number, starts at 1 per queue.
        msn: u32,
        /// Message offset of this segment's payload.
        mo: u32,
    },
}

impl DdpHeader {
    /// True for [`DdpHeader::Tagged`].
    pub fn is_tagged(&self) -> bool {
        matches!(self, DdpHeader::Tagged { .. })
    }
}

/// DDP header plus RDMAP control: everything before a segment's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// L flag: last segment of the DDP message.
    pub last: bool,
    /// RDMAP opcode.
    pub opcode: Opcode,
    /// Tagged or untagged fields; the T bit is written from this variant.
    pub ddp: DdpHeader,
}

#[allow(clippy::len_without_is_empty)] // a header is never empty
impl SegmentHeader {
    /// The header of a Terminate message (untagged, queue 2, one segment) with `msn`.
    pub fn terminate(msn: u32) -> SegmentHeader {
        SegmentHeader {
            last: true,
            opcode: Opcode::Terminate,
            ddp: DdpHeader::Untagged {
                inval_stag: 0,
                qn: QN_TERMINATE,
                msn,
                mo: 0,
            },
        }
    }

    /// Parses the DDP+RDMAP header at the start of a ULPDU; returns it and its length (14 or 18).
    /// Checks DDP DV == 1 (BadDdpVersion), RDMAP RV == 1 (BadRdmapVersion), opcode known, T bit consistent with opcode (Malformed), reserved bits zero (Malformed).
    ///
    /// The untagged RsvdULP word is returned as `inval_stag` for every opcode.
    pub fn parse(ulpdu: &[u8]) -> Result<(SegmentHeader, usize), WireError> {
        const WHAT: &str = "DDP segment header";
        need(WHAT, ulpdu, 2)?;
        let (c0, c1) = (ulpdu[0], ulpdu[1]);
        let dv = c0 & DV_MASK;
        if dv != DDP_VERSION {
            return Err(WireError::BadDdpVersion(dv));
        }
        let rv = c1 >> 6;
        if rv != RDMAP_VERSION {
            return Err(WireError::BadRdmapVersion(rv));
        }
        if c0 & DDP_RSVD != 0 || c1 & RDMAP_RSVD != 0 {
            return Err(WireError::Malformed("reserved DDP/RDMAP control bits set"));
        }
        let opcode = Opcode::from_u8(c1 & OPCODE_MASK)?;
        let tagged = c0 & T_FLAG != 0;
        if tagged != opcode.is_tagged() {
            return Err(WireError::Malformed("DDP T flag does not match the RDMAP opcode"));
        }
        let ddp = if tagged {
            need(WHAT, ulpdu, DDP_TAGGED_HDR_LEN)?;
            DdpHeader::Tagged {
                stag: be32(ulpdu, 2),
                to: be64(ulpdu, 6),
            }
        } else {
            need(WHAT, ulpdu, DDP_UNTAGGED_HDR_LEN)?;
            DdpHeader::Untagged {
                inval_stag: be32(ulpdu, 2),
                qn: be32(ulpdu, 6),
                msn: be32(ulpdu, 10),
                mo: be32(ulpdu, 14),
            }
        };
        let hdr = SegmentHeader {
            last: c0 & L_FLAG != 0,
            opcode,
            ddp,
        };
        Ok((hdr, hdr.len()))
    }

    /// Appends the header (14 or 18 bytes).
    pub fn emit(&self, out: &mut Vec<u8>) {
        let mut buf = [0u8; DDP_UNTAGGED_HDR_LEN];
        let n = self.write_to(&mut buf);
        out.extend_from_slice(&buf[..n]);
    }

    /// 14 for the tagged model, 18 for the untagged one.
    pub fn len(&self) -> usize {
        if self.ddp.is_tagged() {
            DDP_TAGGED_HDR_LEN
        } else {
            DDP_UNTAGGED_HDR_LEN
        }
    }

    /// Writes into a fixed buffer; returns the length used (buffer of >= 18 bytes).
    pub fn write_to(&self, buf: &mut [u8; 18]) -> usize {
        let t = if self.ddp.is_tagged() { T_FLAG } else { 0 };
        let l = if self.last { L_FLAG } else { 0 };
        buf[0] = t | l | DDP_VERSION;
        buf[1] = (RDMAP_VERSION << 6) | self.opcode as u8;
        match self.ddp {
            DdpHeader::Tagged { stag, to } => {
                buf[2..6].copy_from_slice(&stag.to_be_bytes());
                buf[6..14].copy_from_slice(&to.to_be_bytes());
            }
            DdpHeader::Untagged {
                inval_stag,
                qn,
                msn,
                mo,
            } => {
                buf[2..6].copy_from_slice(&inval_stag.to_be_bytes());
                buf[6..10].copy_from_slice(&qn.to_be_bytes());
                buf[10..14].copy_from_slice(&msn.to_be_bytes());
                buf[14..18].copy_from_slice(&mo.to_be_bytes());
            }
        }
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    fn roundtrip(bytes: &[u8]) -> SegmentHeader {
        let (h, n) = SegmentHeader::parse(bytes).unwrap();
        let mut out = Vec::new();
        h.emit(&mut out);
        assert_eq!(out, &bytes[..n]);
        let mut fixed = [0xAA; 18];
        assert_eq!(h.write_to(&mut fixed), n);
        assert_eq!(&fixed[..n], &bytes[..n]);
        h
    }

    // ULPDU starts from samples/good/iwarp_rfc6581.pcap.
    #[test]
    fn golden_headers() {
        let rtr = roundtrip(&hex("c140000000000000000000000000"));
        assert_eq!(
            rtr,
            SegmentHeader {
                last: true,
                opcode: Opcode::RdmaWrite,
                ddp: DdpHeader::Tagged { stag: 0, to: 0 }
            }
        );
        let send = roundtrip(&hex("4143000000000000000000000001000000006865"));
        assert_eq!(
            send.ddp,
            DdpHeader::Untagged {
                inval_stag: 0,
                qn: QN_SEND,
                msn: 1,
                mo: 0
            }
        );
        let write = roundtrip(&hex("c1400012340000007f0000001000"));
        assert_eq!(
            write.ddp,
            DdpHeader::Tagged {
                stag: 0x00123400,
                to: 0x7F00_0000_1000
            }
        );
        let rreq = roundtrip(&hex("414100000000000000010000000100000000"));
        assert_eq!(rreq.opcode, Opcode::ReadRequest);
        let rresp = roundtrip(&hex("c14200abcd0000007f0000002000"));
        assert_eq!(rresp.opcode, Opcode::ReadResponse);
        let inv = roundtrip(&hex("414400123400000000000000000100000000"));
        assert_eq!(inv.opcode, Opcode::SendInvalidate);
        assert!(matches!(
            inv.ddp,
            DdpHeader::Untagged {
                inval_stag: 0x00123400,
                ..
            }
        ));
        let se = roundtrip(&hex("414500000000000000000000000200000000"));
        assert_eq!(se.opcode, Opcode::SendSe);
        let term = roundtrip(&hex("414700000000000000020000000100000000"));
        assert!(matches!(term.ddp, DdpHeader::Untagged { qn: QN_TERMINATE, .. }));
    }

    #[test]
    fn golden_bad_ddp_version() {
        // samples/bad/iwarp_bad_ddp_version.pcap: DV = 2 in a Send, CRC valid.
        let b = hex("4243000000000000000000000001000000006865");
        assert_eq!(SegmentHeader::parse(&b), Err(WireError::BadDdpVersion(2)));
    }

    #[test]
    fn header_errors() {
        let ok = hex("414300000000000000000000000100000000");
        let with = |i: usize, v: u8| {
            let mut b = ok.clone();
            b[i] = v;
            SegmentHeader::parse(&b)
        };
        assert_eq!(with(0, 0x40), Err(WireError::BadDdpVersion(0)));
        assert_eq!(with(1, 0x83), Err(WireError::BadRdmapVersion(2)));
        assert_eq!(with(1, 0x48), Err(WireError::UnknownOpcode(8)));
        assert_eq!(with(1, 0x4a), Err(WireError::UnknownOpcode(0xa)));
        assert!(matches!(with(0, 0x45), Err(WireError::Malformed(_))));
        assert!(matches!(with(1, 0x53), Err(WireError::Malformed(_))));
        // Tagged Send, untagged Write.
        assert!(matches!(with(0, 0xc1), Err(WireError::Malformed(_))));
        assert!(matches!(with(1, 0x40), Err(WireError::Malformed(_))));
        assert_eq!(
            SegmentHeader::parse(&ok[..17]),
            Err(WireError::Truncated {
                what: "DDP segment header",
                need: 18,
                have: 17
            })
        );
        assert!(matches!(
            SegmentHeader::parse(&[0xc1]),
            Err(WireError::Truncated { need: 2, .. })
        ));
    }

    #[test]
    fn not_last_and_len() {
        let h = SegmentHeader {
            last: false,
            opcode: Opcode::ReadResponse,
            ddp: DdpHeader::Tagged {
                stag: 0xDEAD_BEEF,
                to: u64::MAX,
            },
        };
        let mut out = Vec::new();
        h.emit(&mut out);
        assert_eq!(out[0], 0x81);
        assert_eq!(h.len(), DDP_TAGGED_HDR_LEN);
        assert_eq!(SegmentHeader::parse(&out), Ok((h, 14)));
    }
}
