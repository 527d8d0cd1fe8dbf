//! Moving registered memory to and from a socket without a copy of softrdma's own.
//!
//! [`send_gather`] hands the kernel one `sendmsg` over a list of parts: the caller's own bytes
//! (headers, trailers) and ranges of registered memory; [`recv_scatter`] is the receiving
//! twin (`recvmsg` into a range of registered memory, then the caller's buffer). The kernel's
//! copy is then the only one. Each memory range is leased for the duration of the call, so a
//! deregistration waits for it, and a region revoked before the call is refused (nothing is
//! moved). A page the application unmapped or protected behind softrdma's back makes the
//! kernel's own copy fail: the call answers EFAULT (or the count moved before the bad page),
//! never a signal. These are the guarantees [`super::MemRegion::read`] and
//! [`super::MemRegion::write`] give.

use super::{Lease, MemRegion};
use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Parts passed to one `sendmsg` at most (the kernel's limit, IOV_MAX, is 1024).
pub const MAX_GATHER_PARTS: usize = 64;

/// One piece of a gathered send.
#[derive(Debug, Clone, Copy)]
pub enum Gather<'a> {
    /// Bytes the caller owns.
    Bytes(&'a [u8]),
    /// `len` bytes of registered memory at `offset`.
    Region {
        /// The memory.
        region: &'a MemRegion,
        /// Start, from the region's first byte.
        offset: usize,
        /// Length.
        len: usize,
    },
}

impl Gather<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Gather::Bytes(b) => b.len(),
            Gather::Region { len, .. } => *len,
        }
    }

    /// True for an empty part.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the part's bytes to `out` (a region through a guarded copy); false, with
    /// nothing appended, when a region part is revoked, out of range or unreadable.
    pub fn append_to(&self, out: &mut Vec<u8>) -> bool {
        match *self {
            Gather::Bytes(b) => {
                out.extend_from_slice(b);
                true
            }
            Gather::Region { region, offset, len } => region.append_to(offset, len, out),
        }
    }
}

/// Why [`send_gather`] sent nothing.
#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    /// Part `index` names registered memory that was deregistered (or a range outside it);
    /// nothing was sent.
    #[error("part {index} of the send names registered memory that was deregistered")]
    Revoked {
        /// Which part.
        index: usize,
    },
    /// `sendmsg` failed. EFAULT: the first part's memory is no longer mapped readable.
    #[error("sendmsg: {0}")]
    Io(#[from] std::io::Error),
}

/// Sends the first [`MAX_GATHER_PARTS`] of `parts` with one `sendmsg(fd, .., flags)`; returns
/// the bytes the socket took (possibly fewer than offered, as with any stream write).
pub fn send_gather(fd: BorrowedFd<'_>, parts: &[Gather<'_>], flags: libc::c_int) -> Result<usize, GatherError> {
    let parts = &parts[..parts.len().min(MAX_GATHER_PARTS)];
    let mut leases = Vec::with_capacity(parts.len());
    let mut iov = Vec::with_capacity(parts.len());
    for (index, part) in parts.iter().enumerate() {
        iov.push(match *part {
            Gather::Bytes(b) => iovec(b.as_ptr().cast_mut(), b.len()),
            Gather::Region { region, offset, len } => region_iovec(region, offset, len, index, &mut leases)?,
        });
    }
    // SAFETY: every iovec names memory valid for reads of its length for the whole call: the
    // caller's borrowed slices, or leased registered ranges (a deregistration waits until the
    // leases drop, after the call). The kernel only reads them, through its own fault-checked
    // copy, so an application that unmapped a range gets EFAULT rather than a signal.
    with_msghdr(&mut iov, |msg| unsafe { libc::sendmsg(fd.as_raw_fd(), msg, flags) })
}

/// One piece of a scattered receive.
#[derive(Debug)]
pub enum Scatter<'a> {
    /// The caller's buffer.
    Bytes(&'a mut [u8]),
    /// `len` bytes of registered memory at `offset` (written by the kernel).
    Region {
        /// The memory.
        region: &'a MemRegion,
        /// Start, from the region's first byte.
        offset: usize,
        /// Length.
        len: usize,
    },
}

/// Receives into the first [`MAX_GATHER_PARTS`] of `parts`, in order, with one
/// `recvmsg(fd, .., flags)`; returns the bytes received (0 at the end of the stream).
/// EFAULT (a region part's pages are not writable) leaves the stream's bytes unread.
pub fn recv_scatter(fd: BorrowedFd<'_>, parts: &mut [Scatter<'_>], flags: libc::c_int) -> Result<usize, GatherError> {
    let n_parts = parts.len().min(MAX_GATHER_PARTS);
    let mut leases = Vec::with_capacity(n_parts);
    let mut iov = Vec::with_capacity(n_parts);
    for (index, part) in parts[..n_parts].iter_mut().enumerate() {
        iov.push(match part {
            Scatter::Bytes(b) => iovec(b.as_mut_ptr(), b.len()),
            Scatter::Region { region, offset, len } => region_iovec(region, *offset, *len, index, &mut leases)?,
        });
    }
    // SAFETY: every iovec names memory valid for writes of its length for the whole call: the
    // caller's exclusively borrowed buffers, or leased registered ranges (deregistration waits
    // for the leases, which drop after the call). The kernel writes them through its own
    // fault-checked copy: unmapped application pages give EFAULT, not a signal. Registered
    // memory is never referenced by Rust code, so the kernel's writes alias nothing.
    with_msghdr(&mut iov, |msg| unsafe { libc::recvmsg(fd.as_raw_fd(), msg, flags) })
}

fn iovec(base: *mut u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: base.cast::<c_void>(),
        iov_len: len,
    }
}

/// Leases `len` bytes of `region` at `offset` (part `index` of a call) into `leases`, and
/// returns their iovec.
fn region_iovec<'r>(
    region: &'r MemRegion,
    offset: usize,
    len: usize,
    index: usize,
    leases: &mut Vec<Lease<'r>>,
) -> Result<libc::iovec, GatherError> {
    leases.push(region.lease(offset, len).ok_or(GatherError::Revoked { index })?);
    // SAFETY: the lease proved `offset..offset + len` lies inside the region, so the pointer
    // stays within (or one past) the registered range.
    Ok(iovec(unsafe { region.base.as_ptr().add(offset) }, len))
}

/// Runs `call` (sendmsg or recvmsg) on a message naming `iov`, and maps its result (the
/// caller's leases outlive this).
fn with_msghdr(iov: &mut [libc::iovec], call: impl FnOnce(&mut libc::msghdr) -> isize) -> Result<usize, GatherError> {
    // SAFETY: an all-zero msghdr is a valid empty message (null name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    let n = call(&mut msg);
    if n < 0 {
        Err(std::io::Error::last_os_error().into())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    fn received(b: &mut UnixStream) -> Vec<u8> {
        let mut out = vec![0u8; 4096];
        match b.read(&mut out) {
            Ok(n) => out.truncate(n),
            Err(_) => out.clear(),
        }
        out
    }

    #[test]
    fn own_bytes_and_region_ranges_go_out_in_order() {
        let (a, mut b) = pair();
        let r = MemRegion::allocate(16);
        assert!(r.write(0, b"0123456789abcdef"));
        let parts = [
            Gather::Bytes(b"<"),
            Gather::Region {
                region: &r,
                offset: 4,
                len: 6,
            },
            Gather::Bytes(b">"),
        ];
        assert_eq!(send_gather(a.as_fd(), &parts, libc::MSG_NOSIGNAL).unwrap(), 8);
        assert_eq!(received(&mut b), b"<456789>");
    }

    #[test]
    fn a_revoked_or_out_of_range_part_sends_nothing_and_is_named() {
        let (a, mut b) = pair();
        let r = MemRegion::allocate(16);
        let out_of_range = [
            Gather::Bytes(b"hdr"),
            Gather::Region {
                region: &r,
                offset: 10,
                len: 7,
            },
        ];
        let e = send_gather(a.as_fd(), &out_of_range, libc::MSG_NOSIGNAL).unwrap_err();
        assert!(matches!(e, GatherError::Revoked { index: 1 }), "{e}");
        r.revoke();
        let revoked = [Gather::Region {
            region: &r,
            offset: 0,
            len: 4,
        }];
        let e = send_gather(a.as_fd(), &revoked, libc::MSG_NOSIGNAL).unwrap_err();
        assert!(matches!(e, GatherError::Revoked { index: 0 }), "{e}");
        assert!(received(&mut b).is_empty(), "nothing was sent");
    }

    #[test]
    fn unreadable_memory_is_efault_not_a_signal() {
        use nix::sys::mman::{mmap_anonymous, mprotect, munmap, MapFlags, ProtFlags};
        let len = std::num::NonZeroUsize::new(8192).unwrap();
        // SAFETY: a fresh private anonymous mapping, overlapping nothing.
        let map = unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .unwrap();
        // SAFETY: the mapping is ours and 8 KiB long; it is protected below behind the region's
        // back, which is the case under test (accesses must fail, not fault). (Protected, not
        // unmapped: another test thread could map the freed pages again.)
        let r = unsafe { MemRegion::from_raw(map.as_ptr().cast(), 8192) };
        // SAFETY: changes the protection of the mapping created above; nothing else uses it.
        unsafe { mprotect(map, 8192, ProtFlags::PROT_NONE).unwrap() };
        let (a, mut b) = pair();
        let parts = [Gather::Region {
            region: &r,
            offset: 0,
            len: 4096,
        }];
        let got = send_gather(a.as_fd(), &parts, libc::MSG_NOSIGNAL);
        // SAFETY: unmaps the mapping created above; the region is not used after this.
        unsafe { munmap(map, 8192).unwrap() };
        match got {
            Err(GatherError::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::EFAULT)),
            other => panic!("want EFAULT, got {other:?}"),
        }
        assert!(received(&mut b).is_empty());
    }

    #[test]
    fn a_scattered_receive_fills_the_region_then_the_buffer() {
        let (a, b) = pair();
        (&a).write_all(b"0123456789").unwrap();
        let r = MemRegion::allocate(8);
        let mut rest = [0u8; 16];
        let mut parts = [
            Scatter::Region {
                region: &r,
                offset: 2,
                len: 4,
            },
            Scatter::Bytes(&mut rest),
        ];
        assert_eq!(recv_scatter(b.as_fd(), &mut parts, 0).unwrap(), 10);
        let mut placed = [0u8; 8];
        assert!(r.read(0, &mut placed));
        assert_eq!(placed, [0, 0, b'0', b'1', b'2', b'3', 0, 0]);
        assert_eq!(&rest[..6], b"456789");
        r.revoke();
        (&a).write_all(b"x").unwrap();
        let mut parts = [Scatter::Region {
            region: &r,
            offset: 0,
            len: 1,
        }];
        let e = recv_scatter(b.as_fd(), &mut parts, 0).unwrap_err();
        assert!(matches!(e, GatherError::Revoked { index: 0 }), "{e}");
        let mut left = [0u8; 4];
        assert_eq!((&b).read(&mut left).unwrap(), 1, "the byte is still in the socket");
    }
}
