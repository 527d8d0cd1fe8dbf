//! `ibv_resolve_eth_l2_from_gid`: the Ethernet address (and VLAN) behind a RoCE address
//! vector's destination GID, as rdma-core resolves it from the host's tables: multicast
//! GIDs map to their multicast MACs, the host's own addresses to its interface's MAC,
//! IPv6 link-local GIDs to the MAC in their interface identifier, and IPv4 destinations to
//! the neighbour (ARP) table. softrdma's RoCE runs over UDP sockets and never needs the MAC
//! itself; programs that build their own headers do.

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::abi::{ibv_ah_attr, ibv_context};
use crate::context::with_context;
use crate::error::{non_null, ret_errno, CError, CResult};

/// The MAC of a multicast, link-local or local destination, or the ARP table's answer.
fn mac_for(dst: IpAddr, local: &[IpAddr], netdev: &str) -> CResult<[u8; 6]> {
    match dst {
        IpAddr::V6(a) if a.segments()[0] & 0xff00 == 0xff00 => {
            let o = a.octets();
            Ok([0x33, 0x33, o[12], o[13], o[14], o[15]])
        }
        IpAddr::V4(a) if a.is_multicast() => {
            let o = a.octets();
            Ok([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]])
        }
        a if a.is_loopback() || local.contains(&a) => netdev_mac(netdev),
        IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80 => {
            let o = a.octets();
            if o[11] != 0xff || o[12] != 0xfe {
                return Err(CError::new(
                    libc::EINVAL,
                    format!("{a}: a link-local address without an EUI-64 identifier"),
                ));
            }
            Ok([o[8] ^ 0x02, o[9], o[10], o[13], o[14], o[15]])
        }
        IpAddr::V4(a) => arp_lookup(a),
        IpAddr::V6(a) => Err(CError::new(
            libc::EHOSTUNREACH,
            format!("{a}: no neighbour entry can be read for a global IPv6 destination"),
        )),
    }
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn netdev_mac(netdev: &str) -> CResult<[u8; 6]> {
    let path = format!("/sys/class/net/{netdev}/address");
    let text = std::fs::read_to_string(&path).map_err(|e| CError::new(libc::ENODEV, format!("{path}: {e}")))?;
    parse_mac(&text).ok_or_else(|| CError::new(libc::ENODEV, format!("{path}: not a MAC address: {}", text.trim())))
}

fn arp_lookup(a: Ipv4Addr) -> CResult<[u8; 6]> {
    let table = std::fs::read_to_string("/proc/net/arp")
        .map_err(|e| CError::new(libc::EHOSTUNREACH, format!("/proc/net/arp: {e}")))?;
    // IP address, HW type, Flags, HW address, Mask, Device; flags 0x2 = complete.
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && f[0].parse::<Ipv4Addr>().ok() == Some(a) && f[2] != "0x0")
        .and_then(|f| parse_mac(f[3]))
        .ok_or_else(|| {
            CError::new(
                libc::EHOSTUNREACH,
                format!("{a}: no neighbour entry (ping it once to resolve it)"),
            )
        })
}

fn gid_ip(raw: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(raw);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn resolve(ctx: *mut ibv_context, attr: *mut ibv_ah_attr, mac: *mut u8, _vid: *mut u16) -> CResult<()> {
    non_null(attr, "attr")?;
    non_null(mac, "eth_mac")?;
    // SAFETY: non-NULL; the caller's struct ibv_ah_attr.
    let a = unsafe { attr.read() };
    if a.is_global == 0 {
        return Err(CError::inval(
            "resolve_eth_l2_from_gid: the address vector has no GRH (is_global is 0)",
        ));
    }
    let (netdev, local, roce) = with_context(ctx, |c| {
        let dev = c.verbs().device();
        c.verbs().query_gid(a.port_num, usize::from(a.grh.sgid_index))?;
        let local: Vec<IpAddr> = (0..64).filter_map(|i| dev.gid(i)).map(|g| gid_ip(g.0)).collect();
        Ok((
            dev.netdev.clone(),
            local,
            dev.transport == softrdma_verbs::device::TransportKind::Roce,
        ))
    })?;
    if !roce {
        return Err(CError::inval("resolve_eth_l2_from_gid: not a RoCE device"));
    }
    // SAFETY: the union's raw bytes are always valid.
    let dst = gid_ip(unsafe { a.grh.dgid.raw });
    let m = mac_for(dst, &local, &netdev)?;
    // SAFETY: `eth_mac` holds ETHERNET_LL_SIZE (6) bytes (C contract). No VLAN is
    // configured on a softrdma device, so `vid` is left as it is, as rdma-core does.
    unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), mac, 6) };
    Ok(())
}

c_fn! {
    /// `int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
    /// uint8_t eth_mac[6], uint16_t *vid)`: 0 or errno.
    fn ibv_resolve_eth_l2_from_gid(context: *mut ibv_context, attr: *mut ibv_ah_attr, eth_mac: *mut u8, vid: *mut u16) -> c_int {
        ret_errno(resolve(context, attr, eth_mac, vid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_and_link_local_gids_map_to_their_macs() {
        let mc: IpAddr = "ff0e::1:2:3".parse().unwrap();
        assert_eq!(mac_for(mc, &[], "lo").unwrap(), [0x33, 0x33, 0x00, 0x02, 0x00, 0x03]);
        let mc4: IpAddr = "239.129.2.3".parse().unwrap();
        assert_eq!(mac_for(mc4, &[], "lo").unwrap(), [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]);
        let ll: IpAddr = "fe80::0211:22ff:fe33:4455".parse().unwrap();
        assert_eq!(mac_for(ll, &[], "lo").unwrap(), [0x00, 0x11, 0x22, 0x33, 0x44, 0x55]);
        assert_eq!(mac_for("127.0.0.1".parse().unwrap(), &[], "lo").unwrap(), [0; 6]);
        assert_eq!(
            parse_mac("aa:bb:cc:dd:ee:0f\n"),
            Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x0f])
        );
        assert_eq!(parse_mac("aa:bb"), None);
    }
}
