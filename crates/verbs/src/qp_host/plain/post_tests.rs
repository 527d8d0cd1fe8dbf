//! Posting to a [`PlainQp`] as to a real QP: state checks, inline copies, send-queue slots,
//! the SRQ, a detached QP's immediate flush, and another PD's keys.

use super::{PlainQp, PlainSrq, PLAIN_PD};
use crate::async_event::AsyncEventKind;
use crate::mr::KeyError;
use crate::qp::QpAttr;
use crate::qp_host::QpHost;
use crate::qp_state::QpState;
use crate::wr::{Access, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};
use crate::Errno;

fn sge(mr: &crate::mr::MrInner, off: usize, len: u32) -> Sge {
    Sge {
        addr: mr.region.addr() + off as u64,
        length: len,
        lkey: mr.lkey,
    }
}

fn statuses(wcs: Vec<WorkCompletion>) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn sends_before_rts_and_receives_in_reset_are_einval() {
    let qp = PlainQp::new(1, QpState::Rtr, QpAttr::default());
    let e = qp.try_post_send(SendWr::send(1, vec![])).unwrap_err();
    assert_eq!(e.errno, Errno::Inval);
    assert!(e.msg.contains("RTR"), "{}", e.msg);
    qp.try_post_recv(RecvWr::default()).unwrap();
    qp.set_state(QpState::Reset);
    assert_eq!(qp.try_post_recv(RecvWr::default()).unwrap_err().errno, Errno::Inval);
}

#[test]
fn inline_bytes_are_copied_at_post_time() {
    let qp = PlainQp::new(2, QpState::Rts, QpAttr::default());
    let mr = qp.register(16, Access::LOCAL_WRITE);
    assert!(mr.region.write(0, b"inline payload!!"));
    let mut wr = SendWr::send(1, vec![sge(&mr, 0, 8), sge(&mr, 8, 8)]);
    wr.flags = SendFlags::INLINE;
    qp.post_send(wr);
    assert!(mr.region.write(0, &[0; 16]));
    let wqe = qp.pop_send_if(&mut |_| true).expect("the WR is queued");
    assert_eq!(wqe.inline.as_deref(), Some(&b"inline payload!!"[..]));
    let mut bad = SendWr::send(
        2,
        vec![Sge {
            lkey: 0xdead_be00,
            ..sge(&mr, 0, 8)
        }],
    );
    bad.flags = SendFlags::INLINE;
    assert_eq!(qp.try_post_send(bad).unwrap_err().errno, Errno::Inval);
}

#[test]
fn a_send_holds_its_slot_until_it_completes() {
    let qp = PlainQp::new(3, QpState::Rts, QpAttr::default());
    qp.post_send(SendWr::send(1, vec![]));
    qp.post_send(SendWr::send(2, vec![]));
    assert_eq!(qp.sends_outstanding(), 2);
    let wc = WorkCompletion::new(1, WcStatus::Success, WcOpcode::Send, 3);
    qp.complete_send(wc, false);
    assert_eq!(qp.sends_outstanding(), 1);
    assert!(qp.take_send_wcs().is_empty(), "an unsignaled success is not reported");
}

#[test]
fn qps_on_an_srq_take_from_it_in_order_and_report_the_last_wqe() {
    let srq = PlainSrq::new();
    let a = PlainQp::with_srq(4, QpState::Rts, QpAttr::default(), srq.clone());
    let b = PlainQp::with_srq(5, QpState::Rts, QpAttr::default(), srq.clone());
    for id in 1..=3 {
        srq.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![],
        });
    }
    assert_eq!(a.try_post_recv(RecvWr::default()).unwrap_err().errno, Errno::Inval);
    assert_eq!(a.take_recv().map(|r| r.wr_id), Some(1));
    assert_eq!(b.take_recv().map(|r| r.wr_id), Some(2));
    assert_eq!(srq.len(), 1);
    let _ = a.enter_error();
    let _ = a.enter_error();
    assert_eq!(a.events(), vec![AsyncEventKind::QpLastWqeReached]);
    assert!(b.events().is_empty());
}

#[test]
fn an_err_qp_queues_for_its_engine_and_flushes_at_once_when_detached() {
    let qp = PlainQp::new(6, QpState::Err, QpAttr::default());
    qp.post_send(SendWr::send(1, vec![]));
    qp.post_recv(RecvWr {
        wr_id: 2,
        sg_list: vec![],
    });
    assert!(qp.take_send_wcs().is_empty() && qp.take_recv_wcs().is_empty());
    qp.detach();
    assert_eq!(statuses(qp.take_send_wcs()), vec![(1, WcStatus::WrFlushErr)]);
    assert_eq!(statuses(qp.take_recv_wcs()), vec![(2, WcStatus::WrFlushErr)]);
    qp.post_send(SendWr::send(3, vec![]));
    assert_eq!(statuses(qp.take_send_wcs()), vec![(3, WcStatus::WrFlushErr)]);
    assert_eq!(qp.sends_outstanding(), 0);
}

#[test]
fn a_key_of_another_pd_is_found_and_refused() {
    let qp = PlainQp::new(7, QpState::Rts, QpAttr::default());
    let other = qp.register_in(PLAIN_PD + 1, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let base = other.region.addr();
    assert_eq!(
        qp.check_remote(other.rkey, base, 8, Access::REMOTE_WRITE).err(),
        Some(KeyError::WrongPd)
    );
    let another_qp = PlainQp::new(8, QpState::Rts, QpAttr::default());
    let mine = another_qp.register(64, Access::LOCAL_WRITE);
    assert_ne!(mine.lkey, other.lkey, "keys are unique across PlainQps");
}
