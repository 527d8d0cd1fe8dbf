//! Connection-rate benchmark: N sequential softrdma-cm connection cycles on 127.0.0.1 (create
//! id, resolve address and route, PD/CQ/QP on both sides, connect, accept, ESTABLISHED on both
//! sides, disconnect, DISCONNECTED on both sides, destroy everything) against N raw TCP
//! connect+accept+close cycles in the same run. Prints a markdown table row.
//!
//! `cargo run --release -p softrdma-cm --example conn_rate [N]` (default N = 500). Over
//! 127.0.0.1 the default device is siw_lo; `SOFTRDMA_TRANSPORTS=roce` measures the IB CM
//! over rxe_lo instead.

use softrdma_cm::{CmEvent, CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma_verbs::{Cq, Pd, QpInitAttr};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

fn expect(ch: &EventChannel, want: EventType) -> CmEvent {
    let ev = ch
        .get_event(Some(WAIT))
        .unwrap_or_else(|e| panic!("waiting for {want}: {e}"));
    assert_eq!(ev.event, want, "status {} reason {:?}", ev.status, ev.reason);
    ev
}

fn qp_for(id: &CmId) -> (Pd, Cq) {
    let ctx = id.context().expect("device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let init = QpInitAttr::rc(&cq, 16, 16);
    id.create_qp(&pd, init).unwrap();
    (pd, cq)
}

fn teardown(id: CmId, (pd, cq): (Pd, Cq)) {
    id.destroy_qp().unwrap();
    id.destroy().unwrap();
    cq.destroy().unwrap();
    pd.dealloc().unwrap();
}

/// Time spent per phase over all cycles.
#[derive(Default)]
struct Phases {
    resolve: Duration,
    qp: Duration,
    request: Duration,
    establish: Duration,
    disconnect: Duration,
    destroy: Duration,
}

fn cm_cycle(chc: &EventChannel, chs: &EventChannel, addr: SocketAddr, ph: &mut Phases) {
    let t = Instant::now();
    let c = CmId::create(Some(chc), PortSpace::Tcp).unwrap();
    c.resolve_addr(None, addr, 2000).unwrap();
    drop(expect(chc, EventType::AddrResolved));
    c.resolve_route(2000).unwrap();
    drop(expect(chc, EventType::RouteResolved));
    let t1 = Instant::now();
    let cres = qp_for(&c);
    let t2 = Instant::now();
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(chs, EventType::ConnectRequest);
    let s = req.id.clone();
    drop(req);
    let t3 = Instant::now();
    let sres = qp_for(&s);
    let t4 = Instant::now();
    s.accept(None).unwrap();
    drop(expect(chs, EventType::Established));
    drop(expect(chc, EventType::Established));
    let t5 = Instant::now();
    // Both sides disconnect, as applications do: over RoCE the client's DISCONNECTED waits
    // for the DREP, which the server's CM sends when the server disconnects too.
    c.disconnect().unwrap();
    drop(expect(chs, EventType::Disconnected));
    s.disconnect().unwrap();
    drop(expect(chc, EventType::Disconnected));
    let t6 = Instant::now();
    teardown(c, cres);
    teardown(s, sres);
    let t7 = Instant::now();
    ph.resolve += t1 - t;
    ph.qp += (t2 - t1) + (t4 - t3);
    ph.request += t3 - t2;
    ph.establish += t5 - t4;
    ph.disconnect += t6 - t5;
    ph.destroy += t7 - t6;
}

fn tcp_cycle(l: &TcpListener, addr: SocketAddr) {
    let c = TcpStream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    drop(c);
    drop(s);
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("N must be a number"))
        .unwrap_or(500);

    let (chc, chs) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    let l = CmId::create(Some(&chs), PortSpace::Tcp).unwrap();
    l.bind_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    l.listen(128).unwrap();
    let addr = l.local_addr().unwrap();
    for _ in 0..10 {
        cm_cycle(&chc, &chs, addr, &mut Phases::default());
    }
    let mut ph = Phases::default();
    let t = Instant::now();
    for _ in 0..n {
        cm_cycle(&chc, &chs, addr, &mut ph);
    }
    let cm = t.elapsed();
    l.destroy().unwrap();

    let tl = TcpListener::bind("127.0.0.1:0").unwrap();
    let taddr = tl.local_addr().unwrap();
    for _ in 0..10 {
        tcp_cycle(&tl, taddr);
    }
    let t = Instant::now();
    for _ in 0..n {
        tcp_cycle(&tl, taddr);
    }
    let tcp = t.elapsed();

    let cm_rate = n as f64 / cm.as_secs_f64();
    let tcp_rate = n as f64 / tcp.as_secs_f64();
    println!("| cycles | softrdma-cm conn/s (µs/conn) | raw TCP conn/s (µs/conn) | TCP/CM ratio |");
    println!("|---|---|---|---|");
    println!(
        "| {n} | {cm_rate:.0} ({:.0}) | {tcp_rate:.0} ({:.0}) | {:.1}x |",
        cm.as_secs_f64() * 1e6 / n as f64,
        tcp.as_secs_f64() * 1e6 / n as f64,
        tcp_rate / cm_rate
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    eprintln!(
        "softrdma-cm µs per cycle: resolve addr+route {:.0}, PD/CQ/QP both sides {:.0}, \
         connect..CONNECT_REQUEST {:.0}, accept..ESTABLISHED (both) {:.0}, disconnect..DISCONNECTED {:.0}, destroy {:.0}",
        us(ph.resolve),
        us(ph.qp),
        us(ph.request),
        us(ph.establish),
        us(ph.disconnect),
        us(ph.destroy)
    );
}
