//! Base Transport Header (IBTA Vol 1 §9.2; RoCEv2 Annex A17 names the
//! first two bits of byte 4 FECN/BECN).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |    OpCode     |S|M|Pad| TVer  |            P_Key              |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |F|B|  Resv6    |               Destination QP                  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |A|   Resv7     |          Packet Sequence Number               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use super::opcode::RoceOpcode;
use crate::error::{be16, be32, need, WireError};

/// Length of the BTH.
pub const BTH_LEN: usize = 12;
/// The default (full-membership) partition key, used by RoCE unless configured otherwise.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// The only transport header version defined (TVer).
pub const BTH_TVER: u8 = 0;
/// PSNs are 24 bits; arithmetic on them wraps with this mask.
pub const PSN_MASK: u32 = 0x00ff_ffff;
/// QP numbers are 24 bits.
pub const QPN_MASK: u32 = 0x00ff_ffff;

const SE: u8 = 0x80;
const MIG: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const PAD_MASK: u8 = 0x03;
const TVER_MASK: u8 = 0x0f;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

/// The 12-byte Base Transport Header that starts every RoCEv2 UDP payload.
///
/// ```
/// use softrdma_wire::roce::{Bth, RoceOpcode, BTH_LEN};
///
/// let mut bth = Bth::new(RoceOpcode::RcSendOnly, 0x11, 0x00ff_fffe);
/// bth.ack_req = true;
/// let mut wire = Vec::new();
/// bth.emit(&mut wire);
/// assert_eq!(wire.len(), BTH_LEN);
/// assert_eq!(wire[0], 0x04); // the opcode byte: RC SEND Only
/// assert_eq!(Bth::parse(&wire)?, bth);
/// # Ok::<(), softrdma_wire::WireError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    /// Packet type; decides which extension headers follow.
    pub opcode: RoceOpcode,
    /// SE: the responder should raise a solicited completion event.
    pub solicited: bool,
    /// M: path migration state (HCAs send 1 once the path is "migrated", i.e. normally).
    pub mig_req: bool,
    /// PadCnt: 0..=3 zero bytes appended to the payload to reach a 4-byte multiple.
    pub pad_count: u8,
    /// TVer: transport header version, must be 0 ([`BTH_TVER`]).
    pub tver: u8,
    /// Partition key ([`DEFAULT_PKEY`] for RoCE).
    pub pkey: u16,
    /// FECN: forward congestion notification (RoCEv2 byte 4, bit 7).
    pub fecn: bool,
    /// BECN: backward congestion notification (RoCEv2 byte 4, bit 6).
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// AckReq: the requester asks for an acknowledgement of this packet.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// A BTH with the usual RoCE defaults: P_Key [`DEFAULT_PKEY`], MigReq set,
    /// every other flag clear, pad count 0 (emitters fill it in from the payload).
    pub fn new(opcode: RoceOpcode, dest_qp: u32, psn: u32) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            tver: BTH_TVER,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: dest_qp & QPN_MASK,
            ack_req: false,
            psn: psn & PSN_MASK,
        }
    }

    /// Parses the first 12 bytes of `buf`.
    ///
    /// Errors: fewer than 12 bytes (Truncated), an opcode outside [`RoceOpcode`]
    /// or TVer != 0 (Malformed). The reserved bits (Resv6, Resv7) are not checked.
    pub fn parse(buf: &[u8]) -> Result<Bth, WireError> {
        need("BTH", buf, BTH_LEN)?;
        let opcode = RoceOpcode::from_u8(buf[0]).ok_or(WireError::Malformed("unknown BTH opcode"))?;
        let b1 = buf[1];
        let tver = b1 & TVER_MASK;
        if tver != BTH_TVER {
            return Err(WireError::Malformed("BTH TVer is not 0"));
        }
        Ok(Bth {
            opcode,
            solicited: b1 & SE != 0,
            mig_req: b1 & MIG != 0,
            pad_count: (b1 >> PAD_SHIFT) & PAD_MASK,
            tver,
            pkey: be16(buf, 2),
            fecn: buf[4] & FECN != 0,
            becn: buf[4] & BECN != 0,
            dest_qp: be32(buf, 4) & QPN_MASK,
            ack_req: buf[8] & ACK_REQ != 0,
            psn: be32(buf, 8) & PSN_MASK,
        })
    }

    /// Appends the 12-byte header. Reserved bits are 0; out-of-range fields are masked to their width.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let mut buf = [0u8; BTH_LEN];
        self.write_to(&mut buf);
        out.extend_from_slice(&buf);
    }

    /// Writes the header into a fixed buffer (same bytes as [`emit`](Self::emit)).
    pub fn write_to(&self, buf: &mut [u8; BTH_LEN]) {
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        buf[0] = self.opcode.as_u8();
        buf[1] = flag(self.solicited, SE)
            | flag(self.mig_req, MIG)
            | ((self.pad_count & PAD_MASK) << PAD_SHIFT)
            | (self.tver & TVER_MASK);
        buf[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        buf[4..8].copy_from_slice(&(self.dest_qp & QPN_MASK).to_be_bytes());
        buf[4] = flag(self.fecn, FECN) | flag(self.becn, BECN);
        buf[8..12].copy_from_slice(&(self.psn & PSN_MASK).to_be_bytes());
        buf[8] = flag(self.ack_req, ACK_REQ);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    fn roundtrip(bytes: &[u8]) -> Bth {
        let b = Bth::parse(bytes).unwrap();
        let mut out = Vec::new();
        b.emit(&mut out);
        assert_eq!(out, &bytes[..BTH_LEN]);
        b
    }

    // BTHs from samples/good/roce_rc_cm.pcap (wirecheck).
    #[test]
    fn golden() {
        let send = roundtrip(&hex("0470ffff0000002280001000"));
        assert_eq!(
            send,
            Bth {
                opcode: RoceOpcode::RcSendOnly,
                solicited: false,
                mig_req: true,
                pad_count: 3,
                tver: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp: 0x22,
                ack_req: true,
                psn: 0x1000,
            }
        );
        let ack = roundtrip(&hex("1140ffff0000001100001001"));
        assert_eq!(
            (ack.opcode, ack.dest_qp, ack.psn, ack.ack_req),
            (RoceOpcode::RcAck, 0x11, 0x1001, false)
        );
        let mad = roundtrip(&hex("6440ffff0000000100000002"));
        assert_eq!((mad.opcode, mad.dest_qp, mad.psn), (RoceOpcode::UdSendOnly, 1, 2));
        let mut b = Bth::new(RoceOpcode::RcSendOnly, 0x22, 0x1000);
        b.pad_count = 3;
        b.ack_req = true;
        assert_eq!(b, send);
    }

    #[test]
    fn all_fields_set() {
        let b = Bth {
            opcode: RoceOpcode::RcWriteOnlyImm,
            solicited: true,
            mig_req: false,
            pad_count: 2,
            tver: 0,
            pkey: 0x8001,
            fecn: true,
            becn: true,
            dest_qp: 0xabcdef,
            ack_req: true,
            psn: 0xfedcba,
        };
        let mut out = Vec::new();
        b.emit(&mut out);
        assert_eq!(out, hex("0ba08001c0abcdef80fedcba"));
        assert_eq!(Bth::parse(&out), Ok(b));
        let mut fixed = [0x55; BTH_LEN];
        b.write_to(&mut fixed);
        assert_eq!(&fixed[..], &out[..]);
    }

    #[test]
    fn wide_fields_are_masked() {
        let mut b = Bth::new(RoceOpcode::RcAck, 0xff00_0001, 0x0100_0002);
        assert_eq!((b.dest_qp, b.psn), (1, 2));
        b.dest_qp = 0xffff_ffff;
        b.psn = 0xffff_ffff;
        b.pad_count = 0xff;
        let mut out = Vec::new();
        b.emit(&mut out);
        assert_eq!(out, hex("1170ffff00ffffff00ffffff"));
    }

    #[test]
    fn reserved_bits_ignored() {
        let b = Bth::parse(&hex(&"1140ffff3f000011 7f001001".replace(' ', ""))).unwrap();
        assert_eq!(
            (b.fecn, b.becn, b.dest_qp, b.ack_req, b.psn),
            (false, false, 0x11, false, 0x1001)
        );
    }

    #[test]
    fn errors() {
        let ok = hex("0470ffff0000002280001000");
        assert!(matches!(
            Bth::parse(&ok[..11]),
            Err(WireError::Truncated {
                what: "BTH",
                need: 12,
                have: 11
            })
        ));
        assert!(matches!(Bth::parse(&[]), Err(WireError::Truncated { .. })));
        for bad_op in [0x15, 0x18, 0x1f, 0x20, 0x24, 0x63, 0x66, 0x81, 0xff] {
            let mut b = ok.clone();
            b[0] = bad_op;
            assert_eq!(
                Bth::parse(&b),
                Err(WireError::Malformed("unknown BTH opcode")),
                "{bad_op:#x}"
            );
        }
        for tver in 1..16 {
            let mut b = ok.clone();
            b[1] = 0x70 | tver;
            assert_eq!(Bth::parse(&b), Err(WireError::Malformed("BTH TVer is not 0")));
        }
    }
}
