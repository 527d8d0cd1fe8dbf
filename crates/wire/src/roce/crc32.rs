//! CRC-32 (IEEE 802.3 / Ethernet / zlib): reflected polynomial 0xEDB88320,
//! initial value and final xor 0xFFFF_FFFF. The RoCEv2 ICRC uses this CRC.
//!
//! Run-time updates go through the `crc32fast` crate (PCLMULQDQ / ARMv8 CRC
//! instructions when the CPU has them, a table-driven loop otherwise; over 10x
//! faster than a table on full-MTU packets). [`Crc32::update_const`] is a
//! byte-at-a-time table version usable in `const` items, for fixed prefixes.

/// The reflected polynomial (bit 31 is the coefficient of x^0, bit 0 that of x^31; x^32 implied).
pub(crate) const POLY: u32 = 0xEDB8_8320;

const fn make_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

/// `TABLE[i]` is the raw register after byte `i` from register 0, i.e. `i * x^8 mod P` (reflected).
pub(crate) const TABLE: [u32; 256] = make_table();

/// Incremental CRC-32: feed pieces with [`Crc32::update`], read with [`Crc32::finish`].
///
/// The state is the CRC of the bytes fed so far, so a computation can be resumed
/// from any earlier [`finish`](Crc32::finish) value with [`Crc32::resume`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Crc32 {
    crc: u32,
}

impl Crc32 {
    /// A fresh computation (CRC of the empty string so far).
    pub const fn new() -> Self {
        Crc32 { crc: 0 }
    }

    /// Continues a computation whose bytes so far have CRC `crc`.
    pub const fn resume(crc: u32) -> Self {
        Crc32 { crc }
    }

    /// Appends `data` (compile-time usable; one byte per step, meant for short constants).
    pub const fn update_const(self, data: &[u8]) -> Self {
        let mut reg = !self.crc;
        let mut i = 0;
        while i < data.len() {
            reg = TABLE[((reg ^ data[i] as u32) & 0xff) as usize] ^ (reg >> 8);
            i += 1;
        }
        Crc32 { crc: !reg }
    }

    /// Appends `data` to the bytes covered.
    pub fn update(&mut self, data: &[u8]) {
        let mut h = crc32fast::Hasher::new_with_initial(self.crc);
        h.update(data);
        self.crc = h.finalize();
    }

    /// CRC-32 of everything fed so far; the computation can continue afterwards.
    pub const fn finish(&self) -> u32 {
        self.crc
    }
}

/// CRC-32 (IEEE) of `data` in one call.
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time reference.
    fn slow(data: &[u8]) -> u32 {
        let mut c = 0xFFFF_FFFFu32;
        for &b in data {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
        }
        !c
    }

    #[test]
    fn known_answers() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"The quick brown fox jumps over the lazy dog"), 0x414F_A339);
        assert_eq!(crc32(&[0; 32]), 0x190A_55AD);
        assert_eq!(crc32(&[0xff; 32]), 0xFF6C_AB0B);
        assert_eq!(Crc32::new().update_const(b"123456789").finish(), 0xCBF4_3926);
        assert_eq!(Crc32::default(), Crc32::new());
    }

    #[test]
    fn matches_bitwise_and_splits() {
        let data: Vec<u8> = (0..1000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 999, 1000] {
            assert_eq!(crc32(&data[..len]), slow(&data[..len]), "len {len}");
            assert_eq!(Crc32::new().update_const(&data[..len]).finish(), slow(&data[..len]));
        }
        for split in [0, 1, 3, 16, 17, 500, 1000] {
            let mut c = Crc32::new();
            c.update(&data[..split]);
            c.update(&data[split..]);
            assert_eq!(c.finish(), slow(&data), "split {split}");
            let mut k = Crc32::new().update_const(&data[..split]);
            k.update(&data[split..]);
            assert_eq!(k.finish(), slow(&data));
            let mut r = Crc32::resume(crc32(&data[..split]));
            r.update(&data[split..]);
            assert_eq!(r.finish(), slow(&data));
        }
    }
}
