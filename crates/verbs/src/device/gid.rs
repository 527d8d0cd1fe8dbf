//! GIDs and GUIDs, and how they are derived.
//!
//! A soft-RoCE device's GIDs are its netdev's IP addresses (see
//! [`DeviceInfo::gids`](super::DeviceInfo::gids)): an IPv4 address as the IPv4-mapped IPv6
//! address `::ffff:a.b.c.d`, an IPv6 address as it is ([`Gid::from_ip`], [`gid_to_ip`]),
//! every entry of type RoCE v2. The soft-RoCE driver sends to an IPv4-mapped GID over IPv4
//! and to any other GID over IPv6.
//!
//! Linux rxe's table differs in order and extent: it starts with the default GID
//! `fe80::` + the EUI-64 of the MAC (as RoCE v1 and v2) and holds a RoCE v1 twin of every
//! entry. Here the IPv4 addresses come first (so `-g 0` is an IPv4 GID, as the tools and
//! tests expect), there is no RoCE v1 entry, and a link-local GID is listed only when the
//! netdev has that address: the driver can send only from addresses the host owns (on a
//! netdev with a MAC and IPv6, the kernel's EUI-64 link-local address is the default GID).
//!
//! Every device has a 6-byte *hardware identity* `hw`:
//! - the netdev's MAC address, if it has a non-zero one;
//! - otherwise (`lo`, tun devices) a locally administered unicast MAC derived from the
//!   **device name**: the first 6 bytes of the big-endian FNV-1a-64 hash of the name, with
//!   bit 0 of the first byte cleared (unicast) and bit 1 set (locally administered).
//!
//! From it:
//! - the soft-iWARP GID (index 0, its only one) = `hw` in bytes 0..6, bytes 6..16 zero
//!   (siw's `siw_query_gid`);
//! - node GUID = sys image GUID = the EUI-64 of `hw` (siw's `addrconf_addr_eui48`: bytes
//!   `hw[0]^0x02, hw[1], hw[2], 0xff, 0xfe, hw[3], hw[4], hw[5]`), as a big-endian u64.
//!
//! Linux siw fills MAC-less devices from the first 6 bytes of the device name (older kernels)
//! or from a random MAC (since 6.6). Here every process enumerates devices itself, so the value
//! must be stable across processes (no randomness), and it must differ between two devices on
//! `lo` whose names share a 6-byte prefix (`siw_lo` and `siw_lo2`), hence the hash.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// A 16-byte GID, as `union ibv_gid` holds it (network byte order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The iWARP GID of a device with hardware identity `hw`: `hw` then ten zero bytes.
    pub fn from_hw_addr(hw: [u8; 6]) -> Gid {
        let mut raw = [0u8; 16];
        raw[..6].copy_from_slice(&hw);
        Gid(raw)
    }

    /// The RoCE v2 GID of an IP address: an IPv6 address as it is, an IPv4 address as the
    /// IPv4-mapped IPv6 address `::ffff:a.b.c.d`.
    pub fn from_ip(ip: IpAddr) -> Gid {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Gid(v6.octets())
    }

    /// True for an all-zero (empty) GID.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// True for a multicast GID: `ff00::/8`, or an IPv4-mapped IPv4 multicast address
    /// (`::ffff:224.0.0.0/100`), as the kernel's `rdma_is_multicast_addr`.
    pub fn is_multicast(&self) -> bool {
        match gid_to_ip(*self) {
            IpAddr::V4(v4) => v4.is_multicast(),
            IpAddr::V6(v6) => v6.is_multicast(),
        }
    }
}

/// The IP address a RoCE v2 GID stands for: an IPv4-mapped GID (`::ffff:a.b.c.d`) is the
/// IPv4 address `a.b.c.d`, any other GID the IPv6 address with its bytes.
pub fn gid_to_ip(gid: Gid) -> IpAddr {
    Ipv6Addr::from(gid.0).to_canonical()
}

/// The type of a GID table entry (`enum ibv_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// IB (`IBV_GID_TYPE_IB`, 0): also what an iWARP port reports.
    Ib,
    /// RoCE v1 (`IBV_GID_TYPE_ROCE_V1`, 1): GRH over Ethernet; softrdma has none.
    RoceV1,
    /// RoCE v2 (`IBV_GID_TYPE_ROCE_V2`, 2): IP/UDP encapsulation, every soft-RoCE GID.
    RoceV2,
}

impl GidType {
    /// The `enum ibv_gid_type` value: IB 0, RoCE v1 1, RoCE v2 2.
    pub fn ibv_value(self) -> u32 {
        match self {
            GidType::Ib => 0,
            GidType::RoceV1 => 1,
            GidType::RoceV2 => 2,
        }
    }

    /// The `enum ibv_gid_type_sysfs` value (`ibv_query_gid_type`): 0 for IB and RoCE v1,
    /// 1 for RoCE v2.
    pub fn sysfs_value(self) -> u32 {
        match self {
            GidType::Ib | GidType::RoceV1 => 0,
            GidType::RoceV2 => 1,
        }
    }

    /// What the kernel's `ports/N/gid_attrs/types/I` file says: `IB/RoCE v1` or `RoCE v2`.
    pub fn sysfs_str(self) -> &'static str {
        match self {
            GidType::Ib | GidType::RoceV1 => "IB/RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        }
    }

    /// A short name: `IB`, `RoCE v1`, `RoCE v2`.
    pub fn as_str(self) -> &'static str {
        match self {
            GidType::Ib => "IB",
            GidType::RoceV1 => "RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        }
    }
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `ibv_devinfo -v` style: eight groups of four lower-case hex digits separated by `:`.
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks_exact(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// Formats a GUID (host-order value of its big-endian bytes) as `ibv_devinfo` prints
/// `node_guid`: `xxxx:xxxx:xxxx:xxxx`.
pub fn format_guid(guid: u64) -> String {
    let b = guid.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// The hardware identity of a device: `mac` unless it is all zeros, else derived from
/// `device_name` (see the module documentation).
pub(crate) fn hw_identity(mac: [u8; 6], device_name: &str) -> [u8; 6] {
    if mac != [0; 6] {
        return mac;
    }
    let hash = fnv1a64(device_name.as_bytes()).to_be_bytes();
    let mut hw = [0u8; 6];
    hw.copy_from_slice(&hash[..6]);
    hw[0] = (hw[0] & !0x01) | 0x02;
    hw
}

/// EUI-64 from a 48-bit MAC, as the kernel's `addrconf_addr_eui48`, returned as the
/// host-order value of the 8 big-endian bytes.
pub(crate) fn eui64_guid(hw: [u8; 6]) -> u64 {
    u64::from_be_bytes([hw[0] ^ 0x02, hw[1], hw[2], 0xff, 0xfe, hw[3], hw[4], hw[5]])
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_display_is_ibv_devinfo_style() {
        let g = Gid::from_hw_addr([0x02, 0xfc, 0x00, 0x00, 0x00, 0x01]);
        assert_eq!(g.to_string(), "02fc:0000:0001:0000:0000:0000:0000:0000");
        let mut raw = [0u8; 16];
        raw[0] = 0xfe;
        raw[1] = 0x80;
        raw[15] = 0x01;
        assert_eq!(Gid(raw).to_string(), "fe80:0000:0000:0000:0000:0000:0000:0001");
        assert_eq!(Gid::default().to_string().len(), 39);
    }

    #[test]
    fn ip_gids_and_back() {
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        let g = Gid::from_ip(v4);
        assert_eq!(g.0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1]);
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:7f00:0001");
        assert_eq!(gid_to_ip(g), v4);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(gid_to_ip(Gid::from_ip(v6)), v6);
        assert_eq!(
            gid_to_ip(Gid::from_ip("::1".parse().unwrap())),
            "::1".parse::<IpAddr>().unwrap()
        );
        assert!(Gid::default().is_zero());
        assert!(!g.is_zero());
        assert!(!g.is_multicast());
        assert!(Gid::from_ip("239.1.2.3".parse().unwrap()).is_multicast());
        assert!(Gid::from_ip("ff0e::1".parse().unwrap()).is_multicast());
    }

    #[test]
    fn gid_type_values() {
        assert_eq!(GidType::Ib.ibv_value(), 0);
        assert_eq!(GidType::RoceV2.ibv_value(), 2);
        assert_eq!(GidType::RoceV2.sysfs_value(), 1);
        assert_eq!(GidType::RoceV1.sysfs_value(), 0);
        assert_eq!(GidType::Ib.sysfs_str(), "IB/RoCE v1");
        assert_eq!(GidType::RoceV2.to_string(), "RoCE v2");
    }

    #[test]
    fn guid_is_eui64_of_the_mac() {
        let guid = eui64_guid([0x02, 0xfc, 0x00, 0x00, 0x00, 0x01]);
        assert_eq!(guid, 0x00fc_00ff_fe00_0001);
        assert_eq!(format_guid(guid), "00fc:00ff:fe00:0001");
    }

    #[test]
    fn macless_identity_is_stable_unicast_and_local() {
        let a = hw_identity([0; 6], "siw_lo");
        assert_eq!(a, hw_identity([0; 6], "siw_lo"));
        assert_ne!(a, hw_identity([0; 6], "siw_lo2"));
        assert_eq!(a[0] & 0x03, 0x02);
        assert_ne!(a, [0; 6]);
        let mac = [0x52, 0x54, 0, 1, 2, 3];
        assert_eq!(hw_identity(mac, "siw_eth0"), mac);
    }
}
