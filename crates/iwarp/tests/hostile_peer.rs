//! A hostile peer against a live soft-iWARP listener (issue #6, part 2).
//!
//! The victim is a [`Listener`] whose application thread accepts every connection request with
//! a fresh QP in the victim's protection domain (two receives posted). The victim PD also holds
//! a canary MR (all remote rights, must never change), a scratch MR (the target of the valid
//! control traffic), a READ-only MR, the old rkey of a deregistered MR, and an MR of another PD.
//! A second, honest softrdma connection to the same listener moves SEND + WRITE + READ traffic
//! with verified contents on a background thread during every attack, and must keep completing.
//!
//! The attacker is a raw `std::net::TcpStream` (`hostile/mod.rs`) that performs the MPA exchange
//! itself as the initiator (revision 2, CRC as chosen) and then sends FPDUs built with the
//! `softrdma-wire` encoders. After every attack: the documented outcome arrives within 5 s, the
//! canary, READ-only, foreign-PD and deregistered memory are unchanged byte for byte, the victim
//! QP is in ERR with its receives flushed, and the honest connection completes more verified
//! iterations.
//!
//! | attack | outcome on the wire | victim QP / application |
//! |---|---|---|
//! | garbage instead of an MPA Request (text, binary) | closed, no MPA Reply | nothing delivered |
//! | MPA Request with PD_Length 513 / 0xFFFF | closed from the 20-byte header alone, no Reply | nothing delivered |
//! | MPA Reply instead of a Request; enhanced flag with revision 1 | closed, no Reply | nothing delivered |
//! | MPA Request asking for markers | MPA Reply with the Reject flag, closed | nothing delivered |
//! | bad MPA CRC | Terminate LLP / MPA error / CRC error (2/0/2) | ERR, receives flushed, nothing placed |
//! | FPDU length runs past the segment (CRC on; the next FPDU's bytes complete it) | Terminate 2/0/2 | ERR, flushed |
//! | FPDU length runs past the segment, then FIN (CRC off) | closed, no Terminate | ERR, flushed |
//! | ULPDU shorter than a DDP header | Terminate DDP / local catastrophic (1/0/0) | ERR, flushed |
//! | unknown RDMAP opcode (8, 15) | Terminate RDMAP / remote operation / unexpected opcode (0/2/6) | ERR, flushed |
//! | DDP version 2 (tagged / untagged segment) | Terminate DDP tagged 1/1/4 / untagged 1/2/6 | ERR, flushed |
//! | WRITE with an invalid STag; to a deregistered MR | Terminate DDP / tagged buffer / invalid STag (1/1/0), header echoed | ERR, flushed |
//! | WRITE out of bounds (past the end, below the base, TO wrap) | Terminate DDP / tagged / base or bounds (1/1/1), echoed | ERR, flushed, no partial write |
//! | WRITE to an MR of another PD | Terminate DDP / tagged / STag not associated (1/1/2), echoed | ERR, flushed |
//! | WRITE to a READ-only MR | Terminate RDMAP / remote protection / access rights (0/1/2), echoed | ERR, flushed |
//! | READ larger than the MR, or past its end | Terminate RDMAP / remote protection / base or bounds (0/1/1), DDP + RDMAP headers echoed, no Read Response | ERR, flushed |
//! | READ of another PD's MR / invalid STag | Terminate 0/1/3 / 0/1/0, echoed | ERR, flushed |
//! | READ Request with a wrong MSN | Terminate DDP / untagged / invalid MSN range (1/2/3) | ERR, flushed |
//! | more READ Requests than IRD at once | Terminate RDMAP / remote operation / catastrophic stream (0/2/7) | ERR, flushed |
//! | Read Response with no READ outstanding | Terminate 0/2/6 | ERR, flushed |
//! | SEND larger than the posted receive | Terminate DDP / untagged / message too long (1/2/5) | receive LOC_LEN_ERR, then flushed |
//! | SEND with Invalidate naming another PD's STag | Terminate RDMAP / remote operation / STag cannot be invalidated (0/2/9) | receive completes, then flushed; the STag stays valid |
//! | Terminate from the peer | closed, nothing sent back | ERR, flushed |
//! | peer that stops reading (victim's send path full), then errs, then FIN | closed at the FIN; no busy loop | ERR, flushed |
//! | the same without FIN | closed after `TERMINATE_LINGER` (5 s) | ERR, flushed |
//! | valid WRITEs pipelined right behind the MPA Request (control) | all placed, in order | — |
//! | requests beyond the listener's backlog | MPA Reply with the Reject flag, closed | not delivered (`pending` stays at the backlog) |
//! | requests whose peer hangs up before the application decides | closed at once (no busy loop) | `accept` fails with ECONNRESET |
//! | flood: 2000 connections (garbage, slowloris half requests, silent, valid requests the application rejects) | garbage closed at once, slowloris/silent closed after the handshake timeout, valid ones get an MPA reject | honest connections keep being accepted; fd count returns to the baseline |
//! | out of file descriptors (EMFILE) while connections arrive | accept pauses and retries every 100 ms (no busy loop), resumes when fds free up | established connections keep moving data |

mod common;
mod hostile;

use hostile::*;
use softrdma_iwarp::{connect_blocking, ConnEvent, ConnHandle, ConnRequest, ConnectParams, EventSink, Listener};
use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::*;
use softrdma_wire::{crc32c, term, DdpHeader, Opcode, SegmentHeader, TermLayer, READ_REQUEST_LEN};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The tests of this file run one at a time: they count the process's file descriptors and
/// measure the progress thread's CPU time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const ALL: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
/// How long a victim that sent a Terminate waits for the peer to take it (driver constant).
const LINGER: Duration = softrdma_iwarp::driver::TERMINATE_LINGER;

type Events = Arc<Mutex<Vec<ConnEvent>>>;

fn recorder() -> (Events, EventSink) {
    let ev: Events = Arc::default();
    let e2 = ev.clone();
    (ev, Arc::new(move |e| e2.lock().unwrap().push(e)))
}

fn new_qp(pd: &Pd, cq: &Cq) -> Qp {
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
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    let qp = Qp::new(pd, init, AttrRules::Iwarp).unwrap();
    let attr = QpAttr {
        qp_state: Some(QpState::Init),
        qp_access_flags: ALL,
        ..QpAttr::default()
    };
    qp.modify(&attr, attr_mask::STATE | attr_mask::ACCESS_FLAGS).unwrap();
    qp
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed.wrapping_mul(7919)) as u8 ^ 0xa5)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The victim: a listener, its application thread, and the memory a peer must not change.

/// One connection the victim's application accepted for an attacker.
struct Accepted {
    qp: Qp,
    cq: Cq,
    handle: ConnHandle,
    events: Events,
    _recv: Mr,
}

struct Shared {
    ctx: Context,
    pd: Pd,
    accepted: Mutex<HashMap<SocketAddr, Arc<Accepted>>>,
    accept_errors: Mutex<Vec<String>>,
    requests: AtomicUsize,
    held: Mutex<Vec<ConnRequest>>,
    honest_slots: Mutex<VecDeque<(Qp, EventSink)>>,
    stop: AtomicBool,
}

/// The application's policy, by the request's private data: `honest*` takes the next prepared
/// honest QP, `hold*` is left undecided, `flood*` is rejected, anything else is accepted with a
/// fresh QP of the victim PD (two 4 KiB receives posted).
fn decide(sh: &Shared, req: ConnRequest) {
    sh.requests.fetch_add(1, Ordering::SeqCst);
    let pd = req.private_data.clone();
    if pd.starts_with(b"honest") {
        let slot = sh.honest_slots.lock().unwrap().pop_front();
        match slot {
            Some((qp, sink)) => {
                if let Err(e) = req.accept(&qp, params(b"", true), sink) {
                    sh.accept_errors.lock().unwrap().push(format!("honest: {e}"));
                }
            }
            None => drop(req),
        }
    } else if pd.starts_with(b"hold") {
        sh.held.lock().unwrap().push(req);
    } else if pd.starts_with(b"flood") {
        let _ = req.reject(b"go away");
    } else {
        let cq = sh.ctx.create_cq(64, None).unwrap();
        let qp = new_qp(&sh.pd, &cq);
        let recv = sh.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        qp.post_recv_one(1, recv.sge(0, 4096)).unwrap();
        qp.post_recv_one(2, recv.sge(0, 4096)).unwrap();
        let (events, sink) = recorder();
        let peer = req.peer_addr;
        match req.accept(&qp, params(b"", false), sink) {
            Ok(handle) => {
                let a = Accepted {
                    qp,
                    cq,
                    handle,
                    events,
                    _recv: recv,
                };
                sh.accepted.lock().unwrap().insert(peer, Arc::new(a));
            }
            Err(e) => sh.accept_errors.lock().unwrap().push(format!("{peer}: {e}")),
        }
    }
}

fn params(private_data: &[u8], crc: bool) -> ConnectParams {
    ConnectParams {
        private_data: private_data.to_vec(),
        crc,
        timeout: Duration::from_secs(5),
        ..ConnectParams::default()
    }
}

struct Victim {
    listener: Listener,
    sh: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    canary: Mr,
    scratch: Mr,
    readonly: Mr,
    _other_pd: Pd,
    foreign: Mr,
    other_pd_id: u64,
    dereg_rkey: u32,
    dereg_addr: u64,
    dereg_backing: Box<[u8]>,
    snapshots: Vec<(&'static str, Vec<u8>)>,
}

const CANARY_LEN: usize = 64 << 10;
const SCRATCH_LEN: usize = 2 << 20;
const READONLY_LEN: usize = 1 << 20;

impl Victim {
    fn new(backlog: u32) -> Victim {
        let ctx = Context::open(&common::lo_device()).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let other_pd = ctx.alloc_pd().unwrap();
        let canary = pd.alloc_mr(CANARY_LEN, ALL).unwrap();
        canary.write(0, &pattern(CANARY_LEN, 1)).unwrap();
        let scratch = pd.alloc_mr(SCRATCH_LEN, ALL).unwrap();
        let readonly = pd.alloc_mr(READONLY_LEN, Access::REMOTE_READ).unwrap();
        readonly.write(0, &pattern(READONLY_LEN, 2)).unwrap();
        let foreign = other_pd.alloc_mr(CANARY_LEN, ALL).unwrap();
        foreign.write(0, &pattern(CANARY_LEN, 3)).unwrap();
        let mut dereg_backing = pattern(4096, 4).into_boxed_slice();
        // SAFETY: the backing outlives the registration, which ends two lines below.
        let gone = unsafe { pd.reg_mr_raw(dereg_backing.as_mut_ptr(), 4096, 0x7000_0000, ALL) }.unwrap();
        let (dereg_rkey, dereg_addr) = (gone.rkey(), gone.addr());
        gone.dereg().unwrap();
        assert!(mr::lookup_key(dereg_rkey).is_err());

        let (listener, rx) = Listener::bind_queue("127.0.0.1:0".parse().unwrap(), backlog).unwrap();
        let sh = Arc::new(Shared {
            ctx,
            pd,
            accepted: Mutex::default(),
            accept_errors: Mutex::default(),
            requests: AtomicUsize::new(0),
            held: Mutex::default(),
            honest_slots: Mutex::default(),
            stop: AtomicBool::new(false),
        });
        let sh2 = sh.clone();
        let acceptor = std::thread::spawn(move || {
            while !sh2.stop.load(Ordering::SeqCst) {
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(req) => decide(&sh2, req),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(_) => break,
                }
            }
        });
        let mut v = Victim {
            listener,
            sh,
            acceptor: Some(acceptor),
            other_pd_id: other_pd.id(),
            _other_pd: other_pd,
            canary,
            scratch,
            readonly,
            foreign,
            dereg_rkey,
            dereg_addr,
            dereg_backing,
            snapshots: Vec::new(),
        };
        v.snapshots = v.memory();
        v
    }

    fn addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    fn memory(&self) -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("canary", self.canary.to_vec()),
            ("scratch", self.scratch.to_vec()),
            ("READ-only MR", self.readonly.to_vec()),
            ("other PD's MR", self.foreign.to_vec()),
            ("deregistered MR", self.dereg_backing.to_vec()),
        ]
    }

    /// Every protected byte is as it was (the scratch MR as of the last [`Victim::resnap`]).
    fn assert_memory_intact(&self, after: &str) {
        for ((name, want), (_, got)) in self.snapshots.iter().zip(self.memory()) {
            if let Some(at) = want.iter().zip(&got).position(|(a, b)| a != b) {
                panic!(
                    "after `{after}`: {name} changed at byte {at} (crc32c {:#010x} -> {:#010x})",
                    crc32c(want),
                    crc32c(&got)
                );
            }
        }
    }

    fn resnap(&mut self) {
        self.snapshots = self.memory();
    }

    fn requests(&self) -> usize {
        self.sh.requests.load(Ordering::SeqCst)
    }

    /// The connection the application accepted for the raw peer at `peer`.
    fn accepted(&self, peer: SocketAddr) -> Arc<Accepted> {
        let mut found = None;
        let ok = eventually(BOUND, || {
            found = self.sh.accepted.lock().unwrap().get(&peer).cloned();
            found.is_some()
        });
        assert!(
            ok,
            "the application never accepted {peer}; accept errors: {:?}",
            self.sh.accept_errors.lock().unwrap()
        );
        found.unwrap()
    }

    fn accept_errors(&self) -> Vec<String> {
        self.sh.accept_errors.lock().unwrap().clone()
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        for (_, a) in self.sh.accepted.lock().unwrap().drain() {
            a.handle.disconnect();
        }
        self.sh.held.lock().unwrap().clear();
    }
}

// ---------------------------------------------------------------------------------------------
// The honest connection: SEND + WRITE + READ with verified contents, all the time.

struct Honest {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    iterations: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
    client: ConnHandle,
}

const HONEST_LEN: usize = 256 << 10;

impl Honest {
    /// Connects a fresh client QP to the victim's listener and starts the traffic thread.
    fn start(v: &Victim) -> Honest {
        let server_pd = v.sh.ctx.alloc_pd().unwrap();
        let scq = v.sh.ctx.create_cq(256, None).unwrap();
        let sqp = new_qp(&server_pd, &scq);
        let (_sev, ssink) = recorder();
        v.sh.honest_slots.lock().unwrap().push_back((sqp.clone(), ssink));
        let client = common::endpoint();
        let (client_handle, _) =
            connect_blocking(&client.qp, v.addr(), params(b"honest", true)).expect("honest connection");
        assert!(eventually(BOUND, || sqp.state() == QpState::Rts));
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let iterations = Arc::new(AtomicU64::new(0));
        let failure = Arc::new(Mutex::new(None));
        let (stop2, paused2, it2, fail2) = (stop.clone(), paused.clone(), iterations.clone(), failure.clone());
        let thread = std::thread::spawn(move || {
            let r = honest_loop(&client, &server_pd, &scq, &sqp, &stop2, &paused2, &it2);
            if let Err(e) = r {
                *fail2.lock().unwrap() = Some(e);
            }
        });
        Honest {
            stop,
            paused,
            iterations,
            failure,
            thread: Some(thread),
            client: client_handle,
        }
    }

    fn check(&self) {
        if let Some(f) = self.failure.lock().unwrap().as_ref() {
            panic!("the honest connection failed: {f}");
        }
    }

    /// Waits for `n` more verified iterations.
    fn advance(&self, n: u64, after: &str) {
        let start = self.iterations.load(Ordering::SeqCst);
        let ok = eventually(BOUND * 2, || {
            self.failure.lock().unwrap().is_some() || self.iterations.load(Ordering::SeqCst) >= start + n
        });
        self.check();
        assert!(
            ok,
            "after `{after}`: the honest connection stalled at iteration {start}"
        );
    }

    fn pause(&self, on: bool) {
        self.paused.store(on, Ordering::SeqCst);
        if on {
            // Let the iteration in progress finish.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.check();
        self.client.disconnect();
        self.iterations.load(Ordering::SeqCst)
    }
}

fn expect_wcs(cq: &Cq, want: &[(u64, WcStatus)], what: &str) -> std::result::Result<Vec<WorkCompletion>, String> {
    let got = cq.wait_for(want.len(), BOUND * 2);
    let seen: Vec<(u64, WcStatus)> = got.iter().map(|w| (w.wr_id, w.status)).collect();
    if seen != want {
        return Err(format!("{what}: completions {seen:?}, expected {want:?}"));
    }
    Ok(got)
}

fn same(what: &str, want: &[u8], got: &[u8]) -> std::result::Result<(), String> {
    if want != got {
        return Err(format!(
            "{what}: {} bytes with crc32c {:#010x}, expected {} bytes with crc32c {:#010x}",
            got.len(),
            crc32c(got),
            want.len(),
            crc32c(want)
        ));
    }
    Ok(())
}

fn honest_loop(
    client: &common::Endpoint,
    server_pd: &Pd,
    scq: &Cq,
    sqp: &Qp,
    stop: &AtomicBool,
    paused: &AtomicBool,
    iterations: &AtomicU64,
) -> std::result::Result<(), String> {
    let e = |e: Error| e.to_string();
    let src = client.pd.alloc_mr(HONEST_LEN, Access::LOCAL_WRITE).map_err(e)?;
    let back = client.pd.alloc_mr(HONEST_LEN, Access::LOCAL_WRITE).map_err(e)?;
    let recv = server_pd.alloc_mr(HONEST_LEN, Access::LOCAL_WRITE).map_err(e)?;
    let target = server_pd.alloc_mr(HONEST_LEN, ALL).map_err(e)?;
    let mut i: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        if paused.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        i += 1;
        // SEND
        let len = 1 + (i as usize * 40_503) % HONEST_LEN;
        let a = pattern(len, i);
        src.write(0, &a).map_err(e)?;
        sqp.post_recv_one(i, recv.sge(0, HONEST_LEN as u32)).map_err(e)?;
        client
            .qp
            .post_send_one(SendWr::send(i * 4, vec![src.sge(0, len as u32)]))
            .map_err(e)?;
        expect_wcs(&client.cq, &[(i * 4, WcStatus::Success)], "honest SEND")?;
        let r = expect_wcs(scq, &[(i, WcStatus::Success)], "honest RECV")?;
        if r[0].byte_len as usize != len {
            return Err(format!("honest RECV: {} bytes, expected {len}", r[0].byte_len));
        }
        let mut got = vec![0u8; len];
        recv.read(0, &mut got).map_err(e)?;
        same("honest SEND data", &a, &got)?;
        // WRITE, then READ it back
        let len = 1 + (i as usize * 77_777) % HONEST_LEN;
        let b = pattern(len, i ^ 0xdead);
        src.write(0, &b).map_err(e)?;
        let wrs = [
            SendWr::write(i * 4 + 1, vec![src.sge(0, len as u32)], target.addr(), target.rkey()),
            SendWr::read(i * 4 + 2, vec![back.sge(0, len as u32)], target.addr(), target.rkey()),
        ];
        client.qp.post_send(&wrs).map_err(|(_, err)| err.to_string())?;
        expect_wcs(
            &client.cq,
            &[(i * 4 + 1, WcStatus::Success), (i * 4 + 2, WcStatus::Success)],
            "honest WRITE + READ",
        )?;
        let mut got = vec![0u8; len];
        back.read(0, &mut got).map_err(e)?;
        same("honest READ data", &b, &got)?;
        target.read(0, &mut got).map_err(e)?;
        same("honest WRITE data", &b, &got)?;
        iterations.store(i, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// One attack: connect, act, check the outcome, the memory and the honest connection.

#[derive(Debug)]
enum Wire {
    /// Closed without any MPA Reply.
    NoReply,
    /// An MPA Reply with the Reject flag, then closed.
    Reject,
    /// Exactly one FPDU, this Terminate, then closed. `echo`: the offending ULPDU whose DDP
    /// header (and, for a READ Request, RDMAP header) must be echoed.
    Terminate {
        layer: TermLayer,
        etype: u8,
        code: u8,
        echo: Option<Vec<u8>>,
    },
    /// Closed without sending any FPDU.
    Closed,
}

struct Expect {
    wire: Wire,
    /// Statuses of the victim QP's two receives.
    recvs: [WcStatus; 2],
}

const FLUSHED: [WcStatus; 2] = [WcStatus::WrFlushErr, WcStatus::WrFlushErr];

fn term(layer: TermLayer, etype: u8, code: u8, echo: Option<&[u8]>) -> Expect {
    Expect {
        wire: Wire::Terminate {
            layer,
            etype,
            code,
            echo: echo.map(<[u8]>::to_vec),
        },
        recvs: FLUSHED,
    }
}

#[derive(Clone, Copy)]
enum Start {
    /// A bare TCP connection: the attack is the MPA exchange itself.
    Tcp,
    /// A completed MPA exchange (our Request, the victim's accepting Reply) with this CRC setting.
    Mpa { crc: bool },
}

struct Log(Vec<String>);

impl Log {
    fn line(&mut self, name: &str, outcome: &str, took: Duration) {
        self.0
            .push(format!("{name:<58} {outcome:<44} {:>6.1} ms", took.as_secs_f64() * 1e3));
    }
}

fn attack(
    v: &Victim,
    honest: &Honest,
    log: &mut Log,
    name: &str,
    start: Start,
    act: impl FnOnce(&mut RawPeer, &Victim) -> Expect,
) {
    let requests_before = v.requests();
    let mut p = match start {
        Start::Tcp => RawPeer::connect(v.addr()),
        Start::Mpa { crc } => RawPeer::handshake(v.addr(), b"attacker", crc),
    };
    let peer = p.local_addr();
    let t0 = Instant::now();
    let exp = act(&mut p, v);
    let outcome = match &exp.wire {
        Wire::NoReply => {
            let end = p.read_until_end(BOUND);
            assert!(
                end.closed(),
                "{name}: the victim did not close the connection ({end:?})"
            );
            assert!(p.buf.is_empty(), "{name}: the victim answered {:02x?}", p.buf);
            format!("closed ({end:?}), no reply")
        }
        Wire::Reject => {
            let reply = p.mpa_reply(BOUND);
            let reply = reply.unwrap_or_else(|end| panic!("{name}: no MPA reply, connection {end:?}"));
            assert!(reply.reject, "{name}: expected an MPA reject, got {reply:?}");
            let end = p.read_until_end(BOUND);
            assert!(
                end.closed(),
                "{name}: the victim did not close after its reject ({end:?})"
            );
            "MPA reject, closed".to_string()
        }
        Wire::Terminate {
            layer,
            etype,
            code,
            echo,
        } => {
            let (ulpdus, end) = p.ulpdus_until_end(BOUND);
            assert!(
                end.closed(),
                "{name}: the victim did not close after its Terminate ({end:?})"
            );
            assert_eq!(
                ulpdus.len(),
                1,
                "{name}: expected exactly one FPDU (the Terminate), got {ulpdus:02x?}"
            );
            let t = as_terminate(&ulpdus[0]).unwrap_or_else(|| panic!("{name}: not a Terminate: {:02x?}", ulpdus[0]));
            assert_eq!(
                (t.layer, t.etype, t.ecode),
                (*layer, *etype, *code),
                "{name}: got Terminate `{}`",
                t.describe()
            );
            if let Some(off) = echo {
                let hlen = if off[0] & 0x80 != 0 { 14 } else { 18 };
                assert_eq!(t.ddp_header.as_deref(), Some(&off[..hlen]), "{name}: echoed DDP header");
                let is_rreq = off[1] & 0x0f == Opcode::ReadRequest as u8;
                let want_rdmap = is_rreq.then(|| &off[hlen..hlen + READ_REQUEST_LEN]);
                assert_eq!(t.rdmap_header.as_deref(), want_rdmap, "{name}: echoed RDMAP header");
            }
            format!("Terminate {}/{}/{} ({end:?})", *layer as u8, etype, code)
        }
        Wire::Closed => {
            let (ulpdus, end) = p.ulpdus_until_end(BOUND);
            assert!(end.closed(), "{name}: the victim did not close ({end:?})");
            assert!(ulpdus.is_empty(), "{name}: the victim sent {ulpdus:02x?}");
            format!("closed ({end:?})")
        }
    };
    let took = t0.elapsed();
    match start {
        Start::Tcp => assert_eq!(
            v.requests(),
            requests_before,
            "{name}: a request reached the application"
        ),
        Start::Mpa { .. } => {
            let a = v.accepted(peer);
            assert!(
                eventually(BOUND, || a.qp.state() == QpState::Err),
                "{name}: victim QP in {}",
                a.qp.state()
            );
            let wcs = a.cq.wait_for(2, BOUND);
            let st: Vec<WcStatus> = wcs.iter().map(|w| w.status).collect();
            assert_eq!(st, exp.recvs, "{name}: victim receive completions {wcs:?}");
            assert!(
                eventually(BOUND, || a.handle.is_closed()
                    && a.events
                        .lock()
                        .unwrap()
                        .iter()
                        .any(|e| matches!(e, ConnEvent::Disconnected { .. }))),
                "{name}: the victim connection did not close: {:?}",
                a.events.lock().unwrap()
            );
        }
    }
    v.assert_memory_intact(name);
    honest.advance(2, name);
    log.line(name, &outcome, took);
}

fn with_ddp_version(mut ulpdu: Vec<u8>, dv: u8) -> Vec<u8> {
    ulpdu[0] = (ulpdu[0] & !0x03) | dv;
    ulpdu
}

fn with_opcode(mut ulpdu: Vec<u8>, op: u8) -> Vec<u8> {
    ulpdu[1] = (ulpdu[1] & 0xf0) | op;
    ulpdu
}

// ---------------------------------------------------------------------------------------------

#[test]
fn each_attack_gets_its_documented_outcome_while_honest_traffic_flows() {
    let _serial = serial();
    let started = Instant::now();
    let mut v = Victim::new(64);
    let honest = Honest::start(&v);
    honest.advance(2, "setup");
    let mut log = Log(Vec::new());

    // Controls: valid traffic from the raw peer works, so every failure below is the attack's.
    for crc in [true, false] {
        let name = if crc {
            "control: valid WRITE + READ (CRC on)"
        } else {
            "control: valid WRITE + READ (CRC off)"
        };
        let mut p = RawPeer::handshake(v.addr(), b"attacker", crc);
        let t0 = Instant::now();
        let data = pattern(4096, 77 + crc as u64);
        p.send_segment(&write_hdr(v.scratch.rkey(), v.scratch.addr() + 4096), &data);
        p.send(&fpdu(
            &read_request(1, v.readonly.rkey(), v.readonly.addr() + 100, 300),
            crc,
        ));
        let (ulpdus, end) = p.ulpdus(1, BOUND);
        assert_eq!(end, None, "{name}: connection ended");
        let (h, n) = SegmentHeader::parse(&ulpdus[0]).unwrap();
        assert_eq!(h.opcode, Opcode::ReadResponse);
        assert_eq!(
            h.ddp,
            DdpHeader::Tagged {
                stag: 0x5151_5100,
                to: 0x1000
            }
        );
        assert_eq!(&ulpdus[0][n..], &v.readonly.to_vec()[100..400], "{name}: READ data");
        assert_eq!(&v.scratch.to_vec()[4096..8192], &data[..], "{name}: WRITE data");
        p.finish();
        let end = p.read_until_end(BOUND);
        assert!(end.closed());
        let a = v.accepted(p.local_addr());
        assert_eq!(a.cq.wait_for(2, BOUND).len(), 2);
        log.line(name, "Read Response, data placed", t0.elapsed());
        v.resnap();
    }

    // Control: WRITEs pipelined right behind the MPA Request, before the Reply. RFC 5044 lets
    // the responder refuse them; softrdma keeps the stream and must place every byte in order.
    {
        let name = "control: 1 MiB of WRITEs pipelined behind the Request";
        let mut p = RawPeer::connect(v.addr());
        let t0 = Instant::now();
        let data = pattern(1 << 20, 99);
        let mut burst = request_bytes(b"attacker", true);
        for (k, chunk) in data.chunks(16 << 10).enumerate() {
            let to = v.scratch.addr() + (1 << 20) + (k * (16 << 10)) as u64;
            burst.extend_from_slice(&fpdu(&segment(&write_hdr(v.scratch.rkey(), to), chunk), true));
        }
        burst.extend_from_slice(&fpdu(&read_request(1, v.readonly.rkey(), v.readonly.addr(), 0), true));
        let mut w = p.sock.try_clone().unwrap();
        let writer = std::thread::spawn(move || w.write_all(&burst));
        let reply = p.mpa_reply(BOUND).expect("MPA reply");
        assert!(!reply.reject && reply.crc);
        p.crc = true;
        writer.join().unwrap().expect("pipelined burst");
        let (ulpdus, end) = p.ulpdus(1, BOUND);
        assert_eq!(end, None, "{name}: connection ended: {ulpdus:02x?}");
        assert_eq!(header_of(&ulpdus[0]).opcode, Opcode::ReadResponse, "{name}");
        let got = v.scratch.to_vec();
        if got[1 << 20..] != data[..] {
            let at = got[1 << 20..].iter().zip(&data).position(|(a, b)| a != b).unwrap();
            panic!("{name}: pipelined WRITE data differs at byte {at}");
        }
        p.finish();
        p.read_until_end(BOUND);
        log.line(name, "all placed in order", t0.elapsed());
        v.resnap();
    }

    // The MPA exchange.
    attack(
        &v,
        &honest,
        &mut log,
        "garbage before MPA (text)",
        Start::Tcp,
        |p, _| {
            p.send(b"GET / HTTP/1.1\r\nHost: softrdma\r\n\r\n");
            Expect {
                wire: Wire::NoReply,
                recvs: FLUSHED,
            }
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "garbage before MPA (binary, 64 KiB)",
        Start::Tcp,
        |p, _| {
            let _ = p.try_send(&pattern(64 << 10, 5));
            Expect {
                wire: Wire::NoReply,
                recvs: FLUSHED,
            }
        },
    );
    for pd_len in [513u16, 0xffff] {
        let name = format!("MPA request with PD_Length {pd_len}");
        attack(&v, &honest, &mut log, &name, Start::Tcp, |p, _| {
            let mut req = request_bytes(b"", true);
            req[18..20].copy_from_slice(&pd_len.to_be_bytes());
            p.send(&req[..20]);
            let _ = p.try_send(&vec![0x41; pd_len as usize]);
            Expect {
                wire: Wire::NoReply,
                recvs: FLUSHED,
            }
        });
    }
    attack(
        &v,
        &honest,
        &mut log,
        "MPA reply instead of a request",
        Start::Tcp,
        |p, _| {
            let mut f = request_frame(b"", true);
            f.kind = softrdma_wire::MpaKind::Reply;
            p.send(&frame_bytes(&f));
            Expect {
                wire: Wire::NoReply,
                recvs: FLUSHED,
            }
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "MPA request, enhanced flag with revision 1",
        Start::Tcp,
        |p, _| {
            let mut req = request_bytes(b"", true);
            req[17] = 1;
            p.send(&req);
            Expect {
                wire: Wire::NoReply,
                recvs: FLUSHED,
            }
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "MPA request asking for markers",
        Start::Tcp,
        |p, _| {
            let mut f = request_frame(b"attacker", true);
            f.markers = true;
            p.send(&frame_bytes(&f));
            Expect {
                wire: Wire::Reject,
                recvs: FLUSHED,
            }
        },
    );

    // MPA framing.
    let crc_on = Start::Mpa { crc: true };
    let llp = |code| term(TermLayer::Llp, term::llp::MPA, code, None);
    attack(
        &v,
        &honest,
        &mut log,
        "bad MPA CRC (valid WRITE, one bit flipped)",
        crc_on,
        |p, v| {
            let mut f = fpdu(
                &segment(&write_hdr(v.scratch.rkey(), v.scratch.addr()), &[0xee; 512]),
                true,
            );
            let last = f.len() - 1;
            f[last] ^= 0x01;
            p.send(&f);
            llp(term::llp::CRC_ERROR)
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "FPDU length runs past the segment (CRC on)",
        crc_on,
        |p, v| {
            let mut f = fpdu(
                &segment(&write_hdr(v.scratch.rkey(), v.scratch.addr()), &[0xee; 64]),
                true,
            );
            let len = u16::from_be_bytes([f[0], f[1]]) + 64;
            f[..2].copy_from_slice(&len.to_be_bytes());
            // The next FPDU's bytes complete the claimed length; the CRC then cannot match.
            f.extend_from_slice(&fpdu(
                &segment(&write_hdr(v.scratch.rkey(), v.scratch.addr()), &[0xdd; 128]),
                true,
            ));
            p.send(&f);
            llp(term::llp::CRC_ERROR)
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "FPDU length runs past the segment, then FIN",
        Start::Mpa { crc: false },
        |p, v| {
            let mut f = fpdu(
                &segment(&write_hdr(v.scratch.rkey(), v.scratch.addr()), &[0xee; 64]),
                false,
            );
            f[..2].copy_from_slice(&1000u16.to_be_bytes());
            p.send(&f);
            p.finish();
            Expect {
                wire: Wire::Closed,
                recvs: FLUSHED,
            }
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "ULPDU shorter than a DDP header",
        crc_on,
        |p, _| {
            p.send(&fpdu(&[0xc1, 0x40, 0, 0, 0, 0], true));
            term(TermLayer::Ddp, term::ddp::CATASTROPHIC, 0, None)
        },
    );

    // DDP / RDMAP headers.
    let remote_op = |code| term(TermLayer::Rdmap, term::rdmap::REMOTE_OPERATION, code, None);
    attack(
        &v,
        &honest,
        &mut log,
        "unknown RDMAP opcode 8 (untagged)",
        crc_on,
        |p, _| {
            p.send(&fpdu(
                &with_opcode(segment(&send_hdr(Opcode::Send, 1, 0), b"x"), 8),
                true,
            ));
            remote_op(term::rdmap::UNEXPECTED_OPCODE)
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "unknown RDMAP opcode 15 (tagged)",
        crc_on,
        |p, v| {
            let seg = segment(&write_hdr(v.scratch.rkey(), v.scratch.addr()), &[1; 16]);
            p.send(&fpdu(&with_opcode(seg, 15), true));
            remote_op(term::rdmap::UNEXPECTED_OPCODE)
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "DDP version 2 in a tagged segment",
        crc_on,
        |p, v| {
            let seg = segment(&write_hdr(v.scratch.rkey(), v.scratch.addr()), &[1; 16]);
            p.send(&fpdu(&with_ddp_version(seg, 2), true));
            term(
                TermLayer::Ddp,
                term::ddp::TAGGED_BUFFER,
                term::ddp::tagged::INVALID_DDP_VERSION,
                None,
            )
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "DDP version 2 in an untagged segment",
        crc_on,
        |p, _| {
            p.send(&fpdu(
                &with_ddp_version(segment(&send_hdr(Opcode::Send, 1, 0), b"x"), 2),
                true,
            ));
            term(
                TermLayer::Ddp,
                term::ddp::UNTAGGED_BUFFER,
                term::ddp::untagged::INVALID_DDP_VERSION,
                None,
            )
        },
    );

    // Tagged access: every STag check.
    let tagged = |code, seg: &[u8]| term(TermLayer::Ddp, term::ddp::TAGGED_BUFFER, code, Some(seg));
    let bogus = (1..)
        .map(|k: u32| v.canary.rkey() ^ (k << 8))
        .find(|&k| mr::lookup_key(k).is_err())
        .unwrap();
    let writes: Vec<(&str, u32, u64, usize, u8)> = vec![
        (
            "WRITE with an invalid STag",
            bogus,
            v.canary.addr(),
            64,
            term::ddp::tagged::INVALID_STAG,
        ),
        (
            "WRITE past the end of the MR",
            v.canary.rkey(),
            v.canary.addr() + CANARY_LEN as u64 - 16,
            64,
            term::ddp::tagged::BASE_BOUNDS,
        ),
        (
            "WRITE below the MR's base",
            v.canary.rkey(),
            v.canary.addr() - 8,
            16,
            term::ddp::tagged::BASE_BOUNDS,
        ),
        (
            "WRITE with TO wrap",
            v.canary.rkey(),
            u64::MAX - 7,
            64,
            term::ddp::tagged::BASE_BOUNDS,
        ),
        (
            "WRITE to a deregistered MR",
            v.dereg_rkey,
            v.dereg_addr,
            64,
            term::ddp::tagged::INVALID_STAG,
        ),
        (
            "WRITE to an MR of another PD",
            v.foreign.rkey(),
            v.foreign.addr(),
            64,
            term::ddp::tagged::STAG_NOT_ASSOC,
        ),
    ];
    for (name, stag, to, len, code) in writes {
        attack(&v, &honest, &mut log, name, crc_on, |p, _| {
            let seg = segment(&write_hdr(stag, to), &vec![0xee; len]);
            p.send(&fpdu(&seg, true));
            tagged(code, &seg)
        });
    }
    attack(&v, &honest, &mut log, "WRITE to a READ-only MR", crc_on, |p, v| {
        let seg = segment(&write_hdr(v.readonly.rkey(), v.readonly.addr()), &[0xee; 64]);
        p.send(&fpdu(&seg, true));
        term(
            TermLayer::Rdmap,
            term::rdmap::REMOTE_PROTECTION,
            term::rdmap::ACCESS_RIGHTS,
            Some(&seg),
        )
    });
    let reads: Vec<(&str, u32, u64, u32, u8)> = vec![
        (
            "READ larger than the MR",
            v.readonly.rkey(),
            v.readonly.addr(),
            READONLY_LEN as u32 + 1,
            term::rdmap::BASE_BOUNDS,
        ),
        (
            "READ past the end of the MR",
            v.readonly.rkey(),
            v.readonly.addr() + READONLY_LEN as u64 - 10,
            20,
            term::rdmap::BASE_BOUNDS,
        ),
        (
            "READ of an MR of another PD",
            v.foreign.rkey(),
            v.foreign.addr(),
            64,
            term::rdmap::STAG_NOT_ASSOC,
        ),
        (
            "READ with an invalid STag",
            bogus,
            v.canary.addr(),
            64,
            term::rdmap::INVALID_STAG,
        ),
    ];
    for (name, stag, to, size, code) in reads {
        attack(&v, &honest, &mut log, name, crc_on, |p, _| {
            let seg = read_request(1, stag, to, size);
            p.send(&fpdu(&seg, true));
            term(TermLayer::Rdmap, term::rdmap::REMOTE_PROTECTION, code, Some(&seg))
        });
    }
    attack(
        &v,
        &honest,
        &mut log,
        "READ Request with a wrong MSN",
        crc_on,
        |p, v| {
            let seg = read_request(7, v.readonly.rkey(), v.readonly.addr(), 64);
            p.send(&fpdu(&seg, true));
            term(
                TermLayer::Ddp,
                term::ddp::UNTAGGED_BUFFER,
                term::ddp::untagged::INVALID_MSN_RANGE,
                Some(&seg),
            )
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "17 READ Requests at once (IRD 16)",
        crc_on,
        |p, v| {
            let mut burst = Vec::new();
            for msn in 1..=17 {
                burst.extend_from_slice(&fpdu(&read_request(msn, v.readonly.rkey(), v.readonly.addr(), 8), true));
            }
            p.send(&burst);
            let last = read_request(17, v.readonly.rkey(), v.readonly.addr(), 8);
            term(
                TermLayer::Rdmap,
                term::rdmap::REMOTE_OPERATION,
                term::rdmap::CATASTROPHIC_STREAM,
                Some(&last),
            )
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "Read Response with no READ outstanding",
        crc_on,
        |p, v| {
            let hdr = SegmentHeader {
                last: true,
                opcode: Opcode::ReadResponse,
                ddp: DdpHeader::Tagged {
                    stag: v.canary.rkey(),
                    to: v.canary.addr(),
                },
            };
            p.send(&fpdu(&segment(&hdr, &[0xee; 64]), true));
            remote_op(term::rdmap::UNEXPECTED_OPCODE)
        },
    );

    // Untagged.
    attack(
        &v,
        &honest,
        &mut log,
        "SEND larger than the posted receive",
        crc_on,
        |p, _| {
            let seg = segment(&send_hdr(Opcode::Send, 1, 0), &[0xee; 8192]);
            p.send(&fpdu(&seg, true));
            let mut e = term(
                TermLayer::Ddp,
                term::ddp::UNTAGGED_BUFFER,
                term::ddp::untagged::MSG_TOO_LONG,
                Some(&seg),
            );
            e.recvs = [WcStatus::LocLenErr, WcStatus::WrFlushErr];
            e
        },
    );
    attack(
        &v,
        &honest,
        &mut log,
        "SEND with Invalidate of another PD's STag",
        crc_on,
        |p, v| {
            let seg = segment(&send_hdr(Opcode::SendInvalidate, 1, v.foreign.rkey()), b"invalidate");
            p.send(&fpdu(&seg, true));
            let mut e = term(
                TermLayer::Rdmap,
                term::rdmap::REMOTE_OPERATION,
                term::rdmap::STAG_CANNOT_INVALIDATE,
                Some(&seg),
            );
            e.recvs = [WcStatus::Success, WcStatus::WrFlushErr];
            e
        },
    );
    assert!(
        mr::check_remote(
            v.foreign.rkey(),
            v.other_pd_id,
            0,
            v.foreign.addr(),
            1,
            Access::REMOTE_WRITE
        )
        .is_ok(),
        "a peer invalidated another PD's STag"
    );
    attack(&v, &honest, &mut log, "Terminate from the peer", crc_on, |p, _| {
        let hdr = SegmentHeader::terminate(1);
        let mut t = Vec::new();
        softrdma_wire::Terminate::new(
            TermLayer::Rdmap,
            term::rdmap::REMOTE_OPERATION,
            term::rdmap::UNSPECIFIED,
        )
        .emit(&mut t);
        p.send(&fpdu(&segment(&hdr, &t), true));
        Expect {
            wire: Wire::Closed,
            recvs: FLUSHED,
        }
    });

    // A peer that stops reading: READ Responses fill the victim's send path, then an error
    // queues a Terminate that cannot leave. (a) without FIN: closed after TERMINATE_LINGER;
    // (b) with FIN: closed at the FIN. Neither may spin the progress thread.
    let stuck = |v: &Victim| {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect_timeout(&v.addr().into(), BOUND).unwrap();
        let mut p = RawPeer::from_stream(TcpStream::from(sock));
        p.send(&request_bytes(b"attacker", true));
        let reply = p.mpa_reply(BOUND).expect("MPA reply");
        p.crc = reply.crc;
        for msn in 1..=8 {
            p.send(&fpdu(
                &read_request(msn, v.readonly.rkey(), v.readonly.addr(), READONLY_LEN as u32),
                true,
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
        p.send(&fpdu(
            &with_opcode(segment(&send_hdr(Opcode::Send, 1, 0), b"x"), 8),
            true,
        ));
        let a = v.accepted(p.local_addr());
        assert!(
            eventually(BOUND, || a.qp.state() == QpState::Err),
            "stuck peer: victim QP in {}",
            a.qp.state()
        );
        (p, a)
    };
    let t_linger = Instant::now();
    let (silent, silent_conn) = stuck(&v);
    {
        let name = "peer stops reading, errs, then FIN";
        let (p, a) = stuck(&v);
        let t0 = Instant::now();
        p.finish();
        assert!(
            eventually(BOUND, || a.handle.is_closed()),
            "{name}: the victim kept the connection"
        );
        let took = t0.elapsed();
        honest.pause(true);
        let cpu = ThreadCpu::progress_thread().during(Duration::from_secs(1));
        honest.pause(false);
        assert!(
            cpu < Duration::from_millis(300),
            "{name}: the progress thread used {cpu:?} of 1 s"
        );
        assert_eq!(a.cq.wait_for(2, BOUND).len(), 2);
        v.assert_memory_intact(name);
        honest.advance(2, name);
        log.line(name, &format!("closed at the FIN; progress thread {cpu:?}/s"), took);
        drop(p);
    }
    {
        let name = "peer stops reading and errs (no FIN)";
        let closed = eventually(LINGER + BOUND, || silent_conn.handle.is_closed());
        assert!(
            closed,
            "{name}: the victim kept the connection {:?}",
            t_linger.elapsed()
        );
        assert_eq!(silent_conn.cq.wait_for(2, BOUND).len(), 2);
        v.assert_memory_intact(name);
        honest.advance(2, name);
        log.line(name, "closed after the linger", t_linger.elapsed());
        drop(silent);
    }

    assert!(v.accept_errors().is_empty(), "accept errors: {:?}", v.accept_errors());
    let iterations = honest.finish();
    eprintln!(
        "\n{} attacks in {:?}; the honest connection verified {iterations} iterations meanwhile",
        log.0.len(),
        started.elapsed()
    );
    for l in &log.0 {
        eprintln!("  {l}");
    }
}

// ---------------------------------------------------------------------------------------------

#[test]
fn requests_beyond_the_backlog_are_rejected_and_hangups_before_a_decision_are_closed() {
    let _serial = serial();
    const BACKLOG: usize = 8;
    let v = Victim::new(BACKLOG as u32);
    let honest = Honest::start(&v);
    honest.advance(2, "setup");
    let before = v.requests();

    // Fill the backlog with requests the application leaves undecided.
    let mut held: Vec<RawPeer> = (0..BACKLOG)
        .map(|i| {
            let mut p = RawPeer::connect(v.addr());
            p.send(&request_bytes(format!("hold-{i}").as_bytes(), false));
            p
        })
        .collect();
    assert!(
        eventually(BOUND, || v.sh.held.lock().unwrap().len() == BACKLOG),
        "held {}",
        v.sh.held.lock().unwrap().len()
    );
    assert_eq!(v.listener.pending(), BACKLOG);

    // Four times the backlog more: each is rejected at once and never reaches the application.
    let t0 = Instant::now();
    for i in 0..4 * BACKLOG {
        let mut p = RawPeer::connect(v.addr());
        p.send(&request_bytes(format!("attacker-{i}").as_bytes(), false));
        let reply = p
            .mpa_reply(BOUND)
            .unwrap_or_else(|end| panic!("request {i} beyond the backlog: {end:?}"));
        assert!(reply.reject, "request {i} beyond the backlog was accepted");
        assert!(p.read_until_end(BOUND).closed());
    }
    let reject_time = t0.elapsed();
    assert_eq!(
        v.requests(),
        before + BACKLOG,
        "requests beyond the backlog reached the application"
    );
    assert_eq!(v.listener.pending(), BACKLOG);
    honest.advance(2, "backlog overflow");

    // The held peers hang up. The victim closes those connections at once, without a busy loop.
    for p in &held {
        p.finish();
    }
    honest.pause(true);
    let cpu = ThreadCpu::progress_thread().during(Duration::from_secs(1));
    honest.pause(false);
    assert!(
        cpu < Duration::from_millis(300),
        "hung-up requests: the progress thread used {cpu:?} of 1 s"
    );
    for p in held.iter_mut() {
        assert!(p.read_until_end(BOUND).closed());
    }
    // Deciding now fails with ECONNRESET and frees the backlog.
    let reqs: Vec<ConnRequest> = std::mem::take(&mut *v.sh.held.lock().unwrap());
    for req in reqs {
        let cq = v.sh.ctx.create_cq(8, None).unwrap();
        let qp = new_qp(&v.sh.pd, &cq);
        let (_ev, sink) = recorder();
        let err = req.accept(&qp, params(b"", false), sink).unwrap_err();
        assert_eq!(err.errno, Errno::ConnReset, "{err}");
    }
    assert_eq!(v.listener.pending(), 0);
    let second = Honest::start(&v);
    second.advance(2, "after the backlog drained");
    second.finish();
    let n = honest.finish();
    eprintln!(
        "backlog {BACKLOG}: {} rejects in {reject_time:?}; progress thread {cpu:?} in 1 s with {BACKLOG} hung-up requests; honest iterations {n}",
        4 * BACKLOG
    );
}

// ---------------------------------------------------------------------------------------------

fn raise_nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max.min(1 << 16);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        }
    }
    r.rlim_cur
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FloodKind {
    /// 64 bytes of garbage, then close.
    Garbage,
    /// The first 10 bytes of an MPA Request, then nothing (slowloris).
    Slowloris,
    /// TCP connected, nothing sent.
    Silent,
    /// A valid MPA Request the application rejects.
    Valid,
}

#[test]
fn connection_flood_does_not_starve_the_listener() {
    let _serial = serial();
    const BACKLOG: u32 = 16;
    let request_timeout = Duration::from_secs(2);
    let limit = raise_nofile_limit();
    let v = Victim::new(BACKLOG);
    v.listener.set_request_timeout(request_timeout);
    let honest = Honest::start(&v);
    honest.advance(2, "setup");
    let baseline = fd_count();
    // Each connection costs two fds here (attacker and victim); keep a margin.
    let n = 2000usize
        .min((limit as usize).saturating_sub(baseline + 512) / 2)
        .max(4 * BACKLOG as usize);
    let addr = v.addr();
    let t0 = Instant::now();

    // Honest connections keep being made while the flood runs.
    let flooding = Arc::new(AtomicBool::new(true));
    let probes = {
        let flooding = flooding.clone();
        let sh = v.sh.clone();
        std::thread::spawn(move || {
            let mut times = Vec::new();
            let mut retries = 0;
            while flooding.load(Ordering::SeqCst) || times.is_empty() {
                let (took, r) = probe(&sh, addr);
                retries += r;
                times.push(took);
            }
            (times, retries)
        })
    };

    let attackers: Vec<JoinHandle<Vec<(FloodKind, TcpStream)>>> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut keep = Vec::new();
                for i in (t..n).step_by(4) {
                    let kind = [
                        FloodKind::Garbage,
                        FloodKind::Slowloris,
                        FloodKind::Silent,
                        FloodKind::Valid,
                    ][i % 4];
                    let mut s = TcpStream::connect_timeout(&addr, BOUND).expect("flood connect");
                    match kind {
                        FloodKind::Garbage => {
                            let _ = s.write_all(&pattern(64, i as u64));
                            continue;
                        }
                        FloodKind::Slowloris => s.write_all(&request_bytes(b"", false)[..10]).unwrap(),
                        FloodKind::Silent => {}
                        FloodKind::Valid => s
                            .write_all(&request_bytes(format!("flood-{i}").as_bytes(), false))
                            .unwrap(),
                    }
                    keep.push((kind, s));
                }
                keep
            })
        })
        .collect();
    let mut kept: Vec<(FloodKind, TcpStream)> = attackers.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let flood_time = t0.elapsed();
    let peak_fds = fd_count();
    flooding.store(false, Ordering::SeqCst);
    let (probe_times, probe_retries) = probes.join().unwrap();
    honest.advance(2, "flood");

    // Valid requests were rejected; slowloris and silent connections are closed by the
    // handshake timeout.
    let mut rejected = 0;
    let mut timed_out = Vec::new();
    for (kind, s) in kept.drain(..) {
        let mut p = RawPeer::from_stream(s);
        match kind {
            FloodKind::Valid => {
                let reply = p
                    .mpa_reply(BOUND)
                    .unwrap_or_else(|e| panic!("flood request: no reply ({e:?})"));
                assert!(reply.reject);
                rejected += 1;
            }
            _ => {
                let end = p.read_until_end(request_timeout + BOUND);
                assert!(end.closed(), "{kind:?} connection still open after {:?}", t0.elapsed());
                assert!(p.buf.is_empty(), "{kind:?}: the victim answered {:02x?}", p.buf);
                timed_out.push(t0.elapsed());
            }
        }
    }
    let slowest_close = timed_out.iter().max().copied().unwrap_or_default();
    assert!(
        slowest_close >= request_timeout,
        "closed before the handshake timeout: {slowest_close:?}"
    );
    let (after, _) = probe(&v.sh, addr);
    assert!(after < BOUND, "honest connection after the flood took {after:?}");
    let settled = eventually(BOUND, || fd_count() <= baseline + 4);
    assert!(settled, "fds: baseline {baseline}, peak {peak_fds}, now {}", fd_count());
    let max_probe = probe_times.iter().max().copied().unwrap();
    assert!(
        max_probe < BOUND,
        "an honest connection took {max_probe:?} during the flood"
    );
    let n_iter = honest.finish();
    eprintln!(
        "flood of {n} connections in {flood_time:?}: {rejected} valid requests rejected, {} slowloris/silent closed by the {request_timeout:?} timeout (last at {slowest_close:?}); \
         {} honest connections during the flood (max {max_probe:?}, {probe_retries} retried after a backlog reject), {after:?} after; fds baseline {baseline}, peak {peak_fds}, end {}; honest iterations {n_iter}",
        timed_out.len(),
        probe_times.len(),
        fd_count()
    );
}

/// One honest connection through the victim's listener: connect, one verified SEND, disconnect.
/// Returns the time to a verified connection and how many backlog rejects it retried.
fn probe(sh: &Arc<Shared>, addr: SocketAddr) -> (Duration, usize) {
    let t0 = Instant::now();
    let mut retries = 0;
    loop {
        match probe_once(sh, addr) {
            Ok(()) => return (t0.elapsed(), retries),
            // Rejected because the backlog was full at that instant: a client retries.
            Err(e) if e.errno == Errno::ConnRefused && t0.elapsed() < BOUND => retries += 1,
            Err(e) => panic!("honest connection to the flooded listener: {e}"),
        }
    }
}

fn probe_once(sh: &Arc<Shared>, addr: SocketAddr) -> Result<()> {
    let pd = sh.ctx.alloc_pd().unwrap();
    let cq = sh.ctx.create_cq(16, None).unwrap();
    let client = common::endpoint();
    let sqp = new_qp(&pd, &cq);
    let (_ev, sink) = recorder();
    sh.honest_slots.lock().unwrap().push_back((sqp.clone(), sink));
    let handle = match connect_blocking(&client.qp, addr, params(b"honest-probe", false)) {
        Ok((h, _)) => h,
        Err(e) => {
            sh.honest_slots.lock().unwrap().retain(|(q, _)| q.qpn() != sqp.qpn());
            return Err(e);
        }
    };
    let mr_c = client.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let mr_s = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let data = pattern(4096, sqp.qpn() as u64);
    mr_c.write(0, &data).unwrap();
    assert!(eventually(BOUND, || sqp.state() == QpState::Rts));
    sqp.post_recv_one(1, mr_s.sge(0, 4096)).unwrap();
    client
        .qp
        .post_send_one(SendWr::send(2, vec![mr_c.sge(0, 4096)]))
        .unwrap();
    assert_eq!(common::wait(&cq, 1)[0].status, WcStatus::Success);
    assert_eq!(common::wait(&client.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(mr_s.to_vec(), data);
    handle.disconnect();
    assert!(eventually(BOUND, || handle.is_closed() && sqp.state() == QpState::Err));
    Ok(())
}

// ---------------------------------------------------------------------------------------------

const CHILD_ENV: &str = "SOFTRDMA_HOSTILE_FD_CHILD";

/// Runs [`fd_exhaustion_child`] in a child process: it lowers the fd limit, which must not
/// disturb the other tests.
#[test]
fn fd_exhaustion_pauses_accept_without_spinning() {
    let _serial = serial();
    let t0 = Instant::now();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "fd_exhaustion_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "child process:\n{text}"
    );
    for line in text.lines().filter_map(|l| l.find("fd exhaustion:").map(|at| &l[at..])) {
        eprintln!("{line} (child process ran {:?})", t0.elapsed());
    }
}

#[test]
#[ignore = "runs in the child process of fd_exhaustion_pauses_accept_without_spinning"]
fn fd_exhaustion_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let v = Victim::new(64);
    v.listener.set_request_timeout(Duration::from_secs(1));
    let honest = Honest::start(&v);
    honest.advance(2, "setup");
    let mut cpu = ThreadCpu::progress_thread();
    let clients: Vec<socket2::Socket> = (0..32)
        .map(|_| socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap())
        .collect();

    // Lower the limit, then take every fd that is left.
    let top = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()))
        .max()
        .unwrap();
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = top + 16;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    let mut hogs = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hogs.push(f);
    }
    // Connections arrive; the listener cannot accept them (EMFILE).
    for c in &clients {
        c.connect(&v.addr().into()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    honest.pause(true);
    let used = cpu.during(Duration::from_secs(1));
    honest.pause(false);
    assert!(
        used < Duration::from_millis(300),
        "out of fds: the progress thread used {used:?} of 1 s"
    );
    honest.advance(2, "out of fds");

    // fds come back: the waiting connections are accepted (and closed by the handshake
    // timeout), and a new honest connection succeeds.
    drop(hogs);
    let t0 = Instant::now();
    let mut waiting: Vec<RawPeer> = clients.into_iter().map(|c| RawPeer::from_stream(c.into())).collect();
    for p in waiting.iter_mut() {
        assert!(p.read_until_end(Duration::from_secs(1) + BOUND).closed());
    }
    let drained = t0.elapsed();
    let t1 = Instant::now();
    let second = Honest::start(&v);
    let reconnect = t1.elapsed();
    second.advance(2, "fds back");
    second.finish();
    honest.finish();
    println!(
        "fd exhaustion: progress thread {used:?} in 1 s while out of fds; 32 waiting connections accepted and timed out within {drained:?}; new connection in {reconnect:?}"
    );
}
