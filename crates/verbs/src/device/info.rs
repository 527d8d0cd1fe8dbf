//! What one device is: its netdev, addresses, port state and loopback capability.

use std::net::IpAddr;

use super::attrs::{DeviceAttr, PortAttr, PortState};
use super::gid::{eui64_guid, hw_identity, Gid};
use super::netif::IfAddr;
use super::transport::TransportKind;

/// Reason reported when a configuration file sets `loopback = false`.
pub const LOOPBACK_DISABLED_BY_CONFIG: &str = "loopback disabled by config";

/// One RDMA device: a snapshot taken when the device list was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name, e.g. `siw_lo`.
    pub name: String,
    /// Wire transport.
    pub transport: TransportKind,
    /// The interface the device sits on.
    pub netdev: String,
    /// Interface index of `netdev`.
    pub ifindex: u32,
    /// LOOPBACK.md R2: whether the device can reach its own host.
    pub loopback: bool,
    /// The netdev's IP addresses. Each keeps its prefix length and, for IPv6, its scope id
    /// (non-zero for link-local), so a usable `SocketAddr` can be built with
    /// [`IfAddr::socket_addr`].
    pub addrs: Vec<IfAddr>,
    /// The netdev's MTU in bytes.
    pub mtu: u32,
    /// The netdev's MAC address; all zeros if it has none (`lo`).
    pub mac: [u8; 6],
    /// Link speed of the netdev in Mb/s, when known.
    pub speed_mbps: Option<u32>,
    /// ACTIVE when the netdev is up and running, DOWN otherwise.
    pub port_state: PortState,
    /// Why `loopback` is false, e.g. "loopback disabled by config"; None when it is true.
    pub loopback_reason: Option<String>,
    /// True if `netdev` is a loopback interface (`IFF_LOOPBACK`, i.e. `lo`).
    pub is_loopback_netdev: bool,
}

impl DeviceInfo {
    /// Device attributes (`ibv_query_device`).
    pub fn attr(&self) -> DeviceAttr {
        match self.transport {
            TransportKind::Iwarp => DeviceAttr::soft_iwarp(self.node_guid()),
        }
    }

    /// Attributes of port 1, the only port (`ibv_query_port`).
    pub fn port_attr(&self) -> PortAttr {
        match self.transport {
            TransportKind::Iwarp => PortAttr::soft_iwarp(self.port_state, self.mtu, self.speed_mbps),
        }
    }

    /// GID `index` of port 1; iWARP has only index 0 (see the `gid` module for its value).
    pub fn gid(&self, index: usize) -> Option<Gid> {
        match (self.transport, index) {
            (TransportKind::Iwarp, 0) => Some(Gid::from_hw_addr(self.hw_identity())),
            _ => None,
        }
    }

    /// Node GUID: the EUI-64 of the MAC, or of a name-derived MAC for MAC-less netdevs.
    /// Host-order value of the big-endian bytes; format it with
    /// [`format_guid`](super::format_guid).
    pub fn node_guid(&self) -> u64 {
        eui64_guid(self.hw_identity())
    }

    /// True if this device's netdev owns `ip`: one of its addresses equals it, or, on a
    /// loopback netdev, it lies in one of its subnets (as 127.0.0.0/8 does on `lo`).
    /// IPv4-mapped IPv6 addresses count as their IPv4 address; IPv6 scope ids are ignored.
    pub fn owns_ip(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.addrs
            .iter()
            .any(|a| a.ip.to_canonical() == ip || (self.is_loopback_netdev && a.subnet_contains(ip)))
    }

    fn hw_identity(&self) -> [u8; 6] {
        hw_identity(self.mac, &self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lo() -> DeviceInfo {
        DeviceInfo {
            name: "siw_lo".into(),
            transport: TransportKind::Iwarp,
            netdev: "lo".into(),
            ifindex: 1,
            loopback: true,
            addrs: vec![
                IfAddr {
                    ip: "127.0.0.1".parse().unwrap(),
                    prefix_len: 8,
                    scope_id: 0,
                },
                IfAddr {
                    ip: "::1".parse().unwrap(),
                    prefix_len: 128,
                    scope_id: 0,
                },
            ],
            mtu: 65536,
            mac: [0; 6],
            speed_mbps: None,
            port_state: PortState::Active,
            loopback_reason: None,
            is_loopback_netdev: true,
        }
    }

    #[test]
    fn lo_owns_the_loopback_range() {
        let d = lo();
        assert!(d.owns_ip("127.0.0.1".parse().unwrap()));
        assert!(d.owns_ip("127.9.9.9".parse().unwrap()));
        assert!(d.owns_ip("::1".parse().unwrap()));
        assert!(d.owns_ip("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!d.owns_ip("::2".parse().unwrap()));
        assert!(!d.owns_ip("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn gid_and_guid_of_a_mac_device() {
        let mut d = lo();
        d.name = "siw_eth0".into();
        d.mac = [0x02, 0xfc, 0, 0, 0, 1];
        d.is_loopback_netdev = false;
        assert_eq!(d.gid(0).unwrap().to_string(), "02fc:0000:0001:0000:0000:0000:0000:0000");
        assert_eq!(d.gid(1), None);
        assert_eq!(d.node_guid(), 0x00fc_00ff_fe00_0001);
        assert_eq!(d.attr().node_guid, d.node_guid());
        assert!(!d.owns_ip("127.0.0.2".parse().unwrap()));
    }

    #[test]
    fn macless_device_has_nonzero_stable_gid() {
        let d = lo();
        let gid = d.gid(0).unwrap();
        assert_ne!(gid, Gid::default());
        assert_eq!(gid, lo().gid(0).unwrap());
        assert_eq!(d.port_attr().active_mtu, super::super::Mtu::M4096);
    }
}
