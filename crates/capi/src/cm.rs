//! librdmacm: event channels, CM ids, events, the synchronous endpoint calls
//! (`rdma_create_ep`, `rdma_get_request`) and `rpoll`, over `softrdma-cm`.
//!
//! - `struct rdma_event_channel` is the first field of [`SoftEventChannel`]; `fd` is the CM
//!   channel's eventfd.
//! - `struct rdma_cm_id` is the first field of [`SoftCmId`]. Its public fields are kept as
//!   librdmacm keeps them: `verbs` is the process-wide context of the id's device (opened once
//!   per device, with a default PD that `pd` starts as), `route.addr` holds the local and peer
//!   addresses, `port_num` is 1 once a device is attached, and `qp`, `send_cq`, `recv_cq` and
//!   their channels are set by `rdma_create_qp`.
//! - `struct rdma_cm_event` is the first field of a heap object that holds the Rust event
//!   until `rdma_ack_cm_event`. A CONNECT_REQUEST's `id` is a new `rdma_cm_id` allocated when
//!   the event is taken, inheriting `context`, `channel`, `ps` and `qp_type` from the listener.
//!
//! Events name Rust ids; the C id of an event is found in a small registry (events are not on
//! the data path). Errors follow librdmacm: -1 and errno; event status is a negative errno.

use softrdma_verbs::fork::PerProcess;
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};
use softrdma_cm::{CmEvent, CmId, CmOption, CmState, ConnParam, EventChannel, EventType, PortSpace};
use softrdma_verbs::device::{DeviceInfo, TransportKind};
use softrdma_verbs::QpState;

use crate::abi::{
    ibv_context, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_init_attr_ex, rdma_addrinfo, rdma_cm_event,
    rdma_cm_id, rdma_cm_join_mc_attr_ex, rdma_conn_param, rdma_event_channel, rdma_ud_param,
    IBV_QP_INIT_ATTR_CREATE_FLAGS, IBV_QP_INIT_ATTR_PD,
};
use crate::context::open_device;
use crate::device::current_devices;
use crate::error::{non_null, ret_neg1, ret_or, ret_ptr, CError, CResult};
use crate::objects::{
    ah_to_c, alloc_pd, c_object, create_comp_channel, create_cq, destroy_comp_channel, destroy_cq, destroy_srq,
    free_qp, qp_attr_to_c, qp_init_from_c, refresh_qp_state, wrap_qp, SoftPd, SoftQp,
};

/// `IBV_QPT_RC`.
const IBV_QPT_RC: u32 = 2;
/// `IBV_QPT_UD`.
const IBV_QPT_UD: u32 = 4;
/// `RAI_PASSIVE`.
pub(crate) const RAI_PASSIVE: c_int = 1;
/// `RDMA_OPTION_ID` / `RDMA_OPTION_IB` levels and their option names.
const RDMA_OPTION_ID: c_int = 0;
const RDMA_OPTION_IB: c_int = 1;
const RDMA_OPTION_ID_TOS: c_int = 0;
const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
const RDMA_OPTION_ID_AFONLY: c_int = 2;
const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
const RDMA_OPTION_IB_PATH: c_int = 1;
/// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB` in `ibv_qp_init_attr_ex.create_flags`.
const IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: u32 = 1 << 1;
/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`, `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`, `RDMA_CM_JOIN_MC_ATTR_RESERVED`.
const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1;
const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 1 << 1;
const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 1 << 2;
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`, `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`.
const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
/// Timeout librdmacm's `rdma_create_ep` uses for address and route resolution.
const EP_RESOLVE_TIMEOUT_MS: c_int = 2000;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// librdmacm's `ucma_init`: with no RDMA device at all every entry point fails with ENODEV
/// ("No RDMA devices were detected").
/// Like librdmacm, a successful check is remembered for the process.
pub(crate) fn ucma_init() -> CResult<()> {
    static FOUND: AtomicBool = AtomicBool::new(false);
    if FOUND.load(Ordering::Acquire) {
        return Ok(());
    }
    if current_devices()?.is_empty() {
        return Err(CError::new(libc::ENODEV, "no RDMA devices"));
    }
    FOUND.store(true, Ordering::Release);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Per-device context and default PD

/// `(device name, ibv_context address, default PD address)`, opened on first use and kept for
/// the process lifetime (librdmacm keeps one context per device).
/// Per fork generation: a forked child opens its own (see `softrdma_verbs::fork`).
static CM_DEVICES: PerProcess<Mutex<Vec<(String, usize, usize)>>> = PerProcess::new();

/// The process-wide context and default PD of `dev`.
pub(crate) fn device_handles(dev: &DeviceInfo) -> CResult<(*mut ibv_context, *mut ibv_pd)> {
    let mut devs = lock(CM_DEVICES.get_or_init(|| Mutex::new(Vec::new())));
    if let Some((_, ctx, pd)) = devs.iter().find(|(name, _, _)| *name == dev.name) {
        return Ok((*ctx as *mut ibv_context, *pd as *mut ibv_pd));
    }
    let soft = current_devices()?
        .into_iter()
        .find(|d| d.info().name == dev.name)
        .ok_or_else(|| CError::new(libc::ENODEV, format!("device {} is gone", dev.name)))?;
    let ctx = open_device(soft.as_ptr())?;
    let pd = alloc_pd(ctx)?;
    devs.push((dev.name.clone(), ctx as usize, pd as usize));
    Ok((ctx, pd))
}

// ---------------------------------------------------------------------------------------------
// Socket addresses

/// The address at `p`: NULL and AF_UNSPEC are `None`.
///
/// # Safety
/// `p` is NULL or points to a socket address of the size its family implies.
pub(crate) unsafe fn sockaddr_from_c(p: *const sockaddr) -> CResult<Option<SocketAddr>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: per the contract, at least `sa_family` is readable.
    let family = c_int::from(unsafe { (*p).sa_family });
    match family {
        libc::AF_UNSPEC => Ok(None),
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in (possibly unaligned in the caller).
            let a = unsafe { p.cast::<sockaddr_in>().read_unaligned() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Ok(Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port)))))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let a = unsafe { p.cast::<sockaddr_in6>().read_unaligned() };
            Ok(Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            ))))
        }
        other => Err(CError::new(
            libc::EAFNOSUPPORT,
            format!("address family {other} is not supported (AF_INET and AF_INET6 are)"),
        )),
    }
}

/// `a` as a `sockaddr_storage` and its length.
pub(crate) fn sockaddr_to_c(a: SocketAddr) -> (sockaddr_storage, socklen_t) {
    // SAFETY: sockaddr_storage is plain bytes; all-zero is valid.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_in is plain bytes; all-zero is valid.
            let mut sin: sockaddr_in = unsafe { std::mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { ptr::from_mut(&mut ss).cast::<sockaddr_in>().write(sin) };
            size_of::<sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_in6 is plain bytes; all-zero is valid.
            let mut sin6: sockaddr_in6 = unsafe { std::mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_scope_id = v6.scope_id();
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { ptr::from_mut(&mut ss).cast::<sockaddr_in6>().write(sin6) };
            size_of::<sockaddr_in6>()
        }
    };
    (ss, len as socklen_t)
}

/// True if the first `len` bytes of two addresses are equal.
fn same_addr(a: &sockaddr_storage, b: &sockaddr_storage, len: socklen_t) -> bool {
    let n = (len as usize).min(size_of::<sockaddr_storage>());
    // SAFETY: both are live sockaddr_storage values of at least `n` bytes.
    let (x, y) = unsafe {
        (
            std::slice::from_raw_parts(ptr::from_ref(a).cast::<u8>(), n),
            std::slice::from_raw_parts(ptr::from_ref(b).cast::<u8>(), n),
        )
    };
    x == y
}

// ---------------------------------------------------------------------------------------------
// Event channels

/// `struct rdma_event_channel` plus the CM channel.
#[repr(C)]
pub(crate) struct SoftEventChannel {
    c: rdma_event_channel,
    ch: EventChannel,
}
c_object!(SoftEventChannel, rdma_event_channel, "channel");

impl SoftEventChannel {
    fn wrap(ch: EventChannel) -> *mut rdma_event_channel {
        SoftEventChannel {
            c: rdma_event_channel { fd: ch.fd() },
            ch,
        }
        .into_c()
    }
}

fn create_event_channel() -> CResult<*mut rdma_event_channel> {
    crate::exit::watch_for_exit();
    ucma_init()?;
    Ok(SoftEventChannel::wrap(EventChannel::new()?))
}

// ---------------------------------------------------------------------------------------------
// CM ids

/// `struct rdma_cm_id` plus the CM id.
#[repr(C)]
pub(crate) struct SoftCmId {
    c: UnsafeCell<rdma_cm_id>,
    pub(crate) id: CmId,
    /// Serialises this library's writes to the C header.
    pub(crate) update: Mutex<()>,
    /// C wrappers of the id's private channels (synchronous ids), freed with the id.
    own_channels: Mutex<Vec<*mut rdma_event_channel>>,
    /// `rdma_create_ep` on a passive address: the QP attributes `rdma_get_request` uses.
    ep_qp_attr: Mutex<Option<ibv_qp_init_attr>>,
    /// Active id connected with `conn_param.qp_num` and no `id->qp` (rping -q): its
    /// ESTABLISHED is reported as CONNECT_RESPONSE, and `rdma_establish` completes it.
    qpless: std::sync::atomic::AtomicBool,
    /// Multicast groups joined: `(MGID, context)`; MULTICAST_JOIN events carry the context
    /// in `param.ud.private_data`, as librdmacm does.
    mc_contexts: Mutex<Vec<([u8; 16], usize)>>,
    /// `rdma_set_local_ece`: `(vendor_id, options)`.
    pub(crate) local_ece: Mutex<Option<(u32, u32)>>,
}
c_object!(SoftCmId, rdma_cm_id, "id");

/// `(CM id, C id address)` of every live C id (per fork generation).
static IDS: PerProcess<Mutex<Vec<(CmId, usize)>>> = PerProcess::new();

fn ids() -> MutexGuard<'static, Vec<(CmId, usize)>> {
    lock(IDS.get_or_init(|| Mutex::new(Vec::new())))
}

fn c_id_of(id: &CmId) -> Option<*mut rdma_cm_id> {
    ids().iter().find(|(i, _)| i == id).map(|&(_, a)| a as *mut rdma_cm_id)
}

/// `IBV_QPT_*` of a port space, as librdmacm's `ucma_get_qp_type`.
fn qp_type_of(ps: PortSpace) -> u32 {
    match ps {
        PortSpace::Udp | PortSpace::Ipoib => IBV_QPT_UD,
        PortSpace::Tcp | PortSpace::Ib => IBV_QPT_RC,
    }
}

/// Reads field `$f` of a [`SoftCmId`]'s C header.
macro_rules! hget {
    ($s:expr, $($f:ident).+) => {{
        let c = $s.hdr();
        // SAFETY: `c` is the live header of this id; a plain read of one field (the
        // application reads but does not write these fields while calls on the id run).
        unsafe { ptr::addr_of!((*c).$($f).+).read() }
    }};
}

/// Writes field `$f` of a [`SoftCmId`]'s C header.
macro_rules! hset {
    ($s:expr, $($f:ident).+ = $v:expr) => {{
        let v = $v;
        let c = $s.hdr();
        // SAFETY: `c` is the live header of this id; our writes are serialised by its
        // `update` lock or happen before the id is handed to C.
        unsafe { ptr::addr_of_mut!((*c).$($f).+).write(v) }
    }};
}
pub(crate) use {hget, hset};

impl SoftCmId {
    pub(crate) fn hdr(&self) -> *mut rdma_cm_id {
        self.c.get()
    }

    /// Brings the header up to date with the CM id: device (`verbs`, default `pd`,
    /// `port_num`) and the route addresses.
    fn refresh(&self) -> CResult<()> {
        let _g = lock(&self.update);
        if hget!(self, verbs).is_null() {
            if let Some(dev) = self.id.device() {
                let (ctx, pd) = device_handles(&dev)?;
                hset!(self, verbs = ctx);
                if hget!(self, pd).is_null() {
                    hset!(self, pd = pd);
                }
                hset!(self, port_num = 1);
            }
        }
        // Written only when changed, so an application reading the route is rarely racing us.
        if let Some(a) = self.id.local_addr() {
            let (ss, len) = sockaddr_to_c(a);
            if !same_addr(&hget!(self, route.addr.src_storage), &ss, len) {
                hset!(self, route.addr.src_storage = ss);
            }
        }
        if let Some(a) = self.id.peer_addr() {
            let (ss, len) = sockaddr_to_c(a);
            if !same_addr(&hget!(self, route.addr.dst_storage), &ss, len) {
                hset!(self, route.addr.dst_storage = ss);
            }
        }
        Ok(())
    }

    pub(crate) fn qp(&self) -> *mut ibv_qp {
        hget!(self, qp)
    }
}

impl Drop for SoftCmId {
    fn drop(&mut self) {
        for ch in lock(&self.own_channels).drain(..) {
            // SAFETY: wrappers made for this id only (new_c_id, migrate_id); C stops using
            // `id->channel` when it destroys the id.
            drop(unsafe { SoftEventChannel::from_c_owned(ch) });
        }
    }
}

/// Wraps a CM id for C. A NULL `channel` gives the id a C wrapper of its private channel
/// (synchronous ids, as librdmacm's `id->channel`).
fn new_c_id(
    id: CmId,
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
    qp_type: u32,
) -> CResult<*mut rdma_cm_id> {
    let mut own = Vec::new();
    let channel = if channel.is_null() {
        let ch = SoftEventChannel::wrap(id.channel());
        own.push(ch);
        ch
    } else {
        channel
    };
    let mut c = rdma_cm_id::zeroed();
    c.channel = channel;
    c.context = context;
    c.ps = ps;
    c.qp_type = qp_type;
    let soft = SoftCmId {
        c: UnsafeCell::new(c),
        id: id.clone(),
        update: Mutex::new(()),
        own_channels: Mutex::new(own),
        ep_qp_attr: Mutex::new(None),
        qpless: std::sync::atomic::AtomicBool::new(false),
        mc_contexts: Mutex::new(Vec::new()),
        local_ece: Mutex::new(None),
    };
    soft.refresh()?;
    let p = soft.into_c();
    ids().push((id, p as usize));
    Ok(p)
}

fn create_id(
    channel: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> CResult<c_int> {
    non_null(out, "id")?;
    ucma_init()?;
    let space = u32::try_from(ps)
        .ok()
        .and_then(PortSpace::from_u32)
        .ok_or_else(|| CError::inval(format!("rdma_create_id: unknown port space {ps:#x}")))?;
    let ch = if channel.is_null() {
        None
    } else {
        // SAFETY: a non-NULL channel is one of this library's (C contract).
        Some(unsafe { SoftEventChannel::from_c(channel)? })
    };
    let id = CmId::create(ch.map(|c| &c.ch), space)?;
    let p = new_c_id(id, channel, context, ps, qp_type_of(space))?;
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { out.write(p) };
    Ok(0)
}

fn destroy_id(p: *mut rdma_cm_id) -> CResult<c_int> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    // Waits until every event of the id taken from its channel is acknowledged.
    soft.id.clone().destroy()?;
    ids().retain(|&(_, a)| a != p as usize);
    // SAFETY: C gives the pointer up with this call; nothing refers to it any more.
    drop(unsafe { SoftCmId::from_c_owned(p) });
    Ok(0)
}

/// Runs `f` on the CM id of `p`, then refreshes the C header.
fn with_id<R>(p: *mut rdma_cm_id, f: impl FnOnce(&SoftCmId) -> CResult<R>) -> CResult<R> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    let r = f(soft);
    soft.refresh()?;
    r
}

fn bind_addr(p: *mut rdma_cm_id, addr: *mut sockaddr) -> CResult<c_int> {
    // SAFETY: the caller's address (C contract).
    let addr = unsafe { sockaddr_from_c(addr)? }.ok_or_else(|| CError::inval("rdma_bind_addr: no address"))?;
    with_id(p, |s| Ok(s.id.bind_addr(addr)?))?;
    Ok(0)
}

fn resolve_addr(p: *mut rdma_cm_id, src: *mut sockaddr, dst: *mut sockaddr, timeout_ms: c_int) -> CResult<c_int> {
    // SAFETY: the caller's addresses (C contract).
    let (src, dst) = unsafe { (sockaddr_from_c(src)?, sockaddr_from_c(dst)?) };
    let dst = dst.ok_or_else(|| CError::inval("rdma_resolve_addr: no destination address"))?;
    with_id(p, |s| Ok(s.id.resolve_addr(src, dst, timeout_ms)?))?;
    Ok(0)
}

fn resolve_route(p: *mut rdma_cm_id, timeout_ms: c_int) -> CResult<c_int> {
    with_id(p, |s| Ok(s.id.resolve_route(timeout_ms)?))?;
    Ok(0)
}

fn listen(p: *mut rdma_cm_id, backlog: c_int) -> CResult<c_int> {
    with_id(p, |s| Ok(s.id.listen(backlog)?))?;
    Ok(0)
}

/// A copy of `len` bytes at `data` (NULL with a non-zero length is EINVAL).
///
/// # Safety
/// `data` is NULL or readable for `len` bytes.
unsafe fn private_data(data: *const c_void, len: usize) -> CResult<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    if data.is_null() {
        return Err(CError::inval(format!("private_data is NULL with length {len}")));
    }
    // SAFETY: per the contract.
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec())
}

/// The CM parameters of a C `rdma_conn_param`; NULL gives librdmacm's defaults (the device's
/// maximum resources, 7 retries).
///
/// # Safety
/// `param` is NULL or a readable `struct rdma_conn_param` whose private data is readable.
unsafe fn conn_param_from_c(param: *const rdma_conn_param) -> CResult<Option<ConnParam>> {
    if param.is_null() {
        return Ok(None);
    }
    // SAFETY: per the contract.
    let p = unsafe { &*param };
    Ok(Some(ConnParam {
        // SAFETY: per the contract.
        private_data: unsafe { private_data(p.private_data, usize::from(p.private_data_len))? },
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq != 0,
        qp_num: p.qp_num,
    }))
}

fn default_conn_param() -> ConnParam {
    ConnParam {
        responder_resources: 0xFF,
        initiator_depth: 0xFF,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

fn connect(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> CResult<c_int> {
    // SAFETY: the caller's parameters (C contract).
    let cp = unsafe { conn_param_from_c(param)? }.unwrap_or_else(default_conn_param);
    let r = with_id(p, |s| {
        let qpless = attach_c_qp(s, cp.qp_num)?;
        s.qpless.store(qpless, std::sync::atomic::Ordering::Release);
        let r = s.id.connect(&cp);
        refresh_qp_state(s.qp());
        Ok(r?)
    });
    r.map(|()| 0)
}

/// True when the id's device is a soft-RoCE one (its CM is the IB CM).
fn on_roce(id: &CmId) -> bool {
    id.device().is_some_and(|d| d.transport == TransportKind::Roce)
}

/// An application that made its QP with `ibv_create_qp` (rping -q) either stores it in
/// `id->qp` or names it in `conn_param.qp_num`; either way it is attached to the CM id, so
/// connect/accept bring it to RTS. Returns true for the `qp_num` case (no `id->qp`).
fn attach_c_qp(s: &SoftCmId, qp_num: u32) -> CResult<bool> {
    if s.id.qp().is_some() {
        return Ok(false);
    }
    let qp = s.qp();
    if !qp.is_null() {
        if let Some(q) = crate::objects::live_qp(qp) {
            s.id.attach_qp(&q)?;
        }
        return Ok(false);
    }
    // On RoCE the QP named by qp_num stays the application's, as with the kernel's IB CM: its
    // number goes into the REQ/REP, the active side gets CONNECT_RESPONSE, and the application
    // moves the QP itself (rdma_init_qp_attr) before rdma_establish or rdma_accept.
    if on_roce(&s.id) {
        return Ok(false);
    }
    match (qp_num != 0).then(|| crate::objects::live_qp_by_num(qp_num)).flatten() {
        Some(q) => {
            s.id.attach_qp(&q)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

fn accept(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> CResult<c_int> {
    // SAFETY: the caller's parameters (C contract).
    let cp = unsafe { conn_param_from_c(param)? };
    with_id(p, |s| {
        attach_c_qp(s, cp.as_ref().map(|c| c.qp_num).unwrap_or(0))?;
        let r = s.id.accept(cp.as_ref());
        refresh_qp_state(s.qp());
        Ok(r?)
    })?;
    Ok(0)
}

pub(crate) fn reject(p: *mut rdma_cm_id, data: *const c_void, len: u8) -> CResult<c_int> {
    // SAFETY: the caller's private data (C contract).
    let data = unsafe { private_data(data, usize::from(len))? };
    with_id(p, |s| Ok(s.id.reject(&data)?))?;
    Ok(0)
}

fn disconnect(p: *mut rdma_cm_id) -> CResult<c_int> {
    with_id(p, |s| {
        // The kernel's iw_cm answers 0 when the connection is already closing or closed (the
        // peer disconnected first); applications call rdma_disconnect on DISCONNECTED. On RoCE
        // the IB CM still has work then: the QP to ERR (flushing its receives, which rping's
        // CQ thread waits for) and the DREP.
        if s.id.state() == CmState::Disconnect && !on_roce(&s.id) {
            return Ok(());
        }
        let r = s.id.disconnect();
        refresh_qp_state(s.qp());
        Ok(r?)
    })?;
    Ok(0)
}

fn migrate_id(p: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> CResult<c_int> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    let target = if channel.is_null() {
        None
    } else {
        // SAFETY: a non-NULL channel is one of this library's (C contract).
        Some(unsafe { SoftEventChannel::from_c(channel)? })
    };
    soft.id.migrate(target.map(|t| &t.ch))?;
    let c_channel = if channel.is_null() {
        let ch = SoftEventChannel::wrap(soft.id.channel());
        lock(&soft.own_channels).push(ch);
        ch
    } else {
        channel
    };
    let _g = lock(&soft.update);
    hset!(soft, channel = c_channel);
    Ok(0)
}

/// Reads an option value of exactly `size_of::<T>()` bytes (EINVAL otherwise).
///
/// # Safety
/// `val` is NULL or readable for `len` bytes.
unsafe fn opt_val<T: Copy>(val: *const c_void, len: usize) -> CResult<T> {
    if val.is_null() || len != size_of::<T>() {
        return Err(CError::inval(format!(
            "rdma_set_option: optlen must be {} (got {len})",
            size_of::<T>()
        )));
    }
    // SAFETY: per the contract, `len == size_of::<T>()` bytes are readable.
    Ok(unsafe { val.cast::<T>().read_unaligned() })
}

fn set_option(p: *mut rdma_cm_id, level: c_int, name: c_int, val: *mut c_void, len: usize) -> CResult<c_int> {
    // SAFETY: the caller's option value of `len` bytes (C contract).
    let opt = unsafe {
        match (level, name) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => CmOption::Tos(opt_val::<u8>(val, len)?),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => CmOption::ReuseAddr(opt_val::<c_int>(val, len)? != 0),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => CmOption::AfOnly(opt_val::<c_int>(val, len)? != 0),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => CmOption::AckTimeout(opt_val::<u8>(val, len)?),
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
                return Err(CError::inval("RDMA_OPTION_IB_PATH: iWARP ids have no InfiniBand path"))
            }
            _ => {
                return Err(CError::new(
                    libc::ENOSYS,
                    format!("rdma_set_option: unknown option {name} at level {level}"),
                ))
            }
        }
    };
    with_id(p, |s| Ok(s.id.set_option(opt)?))?;
    Ok(0)
}

/// `rdma_init_qp_attr`: the attributes of `qp_attr->qp_state` for the id's connection, written
/// over the whole struct as librdmacm does. iWARP (the kernel's `iw_cm_init_qp_attr` plus the
/// port): INIT and RTR give state, access flags (remote read and write) and port, RTS only the
/// port (no state: the connection moves the QP to RTS). RoCE (the IB CM's): INIT gives P_Key index, port and access (RC) or Q_Key (UD); RTR
/// and RTS the path, QPN and PSNs, once the REQ (passive side) or REP (active side) arrived.
fn init_qp_attr(p: *mut rdma_cm_id, attr: *mut ibv_qp_attr, mask: *mut c_int) -> CResult<c_int> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    non_null(attr, "qp_attr")?;
    non_null(mask, "qp_attr_mask")?;
    if soft.id.device().is_none() {
        return Err(CError::inval(
            "rdma_init_qp_attr: the id has no device yet (bind, resolve or take a request first)",
        ));
    }
    // SAFETY: non-NULL; the caller sets qp_state before the call.
    let want = unsafe { (*attr).qp_state };
    let state = match QpState::from_u32(want) {
        Some(s @ (QpState::Init | QpState::Rtr | QpState::Rts)) => s,
        _ => {
            return Err(CError::inval(format!(
                "rdma_init_qp_attr: no attributes for QP state {want} (INIT, RTR or RTS)"
            )))
        }
    };
    let (a, bits) = soft.id.init_qp_attr(state)?;
    // SAFETY: non-NULL out-parameters of the caller.
    unsafe {
        attr.write(qp_attr_to_c(&a));
        mask.write(bits as c_int);
    }
    Ok(0)
}

fn establish(p: *mut rdma_cm_id) -> CResult<c_int> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    if on_roce(&soft.id) {
        // The IB CM: the application moved its QP (rdma_init_qp_attr) after CONNECT_RESPONSE;
        // the RTU completes the connection (no further event, as with the kernel).
        soft.id.establish()?;
        refresh_qp_state(soft.qp());
        return Ok(0);
    }
    match soft.id.qp() {
        // The QP named by conn_param.qp_num went to RTS with the connection; nothing is left.
        Some(q) if soft.qp().is_null() && q.state() == softrdma_verbs::QpState::Rts => Ok(0),
        Some(_) if !soft.qp().is_null() => Err(CError::inval("rdma_establish: the id has a QP (the CM completes its connection)")),
        _ => Err(CError::inval(
            "rdma_establish: no connected QP: connect with conn_param.qp_num naming a QP made by ibv_create_qp, and wait for CONNECT_RESPONSE",
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Multicast

/// `rdma_join_multicast[_ex]`: the CM joins (RoCE UD ids; iWARP ids get EOPNOTSUPP) and
/// MULTICAST_JOIN follows with `param.ud.private_data = context`.
fn join_multicast(p: *mut rdma_cm_id, addr: *mut sockaddr, flags: u32, context: *mut c_void) -> CResult<c_int> {
    // SAFETY: the caller's address (C contract).
    let group = unsafe { sockaddr_from_c(addr)? }.ok_or_else(|| CError::inval("rdma_join_multicast: no address"))?;
    let send_only = match flags {
        RDMA_MC_JOIN_FLAG_FULLMEMBER => false,
        RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
        f => return Err(CError::inval(format!("rdma_join_multicast_ex: unknown join flags {f}"))),
    };
    let mgid = match softrdma_cm::addr::canonical(group.ip()) {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    };
    with_id(p, |s| {
        lock(&s.mc_contexts).push((mgid, context as usize));
        let r = s.id.join_multicast(group, send_only);
        if r.is_err() {
            let mut m = lock(&s.mc_contexts);
            if let Some(i) = m.iter().rposition(|(g, _)| *g == mgid) {
                m.remove(i);
            }
        }
        Ok(r?)
    })?;
    Ok(0)
}

fn join_multicast_ex(p: *mut rdma_cm_id, attr: *mut rdma_cm_join_mc_attr_ex, context: *mut c_void) -> CResult<c_int> {
    non_null(attr, "mc_join_attr")?;
    // SAFETY: non-NULL; the caller's struct rdma_cm_join_mc_attr_ex.
    let a = unsafe { attr.read() };
    if a.comp_mask & !(RDMA_CM_JOIN_MC_ATTR_RESERVED - 1) != 0 {
        return Err(CError::unsupported(format!(
            "rdma_join_multicast_ex: comp_mask {:#x} has unknown bits",
            a.comp_mask
        )));
    }
    if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 {
        return Err(CError::inval(
            "rdma_join_multicast_ex: RDMA_CM_JOIN_MC_ATTR_ADDRESS is required",
        ));
    }
    if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0 {
        return Err(CError::inval(
            "rdma_join_multicast_ex: RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS is required",
        ));
    }
    join_multicast(p, a.addr, a.join_flags, context)
}

fn leave_multicast(p: *mut rdma_cm_id, addr: *mut sockaddr) -> CResult<c_int> {
    // SAFETY: the caller's address (C contract).
    let group = unsafe { sockaddr_from_c(addr)? }.ok_or_else(|| CError::inval("rdma_leave_multicast: no address"))?;
    with_id(p, |s| {
        s.id.leave_multicast(group)?;
        let mgid = match softrdma_cm::addr::canonical(group.ip()) {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(v6) => v6.octets(),
        };
        let mut m = lock(&s.mc_contexts);
        if let Some(i) = m.iter().position(|(g, _)| *g == mgid) {
            m.remove(i);
        }
        Ok(())
    })?;
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// QPs on ids

/// librdmacm's `ucma_destroy_cqs`: the CQs and channels the library created for the id.
pub(crate) fn destroy_id_cqs(soft: &SoftCmId) {
    let _g = lock(&soft.update);
    let recv_cq = hget!(soft, recv_cq);
    let send_cq = hget!(soft, send_cq);
    if !recv_cq.is_null() {
        let _ = destroy_cq(recv_cq);
    }
    if !send_cq.is_null() && send_cq != recv_cq {
        let _ = destroy_cq(send_cq);
    }
    hset!(soft, recv_cq = ptr::null_mut());
    hset!(soft, send_cq = ptr::null_mut());
    let recv_ch = hget!(soft, recv_cq_channel);
    let send_ch = hget!(soft, send_cq_channel);
    if !recv_ch.is_null() {
        let _ = destroy_comp_channel(recv_ch);
    }
    if !send_ch.is_null() && send_ch != recv_ch {
        let _ = destroy_comp_channel(send_ch);
    }
    hset!(soft, recv_cq_channel = ptr::null_mut());
    hset!(soft, send_cq_channel = ptr::null_mut());
}

/// librdmacm's `ucma_create_cqs` for one direction: a channel and a CQ of `size` entries with
/// `cq_context = id`; nothing when `size` is 0.
fn create_id_cq(soft: &SoftCmId, size: u32, send: bool) -> CResult<()> {
    if size == 0 {
        return Ok(());
    }
    let verbs = hget!(soft, verbs);
    let ch = create_comp_channel(verbs)?;
    if send {
        hset!(soft, send_cq_channel = ch);
    } else {
        hset!(soft, recv_cq_channel = ch);
    }
    let cqe = c_int::try_from(size).unwrap_or(c_int::MAX);
    let cq = create_cq(verbs, cqe, soft.hdr().cast(), ch)?;
    if send {
        hset!(soft, send_cq = cq);
    } else {
        hset!(soft, recv_cq = cq);
    }
    Ok(())
}

/// `rdma_create_qp`: as librdmacm's `rdma_create_qp_ex` for RC ids. `attr` is updated (CQs
/// and granted sizes).
fn create_qp_on_id(p: *mut rdma_cm_id, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> CResult<()> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    soft.refresh()?;
    if !soft.qp().is_null() {
        return Err(CError::inval("rdma_create_qp: the id already has a QP"));
    }
    let verbs = hget!(soft, verbs);
    let pd = if pd.is_null() { hget!(soft, pd) } else { pd };
    if verbs.is_null() || pd.is_null() {
        return Err(CError::inval(
            "rdma_create_qp: the id has no device yet (bind, resolve or take a request first)",
        ));
    }
    // SAFETY: a PD of this library (C contract, or the id's default PD).
    let soft_pd = unsafe { SoftPd::from_c(pd)? };
    if soft_pd.context() != verbs {
        return Err(CError::inval(
            "rdma_create_qp: the PD belongs to another context than id->verbs",
        ));
    }
    let id_send = hget!(soft, send_cq);
    let id_recv = hget!(soft, recv_cq);
    if (!id_recv.is_null() && !attr.recv_cq.is_null() && id_recv != attr.recv_cq)
        || (!id_send.is_null() && !attr.send_cq.is_null() && id_send != attr.send_cq)
    {
        return Err(CError::inval("rdma_create_qp: the CQs differ from the id's CQs"));
    }
    let made = (|| {
        if attr.send_cq.is_null() && id_send.is_null() {
            create_id_cq(soft, attr.cap.max_send_wr, true)?;
        }
        if attr.recv_cq.is_null() && id_recv.is_null() {
            create_id_cq(soft, attr.cap.max_recv_wr, false)?;
        }
        Ok::<(), CError>(())
    })();
    let created = (|| {
        made?;
        if attr.send_cq.is_null() {
            attr.send_cq = hget!(soft, send_cq);
        }
        if attr.recv_cq.is_null() {
            attr.recv_cq = hget!(soft, recv_cq);
        }
        let id_srq = hget!(soft, srq);
        if !id_srq.is_null() && attr.srq.is_null() {
            attr.srq = id_srq;
        }
        let init = qp_init_from_c(attr)?;
        let qp = soft.id.create_qp(&soft_pd.pd, init)?;
        Ok::<_, CError>(wrap_qp(qp, soft_pd, attr))
    })();
    match created {
        Ok(qp) => {
            let _g = lock(&soft.update);
            hset!(soft, pd = pd);
            hset!(soft, qp = qp);
            Ok(())
        }
        Err(e) => {
            destroy_id_cqs(soft);
            Err(e)
        }
    }
}

fn create_qp(p: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> CResult<c_int> {
    non_null(attr, "qp_init_attr")?;
    // SAFETY: non-NULL; the caller's in/out struct ibv_qp_init_attr.
    create_qp_on_id(p, pd, unsafe { &mut *attr })?;
    Ok(0)
}

fn create_qp_ex(p: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> CResult<c_int> {
    non_null(attr, "qp_init_attr_ex")?;
    // SAFETY: non-NULL; the caller's in/out struct ibv_qp_init_attr_ex.
    let ex = unsafe { &mut *attr };
    if ex.comp_mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS) != 0 {
        return Err(CError::unsupported(format!(
            "rdma_create_qp_ex: comp_mask {:#x} (IBV_QP_INIT_ATTR_PD and IBV_QP_INIT_ATTR_CREATE_FLAGS are supported)",
            ex.comp_mask
        )));
    }
    let flags = if ex.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 {
        ex.create_flags
    } else {
        0
    };
    if flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB != 0 {
        return Err(CError::unsupported(
            "rdma_create_qp_ex: IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: soft-RoCE delivers a multicast send to every \
             attached QP of the host, the sender's included (mckey -l cannot be honoured)",
        ));
    }
    if flags != 0 {
        return Err(CError::unsupported(format!(
            "rdma_create_qp_ex: create_flags {flags:#x} are not supported"
        )));
    }
    let pd = if ex.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
        ex.pd
    } else {
        ptr::null_mut()
    };
    let mut a = ibv_qp_init_attr {
        qp_context: ex.qp_context,
        send_cq: ex.send_cq,
        recv_cq: ex.recv_cq,
        srq: ex.srq,
        cap: ex.cap,
        qp_type: ex.qp_type,
        sq_sig_all: ex.sq_sig_all,
    };
    create_qp_on_id(p, pd, &mut a)?;
    ex.send_cq = a.send_cq;
    ex.recv_cq = a.recv_cq;
    ex.srq = a.srq;
    ex.cap = a.cap;
    // SAFETY: `p` is an id of this library (checked by create_qp_on_id).
    ex.pd = hget!(unsafe { SoftCmId::from_c(p)? }, pd);
    ex.comp_mask |= IBV_QP_INIT_ATTR_PD;
    Ok(0)
}

fn destroy_qp(p: *mut rdma_cm_id) -> CResult<()> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    let qp = soft.qp();
    if !qp.is_null() {
        // SAFETY: id->qp is a QP of this library (C contract).
        let soft_qp = unsafe { SoftQp::from_c(qp)? };
        match soft.id.qp() {
            // The CM holds the QP it created: it destroys it (and forgets it).
            Some(q) if q.qpn() == soft_qp.qp.qpn() => soft.id.destroy_qp()?,
            _ => soft_qp.qp.clone().destroy()?,
        }
        // SAFETY: the verbs QP is destroyed; C gives id->qp up with this call.
        unsafe { free_qp(qp) };
        let _g = lock(&soft.update);
        hset!(soft, qp = ptr::null_mut());
    }
    destroy_id_cqs(soft);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Events

/// `struct rdma_cm_event` plus the CM event, acknowledged when this is dropped.
#[repr(C)]
struct SoftEvent {
    c: rdma_cm_event,
    /// The CM event, acknowledged when dropped. A CONNECT_REQUEST is acknowledged to the CM
    /// when taken (`None` here): librdmacm counts it against the listener, so the new id may be
    /// destroyed before the event is acked, which the CM (counting it on the new id) would
    /// otherwise wait for.
    _ev: Option<CmEvent>,
    /// `param.conn.private_data` points here.
    _private_data: Vec<u8>,
}
c_object!(SoftEvent, rdma_cm_event, "event");

/// The C id for a CONNECT_REQUEST's new id: inherits the listener's context, channel, port
/// space and QP type. Returns the new id and the listener's C id, or `None` when the listener
/// is gone (being destroyed).
fn new_child(child: &CmId, listener: &CmId) -> CResult<Option<(*mut rdma_cm_id, *mut rdma_cm_id)>> {
    // The listener's fields are read under the registry lock: destroy_id unregisters (under it)
    // before freeing, and the listener does not wait for CONNECT_REQUESTs to be acked.
    let inherited = {
        let ids = ids();
        ids.iter().find(|(i, _)| i == listener).map(|&(_, a)| {
            // SAFETY: registered ids are live while the registry lock is held.
            let l = unsafe { &*(a as *const SoftCmId) };
            (
                a as *mut rdma_cm_id,
                hget!(l, channel),
                hget!(l, context),
                hget!(l, ps),
                hget!(l, qp_type),
            )
        })
    };
    let Some((l, channel, context, ps, qp_type)) = inherited else {
        return Ok(None);
    };
    Ok(Some((new_c_id(child.clone(), channel, context, ps, qp_type)?, l)))
}

/// The events that report a failure (their `reason` says why).
fn is_error_event(e: EventType) -> bool {
    matches!(
        e,
        EventType::AddrError
            | EventType::RouteError
            | EventType::ConnectError
            | EventType::Unreachable
            | EventType::Rejected
            | EventType::MulticastError
    )
}

fn get_cm_event(channel: *mut rdma_event_channel, out: *mut *mut rdma_cm_event) -> CResult<c_int> {
    // SAFETY: `channel` is one of this library's (C contract).
    // A clone: the application may destroy the channel while this call blocks (rping's
    // cm_thread waits here when main calls rdma_destroy_event_channel); the wait must only
    // touch what it owns (AddressSanitizer: heap-use-after-free, scripts/asan.sh tools).
    let ch = unsafe { SoftEventChannel::from_c(channel) }
        .map_err(crate::exit::unless_exiting)?
        .ch
        .clone();
    non_null(out, "event")?;
    loop {
        let ev = ch.get_event(None)?;
        let (id, listen) = match (c_id_of(&ev.id), &ev.listen_id) {
            (Some(p), l) => (p, l.as_ref().and_then(c_id_of)),
            (None, Some(l)) if ev.event == EventType::ConnectRequest => match new_child(&ev.id, l)? {
                Some((p, l)) => (p, Some(l)),
                // The listener is being destroyed: dropping the event drops (rejects) the request.
                None => continue,
            },
            // An id the application destroyed meanwhile; dropping acknowledges the event.
            _ => continue,
        };
        // SAFETY: the id is live: destroy_id waits until its events (this one) are acked, and a
        // new CONNECT_REQUEST id is not known to the application yet.
        let soft = unsafe { SoftCmId::from_c(id)? };
        soft.refresh()?;
        if matches!(
            ev.event,
            EventType::Established
                | EventType::Disconnected
                | EventType::Rejected
                | EventType::ConnectError
                | EventType::Unreachable
        ) {
            refresh_qp_state(soft.qp());
        }
        let mut c = rdma_cm_event::zeroed();
        c.id = id;
        c.listen_id = listen.unwrap_or(ptr::null_mut());
        let qpless_response =
            ev.event == EventType::Established && soft.qpless.swap(false, std::sync::atomic::Ordering::AcqRel);
        c.event = if qpless_response {
            EventType::ConnectResponse as u32
        } else {
            ev.event as u32
        };
        c.status = ev.status;
        if is_error_event(ev.event) && !ev.reason.is_empty() {
            // An asynchronous failure: the call that started it succeeded, so without this
            // SOFTRDMA_DEBUG would never say why (e.g. UCX only reports "Destination is
            // unreachable" for an ADDR_ERROR).
            crate::error::debug_note(&format!("{} (status {}): {}", ev.event.as_str(), ev.status, ev.reason));
        }
        let private_data = ev.param.private_data.clone();
        let multicast = matches!(ev.event, EventType::MulticastJoin | EventType::MulticastError);
        if let Some(ud) = ev.ud.filter(|_| !multicast) {
            c.param.ud = rdma_ud_param {
                private_data: if private_data.is_empty() {
                    ptr::null()
                } else {
                    private_data.as_ptr().cast()
                },
                private_data_len: u8::try_from(private_data.len()).unwrap_or(u8::MAX),
                ah_attr: ah_to_c(&ud.ah_attr),
                qp_num: ud.qp_num,
                qkey: ud.qkey,
            };
        } else if multicast {
            // librdmacm: private_data is the context given to rdma_join_multicast. A group
            // whose join failed is forgotten.
            let ud = ev.ud.unwrap_or_default();
            let context = {
                let mut m = lock(&soft.mc_contexts);
                let i = m.iter().rposition(|(g, _)| *g == ud.ah_attr.dgid);
                let c = i.map_or(0, |i| m[i].1);
                if let (Some(i), EventType::MulticastError) = (i, ev.event) {
                    m.remove(i);
                }
                c
            };
            c.param.ud = rdma_ud_param {
                private_data: context as *const c_void,
                private_data_len: 0,
                ah_attr: ah_to_c(&ud.ah_attr),
                qp_num: ud.qp_num,
                qkey: ud.qkey,
            };
        } else {
            c.param.conn = rdma_conn_param {
                private_data: if private_data.is_empty() {
                    ptr::null()
                } else {
                    private_data.as_ptr().cast()
                },
                private_data_len: u8::try_from(private_data.len()).unwrap_or(u8::MAX),
                responder_resources: ev.param.responder_resources,
                initiator_depth: ev.param.initiator_depth,
                flow_control: ev.param.flow_control,
                retry_count: ev.param.retry_count,
                rnr_retry_count: ev.param.rnr_retry_count,
                srq: u8::from(ev.param.srq),
                qp_num: ev.param.qp_num,
            };
        }
        let ev = if ev.event == EventType::ConnectRequest {
            ev.ack();
            None
        } else {
            Some(ev)
        };
        // The Vec's heap buffer does not move with the Vec.
        let p = SoftEvent {
            c,
            _ev: ev,
            _private_data: private_data,
        }
        .into_c();
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { out.write(p) };
        return Ok(0);
    }
}

fn ack_cm_event(p: *mut rdma_cm_event) -> CResult<c_int> {
    // SAFETY: checked to be a live event of this library before it is taken back.
    unsafe { SoftEvent::from_c(p)? };
    // SAFETY: an event from rdma_get_cm_event (checked above); C gives it up with this call.
    drop(unsafe { SoftEvent::from_c_owned(p) });
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// Synchronous endpoints

fn get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> CResult<c_int> {
    // SAFETY: `listen` is an id of this library (C contract).
    let l = unsafe { SoftCmId::from_c(listen)? };
    non_null(out, "id")?;
    let child = l.id.get_request(None)?;
    let context = hget!(l, context);
    let ps = hget!(l, ps);
    let qp_type = hget!(l, qp_type);
    let p = match new_c_id(child.clone(), ptr::null_mut(), context, ps, qp_type) {
        Ok(p) => p,
        Err(e) => {
            let _ = child.reject(&[]);
            let _ = child.destroy();
            return Err(e);
        }
    };
    let saved = lock(&l.ep_qp_attr).as_ref().copied();
    if let Some(mut attr) = saved {
        let pd = hget!(l, pd);
        if let Err(e) = create_qp_on_id(p, pd, &mut attr) {
            let _ = child.reject(&[]);
            let _ = destroy_id(p);
            return Err(e);
        }
    }
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { out.write(p) };
    Ok(0)
}

fn create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> CResult<c_int> {
    non_null(out, "id")?;
    non_null(res, "res")?;
    // SAFETY: non-NULL; the caller's rdma_addrinfo (normally from rdma_getaddrinfo).
    let res = unsafe { &*res };
    ucma_init()?;
    let space = u32::try_from(res.ai_port_space)
        .ok()
        .and_then(PortSpace::from_u32)
        .ok_or_else(|| CError::inval(format!("rdma_create_ep: unknown port space {:#x}", res.ai_port_space)))?;
    let id = CmId::create(None, space)?;
    let qp_type = u32::try_from(res.ai_qp_type).unwrap_or(IBV_QPT_RC);
    let p = new_c_id(id, ptr::null_mut(), ptr::null_mut(), res.ai_port_space, qp_type)?;
    let setup = (|| {
        // SAFETY: `p` was just created.
        let soft = unsafe { SoftCmId::from_c(p)? };
        if res.ai_flags & RAI_PASSIVE != 0 {
            bind_addr(p, res.ai_src_addr)?;
            if !pd.is_null() {
                let _g = lock(&soft.update);
                hset!(soft, pd = pd);
            }
            if !qp_init_attr.is_null() {
                // SAFETY: non-NULL; the caller's attributes, copied.
                let mut a = unsafe { *qp_init_attr };
                a.qp_type = qp_type;
                *lock(&soft.ep_qp_attr) = Some(a);
            }
            return Ok(());
        }
        resolve_addr(p, res.ai_src_addr, res.ai_dst_addr, EP_RESOLVE_TIMEOUT_MS)?;
        resolve_route(p, EP_RESOLVE_TIMEOUT_MS)?;
        if !qp_init_attr.is_null() {
            // SAFETY: non-NULL; the caller's in/out attributes.
            let a = unsafe { &mut *qp_init_attr };
            a.qp_type = qp_type;
            create_qp_on_id(p, pd, a)?;
        }
        Ok::<(), CError>(())
    })();
    if let Err(e) = setup {
        let _ = destroy_ep(p);
        return Err(e);
    }
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { out.write(p) };
    Ok(0)
}

fn destroy_ep(p: *mut rdma_cm_id) -> CResult<()> {
    // SAFETY: `p` is an id of this library (C contract).
    let soft = unsafe { SoftCmId::from_c(p)? };
    if !soft.qp().is_null() {
        destroy_qp(p)?;
    }
    let srq = hget!(soft, srq);
    if !srq.is_null() {
        let _ = destroy_srq(srq);
        {
            let _g = lock(&soft.update);
            hset!(soft, srq = ptr::null_mut());
        }
        destroy_id_cqs(soft);
    }
    destroy_id(p)?;
    Ok(())
}

const _: () = assert!(offset_of!(rdma_cm_id, route) == 32);

c_fn! {
    /// `struct rdma_event_channel *rdma_create_event_channel(void)`: NULL with ENODEV when the
    /// host has no RDMA device.
    fn rdma_create_event_channel() -> *mut rdma_event_channel {
        ret_ptr(create_event_channel())
    }

    /// `void rdma_destroy_event_channel(struct rdma_event_channel *)`.
    fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
        // SAFETY: only checked here.
        match unsafe { SoftEventChannel::from_c(channel) } {
            // SAFETY: a live channel of this library; C gives it up with this call.
            Ok(_) => drop(unsafe { SoftEventChannel::from_c_owned(channel) }),
            Err(e) if !channel.is_null() => crate::error::report(e),
            Err(_) => {}
        }
    }

    /// `int rdma_create_id(struct rdma_event_channel *, struct rdma_cm_id **, void *context,
    /// enum rdma_port_space ps)`: 0, or -1 and errno (as every `int rdma_*` call). A NULL
    /// channel makes a synchronous id.
    fn rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: c_int,
    ) -> c_int {
        ret_neg1(create_id(channel, id, context, ps))
    }

    /// `int rdma_destroy_id(struct rdma_cm_id *)`: waits until the id's events are acked.
    fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
        ret_neg1(destroy_id(id))
    }

    /// `int rdma_bind_addr(struct rdma_cm_id *, struct sockaddr *)`.
    fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
        ret_neg1(bind_addr(id, addr))
    }

    /// `int rdma_resolve_addr(struct rdma_cm_id *, struct sockaddr *src, struct sockaddr *dst,
    /// int timeout_ms)`.
    fn rdma_resolve_addr(id: *mut rdma_cm_id, src: *mut sockaddr, dst: *mut sockaddr, timeout_ms: c_int) -> c_int {
        ret_neg1(resolve_addr(id, src, dst, timeout_ms))
    }

    /// `int rdma_resolve_route(struct rdma_cm_id *, int timeout_ms)`.
    fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
        ret_neg1(resolve_route(id, timeout_ms))
    }

    /// `int rdma_create_qp(struct rdma_cm_id *, struct ibv_pd *, struct ibv_qp_init_attr *)`:
    /// a NULL PD means the id's PD (the device's default); NULL CQs are created with a
    /// completion channel each and `cq_context = id`, as librdmacm does.
    fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> c_int {
        ret_neg1(create_qp(id, pd, qp_init_attr))
    }

    /// `int rdma_create_qp_ex(struct rdma_cm_id *, struct ibv_qp_init_attr_ex *)`: the
    /// attributes of `rdma_create_qp`, with comp_mask IBV_QP_INIT_ATTR_PD and
    /// IBV_QP_INIT_ATTR_CREATE_FLAGS (create_flags 0; others are EOPNOTSUPP).
    fn rdma_create_qp_ex(id: *mut rdma_cm_id, qp_init_attr: *mut ibv_qp_init_attr_ex) -> c_int {
        ret_neg1(create_qp_ex(id, qp_init_attr))
    }

    /// `void rdma_destroy_qp(struct rdma_cm_id *)`: also destroys the CQs and channels
    /// `rdma_create_qp` created.
    fn rdma_destroy_qp(id: *mut rdma_cm_id) {
        ret_or(destroy_qp(id), ())
    }

    /// `int rdma_connect(struct rdma_cm_id *, struct rdma_conn_param *)`.
    fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
        ret_neg1(connect(id, conn_param))
    }

    /// `int rdma_establish(struct rdma_cm_id *)`: completes a connection of an id without a QP
    /// after CONNECT_RESPONSE (RoCE: sends the RTU once the application moved its QP to RTS;
    /// iWARP: the QP named by conn_param.qp_num is already connected).
    fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
        ret_neg1(establish(id))
    }

    /// `int rdma_listen(struct rdma_cm_id *, int backlog)`.
    fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
        ret_neg1(listen(id, backlog))
    }

    /// `int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)`: for
    /// synchronous listeners; creates the QP `rdma_create_ep` was given.
    fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
        ret_neg1(get_request(listen, id))
    }

    /// `int rdma_accept(struct rdma_cm_id *, struct rdma_conn_param *)`.
    fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
        ret_neg1(accept(id, conn_param))
    }

    /// `int rdma_reject(struct rdma_cm_id *, const void *private_data, uint8_t len)`.
    fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> c_int {
        ret_neg1(reject(id, private_data, private_data_len))
    }

    /// `int rdma_disconnect(struct rdma_cm_id *)`.
    fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
        ret_neg1(disconnect(id))
    }

    /// `int rdma_get_cm_event(struct rdma_event_channel *, struct rdma_cm_event **)`: blocks
    /// (EAGAIN when the channel's fd is O_NONBLOCK and nothing waits).
    fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int {
        ret_neg1(get_cm_event(channel, event))
    }

    /// `int rdma_ack_cm_event(struct rdma_cm_event *)`: frees the event.
    fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
        ret_neg1(ack_cm_event(event))
    }

    /// `int rdma_set_option(struct rdma_cm_id *, int level, int optname, void *optval,
    /// size_t optlen)`: RDMA_OPTION_ID TOS, REUSEADDR, AFONLY, ACK_TIMEOUT; a wrong optlen is
    /// EINVAL, an unknown option ENOSYS.
    fn rdma_set_option(
        id: *mut rdma_cm_id,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: usize,
    ) -> c_int {
        ret_neg1(set_option(id, level, optname, optval, optlen))
    }

    /// `int rdma_migrate_id(struct rdma_cm_id *, struct rdma_event_channel *)`: NULL makes
    /// the id synchronous.
    fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
        ret_neg1(migrate_id(id, channel))
    }

    /// `int rdma_init_qp_attr(struct rdma_cm_id *, struct ibv_qp_attr *, int *qp_attr_mask)`:
    /// the attributes of `qp_attr->qp_state` (INIT, RTR or RTS) for the id's connection.
    fn rdma_init_qp_attr(id: *mut rdma_cm_id, qp_attr: *mut ibv_qp_attr, qp_attr_mask: *mut c_int) -> c_int {
        ret_neg1(init_qp_attr(id, qp_attr, qp_attr_mask))
    }

    /// `int rdma_join_multicast(struct rdma_cm_id *, struct sockaddr *addr, void *context)`:
    /// joins an IPv4 group as a full member (RoCE UD ids; iWARP: EOPNOTSUPP); MULTICAST_JOIN
    /// follows at once with the group's address vector, QPN 0xFFFFFF and RDMA_UDP_QKEY.
    fn rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr, context: *mut c_void) -> c_int {
        ret_neg1(join_multicast(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context))
    }

    /// `int rdma_join_multicast_ex(struct rdma_cm_id *, struct rdma_cm_join_mc_attr_ex *,
    /// void *context)`: comp_mask ADDRESS and JOIN_FLAGS are required; a send-only full member
    /// does not attach the id's QP.
    fn rdma_join_multicast_ex(
        id: *mut rdma_cm_id,
        mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
        context: *mut c_void,
    ) -> c_int {
        ret_neg1(join_multicast_ex(id, mc_join_attr, context))
    }

    /// `int rdma_leave_multicast(struct rdma_cm_id *, struct sockaddr *)`: detaches the QP;
    /// EADDRNOTAVAIL for a group the id did not join.
    fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
        ret_neg1(leave_multicast(id, addr))
    }

    /// `int rdma_create_ep(struct rdma_cm_id **, struct rdma_addrinfo *, struct ibv_pd *,
    /// struct ibv_qp_init_attr *)`: a synchronous id; passive (RAI_PASSIVE) binds and keeps the
    /// QP attributes for `rdma_get_request`, active resolves (2 s) and creates the QP.
    fn rdma_create_ep(
        id: *mut *mut rdma_cm_id,
        res: *mut rdma_addrinfo,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        ret_neg1(create_ep(id, res, pd, qp_init_attr))
    }

    /// `void rdma_destroy_ep(struct rdma_cm_id *)`: the QP, SRQ, their CQs, and the id.
    fn rdma_destroy_ep(id: *mut rdma_cm_id) {
        ret_or(destroy_ep(id), ())
    }
}
