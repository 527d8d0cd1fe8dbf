//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`, as librdmacm's `addrinfo.c`: the hints become
//! `getaddrinfo(3)` hints, and the first result becomes one `struct rdma_addrinfo` whose
//! `ai_src_addr` (RAI_PASSIVE) or `ai_dst_addr` holds the address. Host names resolve like
//! getaddrinfo does; InfiniBand addressing (AF_IB, `ai_route`, `ai_connect`) is not produced.
//!
//! Return values are librdmacm's: 0; a getaddrinfo `EAI_*` code (for `gai_strerror`); or -1
//! and errno (ENODEV without RDMA devices, EINVAL without node, service and hints).

use std::ffi::{c_char, c_int};
use std::mem::offset_of;
use std::ptr;

use libc::{addrinfo, sockaddr, sockaddr_storage, socklen_t};

use crate::abi::rdma_addrinfo;
use crate::cm::{ucma_init, RAI_PASSIVE};
use crate::error::{non_null, ret_neg1, CError, CResult};

/// `RAI_NUMERICHOST`.
const RAI_NUMERICHOST: c_int = 2;
/// `AF_IB`.
const AF_IB: c_int = 27;
/// `IBV_QPT_*` values used by the conversion.
const IBV_QPT_RC: c_int = 2;
const IBV_QPT_UC: c_int = 3;
const IBV_QPT_UD: c_int = 4;
const IBV_QPT_XRC_SEND: c_int = 9;
const IBV_QPT_XRC_RECV: c_int = 10;
/// `RDMA_PS_*` values.
const RDMA_PS_IPOIB: c_int = 0x0002;
const RDMA_PS_TCP: c_int = 0x0106;
const RDMA_PS_UDP: c_int = 0x0111;
const RDMA_PS_IB: c_int = 0x013F;

/// One result: the C struct first, then the storage its address pointers point into.
#[repr(C)]
struct SoftAddrinfo {
    c: rdma_addrinfo,
    src: sockaddr_storage,
    dst: sockaddr_storage,
}

const _: () = assert!(offset_of!(SoftAddrinfo, c) == 0);

/// The hint fields librdmacm reads.
#[derive(Clone, Copy)]
struct Hints {
    flags: c_int,
    family: c_int,
    qp_type: c_int,
    port_space: c_int,
    src: *const sockaddr,
    src_len: socklen_t,
    dst: *const sockaddr,
    dst_len: socklen_t,
}

/// `getaddrinfo` hints from rdma hints (`ucma_convert_to_ai`).
fn to_ai_hints(h: &Hints) -> addrinfo {
    // SAFETY: addrinfo is plain data; all-zero (NULL pointers) is valid.
    let mut ai: addrinfo = unsafe { std::mem::zeroed() };
    if h.flags & RAI_PASSIVE != 0 {
        ai.ai_flags = libc::AI_PASSIVE;
    }
    if h.flags & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if h.family != AF_IB {
        ai.ai_family = h.family;
    }
    ai.ai_socktype = match h.qp_type {
        IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => libc::SOCK_STREAM,
        IBV_QPT_UD => libc::SOCK_DGRAM,
        _ => 0,
    };
    ai.ai_protocol = match h.port_space {
        RDMA_PS_TCP => libc::IPPROTO_TCP,
        RDMA_PS_IPOIB | RDMA_PS_UDP => libc::IPPROTO_UDP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
        _ => 0,
    };
    ai
}

/// Copies `len` bytes of the address at `src` into `dst` (at most a sockaddr_storage).
///
/// # Safety
/// `src` is readable for `len` bytes.
unsafe fn copy_addr(dst: &mut sockaddr_storage, src: *const sockaddr, len: socklen_t) -> CResult<socklen_t> {
    let n = len as usize;
    if n > std::mem::size_of::<sockaddr_storage>() {
        return Err(CError::inval(format!("address of {n} bytes is too long")));
    }
    // SAFETY: `src` holds `n` bytes (contract); `dst` holds at least `n`; distinct objects.
    unsafe { ptr::copy_nonoverlapping(src.cast::<u8>(), ptr::from_mut(dst).cast::<u8>(), n) };
    Ok(len)
}

fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> CResult<c_int> {
    if node.is_null() && service.is_null() && hints.is_null() {
        return Err(CError::inval("rdma_getaddrinfo: no node, service or hints"));
    }
    non_null(res, "res")?;
    ucma_init()?;
    let h = if hints.is_null() {
        Hints {
            flags: 0,
            family: 0,
            qp_type: 0,
            port_space: 0,
            src: ptr::null(),
            src_len: 0,
            dst: ptr::null(),
            dst_len: 0,
        }
    } else {
        // SAFETY: non-NULL; the caller's hints.
        let r = unsafe { &*hints };
        Hints {
            flags: r.ai_flags,
            family: r.ai_family,
            qp_type: r.ai_qp_type,
            port_space: r.ai_port_space,
            src: r.ai_src_addr,
            src_len: r.ai_src_len,
            dst: r.ai_dst_addr,
            dst_len: r.ai_dst_len,
        }
    };
    if h.family == AF_IB {
        return Err(CError::new(
            libc::EAFNOSUPPORT,
            "rdma_getaddrinfo: AF_IB addresses need an InfiniBand device",
        ));
    }
    let mut out = Box::new(SoftAddrinfo {
        c: rdma_addrinfo::zeroed(),
        // SAFETY: sockaddr_storage is plain bytes; all-zero is valid.
        src: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        dst: unsafe { std::mem::zeroed() },
    });
    if !node.is_null() || !service.is_null() {
        let ai_hints = to_ai_hints(&h);
        let mut list: *mut addrinfo = ptr::null_mut();
        // SAFETY: node/service are NULL or C strings (C contract); valid hints and out-pointer.
        let ret = unsafe { libc::getaddrinfo(node, service, &ai_hints, &mut list) };
        if ret != 0 {
            return Ok(ret);
        }
        // SAFETY: getaddrinfo succeeded, so `list` is a non-empty list it allocated.
        let ai = unsafe { &*list };
        let c = &mut out.c;
        c.ai_qp_type = match (h.qp_type, ai.ai_socktype) {
            (0, libc::SOCK_STREAM) => IBV_QPT_RC,
            (0, libc::SOCK_DGRAM) => IBV_QPT_UD,
            (q, _) => q,
        };
        c.ai_port_space = match (h.port_space, ai.ai_protocol) {
            (0, libc::IPPROTO_TCP) => RDMA_PS_TCP,
            (0, libc::IPPROTO_UDP) => RDMA_PS_UDP,
            (ps, _) => ps,
        };
        c.ai_family = ai.ai_family;
        let copied = if h.flags & RAI_PASSIVE != 0 {
            c.ai_flags = RAI_PASSIVE;
            // SAFETY: getaddrinfo's address holds ai_addrlen bytes.
            unsafe { copy_addr(&mut out.src, ai.ai_addr, ai.ai_addrlen) }.map(|l| out.c.ai_src_len = l)
        } else {
            // SAFETY: as above.
            unsafe { copy_addr(&mut out.dst, ai.ai_addr, ai.ai_addrlen) }.map(|l| out.c.ai_dst_len = l)
        };
        // SAFETY: the list getaddrinfo returned, freed once.
        unsafe { libc::freeaddrinfo(list) };
        copied?;
    } else {
        let c = &mut out.c;
        c.ai_flags = h.flags;
        c.ai_family = h.family;
        c.ai_qp_type = h.qp_type;
        c.ai_port_space = h.port_space;
        if h.dst_len != 0 && !h.dst.is_null() {
            // SAFETY: the hints' destination holds ai_dst_len bytes (C contract).
            out.c.ai_dst_len = unsafe { copy_addr(&mut out.dst, h.dst, h.dst_len)? };
        }
    }
    if out.c.ai_src_len == 0 && h.src_len != 0 && !h.src.is_null() {
        // SAFETY: the hints' source holds ai_src_len bytes (C contract).
        out.c.ai_src_len = unsafe { copy_addr(&mut out.src, h.src, h.src_len)? };
    }
    let raw = Box::into_raw(out);
    // SAFETY: `raw` is a live allocation; the address fields point into it (stable on the heap).
    unsafe {
        if (*raw).c.ai_src_len != 0 {
            (*raw).c.ai_src_addr = ptr::addr_of_mut!((*raw).src).cast();
        }
        if (*raw).c.ai_dst_len != 0 {
            (*raw).c.ai_dst_addr = ptr::addr_of_mut!((*raw).dst).cast();
        }
        res.write(raw.cast());
    }
    Ok(0)
}

c_fn! {
    /// `int rdma_getaddrinfo(const char *node, const char *service,
    /// const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)`: 0, an `EAI_*` code, or
    /// -1 and errno.
    fn rdma_getaddrinfo(
        node: *const c_char,
        service: *const c_char,
        hints: *const rdma_addrinfo,
        res: *mut *mut rdma_addrinfo,
    ) -> c_int {
        ret_neg1(getaddrinfo(node, service, hints, res))
    }

    /// `void rdma_freeaddrinfo(struct rdma_addrinfo *)`: frees the list.
    fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: a result of rdma_getaddrinfo (C contract), freed once.
            let item = unsafe { Box::from_raw(p.cast::<SoftAddrinfo>()) };
            p = item.c.ai_next;
        }
    }
}
