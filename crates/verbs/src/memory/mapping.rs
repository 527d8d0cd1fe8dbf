//! Registration checks a range the way the kernel's pinning does: every page mapped, readable,
//! and writable where the access flags let softrdma or a peer write it.
//!
//! Linux pins an MR's pages at `ibv_reg_mr` (`ib_umem_get`): a range that wraps around the
//! address space is EINVAL; an unmapped page, a `PROT_NONE` page, or a read-only page under
//! `IBV_ACCESS_LOCAL_WRITE` makes pinning fail with EFAULT. softrdma pins nothing, so it
//! reads `/proc/self/maps` instead and answers the same errno.

use crate::{Errno, Error, Result};
use procfs::process::{MMPermissions, Process};

/// Checks that `[addr, addr+len)` is mapped readable (and writable if `write`).
pub fn check_range(what: &str, addr: u64, len: usize, write: bool) -> Result<()> {
    let end = addr.checked_add(len as u64).ok_or_else(|| {
        Error::new(
            Errno::Inval,
            format!("{what}: range {addr:#x} + {len} bytes wraps around the address space"),
        )
    })?;
    if len == 0 {
        return Ok(());
    }
    let maps = Process::myself()
        .and_then(|p| p.maps())
        .map_err(|e| Error::new(Errno::NoMem, format!("{what}: reading /proc/self/maps: {e}")))?;
    let need = if write {
        MMPermissions::READ | MMPermissions::WRITE
    } else {
        MMPermissions::READ
    };
    // Mappings are sorted by address; walk the ones that overlap the range, in order.
    let mut at = addr;
    for m in maps.iter().filter(|m| m.address.1 > addr && m.address.0 < end) {
        let (start, stop) = m.address;
        if start > at {
            break;
        }
        if !m.perms.contains(need) {
            return Err(Error::new(
                Errno::Fault,
                format!(
                    "{what}: {at:#x} (in {addr:#x} + {len} bytes) is mapped {}, and the access flags need {}",
                    perms_text(m.perms),
                    if write { "read and write" } else { "read" }
                ),
            ));
        }
        at = stop;
        if at >= end {
            return Ok(());
        }
    }
    Err(Error::new(
        Errno::Fault,
        format!("{what}: {at:#x} (in {addr:#x} + {len} bytes) is not mapped"),
    ))
}

fn perms_text(p: MMPermissions) -> String {
    let bit = |f: MMPermissions, c: char| if p.contains(f) { c } else { '-' };
    [
        bit(MMPermissions::READ, 'r'),
        bit(MMPermissions::WRITE, 'w'),
        bit(MMPermissions::EXECUTE, 'x'),
    ]
    .iter()
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pages: usize) -> (*mut u8, usize) {
        let len = pages * 4096;
        // SAFETY: anonymous private mapping; the tests unmap it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (p as *mut u8, len)
    }

    #[test]
    fn refuses_what_the_kernel_cannot_pin() {
        let (p, len) = map(4);
        let a = p as u64;
        check_range("t", a, len, true).unwrap();
        check_range("t", a + 100, 5000, true).unwrap();
        // SAFETY: the pages belong to our own mapping.
        unsafe {
            assert_eq!(libc::mprotect(p.add(4096) as *mut _, 4096, libc::PROT_READ), 0);
            assert_eq!(libc::mprotect(p.add(2 * 4096) as *mut _, 4096, libc::PROT_NONE), 0);
            assert_eq!(libc::munmap(p.add(3 * 4096) as *mut _, 4096), 0);
        }
        check_range("t", a, 8192, false).unwrap();
        let e = check_range("t", a, 8192, true).unwrap_err();
        assert_eq!(e.errno, Errno::Fault);
        assert!(e.to_string().contains("mapped r--"), "{e}");
        assert_eq!(check_range("t", a, 3 * 4096, false).unwrap_err().errno, Errno::Fault);
        let e = check_range("t", a + 3 * 4096, 10, false).unwrap_err();
        assert!(e.to_string().contains("not mapped"), "{e}");
        // Oversized: a terabyte over a small buffer.
        assert_eq!(check_range("t", a, 1 << 40, false).unwrap_err().errno, Errno::Fault);
        assert_eq!(
            check_range("t", u64::MAX - 10, 100, false).unwrap_err().errno,
            Errno::Inval
        );
        // SAFETY: our own mapping.
        unsafe { libc::munmap(p as *mut _, 3 * 4096) };
    }
}
