//! softrdma-cm over soft-RoCE (`rxe_lo`): the rdma_cm carried in IB CM MADs on QP1, end to end
//! on 127.0.0.1 with the real driver. Connect/accept/SEND/disconnect with TIMEWAIT_EXIT, in
//! one process and across two; REJ reasons (consumer reject 28 with private data, nothing
//! listening 8); UNREACHABLE within the configured bound (full backlog, a listener that never
//! answers); a listener killed mid-handshake; EADDRINUSE for a service another process holds;
//! the RoCE private-data limits; RDMA_PS_UDP over SIDR with a UD SEND to the peer's QPN; the
//! QP-less active side (CONNECT_RESPONSE, `init_qp_attr`, `establish`); sync ids; and the
//! loopback rules (LOOPBACK.md R1–R10) where they depend on the transport.
//!
//! Ids choose rxe devices with `CmOption::Transport`, so no test changes this process's
//! environment; tests that need `SOFTRDMA_CONFIG` or `SOFTRDMA_TRANSPORTS`, or a second
//! process, run a `child_*` test of this binary. Every wait is bounded.

use softrdma_cm::{
    roce_limits, CmEvent, CmId, CmOption, CmState, ConnParam, EventChannel, EventType, PortSpace, RDMA_UDP_QKEY,
};
use softrdma_verbs::device::{list_devices, list_interfaces, TransportKind, CONFIG_ENV, TRANSPORTS_ENV};
use softrdma_verbs::{
    Access, Cq, Errno, Error, Mr, Pd, Qp, QpCap, QpInitAttr, QpState, QpType, SendWr, UdDest, WcStatus,
};
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bound on any single expected event.
const WAIT: Duration = Duration::from_secs(5);
/// The IB CM's per-try wait on test ids (also their TIMEWAIT).
const CM_WAIT: Duration = Duration::from_millis(300);
/// Environment variable that marks a child process of this binary.
const CHILD_ENV: &str = "SOFTRDMA_ROCE_CM_CHILD";

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

fn assert_errno<T: std::fmt::Debug>(what: &str, r: softrdma_verbs::Result<T>, errno: Errno) -> Error {
    match r {
        Ok(v) => panic!("{what}: expected {errno}, got {v:?}"),
        Err(e) => {
            assert_eq!(e.errno, errno, "{what}: {e}");
            e
        }
    }
}

/// Runs `f` on a thread; fails if it does not finish within `limit`.
fn bounded<T: Send + 'static>(what: &str, limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: still blocked after {limit:?}"))
}

/// A port free for TCP and UDP on 127.0.0.1 and the wildcard, outside the ephemeral range.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let v: Vec<u16> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let first = (std::process::id() % 5000) as u16;
    for _ in 0..5000 {
        let p = 25000 + (first + NEXT.fetch_add(1, Ordering::Relaxed) % 5000) % 5000;
        if (v[0]..=v[1]).contains(&p) {
            continue;
        }
        if TcpListener::bind(("0.0.0.0", p)).is_ok() && UdpSocket::bind(("0.0.0.0", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port");
}

/// An id restricted to RoCE devices, with short IB CM timers.
fn roce_id(ch: Option<&EventChannel>, ps: PortSpace) -> CmId {
    let id = CmId::create(ch, ps).unwrap();
    id.set_option(CmOption::Transport(Some(TransportKind::Roce))).unwrap();
    id.set_option(CmOption::CmResponseTimeout(CM_WAIT)).unwrap();
    id.set_option(CmOption::CmRetries(3)).unwrap();
    id
}

/// A RoCE listener on `bind` (port 0: the kernel picks), reporting to `ch`.
fn listener_at(ch: Option<&EventChannel>, ps: PortSpace, bind: SocketAddr, backlog: i32) -> (CmId, SocketAddr) {
    let l = roce_id(ch, ps);
    l.bind_addr(bind).unwrap();
    l.listen(backlog).unwrap();
    assert_eq!(l.state(), CmState::Listen);
    let a = l.local_addr().unwrap();
    assert_ne!(a.port(), 0);
    (l, a)
}

fn listener(ch: &EventChannel, ps: PortSpace) -> (CmId, SocketAddr) {
    listener_at(Some(ch), ps, sa("127.0.0.1:0"), 8)
}

/// An async RoCE id with address and route resolved to `dst` (events consumed).
fn resolved(ch: &EventChannel, dst: SocketAddr, ps: PortSpace) -> CmId {
    let id = roce_id(Some(ch), ps);
    id.resolve_addr(None, dst, 2000).unwrap();
    drop(expect(ch, EventType::AddrResolved));
    assert_eq!(id.device().unwrap().transport, TransportKind::Roce);
    id.resolve_route(2000).unwrap();
    drop(expect(ch, EventType::RouteResolved));
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
    let cq = ctx.create_cq(64, None).unwrap();
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 0,
        },
        qp_type,
        sq_sig_all: false,
    };
    let qp = id.create_qp(&pd, init).unwrap();
    let want = if qp_type == QpType::Ud {
        QpState::Rts
    } else {
        QpState::Init
    };
    assert_eq!(qp.state(), want);
    Side { pd, cq, qp }
}

fn teardown(id: CmId, s: Option<Side>) {
    if s.is_some() {
        id.destroy_qp().unwrap();
    }
    bounded("rdma_destroy_id", WAIT, move || id.destroy()).unwrap();
    if let Some(s) = s {
        drop(s.qp);
        s.cq.destroy().unwrap();
        s.pd.dealloc().unwrap();
    }
}

fn destroy(id: CmId) {
    teardown(id, None)
}

fn pdata(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 13 + 5) as u8).collect()
}

fn param(pd: &[u8]) -> ConnParam {
    ConnParam {
        private_data: pd.to_vec(),
        responder_resources: 2,
        initiator_depth: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

/// The first `n` bytes of an event's private data (IB CM fields are reported whole).
fn starts_with(got: &[u8], want: &[u8], field_len: usize) {
    assert_eq!(got.len(), field_len, "the whole field is reported");
    assert_eq!(&got[..want.len()], want);
    assert!(got[want.len()..].iter().all(|&b| b == 0), "zero padded");
}

/// Waits for one successful completion on `cq`.
fn completion(cq: &Cq, what: &str) -> softrdma_verbs::WorkCompletion {
    let wc = cq.wait_for(1, WAIT);
    assert_eq!(wc.len(), 1, "{what}: no completion");
    assert_eq!(wc[0].status, WcStatus::Success, "{what}: {:?}", wc[0]);
    wc[0]
}

/// One SEND from `from` into a receive posted on `to`.
fn send_over(from: &Side, to: &Side, msg: &[u8]) {
    let rbuf: Mr = to.pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    to.qp.post_recv_one(11, rbuf.sge(0, 256)).unwrap();
    let sbuf = from.pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    sbuf.write(0, msg).unwrap();
    from.qp
        .post_send_one(SendWr::send(12, vec![sbuf.sge(0, msg.len() as u32)]))
        .unwrap();
    completion(&from.cq, "send");
    let wc = completion(&to.cq, "receive");
    assert_eq!(wc.byte_len as usize, msg.len());
    assert_eq!(&rbuf.to_vec()[..msg.len()], msg);
}

/// Client and server connected over rxe_lo, ESTABLISHED events consumed.
struct Pair {
    chc: EventChannel,
    chs: EventChannel,
    l: CmId,
    c: CmId,
    cs: Side,
    s: CmId,
    ss: Side,
}

fn connected() -> Pair {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(&chs, PortSpace::Tcp);
    let c = resolved(&chc, addr, PortSpace::Tcp);
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"c")).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s, QpType::Rc);
    s.accept(Some(&param(b"s"))).unwrap();
    drop(expect(&chc, EventType::Established));
    drop(expect(&chs, EventType::Established));
    Pair {
        chc,
        chs,
        l,
        c,
        cs,
        s,
        ss,
    }
}

#[test]
fn connect_accept_send_disconnect_timewait() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(&chs, PortSpace::Tcp);
    assert_eq!(l.device().unwrap().name, "rxe_lo");
    let c = resolved(&chc, addr, PortSpace::Tcp);
    assert_eq!(c.device().unwrap().name, "rxe_lo");
    let cs = side(&c, QpType::Rc);
    let cparam = ConnParam {
        private_data: b"hello over RoCE".to_vec(),
        responder_resources: 3,
        initiator_depth: 5,
        retry_count: 6,
        rnr_retry_count: 4,
        ..ConnParam::default()
    };
    c.connect(&cparam).unwrap();
    assert_eq!(c.state(), CmState::Connect);
    let local = c.local_addr().unwrap();
    assert_eq!(local.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_ne!(local.port(), 0, "connect gives the id a source port");

    let req = expect(&chs, EventType::ConnectRequest);
    assert_eq!(req.status, 0);
    assert_eq!(req.listen_id.as_ref(), Some(&l));
    assert!(req.ud.is_none());
    starts_with(&req.param.private_data, b"hello over RoCE", roce_limits::CONNECT);
    // The IB CM reports the requester's view mirrored, its QPN and retry counts.
    assert_eq!((req.param.responder_resources, req.param.initiator_depth), (5, 3));
    assert_eq!((req.param.retry_count, req.param.rnr_retry_count), (6, 4));
    assert_eq!(req.param.qp_num, cs.qp.qpn());
    let s = req.id.clone();
    drop(req);
    // The passive side's addresses come from the CMA header.
    assert_eq!(s.state(), CmState::Connect);
    assert_eq!(s.local_addr(), Some(addr));
    assert_eq!(s.peer_addr(), Some(local));
    assert_eq!(s.device().unwrap().name, "rxe_lo");
    let ss = side(&s, QpType::Rc);
    s.accept(Some(&param(b"welcome"))).unwrap();

    let ev = expect(&chc, EventType::Established);
    assert_eq!((ev.status, &ev.id), (0, &c));
    starts_with(&ev.param.private_data, b"welcome", roce_limits::ACCEPT);
    assert_eq!(ev.param.qp_num, ss.qp.qpn());
    assert_eq!((ev.param.responder_resources, ev.param.initiator_depth), (3, 2));
    drop(ev);
    let ev = expect(&chs, EventType::Established);
    assert_eq!((ev.status, &ev.id), (0, &s));
    drop(ev);
    assert_eq!((cs.qp.state(), ss.qp.state()), (QpState::Rts, QpState::Rts));
    let (_, ca, _) = cs.qp.query();
    let (_, sa_, _) = ss.qp.query();
    assert_eq!((ca.dest_qp_num, sa_.dest_qp_num), (ss.qp.qpn(), cs.qp.qpn()));
    assert_eq!(ca.sq_psn, sa_.rq_psn, "the PSNs come from REQ and REP");
    assert_eq!(sa_.sq_psn, ca.rq_psn);
    assert_eq!(ca.path_mtu, 5, "4096 on lo");
    assert_eq!(&ca.ah_attr.dgid[10..], &[0xff, 0xff, 127, 0, 0, 1]);

    send_over(&cs, &ss, b"ping over soft-RoCE");
    send_over(&ss, &cs, b"pong");

    // Disconnect: the server learns at the DREQ, the client at the DREP; TIMEWAIT ends later.
    c.disconnect().unwrap();
    assert_eq!(cs.qp.state(), QpState::Err);
    let ev = expect(&chs, EventType::Disconnected);
    assert_eq!((ev.status, &ev.id), (0, &s));
    drop(ev);
    assert_eq!(s.state(), CmState::Disconnect);
    s.disconnect().unwrap();
    assert_eq!(ss.qp.state(), QpState::Err);
    let ev = expect(&chc, EventType::Disconnected);
    assert_eq!((ev.status, &ev.id), (0, &c));
    drop(ev);
    let t = Instant::now();
    assert_eq!(expect(&chc, EventType::TimewaitExit).id, c);
    assert_eq!(expect(&chs, EventType::TimewaitExit).id, s);
    assert!(t.elapsed() < CM_WAIT + Duration::from_secs(1), "{:?}", t.elapsed());
    c.disconnect().expect("disconnecting twice is a no-op");
    std::thread::sleep(Duration::from_millis(50));
    expect_none(&chc);
    expect_none(&chs);
    teardown(c, Some(cs));
    teardown(s, Some(ss));
    destroy(l);
}

#[test]
fn server_disconnect_and_unanswered_dreq() {
    // The server disconnects first; the client answers.
    let p = connected();
    p.s.disconnect().unwrap();
    assert_eq!(expect(&p.chc, EventType::Disconnected).id, p.c);
    p.c.disconnect().unwrap();
    assert_eq!(expect(&p.chs, EventType::Disconnected).id, p.s);
    drop(expect(&p.chc, EventType::TimewaitExit));
    drop(expect(&p.chs, EventType::TimewaitExit));
    teardown(p.c, Some(p.cs));
    teardown(p.s, Some(p.ss));
    destroy(p.l);

    // Nobody answers the DREQ: DISCONNECTED with -ETIMEDOUT after the retries, then TIMEWAIT.
    let p = connected();
    let t = Instant::now();
    p.c.disconnect().unwrap();
    assert_eq!(expect(&p.chs, EventType::Disconnected).id, p.s);
    let ev = p.chc.get_event(Some(WAIT + WAIT)).unwrap();
    assert_eq!(ev.event, EventType::Disconnected, "{:?}", ev.reason);
    assert_eq!(ev.status, -libc::ETIMEDOUT);
    let took = t.elapsed();
    assert!(
        took >= CM_WAIT * 4 - Duration::from_millis(20),
        "{took:?}: 1 + 3 retries"
    );
    drop(ev);
    drop(expect(&p.chc, EventType::TimewaitExit));
    teardown(p.c, Some(p.cs));
    teardown(p.s, Some(p.ss));
    destroy(p.l);
}

#[test]
fn reject_is_reason_28_with_private_data() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(&chs, PortSpace::Tcp);
    let c = resolved(&chc, addr, PortSpace::Tcp);
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"may I?")).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    s.reject(b"no, go away").unwrap();
    let ev = expect(&chc, EventType::Rejected);
    assert_eq!(ev.id, c);
    assert_eq!(ev.status, 28, "IB REJ reason: consumer defined");
    starts_with(&ev.param.private_data, b"no, go away", roce_limits::REJECT);
    assert!(ev.reason.contains(&addr.to_string()), "{:?}", ev.reason);
    drop(ev);
    assert_eq!(cs.qp.state(), QpState::Err);
    std::thread::sleep(Duration::from_millis(50));
    expect_none(&chc);
    expect_none(&chs);
    assert_errno("accept after reject", s.accept(None), Errno::Inval);
    assert_errno("reject twice", s.reject(b""), Errno::Inval);
    teardown(c, Some(cs));
    destroy(s);
    destroy(l);
}

#[test]
fn r8_nothing_listening_is_rejected_with_reason_8() {
    let ch = EventChannel::new().unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let c = resolved(&ch, addr, PortSpace::Tcp);
    let cs = side(&c, QpType::Rc);
    let t = Instant::now();
    c.connect(&param(b"anyone?")).unwrap();
    let ev = ch
        .get_event(Some(Duration::from_secs(1)))
        .unwrap_or_else(|e| panic!("R8: no event within 1 s: {e}"));
    assert_eq!(ev.event, EventType::Rejected, "{:?}", ev.reason);
    assert_eq!(ev.status, 8, "invalid service ID");
    assert!(ev.reason.contains(&addr.to_string()), "{:?}", ev.reason);
    assert!(t.elapsed() < Duration::from_secs(1));
    drop(ev);
    teardown(c, Some(cs));

    // Synchronous: connect fails with ECONNREFUSED, as librdmacm maps REJECTED.
    let c = roce_id(None, PortSpace::Tcp);
    c.resolve_addr(None, addr, 2000).unwrap();
    c.resolve_route(2000).unwrap();
    let cs = side(&c, QpType::Rc);
    let c2 = c.clone();
    let r = bounded("sync connect", WAIT, move || c2.connect(&param(b"")));
    assert_errno("sync connect to nothing", r, Errno::ConnRefused);
    teardown(c, Some(cs));
}

/// The other side of R8: a listener that appears while the REQ is being retried (within the
/// 500 ms budget) gets it, and the connection completes. The retries are timers of the IB CM
/// on the progress thread: no thread per retry, and none of the CM's own.
#[test]
fn a_listener_that_appears_during_the_retries_gets_the_request() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let c = resolved(&chc, addr, PortSpace::Tcp);
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"late")).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n == "softrdma-cm-ret" || n == "softrdma-ibcm"),
        "threads: {names:?}"
    );
    let (l, _) = listener_at(Some(&chs), PortSpace::Tcp, addr, 8);
    let req = expect(&chs, EventType::ConnectRequest);
    starts_with(&req.param.private_data, b"late", roce_limits::CONNECT);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s, QpType::Rc);
    s.accept(None).unwrap();
    drop(expect(&chs, EventType::Established));
    drop(expect(&chc, EventType::Established));
    c.disconnect().unwrap();
    drop(expect(&chs, EventType::Disconnected));
    s.disconnect().unwrap();
    drop(expect(&chc, EventType::Disconnected));
    teardown(c, Some(cs));
    teardown(s, Some(ss));
    destroy(l);
}

#[test]
fn r9_full_backlog_drops_requests_until_unreachable() {
    let (chs, chc) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener_at(Some(&chs), PortSpace::Tcp, sa("127.0.0.1:0"), 1);
    let c1 = resolved(&chc, addr, PortSpace::Tcp);
    let c1s = side(&c1, QpType::Rc);
    c1.connect(&param(b"first")).unwrap();
    // Wait until the first request is queued (not taken: it fills the backlog of 1).
    let deadline = Instant::now() + WAIT;
    while l.unacked_events() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(l.unacked_events(), 1);

    // A second request is dropped without an answer every time: UNREACHABLE after the retries.
    let ch2 = EventChannel::new().unwrap();
    let c2 = resolved(&ch2, addr, PortSpace::Tcp);
    c2.set_option(CmOption::CmResponseTimeout(Duration::from_millis(100)))
        .unwrap();
    c2.set_option(CmOption::CmRetries(2)).unwrap();
    let c2s = side(&c2, QpType::Rc);
    let t = Instant::now();
    c2.connect(&param(b"second")).unwrap();
    let ev = ch2.get_event(Some(WAIT)).unwrap();
    let took = t.elapsed();
    assert_eq!(ev.event, EventType::Unreachable, "{:?}", ev.reason);
    assert_eq!(ev.status, -libc::ETIMEDOUT);
    assert!(ev.reason.contains(&addr.to_string()), "{:?}", ev.reason);
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(1500),
        "3 tries of 100 ms: {took:?}"
    );
    drop(ev);
    teardown(c2, Some(c2s));

    // ConnectTimeout bounds the whole setup whatever the retries.
    let ch3 = EventChannel::new().unwrap();
    let c3 = resolved(&ch3, addr, PortSpace::Tcp);
    c3.set_option(CmOption::CmRetries(15)).unwrap();
    c3.set_option(CmOption::ConnectTimeout(Duration::from_millis(500)))
        .unwrap();
    let c3s = side(&c3, QpType::Rc);
    let t = Instant::now();
    c3.connect(&param(b"third")).unwrap();
    let ev = ch3.get_event(Some(WAIT)).unwrap();
    assert_eq!((ev.event, ev.status), (EventType::Unreachable, -libc::ETIMEDOUT));
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(490) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    drop(ev);
    teardown(c3, Some(c3s));

    // Once the queued request is taken, a retransmitted REQ gets through.
    let ch4 = EventChannel::new().unwrap();
    let c4 = resolved(&ch4, addr, PortSpace::Tcp);
    c4.set_option(CmOption::CmResponseTimeout(Duration::from_millis(100)))
        .unwrap();
    c4.set_option(CmOption::CmRetries(15)).unwrap();
    let c4s = side(&c4, QpType::Rc);
    c4.connect(&param(b"fourth")).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let first = expect(&chs, EventType::ConnectRequest);
    starts_with(&first.param.private_data, b"first", roce_limits::CONNECT);
    let s1 = first.id.clone();
    drop(first);
    let second = expect(&chs, EventType::ConnectRequest);
    starts_with(&second.param.private_data, b"fourth", roce_limits::CONNECT);
    let s4 = second.id.clone();
    drop(second);
    expect_none(&chs);
    for (s, c, ch) in [(s1, c1, &chc), (s4, c4, &ch4)] {
        s.reject(b"").unwrap();
        assert_eq!(expect(ch, EventType::Rejected).status, 28);
        destroy(s);
        destroy(c);
    }
    drop((c1s, c4s));
    destroy(l);
}

#[test]
fn private_data_limits() {
    assert_eq!(
        (roce_limits::CONNECT, roce_limits::ACCEPT, roce_limits::REJECT),
        (56, 196, 148)
    );
    assert_eq!((roce_limits::UD_CONNECT, roce_limits::UD_ACCEPT), (180, 136));
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(&chs, PortSpace::Tcp);
    let c = resolved(&chc, addr, PortSpace::Tcp);
    let cs = side(&c, QpType::Rc);
    let e = assert_errno("connect 57", c.connect(&param(&pdata(57))), Errno::Inval);
    assert!(e.msg.contains("57") && e.msg.contains("56"), "{e}");
    assert_eq!(c.state(), CmState::RouteResolved, "a refused connect changes nothing");
    c.connect(&param(&pdata(56))).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    assert_eq!(req.param.private_data, pdata(56));
    let s = req.id.clone();
    drop(req);
    let ss = side(&s, QpType::Rc);
    let e = assert_errno("accept 197", s.accept(Some(&param(&pdata(197)))), Errno::Inval);
    assert!(e.msg.contains("197") && e.msg.contains("196"), "{e}");
    let e = assert_errno("reject 149", s.reject(&pdata(149)), Errno::Inval);
    assert!(e.msg.contains("149") && e.msg.contains("148"), "{e}");
    // The request is still there to accept, with the full 196 bytes.
    s.accept(Some(&param(&pdata(196)))).unwrap();
    drop(expect(&chs, EventType::Established));
    let ev = expect(&chc, EventType::Established);
    assert_eq!(ev.param.private_data, pdata(196));
    drop(ev);
    let p = Pair {
        chc,
        chs,
        l,
        c,
        cs,
        s,
        ss,
    };
    p.c.disconnect().unwrap();
    drop(expect(&p.chs, EventType::Disconnected));
    p.s.disconnect().unwrap();
    drop(expect(&p.chc, EventType::Disconnected));
    teardown(p.c, Some(p.cs));
    teardown(p.s, Some(p.ss));
    destroy(p.l);
}

#[test]
fn udp_port_space_over_sidr() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(&chs, PortSpace::Udp);
    let c = resolved(&chc, addr, PortSpace::Udp);
    let cs = side(&c, QpType::Ud);
    c.connect(&ConnParam {
        private_data: b"ud hello".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    assert!(req.ud.is_some(), "UD requests fill param.ud");
    starts_with(&req.param.private_data, b"ud hello", roce_limits::UD_CONNECT);
    let s = req.id.clone();
    drop(req);
    assert_eq!(s.port_space(), PortSpace::Udp);
    assert_eq!(s.peer_addr(), c.local_addr());
    let ss = side(&s, QpType::Ud);
    assert_errno(
        "accept 137",
        s.accept(Some(&ConnParam {
            private_data: pdata(137),
            ..ConnParam::default()
        })),
        Errno::Inval,
    );
    s.accept(Some(&ConnParam {
        private_data: b"ud welcome".to_vec(),
        ..ConnParam::default()
    }))
    .unwrap();
    let ev = expect(&chc, EventType::Established);
    assert_eq!(ev.status, 0);
    let ud = ev.ud.expect("ESTABLISHED of a UD id carries param.ud");
    assert_eq!(ud.qp_num, ss.qp.qpn());
    assert_eq!(ud.qkey, RDMA_UDP_QKEY);
    assert!(ud.ah_attr.is_global);
    assert_eq!(&ud.ah_attr.dgid[10..], &[0xff, 0xff, 127, 0, 0, 1]);
    starts_with(&ev.param.private_data, b"ud welcome", roce_limits::UD_ACCEPT);
    drop(ev);
    // No ESTABLISHED on the passive UD side (as the kernel).
    std::thread::sleep(Duration::from_millis(50));
    expect_none(&chs);

    // A UD SEND with what the event said.
    let rbuf = ss.pd.alloc_mr(256 + 40, Access::LOCAL_WRITE).unwrap();
    ss.qp.post_recv_one(1, rbuf.sge(0, 256 + 40)).unwrap();
    let sbuf = cs.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    sbuf.write(0, b"datagram").unwrap();
    let wr = SendWr {
        ud: Some(UdDest {
            ah: ud.ah_attr,
            remote_qpn: ud.qp_num,
            remote_qkey: ud.qkey,
        }),
        ..SendWr::send(2, vec![sbuf.sge(0, 8)])
    };
    cs.qp.post_send_one(wr).unwrap();
    completion(&cs.cq, "UD send");
    let wc = completion(&ss.cq, "UD receive");
    assert_eq!(wc.byte_len, 40 + 8);
    assert_eq!(wc.src_qp, cs.qp.qpn());
    assert_eq!(&rbuf.to_vec()[40..48], b"datagram");
    assert_errno("disconnect a UD id", c.disconnect(), Errno::Inval);
    drop((rbuf, sbuf));
    teardown(c, Some(cs));
    teardown(s, Some(ss));

    // Reject: UNREACHABLE with SIDR status 2 (REJECT) and the private data.
    let c = resolved(&chc, addr, PortSpace::Udp);
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    s.reject(b"not you").unwrap();
    let ev = expect(&chc, EventType::Unreachable);
    assert_eq!(ev.status, 2, "SIDR status REJECT");
    starts_with(&ev.param.private_data, b"not you", roce_limits::UD_ACCEPT);
    drop(ev);
    destroy(c);
    destroy(s);
    destroy(l);

    // Nothing listening: the driver answers SIDR status UNSUPPORTED (1).
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let c = resolved(&chc, addr, PortSpace::Udp);
    c.connect(&ConnParam::default()).unwrap();
    let ev = expect(&chc, EventType::Unreachable);
    assert_eq!(ev.status, 1, "{:?}", ev.reason);
    drop(ev);
    destroy(c);
}

#[test]
fn udp_ids_need_a_roce_device() {
    let id = CmId::create(None, PortSpace::Udp).unwrap();
    id.set_option(CmOption::Transport(Some(TransportKind::Iwarp))).unwrap();
    assert_errno(
        "bind a UDP id to iWARP",
        id.bind_addr(sa("127.0.0.1:0")),
        Errno::OpNotSupp,
    );
    destroy(id);
    // Without a restriction a UDP id lands on a RoCE device.
    let id = CmId::create(None, PortSpace::Udp).unwrap();
    id.bind_addr(sa("127.0.0.1:0")).unwrap();
    assert_eq!(id.device().unwrap().transport, TransportKind::Roce);
    destroy(id);
}

#[test]
fn qpless_active_side_gets_connect_response_then_establishes() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(&chs, PortSpace::Tcp);
    let c = resolved(&chc, addr, PortSpace::Tcp);
    // The application's own QP (ibv_create_qp), named in conn_param.qp_num.
    let ctx = c.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let init = QpInitAttr::rc(&cq, 4, 4);
    let qp = softrdma_roce::driver::create_qp(&pd, init).unwrap();
    let (a, m) = c.init_qp_attr(QpState::Init).unwrap();
    qp.modify(&a, m).unwrap();
    assert!(c.init_qp_attr(QpState::Rtr).is_err(), "RTR needs the REP");
    c.connect(&ConnParam {
        qp_num: qp.qpn(),
        ..param(b"no QP on the id")
    })
    .unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    assert_eq!(req.param.qp_num, qp.qpn());
    let s = req.id.clone();
    drop(req);
    let ss = side(&s, QpType::Rc);
    s.accept(Some(&param(b"ok"))).unwrap();
    let ev = expect(&chc, EventType::ConnectResponse);
    assert_eq!(ev.param.qp_num, ss.qp.qpn());
    starts_with(&ev.param.private_data, b"ok", roce_limits::ACCEPT);
    drop(ev);
    // The application moves its QP with rdma_init_qp_attr, then establishes.
    for st in [QpState::Rtr, QpState::Rts] {
        let (a, m) = c.init_qp_attr(st).unwrap();
        qp.modify(&a, m).unwrap();
    }
    c.establish().unwrap();
    drop(expect(&chs, EventType::Established));
    assert_errno("establish twice", c.establish(), Errno::Inval);
    let me = Side { pd, cq, qp: qp.clone() };
    send_over(&me, &ss, b"from a self-made QP");
    c.disconnect().unwrap();
    drop(expect(&chs, EventType::Disconnected));
    s.disconnect().unwrap();
    drop(expect(&chc, EventType::Disconnected));
    teardown(s, Some(ss));
    destroy(c);
    drop(me.qp);
    qp.destroy().unwrap();
    me.cq.destroy().unwrap();
    me.pd.dealloc().unwrap();
    destroy(l);
}

#[test]
fn sync_ids_block_and_take_requests() {
    let l = roce_id(None, PortSpace::Tcp);
    l.bind_addr(sa("127.0.0.1:0")).unwrap();
    l.listen(4).unwrap();
    let addr = l.local_addr().unwrap();
    let l2 = l.clone();
    let server = std::thread::spawn(move || {
        let s = l2.get_request(Some(WAIT)).unwrap();
        let ss = side(&s, QpType::Rc);
        assert_eq!(s.request_param().unwrap().private_data.len(), roce_limits::CONNECT);
        s.accept(None).unwrap();
        (s, ss)
    });
    let c = roce_id(None, PortSpace::Tcp);
    c.resolve_addr(None, addr, 2000).unwrap();
    c.resolve_route(2000).unwrap();
    let cs = side(&c, QpType::Rc);
    let c2 = c.clone();
    bounded("sync connect", WAIT, move || c2.connect(&param(b"sync"))).unwrap();
    let (s, ss) = server.join().unwrap();
    assert_eq!((cs.qp.state(), ss.qp.state()), (QpState::Rts, QpState::Rts));
    send_over(&cs, &ss, b"sync data");
    let s2 = s.clone();
    let t = std::thread::spawn(move || {
        // The passive side waits for the DREQ, then answers.
        let deadline = Instant::now() + WAIT;
        while s2.state() != CmState::Disconnect && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        s2.disconnect().unwrap();
    });
    let c2 = c.clone();
    bounded("sync disconnect", WAIT, move || c2.disconnect()).unwrap();
    t.join().unwrap();
    teardown(c, Some(cs));
    teardown(s, Some(ss));
    destroy(l);
}

#[test]
fn destroying_a_listener_rejects_undelivered_requests() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(&chs, PortSpace::Tcp);
    let c = resolved(&chc, addr, PortSpace::Tcp);
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"")).unwrap();
    let deadline = Instant::now() + WAIT;
    while l.unacked_events() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    destroy(l);
    let ev = expect(&chc, EventType::Rejected);
    assert_eq!(ev.status, 28);
    drop(ev);
    expect_none(&chs);
    teardown(c, Some(cs));
}

// ---- Loopback rules on RoCE (LOOPBACK.md).

#[test]
fn r1_r5_r7_loopback_range_resolves_to_rxe_lo_and_connects() {
    assert!(softrdma_cm::addr::is_loopback("127.1.2.3".parse().unwrap()));
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, bound) = listener_at(Some(&chs), PortSpace::Tcp, sa("0.0.0.0:0"), 8);
    let dst = SocketAddr::from(([127, 1, 2, 3], bound.port()));
    let c = resolved(&chc, dst, PortSpace::Tcp);
    assert_eq!(c.device().unwrap().name, "rxe_lo", "R5: the device on lo");
    assert_eq!(c.state(), CmState::RouteResolved, "R7");
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"")).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    assert_eq!(s.local_addr(), Some(dst), "the CMA header's destination");
    let ss = side(&s, QpType::Rc);
    s.accept(None).unwrap();
    drop(expect(&chc, EventType::Established));
    drop(expect(&chs, EventType::Established));
    send_over(&cs, &ss, b"R1");
    teardown(c, Some(cs));
    // The client's destroy sent a DREQ.
    drop(expect(&chs, EventType::Disconnected));
    teardown(s, Some(ss));
    destroy(l);
}

#[test]
fn r2_rxe_devices_report_loopback() {
    let devs = list_devices().unwrap();
    let lo = devs
        .iter()
        .find(|d| d.name == "rxe_lo")
        .expect("rxe_lo in the default list");
    assert!(lo.loopback && lo.loopback_reason.is_none());
    assert_eq!(lo.transport, TransportKind::Roce);
}

/// The host's first non-loopback IPv4 address on an UP interface, if any.
fn own_ipv4() -> Option<Ipv4Addr> {
    list_interfaces().ok()?.into_iter().find_map(|i| {
        if i.flags.loopback || !i.flags.up {
            return None;
        }
        i.addrs.iter().find_map(|a| match a.ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
    })
}

#[test]
fn r4_loopback_listener_hears_only_its_address_r6_own_ip_connects() {
    let Some(own) = own_ipv4() else {
        eprintln!("skipped: no non-loopback IPv4 address");
        return;
    };
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(&chs, PortSpace::Tcp);
    // R4 (socket semantics): a request to another local address on that port finds no listener.
    let other = SocketAddr::new(IpAddr::V4(own), addr.port());
    let c = resolved(&chc, other, PortSpace::Tcp);
    assert_ne!(c.device().unwrap().name, "rxe_lo", "R6: the device of the address");
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"")).unwrap();
    let ev = expect(&chc, EventType::Rejected);
    assert_eq!(ev.status, 8);
    drop(ev);
    expect_none(&chs);
    teardown(c, Some(cs));
    destroy(l);
    // R6: a wildcard listener serves the host's own address over its RoCE device.
    let (l, bound) = listener_at(Some(&chs), PortSpace::Tcp, sa("0.0.0.0:0"), 8);
    let dst = SocketAddr::new(IpAddr::V4(own), bound.port());
    let c = resolved(&chc, dst, PortSpace::Tcp);
    let dev = c.device().unwrap();
    assert!(dev.owns_ip(IpAddr::V4(own)));
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"")).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    assert_eq!(s.device().unwrap().name, dev.name);
    assert_eq!(s.local_addr(), Some(dst));
    let ss = side(&s, QpType::Rc);
    s.accept(None).unwrap();
    drop(expect(&chc, EventType::Established));
    drop(expect(&chs, EventType::Established));
    send_over(&cs, &ss, b"R6");
    teardown(c, Some(cs));
    drop(expect(&chs, EventType::Disconnected));
    teardown(s, Some(ss));
    destroy(l);
}

#[test]
fn r10_wildcard_listener_serves_iwarp_and_roce() {
    let ch = EventChannel::new().unwrap();
    let l = CmId::create(Some(&ch), PortSpace::Tcp).unwrap();
    l.bind_addr(sa("0.0.0.0:0")).unwrap();
    l.listen(8).unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], l.local_addr().unwrap().port()));
    let mut clients = Vec::new();
    for t in [TransportKind::Iwarp, TransportKind::Roce] {
        let chc = EventChannel::new().unwrap();
        let c = CmId::create(Some(&chc), PortSpace::Tcp).unwrap();
        c.set_option(CmOption::Transport(Some(t))).unwrap();
        c.resolve_addr(None, dst, 2000).unwrap();
        drop(expect(&chc, EventType::AddrResolved));
        c.resolve_route(2000).unwrap();
        drop(expect(&chc, EventType::RouteResolved));
        assert_eq!(c.device().unwrap().transport, t);
        let cs = side(&c, QpType::Rc);
        c.connect(&param(b"")).unwrap();
        let req = expect(&ch, EventType::ConnectRequest);
        let s = req.id.clone();
        drop(req);
        assert_eq!(s.device().unwrap().transport, t, "the request came over {t}");
        let ss = side(&s, QpType::Rc);
        s.accept(None).unwrap();
        drop(expect(&chc, EventType::Established));
        drop(expect(&ch, EventType::Established));
        send_over(&cs, &ss, t.as_str().as_bytes());
        clients.push((c, cs, s, ss));
    }
    for (c, cs, s, ss) in clients {
        teardown(c, Some(cs));
        teardown(s, Some(ss));
    }
    destroy(l);
}

// ---- Two processes: a child copy of this binary runs one `child_*` test.

/// Starts the ignored test `name` in a child with `env`; its stdout is read line by line.
fn spawn_child(name: &str, env: &[(&str, &str)]) -> (Child, mpsc::Receiver<String>) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env(CHILD_ENV, "1")
        .env_remove(CONFIG_ENV)
        .env_remove(TRANSPORTS_ENV);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// The value after `key ` in the child's next lines.
fn child_says(rx: &mpsc::Receiver<String>, key: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the child never said {key}"));
        // libtest prints "test <name> ... " before the child's own output on the same line.
        if let Some(v) = line.split(&format!("{key} ")).nth(1) {
            return v.trim().to_string();
        }
    }
}

/// Waits (bounded) for the child and asserts its test passed.
fn child_passed(mut child: Child, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {name} did not finish within 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut errs = String::new();
    child.stderr.take().unwrap().read_to_string(&mut errs).unwrap();
    assert!(status.success(), "child {name} failed ({status}):\n{errs}");
}

fn in_child() -> bool {
    let yes = std::env::var_os(CHILD_ENV).is_some();
    if !yes {
        eprintln!("skipped: runs as a child of the test that needs it");
    }
    yes
}

#[test]
fn two_processes_connect_send_disconnect() {
    let name = "child_roce_server";
    let (child, rx) = spawn_child(name, &[]);
    let port: u16 = child_says(&rx, "PORT").parse().unwrap();
    let ch = EventChannel::new().unwrap();
    let c = resolved(&ch, SocketAddr::from(([127, 0, 0, 1], port)), PortSpace::Tcp);
    let cs = side(&c, QpType::Rc);
    let rbuf = cs.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    cs.qp.post_recv_one(1, rbuf.sge(0, 64)).unwrap();
    c.connect(&param(b"from the parent")).unwrap();
    let ev = expect(&ch, EventType::Established);
    starts_with(&ev.param.private_data, b"from the child", roce_limits::ACCEPT);
    drop(ev);
    let sbuf = cs.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    sbuf.write(0, b"ping").unwrap();
    cs.qp.post_send_one(SendWr::send(2, vec![sbuf.sge(0, 4)])).unwrap();
    // The child answers "pong" to our SEND; completions may come in either order.
    let wcs = cs.cq.wait_for(2, WAIT);
    assert_eq!(wcs.len(), 2, "{wcs:?}");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(&rbuf.to_vec()[..4], b"pong");
    c.disconnect().unwrap();
    drop(expect(&ch, EventType::Disconnected));
    drop(expect(&ch, EventType::TimewaitExit));
    drop((rbuf, sbuf));
    teardown(c, Some(cs));
    child_passed(child, name);
}

#[test]
#[ignore = "runs as a child of two_processes_connect_send_disconnect"]
fn child_roce_server() {
    if !in_child() {
        return;
    }
    let ch = EventChannel::new().unwrap();
    let (l, addr) = listener(&ch, PortSpace::Tcp);
    println!("PORT {}", addr.port());
    let req = expect(&ch, EventType::ConnectRequest);
    starts_with(&req.param.private_data, b"from the parent", roce_limits::CONNECT);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s, QpType::Rc);
    let rbuf = ss.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    ss.qp.post_recv_one(1, rbuf.sge(0, 64)).unwrap();
    s.accept(Some(&param(b"from the child"))).unwrap();
    drop(expect(&ch, EventType::Established));
    let wc = completion(&ss.cq, "receive in the child");
    assert_eq!(wc.byte_len, 4);
    assert_eq!(&rbuf.to_vec()[..4], b"ping");
    let sbuf = ss.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    sbuf.write(0, b"pong").unwrap();
    ss.qp.post_send_one(SendWr::send(2, vec![sbuf.sge(0, 4)])).unwrap();
    completion(&ss.cq, "send in the child");
    drop(expect(&ch, EventType::Disconnected));
    s.disconnect().unwrap();
    drop(expect(&ch, EventType::TimewaitExit));
    drop((rbuf, sbuf));
    teardown(s, Some(ss));
    destroy(l);
}

/// A peer process killed (SIGKILL: no DREQ, no DREP) while this side has only receives
/// posted: keepalive probes find it gone, the receives flush and DISCONNECTED comes with
/// -ETIMEDOUT, within keepalive (2 s) + timer grid (0.25 s) + 8 × max(ACK timeout (67 ms),
/// keepalive / 2).
#[test]
fn peer_killed_while_only_receives_are_posted() {
    let ch = EventChannel::new().unwrap();
    let (l, addr) = listener(&ch, PortSpace::Tcp);
    // Passive QPs take the listener's ACK timeout: 4.096 µs × 2^14 = 67 ms.
    l.set_option(CmOption::AckTimeout(14)).unwrap();
    let name = "child_roce_client_to_kill";
    let (mut child, rx) = spawn_child(name, &[("SOFTRDMA_TEST_PORT", &addr.port().to_string())]);
    let req = expect(&ch, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s, QpType::Rc);
    let rbuf = ss.pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        ss.qp.post_recv_one(i, rbuf.sge(0, 256)).unwrap();
    }
    s.accept(Some(&param(b"s"))).unwrap();
    drop(expect(&ch, EventType::Established));
    assert_eq!(child_says(&rx, "CONNECTED"), "1");
    // One message first: the connection really carries data.
    let wc = completion(&ss.cq, "the child's SEND");
    assert_eq!((wc.wr_id, wc.byte_len), (0, 5));
    child.kill().unwrap();
    let _ = child.wait();
    let killed = Instant::now();
    let bound = Duration::from_millis(2000 + 250 + 8 * 1000 + 1500);
    let ev = ch
        .get_event(Some(bound + WAIT))
        .expect("DISCONNECTED after the peer was killed");
    let took = killed.elapsed();
    assert_eq!(ev.event, EventType::Disconnected, "{:?}", ev.reason);
    assert_eq!(ev.status, -libc::ETIMEDOUT);
    assert!(ev.reason.contains("stopped answering"), "{}", ev.reason);
    assert!(took <= bound, "DISCONNECTED {took:?} after the kill; bound {bound:?}");
    // Not sooner either: 8 probes, each given a second, so a stalled peer is not taken for dead.
    assert!(
        took >= Duration::from_secs(8),
        "DISCONNECTED only {took:?} after the kill"
    );
    drop(ev);
    let wcs = ss.cq.wait_for(3, WAIT);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(ss.qp.state(), QpState::Err);
    eprintln!("peer killed: DISCONNECTED and 3 receives flushed {took:?} later (bound {bound:?})");
    // The application's usual answer works, and the id goes away cleanly.
    s.disconnect().unwrap();
    drop(rbuf);
    teardown(s, Some(ss));
    destroy(l);
}

#[test]
#[ignore = "runs as a child of peer_killed_while_only_receives_are_posted"]
fn child_roce_client_to_kill() {
    if !in_child() {
        return;
    }
    let port: u16 = std::env::var("SOFTRDMA_TEST_PORT").unwrap().parse().unwrap();
    let ch = EventChannel::new().unwrap();
    let c = resolved(&ch, SocketAddr::from(([127, 0, 0, 1], port)), PortSpace::Tcp);
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"c")).unwrap();
    drop(expect(&ch, EventType::Established));
    let sbuf = cs.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    sbuf.write(0, b"hello").unwrap();
    cs.qp.post_send_one(SendWr::send(1, vec![sbuf.sge(0, 5)])).unwrap();
    completion(&cs.cq, "SEND in the child");
    println!("CONNECTED 1");
    // Waits to be killed.
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn listener_in_another_process_never_answers_then_is_killed() {
    let name = "child_roce_silent_listener";
    let (mut child, rx) = spawn_child(name, &[]);
    let port: u16 = child_says(&rx, "PORT").parse().unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], port));
    // The child takes requests but never answers: UNREACHABLE within the bound.
    let ch = EventChannel::new().unwrap();
    let c = resolved(&ch, dst, PortSpace::Tcp);
    c.set_option(CmOption::CmResponseTimeout(Duration::from_millis(100)))
        .unwrap();
    c.set_option(CmOption::CmRetries(2)).unwrap();
    c.set_option(CmOption::ConnectTimeout(Duration::from_millis(1500)))
        .unwrap();
    let cs = side(&c, QpType::Rc);
    let t = Instant::now();
    c.connect(&param(b"hello?")).unwrap();
    let ev = ch.get_event(Some(WAIT)).unwrap();
    let took = t.elapsed();
    assert_eq!(ev.event, EventType::Unreachable, "{:?}", ev.reason);
    assert_eq!(ev.status, -libc::ETIMEDOUT);
    assert!(
        took >= Duration::from_millis(290) && took <= Duration::from_millis(1700),
        "{took:?}"
    );
    drop(ev);
    teardown(c, Some(cs));
    assert_eq!(child_says(&rx, "REQUEST"), "1");

    // Killed mid-handshake (its request pending): the retransmitted REQ finds no listener.
    let c = resolved(&ch, dst, PortSpace::Tcp);
    c.set_option(CmOption::CmResponseTimeout(Duration::from_millis(200)))
        .unwrap();
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"hello again")).unwrap();
    assert_eq!(child_says(&rx, "REQUEST"), "2");
    child.kill().unwrap();
    let _ = child.wait();
    let ev = ch.get_event(Some(WAIT)).unwrap();
    assert_eq!(ev.event, EventType::Rejected, "{:?}", ev.reason);
    assert_eq!(ev.status, 8, "nobody listens any more");
    drop(ev);
    teardown(c, Some(cs));
}

#[test]
#[ignore = "runs as a child of listener_in_another_process_never_answers_then_is_killed"]
fn child_roce_silent_listener() {
    if !in_child() {
        return;
    }
    let ch = EventChannel::new().unwrap();
    let l = roce_id(Some(&ch), PortSpace::Tcp);
    l.set_option(CmOption::CmResponseTimeout(Duration::from_millis(100)))
        .unwrap();
    l.bind_addr(sa("127.0.0.1:0")).unwrap();
    l.listen(8).unwrap();
    println!("PORT {}", l.local_addr().unwrap().port());
    let mut held = Vec::new();
    for i in 1..=2 {
        let req = ch.get_event(Some(Duration::from_secs(20))).unwrap();
        assert_eq!(req.event, EventType::ConnectRequest);
        println!("REQUEST {i}");
        held.push(req);
    }
    // Killed by the parent.
    std::thread::sleep(Duration::from_secs(20));
}

#[test]
fn service_held_by_another_process_is_eaddrinuse() {
    let name = "child_roce_holder";
    let (child, rx) = spawn_child(name, &[]);
    let port: u16 = child_says(&rx, "PORT").parse().unwrap();
    // Another address on lo, same port: TCP allows the bind, the RoCE service ID is taken.
    let l = roce_id(None, PortSpace::Tcp);
    l.bind_addr(SocketAddr::from(([127, 0, 0, 2], port))).unwrap();
    let e = assert_errno("listen on a held service", l.listen(8), Errno::AddrInUse);
    assert!(e.msg.contains("another process"), "{e}");
    destroy(l);
    // UDP port space: its own service IDs, so the same port is free there.
    let u = roce_id(None, PortSpace::Udp);
    u.bind_addr(SocketAddr::from(([127, 0, 0, 2], port))).unwrap();
    u.listen(8).unwrap();
    destroy(u);
    // The child listens until we hang up its stdin... simply kill it.
    let mut child = child;
    child.kill().unwrap();
    let _ = child.wait();
}

#[test]
#[ignore = "runs as a child of service_held_by_another_process_is_eaddrinuse"]
fn child_roce_holder() {
    if !in_child() {
        return;
    }
    let ch = EventChannel::new().unwrap();
    let (_l, addr) = listener(&ch, PortSpace::Tcp);
    println!("PORT {}", addr.port());
    std::thread::sleep(Duration::from_secs(20));
}

#[test]
fn transports_env_roce_makes_default_ids_use_rxe() {
    let name = "child_transports_roce";
    let (child, _rx) = spawn_child(name, &[(TRANSPORTS_ENV, "roce"), ("SOFTRDMA_CM_TIMEOUT_MS", "250")]);
    child_passed(child, name);
}

#[test]
#[ignore = "runs as a child of transports_env_roce_makes_default_ids_use_rxe"]
fn child_transports_roce() {
    if !in_child() {
        return;
    }
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let l = CmId::create(Some(&chs), PortSpace::Tcp).unwrap();
    l.bind_addr(sa("127.0.0.1:0")).unwrap();
    assert_eq!(l.device().unwrap().name, "rxe_lo");
    l.listen(8).unwrap();
    let addr = l.local_addr().unwrap();
    let c = CmId::create(Some(&chc), PortSpace::Tcp).unwrap();
    c.resolve_addr(None, addr, 2000).unwrap();
    drop(expect(&chc, EventType::AddrResolved));
    assert_eq!(c.device().unwrap().name, "rxe_lo");
    c.resolve_route(2000).unwrap();
    drop(expect(&chc, EventType::RouteResolved));
    let cs = side(&c, QpType::Rc);
    c.connect(&param(b"env")).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s, QpType::Rc);
    s.accept(None).unwrap();
    drop(expect(&chc, EventType::Established));
    drop(expect(&chs, EventType::Established));
    send_over(&cs, &ss, b"SOFTRDMA_TRANSPORTS=roce");
    c.disconnect().unwrap();
    drop(expect(&chs, EventType::Disconnected));
    s.disconnect().unwrap();
    drop(expect(&chc, EventType::Disconnected));
    // SOFTRDMA_CM_TIMEOUT_MS=250 shortens TIMEWAIT.
    let t = Instant::now();
    drop(expect(&chc, EventType::TimewaitExit));
    assert!(t.elapsed() < Duration::from_millis(250 + 400), "{:?}", t.elapsed());
    drop(expect(&chs, EventType::TimewaitExit));
    teardown(c, Some(cs));
    teardown(s, Some(ss));
    destroy(l);
}

#[test]
fn r3_r5_no_loopback_capable_rxe_device_fails_at_once() {
    let name = "child_r3_rxe_without_loopback";
    let path = std::env::temp_dir().join(format!("softrdma-roce-cm-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[[device]]\nname = \"rxe_lo\"\ntransport = \"roce\"\nnetdev = \"lo\"\nloopback = false\n",
    )
    .unwrap();
    let (child, _rx) = spawn_child(name, &[(CONFIG_ENV, path.to_str().unwrap())]);
    child_passed(child, name);
    let _ = std::fs::remove_file(path);
}

#[test]
#[ignore = "runs as a child of r3_r5_no_loopback_capable_rxe_device_fails_at_once"]
fn child_r3_rxe_without_loopback() {
    if !in_child() {
        return;
    }
    let id = CmId::create(None, PortSpace::Tcp).unwrap();
    let t = Instant::now();
    let e = assert_errno("R3 bind", id.bind_addr(sa("127.0.0.1:0")), Errno::AddrNotAvail);
    assert!(e.msg.contains("rxe_lo") && e.msg.contains("127.0.0.1"), "{e}");
    let e = assert_errno(
        "R5 resolve",
        id.resolve_addr(None, sa("127.0.0.1:7000"), 2000),
        Errno::NoDev,
    );
    assert!(e.msg.contains("rxe_lo"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(1));
    destroy(id);
}
