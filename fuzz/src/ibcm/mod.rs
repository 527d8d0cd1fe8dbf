//! The `cm_mad` world: hostile CM MADs through [`CmMad::parse`] and through the IB CM's
//! sans-I/O machines of `softrdma-cm` (one connection, [`conn::Conn`], active or passive; a
//! SIDR client and server, [`sidr`]), plus the listener's private-data split ([`privdata`]).
//!
//! The machines live in `crates/cm/src/ib/{conn,sidr,timing,privdata}.rs`, which are
//! `pub(crate)` inside `softrdma-cm`. Rather than widening that crate's API for the fuzzer,
//! this module compiles those very source files (`#[path]`): they depend only on each other,
//! `softrdma-wire`, `softrdma-verbs` and `std`, so the fuzzer runs exactly the code the CM runs.
//!
//! # Input format
//!
//! ```text
//! byte 0   config: bit 0 active side (else passive, with a REQ from PEER_ID already received);
//!          bits 1..2 retries (0..=3); bit 3 a 1 s give-up bound on the active side
//! then records, each starting with a ctl byte; op = ctl & 7, arg = ctl >> 3:
//!   0 MAD        length = next byte + 256 * (arg & 1), at most 300; then that many bytes
//!   1 timer      now += 1 ms << (arg & 15); on_timer(now)
//!   2 accept     3 reject (arg bytes of private data)    4 rtu    5 disconnect    6 destroy
//!   7 reflect    the peer's natural answer (choice arg) to the last MAD the machine sent
//! ```
//!
//! # Invariants
//!
//! - no panic; `CmMad::parse` ignores bytes past 256 and whatever parses re-emits to 256
//!   bytes that parse to the same value; every MAD the machines send re-parses to itself;
//! - every MAD the connection sends carries its own communication ID as `local_comm_id`;
//! - after a timer step the next deadline is later than `now` (no busy timer loop);
//! - a finished (IDLE) connection ignores every MAD;
//! - each report (REP, ESTABLISHED, REJECTED, UNREACHABLE, DISCONNECTED, TIMEWAIT_EXIT)
//!   comes at most once;
//! - with no more input, running the timers ends every exchange: within 64 timer steps the
//!   connection has no deadline left (no endless retransmission);
//! - `split_header` / `with_header` round-trip whatever CMA header parses.

#[path = "../../../crates/cm/src/ib/conn.rs"]
pub mod conn;
#[path = "../../../crates/cm/src/ib/privdata.rs"]
pub mod privdata;
#[path = "../../../crates/cm/src/ib/sidr.rs"]
pub mod sidr;
#[path = "../../../crates/cm/src/ib/timing.rs"]
pub mod timing;

use conn::{Action, Actions, Conn, Report, State};
use sidr::{SidrClient, SidrServer};
use softrdma_wire::ibcm::*;
use std::time::{Duration, Instant};
use timing::Timing;

/// The connection's own communication ID.
pub const LOCAL_ID: u32 = 0x0001_c0de;
/// The peer's communication ID.
pub const PEER_ID: u32 = 0x0002_beef;
/// The transaction ID of the first exchange.
pub const TID: u64 = 0x0000_0001_0000_0042;
/// The SIDR client's request ID.
pub const SIDR_ID: u32 = 0x0003_5151;
/// The peer's QP number in the harness's own REQ / REP.
pub const PEER_QPN: u32 = 0x00_1234;

/// The active side (else passive).
pub const CFG_ACTIVE: u8 = 0x01;
/// A give-up bound on the active side.
pub const CFG_GIVE_UP: u8 = 0x08;

/// Record ops (`ctl & 7`).
pub const OP_MAD: u8 = 0;
/// Timer step.
pub const OP_TIMER: u8 = 1;
/// Consumer accepts.
pub const OP_ACCEPT: u8 = 2;
/// Consumer rejects.
pub const OP_REJECT: u8 = 3;
/// Consumer sends the RTU.
pub const OP_RTU: u8 = 4;
/// Consumer disconnects.
pub const OP_DISCONNECT: u8 = 5;
/// Consumer destroys its id.
pub const OP_DESTROY: u8 = 6;
/// The peer answers the last MAD sent.
pub const OP_REFLECT: u8 = 7;

/// The connection's timings for a config byte.
pub fn timing_for(cfg: u8) -> Timing {
    Timing {
        response: Duration::from_millis(100),
        retries: (cfg >> 1) & 3,
        timewait: Duration::from_millis(50),
        give_up: (cfg & CFG_GIVE_UP != 0).then_some(Duration::from_secs(1)),
    }
}

/// The REQ the active side sends / the passive side received (from [`PEER_ID`]).
pub fn base_req(local_comm_id: u32) -> Req {
    Req {
        local_comm_id,
        service_id: service_id(PortSpace::Tcp, 7471),
        local_qpn: PEER_QPN,
        starting_psn: 0x100,
        remote_cm_response_timeout: 16,
        local_cm_response_timeout: 16,
        max_cm_retries: 3,
        ..Req::default()
    }
}

/// `CmMad::parse` on arbitrary bytes, with its properties; the MAD if it parsed.
pub fn parse_checked(bytes: &[u8]) -> Option<CmMad> {
    let r = CmMad::parse(bytes);
    if bytes.len() > MAD_LEN {
        assert_eq!(r, CmMad::parse(&bytes[..MAD_LEN]), "bytes past 256 changed the parse");
    }
    let _ = MadHeader::parse(bytes);
    let m = r.ok()?;
    let _ = m.msg.attr().name();
    let out = m.emit();
    assert_eq!(out.len(), MAD_LEN);
    assert_eq!(CmMad::parse(&out).as_ref(), Ok(&m), "a parsed MAD re-emits differently");
    assert_eq!(out[..MAD_HDR_LEN], m.header().emit()[..]);
    private_data_properties(&m);
    Some(m)
}

/// The listener's split of REQ / SIDR_REQ private data, and its inverse.
fn private_data_properties(m: &CmMad) {
    let field: &[u8] = match &m.msg {
        CmMessage::Req(r) => &r.private_data,
        CmMessage::SidrReq(r) => &r.private_data,
        _ => return,
    };
    let Ok((hdr, user)) = privdata::split_header(field) else {
        return;
    };
    assert_eq!(user.len(), field.len() - CMA_HDR_LEN);
    let _ = service_id_parts(match &m.msg {
        CmMessage::Req(r) => r.service_id,
        CmMessage::SidrReq(r) => r.service_id,
        _ => 0,
    });
    // Mixed families cannot be emitted; everything else round-trips.
    if hdr.src.is_ipv4() != hdr.dst.is_ipv4() {
        assert!(hdr.emit().is_err());
        return;
    }
    let again: [u8; REQ_PRIVATE_LEN] =
        match privdata::with_header(&hdr, &user[..user.len().min(REQ_PRIVATE_LEN - CMA_HDR_LEN)]) {
            Ok(f) => f,
            Err(e) => panic!("with_header refused a parsed header: {e}"),
        };
    let (h2, _) = privdata::split_header(&again).expect("re-built CMA header parses");
    assert_eq!(h2, hdr);
}

fn local_id_of(m: &CmMad) -> Option<u32> {
    Some(match &m.msg {
        CmMessage::Req(r) => r.local_comm_id,
        CmMessage::Rep(r) => r.local_comm_id,
        CmMessage::Rtu(r) => r.local_comm_id,
        CmMessage::Rej(r) => r.local_comm_id,
        CmMessage::Mra(r) => r.local_comm_id,
        CmMessage::Dreq(r) => r.local_comm_id,
        CmMessage::Drep(r) => r.local_comm_id,
        CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => return None,
    })
}

/// The peer's plausible answers to a MAD the connection sent.
fn answers(m: &CmMad) -> Vec<CmMad> {
    let mk = |msg: CmMessage| CmMad { tid: m.tid, msg };
    let rej = |remote: u32, what: u8| {
        mk(CmMessage::Rej(Rej {
            local_comm_id: PEER_ID,
            remote_comm_id: remote,
            message_rejected: what,
            reason: RejReason::ConsumerDefined,
            ..Rej::default()
        }))
    };
    let mra = |remote: u32, what: u8| {
        mk(CmMessage::Mra(Mra {
            local_comm_id: PEER_ID,
            remote_comm_id: remote,
            message_mraed: what,
            service_timeout: 8,
            ..Mra::default()
        }))
    };
    let dreq = |remote: u32| {
        mk(CmMessage::Dreq(Dreq {
            local_comm_id: PEER_ID,
            remote_comm_id: remote,
            ..Dreq::default()
        }))
    };
    let drep = |remote: u32| {
        mk(CmMessage::Drep(Drep {
            local_comm_id: PEER_ID,
            remote_comm_id: remote,
            ..Drep::default()
        }))
    };
    match &m.msg {
        CmMessage::Req(r) => vec![
            mk(CmMessage::Rep(Rep {
                local_comm_id: PEER_ID,
                remote_comm_id: r.local_comm_id,
                local_qpn: PEER_QPN,
                starting_psn: 0x200,
                ..Rep::default()
            })),
            mra(r.local_comm_id, CM_MSG_REQ),
            rej(r.local_comm_id, CM_MSG_REQ),
        ],
        CmMessage::Rep(r) => vec![
            mk(CmMessage::Rtu(Rtu {
                local_comm_id: PEER_ID,
                remote_comm_id: r.local_comm_id,
                ..Rtu::default()
            })),
            mra(r.local_comm_id, CM_MSG_REP),
            rej(r.local_comm_id, CM_MSG_REP),
            mk(CmMessage::Req(base_req(PEER_ID))),
            dreq(r.local_comm_id),
        ],
        CmMessage::Rtu(r) => vec![dreq(r.local_comm_id), rej(r.local_comm_id, CM_MSG_OTHER)],
        CmMessage::Dreq(d) => vec![drep(d.local_comm_id), dreq(d.local_comm_id)],
        CmMessage::Drep(d) => vec![dreq(d.local_comm_id), mk(CmMessage::Req(base_req(PEER_ID)))],
        CmMessage::Mra(x) => vec![mk(CmMessage::Req(base_req(PEER_ID))), rej(x.local_comm_id, CM_MSG_REQ)],
        CmMessage::Rej(x) => vec![mk(CmMessage::Req(base_req(PEER_ID))), dreq(x.local_comm_id)],
        CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => Vec::new(),
    }
}

/// One connection, a SIDR client and a SIDR server driven by the input.
pub struct World {
    conn: Conn,
    client: SidrClient,
    server: Option<SidrServer>,
    timing: Timing,
    now: Instant,
    last_sent: Option<CmMad>,
    reports: Vec<Report>,
    /// MADs the machines sent.
    pub sent: usize,
    tid: u64,
}

impl World {
    /// A fresh world for a config byte.
    pub fn new(cfg: u8) -> World {
        let now = Instant::now();
        let timing = timing_for(cfg);
        let mut w_sent = None;
        let conn = if cfg & CFG_ACTIVE != 0 {
            let (c, acts) = Conn::active(LOCAL_ID, TID, base_req(0), timing, now);
            w_sent = acts.iter().rev().find_map(|a| match a {
                Action::Send(m) => Some(m.clone()),
                Action::Report(_) => None,
            });
            c
        } else {
            Conn::passive(LOCAL_ID, TID, &base_req(PEER_ID), timing)
        };
        let (client, _) = SidrClient::start(
            SIDR_ID,
            TID + 1,
            SidrReq {
                service_id: service_id(PortSpace::Udp, 7471),
                ..SidrReq::default()
            },
            timing,
            now,
        );
        World {
            conn,
            client,
            server: None,
            timing,
            now,
            last_sent: w_sent,
            reports: Vec::new(),
            sent: 0,
            tid: TID + 2,
        }
    }

    /// Checks a step's actions and records them.
    fn take(&mut self, acts: Actions) {
        for a in acts {
            match a {
                Action::Send(m) => {
                    let out = m.emit();
                    assert_eq!(
                        CmMad::parse(&out).as_ref(),
                        Ok(&m),
                        "the machine sent a MAD that does not re-parse"
                    );
                    self.sent += 1;
                    if let Some(id) = local_id_of(&m) {
                        assert_eq!(
                            id,
                            LOCAL_ID,
                            "the connection sent {} with a foreign local ID",
                            m.msg.attr().name()
                        );
                        self.last_sent = Some(m);
                    }
                }
                Action::Report(r) => {
                    let same = |x: &Report| std::mem::discriminant(x) == std::mem::discriminant(&r);
                    assert!(!self.reports.iter().any(same), "report {r:?} twice: {:?}", self.reports);
                    self.reports.push(r);
                }
            }
        }
    }

    /// A MAD from the peer.
    pub fn mad(&mut self, m: &CmMad) {
        let idle = self.conn.finished();
        let acts = self.conn.on_mad(m, self.now);
        if idle {
            assert!(acts.is_empty(), "an IDLE connection answered {m:?}: {acts:?}");
        }
        self.take(acts);
        match &m.msg {
            CmMessage::SidrRep(rep) => {
                let _ = self.client.on_rep(rep);
            }
            CmMessage::SidrReq(req) => {
                let dup = self.server.as_ref().is_some_and(|s| !s.finished());
                if dup {
                    let acts = self.server.as_ref().unwrap().on_dup();
                    assert!(acts.len() <= 1);
                } else {
                    let mut s = SidrServer::new(m.tid, req, self.timing);
                    let acts = s
                        .answer(SidrRep::default(), self.now)
                        .expect("a new SIDR request can be answered");
                    let [Action::Send(a)] = &acts[..] else {
                        panic!("SIDR answer {acts:?}")
                    };
                    let CmMessage::SidrRep(rep) = &a.msg else {
                        panic!("{a:?}")
                    };
                    assert_eq!(
                        (rep.request_id, rep.service_id, a.tid),
                        (req.request_id, req.service_id, m.tid)
                    );
                    self.server = Some(s);
                }
            }
            _ => {}
        }
    }

    /// A timer step.
    pub fn timer(&mut self, step: Duration) {
        self.now += step;
        let acts = self.conn.on_timer(self.now);
        self.take(acts);
        if let Some(d) = self.conn.deadline() {
            assert!(d > self.now, "deadline not after now in {:?}", self.conn.state());
        }
        let (acts, _) = self.client.on_timer(self.now);
        self.take(acts);
        if let Some(s) = self.server.as_mut() {
            s.on_timer(self.now);
        }
    }

    /// A consumer call (ops 2..=6).
    pub fn consumer(&mut self, op: u8, arg: u8) {
        let now = self.now;
        let r = match op {
            OP_ACCEPT => self.conn.accept(
                Rep {
                    local_qpn: 0x77,
                    starting_psn: 0x300,
                    ..Rep::default()
                },
                self.timing.response,
                self.timing.retries,
                now,
            ),
            OP_REJECT => self
                .conn
                .reject(RejReason::ConsumerDefined, &vec![0xab; usize::from(arg) * 8], now),
            OP_RTU => self.conn.rtu(&[1, 2, 3]),
            OP_DISCONNECT => {
                self.tid += 1;
                self.conn.disconnect(self.tid, now)
            }
            _ => {
                self.tid += 1;
                Ok(self.conn.destroy(self.tid, &[0x11; 8], now))
            }
        };
        if let Ok(acts) = r {
            self.take(acts);
        }
    }

    /// Runs the records of an input (config byte stripped).
    pub fn run(&mut self, mut rest: &[u8]) {
        while let Some((&ctl, tail)) = rest.split_first() {
            rest = tail;
            let (op, arg) = (ctl & 7, ctl >> 3);
            match op {
                OP_MAD => {
                    let Some((&lo, tail)) = rest.split_first() else { break };
                    let len = (usize::from(lo) + 256 * usize::from(arg & 1)).min(300).min(tail.len());
                    let (bytes, tail) = tail.split_at(len);
                    rest = tail;
                    if let Some(m) = parse_checked(bytes) {
                        self.mad(&m);
                    }
                }
                OP_TIMER => self.timer(Duration::from_millis(1 << (arg & 15))),
                OP_REFLECT => {
                    let Some(last) = self.last_sent.clone() else { continue };
                    let options = answers(&last);
                    if let Some(m) = options.get(usize::from(arg) % options.len().max(1)) {
                        let bytes = m.emit();
                        let m = parse_checked(&bytes).expect("the harness's own MAD parses");
                        self.mad(&m);
                    }
                }
                _ => self.consumer(op, arg),
            }
        }
        // Without more input every exchange ends: run the timers at their deadlines.
        for _ in 0..64 {
            let Some(d) = self.conn.deadline() else { break };
            let step = d.saturating_duration_since(self.now);
            self.timer(step);
        }
        assert!(
            self.conn.deadline().is_none(),
            "still retransmitting after 64 timer steps in {:?}",
            self.conn.state()
        );
        assert!(
            !matches!(self.conn.state(), State::Timewait),
            "stuck in TIMEWAIT without a deadline"
        );
    }
}

/// The whole fuzz target body.
pub fn run_input(data: &[u8]) {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    // The decoder on the raw input too (any length).
    let _ = parse_checked(rest);
    let mut w = World::new(cfg);
    w.run(rest);
}
