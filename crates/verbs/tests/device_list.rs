//! The device list of the real host (default mode: these tests need `lo` up, as it is in any
//! normal host or `ip netns` namespace).

use std::net::IpAddr;

use softrdma_verbs::device::{
    device_for_ip, devices_from, find_device, list_devices, list_interfaces, Config, Gid, GidType, Mtu, PortState,
    TransportKind,
};
use softrdma_verbs::Errno;

/// These tests describe the default list; skip them if the caller set a config file or
/// picked transports.
fn default_mode() -> bool {
    let set = |var: &str| matches!(std::env::var_os(var), Some(v) if !v.is_empty());
    !set("SOFTRDMA_CONFIG") && !set("SOFTRDMA_TRANSPORTS")
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn siw_lo_comes_first_and_can_loop_back() {
    if !default_mode() {
        return;
    }
    let devices = list_devices().unwrap();
    let lo = &devices[0];
    assert_eq!(lo.name, "siw_lo");
    assert_eq!(lo.transport, TransportKind::Iwarp);
    assert!(lo.loopback && lo.loopback_reason.is_none());
    assert!(lo.is_loopback_netdev);
    assert_eq!(lo.port_state, PortState::Active);
    assert!(lo.addrs.iter().any(|a| a.ip == ip("127.0.0.1")));
    let port = lo.port_attr();
    assert_eq!(port.active_mtu, Mtu::from_bytes(lo.mtu));
    assert_eq!(port.gid_tbl_len, 1);
    let attr = lo.attr();
    assert_eq!(attr.node_guid, lo.node_guid());
    assert_eq!(attr.phys_port_cnt, 1);
    assert!(lo.gid(0).is_some() && lo.gid(1).is_none());
}

#[test]
fn every_default_device_is_up_with_an_address() {
    if !default_mode() {
        return;
    }
    let ifaces = list_interfaces().unwrap();
    let devices = list_devices().unwrap();
    // siw_<if> then rxe_<if> on every interface.
    for pair in devices.chunks(2) {
        let kinds: Vec<TransportKind> = pair.iter().map(|d| d.transport).collect();
        assert_eq!(kinds, TransportKind::ALL, "{pair:?}");
        assert_eq!(pair[0].netdev, pair[1].netdev);
    }
    for d in devices {
        assert_eq!(d.name, format!("{}_{}", d.transport.device_prefix(), d.netdev));
        let netif = ifaces.iter().find(|i| i.name == d.netdev).unwrap();
        assert!(netif.flags.up && !netif.addrs.is_empty());
        assert_eq!(d.ifindex, netif.index);
    }
}

#[test]
fn rxe_lo_follows_with_ip_gids() {
    if !default_mode() {
        return;
    }
    let devices = list_devices().unwrap();
    let rxe = &devices[1];
    assert_eq!(rxe.name, "rxe_lo");
    assert_eq!(rxe.transport, TransportKind::Roce);
    assert!(rxe.loopback && rxe.is_loopback_netdev);
    assert_eq!(
        rxe.gid(0),
        Some(Gid::from_ip(ip("127.0.0.1"))),
        "GID 0 is ::ffff:127.0.0.1"
    );
    assert_eq!(rxe.gid_type(0), Some(GidType::RoceV2));
    assert_eq!(rxe.gid_index_of(ip("127.0.0.1")), Some(0));
    let port = rxe.port_attr();
    assert_eq!(port.gid_tbl_len as usize, rxe.gids().len().max(16));
    assert_eq!(port.active_mtu, Mtu::for_roce(rxe.mtu));
    assert_eq!(port.link_layer, 2);
    assert_eq!(find_device("rxe_lo").unwrap().transport, TransportKind::Roce);
}

#[test]
fn find_device_by_name() {
    if !default_mode() {
        return;
    }
    assert_eq!(find_device("siw_lo").unwrap().netdev, "lo");
    let e = find_device("siw_nonexistent0").unwrap_err();
    assert_eq!(e.errno, Errno::NoDev);
    assert!(
        e.msg.contains("siw_nonexistent0") && e.msg.contains("siw_lo"),
        "{}",
        e.msg
    );
}

#[test]
fn device_for_loopback_addresses_is_siw_lo() {
    if !default_mode() {
        return;
    }
    for a in ["127.0.0.1", "127.0.0.53", "::1", "::ffff:127.0.0.1"] {
        let d = device_for_ip(ip(a)).unwrap_or_else(|| panic!("no device for {a}"));
        assert_eq!(d.name, "siw_lo", "{a}");
    }
    assert!(device_for_ip(ip("198.51.100.77")).is_none());
}

#[test]
fn config_on_the_real_host() {
    let ifaces = list_interfaces().unwrap();
    let cfg = Config::parse(
        "test.toml",
        "[[device]]\nname = \"siw_a\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\nloopback = false\n\
         [[device]]\nname = \"siw_b\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\n",
    )
    .unwrap();
    let devices = devices_from(&ifaces, Some(&cfg)).unwrap();
    assert_eq!(devices.len(), 2);
    assert!(!devices[0].loopback);
    assert!(devices[1].loopback);
    assert_ne!(devices[0].gid(0), devices[1].gid(0), "GIDs differ on a shared lo");
}
