//! The `roce_rx` world: a soft-RoCE RC engine (responder and, with [`FLAG_SEND_WORK`], requester
//! with work in flight) and a UD engine, wired to real verbs objects (PDs, MRs, CQ, QPs moved
//! through INIT → RTR → RTS with the IBTA attribute rules), fed a hostile sequence of RoCE
//! datagrams (the IB transport part, BTH .. pad, as the driver hands it over after the ICRC
//! check) with simulated time.
//!
//! # Input format
//!
//! ```text
//! byte 0   flags: FLAG_QP_NO_REMOTE | FLAG_SEND_WORK | FLAG_BAD_RECV | FLAG_IRD1 | FLAG_PSN_WRAP | FLAG_MTU_1024
//! then records, each:
//!   ctl     bit 0 (CTL_UD): to the UD engine (else the RC engine)
//!           bit 1 (CTL_RAW): no symbolic rewriting
//!           bits 2..6: time step before the record: 0 none, t > 0: now += 10 µs << (t - 1)
//!           bit 7 (CTL_TICK): no packet, only the time step (the record is this one byte)
//!   len     2 bytes big endian, masked to 0x1fff (shorter if the input ends)
//!   bytes   one IB transport packet (BTH .. pad, no ICRC)
//! ```
//!
//! # Symbolic values
//!
//! QP numbers and keys are chosen at run time, so a fuzzer could never name them. Unless the
//! record is raw, the harness rewrites, in place and before parsing: a BTH destination QP of
//! [`SYM_RC_QPN`] / [`SYM_UD_QPN`] into the RC / UD QP's number, and an R_Key of a RETH or
//! AtomicETH, or the key of an IETH, in `1..=SLOTS` into the real key of that slot. MRs are
//! registered at fixed iovas ([`iova`]), the QPs start at fixed PSNs ([`rq_psn`], [`sq_psn`])
//! and the peer is [`PEER_QPN`], so nothing else needs rewriting.
//!
//! # Invariants (checked after every record and at the end)
//!
//! - no panic (debug assertions on, so the wire encoders also check every emitted header set);
//! - every packet the engines emit parses, goes to [`PEER_QPN`] with the default P_Key, carries
//!   at most one MTU, and UD datagrams name the UD QP as their source;
//! - after an error NAK (invalid request, remote access, remote operational) the RC engine
//!   sends nothing else, and it sends at most one;
//! - the canary MR never changes; no MR byte changes unless a valid access could write it: an
//!   RDMA WRITE or atomic naming the slot (symbolically) within its bounds, on a slot with the
//!   right, registered, in the QP's PD, on a QP with the right; receive buffers; the sinks of
//!   the harness's own READ and atomic. Read-only, deregistered and foreign-PD MRs never change;
//! - no disclosure: every READ response payload lies inside a READ request of the input for
//!   a readable slot (read-only bytes compared exactly); atomic ACKs answer atomics on the
//!   atomic slot only;
//! - the foreign PD's key is still valid at the end (SEND with Invalidate cannot reach it);
//! - every work request completes at most once at every point, and exactly once after the
//!   QPs are moved to ERR at the end; successful receives never report more than they hold;
//! - whatever parses re-emits to the same packet, and [`check_icrc`] accepts what
//!   [`append_icrc`] produced.

use softrdma_roce::engine::{RcConfig, RcEngine, UdConfig, UdEngine, UdSource, GRH_LEN};
use softrdma_verbs::mr::check_remote;
use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::*;
use softrdma_wire::roce::*;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The RC QP allows no remote access (LOCAL_WRITE only).
pub const FLAG_QP_NO_REMOTE: u8 = 0x01;
/// Post a READ, a SEND, a WRITE and a FETCH_ADD on the RC QP, and a SEND on the UD QP.
pub const FLAG_SEND_WORK: u8 = 0x02;
/// The first posted RC receive names a deregistered lkey.
pub const FLAG_BAD_RECV: u8 = 0x04;
/// Responder resources (IRD) 1 instead of 4.
pub const FLAG_IRD1: u8 = 0x08;
/// Start the PSNs just before the 24-bit wrap.
pub const FLAG_PSN_WRAP: u8 = 0x10;
/// Path MTU 1024 instead of 256.
pub const FLAG_MTU_1024: u8 = 0x20;

/// Record to the UD engine.
pub const CTL_UD: u8 = 0x01;
/// Record without symbolic rewriting.
pub const CTL_RAW: u8 = 0x02;
/// Record without a packet: only the time step.
pub const CTL_TICK: u8 = 0x80;

/// Symbolic destination QP: the RC QP.
pub const SYM_RC_QPN: u32 = 1;
/// Symbolic destination QP: the UD QP.
pub const SYM_UD_QPN: u32 = 2;
/// The RC QP's peer (its `dest_qp_num`), and where the UD send goes.
pub const PEER_QPN: u32 = 0x005e_0011;
/// The UD QP's Q_Key.
pub const UD_QKEY: u32 = 0x1111_1111;

/// REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC, 4096 bytes.
pub const SLOT_RW: u32 = 1;
/// REMOTE_READ only, 4096 bytes (also the local source of the posted SEND/WRITE).
pub const SLOT_RO: u32 = 2;
/// REMOTE_WRITE only, 256 bytes.
pub const SLOT_WO: u32 = 3;
/// Canary: LOCAL_WRITE only, never a receive buffer; must stay all zero.
pub const SLOT_CANARY: u32 = 4;
/// Registered with every right, then deregistered (stale key).
pub const SLOT_DEREG: u32 = 5;
/// Every right, but in another PD.
pub const SLOT_FOREIGN: u32 = 6;
/// RC receive buffers (LOCAL_WRITE only).
pub const SLOT_RECV: u32 = 7;
/// Sink of the posted READ and FETCH_ADD (LOCAL_WRITE only).
pub const SLOT_SINK: u32 = 8;
/// UD receive buffers (LOCAL_WRITE only).
pub const SLOT_UD_RECV: u32 = 9;
/// Number of slots; symbolic keys are `1..=SLOTS`.
pub const SLOTS: u32 = 9;

/// RC receive WRs: (wr_id, [(offset in SLOT_RECV, len)]).
pub const RECVS: &[(u64, &[(usize, u32)])] = &[
    (1, &[(0, 64)]),
    (2, &[(128, 32), (256, 1024)]),
    (3, &[(2048, 2048)]),
    (4, &[(1536, 64)]),
];
/// The receive with a deregistered lkey ([`FLAG_BAD_RECV`]).
pub const BAD_RECV_ID: u64 = 99;
/// UD receive WRs (offsets in SLOT_UD_RECV); 203 is too small for any datagram with data.
pub const UD_RECVS: &[(u64, &[(usize, u32)])] = &[
    (201, &[(0, 40 + 256)]),
    (202, &[(512, 40), (600, 1024)]),
    (203, &[(2048, 44)]),
    (204, &[(3072, 1024)]),
];
/// Sink SGEs of the posted READ (offsets in SLOT_SINK); bytes 512..600 stay untouched.
pub const READ_SINK: &[(usize, u32)] = &[(0, 512), (600, 300)];
/// The FETCH_ADD result buffer (offset in SLOT_SINK).
pub const ATOMIC_SINK: usize = 960;
/// wr_ids of the RC send work: READ, SEND, WRITE, FETCH_ADD.
pub const RC_SENDS: [u64; 4] = [100, 101, 102, 103];
/// wr_id of the UD send.
pub const UD_SEND: u64 = 300;

/// Byte length of a slot's MR.
pub fn slot_len(slot: u32) -> usize {
    match slot {
        SLOT_WO => 256,
        SLOT_SINK => 1024,
        _ => 4096,
    }
}

/// The fixed iova of byte 0 of a slot.
pub fn iova(slot: u32) -> u64 {
    u64::from(slot) << 16
}

fn access(slot: u32) -> Access {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    match slot {
        SLOT_RW | SLOT_DEREG | SLOT_FOREIGN => all,
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
        (i as u8).wrapping_mul(29).wrapping_add((slot as u8).wrapping_mul(41)) | 1
    }
}

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

/// The first PSN the RC responder expects.
pub fn rq_psn(flags: u8) -> u32 {
    if flags & FLAG_PSN_WRAP != 0 {
        0xff_fffc
    } else {
        0
    }
}

/// The first PSN the RC requester sends.
pub fn sq_psn(flags: u8) -> u32 {
    if flags & FLAG_PSN_WRAP != 0 {
        0xff_fffe
    } else {
        0
    }
}

/// The path MTU in bytes.
pub fn mtu(flags: u8) -> usize {
    if flags & FLAG_MTU_1024 != 0 {
        1024
    } else {
        256
    }
}

#[derive(Debug)]
struct NoDriver;
impl QpDriver for NoDriver {
    fn kick(&self) {}
}

/// A loopback soft-RoCE device description (no interface discovery).
pub fn device() -> &'static device::DeviceInfo {
    static DEV: OnceLock<device::DeviceInfo> = OnceLock::new();
    DEV.get_or_init(|| {
        let lo = device::NetIf::synthetic_loopback();
        device::devices_from(&[lo], None)
            .unwrap()
            .into_iter()
            .find(|d| d.transport == device::TransportKind::Roce)
            .expect("a soft-RoCE device on lo")
    })
}

fn mtu_enum(mtu: usize) -> u8 {
    if mtu == 1024 {
        3
    } else {
        1
    }
}

fn new_qp(pd: &Pd, cq: &Cq, qp_type: QpType) -> Qp {
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        },
        qp_type,
        sq_sig_all: true,
    };
    Qp::new(pd, init, AttrRules::Ibta).unwrap()
}

fn connect_rc(qp: &Qp, flags: u8) {
    let access = if flags & FLAG_QP_NO_REMOTE != 0 {
        Access::LOCAL_WRITE
    } else {
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
    };
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: access,
        ..QpAttr::default()
    };
    qp.modify(
        &init,
        attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::ACCESS_FLAGS,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        ah_attr: AhAttr {
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        path_mtu: mtu_enum(mtu(flags)),
        dest_qp_num: PEER_QPN,
        rq_psn: rq_psn(flags),
        max_dest_rd_atomic: if flags & FLAG_IRD1 != 0 { 1 } else { 4 },
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    qp.modify(&rtr, attr_mask::STATE | attr_mask::RC_RTR_REQUIRED).unwrap();
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: sq_psn(flags),
        // 4.096 µs << 10 ≈ 4 ms.
        timeout: 10,
        retry_cnt: 3,
        rnr_retry: 3,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    qp.modify(&rts, attr_mask::STATE | attr_mask::RC_RTS_REQUIRED).unwrap();
}

fn connect_ud(qp: &Qp) {
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: 0,
        port_num: 1,
        qkey: UD_QKEY,
        ..QpAttr::default()
    };
    qp.modify(
        &init,
        attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::QKEY,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        ..QpAttr::default()
    };
    qp.modify(&rtr, attr_mask::STATE).unwrap();
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: 0,
        ..QpAttr::default()
    };
    qp.modify(&rts, attr_mask::STATE | attr_mask::SQ_PSN).unwrap();
}

/// An RDMA READ request of the input (for the disclosure model).
#[derive(Debug, Clone, Copy)]
struct ReadReq {
    psn: u32,
    slot: Option<u32>,
    va: u64,
    len: u32,
}

/// Packets a READ of `len` bytes uses.
fn read_packets(len: u32, mtu: usize) -> u32 {
    (len.div_ceil(mtu as u32)).max(1)
}

fn psn_offset(psn: u32, base: u32) -> u32 {
    psn.wrapping_sub(base) & PSN_MASK
}

/// Byte offsets of the keys an opcode carries (RETH / AtomicETH R_Key, IETH).
fn key_offsets(op: RoceOpcode) -> Vec<usize> {
    let h = op.headers();
    let mut at = BTH_LEN;
    let mut out = Vec::new();
    if h.deth {
        at += Deth::LEN;
    }
    if h.reth {
        out.push(at + 8);
        at += Reth::LEN;
    }
    if h.atomic_eth {
        out.push(at + 8);
        at += AtomicEth::LEN;
    }
    if h.aeth {
        at += Aeth::LEN;
    }
    if h.atomic_ack_eth {
        at += AtomicAckEth::LEN;
    }
    if h.immdt {
        at += IMMDT_LEN;
    }
    if h.ieth {
        out.push(at);
    }
    out
}

/// The engines, their QPs and the memory they may touch. Field order is drop order: the
/// engines and the MRs go before the buffers they point into.
pub struct World {
    /// The RC engine under test.
    pub rc: RcEngine,
    /// The UD engine under test.
    pub ud: UdEngine,
    rc_qp: Qp,
    ud_qp: Qp,
    cq: Cq,
    mrs: Vec<Option<Mr>>,
    keys: [u32; SLOTS as usize + 1],
    bufs: Vec<Box<[u8]>>,
    pd: Pd,
    other_pd: Pd,
    flags: u8,
    mtu: usize,
    base: Instant,
    now: Instant,
    /// Byte ranges (slot, offset, len) a valid remote access may have written.
    allowed: Vec<(u32, u64, u64)>,
    reads: Vec<ReadReq>,
    atomics_on_rw: bool,
    error_naks: usize,
    /// Every completion polled from the CQ.
    pub wcs: Vec<WorkCompletion>,
    /// Packets the engines sent (RC, UD).
    pub sent: (usize, usize),
}

impl World {
    /// Builds the world for a flags byte.
    pub fn new(flags: u8) -> World {
        let ctx = Context::open(device()).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let other_pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(1024, None).unwrap();
        let rc_qp = new_qp(&pd, &cq, QpType::Rc);
        let ud_qp = new_qp(&pd, &cq, QpType::Ud);
        connect_rc(&rc_qp, flags);
        connect_ud(&ud_qp);
        rc_qp.inner().attach_driver(Arc::new(NoDriver));
        ud_qp.inner().attach_driver(Arc::new(NoDriver));

        let mut bufs: Vec<Box<[u8]>> = vec![Box::new([])];
        let mut mrs: Vec<Option<Mr>> = vec![None];
        let mut keys = [0u32; SLOTS as usize + 1];
        for slot in 1..=SLOTS {
            let len = slot_len(slot);
            let mut b: Box<[u8]> = images()[slot as usize].clone();
            let on = if slot == SLOT_FOREIGN { &other_pd } else { &pd };
            // SAFETY: the buffer lives in `bufs`, which World drops after every MR and engine.
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
        let mr = |slot: u32| mrs[slot as usize].as_ref().unwrap();
        let mut wrs = Vec::new();
        if flags & FLAG_BAD_RECV != 0 {
            wrs.push(RecvWr {
                wr_id: BAD_RECV_ID,
                sg_list: vec![Sge {
                    addr: iova(SLOT_DEREG),
                    length: 64,
                    lkey: keys[SLOT_DEREG as usize],
                }],
            });
        }
        for (id, sges) in RECVS {
            let recv = mr(SLOT_RECV);
            wrs.push(RecvWr {
                wr_id: *id,
                sg_list: sges.iter().map(|&(off, len)| recv.sge(off, len)).collect(),
            });
        }
        rc_qp.post_recv(&wrs).unwrap();
        let ud_wrs: Vec<RecvWr> = UD_RECVS
            .iter()
            .map(|(id, sges)| RecvWr {
                wr_id: *id,
                sg_list: sges.iter().map(|&(off, len)| mr(SLOT_UD_RECV).sge(off, len)).collect(),
            })
            .collect();
        ud_qp.post_recv(&ud_wrs).unwrap();
        if flags & FLAG_SEND_WORK != 0 {
            let sink = mr(SLOT_SINK);
            let src = mr(SLOT_RO);
            let read = SendWr::read(
                RC_SENDS[0],
                READ_SINK.iter().map(|&(off, len)| sink.sge(off, len)).collect(),
                0x7000,
                0x0012_3400,
            );
            let send = SendWr::send(RC_SENDS[1], vec![src.sge(0, 40)]);
            let write = SendWr::write(RC_SENDS[2], vec![src.sge(100, 300)], 0x5000, 0x00ab_cd00);
            let fadd = SendWr {
                wr_id: RC_SENDS[3],
                opcode: Some(WrOpcode::AtomicFetchAndAdd),
                sg_list: vec![sink.sge(ATOMIC_SINK, 8)],
                flags: SendFlags::SIGNALED,
                remote_addr: 0x8000,
                rkey: 0x0000_4400,
                compare_add: 5,
                ..SendWr::default()
            };
            rc_qp.post_send(&[read, send, write, fadd]).unwrap();
            let mut ud = SendWr::send(UD_SEND, vec![src.sge(0, 32)]);
            let mut dgid = [0u8; 16];
            dgid[10] = 0xff;
            dgid[11] = 0xff;
            dgid[12..].copy_from_slice(&[127, 0, 0, 1]);
            ud.ud = Some(UdDest {
                ah: AhAttr {
                    dgid,
                    is_global: true,
                    hop_limit: 64,
                    port_num: 1,
                    ..AhAttr::default()
                },
                remote_qpn: PEER_QPN,
                remote_qkey: UD_QKEY,
            });
            ud_qp.post_send(&[ud]).unwrap();
        }
        let mtu = mtu(flags);
        let (_, attr, _) = rc_qp.query();
        let rc = RcEngine::new(rc_qp.inner().clone(), RcConfig::from_qp_attr(rc_qp.qpn(), &attr, mtu));
        let ud = UdEngine::new(
            ud_qp.inner().clone(),
            UdConfig {
                local_qpn: ud_qp.qpn(),
                qkey: UD_QKEY,
                pkey: DEFAULT_PKEY,
                mtu,
            },
        );
        let now = Instant::now();
        World {
            rc,
            ud,
            rc_qp,
            ud_qp,
            cq,
            mrs,
            keys,
            bufs,
            pd,
            other_pd,
            flags,
            mtu,
            base: now,
            now,
            allowed: Vec::new(),
            reads: Vec::new(),
            atomics_on_rw: false,
            error_naks: 0,
            wcs: Vec::new(),
            sent: (0, 0),
        }
    }

    fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// The RC QP's number.
    pub fn rc_qpn(&self) -> u32 {
        self.rc_qp.qpn()
    }

    /// The UD QP's number.
    pub fn ud_qpn(&self) -> u32 {
        self.ud_qp.qpn()
    }

    /// The real (random) key registered for a slot.
    pub fn key(&self, slot: u32) -> u32 {
        self.keys[slot as usize]
    }

    /// Current content of a slot's buffer.
    pub fn slot_bytes(&self, slot: u32) -> &[u8] {
        &self.bufs[slot as usize]
    }

    /// Simulated time since the world was built.
    pub fn elapsed(&self) -> Duration {
        self.now - self.base
    }

    fn slot_of_key(&self, key: u32) -> Option<u32> {
        (1..=SLOTS).find(|&s| self.keys[s as usize] == key)
    }

    /// Rewrites symbolic QP numbers and keys in place (see the module docs).
    pub fn fixup(&self, pkt: &mut [u8]) {
        if pkt.len() < BTH_LEN {
            return;
        }
        let dq = u32::from_be_bytes([0, pkt[5], pkt[6], pkt[7]]);
        let real = match dq {
            SYM_RC_QPN => Some(self.rc_qpn()),
            SYM_UD_QPN => Some(self.ud_qpn()),
            _ => None,
        };
        if let Some(q) = real {
            pkt[5..8].copy_from_slice(&q.to_be_bytes()[1..]);
        }
        let Some(op) = RoceOpcode::from_u8(pkt[0]) else {
            return;
        };
        for at in key_offsets(op) {
            if let Some(field) = pkt.get_mut(at..at + 4) {
                let v = u32::from_be_bytes(field.try_into().unwrap());
                if (1..=SLOTS).contains(&v) {
                    field.copy_from_slice(&self.keys[v as usize].to_be_bytes());
                }
            }
        }
    }

    fn qp_remote(&self) -> bool {
        !self.has(FLAG_QP_NO_REMOTE)
    }

    /// Records what an RC request may do, for the memory and disclosure models.
    fn model(&mut self, pkt: &RocePacket<'_>) {
        let h = &pkt.headers;
        let op = h.bth.opcode;
        if let Some(r) = h.reth {
            let slot = self.slot_of_key(r.rkey);
            if op.is_write() {
                if let Some(s) = slot.filter(|&s| matches!(s, SLOT_RW | SLOT_WO) && self.qp_remote()) {
                    self.allowed.push((s, r.va.wrapping_sub(iova(s)), u64::from(r.dma_len)));
                }
            } else if op == RoceOpcode::RcReadRequest {
                self.reads.push(ReadReq {
                    psn: h.bth.psn,
                    slot,
                    va: r.va,
                    len: r.dma_len,
                });
            }
        }
        if let Some(a) = h.atomic {
            if self.slot_of_key(a.rkey) == Some(SLOT_RW) && self.qp_remote() {
                self.allowed.push((SLOT_RW, a.va.wrapping_sub(iova(SLOT_RW)), 8));
                self.atomics_on_rw = true;
            }
        }
    }

    /// Wire-decoder properties on one record: parse → emit → parse is stable, ICRC round trip.
    fn decoder_properties(body: &[u8]) {
        let ip = IcrcIp::v4_df(Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2));
        let _ = check_icrc(&ip, 49152, ROCE_V2_UDP_PORT, body);
        if body.len() >= BTH_LEN {
            let mut d = body.to_vec();
            append_icrc(&ip, 49152, ROCE_V2_UDP_PORT, &mut d, 0);
            assert_eq!(check_icrc(&ip, 49152, ROCE_V2_UDP_PORT, &d), Ok(body));
        }
        if let Ok(p) = RocePacket::parse(body) {
            assert!(p.headers.matches_opcode());
            assert_eq!(usize::from(p.headers.bth.pad_count), pad_len(p.payload.len()));
            let mut out = Vec::new();
            p.emit(&mut out);
            assert_eq!(out.len(), body.len());
            let q = RocePacket::parse(&out).expect("a re-emitted packet parses");
            assert_eq!(q, p);
        }
    }

    /// Handles one record's packet.
    pub fn deliver(&mut self, ctl: u8, body: &[u8]) {
        let mut body = body.to_vec();
        if ctl & CTL_RAW == 0 {
            self.fixup(&mut body);
        }
        Self::decoder_properties(&body);
        let Ok(pkt) = RocePacket::parse(&body) else {
            return;
        };
        if ctl & CTL_UD != 0 {
            let src = UdSource {
                src_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                dst_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                hop_limit: 64,
                traffic_class: 0,
            };
            self.ud.handle_packet(self.now, &pkt, &src);
        } else {
            self.model(&pkt);
            self.rc.handle_packet(self.now, &pkt);
        }
    }

    /// Advances simulated time by the record's step and runs expired timers.
    pub fn advance(&mut self, ctl: u8) {
        let t = (ctl >> 2) & 0x1f;
        if t > 0 {
            self.now += Duration::from_micros(10u64 << (t - 1));
        }
        if self.rc.poll_timeout().is_some_and(|d| d <= self.now) {
            self.rc.handle_timeout(self.now);
        }
    }

    /// Drains and checks everything the engines send, then the CQ.
    pub fn pump(&mut self) {
        let mut out = Vec::new();
        for _ in 0..4096 {
            if !self.rc.poll_transmit(self.now, &mut out) {
                break;
            }
            self.check_rc_packet(&out);
            self.sent.0 += 1;
        }
        for _ in 0..64 {
            if self.ud.poll_transmit(self.now, &mut out).is_none() {
                break;
            }
            let p = RocePacket::parse(&out).unwrap_or_else(|e| panic!("UD engine sent an unparsable packet: {e}"));
            assert!(
                p.headers.bth.opcode.is_ud(),
                "UD engine sent {:?}",
                p.headers.bth.opcode
            );
            assert_eq!(p.headers.bth.dest_qp, PEER_QPN);
            assert_eq!(p.headers.deth.map(|d| d.src_qp), Some(self.ud_qpn()));
            assert!(p.payload.len() <= self.mtu);
            self.sent.1 += 1;
        }
        // What the engines reported, delivered as the driver does.
        self.rc.take_outputs().deliver(&**self.rc.qp());
        self.ud.take_outputs().deliver(&**self.ud.qp());
        while let Some(wc) = self.cq.poll_one() {
            self.wcs.push(wc);
        }
        self.check_completions(false);
    }

    fn check_rc_packet(&mut self, bytes: &[u8]) {
        let p = RocePacket::parse(bytes)
            .unwrap_or_else(|e| panic!("RC engine sent an unparsable packet: {e}: {bytes:02x?}"));
        let h = &p.headers;
        assert_eq!(
            self.error_naks, 0,
            "RC engine sent {:?} after its error NAK",
            h.bth.opcode
        );
        assert!(h.bth.opcode.is_rc(), "RC engine sent {:?}", h.bth.opcode);
        assert_eq!(h.bth.dest_qp, PEER_QPN, "packet to the wrong QP");
        assert_eq!(h.bth.pkey, DEFAULT_PKEY);
        assert!(p.payload.len() <= self.mtu, "{} payload bytes > MTU", p.payload.len());
        if let Some(AethKind::Nak(code)) = h.aeth.map(|a| a.kind()) {
            if code != NakCode::PsnSequenceError {
                self.error_naks += 1;
            }
        }
        let op = h.bth.opcode;
        if op.is_read_response() && !p.payload.is_empty() {
            self.check_disclosure(h.bth.psn, p.payload);
        }
        if op == RoceOpcode::RcAtomicAck {
            assert!(
                self.atomics_on_rw,
                "atomic ACK though no atomic of the input named the atomic slot"
            );
        }
    }

    /// A READ response payload must lie inside a READ request of the input for a slot the
    /// peer may read; read-only bytes are compared exactly.
    fn check_disclosure(&self, psn: u32, payload: &[u8]) {
        let mtu = self.mtu as u64;
        let ok = self.reads.iter().rev().any(|r| {
            let Some(s) = r.slot.filter(|&s| matches!(s, SLOT_RW | SLOT_RO) && self.qp_remote()) else {
                return false;
            };
            let k = psn_offset(psn, r.psn);
            if k >= read_packets(r.len, self.mtu) {
                return false;
            }
            let skip = u64::from(k) * mtu;
            let Some(off) = r.va.checked_sub(iova(s)).and_then(|o| o.checked_add(skip)) else {
                return false;
            };
            let end = off + payload.len() as u64;
            if end > slot_len(s) as u64 || skip + payload.len() as u64 > u64::from(r.len) {
                return false;
            }
            s != SLOT_RO || images()[SLOT_RO as usize][off as usize..end as usize] == *payload
        });
        assert!(
            ok,
            "READ response PSN {psn:#x} ({} bytes) answers no READ request of a readable slot: {:?}",
            payload.len(),
            self.reads
        );
    }

    /// Each work request completes at most once (exactly once when `all`); successful
    /// receives never report more than their buffers hold.
    fn check_completions(&self, all: bool) {
        let mut expect: Vec<(u64, bool, u32)> = Vec::new();
        for (id, sges) in RECVS {
            expect.push((*id, true, sges.iter().map(|s| s.1).sum()));
        }
        if self.has(FLAG_BAD_RECV) {
            expect.push((BAD_RECV_ID, true, 64));
        }
        for (id, sges) in UD_RECVS {
            expect.push((*id, true, sges.iter().map(|s| s.1).sum()));
        }
        if self.has(FLAG_SEND_WORK) {
            for id in RC_SENDS {
                expect.push((id, false, 0));
            }
            expect.push((UD_SEND, false, 0));
        }
        for &(id, recv, cap) in &expect {
            let got: Vec<&WorkCompletion> = self
                .wcs
                .iter()
                .filter(|w| w.wr_id == id && matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) == recv)
                .collect();
            if all {
                assert_eq!(got.len(), 1, "WR {id}: {} completions: {got:?}", got.len());
            } else {
                assert!(got.len() <= 1, "WR {id} completed twice: {got:?}");
            }
            if recv {
                if let Some(w) = got.iter().find(|w| w.status == WcStatus::Success) {
                    let limit = if w.opcode == WcOpcode::RecvRdmaWithImm {
                        u32::MAX
                    } else {
                        cap
                    };
                    assert!(w.byte_len <= limit, "receive {id} reports {} bytes > {cap}", w.byte_len);
                }
            }
        }
        assert!(
            self.wcs.len() <= expect.len(),
            "completions for unknown work requests: {:?}",
            self.wcs
        );
    }

    /// Moves both QPs to ERR (as the application would), lets the engines flush, and checks
    /// every invariant.
    pub fn finish(&mut self) {
        self.pump();
        for qp in [&self.rc_qp, &self.ud_qp] {
            let attr = QpAttr {
                qp_state: Some(QpState::Err),
                ..QpAttr::default()
            };
            qp.modify(&attr, attr_mask::STATE).unwrap();
        }
        self.rc.sync_state(self.now);
        self.ud.sync_state(self.now);
        self.pump();
        self.check_completions(true);
        self.check_memory();
        let foreign = check_remote(
            self.keys[SLOT_FOREIGN as usize],
            self.other_pd.id(),
            0,
            iova(SLOT_FOREIGN),
            1,
            Access::REMOTE_WRITE,
        );
        assert!(foreign.is_ok(), "the foreign PD's key was invalidated: {foreign:?}");
        let _ = (&self.pd, &self.mrs);
    }

    fn check_memory(&self) {
        for slot in 1..=SLOTS {
            let len = slot_len(slot);
            let image = &images()[slot as usize];
            let mut got = self.bufs[slot as usize].clone();
            let mut allow = |off: u64, l: u64| {
                if let Some(end) = off.checked_add(l) {
                    if end <= len as u64 {
                        let r = off as usize..end as usize;
                        got[r.clone()].copy_from_slice(&image[r]);
                    }
                }
            };
            for &(s, off, l) in &self.allowed {
                if s == slot {
                    allow(off, l);
                }
            }
            if slot == SLOT_RECV {
                for (_, sges) in RECVS {
                    for &(off, l) in *sges {
                        allow(off as u64, u64::from(l));
                    }
                }
            }
            if slot == SLOT_UD_RECV {
                for (_, sges) in UD_RECVS {
                    for &(off, l) in *sges {
                        allow(off as u64, u64::from(l));
                    }
                }
            }
            if slot == SLOT_SINK && self.has(FLAG_SEND_WORK) {
                for &(off, l) in READ_SINK {
                    allow(off as u64, u64::from(l));
                }
                allow(ATOMIC_SINK as u64, 8);
            }
            if got[..] != image[..] {
                let i = got.iter().zip(image.iter()).position(|(a, b)| a != b).unwrap();
                panic!(
                    "slot {slot} (access {:?}) byte {i} changed to {:#04x}: no valid access could write it",
                    access(slot),
                    got[i]
                );
            }
        }
        let canary = &self.bufs[SLOT_CANARY as usize];
        assert!(canary.iter().all(|&b| b == 0), "canary MR (no remote access) written");
    }

    /// Runs the records of an input (the flags byte already stripped), then [`World::finish`].
    pub fn run(&mut self, rest: &[u8]) {
        self.feed(rest);
        self.finish();
    }

    /// Runs the records of an input (the flags byte already stripped), checking as it goes.
    pub fn feed(&mut self, mut rest: &[u8]) {
        // The harness's own work goes out first.
        self.pump();
        while let Some((&ctl, tail)) = rest.split_first() {
            rest = tail;
            self.advance(ctl);
            if ctl & CTL_TICK == 0 {
                let len = match rest {
                    [a, b, ..] => usize::from(u16::from_be_bytes([*a, *b]) & 0x1fff),
                    _ => rest.len(),
                };
                rest = rest.get(2..).unwrap_or(&[]);
                let n = len.min(rest.len());
                let (body, tail) = rest.split_at(n);
                rest = tail;
                self.deliver(ctl, body);
            }
            self.pump();
        }
    }
}

/// The UD receive buffer holds the GRH first: a datagram of `n` payload bytes needs `n + 40`.
pub const UD_GRH: usize = GRH_LEN;

/// Builds one record: `ctl`, the length, the packet.
pub fn record(ctl: u8, packet: &[u8]) -> Vec<u8> {
    let mut r = vec![ctl];
    r.extend_from_slice(&(packet.len() as u16).to_be_bytes());
    r.extend_from_slice(packet);
    r
}

/// The whole fuzz target body.
pub fn run_input(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut w = World::new(flags);
    w.run(rest);
}
