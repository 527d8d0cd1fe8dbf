//! Changes to live objects: `ibv_rereg_mr`, `ibv_resize_cq`, `ibv_query_srq` /
//! `ibv_modify_srq`, plus `ibv_reg_mr_iova` and `ibv_query_qp_data_in_order`.

use std::ffi::{c_int, c_uint, c_void};

use crate::abi::{ibv_cq, ibv_mr, ibv_pd, ibv_qp, ibv_srq, ibv_srq_attr};
use crate::context::with_context;
use crate::error::{non_null, ret_errno, ret_ptr, CError, CResult};
use softrdma_verbs::Access;

use crate::objects::{reg_mr, SoftCq, SoftMr, SoftPd, SoftQp, SoftSrq};

/// `enum ibv_rereg_mr_flags`.
const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1;
const IBV_REREG_MR_CHANGE_PD: c_int = 2;
const IBV_REREG_MR_CHANGE_ACCESS: c_int = 4;
const IBV_REREG_MR_FLAGS_SUPPORTED: c_int = 8;
/// `enum ibv_rereg_mr_err_code`: `IBV_REREG_MR_ERR_INPUT`, `IBV_REREG_MR_ERR_CMD`.
const IBV_REREG_MR_ERR_INPUT: c_int = -1;
const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// `ibv_srq_attr_mask`.
const IBV_SRQ_MAX_WR: c_int = 1;
const IBV_SRQ_LIMIT: c_int = 2;

/// Re-registers `p` in place with a new translation, PD and/or access, keeping its keys (as
/// Linux rxe does; a peer that holds the rkey keeps using it). A failure leaves the old
/// registration intact (rdma-core's `IBV_REREG_MR_ERR_CMD`).
fn rereg_mr(
    p: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Result<(), (c_int, CError)> {
    let input = |e: CError| (IBV_REREG_MR_ERR_INPUT, e);
    if flags & !(IBV_REREG_MR_FLAGS_SUPPORTED - 1) != 0 || flags == 0 {
        return Err(input(CError::inval(format!(
            "rereg_mr: flags {flags:#x}: need CHANGE_TRANSLATION, CHANGE_PD and/or CHANGE_ACCESS"
        ))));
    }
    // SAFETY: `p` is an MR of this library (C contract).
    let soft = unsafe { SoftMr::from_c(p) }.map_err(input)?;
    let move_pd = flags & IBV_REREG_MR_CHANGE_PD != 0;
    let target_pd = if move_pd { pd } else { soft.c.pd };
    // SAFETY: a PD of this library (C contract).
    let target = unsafe { SoftPd::from_c(target_pd) }.map_err(input)?;
    let translation = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
        if addr.is_null() || length == 0 {
            return Err(input(CError::inval(
                "rereg_mr: CHANGE_TRANSLATION needs an address and a length",
            )));
        }
        Some((addr.cast::<u8>(), length, addr as u64))
    } else {
        None
    };
    let new_access =
        (flags & IBV_REREG_MR_CHANGE_ACCESS != 0).then_some(Access(access as c_uint & !Access::OPTIONAL_MASK));
    let mr = p.cast::<SoftMr>();
    // SAFETY: `mr` is the caller's MR, which the C contract forbids using concurrently with
    // its re-registration; a new range stays valid until deregistration (ibv_rereg_mr's
    // contract).
    unsafe {
        target
            .pd
            .rereg_mr_raw(&mut (*mr).mr, move_pd, translation, new_access)
            .map_err(|e| (IBV_REREG_MR_ERR_CMD, CError::from(e)))?;
        (*mr).c.pd = target_pd;
        if let Some((a, len, _)) = translation {
            (*mr).c.addr = a.cast();
            (*mr).c.length = len;
        }
    }
    Ok(())
}

fn resize_cq(p: *mut ibv_cq, cqe: c_int) -> CResult<()> {
    // SAFETY: `p` is a CQ of this library (C contract).
    let soft = unsafe { SoftCq::from_c(p)? };
    let cqe = u32::try_from(cqe).map_err(|_| CError::inval(format!("resize_cq: cqe {cqe} is negative")))?;
    let max = with_context(soft.context(), |c| Ok(c.verbs().query_device().max_cqe.max(1) as u32))?;
    soft.cq.resize(cqe, max)?;
    // SAFETY: `cqe` of the header is the application's to read; written here only, under
    // the C contract that the CQ is not used concurrently with its resize.
    unsafe { (*soft.c.get()).cqe = c_int::try_from(soft.cq.capacity()).unwrap_or(c_int::MAX) };
    Ok(())
}

fn query_srq(p: *mut ibv_srq, attr: *mut ibv_srq_attr) -> CResult<()> {
    // SAFETY: `p` is an SRQ of this library (C contract).
    let soft = unsafe { SoftSrq::from_c(p)? };
    non_null(attr, "srq_attr")?;
    let a = soft.srq.query();
    // SAFETY: non-NULL; the caller's struct ibv_srq_attr.
    unsafe {
        attr.write(ibv_srq_attr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        })
    };
    Ok(())
}

fn modify_srq(p: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> CResult<()> {
    // SAFETY: `p` is an SRQ of this library (C contract).
    let soft = unsafe { SoftSrq::from_c(p)? };
    non_null(attr, "srq_attr")?;
    if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return Err(CError::inval(format!("modify_srq: unknown attr_mask bits {mask:#x}")));
    }
    // SAFETY: non-NULL; the caller's struct ibv_srq_attr.
    let a = unsafe { attr.read() };
    let max_wr = (mask & IBV_SRQ_MAX_WR != 0).then_some(a.max_wr);
    let limit = (mask & IBV_SRQ_LIMIT != 0).then_some(a.srq_limit);
    soft.srq.modify(max_wr, limit)?;
    Ok(())
}

c_fn! {
    /// `int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
    /// size_t length, int access)`: 0, or an `enum ibv_rereg_mr_err_code` with `errno`.
    fn ibv_rereg_mr(mr: *mut ibv_mr, flags: c_int, pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> c_int {
        match rereg_mr(mr, flags, pd, addr, length, access) {
            Ok(()) => 0,
            Err((code, e)) => {
                crate::error::report(e);
                code
            }
        }
    }

    /// `int ibv_resize_cq(struct ibv_cq *cq, int cqe)`: 0 or errno.
    fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
        ret_errno(resize_cq(cq, cqe))
    }

    /// `int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr)`.
    fn ibv_query_srq(srq: *mut ibv_srq, srq_attr: *mut ibv_srq_attr) -> c_int {
        ret_errno(query_srq(srq, srq_attr))
    }

    /// `int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int mask)`:
    /// `IBV_SRQ_MAX_WR` resizes, `IBV_SRQ_LIMIT` arms the limit event.
    fn ibv_modify_srq(srq: *mut ibv_srq, srq_attr: *mut ibv_srq_attr, srq_attr_mask: c_int) -> c_int {
        ret_errno(modify_srq(srq, srq_attr, srq_attr_mask))
    }

    /// `struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *, void *addr, size_t length,
    /// uint64_t iova, int access)`.
    fn ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr {
        ret_ptr(reg_mr(pd, addr, length, iova, access as c_uint))
    }

    /// `int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op,
    /// uint32_t flags)`: 0, "no in-order placement guarantee", which is what rdma-core answers
    /// for a provider without the query (Linux rxe and siw).
    fn ibv_query_qp_data_in_order(qp: *mut ibv_qp, _op: c_int, _flags: u32) -> c_int {
        // SAFETY: `qp` is a QP of this library (C contract); only checked.
        match unsafe { SoftQp::from_c(qp) } {
            Ok(_) => 0,
            Err(e) => {
                crate::error::report(e);
                0
            }
        }
    }
}
