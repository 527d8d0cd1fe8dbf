//! RDMAP (RFC 5040): opcodes, the RDMA Read Request header (§4.4) and the
//! Terminate error codes (§7, with RFC 5041 §7 and RFC 5044 §8 / RFC 6581).
//! The Terminate message itself lives in [`crate::terminate`].

use crate::ddp::{QN_READ_REQUEST, QN_SEND, QN_TERMINATE};
use crate::error::{be32, be64, need, WireError};

pub use crate::terminate::{TermLayer, Terminate};

/// RDMAP opcode, the low 4 bits of the RDMAP control byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (tagged).
    RdmaWrite = 0,
    /// RDMA Read Request (untagged, QN 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send (untagged, QN 0).
    Send = 3,
    /// Send with Invalidate (untagged, QN 0).
    SendInvalidate = 4,
    /// Send with Solicited Event (untagged, QN 0).
    SendSe = 5,
    /// Send with Solicited Event and Invalidate (untagged, QN 0).
    SendSeInvalidate = 6,
    /// Terminate (untagged, QN 2).
    Terminate = 7,
}

impl Opcode {
    /// Decodes an opcode; 8..=15 (and RFC 7306 atomics) give UnknownOpcode.
    pub fn from_u8(v: u8) -> Result<Opcode, WireError> {
        Ok(match v {
            0 => Opcode::RdmaWrite,
            1 => Opcode::ReadRequest,
            2 => Opcode::ReadResponse,
            3 => Opcode::Send,
            4 => Opcode::SendInvalidate,
            5 => Opcode::SendSe,
            6 => Opcode::SendSeInvalidate,
            7 => Opcode::Terminate,
            _ => return Err(WireError::UnknownOpcode(v)),
        })
    }

    /// True for the tagged-buffer messages: RDMA Write and Read Response.
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::RdmaWrite | Opcode::ReadResponse)
    }

    /// The untagged queue number this message must use (None for tagged ones).
    pub fn queue_number(self) -> Option<u32> {
        match self {
            Opcode::RdmaWrite | Opcode::ReadResponse => None,
            Opcode::ReadRequest => Some(QN_READ_REQUEST),
            Opcode::Terminate => Some(QN_TERMINATE),
            _ => Some(QN_SEND),
        }
    }
}

/// RDMA Read Request payload length: sink STag, sink TO, size, source STag, source TO.
pub const READ_REQUEST_LEN: usize = 28;

/// The RDMA Read Request header, the whole payload of an untagged QN=1 segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// Data sink STag (requester's buffer).
    pub sink_stag: u32,
    /// Data sink tagged offset.
    pub sink_to: u64,
    /// RDMA Read message size in bytes.
    pub size: u32,
    /// Data source STag (responder's buffer).
    pub src_stag: u32,
    /// Data source tagged offset.
    pub src_to: u64,
}

impl ReadRequest {
    /// Parses exactly 28 bytes: fewer is Truncated, more is Malformed.
    pub fn parse(b: &[u8]) -> Result<ReadRequest, WireError> {
        need("RDMA Read Request", b, READ_REQUEST_LEN)?;
        if b.len() > READ_REQUEST_LEN {
            return Err(WireError::Malformed("RDMA Read Request longer than 28 bytes"));
        }
        Ok(ReadRequest {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            src_stag: be32(b, 16),
            src_to: be64(b, 20),
        })
    }

    /// Appends the 28 bytes.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.sink_stag.to_be_bytes());
        out.extend_from_slice(&self.sink_to.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.src_stag.to_be_bytes());
        out.extend_from_slice(&self.src_to.to_be_bytes());
    }
}

/// Terminate error types and codes (layer / etype / code), as registered by IANA (RFC 6580).
///
/// Values checked against RFC 5040 §7, RFC 5041 §7, RFC 5044 §8 / RFC 6581,
/// Linux siw `iwarp.h` and Wireshark's `packet-iwarp-ddp-rdmap.c`.
pub mod term {
    use crate::terminate::TermLayer;

    /// Layer 0: RDMAP error types and codes (RFC 5040 §7).
    pub mod rdmap {
        /// Error type: local catastrophic error (any code).
        pub const LOCAL_CATASTROPHIC: u8 = 0;
        /// Error type: remote protection error.
        pub const REMOTE_PROTECTION: u8 = 1;
        /// Error type: remote operation error.
        pub const REMOTE_OPERATION: u8 = 2;

        /// Code: invalid STag.
        pub const INVALID_STAG: u8 = 0x00;
        /// Code: base or bounds violation.
        pub const BASE_BOUNDS: u8 = 0x01;
        /// Code: access rights violation.
        pub const ACCESS_RIGHTS: u8 = 0x02;
        /// Code: STag not associated with this RDMAP stream.
        pub const STAG_NOT_ASSOC: u8 = 0x03;
        /// Code: tagged offset wrap.
        pub const TO_WRAP: u8 = 0x04;
        /// Code: invalid RDMAP version.
        pub const INVALID_RDMAP_VERSION: u8 = 0x05;
        /// Code: unexpected opcode.
        pub const UNEXPECTED_OPCODE: u8 = 0x06;
        /// Code: catastrophic error, localized to the RDMAP stream.
        pub const CATASTROPHIC_STREAM: u8 = 0x07;
        /// Code: catastrophic error, global.
        pub const CATASTROPHIC_GLOBAL: u8 = 0x08;
        /// Code: STag cannot be invalidated.
        pub const STAG_CANNOT_INVALIDATE: u8 = 0x09;
        /// Code: unspecified error.
        pub const UNSPECIFIED: u8 = 0xff;
    }

    /// Layer 1: DDP error types (RFC 5041 §7).
    pub mod ddp {
        /// Error type: local catastrophic error (code 0).
        pub const CATASTROPHIC: u8 = 0;
        /// Error type: tagged buffer error, codes in [`tagged`].
        pub const TAGGED_BUFFER: u8 = 1;
        /// Error type: untagged buffer error, codes in [`untagged`].
        pub const UNTAGGED_BUFFER: u8 = 2;

        /// Codes for [`TAGGED_BUFFER`].
        pub mod tagged {
            /// Invalid STag.
            pub const INVALID_STAG: u8 = 0x00;
            /// Base or bounds violation.
            pub const BASE_BOUNDS: u8 = 0x01;
            /// STag not associated with this DDP stream.
            pub const STAG_NOT_ASSOC: u8 = 0x02;
            /// Tagged offset wrap.
            pub const TO_WRAP: u8 = 0x03;
            /// Invalid DDP version.
            pub const INVALID_DDP_VERSION: u8 = 0x04;
        }

        /// Codes for [`UNTAGGED_BUFFER`].
        pub mod untagged {
            /// Invalid queue number.
            pub const INVALID_QN: u8 = 0x01;
            /// Invalid MSN: no buffer available.
            pub const INVALID_MSN_NO_BUFFER: u8 = 0x02;
            /// Invalid MSN: MSN range is not valid.
            pub const INVALID_MSN_RANGE: u8 = 0x03;
            /// Invalid message offset.
            pub const INVALID_MO: u8 = 0x04;
            /// DDP message too long for the available buffer.
            pub const MSG_TOO_LONG: u8 = 0x05;
            /// Invalid DDP version.
            pub const INVALID_DDP_VERSION: u8 = 0x06;
        }
    }

    /// Layer 2: LLP (MPA) error type and codes (RFC 5044 §8, RFC 6581 §9).
    pub mod llp {
        /// Error type: MPA error (the only one).
        pub const MPA: u8 = 0;
        /// Code: TCP connection closed, terminated or lost.
        pub const TCP_STREAM_LOST: u8 = 0x01;
        /// Code: MPA CRC error.
        pub const CRC_ERROR: u8 = 0x02;
        /// Code: MPA marker and ULPDU length disagree on the FPDU start.
        pub const MARKER_ERROR: u8 = 0x03;
        /// Code: unexpected or invalid MPA Request / Reply frame.
        pub const INVALID_REQ_REP: u8 = 0x04;
        /// Code: local catastrophic error (RFC 6581 enhanced setup).
        pub const LOCAL_CATASTROPHIC: u8 = 0x05;
        /// Code: insufficient IRD resources (RFC 6581).
        pub const INSUFFICIENT_IRD: u8 = 0x06;
        /// Code: no matching RTR option (RFC 6581).
        pub const NO_MATCHING_RTR: u8 = 0x07;
    }

    /// Human name of an error type, e.g. "remote protection error".
    pub fn etype_name(layer: TermLayer, etype: u8) -> Option<&'static str> {
        Some(match (layer, etype) {
            (TermLayer::Rdmap, 0) => "local catastrophic error",
            (TermLayer::Rdmap, 1) => "remote protection error",
            (TermLayer::Rdmap, 2) => "remote operation error",
            (TermLayer::Ddp, 0) => "local catastrophic error",
            (TermLayer::Ddp, 1) => "tagged buffer error",
            (TermLayer::Ddp, 2) => "untagged buffer error",
            (TermLayer::Llp, 0) => "MPA error",
            _ => return None,
        })
    }

    /// Human name of an error code within its layer and type, e.g. "invalid STag".
    pub fn code_name(layer: TermLayer, etype: u8, code: u8) -> Option<&'static str> {
        match layer {
            TermLayer::Rdmap if etype <= 2 => rdmap_code(code),
            TermLayer::Ddp => ddp_code(etype, code),
            TermLayer::Llp if etype == llp::MPA => llp_code(code),
            _ => None,
        }
    }

    fn rdmap_code(code: u8) -> Option<&'static str> {
        Some(match code {
            0x00 => "invalid STag",
            0x01 => "base or bounds violation",
            0x02 => "access rights violation",
            0x03 => "STag not associated with RDMAP stream",
            0x04 => "TO wrap",
            0x05 => "invalid RDMAP version",
            0x06 => "unexpected opcode",
            0x07 => "catastrophic error, localized to RDMAP stream",
            0x08 => "catastrophic error, global",
            0x09 => "STag cannot be invalidated",
            0xff => "unspecified error",
            _ => return None,
        })
    }

    fn ddp_code(etype: u8, code: u8) -> Option<&'static str> {
        Some(match (etype, code) {
            (0, 0x00) => "unspecified",
            (1, 0x00) => "invalid STag",
            (1, 0x01) => "base or bounds violation",
            (1, 0x02) => "STag not associated with DDP stream",
            (1, 0x03) => "TO wrap",
            (1, 0x04) => "invalid DDP version",
            (2, 0x01) => "invalid QN",
            (2, 0x02) => "invalid MSN, no buffer available",
            (2, 0x03) => "invalid MSN, MSN range is not valid",
            (2, 0x04) => "invalid MO",
            (2, 0x05) => "DDP message too long for available buffer",
            (2, 0x06) => "invalid DDP version",
            _ => return None,
        })
    }

    fn llp_code(code: u8) -> Option<&'static str> {
        Some(match code {
            0x01 => "TCP connection closed, terminated or lost",
            0x02 => "MPA CRC error",
            0x03 => "MPA marker and ULPDU length mismatch",
            0x04 => "invalid MPA Request or Reply frame",
            0x05 => "local catastrophic error",
            0x06 => "insufficient IRD resources",
            0x07 => "no matching RTR option",
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    #[test]
    fn opcodes() {
        for v in 0..=7u8 {
            let op = Opcode::from_u8(v).unwrap();
            assert_eq!(op as u8, v);
            assert_eq!(op.is_tagged(), v == 0 || v == 2);
            assert_eq!(op.queue_number().is_none(), op.is_tagged());
        }
        for v in 8..=255u8 {
            assert_eq!(Opcode::from_u8(v), Err(WireError::UnknownOpcode(v)));
        }
        assert_eq!(Opcode::ReadRequest.queue_number(), Some(QN_READ_REQUEST));
        assert_eq!(Opcode::Terminate.queue_number(), Some(QN_TERMINATE));
        assert_eq!(Opcode::SendSeInvalidate.queue_number(), Some(QN_SEND));
    }

    #[test]
    fn golden_read_request() {
        // Payload of the Read Request FPDU in samples/good/iwarp_rfc6581.pcap.
        let b = hex("00abcd0000007f0000002000000000200056780000007f0000003000");
        let rr = ReadRequest::parse(&b).unwrap();
        assert_eq!(
            rr,
            ReadRequest {
                sink_stag: 0x00ABCD00,
                sink_to: 0x7F00_0000_2000,
                size: 32,
                src_stag: 0x00567800,
                src_to: 0x7F00_0000_3000,
            }
        );
        let mut out = Vec::new();
        rr.emit(&mut out);
        assert_eq!(out, b);
        assert!(matches!(
            ReadRequest::parse(&b[..27]),
            Err(WireError::Truncated { need: 28, have: 27, .. })
        ));
        out.push(0);
        assert!(matches!(ReadRequest::parse(&out), Err(WireError::Malformed(_))));
    }

    #[test]
    fn term_values() {
        // Spot checks against siw iwarp.h / Wireshark value_strings.
        assert_eq!(term::rdmap::STAG_CANNOT_INVALIDATE, 0x09);
        assert_eq!(term::rdmap::UNSPECIFIED, 0xff);
        assert_eq!(term::ddp::tagged::INVALID_DDP_VERSION, 4);
        assert_eq!(term::ddp::untagged::INVALID_DDP_VERSION, 6);
        assert_eq!(term::llp::CRC_ERROR, 2);
        assert_eq!(term::llp::NO_MATCHING_RTR, 7);
        assert_eq!(term::code_name(TermLayer::Ddp, term::ddp::UNTAGGED_BUFFER, 0), None);
        assert_eq!(
            term::code_name(TermLayer::Llp, term::llp::MPA, term::llp::MARKER_ERROR),
            Some("MPA marker and ULPDU length mismatch")
        );
        assert_eq!(term::etype_name(TermLayer::Llp, 1), None);
    }
}
