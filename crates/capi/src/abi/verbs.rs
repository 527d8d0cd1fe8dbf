//! `<infiniband/verbs.h>` (rdma-core 44): the structs the library allocates (device, context,
//! PD, MR, CQ, QP, SRQ, AH, completion channel) and the ones it fills or reads (attributes,
//! work requests, completions).

#![allow(non_snake_case)] // verbs_context keeps rdma-core's `ABI_placeholder*` names

use core::ffi::{c_char, c_int, c_uint, c_void};

use libc::{pthread_cond_t, pthread_mutex_t};

use super::{c_struct, c_union};

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `enum ibv_node_type`: `IBV_NODE_CA`.
pub const IBV_NODE_CA: c_int = 1;
/// `enum ibv_node_type`: `IBV_NODE_RNIC` (iWARP devices).
pub const IBV_NODE_RNIC: c_int = 4;
/// `enum ibv_transport_type`: `IBV_TRANSPORT_IB` (InfiniBand and RoCE).
pub const IBV_TRANSPORT_IB: c_int = 0;
/// `enum ibv_transport_type`: `IBV_TRANSPORT_IWARP`.
pub const IBV_TRANSPORT_IWARP: c_int = 1;

/// `enum ibv_gid_type`: `IBV_GID_TYPE_IB` (also what the kernel reports for iWARP ports).
pub const IBV_GID_TYPE_IB: u32 = 0;
/// `enum ibv_gid_type`: `IBV_GID_TYPE_ROCE_V1`.
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
/// `enum ibv_gid_type`: `IBV_GID_TYPE_ROCE_V2`.
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `enum ibv_gid_type_sysfs`: `IBV_GID_TYPE_SYSFS_IB_ROCE_V1` (what `ibv_query_gid_type` reports).
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;
/// `enum ibv_gid_type_sysfs`: `IBV_GID_TYPE_SYSFS_ROCE_V2`.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

/// `enum ibv_qp_init_attr_mask` (`ibv_qp_init_attr_ex.comp_mask`).
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
pub const IBV_QP_INIT_ATTR_MAX_TSO_HEADER: u32 = 1 << 3;
pub const IBV_QP_INIT_ATTR_IND_TABLE: u32 = 1 << 4;
pub const IBV_QP_INIT_ATTR_RX_HASH: u32 = 1 << 5;
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

/// `__VERBS_ABI_IS_EXTENDED`: the `abi_compat` value that makes `verbs_get_ctx()` valid.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// A function pointer slot whose signature this library does not use (always NULL here).
pub type VoidFn = Option<unsafe extern "C" fn()>;

/// `_compat_ibv_port_attr`: what the exported `ibv_query_port@IBVERBS_1.1` receives. Opaque in
/// the headers; it is the first [`COMPAT_PORT_ATTR_LEN`] bytes of [`ibv_port_attr`].
#[repr(C)]
pub struct _compat_ibv_port_attr {
    _opaque: [u8; 0],
}

/// Bytes of `struct _compat_ibv_port_attr`: `ibv_port_attr` without `port_cap_flags2`.
pub const COMPAT_PORT_ATTR_LEN: usize = core::mem::offset_of!(ibv_port_attr, port_cap_flags2);

/// Opaque `struct ibv_grh` (only passed through by pointer).
#[repr(C)]
pub struct ibv_grh {
    _opaque: [u8; 0],
}

/// Opaque `struct ibv_rwq_ind_table`.
#[repr(C)]
pub struct ibv_rwq_ind_table {
    _opaque: [u8; 0],
}

c_union! {
    registry verbs_unions;

    /// `union ibv_gid`.
    #[c = "union ibv_gid"]
    pub union ibv_gid {
        pub raw: [u8; 16],
        pub global: ibv_gid_global,
    }

    /// The anonymous union `wr` of `struct ibv_send_wr`.
    #[c = "__typeof__(((struct ibv_send_wr *)0)->wr)"]
    pub union ibv_send_wr_wr {
        pub rdma: ibv_send_wr_rdma,
        pub atomic: ibv_send_wr_atomic,
        pub ud: ibv_send_wr_ud,
    }

    /// The anonymous union `qp_type` of `struct ibv_send_wr`.
    #[c = "__typeof__(((struct ibv_send_wr *)0)->qp_type)"]
    pub union ibv_send_wr_qp_type {
        pub xrc: ibv_send_wr_xrc,
    }

    /// The unnamed union `{ bind_mw; tso; }` at the end of `struct ibv_send_wr` (no C name;
    /// checked through its members' offsets in `ibv_send_wr`).
    #[c = ""]
    pub union ibv_send_wr_bind_mw_tso {
        pub bind_mw: ibv_send_wr_bind_mw,
        pub tso: ibv_send_wr_tso,
    }
}

c_struct! {
    registry verbs_structs;

    /// `union ibv_gid`'s `global` member.
    #[c = "__typeof__(((union ibv_gid *)0)->global)"]
    #[derive(Clone, Copy)]
    pub struct ibv_gid_global {
        pub subnet_prefix: u64,
        pub interface_id: u64,
    }

    /// `struct ibv_gid_entry` (`ibv_query_gid_ex`).
    #[c = "struct ibv_gid_entry"]
    pub struct ibv_gid_entry {
        pub gid: ibv_gid,
        pub gid_index: u32,
        pub port_num: u32,
        /// `enum ibv_gid_type`.
        pub gid_type: u32,
        pub ndev_ifindex: u32,
    }

    /// `struct _ibv_device_ops` (obsolete, always NULL).
    #[c = "struct _ibv_device_ops"]
    pub struct _ibv_device_ops {
        pub _dummy1: VoidFn,
        pub _dummy2: VoidFn,
    }

    /// `struct ibv_device`: owned by the library, one per device for the process lifetime.
    #[c = "struct ibv_device"]
    pub struct ibv_device {
        pub _ops: _ibv_device_ops,
        /// `enum ibv_node_type`.
        pub node_type: c_int,
        /// `enum ibv_transport_type`.
        pub transport_type: c_int,
        pub name: [c_char; IBV_SYSFS_NAME_MAX],
        pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
        pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
        pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
    }

    /// `struct ibv_context_ops`: the slots the headers' inline functions call. Only
    /// `poll_cq`, `req_notify_cq`, `post_srq_recv`, `post_send` and `post_recv` are reached
    /// without a NULL check; `alloc_mw`/`bind_mw`/`dealloc_mw` are checked (NULL =
    /// EOPNOTSUPP); the `_compat_*` slots are never called by current binaries.
    #[c = "struct ibv_context_ops"]
    pub struct ibv_context_ops {
        pub _compat_query_device: VoidFn,
        pub _compat_query_port: VoidFn,
        pub _compat_alloc_pd: VoidFn,
        pub _compat_dealloc_pd: VoidFn,
        pub _compat_reg_mr: VoidFn,
        pub _compat_rereg_mr: VoidFn,
        pub _compat_dereg_mr: VoidFn,
        pub alloc_mw: Option<unsafe extern "C" fn(pd: *mut ibv_pd, type_: c_int) -> *mut ibv_mw>,
        pub bind_mw: Option<unsafe extern "C" fn(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int>,
        pub dealloc_mw: Option<unsafe extern "C" fn(mw: *mut ibv_mw) -> c_int>,
        pub _compat_create_cq: VoidFn,
        pub poll_cq: Option<unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int>,
        pub req_notify_cq: Option<unsafe extern "C" fn(cq: *mut ibv_cq, solicited_only: c_int) -> c_int>,
        pub _compat_cq_event: VoidFn,
        pub _compat_resize_cq: VoidFn,
        pub _compat_destroy_cq: VoidFn,
        pub _compat_create_srq: VoidFn,
        pub _compat_modify_srq: VoidFn,
        pub _compat_query_srq: VoidFn,
        pub _compat_destroy_srq: VoidFn,
        pub post_srq_recv: Option<
            unsafe extern "C" fn(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int,
        >,
        pub _compat_create_qp: VoidFn,
        pub _compat_query_qp: VoidFn,
        pub _compat_modify_qp: VoidFn,
        pub _compat_destroy_qp: VoidFn,
        pub post_send: Option<
            unsafe extern "C" fn(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int,
        >,
        pub post_recv: Option<
            unsafe extern "C" fn(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int,
        >,
        pub _compat_create_ah: VoidFn,
        pub _compat_destroy_ah: VoidFn,
        pub _compat_attach_mcast: VoidFn,
        pub _compat_detach_mcast: VoidFn,
        pub _compat_async_event: VoidFn,
    }

    /// `struct ibv_context`.
    #[c = "struct ibv_context"]
    pub struct ibv_context {
        pub device: *mut ibv_device,
        pub ops: ibv_context_ops,
        pub cmd_fd: c_int,
        pub async_fd: c_int,
        pub num_comp_vectors: c_int,
        pub mutex: pthread_mutex_t,
        /// [`VERBS_ABI_IS_EXTENDED`] when a [`verbs_context`] surrounds this context.
        pub abi_compat: *mut c_void,
    }

    /// `struct verbs_context`: the extended ops, at negative offsets from `context` (its last
    /// field). An op is usable by the inline functions only if `sz >= 648 - offsetof(op)` and
    /// the slot is non-NULL; a NULL slot makes them fall back or fail with EOPNOTSUPP.
    #[c = "struct verbs_context"]
    pub struct verbs_context {
        pub query_port: Option<
            unsafe extern "C" fn(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr, len: usize) -> c_int,
        >,
        pub advise_mr: Option<
            unsafe extern "C" fn(pd: *mut ibv_pd, advice: u32, flags: u32, sg_list: *mut ibv_sge, num_sge: u32) -> c_int,
        >,
        pub alloc_null_mr: Option<unsafe extern "C" fn(pd: *mut ibv_pd) -> *mut ibv_mr>,
        pub read_counters: VoidFn,
        pub attach_counters_point_flow: VoidFn,
        pub create_counters: VoidFn,
        pub destroy_counters: VoidFn,
        pub reg_dm_mr: VoidFn,
        pub alloc_dm: VoidFn,
        pub free_dm: VoidFn,
        pub modify_flow_action_esp: VoidFn,
        pub destroy_flow_action: VoidFn,
        pub create_flow_action_esp: VoidFn,
        pub modify_qp_rate_limit: VoidFn,
        pub alloc_parent_domain: VoidFn,
        pub dealloc_td: VoidFn,
        pub alloc_td: VoidFn,
        pub modify_cq: VoidFn,
        pub post_srq_ops: VoidFn,
        pub destroy_rwq_ind_table: VoidFn,
        pub create_rwq_ind_table: VoidFn,
        pub destroy_wq: VoidFn,
        pub modify_wq: VoidFn,
        pub create_wq: VoidFn,
        pub query_rt_values: VoidFn,
        pub create_cq_ex: Option<
            unsafe extern "C" fn(ctx: *mut ibv_context, attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex,
        >,
        pub r#priv: *mut c_void,
        pub query_device_ex: Option<
            unsafe extern "C" fn(
                ctx: *mut ibv_context,
                input: *const ibv_query_device_ex_input,
                attr: *mut ibv_device_attr_ex,
                attr_size: usize,
            ) -> c_int,
        >,
        pub ibv_destroy_flow: VoidFn,
        pub ABI_placeholder2: VoidFn,
        pub ibv_create_flow: VoidFn,
        pub ABI_placeholder1: VoidFn,
        pub open_qp: VoidFn,
        pub create_qp_ex: Option<
            unsafe extern "C" fn(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp,
        >,
        pub get_srq_num: Option<unsafe extern "C" fn(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int>,
        pub create_srq_ex: Option<
            unsafe extern "C" fn(ctx: *mut ibv_context, attr: *mut ibv_srq_init_attr_ex) -> *mut ibv_srq,
        >,
        pub open_xrcd: VoidFn,
        pub close_xrcd: VoidFn,
        pub _ABI_placeholder3: u64,
        /// Bytes of this struct the library provides, counted back from `context`.
        pub sz: usize,
        pub context: ibv_context,
    }

    /// `struct ibv_device_attr` (`ibv_query_device`).
    #[c = "struct ibv_device_attr"]
    pub struct ibv_device_attr {
        pub fw_ver: [c_char; 64],
        /// Big-endian.
        pub node_guid: u64,
        /// Big-endian.
        pub sys_image_guid: u64,
        pub max_mr_size: u64,
        pub page_size_cap: u64,
        pub vendor_id: u32,
        pub vendor_part_id: u32,
        pub hw_ver: u32,
        pub max_qp: c_int,
        pub max_qp_wr: c_int,
        pub device_cap_flags: c_uint,
        pub max_sge: c_int,
        pub max_sge_rd: c_int,
        pub max_cq: c_int,
        pub max_cqe: c_int,
        pub max_mr: c_int,
        pub max_pd: c_int,
        pub max_qp_rd_atom: c_int,
        pub max_ee_rd_atom: c_int,
        pub max_res_rd_atom: c_int,
        pub max_qp_init_rd_atom: c_int,
        pub max_ee_init_rd_atom: c_int,
        /// `enum ibv_atomic_cap`.
        pub atomic_cap: u32,
        pub max_ee: c_int,
        pub max_rdd: c_int,
        pub max_mw: c_int,
        pub max_raw_ipv6_qp: c_int,
        pub max_raw_ethy_qp: c_int,
        pub max_mcast_grp: c_int,
        pub max_mcast_qp_attach: c_int,
        pub max_total_mcast_qp_attach: c_int,
        pub max_ah: c_int,
        pub max_fmr: c_int,
        pub max_map_per_fmr: c_int,
        pub max_srq: c_int,
        pub max_srq_wr: c_int,
        pub max_srq_sge: c_int,
        pub max_pkeys: u16,
        pub local_ca_ack_delay: u8,
        pub phys_port_cnt: u8,
    }

    /// `struct ibv_query_device_ex_input`.
    #[c = "struct ibv_query_device_ex_input"]
    pub struct ibv_query_device_ex_input {
        pub comp_mask: u32,
    }

    /// `ibv_odp_caps.per_transport_caps`.
    #[c = "__typeof__(((struct ibv_odp_caps *)0)->per_transport_caps)"]
    pub struct ibv_odp_caps_per_transport {
        pub rc_odp_caps: u32,
        pub uc_odp_caps: u32,
        pub ud_odp_caps: u32,
    }

    /// `struct ibv_odp_caps`.
    #[c = "struct ibv_odp_caps"]
    pub struct ibv_odp_caps {
        pub general_caps: u64,
        pub per_transport_caps: ibv_odp_caps_per_transport,
    }

    /// `struct ibv_tso_caps`.
    #[c = "struct ibv_tso_caps"]
    pub struct ibv_tso_caps {
        pub max_tso: u32,
        pub supported_qpts: u32,
    }

    /// `struct ibv_rss_caps`.
    #[c = "struct ibv_rss_caps"]
    pub struct ibv_rss_caps {
        pub supported_qpts: u32,
        pub max_rwq_indirection_tables: u32,
        pub max_rwq_indirection_table_size: u32,
        pub rx_hash_fields_mask: u64,
        pub rx_hash_function: u8,
    }

    /// `struct ibv_packet_pacing_caps`.
    #[c = "struct ibv_packet_pacing_caps"]
    pub struct ibv_packet_pacing_caps {
        pub qp_rate_limit_min: u32,
        pub qp_rate_limit_max: u32,
        pub supported_qpts: u32,
    }

    /// `struct ibv_tm_caps`.
    #[c = "struct ibv_tm_caps"]
    pub struct ibv_tm_caps {
        pub max_rndv_hdr_size: u32,
        pub max_num_tags: u32,
        pub flags: u32,
        pub max_ops: u32,
        pub max_sge: u32,
    }

    /// `struct ibv_cq_moderation_caps`.
    #[c = "struct ibv_cq_moderation_caps"]
    pub struct ibv_cq_moderation_caps {
        pub max_cq_count: u16,
        pub max_cq_period: u16,
    }

    /// `struct ibv_pci_atomic_caps`.
    #[c = "struct ibv_pci_atomic_caps"]
    pub struct ibv_pci_atomic_caps {
        pub fetch_add: u16,
        pub swap: u16,
        pub compare_swap: u16,
    }

    /// `struct ibv_device_attr_ex` (`ibv_query_device_ex`).
    #[c = "struct ibv_device_attr_ex"]
    pub struct ibv_device_attr_ex {
        pub orig_attr: ibv_device_attr,
        pub comp_mask: u32,
        pub odp_caps: ibv_odp_caps,
        pub completion_timestamp_mask: u64,
        pub hca_core_clock: u64,
        pub device_cap_flags_ex: u64,
        pub tso_caps: ibv_tso_caps,
        pub rss_caps: ibv_rss_caps,
        pub max_wq_type_rq: u32,
        pub packet_pacing_caps: ibv_packet_pacing_caps,
        pub raw_packet_caps: u32,
        pub tm_caps: ibv_tm_caps,
        pub cq_mod_caps: ibv_cq_moderation_caps,
        pub max_dm_size: u64,
        pub pci_atomic_caps: ibv_pci_atomic_caps,
        pub xrc_odp_caps: u32,
        pub phys_port_cnt_ex: u32,
    }

    /// `struct ibv_port_attr` (52 bytes; the exported compat call gets only the first 48).
    #[c = "struct ibv_port_attr"]
    pub struct ibv_port_attr {
        /// `enum ibv_port_state`.
        pub state: u32,
        /// `enum ibv_mtu`.
        pub max_mtu: u32,
        /// `enum ibv_mtu`.
        pub active_mtu: u32,
        pub gid_tbl_len: c_int,
        pub port_cap_flags: u32,
        pub max_msg_sz: u32,
        pub bad_pkey_cntr: u32,
        pub qkey_viol_cntr: u32,
        pub pkey_tbl_len: u16,
        pub lid: u16,
        pub sm_lid: u16,
        pub lmc: u8,
        pub max_vl_num: u8,
        pub sm_sl: u8,
        pub subnet_timeout: u8,
        pub init_type_reply: u8,
        pub active_width: u8,
        pub active_speed: u8,
        pub phys_state: u8,
        pub link_layer: u8,
        pub flags: u8,
        pub port_cap_flags2: u16,
    }

    /// `struct ibv_comp_channel`: `fd` must be pollable.
    #[c = "struct ibv_comp_channel"]
    pub struct ibv_comp_channel {
        pub context: *mut ibv_context,
        pub fd: c_int,
        pub refcnt: c_int,
    }

    /// `struct ibv_pd`.
    #[c = "struct ibv_pd"]
    pub struct ibv_pd {
        pub context: *mut ibv_context,
        pub handle: u32,
    }

    /// `struct ibv_mr`.
    #[c = "struct ibv_mr"]
    pub struct ibv_mr {
        pub context: *mut ibv_context,
        pub pd: *mut ibv_pd,
        pub addr: *mut c_void,
        pub length: usize,
        pub handle: u32,
        pub lkey: u32,
        pub rkey: u32,
    }

    /// `struct ibv_cq`.
    #[c = "struct ibv_cq"]
    pub struct ibv_cq {
        pub context: *mut ibv_context,
        pub channel: *mut ibv_comp_channel,
        pub cq_context: *mut c_void,
        pub handle: u32,
        pub cqe: c_int,
        pub mutex: pthread_mutex_t,
        pub cond: pthread_cond_t,
        pub comp_events_completed: u32,
        pub async_events_completed: u32,
    }

    /// `struct ibv_poll_cq_attr`.
    #[c = "struct ibv_poll_cq_attr"]
    pub struct ibv_poll_cq_attr {
        pub comp_mask: u32,
    }

    /// `struct ibv_wc_tm_info`.
    #[c = "struct ibv_wc_tm_info"]
    pub struct ibv_wc_tm_info {
        pub tag: u64,
        pub r#priv: u32,
    }

    /// `struct ibv_cq_ex`: an `ibv_cq` (first 128 bytes) plus the polling function pointers.
    #[c = "struct ibv_cq_ex"]
    pub struct ibv_cq_ex {
        pub context: *mut ibv_context,
        pub channel: *mut ibv_comp_channel,
        pub cq_context: *mut c_void,
        pub handle: u32,
        pub cqe: c_int,
        pub mutex: pthread_mutex_t,
        pub cond: pthread_cond_t,
        pub comp_events_completed: u32,
        pub async_events_completed: u32,
        pub comp_mask: u32,
        /// `enum ibv_wc_status`.
        pub status: u32,
        pub wr_id: u64,
        pub start_poll: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int>,
        pub next_poll: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> c_int>,
        pub end_poll: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex)>,
        pub read_opcode: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u32>,
        pub read_vendor_err: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u32>,
        pub read_byte_len: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u32>,
        pub read_imm_data: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u32>,
        pub read_qp_num: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u32>,
        pub read_src_qp: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u32>,
        pub read_wc_flags: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> c_uint>,
        pub read_slid: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u32>,
        pub read_sl: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u8>,
        pub read_dlid_path_bits: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u8>,
        pub read_completion_ts: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u64>,
        pub read_cvlan: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u16>,
        pub read_flow_tag: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u32>,
        pub read_tm_info: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info)>,
        pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(cq: *mut ibv_cq_ex) -> u64>,
    }

    /// `struct ibv_cq_init_attr_ex`.
    #[c = "struct ibv_cq_init_attr_ex"]
    pub struct ibv_cq_init_attr_ex {
        pub cqe: u32,
        pub cq_context: *mut c_void,
        pub channel: *mut ibv_comp_channel,
        pub comp_vector: u32,
        pub wc_flags: u64,
        pub comp_mask: u32,
        pub flags: u32,
        pub parent_domain: *mut ibv_pd,
    }

    /// `struct ibv_srq`.
    #[c = "struct ibv_srq"]
    pub struct ibv_srq {
        pub context: *mut ibv_context,
        pub srq_context: *mut c_void,
        pub pd: *mut ibv_pd,
        pub handle: u32,
        pub mutex: pthread_mutex_t,
        pub cond: pthread_cond_t,
        pub events_completed: u32,
    }

    /// `struct ibv_async_event`: `element` is the union of the `cq`, `qp`, `srq` and `wq`
    /// pointers and the `int port_num`.
    #[c = "struct ibv_async_event"]
    pub struct ibv_async_event {
        pub element: *mut c_void,
        /// `enum ibv_event_type`.
        pub event_type: u32,
    }

    /// `struct ibv_srq_attr`.
    #[c = "struct ibv_srq_attr"]
    pub struct ibv_srq_attr {
        pub max_wr: u32,
        pub max_sge: u32,
        pub srq_limit: u32,
    }

    /// `struct ibv_srq_init_attr`.
    #[c = "struct ibv_srq_init_attr"]
    pub struct ibv_srq_init_attr {
        pub srq_context: *mut c_void,
        pub attr: ibv_srq_attr,
    }

    /// `struct ibv_tm_cap`.
    #[c = "struct ibv_tm_cap"]
    pub struct ibv_tm_cap {
        pub max_num_tags: u32,
        pub max_ops: u32,
    }

    /// `struct ibv_srq_init_attr_ex`.
    #[c = "struct ibv_srq_init_attr_ex"]
    pub struct ibv_srq_init_attr_ex {
        pub srq_context: *mut c_void,
        pub attr: ibv_srq_attr,
        pub comp_mask: u32,
        /// `enum ibv_srq_type`.
        pub srq_type: u32,
        pub pd: *mut ibv_pd,
        pub xrcd: *mut ibv_xrcd,
        pub cq: *mut ibv_cq,
        pub tm_cap: ibv_tm_cap,
    }

    /// `struct ibv_xrcd`.
    #[c = "struct ibv_xrcd"]
    pub struct ibv_xrcd {
        pub context: *mut ibv_context,
    }

    /// `struct ibv_qp`.
    #[c = "struct ibv_qp"]
    pub struct ibv_qp {
        pub context: *mut ibv_context,
        pub qp_context: *mut c_void,
        pub pd: *mut ibv_pd,
        pub send_cq: *mut ibv_cq,
        pub recv_cq: *mut ibv_cq,
        pub srq: *mut ibv_srq,
        pub handle: u32,
        pub qp_num: u32,
        /// `enum ibv_qp_state`.
        pub state: u32,
        /// `enum ibv_qp_type`.
        pub qp_type: u32,
        pub mutex: pthread_mutex_t,
        pub cond: pthread_cond_t,
        pub events_completed: u32,
    }

    /// `struct ibv_qp_ex`: an `ibv_qp` first, then the `ibv_wr_*` function pointers.
    #[c = "struct ibv_qp_ex"]
    pub struct ibv_qp_ex {
        pub qp_base: ibv_qp,
        pub comp_mask: u64,
        pub wr_id: u64,
        pub wr_flags: c_uint,
        pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
        pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
        pub wr_bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
        pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
        pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
        pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
        pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
        pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
        pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
        pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
        pub wr_set_inline_data_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
        pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
        pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
        pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
        pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
        pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
    }

    /// `struct ibv_mw`.
    #[c = "struct ibv_mw"]
    pub struct ibv_mw {
        pub context: *mut ibv_context,
        pub pd: *mut ibv_pd,
        pub rkey: u32,
        pub handle: u32,
        /// `enum ibv_mw_type`.
        pub r#type: u32,
    }

    /// `struct ibv_mw_bind`.
    #[c = "struct ibv_mw_bind"]
    pub struct ibv_mw_bind {
        pub wr_id: u64,
        pub send_flags: c_uint,
        pub bind_info: ibv_mw_bind_info,
    }

    /// `struct ibv_data_buf`.
    #[c = "struct ibv_data_buf"]
    pub struct ibv_data_buf {
        pub addr: *mut c_void,
        pub length: usize,
    }

    /// `struct ibv_mw_bind_info`.
    #[c = "struct ibv_mw_bind_info"]
    #[derive(Clone, Copy)]
    pub struct ibv_mw_bind_info {
        pub mr: *mut ibv_mr,
        pub addr: u64,
        pub length: u64,
        pub mw_access_flags: c_uint,
    }

    /// `struct ibv_ah`.
    #[c = "struct ibv_ah"]
    pub struct ibv_ah {
        pub context: *mut ibv_context,
        pub pd: *mut ibv_pd,
        pub handle: u32,
    }

    /// `struct ibv_global_route`.
    #[c = "struct ibv_global_route"]
    #[derive(Clone, Copy)]
    pub struct ibv_global_route {
        pub dgid: ibv_gid,
        pub flow_label: u32,
        pub sgid_index: u8,
        pub hop_limit: u8,
        pub traffic_class: u8,
    }

    /// `struct ibv_ah_attr`.
    #[c = "struct ibv_ah_attr"]
    #[derive(Clone, Copy)]
    pub struct ibv_ah_attr {
        pub grh: ibv_global_route,
        pub dlid: u16,
        pub sl: u8,
        pub src_path_bits: u8,
        pub static_rate: u8,
        pub is_global: u8,
        pub port_num: u8,
    }

    /// `struct ibv_wc`.
    #[c = "struct ibv_wc"]
    pub struct ibv_wc {
        pub wr_id: u64,
        /// `enum ibv_wc_status`.
        pub status: u32,
        /// `enum ibv_wc_opcode`.
        pub opcode: u32,
        pub vendor_err: u32,
        pub byte_len: u32,
        /// Union of `imm_data` (big-endian) and `invalidated_rkey`.
        pub imm_data: u32,
        pub qp_num: u32,
        pub src_qp: u32,
        pub wc_flags: c_uint,
        pub pkey_index: u16,
        pub slid: u16,
        pub sl: u8,
        pub dlid_path_bits: u8,
    }

    /// `struct ibv_sge`.
    #[c = "struct ibv_sge"]
    pub struct ibv_sge {
        pub addr: u64,
        pub length: u32,
        pub lkey: u32,
    }

    /// `ibv_send_wr.wr.rdma`.
    #[c = "__typeof__(((struct ibv_send_wr *)0)->wr.rdma)"]
    #[derive(Clone, Copy)]
    pub struct ibv_send_wr_rdma {
        pub remote_addr: u64,
        pub rkey: u32,
    }

    /// `ibv_send_wr.wr.atomic`.
    #[c = "__typeof__(((struct ibv_send_wr *)0)->wr.atomic)"]
    #[derive(Clone, Copy)]
    pub struct ibv_send_wr_atomic {
        pub remote_addr: u64,
        pub compare_add: u64,
        pub swap: u64,
        pub rkey: u32,
    }

    /// `ibv_send_wr.wr.ud`.
    #[c = "__typeof__(((struct ibv_send_wr *)0)->wr.ud)"]
    #[derive(Clone, Copy)]
    pub struct ibv_send_wr_ud {
        pub ah: *mut ibv_ah,
        pub remote_qpn: u32,
        pub remote_qkey: u32,
    }

    /// `ibv_send_wr.qp_type.xrc`.
    #[c = "__typeof__(((struct ibv_send_wr *)0)->qp_type.xrc)"]
    #[derive(Clone, Copy)]
    pub struct ibv_send_wr_xrc {
        pub remote_srqn: u32,
    }

    /// `ibv_send_wr.bind_mw`.
    #[c = "__typeof__(((struct ibv_send_wr *)0)->bind_mw)"]
    #[derive(Clone, Copy)]
    pub struct ibv_send_wr_bind_mw {
        pub mw: *mut ibv_mw,
        pub rkey: u32,
        pub bind_info: ibv_mw_bind_info,
    }

    /// `ibv_send_wr.tso`.
    #[c = "__typeof__(((struct ibv_send_wr *)0)->tso)"]
    #[derive(Clone, Copy)]
    pub struct ibv_send_wr_tso {
        pub hdr: *mut c_void,
        pub hdr_sz: u16,
        pub mss: u16,
    }

    /// `struct ibv_send_wr`.
    #[c = "struct ibv_send_wr"]
    pub struct ibv_send_wr {
        pub wr_id: u64,
        pub next: *mut ibv_send_wr,
        pub sg_list: *mut ibv_sge,
        pub num_sge: c_int,
        /// `enum ibv_wr_opcode`.
        pub opcode: u32,
        pub send_flags: c_uint,
        /// Union of `imm_data` (big-endian) and `invalidate_rkey`.
        pub imm_data: u32,
        pub wr: ibv_send_wr_wr,
        pub qp_type: ibv_send_wr_qp_type,
        /// The unnamed `{ bind_mw; tso; }` union; C spells this offset `bind_mw`.
        pub bind_mw: ibv_send_wr_bind_mw_tso,
    }

    /// `struct ibv_recv_wr`.
    #[c = "struct ibv_recv_wr"]
    pub struct ibv_recv_wr {
        pub wr_id: u64,
        pub next: *mut ibv_recv_wr,
        pub sg_list: *mut ibv_sge,
        pub num_sge: c_int,
    }

    /// `struct ibv_qp_cap`.
    #[c = "struct ibv_qp_cap"]
    #[derive(Clone, Copy)]
    pub struct ibv_qp_cap {
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
    }

    /// `struct ibv_qp_init_attr`.
    #[c = "struct ibv_qp_init_attr"]
    #[derive(Clone, Copy)]
    pub struct ibv_qp_init_attr {
        pub qp_context: *mut c_void,
        pub send_cq: *mut ibv_cq,
        pub recv_cq: *mut ibv_cq,
        pub srq: *mut ibv_srq,
        pub cap: ibv_qp_cap,
        /// `enum ibv_qp_type`.
        pub qp_type: u32,
        pub sq_sig_all: c_int,
    }

    /// `struct ibv_rx_hash_conf`.
    #[c = "struct ibv_rx_hash_conf"]
    pub struct ibv_rx_hash_conf {
        pub rx_hash_function: u8,
        pub rx_hash_key_len: u8,
        pub rx_hash_key: *mut u8,
        pub rx_hash_fields_mask: u64,
    }

    /// `struct ibv_qp_init_attr_ex`.
    #[c = "struct ibv_qp_init_attr_ex"]
    pub struct ibv_qp_init_attr_ex {
        pub qp_context: *mut c_void,
        pub send_cq: *mut ibv_cq,
        pub recv_cq: *mut ibv_cq,
        pub srq: *mut ibv_srq,
        pub cap: ibv_qp_cap,
        /// `enum ibv_qp_type`.
        pub qp_type: u32,
        pub sq_sig_all: c_int,
        pub comp_mask: u32,
        pub pd: *mut ibv_pd,
        pub xrcd: *mut ibv_xrcd,
        pub create_flags: u32,
        pub max_tso_header: u16,
        pub rwq_ind_tbl: *mut ibv_rwq_ind_table,
        pub rx_hash_conf: ibv_rx_hash_conf,
        pub source_qpn: u32,
        pub send_ops_flags: u64,
    }

    /// `struct ibv_qp_attr`.
    #[c = "struct ibv_qp_attr"]
    pub struct ibv_qp_attr {
        /// `enum ibv_qp_state`.
        pub qp_state: u32,
        /// `enum ibv_qp_state`.
        pub cur_qp_state: u32,
        /// `enum ibv_mtu`.
        pub path_mtu: u32,
        /// `enum ibv_mig_state`.
        pub path_mig_state: u32,
        pub qkey: u32,
        pub rq_psn: u32,
        pub sq_psn: u32,
        pub dest_qp_num: u32,
        pub qp_access_flags: c_uint,
        pub cap: ibv_qp_cap,
        pub ah_attr: ibv_ah_attr,
        pub alt_ah_attr: ibv_ah_attr,
        pub pkey_index: u16,
        pub alt_pkey_index: u16,
        pub en_sqd_async_notify: u8,
        pub sq_draining: u8,
        pub max_rd_atomic: u8,
        pub max_dest_rd_atomic: u8,
        pub min_rnr_timer: u8,
        pub port_num: u8,
        pub timeout: u8,
        pub retry_cnt: u8,
        pub rnr_retry: u8,
        pub alt_port_num: u8,
        pub alt_timeout: u8,
        pub rate_limit: u32,
    }
}
