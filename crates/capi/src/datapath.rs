//! The data path: the `ibv_context.ops` callbacks that the headers' inline functions
//! (`ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_post_send`, `ibv_post_recv`,
//! `ibv_post_srq_recv`) call without a NULL check.
//!
//! Each callback casts the object pointer straight to its soft object (no registry lookup),
//! converts the C work requests of the `next` chain, and posts them in one call. On failure
//! `*bad_wr` names the first WR that was not posted and the return value is the errno value
//! (not -1), as rdma-core's providers do; the WRs before it are posted. A UD send WR must name
//! a live AH of the QP's PD in `wr.ud.ah` (its attributes are copied into the WR).

use std::ffi::c_int;
use std::ptr;

use softrdma_verbs::wr::{RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrOpcode};
use softrdma_verbs::QpType;

use crate::abi::{ibv_context_ops, ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, ibv_wc};
use crate::error::{ret_errno, write_out, CError, CResult};
use crate::objects::{SoftCq, SoftQp, SoftSrq};

/// The `ibv_context.ops` table of every context: the data-path slots point at the callbacks
/// below, the memory-window slots at `mw`; the `_compat_*` slots are unused by current
/// binaries.
pub(crate) fn context_ops() -> ibv_context_ops {
    let mut ops = ibv_context_ops::zeroed();
    ops.poll_cq = Some(ibv_poll_cq);
    ops.req_notify_cq = Some(ibv_req_notify_cq);
    ops.post_srq_recv = Some(ibv_post_srq_recv);
    ops.post_send = Some(ibv_post_send);
    ops.post_recv = Some(ibv_post_recv);
    ops.alloc_mw = Some(crate::mw::ctx_alloc_mw);
    ops.dealloc_mw = Some(crate::mw::ctx_dealloc_mw);
    ops.bind_mw = Some(crate::mw::ctx_bind_mw);
    ops
}

/// Completions taken from the verbs CQ per batch.
const POLL_BATCH: usize = 16;

fn wc_to_c(w: &WorkCompletion) -> ibv_wc {
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: w.imm_data,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags,
        pkey_index: w.pkey_index,
        slid: 0,
        sl: w.sl,
        dlid_path_bits: 0,
    }
}

fn poll_cq(cq: &SoftCq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    let Ok(want) = usize::try_from(num_entries) else {
        return -libc::EINVAL;
    };
    if want > 0 && wc.is_null() {
        return -libc::EINVAL;
    }
    if cq.cq.is_stale() {
        // Inherited through fork: the parent's threads fill it, not this process's.
        crate::error::report(CError::from(softrdma_verbs::fork::stale_error("ibv_poll_cq")));
        return -libc::EIO;
    }
    let mut batch = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); POLL_BATCH];
    let mut done = 0;
    while done < want {
        let n = cq.cq.poll(&mut batch[..(want - done).min(POLL_BATCH)]);
        for (i, w) in batch[..n].iter().enumerate() {
            // SAFETY: the caller's array holds `num_entries` > done + i entries.
            unsafe { wc.add(done + i).write(wc_to_c(w)) };
        }
        done += n;
        if n < POLL_BATCH {
            break;
        }
    }
    c_int::try_from(done).unwrap_or(c_int::MAX)
}

/// The SGEs of a C work request.
///
/// # Safety
/// `sg_list` points to `num_sge` readable `struct ibv_sge` (or `num_sge` is 0).
unsafe fn sges(sg_list: *const ibv_sge, num_sge: c_int) -> CResult<Vec<Sge>> {
    let n = usize::try_from(num_sge).map_err(|_| CError::inval(format!("num_sge {num_sge} is negative")))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if sg_list.is_null() {
        return Err(CError::inval(format!("sg_list is NULL with num_sge {n}")));
    }
    // SAFETY: per the contract, `n` SGEs are readable.
    let list = unsafe { std::slice::from_raw_parts(sg_list, n) };
    Ok(list
        .iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect())
}

/// One C send WR as a verbs WR for `qp`. Only the fields its opcode (and, for UD, the QP type)
/// uses are read (applications leave the others uninitialised).
///
/// # Safety
/// `wr` points to a readable `struct ibv_send_wr` whose SG list is readable.
unsafe fn send_wr_from_c(wr: *const ibv_send_wr, qp: &SoftQp) -> CResult<SendWr> {
    // SAFETY: per the contract; plain field reads.
    let (wr_id, sg_list, num_sge, opcode, flags) = unsafe {
        (
            (*wr).wr_id,
            (*wr).sg_list,
            (*wr).num_sge,
            (*wr).opcode,
            (*wr).send_flags,
        )
    };
    let op = WrOpcode::from_u32(opcode);
    let mut out = SendWr {
        wr_id,
        opcode: op,
        // SAFETY: per the contract.
        sg_list: unsafe { sges(sg_list, num_sge)? },
        flags: SendFlags(flags),
        ..SendWr::default()
    };
    match op {
        Some(WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead) => {
            // SAFETY: RDMA opcodes use the `wr.rdma` member of the union.
            let rdma = unsafe { (*wr).wr.rdma };
            out.remote_addr = rdma.remote_addr;
            out.rkey = rdma.rkey;
        }
        Some(WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd) => {
            // SAFETY: atomic opcodes use the `wr.atomic` member of the union.
            let atomic = unsafe { (*wr).wr.atomic };
            out.remote_addr = atomic.remote_addr;
            out.rkey = atomic.rkey;
            out.compare_add = atomic.compare_add;
            out.swap = atomic.swap;
        }
        _ => {}
    }
    let inner = qp.qp.inner();
    if inner.qp_type == QpType::Ud {
        // SAFETY: a send WR on a UD QP uses the `wr.ud` member of the union.
        let ud = unsafe { (*wr).wr.ud };
        let dest = crate::ah::ud_dest(ud.ah, inner.pd.id(), ud.remote_qpn, ud.remote_qkey)
            .map_err(|why| CError::inval(format!("post_send on QP {}: WR {wr_id:#x}: {why}", inner.qpn)))?;
        out.ud = Some(dest);
    }
    match op {
        // SAFETY: these opcodes carry `imm_data` (big-endian, passed through unchanged).
        Some(WrOpcode::RdmaWriteWithImm | WrOpcode::SendWithImm) => out.imm_data = unsafe { (*wr).imm_data },
        // SAFETY: SEND_WITH_INV and LOCAL_INV carry `invalidate_rkey` in the same union
        // (host order).
        Some(WrOpcode::SendWithInv | WrOpcode::LocalInv) => out.invalidate_rkey = unsafe { (*wr).imm_data },
        Some(WrOpcode::BindMw) => {
            // SAFETY: BIND_MW uses the `bind_mw` member of the trailing union.
            let b = unsafe { (*wr).bind_mw.bind_mw };
            // SAFETY: the WR names a window and an MR of this library (C contract).
            out.bind = Some(unsafe { crate::mw::send_wr_bind(b.mw, b.rkey, &b.bind_info)? });
        }
        _ => {}
    }
    Ok(out)
}

/// Walks a C WR chain from `first`, converting each element with `conv` until one fails;
/// `next_of` reads an element's `next` field. At most `limit` elements are taken (the queue's
/// capacity: no list can be posted whole beyond it): a longer list, a cyclic one
/// (`wr.next = &wr`) included, stops there with ENOMEM naming `what` and the first element
/// not taken, as a full queue does, instead of allocating without bound.
fn walk<C, R>(
    first: *mut C,
    limit: usize,
    what: impl Fn() -> String,
    next_of: impl Fn(*mut C) -> *mut C,
    conv: impl Fn(*mut C) -> CResult<R>,
) -> (Vec<*mut C>, Vec<R>, Option<(*mut C, CError)>) {
    let mut ptrs = Vec::new();
    let mut wrs = Vec::new();
    let mut p = first;
    while !p.is_null() {
        if wrs.len() >= limit {
            let e = CError::new(
                libc::ENOMEM,
                format!(
                    "{}: the WR list is longer than the queue's {limit} entries (or cyclic)",
                    what()
                ),
            );
            return (ptrs, wrs, Some((p, e)));
        }
        match conv(p) {
            Ok(w) => {
                ptrs.push(p);
                wrs.push(w);
            }
            Err(e) => return (ptrs, wrs, Some((p, e))),
        }
        p = next_of(p);
    }
    (ptrs, wrs, None)
}

/// Posts the converted prefix with `post`; reports the first unposted WR through `bad_wr`.
fn finish<C, R>(
    ptrs: &[*mut C],
    wrs: &[R],
    conv_err: Option<(*mut C, CError)>,
    bad_wr: *mut *mut C,
    post: impl FnOnce(&[R]) -> Result<(), (usize, softrdma_verbs::Error)>,
) -> c_int {
    let r = match post(wrs) {
        Err((i, e)) => Err((ptrs.get(i).copied().unwrap_or(ptr::null_mut()), CError::from(e))),
        Ok(()) => conv_err.map_or(Ok(()), Err),
    };
    ret_errno(r.map_err(|(bad, e)| {
        // SAFETY: `bad_wr` is NULL or the caller's out-pointer (C contract).
        unsafe { write_out(bad_wr, bad) };
        e
    }))
}

fn send_next(wr: *mut ibv_send_wr) -> *mut ibv_send_wr {
    // SAFETY: `wr` is a readable element of the caller's chain (C contract).
    unsafe { (*wr).next }
}

fn send_conv(wr: *mut ibv_send_wr, qp: &SoftQp) -> CResult<SendWr> {
    // SAFETY: `wr` is a readable element of the caller's chain, with readable SGEs (C contract).
    unsafe { send_wr_from_c(wr, qp) }
}

fn recv_wr_from_c(wr: *mut ibv_recv_wr) -> CResult<RecvWr> {
    // SAFETY: `wr` is a readable element of the caller's chain (C contract).
    let (wr_id, sg_list, num_sge) = unsafe { ((*wr).wr_id, (*wr).sg_list, (*wr).num_sge) };
    Ok(RecvWr {
        wr_id,
        // SAFETY: the WR's SG list is readable (C contract).
        sg_list: unsafe { sges(sg_list, num_sge)? },
    })
}

fn recv_next(wr: *mut ibv_recv_wr) -> *mut ibv_recv_wr {
    // SAFETY: `wr` is a readable element of the caller's chain (C contract).
    unsafe { (*wr).next }
}

c_fn! {
    /// `ops.poll_cq`: the number of completions written (0..=num_entries), or a negative
    /// errno value.
    fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
        // SAFETY: the inline ibv_poll_cq already dereferenced `cq`, one of our CQs.
        poll_cq(unsafe { &*cq.cast::<SoftCq>() }, num_entries, wc)
    }

    /// `ops.req_notify_cq`: 0 or errno. Arming a CQ without a completion channel succeeds
    /// and has no effect, as with rdma-core's providers.
    fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
        // SAFETY: the inline ibv_req_notify_cq already dereferenced `cq`, one of our CQs.
        let cq = unsafe { &*cq.cast::<SoftCq>() };
        if !cq.has_channel() {
            return 0;
        }
        ret_errno(cq.cq.req_notify(solicited_only != 0).map_err(CError::from))
    }

    /// `ops.post_send`: 0, or errno with `*bad_wr` = the first WR not posted.
    fn ibv_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
        // SAFETY: the inline ibv_post_send already dereferenced `qp`, one of our QPs.
        let qp = unsafe { &*qp.cast::<SoftQp>() };
        let cap = qp.qp.inner().cap.max_send_wr as usize;
        let what = || format!("post_send on QP {}", qp.qp.qpn());
        let (ptrs, wrs, conv_err) = walk(wr, cap, what, send_next, |w| send_conv(w, qp));
        finish(&ptrs, &wrs, conv_err, bad_wr, |w| {
            // SAFETY: inline SGEs point at memory the caller keeps readable during the call
            // (IBV_SEND_INLINE contract).
            unsafe { qp.qp.post_send_raw(w) }
        })
    }

    /// `ops.post_recv`: 0, or errno with `*bad_wr` = the first WR not posted.
    fn ibv_post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
        // SAFETY: the inline ibv_post_recv already dereferenced `qp`, one of our QPs.
        let qp = unsafe { &*qp.cast::<SoftQp>() };
        let cap = qp.qp.inner().cap.max_recv_wr as usize;
        let what = || format!("post_recv on QP {}", qp.qp.qpn());
        let (ptrs, wrs, conv_err) = walk(wr, cap, what, recv_next, recv_wr_from_c);
        finish(&ptrs, &wrs, conv_err, bad_wr, |w| qp.qp.post_recv(w))
    }

    /// `ops.post_srq_recv`: 0, or errno with `*bad_wr` = the first WR not posted.
    fn ibv_post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
        // SAFETY: the inline ibv_post_srq_recv already dereferenced `srq`, one of our SRQs.
        let srq = unsafe { &*srq.cast::<SoftSrq>() };
        let cap = srq.srq.query().max_wr as usize;
        let what = || "post_srq_recv".to_string();
        let (ptrs, wrs, conv_err) = walk(wr, cap, what, recv_next, recv_wr_from_c);
        finish(&ptrs, &wrs, conv_err, bad_wr, |w| srq.srq.post_recv(w))
    }
}
