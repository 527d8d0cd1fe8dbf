//! softrdma-cm over soft-RoCE (`rxe_lo`), beyond connections: multicast joins as the kernel
//! does them on RoCE (no SA; MULTICAST_JOIN at once with the group's address vector, QPN
//! 0xFFFFFF and RDMA_UDP_QKEY; the QP attached unless send-only; a datagram to the group
//! reaches the attached QP; leave detaches), the passive side's `init_qp_attr` before
//! `accept`, a connect to this host that finds its listener a moment late, and `flush_mads`.
//!
//! Ids choose rxe devices with `CmOption::Transport`; every wait is bounded.

use softrdma_cm::{
    CmEvent, CmId, CmOption, ConnParam, EventChannel, EventType, PortSpace, MULTICAST_QPN, RDMA_UDP_QKEY,
};
use softrdma_verbs::device::TransportKind;
use softrdma_verbs::{Access, Cq, Errno, Pd, Qp, QpCap, QpInitAttr, QpState, QpType, SendWr, UdDest, WcStatus};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(5);

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn expect(ch: &EventChannel, want: EventType) -> CmEvent {
    let ev = ch
        .get_event(Some(WAIT))
        .unwrap_or_else(|e| panic!("waiting for {want}: {e}"));
    assert_eq!(
        ev.event, want,
        "expected {want}, got {} (status {}, reason {:?})",
        ev.event, ev.status, ev.reason
    );
    ev
}

fn expect_none(ch: &EventChannel) {
    match ch.get_event(Some(Duration::ZERO)) {
        Err(e) => assert_eq!(e.errno, Errno::Again, "{e}"),
        Ok(ev) => panic!("unexpected {} (status {}, {:?})", ev.event, ev.status, ev.reason),
    }
}

fn errno<T: std::fmt::Debug>(what: &str, r: softrdma_verbs::Result<T>) -> Errno {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => e.errno,
    }
}

/// A port free for TCP and UDP on the wildcard, outside the ephemeral range.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let v: Vec<u16> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let first = (std::process::id() % 5000) as u16;
    for _ in 0..5000 {
        let p = 20000 + (first + NEXT.fetch_add(1, Ordering::Relaxed) % 5000) % 5000;
        if (v[0]..=v[1]).contains(&p) {
            continue;
        }
        if TcpListener::bind(("0.0.0.0", p)).is_ok() && UdpSocket::bind(("0.0.0.0", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port");
}

/// A multicast group for this test process and `n` (239.0.0.0/8).
fn group(n: u8) -> Ipv4Addr {
    let p = std::process::id();
    Ipv4Addr::new(239, 77, (p % 251) as u8, n)
}

fn roce_id(ch: Option<&EventChannel>, ps: PortSpace) -> CmId {
    let id = CmId::create(ch, ps).unwrap();
    id.set_option(CmOption::Transport(Some(TransportKind::Roce))).unwrap();
    id.set_option(CmOption::CmResponseTimeout(Duration::from_millis(300)))
        .unwrap();
    id
}

struct Side {
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn side(id: &CmId, qp_type: QpType) -> Side {
    let ctx = id.context().expect("the id has a device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32, None).unwrap();
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type,
        sq_sig_all: false,
    };
    let qp = id.create_qp(&pd, init).unwrap();
    Side { pd, cq, qp }
}

fn teardown(id: CmId, s: Side) {
    id.destroy_qp().unwrap();
    id.destroy().unwrap();
    drop(s.qp);
    s.cq.destroy().unwrap();
    s.pd.dealloc().unwrap();
}

/// A UD id of RDMA_PS_UDP bound to 127.0.0.1 (rxe_lo), with a UD QP.
fn bound_ud(ch: &EventChannel) -> (CmId, Side) {
    let id = roce_id(Some(ch), PortSpace::Udp);
    id.bind_addr(sa("127.0.0.1:0")).unwrap();
    assert_eq!(id.device().unwrap().name, "rxe_lo");
    let s = side(&id, QpType::Ud);
    (id, s)
}

#[test]
fn join_send_to_the_group_and_leave() {
    let g = group(1);
    let gsa = SocketAddr::from((g, 0));
    let (chr, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (r, rs) = bound_ud(&chr);
    let rbuf = rs.pd.alloc_mr(40 + 64, Access::LOCAL_WRITE).unwrap();
    for i in 0..2 {
        rs.qp.post_recv_one(i, rbuf.sge(0, 40 + 64)).unwrap();
    }
    r.join_multicast(gsa, false).unwrap();
    let ev = expect(&chr, EventType::MulticastJoin);
    assert_eq!(ev.status, 0);
    let ud = ev.ud.expect("MULTICAST_JOIN carries param.ud");
    assert_eq!((ud.qp_num, ud.qkey), (MULTICAST_QPN, RDMA_UDP_QKEY));
    assert_eq!(ud.qp_num, 0xFF_FFFF);
    assert!(ud.ah_attr.is_global);
    assert_eq!(ud.ah_attr.dgid, g.to_ipv6_mapped().octets(), "MGID ::ffff:{g}");
    assert_eq!(
        (ud.ah_attr.sgid_index, ud.ah_attr.hop_limit, ud.ah_attr.port_num),
        (0, 64, 1)
    );
    drop(ev);
    assert_eq!(r.multicast_groups(), vec![g]);
    assert_eq!(errno("join twice", r.join_multicast(gsa, false)), Errno::AddrInUse);

    // The sender joins send-only (its QP stays out of the group) and sends with the event's
    // address vector.
    let (s, ss) = bound_ud(&chs);
    s.join_multicast(gsa, true).unwrap();
    let ud = expect(&chs, EventType::MulticastJoin).ud.unwrap();
    let sbuf = ss.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    sbuf.write(0, b"to the group").unwrap();
    let send = |wr_id: u64| SendWr {
        ud: Some(UdDest {
            ah: ud.ah_attr,
            remote_qpn: ud.qp_num,
            remote_qkey: ud.qkey,
        }),
        ..SendWr::send(wr_id, vec![sbuf.sge(0, 12)])
    };
    ss.qp.post_send_one(send(7)).unwrap();
    let wc = rs.cq.wait_for(1, WAIT);
    assert_eq!(wc.len(), 1, "no multicast datagram arrived");
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].byte_len, 40 + 12);
    assert_eq!(wc[0].src_qp, ss.qp.qpn());
    assert_eq!(&rbuf.to_vec()[40..52], b"to the group");

    // Leaving detaches: the next datagram finds nobody.
    assert_eq!(
        errno(
            "leave a group not joined",
            r.leave_multicast(SocketAddr::from((group(2), 0)))
        ),
        Errno::AddrNotAvail
    );
    r.leave_multicast(gsa).unwrap();
    assert!(r.multicast_groups().is_empty());
    ss.qp.post_send_one(send(8)).unwrap();
    assert!(
        rs.cq.wait_for(1, Duration::from_millis(200)).is_empty(),
        "a left group still delivers"
    );
    s.leave_multicast(gsa).unwrap();
    expect_none(&chr);
    expect_none(&chs);
    drop((rbuf, sbuf));
    teardown(r, rs);
    teardown(s, ss);
}

#[test]
fn join_needs_a_bound_ud_id_on_a_roce_device() {
    let g = SocketAddr::from((group(3), 0));
    let ch = EventChannel::new().unwrap();
    // No device yet.
    let id = roce_id(Some(&ch), PortSpace::Udp);
    assert_eq!(errno("join on an idle id", id.join_multicast(g, false)), Errno::Inval);
    id.destroy().unwrap();
    // Not a group.
    let id = roce_id(Some(&ch), PortSpace::Udp);
    id.bind_addr(sa("127.0.0.1:0")).unwrap();
    assert_eq!(
        errno("join a unicast address", id.join_multicast(sa("127.0.0.1:0"), false)),
        Errno::Inval
    );
    assert_eq!(
        errno("join IPv6", id.join_multicast(sa("[ff0e::1]:0"), false)),
        Errno::OpNotSupp
    );
    id.destroy().unwrap();
    // An RC (TCP port space) id on rxe.
    let id = roce_id(Some(&ch), PortSpace::Tcp);
    id.bind_addr(sa("127.0.0.1:0")).unwrap();
    assert_eq!(errno("join on a TCP id", id.join_multicast(g, false)), Errno::Inval);
    id.destroy().unwrap();
    // iWARP has no multicast.
    let id = CmId::create(Some(&ch), PortSpace::Tcp).unwrap();
    id.set_option(CmOption::Transport(Some(TransportKind::Iwarp))).unwrap();
    id.bind_addr(sa("127.0.0.1:0")).unwrap();
    let e = id.join_multicast(g, false).unwrap_err();
    assert_eq!(e.errno, Errno::OpNotSupp, "{e}");
    assert!(e.msg.contains("iWARP"), "{e}");
    id.destroy().unwrap();
    expect_none(&ch);
    // A synchronous id takes its MULTICAST_JOIN inside the call.
    let id = roce_id(None, PortSpace::Udp);
    id.bind_addr(sa("127.0.0.1:0")).unwrap();
    id.join_multicast(g, false).unwrap();
    assert_eq!(id.unacked_events(), 0);
    id.leave_multicast(g).unwrap();
    id.destroy().unwrap();
}

/// Before `accept`, the passive side's `init_qp_attr` mirrors the REQ's resources (as the
/// kernel's CM keeps them), so a QP moved by the application (rping -q) can do RDMA READ.
#[test]
fn passive_init_qp_attr_before_accept_mirrors_the_req() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let l = roce_id(Some(&chs), PortSpace::Tcp);
    l.bind_addr(sa("127.0.0.1:0")).unwrap();
    l.listen(4).unwrap();
    let addr = l.local_addr().unwrap();
    let c = roce_id(Some(&chc), PortSpace::Tcp);
    c.resolve_addr(None, addr, 2000).unwrap();
    drop(expect(&chc, EventType::AddrResolved));
    c.resolve_route(2000).unwrap();
    drop(expect(&chc, EventType::RouteResolved));
    let cs = side(&c, QpType::Rc);
    c.connect(&ConnParam {
        responder_resources: 2,
        initiator_depth: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    })
    .unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    let (rtr, _) = s.init_qp_attr(QpState::Rtr).unwrap();
    let (rts, _) = s.init_qp_attr(QpState::Rts).unwrap();
    assert_eq!(rtr.dest_qp_num, cs.qp.qpn());
    assert_eq!((rtr.max_dest_rd_atomic, rts.max_rd_atomic), (3, 2));
    s.reject(b"").unwrap();
    drop(expect(&chc, EventType::Rejected));
    teardown(c, cs);
    s.destroy().unwrap();
    l.destroy().unwrap();
}

/// A REQ to this host that finds no listener is sent again for a short while before
/// REJECTED: perftest `-R` listens again just before its peer connects.
#[test]
fn connect_to_this_host_waits_briefly_for_its_listener() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let c = roce_id(Some(&chc), PortSpace::Tcp);
    c.resolve_addr(None, addr, 2000).unwrap();
    drop(expect(&chc, EventType::AddrResolved));
    c.resolve_route(2000).unwrap();
    drop(expect(&chc, EventType::RouteResolved));
    let cs = side(&c, QpType::Rc);
    let t = Instant::now();
    c.connect(&ConnParam {
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let l = roce_id(Some(&chs), PortSpace::Tcp);
    l.bind_addr(addr).unwrap();
    l.listen(4).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s, QpType::Rc);
    s.accept(None).unwrap();
    drop(expect(&chc, EventType::Established));
    drop(expect(&chs, EventType::Established));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    c.disconnect().unwrap();
    drop(expect(&chs, EventType::Disconnected));
    s.disconnect().unwrap();
    drop(expect(&chc, EventType::Disconnected));
    teardown(c, cs);
    teardown(s, ss);
    l.destroy().unwrap();
    // What the teardown sent has left the process (the drop-in library waits so at exit).
    let t = Instant::now();
    assert!(softrdma_cm::flush_mads(WAIT));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}
