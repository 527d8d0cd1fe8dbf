//! Memory windows: the `ibv_context.ops` slots `alloc_mw`, `dealloc_mw` and `bind_mw` behind
//! the inline `ibv_alloc_mw`, `ibv_dealloc_mw` and `ibv_bind_mw`, and the BIND_MW / LOCAL_INV
//! pieces of the send path. Soft-RoCE devices have them (types 1 and 2, as Linux rxe);
//! soft-iWARP devices do not (EOPNOTSUPP, as siw).

use std::ffi::c_int;
use std::mem::offset_of;
use std::ptr;

use softrdma_verbs::device::TransportKind;
use softrdma_verbs::mw::{Mw, MwType};
use softrdma_verbs::wr::{MwBind, SendFlags, SendWr, WrOpcode};
use softrdma_verbs::Access;

use crate::abi::{ibv_mw, ibv_mw_bind, ibv_mw_bind_info, ibv_pd, ibv_qp};
use crate::error::{non_null, ret_errno, ret_ptr, CError, CResult};
use crate::objects::{c_object, SoftMr, SoftPd, SoftQp};

/// `struct ibv_mw` plus the verbs window.
#[repr(C)]
pub(crate) struct SoftMw {
    c: std::cell::UnsafeCell<ibv_mw>,
    mw: Mw,
}
c_object!(SoftMw, ibv_mw, "mw");

impl SoftMw {
    fn rkey(&self) -> u32 {
        // SAFETY: a plain read of the header's rkey (written by this module only).
        unsafe { ptr::addr_of!((*self.c.get()).rkey).read() }
    }

    fn set_rkey(&self, rkey: u32) {
        // SAFETY: the application may not use the window concurrently with its bind (C
        // contract); rkey is written here only.
        unsafe { ptr::addr_of_mut!((*self.c.get()).rkey).write(rkey) }
    }
}

/// `ibv_inc_rkey`: the same index, the next 8-bit tag.
fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

fn alloc_mw(pd: *mut ibv_pd, mw_type: c_int) -> CResult<*mut ibv_mw> {
    // SAFETY: `pd` is a PD of this library (C contract).
    let soft_pd = unsafe { SoftPd::from_c(pd)? };
    let t = match mw_type {
        1 => MwType::Type1,
        2 => MwType::Type2,
        other => {
            return Err(CError::inval(format!(
                "alloc_mw: {other} is not a memory window type (1 or 2)"
            )))
        }
    };
    if soft_pd.pd.context().device().transport != TransportKind::Roce {
        return Err(CError::unsupported(
            "alloc_mw: soft-iWARP devices have no memory windows (as Linux siw)",
        ));
    }
    let mw = Mw::alloc(&soft_pd.pd, t)?;
    let c = ibv_mw {
        context: soft_pd.context(),
        pd,
        rkey: mw.initial_rkey(),
        handle: 0,
        r#type: mw_type as u32,
    };
    Ok(SoftMw {
        c: std::cell::UnsafeCell::new(c),
        mw,
    }
    .into_c())
}

fn dealloc_mw(p: *mut ibv_mw) -> CResult<()> {
    // SAFETY: `p` is a window of this library (C contract); C gives it up with this call.
    unsafe { SoftMw::from_c(p)? };
    // SAFETY: as above.
    drop(unsafe { SoftMw::from_c_owned(p) });
    Ok(())
}

/// The verbs bind of window `mw` (taking key `new_rkey`) over `info`.
///
/// # Safety
/// `info.mr` is NULL or an MR of this library (C contract).
unsafe fn bind_of(mw: &SoftMw, new_rkey: u32, info: &ibv_mw_bind_info) -> CResult<MwBind> {
    let (mr_lkey, mw_pd) = if info.length == 0 {
        (0, mw.mw.pd_id())
    } else {
        // SAFETY: per the contract.
        let mr = unsafe { SoftMr::from_c(info.mr)? };
        (mr.c.lkey, mw.mw.pd_id())
    };
    Ok(MwBind {
        mw_rkey: mw.rkey(),
        new_rkey,
        mr_lkey,
        addr: info.addr,
        length: info.length,
        access: Access(info.mw_access_flags),
        mw_type: mw.mw.mw_type as u8,
        mw_pd,
    })
}

/// The BIND_MW fields of a send WR (`wr.bind_mw`) as a verbs bind.
///
/// # Safety
/// `mw` and `info.mr` are windows/MRs of this library (C contract).
pub(crate) unsafe fn send_wr_bind(mw: *mut ibv_mw, rkey: u32, info: &ibv_mw_bind_info) -> CResult<MwBind> {
    // SAFETY: per the contract.
    let soft = unsafe { SoftMw::from_c(mw)? };
    if soft.mw.mw_type != MwType::Type2 {
        return Err(CError::inval(
            "a BIND_MW work request binds type-2 windows; use ibv_bind_mw for type 1",
        ));
    }
    // SAFETY: per the contract.
    unsafe { bind_of(soft, rkey, info) }
}

/// `ibv_bind_mw` (type 1): posts a BIND_MW WR with the next key; `mw->rkey` is the new key
/// once it is posted, as rdma-core's rxe provider does.
fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> CResult<()> {
    // SAFETY: `qp` and `mw` are objects of this library (C contract).
    let (soft_qp, soft_mw) = unsafe { (SoftQp::from_c(qp)?, SoftMw::from_c(mw)?) };
    non_null(mw_bind, "mw_bind")?;
    // SAFETY: non-NULL; the caller's struct ibv_mw_bind.
    let b = unsafe { mw_bind.read() };
    if soft_mw.mw.mw_type != MwType::Type1 {
        return Err(CError::inval(
            "ibv_bind_mw binds type-1 windows; bind type 2 with a BIND_MW work request",
        ));
    }
    let new_rkey = inc_rkey(soft_mw.rkey());
    // SAFETY: `bind_info.mr` is an MR of this library or NULL for an unbind (C contract).
    let bind = unsafe { bind_of(soft_mw, new_rkey, &b.bind_info)? };
    let wr = SendWr {
        wr_id: b.wr_id,
        opcode: Some(WrOpcode::BindMw),
        flags: SendFlags(b.send_flags),
        bind: Some(bind),
        ..SendWr::default()
    };
    soft_qp.qp.post_send(&[wr]).map_err(|(_, e)| CError::from(e))?;
    soft_mw.set_rkey(new_rkey);
    Ok(())
}

c_fn! {
    /// `ops.alloc_mw`: a window of type 1 or 2 (EINVAL for another type, EOPNOTSUPP on iWARP).
    fn ctx_alloc_mw(pd: *mut ibv_pd, mw_type: c_int) -> *mut ibv_mw {
        ret_ptr(alloc_mw(pd, mw_type))
    }

    /// `ops.dealloc_mw`: frees the window; a bound one stops granting access at once.
    fn ctx_dealloc_mw(mw: *mut ibv_mw) -> c_int {
        ret_errno(dealloc_mw(mw))
    }

    /// `ops.bind_mw`: 0 or errno.
    fn ctx_bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int {
        ret_errno(bind_mw(qp, mw, mw_bind))
    }
}
