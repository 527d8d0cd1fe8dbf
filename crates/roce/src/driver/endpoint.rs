//! The process-wide soft-RoCE endpoint: its sockets, its QP table, and the progress-thread
//! loop that moves datagrams between the sockets and the engines.

use super::forward::{self, Origin};
use super::gso;
use super::hold::{HoldAction, SocketHold};
use super::net::{self, ROCE_PORT};
use super::qpn::{make_qpn, split_qpn, GSI_QPN, MULTICAST_QPN, QPS_PER_PORT};
use super::slot::Slot;
use super::stats::DriverCounters;
use softrdma_verbs::caller_step::CallerStep;
use softrdma_verbs::fork::{CloseInChild, PerProcess};
use softrdma_verbs::progress::{Event, Interest, Reactor, Source, Token};
use softrdma_verbs::{Errno, Error, Result};
use softrdma_wire::roce::{check_icrc, check_icrc_any_id, icrc, icrc_bytes, IcrcIp, ICRC_LEN};
use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// Largest datagram handled (a 4096-byte MTU packet plus headers, with room to spare).
const MAX_DATAGRAM: usize = 9216;
/// A receive buffer for a run of datagrams (the largest UDP payload).
const RUN_BUFFER: usize = 65_536;

/// A home socket: one ephemeral UDP port and the 255 QPNs built on it. Other processes
/// forward this process's packets to it (see the `forward` module).
#[derive(Debug)]
pub(crate) struct Home {
    pub(crate) port: u16,
    pub(crate) sock: net::RoceSocket,
    used: Mutex<Vec<bool>>,
    cursor: std::sync::atomic::AtomicUsize,
    token: OnceLock<Token>,
    /// Marks `port` as a softrdma home port, so other processes forward to it (`forward`).
    _marker: Option<CloseInChild<UnixDatagram>>,
}

thread_local! {
    /// A receiving thread's buffers and control-message space: room for a whole run of
    /// datagrams that `UDP_GRO` keeps together (see `gso`), else for one datagram.
    static RX: std::cell::RefCell<net::RxBatch> = std::cell::RefCell::new(net::RxBatch::new(if gso::wanted() {
        RUN_BUFFER
    } else {
        MAX_DATAGRAM + forward::FORWARD_HDR_LEN
    }));
}

thread_local! {
    /// Slots that received packets since the last flush (progress thread only).
    static DIRTY: std::cell::RefCell<Vec<Arc<Slot>>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn mark_dirty(slot: Arc<Slot>) {
    DIRTY.with(|d| {
        let mut d = d.borrow_mut();
        if !d.iter().any(|s| Arc::ptr_eq(s, &slot)) {
            d.push(slot);
        }
    });
}

/// The endpoint of each fork generation: a forked child opens its own sockets and QP table
/// (see `softrdma_verbs::fork`).
static EP: PerProcess<std::result::Result<Arc<Endpoint>, Error>> = PerProcess::new();

/// A claimed service: its socket (REQs forwarded to it arrive here), its reactor token, and
/// the marker socket naming this process's home port (see `mads`).
type Claimed = (UnixDatagram, Token, Option<CloseInChild<UnixDatagram>>);

/// What the progress thread is woken for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Shared,
    HomeUdp(u16),
    Service(u64),
    Control,
}

/// The endpoint. One per process ([`Endpoint::global`]).
pub(crate) struct Endpoint {
    reactor: &'static Arc<Reactor>,
    shared: Option<net::RoceSocket>,
    /// The shared socket's port, read once (`getsockname` on every poll showed in profiles).
    roce_port: u16,
    homes: RwLock<Vec<Arc<Home>>>,
    roles: Mutex<HashMap<Token, Role>>,
    control: OnceLock<Token>,
    /// The shared socket's reactor token.
    shared_token: OnceLock<Token>,
    /// Whether blocked waiters hold the UDP sockets (see `hold`).
    hold: Mutex<SocketHold>,
    qps: RwLock<HashMap<u32, Arc<Slot>>>,
    pending: Mutex<HashSet<u32>>,
    timer_at: Mutex<Option<Instant>>,
    mcast: Mutex<HashMap<Ipv4Addr, HashSet<u32>>>,
    services: Mutex<HashMap<u64, Claimed>>,
    pub(crate) owners: Mutex<HashMap<u64, (Instant, u16)>>,
    /// Ports recently found to be softrdma home ports (see [`Endpoint::forward_to_home`]).
    home_ports: Mutex<HashMap<u16, Instant>>,
    opening: Mutex<()>,
    local_addrs: Mutex<Option<(Instant, HashMap<IpAddr, u32>)>>,
    internal: Mutex<std::collections::VecDeque<(Vec<u8>, Origin)>>,
    /// Held by the thread that reads the UDP sockets and the internal queue: the progress
    /// thread, or a polling application thread ([`CallerStep`]). One reader at a time keeps
    /// the datagrams of a QP in their order.
    rx: Mutex<()>,
    direct: bool,
    pub(crate) handler: RwLock<Option<Arc<dyn crate::gsi::MadHandler>>>,
    /// Counters for tools and tests.
    pub(crate) counters: DriverCounters,
    self_ref: OnceLock<std::sync::Weak<Endpoint>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("shared", &self.shared)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// Receive batches (of [`net::BATCH`] datagrams) a polling caller reads per socket in one
/// step. The step is bounded so that `ibv_poll_cq` returns soon; what is left stays readable
/// (level-triggered epoll) for the next poll or the progress thread.
const CALLER_BATCHES: usize = 2;

/// The reactor calls the endpoint through this (the endpoint lives for the whole process).
struct Driven(Arc<Endpoint>);

impl Source for Driven {
    fn on_event(&self, token: Token, ev: Event) {
        self.0.on_event(token, ev);
    }
}

impl Driven {
    /// What waits in the sockets and the internal queue, read and processed on this thread,
    /// unless another thread is reading them right now; the slots that received stay in
    /// `DIRTY` for the caller to flush.
    fn receive(&self) -> bool {
        let ep = &self.0;
        let Ok(_rx) = ep.rx.try_lock() else { return false };
        let before = ep.counters.rx_datagrams.load(Ordering::Relaxed);
        let any = ep.run_internal();
        // A copy, the lock released before the loop: a `for` keeps its iterator expression's
        // temporaries (the guard) alive to the end, and receiving takes `homes` again while a
        // closing QP may be waiting to write it (a writer-preferring lock: deadlock).
        let homes: Vec<Arc<Home>> = ep.homes.read().unwrap_or_else(|p| p.into_inner()).clone();
        for h in homes {
            ep.drain_udp(&h.sock, h.port, true, CALLER_BATCHES);
        }
        if let Some(s) = &ep.shared {
            ep.drain_udp(s, ep.roce_port(), false, CALLER_BATCHES);
        }
        any | (ep.counters.rx_datagrams.load(Ordering::Relaxed) != before)
    }
}

impl CallerStep for Driven {
    /// A polling application's round: [`Driven::receive`], then what it made the slots send.
    fn step(&self) -> bool {
        let any = self.receive();
        self.0.flush_dirty();
        any
    }

    /// A blocked caller's round: [`Driven::receive`]; the slots are flushed in `after_ready`.
    fn step_ready(&self, _ready: &[std::os::fd::RawFd]) -> bool {
        self.receive()
    }

    /// What the slots have to send after the step (the ACKs it owes, the next packets of the
    /// window) goes out on the caller's thread, before it returns or waits on: the peer,
    /// often busy-polling for that ACK, gets it now rather than after this side's progress
    /// thread woke (`ib_send_lat -e` over rxe_lo 20.8–22.6 → 10.6–13.4 µs with guest halt
    /// polling on; with the VM's immediate halt about the same, median 29.0 → 30.7 µs; see
    /// README, Benchmarks).
    fn after_ready(&self) {
        self.0.flush_dirty();
    }

    /// The UDP sockets: the shared one and each home socket.
    fn wait_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        let ep = &self.0;
        out.extend(ep.shared.as_ref().map(|s| s.as_raw_fd()));
        out.extend(
            ep.homes
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|h| h.sock.as_raw_fd()),
        );
    }

    fn waiter_enters(&self) {
        let ep = &self.0;
        let mut hold = lock(&ep.hold);
        let a = hold.enter();
        ep.apply_hold(a);
    }

    fn waiter_leaves(&self, linger: bool) {
        let ep = &self.0;
        let mut hold = lock(&ep.hold);
        let a = hold.leave(linger, Instant::now());
        ep.apply_hold(a);
    }
}

/// How much later an armed timer must be wanted before [`Endpoint::schedule`] moves it.
const RETIME_SLACK: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Endpoint {
    /// The process's endpoint, created (sockets bound, progress thread started) on first use.
    pub(crate) fn global() -> Result<Arc<Endpoint>> {
        EP.get_or_init(Endpoint::start).clone()
    }

    /// The endpoint if one was started.
    pub(crate) fn existing() -> Option<Arc<Endpoint>> {
        EP.get().and_then(|r| r.as_ref().ok()).cloned()
    }

    fn start() -> Result<Arc<Endpoint>> {
        let reactor = Reactor::global()?;
        let port = softrdma_verbs::settings::ROCE_PORT.parse::<u16>().unwrap_or(ROCE_PORT);
        let shared = match net::bind_shared(port) {
            Ok(s) => {
                tracing::debug!(
                    port,
                    dual_stack = s.is_dual(),
                    gro = s.gro(),
                    "soft-RoCE: shared UDP socket"
                );
                Some(s)
            }
            Err(e) => {
                tracing::warn!(
                    "soft-RoCE: cannot bind UDP port {port} ({e}); only packets forwarded by other \
                     softrdma processes will arrive (is Linux rxe loaded, or another user running softrdma?)"
                );
                None
            }
        };
        let roce_port = shared
            .as_ref()
            .and_then(|s| s.local_addr().ok())
            .map(|a| a.port())
            .unwrap_or(port);
        let ep = Arc::new(Endpoint {
            reactor,
            shared,
            roce_port,
            homes: RwLock::new(Vec::new()),
            roles: Mutex::new(HashMap::new()),
            control: OnceLock::new(),
            shared_token: OnceLock::new(),
            hold: Mutex::new(SocketHold::default()),
            qps: RwLock::new(HashMap::new()),
            pending: Mutex::new(HashSet::new()),
            timer_at: Mutex::new(None),
            mcast: Mutex::new(HashMap::new()),
            services: Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
            home_ports: Mutex::new(HashMap::new()),
            opening: Mutex::new(()),
            local_addrs: Mutex::new(None),
            internal: Mutex::new(std::collections::VecDeque::new()),
            rx: Mutex::new(()),
            direct: !softrdma_verbs::settings::ROCE_LOCAL.is("standard"),
            handler: RwLock::new(None),
            counters: DriverCounters::default(),
            self_ref: OnceLock::new(),
        });
        let _ = ep.self_ref.set(Arc::downgrade(&ep));
        let control = reactor.add(Arc::new(Driven(ep.clone())));
        let _ = ep.control.set(control);
        lock(&ep.roles).insert(control, Role::Control);
        softrdma_verbs::caller_step::add(Arc::new(Driven(ep.clone())));
        if let Some(s) = &ep.shared {
            let t = reactor
                .register(s.as_raw_fd(), READ, Arc::new(Driven(ep.clone())))
                .map_err(|e| Error::os(format_args!("soft-RoCE: epoll on UDP {port}"), &e))?;
            let _ = ep.shared_token.set(t);
            lock(&ep.roles).insert(t, Role::Shared);
        }
        Ok(ep)
    }

    fn me(&self) -> Option<Arc<Endpoint>> {
        self.self_ref.get().and_then(|w| w.upgrade())
    }

    /// The UDP port datagrams are sent to (4791 unless `SOFTRDMA_ROCE_PORT` says otherwise).
    pub(crate) fn roce_port(&self) -> u16 {
        self.roce_port
    }

    /// Reserves a QPN (opening another home socket when all are full).
    pub(crate) fn alloc_qpn(&self) -> Result<(Arc<Home>, u32)> {
        {
            let homes = self.homes.read().unwrap_or_else(|p| p.into_inner());
            for h in homes.iter() {
                if let Some(q) = h.take_index() {
                    return Ok((h.clone(), q));
                }
            }
        }
        let home = {
            let _guard = lock(&self.opening);
            let homes = self.homes.read().unwrap_or_else(|p| p.into_inner());
            let free = homes.iter().find_map(|h| h.take_index().map(|q| (h.clone(), q)));
            drop(homes);
            if let Some(found) = free {
                return Ok(found);
            }
            self.open_home()?
        };
        match home.take_index() {
            Some(q) => Ok((home, q)),
            None => Err(Error::new(
                Errno::NoMem,
                "soft-RoCE: no QP number left on a new home port",
            )),
        }
    }

    fn open_home(&self) -> Result<Arc<Home>> {
        let io_err = |what: &str, e: io::Error| {
            Error::new(
                Errno::from_raw(e.raw_os_error().unwrap_or(0)),
                format!("soft-RoCE: {what}: {e}"),
            )
        };
        let (sock, port) = net::bind_home().map_err(|e| io_err("cannot open a UDP socket", e))?;
        let marker = forward::bind_home_marker(port)
            .map_err(|e| tracing::warn!(port, "soft-RoCE: cannot mark the home port: {e}"))
            .ok()
            .map(CloseInChild::new);
        let home = Arc::new(Home {
            port,
            sock,
            used: Mutex::new(vec![false; QPS_PER_PORT + 1]),
            cursor: std::sync::atomic::AtomicUsize::new(0),
            token: OnceLock::new(),
            _marker: marker,
        });
        let me = self
            .me()
            .ok_or_else(|| Error::new(Errno::Io, "soft-RoCE: endpoint is shutting down"))?;
        let mut homes = self.homes.write().unwrap_or_else(|p| p.into_inner());
        let t1 = self
            .reactor
            .register(home.sock.as_raw_fd(), READ, Arc::new(Driven(me)))
            .map_err(|e| io_err("epoll", e))?;
        let _ = home.token.set(t1);
        lock(&self.roles).insert(t1, Role::HomeUdp(port));
        homes.push(home.clone());
        tracing::debug!(port, "soft-RoCE: new home port");
        Ok(home)
    }

    /// Registers a QP's slot under its number.
    pub(crate) fn insert(&self, slot: Arc<Slot>) {
        self.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slot.qpn, slot);
    }

    /// Forgets a QP and frees its number.
    pub(crate) fn remove(&self, qpn: u32) {
        let slot = self.qps.write().unwrap_or_else(|p| p.into_inner()).remove(&qpn);
        lock(&self.pending).remove(&qpn);
        for members in lock(&self.mcast).values_mut() {
            members.remove(&qpn);
        }
        if let Some(s) = slot {
            s.home.release(qpn);
            self.close_if_idle(&s.home);
        }
    }

    /// Closes a home socket whose QPs are all gone; the first one stays (it names this process
    /// in CM communication IDs).
    fn close_if_idle(&self, home: &Arc<Home>) {
        let mut homes = self.homes.write().unwrap_or_else(|p| p.into_inner());
        let Some(pos) = homes.iter().position(|h| Arc::ptr_eq(h, home)) else {
            return;
        };
        if pos == 0 || lock(&home.used).iter().any(|u| *u) {
            return;
        }
        homes.remove(pos);
        if let Some(t) = home.token.get() {
            self.reactor.deregister(*t, Some(home.sock.as_raw_fd()));
            lock(&self.roles).remove(t);
        }
        tracing::debug!(port = home.port, "soft-RoCE: home port closed (no QPs left)");
    }

    fn slot(&self, qpn: u32) -> Option<Arc<Slot>> {
        self.qps.read().unwrap_or_else(|p| p.into_inner()).get(&qpn).cloned()
    }

    /// Asks the progress thread to look at `qpn` (new work, or a state change).
    pub(crate) fn kick(&self, qpn: u32) {
        lock(&self.pending).insert(qpn);
        if let Some(t) = self.control.get() {
            self.reactor.kick(*t);
        }
    }

    /// Joins multicast `group` for `qpn`, receiving on the interface that owns `local`.
    pub(crate) fn join(&self, qpn: u32, group: Ipv4Addr, local: Ipv4Addr) -> Result<()> {
        let Some(shared) = &self.shared else {
            return Err(Error::new(
                Errno::AddrInUse,
                format!("attach_mcast on QP {qpn}: UDP port {ROCE_PORT} is not available to this process"),
            ));
        };
        let mut m = lock(&self.mcast);
        let members = m.entry(group).or_default();
        if members.is_empty() {
            shared.set_membership_v4(group, local, true).map_err(|e| {
                Error::new(
                    Errno::from_raw(e.raw_os_error().unwrap_or(0)),
                    format!("attach_mcast on QP {qpn}: cannot join {group} on {local}: {e}"),
                )
            })?;
        }
        members.insert(qpn);
        Ok(())
    }

    /// Leaves multicast `group` for `qpn`.
    pub(crate) fn leave(&self, qpn: u32, group: Ipv4Addr, local: Ipv4Addr) -> Result<()> {
        let mut m = lock(&self.mcast);
        let Some(members) = m.get_mut(&group) else {
            return Err(Error::inval(format!(
                "detach_mcast on QP {qpn}: not attached to {group}"
            )));
        };
        if !members.remove(&qpn) {
            return Err(Error::inval(format!(
                "detach_mcast on QP {qpn}: not attached to {group}"
            )));
        }
        if members.is_empty() {
            m.remove(&group);
            if let Some(shared) = &self.shared {
                let _ = shared.set_membership_v4(group, local, false);
            }
        }
        Ok(())
    }

    /// Carries out what the socket hold decided (called with `hold` locked, so that two
    /// decisions are applied in their order).
    fn apply_hold(&self, a: HoldAction) {
        let set = |interest: Interest| {
            if let (Some(s), Some(t)) = (&self.shared, self.shared_token.get()) {
                self.reactor.set_interest(*t, s.as_raw_fd(), interest);
            }
            for h in self.homes.read().unwrap_or_else(|p| p.into_inner()).iter() {
                if let Some(t) = h.token.get() {
                    self.reactor.set_interest(*t, h.sock.as_raw_fd(), interest);
                }
            }
        };
        match a {
            HoldAction::None => {}
            HoldAction::Take => set(NOTHING),
            HoldAction::GiveBack => set(READ),
            HoldAction::Arm(at) => {
                if let Some(t) = self.control.get() {
                    self.reactor.set_timer(*t, at);
                }
            }
        }
    }

    /// Arms the progress thread's timer for `deadline` if nothing earlier is armed. A
    /// deadline that moved later (an idle QP's probe was answered: its next one is 2 s away,
    /// not the probe's 1 s ACK timeout) withdraws the armed timer once no QP needs it any
    /// more, so that it does not wake the thread for nothing; a move of less than
    /// [`RETIME_SLACK`] leaves it (it would only cost an early, harmless timer round).
    pub(crate) fn schedule(&self, deadline: Option<Instant>) {
        let Some(d) = deadline else { return };
        let mut at = lock(&self.timer_at);
        let now = Instant::now();
        let Some(t) = self.control.get() else {
            *at = Some(d);
            return;
        };
        match *at {
            Some(cur) if cur > now && d >= cur => {
                if d < cur + RETIME_SLACK {
                    return;
                }
                let Some(next) = self.earliest_slot_deadline() else {
                    return;
                };
                if next < cur + RETIME_SLACK {
                    return;
                }
                self.reactor.cancel_timer(*t, cur);
                *at = Some(next);
                self.reactor.set_timer(*t, next);
            }
            _ => {
                *at = Some(d);
                self.reactor.set_timer(*t, d);
            }
        }
    }

    /// The earliest deadline any QP has (see [`Slot::deadline`]).
    fn earliest_slot_deadline(&self) -> Option<Instant> {
        self.qps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter_map(|s| s.deadline())
            .min()
    }

    fn on_event(&self, token: Token, ev: Event) {
        self.dispatch(token, ev);
        self.flush_dirty();
    }

    /// Flushes every slot that received packets in this round, once.
    fn flush_dirty(&self) {
        loop {
            let Some(slot) = DIRTY.with(|d| d.borrow_mut().pop()) else {
                break;
            };
            let next = slot.flush_now(self);
            self.schedule(next);
        }
    }

    fn dispatch(&self, token: Token, ev: Event) {
        let role = lock(&self.roles).get(&token).copied();
        match role {
            Some(Role::Shared) => {
                if let Some(s) = &self.shared {
                    let _rx = lock(&self.rx);
                    self.drain_udp(s, self.roce_port(), false, usize::MAX);
                }
            }
            Some(Role::HomeUdp(port)) => {
                if let Some(h) = self.home_by_port(port) {
                    let _rx = lock(&self.rx);
                    self.drain_udp(&h.sock, h.port, true, usize::MAX);
                }
            }
            Some(Role::Service(sid)) => self.drain_service(sid),
            Some(Role::Control) => {
                if ev.kicked {
                    // Kicks come on every blocked caller's receive (see `step_ready`); the
                    // receive lock is taken only for work, or the caller's next step finds it
                    // taken and gives the sockets back.
                    if !lock(&self.internal).is_empty() {
                        let _rx = lock(&self.rx);
                        self.run_internal();
                    }
                    self.run_pending();
                }
                if ev.timer {
                    {
                        let mut hold = lock(&self.hold);
                        let a = hold.on_timer(Instant::now());
                        self.apply_hold(a);
                    }
                    self.run_timers();
                }
            }
            None => {}
        }
    }

    fn home_by_port(&self, port: u16) -> Option<Arc<Home>> {
        self.homes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|h| h.port == port)
            .cloned()
    }

    fn home(&self, i: usize) -> Option<Arc<Home>> {
        self.homes.read().unwrap_or_else(|p| p.into_inner()).get(i).cloned()
    }

    /// The first home socket (opened on demand): MADs go out from it, and its port names
    /// this process in communication IDs.
    pub(crate) fn first_home(&self) -> Result<Arc<Home>> {
        if let Some(h) = self.home(0) {
            return Ok(h);
        }
        let _guard = lock(&self.opening);
        match self.home(0) {
            Some(h) => Ok(h),
            None => self.open_home(),
        }
    }

    /// Records a claimed service and watches its socket.
    pub(crate) fn add_service(&self, sid: u64, sock: UnixDatagram, marker: Option<UnixDatagram>) -> Result<()> {
        let me = self
            .me()
            .ok_or_else(|| Error::new(Errno::Io, "soft-RoCE: endpoint is shutting down"))?;
        let t = self
            .reactor
            .register(sock.as_raw_fd(), READ, Arc::new(Driven(me)))
            .map_err(|e| Error::os("soft-RoCE: epoll", &e))?;
        lock(&self.roles).insert(t, Role::Service(sid));
        lock(&self.services).insert(sid, (sock, t, marker.map(CloseInChild::new)));
        Ok(())
    }

    /// Forgets a claimed service.
    pub(crate) fn release_service(&self, sid: u64) {
        if let Some((sock, t, _marker)) = lock(&self.services).remove(&sid) {
            self.reactor.deregister(t, Some(sock.as_raw_fd()));
            lock(&self.roles).remove(&t);
        }
    }

    pub(crate) fn claims_service(&self, sid: u64) -> bool {
        lock(&self.services).contains_key(&sid)
    }

    fn drain_service(&self, sid: u64) {
        let mut buf = vec![0u8; MAX_DATAGRAM + forward::FORWARD_HDR_LEN];
        loop {
            let r = match lock(&self.services).get(&sid) {
                Some((sock, _, _)) => sock.recv(&mut buf),
                None => return,
            };
            match r {
                Ok(n) => match forward::decode(&buf[..n]) {
                    Some((origin, datagram)) => {
                        self.counters.forwarded_in.fetch_add(1, Ordering::Relaxed);
                        self.on_datagram(datagram, origin, true);
                    }
                    None => {
                        self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                    }
                },
                Err(_) => return,
            }
        }
    }

    pub(crate) fn owns_home_port(&self, port: u16) -> bool {
        self.homes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|h| h.port == port)
    }

    fn drain_udp(&self, sock: &net::RoceSocket, local_port: u16, home: bool, batches: usize) {
        RX.with(|scratch| {
            let mut rx = scratch.borrow_mut();
            for _ in 0..batches {
                let n = match net::recv_batch(sock, &mut rx) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        tracing::debug!("soft-RoCE: recvmmsg: {e}");
                        break;
                    }
                };
                for i in 0..n {
                    if let Some((data, r)) = rx.datagram(i) {
                        for d in gso::segments(data, r.segment) {
                            self.on_received(d, r, local_port, home);
                        }
                    }
                }
                if n < net::BATCH {
                    break;
                }
            }
        });
    }

    fn on_received(&self, data: &[u8], r: net::Received, local_port: u16, home: bool) {
        if home && forward::is_forwarded(data) {
            // Only another process on this host may forward: loopback sources cannot arrive
            // from the network (the kernel drops them as martians).
            match forward::decode(data).filter(|_| r.src.ip().is_loopback()) {
                Some((origin, datagram)) => {
                    self.counters.forwarded_in.fetch_add(1, Ordering::Relaxed);
                    self.on_datagram(datagram, origin, true);
                }
                None => {
                    self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        let origin = Origin {
            src: r.src,
            dst_ip: r.dst_ip,
            dst_port: local_port,
            hop_limit: r.hop_limit.unwrap_or(forward::DEFAULT_HOP_LIMIT),
            traffic_class: r.traffic_class.unwrap_or(0),
        };
        self.on_datagram(data, origin, false);
    }

    /// One UDP payload (BTH .. ICRC) arrived, directly or forwarded by another process.
    fn on_datagram(&self, datagram: &[u8], origin: Origin, forwarded: bool) {
        self.counters.rx_datagrams.fetch_add(1, Ordering::Relaxed);
        if datagram.len() < 12 {
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let dqpn = u32::from_be_bytes([0, datagram[5], datagram[6], datagram[7]]);
        if dqpn == MULTICAST_QPN {
            self.deliver_multicast(datagram, &origin);
            return;
        }
        if dqpn == GSI_QPN {
            if let Some(transport) = self.verify(datagram, &origin) {
                self.on_gsi(transport, &origin, datagram, forwarded);
            }
            return;
        }
        let Some((port, _)) = split_qpn(dqpn) else {
            self.counters.unknown_qpn.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if self.owns_home_port(port) {
            self.deliver(dqpn, datagram, &origin);
        } else if !forwarded {
            // Junk is dropped here, at the first hop, not relayed.
            if self.verify(datagram, &origin).is_some() {
                self.forward(port, datagram, &origin);
            }
        } else {
            tracing::debug!(
                qpn = dqpn,
                "soft-RoCE: forwarded packet for a QP this process does not own"
            );
            self.counters.unknown_qpn.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn forward(&self, port: u16, datagram: &[u8], origin: &Origin) {
        if self.forward_to_home(port, datagram, origin) {
            self.counters.forwarded_out.fetch_add(1, Ordering::Relaxed);
        } else {
            tracing::debug!(port, "soft-RoCE: cannot forward to home port");
            self.counters.unknown_qpn.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Hands `datagram` with its origin to the process whose home socket is `port`, through
    /// loopback UDP (socket buffers hold bursts; a Unix datagram queue holds only 10). False,
    /// and nothing sent, if `port` is not a softrdma home port: the QPN or communication ID
    /// came from the network and may name any port.
    pub(crate) fn forward_to_home(&self, port: u16, datagram: &[u8], origin: &Origin) -> bool {
        if !self.is_home_port(port) {
            tracing::debug!(
                port,
                "soft-RoCE: packet for a port that is no softrdma home port (dropped)"
            );
            return false;
        }
        let Some(home) = self.home(0) else { return false };
        let mut msg = Vec::with_capacity(forward::FORWARD_HDR_LEN + datagram.len());
        forward::encode(origin, &mut msg);
        msg.extend_from_slice(datagram);
        home.sock
            .send_to(&msg, SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .is_ok()
    }

    /// Whether `port` is a softrdma home port (its owner's marker exists). A positive answer
    /// is trusted for a second; a negative one is never cached, so a new process's port is
    /// reachable at once.
    fn is_home_port(&self, port: u16) -> bool {
        let fresh = |t: &Instant| t.elapsed() < Duration::from_secs(1);
        if lock(&self.home_ports).get(&port).is_some_and(fresh) {
            return true;
        }
        let marked = forward::is_home_port(port);
        let mut seen = lock(&self.home_ports);
        if !marked {
            seen.remove(&port);
            return false;
        }
        if seen.len() >= 4096 {
            seen.retain(|_, t| fresh(t));
        }
        seen.insert(port, Instant::now());
        true
    }

    fn verify<'a>(&self, datagram: &'a [u8], origin: &Origin) -> Option<&'a [u8]> {
        if let (IpAddr::V6(src), IpAddr::V6(dst)) = (origin.src.ip(), origin.dst_ip) {
            return self.verify_v6(datagram, origin, src, dst);
        }
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (origin.src.ip(), origin.dst_ip) else {
            self.counters.unsupported.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        // The IPv4 Identification and DF are covered but not visible on a UDP socket; the
        // ICRC itself tells which ones the sender used (ID 0 + DF from softrdma, a running
        // ID from Linux rdma_rxe).
        if let Ok((t, _)) = check_icrc_any_id(src, dst, origin.src.port(), origin.dst_port, datagram) {
            return Some(t);
        }
        self.counters.icrc_errors.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(src = %origin.src, "soft-RoCE: bad ICRC, packet dropped");
        None
    }

    /// The IPv6 ICRC check: the pseudo header has no field the sender may vary unmasked.
    fn verify_v6<'a>(
        &self,
        datagram: &'a [u8],
        origin: &Origin,
        src: std::net::Ipv6Addr,
        dst: std::net::Ipv6Addr,
    ) -> Option<&'a [u8]> {
        let ip = IcrcIp::V6 { src, dst };
        match check_icrc(&ip, origin.src.port(), origin.dst_port, datagram) {
            Ok(t) => Some(t),
            Err(_) => {
                self.counters.icrc_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(src = %origin.src, "soft-RoCE: bad ICRC (IPv6), packet dropped");
                None
            }
        }
    }

    fn deliver(&self, qpn: u32, datagram: &[u8], origin: &Origin) {
        let Some(transport) = self.verify(datagram, origin) else {
            return;
        };
        let Some(slot) = self.slot(qpn) else {
            tracing::debug!(qpn, "soft-RoCE: packet for a QP that does not exist (dropped)");
            self.counters.unknown_qpn.fetch_add(1, Ordering::Relaxed);
            return;
        };
        slot.on_packet(self, transport, origin);
        mark_dirty(slot);
    }

    fn deliver_multicast(&self, datagram: &[u8], origin: &Origin) {
        let IpAddr::V4(group) = origin.dst_ip else { return };
        let members: Vec<u32> = lock(&self.mcast)
            .get(&group)
            .map(|m| m.iter().copied().collect())
            .unwrap_or_default();
        if members.is_empty() {
            self.counters.unknown_qpn.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(transport) = self.verify(datagram, origin) else {
            return;
        };
        for qpn in members {
            if let Some(slot) = self.slot(qpn) {
                slot.on_packet(self, transport, origin);
                mark_dirty(slot);
            }
        }
    }

    /// The interface index of this host's address `ip` (network namespace), from a table
    /// read at most once a second; None if `ip` is not local.
    fn local_ifindex(&self, ip: IpAddr) -> Option<u32> {
        let ip = ip.to_canonical();
        let mut cache = lock(&self.local_addrs);
        let fresh = cache
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < Duration::from_secs(1));
        if !fresh {
            let addrs = softrdma_verbs::device::list_interfaces()
                .map(|ifs| {
                    ifs.iter()
                        .flat_map(|i| i.addrs.iter().map(move |a| (a.ip.to_canonical(), i.index)))
                        .collect()
                })
                .unwrap_or_default();
            *cache = Some((Instant::now(), addrs));
        }
        cache.as_ref().and_then(|(_, map)| map.get(&ip).copied())
    }

    /// Whether `ip` is an address of this host (network namespace), cached for a second.
    pub(crate) fn is_local(&self, ip: IpAddr) -> bool {
        ip.to_canonical().is_loopback() || self.local_ifindex(ip).is_some()
    }

    /// The scope id for sending from `local` to `remote`: the interface of `local` when
    /// `remote` is an IPv6 link-local address (which names no interface itself), else 0.
    pub(crate) fn scope_for(&self, local: IpAddr, remote: IpAddr) -> u32 {
        match remote {
            IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => self.local_ifindex(local).unwrap_or(0),
            _ => 0,
        }
    }

    /// Queues a datagram for this host to the progress thread, as if it had been received:
    /// it is routed (and forwarded) exactly like one from the network.
    pub(crate) fn loop_back(&self, datagram: Vec<u8>, origin: Origin) {
        lock(&self.internal).push_back((datagram, origin));
        if let Some(t) = self.control.get() {
            self.reactor.kick(*t);
        }
    }

    /// Processes the datagrams looped back inside this process; true if there were any.
    fn run_internal(&self) -> bool {
        let mut any = false;
        loop {
            let Some((datagram, origin)) = lock(&self.internal).pop_front() else {
                break;
            };
            any = true;
            self.on_datagram(&datagram, origin, false);
        }
        any
    }

    fn run_pending(&self) {
        let pending: Vec<u32> = lock(&self.pending).drain().collect();
        for qpn in pending {
            if let Some(slot) = self.slot(qpn) {
                let next = slot.on_kick(self);
                self.schedule(next);
            }
        }
    }

    fn run_timers(&self) {
        *lock(&self.timer_at) = None;
        let slots: Vec<Arc<Slot>> = self
            .qps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for s in slots {
            if let Some(d) = s.on_timer(self, now) {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        self.schedule(next);
    }

    /// Whether packets for this host go straight to their owner (`SOFTRDMA_ROCE_LOCAL` is not
    /// `standard`).
    pub(crate) fn direct_local(&self) -> bool {
        self.direct
    }

    /// The UDP port a packet for `dqpn` at `dst` goes to: the owner's home port when `dst` is
    /// this host (no third process can then stall it), else the RoCEv2 port.
    fn dst_port(&self, dst: IpAddr, dqpn: u32) -> u16 {
        if self.direct && self.is_local(dst) {
            if let Some((port, _)) = split_qpn(dqpn) {
                return port;
            }
        }
        self.roce_port()
    }

    /// Where a packet for `dqpn` at `dst` goes; `scope_id` names the interface of a
    /// link-local IPv6 `dst` (0 otherwise).
    pub(crate) fn destination(&self, dst: IpAddr, scope_id: u32, dqpn: u32) -> SocketAddr {
        let port = self.dst_port(dst, dqpn);
        match dst.to_canonical() {
            IpAddr::V4(v4) => SocketAddr::from((v4, port)),
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope_id)),
        }
    }

    /// Appends each packet's ICRC and sends the batch from `home`.
    pub(crate) fn transmit_batch(&self, home: &Home, batch: &mut net::TxBatch) {
        batch.plan(home.sock.gso(), ICRC_LEN);
        for (buf, to, place) in batch.entries_mut() {
            let ip = match icrc_ip(to.src, to.dst.ip()) {
                // Packet `place` of a UDP_SEGMENT run leaves with that IPv4 ID (see `gso`).
                IcrcIp::V4 {
                    src,
                    dst,
                    dont_fragment,
                    ..
                } => IcrcIp::V4 {
                    src,
                    dst,
                    id: place,
                    dont_fragment,
                },
                v6 => v6,
            };
            let crc = icrc_bytes(icrc(&ip, home.port, to.dst.port(), buf));
            buf.extend_from_slice(&crc);
        }
        let (sent, failed) = net::send_batch(&home.sock, batch);
        self.counters.tx_datagrams.fetch_add(sent as u64, Ordering::Relaxed);
        if failed > 0 {
            // A full socket buffer or an unreachable host: those packets are lost, and the
            // reliable transport recovers as it would from any loss.
            self.counters.tx_errors.fetch_add(failed as u64, Ordering::Relaxed);
        }
    }

    /// Appends the ICRC to `packet` (BTH..pad) and sends it from `home` to `dst`.
    pub(crate) fn transmit(&self, home: &Home, src: IpAddr, dst: IpAddr, scope_id: u32, packet: &[u8]) {
        let dqpn = packet
            .get(5..8)
            .map_or(0, |b| u32::from_be_bytes([0, b[0], b[1], b[2]]));
        let mut batch = net::TxBatch::default();
        batch.next_buf().extend_from_slice(packet);
        batch.commit(net::TxTo {
            src,
            dst: self.destination(dst, scope_id, dqpn),
            v6: None,
        });
        self.transmit_batch(home, &mut batch);
    }
}

/// The ICRC pseudo-header addressing of a packet this host sends from `src` to `dst`: IPv4
/// with DF and ID 0 (see `net`), or IPv6.
pub(crate) fn icrc_ip(src: IpAddr, dst: IpAddr) -> IcrcIp {
    let v6 = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    match (src.to_canonical(), dst.to_canonical()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IcrcIp::v4_df(src, dst),
        (src, dst) => IcrcIp::V6 {
            src: v6(src),
            dst: v6(dst),
        },
    }
}

const READ: Interest = Interest::READ;
/// A socket blocked waiters hold: the progress thread is not woken for it.
const NOTHING: Interest = Interest {
    read: false,
    write: false,
};

impl Home {
    /// Reserves the next free index after the last one handed out (round robin): a number is
    /// reused as late as possible, so stray packets of a closed connection do not reach the
    /// QP that gets its number next (the IB CM's time-wait serves the same purpose).
    fn take_index(&self) -> Option<u32> {
        let mut used = lock(&self.used);
        let start = self.cursor.load(std::sync::atomic::Ordering::Relaxed);
        for step in 1..=QPS_PER_PORT {
            let idx = (start + step - 1) % QPS_PER_PORT + 1;
            if !used[idx] {
                if let Some(q) = make_qpn(self.port, idx as u8) {
                    used[idx] = true;
                    self.cursor.store(idx, std::sync::atomic::Ordering::Relaxed);
                    return Some(q);
                }
            }
        }
        None
    }

    fn release(&self, qpn: u32) {
        if let Some((port, idx)) = split_qpn(qpn) {
            if port == self.port {
                lock(&self.used)[idx as usize] = false;
            }
        }
    }
}
