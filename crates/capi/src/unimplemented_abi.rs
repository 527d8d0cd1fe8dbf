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
    fn rsocket(_domain: c_int, _type: c_int, _protocol: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rbind(int socket, const struct sockaddr *, socklen_t)`.
    fn rbind(_socket: c_int, _addr: *const sockaddr, _addrlen: socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rlisten(int socket, int backlog)`.
    fn rlisten(_socket: c_int, _backlog: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int raccept(int socket, struct sockaddr *, socklen_t *)`.
    fn raccept(_socket: c_int, _addr: *mut sockaddr, _addrlen: *mut socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rconnect(int socket, const struct sockaddr *, socklen_t)`.
    fn rconnect(_socket: c_int, _addr: *const sockaddr, _addrlen: socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rshutdown(int socket, int how)`.
    fn rshutdown(_socket: c_int, _how: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rclose(int socket)`.
    fn rclose(_socket: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `ssize_t rrecv(int socket, void *buf, size_t len, int flags)`.
    fn rrecv(_socket: c_int, _buf: *mut c_void, _len: usize, _flags: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rsend(int socket, const void *buf, size_t len, int flags)`.
    fn rsend(_socket: c_int, _buf: *const c_void, _len: usize, _flags: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t)`.
    fn rsetsockopt(_socket: c_int, _level: c_int, _optname: c_int, _optval: *const c_void, _optlen: socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *)`.
    fn rgetsockopt(_socket: c_int, _level: c_int, _optname: c_int, _optval: *mut c_void, _optlen: *mut socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rfcntl(int socket, int cmd, ... /* arg */)`: C-variadic; on x86_64 SysV the first
    /// variadic integer argument arrives in the same register as a third fixed `long`, so this
    /// signature is ABI-compatible (abi.md section 7).
    fn rfcntl(_socket: c_int, _cmd: c_int, _arg: c_long) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset)`.
    fn riomap(_socket: c_int, _buf: *mut c_void, _len: usize, _prot: c_int, _flags: c_int, _offset: off_t) -> off_t {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `int riounmap(int socket, void *buf, size_t len)`.
    fn riounmap(_socket: c_int, _buf: *mut c_void, _len: usize) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)`:
    /// `(size_t)-1` and errno.
    fn riowrite(_socket: c_int, _buf: *const c_void, _count: usize, _offset: off_t, _flags: c_int) -> usize {
        ret_or(Err(not_implemented_here()), usize::MAX)
    }

    /// `ssize_t rread(int socket, void *buf, size_t count)`.
    fn rread(_socket: c_int, _buf: *mut c_void, _count: usize) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt)`.
    fn rreadv(_socket: c_int, _iov: *const libc::iovec, _iovcnt: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags, struct sockaddr *,
    /// socklen_t *)`.
    fn rrecvfrom(_socket: c_int, _buf: *mut c_void, _len: usize, _flags: c_int, _src: *mut sockaddr, _srclen: *mut socklen_t) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)`.
    fn rrecvmsg(_socket: c_int, _msg: *mut libc::msghdr, _flags: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rwrite(int socket, const void *buf, size_t count)`.
    fn rwrite(_socket: c_int, _buf: *const c_void, _count: usize) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt)`.
    fn rwritev(_socket: c_int, _iov: *const libc::iovec, _iovcnt: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rsendto(int socket, const void *buf, size_t len, int flags,
    /// const struct sockaddr *, socklen_t)`.
    fn rsendto(_socket: c_int, _buf: *const c_void, _len: usize, _flags: c_int, _dst: *const sockaddr, _dstlen: socklen_t) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags)`.
    fn rsendmsg(_socket: c_int, _msg: *const libc::msghdr, _flags: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen)`.
    fn rgetpeername(_socket: c_int, _addr: *mut sockaddr, _addrlen: *mut socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen)`.
    fn rgetsockname(_socket: c_int, _addr: *mut sockaddr, _addrlen: *mut socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds,
    /// struct timeval *timeout)`.
    fn rselect(_nfds: c_int, _readfds: *mut libc::fd_set, _writefds: *mut libc::fd_set, _exceptfds: *mut libc::fd_set, _timeout: *mut libc::timeval) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }
}
