//! Device and port attributes, field for field like rdma-core's `struct ibv_device_attr` and
//! `struct ibv_port_attr`. Soft-iWARP values follow Linux siw (`siw_query_device` /
//! `siw_query_port`), soft-RoCE values Linux rxe (`rxe_query_device` / `rxe_query_port`),
//! except where a doc comment says otherwise.

use std::fmt;

/// Limits every soft-iWARP device reports. Same as Linux siw unless noted. Soft-RoCE devices
/// share the queue and object limits (same verbs core) and differ where [`limits::roce`] says.
pub mod limits {
    /// `vendor_id`: 0xFFFFFF, not siw's 0x626d74 ("bmt"), so perftest uses its generic path.
    pub const VENDOR_ID: u32 = 0xFF_FFFF;
    /// `vendor_part_id` (siw numbers its devices from 1; we report 0 for every device).
    pub const VENDOR_PART_ID: u32 = 0;
    /// Firmware version string (siw has none; rdma-core formats a zero version as "0.0.0").
    pub const FW_VER: &str = "0.0.0";
    /// Queue pairs per device (siw: `SIW_MAX_QP`).
    pub const MAX_QP: i32 = 100 * 1024;
    /// Work requests per send or receive queue (siw: `SIW_MAX_QP_WR`).
    pub const MAX_QP_WR: i32 = 32 * 1024;
    /// Outstanding RDMA Reads a QP may issue (ORD). siw allows 128; softrdma sizes its
    /// outbound read queue for 32.
    pub const MAX_ORD: i32 = 32;
    /// Inbound RDMA Reads a QP accepts (IRD). siw allows 128; softrdma uses 32.
    pub const MAX_IRD: i32 = 32;
    /// Scatter/gather entries per send or receive WR (siw: `SIW_MAX_SGE` = 6).
    pub const MAX_SGE: i32 = 6;
    /// SGEs per RDMA Read WR (siw: 1, an iWARP limitation).
    pub const MAX_SGE_RD: i32 = 1;
    /// Completion queues per device (siw: `SIW_MAX_CQ`).
    pub const MAX_CQ: i32 = 100 * 1024;
    /// Entries per CQ (siw: `SIW_MAX_QP_WR * 100`).
    pub const MAX_CQE: i32 = MAX_QP_WR * 100;
    /// Memory regions per device and process: 262,144 (siw: `SIW_MAX_QP * 10`, 1,024,000).
    /// Every advertised count is enforced (`quota.rs`) and a test registers all of them, so
    /// this is the older rxe's `RXE_MAX_MR` rather than siw's million.
    pub const MAX_MR: i32 = 0x4_0000;
    /// Protection domains per device (siw: `SIW_MAX_QP`).
    pub const MAX_PD: i32 = MAX_QP;
    /// Memory windows (siw: none).
    pub const MAX_MW: i32 = 0;
    /// Shared receive queues per device (siw: `SIW_MAX_QP`).
    pub const MAX_SRQ: i32 = MAX_QP;
    /// WRs per SRQ (siw: `SIW_MAX_QP_WR * 10`).
    pub const MAX_SRQ_WR: i32 = MAX_QP_WR * 10;
    /// SGEs per SRQ WR (siw: `SIW_MAX_SGE`).
    pub const MAX_SRQ_SGE: i32 = MAX_SGE;
    /// `IBV_DEVICE_MEM_MGT_EXTENSIONS` (bit 21), the only device capability siw reports.
    pub const DEVICE_CAP_MEM_MGT_EXTENSIONS: u32 = 1 << 21;
    /// `IBV_PORT_CM_SUP` port capability bit.
    pub const PORT_CAP_CM_SUP: u32 = 1 << 16;
    /// `IBV_PORT_DEVICE_MGMT_SUP` port capability bit.
    pub const PORT_CAP_DEVICE_MGMT_SUP: u32 = 1 << 19;
    /// GID table entries per port (siw: 1).
    pub const GID_TBL_LEN: i32 = 1;
    /// `phys_state` LinkUp, reported while the port is ACTIVE.
    pub const PHYS_STATE_LINK_UP: u8 = 5;
    /// `phys_state` Disabled, reported while the port is DOWN.
    pub const PHYS_STATE_DISABLED: u8 = 3;
    /// `IBV_LINK_LAYER_ETHERNET`: what the kernel reports for every iWARP port.
    pub const LINK_LAYER_ETHERNET: u8 = 2;

    /// Soft-RoCE values that differ from soft-iWARP's (Linux rxe's unless noted).
    pub mod roce {
        /// `IBV_DEVICE_UD_AV_PORT_ENFORCE` | `SYS_IMAGE_GUID` | `RC_RNR_NAK_GEN` |
        /// `MEM_MGT_EXTENSIONS`: rxe's flags without the ones for features softrdma lacks
        /// (P_Key/Q_Key violation counters, path migration, port change and active events,
        /// SRQ resize, memory windows).
        pub const DEVICE_CAP_FLAGS: u32 = (1 << 6) | (1 << 11) | (1 << 12) | super::DEVICE_CAP_MEM_MGT_EXTENSIONS;
        /// Scatter/gather entries per WR, also for RDMA Read and SRQ WRs (rxe: 32).
        pub const MAX_SGE: i32 = 32;
        /// Outstanding RDMA Reads/atomics per QP, both directions: rxe's 128
        /// (`RXE_MAX_QP_RD_ATOM`). perftest without `-R` sets `max_rd_atomic` to the peer's
        /// value, so against a kernel rxe peer a smaller limit fails its RTS.
        pub const MAX_RD_ATOM: i32 = 128;
        /// Address handles per device (rxe: `RXE_MAX_AH`, 0x7fff).
        pub const MAX_AH: i32 = 0x7fff;
        /// Memory windows per device (type 1 and 2; siw has none).
        pub const MAX_MW: i32 = super::MAX_QP;
        /// Multicast groups per device (rxe: 8192).
        pub const MAX_MCAST_GRP: i32 = 8192;
        /// QPs per multicast group (rxe: 56).
        pub const MAX_MCAST_QP_ATTACH: i32 = 56;
        /// Multicast attachments in total (rxe: 0x70000).
        pub const MAX_TOTAL_MCAST_QP_ATTACH: i32 = 0x7_0000;
        /// P_Key table length: one entry, the default P_Key 0xffff.
        pub const PKEY_TBL_LEN: u16 = 1;
        /// GID table entries at least (Linux rxe has 1024): a port with fewer addresses has
        /// empty entries, which `ibv_query_gid_ex` reports as ENODATA.
        pub const MIN_GID_TBL_LEN: usize = 16;
        /// Local CA ACK delay (rxe: 15).
        pub const LOCAL_CA_ACK_DELAY: u8 = 15;
        /// Port capabilities as rxe: CM, device management and vendor class support (no SM).
        pub const PORT_CAP_FLAGS: u32 = super::PORT_CAP_CM_SUP | super::PORT_CAP_DEVICE_MGMT_SUP | (1 << 23);
        /// Largest message: 2^31 bytes (the IBTA limit; rxe reports 8 MiB).
        pub const MAX_MSG_SZ: u32 = 1 << 31;
        /// Virtual lanes (rxe: 1).
        pub const MAX_VL_NUM: u8 = 1;
        /// Bytes a RoCEv2 packet adds to its payload, and headroom, when the port MTU is fitted
        /// into the netdev MTU: IPv4 20 + UDP 8 + BTH 12 + ICRC 4 + 40 for extension headers
        /// (RETH/AETH/DETH/ImmDt/AtomicETH) or the larger IPv6 header.
        pub const MTU_OVERHEAD: u32 = 20 + 8 + 12 + 4 + 40;
    }
}

/// `enum ibv_port_state` (without NOP and ACTIVE_DEFER, which a soft device never reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PortState {
    /// IBV_PORT_DOWN: the netdev is down or has no carrier.
    Down = 1,
    /// IBV_PORT_INIT.
    Init = 2,
    /// IBV_PORT_ARMED.
    Armed = 3,
    /// IBV_PORT_ACTIVE: the netdev is up and running.
    Active = 4,
}

impl PortState {
    /// Upper-case name as `softrdma devices` prints it: `DOWN`, `INIT`, `ARMED`, `ACTIVE`.
    pub fn as_str(self) -> &'static str {
        match self {
            PortState::Down => "DOWN",
            PortState::Init => "INIT",
            PortState::Armed => "ARMED",
            PortState::Active => "ACTIVE",
        }
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `enum ibv_mtu`: the IB path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    M256 = 1,
    /// 512 bytes.
    M512 = 2,
    /// 1024 bytes.
    M1024 = 3,
    /// 2048 bytes.
    M2048 = 4,
    /// 4096 bytes.
    M4096 = 5,
}

impl Mtu {
    /// The largest IB MTU not above `netdev_mtu`, as siw's `ib_mtu_int_to_enum(netdev->mtu)`:
    /// 65536 (lo) → 4096, 1500 → 1024, anything below 512 → 256.
    ///
    /// siw subtracts no headroom: iWARP runs over TCP, so this value only describes the port.
    /// A RoCE transport must pass the netdev MTU minus its own headers instead.
    pub fn from_bytes(netdev_mtu: u32) -> Mtu {
        match netdev_mtu {
            4096.. => Mtu::M4096,
            2048..=4095 => Mtu::M2048,
            1024..=2047 => Mtu::M1024,
            512..=1023 => Mtu::M512,
            _ => Mtu::M256,
        }
    }

    /// The largest IB MTU whose packets fit a netdev MTU of `netdev_mtu` bytes over RoCEv2:
    /// payload + [`limits::roce::MTU_OVERHEAD`] (84) ≤ `netdev_mtu`; 256 if none fits.
    /// 65536 (lo) and 9000 → 4096, 1500 → 1024.
    pub fn for_roce(netdev_mtu: u32) -> Mtu {
        Mtu::from_bytes(netdev_mtu.saturating_sub(limits::roce::MTU_OVERHEAD))
    }

    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::M256 => 256,
            Mtu::M512 => 512,
            Mtu::M1024 => 1024,
            Mtu::M2048 => 2048,
            Mtu::M4096 => 4096,
        }
    }
}

/// `enum ibv_atomic_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicCap {
    /// IBV_ATOMIC_NONE: no atomics (siw until RFC 7306 is supported).
    None = 0,
    /// IBV_ATOMIC_HCA: atomic with respect to this device only.
    Hca = 1,
    /// IBV_ATOMIC_GLOB: atomic with respect to the whole system.
    Glob = 2,
}

/// `struct ibv_device_attr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID: host-order value of the big-endian GUID bytes (see
    /// [`crate::device::format_guid`]); the C ABI stores it with `to_be()`.
    pub node_guid: u64,
    /// System image GUID: same value as `node_guid`.
    pub sys_image_guid: u64,
    /// Largest memory region in bytes.
    pub max_mr_size: u64,
    /// Supported page sizes (a bit mask; siw reports the host page size).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Maximum number of QPs.
    pub max_qp: i32,
    /// Maximum outstanding WRs on any send or receive queue.
    pub max_qp_wr: i32,
    /// `IBV_DEVICE_*` capability bits.
    pub device_cap_flags: u32,
    /// Maximum SGEs per send or receive WR.
    pub max_sge: i32,
    /// Maximum SGEs per RDMA Read WR.
    pub max_sge_rd: i32,
    /// Maximum number of CQs.
    pub max_cq: i32,
    /// Maximum entries per CQ.
    pub max_cqe: i32,
    /// Maximum number of MRs.
    pub max_mr: i32,
    /// Maximum number of PDs.
    pub max_pd: i32,
    /// Maximum outstanding RDMA Reads/atomics a QP may target at its peer (ORD).
    pub max_qp_rd_atom: i32,
    /// EE-context equivalent of `max_qp_rd_atom` (unused, 0).
    pub max_ee_rd_atom: i32,
    /// Resources for incoming RDMA Reads/atomics over the whole device.
    pub max_res_rd_atom: i32,
    /// Maximum RDMA Reads/atomics a QP accepts from its peer (IRD).
    pub max_qp_init_rd_atom: i32,
    /// EE-context equivalent of `max_qp_init_rd_atom` (unused, 0).
    pub max_ee_init_rd_atom: i32,
    /// Atomic operation support.
    pub atomic_cap: AtomicCap,
    /// Maximum EE contexts (unused, 0).
    pub max_ee: i32,
    /// Maximum RD domains (unused, 0).
    pub max_rdd: i32,
    /// Maximum memory windows.
    pub max_mw: i32,
    /// Maximum raw IPv6 QPs (0).
    pub max_raw_ipv6_qp: i32,
    /// Maximum raw Ethertype QPs (0).
    pub max_raw_ethy_qp: i32,
    /// Maximum multicast groups (0 for iWARP).
    pub max_mcast_grp: i32,
    /// Maximum QPs per multicast group (0 for iWARP).
    pub max_mcast_qp_attach: i32,
    /// Maximum multicast attachments in total (0 for iWARP).
    pub max_total_mcast_qp_attach: i32,
    /// Maximum address handles (0 for iWARP, which has no UD).
    pub max_ah: i32,
    /// Maximum FMRs (0: not supported).
    pub max_fmr: i32,
    /// Maximum remaps per FMR (0).
    pub max_map_per_fmr: i32,
    /// Maximum number of SRQs.
    pub max_srq: i32,
    /// Maximum WRs per SRQ.
    pub max_srq_wr: i32,
    /// Maximum SGEs per SRQ WR.
    pub max_srq_sge: i32,
    /// P_Key table size (0 for iWARP).
    pub max_pkeys: u16,
    /// Local CA ACK delay (0).
    pub local_ca_ack_delay: u8,
    /// Number of ports (always 1).
    pub phys_port_cnt: u8,
}

impl DeviceAttr {
    /// The attributes of a soft-iWARP device whose node GUID is `node_guid`.
    pub(crate) fn soft_iwarp(node_guid: u64) -> DeviceAttr {
        use limits::*;
        DeviceAttr {
            fw_ver: FW_VER.to_owned(),
            node_guid,
            sys_image_guid: node_guid,
            max_mr_size: u64::MAX,
            page_size_cap: host_page_size(),
            vendor_id: VENDOR_ID,
            vendor_part_id: VENDOR_PART_ID,
            hw_ver: 0,
            max_qp: MAX_QP,
            max_qp_wr: MAX_QP_WR,
            device_cap_flags: DEVICE_CAP_MEM_MGT_EXTENSIONS,
            max_sge: MAX_SGE,
            max_sge_rd: MAX_SGE_RD,
            max_cq: MAX_CQ,
            max_cqe: MAX_CQE,
            max_mr: MAX_MR,
            max_pd: MAX_PD,
            max_qp_rd_atom: MAX_ORD,
            max_ee_rd_atom: 0,
            max_res_rd_atom: MAX_QP * MAX_IRD,
            max_qp_init_rd_atom: MAX_IRD,
            max_ee_init_rd_atom: 0,
            atomic_cap: AtomicCap::None,
            max_ee: 0,
            max_rdd: 0,
            max_mw: MAX_MW,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: 0,
            max_mcast_qp_attach: 0,
            max_total_mcast_qp_attach: 0,
            max_ah: 0,
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: MAX_SRQ,
            max_srq_wr: MAX_SRQ_WR,
            max_srq_sge: MAX_SRQ_SGE,
            max_pkeys: 0,
            local_ca_ack_delay: 0,
            phys_port_cnt: 1,
        }
    }

    /// The attributes of a soft-RoCE device whose node GUID is `node_guid`: soft-iWARP's
    /// queue and object limits, and rxe's RoCE-specific values (see [`limits::roce`]):
    /// atomics (`IBV_ATOMIC_HCA`), address handles, multicast, one P_Key.
    pub(crate) fn soft_roce(node_guid: u64) -> DeviceAttr {
        use limits::roce;
        DeviceAttr {
            device_cap_flags: roce::DEVICE_CAP_FLAGS,
            max_sge: roce::MAX_SGE,
            max_sge_rd: roce::MAX_SGE,
            max_qp_rd_atom: roce::MAX_RD_ATOM,
            max_res_rd_atom: limits::MAX_QP * roce::MAX_RD_ATOM,
            max_qp_init_rd_atom: roce::MAX_RD_ATOM,
            atomic_cap: AtomicCap::Hca,
            max_mcast_grp: roce::MAX_MCAST_GRP,
            max_mcast_qp_attach: roce::MAX_MCAST_QP_ATTACH,
            max_total_mcast_qp_attach: roce::MAX_TOTAL_MCAST_QP_ATTACH,
            max_ah: roce::MAX_AH,
            max_mw: roce::MAX_MW,
            max_srq_sge: roce::MAX_SGE,
            max_pkeys: roce::PKEY_TBL_LEN,
            local_ca_ack_delay: roce::LOCAL_CA_ACK_DELAY,
            ..DeviceAttr::soft_iwarp(node_guid)
        }
    }
}

/// `struct ibv_port_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: i32,
    /// `IBV_PORT_*` capability bits.
    pub port_cap_flags: u32,
    /// Largest message in bytes.
    pub max_msg_sz: u32,
    /// Bad P_Key counter (0).
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter (0).
    pub qkey_viol_cntr: u32,
    /// P_Key table length (0 for iWARP).
    pub pkey_tbl_len: u16,
    /// Base LID (0: no IB subnet).
    pub lid: u16,
    /// Subnet manager LID (0).
    pub sm_lid: u16,
    /// LID mask control (0).
    pub lmc: u8,
    /// Virtual lanes (0).
    pub max_vl_num: u8,
    /// Subnet manager service level (0).
    pub sm_sl: u8,
    /// Subnet propagation delay (0).
    pub subnet_timeout: u8,
    /// Init type reply (0).
    pub init_type_reply: u8,
    /// Active link width (`IBV_WIDTH_*`: 1 = 1X, 2 = 4X).
    pub active_width: u8,
    /// Active link speed (`IBV_SPEED_*`: 1 = SDR, 8 = FDR10, 32 = EDR, ...).
    pub active_speed: u8,
    /// Physical state: 5 LinkUp when ACTIVE, 3 Disabled otherwise.
    pub phys_state: u8,
    /// Link layer: 2 = Ethernet, as the kernel reports for iWARP.
    pub link_layer: u8,
    /// `IBV_QPF_*` port flags (0).
    pub flags: u8,
    /// `IBV_PORT_*2` capability bits (0).
    pub port_cap_flags2: u16,
    /// Extended active speed (same value as `active_speed`).
    pub active_speed_ex: u32,
}

impl PortAttr {
    /// The attributes of a soft-iWARP port on a netdev with this MTU and link speed.
    ///
    /// Like siw: one GID, `max_msg_sz` 2^32-1, CM and device-management capability bits,
    /// both MTUs from [`Mtu::from_bytes`], LinkUp/Disabled physical state, Ethernet link
    /// layer, and all IB-only fields (LIDs, P_Keys, VLs, counters) zero. Width and speed map
    /// the Ethernet speed as the kernel's `ib_get_eth_speed` does, 1 Gb/s when unknown.
    pub(crate) fn soft_iwarp(state: PortState, netdev_mtu: u32, speed_mbps: Option<u32>) -> Self {
        use limits::*;
        let mtu = Mtu::from_bytes(netdev_mtu);
        let (active_width, active_speed) = ib_width_speed(speed_mbps.unwrap_or(1000));
        PortAttr {
            state,
            max_mtu: mtu,
            active_mtu: mtu,
            gid_tbl_len: GID_TBL_LEN,
            port_cap_flags: PORT_CAP_CM_SUP | PORT_CAP_DEVICE_MGMT_SUP,
            max_msg_sz: u32::MAX,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: 0,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 0,
            sm_sl: 0,
            subnet_timeout: 0,
            init_type_reply: 0,
            active_width,
            active_speed,
            phys_state: if state == PortState::Active {
                PHYS_STATE_LINK_UP
            } else {
                PHYS_STATE_DISABLED
            },
            link_layer: LINK_LAYER_ETHERNET,
            flags: 0,
            port_cap_flags2: 0,
            active_speed_ex: u32::from(active_speed),
        }
    }
}

impl PortAttr {
    /// The attributes of a soft-RoCE port on a netdev with this MTU and link speed, whose GID
    /// table holds `gid_count` entries.
    ///
    /// Like rxe: Ethernet link layer, max MTU 4096, active MTU from [`Mtu::for_roce`], one
    /// P_Key, one VL, LID 0, no SM capability bit; `gid_tbl_len` is the number of GIDs, at
    /// least [`limits::roce::MIN_GID_TBL_LEN`] (the rest are empty entries). State, physical
    /// state, width and speed as for soft-iWARP.
    pub(crate) fn soft_roce(state: PortState, netdev_mtu: u32, speed_mbps: Option<u32>, gid_count: usize) -> Self {
        use limits::roce;
        PortAttr {
            max_mtu: Mtu::M4096,
            active_mtu: Mtu::for_roce(netdev_mtu),
            gid_tbl_len: i32::try_from(gid_count.max(roce::MIN_GID_TBL_LEN)).unwrap_or(i32::MAX),
            port_cap_flags: roce::PORT_CAP_FLAGS,
            max_msg_sz: roce::MAX_MSG_SZ,
            pkey_tbl_len: roce::PKEY_TBL_LEN,
            max_vl_num: roce::MAX_VL_NUM,
            ..PortAttr::soft_iwarp(state, netdev_mtu, speed_mbps)
        }
    }
}

/// (IB width, IB speed) for an Ethernet speed in Mb/s, as the kernel maps a netdev that
/// does not report its lane count.
fn ib_width_speed(mbps: u32) -> (u8, u8) {
    const W1X: u8 = 1;
    const W4X: u8 = 2;
    const SDR: u8 = 1;
    const DDR: u8 = 2;
    const FDR10: u8 = 8;
    const EDR: u8 = 32;
    match mbps {
        0..=1_000 => (W1X, SDR),
        1_001..=10_000 => (W1X, FDR10),
        10_001..=20_000 => (W4X, DDR),
        20_001..=25_000 => (W1X, EDR),
        25_001..=40_000 => (W4X, FDR10),
        _ => (W4X, EDR),
    }
}

/// The host page size (`sysconf(_SC_PAGESIZE)`, which the C library answers from the auxiliary
/// vector it kept: no file is read per device open); 4096 if unknown.
fn host_page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_mapping_matches_siw() {
        assert_eq!(Mtu::from_bytes(65536), Mtu::M4096);
        assert_eq!(Mtu::from_bytes(9000), Mtu::M4096);
        assert_eq!(Mtu::from_bytes(4096), Mtu::M4096);
        assert_eq!(Mtu::from_bytes(4095), Mtu::M2048);
        assert_eq!(Mtu::from_bytes(1500), Mtu::M1024);
        assert_eq!(Mtu::from_bytes(1400), Mtu::M1024);
        assert_eq!(Mtu::from_bytes(1023), Mtu::M512);
        assert_eq!(Mtu::from_bytes(576), Mtu::M512);
        assert_eq!(Mtu::from_bytes(68), Mtu::M256);
        assert_eq!(Mtu::from_bytes(0), Mtu::M256);
        assert_eq!(Mtu::M4096 as u8, 5);
        assert_eq!(Mtu::M1024.bytes(), 1024);
    }

    #[test]
    fn port_attr_like_siw() {
        let up = PortAttr::soft_iwarp(PortState::Active, 65536, None);
        assert_eq!(up.state as u8, 4);
        assert_eq!(up.phys_state, 5);
        assert_eq!(up.active_mtu, Mtu::M4096);
        assert_eq!(up.link_layer, 2);
        assert_eq!(up.max_msg_sz, u32::MAX);
        assert_eq!(up.gid_tbl_len, 1);
        assert_eq!((up.active_width, up.active_speed), (1, 1));
        let down = PortAttr::soft_iwarp(PortState::Down, 1500, Some(10_000));
        assert_eq!(down.phys_state, 3);
        assert_eq!(down.max_mtu, Mtu::M1024);
        assert_eq!((down.active_width, down.active_speed), (1, 8));
        assert_eq!(PortState::Down.to_string(), "DOWN");
    }

    #[test]
    fn roce_mtu_leaves_room_for_the_headers() {
        assert_eq!(Mtu::for_roce(65536), Mtu::M4096);
        assert_eq!(Mtu::for_roce(9000), Mtu::M4096);
        assert_eq!(Mtu::for_roce(4096 + 84), Mtu::M4096);
        assert_eq!(Mtu::for_roce(4096 + 83), Mtu::M2048);
        assert_eq!(Mtu::for_roce(4096), Mtu::M2048);
        assert_eq!(Mtu::for_roce(1500), Mtu::M1024);
        assert_eq!(Mtu::for_roce(1024 + 84), Mtu::M1024);
        assert_eq!(Mtu::for_roce(1024 + 83), Mtu::M512);
        assert_eq!(Mtu::for_roce(0), Mtu::M256);
    }

    #[test]
    fn port_attr_like_rxe() {
        let up = PortAttr::soft_roce(PortState::Active, 1500, Some(10_000), 3);
        assert_eq!(up.state, PortState::Active);
        assert_eq!(up.phys_state, 5);
        assert_eq!(up.link_layer, 2);
        assert_eq!(up.max_mtu, Mtu::M4096);
        assert_eq!(up.active_mtu, Mtu::M1024);
        assert_eq!(up.gid_tbl_len, 16, "3 GIDs, the rest of the table empty");
        assert_eq!(up.pkey_tbl_len, 1);
        assert_eq!(up.lid, 0);
        assert_eq!(up.max_vl_num, 1);
        assert_eq!(up.port_cap_flags & (1 << 1), 0, "no SM bit");
        assert_ne!(up.port_cap_flags & limits::PORT_CAP_CM_SUP, 0);
        assert_eq!((up.active_width, up.active_speed), (1, 8));
        let down = PortAttr::soft_roce(PortState::Down, 65536, None, 0);
        assert_eq!(down.phys_state, 3);
        assert_eq!(down.active_mtu, Mtu::M4096);
        assert_eq!(down.gid_tbl_len, 16, "empty entries");
        let many = PortAttr::soft_roce(PortState::Active, 1500, None, 40);
        assert_eq!(many.gid_tbl_len, 40, "every address has an entry");
    }

    #[test]
    fn device_attr_like_rxe() {
        let a = DeviceAttr::soft_roce(0x1234);
        assert_eq!(a.vendor_id, 0xFF_FFFF);
        assert_eq!(a.vendor_part_id, 0);
        assert_eq!(a.atomic_cap, AtomicCap::Hca);
        assert_eq!(a.max_qp_rd_atom, 128, "rxe's RXE_MAX_QP_RD_ATOM");
        assert_eq!(a.max_qp_init_rd_atom, 128);
        assert_eq!(a.max_sge, 32);
        assert_eq!(a.max_sge_rd, 32);
        assert!(a.max_ah > 0 && a.max_mcast_grp > 0 && a.max_mcast_qp_attach > 0);
        assert!(a.max_total_mcast_qp_attach >= a.max_mcast_qp_attach);
        assert_eq!(a.max_pkeys, 1);
        // Memory windows work on soft-RoCE, and their count is enforced (quota.rs).
        assert_eq!(a.max_mw, limits::roce::MAX_MW);
        assert_eq!(DeviceAttr::soft_iwarp(0).max_mw, 0);
        assert_eq!(a.node_guid, 0x1234);
        assert_eq!(a.max_qp, DeviceAttr::soft_iwarp(0).max_qp);
    }

    #[test]
    fn device_attr_like_siw() {
        let a = DeviceAttr::soft_iwarp(0x1234);
        assert_eq!(a.vendor_id, 0xFF_FFFF);
        assert_eq!(a.max_sge, 6);
        assert_eq!(a.max_sge_rd, 1);
        assert_eq!(a.max_qp_rd_atom, 32);
        assert_eq!(a.max_qp_init_rd_atom, 32);
        assert_eq!(a.device_cap_flags, 1 << 21);
        assert_eq!(a.sys_image_guid, 0x1234);
        assert_eq!(a.phys_port_cnt, 1);
        assert!(a.page_size_cap.is_power_of_two());
    }
}
