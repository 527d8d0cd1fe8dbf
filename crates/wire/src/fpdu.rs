//! MPA FPDU framing without markers (RFC 5044 §4.1, §4.4).
//!
//! ```text
//! +-------------------------------+--------------------- - -
//! |     ULPDU_Length (16, BE)     |  ULPDU (DDP segment) ...
//! +-------------------------------+--------------------- - -
//!   ... | PAD (0-3 zero bytes, to a multiple of 4) | CRC32c (4) |
//! ```
//!
//! The CRC covers length, ULPDU and pad, and goes out least-significant byte
//! first. The CRC field is always present; without negotiated CRC it is zero
//! on send and ignored on receive. Markers (M flag) are not supported: the
//! connection setup must not agree to them.

use crate::crc32c::{crc32c, Crc32c};
use crate::error::{be16, WireError};

/// Largest ULPDU an FPDU can carry (16-bit length field).
pub const MPA_MAX_ULPDU: usize = 65535;
/// Bytes of the ULPDU_Length field.
pub const FPDU_LEN_FIELD: usize = 2;
/// Bytes of the CRC field.
pub const FPDU_CRC_LEN: usize = 4;

/// 2 (ULPDU_Length) + ulpdu_len + pad to a multiple of 4 + 4 (CRC field, always present).
pub fn fpdu_wire_len(ulpdu_len: usize) -> usize {
    let unpadded = FPDU_LEN_FIELD + ulpdu_len;
    unpadded + fpdu_pad_len(ulpdu_len) + FPDU_CRC_LEN
}

/// Zero bytes inserted after a ULPDU of `ulpdu_len` bytes.
pub fn fpdu_pad_len(ulpdu_len: usize) -> usize {
    (4 - (FPDU_LEN_FIELD + ulpdu_len) % 4) % 4
}

/// Appends one FPDU whose ULPDU is the concatenation of `parts` (total <= MPA_MAX_ULPDU, else Err(Malformed), nothing appended):
/// length field, parts, zero pad, then the CRC32c over length+ULPDU+pad written least-significant byte first when `crc`, or 4 zero bytes when not.
pub fn emit_fpdu(parts: &[&[u8]], crc: bool, out: &mut Vec<u8>) -> Result<(), WireError> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > MPA_MAX_ULPDU {
        return Err(WireError::Malformed("ULPDU longer than 65535 bytes"));
    }
    out.reserve(fpdu_wire_len(len));
    // len <= 65535 was checked above.
    let len_field = (len as u16).to_be_bytes();
    let pad = [0u8; 3];
    let pad = &pad[..fpdu_pad_len(len)];
    let mut sum = Crc32c::new();
    out.extend_from_slice(&len_field);
    sum.update(&len_field);
    for p in parts {
        out.extend_from_slice(p);
        sum.update(p);
    }
    out.extend_from_slice(pad);
    sum.update(pad);
    let trailer = if crc { sum.finish().to_le_bytes() } else { [0; 4] };
    out.extend_from_slice(&trailer);
    Ok(())
}

/// One FPDU found at the start of a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fpdu<'a> {
    /// The ULPDU (a DDP segment), without length field, pad or CRC.
    pub ulpdu: &'a [u8],
    /// Bytes the whole FPDU occupies in the stream; consume this many.
    pub wire_len: usize,
}

/// One FPDU view at the start of `buf`. Ok(None) = incomplete. With `crc`, verifies (BadCrc); without, ignores the CRC field.
pub fn parse_fpdu(buf: &[u8], crc: bool) -> Result<Option<Fpdu<'_>>, WireError> {
    if buf.len() < FPDU_LEN_FIELD {
        return Ok(None);
    }
    let len = usize::from(be16(buf, 0));
    let wire_len = fpdu_wire_len(len);
    if buf.len() < wire_len {
        return Ok(None);
    }
    let crc_at = wire_len - FPDU_CRC_LEN;
    if crc {
        let f = &buf[crc_at..wire_len];
        let got = u32::from_le_bytes([f[0], f[1], f[2], f[3]]);
        let computed = crc32c(&buf[..crc_at]);
        if got != computed {
            return Err(WireError::BadCrc { got, computed });
        }
    }
    Ok(Some(Fpdu {
        ulpdu: &buf[FPDU_LEN_FIELD..FPDU_LEN_FIELD + len],
        wire_len,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    /// Whole FPDUs (CRC on) from samples/good/iwarp_rfc6581.pcap, one per TCP segment.
    const GOOD: &[&str] = &[
        // zero-length RDMA Write (RFC 6581 RTR), pad 0
        "000ec140000000000000000000000000a30572ab",
        // Send "hello from soft-iWARP SEND", pad 2
        "002c41430000000000000000000000010000000068656c6c6f2066726f6d20736f66742d69574152502053454e440000b6973abe",
        // RDMA Write, pad 1
        "0021c1400012340000007f000000100052444d41205752495445207061796c6f61642100d4417b77",
        // Read Request
        "002e41410000000000000001000000010000000000abcd0000007f0000002000000000200056780000007f0000003000cba7748b",
        // Read Response
        "002ec14200abcd0000007f0000002000000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f3cab5238",
        // Send with Invalidate, pad 1
        "00254144001234000000000000000001000000007265706c7920772f20696e76616c6964617465001e9ffd87",
        // Terminate from samples/good/iwarp_rfc5044_terminate.pcap
        "002641470000000000000002000000010000000001004000000ec14000dead000000000000001000001530b5",
    ];
    /// Two FPDUs coalesced in one TCP segment.
    const COALESCED: &str = "001e414500000000000000000000000200000000636f616c6573636564202331cb58da1a001ac1400012340000007f0000001100636f616c65736365642023325c34c03a";
    /// samples/bad/iwarp_bad_mpa_crc.pcap: one payload bit of the Send flipped.
    const BAD_CRC: &str =
        "002c41430000000000000000000000010000000068656c6c6f2066726f6d20736f66742d69574152502052454e440000b6973abe";

    #[test]
    fn wire_len_and_pad() {
        assert_eq!(fpdu_wire_len(0), 8);
        assert_eq!(fpdu_wire_len(2), 8);
        assert_eq!(fpdu_wire_len(3), 12);
        assert_eq!(fpdu_wire_len(14), 20);
        assert_eq!(fpdu_wire_len(65535), 2 + 65535 + 3 + 4);
        assert_eq!(fpdu_pad_len(44), 2);
        assert_eq!(fpdu_pad_len(33), 1);
    }

    #[test]
    fn golden_roundtrip() {
        for h in GOOD {
            let b = hex(h);
            let f = parse_fpdu(&b, true).unwrap().unwrap();
            assert_eq!(f.wire_len, b.len());
            assert_eq!(fpdu_wire_len(f.ulpdu.len()), b.len());
            let mut out = Vec::new();
            // Split the ULPDU in two parts to exercise the gather path.
            let (a, z) = f.ulpdu.split_at(f.ulpdu.len() / 2);
            emit_fpdu(&[a, z], true, &mut out).unwrap();
            assert_eq!(out, b);
        }
    }

    #[test]
    fn coalesced_and_split() {
        let b = hex(COALESCED);
        let first = parse_fpdu(&b, true).unwrap().unwrap();
        assert_eq!(first.ulpdu.len(), 0x1e);
        let second = parse_fpdu(&b[first.wire_len..], true).unwrap().unwrap();
        assert_eq!(first.wire_len + second.wire_len, b.len());
        assert!(second.ulpdu.ends_with(b"coalesced #2"));
        // Every proper prefix is incomplete, never an error.
        for h in GOOD {
            let b = hex(h);
            for cut in 0..b.len() {
                assert_eq!(parse_fpdu(&b[..cut], true), Ok(None));
            }
        }
    }

    #[test]
    fn big_split_fpdu() {
        // Send of 300 x 'S' (pcap segments 100 + 224 bytes).
        let mut ulpdu = hex("414300000000000000000000000300000000");
        assert_eq!(ulpdu.len(), 18);
        ulpdu.extend_from_slice(&[b'S'; 300]);
        let mut out = Vec::new();
        emit_fpdu(&[&ulpdu], true, &mut out).unwrap();
        assert_eq!(out.len(), 324);
        assert_eq!(&out[..2], &[0x01, 0x3e]);
        assert_eq!(&out[320..], &hex("cb600e8f")[..]);
    }

    #[test]
    fn bad_crc() {
        let b = hex(BAD_CRC);
        assert_eq!(
            parse_fpdu(&b, true),
            Err(WireError::BadCrc {
                got: 0xbe3a97b6,
                computed: crc32c(&b[..b.len() - 4])
            })
        );
        // Without CRC the field is ignored.
        let f = parse_fpdu(&b, false).unwrap().unwrap();
        assert_eq!(f.wire_len, b.len());
    }

    #[test]
    fn no_crc_and_limits() {
        let mut out = Vec::new();
        emit_fpdu(&[b"abc"], false, &mut out).unwrap();
        assert_eq!(out, [0, 3, b'a', b'b', b'c', 0, 0, 0, 0, 0, 0, 0]);
        emit_fpdu(&[], true, &mut out).unwrap();
        assert_eq!(&out[12..14], &[0, 0]);
        let big = vec![0u8; 40000];
        let mut out = Vec::new();
        assert!(matches!(
            emit_fpdu(&[&big, &big], true, &mut out),
            Err(WireError::Malformed(_))
        ));
        assert!(out.is_empty());
        emit_fpdu(&[&big, &big[..MPA_MAX_ULPDU - 40000]], true, &mut out).unwrap();
        let f = parse_fpdu(&out, true).unwrap().unwrap();
        assert_eq!((f.ulpdu.len(), f.wire_len), (MPA_MAX_ULPDU, out.len()));
    }
}
