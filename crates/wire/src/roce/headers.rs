//! Extended transport headers that follow the BTH (IBTA Vol 1 §9.3):
//! RETH, AETH, DETH, AtomicETH, AtomicAckETH, plus the 4-byte ImmDt and IETH.
//!
//! ```text
//! RETH (16):         Virtual Address (64) | R_Key (32) | DMA Length (32)
//! AETH (4):          Syndrome (8) | MSN (24)
//! DETH (8):          Q_Key (32) | Reserved (8) | Source QP (24)
//! AtomicETH (28):    Virtual Address (64) | R_Key (32) | Swap/Add Data (64) | Compare Data (64)
//! AtomicAckETH (8):  Original Remote Data (64)
//! ImmDt (4), IETH (4): Immediate Data / R_Key to invalidate (32)
//! ```
//!
//! Every field is big-endian. Parsers read the first `LEN` bytes of their input and
//! ignore anything after.

use crate::error::{be32, be64, need, WireError};

/// Length of the immediate data header (ImmDt).
pub const IMMDT_LEN: usize = 4;
/// Length of the Invalidate ETH (the R_Key to invalidate).
pub const IETH_LEN: usize = 4;
/// Q_Key of the General Services Interface (QP1), used by IB CM MADs.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// AETH ACK credit count meaning "no end-to-end credit information" (invalid/unlimited).
pub const AETH_CREDITS_INVALID: u8 = 0x1f;
/// MSNs are 24 bits.
pub const MSN_MASK: u32 = 0x00ff_ffff;

const SRC_QP_MASK: u32 = 0x00ff_ffff;
const SYNDROME_RESERVED: u8 = 0x80;
const SYNDROME_KIND_SHIFT: u8 = 5;
const SYNDROME_VALUE: u8 = 0x1f;
const KIND_ACK: u8 = 0;
const KIND_RNR_NAK: u8 = 1;
const KIND_NAK: u8 = 3;

/// RDMA Extended Transport Header: the remote buffer of an RDMA WRITE or READ request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Total length of the whole RDMA operation in bytes.
    pub dma_len: u32,
}

impl Reth {
    /// Length on the wire.
    pub const LEN: usize = 16;

    /// Parses the first 16 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Reth, WireError> {
        need("RETH", buf, Self::LEN)?;
        Ok(Reth {
            va: be64(buf, 0),
            rkey: be32(buf, 8),
            dma_len: be32(buf, 12),
        })
    }

    /// Appends the 16-byte header.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.va.to_be_bytes());
        out.extend_from_slice(&self.rkey.to_be_bytes());
        out.extend_from_slice(&self.dma_len.to_be_bytes());
    }
}

/// NAK codes carried in the low 5 bits of a NAK syndrome.
///
/// Codes 5..=31 are reserved; [`Aeth::kind`] reports them as [`AethKind::Reserved`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NakCode {
    /// PSN Sequence Error: the responder expected an earlier PSN.
    PsnSequenceError = 0,
    /// Invalid Request.
    InvalidRequest = 1,
    /// Remote Access Error (bad R_Key, address or access rights).
    RemoteAccessError = 2,
    /// Remote Operational Error.
    RemoteOperationalError = 3,
    /// Invalid RD Request.
    InvalidRdRequest = 4,
}

impl NakCode {
    /// Decodes a 5-bit NAK code; reserved codes give None.
    pub fn from_u8(v: u8) -> Option<NakCode> {
        Some(match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }

    /// The 5-bit code.
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// What an AETH syndrome says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethKind {
    /// Positive acknowledgement with the responder's credit count
    /// ([`AETH_CREDITS_INVALID`] = no credit information; see [`credit_count`]).
    Ack {
        /// 5-bit encoded credit count.
        credits: u8,
    },
    /// Receiver-not-ready NAK with the 5-bit encoded minimum RNR timer.
    RnrNak {
        /// 5-bit encoded timer.
        timer: u8,
    },
    /// NAK with a defined code.
    Nak(NakCode),
    /// A reserved syndrome (top bit set, kind 0b10, or a reserved NAK code); the full byte.
    Reserved(u8),
}

/// ACK Extended Transport Header: carried by ACKs, Atomic ACKs and READ responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth {
    /// Syndrome byte: bit 7 reserved, bits 6..5 ACK(00)/RNR NAK(01)/NAK(11), bits 4..0 value.
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    /// Length on the wire.
    pub const LEN: usize = 4;

    /// A positive ACK. `credits` is the 5-bit encoded credit count (masked to 5 bits;
    /// [`AETH_CREDITS_INVALID`] when the responder does no end-to-end flow control).
    pub fn ack(msn: u32, credits: u8) -> Aeth {
        Self::with(KIND_ACK, credits, msn)
    }

    /// An RNR NAK with the 5-bit encoded RNR timer (masked to 5 bits).
    pub fn rnr_nak(msn: u32, timer: u8) -> Aeth {
        Self::with(KIND_RNR_NAK, timer, msn)
    }

    /// A NAK with the given code.
    pub fn nak(msn: u32, code: NakCode) -> Aeth {
        Self::with(KIND_NAK, code.as_u8(), msn)
    }

    fn with(kind: u8, value: u8, msn: u32) -> Aeth {
        Aeth {
            syndrome: (kind << SYNDROME_KIND_SHIFT) | (value & SYNDROME_VALUE),
            msn: msn & MSN_MASK,
        }
    }

    /// Decodes the syndrome.
    pub fn kind(&self) -> AethKind {
        let s = self.syndrome;
        let value = s & SYNDROME_VALUE;
        if s & SYNDROME_RESERVED != 0 {
            return AethKind::Reserved(s);
        }
        match s >> SYNDROME_KIND_SHIFT {
            KIND_ACK => AethKind::Ack { credits: value },
            KIND_RNR_NAK => AethKind::RnrNak { timer: value },
            KIND_NAK => NakCode::from_u8(value).map_or(AethKind::Reserved(s), AethKind::Nak),
            _ => AethKind::Reserved(s),
        }
    }

    /// True for a positive ACK.
    pub fn is_ack(&self) -> bool {
        matches!(self.kind(), AethKind::Ack { .. })
    }

    /// Parses the first 4 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Aeth, WireError> {
        need("AETH", buf, Self::LEN)?;
        Ok(Aeth {
            syndrome: buf[0],
            msn: be32(buf, 0) & MSN_MASK,
        })
    }

    /// Appends the 4-byte header (MSN masked to 24 bits).
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&((u32::from(self.syndrome) << 24) | (self.msn & MSN_MASK)).to_be_bytes());
    }
}

/// The number of receive WQEs an encoded AETH credit count stands for:
/// 0, 1, 2, 3, 4, 6, 8, 12, ... 32768 for codes 0..=30; None for 31 ([`AETH_CREDITS_INVALID`])
/// and for values over 5 bits.
pub fn credit_count(code: u8) -> Option<u32> {
    match code {
        0 | 1 => Some(u32::from(code)),
        2..=30 if code & 1 == 0 => Some(1 << (code / 2)),
        3..=29 => Some(3 << (code / 2 - 1)),
        _ => None,
    }
}

/// The largest encoded credit count whose [`credit_count`] does not exceed `available`.
pub fn credit_code(available: u32) -> u8 {
    (0..=30u8)
        .rev()
        .find(|&c| credit_count(c).is_some_and(|n| n <= available))
        .unwrap_or(0)
}

/// Datagram Extended Transport Header (UD packets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deth {
    /// Queue key the receiving QP checks ([`GSI_QKEY`] for QP1).
    pub qkey: u32,
    /// Sender's QP number (24 bits).
    pub src_qp: u32,
}

impl Deth {
    /// Length on the wire.
    pub const LEN: usize = 8;

    /// Parses the first 8 bytes of `buf`; the reserved byte is ignored.
    pub fn parse(buf: &[u8]) -> Result<Deth, WireError> {
        need("DETH", buf, Self::LEN)?;
        Ok(Deth {
            qkey: be32(buf, 0),
            src_qp: be32(buf, 4) & SRC_QP_MASK,
        })
    }

    /// Appends the 8-byte header (reserved byte 0, source QP masked to 24 bits).
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.qkey.to_be_bytes());
        out.extend_from_slice(&(self.src_qp & SRC_QP_MASK).to_be_bytes());
    }
}

/// Atomic Extended Transport Header (CmpSwap and FetchAdd requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap data (CmpSwap) or add data (FetchAdd).
    pub swap_add: u64,
    /// Compare data (CmpSwap; ignored for FetchAdd).
    pub compare: u64,
}

impl AtomicEth {
    /// Length on the wire.
    pub const LEN: usize = 28;

    /// Parses the first 28 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<AtomicEth, WireError> {
        need("AtomicETH", buf, Self::LEN)?;
        Ok(AtomicEth {
            va: be64(buf, 0),
            rkey: be32(buf, 8),
            swap_add: be64(buf, 12),
            compare: be64(buf, 20),
        })
    }

    /// Appends the 28-byte header.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.va.to_be_bytes());
        out.extend_from_slice(&self.rkey.to_be_bytes());
        out.extend_from_slice(&self.swap_add.to_be_bytes());
        out.extend_from_slice(&self.compare.to_be_bytes());
    }
}

/// Atomic Acknowledge Extended Transport Header: the remote value before the atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEth {
    /// Original remote data.
    pub orig: u64,
}

impl AtomicAckEth {
    /// Length on the wire.
    pub const LEN: usize = 8;

    /// Parses the first 8 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<AtomicAckEth, WireError> {
        need("AtomicAckETH", buf, Self::LEN)?;
        Ok(AtomicAckEth { orig: be64(buf, 0) })
    }

    /// Appends the 8-byte header.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.orig.to_be_bytes());
    }
}

/// Parses a 4-byte big-endian ImmDt or IETH; `what` names it in a Truncated error.
pub(crate) fn parse_u32(what: &'static str, buf: &[u8]) -> Result<u32, WireError> {
    need(what, buf, 4)?;
    Ok(be32(buf, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hex;

    fn emitted(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut out);
        out
    }

    // RETHs and AETHs from samples/good/roce_rc_cm.pcap (wirecheck).
    #[test]
    fn golden_reth() {
        let b = hex("00007f000000100000001234000000130000");
        let r = Reth::parse(&b).unwrap();
        assert_eq!(
            r,
            Reth {
                va: 0x7F00_0000_1000,
                rkey: 0x1234,
                dma_len: 19
            }
        );
        assert_eq!(emitted(|o| r.emit(o)), &b[..Reth::LEN]);
        let read = Reth::parse(&hex("00007f00000020000000567800000020")).unwrap();
        assert_eq!((read.va, read.rkey, read.dma_len), (0x7F00_0000_2000, 0x5678, 32));
    }

    #[test]
    fn golden_aeth() {
        let a = Aeth::parse(&hex("1f000003")).unwrap();
        assert_eq!(a, Aeth { syndrome: 0x1f, msn: 3 });
        assert_eq!(a, Aeth::ack(3, AETH_CREDITS_INVALID));
        assert_eq!(a.kind(), AethKind::Ack { credits: 0x1f });
        assert!(a.is_ack());
        assert_eq!(emitted(|o| a.emit(o)), hex("1f000003"));
    }

    #[test]
    fn aeth_syndromes() {
        let cases = [
            (Aeth::ack(0x123456, 5), "05123456", AethKind::Ack { credits: 5 }),
            (Aeth::rnr_nak(7, 14), "2e000007", AethKind::RnrNak { timer: 14 }),
            (
                Aeth::nak(1, NakCode::PsnSequenceError),
                "60000001",
                AethKind::Nak(NakCode::PsnSequenceError),
            ),
            (
                Aeth::nak(2, NakCode::InvalidRequest),
                "61000002",
                AethKind::Nak(NakCode::InvalidRequest),
            ),
            (
                Aeth::nak(3, NakCode::RemoteAccessError),
                "62000003",
                AethKind::Nak(NakCode::RemoteAccessError),
            ),
            (
                Aeth::nak(4, NakCode::RemoteOperationalError),
                "63000004",
                AethKind::Nak(NakCode::RemoteOperationalError),
            ),
            (
                Aeth::nak(0xff_ffff, NakCode::InvalidRdRequest),
                "64ffffff",
                AethKind::Nak(NakCode::InvalidRdRequest),
            ),
        ];
        for (aeth, wire, kind) in cases {
            assert_eq!(emitted(|o| aeth.emit(o)), hex(wire), "{aeth:?}");
            assert_eq!(Aeth::parse(&hex(wire)), Ok(aeth));
            assert_eq!(aeth.kind(), kind);
        }
        assert!(!Aeth::rnr_nak(0, 1).is_ack());
        // Masking in the constructors.
        assert_eq!(Aeth::ack(0x0100_0001, 0xff), Aeth { syndrome: 0x1f, msn: 1 });
        assert_eq!(Aeth::rnr_nak(0, 0x3f).syndrome, 0x3f);
        // Reserved syndromes.
        for s in [0x40, 0x5f, 0x65, 0x7f, 0x80, 0x9f, 0xe0, 0xff] {
            assert_eq!(Aeth { syndrome: s, msn: 0 }.kind(), AethKind::Reserved(s), "{s:#x}");
        }
        assert_eq!(NakCode::from_u8(5), None);
        for c in 0..5 {
            assert_eq!(NakCode::from_u8(c).map(NakCode::as_u8), Some(c));
        }
        assert_eq!(NakCode::RemoteAccessError as u8, 2);
    }

    #[test]
    fn credits() {
        let table = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256];
        for (code, &n) in table.iter().enumerate() {
            assert_eq!(credit_count(code as u8), Some(n), "code {code}");
        }
        assert_eq!(credit_count(29), Some(24576));
        assert_eq!(credit_count(30), Some(32768));
        assert_eq!(credit_count(AETH_CREDITS_INVALID), None);
        assert_eq!(credit_count(0xff), None);
        for code in 0..=30 {
            let n = credit_count(code).unwrap();
            assert_eq!(credit_code(n), code);
            if n > 1 {
                assert!(credit_code(n - 1) < code);
            }
        }
        assert_eq!(credit_code(5), 4);
        assert_eq!(credit_code(u32::MAX), 30);
    }

    #[test]
    fn golden_deth() {
        // A CM MAD to QP1 from samples/good/roce_rc_cm.pcap.
        let b = hex("8001000000000001");
        let d = Deth::parse(&b).unwrap();
        assert_eq!(
            d,
            Deth {
                qkey: GSI_QKEY,
                src_qp: 1
            }
        );
        assert_eq!(emitted(|o| d.emit(o)), b);
        // Reserved byte ignored on parse, written as zero.
        let d = Deth::parse(&hex("12345678ffabcdef")).unwrap();
        assert_eq!(
            d,
            Deth {
                qkey: 0x12345678,
                src_qp: 0xabcdef
            }
        );
        assert_eq!(emitted(|o| d.emit(o)), hex("1234567800abcdef"));
    }

    #[test]
    fn atomics() {
        let a = AtomicEth {
            va: 0x0102_0304_0506_0708,
            rkey: 0x1112_1314,
            swap_add: 0x2122_2324_2526_2728,
            compare: 0x3132_3334_3536_3738,
        };
        let wire = hex("01020304050607081112131421222324252627283132333435363738");
        assert_eq!(emitted(|o| a.emit(o)), wire);
        assert_eq!(AtomicEth::parse(&wire), Ok(a));
        let ack = AtomicAckEth {
            orig: 0xdead_beef_0bad_f00d,
        };
        assert_eq!(emitted(|o| ack.emit(o)), hex("deadbeef0badf00d"));
        assert_eq!(AtomicAckEth::parse(&hex("deadbeef0badf00d")), Ok(ack));
    }

    #[test]
    fn truncation() {
        let z = [0u8; 32];
        let check = |what: &'static str, len: usize, f: &dyn Fn(&[u8]) -> bool| {
            for n in 0..len {
                assert!(f(&z[..n]), "{what} accepted {n} bytes");
            }
            assert!(!f(&z[..len]), "{what} rejected {len} bytes");
        };
        let trunc = |r: Result<(), WireError>| matches!(r, Err(WireError::Truncated { .. }));
        check("RETH", Reth::LEN, &|b| trunc(Reth::parse(b).map(drop)));
        check("AETH", Aeth::LEN, &|b| trunc(Aeth::parse(b).map(drop)));
        check("DETH", Deth::LEN, &|b| trunc(Deth::parse(b).map(drop)));
        check("AtomicETH", AtomicEth::LEN, &|b| trunc(AtomicEth::parse(b).map(drop)));
        check("AtomicAckETH", AtomicAckEth::LEN, &|b| {
            trunc(AtomicAckEth::parse(b).map(drop))
        });
        check("ImmDt", IMMDT_LEN, &|b| trunc(parse_u32("ImmDt", b).map(drop)));
        assert_eq!(parse_u32("ImmDt", &hex("cafef00d")), Ok(0xcafe_f00d));
        assert_eq!(
            Reth::parse(&z[..15]),
            Err(WireError::Truncated {
                what: "RETH",
                need: 16,
                have: 15
            })
        );
    }
}
