//! Handing a datagram to the process that owns its destination QP.
//!
//! Every softrdma process on a host binds UDP 4791 with `SO_REUSEPORT`, so the kernel gives
//! each incoming RoCE datagram to one of them, chosen by a hash of the addresses and ports. A
//! process that receives a packet for another process's QP (the QPN names the owner's home
//! port, see `qpn`) passes it on to that port on 127.0.0.1, prefixed with this header so the
//! owner sees the original addresses (it needs them for the ICRC and for UD's GRH). The owner
//! accepts the header only from a loopback source, which the network cannot forge (Linux
//! drops loopback-sourced packets arriving on other interfaces). The magic cannot start a
//! RoCE packet: 0x53 is no BTH opcode.
//!
//! A QPN (or a CM communication ID) can name any port, and a hostile peer chooses it. So a
//! datagram is forwarded only to a port that is a softrdma home port, which its owner marks
//! with an abstract Unix socket named after it ([`home_marker_name`]); anything else listening
//! on 127.0.0.1 never gets attacker-chosen bytes relayed to it.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};

/// Marks a forwarded datagram (and its format version).
const MAGIC: [u8; 4] = *b"SRF2";

/// Bytes before the original UDP payload.
pub const FORWARD_HDR_LEN: usize = 4 + 1 + 16 + 2 + 16 + 2 + 1 + 1;

/// The hop limit assumed when the kernel did not report one (Linux's default TTL).
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// The original addressing of a forwarded datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// Source address and port of the UDP datagram.
    pub src: SocketAddr,
    /// Destination address (the IP header's, e.g. a multicast group).
    pub dst_ip: IpAddr,
    /// Destination UDP port.
    pub dst_port: u16,
    /// TTL / hop limit of the IP header (for a UD receiver's GRH).
    pub hop_limit: u8,
    /// TOS / traffic class of the IP header (for a UD receiver's GRH).
    pub traffic_class: u8,
}

/// True if `msg` starts like a forwarded datagram.
pub fn is_forwarded(msg: &[u8]) -> bool {
    msg.len() >= 4 && msg[..4] == MAGIC
}

fn ip16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn ip_from(family: u8, b: &[u8]) -> Option<IpAddr> {
    let a: [u8; 16] = b.try_into().ok()?;
    match family {
        4 => Ipv6Addr::from(a).to_ipv4_mapped().map(IpAddr::V4),
        6 => Some(IpAddr::V6(Ipv6Addr::from(a))),
        _ => None,
    }
}

/// Appends the header for `origin` to `out`.
pub fn encode(origin: &Origin, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.push(if origin.src.is_ipv4() { 4 } else { 6 });
    out.extend_from_slice(&ip16(origin.src.ip()));
    out.extend_from_slice(&origin.src.port().to_be_bytes());
    out.extend_from_slice(&ip16(origin.dst_ip));
    out.extend_from_slice(&origin.dst_port.to_be_bytes());
    out.push(origin.hop_limit);
    out.push(origin.traffic_class);
}

/// Splits a forwarded message into its origin and the original UDP payload.
pub fn decode(msg: &[u8]) -> Option<(Origin, &[u8])> {
    if msg.len() < FORWARD_HDR_LEN || msg[..4] != MAGIC {
        return None;
    }
    let family = msg[4];
    let src_ip = ip_from(family, &msg[5..21])?;
    let src_port = u16::from_be_bytes([msg[21], msg[22]]);
    let dst_ip = ip_from(family, &msg[23..39])?;
    let dst_port = u16::from_be_bytes([msg[39], msg[40]]);
    let origin = Origin {
        src: SocketAddr::new(src_ip, src_port),
        dst_ip,
        dst_port,
        hop_limit: msg[41],
        traffic_class: msg[42],
    };
    Some((origin, &msg[FORWARD_HDR_LEN..]))
}

/// The abstract Unix socket name that marks `port` as a softrdma home port.
pub fn home_marker_name(port: u16) -> String {
    format!("softrdma-rxe-home-{port}")
}

/// Binds the marker of home port `port`; the owner holds it as long as the home socket.
pub fn bind_home_marker(port: u16) -> io::Result<UnixDatagram> {
    let addr = UnixAddr::from_abstract_name(home_marker_name(port).as_bytes())?;
    UnixDatagram::bind_addr(&addr)
}

/// True if some process holds the marker of `port`, i.e. `port` is a softrdma home port.
pub fn is_home_port(port: u16) -> bool {
    let Ok(addr) = UnixAddr::from_abstract_name(home_marker_name(port).as_bytes()) else {
        return false;
    };
    UnixDatagram::unbound().and_then(|s| s.connect_addr(&addr)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_ports_are_marked_and_others_are_not() {
        // A port some other program holds: never a softrdma home port.
        let other = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = other.local_addr().unwrap().port();
        assert!(!is_home_port(port));
        let marker = bind_home_marker(port).unwrap();
        assert!(is_home_port(port));
        assert!(bind_home_marker(port).is_err(), "one owner per port");
        drop(marker);
        assert!(!is_home_port(port), "the mark goes with its socket");
    }

    #[test]
    fn round_trip_v4_and_v6() {
        for (src, dst) in [("198.18.0.1:49152", "224.0.1.5"), ("[fd00::1]:4791", "fd00::2")] {
            let o = Origin {
                src: src.parse().unwrap(),
                dst_ip: dst.parse().unwrap(),
                dst_port: 4791,
                hop_limit: 7,
                traffic_class: 0x28,
            };
            let mut buf = Vec::new();
            encode(&o, &mut buf);
            assert_eq!(buf.len(), FORWARD_HDR_LEN);
            buf.extend_from_slice(b"payload");
            let (got, rest) = decode(&buf).unwrap();
            assert_eq!(got, o);
            assert_eq!(rest, b"payload");
        }
    }

    #[test]
    fn garbage_is_refused() {
        assert!(decode(b"").is_none());
        assert!(decode(&[0u8; 64]).is_none());
        let mut buf = Vec::new();
        let o = Origin {
            src: "127.0.0.1:1".parse().unwrap(),
            dst_ip: "127.0.0.1".parse().unwrap(),
            dst_port: 4791,
            hop_limit: DEFAULT_HOP_LIMIT,
            traffic_class: 0,
        };
        encode(&o, &mut buf);
        buf[4] = 9;
        assert!(decode(&buf).is_none());
        assert!(is_forwarded(&buf) && !is_forwarded(&[0x04, 0x40, 0xff, 0xff]));
    }
}
