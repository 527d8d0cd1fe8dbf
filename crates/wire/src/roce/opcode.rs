//! BTH opcodes (IBTA Vol 1 §9.2) for the Reliable Connected and
//! Unreliable Datagram transports, and which extension headers each carries.
//!
//! ```text
//!  opcode byte: bits 7..5 transport (000 RC, 011 UD), bits 4..0 operation
//! ```

use super::headers::{Aeth, AtomicAckEth, AtomicEth, Deth, Reth, IETH_LEN, IMMDT_LEN};

/// A BTH opcode this crate understands: RC (0x00..=0x14, 0x16, 0x17) and UD SEND (0x64, 0x65).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RoceOpcode {
    /// RC SEND First.
    RcSendFirst = 0x00,
    /// RC SEND Middle.
    RcSendMiddle = 0x01,
    /// RC SEND Last.
    RcSendLast = 0x02,
    /// RC SEND Last with Immediate (ImmDt).
    RcSendLastImm = 0x03,
    /// RC SEND Only.
    RcSendOnly = 0x04,
    /// RC SEND Only with Immediate (ImmDt).
    RcSendOnlyImm = 0x05,
    /// RC RDMA WRITE First (RETH).
    RcWriteFirst = 0x06,
    /// RC RDMA WRITE Middle.
    RcWriteMiddle = 0x07,
    /// RC RDMA WRITE Last.
    RcWriteLast = 0x08,
    /// RC RDMA WRITE Last with Immediate (ImmDt).
    RcWriteLastImm = 0x09,
    /// RC RDMA WRITE Only (RETH).
    RcWriteOnly = 0x0A,
    /// RC RDMA WRITE Only with Immediate (RETH, ImmDt).
    RcWriteOnlyImm = 0x0B,
    /// RC RDMA READ Request (RETH, no payload).
    RcReadRequest = 0x0C,
    /// RC RDMA READ Response First (AETH).
    RcReadResponseFirst = 0x0D,
    /// RC RDMA READ Response Middle.
    RcReadResponseMiddle = 0x0E,
    /// RC RDMA READ Response Last (AETH).
    RcReadResponseLast = 0x0F,
    /// RC RDMA READ Response Only (AETH).
    RcReadResponseOnly = 0x10,
    /// RC Acknowledge (AETH, no payload).
    RcAck = 0x11,
    /// RC Atomic Acknowledge (AETH, AtomicAckETH, no payload).
    RcAtomicAck = 0x12,
    /// RC CmpSwap (AtomicETH, no payload).
    RcCompareSwap = 0x13,
    /// RC FetchAdd (AtomicETH, no payload).
    RcFetchAdd = 0x14,
    /// RC SEND Last with Invalidate (IETH).
    RcSendLastInv = 0x16,
    /// RC SEND Only with Invalidate (IETH).
    RcSendOnlyInv = 0x17,
    /// UD SEND Only (DETH).
    UdSendOnly = 0x64,
    /// UD SEND Only with Immediate (DETH, ImmDt).
    UdSendOnlyImm = 0x65,
}

/// Which extension transport headers follow the BTH for an opcode.
///
/// On the wire they appear in the order of the fields here, except that DETH
/// comes first: BTH, DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeaderSet {
    /// RDMA Extended Transport Header (16 bytes).
    pub reth: bool,
    /// ACK Extended Transport Header (4 bytes).
    pub aeth: bool,
    /// Datagram Extended Transport Header (8 bytes).
    pub deth: bool,
    /// Immediate data (4 bytes).
    pub immdt: bool,
    /// Invalidate Extended Transport Header (4 bytes).
    pub ieth: bool,
    /// Atomic Extended Transport Header (28 bytes).
    pub atomic_eth: bool,
    /// Atomic Acknowledge Extended Transport Header (8 bytes).
    pub atomic_ack_eth: bool,
}

impl HeaderSet {
    /// Total length in bytes of the extension headers in the set (BTH not included).
    pub fn ext_len(&self) -> usize {
        let f = |present: bool, len: usize| if present { len } else { 0 };
        f(self.deth, Deth::LEN)
            + f(self.reth, Reth::LEN)
            + f(self.atomic_eth, AtomicEth::LEN)
            + f(self.aeth, Aeth::LEN)
            + f(self.atomic_ack_eth, AtomicAckEth::LEN)
            + f(self.immdt, IMMDT_LEN)
            + f(self.ieth, IETH_LEN)
    }
}

impl RoceOpcode {
    /// Every opcode, in numeric order.
    pub const ALL: [RoceOpcode; 25] = [
        RoceOpcode::RcSendFirst,
        RoceOpcode::RcSendMiddle,
        RoceOpcode::RcSendLast,
        RoceOpcode::RcSendLastImm,
        RoceOpcode::RcSendOnly,
        RoceOpcode::RcSendOnlyImm,
        RoceOpcode::RcWriteFirst,
        RoceOpcode::RcWriteMiddle,
        RoceOpcode::RcWriteLast,
        RoceOpcode::RcWriteLastImm,
        RoceOpcode::RcWriteOnly,
        RoceOpcode::RcWriteOnlyImm,
        RoceOpcode::RcReadRequest,
        RoceOpcode::RcReadResponseFirst,
        RoceOpcode::RcReadResponseMiddle,
        RoceOpcode::RcReadResponseLast,
        RoceOpcode::RcReadResponseOnly,
        RoceOpcode::RcAck,
        RoceOpcode::RcAtomicAck,
        RoceOpcode::RcCompareSwap,
        RoceOpcode::RcFetchAdd,
        RoceOpcode::RcSendLastInv,
        RoceOpcode::RcSendOnlyInv,
        RoceOpcode::UdSendOnly,
        RoceOpcode::UdSendOnlyImm,
    ];

    /// Decodes an opcode byte; reserved and unsupported values (UC, RD, CNP 0x81, ...) give None.
    pub fn from_u8(v: u8) -> Option<RoceOpcode> {
        use RoceOpcode::*;
        Some(match v {
            0x00 => RcSendFirst,
            0x01 => RcSendMiddle,
            0x02 => RcSendLast,
            0x03 => RcSendLastImm,
            0x04 => RcSendOnly,
            0x05 => RcSendOnlyImm,
            0x06 => RcWriteFirst,
            0x07 => RcWriteMiddle,
            0x08 => RcWriteLast,
            0x09 => RcWriteLastImm,
            0x0A => RcWriteOnly,
            0x0B => RcWriteOnlyImm,
            0x0C => RcReadRequest,
            0x0D => RcReadResponseFirst,
            0x0E => RcReadResponseMiddle,
            0x0F => RcReadResponseLast,
            0x10 => RcReadResponseOnly,
            0x11 => RcAck,
            0x12 => RcAtomicAck,
            0x13 => RcCompareSwap,
            0x14 => RcFetchAdd,
            0x16 => RcSendLastInv,
            0x17 => RcSendOnlyInv,
            0x64 => UdSendOnly,
            0x65 => UdSendOnlyImm,
            _ => return None,
        })
    }

    /// The opcode byte.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// The extension headers that follow the BTH for this opcode.
    pub fn headers(self) -> HeaderSet {
        use RoceOpcode::*;
        HeaderSet {
            reth: matches!(self, RcWriteFirst | RcWriteOnly | RcWriteOnlyImm | RcReadRequest),
            aeth: matches!(
                self,
                RcReadResponseFirst | RcReadResponseLast | RcReadResponseOnly | RcAck | RcAtomicAck
            ),
            deth: self.is_ud(),
            immdt: matches!(
                self,
                RcSendLastImm | RcSendOnlyImm | RcWriteLastImm | RcWriteOnlyImm | UdSendOnlyImm
            ),
            ieth: matches!(self, RcSendLastInv | RcSendOnlyInv),
            atomic_eth: self.is_atomic(),
            atomic_ack_eth: self == RcAtomicAck,
        }
    }

    /// True if packets with this opcode may carry a payload (possibly empty):
    /// SEND, RDMA WRITE and RDMA READ Response packets.
    ///
    /// READ Request, ACK, Atomic ACK, CmpSwap and FetchAdd never carry one.
    pub fn has_payload(self) -> bool {
        use RoceOpcode::*;
        !matches!(self, RcReadRequest | RcAck | RcAtomicAck | RcCompareSwap | RcFetchAdd)
    }

    /// First packet of a multi-packet SEND, RDMA WRITE or READ Response.
    pub fn is_first(self) -> bool {
        use RoceOpcode::*;
        matches!(self, RcSendFirst | RcWriteFirst | RcReadResponseFirst)
    }

    /// Middle packet of a multi-packet SEND, RDMA WRITE or READ Response.
    pub fn is_middle(self) -> bool {
        use RoceOpcode::*;
        matches!(self, RcSendMiddle | RcWriteMiddle | RcReadResponseMiddle)
    }

    /// Last packet of a multi-packet SEND (any variant), RDMA WRITE (any variant) or READ Response.
    pub fn is_last(self) -> bool {
        use RoceOpcode::*;
        matches!(
            self,
            RcSendLast | RcSendLastImm | RcSendLastInv | RcWriteLast | RcWriteLastImm | RcReadResponseLast
        )
    }

    /// Single-packet SEND (RC or UD, any variant), RDMA WRITE (any variant) or READ Response.
    pub fn is_only(self) -> bool {
        use RoceOpcode::*;
        matches!(
            self,
            RcSendOnly
                | RcSendOnlyImm
                | RcSendOnlyInv
                | RcWriteOnly
                | RcWriteOnlyImm
                | RcReadResponseOnly
                | UdSendOnly
                | UdSendOnlyImm
        )
    }

    /// True for the packets that end a message: the `*Last*` and `*Only*` opcodes.
    pub fn ends_message(self) -> bool {
        self.is_last() || self.is_only()
    }

    /// True for the packets that start a message: the `*First*` and `*Only*` opcodes.
    pub fn starts_message(self) -> bool {
        self.is_first() || self.is_only()
    }

    /// Any SEND opcode, RC or UD.
    pub fn is_send(self) -> bool {
        use RoceOpcode::*;
        matches!(
            self,
            RcSendFirst
                | RcSendMiddle
                | RcSendLast
                | RcSendLastImm
                | RcSendOnly
                | RcSendOnlyImm
                | RcSendLastInv
                | RcSendOnlyInv
                | UdSendOnly
                | UdSendOnlyImm
        )
    }

    /// Any RDMA WRITE opcode.
    pub fn is_write(self) -> bool {
        (RoceOpcode::RcWriteFirst as u8..=RoceOpcode::RcWriteOnlyImm as u8).contains(&(self as u8))
    }

    /// Any RDMA READ Response opcode.
    pub fn is_read_response(self) -> bool {
        (RoceOpcode::RcReadResponseFirst as u8..=RoceOpcode::RcReadResponseOnly as u8).contains(&(self as u8))
    }

    /// CmpSwap or FetchAdd (the atomic requests).
    pub fn is_atomic(self) -> bool {
        matches!(self, RoceOpcode::RcCompareSwap | RoceOpcode::RcFetchAdd)
    }

    /// SEND or WRITE with immediate data.
    pub fn has_imm(self) -> bool {
        self.headers().immdt
    }

    /// SEND with Invalidate.
    pub fn has_inv(self) -> bool {
        self.headers().ieth
    }

    /// Unreliable Datagram opcode (0x6X).
    pub fn is_ud(self) -> bool {
        matches!(self, RoceOpcode::UdSendOnly | RoceOpcode::UdSendOnlyImm)
    }

    /// Reliable Connected opcode (0x0X/0x1X).
    pub fn is_rc(self) -> bool {
        !self.is_ud()
    }

    /// A responder-to-requester packet: READ Responses, ACK and Atomic ACK.
    pub fn is_response(self) -> bool {
        self.is_read_response() || matches!(self, RoceOpcode::RcAck | RoceOpcode::RcAtomicAck)
    }

    /// A requester-to-responder packet (everything that is not [`is_response`](Self::is_response)).
    pub fn is_request(self) -> bool {
        !self.is_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_round_trips() {
        let mut known = 0;
        for v in 0..=255u8 {
            if let Some(op) = RoceOpcode::from_u8(v) {
                assert_eq!(op.as_u8(), v);
                known += 1;
            }
        }
        assert_eq!(known, RoceOpcode::ALL.len());
        for w in RoceOpcode::ALL.windows(2) {
            assert!(w[0].as_u8() < w[1].as_u8());
        }
        assert_eq!(RoceOpcode::from_u8(0x15), None); // reserved
        assert_eq!(RoceOpcode::from_u8(0x81), None); // CNP
        assert_eq!(RoceOpcode::from_u8(0x24), None); // UC SEND Only
        assert_eq!(RoceOpcode::RcWriteOnly.as_u8(), 0x0a);
        assert_eq!(RoceOpcode::UdSendOnlyImm.as_u8(), 0x65);
    }

    #[test]
    fn header_table() {
        use RoceOpcode::*;
        let h = |reth, aeth, deth, immdt, ieth, atomic_eth, atomic_ack_eth| HeaderSet {
            reth,
            aeth,
            deth,
            immdt,
            ieth,
            atomic_eth,
            atomic_ack_eth,
        };
        let none = HeaderSet::default();
        for op in [
            RcSendFirst,
            RcSendMiddle,
            RcSendLast,
            RcSendOnly,
            RcWriteMiddle,
            RcWriteLast,
        ] {
            assert_eq!(op.headers(), none, "{op:?}");
        }
        assert_eq!(RcReadResponseMiddle.headers(), none);
        let imm = h(false, false, false, true, false, false, false);
        for op in [RcSendLastImm, RcSendOnlyImm, RcWriteLastImm] {
            assert_eq!(op.headers(), imm, "{op:?}");
        }
        let reth = h(true, false, false, false, false, false, false);
        for op in [RcWriteFirst, RcWriteOnly, RcReadRequest] {
            assert_eq!(op.headers(), reth, "{op:?}");
        }
        assert_eq!(
            RcWriteOnlyImm.headers(),
            h(true, false, false, true, false, false, false)
        );
        let aeth = h(false, true, false, false, false, false, false);
        for op in [RcReadResponseFirst, RcReadResponseLast, RcReadResponseOnly, RcAck] {
            assert_eq!(op.headers(), aeth, "{op:?}");
        }
        assert_eq!(RcAtomicAck.headers(), h(false, true, false, false, false, false, true));
        assert_eq!(
            RcCompareSwap.headers(),
            h(false, false, false, false, false, true, false)
        );
        assert_eq!(RcFetchAdd.headers(), h(false, false, false, false, false, true, false));
        assert_eq!(
            RcSendLastInv.headers(),
            h(false, false, false, false, true, false, false)
        );
        assert_eq!(
            RcSendOnlyInv.headers(),
            h(false, false, false, false, true, false, false)
        );
        assert_eq!(UdSendOnly.headers(), h(false, false, true, false, false, false, false));
        assert_eq!(
            UdSendOnlyImm.headers(),
            h(false, false, true, true, false, false, false)
        );

        assert_eq!(RcWriteOnlyImm.headers().ext_len(), 20);
        assert_eq!(RcAtomicAck.headers().ext_len(), 12);
        assert_eq!(RcFetchAdd.headers().ext_len(), 28);
        assert_eq!(UdSendOnlyImm.headers().ext_len(), 12);
        assert_eq!(RcSendMiddle.headers().ext_len(), 0);
    }

    #[test]
    fn classes() {
        use RoceOpcode::*;
        for op in RoceOpcode::ALL {
            let position = [op.is_first(), op.is_middle(), op.is_last(), op.is_only()];
            let n = position.iter().filter(|&&b| b).count();
            // Every data-carrying opcode has exactly one position; the rest have none.
            assert_eq!(n, usize::from(op.has_payload()), "{op:?}");
            assert_eq!(op.is_response(), !op.is_request());
            assert_eq!(op.is_rc(), !op.is_ud());
            let kinds = [op.is_send(), op.is_write(), op.is_read_response()];
            assert_eq!(
                kinds.iter().filter(|&&b| b).count(),
                usize::from(op.has_payload()),
                "{op:?}"
            );
        }
        assert!(RcReadResponseMiddle.is_response() && RcAck.is_response() && RcAtomicAck.is_response());
        assert!(!RcReadRequest.is_response() && !RcFetchAdd.is_response() && !RcSendOnly.is_response());
        assert!(!RcReadRequest.has_payload() && !RcAck.has_payload() && !RcCompareSwap.has_payload());
        assert!(RcSendLastInv.is_last() && RcSendLastInv.has_inv() && RcSendLastInv.ends_message());
        assert!(UdSendOnlyImm.is_only() && UdSendOnlyImm.has_imm() && UdSendOnlyImm.starts_message());
        assert!(RcWriteFirst.starts_message() && !RcWriteFirst.ends_message());
        assert!(!RcWriteMiddle.starts_message() && !RcWriteMiddle.ends_message());
        assert!(RcCompareSwap.is_atomic() && !RcAtomicAck.is_atomic());
    }
}
