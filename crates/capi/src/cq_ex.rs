//! Extended CQs: `ibv_create_cq_ex` (the `verbs_context.create_cq_ex` slot) and the polling
//! interface of `struct ibv_cq_ex`: `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll`
//! take one completion at a time into the CQ, whose `wr_id` and `status` the header shows and
//! whose other fields the `ibv_wc_read_*` getters return.

use std::ffi::{c_int, c_uint};
use std::sync::{Mutex, MutexGuard, PoisonError};

use softrdma_verbs::WorkCompletion;

use crate::abi::{ibv_context, ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_poll_cq_attr};
use crate::error::{non_null, ret_ptr, CError, CResult};
use crate::objects::{create_cq_with, SoftCq};

/// `enum ibv_create_cq_wc_flags` this CQ can report: byte_len, imm_data, qp_num, src_qp,
/// slid, sl, dlid_path_bits (slid and dlid_path_bits are 0 on Ethernet ports; sl, see
/// `WorkCompletion::sl`).
const SUPPORTED_WC_FLAGS: u64 = 0x7f;
/// `enum ibv_cq_init_attr_mask`: `IBV_CQ_INIT_ATTR_MASK_FLAGS`, `_PD`.
const MASK_FLAGS: u32 = 1;
const MASK_PD: u32 = 2;
/// `enum ibv_create_cq_attr_flags`: `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`.
const SINGLE_THREADED: u32 = 1;

/// The completion an extended CQ is positioned on.
pub(crate) struct PollState {
    current: Mutex<Option<WorkCompletion>>,
}

impl PollState {
    fn lock(&self) -> MutexGuard<'_, Option<WorkCompletion>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sets the polling slots of an extended CQ's header.
pub(crate) fn fill_ops(c: &mut ibv_cq_ex) {
    c.start_poll = Some(start_poll);
    c.next_poll = Some(next_poll);
    c.end_poll = Some(end_poll);
    c.read_opcode = Some(read_opcode);
    c.read_vendor_err = Some(read_vendor_err);
    c.read_byte_len = Some(read_byte_len);
    c.read_imm_data = Some(read_imm_data);
    c.read_qp_num = Some(read_qp_num);
    c.read_src_qp = Some(read_src_qp);
    c.read_wc_flags = Some(read_wc_flags);
    c.read_slid = Some(read_slid);
    c.read_sl = Some(read_sl);
    c.read_dlid_path_bits = Some(read_dlid_path_bits);
}

/// # Safety
/// `cq` is an extended CQ of this library (the inline functions called through its header).
unsafe fn soft<'a>(cq: *mut ibv_cq_ex) -> &'a SoftCq {
    // SAFETY: per the contract, the header is the first field of a live SoftCq.
    unsafe { &*cq.cast::<SoftCq>() }
}

/// Positions the CQ on its next completion: 0, or ENOENT when there is none.
fn advance(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: called through this CQ's header.
    let s = unsafe { soft(cq) };
    let Some(ex) = &s.ex else { return libc::EINVAL };
    let mut cur = ex.lock();
    *cur = s.cq.poll_one();
    match *cur {
        Some(wc) => {
            // SAFETY: the header's wr_id and status are ours to write while the application
            // polls (it reads them between the poll calls).
            unsafe {
                (*cq).wr_id = wc.wr_id;
                (*cq).status = wc.status as u32;
            }
            0
        }
        None => libc::ENOENT,
    }
}

/// The current completion's field, or 0 outside a poll.
fn read<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&WorkCompletion) -> T) -> T {
    // SAFETY: called through this CQ's header.
    let s = unsafe { soft(cq) };
    s.ex.as_ref()
        .and_then(|ex| ex.lock().as_ref().map(f))
        .unwrap_or_default()
}

fn create_cq_ex(ctx: *mut ibv_context, attr: *mut ibv_cq_init_attr_ex) -> CResult<*mut ibv_cq_ex> {
    non_null(attr, "cq_init_attr_ex")?;
    // SAFETY: non-NULL; the caller's struct ibv_cq_init_attr_ex.
    let a = unsafe { &*attr };
    if a.comp_mask & !(MASK_FLAGS | MASK_PD) != 0 {
        return Err(CError::inval(format!(
            "create_cq_ex: unknown comp_mask bits {:#x}",
            a.comp_mask
        )));
    }
    if a.comp_mask & MASK_PD != 0 {
        return Err(CError::unsupported(
            "create_cq_ex: parent domains are not supported (as by Linux rxe and siw)",
        ));
    }
    if a.comp_mask & MASK_FLAGS != 0 && a.flags & !SINGLE_THREADED != 0 {
        return Err(CError::unsupported(format!(
            "create_cq_ex: flags {:#x} (only IBV_CREATE_CQ_ATTR_SINGLE_THREADED is supported)",
            a.flags
        )));
    }
    if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        return Err(CError::unsupported(format!(
            "create_cq_ex: wc_flags {:#x}: timestamps, CVLAN, flow tags and tag matching are not reported (supported: {SUPPORTED_WC_FLAGS:#x})",
            a.wc_flags
        )));
    }
    if a.comp_vector != 0 {
        return Err(CError::inval(format!(
            "create_cq_ex: comp_vector {} does not exist (num_comp_vectors is 1)",
            a.comp_vector
        )));
    }
    let cqe = c_int::try_from(a.cqe).map_err(|_| CError::inval(format!("create_cq_ex: cqe {} is too large", a.cqe)))?;
    let state = PollState {
        current: Mutex::new(None),
    };
    let cq: *mut ibv_cq = create_cq_with(ctx, cqe, a.cq_context, a.channel, Some(state))?;
    Ok(cq.cast())
}

c_fn! {
    /// `verbs_context.create_cq_ex`, behind the inline `ibv_create_cq_ex`.
    fn vctx_create_cq_ex(context: *mut ibv_context, cq_attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
        ret_ptr(create_cq_ex(context, cq_attr))
    }

    /// `ibv_start_poll`: 0, ENOENT when the CQ is empty, EINVAL for unknown `attr` bits.
    fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
        // SAFETY: NULL or the caller's struct ibv_poll_cq_attr.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return libc::EINVAL;
        }
        advance(cq)
    }

    /// `ibv_next_poll`: 0 or ENOENT.
    fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
        advance(cq)
    }

    /// `ibv_end_poll`.
    fn end_poll(cq: *mut ibv_cq_ex) {
        // SAFETY: called through this CQ's header.
        if let Some(ex) = &unsafe { soft(cq) }.ex {
            *ex.lock() = None;
        }
    }

    /// `ibv_wc_read_opcode`.
    fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
        read(cq, |w| w.opcode as u32)
    }

    /// `ibv_wc_read_vendor_err`.
    fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
        read(cq, |w| w.vendor_err)
    }

    /// `ibv_wc_read_byte_len`.
    fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
        read(cq, |w| w.byte_len)
    }

    /// `ibv_wc_read_imm_data` (also the invalidated rkey of a SEND_WITH_INV).
    fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
        read(cq, |w| w.imm_data)
    }

    /// `ibv_wc_read_qp_num`.
    fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
        read(cq, |w| w.qp_num)
    }

    /// `ibv_wc_read_src_qp`.
    fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
        read(cq, |w| w.src_qp)
    }

    /// `ibv_wc_read_wc_flags`.
    fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
        read(cq, |w| w.wc_flags)
    }

    /// `ibv_wc_read_slid`: 0 (Ethernet ports have no LIDs).
    fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
        read(cq, |_| 0)
    }

    /// `ibv_wc_read_sl`: 0, or a RoCE UD receive's L3 header type (see `WorkCompletion::sl`).
    fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
        read(cq, |w| w.sl)
    }

    /// `ibv_wc_read_dlid_path_bits`: 0.
    fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
        read(cq, |_| 0)
    }
}
