//! Every operation on a clean network, byte-exact, including PSN wraparound.

use super::app_view::AppMr;
use super::harness::{pattern, rc_pair, Opts};
use super::net::{NetCfg, Sim};
use softrdma_verbs::wr::wc_flags;
use softrdma_verbs::*;
use softrdma_wire::roce::RoceOpcode;
use std::time::Duration;

const SEC: Duration = Duration::from_secs(1);

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

#[test]
fn send_recv_sizes_and_sges() {
    let (mut a, mut b) = rc_pair(Opts::default());
    let mut sim = Sim::new(NetCfg::default(), 1);
    let sizes = [0usize, 1, 3, 1023, 1024, 1025, 4096, 5 * 1024 + 3];
    let total: usize = sizes.iter().sum();
    let src = a.mr(total, Access::LOCAL_WRITE);
    src.write(0, &pattern(total, 7)).unwrap();
    let dst = b.mr(16 * 8192, Access::LOCAL_WRITE);
    let mut off = 0;
    for (i, &len) in sizes.iter().enumerate() {
        // Receive buffers split in two SGEs, with room to spare.
        let base = i * 8192;
        b.qp.post_recv(&[RecvWr {
            wr_id: 100 + i as u64,
            sg_list: vec![dst.sge(base, 1000), dst.sge(base + 1000, 7000)],
        }])
        .unwrap();
        // Send buffers split in two SGEs as well.
        let half = len / 2;
        let sges = vec![src.sge(off, half as u32), src.sge(off + half, (len - half) as u32)];
        a.qp.post_send_one(SendWr::send(i as u64, sges)).unwrap();
        off += len;
    }
    assert!(sim.run(&mut a, &mut b, SEC, |a, b| a.send_wcs().len() == sizes.len()
        && b.recv_wcs().len() == sizes.len()));
    let data = pattern(total, 7);
    let got = dst.to_vec();
    let mut off = 0;
    for (i, (w, &len)) in b.recv_wcs().iter().zip(&sizes).enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.opcode),
            (100 + i as u64, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!(w.byte_len as usize, len);
        assert_eq!(w.wc_flags, 0);
        assert_eq!(&got[i * 8192..i * 8192 + len], &data[off..off + len], "message {i}");
        off += len;
    }
    let s = a.send_wcs();
    assert!(s.iter().enumerate().all(|(i, w)| w.wr_id == i as u64
        && w.status == WcStatus::Success
        && w.opcode == WcOpcode::Send
        && w.byte_len as usize == sizes[i]));
    assert_eq!(a.qp.inner().sends_outstanding(), 0);
    let st = a.engine.stats();
    assert_eq!(
        (st.retransmitted_packets, st.timeouts, st.naks_received.total()),
        (0, 0, 0)
    );
    assert!(st.acks_received >= 1);
    assert_eq!(b.engine.stats().duplicates, 0);
}

#[test]
fn write_multi_packet_then_read_back() {
    let (mut a, mut b) = rc_pair(Opts {
        mtu: 256,
        ..Opts::default()
    });
    let mut sim = Sim::new(NetCfg::default(), 2);
    let len = 100_000;
    let local = a.mr(len, Access::LOCAL_WRITE);
    local.write(0, &pattern(len, 9)).unwrap();
    let remote = b.mr(len + 64, all());
    a.qp.post_send_one(SendWr::write(
        1,
        vec![local.sge(0, len as u32)],
        remote.addr() + 32,
        remote.rkey(),
    ))
    .unwrap();
    let back = a.mr(len, Access::LOCAL_WRITE);
    // Read back into three SGEs.
    let sges = vec![
        back.sge(0, 10),
        back.sge(10, 50_000),
        back.sge(50_010, (len - 50_010) as u32),
    ];
    a.qp.post_send_one(SendWr::read(2, sges, remote.addr() + 32, remote.rkey()))
        .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 2));
    assert_eq!(
        a.send_wcs()
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite, len as u32),
            (2, WcStatus::Success, WcOpcode::RdmaRead, len as u32)
        ]
    );
    let r = remote.to_vec();
    assert_eq!(&r[..32], &[0u8; 32]);
    assert_eq!(&r[32..32 + len], &pattern(len, 9)[..]);
    assert_eq!(&r[32 + len..], &[0u8; 32]);
    assert_eq!(back.to_vec(), pattern(len, 9));
    // 391 WRITE packets, 1 READ request; 391 READ responses.
    let npkts = len.div_ceil(256);
    let writes = sim.log.iter().filter(|s| s.to_b && s.opcode.is_write()).count();
    let reads = sim
        .log
        .iter()
        .filter(|s| !s.to_b && s.opcode.is_read_response())
        .count();
    assert_eq!((writes, reads), (npkts, npkts));
    assert_eq!(b.engine.stats().read_responses_sent, npkts as u64);
    assert!(b.recv_wcs().is_empty(), "WRITE consumes no receive WR");
}

#[test]
fn zero_length_write_and_read() {
    let (mut a, mut b) = rc_pair(Opts::default());
    let mut sim = Sim::new(NetCfg::default(), 3);
    a.qp.post_send_one(SendWr::write(1, vec![], 0, 0)).unwrap();
    a.qp.post_send_one(SendWr::read(2, vec![], 0, 0)).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 2));
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn immediates_and_invalidate() {
    let (mut a, mut b) = rc_pair(Opts {
        mtu: 512,
        ..Opts::default()
    });
    let mut sim = Sim::new(NetCfg::default(), 4);
    let src = a.mr(4096, Access::LOCAL_WRITE);
    src.write(0, &pattern(4096, 1)).unwrap();
    let dst = b.mr(8192, Access::LOCAL_WRITE);
    let target = b.mr(4096, all());
    let victim = b.mr(64, all());
    for i in 0..3 {
        b.qp.post_recv_one(10 + i, dst.sge(i as usize * 2048, 2048)).unwrap();
    }
    let imm = u32::from_ne_bytes([0xde, 0xad, 0xbe, 0xef]);
    // SEND with immediate, 3 packets.
    let mut s = SendWr::send(1, vec![src.sge(0, 1500)]);
    s.opcode = Some(WrOpcode::SendWithImm);
    s.imm_data = imm;
    s.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    // WRITE with immediate, 2 packets; consumes a receive WR without touching its buffer.
    let mut w = SendWr::write(2, vec![src.sge(100, 1000)], target.addr() + 8, target.rkey());
    w.opcode = Some(WrOpcode::RdmaWriteWithImm);
    w.imm_data = 0x0102_0304;
    // SEND with invalidate.
    let mut inv = SendWr::send(3, vec![src.sge(0, 16)]);
    inv.opcode = Some(WrOpcode::SendWithInv);
    inv.invalidate_rkey = victim.rkey();
    a.qp.post_send(&[s, w, inv]).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, b| a.send_wcs().len() == 3
        && b.recv_wcs().len() == 3));
    let r = b.recv_wcs();
    assert_eq!((r[0].wr_id, r[0].opcode, r[0].byte_len), (10, WcOpcode::Recv, 1500));
    assert_eq!(
        (r[0].wc_flags, r[0].imm_data, r[0].solicited),
        (wc_flags::WITH_IMM, imm, true)
    );
    assert_eq!(&dst.to_vec()[..1500], &pattern(4096, 1)[..1500]);
    assert_eq!(
        (r[1].wr_id, r[1].opcode, r[1].byte_len),
        (11, WcOpcode::RecvRdmaWithImm, 1000)
    );
    assert_eq!(
        (r[1].wc_flags, r[1].imm_data, r[1].solicited),
        (wc_flags::WITH_IMM, 0x0102_0304, false)
    );
    assert_eq!(
        &dst.to_vec()[2048..4096],
        &[0u8; 2048][..],
        "WRITE_WITH_IMM leaves the receive buffer alone"
    );
    assert_eq!(&target.to_vec()[8..1008], &pattern(4096, 1)[100..1100]);
    assert_eq!(
        (r[2].wr_id, r[2].wc_flags, r[2].imm_data),
        (12, wc_flags::WITH_INV, victim.rkey())
    );
    // On the wire the immediate is the WR's bytes, in order.
    let wire = sim.log.iter().filter(|s| s.opcode == RoceOpcode::RcSendLastImm).count();
    assert_eq!(wire, 1);
    let ops: Vec<_> = a.send_wcs().iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        ops,
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite),
            (3, WcStatus::Success, WcOpcode::Send)
        ]
    );
    // The invalidated key refuses remote access now.
    a.qp.post_send_one(SendWr::write(4, vec![src.sge(0, 4)], victim.addr(), victim.rkey()))
        .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 4));
    assert_eq!(a.send_status()[3], (4, WcStatus::RemAccessErr));
    assert_eq!(victim.to_vec(), vec![0u8; 64]);
}

fn atomic(wr_id: u64, op: WrOpcode, sink: Sge, remote: &AppMr, off: u64, compare_add: u64, swap: u64) -> SendWr {
    SendWr {
        wr_id,
        opcode: Some(op),
        sg_list: vec![sink],
        flags: SendFlags::SIGNALED,
        remote_addr: remote.addr() + off,
        rkey: remote.rkey(),
        compare_add,
        swap,
        ..SendWr::default()
    }
}

#[test]
fn atomics_byte_exact() {
    let (mut a, mut b) = rc_pair(Opts::default());
    let mut sim = Sim::new(NetCfg::default(), 5);
    let remote = b.mr(64, all());
    remote.write(8, &100u64.to_ne_bytes()).unwrap();
    remote.write(16, &0x1111u64.to_ne_bytes()).unwrap();
    let sink = a.mr(64, Access::LOCAL_WRITE);
    let wrs = [
        atomic(1, WrOpcode::AtomicFetchAndAdd, sink.sge(0, 8), &remote, 8, 5, 0),
        atomic(2, WrOpcode::AtomicFetchAndAdd, sink.sge(8, 8), &remote, 8, u64::MAX, 0),
        // Compare matches: swapped.
        atomic(
            3,
            WrOpcode::AtomicCmpAndSwp,
            sink.sge(16, 8),
            &remote,
            16,
            0x1111,
            0x2222,
        ),
        // Compare fails: unchanged.
        atomic(
            4,
            WrOpcode::AtomicCmpAndSwp,
            sink.sge(24, 8),
            &remote,
            16,
            0x1111,
            0x3333,
        ),
    ];
    a.qp.post_send(&wrs).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 4));
    let ops: Vec<_> = a
        .send_wcs()
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    assert_eq!(
        ops,
        vec![
            (1, WcStatus::Success, WcOpcode::FetchAdd, 8),
            (2, WcStatus::Success, WcOpcode::FetchAdd, 8),
            (3, WcStatus::Success, WcOpcode::CompSwap, 8),
            (4, WcStatus::Success, WcOpcode::CompSwap, 8)
        ]
    );
    let s = sink.to_vec();
    let word = |v: &[u8], i: usize| u64::from_ne_bytes(v[i..i + 8].try_into().unwrap());
    assert_eq!(
        [word(&s, 0), word(&s, 8), word(&s, 16), word(&s, 24)],
        [100, 105, 0x1111, 0x2222]
    );
    let r = remote.to_vec();
    assert_eq!(
        [word(&r, 0), word(&r, 8), word(&r, 16), word(&r, 24)],
        [0, 104, 0x2222, 0]
    );
    assert_eq!(b.engine.stats().atomics_executed, 4);
}

#[test]
fn psn_wraparound_both_directions() {
    let o = Opts {
        mtu: 256,
        sq_psn: 0xff_fff0,
        window: 16,
        ..Opts::default()
    };
    let (mut a, mut b) = rc_pair(o);
    let mut sim = Sim::new(
        NetCfg {
            jitter: Duration::from_micros(5),
            ..NetCfg::default()
        },
        6,
    );
    let len = 256 * 40 + 17;
    let src = a.mr(len, Access::LOCAL_WRITE);
    src.write(0, &pattern(len, 3)).unwrap();
    let remote = b.mr(len, all());
    let back = a.mr(len, Access::LOCAL_WRITE);
    let dst = b.mr(len, Access::LOCAL_WRITE);
    b.qp.post_recv_one(9, dst.sge(0, len as u32)).unwrap();
    a.qp.post_send(&[
        SendWr::write(1, vec![src.sge(0, len as u32)], remote.addr(), remote.rkey()),
        SendWr::read(2, vec![back.sge(0, len as u32)], remote.addr(), remote.rkey()),
        SendWr::send(3, vec![src.sge(0, len as u32)]),
    ])
    .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, b| a.send_wcs().len() == 3
        && b.recv_wcs().len() == 1));
    assert!(
        a.send_status().iter().all(|s| s.1 == WcStatus::Success),
        "{:?}",
        a.send_status()
    );
    assert_eq!(remote.to_vec(), pattern(len, 3));
    assert_eq!(back.to_vec(), pattern(len, 3));
    assert_eq!(dst.to_vec(), pattern(len, 3));
    // The PSNs really wrapped.
    assert!(sim.log.iter().any(|s| s.to_b && s.psn == 0xff_ffff));
    assert!(sim.log.iter().any(|s| s.to_b && s.psn < 0x100));
    assert_eq!(a.engine.stats().timeouts, 0);
    assert!(a.engine.stats().acks_received > 3, "window/2 AckReq keeps ACKs coming");
}

#[test]
fn window_limits_packets_in_flight() {
    let (mut a, mut b) = rc_pair(Opts {
        mtu: 256,
        window: 8,
        ..Opts::default()
    });
    let mut sim = Sim::new(
        NetCfg {
            delay: Duration::from_millis(1),
            ..NetCfg::default()
        },
        7,
    );
    let len = 256 * 64;
    let src = a.mr(len, Access::LOCAL_WRITE);
    let remote = b.mr(len, all());
    a.qp.post_send_one(SendWr::write(
        1,
        vec![src.sge(0, len as u32)],
        remote.addr(),
        remote.rkey(),
    ))
    .unwrap();
    sim.step(&mut a, &mut b);
    // One burst of at most `window` packets before any ACK can arrive.
    let first_burst = sim.log.iter().filter(|s| s.at == Duration::ZERO).count();
    assert_eq!(first_burst, 8);
    assert!(
        sim.log
            .iter()
            .filter(|s| s.at == Duration::ZERO)
            .filter(|s| s.opcode.is_write())
            .count()
            == 8
    );
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success)]);
}

#[test]
fn ord_limits_outstanding_reads_and_fence_waits() {
    let (mut a, mut b) = rc_pair(Opts {
        ord: 1,
        ..Opts::default()
    });
    let mut sim = Sim::new(NetCfg::default(), 8);
    let remote = b.mr(4096, all());
    remote.write(0, &pattern(4096, 5)).unwrap();
    let sink = a.mr(4096 * 4, Access::LOCAL_WRITE);
    let src = a.mr(64, Access::LOCAL_WRITE);
    let dst = b.mr(64, Access::LOCAL_WRITE);
    b.qp.post_recv_one(1, dst.sge(0, 64)).unwrap();
    let mut fenced = SendWr::send(9, vec![src.sge(0, 8)]);
    fenced.flags = SendFlags::SIGNALED | SendFlags::FENCE;
    a.qp.post_send(&[
        SendWr::read(1, vec![sink.sge(0, 4096)], remote.addr(), remote.rkey()),
        SendWr::read(2, vec![sink.sge(4096, 4096)], remote.addr(), remote.rkey()),
        fenced,
        SendWr::read(3, vec![sink.sge(8192, 4096)], remote.addr(), remote.rkey()),
    ])
    .unwrap();
    let mut max_rd = 0;
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| {
        max_rd = max_rd.max(a.engine.req.rd_atomic);
        a.send_wcs().len() == 4
    }));
    assert_eq!(max_rd, 1);
    assert_eq!(
        a.send_status(),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (9, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    // The fenced SEND went out only after READ 2's response arrived.
    let read_reqs: Vec<_> = sim
        .log
        .iter()
        .filter(|s| s.opcode == RoceOpcode::RcReadRequest)
        .collect();
    let send = sim.log.iter().find(|s| s.opcode == RoceOpcode::RcSendOnly).unwrap();
    let second_resp = sim.log.iter().filter(|s| s.opcode.is_read_response()).nth(1).unwrap();
    assert_eq!(read_reqs.len(), 3);
    assert!(send.at > second_resp.at);
    assert_eq!(&sink.to_vec()[4096..8192], &pattern(4096, 5)[..]);
}

#[test]
fn unsignaled_wrs_retire_their_slots_and_srq_inline_work() {
    let oa = Opts::default();
    let ob = Opts {
        srq: true,
        ..Opts::default()
    };
    let (mut a, mut b) = super::harness::rc_pair_with(oa, ob);
    let mut sim = Sim::new(NetCfg::default(), 9);
    let srq = b.srq.clone().unwrap();
    let dst = b.mr(256, Access::LOCAL_WRITE);
    for i in 0..4 {
        srq.post_recv_one(i, dst.sge(i as usize * 64, 64));
    }
    let src = a.mr(64, Access::LOCAL_WRITE);
    src.write(0, b"inline payload of thirty-two b!!").unwrap();
    let mut wrs = Vec::new();
    for i in 0..4 {
        let mut w = SendWr::send(i, vec![src.sge(0, 32)]);
        w.flags = if i == 3 { SendFlags::SIGNALED } else { SendFlags::INLINE };
        wrs.push(w);
    }
    a.qp.post_send(&wrs).unwrap();
    // Overwrite the source: the inline copies were taken at post time.
    src.write(0, &[0u8; 32]).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, b| a.send_wcs().len() == 1
        && b.recv_wcs().len() == 4));
    assert_eq!(a.send_status(), vec![(3, WcStatus::Success)]);
    assert_eq!(a.qp.inner().sends_outstanding(), 0);
    let d = dst.to_vec();
    for i in 0..3 {
        assert_eq!(&d[i * 64..i * 64 + 32], b"inline payload of thirty-two b!!");
    }
    assert_eq!(&d[192..224], &[0u8; 32]);
}

#[test]
fn both_directions_at_once() {
    let (mut a, mut b) = rc_pair(Opts {
        mtu: 512,
        ..Opts::default()
    });
    let mut sim = Sim::new(
        NetCfg {
            jitter: Duration::from_micros(3),
            ..NetCfg::default()
        },
        10,
    );
    let len = 20_000;
    let ma = a.mr(2 * len, all());
    let mb = b.mr(2 * len, all());
    ma.write(0, &pattern(len, 1)).unwrap();
    mb.write(0, &pattern(len, 2)).unwrap();
    a.qp.post_send_one(SendWr::write(
        1,
        vec![ma.sge(0, len as u32)],
        mb.addr() + len as u64,
        mb.rkey(),
    ))
    .unwrap();
    b.qp.post_send_one(SendWr::write(
        2,
        vec![mb.sge(0, len as u32)],
        ma.addr() + len as u64,
        ma.rkey(),
    ))
    .unwrap();
    a.qp.post_send_one(SendWr::read(3, vec![ma.sge(len, len as u32)], mb.addr(), mb.rkey()))
        .unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, b| a.send_wcs().len() == 2
        && b.send_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success), (3, WcStatus::Success)]);
    assert_eq!(b.send_status(), vec![(2, WcStatus::Success)]);
    assert_eq!(&mb.to_vec()[len..], &pattern(len, 1)[..]);
    // B's WRITE and A's READ of B's first half both fill A's second half with pattern 2.
    assert_eq!(&ma.to_vec()[len..], &pattern(len, 2)[..]);
}

#[test]
fn engine_created_at_rtr_takes_rts_attributes_on_sync() {
    let (mut a, mut b) = rc_pair(Opts::default());
    let mut sim = Sim::new(NetCfg::default(), 11);
    // As a driver would build it at RTR: no send-side attributes yet.
    let cfg = crate::engine::RcConfig {
        sq_psn: 0,
        ack_timeout: None,
        retry_cnt: 0,
        ord: 0,
        ..a.engine.config().clone()
    };
    a.engine = crate::engine::RcEngine::new(a.qp.inner().clone(), cfg);
    a.engine.sync_state(sim.now);
    assert_eq!(a.engine.config().sq_psn, 100);
    assert_eq!(a.engine.config().ack_timeout, crate::engine::ib_timeout(12));
    assert_eq!((a.engine.config().retry_cnt, a.engine.config().ord), (7, 8));
    let dst = b.mr(64, Access::LOCAL_WRITE);
    b.qp.post_recv_one(1, dst.sge(0, 64)).unwrap();
    a.qp.post_send_one(SendWr::send(1, vec![])).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(sim.log[0].psn, 100);
}

/// The driver builds the engine at RTR and applies the RTS attributes when its progress
/// thread next syncs. If that thread checked the state while it was still RTR and only then
/// transmitted, after the application had moved the QP to RTS and posted (a window a loaded
/// host hits), the requester must still start with the RTS attributes: RTS's `sq_psn` (else
/// the peer takes every packet for a duplicate), its ACK timeout and its retry count (else the
/// first timeout is RETRY_EXC_ERR at once: `ib_send_bw` failed with status 12 and no
/// completion 83 ms after start).
#[test]
fn requester_starting_before_sync_takes_rts_attributes() {
    let rtr_engine = |n: &super::harness::Node| {
        let cfg = crate::engine::RcConfig {
            sq_psn: 0,
            ack_timeout: None,
            retry_cnt: 0,
            ord: 0,
            ..n.engine.config().clone()
        };
        crate::engine::RcEngine::new(n.qp.inner().clone(), cfg)
    };
    // Delivered: the PSN is RTS's.
    let (mut a, mut b) = rc_pair(Opts::default());
    let mut sim = Sim::new(NetCfg::default(), 12);
    a.engine = rtr_engine(&a);
    let dst = b.mr(64, Access::LOCAL_WRITE);
    b.qp.post_recv_one(1, dst.sge(0, 64)).unwrap();
    a.qp.post_send_one(SendWr::send(1, vec![])).unwrap();
    assert!(sim.run(&mut a, &mut b, SEC, |a, _| a.send_wcs().len() == 1));
    assert_eq!(a.send_status(), vec![(1, WcStatus::Success)]);
    assert_eq!(sim.log[0].psn, 100);

    // Unanswered: RTS's timeout, retried retry_cnt (7) times, then RETRY_EXC_ERR.
    let (mut a, mut b) = rc_pair(Opts::default());
    let mut sim = Sim::new(NetCfg::default(), 13);
    sim.filter = Some(Box::new(|to_b, _| !to_b));
    a.engine = rtr_engine(&a);
    a.qp.post_send_one(SendWr::send(1, vec![])).unwrap();
    assert!(sim.run(&mut a, &mut b, 10 * SEC, |a, _| !a.send_wcs().is_empty()));
    assert_eq!(a.send_status(), vec![(1, WcStatus::RetryExcErr)]);
    assert_eq!(a.engine.stats().timeouts, 8);
    let t = super::harness::timeout_of(12);
    assert!(sim.elapsed() >= 8 * t && sim.elapsed() < 9 * t, "{:?}", sim.elapsed());
}
