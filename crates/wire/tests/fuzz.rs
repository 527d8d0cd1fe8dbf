//! Property tests: every parser on random bytes and on every truncation of
//! valid encodings; emit -> parse round trips for every type.

use proptest::prelude::*;
use softrdma_wire::*;

fn opcode() -> impl Strategy<Value = Opcode> {
    (0u8..8).prop_map(|v| Opcode::from_u8(v).unwrap())
}

fn segment_header() -> impl Strategy<Value = SegmentHeader> {
    (opcode(), any::<bool>(), any::<[u32; 4]>(), any::<u64>()).prop_map(|(opcode, last, w, to)| {
        let ddp = if opcode.is_tagged() {
            DdpHeader::Tagged { stag: w[0], to }
        } else {
            DdpHeader::Untagged {
                inval_stag: w[0],
                qn: w[1],
                msn: w[2],
                mo: w[3],
            }
        };
        SegmentHeader { last, opcode, ddp }
    })
}

fn read_request() -> impl Strategy<Value = ReadRequest> {
    (any::<[u32; 3]>(), any::<[u64; 2]>()).prop_map(|(w, d)| ReadRequest {
        sink_stag: w[0],
        sink_to: d[0],
        size: w[1],
        src_stag: w[2],
        src_to: d[1],
    })
}

fn ird_ord() -> impl Strategy<Value = IrdOrd> {
    (0u16..0x4000, 0u16..0x4000, any::<[bool; 4]>()).prop_map(|(ird, ord, f)| IrdOrd {
        ird,
        ord,
        peer_to_peer: f[0],
        zero_length_rtr: f[1],
        write_rtr: f[2],
        read_rtr: f[3],
    })
}

fn mpa_frame() -> impl Strategy<Value = MpaFrame> {
    (
        any::<bool>(),
        any::<[bool; 3]>(),
        any::<u8>(),
        proptest::option::of(ird_ord()),
        proptest::collection::vec(any::<u8>(), 0..=508),
    )
        .prop_map(|(req, f, rev, enhanced, private_data)| MpaFrame {
            kind: if req { MpaKind::Request } else { MpaKind::Reply },
            markers: f[0],
            crc: f[1],
            reject: f[2],
            revision: if enhanced.is_some() { 2 } else { rev },
            enhanced,
            private_data,
        })
}

fn terminate() -> impl Strategy<Value = Terminate> {
    (
        0u8..3,
        0u8..16,
        any::<u8>(),
        proptest::option::of(any::<u16>()),
        proptest::option::of(segment_header()),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 28)),
    )
        .prop_map(|(layer, etype, ecode, ddp_segment_len, hdr, rdmap_header)| {
            let ddp_header = hdr.map(|h| {
                let mut v = Vec::new();
                h.emit(&mut v);
                v
            });
            Terminate {
                layer: TermLayer::from_u8(layer).unwrap(),
                etype,
                ecode,
                ddp_segment_len,
                ddp_header,
                rdmap_header,
            }
        })
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(b in bytes(700), crc in any::<bool>()) {
        if let Ok(Some((f, n))) = MpaFrame::parse(&b) {
            prop_assert!(n <= b.len());
            let mut out = Vec::new();
            f.emit(&mut out).unwrap();
            // Only the four reserved flag bits may differ.
            prop_assert_eq!(out.len(), n);
            prop_assert_eq!(out[16], b[16] & 0xF0);
            prop_assert_eq!(&out[17..], &b[17..n]);
        }
        if let Ok(Some(f)) = parse_fpdu(&b, crc) {
            prop_assert!(f.wire_len <= b.len());
            prop_assert_eq!(f.wire_len, fpdu_wire_len(f.ulpdu.len()));
        }
        if let Ok((h, n)) = SegmentHeader::parse(&b) {
            let mut out = Vec::new();
            h.emit(&mut out);
            prop_assert_eq!(&out[..], &b[..n]);
        }
        let _ = ReadRequest::parse(&b);
        if let Ok(t) = Terminate::parse(&b) {
            let mut out = Vec::new();
            t.emit(&mut out);
            prop_assert_eq!(Terminate::parse(&out), Ok(t.clone()));
            let _ = t.describe();
        }
    }

    #[test]
    fn mpa_header_shaped_bytes(kind in any::<bool>(), rest in bytes(600)) {
        // Random bytes behind a valid key reach the flag/length checks.
        let mut b = if kind { MPA_REQ_KEY.to_vec() } else { MPA_REP_KEY.to_vec() };
        b.extend_from_slice(&rest);
        match MpaFrame::parse(&b) {
            Ok(None) => prop_assert!(
                b.len() < MPA_HEADER_LEN
                    || b.len() < MPA_HEADER_LEN + usize::from(u16::from_be_bytes([b[18], b[19]]))
            ),
            Ok(Some((f, n))) => prop_assert_eq!(f.wire_len(), n),
            Err(WireError::PrivateDataTooLong(n)) => prop_assert!(n > MPA_MAX_PD_LEN),
            Err(WireError::Malformed(_)) => prop_assert!(b[16] & 0x10 != 0),
            Err(e) => prop_assert!(false, "unexpected {:?}", e),
        }
    }

    #[test]
    fn segment_shaped_bytes(c0 in any::<u8>(), c1 in any::<u8>(), rest in bytes(20)) {
        let mut b = vec![c0, c1];
        b.extend_from_slice(&rest);
        if let Ok((h, n)) = SegmentHeader::parse(&b) {
            prop_assert_eq!(h.len(), n);
            prop_assert_eq!(h.ddp.is_tagged(), h.opcode.is_tagged());
        }
    }

    #[test]
    fn mpa_roundtrip_and_truncations(f in mpa_frame()) {
        let mut out = Vec::new();
        f.emit(&mut out).unwrap();
        prop_assert_eq!(out.len(), f.wire_len());
        prop_assert_eq!(MpaFrame::parse(&out), Ok(Some((f.clone(), out.len()))));
        for cut in 0..out.len() {
            prop_assert_eq!(MpaFrame::parse(&out[..cut]), Ok(None));
        }
    }

    #[test]
    fn fpdu_roundtrip_and_truncations(
        parts in proptest::collection::vec(bytes(300), 0..4),
        crc in any::<bool>(),
    ) {
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let whole = parts.concat();
        let mut out = Vec::new();
        emit_fpdu(&refs, crc, &mut out).unwrap();
        prop_assert_eq!(out.len(), fpdu_wire_len(whole.len()));
        prop_assert_eq!(out.len() % 4, 0);
        let f = parse_fpdu(&out, crc).unwrap().unwrap();
        prop_assert_eq!(f.ulpdu, &whole[..]);
        prop_assert_eq!(f.wire_len, out.len());
        for cut in 0..out.len() {
            prop_assert_eq!(parse_fpdu(&out[..cut], crc), Ok(None));
        }
    }

    #[test]
    fn fpdu_corruption_is_caught(payload in bytes(200), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut out = Vec::new();
        emit_fpdu(&[&payload], true, &mut out).unwrap();
        // Any single-bit error after the length field is a CRC error.
        let i = 2 + pos.index(out.len() - 2);
        out[i] ^= 1 << bit;
        let is_bad_crc = matches!(parse_fpdu(&out, true), Err(WireError::BadCrc { .. }));
        prop_assert!(is_bad_crc);
    }

    #[test]
    fn segment_roundtrip_and_truncations(h in segment_header(), payload in bytes(40)) {
        let mut out = Vec::new();
        h.emit(&mut out);
        prop_assert_eq!(out.len(), h.len());
        let hl = out.len();
        out.extend_from_slice(&payload);
        prop_assert_eq!(SegmentHeader::parse(&out), Ok((h, hl)));
        for cut in 0..hl {
            let is_truncated = matches!(
                SegmentHeader::parse(&out[..cut]),
                Err(WireError::Truncated { .. })
            );
            prop_assert!(is_truncated);
        }
    }

    #[test]
    fn read_request_roundtrip_and_truncations(r in read_request()) {
        let mut out = Vec::new();
        r.emit(&mut out);
        prop_assert_eq!(out.len(), READ_REQUEST_LEN);
        prop_assert_eq!(ReadRequest::parse(&out), Ok(r));
        for cut in 0..out.len() {
            let is_truncated = matches!(ReadRequest::parse(&out[..cut]), Err(WireError::Truncated { .. }));
            prop_assert!(is_truncated);
        }
    }

    #[test]
    fn terminate_roundtrip_and_truncations(t in terminate()) {
        let mut out = Vec::new();
        t.emit(&mut out);
        prop_assert_eq!(out.len(), t.wire_len());
        prop_assert_eq!(Terminate::parse(&out), Ok(t.clone()));
        prop_assert!(!t.describe().is_empty());
        for cut in 0..out.len() {
            let is_truncated = matches!(Terminate::parse(&out[..cut]), Err(WireError::Truncated { .. }));
            prop_assert!(is_truncated);
        }
    }

    #[test]
    fn full_message_stack(h in segment_header(), t in terminate(), r in read_request(), crc in any::<bool>()) {
        // DDP/RDMAP header + payload inside an FPDU, decoded back layer by layer.
        let mut ulpdu = Vec::new();
        h.emit(&mut ulpdu);
        match h.opcode {
            Opcode::ReadRequest => r.emit(&mut ulpdu),
            Opcode::Terminate => t.emit(&mut ulpdu),
            _ => ulpdu.extend_from_slice(b"payload"),
        }
        let mut stream = Vec::new();
        emit_fpdu(&[&ulpdu], crc, &mut stream).unwrap();
        let f = parse_fpdu(&stream, crc).unwrap().unwrap();
        let (h2, n) = SegmentHeader::parse(f.ulpdu).unwrap();
        prop_assert_eq!(h2, h);
        match h.opcode {
            Opcode::ReadRequest => prop_assert_eq!(ReadRequest::parse(&f.ulpdu[n..]), Ok(r)),
            Opcode::Terminate => prop_assert_eq!(Terminate::parse(&f.ulpdu[n..]), Ok(t)),
            _ => prop_assert_eq!(&f.ulpdu[n..], b"payload"),
        }
    }
}
