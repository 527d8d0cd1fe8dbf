//! UD: datagrams with DETH and immediates, the GRH written into receive buffers (IPv4 and
//! IPv6), Q_Key checks, length errors; on PlainQp hosts (the UD engine reaches its QP only
//! through `QpHost`, and takes its source and destination addresses from the caller).

use super::app_view::{AppMr, AppQp};
use super::harness::pattern;
use crate::engine::{UdConfig, UdEngine, UdSource, GRH_LEN};
use softrdma_verbs::qp_host::PlainQp;
use softrdma_verbs::wr::wc_flags;
use softrdma_verbs::*;
use softrdma_wire::roce::{RoceOpcode, RocePacket, DEFAULT_PKEY};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

const QKEY: u32 = 0x1111_2222;

/// A UD QP host in RTS with its engine.
struct UdNode {
    qp: AppQp,
    engine: UdEngine,
}

impl UdNode {
    /// Completions so far, taken (sends first, then receives).
    fn wcs(&mut self) -> Vec<WorkCompletion> {
        super::deliver_ud(&mut self.engine);
        let mut wcs = self.qp.inner().take_send_wcs();
        wcs.extend(self.qp.inner().take_recv_wcs());
        wcs
    }

    /// Registers a zeroed region of `len` bytes with `access`.
    fn mr(&self, len: usize, access: Access) -> AppMr {
        AppMr(self.qp.inner().register(len, access))
    }
}

/// A UD QP in RTS with Q_Key `qkey`, as INIT (port 1, P_Key index 0) → RTR → RTS leaves it.
fn ud_node(qpn: u32, qkey: u32) -> UdNode {
    let attr = QpAttr {
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    let host = PlainQp::new(qpn, QpState::Rts, attr);
    let cfg = UdConfig {
        local_qpn: qpn,
        qkey,
        pkey: DEFAULT_PKEY,
        mtu: 1024,
    };
    let engine = UdEngine::new(host.clone(), cfg);
    UdNode {
        qp: AppQp::new(host, 64),
        engine,
    }
}

fn pair() -> (UdNode, UdNode) {
    (ud_node(0x31, QKEY), ud_node(0x32, QKEY))
}

fn dest(to: &UdNode, qkey: u32) -> UdDest {
    UdDest {
        ah: AhAttr {
            dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2],
            sgid_index: 1,
            hop_limit: 9,
            traffic_class: 0x28,
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        },
        remote_qpn: to.qp.qpn(),
        remote_qkey: qkey,
    }
}

fn v4_source() -> UdSource {
    UdSource {
        src_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        dst_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        hop_limit: 63,
        traffic_class: 0x28,
    }
}

/// Sends whatever `from` has queued to `to`, as if through the network. Returns the count.
fn transfer(from: &mut UdNode, to: &mut UdNode, src: &UdSource) -> usize {
    let now = Instant::now();
    let mut out = Vec::new();
    let mut n = 0;
    while let Some(t) = from.engine.poll_transmit(now, &mut out) {
        assert_eq!((t.sgid_index, t.hop_limit, t.traffic_class), (1, 9, 0x28));
        assert_eq!(t.dgid[12..], [10, 0, 0, 2]);
        let pkt = RocePacket::parse(&out).unwrap();
        to.engine.handle_packet(now, &pkt, src);
        n += 1;
    }
    n
}

fn ones_complement_sum(b: &[u8]) -> u16 {
    let mut s: u32 = b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

#[test]
fn send_with_imm_and_ipv4_grh() {
    let (mut a, mut b) = pair();
    let src = a.mr(1024, Access::LOCAL_WRITE);
    src.write(0, &pattern(1024, 3)).unwrap();
    let buf = b.mr(2048, Access::LOCAL_WRITE);
    b.qp.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: vec![buf.sge(0, 30), buf.sge(30, 2000)],
    }])
    .unwrap();
    let mut wr = SendWr::send(1, vec![src.sge(0, 1001)]);
    wr.opcode = Some(WrOpcode::SendWithImm);
    wr.imm_data = u32::from_ne_bytes([1, 2, 3, 4]);
    wr.ud = Some(dest(&b, QKEY));
    a.qp.post_send_one(wr).unwrap();
    assert_eq!(transfer(&mut a, &mut b, &v4_source()), 1);
    let s = a.wcs();
    assert_eq!(
        (s[0].wr_id, s[0].status, s[0].opcode, s[0].byte_len),
        (1, WcStatus::Success, WcOpcode::Send, 1001)
    );
    let r = b.wcs();
    assert_eq!(r.len(), 1);
    let w = r[0];
    assert_eq!((w.wr_id, w.status, w.opcode), (5, WcStatus::Success, WcOpcode::Recv));
    assert_eq!(w.byte_len as usize, GRH_LEN + 1001);
    assert_eq!(w.wc_flags, wc_flags::GRH | wc_flags::WITH_IMM);
    assert_eq!(w.imm_data, u32::from_ne_bytes([1, 2, 3, 4]));
    assert_eq!(w.src_qp, a.qp.qpn());
    let mem = buf.to_vec();
    assert_eq!(&mem[..20], &[0u8; 20]);
    let ip = &mem[20..40];
    assert_eq!((ip[0], ip[1]), (0x45, 0x28));
    // IP 20 + UDP 8 + BTH 12 + DETH 8 + ImmDt 4 + 1001 payload + 3 pad + ICRC 4.
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 20 + 8 + 12 + 8 + 4 + 1001 + 3 + 4);
    assert_eq!(&ip[4..8], &[0, 0, 0x40, 0]);
    assert_eq!((ip[8], ip[9]), (63, 17));
    assert_eq!(ones_complement_sum(ip), 0xffff, "valid header checksum");
    assert_eq!(&ip[12..16], &[10, 0, 0, 1]);
    assert_eq!(&ip[16..20], &[10, 0, 0, 2]);
    assert_eq!(&mem[40..40 + 1001], &pattern(1024, 3)[..1001]);
    assert_eq!(b.engine.stats().rx_delivered, 1);
    assert_eq!(a.engine.stats().tx_packets, 1);
}

#[test]
fn ipv6_grh() {
    let (mut a, mut b) = pair();
    let src = a.mr(64, Access::LOCAL_WRITE);
    src.write(0, b"datagram").unwrap();
    let buf = b.mr(128, Access::LOCAL_WRITE);
    b.qp.post_recv_one(1, buf.sge(0, 128)).unwrap();
    let mut wr = SendWr::send(1, vec![src.sge(0, 8)]);
    wr.ud = Some(dest(&b, QKEY));
    a.qp.post_send_one(wr).unwrap();
    let s6: Ipv6Addr = "fd00::1".parse().unwrap();
    let d6: Ipv6Addr = "fd00::2".parse().unwrap();
    let src6 = UdSource {
        src_ip: IpAddr::V6(s6),
        dst_ip: IpAddr::V6(d6),
        hop_limit: 5,
        traffic_class: 0xb8,
    };
    transfer(&mut a, &mut b, &src6);
    let w = b.wcs()[0];
    assert_eq!(
        (w.status, w.byte_len, w.wc_flags),
        (WcStatus::Success, 48, wc_flags::GRH)
    );
    let g = buf.to_vec();
    assert_eq!(
        u32::from_be_bytes(g[0..4].try_into().unwrap()),
        (6 << 28) | (0xb8 << 20)
    );
    assert_eq!(u16::from_be_bytes([g[4], g[5]]), 8 + 12 + 8 + 8 + 4);
    assert_eq!((g[6], g[7]), (17, 5));
    assert_eq!(&g[8..24], &s6.octets());
    assert_eq!(&g[24..40], &d6.octets());
    assert_eq!(&g[40..48], b"datagram");
}

#[test]
fn qkey_checks_and_drops() {
    let (mut a, mut b) = pair();
    let src = a.mr(64, Access::LOCAL_WRITE);
    let buf = b.mr(256, Access::LOCAL_WRITE);
    // No receive WR posted: dropped.
    let mut wr = SendWr::send(1, vec![src.sge(0, 8)]);
    wr.ud = Some(dest(&b, QKEY));
    a.qp.post_send_one(wr.clone()).unwrap();
    transfer(&mut a, &mut b, &v4_source());
    assert_eq!(b.engine.stats().rx_dropped_no_recv, 1);
    // Wrong Q_Key: dropped, the receive WR stays posted.
    b.qp.post_recv_one(7, buf.sge(0, 256)).unwrap();
    wr.ud = Some(dest(&b, QKEY + 1));
    a.qp.post_send_one(wr.clone()).unwrap();
    transfer(&mut a, &mut b, &v4_source());
    assert_eq!(b.engine.stats().rx_dropped_qkey, 1);
    assert!(b.wcs().is_empty());
    // A Q_Key with the high bit set means "the sender QP's own Q_Key" (same here).
    wr.ud = Some(dest(&b, 0x8000_0000));
    a.qp.post_send_one(wr.clone()).unwrap();
    transfer(&mut a, &mut b, &v4_source());
    assert_eq!(
        b.wcs().iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(7, WcStatus::Success)]
    );
    // A buffer too small for GRH + payload: LOC_LEN_ERR; the QP stays usable.
    b.qp.post_recv_one(8, buf.sge(0, 40)).unwrap();
    wr.ud = Some(dest(&b, QKEY));
    a.qp.post_send_one(wr).unwrap();
    transfer(&mut a, &mut b, &v4_source());
    let w = b.wcs();
    assert_eq!((w[0].wr_id, w[0].status, w[0].byte_len), (8, WcStatus::LocLenErr, 48));
    assert_eq!(b.engine.stats().rx_length_errors, 1);
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(a.wcs().len(), 4, "every UD send completes at once");
}

#[test]
fn datagram_larger_than_mtu_fails_and_flushes() {
    let (mut a, mut b) = pair();
    let src = a.mr(2048, Access::LOCAL_WRITE);
    let mut big = SendWr::send(1, vec![src.sge(0, 1025)]);
    big.ud = Some(dest(&b, QKEY));
    let mut small = SendWr::send(2, vec![src.sge(0, 10)]);
    small.ud = Some(dest(&b, QKEY));
    a.qp.post_send(&[big, small]).unwrap();
    assert_eq!(transfer(&mut a, &mut b, &v4_source()), 0);
    let s: Vec<_> = a.wcs().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(s, vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(a.qp.state(), QpState::Err);
    assert!(a.engine.is_closed());
    assert_eq!(a.engine.stats().tx_errors, 1);
}

#[test]
fn rc_packets_are_not_ud_and_err_flushes_receives() {
    let (_a, mut b) = pair();
    let buf = b.mr(256, Access::LOCAL_WRITE);
    b.qp.post_recv_one(3, buf.sge(0, 256)).unwrap();
    let mut bth = softrdma_wire::roce::Bth::new(RoceOpcode::RcSendOnly, b.qp.qpn(), 0);
    bth.pad_count = 0;
    let pkt = RocePacket {
        headers: softrdma_wire::roce::RoceHeaders::new(bth),
        payload: &[1, 2, 3, 4],
    };
    b.engine.handle_packet(Instant::now(), &pkt, &v4_source());
    assert_eq!(b.engine.stats().rx_dropped_invalid, 1);
    // The application moves the QP to ERR.
    b.qp.inner().set_state(QpState::Err);
    b.engine.sync_state(Instant::now());
    assert_eq!(
        b.wcs().iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(3, WcStatus::WrFlushErr)]
    );
    assert!(b.engine.is_closed());
}
