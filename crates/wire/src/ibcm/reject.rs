//! REJ (ConnectReject, IBTA vol. 1 Table 108) and its reason codes (Table 109).
//!
//! ```text
//!  byte 0      LocalCommunicationID (32)
//!       4      RemoteCommunicationID (32)
//!       8      MessageRejected (2) | reserved (6)
//!       9      RejectedInfoLength (7) | reserved (1)
//!      10      Reason (16)
//!      12      ARI, additional rejection information (72 bytes)
//!      84      PrivateData (148 bytes)
//! ```

use std::fmt;

use super::fields::{array, bits, place, put16, put32};
use super::mad::MAD_DATA_LEN;
use crate::error::{be16, be32, need, WireError};

/// Length of the REJ ARI field.
pub const REJ_ARI_LEN: usize = 72;
/// Length of the REJ private data field.
pub const REJ_PRIVATE_LEN: usize = 148;

/// Why a connection was rejected: the REJ Reason field (IBTA vol. 1 Table 109,
/// Linux `enum ib_cm_rej_reason`). Code 34 is unassigned.
///
/// [`RejReason::from_u16`] never returns `Other` for a named code; an `Other`
/// holding a named code encodes (and therefore decodes) as that code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejReason {
    /// 1: no QP available.
    NoQp,
    /// 2: no EE context available.
    NoEec,
    /// 3: no resources available.
    NoResources,
    /// 4: timeout (also sent by an active side that gives up while REQ_SENT).
    Timeout,
    /// 5: unsupported request.
    Unsupported,
    /// 6: invalid communication ID.
    InvalidCommId,
    /// 7: invalid communication instance.
    InvalidCommInstance,
    /// 8: invalid service ID (nobody listens on it).
    InvalidServiceId,
    /// 9: invalid transport service type.
    InvalidTransportType,
    /// 10: stale connection.
    StaleConn,
    /// 11: RDC does not exist.
    RdcNotExist,
    /// 12: primary remote port GID rejected (ARI: acceptable GID).
    InvalidGid,
    /// 13: primary remote port LID rejected.
    InvalidLid,
    /// 14: primary SL rejected.
    InvalidSl,
    /// 15: primary traffic class rejected.
    InvalidTrafficClass,
    /// 16: primary hop limit rejected.
    InvalidHopLimit,
    /// 17: primary packet rate rejected.
    InvalidPacketRate,
    /// 18: alternate remote port GID rejected.
    InvalidAltGid,
    /// 19: alternate remote port LID rejected.
    InvalidAltLid,
    /// 20: alternate SL rejected.
    InvalidAltSl,
    /// 21: alternate traffic class rejected.
    InvalidAltTrafficClass,
    /// 22: alternate hop limit rejected.
    InvalidAltHopLimit,
    /// 23: alternate packet rate rejected.
    InvalidAltPacketRate,
    /// 24: port and CM redirection (ARI: ClassPortInfo).
    PortCmRedirect,
    /// 25: port redirection.
    PortRedirect,
    /// 26: invalid path MTU.
    InvalidMtu,
    /// 27: insufficient responder resources.
    InsufficientRespResources,
    /// 28: consumer defined (what `rdma_reject` sends).
    ConsumerDefined,
    /// 29: invalid RNR NAK retry count.
    InvalidRnrRetry,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId,
    /// 31: unsupported class version.
    InvalidClassVersion,
    /// 32: invalid primary flow label.
    InvalidFlowLabel,
    /// 33: invalid alternate flow label.
    InvalidAltFlowLabel,
    /// 35: vendor option not supported.
    VendorOptionNotSupported,
    /// Any code without a name.
    Other(u16),
}

/// (reason, code, IB name) for every named reason.
const REASONS: [(RejReason, u16, &str); 34] = [
    (RejReason::NoQp, 1, "no QP"),
    (RejReason::NoEec, 2, "no EEC"),
    (RejReason::NoResources, 3, "no resources"),
    (RejReason::Timeout, 4, "timeout"),
    (RejReason::Unsupported, 5, "unsupported"),
    (RejReason::InvalidCommId, 6, "invalid comm ID"),
    (RejReason::InvalidCommInstance, 7, "invalid comm instance"),
    (RejReason::InvalidServiceId, 8, "invalid service ID"),
    (RejReason::InvalidTransportType, 9, "invalid transport type"),
    (RejReason::StaleConn, 10, "stale connection"),
    (RejReason::RdcNotExist, 11, "RDC does not exist"),
    (RejReason::InvalidGid, 12, "invalid GID"),
    (RejReason::InvalidLid, 13, "invalid LID"),
    (RejReason::InvalidSl, 14, "invalid SL"),
    (RejReason::InvalidTrafficClass, 15, "invalid traffic class"),
    (RejReason::InvalidHopLimit, 16, "invalid hop limit"),
    (RejReason::InvalidPacketRate, 17, "invalid packet rate"),
    (RejReason::InvalidAltGid, 18, "invalid alternate GID"),
    (RejReason::InvalidAltLid, 19, "invalid alternate LID"),
    (RejReason::InvalidAltSl, 20, "invalid alternate SL"),
    (RejReason::InvalidAltTrafficClass, 21, "invalid alternate traffic class"),
    (RejReason::InvalidAltHopLimit, 22, "invalid alternate hop limit"),
    (RejReason::InvalidAltPacketRate, 23, "invalid alternate packet rate"),
    (RejReason::PortCmRedirect, 24, "port and CM redirect"),
    (RejReason::PortRedirect, 25, "port redirect"),
    (RejReason::InvalidMtu, 26, "invalid MTU"),
    (
        RejReason::InsufficientRespResources,
        27,
        "insufficient responder resources",
    ),
    (RejReason::ConsumerDefined, 28, "consumer defined"),
    (RejReason::InvalidRnrRetry, 29, "invalid RNR retry count"),
    (RejReason::DuplicateLocalCommId, 30, "duplicate local comm ID"),
    (RejReason::InvalidClassVersion, 31, "invalid class version"),
    (RejReason::InvalidFlowLabel, 32, "invalid flow label"),
    (RejReason::InvalidAltFlowLabel, 33, "invalid alternate flow label"),
    (RejReason::VendorOptionNotSupported, 35, "vendor option not supported"),
];

impl RejReason {
    /// Decodes a Reason field; codes without a name become [`RejReason::Other`].
    pub fn from_u16(v: u16) -> RejReason {
        REASONS
            .iter()
            .find(|(_, code, _)| *code == v)
            .map_or(RejReason::Other(v), |(r, _, _)| *r)
    }

    /// The wire code.
    pub fn as_u16(self) -> u16 {
        match self {
            RejReason::Other(v) => v,
            named => REASONS
                .iter()
                .find(|(r, _, _)| *r == named)
                .map_or(0, |(_, code, _)| *code),
        }
    }
}

impl fmt::Display for RejReason {
    /// The IB name, e.g. "invalid service ID"; "reason N" for unnamed codes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = self.as_u16();
        match REASONS.iter().find(|(_, c, _)| *c == code) {
            Some((_, _, name)) => f.write_str(name),
            None => write!(f, "reason {code}"),
        }
    }
}

/// REJ: the passive side refuses a REQ, the active side refuses a REP, or
/// either side names a connection it does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (0 when rejecting a REQ).
    pub remote_comm_id: u32,
    /// Which message is rejected (2 bits): [`CM_MSG_REQ`](super::CM_MSG_REQ),
    /// [`CM_MSG_REP`](super::CM_MSG_REP) or [`CM_MSG_OTHER`](super::CM_MSG_OTHER).
    pub message_rejected: u8,
    /// Rejection reason.
    pub reason: RejReason,
    /// Additional rejection information; its length is the 7-bit RejectedInfoLength.
    /// At most [`REJ_ARI_LEN`] bytes are sent; more are cut off by `emit`.
    pub ari: Vec<u8>,
    /// Private data (rdma_cm passes the consumer's `rdma_reject` data here).
    pub private_data: [u8; REJ_PRIVATE_LEN],
}

impl Default for Rej {
    fn default() -> Rej {
        Rej {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_rejected: 0,
            reason: RejReason::ConsumerDefined,
            ari: Vec::new(),
            private_data: [0; REJ_PRIVATE_LEN],
        }
    }
}

impl Rej {
    /// Decodes the 232-byte attribute data. RejectedInfoLength over 72 is Malformed;
    /// ARI bytes past that length and reserved bits are ignored.
    pub fn parse(data: &[u8]) -> Result<Rej, WireError> {
        need("CM REJ", data, MAD_DATA_LEN)?;
        let ari_len = usize::from(bits(data[9], 0, 7));
        if ari_len > REJ_ARI_LEN {
            return Err(WireError::Malformed("REJ ARI length over 72"));
        }
        Ok(Rej {
            local_comm_id: be32(data, 0),
            remote_comm_id: be32(data, 4),
            message_rejected: bits(data[8], 0, 2),
            reason: RejReason::from_u16(be16(data, 10)),
            ari: data[12..12 + ari_len].to_vec(),
            private_data: array(data, 84),
        })
    }

    /// Encodes the 232-byte attribute data; fields wider than their slot are masked.
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        put32(&mut d, 0, self.local_comm_id);
        put32(&mut d, 4, self.remote_comm_id);
        d[8] = place(self.message_rejected, 0, 2);
        let ari = &self.ari[..self.ari.len().min(REJ_ARI_LEN)];
        d[9] = place(ari.len() as u8, 0, 7);
        put16(&mut d, 10, self.reason.as_u16());
        d[12..12 + ari.len()].copy_from_slice(ari);
        d[84..].copy_from_slice(&self.private_data);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    #[test]
    fn reason_codes() {
        for v in 0..=u16::MAX {
            let r = RejReason::from_u16(v);
            assert_eq!(r.as_u16(), v);
            let named = (1..=35).contains(&v) && v != 34;
            assert_eq!(!matches!(r, RejReason::Other(_)), named, "{v}");
        }
        assert_eq!(RejReason::from_u16(1), RejReason::NoQp);
        assert_eq!(RejReason::from_u16(10), RejReason::StaleConn);
        assert_eq!(RejReason::from_u16(28), RejReason::ConsumerDefined);
        assert_eq!(RejReason::from_u16(35), RejReason::VendorOptionNotSupported);
        assert_eq!(RejReason::from_u16(34), RejReason::Other(34));
        assert_eq!(
            RejReason::from_u16(RejReason::Other(8).as_u16()),
            RejReason::InvalidServiceId
        );
        assert_eq!(RejReason::InvalidServiceId.to_string(), "invalid service ID");
        assert_eq!(RejReason::ConsumerDefined.to_string(), "consumer defined");
        assert_eq!(RejReason::Timeout.to_string(), "timeout");
        assert_eq!(RejReason::Other(34).to_string(), "reason 34");
        assert_eq!(RejReason::Other(8).to_string(), "invalid service ID");
    }

    #[test]
    fn golden_consumer_reject() {
        // Attribute data of the REJ in samples/good/roce_cm_rej.pcap (zero-padded to 232).
        let mut d = hex("44444444333333330000001c");
        d.resize(MAD_DATA_LEN, 0);
        let rej = Rej::parse(&d).unwrap();
        assert_eq!(
            rej,
            Rej {
                local_comm_id: 0x4444_4444,
                remote_comm_id: 0x3333_3333,
                message_rejected: 0,
                reason: RejReason::ConsumerDefined,
                ari: vec![],
                private_data: [0; REJ_PRIVATE_LEN],
            }
        );
        assert_eq!(rej.emit().as_slice(), d.as_slice());
    }

    #[test]
    fn ari_and_bits() {
        let mut pd = [0u8; REJ_PRIVATE_LEN];
        pd[0] = 0xAB;
        pd[147] = 0xCD;
        let rej = Rej {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: 1,
            reason: RejReason::Timeout,
            ari: vec![0x00, 0x02, 0xc9, 0xff, 0xfe, 0x00, 0x00, 0x01],
            private_data: pd,
        };
        let d = rej.emit();
        assert_eq!(d[8], 0x40);
        assert_eq!(d[9], 8 << 1);
        assert_eq!(&d[10..12], &[0, 4]);
        assert_eq!(&d[12..20], rej.ari.as_slice());
        assert_eq!((d[84], d[231]), (0xAB, 0xCD));
        assert_eq!(Rej::parse(&d), Ok(rej.clone()));

        // Reserved bits are ignored; ARI bytes beyond the length are not returned.
        let mut r = d;
        r[8] |= 0x3f;
        r[9] |= 1;
        r[30] = 0xEE;
        assert_eq!(Rej::parse(&r), Ok(rej));

        // A 72-byte ARI is the maximum; longer is cut on emit and refused on parse.
        let long = Rej {
            ari: vec![7; 100],
            ..Rej::default()
        };
        let d = long.emit();
        assert_eq!(d[9] >> 1, 72);
        assert_eq!(Rej::parse(&d).unwrap().ari, vec![7; 72]);
        let mut bad = d;
        bad[9] = 73 << 1;
        assert_eq!(Rej::parse(&bad), Err(WireError::Malformed("REJ ARI length over 72")));
        assert!(matches!(
            Rej::parse(&d[..231]),
            Err(WireError::Truncated { need: 232, .. })
        ));
    }
}
