//! Shared helpers for the soft-iWARP socket tests.
#![allow(dead_code)]

use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::*;

pub struct Endpoint {
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
}

pub fn lo_device() -> device::DeviceInfo {
    device::find_device("siw_lo").unwrap_or_else(|e| panic!("{e}"))
}

pub fn endpoint() -> Endpoint {
    let ctx = Context::open(&lo_device()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let cap = QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap,
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    let qp = Qp::new(&pd, init, AttrRules::Iwarp).unwrap();
    let attr = QpAttr {
        qp_state: Some(QpState::Init),
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..QpAttr::default()
    };
    qp.modify(&attr, attr_mask::STATE | attr_mask::ACCESS_FLAGS).unwrap();
    Endpoint { pd, cq, qp }
}

pub fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let got = cq.wait_for(n, std::time::Duration::from_secs(10));
    assert_eq!(got.len(), n, "timed out waiting for {n} completions, got {got:?}");
    got
}
