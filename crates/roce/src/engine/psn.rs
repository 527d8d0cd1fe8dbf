//! 24-bit packet sequence numbers (IBTA vol. 1, 9.4): arithmetic and ordering with wraparound.
//!
//! Two PSNs are ordered by their signed distance modulo 2^24, so any two PSNs less than 2^23
//! apart compare correctly across the wrap from 0xFFFFFF to 0.

use softrdma_wire::roce::PSN_MASK;
use std::fmt;

/// A packet sequence number (the low 24 bits of a `u32`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// A PSN from any `u32` (the high 8 bits are dropped).
    pub const fn new(v: u32) -> Psn {
        Psn(v & PSN_MASK)
    }

    /// The 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// `self + n`, wrapping at 2^24.
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n`, wrapping at 2^24.
    pub const fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The signed distance `self - other` in -2^23..2^23: positive if `self` is later.
    pub const fn diff(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back to sign-extend it.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// The unsigned distance from `base` forward to `self` (0..2^24).
    pub const fn offset_from(self, base: Psn) -> u32 {
        self.0.wrapping_sub(base.0) & PSN_MASK
    }

    /// True if `self` lies in `[start, start + len)`.
    pub const fn in_range(self, start: Psn, len: u32) -> bool {
        self.offset_from(start) < len
    }

    /// True if `self` is strictly before `other`.
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True if `self` is strictly after `other`.
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Psn;

    #[test]
    fn wraps_and_orders() {
        let top = Psn::new(0xff_fffe);
        assert_eq!(top.add(3).get(), 1);
        assert_eq!(Psn::new(1).sub(3).get(), 0xff_fffe);
        assert_eq!(top.add(3).diff(top), 3);
        assert_eq!(top.diff(top.add(3)), -3);
        assert!(top.before(Psn::new(0)));
        assert!(Psn::new(0).after(top));
        assert_eq!(Psn::new(0x0100_0005).get(), 5);
        assert_eq!(Psn::new(2).offset_from(top), 4);
        assert!(Psn::new(0).in_range(top, 3));
        assert!(!Psn::new(1).in_range(top, 3));
        assert_eq!(Psn::new(0x40_0000).diff(Psn::new(0)), 0x40_0000);
        assert_eq!(Psn::new(0).diff(Psn::new(0x80_0001)), 0x7f_ffff);
    }
}
