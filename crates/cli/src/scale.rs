//! `softrdma scale`: many RC connections between two processes, through softrdma-cm.
//!
//! Server (no ADDR): one listener, one PD, one CQ and one region of 4 KiB slots for every
//! connection. Each accepted connection gets a slot; the client WRITEs random bytes into it and
//! SENDs a message naming the seed; the server compares every byte (slot and message) and answers
//! with an ACK SEND. A STATS request (a connection the server rejects) returns the server's
//! counters, RSS and fd count in the reject's private data.
//!
//! Client (ADDR): a warm-up connection, then the RSS / fd baseline, then `-c N` connections with
//! `--window` attempts in flight (`--window 0`: all at once, a burst), data on every established
//! one, RSS and fds with all of them up, the server's figures, disconnect, and the fd count
//! again (it must return to the baseline). `--after M` then opens M more connections to show
//! the listener still works.

use crate::soak::{fd_count, generate, next_event, raise_nofile, reactor_sources, rss_kib, Rng};
use clap::Args;
use softrdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma_verbs::{Access, Cq, Mr, Pd, Qp, QpInitAttr, SendWr, WcOpcode, WcStatus};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes each connection WRITEs.
const SLOT: usize = 4096;
/// Message size (SEND and ACK).
const MSG: usize = 64;
const MAGIC: &[u8; 4] = b"SRSC";
const HELLO_DATA: u8 = 1;
const HELLO_STATS: u8 = 2;
const ACK_OK: u32 = 1;

/// Arguments of `softrdma scale`.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Server to connect to; without it, run the server.
    pub addr: Option<IpAddr>,
    /// Server bind address.
    #[arg(short, long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// TCP port (0 = any free port; the server prints it).
    #[arg(short, long, default_value_t = 0)]
    pub port: u16,
    /// Connections to open and hold (client).
    #[arg(short = 'c', long, default_value_t = 1000)]
    pub conns: usize,
    /// Connection attempts in flight at once (client); 0 = all at once.
    #[arg(long, default_value_t = 64)]
    pub window: usize,
    /// Rejected or timed-out attempts are outcomes, not failures (for bursts).
    #[arg(long)]
    pub allow_rejects: bool,
    /// After the main round, open this many more connections (data verified) on the same listener.
    #[arg(long, default_value_t = 0)]
    pub after: usize,
    /// Bound on each phase (setup, data, teardown), seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Connections the server holds at most.
    #[arg(long, default_value_t = 4096)]
    pub max_conns: usize,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs the subcommand.
pub fn run(args: &ScaleArgs) -> crate::CmdResult {
    let nofile = raise_nofile();
    match args.addr {
        None => server(args),
        Some(a) => {
            if args.port == 0 {
                return Err("scale: the client needs the server's port (-p)".into());
            }
            client(args, SocketAddr::new(a, args.port), nofile)
        }
    }
}

fn le32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn le64(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

/// Makes a buffer resident, 64 KiB at a time: one large temporary would raise glibc's dynamic
/// mmap threshold, after which every engine's 256 KiB receive buffer comes from the heap and
/// is zeroed (resident) at once, which is the allocator's doing, not the stack's.
fn touch(mr: &Mr) -> softrdma_verbs::Result<()> {
    let chunk = vec![0xa5u8; 64 * 1024];
    let mut off = 0;
    while off < mr.len() {
        let n = chunk.len().min(mr.len() - off);
        mr.write(off, &chunk[..n])?;
        off += n;
    }
    Ok(())
}

fn qp_init(cq: &Cq) -> QpInitAttr {
    QpInitAttr::rc(cq, 4, 2)
}

// ---------------------------------------------------------------------------------------------
// Server.

fn lock(s: &ServerState) -> std::sync::MutexGuard<'_, Vec<Option<SConn>>> {
    s.table.lock().unwrap_or_else(|p| p.into_inner())
}

struct SConn {
    id: CmId,
    qp: Qp,
    generation: u32,
}

struct ServerState {
    table: Mutex<Vec<Option<SConn>>>,
    accepted: AtomicU64,
    verified: AtomicU64,
    errors: AtomicU64,
    stop: AtomicBool,
}

fn server(args: &ScaleArgs) -> crate::CmdResult {
    let ch = EventChannel::new()?;
    let l = CmId::create(Some(&ch), PortSpace::Tcp)?;
    l.bind_addr(SocketAddr::new(args.bind, args.port))?;
    l.listen(0)?;
    let local = l.local_addr().ok_or("scale server: no local address")?;
    let ctx = match l.context() {
        Some(c) => c,
        None => {
            let dev = softrdma_verbs::device::list_devices()?
                .into_iter()
                .next()
                .ok_or("scale server: no device")?;
            softrdma_verbs::Context::open(&dev)?
        }
    };
    let max = args.max_conns;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq((4 * max + 64) as u32, None)?;
    let data = pd.alloc_mr(
        max * SLOT,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    let recv = pd.alloc_mr(max * MSG, Access::LOCAL_WRITE)?;
    let ack = pd.alloc_mr(max * MSG, Access::LOCAL_WRITE)?;
    // Touch the application buffers now: the per-connection figures are the stack's own cost.
    for mr in [&data, &recv, &ack] {
        touch(mr)?;
    }
    let rss_base = rss_kib();
    let fds_base = fd_count();
    eprintln!("softrdma scale: listening on {local}");
    let state = Arc::new(ServerState {
        table: Mutex::new((0..max).map(|_| None).collect()),
        accepted: AtomicU64::new(0),
        verified: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let poller = {
        let (state, cq) = (state.clone(), cq.clone());
        let (data, recv, ack) = (Arc::new(data), Arc::new(recv), Arc::new(ack));
        let bufs = (data.clone(), recv.clone(), ack.clone());
        let h = std::thread::Builder::new()
            .name("scale-cq".into())
            .spawn(move || server_poll(&state, &cq, &bufs.0, &bufs.1, &bufs.2))?;
        (h, data, recv, ack)
    };
    let (data, recv) = (&poller.1, &poller.2);
    let mut free: Vec<usize> = (0..max).rev().collect();
    let mut generation = 0u32;
    loop {
        let ev = match ch.get_event(Some(Duration::from_millis(200))) {
            Ok(ev) => ev,
            Err(e) if e.errno == softrdma_verbs::Errno::Again => continue,
            Err(e) => return Err(e.into()),
        };
        match ev.event {
            EventType::ConnectRequest => {
                let id = ev.id.clone();
                let pdata = ev.param.private_data.clone();
                drop(ev);
                if pdata.len() < 8 || &pdata[..4] != MAGIC {
                    let _ = id.reject(b"not a softrdma scale client");
                    let _ = id.destroy();
                    continue;
                }
                if pdata[4] == HELLO_STATS {
                    let live = lock(&state).iter().filter(|c| c.is_some()).count() as u64;
                    let mut v = MAGIC.to_vec();
                    for x in [
                        live,
                        state.accepted.load(Ordering::Relaxed),
                        state.verified.load(Ordering::Relaxed),
                        state.errors.load(Ordering::Relaxed),
                        rss_base,
                        rss_kib(),
                        fds_base,
                        fd_count(),
                        reactor_sources(),
                    ] {
                        v.extend_from_slice(&x.to_le_bytes());
                    }
                    let _ = id.reject(&v);
                    let _ = id.destroy();
                    continue;
                }
                let Some(idx) = free.pop() else {
                    let _ = id.reject(b"scale server: table full");
                    let _ = id.destroy();
                    continue;
                };
                generation = generation.wrapping_add(1);
                let setup = || -> softrdma_verbs::Result<Qp> {
                    let qp = id.create_qp(&pd, qp_init(&cq))?;
                    qp.post_recv_one((generation as u64) << 32 | idx as u64, recv.sge(idx * MSG, MSG as u32))?;
                    // Table entry first: the client's SEND may complete before accept returns.
                    lock(&state)[idx] = Some(SConn {
                        id: id.clone(),
                        qp: qp.clone(),
                        generation,
                    });
                    let mut pd_out = MAGIC.to_vec();
                    pd_out.extend_from_slice(&(data.addr() + (idx * SLOT) as u64).to_le_bytes());
                    pd_out.extend_from_slice(&data.rkey().to_le_bytes());
                    id.accept(Some(&ConnParam {
                        private_data: pd_out,
                        responder_resources: 1,
                        initiator_depth: 1,
                        ..ConnParam::default()
                    }))?;
                    Ok(qp)
                };
                match setup() {
                    Ok(_) => {
                        state.accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        state.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("scale server: cannot accept: {e}");
                        lock(&state)[idx] = None;
                        free.push(idx);
                        let _ = id.reject(b"scale server: cannot accept");
                        let _ = id.destroy_qp();
                        let _ = id.destroy();
                    }
                }
            }
            EventType::Disconnected => {
                let id = ev.id.clone();
                drop(ev);
                let found = {
                    let mut t = lock(&state);
                    t.iter()
                        .position(|c| c.as_ref().is_some_and(|c| c.id == id))
                        .and_then(|i| t[i].take().map(|c| (i, c)))
                };
                if let Some((i, c)) = found {
                    drop(c.qp);
                    let _ = c.id.destroy_qp();
                    if let Err(e) = c.id.destroy() {
                        state.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("scale server: rdma_destroy_id: {e}");
                    }
                    free.push(i);
                }
            }
            EventType::Established => drop(ev),
            other => {
                eprintln!("scale server: unexpected {other} (status {}, {})", ev.status, ev.reason);
                drop(ev);
            }
        }
        if state.stop.load(Ordering::Relaxed) {
            break;
        }
    }
    state.stop.store(true, Ordering::Relaxed);
    let _ = poller.0.join();
    Ok(())
}

/// The server's completion loop: checks each connection's slot and message, answers with an ACK.
fn server_poll(state: &ServerState, cq: &Cq, data: &Mr, recv: &Mr, ack: &Mr) {
    let mut msg = [0u8; MSG];
    let mut got = vec![0u8; SLOT];
    while !state.stop.load(Ordering::Relaxed) {
        let Some(wc) = cq.poll_one() else {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        };
        if wc.opcode != WcOpcode::Recv || wc.status == WcStatus::WrFlushErr {
            if wc.status != WcStatus::Success && wc.status != WcStatus::WrFlushErr {
                state.errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("scale server: QP {}: {}", wc.qp_num, wc.status.as_str());
            }
            continue;
        }
        let (gen, idx) = ((wc.wr_id >> 32) as u32, (wc.wr_id & 0xffff_ffff) as usize);
        if wc.status != WcStatus::Success {
            state.errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("scale server: QP {}: receive failed: {}", wc.qp_num, wc.status.as_str());
            continue;
        }
        let ok = recv.read(idx * MSG, &mut msg).is_ok()
            && wc.byte_len as usize == MSG
            && &msg[..4] == MAGIC
            && data.read(idx * SLOT, &mut got).is_ok()
            && {
                let seed = le64(&msg, 8);
                got == generate(SLOT, seed) && msg[16..] == generate(MSG - 16, !seed)[..]
            };
        if ok {
            state.verified.fetch_add(1, Ordering::Relaxed);
        } else {
            state.errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("scale server: connection slot {idx}: data MISMATCH");
        }
        let t = lock(state);
        if let Some(c) = t[idx].as_ref().filter(|c| c.generation == gen) {
            let mut a = [0u8; MSG];
            a[..4].copy_from_slice(MAGIC);
            a[4..8].copy_from_slice(&(if ok { ACK_OK } else { 0 }).to_le_bytes());
            a[8..16].copy_from_slice(&msg[8..16]);
            if ack.write(idx * MSG, &a).is_ok() {
                let _ =
                    c.qp.post_send_one(SendWr::send(u64::MAX, vec![ack.sge(idx * MSG, MSG as u32)]));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Client.

/// The server's figures (from the STATS reject).
#[derive(Debug, Clone, Copy, Default)]
struct ServerFigures {
    live: u64,
    accepted: u64,
    verified: u64,
    errors: u64,
    rss_base: u64,
    rss_now: u64,
    fds_base: u64,
    fds_now: u64,
    sources: u64,
}

/// Where one client connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Resolving,
    Routing,
    Connecting,
    Up,
    Failed,
}

struct CConn {
    id: CmId,
    phase: Phase,
    remote: (u64, u32),
}

/// Shared client resources.
struct ClientRes {
    pd: Pd,
    cq: Cq,
    src: Mr,
    msg: Mr,
    ack: Mr,
}

/// Outcome counts of one round.
#[derive(Debug, Default, Clone)]
struct Round {
    attempted: usize,
    established: usize,
    rejected: usize,
    unreachable: usize,
    connect_errors: usize,
    other: usize,
    hung: usize,
    verified: usize,
    data_failures: usize,
    disconnected: usize,
    setup: Duration,
    data: Duration,
    teardown: Duration,
    reasons: Vec<String>,
    rss_up: u64,
    fds_up: u64,
}

fn client(args: &ScaleArgs, dst: SocketAddr, nofile: u64) -> crate::CmdResult {
    let need = (args.conns.max(args.after) as u64) * 2 + 64;
    if nofile < need {
        return Err(format!("scale: RLIMIT_NOFILE is {nofile}; {need} descriptors needed").into());
    }
    let ch = EventChannel::new()?;
    // Resources sized for the larger round; their memory is touched before the baseline.
    let n = args.conns.max(args.after).max(1);
    let res = {
        let probe = CmId::create(None, PortSpace::Tcp)?;
        probe.resolve_addr(None, dst, 2000)?;
        let ctx = probe.context().ok_or("scale: the resolved id has no device")?;
        probe.destroy()?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq((4 * n + 64) as u32, None)?;
        let lw = Access::LOCAL_WRITE;
        let src = pd.alloc_mr(n * SLOT, lw)?;
        let msg = pd.alloc_mr(n * MSG, lw)?;
        let ack = pd.alloc_mr(n * MSG, lw)?;
        for mr in [&src, &msg, &ack] {
            touch(mr)?;
        }
        ClientRes { pd, cq, src, msg, ack }
    };
    let timeout = Duration::from_secs(args.timeout);
    // Warm-up: one full cycle, so one-time costs (progress thread, device lists) are not counted.
    let warm = round(&ch, &res, dst, 1, 1, timeout, None)?;
    if warm.verified != 1 {
        return Err(format!("scale: the warm-up connection failed: {:?}", warm.reasons).into());
    }
    let rss_base = rss_kib();
    let fds_base = fd_count();
    let sources_base = reactor_sources();
    let mut server = None;
    let main = round(&ch, &res, dst, args.conns, args.window, timeout, Some(&mut server))?;
    let rss_end = rss_kib();
    let fds_end = fd_count();
    let sources_end = reactor_sources();
    let after = if args.after > 0 {
        Some(round(&ch, &res, dst, args.after, 64, timeout, None)?)
    } else {
        None
    };
    let per = |v: u64, base: u64, n: usize| v.saturating_sub(base) as f64 / n.max(1) as f64;
    let up = main.established;
    let s = server.unwrap_or_default();
    let summary = serde_json::json!({
        "attempted": main.attempted,
        "window": args.window,
        "established": main.established,
        "rejected": main.rejected,
        "unreachable": main.unreachable,
        "connect_errors": main.connect_errors,
        "other_failures": main.other,
        "hung": main.hung,
        "verified": main.verified,
        "data_failures": main.data_failures,
        "disconnected": main.disconnected,
        "setup_s": main.setup.as_secs_f64(),
        "data_s": main.data.as_secs_f64(),
        "teardown_s": main.teardown.as_secs_f64(),
        "client_rss_base_kib": rss_base,
        "client_rss_up_kib": main.rss_up,
        "client_rss_end_kib": rss_end,
        "client_rss_per_conn_kib": per(main.rss_up, rss_base, up),
        "client_fds_base": fds_base,
        "client_fds_up": main.fds_up,
        "client_fds_end": fds_end,
        "client_fds_per_conn": per(main.fds_up, fds_base, up),
        "client_sources_base": sources_base,
        "client_sources_end": sources_end,
        "server_live": s.live,
        "server_accepted": s.accepted,
        "server_verified": s.verified,
        "server_errors": s.errors,
        "server_rss_base_kib": s.rss_base,
        "server_rss_up_kib": s.rss_now,
        "server_rss_per_conn_kib": per(s.rss_now, s.rss_base, s.live as usize),
        "server_fds_base": s.fds_base,
        "server_fds_up": s.fds_now,
        "server_fds_per_conn": per(s.fds_now, s.fds_base, s.live as usize),
        "server_sources": s.sources,
        "after_established": after.as_ref().map(|a| a.established),
        "after_verified": after.as_ref().map(|a| a.verified),
        "reasons": main.reasons.iter().take(5).collect::<Vec<_>>(),
    });
    if args.json {
        println!("{summary}");
    } else {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    let mut fail = Vec::new();
    let refused = main.rejected + main.unreachable;
    if main.hung > 0 {
        fail.push(format!("{} attempts had no outcome within {timeout:?}", main.hung));
    }
    if main.connect_errors + main.other > 0 {
        fail.push(format!(
            "{} attempts failed otherwise than by a reject or a timeout",
            main.connect_errors + main.other
        ));
    }
    if refused > 0 && !args.allow_rejects {
        fail.push(format!("{refused} attempts were rejected or timed out"));
    }
    if main.verified != main.established || main.data_failures > 0 || s.errors > 0 {
        fail.push(format!(
            "data verified on {} of {} connections ({} failures, {} server errors)",
            main.verified, main.established, main.data_failures, s.errors
        ));
    }
    if main.disconnected != main.established {
        fail.push(format!(
            "{} of {} connections saw DISCONNECTED",
            main.disconnected, main.established
        ));
    }
    if fds_end > fds_base || sources_end > sources_base {
        fail.push(format!(
            "after teardown: fds {fds_base} -> {fds_end}, progress-thread sources {sources_base} -> {sources_end}"
        ));
    }
    if let Some(a) = &after {
        if a.verified != args.after {
            fail.push(format!(
                "afterwards only {} of {} new connections worked: {:?}",
                a.verified,
                args.after,
                a.reasons.iter().take(3).collect::<Vec<_>>()
            ));
        }
    }
    if fail.is_empty() {
        Ok(())
    } else {
        Err(format!("scale: FAILED: {}", fail.join("; ")).into())
    }
}

/// Asks the server for its figures (a connection it rejects with them).
fn server_figures(dst: SocketAddr, res: &ClientRes) -> Result<ServerFigures, String> {
    let ch = EventChannel::new().map_err(|e| e.to_string())?;
    let id = CmId::create(Some(&ch), PortSpace::Tcp).map_err(|e| e.to_string())?;
    let r = (|| {
        id.resolve_addr(None, dst, 2000).map_err(|e| e.to_string())?;
        drop(next_event(&ch, Duration::from_secs(10), "ADDR_RESOLVED")?);
        id.resolve_route(2000).map_err(|e| e.to_string())?;
        drop(next_event(&ch, Duration::from_secs(10), "ROUTE_RESOLVED")?);
        id.create_qp(&res.pd, qp_init(&res.cq)).map_err(|e| e.to_string())?;
        let mut pd = MAGIC.to_vec();
        pd.extend_from_slice(&[HELLO_STATS, 0, 0, 0]);
        id.connect(&ConnParam {
            private_data: pd,
            ..ConnParam::default()
        })
        .map_err(|e| e.to_string())?;
        let ev = next_event(&ch, Duration::from_secs(30), "REJECTED")?;
        let b = ev.param.private_data.clone();
        let what = ev.event;
        drop(ev);
        if what != EventType::Rejected || b.len() < 4 + 9 * 8 || &b[..4] != MAGIC {
            return Err(format!("the STATS request got {what} ({} bytes)", b.len()));
        }
        let f = |i: usize| le64(&b, 4 + 8 * i);
        Ok(ServerFigures {
            live: f(0),
            accepted: f(1),
            verified: f(2),
            errors: f(3),
            rss_base: f(4),
            rss_now: f(5),
            fds_base: f(6),
            fds_now: f(7),
            sources: f(8),
        })
    })();
    let _ = id.destroy_qp();
    let _ = id.destroy();
    r
}

/// Opens `n` connections (`window` attempts at a time, 0 = all), moves data on each, measures,
/// disconnects and destroys them all.
fn round(
    ch: &EventChannel,
    res: &ClientRes,
    dst: SocketAddr,
    n: usize,
    window: usize,
    timeout: Duration,
    server: Option<&mut Option<ServerFigures>>,
) -> Result<Round, Box<dyn std::error::Error>> {
    let window = if window == 0 { n } else { window };
    let mut r = Round {
        attempted: n,
        ..Round::default()
    };
    let mut conns: Vec<CConn> = Vec::with_capacity(n);
    let started = Instant::now();
    let deadline = started + timeout;
    let mut in_flight = 0usize;
    let mut done = 0usize;
    let fail = |r: &mut Round, c: &mut CConn, why: String| {
        c.phase = Phase::Failed;
        if r.reasons.len() < 20 {
            r.reasons.push(why);
        }
    };
    while done < n {
        while conns.len() < n && in_flight < window {
            let id = CmId::create(Some(ch), PortSpace::Tcp)?;
            let i = conns.len();
            conns.push(CConn {
                id: id.clone(),
                phase: Phase::Resolving,
                remote: (0, 0),
            });
            in_flight += 1;
            if let Err(e) = id.resolve_addr(None, dst, 2000) {
                r.other += 1;
                fail(&mut r, &mut conns[i], format!("rdma_resolve_addr: {e}"));
                in_flight -= 1;
                done += 1;
            }
        }
        if done >= n {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = match ch.get_event(Some(left.max(Duration::from_millis(1)))) {
            Ok(ev) => ev,
            Err(_) if Instant::now() >= deadline => {
                for c in conns
                    .iter_mut()
                    .filter(|c| !matches!(c.phase, Phase::Up | Phase::Failed))
                {
                    c.phase = Phase::Failed;
                    r.hung += 1;
                }
                break;
            }
            Err(_) => continue,
        };
        let Some(i) = conns.iter().rposition(|c| c.id == ev.id) else {
            drop(ev);
            continue;
        };
        let (what, status, reason, pdata) = (ev.event, ev.status, ev.reason.clone(), ev.param.private_data.clone());
        drop(ev);
        let c = &mut conns[i];
        let step = match (c.phase, what) {
            (Phase::Resolving, EventType::AddrResolved) => c.id.resolve_route(2000).map(|_| Phase::Routing),
            (Phase::Routing, EventType::RouteResolved) => (|| {
                let qp = c.id.create_qp(&res.pd, qp_init(&res.cq))?;
                qp.post_recv_one(i as u64, res.ack.sge(i * MSG, MSG as u32))?;
                let mut pd = MAGIC.to_vec();
                pd.extend_from_slice(&[HELLO_DATA, 0, 0, 0]);
                c.id.connect(&ConnParam {
                    private_data: pd,
                    responder_resources: 1,
                    initiator_depth: 1,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    ..ConnParam::default()
                })?;
                Ok(Phase::Connecting)
            })(),
            (Phase::Connecting, EventType::Established) => {
                if pdata.len() >= 16 && &pdata[..4] == MAGIC {
                    c.remote = (le64(&pdata, 4), le32(&pdata, 12));
                    Ok(Phase::Up)
                } else {
                    Err(softrdma_verbs::Error::new(
                        softrdma_verbs::Errno::Proto,
                        "accept without a slot".to_string(),
                    ))
                }
            }
            (_, other) => {
                let why = format!("{other} (status {status}) {reason}");
                match other {
                    EventType::Rejected => r.rejected += 1,
                    EventType::Unreachable => r.unreachable += 1,
                    EventType::ConnectError => r.connect_errors += 1,
                    _ => r.other += 1,
                }
                fail(&mut r, c, why);
                in_flight -= 1;
                done += 1;
                continue;
            }
        };
        match step {
            Ok(Phase::Up) => {
                c.phase = Phase::Up;
                r.established += 1;
                in_flight -= 1;
                done += 1;
            }
            Ok(p) => c.phase = p,
            Err(e) => {
                r.other += 1;
                fail(&mut r, c, e.to_string());
                in_flight -= 1;
                done += 1;
            }
        }
    }
    r.setup = started.elapsed();
    // Data: a WRITE into the connection's slot and a SEND naming its seed; the server checks
    // both and ACKs.
    let t = Instant::now();
    let mut rng = Rng::new(t.elapsed().as_nanos() as u64 ^ std::process::id() as u64);
    let mut seeds = vec![0u64; n];
    let mut expect = 0usize;
    for (i, c) in conns.iter().enumerate().filter(|(_, c)| c.phase == Phase::Up) {
        let seed = rng.next_u64();
        seeds[i] = seed;
        res.src.write(i * SLOT, &generate(SLOT, seed))?;
        let mut m = vec![0u8; MSG];
        m[..4].copy_from_slice(MAGIC);
        m[8..16].copy_from_slice(&seed.to_le_bytes());
        m[16..].copy_from_slice(&generate(MSG - 16, !seed));
        res.msg.write(i * MSG, &m)?;
        let Some(qp) = c.id.qp() else { continue };
        let mut w = SendWr::write(
            u64::MAX - 1,
            vec![res.src.sge(i * SLOT, SLOT as u32)],
            c.remote.0,
            c.remote.1,
        );
        w.flags = softrdma_verbs::SendFlags(0);
        let posted = qp
            .post_send(&[w, SendWr::send(u64::MAX, vec![res.msg.sge(i * MSG, MSG as u32)])])
            .map_err(|(_, e)| e);
        match posted {
            Ok(()) => expect += 2, // the SEND completion and the ACK
            Err(e) => {
                r.data_failures += 1;
                if r.reasons.len() < 20 {
                    r.reasons.push(format!("post_send: {e}"));
                }
            }
        }
    }
    let mut acked = vec![false; n];
    let deadline = Instant::now() + timeout;
    let mut got = 0usize;
    let mut a = [0u8; MSG];
    while got < expect && Instant::now() < deadline {
        let Some(wc) = res.cq.poll_one() else {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        };
        got += 1;
        if wc.status != WcStatus::Success {
            r.data_failures += 1;
            if r.reasons.len() < 20 {
                r.reasons
                    .push(format!("QP {}: {:?} {}", wc.qp_num, wc.opcode, wc.status.as_str()));
            }
            continue;
        }
        if wc.opcode == WcOpcode::Recv {
            let i = wc.wr_id as usize;
            res.ack.read(i * MSG, &mut a)?;
            if &a[..4] == MAGIC && le32(&a, 4) == ACK_OK && le64(&a, 8) == seeds[i] && !acked[i] {
                acked[i] = true;
                r.verified += 1;
            } else {
                r.data_failures += 1;
            }
        }
    }
    if got < expect {
        r.data_failures += (expect - got).div_ceil(2);
        r.reasons
            .push(format!("{} completions missing after {timeout:?}", expect - got));
    }
    r.data = t.elapsed();
    r.rss_up = rss_kib();
    r.fds_up = fd_count();
    if let Some(s) = server {
        *s = Some(server_figures(dst, res)?);
    }
    // Teardown: disconnect every established connection, wait for each DISCONNECTED.
    let t = Instant::now();
    for c in conns.iter().filter(|c| c.phase == Phase::Up) {
        let _ = c.id.disconnect();
    }
    let mut waiting = conns.iter().filter(|c| c.phase == Phase::Up).count();
    let deadline = Instant::now() + timeout;
    while waiting > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(ev) = ch.get_event(Some(left.max(Duration::from_millis(1)))) else {
            if Instant::now() >= deadline {
                break;
            }
            continue;
        };
        if ev.event == EventType::Disconnected {
            r.disconnected += 1;
            waiting -= 1;
        }
        drop(ev);
    }
    // Completions left from the failed ones (flushes) must not leak into the next round.
    while res.cq.poll_one().is_some() {}
    for c in conns {
        let _ = c.id.destroy_qp();
        c.id.destroy()?;
    }
    while res.cq.poll_one().is_some() {}
    r.teardown = t.elapsed();
    Ok(r)
}
