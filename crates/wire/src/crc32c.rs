//! CRC32c (Castagnoli), the MPA FPDU checksum (RFC 5044 §4.4, same as iSCSI RFC 3720).
//!
//! Backed by the `crc32c` crate, which uses SSE4.2 / ARMv8 CRC instructions when
//! the CPU has them. The value is the standard one (reflected, init and final
//! xor `0xFFFF_FFFF`); MPA puts it on the wire least-significant byte first.

/// CRC32c of `data` in one call.
pub fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

/// Incremental CRC32c: feed pieces with [`Crc32c::update`], read with [`Crc32c::finish`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Crc32c {
    state: u32,
}

impl Crc32c {
    /// A fresh computation (CRC of the empty string so far).
    pub fn new() -> Self {
        Self { state: 0 }
    }

    /// Appends `data` to the bytes covered.
    pub fn update(&mut self, data: &[u8]) {
        self.state = ::crc32c::crc32c_append(self.state, data);
    }

    /// CRC32c of everything fed so far; the computation can continue afterwards.
    pub fn finish(&self) -> u32 {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        // RFC 3720 B.4: 32 bytes of zeros; on the wire (LSB first) aa 36 91 8a.
        assert_eq!(crc32c(&[0; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0; 32]).to_le_bytes(), [0xaa, 0x36, 0x91, 0x8a]);
        // RFC 3720 B.4: 32 bytes of 0xff, and 0..=31 ascending.
        assert_eq!(crc32c(&[0xff; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn golden_fpdu_crc() {
        // Zero-length RDMA Write FPDU from samples/good/iwarp_rfc6581.pcap.
        let body = [0x00, 0x0e, 0xc1, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(crc32c(&body).to_le_bytes(), [0xa3, 0x05, 0x72, 0xab]);
    }

    #[test]
    fn incremental_matches_one_shot() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for split in [0, 1, 3, 4, 17, 500, 999, 1000] {
            let mut c = Crc32c::new();
            c.update(&data[..split]);
            c.update(&data[split..]);
            assert_eq!(c.finish(), crc32c(&data), "split at {split}");
        }
        assert_eq!(Crc32c::default().finish(), 0);
        let mut c = Crc32c::new();
        for b in b"123456789" {
            c.update(&[*b]);
        }
        assert_eq!(c.finish(), 0xE306_9283);
    }
}
