//! Service ID Resolution: SIDR_REQ (IBTA vol. 1 Table 119) and SIDR_REP
//! (Table 120), used by rdma_cm for UD (RDMA_PS_UDP / RDMA_PS_IPOIB) ids.
//!
//! ```text
//!  SIDR_REQ   0 RequestID (32)  4 P_Key (16) rsvd (16)  8 ServiceID (64)  16 PrivateData (216)
//!  SIDR_REP   0 RequestID (32)  4 Status (8)  5 AdditionalInfoLength (8)  6 rsvd (16)
//!             8 QPN (24) rsvd (8)  12 ServiceID (64)  20 Q_Key (32)
//!            24 AdditionalInformation (72)  96 PrivateData (136)
//! ```

use std::fmt;

use super::fields::{array, get24, put16, put24, put32, put64};
use super::mad::MAD_DATA_LEN;
use crate::error::{be16, be32, be64, need, WireError};

/// Length of the SIDR_REQ private data field.
pub const SIDR_REQ_PRIVATE_LEN: usize = 216;
/// Length of the SIDR_REP private data field.
pub const SIDR_REP_PRIVATE_LEN: usize = 136;
/// Length of the SIDR_REP additional information field.
pub const SIDR_REP_ADD_INFO_LEN: usize = 72;

/// SIDR_REQ: which QP serves this service ID?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReq {
    /// Request ID chosen by the sender, echoed in the SIDR_REP.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service to resolve.
    pub service_id: u64,
    /// Private data; rdma_cm puts its [`CmaHeader`](super::CmaHeader) first.
    pub private_data: [u8; SIDR_REQ_PRIVATE_LEN],
}

impl Default for SidrReq {
    fn default() -> SidrReq {
        SidrReq {
            request_id: 0,
            pkey: 0,
            service_id: 0,
            private_data: [0; SIDR_REQ_PRIVATE_LEN],
        }
    }
}

impl SidrReq {
    /// Decodes the 232-byte attribute data; reserved bytes are ignored.
    pub fn parse(d: &[u8]) -> Result<SidrReq, WireError> {
        need("CM SIDR_REQ", d, MAD_DATA_LEN)?;
        Ok(SidrReq {
            request_id: be32(d, 0),
            pkey: be16(d, 4),
            service_id: be64(d, 8),
            private_data: array(d, 16),
        })
    }

    /// Encodes the 232-byte attribute data (reserved bytes zero).
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        put32(&mut d, 0, self.request_id);
        put16(&mut d, 4, self.pkey);
        put64(&mut d, 8, self.service_id);
        d[16..].copy_from_slice(&self.private_data);
        d
    }
}

/// SIDR_REP Status (IBTA vol. 1 Table 121, Linux `enum ib_cm_sidr_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    Success,
    /// 1: service ID not supported (nobody listens).
    Unsupported,
    /// 2: rejected by the service provider (rdma_cm's `rdma_reject` on a UD id).
    Reject,
    /// 3: no QP available.
    NoQp,
    /// 4: redirect (additional information holds ClassPortInfo).
    Redirect,
    /// 5: unsupported class version.
    UnsupportedVersion,
    /// Any other code.
    Other(u8),
}

impl SidrStatus {
    /// Decodes a Status byte; unknown codes become [`SidrStatus::Other`].
    pub fn from_u8(v: u8) -> SidrStatus {
        match v {
            0 => SidrStatus::Success,
            1 => SidrStatus::Unsupported,
            2 => SidrStatus::Reject,
            3 => SidrStatus::NoQp,
            4 => SidrStatus::Redirect,
            5 => SidrStatus::UnsupportedVersion,
            v => SidrStatus::Other(v),
        }
    }

    /// The wire code.
    pub fn as_u8(self) -> u8 {
        match self {
            SidrStatus::Success => 0,
            SidrStatus::Unsupported => 1,
            SidrStatus::Reject => 2,
            SidrStatus::NoQp => 3,
            SidrStatus::Redirect => 4,
            SidrStatus::UnsupportedVersion => 5,
            SidrStatus::Other(v) => v,
        }
    }
}

impl fmt::Display for SidrStatus {
    /// Short description, e.g. "service ID not supported"; "status N" for unknown codes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match SidrStatus::from_u8(self.as_u8()) {
            SidrStatus::Success => "success",
            SidrStatus::Unsupported => "service ID not supported",
            SidrStatus::Reject => "rejected",
            SidrStatus::NoQp => "no QP",
            SidrStatus::Redirect => "redirect",
            SidrStatus::UnsupportedVersion => "unsupported class version",
            SidrStatus::Other(v) => return write!(f, "status {v}"),
        };
        f.write_str(name)
    }
}

/// SIDR_REP: the answer to a SIDR_REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    /// The SIDR_REQ's request ID.
    pub request_id: u32,
    /// Outcome.
    pub status: SidrStatus,
    /// The serving QP number (24 bits, masked by `emit`).
    pub qpn: u32,
    /// The resolved service ID.
    pub service_id: u64,
    /// The serving QP's Q_Key.
    pub qkey: u32,
    /// Additional information; its length is AdditionalInfoLength.
    /// At most [`SIDR_REP_ADD_INFO_LEN`] bytes are sent; more are cut off by `emit`.
    pub add_info: Vec<u8>,
    /// Private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_LEN],
}

impl Default for SidrRep {
    fn default() -> SidrRep {
        SidrRep {
            request_id: 0,
            status: SidrStatus::Success,
            qpn: 0,
            service_id: 0,
            qkey: 0,
            add_info: Vec::new(),
            private_data: [0; SIDR_REP_PRIVATE_LEN],
        }
    }
}

impl SidrRep {
    /// Decodes the 232-byte attribute data. AdditionalInfoLength over 72 is
    /// Malformed; reserved bits are ignored.
    pub fn parse(d: &[u8]) -> Result<SidrRep, WireError> {
        need("CM SIDR_REP", d, MAD_DATA_LEN)?;
        let info_len = usize::from(d[5]);
        if info_len > SIDR_REP_ADD_INFO_LEN {
            return Err(WireError::Malformed("SIDR_REP additional information length over 72"));
        }
        Ok(SidrRep {
            request_id: be32(d, 0),
            status: SidrStatus::from_u8(d[4]),
            qpn: get24(d, 8),
            service_id: be64(d, 12),
            qkey: be32(d, 20),
            add_info: d[24..24 + info_len].to_vec(),
            private_data: array(d, 96),
        })
    }

    /// Encodes the 232-byte attribute data (reserved bits zero).
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        let info = &self.add_info[..self.add_info.len().min(SIDR_REP_ADD_INFO_LEN)];
        put32(&mut d, 0, self.request_id);
        d[4] = self.status.as_u8();
        d[5] = info.len() as u8;
        put24(&mut d, 8, self.qpn);
        put64(&mut d, 12, self.service_id);
        put32(&mut d, 20, self.qkey);
        d[24..24 + info.len()].copy_from_slice(info);
        d[96..].copy_from_slice(&self.private_data);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    #[test]
    fn sidr_req_layout() {
        let req = SidrReq {
            request_id: 0x0102_0304,
            pkey: 0xFFFF,
            service_id: 0x0000_0000_0111_1234,
            private_data: [0xEE; SIDR_REQ_PRIVATE_LEN],
        };
        let d = req.emit();
        assert_eq!(&d[..17], &hex("01020304ffff00000000000001111234ee")[..]);
        assert_eq!(SidrReq::parse(&d), Ok(req));
        let mut r = d;
        r[6] = 0xff;
        assert_eq!(SidrReq::parse(&r), Ok(req));
        assert!(matches!(SidrReq::parse(&d[..16]), Err(WireError::Truncated { .. })));
    }

    #[test]
    fn sidr_rep_layout() {
        let rep = SidrRep {
            request_id: 9,
            status: SidrStatus::Success,
            qpn: 0x01_0203,
            service_id: 0x0000_0000_0111_1234,
            qkey: 0x0123_4567,
            add_info: vec![0xA0, 0xA1],
            private_data: [0x5C; SIDR_REP_PRIVATE_LEN],
        };
        let d = rep.emit();
        assert_eq!(
            &d[..27],
            &hex("000000090002000001020300000000000111123401234567a0a100")[..]
        );
        assert_eq!(d[96], 0x5C);
        assert_eq!(SidrRep::parse(&d), Ok(rep.clone()));
        let mut r = d;
        r[6] = 0xff;
        r[11] = 0xff;
        r[30] = 0xff; // past AdditionalInfoLength
        assert_eq!(SidrRep::parse(&r), Ok(rep));
        let mut bad = d;
        bad[5] = 73;
        assert!(matches!(SidrRep::parse(&bad), Err(WireError::Malformed(_))));
        let long = SidrRep {
            add_info: vec![1; 80],
            status: SidrStatus::Other(0x99),
            ..SidrRep::default()
        };
        let got = SidrRep::parse(&long.emit()).unwrap();
        assert_eq!((got.add_info.len(), got.status), (72, SidrStatus::Other(0x99)));
    }

    #[test]
    fn status_codes() {
        for v in 0..=u8::MAX {
            assert_eq!(SidrStatus::from_u8(v).as_u8(), v);
        }
        assert_eq!(SidrStatus::from_u8(2), SidrStatus::Reject);
        assert_eq!(SidrStatus::from_u8(5), SidrStatus::UnsupportedVersion);
        assert_eq!(SidrStatus::Unsupported.to_string(), "service ID not supported");
        assert_eq!(SidrStatus::Other(9).to_string(), "status 9");
    }
}
