//! The rdma_cm port space over iWARP's TCP sockets (issue #13): a listener's port is free
//! again as soon as its ids are destroyed, even while the closed connections sit in TCP
//! TIME_WAIT on it, and two live ids on one address and port still get EADDRINUSE (wildcard
//! overlaps EADDRNOTAVAIL), within one process and across processes, as Linux cma.c
//! (`cma_check_port`). Every id here is restricted to iWARP, so the tests do not depend on
//! which RoCE devices the host has. Every wait is bounded.

use softrdma_cm::{CmEvent, CmId, CmOption, ConnParam, EventChannel, EventType, PortSpace};
use softrdma_verbs::device::{TransportKind, CONFIG_ENV, TRANSPORTS_ENV};
use softrdma_verbs::{Cq, Errno, Pd, Qp, QpInitAttr};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(5);
const CHILD_ENV: &str = "SOFTRDMA_PORT_REUSE_CHILD";

/// One test at a time: spawning the child process forks this one, and between fork and exec
/// the child holds copies of every port claim (abstract Unix sockets), so a test that frees and
/// re-binds a port at that moment would see it taken.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn local_port_range() -> (u16, u16) {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let v: Vec<u16> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (v[0], v[1])
}

/// A port free on 127.0.0.1 and 0.0.0.0, outside the ephemeral range (no client socket is
/// auto-bound to it), different for each call of this process.
fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let (lo, hi) = local_port_range();
    let start = 25000 + (std::process::id() % 5000) as u16;
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

fn id(ch: Option<&EventChannel>) -> CmId {
    let id = CmId::create(ch, PortSpace::Tcp).unwrap();
    id.set_option(CmOption::Transport(Some(TransportKind::Iwarp))).unwrap();
    id
}

fn expect(ch: &EventChannel, want: EventType) -> CmEvent {
    let ev = ch
        .get_event(Some(WAIT))
        .unwrap_or_else(|e| panic!("waiting for {want}: {e}"));
    assert_eq!(ev.event, want, "status {}, {:?}", ev.status, ev.reason);
    ev
}

fn errno<T: std::fmt::Debug>(what: &str, r: softrdma_verbs::Result<T>) -> Errno {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => e.errno,
    }
}

struct Side {
    pd: Pd,
    cq: Cq,
    _qp: Qp,
}

fn side(id: &CmId) -> Side {
    let ctx = id.context().expect("the id has a device");
    assert!(ctx.device().name.starts_with("siw_"), "{}", ctx.device().name);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let init = QpInitAttr::rc(&cq, 4, 4);
    let qp = id.create_qp(&pd, init).unwrap();
    Side { pd, cq, _qp: qp }
}

fn teardown(id: CmId, side: Side) {
    id.destroy_qp().unwrap();
    id.destroy().unwrap();
    side.cq.destroy().unwrap();
    side.pd.dealloc().unwrap();
}

/// True while some TCP socket on 127.0.0.1:`port` is in TIME_WAIT (/proc/net/tcp state 06).
fn time_wait_on(port: u16) -> bool {
    let want = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            c.len() > 3 && c[1].ends_with(&want) && c[3] == "06"
        })
}

/// Listens on 127.0.0.1:`port`, takes one connection, closes it from `server_first`'s side,
/// destroys everything.
fn one_connection(port: u16, server_first: bool) {
    let (chs, chc) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let l = id(Some(&chs));
    l.bind_addr(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
    l.listen(4).unwrap();
    let c = id(Some(&chc));
    c.resolve_addr(None, SocketAddr::from(([127, 0, 0, 1], port)), 2000)
        .unwrap();
    drop(expect(&chc, EventType::AddrResolved));
    c.resolve_route(2000).unwrap();
    drop(expect(&chc, EventType::RouteResolved));
    let cs = side(&c);
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s);
    s.accept(None).unwrap();
    drop(expect(&chs, EventType::Established));
    drop(expect(&chc, EventType::Established));
    let first = if server_first { &s } else { &c };
    first.disconnect().unwrap();
    drop(expect(&chs, EventType::Disconnected));
    drop(expect(&chc, EventType::Disconnected));
    teardown(c, cs);
    teardown(s, ss);
    l.destroy().unwrap();
}

#[test]
fn listener_port_is_free_at_once_after_a_server_side_close() {
    let _serial = serial();
    let port = free_port();
    one_connection(port, true);
    // The server closed first: its end of the connection waits in TIME_WAIT on the port.
    let deadline = Instant::now() + WAIT;
    while !time_wait_on(port) {
        assert!(
            Instant::now() < deadline,
            "no TIME_WAIT on port {port}: the test proves nothing"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A new listener on the port right away (the kernel's rdma_cm has no such wait), and it
    // takes a connection.
    one_connection(port, true);
    one_connection(port, false);
    // Bound, not listening, then listening.
    let l = id(None);
    l.bind_addr(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
    l.listen(1).unwrap();
    l.destroy().unwrap();
}

#[test]
fn two_live_ids_on_one_port_in_one_process() {
    let _serial = serial();
    let port = free_port();
    let lo = SocketAddr::from(([127, 0, 0, 1], port));
    let any = SocketAddr::from(([0, 0, 0, 0], port));
    // Two listeners: the second bind fails, REUSEADDR or not (a listener holds its port alone).
    let a = id(None);
    a.bind_addr(lo).unwrap();
    a.listen(1).unwrap();
    let b = id(None);
    assert_eq!(errno("bind to a listening port", b.bind_addr(lo)), Errno::AddrInUse);
    b.set_option(CmOption::ReuseAddr(true)).unwrap();
    assert_eq!(
        errno("REUSEADDR bind to a listening port", b.bind_addr(lo)),
        Errno::AddrInUse
    );
    assert_eq!(
        errno("wildcard bind over a listener", b.bind_addr(any)),
        Errno::AddrNotAvail
    );
    a.destroy().unwrap();
    // Two bound ids: TCP with SO_REUSEADDR would let them share; the port space does not.
    let a = id(None);
    a.bind_addr(lo).unwrap();
    let c = id(None);
    assert_eq!(errno("second bind", c.bind_addr(lo)), Errno::AddrInUse);
    a.destroy().unwrap();
    c.destroy().unwrap();
    // Both REUSEADDR: both bind; listening needs the address alone (cma.c rdma_listen).
    let (a, c) = (id(None), id(None));
    for x in [&a, &c] {
        x.set_option(CmOption::ReuseAddr(true)).unwrap();
        x.bind_addr(lo).unwrap();
    }
    assert_eq!(errno("listen beside a REUSEADDR id", a.listen(1)), Errno::AddrInUse);
    c.destroy().unwrap();
    a.listen(1).unwrap();
    assert!(!a.options().reuse_addr, "rdma_listen clears REUSEADDR");
    b.destroy().unwrap();
    a.destroy().unwrap();
    // Free again: a plain bind and listen.
    let a = id(None);
    a.bind_addr(lo).unwrap();
    a.listen(1).unwrap();
    a.destroy().unwrap();
}

#[test]
fn bind_wildcard_over_a_specific_one_is_eaddrnotavail_like_cma() {
    let _serial = serial();
    let port = free_port();
    let a = id(None);
    a.bind_addr(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
    let w = id(None);
    let r = w.bind_addr(SocketAddr::from(([0, 0, 0, 0], port)));
    // Another specific address on the same port is a different binding.
    let o = id(None);
    let other = o.bind_addr(SocketAddr::from(([127, 0, 0, 2], port)));
    for x in [a, w, o] {
        x.destroy().unwrap();
    }
    assert_eq!(errno("wildcard bind", r), Errno::AddrNotAvail);
    other.unwrap();
}

fn spawn_child(name: &str) -> (Child, mpsc::Receiver<String>) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .env(CHILD_ENV, "1")
        .env_remove(CONFIG_ENV)
        .env_remove(TRANSPORTS_ENV);
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

fn child_says(rx: &mpsc::Receiver<String>, key: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the child never said {key}"));
        if let Some(v) = line.split(&format!("{key} ")).nth(1) {
            return v.trim().to_string();
        }
    }
}

#[test]
fn two_live_ids_on_one_port_in_two_processes() {
    let _serial = serial();
    let (mut child, rx) = spawn_child("child_holds_ports");
    let bound: u16 = child_says(&rx, "BOUND").parse().unwrap();
    let listening: u16 = child_says(&rx, "LISTENING").parse().unwrap();
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    // TCP alone would let a second SO_REUSEADDR socket share the bound-only port.
    let raw = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    raw.set_reuse_address(true).unwrap();
    raw.bind(&at(bound).into()).unwrap();
    drop(raw);
    let x = id(None);
    let r1 = x.bind_addr(at(bound));
    let r2 = x.bind_addr(at(listening));
    let r3 = x.bind_addr(SocketAddr::from(([0, 0, 0, 0], listening)));
    x.set_option(CmOption::ReuseAddr(true)).unwrap();
    let r4 = x.bind_addr(at(bound));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(errno("bind to a port another process bound", r1), Errno::AddrInUse);
    assert_eq!(errno("bind to a port another process listens on", r2), Errno::AddrInUse);
    assert_eq!(
        errno("wildcard bind over another process's listener", r3),
        Errno::AddrNotAvail
    );
    assert_eq!(errno("REUSEADDR bind beside a plain id", r4), Errno::AddrInUse);
    // The process is gone: both ports are free at once.
    for p in [bound, listening] {
        let l = id(None);
        l.bind_addr(at(p)).unwrap();
        l.listen(1).unwrap();
        l.destroy().unwrap();
    }
    x.destroy().unwrap();
}

#[test]
#[ignore = "runs as a child of two_live_ids_on_one_port_in_two_processes"]
fn child_holds_ports() {
    if std::env::var_os(CHILD_ENV).is_none() {
        eprintln!("skipped: runs as a child of two_live_ids_on_one_port_in_two_processes");
        return;
    }
    let (b, l) = (id(None), id(None));
    b.bind_addr(sa(&format!("127.0.0.1:{}", free_port()))).unwrap();
    println!("BOUND {}", b.src_port());
    l.bind_addr(sa(&format!("127.0.0.1:{}", free_port()))).unwrap();
    l.listen(1).unwrap();
    println!("LISTENING {}", l.src_port());
    std::thread::sleep(Duration::from_secs(20));
}

/// perftest `-R` listens again on its port just while its client connects: an iWARP connect
/// to this host that finds nothing listening is tried again for a short while (as the RoCE
/// side does with its REJ reason 8) instead of REJECTED at once.
#[test]
fn connect_to_this_host_waits_briefly_for_a_listener() {
    let _serial = serial();
    let port = free_port();
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    let (chs, chc) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let c = id(Some(&chc));
    c.resolve_addr(None, at, 2000).unwrap();
    drop(expect(&chc, EventType::AddrResolved));
    c.resolve_route(2000).unwrap();
    drop(expect(&chc, EventType::RouteResolved));
    let cs = side(&c);
    c.connect(&ConnParam::default()).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let l = id(Some(&chs));
    l.bind_addr(at).unwrap();
    l.listen(1).unwrap();
    let req = expect(&chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    let ss = side(&s);
    s.accept(None).unwrap();
    drop(expect(&chs, EventType::Established));
    drop(expect(&chc, EventType::Established));
    c.disconnect().unwrap();
    drop(expect(&chc, EventType::Disconnected));
    drop(expect(&chs, EventType::Disconnected));
    teardown(c, cs);
    teardown(s, ss);
    l.destroy().unwrap();
}
