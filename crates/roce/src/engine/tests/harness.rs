//! Test fixtures: a soft-RoCE device, QPs moved through INIT → RTR → RTS with IBTA attribute
//! rules, and RC pairs with their engines.

use super::net::Sim;
use crate::engine::{RcConfig, RcEngine};
use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::*;
use std::sync::Arc;
use std::time::Duration;

/// A driver that does nothing (the tests drive the engines), so that moving a QP to ERR
/// leaves the flush to the engine.
#[derive(Debug)]
pub(super) struct NoDriver;
impl QpDriver for NoDriver {
    fn kick(&self) {}
}

/// The `rxe_lo` device over a synthetic loopback interface.
pub(super) fn device() -> device::DeviceInfo {
    let lo = device::NetIf {
        name: "lo".into(),
        index: 1,
        flags: device::IfFlags {
            up: true,
            running: true,
            loopback: true,
        },
        addrs: vec![device::IfAddr {
            ip: "127.0.0.1".parse().unwrap(),
            prefix_len: 8,
            scope_id: 0,
        }],
        mtu: 65536,
        mac: [0; 6],
        speed_mbps: None,
    };
    device::devices_from(&[lo], None)
        .unwrap()
        .into_iter()
        .find(|d| d.transport == device::TransportKind::Roce)
        .expect("a soft-RoCE device on lo")
}

/// IB path MTU enum for a byte count.
pub(super) fn mtu_enum(mtu: usize) -> u8 {
    match mtu {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

/// Settings of one side of a pair.
#[derive(Debug, Clone)]
pub(super) struct Opts {
    pub mtu: usize,
    pub sq_psn: u32,
    pub rq_psn: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub ord: u8,
    pub ird: u8,
    pub access: Access,
    pub window: u32,
    pub srq: bool,
    pub max_send_wr: u32,
    /// Keepalive interval (off unless a test turns it on).
    pub keepalive: Option<Duration>,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            mtu: 1024,
            sq_psn: 100,
            rq_psn: 200,
            // 4.096 µs << 12 = 16.8 ms.
            timeout: 12,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            ord: 8,
            ird: 8,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            window: 64,
            srq: false,
            max_send_wr: 512,
            keepalive: None,
        }
    }
}

/// One QP with its verbs objects and engine; completions are collected into `wcs`.
pub(super) struct Node {
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub srq: Option<Srq>,
    pub engine: RcEngine,
    pub wcs: Vec<WorkCompletion>,
}

impl Node {
    /// Moves new completions from the CQ into `wcs`.
    pub fn collect(&mut self) {
        while let Some(wc) = self.cq.poll_one() {
            self.wcs.push(wc);
        }
    }

    /// Send-side completions so far.
    pub fn send_wcs(&self) -> Vec<WorkCompletion> {
        self.wcs.iter().filter(|w| !is_recv(w)).copied().collect()
    }

    /// Receive-side completions so far.
    pub fn recv_wcs(&self) -> Vec<WorkCompletion> {
        self.wcs.iter().filter(|w| is_recv(w)).copied().collect()
    }

    /// `(wr_id, status)` of the send completions.
    pub fn send_status(&self) -> Vec<(u64, WcStatus)> {
        self.send_wcs().iter().map(|w| (w.wr_id, w.status)).collect()
    }

    /// `(wr_id, status)` of the receive completions.
    pub fn recv_status(&self) -> Vec<(u64, WcStatus)> {
        self.recv_wcs().iter().map(|w| (w.wr_id, w.status)).collect()
    }

    /// Registers a zeroed MR of `len` bytes with `access`.
    pub fn mr(&self, len: usize, access: Access) -> Mr {
        self.pd.alloc_mr(len, access).unwrap()
    }

    /// Moves the QP to ERR (as the application would) and lets the engine follow.
    pub fn modify_to_error(&mut self, sim: &Sim) {
        let attr = QpAttr {
            qp_state: Some(QpState::Err),
            ..QpAttr::default()
        };
        self.qp.modify(&attr, attr_mask::STATE).unwrap();
        self.engine.sync_state(sim.now);
        self.collect();
    }
}

fn is_recv(w: &WorkCompletion) -> bool {
    matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

/// Creates an RC or UD QP in RESET.
pub(super) fn create_qp(pd: &Pd, cq: &Cq, srq: Option<Srq>, qp_type: QpType, max_send_wr: u32) -> Qp {
    let cap = QpCap {
        max_send_wr,
        max_recv_wr: 512,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 128,
    };
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq,
        cap,
        qp_type,
        sq_sig_all: false,
    };
    Qp::new(pd, init, AttrRules::Ibta).unwrap()
}

/// INIT → RTR → RTS for an RC QP connected to `dest`.
fn connect(qp: &Qp, dest: u32, o: &Opts) {
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: o.access,
        ..QpAttr::default()
    };
    qp.modify(
        &init,
        attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::ACCESS_FLAGS,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        ah_attr: AhAttr {
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        path_mtu: mtu_enum(o.mtu),
        dest_qp_num: dest,
        rq_psn: o.rq_psn,
        max_dest_rd_atomic: o.ird,
        min_rnr_timer: o.min_rnr_timer,
        ..QpAttr::default()
    };
    qp.modify(&rtr, attr_mask::STATE | attr_mask::RC_RTR_REQUIRED).unwrap();
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: o.sq_psn,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        max_rd_atomic: o.ord,
        ..QpAttr::default()
    };
    qp.modify(&rts, attr_mask::STATE | attr_mask::RC_RTS_REQUIRED).unwrap();
}

/// Two connected RC QPs with engines: `a` with `oa`, `b` with `ob` (each side's `rq_psn`
/// is set to the other's `sq_psn`).
pub(super) fn rc_pair_with(oa: Opts, ob: Opts) -> (Node, Node) {
    let ctx = Context::open(&device()).unwrap();
    let make = |o: &Opts| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16384, None).unwrap();
        let srq = o.srq.then(|| {
            Srq::new(
                &pd,
                SrqAttr {
                    max_wr: 256,
                    max_sge: 4,
                    srq_limit: 0,
                },
            )
            .unwrap()
        });
        let qp = create_qp(&pd, &cq, srq.clone(), QpType::Rc, o.max_send_wr);
        (pd, cq, srq, qp)
    };
    let (pa, ca, sa, qa) = make(&oa);
    let (pb, cb, sb, qb) = make(&ob);
    let oa = Opts {
        rq_psn: ob.sq_psn,
        ..oa
    };
    let ob = Opts {
        rq_psn: oa.sq_psn,
        ..ob
    };
    connect(&qa, qb.qpn(), &oa);
    connect(&qb, qa.qpn(), &ob);
    let node = |pd: Pd, cq: Cq, srq: Option<Srq>, qp: Qp, o: &Opts| {
        qp.inner().attach_driver(Arc::new(NoDriver));
        let (_, attr, _) = qp.query();
        let cfg = RcConfig {
            window: o.window,
            keepalive: o.keepalive,
            ..RcConfig::from_qp_attr(qp.qpn(), &attr, o.mtu)
        };
        let engine = RcEngine::new(qp.inner().clone(), cfg);
        Node {
            pd,
            cq,
            qp,
            srq,
            engine,
            wcs: Vec::new(),
        }
    };
    (node(pa, ca, sa, qa, &oa), node(pb, cb, sb, qb, &ob))
}

/// A pair with the same options on both sides.
pub(super) fn rc_pair(o: Opts) -> (Node, Node) {
    rc_pair_with(o.clone(), o)
}

/// A byte pattern that differs per seed and position.
pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i >> 8) as u8)
        })
        .collect()
}

/// The IB ACK timeout for an exponent.
pub(super) fn timeout_of(exp: u8) -> Duration {
    crate::engine::ib_timeout(exp).unwrap()
}
