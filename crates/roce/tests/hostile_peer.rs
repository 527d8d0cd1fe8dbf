//! A hostile peer against live soft-RoCE QPs and a live IB CM listener (issue #6, part 2).
//!
//! The attacker is a raw UDP socket on 127.0.0.1 (`hostile/mod.rs`) that builds RoCEv2
//! datagrams with the `softrdma-wire` encoders and a correct ICRC (unless the attack is a bad
//! ICRC). It impersonates the peer of each victim: a victim RC QP is created in this process
//! and moved to RTR/RTS connected to `make_qpn(P, i)`, where `P` is the attacker's port, with
//! `dgid` ::ffff:127.0.0.1. So the attacker is the peer address-wise, knows the PSNs, and gets
//! the victim's ACKs and NAKs delivered to its socket (same-host packets go to the home port
//! the destination QPN names). Packets go to the victim's home port (`qpn & 0xffff`), which is
//! where the driver's same-host delivery sends them; a packet to 4791 could land in another
//! softrdma process of the host, whose counters this process cannot see.
//!
//! During every attack an honest RC pair of this process moves verified data (RDMA WRITE,
//! SEND with immediate, RDMA READ back, contents compared) on a background thread, and must
//! keep completing iterations. The victims' memory (the target MR, a READ-only MR, a canary
//! MR with every right that no attack names, an MR of another PD, the receive buffers) is
//! compared byte for byte before and after each attack. Driver counters
//! (`driver_stats()`) show each silent drop.
//!
//! | attack (RC victim) | outcome on the wire | victim |
//! |---|---|---|
//! | WRITE with a bad ICRC | dropped, no answer (`icrc_errors` + 1) | RTS; the same WRITE with a good ICRC is then ACKed and placed |
//! | WRITE whose ICRC covers IPv4 ID 0x1234 + DF, or 0xbeef without DF (as rdma_rxe's own IP header) | ACKed and placed; the same with a payload bit flipped: dropped (`icrc_errors` + 1) | RTS |
//! | WRITE with a PSN ahead of the expected one (twice) | one NAK PSN sequence error (AETH 0x60) carrying the expected PSN | RTS, nothing placed; the in-order WRITE is ACKed |
//! | WRITE with an old PSN (duplicate) | ACK of the last PSN again, not executed | RTS, memory keeps the first write |
//! | WRITE to an unknown QPN (free index of the victim's home port, QPN 0) | dropped (`unknown_qpn` + 1 each) | — |
//! | WRITE to a QP still in INIT | dropped (`unknown_qpn` + 1) | INIT, nothing placed |
//! | WRITE from another address (127.0.0.2) | dropped (`wrong_source` + 1) | RTS |
//! | 8 bytes; an unknown opcode with a good ICRC | dropped (`malformed` + 1 each) | RTS |
//! | WRITE with an invalid rkey, out of bounds, to a deregistered MR, to another PD's MR, to a READ-only MR | NAK remote access error (AETH 0x62) for its PSN | ERR, receives flushed, no byte written |
//! | WRITE FIRST whose DMA length runs past the MR | NAK remote access error | ERR, nothing written (checked before the first byte) |
//! | READ larger than the MR | NAK remote access error, no READ response | ERR, flushed |
//! | SEND larger than the posted receive | NAK invalid request (AETH 0x61) | receive LOC_LEN_ERR, the next one flushed; ERR |
//! | SEND MIDDLE without a FIRST | NAK invalid request | ERR, flushed |
//! | a valid WRITE to a victim in ERR | dropped, no answer | ERR, nothing written |
//!
//! | attack (UD victim, QP1) | outcome |
//! |---|---|
//! | UD SEND with a forged Q_Key | dropped (no completion); the same datagram with the right Q_Key is delivered |
//!
//! | attack (IB CM listener on 127.0.0.1, backlog 4) | outcome |
//! |---|---|
//! | REQ truncated to 100 bytes (UD payload < 256) | dropped (`malformed` + 1), no answer, no event |
//! | REQ with a forged Q_Key (not 0x80010000) | dropped (`malformed` + 1), no answer |
//! | REQ with a bad ICRC | dropped (`icrc_errors` + 1) |
//! | MAD with an unknown attribute ID | dropped (`malformed` + 1) |
//! | REQ with a garbage MAD header (class version, method) | dropped by the CM, no answer, no event |
//! | REQ for a service nobody listens on | REJ reason 8 (invalid service ID) from the driver |
//! | REQ with a garbage CMA header | REJ reason 28 (consumer defined), "bad CMA header: ..." in the private data; no event |
//! | REQ with garbage QP fields but a valid CMA header | CONNECT_REQUEST like any other; `rdma_reject` sends REJ 28 |
//! | 12 REQs at once (backlog 4) | 4 CONNECT_REQUESTs; the other 8 are dropped silently (the IB CM's answer to a full backlog: the peer retries); REJ 28 for the 4 when rejected |
//! | 20,000 more REQs while the backlog is full | all dropped silently, no answer, no event |
//! | afterwards | an honest rdma_cm connection is accepted at once and moves verified data |
//!
//! | attack (any QPN / communication ID) | outcome |
//! |---|---|
//! | a packet or a CM message naming a port that is no softrdma home port (here: another program's UDP socket on 127.0.0.1) | dropped (`unknown_qpn` + 1), nothing relayed to that port; with a bad ICRC dropped at the first hop (`icrc_errors` + 1) |

mod hostile;

use hostile::*;
use softrdma_cm::{CmEvent, CmId, CmOption, ConnParam, EventChannel, EventType, PortSpace};
use softrdma_roce::driver::{create_qp, driver_stats, make_qpn, DriverStats};
use softrdma_verbs::device::TransportKind;
use softrdma_verbs::qp_state::attr_mask::*;
use softrdma_verbs::*;
use softrdma_wire::ibcm::{
    service_id, CmMad, CmMessage, CmaHeader, Rej, RejReason, Req, CMA_HDR_LEN, MAD_LEN, REQ_PRIVATE_LEN,
};
use softrdma_wire::roce::{AethKind, NakCode, RoceOpcode, GSI_QKEY};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The tests of this file run one at a time: they compare the process's driver counters.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const ALL: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);
/// Bound on any expected answer.
const WAIT: Duration = Duration::from_secs(5);
/// How long "nothing comes back" is watched.
const QUIET: Duration = Duration::from_millis(300);

fn rxe_lo() -> device::DeviceInfo {
    device::find_device("rxe_lo").unwrap_or_else(|e| panic!("{e}"))
}

fn lo_gid() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[127, 0, 0, 1]);
    g
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed.wrapping_mul(7919)) as u8 ^ 0xa5)
        .collect()
}

fn new_qp(pd: &Pd, cq: &Cq, qp_type: QpType) -> Qp {
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        },
        qp_type,
        sq_sig_all: false,
    };
    create_qp(pd, init).unwrap()
}

fn to_init(qp: &Qp) {
    let a = QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: ALL,
        ..QpAttr::default()
    };
    qp.modify(&a, STATE | PKEY_INDEX | PORT | ACCESS_FLAGS).unwrap();
}

/// INIT → RTR → RTS connected to `dest` at 127.0.0.1 (path MTU 1024).
fn connect(qp: &Qp, dest: u32, sq_psn: u32, rq_psn: u32, timeout: u8) {
    to_init(qp);
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: 3,
        dest_qp_num: dest,
        rq_psn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: lo_gid(),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    qp.modify(
        &rtr,
        STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    qp.modify(
        &rts,
        STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

fn wait_ok(cq: &Cq, n: usize, what: &str) -> Result<Vec<WorkCompletion>> {
    let got = cq.wait_for(n, WAIT);
    if got.len() != n {
        return Err(Error::inval(format!(
            "{what}: {} of {n} completions: {got:?}",
            got.len()
        )));
    }
    if let Some(bad) = got.iter().find(|w| w.status != WcStatus::Success) {
        return Err(Error::inval(format!("{what}: {bad:?}")));
    }
    Ok(got)
}

// ---------------------------------------------------------------------------------------------
// The honest connection: an RC pair of this process moving verified data on its own thread.

struct Honest {
    stop: Arc<AtomicBool>,
    iterations: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

const HONEST_LEN: usize = 64 << 10;
/// The honest pair's local ACK timeout exponent (4.096 us * 2^18 = 1.07 s).
const HONEST_TIMEOUT: u8 = 18;

fn honest_loop(stop: &AtomicBool, iterations: &AtomicU64) -> Result<()> {
    let ctx = Context::open(&rxe_lo())?;
    let (pa, pb) = (ctx.alloc_pd()?, ctx.alloc_pd()?);
    let (ca, cb) = (ctx.create_cq(256, None)?, ctx.create_cq(256, None)?);
    let a = new_qp(&pa, &ca, QpType::Rc);
    let b = new_qp(&pb, &cb, QpType::Rc);
    // The honest pair shares the process with the attacks (a 20,000-MAD burst, floods) and,
    // under AddressSanitizer on a loaded CI machine, stalls of over 0.5 s happen: timeout 18
    // (1.07 s, 7 retries) rather than 14, so a stall is not taken for a dead peer. The 20 s
    // progress bound still catches traffic that stops.
    connect(&a, b.qpn(), 0x00ff_fff0, 0x10, HONEST_TIMEOUT);
    connect(&b, a.qpn(), 0x10, 0x00ff_fff0, HONEST_TIMEOUT);
    let src = pa.alloc_mr(HONEST_LEN, ALL)?;
    let back = pa.alloc_mr(HONEST_LEN, ALL)?;
    let dst = pb.alloc_mr(HONEST_LEN, ALL)?;
    let rbuf = pb.alloc_mr(256, Access::LOCAL_WRITE)?;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let len = 4096 + (i as usize % 5) * 12_000;
        let data = pattern(len, i);
        src.write(0, &data)?;
        a.post_send_one(SendWr::write(1, vec![src.sge(0, len as u32)], dst.addr(), dst.rkey()))?;
        wait_ok(&ca, 1, "honest WRITE")?;
        b.post_recv_one(2, rbuf.sge(0, 256))?;
        let mut send = SendWr::send(3, vec![src.sge(0, 64)]);
        send.opcode = Some(WrOpcode::SendWithImm);
        send.imm_data = i as u32;
        a.post_send_one(send)?;
        wait_ok(&ca, 1, "honest SEND")?;
        let r = wait_ok(&cb, 1, "honest receive")?;
        if r[0].byte_len != 64 || r[0].imm_data != i as u32 || rbuf.to_vec()[..64] != data[..64] {
            return Err(Error::inval(format!("honest SEND {i} arrived wrong: {:?}", r[0])));
        }
        if dst.to_vec()[..len] != data[..] {
            return Err(Error::inval(format!("honest WRITE {i}: target differs")));
        }
        a.post_send_one(SendWr::read(4, vec![back.sge(0, len as u32)], dst.addr(), dst.rkey()))?;
        wait_ok(&ca, 1, "honest READ")?;
        if back.to_vec()[..len] != data[..] {
            return Err(Error::inval(format!("honest READ {i}: data differs")));
        }
        i += 1;
        iterations.store(i, Ordering::Relaxed);
    }
    Ok(())
}

impl Honest {
    fn start() -> Honest {
        let stop = Arc::new(AtomicBool::new(false));
        let iterations = Arc::new(AtomicU64::new(0));
        let failure = Arc::new(Mutex::new(None));
        let (s, it, f) = (stop.clone(), iterations.clone(), failure.clone());
        let thread = std::thread::spawn(move || {
            if let Err(e) = honest_loop(&s, &it) {
                *f.lock().unwrap() = Some(e.to_string());
            }
        });
        let h = Honest {
            stop,
            iterations,
            failure,
            thread: Some(thread),
        };
        h.progress("start");
        h
    }

    /// Waits until the honest pair completes two more verified iterations.
    fn progress(&self, after: &str) {
        let from = self.iterations.load(Ordering::Relaxed);
        let until = Instant::now() + Duration::from_secs(20);
        while self.iterations.load(Ordering::Relaxed) < from + 2 {
            if let Some(f) = self.failure.lock().unwrap().as_ref() {
                panic!("honest traffic failed after {after}: {f}");
            }
            assert!(
                Instant::now() < until,
                "honest traffic stalled after {after} (at iteration {from})"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        if let Some(f) = self.failure.lock().unwrap().as_ref() {
            panic!("honest traffic failed: {f}");
        }
        self.iterations.load(Ordering::Relaxed)
    }
}

// ---------------------------------------------------------------------------------------------
// The RC victims and the memory an attacker must not change.

/// Every MR a peer could aim at, and one for the control traffic.
struct Victim {
    pd: Pd,
    cq: Cq,
    /// The attacks' nominal target (REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC).
    target: Mr,
    /// REMOTE_READ only.
    readonly: Mr,
    /// Every right, never named by an attack.
    canary: Mr,
    /// Receive buffers.
    recv: Mr,
    /// Where the valid control WRITEs go.
    scratch: Mr,
    /// An MR of another PD (every right).
    foreign: Mr,
    _other_pd: Pd,
    /// The rkey of an MR that was deregistered.
    dereg_rkey: u32,
    dereg_addr: u64,
    next: u8,
}

const TARGET_LEN: usize = 8192;

impl Victim {
    fn new() -> Victim {
        let ctx = Context::open(&rxe_lo()).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let other_pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(1024, None).unwrap();
        let mr = |pd: &Pd, access: Access, seed: u64| {
            let m = pd.alloc_mr(TARGET_LEN, access).unwrap();
            m.write(0, &pattern(TARGET_LEN, seed)).unwrap();
            m
        };
        let gone = pd.alloc_mr(TARGET_LEN, ALL).unwrap();
        let (dereg_rkey, dereg_addr) = (gone.rkey(), gone.addr());
        gone.dereg().unwrap();
        Victim {
            target: mr(&pd, ALL, 1),
            readonly: mr(&pd, Access::REMOTE_READ, 2),
            canary: mr(&pd, ALL, 3),
            recv: mr(&pd, Access::LOCAL_WRITE, 4),
            scratch: mr(&pd, ALL, 5),
            foreign: mr(&other_pd, ALL, 6),
            _other_pd: other_pd,
            pd,
            cq,
            dereg_rkey,
            dereg_addr,
            next: 1,
        }
    }

    /// The protected memory, for before/after comparison.
    fn snapshot(&self) -> Vec<Vec<u8>> {
        [&self.target, &self.readonly, &self.canary, &self.recv, &self.foreign]
            .iter()
            .map(|m| m.to_vec())
            .collect()
    }

    fn assert_unchanged(&self, before: &[Vec<u8>], what: &str) {
        let names = ["target", "READ-only", "canary", "receive buffers", "foreign PD"];
        for ((b, a), name) in before.iter().zip(self.snapshot()).zip(names) {
            if let Some(i) = b.iter().zip(&a).position(|(x, y)| x != y) {
                panic!("{what}: {name} MR byte {i} changed from {:#04x} to {:#04x}", b[i], a[i]);
            }
        }
    }

    /// A fresh RC QP connected to the attacker's QPN `peer.qpn(i)`, with two 64-byte receives.
    fn qp(&mut self, peer: &RawPeer, rq_psn: u32) -> (Qp, u32) {
        let i = self.next;
        self.next += 1;
        let qp = new_qp(&self.pd, &self.cq, QpType::Rc);
        connect(&qp, peer.qpn(i), 0x100, rq_psn, 14);
        peer.answer_probes(peer.qpn(i), qp.qpn());
        for k in 0..2 {
            qp.post_recv_one(1000 + k, self.recv.sge(k as usize * 64, 64)).unwrap();
        }
        (qp, peer.qpn(i))
    }
}

/// The RETH (va, rkey, DMA length) an attack uses, from the victim's MRs.
type RethOf = dyn Fn(&Victim) -> (u64, u32, u32);

/// The home port the driver delivers a QPN's packets on.
fn home(qpn: u32) -> u16 {
    (qpn & 0xffff) as u16
}

/// Driver counter deltas since `before`.
fn delta(before: &DriverStats) -> DriverStats {
    let now = driver_stats();
    DriverStats {
        rx_datagrams: now.rx_datagrams - before.rx_datagrams,
        tx_datagrams: now.tx_datagrams - before.tx_datagrams,
        tx_errors: now.tx_errors - before.tx_errors,
        icrc_errors: now.icrc_errors - before.icrc_errors,
        malformed: now.malformed - before.malformed,
        unknown_qpn: now.unknown_qpn - before.unknown_qpn,
        wrong_source: now.wrong_source - before.wrong_source,
        gsi_dropped: now.gsi_dropped - before.gsi_dropped,
        unsupported: now.unsupported - before.unsupported,
        forwarded_in: now.forwarded_in - before.forwarded_in,
        forwarded_out: now.forwarded_out - before.forwarded_out,
    }
}

/// Waits (bounded) until `f` holds for the counters' deltas.
fn counted(before: &DriverStats, what: &str, f: impl Fn(&DriverStats) -> bool) {
    let until = Instant::now() + WAIT;
    loop {
        let d = delta(before);
        if f(&d) {
            return;
        }
        assert!(Instant::now() < until, "{what}: driver counters {d:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The next answer must be an ACK packet for `dest` at `psn` with AETH `kind`.
fn expect_aeth(peer: &RawPeer, dest: u32, psn: u32, want: impl Fn(AethKind) -> bool, what: &str) {
    let r = peer
        .recv(WAIT)
        .unwrap_or_else(|| panic!("{what}: no answer from the victim"));
    assert!(!r.forwarded, "{what}: answer was forwarded");
    let p = r.packet();
    let h = p.headers;
    assert_eq!(h.bth.opcode, RoceOpcode::RcAck, "{what}: {h:?}");
    assert_eq!(h.bth.dest_qp, dest, "{what}: answer to the wrong QPN");
    assert_eq!(h.bth.psn, psn, "{what}: answer for the wrong PSN");
    let kind = h.aeth.map(|a| a.kind()).unwrap();
    assert!(want(kind), "{what}: got {kind:?}");
}

fn expect_nak(peer: &RawPeer, dest: u32, psn: u32, code: NakCode, what: &str) {
    expect_aeth(peer, dest, psn, |k| k == AethKind::Nak(code), what);
}

fn expect_ack(peer: &RawPeer, dest: u32, psn: u32, what: &str) {
    expect_aeth(peer, dest, psn, |k| matches!(k, AethKind::Ack { .. }), what);
}

fn expect_quiet(peer: &RawPeer, what: &str) {
    if let Some(r) = peer.recv(QUIET) {
        panic!("{what}: expected no answer, got {:?}", r.packet().headers);
    }
}

/// The victim QP went to ERR with its receives completed (`first` for the first, then
/// WR_FLUSH_ERR).
fn expect_err(v: &Victim, qp: &Qp, first: WcStatus, what: &str) {
    let until = Instant::now() + WAIT;
    while qp.state() != QpState::Err {
        assert!(Instant::now() < until, "{what}: victim QP in {:?}, not ERR", qp.state());
        std::thread::sleep(Duration::from_millis(2));
    }
    let wcs = v.cq.wait_for(2, WAIT);
    let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        vec![(1000, first), (1001, WcStatus::WrFlushErr)],
        "{what}: receive completions"
    );
}

#[test]
fn rc_attacks_get_their_documented_outcome_while_honest_traffic_flows() {
    let _g = serial();
    let honest = Honest::start();
    let mut v = Victim::new();
    let peer = RawPeer::new(Ipv4Addr::LOCALHOST);
    let w = |va: u64, rkey: u32, len: u32| Some((va, rkey, len));
    let scratch = |v: &Victim| (v.scratch.addr(), v.scratch.rkey());

    // Bad ICRC: dropped; the same packet with a good ICRC is then placed.
    {
        let (qp, me) = v.qp(&peer, 7000);
        let before = (v.snapshot(), driver_stats());
        let (sva, skey) = scratch(&v);
        let data = pattern(200, 11);
        let p = rc_packet(RoceOpcode::RcWriteOnly, qp.qpn(), 7000, w(sva, skey, 200), &data);
        peer.send(home(qp.qpn()), &p, true);
        counted(&before.1, "bad ICRC", |d| d.icrc_errors == 1);
        expect_quiet(&peer, "bad ICRC");
        assert_eq!(qp.state(), QpState::Rts);
        peer.send(home(qp.qpn()), &p, false);
        expect_ack(&peer, me, 7000, "the same WRITE with a good ICRC");
        assert_eq!(&v.scratch.to_vec()[..200], &data[..]);
        v.assert_unchanged(&before.0, "bad ICRC");
        honest.progress("bad ICRC");
    }

    // PSN ahead: one NAK per gap; then in order; then a duplicate is ACKed, not executed.
    {
        let (qp, me) = v.qp(&peer, 0x00ff_fffe);
        let before = v.snapshot();
        let (sva, skey) = scratch(&v);
        let first = pattern(300, 12);
        let ahead = rc_packet(
            RoceOpcode::RcWriteOnly,
            qp.qpn(),
            3,
            w(sva, skey, 300),
            &pattern(300, 99),
        );
        peer.send(home(qp.qpn()), &ahead, false);
        expect_nak(&peer, me, 0x00ff_fffe, NakCode::PsnSequenceError, "PSN ahead");
        let ahead2 = rc_packet(
            RoceOpcode::RcWriteOnly,
            qp.qpn(),
            4,
            w(sva, skey, 300),
            &pattern(300, 98),
        );
        peer.send(home(qp.qpn()), &ahead2, false);
        expect_quiet(&peer, "second packet of the same gap");
        assert_eq!(qp.state(), QpState::Rts);
        assert_ne!(&v.scratch.to_vec()[..300], &pattern(300, 99)[..]);
        let ok = rc_packet(
            RoceOpcode::RcWriteOnly,
            qp.qpn(),
            0x00ff_fffe,
            w(sva, skey, 300),
            &first,
        );
        peer.send(home(qp.qpn()), &ok, false);
        expect_ack(&peer, me, 0x00ff_fffe, "in-order WRITE");
        let dup = rc_packet(
            RoceOpcode::RcWriteOnly,
            qp.qpn(),
            0x00ff_fffe,
            w(sva, skey, 300),
            &pattern(300, 97),
        );
        peer.send(home(qp.qpn()), &dup, false);
        expect_ack(&peer, me, 0x00ff_fffe, "duplicate WRITE");
        assert_eq!(&v.scratch.to_vec()[..300], &first[..], "a duplicate was executed");
        assert_eq!(qp.state(), QpState::Rts);
        v.assert_unchanged(&before, "wrong PSN");
        honest.progress("wrong PSN");
    }

    // Unknown QPNs, a QP before RTR, a stranger's address, malformed datagrams.
    {
        let (qp, _) = v.qp(&peer, 100);
        let before = (v.snapshot(), driver_stats());
        let (tva, tkey) = (v.target.addr(), v.target.rkey());
        let port = home(qp.qpn());
        let unknown = make_qpn(port, 250).unwrap();
        peer.send(
            port,
            &rc_packet(RoceOpcode::RcWriteOnly, unknown, 100, w(tva, tkey, 8), &[1; 8]),
            false,
        );
        peer.send(
            port,
            &rc_packet(RoceOpcode::RcWriteOnly, 0, 100, w(tva, tkey, 8), &[1; 8]),
            false,
        );
        counted(&before.1, "unknown QPN", |d| d.unknown_qpn == 2);
        let init_qp = new_qp(&v.pd, &v.cq, QpType::Rc);
        to_init(&init_qp);
        let p = rc_packet(RoceOpcode::RcWriteOnly, init_qp.qpn(), 0, w(tva, tkey, 8), &[2; 8]);
        peer.send(home(init_qp.qpn()), &p, false);
        counted(&before.1, "QP in INIT", |d| d.unknown_qpn == 3);
        let stranger = RawPeer::new(Ipv4Addr::new(127, 0, 0, 2));
        let p = rc_packet(RoceOpcode::RcWriteOnly, qp.qpn(), 100, w(tva, tkey, 8), &[3; 8]);
        stranger.send(port, &p, false);
        counted(&before.1, "stranger", |d| d.wrong_source == 1);
        peer.send_raw(port, &[0x0a, 0, 0, 0, 0, 0, 0, 1]);
        let mut garbage = rc_packet(RoceOpcode::RcWriteOnly, qp.qpn(), 100, w(tva, tkey, 8), &[4; 8]);
        garbage[0] = 0xee;
        peer.send(port, &garbage, false);
        counted(&before.1, "malformed", |d| d.malformed == 2);
        expect_quiet(&peer, "dropped datagrams");
        expect_quiet(&stranger, "stranger");
        assert_eq!((qp.state(), init_qp.state()), (QpState::Rts, QpState::Init));
        v.assert_unchanged(&before.0, "dropped datagrams");
        honest.progress("dropped datagrams");
    }

    // Access violations: NAK remote access error, QP to ERR, nothing written or read.
    let cases: Vec<(&str, RoceOpcode, Box<RethOf>, usize)> = vec![
        (
            "WRITE with an invalid rkey",
            RoceOpcode::RcWriteOnly,
            Box::new(|v: &Victim| (v.target.addr(), v.target.rkey() ^ 0x0000_4400, 64)),
            64,
        ),
        (
            "WRITE out of bounds",
            RoceOpcode::RcWriteOnly,
            Box::new(|v: &Victim| (v.target.addr() + TARGET_LEN as u64 - 32, v.target.rkey(), 64)),
            64,
        ),
        (
            "WRITE below the MR",
            RoceOpcode::RcWriteOnly,
            Box::new(|v: &Victim| (v.target.addr() - 8, v.target.rkey(), 64)),
            64,
        ),
        (
            "WRITE with an address that wraps",
            RoceOpcode::RcWriteOnly,
            Box::new(|v: &Victim| (u64::MAX - 15, v.target.rkey(), 64)),
            64,
        ),
        (
            "WRITE to a deregistered MR",
            RoceOpcode::RcWriteOnly,
            Box::new(|v: &Victim| (v.dereg_addr, v.dereg_rkey, 64)),
            64,
        ),
        (
            "WRITE to another PD's MR",
            RoceOpcode::RcWriteOnly,
            Box::new(|v: &Victim| (v.foreign.addr(), v.foreign.rkey(), 64)),
            64,
        ),
        (
            "WRITE to a READ-only MR",
            RoceOpcode::RcWriteOnly,
            Box::new(|v: &Victim| (v.readonly.addr(), v.readonly.rkey(), 64)),
            64,
        ),
        (
            "WRITE FIRST running past the MR",
            RoceOpcode::RcWriteFirst,
            Box::new(|v: &Victim| (v.target.addr() + 4096, v.target.rkey(), 8192)),
            1024,
        ),
        (
            "READ larger than the MR",
            RoceOpcode::RcReadRequest,
            Box::new(|v: &Victim| (v.readonly.addr(), v.readonly.rkey(), TARGET_LEN as u32 + 1)),
            0,
        ),
        (
            "READ of another PD's MR",
            RoceOpcode::RcReadRequest,
            Box::new(|v: &Victim| (v.foreign.addr(), v.foreign.rkey(), 64)),
            0,
        ),
    ];
    for (name, op, reth, len) in &cases {
        let (qp, me) = v.qp(&peer, 500);
        let before = v.snapshot();
        let r = reth(&v);
        let p = rc_packet(*op, qp.qpn(), 500, Some(r), &pattern(*len, 13));
        peer.send(home(qp.qpn()), &p, false);
        expect_nak(&peer, me, 500, NakCode::RemoteAccessError, name);
        expect_err(&v, &qp, WcStatus::WrFlushErr, name);
        // The QP is dead: a valid WRITE now is dropped without an answer.
        let (tva, tkey) = (v.target.addr(), v.target.rkey());
        let p = rc_packet(RoceOpcode::RcWriteOnly, qp.qpn(), 501, w(tva, tkey, 16), &[0xcc; 16]);
        peer.send(home(qp.qpn()), &p, false);
        expect_quiet(&peer, name);
        v.assert_unchanged(&before, name);
        honest.progress(name);
    }

    // Invalid requests: NAK invalid request.
    {
        let (qp, me) = v.qp(&peer, 900);
        let before = v.snapshot();
        let p = rc_packet(RoceOpcode::RcSendOnly, qp.qpn(), 900, None, &pattern(100, 14));
        peer.send(home(qp.qpn()), &p, false);
        expect_nak(&peer, me, 900, NakCode::InvalidRequest, "SEND larger than the receive");
        expect_err(&v, &qp, WcStatus::LocLenErr, "SEND larger than the receive");
        // The receive buffer may hold nothing of it: the length is checked before placing.
        v.assert_unchanged(&before, "SEND larger than the receive");
        honest.progress("SEND larger than the receive");
    }
    {
        let (qp, me) = v.qp(&peer, 950);
        let before = v.snapshot();
        let p = rc_packet(RoceOpcode::RcSendMiddle, qp.qpn(), 950, None, &pattern(1024, 15));
        peer.send(home(qp.qpn()), &p, false);
        expect_nak(&peer, me, 950, NakCode::InvalidRequest, "MIDDLE without FIRST");
        expect_err(&v, &qp, WcStatus::WrFlushErr, "MIDDLE without FIRST");
        v.assert_unchanged(&before, "MIDDLE without FIRST");
        honest.progress("MIDDLE without FIRST");
    }
    let n = honest.stop();
    assert!(n > 10, "honest iterations: {n}");
}

#[test]
fn ud_datagram_with_a_forged_qkey_is_dropped() {
    let _g = serial();
    let honest = Honest::start();
    let ctx = Context::open(&rxe_lo()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = new_qp(&pd, &cq, QpType::Ud);
    let a = QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: 0,
        port_num: 1,
        qkey: 0x1111_1111,
        ..QpAttr::default()
    };
    qp.modify(&a, STATE | PKEY_INDEX | PORT | QKEY).unwrap();
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Rtr),
            ..QpAttr::default()
        },
        STATE,
    )
    .unwrap();
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Rts),
            ..QpAttr::default()
        },
        STATE | SQ_PSN,
    )
    .unwrap();
    let buf = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    qp.post_recv_one(1, buf.sge(0, 4096)).unwrap();
    let peer = RawPeer::new(Ipv4Addr::LOCALHOST);
    let forged = ud_packet(qp.qpn(), 0x2222_2222, 0x99, &pattern(100, 1));
    peer.send(home(qp.qpn()), &forged, false);
    std::thread::sleep(QUIET);
    assert!(cq.poll_one().is_none(), "a datagram with a forged Q_Key was delivered");
    assert_eq!(buf.to_vec(), vec![0u8; 4096]);
    let good = ud_packet(qp.qpn(), 0x1111_1111, 0x99, &pattern(100, 2));
    peer.send(home(qp.qpn()), &good, false);
    let wc = cq.wait_for(1, WAIT);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].status, wc[0].byte_len, wc[0].src_qp),
        (WcStatus::Success, 140, 0x99)
    );
    assert_eq!(&buf.to_vec()[40..140], &pattern(100, 2)[..]);
    honest.progress("forged Q_Key");
    honest.stop();
}

/// Linux rdma_rxe builds its own IPv4 header: DF and a non-zero, incrementing Identification,
/// which the ICRC covers and a UDP socket does not show. The receive path recovers them from
/// the ICRC (issue #13): WRITEs whose ICRC was computed with ID 0x1234 + DF and with ID
/// 0xbeef without DF are placed and ACKed; the same WRITE with one payload bit flipped after
/// the ICRC was computed is dropped and counted.
#[test]
fn icrc_with_a_kernel_style_ipv4_id_is_accepted() {
    use softrdma_wire::roce::{append_icrc, IcrcIp};
    let _g = serial();
    let mut v = Victim::new();
    let peer = RawPeer::new(Ipv4Addr::LOCALHOST);
    let (qp, me) = v.qp(&peer, 500);
    let (sva, skey) = (v.scratch.addr(), v.scratch.rkey());
    let datagram = |psn: u32, data: &[u8], id: u16, dont_fragment: bool| {
        let mut d = rc_packet(RoceOpcode::RcWriteOnly, qp.qpn(), psn, Some((sva, skey, 200)), data);
        let ip = IcrcIp::V4 {
            src: peer.ip,
            dst: Ipv4Addr::LOCALHOST,
            id,
            dont_fragment,
        };
        append_icrc(&ip, peer.port, home(qp.qpn()), &mut d, 0);
        d
    };
    let before = (v.snapshot(), driver_stats());

    let data = pattern(200, 21);
    peer.send_raw(home(qp.qpn()), &datagram(500, &data, 0x1234, true));
    expect_ack(&peer, me, 500, "ICRC with IPv4 ID 0x1234 and DF");
    assert_eq!(&v.scratch.to_vec()[..200], &data[..]);

    let data = pattern(200, 22);
    peer.send_raw(home(qp.qpn()), &datagram(501, &data, 0xbeef, false));
    expect_ack(&peer, me, 501, "ICRC with IPv4 ID 0xbeef, no DF");
    assert_eq!(&v.scratch.to_vec()[..200], &data[..]);
    assert_eq!(delta(&before.1).icrc_errors, 0);

    let mut bad = datagram(502, &pattern(200, 23), 0x1235, true);
    bad[40] ^= 0x10;
    peer.send_raw(home(qp.qpn()), &bad);
    counted(&before.1, "corrupted WRITE with IPv4 ID 0x1235", |d| d.icrc_errors == 1);
    expect_quiet(&peer, "corrupted WRITE");
    assert_eq!(&v.scratch.to_vec()[..200], &data[..], "a corrupted WRITE was placed");
    assert_eq!(qp.state(), QpState::Rts);

    let data = pattern(200, 24);
    peer.send_raw(home(qp.qpn()), &datagram(502, &data, 0x1236, true));
    expect_ack(&peer, me, 502, "the next WRITE, ID 0x1236");
    assert_eq!(&v.scratch.to_vec()[..200], &data[..]);
    v.assert_unchanged(&before.0, "kernel-style IPv4 ID");
    assert_eq!(delta(&before.1).icrc_errors, 1);
}

/// A QPN or communication ID names its owner's home port; a hostile peer can name any port.
/// Packets for a port that is not a softrdma home port are dropped, not relayed into whatever
/// else listens on 127.0.0.1 there.
#[test]
fn packets_naming_a_foreign_port_are_not_relayed_to_it() {
    let _g = serial();
    let honest = Honest::start();
    // A plain UDP socket of some other program, on an ephemeral port like every home port.
    let bystander = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let x = bystander.local_addr().unwrap().port();
    let home = softrdma_roce::gsi::comm_id_port().unwrap();
    let mut peer = RawPeer::new(Ipv4Addr::LOCALHOST);
    let before = driver_stats();
    let p = rc_packet(
        RoceOpcode::RcWriteOnly,
        make_qpn(x, 1).unwrap(),
        0,
        Some((0x1000, 0x1234, 8)),
        &[0x41; 8],
    );
    peer.send(home, &p, false);
    let dreq = CmMad {
        tid: 1,
        msg: CmMessage::Dreq(softrdma_wire::ibcm::Dreq {
            local_comm_id: peer.comm_id(1),
            remote_comm_id: (1 << 16) | u32::from(x),
            ..Default::default()
        }),
    };
    peer.send_mad(home, &dreq.emit(), GSI_QKEY, false);
    // A bad ICRC is dropped at the first hop, whoever the packet names.
    peer.send(home, &p, true);
    counted(&before, "foreign port", |d| d.unknown_qpn == 2 && d.icrc_errors == 1);
    let d = delta(&before);
    assert_eq!(d.forwarded_out, 0, "{d:?}");
    bystander.set_read_timeout(Some(QUIET)).unwrap();
    let mut buf = [0u8; 2048];
    if let Ok((n, from)) = bystander.recv_from(&mut buf) {
        panic!(
            "{n} bytes relayed from {from} to a non-softrdma port: {:02x?}",
            &buf[..n.min(48)]
        );
    }
    honest.progress("foreign port");
    honest.stop();
}

// ---------------------------------------------------------------------------------------------
// The IB CM listener.

const BACKLOG: i32 = 4;

fn roce_id(ch: Option<&EventChannel>) -> CmId {
    let id = CmId::create(ch, PortSpace::Tcp).unwrap();
    id.set_option(CmOption::Transport(Some(TransportKind::Roce))).unwrap();
    id.set_option(CmOption::CmResponseTimeout(Duration::from_millis(300)))
        .unwrap();
    id.set_option(CmOption::CmRetries(3)).unwrap();
    id
}

/// A REQ from the attacker (`comm_id`) to the listener's service, with a CMA header unless
/// `cma` is None.
fn req(comm_id: u32, port: u16, cma: Option<CmaHeader>) -> CmMad {
    let mut private_data = [0u8; REQ_PRIVATE_LEN];
    if let Some(h) = cma {
        private_data[..CMA_HDR_LEN].copy_from_slice(&h.emit().unwrap());
    }
    CmMad {
        tid: u64::from(comm_id),
        msg: CmMessage::Req(Req {
            local_comm_id: comm_id,
            service_id: service_id(softrdma_wire::ibcm::PortSpace::Tcp, port),
            local_qpn: 0x00_4242,
            starting_psn: 0x1234,
            remote_cm_response_timeout: 16,
            local_cm_response_timeout: 16,
            max_cm_retries: 2,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: 3,
            responder_resources: 1,
            initiator_depth: 1,
            private_data,
            ..Req::default()
        }),
    }
}

fn cma(src_port: u16) -> Option<CmaHeader> {
    Some(CmaHeader {
        src_port,
        src: IpAddr::V4(Ipv4Addr::LOCALHOST),
        dst: IpAddr::V4(Ipv4Addr::LOCALHOST),
    })
}

/// The next MAD forwarded to the attacker.
fn expect_mad(peer: &RawPeer, what: &str) -> CmMad {
    expect_mad_within(peer, WAIT, what)
}

/// The next MAD forwarded to the attacker within `wait`.
fn expect_mad_within(peer: &RawPeer, wait: Duration, what: &str) -> CmMad {
    mad_within(peer, wait, what).unwrap_or_else(|| panic!("{what}: no MAD"))
}

/// The next datagram forwarded to the attacker within `wait`, which must be a CM MAD; None
/// if nothing came.
fn mad_within(peer: &RawPeer, wait: Duration, what: &str) -> Option<CmMad> {
    let r = peer.recv(wait)?;
    Some(
        r.mad()
            .unwrap_or_else(|| panic!("{what}: not a CM MAD: {:?}", r.packet().headers)),
    )
}

fn expect_rej(peer: &RawPeer, to: u32, reason: RejReason, what: &str) -> Rej {
    let m = expect_mad(peer, what);
    let CmMessage::Rej(rej) = m.msg else {
        panic!("{what}: expected a REJ, got {:?}", m.msg.attr())
    };
    assert_eq!(rej.remote_comm_id, to, "{what}");
    assert_eq!(rej.reason, reason, "{what}");
    rej
}

fn no_event(ch: &EventChannel, what: &str) {
    if let Ok(ev) = ch.get_event(Some(Duration::from_millis(100))) {
        panic!("{what}: unexpected {} (status {})", ev.event, ev.status);
    }
}

/// An honest rdma_cm client connection to `addr`: connect, accept, one verified SEND.
fn honest_cm_connection(chs: &EventChannel, addr: SocketAddr) {
    let chc = EventChannel::new().unwrap();
    let c = roce_id(Some(&chc));
    c.resolve_addr(None, addr, 2000).unwrap();
    assert_eq!(chc.get_event(Some(WAIT)).unwrap().event, EventType::AddrResolved);
    c.resolve_route(2000).unwrap();
    assert_eq!(chc.get_event(Some(WAIT)).unwrap().event, EventType::RouteResolved);
    let side = |id: &CmId| {
        let ctx = id.context().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let init = QpInitAttr::rc(&cq, 4, 4);
        let qp = id.create_qp(&pd, init).unwrap();
        (pd, cq, qp)
    };
    let (cpd, ccq, cqp) = side(&c);
    let param = ConnParam {
        private_data: b"honest".to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    };
    c.connect(&param).unwrap();
    let ev = chs.get_event(Some(WAIT)).unwrap();
    assert_eq!(ev.event, EventType::ConnectRequest, "honest connection: {}", ev.reason);
    assert_eq!(&ev.param.private_data[..6], b"honest");
    let s = ev.id.clone();
    drop(ev);
    let (spd, scq, sqp) = side(&s);
    s.accept(Some(&param)).unwrap();
    assert_eq!(chc.get_event(Some(WAIT)).unwrap().event, EventType::Established);
    assert_eq!(chs.get_event(Some(WAIT)).unwrap().event, EventType::Established);
    let rbuf = spd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    sqp.post_recv_one(1, rbuf.sge(0, 64)).unwrap();
    let sbuf = cpd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    sbuf.write(0, b"after the flood").unwrap();
    cqp.post_send_one(SendWr::send(2, vec![sbuf.sge(0, 15)])).unwrap();
    wait_ok(&ccq, 1, "honest CM SEND").unwrap();
    wait_ok(&scq, 1, "honest CM receive").unwrap();
    assert_eq!(&rbuf.to_vec()[..15], b"after the flood");
    c.disconnect().unwrap();
    for id in [c, s] {
        let _ = id.destroy_qp();
        id.destroy().unwrap();
    }
}

#[test]
fn cm_attacks_on_a_live_listener() {
    let _g = serial();
    let honest = Honest::start();
    let chs = EventChannel::new().unwrap();
    let l = roce_id(Some(&chs));
    l.bind_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    l.listen(BACKLOG).unwrap();
    let addr = l.local_addr().unwrap();
    let lport = addr.port();
    // QP1 of this process: its first home port (where same-host MADs are delivered).
    let gsi = softrdma_roce::gsi::comm_id_port().unwrap();
    let mut peer = RawPeer::new(Ipv4Addr::LOCALHOST);
    // The attacker poses as a softrdma process of this host, so the CM's answers reach it.
    let _marker = peer.mark_home();
    let mut k = 0u16;
    let mut next_id = || {
        k += 1;
        k
    };

    // A truncated MAD, a forged Q_Key, a bad ICRC, an unknown attribute: dropped by the driver.
    let before = driver_stats();
    let id = peer.comm_id(next_id());
    let full = req(id, lport, cma(40001));
    peer.send_mad(gsi, &mad_bytes(&full, 100), GSI_QKEY, false);
    counted(&before, "truncated MAD", |d| d.malformed == 1);
    peer.send_mad(gsi, &mad_bytes(&full, MAD_LEN), 0x8001_0001, false);
    counted(&before, "forged Q_Key", |d| d.malformed == 2);
    peer.send_mad(gsi, &mad_bytes(&full, MAD_LEN), GSI_QKEY, true);
    counted(&before, "bad ICRC", |d| d.icrc_errors == 1);
    let mut unknown = mad_bytes(&full, MAD_LEN);
    unknown[16..18].copy_from_slice(&0x0099u16.to_be_bytes());
    peer.send_mad(gsi, &unknown, GSI_QKEY, false);
    counted(&before, "unknown attribute", |d| d.malformed == 3);
    // A garbage MAD header on a REQ for the listener: the CM drops it.
    let mut bad_hdr = mad_bytes(&full, MAD_LEN);
    bad_hdr[2] = 9;
    bad_hdr[3] = 0x81;
    peer.send_mad(gsi, &bad_hdr, GSI_QKEY, false);
    if let Some(r) = peer.recv(QUIET) {
        panic!("dropped MADs: got {:?}", r.packet().headers);
    }
    no_event(&chs, "dropped MADs");
    honest.progress("dropped MADs");

    // A REQ nobody listens for: the driver answers REJ 8.
    let id = peer.comm_id(next_id());
    let nobody = lport.wrapping_add(1).max(1);
    peer.send_mad(gsi, &req(id, nobody, cma(40002)).emit(), GSI_QKEY, false);
    expect_rej(
        &peer,
        id,
        RejReason::InvalidServiceId,
        "REQ for a service nobody listens on",
    );

    // A garbage CMA header: REJ 28 with the reason, no event.
    let id = peer.comm_id(next_id());
    let mut m = req(id, lport, cma(40003));
    if let CmMessage::Req(r) = &mut m.msg {
        r.private_data[0] = 7;
        r.private_data[1] = 0x90;
    }
    peer.send_mad(gsi, &m.emit(), GSI_QKEY, false);
    let rej = expect_rej(&peer, id, RejReason::ConsumerDefined, "garbage CMA header");
    let text = String::from_utf8_lossy(&rej.private_data);
    assert!(text.starts_with("bad CMA header"), "REJ private data: {text}");
    no_event(&chs, "garbage CMA header");

    // Garbage QP fields with a valid CMA header: an ordinary request; rejecting it sends REJ 28.
    let id = peer.comm_id(next_id());
    let mut m = req(id, lport, cma(40004));
    if let CmMessage::Req(r) = &mut m.msg {
        r.local_qpn = 0x00ff_ffff;
        r.starting_psn = 0x00ff_ffff;
        r.path_mtu = 15;
        r.remote_cm_response_timeout = 31;
        r.local_cm_response_timeout = 31;
        r.max_cm_retries = 15;
        r.transport_service_type = 3;
        r.responder_resources = 255;
        r.initiator_depth = 255;
        r.primary_path.local_ack_timeout = 31;
    }
    peer.send_mad(gsi, &m.emit(), GSI_QKEY, false);
    let ev = chs.get_event(Some(WAIT)).unwrap();
    assert_eq!(ev.event, EventType::ConnectRequest);
    ev.id.reject(b"no").unwrap();
    let child = ev.id.clone();
    drop(ev);
    expect_rej(&peer, id, RejReason::ConsumerDefined, "rejected garbage-field REQ");
    child.destroy().unwrap();
    honest.progress("garbage REQs");

    // A flood beyond the backlog: BACKLOG requests reach the application, the rest are dropped.
    let flood: Vec<u32> = (0..3 * BACKLOG as u16).map(|_| peer.comm_id(next_id())).collect();
    for (i, &id) in flood.iter().enumerate() {
        peer.send_mad(gsi, &req(id, lport, cma(41000 + i as u16)).emit(), GSI_QKEY, false);
    }
    let mut held: Vec<CmEvent> = Vec::new();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        if let Ok(ev) = chs.get_event(Some(Duration::from_millis(100))) {
            assert_eq!(ev.event, EventType::ConnectRequest);
            held.push(ev);
        }
    }
    assert_eq!(
        held.len(),
        BACKLOG as usize,
        "requests beyond the backlog must not reach the application"
    );
    // While the backlog is full, a burst of 20,000 more: all dropped, none answered.
    let burst = req(peer.comm_id(next_id()), lport, cma(42000)).emit();
    for _ in 0..20_000 {
        peer.send_mad(gsi, &burst, GSI_QKEY, false);
    }
    // A sentinel behind the burst: a DREQ for a connection this process does not have. It
    // joins the CM's queue behind the burst and gets its DREP (as in Linux cm.c) only when the
    // CM reaches it, so a DREP arriving first proves the CM has worked through the burst and
    // answered none of it. (A slow build, e.g. ASan, may take seconds; a burst REQ still
    // queued when the backlog frees would be a legitimate new request.) The burst can fill the
    // socket's receive buffer, which then drops the sentinel too (seen under ASan), so it is
    // resent every 2 s, as a CM resends an unanswered DREQ; each copy queues behind whatever
    // of the burst is still waiting.
    let sentinel = peer.comm_id(next_id());
    let dreq = CmMad {
        tid: u64::from(sentinel),
        msg: CmMessage::Dreq(softrdma_wire::ibcm::Dreq {
            local_comm_id: sentinel,
            remote_comm_id: (0xfffe << 16) | u32::from(gsi),
            ..Default::default()
        }),
    }
    .emit();
    let until = Instant::now() + Duration::from_secs(120);
    const WHAT: &str = "the sentinel DREQ behind the burst";
    let m = loop {
        peer.send_mad(gsi, &dreq, GSI_QKEY, false);
        if let Some(m) = mad_within(&peer, Duration::from_secs(2), WHAT) {
            break m;
        }
        assert!(Instant::now() < until, "{WHAT}: no MAD in 120 s");
    };
    // Copies sent after the one answered queue right behind it: their DREPs follow at once.
    let late_until = Instant::now() + Duration::from_secs(1);
    let late = std::iter::from_fn(|| mad_within(&peer, late_until.saturating_duration_since(Instant::now()), WHAT));
    for m in std::iter::once(m).chain(late) {
        match m.msg {
            CmMessage::Drep(d) if d.remote_comm_id == sentinel => {}
            other => panic!("a request beyond the backlog was answered: {:?}", other.attr()),
        }
    }
    no_event(&chs, "burst beyond the backlog");
    honest.progress("REQ flood");
    // The application rejects what it holds: one REJ 28 each, to the first BACKLOG requests.
    let mut rejected = Vec::new();
    for ev in held {
        ev.id.reject(&[]).unwrap();
        rejected.push(ev.id.clone());
        drop(ev);
    }
    let mut to: Vec<u32> = (0..BACKLOG)
        .map(|_| {
            let m = expect_mad(&peer, "REJ for a held request");
            let CmMessage::Rej(r) = m.msg else {
                panic!("{:?}", m.msg.attr())
            };
            assert_eq!(r.reason, RejReason::ConsumerDefined);
            r.remote_comm_id
        })
        .collect();
    to.sort_unstable();
    assert_eq!(to, flood[..BACKLOG as usize].to_vec());
    for id in rejected {
        id.destroy().unwrap();
    }

    // The listener keeps working (the CM has worked through the burst by now).
    let t = Instant::now();
    honest_cm_connection(&chs, addr);
    assert!(t.elapsed() < WAIT, "honest connection took {:?}", t.elapsed());
    honest.progress("honest CM connection");
    l.destroy().unwrap();
    honest.stop();
}
