//! softrdma-cm end to end over 127.0.0.1 with the real API: connect/accept/ESTABLISHED with
//! private data both ways and a SEND, disconnect, rejects, the rdma_cm error and state rules
//! (librdmacm checklist, ../shared/research/rdma_cm.md §2), and the loopback rules that need a
//! live host (LOOPBACK.md R3, R5–R9). Rules that need a `SOFTRDMA_CONFIG` run in a child copy
//! of this binary (`child_*` tests, ignored when run directly), so no test changes this
//! process's environment. Every wait is bounded.

use softrdma_cm::{CmEvent, CmId, CmOption, CmState, ConnParam, EventChannel, EventType, PortSpace, MAX_PRIVATE_DATA};
use softrdma_verbs::device::{list_interfaces, CONFIG_ENV};
use softrdma_verbs::{Access, Cq, Errno, Error, Pd, Qp, QpCap, QpInitAttr, QpState, QpType, SendWr, WcStatus};
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Bound on any single expected event.
const WAIT: Duration = Duration::from_secs(5);

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Runs `f` on a thread and fails the test if it does not finish within `limit`.
fn bounded<T: Send + 'static>(what: &str, limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: still blocked after {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("{what}: thread ended without a result"),
        },
    }
}

/// The next event on `ch`, which must be `want`.
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

/// Asserts that nothing is queued on `ch`.
fn expect_none(ch: &EventChannel) {
    match ch.get_event(Some(Duration::ZERO)) {
        Err(e) => assert_eq!(e.errno, Errno::Again, "{e}"),
        Ok(ev) => panic!("unexpected {} (status {}, {:?})", ev.event, ev.status, ev.reason),
    }
}

fn err<T: std::fmt::Debug>(what: &str, r: softrdma_verbs::Result<T>) -> Error {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => e,
    }
}

fn assert_errno<T: std::fmt::Debug>(what: &str, r: softrdma_verbs::Result<T>, errno: Errno) -> Error {
    let e = err(what, r);
    assert_eq!(e.errno, errno, "{what}: {e}");
    e
}

/// A 127.0.0.1 port nothing listens on. It lies outside the ephemeral range, so no client
/// socket is ever auto-bound to it (which would make a TCP self-connection).
fn free_port() -> u16 {
    use std::sync::atomic::AtomicU16;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let (lo, hi) = local_port_range();
    let start = 20000 + (std::process::id() % 5000) as u16;
    for _ in 0..5000 {
        let p = start + NEXT.fetch_add(1, Ordering::Relaxed) % 5000;
        if (lo..=hi).contains(&p) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", p)).is_ok() && TcpListener::bind(("0.0.0.0", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port outside the ephemeral range {lo}-{hi}");
}

fn new_id(ch: Option<&EventChannel>) -> CmId {
    CmId::create(ch, PortSpace::Tcp).unwrap()
}

/// Verbs objects of one side: PD, CQ and the id's QP.
struct Side {
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn side(id: &CmId) -> Side {
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
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    let qp = id.create_qp(&pd, init).unwrap();
    assert_eq!(qp.state(), QpState::Init);
    Side { pd, cq, qp }
}

/// Destroys the QP (if any), the id (bounded), then the CQ and PD.
fn teardown(id: CmId, side: Option<Side>) {
    if side.is_some() {
        id.destroy_qp().unwrap();
    }
    bounded("rdma_destroy_id", WAIT, move || id.destroy()).unwrap();
    if let Some(s) = side {
        drop(s.qp);
        s.cq.destroy().unwrap();
        s.pd.dealloc().unwrap();
    }
}

fn destroy(id: CmId) {
    teardown(id, None)
}

/// A listener on 127.0.0.1 (port chosen by the kernel) reporting to `ch`.
fn listener(ch: Option<&EventChannel>) -> (CmId, SocketAddr) {
    let l = new_id(ch);
    l.bind_addr(sa("127.0.0.1:0")).unwrap();
    l.listen(8).unwrap();
    assert_eq!(l.state(), CmState::Listen);
    let a = l.local_addr().unwrap();
    assert_ne!(a.port(), 0);
    (l, a)
}

/// An async id with address and route resolved to `dst` (events consumed).
fn resolved(ch: &EventChannel, dst: SocketAddr) -> CmId {
    let id = new_id(Some(ch));
    id.resolve_addr(None, dst, 2000).unwrap();
    let ev = expect(ch, EventType::AddrResolved);
    assert_eq!((ev.status, &ev.id), (0, &id));
    drop(ev);
    id.resolve_route(2000).unwrap();
    let ev = expect(ch, EventType::RouteResolved);
    assert_eq!((ev.status, &ev.id), (0, &id));
    id
}

fn pdata(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + 7) as u8).collect()
}

fn conn_param(private_data: &[u8]) -> ConnParam {
    ConnParam {
        private_data: private_data.to_vec(),
        ..ConnParam::default()
    }
}

/// Client and server connected over 127.0.0.1, ESTABLISHED events consumed.
struct Pair {
    chc: EventChannel,
    chs: EventChannel,
    l: CmId,
    c: CmId,
    cs: Side,
    s: CmId,
    ss: Side,
}

fn connected(cpd: &[u8], spd: &[u8]) -> Pair {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(Some(&chs));
    let c = resolved(&chc, addr);
    let cs = side(&c);
    c.connect(&conn_param(cpd)).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    assert_eq!(req.param.private_data, cpd);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s);
    s.accept(Some(&conn_param(spd))).unwrap();
    let ev = expect(&chs, EventType::Established);
    assert_eq!(ev.id, s);
    let ev = expect(&chc, EventType::Established);
    assert_eq!(ev.id, c);
    assert_eq!(ev.param.private_data, spd);
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

impl Pair {
    /// The server side `s` of client `c` (its CONNECT_REQUEST taken) accepts with no private
    /// data; both ESTABLISHED events are consumed.
    fn accept(chc: EventChannel, chs: EventChannel, l: CmId, c: CmId, cs: Side, s: CmId) -> Pair {
        let ss = side(&s);
        s.accept(None).unwrap();
        drop(expect(&chs, EventType::Established));
        drop(expect(&chc, EventType::Established));
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

    /// Client disconnects; both sides see DISCONNECTED; everything is destroyed.
    fn close(self) {
        self.c.disconnect().unwrap();
        let ev = expect(&self.chc, EventType::Disconnected);
        assert_eq!(ev.id, self.c);
        drop(ev);
        let ev = expect(&self.chs, EventType::Disconnected);
        assert_eq!(ev.id, self.s);
        drop(ev);
        teardown(self.c, Some(self.cs));
        teardown(self.s, Some(self.ss));
        destroy(self.l);
        expect_none(&self.chc);
        expect_none(&self.chs);
    }
}

#[test]
fn connect_accept_private_data_send_disconnect() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(Some(&chs));
    let c = resolved(&chc, addr);
    assert_eq!(c.state(), CmState::RouteResolved);
    assert_eq!(c.peer_addr(), Some(addr));
    assert_eq!(c.dst_port(), addr.port());
    let cs = side(&c);
    let cparam = ConnParam {
        private_data: b"hello from the client".to_vec(),
        responder_resources: 3,
        initiator_depth: 5,
        ..ConnParam::default()
    };
    c.connect(&cparam).unwrap();
    assert_eq!(c.state(), CmState::Connect);

    let req = expect(&chs, EventType::ConnectRequest);
    assert_eq!(req.status, 0);
    assert_eq!(req.listen_id.as_ref(), Some(&l));
    assert_eq!(req.param.private_data, b"hello from the client");
    // The passive side sees the initiator's view mirrored.
    assert_eq!((req.param.responder_resources, req.param.initiator_depth), (5, 3));
    let s = req.id.clone();
    assert_ne!(s, l);
    drop(req);
    assert_eq!(s.state(), CmState::Connect);
    assert_eq!(s.local_addr(), Some(addr));
    assert_eq!(s.peer_addr(), c.local_addr());
    assert_eq!(s.device().unwrap().name, c.device().unwrap().name);
    let ss = side(&s);
    let rbuf = ss.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    ss.qp.post_recv_one(1, rbuf.sge(0, 64)).unwrap();
    s.accept(Some(&conn_param(b"hello from the server"))).unwrap();

    let ev = expect(&chs, EventType::Established);
    assert_eq!((ev.status, &ev.id), (0, &s));
    assert_eq!(ev.param.private_data, b"hello from the client");
    drop(ev);
    let ev = expect(&chc, EventType::Established);
    assert_eq!((ev.status, &ev.id), (0, &c));
    assert_eq!(ev.param.private_data, b"hello from the server");
    drop(ev);
    assert_eq!(cs.qp.state(), QpState::Rts);
    assert_eq!(ss.qp.state(), QpState::Rts);

    // A SEND through the QPs.
    let msg = b"ping over soft-iWARP";
    let sbuf = cs.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    sbuf.write(0, msg).unwrap();
    cs.qp
        .post_send_one(SendWr::send(7, vec![sbuf.sge(0, msg.len() as u32)]))
        .unwrap();
    let wc = cs.cq.wait_for(1, WAIT);
    assert_eq!(wc.len(), 1, "send completion");
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
    let wc = ss.cq.wait_for(1, WAIT);
    assert_eq!(wc.len(), 1, "receive completion");
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    assert_eq!(wc[0].byte_len as usize, msg.len());
    assert_eq!(&rbuf.to_vec()[..msg.len()], msg);

    // Disconnect: both sides see DISCONNECTED, QPs end in ERR.
    c.disconnect().unwrap();
    let ev = expect(&chc, EventType::Disconnected);
    assert_eq!(ev.id, c);
    drop(ev);
    let ev = expect(&chs, EventType::Disconnected);
    assert_eq!(ev.id, s);
    drop(ev);
    assert_eq!(c.state(), CmState::Disconnect);
    assert_eq!(s.state(), CmState::Disconnect);
    let deadline = Instant::now() + WAIT;
    while (cs.qp.state(), ss.qp.state()) != (QpState::Err, QpState::Err) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!((cs.qp.state(), ss.qp.state()), (QpState::Err, QpState::Err));
    // As the kernel: disconnecting an already disconnected id is a no-op that succeeds
    // (tools call rdma_disconnect when they see DISCONNECTED), and posts no second event.
    c.disconnect().expect("second disconnect");
    s.disconnect().expect("disconnect after the peer's");
    // Exactly one DISCONNECTED per side.
    std::thread::sleep(Duration::from_millis(50));
    expect_none(&chc);
    expect_none(&chs);

    drop((sbuf, rbuf));
    teardown(c, Some(cs));
    teardown(s, Some(ss));
    destroy(l);
}

#[test]
fn server_disconnect_reaches_the_client() {
    let p = connected(b"", b"");
    p.s.disconnect().unwrap();
    assert_eq!(expect(&p.chs, EventType::Disconnected).id, p.s);
    assert_eq!(expect(&p.chc, EventType::Disconnected).id, p.c);
    teardown(p.c, Some(p.cs));
    teardown(p.s, Some(p.ss));
    destroy(p.l);
}

#[test]
fn reject_carries_private_data_and_econnrefused() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(Some(&chs));
    let c = resolved(&chc, addr);
    let cs = side(&c);
    c.connect(&conn_param(b"may I?")).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    s.reject(b"no, go away").unwrap();
    let ev = expect(&chc, EventType::Rejected);
    assert_eq!(ev.id, c);
    assert_eq!(ev.status, -libc::ECONNREFUSED);
    assert_eq!(ev.status, -111);
    assert_eq!(ev.param.private_data, b"no, go away");
    drop(ev);
    // Nothing else happens on either side.
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
fn r8_no_listener_is_rejected_promptly() {
    let ch = EventChannel::new().unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let c = resolved(&ch, addr);
    let cs = side(&c);
    let t = Instant::now();
    c.connect(&conn_param(b"anyone?")).unwrap();
    let ev = ch
        .get_event(Some(Duration::from_secs(1)))
        .unwrap_or_else(|e| panic!("R8: no event within 1 s: {e}"));
    let took = t.elapsed();
    assert_eq!(ev.event, EventType::Rejected, "{:?}", ev.reason);
    assert_eq!(ev.status, -libc::ECONNREFUSED);
    assert!(ev.param.private_data.is_empty());
    assert!(
        ev.reason.contains(&addr.to_string()),
        "reason names the address: {:?}",
        ev.reason
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    drop(ev);
    teardown(c, Some(cs));
}

/// The other side of R8: a listener that appears while the connect is being retried (within
/// the 500 ms budget; perftest `-R` re-listens just while its client connects) gets the
/// request, and the connection completes. The retries are timers of the progress thread.
#[test]
fn a_listener_that_appears_during_the_retries_gets_the_request() {
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let c = resolved(&chc, addr);
    let cs = side(&c);
    c.connect(&conn_param(b"late")).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let tasks = |name: &str| {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
            .count()
    };
    assert_eq!(tasks("softrdma-cm-ret"), 0, "no thread per retry");
    let l = new_id(Some(&chs));
    l.bind_addr(addr).unwrap();
    l.listen(8).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    assert_eq!(req.param.private_data, b"late");
    let s = req.id.clone();
    drop(req);
    Pair::accept(chc, chs, l, c, cs, s).close();
}

#[test]
fn private_data_limit_is_256() {
    assert_eq!(MAX_PRIVATE_DATA, 256);
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(Some(&chs));
    let c = resolved(&chc, addr);
    let cs = side(&c);
    let e = assert_errno("connect 257", c.connect(&conn_param(&pdata(257))), Errno::Inval);
    assert!(e.msg.contains("257") && e.msg.contains("256"), "{e}");
    assert_eq!(
        c.state(),
        CmState::RouteResolved,
        "a refused connect leaves the id as it was"
    );
    c.connect(&conn_param(&pdata(256))).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    assert_eq!(req.param.private_data, pdata(256));
    let s = req.id.clone();
    drop(req);
    let ss = side(&s);
    let e = assert_errno("accept 257", s.accept(Some(&conn_param(&pdata(257)))), Errno::Inval);
    assert!(e.msg.contains("257") && e.msg.contains("256"), "{e}");
    let e = assert_errno("reject 257", s.reject(&pdata(257)), Errno::Inval);
    assert!(e.msg.contains("257") && e.msg.contains("256"), "{e}");
    // The request is still there to accept, with the full 256 bytes.
    s.accept(Some(&conn_param(&pdata(256)))).unwrap();
    drop(expect(&chs, EventType::Established));
    let ev = expect(&chc, EventType::Established);
    assert_eq!(ev.param.private_data, pdata(256));
    drop(ev);
    Pair {
        chc,
        chs,
        l,
        c,
        cs,
        s,
        ss,
    }
    .close();
}

#[test]
fn sync_ids_block_and_return_errors_directly() {
    // A synchronous listener and a synchronous client.
    let (l, addr) = listener(None);
    let client = bounded("sync client connect", WAIT, move || {
        let c = new_id(None);
        c.resolve_addr(None, addr, 2000)?;
        assert_eq!(c.state(), CmState::AddrResolved);
        c.resolve_route(2000)?;
        assert_eq!(c.state(), CmState::RouteResolved);
        let cs = side(&c);
        let (tx, rx) = mpsc::channel();
        let c2 = c.clone();
        std::thread::spawn(move || {
            let _ = tx.send(c2.connect(&conn_param(b"sync hello")));
        });
        Ok::<_, Error>((c, cs, rx))
    })
    .unwrap();
    let l2 = l.clone();
    let s = bounded("get_request", WAIT, move || l2.get_request(Some(WAIT))).unwrap();
    assert_eq!(s.state(), CmState::Connect);
    let ss = side(&s);
    let s2 = s.clone();
    bounded("sync accept", WAIT, move || {
        s2.accept(Some(&conn_param(b"sync welcome")))
    })
    .unwrap();
    let (c, cs, rx) = client;
    rx.recv_timeout(WAIT).expect("sync connect returns").unwrap();
    assert_eq!(c.state(), CmState::Connect);
    assert_eq!(cs.qp.state(), QpState::Rts);
    let c2 = c.clone();
    bounded("sync disconnect", WAIT, move || c2.disconnect()).unwrap();
    assert_eq!(c.state(), CmState::Disconnect);
    assert_eq!(c.unacked_events(), 0, "sync calls consume their events");
    // get_request times out with EAGAIN when nobody connects.
    let t = Instant::now();
    let e = assert_errno(
        "get_request with nothing pending",
        l.get_request(Some(Duration::from_millis(100))),
        Errno::Again,
    );
    assert!(t.elapsed() < Duration::from_secs(1), "{e}");
    teardown(c, Some(cs));
    teardown(s, Some(ss));
    destroy(l);

    // Errors come back from the call itself.
    let c = new_id(None);
    assert_errno("sync resolve_route(0)", c.resolve_route(0), Errno::Inval);
    let dst = SocketAddr::from(([127, 0, 0, 1], free_port()));
    c.resolve_addr(None, dst, 2000).unwrap();
    assert_errno("sync resolve_route(0)", c.resolve_route(0), Errno::Inval);
    c.resolve_route(2000).unwrap();
    let cs = side(&c);
    let c2 = c.clone();
    let t = Instant::now();
    let e = bounded("sync connect to nothing", WAIT, move || c2.connect(&conn_param(b"")));
    let e = assert_errno("sync connect to nothing", e, Errno::ConnRefused);
    assert!(t.elapsed() < Duration::from_secs(1), "{e}");
    assert!(e.msg.contains(&dst.to_string()), "{e}");
    assert_eq!(c.unacked_events(), 0);
    teardown(c, Some(cs));
    // A sync id cannot take requests unless it listens; an async one never can.
    let ch = EventChannel::new().unwrap();
    let (al, _) = listener(Some(&ch));
    assert_errno(
        "get_request on async listener",
        al.get_request(Some(WAIT)),
        Errno::Inval,
    );
    let idle = new_id(None);
    assert_errno("get_request on idle id", idle.get_request(Some(WAIT)), Errno::Inval);
    destroy(al);
    destroy(idle);
}

#[test]
fn resolve_route_zero_timeout_is_einval() {
    let ch = EventChannel::new().unwrap();
    let id = new_id(Some(&ch));
    id.resolve_addr(None, sa("127.0.0.1:7471"), 2000).unwrap();
    drop(expect(&ch, EventType::AddrResolved));
    for t in [0, -1] {
        let e = assert_errno("resolve_route", id.resolve_route(t), Errno::Inval);
        assert!(e.msg.contains("timeout"), "{e}");
        assert_eq!(id.state(), CmState::AddrResolved);
    }
    expect_none(&ch);
    id.resolve_route(1).unwrap();
    drop(expect(&ch, EventType::RouteResolved));
    destroy(id);
}

#[test]
fn wrong_state_calls_are_einval() {
    let ch = EventChannel::new().unwrap();
    // IDLE.
    let idle = new_id(Some(&ch));
    assert_eq!(idle.state(), CmState::Idle);
    let e = assert_errno(
        "connect before resolve",
        idle.connect(&ConnParam::default()),
        Errno::Inval,
    );
    assert!(e.msg.contains("rdma_connect"), "{e}");
    assert_errno(
        "resolve_route before resolve_addr",
        idle.resolve_route(2000),
        Errno::Inval,
    );
    assert_errno("accept on an idle id", idle.accept(None), Errno::Inval);
    assert_errno("reject on an idle id", idle.reject(b""), Errno::Inval);
    let e = assert_errno("disconnect on an idle id", idle.disconnect(), Errno::Inval);
    assert!(e.msg.contains("rdma_disconnect"), "{e}");
    assert_eq!(idle.state(), CmState::Idle);

    // ADDR_RESOLVED, no QP yet: iWARP needs a QP to connect.
    let (l, addr) = listener(Some(&ch));
    let c = new_id(Some(&ch));
    c.resolve_addr(None, addr, 2000).unwrap();
    drop(expect(&ch, EventType::AddrResolved));
    assert_errno(
        "connect before resolve_route",
        c.connect(&ConnParam::default()),
        Errno::Inval,
    );
    assert_errno("bind after resolve", c.bind_addr(sa("127.0.0.1:0")), Errno::Inval);
    c.resolve_route(2000).unwrap();
    drop(expect(&ch, EventType::RouteResolved));
    let e = assert_errno("connect without a QP", c.connect(&ConnParam::default()), Errno::Inval);
    assert!(e.msg.contains("QP"), "{e}");
    assert_errno("accept on an active id", c.accept(None), Errno::Inval);
    assert_errno("disconnect before connect", c.disconnect(), Errno::Inval);
    assert_errno("resolve_addr twice", c.resolve_addr(None, addr, 2000), Errno::Inval);

    // LISTEN.
    assert_errno("listen twice", l.listen(8), Errno::Inval);
    assert_errno("bind a listener", l.bind_addr(sa("127.0.0.1:0")), Errno::Inval);
    assert_errno("connect a listener", l.connect(&ConnParam::default()), Errno::Inval);
    assert_errno("accept on a listener", l.accept(None), Errno::Inval);
    assert_errno("reject on a listener", l.reject(b""), Errno::Inval);
    assert_errno("disconnect a listener", l.disconnect(), Errno::Inval);
    assert_errno("resolve on a listener", l.resolve_addr(None, addr, 2000), Errno::Inval);

    // CONNECT.
    let cs = side(&c);
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&ch, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s);
    assert_errno("listen after connect", c.listen(8), Errno::Inval);
    assert_errno("connect twice", c.connect(&ConnParam::default()), Errno::Inval);
    assert_errno("accept on the connecting id", c.accept(None), Errno::Inval);
    assert_errno("listen on a passive id", s.listen(8), Errno::Inval);
    assert_errno("connect a passive id", s.connect(&ConnParam::default()), Errno::Inval);
    s.accept(None).unwrap();
    assert_errno("accept twice", s.accept(None), Errno::Inval);
    let mut got = [expect_any(&ch), expect_any(&ch)];
    got.sort_by_key(|e| e.event as u32);
    assert!(got.iter().all(|e| e.event == EventType::Established), "{got:?}");
    drop(got);
    Pair {
        chc: ch.clone(),
        chs: EventChannel::new().unwrap(),
        l,
        c,
        cs,
        s,
        ss,
    }
    .close_shared(&ch);
    destroy(idle);
}

fn expect_any(ch: &EventChannel) -> CmEvent {
    ch.get_event(Some(WAIT))
        .unwrap_or_else(|e| panic!("waiting for an event: {e}"))
}

impl Pair {
    /// Like [`Pair::close`] when both sides share `ch`.
    fn close_shared(self, ch: &EventChannel) {
        self.c.disconnect().unwrap();
        let a = expect(ch, EventType::Disconnected);
        let b = expect(ch, EventType::Disconnected);
        assert!(a.id != b.id && [&a.id, &b.id].contains(&&self.c) && [&a.id, &b.id].contains(&&self.s));
        drop((a, b));
        teardown(self.c, Some(self.cs));
        teardown(self.s, Some(self.ss));
        destroy(self.l);
        expect_none(ch);
    }
}

fn local_port_range() -> (u16, u16) {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let v: Vec<u16> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (v[0], v[1])
}

#[test]
fn bind_port_rules() {
    let ch = EventChannel::new().unwrap();
    // Port 0: an ephemeral port, different for each id.
    let a = new_id(Some(&ch));
    a.bind_addr(sa("127.0.0.1:0")).unwrap();
    assert_eq!(a.state(), CmState::AddrBound);
    let p = a.src_port();
    let (lo, hi) = local_port_range();
    assert!((lo..=hi).contains(&p), "port {p} outside {lo}-{hi}");
    assert_eq!(
        a.device().unwrap().name,
        "siw_lo",
        "127.0.0.1 attaches the loopback device"
    );
    let b = new_id(Some(&ch));
    b.bind_addr(sa("127.0.0.1:0")).unwrap();
    assert_ne!(b.src_port(), p);
    // The same address and port again: EADDRINUSE, bound or listening.
    let taken = SocketAddr::from(([127, 0, 0, 1], p));
    let c = new_id(Some(&ch));
    let e = assert_errno("second bind", c.bind_addr(taken), Errno::AddrInUse);
    assert!(e.msg.contains(&taken.to_string()), "{e}");
    assert_eq!(c.state(), CmState::Idle, "a failed bind leaves the id IDLE");
    a.listen(0).unwrap();
    assert_errno("bind to a listening port", c.bind_addr(taken), Errno::AddrInUse);
    // A wildcard bind leaves the id without a device.
    let w = new_id(Some(&ch));
    w.bind_addr(sa("0.0.0.0:0")).unwrap();
    assert!(w.device().is_none());
    assert_ne!(w.src_port(), 0);
    // Privileged ports.
    if !is_root() {
        let d = new_id(Some(&ch));
        if unprivileged_port_start() > 1 {
            assert_errno("bind port 1 unprivileged", d.bind_addr(sa("127.0.0.1:1")), Errno::Acces);
        }
        destroy(d);
    }
    expect_none(&ch);
    for id in [a, b, c, w] {
        destroy(id);
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn unprivileged_port_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024)
}

#[test]
fn bind_privileged_port_as_unprivileged_user_is_eacces() {
    if !is_root() {
        return; // bind_port_rules checks it directly.
    }
    if unprivileged_port_start() <= 1 {
        eprintln!("skipped: net.ipv4.ip_unprivileged_port_start allows every port");
        return;
    }
    // Root: drop privileges in a child copy of this binary.
    let out = run_child(
        "child_bind_privileged_port_unprivileged",
        None,
        &[("CM_TEST_DROP_PRIV", "1")],
    );
    if out.contains("CHILD-SKIP") {
        eprintln!("skipped: the child could not drop privileges");
    }
}

#[test]
fn r7_route_after_loopback_resolve_always_resolves() {
    let ch = EventChannel::new().unwrap();
    let mut dsts = vec![sa("127.0.0.1:7471"), sa("127.1.2.3:1"), sa("[::ffff:127.0.0.1]:7471")];
    if ipv6_loopback_up() {
        dsts.push(sa("[::1]:7471"));
    }
    if let Some((_, ip)) = other_interface() {
        dsts.push(SocketAddr::new(ip, 7471)); // this host's own address
    }
    for dst in dsts {
        let id = new_id(Some(&ch));
        let t = Instant::now();
        id.resolve_addr(None, dst, 2000)
            .unwrap_or_else(|e| panic!("resolve {dst}: {e}"));
        let ev = expect(&ch, EventType::AddrResolved);
        assert_eq!(ev.status, 0, "{dst}");
        drop(ev);
        assert!(id.device().is_some(), "{dst}: resolve attaches a device");
        assert!(id.local_addr().is_some(), "{dst}");
        id.resolve_route(2000).unwrap_or_else(|e| panic!("route {dst}: {e}"));
        let ev = expect(&ch, EventType::RouteResolved);
        assert_eq!(ev.status, 0, "{dst}");
        drop(ev);
        assert!(t.elapsed() < Duration::from_secs(1), "{dst}: {:?}", t.elapsed());
        assert_eq!(id.state(), CmState::RouteResolved);
        destroy(id);
        // And synchronously.
        let id = new_id(None);
        id.resolve_addr(None, dst, 2000).unwrap();
        id.resolve_route(2000).unwrap();
        assert_eq!(id.state(), CmState::RouteResolved);
        destroy(id);
    }
    expect_none(&ch);
}

fn ipv6_loopback_up() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

/// The first UP interface other than `lo` with an IPv4 address: (name, address).
fn other_interface() -> Option<(String, IpAddr)> {
    list_interfaces().ok()?.into_iter().find_map(|i| {
        if i.flags.loopback || !i.flags.up {
            return None;
        }
        let a = i.addrs.iter().find(|a| a.ip.is_ipv4())?;
        Some((i.name.clone(), a.ip))
    })
}

/// A raw TCP listener on 127.0.0.1 that accepts connections and never sends a byte.
struct Silent {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Silent {
    fn start() -> Silent {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop2.load(Ordering::Relaxed) && Instant::now() < deadline {
                match l.accept() {
                    Ok((s, _)) => held.push(s),
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            held.len()
        });
        Silent {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops accepting; returns how many connections were accepted.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

#[test]
fn r9_connect_timeout_gives_unreachable_etimedout() {
    let silent = Silent::start();
    let ch = EventChannel::new().unwrap();
    let c = resolved(&ch, silent.addr);
    let cs = side(&c);
    c.set_option(CmOption::ConnectTimeout(Duration::from_millis(300)))
        .unwrap();
    assert_eq!(c.options().connect_timeout, Duration::from_millis(300));
    let t = Instant::now();
    c.connect(&conn_param(b"hello?")).unwrap();
    let ev = ch
        .get_event(Some(Duration::from_secs(3)))
        .unwrap_or_else(|e| panic!("R9: no event within 3 s: {e}"));
    let took = t.elapsed();
    assert_eq!(ev.event, EventType::Unreachable, "{:?}", ev.reason);
    assert_eq!(ev.status, -libc::ETIMEDOUT);
    assert_eq!(ev.status, -110);
    assert!(ev.reason.contains(&silent.addr.to_string()), "{:?}", ev.reason);
    assert!(took >= Duration::from_millis(290), "{took:?}: not before the timeout");
    assert!(
        took < Duration::from_millis(300 + 500),
        "{took:?}: the timeout bounds it"
    );
    drop(ev);
    teardown(c, Some(cs));

    // The synchronous form returns ETIMEDOUT from connect.
    let c = new_id(None);
    c.resolve_addr(None, silent.addr, 2000).unwrap();
    c.resolve_route(2000).unwrap();
    let cs = side(&c);
    c.set_option(CmOption::ConnectTimeout(Duration::from_millis(300)))
        .unwrap();
    let c2 = c.clone();
    let t = Instant::now();
    let r = bounded("sync connect to a silent peer", WAIT, move || {
        c2.connect(&conn_param(b""))
    });
    let took = t.elapsed();
    assert_errno("sync connect to a silent peer", r, Errno::TimedOut);
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(800),
        "{took:?}"
    );
    teardown(c, Some(cs));
    assert_eq!(silent.finish(), 2, "both attempts reached TCP");
}

#[test]
fn migrate_between_channels() {
    let (ch1, ch2) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let dst = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let id = new_id(Some(&ch1));
    id.resolve_addr(None, dst, 2000).unwrap();
    // The queued ADDR_RESOLVED moves with the id.
    id.migrate(Some(&ch2)).unwrap();
    assert_eq!(id.channel(), ch2);
    expect_none(&ch1);
    assert_eq!(expect(&ch2, EventType::AddrResolved).id, id);
    // Later events go to the new channel.
    id.resolve_route(2000).unwrap();
    assert_eq!(expect(&ch2, EventType::RouteResolved).id, id);
    expect_none(&ch1);
    // To synchronous mode: errors come back from the call.
    id.migrate(None).unwrap();
    assert_ne!(id.channel(), ch2);
    assert_errno("migrate a sync id to NULL", id.migrate(None), Errno::Inval);
    let cs = side(&id);
    let id2 = id.clone();
    let r = bounded("sync connect after migrate", WAIT, move || {
        id2.connect(&conn_param(b""))
    });
    assert_errno("sync connect after migrate", r, Errno::ConnRefused);
    expect_none(&ch2);
    // And back to a channel.
    id.migrate(Some(&ch1)).unwrap();
    assert_eq!(id.channel(), ch1);
    teardown(id, Some(cs));
    expect_none(&ch1);
    expect_none(&ch2);
}

#[test]
fn migrate_listener_moves_its_queued_requests() {
    let (ch1, ch2, chc) = (
        EventChannel::new().unwrap(),
        EventChannel::new().unwrap(),
        EventChannel::new().unwrap(),
    );
    let (l, addr) = listener(Some(&ch1));
    let c = resolved(&chc, addr);
    let cs = side(&c);
    c.connect(&conn_param(b"")).unwrap();
    assert!(wait_readable(&ch1, WAIT), "the request reaches the listener's channel");
    l.migrate(Some(&ch2)).unwrap();
    let old = ch1.get_event(Some(Duration::ZERO)).ok();
    let new = ch2.get_event(Some(Duration::from_millis(200))).ok();
    let (on_old, on_new) = (old.as_ref().map(|e| e.event), new.as_ref().map(|e| e.event));
    // Keep the passive ids: dropping the last reference to one while the progress thread is
    // still in the request callback deadlocks it (see bug_dropping_a_fresh_connect_request_*).
    let children: Vec<CmId> = old.iter().chain(new.iter()).map(|e| e.id.clone()).collect();
    drop((old, new));
    for child in children {
        destroy(child);
    }
    destroy(l);
    drop(expect(&chc, EventType::Rejected));
    teardown(c, Some(cs));
    assert_eq!(
        (on_old, on_new),
        (None, Some(EventType::ConnectRequest)),
        "a listener's queued CONNECT_REQUEST moves with it (ucma moves every event of the listen ctx)"
    );
}

#[test]
fn migrate_blocks_until_old_channel_events_are_acked() {
    // librdmacm rdma_migrate_id waits until every event reported for the id on the old
    // channel is acknowledged (checklist item 6).
    let (ch1, ch2) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let id = new_id(Some(&ch1));
    id.resolve_addr(None, sa("127.0.0.1:7471"), 2000).unwrap();
    let ev = expect(&ch1, EventType::AddrResolved);
    let (tx, rx) = mpsc::channel();
    let (id2, ch2b) = (id.clone(), ch2.clone());
    std::thread::spawn(move || {
        let _ = tx.send(id2.migrate(Some(&ch2b)));
    });
    let early = rx.recv_timeout(Duration::from_millis(300)).is_ok();
    ev.ack();
    if !early {
        rx.recv_timeout(WAIT).expect("migrate returns after the ack").unwrap();
    }
    destroy(id);
    assert!(
        !early,
        "rdma_migrate_id returned while an event of the id was unacknowledged"
    );
}

/// Polls the channel's fd (events queued) for up to `limit`.
fn wait_readable(ch: &EventChannel, limit: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: ch.fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) > 0 }
}

#[test]
fn channel_fd_is_readable_while_events_wait() {
    let ch = EventChannel::new().unwrap();
    assert!(!wait_readable(&ch, Duration::ZERO));
    let id = new_id(Some(&ch));
    id.resolve_addr(None, sa("127.0.0.1:7471"), 2000).unwrap();
    assert!(wait_readable(&ch, WAIT));
    drop(expect(&ch, EventType::AddrResolved));
    assert!(!wait_readable(&ch, Duration::ZERO));
    // O_NONBLOCK on the fd: EAGAIN at once even without a timeout.
    // SAFETY: fcntl on our channel's fd.
    unsafe {
        let fl = libc::fcntl(ch.fd(), libc::F_GETFL);
        libc::fcntl(ch.fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    let ch2 = ch.clone();
    let r = bounded("non-blocking get_event", Duration::from_secs(1), move || {
        ch2.get_event(None).map(|e| e.event)
    });
    assert_errno("non-blocking get_event", r, Errno::Again);
    destroy(id);
}

#[test]
fn destroy_listener_rejects_undelivered_requests() {
    let chs = EventChannel::new().unwrap();
    let (l, addr) = listener(Some(&chs));
    let clients: Vec<(EventChannel, CmId, Side)> = (0..2)
        .map(|_| {
            let ch = EventChannel::new().unwrap();
            let c = resolved(&ch, addr);
            let cs = side(&c);
            c.connect(&conn_param(b"pending")).unwrap();
            (ch, c, cs)
        })
        .collect();
    // Wait until at least one CONNECT_REQUEST is queued, undelivered; give the second a moment.
    assert!(wait_readable(&chs, WAIT));
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    destroy(l);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "nothing delivered, nothing to wait for"
    );
    expect_none(&chs);
    for (ch, c, cs) in clients {
        let ev = expect(&ch, EventType::Rejected);
        assert_eq!(ev.id, c);
        assert!(
            ev.status == -libc::ECONNREFUSED || ev.status == -libc::ECONNRESET,
            "status {} ({:?})",
            ev.status,
            ev.reason
        );
        drop(ev);
        teardown(c, Some(cs));
    }
}

#[test]
fn destroy_waits_for_unacked_events() {
    let ch = EventChannel::new().unwrap();
    let id = new_id(Some(&ch));
    id.resolve_addr(None, sa("127.0.0.1:7471"), 2000).unwrap();
    let ev = expect(&ch, EventType::AddrResolved);
    assert_eq!(id.unacked_events(), 1);
    let (tx, rx) = mpsc::channel();
    let id2 = id.clone();
    drop(id);
    let h = std::thread::spawn(move || {
        let r = id2.destroy();
        let _ = tx.send(Instant::now());
        r
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "rdma_destroy_id returned before the event was acknowledged"
    );
    let acked_at = Instant::now();
    ev.ack();
    let done = rx.recv_timeout(WAIT).expect("destroy returns after the ack");
    assert!(done >= acked_at);
    h.join().unwrap().unwrap();

    // Queued but never retrieved events do not hold destroy up.
    let id = new_id(Some(&ch));
    id.resolve_addr(None, sa("127.0.0.1:7471"), 2000).unwrap();
    assert_eq!(id.unacked_events(), 1);
    let t = Instant::now();
    destroy(id);
    assert!(t.elapsed() < Duration::from_secs(1));
    expect_none(&ch);
}

#[test]
fn bind_wildcard_conflict_is_eaddrnotavail_like_cma() {
    let a = new_id(None);
    a.bind_addr(sa("127.0.0.1:0")).unwrap();
    let p = a.src_port();
    let w = new_id(None);
    let r = w.bind_addr(SocketAddr::from(([0, 0, 0, 0], p)));
    destroy(a);
    destroy(w);
    assert_errno("wildcard bind over a specific one", r, Errno::AddrNotAvail);
}

// ---- Rules that need SOFTRDMA_CONFIG: a child copy of this binary runs one `child_*` test.

/// Runs the ignored test `name` in a child process with `SOFTRDMA_CONFIG` pointing at a file
/// holding `config` (if any) and `env` set; asserts it passed and returns its output.
fn run_child(name: &str, config: Option<&str>, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env_remove(CONFIG_ENV);
    let path = config.map(|text| {
        let p = std::env::temp_dir().join(format!("softrdma-cm-test-{}-{name}.toml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    });
    if let Some(p) = &path {
        cmd.env(CONFIG_ENV, p);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child test {name} did not finish within 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (mut out, mut errs) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut errs).unwrap();
    if let Some(p) = path {
        let _ = std::fs::remove_file(p);
    }
    assert!(status.success(), "child test {name} failed ({status}):\n{out}\n{errs}");
    assert!(
        out.contains("1 passed"),
        "child test {name} did not run:\n{out}\n{errs}"
    );
    out
}

fn lo_config(loopback: bool) -> String {
    format!("[[device]]\nname = \"siw_lo\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\nloopback = {loopback}\n")
}

/// True when this process was started by [`run_child`] with a configuration.
fn in_child() -> bool {
    let yes = std::env::var_os(CONFIG_ENV).is_some_and(|v| !v.is_empty());
    if !yes {
        eprintln!("skipped: runs as a child of the test that needs it");
    }
    yes
}

#[test]
fn r3_bind_loopback_without_capable_device_fails_at_once() {
    run_child("child_r3_bind_loopback", Some(&lo_config(false)), &[]);
}

#[test]
#[ignore = "helper: run by r3_bind_loopback_without_capable_device_fails_at_once"]
fn child_r3_bind_loopback() {
    if !in_child() {
        return;
    }
    let ch = EventChannel::new().unwrap();
    for a in ["127.0.0.1:0", "127.0.0.1:7471", "[::1]:0", "[::ffff:127.0.0.1]:0"] {
        let id = new_id(Some(&ch));
        let t = Instant::now();
        let e = assert_errno(&format!("bind {a}"), id.bind_addr(sa(a)), Errno::AddrNotAvail);
        assert!(t.elapsed() < Duration::from_secs(1));
        let ip = sa(a).ip();
        assert!(e.msg.contains(&format!("bind {ip}")), "{e}");
        assert!(e.msg.contains("siw_lo: loopback disabled by config"), "{e}");
        assert_eq!(id.state(), CmState::Idle);
        destroy(id);
    }
    // Wildcards are still fine.
    let id = new_id(Some(&ch));
    id.bind_addr(sa("0.0.0.0:0")).unwrap();
    destroy(id);
    expect_none(&ch);
}

#[test]
fn r3_r5_zero_devices_fail_at_once() {
    run_child("child_zero_devices", Some("# no devices\n"), &[]);
}

#[test]
#[ignore = "helper: run by r3_r5_zero_devices_fail_at_once"]
fn child_zero_devices() {
    if !in_child() {
        return;
    }
    let ch = EventChannel::new().unwrap();
    let id = new_id(Some(&ch));
    let t = Instant::now();
    let e = assert_errno("bind 127.0.0.1", id.bind_addr(sa("127.0.0.1:0")), Errno::AddrNotAvail);
    assert!(e.msg.contains("127.0.0.1") && e.msg.contains("no RDMA devices"), "{e}");
    let e = assert_errno(
        "resolve 127.0.0.1",
        id.resolve_addr(None, sa("127.0.0.1:7471"), 2000),
        Errno::NoDev,
    );
    assert!(
        e.msg.contains("resolve 127.0.0.1") && e.msg.contains("no RDMA devices"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    expect_none(&ch);
    destroy(id);
}

#[test]
fn r5_resolve_loopback_without_capable_device_fails_at_once() {
    run_child("child_r5_resolve_loopback", Some(&lo_config(false)), &[]);
}

#[test]
#[ignore = "helper: run by r5_resolve_loopback_without_capable_device_fails_at_once"]
fn child_r5_resolve_loopback() {
    if !in_child() {
        return;
    }
    // Asynchronous id: an immediate error (or ADDR_ERROR within milliseconds), never a timeout.
    let ch = EventChannel::new().unwrap();
    for dst in ["127.0.0.1:7471", "[::1]:7471"] {
        let id = new_id(Some(&ch));
        let t = Instant::now();
        let dst = sa(dst);
        match id.resolve_addr(None, dst, 2000) {
            Err(e) => {
                assert_eq!(e.errno, Errno::NoDev, "{e}");
                assert_eq!(
                    e.msg,
                    format!(
                        "resolve {}: no loopback-capable RDMA device (siw_lo: loopback disabled by config)",
                        dst.ip()
                    )
                );
            }
            Ok(()) => {
                let ev = ch
                    .get_event(Some(Duration::from_millis(100)))
                    .expect("ADDR_ERROR at once");
                assert_eq!((ev.event, ev.status), (EventType::AddrError, -libc::ENODEV));
                assert!(
                    ev.reason.contains("siw_lo: loopback disabled by config"),
                    "{:?}",
                    ev.reason
                );
            }
        }
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_ne!(id.state(), CmState::AddrResolved);
        destroy(id);
    }
    // Synchronous id: the error comes back from the call.
    let id = new_id(None);
    let t = Instant::now();
    let e = bounded("sync resolve", WAIT, {
        let id = id.clone();
        move || id.resolve_addr(None, sa("127.0.0.1:7471"), 2000)
    });
    let e = assert_errno("sync resolve 127.0.0.1", e, Errno::NoDev);
    assert!(e.msg.contains("siw_lo: loopback disabled by config"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(1));
    destroy(id);
    expect_none(&ch);
}

#[test]
fn r5_loopback_uses_first_capable_device_when_lo_cannot() {
    let Some((ifname, _)) = other_interface() else {
        eprintln!("skipped: no interface besides lo");
        return;
    };
    let cfg = format!(
        "{}\n[[device]]\nname = \"siw_other\"\ntransport = \"iwarp\"\nnetdev = \"{ifname}\"\n",
        lo_config(false)
    );
    run_child("child_r5_first_capable", Some(&cfg), &[]);
}

#[test]
#[ignore = "helper: run by r5_loopback_uses_first_capable_device_when_lo_cannot"]
fn child_r5_first_capable() {
    if !in_child() {
        return;
    }
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(Some(&chs));
    assert_eq!(l.device().unwrap().name, "siw_other");
    let c = resolved(&chc, addr);
    assert_eq!(c.device().unwrap().name, "siw_other");
    let cs = side(&c);
    c.connect(&conn_param(b"via siw_other")).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    assert_eq!(s.device().unwrap().name, "siw_other");
    Pair::accept(chc, chs, l, c, cs, s).close();
}

#[test]
fn r6_own_ip_without_loopback_is_addr_error() {
    let Some((ifname, _)) = other_interface() else {
        eprintln!("skipped: no interface besides lo");
        return;
    };
    let cfg = format!(
        "{}\n[[device]]\nname = \"siw_other\"\ntransport = \"iwarp\"\nnetdev = \"{ifname}\"\nloopback = false\n",
        lo_config(true)
    );
    run_child("child_r6_own_ip", Some(&cfg), &[]);
}

#[test]
#[ignore = "helper: run by r6_own_ip_without_loopback_is_addr_error"]
fn child_r6_own_ip() {
    if !in_child() {
        return;
    }
    let (_, ip) = other_interface().expect("the parent found one");
    let dst = SocketAddr::new(ip, 7471);
    let ch = EventChannel::new().unwrap();
    let id = new_id(Some(&ch));
    let t = Instant::now();
    id.resolve_addr(None, dst, 2000).unwrap();
    let ev = ch.get_event(Some(Duration::from_secs(1))).expect("ADDR_ERROR promptly");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(ev.event, EventType::AddrError, "{:?}", ev.reason);
    assert_eq!(ev.status, -libc::ENODEV);
    for part in [ip.to_string().as_str(), "siw_other", "loopback disabled by config"] {
        assert!(ev.reason.contains(part), "{:?} lacks {part:?}", ev.reason);
    }
    drop(ev);
    assert_ne!(id.state(), CmState::AddrResolved);
    destroy(id);
    // Synchronous: ENODEV from the call, with the same message.
    let id = new_id(None);
    let r = bounded("sync resolve own ip", WAIT, {
        let id = id.clone();
        move || id.resolve_addr(None, dst, 2000)
    });
    let e = assert_errno("sync resolve own ip", r, Errno::NoDev);
    assert!(e.msg.contains("siw_other") && e.msg.contains(&ip.to_string()), "{e}");
    destroy(id);
    // Loopback itself still works through siw_lo.
    let id = new_id(None);
    id.resolve_addr(None, sa("127.0.0.1:7471"), 2000).unwrap();
    assert_eq!(id.device().unwrap().name, "siw_lo");
    destroy(id);
}

#[test]
#[ignore = "helper: run by bind_privileged_port_as_unprivileged_user_is_eacces"]
fn child_bind_privileged_port_unprivileged() {
    if std::env::var_os("CM_TEST_DROP_PRIV").is_none() {
        eprintln!("skipped: runs as a child of the test that needs it");
        return;
    }
    // SAFETY: plain credential calls in a child process that runs only this test.
    let dropped =
        unsafe { libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(65534) == 0 && libc::setuid(65534) == 0 };
    if !dropped {
        println!("CHILD-SKIP: cannot drop privileges");
        return;
    }
    let id = new_id(None);
    let e = assert_errno(
        "bind 127.0.0.1:1 unprivileged",
        id.bind_addr(sa("127.0.0.1:1")),
        Errno::Acces,
    );
    assert!(e.msg.contains("127.0.0.1:1"), "{e}");
    id.bind_addr(sa("127.0.0.1:0")).unwrap();
    destroy(id);
}

#[test]
fn bug_request_to_an_address_without_device_is_rejected_not_deadlocked() {
    if other_interface().is_none() {
        eprintln!("skipped: no interface besides lo");
        return;
    }
    run_child("child_bug_reject_in_request_callback", Some(&lo_config(true)), &[]);
}

#[test]
#[ignore = "helper: run by bug_request_to_an_address_without_device_is_rejected_not_deadlocked"]
fn child_bug_reject_in_request_callback() {
    if !in_child() {
        return;
    }
    // Only siw_lo exists. A wildcard listener gets a request on this host's Ethernet address,
    // which no device serves: the CM rejects it from inside the request callback.
    let (_, ip) = other_interface().expect("the parent found one");
    let ch = EventChannel::new().unwrap();
    let l = new_id(Some(&ch));
    l.bind_addr(sa("0.0.0.0:0")).unwrap();
    l.listen(8).unwrap();
    let dst = SocketAddr::new(ip, l.src_port());
    let c = resolved(&ch, sa("127.0.0.1:7471"));
    let cs = side(&c);
    let params = softrdma_iwarp::ConnectParams {
        timeout: Duration::from_secs(1),
        ..softrdma_iwarp::ConnectParams::default()
    };
    let t = Instant::now();
    let r = softrdma_iwarp::connect_blocking(&cs.qp, dst, params);
    let took = t.elapsed();
    let e = assert_errno("connect to an address no device serves", r, Errno::ConnRefused);
    assert!(took < Duration::from_secs(1), "{took:?}: {e}");
    expect_none(&ch);
    teardown(c, Some(cs));
    destroy(l);
}

#[test]
fn bug_dropping_a_fresh_connect_request_does_not_deadlock() {
    run_child("child_bug_drop_fresh_request", Some(&lo_config(true)), &[]);
}

#[test]
#[ignore = "helper: run by bug_dropping_a_fresh_connect_request_does_not_deadlock"]
fn child_bug_drop_fresh_request() {
    if !in_child() {
        return;
    }
    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let (l, addr) = listener(Some(&chs));
    for i in 0..300 {
        let c = resolved(&chc, addr);
        let cs = side(&c);
        c.connect(&conn_param(b"")).unwrap();
        // An application that does not want the request drops the event and the new id
        // ("dropping a request undecided rejects it"). The progress thread may still be in the
        // request callback, holding the connection lock, when the last reference goes.
        let ev = chs
            .get_event(Some(WAIT))
            .unwrap_or_else(|e| panic!("iteration {i}: no CONNECT_REQUEST: {e} (progress thread deadlocked?)"));
        assert_eq!(ev.event, EventType::ConnectRequest);
        drop(ev);
        let ev = chc
            .get_event(Some(WAIT))
            .unwrap_or_else(|e| panic!("iteration {i}: no REJECTED: {e} (progress thread deadlocked?)"));
        assert_eq!(ev.event, EventType::Rejected, "iteration {i}");
        drop(ev);
        teardown(c, Some(cs));
    }
    destroy(l);
}

#[test]
fn r8_connect_to_own_bound_port_is_rejected() {
    // The id reserves 127.0.0.1:p with bind, then connects to 127.0.0.1:p where nothing
    // listens: TCP connects the socket to itself and the MPA layer reads its own request.
    // An auto-bound source port can hit the same case by chance.
    let ch = EventChannel::new().unwrap();
    let c = new_id(Some(&ch));
    c.bind_addr(sa("127.0.0.1:0")).unwrap();
    let dst = SocketAddr::from(([127, 0, 0, 1], c.src_port()));
    c.resolve_addr(None, dst, 2000).unwrap();
    drop(expect(&ch, EventType::AddrResolved));
    c.resolve_route(2000).unwrap();
    drop(expect(&ch, EventType::RouteResolved));
    let cs = side(&c);
    c.connect(&conn_param(b"")).unwrap();
    let ev = expect_any(&ch);
    let got = (ev.event, ev.status, ev.reason.clone());
    drop(ev);
    teardown(c, Some(cs));
    assert_eq!(
        (got.0, got.1),
        (EventType::Rejected, -libc::ECONNREFUSED),
        "{:?}",
        got.2
    );
}

/// Listens on `bind`, connects a client to `dst`, and returns the listener's event (a
/// CONNECT_REQUEST, or the client's REJECTED when the listener never sees one).
fn try_reach(bind: SocketAddr, dst_ip: IpAddr, af_only: Option<bool>) -> Result<SocketAddr, i32> {
    let sch = EventChannel::new().unwrap();
    let listener = new_id(Some(&sch));
    if let Some(a) = af_only {
        listener.set_option(CmOption::AfOnly(a)).unwrap();
    }
    listener.bind_addr(bind).unwrap();
    listener.listen(8).unwrap();
    let port = listener.local_addr().unwrap().port();
    let cch = EventChannel::new().unwrap();
    let client = new_id(Some(&cch));
    client.resolve_addr(None, SocketAddr::new(dst_ip, port), 2000).unwrap();
    expect(&cch, EventType::AddrResolved).ack();
    client.resolve_route(2000).unwrap();
    expect(&cch, EventType::RouteResolved).ack();
    let _side = side(&client);
    client.connect(&ConnParam::default()).unwrap();
    let out = match sch.get_event(Some(Duration::from_secs(2))) {
        Ok(ev) if ev.event == EventType::ConnectRequest => Ok(ev.id.local_addr().expect("local")),
        Ok(ev) => panic!("listener got {}", ev.event),
        Err(_) => {
            let ev = expect(&cch, EventType::Rejected);
            Err(ev.status)
        }
    };
    let _ = client.destroy_qp();
    client.destroy().unwrap();
    listener.destroy().unwrap();
    out
}

#[test]
fn r10_wildcard_listener_serves_loopback_and_every_device() {
    // 0.0.0.0 serves loopback ...
    let got = try_reach(sa("0.0.0.0:0"), "127.0.0.1".parse().unwrap(), None).expect("127.0.0.1 reaches 0.0.0.0");
    assert!(got.ip().is_loopback());
    // ... and every address of this host that has a device.
    let own: Vec<IpAddr> = softrdma_verbs::device::list_devices()
        .unwrap()
        .iter()
        .filter(|d| !d.is_loopback_netdev && d.loopback)
        .flat_map(|d| {
            d.addrs
                .iter()
                .map(|a| a.ip)
                .filter(|ip| ip.is_ipv4())
                .collect::<Vec<_>>()
        })
        .collect();
    for ip in own {
        let got = try_reach(sa("0.0.0.0:0"), ip, None).unwrap_or_else(|s| panic!("{ip} did not reach 0.0.0.0: {s}"));
        assert_eq!(got.ip(), ip);
    }
    // :: with AFONLY off (the default, bindv6only=0) takes IPv4 too; with AFONLY on it does not.
    assert!(try_reach(sa("[::]:0"), "127.0.0.1".parse().unwrap(), Some(false)).is_ok());
    assert_eq!(
        try_reach(sa("[::]:0"), "127.0.0.1".parse().unwrap(), Some(true)),
        Err(-libc::ECONNREFUSED)
    );
}

#[test]
fn r13_ipv6_loopback_connects_like_ipv4() {
    let got = try_reach(sa("[::1]:0"), "::1".parse().unwrap(), None).expect("::1 reaches ::1");
    assert_eq!(got.ip(), "::1".parse::<IpAddr>().unwrap());
    let got = try_reach(sa("[::]:0"), "::1".parse().unwrap(), Some(true)).expect("::1 reaches ::");
    assert!(got.ip().is_loopback());
}
