//! The IBTA QP state machine (IBTA vol. 1, 10.3.1 and `ib_modify_qp_is_ok`), sans-I/O.
//!
//! Legal transitions are the same on every device. Which attributes a transition requires
//! depends on the transport: IB/RoCE QPs follow the IBTA table exactly; iWARP QPs, whose
//! addressing comes from the TCP connection, accept the state change with whatever subset
//! of the optional attributes the application passes (as iw_cm and Linux siw do).

use crate::wr::Access;

/// QP states (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpState {
    /// Reset.
    Reset = 0,
    /// Initialized.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drained.
    Sqd = 4,
    /// Send queue error.
    Sqe = 5,
    /// Error.
    Err = 6,
}

impl QpState {
    /// Decodes the C value.
    pub fn from_u32(v: u32) -> Option<QpState> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
}

impl std::fmt::Display for QpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        })
    }
}

/// `enum ibv_qp_attr_mask` bits.
pub mod attr_mask {
    /// qp_state.
    pub const STATE: u32 = 1;
    /// cur_qp_state.
    pub const CUR_STATE: u32 = 1 << 1;
    /// en_sqd_async_notify.
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    /// qp_access_flags.
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    /// pkey_index.
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// port_num.
    pub const PORT: u32 = 1 << 5;
    /// qkey.
    pub const QKEY: u32 = 1 << 6;
    /// ah_attr.
    pub const AV: u32 = 1 << 7;
    /// path_mtu.
    pub const PATH_MTU: u32 = 1 << 8;
    /// timeout.
    pub const TIMEOUT: u32 = 1 << 9;
    /// retry_cnt.
    pub const RETRY_CNT: u32 = 1 << 10;
    /// rnr_retry.
    pub const RNR_RETRY: u32 = 1 << 11;
    /// rq_psn.
    pub const RQ_PSN: u32 = 1 << 12;
    /// max_rd_atomic.
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    /// alt_ah_attr etc.
    pub const ALT_PATH: u32 = 1 << 14;
    /// min_rnr_timer.
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    /// sq_psn.
    pub const SQ_PSN: u32 = 1 << 16;
    /// max_dest_rd_atomic.
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    /// path_mig_state.
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    /// cap.
    pub const CAP: u32 = 1 << 19;
    /// dest_qp_num.
    pub const DEST_QPN: u32 = 1 << 20;
    /// What an RC (or UC) QP must be given on INIT → RTR (IBTA; with [`STATE`] to modify).
    pub const RC_RTR_REQUIRED: u32 = AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;
    /// What an RC (or UC) QP must be given on RTR → RTS (IBTA; with [`STATE`] to modify).
    pub const RC_RTS_REQUIRED: u32 = SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC;
}

/// QP types (`enum ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum QpType {
    /// Reliable connected.
    Rc = 2,
    /// Unreliable connected.
    Uc = 3,
    /// Unreliable datagram.
    Ud = 4,
}

/// Whether attribute requirements follow the IBTA table (IB/RoCE) or iWARP's relaxed rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrRules {
    /// IB and RoCE: required and optional attributes per IBTA.
    Ibta,
    /// iWARP: the connection supplies addressing; only the state graph is enforced.
    Iwarp,
}

fn ibta_masks(qp_type: QpType, cur: QpState, new: QpState) -> Option<(u32, u32)> {
    use attr_mask::*;
    use QpState::*;
    let ud = qp_type == QpType::Ud;
    Some(match (cur, new) {
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) => {
            if ud {
                (PKEY_INDEX | PORT | QKEY, 0)
            } else {
                (PKEY_INDEX | PORT | ACCESS_FLAGS, 0)
            }
        }
        (Init, Init) => {
            if ud {
                (0, PKEY_INDEX | PORT | QKEY)
            } else {
                (0, PKEY_INDEX | PORT | ACCESS_FLAGS)
            }
        }
        (Init, Rtr) => {
            if ud {
                (0, PKEY_INDEX | QKEY)
            } else {
                (RC_RTR_REQUIRED, ALT_PATH | ACCESS_FLAGS | PKEY_INDEX)
            }
        }
        (Rtr, Rts) => {
            if ud {
                (SQ_PSN, CUR_STATE | QKEY)
            } else {
                (
                    RC_RTS_REQUIRED,
                    CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE,
                )
            }
        }
        (Rts, Rts) | (Sqd, Rts) => (
            0,
            CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER | QKEY,
        ),
        (Rts, Sqd) => (0, EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            0,
            PKEY_INDEX
                | PORT
                | AV
                | ALT_PATH
                | ACCESS_FLAGS
                | TIMEOUT
                | RETRY_CNT
                | RNR_RETRY
                | MAX_QP_RD_ATOMIC
                | MAX_DEST_RD_ATOMIC
                | MIN_RNR_TIMER
                | PATH_MIG_STATE
                | QKEY,
        ),
        (Sqe, Rts) => (0, CUR_STATE | ACCESS_FLAGS | QKEY),
        _ => return None,
    })
}

/// Checks a `modify_qp` request. `Err` carries the reason (the caller reports EINVAL).
pub fn check_transition(
    rules: AttrRules,
    qp_type: QpType,
    cur: QpState,
    new: QpState,
    mask: u32,
) -> Result<(), String> {
    let Some((required, optional)) = ibta_masks(qp_type, cur, new) else {
        return Err(format!("illegal QP state transition {cur} -> {new}"));
    };
    if rules == AttrRules::Iwarp {
        return Ok(());
    }
    let given = mask & !attr_mask::STATE;
    let missing = required & !given;
    if missing != 0 {
        return Err(format!(
            "{cur} -> {new} requires attribute mask bits {missing:#x} (see ibv_modify_qp(3))"
        ));
    }
    let extra = given & !(required | optional);
    if extra != 0 {
        return Err(format!("{cur} -> {new} does not accept attribute mask bits {extra:#x}"));
    }
    Ok(())
}

/// Checks that QP access flags are known access bits (those that mean nothing for a QP are
/// accepted and ignored).
pub fn check_qp_access(access: Access) -> Result<(), String> {
    // The MR-only bits (ZERO_BASED, ON_DEMAND, HUGETLB, the optional ones) are accepted and
    // mean nothing for a QP: rdma-core's tests pass an MR's access flags to modify_qp.
    let allowed = Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0
        | Access::MW_BIND.0
        | 0x20
        | 0x40
        | 0x80
        | Access::OPTIONAL_MASK;
    if access.0 & !allowed != 0 {
        return Err(format!("unknown QP access flags {:#x}", access.0 & !allowed));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::attr_mask::*;
    use super::*;
    use QpState::*;

    const ALL: [QpState; 7] = [Reset, Init, Rtr, Rts, Sqd, Sqe, Err];

    #[test]
    fn state_graph_matches_ibta() {
        let legal = [
            (Reset, Init),
            (Init, Init),
            (Init, Rtr),
            (Rtr, Rts),
            (Rts, Rts),
            (Rts, Sqd),
            (Sqd, Sqd),
            (Sqd, Rts),
            (Sqe, Rts),
        ];
        for cur in ALL {
            for new in ALL {
                let ok = check_transition(AttrRules::Iwarp, QpType::Rc, cur, new, STATE).is_ok();
                let expect = new == Reset || new == Err || legal.contains(&(cur, new));
                assert_eq!(ok, expect, "{cur} -> {new}");
            }
        }
    }

    #[test]
    fn ibta_rc_requires_attributes() {
        assert!(check_transition(AttrRules::Ibta, QpType::Rc, Reset, Init, STATE).is_err());
        assert!(check_transition(
            AttrRules::Ibta,
            QpType::Rc,
            Reset,
            Init,
            STATE | PKEY_INDEX | PORT | ACCESS_FLAGS
        )
        .is_ok());
        let rtr = STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;
        assert!(check_transition(AttrRules::Ibta, QpType::Rc, Init, Rtr, rtr).is_ok());
        assert!(check_transition(AttrRules::Ibta, QpType::Rc, Init, Rtr, rtr & !DEST_QPN).is_err());
        assert!(check_transition(AttrRules::Ibta, QpType::Rc, Init, Rtr, rtr | SQ_PSN).is_err());
        let rts = STATE | SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC;
        assert!(check_transition(AttrRules::Ibta, QpType::Rc, Rtr, Rts, rts).is_ok());
        assert!(check_transition(
            AttrRules::Ibta,
            QpType::Ud,
            Reset,
            Init,
            STATE | PKEY_INDEX | PORT | QKEY
        )
        .is_ok());
        assert!(check_transition(AttrRules::Ibta, QpType::Ud, Rtr, Rts, STATE | SQ_PSN).is_ok());
    }
}
