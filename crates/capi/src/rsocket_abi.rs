//! librdmacm's rsocket calls (`r*`), over `softrdma_rsocket`.
//!
//! Each call finds the socket by number, turns C buffers and addresses into Rust values, and
//! returns -1 with `errno` on failure, as rdma-core's rsocket does. `rpoll` and `rselect` mix
//! rsockets and ordinary fds: ordinary ones go to poll(2) as they are; rsockets report their
//! own readiness and sleep on their channels.

use std::ffi::{c_int, c_long, c_void};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::{nfds_t, off_t, pollfd, sockaddr, socklen_t};
use softrdma_rsocket::{table, RSocket, RsError};

use crate::cm::{sockaddr_from_c, sockaddr_to_c};
use crate::error::{ret_neg1, ret_or, set_errno, CError, CResult};

impl From<RsError> for CError {
    fn from(e: RsError) -> CError {
        CError::new(e.errno, e.msg)
    }
}

fn efault(what: &str) -> CError {
    CError::new(libc::EFAULT, format!("{what} is NULL"))
}

/// The caller's buffer as a slice (a NULL buffer of length 0 is an empty one).
///
/// # Safety
/// `p` points to `len` readable bytes (C contract).
unsafe fn bytes<'a>(p: *const c_void, len: usize, what: &str) -> CResult<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(efault(what));
    }
    // SAFETY: per the contract, `len` readable bytes at `p`.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// # Safety
/// `p` points to `len` writable bytes (C contract).
unsafe fn bytes_mut<'a>(p: *mut c_void, len: usize, what: &str) -> CResult<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(efault(what));
    }
    // SAFETY: per the contract, `len` writable bytes at `p`.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
}

/// # Safety
/// `addr` is NULL or points to `len` bytes of a socket address.
unsafe fn addr_in(addr: *const sockaddr, len: socklen_t, call: &str) -> CResult<SocketAddr> {
    if addr.is_null() {
        return Err(efault(&format!("{call}: the address")));
    }
    let family = c_int::from(
        // SAFETY: a non-NULL address has at least its family.
        unsafe { (*addr).sa_family },
    );
    let need = match family {
        libc::AF_INET => size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
        _ => 0,
    };
    if (len as usize) < need {
        return Err(CError::inval(format!(
            "{call}: addrlen {len} is too short for family {family}"
        )));
    }
    // SAFETY: checked above: `len` covers the family's address.
    match unsafe { sockaddr_from_c(addr) }? {
        Some(a) => Ok(a),
        None => Err(CError::new(libc::EAFNOSUPPORT, format!("{call}: AF_UNSPEC"))),
    }
}

/// Writes `a` to a caller's (addr, addrlen) pair, truncating as getsockname does.
///
/// # Safety
/// Both NULL, or `addrlen` points to the size of the buffer at `addr`.
unsafe fn addr_out(a: SocketAddr, addr: *mut sockaddr, addrlen: *mut socklen_t) -> CResult<()> {
    if addr.is_null() || addrlen.is_null() {
        return Ok(());
    }
    let (ss, len) = sockaddr_to_c(a);
    // SAFETY: the caller's length.
    let room = unsafe { *addrlen } as usize;
    let n = room.min(len as usize);
    // SAFETY: `n` bytes fit both the storage and the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(&ss).cast::<u8>(), addr.cast::<u8>(), n);
        *addrlen = len;
    }
    Ok(())
}

fn sock(fd: c_int, call: &str) -> CResult<Arc<RSocket>> {
    Ok(table::get(fd, call)?)
}

fn recv_flags(flags: c_int) -> (bool, bool, bool) {
    (
        flags & libc::MSG_DONTWAIT != 0,
        flags & libc::MSG_PEEK != 0,
        flags & libc::MSG_WAITALL != 0,
    )
}

fn recv(fd: c_int, buf: &mut [u8], flags: c_int) -> CResult<isize> {
    let (dontwait, peek, waitall) = recv_flags(flags);
    Ok(sock(fd, "rrecv")?.recv(buf, dontwait, peek, waitall)? as isize)
}

fn send(fd: c_int, buf: &[u8], flags: c_int) -> CResult<isize> {
    Ok(sock(fd, "rsend")?.send(buf, flags & libc::MSG_DONTWAIT != 0)? as isize)
}

/// # Safety
/// `iov` points to `iovcnt` iovecs describing readable memory.
unsafe fn gather(iov: *const libc::iovec, iovcnt: usize) -> CResult<Vec<u8>> {
    if iovcnt == 0 {
        return Ok(Vec::new());
    }
    if iov.is_null() {
        return Err(efault("the iovec array"));
    }
    // SAFETY: the caller's array.
    let iovs = unsafe { std::slice::from_raw_parts(iov, iovcnt) };
    let mut out = Vec::new();
    for v in iovs {
        // SAFETY: each iovec describes readable memory.
        out.extend_from_slice(unsafe { bytes(v.iov_base, v.iov_len, "an iovec")? });
    }
    Ok(out)
}

/// # Safety
/// `iov` points to `iovcnt` iovecs describing writable memory.
unsafe fn scatter_recv(fd: c_int, iov: *const libc::iovec, iovcnt: usize, flags: c_int) -> CResult<isize> {
    if iovcnt == 0 {
        return Ok(0);
    }
    if iov.is_null() {
        return Err(efault("the iovec array"));
    }
    // SAFETY: the caller's array.
    let iovs = unsafe { std::slice::from_raw_parts(iov, iovcnt) };
    let total: usize = iovs.iter().map(|v| v.iov_len).sum();
    let mut tmp = vec![0u8; total];
    let n = recv(fd, &mut tmp, flags)? as usize;
    let mut done = 0usize;
    for v in iovs {
        if done == n {
            break;
        }
        let take = v.iov_len.min(n - done);
        // SAFETY: each iovec describes writable memory of iov_len >= take bytes.
        let dst = unsafe { bytes_mut(v.iov_base, take, "an iovec")? };
        dst.copy_from_slice(&tmp[done..done + take]);
        done += take;
    }
    Ok(n as isize)
}

/// `rpoll`: rsockets and ordinary fds together.
///
/// # Safety
/// `fds` points to `nfds` pollfds.
unsafe fn poll_all(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> CResult<c_int> {
    if nfds == 0 || fds.is_null() {
        // SAFETY: poll(2) with the caller's arguments (NULL only with nfds 0, or EFAULT).
        let n = unsafe { libc::poll(fds, nfds, timeout) };
        return if n < 0 {
            Err(std::io::Error::last_os_error().into())
        } else {
            Ok(n)
        };
    }
    // SAFETY: the caller's array of `nfds` pollfds.
    let entries = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
    let socks: Vec<Option<Arc<RSocket>>> = entries.iter().map(|p| table::lookup(p.fd)).collect();
    if socks.iter().all(Option::is_none) {
        // SAFETY: as above.
        let n = unsafe { libc::poll(fds, nfds, timeout) };
        return if n < 0 {
            Err(std::io::Error::last_os_error().into())
        } else {
            Ok(n)
        };
    }
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    loop {
        let mut plain: Vec<pollfd> = entries
            .iter()
            .zip(&socks)
            .filter(|(_, s)| s.is_none())
            .map(|(p, _)| pollfd {
                fd: p.fd,
                events: p.events,
                revents: 0,
            })
            .collect();
        if !plain.is_empty() {
            // SAFETY: our own array of pollfds.
            unsafe { libc::poll(plain.as_mut_ptr(), plain.len() as nfds_t, 0) };
        }
        let mut ready = 0;
        let mut k = 0;
        for (p, s) in entries.iter_mut().zip(&socks) {
            p.revents = match s {
                Some(s) => s.poll_events(p.events),
                None => {
                    k += 1;
                    plain[k - 1].revents
                }
            };
            if p.revents != 0 {
                ready += 1;
            }
        }
        let expired = deadline.is_some_and(|d| Instant::now() >= d);
        if ready > 0 || expired {
            // as rdma-core's rpoll: errno names why a socket reports POLLERR (a refused
            // connect, say), for the perror() that usually follows
            for (p, s) in entries.iter().zip(&socks) {
                if let Some(s) = s.as_ref().filter(|_| p.revents & libc::POLLERR != 0) {
                    let e = s.pending_error();
                    if e != 0 {
                        set_errno(e);
                    }
                }
            }
            return Ok(ready);
        }
        // arm and look once more (each socket), then sleep on the ordinary fds and the
        // rsockets' channels; anything that happened meanwhile is looked at first
        let mut waits = plain;
        let mut changed = false;
        for s in socks.iter().flatten() {
            match s.wait_fds() {
                Some(fds) => waits.extend(fds.into_iter().map(|fd| pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })),
                None => changed = true,
            }
        }
        if changed {
            continue;
        }
        let ms = match deadline {
            None => -1,
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as c_int,
        };
        // SAFETY: our own array of pollfds.
        let n = unsafe { libc::poll(waits.as_mut_ptr(), waits.len() as nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e.into());
            }
        }
    }
}

/// `rselect` on top of [`poll_all`].
///
/// # Safety
/// The fd_sets are NULL or valid for `nfds` descriptors; `timeout` is NULL or valid.
unsafe fn select_all(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> CResult<c_int> {
    if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
        return Err(CError::inval(format!("rselect: nfds {nfds} is out of range")));
    }
    let mut fds = Vec::new();
    for fd in 0..nfds {
        let mut events = 0i16;
        // SAFETY: non-NULL sets are valid fd_sets (C contract); fd < FD_SETSIZE.
        unsafe {
            if !readfds.is_null() && libc::FD_ISSET(fd, readfds) {
                events |= libc::POLLIN;
            }
            if !writefds.is_null() && libc::FD_ISSET(fd, writefds) {
                events |= libc::POLLOUT;
            }
            if !exceptfds.is_null() && libc::FD_ISSET(fd, exceptfds) {
                events |= libc::POLLPRI;
            }
        }
        if events != 0 {
            fds.push(pollfd { fd, events, revents: 0 });
        }
    }
    let ms = if timeout.is_null() {
        -1
    } else {
        // SAFETY: a valid timeval.
        let t = unsafe { *timeout };
        (t.tv_sec
            .max(0)
            .saturating_mul(1000)
            .saturating_add(t.tv_usec.max(0) / 1000))
        .min(i64::from(i32::MAX)) as c_int
    };
    // SAFETY: our own array.
    unsafe { poll_all(fds.as_mut_ptr(), fds.len() as nfds_t, ms) }?;
    let mut count = 0;
    // SAFETY: clearing and setting bits of the caller's valid sets.
    unsafe {
        for set in [readfds, writefds, exceptfds] {
            if !set.is_null() {
                libc::FD_ZERO(set);
            }
        }
        for p in &fds {
            if !readfds.is_null()
                && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
                && p.events & libc::POLLIN != 0
            {
                libc::FD_SET(p.fd, readfds);
                count += 1;
            }
            if !writefds.is_null() && p.revents & (libc::POLLOUT | libc::POLLERR) != 0 && p.events & libc::POLLOUT != 0
            {
                libc::FD_SET(p.fd, writefds);
                count += 1;
            }
            if !exceptfds.is_null() && p.revents & libc::POLLPRI != 0 {
                libc::FD_SET(p.fd, exceptfds);
                count += 1;
            }
        }
    }
    Ok(count)
}

c_fn! {
    /// `int rsocket(int domain, int type, int protocol)`: SOCK_STREAM over AF_INET/AF_INET6.
    fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
        ret_neg1(RSocket::new(domain, ty, protocol).map(table::insert).map_err(CError::from))
    }

    /// `int rbind(int socket, const struct sockaddr *, socklen_t)`.
    fn rbind(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int {
        ret_neg1((|| {
            // SAFETY: the caller's address of `addrlen` bytes.
            let a = unsafe { addr_in(addr, addrlen, "rbind") }?;
            sock(socket, "rbind")?.bind(a)?;
            Ok(0)
        })())
    }

    /// `int rlisten(int socket, int backlog)`.
    fn rlisten(socket: c_int, backlog: c_int) -> c_int {
        ret_neg1((|| {
            sock(socket, "rlisten")?.listen(backlog)?;
            Ok(0)
        })())
    }

    /// `int raccept(int socket, struct sockaddr *, socklen_t *)`: the new socket; EAGAIN when
    /// non-blocking and no connection waits.
    fn raccept(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t) -> c_int {
        ret_neg1((|| {
            let new = sock(socket, "raccept")?.accept()?;
            if let Ok(peer) = new.peer_addr() {
                // SAFETY: the caller's (addr, addrlen) pair.
                unsafe { addr_out(peer, addr, addrlen) }?;
            }
            Ok(table::insert(new))
        })())
    }

    /// `int rconnect(int socket, const struct sockaddr *, socklen_t)`: EINPROGRESS when
    /// non-blocking.
    fn rconnect(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int {
        ret_neg1((|| {
            // SAFETY: the caller's address of `addrlen` bytes.
            let a = unsafe { addr_in(addr, addrlen, "rconnect") }?;
            sock(socket, "rconnect")?.connect(a)?;
            Ok(0)
        })())
    }

    /// `int rshutdown(int socket, int how)`.
    fn rshutdown(socket: c_int, how: c_int) -> c_int {
        ret_neg1((|| {
            sock(socket, "rshutdown")?.shutdown(how)?;
            Ok(0)
        })())
    }

    /// `int rclose(int socket)`.
    fn rclose(socket: c_int) -> c_int {
        ret_neg1((|| {
            table::remove(socket, "rclose")?.close()?;
            Ok(0)
        })())
    }

    /// `ssize_t rrecv(int socket, void *buf, size_t len, int flags)`: MSG_DONTWAIT, MSG_PEEK,
    /// MSG_WAITALL.
    fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
        // SAFETY: the caller's buffer of `len` bytes.
        ret_or(unsafe { bytes_mut(buf, len, "rrecv: the buffer") }.and_then(|b| recv(socket, b, flags)), -1)
    }

    /// `ssize_t rsend(int socket, const void *buf, size_t len, int flags)`: MSG_DONTWAIT.
    fn rsend(socket: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
        // SAFETY: the caller's buffer of `len` bytes.
        ret_or(unsafe { bytes(buf, len, "rsend: the buffer") }.and_then(|b| send(socket, b, flags)), -1)
    }

    /// `ssize_t rread(int socket, void *buf, size_t count)`.
    fn rread(socket: c_int, buf: *mut c_void, count: usize) -> isize {
        // SAFETY: the caller's buffer of `count` bytes.
        ret_or(unsafe { bytes_mut(buf, count, "rread: the buffer") }.and_then(|b| recv(socket, b, 0)), -1)
    }

    /// `ssize_t rwrite(int socket, const void *buf, size_t count)`.
    fn rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize {
        // SAFETY: the caller's buffer of `count` bytes.
        ret_or(unsafe { bytes(buf, count, "rwrite: the buffer") }.and_then(|b| send(socket, b, 0)), -1)
    }

    /// `ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt)`.
    fn rreadv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize {
        // SAFETY: the caller's iovec array.
        ret_or(unsafe { scatter_recv(socket, iov, iovcnt.max(0) as usize, 0) }, -1)
    }

    /// `ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt)`.
    fn rwritev(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize {
        // SAFETY: the caller's iovec array.
        ret_or(unsafe { gather(iov, iovcnt.max(0) as usize) }.and_then(|b| send(socket, &b, 0)), -1)
    }

    /// `ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags, struct sockaddr *,
    /// socklen_t *)`: the peer's address, for a stream socket.
    fn rrecvfrom(socket: c_int, buf: *mut c_void, len: usize, flags: c_int, src: *mut sockaddr, srclen: *mut socklen_t) -> isize {
        ret_or((|| {
            // SAFETY: the caller's buffer of `len` bytes.
            let b = unsafe { bytes_mut(buf, len, "rrecvfrom: the buffer") }?;
            let n = recv(socket, b, flags)?;
            if let Ok(peer) = sock(socket, "rrecvfrom")?.peer_addr() {
                // SAFETY: the caller's (addr, addrlen) pair.
                unsafe { addr_out(peer, src, srclen) }?;
            }
            Ok(n)
        })(), -1)
    }

    /// `ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)`: no control data.
    fn rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
        ret_or((|| {
            if msg.is_null() {
                return Err(efault("rrecvmsg: msg"));
            }
            // SAFETY: a valid msghdr (C contract).
            let m = unsafe { &mut *msg };
            if !m.msg_control.is_null() && m.msg_controllen > 0 {
                return Err(CError::unsupported("rrecvmsg: rsockets carry no control data"));
            }
            // SAFETY: the msghdr's iovec array.
            let n = unsafe { scatter_recv(socket, m.msg_iov, m.msg_iovlen, flags) }?;
            m.msg_flags = 0;
            Ok(n)
        })(), -1)
    }

    /// `ssize_t rsendto(int socket, const void *buf, size_t len, int flags,
    /// const struct sockaddr *, socklen_t)`: a stream socket takes no address (EISCONN).
    fn rsendto(socket: c_int, buf: *const c_void, len: usize, flags: c_int, dst: *const sockaddr, dstlen: socklen_t) -> isize {
        ret_or((|| {
            if !dst.is_null() || dstlen != 0 {
                return Err(CError::new(libc::EISCONN, "rsendto: a stream rsocket sends to its peer; pass no address"));
            }
            // SAFETY: the caller's buffer of `len` bytes.
            let b = unsafe { bytes(buf, len, "rsendto: the buffer") }?;
            send(socket, b, flags)
        })(), -1)
    }

    /// `ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags)`: no control data.
    fn rsendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
        ret_or((|| {
            if msg.is_null() {
                return Err(efault("rsendmsg: msg"));
            }
            // SAFETY: a valid msghdr (C contract).
            let m = unsafe { &*msg };
            if !m.msg_control.is_null() && m.msg_controllen > 0 {
                return Err(CError::unsupported("rsendmsg: rsockets carry no control data"));
            }
            // SAFETY: the msghdr's iovec array.
            let b = unsafe { gather(m.msg_iov, m.msg_iovlen) }?;
            send(socket, &b, flags)
        })(), -1)
    }

    /// `int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t)`:
    /// SOL_SOCKET, IPPROTO_TCP, IPPROTO_IPV6 and SOL_RDMA options as rdma-core's.
    fn rsetsockopt(socket: c_int, level: c_int, optname: c_int, optval: *const c_void, optlen: socklen_t) -> c_int {
        ret_neg1((|| {
            // SAFETY: the caller's option value of `optlen` bytes.
            let v = unsafe { bytes(optval, optlen as usize, "rsetsockopt: optval") }?;
            sock(socket, "rsetsockopt")?.setsockopt(level, optname, v)?;
            Ok(0)
        })())
    }

    /// `int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *)`.
    fn rgetsockopt(socket: c_int, level: c_int, optname: c_int, optval: *mut c_void, optlen: *mut socklen_t) -> c_int {
        ret_neg1((|| {
            if optlen.is_null() {
                return Err(efault("rgetsockopt: optlen"));
            }
            let v = sock(socket, "rgetsockopt")?.getsockopt(level, optname)?;
            // SAFETY: the caller's length.
            let room = unsafe { *optlen } as usize;
            let n = room.min(v.len());
            // SAFETY: the caller's buffer of `room` bytes.
            let out = unsafe { bytes_mut(optval, n, "rgetsockopt: optval") }?;
            out.copy_from_slice(&v[..n]);
            // SAFETY: as above.
            unsafe { *optlen = n as socklen_t };
            Ok(0)
        })())
    }

    /// `int rfcntl(int socket, int cmd, ... /* arg */)`: F_GETFL and F_SETFL (O_NONBLOCK).
    /// C-variadic; on x86_64 SysV the first variadic integer argument arrives in the same
    /// register as a third fixed `long`, so this signature is ABI-compatible (abi.md section 7).
    fn rfcntl(socket: c_int, cmd: c_int, arg: c_long) -> c_int {
        ret_neg1((|| {
            let s = sock(socket, "rfcntl")?;
            match cmd {
                libc::F_GETFL => Ok(libc::O_RDWR | if s.nonblocking() { libc::O_NONBLOCK } else { 0 }),
                libc::F_SETFL => {
                    s.set_nonblocking(arg as c_int & libc::O_NONBLOCK != 0);
                    Ok(0)
                }
                other => Err(CError::unsupported(format!("rfcntl: command {other} (rsockets take F_GETFL and F_SETFL)"))),
            }
        })())
    }

    /// `int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen)`.
    fn rgetpeername(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t) -> c_int {
        ret_neg1((|| {
            if addr.is_null() || addrlen.is_null() {
                return Err(efault("rgetpeername: addr"));
            }
            let a = sock(socket, "rgetpeername")?.peer_addr()?;
            // SAFETY: the caller's (addr, addrlen) pair.
            unsafe { addr_out(a, addr, addrlen) }?;
            Ok(0)
        })())
    }

    /// `int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen)`.
    fn rgetsockname(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t) -> c_int {
        ret_neg1((|| {
            if addr.is_null() || addrlen.is_null() {
                return Err(efault("rgetsockname: addr"));
            }
            let a = sock(socket, "rgetsockname")?.local_addr()?;
            // SAFETY: the caller's (addr, addrlen) pair.
            unsafe { addr_out(a, addr, addrlen) }?;
            Ok(0)
        })())
    }

    /// `int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)`: rsockets and ordinary fds.
    fn rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
        // SAFETY: the caller's array of `nfds` pollfds.
        ret_neg1(unsafe { poll_all(fds, nfds, timeout) })
    }

    /// `int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds,
    /// struct timeval *timeout)`.
    fn rselect(nfds: c_int, readfds: *mut libc::fd_set, writefds: *mut libc::fd_set, exceptfds: *mut libc::fd_set, timeout: *mut libc::timeval) -> c_int {
        // SAFETY: the caller's sets and timeout.
        ret_neg1(unsafe { select_all(nfds, readfds, writefds, exceptfds, timeout) })
    }

    /// `off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset)`:
    /// PROT_WRITE lets the peer `riowrite` into the buffer (announced with the next send);
    /// offset -1 means the buffer's address.
    fn riomap(socket: c_int, buf: *mut c_void, len: usize, prot: c_int, _flags: c_int, offset: off_t) -> off_t {
        ret_or((|| {
            if prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 {
                return Err(CError::inval("riomap: prot must be PROT_WRITE or PROT_NONE"));
            }
            if buf.is_null() || len == 0 {
                return Err(CError::inval("riomap: an empty or NULL buffer"));
            }
            let s = sock(socket, "riomap")?;
            let addr = buf as u64;
            Ok(s.iomap(addr, len, prot & libc::PROT_WRITE != 0, offset, |pd| {
                // SAFETY: the application lends `len` bytes at `buf` until riounmap (the
                // riomap contract); the MR checks the range is mapped and revokes remote
                // access when it is deregistered.
                unsafe {
                    pd.reg_mr_raw(
                        buf.cast::<u8>(),
                        len,
                        addr,
                        softrdma_verbs::Access::LOCAL_WRITE | softrdma_verbs::Access::REMOTE_WRITE,
                    )
                }
            })?)
        })(), -1)
    }

    /// `int riounmap(int socket, void *buf, size_t len)`.
    fn riounmap(socket: c_int, buf: *mut c_void, len: usize) -> c_int {
        ret_neg1((|| {
            sock(socket, "riounmap")?.iounmap(buf as u64, len)?;
            Ok(0)
        })())
    }

    /// `size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)`:
    /// `(size_t)-1` and errno.
    fn riowrite(socket: c_int, buf: *const c_void, count: usize, offset: off_t, flags: c_int) -> usize {
        ret_or((|| {
            // SAFETY: the caller's buffer of `count` bytes.
            let b = unsafe { bytes(buf, count, "riowrite: the buffer") }?;
            if offset < 0 {
                return Err(CError::inval("riowrite: a negative offset"));
            }
            Ok(sock(socket, "riowrite")?.iowrite(b, offset as u64, flags & libc::MSG_DONTWAIT != 0)?)
        })(), usize::MAX)
    }
}
