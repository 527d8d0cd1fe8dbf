//! Building the device list: from the host's interfaces, or from `SOFTRDMA_CONFIG`.

use std::net::IpAddr;
use std::path::Path;

use super::attrs::PortState;
use super::config::{Config, CONFIG_ENV};
use super::info::{DeviceInfo, LOOPBACK_DISABLED_BY_CONFIG};
use super::netif::{list_interfaces, NetIf};
use super::transport::{TransportKind, TRANSPORTS_ENV};
use crate::{Errno, Error, Result};

/// The devices of this host, read afresh on every call.
///
/// If `SOFTRDMA_CONFIG` is set and non-empty, exactly the devices that file lists (an
/// unreadable or invalid file is an error naming the file and line). Otherwise one device per
/// transport on every interface that is UP and has at least one address, the transports
/// being those `SOFTRDMA_TRANSPORTS` names, in its order (default: all, iWARP first); see
/// [`default_devices`].
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    match std::env::var_os(CONFIG_ENV) {
        Some(path) if !path.is_empty() => {
            let config = Config::load(Path::new(&path))?;
            devices_from(&list_interfaces()?, Some(&config))
        }
        _ => {
            let transports = TransportKind::from_env()?;
            Ok(default_devices(&list_interfaces()?, &transports))
        }
    }
}

/// Builds the device list from an interface list and an optional configuration.
///
/// Without a configuration: [`default_devices`] with every transport
/// ([`TransportKind::ALL`]).
///
/// With one: exactly its devices, in file order. A netdev that does not exist is an error
/// naming the table's line; one that is down yields port state DOWN.
///
/// In both cases the port is ACTIVE only if the netdev is UP and RUNNING.
pub fn devices_from(ifaces: &[NetIf], config: Option<&Config>) -> Result<Vec<DeviceInfo>> {
    let Some(config) = config else {
        return Ok(default_devices(ifaces, TransportKind::ALL));
    };
    let mut out = Vec::with_capacity(config.devices.len());
    for spec in &config.devices {
        let Some(netif) = ifaces.iter().find(|i| i.name == spec.netdev) else {
            let names: Vec<&str> = ifaces.iter().map(|i| i.name.as_str()).collect();
            return Err(config.error_at(
                spec,
                format_args!(
                    "device \"{}\": netdev \"{}\" does not exist on this host (interfaces: {})",
                    spec.name,
                    spec.netdev.escape_debug(),
                    names.join(", ")
                ),
            ));
        };
        let mut dev = device_on(netif, spec.transport, spec.name.clone());
        if !spec.loopback {
            dev.loopback = false;
            dev.loopback_reason = Some(LOOPBACK_DISABLED_BY_CONFIG.to_owned());
        }
        out.push(dev);
    }
    Ok(out)
}

/// The default device list: a device named `<prefix>_<ifname>` for each of `transports`, in
/// that order, on each interface that is UP and has an address (`siw_lo`, `rxe_lo`,
/// `siw_eth0`, `rxe_eth0` with every transport); loopback interfaces first, then in ifindex
/// order. Every such device has `loopback = true`; its port is ACTIVE only if the netdev is UP
/// and RUNNING.
pub fn default_devices(ifaces: &[NetIf], transports: &[TransportKind]) -> Vec<DeviceInfo> {
    let mut eligible: Vec<&NetIf> = ifaces
        .iter()
        .filter(|i| {
            let keep = i.flags.up && !i.addrs.is_empty();
            if !keep {
                tracing::debug!(ifname = %i.name, up = i.flags.up, addrs = i.addrs.len(),
                    "no RDMA device: interface is down or has no address");
            }
            keep
        })
        .collect();
    eligible.sort_by_key(|i| (!i.flags.loopback, i.index));
    eligible
        .into_iter()
        .flat_map(|i| {
            transports
                .iter()
                .map(move |&t| device_on(i, t, t.default_device_name(&i.name)))
        })
        .collect()
}

fn device_on(netif: &NetIf, transport: TransportKind, name: String) -> DeviceInfo {
    let active = netif.flags.up && netif.flags.running;
    DeviceInfo {
        name,
        transport,
        netdev: netif.name.clone(),
        ifindex: netif.index,
        loopback: true,
        addrs: netif.addrs.clone(),
        mtu: netif.mtu,
        mac: netif.mac,
        speed_mbps: netif.speed_mbps,
        port_state: if active { PortState::Active } else { PortState::Down },
        loopback_reason: None,
        is_loopback_netdev: netif.flags.loopback,
    }
}

/// The device named `name`; ENODEV, listing the available names, if there is none.
pub fn find_device(name: &str) -> Result<DeviceInfo> {
    let devices = list_devices()?;
    if let Some(d) = devices.iter().find(|d| d.name == name) {
        return Ok(d.clone());
    }
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    let mut available = if names.is_empty() {
        "there are no devices".to_owned()
    } else {
        format!("available: {}", names.join(", "))
    };
    if let Some(path) = std::env::var_os(CONFIG_ENV).filter(|p| !p.is_empty()) {
        available.push_str(&format!(
            "; the list comes from {CONFIG_ENV}={}",
            Path::new(&path).display()
        ));
    } else if let Some(t) = std::env::var_os(TRANSPORTS_ENV).filter(|t| !t.is_empty()) {
        available.push_str(&format!(
            "; {TRANSPORTS_ENV}={} limits the transports",
            t.to_string_lossy()
        ));
    }
    Err(Error::new(
        Errno::NoDev,
        format!("no RDMA device named \"{}\" ({available})", name.escape_debug()),
    ))
}

/// The first device (in list order) whose netdev owns `ip` (see [`DeviceInfo::owns_ip`]).
/// None if no device does, or if the device list cannot be read (logged at WARN).
pub fn device_for_ip(ip: IpAddr) -> Option<DeviceInfo> {
    match list_devices() {
        Ok(devices) => devices.into_iter().find(|d| d.owns_ip(ip)),
        Err(e) => {
            tracing::warn!(%ip, error = %e, "cannot list RDMA devices");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::netif::{IfAddr, IfFlags};
    use super::*;

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
                .map(|a| IfAddr {
                    ip: a.parse().unwrap(),
                    prefix_len: 24,
                    scope_id: 0,
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

    fn host() -> Vec<NetIf> {
        vec![
            netif("eth1", 3, true, false, &["198.18.0.2"]),
            netif("lo", 1, true, true, &["127.0.0.1", "::1"]),
            netif("eth0", 2, true, true, &["198.19.0.1"]),
            netif("ifb0", 4, false, false, &[]),
            netif("dummy0", 5, true, true, &[]),
        ]
    }

    #[test]
    fn default_list_is_lo_first_then_ifindex() {
        let devs = devices_from(&host(), None).unwrap();
        let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["siw_lo", "rxe_lo", "siw_eth0", "rxe_eth0", "siw_eth1", "rxe_eth1"]
        );
        assert!(devs.iter().all(|d| d.loopback && d.loopback_reason.is_none()));
        assert_eq!(devs[0].port_state, PortState::Active);
        assert!(devs[0].is_loopback_netdev);
        assert_eq!(devs[1].transport, TransportKind::Roce);
        assert_eq!(devs[4].port_state, PortState::Down, "UP without carrier");
        assert_eq!(devs[5].port_state, PortState::Down, "UP without carrier");
    }

    #[test]
    fn transports_filter_and_order_the_default_list() {
        let names =
            |t: &[TransportKind]| -> Vec<String> { default_devices(&host(), t).into_iter().map(|d| d.name).collect() };
        assert_eq!(names(&[TransportKind::Roce]), ["rxe_lo", "rxe_eth0", "rxe_eth1"]);
        assert_eq!(
            names(&[TransportKind::Roce, TransportKind::Iwarp]),
            ["rxe_lo", "siw_lo", "rxe_eth0", "siw_eth0", "rxe_eth1", "siw_eth1"]
        );
        assert!(names(&[]).is_empty());
    }

    #[test]
    fn config_accepts_roce_devices() {
        let cfg = Config::parse(
            "cfg.toml",
            "[[device]]\nname = \"rxe_lo\"\ntransport = \"roce\"\nnetdev = \"lo\"\n",
        )
        .unwrap();
        let devs = devices_from(&host(), Some(&cfg)).unwrap();
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].name, "rxe_lo");
        assert_eq!(devs[0].transport, TransportKind::Roce);
        assert_eq!(devs[0].gid_index_of("127.0.0.1".parse().unwrap()), Some(0));
    }

    #[test]
    fn config_gives_exactly_its_devices() {
        let cfg = Config::parse(
            "cfg.toml",
            "[[device]]\nname = \"x\"\ntransport = \"iwarp\"\nnetdev = \"ifb0\"\n\
             [[device]]\nname = \"y\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\nloopback = false\n",
        )
        .unwrap();
        let devs = devices_from(&host(), Some(&cfg)).unwrap();
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[0].name, "x");
        assert_eq!(devs[0].port_state, PortState::Down, "netdev down");
        assert!(devs[0].loopback);
        assert_eq!(devs[1].name, "y");
        assert!(!devs[1].loopback);
        assert_eq!(devs[1].loopback_reason.as_deref(), Some("loopback disabled by config"));
    }

    #[test]
    fn config_netdev_missing_on_host_names_the_line() {
        let cfg = Config::parse(
            "cfg.toml",
            "[[device]]\nname = \"x\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\n\n\
             [[device]]\nname = \"y\"\ntransport = \"iwarp\"\nnetdev = \"eth9\"\n",
        )
        .unwrap();
        let e = devices_from(&host(), Some(&cfg)).unwrap_err();
        assert_eq!(e.errno, Errno::Inval);
        assert_eq!(
            e.msg,
            "cfg.toml: line 6: device \"y\": netdev \"eth9\" does not exist on this host \
             (interfaces: eth1, lo, eth0, ifb0, dummy0)"
        );
    }

    #[test]
    fn empty_config_means_no_devices() {
        let cfg = Config::parse("cfg.toml", "").unwrap();
        assert!(devices_from(&host(), Some(&cfg)).unwrap().is_empty());
    }
}
