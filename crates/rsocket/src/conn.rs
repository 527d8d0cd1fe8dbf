//! The verbs resources of one connected rsocket, and the I/O that applies a [`Stream`]'s
//! decisions: buffers, QP, CQ, posting, completions.

use softrdma_cm::CmId;
use softrdma_verbs::device::TransportKind;
use softrdma_verbs::wr::wc_flags;
use softrdma_verbs::{
    Access, CompChannel, Cq, Mr, Pd, Qp, QpCap, QpInitAttr, QpType, RecvWr, SendFlags, SendWr, Sge, WcStatus,
    WorkCompletion, WrOpcode,
};

use crate::error::{Result, RsError};

use crate::flow::{Arrival, Config, Local, Peer, Post, PostKind, Stream};
use crate::options::Sizes;
use crate::wire::{self, ConnData, Msg, RsIomap, RsSge, IOMAP_LEN, MSG_LEN, SGE_LEN, SGL_SIZE};

/// Extra receives beyond the credits granted, for the peer's control messages.
const CTRL_RECVS: u16 = crate::flow::CTRL_SIZE;

/// What a round of completion processing found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The peer sent RS_CTRL_DISCONNECT.
    pub disconnect: bool,
    /// The peer sent RS_CTRL_SHUTDOWN.
    pub shutdown: bool,
    /// A completion failed (the connection is broken).
    pub failed: Option<WcStatus>,
    /// Completions applied.
    pub completions: usize,
}

/// Buffers, queues and flow control of a connected rsocket.
pub struct Conn {
    pub(crate) pd: Pd,
    pub(crate) channel: CompChannel,
    pub(crate) cq: Cq,
    pub(crate) qp: Qp,
    smr: Mr,
    scratch: Mr,
    rmr: Mr,
    tmr: Mr,
    cfg: Config,
    iomap_entries: u32,
    /// The flow-control state, once the peer's connection data is known.
    pub(crate) stream: Option<Stream>,
    armed: bool,
}

impl Conn {
    /// Creates the CQ, QP and buffers on `id`'s device (`rs_create_ep`).
    pub fn create(id: &CmId, sizes: &Sizes) -> Result<Conn> {
        let Some(ctx) = id.context() else {
            return Err(RsError::new(libc::EINVAL, "rsocket: the connection has no device"));
        };
        let iwarp = ctx.device().transport == TransportKind::Iwarp;
        let max_wr = ctx.query_device().max_qp_wr.clamp(16, 0xFFFE) as u32;
        let sq_size = sizes.sq_size.clamp(16, max_wr as u16);
        let rq_size = sizes
            .rq_size
            .clamp(16, (max_wr as u16).saturating_sub(CTRL_RECVS).max(16));
        let mut sq_inline = sizes.sq_inline;
        if iwarp && (sq_inline as usize) < MSG_LEN {
            sq_inline = MSG_LEN as u32;
        }
        let sq_inline = sq_inline.min(softrdma_verbs::qp::MAX_INLINE);
        let cfg = Config {
            msg_send: iwarp,
            sq_size,
            rq_size,
            sq_inline,
            sbuf_size: sizes.sbuf_size,
            rbuf_size: sizes.rbuf_size,
        };
        let pd = ctx.alloc_pd()?;
        let channel = ctx.create_comp_channel()?;
        let recvs = u32::from(rq_size) + u32::from(CTRL_RECVS);
        let cq = ctx.create_cq(u32::from(sq_size) + recvs, Some(&channel))?;
        let init = QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpCap {
                max_send_wr: u32::from(sq_size),
                max_recv_wr: recvs,
                max_send_sge: 2,
                max_recv_sge: 1,
                // descriptors (up to 24 bytes) always go inline; data only up to sq_inline
                max_inline_data: sq_inline.max(IOMAP_LEN as u32),
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
        };
        let qp = id.create_qp(&pd, init)?;
        let smr = pd.alloc_mr(sizes.sbuf_size as usize, Access::LOCAL_WRITE)?;
        // inline bytes are copied at post time, from here
        let scratch = pd.alloc_mr(softrdma_verbs::qp::MAX_INLINE as usize, Access::LOCAL_WRITE)?;
        let slots = if iwarp { recvs as usize * MSG_LEN } else { 0 };
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let rmr = pd.alloc_mr(sizes.rbuf_size as usize + slots, rw)?;
        let iomap_entries = wire::scale_to_value(wire::value_to_scale(u32::from(sizes.iomap_size)));
        let tmr = pd.alloc_mr(SGE_LEN * SGL_SIZE as usize + IOMAP_LEN * iomap_entries as usize, rw)?;
        let mut conn = Conn {
            pd,
            channel,
            cq,
            qp,
            smr,
            scratch,
            rmr,
            tmr,
            cfg,
            iomap_entries,
            stream: None,
            armed: false,
        };
        // Receives go up before the connection data leaves, as the peer may write at once.
        conn.post_initial_recvs(recvs)?;
        Ok(conn)
    }

    fn post_initial_recvs(&mut self, n: u32) -> Result<()> {
        // A provisional stream numbers the message slots; the real one continues after them.
        let mut slot = 0u32;
        for _ in 0..n {
            let (wr_id, s) = if self.cfg.msg_send {
                let s = slot;
                slot += 1;
                ((1u64 << 63) | u64::from(s), Some(s))
            } else {
                (1u64 << 63, None)
            };
            self.post_recv(wr_id, s)?;
        }
        Ok(())
    }

    fn post_recv(&self, wr_id: u64, slot: Option<u32>) -> Result<()> {
        let sg_list = match slot {
            Some(s) => vec![Sge {
                addr: self.rmr.addr() + u64::from(self.cfg.rbuf_size) + u64::from(s) * MSG_LEN as u64,
                length: MSG_LEN as u32,
                lkey: self.rmr.lkey(),
            }],
            None => Vec::new(),
        };
        self.qp
            .post_recv(&[RecvWr { wr_id, sg_list }])
            .map_err(|(_, e)| RsError::from(e))
    }

    /// This side's connection data (`rs_format_conn_data`).
    pub fn conn_data(&self) -> ConnData {
        ConnData {
            version: wire::VERSION,
            flags: wire::FLAG_IOMAP | if wire::HOST_IS_NET { wire::FLAG_NET } else { 0 },
            credits: self.cfg.rq_size,
            target_iomap_size: wire::value_to_scale(self.iomap_entries),
            target_sgl: RsSge {
                addr: self.tmr.addr(),
                key: self.tmr.rkey(),
                length: SGL_SIZE,
            },
            data_buf: RsSge {
                addr: self.rmr.addr(),
                key: self.rmr.rkey(),
                length: self.cfg.rbuf_size >> 1,
            },
        }
    }

    /// Takes the peer's connection data (`rs_save_conn_data`).
    pub fn start(&mut self, peer: &ConnData) {
        let swap = peer.needs_swap();
        let target_iomap = (peer.flags & wire::FLAG_IOMAP != 0).then(|| RsSge {
            addr: peer.target_sgl.addr + SGE_LEN as u64 * u64::from(peer.target_sgl.length),
            key: peer.target_sgl.key,
            length: wire::scale_to_value(peer.target_iomap_size),
        });
        let slots = u32::from(self.cfg.rq_size) + u32::from(CTRL_RECVS);
        let mut stream = Stream::new(
            self.cfg,
            self.rmr.addr(),
            self.rmr.rkey(),
            slots,
            Peer {
                swap,
                credits: peer.credits,
                target_sgl: peer.target_sgl,
                target_iomap,
                data_buf: peer.data_buf,
            },
        );
        // the initial receives used slots 0..slots; the stream's counter wraps to 0 again
        for _ in 0..slots {
            stream.next_recv();
        }
        self.stream = Some(stream);
    }

    /// Entries this side's iomap table holds (what the peer may map into it).
    pub fn own_iomap_entries(&self) -> u32 {
        self.iomap_entries
    }

    /// Posts `posts`, taking caller bytes from `caller` and copying them into the send buffer
    /// where asked.
    pub fn post(&self, posts: &[Post], caller: &[u8]) -> Result<()> {
        for p in posts {
            let mut flags = SendFlags::SIGNALED;
            let sg_list = match &p.local {
                Local::Empty => Vec::new(),
                Local::Bytes(b) => {
                    flags = flags | SendFlags::INLINE;
                    self.scratch.write(0, b)?;
                    vec![self.scratch.sge(0, b.len() as u32)]
                }
                Local::Caller(n) => {
                    flags = flags | SendFlags::INLINE;
                    let b = &caller[..(*n as usize).min(caller.len())];
                    self.scratch.write(0, b)?;
                    vec![self.scratch.sge(0, b.len() as u32)]
                }
                Local::Sbuf(parts) => {
                    let mut done = 0usize;
                    let mut sges = Vec::with_capacity(parts.len());
                    for &(off, len) in parts {
                        let end = (done + len as usize).min(caller.len());
                        self.smr.write(off as usize, &caller[done..end])?;
                        done = end;
                        sges.push(self.smr.sge(off as usize, len));
                    }
                    sges
                }
            };
            let mut wr = SendWr {
                wr_id: p.wr_id,
                sg_list,
                flags,
                ..SendWr::default()
            };
            match p.kind {
                PostKind::WriteImm { addr, rkey, msg } => {
                    wr.opcode = Some(WrOpcode::RdmaWriteWithImm);
                    wr.remote_addr = addr;
                    wr.rkey = rkey;
                    wr.imm_data = msg.0.to_be();
                }
                PostKind::Write { addr, rkey } => {
                    wr.opcode = Some(WrOpcode::RdmaWrite);
                    wr.remote_addr = addr;
                    wr.rkey = rkey;
                }
                PostKind::Send => wr.opcode = Some(WrOpcode::Send),
            }
            self.qp
                .post_send(std::slice::from_ref(&wr))
                .map_err(|(_, e)| RsError::from(e))?;
        }
        Ok(())
    }

    /// Posts a chunk of application data (`bytes`), clearing the target entry it used up.
    pub fn send_chunk(&self, chunk: &crate::flow::Chunk, bytes: &[u8]) -> Result<()> {
        if let Some(i) = chunk.used_up {
            self.tmr.write(i * SGE_LEN, &[0u8; SGE_LEN])?;
        }
        self.post(&chunk.posts, bytes)
    }

    /// Reads and applies every completion; reposts receives while `repost`.
    pub fn poll(&mut self, repost: bool) -> Result<Progress> {
        let mut out = Progress::default();
        let mut wcs = [WorkCompletion::new(0, WcStatus::Success, softrdma_verbs::WcOpcode::Send, 0); 32];
        loop {
            let n = self.cq.poll(&mut wcs);
            if n == 0 {
                break;
            }
            out.completions += n;
            for wc in &wcs[..n] {
                self.complete(wc, repost, &mut out)?;
            }
        }
        Ok(out)
    }

    fn complete(&mut self, wc: &WorkCompletion, repost: bool, out: &mut Progress) -> Result<()> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        if !Stream::is_recv(wc.wr_id) {
            stream.on_send_done(wc.wr_id);
            if wc.status != WcStatus::Success {
                out.failed.get_or_insert(wc.status);
            }
            return Ok(());
        }
        if wc.status != WcStatus::Success {
            out.failed.get_or_insert(wc.status);
            return Ok(());
        }
        let msg = if wc.wc_flags & wc_flags::WITH_IMM != 0 {
            Msg(u32::from_be(wc.imm_data))
        } else {
            let slot = Stream::recv_slot(wc.wr_id);
            let mut b = [0u8; MSG_LEN];
            self.rmr
                .read(self.cfg.rbuf_size as usize + slot as usize * MSG_LEN, &mut b)?;
            Msg(u32::from_ne_bytes(b))
        };
        match stream.on_recv(msg) {
            Arrival::Credits => {
                let mut b = [0u8; SGE_LEN * SGL_SIZE as usize];
                self.tmr.read(0, &mut b)?;
                let swap = stream.swap();
                let mut entries = [RsSge::default(); SGL_SIZE as usize];
                for (i, e) in entries.iter_mut().enumerate() {
                    let mut one = [0u8; SGE_LEN];
                    one.copy_from_slice(&b[i * SGE_LEN..(i + 1) * SGE_LEN]);
                    *e = RsSge::from_bytes(&one, swap);
                }
                stream.refresh_target(entries);
            }
            Arrival::Iomap(index) if index < self.iomap_entries => {
                let mut b = [0u8; IOMAP_LEN];
                self.tmr.read(Stream::iomap_entry_offset(index), &mut b)?;
                let entry = RsIomap::from_bytes(&b, stream.swap());
                stream.set_iomap(index, entry);
            }
            Arrival::Disconnect => out.disconnect = true,
            Arrival::Shutdown => out.shutdown = true,
            _ => {}
        }
        if repost && !out.disconnect {
            let r = stream.next_recv();
            self.post_recv(r.wr_id, r.slot)?;
        }
        Ok(())
    }

    /// Copies readable bytes into `buf` (`rrecv`); with `peek` nothing is consumed.
    pub fn read_into(&mut self, buf: &mut [u8], peek: bool) -> Result<usize> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(0);
        };
        let ranges = stream.take_data(buf.len(), peek);
        let mut done = 0usize;
        for (off, len) in ranges {
            let len = len as usize;
            self.rmr.read(off as usize, &mut buf[done..done + len])?;
            done += len;
        }
        Ok(done)
    }

    /// Arms the CQ for the next completion (once until it fires).
    pub fn arm(&mut self) -> Result<()> {
        if !self.armed {
            self.cq.req_notify(false)?;
            self.armed = true;
        }
        Ok(())
    }

    /// True while the CQ is armed and its event not yet taken.
    pub fn is_armed(&self) -> bool {
        self.armed
    }

    /// Consumes a fired completion event, if any.
    pub fn drain_event(&mut self) {
        if let Ok(cq) = self.channel.get_cq_event(Some(std::time::Duration::ZERO)) {
            cq.ack_events(1);
            self.armed = false;
        }
    }

    /// The completion channel's fd.
    pub fn event_fd(&self) -> std::os::fd::RawFd {
        self.channel.fd()
    }

    /// True on iWARP (messages are SENDs).
    pub fn is_iwarp(&self) -> bool {
        self.cfg.msg_send
    }

    /// The protection domain (application memory for `riomap` is registered in it).
    pub fn pd(&self) -> &Pd {
        &self.pd
    }
}
