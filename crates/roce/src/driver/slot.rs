//! One QP as the driver sees it: its number, its engine (from RTR on), its peer address, and
//! the hooks the verbs core calls on state changes ([`QpTransport`]) and new work ([`QpDriver`]).

use super::endpoint::{Endpoint, Home};
use super::forward::Origin;
use super::net::TxTo;
use crate::engine::{earliest, RcConfig, RcEngine, UdConfig, UdEngine, UdSource, DEFAULT_KEEPALIVE};
use softrdma_verbs::device::{gid_to_ip, DeviceInfo, Gid};
use softrdma_verbs::qp::QpInner;
use softrdma_verbs::{Errno, Error, QpDriver, QpState, QpTransport, QpType, Result};
use softrdma_wire::roce::RocePacket;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The engine of a QP that reached RTR.
#[derive(Debug)]
enum Engine {
    Rc {
        eng: Box<RcEngine>,
        local: IpAddr,
        remote: IpAddr,
        /// Scope id of a link-local IPv6 `remote` (the device's interface), else 0.
        scope_id: u32,
        /// IPv6 traffic class and hop limit, from the GRH (None for IPv4).
        v6: Option<(u8, u8)>,
    },
    Ud {
        eng: UdEngine,
        /// The device's GID table as addresses (the source of a datagram is its address
        /// handle's `sgid_index`).
        sources: Vec<IpAddr>,
        /// The device's interface (the scope of link-local IPv6 destinations).
        ifindex: u32,
    },
}

impl Engine {
    /// Hands what the engine reported (completions, flushes, async events) to its QP, in
    /// order. Called before the engine's lock is released.
    fn deliver(&mut self) {
        match self {
            Engine::Rc { eng, .. } if eng.has_outputs() => eng.take_outputs().deliver(&**eng.qp()),
            Engine::Ud { eng, .. } if eng.has_outputs() => eng.take_outputs().deliver(&**eng.qp()),
            _ => {}
        }
    }
}

/// The driver's record of one QP.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) qpn: u32,
    pub(crate) home: Arc<Home>,
    endpoint: Weak<Endpoint>,
    qp: OnceLock<Weak<QpInner>>,
    engine: Mutex<Option<Engine>>,
    /// Multicast groups this (UD) QP is attached to, with the local address used to join.
    groups: Mutex<Vec<(Ipv4Addr, Ipv4Addr)>>,
    /// UDP payload bytes sent and received (BTH through pad), for `softrdma stat`.
    tx_bytes: AtomicU64,
    rx_bytes: AtomicU64,
    /// The engine's next deadline as last computed (by a flush, or a blocked caller's
    /// receive step): what the endpoint's timer must cover for this QP (see
    /// `Endpoint::schedule`).
    deadline: Mutex<Option<Instant>>,
}

thread_local! {
    /// The progress thread's outgoing batch (buffers reused across flushes).
    static TX: std::cell::RefCell<super::net::TxBatch> = std::cell::RefCell::new(super::net::TxBatch::default());
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// IB path MTU enum (1..=5) → bytes; 0 or unknown → None.
fn mtu_bytes(path_mtu: u8) -> Option<usize> {
    match path_mtu {
        1..=5 => Some(128usize << path_mtu),
        _ => None,
    }
}

/// The RC keepalive interval: `SOFTRDMA_ROCE_KEEPALIVE_MS` (0 turns it off), else
/// [`DEFAULT_KEEPALIVE`].
fn keepalive_interval() -> Option<Duration> {
    static IV: OnceLock<Option<Duration>> = OnceLock::new();
    *IV.get_or_init(|| match softrdma_verbs::settings::ROCE_KEEPALIVE_MS.parse::<u64>() {
        None => Some(DEFAULT_KEEPALIVE),
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
    })
}

/// Keepalive deadlines are rounded up to this grid, so the timers of many idle QPs fire
/// together (the progress thread checks every QP when its timer fires).
const KEEPALIVE_GRID: Duration = Duration::from_millis(250);

/// `at` rounded up to the next [`KEEPALIVE_GRID`] step since the first call.
/// An RC engine's next deadline: its transport timer, or its keepalive (on the grid).
fn rc_deadline(eng: &RcEngine) -> Option<Instant> {
    earliest(eng.transport_timeout(), eng.keepalive_due().map(on_grid))
}

fn on_grid(at: Instant) -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let Some(since) = at.checked_duration_since(epoch) else {
        return at;
    };
    let grid = KEEPALIVE_GRID.as_nanos();
    let steps = since.as_nanos().div_ceil(grid);
    let nanos = u64::try_from(steps * grid).unwrap_or(u64::MAX);
    epoch.checked_add(Duration::from_nanos(nanos)).unwrap_or(at)
}

/// The IPv4 address inside an IPv4-mapped GID.
fn gid_ipv4(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    Ipv6Addr::from(*gid).to_ipv4_mapped()
}

/// True for an IPv6 link-local (`fe80::/10`) address.
fn is_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

/// The device's GID table as addresses.
fn gid_addrs(dev: &DeviceInfo) -> Vec<IpAddr> {
    dev.gids().into_iter().map(gid_to_ip).collect()
}

/// The local address of source GID `index` of `dev`.
fn local_ip(dev: &DeviceInfo, index: u8, qpn: u32) -> Result<IpAddr> {
    match dev.gid(index as usize) {
        Some(g) => Ok(gid_to_ip(g)),
        None => Err(Error::inval(format!(
            "modify_qp {qpn}: {} has no GID index {index}",
            dev.name
        ))),
    }
}

/// The first IPv4 address of `dev`'s GID table (what multicast groups are joined on).
fn first_ipv4(dev: &DeviceInfo, qpn: u32) -> Result<Ipv4Addr> {
    dev.gids().iter().find_map(|g| gid_ipv4(&g.0)).ok_or_else(|| {
        Error::new(
            Errno::OpNotSupp,
            format!(
                "attach_mcast on QP {qpn}: {} has no IPv4 address (IPv4 multicast only)",
                dev.name
            ),
        )
    })
}

/// The source for a UD datagram to `dst`: GID `sgid_index` when it is of `dst`'s family,
/// else the first GID that is (an IPv4 address handle with index 0 on a device whose GID 0
/// is IPv6, or the reverse). None if the device has no address of that family.
fn ud_source(sources: &[IpAddr], sgid_index: u8, dst: IpAddr) -> Option<IpAddr> {
    let same = |ip: &IpAddr| ip.is_ipv4() == dst.is_ipv4();
    sources
        .get(sgid_index as usize)
        .copied()
        .filter(same)
        .or_else(|| sources.iter().copied().find(same))
}

impl Slot {
    pub(crate) fn new(qpn: u32, home: Arc<Home>, endpoint: &Arc<Endpoint>) -> Slot {
        Slot {
            qpn,
            home,
            endpoint: Arc::downgrade(endpoint),
            qp: OnceLock::new(),
            engine: Mutex::new(None),
            groups: Mutex::new(Vec::new()),
            tx_bytes: AtomicU64::new(0),
            rx_bytes: AtomicU64::new(0),
            deadline: Mutex::new(None),
        }
    }

    pub(crate) fn bind_qp(&self, qp: &Arc<QpInner>) {
        let _ = self.qp.set(Arc::downgrade(qp));
    }

    fn qp(&self) -> Option<Arc<QpInner>> {
        self.qp.get().and_then(|w| w.upgrade())
    }

    /// Builds the engine when the QP reaches RTR.
    fn start_engine(&self, qp: &Arc<QpInner>) -> Result<()> {
        let qpn = self.qpn;
        let attr = qp.attr();
        let dev = qp.pd.context().device();
        let port_mtu = dev.port_attr().active_mtu.bytes() as usize;
        let mtu = mtu_bytes(attr.path_mtu).unwrap_or(port_mtu).min(port_mtu).min(4096);
        let engine = match qp.qp_type {
            QpType::Rc => {
                let av = attr.ah_attr;
                if !av.is_global {
                    return Err(Error::inval(format!(
                        "modify_qp {qpn} to RTR: RoCE needs a GRH: set ah_attr.is_global = 1 and grh.dgid to the \
                         peer's GID (ibv_rc_pingpong: pass -g 0)"
                    )));
                }
                let remote = gid_to_ip(Gid(av.dgid));
                if remote.is_unspecified() || Gid(av.dgid).is_multicast() {
                    return Err(Error::inval(format!(
                        "modify_qp {qpn} to RTR: destination GID {} is no unicast address",
                        Ipv6Addr::from(av.dgid)
                    )));
                }
                let local = local_ip(dev, av.sgid_index, qpn)?;
                if local.is_ipv4() != remote.is_ipv4() {
                    return Err(Error::inval(format!(
                        "modify_qp {qpn} to RTR: source GID {} of {} is {local} but the destination is {remote}: \
                         pick the GID index of an {} address",
                        av.sgid_index,
                        dev.name,
                        if remote.is_ipv4() { "IPv4" } else { "IPv6" }
                    )));
                }
                let scope_id = if is_link_local(remote) { dev.ifindex } else { 0 };
                let v6 = remote.is_ipv6().then_some((av.traffic_class, av.hop_limit));
                let cfg = RcConfig {
                    keepalive: keepalive_interval(),
                    ..RcConfig::from_qp_attr(qpn, &attr, mtu)
                };
                tracing::debug!(qpn, dest_qpn = attr.dest_qp_num, %local, %remote, mtu, "soft-RoCE RC engine");
                Engine::Rc {
                    eng: Box::new(RcEngine::new(qp.clone(), cfg)),
                    local,
                    remote,
                    scope_id,
                    v6,
                }
            }
            QpType::Ud => {
                let sources = gid_addrs(dev);
                if sources.is_empty() {
                    return Err(Error::new(
                        Errno::AddrNotAvail,
                        format!(
                            "modify_qp {qpn} to RTR: {} has no GID (its netdev has no address)",
                            dev.name
                        ),
                    ));
                }
                let cfg = UdConfig {
                    local_qpn: qpn,
                    qkey: attr.qkey,
                    pkey: 0xffff,
                    mtu,
                };
                Engine::Ud {
                    eng: UdEngine::new(qp.clone(), cfg),
                    sources,
                    ifindex: dev.ifindex,
                }
            }
            other => {
                return Err(Error::new(
                    Errno::OpNotSupp,
                    format!("modify_qp {qpn}: {other:?} QPs are not supported by soft-RoCE"),
                ))
            }
        };
        *lock(&self.engine) = Some(engine);
        Ok(())
    }

    /// A datagram for this QP (ICRC verified). Nothing is sent yet: the caller flushes the
    /// slot once the whole burst of received datagrams is handled ([`Slot::flush_now`]).
    pub(crate) fn on_packet(&self, ep: &Endpoint, transport: &[u8], origin: &Origin) {
        self.rx_bytes.fetch_add(transport.len() as u64, Ordering::Relaxed);
        let pkt = match RocePacket::parse(transport) {
            Ok(p) => p,
            Err(e) => {
                ep.counters.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(qpn = self.qpn, "soft-RoCE: malformed packet: {e}");
                return;
            }
        };
        let now = Instant::now();
        let mut guard = lock(&self.engine);
        match guard.as_mut() {
            Some(Engine::Rc { eng, remote, .. }) => {
                if origin.src.ip().to_canonical() != *remote {
                    tracing::debug!(qpn = self.qpn, src = %origin.src, "soft-RoCE: RC packet from a stranger (dropped)");
                    ep.counters.wrong_source.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                eng.handle_packet(now, &pkt);
            }
            Some(Engine::Ud { eng, .. }) => {
                let src = UdSource {
                    src_ip: origin.src.ip(),
                    dst_ip: origin.dst_ip,
                    hop_limit: origin.hop_limit,
                    traffic_class: origin.traffic_class,
                };
                eng.handle_packet(now, &pkt, &src);
            }
            None => {
                // Before RTR a QP receives nothing (IBTA 10.3.1).
                tracing::debug!(qpn = self.qpn, "soft-RoCE: packet before RTR (dropped)");
                ep.counters.unknown_qpn.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(e) = guard.as_mut() {
            e.deliver();
        }
    }

    /// Sends what the engine has ready after a burst of packets; returns its next deadline.
    pub(crate) fn flush_now(&self, ep: &Endpoint) -> Option<Instant> {
        let mut guard = lock(&self.engine);
        self.flush(ep, guard.as_mut(), Instant::now())
    }

    /// New work or a state change. Returns the engine's next deadline.
    pub(crate) fn on_kick(&self, ep: &Endpoint) -> Option<Instant> {
        let now = Instant::now();
        let mut guard = lock(&self.engine);
        match guard.as_mut() {
            Some(Engine::Rc { eng, .. }) => eng.sync_state(now),
            Some(Engine::Ud { eng, .. }) => eng.sync_state(now),
            None => {
                // No engine (not yet RTR, or back in RESET): an ERR request still flushes.
                if let Some(qp) = self.qp() {
                    if qp.state() == QpState::Err {
                        qp.error_and_flush();
                    }
                }
                return None;
            }
        }
        self.flush(ep, guard.as_mut(), now)
    }

    /// New sends, on the poster's thread: the engine takes the new WQEs and transmits what
    /// its window allows at once, unless another thread is inside it (then false: the
    /// progress thread must do it). What the window holds back leaves as ACKs come in, on
    /// the progress thread, and the engine's next deadline is armed there.
    pub(crate) fn try_send_now(&self, ep: &Endpoint) -> bool {
        let mut guard = match self.engine.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        let now = Instant::now();
        match guard.as_mut() {
            Some(Engine::Rc { eng, .. }) => eng.sync_state(now),
            Some(Engine::Ud { eng, .. }) => eng.sync_state(now),
            None => return false,
        }
        let next = self.flush(ep, guard.as_mut(), now);
        drop(guard);
        ep.schedule(next);
        true
    }

    /// Timer expiry check. Returns the engine's next deadline. A peer found lost is
    /// reported ([`crate::liveness`]) once, after the engine's lock is released.
    pub(crate) fn on_timer(&self, ep: &Endpoint, now: Instant) -> Option<Instant> {
        let mut guard = lock(&self.engine);
        let mut lost = None;
        if let Some(Engine::Rc { eng, remote, .. }) = guard.as_mut() {
            if eng.poll_timeout().is_some_and(|d| d <= now) {
                let failed_before = eng.error().is_some();
                eng.handle_timeout(now);
                if let Some(e) = eng.error().filter(|e| !failed_before && e.peer_lost()) {
                    lost = Some((*remote, e.to_string()));
                }
            }
        }
        let next = self.flush(ep, guard.as_mut(), now);
        drop(guard);
        if let Some((peer, why)) = lost {
            tracing::debug!(qpn = self.qpn, %peer, "soft-RoCE: peer lost: {why}");
            crate::liveness::report(self.qpn, peer, &why);
        }
        next
    }

    /// The engine's next deadline as last computed.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        *lock(&self.deadline)
    }

    /// Records the engine's next deadline (called with the engine locked) and returns it.
    fn note_deadline(&self, next: Option<Instant>) -> Option<Instant> {
        *lock(&self.deadline) = next;
        next
    }

    /// Sends everything the engine has ready and delivers what it reported; returns its next
    /// deadline.
    fn flush(&self, ep: &Endpoint, engine: Option<&mut Engine>, now: Instant) -> Option<Instant> {
        let next = engine.and_then(|engine| {
            let next = self.transmit(ep, engine, now);
            engine.deliver();
            next
        });
        self.note_deadline(next)
    }

    /// [`Slot::flush`] with an engine.
    fn transmit(&self, ep: &Endpoint, engine: &mut Engine, now: Instant) -> Option<Instant> {
        TX.with(|batch| {
            let mut batch = batch.borrow_mut();
            loop {
                match &mut *engine {
                    Engine::Rc {
                        eng,
                        local,
                        remote,
                        scope_id,
                        v6,
                    } => {
                        let to = TxTo {
                            src: *local,
                            dst: ep.destination(*remote, *scope_id, eng.config().dest_qpn),
                            v6: *v6,
                        };
                        while !batch.is_full() && eng.poll_transmit(now, batch.next_buf()) {
                            self.tx_bytes.fetch_add(batch.pending().len() as u64, Ordering::Relaxed);
                            batch.commit(to);
                        }
                    }
                    Engine::Ud { eng, sources, ifindex } => {
                        while !batch.is_full() {
                            let Some(t) = eng.poll_transmit(now, batch.next_buf()) else {
                                break;
                            };
                            let dqpn = match batch.pending().get(5..8) {
                                Some(b) => u32::from_be_bytes([0, b[0], b[1], b[2]]),
                                None => 0,
                            };
                            let dst = gid_to_ip(Gid(t.dgid));
                            match ud_source(sources, t.sgid_index, dst) {
                                Some(src) => {
                                    self.tx_bytes.fetch_add(batch.pending().len() as u64, Ordering::Relaxed);
                                    let scope = if is_link_local(dst) { *ifindex } else { 0 };
                                    batch.commit(TxTo {
                                        src,
                                        dst: ep.destination(dst, scope, dqpn),
                                        v6: dst.is_ipv6().then_some((t.traffic_class, t.hop_limit)),
                                    });
                                }
                                None => {
                                    ep.counters.unsupported.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                }
                if batch.is_empty() {
                    break;
                }
                let full = batch.is_full();
                ep.transmit_batch(&self.home, &mut batch);
                if !full {
                    break;
                }
            }
        });
        match engine {
            Engine::Rc { eng, .. } => rc_deadline(eng),
            Engine::Ud { .. } => None,
        }
    }

    /// Engine counters, for `SOFTRDMA_STATS=1` and tests.
    pub(crate) fn describe_stats(&self) -> Option<String> {
        match lock(&self.engine).as_ref()? {
            Engine::Rc { eng, .. } => Some(format!("{:?}", eng.stats())),
            Engine::Ud { eng, .. } => Some(format!("{:?}", eng.stats())),
        }
    }
}

impl softrdma_verbs::stats::CounterSource for Slot {
    fn qp_stats(&self) -> Option<softrdma_verbs::stats::QpStats> {
        use softrdma_verbs::stats::{QpCounters, QpStats};
        let qp = self.qp.get()?.upgrade()?;
        let (mut counters, engine) = match lock(&self.engine).as_ref() {
            Some(Engine::Rc { eng, .. }) => {
                let s = eng.stats();
                let errors = |n: &crate::engine::NakCounts| n.remote_access + n.invalid_request + n.remote_operational;
                let counters = QpCounters {
                    tx_packets: s.tx_packets,
                    rx_packets: s.rx_packets,
                    retransmissions: s.retransmitted_packets,
                    timeouts: s.timeouts,
                    naks_sent: s.naks_sent.total(),
                    naks_received: s.naks_received.total(),
                    rnr: s.naks_sent.rnr + s.naks_received.rnr,
                    errors: s.dropped_invalid + errors(&s.naks_sent) + errors(&s.naks_received),
                    ..Default::default()
                };
                (counters, Some(eng.summary(Instant::now())))
            }
            Some(Engine::Ud { eng, .. }) => {
                let s = eng.stats();
                let counters = QpCounters {
                    tx_packets: s.tx_packets,
                    rx_packets: s.rx_packets,
                    errors: s.rx_dropped_qkey + s.rx_dropped_invalid + s.rx_length_errors + s.tx_errors,
                    ..Default::default()
                };
                (counters, None)
            }
            None => (QpCounters::default(), None),
        };
        counters.tx_bytes = self.tx_bytes.load(Ordering::Relaxed);
        counters.rx_bytes = self.rx_bytes.load(Ordering::Relaxed);
        Some(QpStats {
            engine,
            ..QpStats::of(&qp, "roce", counters)
        })
    }
}

/// The [`QpTransport`] and [`QpDriver`] of one soft-RoCE QP.
#[derive(Debug)]
pub(crate) struct RoceQp {
    pub(crate) slot: Arc<Slot>,
}

impl RoceQp {
    fn endpoint(&self) -> Result<Arc<Endpoint>> {
        self.slot
            .endpoint
            .upgrade()
            .ok_or_else(|| Error::new(Errno::Io, "soft-RoCE: the endpoint is gone"))
    }
}

impl QpDriver for RoceQp {
    fn kick(&self) {
        if let Ok(ep) = self.endpoint() {
            // A move to ERR is handled on the caller's thread: the ACK this QP owes for
            // messages already completed here leaves before the caller's next step (the
            // DREQ of rdma_disconnect), so the peer sees its SEND complete, not flushed.
            if self.slot.qp().is_some_and(|q| q.state() == QpState::Err) {
                self.slot.on_kick(&ep);
            }
            ep.kick(self.slot.qpn);
        }
    }

    fn kick_deferred(&self) {
        if let Ok(ep) = self.endpoint() {
            ep.kick(self.slot.qpn);
        }
    }

    fn posted(&self) {
        if let Ok(ep) = self.endpoint() {
            if !self.slot.try_send_now(&ep) {
                ep.kick(self.slot.qpn);
            }
        }
    }
}

impl QpTransport for RoceQp {
    fn modified(&self, qp: &Arc<QpInner>, from: QpState, to: QpState) -> Result<()> {
        match to {
            QpState::Rtr if from == QpState::Init => {
                self.slot.start_engine(qp)?;
                qp.attach_driver(Arc::new(RoceQp {
                    slot: self.slot.clone(),
                }));
            }
            QpState::Reset => {
                *lock(&self.slot.engine) = None;
            }
            _ => {}
        }
        if from != to {
            self.kick();
        }
        Ok(())
    }

    fn destroyed(&self, qp: &Arc<QpInner>) {
        if softrdma_verbs::settings::STATS.is_on() {
            if let Some(s) = self.slot.describe_stats() {
                eprintln!("softrdma: QP {:#x} stats: {s}", qp.qpn);
            }
        }
        let groups: Vec<(Ipv4Addr, Ipv4Addr)> = lock(&self.slot.groups).drain(..).collect();
        if let Ok(ep) = self.endpoint() {
            // UD sends posted before the destroy go out now: a NIC (and Linux rxe) has sent
            // them by the time ibv_post_send returns, and mckey-style senders exit right after.
            // An RC QP sends only the ACK its responder owes (RcEngine::destroy): its peer
            // would otherwise retry messages this side received until RETRY_EXC_ERR.
            let mut guard = lock(&self.slot.engine);
            if let Some(Engine::Rc { eng, .. }) = guard.as_mut() {
                eng.destroy();
            }
            if guard.is_some() {
                self.slot.flush(&ep, guard.as_mut(), Instant::now());
            }
            drop(guard);
            for (g, local) in groups {
                let _ = ep.leave(self.slot.qpn, g, local);
            }
            // Outstanding work is discarded without completions, as ibv_destroy_qp does.
            ep.remove(self.slot.qpn);
        }
        *lock(&self.slot.engine) = None;
    }

    fn attach_mcast(&self, qp: &Arc<QpInner>, gid: [u8; 16]) -> Result<()> {
        let qpn = qp.qpn;
        let Some(group) = gid_ipv4(&gid).filter(|g| g.is_multicast()) else {
            return Err(Error::inval(format!(
                "attach_mcast on QP {qpn}: {} is not an IPv4 multicast GID (::ffff:224.0.0.0/100)",
                Ipv6Addr::from(gid)
            )));
        };
        let local = first_ipv4(qp.pd.context().device(), qpn)?;
        let ep = self.endpoint()?;
        ep.join(qpn, group, local)?;
        lock(&self.slot.groups).push((group, local));
        Ok(())
    }

    fn detach_mcast(&self, qp: &Arc<QpInner>, gid: [u8; 16]) -> Result<()> {
        let qpn = qp.qpn;
        let Some(group) = gid_ipv4(&gid) else {
            return Err(Error::inval(format!(
                "detach_mcast on QP {qpn}: {} is not an IPv4 multicast GID",
                Ipv6Addr::from(gid)
            )));
        };
        let local = {
            let mut groups = lock(&self.slot.groups);
            let Some(pos) = groups.iter().position(|(g, _)| *g == group) else {
                return Err(Error::inval(format!(
                    "detach_mcast on QP {qpn}: not attached to {group}"
                )));
            };
            groups.remove(pos).1
        };
        self.endpoint()?.leave(qpn, group, local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_deadlines_share_a_grid() {
        // Just after a grid step, so that t and t + 100 ms fall before the next one.
        let t = on_grid(Instant::now()) + Duration::from_millis(3);
        let a = on_grid(t);
        let b = on_grid(t + Duration::from_millis(100));
        assert!(a >= t && a - t < KEEPALIVE_GRID);
        assert_eq!(a, b, "deadlines 100 ms apart meet on one grid step");
        assert_eq!(on_grid(a), a, "a grid instant stays put");
        assert_eq!(on_grid(a + Duration::from_nanos(1)), a + KEEPALIVE_GRID);
    }
}
