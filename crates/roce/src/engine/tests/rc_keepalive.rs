//! Keepalive: an idle QP whose peer died without a DREQ learns within interval +
//! (retry_cnt + 1) × max(ACK timeout, interval / 2); a live peer answers the probes without
//! any visible effect, and one that stops answering for less than that is not taken for dead.

use super::harness::{pattern, rc_pair, rc_pair_with, timeout_of, Node, Opts};
use super::net::{NetCfg, Sim};
use crate::engine::RcError;
use softrdma_verbs::*;
use softrdma_wire::roce::RoceOpcode;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

fn with_keepalive(interval: Duration) -> Opts {
    Opts {
        keepalive: Some(interval),
        timeout: 12,
        retry_cnt: 3,
        ..Opts::default()
    }
}

/// A pair where only `a` probes (interval 100 ms), and nothing reaches `b` until the test
/// lifts `sim.filter`.
fn a_probes_b_unreachable(seed: u64) -> (Node, Node, Sim) {
    let oa = with_keepalive(100 * MS);
    let ob = Opts {
        keepalive: None,
        ..oa.clone()
    };
    let (a, b) = rc_pair_with(oa, ob);
    let mut sim = Sim::new(NetCfg::default(), seed);
    sim.filter = Some(Box::new(|to_b, _| !to_b));
    (a, b, sim)
}

#[test]
fn live_peer_answers_probes_without_effect() {
    let (mut a, mut b) = rc_pair(with_keepalive(100 * MS));
    let mut sim = Sim::new(NetCfg::default(), 40);
    let dst = a.mr(64, Access::LOCAL_WRITE);
    a.qp.post_recv_one(1, dst.sge(0, 64)).unwrap();
    let remote = b.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    sim.settle(&mut a, &mut b, 1000 * MS);
    assert!(a.wcs.is_empty() && b.wcs.is_empty(), "{:?} {:?}", a.wcs, b.wcs);
    assert!(a.engine.error().is_none() && b.engine.error().is_none());
    let (sa, sb) = (a.engine.stats(), b.engine.stats());
    let probes = sa.keepalive_probes + sb.keepalive_probes;
    // Both sides started together, so both probe each interval (at most two per interval).
    assert!((5..=20).contains(&probes), "{sa:?} {sb:?}");
    assert_eq!(sa.duplicates + sb.duplicates, probes, "each probe is a duplicate");
    assert_eq!(
        sa.stale_responses + sb.stale_responses,
        probes,
        "each answer is a stale ACK"
    );
    for s in sim.log.iter().filter(|s| s.opcode == RoceOpcode::RcWriteOnly) {
        assert!(s.psn == 99 || s.psn == 199, "probe PSN {} is not sq_psn - 1", s.psn);
    }
    // The connection works as before: the PSNs did not move.
    let src = b.mr(64, Access::LOCAL_WRITE);
    src.write(0, &pattern(64, 3)).unwrap();
    b.qp.post_send_one(SendWr::send(7, vec![src.sge(0, 64)])).unwrap();
    a.qp.post_send_one(SendWr::write(8, vec![], remote.addr(), remote.rkey()))
        .unwrap();
    assert!(sim.run(&mut a, &mut b, 100 * MS, |a, b| a.wcs.len() == 2 && b.wcs.len() == 1));
    assert_eq!(a.recv_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(dst.to_vec(), pattern(64, 3));
    assert_eq!(b.send_status(), vec![(7, WcStatus::Success)]);
}

#[test]
fn dead_peer_flushes_posted_receives() {
    let (mut a, mut b, mut sim) = a_probes_b_unreachable(41);
    let dst = a.mr(256, Access::LOCAL_WRITE);
    for i in 0..3 {
        a.qp.post_recv_one(i, dst.sge(0, 256)).unwrap();
    }
    assert!(sim.run(&mut a, &mut b, 10_000 * MS, |a, _| a.wcs.len() == 3));
    assert_eq!(
        a.recv_status(),
        vec![
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    // First probe after the interval, then retry_cnt resends, each after the ACK timeout
    // (12: 16.8 ms) or half the interval, whichever is longer.
    let bound = 100 * MS + 4 * timeout_of(12).max(50 * MS);
    let took = sim.elapsed();
    assert!(took >= bound && took <= bound + MS, "{took:?}, expected {bound:?}");
    assert_eq!(a.engine.stats().keepalive_probes, 4);
    match a.engine.error() {
        Some(e @ RcError::PeerUnresponsive { probes: 4, .. }) => assert!(e.peer_lost()),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a.engine.poll_timeout(), None);
    // Work posted later flushes too.
    a.qp.post_recv_one(9, dst.sge(0, 8)).unwrap();
    a.engine.handle_timeout(sim.now);
    a.collect();
    assert_eq!(a.recv_status().last(), Some(&(9, WcStatus::WrFlushErr)));
}

/// Linux rxe in a loaded TCG guest once went silent for about 2.5 s in the middle of
/// `ibv_rc_pingpong` (ACK timeout 14): the keepalive gave up after 2 s + 8 × 67 ms and
/// flushed the receives. A resend waits at least half the interval now.
#[test]
fn a_peer_silent_longer_than_the_ack_retries_is_not_taken_for_dead() {
    let (mut a, mut b, mut sim) = a_probes_b_unreachable(43);
    let dst = a.mr(64, Access::LOCAL_WRITE);
    a.qp.post_recv_one(1, dst.sge(0, 64)).unwrap();
    // Silent for longer than interval + (retry_cnt + 1) × ACK timeout (100 + 4 × 16.8 ms),
    // less than interval + (retry_cnt + 1) × interval / 2 (300 ms).
    sim.settle(&mut a, &mut b, 220 * MS);
    assert!(a.engine.error().is_none(), "{:?}", a.engine.error());
    assert_eq!(a.engine.stats().keepalive_probes, 3);
    sim.filter = None;
    let src = b.mr(64, Access::LOCAL_WRITE);
    src.write(0, &pattern(64, 5)).unwrap();
    b.qp.post_send_one(SendWr::send(7, vec![src.sge(0, 64)])).unwrap();
    assert!(sim.run(&mut a, &mut b, 1000 * MS, |a, b| a.wcs.len() == 1 && b.wcs.len() == 1));
    assert_eq!(a.recv_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(dst.to_vec(), pattern(64, 5));
    assert!(a.engine.error().is_none() && a.qp.state() == QpState::Rts);
}

#[test]
fn no_probes_while_traffic_flows_or_when_off() {
    let (mut a, mut b) = rc_pair(with_keepalive(50 * MS));
    let mut sim = Sim::new(NetCfg::default(), 42);
    let src = a.mr(4096, Access::LOCAL_WRITE);
    let remote = b.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    for round in 0..40u64 {
        a.qp.post_send_one(SendWr::write(
            round,
            vec![src.sge(0, 4096)],
            remote.addr(),
            remote.rkey(),
        ))
        .unwrap();
        let want = round as usize + 1;
        assert!(sim.run(&mut a, &mut b, 10 * MS, |a, _| a.wcs.len() == want));
        // 10 ms of quiet between WRs (nothing in flight): shorter than the interval.
        sim.now += 10 * MS;
    }
    assert_eq!(a.engine.stats().keepalive_probes + b.engine.stats().keepalive_probes, 0);
    assert!(a.send_status().iter().all(|s| s.1 == WcStatus::Success));
    // IB timeout 0 waits forever: no keepalive either.
    let (a, _b) = rc_pair(Opts {
        timeout: 0,
        ..with_keepalive(50 * MS)
    });
    assert_eq!(a.engine.keepalive_due(), None);
    assert_eq!(a.engine.poll_timeout(), None);
}
