//! Seed generator for the RoCE targets `roce_rx` and `cm_mad`.
//!
//! ```sh
//! nice -n 19 cargo run --manifest-path fuzz/Cargo.toml --example gen_roce_seeds [PCAP...]
//! ```
//! (default PCAPs: /work/shared/wirecheck/samples/{good,bad}/roce_*.pcap). Writes
//!
//! - `seeds/generated/roce_rx/`: hand-built request and response sequences in the harness's
//!   input format (`softrdma_fuzz::roce`): every opcode on its success path (WRITE, SEND and
//!   READ of one and several packets, atomics, SEND with immediate / invalidate, UD SENDs),
//!   duplicates and PSN gaps, the answers to the harness's own work (ACKs, READ responses,
//!   atomic ACK, NAKs, RNR NAK, timeouts), and each attack of `crates/roce/tests/hostile_peer.rs`
//!   (bad key, out of bounds, deregistered, other PD, read-only, READ larger than the MR, SEND
//!   larger than the receive, MIDDLE without FIRST, beyond IRD, misaligned atomic, wrong Q_Key);
//! - `seeds/generated/cm_mad/`: connection lives in the harness's format (`softrdma_fuzz::ibcm`),
//!   passive and active, with MRA, REJ, DREQ crossings, duplicates, timeouts, SIDR, truncated
//!   and garbage MADs;
//! - `seeds/captures/{roce_rx,cm_mad}/`: the RoCE datagrams of the pcaps (ICRC stripped): each
//!   one alone with its QPN made symbolic, each direction's RC requests rebased to the harness's
//!   PSN and keys, and the CM MADs of each capture replayed from both sides.
//!
//! Every seed is replayed through the harness here (with outcomes asserted for the generated
//! ones), so the seeds reach the paths they are named after.

use softrdma_fuzz::ibcm::{
    self, LOCAL_ID, OP_ACCEPT, OP_DISCONNECT, OP_MAD, OP_REFLECT, OP_REJECT, OP_RTU, OP_TIMER, PEER_ID,
};
use softrdma_fuzz::roce::{self, *};
use softrdma_verbs::{QpState, WcStatus};
use softrdma_wire::ibcm::{CmMad, CmMessage, Dreq, Mra, RejReason, SidrRep, SidrReq, CM_MSG_REQ, MAD_LEN};
use softrdma_wire::roce::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds")
}

fn write(dir: &Path, name: &str, data: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), data).unwrap();
}

// ------------------------------------------------------------------------------- roce_rx

/// One packet: BTH for `op` to `dest` at `psn`, the extension headers set by `f`, `payload`.
fn pkt(op: RoceOpcode, dest: u32, psn: u32, payload: &[u8], f: impl FnOnce(&mut RoceHeaders)) -> Vec<u8> {
    let mut bth = Bth::new(op, dest, psn);
    bth.ack_req = op.ends_message() || op == RoceOpcode::RcReadRequest;
    let mut h = RoceHeaders::new(bth);
    let want = op.headers();
    h.reth = want.reth.then_some(Reth {
        va: 0,
        rkey: 0,
        dma_len: payload.len() as u32,
    });
    h.aeth = want.aeth.then_some(Aeth::ack(0, AETH_CREDITS_INVALID));
    h.deth = want.deth.then_some(Deth {
        qkey: UD_QKEY,
        src_qp: 0x77,
    });
    h.imm = want.immdt.then_some(0x0102_0304);
    h.ieth = want.ieth.then_some(0);
    h.atomic = want.atomic_eth.then_some(AtomicEth {
        va: 0,
        rkey: 0,
        swap_add: 0,
        compare: 0,
    });
    h.atomic_ack = want.atomic_ack_eth.then_some(AtomicAckEth { orig: 0 });
    f(&mut h);
    let mut out = Vec::new();
    h.emit(payload, &mut out);
    out
}

fn reth(slot: u32, off: u64, len: u32) -> impl FnOnce(&mut RoceHeaders) {
    move |h| {
        h.reth = Some(Reth {
            va: iova(slot) + off,
            rkey: slot,
            dma_len: len,
        })
    }
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

/// A roce_rx input: flags, then records.
struct Rx {
    flags: u8,
    bytes: Vec<u8>,
    psn: u32,
}

impl Rx {
    fn new(flags: u8) -> Rx {
        Rx {
            flags,
            bytes: vec![flags],
            psn: rq_psn(flags),
        }
    }
    fn mtu(&self) -> usize {
        mtu(self.flags)
    }
    /// An RC request at the next PSN (advancing it by `psns`).
    fn req(&mut self, op: RoceOpcode, payload: &[u8], psns: u32, f: impl FnOnce(&mut RoceHeaders)) -> &mut Rx {
        let p = pkt(op, SYM_RC_QPN, self.psn, payload, f);
        self.psn = (self.psn + psns) & PSN_MASK;
        self.raw(0, &p)
    }
    fn raw(&mut self, ctl: u8, packet: &[u8]) -> &mut Rx {
        self.bytes.extend_from_slice(&record(ctl, packet));
        self
    }
    fn tick(&mut self, t: u8) -> &mut Rx {
        self.bytes.push(CTL_TICK | (t << 2));
        self
    }
    fn write(&mut self, slot: u32, off: u64, d: &[u8]) -> &mut Rx {
        let mtu = self.mtu();
        if d.len() <= mtu {
            return self.req(RoceOpcode::RcWriteOnly, d, 1, reth(slot, off, d.len() as u32));
        }
        let n = d.len().div_ceil(mtu);
        for (i, c) in d.chunks(mtu).enumerate() {
            let op = match i {
                0 => RoceOpcode::RcWriteFirst,
                _ if i + 1 == n => RoceOpcode::RcWriteLast,
                _ => RoceOpcode::RcWriteMiddle,
            };
            let len = d.len() as u32;
            self.req(op, c, 1, move |h| {
                if i == 0 {
                    h.reth = Some(Reth {
                        va: iova(slot) + off,
                        rkey: slot,
                        dma_len: len,
                    });
                }
            });
        }
        self
    }
    fn send(&mut self, d: &[u8]) -> &mut Rx {
        let mtu = self.mtu();
        if d.len() <= mtu {
            return self.req(RoceOpcode::RcSendOnly, d, 1, |_| {});
        }
        let n = d.len().div_ceil(mtu);
        for (i, c) in d.chunks(mtu).enumerate() {
            let op = match i {
                0 => RoceOpcode::RcSendFirst,
                _ if i + 1 == n => RoceOpcode::RcSendLast,
                _ => RoceOpcode::RcSendMiddle,
            };
            self.req(op, c, 1, |_| {});
        }
        self
    }
    fn read(&mut self, slot: u32, off: u64, len: u32) -> &mut Rx {
        let n = len.div_ceil(self.mtu() as u32).max(1);
        self.req(RoceOpcode::RcReadRequest, &[], n, reth(slot, off, len))
    }
    fn atomic(&mut self, op: RoceOpcode, slot: u32, off: u64) -> &mut Rx {
        self.req(op, &[], 1, move |h| {
            h.atomic = Some(AtomicEth {
                va: iova(slot) + off,
                rkey: slot,
                swap_add: 9,
                compare: 0,
            })
        })
    }
    /// A response to the harness's own work at requester PSN `sq_psn + k`.
    fn resp(&mut self, op: RoceOpcode, k: u32, payload: &[u8], f: impl FnOnce(&mut RoceHeaders)) -> &mut Rx {
        let psn = (sq_psn(self.flags) + k) & PSN_MASK;
        let p = pkt(op, SYM_RC_QPN, psn, payload, f);
        self.raw(0, &p)
    }
    fn ud(&mut self, op: RoceOpcode, dest: u32, qkey: u32, d: &[u8]) -> &mut Rx {
        let p = pkt(op, dest, 0, d, |h| {
            h.deth = Some(Deth { qkey, src_qp: 0x99 });
        });
        self.raw(CTL_UD, &p)
    }
}

/// Appends an attack's packets to a seed.
type Attack = dyn Fn(&mut Rx);

/// Replays a seed: runs the records, lets `check` look at the world, then finishes (which
/// asserts every harness invariant).
fn replay(seed: &[u8], check: impl FnOnce(&World)) {
    let mut w = World::new(seed[0]);
    w.feed(&seed[1..]);
    check(&w);
    w.finish();
}

fn nak_of(w: &World) -> Option<String> {
    w.rc.error().map(|e| format!("{e}"))
}

fn gen_roce_rx(out: &Path) -> usize {
    let mut n = 0;
    let mut emit = |name: &str, rx: &Rx, check: &dyn Fn(&World)| {
        eprintln!("roce_rx seed {name}");
        replay(&rx.bytes, check);
        write(out, name, &rx.bytes);
        n += 1;
    };
    let rts = |w: &World| assert_eq!(w.rc.qp().state(), QpState::Rts, "{:?}", nak_of(w));
    let err = |w: &World| assert_eq!(w.rc.qp().state(), QpState::Err, "{:?}", w.rc.stats());

    for flags in [0, FLAG_PSN_WRAP, FLAG_MTU_1024, FLAG_PSN_WRAP | FLAG_MTU_1024] {
        let mut rx = Rx::new(flags);
        rx.write(SLOT_RW, 16, &data(64, 1))
            .send(&data(40, 2))
            .read(SLOT_RO, 100, 600)
            .atomic(RoceOpcode::RcFetchAdd, SLOT_RW, 8)
            .atomic(RoceOpcode::RcCompareSwap, SLOT_RW, 16)
            .send(&data(600, 3))
            .write(SLOT_RW, 1000, &data(1500, 4))
            .write(SLOT_WO, 0, &data(256, 5))
            .read(SLOT_RW, 0, 0)
            .req(RoceOpcode::RcSendOnlyImm, &data(20, 6), 1, |_| {})
            .req(RoceOpcode::RcWriteOnlyImm, &data(30, 7), 1, reth(SLOT_RW, 3000, 30));
        emit(&format!("ok_all_ops.f{flags:02x}"), &rx, &|w: &World| {
            rts(w);
            assert_eq!(&w.slot_bytes(SLOT_RW)[16..80], &data(64, 1)[..]);
            assert_eq!(&w.slot_bytes(SLOT_RW)[1000..2500], &data(1500, 4)[..]);
            assert_eq!(w.slot_bytes(SLOT_WO), &data(256, 5)[..]);
            let ok = w.wcs.iter().filter(|c| c.status == WcStatus::Success).count();
            assert_eq!(ok, 4, "{:?}", w.wcs);
        });
        // Duplicates (re-ACK, READ replay, atomic replay) and a PSN gap.
        let mut rx = Rx::new(flags);
        let base = rx.psn;
        rx.write(SLOT_RW, 0, &data(64, 1))
            .read(SLOT_RO, 0, 300)
            .atomic(RoceOpcode::RcFetchAdd, SLOT_RW, 64);
        let end = rx.psn;
        rx.psn = base;
        rx.write(SLOT_RW, 0, &data(64, 9))
            .read(SLOT_RO, 0, 300)
            .atomic(RoceOpcode::RcFetchAdd, SLOT_RW, 64);
        rx.psn = (end + 5) & PSN_MASK;
        rx.send(&data(10, 1));
        rx.psn = end;
        rx.send(&data(10, 2));
        emit(&format!("ok_duplicates_and_gap.f{flags:02x}"), &rx, &|w: &World| {
            rts(w);
            assert_eq!(
                &w.slot_bytes(SLOT_RW)[..64],
                &data(64, 1)[..],
                "a duplicate WRITE was executed"
            );
        });
    }
    // SEND with Invalidate of our own key, then a WRITE with it (remote access error).
    let mut rx = Rx::new(0);
    rx.req(RoceOpcode::RcSendOnlyInv, &data(8, 1), 1, |h| h.ieth = Some(SLOT_WO));
    rx.write(SLOT_WO, 0, &data(8, 2));
    emit("err_write_after_invalidate", &rx, &err);
    // SEND with Invalidate of another PD's key.
    let mut rx = Rx::new(0);
    rx.req(RoceOpcode::RcSendOnlyInv, &data(8, 1), 1, |h| {
        h.ieth = Some(SLOT_FOREIGN)
    });
    emit("err_send_inv_foreign", &rx, &err);

    // Each attack of the hostile-peer test.
    let attacks: Vec<(&str, Box<Attack>)> = vec![
        (
            "err_write_bad_key",
            Box::new(|r: &mut Rx| {
                r.req(RoceOpcode::RcWriteOnly, &data(16, 1), 1, |h| {
                    h.reth = Some(Reth {
                        va: iova(SLOT_RW),
                        rkey: 0x00de_ad00,
                        dma_len: 16,
                    })
                });
            }),
        ),
        (
            "err_write_oob",
            Box::new(|r: &mut Rx| {
                r.write(SLOT_RW, 4090, &data(16, 1));
            }),
        ),
        (
            "err_write_below_base",
            Box::new(|r: &mut Rx| {
                r.req(RoceOpcode::RcWriteOnly, &data(16, 1), 1, |h| {
                    h.reth = Some(Reth {
                        va: iova(SLOT_RW) - 8,
                        rkey: SLOT_RW,
                        dma_len: 16,
                    })
                });
            }),
        ),
        (
            "err_write_va_wrap",
            Box::new(|r: &mut Rx| {
                r.req(RoceOpcode::RcWriteOnly, &data(16, 1), 1, |h| {
                    h.reth = Some(Reth {
                        va: u64::MAX - 7,
                        rkey: SLOT_RW,
                        dma_len: 16,
                    })
                });
            }),
        ),
        (
            "err_write_dereg",
            Box::new(|r: &mut Rx| {
                r.write(SLOT_DEREG, 0, &data(16, 1));
            }),
        ),
        (
            "err_write_foreign",
            Box::new(|r: &mut Rx| {
                r.write(SLOT_FOREIGN, 0, &data(16, 1));
            }),
        ),
        (
            "err_write_readonly",
            Box::new(|r: &mut Rx| {
                r.write(SLOT_RO, 0, &data(16, 1));
            }),
        ),
        (
            "err_write_canary",
            Box::new(|r: &mut Rx| {
                r.write(SLOT_CANARY, 0, &data(16, 1));
            }),
        ),
        (
            "err_write_first_oob",
            Box::new(|r: &mut Rx| {
                r.write(SLOT_RW, 3900, &data(600, 1));
            }),
        ),
        (
            "err_read_larger_than_mr",
            Box::new(|r: &mut Rx| {
                r.read(SLOT_RO, 0, 4097);
            }),
        ),
        (
            "err_read_foreign",
            Box::new(|r: &mut Rx| {
                r.read(SLOT_FOREIGN, 0, 16);
            }),
        ),
        (
            "err_read_writeonly",
            Box::new(|r: &mut Rx| {
                r.read(SLOT_WO, 0, 16);
            }),
        ),
        (
            "err_read_huge",
            Box::new(|r: &mut Rx| {
                r.read(SLOT_RW, 0, u32::MAX);
            }),
        ),
        (
            "err_send_too_long",
            Box::new(|r: &mut Rx| {
                r.send(&data(1100, 1));
            }),
        ),
        (
            "err_middle_without_first",
            Box::new(|r: &mut Rx| {
                let d = data(r.mtu(), 1);
                r.req(RoceOpcode::RcSendMiddle, &d, 1, |_| {});
            }),
        ),
        (
            "err_last_without_first",
            Box::new(|r: &mut Rx| {
                r.req(RoceOpcode::RcWriteLast, &data(8, 1), 1, |_| {});
            }),
        ),
        (
            "err_first_too_short",
            Box::new(|r: &mut Rx| {
                r.req(RoceOpcode::RcSendFirst, &data(8, 1), 1, |_| {});
            }),
        ),
        (
            "err_atomic_misaligned",
            Box::new(|r: &mut Rx| {
                r.atomic(RoceOpcode::RcFetchAdd, SLOT_RW, 4);
            }),
        ),
        (
            "err_atomic_readonly",
            Box::new(|r: &mut Rx| {
                r.atomic(RoceOpcode::RcCompareSwap, SLOT_RO, 0);
            }),
        ),
        (
            "err_write_length_mismatch",
            Box::new(|r: &mut Rx| {
                r.req(RoceOpcode::RcWriteOnly, &data(16, 1), 1, reth(SLOT_RW, 0, 20));
            }),
        ),
    ];
    for (name, f) in &attacks {
        let mut rx = Rx::new(0);
        rx.send(&data(8, 0));
        f(&mut rx);
        // What follows the rejected request must not be executed.
        rx.write(SLOT_RW, 0, &data(32, 0x55));
        emit(name, &rx, &|w: &World| {
            err(w);
            assert_ne!(
                &w.slot_bytes(SLOT_RW)[..32],
                &data(32, 0x55)[..],
                "{name}: executed after the error"
            );
        });
    }
    // SEND longer than the first receive (64 bytes): recv 1 completes LOC_LEN_ERR.
    // Beyond IRD (IRD 1): two READs back to back.
    let mut rx = Rx::new(FLAG_IRD1);
    rx.read(SLOT_RO, 0, 4096).read(SLOT_RO, 0, 16);
    emit("err_beyond_ird", &rx, &|_w: &World| {});
    // A QP without remote rights.
    let mut rx = Rx::new(FLAG_QP_NO_REMOTE);
    rx.write(SLOT_RW, 0, &data(16, 1));
    emit("err_qp_no_remote_write", &rx, &err);
    let mut rx = Rx::new(FLAG_QP_NO_REMOTE);
    rx.read(SLOT_RW, 0, 16);
    emit("err_qp_no_remote_read", &rx, &err);
    // A receive with a bad lkey.
    let mut rx = Rx::new(FLAG_BAD_RECV);
    rx.send(&data(8, 1));
    emit("err_bad_recv", &rx, &err);
    // RNR: more SENDs than receives, then time passes and one more.
    let mut rx = Rx::new(0);
    for i in 0..5 {
        rx.send(&data(8, i));
    }
    rx.tick(12);
    emit("rnr_no_receive", &rx, &|_w: &World| {});

    // The harness's own work (READ 812 bytes, SEND 40, WRITE 300, FETCH_ADD): answers.
    for flags in [
        FLAG_SEND_WORK,
        FLAG_SEND_WORK | FLAG_PSN_WRAP,
        FLAG_SEND_WORK | FLAG_MTU_1024,
    ] {
        let mtu = mtu(flags);
        let read_pkts = 812usize.div_ceil(mtu) as u32;
        let write_pkts = 300usize.div_ceil(mtu) as u32;
        let src: Vec<u8> = (0..812).map(|i| (i as u8) ^ 0x3c).collect();
        let mut rx = Rx::new(flags);
        for (i, c) in src.chunks(mtu).enumerate() {
            let op = match (i, read_pkts) {
                (_, 1) => RoceOpcode::RcReadResponseOnly,
                (0, _) => RoceOpcode::RcReadResponseFirst,
                (k, n) if k as u32 + 1 == n => RoceOpcode::RcReadResponseLast,
                _ => RoceOpcode::RcReadResponseMiddle,
            };
            rx.resp(op, i as u32, c, |_| {});
        }
        let after_send = read_pkts + 1;
        let after_write = after_send + write_pkts;
        rx.resp(RoceOpcode::RcAck, after_write - 1, &[], |h| {
            h.aeth = Some(Aeth::ack(3, AETH_CREDITS_INVALID))
        });
        rx.resp(RoceOpcode::RcAtomicAck, after_write, &[], |h| {
            h.aeth = Some(Aeth::ack(4, AETH_CREDITS_INVALID));
            h.atomic_ack = Some(AtomicAckEth {
                orig: 0x1122_3344_5566_7788,
            });
        });
        emit(&format!("ok_requester_all_answered.f{flags:02x}"), &rx, &|w: &World| {
            let ok: Vec<u64> = w
                .wcs
                .iter()
                .filter(|c| c.status == WcStatus::Success)
                .map(|c| c.wr_id)
                .collect();
            assert!(RC_SENDS.iter().all(|id| ok.contains(id)), "{:?}", w.wcs);
            assert_eq!(&w.slot_bytes(SLOT_SINK)[..512], &src[..512]);
            assert_eq!(&w.slot_bytes(SLOT_SINK)[600..900], &src[512..812]);
        });
        // NAKs of each kind at the SEND, an RNR NAK, a PSN sequence NAK, timeouts.
        for (name, aeth) in [
            ("nak_psn_seq", Aeth::nak(0, NakCode::PsnSequenceError)),
            ("nak_invalid_request", Aeth::nak(0, NakCode::InvalidRequest)),
            ("nak_remote_access", Aeth::nak(0, NakCode::RemoteAccessError)),
            ("nak_remote_op", Aeth::nak(0, NakCode::RemoteOperationalError)),
            ("nak_rnr", Aeth::rnr_nak(0, 1)),
        ] {
            let mut rx = Rx::new(flags);
            rx.resp(RoceOpcode::RcAck, read_pkts, &[], move |h| h.aeth = Some(aeth));
            rx.tick(10).tick(14);
            emit(&format!("{name}.f{flags:02x}"), &rx, &|_w: &World| {});
        }
        let mut rx = Rx::new(flags);
        for _ in 0..6 {
            rx.tick(15);
        }
        emit(&format!("timeouts_retry_exceeded.f{flags:02x}"), &rx, &|w: &World| {
            assert_eq!(w.rc.qp().state(), QpState::Err);
        });
    }

    // UD datagrams: delivered, wrong Q_Key, too large for the receive, multicast, with imm.
    let mut rx = Rx::new(0);
    rx.ud(RoceOpcode::UdSendOnly, SYM_UD_QPN, UD_QKEY, &data(100, 1))
        .ud(RoceOpcode::UdSendOnly, SYM_UD_QPN, 0x8001_0000, &data(100, 2))
        .ud(RoceOpcode::UdSendOnlyImm, SYM_UD_QPN, UD_QKEY, &data(256, 3))
        .ud(RoceOpcode::UdSendOnly, SYM_UD_QPN, UD_QKEY, &data(100, 4))
        .ud(RoceOpcode::UdSendOnly, 0xff_ffff, UD_QKEY, &data(10, 5))
        .ud(RoceOpcode::UdSendOnly, SYM_UD_QPN, UD_QKEY, &data(257, 6))
        .ud(RoceOpcode::UdSendOnly, SYM_RC_QPN, UD_QKEY, &data(4, 7));
    emit("ud_mixed", &rx, &|w: &World| {
        let delivered = w
            .wcs
            .iter()
            .filter(|c| c.wr_id >= 200 && c.status == WcStatus::Success)
            .count();
        assert!(delivered >= 2, "{:?}", w.wcs);
    });
    let mut rx = Rx::new(FLAG_SEND_WORK);
    rx.ud(RoceOpcode::UdSendOnly, SYM_UD_QPN, UD_QKEY, &data(8, 1));
    emit("ud_with_send_work", &rx, &|_w: &World| {});
    // Raw records: garbage, truncated headers, an RC packet to the UD QP and back.
    let mut rx = Rx::new(0);
    rx.raw(CTL_RAW, &[0xff; 16])
        .raw(0, &[0x0a, 0, 0xff, 0xff, 0, 0, 0, 1, 0x80, 0, 0, 0, 1, 2, 3]);
    let p = pkt(RoceOpcode::RcSendOnly, SYM_UD_QPN, 0, &data(8, 1), |_| {});
    rx.raw(CTL_UD, &p).raw(0, &p);
    emit("raw_garbage", &rx, &|_w: &World| {});
    n
}

// --------------------------------------------------------------------------------- pcaps

/// An IPv4 address and UDP port.
type Endpoint = (u32, u16);

/// (src ip:port, dst ip:port, UDP payload) of every IPv4/UDP packet in a classic pcap.
fn pcap_udp(path: &Path) -> Vec<(Endpoint, Endpoint, Vec<u8>)> {
    let d = std::fs::read(path).unwrap();
    let le = d[..4] == [0xd4, 0xc3, 0xb2, 0xa1] || d[..4] == [0x4d, 0x3c, 0xb2, 0xa1];
    let u32at = |b: &[u8], i: usize| {
        let a = [b[i], b[i + 1], b[i + 2], b[i + 3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let link = u32at(&d, 20);
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= d.len() {
        let cap = u32at(&d, off + 8) as usize;
        let Some(frame) = d.get(off + 16..off + 16 + cap) else {
            break;
        };
        off += 16 + cap;
        let ip = match link {
            1 if frame.len() > 14 && frame[12..14] == [0x08, 0x00] => &frame[14..],
            113 if frame.len() > 16 => &frame[16..],
            101 | 228 => frame,
            _ => continue,
        };
        if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 17 {
            continue;
        }
        let ihl = usize::from(ip[0] & 15) * 4;
        let Some(udp) = ip.get(ihl..) else { continue };
        if udp.len() < 8 {
            continue;
        }
        let be = |b: &[u8], i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let ulen = usize::from(be(udp, 4)).min(udp.len());
        let src = (u32::from_be_bytes(ip[12..16].try_into().unwrap()), be(udp, 0));
        let dst = (u32::from_be_bytes(ip[16..20].try_into().unwrap()), be(udp, 2));
        out.push((src, dst, udp[8..ulen.max(8)].to_vec()));
    }
    out
}

fn gen_captures(pcaps: &[PathBuf], rx_out: &Path, cm_out: &Path) -> (usize, usize) {
    let (mut nrx, mut ncm) = (0, 0);
    for path in pcaps {
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let dgrams = pcap_udp(path);
        let mut flows: HashMap<(Endpoint, Endpoint), Vec<Vec<u8>>> = HashMap::new();
        let mut mads: Vec<((u32, u16), CmMad)> = Vec::new();
        for (i, (src, dst, payload)) in dgrams.iter().enumerate() {
            if payload.len() < BTH_LEN + ICRC_LEN {
                continue;
            }
            let mut t = payload[..payload.len() - ICRC_LEN].to_vec();
            let Some(op) = RoceOpcode::from_u8(t[0]) else { continue };
            // Alone, with a symbolic QPN (and, for UD, the harness's Q_Key too).
            let sym = if op.is_ud() { SYM_UD_QPN } else { SYM_RC_QPN };
            t[5..8].copy_from_slice(&sym.to_be_bytes()[1..]);
            let ctl = if op.is_ud() { CTL_UD } else { 0 };
            let mut seed = vec![0u8];
            seed.extend_from_slice(&record(ctl, &t));
            if op.is_ud() && t.len() >= BTH_LEN + 8 {
                let mut q = t.clone();
                q[BTH_LEN..BTH_LEN + 4].copy_from_slice(&UD_QKEY.to_be_bytes());
                seed.extend_from_slice(&record(ctl, &q));
            }
            roce::run_input(&seed);
            write(rx_out, &format!("{stem}.{i:02}"), &seed);
            nrx += 1;
            if op.is_rc() && op.is_request() {
                flows.entry((*src, *dst)).or_default().push(t.clone());
            }
            if op.is_ud() {
                if let Ok(p) = RocePacket::parse(&t) {
                    if p.payload.len() >= MAD_LEN {
                        if let Ok(m) = CmMad::parse(p.payload) {
                            mads.push((*src, m));
                        }
                        let mut s = vec![0u8, OP_MAD | 8, (p.payload.len() - 256) as u8];
                        s.extend_from_slice(p.payload);
                        ibcm::run_input(&s);
                        write(cm_out, &format!("{stem}.{i:02}.alone"), &s);
                        ncm += 1;
                    }
                }
            }
        }
        // Each direction's RC requests, rebased to the responder's PSN with keys and
        // addresses made symbolic (slot RW).
        for (k, (_, pkts)) in flows.iter().enumerate() {
            let mut seed = vec![0u8];
            let first = u32::from_be_bytes([0, pkts[0][9], pkts[0][10], pkts[0][11]]);
            let mut base_va = None;
            for p in pkts {
                let mut p = p.clone();
                let psn = u32::from_be_bytes([0, p[9], p[10], p[11]]).wrapping_sub(first) & PSN_MASK;
                p[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
                let op = RoceOpcode::from_u8(p[0]).unwrap();
                if op.headers().reth && p.len() >= BTH_LEN + 16 {
                    let va = u64::from_be_bytes(p[12..20].try_into().unwrap());
                    let b = *base_va.get_or_insert(va);
                    let nva = iova(SLOT_RW) + (va.wrapping_sub(b) & 0x7ff);
                    p[12..20].copy_from_slice(&nva.to_be_bytes());
                    p[20..24].copy_from_slice(&SLOT_RW.to_be_bytes());
                }
                seed.extend_from_slice(&record(0, &p));
            }
            roce::run_input(&seed);
            write(rx_out, &format!("{stem}.flow{k}"), &seed);
            nrx += 1;
        }
        // The CM exchange replayed from each side, IDs mapped onto the harness's.
        let Some(active) = mads.iter().find_map(|(src, m)| match &m.msg {
            CmMessage::Req(r) => Some((*src, r.local_comm_id)),
            _ => None,
        }) else {
            continue;
        };
        for (side, cfg) in [("passive", 0u8), ("active", 1u8)] {
            let mut s = vec![cfg];
            for (src, m) in &mads {
                let from_active = *src == active.0;
                // Feed only the other side's MADs; our side's are the machine's job.
                if from_active == (cfg == 1) {
                    continue;
                }
                let mut m = m.clone();
                remap_ids(&mut m);
                if cfg == 0 {
                    if matches!(m.msg, CmMessage::Req(_)) {
                        // The passive machine starts with the REQ received: accept it.
                        s.push(OP_ACCEPT);
                        continue;
                    }
                } else if matches!(m.msg, CmMessage::Rep(_)) {
                    push_mad(&mut s, &m);
                    s.push(OP_RTU);
                    continue;
                }
                push_mad(&mut s, &m);
            }
            s.extend_from_slice(&[OP_DISCONNECT, OP_REFLECT, OP_TIMER | (10 << 3)]);
            ibcm::run_input(&s);
            write(cm_out, &format!("{stem}.{side}"), &s);
            ncm += 1;
        }
    }
    (nrx, ncm)
}

/// Maps the capture's communication IDs onto the harness's: every MAD fed to the machine comes
/// from the peer, so its local ID becomes PEER_ID and its remote ID LOCAL_ID.
fn remap_ids(m: &mut CmMad) {
    let (l, r) = (PEER_ID, LOCAL_ID);
    match &mut m.msg {
        CmMessage::Req(x) => x.local_comm_id = l,
        CmMessage::Rep(x) => (x.local_comm_id, x.remote_comm_id) = (l, r),
        CmMessage::Rtu(x) => (x.local_comm_id, x.remote_comm_id) = (l, r),
        CmMessage::Rej(x) => (x.local_comm_id, x.remote_comm_id) = (l, r),
        CmMessage::Mra(x) => (x.local_comm_id, x.remote_comm_id) = (l, r),
        CmMessage::Dreq(x) => (x.local_comm_id, x.remote_comm_id) = (l, r),
        CmMessage::Drep(x) => (x.local_comm_id, x.remote_comm_id) = (l, r),
        CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => {}
    }
}

fn push_mad(s: &mut Vec<u8>, m: &CmMad) {
    s.push(OP_MAD | 8);
    s.push(0);
    s.extend_from_slice(&m.emit());
}

// -------------------------------------------------------------------------------- cm_mad

fn gen_cm(out: &Path) -> usize {
    let mut n = 0;
    let mut emit = |name: &str, s: Vec<u8>| {
        ibcm::run_input(&s);
        write(out, name, &s);
        n += 1;
    };
    let mad = |m: CmMessage, tid: u64| {
        let mut s = vec![OP_MAD | 8, 0];
        s.extend_from_slice(&CmMad { tid, msg: m }.emit());
        s
    };
    let t = |arg: u8| OP_TIMER | (arg << 3);
    let r = |arg: u8| OP_REFLECT | (arg << 3);
    for retries in [0u8, 3] {
        let c = retries << 1;
        // Passive: accept, RTU, peer disconnects, we answer, TIMEWAIT ends.
        emit(
            &format!("passive_life.r{retries}"),
            vec![c, OP_ACCEPT, r(0), r(4), OP_DISCONNECT, t(8)],
        );
        // Passive: duplicate REQ before and after accepting, MRA for the REP, REJ.
        emit(
            &format!("passive_dups.r{retries}"),
            vec![c, r(3), OP_ACCEPT, r(3), r(1), t(7), r(2)],
        );
        // Passive: we disconnect, the DREQ crosses the peer's.
        emit(
            &format!("passive_dreq_cross.r{retries}"),
            vec![c, OP_ACCEPT, r(0), OP_DISCONNECT, r(1), r(0), t(9)],
        );
        // Passive: reject, duplicate REQ in TIMEWAIT.
        emit(
            &format!("passive_reject.r{retries}"),
            vec![c, OP_REJECT | (3 << 3), r(0), t(9)],
        );
        // Passive: REP never answered.
        emit(
            &format!("passive_rep_timeout.r{retries}"),
            vec![c, OP_ACCEPT, t(7), t(7), t(7), t(7), t(7)],
        );
        // Active: REP, RTU, we disconnect, DREP, TIMEWAIT.
        emit(
            &format!("active_life.r{retries}"),
            vec![c | 1, r(0), OP_RTU, OP_DISCONNECT, r(0), t(8)],
        );
        // Active: MRA for the REQ, then REP twice (MRA for the duplicate), reject the REP.
        emit(
            &format!("active_mra_dup_rep.r{retries}"),
            vec![c | 1, r(1), t(6), r(0), r(0), OP_REJECT, t(9)],
        );
        // Active: REJ for the REQ; nothing answers; give-up bound.
        emit(&format!("active_rej.r{retries}"), vec![c | 1, r(2), t(9)]);
        emit(
            &format!("active_unreachable.r{retries}"),
            vec![c | 1 | 8, t(7), t(7), t(7), t(7), t(10)],
        );
        // Active: established, the peer disconnects, destroy.
        emit(
            &format!("active_peer_dreq.r{retries}"),
            vec![c | 1, r(0), OP_RTU, r(0), 6],
        );
    }
    // Explicit MADs with the harness's IDs (so the fuzzer sees them as bytes).
    let mut s = vec![0u8, OP_ACCEPT];
    s.extend(mad(
        CmMessage::Rtu(softrdma_wire::ibcm::Rtu {
            local_comm_id: PEER_ID,
            remote_comm_id: LOCAL_ID,
            ..Default::default()
        }),
        ibcm::TID,
    ));
    s.extend(mad(
        CmMessage::Dreq(Dreq {
            local_comm_id: PEER_ID,
            remote_comm_id: LOCAL_ID,
            ..Dreq::default()
        }),
        7,
    ));
    s.push(OP_DISCONNECT);
    emit("passive_explicit", s);
    let mut s = vec![1u8];
    s.extend(mad(
        CmMessage::Mra(Mra {
            local_comm_id: PEER_ID,
            remote_comm_id: LOCAL_ID,
            message_mraed: CM_MSG_REQ,
            service_timeout: 31,
            ..Mra::default()
        }),
        ibcm::TID,
    ));
    s.push(t(15));
    emit("active_mra_max_timeout", s);
    let mut s = vec![0u8];
    s.extend(mad(
        CmMessage::SidrReq(SidrReq {
            request_id: 0x0004_0001,
            service_id: 0x0000_0000_0111_1d2f,
            ..SidrReq::default()
        }),
        9,
    ));
    s.extend(mad(
        CmMessage::SidrRep(SidrRep {
            request_id: ibcm::SIDR_ID,
            ..SidrRep::default()
        }),
        10,
    ));
    s.extend(mad(
        CmMessage::Rej(softrdma_wire::ibcm::Rej {
            local_comm_id: PEER_ID,
            remote_comm_id: LOCAL_ID,
            reason: RejReason::ConsumerDefined,
            ari: vec![1; 72],
            ..Default::default()
        }),
        ibcm::TID,
    ));
    emit("sidr_and_rej_ari", s);
    // Truncated and garbage MADs.
    let req = CmMad {
        tid: 5,
        msg: CmMessage::Req(ibcm::base_req(PEER_ID)),
    }
    .emit();
    let mut s = vec![0u8, OP_MAD, 200];
    s.extend_from_slice(&req[..200]);
    emit("truncated_req", s);
    let mut s = vec![0u8, OP_MAD | 8, 44];
    s.extend_from_slice(&req);
    s.extend_from_slice(&[0xee; 44]);
    emit("req_300_bytes", s);
    let mut g = req;
    g[24..]
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i as u8).wrapping_mul(151));
    let mut s = vec![0u8, OP_MAD | 8, 0];
    s.extend_from_slice(&g);
    emit("req_garbage_fields", s);
    n
}

fn main() {
    let args: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let pcaps = if args.is_empty() {
        let mut v = Vec::new();
        for dir in ["good", "bad"] {
            let d = Path::new("/work/shared/wirecheck/samples").join(dir);
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    let p = e.path();
                    let name = p.file_name().unwrap().to_string_lossy().to_string();
                    if name.starts_with("roce_") && name.ends_with(".pcap") {
                        v.push(p);
                    }
                }
            }
        }
        v.sort();
        v
    } else {
        args
    };
    let root = here();
    let a = gen_roce_rx(&root.join("generated/roce_rx"));
    let b = gen_cm(&root.join("generated/cm_mad"));
    let (c, d) = gen_captures(&pcaps, &root.join("captures/roce_rx"), &root.join("captures/cm_mad"));
    println!(
        "roce_rx: {a} generated, {c} from {} pcaps; cm_mad: {b} generated, {d} from pcaps",
        pcaps.len()
    );
}
