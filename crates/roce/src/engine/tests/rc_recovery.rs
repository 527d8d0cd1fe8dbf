//! Recovery paths, each provoked precisely: sequence NAK and go-back-N, RNR NAK and its
//! retries, ACK timeouts against a dead peer, duplicate READ replay and duplicate atomics.

use super::app_view::AppMr;
use super::harness::{pattern, rc_pair, timeout_of, Node, Opts};
use super::net::{NetCfg, Sim};
use crate::engine::{rnr_timer, RcError};
use softrdma_verbs::*;
use softrdma_wire::roce::{AethKind, NakCode, Reth, RoceOpcode, RocePacket};
use std::time::Duration;

const SEC: Duration = Duration::from_secs(1);

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

/// B's `len`-byte MR filled with `pattern(len, seed)` and A's sink of the same size, with A's
/// READ (wr_id 1) of all of it posted. Returns (remote, sink).
fn post_whole_read(a: &Node, b: &Node, len: usize, seed: u8) -> (AppMr, AppMr) {
    let remote = b.mr(len, all());
    remote.write(0, &pattern(len, seed)).unwrap();
    let sink = a.mr(len, Access::LOCAL_WRITE);
    a.qp.post_send_one(SendWr::read(
        1,
        vec![sink.sge(0, len as u32)],
        remote.addr(),
        remote.rkey(),
    ))
    .unwrap();
    (remote, sink)
}

/// A filter dropping the first packet (in direction `to_b`) that `pick` selects.
fn drop_once(to_b_want: bool, mut pick: impl FnMut(RoceOpcode, u32) -> bool + 'static) -> super::net::Filter {
    let mut done = false;
    Box::new(move |to_b, pkt| {
        if !done && to_b == to_b_want && pick(pkt.opcode(), pkt.headers.bth.psn) {
            done = true;
            return false;
        }
        true
    })
}

#[test]
fn lost_packet_gives_one_sequence_nak_and_go_back_n() {
    let o = Opts {
        mtu: 256,
        sq_psn: 1000,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 20);
    // Drop the third packet of the WRITE (PSN 1002) once.
    sim.filter = Some(drop_once(true, |op, psn| op.is_write() && psn == 1002));
    let len = 256 * 10;
    let src = a.mr(len, Access::LOCAL_WRITE);
    src.write(0, &pattern(len, 4)).unwrap();
    let remote = b.mr(len, all());
    a.qp.post_send_one(SendWr::write(
        1,
        vec![src.sge(0, len as u32)],
        remote.addr(),
        remote.rkey(),
    ))
    .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(remote.to_vec(), pattern(len, 4));
    let (sa, sb) = (a.engine.stats(), b.engine.stats());
    assert_eq!(sb.naks_sent.psn_sequence, 1, "one NAK per gap");
    assert_eq!(sa.naks_received.psn_sequence, 1);
    assert_eq!(sb.out_of_sequence_dropped, 7);
    // Go-back-N resends 1002..=1009; no timeout was needed.
    assert_eq!(sa.retransmitted_packets, 8);
    assert_eq!(sa.timeouts, 0);
    let resent: Vec<u32> = sim.log.iter().filter(|s| s.to_b).map(|s| s.psn).skip(10).collect();
    assert_eq!(resent, (1002..1010).collect::<Vec<_>>());
}

#[test]
fn rnr_nak_then_receive_posted_later() {
    let o = Opts {
        min_rnr_timer: 14, // 1.28 ms
        rnr_retry: 7,      // forever
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 21);
    let src = a.mr(3000, Access::LOCAL_WRITE);
    src.write(0, &pattern(3000, 8)).unwrap();
    a.qp.post_send_one(SendWr::send(1, vec![src.sge(0, 3000)])).unwrap();
    // No receive WR: RNR NAK after RNR NAK, each followed by a wait.
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.engine.stats().rnr_waits >= 3));
    assert!(a.send_wcs().is_empty());
    let t = sim.elapsed();
    assert!(t >= rnr_timer(14) * 2, "the requester waited between attempts ({t:?})");
    assert!(b.engine.stats().naks_sent.rnr >= 3);
    assert!(sim
        .log
        .iter()
        .filter(|s| !s.to_b)
        .all(|s| s.aeth == Some(AethKind::RnrNak { timer: 14 })
            || s.aeth == Some(AethKind::Nak(NakCode::PsnSequenceError))));
    let dst = b.mr(4096, Access::LOCAL_WRITE);
    b.qp.post_recv_one(7, dst.sge(0, 4096)).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, b| a.send_wcs().len() == 1
        && b.recv_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(b.recv_wcs()[0].byte_len, 3000);
    assert_eq!(&dst.to_vec()[..3000], &pattern(3000, 8)[..]);
    assert_eq!(a.engine.stats().timeouts, 0);
}

#[test]
fn rnr_retry_zero_fails_at_once_and_flushes() {
    let o = Opts {
        rnr_retry: 0,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 22);
    let src = a.mr(16, Access::LOCAL_WRITE);
    a.qp.post_send(&[
        SendWr::send(1, vec![src.sge(0, 16)]),
        SendWr::send(2, vec![src.sge(0, 16)]),
    ])
    .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 2));
    assert_eq!(
        a.send_status(),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(matches!(
        a.engine.error(),
        Some(RcError::RnrRetryExceeded { wr_id: 1, .. })
    ));
    assert_eq!(a.qp.state(), QpState::Err);
    // The responder is fine: RNR is not an error there.
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn rnr_retry_count_is_honoured() {
    let o = Opts {
        rnr_retry: 2,
        min_rnr_timer: 1,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 23);
    a.qp.post_send_one(SendWr::send(1, vec![])).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(1, WcStatus::RnrRetryExcErr)]);
    assert_eq!(a.engine.stats().rnr_waits, 2);
    assert_eq!(a.engine.stats().naks_received.rnr, 3);
}

#[test]
fn dead_peer_gives_retry_exceeded_within_the_bound() {
    let o = Opts {
        timeout: 10, // 4.19 ms
        retry_cnt: 3,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 24);
    sim.filter = Some(Box::new(|to_b, _| !to_b));
    let src = a.mr(5000, Access::LOCAL_WRITE);
    let remote = b.mr(5000, all());
    a.qp.post_send(&[
        SendWr::write(1, vec![src.sge(0, 5000)], remote.addr(), remote.rkey()),
        SendWr::send(2, vec![src.sge(0, 8)]),
        SendWr::read(3, vec![src.sge(0, 8)], remote.addr(), remote.rkey()),
    ])
    .unwrap();
    assert!(sim.run(&mut a, &mut b, 10 * SEC, |a, _| a.send_wcs().len() == 3));
    assert_eq!(
        a.send_status(),
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    let t = timeout_of(10);
    let elapsed = sim.elapsed();
    // First transmission at 0, then retry_cnt retransmissions, each after a full timeout.
    assert!(
        elapsed >= 4 * t && elapsed <= 4 * t + Duration::from_millis(1),
        "{elapsed:?}"
    );
    let st = a.engine.stats();
    assert_eq!(st.timeouts, 4);
    assert!(st.retransmitted_packets > 0);
    assert!(matches!(
        a.engine.error(),
        Some(RcError::RetryExceeded { wr_id: 1, retries: 3 })
    ));
    assert!(a.engine.is_closed());
    assert_eq!(a.engine.poll_timeout(), None);
    assert_eq!(remote.to_vec(), vec![0u8; 5000]);
}

#[test]
fn infinite_ack_timeout_waits_forever() {
    let o = Opts {
        timeout: 0,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 25);
    sim.filter = Some(Box::new(|to_b, _| !to_b));
    a.qp.post_send_one(SendWr::send(1, vec![])).unwrap();
    sim.settle(&mut a, &mut b, SEC);
    assert_eq!(a.engine.poll_timeout(), None);
    assert!(a.send_wcs().is_empty());
    assert_eq!(a.engine.stats().timeouts, 0);
}

#[test]
fn lost_read_response_is_replayed_from_memory() {
    let o = Opts {
        mtu: 256,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 26);
    // Lose the 3rd response packet: the requester asks again from there.
    let mut seen = 0;
    let mut dropped = false;
    sim.filter = Some(Box::new(move |to_b, pkt| {
        if !to_b && pkt.opcode().is_read_response() && !dropped {
            seen += 1;
            if seen == 3 {
                dropped = true;
                return false;
            }
        }
        true
    }));
    let len = 256 * 6;
    let (_remote, sink) = post_whole_read(&a, &b, len, 6);
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(sink.to_vec(), pattern(len, 6));
    let (sa, sb) = (a.engine.stats(), b.engine.stats());
    assert_eq!(sa.implied_naks, 1, "the gap in the responses was noticed at once");
    assert_eq!(sa.timeouts, 0);
    assert_eq!(sb.duplicates, 1);
    // The retried request asked only for packets 3..6, starting with a new FIRST.
    let reqs: Vec<_> = sim
        .log
        .iter()
        .filter(|s| s.opcode == RoceOpcode::RcReadRequest)
        .collect();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].psn, reqs[0].psn + 2);
    assert_eq!(sb.read_responses_sent, 6 + 4);
}

#[test]
fn lost_last_read_response_recovers_by_timeout_and_replay() {
    let o = Opts {
        mtu: 256,
        timeout: 8,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 27);
    sim.filter = Some(drop_once(false, |op, _| op == RoceOpcode::RcReadResponseOnly));
    let (_remote, sink) = post_whole_read(&a, &b, 100, 1);
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    assert_eq!(sink.to_vec(), pattern(100, 1));
    assert_eq!(a.engine.stats().timeouts, 1);
    assert_eq!(b.engine.stats().duplicates, 1);
}

#[test]
fn duplicate_atomic_is_not_executed_twice() {
    let o = Opts {
        timeout: 8,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 28);
    sim.filter = Some(drop_once(false, |op, _| op == RoceOpcode::RcAtomicAck));
    let remote = b.mr(8, all());
    remote.write(0, &40u64.to_ne_bytes()).unwrap();
    let sink = a.mr(8, Access::LOCAL_WRITE);
    let wr = SendWr {
        wr_id: 1,
        opcode: Some(WrOpcode::AtomicFetchAndAdd),
        sg_list: vec![sink.sge(0, 8)],
        flags: SendFlags::SIGNALED,
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
        compare_add: 2,
        ..SendWr::default()
    };
    a.qp.post_send_one(wr).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(
        u64::from_ne_bytes(remote.to_vec().try_into().unwrap()),
        42,
        "executed once"
    );
    assert_eq!(
        u64::from_ne_bytes(sink.to_vec().try_into().unwrap()),
        40,
        "the saved original"
    );
    let sb = b.engine.stats();
    assert_eq!((sb.atomics_executed, sb.duplicates), (1, 1));
    assert_eq!(a.engine.stats().timeouts, 1);
}

#[test]
fn lost_ack_is_recovered_and_duplicates_are_acknowledged() {
    let o = Opts {
        timeout: 8,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 29);
    sim.filter = Some(drop_once(false, |op, _| op == RoceOpcode::RcAck));
    let src = a.mr(100, Access::LOCAL_WRITE);
    let dst = b.mr(100, Access::LOCAL_WRITE);
    b.qp.post_recv_one(1, dst.sge(0, 100)).unwrap();
    a.qp.post_send_one(SendWr::send(1, vec![src.sge(0, 100)])).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    sim.settle(&mut a, &mut b, SEC);
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(b.recv_status(), vec![(1, WcStatus::Success)], "delivered once");
    assert_eq!(b.engine.stats().duplicates, 1);
    assert_eq!(b.engine.stats().acks_sent, 2);
}

#[test]
fn every_packet_duplicated() {
    let o = Opts {
        mtu: 256,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(
        NetCfg {
            dup: 1.0,
            ..NetCfg::default()
        },
        30,
    );
    let len = 3000;
    let src = a.mr(len, Access::LOCAL_WRITE);
    src.write(0, &pattern(len, 2)).unwrap();
    let remote = b.mr(len, all());
    let dst = b.mr(len, Access::LOCAL_WRITE);
    let sink = a.mr(len + 8, Access::LOCAL_WRITE);
    b.qp.post_recv_one(1, dst.sge(0, len as u32)).unwrap();
    // FENCE: unfenced, the atomic may execute before the READ's responses read memory
    // (IBTA allows it; the responder generates READ responses as it sends them).
    let fa = SendWr {
        wr_id: 4,
        opcode: Some(WrOpcode::AtomicFetchAndAdd),
        sg_list: vec![sink.sge(len, 8)],
        flags: SendFlags::SIGNALED | SendFlags::FENCE,
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
        compare_add: 1,
        ..SendWr::default()
    };
    a.qp.post_send(&[
        SendWr::write(1, vec![src.sge(0, len as u32)], remote.addr(), remote.rkey()),
        SendWr::send(2, vec![src.sge(0, len as u32)]),
        SendWr::read(3, vec![sink.sge(0, len as u32)], remote.addr(), remote.rkey()),
        fa,
    ])
    .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 4));
    sim.settle(&mut a, &mut b, SEC);
    assert!(
        a.send_status().iter().all(|s| s.1 == WcStatus::Success),
        "{:?}",
        a.send_status()
    );
    assert_eq!(b.recv_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(dst.to_vec(), pattern(len, 2));
    assert_eq!(&sink.to_vec()[..len], &pattern(len, 2)[..]);
    let mut expect = pattern(len, 2);
    let first = u64::from_ne_bytes(expect[..8].try_into().unwrap());
    expect[..8].copy_from_slice(&first.wrapping_add(1).to_ne_bytes());
    assert_eq!(remote.to_vec(), expect, "the atomic ran once");
    assert_eq!(b.engine.stats().atomics_executed, 1);
    assert!(b.engine.stats().duplicates > 0);
    assert!(a.engine.stats().stale_responses > 0);
}

#[test]
fn replayed_read_ends_the_stale_response_stream() {
    let mtu = 256;
    let (mut a, mut b) = rc_pair(Opts { mtu, ..Opts::default() });
    let sim = Sim::new(NetCfg::default(), 27);
    let npkts = 64;
    let len = mtu * npkts;
    let (_remote, _sink) = post_whole_read(&a, &b, len, 9);
    a.engine.sync_state(sim.now);
    let mut req = Vec::new();
    assert!(a.engine.poll_transmit(sim.now, &mut req));
    let first = RocePacket::parse(&req).unwrap().headers;
    b.engine.handle_packet(sim.now, &RocePacket::parse(&req).unwrap());
    // Five responses leave; the requester lost the 3rd and asks again from there.
    let mut out = Vec::new();
    for _ in 0..5 {
        assert!(b.engine.poll_transmit(sim.now, &mut out));
    }
    let mut again = first;
    let reth = first.reth.unwrap();
    again.bth.psn = (first.bth.psn + 2) & 0xff_ffff;
    again.reth = Some(Reth {
        va: reth.va + 2 * mtu as u64,
        rkey: reth.rkey,
        dma_len: reth.dma_len - 2 * mtu as u32,
    });
    let mut dup = Vec::new();
    again.emit(&[], &mut dup);
    b.engine.handle_packet(sim.now, &RocePacket::parse(&dup).unwrap());
    let mut rest = Vec::new();
    while b.engine.poll_transmit(sim.now, &mut out) {
        let p = RocePacket::parse(&out).unwrap();
        rest.push((p.opcode(), p.headers.bth.psn));
    }
    // Only the replay follows: FIRST at the requested PSN, then the rest of the READ once.
    assert_eq!(rest.len(), npkts - 2, "{rest:?}");
    assert_eq!(rest[0], (RoceOpcode::RcReadResponseFirst, again.bth.psn));
    assert_eq!(rest.last().unwrap().0, RoceOpcode::RcReadResponseLast);
    assert_eq!(b.engine.stats().read_responses_sent, 5 + npkts as u64 - 2);
}

/// `softrdma soak`'s "the server disconnects after its ACK" ending, reduced to two engines: A
/// READs 6 packets (the 2nd response is lost) and SENDs an END; B moves its QP to ERR as soon
/// as the END is received (the server's `rdma_disconnect`). Returns A's completions.
fn read_then_end_then_responder_err(fence: bool) -> (Vec<(u64, WcStatus)>, AppMr, RcStatsView) {
    let o = Opts {
        mtu: 256,
        timeout: 8, // 1 ms
        retry_cnt: 3,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(NetCfg::default(), 31);
    let mut seen = 0;
    sim.filter = Some(Box::new(move |to_b, pkt| {
        if !to_b && pkt.opcode().is_read_response() {
            seen += 1;
            return seen != 2;
        }
        true
    }));
    let dst = b.mr(64, Access::LOCAL_WRITE);
    b.qp.post_recv_one(9, dst.sge(0, 64)).unwrap();
    let len = 256 * 6;
    let (_remote, sink) = post_whole_read(&a, &b, len, 3);
    let src = a.mr(32, Access::LOCAL_WRITE);
    let mut end = SendWr::send(2, vec![src.sge(0, 32)]);
    if fence {
        end.flags = end.flags | SendFlags::FENCE;
    }
    a.qp.post_send_one(end).unwrap();
    assert!(
        sim.run(&mut a, &mut b, SEC, |_, b| b.recv_wcs().len() == 1),
        "B got the END"
    );
    b.modify_to_error(&sim);
    assert!(
        sim.run(&mut a, &mut b, 10 * SEC, |a, _| a.send_wcs().len() == 2),
        "A's WRs completed"
    );
    let s = a.engine.stats();
    (
        a.send_status(),
        sink,
        RcStatsView {
            timeouts: s.timeouts,
            implied_naks: s.implied_naks,
        },
    )
}

/// The counters `read_then_end_then_responder_err` reports.
struct RcStatsView {
    timeouts: u64,
    implied_naks: u64,
}

#[test]
fn responder_in_err_never_replays_a_read_so_a_later_send_that_ends_the_connection_is_fenced() {
    // Unfenced: the END overtakes the READ's lost response; B in ERR answers nothing more, and
    // the READ can only run out of transport retries (what the 2 % loss soak over RoCE hit when
    // the DREQ that would have flushed it was lost too).
    let (st, _sink, s) = read_then_end_then_responder_err(false);
    assert_eq!(st[0], (1, WcStatus::RetryExcErr), "{st:?}");
    assert_eq!(s.timeouts, 4, "3 retries, then the 4th timeout fails it");
    // Fenced: the END leaves only after the READ has all its data (the lost response replayed
    // first), so B's ERR strands nothing.
    let (st, sink, s) = read_then_end_then_responder_err(true);
    assert_eq!(st, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(sink.to_vec(), pattern(256 * 6, 3));
    assert_eq!(s.implied_naks, 1, "the lost response was asked for again at once");
}
