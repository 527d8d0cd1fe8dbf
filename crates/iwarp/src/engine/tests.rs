//! Two engines on [`PlainQp`] hosts wired back to back, no sockets, no device, PD or CQ:
//! every data-path and error case.

use super::plain_host_tests::{bytes, sge, statuses};
use super::{Engine, EngineConfig, Phase, Rtr};
use softrdma_verbs::mr::MrInner;
use softrdma_verbs::qp_host::{PlainQp, PlainSrq, PLAIN_PD};
use softrdma_verbs::*;
use std::sync::Arc;

/// A QP host in RTS (as `connect_established` leaves it: ORD and IRD 4) and its engine.
struct Side {
    qp: Arc<PlainQp>,
    engine: Engine,
}

fn side(initiator: bool, srq: bool, access: Access) -> (Side, Option<Arc<PlainSrq>>) {
    side_rtr(initiator, srq, access, None)
}

fn side_rtr(initiator: bool, srq: bool, access: Access, rtr: Option<Rtr>) -> (Side, Option<Arc<PlainSrq>>) {
    let attr = QpAttr {
        qp_access_flags: access,
        port_num: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpAttr::default()
    };
    let qpn = if initiator { 3 } else { 4 };
    let srq = srq.then(PlainSrq::new);
    let qp = match &srq {
        Some(srq) => PlainQp::with_srq(qpn, QpState::Rts, attr, srq.clone()),
        None => PlainQp::new(qpn, QpState::Rts, attr),
    };
    let cfg = EngineConfig {
        crc: true,
        ird: 4,
        ord: 4,
        initiator,
        rtr,
    };
    let mut engine = Engine::new(qp.clone(), cfg);
    if initiator && rtr.is_none() {
        // The driver's hold after the MPA Reply (handshake::RTR_DELAY) has passed.
        engine.release_tx();
    }
    (Side { qp, engine }, srq)
}

fn pair() -> (Side, Side) {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    (side(true, false, all).0, side(false, false, all).0)
}

/// Moves everything `x` has to send into `y`. Returns bytes moved.
fn transfer(x: &mut Side, y: &mut Side) -> usize {
    stream(&mut x.engine, &mut y.engine)
}

/// Moves everything engine `x` has to send into engine `y`'s receive buffer, as a socket
/// pair would. Returns bytes moved.
pub(super) fn stream(x: &mut Engine, y: &mut Engine) -> usize {
    x.fill_tx();
    let out = x.tx_bytes();
    deliver(y, &out);
    x.tx_consumed(out.len());
    report(x);
    report(y);
    out.len()
}

/// Hands what engine `e` reported (completions, flushes, async events) to its QP host, as
/// the driver does whenever it lets go of a connection.
pub(super) fn report(e: &mut Engine) {
    e.take_outputs().deliver(&**e.qp());
}

/// Hands `bytes` to engine `y` through its receive buffer, as reads from a socket would.
pub(super) fn deliver(y: &mut Engine, bytes: &[u8]) {
    let mut off = 0;
    while off < bytes.len() {
        let space = y.rx_space();
        let n = space.len().min(bytes.len() - off);
        space[..n].copy_from_slice(&bytes[off..off + n]);
        y.rx_commit(n);
        off += n;
    }
}

/// Moves bytes both ways until nothing moves. Returns bytes moved.
fn pump(a: &mut Side, b: &mut Side) -> usize {
    let mut moved = 0;
    for _ in 0..100_000 {
        let progress = transfer(a, b) + transfer(b, a);
        moved += progress;
        if progress == 0 {
            break;
        }
    }
    moved
}

impl Side {
    /// The completions reported since the last call: sends, then receives.
    fn polls(&mut self) -> Vec<WorkCompletion> {
        let mut wcs = self.sends();
        wcs.extend(self.recvs());
        wcs
    }

    /// The send completions reported since the last call.
    fn sends(&mut self) -> Vec<WorkCompletion> {
        report(&mut self.engine);
        self.qp.take_send_wcs()
    }

    /// The receive completions reported since the last call.
    fn recvs(&mut self) -> Vec<WorkCompletion> {
        report(&mut self.engine);
        self.qp.take_recv_wcs()
    }
}

/// Posts `wrs` in order.
fn post_all(qp: &PlainQp, wrs: impl IntoIterator<Item = SendWr>) {
    for wr in wrs {
        qp.post_send(wr);
    }
}

/// Posts `wrs` in order.
fn post_recvs(qp: &PlainQp, wrs: impl IntoIterator<Item = RecvWr>) {
    for wr in wrs {
        qp.post_recv(wr);
    }
}

/// A receive WR of one SGE.
fn recv(wr_id: u64, sge: Sge) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: vec![sge],
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn send_recv_multi_segment_and_sges() {
    let (mut a, mut b) = pair();
    let len = 200_000;
    let src = a.qp.register(len, Access::LOCAL_WRITE);
    assert!(src.region.write(0, &pattern(len, 3)));
    let dst = b.qp.register(len + 10, Access::LOCAL_WRITE);
    post_recvs(
        &b.qp,
        [RecvWr {
            wr_id: 7,
            sg_list: vec![sge(&dst, 0, 100_000), sge(&dst, 100_000, 100_010)],
        }],
    );
    a.qp.post_send(SendWr::send(1, vec![sge(&src, 0, 150_000), sge(&src, 150_000, 50_000)]));
    pump(&mut a, &mut b);
    let rc = b.polls();
    assert_eq!(rc.len(), 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].opcode, rc[0].byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, len as u32)
    );
    assert_eq!(&bytes(&dst)[..len], &pattern(len, 3)[..]);
    let sc = a.polls();
    assert_eq!(sc.len(), 1, "{sc:?}");
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
}

#[test]
fn write_then_read_back_one_mib() {
    let (mut a, mut b) = pair();
    let len = 1 << 20;
    let local = a.qp.register(len, Access::LOCAL_WRITE);
    assert!(local.region.write(0, &pattern(len, 9)));
    let remote =
        b.qp.register(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ);
    a.qp.post_send(SendWr::write(
        1,
        vec![sge(&local, 0, len as u32)],
        remote.region.addr(),
        remote.rkey,
    ));
    pump(&mut a, &mut b);
    assert_eq!(bytes(&remote), pattern(len, 9));
    let back = a.qp.register(len, Access::LOCAL_WRITE);
    a.qp.post_send(SendWr::read(
        2,
        vec![sge(&back, 0, len as u32)],
        remote.region.addr(),
        remote.rkey,
    ));
    pump(&mut a, &mut b);
    assert_eq!(bytes(&back), pattern(len, 9));
    let wcs = a.polls();
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::RdmaRead)
        ]
    );
    assert_eq!(a.qp.state(), QpState::Rts);
}

/// A remote access error: the peer Terminates, both QPs end in ERR, and the target buffer is
/// byte-for-byte unchanged. `want`: the requester's completions for `wr` and a SEND posted
/// behind it. A failing READ completes with the Terminate's status and the SEND behind it
/// flushes; a failing WRITE had completed (successfully) when the socket took its bytes, as
/// on Linux siw, and so had the SEND. Work posted afterwards flushes.
fn expect_remote_error(mut a: Side, mut b: Side, remote: &MrInner, wr: SendWr, want: [WcStatus; 2]) {
    let before = bytes(remote);
    let id = wr.wr_id;
    post_all(&a.qp, [wr, SendWr::send(99, vec![])]);
    pump(&mut a, &mut b);
    let wcs = a.polls();
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(id, want[0]), (99, want[1])]);
    if want[0] != WcStatus::Success {
        assert_ne!(wcs[0].vendor_err, 0);
    }
    assert_eq!(bytes(remote), before, "target memory changed");
    // As the driver does once the engine closed.
    a.qp.detach();
    a.qp.post_send(SendWr::send(100, vec![]));
    let late: Vec<_> = statuses(a.polls());
    assert_eq!(late, vec![(100, WcStatus::WrFlushErr)]);
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
    assert_eq!(b.engine.phase(), Phase::Terminating);
    assert_eq!(b.engine.stats.terminates_sent, 1);
    assert_eq!(a.engine.stats.terminates_received, 1);
}

#[test]
fn write_with_bad_rkey_is_remote_access_error() {
    let (a, b) = pair();
    let src = a.qp.register(64, Access::LOCAL_WRITE);
    assert!(src.region.write(0, &[0xAA; 64]));
    let remote = b.qp.register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wr = SendWr::write(5, vec![sge(&src, 0, 64)], remote.region.addr(), remote.rkey ^ 0x100);
    expect_remote_error(a, b, &remote, wr, [WcStatus::Success, WcStatus::Success]);
}

#[test]
fn write_out_of_bounds_is_remote_access_error() {
    let (a, b) = pair();
    let src = a.qp.register(4096, Access::LOCAL_WRITE);
    let remote = b.qp.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wr = SendWr::write(5, vec![sge(&src, 0, 4096)], remote.region.addr() + 100, remote.rkey);
    expect_remote_error(a, b, &remote, wr, [WcStatus::Success, WcStatus::Success]);
}

#[test]
fn write_without_remote_write_flag_is_remote_access_error() {
    let (a, b) = pair();
    let src = a.qp.register(64, Access::LOCAL_WRITE);
    let remote = b.qp.register(64, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let wr = SendWr::write(5, vec![sge(&src, 0, 64)], remote.region.addr(), remote.rkey);
    expect_remote_error(a, b, &remote, wr, [WcStatus::Success, WcStatus::Success]);
}

#[test]
fn write_to_deregistered_and_foreign_pd_mr_fails() {
    let (a, b) = pair();
    let src = a.qp.register(64, Access::LOCAL_WRITE);
    let remote = b.qp.register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let gone = b.qp.register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (addr, rkey) = (gone.region.addr(), gone.rkey);
    b.qp.deregister(gone.lkey);
    expect_remote_error(
        a,
        b,
        &remote,
        SendWr::write(5, vec![sge(&src, 0, 64)], addr, rkey),
        [WcStatus::Success, WcStatus::Success],
    );

    let (a, b) = pair();
    let src = a.qp.register(64, Access::LOCAL_WRITE);
    let foreign =
        b.qp.register_in(PLAIN_PD + 1, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let wr = SendWr::write(5, vec![sge(&src, 0, 64)], foreign.region.addr(), foreign.rkey);
    expect_remote_error(a, b, &foreign, wr, [WcStatus::Success, WcStatus::Success]);
}

#[test]
fn read_errors_are_remote_access_errors() {
    let (a, b) = pair();
    let sink = a.qp.register(8192, Access::LOCAL_WRITE);
    let remote = b.qp.register(4096, Access::LOCAL_WRITE | Access::REMOTE_READ);
    // Larger than the MR.
    let wr = SendWr::read(5, vec![sge(&sink, 0, 8192)], remote.region.addr(), remote.rkey);
    expect_remote_error(a, b, &remote, wr, [WcStatus::RemAccessErr, WcStatus::WrFlushErr]);
    let (a, b) = pair();
    let sink = a.qp.register(64, Access::LOCAL_WRITE);
    let remote = b.qp.register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    // No REMOTE_READ.
    let wr = SendWr::read(6, vec![sge(&sink, 0, 64)], remote.region.addr(), remote.rkey);
    expect_remote_error(a, b, &remote, wr, [WcStatus::RemAccessErr, WcStatus::WrFlushErr]);
}

#[test]
fn recv_too_small_is_loc_len_err_and_rem_inv_req() {
    let (mut a, mut b) = pair();
    let src = a.qp.register(100, Access::LOCAL_WRITE);
    let dst = b.qp.register(50, Access::LOCAL_WRITE);
    post_recvs(
        &b.qp,
        [
            RecvWr {
                wr_id: 1,
                sg_list: vec![sge(&dst, 0, 50)],
            },
            RecvWr {
                wr_id: 2,
                sg_list: vec![sge(&dst, 0, 50)],
            },
        ],
    );
    a.qp.post_send(SendWr::send(10, vec![sge(&src, 0, 100)]));
    pump(&mut a, &mut b);
    let r: Vec<_> = statuses(b.polls());
    assert_eq!(r, vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]);
    // The SEND completed when the socket took it (as on Linux siw); the Terminate then moved
    // the QP to ERR.
    let s: Vec<_> = statuses(a.polls());
    assert_eq!(s, vec![(10, WcStatus::Success)]);
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a.engine.stats.terminates_received, 1);
    assert_eq!(bytes(&dst), vec![0u8; 50], "nothing placed past the checks");
}

#[test]
fn send_without_recv_terminates_per_rfc5041() {
    let (mut a, mut b) = pair();
    let src = a.qp.register(16, Access::LOCAL_WRITE);
    a.qp.post_send(SendWr::send(10, vec![sge(&src, 0, 16)]));
    transfer(&mut a, &mut b);
    // DDP layer (1), untagged buffer error (2), invalid MSN - no buffer available (2).
    let t = queued_terminate(&b.engine);
    assert_eq!((t.layer as u8, t.etype, t.ecode), (1, 2, 2), "{}", t.describe());
    pump(&mut a, &mut b);
    let s: Vec<_> = statuses(a.polls());
    assert_eq!(s, vec![(10, WcStatus::Success)]);
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn peer_loss_flushes_everything() {
    let (mut a, mut b) = pair();
    let src = a.qp.register(16, Access::LOCAL_WRITE);
    let dst = b.qp.register(16, Access::LOCAL_WRITE);
    b.qp.post_recv(recv(3, sge(&dst, 0, 16)));
    a.qp.post_send(SendWr::send(10, vec![sge(&src, 0, 16)]));
    a.engine.fill_tx(); // sent but never confirmed
    a.qp.post_send(SendWr::send(11, vec![sge(&src, 0, 16)]));
    a.engine.peer_closed("connection reset");
    b.engine.peer_closed("connection reset");
    let s: Vec<_> = statuses(a.polls());
    assert_eq!(s, vec![(10, WcStatus::WrFlushErr), (11, WcStatus::WrFlushErr)]);
    let r: Vec<_> = statuses(b.polls());
    assert_eq!(r, vec![(3, WcStatus::WrFlushErr)]);
    assert_eq!(a.qp.state(), QpState::Err);
    let _ = pump(&mut a, &mut b);
}

#[test]
fn srq_inline_and_send_with_invalidate() {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (mut a, _) = side(true, false, all);
    let (mut b, srq) = side(false, true, all);
    let srq = srq.unwrap();
    let dst = b.qp.register(64, Access::LOCAL_WRITE);
    srq.post_recv_one(1, sge(&dst, 0, 32));
    srq.post_recv_one(2, sge(&dst, 32, 32));
    let victim = b.qp.register(16, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let src = a.qp.register(16, Access::LOCAL_WRITE);
    assert!(src.region.write(0, b"inline-hello!!!!"));
    let mut inline = SendWr::send(10, vec![sge(&src, 0, 16)]);
    inline.flags = SendFlags::SIGNALED | SendFlags::INLINE;
    let mut inv = SendWr::send(11, vec![sge(&src, 0, 4)]);
    inv.opcode = Some(WrOpcode::SendWithInv);
    inv.invalidate_rkey = victim.rkey;
    post_all(&a.qp, [inline, inv]);
    pump(&mut a, &mut b);
    let r = b.polls();
    assert_eq!(r.len(), 2);
    assert_eq!(&bytes(&dst)[..16], b"inline-hello!!!!");
    assert_eq!(
        r[1].wc_flags & softrdma_verbs::wr::wc_flags::WITH_INV,
        softrdma_verbs::wr::wc_flags::WITH_INV
    );
    assert_eq!(r[1].imm_data, victim.rkey);
    // The invalidated rkey now refuses remote writes.
    let w = SendWr::write(12, vec![sge(&src, 0, 4)], victim.region.addr(), victim.rkey);
    a.qp.post_send(w);
    pump(&mut a, &mut b);
    let s: Vec<_> = statuses(a.polls());
    // WRITE 12 completed when the socket took it; the peer's Terminate then moved the QP to ERR.
    assert_eq!(
        s,
        vec![
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success)
        ]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a.engine.stats.terminates_received, 1);
}

#[test]
fn bad_lkey_is_local_protection_error() {
    let (mut a, mut b) = pair();
    let sge = Sge {
        addr: 0x1000,
        length: 8,
        lkey: 0xdead_beef,
    };
    post_all(&a.qp, [SendWr::send(1, vec![sge]), SendWr::send(2, vec![])]);
    pump(&mut a, &mut b);
    let s: Vec<_> = statuses(a.polls());
    assert_eq!(s, vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]);
}

#[test]
fn corrupted_crc_terminates_and_flushes() {
    let (mut a, mut b) = pair();
    let src = a.qp.register(16, Access::LOCAL_WRITE);
    let dst = b.qp.register(16, Access::LOCAL_WRITE);
    b.qp.post_recv(recv(3, sge(&dst, 0, 16)));
    a.qp.post_send(SendWr::send(10, vec![sge(&src, 0, 16)]));
    a.engine.fill_tx();
    let mut out = a.engine.tx_bytes();
    let n = out.len();
    out[n - 10] ^= 0xff;
    b.engine.rx_space()[..n].copy_from_slice(&out);
    b.engine.rx_commit(n);
    assert_eq!(b.engine.phase(), Phase::Terminating);
    assert_eq!(bytes(&dst), vec![0u8; 16]);
}

/// The one Terminate an engine has queued.
fn queued_terminate(e: &Engine) -> softrdma_wire::Terminate {
    let owned = e.tx_bytes();
    let out = &owned[..];
    let f = softrdma_wire::parse_fpdu(out, true).unwrap().expect("one whole FPDU");
    assert_eq!(f.wire_len, out.len(), "only the Terminate is queued");
    let (h, n) = softrdma_wire::SegmentHeader::parse(f.ulpdu).unwrap();
    assert_eq!(h.opcode, softrdma_wire::Opcode::Terminate);
    softrdma_wire::Terminate::parse(&f.ulpdu[n..]).unwrap()
}

#[test]
fn bad_ddp_version_terminates_with_the_code_of_the_segments_buffer_model() {
    use softrdma_wire::{term, DdpHeader, Opcode, SegmentHeader, TermLayer};
    let write = SegmentHeader {
        last: true,
        opcode: Opcode::RdmaWrite,
        ddp: DdpHeader::Tagged {
            stag: 0x1234_5600,
            to: 0,
        },
    };
    let send = SegmentHeader {
        last: true,
        opcode: Opcode::Send,
        ddp: DdpHeader::Untagged {
            inval_stag: 0,
            qn: softrdma_wire::QN_SEND,
            msn: 1,
            mo: 0,
        },
    };
    let cases = [
        (write, term::ddp::TAGGED_BUFFER, term::ddp::tagged::INVALID_DDP_VERSION),
        (
            send,
            term::ddp::UNTAGGED_BUFFER,
            term::ddp::untagged::INVALID_DDP_VERSION,
        ),
    ];
    for (hdr, etype, ecode) in cases {
        let (_a, mut b) = pair();
        let mut ulpdu = Vec::new();
        hdr.emit(&mut ulpdu);
        ulpdu.extend_from_slice(b"payload");
        ulpdu[0] = (ulpdu[0] & !0x03) | 2; // DDP version 2
        let mut f = Vec::new();
        softrdma_wire::emit_fpdu(&[&ulpdu], true, &mut f).unwrap();
        b.engine.rx_space()[..f.len()].copy_from_slice(&f);
        b.engine.rx_commit(f.len());
        assert_eq!(b.engine.phase(), Phase::Terminating);
        let t = queued_terminate(&b.engine);
        assert_eq!(
            (t.layer, t.etype, t.ecode),
            (TermLayer::Ddp, etype, ecode),
            "{}",
            t.describe()
        );
        assert_eq!(b.qp.state(), QpState::Err);
    }
}

/// The opcodes of every FPDU in `bytes` (whole FPDUs, CRC on).
fn opcodes(bytes: &[u8]) -> Vec<softrdma_wire::Opcode> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(f) = softrdma_wire::parse_fpdu(&bytes[at..], true).unwrap() {
        out.push(softrdma_wire::SegmentHeader::parse(f.ulpdu).unwrap().0.opcode);
        at += f.wire_len;
    }
    assert_eq!(at, bytes.len(), "whole FPDUs only");
    out
}

/// Like [`transfer`], recording what `x` sent.
fn transfer_logged(x: &mut Side, y: &mut Side, log: &mut Vec<u8>) -> usize {
    x.engine.fill_tx();
    log.extend_from_slice(&x.engine.tx_bytes());
    transfer(x, y)
}

#[test]
fn send_and_write_traffic_puts_no_read_request_on_the_wire() {
    let (mut a, mut b) = pair();
    // More than the 4 MiB after which fence READs used to be sent, in SENDs and WRITEs.
    let len = 1 << 20;
    let src = a.qp.register(len, Access::LOCAL_WRITE);
    let dst = b.qp.register(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    for i in 0..6u64 {
        b.qp.post_recv(recv(i, sge(&dst, 0, len as u32)));
        let wrs = [
            SendWr::send(i, vec![sge(&src, 0, len as u32)]),
            SendWr::write(100 + i, vec![sge(&src, 0, len as u32)], dst.region.addr(), dst.rkey),
        ];
        post_all(&a.qp, wrs);
    }
    let (mut sent_a, mut sent_b) = (Vec::new(), Vec::new());
    for _ in 0..10_000 {
        if transfer_logged(&mut a, &mut b, &mut sent_a) + transfer_logged(&mut b, &mut a, &mut sent_b) == 0 {
            break;
        }
    }
    let ops = opcodes(&sent_a);
    assert!(!ops.is_empty());
    assert!(
        ops.iter()
            .all(|o| matches!(o, softrdma_wire::Opcode::Send | softrdma_wire::Opcode::RdmaWrite)),
        "{ops:?}"
    );
    assert!(sent_b.is_empty(), "the responder sent {} bytes", sent_b.len());
    assert_eq!(a.polls().len(), 12);
    assert_eq!(b.polls().len(), 6);
}

#[test]
fn a_send_completes_when_the_socket_took_its_bytes_before_any_reply() {
    let (mut a, b) = pair();
    let src = a.qp.register(200_000, Access::LOCAL_WRITE);
    a.qp.post_send(SendWr::send(1, vec![sge(&src, 0, 200_000)]));
    a.engine.fill_tx();
    let n = a.engine.tx_queued();
    assert!(n > 200_000);
    assert!(a.polls().is_empty(), "completed before the socket took it");
    a.engine.tx_consumed(n - 1);
    assert!(a.polls().is_empty(), "completed with its last byte still queued");
    a.engine.tx_consumed(1);
    let s: Vec<_> = a.polls().iter().map(|w| (w.wr_id, w.status, w.byte_len)).collect();
    assert_eq!(s, vec![(1, WcStatus::Success, 200_000)]);
    // Nothing was ever delivered to the peer, and nothing else went out.
    assert_eq!(b.engine.stats.rx_fpdus, 0);
    a.engine.fill_tx();
    assert!(a.engine.tx_queued() == 0);
    assert_eq!(a.qp.state(), QpState::Rts);
}

#[test]
fn completions_stay_in_posting_order_behind_a_read() {
    let (mut a, mut b) = pair();
    let local = a.qp.register(64, Access::LOCAL_WRITE);
    let remote = b.qp.register(64, Access::REMOTE_READ | Access::LOCAL_WRITE);
    let dst = b.qp.register(64, Access::LOCAL_WRITE);
    b.qp.post_recv(recv(9, sge(&dst, 0, 64)));
    post_all(
        &a.qp,
        [
            SendWr::read(1, vec![sge(&local, 0, 64)], remote.region.addr(), remote.rkey),
            SendWr::send(2, vec![sge(&local, 0, 8)]),
        ],
    );
    a.engine.fill_tx();
    let n = a.engine.tx_queued();
    let bytes = a.engine.tx_bytes();
    a.engine.tx_consumed(n);
    assert!(a.polls().is_empty(), "the SEND completed before the READ ahead of it");
    b.engine.rx_space()[..n].copy_from_slice(&bytes);
    b.engine.rx_commit(n);
    transfer(&mut b, &mut a);
    let s: Vec<_> = statuses(a.polls());
    assert_eq!(s, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn a_send_not_taken_by_the_socket_flushes_when_the_stream_breaks() {
    let (mut a, _b) = pair();
    let src = a.qp.register(100_000, Access::LOCAL_WRITE);
    post_all(
        &a.qp,
        [
            SendWr::send(1, vec![sge(&src, 0, 16)]),
            SendWr::send(2, vec![sge(&src, 0, 100_000)]),
            SendWr::send(3, vec![sge(&src, 0, 16)]),
        ],
    );
    a.engine.fill_tx();
    // The socket takes SEND 1 and part of SEND 2, then the connection breaks.
    a.engine.tx_consumed(1000);
    a.engine.peer_closed("connection reset");
    let s: Vec<_> = statuses(a.polls());
    assert_eq!(
        s,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
}

#[test]
fn non_p2p_responder_sends_first_once_released() {
    // Server-sends-first (ucmatose): a Linux initiator never sends an RTR.
    let (mut a, mut b) = pair();
    let src = b.qp.register(32, Access::LOCAL_WRITE);
    let dst = a.qp.register(32, Access::LOCAL_WRITE);
    a.qp.post_recv(recv(5, sge(&dst, 0, 32)));
    b.qp.post_send(SendWr::send(6, vec![sge(&src, 0, 32)]));
    // Held until the driver's grace after the Reply ...
    assert!(b.engine.tx_release_pending());
    b.engine.fill_tx();
    assert!(b.engine.tx_queued() == 0);
    // ... then sent with nothing received from the initiator.
    b.engine.release_tx();
    assert!(transfer(&mut b, &mut a) > 0);
    assert_eq!(b.engine.stats.rx_fpdus, 0);
    let r: Vec<_> = statuses(a.polls());
    assert_eq!(r, vec![(5, WcStatus::Success)]);
    let s: Vec<_> = statuses(b.polls());
    assert_eq!(s, vec![(6, WcStatus::Success)]);
    // The initiator without RTR (released by `side`) owes none.
    assert!(!a.engine.tx_release_pending());
}

#[test]
fn non_p2p_initiator_holds_its_first_fpdu_until_released_or_answered() {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    for answered in [false, true] {
        let (mut a, _) = side(true, false, all);
        // A fresh initiator engine, as the driver gets it after the MPA Reply.
        let cfg = EngineConfig {
            crc: true,
            ird: 4,
            ord: 4,
            initiator: true,
            rtr: None,
        };
        a.engine = Engine::new(a.qp.clone(), cfg);
        let (mut b, _) = side(false, false, all);
        let src = a.qp.register(8, Access::LOCAL_WRITE);
        let dst = b.qp.register(8, Access::LOCAL_WRITE);
        b.qp.post_recv(recv(1, sge(&dst, 0, 8)));
        a.qp.post_send(SendWr::send(2, vec![sge(&src, 0, 8)]));
        // Held: a Linux siw responder may not read its socket yet (handshake docs).
        assert!(a.engine.tx_release_pending());
        a.engine.fill_tx();
        assert!(a.engine.tx_queued() == 0, "sent inside the accept window");
        if answered {
            // The responder's first FPDU shows its receive path is up: no wait is needed.
            let bsrc = b.qp.register(8, Access::LOCAL_WRITE);
            let adst = a.qp.register(8, Access::LOCAL_WRITE);
            a.qp.post_recv(recv(3, sge(&adst, 0, 8)));
            b.qp.post_send(SendWr::send(4, vec![sge(&bsrc, 0, 8)]));
            b.engine.release_tx();
            assert!(transfer(&mut b, &mut a) > 0);
            assert!(!a.engine.tx_release_pending());
        } else {
            a.engine.release_tx();
        }
        assert!(transfer(&mut a, &mut b) > 0, "answered={answered}");
        let r: Vec<_> = statuses(b.polls());
        assert!(r.contains(&(1, WcStatus::Success)), "answered={answered}: {r:?}");
    }
}

#[test]
fn p2p_responder_waits_for_the_rtr_of_either_type() {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    for rtr in [Rtr::Write, Rtr::Read] {
        let (mut a, _) = side_rtr(true, false, all, Some(rtr));
        let (mut b, _) = side_rtr(false, false, all, Some(rtr));
        let src = b.qp.register(8, Access::LOCAL_WRITE);
        let dst = a.qp.register(8, Access::LOCAL_WRITE);
        a.qp.post_recv(recv(5, sge(&dst, 0, 8)));
        b.qp.post_send(SendWr::send(6, vec![sge(&src, 0, 8)]));
        // The responder's release does not replace the RTR.
        assert!(!b.engine.tx_release_pending());
        b.engine.release_tx();
        b.engine.fill_tx();
        assert!(b.engine.tx_queued() == 0, "{rtr:?}: sent before the RTR");
        // The initiator's RTR is held until its driver releases it, then is its first FPDU.
        assert!(a.engine.tx_release_pending());
        a.engine.fill_tx();
        assert!(a.engine.tx_queued() == 0);
        a.engine.release_tx();
        let mut log = Vec::new();
        transfer_logged(&mut a, &mut b, &mut log);
        let want = match rtr {
            Rtr::Write => softrdma_wire::Opcode::RdmaWrite,
            Rtr::Read => softrdma_wire::Opcode::ReadRequest,
        };
        assert_eq!(opcodes(&log), vec![want], "{rtr:?}");
        pump(&mut a, &mut b);
        let r: Vec<_> = statuses(a.polls());
        assert_eq!(r, vec![(5, WcStatus::Success)], "{rtr:?}: the RTR completes nothing");
        assert_eq!(b.polls().len(), 1);
        assert_eq!(a.qp.state(), QpState::Rts);
        assert_eq!(b.qp.state(), QpState::Rts);
    }
}

/// Linux siw (x86) refuses a READ with a bad source STag with a Terminate in its
/// little-endian bit order whose copied Read Request carries the READ's length as its MSN
/// (captured by kernel_peer `peer_error::iw-bad-rkey`). The READ still fails with
/// REM_ACCESS_ERR, not a flush, and the SEND behind it flushes.
#[test]
fn a_linux_siw_terminate_fails_the_read_it_names() {
    use softrdma_wire::SegmentHeader;
    let (mut a, _b) = pair();
    let sink = a.qp.register(4096, Access::LOCAL_WRITE);
    let read = SendWr::read(7, vec![sge(&sink, 0, 4096)], 0x1000, 0xffff_fe42);
    post_all(&a.qp, [read, SendWr::send(8, vec![])]);
    a.engine.fill_tx();
    let sent = a.engine.tx_queued();
    a.engine.tx_consumed(sent);
    let siw_terminate = "1000070000004141000000000000000100001000000000003758790000005\
                         5bfbae2610000001000fffffe420000000000001000";
    let payload: Vec<u8> = (0..siw_terminate.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&siw_terminate[i..i + 2], 16).unwrap())
        .collect();
    let hdr = SegmentHeader::terminate(1);
    let mut ulpdu = Vec::new();
    hdr.emit(&mut ulpdu);
    ulpdu.extend_from_slice(&payload);
    let mut f = Vec::new();
    softrdma_wire::emit_fpdu(&[&ulpdu], true, &mut f).unwrap();
    a.engine.rx_space()[..f.len()].copy_from_slice(&f);
    a.engine.rx_commit(f.len());
    let wcs = a.polls();
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(7, WcStatus::RemAccessErr), (8, WcStatus::WrFlushErr)]);
    assert_eq!(a.engine.stats.terminates_received, 1);
    assert_eq!(a.qp.state(), QpState::Err);
}
