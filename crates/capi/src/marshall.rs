//! libibverbs' marshalling helpers between the kernel-ABI structures and the verbs ones:
//! `ibv_copy_qp_attr_from_kern`, `ibv_copy_ah_attr_from_kern`, `ibv_copy_path_rec_from_kern`
//! and `ibv_copy_path_rec_to_kern`. Field-by-field copies, as rdma-core's; `tests/dropin.rs`
//! compares every output byte with Debian's libibverbs.

use crate::abi::{
    ib_user_path_rec, ib_uverbs_ah_attr, ib_uverbs_qp_attr, ibv_ah_attr, ibv_gid, ibv_qp_attr, ibv_sa_path_rec,
};

fn ah_attr_from_kern(dst: &mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    dst.grh.dgid = ibv_gid { raw: src.grh.dgid };
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

/// `qp_state` is not copied (nor by rdma-core): the caller knows the state it asked for.
fn qp_attr_from_kern(dst: &mut ibv_qp_attr, src: &ib_uverbs_qp_attr) {
    dst.cur_qp_state = src.cur_qp_state;
    dst.path_mtu = src.path_mtu;
    dst.path_mig_state = src.path_mig_state;
    dst.qkey = src.qkey;
    dst.rq_psn = src.rq_psn;
    dst.sq_psn = src.sq_psn;
    dst.dest_qp_num = src.dest_qp_num;
    dst.qp_access_flags = src.qp_access_flags;
    dst.cap.max_send_wr = src.max_send_wr;
    dst.cap.max_recv_wr = src.max_recv_wr;
    dst.cap.max_send_sge = src.max_send_sge;
    dst.cap.max_recv_sge = src.max_recv_sge;
    dst.cap.max_inline_data = src.max_inline_data;
    ah_attr_from_kern(&mut dst.ah_attr, &src.ah_attr);
    ah_attr_from_kern(&mut dst.alt_ah_attr, &src.alt_ah_attr);
    dst.pkey_index = src.pkey_index;
    dst.alt_pkey_index = src.alt_pkey_index;
    dst.en_sqd_async_notify = src.en_sqd_async_notify;
    dst.sq_draining = src.sq_draining;
    dst.max_rd_atomic = src.max_rd_atomic;
    dst.max_dest_rd_atomic = src.max_dest_rd_atomic;
    dst.min_rnr_timer = src.min_rnr_timer;
    dst.port_num = src.port_num;
    dst.timeout = src.timeout;
    dst.retry_cnt = src.retry_cnt;
    dst.rnr_retry = src.rnr_retry;
    dst.alt_port_num = src.alt_port_num;
    dst.alt_timeout = src.alt_timeout;
}

fn path_rec_from_kern(dst: &mut ibv_sa_path_rec, src: &ib_user_path_rec) {
    dst.dgid = ibv_gid { raw: src.dgid };
    dst.sgid = ibv_gid { raw: src.sgid };
    dst.dlid = src.dlid;
    dst.slid = src.slid;
    dst.raw_traffic = src.raw_traffic as i32;
    dst.flow_label = src.flow_label;
    dst.reversible = src.reversible as i32;
    dst.mtu = src.mtu as u8;
    dst.pkey = src.pkey;
    dst.hop_limit = src.hop_limit;
    dst.traffic_class = src.traffic_class;
    dst.numb_path = src.numb_path;
    dst.sl = src.sl;
    dst.mtu_selector = src.mtu_selector;
    dst.rate_selector = src.rate_selector;
    dst.rate = src.rate;
    dst.packet_life_time_selector = src.packet_life_time_selector;
    dst.packet_life_time = src.packet_life_time;
    dst.preference = src.preference;
}

fn path_rec_to_kern(dst: &mut ib_user_path_rec, src: &ibv_sa_path_rec) {
    // SAFETY: both union members are plain bytes of the same size.
    dst.dgid = unsafe { src.dgid.raw };
    // SAFETY: as above.
    dst.sgid = unsafe { src.sgid.raw };
    dst.dlid = src.dlid;
    dst.slid = src.slid;
    dst.raw_traffic = src.raw_traffic as u32;
    dst.flow_label = src.flow_label;
    dst.reversible = src.reversible as u32;
    dst.mtu = u32::from(src.mtu);
    dst.pkey = src.pkey;
    dst.hop_limit = src.hop_limit;
    dst.traffic_class = src.traffic_class;
    dst.numb_path = src.numb_path;
    dst.sl = src.sl;
    dst.mtu_selector = src.mtu_selector;
    dst.rate_selector = src.rate_selector;
    dst.rate = src.rate;
    dst.packet_life_time_selector = src.packet_life_time_selector;
    dst.packet_life_time = src.packet_life_time;
    dst.preference = src.preference;
}

/// Runs `f` on the two structures when neither pointer is NULL (rdma-core would crash; a
/// NULL here is ignored, and says so under `SOFTRDMA_DEBUG`).
///
/// # Safety
/// Each non-NULL pointer is valid for its structure, `dst` writable, and the two do not overlap.
unsafe fn with_both<D, S>(dst: *mut D, src: *const S, f: impl FnOnce(&mut D, &S)) {
    if dst.is_null() || src.is_null() {
        crate::error::debug_note("a NULL structure pointer: nothing copied");
        return;
    }
    // SAFETY: non-NULL, valid and not overlapping per this function's contract.
    unsafe { f(&mut *dst, &*src) }
}

c_fn! {
    /// `void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)`.
    fn ibv_copy_qp_attr_from_kern(dst: *mut ibv_qp_attr, src: *const ib_uverbs_qp_attr) {
        // SAFETY: the caller passes valid structures (the C contract).
        unsafe { with_both(dst, src, qp_attr_from_kern) }
    }

    /// `void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src)`.
    fn ibv_copy_ah_attr_from_kern(dst: *mut ibv_ah_attr, src: *const ib_uverbs_ah_attr) {
        // SAFETY: the caller passes valid structures (the C contract).
        unsafe { with_both(dst, src, ah_attr_from_kern) }
    }

    /// `void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src)`.
    fn ibv_copy_path_rec_from_kern(dst: *mut ibv_sa_path_rec, src: *const ib_user_path_rec) {
        // SAFETY: the caller passes valid structures (the C contract).
        unsafe { with_both(dst, src, path_rec_from_kern) }
    }

    /// `void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src)`.
    fn ibv_copy_path_rec_to_kern(dst: *mut ib_user_path_rec, src: *const ibv_sa_path_rec) {
        // SAFETY: the caller passes valid structures (the C contract).
        unsafe { with_both(dst, src, path_rec_to_kern) }
    }
}
