//! REQ (ConnectRequest, IBTA vol. 1 Table 106) and the path record it carries twice.
//!
//! ```text
//!  byte  0  LocalCommunicationID (32)        4  reserved (32)
//!        8  ServiceID (64)                   16  LocalCAGUID (64)
//!       24  reserved (32)                    28  LocalQ_Key (32)
//!       32  LocalQPN (24) | ResponderResources (8)
//!       36  LocalEECN (24) | InitiatorDepth (8)
//!       40  RemoteEECN (24) | RemoteCMResponseTimeout (5) TransportServiceType (2) E2EFlowControl (1)
//!       44  StartingPSN (24) | LocalCMResponseTimeout (5) RetryCount (3)
//!       48  P_Key (16) | PathMTU (4) RDCExists (1) RNRRetryCount (3) | MaxCMRetries (4) SRQ (1) ExtTransport (3)
//!       52  primary path (44 bytes, see CmPath)
//!       96  alternate path (44 bytes)
//!      140  PrivateData (92 bytes)
//! ```

use super::fields::{array, bits, flag, get24, place, put16, put24, put32, put64};
use super::mad::MAD_DATA_LEN;
use crate::error::{be16, be32, be64, need, WireError};

/// Length of the REQ private data field.
pub const REQ_PRIVATE_LEN: usize = 92;
/// Length of one path record inside a REQ.
pub const CM_PATH_LEN: usize = 44;
/// TransportServiceType of a reliable connection.
pub const CM_TRANSPORT_RC: u8 = 0;
/// TransportServiceType of an unreliable connection.
pub const CM_TRANSPORT_UC: u8 = 1;

/// One path (primary or alternate) of a REQ.
///
/// ```text
///  +0 LocalPortLID (16) | RemotePortLID (16)
///  +4 LocalPortGID (128)    +20 RemotePortGID (128)
/// +36 FlowLabel (20) | reserved (6) | PacketRate (6)
/// +40 TrafficClass (8) | HopLimit (8) | SL (4) SubnetLocal (1) rsvd (3) | LocalACKTimeout (5) rsvd (3)
/// ```
///
/// An all-zero record means "no alternate path". For RoCE the LIDs are the
/// permissive 0xFFFF and the GIDs are IPv4-mapped or IPv6 addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    /// Requester's port LID.
    pub local_lid: u16,
    /// Responder's port LID.
    pub remote_lid: u16,
    /// Requester's port GID.
    pub local_gid: [u8; 16],
    /// Responder's port GID.
    pub remote_gid: [u8; 16],
    /// GRH flow label (20 bits).
    pub flow_label: u32,
    /// Static rate code (6 bits, IBTA encoding).
    pub packet_rate: u8,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// The responder is on the requester's subnet (no GRH needed on IB).
    pub subnet_local: bool,
    /// Local ACK timeout exponent (5 bits): 4.096 µs · 2^n.
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// Decodes a 44-byte path record; reserved bits (including the alternate path's
    /// SAP-supported bit) are ignored.
    pub fn parse(b: &[u8]) -> Result<CmPath, WireError> {
        need("CM path", b, CM_PATH_LEN)?;
        Ok(CmPath {
            local_lid: be16(b, 0),
            remote_lid: be16(b, 2),
            local_gid: array(b, 4),
            remote_gid: array(b, 20),
            flow_label: be32(b, 36) >> 12,
            packet_rate: bits(b[39], 2, 6),
            traffic_class: b[40],
            hop_limit: b[41],
            sl: bits(b[42], 0, 4),
            subnet_local: bits(b[42], 4, 1) != 0,
            local_ack_timeout: bits(b[43], 0, 5),
        })
    }

    /// Encodes the record; fields wider than their slot are masked, reserved bits are zero.
    pub fn emit(&self) -> [u8; CM_PATH_LEN] {
        let mut b = [0u8; CM_PATH_LEN];
        put16(&mut b, 0, self.local_lid);
        put16(&mut b, 2, self.remote_lid);
        b[4..20].copy_from_slice(&self.local_gid);
        b[20..36].copy_from_slice(&self.remote_gid);
        put32(&mut b, 36, (self.flow_label & 0xF_FFFF) << 12);
        b[39] |= place(self.packet_rate, 2, 6);
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = place(self.sl, 0, 4) | flag(self.subnet_local, 4);
        b[43] = place(self.local_ack_timeout, 0, 5);
        b
    }
}

/// REQ: the active side asks to connect to a service.
///
/// 24-bit fields (`*_qpn`, `*_eecn`, `starting_psn`) and bit fields are
/// masked to their width by [`Req::emit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// Service to connect to (see [`service_id`](super::service_id) for rdma_cm's encoding).
    pub service_id: u64,
    /// The sender's CA (node) GUID.
    pub local_ca_guid: u64,
    /// The sender's Q_Key (UD-style transports only; 0 for RC).
    pub local_qkey: u32,
    /// The sender's QP number (24 bits).
    pub local_qpn: u32,
    /// RDMA Read/atomic requests the sender accepts as responder.
    pub responder_resources: u8,
    /// The sender's EE context number (24 bits, RD only).
    pub local_eecn: u32,
    /// RDMA Read/atomic requests the sender issues as initiator.
    pub initiator_depth: u8,
    /// The receiver's EE context number (24 bits, RD only).
    pub remote_eecn: u32,
    /// How long the receiver may take to answer, exponent (5 bits), see [`cm_timeout_ms`](super::cm_timeout_ms).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits): [`CM_TRANSPORT_RC`], [`CM_TRANSPORT_UC`], 2 RD, 3 extended.
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The sender's starting send PSN (24 bits).
    pub starting_psn: u32,
    /// How long the sender takes to answer, exponent (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4 bits, IBTA code: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RD only: an RDC exists.
    pub rdc_exists: bool,
    /// RNR NAK retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// REQ retransmissions before giving up (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 1 = XRC when `transport_service_type` is 3).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: CmPath,
    /// Alternate path (all zero when none).
    pub alternate_path: CmPath,
    /// Private data; rdma_cm puts its [`CmaHeader`](super::CmaHeader) first.
    pub private_data: [u8; REQ_PRIVATE_LEN],
}

impl Default for Req {
    fn default() -> Req {
        Req {
            local_comm_id: 0,
            service_id: 0,
            local_ca_guid: 0,
            local_qkey: 0,
            local_qpn: 0,
            responder_resources: 0,
            local_eecn: 0,
            initiator_depth: 0,
            remote_eecn: 0,
            remote_cm_response_timeout: 0,
            transport_service_type: CM_TRANSPORT_RC,
            end_to_end_flow_control: false,
            starting_psn: 0,
            local_cm_response_timeout: 0,
            retry_count: 0,
            pkey: 0,
            path_mtu: 0,
            rdc_exists: false,
            rnr_retry_count: 0,
            max_cm_retries: 0,
            srq: false,
            extended_transport_type: 0,
            primary_path: CmPath::default(),
            alternate_path: CmPath::default(),
            private_data: [0; REQ_PRIVATE_LEN],
        }
    }
}

impl Req {
    /// Decodes the 232-byte attribute data; reserved bits are ignored.
    pub fn parse(d: &[u8]) -> Result<Req, WireError> {
        need("CM REQ", d, MAD_DATA_LEN)?;
        Ok(Req {
            local_comm_id: be32(d, 0),
            service_id: be64(d, 8),
            local_ca_guid: be64(d, 16),
            local_qkey: be32(d, 28),
            local_qpn: get24(d, 32),
            responder_resources: d[35],
            local_eecn: get24(d, 36),
            initiator_depth: d[39],
            remote_eecn: get24(d, 40),
            remote_cm_response_timeout: bits(d[43], 0, 5),
            transport_service_type: bits(d[43], 5, 2),
            end_to_end_flow_control: bits(d[43], 7, 1) != 0,
            starting_psn: get24(d, 44),
            local_cm_response_timeout: bits(d[47], 0, 5),
            retry_count: bits(d[47], 5, 3),
            pkey: be16(d, 48),
            path_mtu: bits(d[50], 0, 4),
            rdc_exists: bits(d[50], 4, 1) != 0,
            rnr_retry_count: bits(d[50], 5, 3),
            max_cm_retries: bits(d[51], 0, 4),
            srq: bits(d[51], 4, 1) != 0,
            extended_transport_type: bits(d[51], 5, 3),
            primary_path: CmPath::parse(&d[52..96])?,
            alternate_path: CmPath::parse(&d[96..140])?,
            private_data: array(d, 140),
        })
    }

    /// Encodes the 232-byte attribute data (reserved bits zero).
    pub fn emit(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        put32(&mut d, 0, self.local_comm_id);
        put64(&mut d, 8, self.service_id);
        put64(&mut d, 16, self.local_ca_guid);
        put32(&mut d, 28, self.local_qkey);
        put24(&mut d, 32, self.local_qpn);
        d[35] = self.responder_resources;
        put24(&mut d, 36, self.local_eecn);
        d[39] = self.initiator_depth;
        put24(&mut d, 40, self.remote_eecn);
        d[43] = place(self.remote_cm_response_timeout, 0, 5)
            | place(self.transport_service_type, 5, 2)
            | flag(self.end_to_end_flow_control, 7);
        put24(&mut d, 44, self.starting_psn);
        d[47] = place(self.local_cm_response_timeout, 0, 5) | place(self.retry_count, 5, 3);
        put16(&mut d, 48, self.pkey);
        d[50] = place(self.path_mtu, 0, 4) | flag(self.rdc_exists, 4) | place(self.rnr_retry_count, 5, 3);
        d[51] = place(self.max_cm_retries, 0, 4) | flag(self.srq, 4) | place(self.extended_transport_type, 5, 3);
        d[52..96].copy_from_slice(&self.primary_path.emit());
        d[96..140].copy_from_slice(&self.alternate_path.emit());
        d[140..].copy_from_slice(&self.private_data);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    fn gid(bytes: &str) -> [u8; 16] {
        hex(bytes).try_into().unwrap()
    }

    #[test]
    fn golden_req() {
        // Attribute data of the REQ in samples/good/roce_cm_rej.pcap (zero-padded to 232).
        let mut d = hex(concat!(
            "33333333000000000000000001061c07000000000000000100000000000000000000111000000010000000a1000100a7",
            "ffff37f0ffffffff00000000000000000000ffff7f00000100000000000000000000ffff7f0000010000000000400090",
            "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000040a029",
            "0000000000000000000000007f0000010000000000000000000000007f000001",
        ));
        d.resize(MAD_DATA_LEN, 0);
        let req = Req::parse(&d).unwrap();
        let mut pd = [0u8; REQ_PRIVATE_LEN];
        pd[..36].copy_from_slice(&hex(
            "0040a0290000000000000000000000007f0000010000000000000000000000007f000001",
        ));
        let path = CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid("00000000000000000000ffff7f000001"),
            remote_gid: gid("00000000000000000000ffff7f000001"),
            hop_limit: 64,
            local_ack_timeout: 18,
            ..CmPath::default()
        };
        let want = Req {
            local_comm_id: 0x3333_3333,
            service_id: 0x0000_0000_0106_1c07,
            local_ca_guid: 1,
            local_qpn: 0x11,
            responder_resources: 16,
            initiator_depth: 16,
            remote_cm_response_timeout: 20,
            end_to_end_flow_control: true,
            starting_psn: 0x100,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 3,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            primary_path: path,
            private_data: pd,
            ..Req::default()
        };
        assert_eq!(req, want);
        assert_eq!(req.emit().as_slice(), d.as_slice());
    }

    #[test]
    fn every_bit_field() {
        let path = CmPath {
            local_lid: 0x1234,
            remote_lid: 0x5678,
            local_gid: [0x11; 16],
            remote_gid: [0x22; 16],
            flow_label: 0xABCDE,
            packet_rate: 0x2A,
            traffic_class: 0x33,
            hop_limit: 0x44,
            sl: 0xB,
            subnet_local: true,
            local_ack_timeout: 0x13,
        };
        let p = path.emit();
        assert_eq!(&p[36..44], &hex("abcde02a3344b898")[..]);
        assert_eq!(CmPath::parse(&p), Ok(path));
        let req = Req {
            local_comm_id: 0xA1A2_A3A4,
            service_id: 0xB1B2_B3B4_B5B6_B7B8,
            local_ca_guid: 0xC1C2_C3C4_C5C6_C7C8,
            local_qkey: 0xD1D2_D3D4,
            local_qpn: 0xE1_E2E3,
            responder_resources: 0xE4,
            local_eecn: 0xF1_F2F3,
            initiator_depth: 0xF4,
            remote_eecn: 0x01_0203,
            remote_cm_response_timeout: 0x15,
            transport_service_type: 3,
            end_to_end_flow_control: false,
            starting_psn: 0x05_0607,
            local_cm_response_timeout: 0x0A,
            retry_count: 5,
            pkey: 0x7FFF,
            path_mtu: 5,
            rdc_exists: true,
            rnr_retry_count: 6,
            max_cm_retries: 9,
            srq: true,
            extended_transport_type: 1,
            primary_path: path,
            alternate_path: CmPath { sl: 1, ..path },
            private_data: [0x5A; REQ_PRIVATE_LEN],
        };
        let d = req.emit();
        assert_eq!(
            &d[..52],
            &hex(concat!(
                "a1a2a3a400000000b1b2b3b4b5b6b7b8c1c2c3c4c5c6c7c800000000d1d2d3d4e1e2e3e4f1f2f3f4",
                "010203ae050607557fff5e99"
            ))[..]
        );
        assert_eq!(&d[52..96], &p[..]);
        assert_eq!(d[96 + 42], 0x18);
        assert_eq!(Req::parse(&d), Ok(req));

        // Out-of-range values are masked, reserved bits ignored on receive.
        let wide = Req {
            local_qpn: 0xFF00_0001,
            retry_count: 0xF,
            primary_path: CmPath {
                flow_label: 0xFFF0_0001,
                ..CmPath::default()
            },
            ..Req::default()
        };
        let got = Req::parse(&wide.emit()).unwrap();
        assert_eq!((got.local_qpn, got.retry_count, got.primary_path.flow_label), (1, 7, 1));
        let mut r = d;
        r[4] = 0xff;
        r[24] = 0xff;
        r[52 + 39] |= 0xC0;
        r[52 + 42] |= 0x07;
        r[52 + 43] |= 0x07;
        assert_eq!(Req::parse(&r), Ok(req));
        assert!(matches!(
            Req::parse(&d[..100]),
            Err(WireError::Truncated { need: 232, .. })
        ));
    }
}
