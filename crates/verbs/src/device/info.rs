//! What one device is: its netdev, addresses, port state and loopback capability.

use std::net::IpAddr;

use super::attrs::{DeviceAttr, PortAttr, PortState};
use super::gid::{eui64_guid, hw_identity, Gid, GidType};
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
            TransportKind::Roce => DeviceAttr::soft_roce(self.node_guid()),
        }
    }

    /// Attributes of port 1, the only port (`ibv_query_port`).
    pub fn port_attr(&self) -> PortAttr {
        match self.transport {
            TransportKind::Iwarp => PortAttr::soft_iwarp(self.port_state, self.mtu, self.speed_mbps),
            TransportKind::Roce => PortAttr::soft_roce(self.port_state, self.mtu, self.speed_mbps, self.gids().len()),
        }
    }

    /// The GID table of port 1, index 0 first.
    ///
    /// - iWARP: one GID derived from the hardware identity (see the `gid` module).
    /// - RoCE: the netdev's IP addresses, as the kernel's RoCE GID cache fills it: every IPv4
    ///   address as an IPv4-mapped GID (`::ffff:a.b.c.d`), then every IPv6 address, global
    ///   ones before link-local ones, each group in the order the kernel lists them. Every
    ///   entry is of type RoCE v2. A netdev without addresses has an empty table (its port
    ///   still reports one, empty, entry).
    pub fn gids(&self) -> Vec<Gid> {
        match self.transport {
            TransportKind::Iwarp => vec![Gid::from_hw_addr(self.hw_identity())],
            TransportKind::Roce => {
                let v4 = self.addrs.iter().filter(|a| a.ip.is_ipv4());
                let v6 = self.addrs.iter().filter(|a| a.ip.is_ipv6());
                let (link_local, global): (Vec<&IfAddr>, Vec<&IfAddr>) = v6.partition(|a| a.is_link_local());
                let mut out: Vec<Gid> = Vec::with_capacity(self.addrs.len());
                for a in v4.chain(global).chain(link_local) {
                    let gid = Gid::from_ip(a.ip);
                    if !out.contains(&gid) {
                        out.push(gid);
                    }
                }
                out
            }
        }
    }

    /// GID `index` of port 1 (see [`DeviceInfo::gids`]); None past the end of the table.
    pub fn gid(&self, index: usize) -> Option<Gid> {
        self.gids().get(index).copied()
    }

    /// The type of GID `index`: RoCE v2 for every soft-RoCE GID, IB for the soft-iWARP GID
    /// (as the kernel reports an iWARP port's GID); None past the end of the table.
    pub fn gid_type(&self, index: usize) -> Option<GidType> {
        self.gid(index)?;
        Some(match self.transport {
            TransportKind::Iwarp => GidType::Ib,
            TransportKind::Roce => GidType::RoceV2,
        })
    }

    /// The index of the RoCE GID that stands for `ip` (IPv4-mapped IPv6 addresses count as
    /// their IPv4 address, IPv6 scope ids are ignored). On a loopback netdev, an address it
    /// owns only through its subnet (127.0.0.2 on `lo`) maps to its first GID of the same
    /// family, the address the kernel would answer from. So does a loopback address on a
    /// loopback-capable device on another netdev (the device loopback traffic uses when there
    /// is none on `lo`, LOOPBACK.md R5): its packets go to and come from that GID, where its
    /// UDP endpoint is. None if no GID fits, and always for iWARP devices, whose GID is not an
    /// address.
    pub fn gid_index_of(&self, ip: IpAddr) -> Option<usize> {
        if self.transport != TransportKind::Roce {
            return None;
        }
        let ip = ip.to_canonical();
        let gids = self.gids();
        let want = Gid::from_ip(ip);
        if let Some(i) = gids.iter().position(|g| *g == want) {
            return Some(i);
        }
        if (self.is_loopback_netdev && self.owns_ip(ip)) || (self.loopback && ip.is_loopback()) {
            return gids
                .iter()
                .position(|g| super::gid::gid_to_ip(*g).is_ipv4() == ip.is_ipv4());
        }
        None
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

    fn rxe(addrs: &[(&str, u32)]) -> DeviceInfo {
        let mut d = lo();
        d.name = "rxe_eth0".into();
        d.transport = TransportKind::Roce;
        d.netdev = "eth0".into();
        d.mtu = 1500;
        d.is_loopback_netdev = false;
        d.addrs = addrs
            .iter()
            .map(|&(ip, scope_id)| IfAddr {
                ip: ip.parse().unwrap(),
                prefix_len: 64,
                scope_id,
            })
            .collect();
        d
    }

    #[test]
    fn roce_gid_table_is_ipv4_then_global_then_link_local_ipv6() {
        let d = rxe(&[("fe80::1", 2), ("198.18.0.1", 0), ("2001:db8::1", 0), ("198.19.0.1", 0)]);
        let gids: Vec<String> = d
            .gids()
            .into_iter()
            .map(|g| super::super::gid::gid_to_ip(g).to_string())
            .collect();
        assert_eq!(gids, ["198.18.0.1", "198.19.0.1", "2001:db8::1", "fe80::1"]);
        assert_eq!(d.gid(0).unwrap().0[10..12], [0xff, 0xff], "IPv4-mapped");
        assert_eq!(d.gid(4), None);
        assert_eq!(d.gid_type(3), Some(GidType::RoceV2));
        assert_eq!(d.gid_type(4), None);
        assert_eq!(d.port_attr().gid_tbl_len, 16, "4 GIDs and empty entries");
        assert_eq!(d.port_attr().active_mtu, super::super::Mtu::M1024);
        assert_eq!(d.attr().atomic_cap, super::super::AtomicCap::Hca);
        assert_eq!(d.gid_index_of("198.19.0.1".parse().unwrap()), Some(1));
        assert_eq!(d.gid_index_of("::ffff:198.19.0.1".parse().unwrap()), Some(1));
        assert_eq!(d.gid_index_of("fe80::1".parse().unwrap()), Some(3));
        assert_eq!(d.gid_index_of("198.18.0.2".parse().unwrap()), None);
    }

    #[test]
    fn loopback_on_a_loopback_capable_device_elsewhere_is_its_gid_of_that_family() {
        // The device 127.0.0.1 uses when none is on `lo` (R5): its packets must go to the
        // address its UDP endpoint has, not to 127.0.0.1 (issue #16: RoCE over 127.0.0.1 on
        // such a device ended in RETRY_EXC_ERR).
        let mut d = rxe(&[("fe80::1", 2), ("198.18.0.1", 0), ("2001:db8::1", 0)]);
        assert!(d.loopback);
        assert_eq!(d.gid_index_of("127.0.0.1".parse().unwrap()), Some(0));
        assert_eq!(d.gid_index_of("::ffff:127.0.0.1".parse().unwrap()), Some(0));
        assert_eq!(d.gid_index_of("::1".parse().unwrap()), Some(1));
        d.loopback = false;
        assert_eq!(d.gid_index_of("127.0.0.1".parse().unwrap()), None);
    }

    #[test]
    fn roce_on_lo_starts_with_mapped_127_0_0_1() {
        let mut d = lo();
        d.name = "rxe_lo".into();
        d.transport = TransportKind::Roce;
        assert_eq!(
            std::net::Ipv6Addr::from(d.gid(0).unwrap().0).to_string(),
            "::ffff:127.0.0.1"
        );
        assert_eq!(d.gid(1), Some(Gid::from_ip("::1".parse().unwrap())));
        assert_eq!(d.gid_index_of("127.0.0.1".parse().unwrap()), Some(0));
        assert_eq!(d.gid_index_of("127.0.0.7".parse().unwrap()), Some(0), "lo's subnet");
        assert_eq!(d.gid_index_of("::1".parse().unwrap()), Some(1));
        assert_eq!(d.port_attr().active_mtu, super::super::Mtu::M4096);
        assert_ne!(d.node_guid(), lo().node_guid(), "rxe_lo and siw_lo differ");
    }

    #[test]
    fn roce_without_addresses_has_only_empty_entries() {
        let d = rxe(&[]);
        assert!(d.gids().is_empty());
        assert_eq!(d.gid(0), None);
        assert_eq!(d.port_attr().gid_tbl_len, 16);
    }

    #[test]
    fn iwarp_gid_type_is_ib_and_has_no_ip_index() {
        let d = lo();
        assert_eq!(d.gid_type(0), Some(GidType::Ib));
        assert_eq!(d.gid_type(1), None);
        assert_eq!(d.gid_index_of("127.0.0.1".parse().unwrap()), None);
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
