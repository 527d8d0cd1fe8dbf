//! The QP side of an IB CM connection: the INIT/RTR/RTS attributes the CM applies on REP
//! (active) and accept (passive), as librdmacm's `ucma_modify_qp_rtr/rts` with the kernel's
//! `ib_cm_init_qp_attr`, and the UD QP setup of `rdma_create_qp`.

use softrdma_verbs::qp_state::attr_mask::*;
use softrdma_verbs::{Access, AhAttr, Qp, QpAttr, QpState, QpType, Result};
use std::net::{IpAddr, Ipv4Addr};

/// Q_Key of RDMA_PS_UDP ids (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// Local ACK timeout exponent when RDMA_OPTION_ID_ACK_TIMEOUT is not set: packet lifetime
/// 16 plus the CM's margin (≈1 s).
pub const DEFAULT_ACK_TIMEOUT: u8 = 18;
/// GRH hop limit of CM-made paths.
pub const HOP_LIMIT: u8 = 64;

/// Access a connected QP gets (the CM grants remote read/write/atomic, as rdma_cm does when
/// responder resources are offered).
pub fn qp_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

/// Everything the RTR and RTS steps need, from both sides of the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RcPath {
    /// IBTA path MTU code (1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// The peer's address (its GID: an IPv6 address as it is, IPv4 as IPv4-mapped).
    pub peer: Option<IpAddr>,
    /// Our GID index for the local address.
    pub sgid_index: u8,
    /// GRH traffic class (RDMA_OPTION_ID_TOS).
    pub traffic_class: u8,
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// The starting PSN in the peer's REQ or REP: the PSN we send with.
    pub remote_psn: u32,
    /// The starting PSN in our own REQ or REP: the PSN we expect to receive. This is what
    /// Linux's IB CM does (`ib_send_cm_req`/`ib_send_cm_rep` set `rq_psn`, `cm_req_handler`/
    /// `cm_rep_handler` set `sq_psn` from the peer's message), and kernel rxe peers send with
    /// the PSN we announced.
    pub local_psn: u32,
    /// Incoming RDMA READ/atomics we allow (max_dest_rd_atomic).
    pub responder_resources: u8,
    /// Outgoing RDMA READ/atomics (max_rd_atomic).
    pub initiator_depth: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits).
    pub rnr_retry: u8,
    /// Local ACK timeout exponent.
    pub ack_timeout: u8,
}

/// The address vector of a peer: global (GRH) with its GID (IPv4 as IPv4-mapped).
pub fn ah_attr(peer: IpAddr, sgid_index: u8, traffic_class: u8) -> AhAttr {
    AhAttr {
        dgid: softrdma_verbs::device::Gid::from_ip(peer).0,
        sgid_index,
        hop_limit: HOP_LIMIT,
        traffic_class,
        is_global: true,
        port_num: 1,
        ..AhAttr::default()
    }
}

/// RESET → INIT: P_Key index 0, port 1, and access flags (RC) or the Q_Key (UD).
pub fn init_attr(qp_type: QpType, qkey: u32) -> (QpAttr, u32) {
    let mut a = QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: 0,
        port_num: 1,
        ..QpAttr::default()
    };
    if qp_type == QpType::Ud {
        a.qkey = qkey;
        (a, STATE | PKEY_INDEX | PORT | QKEY)
    } else {
        a.qp_access_flags = qp_access();
        (a, STATE | PKEY_INDEX | PORT | ACCESS_FLAGS)
    }
}

/// INIT → RTR of an RC QP.
pub fn rtr_attr(p: &RcPath) -> (QpAttr, u32) {
    let a = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: p.path_mtu,
        dest_qp_num: p.remote_qpn,
        rq_psn: p.local_psn,
        max_dest_rd_atomic: p.responder_resources,
        min_rnr_timer: 0,
        ah_attr: ah_attr(
            p.peer.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            p.sgid_index,
            p.traffic_class,
        ),
        ..QpAttr::default()
    };
    (
        a,
        STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
    )
}

/// RTR → RTS of an RC QP.
pub fn rts_attr(p: &RcPath) -> (QpAttr, u32) {
    let a = QpAttr {
        qp_state: Some(QpState::Rts),
        timeout: p.ack_timeout,
        retry_cnt: p.retry_count & 7,
        rnr_retry: p.rnr_retry & 7,
        sq_psn: p.remote_psn,
        max_rd_atomic: p.initiator_depth,
        ..QpAttr::default()
    };
    (a, STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC)
}

/// Moves an RC QP forward to RTS from wherever it is (RESET, INIT or RTR); a QP the
/// application already moved to RTS is left alone.
pub fn bring_up_rc(qp: &Qp, p: &RcPath) -> Result<()> {
    if qp.state() == QpState::Reset {
        let (a, m) = init_attr(QpType::Rc, 0);
        qp.modify(&a, m)?;
    }
    if qp.state() == QpState::Init {
        let (a, m) = rtr_attr(p);
        qp.modify(&a, m)?;
    }
    if qp.state() == QpState::Rtr {
        let (a, m) = rts_attr(p);
        qp.modify(&a, m)?;
    }
    Ok(())
}

/// Moves a UD QP to RTS (librdmacm's `ucma_init_ud_qp`: INIT with `qkey`, RTR, RTS with SQ
/// PSN 0).
pub fn bring_up_ud(qp: &Qp, qkey: u32) -> Result<()> {
    if qp.state() == QpState::Reset {
        let (a, m) = init_attr(QpType::Ud, qkey);
        qp.modify(&a, m)?;
    }
    if qp.state() == QpState::Init {
        let a = QpAttr {
            qp_state: Some(QpState::Rtr),
            ..QpAttr::default()
        };
        qp.modify(&a, STATE)?;
    }
    if qp.state() == QpState::Rtr {
        let a = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: 0,
            ..QpAttr::default()
        };
        qp.modify(&a, STATE | SQ_PSN)?;
    }
    Ok(())
}

/// Moves a QP to ERR (flushing its queues), ignoring a QP already there or gone.
pub fn to_error(qp: &Qp) {
    if !matches!(qp.state(), QpState::Err | QpState::Reset) {
        let a = QpAttr {
            qp_state: Some(QpState::Err),
            ..QpAttr::default()
        };
        let _ = qp.modify(&a, STATE);
    }
}

/// `rdma_init_qp_attr` for an IB CM id: the attributes of `state` (INIT, RTR or RTS) for a
/// QP the application moves itself. `path` is None before the exchange supplied it.
pub fn init_qp_attr(qp_type: QpType, state: QpState, path: Option<&RcPath>, qkey: u32) -> Option<(QpAttr, u32)> {
    match (state, qp_type) {
        (QpState::Init, t) => Some(init_attr(t, qkey)),
        (QpState::Rtr, QpType::Ud) => Some((
            QpAttr {
                qp_state: Some(QpState::Rtr),
                ..QpAttr::default()
            },
            STATE,
        )),
        (QpState::Rts, QpType::Ud) => Some((
            QpAttr {
                qp_state: Some(QpState::Rts),
                ..QpAttr::default()
            },
            STATE | SQ_PSN,
        )),
        (QpState::Rtr, _) => path.map(rtr_attr),
        (QpState::Rts, _) => path.map(rts_attr),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_verbs::qp_state::{check_transition, AttrRules};

    #[test]
    fn attributes_satisfy_the_ibta_table() {
        let p = RcPath {
            path_mtu: 5,
            peer: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            remote_qpn: 0x01_1234,
            remote_psn: 0xab_cdef,
            local_psn: 0x12_3456,
            responder_resources: 4,
            initiator_depth: 2,
            retry_count: 0xF,
            rnr_retry: 7,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            ..RcPath::default()
        };
        let rules = AttrRules::Ibta;
        let (_, m) = init_attr(QpType::Rc, 0);
        check_transition(rules, QpType::Rc, QpState::Reset, QpState::Init, m).unwrap();
        let (_, m) = init_attr(QpType::Ud, RDMA_UDP_QKEY);
        check_transition(rules, QpType::Ud, QpState::Reset, QpState::Init, m).unwrap();
        let (a, m) = rtr_attr(&p);
        check_transition(rules, QpType::Rc, QpState::Init, QpState::Rtr, m).unwrap();
        assert_eq!(&a.ah_attr.dgid[10..], &[0xff, 0xff, 127, 0, 0, 1]);
        assert!(a.ah_attr.is_global);
        assert_eq!(
            (a.dest_qp_num, a.rq_psn, a.max_dest_rd_atomic),
            (0x01_1234, 0x12_3456, 4),
            "we receive with the PSN we announced"
        );
        let (a, m) = rts_attr(&p);
        check_transition(rules, QpType::Rc, QpState::Rtr, QpState::Rts, m).unwrap();
        assert_eq!(
            (a.sq_psn, a.max_rd_atomic, a.retry_cnt, a.rnr_retry),
            (0xab_cdef, 2, 7, 7),
            "we send with the PSN the peer announced"
        );
        assert!(init_qp_attr(QpType::Rc, QpState::Rtr, None, 0).is_none());
        let (_, m) = init_qp_attr(QpType::Ud, QpState::Rts, None, 0).unwrap();
        check_transition(rules, QpType::Ud, QpState::Rtr, QpState::Rts, m).unwrap();
    }
}
