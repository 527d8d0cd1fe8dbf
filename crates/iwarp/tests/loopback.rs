//! soft-iWARP over real TCP on 127.0.0.1: connection setup, data, rejects and failures.

mod common;

use common::{endpoint, wait, Endpoint};
use softrdma_iwarp::{connect_blocking, ConnEvent, ConnHandle, ConnectParams, Listener};
use softrdma_verbs::*;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

type Events = Arc<Mutex<Vec<ConnEvent>>>;

fn recorder() -> (Events, softrdma_iwarp::EventSink) {
    let ev: Events = Arc::default();
    let e2 = ev.clone();
    (ev, Arc::new(move |e| e2.lock().unwrap().push(e)))
}

/// Connects a fresh client endpoint to a fresh server endpoint. The server posts `recvs` receives of 64 KiB first.
fn connected(
    pd_client: &[u8],
    pd_server: &[u8],
) -> (Endpoint, ConnHandle, Endpoint, ConnHandle, Events, Listener, Vec<u8>) {
    let (l, rx) = Listener::bind_queue(any_port(), 8).unwrap();
    let server = endpoint();
    let client = endpoint();
    let addr = l.local_addr();
    let params = ConnectParams {
        private_data: pd_client.to_vec(),
        ..ConnectParams::default()
    };
    let qp = client.qp.clone();
    let t = std::thread::spawn(move || connect_blocking(&qp, addr, params));
    let req = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(req.private_data, pd_client);
    let (sev, sink) = recorder();
    let sparams = ConnectParams {
        private_data: pd_server.to_vec(),
        ..ConnectParams::default()
    };
    let sh = req.accept(&server.qp, sparams, sink).unwrap();
    let (ch, peer_pd) = t.join().unwrap().unwrap();
    (client, ch, server, sh, sev, l, peer_pd)
}

#[test]
fn connect_accept_exchange_private_data_and_move_data() {
    let (client, _ch, server, _sh, sev, _l, peer_pd) = connected(b"hello from client", b"hello from server");
    assert_eq!(peer_pd, b"hello from server");
    assert!(
        matches!(&sev.lock().unwrap()[0], ConnEvent::Established { private_data, .. } if private_data == b"hello from client")
    );
    assert_eq!(client.qp.state(), QpState::Rts);
    assert_eq!(server.qp.state(), QpState::Rts);

    let len = 3 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
    let src = client.pd.alloc_mr(len, Access::LOCAL_WRITE).unwrap();
    src.write(0, &data).unwrap();
    let dst = server
        .pd
        .alloc_mr(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    // SEND
    server.qp.post_recv_one(1, dst.sge(0, len as u32)).unwrap();
    client
        .qp
        .post_send_one(SendWr::send(10, vec![src.sge(0, len as u32)]))
        .unwrap();
    let r = wait(&server.cq, 1);
    assert_eq!((r[0].status, r[0].byte_len), (WcStatus::Success, len as u32));
    assert_eq!(dst.to_vec(), data);
    let s = wait(&client.cq, 1);
    assert_eq!((s[0].wr_id, s[0].status), (10, WcStatus::Success));
    // WRITE then READ back
    src.write(0, &vec![0x5a; len]).unwrap();
    client
        .qp
        .post_send_one(SendWr::write(11, vec![src.sge(0, len as u32)], dst.addr(), dst.rkey()))
        .unwrap();
    let back = client.pd.alloc_mr(len, Access::LOCAL_WRITE).unwrap();
    client
        .qp
        .post_send_one(SendWr::read(12, vec![back.sge(0, len as u32)], dst.addr(), dst.rkey()))
        .unwrap();
    let s = wait(&client.cq, 2);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(11, WcStatus::Success), (12, WcStatus::Success)]
    );
    assert_eq!(back.to_vec(), vec![0x5a; len]);
    assert_eq!(dst.to_vec(), vec![0x5a; len]);
}

#[test]
fn reject_carries_private_data_and_no_listener_is_refused() {
    let (l, rx) = Listener::bind_queue(any_port(), 8).unwrap();
    let client = endpoint();
    let addr = l.local_addr();
    let qp = client.qp.clone();
    let t = std::thread::spawn(move || connect_blocking(&qp, addr, ConnectParams::default()));
    let req = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    req.reject(b"not today").unwrap();
    let err = t.join().unwrap().unwrap_err();
    assert_eq!(err.errno, Errno::ConnRefused, "{err}");

    drop(l);
    let client = endpoint();
    let started = std::time::Instant::now();
    let err = connect_blocking(&client.qp, addr, ConnectParams::default()).unwrap_err();
    assert_eq!(err.errno, Errno::ConnRefused, "{err}");
    assert!(err.msg.contains(&addr.to_string()), "{err}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn oversized_private_data_is_einval() {
    let client = endpoint();
    let params = ConnectParams {
        private_data: vec![0; 513],
        ..ConnectParams::default()
    };
    let err = connect_blocking(&client.qp, "127.0.0.1:9".parse().unwrap(), params).unwrap_err();
    assert_eq!(err.errno, Errno::Inval);
    assert!(err.msg.contains("513") && err.msg.contains("512"), "{err}");
    // 512 bytes is allowed (sent as MPA revision 1).
    let (_c, _ch, _s, _sh, sev, _l, _) = connected(&[9u8; 512], b"");
    assert!(
        matches!(&sev.lock().unwrap()[0], ConnEvent::Established { private_data, .. } if private_data.len() == 512)
    );
}

#[test]
fn peer_disconnect_flushes_outstanding_work() {
    let (client, ch, server, _sh, sev, _l, _) = connected(b"", b"");
    let dst = server.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    server.qp.post_recv_one(1, dst.sge(0, 64)).unwrap();
    server.qp.post_recv_one(2, dst.sge(0, 64)).unwrap();
    ch.disconnect();
    let r = wait(&server.cq, 2);
    assert!(r.iter().all(|w| w.status == WcStatus::WrFlushErr), "{r:?}");
    // The close that flushes and moves the QP to ERR emits DISCONNECTED just after: wait for both.
    let disconnected = || {
        sev.lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, ConnEvent::Disconnected { .. }))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while (server.qp.state() != QpState::Err || !disconnected()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(server.qp.state(), QpState::Err);
    assert!(disconnected());
    // Posting after the error completes with a flush.
    server.qp.post_recv_one(3, dst.sge(0, 64)).unwrap();
    assert_eq!(wait(&server.cq, 1)[0].status, WcStatus::WrFlushErr);
    assert_eq!(client.qp.state(), QpState::Err);
}
