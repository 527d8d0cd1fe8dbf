//! The kernel-ABI structures of `<rdma/ib_user_verbs.h>` and `<rdma/ib_user_sa.h>`: the kernel
//! side of libibverbs' marshalling helpers (`ibv_copy_*_from_kern` / `_to_kern`).

use super::c_struct;

c_struct! {
    registry kern_structs;

    /// `struct ib_uverbs_global_route`.
    #[c = "struct ib_uverbs_global_route"]
    #[derive(Clone, Copy)]
    pub struct ib_uverbs_global_route {
        pub dgid: [u8; 16],
        pub flow_label: u32,
        pub sgid_index: u8,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub reserved: u8,
    }

    /// `struct ib_uverbs_ah_attr`.
    #[c = "struct ib_uverbs_ah_attr"]
    #[derive(Clone, Copy)]
    pub struct ib_uverbs_ah_attr {
        pub grh: ib_uverbs_global_route,
        pub dlid: u16,
        pub sl: u8,
        pub src_path_bits: u8,
        pub static_rate: u8,
        pub is_global: u8,
        pub port_num: u8,
        pub reserved: u8,
    }

    /// `struct ib_uverbs_qp_attr`.
    #[c = "struct ib_uverbs_qp_attr"]
    pub struct ib_uverbs_qp_attr {
        pub qp_attr_mask: u32,
        pub qp_state: u32,
        pub cur_qp_state: u32,
        pub path_mtu: u32,
        pub path_mig_state: u32,
        pub qkey: u32,
        pub rq_psn: u32,
        pub sq_psn: u32,
        pub dest_qp_num: u32,
        pub qp_access_flags: u32,
        pub ah_attr: ib_uverbs_ah_attr,
        pub alt_ah_attr: ib_uverbs_ah_attr,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
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
        pub reserved: [u8; 5],
    }

    /// `struct ib_user_path_rec`.
    #[c = "struct ib_user_path_rec"]
    pub struct ib_user_path_rec {
        pub dgid: [u8; 16],
        pub sgid: [u8; 16],
        pub dlid: u16,
        pub slid: u16,
        pub raw_traffic: u32,
        pub flow_label: u32,
        pub reversible: u32,
        pub mtu: u32,
        pub pkey: u16,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub numb_path: u8,
        pub sl: u8,
        pub mtu_selector: u8,
        pub rate_selector: u8,
        pub rate: u8,
        pub packet_life_time_selector: u8,
        pub packet_life_time: u8,
        pub preference: u8,
    }
}
