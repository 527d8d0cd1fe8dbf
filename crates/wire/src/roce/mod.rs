//! RoCEv2 (IBTA Vol 1 + Annex A17): the InfiniBand transport headers carried in
//! UDP datagrams to port 4791, and the ICRC that ends each datagram.
//!
//! A datagram is `BTH | extension headers | payload | pad | ICRC`. The receive
//! path is [`check_icrc`] (strip and verify the ICRC) then [`RocePacket::parse`];
//! the send path is [`RoceHeaders::emit`] then [`append_icrc`].
//!
//! ```
//! use softrdma_wire::roce::*;
//! use std::net::Ipv4Addr;
//!
//! // Sender: an RC SEND Only asking for an ACK.
//! let mut bth = Bth::new(RoceOpcode::RcSendOnly, 0x22, 0x1000);
//! bth.ack_req = true;
//! let ip = IcrcIp::v4_df(Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2));
//! let mut datagram = Vec::new();
//! RoceHeaders::new(bth).emit(b"hello", &mut datagram);
//! append_icrc(&ip, 49152, ROCE_V2_UDP_PORT, &mut datagram, 0);
//! assert_eq!(datagram.len(), BTH_LEN + 8 + ICRC_LEN);
//!
//! // Receiver: verify the ICRC, then decode.
//! let transport = check_icrc(&ip, 49152, ROCE_V2_UDP_PORT, &datagram).unwrap();
//! let pkt = RocePacket::parse(transport).unwrap();
//! assert_eq!(pkt.headers.bth.opcode, RoceOpcode::RcSendOnly);
//! assert_eq!(pkt.headers.bth.pad_count, 3);
//! assert_eq!(pkt.payload, b"hello");
//! ```

pub mod bth;
pub mod crc32;
pub mod headers;
pub mod icrc;
pub mod opcode;
pub mod packet;

pub use self::bth::{Bth, BTH_LEN, BTH_TVER, DEFAULT_PKEY, PSN_MASK, QPN_MASK};
pub use self::crc32::{crc32, Crc32};
pub use self::headers::{
    credit_code, credit_count, Aeth, AethKind, AtomicAckEth, AtomicEth, Deth, NakCode, Reth, AETH_CREDITS_INVALID,
    GSI_QKEY, IETH_LEN, IMMDT_LEN, MSN_MASK,
};
pub use self::icrc::{
    append_icrc, check_icrc, check_icrc_any_id, icrc, icrc_bytes, icrc_from_bytes, icrc_of_ip_packet, solve_ipv4_id,
    IcrcIp, ICRC_LEN, ICRC_MISMATCH, ROCE_V2_UDP_PORT,
};
pub use self::opcode::{HeaderSet, RoceOpcode};
pub use self::packet::{pad_len, push_pad, RoceHeaders, RocePacket};
