//! Seed generator: streams made by the softrdma library itself.
//!
//! ```sh
//! nice -n 19 cargo run --manifest-path fuzz/Cargo.toml --example gen_seeds [OUTDIR]
//! ```
//! (default OUTDIR: fuzz/seeds/generated). Writes `<OUTDIR>/<target>/<name>` files:
//!
//! - `iwarp_rx_stream`: what a real initiator [`Engine`] transmits for a set of work requests
//!   aimed at the harness's symbolic STags and fixed iovas (see `softrdma_fuzz::rx`), plus
//!   hand-built Read Responses for the READ the harness posts. Every stream is replayed
//!   through the harness here and the expected outcome is asserted, so the seeds really
//!   reach the placement paths (and not just the first error).
//! - `mpa_handshake`: requests, accepts and rejects from `handshake::build_*`.
//! - `wire_decoders`: every FPDU, ULPDU and Read Request / Terminate payload of the above,
//!   including the Terminates the engine sends for each error case.

use softrdma_fuzz::rx::{self, World};
use softrdma_iwarp::engine::{Engine, EngineConfig};
use softrdma_iwarp::handshake::{build_accept, build_reject, build_request, parse_request, MpaParams};
use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::*;
use softrdma_wire::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug)]
struct NoDriver;
impl QpDriver for NoDriver {
    fn kick(&self) {}
}

/// An initiator-side QP + engine with one local 128 KiB buffer.
struct Initiator {
    crc: bool,
    engine: Engine,
    qp: Qp,
    local: Mr,
    /// The memory behind `local` (dropped after it).
    _buf: Box<[u8]>,
    _pd: Pd,
}

fn initiator(crc: bool) -> Initiator {
    let ctx = Context::open(rx::device()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 4,
        max_send_sge: 4,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq,
        srq: None,
        cap,
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    let qp = Qp::new(&pd, init, AttrRules::Iwarp).unwrap();
    let attr = QpAttr {
        qp_state: Some(QpState::Init),
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..QpAttr::default()
    };
    qp.modify(&attr, attr_mask::STATE | attr_mask::ACCESS_FLAGS).unwrap();
    qp.inner().connect_established(Arc::new(NoDriver), 4, 4).unwrap();
    // A fixed iova keeps the READ sink TO (and so the seeds) reproducible.
    let mut buf: Box<[u8]> = (0..128 * 1024).map(|i| (i * 7 + 3) as u8).collect();
    // SAFETY: `buf` lives in the Initiator, which drops it after the MR and the engine.
    let local = unsafe { pd.reg_mr_raw(buf.as_mut_ptr(), buf.len(), INITIATOR_IOVA, Access::LOCAL_WRITE) }.unwrap();
    let engine = Engine::new(
        qp.inner().clone(),
        EngineConfig {
            crc,
            ird: 4,
            ord: 4,
            initiator: true,
            rtr: Some(softrdma_iwarp::engine::Rtr::Read),
        },
    );
    Initiator {
        crc,
        engine,
        qp,
        local,
        _buf: buf,
        _pd: pd,
    }
}

impl Initiator {
    /// Posts `wrs` and returns everything the engine transmits (RTR first).
    fn stream(&mut self, wrs: Vec<SendWr>) -> Vec<u8> {
        if !wrs.is_empty() {
            self.qp.post_send(&wrs).unwrap();
        }
        let mut out = Vec::new();
        for _ in 0..16 {
            self.engine.fill_tx();
            let mut p = Vec::new();
            {
                let mut parts = Vec::new();
                self.engine.tx_gather(&mut parts);
                for part in parts {
                    assert!(part.append_to(&mut p), "a live MR reads");
                }
            }
            if p.is_empty() {
                break;
            }
            let n = p.len();
            out.extend_from_slice(&p);
            self.engine.tx_consumed(n);
        }
        // The READ sink STag is our random lkey: make the seed reproducible.
        normalise(&mut out, &[(self.local.lkey(), INITIATOR_LKEY)], self.crc);
        out
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        self.local.sge(off, len)
    }
}

/// Stands for the initiator's (random) lkey in generated seeds.
const INITIATOR_LKEY: u32 = 0x5eed_0001;
/// The iova of the initiator's local buffer.
const INITIATOR_IOVA: u64 = 0x7f00_0000_0000;

/// Replaces every big-endian occurrence of each `from` key by `to` (keys are random 32-bit
/// values, so a false match is practically impossible), then rewrites the FPDU CRCs.
fn normalise(stream: &mut [u8], map: &[(u32, u32)], crc: bool) {
    for i in 0..stream.len().saturating_sub(3) {
        let v = u32::from_be_bytes(stream[i..i + 4].try_into().unwrap());
        if let Some(&(_, to)) = map.iter().find(|(from, _)| *from == v) {
            stream[i..i + 4].copy_from_slice(&to.to_be_bytes());
        }
    }
    if !crc {
        return;
    }
    let mut pos = 0;
    while stream.len() - pos >= 2 {
        let wl = fpdu_wire_len(usize::from(u16::from_be_bytes([stream[pos], stream[pos + 1]])));
        if stream.len() - pos < wl {
            break;
        }
        let c = crc32c(&stream[pos..pos + wl - 4]);
        stream[pos + wl - 4..pos + wl].copy_from_slice(&c.to_le_bytes());
        pos += wl;
    }
}

/// What the harness engine sent, with its random MR keys turned back into symbolic STags.
fn responder_log(w: &World) -> Vec<u8> {
    let map: Vec<(u32, u32)> = (1..=rx::SLOTS).map(|s| (w.key(s), s)).collect();
    let mut log = w.tx_log.clone();
    normalise(&mut log, &map, true);
    log
}

fn remote(slot: u32, off: u64) -> (u64, u32) {
    (rx::iova(slot) + off, slot)
}

fn write_wr(i: &Initiator, id: u64, src_off: usize, len: u32, slot: u32, off: u64) -> SendWr {
    let (addr, key) = remote(slot, off);
    SendWr::write(id, vec![i.sge(src_off, len)], addr, key)
}

struct Out {
    dir: PathBuf,
    n: usize,
}

impl Out {
    fn put(&mut self, target: &str, name: &str, data: &[u8]) {
        let d = self.dir.join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), data).unwrap();
        self.n += 1;
    }

    /// Every FPDU of `stream`, its ULPDU and its Read Request / Terminate payload.
    fn decoders(&mut self, name: &str, stream: &[u8], crc: bool) {
        let mut buf = stream;
        let mut i = 0;
        while let Ok(Some(f)) = parse_fpdu(buf, crc) {
            self.put("wire_decoders", &format!("{name}.fpdu{i}"), &buf[..f.wire_len]);
            self.put("wire_decoders", &format!("{name}.ulpdu{i}"), f.ulpdu);
            if let Ok((h, n)) = SegmentHeader::parse(f.ulpdu) {
                if matches!(h.opcode, Opcode::ReadRequest | Opcode::Terminate) {
                    self.put("wire_decoders", &format!("{name}.payload{i}"), &f.ulpdu[n..]);
                }
            }
            buf = &buf[f.wire_len..];
            i += 1;
        }
    }
}

/// Replays a seed through the harness (exactly as the fuzz target does) and returns the world.
fn replay(flags: u8, chunk: u8, stream: &[u8]) -> World {
    let mut w = World::new(rx::Config { flags, chunk });
    w.run(stream);
    w.check();
    w
}

/// Emits one hand-built FPDU.
fn fpdu(hdr: SegmentHeader, payload: &[u8], crc: bool, out: &mut Vec<u8>) {
    let mut h = Vec::new();
    hdr.emit(&mut h);
    emit_fpdu(&[&h, payload], crc, out).unwrap();
}

fn rx_seeds(out: &mut Out) {
    let crc_flags = rx::FLAG_CRC;

    // 1. The happy path: SENDs into the posted receives, WRITEs into the writable MRs, a READ
    //    of the read-only MR, all from a real initiator engine.
    for crc in [true, false] {
        let mut i = initiator(crc);
        let mut se = SendWr::send(3, vec![i.sge(1000, 32), i.sge(5000, 900)]);
        se.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
        let (ro, ro_key) = remote(rx::SLOT_RO, 8);
        let wrs = vec![
            SendWr::send(1, vec![i.sge(0, 40)]),
            write_wr(&i, 2, 100, 100, rx::SLOT_RW, 16),
            write_wr(&i, 4, 300, 56, rx::SLOT_WO, 200),
            se,
            SendWr::read(5, vec![i.sge(64 * 1024, 64)], ro, ro_key),
            SendWr::send(6, vec![i.sge(7, 2000)]),
        ];
        let s = i.stream(wrs);
        let flags = if crc { crc_flags } else { 0 };
        let w = replay(flags, 0, &s);
        assert_eq!(
            w.engine.stats.terminates_sent, 0,
            "happy path terminated: {:?}",
            w.engine.close_reason
        );
        assert!(
            w.engine.stats.rx_placed >= 40 + 100 + 56 + 932 + 2000,
            "{:?}",
            w.engine.stats
        );
        let tag = if crc { "crc" } else { "nocrc" };
        let mut seed = vec![flags, 0];
        seed.extend_from_slice(&s);
        out.put("iwarp_rx_stream", &format!("gen_happy.{tag}"), &seed);
        seed[1] = 3;
        out.put("iwarp_rx_stream", &format!("gen_happy.{tag}.chunk3"), &seed);
        if crc {
            out.decoders("gen_happy", &s, true);
            out.decoders("gen_happy_responder", &responder_log(&w), true);
            seed[0] = rx::FLAG_CRC | rx::FLAG_IRD1 | rx::FLAG_BAD_RECV;
            out.put("iwarp_rx_stream", "gen_happy.ird1_badrecv", &seed);
            seed[0] = rx::FLAG_CRC | rx::FLAG_QP_NO_REMOTE;
            out.put("iwarp_rx_stream", "gen_happy.qp_no_remote", &seed);
        }
    }

    // 2. One remote-access error per seed: the engine must terminate and place nothing.
    let errors: &[(&str, u32, u64, u32)] = &[
        ("write_ro", rx::SLOT_RO, 0, 16),
        ("write_canary", rx::SLOT_CANARY, 0, 16),
        ("write_dereg", rx::SLOT_DEREG, 0, 16),
        ("write_foreign", rx::SLOT_FOREIGN, 0, 16),
        ("write_recv_buf", rx::SLOT_RECV, 0, 16),
        ("write_bounds", rx::SLOT_WO, 250, 16),
        ("write_below_iova", rx::SLOT_RW, u64::MAX - 7, 16),
        ("write_bad_key", 0x00de_ad00, 0, 16),
    ];
    for &(name, slot, off, len) in errors {
        let mut i = initiator(true);
        let (addr, key) = if slot <= rx::SLOTS {
            (rx::iova(slot).wrapping_add(off), slot)
        } else {
            (0x1000, slot)
        };
        let s = i.stream(vec![
            SendWr::send(1, vec![i.sge(0, 8)]),
            SendWr::write(2, vec![i.sge(0, len)], addr, key),
        ]);
        let w = replay(crc_flags, 0, &s);
        assert_eq!(w.engine.stats.terminates_sent, 1, "{name}: {:?}", w.engine.close_reason);
        let mut seed = vec![crc_flags, 0];
        seed.extend_from_slice(&s);
        out.put("iwarp_rx_stream", &format!("gen_err_{name}"), &seed);
        out.decoders(&format!("gen_err_{name}_terminate"), &responder_log(&w), true);
    }
    // READ errors, and SEND errors (too long, no buffer).
    let reads: &[(&str, u32, u64, u32)] = &[
        ("read_wo", rx::SLOT_WO, 0, 16),
        ("read_canary", rx::SLOT_CANARY, 0, 16),
        ("read_bounds", rx::SLOT_RO, 4000, 200),
        ("read_foreign", rx::SLOT_FOREIGN, 0, 8),
    ];
    for &(name, slot, off, len) in reads {
        let mut i = initiator(true);
        let (addr, key) = remote(slot, off);
        let s = i.stream(vec![SendWr::read(2, vec![i.sge(0, len)], addr, key)]);
        let w = replay(crc_flags, 0, &s);
        assert_eq!(w.engine.stats.terminates_sent, 1, "{name}: {:?}", w.engine.close_reason);
        let mut seed = vec![crc_flags, 0];
        seed.extend_from_slice(&s);
        out.put("iwarp_rx_stream", &format!("gen_err_{name}"), &seed);
        out.decoders(&format!("gen_err_{name}_terminate"), &responder_log(&w), true);
    }
    {
        let mut i = initiator(true);
        let s = i.stream(vec![SendWr::send(1, vec![i.sge(0, 65)])]);
        let w = replay(crc_flags, 0, &s);
        assert_eq!(w.engine.stats.terminates_sent, 1);
        let mut seed = vec![crc_flags, 0];
        seed.extend_from_slice(&s);
        out.put("iwarp_rx_stream", "gen_err_send_too_long", &seed);
        out.decoders("gen_err_send_too_long_terminate", &responder_log(&w), true);
    }
    {
        let mut i = initiator(true);
        let wrs = (1..=6).map(|id| SendWr::send(id, vec![i.sge(0, 4)])).collect();
        let s = i.stream(wrs);
        let w = replay(crc_flags, 0, &s);
        assert_eq!(w.engine.stats.terminates_sent, 1, "5th SEND has no receive");
        let mut seed = vec![crc_flags, 0];
        seed.extend_from_slice(&s);
        out.put("iwarp_rx_stream", "gen_err_no_recv", &seed);
    }

    // 3. SEND with Invalidate of the RW MR, then a WRITE to it (refused after invalidation).
    {
        let mut i = initiator(true);
        let mut inv = SendWr::send(1, vec![i.sge(0, 8)]);
        inv.opcode = Some(WrOpcode::SendWithInv);
        inv.invalidate_rkey = rx::SLOT_RW;
        let mut bad_inv = SendWr::send(3, vec![i.sge(0, 8)]);
        bad_inv.opcode = Some(WrOpcode::SendWithInv);
        bad_inv.invalidate_rkey = rx::SLOT_FOREIGN;
        let s = i.stream(vec![inv, write_wr(&i, 2, 0, 8, rx::SLOT_RW, 0)]);
        let w = replay(crc_flags, 0, &s);
        assert_eq!(w.engine.stats.terminates_sent, 1);
        assert_eq!(
            &w.slot_bytes(rx::SLOT_RW)[..8],
            &rx_image(rx::SLOT_RW)[..8],
            "write after invalidate placed"
        );
        let mut seed = vec![crc_flags, 0];
        seed.extend_from_slice(&s);
        out.put("iwarp_rx_stream", "gen_invalidate_then_write", &seed);
        let mut i = initiator(true);
        let s = i.stream(vec![bad_inv]);
        let mut seed = vec![crc_flags, 0];
        seed.extend_from_slice(&s);
        out.put("iwarp_rx_stream", "gen_invalidate_foreign", &seed);
    }

    // 4. A whole-MR WRITE, then a 64 KiB WRITE (two segments: the largest segment payload
    //    is 65472 bytes) that is out of bounds.
    {
        let mut i = initiator(true);
        let s = i.stream(vec![
            write_wr(&i, 1, 0, 4096, rx::SLOT_RW, 0),
            write_wr(&i, 2, 0, 65536, rx::SLOT_RW, 0),
        ]);
        let w = replay(crc_flags, 0, &s);
        assert_eq!(w.engine.stats.terminates_sent, 1);
        let mut seed = vec![crc_flags, 0];
        seed.extend_from_slice(&s);
        out.put("iwarp_rx_stream", "gen_big_writes", &seed);
    }

    // 5. Read Responses for the READ the harness posts with FLAG_SEND_WORK (936 bytes into the
    //    sink SGEs), hand-built, after a zero-length RTR READ that enables the responder's TX.
    //    Chunk 1 feeds the stream in 1..=4-byte reads, so the responder has sent its READ
    //    (and has an ORQ entry) by the time the responses arrive.
    for crc in [true, false] {
        let mut s = Vec::new();
        let rtr = SegmentHeader {
            last: true,
            opcode: Opcode::ReadRequest,
            ddp: DdpHeader::Untagged {
                inval_stag: 0,
                qn: QN_READ_REQUEST,
                msn: 1,
                mo: 0,
            },
        };
        let mut rr = Vec::new();
        ReadRequest {
            sink_stag: 0,
            sink_to: 0,
            size: 0,
            src_stag: 0,
            src_to: 0,
        }
        .emit(&mut rr);
        fpdu(rtr, &rr, crc, &mut s);
        let total: usize = rx::READ_SINK.iter().map(|&(_, l)| l as usize).sum();
        let data: Vec<u8> = (0..total).map(|i| (i as u8) ^ 0xa5).collect();
        let sink = rx::iova(rx::SLOT_SINK);
        for (at, last) in [(0usize, false), (500, true)] {
            let end = if last { total } else { 500 };
            let h = SegmentHeader {
                last,
                opcode: Opcode::ReadResponse,
                ddp: DdpHeader::Tagged {
                    stag: 0x1234,
                    to: sink + at as u64,
                },
            };
            fpdu(h, &data[at..end], crc, &mut s);
        }
        let flags = rx::FLAG_SEND_WORK | if crc { rx::FLAG_CRC } else { 0 };
        let w = replay(flags, 1, &s);
        assert_eq!(w.engine.stats.terminates_sent, 0, "{:?}", w.engine.close_reason);
        assert_eq!(&w.slot_bytes(rx::SLOT_SINK)[..512], &data[..512]);
        assert_eq!(&w.slot_bytes(rx::SLOT_SINK)[600..1024], &data[512..]);
        let tag = if crc { "crc" } else { "nocrc" };
        let mut seed = vec![flags, 1];
        seed.extend_from_slice(&s);
        out.put("iwarp_rx_stream", &format!("gen_read_response.{tag}"), &seed);
        if crc {
            out.decoders("gen_read_response", &s, true);
            out.decoders("gen_responder_work", &responder_log(&w), true);
        }
    }

    // 6. A Terminate from the peer (what our own engine sends for a bad WRITE).
    {
        let mut i = initiator(true);
        let s = i.stream(vec![write_wr(&i, 1, 0, 8, rx::SLOT_RO, 0)]);
        let w = replay(crc_flags, 0, &s);
        let mut seed = vec![crc_flags, 0];
        seed.extend_from_slice(&responder_log(&w));
        out.put("iwarp_rx_stream", "gen_peer_terminate", &seed);
    }
}

fn rx_image(slot: u32) -> Vec<u8> {
    (0..rx::slot_len(slot)).map(|i| rx::initial_byte(slot, i)).collect()
}

fn mpa_seeds(out: &mut Out) {
    let p = |pd: &[u8], ird, ord, crc| MpaParams {
        private_data: pd.to_vec(),
        ird,
        ord,
        crc,
        p2p: false,
    };
    let reqs = [
        ("v2_crc", p(b"hello", 4, 8, true)),
        ("v2_nocrc_empty", p(b"", 1, 1, false)),
        ("v2_max_pd", p(&[0x42; 508], 0x3fff, 0x3fff, true)),
        ("v1_pd509", p(&[0x43; 509], 16, 16, false)),
        ("v1_pd512", p(&[0x44; 512], 2, 2, true)),
    ];
    for (name, ours) in &reqs {
        let req = build_request(ours).unwrap();
        out.put("mpa_handshake", &format!("gen_req_{name}"), &req);
        out.put("wire_decoders", &format!("gen_mpa_req_{name}"), &req);
        let (frame, _) = parse_request(&req).unwrap().unwrap();
        let (rep, _) = build_accept(&frame, &p(b"world", 2, 3, false)).unwrap();
        out.put("mpa_handshake", &format!("gen_rep_{name}"), &rep);
        let rej = build_reject(frame.revision, b"go away").unwrap();
        out.put("mpa_handshake", &format!("gen_rej_{name}"), &rej);
    }
    // A request asking for markers, and one with RFC 6581 zero-length-write RTR only.
    let marker = MpaFrame {
        kind: MpaKind::Request,
        markers: true,
        crc: true,
        reject: false,
        revision: 1,
        enhanced: None,
        private_data: b"markers please".to_vec(),
    };
    let write_rtr = MpaFrame {
        kind: MpaKind::Request,
        markers: false,
        crc: false,
        reject: false,
        revision: 2,
        enhanced: Some(IrdOrd {
            ird: 8,
            ord: 8,
            peer_to_peer: true,
            zero_length_rtr: false,
            write_rtr: true,
            read_rtr: false,
        }),
        private_data: Vec::new(),
    };
    for (name, f) in [("markers", marker), ("write_rtr", write_rtr)] {
        let mut b = Vec::new();
        f.emit(&mut b).unwrap();
        out.put("mpa_handshake", &format!("gen_req_{name}"), &b);
    }
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").join("generated"));
    let mut out = Out { dir, n: 0 };
    rx_seeds(&mut out);
    mpa_seeds(&mut out);
    println!("wrote {} seed files under {}", out.n, out.dir.display());
}
