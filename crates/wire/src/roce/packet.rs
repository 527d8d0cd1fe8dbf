//! A whole IB transport packet as carried in a RoCEv2 UDP datagram, minus the ICRC:
//!
//! ```text
//! BTH | [DETH] [RETH] [AtomicETH] [AETH] [AtomicAckETH] [ImmDt] [IETH] | payload | pad (0..3)
//! ```
//!
//! The opcode decides exactly which extension headers are present (see
//! [`RoceOpcode::headers`]); the BTH pad count says how many zero bytes follow the
//! payload so that the transport length is a multiple of 4.

use super::bth::{Bth, BTH_LEN};
use super::headers::{parse_u32, Aeth, AtomicAckEth, AtomicEth, Deth, Reth, IETH_LEN, IMMDT_LEN};
use super::opcode::{HeaderSet, RoceOpcode};
use crate::error::WireError;

/// The zero bytes needed after a payload of `payload_len` bytes (the BTH PadCnt).
pub fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() % 4
}

/// Appends the pad after a payload of `payload_len` bytes ([`pad_len`] zero bytes).
pub fn push_pad(out: &mut Vec<u8>, payload_len: usize) {
    out.extend_from_slice(&[0u8; 3][..pad_len(payload_len)]);
}

/// BTH plus the extension headers of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceHeaders {
    /// Base transport header.
    pub bth: Bth,
    /// RETH (WRITE First/Only, READ Request).
    pub reth: Option<Reth>,
    /// AETH (ACK, Atomic ACK, READ Response First/Last/Only).
    pub aeth: Option<Aeth>,
    /// DETH (UD).
    pub deth: Option<Deth>,
    /// ImmDt (the `*Imm` opcodes).
    pub imm: Option<u32>,
    /// IETH: the R_Key to invalidate (the `*Inv` opcodes).
    pub ieth: Option<u32>,
    /// AtomicETH (CmpSwap, FetchAdd).
    pub atomic: Option<AtomicEth>,
    /// AtomicAckETH (Atomic ACK).
    pub atomic_ack: Option<AtomicAckEth>,
}

impl RoceHeaders {
    /// Headers with the given BTH and no extension header; fill in the ones the opcode needs.
    pub fn new(bth: Bth) -> RoceHeaders {
        RoceHeaders {
            bth,
            reth: None,
            aeth: None,
            deth: None,
            imm: None,
            ieth: None,
            atomic: None,
            atomic_ack: None,
        }
    }

    /// Which extension headers are present (`Some`).
    pub fn present(&self) -> HeaderSet {
        HeaderSet {
            reth: self.reth.is_some(),
            aeth: self.aeth.is_some(),
            deth: self.deth.is_some(),
            immdt: self.imm.is_some(),
            ieth: self.ieth.is_some(),
            atomic_eth: self.atomic.is_some(),
            atomic_ack_eth: self.atomic_ack.is_some(),
        }
    }

    /// True if the present extension headers are exactly the ones the opcode requires.
    pub fn matches_opcode(&self) -> bool {
        self.present() == self.bth.opcode.headers()
    }

    /// Length of the BTH plus the present extension headers.
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.present().ext_len()
    }

    /// Parses the BTH and exactly the extension headers its opcode requires;
    /// returns them and the number of bytes used. Payload and pad are not looked at.
    pub fn parse(buf: &[u8]) -> Result<(RoceHeaders, usize), WireError> {
        let bth = Bth::parse(buf)?;
        let want = bth.opcode.headers();
        let mut h = RoceHeaders::new(bth);
        let mut at = BTH_LEN;
        let rest = |at: usize| buf.get(at..).unwrap_or(&[]);
        if want.deth {
            h.deth = Some(Deth::parse(rest(at))?);
            at += Deth::LEN;
        }
        if want.reth {
            h.reth = Some(Reth::parse(rest(at))?);
            at += Reth::LEN;
        }
        if want.atomic_eth {
            h.atomic = Some(AtomicEth::parse(rest(at))?);
            at += AtomicEth::LEN;
        }
        if want.aeth {
            h.aeth = Some(Aeth::parse(rest(at))?);
            at += Aeth::LEN;
        }
        if want.atomic_ack_eth {
            h.atomic_ack = Some(AtomicAckEth::parse(rest(at))?);
            at += AtomicAckEth::LEN;
        }
        if want.immdt {
            h.imm = Some(parse_u32("ImmDt", rest(at))?);
            at += IMMDT_LEN;
        }
        if want.ieth {
            h.ieth = Some(parse_u32("IETH", rest(at))?);
            at += IETH_LEN;
        }
        Ok((h, at))
    }

    /// Appends BTH, the present extension headers, `payload` and 0..3 zero pad bytes.
    ///
    /// The BTH pad count is computed from `payload.len()` (the value in `self.bth`
    /// is ignored). No ICRC is appended (see [`append_icrc`](super::icrc::append_icrc)).
    /// In debug builds, asserts that the present headers match the opcode and that
    /// opcodes without payload get none.
    pub fn emit(&self, payload: &[u8], out: &mut Vec<u8>) {
        self.emit_headers(payload.len(), out);
        out.extend_from_slice(payload);
        push_pad(out, payload.len());
    }

    /// Appends the headers [`emit`](Self::emit) writes before `payload_len` payload bytes (the
    /// BTH's pad count included). The caller then appends the payload itself (from wherever
    /// it lies, without staging it) and the pad ([`push_pad`]).
    pub fn emit_headers(&self, payload_len: usize, out: &mut Vec<u8>) {
        debug_assert!(
            self.matches_opcode(),
            "extension headers {:?} do not match opcode {:?}",
            self.present(),
            self.bth.opcode
        );
        debug_assert!(
            payload_len == 0 || self.bth.opcode.has_payload(),
            "{:?} carries no payload",
            self.bth.opcode
        );
        let pad = pad_len(payload_len);
        out.reserve(self.header_len() + payload_len + pad);
        let mut bth = [0u8; BTH_LEN];
        Bth {
            pad_count: pad as u8,
            ..self.bth
        }
        .write_to(&mut bth);
        out.extend_from_slice(&bth);
        if let Some(d) = &self.deth {
            d.emit(out);
        }
        if let Some(r) = &self.reth {
            r.emit(out);
        }
        if let Some(a) = &self.atomic {
            a.emit(out);
        }
        if let Some(a) = &self.aeth {
            a.emit(out);
        }
        if let Some(a) = &self.atomic_ack {
            a.emit(out);
        }
        if let Some(i) = self.imm {
            out.extend_from_slice(&i.to_be_bytes());
        }
        if let Some(i) = self.ieth {
            out.extend_from_slice(&i.to_be_bytes());
        }
    }

    /// Length [`emit`](Self::emit) produces for `payload_len` payload bytes.
    pub fn wire_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + pad_len(payload_len)
    }
}

/// A parsed transport packet: headers and a payload borrowed from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePacket<'a> {
    /// BTH and extension headers.
    pub headers: RoceHeaders,
    /// The payload without the pad bytes.
    pub payload: &'a [u8],
}

impl<'a> RocePacket<'a> {
    /// Parses `buf` = BTH .. end of pad, with the ICRC already removed
    /// (see [`check_icrc`](super::icrc::check_icrc)).
    ///
    /// Errors: Truncated if `buf` ends inside a header; Malformed for an unknown
    /// opcode, TVer != 0, a length that is not a multiple of 4, a pad count larger
    /// than what follows the headers, or a payload on an opcode that carries none.
    /// The pad bytes' values are not checked.
    pub fn parse(buf: &'a [u8]) -> Result<RocePacket<'a>, WireError> {
        let (headers, hlen) = RoceHeaders::parse(buf)?;
        if buf.len() & 3 != 0 {
            return Err(WireError::Malformed("IB transport length not a multiple of 4"));
        }
        let rest = buf.get(hlen..).unwrap_or(&[]);
        let pad = usize::from(headers.bth.pad_count);
        if pad > rest.len() {
            return Err(WireError::Malformed("BTH pad count exceeds the payload"));
        }
        if !rest.is_empty() && !headers.bth.opcode.has_payload() {
            return Err(WireError::Malformed("payload on a BTH opcode that carries none"));
        }
        Ok(RocePacket {
            headers,
            payload: &rest[..rest.len() - pad],
        })
    }

    /// The opcode (shortcut for `headers.bth.opcode`).
    pub fn opcode(&self) -> RoceOpcode {
        self.headers.bth.opcode
    }

    /// Appends the packet again (headers, payload, pad); no ICRC.
    pub fn emit(&self, out: &mut Vec<u8>) {
        self.headers.emit(self.payload, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roce::bth::DEFAULT_PKEY;
    use crate::roce::headers::{NakCode, AETH_CREDITS_INVALID, GSI_QKEY};
    use crate::testutil::hex;

    fn roundtrip(wire: &[u8]) -> RocePacket<'_> {
        let p = RocePacket::parse(wire).unwrap();
        let mut out = Vec::new();
        p.emit(&mut out);
        assert_eq!(out, wire);
        assert_eq!(p.headers.wire_len(p.payload.len()), wire.len());
        assert!(p.headers.matches_opcode());
        p
    }

    // Transport packets (UDP payload minus ICRC) from samples/good/roce_rc_cm.pcap.
    #[test]
    fn golden_send_only_pad3() {
        // "hello from soft-RoCE SEND" + 3 pad bytes.
        let mut wire = hex("0470ffff0000002280001000");
        wire.extend_from_slice(b"hello from soft-RoCE SEND\0\0\0");
        let p = roundtrip(&wire);
        assert_eq!(p.opcode(), RoceOpcode::RcSendOnly);
        assert_eq!(p.headers.bth.pad_count, 3);
        assert_eq!(p.payload, b"hello from soft-RoCE SEND");
        assert_eq!(p.headers.header_len(), BTH_LEN);
    }

    #[test]
    fn golden_write_read_ack_imm() {
        let mut wr = hex("0a50ffff000000228000100100007f00000010000000123400000013");
        wr.extend_from_slice(b"RDMA WRITE payload!\0");
        let p = roundtrip(&wr);
        assert_eq!(
            p.headers.reth,
            Some(Reth {
                va: 0x7F00_0000_1000,
                rkey: 0x1234,
                dma_len: 19
            })
        );
        assert_eq!(p.payload, b"RDMA WRITE payload!");

        let ack = hex("1140ffff00000011000010011f000002");
        let p = roundtrip(&ack);
        assert_eq!(p.headers.aeth, Some(Aeth::ack(2, AETH_CREDITS_INVALID)));
        assert!(p.payload.is_empty());

        let rreq = hex("0c40ffff000000228000100200007f00000020000000567800000020");
        let p = roundtrip(&rreq);
        assert_eq!(p.opcode(), RoceOpcode::RcReadRequest);
        assert_eq!(p.headers.reth.map(|r| r.dma_len), Some(32));

        let mut rr = hex("1040ffff00000011000010021f000003");
        rr.extend(0..32u8);
        let p = roundtrip(&rr);
        assert_eq!(p.headers.aeth, Some(Aeth::ack(3, AETH_CREDITS_INVALID)));
        assert_eq!(p.payload, &rr[16..]);

        let mut imm = hex("0550ffff0000002280001003cafef00d");
        imm.extend_from_slice(b"imm\0");
        let p = roundtrip(&imm);
        assert_eq!((p.headers.imm, p.payload), (Some(0xcafe_f00d), &b"imm"[..]));
        assert_eq!(p.headers.header_len(), 16);
    }

    #[test]
    fn golden_ud_mad_header() {
        let mut mad = hex("6440ffff000000010000000080010000000000010107020300000000");
        mad.resize(12 + 8 + 256, 0);
        let p = roundtrip(&mad);
        assert_eq!(p.opcode(), RoceOpcode::UdSendOnly);
        assert_eq!(
            p.headers.deth,
            Some(Deth {
                qkey: GSI_QKEY,
                src_qp: 1
            })
        );
        assert_eq!(p.payload.len(), 256);
    }

    fn every_opcode_headers(op: RoceOpcode) -> RoceHeaders {
        let want = op.headers();
        let mut h = RoceHeaders::new(Bth {
            solicited: true,
            ack_req: true,
            pkey: DEFAULT_PKEY,
            ..Bth::new(op, 0x12_3456, 0xab_cdef)
        });
        h.reth = want.reth.then_some(Reth {
            va: 1,
            rkey: 2,
            dma_len: 3,
        });
        h.aeth = want.aeth.then_some(Aeth::nak(9, NakCode::RemoteAccessError));
        h.deth = want.deth.then_some(Deth { qkey: 4, src_qp: 5 });
        h.imm = want.immdt.then_some(6);
        h.ieth = want.ieth.then_some(7);
        h.atomic = want.atomic_eth.then_some(AtomicEth {
            va: 8,
            rkey: 9,
            swap_add: 10,
            compare: 11,
        });
        h.atomic_ack = want.atomic_ack_eth.then_some(AtomicAckEth { orig: 12 });
        h
    }
    #[test]
    fn every_opcode_every_pad() {
        for op in RoceOpcode::ALL {
            let h = every_opcode_headers(op);
            let lens: &[usize] = if op.has_payload() {
                &[0, 1, 2, 3, 4, 5, 1024]
            } else {
                &[0]
            };
            for &len in lens {
                let payload: Vec<u8> = (0..len).map(|i| i as u8 | 1).collect();
                let mut out = vec![0xee];
                h.emit(&payload, &mut out);
                let wire = &out[1..];
                assert_eq!(wire.len(), h.wire_len(len));
                assert_eq!(wire.len() % 4, 0);
                let p = RocePacket::parse(wire).unwrap();
                assert_eq!(p.payload, &payload[..], "{op:?} len {len}");
                assert_eq!(usize::from(p.headers.bth.pad_count), pad_len(len));
                assert_eq!(
                    p.headers,
                    RoceHeaders {
                        bth: Bth {
                            pad_count: pad_len(len) as u8,
                            ..h.bth
                        },
                        ..h
                    }
                );
                assert!(wire[wire.len() - pad_len(len)..].iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn header_order() {
        // WRITE Only with Immediate: RETH before ImmDt.
        let h = every_opcode_headers(RoceOpcode::RcWriteOnlyImm);
        let mut out = Vec::new();
        h.emit(b"", &mut out);
        assert_eq!(
            &out[12..],
            hex(&"00000000000000010000000200000003 00000006".replace(' ', ""))
        );
        // Atomic ACK: AETH before AtomicAckETH.
        let h = every_opcode_headers(RoceOpcode::RcAtomicAck);
        out.clear();
        h.emit(b"", &mut out);
        assert_eq!(&out[12..], hex("62000009000000000000000c"));
        // UD with Immediate: DETH before ImmDt.
        let h = every_opcode_headers(RoceOpcode::UdSendOnlyImm);
        out.clear();
        h.emit(b"x", &mut out);
        assert_eq!(&out[12..], hex(&"000000040000000500000006 78000000".replace(' ', "")));
        assert_eq!(out[1] & 0x30, 0x30);
    }

    #[test]
    fn errors() {
        // Truncated inside the RETH of a WRITE Only (samples/bad/roce_truncated_reth.pcap).
        let b = hex("0a50ffff000000228000100100007f00");
        assert_eq!(
            RocePacket::parse(&b),
            Err(WireError::Truncated {
                what: "RETH",
                need: 16,
                have: 4
            })
        );
        assert!(matches!(
            RocePacket::parse(&b[..8]),
            Err(WireError::Truncated { what: "BTH", .. })
        ));
        // Not a multiple of 4.
        let mut b = hex("0400ffff0000002200001000");
        b.extend_from_slice(b"abc");
        assert_eq!(
            RocePacket::parse(&b),
            Err(WireError::Malformed("IB transport length not a multiple of 4"))
        );
        // Pad count larger than what follows the headers.
        assert_eq!(
            RocePacket::parse(&hex(&"0420ffff0000002200001000 01000000".replace(' ', ""))).map(|p| p.payload),
            Ok(&[1u8, 0][..])
        );
        assert_eq!(
            RocePacket::parse(&hex("0420ffff0000002200001000")),
            Err(WireError::Malformed("BTH pad count exceeds the payload"))
        );
        assert_eq!(
            RocePacket::parse(&hex("1130ffff00000011000010011f000002")),
            Err(WireError::Malformed("BTH pad count exceeds the payload"))
        );
        // Payload after an ACK.
        assert_eq!(
            RocePacket::parse(&hex("1100ffff00000011000010011f00000200000000")),
            Err(WireError::Malformed("payload on a BTH opcode that carries none"))
        );
        // Truncated ImmDt, IETH, AtomicETH, AtomicAckETH, DETH.
        for (hdr, what) in [
            ("0300ffff0000002200001000", "ImmDt"),
            ("1600ffff0000002200001000", "IETH"),
            ("1300ffff0000002200001000", "AtomicETH"),
            ("1200ffff00000022000010001f000002", "AtomicAckETH"),
            ("6400ffff0000000100001000", "DETH"),
            ("1000ffff0000002200001000", "AETH"),
        ] {
            assert!(
                matches!(RocePacket::parse(&hex(hdr)), Err(WireError::Truncated { what: w, .. }) if w == what),
                "{what}"
            );
        }
        // TVer 1, unknown opcode.
        assert_eq!(
            RocePacket::parse(&hex("0471ffff0000002280001000")),
            Err(WireError::Malformed("BTH TVer is not 0"))
        );
        assert_eq!(
            RocePacket::parse(&hex("8100ffff0000002280001000")),
            Err(WireError::Malformed("unknown BTH opcode"))
        );
    }

    #[test]
    fn pad_lengths() {
        assert_eq!([0, 1, 2, 3, 4, 5].map(pad_len), [0, 3, 2, 1, 0, 3]);
        assert_eq!(pad_len(usize::MAX), 1);
    }
}
