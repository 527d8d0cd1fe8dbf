//! The rdma_cm (CMA) private-data header and service IDs for IP-addressed ids.
//!
//! For AF_INET/AF_INET6 ids rdma_cm puts a 36-byte header first in the
//! private data of REQ and SIDR_REQ; the consumer's data follows at byte
//! [`CMA_HDR_LEN`]. AF_IB ids send no header.
//!
//! ```text
//!  byte 0  cma_version (8) = 0
//!       1  ip_version (4: 4 or 6) | reserved (4)
//!       2  port (16): the active side's source port
//!       4  source address (16 bytes)
//!      20  destination address (16 bytes)
//! ```
//!
//! An IPv4 address is 12 zero bytes followed by the 4 address bytes (not the
//! `::ffff:a.b.c.d` mapped form). The destination port is not in the header:
//! it is the low 16 bits of the service ID ([`service_id`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::fields::{array, put16};
use crate::error::{be16, need, WireError};

/// Length of the CMA header.
pub const CMA_HDR_LEN: usize = 36;
/// The only CMA header version.
pub const CMA_VERSION: u8 = 0;
/// Linux `IB_CMA_SERVICE_ID`: the prefix shared by the TCP, UDP and IB port
/// spaces' service IDs (`0x0000_0000_01xx_pppp`).
pub const IB_CMA_SERVICE_ID: u64 = 0x0000_0000_0100_0000;
/// Linux `IB_CMA_SERVICE_ID_MASK`: the bits of a service ID compared against [`IB_CMA_SERVICE_ID`].
pub const IB_CMA_SERVICE_ID_MASK: u64 = 0xFFFF_FFFF_FF00_0000;

/// The CMA private-data header of an IP-addressed REQ or SIDR_REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// The active side's source port. (The destination port is in the service ID.)
    pub src_port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The passive side's address (what the active side resolved).
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Decodes the header at the start of `private_data`; user data begins at
    /// [`CMA_HDR_LEN`]. Errors: under 36 bytes is Truncated; a version other than
    /// [`CMA_VERSION`] or an IP version other than 4 or 6 is Malformed. Like
    /// Linux, the reserved nibble and the 12 pad bytes before an IPv4 address
    /// are not checked.
    pub fn parse(private_data: &[u8]) -> Result<CmaHeader, WireError> {
        let b = private_data;
        need("CMA header", b, CMA_HDR_LEN)?;
        if b[0] != CMA_VERSION {
            return Err(WireError::Malformed("CMA header version is not 0"));
        }
        let (src, dst) = match b[1] >> 4 {
            4 => (
                IpAddr::V4(Ipv4Addr::from(array::<4>(b, 16))),
                IpAddr::V4(Ipv4Addr::from(array::<4>(b, 32))),
            ),
            6 => (
                IpAddr::V6(Ipv6Addr::from(array::<16>(b, 4))),
                IpAddr::V6(Ipv6Addr::from(array::<16>(b, 20))),
            ),
            _ => return Err(WireError::Malformed("CMA header IP version is neither 4 nor 6")),
        };
        Ok(CmaHeader {
            src_port: be16(b, 2),
            src,
            dst,
        })
    }

    /// Encodes the header. `src` and `dst` of different families are Malformed.
    pub fn emit(&self) -> Result<[u8; CMA_HDR_LEN], WireError> {
        let mut b = [0u8; CMA_HDR_LEN];
        b[0] = CMA_VERSION;
        put16(&mut b, 2, self.src_port);
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b[1] = 4 << 4;
                b[16..20].copy_from_slice(&s.octets());
                b[32..36].copy_from_slice(&d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                b[1] = 6 << 4;
                b[4..20].copy_from_slice(&s.octets());
                b[20..36].copy_from_slice(&d.octets());
            }
            _ => return Err(WireError::Malformed("CMA header addresses of different families")),
        }
        Ok(b)
    }
}

/// rdma_cm port spaces (librdmacm `enum rdma_port_space`): bits 16..32 of an
/// IP-addressed id's service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum PortSpace {
    /// RDMA_PS_TCP: connected (RC) ids.
    Tcp = 0x0106,
    /// RDMA_PS_UDP: datagram (UD) ids.
    Udp = 0x0111,
    /// RDMA_PS_IB: any QP type.
    Ib = 0x013F,
    /// RDMA_PS_IPOIB: IPoIB-compatible UD ids.
    Ipoib = 0x0002,
}

impl PortSpace {
    /// Decodes a port-space value; `None` for values rdma_cm does not define.
    pub fn from_u16(v: u16) -> Option<PortSpace> {
        match v {
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            0x0002 => Some(PortSpace::Ipoib),
            _ => None,
        }
    }
}

/// The service ID rdma_cm uses for a port in a port space: `(ps << 16) | port`
/// (e.g. TCP port 7174 → 0x0000_0000_0106_1C06).
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    (u64::from(ps as u16) << 16) | u64::from(port)
}

/// Splits an rdma_cm service ID into port space and port; `None` unless the
/// upper 32 bits are zero and bits 16..32 name a known [`PortSpace`].
///
/// TCP, UDP and IB service IDs therefore also match the kernel's
/// [`IB_CMA_SERVICE_ID`]/[`IB_CMA_SERVICE_ID_MASK`] prefix; IPoIB ones
/// (0x0000_0000_0002_pppp) are accepted too, as Linux does.
pub fn service_id_parts(sid: u64) -> Option<(PortSpace, u16)> {
    if sid >> 32 != 0 {
        return None;
    }
    let ps = PortSpace::from_u16((sid >> 16) as u16)?;
    Some((ps, sid as u16))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    #[test]
    fn golden_ipv4_header() {
        // First 36 bytes of the REQ private data in samples/good/roce_rc_cm.pcap.
        let mut pd = hex("0040a0280000000000000000000000007f0000010000000000000000000000007f000001");
        pd.extend_from_slice(b"ulp private data");
        let h = CmaHeader::parse(&pd).unwrap();
        assert_eq!(
            h,
            CmaHeader {
                src_port: 41000,
                src: "127.0.0.1".parse().unwrap(),
                dst: "127.0.0.1".parse().unwrap(),
            }
        );
        assert_eq!(h.emit().unwrap().as_slice(), &pd[..CMA_HDR_LEN]);
        assert_eq!(&pd[CMA_HDR_LEN..], b"ulp private data");
    }

    #[test]
    fn ipv6_and_errors() {
        let h = CmaHeader {
            src_port: 0xBEEF,
            src: "fe80::1".parse().unwrap(),
            dst: "2001:db8::2".parse().unwrap(),
        };
        let b = h.emit().unwrap();
        assert_eq!(&b[..4], &[0, 0x60, 0xBE, 0xEF]);
        assert_eq!(&b[4..6], &[0xfe, 0x80]);
        assert_eq!(b[35], 2);
        assert_eq!(CmaHeader::parse(&b), Ok(h));

        // IPv4 is zero-padded, not ::ffff: mapped.
        let v4 = CmaHeader {
            src_port: 1,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
        };
        let b4 = v4.emit().unwrap();
        assert_eq!(&b4[4..16], &[0; 12]);
        assert_eq!(&b4[20..32], &[0; 12]);

        let mixed = CmaHeader { dst: h.dst, ..v4 };
        assert!(matches!(mixed.emit(), Err(WireError::Malformed(_))));
        let mut bad = b;
        bad[0] = 1;
        assert_eq!(
            CmaHeader::parse(&bad),
            Err(WireError::Malformed("CMA header version is not 0"))
        );
        for ipv in [0x00, 0x50, 0xf0] {
            let mut bad = b;
            bad[1] = ipv;
            assert!(matches!(CmaHeader::parse(&bad), Err(WireError::Malformed(_))));
        }
        // Reserved nibble and IPv4 padding are ignored.
        let mut lax = b4;
        lax[1] |= 0x0f;
        lax[14] = 0xff;
        lax[15] = 0xff;
        assert_eq!(CmaHeader::parse(&lax), Ok(v4));
        assert_eq!(
            CmaHeader::parse(&b[..35]),
            Err(WireError::Truncated {
                what: "CMA header",
                need: 36,
                have: 35
            })
        );
    }

    #[test]
    fn service_ids() {
        assert_eq!(service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(service_id(PortSpace::Udp, 1), 0x0000_0000_0111_0001);
        assert_eq!(service_id(PortSpace::Ib, 0xffff), 0x0000_0000_013f_ffff);
        assert_eq!(service_id(PortSpace::Ipoib, 2), 0x0000_0000_0002_0002);
        for ps in [PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib, PortSpace::Ipoib] {
            for port in [0, 1, 4791, u16::MAX] {
                assert_eq!(service_id_parts(service_id(ps, port)), Some((ps, port)));
            }
            assert_eq!(PortSpace::from_u16(ps as u16), Some(ps));
            if ps != PortSpace::Ipoib {
                assert_eq!(service_id(ps, 9) & IB_CMA_SERVICE_ID_MASK, IB_CMA_SERVICE_ID);
            }
        }
        // The golden REQs' service IDs.
        assert_eq!(service_id_parts(0x0106_1c06), Some((PortSpace::Tcp, 7174)));
        assert_eq!(service_id_parts(0x0106_1c07), Some((PortSpace::Tcp, 7175)));
        assert_eq!(service_id_parts(0x0000_0001_0106_0001), None);
        assert_eq!(service_id_parts(0x0200_0000_0000_0001), None);
        assert_eq!(service_id_parts(0x0107_0001), None);
        assert_eq!(service_id_parts(0), None);
        assert_eq!(PortSpace::from_u16(0x0001), None);
    }
}
