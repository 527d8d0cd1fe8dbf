//! The verbs objects C sees: protection domains, memory regions, completion channels, CQs,
//! QPs and SRQs (`ibv_alloc_pd` ... `ibv_destroy_srq`).
//!
//! Every object is a `#[repr(C)]` Rust struct whose FIRST field is the C header (checked with
//! a const `offset_of!` assert), allocated with `Box::into_raw` and freed only by its destroy
//! call, so the pointer C holds is the object's address and the data path (`datapath.rs`)
//! reaches the Rust state with one cast. Headers that change after creation (CQ event
//! counters, QP state, channel refcount) sit in an `UnsafeCell`, which has the layout of the
//! struct it wraps.
//!
//! Objects are trusted as rdma-core's providers trust them: a pointer passed in must be one
//! this library handed out and has not destroyed (the C API contract); NULL is rejected with
//! EINVAL.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint, c_void};
use std::mem::offset_of;
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use softrdma_verbs::device::TransportKind;
use softrdma_verbs::qp::AhAttr;
use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::{Access, CompChannel, Cq, Mr, Pd, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, Srq, SrqAttr};

use crate::abi::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex, ibv_gid, ibv_global_route, ibv_mr, ibv_pd, ibv_qp,
    ibv_qp_attr, ibv_qp_cap, ibv_qp_ex, ibv_qp_init_attr, ibv_srq, ibv_srq_init_attr,
};
use crate::async_events::{self, Object};
use crate::context::with_context;
use crate::error::{non_null, ret_errno, ret_neg1, ret_or, ret_ptr, CError, CResult};

/// Declares the boundary helpers of a soft object whose first field `c` is the C header.
macro_rules! c_object {
    ($soft:ident, $c:ty, $what:literal) => {
        const _: () = assert!(
            offset_of!($soft, c) == 0,
            concat!($what, ": the C header must be first")
        );

        impl $soft {
            /// The addresses of the live objects of this type (created by [`Self::into_c`],
            /// not yet taken back by [`Self::from_c_owned`]): a pointer C passes in is one of
            /// them or it is refused, whatever it points at.
            ///
            /// One set per fork generation: in a forked child, the parent's objects are not
            /// live (EINVAL), and the set's lock was never held by a parent's thread.
            fn live() -> std::sync::MutexGuard<'static, std::collections::HashSet<usize>> {
                static LIVE: softrdma_verbs::fork::PerProcess<std::sync::Mutex<std::collections::HashSet<usize>>> =
                    softrdma_verbs::fork::PerProcess::new();
                LIVE.get_or_init(Default::default)
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            }

            /// The object behind a pointer this library handed out; EINVAL for NULL or for a
            /// pointer that is not a live object of this type (a foreign pointer, an object of
            /// another type, or one already destroyed).
            ///
            /// # Safety
            /// A live object stays valid for `'a` (C may not destroy it during the call).
            #[allow(dead_code)]
            pub(crate) unsafe fn from_c<'a>(p: *mut $c) -> CResult<&'a $soft> {
                non_null(p, $what)?;
                if !Self::live().contains(&(p as usize)) {
                    return Err(CError::inval(concat!(
                        $what,
                        " is not a live object of this library (a foreign pointer, or destroyed already)"
                    )));
                }
                // SAFETY: registered, so `p` is the address of a live $soft (its C header is
                // at offset 0), valid for `'a` per this function's contract.
                Ok(unsafe { &*p.cast::<$soft>() })
            }

            /// The pointer handed to C.
            #[allow(dead_code)]
            pub(crate) fn as_c(&self) -> *mut $c {
                ptr::from_ref(self).cast_mut().cast()
            }

            /// Moves the object to the heap; the returned pointer is what C holds.
            pub(crate) fn into_c(self) -> *mut $c {
                let p: *mut $c = Box::into_raw(Box::new(self)).cast();
                Self::live().insert(p as usize);
                p
            }

            /// Takes ownership back (for destroy).
            ///
            /// # Safety
            /// `p` came from [`Self::into_c`] and is not used by C after this call.
            pub(crate) unsafe fn from_c_owned(p: *mut $c) -> Box<$soft> {
                Self::live().remove(&(p as usize));
                // SAFETY: per the contract, `p` is a Box<$soft> leaked by into_c.
                unsafe { Box::from_raw(p.cast::<$soft>()) }
            }
        }
    };
}

pub(crate) use c_object;

/// Values for the `handle` fields (kernel object handles in rdma-core; informational here).
fn next_handle() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// Protection domains and memory regions

/// `struct ibv_pd` plus the verbs PD.
#[repr(C)]
pub(crate) struct SoftPd {
    c: ibv_pd,
    pub(crate) pd: Pd,
}
c_object!(SoftPd, ibv_pd, "pd");

impl SoftPd {
    /// The `ibv_context` this PD was allocated on.
    pub(crate) fn context(&self) -> *mut ibv_context {
        self.c.context
    }
}

/// Allocates a PD on `ctx` (also used for librdmacm's per-device default PD).
pub(crate) fn alloc_pd(ctx: *mut ibv_context) -> CResult<*mut ibv_pd> {
    let pd = with_context(ctx, |c| Ok(c.verbs().alloc_pd()?))?;
    let c = ibv_pd {
        context: ctx,
        handle: next_handle(),
    };
    Ok(SoftPd { c, pd }.into_c())
}

fn dealloc_pd(p: *mut ibv_pd) -> CResult<()> {
    // SAFETY: `p` is a PD of this library (C contract).
    let pd = unsafe { SoftPd::from_c(p)? };
    pd.pd.clone().dealloc()?;
    // SAFETY: checked above; C gives up the pointer with this call.
    drop(unsafe { SoftPd::from_c_owned(p) });
    Ok(())
}

/// `struct ibv_mr` plus the registration (deregistered when dropped).
#[repr(C)]
pub(crate) struct SoftMr {
    pub(crate) c: ibv_mr,
    pub(crate) mr: Mr,
}
c_object!(SoftMr, ibv_mr, "mr");

pub(crate) fn reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> CResult<*mut ibv_mr> {
    // SAFETY: `p` is a PD of this library (C contract).
    let pd = unsafe { SoftPd::from_c(p)? };
    if length == 0 {
        return Err(CError::inval("reg_mr: length 0 registers nothing"));
    }
    if addr.is_null() {
        return Err(CError::new(libc::EFAULT, "reg_mr: addr is NULL"));
    }
    // Optional access bits (RELAXED_ORDERING, the optional range) only tune performance.
    let access = Access(access & !Access::OPTIONAL_MASK);
    // SAFETY: ibv_reg_mr's contract: `addr..addr+length` stays valid until ibv_dereg_mr.
    let mr = unsafe { pd.pd.reg_mr_raw(addr.cast(), length, iova, access)? };
    let c = ibv_mr {
        context: pd.context(),
        pd: p,
        addr,
        length,
        handle: next_handle(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    Ok(SoftMr { c, mr }.into_c())
}

fn dereg_mr(p: *mut ibv_mr) -> CResult<()> {
    // SAFETY: `p` is an MR of this library (C contract).
    let soft = unsafe { SoftMr::from_c(p)? };
    let bound = soft.mr.inner().mw_binds.load(Ordering::Acquire);
    if bound > 0 {
        return Err(CError::new(
            libc::EBUSY,
            format!("dereg_mr: {bound} memory window(s) are bound to the MR; invalidate or free them first"),
        ));
    }
    // SAFETY: C gives the pointer up with this call.
    let mr = unsafe { SoftMr::from_c_owned(p) };
    mr.mr.dereg()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Completion channels and CQs

/// `struct ibv_comp_channel` (`fd` is the verbs channel's eventfd) plus the CQs that report to
/// it, so `ibv_get_cq_event` can return the C CQ.
#[repr(C)]
pub(crate) struct SoftCompChannel {
    c: UnsafeCell<ibv_comp_channel>,
    pub(crate) ch: CompChannel,
    /// `(verbs CQ id, C CQ address)` of the CQs created on this channel.
    cqs: Mutex<Vec<(u64, usize)>>,
}
c_object!(SoftCompChannel, ibv_comp_channel, "channel");

impl SoftCompChannel {
    fn refcnt(&self) -> &AtomicI32 {
        // SAFETY: `refcnt` is a live, aligned i32 inside our UnsafeCell; every access to it
        // after creation goes through this atomic view.
        unsafe { AtomicI32::from_ptr(ptr::addr_of_mut!((*self.c.get()).refcnt)) }
    }

    fn cq_list(&self) -> std::sync::MutexGuard<'_, Vec<(u64, usize)>> {
        self.cqs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Creates a completion channel on `ctx`.
pub(crate) fn create_comp_channel(ctx: *mut ibv_context) -> CResult<*mut ibv_comp_channel> {
    crate::exit::watch_for_exit();
    let ch = with_context(ctx, |c| Ok(c.verbs().create_comp_channel()?))?;
    let c = ibv_comp_channel {
        context: ctx,
        fd: ch.fd(),
        refcnt: 0,
    };
    Ok(SoftCompChannel {
        c: UnsafeCell::new(c),
        ch,
        cqs: Mutex::new(Vec::new()),
    }
    .into_c())
}

/// Destroys a completion channel: EBUSY while a CQ uses it.
pub(crate) fn destroy_comp_channel(p: *mut ibv_comp_channel) -> CResult<()> {
    // SAFETY: `p` is a channel of this library (C contract).
    let ch = unsafe { SoftCompChannel::from_c(p)? };
    let users = ch.refcnt().load(Ordering::Acquire);
    if users > 0 {
        return Err(CError::new(
            libc::EBUSY,
            format!("destroy_comp_channel: still used by {users} CQ(s)"),
        ));
    }
    // SAFETY: C gives the pointer up with this call.
    drop(unsafe { SoftCompChannel::from_c_owned(p) });
    Ok(())
}

/// `struct ibv_cq` plus the verbs CQ.
#[repr(C)]
pub(crate) struct SoftCq {
    /// An `ibv_cq_ex` for every CQ (it starts with the fields of an `ibv_cq`); its polling
    /// slots are set only for a CQ made by `ibv_create_cq_ex`.
    pub(crate) c: UnsafeCell<ibv_cq_ex>,
    pub(crate) cq: Cq,
    channel: *mut ibv_comp_channel,
    /// The extended CQ's polling state (`ibv_start_poll` .. `ibv_end_poll`).
    pub(crate) ex: Option<crate::cq_ex::PollState>,
}
c_object!(SoftCq, ibv_cq, "cq");
const _: () = assert!(
    offset_of!(ibv_cq_ex, async_events_completed) == offset_of!(ibv_cq, async_events_completed)
        && offset_of!(ibv_cq_ex, cqe) == offset_of!(ibv_cq, cqe)
        && offset_of!(ibv_cq_ex, cond) == offset_of!(ibv_cq, cond),
    "an ibv_cq_ex starts with an ibv_cq's fields"
);

impl SoftCq {
    /// The context the CQ was created on (written once at creation).
    pub(crate) fn context(&self) -> *mut ibv_context {
        // SAFETY: a plain read of a field only written at creation.
        unsafe { ptr::addr_of!((*self.c.get()).context).read() }
    }

    /// True if the CQ reports to a completion channel.
    pub(crate) fn has_channel(&self) -> bool {
        !self.channel.is_null()
    }
}

/// Creates a CQ; `cq_context` and `channel` are reported back by `ibv_get_cq_event`.
pub(crate) fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
) -> CResult<*mut ibv_cq> {
    create_cq_with(ctx, cqe, cq_context, channel, None)
}

/// [`create_cq`] with the extended polling interface when `ex` is given.
pub(crate) fn create_cq_with(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    ex: Option<crate::cq_ex::PollState>,
) -> CResult<*mut ibv_cq> {
    let cqe = u32::try_from(cqe).map_err(|_| CError::inval(format!("create_cq: cqe {cqe} is negative")))?;
    let soft_ch = if channel.is_null() {
        None
    } else {
        // SAFETY: a non-NULL channel is one of this library's (C contract).
        Some(unsafe { SoftCompChannel::from_c(channel)? })
    };
    let cq = with_context(ctx, |c| Ok(c.verbs().create_cq(cqe, soft_ch.map(|s| &s.ch))?))?;
    let mut c = ibv_cq_ex::zeroed();
    if ex.is_some() {
        crate::cq_ex::fill_ops(&mut c);
    }
    c.context = ctx;
    c.channel = channel;
    c.cq_context = cq_context;
    c.handle = next_handle();
    c.cqe = c_int::try_from(cq.capacity()).unwrap_or(c_int::MAX);
    c.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    c.cond = libc::PTHREAD_COND_INITIALIZER;
    let id = cq.inner().id();
    let p = SoftCq {
        c: UnsafeCell::new(c),
        cq,
        channel,
        ex,
    }
    .into_c();
    if let Some(ch) = soft_ch {
        ch.refcnt().fetch_add(1, Ordering::AcqRel);
        ch.cq_list().push((id, p as usize));
    }
    async_events::register(Object::Cq(id), p.cast());
    Ok(p)
}

/// Destroys a CQ: EBUSY while a QP or SRQ uses it.
pub(crate) fn destroy_cq(p: *mut ibv_cq) -> CResult<()> {
    // SAFETY: `p` is a CQ of this library (C contract).
    let cq = unsafe { SoftCq::from_c(p)? };
    let events = with_context(cq.context(), |c| Ok(c.verbs().async_events().clone()))?;
    let id = cq.cq.inner().id();
    async_events::before_destroy(&events, Object::Cq(id), p.cast())?;
    cq.cq.clone().destroy()?;
    async_events::unregister(Object::Cq(id), p.cast());
    if !cq.channel.is_null() {
        // SAFETY: the channel outlives its CQs (destroy_comp_channel refuses while refcnt > 0).
        let ch = unsafe { SoftCompChannel::from_c(cq.channel)? };
        ch.cq_list().retain(|&(_, addr)| addr != p as usize);
        ch.refcnt().fetch_sub(1, Ordering::AcqRel);
    }
    // SAFETY: C gives the pointer up with this call.
    let cq = unsafe { SoftCq::from_c_owned(p) };
    // SAFETY: nobody else can hold the CQ's lock now (C may not use a CQ being destroyed).
    unsafe {
        libc::pthread_cond_destroy(ptr::addr_of_mut!((*cq.c.get()).cond));
        libc::pthread_mutex_destroy(ptr::addr_of_mut!((*cq.c.get()).mutex));
    }
    Ok(())
}

fn get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> CResult<c_int> {
    // SAFETY: `channel` is a channel of this library (C contract).
    let ch = unsafe { SoftCompChannel::from_c(channel) }.map_err(crate::exit::unless_exiting)?;
    non_null(cq, "cq")?;
    non_null(cq_context, "cq_context")?;
    loop {
        let got = ch.ch.get_cq_event(None)?;
        let id = got.inner().id();
        // Held while reading the CQ: destroy_cq unregisters (under this lock) before freeing.
        let list = ch.cq_list();
        // An event of a CQ destroyed meanwhile has no C object any more: wait for the next.
        if let Some(&(_, addr)) = list.iter().find(|&&(cq_id, _)| cq_id == id) {
            let c_cq = addr as *mut ibv_cq;
            // SAFETY: registered CQs are live while the lock is held; the out-pointers were
            // checked above.
            unsafe {
                cq.write(c_cq);
                cq_context.write((*c_cq).cq_context);
            }
            return Ok(0);
        }
    }
}

fn ack_cq_events(p: *mut ibv_cq, nevents: c_uint) -> CResult<()> {
    // SAFETY: `p` is a CQ of this library (C contract).
    let cq = unsafe { SoftCq::from_c(p)? };
    cq.cq.ack_events(nevents);
    let c = cq.c.get();
    // SAFETY: the mutex and cond were initialised at creation; comp_events_completed is only
    // written under that mutex, as in libibverbs.
    unsafe {
        libc::pthread_mutex_lock(ptr::addr_of_mut!((*c).mutex));
        (*c).comp_events_completed = (*c).comp_events_completed.wrapping_add(nevents);
        libc::pthread_cond_signal(ptr::addr_of_mut!((*c).cond));
        libc::pthread_mutex_unlock(ptr::addr_of_mut!((*c).mutex));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Shared receive queues

/// `struct ibv_srq` plus the verbs SRQ.
#[repr(C)]
pub(crate) struct SoftSrq {
    c: UnsafeCell<ibv_srq>,
    pub(crate) srq: Srq,
}
c_object!(SoftSrq, ibv_srq, "srq");

pub(crate) fn create_srq(p: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> CResult<*mut ibv_srq> {
    // SAFETY: `p` is a PD of this library (C contract).
    let pd = unsafe { SoftPd::from_c(p)? };
    non_null(attr, "srq_init_attr")?;
    // SAFETY: non-NULL; the caller's struct ibv_srq_init_attr.
    let init = unsafe { &mut *attr };
    let srq = Srq::new(
        &pd.pd,
        SrqAttr {
            max_wr: init.attr.max_wr,
            max_sge: init.attr.max_sge,
            srq_limit: init.attr.srq_limit,
        },
    )?;
    let granted = srq.query();
    init.attr.max_wr = granted.max_wr;
    init.attr.max_sge = granted.max_sge;
    let mut c = ibv_srq::zeroed();
    c.context = pd.context();
    c.srq_context = init.srq_context;
    c.pd = p;
    c.handle = next_handle();
    c.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    c.cond = libc::PTHREAD_COND_INITIALIZER;
    let id = srq.inner().id;
    let p = SoftSrq {
        c: UnsafeCell::new(c),
        srq,
    }
    .into_c();
    async_events::register(Object::Srq(id), p.cast());
    Ok(p)
}

/// Destroys an SRQ: EBUSY while a QP uses it.
pub(crate) fn destroy_srq(p: *mut ibv_srq) -> CResult<()> {
    // SAFETY: `p` is an SRQ of this library (C contract).
    let srq = unsafe { SoftSrq::from_c(p)? };
    let events = srq.srq.pd().context().async_events().clone();
    let id = srq.srq.inner().id;
    async_events::before_destroy(&events, Object::Srq(id), p.cast())?;
    srq.srq.clone().destroy()?;
    async_events::unregister(Object::Srq(id), p.cast());
    // SAFETY: C gives the pointer up with this call.
    drop(unsafe { SoftSrq::from_c_owned(p) });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Queue pairs

/// `struct ibv_qp` plus the verbs QP. `state` in the header follows the QP: it is written on
/// create, modify, query and on connection events (see [`refresh_qp_state`]).
#[repr(C)]
pub(crate) struct SoftQp {
    /// An `ibv_qp_ex` for every QP (it starts with the `ibv_qp`); its `wr_*` slots are set
    /// only for a QP created with `send_ops_flags` (`ibv_qp_to_qp_ex` then returns it).
    c: UnsafeCell<ibv_qp_ex>,
    pub(crate) qp: Qp,
    /// The `ibv_wr_*` state of an extended QP.
    pub(crate) ex: Option<crate::qp_ex::WrBatch>,
}
c_object!(SoftQp, ibv_qp, "qp");

impl SoftQp {
    fn state_cell(&self) -> &AtomicU32 {
        // SAFETY: `state` is a live, aligned u32 inside our UnsafeCell; after creation it is
        // only written through this atomic view.
        unsafe { AtomicU32::from_ptr(ptr::addr_of_mut!((*self.c.get()).qp_base.state)) }
    }

    /// Copies the verbs QP's state into the C header.
    pub(crate) fn sync_state(&self) {
        self.state_cell().store(self.qp.state() as u32, Ordering::Release);
    }

    /// The C header's pointer fields and type, which never change after creation:
    /// `(qp_context, send_cq, recv_cq, srq, qp_type)`.
    fn fixed_fields(&self) -> (*mut c_void, *mut ibv_cq, *mut ibv_cq, *mut ibv_srq, u32) {
        let c = self.c.get();
        // SAFETY: plain reads of fields that are only written at creation (no reference to
        // the header is formed, since `state` may be written concurrently).
        unsafe {
            (
                ptr::addr_of!((*c).qp_base.qp_context).read(),
                ptr::addr_of!((*c).qp_base.send_cq).read(),
                ptr::addr_of!((*c).qp_base.recv_cq).read(),
                ptr::addr_of!((*c).qp_base.srq).read(),
                ptr::addr_of!((*c).qp_base.qp_type).read(),
            )
        }
    }
}

/// The Rust QP behind a live C QP pointer (None for unknown pointers). Connection events use
/// these lookups, so they never touch a QP the application already destroyed: the live set
/// of `c_object!` is held while the QP is read, and destroy leaves it before the free.
pub(crate) fn live_qp(qp: *mut ibv_qp) -> Option<Qp> {
    let live = SoftQp::live();
    if live.contains(&(qp as usize)) {
        // SAFETY: registered QPs are live; destroy unregisters (under this lock) first.
        Some(unsafe { &*qp.cast::<SoftQp>() }.qp.clone())
    } else {
        None
    }
}

/// The live QP with number `qpn` (for `conn_param.qp_num` of QPs made with `ibv_create_qp`).
pub(crate) fn live_qp_by_num(qpn: u32) -> Option<Qp> {
    let live = SoftQp::live();
    live.iter().find_map(|&a| {
        // SAFETY: registered QPs are live; destroy unregisters (under this lock) first.
        let q = unsafe { &*(a as *const SoftQp) };
        (q.qp.qpn() == qpn).then(|| q.qp.clone())
    })
}

/// Updates the C state of the QP at `qp` if it is still alive (connection events).
pub(crate) fn refresh_qp_state(qp: *mut ibv_qp) {
    let live = SoftQp::live();
    if live.contains(&(qp as usize)) {
        // SAFETY: registered QPs are live; destroy unregisters (under this lock) first.
        unsafe { &*qp.cast::<SoftQp>() }.sync_state();
    }
}

fn qp_type_from_c(v: u32) -> CResult<QpType> {
    match v {
        2 => Ok(QpType::Rc),
        3 => Ok(QpType::Uc),
        4 => Ok(QpType::Ud),
        // RAW_PACKET, XRC_SEND, XRC_RECV, DRIVER: what Linux rxe answers for a type it lacks.
        8..=10 | 0xff => Err(CError::unsupported(format!(
            "create_qp: QP type {v} (raw packet, XRC or driver) is not supported (RC, UC and UD are)"
        ))),
        other => Err(CError::inval(format!("create_qp: QP type {other} is not a QP type"))),
    }
}

fn cap_from_c(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn cap_to_c(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The verbs creation attributes from the C ones (CQ and SRQ pointers resolved).
pub(crate) fn qp_init_from_c(a: &ibv_qp_init_attr) -> CResult<QpInitAttr> {
    // SAFETY: the CQs and SRQ named by the attributes are this library's (C contract).
    let (send_cq, recv_cq) = unsafe { (SoftCq::from_c(a.send_cq)?, SoftCq::from_c(a.recv_cq)?) };
    let srq = if a.srq.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { SoftSrq::from_c(a.srq)? }.srq.clone())
    };
    Ok(QpInitAttr {
        send_cq: send_cq.cq.clone(),
        recv_cq: recv_cq.cq.clone(),
        srq,
        cap: cap_from_c(&a.cap),
        qp_type: qp_type_from_c(a.qp_type)?,
        sq_sig_all: a.sq_sig_all != 0,
    })
}

/// Wraps a created verbs QP for C and writes the granted sizes back into `attr`.
pub(crate) fn wrap_qp(qp: Qp, pd: &SoftPd, attr: &mut ibv_qp_init_attr) -> *mut ibv_qp {
    wrap_qp_ex(qp, pd, attr, None)
}

/// [`wrap_qp`] with the `ibv_wr_*` interface when `ex` is given (an extended QP).
pub(crate) fn wrap_qp_ex(
    qp: Qp,
    pd: &SoftPd,
    attr: &mut ibv_qp_init_attr,
    ex: Option<crate::qp_ex::WrBatch>,
) -> *mut ibv_qp {
    let granted = qp.inner().cap;
    attr.cap = cap_to_c(&granted);
    let mut x = ibv_qp_ex::zeroed();
    let c = &mut x.qp_base;
    c.context = pd.context();
    c.qp_context = attr.qp_context;
    c.pd = pd.as_c();
    c.send_cq = attr.send_cq;
    c.recv_cq = attr.recv_cq;
    c.srq = attr.srq;
    c.handle = next_handle();
    c.qp_num = qp.qpn();
    c.state = qp.state() as u32;
    c.qp_type = attr.qp_type;
    c.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    c.cond = libc::PTHREAD_COND_INITIALIZER;
    if ex.is_some() {
        crate::qp_ex::fill_ops(&mut x);
    }
    let p = SoftQp {
        c: UnsafeCell::new(x),
        qp,
        ex,
    }
    .into_c();
    // SAFETY: `p` was just created.
    let qpn = unsafe { SoftQp::from_c(p) }.map(|q| q.qp.qpn()).unwrap_or(0);
    async_events::register(Object::Qp(qpn), p.cast());
    p
}

/// The QP's async events: the queued ones are discarded; EBUSY if the application did not
/// acknowledge the ones it took (see `async_events`).
fn qp_events_done(qp: &SoftQp) -> CResult<()> {
    let events = qp.qp.inner().pd.context().async_events().clone();
    async_events::before_destroy(&events, Object::Qp(qp.qp.qpn()), qp.as_c().cast())
}

fn create_qp(p: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> CResult<*mut ibv_qp> {
    non_null(attr, "qp_init_attr")?;
    // SAFETY: non-NULL; the caller's struct ibv_qp_init_attr (in/out).
    create_qp_on_pd(p, unsafe { &mut *attr }, None)
}

/// Creates a QP on PD `p` (with the `ibv_wr_*` interface if `ex` is given).
pub(crate) fn create_qp_on_pd(
    p: *mut ibv_pd,
    attr: &mut ibv_qp_init_attr,
    ex: Option<crate::qp_ex::WrBatch>,
) -> CResult<*mut ibv_qp> {
    // SAFETY: `p` is a PD of this library (C contract).
    let pd = unsafe { SoftPd::from_c(p)? };
    let init = qp_init_from_c(attr)?;
    let qp = match pd.pd.context().device().transport {
        TransportKind::Iwarp => Qp::new(&pd.pd, init, AttrRules::Iwarp)?,
        // The RoCE driver owns the QP number space and starts the QP's engine at RTR.
        TransportKind::Roce => softrdma_roce::driver::create_qp(&pd.pd, init)?,
    };
    Ok(wrap_qp_ex(qp, pd, attr, ex))
}

/// Frees the C object of a QP whose verbs QP is already destroyed (or owned elsewhere).
///
/// # Safety
/// `p` is a QP of this library; C gives the pointer up with this call.
pub(crate) unsafe fn free_qp(p: *mut ibv_qp) {
    // SAFETY: per the contract, `p` is still a live QP here (checked: a pointer that is not
    // is left alone).
    let Ok(q) = (unsafe { SoftQp::from_c(p) }) else { return };
    // rdma_destroy_qp cannot fail: past the bounded wait, the QP goes anyway.
    let _ = qp_events_done(q);
    async_events::unregister(Object::Qp(q.qp.qpn()), p.cast());
    // SAFETY: live (checked above); this leaves the live set before the free.
    drop(unsafe { SoftQp::from_c_owned(p) });
}

fn destroy_qp(p: *mut ibv_qp) -> CResult<()> {
    // SAFETY: `p` is a QP of this library (C contract).
    let qp = unsafe { SoftQp::from_c(p)? };
    qp_events_done(qp)?;
    qp.qp.clone().destroy()?;
    // SAFETY: C gives the pointer up with this call.
    unsafe { free_qp(p) };
    Ok(())
}

/// Reads field `$f` of `*$attr` only when `$bit` is in `$mask` (the caller may leave the other
/// fields uninitialised, as rdma-core allows).
macro_rules! masked {
    ($mask:expr, $bit:expr, $attr:expr, $f:ident) => {
        if $mask & $bit != 0 {
            // SAFETY: the field is named by the mask, so the caller initialised it.
            Some(unsafe { ptr::addr_of!((*$attr).$f).read() })
        } else {
            None
        }
    };
}

/// The verbs address vector of a C `struct ibv_ah_attr`.
pub(crate) fn ah_from_c(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        // SAFETY: every bit pattern is a valid `raw` view of the GID union.
        dgid: unsafe { a.grh.dgid.raw },
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        dlid: a.dlid,
        sl: a.sl,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

/// The C `struct ibv_ah_attr` of a verbs address vector.
pub(crate) fn ah_to_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// The verbs attributes named by `mask`, read from the C struct.
///
/// # Safety
/// `attr` points to a `struct ibv_qp_attr` whose fields named by `mask` are initialised.
unsafe fn qp_attr_from_c(attr: *const ibv_qp_attr, mask: u32) -> QpAttr {
    use attr_mask::*;
    let mut a = QpAttr::default();
    if let Some(s) = masked!(mask, STATE, attr, qp_state) {
        a.qp_state = QpState::from_u32(s);
    }
    if let Some(s) = masked!(mask, CUR_STATE, attr, cur_qp_state) {
        a.cur_qp_state = QpState::from_u32(s);
    }
    if let Some(v) = masked!(mask, ACCESS_FLAGS, attr, qp_access_flags) {
        a.qp_access_flags = Access(v);
    }
    a.pkey_index = masked!(mask, PKEY_INDEX, attr, pkey_index).unwrap_or(0);
    a.port_num = masked!(mask, PORT, attr, port_num).unwrap_or(0);
    a.qkey = masked!(mask, QKEY, attr, qkey).unwrap_or(0);
    if let Some(ah) = masked!(mask, AV, attr, ah_attr) {
        a.ah_attr = ah_from_c(&ah);
    }
    a.path_mtu = masked!(mask, PATH_MTU, attr, path_mtu).map_or(0, |m| u8::try_from(m).unwrap_or(u8::MAX));
    a.timeout = masked!(mask, TIMEOUT, attr, timeout).unwrap_or(0);
    a.retry_cnt = masked!(mask, RETRY_CNT, attr, retry_cnt).unwrap_or(0);
    a.rnr_retry = masked!(mask, RNR_RETRY, attr, rnr_retry).unwrap_or(0);
    a.rq_psn = masked!(mask, RQ_PSN, attr, rq_psn).unwrap_or(0);
    a.sq_psn = masked!(mask, SQ_PSN, attr, sq_psn).unwrap_or(0);
    a.max_rd_atomic = masked!(mask, MAX_QP_RD_ATOMIC, attr, max_rd_atomic).unwrap_or(0);
    a.max_dest_rd_atomic = masked!(mask, MAX_DEST_RD_ATOMIC, attr, max_dest_rd_atomic).unwrap_or(0);
    a.min_rnr_timer = masked!(mask, MIN_RNR_TIMER, attr, min_rnr_timer).unwrap_or(0);
    a.dest_qp_num = masked!(mask, DEST_QPN, attr, dest_qp_num).unwrap_or(0);
    a
}

fn modify_qp(p: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> CResult<()> {
    // SAFETY: `p` is a QP of this library (C contract).
    let qp = unsafe { SoftQp::from_c(p)? };
    non_null(attr, "qp_attr")?;
    let mask = mask as u32;
    // SAFETY: the caller initialised the fields its mask names (C contract).
    let a = unsafe { qp_attr_from_c(attr, mask) };
    // A QP named by conn_param.qp_num is brought to RTS by its iWARP connection before the
    // application's own INIT/RTR/RTS steps (rping -q after CONNECT_RESPONSE): those steps then
    // have nothing left to do. iWARP only: a RoCE QP follows every modify_qp.
    let iwarp = qp.qp.inner().rules == AttrRules::Iwarp;
    let connected = qp.qp.state() == softrdma_verbs::QpState::Rts && qp.qp.inner().driver().is_some();
    let toward_rts = matches!(
        a.qp_state,
        Some(softrdma_verbs::QpState::Init | softrdma_verbs::QpState::Rtr | softrdma_verbs::QpState::Rts)
    );
    if iwarp && connected && toward_rts {
        qp.sync_state();
        return Ok(());
    }
    // ibv_rc_pingpong and perftest on siw_lo only say "Failed to modify QP to RTS": the hint
    // (connect with rdma_cm, or use rxe_*) is printed.
    let needs_cm = qp.qp.rts_needs_connection(&a, mask);
    let r = qp.qp.modify(&a, mask);
    qp.sync_state();
    r.map_err(|e| {
        if needs_cm {
            CError::from(e).loud()
        } else {
            CError::from(e)
        }
    })
}

/// The C `struct ibv_qp_attr` of verbs attributes (states from `qp_state` /
/// `cur_qp_state`, RESET when unset; no capabilities).
pub(crate) fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    let mut c = ibv_qp_attr::zeroed();
    c.qp_state = a.qp_state.map_or(0, |s| s as u32);
    c.cur_qp_state = a.cur_qp_state.map_or(0, |s| s as u32);
    c.path_mtu = u32::from(a.path_mtu);
    c.qkey = a.qkey;
    c.rq_psn = a.rq_psn;
    c.sq_psn = a.sq_psn;
    c.dest_qp_num = a.dest_qp_num;
    c.qp_access_flags = a.qp_access_flags.0;
    c.ah_attr = ah_to_c(&a.ah_attr);
    c.pkey_index = a.pkey_index;
    c.max_rd_atomic = a.max_rd_atomic;
    c.max_dest_rd_atomic = a.max_dest_rd_atomic;
    c.min_rnr_timer = a.min_rnr_timer;
    c.port_num = a.port_num;
    c.timeout = a.timeout;
    c.retry_cnt = a.retry_cnt;
    c.rnr_retry = a.rnr_retry;
    c
}

fn query_qp(p: *mut ibv_qp, attr: *mut ibv_qp_attr, init_attr: *mut ibv_qp_init_attr) -> CResult<()> {
    // SAFETY: `p` is a QP of this library (C contract).
    let qp = unsafe { SoftQp::from_c(p)? };
    non_null(attr, "qp_attr")?;
    non_null(init_attr, "qp_init_attr")?;
    let (state, a, cap) = qp.qp.query();
    qp.sync_state();
    let mut c = qp_attr_to_c(&a);
    c.qp_state = state as u32;
    c.cur_qp_state = state as u32;
    c.cap = cap_to_c(&cap);
    let (qp_context, send_cq, recv_cq, srq, qp_type) = qp.fixed_fields();
    let init = ibv_qp_init_attr {
        qp_context,
        send_cq,
        recv_cq,
        srq,
        cap: cap_to_c(&cap),
        qp_type,
        sq_sig_all: c_int::from(qp.qp.inner().sq_sig_all),
    };
    // SAFETY: both out-pointers are non-NULL and point to the caller's structs.
    unsafe {
        attr.write(c);
        init_attr.write(init);
    }
    Ok(())
}

c_fn! {
    /// `struct ibv_pd *ibv_alloc_pd(struct ibv_context *)`.
    fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
        ret_ptr(alloc_pd(context))
    }

    /// `int ibv_dealloc_pd(struct ibv_pd *)`: 0 or errno (EBUSY while MRs, QPs or SRQs use it).
    fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
        ret_errno(dealloc_pd(pd))
    }

    /// `struct ibv_mr *ibv_reg_mr(struct ibv_pd *, void *addr, size_t length, int access)`:
    /// iova = addr.
    fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
        ret_ptr(reg_mr(pd, addr, length, addr as u64, access as c_uint))
    }

    /// `struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *, void *addr, size_t length,
    /// uint64_t iova, unsigned int access)`: optional access bits are ignored.
    fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_uint) -> *mut ibv_mr {
        ret_ptr(reg_mr(pd, addr, length, iova, access))
    }

    /// `int ibv_dereg_mr(struct ibv_mr *)`: 0 or errno.
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
        ret_errno(dereg_mr(mr))
    }

    /// `struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *)`: `fd` is
    /// readable while CQ events wait.
    fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
        ret_ptr(create_comp_channel(context))
    }

    /// `int ibv_destroy_comp_channel(struct ibv_comp_channel *)`: 0 or errno (EBUSY while a
    /// CQ uses it).
    fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
        ret_errno(destroy_comp_channel(channel))
    }

    /// `struct ibv_cq *ibv_create_cq(struct ibv_context *, int cqe, void *cq_context,
    /// struct ibv_comp_channel *, int comp_vector)`: the context has one completion vector,
    /// so `comp_vector` must be 0 (EINVAL otherwise, as the kernel answers).
    fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq {
        if comp_vector != 0 {
            return ret_ptr(Err(CError::inval(format!(
                "create_cq: comp_vector {comp_vector} does not exist (num_comp_vectors is 1)"
            ))));
        }
        ret_ptr(create_cq(context, cqe, cq_context, channel))
    }

    /// `int ibv_destroy_cq(struct ibv_cq *)`: 0 or errno (EBUSY while a QP uses it).
    fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
        ret_errno(destroy_cq(cq))
    }

    /// `int ibv_get_cq_event(struct ibv_comp_channel *, struct ibv_cq **, void **)`: 0, or -1
    /// and errno (EAGAIN on a channel whose fd is O_NONBLOCK).
    fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int {
        ret_neg1(get_cq_event(channel, cq, cq_context))
    }

    /// `void ibv_ack_cq_events(struct ibv_cq *, unsigned int nevents)`.
    fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
        ret_or(ack_cq_events(cq, nevents), ())
    }

    /// `struct ibv_qp *ibv_create_qp(struct ibv_pd *, struct ibv_qp_init_attr *)`: writes the
    /// granted sizes back into `qp_init_attr->cap`. An iWARP QP (RC only) connects only
    /// through the CM; a RoCE QP (RC, UC or UD) is made by the RoCE driver and is driven by
    /// `ibv_modify_qp` (RTR starts its engine).
    fn ibv_create_qp(pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
        ret_ptr(create_qp(pd, qp_init_attr))
    }

    /// `int ibv_modify_qp(struct ibv_qp *, struct ibv_qp_attr *, int attr_mask)`: 0 or errno.
    fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int {
        ret_errno(modify_qp(qp, attr, attr_mask))
    }

    /// `int ibv_query_qp(struct ibv_qp *, struct ibv_qp_attr *, int attr_mask,
    /// struct ibv_qp_init_attr *)`: fills every field (as providers do); 0 or errno.
    fn ibv_query_qp(
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        _attr_mask: c_int,
        init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        ret_errno(query_qp(qp, attr, init_attr))
    }

    /// `int ibv_destroy_qp(struct ibv_qp *)`: 0 or errno. Closes the QP's connection.
    fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
        ret_errno(destroy_qp(qp))
    }

    /// `struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *)`: NULL with EOPNOTSUPP. softrdma
    /// `struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)`: the extended QP, or NULL for a
    /// QP created without `send_ops_flags` (as rdma-core).
    fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
        // SAFETY: `qp` is a QP of this library (C contract).
        ret_ptr(unsafe { SoftQp::from_c(qp) }.and_then(|q| match q.ex {
            Some(_) => Ok(q.c.get()),
            None => Err(CError::inval("the QP was created without send_ops_flags: it has no ibv_wr_* interface")),
        }))
    }

    /// `struct ibv_srq *ibv_create_srq(struct ibv_pd *, struct ibv_srq_init_attr *)`.
    fn ibv_create_srq(pd: *mut ibv_pd, srq_init_attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
        ret_ptr(create_srq(pd, srq_init_attr))
    }

    /// `int ibv_destroy_srq(struct ibv_srq *)`: 0 or errno (EBUSY while a QP uses it).
    fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
        ret_errno(destroy_srq(srq))
    }
}
