//! The sysfs tree a kernel RDMA device has under `/sys/class/infiniband/<name>`, emulated with
//! the kernel's formats: node type and GUIDs, and port 1's state, link layer, GIDs with their
//! `gid_attrs` (type and netdev) and P_Keys. The drop-in answers `ibv_read_sysfs_file` from
//! it; `softrdma run` writes it out for programs that read the files themselves (UCX takes a
//! GID's RoCE version from `ports/1/gid_attrs/types/<i>`).

use super::{format_guid, DeviceInfo, PortState, TransportKind};

/// Why a file has no contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysfsMiss {
    /// The tree has no such file (ENOENT).
    #[error("{device}: no emulated sysfs file {file}")]
    NoFile { device: String, file: String },
    /// A `gid_attrs` file of an empty GID slot: the kernel's read fails with EINVAL.
    #[error("{device}: GID {index} is empty")]
    EmptyGid { device: String, index: usize },
}

/// The contents of `file` (relative to the device directory), without the trailing newline.
pub fn sysfs_file(dev: &DeviceInfo, file: &str) -> Result<String, SysfsMiss> {
    let file = file.trim_start_matches('/');
    let no_file = || SysfsMiss::NoFile {
        device: dev.name.clone(),
        file: file.to_owned(),
    };
    let empty = |index| SysfsMiss::EmptyGid {
        device: dev.name.clone(),
        index,
    };
    let port = dev.port_attr();
    let attr = dev.attr();
    let index = |s: &str| s.parse::<usize>().ok().filter(|i| s == i.to_string());
    let gid_slot = |s: &str| index(s).filter(|&i| i < usize::try_from(port.gid_tbl_len).unwrap_or(0));
    let text = match file {
        "node_type" => match dev.transport {
            TransportKind::Iwarp => "4: RNIC".to_owned(),
            TransportKind::Roce => "1: CA".to_owned(),
        },
        "node_guid" => format_guid(attr.node_guid),
        "sys_image_guid" => format_guid(attr.sys_image_guid),
        "fw_ver" => attr.fw_ver,
        "ports/1/link_layer" => "Ethernet".to_owned(),
        "ports/1/state" => format!("{}: {}", port.state as u8, port.state),
        "ports/1/phys_state" => match port.state {
            PortState::Active => format!("{}: LinkUp", port.phys_state),
            _ => format!("{}: Disabled", port.phys_state),
        },
        "ports/1/lid" => format!("{:#x}", port.lid),
        "ports/1/sm_lid" => format!("{:#x}", port.sm_lid),
        "ports/1/lid_mask_count" => port.lmc.to_string(),
        "ports/1/cap_mask" => format!("0x{:08x}", port.port_cap_flags),
        _ => {
            if let Some(i) = file.strip_prefix("ports/1/gids/").and_then(gid_slot) {
                dev.gid(i).unwrap_or_default().to_string()
            } else if let Some(i) = file.strip_prefix("ports/1/gid_attrs/types/").and_then(gid_slot) {
                dev.gid_type(i).ok_or_else(|| empty(i))?.sysfs_str().to_owned()
            } else if let Some(i) = file.strip_prefix("ports/1/gid_attrs/ndevs/").and_then(gid_slot) {
                dev.gid(i).ok_or_else(|| empty(i))?;
                dev.netdev.clone()
            } else if let Some(i) = file.strip_prefix("ports/1/pkeys/").and_then(index) {
                if i >= usize::from(port.pkey_tbl_len) {
                    return Err(no_file());
                }
                "0xffff".to_owned()
            } else {
                return Err(no_file());
            }
        }
    };
    Ok(text)
}

/// Every file of the tree that has contents (empty GID slots' `gid_attrs` files are left out).
pub fn sysfs_files(dev: &DeviceInfo) -> Vec<String> {
    let port = dev.port_attr();
    let mut files: Vec<String> = [
        "node_type",
        "node_guid",
        "sys_image_guid",
        "fw_ver",
        "ports/1/link_layer",
        "ports/1/state",
        "ports/1/phys_state",
        "ports/1/lid",
        "ports/1/sm_lid",
        "ports/1/lid_mask_count",
        "ports/1/cap_mask",
    ]
    .map(str::to_owned)
    .to_vec();
    for i in 0..usize::try_from(port.gid_tbl_len).unwrap_or(0) {
        files.push(format!("ports/1/gids/{i}"));
        if dev.gid(i).is_some() {
            files.push(format!("ports/1/gid_attrs/types/{i}"));
            files.push(format!("ports/1/gid_attrs/ndevs/{i}"));
        }
    }
    for i in 0..usize::from(port.pkey_tbl_len) {
        files.push(format!("ports/1/pkeys/{i}"));
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::list_devices;

    #[test]
    fn every_listed_file_has_contents_and_gid_types_are_roce_v2() {
        let devs = list_devices().expect("list devices");
        let rxe = devs.iter().find(|d| d.name == "rxe_lo").expect("rxe_lo");
        let files = sysfs_files(rxe);
        for f in &files {
            assert!(sysfs_file(rxe, f).is_ok(), "{f}");
        }
        assert_eq!(sysfs_file(rxe, "ports/1/gid_attrs/types/0").as_deref(), Ok("RoCE v2"));
        assert_eq!(sysfs_file(rxe, "ports/1/gid_attrs/ndevs/0").as_deref(), Ok("lo"));
        assert!(matches!(sysfs_file(rxe, "nope"), Err(SysfsMiss::NoFile { .. })));
        let empty = (0..usize::try_from(rxe.port_attr().gid_tbl_len).unwrap()).find(|&i| rxe.gid(i).is_none());
        if let Some(i) = empty {
            assert!(!files.contains(&format!("ports/1/gid_attrs/types/{i}")));
            let got = sysfs_file(rxe, &format!("ports/1/gid_attrs/types/{i}"));
            assert!(matches!(got, Err(SysfsMiss::EmptyGid { .. })));
        }
    }
}
