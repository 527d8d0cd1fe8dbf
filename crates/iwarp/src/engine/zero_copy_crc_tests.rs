//! With MPA CRC on, payloads still go to the socket from the MR and are placed straight into
//! their target: the CRC32c is computed over the MR ranges ([`super::tx_queue::TxQueue::crc_since`],
//! [`super::rx_direct`]), and what a directly placed FPDU completes waits for its CRC field.

use super::plain_host_tests::{sge, side_crc, signaled, statuses, Side};
use super::zero_copy_tests::{
    a_small_send_arrives, part_kinds, post_recv, queued_read_responses, queued_send, queued_write, receive,
    region_bytes,
};
use softrdma_verbs::*;
use softrdma_wire::{parse_fpdu, SegmentHeader};

fn side(qpn: u32, initiator: bool) -> Side {
    side_crc(qpn, initiator, true)
}

/// Every FPDU of `wire` with its CRC checked; returns (FPDUs, start of each payload).
fn fpdus(wire: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < wire.len() {
        let f = parse_fpdu(&wire[pos..], true)
            .unwrap_or_else(|e| panic!("FPDU at {pos}: {e}"))
            .unwrap_or_else(|| panic!("a partial FPDU at {pos}"));
        let hlen = SegmentHeader::parse(f.ulpdu).map(|(_, n)| n).unwrap_or(0);
        out.push((pos, pos + 2 + hlen));
        pos += f.wire_len;
    }
    out
}

#[test]
fn with_crc_a_large_write_goes_from_the_mr_and_is_placed_straight_into_its_target() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 3 + 1) as u8).collect();
    let src = a.qp.register(data.len(), Access::LOCAL_WRITE);
    assert!(src.region.write(0, &data));
    let dst = b.qp.register(data.len(), super::zero_copy_tests::remote());
    a.qp.post_send(signaled(SendWr::write(
        1,
        vec![sge(&src, 0, data.len() as u32)],
        dst.region.addr(),
        dst.rkey,
    )));
    a.eng.fill_tx();
    let (_, regions) = part_kinds(&a.eng);
    assert_eq!(regions, 3, "the three full FPDUs' payloads are sent from the MR");
    let wire = a.eng.tx_bytes();
    a.eng.tx_consumed(wire.len());
    assert_eq!(fpdus(&wire).len(), 4, "every CRC describes the bytes as sent");

    assert!(receive(&mut b.eng, &wire, 16 * 1024) >= 9, "placed directly");
    assert_eq!(region_bytes(&dst), data);
    assert_eq!(b.eng.stats.rx_placed, 200_000);
    assert_eq!((b.eng.stats.rx_fpdus, b.eng.stats.terminates_sent), (4, 0));
    let rbuf = b.qp.register(64, Access::LOCAL_WRITE);
    a_small_send_arrives(&mut a, &mut b, &rbuf);
}

#[test]
fn with_crc_a_read_completes_only_once_the_last_crc_field_arrived() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let sink = a.qp.register(200_000, Access::LOCAL_WRITE);
    let (wire, data) = queued_read_responses(&mut a, &mut b, &[(&sink, 200_000)]);
    let (head, crc_field) = wire.split_at(wire.len() - 4);
    assert!(receive(&mut a.eng, head, 16 * 1024) >= 9);
    assert!(a.sends().is_empty(), "no completion before the CRC field");
    receive(&mut a.eng, &crc_field[..3], 16 * 1024);
    assert!(a.sends().is_empty(), "nor with 3 of its 4 bytes");
    receive(&mut a.eng, &crc_field[3..], 16 * 1024);
    assert_eq!(statuses(a.sends()), vec![(4, WcStatus::Success)]);
    assert_eq!(region_bytes(&sink), data);
    assert_eq!(a.eng.stats.terminates_sent, 0);
}

#[test]
fn with_crc_a_corrupted_send_placed_directly_is_a_crc_terminate_and_its_recv_is_flushed() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let rbuf = b.qp.register(256 * 1024, Access::LOCAL_WRITE);
    post_recv(&b, 9, &[(&rbuf, 256 * 1024)]);
    let (mut wire, _) = queued_send(&mut a);
    // One bit of the second FPDU's payload, far from its header: it is placed directly.
    let (_, payload) = fpdus(&wire)[1];
    wire[payload + 40_000] ^= 0x10;
    assert!(receive(&mut b.eng, &wire, 16 * 1024) >= 4);
    assert_eq!(b.eng.stats.terminates_sent, 1);
    let why = b.eng.close_reason.clone().unwrap_or_default();
    assert!(
        why.contains("MPA CRC error") && why.contains("placed directly"),
        "{why}"
    );
    assert_eq!(statuses(b.recvs()), vec![(9, WcStatus::WrFlushErr)]);
    assert_eq!(b.qp.state(), QpState::Err);
    // The Terminate reaches the sender, whose SEND fails.
    super::zero_copy_tests::drive(&mut b.eng, &mut a.eng);
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn with_crc_a_corrupted_write_is_terminated_and_the_stream_goes_no_further() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let (dst, mut wire, _) = queued_write(&mut a, &b, None);
    let f = fpdus(&wire);
    // The first FPDU's CRC field itself.
    wire[f[1].0 - 1] ^= 0x01;
    receive(&mut b.eng, &wire, 16 * 1024);
    assert_eq!(b.eng.stats.terminates_sent, 1);
    assert_eq!(b.eng.stats.rx_fpdus, 1, "nothing after the bad FPDU is processed");
    let why = b.eng.close_reason.clone().unwrap_or_default();
    assert!(why.contains("MPA CRC error"), "{why}");
    // What was placed before the check stays (as in siw); nothing after it is placed.
    assert!(region_bytes(&dst)[65_472..].iter().all(|&x| x == 0));
}
