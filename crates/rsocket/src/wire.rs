//! The rsocket protocol's bytes (rdma-core's `librdmacm/rsocket.c`, version 1), sans I/O.
//!
//! - The private data of `rdma_connect` / `rdma_accept`: [`ConnData`], 40 bytes, big-endian.
//! - Every message is one 32-bit value (the immediate data of an RDMA WRITE WITH IMMEDIATE, or
//!   on iWARP, which has no immediate data, a 4-byte SEND in the sender's byte order): bits
//!   31..29 the operation ([`Op`]), bits 28..0 its argument ([`Msg`]).
//! - Buffer descriptors that a peer writes into the other's target area: [`RsSge`] (16 bytes)
//!   and [`RsIomap`] (24 bytes), in the writer's byte order unless the connection data says
//!   otherwise ([`ConnData::needs_swap`]).

/// `rs_conn_data.version`.
pub const VERSION: u8 = 1;
/// `RS_CONN_FLAG_NET`: the sender is big-endian (its descriptors are in network order).
pub const FLAG_NET: u8 = 1 << 0;
/// `RS_CONN_FLAG_IOMAP`: the sender has a target iomap table after its SGL.
pub const FLAG_IOMAP: u8 = 1 << 1;
/// Entries in a target SGL (`RS_SGL_SIZE`).
pub const SGL_SIZE: u32 = 2;
/// Bytes of a [`ConnData`].
pub const CONN_DATA_LEN: usize = 40;
/// Bytes of an [`RsSge`].
pub const SGE_LEN: usize = 16;
/// Bytes of an [`RsIomap`].
pub const IOMAP_LEN: usize = 24;
/// Bytes of a message sent as a SEND (`RS_MSG_SIZE`).
pub const MSG_LEN: usize = 4;

/// True on a big-endian host (`rs_host_is_net()`).
pub const HOST_IS_NET: bool = cfg!(target_endian = "big");

/// A remote buffer (`struct rs_sge`: addr, key, length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RsSge {
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Its rkey.
    pub key: u32,
    /// Bytes.
    pub length: u32,
}

impl RsSge {
    /// The 16 bytes, in this host's order or swapped.
    pub fn to_bytes(self, swap: bool) -> [u8; SGE_LEN] {
        let (a, k, l) = if swap {
            (self.addr.swap_bytes(), self.key.swap_bytes(), self.length.swap_bytes())
        } else {
            (self.addr, self.key, self.length)
        };
        let mut b = [0u8; SGE_LEN];
        b[0..8].copy_from_slice(&a.to_ne_bytes());
        b[8..12].copy_from_slice(&k.to_ne_bytes());
        b[12..16].copy_from_slice(&l.to_ne_bytes());
        b
    }

    /// Reads 16 bytes written by the peer (in its order; `swap` when it differs from ours).
    pub fn from_bytes(b: &[u8; SGE_LEN], swap: bool) -> RsSge {
        let a = u64::from_ne_bytes(array(&b[0..8]));
        let k = u32::from_ne_bytes(array(&b[8..12]));
        let l = u32::from_ne_bytes(array(&b[12..16]));
        if swap {
            RsSge {
                addr: a.swap_bytes(),
                key: k.swap_bytes(),
                length: l.swap_bytes(),
            }
        } else {
            RsSge {
                addr: a,
                key: k,
                length: l,
            }
        }
    }

    fn to_be(self) -> [u8; SGE_LEN] {
        let mut b = [0u8; SGE_LEN];
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.key.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    fn from_be(b: &[u8]) -> RsSge {
        RsSge {
            addr: u64::from_be_bytes(array(&b[0..8])),
            key: u32::from_be_bytes(array(&b[8..12])),
            length: u32::from_be_bytes(array(&b[12..16])),
        }
    }
}

/// A mapped region of the peer (`struct rs_iomap`): `riowrite` offsets
/// `[offset, offset + sge.length)` land at `sge.addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RsIomap {
    /// The offset the mapping answers to.
    pub offset: u64,
    /// Where it lands.
    pub sge: RsSge,
}

impl RsIomap {
    /// The 24 bytes, in this host's order or swapped.
    pub fn to_bytes(self, swap: bool) -> [u8; IOMAP_LEN] {
        let o = if swap { self.offset.swap_bytes() } else { self.offset };
        let mut b = [0u8; IOMAP_LEN];
        b[0..8].copy_from_slice(&o.to_ne_bytes());
        b[8..24].copy_from_slice(&self.sge.to_bytes(swap));
        b
    }

    /// Reads 24 bytes written by the peer.
    pub fn from_bytes(b: &[u8; IOMAP_LEN], swap: bool) -> RsIomap {
        let o = u64::from_ne_bytes(array(&b[0..8]));
        RsIomap {
            offset: if swap { o.swap_bytes() } else { o },
            sge: RsSge::from_bytes(&array(&b[8..24]), swap),
        }
    }
}

fn array<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&s[..N]);
    a
}

/// The private data both sides exchange (`struct rs_conn_data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnData {
    /// [`VERSION`].
    pub version: u8,
    /// [`FLAG_NET`] | [`FLAG_IOMAP`].
    pub flags: u8,
    /// Messages the sender may receive before it grants more (its receive queue size).
    pub credits: u16,
    /// Entries of the sender's target iomap table, scaled ([`value_to_scale`]).
    pub target_iomap_size: u8,
    /// The sender's target SGL: where the peer writes new receive-buffer descriptors
    /// (`length` = entries).
    pub target_sgl: RsSge,
    /// The first half of the sender's receive buffer.
    pub data_buf: RsSge,
}

/// Why private data is not rsocket connection data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnDataError {
    /// Fewer than [`CONN_DATA_LEN`] bytes.
    Short(usize),
    /// A version other than 1.
    Version(u8),
}

impl std::fmt::Display for ConnDataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnDataError::Short(n) => write!(
                f,
                "the peer's private data has {n} bytes, an rsocket's has {CONN_DATA_LEN}: the peer is not an rsocket"
            ),
            ConnDataError::Version(v) => {
                write!(f, "the peer speaks rsocket protocol version {v}; this library speaks 1")
            }
        }
    }
}

impl ConnData {
    /// The 40 bytes of `rdma_connect` / `rdma_accept` private data.
    pub fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        // b[4..7] reserved
        b[7] = self.target_iomap_size;
        b[8..24].copy_from_slice(&self.target_sgl.to_be());
        b[24..40].copy_from_slice(&self.data_buf.to_be());
        b
    }

    /// Parses private data (longer data, as the IB CM pads it, is fine).
    pub fn decode(b: &[u8]) -> Result<ConnData, ConnDataError> {
        if b.len() < CONN_DATA_LEN {
            return Err(ConnDataError::Short(b.len()));
        }
        if b[0] != VERSION {
            return Err(ConnDataError::Version(b[0]));
        }
        Ok(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: RsSge::from_be(&b[8..24]),
            data_buf: RsSge::from_be(&b[24..40]),
        })
    }

    /// True when the peer's descriptors are in the other byte order (`RS_OPT_SWAP_SGL`).
    pub fn needs_swap(&self) -> bool {
        (self.flags & FLAG_NET != 0) != HOST_IS_NET
    }
}

/// `rs_value_to_scale(value, 8)`: sizes above 128 travel as 128 | value >> 8.
pub fn value_to_scale(value: u32) -> u8 {
    if value <= 1 << 7 {
        value as u8
    } else {
        ((1 << 7) | (value >> 8)) as u8
    }
}

/// `rs_scale_to_value(value, 8)`.
pub fn scale_to_value(value: u8) -> u32 {
    let v = u32::from(value);
    if v <= 1 << 7 {
        v
    } else {
        (v & !(1 << 7)) << 8
    }
}

/// Message operations (`RS_OP_*`, the top 3 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    /// Data landed in the receive buffer; the argument is its length.
    Data = 0,
    /// Reserved.
    RsvdDataMore = 1,
    /// A direct write into a mapped region (local bookkeeping; never sent).
    Write = 2,
    /// Reserved.
    RsvdDraMore = 3,
    /// Credits (and maybe a new buffer descriptor); the argument is the new credit limit.
    Sgl = 4,
    /// Reserved.
    Rsvd = 5,
    /// An iomap entry was written; the argument is its index.
    IomapSgl = 6,
    /// Control; the argument is a [`Ctrl`].
    Ctrl = 7,
}

impl Op {
    /// The operation of a message.
    pub fn of(msg: u32) -> Op {
        match msg >> 29 {
            0 => Op::Data,
            1 => Op::RsvdDataMore,
            2 => Op::Write,
            3 => Op::RsvdDraMore,
            4 => Op::Sgl,
            5 => Op::Rsvd,
            6 => Op::IomapSgl,
            _ => Op::Ctrl,
        }
    }
}

/// Control arguments (`RS_CTRL_*`).
pub mod ctrl {
    /// Both directions closed.
    pub const DISCONNECT: u32 = 0;
    /// Keep-alive: no effect.
    pub const KEEPALIVE: u32 = 1;
    /// The sender will send no more (SHUT_WR).
    pub const SHUTDOWN: u32 = 2;
}

/// One message: operation and 29-bit argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg(pub u32);

impl Msg {
    /// `rs_msg_set(op, data)`.
    pub fn new(op: Op, data: u32) -> Msg {
        Msg(((op as u32) << 29) | (data & 0x1FFF_FFFF))
    }
    /// The operation.
    pub fn op(self) -> Op {
        Op::of(self.0)
    }
    /// The argument.
    pub fn data(self) -> u32 {
        self.0 & 0x1FFF_FFFF
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_data_layout_is_rdma_cores() {
        let c = ConnData {
            version: 1,
            flags: FLAG_IOMAP,
            credits: 384,
            target_iomap_size: value_to_scale(0),
            target_sgl: RsSge {
                addr: 0x0102_0304_0506_0708,
                key: 0x1122_3344,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0xA0B0,
                key: 7,
                length: 65536,
            },
        };
        let b = c.encode();
        assert_eq!(&b[0..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[16..20], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&b[20..24], &[0, 0, 0, 2]);
        assert_eq!(&b[36..40], &[0, 1, 0, 0]);
        assert_eq!(ConnData::decode(&b), Ok(c));
        assert!(!c.needs_swap() || HOST_IS_NET);
        assert_eq!(ConnData::decode(&b[..39]), Err(ConnDataError::Short(39)));
        let mut v2 = b;
        v2[0] = 2;
        assert_eq!(ConnData::decode(&v2), Err(ConnDataError::Version(2)));
    }

    #[test]
    fn messages_and_scales() {
        let m = Msg::new(Op::Sgl, 384 + 17);
        assert_eq!(m.0, 0x8000_0191);
        assert_eq!((m.op(), m.data()), (Op::Sgl, 401));
        assert_eq!(Msg::new(Op::Ctrl, ctrl::DISCONNECT).0, 0xE000_0000);
        for v in [0u32, 1, 127, 128] {
            assert_eq!(scale_to_value(value_to_scale(v)), v);
        }
        assert_eq!(value_to_scale(512), 0x82);
        assert_eq!(scale_to_value(0x82), 512);
    }

    #[test]
    fn descriptors_round_trip_in_both_orders() {
        let s = RsSge {
            addr: 0xDEAD_BEEF_0000_1000,
            key: 0x55,
            length: 4096,
        };
        for swap in [false, true] {
            assert_eq!(RsSge::from_bytes(&s.to_bytes(swap), swap), s);
            let m = RsIomap { offset: 9, sge: s };
            assert_eq!(RsIomap::from_bytes(&m.to_bytes(swap), swap), m);
        }
        assert_eq!(
            s.to_bytes(true)[0..8],
            0xDEAD_BEEF_0000_1000u64.swap_bytes().to_ne_bytes()
        );
    }
}
