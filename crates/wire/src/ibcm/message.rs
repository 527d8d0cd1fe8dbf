//! A whole CM MAD: the common header plus one CM message ([`CmMad`]).

use super::mad::{
    CmAttr, MadHeader, CM_CLASS_VERSION, CM_MGMT_CLASS, MAD_BASE_VERSION, MAD_DATA_LEN, MAD_HDR_LEN, MAD_LEN,
    MAD_METHOD_SEND,
};
use super::reject::Rej;
use super::rep::Rep;
use super::req::Req;
use super::sidr::{SidrRep, SidrReq};
use super::simple::{Drep, Dreq, Mra, Rtu};
use crate::error::{need, WireError};

/// MRA MessageMRAed / REJ MessageRejected value: the REQ.
pub const CM_MSG_REQ: u8 = 0;
/// MRA MessageMRAed / REJ MessageRejected value: the REP.
pub const CM_MSG_REP: u8 = 1;
/// MRA MessageMRAed value for a LAP; REJ MessageRejected value "other / none".
pub const CM_MSG_OTHER: u8 = 2;

/// One CM message of any supported kind (LAP and APR are not supported).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(Req),
    /// MessageReceiptAcknowledgement.
    Mra(Mra),
    /// ConnectReject.
    Rej(Rej),
    /// ConnectReply.
    Rep(Rep),
    /// ReadyToUse.
    Rtu(Rtu),
    /// DisconnectRequest.
    Dreq(Dreq),
    /// DisconnectReply.
    Drep(Drep),
    /// ServiceIDResolutionRequest.
    SidrReq(SidrReq),
    /// ServiceIDResolutionResponse.
    SidrRep(SidrRep),
}

impl CmMessage {
    /// The attribute ID this message is sent with.
    pub fn attr(&self) -> CmAttr {
        match self {
            CmMessage::Req(_) => CmAttr::Req,
            CmMessage::Mra(_) => CmAttr::Mra,
            CmMessage::Rej(_) => CmAttr::Rej,
            CmMessage::Rep(_) => CmAttr::Rep,
            CmMessage::Rtu(_) => CmAttr::Rtu,
            CmMessage::Dreq(_) => CmAttr::Dreq,
            CmMessage::Drep(_) => CmAttr::Drep,
            CmMessage::SidrReq(_) => CmAttr::SidrReq,
            CmMessage::SidrRep(_) => CmAttr::SidrRep,
        }
    }

    /// Decodes 232 bytes of attribute data as the message `attr` names.
    /// LAP and APR are Malformed (unsupported).
    pub fn parse(attr: CmAttr, data: &[u8]) -> Result<CmMessage, WireError> {
        Ok(match attr {
            CmAttr::Req => CmMessage::Req(Req::parse(data)?),
            CmAttr::Mra => CmMessage::Mra(Mra::parse(data)?),
            CmAttr::Rej => CmMessage::Rej(Rej::parse(data)?),
            CmAttr::Rep => CmMessage::Rep(Rep::parse(data)?),
            CmAttr::Rtu => CmMessage::Rtu(Rtu::parse(data)?),
            CmAttr::Dreq => CmMessage::Dreq(Dreq::parse(data)?),
            CmAttr::Drep => CmMessage::Drep(Drep::parse(data)?),
            CmAttr::SidrReq => CmMessage::SidrReq(SidrReq::parse(data)?),
            CmAttr::SidrRep => CmMessage::SidrRep(SidrRep::parse(data)?),
            CmAttr::Lap | CmAttr::Apr => return Err(WireError::Malformed("CM LAP/APR not supported")),
        })
    }

    /// Encodes the 232 bytes of attribute data.
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        match self {
            CmMessage::Req(m) => m.emit(),
            CmMessage::Mra(m) => m.emit(),
            CmMessage::Rej(m) => m.emit(),
            CmMessage::Rep(m) => m.emit(),
            CmMessage::Rtu(m) => m.emit(),
            CmMessage::Dreq(m) => m.emit(),
            CmMessage::Drep(m) => m.emit(),
            CmMessage::SidrReq(m) => m.emit(),
            CmMessage::SidrRep(m) => m.emit(),
        }
    }
}

macro_rules! from_msg {
    ($($ty:ident),*) => {$(
        impl From<$ty> for CmMessage {
            fn from(m: $ty) -> CmMessage {
                CmMessage::$ty(m)
            }
        }
    )*};
}
from_msg!(Req, Mra, Rej, Rep, Rtu, Dreq, Drep, SidrReq, SidrRep);

/// A CM MAD: transaction ID plus message. The rest of the header is fixed
/// (base version 1, class 0x07, class version 2, method SEND, status 0,
/// attribute modifier 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMad {
    /// Transaction ID: the requester picks it; replies (REP/RTU/REJ/MRA, DREP,
    /// SIDR_REP) echo it.
    pub tid: u64,
    /// The message.
    pub msg: CmMessage,
}

impl CmMad {
    /// Decodes a 256-byte CM MAD (bytes past 256 are ignored).
    ///
    /// Errors: fewer than 256 bytes is Truncated; base version other than 1,
    /// management class other than 0x07, class version other than 2, method
    /// other than SEND, an unknown attribute ID, LAP/APR and invalid message
    /// contents (an ARI / additional-info length over 72) are Malformed.
    /// Status, class-specific and attribute-modifier words are not checked.
    pub fn parse(mad: &[u8]) -> Result<CmMad, WireError> {
        need("CM MAD", mad, MAD_LEN)?;
        let hdr = MadHeader::parse(mad)?;
        if hdr.base_version != MAD_BASE_VERSION {
            return Err(WireError::Malformed("MAD base version is not 1"));
        }
        if hdr.mgmt_class != CM_MGMT_CLASS {
            return Err(WireError::Malformed("MAD management class is not CM (0x07)"));
        }
        if hdr.class_version != CM_CLASS_VERSION {
            return Err(WireError::Malformed("CM class version is not 2"));
        }
        if hdr.method != MAD_METHOD_SEND {
            return Err(WireError::Malformed("CM MAD method is not SEND"));
        }
        let attr = CmAttr::from_u16(hdr.attr_id).ok_or(WireError::Malformed("unknown CM attribute ID"))?;
        let msg = CmMessage::parse(attr, &mad[MAD_HDR_LEN..MAD_LEN])?;
        Ok(CmMad { tid: hdr.tid, msg })
    }

    /// The header `emit` writes.
    pub fn header(&self) -> MadHeader {
        MadHeader::cm(self.msg.attr(), self.tid)
    }

    /// Encodes the whole 256-byte MAD.
    pub fn emit(&self) -> [u8; MAD_LEN] {
        let mut mad = [0u8; MAD_LEN];
        mad[..MAD_HDR_LEN].copy_from_slice(&self.header().emit());
        mad[MAD_HDR_LEN..].copy_from_slice(&self.msg.emit());
        mad
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ibcm::{RejReason, SidrStatus};
    use crate::testutil::hex;

    fn rtu_mad() -> Vec<u8> {
        // The RTU of samples/good/roce_rc_cm.pcap, zero-padded to 256 bytes.
        let mut m = hex("010702030000000000000001000000420014000000000000111111112222222200000000");
        m.resize(MAD_LEN, 0);
        m
    }

    #[test]
    fn golden_rtu_mad() {
        let m = rtu_mad();
        let mad = CmMad::parse(&m).unwrap();
        assert_eq!(
            mad,
            CmMad {
                tid: 0x0000_0001_0000_0042,
                msg: Rtu {
                    local_comm_id: 0x1111_1111,
                    remote_comm_id: 0x2222_2222,
                    ..Rtu::default()
                }
                .into(),
            }
        );
        assert_eq!(mad.emit().as_slice(), m.as_slice());
        // Trailing bytes are ignored.
        let mut longer = m.clone();
        longer.extend_from_slice(&[0xff; 4]);
        assert_eq!(CmMad::parse(&longer), Ok(mad));
    }

    #[test]
    fn header_errors() {
        let m = rtu_mad();
        let with = |i: usize, v: u8| {
            let mut b = m.clone();
            b[i] = v;
            CmMad::parse(&b)
        };
        assert_eq!(with(0, 2), Err(WireError::Malformed("MAD base version is not 1")));
        assert_eq!(
            with(1, 0x03),
            Err(WireError::Malformed("MAD management class is not CM (0x07)"))
        );
        assert_eq!(with(2, 1), Err(WireError::Malformed("CM class version is not 2")));
        assert_eq!(with(3, 0x83), Err(WireError::Malformed("CM MAD method is not SEND")));
        assert_eq!(with(17, 0x1b), Err(WireError::Malformed("unknown CM attribute ID")));
        assert_eq!(with(17, 0x0f), Err(WireError::Malformed("unknown CM attribute ID")));
        assert_eq!(with(17, 0x19), Err(WireError::Malformed("CM LAP/APR not supported")));
        assert_eq!(with(17, 0x1a), Err(WireError::Malformed("CM LAP/APR not supported")));
        // Status, class-specific and attribute modifier are not checked.
        assert!(with(5, 1).is_ok());
        assert!(with(7, 1).is_ok());
        assert!(with(23, 1).is_ok());
        assert_eq!(
            CmMad::parse(&m[..100]),
            Err(WireError::Truncated {
                what: "CM MAD",
                need: 256,
                have: 100
            })
        );
        assert!(matches!(CmMad::parse(&[]), Err(WireError::Truncated { .. })));
    }

    #[test]
    fn every_message_round_trips() {
        let msgs: Vec<CmMessage> = vec![
            Req {
                local_comm_id: 1,
                service_id: 0x0106_0000 | 4791,
                ..Req::default()
            }
            .into(),
            Mra {
                message_mraed: CM_MSG_REP,
                service_timeout: 20,
                ..Mra::default()
            }
            .into(),
            Rej {
                reason: RejReason::InvalidServiceId,
                message_rejected: CM_MSG_REQ,
                ari: vec![1, 2, 3],
                ..Rej::default()
            }
            .into(),
            Rep {
                local_qpn: 0x42,
                ..Rep::default()
            }
            .into(),
            Rtu::default().into(),
            Dreq {
                remote_qpn: 0x11,
                ..Dreq::default()
            }
            .into(),
            Drep::default().into(),
            SidrReq {
                request_id: 7,
                ..SidrReq::default()
            }
            .into(),
            SidrRep {
                status: SidrStatus::Reject,
                ..SidrRep::default()
            }
            .into(),
        ];
        for (i, msg) in msgs.into_iter().enumerate() {
            let mad = CmMad {
                tid: 0x1000 + i as u64,
                msg,
            };
            let b = mad.emit();
            assert_eq!(b[17], mad.msg.attr() as u8);
            assert_eq!(&b[..4], &[1, 7, 2, 3]);
            assert_eq!(MadHeader::parse(&b), Ok(mad.header()));
            assert_eq!(CmMad::parse(&b).as_ref(), Ok(&mad));
            assert_eq!(CmMessage::parse(mad.msg.attr(), &b[24..]).as_ref(), Ok(&mad.msg));
        }
    }
}
