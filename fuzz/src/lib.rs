//! Shared code for the softrdma fuzz targets and the seed generator.
//!
//! The interesting part is [`rx`]: a responder-side [`Engine`] wired to a fixed set of
//! registered memory regions, fed a hostile TCP byte stream, with the invariants the
//! `iwarp_rx_stream` target asserts. [`roce`] is the same for a soft-RoCE RC and UD engine
//! (`roce_rx`), and [`ibcm`] drives the IB CM's connection machines with hostile MADs (`cm_mad`).

pub mod ibcm;
pub mod roce;

pub mod rx {
    //! The `iwarp_rx_stream` world.
    //!
    //! # Input format
    //!
    //! ```text
    //! byte 0   flags: FLAG_CRC | FLAG_AUTO_CRC | FLAG_QP_NO_REMOTE | FLAG_SEND_WORK | FLAG_BAD_RECV | FLAG_IRD1
    //! byte 1   chunking: 0 = as much as rx_space() takes at once; n > 0 = chunks of
    //!          1..=4n bytes drawn from an xorshift PRNG seeded with n
    //! byte 2.. the TCP byte stream the peer sends after MPA setup (FPDUs)
    //! ```
    //!
    //! # Symbolic STags and fixed addresses
    //!
    //! MR keys are random (24 bits from the OS CSPRNG), so a fuzzer could never name one. The
    //! harness therefore walks the stream with the same FPDU framing the engine uses and
    //! replaces a *symbolic* STag (a value `1..=SLOTS`) by the real key of that slot, in
    //! the DDP STag / RsvdULP word (bytes 2..6 of every ULPDU) and in the source STag of an
    //! RDMA Read Request. Every other value stays as it is (and is, with overwhelming
    //! probability, an invalid key). MRs are registered with fixed iovas ([`iova`]), so
    //! Tagged Offsets need no rewriting.
    //!
    //! After rewriting an FPDU whose CRC was valid, the CRC is recomputed so it stays valid;
    //! a bad CRC stays bad. With `FLAG_AUTO_CRC` (and `FLAG_CRC`) the harness recomputes
    //! the CRC of every complete FPDU, so the fuzzer can reach the DDP/RDMAP code with CRC
    //! checking on; without it, CRC errors are exercised.
    //!
    //! # Invariants (checked by [`World::check`])
    //!
    //! - no panic (the fuzzer catches those);
    //! - the canary MR (no remote access) stays all zero;
    //! - every byte of every MR that no *valid* placement could reach keeps its initial
    //!   pattern. The reference model: an RDMA Write with symbolic STag `s`, TO `t` and `L`
    //!   payload bytes may touch `[t - iova(s), +L)` of slot `s` only if the slot allows
    //!   REMOTE_WRITE, is registered, is in the QP's PD and the QP allows REMOTE_WRITE; a
    //!   Send may touch only the posted receive SGEs; a Read Response only the SGEs of the
    //!   READ the harness posted. The read-only, deregistered and foreign-PD MRs never change;
    //! - everything the engine transmits is a sequence of whole FPDUs that [`parse_fpdu`]
    //!   (with the negotiated CRC) and [`SegmentHeader::parse`] accept; Read Request and
    //!   Terminate payloads parse too; nothing follows a Terminate and there is at most one;
    //! - no disclosure: every Read Response answers a Read Request of the input (same sink
    //!   STag, TO and size, in order) and carries data only from an MR the peer may read
    //!   (REMOTE_READ, registered, same PD, QP with REMOTE_READ); read-only data byte for byte;
    //! - after the stream ends (`peer_closed`), every posted work request has exactly one
    //!   completion, and no successful receive reports more bytes than its buffers hold.

    use softrdma_iwarp::engine::{Engine, EngineConfig};
    use softrdma_verbs::memory::socket_io::{Gather, Scatter};
    use softrdma_verbs::qp_state::{attr_mask, AttrRules};
    use softrdma_verbs::*;
    use softrdma_wire::{crc32c, fpdu_wire_len, parse_fpdu, DdpHeader, Opcode, ReadRequest, SegmentHeader, Terminate};
    use std::sync::{Arc, OnceLock};

    /// FPDUs carry (and the engine checks) CRC32c.
    pub const FLAG_CRC: u8 = 0x01;
    /// With [`FLAG_CRC`]: the harness rewrites the CRC of every complete FPDU.
    pub const FLAG_AUTO_CRC: u8 = 0x02;
    /// The QP allows neither REMOTE_WRITE nor REMOTE_READ.
    pub const FLAG_QP_NO_REMOTE: u8 = 0x04;
    /// Post a READ, a SEND and a WRITE on the responder's send queue before the stream starts.
    pub const FLAG_SEND_WORK: u8 = 0x08;
    /// The first posted receive has a deregistered lkey.
    pub const FLAG_BAD_RECV: u8 = 0x10;
    /// IRD 1 instead of 4.
    pub const FLAG_IRD1: u8 = 0x20;

    /// REMOTE_WRITE | REMOTE_READ, 4096 bytes.
    pub const SLOT_RW: u32 = 1;
    /// REMOTE_READ only, 4096 bytes (also the local source of the posted SEND/WRITE).
    pub const SLOT_RO: u32 = 2;
    /// REMOTE_WRITE only, 256 bytes.
    pub const SLOT_WO: u32 = 3;
    /// Canary: LOCAL_WRITE only, never a receive buffer; must stay all zero.
    pub const SLOT_CANARY: u32 = 4;
    /// Registered with REMOTE_WRITE | REMOTE_READ, then deregistered (stale key).
    pub const SLOT_DEREG: u32 = 5;
    /// REMOTE_WRITE | REMOTE_READ, but in another PD.
    pub const SLOT_FOREIGN: u32 = 6;
    /// Receive buffers (LOCAL_WRITE only).
    pub const SLOT_RECV: u32 = 7;
    /// Sink of the posted READ (LOCAL_WRITE only).
    pub const SLOT_SINK: u32 = 8;
    /// Number of slots; symbolic STags are `1..=SLOTS`.
    pub const SLOTS: u32 = 8;

    /// Byte length of each slot's MR.
    pub fn slot_len(slot: u32) -> usize {
        match slot {
            SLOT_WO => 256,
            SLOT_SINK => 1024,
            _ => 4096,
        }
    }

    /// The fixed iova (the address peers use) of byte 0 of a slot.
    pub fn iova(slot: u32) -> u64 {
        u64::from(slot) << 16
    }

    fn access(slot: u32) -> Access {
        match slot {
            SLOT_RW | SLOT_DEREG | SLOT_FOREIGN => Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            SLOT_RO => Access::REMOTE_READ,
            SLOT_WO => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            _ => Access::LOCAL_WRITE,
        }
    }

    /// Initial content: the canary is zero, everything else a slot-specific pattern.
    pub fn initial_byte(slot: u32, i: usize) -> u8 {
        if slot == SLOT_CANARY {
            0
        } else {
            (i as u8).wrapping_mul(31).wrapping_add(slot as u8 * 17) | 1
        }
    }

    /// Receive WRs posted on every run: (wr_id, [(offset in SLOT_RECV, len)]).
    pub const RECVS: &[(u64, &[(usize, u32)])] = &[
        (1, &[(0, 64)]),
        (2, &[(128, 32), (256, 1024)]),
        (3, &[(2048, 2048)]),
        (4, &[(1536, 64)]),
    ];
    /// Sink SGEs of the READ posted with [`FLAG_SEND_WORK`] (offsets in SLOT_SINK); bytes 512..600 stay untouched.
    pub const READ_SINK: &[(usize, u32)] = &[(0, 512), (600, 424)];

    #[derive(Debug)]
    struct NoDriver;
    impl QpDriver for NoDriver {
        fn kick(&self) {}
    }

    /// Initial content of every slot, computed once (index 0 unused).
    fn images() -> &'static [Box<[u8]>] {
        static IMAGES: OnceLock<Vec<Box<[u8]>>> = OnceLock::new();
        IMAGES.get_or_init(|| {
            (0..=SLOTS)
                .map(|slot| {
                    let len = if slot == 0 { 0 } else { slot_len(slot) };
                    (0..len).map(|i| initial_byte(slot, i)).collect()
                })
                .collect()
        })
    }

    /// A loopback soft-iWARP device description (no interface discovery).
    pub fn device() -> &'static device::DeviceInfo {
        static DEV: OnceLock<device::DeviceInfo> = OnceLock::new();
        DEV.get_or_init(|| {
            let lo = device::NetIf::synthetic_loopback();
            device::devices_from(&[lo], None).unwrap().remove(0)
        })
    }

    /// Parsed input header.
    #[derive(Debug, Clone, Copy)]
    pub struct Config {
        /// Flags byte.
        pub flags: u8,
        /// Chunking byte.
        pub chunk: u8,
    }

    impl Config {
        fn has(&self, f: u8) -> bool {
            self.flags & f != 0
        }
        /// CRC negotiated.
        pub fn crc(&self) -> bool {
            self.has(FLAG_CRC)
        }
    }

    /// One tagged segment seen in the input stream (for the placement model).
    #[derive(Debug, Clone, Copy)]
    struct Tagged {
        opcode: u8,
        /// The STag as the input gave it (symbolic or not).
        stag: u32,
        to: u64,
        len: usize,
    }

    /// One RDMA Read Request seen in the input stream (for the disclosure model).
    #[derive(Debug, Clone, Copy)]
    struct ReadReq {
        sink_stag: u32,
        sink_to: u64,
        size: u32,
        /// The source STag as the input gave it (symbolic or not).
        src: u32,
        src_to: u64,
    }

    /// The engine, its QP and the memory it may touch. Field order is drop order: the engine
    /// and the MRs go before the buffers they point into.
    pub struct World {
        /// The engine under test.
        pub engine: Engine,
        qp: Qp,
        cq: Cq,
        mrs: Vec<Option<Mr>>,
        keys: [u32; SLOTS as usize + 1],
        qp_remote: bool,
        send_work: bool,
        bufs: Vec<Box<[u8]>>,
        _pds: (Pd, Pd),
        cfg: Config,
        tagged: Vec<Tagged>,
        reads: Vec<ReadReq>,
        /// Everything the engine transmitted.
        pub tx_log: Vec<u8>,
        /// Every completion polled from the CQ.
        pub wcs: Vec<WorkCompletion>,
    }

    impl World {
        /// Builds the world for a config.
        pub fn new(cfg: Config) -> World {
            let ctx = Context::open(device()).unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let other_pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(1024, None).unwrap();
            let cap = QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            };
            let init = QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                srq: None,
                cap,
                qp_type: QpType::Rc,
                sq_sig_all: true,
            };
            let qp = Qp::new(&pd, init, AttrRules::Iwarp).unwrap();
            let qp_remote = !cfg.has(FLAG_QP_NO_REMOTE);
            let qp_access = if qp_remote {
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
            } else {
                Access::LOCAL_WRITE
            };
            let attr = QpAttr {
                qp_state: Some(QpState::Init),
                qp_access_flags: qp_access,
                ..QpAttr::default()
            };
            qp.modify(&attr, attr_mask::STATE | attr_mask::ACCESS_FLAGS).unwrap();
            let ird = if cfg.has(FLAG_IRD1) { 1 } else { 4 };
            qp.inner()
                .connect_established(Arc::new(NoDriver), 4, ird as u8)
                .unwrap();

            let mut bufs: Vec<Box<[u8]>> = Vec::new();
            let mut mrs: Vec<Option<Mr>> = vec![None];
            let mut keys = [0u32; SLOTS as usize + 1];
            bufs.push(Box::new([]));
            for slot in 1..=SLOTS {
                let len = slot_len(slot);
                let mut b: Box<[u8]> = images()[slot as usize].clone();
                let on = if slot == SLOT_FOREIGN { &other_pd } else { &pd };
                // SAFETY: the buffer lives in `bufs`, which World drops after every MR and the engine.
                let mr = unsafe { on.reg_mr_raw(b.as_mut_ptr(), len, iova(slot), access(slot)) }.unwrap();
                keys[slot as usize] = mr.rkey();
                bufs.push(b);
                if slot == SLOT_DEREG {
                    mr.dereg().unwrap();
                    mrs.push(None);
                } else {
                    mrs.push(Some(mr));
                }
            }
            let recv_mr = mrs[SLOT_RECV as usize].as_ref().unwrap();
            let mut wrs = Vec::new();
            if cfg.has(FLAG_BAD_RECV) {
                wrs.push(RecvWr {
                    wr_id: 99,
                    sg_list: vec![Sge {
                        addr: iova(SLOT_DEREG),
                        length: 64,
                        lkey: keys[SLOT_DEREG as usize],
                    }],
                });
            }
            for (id, sges) in RECVS {
                wrs.push(RecvWr {
                    wr_id: *id,
                    sg_list: sges.iter().map(|&(off, len)| recv_mr.sge(off, len)).collect(),
                });
            }
            qp.post_recv(&wrs).unwrap();
            let send_work = cfg.has(FLAG_SEND_WORK);
            if send_work {
                let sink = mrs[SLOT_SINK as usize].as_ref().unwrap();
                let src = mrs[SLOT_RO as usize].as_ref().unwrap();
                let read = SendWr::read(
                    100,
                    READ_SINK.iter().map(|&(off, len)| sink.sge(off, len)).collect(),
                    0x7000,
                    0x0012_3400,
                );
                let send = SendWr::send(101, vec![src.sge(0, 40)]);
                let write = SendWr::write(102, vec![src.sge(100, 64)], 0x5000, 0x00ab_cd00);
                qp.post_send(&[read, send, write]).unwrap();
            }
            let engine = Engine::new(
                qp.inner().clone(),
                EngineConfig {
                    crc: cfg.crc(),
                    ird,
                    ord: 4,
                    initiator: false,
                    rtr: Some(softrdma_iwarp::engine::Rtr::Read),
                },
            );
            World {
                engine,
                qp,
                cq,
                mrs,
                keys,
                qp_remote,
                send_work,
                bufs,
                _pds: (pd, other_pd),
                cfg,
                tagged: Vec::new(),
                reads: Vec::new(),
                tx_log: Vec::new(),
                wcs: Vec::new(),
            }
        }

        /// The real (random) key registered for a slot.
        pub fn key(&self, slot: u32) -> u32 {
            self.keys[slot as usize]
        }

        /// Current content of a slot's buffer.
        pub fn slot_bytes(&self, slot: u32) -> &[u8] {
            &self.bufs[slot as usize]
        }

        fn real_key(&self, v: u32) -> Option<u32> {
            (1..=SLOTS).contains(&v).then(|| self.keys[v as usize])
        }

        /// Rewrites symbolic STags (and CRCs, see the module docs) in place and records the
        /// tagged segments for the placement model.
        pub fn fixup(&mut self, stream: &mut [u8]) {
            let crc = self.cfg.crc();
            let auto = crc && self.cfg.has(FLAG_AUTO_CRC);
            let mut pos = 0;
            while stream.len() - pos >= 2 {
                let ulen = usize::from(u16::from_be_bytes([stream[pos], stream[pos + 1]]));
                let wl = fpdu_wire_len(ulen);
                if stream.len() - pos < wl {
                    break;
                }
                let frame = &mut stream[pos..pos + wl];
                let crc_at = wl - 4;
                let carried = u32::from_le_bytes(frame[crc_at..].try_into().unwrap());
                let was_ok = crc32c(&frame[..crc_at]) == carried;
                let mut modified = false;
                {
                    let u = &mut frame[2..2 + ulen];
                    if u.len() >= 6 {
                        let s = u32::from_be_bytes(u[2..6].try_into().unwrap());
                        if let Some(k) = self.real_key(s) {
                            u[2..6].copy_from_slice(&k.to_be_bytes());
                            modified = true;
                        }
                        let tagged = u[0] & 0x80 != 0;
                        let opcode = u[1] & 0x0f;
                        if tagged && u.len() >= 14 && (opcode == 0 || opcode == 2) {
                            self.tagged.push(Tagged {
                                opcode,
                                stag: s,
                                to: u64::from_be_bytes(u[6..14].try_into().unwrap()),
                                len: u.len() - 14,
                            });
                        }
                        if !tagged && opcode == 1 && u.len() >= 18 + 20 {
                            let s = u32::from_be_bytes(u[34..38].try_into().unwrap());
                            if let Some(k) = self.real_key(s) {
                                u[34..38].copy_from_slice(&k.to_be_bytes());
                                modified = true;
                            }
                            if u.len() >= 18 + 28 {
                                let be32 = |at: usize| u32::from_be_bytes(u[at..at + 4].try_into().unwrap());
                                let be64 = |at: usize| u64::from_be_bytes(u[at..at + 8].try_into().unwrap());
                                self.reads.push(ReadReq {
                                    sink_stag: be32(18),
                                    sink_to: be64(22),
                                    size: be32(30),
                                    src: s,
                                    src_to: be64(38),
                                });
                            }
                        }
                    }
                }
                if crc && (auto || (was_ok && modified)) {
                    let c = crc32c(&frame[..crc_at]);
                    frame[crc_at..].copy_from_slice(&c.to_le_bytes());
                }
                pos += wl;
            }
        }

        /// Hands `data` to the engine as the driver's receives would (`rx_scatter`: an MR range
        /// first while a payload is placed directly, then the buffer), then lets it transmit
        /// and drains what it produced.
        pub fn feed(&mut self, mut data: &[u8]) {
            while !data.is_empty() {
                let mut n = 0;
                let mut lost = false;
                {
                    let mut parts = Vec::new();
                    self.engine.rx_scatter(&mut parts);
                    for part in parts.iter_mut() {
                        let take = match part {
                            Scatter::Region { len, .. } => (*len).min(data.len() - n),
                            Scatter::Bytes(b) => b.len().min(data.len() - n),
                        };
                        match part {
                            Scatter::Region { region, offset, .. } => {
                                if !region.write(*offset, &data[n..n + take]) {
                                    lost = true;
                                    break;
                                }
                            }
                            Scatter::Bytes(b) => b[..take].copy_from_slice(&data[n..n + take]),
                        }
                        n += take;
                    }
                }
                if lost {
                    self.engine.rx_direct_lost("the fuzz harness could not write the MR");
                    break;
                }
                self.engine.rx_received(n);
                data = &data[n..];
            }
            self.pump_tx();
        }

        /// fill_tx + drain everything into `tx_log`, and drain the CQ.
        pub fn pump_tx(&mut self) {
            for _ in 0..64 {
                self.engine.fill_tx();
                // As the driver's `send_gather`: a revoked MR part sends nothing and is named;
                // an unreadable one (EFAULT) sends what precedes it, then fails as part 0.
                let mut out = Vec::new();
                let mut lost = None;
                {
                    let mut parts = Vec::new();
                    self.engine.tx_gather(&mut parts);
                    let revoked = parts
                        .iter()
                        .position(|p| matches!(p, Gather::Region { region, .. } if region.is_revoked()));
                    if let Some(i) = revoked {
                        lost = Some(i);
                    } else {
                        for part in &parts {
                            let ok = part.append_to(&mut out);
                            if !ok {
                                lost = Some(0);
                                break;
                            }
                        }
                    }
                }
                if !out.is_empty() {
                    let n = out.len();
                    self.tx_log.extend_from_slice(&out);
                    self.engine.tx_consumed(n);
                }
                if let Some(i) = lost {
                    self.engine.tx_memory_lost(i, "unreadable in the fuzz harness");
                    continue;
                }
                if out.is_empty() {
                    break;
                }
            }
            // What the engine reported, delivered as the driver does.
            self.engine.take_outputs().deliver(&**self.engine.qp());
            while let Some(wc) = self.cq.poll_one() {
                self.wcs.push(wc);
            }
        }

        /// Runs a whole input (config bytes already stripped): fixup, chunked feed, EOF.
        pub fn run(&mut self, stream: &[u8]) {
            let mut stream = stream.to_vec();
            self.fixup(&mut stream);
            let mut rest = &stream[..];
            if self.cfg.chunk == 0 {
                self.feed(rest);
            } else {
                let max = 4 * u32::from(self.cfg.chunk);
                let mut x = 0x9e37_79b9u32 ^ u32::from(self.cfg.chunk);
                while !rest.is_empty() {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let n = (1 + x % max) as usize;
                    let n = n.min(rest.len());
                    self.feed(&rest[..n]);
                    rest = &rest[n..];
                }
            }
            self.pump_tx();
            self.engine.peer_closed("fuzz input ended");
            self.pump_tx();
        }

        /// Asserts every invariant (see the module docs).
        pub fn check(&self) {
            self.check_tx();
            self.check_memory();
            self.check_completions();
        }

        /// After the stream ended every posted work request has exactly one completion, and a
        /// successful receive never reports more bytes than its buffers hold.
        fn check_completions(&self) {
            let mut recvs: Vec<(u64, u32)> = RECVS
                .iter()
                .map(|(id, sges)| (*id, sges.iter().map(|s| s.1).sum()))
                .collect();
            if self.cfg.has(FLAG_BAD_RECV) {
                recvs.push((99, 64));
            }
            let sends: &[u64] = if self.send_work { &[100, 101, 102] } else { &[] };
            for &(id, cap) in &recvs {
                let got: Vec<_> = self
                    .wcs
                    .iter()
                    .filter(|w| w.wr_id == id && w.opcode == WcOpcode::Recv)
                    .collect();
                assert_eq!(got.len(), 1, "receive WR {id}: {} completions: {got:?}", got.len());
                if got[0].status == WcStatus::Success {
                    assert!(
                        got[0].byte_len <= cap,
                        "receive WR {id} reports {} bytes > {cap}",
                        got[0].byte_len
                    );
                }
            }
            for &id in sends {
                let n = self
                    .wcs
                    .iter()
                    .filter(|w| w.wr_id == id && w.opcode != WcOpcode::Recv)
                    .count();
                assert_eq!(n, 1, "send WR {id}: {n} completions: {:?}", self.wcs);
            }
            assert_eq!(
                self.wcs.len(),
                recvs.len() + sends.len(),
                "completions for unknown work requests: {:?}",
                self.wcs
            );
        }

        fn check_tx(&self) {
            let crc = self.cfg.crc();
            let mut buf = &self.tx_log[..];
            let mut terminates = 0;
            let mut resp: Option<(u32, u64, Vec<u8>)> = None;
            let mut responses = Vec::new();
            while !buf.is_empty() {
                assert_eq!(terminates, 0, "engine sent an FPDU after its Terminate");
                let f = match parse_fpdu(buf, crc) {
                    Ok(Some(f)) => f,
                    Ok(None) => panic!("engine sent a partial FPDU: {} trailing bytes", buf.len()),
                    Err(e) => panic!("engine sent an FPDU the wire parser rejects: {e}"),
                };
                let (h, n) = match SegmentHeader::parse(f.ulpdu) {
                    Ok(x) => x,
                    Err(e) => panic!(
                        "engine sent a DDP segment the wire parser rejects: {e}: {:02x?}",
                        f.ulpdu
                    ),
                };
                let payload = &f.ulpdu[n..];
                match (h.opcode, h.ddp) {
                    (Opcode::ReadRequest, DdpHeader::Untagged { qn, .. }) => {
                        assert_eq!(qn, softrdma_wire::QN_READ_REQUEST);
                        if let Err(e) = ReadRequest::parse(payload) {
                            panic!("engine sent a Read Request the wire parser rejects: {e}");
                        }
                    }
                    (Opcode::Terminate, DdpHeader::Untagged { qn, .. }) => {
                        assert_eq!(qn, softrdma_wire::QN_TERMINATE);
                        match Terminate::parse(payload) {
                            Ok(t) => {
                                if let Some(d) = &t.ddp_header {
                                    // An echoed header must itself be a header the engine could have received.
                                    assert!(d.len() == 14 || d.len() == 18);
                                }
                            }
                            Err(e) => panic!("engine sent a Terminate the wire parser rejects: {e}: {payload:02x?}"),
                        }
                        terminates += 1;
                    }
                    (op, DdpHeader::Untagged { qn, .. }) => {
                        assert_eq!(Some(qn), op.queue_number(), "{op:?} on the wrong queue");
                    }
                    (Opcode::ReadResponse, DdpHeader::Tagged { stag, to }) => {
                        let m = resp.get_or_insert((stag, to, Vec::new()));
                        assert_eq!(m.0, stag, "Read Response segments with different STags");
                        assert_eq!(
                            m.1.wrapping_add(m.2.len() as u64),
                            to,
                            "Read Response segments not contiguous"
                        );
                        m.2.extend_from_slice(payload);
                        if h.last {
                            responses.extend(resp.take());
                        }
                    }
                    (_, DdpHeader::Tagged { .. }) => {}
                }
                buf = &buf[f.wire_len..];
            }
            assert!(resp.is_none(), "Read Response without its last segment");
            self.check_disclosure(&responses);
        }

        /// Every Read Response answers a Read Request of the input, in order, with its sink
        /// STag, TO and size, and only reads memory the peer may read: an MR with REMOTE_READ,
        /// registered, in the QP's PD, on a QP with REMOTE_READ. Read-only data is checked byte
        /// for byte (the read/write MR may have been written since, so only its size is checked).
        fn check_disclosure(&self, responses: &[(u32, u64, Vec<u8>)]) {
            let mut reqs = self.reads.iter();
            for (stag, to, data) in responses {
                let r = reqs
                    .find(|r| r.sink_stag == *stag && r.sink_to == *to && r.size as usize == data.len())
                    .unwrap_or_else(|| {
                        panic!(
                            "Read Response (STag {stag:#x}, TO {to:#x}, {} bytes) answers no Read Request: {:?}",
                            data.len(),
                            self.reads
                        )
                    });
                if data.is_empty() {
                    continue;
                }
                let readable = self.qp_remote && matches!(r.src, SLOT_RO | SLOT_RW);
                assert!(
                    readable,
                    "engine disclosed {} bytes for a READ of STag {:#x}: {r:?}",
                    data.len(),
                    r.src
                );
                let off = r.src_to.wrapping_sub(iova(r.src)) as usize;
                let inside = off.checked_add(data.len()).is_some_and(|end| end <= slot_len(r.src));
                assert!(inside, "READ outside the MR answered: {r:?}");
                if r.src == SLOT_RO {
                    assert!(
                        data[..] == images()[SLOT_RO as usize][off..off + data.len()],
                        "Read Response data differs from the source MR: {r:?}"
                    );
                }
            }
        }

        fn check_memory(&self) {
            for slot in 1..=SLOTS {
                let len = slot_len(slot);
                let image = &images()[slot as usize];
                // Bytes a valid placement may have written are taken from the initial image;
                // then the whole buffer must equal it (one memcmp instead of a byte loop).
                let mut got = self.bufs[slot as usize].clone();
                let mut allow = |off: u64, l: usize| {
                    if let Some(end) = off.checked_add(l as u64) {
                        if end <= len as u64 {
                            let r = off as usize..end as usize;
                            got[r.clone()].copy_from_slice(&image[r]);
                        }
                    }
                };
                let writable = matches!(slot, SLOT_RW | SLOT_WO) && self.qp_remote;
                if writable {
                    for t in self.tagged.iter().filter(|t| t.opcode == 0 && t.stag == slot) {
                        if let Some(off) = t.to.checked_sub(iova(slot)) {
                            allow(off, t.len);
                        }
                    }
                }
                if slot == SLOT_RECV {
                    for (_, sges) in RECVS {
                        for &(off, l) in *sges {
                            allow(off as u64, l as usize);
                        }
                    }
                }
                if slot == SLOT_SINK && self.send_work {
                    for &(off, l) in READ_SINK {
                        allow(off as u64, l as usize);
                    }
                }
                if got[..] != image[..] {
                    let i = got.iter().zip(image.iter()).position(|(a, b)| a != b).unwrap();
                    panic!(
                        "slot {slot} (access {:?}, registered {}) byte {i} changed to {:#04x}: \
                         no valid placement could write it",
                        access(slot),
                        self.mrs[slot as usize].is_some(),
                        got[i]
                    );
                }
            }
            // Redundant with the loop above (its image is all zero), kept as the headline check.
            let canary = &self.bufs[SLOT_CANARY as usize];
            assert!(canary[..] == [0u8; 4096][..], "canary MR (no remote access) written");
            let _ = &self.qp;
        }
    }

    /// The whole fuzz target body.
    pub fn run_input(data: &[u8]) {
        if data.len() < 2 {
            return;
        }
        let cfg = Config {
            flags: data[0],
            chunk: data[1],
        };
        let mut w = World::new(cfg);
        w.run(&data[2..]);
        w.check();
    }
}
