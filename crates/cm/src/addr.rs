//! Address semantics: what an address means, which device serves it, and the loopback
//! contract (../shared/LOOPBACK.md R1–R6, R11, R12). Pure functions over a device list, so
//! every rule is unit-tested without touching the host.

use softrdma_verbs::device::{self, DeviceInfo};
use softrdma_verbs::{Errno, Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// True for 127.0.0.0/8, ::1 and ::ffff:127.x.y.z (R1, R13).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

/// True for 0.0.0.0, :: and ::ffff:0.0.0.0.
pub fn is_wildcard(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_unspecified() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified()),
    }
}

/// True for IPv6 link-local (fe80::/10).
pub fn is_link_local_v6(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

/// Why no device on this host can serve loopback, naming each device (R3, R14).
fn no_loopback_reason(devs: &[DeviceInfo]) -> String {
    if devs.is_empty() {
        return "no RDMA devices at all (see `softrdma devices`; SOFTRDMA_CONFIG may list none)".into();
    }
    let why: Vec<String> = devs
        .iter()
        .map(|d| {
            format!(
                "{}: {}",
                d.name,
                d.loopback_reason.clone().unwrap_or_else(|| "loopback disabled".into())
            )
        })
        .collect();
    format!("no loopback-capable RDMA device ({})", why.join("; "))
}

/// The device loopback traffic uses (R5): the loopback-capable one on `lo`, else the first
/// loopback-capable one in list order.
pub fn loopback_device(devs: &[DeviceInfo]) -> std::result::Result<DeviceInfo, String> {
    devs.iter()
        .filter(|d| d.loopback)
        .find(|d| d.is_loopback_netdev)
        .or_else(|| devs.iter().find(|d| d.loopback))
        .cloned()
        .ok_or_else(|| no_loopback_reason(devs))
}

/// The device that owns `ip` on this host, if any.
pub fn owner(devs: &[DeviceInfo], ip: IpAddr) -> Option<DeviceInfo> {
    devs.iter().find(|d| d.owns_ip(ip)).cloned()
}

/// True if `ip` is one of this host's addresses (or loopback).
pub fn is_local(devs: &[DeviceInfo], ifaces: &[device::NetIf], ip: IpAddr) -> bool {
    let ip = canonical(ip);
    is_loopback(ip) || owner(devs, ip).is_some() || ifaces.iter().any(|i| i.addrs.iter().any(|a| canonical(a.ip) == ip))
}

/// Maps ::ffff:a.b.c.d to a.b.c.d.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// The device `rdma_bind_addr(ip)` attaches (None for a wildcard), or the error (R3).
pub fn bind_device(devs: &[DeviceInfo], ifaces: &[device::NetIf], addr: SocketAddr) -> Result<Option<DeviceInfo>> {
    let ip = canonical(addr.ip());
    if is_wildcard(ip) {
        return Ok(None);
    }
    if is_link_local_v6(ip) {
        if let SocketAddr::V6(v6) = addr {
            if v6.scope_id() == 0 {
                return Err(Error::inval(format!(
                    "bind {addr}: an IPv6 link-local address needs a scope id (%ifname)"
                )));
            }
        }
    }
    if is_loopback(ip) {
        return loopback_device(devs)
            .map(Some)
            .map_err(|why| Error::new(Errno::AddrNotAvail, format!("bind {}: {why}", addr.ip())));
    }
    match owner(devs, ip) {
        Some(d) => Ok(Some(d)),
        None if is_local(devs, ifaces, ip) => Err(Error::new(
            Errno::NoDev,
            format!(
                "bind {}: the address is on this host but no RDMA device serves its interface",
                addr.ip()
            ),
        )),
        None => Err(Error::new(
            Errno::AddrNotAvail,
            format!("bind {}: the address is not on this host", addr.ip()),
        )),
    }
}

/// Outcome of address resolution for a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// ADDR_RESOLVED on this device, from this source address.
    Resolved { device: DeviceInfo, src: IpAddr },
    /// ADDR_ERROR with this status and reason (asynchronous, R6).
    AddrError { status: i32, reason: String },
}

/// Resolves `dst` (R5, R6). `route_src` finds the kernel's source address for a remote
/// destination. Synchronous errors are returned as `Err` (R5: never a timeout).
pub fn resolve(
    devs: &[DeviceInfo],
    dst: IpAddr,
    bound_src: Option<IpAddr>,
    route_src: impl FnOnce(IpAddr) -> Result<IpAddr>,
) -> Result<Resolution> {
    let dst = canonical(dst);
    if is_loopback(dst) || is_wildcard(dst) {
        let device = loopback_device(devs).map_err(|why| Error::new(Errno::NoDev, format!("resolve {dst}: {why}")))?;
        let src = match (bound_src.map(canonical), dst) {
            (Some(s), _) if !is_wildcard(s) => s,
            (_, IpAddr::V4(_)) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            (_, IpAddr::V6(_)) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        return Ok(Resolution::Resolved { device, src });
    }
    if let Some(d) = owner(devs, dst) {
        if !d.loopback {
            let why = d.loopback_reason.clone().unwrap_or_else(|| "loopback disabled".into());
            return Ok(Resolution::AddrError {
                status: -libc::ENODEV,
                reason: format!(
                    "resolve {dst}: the address is this host's, and its device {} cannot loop back ({why})",
                    d.name
                ),
            });
        }
        return Ok(Resolution::Resolved {
            src: bound_src.filter(|s| !is_wildcard(*s)).unwrap_or(dst),
            device: d,
        });
    }
    let src = match bound_src.map(canonical) {
        Some(s) if !is_wildcard(s) => s,
        _ => route_src(dst)?,
    };
    match owner(devs, src) {
        Some(device) => Ok(Resolution::Resolved { device, src }),
        None => Ok(Resolution::AddrError {
            status: -libc::ENODEV,
            reason: format!("resolve {dst}: the route leaves through {src}, and no RDMA device serves that interface"),
        }),
    }
}

/// The kernel's source address for `dst` (a connected UDP socket sends nothing).
pub fn route_source(dst: IpAddr) -> Result<IpAddr> {
    route_source_in(dst, 0)
}

/// [`route_source`] for a destination with IPv6 scope id `scope_id` (the interface of a
/// link-local one; 0 otherwise).
pub fn route_source_in(dst: IpAddr, scope_id: u32) -> Result<IpAddr> {
    let bind: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = std::net::UdpSocket::bind(bind).map_err(|e| Error::os(format!("resolve {dst}: socket"), &e))?;
    let to = match dst {
        IpAddr::V6(v6) => SocketAddr::V6(std::net::SocketAddrV6::new(v6, 9, 0, scope_id)),
        v4 => SocketAddr::new(v4, 9),
    };
    s.connect(to)
        .map_err(|e| Error::os(format!("resolve {dst}: no route"), &e))?;
    let local = s.local_addr().map_err(|e| Error::os(format!("resolve {dst}"), &e))?;
    Ok(local.ip())
}

/// R4 and R12: may a connection from `peer` to local address `local` reach a listener bound
/// to `bound`? `peer_is_local` says whether the peer address belongs to this host.
pub fn admit(bound: IpAddr, local: IpAddr, peer: IpAddr, peer_is_local: bool) -> std::result::Result<(), String> {
    let (bound, local, peer) = (canonical(bound), canonical(local), canonical(peer));
    if is_loopback(bound) && !peer_is_local {
        return Err(format!(
            "listener on {bound} accepts only connections from this host; {peer} is remote"
        ));
    }
    if (is_loopback(local) || is_loopback(peer)) && !peer_is_local {
        return Err(format!(
            "request from remote host {peer} names loopback address {}: rejected (a loopback address means the sender's own host)",
            if is_loopback(local) { local } else { peer }
        ));
    }
    Ok(())
}

/// Addresses a *remote* peer can use to reach `port` on this host (R11): never loopback,
/// never an IPv6 link-local address without its scope id, only devices whose port is up.
pub fn advertised(devs: &[DeviceInfo], port: u16) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for d in devs.iter().filter(|d| d.port_state == device::PortState::Active) {
        for a in &d.addrs {
            if is_loopback(a.ip) || is_wildcard(a.ip) || (is_link_local_v6(a.ip) && a.scope_id == 0) {
                continue;
            }
            let sa = a.socket_addr(port);
            if !out.contains(&sa) {
                out.push(sa);
            }
        }
    }
    out
}

/// [`advertised`] over this host's devices.
pub fn advertised_addresses(port: u16) -> Result<Vec<SocketAddr>> {
    Ok(advertised(&device::list_devices()?, port))
}
