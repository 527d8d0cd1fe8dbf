//! The initiator -> responder and responder -> initiator TCP byte streams of
//! samples/good/iwarp_rfc6581.pcap (wirecheck), decoded the way a receiver
//! would: MPA Request/Reply, then FPDUs, fed in chunks of every size.

use softrdma_wire::*;

const INITIATOR: &[&str] = &[
    "4d504120494420526571204672616d65500200148010801077697265636865636b20726571207064000ec14000000000",
    "0000000000000000a30572ab002c41430000000000000000000000010000000068656c6c6f2066726f6d20736f66742d",
    "69574152502053454e440000b6973abe0021c1400012340000007f000000100052444d41205752495445207061796c6f",
    "61642100d4417b77002e41410000000000000001000000010000000000abcd0000007f00000020000000002000567800",
    "00007f0000003000cba7748b001e414500000000000000000000000200000000636f616c6573636564202331cb58da1a",
    "001ac1400012340000007f0000001100636f616c65736365642023325c34c03a013e4143000000000000000000000003",
    "000000005353535353535353535353535353535353535353535353535353535353535353535353535353535353535353",
    "535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353",
    "535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353",
    "535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353",
    "535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353",
    "535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353535353",
    "53535353535353535353535353535353cb600e8f",
];

const RESPONDER: &[&str] = &[
    "4d504120494420526570204672616d65500200148008800877697265636865636b20726570207064002ec14200abcd00",
    "00007f0000002000000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f3cab523800254144",
    "001234000000000000000001000000007265706c7920772f20696e76616c6964617465001e9ffd87",
];

fn hex(parts: &[&str]) -> Vec<u8> {
    let s: String = parts.concat();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A decoded message: opcode, last flag and payload length.
type Msg = (Opcode, bool, usize);

/// Feeds `stream` in `chunk`-byte pieces; returns the MPA frame and the
/// messages, re-encoding each piece and checking it matches the input.
fn receive(stream: &[u8], chunk: usize) -> (MpaFrame, Vec<Msg>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut mpa = None;
    let mut msgs = Vec::new();
    let mut reencoded = Vec::new();
    for piece in stream.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            let used = if mpa.is_none() {
                let Some((f, n)) = MpaFrame::parse(&buf).unwrap() else {
                    break;
                };
                f.emit(&mut reencoded).unwrap();
                mpa = Some(f);
                n
            } else {
                let Some(f) = parse_fpdu(&buf, true).unwrap() else {
                    break;
                };
                let (h, n) = SegmentHeader::parse(f.ulpdu).unwrap();
                let payload = &f.ulpdu[n..];
                let mut ulpdu = Vec::new();
                h.emit(&mut ulpdu);
                match h.opcode {
                    Opcode::ReadRequest => ReadRequest::parse(payload).unwrap().emit(&mut ulpdu),
                    _ => ulpdu.extend_from_slice(payload),
                }
                emit_fpdu(&[&ulpdu], true, &mut reencoded).unwrap();
                msgs.push((h.opcode, h.last, payload.len()));
                f.wire_len
            };
            buf.drain(..used);
        }
    }
    assert!(buf.is_empty(), "left over bytes");
    assert_eq!(reencoded, stream);
    (mpa.expect("MPA frame"), msgs)
}

#[test]
fn initiator_stream() {
    let stream = hex(INITIATOR);
    assert_eq!(stream.len(), 596);
    for chunk in 1..=stream.len() {
        let (req, msgs) = receive(&stream, chunk);
        assert_eq!(req.kind, MpaKind::Request);
        assert_eq!(req.enhanced.map(|e| e.ird), Some(16));
        assert_eq!(
            msgs,
            [
                (Opcode::RdmaWrite, true, 0),
                (Opcode::Send, true, 26),
                (Opcode::RdmaWrite, true, 19),
                (Opcode::ReadRequest, true, READ_REQUEST_LEN),
                (Opcode::SendSe, true, 12),
                (Opcode::RdmaWrite, true, 12),
                (Opcode::Send, true, 300),
            ]
        );
    }
}

#[test]
fn responder_stream() {
    let stream = hex(RESPONDER);
    for chunk in 1..=stream.len() {
        let (rep, msgs) = receive(&stream, chunk);
        assert_eq!(rep.kind, MpaKind::Reply);
        assert!(rep.crc && !rep.reject);
        assert_eq!(
            msgs,
            [(Opcode::ReadResponse, true, 32), (Opcode::SendInvalidate, true, 19)]
        );
    }
}
