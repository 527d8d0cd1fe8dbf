//! Host network interfaces, read with `getifaddrs(3)`.
//!
//! `getifaddrs` asks the kernel over netlink, so it always describes the network namespace
//! of the calling thread. Per-interface details that `getifaddrs` lacks (MTU, link speed) come
//! from `ioctl(SIOCGIFMTU)` and from `/sys/class/net/<if>/`. Because `/sys` may belong to
//! another namespace (`unshare -n` without remounting `/sys`), a sysfs value is only used when
//! that directory's `ifindex` matches the interface's index in our namespace.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::raw::c_char;

use crate::{Error, Result};

/// MTU assumed when neither `ioctl(SIOCGIFMTU)` nor sysfs tells it.
const FALLBACK_MTU: u32 = 1500;

/// One IP address configured on an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfAddr {
    /// The address itself.
    pub ip: IpAddr,
    /// Prefix length of the subnet (from the netmask), 0..=32 or 0..=128.
    pub prefix_len: u8,
    /// IPv6 scope id (the interface index) for link-local addresses; 0 otherwise.
    pub scope_id: u32,
}

impl IfAddr {
    /// True for IPv6 link-local (`fe80::/10`) addresses, which need a scope id to be usable.
    pub fn is_link_local(&self) -> bool {
        match self.ip {
            IpAddr::V4(v4) => v4.is_link_local(),
            IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        }
    }

    /// A socket address for this address and `port`, carrying the scope id for IPv6.
    pub fn socket_addr(&self, port: u16) -> SocketAddr {
        match self.ip {
            IpAddr::V4(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, self.scope_id)),
        }
    }

    /// True if `ip` lies in this address's subnet (`ip/prefix_len`).
    pub fn subnet_contains(&self, ip: IpAddr) -> bool {
        match (self.ip, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = prefix_mask_u32(self.prefix_len);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = prefix_mask_u128(self.prefix_len);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

fn prefix_mask_u32(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len.min(32))).unwrap_or(0)
}

fn prefix_mask_u128(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len.min(128))).unwrap_or(0)
}

/// Interface flags that matter for device discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IfFlags {
    /// `IFF_UP`: administratively up.
    pub up: bool,
    /// `IFF_RUNNING`: operationally up (carrier present).
    pub running: bool,
    /// `IFF_LOOPBACK`: a loopback interface such as `lo`.
    pub loopback: bool,
}

impl IfFlags {
    fn from_raw(raw: u32) -> IfFlags {
        let has = |flag: libc::c_int| raw & (flag as u32) != 0;
        IfFlags {
            up: has(libc::IFF_UP),
            running: has(libc::IFF_RUNNING),
            loopback: has(libc::IFF_LOOPBACK),
        }
    }
}

/// One host network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetIf {
    /// Interface name, e.g. `lo` or `eth0`.
    pub name: String,
    /// Interface index (`if_nametoindex`).
    pub index: u32,
    /// UP / RUNNING / LOOPBACK flags.
    pub flags: IfFlags,
    /// IPv4 and IPv6 addresses, in the order the kernel lists them.
    pub addrs: Vec<IfAddr>,
    /// Link MTU in bytes.
    pub mtu: u32,
    /// Hardware (MAC) address; all zeros when the interface has none (e.g. `lo`).
    pub mac: [u8; 6],
    /// Link speed in Mb/s, when the driver reports one.
    pub speed_mbps: Option<u32>,
}

impl NetIf {
    /// `lo` with 127.0.0.1, as [`list_interfaces`] reports it on Linux (index 1, MTU 65536):
    /// for tests and harnesses whose devices must not depend on the host's interfaces.
    pub fn synthetic_loopback() -> NetIf {
        NetIf {
            name: "lo".into(),
            index: 1,
            flags: IfFlags {
                up: true,
                running: true,
                loopback: true,
            },
            addrs: vec![IfAddr {
                ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                prefix_len: 8,
                scope_id: 0,
            }],
            mtu: 65536,
            mac: [0; 6],
            speed_mbps: None,
        }
    }
}

/// What `getifaddrs` reported for one interface name, before the per-interface lookups.
#[derive(Default)]
struct Raw {
    flags: u32,
    addrs: Vec<IfAddr>,
    mac: Option<[u8; 6]>,
    packet_ifindex: Option<u32>,
}

/// Lists the interfaces of the calling thread's network namespace, in ifindex order.
pub fn list_interfaces() -> Result<Vec<NetIf>> {
    let raw = read_ifaddrs()?;
    let mtu_sock = mtu_socket();
    let mut out = Vec::with_capacity(raw.len());
    for (name, r) in raw {
        let Some(index) = name_to_index(&name).or(r.packet_ifindex) else {
            tracing::debug!(ifname = %name, "interface vanished during enumeration");
            continue;
        };
        let sysfs_ok = sysfs_matches(&name, index);
        let mtu = mtu_sock
            .as_ref()
            .and_then(|fd| ioctl_mtu(fd, &name))
            .or_else(|| sysfs_ok.then(|| sysfs_u32(&name, "mtu")).flatten())
            .unwrap_or(FALLBACK_MTU);
        let mac = r
            .mac
            .or_else(|| sysfs_ok.then(|| sysfs_mac(&name)).flatten())
            .unwrap_or([0; 6]);
        let speed_mbps = sysfs_ok.then(|| sysfs_u32(&name, "speed")).flatten().filter(|&s| s > 0);
        out.push(NetIf {
            name,
            index,
            flags: IfFlags::from_raw(r.flags),
            addrs: r.addrs,
            mtu,
            mac,
            speed_mbps,
        });
    }
    out.sort_by_key(|i| i.index);
    Ok(out)
}

/// Walks the `getifaddrs` list and groups its entries by interface name.
fn read_ifaddrs() -> Result<BTreeMap<String, Raw>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success libc stores a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::os("getifaddrs", &std::io::Error::last_os_error()));
    }
    let mut map: BTreeMap<String, Raw> = BTreeMap::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned; it stays valid
        // until freeifaddrs, and we only read it.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a non-null, NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        let entry = map.entry(name).or_default();
        entry.flags = ifa.ifa_flags;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to at least a `sockaddr` header.
        let family = libc::c_int::from(unsafe { (*ifa.ifa_addr).sa_family });
        match family {
            libc::AF_INET | libc::AF_INET6 => {
                // SAFETY: the family says which sockaddr type both pointers hold.
                if let Some(a) = unsafe { ip_entry(ifa.ifa_addr, ifa.ifa_netmask) } {
                    entry.addrs.push(a);
                }
            }
            libc::AF_PACKET => {
                // SAFETY: AF_PACKET entries carry a `sockaddr_ll`.
                let ll = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_ll) };
                entry.packet_ifindex = u32::try_from(ll.sll_ifindex).ok();
                if ll.sll_halen == 6 {
                    let mut mac = [0u8; 6];
                    mac.copy_from_slice(&ll.sll_addr[..6]);
                    entry.mac = Some(mac);
                }
            }
            _ => {}
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed exactly once; no
    // reference into the list outlives this point.
    unsafe { libc::freeifaddrs(head) };
    Ok(map)
}

/// Decodes an AF_INET / AF_INET6 address and its netmask.
///
/// # Safety
/// `addr` must be non-null and point to a `sockaddr_in` or `sockaddr_in6` as its family says;
/// `mask` must be null or point to a sockaddr of the same family.
unsafe fn ip_entry(addr: *const libc::sockaddr, mask: *const libc::sockaddr) -> Option<IfAddr> {
    // SAFETY: guaranteed by the caller.
    let family = libc::c_int::from(unsafe { (*addr).sa_family });
    if family == libc::AF_INET {
        // SAFETY: the family is AF_INET, so this is a sockaddr_in (and so is a non-null mask).
        let sin = unsafe { &*(addr as *const libc::sockaddr_in) };
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        let prefix_len = if mask.is_null() {
            32
        } else {
            // SAFETY: see above.
            let m = unsafe { &*(mask as *const libc::sockaddr_in) };
            m.sin_addr.s_addr.count_ones() as u8
        };
        return Some(IfAddr {
            ip: IpAddr::V4(ip),
            prefix_len,
            scope_id: 0,
        });
    }
    // SAFETY: the family is AF_INET6, so this is a sockaddr_in6 (and so is a non-null mask).
    let sin6 = unsafe { &*(addr as *const libc::sockaddr_in6) };
    let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
    let prefix_len = if mask.is_null() {
        128
    } else {
        // SAFETY: see above.
        let m = unsafe { &*(mask as *const libc::sockaddr_in6) };
        m.sin6_addr.s6_addr.iter().map(|b| b.count_ones()).sum::<u32>() as u8
    };
    Some(IfAddr {
        ip: IpAddr::V6(ip),
        prefix_len,
        scope_id: sin6.sin6_scope_id,
    })
}

fn name_to_index(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (idx != 0).then_some(idx)
}

/// A datagram socket for `SIOCGIFMTU`, or None if the namespace refuses one.
fn mtu_socket() -> Option<OwnedFd> {
    // SAFETY: plain socket(2) call with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ioctl_mtu(fd: &OwnedFd, name: &str) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(bytes) {
        *dst = src as c_char;
    }
    // SAFETY: `fd` is an open socket and `ifr` a properly initialised ifreq that the kernel
    // fills in; it lives across the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU as _, &mut ifr as *mut libc::ifreq) };
    if rc != 0 {
        return None;
    }
    // SAFETY: after a successful SIOCGIFMTU the union holds `ifru_mtu`.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).ok().filter(|&m| m > 0)
}

fn sysfs_read(name: &str, attr: &str) -> Option<String> {
    if name.contains('/') || name.starts_with('.') {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/net/{name}/{attr}"))
        .ok()
        .map(|s| s.trim().to_owned())
}

fn sysfs_u32(name: &str, attr: &str) -> Option<u32> {
    sysfs_read(name, attr)?.parse().ok()
}

/// True if `/sys/class/net/<name>` describes the same interface as our namespace's `index`.
fn sysfs_matches(name: &str, index: u32) -> bool {
    sysfs_u32(name, "ifindex") == Some(index)
}

fn sysfs_mac(name: &str) -> Option<[u8; 6]> {
    parse_mac(&sysfs_read(name, "address")?)
}

/// Parses `aa:bb:cc:dd:ee:ff`; None for anything else (e.g. longer hardware addresses).
pub(crate) fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in mac.iter_mut() {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parsing() {
        assert_eq!(parse_mac("02:fc:00:00:00:01"), Some([0x02, 0xfc, 0, 0, 0, 1]));
        assert_eq!(parse_mac("00:00:00:00:00:00"), Some([0; 6]));
        assert_eq!(parse_mac("00:00:00:00:00"), None);
        assert_eq!(parse_mac("00:00:00:00:00:00:00"), None);
        assert_eq!(parse_mac("zz:00:00:00:00:00"), None);
    }

    #[test]
    fn subnet_membership() {
        let lo = IfAddr {
            ip: "127.0.0.1".parse().unwrap(),
            prefix_len: 8,
            scope_id: 0,
        };
        assert!(lo.subnet_contains("127.4.5.6".parse().unwrap()));
        assert!(!lo.subnet_contains("128.0.0.1".parse().unwrap()));
        assert!(!lo.subnet_contains("::1".parse().unwrap()));
        let ll = IfAddr {
            ip: "fe80::1".parse().unwrap(),
            prefix_len: 64,
            scope_id: 2,
        };
        assert!(ll.is_link_local());
        assert!(ll.subnet_contains("fe80::2".parse().unwrap()));
        assert_eq!(ll.socket_addr(7).to_string(), "[fe80::1%2]:7");
        assert_eq!(prefix_mask_u32(0), 0);
        assert_eq!(prefix_mask_u128(128), u128::MAX);
    }

    #[test]
    fn lists_lo_with_its_address() {
        let ifs = list_interfaces().expect("getifaddrs");
        let lo = ifs.iter().find(|i| i.flags.loopback);
        if let Some(lo) = lo {
            assert!(lo.index > 0);
            assert!(lo.mtu > 0);
            assert_eq!(lo.mac, [0; 6]);
        }
        let mut sorted = ifs.clone();
        sorted.sort_by_key(|i| i.index);
        assert_eq!(ifs, sorted);
    }
}
