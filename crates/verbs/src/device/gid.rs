//! GIDs and GUIDs of soft-iWARP devices, and how they are derived.
//!
//! Every device has a 6-byte *hardware identity* `hw`:
//! - the netdev's MAC address, if it has a non-zero one;
//! - otherwise (`lo`, tun devices) a locally administered unicast MAC derived from the
//!   **device name**: the first 6 bytes of the big-endian FNV-1a-64 hash of the name, with
//!   bit 0 of the first byte cleared (unicast) and bit 1 set (locally administered).
//!
//! From it:
//! - GID index 0 = `hw` in bytes 0..6, bytes 6..16 zero (siw's `siw_query_gid`);
//! - node GUID = sys image GUID = the EUI-64 of `hw` (siw's `addrconf_addr_eui48`: bytes
//!   `hw[0]^0x02, hw[1], hw[2], 0xff, 0xfe, hw[3], hw[4], hw[5]`), as a big-endian u64.
//!
//! Linux siw fills MAC-less devices from the first 6 bytes of the device name (older kernels)
//! or from a random MAC (since 6.6). Here every process enumerates devices itself, so the value
//! must be stable across processes (no randomness), and it must differ between two devices on
//! `lo` whose names share a 6-byte prefix (`siw_lo` and `siw_lo2`), hence the hash.

use std::fmt;

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
