//! iWARP engines on [`PlainQp`] hosts: no device, no PD, no CQ. The test moves the byte
//! streams between the engines itself; completions and async events are read from the hosts.

use super::tests::stream;
use super::{Engine, EngineConfig};
use softrdma_verbs::async_event::AsyncEventKind;
use softrdma_verbs::mr::MrInner;
use softrdma_verbs::qp_host::PlainQp;
use softrdma_verbs::*;
use std::sync::Arc;

pub(super) struct Side {
    pub(super) qp: Arc<PlainQp>,
    pub(super) eng: Engine,
}

impl Side {
    /// The send completions reported since the last call.
    pub(super) fn sends(&mut self) -> Vec<WorkCompletion> {
        super::tests::report(&mut self.eng);
        self.qp.take_send_wcs()
    }

    /// The receive completions reported since the last call.
    pub(super) fn recvs(&mut self) -> Vec<WorkCompletion> {
        super::tests::report(&mut self.eng);
        self.qp.take_recv_wcs()
    }

    /// The async events reported so far.
    pub(super) fn events(&mut self) -> Vec<AsyncEventKind> {
        super::tests::report(&mut self.eng);
        self.qp.events()
    }
}

fn side(qpn: u32, initiator: bool) -> Side {
    side_crc(qpn, initiator, true)
}

/// An engine on a fresh [`PlainQp`] in RTS, with or without MPA CRC.
pub(super) fn side_crc(qpn: u32, initiator: bool, crc: bool) -> Side {
    let attr = QpAttr {
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..QpAttr::default()
    };
    let qp = PlainQp::new(qpn, QpState::Rts, attr);
    let cfg = EngineConfig {
        crc,
        ird: 4,
        ord: 4,
        initiator,
        rtr: None,
    };
    let mut eng = Engine::new(qp.clone(), cfg);
    if initiator {
        // The driver's hold after the MPA Reply has passed.
        eng.release_tx();
    }
    Side { qp, eng }
}

/// Moves bytes both ways until nothing moves; returns the bytes moved.
fn pump(a: &mut Side, b: &mut Side) -> usize {
    let mut moved = 0;
    for _ in 0..10_000 {
        let n = stream(&mut a.eng, &mut b.eng) + stream(&mut b.eng, &mut a.eng);
        if n == 0 {
            break;
        }
        moved += n;
    }
    moved
}

pub(super) fn sge(mr: &MrInner, off: usize, len: u32) -> Sge {
    Sge {
        addr: mr.region.addr() + off as u64,
        length: len,
        lkey: mr.lkey,
    }
}

pub(super) fn signaled(mut wr: SendWr) -> SendWr {
    wr.flags = SendFlags::SIGNALED;
    wr
}

pub(super) fn bytes(mr: &MrInner) -> Vec<u8> {
    let mut v = vec![0u8; mr.region.len()];
    assert!(mr.region.read(0, &mut v), "a live region reads");
    v
}

pub(super) fn statuses(wcs: Vec<WorkCompletion>) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn send_write_and_read_without_a_device() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 13 + 1) as u8).collect();
    let src = a.qp.register(data.len(), Access::LOCAL_WRITE);
    assert!(src.region.write(0, &data));
    let dst = b.qp.register(
        200_000,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    );

    b.qp.post_recv(RecvWr {
        wr_id: 40,
        sg_list: vec![sge(&dst, 0, 50_000), sge(&dst, 50_000, 50_000)],
    });
    a.qp.post_send(signaled(SendWr::send(1, vec![sge(&src, 0, 70_000)])));
    a.qp.post_send(signaled(SendWr::write(
        2,
        vec![sge(&src, 0, 100_000)],
        dst.region.addr() + 100_000,
        dst.rkey,
    )));
    assert!(pump(&mut a, &mut b) > 170_000);
    let recv = b.recvs();
    assert_eq!(
        (recv.len(), recv[0].wr_id, recv[0].status, recv[0].byte_len),
        (1, 40, WcStatus::Success, 70_000)
    );
    let got = bytes(&dst);
    assert_eq!(&got[..70_000], &data[..70_000]);
    assert_eq!(&got[100_000..], &data[..]);
    assert_eq!(
        statuses(a.sends()),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );

    // READ back what the WRITE placed.
    let sink = a.qp.register(100_000, Access::LOCAL_WRITE);
    a.qp.post_send(signaled(SendWr::read(
        3,
        vec![sge(&sink, 0, 100_000)],
        dst.region.addr() + 100_000,
        dst.rkey,
    )));
    pump(&mut a, &mut b);
    assert_eq!(statuses(a.sends()), vec![(3, WcStatus::Success)]);
    assert_eq!(bytes(&sink), data);
    assert!(a.events().is_empty() && b.events().is_empty());
}

#[test]
fn a_read_past_the_region_is_a_remote_access_error_and_fails_the_qp() {
    let (mut a, mut b) = (side(3, true), side(4, false));
    let sink = a.qp.register(8192, Access::LOCAL_WRITE);
    let remote = b.qp.register(4096, Access::LOCAL_WRITE | Access::REMOTE_READ);
    assert!(remote.region.write(0, &[0xab; 4096]));
    a.qp.post_send(signaled(SendWr::read(
        5,
        vec![sge(&sink, 0, 8192)],
        remote.region.addr(),
        remote.rkey,
    )));
    a.qp.post_send(signaled(SendWr::send(6, vec![])));
    pump(&mut a, &mut b);
    assert_eq!(
        statuses(a.sends()),
        vec![(5, WcStatus::RemAccessErr), (6, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a.events(), vec![AsyncEventKind::QpFatal]);
    assert_eq!(bytes(&sink), vec![0u8; 8192], "nothing was placed");
}
