//! Extended QPs: `ibv_create_qp_ex` (the `verbs_context.create_qp_ex` slot) and the
//! `ibv_wr_*` work-request interface of `struct ibv_qp_ex`.
//!
//! Between `ibv_wr_start` and `ibv_wr_complete` the application builds WRs one call at a
//! time (`ibv_wr_send`, `ibv_wr_rdma_write`, ..., then `ibv_wr_set_sge`,
//! `ibv_wr_set_inline_data`, `ibv_wr_set_ud_addr`); they are kept here and posted together
//! by `ibv_wr_complete`, which returns the first error of the batch (nothing of a batch with
//! an error is posted, as with rdma-core's providers). `ibv_wr_abort` drops the batch.
//! Inline data is copied when it is set, so the application may reuse its buffer at once.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};

use softrdma_verbs::device::TransportKind;
use softrdma_verbs::wr::{SendFlags, SendWr, Sge, WrOpcode};
use softrdma_verbs::QpType;

use crate::abi::{
    ibv_ah, ibv_context, ibv_data_buf, ibv_mw, ibv_mw_bind_info, ibv_qp, ibv_qp_ex, ibv_qp_init_attr,
    ibv_qp_init_attr_ex, ibv_sge, IBV_QP_INIT_ATTR_CREATE_FLAGS, IBV_QP_INIT_ATTR_IND_TABLE,
    IBV_QP_INIT_ATTR_MAX_TSO_HEADER, IBV_QP_INIT_ATTR_PD, IBV_QP_INIT_ATTR_RX_HASH, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QP_INIT_ATTR_XRCD,
};
use crate::error::{non_null, ret_ptr, CError, CResult};
use crate::objects::{create_qp_on_pd, SoftQp};

/// `enum ibv_qp_create_send_ops_flags`.
const WITH_RDMA_WRITE: u64 = 1 << 0;
const WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
const WITH_SEND: u64 = 1 << 2;
const WITH_SEND_WITH_IMM: u64 = 1 << 3;
const WITH_RDMA_READ: u64 = 1 << 4;
const WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
const WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
const WITH_LOCAL_INV: u64 = 1 << 7;
const WITH_BIND_MW: u64 = 1 << 8;
const WITH_SEND_WITH_INV: u64 = 1 << 9;

/// The send operations a QP of this transport and type can post.
fn supported_ops(transport: TransportKind, qp_type: QpType) -> u64 {
    match (transport, qp_type) {
        (TransportKind::Iwarp, _) => WITH_RDMA_WRITE | WITH_SEND | WITH_RDMA_READ | WITH_SEND_WITH_INV,
        (TransportKind::Roce, QpType::Rc) => {
            WITH_RDMA_WRITE
                | WITH_RDMA_WRITE_WITH_IMM
                | WITH_SEND
                | WITH_SEND_WITH_IMM
                | WITH_RDMA_READ
                | WITH_ATOMIC_CMP_AND_SWP
                | WITH_ATOMIC_FETCH_AND_ADD
                | WITH_SEND_WITH_INV
                | WITH_LOCAL_INV
                | WITH_BIND_MW
        }
        (TransportKind::Roce, QpType::Uc) => {
            WITH_RDMA_WRITE | WITH_RDMA_WRITE_WITH_IMM | WITH_SEND | WITH_SEND_WITH_IMM | WITH_LOCAL_INV | WITH_BIND_MW
        }
        (TransportKind::Roce, _) => WITH_SEND | WITH_SEND_WITH_IMM,
    }
}

fn op_flag(op: WrOpcode) -> u64 {
    match op {
        WrOpcode::RdmaWrite => WITH_RDMA_WRITE,
        WrOpcode::RdmaWriteWithImm => WITH_RDMA_WRITE_WITH_IMM,
        WrOpcode::Send => WITH_SEND,
        WrOpcode::SendWithImm => WITH_SEND_WITH_IMM,
        WrOpcode::RdmaRead => WITH_RDMA_READ,
        WrOpcode::AtomicCmpAndSwp => WITH_ATOMIC_CMP_AND_SWP,
        WrOpcode::AtomicFetchAndAdd => WITH_ATOMIC_FETCH_AND_ADD,
        WrOpcode::SendWithInv => WITH_SEND_WITH_INV,
        WrOpcode::LocalInv => WITH_LOCAL_INV,
        WrOpcode::BindMw => WITH_BIND_MW,
    }
}

#[derive(Default)]
struct Pending {
    started: bool,
    wrs: Vec<SendWr>,
    /// Owned copies of inline data, pointed at by their WRs' SGEs until posted.
    inline: Vec<Box<[u8]>>,
    error: Option<CError>,
}

/// The `ibv_wr_*` state of one extended QP.
pub(crate) struct WrBatch {
    send_ops: u64,
    pending: Mutex<Pending>,
}

impl WrBatch {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sets the `wr_*` slots of an extended QP's header.
pub(crate) fn fill_ops(x: &mut ibv_qp_ex) {
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    x.wr_send = Some(wr_send);
    x.wr_send_imm = Some(wr_send_imm);
    x.wr_send_inv = Some(wr_send_inv);
    x.wr_rdma_write = Some(wr_rdma_write);
    x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    x.wr_rdma_read = Some(wr_rdma_read);
    x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    x.wr_local_inv = Some(wr_local_inv);
    x.wr_bind_mw = Some(wr_bind_mw);
    x.wr_send_tso = Some(wr_send_tso);
    x.wr_atomic_write = Some(wr_atomic_write);
    x.wr_set_ud_addr = Some(wr_set_ud_addr);
    x.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
}

/// The soft QP and its batch behind a `struct ibv_qp_ex *` the application got from
/// `ibv_qp_to_qp_ex`.
///
/// # Safety
/// `qp` is an extended QP of this library (the inline `ibv_wr_*` functions already called
/// through its header).
unsafe fn batch<'a>(qp: *mut ibv_qp_ex) -> Option<(&'a SoftQp, &'a WrBatch)> {
    // SAFETY: per the contract: the header is the first field of a live SoftQp.
    let soft = unsafe { &*qp.cast::<SoftQp>() };
    soft.ex.as_ref().map(|b| (soft, b))
}

/// Starts a new WR of `op` from the header's `wr_id` and `wr_flags`.
///
/// # Safety
/// As [`batch`].
unsafe fn begin(qp: *mut ibv_qp_ex, op: WrOpcode, fill: impl FnOnce(&mut SendWr)) {
    // SAFETY: per the contract.
    let Some((soft, b)) = (unsafe { batch(qp) }) else {
        return;
    };
    // SAFETY: the header's wr_id and wr_flags are the application's to set before this call.
    let (wr_id, flags) = unsafe { ((*qp).wr_id, (*qp).wr_flags) };
    let mut p = b.lock();
    if !p.started {
        p.error.get_or_insert(CError::inval(
            "an ibv_wr_* call outside ibv_wr_start .. ibv_wr_complete",
        ));
        return;
    }
    if b.send_ops & op_flag(op) == 0 {
        p.error.get_or_insert(CError::inval(format!(
            "QP {}: {op:?} was not in the QP's send_ops_flags",
            soft.qp.qpn()
        )));
        return;
    }
    let mut wr = SendWr {
        wr_id,
        opcode: Some(op),
        flags: SendFlags(flags),
        ..SendWr::default()
    };
    fill(&mut wr);
    p.wrs.push(wr);
}

/// Edits the batch's last WR.
///
/// # Safety
/// As [`batch`].
unsafe fn edit(qp: *mut ibv_qp_ex, f: impl FnOnce(&SoftQp, &mut Pending) -> CResult<()>) {
    // SAFETY: per the contract.
    let Some((soft, b)) = (unsafe { batch(qp) }) else {
        return;
    };
    let mut p = b.lock();
    if p.wrs.is_empty() {
        p.error
            .get_or_insert(CError::inval("an ibv_wr_set_* call before any WR of the batch"));
        return;
    }
    if let Err(e) = f(soft, &mut p) {
        p.error.get_or_insert(e);
    }
}

fn last(p: &mut Pending) -> &mut SendWr {
    let n = p.wrs.len() - 1;
    &mut p.wrs[n]
}

/// Records an operation this QP cannot post.
///
/// # Safety
/// As [`batch`].
unsafe fn unsupported(qp: *mut ibv_qp_ex, what: &str) {
    // SAFETY: per the contract.
    if let Some((_, b)) = unsafe { batch(qp) } {
        b.lock().error.get_or_insert(CError::unsupported(format!(
            "{what} is not supported (as by Linux rxe and siw)"
        )));
    }
}

fn set_inline(p: &mut Pending, data: Vec<u8>) {
    let buf = data.into_boxed_slice();
    let sge = Sge {
        addr: buf.as_ptr() as u64,
        length: u32::try_from(buf.len()).unwrap_or(u32::MAX),
        lkey: 0,
    };
    p.inline.push(buf);
    let wr = last(p);
    wr.flags = SendFlags(wr.flags.0 | SendFlags::INLINE.0);
    wr.sg_list = vec![sge];
}

fn complete(qp: *mut ibv_qp_ex) -> CResult<()> {
    // SAFETY: the inline ibv_wr_complete called through this QP's header.
    let Some((soft, b)) = (unsafe { batch(qp) }) else {
        return Err(CError::inval("not an extended QP"));
    };
    let p = std::mem::take(&mut *b.lock());
    if !p.started {
        return Err(CError::inval("ibv_wr_complete without ibv_wr_start"));
    }
    if let Some(e) = p.error {
        return Err(e);
    }
    if p.wrs.is_empty() {
        return Ok(());
    }
    // SAFETY: inline SGEs point into `p.inline`, alive until after the call.
    let r = unsafe { soft.qp.post_send_raw(&p.wrs) };
    drop(p.inline);
    r.map_err(|(_, e)| CError::from(e))
}

fn create_qp_ex(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> CResult<*mut ibv_qp> {
    non_null(attr, "qp_init_attr_ex")?;
    // SAFETY: non-NULL; the caller's in/out struct ibv_qp_init_attr_ex.
    let ex = unsafe { &mut *attr };
    let mask = ex.comp_mask;
    if mask
        & (IBV_QP_INIT_ATTR_XRCD
            | IBV_QP_INIT_ATTR_IND_TABLE
            | IBV_QP_INIT_ATTR_RX_HASH
            | IBV_QP_INIT_ATTR_MAX_TSO_HEADER)
        != 0
    {
        return Err(CError::unsupported(format!(
            "create_qp_ex: comp_mask {mask:#x}: XRC domains, RSS indirection tables and TSO are not supported (as by Linux rxe and siw)"
        )));
    }
    if mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 {
        return Err(CError::inval(format!("create_qp_ex: unknown comp_mask bits {mask:#x}")));
    }
    if mask & IBV_QP_INIT_ATTR_PD == 0 || ex.pd.is_null() {
        return Err(CError::inval("create_qp_ex: a PD is required (IBV_QP_INIT_ATTR_PD)"));
    }
    if mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && ex.create_flags != 0 {
        return Err(CError::unsupported(format!(
            "create_qp_ex: create_flags {:#x} are not supported",
            ex.create_flags
        )));
    }
    // SAFETY: a PD of this library (C contract).
    let pd = unsafe { crate::objects::SoftPd::from_c(ex.pd)? };
    if pd.context() != ctx {
        return Err(CError::inval("create_qp_ex: the PD belongs to another context"));
    }
    let batch = if mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        let qp_type = match ex.qp_type {
            2 => QpType::Rc,
            3 => QpType::Uc,
            _ => QpType::Ud,
        };
        let supported = supported_ops(pd.pd.context().device().transport, qp_type);
        if ex.send_ops_flags & !supported != 0 {
            return Err(CError::unsupported(format!(
                "create_qp_ex: send_ops_flags {:#x} include operations this QP cannot post (supported: {supported:#x})",
                ex.send_ops_flags
            )));
        }
        Some(WrBatch {
            send_ops: ex.send_ops_flags,
            pending: Mutex::new(Pending::default()),
        })
    } else {
        None
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
    let qp = create_qp_on_pd(ex.pd, &mut a, batch)?;
    ex.cap = a.cap;
    Ok(qp)
}

c_fn! {
    /// `verbs_context.create_qp_ex`, behind the inline `ibv_create_qp_ex`.
    fn vctx_create_qp_ex(context: *mut ibv_context, qp_init_attr_ex: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
        ret_ptr(create_qp_ex(context, qp_init_attr_ex))
    }

    /// `ibv_wr_start`: begins a batch.
    fn wr_start(qp: *mut ibv_qp_ex) {
        // SAFETY: the inline ibv_wr_start called through this QP's header.
        if let Some((_, b)) = unsafe { batch(qp) } {
            *b.lock() = Pending {
                started: true,
                ..Pending::default()
            };
        }
    }

    /// `ibv_wr_complete`: posts the batch; 0 or the errno of its first error.
    fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
        crate::error::ret_errno(complete(qp))
    }

    /// `ibv_wr_abort`: drops the batch.
    fn wr_abort(qp: *mut ibv_qp_ex) {
        // SAFETY: the inline ibv_wr_abort called through this QP's header.
        if let Some((_, b)) = unsafe { batch(qp) } {
            *b.lock() = Pending::default();
        }
    }

    /// `ibv_wr_send`.
    fn wr_send(qp: *mut ibv_qp_ex) {
        // SAFETY: called through this QP's header.
        unsafe { begin(qp, WrOpcode::Send, |_| {}) }
    }

    /// `ibv_wr_send_imm(qp, __be32 imm_data)`.
    fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: u32) {
        // SAFETY: called through this QP's header.
        unsafe { begin(qp, WrOpcode::SendWithImm, |w| w.imm_data = imm_data) }
    }

    /// `ibv_wr_send_inv(qp, uint32_t invalidate_rkey)`.
    fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
        // SAFETY: called through this QP's header.
        unsafe { begin(qp, WrOpcode::SendWithInv, |w| w.invalidate_rkey = invalidate_rkey) }
    }

    /// `ibv_wr_rdma_write(qp, rkey, remote_addr)`.
    fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
        // SAFETY: called through this QP's header.
        unsafe {
            begin(qp, WrOpcode::RdmaWrite, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
            })
        }
    }

    /// `ibv_wr_rdma_write_imm(qp, rkey, remote_addr, __be32 imm_data)`.
    fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm_data: u32) {
        // SAFETY: called through this QP's header.
        unsafe {
            begin(qp, WrOpcode::RdmaWriteWithImm, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
                w.imm_data = imm_data;
            })
        }
    }

    /// `ibv_wr_rdma_read(qp, rkey, remote_addr)`.
    fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
        // SAFETY: called through this QP's header.
        unsafe {
            begin(qp, WrOpcode::RdmaRead, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
            })
        }
    }

    /// `ibv_wr_atomic_cmp_swp(qp, rkey, remote_addr, compare, swap)`.
    fn wr_atomic_cmp_swp(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
        // SAFETY: called through this QP's header.
        unsafe {
            begin(qp, WrOpcode::AtomicCmpAndSwp, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
                w.compare_add = compare;
                w.swap = swap;
            })
        }
    }

    /// `ibv_wr_atomic_fetch_add(qp, rkey, remote_addr, add)`.
    fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
        // SAFETY: called through this QP's header.
        unsafe {
            begin(qp, WrOpcode::AtomicFetchAndAdd, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
                w.compare_add = add;
            })
        }
    }

    /// `ibv_wr_local_inv(qp, invalidate_rkey)`: invalidates a type-2 memory window.
    fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
        // SAFETY: called through this QP's header.
        unsafe { begin(qp, WrOpcode::LocalInv, |w| w.invalidate_rkey = invalidate_rkey) }
    }

    /// `ibv_wr_bind_mw(qp, mw, rkey, bind_info)`: binds a type-2 memory window.
    fn wr_bind_mw(qp: *mut ibv_qp_ex, mw: *mut ibv_mw, rkey: u32, info: *const ibv_mw_bind_info) {
        let bind = if info.is_null() {
            Err(CError::inval("ibv_wr_bind_mw: bind_info is NULL"))
        } else {
            // SAFETY: `info` is the caller's struct; `mw` and `info.mr` are objects of this
            // library (C contract).
            unsafe { crate::mw::send_wr_bind(mw, rkey, &*info) }
        };
        match bind {
            // SAFETY: called through this QP's header.
            Ok(b) => unsafe { begin(qp, WrOpcode::BindMw, |w| w.bind = Some(b)) },
            Err(e) => {
                // SAFETY: called through this QP's header.
                if let Some((_, batch)) = unsafe { batch(qp) } {
                    batch.lock().error.get_or_insert(e);
                }
            }
        }
    }

    /// `ibv_wr_send_tso`.
    fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
        // SAFETY: called through this QP's header.
        unsafe { unsupported(qp, "ibv_wr_send_tso") }
    }

    /// `ibv_wr_atomic_write`.
    fn wr_atomic_write(qp: *mut ibv_qp_ex, _rkey: u32, _remote_addr: u64, _atomic_wr: *const c_void) {
        // SAFETY: called through this QP's header.
        unsafe { unsupported(qp, "ibv_wr_atomic_write") }
    }

    /// `ibv_wr_set_xrc_srqn`.
    fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _remote_srqn: u32) {
        // SAFETY: called through this QP's header.
        unsafe { unsupported(qp, "ibv_wr_set_xrc_srqn (XRC)") }
    }

    /// `ibv_wr_set_ud_addr(qp, ah, remote_qpn, remote_qkey)`.
    fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
        // SAFETY: called through this QP's header.
        unsafe {
            edit(qp, |soft, p| {
                let inner = soft.qp.inner();
                let dest = crate::ah::ud_dest(ah, inner.pd.id(), remote_qpn, remote_qkey)
                    .map_err(|why| CError::inval(format!("ibv_wr_set_ud_addr on QP {}: {why}", inner.qpn)))?;
                last(p).ud = Some(dest);
                Ok(())
            })
        }
    }

    /// `ibv_wr_set_sge(qp, lkey, addr, length)`.
    fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
        // SAFETY: called through this QP's header.
        unsafe {
            edit(qp, |_, p| {
                last(p).sg_list = vec![Sge { addr, length, lkey }];
                Ok(())
            })
        }
    }

    /// `ibv_wr_set_sge_list(qp, num_sge, sg_list)`.
    fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
        // SAFETY: called through this QP's header.
        unsafe {
            edit(qp, |_, p| {
                if num_sge > 0 && sg_list.is_null() {
                    return Err(CError::inval("ibv_wr_set_sge_list: sg_list is NULL"));
                }
                let list = if num_sge == 0 {
                    &[][..]
                } else {
                    // SAFETY: the caller's array of `num_sge` SGEs (C contract).
                    std::slice::from_raw_parts(sg_list, num_sge)
                };
                last(p).sg_list = list
                    .iter()
                    .map(|s| Sge {
                        addr: s.addr,
                        length: s.length,
                        lkey: s.lkey,
                    })
                    .collect();
                Ok(())
            })
        }
    }

    /// `ibv_wr_set_inline_data(qp, addr, length)`: copied now.
    fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
        // SAFETY: called through this QP's header.
        unsafe {
            edit(qp, |_, p| {
                if length > 0 && addr.is_null() {
                    return Err(CError::inval("ibv_wr_set_inline_data: addr is NULL"));
                }
                let data = if length == 0 {
                    Vec::new()
                } else {
                    // SAFETY: the caller's `length` readable bytes (C contract).
                    std::slice::from_raw_parts(addr.cast::<u8>(), length).to_vec()
                };
                set_inline(p, data);
                Ok(())
            })
        }
    }

    /// `ibv_wr_set_inline_data_list(qp, num_buf, buf_list)`: copied now.
    fn wr_set_inline_data_list(qp: *mut ibv_qp_ex, num_buf: usize, buf_list: *const ibv_data_buf) {
        // SAFETY: called through this QP's header.
        unsafe {
            edit(qp, |_, p| {
                if num_buf > 0 && buf_list.is_null() {
                    return Err(CError::inval("ibv_wr_set_inline_data_list: buf_list is NULL"));
                }
                let mut data = Vec::new();
                for i in 0..num_buf {
                    // SAFETY: the caller's array of `num_buf` buffers (C contract).
                    let b = &*buf_list.add(i);
                    if b.length > 0 {
                        if b.addr.is_null() {
                            return Err(CError::inval("ibv_wr_set_inline_data_list: a buffer's addr is NULL"));
                        }
                        // SAFETY: each buffer's `length` bytes are readable (C contract).
                        data.extend_from_slice(std::slice::from_raw_parts(b.addr.cast::<u8>(), b.length));
                    }
                }
                set_inline(p, data);
                Ok(())
            })
        }
    }
}
