//! The 40-byte Global Route Header a UD receive buffer starts with. RoCEv2 has no GRH on the
//! wire; like Linux rxe, the receiver writes the IP header of the datagram there: for IPv4,
//! 20 zero bytes and then the 20-byte IPv4 header; for IPv6, the 40-byte IPv6 header.

use super::ud::UdSource;
use std::net::IpAddr;

/// Bytes of GRH before a UD payload in the receive buffer.
pub const GRH_LEN: usize = 40;

const UDP_HEADER_LEN: usize = 8;
const IPV4_HEADER_LEN: usize = 20;
const IPPROTO_UDP: u8 = 17;
const IPV4_DF: u16 = 0x4000;

/// The GRH for a datagram from `src` whose UDP payload (BTH through ICRC) is `udp_payload`
/// bytes long.
pub(crate) fn build(src: &UdSource, udp_payload: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let udp_len = udp_payload.saturating_add(UDP_HEADER_LEN);
    match (src.src_ip, src.dst_ip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = &mut g[GRH_LEN - IPV4_HEADER_LEN..];
            ip[0] = 0x45;
            ip[1] = src.traffic_class;
            let total = u16::try_from(udp_len.saturating_add(IPV4_HEADER_LEN)).unwrap_or(u16::MAX);
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[6..8].copy_from_slice(&IPV4_DF.to_be_bytes());
            ip[8] = src.hop_limit;
            ip[9] = IPPROTO_UDP;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let sum = ipv4_checksum(ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            let word = (6u32 << 28) | (u32::from(src.traffic_class) << 20);
            g[0..4].copy_from_slice(&word.to_be_bytes());
            let payload = u16::try_from(udp_len).unwrap_or(u16::MAX);
            g[4..6].copy_from_slice(&payload.to_be_bytes());
            g[6] = IPPROTO_UDP;
            g[7] = src.hop_limit;
            g[8..24].copy_from_slice(&v6(s).octets());
            g[24..40].copy_from_slice(&v6(d).octets());
        }
    }
    g
}

/// What a UD receive completion reports in `sl` for a datagram from `src` (mlx5's encoding of
/// the RoCE packet type, which UCX relies on): RoCEv2 always has UDP (bit 3), then 2 for an
/// IPv4 header, 1 for IPv6, matching what [`build`] writes.
pub(crate) fn l3_type(src: &UdSource) -> u8 {
    const UDP: u8 = 0x8;
    match (src.src_ip, src.dst_ip) {
        (IpAddr::V4(_), IpAddr::V4(_)) => UDP | 0x2,
        _ => UDP | 0x1,
    }
}

/// The Internet checksum of an IPv4 header whose checksum field is zero.
pub(crate) fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn ipv4_header_is_valid() {
        let src = UdSource {
            src_ip: IpAddr::V4(Ipv4Addr::new(192, 168, 0, 1)),
            dst_ip: IpAddr::V4(Ipv4Addr::new(192, 168, 0, 199)),
            hop_limit: 64,
            traffic_class: 0,
        };
        let g = build(&src, 0x73 - 28);
        assert_eq!(&g[..20], &[0u8; 20]);
        assert_eq!(l3_type(&src), 0x8 | 0x2, "mlx5's code for RoCEv2 over IPv4");
        // The classic example header (RFC 1071 style) with id 0x1c46 replaced by 0: recompute.
        let ip = &g[20..];
        assert_eq!(ip[0], 0x45);
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 0x73);
        assert_eq!(ip[6], 0x40);
        assert_eq!((ip[8], ip[9]), (64, 17));
        // A header including its checksum sums to 0xffff.
        assert_eq!(ipv4_checksum(ip), 0);
        let mut known = [
            0x45u8, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0,
            0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_checksum(&known), 0xb861);
        known[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(ip, &known[..]);
    }

    #[test]
    fn ipv6_header() {
        let src = UdSource {
            src_ip: IpAddr::V6(Ipv6Addr::LOCALHOST),
            dst_ip: IpAddr::V6("fe80::1".parse().unwrap()),
            hop_limit: 7,
            traffic_class: 0xa5,
        };
        let g = build(&src, 100);
        assert_eq!(&g[..4], &[0x6a, 0x50, 0, 0]);
        assert_eq!(u16::from_be_bytes([g[4], g[5]]), 108);
        assert_eq!((g[6], g[7]), (17, 7));
        assert_eq!(&g[8..24], &Ipv6Addr::LOCALHOST.octets());
        assert_eq!(g[24], 0xfe);
    }
}
