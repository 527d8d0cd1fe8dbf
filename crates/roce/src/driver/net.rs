//! The UDP sockets of the soft-RoCE driver and the two calls it makes on them.
//!
//! - The **shared socket**: `0.0.0.0:4791` with `SO_REUSEPORT`, one per process; every
//!   softrdma process on the host is in the same reuse group, so the standard port works for
//!   several processes at once.
//! - **Home sockets**: `0.0.0.0:<ephemeral>`, one per 255 QPs; the port is part of each QPN.
//!   Everything is sent from them, unconnected and with `IP_PMTUDISC_DO`, which makes the
//!   kernel write IPv4 ID 0 and DF: the ICRC covers both, so they must be predictable
//!   (../shared/wirecheck/README.md).

use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags, SockaddrIn, SockaddrStorage,
};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::io::{IoSlice, IoSliceMut};
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

/// Sends one datagram from `src` (an address of this host) to `dst`.
pub fn send_v4(sock: &UdpSocket, src: Ipv4Addr, dst: SocketAddrV4, parts: &[&[u8]]) -> io::Result<()> {
    let info = libc::in_pktinfo {
        ipi_ifindex: 0,
        ipi_spec_dst: libc::in_addr {
            s_addr: u32::from(src).to_be(),
        },
        ipi_addr: libc::in_addr { s_addr: 0 },
    };
    let iov: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
    let to = SockaddrIn::from(dst);
    let cmsg = [ControlMessage::Ipv4PacketInfo(&info)];
    sendmsg(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_DONTWAIT, Some(&to)).map_err(io::Error::from)?;
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
}

/// Reads one datagram; Ok(None) when the socket is drained.
pub fn recv(sock: &UdpSocket, buf: &mut [u8], cmsg: &mut Vec<u8>) -> io::Result<Option<Received>> {
    let mut iov = [IoSliceMut::new(buf)];
    let msg = match recvmsg::<SockaddrStorage>(sock.as_raw_fd(), &mut iov, Some(cmsg), MsgFlags::MSG_DONTWAIT) {
        Ok(m) => m,
        Err(nix::errno::Errno::EAGAIN) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Some(src) = msg.address.and_then(|a| {
        a.as_sockaddr_in()
            .map(|s| SocketAddr::V4(SocketAddrV4::new(s.ip(), s.port())))
            .or_else(|| a.as_sockaddr_in6().map(|s| SocketAddr::V6((*s).into())))
    }) else {
        return Ok(Some(Received {
            len: 0,
            src: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            dst_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        }));
    };
    let mut dst_ip = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::Ipv4PacketInfo(info) = c {
                dst_ip = IpAddr::V4(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr)));
            }
        }
    }
    Ok(Some(Received {
        len: msg.bytes,
        src,
        dst_ip,
    }))
}

/// A control-message buffer large enough for what [`recv`] asks for.
pub fn cmsg_buffer() -> Vec<u8> {
    nix::cmsg_space!(libc::in_pktinfo, libc::in6_pktinfo)
}
