//! Compile-time layout asserts with the numbers of `abi-offsets.txt` (x86_64, printed by a C
//! program from the rdma-core 44 headers; see `/work/shared/research/abi.md` section 5).
//!
//! A wrong field type or order fails the build here. The `c_layout` unit test re-derives
//! every offset from the installed headers as well; these numbers keep the build honest on a
//! machine without them.

use core::mem::{align_of, offset_of, size_of};

use super::*;

/// `layout!(T, size S, align A; field @ offset, ...)`: const asserts on `T`.
macro_rules! layout {
    ($t:ty, size $size:literal, align $align:literal; $($f:ident @ $off:literal),* $(,)?) => {
        const _: () = assert!(size_of::<$t>() == $size, concat!("sizeof ", stringify!($t)));
        const _: () = assert!(align_of::<$t>() == $align, concat!("alignof ", stringify!($t)));
        $(const _: () = assert!(
            offset_of!($t, $f) == $off,
            concat!("offsetof ", stringify!($t), ".", stringify!($f))
        );)*
    };
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("the drop-in ABI layouts are verified for x86_64 Linux only");

layout!(ibv_device, size 664, align 8; _ops @ 0, node_type @ 16, transport_type @ 20, name @ 24, dev_name @ 88, dev_path @ 152, ibdev_path @ 408);
layout!(ibv_context_ops, size 256, align 8; _compat_query_device @ 0, _compat_query_port @ 8, _compat_alloc_pd @ 16, alloc_mw @ 56, bind_mw @ 64, dealloc_mw @ 72, _compat_create_cq @ 80, poll_cq @ 88, req_notify_cq @ 96, post_srq_recv @ 160, post_send @ 200, post_recv @ 208, _compat_async_event @ 248);
layout!(ibv_context, size 328, align 8; device @ 0, ops @ 8, cmd_fd @ 264, async_fd @ 268, num_comp_vectors @ 272, mutex @ 280, abi_compat @ 320);
layout!(verbs_context, size 648, align 8; query_port @ 0, advise_mr @ 8, alloc_null_mr @ 16, read_counters @ 24, attach_counters_point_flow @ 32, create_counters @ 40, destroy_counters @ 48, reg_dm_mr @ 56, alloc_dm @ 64, free_dm @ 72, modify_flow_action_esp @ 80, destroy_flow_action @ 88, create_flow_action_esp @ 96, modify_qp_rate_limit @ 104, alloc_parent_domain @ 112, dealloc_td @ 120, alloc_td @ 128, modify_cq @ 136, post_srq_ops @ 144, destroy_rwq_ind_table @ 152, create_rwq_ind_table @ 160, destroy_wq @ 168, modify_wq @ 176, create_wq @ 184, query_rt_values @ 192, create_cq_ex @ 200, r#priv @ 208, query_device_ex @ 216, ibv_destroy_flow @ 224, ABI_placeholder2 @ 232, ibv_create_flow @ 240, ABI_placeholder1 @ 248, open_qp @ 256, create_qp_ex @ 264, get_srq_num @ 272, create_srq_ex @ 280, open_xrcd @ 288, close_xrcd @ 296, _ABI_placeholder3 @ 304, sz @ 312, context @ 320);
layout!(ibv_comp_channel, size 16, align 8; context @ 0, fd @ 8, refcnt @ 12);
layout!(ibv_pd, size 16, align 8; context @ 0, handle @ 8);
layout!(ibv_mr, size 48, align 8; context @ 0, pd @ 8, addr @ 16, length @ 24, handle @ 32, lkey @ 36, rkey @ 40);
layout!(ibv_cq, size 128, align 8; context @ 0, channel @ 8, cq_context @ 16, handle @ 24, cqe @ 28, mutex @ 32, cond @ 72, comp_events_completed @ 120, async_events_completed @ 124);
layout!(ibv_cq_ex, size 288, align 8; comp_mask @ 128, status @ 132, wr_id @ 136, start_poll @ 144, next_poll @ 152, end_poll @ 160, read_opcode @ 168, read_completion_ts @ 248, read_completion_wallclock_ns @ 280);
layout!(ibv_srq, size 128, align 8; context @ 0, srq_context @ 8, pd @ 16, handle @ 24, mutex @ 32, cond @ 72, events_completed @ 120);
layout!(ibv_qp, size 160, align 8; context @ 0, qp_context @ 8, pd @ 16, send_cq @ 24, recv_cq @ 32, srq @ 40, handle @ 48, qp_num @ 52, state @ 56, qp_type @ 60, mutex @ 64, cond @ 104, events_completed @ 152);
layout!(ibv_qp_ex, size 352, align 8; qp_base @ 0, comp_mask @ 160, wr_id @ 168, wr_flags @ 176, wr_atomic_cmp_swp @ 184, wr_atomic_fetch_add @ 192, wr_rdma_read @ 216, wr_rdma_write @ 224, wr_send @ 240, wr_set_ud_addr @ 272, wr_set_xrc_srqn @ 280, wr_set_inline_data @ 288, wr_set_sge @ 304, wr_start @ 320, wr_complete @ 328, wr_abort @ 336, wr_atomic_write @ 344);
layout!(ibv_ah, size 24, align 8; context @ 0, pd @ 8, handle @ 16);
layout!(ibv_xrcd, size 8, align 8; );
layout!(ibv_device_attr, size 232, align 8; fw_ver @ 0, node_guid @ 64, sys_image_guid @ 72, max_mr_size @ 80, vendor_id @ 96, vendor_part_id @ 100, max_qp @ 108, max_qp_wr @ 112, max_sge @ 120, max_cqe @ 132, max_mr @ 136, max_qp_rd_atom @ 144, max_qp_init_rd_atom @ 156, atomic_cap @ 164, max_pkeys @ 224, phys_port_cnt @ 227);
layout!(ibv_device_attr_ex, size 400, align 8; orig_attr @ 0, comp_mask @ 232, odp_caps @ 240, completion_timestamp_mask @ 264, max_dm_size @ 376, phys_port_cnt_ex @ 396);
layout!(ibv_port_attr, size 52, align 4; state @ 0, max_mtu @ 4, active_mtu @ 8, gid_tbl_len @ 12, port_cap_flags @ 16, max_msg_sz @ 20, pkey_tbl_len @ 32, lid @ 34, sm_lid @ 36, lmc @ 38, active_width @ 43, active_speed @ 44, phys_state @ 45, link_layer @ 46, flags @ 47, port_cap_flags2 @ 48);
layout!(ibv_gid_entry, size 32, align 8; gid @ 0, gid_index @ 16, port_num @ 20, gid_type @ 24, ndev_ifindex @ 28);
layout!(ibv_wc, size 48, align 8; wr_id @ 0, status @ 8, opcode @ 12, vendor_err @ 16, byte_len @ 20, imm_data @ 24, qp_num @ 28, src_qp @ 32, wc_flags @ 36, pkey_index @ 40, slid @ 42, sl @ 44, dlid_path_bits @ 45);
layout!(ibv_sge, size 16, align 8; );
layout!(ibv_send_wr, size 128, align 8; wr_id @ 0, next @ 8, sg_list @ 16, num_sge @ 24, opcode @ 28, send_flags @ 32, imm_data @ 36, wr @ 40, qp_type @ 72, bind_mw @ 80);
layout!(ibv_recv_wr, size 32, align 8; wr_id @ 0, next @ 8, sg_list @ 16, num_sge @ 24);
layout!(ibv_qp_cap, size 20, align 4; );
layout!(ibv_qp_init_attr, size 64, align 8; qp_context @ 0, send_cq @ 8, recv_cq @ 16, srq @ 24, cap @ 32, qp_type @ 52, sq_sig_all @ 56);
layout!(ibv_qp_init_attr_ex, size 136, align 8; comp_mask @ 60, pd @ 64, send_ops_flags @ 128);
layout!(ibv_global_route, size 24, align 8; );
layout!(ibv_ah_attr, size 32, align 8; grh @ 0, dlid @ 24, sl @ 26, src_path_bits @ 27, static_rate @ 28, is_global @ 29, port_num @ 30);
layout!(ibv_qp_attr, size 144, align 8; qp_state @ 0, path_mtu @ 8, qkey @ 16, rq_psn @ 20, sq_psn @ 24, dest_qp_num @ 28, qp_access_flags @ 32, cap @ 36, ah_attr @ 56, alt_ah_attr @ 88, pkey_index @ 120, max_rd_atomic @ 126, max_dest_rd_atomic @ 127, min_rnr_timer @ 128, port_num @ 129, timeout @ 130, retry_cnt @ 131, rnr_retry @ 132, rate_limit @ 136);
layout!(ibv_cq_init_attr_ex, size 56, align 8; );
layout!(ibv_srq_init_attr, size 24, align 8; );
layout!(ibv_srq_init_attr_ex, size 64, align 8; );
layout!(rdma_event_channel, size 4, align 4; fd @ 0);
layout!(rdma_addr, size 296, align 8; src_storage @ 0, dst_storage @ 128, addr @ 256);
layout!(ibv_sa_path_rec, size 64, align 8; );
layout!(rdma_route, size 312, align 8; addr @ 0, path_rec @ 296, num_paths @ 304);
layout!(rdma_cm_id, size 416, align 8; verbs @ 0, channel @ 8, context @ 16, qp @ 24, route @ 32, ps @ 344, port_num @ 348, event @ 352, send_cq_channel @ 360, send_cq @ 368, recv_cq_channel @ 376, recv_cq @ 384, srq @ 392, pd @ 400, qp_type @ 408);
layout!(rdma_conn_param, size 24, align 8; private_data @ 0, private_data_len @ 8, responder_resources @ 9, initiator_depth @ 10, flow_control @ 11, retry_count @ 12, rnr_retry_count @ 13, srq @ 14, qp_num @ 16);
layout!(rdma_ud_param, size 56, align 8; private_data @ 0, private_data_len @ 8, ah_attr @ 16, qp_num @ 48, qkey @ 52);
layout!(rdma_cm_event, size 80, align 8; id @ 0, listen_id @ 8, event @ 16, status @ 20, param @ 24);
layout!(rdma_addrinfo, size 96, align 8; ai_flags @ 0, ai_family @ 4, ai_qp_type @ 8, ai_port_space @ 12, ai_src_len @ 16, ai_dst_len @ 20, ai_src_addr @ 24, ai_dst_addr @ 32, ai_src_canonname @ 40, ai_dst_canonname @ 48, ai_route_len @ 56, ai_route @ 64, ai_connect_len @ 72, ai_connect @ 80, ai_next @ 88);
layout!(rdma_cm_join_mc_attr_ex, size 16, align 8; );

// Nested members, spelled as sums (nested `offset_of!` needs Rust 1.82).
const _: () = assert!(offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_rdma, remote_addr) == 40);
const _: () = assert!(offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_rdma, rkey) == 48);
const _: () = assert!(offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_atomic, compare_add) == 48);
const _: () = assert!(offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_atomic, swap) == 56);
const _: () = assert!(offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_atomic, rkey) == 64);
const _: () = assert!(offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_ud, ah) == 40);
const _: () = assert!(offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_ud, remote_qpn) == 48);
const _: () = assert!(offset_of!(ibv_send_wr, wr) + offset_of!(ibv_send_wr_ud, remote_qkey) == 52);
const _: () = assert!(offset_of!(ibv_send_wr, bind_mw) + offset_of!(ibv_send_wr_bind_mw_tso, tso) == 80);
const _: () = assert!(size_of::<ibv_send_wr_bind_mw_tso>() == 48);
const _: () = assert!(offset_of!(rdma_cm_event, param) + offset_of!(rdma_cm_event_param, conn) == 24);
const _: () = assert!(offset_of!(rdma_cm_event, param) + offset_of!(rdma_cm_event_param, ud) == 24);
const _: () = assert!(size_of::<rdma_cm_event_param>() == 56);
// rdma_cm_event.param.ud.{ah_attr, qp_num, qkey} @ 40 / 72 / 76 (abi.md section 4).
const _: () = assert!(offset_of!(rdma_cm_event, param) + offset_of!(rdma_ud_param, ah_attr) == 40);
const _: () = assert!(offset_of!(rdma_cm_event, param) + offset_of!(rdma_ud_param, qp_num) == 72);
const _: () = assert!(offset_of!(rdma_cm_event, param) + offset_of!(rdma_ud_param, qkey) == 76);

// What the inline functions in the binaries dereference (abi.md sections 0 and 4).
const _: () = assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq) == 96);
const _: () = assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq) == 104);
const _: () = assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_srq_recv) == 168);
const _: () = assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send) == 208);
const _: () = assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv) == 216);
const _: () = assert!(offset_of!(rdma_cm_id, route) + offset_of!(rdma_route, addr) == 32);
const _: () = assert!(offset_of!(rdma_cm_id, route) + offset_of!(rdma_addr, dst_storage) == 160);
const _: () = assert!(offset_of!(rdma_cm_id, route) + offset_of!(rdma_addr, addr) == 288);
const _: () = assert!(offset_of!(rdma_cm_id, route) + offset_of!(rdma_route, path_rec) == 328);
const _: () = assert!(offset_of!(rdma_cm_id, route) + offset_of!(rdma_route, num_paths) == 336);
const _: () = assert!(size_of::<rdma_ib_addr>() == 40);
const _: () = assert!(COMPAT_PORT_ATTR_LEN == 48);
// `ibv_cq` is the first 128 bytes of `ibv_cq_ex`, `ibv_qp` the first 160 of `ibv_qp_ex`.
const _: () = assert!(offset_of!(ibv_cq_ex, comp_mask) == size_of::<ibv_cq>());
const _: () = assert!(offset_of!(ibv_cq_ex, async_events_completed) == offset_of!(ibv_cq, async_events_completed));
const _: () = assert!(offset_of!(ibv_qp_ex, qp_base) == 0);
