//! Test fixtures: RC pairs of engines on [`PlainQp`] hosts (no device, PD or CQ), their QPs
//! given the attributes INIT → RTR → RTS would give them.

use super::app_view::{AppMr, AppQp};
use super::net::Sim;
use crate::engine::{RcConfig, RcEngine};
use softrdma_verbs::qp_host::{PlainQp, PlainSrq, PLAIN_PD};
use softrdma_verbs::*;
use std::sync::Arc;
use std::time::Duration;

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

/// One QP host with its engine; completions are collected into `wcs`.
pub(super) struct Node {
    pub qp: AppQp,
    pub srq: Option<Arc<PlainSrq>>,
    pub engine: RcEngine,
    pub wcs: Vec<WorkCompletion>,
}

impl Node {
    /// Moves new completions from the host into `wcs` (sends first, then receives).
    pub fn collect(&mut self) {
        super::deliver(&mut self.engine);
        self.wcs.extend(self.qp.inner().take_send_wcs());
        self.wcs.extend(self.qp.inner().take_recv_wcs());
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

    /// Registers a zeroed region of `len` bytes with `access`.
    pub fn mr(&self, len: usize, access: Access) -> AppMr {
        AppMr(self.qp.inner().register(len, access))
    }

    /// Registers a zeroed region of another protection domain (its key is in the table this
    /// QP's requests are checked against, as the process's table holds every PD's keys).
    pub fn mr_of_another_pd(&self, len: usize, access: Access) -> AppMr {
        AppMr(self.qp.inner().register_in(PLAIN_PD + 1, len, access))
    }

    /// Moves the QP to ERR (as the application would) and lets the engine follow.
    pub fn modify_to_error(&mut self, sim: &Sim) {
        self.qp.inner().set_state(QpState::Err);
        self.engine.sync_state(sim.now);
        self.collect();
    }
}

fn is_recv(w: &WorkCompletion) -> bool {
    matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

/// The attributes INIT → RTR → RTS (`ibv_modify_qp` under the IBTA rules) give an RC QP
/// connected to `dest` with options `o`: PSNs and the QP number masked to 24 bits.
fn connected_attr(dest: u32, o: &Opts) -> QpAttr {
    QpAttr {
        qp_access_flags: o.access,
        pkey_index: 0,
        port_num: 1,
        ah_attr: AhAttr {
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        path_mtu: mtu_enum(o.mtu),
        dest_qp_num: dest & 0xff_ffff,
        rq_psn: o.rq_psn & 0xff_ffff,
        max_dest_rd_atomic: o.ird,
        min_rnr_timer: o.min_rnr_timer,
        sq_psn: o.sq_psn & 0xff_ffff,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        max_rd_atomic: o.ord,
        ..QpAttr::default()
    }
}

/// QP number of a pair's side `a`.
const QPN_A: u32 = 0x11;
/// QP number of a pair's side `b`.
const QPN_B: u32 = 0x22;

/// One side of a pair: a host in RTS connected to `dest`, and its engine.
fn node(qpn: u32, dest: u32, o: &Opts) -> Node {
    let attr = connected_attr(dest, o);
    let srq = o.srq.then(PlainSrq::new);
    let host = match &srq {
        Some(srq) => PlainQp::with_srq(qpn, QpState::Rts, attr, srq.clone()),
        None => PlainQp::new(qpn, QpState::Rts, attr),
    };
    let cfg = RcConfig {
        window: o.window,
        keepalive: o.keepalive,
        ..RcConfig::from_qp_attr(qpn, &attr, o.mtu)
    };
    let engine = RcEngine::new(host.clone(), cfg);
    Node {
        qp: AppQp::new(host, o.max_send_wr),
        srq,
        engine,
        wcs: Vec::new(),
    }
}

/// Two connected RC QPs with engines: `a` with `oa`, `b` with `ob` (each side's `rq_psn`
/// is set to the other's `sq_psn`).
pub(super) fn rc_pair_with(oa: Opts, ob: Opts) -> (Node, Node) {
    let oa = Opts {
        rq_psn: ob.sq_psn,
        ..oa
    };
    let ob = Opts {
        rq_psn: oa.sq_psn,
        ..ob
    };
    (node(QPN_A, QPN_B, &oa), node(QPN_B, QPN_A, &ob))
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
