//! The UDP sockets of the soft-RoCE driver and the two calls it makes on them.
//!
//! - The **shared socket**: `[::]:4791` with `SO_REUSEPORT`, one per process; every
//!   softrdma process on the host is in the same reuse group, so the standard port works for
//!   several processes at once.
//! - **Home sockets**: `[::]:<ephemeral>`, one per 255 QPs; the port is part of each QPN.
//!   Everything is sent from them, unconnected and with `IP_PMTUDISC_DO`, which makes the
//!   kernel write IPv4 ID 0 and DF: the ICRC covers both, so they must be predictable
//!   (../shared/wirecheck/README.md).
//!
//! Every socket is **dual-stack** (`AF_INET6` with `IPV6_V6ONLY` off): IPv4 peers appear as
//! IPv4-mapped addresses, which this module turns back into IPv4 addresses both ways, so
//! callers only see [`IpAddr::V4`] for IPv4 traffic. A host without IPv6 (`ipv6.disable=1`)
//! gets IPv4-only sockets instead, and sends to IPv6 addresses fail (counted as send errors).

use super::gso;
use nix::sys::socket::{setsockopt, sockopt};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// The RoCEv2 UDP port.
pub const ROCE_PORT: u16 = 4791;

/// Socket buffer size asked for (the kernel caps it at `net.core.[rw]mem_max` unless root).
const SOCKET_BUFFER: usize = 8 << 20;

/// One soft-RoCE UDP socket: dual-stack IPv6 when the host has IPv6, else IPv4 only.
#[derive(Debug)]
pub struct RoceSocket {
    sock: UdpSocket,
    dual: bool,
    /// `UDP_GRO` is on: a read may return a run of datagrams ([`Received::segment`]).
    gro: bool,
    /// Runs to loopback addresses may go as one `UDP_SEGMENT` send (home sockets; cleared
    /// if the kernel refuses one).
    gso: AtomicBool,
}

impl RoceSocket {
    /// True for a dual-stack (IPv6 and IPv4) socket, false for an IPv4-only one.
    pub fn is_dual(&self) -> bool {
        self.dual
    }

    /// True if runs of datagrams may be sent with `UDP_SEGMENT` (see [`gso`]).
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// True if reads may return runs of datagrams (`UDP_GRO`).
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// The bound local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr().map(canonical_sockaddr)
    }

    /// Sends one datagram to `dst` (an IPv4 destination goes as IPv4 either way).
    pub fn send_to(&self, buf: &[u8], dst: SocketAddr) -> io::Result<usize> {
        let dst = match dst {
            SocketAddr::V4(v4) if self.dual => {
                SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0))
            }
            SocketAddr::V6(v6) if !self.dual => match v6.ip().to_ipv4_mapped() {
                Some(ip) => SocketAddr::V4(SocketAddrV4::new(ip, v6.port())),
                None => return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT)),
            },
            other => other,
        };
        self.sock.send_to(buf, dst)
    }

    /// Joins (or leaves) IPv4 multicast `group` on the interface that owns `local`.
    pub fn set_membership_v4(&self, group: Ipv4Addr, local: Ipv4Addr, join: bool) -> io::Result<()> {
        if join {
            self.sock.join_multicast_v4(&group, &local)
        } else {
            self.sock.leave_multicast_v4(&group, &local)
        }
    }
}

impl AsRawFd for RoceSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// A socket address as the rest of the driver sees it: an IPv4-mapped IPv6 address becomes
/// the IPv4 address.
fn canonical_sockaddr(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, v6.port())),
            None => a,
        },
        v4 => v4,
    }
}

fn setsockopt_int(s: &Socket, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live local; the fd is open.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
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

/// A dual-stack UDP socket with the receive options the driver reads: the destination
/// address (`IPV6_RECVPKTINFO`, which reports IPv4 packets too), hop limit and traffic class
/// (`IPV6_RECVHOPLIMIT`/`IPV6_RECVTCLASS` for IPv6, `IP_RECVTTL`/`IP_RECVTOS` for IPv4).
fn udp_dual() -> io::Result<Socket> {
    let s = Socket::new(Domain::IPV6, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    s.set_only_v6(false)?;
    s.set_nonblocking(true)?;
    setsockopt_int(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
    setsockopt_int(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1)?;
    setsockopt_int(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
    setsockopt_int(&s, libc::IPPROTO_IP, libc::IP_RECVTTL, 1)?;
    setsockopt_int(&s, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
    // Linux rdma_rxe sends RoCEv2 over IPv6 with UDP checksum 0 (RFC 6935/6936 allow it for
    // tunnels; rxe's own socket accepts it the same way); without this the kernel drops them.
    setsockopt_int(&s, libc::IPPROTO_UDP, libc::UDP_NO_CHECK6_RX, 1)?;
    grow_buffers(&s);
    Ok(s)
}

fn udp_v4() -> io::Result<Socket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    s.set_nonblocking(true)?;
    setsockopt(&s, sockopt::Ipv4PacketInfo, &true).map_err(io::Error::from)?;
    setsockopt_int(&s, libc::IPPROTO_IP, libc::IP_RECVTTL, 1)?;
    setsockopt_int(&s, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
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

/// Whether sockets may be dual-stack: not when `SOFTRDMA_ROCE_IPV6=0`.
fn ipv6_wanted() -> bool {
    !softrdma_verbs::settings::ROCE_IPV6.is("0")
}

/// Opens a socket bound to `port` (0: ephemeral): dual-stack, or IPv4 only when IPv6 is not
/// available (or the dual-stack bind fails, e.g. another program holds the IPv6 port).
fn open(port: u16, reuse_port: bool, home: bool) -> io::Result<RoceSocket> {
    open_as(port, reuse_port, home, ipv6_wanted())
}

/// [`open`], trying dual-stack only if `dual_ok`.
fn open_as(port: u16, reuse_port: bool, home: bool, dual_ok: bool) -> io::Result<RoceSocket> {
    let bind = |s: Socket, dual: bool| -> io::Result<RoceSocket> {
        if reuse_port {
            s.set_reuse_port(true)?;
        }
        if home {
            set_pmtudisc_do(&s, dual)?;
        }
        let any = if dual {
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
        } else {
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
        };
        s.bind(&any.into())?;
        let offload = gso::wanted();
        let gro = offload && setsockopt_int(&s, libc::SOL_UDP, gso::UDP_GRO, 1).is_ok();
        Ok(RoceSocket {
            sock: s.into(),
            dual,
            gro,
            gso: AtomicBool::new(offload && home),
        })
    };
    if dual_ok {
        match udp_dual().and_then(|s| bind(s, true)) {
            Ok(s) => return Ok(s),
            Err(e) => tracing::debug!(port, "soft-RoCE: no dual-stack UDP socket ({e}); IPv4 only"),
        }
    }
    bind(udp_v4()?, false)
}

/// Binds the shared `[::]:4791` socket in the host's reuse group.
pub fn bind_shared(port: u16) -> io::Result<RoceSocket> {
    open(port, true, false)
}

/// Binds a home socket on an ephemeral port; returns it and the port.
pub fn bind_home() -> io::Result<(RoceSocket, u16)> {
    let s = open(0, false, true)?;
    let port = s.local_addr()?.port();
    Ok((s, port))
}

fn set_pmtudisc_do(s: &Socket, dual: bool) -> io::Result<()> {
    setsockopt_int(s, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
    if dual {
        setsockopt_int(s, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO)?;
    }
    Ok(())
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
    /// TTL / hop limit of the IP header, when the kernel reported it.
    pub hop_limit: Option<u8>,
    /// TOS / traffic class of the IP header, when the kernel reported it.
    pub traffic_class: Option<u8>,
    /// The buffer holds a run of datagrams of this size (the last may be shorter), which
    /// the kernel kept together (`UDP_GRO`); see [`gso::segments`].
    pub segment: Option<usize>,
}

/// Datagrams sent per `sendmmsg` call at most.
pub const BATCH: usize = 32;

/// Where one queued datagram goes, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxTo {
    /// Source address (`IP_PKTINFO` / `IPV6_PKTINFO`).
    pub src: IpAddr,
    /// Destination (the scope id of a link-local IPv6 one names the interface).
    pub dst: SocketAddr,
    /// IPv6 traffic class and hop limit (from the GRH); IPv4 packets keep the socket's.
    pub v6: Option<(u8, u8)>,
}

/// Outgoing datagrams collected for one `sendmmsg`: buffers are reused across batches.
#[derive(Debug, Default)]
pub struct TxBatch {
    bufs: Vec<Vec<u8>>,
    to: Vec<TxTo>,
    /// How the datagrams go: `(first, count)`, one send each ([`TxBatch::plan`]).
    runs: Vec<(usize, usize)>,
    /// Each datagram's place in its run (its IPv4 Identification under GSO).
    place: Vec<u16>,
}

impl TxBatch {
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

    /// Queues the buffer last handed out by [`TxBatch::next_buf`], to go as `to` says.
    pub fn commit(&mut self, to: TxTo) {
        self.to.push(to);
    }

    /// Decides how the queued datagrams go: with `gso`, runs of equal-size datagrams to
    /// one loopback destination become single `UDP_SEGMENT` sends ([`gso::plan_runs`]);
    /// otherwise each goes alone. Call before the ICRCs are appended (their IDs depend on
    /// it), with `trailer` the bytes each datagram will still grow by (the ICRC): the runs'
    /// sizes are what will be sent.
    pub fn plan(&mut self, gso: bool, trailer: usize) {
        let (bufs, to) = (&self.bufs, &self.to);
        gso::plan_runs(
            to.len(),
            |i| bufs[i].len() + trailer,
            |i| gso && to[i].dst.ip().to_canonical().is_loopback(),
            |a, b| to[a] == to[b],
            &mut self.runs,
        );
        self.place.clear();
        for &(_, count) in &self.runs {
            self.place.extend((0..count).map(|k| k as u16));
        }
    }

    /// The queued datagrams with their place in their run, for finishing touches (the
    /// ICRC). Without a [`TxBatch::plan`], every place is 0.
    pub fn entries_mut(&mut self) -> impl Iterator<Item = (&mut Vec<u8>, TxTo, u16)> {
        let place = &self.place;
        self.bufs
            .iter_mut()
            .zip(self.to.iter())
            .enumerate()
            .map(|(i, (b, &t))| (b, t, place.get(i).copied().unwrap_or(0)))
    }

    /// Forgets the queued datagrams (keeping the buffers).
    pub fn clear(&mut self) {
        self.to.clear();
        self.runs.clear();
        self.place.clear();
    }
}

/// A socket address in C form, for either family.
#[repr(C)]
#[derive(Clone, Copy)]
union SockName {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

/// Control-message space per datagram (8-aligned): room for `IPV6_PKTINFO`, `IPV6_TCLASS`
/// and `IPV6_HOPLIMIT` when sending; for the pktinfo, TTL/hop limit and TOS/traffic class
/// messages of either family when receiving.
const CMSG_WORDS: usize = 24;

/// The C form of `dst` for a socket of kind `dual`; None if it cannot reach `dst`.
fn sock_name(dst: SocketAddr, dual: bool) -> Option<(SockName, libc::socklen_t)> {
    let v6 = |ip: Ipv6Addr, port: u16, scope: u32| {
        let sin6 = libc::sockaddr_in6 {
            sin6_family: libc::AF_INET6 as libc::sa_family_t,
            sin6_port: port.to_be(),
            sin6_flowinfo: 0,
            sin6_addr: libc::in6_addr { s6_addr: ip.octets() },
            sin6_scope_id: scope,
        };
        (
            SockName { v6: sin6 },
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    };
    match (canonical_sockaddr(dst), dual) {
        (SocketAddr::V4(a), true) => Some(v6(a.ip().to_ipv6_mapped(), a.port(), 0)),
        (SocketAddr::V4(a), false) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            Some((
                SockName { v4: sin },
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ))
        }
        (SocketAddr::V6(a), true) => Some(v6(*a.ip(), a.port(), a.scope_id())),
        (SocketAddr::V6(_), false) => None,
    }
}

/// Sends every queued datagram with as few `sendmmsg` calls as possible, each from its source
/// address (`IP_PKTINFO` / `IPV6_PKTINFO`), a planned run ([`TxBatch::plan`]) as one message
/// with `UDP_SEGMENT`. Returns (sent, failed) datagrams; the batch is cleared.
pub fn send_batch(sock: &RoceSocket, batch: &mut TxBatch) -> (usize, usize) {
    let queued = batch.to.len().min(BATCH);
    if batch.runs.iter().map(|r| r.1).sum::<usize>() != batch.to.len() {
        // Not planned: one datagram per message.
        batch.runs = (0..batch.to.len()).map(|i| (i, 1)).collect();
    }
    // SAFETY: both union members are plain C structs; all-zero is a valid value.
    let mut names: [SockName; BATCH] = unsafe { std::mem::zeroed() };
    let mut iovs: [libc::iovec; BATCH] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; BATCH];
    let mut cmsgs = [[0u64; CMSG_WORDS]; BATCH];
    // SAFETY: mmsghdr is a plain C struct; all-zero is a valid (empty) value.
    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    // Datagrams per message.
    let mut sizes = [0usize; BATCH];
    let mut failed = 0usize;
    let mut n = 0usize;
    for (iov, buf) in iovs.iter_mut().zip(&batch.bufs[..queued]) {
        *iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
    }
    for &(first, count) in &batch.runs {
        if first + count > queued {
            failed += count;
            continue;
        }
        let to = &batch.to[first];
        let Some((name, name_len)) = sock_name(to.dst, sock.dual) else {
            // An IPv6 destination on an IPv4-only socket: lost, like an unreachable host.
            failed += count;
            continue;
        };
        names[n] = name;
        let mut space = write_tx_cmsgs(&mut cmsgs[n], to);
        if count > 1 {
            let size = batch.bufs[first].len() as u16;
            space = put_cmsg(&mut cmsgs[n], space, libc::SOL_UDP, gso::UDP_SEGMENT, size);
        }
        let h = &mut msgs[n].msg_hdr;
        h.msg_name = &mut names[n] as *mut SockName as *mut libc::c_void;
        h.msg_namelen = name_len;
        h.msg_iov = &mut iovs[first];
        h.msg_iovlen = count;
        h.msg_control = cmsgs[n].as_mut_ptr() as *mut libc::c_void;
        h.msg_controllen = space;
        sizes[n] = count;
        n += 1;
    }
    let mut done = 0usize;
    let mut sent = 0usize;
    while done < n {
        // SAFETY: `msgs[done..n]` point into `names`, `iovs`, `cmsgs` and `batch.bufs`, which
        // all outlive the call and are not moved while it runs; the kernel only reads them
        // (and writes `msg_len`).
        let r = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs[done..n].as_mut_ptr(),
                (n - done) as libc::c_uint,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r > 0 {
            sent += sizes[done..done + r as usize].iter().sum::<usize>();
            done += r as usize;
        } else {
            // The first message of the rest failed (full buffer, unreachable): drop it, as
            // the network would, and go on with the others.
            let e = io::Error::last_os_error();
            if sizes[done] > 1 && refused_gso(&e) && sock.gso.swap(false, Ordering::Relaxed) {
                tracing::warn!(
                    "soft-RoCE: the kernel refused a UDP_SEGMENT send ({e}); sending one datagram per packet from now on"
                );
            }
            failed += sizes[done];
            done += 1;
        }
    }
    batch.clear();
    (sent, failed)
}

/// True for the errors with which the kernel refuses a `UDP_SEGMENT` send as such (no
/// checksum offload on the route's device, an unsupported option, a run larger than it
/// takes), rather than the network losing a packet. Retransmissions would meet the same
/// refusal, so the socket sends one datagram per packet from then on.
fn refused_gso(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP | libc::EMSGSIZE)
    )
}

/// Appends one control message to `buf` at byte `at`; returns the new end.
fn put_cmsg<T: Copy>(buf: &mut [u64; CMSG_WORDS], at: usize, level: libc::c_int, ty: libc::c_int, data: T) -> usize {
    let data_len = std::mem::size_of::<T>() as u32;
    // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic on a length.
    let (space, len) = unsafe { (libc::CMSG_SPACE(data_len) as usize, libc::CMSG_LEN(data_len) as usize) };
    let hdr_len = std::mem::size_of::<libc::cmsghdr>();
    assert!(at + space <= std::mem::size_of_val(buf), "control message space");
    let hdr = libc::cmsghdr {
        cmsg_len: len as _,
        cmsg_level: level,
        cmsg_type: ty,
    };
    let bytes = buf.as_mut_ptr() as *mut u8;
    // SAFETY: the assert above keeps `at..at + space` inside `buf`; `at` is a multiple of 8
    // (a sum of CMSG_SPACE values), the header goes there and the payload at CMSG_DATA's
    // offset (the aligned header size).
    unsafe {
        std::ptr::write_unaligned(bytes.add(at) as *mut libc::cmsghdr, hdr);
        std::ptr::write_unaligned(bytes.add(at + hdr_len) as *mut T, data);
    }
    at + space
}

/// Writes the control messages of one datagram into `buf`: its source address and, for
/// IPv6, its traffic class and hop limit. Returns their length.
fn write_tx_cmsgs(buf: &mut [u64; CMSG_WORDS], to: &TxTo) -> usize {
    match to.src.to_canonical() {
        IpAddr::V4(src) => {
            let info = libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from(src).to_be(),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            };
            put_cmsg(buf, 0, libc::IPPROTO_IP, libc::IP_PKTINFO, info)
        }
        IpAddr::V6(src) => {
            let scope = match to.dst {
                SocketAddr::V6(d) => d.scope_id(),
                SocketAddr::V4(_) => 0,
            };
            let info = libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr { s6_addr: src.octets() },
                ipi6_ifindex: scope,
            };
            let mut at = put_cmsg(buf, 0, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, info);
            if let Some((tclass, hop_limit)) = to.v6 {
                at = put_cmsg(
                    buf,
                    at,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_TCLASS,
                    libc::c_int::from(tclass),
                );
                // Hop limit 0 in an address handle: the route's default (-1), not a dead packet.
                let hl = if hop_limit == 0 {
                    -1
                } else {
                    libc::c_int::from(hop_limit)
                };
                at = put_cmsg(buf, at, libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, hl);
            }
            at
        }
    }
}

/// Receive buffers for one `recvmmsg`: [`BATCH`] datagrams of up to `size` bytes.
#[derive(Debug)]
pub struct RxBatch {
    bufs: Vec<Vec<u8>>,
    names: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<[u64; CMSG_WORDS]>,
    got: Vec<Received>,
}

impl RxBatch {
    /// Buffers for datagrams of up to `size` bytes.
    pub fn new(size: usize) -> RxBatch {
        RxBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; size]).collect(),
            // SAFETY: sockaddr_storage is plain data; all-zero is valid.
            names: (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect(),
            cmsgs: vec![[0u64; CMSG_WORDS]; BATCH],
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
pub fn recv_batch(sock: &RoceSocket, rx: &mut RxBatch) -> io::Result<usize> {
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
        h.msg_controllen = std::mem::size_of::<[u64; CMSG_WORDS]>();
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
        let c = read_rx_cmsgs(&m.msg_hdr);
        rx.got.push(Received {
            len: m.msg_len as usize,
            src,
            dst_ip: c.dst.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            hop_limit: c.hop_limit,
            traffic_class: c.traffic_class,
            segment: c.segment,
        });
    }
    Ok(n as usize)
}

/// A received address, IPv4-mapped IPv6 ones as IPv4 (see [`canonical_sockaddr`]).
fn sockaddr_to_std(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match s.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large enough for.
            let a = unsafe { &*(s as *const libc::sockaddr_storage as *const libc::sockaddr_in) };
            Some(SocketAddr::from((
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6, which it is large enough for.
            let a = unsafe { &*(s as *const libc::sockaddr_storage as *const libc::sockaddr_in6) };
            let v6 = SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                0,
                a.sin6_scope_id,
            );
            Some(canonical_sockaddr(SocketAddr::V6(v6)))
        }
        _ => None,
    }
}

/// What the control messages of one received datagram say.
#[derive(Debug, Default)]
struct RxInfo {
    dst: Option<IpAddr>,
    hop_limit: Option<u8>,
    traffic_class: Option<u8>,
    segment: Option<usize>,
}

/// Reads the destination address (`IP_PKTINFO`/`IPV6_PKTINFO`), TTL/hop limit and
/// TOS/traffic class from the control messages the kernel wrote.
fn read_rx_cmsgs(h: &libc::msghdr) -> RxInfo {
    let mut out = RxInfo::default();
    // SAFETY: the CMSG_* helpers walk the control buffer the kernel filled, within
    // msg_controllen; each header they return lies inside it, and its payload is as long as
    // its type says (checked against cmsg_len before reading).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let payload = ((*c).cmsg_len as usize).saturating_sub(data as usize - c as usize);
            let int = || (payload >= 4).then(|| std::ptr::read_unaligned(data as *const libc::c_int));
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO) if payload >= std::mem::size_of::<libc::in_pktinfo>() => {
                    let info = std::ptr::read_unaligned(data as *const libc::in_pktinfo);
                    out.dst = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr))));
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if payload >= std::mem::size_of::<libc::in6_pktinfo>() => {
                    let info = std::ptr::read_unaligned(data as *const libc::in6_pktinfo);
                    out.dst = Some(Ipv6Addr::from(info.ipi6_addr.s6_addr).to_canonical());
                }
                (libc::IPPROTO_IP, libc::IP_TTL) | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                    out.hop_limit = int().and_then(|v| u8::try_from(v).ok());
                }
                (libc::IPPROTO_IP, libc::IP_TOS) if payload >= 1 => {
                    out.traffic_class = Some(*data);
                }
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    out.traffic_class = int().and_then(|v| u8::try_from(v).ok());
                }
                (libc::SOL_UDP, gso::UDP_GRO) => {
                    out.segment = int().and_then(|v| usize::try_from(v).ok()).filter(|&v| v > 0);
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(sock: &RoceSocket) -> Vec<(Vec<u8>, Received)> {
        let mut rx = RxBatch::new(2048);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let n = recv_batch(sock, &mut rx).unwrap();
            if n > 0 {
                return (0..n)
                    .filter_map(|i| rx.datagram(i).map(|(d, r)| (d.to_vec(), r)))
                    .collect();
            }
            assert!(std::time::Instant::now() < deadline, "nothing arrived");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn dual_stack_home_sockets_carry_ipv4_and_ipv6() {
        let (a, _) = bind_home().unwrap();
        let (b, port) = bind_home().unwrap();
        assert!(a.is_dual() && b.is_dual(), "this host has IPv6");
        let mut batch = TxBatch::default();
        batch.next_buf().extend_from_slice(b"four");
        batch.commit(TxTo {
            src: IpAddr::V4(Ipv4Addr::LOCALHOST),
            dst: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            v6: None,
        });
        batch.next_buf().extend_from_slice(b"six");
        batch.commit(TxTo {
            src: IpAddr::V6(Ipv6Addr::LOCALHOST),
            dst: SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
            v6: Some((0x28, 9)),
        });
        assert_eq!(send_batch(&a, &mut batch), (2, 0));
        let mut got = drain(&b);
        if got.len() < 2 {
            got.extend(drain(&b));
        }
        let four = got.iter().find(|(d, _)| d == b"four").unwrap().1;
        assert_eq!(four.src.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST), "IPv4 stays IPv4");
        assert_eq!(four.dst_ip, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(four.hop_limit, Some(64));
        let six = got.iter().find(|(d, _)| d == b"six").unwrap().1;
        assert_eq!(six.src.ip(), IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(six.dst_ip, IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(
            (six.traffic_class, six.hop_limit),
            (Some(0x28), Some(9)),
            "GRH fields on the wire"
        );
        assert_eq!(
            a.send_to(b"x", SocketAddr::from((Ipv4Addr::LOCALHOST, port))).unwrap(),
            1
        );
    }

    #[test]
    fn a_run_to_loopback_goes_as_one_segmented_send_and_reads_as_one_run() {
        let (a, _) = bind_home().unwrap();
        let (b, port) = bind_home().unwrap();
        assert!(a.gso() && b.gro(), "GSO and GRO are on by default");
        let to = TxTo {
            src: IpAddr::V4(Ipv4Addr::LOCALHOST),
            dst: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            v6: None,
        };
        let mut batch = TxBatch::default();
        let sizes = [1000usize, 1000, 1000, 400];
        for (i, &n) in sizes.iter().enumerate() {
            batch.next_buf().extend(std::iter::repeat_n(i as u8, n));
            batch.commit(to);
        }
        batch.plan(true, 0);
        let places: Vec<u16> = batch.entries_mut().map(|e| e.2).collect();
        assert_eq!(places, vec![0, 1, 2, 3], "one run, numbered for the IPv4 IDs");
        assert_eq!(send_batch(&a, &mut batch), (4, 0));
        let mut rx = RxBatch::new(65_536);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut runs = Vec::new();
        while got.len() < 4 {
            assert!(std::time::Instant::now() < deadline, "the run did not arrive");
            let n = recv_batch(&b, &mut rx).unwrap();
            for i in 0..n {
                let (data, r) = rx.datagram(i).unwrap();
                runs.push(r.segment);
                got.extend(gso::segments(data, r.segment).map(|d| d.to_vec()));
            }
            if n == 0 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        assert_eq!(runs, vec![Some(1000)], "the kernel kept the run together (UDP_GRO)");
        let lens: Vec<usize> = got.iter().map(|d| d.len()).collect();
        assert_eq!(lens, sizes);
        assert!(got.iter().enumerate().all(|(i, d)| d.iter().all(|&x| x == i as u8)));

        // Not planned for GSO (or to a non-loopback address): one datagram per send.
        for &n in &sizes {
            batch.next_buf().extend(std::iter::repeat_n(9u8, n));
            batch.commit(to);
        }
        batch.plan(false, 0);
        assert!(batch.entries_mut().all(|e| e.2 == 0));
        assert_eq!(send_batch(&a, &mut batch), (4, 0));
    }

    #[test]
    fn runs_stay_within_the_largest_udp_payload_counting_the_icrc() {
        let (a, _) = bind_home().unwrap();
        let (_b, port) = bind_home().unwrap();
        let to = TxTo {
            src: IpAddr::V4(Ipv4Addr::LOCALHOST),
            dst: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            v6: None,
        };
        let mut batch = TxBatch::default();
        // 16 packets of 4092 bytes plus a 4-byte ICRC: 16 × 4096 = 65,536 bytes would be
        // refused (EMSGSIZE), so 15 go as one run and the 16th alone.
        for _ in 0..16 {
            batch.next_buf().extend(std::iter::repeat_n(1u8, 4092));
            batch.commit(to);
        }
        batch.plan(true, 4);
        assert_eq!(batch.runs, vec![(0, 15), (15, 1)]);
        for (buf, _, _) in batch.entries_mut() {
            buf.extend_from_slice(&[0; 4]);
        }
        assert_eq!(send_batch(&a, &mut batch), (16, 0));
        assert!(a.gso(), "nothing was refused");
    }

    #[test]
    fn ipv4_only_sockets_send_ipv4_and_refuse_ipv6() {
        let a = open_as(0, false, true, false).unwrap();
        let b = open_as(0, false, true, false).unwrap();
        assert!(!a.is_dual());
        let port = b.local_addr().unwrap().port();
        let mut batch = TxBatch::default();
        batch.next_buf().extend_from_slice(b"six");
        batch.commit(TxTo {
            src: IpAddr::V6(Ipv6Addr::LOCALHOST),
            dst: SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
            v6: None,
        });
        batch.next_buf().extend_from_slice(b"four");
        batch.commit(TxTo {
            src: IpAddr::V4(Ipv4Addr::LOCALHOST),
            dst: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            v6: None,
        });
        assert_eq!(
            send_batch(&a, &mut batch),
            (1, 1),
            "the IPv6 one fails, the IPv4 one goes"
        );
        let got = drain(&b);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, b"four");
        assert_eq!(got[0].1.dst_ip, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(a.send_to(b"x", SocketAddr::from((Ipv6Addr::LOCALHOST, port))).is_err());
    }
}
