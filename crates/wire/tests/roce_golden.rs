//! RoCEv2 codecs and ICRC against the wirecheck golden captures
//! (/work/shared/wirecheck/samples, bytes embedded below), an IPv6 vector
//! checked with wirecheck's own ICRC code, and property tests.

use proptest::prelude::*;
use softrdma_wire::roce::*;
use softrdma_wire::WireError;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Every packet of samples/good/roce_rc_cm.pcap (IP packets, Ethernet header removed).
const RC_CM: &[&str] = &[
    concat!(
        "450001340000400040113bb77f0000017f000001c00012b70120f7ac6440ffff00000001000000008001000000000001",
        "01070203000000000000000100000042001000000000000011111111000000000000000001061c060002c9fffe000001",
        "00000000000000000000111000000010000000a1001000a7ffff37f0ffffffff00000000000000000000ffff7f000001",
        "00000000000000000000ffff7f0000010000000000400090000000000000000000000000000000000000000000000000",
        "00000000000000000000000000000000000000000040a0280000000000000000000000007f0000010000000000000000",
        "000000007f000001756c7020707269766174652064617461000000000000000000000000000000000000000000000000",
        "00000000000000000000000000000000b93fd8f1",
    ),
    concat!(
        "450001340000400040113bb77f0000017f000001c00112b70120170d6440ffff00000001000000008001000000000001",
        "010702030000000000000001000000420013000000000000222222221111111100000000000022000000000000200000",
        "101071e00002c9fffe000002726570207072697661746520646174610000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "00000000000000000000000000000000e5a43e7e",
    ),
    concat!(
        "450001340000400040113bb77f0000017f000001c00012b70120dee76440ffff00000001000000018001000000000001",
        "010702030000000000000001000000420014000000000000111111112222222200000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000006e583abd",
    ),
    concat!(
        "450000480000400040113ca37f0000017f000001c00012b700343d0a0470ffff000000228000100068656c6c6f206672",
        "6f6d20736f66742d526f43452053454e44000000b9104d72",
    ),
    "450000300000400040113cbb7f0000017f000001c00112b7001ceea81140ffff00000011000010001f000001b002cec2",
    concat!(
        "450000500000400040113c9b7f0000017f000001c00012b7003c1bd80a50ffff000000228000100100007f0000001000",
        "000012340000001352444d41205752495445207061796c6f61642100094b15f3",
    ),
    "450000300000400040113cbb7f0000017f000001c00112b7001ceea61140ffff00000011000010011f000002ba7aa766",
    concat!(
        "4500003c0000400040113caf7f0000017f000001c00012b700289ce60c40ffff000000228000100200007f0000002000",
        "0000567800000020a7ee5cbd",
    ),
    concat!(
        "450000500000400040113c9b7f0000017f000001c00112b7003cfe631040ffff00000011000010021f00000300010203",
        "0405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f840fb5f6",
    ),
    concat!(
        "450000340000400040113cb77f0000017f000001c00012b7002008040550ffff0000002280001003cafef00d696d6d00",
        "2155a8b3",
    ),
    "450000300000400040113cbb7f0000017f000001c00112b7001ceea21140ffff00000011000010031f000004ef8c04f5",
    concat!(
        "4500043c00004000401138af7f0000017f000001c00012b70428aa580640ffff000000220000100400007f0000004000",
        "000012340000086446464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646464646",
        "464646464646464646464646464646464646464646464646f79b6222",
    ),
    concat!(
        "4500042c00004000401138bf7f0000017f000001c00012b7041875020740ffff00000022000010054d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d",
        "4d4d4d4d4d4d4d4de5d9c1af",
    ),
    concat!(
        "450000900000400040113c5b7f0000017f000001c00012b7007caeec0840ffff00000022800010064c4c4c4c4c4c4c4c",
        "4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c",
        "4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c67030d0f",
    ),
    "450000300000400040113cbb7f0000017f000001c00112b7001cee9e1140ffff00000011000010061f0000050933e34a",
    concat!(
        "450001340000400040113bb77f0000017f000001c00012b70120bce46440ffff00000001000000028001000000000001",
        "010702030000000000000001000000430015000000000000111111112222222200002200000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000003378fce9",
    ),
    concat!(
        "450001340000400040113bb77f0000017f000001c00112b70120dee36440ffff00000001000000018001000000000001",
        "010702030000000000000001000000430016000000000000222222221111111100000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000002e399fd1",
    ),
];

/// samples/good/roce_rc_cm_port14791.pcap packets 5 and 6 (ACK, WRITE Only): RoCE on UDP port 14791.
const PORT_14791: &[&str] = &[
    "450000300000400040113cbb7f0000017f000001c00139c7001cc7981140ffff00000011000010001f000001f661a7e2",
    concat!(
        "450000500000400040113c9b7f0000017f000001c00039c7003cf4c70a50ffff000000228000100100007f0000001000",
        "000012340000001352444d41205752495445207061796c6f616421004d956cff",
    ),
];

/// samples/bad/roce_bad_icrc_write.pcap packet 6: WRITE Only with one payload bit flipped after the ICRC was computed.
const BAD_ICRC_WRITE: &[&str] = &[concat!(
    "450000500000400040113c9b7f0000017f000001c00012b7003cfc9a0a50ffff000000228000100100007f0000001000",
    "000012340000001352444d40205752495445207061796c6f61642100094b15f3",
)];

/// samples/bad/roce_bad_icrc_cm_req.pcap packet 1: CM REQ MAD with a private-data bit flipped.
const BAD_ICRC_CM_REQ: &[&str] = &[concat!(
    "450001340000400040113bb77f0000017f000001c00012b70120647b6440ffff00000001000000008001000000000001",
    "01070203000000000000000100000042001000000000000011111111000000000000000001061c060002c9fffe000001",
    "00000000000000000000111000000010000000a1001000a7ffff37f0ffffffff00000000000000000000ffff7f000001",
    "00000000000000000000ffff7f0000010000000000400090000000000000000000000000000000000000000000000000",
    "00000000000000000000000000000000000000000040a0280000000000000000000000007f0000010000000000000000",
    "000000007f000001756c7020717269766174652064617461000000000000000000000000000000000000000000000000",
    "00000000000000000000000000000000b93fd8f1",
)];

/// samples/bad/roce_truncated_reth.pcap packet 6: WRITE Only cut to 20 UDP payload bytes.
const TRUNCATED_RETH: &[&str] =
    &["450000300000400040113cbb7f0000017f000001c00012b7001c05880a50ffff000000228000100100007f0000001000"];

/// samples/bad/roce_bad_bth_tver.pcap packet 4: SEND Only with TVer=1 and a valid ICRC.
const BAD_TVER: &[&str] = &[concat!(
    "450000480000400040113ca37f0000017f000001c00012b700343d090471ffff000000228000100068656c6c6f206672",
    "6f6d20736f66742d526f43452053454e44000000101bc43c",
)];

/// IPv6 RoCEv2 packets built for this test (SEND Only pad 1; WRITE Only Imm with FECN; NAK Invalid
/// Request with BECN), ICRC computed by wirecheck's roce_icrc(ipv6=True). Traffic class, flow label,
/// hop limit and the FECN/BECN bits are non-zero to show that they are masked.
const IPV6: &[&str] = &[
    concat!(
        "668abcde00281140fd000000000000000000000000000001fd000000000000000000000000000002c0de12b700284128",
        "0450ffff000001238000abcd68656c6c6f206f766572204950763600cd280cfd",
    ),
    concat!(
        "60200001005011ff20010db800000000000000000000001020010db8000100000000000000000020d00112b700507a50",
        "0bf0ffff8000fedc80ffffff00007f1234567000deadbeef0000002112345678000102030405060708090a0b0c0d0e0f",
        "101112131415161718191a1b1c1d1e1f20000000b06bd204",
    ),
    concat!(
        "6fffffff001c110120010db800010000000000000000002020010db8000000000000000000000010d00212b7001c620a",
        "1140ffff4000abcd00ffffff61000042c5c74c31",
    ),
];

/// Linux 6.1 rdma_rxe (198.18.99.2) to softrdma, ibv_rc_pingpong, captured by the kernel-peer
/// harness (results/roce-rc-pingpong.k2s/cap.pcap): rxe's own IPv4 header has DF and a
/// non-zero, incrementing Identification (0xe63b, 0xe63c), and UDP checksum 0. SEND First
/// (1024 bytes of 0x7b, given as header + ICRC) and an ACK.
const RXE_SEND_FIRST: (&str, u8, usize, &str) = (
    "4500042ce63b40004011fe5cc6126302c6126301f3cc12b7041800000000ffff0001e4ee009ca41b",
    0x7b,
    1024,
    "6f896620",
);
const RXE_ACK: &str =
    "45000030e63c400040110258c6126302c6126301f3cc12b7001c00001100ffff0001e4ee00aa74db1f000001fe4fc3ed";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// What a receiver knows about a captured IP packet: the ICRC's IP fields, the
/// UDP ports and the UDP payload (ICRC included).
struct Captured {
    ip: IcrcIp,
    sport: u16,
    dport: u16,
    datagram: Vec<u8>,
}

fn captured(pkt: &[u8]) -> Captured {
    let be16 = |at: usize| u16::from_be_bytes([pkt[at], pkt[at + 1]]);
    let (ip, l4) = match pkt[0] >> 4 {
        4 => {
            let ihl = usize::from(pkt[0] & 0x0f) * 4;
            let src: [u8; 4] = pkt[12..16].try_into().unwrap();
            let dst: [u8; 4] = pkt[16..20].try_into().unwrap();
            let ip = IcrcIp::V4 {
                src: src.into(),
                dst: dst.into(),
                id: be16(4),
                dont_fragment: be16(6) & 0x4000 != 0,
            };
            (ip, ihl)
        }
        6 => {
            let src: [u8; 16] = pkt[8..24].try_into().unwrap();
            let dst: [u8; 16] = pkt[24..40].try_into().unwrap();
            (
                IcrcIp::V6 {
                    src: src.into(),
                    dst: dst.into(),
                },
                40,
            )
        }
        v => panic!("IP version {v}"),
    };
    Captured {
        ip,
        sport: be16(l4),
        dport: be16(l4 + 2),
        datagram: pkt[l4 + 8..].to_vec(),
    }
}

/// Verifies the ICRC both ways, parses, and re-encodes the datagram byte for byte.
fn check_good(pkt: &[u8], dport: u16) -> RocePacket<'static> {
    let (carried, computed) = icrc_of_ip_packet(pkt).unwrap();
    assert_eq!(carried, computed, "ICRC from the captured headers");
    let c = captured(pkt);
    assert_eq!(c.dport, dport);
    let transport = check_icrc(&c.ip, c.sport, c.dport, &c.datagram).unwrap();
    assert_eq!(transport, &c.datagram[..c.datagram.len() - ICRC_LEN]);
    assert_eq!(icrc(&c.ip, c.sport, c.dport, transport), carried);
    assert_eq!(icrc_bytes(carried), c.datagram[c.datagram.len() - ICRC_LEN..]);
    if let IcrcIp::V4 { src, dst, .. } = c.ip {
        assert_eq!(
            check_icrc_any_id(src, dst, c.sport, c.dport, &c.datagram),
            Ok((transport, c.ip))
        );
    }
    let transport: &'static [u8] = transport.to_vec().leak();
    let p = RocePacket::parse(transport).unwrap();
    assert!(p.headers.matches_opcode());
    let mut out = Vec::new();
    p.headers.emit(p.payload, &mut out);
    append_icrc(&c.ip, c.sport, c.dport, &mut out, 0);
    assert_eq!(out, c.datagram, "re-encoded datagram");
    p
}

#[test]
fn golden_rc_cm() {
    use RoceOpcode::*;
    let expect = [
        UdSendOnly,
        UdSendOnly,
        UdSendOnly,
        RcSendOnly,
        RcAck,
        RcWriteOnly,
        RcAck,
        RcReadRequest,
        RcReadResponseOnly,
        RcSendOnlyImm,
        RcAck,
        RcWriteFirst,
        RcWriteMiddle,
        RcWriteLast,
        RcAck,
        UdSendOnly,
        UdSendOnly,
    ];
    assert_eq!(RC_CM.len(), expect.len());
    let mut psn_a = 0x1000;
    for (i, (&s, &op)) in RC_CM.iter().zip(&expect).enumerate() {
        let p = check_good(&hex(s), ROCE_V2_UDP_PORT);
        let h = &p.headers;
        assert_eq!(h.bth.opcode, op, "packet {}", i + 1);
        assert_eq!((h.bth.tver, h.bth.pkey, h.bth.mig_req), (0, DEFAULT_PKEY, true));
        if op.is_ud() {
            assert_eq!(h.bth.dest_qp, 1);
            assert_eq!(
                h.deth,
                Some(Deth {
                    qkey: GSI_QKEY,
                    src_qp: 1
                })
            );
            assert_eq!(p.payload.len(), 256, "MAD");
        } else if op.is_request() {
            assert_eq!((h.bth.dest_qp, h.bth.psn), (0x22, psn_a));
            psn_a += 1;
        } else {
            assert_eq!((h.bth.dest_qp, h.bth.psn), (0x11, psn_a - 1));
            assert!(h.aeth.unwrap().is_ack());
        }
    }
    let p = check_good(&hex(RC_CM[3]), ROCE_V2_UDP_PORT);
    assert_eq!(p.payload, b"hello from soft-RoCE SEND");
    assert!(p.headers.bth.ack_req);
    let p = check_good(&hex(RC_CM[5]), ROCE_V2_UDP_PORT);
    assert_eq!(
        p.headers.reth,
        Some(Reth {
            va: 0x7F00_0000_1000,
            rkey: 0x1234,
            dma_len: 19
        })
    );
    assert_eq!(p.payload, b"RDMA WRITE payload!");
    let p = check_good(&hex(RC_CM[8]), ROCE_V2_UDP_PORT);
    assert_eq!(p.payload, (0..32).collect::<Vec<u8>>());
    assert_eq!(
        p.headers.aeth.map(|a| (a.kind(), a.msn)),
        Some((AethKind::Ack { credits: 0x1f }, 3))
    );
    let p = check_good(&hex(RC_CM[9]), ROCE_V2_UDP_PORT);
    assert_eq!((p.headers.imm, p.payload), (Some(0xCAFE_F00D), &b"imm"[..]));
    let p = check_good(&hex(RC_CM[11]), ROCE_V2_UDP_PORT);
    assert_eq!(p.headers.reth.map(|r| r.dma_len), Some(2148));
    assert_eq!(p.payload, [b'F'; 1024]);
    let p = check_good(&hex(RC_CM[13]), ROCE_V2_UDP_PORT);
    assert_eq!(p.payload, [b'L'; 100]);
}

/// check_icrc_any_id finds the Identification and DF a sender used without seeing them:
/// softrdma's own packets (ID 0, DF) and a ConnectX CNP are in the other tests, these are
/// the kernel's.
#[test]
fn golden_rxe_nonzero_ip_id() {
    let (head, fill, n, crc) = RXE_SEND_FIRST;
    let mut send = hex(head);
    send.extend(std::iter::repeat_n(fill, n));
    send.extend(hex(crc));
    for (pkt, id, op) in [
        (send, 0xe63b, RoceOpcode::RcSendFirst),
        (hex(RXE_ACK), 0xe63c, RoceOpcode::RcAck),
    ] {
        let p = check_good(&pkt, ROCE_V2_UDP_PORT);
        assert_eq!(p.opcode(), op);
        let c = captured(&pkt);
        let IcrcIp::V4 { src, dst, .. } = c.ip else {
            panic!("IPv4")
        };
        assert_eq!(
            c.ip,
            IcrcIp::V4 {
                src,
                dst,
                id,
                dont_fragment: true
            }
        );
        // What a receiver that assumes ID 0 sees: a bad ICRC either way.
        for df in [true, false] {
            let guess = IcrcIp::V4 {
                src,
                dst,
                id: 0,
                dont_fragment: df,
            };
            assert_eq!(
                check_icrc(&guess, c.sport, c.dport, &c.datagram),
                Err(WireError::Malformed(ICRC_MISMATCH))
            );
        }
        let transport = &c.datagram[..c.datagram.len() - ICRC_LEN];
        assert_eq!(
            check_icrc_any_id(src, dst, c.sport, c.dport, &c.datagram),
            Ok((transport, c.ip))
        );
        // A flipped PSN bit, a different source port or address: nothing explains the ICRC.
        let mut bad = c.datagram.clone();
        bad[11] ^= 1;
        assert_eq!(
            check_icrc_any_id(src, dst, c.sport, c.dport, &bad),
            Err(WireError::Malformed(ICRC_MISMATCH))
        );
        assert!(check_icrc_any_id(src, dst, c.sport ^ 1, c.dport, &c.datagram).is_err());
        assert!(check_icrc_any_id(dst, dst, c.sport, c.dport, &c.datagram).is_err());
    }
}

#[test]
fn golden_port_14791() {
    for s in PORT_14791 {
        let pkt = hex(s);
        check_good(&pkt, 14791);
        let c = captured(&pkt);
        assert_eq!(
            check_icrc(&c.ip, c.sport, ROCE_V2_UDP_PORT, &c.datagram),
            Err(WireError::Malformed(ICRC_MISMATCH)),
            "the UDP destination port is covered"
        );
    }
}

fn check_bad_icrc(pkt: &[u8]) -> Captured {
    let (carried, computed) = icrc_of_ip_packet(pkt).unwrap();
    assert_ne!(carried, computed);
    let c = captured(pkt);
    assert_eq!(
        check_icrc(&c.ip, c.sport, c.dport, &c.datagram),
        Err(WireError::Malformed(ICRC_MISMATCH))
    );
    if let IcrcIp::V4 { src, dst, .. } = c.ip {
        assert_eq!(
            check_icrc_any_id(src, dst, c.sport, c.dport, &c.datagram),
            Err(WireError::Malformed(ICRC_MISMATCH))
        );
    }
    c
}

#[test]
fn golden_bad_icrc() {
    // The structure is intact; only the ICRC notices the flipped bit.
    let c = check_bad_icrc(&hex(BAD_ICRC_WRITE[0]));
    let p = RocePacket::parse(&c.datagram[..c.datagram.len() - ICRC_LEN]).unwrap();
    assert_eq!(p.opcode(), RoceOpcode::RcWriteOnly);
    assert_eq!(p.payload, b"RDM@ WRITE payload!");
    let c = check_bad_icrc(&hex(BAD_ICRC_CM_REQ[0]));
    assert_eq!(
        RocePacket::parse(&c.datagram[..c.datagram.len() - ICRC_LEN]).map(|p| p.opcode()),
        Ok(RoceOpcode::UdSendOnly)
    );
}

#[test]
fn golden_truncated_reth() {
    let pkt = hex(TRUNCATED_RETH[0]);
    let c = captured(&pkt);
    assert_eq!(c.datagram.len(), 20);
    let transport = &c.datagram[..c.datagram.len() - ICRC_LEN];
    assert_eq!(
        RocePacket::parse(transport),
        Err(WireError::Truncated {
            what: "RETH",
            need: 16,
            have: 4
        })
    );
    assert!(check_icrc(&c.ip, c.sport, c.dport, &c.datagram).is_err());
    // Also truncated when read without stripping an ICRC first.
    assert!(matches!(
        RocePacket::parse(&c.datagram),
        Err(WireError::Truncated { what: "RETH", .. })
    ));
}

#[test]
fn golden_bad_tver() {
    let pkt = hex(BAD_TVER[0]);
    let (carried, computed) = icrc_of_ip_packet(&pkt).unwrap();
    assert_eq!(carried, computed, "the sample has a valid ICRC");
    let c = captured(&pkt);
    let transport = check_icrc(&c.ip, c.sport, c.dport, &c.datagram).unwrap();
    assert_eq!(
        RocePacket::parse(transport),
        Err(WireError::Malformed("BTH TVer is not 0"))
    );
    assert_eq!(Bth::parse(transport), Err(WireError::Malformed("BTH TVer is not 0")));
}

#[test]
fn ipv6_vectors() {
    let icrcs = [
        [0xcd, 0x28, 0x0c, 0xfd],
        [0xb0, 0x6b, 0xd2, 0x04],
        [0xc5, 0xc7, 0x4c, 0x31],
    ];
    for (s, want) in IPV6.iter().zip(icrcs) {
        let pkt = hex(s);
        assert_eq!(pkt[pkt.len() - 4..], want);
        check_good(&pkt, ROCE_V2_UDP_PORT);
    }
    let p = check_good(&hex(IPV6[0]), ROCE_V2_UDP_PORT);
    assert_eq!(
        (p.opcode(), p.payload),
        (RoceOpcode::RcSendOnly, &b"hello over IPv6"[..])
    );
    assert_eq!(p.headers.bth.pad_count, 1);
    let p = check_good(&hex(IPV6[1]), ROCE_V2_UDP_PORT);
    let h = p.headers;
    assert_eq!(
        (h.bth.opcode, h.bth.fecn, h.bth.solicited, h.bth.psn),
        (RoceOpcode::RcWriteOnlyImm, true, true, 0xff_ffff)
    );
    assert_eq!(
        (h.reth, h.imm),
        (
            Some(Reth {
                va: 0x7f12_3456_7000,
                rkey: 0xdead_beef,
                dma_len: 33
            }),
            Some(0x1234_5678)
        )
    );
    assert_eq!(p.payload, (0..33).collect::<Vec<u8>>());
    let p = check_good(&hex(IPV6[2]), ROCE_V2_UDP_PORT);
    assert!(p.headers.bth.becn);
    assert_eq!(p.headers.aeth.unwrap().kind(), AethKind::Nak(NakCode::InvalidRequest));
    // The addresses are covered.
    let c = captured(&hex(IPV6[0]));
    let other = IcrcIp::V6 {
        src: "fd00::3".parse::<Ipv6Addr>().unwrap(),
        dst: "fd00::2".parse::<Ipv6Addr>().unwrap(),
    };
    assert!(check_icrc(&other, c.sport, c.dport, &c.datagram).is_err());
    assert!(check_icrc(&c.ip, c.sport, c.dport, &c.datagram).is_ok());
}

// ------------------------------------------------------------------ properties

fn opcode() -> impl Strategy<Value = RoceOpcode> {
    prop::sample::select(RoceOpcode::ALL.to_vec())
}

fn bth() -> impl Strategy<Value = Bth> {
    (opcode(), any::<[bool; 6]>(), any::<u16>(), 0..=QPN_MASK, 0..=PSN_MASK).prop_map(|(opcode, f, pkey, qp, psn)| {
        Bth {
            opcode,
            solicited: f[0],
            mig_req: f[1],
            pad_count: 0,
            tver: 0,
            pkey,
            fecn: f[2],
            becn: f[3],
            dest_qp: qp,
            ack_req: f[4],
            psn,
        }
    })
}

#[derive(Debug, Clone)]
struct Ext {
    reth: Reth,
    aeth: Aeth,
    deth: Deth,
    imm: u32,
    ieth: u32,
    atomic: AtomicEth,
    atomic_ack: AtomicAckEth,
}

fn ext() -> impl Strategy<Value = Ext> {
    (
        any::<[u64; 5]>(),
        any::<[u32; 6]>(),
        any::<u8>(),
        0..=MSN_MASK,
        0..=QPN_MASK,
    )
        .prop_map(|(d, w, syn, msn, sqp)| Ext {
            reth: Reth {
                va: d[0],
                rkey: w[0],
                dma_len: w[1],
            },
            aeth: Aeth { syndrome: syn, msn },
            deth: Deth {
                qkey: w[2],
                src_qp: sqp,
            },
            imm: w[3],
            ieth: w[4],
            atomic: AtomicEth {
                va: d[1],
                rkey: w[5],
                swap_add: d[2],
                compare: d[3],
            },
            atomic_ack: AtomicAckEth { orig: d[4] },
        })
}

fn packet() -> impl Strategy<Value = (RoceHeaders, Vec<u8>)> {
    (bth(), ext(), prop::collection::vec(any::<u8>(), 0..300)).prop_map(|(bth, e, mut payload)| {
        let want = bth.opcode.headers();
        let mut h = RoceHeaders::new(bth);
        h.reth = want.reth.then_some(e.reth);
        h.aeth = want.aeth.then_some(e.aeth);
        h.deth = want.deth.then_some(e.deth);
        h.imm = want.immdt.then_some(e.imm);
        h.ieth = want.ieth.then_some(e.ieth);
        h.atomic = want.atomic_eth.then_some(e.atomic);
        h.atomic_ack = want.atomic_ack_eth.then_some(e.atomic_ack);
        if !bth.opcode.has_payload() {
            payload.clear();
        }
        h.bth.pad_count = pad_len(payload.len()) as u8;
        (h, payload)
    })
}

fn icrc_ip() -> impl Strategy<Value = IcrcIp> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<[u8; 4]>(), any::<u16>(), any::<bool>()).prop_map(|(s, d, id, df)| IcrcIp::V4 {
            src: Ipv4Addr::from(s),
            dst: Ipv4Addr::from(d),
            id,
            dont_fragment: df,
        }),
        (any::<[u8; 16]>(), any::<[u8; 16]>()).prop_map(|(s, d)| IcrcIp::V6 {
            src: Ipv6Addr::from(s),
            dst: Ipv6Addr::from(d),
        }),
    ]
}

/// The IP packet a kernel would build, with arbitrary values in the fields the ICRC masks.
fn ip_packet(ip: &IcrcIp, sport: u16, dport: u16, datagram: &[u8], junk: [u8; 6]) -> Vec<u8> {
    let udp_len = (8 + datagram.len()) as u16;
    let mut p = Vec::new();
    match ip {
        IcrcIp::V4 {
            src,
            dst,
            id,
            dont_fragment,
        } => {
            p.extend_from_slice(&[0x45, junk[0]]);
            p.extend_from_slice(&(20 + udp_len).to_be_bytes());
            p.extend_from_slice(&id.to_be_bytes());
            p.extend_from_slice(&(if *dont_fragment { 0x4000u16 } else { 0 }).to_be_bytes());
            p.extend_from_slice(&[junk[1], 17, junk[2], junk[3]]);
            p.extend_from_slice(&src.octets());
            p.extend_from_slice(&dst.octets());
        }
        IcrcIp::V6 { src, dst } => {
            p.extend_from_slice(&[0x60 | (junk[0] >> 4), junk[1], junk[2], junk[3]]);
            p.extend_from_slice(&udp_len.to_be_bytes());
            p.extend_from_slice(&[17, junk[4]]);
            p.extend_from_slice(&src.octets());
            p.extend_from_slice(&dst.octets());
        }
    }
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&udp_len.to_be_bytes());
    p.extend_from_slice(&[junk[4], junk[5]]);
    p.extend_from_slice(datagram);
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parsers_never_panic(buf in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = RocePacket::parse(&buf);
        let _ = RoceHeaders::parse(&buf);
        let _ = Bth::parse(&buf);
        let _ = Reth::parse(&buf);
        let _ = Aeth::parse(&buf).map(|a| a.kind());
        let _ = Deth::parse(&buf);
        let _ = AtomicEth::parse(&buf);
        let _ = AtomicAckEth::parse(&buf);
        let _ = icrc_of_ip_packet(&buf);
        let ip = IcrcIp::v4_df(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST);
        let _ = check_icrc(&ip, 1, ROCE_V2_UDP_PORT, &buf);
        let _ = icrc(&ip, 1, ROCE_V2_UDP_PORT, &buf);
    }

    #[test]
    fn parse_of_plausible_bytes(op in opcode(), b1 in any::<u8>(), rest in prop::collection::vec(any::<u8>(), 0..120)) {
        // A known opcode and TVer 0, then anything: parse must not panic, and
        // whatever it accepts must re-encode to something it parses the same way.
        let mut buf = vec![op.as_u8(), b1 & 0xf0];
        buf.extend_from_slice(&rest);
        if let Ok(p) = RocePacket::parse(&buf) {
            let mut out = Vec::new();
            p.emit(&mut out);
            prop_assert_eq!(out.len(), buf.len());
            let q = RocePacket::parse(&out).unwrap();
            prop_assert_eq!(q, p);
        }
        // Any IP-looking prefix.
        let mut v4 = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0];
        v4.extend_from_slice(&rest);
        let _ = icrc_of_ip_packet(&v4);
        let mut v6 = vec![0x60, 0, 0, 0, 0, rest.len() as u8, 17, 64];
        v6.extend_from_slice(&rest);
        let _ = icrc_of_ip_packet(&v6);
    }

    #[test]
    fn emit_parse_round_trip((h, payload) in packet()) {
        let mut out = vec![0xab; 3];
        h.emit(&payload, &mut out);
        let wire = &out[3..];
        prop_assert_eq!(wire.len(), h.wire_len(payload.len()));
        prop_assert_eq!(wire.len() % 4, 0);
        let p = RocePacket::parse(wire).unwrap();
        prop_assert_eq!(p.headers, h);
        prop_assert_eq!(p.payload, &payload[..]);
        prop_assert_eq!(RoceHeaders::parse(wire).unwrap(), (h, h.header_len()));
        // Every strict prefix that is a multiple of 4 but cuts a header is Truncated.
        for n in (0..h.header_len()).step_by(4) {
            let truncated = matches!(RocePacket::parse(&wire[..n]), Err(WireError::Truncated { .. }));
            prop_assert!(truncated, "prefix {}", n);
        }
    }

    #[test]
    fn icrc_round_trip(
        (h, payload) in packet(),
        ip in icrc_ip(),
        sport in any::<u16>(),
        junk in any::<[u8; 6]>(),
        flip in any::<prop::sample::Index>(),
        bit in 0..8u8,
    ) {
        let mut dg = Vec::new();
        h.emit(&payload, &mut dg);
        append_icrc(&ip, sport, ROCE_V2_UDP_PORT, &mut dg, 0);
        let transport = check_icrc(&ip, sport, ROCE_V2_UDP_PORT, &dg).unwrap();
        prop_assert_eq!(RocePacket::parse(transport).unwrap().payload, &payload[..]);
        // Same value from a full IP packet with junk in the masked fields.
        let pkt = ip_packet(&ip, sport, ROCE_V2_UDP_PORT, &dg, junk);
        let (carried, computed) = icrc_of_ip_packet(&pkt).unwrap();
        prop_assert_eq!(carried, computed);
        // Any single-bit error outside the masked BTH byte 4 is caught (ICRC included).
        let i = flip.index(dg.len());
        let mut bad = dg.clone();
        bad[i] ^= 1 << bit;
        let r = check_icrc(&ip, sport, ROCE_V2_UDP_PORT, &bad);
        if i == 4 {
            prop_assert!(r.is_ok());
        } else {
            prop_assert_eq!(r, Err(WireError::Malformed(ICRC_MISMATCH)));
        }
    }
    #[test]
    fn icrc_any_id_round_trip(
        (h, payload) in packet(),
        src in any::<[u8; 4]>(),
        dst in any::<[u8; 4]>(),
        id in any::<u16>(),
        dont_fragment in any::<bool>(),
        sport in any::<u16>(),
        flip in any::<prop::sample::Index>(),
        bit in 0..8u8,
    ) {
        let (src, dst) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
        let ip = IcrcIp::V4 { src, dst, id, dont_fragment };
        let mut dg = Vec::new();
        h.emit(&payload, &mut dg);
        append_icrc(&ip, sport, ROCE_V2_UDP_PORT, &mut dg, 0);
        let transport = &dg[..dg.len() - ICRC_LEN];
        prop_assert_eq!(check_icrc_any_id(src, dst, sport, ROCE_V2_UDP_PORT, &dg), Ok((transport, ip)));
        // A single-bit error is caught unless it is in the masked BTH byte 4 or at one of the
        // positions where some other (ID, DF) explains it; below 64 KiB these are (UDP
        // payload offset, bit) (173, 3) and (1834, 6), then 8 more past 26 KiB.
        let i = flip.index(dg.len());
        let mut bad = dg.clone();
        bad[i] ^= 1 << bit;
        let r = check_icrc_any_id(src, dst, sport, ROCE_V2_UDP_PORT, &bad);
        if i == 4 {
            prop_assert_eq!(r, Ok((&bad[..dg.len() - ICRC_LEN], ip)));
        } else if [(173, 3), (1834, 6)].contains(&(i, bit)) {
            let explained = matches!(r, Ok((_, IcrcIp::V4 { id: other, .. })) if other != id);
            prop_assert!(explained, "{:?}", r);
        } else {
            prop_assert_eq!(r, Err(WireError::Malformed(ICRC_MISMATCH)));
        }
    }
}
