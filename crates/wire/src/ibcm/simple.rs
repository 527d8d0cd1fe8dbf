//! The short CM messages: MRA (Table 107), RTU (Table 111), DREQ (Table 112)
//! and DREP (Table 113). Each starts with the two communication IDs.
//!
//! ```text
//!  MRA   0 LocalCommID  4 RemoteCommID  8 MessageMRAed (2) rsvd (6)
//!                                       9 ServiceTimeout (5) rsvd (3)  10 PrivateData (222)
//!  RTU   0 LocalCommID  4 RemoteCommID  8 PrivateData (224)
//!  DREQ  0 LocalCommID  4 RemoteCommID  8 RemoteQPN/EECN (24) rsvd (8) 12 PrivateData (220)
//!  DREP  0 LocalCommID  4 RemoteCommID  8 PrivateData (224)
//! ```

use super::fields::{array, bits, get24, place, put24, put32};
use super::mad::MAD_DATA_LEN;
use crate::error::{be32, need, WireError};

/// Length of the MRA private data field.
pub const MRA_PRIVATE_LEN: usize = 222;
/// Length of the RTU private data field.
pub const RTU_PRIVATE_LEN: usize = 224;
/// Length of the DREQ private data field.
pub const DREQ_PRIVATE_LEN: usize = 220;
/// Length of the DREP private data field.
pub const DREP_PRIVATE_LEN: usize = 224;

/// MRA: "message received, answer will take a while" for a REQ, REP or LAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (0 when MRAing a REQ).
    pub remote_comm_id: u32,
    /// Which message is acknowledged (2 bits): [`CM_MSG_REQ`](super::CM_MSG_REQ),
    /// [`CM_MSG_REP`](super::CM_MSG_REP) or [`CM_MSG_OTHER`](super::CM_MSG_OTHER) (LAP).
    pub message_mraed: u8,
    /// Extra time the sender needs, exponent (5 bits), see [`cm_timeout_ms`](super::cm_timeout_ms).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_LEN],
}

impl Default for Mra {
    fn default() -> Mra {
        Mra {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_mraed: 0,
            service_timeout: 0,
            private_data: [0; MRA_PRIVATE_LEN],
        }
    }
}

impl Mra {
    /// Decodes the 232-byte attribute data; reserved bits are ignored.
    pub fn parse(d: &[u8]) -> Result<Mra, WireError> {
        need("CM MRA", d, MAD_DATA_LEN)?;
        Ok(Mra {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            message_mraed: bits(d[8], 0, 2),
            service_timeout: bits(d[9], 0, 5),
            private_data: array(d, 10),
        })
    }

    /// Encodes the 232-byte attribute data (bit fields masked, reserved bits zero).
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = ids(self.local_comm_id, self.remote_comm_id);
        d[8] = place(self.message_mraed, 0, 2);
        d[9] = place(self.service_timeout, 0, 5);
        d[10..].copy_from_slice(&self.private_data);
        d
    }
}

/// RTU: the active side confirms a REP; the connection is established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rtu {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; RTU_PRIVATE_LEN],
}

impl Default for Rtu {
    fn default() -> Rtu {
        Rtu {
            local_comm_id: 0,
            remote_comm_id: 0,
            private_data: [0; RTU_PRIVATE_LEN],
        }
    }
}

impl Rtu {
    /// Decodes the 232-byte attribute data.
    pub fn parse(d: &[u8]) -> Result<Rtu, WireError> {
        need("CM RTU", d, MAD_DATA_LEN)?;
        Ok(Rtu {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            private_data: array(d, 8),
        })
    }

    /// Encodes the 232-byte attribute data.
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = ids(self.local_comm_id, self.remote_comm_id);
        d[8..].copy_from_slice(&self.private_data);
        d
    }
}

/// DREQ: either side starts a disconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QP (or EE context) number (24 bits), masked by `emit`.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_LEN],
}

impl Default for Dreq {
    fn default() -> Dreq {
        Dreq {
            local_comm_id: 0,
            remote_comm_id: 0,
            remote_qpn: 0,
            private_data: [0; DREQ_PRIVATE_LEN],
        }
    }
}

impl Dreq {
    /// Decodes the 232-byte attribute data; the reserved byte 11 is ignored.
    pub fn parse(d: &[u8]) -> Result<Dreq, WireError> {
        need("CM DREQ", d, MAD_DATA_LEN)?;
        Ok(Dreq {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            remote_qpn: get24(d, 8),
            private_data: array(d, 12),
        })
    }

    /// Encodes the 232-byte attribute data.
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = ids(self.local_comm_id, self.remote_comm_id);
        put24(&mut d, 8, self.remote_qpn);
        d[12..].copy_from_slice(&self.private_data);
        d
    }
}

/// DREP: the answer to a DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; DREP_PRIVATE_LEN],
}

impl Default for Drep {
    fn default() -> Drep {
        Drep {
            local_comm_id: 0,
            remote_comm_id: 0,
            private_data: [0; DREP_PRIVATE_LEN],
        }
    }
}

impl Drep {
    /// Decodes the 232-byte attribute data.
    pub fn parse(d: &[u8]) -> Result<Drep, WireError> {
        need("CM DREP", d, MAD_DATA_LEN)?;
        Ok(Drep {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            private_data: array(d, 8),
        })
    }

    /// Encodes the 232-byte attribute data.
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = ids(self.local_comm_id, self.remote_comm_id);
        d[8..].copy_from_slice(&self.private_data);
        d
    }
}

/// A zeroed body with the two communication IDs filled in.
fn ids(local: u32, remote: u32) -> [u8; MAD_DATA_LEN] {
    let mut d = [0u8; MAD_DATA_LEN];
    put32(&mut d, 0, local);
    put32(&mut d, 4, remote);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    fn body(prefix: &str) -> Vec<u8> {
        let mut d = hex(prefix);
        d.resize(MAD_DATA_LEN, 0);
        d
    }

    #[test]
    fn golden_rtu_dreq_drep() {
        // Attribute data from samples/good/roce_rc_cm.pcap (zero-padded to 232).
        let d = body("1111111122222222");
        let rtu = Rtu::parse(&d).unwrap();
        assert_eq!(
            rtu,
            Rtu {
                local_comm_id: 0x1111_1111,
                remote_comm_id: 0x2222_2222,
                ..Rtu::default()
            }
        );
        assert_eq!(rtu.emit().as_slice(), d.as_slice());

        let d = body("111111112222222200002200");
        let dreq = Dreq::parse(&d).unwrap();
        assert_eq!(
            dreq,
            Dreq {
                local_comm_id: 0x1111_1111,
                remote_comm_id: 0x2222_2222,
                remote_qpn: 0x22,
                ..Dreq::default()
            }
        );
        assert_eq!(dreq.emit().as_slice(), d.as_slice());

        let d = body("2222222211111111");
        let drep = Drep::parse(&d).unwrap();
        assert_eq!((drep.local_comm_id, drep.remote_comm_id), (0x2222_2222, 0x1111_1111));
        assert_eq!(drep.emit().as_slice(), d.as_slice());
    }

    #[test]
    fn mra_bits() {
        let mut pd = [0u8; MRA_PRIVATE_LEN];
        pd[221] = 0x77;
        let mra = Mra {
            local_comm_id: 5,
            remote_comm_id: 6,
            message_mraed: 1,
            service_timeout: 20,
            private_data: pd,
        };
        let d = mra.emit();
        assert_eq!(&d[..10], &hex("000000050000000640a0")[..]);
        assert_eq!(d[231], 0x77);
        assert_eq!(Mra::parse(&d), Ok(mra));
        let mut r = d;
        r[8] |= 0x3f;
        r[9] |= 0x07;
        assert_eq!(Mra::parse(&r), Ok(mra));
        let wide = Mra {
            message_mraed: 0xff,
            service_timeout: 0xff,
            ..Mra::default()
        };
        assert_eq!(&wide.emit()[8..10], &[0xc0, 0xf8]);
    }

    #[test]
    fn dreq_masks_and_truncation() {
        let dreq = Dreq {
            remote_qpn: 0xFF12_3456,
            private_data: [1; DREQ_PRIVATE_LEN],
            ..Dreq::default()
        };
        let d = dreq.emit();
        assert_eq!(&d[8..13], &[0x12, 0x34, 0x56, 0, 1]);
        let mut r = d;
        r[11] = 0xff;
        assert_eq!(Dreq::parse(&r).unwrap().remote_qpn, 0x12_3456);
        for short in [0, 7, 231] {
            assert!(matches!(Dreq::parse(&d[..short]), Err(WireError::Truncated { .. })));
            assert!(matches!(Drep::parse(&d[..short]), Err(WireError::Truncated { .. })));
            assert!(matches!(Rtu::parse(&d[..short]), Err(WireError::Truncated { .. })));
            assert!(matches!(Mra::parse(&d[..short]), Err(WireError::Truncated { .. })));
        }
    }
}
