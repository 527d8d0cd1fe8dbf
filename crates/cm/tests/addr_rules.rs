//! The loopback contract (../shared/LOOPBACK.md R1–R14) as pure functions: every rule that
//! `softrdma_cm::addr` decides is checked here over fake interface and device lists built with
//! `devices_from` and `Config::parse`, so nothing depends on the host's network.

use softrdma_cm::addr::{self, Resolution};
use softrdma_verbs::device::{
    devices_from, Config, DeviceInfo, IfAddr, IfFlags, NetIf, PortState, TransportKind, LOOPBACK_DISABLED_BY_CONFIG,
};
use softrdma_verbs::{Errno, Error, Result};
use std::net::{IpAddr, SocketAddr};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// An interface; addresses are `ip`, `ip/prefix` or `ip%scope`.
fn netif(name: &str, index: u32, up: bool, running: bool, addrs: &[&str]) -> NetIf {
    NetIf {
        name: name.into(),
        index,
        flags: IfFlags {
            up,
            running,
            loopback: name == "lo",
        },
        addrs: addrs
            .iter()
            .map(|a| {
                let (a, scope_id) = match a.split_once('%') {
                    Some((a, s)) => (a, s.parse().unwrap()),
                    None => (*a, 0),
                };
                let (a, prefix_len) = match a.split_once('/') {
                    Some((a, p)) => (a, p.parse().unwrap()),
                    None => (a, if a.contains(':') { 64 } else { 24 }),
                };
                IfAddr {
                    ip: ip(a),
                    prefix_len,
                    scope_id,
                }
            })
            .collect(),
        mtu: if name == "lo" { 65536 } else { 1500 },
        mac: if name == "lo" {
            [0; 6]
        } else {
            [2, 0, 0, 0, 0, index as u8]
        },
        speed_mbps: None,
    }
}

/// A host with `lo`, two Ethernet interfaces (eth1 without carrier) and one with no RDMA device.
fn host() -> Vec<NetIf> {
    vec![
        netif("lo", 1, true, true, &["127.0.0.1/8", "::1/128"]),
        netif(
            "eth0",
            2,
            true,
            true,
            &["198.18.0.1", "fd00::1", "fe80::1%2", "fe80::99"],
        ),
        netif("eth1", 3, true, false, &["198.18.1.1"]),
        netif("eth2", 4, true, true, &["198.18.2.1"]),
    ]
}

/// One `[[device]]` table per `(name, netdev, loopback)`.
fn config(devs: &[(&str, &str, bool)]) -> Config {
    let text: String = devs
        .iter()
        .map(|(name, netdev, lb)| {
            format!("[[device]]\nname = \"{name}\"\ntransport = \"iwarp\"\nnetdev = \"{netdev}\"\nloopback = {lb}\n\n")
        })
        .collect();
    Config::parse("test.toml", &text).unwrap_or_else(|e| panic!("{e}"))
}

fn devices(devs: &[(&str, &str, bool)]) -> Vec<DeviceInfo> {
    devices_from(&host(), Some(&config(devs))).unwrap_or_else(|e| panic!("{e}"))
}

fn no_route(dst: IpAddr) -> Result<IpAddr> {
    panic!("route lookup for {dst}: loopback and own addresses must not need one")
}

fn resolved(r: Result<Resolution>) -> (String, IpAddr) {
    match r {
        Ok(Resolution::Resolved { device, src }) => (device.name, src),
        other => panic!("expected ADDR_RESOLVED, got {other:?}"),
    }
}

fn addr_error(r: Result<Resolution>) -> (i32, String) {
    match r {
        Ok(Resolution::AddrError { status, reason }) => (status, reason),
        other => panic!("expected ADDR_ERROR, got {other:?}"),
    }
}

fn err<T: std::fmt::Debug>(r: Result<T>) -> Error {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e,
    }
}

const LOOPBACKS: [&str; 6] = [
    "127.0.0.1",
    "127.1.2.3",
    "127.255.255.254",
    "::1",
    "::ffff:127.0.0.1",
    "::ffff:127.9.8.7",
];

#[test]
fn r1_loopback_range_means_this_host() {
    for a in LOOPBACKS {
        assert!(addr::is_loopback(ip(a)), "{a} is loopback");
        assert!(!addr::is_wildcard(ip(a)), "{a} is not a wildcard");
    }
    for a in [
        "126.255.255.255",
        "128.0.0.1",
        "0.0.0.0",
        "::",
        "::2",
        "::ffff:10.0.0.1",
        "::127.0.0.1",
        "198.18.0.1",
    ] {
        assert!(!addr::is_loopback(ip(a)), "{a} is not loopback");
    }
    for a in ["0.0.0.0", "::", "::ffff:0.0.0.0"] {
        assert!(addr::is_wildcard(ip(a)), "{a} is a wildcard");
    }
    // "This host": valid for bind and resolve whenever a device can loop back, and always
    // served by this host's loopback device, never treated as a wildcard.
    let devs = devices_from(&host(), None).unwrap();
    for a in LOOPBACKS {
        let d = addr::bind_device(&devs, &host(), SocketAddr::new(ip(a), 0))
            .unwrap_or_else(|e| panic!("bind {a}: {e}"))
            .unwrap_or_else(|| panic!("bind {a}: a loopback address attaches a device"));
        assert_eq!(d.name, "siw_lo", "bind {a}");
        let (dev, src) = resolved(addr::resolve(&devs, ip(a), None, no_route));
        assert_eq!(dev, "siw_lo", "resolve {a}");
        assert!(addr::is_loopback(src), "resolve {a}: source {src} stays on this host");
        assert!(addr::is_local(&devs, &host(), ip(a)), "{a} is local");
    }
    assert_eq!(addr::canonical(ip("::ffff:127.1.2.3")), ip("127.1.2.3"));
    assert_eq!(addr::canonical(ip("::1")), ip("::1"));
}

#[test]
fn r2_devices_report_loopback() {
    // Default list: software devices can loop back.
    let devs = devices_from(&host(), None).unwrap();
    assert!(!devs.is_empty());
    for d in &devs {
        assert!(d.loopback, "{} defaults to loopback", d.name);
        assert_eq!(d.loopback_reason, None, "{}", d.name);
    }
    // Configuration turns it off, per device, with a reason.
    let devs = devices(&[("siw_lo", "lo", false), ("siw_eth0", "eth0", true)]);
    assert_eq!(devs[0].name, "siw_lo");
    assert!(!devs[0].loopback);
    assert_eq!(devs[0].loopback_reason.as_deref(), Some("loopback disabled by config"));
    assert_eq!(LOOPBACK_DISABLED_BY_CONFIG, "loopback disabled by config");
    assert!(devs[1].loopback);
    assert_eq!(devs[1].loopback_reason, None);
    // `loopback` omitted means true.
    let cfg = Config::parse(
        "t.toml",
        "[[device]]\nname = \"a\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\n",
    )
    .unwrap();
    let devs = devices_from(&host(), Some(&cfg)).unwrap();
    assert!(devs[0].loopback);
}

#[test]
fn r3_bind_loopback_without_capable_device_is_eaddrnotavail() {
    let ifs = host();
    let devs = devices(&[("siw_lo", "lo", false), ("siw_eth0", "eth0", false)]);
    for a in ["127.0.0.1:0", "127.0.0.1:7471", "127.3.4.5:0"] {
        let e = err(addr::bind_device(&devs, &ifs, sa(a)));
        assert_eq!(e.errno, Errno::AddrNotAvail, "bind {a}: {e}");
        let host_ip = sa(a).ip();
        assert_eq!(
            e.msg,
            format!(
                "bind {host_ip}: no loopback-capable RDMA device \
                 (siw_lo: loopback disabled by config; siw_eth0: loopback disabled by config)"
            )
        );
    }
    // Zero devices: the kernel lets this bind succeed; we refuse it and say why.
    let none = devices(&[]);
    assert!(none.is_empty());
    let e = err(addr::bind_device(&none, &ifs, sa("127.0.0.1:0")));
    assert_eq!(e.errno, Errno::AddrNotAvail, "{e}");
    assert!(e.msg.starts_with("bind 127.0.0.1: "), "{e}");
    assert!(e.msg.contains("no RDMA devices"), "{e}");
    // One capable device is enough, whichever netdev it sits on.
    let devs = devices(&[("siw_lo", "lo", false), ("siw_eth0", "eth0", true)]);
    let d = addr::bind_device(&devs, &ifs, sa("127.0.0.1:0")).unwrap().unwrap();
    assert_eq!(d.name, "siw_eth0");
    // A wildcard bind needs no device at all.
    assert_eq!(addr::bind_device(&none, &ifs, sa("0.0.0.0:0")).unwrap(), None);
    assert_eq!(addr::bind_device(&none, &ifs, sa("[::]:0")).unwrap(), None);
}

#[test]
fn bind_specific_addresses() {
    let ifs = host();
    let devs = devices_from(&ifs, None).unwrap();
    let d = addr::bind_device(&devs, &ifs, sa("198.18.0.1:0")).unwrap().unwrap();
    assert_eq!(d.name, "siw_eth0");
    let d = addr::bind_device(&devs, &ifs, sa("[::ffff:198.18.2.1]:0"))
        .unwrap()
        .unwrap();
    assert_eq!(d.name, "siw_eth2");
    // Not on this host.
    let e = err(addr::bind_device(&devs, &ifs, sa("203.0.113.9:0")));
    assert_eq!(e.errno, Errno::AddrNotAvail, "{e}");
    assert!(e.msg.contains("203.0.113.9"), "{e}");
    // On this host, but no device serves the interface.
    let only_lo = devices(&[("siw_lo", "lo", true)]);
    let e = err(addr::bind_device(&only_lo, &ifs, sa("198.18.0.1:0")));
    assert_eq!(e.errno, Errno::NoDev, "{e}");
    assert!(e.msg.contains("198.18.0.1"), "{e}");
    // Link-local without a scope id.
    let e = err(addr::bind_device(&devs, &ifs, sa("[fe80::1]:0")));
    assert_eq!(e.errno, Errno::Inval, "{e}");
    assert!(e.msg.contains("fe80::1") && e.msg.contains("scope"), "{e}");
}

#[test]
fn r5_resolve_loopback_prefers_lo_then_first_capable() {
    // `lo` wins even when listed last.
    let devs = devices(&[("a_eth0", "eth0", true), ("b_eth2", "eth2", true), ("z_lo", "lo", true)]);
    assert_eq!(addr::loopback_device(&devs).unwrap().name, "z_lo");
    let (dev, src) = resolved(addr::resolve(&devs, ip("127.0.0.1"), None, no_route));
    assert_eq!((dev.as_str(), src), ("z_lo", ip("127.0.0.1")));
    let (dev, src) = resolved(addr::resolve(&devs, ip("::1"), None, no_route));
    assert_eq!((dev.as_str(), src), ("z_lo", ip("::1")));
    // `lo` cannot loop back: the first capable device in list order.
    let devs = devices(&[
        ("a_eth0", "eth0", false),
        ("z_lo", "lo", false),
        ("c_eth1", "eth1", true),
        ("b_eth2", "eth2", true),
    ]);
    assert_eq!(addr::loopback_device(&devs).unwrap().name, "c_eth1");
    let (dev, _) = resolved(addr::resolve(&devs, ip("127.0.0.1"), None, no_route));
    assert_eq!(dev, "c_eth1");
    // No `lo` device at all.
    let devs = devices(&[("b_eth2", "eth2", true), ("a_eth0", "eth0", true)]);
    let (dev, _) = resolved(addr::resolve(&devs, ip("127.0.0.1"), None, no_route));
    assert_eq!(dev, "b_eth2");
    // A bound source is kept.
    let devs = devices_from(&host(), None).unwrap();
    let (_, src) = resolved(addr::resolve(&devs, ip("127.0.0.1"), Some(ip("127.0.0.2")), no_route));
    assert_eq!(src, ip("127.0.0.2"));
    let (_, src) = resolved(addr::resolve(&devs, ip("127.0.0.1"), Some(ip("0.0.0.0")), no_route));
    assert_eq!(src, ip("127.0.0.1"));
}

#[test]
fn r5_resolve_loopback_without_capable_device_is_immediate_enodev() {
    for devs in [devices(&[("siw_lo", "lo", false)]), devices(&[])] {
        for dst in ["127.0.0.1", "::1", "127.1.2.3"] {
            let t = std::time::Instant::now();
            let e = err(addr::resolve(&devs, ip(dst), None, no_route));
            assert!(t.elapsed() < std::time::Duration::from_millis(100));
            assert_eq!(e.errno, Errno::NoDev, "resolve {dst}: {e}");
            assert!(e.msg.starts_with(&format!("resolve {dst}: ")), "{e}");
            if devs.is_empty() {
                assert!(e.msg.contains("no RDMA devices"), "{e}");
            } else {
                assert_eq!(
                    e.msg,
                    format!("resolve {dst}: no loopback-capable RDMA device (siw_lo: loopback disabled by config)")
                );
            }
        }
    }
}

#[test]
fn r6_own_ip_without_loopback_is_addr_error_enodev() {
    let devs = devices(&[("siw_lo", "lo", true), ("siw_eth0", "eth0", false)]);
    for dst in ["198.18.0.1", "::ffff:198.18.0.1", "fd00::1"] {
        let (status, reason) = addr_error(addr::resolve(&devs, ip(dst), None, no_route));
        assert_eq!(status, -libc::ENODEV, "{dst}");
        let shown = addr::canonical(ip(dst));
        assert!(reason.contains(&shown.to_string()), "{reason}");
        assert!(reason.contains("siw_eth0"), "{reason}");
        assert!(reason.contains("loopback disabled by config"), "{reason}");
    }
    // With loopback the owner serves it, from its own address.
    let devs = devices(&[("siw_lo", "lo", true), ("siw_eth0", "eth0", true)]);
    let (dev, src) = resolved(addr::resolve(&devs, ip("198.18.0.1"), None, no_route));
    assert_eq!((dev.as_str(), src), ("siw_eth0", ip("198.18.0.1")));
    // Remote destinations use the route's source address and the device that owns it.
    let (dev, src) = resolved(addr::resolve(&devs, ip("203.0.113.7"), None, |_| Ok(ip("198.18.0.1"))));
    assert_eq!((dev.as_str(), src), ("siw_eth0", ip("198.18.0.1")));
    let (status, reason) = addr_error(addr::resolve(&devs, ip("203.0.113.7"), None, |_| Ok(ip("198.18.2.1"))));
    assert_eq!(status, -libc::ENODEV);
    assert!(
        reason.contains("203.0.113.7") && reason.contains("198.18.2.1"),
        "{reason}"
    );
}

#[test]
fn r4_r12_admit() {
    let lo = ip("127.0.0.1");
    let any = ip("0.0.0.0");
    // Listener bound to 127.0.0.1: connections from this host are admitted...
    addr::admit(lo, lo, lo, true).unwrap();
    addr::admit(lo, lo, ip("127.0.0.5"), true).unwrap();
    addr::admit(lo, lo, ip("198.18.0.1"), true).unwrap();
    // ...a remote peer never is (R4), with a reason naming the addresses.
    let why = addr::admit(lo, lo, ip("198.19.0.9"), false).unwrap_err();
    assert!(why.contains("198.19.0.9") && why.contains("127.0.0.1"), "{why}");
    // Wildcard listener: a remote peer whose request names a loopback local address is
    // refused with a reason naming it (R12)...
    let why = addr::admit(any, ip("127.0.0.1"), ip("198.19.0.9"), false).unwrap_err();
    assert!(why.contains("127.0.0.1") && why.contains("198.19.0.9"), "{why}");
    assert!(why.contains("loopback"), "{why}");
    // ...and one claiming a loopback source too.
    let why = addr::admit(any, ip("198.18.0.1"), ip("127.0.0.1"), false).unwrap_err();
    assert!(why.contains("127.0.0.1"), "{why}");
    // A remote peer to a real address is admitted (R10), local peers too.
    addr::admit(any, ip("198.18.0.1"), ip("198.19.0.9"), false).unwrap();
    addr::admit(any, lo, lo, true).unwrap();
    addr::admit(ip("198.18.0.1"), ip("198.18.0.1"), ip("198.19.0.9"), false).unwrap();
    // The same through IPv6 and IPv4-mapped addresses.
    let why = addr::admit(ip("::1"), ip("::1"), ip("fd00::9"), false).unwrap_err();
    assert!(why.contains("fd00::9"), "{why}");
    addr::admit(ip("::1"), ip("::1"), ip("::1"), true).unwrap();
    let why = addr::admit(ip("::"), ip("::ffff:127.0.0.1"), ip("::ffff:198.19.0.9"), false).unwrap_err();
    assert!(why.contains("127.0.0.1") && why.contains("198.19.0.9"), "{why}");
    addr::admit(ip("::"), ip("::ffff:198.18.0.1"), ip("::ffff:198.19.0.9"), false).unwrap();
    // is_local decides peer_is_local: own addresses, including interfaces without a device.
    let ifs = host();
    let devs = devices(&[("siw_lo", "lo", true)]);
    assert!(addr::is_local(&devs, &ifs, ip("198.18.0.1")));
    assert!(addr::is_local(&devs, &ifs, ip("::ffff:198.18.2.1")));
    assert!(addr::is_local(&devs, &ifs, ip("127.8.8.8")));
    assert!(!addr::is_local(&devs, &ifs, ip("198.19.0.9")));
}

#[test]
fn r11_advertised_never_loopback_or_unscoped_link_local() {
    let ifs = vec![
        netif("lo", 1, true, true, &["127.0.0.1/8", "::1/128"]),
        netif(
            "eth0",
            2,
            true,
            true,
            &[
                "198.18.0.1",
                "fe80::1",
                "fe80::2%2",
                "fd00::1",
                "::ffff:127.0.0.1",
                "0.0.0.0",
            ],
        ),
        netif("eth1", 3, true, false, &["198.18.1.1"]),
    ];
    let devs = devices_from(&ifs, None).unwrap();
    let adv = addr::advertised(&devs, 7471);
    assert_eq!(
        adv,
        vec![sa("198.18.0.1:7471"), sa("[fe80::2%2]:7471"), sa("[fd00::1]:7471")],
        "no loopback, no wildcard, no unscoped link-local, no DOWN port"
    );
    for a in &adv {
        assert!(!addr::is_loopback(a.ip()), "{a}");
        if let SocketAddr::V6(v6) = a {
            assert!(!addr::is_link_local_v6(a.ip()) || v6.scope_id() != 0, "{a}");
        }
    }
    assert_eq!(
        devs.iter().find(|d| d.netdev == "eth1").unwrap().port_state,
        PortState::Down
    );
    // A host with only `lo` has nothing to advertise.
    let lo_only = devices_from(&ifs[..1], None).unwrap();
    assert!(addr::advertised(&lo_only, 1).is_empty());
    // Each address once, even if two devices share a netdev.
    let twice = devices(&[("a", "eth0", true), ("b", "eth0", true)]);
    let adv = addr::advertised(&twice, 1);
    let mut dedup = adv.clone();
    dedup.dedup();
    assert_eq!(adv, dedup);
}

#[test]
fn r13_ipv6_and_mapped_same_rules() {
    let ifs = host();
    let off = devices(&[("siw_lo", "lo", false)]);
    for a in ["[::1]:0", "[::ffff:127.0.0.1]:0"] {
        let e = err(addr::bind_device(&off, &ifs, sa(a)));
        assert_eq!(e.errno, Errno::AddrNotAvail, "bind {a}: {e}");
        assert!(e.msg.contains("siw_lo: loopback disabled by config"), "{e}");
        let e = err(addr::resolve(&off, sa(a).ip(), None, no_route));
        assert_eq!(e.errno, Errno::NoDev, "resolve {a}: {e}");
    }
    let on = devices_from(&ifs, None).unwrap();
    for a in ["[::1]:0", "[::ffff:127.0.0.1]:0", "[::ffff:127.7.7.7]:0"] {
        let d = addr::bind_device(&on, &ifs, sa(a)).unwrap().unwrap();
        assert_eq!(d.name, "siw_lo", "{a}");
        let (dev, _) = resolved(addr::resolve(&on, sa(a).ip(), None, no_route));
        assert_eq!(dev, "siw_lo", "{a}");
    }
    // IPv4-mapped wildcard is a wildcard.
    assert_eq!(addr::bind_device(&off, &ifs, sa("[::ffff:0.0.0.0]:0")).unwrap(), None);
    // Own IPv6 address: the owning device (R6).
    let (dev, src) = resolved(addr::resolve(&on, ip("fd00::1"), None, no_route));
    assert_eq!((dev.as_str(), src), ("siw_eth0", ip("fd00::1")));
}

#[test]
fn r14_messages_name_address_device_reason() {
    // The example from LOOPBACK.md, verbatim.
    let devs = devices(&[("siw_eth0", "eth0", false)]);
    let e = err(addr::resolve(&devs, ip("127.0.0.1"), None, no_route));
    assert_eq!(e.errno, Errno::NoDev);
    assert_eq!(
        e.msg,
        "resolve 127.0.0.1: no loopback-capable RDMA device (siw_eth0: loopback disabled by config)"
    );
    assert!(e.to_string().contains("ENODEV"), "{e}");
    // bind: address, each device, reason.
    let devs = devices(&[("siw_lo", "lo", false), ("siw_eth2", "eth2", false)]);
    let e = err(addr::bind_device(&devs, &host(), sa("[::1]:9")));
    assert_eq!(
        e.msg,
        "bind ::1: no loopback-capable RDMA device (siw_lo: loopback disabled by config; siw_eth2: loopback disabled by config)"
    );
    assert!(e.to_string().contains("EADDRNOTAVAIL"), "{e}");
    // R6: address, device, reason.
    let devs = devices(&[("siw_eth0", "eth0", false)]);
    let (_, reason) = addr_error(addr::resolve(&devs, ip("198.18.0.1"), None, no_route));
    for part in ["198.18.0.1", "siw_eth0", "loopback disabled by config"] {
        assert!(reason.contains(part), "{reason:?} lacks {part:?}");
    }
    // A device whose loopback is off for a reason other than config still gets a reason.
    let mut devs = devices_from(&host(), None).unwrap();
    devs.retain(|d| d.netdev == "lo" && d.transport == TransportKind::Iwarp);
    devs[0].loopback = false;
    devs[0].loopback_reason = None;
    let e = err(addr::bind_device(&devs, &host(), sa("127.0.0.1:0")));
    assert!(e.msg.contains("siw_lo: "), "{e}");
}
