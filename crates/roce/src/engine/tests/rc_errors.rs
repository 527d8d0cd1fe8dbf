//! Protection and length errors: the failed WR gets its status, later WRs flush in order,
//! both QPs end in ERR, and target memory is never changed by a rejected request.

use super::app_view::AppMr;
use super::harness::{pattern, rc_pair, rc_pair_with, Node, Opts};
use super::net::{NetCfg, Sim};
use crate::engine::{RcError, RequestError};
use softrdma_verbs::mr::KeyError;
use softrdma_verbs::*;
use softrdma_wire::roce::{RoceOpcode, RocePacket};
use std::time::Duration;

const SEC: Duration = Duration::from_secs(1);

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

/// Posts `wr` and a SEND after it; expects `status` on `wr`, a flush for the SEND, both QPs
/// in ERR and `remote` unchanged. Returns the pair for further checks.
fn expect_remote_error(mut a: Node, mut b: Node, remote: &AppMr, wr: SendWr, status: WcStatus) -> (Node, Node) {
    let mut sim = Sim::new(NetCfg::default(), 11);
    let before = remote.to_vec();
    let id = wr.wr_id;
    a.qp.post_send(&[wr, SendWr::send(99, vec![])]).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 2));
    sim.settle(&mut a, &mut b, SEC);
    assert_eq!(a.send_status(), vec![(id, status), (99, WcStatus::WrFlushErr)]);
    assert_ne!(a.send_wcs()[0].vendor_err, 0, "the NAK syndrome is reported");
    assert_eq!(remote.to_vec(), before, "target memory changed");
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
    assert!(a.engine.is_closed() && b.engine.is_closed());
    assert!(matches!(a.engine.error(), Some(RcError::RemoteNak { .. })));
    assert!(matches!(b.engine.error(), Some(RcError::Rejected { .. })));
    assert_eq!(b.engine.stats().naks_sent.total(), 1);
    assert_eq!(a.engine.stats().naks_received.total(), 1);
    (a, b)
}

#[test]
fn write_with_bad_rkey() {
    let (a, b) = rc_pair(Opts::default());
    let src = a.mr(64, Access::LOCAL_WRITE);
    src.write(0, &[0xAA; 64]).unwrap();
    let remote = b.mr(64, all());
    let wr = SendWr::write(5, vec![src.sge(0, 64)], remote.addr(), remote.rkey() ^ 0x100);
    let (_, b) = expect_remote_error(a, b, &remote, wr, WcStatus::RemAccessErr);
    assert_eq!(b.engine.stats().naks_sent.remote_access, 1);
    assert!(matches!(
        b.engine.error(),
        Some(RcError::Rejected {
            err: RequestError::RemoteKey {
                err: KeyError::InvalidKey,
                ..
            },
            ..
        })
    ));
}

#[test]
fn multi_packet_write_out_of_bounds_changes_nothing() {
    let (a, b) = rc_pair(Opts {
        mtu: 256,
        ..Opts::default()
    });
    let src = a.mr(4096, Access::LOCAL_WRITE);
    src.write(0, &pattern(4096, 1)).unwrap();
    let remote = b.mr(4096, all());
    let wr = SendWr::write(5, vec![src.sge(0, 4096)], remote.addr() + 100, remote.rkey());
    expect_remote_error(a, b, &remote, wr, WcStatus::RemAccessErr);
}

#[test]
fn write_to_other_pd_or_without_remote_write() {
    let (a, b) = rc_pair(Opts::default());
    let src = a.mr(64, Access::LOCAL_WRITE);
    let foreign = b.mr_of_another_pd(64, all());
    let wr = SendWr::write(5, vec![src.sge(0, 64)], foreign.addr(), foreign.rkey());
    expect_remote_error(a, b, &foreign, wr, WcStatus::RemAccessErr);

    let (a, b) = rc_pair(Opts::default());
    let src = a.mr(64, Access::LOCAL_WRITE);
    let ro = b.mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let wr = SendWr::write(5, vec![src.sge(0, 64)], ro.addr(), ro.rkey());
    expect_remote_error(a, b, &ro, wr, WcStatus::RemAccessErr);
}

#[test]
fn read_errors() {
    // Larger than the MR.
    let (a, b) = rc_pair(Opts::default());
    let sink = a.mr(8192, Access::LOCAL_WRITE);
    let remote = b.mr(4096, all());
    let wr = SendWr::read(5, vec![sink.sge(0, 8192)], remote.addr(), remote.rkey());
    let (a, _) = expect_remote_error(a, b, &remote, wr, WcStatus::RemAccessErr);
    let _ = a;
    assert_eq!(sink.to_vec(), vec![0u8; 8192]);
    // MR without REMOTE_READ.
    let (a, b) = rc_pair(Opts::default());
    let sink = a.mr(64, Access::LOCAL_WRITE);
    let remote = b.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wr = SendWr::read(6, vec![sink.sge(0, 64)], remote.addr(), remote.rkey());
    expect_remote_error(a, b, &remote, wr, WcStatus::RemAccessErr);
}

#[test]
fn atomic_without_remote_atomic() {
    let (a, b) = rc_pair(Opts::default());
    let sink = a.mr(8, Access::LOCAL_WRITE);
    let remote = b.mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    remote.write(0, &7u64.to_ne_bytes()).unwrap();
    let wr = SendWr {
        wr_id: 5,
        opcode: Some(WrOpcode::AtomicFetchAndAdd),
        sg_list: vec![sink.sge(0, 8)],
        flags: SendFlags::SIGNALED,
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
        compare_add: 1,
        ..SendWr::default()
    };
    expect_remote_error(a, b, &remote, wr, WcStatus::RemAccessErr);
}

#[test]
fn qp_without_remote_write_is_invalid_request() {
    let ob = Opts {
        access: Access::LOCAL_WRITE,
        ..Opts::default()
    };
    let (a, b) = rc_pair_with(Opts::default(), ob);
    let src = a.mr(64, Access::LOCAL_WRITE);
    let remote = b.mr(64, all());
    let wr = SendWr::write(5, vec![src.sge(0, 64)], remote.addr(), remote.rkey());
    let (_, b) = expect_remote_error(a, b, &remote, wr, WcStatus::RemInvReqErr);
    assert_eq!(b.engine.stats().naks_sent.invalid_request, 1);
}

#[test]
fn reads_beyond_ird_are_invalid_requests() {
    let oa = Opts {
        ord: 4,
        ..Opts::default()
    };
    let ob = Opts {
        ird: 1,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair_with(oa, ob);
    let mut sim = Sim::new(NetCfg::default(), 12);
    let remote = b.mr(64, all());
    let sink = a.mr(256, Access::LOCAL_WRITE);
    let reads: Vec<_> = (0..3)
        .map(|i| SendWr::read(i, vec![sink.sge(i as usize * 64, 64)], remote.addr(), remote.rkey()))
        .collect();
    a.qp.post_send(&reads).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 3));
    // The three requests arrive together; the responder has resources for one.
    assert_eq!(
        a.send_status(),
        vec![
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::RemInvReqErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert!(matches!(
        b.engine.error(),
        Some(RcError::Rejected {
            err: RequestError::TooManyReads { ird: 1 },
            ..
        })
    ));
}

#[test]
fn message_too_long_for_the_receive_buffer() {
    let (mut a, mut b) = rc_pair(Opts {
        mtu: 256,
        ..Opts::default()
    });
    let mut sim = Sim::new(NetCfg::default(), 13);
    let src = a.mr(1000, Access::LOCAL_WRITE);
    src.write(0, &pattern(1000, 2)).unwrap();
    let dst = b.mr(600, Access::LOCAL_WRITE);
    b.qp.post_recv(&[
        RecvWr {
            wr_id: 1,
            sg_list: vec![dst.sge(0, 300)],
        },
        RecvWr {
            wr_id: 2,
            sg_list: vec![dst.sge(300, 300)],
        },
    ])
    .unwrap();
    a.qp.post_send(&[
        SendWr::send(10, vec![src.sge(0, 1000)]),
        SendWr::send(11, vec![src.sge(0, 10)]),
    ])
    .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, b| a.send_wcs().len() == 2
        && b.recv_wcs().len() == 2));
    assert_eq!(
        b.recv_status(),
        vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        a.send_status(),
        vec![(10, WcStatus::RemInvReqErr), (11, WcStatus::WrFlushErr)]
    );
    // The first packet fitted and was placed; the one that did not fit was not.
    let d = dst.to_vec();
    assert_eq!(&d[..256], &pattern(1000, 2)[..256]);
    assert_eq!(&d[256..], &[0u8; 344][..]);
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn local_protection_error_completes_in_order() {
    let (mut a, mut b) = rc_pair(Opts::default());
    let mut sim = Sim::new(NetCfg::default(), 14);
    let src = a.mr(64, Access::LOCAL_WRITE);
    let dst = b.mr(64, Access::LOCAL_WRITE);
    b.qp.post_recv_one(1, dst.sge(0, 64)).unwrap();
    let bad = Sge {
        addr: 0x1000,
        length: 8,
        lkey: 0xdead_beef,
    };
    a.qp.post_send(&[
        SendWr::send(1, vec![src.sge(0, 8)]),
        SendWr::send(2, vec![bad]),
        SendWr::send(3, vec![src.sge(0, 8)]),
    ])
    .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 3));
    assert_eq!(
        a.send_status(),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(b.recv_status(), vec![(1, WcStatus::Success)]);
    assert!(matches!(a.engine.error(), Some(RcError::LocalWr { wr_id: 2, .. })));
    assert_eq!(a.qp.state(), QpState::Err);
    // Nothing is sent after the error.
    let sent = sim.log.len();
    sim.settle(&mut a, &mut b, SEC);
    assert!(sim.log[sent..].iter().all(|s| !s.to_b));
    // A READ sink without LOCAL_WRITE is a local protection error too.
    let (mut a, mut b) = rc_pair(Opts::default());
    let ro = a.mr(64, Access(0));
    let remote = b.mr(64, all());
    a.qp.post_send_one(SendWr::read(7, vec![ro.sge(0, 64)], remote.addr(), remote.rkey()))
        .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(7, WcStatus::LocProtErr)]);
}

#[test]
fn application_error_flushes_in_flight_then_queued() {
    let (mut a, mut b) = rc_pair(Opts {
        mtu: 256,
        window: 4,
        ..Opts::default()
    });
    let mut sim = Sim::new(
        NetCfg {
            delay: Duration::from_millis(1),
            ..NetCfg::default()
        },
        15,
    );
    let src = a.mr(8192, Access::LOCAL_WRITE);
    let remote = b.mr(8192, all());
    let dst = b.mr(64, Access::LOCAL_WRITE);
    b.qp.post_recv_one(50, dst.sge(0, 64)).unwrap();
    let wrs: Vec<_> = (0..5)
        .map(|i| SendWr::write(i, vec![src.sge(0, 2048)], remote.addr(), remote.rkey()))
        .collect();
    a.qp.post_send(&wrs).unwrap();
    // One burst goes out; then the application moves A to ERR.
    sim.step(&mut a, &mut b);
    assert!(!a.engine.req.ops.is_empty());
    a.modify_to_error(&sim);
    assert_eq!(
        a.send_status(),
        (0..5).map(|i| (i, WcStatus::WrFlushErr)).collect::<Vec<_>>()
    );
    assert!(a.engine.is_closed());
    assert_eq!(a.engine.poll_timeout(), None);
    // Posting to the ERR QP afterwards flushes at the next sync.
    a.qp.post_send_one(SendWr::send(9, vec![])).unwrap();
    a.engine.sync_state(sim.now);
    a.collect();
    assert_eq!(a.send_status().last(), Some(&(9, WcStatus::WrFlushErr)));
    // B's receive side: moving it to ERR flushes its receive WR.
    b.modify_to_error(&sim);
    assert_eq!(b.recv_status(), vec![(50, WcStatus::WrFlushErr)]);
    let mut out = Vec::new();
    assert!(!a.engine.poll_transmit(sim.now, &mut out));
    assert!(out.is_empty());
}

/// A SEND of "pong" from `a` (WR 7) received and completed by `b` (receive WRs 50 and, if
/// `recvs` is 2, 51), whose ACK is still queued; returns the pair, the clock and `a`'s source.
fn b_owes_an_ack(recvs: u64) -> (Node, Node, Sim, AppMr) {
    let (mut a, mut b) = rc_pair(Opts::default());
    let sim = Sim::new(NetCfg::default(), 16);
    let dst = b.mr(64, Access::LOCAL_WRITE);
    for wr_id in 50..50 + recvs {
        b.qp.post_recv_one(wr_id, dst.sge(0, 64)).unwrap();
    }
    let src = a.mr(64, Access::LOCAL_WRITE);
    src.write(0, b"pong").unwrap();
    a.qp.post_send_one(SendWr::send(7, vec![src.sge(0, 4)])).unwrap();
    a.engine.sync_state(sim.now);
    let mut out = Vec::new();
    assert!(a.engine.poll_transmit(sim.now, &mut out));
    b.engine.handle_packet(sim.now, &RocePacket::parse(&out).unwrap());
    b.collect();
    assert_eq!(b.recv_status(), vec![(50, WcStatus::Success)]);
    (a, b, sim, src)
}

#[test]
fn owed_ack_leaves_after_the_application_moves_the_responder_to_error() {
    // B's application sees the message and disconnects before B's ACK went out.
    let (mut a, mut b, sim, _) = b_owes_an_ack(1);
    let mut out = Vec::new();
    b.modify_to_error(&sim);
    assert!(!b.engine.is_closed(), "the owed ACK is still queued");
    let mut ack = Vec::new();
    assert!(b.engine.poll_transmit(sim.now, &mut ack), "the owed ACK goes out");
    let pkt = RocePacket::parse(&ack).unwrap();
    assert_eq!(pkt.headers.bth.opcode, RoceOpcode::RcAck);
    assert!(!b.engine.poll_transmit(sim.now, &mut out), "nothing after it");
    assert!(b.engine.is_closed());
    a.engine.handle_packet(sim.now, &pkt);
    a.collect();
    assert_eq!(a.send_status(), vec![(7, WcStatus::Success)]);
}

#[test]
fn destroying_the_responder_sends_only_its_owed_ack() {
    let (mut a, mut b, sim, src) = b_owes_an_ack(2);
    let mut out = Vec::new();
    // B's application posts a SEND of its own, then destroys the QP before anything left.
    let bsrc = b.mr(64, Access::LOCAL_WRITE);
    b.qp.post_send_one(SendWr::send(8, vec![bsrc.sge(0, 4)])).unwrap();
    b.engine.sync_state(sim.now);
    b.engine.destroy();
    assert!(!b.engine.is_closed(), "the owed ACK is still queued");
    let mut ack = Vec::new();
    assert!(b.engine.poll_transmit(sim.now, &mut ack), "the owed ACK goes out");
    let pkt = RocePacket::parse(&ack).unwrap();
    assert_eq!(pkt.headers.bth.opcode, RoceOpcode::RcAck);
    assert!(
        !b.engine.poll_transmit(sim.now, &mut out),
        "the destroyed QP's SEND does not leave"
    );
    assert!(b.engine.is_closed());
    // Nothing completes on the destroyed QP: neither its SEND nor its other receive WR.
    b.collect();
    assert_eq!(b.send_status(), vec![]);
    assert_eq!(b.recv_status(), vec![(50, WcStatus::Success)]);
    // A packet arriving after the destroy is not handled.
    a.qp.post_send_one(SendWr::send(9, vec![src.sge(0, 4)])).unwrap();
    a.engine.sync_state(sim.now);
    a.engine.handle_packet(sim.now, &pkt);
    a.collect();
    assert_eq!(a.send_status(), vec![(7, WcStatus::Success)]);
    assert!(a.engine.poll_transmit(sim.now, &mut out));
    b.engine.handle_packet(sim.now, &RocePacket::parse(&out).unwrap());
    b.collect();
    assert_eq!(b.recv_status(), vec![(50, WcStatus::Success)]);
    assert!(!b.engine.poll_transmit(sim.now, &mut out), "no ACK for it");
}
