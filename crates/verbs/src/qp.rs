//! Queue pairs: the send and receive queues, the state machine, and the seam to a transport.
//!
//! The application posts into the queues; a transport driver (attached when the QP connects)
//! drains them on the progress thread and reports completions through the helpers here.

use crate::async_event::{AsyncElement, AsyncEventKind};
use crate::cq::Cq;
use crate::memory::copy_from_user;
use crate::mr::check_local;
use crate::pd::Pd;
use crate::qp_state::{attr_mask, check_qp_access, check_transition, AttrRules, QpState, QpType};
use crate::srq::Srq;
use crate::wr::{Access, RecvWr, SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode};
use crate::{bail, Errno, Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Queue sizes (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Send WRs outstanding at once.
    pub max_send_wr: u32,
    /// Receive WRs posted at once.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

/// Creation attributes (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone)]
pub struct QpInitAttr {
    /// Completion queue for sends.
    pub send_cq: Cq,
    /// Completion queue for receives.
    pub recv_cq: Cq,
    /// Optional shared receive queue.
    pub srq: Option<Srq>,
    /// Sizes.
    pub cap: QpCap,
    /// QP type.
    pub qp_type: QpType,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
}

impl QpInitAttr {
    /// An RC QP on one CQ for sends and receives, with room for `max_send_wr` sends and
    /// `max_recv_wr` receives of one SGE each, no inline data, sends signaled per WR.
    pub fn rc(cq: &Cq, max_send_wr: u32, max_recv_wr: u32) -> QpInitAttr {
        QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpCap {
                max_send_wr,
                max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        }
    }
}

/// Address vector (`struct ibv_ah_attr`), used by RoCE QPs and AHs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    /// Destination GID (GRH).
    pub dgid: [u8; 16],
    /// Flow label.
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// GRH present.
    pub is_global: bool,
    /// Port.
    pub port_num: u8,
}

/// Modifiable attributes (`struct ibv_qp_attr`, the fields softrdma uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: Option<QpState>,
    /// Asserted current state (with CUR_STATE).
    pub cur_qp_state: Option<QpState>,
    /// Remote access allowed on this QP.
    pub qp_access_flags: Access,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port number (1).
    pub port_num: u8,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Primary path.
    pub ah_attr: AhAttr,
    /// Path MTU (IB enum 1..=5).
    pub path_mtu: u8,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Outstanding RDMA READs / atomics as initiator (ORD).
    pub max_rd_atomic: u8,
    /// Incoming RDMA READs / atomics as responder (IRD).
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Remote QP number.
    pub dest_qp_num: u32,
}

/// A queued send work request, with inline data already copied.
#[derive(Debug, Clone)]
pub struct SendWqe {
    /// The request.
    pub wr: SendWr,
    /// Inline payload (copied at post time).
    pub inline: Option<Vec<u8>>,
    /// Whether a completion is owed on success.
    pub signaled: bool,
}

/// The transport side of a connected QP.
pub trait QpDriver: Send + Sync + std::fmt::Debug {
    /// New send work is queued (or the QP state changed): make progress soon.
    fn kick(&self);
    /// Like [`QpDriver::kick`], but never does the work on the caller's thread: the caller
    /// may be inside the transport (a completion pushed to a CQ that overran).
    fn kick_deferred(&self) {
        self.kick();
    }
    /// New send work was posted (`post_send`): a transport that can transmit on the caller's
    /// thread does so now, sparing the hand-off to the progress thread (a cross-CPU wakeup,
    /// tens of µs); by default the same as [`QpDriver::kick`].
    fn posted(&self) {
        self.kick();
    }
}

/// A transport that follows a QP through its whole life (soft-RoCE): it hears every state
/// change, so it can start its engine at RTR, and owns the QP number space.
///
/// iWARP QPs have none: their transport arrives with the TCP connection instead.
pub trait QpTransport: Send + Sync + std::fmt::Debug {
    /// The QP moved from `from` to `to` (attributes already stored). An error undoes the
    /// state change and is returned by `modify_qp`.
    fn modified(&self, qp: &Arc<QpInner>, from: QpState, to: QpState) -> Result<()>;
    /// The QP is being destroyed: release its number and stop its engine.
    fn destroyed(&self, qp: &Arc<QpInner>);
    /// `ibv_attach_mcast`: deliver packets for multicast group `gid` to this (UD) QP.
    fn attach_mcast(&self, qp: &Arc<QpInner>, gid: [u8; 16]) -> Result<()>;
    /// `ibv_detach_mcast`.
    fn detach_mcast(&self, qp: &Arc<QpInner>, gid: [u8; 16]) -> Result<()>;
}

#[derive(Debug)]
struct QpCore {
    state: QpState,
    attr: QpAttr,
    sq: VecDeque<SendWqe>,
    rq: VecDeque<RecvWr>,
    sq_outstanding: u32,
    driver: Option<Arc<dyn QpDriver>>,
}

/// Shared QP state, used by the application and by the transport driver.
#[derive(Debug)]
pub struct QpInner {
    /// QP number.
    pub qpn: u32,
    /// Type.
    pub qp_type: QpType,
    /// Attribute rules (per transport).
    pub rules: AttrRules,
    /// Protection domain.
    pub pd: Pd,
    /// Send CQ.
    pub send_cq: Cq,
    /// Receive CQ.
    pub recv_cq: Cq,
    /// The fork generation that created it (see `fork`).
    fork_gen: u32,
    /// SRQ, if any.
    pub srq: Option<Srq>,
    /// Sizes granted.
    pub cap: QpCap,
    /// Every WR signaled.
    pub sq_sig_all: bool,
    /// The transport that owns this QP's number and hears its state changes, if any.
    pub transport: Option<Arc<dyn QpTransport>>,
    core: Mutex<QpCore>,
    /// Counted against the device's `max_qp`.
    _charge: crate::quota::Charge,
}

/// QP numbers: a random 23-bit start per process (so two processes rarely share numbers),
/// then sequential, skipping the reserved QP0 and QP1.
fn next_qpn() -> u32 {
    static NEXT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let mut b = [0u8; 4];
        let _ = getrandom::getrandom(&mut b);
        AtomicU32::new((u32::from_ne_bytes(b) & 0x7f_ffff) | 0x10)
    });
    loop {
        let q = next.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
        if q >= 2 {
            return q;
        }
    }
}

impl QpInner {
    fn core(&self) -> MutexGuard<'_, QpCore> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.core().state
    }

    /// Current attributes.
    pub fn attr(&self) -> QpAttr {
        self.core().attr
    }

    /// Attaches the transport driver and moves the QP to RTS (the connection is up).
    pub fn connect_established(&self, driver: Arc<dyn QpDriver>, ord: u8, ird: u8) -> Result<()> {
        let mut c = self.core();
        match c.state {
            QpState::Init | QpState::Rtr | QpState::Rts => {}
            s => bail!(
                Inval,
                "QP {}: cannot connect in state {s}; it must be INIT, RTR or RTS",
                self.qpn
            ),
        }
        c.state = QpState::Rts;
        c.attr.max_rd_atomic = ord;
        c.attr.max_dest_rd_atomic = ird;
        c.driver = Some(driver);
        Ok(())
    }

    /// Attaches a driver without changing the state (a RoCE engine started at RTR).
    pub fn attach_driver(&self, driver: Arc<dyn QpDriver>) {
        self.core().driver = Some(driver);
    }

    /// Detaches the transport (its connection closed). Queued WRs flush; later posts flush at once.
    pub fn detach_driver(&self) {
        let (sends, recvs) = {
            let mut c = self.core();
            c.driver = None;
            if c.state != QpState::Err {
                return;
            }
            (c.sq.drain(..).collect(), c.rq.drain(..).collect())
        };
        self.flush(sends, recvs);
    }

    /// The attached driver.
    pub fn driver(&self) -> Option<Arc<dyn QpDriver>> {
        self.core().driver.clone()
    }

    /// Takes the next send WQE if the QP is in RTS and `accept` approves the head.
    pub fn pop_send_if(&self, accept: impl FnOnce(&SendWqe) -> bool) -> Option<SendWqe> {
        let mut c = self.core();
        if c.state != QpState::Rts {
            return None;
        }
        if accept(c.sq.front()?) {
            c.sq.pop_front()
        } else {
            None
        }
    }

    /// True if send WQEs are queued and the QP would hand them out.
    pub fn has_send_work(&self) -> bool {
        let c = self.core();
        c.state == QpState::Rts && !c.sq.is_empty()
    }

    /// Takes the next receive WQE (from the SRQ if the QP has one).
    pub fn take_recv(&self) -> Option<RecvWr> {
        match &self.srq {
            Some(srq) => srq.inner().take(),
            None => self.core().rq.pop_front(),
        }
    }

    /// Send WRs posted and not yet completed or retired.
    pub fn sends_outstanding(&self) -> u32 {
        self.core().sq_outstanding
    }

    /// Frees `n` send-queue slots (completed or retired WRs).
    pub fn retire_sends(&self, n: u32) {
        let mut c = self.core();
        c.sq_outstanding = c.sq_outstanding.saturating_sub(n);
    }

    /// Reports a send-side completion (pushes to the send CQ only if owed).
    pub fn complete_send(&self, wc: WorkCompletion, signaled: bool) {
        // Free the slot before the completion becomes visible: an application that polls it
        // may post again at once (perftest keeps exactly max_send_wr WRs outstanding).
        self.retire_sends(1);
        if signaled {
            self.send_cq.inner().completion_arrived();
        }
        if signaled || wc.status != WcStatus::Success {
            self.send_cq.inner().push(wc);
        }
    }

    /// Reports a receive completion.
    pub fn complete_recv(&self, wc: WorkCompletion) {
        self.recv_cq.inner().push(wc);
    }

    /// Moves to ERR and hands back the queued WQEs for the caller to flush in order.
    /// Idempotent: a second call returns empty queues.
    pub fn enter_error(&self) -> (Vec<SendWqe>, Vec<RecvWr>) {
        let (entered, queues) = {
            let mut c = self.core();
            let entered = c.state != QpState::Err;
            c.state = QpState::Err;
            (entered, (c.sq.drain(..).collect(), c.rq.drain(..).collect()))
        };
        if entered {
            self.entered_error();
        }
        queues
    }

    /// The QP just entered ERR: one attached to an SRQ takes no more WQEs from it
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`, as the IB spec and Linux rxe report it).
    fn entered_error(&self) {
        if self.srq.is_some() {
            self.pd
                .context()
                .async_events()
                .post(AsyncEventKind::QpLastWqeReached, AsyncElement::Qp(self.qpn));
        }
    }

    /// The first request arrived while the QP is in RTR: `IBV_EVENT_COMM_EST`.
    pub fn report_comm_established(&self) {
        self.pd
            .context()
            .async_events()
            .post(AsyncEventKind::CommEst, AsyncElement::Qp(self.qpn));
    }

    /// The transport moved this QP to ERR because of an error (a retry count exceeded, a
    /// NAK, a Terminate, a protocol or local error; not a disconnect or the application's
    /// modify): `IBV_EVENT_QP_FATAL`.
    pub fn report_fatal(&self) {
        self.pd
            .context()
            .async_events()
            .post(AsyncEventKind::QpFatal, AsyncElement::Qp(self.qpn));
    }

    /// Flushes queued WQEs with WR_FLUSH_ERR (every one gets a completion).
    pub fn flush(&self, sends: Vec<SendWqe>, recvs: Vec<RecvWr>) {
        for w in sends {
            let op = w.wr.opcode.map(|o| o.wc_opcode()).unwrap_or(WcOpcode::Send);
            // An error completion is pushed whether the WR was signaled or not.
            self.complete_send(
                WorkCompletion::new(w.wr.wr_id, WcStatus::WrFlushErr, op, self.qpn),
                w.signaled,
            );
        }
        for r in recvs {
            self.complete_recv(WorkCompletion::new(
                r.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                self.qpn,
            ));
        }
    }

    /// Its CQ overran (a completion could not be queued): as IBTA 11.4.2.1 (and Linux rxe's
    /// CQ_ERR), the QP moves to ERR, its driver (or this call, without one) flushing what
    /// is outstanding into whatever room the CQ has again. A QP in RESET or ERR is left alone.
    pub(crate) fn cq_overrun(&self, cq: u64) {
        let driver = {
            let mut c = self.core();
            if matches!(c.state, QpState::Reset | QpState::Err) {
                return;
            }
            c.state = QpState::Err;
            c.driver.clone()
        };
        tracing::error!(qpn = self.qpn, cq, "CQ overrun: QP moved to ERR");
        self.entered_error();
        match driver {
            Some(d) => d.kick_deferred(),
            // Already in ERR, so this only drains and flushes.
            None => self.error_and_flush(),
        }
    }

    /// Moves to ERR and flushes everything queued (for QPs without a driver).
    pub fn error_and_flush(&self) {
        let (s, r) = self.enter_error();
        self.flush(s, r);
    }
}

/// A queue pair (`ibv_qp`). Cloning shares it; `destroy` releases it.
///
/// The transport crates create QPs with their transport attached: `softrdma_roce::driver::
/// create_qp` on an `rxe_` device (then INIT → RTR → RTS with the peer's QP number, PSN and
/// GID, as `ibv_rc_pingpong`: see softrdma-roce's `rc_pingpong` example), and
/// `softrdma_cm::CmId::create_qp` for rdma_cm connections (the only way an iWARP QP reaches
/// RTS: softrdma-cm's `cm_client_server` example). Here, the IBTA state machine alone:
///
/// ```
/// use softrdma_verbs::qp_state::{attr_mask, AttrRules};
/// use softrdma_verbs::*;
///
/// let ctx = Context::open_by_name("siw_lo")?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(16, None)?;
/// let init = QpInitAttr::rc(&cq, 16, 16);
/// let qp = Qp::new(&pd, init, AttrRules::Iwarp)?;
/// assert_eq!(qp.state(), QpState::Reset);
/// qp.modify(&QpAttr { qp_state: Some(QpState::Init), ..QpAttr::default() }, attr_mask::STATE)?;
/// assert_eq!(qp.state(), QpState::Init);
/// // Receives may be posted from INIT on; sends need RTS.
/// let mr = pd.alloc_mr(1024, Access::LOCAL_WRITE)?;
/// qp.post_recv_one(1, mr.sge(0, 1024))?;
/// assert!(qp.post_send_one(SendWr::send(2, vec![mr.sge(0, 16)])).is_err());
/// qp.destroy()?;
/// # Ok::<(), softrdma_verbs::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Qp {
    inner: Arc<QpInner>,
}

impl Qp {
    /// Creates a QP in `pd`. `rules` comes from the device's transport.
    pub fn new(pd: &Pd, init: QpInitAttr, rules: AttrRules) -> Result<Qp> {
        Qp::with_transport(pd, init, rules, None)
    }

    /// Creates a QP whose number comes from `transport` (which then hears every state change),
    /// or from the process-wide counter if `None`.
    pub fn with_transport(
        pd: &Pd,
        init: QpInitAttr,
        rules: AttrRules,
        transport: Option<(u32, Arc<dyn QpTransport>)>,
    ) -> Result<Qp> {
        let dev = pd.context().device().attr();
        let cap = init.cap;
        let max_wr = dev.max_qp_wr as u32;
        let max_sge = dev.max_sge as u32;
        if init.qp_type != QpType::Rc && rules == AttrRules::Iwarp {
            bail!(
                OpNotSupp,
                "create_qp: iWARP devices support only RC QPs (got {:?})",
                init.qp_type
            );
        }
        if cap.max_send_wr > max_wr || cap.max_recv_wr > max_wr {
            bail!(
                Inval,
                "create_qp: max_send_wr {} / max_recv_wr {} exceed the device limit {max_wr}",
                cap.max_send_wr,
                cap.max_recv_wr
            );
        }
        if cap.max_send_sge > max_sge || cap.max_recv_sge > max_sge {
            bail!(
                Inval,
                "create_qp: max_send_sge {} / max_recv_sge {} exceed the device limit {max_sge}",
                cap.max_send_sge,
                cap.max_recv_sge
            );
        }
        if cap.max_inline_data > MAX_INLINE {
            bail!(
                Inval,
                "create_qp: max_inline_data {} exceeds the device limit {MAX_INLINE}",
                cap.max_inline_data
            );
        }
        if let Some(srq) = &init.srq {
            if srq.pd().id() != pd.id() {
                bail!(Inval, "create_qp: the SRQ belongs to another protection domain");
            }
        }
        let charge = pd.context().charge(crate::quota::ObjKind::Qp, "create_qp")?;
        if let Some(srq) = &init.srq {
            srq.inner().users.fetch_add(1, Ordering::Relaxed);
        }
        init.send_cq.inner().users.fetch_add(1, Ordering::Relaxed);
        init.recv_cq.inner().users.fetch_add(1, Ordering::Relaxed);
        pd.inner().qp_count.fetch_add(1, Ordering::Relaxed);
        let (qpn, transport) = match transport {
            Some((qpn, t)) => (qpn, Some(t)),
            None => (next_qpn(), None),
        };
        tracing::debug!(qpn, ?cap, "create_qp");
        let qp = Qp {
            inner: Arc::new(QpInner {
                qpn,
                qp_type: init.qp_type,
                rules,
                pd: pd.clone(),
                send_cq: init.send_cq,
                recv_cq: init.recv_cq,
                fork_gen: crate::fork::generation(),
                srq: init.srq,
                cap: QpCap {
                    max_send_wr: cap.max_send_wr.max(1),
                    max_recv_wr: cap.max_recv_wr.max(1),
                    max_send_sge: cap.max_send_sge.max(1),
                    max_recv_sge: cap.max_recv_sge.max(1),
                    max_inline_data: cap.max_inline_data,
                },
                sq_sig_all: init.sq_sig_all,
                transport,
                core: Mutex::new(QpCore {
                    state: QpState::Reset,
                    attr: QpAttr {
                        port_num: 1,
                        ..QpAttr::default()
                    },
                    sq: VecDeque::new(),
                    rq: VecDeque::new(),
                    sq_outstanding: 0,
                    driver: None,
                }),
                _charge: charge,
            }),
        };
        // A CQ overrun moves every QP whose completions go to that CQ to ERR.
        qp.inner.send_cq.inner().attach_qp(&qp.inner);
        qp.inner.recv_cq.inner().attach_qp(&qp.inner);
        Ok(qp)
    }

    /// Shared state (for transports).
    pub fn inner(&self) -> &Arc<QpInner> {
        &self.inner
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.inner.state()
    }

    /// Whether `modify(attr, mask)` would ask an iWARP QP without a connection for RTS, which
    /// only its rdma_cm connection can give it (as Linux siw: EINVAL).
    pub fn rts_needs_connection(&self, attr: &QpAttr, mask: u32) -> bool {
        let c = self.inner.core();
        self.inner.rules == AttrRules::Iwarp
            && mask & attr_mask::STATE != 0
            && attr.qp_state == Some(QpState::Rts)
            && c.state != QpState::Rts
            && c.driver.is_none()
    }

    /// Modifies the QP (`ibv_modify_qp`).
    pub fn modify(&self, attr: &QpAttr, mask: u32) -> Result<()> {
        let qpn = self.inner.qpn;
        let iwarp = self.inner.rules == AttrRules::Iwarp;
        if iwarp && mask == 0 {
            // As siw: nothing asked, nothing done.
            return Ok(());
        }
        let dev = self.inner.pd.context().device().attr();
        check_attr_values(qpn, attr, mask, &self.inner.pd.context().device().port_attr())?;
        let (cur, new, driver) = {
            let mut c = self.inner.core();
            let cur = c.state;
            if mask & attr_mask::CUR_STATE != 0 && attr.cur_qp_state != Some(cur) {
                bail!(
                    Inval,
                    "modify_qp {qpn}: cur_qp_state {:?} does not match the current state {cur}",
                    attr.cur_qp_state
                );
            }
            let new = if mask & attr_mask::STATE != 0 {
                match attr.qp_state {
                    Some(s) => s,
                    None => bail!(Inval, "modify_qp {qpn}: IBV_QP_STATE set without a valid qp_state"),
                }
            } else {
                cur
            };
            if iwarp && new == QpState::Rts && cur != QpState::Rts && c.driver.is_none() {
                bail!(Inval, "{}", iwarp_rts_hint(qpn, &self.inner.pd.context().device().name));
            }
            // siw leaves the state alone when the mask has no IBV_QP_STATE (rdma_init_qp_attr's
            // RTS mask is the port only); the IBTA rules (RoCE) check the attributes against
            // the current state.
            if !(iwarp && mask & attr_mask::STATE == 0) {
                check_transition(self.inner.rules, self.inner.qp_type, cur, new, mask | attr_mask::STATE)
                    .map_err(|m| Error::inval(format!("modify_qp {qpn}: {m}")))?;
            }
            if mask & attr_mask::ACCESS_FLAGS != 0 {
                check_qp_access(attr.qp_access_flags).map_err(|m| Error::inval(format!("modify_qp {qpn}: {m}")))?;
                c.attr.qp_access_flags = attr.qp_access_flags;
            }
            if mask & attr_mask::PORT != 0 {
                if attr.port_num != 1 {
                    bail!(
                        Inval,
                        "modify_qp {qpn}: port {} does not exist (the device has port 1)",
                        attr.port_num
                    );
                }
                c.attr.port_num = 1;
            }
            if mask & attr_mask::MAX_QP_RD_ATOMIC != 0 {
                if attr.max_rd_atomic as i32 > dev.max_qp_init_rd_atom {
                    bail!(
                        Inval,
                        "modify_qp {qpn}: max_rd_atomic {} exceeds the device limit {}",
                        attr.max_rd_atomic,
                        dev.max_qp_init_rd_atom
                    );
                }
                c.attr.max_rd_atomic = attr.max_rd_atomic;
            }
            if mask & attr_mask::MAX_DEST_RD_ATOMIC != 0 {
                if attr.max_dest_rd_atomic as i32 > dev.max_qp_rd_atom {
                    bail!(
                        Inval,
                        "modify_qp {qpn}: max_dest_rd_atomic {} exceeds the device limit {}",
                        attr.max_dest_rd_atomic,
                        dev.max_qp_rd_atom
                    );
                }
                c.attr.max_dest_rd_atomic = attr.max_dest_rd_atomic;
            }
            let a = &mut c.attr;
            if mask & attr_mask::PKEY_INDEX != 0 {
                a.pkey_index = attr.pkey_index;
            }
            if mask & attr_mask::QKEY != 0 {
                a.qkey = attr.qkey;
            }
            if mask & attr_mask::AV != 0 {
                a.ah_attr = attr.ah_attr;
            }
            if mask & attr_mask::PATH_MTU != 0 {
                a.path_mtu = attr.path_mtu;
            }
            if mask & attr_mask::TIMEOUT != 0 {
                a.timeout = attr.timeout;
            }
            if mask & attr_mask::RETRY_CNT != 0 {
                a.retry_cnt = attr.retry_cnt;
            }
            if mask & attr_mask::RNR_RETRY != 0 {
                a.rnr_retry = attr.rnr_retry;
            }
            if mask & attr_mask::RQ_PSN != 0 {
                a.rq_psn = attr.rq_psn & 0xff_ffff;
            }
            if mask & attr_mask::SQ_PSN != 0 {
                a.sq_psn = attr.sq_psn & 0xff_ffff;
            }
            if mask & attr_mask::MIN_RNR_TIMER != 0 {
                a.min_rnr_timer = attr.min_rnr_timer;
            }
            if mask & attr_mask::DEST_QPN != 0 {
                a.dest_qp_num = attr.dest_qp_num & 0xff_ffff;
            }
            match new {
                QpState::Reset => {
                    c.sq.clear();
                    c.rq.clear();
                    c.sq_outstanding = 0;
                    c.driver = None;
                    self.inner.send_cq.purge_qp(qpn);
                    self.inner.recv_cq.purge_qp(qpn);
                }
                QpState::Err => {}
                _ => {}
            }
            if new != QpState::Err {
                c.state = new;
            }
            (cur, new, c.driver.clone())
        };
        if let Some(t) = &self.inner.transport {
            if let Err(e) = t.modified(&self.inner, cur, new) {
                let mut c = self.inner.core();
                if c.state == new {
                    c.state = cur;
                }
                return Err(e);
            }
        }
        let driver = driver.or_else(|| self.inner.driver());
        if new == QpState::Err {
            match driver {
                // The driver flushes in-flight work first, then the queues, keeping order.
                Some(d) => {
                    let entered = {
                        let mut c = self.inner.core();
                        let entered = c.state != QpState::Err;
                        c.state = QpState::Err;
                        entered
                    };
                    if entered {
                        self.inner.entered_error();
                    }
                    d.kick();
                }
                None => self.inner.error_and_flush(),
            }
        } else if let Some(d) = driver {
            d.kick();
        }
        tracing::debug!(qpn, state = %new, "modify_qp");
        Ok(())
    }

    /// Current attributes and state (`ibv_query_qp`).
    pub fn query(&self) -> (QpState, QpAttr, QpCap) {
        let c = self.inner.core();
        (c.state, c.attr, self.inner.cap)
    }

    /// Posts send WRs. Inline data must lie in registered memory of this PD (the safe API);
    /// see [`Qp::post_send_raw`] for C-style inline pointers. On error: index of the bad WR.
    pub fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), (usize, Error)> {
        self.post_send_impl(wrs, false)
    }

    /// Like [`Qp::post_send`], but inline SGE addresses are read directly (lkeys ignored).
    ///
    /// # Safety
    /// For WRs with `SendFlags::INLINE`, each SGE's `addr..addr+length` must be readable.
    pub unsafe fn post_send_raw(&self, wrs: &[SendWr]) -> std::result::Result<(), (usize, Error)> {
        self.post_send_impl(wrs, true)
    }

    fn check_send(&self, wr: &SendWr, raw_inline: bool) -> Result<SendWqe> {
        let qpn = self.inner.qpn;
        let Some(op) = wr.opcode else {
            bail!(Inval, "post_send on QP {qpn}: WR {:#x} has an unknown opcode", wr.wr_id);
        };
        if self.inner.rules == AttrRules::Iwarp
            && !matches!(
                op,
                WrOpcode::Send | WrOpcode::SendWithInv | WrOpcode::RdmaWrite | WrOpcode::RdmaRead
            )
        {
            bail!(
                Inval,
                "post_send on QP {qpn}: opcode {op:?} is not supported by iWARP devices"
            );
        }
        if self.inner.qp_type == QpType::Ud {
            if !matches!(op, WrOpcode::Send | WrOpcode::SendWithImm) {
                bail!(Inval, "post_send on QP {qpn}: UD QPs only SEND (got {op:?})");
            }
            if wr.ud.is_none() {
                bail!(
                    Inval,
                    "post_send on QP {qpn}: UD WR {:#x} has no address handle",
                    wr.wr_id
                );
            }
        }
        if matches!(op, WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd)
            && (wr.sg_list.len() != 1 || wr.sg_list[0].length != 8 || wr.remote_addr & 7 != 0)
        {
            bail!(
                Inval,
                "post_send on QP {qpn}: an atomic WR needs one 8-byte SGE and an 8-byte aligned remote_addr"
            );
        }
        let sges = wr.sg_list.len() as u32;
        if sges > self.inner.cap.max_send_sge {
            bail!(
                Inval,
                "post_send on QP {qpn}: {sges} SGEs exceed max_send_sge {}",
                self.inner.cap.max_send_sge
            );
        }
        let total = wr.total_len();
        if total > u32::MAX as u64 {
            bail!(Inval, "post_send on QP {qpn}: message of {total} bytes exceeds 2^32-1");
        }
        let inline = if wr.flags.contains(SendFlags::INLINE) && op != WrOpcode::RdmaRead {
            if total > self.inner.cap.max_inline_data as u64 {
                bail!(
                    Inval,
                    "post_send on QP {qpn}: {total} inline bytes exceed max_inline_data {}",
                    self.inner.cap.max_inline_data
                );
            }
            let mut data = Vec::with_capacity(total as usize);
            for s in &wr.sg_list {
                if raw_inline {
                    // SAFETY: inline SGEs name application memory no Rust reference covers; a
                    // range that is not readable is reported, not faulted on.
                    let bytes = unsafe { copy_from_user(s.addr, s.length as usize) }.ok_or_else(|| {
                        Error::new(
                            Errno::Fault,
                            format!(
                                "post_send on QP {qpn}: inline SGE {:#x} + {} bytes is not readable",
                                s.addr, s.length
                            ),
                        )
                    })?;
                    data.extend_from_slice(&bytes);
                } else {
                    let (mr, off) =
                        check_local(s.lkey, self.inner.pd.id(), s.addr, s.length as u64, false).map_err(|e| {
                            Error::inval(format!("post_send on QP {qpn}: inline SGE lkey {:#x}: {e}", s.lkey))
                        })?;
                    if !mr.region.append_to(off, s.length as usize, &mut data) {
                        bail!(
                            Fault,
                            "post_send on QP {qpn}: inline SGE lkey {:#x}: the MR's memory is not readable",
                            s.lkey
                        );
                    }
                }
            }
            Some(data)
        } else {
            None
        };
        let signaled = self.inner.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        Ok(SendWqe {
            wr: wr.clone(),
            inline,
            signaled,
        })
    }

    fn post_send_impl(&self, wrs: &[SendWr], raw_inline: bool) -> std::result::Result<(), (usize, Error)> {
        let qpn = self.inner.qpn;
        if crate::fork::is_stale(self.inner.fork_gen) {
            return Err((0, crate::fork::stale_error(&format!("post_send on QP {qpn}"))));
        }
        let mut posted = false;
        let mut flush_now = Vec::new();
        let mut result = Ok(());
        {
            let mut c = self.inner.core();
            for (i, wr) in wrs.iter().enumerate() {
                match c.state {
                    QpState::Reset | QpState::Init | QpState::Rtr => {
                        result = Err((
                            i,
                            Error::inval(format!(
                                "post_send on QP {qpn}: the QP is in {}; sends need RTS",
                                c.state
                            )),
                        ));
                        break;
                    }
                    _ => {}
                }
                let wqe = match self.check_send(wr, raw_inline) {
                    Ok(w) => w,
                    Err(e) => {
                        result = Err((i, e));
                        break;
                    }
                };
                if c.sq_outstanding >= self.inner.cap.max_send_wr {
                    result = Err((
                        i,
                        Error::new(
                            Errno::NoMem,
                            format!(
                                "post_send on QP {qpn}: send queue full ({} WRs outstanding)",
                                c.sq_outstanding
                            ),
                        ),
                    ));
                    break;
                }
                c.sq_outstanding += 1;
                if wqe.signaled {
                    self.inner.send_cq.inner().completion_expected();
                }
                if c.state == QpState::Err && c.driver.is_none() {
                    flush_now.push(wqe);
                } else {
                    c.sq.push_back(wqe);
                    posted = true;
                }
            }
        }
        self.inner.flush(flush_now, Vec::new());
        if posted {
            if let Some(d) = self.inner.driver() {
                d.posted();
            }
        }
        result
    }

    /// Posts receive WRs (`ibv_post_recv`). On error: index of the bad WR.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        let qpn = self.inner.qpn;
        if crate::fork::is_stale(self.inner.fork_gen) {
            return Err((0, crate::fork::stale_error(&format!("post_recv on QP {qpn}"))));
        }
        if self.inner.srq.is_some() {
            return Err((
                0,
                Error::inval(format!("post_recv on QP {qpn}: the QP uses an SRQ; post to the SRQ")),
            ));
        }
        let mut flush_now = Vec::new();
        let mut result = Ok(());
        {
            let mut c = self.inner.core();
            for (i, wr) in wrs.iter().enumerate() {
                if c.state == QpState::Reset {
                    result = Err((i, Error::inval(format!("post_recv on QP {qpn}: the QP is in RESET"))));
                    break;
                }
                if wr.sg_list.len() as u32 > self.inner.cap.max_recv_sge {
                    result = Err((
                        i,
                        Error::inval(format!(
                            "post_recv on QP {qpn}: {} SGEs exceed max_recv_sge {}",
                            wr.sg_list.len(),
                            self.inner.cap.max_recv_sge
                        )),
                    ));
                    break;
                }
                if c.rq.len() as u32 >= self.inner.cap.max_recv_wr {
                    result = Err((
                        i,
                        Error::new(
                            Errno::NoMem,
                            format!("post_recv on QP {qpn}: receive queue full ({} WRs)", c.rq.len()),
                        ),
                    ));
                    break;
                }
                if c.state == QpState::Err && c.driver.is_none() {
                    flush_now.push(wr.clone());
                } else {
                    c.rq.push_back(wr.clone());
                }
            }
        }
        self.inner.flush(Vec::new(), flush_now);
        if let Some(d) = self.inner.driver() {
            if self.inner.state() == QpState::Err {
                d.kick();
            }
        }
        result
    }

    /// Convenience: post one receive of one SGE.
    pub fn post_recv_one(&self, wr_id: u64, sge: crate::wr::Sge) -> Result<()> {
        self.post_recv(&[RecvWr {
            wr_id,
            sg_list: vec![sge],
        }])
        .map_err(|(_, e)| e)
    }

    /// Convenience: post one send WR.
    pub fn post_send_one(&self, wr: SendWr) -> Result<()> {
        self.post_send(&[wr]).map_err(|(_, e)| e)
    }

    /// `ibv_attach_mcast`: receive multicast group `gid` on this UD QP.
    pub fn attach_mcast(&self, gid: [u8; 16]) -> Result<()> {
        self.mcast_check("attach_mcast")?.attach_mcast(&self.inner, gid)
    }

    /// `ibv_detach_mcast`.
    pub fn detach_mcast(&self, gid: [u8; 16]) -> Result<()> {
        self.mcast_check("detach_mcast")?.detach_mcast(&self.inner, gid)
    }

    fn mcast_check(&self, what: &str) -> Result<&Arc<dyn QpTransport>> {
        let qpn = self.inner.qpn;
        if self.inner.qp_type != QpType::Ud {
            bail!(
                Inval,
                "{what} on QP {qpn}: multicast needs a UD QP (this one is {:?})",
                self.inner.qp_type
            );
        }
        match &self.inner.transport {
            Some(t) => Ok(t),
            None => bail!(OpNotSupp, "{what} on QP {qpn}: this device has no multicast support"),
        }
    }

    /// Destroys the QP: moves it to ERR (closing its connection) and releases its CQs.
    pub fn destroy(self) -> Result<()> {
        if let Some(t) = &self.inner.transport {
            t.destroyed(&self.inner);
        }
        let driver = self.inner.driver();
        {
            let mut c = self.inner.core();
            c.state = QpState::Err;
            c.sq.clear();
            c.rq.clear();
            c.driver = None;
        }
        if let Some(d) = driver {
            d.kick();
        }
        self.inner.send_cq.inner().users.fetch_sub(1, Ordering::Relaxed);
        self.inner.recv_cq.inner().users.fetch_sub(1, Ordering::Relaxed);
        self.inner.send_cq.inner().detach_qp(self.inner.qpn);
        self.inner.recv_cq.inner().detach_qp(self.inner.qpn);
        if let Some(srq) = &self.inner.srq {
            srq.inner().users.fetch_sub(1, Ordering::Relaxed);
        }
        self.inner.pd.inner().qp_count.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Largest inline payload a QP may request.
pub const MAX_INLINE: u32 = 256;

/// Checks the values of the attributes `mask` names against the IBTA field widths and the
/// port (as Linux rxe's `rxe_qp_chk_attr` and the core's P_Key lookup): EINVAL naming the
/// attribute. PSNs and the destination QPN are masked to 24 bits, as the kernel does.
fn check_attr_values(qpn: u32, attr: &QpAttr, mask: u32, port: &crate::device::PortAttr) -> Result<()> {
    if mask & attr_mask::PATH_MTU != 0 && !(1..=port.max_mtu as u8).contains(&attr.path_mtu) {
        bail!(
            Inval,
            "modify_qp {qpn}: path_mtu {} is not an IB MTU up to the port's max_mtu {} (1..={})",
            attr.path_mtu,
            port.max_mtu.bytes(),
            port.max_mtu as u8
        );
    }
    if mask & attr_mask::PKEY_INDEX != 0 && port.pkey_tbl_len > 0 && attr.pkey_index >= port.pkey_tbl_len {
        bail!(
            Inval,
            "modify_qp {qpn}: pkey_index {} is outside the P_Key table ({} entries)",
            attr.pkey_index,
            port.pkey_tbl_len
        );
    }
    let fields = [
        (attr_mask::TIMEOUT, attr.timeout, 31, "timeout"),
        (attr_mask::RETRY_CNT, attr.retry_cnt, 7, "retry_cnt"),
        (attr_mask::RNR_RETRY, attr.rnr_retry, 7, "rnr_retry"),
        (attr_mask::MIN_RNR_TIMER, attr.min_rnr_timer, 31, "min_rnr_timer"),
    ];
    for (bit, value, max, name) in fields {
        if mask & bit != 0 && value > max {
            bail!(Inval, "modify_qp {qpn}: {name} {value} exceeds {max}");
        }
    }
    Ok(())
}

/// The error of an iWARP QP asked for RTS without a connection, with what to do instead.
fn iwarp_rts_hint(qpn: u32, device: &str) -> String {
    format!(
        "modify_qp {qpn} to RTS: {device} is iWARP, and an iWARP QP reaches RTS only through its \
         rdma_cm connection (rdma_connect/rdma_accept), as with Linux siw; connect it with rdma_cm, \
         or use an rxe_* device (e.g. -d rxe_lo -g 0) for verbs-only programs"
    )
}
