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
//! IP header; [`check_icrc_any_id`] recovers the Identification and DF a sender used
//! (Linux rdma_rxe: DF=1, a non-zero incrementing ID) from the ICRC itself.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::bth::BTH_LEN;
use super::crc32::{Crc32, POLY, TABLE};
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

// ---- Recovering the IPv4 Identification and DF flag from a received ICRC ----
//
// For messages of one length the CRC is affine: crc(a ^ b) = crc(a) ^ crc(b) ^ crc(0..0).
// Two pseudo packets that differ only in the four bytes Identification | flags+fragment
// offset (message offset 12, right after the 8 LRH bytes and 4 IPv4 bytes) thus have ICRCs
// that differ by the raw CRC register contribution of those four bytes alone, which is
// `w * x^(8k) mod P` for the four bytes read as a little-endian u32 `w` (a reflected CRC
// xors data into its register and then multiplies by x^8 per byte) and `k` the number of
// message bytes from the Identification to the end. `x` is invertible mod P (P(0) = 1), so
// `w = delta * x^(-8k)`: one exact answer, found with two multiplications in GF(2)[x]/P.
// The packet is explained by some IPv4 header iff `w`'s flags/offset half is DF or 0.

/// x^0 in the reflected representation of the CRC register (bit 31 = x^0, bit 0 = x^31).
const X0: u32 = 0x8000_0000;
/// Message bytes from the IPv4 Identification to the transport: IPv4 from offset 4, UDP.
const IPV4_ID_TO_TRANSPORT: usize = IPV4_HDR_LEN - 4 + UDP_HDR_LEN;
/// The flags + fragment offset half of `w` (message bytes 14, 15) for DF=1, MF=0, offset 0.
const W_FLAGS_DF: u32 = 0x0040_0000;

/// `a * x^-1 mod P`, the inverse of one CRC shift `(a >> 1) ^ (POLY if a & 1)`: POLY has
/// the x^0 bit set, so that bit tells whether the reduction happened.
const fn mul_x_inv(a: u32) -> u32 {
    if a & X0 != 0 {
        ((a ^ POLY) << 1) | 1
    } else {
        a << 1
    }
}

/// `a * b mod P`: a carry-less 32 x 32 -> 63-bit product (4 bits of `a` per step) reduced
/// with the CRC table. In the reflected representation bit `j` of the product is x^(62 - j);
/// shifted left once, its high half is the part below x^32 and its low half `h` stands for
/// `h * x^32`, which is `h` run through four zero bytes of CRC.
const fn mulmod(a: u32, b: u32) -> u32 {
    let mut t = [0u64; 16];
    let mut n = 1;
    while n < 16 {
        t[n] = (t[n >> 1] << 1) ^ (b as u64 & 0u64.wrapping_sub(n as u64 & 1));
        n += 1;
    }
    let mut p = 0u64;
    let mut i = 0;
    while i < 8 {
        p ^= t[((a >> (4 * i)) & 0xf) as usize] << (4 * i);
        i += 1;
    }
    let p = p << 1;
    let mut r = p as u32;
    let mut k = 0;
    while k < 4 {
        r = TABLE[(r & 0xff) as usize] ^ (r >> 8);
        k += 1;
    }
    (p >> 32) as u32 ^ r
}

/// `x^(-8 j)` for j < 256 (the low byte of a shift count in bytes).
const X_INV_BYTES_LO: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut c = X0;
    let mut j = 0;
    while j < 256 {
        t[j] = c;
        let mut b = 0;
        while b < 8 {
            c = mul_x_inv(c);
            b += 1;
        }
        j += 1;
    }
    t
};

/// `x^(-8 * 256 j)` for j < 256 (the second byte of a shift count in bytes).
const X_INV_BYTES_HI: [u32; 256] = {
    let step = mulmod(X_INV_BYTES_LO[255], X_INV_BYTES_LO[1]); // x^(-8 * 256)
    let mut t = [0u32; 256];
    let mut c = X0;
    let mut j = 0;
    while j < 256 {
        t[j] = c;
        c = mulmod(c, step);
        j += 1;
    }
    t
};

/// `x^(-8 * 65536)`, for shift counts past the 16 bits a UDP datagram can need.
const X_INV_BYTES_64K: u32 = mulmod(X_INV_BYTES_HI[255], X_INV_BYTES_HI[1]);

/// `a * x^(-8 k) mod P`: undoes feeding `k` zero bytes to a raw CRC register.
fn unshift_bytes(a: u32, k: usize) -> u32 {
    let mut r = mulmod(mulmod(a, X_INV_BYTES_LO[k & 0xff]), X_INV_BYTES_HI[(k >> 8) & 0xff]);
    for _ in 0..k >> 16 {
        r = mulmod(r, X_INV_BYTES_64K);
    }
    r
}

/// The IPv4 Identification and DF flag that make `carried` the ICRC of `transport` (BTH ..
/// end of pad) sent from `src`:`src_port` to `dst`:`dst_port` in a 20-byte IPv4 header
/// with MF=0 and fragment offset 0; `None` if no such header exists.
///
/// A receiver on a UDP socket does not see the IP header, and Linux rdma_rxe (unlike a
/// socket with `IP_PMTUDISC_DO`) sends a non-zero, incrementing Identification. The answer
/// is unique when it exists and costs one ICRC computation plus a few hundred bit
/// operations (no search). A random corruption of the covered bytes goes unnoticed with
/// probability 2^-15 (2 of the 2^16 flags/offset values are accepted) instead of 2^-32.
/// Short errors are no longer all caught either: whether one is depends only on its offset
/// in the UDP payload; below 1500 bytes single-bit errors are caught everywhere except
/// bit 3 of byte 173, single-byte errors everywhere except at offsets 93, 173, 305, 890
/// and 1240 (some values).
pub fn solve_ipv4_id(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    transport: &[u8],
    carried: u32,
) -> Option<(u16, bool)> {
    // Relative to ID 0 and DF (softrdma's own packets: no multiplication needed).
    let base = IcrcIp::v4_df(src, dst);
    let delta = carried ^ icrc(&base, src_port, dst_port, transport);
    if delta == 0 {
        return Some((0, true));
    }
    let w = unshift_bytes(delta, IPV4_ID_TO_TRANSPORT + transport.len()) ^ W_FLAGS_DF;
    let dont_fragment = match w & 0xffff_0000 {
        0 => false,
        W_FLAGS_DF => true,
        _ => return None,
    };
    // Message bytes 12, 13 are the Identification, most significant byte first.
    Some(((w as u16).swap_bytes(), dont_fragment))
}

/// [`check_icrc`] for an IPv4 datagram whose Identification and DF flag are unknown: returns
/// the transport bytes and the IP fields ([`IcrcIp::V4`]) that the ICRC proves the sender
/// used (see [`solve_ipv4_id`]).
///
/// Errors: Truncated if `datagram` is shorter than a BTH plus the ICRC;
/// `Malformed(`[`ICRC_MISMATCH`]`)` if no Identification and DF explain the ICRC.
pub fn check_icrc_any_id(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    datagram: &[u8],
) -> Result<(&[u8], IcrcIp), WireError> {
    need("RoCEv2 datagram", datagram, BTH_LEN + ICRC_LEN)?;
    let (transport, trailer) = datagram.split_at(datagram.len() - ICRC_LEN);
    let carried = icrc_from_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    match solve_ipv4_id(src, dst, src_port, dst_port, transport, carried) {
        Some((id, dont_fragment)) => Ok((
            transport,
            IcrcIp::V4 {
                src,
                dst,
                id,
                dont_fragment,
            },
        )),
        None => Err(WireError::Malformed(ICRC_MISMATCH)),
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

    fn ip_src(ip: &IcrcIp) -> Ipv4Addr {
        match ip {
            IcrcIp::V4 { src, .. } => *src,
            IcrcIp::V6 { .. } => Ipv4Addr::UNSPECIFIED,
        }
    }

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
        // The receiver-side solver finds ID 0x718c and DF without seeing the header.
        assert_eq!(
            check_icrc_any_id(ip_src(&ip), Ipv4Addr::new(10, 0, 18, 1), 0, ROCE_V2_UDP_PORT, datagram),
            Ok((transport, ip))
        );
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
    /// xorshift64*: deterministic pseudo-random test data.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// A random datagram (transport of `len` bytes + ICRC) sent with the given ID and DF.
    struct Sent {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        sport: u16,
        dport: u16,
        datagram: Vec<u8>,
    }

    fn sent(rng: &mut Rng, len: usize, id: u16, dont_fragment: bool) -> Sent {
        let src = Ipv4Addr::from(rng.next() as u32);
        let dst = Ipv4Addr::from(rng.next() as u32);
        let (sport, dport) = (rng.next() as u16, rng.next() as u16);
        let mut datagram = rng.bytes(len);
        let ip = IcrcIp::V4 {
            src,
            dst,
            id,
            dont_fragment,
        };
        append_icrc(&ip, sport, dport, &mut datagram, 0);
        Sent {
            src,
            dst,
            sport,
            dport,
            datagram,
        }
    }

    impl Sent {
        fn solve(&self) -> Result<(&[u8], IcrcIp), WireError> {
            check_icrc_any_id(self.src, self.dst, self.sport, self.dport, &self.datagram)
        }
    }

    /// Bit-at-a-time `a * b mod P`: bit 31 - i of `a` is its coefficient of x^i.
    fn mulmod_slow(a: u32, mut b: u32) -> u32 {
        let mut p = 0;
        for i in 0..32 {
            if (a >> (31 - i)) & 1 != 0 {
                p ^= b;
            }
            b = (b >> 1) ^ if b & 1 != 0 { POLY } else { 0 };
        }
        p
    }

    #[test]
    fn mulmod_matches_bitwise() {
        let mut rng = Rng(8);
        for i in 0..10_000 {
            let (a, b) = match i {
                0 => (X0, 0xffff_ffff),
                1 => (0xffff_ffff, 0xffff_ffff),
                2 => (1, 1),
                _ => (rng.next() as u32, rng.next() as u32),
            };
            assert_eq!(mulmod(a, b), mulmod_slow(a, b), "{a:#x} * {b:#x}");
        }
    }

    #[test]
    fn unshift_undoes_zero_bytes() {
        let mut rng = Rng(1);
        let zeros = vec![0u8; 70_000];
        for k in [0, 1, 2, 7, 8, 255, 256, 257, 1024, 4096, 65_535, 65_536, 65_537, 69_999] {
            let r = rng.next() as u32;
            // Crc32 values are the register inverted.
            let mut c = Crc32::resume(!r);
            c.update(&zeros[..k]);
            let shifted = !c.finish();
            assert_eq!(unshift_bytes(shifted, k), r, "k {k}");
        }
        assert_eq!(mulmod(X0, 0x1234_5678), 0x1234_5678);
        assert_eq!(mul_x_inv((0xdead_beef >> 1) ^ POLY), 0xdead_beef);
        assert_eq!(mul_x_inv(0x1234_5678 >> 1), 0x1234_5678 & !1);
    }

    #[test]
    fn recovers_id_and_df() {
        let mut rng = Rng(2);
        for i in 0..2000 {
            let len = BTH_LEN + rng.below(1500);
            let id = if i < 4 {
                [0, 0xffff, 1, 0x8000][i]
            } else {
                rng.next() as u16
            };
            let df = rng.next() & 1 == 1;
            let s = sent(&mut rng, len, id, df);
            let (t, ip) = s.solve().unwrap();
            assert_eq!(t, &s.datagram[..len]);
            assert_eq!(
                ip,
                IcrcIp::V4 {
                    src: s.src,
                    dst: s.dst,
                    id,
                    dont_fragment: df
                }
            );
        }
        // Transports far beyond a UDP datagram still solve (lengths wrap in the headers only).
        let s = sent(&mut rng, 140_000, 0x1234, true);
        assert_eq!(
            s.solve().map(|(_, ip)| ip),
            Ok(IcrcIp::V4 {
                src: s.src,
                dst: s.dst,
                id: 0x1234,
                dont_fragment: true
            })
        );
        assert!(matches!(
            check_icrc_any_id(s.src, s.dst, 1, 2, &s.datagram[..BTH_LEN + ICRC_LEN - 1]),
            Err(WireError::Truncated { .. })
        ));
    }

    /// The solver against an exhaustive search over all 2^17 (ID, DF): the same answer, and
    /// no answer exactly when no header explains the ICRC.
    #[test]
    fn agrees_with_exhaustive_search() {
        let mut rng = Rng(3);
        for case in 0..4 {
            let id = rng.next() as u16;
            let mut s = sent(&mut rng, BTH_LEN + 4 * case, id, case % 2 == 0);
            if case >= 2 {
                let bit = rng.below(8 * s.datagram.len());
                s.datagram[bit / 8] ^= 1 << (bit % 8);
            }
            let (transport, trailer) = s.datagram.split_at(s.datagram.len() - ICRC_LEN);
            let carried = icrc_from_bytes(trailer.try_into().unwrap());
            let mut found = Vec::new();
            for df in [false, true] {
                for id in 0..=u16::MAX {
                    let ip = IcrcIp::V4 {
                        src: s.src,
                        dst: s.dst,
                        id,
                        dont_fragment: df,
                    };
                    if icrc(&ip, s.sport, s.dport, transport) == carried {
                        found.push((id, df));
                    }
                }
            }
            assert!(found.len() <= 1, "case {case}: {found:?}");
            let solved = solve_ipv4_id(s.src, s.dst, s.sport, s.dport, transport, carried);
            assert_eq!(solved, found.first().copied(), "case {case}");
            if case < 2 {
                assert_eq!(solved, Some((id, case % 2 == 0)));
            }
        }
    }

    /// Flips one bit at a time of every covered byte outside the IPv4 ID/flags (addresses,
    /// ports, transport, ICRC; not the masked BTH byte 4) and counts the flips some other
    /// (ID, DF) explains. Returns (accepted, tried).
    fn single_bit_flips(rng: &mut Rng, packets: usize, len: usize) -> (u64, u64) {
        let (mut accepted, mut tried) = (0, 0);
        for _ in 0..packets {
            let (id, df) = (rng.next() as u16, rng.next() & 1 == 1);
            let s = sent(rng, len, id, df);
            let mut fields: Vec<u8> = Vec::new();
            fields.extend_from_slice(&s.src.octets());
            fields.extend_from_slice(&s.dst.octets());
            fields.extend_from_slice(&s.sport.to_be_bytes());
            fields.extend_from_slice(&s.dport.to_be_bytes());
            fields.extend_from_slice(&s.datagram);
            for bit in 0..fields.len() * 8 {
                if bit / 8 == 12 + BTH_MASKED_BYTE {
                    continue;
                }
                let mut f = fields.clone();
                f[bit / 8] ^= 1 << (bit % 8);
                let src = Ipv4Addr::new(f[0], f[1], f[2], f[3]);
                let dst = Ipv4Addr::new(f[4], f[5], f[6], f[7]);
                let (sport, dport) = (be16(&f, 8), be16(&f, 10));
                tried += 1;
                if check_icrc_any_id(src, dst, sport, dport, &f[12..]).is_ok() {
                    accepted += 1;
                }
            }
        }
        (accepted, tried)
    }

    /// Overwrites `bytes` distinct random covered transport/ICRC bytes with other random
    /// values. Returns (accepted, tried).
    fn random_corruption(rng: &mut Rng, tries: u64, len: usize, bytes: usize) -> (u64, u64) {
        let mut accepted = 0;
        for _ in 0..tries {
            let (id, df) = (rng.next() as u16, rng.next() & 1 == 1);
            let mut s = sent(rng, len, id, df);
            let mut hit = Vec::new();
            while hit.len() < bytes {
                let at = rng.below(s.datagram.len());
                if at != BTH_MASKED_BYTE && !hit.contains(&at) {
                    hit.push(at);
                    s.datagram[at] ^= 1 + rng.below(255) as u8;
                }
            }
            if s.solve().is_ok() {
                accepted += 1;
            }
        }
        (accepted, tries)
    }

    /// Whether an error is caught depends only on its distance from the Identification, not
    /// on the packet (the ICRC bytes count as datagram bytes too): a single-bit error in
    /// the first 173 bytes of the UDP payload is always caught (exhaustive here, transport
    /// 169 + ICRC 4); the first blind spots are in `blind_spots_are_positional`.
    #[test]
    fn rejects_corruption() {
        let mut rng = Rng(4);
        let (a, n) = single_bit_flips(&mut rng, 2, 169);
        assert_eq!(a, 0, "{a} of {n} single-bit flips accepted");
        let (a, n) = random_corruption(&mut rng, 3000, 100, 4);
        // 2^-15 per try: 0.09 expected.
        assert!(a <= 1, "{a} of {n} corruptions accepted");
    }

    /// The first blind spots (found by a GF(2) rank scan over distances): UDP payload byte
    /// 93 xored with 0x44, 0x77 or 0x33, and bit 3 of byte 173, are errors that some other
    /// (ID, DF) explains, in every packet. Byte 92 has none.
    #[test]
    fn blind_spots_are_positional() {
        let mut rng = Rng(7);
        for round in 0..3 {
            let s = sent(&mut rng, 200 + 100 * round, 0xbeef, round != 1);
            for (at, xor) in [(93, 0x44), (93, 0x77), (93, 0x33), (173, 0x08)] {
                let mut bad = s.datagram.clone();
                bad[at] ^= xor;
                let (_, ip) = check_icrc_any_id(s.src, s.dst, s.sport, s.dport, &bad).unwrap();
                assert!(matches!(ip, IcrcIp::V4 { id, .. } if id != 0xbeef));
            }
            for xor in 1..=255u8 {
                let mut bad = s.datagram.clone();
                bad[92] ^= xor;
                assert!(check_icrc_any_id(s.src, s.dst, s.sport, s.dport, &bad).is_err());
            }
        }
    }

    /// `cargo test -p softrdma-wire --release --lib -- --ignored --nocapture false_accept`
    #[test]
    #[ignore = "statistics: about a minute in release"]
    fn false_accept_rate() {
        let mut rng = Rng(5);
        let rate = |a: u64, n: u64| {
            format!(
                "{a} of {n} accepted ({:.2e}; 2^-15 = {:.2e})",
                a as f64 / n as f64,
                2f64.powi(-15)
            )
        };
        let (a, n) = single_bit_flips(&mut rng, 20, 1060);
        println!("single-bit flips, 1060-byte transports: {}", rate(a, n));
        for bytes in [1, 2, 4, 8] {
            let (a, n) = random_corruption(&mut rng, 2_000_000, 60, bytes);
            println!("{bytes} random bytes changed, 60-byte transports: {}", rate(a, n));
        }
    }

    /// `cargo test -p softrdma-wire --release --lib -- --ignored --nocapture solver_cost`
    #[test]
    #[ignore = "timing, meaningful in release only"]
    fn solver_cost() {
        use std::hint::black_box;
        use std::time::Instant;
        let mut rng = Rng(6);
        for len in [BTH_LEN + 4, 64, 1024 + 28, 4096 + 28] {
            let s = sent(&mut rng, len, 0x1234, true);
            let (transport, trailer) = s.datagram.split_at(len);
            let carried = icrc_from_bytes(trailer.try_into().unwrap());
            let ip = IcrcIp::v4_df(s.src, s.dst);
            let rounds = 200_000u32;
            let t = Instant::now();
            for _ in 0..rounds {
                black_box(icrc(black_box(&ip), s.sport, s.dport, black_box(transport)));
            }
            let one = t.elapsed().as_nanos() as f64 / f64::from(rounds);
            let t = Instant::now();
            for _ in 0..rounds {
                black_box(solve_ipv4_id(
                    s.src,
                    s.dst,
                    s.sport,
                    s.dport,
                    black_box(transport),
                    carried,
                ));
            }
            let solve = t.elapsed().as_nanos() as f64 / f64::from(rounds);
            // ID 0 + DF (softrdma's own packets): the carried ICRC is the base one.
            let own = icrc(&ip, s.sport, s.dport, transport);
            let t = Instant::now();
            for _ in 0..rounds {
                black_box(solve_ipv4_id(s.src, s.dst, s.sport, s.dport, black_box(transport), own));
            }
            let fast = t.elapsed().as_nanos() as f64 / f64::from(rounds);
            let t = Instant::now();
            for _ in 0..rounds {
                black_box(unshift_bytes(black_box(carried), black_box(len + 24)));
            }
            let unshift = t.elapsed().as_nanos() as f64 / f64::from(rounds);
            println!(
                "transport {len:5} B: icrc {one:6.1} ns, solve_ipv4_id {solve:6.1} ns (ID 0 + DF {fast:6.1} ns; unshift {unshift:5.1} ns)"
            );
        }
    }
}
