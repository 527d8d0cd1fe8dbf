//! Registered memory: the one audited place where softrdma touches application memory.
//!
//! A [`MemRegion`] is a raw `(ptr, len)` that the application promised (at registration,
//! an `unsafe` call) stays valid until deregistration. Every access goes through
//! [`MemRegion::read`] / [`MemRegion::write`] / [`MemRegion::append_to`], which check bounds,
//! take a lease on the region, and do one guarded copy:
//! - **Leases.** [`MemRegion::revoke`] (called by deregistration) refuses new accesses and
//!   waits until the ones in progress have ended, so no byte of the buffer is read or written
//!   after `ibv_dereg_mr` returns; a work request that still names it fails its copy and
//!   completes with an error.
//! - **Guarded copies** (`guarded_copy.rs`): a fault in the copy (the application unmapped or
//!   protected the buffer without deregistering it) is a failed access, never a signal.
//! - **Socket I/O straight from and into the region** ([`socket_io`]): `sendmsg` over the
//!   caller's headers and leased ranges of registered memory, `recvmsg` into a leased range,
//!   so the kernel's copy is the only one; an unreadable or unwritable page is EFAULT from the
//!   kernel's own fault-checked copy.
//! - **Checked ranges** ([`mapping`]): registration refuses a range that is not mapped with
//!   the protections its access flags need, as the kernel's pinning does.
//!
//! The progress thread writes into this memory while the application runs, exactly as an RNIC
//! would; synchronisation is the application's job (it polls the CQ, or spins on a flag byte).

mod guarded_copy;
pub mod mapping;
pub mod socket_io;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Set in [`MemRegion::lease`] once the region is revoked; the low bits count accesses.
const REVOKED: u64 = 1 << 63;

/// A raw, bounds-checked window onto application (or softrdma-owned) memory.
#[derive(Debug)]
pub struct MemRegion {
    base: NonNull<u8>,
    len: usize,
    /// Accesses in progress, plus [`REVOKED`].
    lease: AtomicU64,
    /// Keeps softrdma-allocated buffers alive; `None` for application memory.
    _owned: Option<Box<[u8]>>,
}

// SAFETY: a MemRegion is a (pointer, length) pair into memory that the registrant guarantees
// outlives the region; all accesses are raw copies with no Rust references held across threads.
unsafe impl Send for MemRegion {}
// SAFETY: see `Send`: shared use only performs bounds-checked raw copies.
unsafe impl Sync for MemRegion {}

/// One access in progress; ends when dropped.
struct Lease<'a>(&'a AtomicU64);

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl MemRegion {
    /// Wraps application memory.
    ///
    /// # Safety
    /// `base..base+len` must stay valid for reads and writes until the region is revoked or
    /// dropped. (A violation, such as unmapping it first, makes accesses fail rather than
    /// fault; see the module text.)
    pub unsafe fn from_raw(base: *mut u8, len: usize) -> MemRegion {
        let base = NonNull::new(base).unwrap_or(NonNull::dangling());
        MemRegion {
            base,
            len,
            lease: AtomicU64::new(0),
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
            lease: AtomicU64::new(0),
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

    /// Checks that application memory is mapped with the protections an MR with write access
    /// (`write`) or read-only access needs (softrdma's own buffers always are). `what` names
    /// the call in the error.
    pub fn check_mapped(&self, what: &str, write: bool) -> crate::Result<()> {
        if self._owned.is_some() {
            return Ok(());
        }
        mapping::check_range(what, self.addr(), self.len, write)
    }

    /// Refuses every later access and returns once no access is in progress. After this, no
    /// byte of the memory is touched through the region again (deregistration calls it).
    pub fn revoke(&self) {
        let prev = self.lease.fetch_or(REVOKED, Ordering::AcqRel);
        if prev & !REVOKED == 0 {
            return;
        }
        // Accesses are single bounded copies: spin briefly, then yield.
        let mut spins = 0u32;
        while self.lease.load(Ordering::Acquire) & !REVOKED != 0 {
            if spins < 1000 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// True once [`MemRegion::revoke`] ran.
    pub fn is_revoked(&self) -> bool {
        self.lease.load(Ordering::Acquire) & REVOKED != 0
    }

    /// Starts an access of `[offset, offset+len)`: None when out of bounds or revoked.
    fn lease(&self, offset: usize, len: usize) -> Option<Lease<'_>> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return None;
        }
        let prev = self.lease.fetch_add(1, Ordering::Acquire);
        let lease = Lease(&self.lease);
        (prev & REVOKED == 0).then_some(lease)
    }

    /// Copies `src` into the region at `offset`. Returns false when out of bounds, revoked, or
    /// the memory faulted (then a prefix may have been written, as a failed DMA would).
    pub fn write(&self, offset: usize, src: &[u8]) -> bool {
        let Some(_lease) = self.lease(offset, src.len()) else {
            return false;
        };
        // SAFETY: in bounds (checked by `lease`), not revoked while the lease is held, and
        // `src` is a distinct Rust slice (our own buffers never alias registered memory). A
        // fault is reported, not taken.
        unsafe { guarded_copy::copy(self.base.as_ptr().add(offset), src.as_ptr(), src.len()) == 0 }
    }

    /// Copies from the region at `offset` into `dst`. Returns false when out of bounds,
    /// revoked, or the memory faulted.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        let Some(_lease) = self.lease(offset, dst.len()) else {
            return false;
        };
        // SAFETY: as in `write`, with the roles swapped.
        unsafe { guarded_copy::copy(dst.as_mut_ptr(), self.base.as_ptr().add(offset), dst.len()) == 0 }
    }

    /// Hands the bytes of `[offset, offset+len)` to `f` in order, 4 KiB at a time, each through a
    /// guarded copy into a buffer on the stack (for a checksum over payload that socket I/O
    /// placed in the region or will send from it). Returns false when out of bounds, revoked,
    /// or the memory faulted (then `f` may have seen a prefix).
    pub fn read_chunks(&self, offset: usize, len: usize, mut f: impl FnMut(&[u8])) -> bool {
        let Some(_lease) = self.lease(offset, len) else {
            return false;
        };
        let mut chunk = [0u8; 4096];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len());
            // SAFETY: `lease` proved offset..offset+len lies in the region, which stays
            // registered while the lease is held; `chunk` is our own stack buffer of at least
            // `n` bytes. A fault is reported, not taken.
            if unsafe { guarded_copy::copy(chunk.as_mut_ptr(), self.base.as_ptr().add(offset + done), n) } != 0 {
                return false;
            }
            f(&chunk[..n]);
            done += n;
        }
        true
    }

    /// Reads one byte with a guarded load (for spinning on a flag byte a peer writes): None
    /// when out of bounds, revoked or faulting.
    pub fn read_volatile_u8(&self, offset: usize) -> Option<u8> {
        let mut b = [0u8; 1];
        self.read(offset, &mut b).then_some(b[0])
    }

    /// Appends `len` bytes at `offset` to `out`. Returns false (and appends nothing) when out
    /// of bounds, revoked, or the memory faulted.
    pub fn append_to(&self, offset: usize, len: usize, out: &mut Vec<u8>) -> bool {
        let Some(_lease) = self.lease(offset, len) else {
            return false;
        };
        out.reserve(len);
        let start = out.len();
        // SAFETY: `lease` proved offset..offset+len lies in the region, which stays
        // registered while the lease is held; `reserve` made room for `len` more bytes after
        // `start`. They are exposed by `set_len` only after a complete copy initialised them.
        unsafe {
            if guarded_copy::copy(out.as_mut_ptr().add(start), self.base.as_ptr().add(offset), len) != 0 {
                return false;
            }
            out.set_len(start + len);
        }
        true
    }
}

/// Reads `len` bytes from an arbitrary application address (inline data from the C ABI).
/// None when the range is not readable (the copy faulted).
///
/// # Safety
/// `addr..addr+len` must not be memory Rust code holds a mutable reference to.
pub unsafe fn copy_from_user(addr: u64, len: usize) -> Option<Vec<u8>> {
    let mut v = vec![0u8; len];
    // SAFETY: `v` is our own buffer of `len` bytes; a fault on the source is reported.
    let left = unsafe { guarded_copy::copy(v.as_mut_ptr(), addr as *const u8, len) };
    (left == 0).then_some(v)
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

    #[test]
    fn a_revoked_region_is_never_touched_again() {
        let r = MemRegion::allocate(8);
        assert!(r.write(0, &[1; 8]));
        r.revoke();
        assert!(r.is_revoked());
        assert!(!r.write(0, &[2; 8]));
        let mut out = [0u8; 8];
        assert!(!r.read(0, &mut out));
        assert_eq!(r.read_volatile_u8(0), None);
        let mut v = Vec::new();
        assert!(!r.append_to(0, 8, &mut v));
        assert!(v.is_empty());
        assert!(!r.read_chunks(0, 8, |_| panic!("a revoked region handed out bytes")));
        r.revoke();
    }

    #[test]
    fn read_chunks_hands_out_the_range_in_order_and_stops_at_a_fault() {
        let r = MemRegion::allocate(10_000);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 13) as u8).collect();
        assert!(r.write(0, &data));
        let (mut seen, mut calls) = (Vec::new(), 0);
        assert!(r.read_chunks(3, 9_990, |c| {
            seen.extend_from_slice(c);
            calls += 1;
        }));
        assert_eq!(seen, &data[3..9_993]);
        assert_eq!(calls, 3, "4 KiB at a time");
        assert!(!r.read_chunks(9_000, 1_001, |_| panic!("out of bounds")));

        // Application memory whose second page was protected behind the region's back.
        let m = guarded_copy::tests::HalfProtected::new();
        // SAFETY: the mapping outlives `app` (dropped first, in reverse order of declaration);
        // accesses that fault are reported.
        let app = unsafe { MemRegion::from_raw(m.base, 2 * m.page) };
        let mut got = 0;
        assert!(!app.read_chunks(0, 2 * m.page, |c| got += c.len()));
        assert_eq!(got, m.page, "the readable page only");
    }

    #[test]
    fn revoke_waits_for_accesses_in_progress() {
        use std::sync::Arc;
        let r = Arc::new(MemRegion::allocate(1 << 20));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|i| {
                let (r, stop) = (r.clone(), stop.clone());
                std::thread::spawn(move || {
                    let chunk = vec![i as u8 + 1; 1 << 20];
                    while !stop.load(Ordering::Relaxed) && r.write(0, &chunk) {}
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        r.revoke();
        // Nothing writes after revoke returned: the contents stay as they are now.
        let snapshot = r._owned.as_ref().map(|b| b.to_vec());
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(r._owned.as_ref().map(|b| b.to_vec()), snapshot);
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
    }
}
