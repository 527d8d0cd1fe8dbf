//! The smaller librdmacm calls: the device list (`rdma_get_devices` / `rdma_free_devices`),
//! an id's ports (`rdma_get_src_port` / `rdma_get_dst_port`), SRQs on an id
//! (`rdma_create_srq`, `rdma_create_srq_ex`, `rdma_destroy_srq`), `rdma_notify`, and ECE
//! (`rdma_set_local_ece`, `rdma_get_remote_ece`, `rdma_reject_ece`).

use std::ffi::{c_int, c_void};
use std::ptr;

use libc::{sockaddr_in, sockaddr_in6, sockaddr_storage};

use crate::abi::{ibv_context, ibv_pd, ibv_srq_init_attr, ibv_srq_init_attr_ex, rdma_cm_id};
use crate::cm::{destroy_id_cqs, device_handles, hget, hset, lock, reject, ucma_init, SoftCmId};
use crate::device::{current_devices, free_c_list, into_c_list};
use crate::error::{non_null, ret_neg1, ret_or, ret_ptr, CError, CResult};
use crate::objects::{create_srq, destroy_srq};

/// `struct ibv_ece`: `vendor_id`, `options`, `comp_mask`.
#[repr(C)]
#[derive(Clone, Copy)]
struct IbvEce {
    vendor_id: u32,
    options: u32,
    comp_mask: u32,
}

/// `IBV_EVENT_COMM_EST`, `IBV_EVENT_PATH_MIG`: what `rdma_notify` forwards to the CM.
const IBV_EVENT_COMM_EST: c_int = 4;
const IBV_EVENT_PATH_MIG: c_int = 6;
/// `enum ibv_srq_init_attr_mask`: `IBV_SRQ_INIT_ATTR_TYPE`, `_PD`, `_XRCD`, `_CQ`, `_TM`.
const SRQ_INIT_ATTR_TYPE: u32 = 1;
const SRQ_INIT_ATTR_PD: u32 = 2;
const SRQ_INIT_ATTR_XRCD: u32 = 4;
const SRQ_INIT_ATTR_CQ: u32 = 8;
const SRQ_INIT_ATTR_TM: u32 = 16;
/// `enum ibv_srq_type`: `IBV_SRQT_BASIC`.
const IBV_SRQT_BASIC: u32 = 0;

fn get_devices(num: *mut c_int) -> CResult<*mut *mut ibv_context> {
    ucma_init()?;
    let mut list = Vec::new();
    for dev in current_devices()? {
        list.push(device_handles(&dev.info())?.0);
    }
    if !num.is_null() {
        // SAFETY: non-NULL; the caller's int.
        unsafe { num.write(c_int::try_from(list.len()).unwrap_or(c_int::MAX)) };
    }
    Ok(into_c_list(list))
}

/// The port of `ss` in network byte order (0 if unbound), as librdmacm's `ucma_get_port`.
fn port_of(ss: &sockaddr_storage) -> CResult<u16> {
    match c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: an AF_INET storage holds a sockaddr_in.
            Ok(unsafe { ptr::from_ref(ss).cast::<sockaddr_in>().read() }.sin_port)
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 storage holds a sockaddr_in6.
            Ok(unsafe { ptr::from_ref(ss).cast::<sockaddr_in6>().read() }.sin6_port)
        }
        libc::AF_UNSPEC => Ok(0),
        f => Err(CError::new(libc::EINVAL, format!("address family {f} has no port"))),
    }
}

fn port(p: *mut rdma_cm_id, src: bool) -> CResult<u16> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    let ss = if src {
        hget!(soft, route.addr.src_storage)
    } else {
        hget!(soft, route.addr.dst_storage)
    };
    port_of(&ss)
}

fn create_srq_on_id(p: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> CResult<c_int> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    non_null(attr, "srq_init_attr")?;
    if !hget!(soft, srq).is_null() {
        return Err(CError::inval("rdma_create_srq: the id has an SRQ already"));
    }
    let pd = if pd.is_null() { hget!(soft, pd) } else { pd };
    if pd.is_null() {
        return Err(CError::inval(
            "rdma_create_srq: no PD given and the id has none (bind or resolve it first)",
        ));
    }
    let srq = create_srq(pd, attr)?;
    let _g = lock(&soft.update);
    hset!(soft, srq = srq);
    Ok(0)
}

fn create_srq_ex(p: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> CResult<c_int> {
    non_null(attr, "srq_init_attr_ex")?;
    // SAFETY: non-NULL; the caller's attributes (in/out).
    let a = unsafe { &mut *attr };
    let known = SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD | SRQ_INIT_ATTR_XRCD | SRQ_INIT_ATTR_CQ | SRQ_INIT_ATTR_TM;
    if a.comp_mask & !known != 0 {
        return Err(CError::inval(format!(
            "rdma_create_srq_ex: unknown comp_mask bits {:#x}",
            a.comp_mask
        )));
    }
    if a.comp_mask & SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != IBV_SRQT_BASIC {
        return Err(CError::unsupported(format!(
            "rdma_create_srq_ex: SRQ type {} (XRC or tag matching) is not supported (as by Linux rxe and siw)",
            a.srq_type
        )));
    }
    let pd = if a.comp_mask & SRQ_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        ptr::null_mut()
    };
    let mut basic = ibv_srq_init_attr {
        srq_context: a.srq_context,
        attr: crate::abi::ibv_srq_attr {
            max_wr: a.attr.max_wr,
            max_sge: a.attr.max_sge,
            srq_limit: a.attr.srq_limit,
        },
    };
    create_srq_on_id(p, pd, &mut basic)?;
    a.attr.max_wr = basic.attr.max_wr;
    a.attr.max_sge = basic.attr.max_sge;
    Ok(0)
}

fn destroy_srq_on_id(p: *mut rdma_cm_id) -> CResult<()> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    let srq = hget!(soft, srq);
    if srq.is_null() {
        return Err(CError::inval("rdma_destroy_srq: the id has no SRQ"));
    }
    destroy_srq(srq)?;
    {
        let _g = lock(&soft.update);
        hset!(soft, srq = ptr::null_mut());
    }
    // As librdmacm: CQs the id made for the SRQ go with it (none unless it made them).
    if soft.qp().is_null() {
        destroy_id_cqs(soft);
    }
    Ok(())
}

fn notify(p: *mut rdma_cm_id, event: c_int) -> CResult<c_int> {
    // SAFETY: `p` is an id of this library (C contract); only checked.
    unsafe { SoftCmId::from_c(p)? };
    match event {
        // The CM moves the connection on when its RTU arrives; a QP that saw data first has
        // nothing to wait for, so there is nothing to forward.
        IBV_EVENT_COMM_EST | IBV_EVENT_PATH_MIG => Ok(0),
        e => Err(CError::inval(format!(
            "rdma_notify: event {e} is not one the CM takes (IBV_EVENT_COMM_EST or IBV_EVENT_PATH_MIG)"
        ))),
    }
}

fn set_local_ece(p: *mut rdma_cm_id, ece: *mut IbvEce) -> CResult<c_int> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    non_null(ece, "ece")?;
    // SAFETY: non-NULL; the caller's struct ibv_ece.
    let e = unsafe { ece.read() };
    if e.vendor_id == 0 {
        return Err(CError::inval("rdma_set_local_ece: vendor_id is 0"));
    }
    *lock(&soft.local_ece) = Some((e.vendor_id, e.options));
    Ok(0)
}

fn get_remote_ece(p: *mut rdma_cm_id, ece: *mut IbvEce) -> CResult<c_int> {
    // SAFETY: `p` is an id of this library (C contract).
    unsafe { SoftCmId::from_c(p)? };
    non_null(ece, "ece")?;
    // No softrdma or Linux rxe/siw peer sends ECE options: the remote ECE is all zero.
    // SAFETY: non-NULL; the caller's struct ibv_ece.
    unsafe {
        ece.write(IbvEce {
            vendor_id: 0,
            options: 0,
            comp_mask: 0,
        })
    };
    Ok(0)
}

c_fn! {
    /// `struct ibv_context **rdma_get_devices(int *num_devices)`: librdmacm's contexts, one
    /// per device, NULL-terminated; free the array with `rdma_free_devices`.
    fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
        ret_ptr(get_devices(num_devices))
    }

    /// `void rdma_free_devices(struct ibv_context **list)`.
    fn rdma_free_devices(list: *mut *mut ibv_context) {
        // SAFETY: `list` came from rdma_get_devices (C contract); the contexts are
        // librdmacm's own and stay open.
        unsafe { free_c_list(list) }
    }

    /// `__be16 rdma_get_src_port(struct rdma_cm_id *id)`: 0 if unbound or on error.
    fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
        ret_or(port(id, true), 0)
    }

    /// `__be16 rdma_get_dst_port(struct rdma_cm_id *id)`: 0 if unresolved or on error.
    fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
        ret_or(port(id, false), 0)
    }

    /// `int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)`:
    /// an SRQ on `pd` (the id's PD if NULL), stored in `id->srq`.
    fn rdma_create_srq(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> c_int {
        ret_neg1(create_srq_on_id(id, pd, attr))
    }

    /// `int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)`.
    fn rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> c_int {
        ret_neg1(create_srq_ex(id, attr))
    }

    /// `void rdma_destroy_srq(struct rdma_cm_id *id)`.
    fn rdma_destroy_srq(id: *mut rdma_cm_id) {
        if let Err(e) = destroy_srq_on_id(id) {
            crate::error::report(e);
        }
    }

    /// `int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)`.
    fn rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
        ret_neg1(notify(id, event))
    }

    /// `int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)`.
    fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
        ret_neg1(set_local_ece(id, ece.cast()))
    }

    /// `int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)`: all zero, the
    /// peer sent no ECE options.
    fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
        ret_neg1(get_remote_ece(id, ece.cast()))
    }

    /// `int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t len)`:
    /// rejects the request as `rdma_reject` does (no softrdma peer sends ECE options, so none
    /// can be the reason).
    fn rdma_reject_ece(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> c_int {
        ret_neg1(reject(id, private_data, private_data_len))
    }
}
