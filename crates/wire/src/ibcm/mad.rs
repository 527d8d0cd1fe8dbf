//! MAD (management datagram) framing for the Communication Manager class
//! (IBTA vol. 1 §13.4.2 common MAD header, §16.7 CM class).
//!
//! A CM MAD is exactly 256 bytes: a 24-byte common header followed by 232
//! bytes of attribute data. It is sent to QP1 (the GSI) with Q_Key
//! [`GSI_QKEY`]; for RoCEv2 it is the payload of a UD SEND_ONLY after the DETH.
//!
//! ```text
//!  byte 0        1            2               3
//! +------------+------------+---------------+--------+
//! |BaseVersion | MgmtClass  | ClassVersion  |R|Method|   0
//! +------------+------------+---------------+--------+
//! |          Status         |     ClassSpecific      |   4
//! +-------------------------+------------------------+
//! |                 TransactionID (64)               |   8
//! +-------------------------+------------------------+
//! |       AttributeID       |        Reserved        |  16
//! +-------------------------+------------------------+
//! |               AttributeModifier (32)             |  20
//! +--------------------------------------------------+
//! |              232 bytes of attribute data         |  24
//! ```

use super::fields::{put16, put32, put64};
use crate::error::{be16, be32, be64, need, WireError};

/// Length of every CM MAD.
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const MAD_HDR_LEN: usize = 24;
/// Length of the attribute data following the header (`MAD_LEN - MAD_HDR_LEN`).
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HDR_LEN;
/// The only MAD base version defined.
pub const MAD_BASE_VERSION: u8 = 1;
/// Management class of the Communication Manager.
pub const CM_MGMT_CLASS: u8 = 0x07;
/// CM class version 2 (IB specification 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;
/// The method every CM message uses (CM MADs are unacknowledged sends).
pub const MAD_METHOD_SEND: u8 = 0x03;
/// Well-known Q_Key of QP1, the General Services Interface.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The 24-byte common MAD header.
///
/// [`MadHeader::parse`] only decodes; CM-specific checks are done by
/// [`CmMad::parse`](super::CmMad::parse). The reserved 16 bits at byte 18
/// are ignored on receive and sent as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadHeader {
    /// Base version, 1.
    pub base_version: u8,
    /// Management class ([`CM_MGMT_CLASS`] for the CM).
    pub mgmt_class: u8,
    /// Class version ([`CM_CLASS_VERSION`] for the CM).
    pub class_version: u8,
    /// Method byte, including the response bit 0x80 ([`MAD_METHOD_SEND`] for the CM).
    pub method: u8,
    /// MAD status (0 for CM messages).
    pub status: u16,
    /// Class-specific word (0 for CM messages).
    pub class_specific: u16,
    /// Transaction ID; a CM exchange (REQ/REP/RTU, DREQ/DREP, ...) shares one.
    pub tid: u64,
    /// Attribute ID: which CM message this is (see [`CmAttr`]).
    pub attr_id: u16,
    /// Attribute modifier (0 for CM messages).
    pub attr_mod: u32,
}

impl MadHeader {
    /// Header of a CM message: base version 1, class 0x07 version 2, method SEND, status 0.
    pub fn cm(attr: CmAttr, tid: u64) -> MadHeader {
        MadHeader {
            base_version: MAD_BASE_VERSION,
            mgmt_class: CM_MGMT_CLASS,
            class_version: CM_CLASS_VERSION,
            method: MAD_METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id: attr as u16,
            attr_mod: 0,
        }
    }

    /// Decodes the first 24 bytes of `buf`; Truncated if it is shorter. No field is checked.
    pub fn parse(buf: &[u8]) -> Result<MadHeader, WireError> {
        need("MAD header", buf, MAD_HDR_LEN)?;
        Ok(MadHeader {
            base_version: buf[0],
            mgmt_class: buf[1],
            class_version: buf[2],
            method: buf[3],
            status: be16(buf, 4),
            class_specific: be16(buf, 6),
            tid: be64(buf, 8),
            attr_id: be16(buf, 16),
            attr_mod: be32(buf, 20),
        })
    }

    /// Encodes the header (reserved bytes 18..20 zero).
    pub fn emit(&self) -> [u8; MAD_HDR_LEN] {
        let mut b = [0u8; MAD_HDR_LEN];
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        put16(&mut b, 4, self.status);
        put16(&mut b, 6, self.class_specific);
        put64(&mut b, 8, self.tid);
        put16(&mut b, 16, self.attr_id);
        put32(&mut b, 20, self.attr_mod);
        b
    }
}

/// CM attribute IDs (IBTA vol. 1 Table 104): which message a CM MAD carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum CmAttr {
    /// ConnectRequest.
    Req = 0x10,
    /// MessageReceiptAcknowledgement.
    Mra = 0x11,
    /// ConnectReject.
    Rej = 0x12,
    /// ConnectReply.
    Rep = 0x13,
    /// ReadyToUse.
    Rtu = 0x14,
    /// DisconnectRequest.
    Dreq = 0x15,
    /// DisconnectReply.
    Drep = 0x16,
    /// ServiceIDResolutionRequest.
    SidrReq = 0x17,
    /// ServiceIDResolutionResponse.
    SidrRep = 0x18,
    /// LoadAlternatePath (not used by rdma_cm).
    Lap = 0x19,
    /// AlternatePathResponse (not used by rdma_cm).
    Apr = 0x1a,
}

impl CmAttr {
    /// Decodes an attribute ID; `None` for IDs the CM class does not define.
    pub fn from_u16(v: u16) -> Option<CmAttr> {
        Some(match v {
            0x10 => CmAttr::Req,
            0x11 => CmAttr::Mra,
            0x12 => CmAttr::Rej,
            0x13 => CmAttr::Rep,
            0x14 => CmAttr::Rtu,
            0x15 => CmAttr::Dreq,
            0x16 => CmAttr::Drep,
            0x17 => CmAttr::SidrReq,
            0x18 => CmAttr::SidrRep,
            0x19 => CmAttr::Lap,
            0x1a => CmAttr::Apr,
            _ => return None,
        })
    }

    /// Short upper-case IBTA name, e.g. "REQ", "SIDR_REP".
    pub fn name(self) -> &'static str {
        match self {
            CmAttr::Req => "REQ",
            CmAttr::Mra => "MRA",
            CmAttr::Rej => "REJ",
            CmAttr::Rep => "REP",
            CmAttr::Rtu => "RTU",
            CmAttr::Dreq => "DREQ",
            CmAttr::Drep => "DREP",
            CmAttr::SidrReq => "SIDR_REQ",
            CmAttr::SidrRep => "SIDR_REP",
            CmAttr::Lap => "LAP",
            CmAttr::Apr => "APR",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    #[test]
    fn golden_header() {
        // Header of the REQ in samples/good/roce_rc_cm.pcap.
        let b = hex("010702030000000000000001000000420010000000000000");
        let h = MadHeader::parse(&b).unwrap();
        assert_eq!(h, MadHeader::cm(CmAttr::Req, 0x0000_0001_0000_0042));
        assert_eq!(h.emit().as_slice(), b.as_slice());
    }

    #[test]
    fn every_field_and_reserved() {
        let h = MadHeader {
            base_version: 0x11,
            mgmt_class: 0x22,
            class_version: 0x33,
            method: 0x81,
            status: 0x4455,
            class_specific: 0x6677,
            tid: 0x0102_0304_0506_0708,
            attr_id: 0x99AA,
            attr_mod: 0xBBCC_DDEE,
        };
        let b = h.emit();
        assert_eq!(
            b.as_slice(),
            hex("1122338144556677010203040506070899aa0000bbccddee").as_slice()
        );
        let mut r = b;
        r[18] = 0xff;
        r[19] = 0xff;
        assert_eq!(MadHeader::parse(&r), Ok(h));
        assert_eq!(
            MadHeader::parse(&b[..23]),
            Err(WireError::Truncated {
                what: "MAD header",
                need: 24,
                have: 23
            })
        );
    }

    #[test]
    fn attr_ids() {
        for v in 0..=0xffffu16 {
            match CmAttr::from_u16(v) {
                Some(a) => assert_eq!(a as u16, v),
                None => assert!(!(0x10..=0x1a).contains(&v)),
            }
        }
        assert_eq!(CmAttr::SidrRep.name(), "SIDR_REP");
        assert_eq!(CmAttr::from_u16(0x1a), Some(CmAttr::Apr));
    }
}
