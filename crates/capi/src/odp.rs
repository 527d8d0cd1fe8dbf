//! On-demand paging. A kernel driver pins an MR's pages unless it is registered with
//! `IBV_ACCESS_ON_DEMAND`, and then resolves page faults as the device touches them.
//! softrdma never pins: every MR is read and written through the process's own mappings,
//! so the kernel faults pages in on first touch, exactly what ODP promises. The device
//! therefore reports ODP for every operation (`odp_caps`), accepts ON_DEMAND registrations
//! as ordinary ones, and `ibv_advise_mr` has nothing to prefetch: it checks its SGEs and
//! returns. Implicit ODP (one MR over the whole address space) is not offered: a peer could
//! then name any address, and an unmapped one would fault inside the library.

use std::ffi::c_int;

use softrdma_verbs::device::TransportKind;

use crate::abi::{ibv_odp_caps, ibv_odp_caps_per_transport, ibv_pd, ibv_sge};
use crate::error::{ret_errno, CError, CResult};
use crate::objects::SoftPd;

/// `enum ibv_odp_general_caps`: `IBV_ODP_SUPPORT`.
const ODP_SUPPORT: u64 = 1;
/// `enum ibv_odp_transport_cap_bits`.
const SEND: u32 = 1;
const RECV: u32 = 2;
const WRITE: u32 = 4;
const READ: u32 = 8;
const ATOMIC: u32 = 16;
const SRQ_RECV: u32 = 32;

/// `ibv_device_attr_ex.odp_caps` of a device of `transport`: every operation its QPs have.
pub(crate) fn odp_caps(transport: TransportKind) -> ibv_odp_caps {
    let per_transport_caps = match transport {
        TransportKind::Roce => ibv_odp_caps_per_transport {
            rc_odp_caps: SEND | RECV | WRITE | READ | ATOMIC | SRQ_RECV,
            uc_odp_caps: SEND | RECV | WRITE | SRQ_RECV,
            ud_odp_caps: SEND | RECV | SRQ_RECV,
        },
        TransportKind::Iwarp => ibv_odp_caps_per_transport {
            rc_odp_caps: SEND | RECV | WRITE | READ | SRQ_RECV,
            uc_odp_caps: 0,
            ud_odp_caps: 0,
        },
    };
    ibv_odp_caps {
        general_caps: ODP_SUPPORT,
        per_transport_caps,
    }
}

/// `enum ibv_advise_mr_advice`: PREFETCH, PREFETCH_WRITE, PREFETCH_NO_FAULT.
const ADVICE_MAX: u32 = 2;
/// `IBV_ADVISE_MR_FLAG_FLUSH`.
const FLAG_FLUSH: u32 = 1;

fn advise_mr(pd: *mut ibv_pd, advice: u32, flags: u32, sg_list: *mut ibv_sge, num_sge: u32) -> CResult<()> {
    // SAFETY: `pd` is a PD of this library (C contract).
    let soft = unsafe { SoftPd::from_c(pd)? };
    if advice > ADVICE_MAX {
        return Err(CError::inval(format!("advise_mr: unknown advice {advice}")));
    }
    if flags & !FLAG_FLUSH != 0 {
        return Err(CError::inval(format!("advise_mr: unknown flags {flags:#x}")));
    }
    if num_sge == 0 || sg_list.is_null() {
        return Err(CError::inval("advise_mr: no SGEs"));
    }
    // SAFETY: the caller's array of `num_sge` SGEs (C contract).
    let sges = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
    for s in sges {
        softrdma_verbs::mr::check_local(s.lkey, soft.pd.id(), s.addr, u64::from(s.length), false)
            .map_err(|e| CError::inval(format!("advise_mr: lkey {:#x}: {e}", s.lkey)))?;
    }
    Ok(())
}

c_fn! {
    /// `verbs_context.advise_mr`, behind the inline `ibv_advise_mr`: 0 (nothing is pinned,
    /// so nothing needs prefetching), or the errno of a bad argument.
    fn vctx_advise_mr(pd: *mut ibv_pd, advice: u32, flags: u32, sg_list: *mut ibv_sge, num_sge: u32) -> c_int {
        ret_errno(advise_mr(pd, advice, flags, sg_list, num_sge))
    }
}
