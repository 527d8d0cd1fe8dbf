//! The single error type returned by every decoder (and the few fallible encoders).

/// Why a byte string could not be decoded (or a value could not be encoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The input ends before the named structure does.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// The structure being decoded.
        what: &'static str,
        /// Bytes the structure needs.
        need: usize,
        /// Bytes that were available.
        have: usize,
    },
    /// The first bytes are neither `MPA ID Req Frame` nor `MPA ID Rep Frame`.
    #[error("not an MPA frame: bad key")]
    BadMpaKey,
    /// PD_Length (private data including any RFC 6581 IRD/ORD block) is over 512.
    #[error("MPA private data length {0} exceeds the RFC 5044 limit of 512")]
    PrivateDataTooLong(usize),
    /// The FPDU's CRC32c field does not match its contents.
    #[error("MPA CRC32c mismatch: frame carries {got:#010x}, computed {computed:#010x}")]
    BadCrc {
        /// CRC value carried by the frame.
        got: u32,
        /// CRC value computed over the frame.
        computed: u32,
    },
    /// DDP version (DV) field is not 1.
    #[error("unsupported DDP version {0} (expected 1)")]
    BadDdpVersion(u8),
    /// RDMAP version (RV) field is not 1.
    #[error("unsupported RDMAP version {0} (expected 1)")]
    BadRdmapVersion(u8),
    /// RDMAP opcode not defined by RFC 5040.
    #[error("unknown RDMAP opcode {0:#x}")]
    UnknownOpcode(u8),
    /// Any other structural violation.
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

/// Returns `Err(Truncated)` unless `buf` holds at least `need` bytes.
pub(crate) fn need(what: &'static str, buf: &[u8], need: usize) -> Result<(), WireError> {
    if buf.len() < need {
        Err(WireError::Truncated {
            what,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Big-endian u16 at `at`; caller has checked the length.
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Big-endian u32 at `at`; caller has checked the length.
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Big-endian u64 at `at`; caller has checked the length.
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        let e = WireError::BadCrc {
            got: 0x1234,
            computed: 0xE3069283,
        };
        assert_eq!(
            e.to_string(),
            "MPA CRC32c mismatch: frame carries 0x00001234, computed 0xe3069283"
        );
        assert_eq!(WireError::UnknownOpcode(0xa).to_string(), "unknown RDMAP opcode 0xa");
        assert_eq!(
            need("DDP header", &[0; 3], 14),
            Err(WireError::Truncated {
                what: "DDP header",
                need: 14,
                have: 3
            })
        );
    }

    #[test]
    fn readers() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(be16(&b, 1), 0x0203);
        assert_eq!(be32(&b, 0), 0x01020304);
        assert_eq!(be64(&b, 1), 0x0203040506070809);
    }
}
