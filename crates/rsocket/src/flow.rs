//! One connected rsocket's flow control, sans I/O: what to post, and what a completion means.
//!
//! The peer's receive buffer is a ring of two halves. The sender writes into the half its
//! target SGL describes ([`Stream::target`], two entries, refilled by the receiver), one RDMA
//! WRITE WITH IMMEDIATE per chunk, each announcing its length ([`Op::Data`]). Each message
//! costs one credit; the receiver grants credits (and the next free half) as the application
//! consumes data ([`Stream::credits_due`]). On iWARP (no immediate data) every message is an
//! RDMA WRITE followed by a 4-byte SEND ([`Config::msg_send`]).
//!
//! The socket owns the memory: this module says which byte ranges to copy and which work
//! requests to post ([`Post`], [`RecvPost`]), and is told about completions
//! ([`Stream::on_send_done`], [`Stream::on_recv`]).

use std::collections::VecDeque;

use crate::wire::{ctrl, Msg, Op, RsIomap, RsSge, IOMAP_LEN, MSG_LEN, SGE_LEN, SGL_SIZE};

/// Control messages in flight at once (`RS_QP_CTRL_SIZE`).
pub const CTRL_SIZE: u16 = 4;
/// A send waits until this much of the send buffer is free (`RS_SNDLOWAT`).
pub const SNDLOWAT: u32 = 2048;
/// The first chunk of a large send (`RS_OLAP_START_SIZE`); chunks double up to
/// [`MAX_TRANSFER`].
pub const OLAP_START: u32 = 2048;
/// Largest chunk (`RS_MAX_TRANSFER`).
pub const MAX_TRANSFER: u32 = 65536;

const WR_RECV: u64 = 1 << 63;
const WR_MSG_SEND: u64 = 1 << 62;

/// Sizes fixed when the QP is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// iWARP: messages are SENDs (`RS_OPT_MSG_SEND`).
    pub msg_send: bool,
    /// Send queue depth.
    pub sq_size: u16,
    /// Receive queue depth, also the credits granted.
    pub rq_size: u16,
    /// Largest chunk of application data sent inline.
    pub sq_inline: u32,
    /// Send buffer bytes.
    pub sbuf_size: u32,
    /// Receive buffer bytes (two halves).
    pub rbuf_size: u32,
}

/// Where a posted write's local bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Local {
    /// No bytes (a message alone).
    Empty,
    /// These bytes, sent inline.
    Bytes(Vec<u8>),
    /// The next `len` bytes of the caller's buffer, sent inline.
    Caller(u32),
    /// The caller's bytes, copied first into these send-buffer ranges (offset, length).
    Sbuf(Vec<(u32, u32)>),
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostKind {
    /// RDMA WRITE WITH IMMEDIATE of a message.
    WriteImm {
        /// Remote address.
        addr: u64,
        /// Remote key.
        rkey: u32,
        /// The message, as the immediate value.
        msg: Msg,
    },
    /// Plain RDMA WRITE.
    Write {
        /// Remote address.
        addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// SEND (the 4-byte message on iWARP, in [`Post::local`]).
    Send,
}

/// One send work request to post, signaled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Post {
    /// Its work request id (the stream reads it back in [`Stream::on_send_done`]).
    pub wr_id: u64,
    /// The operation.
    pub kind: PostKind,
    /// Local bytes.
    pub local: Local,
}

/// One receive to post: `slot` is the index of a 4-byte message slot after the receive
/// buffer (iWARP), or `None` (zero-length receive for immediate data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvPost {
    /// Work request id.
    pub wr_id: u64,
    /// Message slot.
    pub slot: Option<u32>,
}

/// What a receive completion meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Data is ready to read.
    Data,
    /// More credits; entry `remote_sgl` of the target SGL may have been rewritten: re-read it.
    Credits,
    /// Entry `index` of the target iomap table was written.
    Iomap(u32),
    /// The peer closed both directions.
    Disconnect,
    /// The peer will send no more.
    Shutdown,
    /// Nothing to do (keep-alive, reserved).
    Nothing,
}

/// A chunk of application data to send now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Bytes of the caller's buffer this chunk takes.
    pub len: u32,
    /// Work requests (the first carries the data).
    pub posts: Vec<Post>,
    /// The target SGL entry this chunk used up: the socket clears it in the target buffer,
    /// so that only a new descriptor from the peer can fill it again.
    pub used_up: Option<usize>,
}

/// No region the peer mapped covers the offset of a `riowrite`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unmapped;

/// The flow-control state of one connection.
#[derive(Debug)]
pub struct Stream {
    cfg: Config,
    swap: bool,
    // send side
    sseq_no: u16,
    sseq_comp: u16,
    sqe_avail: u32,
    sbuf_bytes_avail: u32,
    sbuf_head: u32,
    target: [RsSge; SGL_SIZE as usize],
    target_sge: usize,
    ctrl_seqno: u16,
    ctrl_max_seqno: u16,
    remote_sgl: RsSge,
    remote_sge: u32,
    remote_iomap: RsSge,
    iomap: Vec<RsIomap>,
    // receive side
    rseq_no: u16,
    rseq_comp: u16,
    rmsg: VecDeque<u32>,
    rbuf_offset: u32,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rbuf_addr: u64,
    rbuf_rkey: u32,
    msg_slot: u32,
    msg_slots: u32,
}

/// What the socket knows of the peer when the connection is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The peer's descriptors are in the other byte order.
    pub swap: bool,
    /// Credits the peer grants first.
    pub credits: u16,
    /// The peer's target SGL (where our new buffer descriptors go).
    pub target_sgl: RsSge,
    /// The peer's target iomap table (length = entries), if it has one.
    pub target_iomap: Option<RsSge>,
    /// The first half of the peer's receive buffer.
    pub data_buf: RsSge,
}

impl Stream {
    /// A stream whose receive buffer is at `rbuf_addr` (rkey `rbuf_rkey`), connected to `peer`.
    /// `msg_slots` message slots follow the buffer (iWARP).
    pub fn new(cfg: Config, rbuf_addr: u64, rbuf_rkey: u32, msg_slots: u32, peer: Peer) -> Stream {
        let iomap_entries = peer.target_iomap.map_or(0, |m| m.length);
        Stream {
            cfg,
            swap: peer.swap,
            sseq_no: 0,
            sseq_comp: peer.credits,
            sqe_avail: u32::from(cfg.sq_size).saturating_sub(u32::from(CTRL_SIZE)),
            sbuf_bytes_avail: cfg.sbuf_size,
            sbuf_head: 0,
            target: [peer.data_buf, RsSge::default()],
            target_sge: 0,
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SIZE,
            remote_sgl: peer.target_sgl,
            remote_sge: 1,
            remote_iomap: peer.target_iomap.unwrap_or_default(),
            iomap: vec![RsIomap::default(); iomap_entries as usize],
            rseq_no: 0,
            rseq_comp: cfg.rq_size >> 1,
            rmsg: VecDeque::new(),
            rbuf_offset: 0,
            rbuf_bytes_avail: cfg.rbuf_size >> 1,
            rbuf_free_offset: cfg.rbuf_size >> 1,
            rbuf_addr,
            rbuf_rkey,
            msg_slot: 0,
            msg_slots: msg_slots.max(1),
        }
    }

    /// The configuration.
    pub fn config(&self) -> Config {
        self.cfg
    }

    /// The next receive to post.
    pub fn next_recv(&mut self) -> RecvPost {
        if !self.cfg.msg_send {
            return RecvPost {
                wr_id: WR_RECV,
                slot: None,
            };
        }
        let slot = self.msg_slot;
        self.msg_slot = (self.msg_slot + 1) % self.msg_slots;
        RecvPost {
            wr_id: WR_RECV | u64::from(slot),
            slot: Some(slot),
        }
    }

    /// True for the work request id of a receive.
    pub fn is_recv(wr_id: u64) -> bool {
        wr_id & WR_RECV != 0
    }

    /// The message slot a receive used.
    pub fn recv_slot(wr_id: u64) -> u32 {
        wr_id as u32
    }

    fn sqe_per_msg(&self) -> u32 {
        if self.cfg.msg_send {
            2
        } else {
            1
        }
    }

    /// True when a chunk can go now (`rs_can_send`).
    pub fn can_send(&self) -> bool {
        self.sqe_avail >= self.sqe_per_msg()
            && self.sbuf_bytes_avail >= SNDLOWAT.min(self.cfg.sbuf_size)
            && self.sseq_no != self.sseq_comp
            && self.target[self.target_sge].length != 0
    }

    /// True when every posted send has completed.
    pub fn sends_done(&self) -> bool {
        self.sqe_avail == u32::from(self.cfg.sq_size).saturating_sub(u32::from(CTRL_SIZE))
            && self.ctrl_seqno == self.ctrl_max_seqno.wrapping_sub(CTRL_SIZE)
    }

    fn msg_posts(&self, wr_data: u32, data: Local, addr: u64, rkey: u32, msg: Msg) -> Vec<Post> {
        if !self.cfg.msg_send {
            return vec![Post {
                wr_id: u64::from(wr_data),
                kind: PostKind::WriteImm { addr, rkey, msg },
                local: data,
            }];
        }
        let mut posts = Vec::with_capacity(2);
        if data != Local::Empty {
            posts.push(Post {
                wr_id: u64::from(wr_data),
                kind: PostKind::Write { addr, rkey },
                local: data,
            });
        }
        posts.push(Post {
            wr_id: u64::from(Msg::new(msg.op(), 0).0) | WR_MSG_SEND,
            kind: PostKind::Send,
            local: Local::Bytes(msg.0.to_ne_bytes()[..MSG_LEN].to_vec()),
        });
        posts
    }

    fn take_sbuf(&mut self, len: u32) -> Vec<(u32, u32)> {
        let size = self.cfg.sbuf_size;
        let first = len.min(size - self.sbuf_head);
        let mut parts = vec![(self.sbuf_head, first)];
        if first < len {
            parts.push((0, len - first));
        }
        self.sbuf_head = (self.sbuf_head + len) % size;
        parts
    }

    /// The next chunk of a send with `left` bytes to go; `olen` is the send's current chunk
    /// limit (start at [`OLAP_START`]). `None` when the stream cannot send now.
    pub fn next_chunk(&mut self, left: usize, olen: &mut u32) -> Option<Chunk> {
        if left == 0 || !self.can_send() {
            return None;
        }
        let mut xfer = if (*olen as usize) < left {
            let x = *olen;
            if *olen < MAX_TRANSFER {
                *olen <<= 1;
            }
            x
        } else {
            left as u32
        };
        xfer = xfer.min(self.sbuf_bytes_avail).min(self.target[self.target_sge].length);
        let local = if xfer <= self.cfg.sq_inline {
            Local::Caller(xfer)
        } else {
            Local::Sbuf(self.take_sbuf(xfer))
        };
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= self.sqe_per_msg();
        self.sbuf_bytes_avail -= xfer;
        let t = &mut self.target[self.target_sge];
        let (addr, rkey) = (t.addr, t.key);
        t.addr += u64::from(xfer);
        t.length -= xfer;
        let mut used_up = None;
        if t.length == 0 {
            used_up = Some(self.target_sge);
            self.target_sge = (self.target_sge + 1) % SGL_SIZE as usize;
        }
        let msg = Msg::new(Op::Data, xfer);
        let posts = self.msg_posts(msg.0, local, addr, rkey, msg);
        Some(Chunk {
            len: xfer,
            posts,
            used_up,
        })
    }

    /// The peer's iomap entry `index` was rewritten: `entry` is what its bytes now say.
    pub fn set_iomap(&mut self, index: u32, entry: RsIomap) {
        if let Some(e) = self.iomap.get_mut(index as usize) {
            *e = entry;
        }
    }

    /// Where the peer's iomap table's entry `index` lives (to re-read it after an
    /// [`Arrival::Iomap`]): its byte offset in our target buffer.
    pub fn iomap_entry_offset(index: u32) -> usize {
        SGE_LEN * SGL_SIZE as usize + IOMAP_LEN * index as usize
    }

    /// A direct write (`riowrite`) of up to `left` bytes at `offset` of the peer's mapped
    /// regions; `None` when it cannot go now, [`Unmapped`] when no mapping covers `offset`.
    pub fn next_direct(&mut self, left: usize, offset: u64, olen: &mut u32) -> Result<Option<Chunk>, Unmapped> {
        let Some(m) = self.iomap.iter().copied().find(|m| {
            m.sge.length != 0 && offset >= m.offset && offset < m.offset.saturating_add(u64::from(m.sge.length))
        }) else {
            return Err(Unmapped);
        };
        if left == 0 || !self.can_send() {
            return Ok(None);
        }
        let mut xfer = if (*olen as usize) < left {
            let x = *olen;
            if *olen < MAX_TRANSFER {
                *olen <<= 1;
            }
            x
        } else {
            left as u32
        };
        let room = (m.offset.saturating_add(u64::from(m.sge.length)) - offset).min(u64::from(u32::MAX)) as u32;
        xfer = xfer.min(self.sbuf_bytes_avail).min(room);
        let local = if xfer <= self.cfg.sq_inline {
            Local::Caller(xfer)
        } else {
            Local::Sbuf(self.take_sbuf(xfer))
        };
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= xfer;
        Ok(Some(Chunk {
            len: xfer,
            used_up: None,
            posts: vec![Post {
                wr_id: u64::from(Msg::new(Op::Write, xfer).0),
                kind: PostKind::Write {
                    addr: m.sge.addr + (offset - m.offset),
                    rkey: m.sge.key,
                },
                local,
            }],
        }))
    }

    /// Tells the peer about a region it may write (`riomap`): entry `index` of its iomap
    /// table. `None` when the stream cannot send now.
    pub fn iomap_posts(&mut self, index: u32, entry: RsIomap) -> Option<Vec<Post>> {
        if !self.can_send() || index >= self.remote_iomap.length {
            return None;
        }
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= self.sqe_per_msg();
        self.sbuf_bytes_avail -= IOMAP_LEN as u32;
        let addr = self.remote_iomap.addr + (IOMAP_LEN as u64) * u64::from(index);
        let msg = Msg::new(Op::IomapSgl, index);
        Some(self.msg_posts(
            msg.0,
            Local::Bytes(entry.to_bytes(self.swap).to_vec()),
            addr,
            self.remote_iomap.key,
            msg,
        ))
    }

    /// Entries of the peer's iomap table (how many regions `riomap` can announce).
    pub fn remote_iomap_entries(&self) -> u32 {
        self.remote_iomap.length
    }

    /// A send completed (any status; the socket handles errors).
    pub fn on_send_done(&mut self, wr_id: u64) {
        let msg = Msg(wr_id as u32);
        match msg.op() {
            Op::Sgl => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
            Op::Ctrl => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
            Op::IomapSgl => {
                self.sqe_avail += 1;
                if wr_id & WR_MSG_SEND == 0 {
                    self.sbuf_bytes_avail += IOMAP_LEN as u32;
                }
            }
            _ => {
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += msg.data();
            }
        }
    }

    /// A receive completed successfully with this message (the immediate value, or the
    /// 4 bytes of its slot).
    pub fn on_recv(&mut self, msg: Msg) -> Arrival {
        match msg.op() {
            Op::Sgl => {
                self.sseq_comp = msg.data() as u16;
                Arrival::Credits
            }
            Op::IomapSgl => Arrival::Iomap(msg.data()),
            Op::Ctrl => match msg.data() {
                ctrl::DISCONNECT => Arrival::Disconnect,
                ctrl::SHUTDOWN => Arrival::Shutdown,
                _ => Arrival::Nothing,
            },
            Op::Write => Arrival::Nothing,
            _ => {
                self.rmsg.push_back(msg.data());
                Arrival::Data
            }
        }
    }

    /// The target SGL entries as the target buffer holds them now: entries this side has used
    /// up are taken over (the peer only rewrites an entry after we emptied it, and the socket
    /// clears each entry it empties, see [`Chunk::used_up`]).
    pub fn refresh_target(&mut self, written: [RsSge; SGL_SIZE as usize]) {
        for (mine, theirs) in self.target.iter_mut().zip(written) {
            if mine.length == 0 {
                *mine = theirs;
            }
        }
    }

    /// The byte order of the peer's descriptors differs from ours.
    pub fn swap(&self) -> bool {
        self.swap
    }

    /// Bytes ready to read.
    pub fn readable_bytes(&self) -> usize {
        self.rmsg.iter().map(|&n| n as usize).sum()
    }

    /// True when data is ready to read.
    pub fn has_data(&self) -> bool {
        !self.rmsg.is_empty()
    }

    /// Takes up to `left` readable bytes: the receive-buffer ranges (offset, length) to copy
    /// out, in order. With `peek` nothing is consumed.
    pub fn take_data(&mut self, left: usize, peek: bool) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let mut left = left;
        let mut offset = self.rbuf_offset;
        let mut i = 0;
        while left > 0 && i < self.rmsg.len() {
            let avail = self.rmsg[i];
            let take = (avail as usize).min(left) as u32;
            let end = self.cfg.rbuf_size - offset;
            if take > end {
                out.push((offset, end));
                out.push((0, take - end));
                offset = take - end;
            } else {
                out.push((offset, take));
                offset = (offset + take) % self.cfg.rbuf_size;
            }
            left -= take as usize;
            if peek {
                i += 1;
                continue;
            }
            self.rbuf_bytes_avail += take;
            if take < avail {
                self.rmsg[i] -= take;
            } else {
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            }
        }
        if !peek {
            self.rbuf_offset = offset;
        }
        out
    }

    fn ctrl_room(&self, n: u16) -> bool {
        (self.ctrl_seqno.wrapping_add(n - 1).wrapping_sub(self.ctrl_max_seqno) as i16) < 0
    }

    /// Credits (and a free half of the receive buffer) to grant now, if due
    /// (`rs_update_credits`).
    pub fn credits_due(&mut self) -> Option<Vec<Post>> {
        let half = self.cfg.rbuf_size >> 1;
        let due = self.rbuf_bytes_avail >= half || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0;
        let room = if self.cfg.msg_send {
            self.ctrl_room(2)
        } else {
            self.ctrl_room(1)
        };
        if !due || !room {
            return None;
        }
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.cfg.rq_size >> 1);
        let msg = Msg::new(Op::Sgl, u32::from(self.rseq_no.wrapping_add(self.cfg.rq_size)));
        if self.rbuf_bytes_avail >= half {
            if self.cfg.msg_send {
                self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
            }
            let sge = RsSge {
                addr: self.rbuf_addr + u64::from(self.rbuf_free_offset),
                key: self.rbuf_rkey,
                length: half,
            };
            let addr = self.remote_sgl.addr + (SGE_LEN as u64) * u64::from(self.remote_sge);
            let posts = self.msg_posts(
                msg.0,
                Local::Bytes(sge.to_bytes(self.swap).to_vec()),
                addr,
                self.remote_sgl.key,
                msg,
            );
            self.rbuf_bytes_avail -= half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= self.cfg.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge >= self.remote_sgl.length.max(1) {
                self.remote_sge = 0;
            }
            Some(posts)
        } else {
            Some(self.msg_posts(msg.0, Local::Empty, 0, 0, msg))
        }
    }

    /// The control message of a shutdown (`RS_CTRL_DISCONNECT` or `RS_CTRL_SHUTDOWN`), if a
    /// control slot is free.
    pub fn ctrl_posts(&mut self, what: u32) -> Option<Vec<Post>> {
        if !self.ctrl_room(1) {
            return None;
        }
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        let msg = Msg::new(Op::Ctrl, what);
        Some(self.msg_posts(msg.0, Local::Empty, 0, 0, msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(msg_send: bool) -> Config {
        Config {
            msg_send,
            sq_size: 384,
            rq_size: 384,
            sq_inline: 64,
            sbuf_size: 1 << 17,
            rbuf_size: 1 << 17,
        }
    }

    fn pair(msg_send: bool) -> (Stream, Stream) {
        let peer_of = |rbuf: u64, target: u64| Peer {
            swap: false,
            credits: 384,
            target_sgl: RsSge {
                addr: target,
                key: 9,
                length: SGL_SIZE,
            },
            target_iomap: None,
            data_buf: RsSge {
                addr: rbuf,
                key: 5,
                length: 1 << 16,
            },
        };
        (
            Stream::new(cfg(msg_send), 0x10_0000, 5, 384, peer_of(0x20_0000, 0x2F_0000)),
            Stream::new(cfg(msg_send), 0x20_0000, 5, 384, peer_of(0x10_0000, 0x1F_0000)),
        )
    }

    /// Moves every post of `a` to `b` as the wire would: returns the messages `b` receives
    /// and the SGL entries written into `b`'s target area.
    fn deliver(a_posts: &[Post], b: &mut Stream, b_target: &mut [RsSge; 2], b_target_addr: u64) -> Vec<Arrival> {
        let mut out = Vec::new();
        for p in a_posts {
            let msg = match (&p.kind, &p.local) {
                (PostKind::WriteImm { addr, msg, .. }, local) => {
                    if let Local::Bytes(b16) = local {
                        if b16.len() == SGE_LEN {
                            let i = ((addr - b_target_addr) / SGE_LEN as u64) as usize;
                            b_target[i] = RsSge::from_bytes(&b16[..].try_into().expect("16"), false);
                        }
                    }
                    Some(*msg)
                }
                (PostKind::Write { addr, .. }, Local::Bytes(b16)) if b16.len() == SGE_LEN => {
                    let i = ((addr - b_target_addr) / SGE_LEN as u64) as usize;
                    b_target[i] = RsSge::from_bytes(&b16[..].try_into().expect("16"), false);
                    None
                }
                (PostKind::Send, Local::Bytes(m)) => Some(Msg(u32::from_ne_bytes(m[..4].try_into().expect("4")))),
                _ => None,
            };
            if let Some(m) = msg {
                let arrival = b.on_recv(m);
                if arrival == Arrival::Credits {
                    b.refresh_target(*b_target);
                }
                out.push(arrival);
            }
        }
        out
    }

    #[test]
    fn a_megabyte_flows_through_a_128k_ring_with_credits_on_both_transports() {
        for msg_send in [false, true] {
            let (mut a, mut b) = pair(msg_send);
            let mut a_target = [RsSge::default(); 2];
            let mut sent = 0usize;
            let mut received = 0usize;
            let total = 1 << 20;
            let mut rounds = 0;
            while received < total {
                rounds += 1;
                assert!(rounds < 10_000, "stuck at sent {sent} received {received}");
                let mut olen = OLAP_START;
                while let Some(c) = a.next_chunk(total - sent, &mut olen) {
                    if let Some(i) = c.used_up {
                        a_target[i] = RsSge::default();
                    }
                    sent += c.len as usize;
                    assert!(c.len > 0);
                    let arrivals = deliver(&c.posts, &mut b, &mut [RsSge::default(); 2], 0x2F_0000);
                    assert_eq!(arrivals, vec![Arrival::Data]);
                    for p in &c.posts {
                        a.on_send_done(p.wr_id);
                    }
                }
                // the receiver reads everything, then grants credits and the next half
                let ranges = b.take_data(usize::MAX, false);
                received += ranges.iter().map(|r| r.1 as usize).sum::<usize>();
                while let Some(posts) = b.credits_due() {
                    deliver(&posts, &mut a, &mut a_target, 0x1F_0000);
                    for p in &posts {
                        b.on_send_done(p.wr_id);
                    }
                }
            }
            assert_eq!(sent, total);
            assert!(a.sends_done() && b.sends_done());
        }
    }

    #[test]
    fn a_sender_stops_at_the_credit_limit_and_the_half_boundary() {
        let (mut a, mut b) = pair(false);
        let mut olen = MAX_TRANSFER;
        let c = a.next_chunk(1 << 20, &mut olen).expect("a chunk");
        assert_eq!(c.len, 1 << 16, "one chunk fills the first half");
        assert!(!a.can_send(), "the second half is not granted yet");
        assert!(a.next_chunk(10, &mut olen).is_none());
        deliver(&c.posts, &mut b, &mut [RsSge::default(); 2], 0);
        // reading part of the data consumes no message: credits stay, no new half yet
        let r = b.take_data(100, false);
        assert_eq!(r, vec![(0, 100)]);
        let peeked = b.take_data(10, true);
        assert_eq!(peeked, vec![(100, 10)]);
        assert_eq!(b.readable_bytes(), (1 << 16) - 100);
    }

    #[test]
    fn a_used_up_half_is_not_taken_again_from_the_target_buffer() {
        // rcopy once found this: the target buffer still held the descriptor of a half the
        // sender had filled, and a credits-only message made the sender take it again,
        // overwriting data the receiver had not read. Chunk::used_up says which entry to clear.
        let (mut a, _b) = pair(false);
        let mut olen = MAX_TRANSFER;
        // the receiver granted the second half into entry 1 at once
        let mut target = [
            RsSge::default(),
            RsSge {
                addr: 0x20_0000 + (1 << 16),
                key: 5,
                length: 1 << 16,
            },
        ];
        assert_eq!(a.on_recv(Msg::new(Op::Sgl, 400)), Arrival::Credits);
        a.refresh_target(target);
        let first = a.next_chunk(1 << 16, &mut olen).expect("the first half");
        assert_eq!(first.used_up, Some(0));
        let second = a.next_chunk(1 << 16, &mut olen).expect("the second half");
        assert_eq!(second.used_up, Some(1));
        let stale = target;
        for used in [first.used_up, second.used_up].into_iter().flatten() {
            target[used] = RsSge::default();
        }
        // the receiver frees the first half and grants it again, into entry 0
        target[0] = RsSge {
            addr: 0x20_0000,
            key: 5,
            length: 1 << 16,
        };
        for p in first.posts.iter().chain(&second.posts) {
            a.on_send_done(p.wr_id); // the send buffer is free again
        }
        assert_eq!(a.on_recv(Msg::new(Op::Sgl, 800)), Arrival::Credits);
        a.refresh_target(target);
        let third = a.next_chunk(1 << 16, &mut olen).expect("the first half again");
        assert_eq!(third.used_up, Some(0));
        target[0] = RsSge::default();
        for p in &third.posts {
            a.on_send_done(p.wr_id);
        }
        // a grant of credits alone (no new half): nothing to write into
        assert_eq!(a.on_recv(Msg::new(Op::Sgl, 1200)), Arrival::Credits);
        a.refresh_target(target);
        assert!(!a.can_send(), "both halves are full until the receiver frees one");
        // had entry 1 not been cleared, its old descriptor would be taken again
        a.refresh_target([target[0], stale[1]]);
        assert!(a.can_send());
    }

    #[test]
    fn a_hostile_iomap_entry_cannot_overflow_a_direct_write() {
        let peer = Peer {
            swap: false,
            credits: 16,
            target_sgl: RsSge {
                addr: 0x1000,
                key: 1,
                length: SGL_SIZE,
            },
            target_iomap: Some(RsSge {
                addr: 0x1020,
                key: 1,
                length: 1,
            }),
            data_buf: RsSge {
                addr: 0x8000,
                key: 2,
                length: 4096,
            },
        };
        let mut a = Stream::new(cfg(false), 0x9000, 3, 0, peer);
        a.set_iomap(
            0,
            RsIomap {
                offset: u64::MAX - 10,
                sge: RsSge {
                    addr: 0x5000,
                    key: 4,
                    length: 100,
                },
            },
        );
        a.set_iomap(7, RsIomap::default()); // an index past the table: ignored
        let mut olen = OLAP_START;
        let c = a
            .next_direct(64, u64::MAX - 5, &mut olen)
            .expect("mapped")
            .expect("room");
        assert_eq!(c.len, 5, "up to the end of the offset space, no further");
        assert_eq!(a.next_direct(1, 0, &mut olen), Err(Unmapped));
    }

    #[test]
    fn shutdown_and_disconnect_messages() {
        let (mut a, mut b) = pair(true);
        let posts = a.ctrl_posts(ctrl::SHUTDOWN).expect("a control slot");
        assert_eq!(posts.len(), 1, "a bare message on iWARP is one SEND");
        assert_eq!(
            deliver(&posts, &mut b, &mut [RsSge::default(); 2], 0),
            vec![Arrival::Shutdown]
        );
        for _ in 0..3 {
            a.ctrl_posts(ctrl::KEEPALIVE).expect("room for four");
        }
        assert!(
            a.ctrl_posts(ctrl::DISCONNECT).is_none(),
            "four control messages in flight at most"
        );
        a.on_send_done(posts[0].wr_id);
        assert!(a.ctrl_posts(ctrl::DISCONNECT).is_some());
    }
}
