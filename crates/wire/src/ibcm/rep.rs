//! REP (ConnectReply, IBTA vol. 1 Table 110).
//!
//! ```text
//!  byte  0  LocalCommunicationID (32)        4  RemoteCommunicationID (32)
//!        8  LocalQ_Key (32)
//!       12  LocalQPN (24) | reserved (8)
//!       16  LocalEEContext (24) | reserved (8)
//!       20  StartingPSN (24) | reserved (8)
//!       24  ResponderResources (8) | InitiatorDepth (8)
//!       26  TargetACKDelay (5) FailoverAccepted (2) E2EFlowControl (1)
//!       27  RNRRetryCount (3) SRQ (1) reserved (4)
//!       28  LocalCAGUID (64)
//!       36  PrivateData (196 bytes)
//! ```

use super::fields::{array, bits, flag, get24, place, put24, put32, put64};
use super::mad::MAD_DATA_LEN;
use crate::error::{be32, be64, need, WireError};

/// Length of the REP private data field.
pub const REP_PRIVATE_LEN: usize = 196;

/// REP: the passive side accepts a REQ.
///
/// 24-bit fields and bit fields are masked to their width by [`Rep::emit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rep {
    /// The sender's (passive side's) communication ID.
    pub local_comm_id: u32,
    /// The REQ sender's communication ID.
    pub remote_comm_id: u32,
    /// The sender's Q_Key (0 for RC).
    pub local_qkey: u32,
    /// The sender's QP number (24 bits).
    pub local_qpn: u32,
    /// The sender's EE context (24 bits, RD only).
    pub local_eecn: u32,
    /// The sender's starting send PSN (24 bits).
    pub starting_psn: u32,
    /// RDMA Read/atomic requests the sender accepts as responder.
    pub responder_resources: u8,
    /// RDMA Read/atomic requests the sender issues as initiator.
    pub initiator_depth: u8,
    /// The sender's target ACK delay exponent (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits: 0 accepted, 1 rejected, 2 unsupported).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR NAK retry count the REQ sender's QP should use (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// The sender's CA (node) GUID.
    pub local_ca_guid: u64,
    /// Private data (the consumer's `rdma_accept` data).
    pub private_data: [u8; REP_PRIVATE_LEN],
}

impl Default for Rep {
    fn default() -> Rep {
        Rep {
            local_comm_id: 0,
            remote_comm_id: 0,
            local_qkey: 0,
            local_qpn: 0,
            local_eecn: 0,
            starting_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: 0,
            private_data: [0; REP_PRIVATE_LEN],
        }
    }
}

impl Rep {
    /// Decodes the 232-byte attribute data; reserved bits are ignored.
    pub fn parse(d: &[u8]) -> Result<Rep, WireError> {
        need("CM REP", d, MAD_DATA_LEN)?;
        Ok(Rep {
            local_comm_id: be32(d, 0),
            remote_comm_id: be32(d, 4),
            local_qkey: be32(d, 8),
            local_qpn: get24(d, 12),
            local_eecn: get24(d, 16),
            starting_psn: get24(d, 20),
            responder_resources: d[24],
            initiator_depth: d[25],
            target_ack_delay: bits(d[26], 0, 5),
            failover_accepted: bits(d[26], 5, 2),
            end_to_end_flow_control: bits(d[26], 7, 1) != 0,
            rnr_retry_count: bits(d[27], 0, 3),
            srq: bits(d[27], 3, 1) != 0,
            local_ca_guid: be64(d, 28),
            private_data: array(d, 36),
        })
    }

    /// Encodes the 232-byte attribute data (reserved bits zero).
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        put32(&mut d, 0, self.local_comm_id);
        put32(&mut d, 4, self.remote_comm_id);
        put32(&mut d, 8, self.local_qkey);
        put24(&mut d, 12, self.local_qpn);
        put24(&mut d, 16, self.local_eecn);
        put24(&mut d, 20, self.starting_psn);
        d[24] = self.responder_resources;
        d[25] = self.initiator_depth;
        d[26] = place(self.target_ack_delay, 0, 5)
            | place(self.failover_accepted, 5, 2)
            | flag(self.end_to_end_flow_control, 7);
        d[27] = place(self.rnr_retry_count, 0, 3) | flag(self.srq, 3);
        put64(&mut d, 28, self.local_ca_guid);
        d[36..].copy_from_slice(&self.private_data);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    #[test]
    fn golden_rep() {
        // Attribute data of the REP in samples/good/roce_rc_cm.pcap (zero-padded to 232).
        let mut d = hex(concat!(
            "222222221111111100000000000022000000000000200000101071e00002c9fffe000002",
            "72657020707269766174652064617461"
        ));
        d.resize(MAD_DATA_LEN, 0);
        let rep = Rep::parse(&d).unwrap();
        let mut pd = [0u8; REP_PRIVATE_LEN];
        pd[..16].copy_from_slice(b"rep private data");
        let want = Rep {
            local_comm_id: 0x2222_2222,
            remote_comm_id: 0x1111_1111,
            local_qpn: 0x22,
            starting_psn: 0x2000,
            responder_resources: 16,
            initiator_depth: 16,
            target_ack_delay: 14,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            local_ca_guid: 0x0002_C9FF_FE00_0002,
            private_data: pd,
            ..Rep::default()
        };
        assert_eq!(rep, want);
        assert_eq!(rep.emit().as_slice(), d.as_slice());
    }

    #[test]
    fn bits_masks_and_reserved() {
        let rep = Rep {
            local_comm_id: 1,
            remote_comm_id: 2,
            local_qkey: 0x8001_0000,
            local_qpn: 0xAB_CDEF,
            local_eecn: 0x12_3456,
            starting_psn: 0xFF_FFFF,
            responder_resources: 3,
            initiator_depth: 4,
            target_ack_delay: 0x1F,
            failover_accepted: 2,
            end_to_end_flow_control: false,
            rnr_retry_count: 5,
            srq: true,
            local_ca_guid: u64::MAX,
            private_data: [9; REP_PRIVATE_LEN],
        };
        let d = rep.emit();
        assert_eq!(&d[12..28], &hex("abcdef0012345600ffffff000304fcb0")[..]);
        assert_eq!(Rep::parse(&d), Ok(rep));
        let mut r = d;
        r[15] = 0xff;
        r[19] = 0xff;
        r[23] = 0xff;
        r[27] |= 0x0f;
        assert_eq!(Rep::parse(&r), Ok(rep));
        let wide = Rep {
            local_qpn: 0x0100_0007,
            target_ack_delay: 0xFF,
            ..Rep::default()
        };
        let got = Rep::parse(&wide.emit()).unwrap();
        assert_eq!(
            (got.local_qpn, got.target_ack_delay, got.failover_accepted),
            (7, 0x1F, 0)
        );
        assert!(matches!(Rep::parse(&d[..35]), Err(WireError::Truncated { .. })));
    }
}
