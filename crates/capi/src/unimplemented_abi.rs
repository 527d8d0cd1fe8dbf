//! Every imported symbol that is not implemented yet, failing honestly.
//!
//! The binaries are linked BIND_NOW, so each of these must exist for them to load at all.
//! Each has its real C signature and fails with the C convention of the real function and
//! `errno = ENOSYS`, printing `softrdma: NAME is not implemented yet (ENOSYS)` once per process
//! (see [`not_implemented_here`]). Nothing here pretends to succeed. What is left: rsockets
//! (`r*`; `rpoll` is implemented in `cm.rs` for ordinary fds).

use std::ffi::{c_int, c_long, c_void};

use libc::{off_t, sockaddr, socklen_t};

use crate::error::{not_implemented_here, ret_neg1, ret_or};

// ---- librdmacm: rsockets ----

c_fn! {
    /// `int rsocket(int domain, int type, int protocol)`.
    #[symver = "RDMACM_1.0"]
    fn rsocket(_domain: c_int, _type: c_int, _protocol: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rbind(int socket, const struct sockaddr *, socklen_t)`.
    #[symver = "RDMACM_1.0"]
    fn rbind(_socket: c_int, _addr: *const sockaddr, _addrlen: socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rlisten(int socket, int backlog)`.
    #[symver = "RDMACM_1.0"]
    fn rlisten(_socket: c_int, _backlog: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int raccept(int socket, struct sockaddr *, socklen_t *)`.
    #[symver = "RDMACM_1.0"]
    fn raccept(_socket: c_int, _addr: *mut sockaddr, _addrlen: *mut socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rconnect(int socket, const struct sockaddr *, socklen_t)`.
    #[symver = "RDMACM_1.0"]
    fn rconnect(_socket: c_int, _addr: *const sockaddr, _addrlen: socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rshutdown(int socket, int how)`.
    #[symver = "RDMACM_1.0"]
    fn rshutdown(_socket: c_int, _how: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rclose(int socket)`.
    #[symver = "RDMACM_1.0"]
    fn rclose(_socket: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `ssize_t rrecv(int socket, void *buf, size_t len, int flags)`.
    #[symver = "RDMACM_1.0"]
    fn rrecv(_socket: c_int, _buf: *mut c_void, _len: usize, _flags: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rsend(int socket, const void *buf, size_t len, int flags)`.
    #[symver = "RDMACM_1.0"]
    fn rsend(_socket: c_int, _buf: *const c_void, _len: usize, _flags: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t)`.
    #[symver = "RDMACM_1.0"]
    fn rsetsockopt(_socket: c_int, _level: c_int, _optname: c_int, _optval: *const c_void, _optlen: socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *)`.
    #[symver = "RDMACM_1.0"]
    fn rgetsockopt(_socket: c_int, _level: c_int, _optname: c_int, _optval: *mut c_void, _optlen: *mut socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rfcntl(int socket, int cmd, ... /* arg */)`: C-variadic; on x86_64 SysV the first
    /// variadic integer argument arrives in the same register as a third fixed `long`, so this
    /// signature is ABI-compatible (abi.md section 7).
    #[symver = "RDMACM_1.0"]
    fn rfcntl(_socket: c_int, _cmd: c_int, _arg: c_long) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset)`.
    #[symver = "RDMACM_1.0"]
    fn riomap(_socket: c_int, _buf: *mut c_void, _len: usize, _prot: c_int, _flags: c_int, _offset: off_t) -> off_t {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `int riounmap(int socket, void *buf, size_t len)`.
    #[symver = "RDMACM_1.0"]
    fn riounmap(_socket: c_int, _buf: *mut c_void, _len: usize) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)`:
    /// `(size_t)-1` and errno.
    #[symver = "RDMACM_1.0"]
    fn riowrite(_socket: c_int, _buf: *const c_void, _count: usize, _offset: off_t, _flags: c_int) -> usize {
        ret_or(Err(not_implemented_here()), usize::MAX)
    }
}
