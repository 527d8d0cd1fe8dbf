//! Private big-endian field writers and bit-field helpers shared by the CM codecs.
//!
//! Readers come from [`crate::error`] (`be16`/`be32`/`be64`); callers check
//! lengths first, and every CM message body is a fixed 232-byte array.

/// Writes `v` big-endian at `at`; `buf` must hold `at + 2` bytes.
pub(crate) fn put16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes `v` big-endian at `at`; `buf` must hold `at + 4` bytes.
pub(crate) fn put32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// Writes `v` big-endian at `at`; `buf` must hold `at + 8` bytes.
pub(crate) fn put64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Reads a 24-bit field stored in the three bytes at `at` (the high bits of a 32-bit word).
pub(crate) fn get24(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, buf[at], buf[at + 1], buf[at + 2]])
}

/// Writes the low 24 bits of `v` into the three bytes at `at`.
pub(crate) fn put24(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

/// Extracts `width` bits of `byte` starting `offset` bits from the MSB (IBTA bit numbering).
pub(crate) fn bits(byte: u8, offset: u32, width: u32) -> u8 {
    (byte >> (8 - offset - width)) & mask(width)
}

/// Places the low `width` bits of `v` `offset` bits from the MSB of a byte.
pub(crate) fn place(v: u8, offset: u32, width: u32) -> u8 {
    (v & mask(width)) << (8 - offset - width)
}

/// Places a flag bit `offset` bits from the MSB of a byte.
pub(crate) fn flag(v: bool, offset: u32) -> u8 {
    place(u8::from(v), offset, 1)
}

fn mask(width: u32) -> u8 {
    ((1u16 << width) - 1) as u8
}

/// Copies the `N` bytes at `at` into an array; `buf` must hold `at + N` bytes.
pub(crate) fn array<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_fields_msb_first() {
        // REQ byte 43 from the golden capture: timeout 20 | type 0 | e2e 1.
        assert_eq!(bits(0xa1, 0, 5), 20);
        assert_eq!(bits(0xa1, 5, 2), 0);
        assert_eq!(bits(0xa1, 7, 1), 1);
        assert_eq!(place(20, 0, 5) | place(0, 5, 2) | flag(true, 7), 0xa1);
        assert_eq!(place(0xff, 2, 6), 0x3f);
        assert_eq!(bits(0xff, 0, 8), 0xff);
    }

    #[test]
    fn u24() {
        let mut b = [0xAAu8; 5];
        put24(&mut b, 1, 0xFF12_3456);
        assert_eq!(b, [0xAA, 0x12, 0x34, 0x56, 0xAA]);
        assert_eq!(get24(&b, 1), 0x12_3456);
        put16(&mut b, 0, 0x0102);
        put32(&mut b, 1, 0x0304_0506);
        assert_eq!(b, [1, 3, 4, 5, 6]);
        let mut c = [0u8; 9];
        put64(&mut c, 1, 0x0102_0304_0506_0708);
        assert_eq!(array::<3>(&c, 6), [6, 7, 8]);
    }
}
