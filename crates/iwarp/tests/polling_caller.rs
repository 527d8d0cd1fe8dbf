//! A thread that polls a CQ receives on soft-iWARP connections itself: one non-blocking
//! round of the reactor per empty poll (`driver/caller.rs`). Its own process: the test takes
//! the sockets from the progress thread, which would stall other tests' connections.

mod common;

use common::endpoint;
use softrdma_iwarp::{connect_blocking, ConnectParams, Listener};
use softrdma_verbs::progress::Reactor;
use softrdma_verbs::*;
use std::time::{Duration, Instant};

#[test]
fn a_polling_caller_receives_its_send_while_the_progress_thread_is_off_the_sockets() {
    let (l, rx) = Listener::bind_queue("127.0.0.1:0".parse().unwrap(), 8).unwrap();
    let server = endpoint();
    let client = endpoint();
    let addr = l.local_addr();
    let qp = client.qp.clone();
    let t = std::thread::spawn(move || connect_blocking(&qp, addr, ConnectParams::default()));
    let req = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let _sh = req
        .accept(&server.qp, ConnectParams::default(), std::sync::Arc::new(|_| {}))
        .unwrap();
    let (_ch, _) = t.join().unwrap().unwrap();

    let dst = server.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let src = client.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    src.write(0, b"polled").unwrap();
    server.qp.post_recv_one(1, dst.sge(0, 64)).unwrap();

    // While this thread drives, socket readiness no longer wakes the progress thread: only a
    // round on this thread can read the SEND.
    let reactor = Reactor::existing().expect("the connections started the reactor");
    let driving = reactor.drive();
    client.qp.post_send_one(SendWr::send(10, vec![src.sge(0, 6)])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let wc = loop {
        if let Some(wc) = server.cq.poll_one() {
            break wc;
        }
        assert!(Instant::now() < deadline, "the polls never received the SEND");
    };
    drop(driving);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (1, WcStatus::Success, 6));
    assert_eq!(&dst.to_vec()[..6], b"polled");
}
