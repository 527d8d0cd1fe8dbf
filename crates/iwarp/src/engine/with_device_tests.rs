//! The one engine-module test that needs a device: it checks the verbs `Qp`'s own rules for
//! an iWARP QP (posting before RTS is EINVAL, RTS only through a connection, posts in ERR
//! without a driver flush at once), which live in `Qp::post_send`, `Qp::post_recv` and
//! `Qp::modify` on a device's PD and CQ; no engine runs. The engine tests use `PlainQp`.

use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::*;

/// A soft device over a synthetic loopback interface (the QP below takes the iWARP rules).
fn device() -> device::DeviceInfo {
    let lo = device::NetIf::synthetic_loopback();
    device::devices_from(&[lo], None).unwrap().remove(0)
}

#[test]
fn posting_in_wrong_state_is_einval() {
    let ctx = Context::open(&device()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq,
        srq: None,
        cap,
        qp_type: QpType::Rc,
        sq_sig_all: true,
    };
    let qp = Qp::new(&pd, init, AttrRules::Iwarp).unwrap();
    let e = qp.post_send(&[SendWr::send(1, vec![])]).unwrap_err();
    assert_eq!((e.0, e.1.errno), (0, Errno::Inval));
    assert!(e.1.msg.contains("RESET"), "{}", e.1.msg);
    let e = qp.post_recv(&[RecvWr::default()]).unwrap_err();
    assert_eq!(e.1.errno, Errno::Inval);
    let attr = QpAttr {
        qp_state: Some(QpState::Rts),
        ..QpAttr::default()
    };
    let e = qp.modify(&attr, attr_mask::STATE).unwrap_err();
    assert_eq!(e.errno, Errno::Inval);
    let attr = QpAttr {
        qp_state: Some(QpState::Init),
        ..QpAttr::default()
    };
    qp.modify(&attr, attr_mask::STATE).unwrap();
    let e = qp.post_send(&[SendWr::send(1, vec![])]).unwrap_err();
    assert!(e.1.msg.contains("INIT"));
    qp.post_recv(&[RecvWr::default()]).unwrap();
    let attr = QpAttr {
        qp_state: Some(QpState::Err),
        ..QpAttr::default()
    };
    qp.modify(&attr, attr_mask::STATE).unwrap();
    qp.post_send(&[SendWr::send(5, vec![])]).unwrap();
    let got: Vec<_> = std::iter::from_fn(|| qp.inner().send_cq.poll_one())
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(got, vec![(0, WcStatus::WrFlushErr), (5, WcStatus::WrFlushErr)]);
}
