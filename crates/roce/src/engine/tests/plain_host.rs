//! RC engines on [`PlainQp`] hosts: no device, no PD, no CQ. The test posts work, carries
//! packets between the engines itself and drives the clock; the engines' outputs (packets,
//! completions, async events, deadlines) are all it looks at.

use crate::engine::{RcConfig, RcEngine, DEFAULT_WINDOW, INITIAL_WINDOW};
use softrdma_verbs::async_event::AsyncEventKind;
use softrdma_verbs::qp_host::{PlainQp, QpOutput};
use softrdma_verbs::*;
use softrdma_wire::roce::RocePacket;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

struct Side {
    qp: Arc<PlainQp>,
    eng: RcEngine,
}

fn side(qpn: u32, dest: u32, sq_psn: u32, rq_psn: u32) -> Side {
    let attr = QpAttr {
        dest_qp_num: dest,
        sq_psn,
        rq_psn,
        timeout: 14,
        retry_cnt: 2,
        rnr_retry: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        qp_access_flags: all(),
        ..QpAttr::default()
    };
    let qp = PlainQp::new(qpn, QpState::Rts, attr);
    let cfg = RcConfig {
        keepalive: None,
        ..RcConfig::from_qp_attr(qpn, &attr, 1024)
    };
    let eng = RcEngine::new(qp.clone(), cfg);
    Side { qp, eng }
}

/// Two connected RC engines (PSNs near the wrap, to cover it).
fn pair() -> (Side, Side) {
    (side(0x11, 0x22, 0xff_fff0, 500), side(0x22, 0x11, 500, 0xff_fff0))
}

/// Hands every packet `from` has ready to `to`; returns how many.
fn carry(from: &mut RcEngine, to: &mut RcEngine, now: Instant) -> usize {
    let mut out = Vec::new();
    let mut n = 0;
    while from.poll_transmit(now, &mut out) {
        let pkt = RocePacket::parse(&out).expect("the engine's packet parses");
        to.handle_packet(now, &pkt);
        out.clear();
        n += 1;
    }
    super::deliver(from);
    super::deliver(to);
    n
}

/// Carries packets both ways until neither side has any.
fn settle(a: &mut Side, b: &mut Side, now: Instant) -> usize {
    let mut total = 0;
    loop {
        let n = carry(&mut a.eng, &mut b.eng, now) + carry(&mut b.eng, &mut a.eng, now);
        if n == 0 {
            return total;
        }
        total += n;
    }
}

fn signaled(mut wr: SendWr) -> SendWr {
    wr.flags = SendFlags::SIGNALED;
    wr
}

fn sge(mr: &softrdma_verbs::mr::MrInner, off: usize, len: u32) -> Sge {
    Sge {
        addr: mr.region.addr() + off as u64,
        length: len,
        lkey: mr.lkey,
    }
}

fn bytes(mr: &softrdma_verbs::mr::MrInner) -> Vec<u8> {
    let mut v = vec![0u8; mr.region.len()];
    assert!(mr.region.read(0, &mut v), "a live region reads");
    v
}

#[test]
fn send_write_read_and_atomic_without_a_device() {
    let (mut a, mut b) = pair();
    let now = Instant::now();
    let src = a.qp.register(8192, Access::LOCAL_WRITE);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    assert!(src.region.write(0, &data));
    let dst = b.qp.register(8192, all());

    // A SEND of 5000 bytes (five packets at MTU 1024) into a posted receive.
    b.qp.post_recv(RecvWr {
        wr_id: 50,
        sg_list: vec![sge(&dst, 0, 8192)],
    });
    a.qp.post_send(signaled(SendWr::send(1, vec![sge(&src, 0, 5000)])));
    // An RDMA WRITE of 3000 bytes at offset 6000 of b's region.
    a.qp.post_send(signaled(SendWr::write(
        2,
        vec![sge(&src, 1000, 3000)],
        dst.region.addr() + 5000,
        dst.rkey,
    )));
    let moved = settle(&mut a, &mut b, now);
    assert!(moved > 8, "8 request packets and their ACKs, {moved} moved");
    let recv = b.qp.take_recv_wcs();
    assert_eq!(recv.len(), 1);
    assert_eq!(
        (recv[0].wr_id, recv[0].status, recv[0].byte_len),
        (50, WcStatus::Success, 5000)
    );
    let got = bytes(&dst);
    assert_eq!(&got[..5000], &data[..5000]);
    assert_eq!(&got[5000..8000], &data[1000..4000]);
    let sends: Vec<(u64, WcStatus)> = a.qp.take_send_wcs().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(sends, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(b.qp.events(), Vec::<AsyncEventKind>::new(), "b was in RTS: no COMM_EST");

    // RDMA READ back the written range, then a fetch-and-add on b's first 8 bytes.
    let back = a.qp.register(4096, Access::LOCAL_WRITE);
    a.qp.post_send(signaled(SendWr::read(
        3,
        vec![sge(&back, 0, 3000)],
        dst.region.addr() + 5000,
        dst.rkey,
    )));
    let mut add = signaled(SendWr::read(4, vec![sge(&back, 3008, 8)], dst.region.addr(), dst.rkey));
    add.opcode = Some(WrOpcode::AtomicFetchAndAdd);
    add.compare_add = 5;
    a.qp.post_send(add);
    settle(&mut a, &mut b, now);
    let sends: Vec<(u64, WcStatus)> = a.qp.take_send_wcs().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(sends, vec![(3, WcStatus::Success), (4, WcStatus::Success)]);
    let back_bytes = bytes(&back);
    assert_eq!(&back_bytes[..3000], &data[1000..4000]);
    let orig = u64::from_ne_bytes(data[..8].try_into().unwrap());
    assert_eq!(u64::from_ne_bytes(back_bytes[3008..3016].try_into().unwrap()), orig);
    assert_eq!(
        u64::from_ne_bytes(bytes(&dst)[..8].try_into().unwrap()),
        orig.wrapping_add(5)
    );
    assert!(a.eng.error().is_none() && b.eng.error().is_none());
    assert_eq!(a.eng.stats().retransmitted_packets, 0);
}

#[test]
fn the_send_window_starts_at_rxes_grows_while_nothing_is_lost_and_halves_on_a_loss() {
    let (mut a, mut b) = pair();
    let now = Instant::now();
    let len = 1usize << 22; // 4096 packets at MTU 1024: enough to grow to DEFAULT_WINDOW
    let src = a.qp.register(len, Access::LOCAL_WRITE);
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    assert!(src.region.write(0, &data));
    let dst = b.qp.register(len, all());
    a.qp.post_send(signaled(SendWr::write(
        1,
        vec![sge(&src, 0, len as u32)],
        dst.region.addr(),
        dst.rkey,
    )));

    // Before any ACK, a window's worth leaves, and no more.
    let mut out = Vec::new();
    let mut first = Vec::new();
    while a.eng.poll_transmit(now, &mut out) {
        first.push(std::mem::take(&mut out));
    }
    assert_eq!(
        (first.len() as u32, a.eng.send_window()),
        (INITIAL_WINDOW, INITIAL_WINDOW)
    );

    // All of it acknowledged: the window grows by every PSN acknowledged.
    for p in &first {
        b.eng
            .handle_packet(now, &RocePacket::parse(p).expect("a request parses"));
    }
    carry(&mut b.eng, &mut a.eng, now);
    assert_eq!(a.eng.send_window(), 2 * INITIAL_WINDOW);
    let mut second = 0;
    while a.eng.poll_transmit(now, &mut out) {
        out.clear();
        second += 1;
    }
    assert_eq!(second, 2 * INITIAL_WINDOW, "the larger window's worth, all of it lost");

    // The ACK timeout resends, with half the window.
    let at = a.eng.poll_timeout().expect("the ACK timer runs");
    a.eng.handle_timeout(at);
    assert_eq!(a.eng.send_window(), INITIAL_WINDOW);

    // The rest is resent and acknowledged; the window grows to its bound, never past it.
    settle(&mut a, &mut b, at);
    let sends: Vec<(u64, WcStatus)> = a.qp.take_send_wcs().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(sends, vec![(1, WcStatus::Success)]);
    assert!(bytes(&dst) == data, "every byte placed once the losses were resent");
    assert_eq!(a.eng.send_window(), DEFAULT_WINDOW);
    assert_eq!(a.eng.stats().timeouts, 1);
}

#[test]
fn a_bad_rkey_fails_the_requester_with_remote_access_error() {
    let (mut a, mut b) = pair();
    let now = Instant::now();
    let src = a.qp.register(64, Access::LOCAL_WRITE);
    let dst = b.qp.register(64, Access::LOCAL_WRITE | Access::REMOTE_READ);
    // WRITE to a region that only allows READ: the responder NAKs, the requester fails.
    a.qp.post_send(signaled(SendWr::write(
        7,
        vec![sge(&src, 0, 64)],
        dst.region.addr(),
        dst.rkey,
    )));
    a.qp.post_send(signaled(SendWr::send(8, vec![sge(&src, 0, 8)])));
    settle(&mut a, &mut b, now);
    let sends: Vec<(u64, WcStatus)> = a.qp.take_send_wcs().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(sends, vec![(7, WcStatus::RemAccessErr), (8, WcStatus::WrFlushErr)]);
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a.qp.events(), vec![AsyncEventKind::QpFatal]);
    let why = a.eng.error().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        why.contains("RemoteAccessError") && why.contains("work request 0x7"),
        "{why}"
    );
    // The responder's memory is untouched.
    assert_eq!(bytes(&dst), vec![0u8; 64]);
}

#[test]
fn a_silent_peer_is_a_retry_exceeded_error_in_simulated_time() {
    let (mut a, _b) = pair();
    let mut now = Instant::now();
    let src = a.qp.register(64, Access::LOCAL_WRITE);
    a.qp.post_send(signaled(SendWr::send(9, vec![sge(&src, 0, 64)])));
    let mut out = Vec::new();
    let mut sent = 0;
    // Every packet is lost: each ACK timeout resends, and after retry_cnt (2) retries the
    // WR fails. The clock only moves to the deadlines the engine asks for.
    for _ in 0..10 {
        while a.eng.poll_transmit(now, &mut out) {
            out.clear();
            sent += 1;
        }
        let Some(at) = a.eng.poll_timeout() else { break };
        assert!(
            at > now && at - now <= Duration::from_secs(1),
            "an ACK timeout near 67 ms"
        );
        now = at;
        a.eng.handle_timeout(now);
    }
    assert_eq!(sent, 3, "the first try and two retries");
    // The engine reports as values: the failed WR, then QP_FATAL (its queues are empty, so no
    // flush); its host sees nothing until they are delivered.
    let reports = a.eng.take_outputs();
    assert!(a.qp.take_send_wcs().is_empty() && a.qp.events().is_empty());
    let kinds: Vec<_> = reports
        .iter()
        .map(|o| match o {
            QpOutput::SendDone { wc, signaled } => format!("send {} {:?} {signaled}", wc.wr_id, wc.status),
            QpOutput::Fatal => "fatal".to_owned(),
            QpOutput::Flush { sends, recvs } => format!("flush {} {}", sends.len(), recvs.len()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["send 9 RetryExcErr true", "fatal"]);
    reports.deliver(&*a.qp);
    let wcs = a.qp.take_send_wcs();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::RetryExcErr));
    assert_eq!(a.qp.events(), vec![AsyncEventKind::QpFatal]);
}

#[test]
fn ud_datagrams_and_q_key_checks_without_a_device() {
    use crate::engine::{UdConfig, UdEngine, UdSource, GRH_LEN};
    use std::net::{IpAddr, Ipv4Addr};
    const QKEY: u32 = 0x1111_2222;
    let ud = |qpn: u32| {
        let qp = PlainQp::new(qpn, QpState::Rts, QpAttr::default());
        let cfg = UdConfig {
            local_qpn: qpn,
            qkey: QKEY,
            pkey: softrdma_wire::roce::DEFAULT_PKEY,
            mtu: 1024,
        };
        let eng = UdEngine::new(qp.clone(), cfg);
        (qp, eng)
    };
    let ((qa, mut ea), (qb, mut eb)) = (ud(0x31), ud(0x32));
    let src = qa.register(1024, Access::LOCAL_WRITE);
    assert!(src.region.write(0, &[0x5a; 1024]));
    let buf = qb.register(2048, Access::LOCAL_WRITE);
    qb.post_recv(RecvWr {
        wr_id: 5,
        sg_list: vec![sge(&buf, 0, 2048)],
    });
    let to_b = |qkey: u32| UdDest {
        ah: AhAttr {
            dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2],
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        },
        remote_qpn: 0x32,
        remote_qkey: qkey,
    };
    let from_a = UdSource {
        src_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        dst_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        hop_limit: 64,
        traffic_class: 0,
    };
    // A datagram with the wrong Q_Key is dropped: no completion, the receive stays posted.
    let mut wrong = signaled(SendWr::send(1, vec![sge(&src, 0, 100)]));
    wrong.ud = Some(to_b(QKEY ^ 1));
    let mut right = signaled(SendWr::send(2, vec![sge(&src, 0, 700)]));
    right.ud = Some(to_b(QKEY));
    qa.post_send(wrong);
    qa.post_send(right);
    let now = Instant::now();
    let mut out = Vec::new();
    let mut sent = 0;
    while ea.poll_transmit(now, &mut out).is_some() {
        eb.handle_packet(now, &RocePacket::parse(&out).expect("a parsable datagram"), &from_a);
        out.clear();
        sent += 1;
    }
    super::deliver_ud(&mut ea);
    super::deliver_ud(&mut eb);
    assert_eq!(sent, 2);
    assert_eq!(
        qa.take_send_wcs()
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)],
        "UD sends complete once sent"
    );
    let r = qb.take_recv_wcs();
    assert_eq!(r.len(), 1, "only the datagram with the right Q_Key arrived");
    assert_eq!(
        (r[0].wr_id, r[0].byte_len as usize, r[0].src_qp),
        (5, GRH_LEN + 700, 0x31)
    );
    let mem = bytes(&buf);
    assert_eq!(&mem[GRH_LEN..GRH_LEN + 700], &[0x5a; 700][..]);
    assert_eq!(eb.stats().rx_delivered, 1);
}

/// `may_transmit` (a blocked caller's receive step asks it, to wake the progress thread only
/// for an engine with something to send): true for a queued WR, unsent packets and an owed
/// ACK or READ response; false once everything went out.
#[test]
fn may_transmit_says_whether_a_flush_would_send_anything() {
    let (mut a, mut b) = pair();
    let now = Instant::now();
    let src = a.qp.register(4096, Access::LOCAL_WRITE);
    let dst = b.qp.register(4096, all());
    assert!(!a.eng.may_transmit() && !b.eng.may_transmit(), "idle engines");

    b.qp.post_recv(RecvWr {
        wr_id: 7,
        sg_list: vec![sge(&dst, 0, 4096)],
    });
    a.qp.post_send(signaled(SendWr::send(1, vec![sge(&src, 0, 3000)])));
    assert!(a.eng.may_transmit(), "a WR waits in the send queue");
    let mut out = Vec::new();
    assert!(a.eng.poll_transmit(now, &mut out), "the first of three packets");
    assert!(a.eng.may_transmit(), "two packets of the SEND are unsent");
    b.eng
        .handle_packet(now, &RocePacket::parse(&out).expect("the packet parses"));
    carry(&mut a.eng, &mut b.eng, now);
    assert!(!a.eng.may_transmit(), "everything sent, only the ACK is awaited");
    assert!(b.eng.may_transmit(), "b owes the ACK");
    carry(&mut b.eng, &mut a.eng, now);
    assert!(!b.eng.may_transmit(), "the ACK went out");
    assert_eq!(b.qp.take_recv_wcs().len(), 1);
    assert_eq!(a.qp.take_send_wcs().len(), 1);

    // A READ: the responder owes the response until it is sent.
    a.qp.post_send(signaled(SendWr::read(
        2,
        vec![sge(&src, 0, 64)],
        dst.region.addr(),
        dst.rkey,
    )));
    carry(&mut a.eng, &mut b.eng, now);
    assert!(b.eng.may_transmit(), "the READ response is owed");
    carry(&mut b.eng, &mut a.eng, now);
    assert!(!b.eng.may_transmit() && !a.eng.may_transmit());
    assert_eq!(a.qp.take_send_wcs().len(), 1);
}
