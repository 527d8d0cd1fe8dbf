//! Opened devices: `ibv_open_device`, `ibv_close_device` and the query calls
//! (`ibv_query_device`, `ibv_query_port`, `ibv_query_gid`, `_ibv_query_gid_ex`,
//! `_ibv_query_gid_table`, `ibv_query_gid_type`, `ibv_query_pkey`).
//!
//! A context is a [`SoftContext`]: a full `struct verbs_context` first (so the
//! `struct ibv_context *` handed to C sits at offset 320 and `verbs_get_ctx()` finds the
//! extended ops in front of it), then the Rust state. `abi_compat` is `__VERBS_ABI_IS_EXTENDED`
//! and `sz` is 648; the extended slots set are `query_port` (the headers' `ibv_query_port`
//! macro calls it with `sizeof(struct ibv_port_attr)`) and `query_device_ex`. Every other
//! extended slot is NULL, which the inline functions treat as "not supported".

use std::ffi::{c_int, c_uint};
use std::mem::{offset_of, size_of};
use std::ptr;
use std::sync::{Mutex, PoisonError};

use softrdma_verbs::device::{DeviceAttr, GidType, PortAttr};
use softrdma_verbs::Context;

use crate::abi::{
    _compat_ibv_port_attr, ibv_context, ibv_device, ibv_device_attr, ibv_device_attr_ex, ibv_gid, ibv_gid_entry,
    ibv_port_attr, ibv_query_device_ex_input, verbs_context, COMPAT_PORT_ATTR_LEN, IBV_GID_TYPE_IB,
    IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2, IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2,
    VERBS_ABI_IS_EXTENDED,
};
use crate::datapath::context_ops;
use crate::device::{fill_c_chars, lookup};
use crate::error::{non_null, ret_errno, ret_neg1, ret_ptr, CError, CResult};

/// An open device context.
#[repr(C)]
pub(crate) struct SoftContext {
    /// Must stay the first field: C sees `&vctx.context`.
    vctx: verbs_context,
    verbs: Context,
}

const _: () = assert!(offset_of!(SoftContext, vctx) == 0);

impl SoftContext {
    /// The verbs context.
    pub(crate) fn verbs(&self) -> &Context {
        &self.verbs
    }
}
/// Offset of the `struct ibv_context` handed to C inside a [`SoftContext`].
const IBV_CONTEXT_OFFSET: usize = offset_of!(SoftContext, vctx) + offset_of!(verbs_context, context);

/// Addresses of the `struct ibv_context`s of open contexts, per fork generation: a forked
/// child sees none of the parent's contexts as open (see `softrdma_verbs::fork`).
static OPEN: softrdma_verbs::fork::PerProcess<Mutex<Vec<usize>>> = softrdma_verbs::fork::PerProcess::new();

fn open_contexts() -> std::sync::MutexGuard<'static, Vec<usize>> {
    OPEN.get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on the open context behind `ctx`; EINVAL if `ctx` is not an open context of this
/// library. The context cannot be closed while `f` runs.
pub(crate) fn with_context<R>(ctx: *mut ibv_context, f: impl FnOnce(&SoftContext) -> CResult<R>) -> CResult<R> {
    non_null(ctx, "context")?;
    let open = open_contexts();
    if !open.contains(&(ctx as usize)) {
        return Err(CError::inval("not an open context of this library"));
    }
    // SAFETY: `ctx` is registered, so it is `&vctx.context` of a live boxed SoftContext that
    // only ibv_close_device frees, and that needs the OPEN lock we hold.
    let soft = unsafe { &*ctx.cast::<u8>().sub(IBV_CONTEXT_OFFSET).cast::<SoftContext>() };
    f(soft)
}

/// Opens a device (`ibv_open_device`; also librdmacm's per-device context).
pub(crate) fn open_device(device: *mut ibv_device) -> CResult<*mut ibv_context> {
    crate::exit::watch_for_exit();
    let dev = lookup(device)?;
    let verbs = Context::open(&dev.info())?;
    let mut vctx = verbs_context::zeroed();
    vctx.query_port = Some(vctx_query_port);
    vctx.query_device_ex = Some(vctx_query_device_ex);
    vctx.create_qp_ex = Some(crate::qp_ex::vctx_create_qp_ex);
    vctx.create_cq_ex = Some(crate::cq_ex::vctx_create_cq_ex);
    vctx.advise_mr = Some(crate::odp::vctx_advise_mr);
    vctx.sz = size_of::<verbs_context>();
    let c = &mut vctx.context;
    c.device = dev.as_ptr();
    c.ops = context_ops();
    // No kernel command channel exists: `cmd_fd` is /dev/null, a valid descriptor that
    // programs may dup or poll (pyverbs' shared-PD tests dup it before ibv_import_device,
    // which then answers EOPNOTSUPP). `async_fd` is the eventfd of the context's async
    // events (pollable; the application may set O_NONBLOCK on it).
    let cmd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| {
            CError::new(
                libc::EMFILE,
                format!("open_device: cannot open /dev/null for cmd_fd: {e}"),
            )
        })?;
    c.cmd_fd = std::os::fd::IntoRawFd::into_raw_fd(cmd);
    c.async_fd = verbs.async_fd()?;
    c.num_comp_vectors = 1;
    c.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    c.abi_compat = VERBS_ABI_IS_EXTENDED;

    let raw = Box::into_raw(Box::new(SoftContext { vctx, verbs }));
    // SAFETY: `raw` is a live allocation from Box::into_raw; taking a field address.
    let ctx = unsafe { ptr::addr_of_mut!((*raw).vctx.context) };
    open_contexts().push(ctx as usize);
    Ok(ctx)
}

fn close_device(ctx: *mut ibv_context) -> CResult<c_int> {
    non_null(ctx, "context")?;
    let mut open = open_contexts();
    let Some(pos) = open.iter().position(|&a| a == ctx as usize) else {
        return Err(CError::inval("not an open context of this library"));
    };
    open.swap_remove(pos);
    // SAFETY: `ctx` was registered by open_device, so it lies IBV_CONTEXT_OFFSET bytes into a
    // Box<SoftContext>; it is now unregistered, so this is the only free.
    let soft = unsafe { Box::from_raw(ctx.cast::<u8>().sub(IBV_CONTEXT_OFFSET).cast::<SoftContext>()) };
    let cmd_fd = soft.vctx.context.cmd_fd;
    if cmd_fd >= 0 {
        // SAFETY: open_device opened this descriptor for the context; nothing else owns it.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(cmd_fd) });
    }
    drop(soft);
    Ok(0)
}

/// `struct ibv_device_attr` from the verbs crate's attributes.
fn device_attr_c(a: &DeviceAttr) -> ibv_device_attr {
    let mut c = ibv_device_attr::zeroed();
    fill_c_chars(&mut c.fw_ver, &a.fw_ver);
    c.node_guid = a.node_guid.to_be();
    c.sys_image_guid = a.sys_image_guid.to_be();
    c.max_mr_size = a.max_mr_size;
    c.page_size_cap = a.page_size_cap;
    c.vendor_id = a.vendor_id;
    c.vendor_part_id = a.vendor_part_id;
    c.hw_ver = a.hw_ver;
    c.max_qp = a.max_qp;
    c.max_qp_wr = a.max_qp_wr;
    c.device_cap_flags = a.device_cap_flags;
    c.max_sge = a.max_sge;
    c.max_sge_rd = a.max_sge_rd;
    c.max_cq = a.max_cq;
    c.max_cqe = a.max_cqe;
    c.max_mr = a.max_mr;
    c.max_pd = a.max_pd;
    c.max_qp_rd_atom = a.max_qp_rd_atom;
    c.max_ee_rd_atom = a.max_ee_rd_atom;
    c.max_res_rd_atom = a.max_res_rd_atom;
    c.max_qp_init_rd_atom = a.max_qp_init_rd_atom;
    c.max_ee_init_rd_atom = a.max_ee_init_rd_atom;
    c.atomic_cap = a.atomic_cap as u32;
    c.max_ee = a.max_ee;
    c.max_rdd = a.max_rdd;
    c.max_mw = a.max_mw;
    c.max_raw_ipv6_qp = a.max_raw_ipv6_qp;
    c.max_raw_ethy_qp = a.max_raw_ethy_qp;
    c.max_mcast_grp = a.max_mcast_grp;
    c.max_mcast_qp_attach = a.max_mcast_qp_attach;
    c.max_total_mcast_qp_attach = a.max_total_mcast_qp_attach;
    c.max_ah = a.max_ah;
    c.max_fmr = a.max_fmr;
    c.max_map_per_fmr = a.max_map_per_fmr;
    c.max_srq = a.max_srq;
    c.max_srq_wr = a.max_srq_wr;
    c.max_srq_sge = a.max_srq_sge;
    c.max_pkeys = a.max_pkeys;
    c.local_ca_ack_delay = a.local_ca_ack_delay;
    c.phys_port_cnt = a.phys_port_cnt;
    c
}

/// `struct ibv_device_attr_ex`: the basic attributes; every extended capability (ODP, TSO,
/// RSS, timestamps, device memory, ...) is zero, i.e. not supported.
fn device_attr_ex_c(a: &DeviceAttr, transport: softrdma_verbs::device::TransportKind) -> ibv_device_attr_ex {
    let mut c = ibv_device_attr_ex::zeroed();
    c.orig_attr = device_attr_c(a);
    c.odp_caps = crate::odp::odp_caps(transport);
    c.device_cap_flags_ex = u64::from(a.device_cap_flags);
    c.phys_port_cnt_ex = u32::from(a.phys_port_cnt);
    c
}

/// `struct ibv_port_attr` from the verbs crate's attributes.
fn port_attr_c(p: &PortAttr) -> ibv_port_attr {
    ibv_port_attr {
        state: p.state as u32,
        max_mtu: p.max_mtu as u32,
        active_mtu: p.active_mtu as u32,
        gid_tbl_len: p.gid_tbl_len,
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: p.sm_sl,
        subnet_timeout: p.subnet_timeout,
        init_type_reply: p.init_type_reply,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: p.link_layer,
        flags: p.flags,
        port_cap_flags2: p.port_cap_flags2,
    }
}

/// Copies `value` into a caller buffer of `len` bytes: the first `min(len, size_of::<T>())`
/// bytes, and zeroes beyond `size_of::<T>()` (fields of a newer header we do not know).
///
/// # Safety
/// `dst` is valid for writes of `len` bytes.
unsafe fn write_sized<T>(value: &T, dst: *mut u8, len: usize) {
    let n = len.min(size_of::<T>());
    // SAFETY: `value` is readable for size_of::<T>() >= n bytes; `dst` is writable for
    // len >= n bytes (contract); a local and a caller buffer cannot overlap.
    unsafe { ptr::copy_nonoverlapping(ptr::from_ref(value).cast::<u8>(), dst, n) };
    if len > n {
        // SAFETY: bytes n..len of `dst` are writable per the contract.
        unsafe { ptr::write_bytes(dst.add(n), 0, len - n) };
    }
}

fn query_port_into(ctx: *mut ibv_context, port: u8, dst: *mut u8, len: usize) -> CResult<()> {
    non_null(dst, "port_attr")?;
    let attr = with_context(ctx, |c| Ok(port_attr_c(&c.verbs.query_port(port)?)))?;
    // SAFETY: `dst` holds `len` bytes (compat call: 48; extended call: the length it passes).
    unsafe { write_sized(&attr, dst, len) };
    Ok(())
}

/// `enum ibv_gid_type` of a GID type.
fn gid_type_c(t: GidType) -> u32 {
    match t {
        GidType::Ib => IBV_GID_TYPE_IB,
        GidType::RoceV1 => IBV_GID_TYPE_ROCE_V1,
        GidType::RoceV2 => IBV_GID_TYPE_ROCE_V2,
    }
}

/// The GID table entry `index` of `port`, as the kernel's GID cache reports it: type
/// `IBV_GID_TYPE_ROCE_V2` on a RoCE port, `IBV_GID_TYPE_IB` on an iWARP port; `ndev_ifindex`
/// is the netdev. ENODATA for an empty entry; EINVAL for a bad port or index.
fn gid_entry(ctx: *mut ibv_context, port: u32, index: u32) -> CResult<ibv_gid_entry> {
    let port8 = u8::try_from(port).map_err(|_| CError::inval(format!("port {port} does not exist")))?;
    let idx = usize::try_from(index).map_err(|_| CError::inval("GID index out of range"))?;
    with_context(ctx, |c| {
        let gid = c.verbs.query_gid(port8, idx)?;
        if gid.is_zero() {
            return Err(CError::new(libc::ENODATA, format!("GID {index} is empty")));
        }
        let gid_type = c.verbs.query_gid_type(port8, idx)?;
        Ok(ibv_gid_entry {
            gid: ibv_gid { raw: gid.0 },
            gid_index: index,
            port_num: port,
            gid_type: gid_type_c(gid_type),
            ndev_ifindex: c.verbs.device().ifindex,
        })
    })
}

fn query_device(ctx: *mut ibv_context, device_attr: *mut ibv_device_attr) -> CResult<()> {
    non_null(device_attr, "device_attr")?;
    let attr = with_context(ctx, |c| Ok(device_attr_c(&c.verbs.query_device())))?;
    // SAFETY: non-NULL; the caller provides a struct ibv_device_attr.
    unsafe { device_attr.write(attr) };
    Ok(())
}

fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> CResult<()> {
    // SAFETY: `input` is NULL or points to the caller's input struct.
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return Err(CError::inval("query_device_ex: unknown input comp_mask"));
    }
    non_null(attr, "device_attr_ex")?;
    if attr_size < size_of::<ibv_device_attr>() {
        return Err(CError::inval("query_device_ex: attr_size is too small"));
    }
    let value = with_context(ctx, |c| {
        Ok(device_attr_ex_c(&c.verbs.query_device(), c.verbs.device().transport))
    })?;
    // SAFETY: the caller's struct holds `attr_size` bytes.
    unsafe { write_sized(&value, attr.cast(), attr_size) };
    Ok(())
}

fn query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> CResult<c_int> {
    non_null(gid, "gid")?;
    let index = u32::try_from(index).map_err(|_| CError::inval("negative GID index"))?;
    let value = match gid_entry(ctx, u32::from(port), index) {
        Ok(entry) => entry.gid,
        Err(e) if e.errno() == libc::ENODATA => ibv_gid { raw: [0; 16] },
        Err(e) => return Err(e),
    };
    // SAFETY: non-NULL; the caller provides a union ibv_gid.
    unsafe { gid.write(value) };
    Ok(0)
}

fn query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> CResult<()> {
    if flags != 0 {
        return Err(CError::inval("query_gid_ex: flags must be 0"));
    }
    non_null(entry, "entry")?;
    if entry_size < size_of::<ibv_gid_entry>() {
        return Err(CError::inval("query_gid_ex: entry_size is too small"));
    }
    let value = gid_entry(ctx, port, index)?;
    // SAFETY: the caller's entry holds `entry_size` bytes.
    unsafe { write_sized(&value, entry.cast(), entry_size) };
    Ok(())
}

/// `_ibv_query_gid_table`: every non-empty GID entry of every port, as rdma-core's fallback
/// (one `ibv_query_gid_ex` per index) builds it: the number written, EINVAL if they do not
/// fit in `max_entries`.
fn query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> CResult<usize> {
    if flags != 0 {
        return Err(CError::inval("query_gid_table: flags must be 0"));
    }
    if entry_size < size_of::<ibv_gid_entry>() {
        return Err(CError::inval("query_gid_table: entry_size is too small"));
    }
    if max_entries > 0 {
        non_null(entries, "entries")?;
    }
    let (ports, len) = with_context(ctx, |c| {
        Ok((c.verbs.query_device().phys_port_cnt, c.verbs.query_port(1)?.gid_tbl_len))
    })?;
    let mut found = Vec::new();
    for port in 1..=u32::from(ports) {
        for index in 0..u32::try_from(len).unwrap_or(0) {
            match gid_entry(ctx, port, index) {
                Ok(e) => found.push(e),
                Err(e) if e.errno() == libc::ENODATA => {}
                Err(e) => return Err(e),
            }
        }
    }
    if found.len() > max_entries {
        return Err(CError::inval(format!(
            "query_gid_table: {} entries do not fit in max_entries {max_entries}",
            found.len()
        )));
    }
    for (i, e) in found.iter().enumerate() {
        // SAFETY: `entries` holds `max_entries` > i elements of `entry_size` bytes each (C
        // contract); every entry is written within its own element.
        unsafe { write_sized(e, entries.cast::<u8>().add(i * entry_size), entry_size) };
    }
    Ok(found.len())
}

fn query_gid_type(ctx: *mut ibv_context, port: u8, index: c_uint, type_: *mut u32) -> CResult<c_int> {
    non_null(type_, "type")?;
    let value = match gid_entry(ctx, u32::from(port), index) {
        Ok(e) if matches!(e.gid_type, IBV_GID_TYPE_IB | IBV_GID_TYPE_ROCE_V1) => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
        Ok(_) => IBV_GID_TYPE_SYSFS_ROCE_V2,
        Err(e) if e.errno() == libc::ENODATA => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
        Err(e) => return Err(e),
    };
    // SAFETY: non-NULL; the caller provides the enum.
    unsafe { type_.write(value) };
    Ok(0)
}

fn query_pkey(ctx: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> CResult<c_int> {
    non_null(pkey, "pkey")?;
    let len = with_context(ctx, |c| Ok(c.verbs.query_port(port)?.pkey_tbl_len))?;
    if index < 0 || index >= c_int::from(len) {
        return Err(CError::new(libc::ENOENT, format!("no P_Key at index {index}")));
    }
    // SAFETY: non-NULL; the caller provides a __be16.
    unsafe { pkey.write(0xffff_u16.to_be()) };
    Ok(0)
}

/// The index of `pkey` (network byte order) in the port's P_Key table.
fn get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> CResult<c_int> {
    let len = with_context(ctx, |c| Ok(c.verbs.query_port(port)?.pkey_tbl_len))?;
    for i in 0..c_int::from(len) {
        let mut entry = 0u16;
        query_pkey(ctx, port, i, &mut entry)?;
        if entry == pkey {
            return Ok(i);
        }
    }
    Err(CError::new(
        libc::ENOENT,
        format!(
            "P_Key {:#06x} is not in the table (the default P_Key 0xffff is)",
            u16::from_be(pkey)
        ),
    ))
}

c_fn! {
    /// `int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)`:
    /// the index, or -1 with errno.
    fn ibv_get_pkey_index(context: *mut ibv_context, port_num: u8, pkey: u16) -> c_int {
        ret_neg1(get_pkey_index(context, port_num, pkey))
    }

    /// `struct ibv_context *ibv_open_device(struct ibv_device *device)`.
    fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
        ret_ptr(open_device(device))
    }

    /// `int ibv_close_device(struct ibv_context *context)`: 0, or -1 for a pointer that is
    /// not an open context.
    fn ibv_close_device(context: *mut ibv_context) -> c_int {
        ret_neg1(close_device(context))
    }

    /// `int ibv_query_device(struct ibv_context *, struct ibv_device_attr *)`: 0 or errno.
    fn ibv_query_device(context: *mut ibv_context, device_attr: *mut ibv_device_attr) -> c_int {
        ret_errno(query_device(context, device_attr))
    }

    /// `int ibv_query_port(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *)`:
    /// the exported call of binaries that do not use the extended context. Writes the 48
    /// bytes of the compat struct only (not `port_cap_flags2`). 0 or errno.
    fn ibv_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut _compat_ibv_port_attr) -> c_int {
        ret_errno(query_port_into(context, port_num, port_attr.cast(), COMPAT_PORT_ATTR_LEN))
    }

    /// `verbs_context.query_port`: the `ibv_query_port` macro's path, with the caller's
    /// `sizeof(struct ibv_port_attr)`. 0 or errno.
    fn vctx_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut ibv_port_attr, len: usize) -> c_int {
        ret_errno(query_port_into(context, port_num, port_attr.cast(), len))
    }

    /// `verbs_context.query_device_ex`: honours `attr_size` (at least the basic struct). 0 or
    /// errno.
    fn vctx_query_device_ex(
        context: *mut ibv_context,
        input: *const ibv_query_device_ex_input,
        attr: *mut ibv_device_attr_ex,
        attr_size: usize,
    ) -> c_int {
        ret_errno(query_device_ex(context, input, attr, attr_size))
    }

    /// `int ibv_query_gid(struct ibv_context *, uint8_t, int, union ibv_gid *)`: 0 (an empty
    /// entry reads as all zeros), or -1 and errno.
    fn ibv_query_gid(context: *mut ibv_context, port_num: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
        ret_neg1(query_gid(context, port_num, index, gid))
    }

    /// `int _ibv_query_gid_ex(struct ibv_context *, uint32_t port_num, uint32_t gid_index,
    /// struct ibv_gid_entry *, uint32_t flags, size_t entry_size)`: 0 or errno (ENODATA for an
    /// empty entry, EINVAL for flags or a bad port/index).
    fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int {
        ret_errno(query_gid_ex(context, port_num, gid_index, entry, flags, entry_size))
    }

    /// `ssize_t _ibv_query_gid_table(struct ibv_context *, struct ibv_gid_entry *entries,
    /// size_t max_entries, uint32_t flags, size_t entry_size)` (behind the inline
    /// `ibv_query_gid_table`): the number of valid entries written, or a negative errno value.
    fn _ibv_query_gid_table(
        context: *mut ibv_context,
        entries: *mut ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> isize {
        match query_gid_table(context, entries, max_entries, flags, entry_size) {
            Ok(n) => isize::try_from(n).unwrap_or(isize::MAX),
            Err(e) => -(ret_errno(Err(e)) as isize),
        }
    }

    /// `int ibv_query_gid_type(struct ibv_context *, uint8_t, unsigned int index,
    /// enum ibv_gid_type_sysfs *type)` (IBVERBS_PRIVATE_34, used by ibv_devinfo): the sysfs
    /// numbering, 0 = "IB/RoCE v1", 1 = "RoCE v2"; an empty entry reads as 0. 0, or -1 and
    /// errno.
    fn ibv_query_gid_type(context: *mut ibv_context, port_num: u8, index: c_uint, type_: *mut u32) -> c_int {
        ret_neg1(query_gid_type(context, port_num, index, type_))
    }

    /// `int ibv_query_pkey(struct ibv_context *, uint8_t, int index, __be16 *pkey)`: 0, or -1
    /// and errno. P_Key entries below the port's `pkey_tbl_len` read as the default P_Key
    /// 0xffff; an iWARP port has no P_Key table (length 0), so every index fails with ENOENT,
    /// as rdma-core's read of the missing sysfs file does on a kernel siw device.
    fn ibv_query_pkey(context: *mut ibv_context, port_num: u8, index: c_int, pkey: *mut u16) -> c_int {
        ret_neg1(query_pkey(context, port_num, index, pkey))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::current_devices;
    use std::ffi::CStr;

    fn open_first() -> Option<*mut ibv_context> {
        let dev = current_devices().unwrap().into_iter().next()?;
        // SAFETY: a device of this library.
        let ctx = unsafe { ibv_open_device(dev.as_ptr()) };
        assert!(!ctx.is_null());
        Some(ctx)
    }

    #[test]
    fn open_query_close() {
        let Some(ctx) = open_first() else {
            return; // a host with no interface up has no device
        };
        // SAFETY: `ctx` is open; every out-pointer below is a valid local.
        unsafe {
            let vctx = &*ctx
                .cast::<u8>()
                .sub(offset_of!(verbs_context, context))
                .cast::<verbs_context>();
            assert_eq!(vctx.sz, 648);
            assert_eq!((*ctx).abi_compat, VERBS_ABI_IS_EXTENDED);

            let mut attr = ibv_device_attr::zeroed();
            assert_eq!(ibv_query_device(ctx, &mut attr), 0);
            assert_eq!(attr.phys_port_cnt, 1);
            assert_eq!(attr.vendor_id, 0xff_ffff);

            // The compat call must leave port_cap_flags2 (bytes 48..52) alone.
            let mut port = ibv_port_attr::zeroed();
            port.port_cap_flags2 = 0xabcd;
            assert_eq!(ibv_query_port(ctx, 1, ptr::from_mut(&mut port).cast()), 0);
            assert_eq!(port.port_cap_flags2, 0xabcd);
            assert_eq!(port.gid_tbl_len, 1);
            assert_eq!(port.link_layer, 2);
            assert_eq!(ibv_query_port(ctx, 2, ptr::from_mut(&mut port).cast()), libc::EINVAL);

            let mut full = ibv_port_attr::zeroed();
            full.port_cap_flags2 = 0xabcd;
            assert_eq!(vctx_query_port(ctx, 1, &mut full, size_of::<ibv_port_attr>()), 0);
            assert_eq!(full.port_cap_flags2, 0);

            let mut gid = ibv_gid { raw: [0; 16] };
            assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
            assert_ne!(gid.raw, [0; 16]);
            assert_eq!(ibv_query_gid(ctx, 1, 1, &mut gid), -1);

            let mut entry = ibv_gid_entry::zeroed();
            assert_eq!(_ibv_query_gid_ex(ctx, 1, 0, &mut entry, 0, 32), 0);
            assert_eq!(entry.gid.raw, gid_raw(ctx));
            assert_eq!(entry.gid_type, IBV_GID_TYPE_IB);
            assert_eq!(_ibv_query_gid_ex(ctx, 1, 0, &mut entry, 1, 32), libc::EINVAL);
            assert_eq!(_ibv_query_gid_ex(ctx, 257, 0, &mut entry, 0, 32), libc::EINVAL);

            let mut ty = 9;
            assert_eq!(ibv_query_gid_type(ctx, 1, 0, &mut ty), 0);
            assert_eq!(ty, IBV_GID_TYPE_SYSFS_IB_ROCE_V1);

            let mut pkey = 0;
            assert_eq!(ibv_query_pkey(ctx, 1, 0, &mut pkey), -1);

            assert_eq!(ibv_close_device(ctx), 0);
            assert_eq!(ibv_close_device(ctx), -1, "double close is detected");
            let mut attr = ibv_device_attr::zeroed();
            assert_eq!(ibv_query_device(ctx, &mut attr), libc::EINVAL);
        }
    }

    #[test]
    fn a_roce_device_looks_like_rxe() {
        let Some(dev) = current_devices()
            .unwrap()
            .into_iter()
            .find(|d| d.info().name == "rxe_lo")
        else {
            return; // no rxe_lo in this environment's device list
        };
        // SAFETY: `dev` is a device of this library; every out-pointer below is a valid local.
        unsafe {
            assert_eq!((*dev.as_ptr()).node_type, crate::abi::IBV_NODE_CA);
            assert_eq!((*dev.as_ptr()).transport_type, crate::abi::IBV_TRANSPORT_IB);
            let ctx = ibv_open_device(dev.as_ptr());
            assert!(!ctx.is_null());
            let mut attr = ibv_device_attr::zeroed();
            assert_eq!(ibv_query_device(ctx, &mut attr), 0);
            assert_eq!((attr.vendor_id, attr.vendor_part_id), (0xff_ffff, 0));
            assert_eq!(attr.atomic_cap, 1, "IBV_ATOMIC_HCA");
            assert!(attr.max_ah > 0 && attr.max_mcast_grp > 0);

            let mut port = ibv_port_attr::zeroed();
            assert_eq!(vctx_query_port(ctx, 1, &mut port, size_of::<ibv_port_attr>()), 0);
            assert_eq!(port.link_layer, 2, "Ethernet");
            assert_eq!(port.state, 4, "ACTIVE");
            assert_eq!(port.active_mtu, 5, "4096 on lo");
            assert_eq!(port.pkey_tbl_len, 1);
            assert!(port.gid_tbl_len >= 1);

            let mut gid = ibv_gid { raw: [0; 16] };
            assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
            assert_eq!(
                std::net::Ipv6Addr::from(gid.raw).to_string(),
                "::ffff:127.0.0.1",
                "ibv_rc_pingpong -g 0 gets the IPv4-mapped GID"
            );
            let mut entry = ibv_gid_entry::zeroed();
            assert_eq!(_ibv_query_gid_ex(ctx, 1, 0, &mut entry, 0, 32), 0);
            assert_eq!(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
            assert_eq!(entry.ndev_ifindex, dev.info().ifindex);
            let mut ty = 9;
            assert_eq!(ibv_query_gid_type(ctx, 1, 0, &mut ty), 0);
            assert_eq!(ty, IBV_GID_TYPE_SYSFS_ROCE_V2);

            let slots = usize::try_from(port.gid_tbl_len).unwrap();
            let len = dev.info().gids().len();
            assert!(len >= 1 && len < slots, "{len} GIDs, {slots} entries: some are empty");
            let mut empty = ibv_gid_entry::zeroed();
            assert_eq!(
                _ibv_query_gid_ex(ctx, 1, (slots - 1) as u32, &mut empty, 0, 32),
                libc::ENODATA,
                "an empty entry"
            );
            let mut table: Vec<ibv_gid_entry> = (0..=slots).map(|_| ibv_gid_entry::zeroed()).collect();
            let n = _ibv_query_gid_table(ctx, table.as_mut_ptr(), table.len(), 0, 32);
            assert_eq!(n, isize::try_from(len).unwrap());
            assert_eq!(table[0].gid.raw, gid.raw);
            assert!(table[..len]
                .iter()
                .all(|e| e.gid_type == IBV_GID_TYPE_ROCE_V2 && e.port_num == 1));
            if len > 1 {
                assert_eq!(
                    _ibv_query_gid_table(ctx, table.as_mut_ptr(), 1, 0, 32),
                    -(libc::EINVAL as isize)
                );
            }
            assert_eq!(
                _ibv_query_gid_table(ctx, table.as_mut_ptr(), 1, 1, 32),
                -(libc::EINVAL as isize)
            );

            let mut pkey = 0;
            assert_eq!(ibv_query_pkey(ctx, 1, 0, &mut pkey), 0);
            assert_eq!(u16::from_be(pkey), 0xffff);
            assert_eq!(ibv_query_pkey(ctx, 1, 1, &mut pkey), -1);

            // The emulated sysfs answers below the device's ibdev_path.
            let dir = CStr::from_ptr((*dev.as_ptr()).ibdev_path.as_ptr());
            let mut buf = [0 as std::ffi::c_char; 64];
            let n = crate::sysfs::ibv_read_sysfs_file(
                dir.as_ptr(),
                c"ports/1/gid_attrs/types/0".as_ptr(),
                buf.as_mut_ptr(),
                64,
            );
            assert_eq!(n, 7);
            assert_eq!(CStr::from_ptr(buf.as_ptr()).to_bytes(), b"RoCE v2");
            let n = crate::sysfs::ibv_read_sysfs_file(
                dir.as_ptr(),
                c"ports/1/gid_attrs/ndevs/0".as_ptr(),
                buf.as_mut_ptr(),
                64,
            );
            assert_eq!(n, 2);
            assert_eq!(CStr::from_ptr(buf.as_ptr()).to_bytes(), b"lo");
            let n =
                crate::sysfs::ibv_read_sysfs_file(dir.as_ptr(), c"ports/1/link_layer".as_ptr(), buf.as_mut_ptr(), 64);
            assert_eq!(n, 8);
            assert_eq!(
                crate::sysfs::ibv_read_sysfs_file(dir.as_ptr(), c"board_id".as_ptr(), buf.as_mut_ptr(), 64),
                -1
            );

            assert_eq!(ibv_close_device(ctx), 0);
        }
    }

    fn gid_raw(ctx: *mut ibv_context) -> [u8; 16] {
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: `ctx` is open; `gid` is a local.
        assert_eq!(unsafe { ibv_query_gid(ctx, 1, 0, &mut gid) }, 0);
        // SAFETY: reading the raw bytes of the union is always valid.
        unsafe { gid.raw }
    }

    #[test]
    fn query_device_ex_honours_attr_size() {
        let Some(ctx) = open_first() else {
            return;
        };
        // SAFETY: `ctx` is open; the buffer is larger than both sizes used.
        unsafe {
            #[repr(align(8))]
            struct Buf([u8; 512]);
            let mut buf = Buf([0xee; 512]);
            let attr = buf.0.as_mut_ptr().cast::<ibv_device_attr_ex>();
            assert_eq!(vctx_query_device_ex(ctx, ptr::null(), attr, 450), 0);
            assert_eq!(buf.0[400..450], [0u8; 50], "tail beyond the known struct is zeroed");
            assert_eq!(buf.0[450], 0xee, "nothing past attr_size is written");
            assert_eq!(vctx_query_device_ex(ctx, ptr::null(), attr, 100), libc::EINVAL);
            assert_eq!(ibv_close_device(ctx), 0);
        }
    }
}
