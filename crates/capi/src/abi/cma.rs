//! `<rdma/rdma_cma.h>` and `<infiniband/sa.h>` (rdma-core 44): CM ids, events, address info.

use core::ffi::{c_char, c_int, c_void};

use libc::{sockaddr, sockaddr_storage, socklen_t};

use super::verbs::{ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_srq};
use super::{c_struct, c_union};

c_union! {
    registry cma_unions;

    /// `rdma_cm_event.param`.
    #[c = "__typeof__(((struct rdma_cm_event *)0)->param)"]
    pub union rdma_cm_event_param {
        pub conn: rdma_conn_param,
        pub ud: rdma_ud_param,
    }
}

c_struct! {
    registry cma_structs;

    /// `struct rdma_event_channel` (a library may allocate more, with `fd` first).
    #[c = "struct rdma_event_channel"]
    pub struct rdma_event_channel {
        pub fd: c_int,
    }

    /// `struct rdma_ib_addr`.
    #[c = "struct rdma_ib_addr"]
    pub struct rdma_ib_addr {
        pub sgid: ibv_gid,
        pub dgid: ibv_gid,
        /// Big-endian.
        pub pkey: u16,
    }

    /// `struct rdma_addr`. The two anonymous unions of `sockaddr*` are mirrored by their
    /// largest member, `src_storage` / `dst_storage` (same offset; C's `src_addr` aliases it).
    #[c = "struct rdma_addr"]
    pub struct rdma_addr {
        pub src_storage: sockaddr_storage,
        pub dst_storage: sockaddr_storage,
        /// `union { struct rdma_ib_addr ibaddr; } addr`.
        pub addr: rdma_ib_addr,
    }

    /// `struct rdma_route`.
    #[c = "struct rdma_route"]
    pub struct rdma_route {
        pub addr: rdma_addr,
        pub path_rec: *mut ibv_sa_path_rec,
        pub num_paths: c_int,
    }

    /// `struct rdma_cm_id`.
    #[c = "struct rdma_cm_id"]
    pub struct rdma_cm_id {
        pub verbs: *mut ibv_context,
        pub channel: *mut rdma_event_channel,
        pub context: *mut c_void,
        pub qp: *mut ibv_qp,
        pub route: rdma_route,
        /// `enum rdma_port_space`.
        pub ps: c_int,
        pub port_num: u8,
        pub event: *mut rdma_cm_event,
        pub send_cq_channel: *mut ibv_comp_channel,
        pub send_cq: *mut ibv_cq,
        pub recv_cq_channel: *mut ibv_comp_channel,
        pub recv_cq: *mut ibv_cq,
        pub srq: *mut ibv_srq,
        pub pd: *mut ibv_pd,
        /// `enum ibv_qp_type`.
        pub qp_type: u32,
    }

    /// `struct rdma_conn_param`.
    #[c = "struct rdma_conn_param"]
    #[derive(Clone, Copy)]
    pub struct rdma_conn_param {
        pub private_data: *const c_void,
        pub private_data_len: u8,
        pub responder_resources: u8,
        pub initiator_depth: u8,
        pub flow_control: u8,
        pub retry_count: u8,
        pub rnr_retry_count: u8,
        pub srq: u8,
        pub qp_num: u32,
    }

    /// `struct rdma_ud_param`.
    #[c = "struct rdma_ud_param"]
    #[derive(Clone, Copy)]
    pub struct rdma_ud_param {
        pub private_data: *const c_void,
        pub private_data_len: u8,
        pub ah_attr: ibv_ah_attr,
        pub qp_num: u32,
        pub qkey: u32,
    }

    /// `struct rdma_cm_event`.
    #[c = "struct rdma_cm_event"]
    pub struct rdma_cm_event {
        pub id: *mut rdma_cm_id,
        pub listen_id: *mut rdma_cm_id,
        /// `enum rdma_cm_event_type`.
        pub event: u32,
        pub status: c_int,
        pub param: rdma_cm_event_param,
    }

    /// `struct rdma_addrinfo`.
    #[c = "struct rdma_addrinfo"]
    pub struct rdma_addrinfo {
        pub ai_flags: c_int,
        pub ai_family: c_int,
        pub ai_qp_type: c_int,
        pub ai_port_space: c_int,
        pub ai_src_len: socklen_t,
        pub ai_dst_len: socklen_t,
        pub ai_src_addr: *mut sockaddr,
        pub ai_dst_addr: *mut sockaddr,
        pub ai_src_canonname: *mut c_char,
        pub ai_dst_canonname: *mut c_char,
        pub ai_route_len: usize,
        pub ai_route: *mut c_void,
        pub ai_connect_len: usize,
        pub ai_connect: *mut c_void,
        pub ai_next: *mut rdma_addrinfo,
    }

    /// `struct rdma_cm_join_mc_attr_ex`.
    #[c = "struct rdma_cm_join_mc_attr_ex"]
    pub struct rdma_cm_join_mc_attr_ex {
        pub comp_mask: u32,
        pub join_flags: u32,
        pub addr: *mut sockaddr,
    }

    /// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
    #[c = "struct ibv_sa_path_rec"]
    pub struct ibv_sa_path_rec {
        pub dgid: ibv_gid,
        pub sgid: ibv_gid,
        pub dlid: u16,
        pub slid: u16,
        pub raw_traffic: c_int,
        pub flow_label: u32,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub reversible: c_int,
        pub numb_path: u8,
        pub pkey: u16,
        pub sl: u8,
        pub mtu_selector: u8,
        pub mtu: u8,
        pub rate_selector: u8,
        pub rate: u8,
        pub packet_life_time_selector: u8,
        pub packet_life_time: u8,
        pub preference: u8,
    }
}
