//! Without MPA CRC, payloads go to the socket straight from the MR ([`super::tx_queue`]). These
//! engines run on [`PlainQp`] hosts; `drive` does what the driver does with
//! `send_gather`: a revoked region part sends nothing and is reported by its index.

use super::plain_host_tests::{sge, side_crc, signaled, statuses, Side};
use super::tests::deliver;
use super::Engine;
use softrdma_verbs::async_event::AsyncEventKind;
use softrdma_verbs::memory::socket_io::{Gather, Scatter};
use softrdma_verbs::mr::MrInner;
use softrdma_verbs::*;
use std::sync::Arc;

fn side(qpn: u32, initiator: bool) -> Side {
    side_crc(qpn, initiator, false)
}

pub(super) fn remote() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
}

/// (own parts, region parts) of what `x` would send now.
pub(super) fn part_kinds(x: &Engine) -> (usize, usize) {
    let mut parts = Vec::new();
    x.tx_gather(&mut parts);
    let regions = parts.iter().filter(|p| matches!(p, Gather::Region { .. })).count();
    (parts.len() - regions, regions)
}

/// Sends what `x` has into `y` as the driver does; returns the bytes moved.
pub(super) fn drive(x: &mut Engine, y: &mut Engine) -> usize {
    let mut moved = 0;
    for _ in 0..10_000 {
        x.fill_tx();
        let mut bytes = Vec::new();
        let lost;
        {
            let mut parts = Vec::new();
            x.tx_gather(&mut parts);
            if parts.is_empty() {
                break;
            }
            lost = parts
                .iter()
                .position(|p| matches!(p, Gather::Region { region, .. } if region.is_revoked()));
            if lost.is_none() {
                for p in &parts {
                    assert!(p.append_to(&mut bytes));
                }
            }
        }
        if let Some(i) = lost {
            x.tx_memory_lost(i, "deregistered in the test");
            continue;
        }
        deliver(y, &bytes);
        x.tx_consumed(bytes.len());
        moved += bytes.len();
    }
    moved
}

pub(super) fn pump(a: &mut Side, b: &mut Side) {
    for _ in 0..1000 {
        if drive(&mut a.eng, &mut b.eng) + drive(&mut b.eng, &mut a.eng) == 0 {
            break;
        }
    }
}

#[test]
fn large_payloads_are_sent_from_the_mr_small_ones_copied_and_all_arrive() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let src = a.qp.register(data.len(), Access::LOCAL_WRITE);
    assert!(src.region.write(0, &data));
    let dst = b.qp.register(400_000, remote());

    a.qp.post_send(signaled(SendWr::write(
        1,
        vec![sge(&src, 0, 100)],
        dst.region.addr(),
        dst.rkey,
    )));
    a.eng.fill_tx();
    assert_eq!(part_kinds(&a.eng), (1, 0), "a 100-byte payload is copied");
    drive(&mut a.eng, &mut b.eng);

    // Two SGEs, 200,000 bytes in four FPDUs of up to 65,472: the first copies the 1,000-byte
    // SGE and sends the rest from the MR, the next two are all MR, the last (3,584 bytes, under
    // the minimum) is copied. Own parts: the framing between them.
    a.qp.post_send(signaled(SendWr::write(
        2,
        vec![sge(&src, 0, 1000), sge(&src, 1000, 199_000)],
        dst.region.addr() + 200_000,
        dst.rkey,
    )));
    a.eng.fill_tx();
    assert_eq!(part_kinds(&a.eng), (4, 3));
    pump(&mut a, &mut b);
    assert_eq!(
        statuses(a.sends()),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let mut got = vec![0u8; 400_000];
    assert!(dst.region.read(0, &mut got));
    assert_eq!(&got[..100], &data[..100]);
    assert_eq!(&got[200_000..], &data[..]);

    // A Read Response goes from the responder's MR too.
    let sink = a.qp.register(200_000, Access::LOCAL_WRITE);
    a.qp.post_send(signaled(SendWr::read(
        3,
        vec![sge(&sink, 0, 200_000)],
        dst.region.addr() + 200_000,
        dst.rkey,
    )));
    drive(&mut a.eng, &mut b.eng);
    b.eng.fill_tx();
    assert!(part_kinds(&b.eng).1 > 0, "the Read Response is sent from the MR");
    pump(&mut a, &mut b);
    assert_eq!(statuses(a.sends()), vec![(3, WcStatus::Success)]);
    let mut back = vec![0u8; 200_000];
    assert!(sink.region.read(0, &mut back));
    assert_eq!(back, data);
    assert!(!a.eng.wants_reset() && a.events().is_empty());
}

#[test]
fn a_region_deregistered_before_its_fpdu_left_fails_its_wr_and_the_stream_stays_framed() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let small = a.qp.register(100, Access::LOCAL_WRITE);
    assert!(small.region.write(0, &[5; 100]));
    let big = a.qp.register(100_000, Access::LOCAL_WRITE);
    let dst = b.qp.register(200_000, remote());
    a.qp.post_send(signaled(SendWr::write(
        1,
        vec![sge(&small, 0, 100)],
        dst.region.addr(),
        dst.rkey,
    )));
    a.qp.post_send(signaled(SendWr::write(
        2,
        vec![sge(&big, 0, 100_000)],
        dst.region.addr() + 1000,
        dst.rkey,
    )));
    a.eng.fill_tx();
    // ibv_dereg_mr after the WRITE was segmented, before the socket took its payload.
    big.region.revoke();
    pump(&mut a, &mut b);
    assert_eq!(
        statuses(a.sends()),
        vec![(1, WcStatus::Success), (2, WcStatus::LocProtErr)]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a.events(), vec![AsyncEventKind::QpFatal]);
    assert!(!a.eng.wants_reset(), "nothing of the failed FPDU was sent");
    // The peer got the first WRITE whole and no broken FPDU (it would have sent a Terminate).
    let mut got = vec![0u8; 1000];
    assert!(dst.region.read(0, &mut got));
    assert_eq!(&got[..100], &[5; 100][..]);
    assert_eq!(b.eng.stats.terminates_sent, 0);
    assert_eq!(b.eng.phase(), super::Phase::Running);
}

#[test]
fn a_region_deregistered_after_part_of_its_fpdu_left_resets_the_stream() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let big = a.qp.register(100_000, Access::LOCAL_WRITE);
    let dst = b.qp.register(100_000, remote());
    a.qp.post_send(signaled(SendWr::write(
        7,
        vec![sge(&big, 0, 100_000)],
        dst.region.addr(),
        dst.rkey,
    )));
    a.eng.fill_tx();
    // The socket took the MPA length and part of the DDP header, then the MR went away.
    let head = a.eng.tx_bytes()[..10].to_vec();
    deliver(&mut b.eng, &head);
    a.eng.tx_consumed(10);
    big.region.revoke();
    drive(&mut a.eng, &mut b.eng);
    assert!(a.eng.wants_reset(), "the rest of the FPDU cannot follow");
    assert_eq!(a.eng.tx_queued(), 0, "nothing more is sent");
    assert_eq!(statuses(a.sends()), vec![(7, WcStatus::LocProtErr)]);
    assert_eq!(a.qp.state(), QpState::Err);
    let why = a.eng.close_reason.clone().unwrap_or_default();
    assert!(why.contains("QP 3") && why.contains("reset"), "{why}");
}

#[test]
fn a_read_source_deregistered_before_its_response_left_is_a_terminate() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let sink = a.qp.register(100_000, Access::LOCAL_WRITE);
    let src = b.qp.register(100_000, remote());
    a.qp.post_send(signaled(SendWr::read(
        9,
        vec![sge(&sink, 0, 100_000)],
        src.region.addr(),
        src.rkey,
    )));
    drive(&mut a.eng, &mut b.eng);
    b.eng.fill_tx();
    assert!(part_kinds(&b.eng).1 > 0);
    src.region.revoke();
    pump(&mut a, &mut b);
    assert_eq!(b.eng.stats.terminates_sent, 1);
    assert!(!b.eng.wants_reset());
    assert_eq!(statuses(a.sends()), vec![(9, WcStatus::RemAccessErr)]);
    let mut got = vec![0u8; 100_000];
    assert!(sink.region.read(0, &mut got));
    assert!(got.iter().all(|&x| x == 0), "nothing was placed");
}

/// Hands `bytes` to `y` as `recv_scatter` would, `chunk` bytes per call at most: the open
/// direct placement's MR range first, then the receive buffer. Returns the calls that wrote
/// into an MR.
pub(super) fn receive(y: &mut Engine, bytes: &[u8], chunk: usize) -> usize {
    receive_counting(y, bytes, chunk).0
}

/// [`receive`], returning (calls that wrote into an MR, bytes written into MRs).
pub(super) fn receive_counting(y: &mut Engine, bytes: &[u8], chunk: usize) -> (usize, usize) {
    let (mut off, mut direct_calls, mut direct_bytes) = (0, 0, 0);
    while off < bytes.len() {
        let mut n = 0;
        {
            let mut parts = Vec::new();
            y.rx_scatter(&mut parts);
            for p in parts.iter_mut() {
                let take = (bytes.len() - off - n).min(chunk - n);
                match p {
                    Scatter::Region { region, offset, len } => {
                        let take = take.min(*len);
                        assert!(region.write(*offset, &bytes[off + n..off + n + take]));
                        direct_calls += usize::from(take > 0);
                        direct_bytes += take;
                        n += take;
                    }
                    Scatter::Bytes(b) => {
                        let take = take.min(b.len());
                        b[..take].copy_from_slice(&bytes[off + n..off + n + take]);
                        n += take;
                    }
                }
            }
        }
        y.rx_received(n);
        off += n;
    }
    (direct_calls, direct_bytes)
}

/// Everything `x` has to send, as the socket would take it (all of it, at once or in turns).
pub(super) fn take_wire(x: &mut Engine) -> Vec<u8> {
    let mut wire = Vec::new();
    for _ in 0..100 {
        x.fill_tx();
        let more = x.tx_bytes();
        if more.is_empty() {
            break;
        }
        x.tx_consumed(more.len());
        wire.extend_from_slice(&more);
    }
    wire
}

/// Sets up a 200,000-byte WRITE from `a` into a fresh MR of `b`; returns the target MR, the
/// bytes `a` queued, and the data.
pub(super) fn queued_write(a: &mut Side, b: &Side, rkey: Option<u32>) -> (Arc<MrInner>, Vec<u8>, Vec<u8>) {
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 31 + 7) as u8).collect();
    let src = a.qp.register(data.len(), Access::LOCAL_WRITE);
    assert!(src.region.write(0, &data));
    let dst = b.qp.register(data.len(), remote());
    a.qp.post_send(signaled(SendWr::write(
        1,
        vec![sge(&src, 0, data.len() as u32)],
        dst.region.addr(),
        rkey.unwrap_or(dst.rkey),
    )));
    let wire = take_wire(&mut a.eng);
    (dst, wire, data)
}

pub(super) fn region_bytes(mr: &MrInner) -> Vec<u8> {
    let mut v = vec![0u8; mr.region.len()];
    assert!(mr.region.read(0, &mut v));
    v
}

#[test]
fn a_large_write_payload_is_received_straight_into_its_mr() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let (dst, wire, data) = queued_write(&mut a, &b, None);
    // 16 KiB per receive call: each FPDU's header arrives in the buffer, the rest of its
    // 65,472-byte payload (but the last FPDU's 3,584) goes to the MR directly.
    let direct_calls = receive(&mut b.eng, &wire, 16 * 1024);
    assert!(direct_calls >= 9, "{direct_calls} receive calls wrote into the MR");
    assert_eq!(region_bytes(&dst), data);
    assert_eq!(b.eng.stats.rx_fpdus, 4);
    assert_eq!(b.eng.stats.rx_placed, 200_000);
    assert_eq!(b.eng.stats.terminates_sent, 0);
    // The stream is still framed: a SEND after it arrives.
    let rbuf = b.qp.register(64, Access::LOCAL_WRITE);
    a_small_send_arrives(&mut a, &mut b, &rbuf);
}

/// The stream from `a` to `b` is still framed: a 5-byte SEND, received 3 bytes per call,
/// lands at the start of `rbuf` and completes.
pub(super) fn a_small_send_arrives(a: &mut Side, b: &mut Side, rbuf: &MrInner) {
    post_recv(b, 8, &[(rbuf, 64)]);
    let small = a.qp.register(5, Access::LOCAL_WRITE);
    assert!(small.region.write(0, b"after"));
    a.qp.post_send(signaled(SendWr::send(2, vec![sge(&small, 0, 5)])));
    a.eng.fill_tx();
    let more = a.eng.tx_bytes();
    receive(&mut b.eng, &more, 3);
    assert_eq!(statuses(b.recvs()), vec![(8, WcStatus::Success)]);
    assert_eq!(&region_bytes(rbuf)[..5], b"after");
}

#[test]
fn a_write_that_fails_its_checks_is_buffered_and_terminated_as_before() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let (dst, wire, _) = queued_write(&mut a, &b, Some(0xbad0));
    let direct_calls = receive(&mut b.eng, &wire, 16 * 1024);
    assert_eq!(direct_calls, 0);
    assert_eq!(b.eng.stats.terminates_sent, 1);
    assert!(region_bytes(&dst).iter().all(|&x| x == 0));
    let why = b.eng.close_reason.clone().unwrap_or_default();
    assert!(why.contains("STag 0xbad0"), "{why}");
}

#[test]
fn a_direct_target_lost_mid_payload_is_a_terminate_naming_the_write() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let (dst, wire, _) = queued_write(&mut a, &b, None);
    receive(&mut b.eng, &wire[..1000], 1000);
    let mut parts = Vec::new();
    b.eng.rx_scatter(&mut parts);
    assert!(matches!(parts[0], Scatter::Region { .. }), "placing directly");
    drop(parts);
    dst.region.revoke();
    // What the driver does when recv_scatter answers Revoked (or EFAULT).
    b.eng.rx_direct_lost("deregistered in the test");
    assert_eq!(b.eng.stats.terminates_sent, 1);
    let why = b.eng.close_reason.clone().unwrap_or_default();
    assert!(
        why.contains(&format!("STag {:#x}", dst.rkey)) && why.contains("no longer accessible"),
        "{why}"
    );
    let mut parts = Vec::new();
    b.eng.rx_scatter(&mut parts);
    assert_eq!(parts.len(), 1, "nothing is received into the MR any more");
    drop(parts);
    // The Terminate reaches the writer: its QP fails.
    drive(&mut b.eng, &mut a.eng);
    assert_eq!(a.qp.state(), QpState::Err);
}

/// `a` READs 200,000 bytes of `b`'s memory into `sinks` (one SGE each); returns the bytes of
/// the Read Responses `b` queued, and the data.
pub(super) fn queued_read_responses(a: &mut Side, b: &mut Side, sinks: &[(&MrInner, u32)]) -> (Vec<u8>, Vec<u8>) {
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 17 + 5) as u8).collect();
    let src = b.qp.register(data.len(), remote());
    assert!(src.region.write(0, &data));
    let sg_list = sinks.iter().map(|(mr, len)| sge(mr, 0, *len)).collect();
    a.qp.post_send(signaled(SendWr::read(4, sg_list, src.region.addr(), src.rkey)));
    drive(&mut a.eng, &mut b.eng);
    let wire = take_wire(&mut b.eng);
    (wire, data)
}

#[test]
fn read_responses_are_received_straight_into_the_sink_and_complete_the_read() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let sink = a.qp.register(200_000, Access::LOCAL_WRITE);
    let (wire, data) = queued_read_responses(&mut a, &mut b, &[(&sink, 200_000)]);
    assert!(receive(&mut a.eng, &wire, 16 * 1024) >= 9);
    assert_eq!(statuses(a.sends()), vec![(4, WcStatus::Success)]);
    assert_eq!(region_bytes(&sink), data);

    // Two SGEs: the segment that spans them is buffered and scattered; the others are direct.
    let (s1, s2) = (
        a.qp.register(100_000, Access::LOCAL_WRITE),
        a.qp.register(100_000, Access::LOCAL_WRITE),
    );
    let (wire, data) = queued_read_responses(&mut a, &mut b, &[(&s1, 100_000), (&s2, 100_000)]);
    assert!(receive(&mut a.eng, &wire, 16 * 1024) >= 6);
    assert_eq!(statuses(a.sends()), vec![(4, WcStatus::Success)]);
    assert_eq!(region_bytes(&s1), &data[..100_000]);
    assert_eq!(region_bytes(&s2), &data[100_000..]);
    assert_eq!(a.eng.stats.terminates_sent, 0);
}

#[test]
fn a_read_sink_lost_mid_payload_is_a_terminate_and_the_read_fails() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let sink = a.qp.register(200_000, Access::LOCAL_WRITE);
    let (wire, _) = queued_read_responses(&mut a, &mut b, &[(&sink, 200_000)]);
    receive(&mut a.eng, &wire[..1000], 1000);
    sink.region.revoke();
    a.eng.rx_direct_lost("deregistered in the test");
    assert_eq!(a.eng.stats.terminates_sent, 1);
    let why = a.eng.close_reason.clone().unwrap_or_default();
    assert!(
        why.contains("READ sink became inaccessible after 0 of 200000 bytes"),
        "{why}"
    );
    let wcs = statuses(a.sends());
    assert!(wcs.len() == 1 && wcs[0].1 != WcStatus::Success, "{wcs:?}");
    assert_eq!(a.qp.state(), QpState::Err);
}

/// `a` SENDs 200,000 bytes to `b`; returns the bytes `a` queued, and the data.
pub(super) fn queued_send(a: &mut Side) -> (Vec<u8>, Vec<u8>) {
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13 + 1) as u8).collect();
    let src = a.qp.register(data.len(), Access::LOCAL_WRITE);
    assert!(src.region.write(0, &data));
    a.qp.post_send(signaled(SendWr::send(5, vec![sge(&src, 0, data.len() as u32)])));
    let wire = take_wire(&mut a.eng);
    (wire, data)
}

pub(super) fn post_recv(b: &Side, wr_id: u64, bufs: &[(&MrInner, u32)]) {
    b.qp.post_recv(RecvWr {
        wr_id,
        sg_list: bufs.iter().map(|(mr, len)| sge(mr, 0, *len)).collect(),
    });
}

#[test]
fn a_large_send_is_received_straight_into_its_receive_buffer() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let rbuf = b.qp.register(256 * 1024, Access::LOCAL_WRITE);
    post_recv(&b, 9, &[(&rbuf, 256 * 1024)]);
    let (wire, data) = queued_send(&mut a);
    assert!(receive(&mut b.eng, &wire, 16 * 1024) >= 9);
    let wcs = b.recvs();
    assert_eq!(statuses(wcs.clone()), vec![(9, WcStatus::Success)]);
    assert_eq!(wcs[0].byte_len, 200_000);
    assert_eq!(&region_bytes(&rbuf)[..200_000], &data[..]);
    assert_eq!(b.eng.stats.rx_fpdus, 4);
    assert_eq!(b.eng.stats.rx_placed, 200_000);
    assert_eq!(b.eng.stats.terminates_sent, 0);
    // The next SEND (MSN 2) arrives too: the stream is framed, the MSN moved on.
    a_small_send_arrives(&mut a, &mut b, &rbuf);
}

#[test]
fn a_send_into_two_receive_sges_places_the_spanning_segment_from_the_buffer() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let (r1, r2) = (
        b.qp.register(100_000, Access::LOCAL_WRITE),
        b.qp.register(100_000, Access::LOCAL_WRITE),
    );
    post_recv(&b, 9, &[(&r1, 100_000), (&r2, 100_000)]);
    let (wire, data) = queued_send(&mut a);
    assert!(receive(&mut b.eng, &wire, 16 * 1024) >= 6);
    assert_eq!(statuses(b.recvs()), vec![(9, WcStatus::Success)]);
    assert_eq!(region_bytes(&r1), &data[..100_000]);
    assert_eq!(region_bytes(&r2), &data[100_000..]);
    assert_eq!(b.eng.stats.terminates_sent, 0);
}

#[test]
fn a_large_send_without_a_receive_buffer_is_terminated_as_before() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let (wire, _) = queued_send(&mut a);
    assert_eq!(receive(&mut b.eng, &wire, 16 * 1024), 0);
    assert_eq!(b.eng.stats.terminates_sent, 1);
    let why = b.eng.close_reason.clone().unwrap_or_default();
    assert!(why.contains("arrived with no receive buffer posted"), "{why}");
    // Too small a buffer: LOC_LEN_ERR and a Terminate, nothing placed.
    let (mut a, mut b) = (side(3, true), side(4, false));
    let rbuf = b.qp.register(100_000, Access::LOCAL_WRITE);
    post_recv(&b, 9, &[(&rbuf, 100_000)]);
    let (wire, _) = queued_send(&mut a);
    receive(&mut b.eng, &wire, 16 * 1024);
    assert_eq!(statuses(b.recvs()), vec![(9, WcStatus::LocLenErr)]);
    assert_eq!(b.eng.stats.terminates_sent, 1);
    let why = b.eng.close_reason.clone().unwrap_or_default();
    assert!(why.contains("does not fit the 100000-byte receive buffer"), "{why}");
    // The first segment (65,472 bytes) fitted: it is placed; the second is not.
    assert!(region_bytes(&rbuf)[65_472..].iter().all(|&x| x == 0));
}

#[test]
fn a_receive_buffer_lost_mid_payload_is_a_terminate_and_the_recv_fails() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let rbuf = b.qp.register(200_000, Access::LOCAL_WRITE);
    post_recv(&b, 9, &[(&rbuf, 200_000)]);
    let (wire, _) = queued_send(&mut a);
    receive(&mut b.eng, &wire[..1000], 1000);
    let mut parts = Vec::new();
    b.eng.rx_scatter(&mut parts);
    assert!(matches!(parts[0], Scatter::Region { .. }), "placing directly");
    drop(parts);
    rbuf.region.revoke();
    b.eng.rx_direct_lost("deregistered in the test");
    assert_eq!(b.eng.stats.terminates_sent, 1);
    let why = b.eng.close_reason.clone().unwrap_or_default();
    assert!(
        why.contains("receive WR 0x9: its buffer became inaccessible after 0 bytes (deregistered in the test)"),
        "{why}"
    );
    assert_eq!(statuses(b.recvs()), vec![(9, WcStatus::LocProtErr)]);
    assert_eq!(b.qp.state(), QpState::Err);
    // The Terminate reaches the sender: its QP fails.
    drive(&mut b.eng, &mut a.eng);
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn a_stream_of_large_sends_is_placed_directly_segment_after_segment() {
    // Four 1 MiB SENDs in 65,472-byte segments, received in 64 KiB calls. After each directly
    // placed payload the call's buffer part ends with the next segment's untagged (SEND)
    // header, so that segment is placed directly too; only each message's 1,024-byte last
    // segment, and what a call after it reads into the buffer, are copied. (With a tagged
    // header's window, 4 bytes short, every other segment was copied.)
    const MSG: usize = 1 << 20;
    let (mut a, mut b) = (side(3, true), side(4, false));
    let src = a.qp.register(MSG, Access::LOCAL_WRITE);
    let data: Vec<u8> = (0..MSG as u32).map(|i| (i * 29 + 11) as u8).collect();
    assert!(src.region.write(0, &data));
    let rbuf = b.qp.register(4 * MSG, Access::LOCAL_WRITE);
    for i in 0..4u64 {
        b.qp.post_recv(RecvWr {
            wr_id: 100 + i,
            sg_list: vec![sge(&rbuf, i as usize * MSG, MSG as u32)],
        });
        a.qp.post_send(SendWr::send(i, vec![sge(&src, 0, MSG as u32)]));
    }
    let wire = take_wire(&mut a.eng);
    let (_, direct) = receive_counting(&mut b.eng, &wire, 64 * 1024);
    let copied = 4 * MSG - direct;
    assert!(
        copied < 4 * MSG / 8,
        "{copied} of {} payload bytes were copied",
        4 * MSG
    );
    assert_eq!(
        statuses(b.recvs()),
        (100..104).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    for i in 0..4 {
        assert_eq!(&region_bytes(&rbuf)[i * MSG..(i + 1) * MSG], &data[..]);
    }
    assert_eq!(b.eng.stats.terminates_sent, 0);
}

#[test]
fn the_receive_buffer_starts_small_and_doubles_while_receives_fill_it() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    assert_eq!(b.eng.rx.len(), super::rx::RX_BUFFER_START);
    // A connection that carries one small message keeps its small buffer.
    let rbuf = b.qp.register(64, Access::LOCAL_WRITE);
    a_small_send_arrives(&mut a, &mut b, &rbuf);
    assert_eq!(b.eng.rx.len(), super::rx::RX_BUFFER_START);
    // 64 WRITEs of 4 KiB (too small to be placed directly) wait in the socket at once: each
    // receive call fills what it is offered, and the buffer doubles to 256 KiB.
    let (mut a, mut b) = (side(5, true), side(6, false));
    let src = a.qp.register(4096, Access::LOCAL_WRITE);
    let dst = b.qp.register(4096, remote());
    for i in 0..64 {
        a.qp.post_send(SendWr::write(
            10 + i,
            vec![sge(&src, 0, 4096)],
            dst.region.addr(),
            dst.rkey,
        ));
        a.eng.fill_tx();
    }
    let wire = take_wire(&mut a.eng);
    assert!(wire.len() > 256 * 1024, "{} bytes queued", wire.len());
    receive(&mut b.eng, &wire, usize::MAX);
    assert_eq!(b.eng.rx.len(), 256 * 1024);
    assert_eq!(b.eng.stats.rx_fpdus, 64);
    assert_eq!(b.eng.stats.terminates_sent, 0);
}
