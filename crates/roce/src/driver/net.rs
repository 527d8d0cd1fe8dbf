//! The UDP sockets of the soft-RoCE driver and the two calls it makes on them.
//!
//! - The **shared socket**: `0.0.0.0:4791` with `SO_REUSEPORT`, one per process; every
//!   softrdma process on the host is in the same reuse group, so the standard port works for
//!   several processes at once.
//! - **Home sockets**: `0.0.0.0:<ephemeral>`, one per 255 QPs; the port is part of each QPN.
//!   Everything is sent from them, unconnected and with `IP_PMTUDISC_DO`, which makes the
//!   kernel write IPv4 ID 0 and DF: the ICRC covers both, so they must be predictable
//!   (../shared/wirecheck/README.md).

use nix::sys::socket::{setsockopt, sockopt};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;

/// The RoCEv2 UDP port.
pub const ROCE_PORT: u16 = 4791;

/// Socket buffer size asked for (the kernel caps it at `net.core.[rw]mem_max` unless root).
const SOCKET_BUFFER: usize = 8 << 20;

fn udp_v4() -> io::Result<Socket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    s.set_nonblocking(true)?;
    setsockopt(&s, sockopt::Ipv4PacketInfo, &true).map_err(io::Error::from)?;
    grow_buffers(&s);
    Ok(s)
}

/// Asks for large socket buffers: privileged processes may exceed the sysctl caps.
fn grow_buffers(s: &Socket) {
    if setsockopt(s, sockopt::RcvBufForce, &SOCKET_BUFFER).is_err() {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    }
    if setsockopt(s, sockopt::SndBufForce, &SOCKET_BUFFER).is_err() {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
}

/// Binds the shared `0.0.0.0:4791` socket in the host's reuse group.
pub fn bind_shared_v4(port: u16) -> io::Result<UdpSocket> {
    let s = udp_v4()?;
    s.set_reuse_port(true)?;
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())?;
    Ok(s.into())
}

/// Binds a home socket on an ephemeral port; returns it and the port.
pub fn bind_home_v4() -> io::Result<(UdpSocket, u16)> {
    let s = udp_v4()?;
    set_pmtudisc_do(&s)?;
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?;
    let port = s
        .local_addr()?
        .as_socket()
        .map(|a| a.port())
        .ok_or_else(|| io::Error::other("home socket has no port"))?;
    Ok((s.into(), port))
}

fn set_pmtudisc_do(s: &Socket) -> io::Result<()> {
    let v: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live local; the fd is open.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Joins (or leaves) IPv4 multicast `group` on the interface that owns `local`.
pub fn set_membership_v4(sock: &UdpSocket, group: Ipv4Addr, local: Ipv4Addr, join: bool) -> io::Result<()> {
    if join {
        sock.join_multicast_v4(&group, &local)
    } else {
        sock.leave_multicast_v4(&group, &local)
    }
}

/// One received datagram's addressing.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Bytes in the buffer.
    pub len: usize,
    /// Sender.
    pub src: SocketAddr,
    /// Destination address from the IP header.
    pub dst_ip: IpAddr,
}

/// Datagrams sent per `sendmmsg` call at most.
pub const BATCH: usize = 32;

/// Outgoing datagrams collected for one `sendmmsg`: buffers are reused across batches.
#[derive(Debug, Default)]
pub struct TxBatch {
    bufs: Vec<Vec<u8>>,
    to: Vec<(Ipv4Addr, SocketAddrV4)>,
}

impl TxBatch {
    /// Datagrams queued.
    pub fn len(&self) -> usize {
        self.to.len()
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.to.is_empty()
    }

    /// True when the batch holds [`BATCH`] datagrams.
    pub fn is_full(&self) -> bool {
        self.to.len() >= BATCH
    }

    /// A cleared buffer for the next datagram; it counts only after [`TxBatch::commit`].
    pub fn next_buf(&mut self) -> &mut Vec<u8> {
        let i = self.to.len();
        if self.bufs.len() <= i {
            self.bufs.push(Vec::with_capacity(4096 + 128));
        }
        let b = &mut self.bufs[i];
        b.clear();
        b
    }

    /// The buffer last handed out by [`TxBatch::next_buf`], as filled.
    pub fn pending(&self) -> &[u8] {
        self.bufs.get(self.to.len()).map_or(&[], |b| b.as_slice())
    }

    /// Queues the buffer last handed out by [`TxBatch::next_buf`], from `src` to `dst`.
    pub fn commit(&mut self, src: Ipv4Addr, dst: SocketAddrV4) {
        self.to.push((src, dst));
    }

    /// The queued datagrams, for finishing touches (the ICRC).
    pub fn entries_mut(&mut self) -> impl Iterator<Item = (&mut Vec<u8>, Ipv4Addr, SocketAddrV4)> {
        self.bufs.iter_mut().zip(self.to.iter()).map(|(b, &(s, d))| (b, s, d))
    }

    /// Forgets the queued datagrams (keeping the buffers).
    pub fn clear(&mut self) {
        self.to.clear();
    }
}

/// Sends every queued datagram with as few `sendmmsg` calls as possible, each from its source
/// address (`IP_PKTINFO`). Returns (sent, failed); the batch is cleared.
pub fn send_batch(sock: &UdpSocket, batch: &mut TxBatch) -> (usize, usize) {
    const CMSG_SPACE: usize = 64;
    let n = batch.len();
    let mut names: [libc::sockaddr_in; BATCH] = [zero_sockaddr(); BATCH];
    let mut iovs: [libc::iovec; BATCH] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; BATCH];
    let mut cmsgs = [[0u64; CMSG_SPACE / 8]; BATCH];
    // SAFETY: mmsghdr is a plain C struct; all-zero is a valid (empty) value.
    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for (i, (src, dst)) in batch.to.iter().enumerate().take(BATCH) {
        names[i] = sockaddr_in(*dst);
        iovs[i] = libc::iovec {
            iov_base: batch.bufs[i].as_ptr() as *mut libc::c_void,
            iov_len: batch.bufs[i].len(),
        };
        let space = write_pktinfo(&mut cmsgs[i], *src);
        let h = &mut msgs[i].msg_hdr;
        h.msg_name = &mut names[i] as *mut libc::sockaddr_in as *mut libc::c_void;
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        h.msg_iov = &mut iovs[i];
        h.msg_iovlen = 1;
        h.msg_control = cmsgs[i].as_mut_ptr() as *mut libc::c_void;
        h.msg_controllen = space;
    }
    let (mut done, mut failed) = (0usize, 0usize);
    while done + failed < n {
        let start = done + failed;
        // SAFETY: `msgs[start..n]` point into `names`, `iovs`, `cmsgs` and `batch.bufs`, which
        // all outlive the call and are not moved while it runs; the kernel only reads them
        // (and writes `msg_len`).
        let r = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs[start..n].as_mut_ptr(),
                (n - start) as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            done += r as usize;
        } else {
            // The first datagram of the rest failed (full buffer, unreachable): drop it, as
            // the network would, and go on with the others.
            failed += 1;
        }
    }
    batch.clear();
    (done, failed)
}

fn zero_sockaddr() -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: 0,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: 0 },
        sin_zero: [0; 8],
    }
}

fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Writes one `IP_PKTINFO` control message choosing `src` into `buf`; returns its length.
fn write_pktinfo(buf: &mut [u64; 8], src: Ipv4Addr) -> usize {
    let info = libc::in_pktinfo {
        ipi_ifindex: 0,
        ipi_spec_dst: libc::in_addr {
            s_addr: u32::from(src).to_be(),
        },
        ipi_addr: libc::in_addr { s_addr: 0 },
    };
    let data_len = std::mem::size_of::<libc::in_pktinfo>() as u32;
    // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic on a length.
    let (space, len) = unsafe { (libc::CMSG_SPACE(data_len) as usize, libc::CMSG_LEN(data_len) as usize) };
    debug_assert!(space <= std::mem::size_of_val(buf));
    let hdr = libc::cmsghdr {
        cmsg_len: len as _,
        cmsg_level: libc::IPPROTO_IP,
        cmsg_type: libc::IP_PKTINFO,
    };
    let bytes = buf.as_mut_ptr() as *mut u8;
    let hdr_len = std::mem::size_of::<libc::cmsghdr>();
    // SAFETY: `buf` is 64 bytes, 8-aligned, and `space` (32 on Linux x86-64) fits in it; the
    // header goes at offset 0 and the payload at CMSG_DATA's offset (the aligned header size).
    unsafe {
        std::ptr::write_unaligned(bytes as *mut libc::cmsghdr, hdr);
        std::ptr::write_unaligned(bytes.add(hdr_len) as *mut libc::in_pktinfo, info);
    }
    space
}

/// Receive buffers for one `recvmmsg`: [`BATCH`] datagrams of up to `size` bytes.
#[derive(Debug)]
pub struct RxBatch {
    bufs: Vec<Vec<u8>>,
    names: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<[u64; 8]>,
    got: Vec<Received>,
}

impl RxBatch {
    /// Buffers for datagrams of up to `size` bytes.
    pub fn new(size: usize) -> RxBatch {
        RxBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; size]).collect(),
            // SAFETY: sockaddr_storage is plain data; all-zero is valid.
            names: (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect(),
            cmsgs: vec![[0u64; 8]; BATCH],
            got: Vec::with_capacity(BATCH),
        }
    }

    /// Datagram `i` of the last [`recv_batch`].
    pub fn datagram(&self, i: usize) -> Option<(&[u8], Received)> {
        let r = *self.got.get(i)?;
        Some((&self.bufs[i][..r.len], r))
    }
}

/// Reads up to [`BATCH`] datagrams at once; returns how many (0 when the socket is drained).
pub fn recv_batch(sock: &UdpSocket, rx: &mut RxBatch) -> io::Result<usize> {
    let mut iovs: [libc::iovec; BATCH] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; BATCH];
    // SAFETY: mmsghdr is plain data; all-zero is valid.
    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for i in 0..BATCH {
        iovs[i] = libc::iovec {
            iov_base: rx.bufs[i].as_mut_ptr() as *mut libc::c_void,
            iov_len: rx.bufs[i].len(),
        };
        let h = &mut msgs[i].msg_hdr;
        h.msg_name = &mut rx.names[i] as *mut libc::sockaddr_storage as *mut libc::c_void;
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = &mut iovs[i];
        h.msg_iovlen = 1;
        h.msg_control = rx.cmsgs[i].as_mut_ptr() as *mut libc::c_void;
        h.msg_controllen = std::mem::size_of::<[u64; 8]>();
    }
    // SAFETY: every msghdr points into `rx` buffers and local arrays that outlive the call;
    // lengths match the buffers.
    let n = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            BATCH as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(0)
        } else {
            Err(e)
        };
    }
    rx.got.clear();
    for (i, m) in msgs.iter().enumerate().take(n as usize) {
        let src = sockaddr_to_std(&rx.names[i]).unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        let dst_ip = pktinfo_dst(&m.msg_hdr).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        rx.got.push(Received {
            len: m.msg_len as usize,
            src,
            dst_ip,
        });
    }
    Ok(n as usize)
}

fn sockaddr_to_std(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    if s.ss_family as libc::c_int == libc::AF_INET {
        // SAFETY: the family says the storage holds a sockaddr_in, which it is large enough for.
        let a = unsafe { &*(s as *const libc::sockaddr_storage as *const libc::sockaddr_in) };
        Some(SocketAddr::from((
            Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
            u16::from_be(a.sin_port),
        )))
    } else {
        None
    }
}

/// The destination address from an `IP_PKTINFO` control message, if the kernel wrote one.
fn pktinfo_dst(h: &libc::msghdr) -> Option<IpAddr> {
    // SAFETY: the CMSG_* helpers walk the control buffer the kernel filled, within
    // msg_controllen; each header they return lies inside it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_PKTINFO {
                let info = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::in_pktinfo);
                return Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr))));
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}
