//! Devices: one per transport (`siw_<if>`, then `rxe_<if>`; `SOFTRDMA_TRANSPORTS` picks and
//! orders them) on every UP interface with an address, or exactly the ones `SOFTRDMA_CONFIG`
//! names.
//!
//! - [`netif`](list_interfaces): the host's interfaces, from `getifaddrs`.
//! - [`Config`]: the `SOFTRDMA_CONFIG` file.
//! - [`DeviceInfo`]: one device, with its [`DeviceAttr`], [`PortAttr`] and GID table
//!   ([`Gid`], [`GidType`]).
//! - [`list_devices`], [`find_device`], [`device_for_ip`]: the device list.

mod attrs;
mod config;
mod discover;
mod gid;
mod info;
mod netif;
mod sysfs;
mod transport;

pub use attrs::{limits, AtomicCap, DeviceAttr, Mtu, PortAttr, PortState};
pub use config::{Config, DeviceSpec, CONFIG_ENV};
pub use discover::{default_devices, device_for_ip, devices_from, find_device, list_devices};
pub use gid::{format_guid, gid_to_ip, Gid, GidType};
pub use info::{DeviceInfo, LOOPBACK_DISABLED_BY_CONFIG};
pub use netif::{list_interfaces, IfAddr, IfFlags, NetIf};
pub use sysfs::{sysfs_file, sysfs_files, SysfsMiss};
pub use transport::{TransportKind, TRANSPORTS_ENV};
