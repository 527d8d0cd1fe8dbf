//! sans-I/O wire codecs for soft-iWARP: MPA connection setup (RFC 5044 +
//! RFC 6581), FPDU framing with CRC32c, DDP (RFC 5041) and RDMAP (RFC 5040).
//!
//! Every decoder takes a byte slice and returns a value or a typed
//! [`WireError`]; none of them panics on any input. Encoders append to a
//! `Vec<u8>`. Stream parsers ([`MpaFrame::parse`], [`parse_fpdu`]) return
//! `Ok(None)` when more bytes are needed.
//!
//! ```
//! use softrdma_wire::*;
//!
//! // Sender: a Send segment inside a CRC-protected FPDU.
//! let hdr = SegmentHeader {
//!     last: true,
//!     opcode: Opcode::Send,
//!     ddp: DdpHeader::Untagged { inval_stag: 0, qn: QN_SEND, msn: 1, mo: 0 },
//! };
//! let mut h = Vec::new();
//! hdr.emit(&mut h);
//! let mut stream = Vec::new();
//! emit_fpdu(&[&h, b"hello"], true, &mut stream).unwrap();
//!
//! // Receiver: frame, check CRC, then decode the headers.
//! let fpdu = parse_fpdu(&stream, true).unwrap().expect("complete FPDU");
//! let (got, n) = SegmentHeader::parse(fpdu.ulpdu).unwrap();
//! assert_eq!((got, &fpdu.ulpdu[n..]), (hdr, &b"hello"[..]));
//! assert_eq!(fpdu.wire_len, stream.len());
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod crc32c;
pub mod ddp;
pub mod error;
pub mod fpdu;
pub mod ibcm;
pub mod mpa;
pub mod rdmap;
pub mod roce;
pub mod terminate;

pub use crate::crc32c::{crc32c, Crc32c};
pub use crate::ddp::{
    DdpHeader, SegmentHeader, DDP_TAGGED_HDR_LEN, DDP_UNTAGGED_HDR_LEN, DDP_VERSION, QN_READ_REQUEST, QN_SEND,
    QN_TERMINATE, RDMAP_VERSION,
};
pub use crate::error::WireError;
pub use crate::fpdu::{
    emit_fpdu, fpdu_pad_len, fpdu_wire_len, parse_fpdu, Fpdu, FPDU_CRC_LEN, FPDU_LEN_FIELD, MPA_MAX_ULPDU,
};
pub use crate::mpa::{
    IrdOrd, MpaFrame, MpaKind, IRD_ORD_LEN, MPA_HEADER_LEN, MPA_MAX_PD_LEN, MPA_REP_KEY, MPA_REQ_KEY,
};
pub use crate::rdmap::{term, Opcode, ReadRequest, READ_REQUEST_LEN};
pub use crate::terminate::{TermLayer, Terminate, TERMINATE_HDR_LEN};

#[cfg(test)]
mod testutil {
    /// Decodes a hex string (test vectors only).
    pub fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
            .collect()
    }
}
