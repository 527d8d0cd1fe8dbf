//! The iWARP start-up rules against a raw TCP peer that behaves as Linux siw does (see the
//! `softrdma_iwarp::handshake` module documentation): no peer-to-peer mode by default, a
//! responder that sends first when peer-to-peer mode is off, one RTR when it is on, and no
//! READ that the application did not post.

mod common;
mod hostile;

use common::{endpoint, wait, Endpoint};
use hostile::*;
use softrdma_iwarp::handshake::{self, MpaParams, FIRST_SEND_GRACE, RTR_DELAY};
use softrdma_iwarp::{ConnEvent, ConnHandle, ConnectParams, Listener};
use softrdma_verbs::*;
use softrdma_wire::{DdpHeader, IrdOrd, MpaFrame, MpaKind, Opcode};
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn params(p2p: bool) -> ConnectParams {
    ConnectParams {
        crc: false,
        p2p,
        ..ConnectParams::default()
    }
}

fn request(p2p: bool, write_rtr: bool, read_rtr: bool) -> Vec<u8> {
    let mut f = request_frame(b"raw", false);
    f.enhanced = Some(IrdOrd {
        ird: 16,
        ord: 16,
        peer_to_peer: p2p,
        zero_length_rtr: false,
        write_rtr,
        read_rtr,
    });
    frame_bytes(&f)
}

/// A softrdma listener whose application accepts the raw peer's request and posts one
/// 16-byte SEND at once (server sends first). Returns the server endpoint and the raw peer
/// after it read the MPA Reply.
fn server_sends_first(req: &[u8]) -> (Endpoint, RawPeer, MpaFrame, (Listener, ConnHandle, Mr)) {
    let (l, rx) = Listener::bind_queue(any_port(), 4).unwrap();
    let mut peer = RawPeer::connect(l.local_addr());
    peer.send(req);
    let cr = rx.recv_timeout(BOUND).expect("connection request");
    let server = endpoint();
    let src = server.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    src.write(0, b"server-goes-1st!").unwrap();
    let handle = cr
        .accept(
            &server.qp,
            params(false),
            Arc::new(|e| eprintln!("server event: {e:?}")),
        )
        .expect("accept");
    server.qp.post_send_one(SendWr::send(7, vec![src.sge(0, 16)])).unwrap();
    let reply = peer.mpa_reply(BOUND).expect("MPA reply");
    assert!(!reply.reject);
    (server, peer, reply, (l, handle, src))
}

#[test]
fn responder_without_p2p_sends_first_to_an_initiator_that_never_sends() {
    let (server, mut peer, reply, _l) = server_sends_first(&request(false, false, false));
    let e = reply.enhanced.expect("enhanced reply");
    assert!(!e.peer_to_peer && !e.read_rtr && !e.write_rtr, "{e:?}");
    // The initiator sends nothing at all; the SEND still arrives.
    let (ulpdus, end) = peer.ulpdus(1, BOUND);
    assert_eq!(end, None, "no FPDU from the responder");
    assert_eq!(ulpdus.len(), 1);
    let h = header_of(&ulpdus[0]);
    assert_eq!(h.opcode, Opcode::Send);
    assert!(ulpdus[0].ends_with(b"server-goes-1st!"));
    let wc = wait(&server.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
}

#[test]
fn responder_in_p2p_mode_answers_one_rtr_type_and_waits_for_it() {
    // (request: WRITE offered, READ offered) -> the RTR the Reply names.
    for (write, read) in [(false, true), (true, true), (true, false)] {
        let (server, mut peer, reply, _l) = server_sends_first(&request(true, write, read));
        let e = reply.enhanced.expect("enhanced reply");
        assert!(e.peer_to_peer, "{e:?}");
        let rtr_is_write = write;
        assert_eq!((e.write_rtr, e.read_rtr), (rtr_is_write, !rtr_is_write), "{e:?}");
        // Nothing before the RTR.
        let (early, end) = peer.ulpdus(1, Duration::from_millis(300));
        assert!(early.is_empty(), "sent before the RTR: {early:02x?}");
        assert_eq!(end, Some(End::Open));
        let rtr = if rtr_is_write {
            segment(&write_hdr(0, 0), &[])
        } else {
            read_request(1, 0, 0, 0)
        };
        peer.send(&fpdu(&rtr, false));
        let want = if rtr_is_write { 1 } else { 2 };
        let (ulpdus, end) = peer.ulpdus(want, BOUND);
        assert_eq!(end, None, "({write}, {read}): {ulpdus:02x?}");
        let ops: Vec<Opcode> = ulpdus.iter().map(|u| header_of(u).opcode).collect();
        let expect = if rtr_is_write {
            vec![Opcode::Send]
        } else {
            vec![Opcode::ReadResponse, Opcode::Send]
        };
        assert_eq!(ops, expect);
        let wc = wait(&server.cq, 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
    }
}

/// A softrdma initiator connecting to a raw listener. Returns the client, the accepted raw
/// peer, the parsed MPA Request and the client's events.
fn raw_responder(p2p: bool) -> (Endpoint, RawPeer, MpaFrame, Arc<Mutex<Vec<ConnEvent>>>) {
    let l = TcpListener::bind(any_port()).unwrap();
    let client = endpoint();
    let events: Arc<Mutex<Vec<ConnEvent>>> = Arc::default();
    let ev = events.clone();
    softrdma_iwarp::connect(
        &client.qp,
        l.local_addr().unwrap(),
        params(p2p),
        Arc::new(move |e| ev.lock().unwrap().push(e)),
    )
    .unwrap();
    let (sock, _) = l.accept().unwrap();
    let mut peer = RawPeer::from_stream(sock);
    let deadline = Instant::now() + BOUND;
    let req = loop {
        if let Some((f, used)) = handshake::parse_request(&peer.buf).unwrap() {
            peer.buf.drain(..used);
            break f;
        }
        assert!(Instant::now() < deadline, "no MPA request");
        let mut chunk = [0u8; 1024];
        peer.sock.set_read_timeout(Some(BOUND)).unwrap();
        match peer.sock.read(&mut chunk) {
            Ok(0) | Err(_) => panic!("the initiator closed before its MPA request"),
            Ok(n) => peer.buf.extend_from_slice(&chunk[..n]),
        }
    };
    (client, peer, req, events)
}

fn established(events: &Mutex<Vec<ConnEvent>>) -> bool {
    eventually(BOUND, || {
        events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, ConnEvent::Established { .. }))
    })
}

#[test]
fn initiator_asks_no_p2p_sends_no_rtr_and_takes_fpdus_right_behind_the_reply() {
    let (client, mut peer, req, events) = raw_responder(false);
    let e = req.enhanced.expect("MPA v2 enhanced request");
    assert!(
        !e.peer_to_peer && !e.read_rtr && !e.write_rtr && !e.zero_length_rtr,
        "{e:?}"
    );
    let dst = client.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    client.qp.post_recv_one(3, dst.sge(0, 16)).unwrap();
    // As a Linux siw responder may: the Reply and the first SEND in one write.
    let mpa = MpaParams {
        ird: 16,
        ord: 16,
        ..MpaParams::default()
    };
    let (mut bytes, _) = handshake::build_accept(&req, &mpa).unwrap();
    bytes.extend(fpdu(
        &segment(&send_hdr(Opcode::Send, 1, 0), b"right-behind-rep"),
        false,
    ));
    peer.send(&bytes);
    assert!(established(&events));
    let wc = wait(&client.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (3, WcStatus::Success));
    assert_eq!(dst.to_vec(), b"right-behind-rep");
    // No RTR, no READ of any kind: the initiator had nothing to send.
    let (sent, end) = peer.ulpdus(1, Duration::from_millis(300));
    assert!(sent.is_empty(), "the initiator sent {sent:02x?}");
    assert_eq!(end, Some(End::Open));
}

#[test]
fn opt_in_p2p_initiator_sends_the_rtr_the_reply_names_after_the_delay() {
    for write in [true, false] {
        let (_client, mut peer, req, events) = raw_responder(true);
        let e = req.enhanced.expect("enhanced request");
        assert!(
            e.peer_to_peer && e.read_rtr && e.write_rtr && !e.zero_length_rtr,
            "{e:?}"
        );
        let reply = MpaFrame {
            kind: MpaKind::Reply,
            markers: false,
            crc: false,
            reject: false,
            revision: 2,
            enhanced: Some(IrdOrd {
                ird: 16,
                ord: 16,
                peer_to_peer: true,
                zero_length_rtr: false,
                write_rtr: write,
                read_rtr: !write,
            }),
            private_data: Vec::new(),
        };
        let sent_at = Instant::now();
        peer.send(&frame_bytes(&reply));
        let (ulpdus, end) = peer.ulpdus(1, BOUND);
        let took = sent_at.elapsed();
        assert_eq!(end, None);
        assert_eq!(ulpdus.len(), 1, "{ulpdus:02x?}");
        assert!(took >= RTR_DELAY, "RTR {took:?} after the Reply, before {RTR_DELAY:?}");
        let h = header_of(&ulpdus[0]);
        if write {
            assert_eq!(h.opcode, Opcode::RdmaWrite);
            assert!(matches!(h.ddp, DdpHeader::Tagged { .. }));
            assert_eq!(ulpdus[0].len(), h.len(), "zero-length WRITE");
        } else {
            assert_eq!(h.opcode, Opcode::ReadRequest);
            let rr = softrdma_wire::ReadRequest::parse(&ulpdus[0][h.len()..]).unwrap();
            assert_eq!(rr.size, 0, "zero-length READ");
        }
        assert!(established(&events));
    }
    // The grace a non-p2p responder keeps is shorter than a human notices.
    assert!(FIRST_SEND_GRACE < Duration::from_millis(100));
}
