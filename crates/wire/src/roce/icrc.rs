//! RoCEv2 Invariant CRC (IBTA Vol 1 Annex A17).
//!
//! The ICRC is a CRC-32 (IEEE) over a pseudo packet made of the fields that do
//! not change in flight, with the variant ones replaced by 1s:
//!
//! ```text
//! 8 x 0xFF (stands in for the LRH)
//! IPv4 header, TOS, TTL and header checksum = 1s   |  IPv6 header, traffic class,
//!                                                  |  flow label and hop limit = 1s
//! UDP header, checksum = 0xFFFF
//! BTH with byte 4 (FECN, BECN, Resv6) = 0xFF
//! extension headers, payload, pad
//! ```
//!
//! It follows the pad and goes on the wire least-significant byte first
//! ([`icrc_bytes`]). Because the IPv4 Identification and flags are covered, an
//! ICRC computed in userspace is only right when the kernel's choice of those is
//! predictable: an unconnected socket with `IP_MTU_DISCOVER=IP_PMTUDISC_DO` sends
//! DF=1 and ID=0 ([`IcrcIp::v4_df`]). A receiver on a UDP socket does not see the
//! IP header; it has to assume the same values.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::bth::BTH_LEN;
use super::crc32::Crc32;
use crate::error::{be16, need, WireError};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;
/// IANA UDP destination port for RoCEv2.
pub const ROCE_V2_UDP_PORT: u16 = 4791;
/// The `Malformed` message [`check_icrc`] returns for a wrong ICRC.
pub const ICRC_MISMATCH: &str = "RoCEv2 ICRC mismatch";

const IPV4_HDR_LEN: usize = 20;
const IPV6_HDR_LEN: usize = 40;
const UDP_HDR_LEN: usize = 8;
const IPPROTO_UDP: u8 = 17;
const BTH_MASKED_BYTE: usize = 4;
/// Largest captured IPv4 header (IHL 15) + UDP + BTH.
const MAX_PSEUDO: usize = 60 + UDP_HDR_LEN + BTH_LEN;

/// CRC state after the eight 0xFF bytes that replace the LRH.
const AFTER_LRH: Crc32 = Crc32::new().update_const(&[0xff; 8]);

/// The IP-layer fields the ICRC covers, i.e. what the kernel will put (or put) in the IP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcIp {
    /// IPv4 with a 20-byte header (no options).
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Identification field.
        id: u16,
        /// DF flag.
        dont_fragment: bool,
    },
    /// IPv6 with UDP directly after the fixed header (no extension headers).
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

impl IcrcIp {
    /// IPv4 with DF=1 and ID=0: what Linux sends from an unconnected UDP socket with
    /// `IP_MTU_DISCOVER=IP_PMTUDISC_DO`.
    pub fn v4_df(src: Ipv4Addr, dst: Ipv4Addr) -> IcrcIp {
        IcrcIp::V4 {
            src,
            dst,
            id: 0,
            dont_fragment: true,
        }
    }
}

/// Writes the masked IP + UDP headers for a datagram whose UDP payload is
/// `udp_payload_len` bytes (transport + ICRC); returns the length used (28 or 48).
/// Length fields wrap like the 16-bit fields they are.
fn pseudo_ip_udp(
    ip: &IcrcIp,
    src_port: u16,
    dst_port: u16,
    udp_payload_len: usize,
    buf: &mut [u8; MAX_PSEUDO],
) -> usize {
    let udp_len = (UDP_HDR_LEN + udp_payload_len) as u16;
    let l4 = match ip {
        IcrcIp::V4 {
            src,
            dst,
            id,
            dont_fragment,
        } => {
            let total = (IPV4_HDR_LEN + usize::from(udp_len)) as u16;
            let flags: u16 = if *dont_fragment { 0x4000 } else { 0 };
            buf[0] = 0x45;
            buf[1] = 0xff; // TOS
            buf[2..4].copy_from_slice(&total.to_be_bytes());
            buf[4..6].copy_from_slice(&id.to_be_bytes());
            buf[6..8].copy_from_slice(&flags.to_be_bytes());
            buf[8] = 0xff; // TTL
            buf[9] = IPPROTO_UDP;
            buf[10] = 0xff; // header checksum
            buf[11] = 0xff;
            buf[12..16].copy_from_slice(&src.octets());
            buf[16..20].copy_from_slice(&dst.octets());
            IPV4_HDR_LEN
        }
        IcrcIp::V6 { src, dst } => {
            buf[0] = 0x6f; // version 6, traffic class (high nibble)
            buf[1] = 0xff; // traffic class (low nibble), flow label
            buf[2] = 0xff;
            buf[3] = 0xff;
            buf[4..6].copy_from_slice(&udp_len.to_be_bytes());
            buf[6] = IPPROTO_UDP;
            buf[7] = 0xff; // hop limit
            buf[8..24].copy_from_slice(&src.octets());
            buf[24..40].copy_from_slice(&dst.octets());
            IPV6_HDR_LEN
        }
    };
    buf[l4..l4 + 2].copy_from_slice(&src_port.to_be_bytes());
    buf[l4 + 2..l4 + 4].copy_from_slice(&dst_port.to_be_bytes());
    buf[l4 + 4..l4 + 6].copy_from_slice(&udp_len.to_be_bytes());
    buf[l4 + 6] = 0xff; // UDP checksum
    buf[l4 + 7] = 0xff;
    l4 + UDP_HDR_LEN
}

/// CRC over `pseudo[..n]` (IP/UDP headers, already masked) followed by
/// `transport` with BTH byte 4 masked. No allocation; the transport bytes are
/// read in place.
fn crc_with_transport(pseudo: &mut [u8; MAX_PSEUDO], n: usize, transport: &[u8]) -> u32 {
    let head = transport.len().min(BTH_LEN);
    pseudo[n..n + head].copy_from_slice(&transport[..head]);
    if head > BTH_MASKED_BYTE {
        pseudo[n + BTH_MASKED_BYTE] = 0xff;
    }
    let mut c = AFTER_LRH;
    c.update(&pseudo[..n + head]);
    c.update(&transport[head..]);
    c.finish()
}

/// The ICRC value of a RoCEv2 packet whose transport bytes (BTH .. end of pad, no ICRC)
/// are `transport`, sent with the given IP fields and UDP ports.
///
/// The IP and UDP headers are rebuilt as the kernel writes them: IPv4 IHL 5, total
/// length 20 + 8 + `transport.len()` + 4, protocol UDP; IPv6 payload length 8 +
/// `transport.len()` + 4, next header UDP; UDP length 8 + `transport.len()` + 4.
pub fn icrc(ip: &IcrcIp, src_port: u16, dst_port: u16, transport: &[u8]) -> u32 {
    let mut pseudo = [0u8; MAX_PSEUDO];
    let n = pseudo_ip_udp(ip, src_port, dst_port, transport.len() + ICRC_LEN, &mut pseudo);
    crc_with_transport(&mut pseudo, n, transport)
}

/// The ICRC as its 4 bytes appear on the wire (least-significant byte first).
pub fn icrc_bytes(value: u32) -> [u8; ICRC_LEN] {
    value.to_le_bytes()
}

/// The ICRC value carried by the 4 wire bytes (inverse of [`icrc_bytes`]).
pub fn icrc_from_bytes(bytes: [u8; ICRC_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// Appends the ICRC of `out[transport_start..]` (BTH .. end of pad) to `out`.
///
/// A `transport_start` past the end of `out` is a caller bug: it panics in debug
/// builds and computes over an empty transport in release builds.
pub fn append_icrc(ip: &IcrcIp, src_port: u16, dst_port: u16, out: &mut Vec<u8>, transport_start: usize) {
    debug_assert!(
        transport_start <= out.len(),
        "transport_start past the end of the buffer"
    );
    let value = icrc(ip, src_port, dst_port, out.get(transport_start..).unwrap_or(&[]));
    out.extend_from_slice(&icrc_bytes(value));
}

/// Verifies the ICRC at the end of a received UDP payload and returns the
/// transport bytes before it (ready for [`RocePacket::parse`](super::packet::RocePacket::parse)).
///
/// Errors: Truncated if `datagram` is shorter than a BTH plus the ICRC;
/// `Malformed(`[`ICRC_MISMATCH`]`)` if the ICRC is wrong.
pub fn check_icrc<'a>(ip: &IcrcIp, src_port: u16, dst_port: u16, datagram: &'a [u8]) -> Result<&'a [u8], WireError> {
    need("RoCEv2 datagram", datagram, BTH_LEN + ICRC_LEN)?;
    let (transport, trailer) = datagram.split_at(datagram.len() - ICRC_LEN);
    let carried = icrc_from_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    if icrc(ip, src_port, dst_port, transport) == carried {
        Ok(transport)
    } else {
        Err(WireError::Malformed(ICRC_MISMATCH))
    }
}

/// Takes a whole captured IPv4 or IPv6 packet carrying a RoCEv2 UDP datagram
/// (ICRC included) and returns `(carried, computed)` ICRC values.
///
/// The masked pseudo header is built from the captured header bytes themselves
/// (IPv4 options included), independently of [`icrc`]. Bytes after the IP
/// length (Ethernet padding) are ignored.
///
/// Errors: Truncated if the capture is shorter than the IP length or the UDP
/// payload is shorter than BTH + ICRC; Malformed for another IP version, an IPv4
/// IHL < 5, a fragment, a protocol/next header other than UDP (IPv6 extension
/// headers are not supported), or a UDP length that disagrees with the IP length.
pub fn icrc_of_ip_packet(ip_packet: &[u8]) -> Result<(u32, u32), WireError> {
    need("IP header", ip_packet, 1)?;
    let v6 = ip_packet[0] >> 4 == 6;
    let (l4, end) = match ip_packet[0] >> 4 {
        4 => {
            need("IPv4 header", ip_packet, IPV4_HDR_LEN)?;
            let ihl = usize::from(ip_packet[0] & 0x0f) * 4;
            if ihl < IPV4_HDR_LEN {
                return Err(WireError::Malformed("IPv4 IHL below 5"));
            }
            need("IPv4 header", ip_packet, ihl)?;
            let total = usize::from(be16(ip_packet, 2));
            if total < ihl {
                return Err(WireError::Malformed("IPv4 total length shorter than its header"));
            }
            if be16(ip_packet, 6) & 0x3fff != 0 {
                return Err(WireError::Malformed("fragmented IPv4 packet"));
            }
            if ip_packet[9] != IPPROTO_UDP {
                return Err(WireError::Malformed("IPv4 protocol is not UDP"));
            }
            (ihl, total)
        }
        6 => {
            need("IPv6 header", ip_packet, IPV6_HDR_LEN)?;
            if ip_packet[6] != IPPROTO_UDP {
                return Err(WireError::Malformed("IPv6 next header is not UDP"));
            }
            (IPV6_HDR_LEN, IPV6_HDR_LEN + usize::from(be16(ip_packet, 4)))
        }
        _ => return Err(WireError::Malformed("not an IPv4 or IPv6 packet")),
    };
    need("IP packet", ip_packet, end)?;
    let udp = &ip_packet[l4..end];
    need("UDP header", udp, UDP_HDR_LEN)?;
    if usize::from(be16(udp, 4)) != udp.len() {
        return Err(WireError::Malformed("UDP length does not match the IP length"));
    }
    let datagram = &udp[UDP_HDR_LEN..];
    need("RoCEv2 datagram", datagram, BTH_LEN + ICRC_LEN)?;
    let (transport, trailer) = datagram.split_at(datagram.len() - ICRC_LEN);
    let carried = icrc_from_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);

    let mut pseudo = [0u8; MAX_PSEUDO];
    let n = l4 + UDP_HDR_LEN;
    pseudo[..n].copy_from_slice(&ip_packet[..n]);
    if v6 {
        pseudo[0] |= 0x0f;
        pseudo[1..4].fill(0xff);
        pseudo[7] = 0xff;
    } else {
        pseudo[1] = 0xff;
        pseudo[8] = 0xff;
        pseudo[10..12].fill(0xff);
    }
    pseudo[l4 + 6..l4 + 8].fill(0xff);
    Ok((carried, crc_with_transport(&mut pseudo, n, transport)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    /// RoCEv2 CNP captured on a ConnectX-4 Lx (Ethernet frame), the ICRC known-answer
    /// test of wirecheck's generate_samples.py.
    const CNP: &str = "e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a00\
                       1201000012b7002800008100ffff400001180000000000000000000000000000\
                       00000000000082fd002a";

    #[test]
    fn cnp_known_answer() {
        let frame = hex(CNP);
        let ip_packet = &frame[14..];
        let (carried, computed) = icrc_of_ip_packet(ip_packet).unwrap();
        assert_eq!(icrc_bytes(carried), [0x82, 0xfd, 0x00, 0x2a]);
        assert_eq!(computed, carried);
        // Same value from the header fields alone (TOS 0xc2 and TTL 64 are masked).
        let ip = IcrcIp::V4 {
            src: Ipv4Addr::new(10, 0, 17, 1),
            dst: Ipv4Addr::new(10, 0, 18, 1),
            id: 0x718c,
            dont_fragment: true,
        };
        let datagram = &ip_packet[28..];
        let transport = &datagram[..datagram.len() - ICRC_LEN];
        assert_eq!(icrc(&ip, 0, ROCE_V2_UDP_PORT, transport), carried);
        assert_eq!(check_icrc(&ip, 0, ROCE_V2_UDP_PORT, datagram), Ok(transport));
        let mut out = transport.to_vec();
        append_icrc(&ip, 0, ROCE_V2_UDP_PORT, &mut out, 0);
        assert_eq!(out, datagram);
        // Every covered field matters; the masked ones do not.
        let v4 = |id: u16, dont_fragment: bool| IcrcIp::V4 {
            src: Ipv4Addr::new(10, 0, 17, 1),
            dst: Ipv4Addr::new(10, 0, 18, 1),
            id,
            dont_fragment,
        };
        assert_eq!(v4(0x718c, true), ip);
        let other_id = v4(0x718d, true);
        assert_eq!(
            check_icrc(&other_id, 0, ROCE_V2_UDP_PORT, datagram),
            Err(WireError::Malformed(ICRC_MISMATCH))
        );
        let no_df = v4(0x718c, false);
        assert_ne!(icrc(&no_df, 0, ROCE_V2_UDP_PORT, transport), carried);
        assert_ne!(icrc(&ip, 1, ROCE_V2_UDP_PORT, transport), carried);
        assert_ne!(icrc(&ip, 0, 4792, transport), carried);
        let mut fecn = transport.to_vec();
        fecn[4] ^= 0xc0;
        assert_eq!(icrc(&ip, 0, ROCE_V2_UDP_PORT, &fecn), carried);
        let mut tweaked = ip_packet.to_vec();
        tweaked[1] = 0x00; // TOS
        tweaked[8] = 0x01; // TTL
        tweaked[10] ^= 0x55; // IP checksum
        tweaked[26] ^= 0xaa; // UDP checksum
        tweaked[28 + 4] = 0x00; // BTH FECN/BECN
        assert_eq!(icrc_of_ip_packet(&tweaked), Ok((carried, carried)));
        tweaked[28 + 5] ^= 1; // destination QP is covered
        assert_ne!(icrc_of_ip_packet(&tweaked).map(|(_, c)| c), Ok(carried));
    }

    #[test]
    fn byte_order() {
        assert_eq!(icrc_bytes(0x2a00_fd82), [0x82, 0xfd, 0x00, 0x2a]);
        assert_eq!(icrc_from_bytes([0x82, 0xfd, 0x00, 0x2a]), 0x2a00_fd82);
    }

    #[test]
    fn ip_packet_errors() {
        let frame = hex(CNP);
        let p = &frame[14..];
        let with = |i: usize, v: u8| {
            let mut b = p.to_vec();
            b[i] = v;
            icrc_of_ip_packet(&b)
        };
        assert!(matches!(icrc_of_ip_packet(&[]), Err(WireError::Truncated { .. })));
        assert!(matches!(icrc_of_ip_packet(&p[..19]), Err(WireError::Truncated { .. })));
        assert!(matches!(icrc_of_ip_packet(&p[..59]), Err(WireError::Truncated { .. })));
        assert_eq!(with(0, 0x55), Err(WireError::Malformed("not an IPv4 or IPv6 packet")));
        assert_eq!(with(0, 0x44), Err(WireError::Malformed("IPv4 IHL below 5")));
        assert_eq!(with(9, 6), Err(WireError::Malformed("IPv4 protocol is not UDP")));
        assert_eq!(with(6, 0x60), Err(WireError::Malformed("fragmented IPv4 packet")));
        assert_eq!(with(7, 0x01), Err(WireError::Malformed("fragmented IPv4 packet")));
        assert_eq!(
            with(25, 0x29),
            Err(WireError::Malformed("UDP length does not match the IP length"))
        );
        assert!(matches!(with(3, 0x0f), Err(WireError::Malformed(_))));
        // Ethernet padding after the IP packet is ignored.
        let mut padded = p.to_vec();
        padded.extend_from_slice(&[0; 6]);
        let (c, k) = icrc_of_ip_packet(&padded).unwrap();
        assert_eq!(c, k);
        // A datagram too short for BTH + ICRC.
        assert!(matches!(
            check_icrc(&IcrcIp::v4_df(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST), 1, 2, &[0; 15]),
            Err(WireError::Truncated { need: 16, .. })
        ));
    }

    #[test]
    fn short_transport_does_not_panic() {
        let ip = IcrcIp::V6 {
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::UNSPECIFIED,
        };
        for n in 0..20 {
            let t = vec![0x5a; n];
            let _ = icrc(&ip, 1, 2, &t);
        }
        let mut v = Vec::new();
        append_icrc(&ip, 1, 2, &mut v, 0);
        assert_eq!(v.len(), ICRC_LEN);
        // Oversized lengths wrap instead of panicking.
        let big = vec![0u8; 70_000];
        let _ = icrc(&IcrcIp::v4_df(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST), 1, 2, &big);
    }
}
