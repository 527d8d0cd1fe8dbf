//! Every softrdma-wire decoder on arbitrary bytes, plus round-trip properties:
//! whatever parses re-emits and re-parses to the same value (and, where the format has no
//! ignored bits, to the same bytes). The layered path FPDU -> DDP/RDMAP header -> Read
//! Request / Terminate payload is decoded too, so a captured FPDU exercises every layer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_wire::*;

fn mpa(data: &[u8]) {
    let Ok(Some((f, n))) = MpaFrame::parse(data) else {
        return;
    };
    assert!(n >= MPA_HEADER_LEN && n <= data.len());
    assert_eq!(f.wire_len(), n);
    // Consumption does not depend on what follows, and every proper prefix is "need more".
    assert_eq!(MpaFrame::parse(&data[..n]), Ok(Some((f.clone(), n))));
    for cut in [0, 1, 15, 16, 19, 20, n - 1] {
        if cut < n {
            assert_eq!(
                MpaFrame::parse(&data[..cut]),
                Ok(None),
                "prefix {cut} of a {n}-byte frame"
            );
        }
    }
    let mut out = Vec::new();
    f.emit(&mut out).expect("a parsed MPA frame must re-emit");
    assert_eq!(out.len(), n);
    // Byte-exact except the four reserved flag bits, which are ignored on receive and sent as 0.
    assert_eq!(out[..16], data[..16]);
    assert_eq!(out[16], data[16] & 0xf0);
    assert_eq!(out[17..], data[17..n]);
    assert_eq!(MpaFrame::parse(&out), Ok(Some((f, n))));
}

fn ird_ord(data: &[u8]) {
    if let Some(b) = data.get(..4) {
        let b: [u8; 4] = b.try_into().unwrap();
        assert_eq!(IrdOrd::from_bytes(b).to_bytes(), b);
    }
}

fn read_request(data: &[u8]) {
    if let Ok(r) = ReadRequest::parse(data) {
        let mut out = Vec::new();
        r.emit(&mut out);
        assert_eq!(out, data);
        assert_eq!(ReadRequest::parse(&out), Ok(r));
    }
}

fn terminate(data: &[u8]) {
    if let Ok(t) = Terminate::parse(data) {
        let _ = t.describe();
        let _ = softrdma_wire::term::etype_name(t.layer, t.etype);
        let _ = softrdma_wire::term::code_name(t.layer, t.etype, t.ecode);
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(out.len(), t.wire_len());
        assert!(out.len() <= data.len());
        assert_eq!(Terminate::parse(&out).as_ref(), Ok(&t));
        // Same error code; layer/etype re-emitted in the RFC's nibble order, which is the
        // received byte or (a Linux siw little-endian Terminate) its nibbles swapped.
        assert_eq!(out[1], data[1]);
        assert!(out[0] == data[0] || out[0] == data[0].rotate_left(4));
    }
}

fn segment(data: &[u8]) -> Option<(SegmentHeader, usize)> {
    let (h, n) = SegmentHeader::parse(data).ok()?;
    assert_eq!(n, h.len());
    assert!(n == DDP_TAGGED_HDR_LEN || n == DDP_UNTAGGED_HDR_LEN);
    assert_eq!(h.ddp.is_tagged(), h.opcode.is_tagged());
    let mut out = Vec::new();
    h.emit(&mut out);
    assert_eq!(out, data[..n], "DDP/RDMAP header has no ignored bits");
    let mut fixed = [0x5a; 18];
    assert_eq!(h.write_to(&mut fixed), n);
    assert_eq!(fixed[..n], data[..n]);
    assert_eq!(SegmentHeader::parse(&out), Ok((h, n)));
    Some((h, n))
}

fn fpdu(data: &[u8], crc: bool) {
    let Ok(Some(f)) = parse_fpdu(data, crc) else {
        return;
    };
    let len = f.ulpdu.len();
    assert_eq!(f.wire_len, fpdu_wire_len(len));
    assert!(f.wire_len <= data.len() && f.wire_len % 4 == 0);
    // Stream framing: same answer with exactly the frame, "need more" for any shorter prefix.
    assert_eq!(parse_fpdu(&data[..f.wire_len], crc), Ok(Some(f)));
    assert_eq!(parse_fpdu(&data[..f.wire_len - 1], crc), Ok(None));
    let mut out = Vec::new();
    let (a, b) = f.ulpdu.split_at(len / 2);
    emit_fpdu(&[a, b], crc, &mut out).expect("a parsed ULPDU must fit an FPDU");
    assert_eq!(out.len(), f.wire_len);
    assert_eq!(out[..2 + len], data[..2 + len]);
    let pad_zero = data[2 + len..f.wire_len - 4].iter().all(|&b| b == 0);
    if crc && pad_zero {
        // Verified CRC + zero pad: byte-exact round trip.
        assert_eq!(out, data[..f.wire_len]);
    }
    let g = parse_fpdu(&out, crc).unwrap().unwrap();
    assert_eq!((g.ulpdu, g.wire_len), (f.ulpdu, f.wire_len));

    // Layered decode of the ULPDU, as the engine does it.
    if let Some((h, n)) = segment(f.ulpdu) {
        let payload = &f.ulpdu[n..];
        match h.opcode {
            Opcode::ReadRequest => read_request(payload),
            Opcode::Terminate => terminate(payload),
            _ => {}
        }
    }
}

fn crc(data: &[u8]) {
    let at = data.first().map_or(0, |&b| usize::from(b) % (data.len() + 1));
    let mut c = Crc32c::new();
    c.update(&data[..at]);
    c.update(&data[at..]);
    assert_eq!(c.finish(), crc32c(data));
}

/// Encode-first direction: values built from the input must survive emit -> parse.
fn encode_first(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let b = |i: usize| data[i % data.len()];
    let opcode = Opcode::from_u8(b(0) & 7).unwrap();
    let ddp = if opcode.is_tagged() {
        DdpHeader::Tagged {
            stag: u32::from_le_bytes([b(1), b(2), b(3), b(4)]),
            to: u64::from_le_bytes([b(1), b(2), b(3), b(4), b(5), b(6), b(7), b(0)]),
        }
    } else {
        DdpHeader::Untagged {
            inval_stag: u32::from_le_bytes([b(1), b(2), b(3), b(4)]),
            qn: u32::from(b(5)),
            msn: u32::from_le_bytes([b(4), b(5), b(6), b(7)]),
            mo: u32::from_le_bytes([b(7), b(6), b(5), b(4)]),
        }
    };
    let h = SegmentHeader {
        last: b(0) & 0x80 != 0,
        opcode,
        ddp,
    };
    let mut out = Vec::new();
    h.emit(&mut out);
    assert_eq!(SegmentHeader::parse(&out), Ok((h, out.len())));

    let pd_len = usize::from(b(6)) * 3 % (MPA_MAX_PD_LEN + 8);
    let enhanced = (b(0) & 0x40 != 0).then(|| IrdOrd::from_bytes([b(1), b(2), b(3), b(4)]));
    let frame = MpaFrame {
        kind: if b(0) & 0x20 != 0 {
            MpaKind::Reply
        } else {
            MpaKind::Request
        },
        markers: b(5) & 1 != 0,
        crc: b(5) & 2 != 0,
        reject: b(5) & 4 != 0,
        revision: if enhanced.is_some() && b(5) & 8 == 0 { 2 } else { b(7) },
        enhanced,
        private_data: data.iter().copied().cycle().take(pd_len).collect(),
    };
    let mut out = Vec::new();
    match frame.emit(&mut out) {
        Ok(()) => {
            assert_eq!(out.len(), frame.wire_len());
            assert_eq!(MpaFrame::parse(&out), Ok(Some((frame, out.len()))));
        }
        Err(_) => assert!(out.is_empty(), "nothing appended on error"),
    }

    let rr = ReadRequest {
        sink_stag: u32::from(b(1)) << 8,
        sink_to: u64::from_le_bytes([b(0), b(1), b(2), b(3), b(4), b(5), b(6), b(7)]),
        size: u32::from_be_bytes([b(2), b(3), b(4), b(5)]),
        src_stag: u32::from(b(3)),
        src_to: u64::from(b(4)) << 40,
    };
    let mut out = Vec::new();
    rr.emit(&mut out);
    assert_eq!(out.len(), READ_REQUEST_LEN);
    assert_eq!(ReadRequest::parse(&out), Ok(rr));

    if let Ok(layer) = TermLayer::from_u8(b(1) >> 6) {
        let mut hdr = Vec::new();
        h.emit(&mut hdr);
        let t = Terminate {
            layer,
            etype: b(2) & 0x0f,
            ecode: b(3),
            ddp_segment_len: (b(4) & 1 != 0).then(|| u16::from_le_bytes([b(5), b(6)])),
            ddp_header: (b(4) & 2 != 0).then_some(hdr),
            rdmap_header: (b(4) & 4 != 0).then(|| data.iter().copied().cycle().take(READ_REQUEST_LEN).collect()),
        };
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(out.len(), t.wire_len());
        assert_eq!(Terminate::parse(&out), Ok(t));
    }

    let ulpdu = &data[..data.len().min(MPA_MAX_ULPDU)];
    for crc in [false, true] {
        let mut out = Vec::new();
        emit_fpdu(&[ulpdu], crc, &mut out).unwrap();
        let f = parse_fpdu(&out, crc).unwrap().unwrap();
        assert_eq!((f.ulpdu, f.wire_len), (ulpdu, out.len()));
    }
}

fuzz_target!(|data: &[u8]| {
    mpa(data);
    ird_ord(data);
    read_request(data);
    terminate(data);
    segment(data);
    let _ = Opcode::from_u8(data.first().copied().unwrap_or(0));
    let _ = TermLayer::from_u8(data.first().copied().unwrap_or(0) >> 4);
    fpdu(data, true);
    fpdu(data, false);
    crc(data);
    encode_first(data);
});
