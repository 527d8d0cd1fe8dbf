//! The socket layer against raw TCP peers on 127.0.0.1: what the sans-I/O tests cannot see
//! (epoll interest, wakeups, handshake buffering, closing).

use super::conn::{Phase, TcpConn};
use super::listen::MAX_MPA_FRAME;
use super::{connect_blocking, ConnHandle, ConnRequest, ConnectParams, EventSink, Listener};
use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::*;
use softrdma_wire::{emit_fpdu, IrdOrd, MpaFrame, MpaKind};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_secs(5);

/// `lo` with 127.0.0.1, as the devices see it.
fn lo() -> device::NetIf {
    device::NetIf::synthetic_loopback()
}

fn device() -> device::DeviceInfo {
    device::devices_from(&[lo()], None).unwrap().remove(0)
}

struct Ep {
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn endpoint() -> Ep {
    let ctx = Context::open(&device()).unwrap();
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
            max_inline_data: 64,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    let qp = Qp::new(&pd, init, AttrRules::Iwarp).unwrap();
    let attr = QpAttr {
        qp_state: Some(QpState::Init),
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..QpAttr::default()
    };
    qp.modify(&attr, attr_mask::STATE | attr_mask::ACCESS_FLAGS).unwrap();
    Ep { pd, cq, qp }
}

fn listener() -> (Listener, Receiver<ConnRequest>) {
    Listener::bind_queue("127.0.0.1:0".parse().unwrap(), 8).unwrap()
}

fn quiet() -> EventSink {
    Arc::new(|_| {})
}

fn request(markers: bool, crc: bool) -> Vec<u8> {
    let f = MpaFrame {
        kind: MpaKind::Request,
        markers,
        crc,
        reject: false,
        revision: 2,
        enhanced: Some(IrdOrd {
            ird: 16,
            ord: 16,
            ..IrdOrd::default()
        }),
        private_data: b"raw".to_vec(),
    };
    let mut out = Vec::new();
    f.emit(&mut out).unwrap();
    out
}

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, BOUND).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    s
}

/// Reads until EOF/RST (true) or the bound (false); returns what arrived.
fn read_to_close(s: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

fn eventually(cond: impl FnMut() -> bool) -> bool {
    within(BOUND, cond)
}

fn within(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

fn wakeups(c: &Arc<TcpConn>) -> u64 {
    c.wakeups.load(Ordering::Relaxed)
}

/// A raw peer's request that reached the application.
fn raw_request(bytes: &[u8]) -> (Listener, TcpStream, ConnRequest) {
    let (l, rx) = listener();
    let mut s = raw(l.local_addr());
    s.write_all(bytes).unwrap();
    let req = rx.recv_timeout(BOUND).expect("the request reached the application");
    (l, s, req)
}

#[test]
fn idle_connections_do_not_wake_the_progress_thread() {
    // Passive side: accept used to turn write interest on behind the connection's back.
    // Active side: an interest change made by the connection's first event (which could run
    // before its token was set) was lost. Either left EPOLLOUT on: a wakeup loop while idle.
    let (l, rx) = listener();
    let addr = l.local_addr();
    let mut conns: Vec<(Ep, Ep, ConnHandle, ConnHandle)> = Vec::new();
    for _ in 0..16 {
        let (client, server) = (endpoint(), endpoint());
        let qp = client.qp.clone();
        let t = std::thread::spawn(move || connect_blocking(&qp, addr, ConnectParams::default()));
        let req = rx.recv_timeout(BOUND).unwrap();
        let sh = req.accept(&server.qp, ConnectParams::default(), quiet()).unwrap();
        let (ch, _) = t.join().unwrap().unwrap();
        conns.push((client, server, ch, sh));
    }
    std::thread::sleep(Duration::from_millis(200));
    let before: Vec<(u64, u64)> = conns.iter().map(|c| (wakeups(&c.2.conn), wakeups(&c.3.conn))).collect();
    std::thread::sleep(Duration::from_millis(300));
    for (i, (c, (a, p))) in conns.iter().zip(before).enumerate() {
        let (da, dp) = (wakeups(&c.2.conn) - a, wakeups(&c.3.conn) - p);
        assert!(
            da <= 2 && dp <= 2,
            "idle pair {i}: {da} active and {dp} passive wakeups in 300 ms"
        );
    }
    // And they still work.
    let (client, server, ..) = &conns[0];
    let src = client.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = server.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    src.write(0, &[7; 64]).unwrap();
    server.qp.post_recv_one(1, dst.sge(0, 64)).unwrap();
    client.qp.post_send_one(SendWr::send(2, vec![src.sge(0, 64)])).unwrap();
    assert_eq!(server.cq.wait_for(1, BOUND)[0].status, WcStatus::Success);
    assert_eq!(dst.to_vec(), vec![7; 64]);
}

#[test]
fn a_request_for_markers_is_rejected_before_the_application_sees_it() {
    let (l, rx) = listener();
    let mut s = raw(l.local_addr());
    s.write_all(&request(true, false)).unwrap();
    let (got, closed) = read_to_close(&mut s);
    assert!(closed, "the connection stayed open");
    let (reply, _) = MpaFrame::parse(&got).unwrap().expect("an MPA reply");
    assert!(reply.kind == MpaKind::Reply && reply.reject, "{reply:?}");
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "delivered to the application"
    );
    assert_eq!(l.pending(), 0);
}

#[test]
fn a_failed_accept_rejects_and_closes_the_connection() {
    let (l, mut s, req) = raw_request(&request(false, false));
    // Make the reply impossible after the request was delivered (the wire no longer lets
    // markers through, so reach in): `accept` fails after it has taken the connection.
    let conn = req.conn().unwrap().clone();
    if let Phase::AwaitAccept { request } = &mut conn.lock().phase {
        request.markers = true;
    }
    let ep = endpoint();
    let err = req.accept(&ep.qp, ConnectParams::default(), quiet()).unwrap_err();
    assert_eq!(err.errno, Errno::Proto, "{err}");
    let (got, closed) = read_to_close(&mut s);
    assert!(closed, "the connection stayed open after the failed accept");
    assert!(MpaFrame::parse(&got).unwrap().unwrap().0.reject);
    assert!(matches!(conn.lock().phase, Phase::Closed));
    assert_eq!(l.pending(), 0);
    assert_eq!(ep.qp.state(), QpState::Init);
}

#[test]
fn a_hang_up_before_the_decision_closes_the_connection_at_once() {
    let (l, s, req) = raw_request(&request(false, false));
    let conn = req.conn().unwrap().clone();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(eventually(|| matches!(conn.lock().phase, Phase::Closed)), "still open");
    let w = wakeups(&conn);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        wakeups(&conn) - w <= 1,
        "woken {} times after closing",
        wakeups(&conn) - w
    );
    let ep = endpoint();
    let err = req.accept(&ep.qp, ConnectParams::default(), quiet()).unwrap_err();
    assert_eq!(err.errno, Errno::ConnReset, "{err}");
    assert_eq!(l.pending(), 0);
    drop(s);
}

#[test]
fn handshake_reads_stop_at_one_mpa_frame() {
    // The request followed at once by 1 MiB: the listener buffers at most one frame's worth;
    // the rest waits in the socket for the engine (it used to be read whole, then cut at 256 KiB).
    let mut bytes = request(false, false);
    bytes.extend(std::iter::repeat_n(0u8, 1 << 20));
    let (l, rx) = listener();
    let mut s = raw(l.local_addr());
    let writer = std::thread::spawn(move || {
        let _ = s.write_all(&bytes);
        s
    });
    let req = rx.recv_timeout(BOUND).unwrap();
    let conn = req.conn().unwrap().clone();
    let buffered = conn.lock().inbuf.len();
    assert!(
        buffered <= MAX_MPA_FRAME,
        "{buffered} bytes buffered during the handshake"
    );
    drop(req);
    drop(writer.join().unwrap());
}

fn fpdu_with(ulpdu: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    emit_fpdu(&[ulpdu], false, &mut out).unwrap();
    out
}

/// A raw initiator that stopped reading: READ Responses fill the victim's send path, then an
/// unknown opcode makes it queue a Terminate that cannot leave.
fn stuck_peer() -> (Listener, TcpStream, ConnHandle, Ep, Mr) {
    let (l, rx) = listener();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect_timeout(&l.local_addr().into(), BOUND).unwrap();
    let mut s: TcpStream = sock.into();
    s.write_all(&request(false, false)).unwrap();
    let req = rx.recv_timeout(BOUND).unwrap();
    let ep = endpoint();
    let src = ep.pd.alloc_mr(1 << 20, Access::REMOTE_READ).unwrap();
    let h = req.accept(&ep.qp, ConnectParams::default(), quiet()).unwrap();
    let mut reply = [0u8; 24];
    s.read_exact(&mut reply).unwrap();
    for msn in 1..=8u32 {
        let mut u = vec![0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1];
        u.extend_from_slice(&msn.to_be_bytes());
        u.extend_from_slice(&[0, 0, 0, 0]);
        let rr = softrdma_wire::ReadRequest {
            sink_stag: 1,
            sink_to: 0,
            size: 1 << 20,
            src_stag: src.rkey(),
            src_to: src.addr(),
        };
        rr.emit(&mut u);
        s.write_all(&fpdu_with(&u)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    // A SEND header with opcode 8.
    let bad = [0x41, 0x48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, b'x'];
    s.write_all(&fpdu_with(&bad)).unwrap();
    assert!(eventually(|| ep.qp.state() == QpState::Err));
    (l, s, h, ep, src)
}

#[test]
fn a_terminate_the_peer_does_not_read_is_bounded() {
    // With FIN: the victim drains, sees the FIN and closes (it used to stop reading, and the
    // level-triggered hang-up woke the progress thread in a loop).
    let (_l, s, h, _ep, _src) = stuck_peer();
    assert!(
        !h.is_closed(),
        "the Terminate was expected to be stuck behind unread data"
    );
    s.shutdown(std::net::Shutdown::Write).unwrap();
    // Well before TERMINATE_LINGER: the FIN itself closes it.
    assert!(
        within(Duration::from_secs(1), || h.is_closed()),
        "the victim kept the connection after the FIN"
    );
    // Without FIN: the linger deadline is armed (the connection closes when it passes).
    let (_l2, s2, h2, _ep2, _src2) = stuck_peer();
    assert!(!h2.is_closed());
    let linger = h2.conn.lock().linger.expect("linger deadline armed");
    assert!(linger <= Instant::now() + super::TERMINATE_LINGER);
    let w = wakeups(&h2.conn);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        wakeups(&h2.conn) - w <= 2,
        "stuck connection woken {} times",
        wakeups(&h2.conn) - w
    );
    drop((s, s2));
}

#[test]
fn a_qp_of_a_roce_device_is_refused_with_a_hint() {
    let roce = device::devices_from(&[lo()], None)
        .unwrap()
        .into_iter()
        .find(|d| d.transport == device::TransportKind::Roce)
        .expect("a soft-RoCE device on lo");
    let ctx = Context::open(&roce).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let qp = Qp::new(&pd, QpInitAttr::rc(&cq, 4, 4), AttrRules::Ibta).unwrap();
    let (l, _requests) = listener();
    let err = connect_blocking(&qp, l.local_addr(), ConnectParams::default()).unwrap_err();
    assert_eq!(err.errno, Errno::Inval);
    assert!(
        err.msg
            .contains(&format!("belongs to {}, a soft-RoCE device", roce.name)),
        "{}",
        err.msg
    );
}
