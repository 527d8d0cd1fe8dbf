//! Malformed and hostile input: hand-built protocol violations, random packets fed to a
//! responder and a requester (proptest), random bytes. Nothing panics, protected memory
//! never changes, and the engines keep emitting well-formed packets.

use super::app_view::AppMr;
use super::harness::{pattern, rc_pair, Node, Opts};
use super::net::{NetCfg, Sim};
use crate::engine::{RcError, RequestError};
use proptest::prelude::*;
use softrdma_verbs::*;
use softrdma_wire::roce::*;
use std::time::{Duration, Instant};

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

/// Headers for `op` to `node`'s QP at `psn` with every extension header the opcode needs.
fn headers(node: &Node, op: RoceOpcode, psn: u32, payload_len: usize) -> RoceHeaders {
    let mut bth = Bth::new(op, node.qp.qpn(), psn);
    bth.pad_count = pad_len(payload_len) as u8;
    bth.ack_req = true;
    let want = op.headers();
    let mut h = RoceHeaders::new(bth);
    h.reth = want.reth.then_some(Reth {
        va: 0,
        rkey: 0,
        dma_len: payload_len as u32,
    });
    h.aeth = want.aeth.then_some(Aeth::ack(0, AETH_CREDITS_INVALID));
    h.deth = want.deth.then_some(Deth { qkey: 0, src_qp: 1 });
    h.imm = want.immdt.then_some(0);
    h.ieth = want.ieth.then_some(0);
    h.atomic = want.atomic_eth.then_some(AtomicEth {
        va: 0,
        rkey: 0,
        swap_add: 0,
        compare: 0,
    });
    h.atomic_ack = want.atomic_ack_eth.then_some(AtomicAckEth { orig: 0 });
    h
}

/// Everything `node` sends now, parsed.
fn drain(node: &mut Node, now: Instant) -> Vec<RoceHeaders> {
    let mut out = Vec::new();
    let mut got = Vec::new();
    while node.engine.poll_transmit(now, &mut out) {
        let p = RocePacket::parse(&out).expect("engine output parses");
        got.push(p.headers);
    }
    got
}

fn epsn(node: &Node) -> u32 {
    node.engine.resp.epsn.get()
}

#[test]
fn middle_without_first_is_invalid_request() {
    let (_a, mut b) = rc_pair(Opts::default());
    let now = Instant::now();
    let payload = vec![7u8; 1024];
    let h = headers(&b, RoceOpcode::RcSendMiddle, epsn(&b), payload.len());
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &payload,
        },
    );
    let out = drain(&mut b, now);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].bth.opcode, RoceOpcode::RcAck);
    assert_eq!(
        out[0].aeth.map(|a| a.kind()),
        Some(AethKind::Nak(NakCode::InvalidRequest))
    );
    assert_eq!(b.qp.state(), QpState::Err);
    assert!(matches!(
        b.engine.error(),
        Some(RcError::Rejected {
            err: RequestError::OpcodeSequence { .. },
            ..
        })
    ));
    assert!(b.engine.is_closed());
}

#[test]
fn send_interrupted_by_a_new_message_is_invalid_request() {
    let (_a, mut b) = rc_pair(Opts::default());
    let dst = b.mr(4096, Access::LOCAL_WRITE);
    b.qp.post_recv_one(1, dst.sge(0, 4096)).unwrap();
    let now = Instant::now();
    let full = vec![1u8; 1024];
    let p = epsn(&b);
    let h = headers(&b, RoceOpcode::RcSendFirst, p, full.len());
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &full,
        },
    );
    let h = headers(&b, RoceOpcode::RcSendOnly, p + 1, 4);
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &[2; 4],
        },
    );
    b.collect();
    assert_eq!(b.recv_status(), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn length_rule_violations_are_invalid_requests() {
    // A FIRST shorter than the MTU, a zero-length LAST, an ONLY longer than the MTU.
    for (op, len) in [(RoceOpcode::RcSendFirst, 100usize), (RoceOpcode::RcWriteOnly, 1028)] {
        let (_a, mut b) = rc_pair(Opts::default());
        let dst = b.mr(4096, all());
        b.qp.post_recv_one(1, dst.sge(0, 4096)).unwrap();
        let now = Instant::now();
        let payload = vec![9u8; len];
        let mut h = headers(&b, op, epsn(&b), len);
        if let Some(r) = h.reth.as_mut() {
            *r = Reth {
                va: dst.addr(),
                rkey: dst.rkey(),
                dma_len: len as u32,
            };
        }
        b.engine.handle_packet(
            now,
            &RocePacket {
                headers: h,
                payload: &payload,
            },
        );
        let out = drain(&mut b, now);
        assert_eq!(
            out[0].aeth.map(|a| a.kind()),
            Some(AethKind::Nak(NakCode::InvalidRequest)),
            "{op:?}"
        );
        assert_eq!(dst.to_vec(), vec![0u8; 4096], "{op:?}");
    }
}

#[test]
fn inconsistent_packets_are_dropped_silently() {
    let (_a, mut b) = rc_pair(Opts::default());
    let target = b.mr(64, all());
    let now = Instant::now();
    let good = |b: &Node| {
        let mut h = headers(b, RoceOpcode::RcWriteOnly, epsn(b), 4);
        h.reth = Some(Reth {
            va: target.addr(),
            rkey: target.rkey(),
            dma_len: 4,
        });
        h
    };
    // Pad count that does not match the payload.
    let mut h = good(&b);
    h.bth.pad_count = 2;
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &[1; 4],
        },
    );
    // Missing RETH.
    let mut h = good(&b);
    h.reth = None;
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &[1; 4],
        },
    );
    // Wrong P_Key, wrong QP.
    let mut h = good(&b);
    h.bth.pkey = 0x1234;
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &[1; 4],
        },
    );
    let mut h = good(&b);
    h.bth.dest_qp ^= 1;
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &[1; 4],
        },
    );
    // Payload on a READ request; a UD opcode on an RC QP.
    let mut h = headers(&b, RoceOpcode::RcReadRequest, epsn(&b), 0);
    h.bth.pad_count = 0;
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &[1; 4],
        },
    );
    let h = headers(&b, RoceOpcode::UdSendOnly, epsn(&b), 4);
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &[1; 4],
        },
    );
    assert_eq!(b.engine.stats().dropped_invalid, 6);
    assert!(drain(&mut b, now).is_empty());
    assert_eq!(target.to_vec(), vec![0u8; 64]);
    assert_eq!(b.qp.state(), QpState::Rts);
    // The good one still works afterwards.
    let h = good(&b);
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &[1; 4],
        },
    );
    assert_eq!(&target.to_vec()[..4], &[1; 4]);
    let out = drain(&mut b, now);
    assert_eq!(out[0].aeth.map(|a| a.is_ack()), Some(true));
}

#[test]
fn misaligned_atomic_is_invalid_request() {
    let (_a, mut b) = rc_pair(Opts::default());
    let target = b.mr(64, all());
    target.write(0, &pattern(64, 1)).unwrap();
    let now = Instant::now();
    let mut h = headers(&b, RoceOpcode::RcFetchAdd, epsn(&b), 0);
    h.atomic = Some(AtomicEth {
        va: target.addr() + 4,
        rkey: target.rkey(),
        swap_add: 1,
        compare: 0,
    });
    b.engine.handle_packet(
        now,
        &RocePacket {
            headers: h,
            payload: &[],
        },
    );
    let out = drain(&mut b, now);
    assert_eq!(
        out[0].aeth.map(|a| a.kind()),
        Some(AethKind::Nak(NakCode::InvalidRequest))
    );
    assert_eq!(target.to_vec(), pattern(64, 1));
}

#[test]
fn responses_nobody_asked_for_are_ignored() {
    let (mut a, _b) = rc_pair(Opts::default());
    let now = Instant::now();
    for op in [
        RoceOpcode::RcAck,
        RoceOpcode::RcAtomicAck,
        RoceOpcode::RcReadResponseOnly,
        RoceOpcode::RcReadResponseMiddle,
    ] {
        let len = if op.has_payload() { 16 } else { 0 };
        let mut h = headers(&a, op, 100, len);
        if op == RoceOpcode::RcAck {
            h.aeth = Some(Aeth::nak(0, NakCode::RemoteAccessError));
        }
        let payload = vec![0u8; len];
        a.engine.handle_packet(
            now,
            &RocePacket {
                headers: h,
                payload: &payload,
            },
        );
    }
    assert_eq!(a.engine.stats().stale_responses, 4);
    assert_eq!(a.qp.state(), QpState::Rts);
    assert!(drain(&mut a, now).is_empty());
}

/// One fuzzed packet: an opcode, a PSN near the expected one, and fields that sometimes hit
/// the real MR.
#[derive(Debug, Clone)]
struct Spec {
    op: usize,
    psn_delta: i8,
    len: usize,
    lie_pad: bool,
    drop_header: bool,
    real_key: bool,
    va_off: u64,
    dma_len: u32,
    ack_req: bool,
    wrong_pkey: bool,
    syndrome: u8,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0..RoceOpcode::ALL.len(),
        -4i8..6,
        prop_oneof![0..8usize, 250..260usize, 0..600usize],
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.7),
        prop_oneof![Just(0u64), 0..8192u64],
        prop_oneof![Just(0u32), 0..1024u32, any::<u32>()],
        any::<bool>(),
        prop::bool::weighted(0.03),
        any::<u8>(),
    )
        .prop_map(
            |(op, psn_delta, len, lie_pad, drop_header, real_key, va_off, dma_len, ack_req, wrong_pkey, syndrome)| {
                Spec {
                    op,
                    psn_delta,
                    len,
                    lie_pad,
                    drop_header,
                    real_key,
                    va_off,
                    dma_len,
                    ack_req,
                    wrong_pkey,
                    syndrome,
                }
            },
        )
}

fn build<'a>(node: &Node, s: &Spec, base_psn: u32, mr: &AppMr, payload: &'a [u8]) -> RocePacket<'a> {
    let op = RoceOpcode::ALL[s.op];
    let len = if op.has_payload() { s.len } else { 0 };
    let psn = base_psn.wrapping_add(s.psn_delta as i32 as u32) & PSN_MASK;
    let mut h = headers(node, op, psn, len);
    h.bth.ack_req = s.ack_req;
    if s.lie_pad {
        h.bth.pad_count = (h.bth.pad_count + 1) & 3;
    }
    if s.wrong_pkey {
        h.bth.pkey = 0x7fff;
    }
    let (va, rkey) = if s.real_key {
        (mr.addr().wrapping_add(s.va_off), mr.rkey())
    } else {
        (s.va_off, s.dma_len ^ 0x5a5a)
    };
    if let Some(r) = h.reth.as_mut() {
        *r = Reth {
            va,
            rkey,
            dma_len: s.dma_len,
        };
    }
    if let Some(a) = h.atomic.as_mut() {
        *a = AtomicEth {
            va: va & !7,
            rkey,
            swap_add: 3,
            compare: 0,
        };
    }
    if let Some(a) = h.aeth.as_mut() {
        a.syndrome = s.syndrome;
    }
    if s.drop_header {
        h.reth = None;
        h.aeth = None;
        h.atomic = None;
        h.imm = None;
    }
    RocePacket {
        headers: h,
        payload: &payload[..len.min(payload.len())],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// Random request packets at a responder: no panic, well-formed output, memory without
    /// remote write or atomic access never changes.
    #[test]
    fn random_requests_never_panic(specs in prop::collection::vec(spec(), 1..40)) {
        let (_a, mut b) = rc_pair(Opts { mtu: 256, ..Opts::default() });
        let open = b.mr(8192, all());
        let readonly = b.mr(8192, Access::LOCAL_WRITE | Access::REMOTE_READ);
        readonly.write(0, &pattern(8192, 4)).unwrap();
        let dst = b.mr(8192, Access::LOCAL_WRITE);
        for i in 0..4 {
            b.qp.post_recv_one(i, dst.sge(i as usize * 300, 300)).unwrap();
        }
        let payload = pattern(600, 9);
        let now = Instant::now();
        for (i, s) in specs.iter().enumerate() {
            let mr = if i % 2 == 0 { &open } else { &readonly };
            let base = epsn(&b);
            let pkt = build(&b, s, base, mr, &payload);
            b.engine.handle_packet(now, &pkt);
            let _ = drain(&mut b, now);
            b.engine.handle_timeout(now + Duration::from_secs(1));
        }
        b.engine.sync_state(now);
        prop_assert_eq!(readonly.to_vec(), pattern(8192, 4));
        b.collect();
        // Every receive WR completed at most once.
        let mut ids: Vec<u64> = b.recv_wcs().iter().map(|w| w.wr_id).collect();
        ids.sort_unstable();
        ids.dedup();
        prop_assert_eq!(ids.len(), b.recv_wcs().len());
    }

    /// Random responses at a requester with work in flight: no panic; every WR completes at
    /// most once and in order.
    #[test]
    fn random_responses_never_panic(specs in prop::collection::vec(spec(), 1..40)) {
        let (mut a, mut b) = rc_pair(Opts { mtu: 256, ..Opts::default() });
        let mut sim = Sim::new(NetCfg::default(), 5);
        let remote = b.mr(4096, all());
        let local = a.mr(4096, Access::LOCAL_WRITE);
        let wrs = vec![
            SendWr::write(0, vec![local.sge(0, 1000)], remote.addr(), remote.rkey()),
            SendWr::read(1, vec![local.sge(1000, 700)], remote.addr(), remote.rkey()),
            SendWr { wr_id: 2, opcode: Some(WrOpcode::AtomicCmpAndSwp), sg_list: vec![local.sge(2000, 8)],
                flags: SendFlags::SIGNALED, remote_addr: remote.addr(), rkey: remote.rkey(), ..SendWr::default() },
            SendWr::write(3, vec![local.sge(0, 10)], remote.addr(), remote.rkey()),
        ];
        a.qp.post_send(&wrs).unwrap();
        let now = sim.now;
        let _ = drain(&mut a, now);
        let payload = pattern(600, 1);
        for s in &specs {
            let base = a.engine.req.una.get();
            let pkt = build(&a, s, base, &local, &payload);
            a.engine.handle_packet(now, &pkt);
            let _ = drain(&mut a, now);
        }
        // Let the real peer finish (or fail) whatever is left.
        sim.settle(&mut a, &mut b, Duration::from_secs(2));
        let ids: Vec<u64> = a.send_wcs().iter().map(|w| w.wr_id).collect();
        prop_assert!(ids.len() <= 4);
        prop_assert!(ids.windows(2).all(|w| w[0] < w[1]), "{:?}", ids);
    }

    /// Random bytes that happen to parse go to RC and UD engines without harm.
    #[test]
    fn random_bytes_never_panic(raw in prop::collection::vec(prop::collection::vec(any::<u8>(), 12..120), 1..30)) {
        let (mut a, mut b) = rc_pair(Opts::default());
        let now = Instant::now();
        for mut bytes in raw {
            // Aim some of them at the QPs.
            if bytes[0] & 1 == 0 {
                let qpn = if bytes[1] & 1 == 0 { a.qp.qpn() } else { b.qp.qpn() };
                bytes[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
                bytes[2] = 0xff;
                bytes[3] = 0xff;
                bytes[1] &= 0xf0;
            }
            let len = bytes.len() & !3;
            if let Ok(pkt) = RocePacket::parse(&bytes[..len]) {
                a.engine.handle_packet(now, &pkt);
                b.engine.handle_packet(now, &pkt);
            }
            let _ = drain(&mut a, now);
            let _ = drain(&mut b, now);
        }
    }
}
