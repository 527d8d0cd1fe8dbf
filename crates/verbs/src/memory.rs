//! Registered memory: the one audited place where softrdma touches application memory.
//!
//! A [`MemRegion`] is a raw `(ptr, len)` that the application promised (at registration,
//! an `unsafe` call) stays valid until deregistration. Every access goes through
//! [`MemRegion::read`] / [`MemRegion::write`], which check bounds first and then do one copy.
//! The progress thread writes into this memory while the application runs, exactly as an RNIC
//! would; synchronisation is the application's job (it polls the CQ, or spins on a flag byte).

use std::ptr::NonNull;

/// A raw, bounds-checked window onto application (or softrdma-owned) memory.
#[derive(Debug)]
pub struct MemRegion {
    base: NonNull<u8>,
    len: usize,
    /// Keeps softrdma-allocated buffers alive; `None` for application memory.
    _owned: Option<Box<[u8]>>,
}

// SAFETY: a MemRegion is a (pointer, length) pair into memory that the registrant guarantees
// outlives the region; all accesses are raw copies with no Rust references held across threads.
unsafe impl Send for MemRegion {}
// SAFETY: see `Send`: shared use only performs bounds-checked raw copies.
unsafe impl Sync for MemRegion {}

impl MemRegion {
    /// Wraps application memory.
    ///
    /// # Safety
    /// `base..base+len` must stay valid for reads and writes until the region is dropped.
    pub unsafe fn from_raw(base: *mut u8, len: usize) -> MemRegion {
        let base = NonNull::new(base).unwrap_or(NonNull::dangling());
        MemRegion {
            base,
            len,
            _owned: None,
        }
    }

    /// Allocates a zeroed buffer owned by the region.
    pub fn allocate(len: usize) -> MemRegion {
        let mut owned = vec![0u8; len].into_boxed_slice();
        let base = NonNull::new(owned.as_mut_ptr()).unwrap_or(NonNull::dangling());
        MemRegion {
            base,
            len,
            _owned: Some(owned),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address, as the application sees it.
    pub fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// Raw base pointer (for handing a buffer address to remote peers or C callers).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    fn check(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Copies `src` into the region at `offset`. Returns false (and copies nothing) when out of bounds.
    pub fn write(&self, offset: usize, src: &[u8]) -> bool {
        if !self.check(offset, src.len()) {
            return false;
        }
        if src.is_empty() {
            return true;
        }
        // SAFETY: bounds checked above; the registrant guarantees the memory is valid; `src` is a
        // distinct Rust slice (our own buffers never alias registered memory).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(offset), src.len()) };
        true
    }

    /// Copies from the region at `offset` into `dst`. Returns false (and copies nothing) when out of bounds.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        if !self.check(offset, dst.len()) {
            return false;
        }
        if dst.is_empty() {
            return true;
        }
        // SAFETY: bounds checked above; memory valid per the registration contract.
        unsafe { std::ptr::copy_nonoverlapping(self.base.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Reads one byte with a volatile load (for spinning on a flag byte a peer writes).
    pub fn read_volatile_u8(&self, offset: usize) -> Option<u8> {
        if offset >= self.len {
            return None;
        }
        // SAFETY: in bounds (checked above); memory valid per the registration contract.
        Some(unsafe { std::ptr::read_volatile(self.base.as_ptr().add(offset)) })
    }

    /// Appends `len` bytes at `offset` to `out`. Returns false (and appends nothing) when out of bounds.
    pub fn append_to(&self, offset: usize, len: usize, out: &mut Vec<u8>) -> bool {
        if !self.check(offset, len) {
            return false;
        }
        out.reserve(len);
        let start = out.len();
        // SAFETY: `check` proved offset..offset+len lies in the region, which is valid for reads
        // per the registration contract; `reserve` made room for `len` more bytes after
        // `start`, and they are initialised by the copy before `set_len` exposes them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr().add(offset), out.as_mut_ptr().add(start), len);
            out.set_len(start + len);
        }
        true
    }
}

/// Reads `len` bytes from an arbitrary application address (inline data from the C ABI).
///
/// # Safety
/// `addr..addr+len` must be readable.
pub unsafe fn copy_from_user(addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    if len > 0 {
        // SAFETY: the caller guarantees the source range is readable.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), len) };
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_before_copy() {
        let r = MemRegion::allocate(8);
        assert!(r.write(4, &[1, 2, 3, 4]));
        assert!(!r.write(5, &[9, 9, 9, 9]));
        assert!(!r.write(usize::MAX, &[1]));
        let mut out = [0u8; 8];
        assert!(r.read(0, &mut out));
        assert_eq!(out, [0, 0, 0, 0, 1, 2, 3, 4]);
        let mut v = Vec::new();
        assert!(!r.append_to(7, 2, &mut v));
        assert!(v.is_empty());
    }
}
