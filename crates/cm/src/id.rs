//! `rdma_cm_id`: binding, resolution, listening, connecting, accepting, and teardown.

use crate::addr::{self, Resolution};
use crate::event::{CmEvent, EventChannel, EventType};
use crate::ib;
use crate::options::{CmOption, Options};
use crate::param::{ConnParam, UdParam};
use crate::ports::{Binding, PortClaim};
use crate::state::{CmState, PortSpace};
use crate::MAX_PRIVATE_DATA;
use socket2::{Domain, Protocol, Socket, Type};
use softrdma_iwarp::{ConnEvent, ConnHandle, ConnRequest, ConnectParams, EventSink, Listener};
use softrdma_verbs::device::{self, DeviceInfo, TransportKind};
use softrdma_verbs::qp_state::{attr_mask, AttrRules};
use softrdma_verbs::{bail, Access, Context, Errno, Error, Pd, Qp, QpAttr, QpInitAttr, QpState, QpType, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// How long a connect that finds nothing listening (TCP refused it on iWARP, REJ reason 8 on
/// RoCE) is tried again before REJECTED; see `IdInner::retry_refused` and
/// `ib::active::retry_unclaimed`. Any destination: a slow peer (a kernel in a TCG guest took
/// longer than 250 ms) re-listens as late as a local one.
pub(crate) const NO_LISTENER_RETRY_BUDGET: Duration = Duration::from_millis(500);

/// An active iWARP id's connect, kept for `IdInner::retry_refused`.
#[derive(Debug, Clone)]
pub(crate) struct IwarpRetry {
    param: ConnParam,
    first: std::time::Instant,
    tries: u32,
}

/// Largest backlog (`net.rdma_ucm.max_backlog` default).
pub const MAX_BACKLOG: u32 = 1024;

pub(crate) struct IdState {
    pub(crate) state: CmState,
    pub(crate) channel: EventChannel,
    pub(crate) sync: bool,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) device: Option<DeviceInfo>,
    pub(crate) context: Option<Context>,
    pub(crate) reserved: Option<Socket>,
    /// The id's entry in the rdma_cm port space (from `rdma_bind_addr` until destroy).
    port: Option<PortClaim>,
    listener: Option<Listener>,
    request: Option<ConnRequest>,
    conn: Option<ConnHandle>,
    pub(crate) qp: Option<Qp>,
    pub(crate) opts: Options,
    pub(crate) unacked: u32,
    /// Threads waiting for `unacked` to fall (an ack without them makes no `futex` call).
    ack_waiters: u32,
    pub(crate) disconnected: bool,
    pub(crate) req_param: Option<ConnParam>,
    /// The IB CM connection or SIDR exchange of an id on a RoCE device.
    pub(crate) ib: Option<ib::IbHandle>,
    /// The IB CM listen of a listener that covers RoCE devices.
    pub(crate) ib_listen: Option<ib::ListenGuard>,
    /// Multicast groups joined (RoCE UD ids).
    pub(crate) mcast: Vec<ib::mcast::Joined>,
    /// An active RoCE id's connect, for a retry when this host had no listener yet.
    pub(crate) connect_retry: Option<ib::active::ConnectRetry>,
    /// An active iWARP id's connect, for a retry when this host had no listener yet.
    iwarp_retry: Option<IwarpRetry>,
}

/// Shared state of an id.
pub struct IdInner {
    pub(crate) ps: PortSpace,
    st: Mutex<IdState>,
    acked: Condvar,
}

impl std::fmt::Debug for IdInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        write!(
            f,
            "CmId({:?}, {}, local {:?}, peer {:?})",
            self.ps, st.state, st.local, st.peer
        )
    }
}

/// An RDMA CM identifier (`rdma_cm_id`). Cloning shares it; [`CmId::destroy`] releases it.
///
/// A server and a client in one process, connected over 127.0.0.1 (`siw_lo`, soft-iWARP; with
/// [`CmOption::Transport`](crate::CmOption::Transport) `Some(TransportKind::Roce)` on both ids,
/// `rxe_lo` and the IB CM). softrdma-cm's `cm_client_server` example also moves data.
///
/// ```
/// use softrdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
/// use softrdma_verbs::{QpCap, QpInitAttr, QpType};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // An RC QP on the id's device (`rdma_create_qp`).
/// let create_qp = |id: &CmId| -> softrdma_verbs::Result<()> {
///     let ctx = id.context().expect("a resolved or requested id has a device");
///     let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(8, None)?);
///     let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
///     let init = QpInitAttr { send_cq: cq.clone(), recv_cq: cq, srq: None, cap, qp_type: QpType::Rc, sq_sig_all: false };
///     id.create_qp(&pd, init).map(drop)
/// };
/// let wait = Some(Duration::from_secs(10));
/// let (server_events, client_events) = (EventChannel::new()?, EventChannel::new()?);
///
/// // Server: listen on 127.0.0.1, on a port the CM picks.
/// let listener = CmId::create(Some(&server_events), PortSpace::Tcp)?;
/// listener.bind_addr("127.0.0.1:0".parse()?)?;
/// listener.listen(8)?;
/// let addr = listener.local_addr().expect("bound");
///
/// // Client: resolving the address and the route picks the device; then connect.
/// let client = CmId::create(Some(&client_events), PortSpace::Tcp)?;
/// client.resolve_addr(None, addr, 2000)?;
/// assert_eq!(client_events.get_event(wait)?.event, EventType::AddrResolved);
/// client.resolve_route(2000)?;
/// assert_eq!(client_events.get_event(wait)?.event, EventType::RouteResolved);
/// create_qp(&client)?;
/// client.connect(&ConnParam { private_data: b"hello".to_vec(), ..ConnParam::default() })?;
///
/// // Server: the request brings a new id for the connection.
/// let req = server_events.get_event(wait)?;
/// assert_eq!(req.event, EventType::ConnectRequest);
/// assert_eq!(req.param.private_data, b"hello");
/// let conn = req.id.clone();
/// req.ack();
/// create_qp(&conn)?;
/// conn.accept(None)?;
/// assert_eq!(server_events.get_event(wait)?.event, EventType::Established);
/// assert_eq!(client_events.get_event(wait)?.event, EventType::Established);
/// assert_eq!(client.device().expect("a device").name, "siw_lo");
///
/// client.disconnect()?;
/// assert_eq!(client_events.get_event(wait)?.event, EventType::Disconnected);
/// assert_eq!(server_events.get_event(wait)?.event, EventType::Disconnected);
/// for id in [client, conn] {
///     id.destroy_qp()?;
///     id.destroy()?;
/// }
/// listener.destroy()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CmId {
    inner: Arc<IdInner>,
}

impl PartialEq for CmId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

fn sync_error(ev: &CmEvent) -> Error {
    let errno = match ev.event {
        EventType::Rejected => Errno::ConnRefused,
        _ if ev.status < 0 => Errno::from_raw(-ev.status),
        _ => Errno::Io,
    };
    let reason = if ev.reason.is_empty() {
        format!("{} (status {})", ev.event, ev.status)
    } else {
        ev.reason.clone()
    };
    Error::new(errno, reason)
}

impl IdInner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn event_acked(&self) {
        let mut st = self.lock();
        st.unacked = st.unacked.saturating_sub(1);
        if st.ack_waiters > 0 {
            self.acked.notify_all();
        }
    }

    pub(crate) fn post(
        self: &Arc<Self>,
        event: EventType,
        status: i32,
        param: ConnParam,
        reason: String,
        listen_id: Option<CmId>,
    ) {
        self.post_ud(event, status, param, reason, listen_id, None)
    }

    /// [`IdInner::post`] with UD parameters.
    pub(crate) fn post_ud(
        self: &Arc<Self>,
        event: EventType,
        status: i32,
        param: ConnParam,
        reason: String,
        listen_id: Option<CmId>,
        ud: Option<UdParam>,
    ) {
        let counted = match (&listen_id, event) {
            (Some(l), EventType::ConnectRequest) => l.inner.clone(),
            _ => self.clone(),
        };
        let ch = {
            let st = self.lock();
            if st.state == CmState::Destroying {
                // Nobody can take it any more; destroy must not wait for it.
                return;
            }
            st.channel.clone()
        };
        {
            let mut c = counted.lock();
            if c.state == CmState::Destroying {
                return;
            }
            c.unacked += 1;
        }
        let mut ev = CmEvent::new(CmId { inner: self.clone() }, event, status);
        ev.param = param;
        ev.reason = reason;
        ev.listen_id = listen_id;
        ev.ud = ud;
        ch.push(ev);
    }

    fn on_conn_event(self: &Arc<Self>, ev: ConnEvent) {
        match ev {
            ConnEvent::Established { private_data, ird, ord } => {
                // A retried connect (`retry_refused`) stores its handle when `connect`
                // returns, which may be after the connection completed: ESTABLISHED waits for
                // it (briefly; nothing else holds it up), or `rdma_disconnect` would find none.
                let t = std::time::Instant::now();
                while t.elapsed() < Duration::from_millis(200) {
                    let st = self.lock();
                    if st.conn.is_some() || st.iwarp_retry.as_ref().is_none_or(|r| r.tries == 0) {
                        break;
                    }
                    drop(st);
                    std::thread::sleep(Duration::from_millis(1));
                }
                let param = ConnParam {
                    private_data,
                    responder_resources: ird.min(255) as u8,
                    initiator_depth: ord.min(255) as u8,
                    ..ConnParam::default()
                };
                self.post(EventType::Established, 0, param, String::new(), None);
            }
            ConnEvent::Rejected {
                errno,
                private_data,
                reason,
                nothing_listens,
            } => {
                if nothing_listens && self.retry_refused() {
                    return;
                }
                self.lock().conn = None;
                let param = ConnParam {
                    private_data,
                    ..ConnParam::default()
                };
                self.post(EventType::Rejected, -errno.raw(), param, reason, None);
            }
            ConnEvent::Unreachable { errno, reason } => {
                self.lock().conn = None;
                // A peer that never answers is reported as the kernel does: -ETIMEDOUT.
                let status = match errno {
                    Errno::HostUnreach | Errno::TimedOut => -libc::ETIMEDOUT,
                    e => -e.raw(),
                };
                self.post(EventType::Unreachable, status, ConnParam::default(), reason, None);
            }
            ConnEvent::ConnectError { reason } => {
                self.lock().conn = None;
                self.post(
                    EventType::ConnectError,
                    -libc::EPROTO,
                    ConnParam::default(),
                    reason,
                    None,
                );
            }
            ConnEvent::Disconnected { reason } => {
                {
                    let mut st = self.lock();
                    if st.disconnected || !matches!(st.state, CmState::Connect | CmState::Disconnect) {
                        return;
                    }
                    st.disconnected = true;
                    st.state = CmState::Disconnect;
                }
                self.post(EventType::Disconnected, 0, ConnParam::default(), reason, None);
            }
        }
    }

    /// An iWARP connect that TCP refused (nothing listens yet): instead of REJECTED, connects
    /// again after 2, 4, 8, ... ms for at most [`NO_LISTENER_RETRY_BUDGET`], as
    /// the RoCE side does for its REJ reason 8 (`ib::active::retry_unclaimed`, which says why:
    /// perftest `-R` listens again just while its client connects). True when a retry is
    /// scheduled.
    fn retry_refused(self: &Arc<Self>) -> bool {
        let delay = {
            let mut st = self.lock();
            if st.state != CmState::Connect || st.disconnected {
                return false;
            }
            let Some(dst) = st.peer else { return false };
            let Some(r) = st.iwarp_retry.as_mut() else {
                return false;
            };
            // Every refusal ends the attempt it answers (a retry started before it arrived
            // must not keep its handle).
            r.tries += 1;
            let attempt = r.tries;
            if r.first.elapsed() >= NO_LISTENER_RETRY_BUDGET {
                return false;
            }
            let delay = Duration::from_millis(2u64 << attempt.min(8));
            st.conn = None;
            tracing::debug!(peer = %dst, ?delay, "rdma_connect: nothing listens there yet, connecting again");
            (delay, attempt)
        };
        let (delay, attempt) = delay;
        let Ok(reactor) = softrdma_verbs::progress::Reactor::global() else {
            return false;
        };
        // A timer of the progress thread, which also delivers the connection's events: the
        // retry's connect returns (and stores its handle) before any of them can run.
        let w = Arc::downgrade(self);
        let _ = reactor.call_at(
            std::time::Instant::now() + delay,
            Box::new(move || {
                if let Some(id) = w.upgrade() {
                    id.reconnect(attempt);
                }
            }),
        );
        true
    }

    /// The retry of [`IdInner::retry_refused`], unless the id moved on meanwhile.
    fn reconnect(self: &Arc<Self>, attempt: u32) {
        let me = CmId { inner: self.clone() };
        let current = |st: &IdState| {
            st.state == CmState::Connect
                && !st.disconnected
                && st.iwarp_retry.as_ref().is_some_and(|r| r.tries == attempt)
        };
        let started = {
            let st = self.lock();
            let (Some(r), Some(qp), Some(dst)) = (st.iwarp_retry.as_ref(), st.qp.clone(), st.peer) else {
                return;
            };
            if !current(&st) {
                return;
            }
            let params = match me.connect_params(&st, &r.param) {
                Ok(p) => p,
                Err(e) => {
                    drop(st);
                    return self.post(
                        EventType::ConnectError,
                        -e.errno.raw(),
                        ConnParam::default(),
                        e.msg,
                        None,
                    );
                }
            };
            // The bound source address and port, if the id had one (its socket is gone).
            let src = st.local.filter(|a| !addr::is_wildcard(a.ip()));
            drop(st);
            softrdma_iwarp::connect(&qp, dst, ConnectParams { src, ..params }, self.sink())
        };
        match started {
            Ok(h) => {
                let mut st = self.lock();
                if current(&st) {
                    st.conn = Some(h);
                } else {
                    drop(st);
                    h.disconnect();
                }
            }
            Err(e) => self.post(
                EventType::Rejected,
                -libc::ECONNREFUSED,
                ConnParam::default(),
                e.msg,
                None,
            ),
        }
    }

    fn sink(self: &Arc<Self>) -> EventSink {
        let w = Arc::downgrade(self);
        Arc::new(move |ev| {
            if let Some(id) = w.upgrade() {
                id.on_conn_event(ev);
            }
        })
    }
}

/// Resolves 0xFF ("device maximum") and checks the limit.
pub(crate) fn resources(v: u8, max: i32, what: &str) -> Result<u32> {
    let max = max.max(1) as u32;
    match v {
        0xFF => Ok(max),
        v if v as u32 > max => bail!(Inval, "{what} {v} exceeds the device limit {max}"),
        v => Ok(v as u32),
    }
}

/// The socket that holds an id's port: TCP for the TCP and IB port spaces (iWARP listens and
/// connects on it), UDP for RDMA_PS_UDP. A TCP socket always has SO_REUSEADDR, as siw's
/// listening sockets: the connections of an earlier listener on the port (ESTABLISHED or in
/// TIME_WAIT after a close from this side, which inherited the flag) do not block a new
/// one, while TCP still refuses a second live listener. The rdma_cm rules between ids, and
/// REUSEADDR, are the port space's ([`PortClaim`]). Close-on-exec: socket2 creates it so.
fn bind_socket(ps: PortSpace, addr: SocketAddr, opts: &Options) -> Result<Socket> {
    let domain = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let udp = ps == PortSpace::Udp;
    let sock = if udp {
        Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))
    } else {
        Socket::new(domain, Type::STREAM, Some(Protocol::TCP))
    }
    .map_err(|e| Error::os(format!("bind {addr}"), &e))?;
    sock.set_reuse_address(!udp || opts.reuse_addr)
        .map_err(|e| Error::os("SO_REUSEADDR", &e))?;
    if addr.is_ipv6() {
        let _ = sock.set_only_v6(opts.af_only.unwrap_or(false));
    }
    sock.bind(&addr.into())
        .map_err(|e| Error::os(format!("rdma_bind_addr {addr}"), &e))?;
    Ok(sock)
}

fn check_pd(op: &str, pd: &[u8]) -> Result<()> {
    if pd.len() > MAX_PRIVATE_DATA {
        bail!(
            Inval,
            "{op}: private data of {} bytes exceeds the iWARP limit of {MAX_PRIVATE_DATA} bytes",
            pd.len()
        );
    }
    Ok(())
}

/// The scope id of an IPv6 socket address (0 for IPv4).
fn scope_of(a: SocketAddr) -> u32 {
    match a {
        SocketAddr::V6(v6) => v6.scope_id(),
        SocketAddr::V4(_) => 0,
    }
}

impl CmId {
    /// Creates an id (`rdma_create_id`). Without a channel the id is synchronous: every
    /// asynchronous call blocks until its event and returns its error.
    pub fn create(channel: Option<&EventChannel>, ps: PortSpace) -> Result<CmId> {
        match ps {
            // UDP ids need a RoCE device; bind/resolve say so when there is none.
            PortSpace::Tcp | PortSpace::Ib | PortSpace::Udp => {}
            PortSpace::Ipoib => bail!(Inval, "rdma_create_id: RDMA_PS_IPOIB is not supported"),
        }
        let (ch, sync) = match channel {
            Some(c) => (c.clone(), false),
            None => (EventChannel::new()?, true),
        };
        Ok(CmId::with_channel(ps, ch, sync))
    }

    pub(crate) fn with_channel(ps: PortSpace, channel: EventChannel, sync: bool) -> CmId {
        CmId {
            inner: Arc::new(IdInner {
                ps,
                st: Mutex::new(IdState {
                    state: CmState::Idle,
                    channel,
                    sync,
                    local: None,
                    peer: None,
                    device: None,
                    context: None,
                    reserved: None,
                    port: None,
                    listener: None,
                    request: None,
                    conn: None,
                    qp: None,
                    opts: Options::default(),
                    unacked: 0,
                    ack_waiters: 0,
                    disconnected: false,
                    req_param: None,
                    ib: None,
                    ib_listen: None,
                    mcast: Vec::new(),
                    connect_retry: None,
                    iwarp_retry: None,
                }),
                acked: Condvar::new(),
            }),
        }
    }

    pub(crate) fn inner(&self) -> &Arc<IdInner> {
        &self.inner
    }

    pub(crate) fn from_inner(inner: Arc<IdInner>) -> CmId {
        CmId { inner }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, IdState> {
        self.inner.lock()
    }

    /// Port space.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    /// Current state.
    pub fn state(&self) -> CmState {
        self.lock().state
    }

    /// Local address (`rdma_get_local_addr`), once bound or resolved.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        let st = self.lock();
        st.conn.as_ref().map(|c| c.local_addr()).or(st.local)
    }

    /// Peer address (`rdma_get_peer_addr`), once resolved or connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.lock().peer
    }

    /// Local port (`rdma_get_src_port`).
    pub fn src_port(&self) -> u16 {
        self.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Peer port (`rdma_get_dst_port`).
    pub fn dst_port(&self) -> u16 {
        self.peer_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// The device the id is attached to (after bind to a specific address, resolve, or a request).
    pub fn device(&self) -> Option<DeviceInfo> {
        self.lock().device.clone()
    }

    /// The verbs context of the attached device (`id->verbs`).
    pub fn context(&self) -> Option<Context> {
        self.lock().context.clone()
    }

    /// The QP created with [`CmId::create_qp`].
    pub fn qp(&self) -> Option<Qp> {
        self.lock().qp.clone()
    }

    /// The parameters (private data, resources) of the connection request this id came from.
    pub fn request_param(&self) -> Option<ConnParam> {
        self.lock().req_param.clone()
    }

    /// The channel events go to.
    pub fn channel(&self) -> EventChannel {
        self.lock().channel.clone()
    }

    /// Events delivered or queued but not yet acknowledged.
    pub fn unacked_events(&self) -> u32 {
        self.lock().unacked
    }

    pub(crate) fn attach(st: &mut IdState, dev: DeviceInfo) -> Result<()> {
        st.context = Some(Context::open(&dev)?);
        st.device = Some(dev);
        Ok(())
    }

    /// The devices that may serve this id: all of them, or those of the transport the id is
    /// restricted to (`CmOption::Transport`); UDP ids only RoCE ones (EOPNOTSUPP if none).
    fn devices_for(&self, st: &IdState, op: &str) -> Result<Vec<DeviceInfo>> {
        let all = crate::devices::cached()?;
        let want = match (self.inner.ps, st.opts.transport) {
            (PortSpace::Udp, Some(TransportKind::Iwarp)) => bail!(
                OpNotSupp,
                "{op}: RDMA_PS_UDP needs a RoCE device; the id is restricted to iWARP"
            ),
            (PortSpace::Udp, _) => Some(TransportKind::Roce),
            (_, t) => t,
        };
        let Some(t) = want else { return Ok(all) };
        let devs: Vec<DeviceInfo> = all.iter().filter(|d| d.transport == t).cloned().collect();
        if devs.is_empty() && !all.is_empty() {
            let names: Vec<String> = all.iter().map(|d| format!("{} ({})", d.name, d.transport)).collect();
            let errno = if self.inner.ps == PortSpace::Udp {
                Errno::OpNotSupp
            } else {
                Errno::NoDev
            };
            return Err(Error::new(
                errno,
                format!("{op}: no {t} device for this id (devices: {})", names.join(", ")),
            ));
        }
        Ok(devs)
    }

    /// True when the id's device is a soft-RoCE one (the IB CM carries its connection).
    fn on_roce(st: &IdState) -> bool {
        st.device.as_ref().is_some_and(|d| d.transport == TransportKind::Roce)
    }

    /// Waits (sync ids only) for this id's next event among `want`; errors become `Err`.
    pub(crate) fn wait_sync(&self, want: &[EventType]) -> Result<()> {
        let (sync, ch) = {
            let st = self.lock();
            (st.sync, st.channel.clone())
        };
        if !sync {
            return Ok(());
        }
        let me = self.inner.clone();
        let ev = ch.get_matching(None, &|e| {
            Arc::ptr_eq(e.id.inner(), &me) && (want.contains(&e.event) || e.status != 0)
        })?;
        if ev.status != 0 || !want.contains(&ev.event) {
            return Err(sync_error(&ev));
        }
        Ok(())
    }

    /// Binds to a local address (`rdma_bind_addr`). Port 0 picks a free port. A loopback
    /// address needs a loopback-capable device (R3); a specific address attaches its device.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut st = self.lock();
        if st.state != CmState::Idle {
            bail!(
                Inval,
                "rdma_bind_addr {addr}: the id is in {}; only an IDLE id can bind",
                st.state
            );
        }
        let devs = self.devices_for(&st, "rdma_bind_addr")?;
        // The interface list (a netlink dump) only tells the errors apart (an address of this
        // host no device serves, or none of this host's): skip it when a device owns the address.
        let dev = match addr::bind_device(&devs, &[], addr) {
            Ok(d) => d,
            Err(_) => addr::bind_device(&devs, &device::list_interfaces()?, addr)?,
        };
        let ps = self.inner.ps;
        let af_only = st.opts.af_only.unwrap_or(addr.is_ipv4());
        let reuse = st.opts.reuse_addr;
        // A given port is checked against the other ids first, so a conflict is reported as
        // the kernel's port space reports it (EADDRINUSE / EADDRNOTAVAIL) rather than TCP's.
        let (sock, claim) = if addr.port() != 0 {
            let claim = PortClaim::take(Binding::new(ps, addr, af_only, reuse))?;
            (bind_socket(ps, addr, &st.opts)?, claim)
        } else {
            // Port 0: the kernel picks a port free in TCP (or UDP); another softrdma id may
            // still hold it in the port space (bound, not listening): pick again.
            let mut tries = 0;
            loop {
                let sock = bind_socket(ps, addr, &st.opts)?;
                let port = sock
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_socket())
                    .map(|a| a.port())
                    .unwrap_or(0);
                match PortClaim::take(Binding::new(ps, SocketAddr::new(addr.ip(), port), af_only, reuse)) {
                    Ok(c) => break (sock, c),
                    Err(e) if tries < 16 && matches!(e.errno, Errno::AddrInUse | Errno::AddrNotAvail) => {
                        tries += 1;
                        tracing::debug!("rdma_bind_addr {addr}: port {port} is taken in the port space: {e}");
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        st.local = sock.local_addr().ok().and_then(|a| a.as_socket());
        st.reserved = Some(sock);
        st.port = Some(claim);
        if let Some(d) = dev {
            Self::attach(&mut st, d)?;
        }
        st.state = CmState::AddrBound;
        Ok(())
    }

    /// Resolves a destination (`rdma_resolve_addr`): ADDR_RESOLVED, or ADDR_ERROR, or an
    /// immediate error (no route; loopback without a loopback-capable device, R5).
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, _timeout_ms: i32) -> Result<()> {
        if let Some(s) = src {
            if s.is_ipv4() != dst.is_ipv4() && !addr::is_wildcard(s.ip()) {
                bail!(
                    Inval,
                    "rdma_resolve_addr: source {s} and destination {dst} are of different families"
                );
            }
            if self.state() == CmState::Idle {
                self.bind_addr(s)?;
            }
        }
        let resolution = {
            let st = self.lock();
            if !matches!(st.state, CmState::Idle | CmState::AddrBound) {
                bail!(Inval, "rdma_resolve_addr {dst}: the id is in {}", st.state);
            }
            let devs = self.devices_for(&st, "rdma_resolve_addr")?;
            let scope = scope_of(dst);
            addr::resolve(&devs, dst.ip(), st.local.map(|a| a.ip()), |ip| {
                addr::route_source_in(ip, scope)
            })?
        };
        match resolution {
            Resolution::Resolved { device, src } => {
                {
                    let mut st = self.lock();
                    let port = st.local.map(|a| a.port()).unwrap_or(0);
                    // A link-local source keeps the interface it is on (the bound one, the
                    // destination's, or the device's), so binding and sending from it work.
                    let scope = st.local.map(scope_of).filter(|s| *s != 0).unwrap_or(scope_of(dst));
                    st.local = Some(match src {
                        IpAddr::V6(v6) if addr::is_link_local_v6(src) => SocketAddr::V6(std::net::SocketAddrV6::new(
                            v6,
                            port,
                            0,
                            if scope != 0 { scope } else { device.ifindex },
                        )),
                        _ => SocketAddr::new(src, port),
                    });
                    st.peer = Some(dst);
                    Self::attach(&mut st, device)?;
                    st.state = CmState::AddrResolved;
                }
                self.inner
                    .post(EventType::AddrResolved, 0, ConnParam::default(), String::new(), None);
            }
            Resolution::AddrError { status, reason } => {
                tracing::warn!(%reason, "address resolution failed");
                self.inner
                    .post(EventType::AddrError, status, ConnParam::default(), reason, None);
            }
        }
        self.wait_sync(&[EventType::AddrResolved])
    }

    /// Resolves the route (`rdma_resolve_route`): always ROUTE_RESOLVED once the address is (R7).
    pub fn resolve_route(&self, timeout_ms: i32) -> Result<()> {
        if timeout_ms <= 0 {
            bail!(
                Inval,
                "rdma_resolve_route: timeout_ms must be positive (got {timeout_ms})"
            );
        }
        {
            let mut st = self.lock();
            if st.state != CmState::AddrResolved {
                bail!(
                    Inval,
                    "rdma_resolve_route: the id is in {}; resolve the address first",
                    st.state
                );
            }
            st.state = CmState::RouteResolved;
        }
        self.inner
            .post(EventType::RouteResolved, 0, ConnParam::default(), String::new(), None);
        self.wait_sync(&[EventType::RouteResolved])
    }

    /// Creates an RC QP on the id's device, moved to INIT (`rdma_create_qp`).
    pub fn create_qp(&self, pd: &Pd, init: QpInitAttr) -> Result<Qp> {
        let mut st = self.lock();
        let Some(dev) = st.device.clone() else {
            bail!(Inval, "rdma_create_qp: the id has no device yet (bind to an address, resolve, or take a connection request first)");
        };
        if pd.context().device().name != dev.name {
            bail!(
                Inval,
                "rdma_create_qp: the PD belongs to {}, the id to {}",
                pd.context().device().name,
                dev.name
            );
        }
        if st.qp.is_some() {
            bail!(Inval, "rdma_create_qp: the id already has a QP");
        }
        if dev.transport == TransportKind::Roce {
            let qp = Self::create_roce_qp(self.inner.ps, pd, init)?;
            st.qp = Some(qp.clone());
            return Ok(qp);
        }
        if init.qp_type != QpType::Rc {
            bail!(
                Inval,
                "rdma_create_qp: {:?} QPs need the RoCE device; iWARP ids take RC QPs",
                init.qp_type
            );
        }
        let qp = Qp::new(pd, init, AttrRules::Iwarp)?;
        let attr = QpAttr {
            qp_state: Some(QpState::Init),
            qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            ..QpAttr::default()
        };
        qp.modify(&attr, attr_mask::STATE | attr_mask::ACCESS_FLAGS)?;
        st.qp = Some(qp.clone());
        Ok(qp)
    }

    /// `rdma_create_qp` on a RoCE id: an RC QP in INIT (TCP and IB port spaces), or a UD QP
    /// in RTS with Q_Key RDMA_UDP_QKEY (UDP and IB port spaces), as librdmacm leaves them.
    fn create_roce_qp(ps: PortSpace, pd: &Pd, init: QpInitAttr) -> Result<Qp> {
        let t = init.qp_type;
        let ok = matches!(
            (ps, t),
            (PortSpace::Tcp, QpType::Rc) | (PortSpace::Udp, QpType::Ud) | (PortSpace::Ib, QpType::Rc | QpType::Ud)
        );
        if !ok {
            bail!(Inval, "rdma_create_qp: {t:?} QPs do not fit an id of port space {ps:?}");
        }
        let qp = softrdma_roce::driver::create_qp(pd, init)?;
        let r = if t == QpType::Ud {
            ib::qp_setup::bring_up_ud(&qp, ib::qp_setup::RDMA_UDP_QKEY)
        } else {
            let (a, m) = ib::qp_setup::init_attr(t, 0);
            qp.modify(&a, m)
        };
        if let Err(e) = r {
            let _ = qp.destroy();
            return Err(e);
        }
        Ok(qp)
    }

    /// Attaches a QP the application created itself (it must be in INIT or RTR, on the id's
    /// device); `connect`/`accept` then move it to RTS (rping -q, `rdma_init_qp_attr` users).
    /// On a RoCE id the QP may be in RESET, INIT, RTR or RTS: the CM moves it forward only.
    pub fn attach_qp(&self, qp: &Qp) -> Result<()> {
        let mut st = self.lock();
        let Some(dev) = st.device.clone() else {
            bail!(Inval, "attach QP {}: the id has no device yet", qp.qpn());
        };
        if qp.inner().pd.context().device().name != dev.name {
            bail!(
                Inval,
                "attach QP {}: the QP is on {}, the id on {}",
                qp.qpn(),
                qp.inner().pd.context().device().name,
                dev.name
            );
        }
        if st.qp.is_some() {
            bail!(Inval, "attach QP {}: the id already has a QP", qp.qpn());
        }
        if dev.transport == TransportKind::Roce {
            if qp.inner().qp_type == QpType::Ud {
                ib::qp_setup::bring_up_ud(qp, ib::qp_setup::RDMA_UDP_QKEY)?;
            } else if qp.state() == QpState::Reset {
                let (a, m) = ib::qp_setup::init_attr(QpType::Rc, 0);
                qp.modify(&a, m)?;
            } else if matches!(qp.state(), QpState::Err | QpState::Sqd | QpState::Sqe) {
                bail!(Inval, "attach QP {}: the QP is in {}", qp.qpn(), qp.state());
            }
            st.qp = Some(qp.clone());
            return Ok(());
        }
        let unconnected_rts = qp.state() == QpState::Rts && qp.inner().driver().is_none();
        if !matches!(qp.state(), QpState::Reset | QpState::Init | QpState::Rtr) && !unconnected_rts {
            bail!(
                Inval,
                "attach QP {}: the QP is in {}; it must be INIT or RTR",
                qp.qpn(),
                qp.state()
            );
        }
        // Give it the access rdma_init_qp_attr would (the application may not have asked yet).
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let target = match qp.state() {
            QpState::Reset | QpState::Init => Some(QpState::Init),
            QpState::Rts => Some(QpState::Rts),
            _ => None,
        };
        if let Some(t) = target {
            let attr = QpAttr {
                qp_state: Some(t),
                qp_access_flags: access,
                ..QpAttr::default()
            };
            qp.modify(&attr, attr_mask::STATE | attr_mask::ACCESS_FLAGS)?;
        }
        st.qp = Some(qp.clone());
        Ok(())
    }

    /// Destroys the id's QP (`rdma_destroy_qp`).
    pub fn destroy_qp(&self) -> Result<()> {
        let qp = self.lock().qp.take();
        match qp {
            Some(q) => q.destroy(),
            None => Ok(()),
        }
    }

    fn connect_params(&self, st: &IdState, param: &ConnParam) -> Result<ConnectParams> {
        let attr = st.device.as_ref().map(|d| d.attr());
        let (max_ird, max_ord) = attr
            .map(|a| (a.max_qp_rd_atom, a.max_qp_init_rd_atom))
            .unwrap_or((16, 16));
        Ok(ConnectParams {
            private_data: param.private_data.clone(),
            ird: resources(param.responder_resources, max_ird, "responder_resources")?,
            ord: resources(param.initiator_depth, max_ord, "initiator_depth")?,
            timeout: st.opts.connect_timeout,
            tos: st.opts.tos,
            ..ConnectParams::default()
        })
    }

    /// Connects (`rdma_connect`): ESTABLISHED, REJECTED (-ECONNREFUSED), UNREACHABLE
    /// (-ETIMEDOUT after the connect timeout) or CONNECT_ERROR.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let roce = Self::on_roce(&self.lock());
        if roce {
            return ib::active::connect(self, param);
        }
        check_pd("rdma_connect", &param.private_data)?;
        let (sock, qp, dst, params, src) = {
            let mut st = self.lock();
            if st.state != CmState::RouteResolved {
                bail!(
                    Inval,
                    "rdma_connect: the id is in {}; resolve the address and route first",
                    st.state
                );
            }
            let Some(qp) = st.qp.clone() else {
                bail!(
                    Inval,
                    "rdma_connect: iWARP connections need a QP on the id (rdma_create_qp first)"
                );
            };
            let Some(dst) = st.peer else {
                bail!(Inval, "rdma_connect: no destination")
            };
            let params = self.connect_params(&st, param)?;
            let src = st.local.filter(|a| !addr::is_wildcard(a.ip()));
            st.state = CmState::Connect;
            st.disconnected = false;
            st.iwarp_retry = Some(IwarpRetry {
                param: param.clone(),
                first: std::time::Instant::now(),
                tries: 0,
            });
            (st.reserved.take(), qp, dst, params, src)
        };
        let sink = self.inner.sink();
        let started = match sock {
            Some(s) => softrdma_iwarp::connect_socket(s, &qp, dst, params, sink),
            None => softrdma_iwarp::connect(
                &qp,
                dst,
                ConnectParams {
                    src: src.map(|a| SocketAddr::new(a.ip(), 0)),
                    ..params
                },
                sink,
            ),
        };
        match started {
            // Unless TCP refused it already and a retry took over (`retry_refused`).
            Ok(h) => {
                let mut st = self.lock();
                if st.iwarp_retry.as_ref().is_none_or(|r| r.tries == 0) {
                    st.conn = Some(h);
                }
            }
            Err(e) => {
                self.lock().state = CmState::RouteResolved;
                return Err(e);
            }
        }
        self.wait_sync(&[EventType::Established])
    }

    /// Listens (`rdma_listen`). An IDLE id binds 0.0.0.0 first. Backlog ≤ 0 means the maximum.
    /// A listener on a loopback address admits only this host (R4); a remote request naming a
    /// loopback address is rejected (R12).
    pub fn listen(&self, backlog: i32) -> Result<()> {
        if self.state() == CmState::Idle {
            self.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))?;
        }
        let mut st = self.lock();
        if st.state != CmState::AddrBound {
            bail!(Inval, "rdma_listen: the id is in {}", st.state);
        }
        let backlog = if backlog <= 0 || backlog as u32 > MAX_BACKLOG {
            MAX_BACKLOG
        } else {
            backlog as u32
        };
        if st.reserved.is_none() {
            bail!(Inval, "rdma_listen: the id lost its bound socket")
        }
        // As the kernel: a listener bound with REUSEADDR must be alone on its address, and
        // holds it alone from now on.
        if let Some(c) = st.port.as_mut() {
            c.make_exclusive()?;
        }
        st.opts.reuse_addr = false;
        let bound = st.local.map(|a| a.ip()).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let ps = self.inner.ps;
        let devs = self.devices_for(&st, "rdma_listen")?;
        // The kernel listens on every device an address can arrive on: iWARP, RoCE or both.
        let transports = listen_transports(&devs, bound);
        let roce = transports.contains(&TransportKind::Roce);
        let iwarp = ps != PortSpace::Udp && (transports.contains(&TransportKind::Iwarp) || !roce);
        if ps == PortSpace::Udp && !roce {
            bail!(
                OpNotSupp,
                "rdma_listen {bound}: RDMA_PS_UDP needs a RoCE device, and none serves this address"
            );
        }
        let guard = match roce {
            false => None,
            true => {
                let local = st.local.unwrap_or(SocketAddr::new(bound, 0));
                let af_only = st.opts.af_only.unwrap_or(bound.is_ipv4());
                match ib::listen::listen(&self.inner, ps, local, backlog, af_only) {
                    Ok(g) => Some(g),
                    Err(e) if e.errno == Errno::AddrInUse || !iwarp => return Err(e),
                    Err(e) => {
                        tracing::warn!("rdma_listen {local}: listening on iWARP only: {e}");
                        None
                    }
                }
            }
        };
        if iwarp {
            let Some(sock) = st.reserved.take() else {
                bail!(Inval, "rdma_listen: the id lost its bound socket")
            };
            let iwarp_devs: Vec<DeviceInfo> = devs
                .iter()
                .filter(|d| d.transport == TransportKind::Iwarp)
                .cloned()
                .collect();
            let ifaces = device::list_interfaces()?;
            let me = Arc::downgrade(&self.inner);
            let listener = Listener::from_socket(sock, backlog, move |req| {
                on_request(&me, ps, bound, &iwarp_devs, &ifaces, req)
            })?;
            st.local = Some(listener.local_addr());
            st.listener = Some(listener);
        }
        st.ib_listen = guard;
        st.state = CmState::Listen;
        Ok(())
    }

    /// For synchronous listeners (`rdma_get_request`): waits for the next connection request.
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<CmId> {
        let (sync, state, ch) = {
            let st = self.lock();
            (st.sync, st.state, st.channel.clone())
        };
        if !sync || state != CmState::Listen {
            bail!(
                Inval,
                "rdma_get_request: only a synchronous, listening id takes requests"
            );
        }
        let me = self.inner.clone();
        let ev = ch.get_matching(timeout, &|e| {
            e.event == EventType::ConnectRequest && e.listen_id.as_ref().is_some_and(|l| Arc::ptr_eq(l.inner(), &me))
        })?;
        let child = ev.id.clone();
        child.lock().sync = true;
        Ok(child)
    }

    /// Accepts a connection request on the new id (`rdma_accept`); the id needs a QP.
    pub fn accept(&self, param: Option<&ConnParam>) -> Result<()> {
        if self.lock().ib.is_some() {
            return ib::passive::accept(self, param);
        }
        let default = ConnParam {
            responder_resources: 0xFF,
            initiator_depth: 0xFF,
            ..ConnParam::default()
        };
        let param = param.unwrap_or(&default);
        check_pd("rdma_accept", &param.private_data)?;
        let (req, qp, params) = {
            let mut st = self.lock();
            if st.state != CmState::Connect || st.request.is_none() {
                bail!(
                    Inval,
                    "rdma_accept: the id is in {} and holds no connection request",
                    st.state
                );
            }
            let Some(qp) = st.qp.clone() else {
                bail!(
                    Inval,
                    "rdma_accept: iWARP connections need a QP on the id (rdma_create_qp first)"
                );
            };
            let params = self.connect_params(&st, param)?;
            (st.request.take(), qp, params)
        };
        let Some(req) = req else {
            bail!(Inval, "rdma_accept: no request")
        };
        let handle = req.accept(&qp, params, self.inner.sink())?;
        self.lock().conn = Some(handle);
        self.wait_sync(&[EventType::Established])
    }

    /// Rejects a connection request with private data (`rdma_reject`): the peer sees REJECTED.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if self.lock().ib.is_some() {
            return ib::passive::reject(self, private_data);
        }
        check_pd("rdma_reject", private_data)?;
        let req = {
            let mut st = self.lock();
            let Some(req) = st.request.take() else {
                bail!(
                    Inval,
                    "rdma_reject: the id is in {} and holds no connection request",
                    st.state
                );
            };
            st.state = CmState::Disconnect;
            req
        };
        req.reject(private_data)
    }

    /// Disconnects (`rdma_disconnect`): the QP moves to ERR, both sides get DISCONNECTED.
    pub fn disconnect(&self) -> Result<()> {
        if self.lock().ib.is_some() {
            return ib::close::disconnect(self);
        }
        let conn = {
            let st = self.lock();
            if st.state == CmState::Disconnect {
                // Already disconnected (the peer went first): nothing to do, as in the kernel.
                return Ok(());
            }
            if st.state != CmState::Connect {
                bail!(Inval, "rdma_disconnect: the id is in {}, not connected", st.state);
            }
            st.conn.clone()
        };
        let Some(conn) = conn else {
            bail!(Inval, "rdma_disconnect: the id has no connection")
        };
        conn.disconnect();
        self.wait_sync(&[EventType::Disconnected])
    }

    /// Sets an option (`rdma_set_option`).
    pub fn set_option(&self, opt: CmOption) -> Result<()> {
        let mut st = self.lock();
        match opt {
            CmOption::Tos(t) => st.opts.tos = Some(t),
            CmOption::ReuseAddr(r) => {
                if !((r && st.state != CmState::Listen) || st.state == CmState::Idle) {
                    bail!(Inval, "RDMA_OPTION_ID_REUSEADDR: not allowed in state {}", st.state);
                }
                if let Some(c) = st.port.as_mut() {
                    c.set_reuse(r)?;
                }
                st.opts.reuse_addr = r;
                // A TCP socket keeps SO_REUSEADDR (see `bind_socket`).
                if let (Some(s), PortSpace::Udp) = (&st.reserved, self.inner.ps) {
                    let _ = s.set_reuse_address(r);
                }
            }
            CmOption::AfOnly(a) => {
                if !matches!(st.state, CmState::Idle | CmState::AddrBound) {
                    bail!(Inval, "RDMA_OPTION_ID_AFONLY: not allowed in state {}", st.state);
                }
                st.opts.af_only = Some(a);
            }
            // As the kernel: allowed in any state, applied at the QP's next move to RTS (a
            // listener passes it to its requests, a new passive id may set its own).
            CmOption::AckTimeout(t) => st.opts.ack_timeout = Some(t.min(31)),
            CmOption::ConnectTimeout(d) => st.opts.connect_timeout = d.max(Duration::from_millis(1)),
            CmOption::ResolveTimeout(d) => st.opts.resolve_timeout = Some(d),
            CmOption::Transport(t) => {
                if st.state != CmState::Idle {
                    bail!(
                        Inval,
                        "transport restriction: set it on an IDLE id (this one is in {})",
                        st.state
                    );
                }
                st.opts.transport = t;
            }
            CmOption::CmResponseTimeout(d) => st.opts.cm_response_timeout = Some(d.max(Duration::from_millis(1))),
            CmOption::CmRetries(n) => st.opts.cm_retries = Some(n.min(15)),
        }
        Ok(())
    }

    /// Current options.
    pub fn options(&self) -> Options {
        self.lock().opts
    }

    /// Completes an active connection that reported CONNECT_RESPONSE (the id had no QP when
    /// the peer accepted): moves the id's QP, if it has one now, to RTS and sends the RTU
    /// (`rdma_establish`). RoCE ids only; no further event follows.
    pub fn establish(&self) -> Result<()> {
        if self.lock().ib.is_none() {
            bail!(
                Inval,
                "rdma_establish: the id has no RoCE connection waiting (CONNECT_RESPONSE comes only on RoCE ids without a QP)"
            );
        }
        ib::active::establish(self)
    }

    /// `rdma_init_qp_attr`: the attributes and mask that move a QP the application manages to
    /// `state` (INIT, RTR or RTS) for this id's connection. On RoCE ids RTR and RTS need the
    /// peer's values, so they are available once the REP (active side) or REQ (passive side)
    /// arrived; iWARP ids get the access flags for INIT and RTR, the port for all three.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, u32)> {
        let st = self.lock();
        let Some(dev) = &st.device else {
            bail!(Inval, "rdma_init_qp_attr: the id has no device yet");
        };
        if dev.transport != TransportKind::Roce {
            // As the kernel's rdma_init_qp_attr over iw_cm_init_qp_attr: INIT and RTR give
            // the state and remote access, RTS no state (only the connection moves an iWARP
            // QP to RTS); all three the port.
            let a = QpAttr {
                qp_state: Some(state),
                qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ,
                port_num: 1,
                ..QpAttr::default()
            };
            return match state {
                QpState::Init | QpState::Rtr => Ok((a, attr_mask::STATE | attr_mask::ACCESS_FLAGS | attr_mask::PORT)),
                QpState::Rts => Ok((a, attr_mask::PORT)),
                s => bail!(Inval, "rdma_init_qp_attr: no attributes for QP state {s}"),
            };
        }
        let ud = ib::is_ud(self.inner.ps, st.qp.as_ref());
        let qp_type = if ud { QpType::Ud } else { QpType::Rc };
        let path = st.ib.as_ref().map(|h| h.link.lock().path);
        let ready = path.filter(|p| p.remote_qpn != 0);
        ib::qp_setup::init_qp_attr(qp_type, state, ready.as_ref(), ib::qp_setup::RDMA_UDP_QKEY).ok_or_else(|| {
            Error::inval(format!(
                "rdma_init_qp_attr: no {state} attributes yet (they need the peer's QPN and PSN)"
            ))
        })
    }

    /// Moves the id to another channel, or to synchronous mode with `None` (`rdma_migrate_id`).
    /// Queued events move with it.
    pub fn migrate(&self, to: Option<&EventChannel>) -> Result<()> {
        let mut st = self.lock();
        let target = match to {
            Some(c) => c.clone(),
            None if st.sync => bail!(Inval, "rdma_migrate_id: the id is already synchronous"),
            None => EventChannel::new()?,
        };
        let old = std::mem::replace(&mut st.channel, target.clone());
        st.sync = to.is_none();
        drop(st);
        let moved = old.move_all_of(&self.inner, &target);
        // Like librdmacm: wait until the events already taken from the old channel are acked.
        let mut st = self.lock();
        st.ack_waiters += 1;
        while st.unacked > moved {
            st = match self.inner.acked.wait_timeout(st, Duration::from_secs(1)) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        st.ack_waiters -= 1;
        Ok(())
    }

    /// Destroys the id (`rdma_destroy_id`): closes what it holds, drops its queued events
    /// (for a listener: its undelivered requests, which are rejected), and waits until every
    /// event already taken from the channel is acknowledged.
    pub fn destroy(self) -> Result<()> {
        let (ch, listener, request, conn, qp, ib_conn, ib_listen, mcast) = {
            let mut st = self.lock();
            st.state = CmState::Destroying;
            (
                st.channel.clone(),
                st.listener.take(),
                st.request.take(),
                st.conn.take(),
                st.qp.take(),
                st.ib.take(),
                st.ib_listen.take(),
                std::mem::take(&mut st.mcast),
            )
        };
        for j in mcast {
            j.leave();
        }
        drop(listener);
        drop(ib_listen);
        drop(request);
        if let Some(c) = conn {
            c.disconnect();
        }
        if let Some(h) = ib_conn {
            ib::close::destroy(h);
        }
        drop(qp);
        {
            let mut st = self.lock();
            st.reserved = None;
            st.port = None;
        }
        for ev in ch.take_requests_of(&self.inner) {
            let child = ev.id.clone();
            drop(ev);
            let (req, ib_req) = {
                let mut cs = child.lock();
                (cs.request.take(), cs.ib.take())
            };
            drop(req);
            if let Some(h) = ib_req {
                ib::close::destroy(h);
            }
        }
        ch.discard_events_of(&self.inner);
        let mut st = self.lock();
        st.ack_waiters += 1;
        while st.unacked > 0 {
            let (g, to) = self
                .inner
                .acked
                .wait_timeout(st, Duration::from_secs(10))
                .unwrap_or_else(|p| p.into_inner());
            st = g;
            if to.timed_out() && st.unacked > 0 {
                tracing::warn!(
                    unacked = st.unacked,
                    "rdma_destroy_id waits for events to be acknowledged"
                );
            }
        }
        st.ack_waiters -= 1;
        Ok(())
    }
}

/// The transports whose devices a listener bound to `bound` hears: every device's for a
/// wildcard, the loopback-capable devices' for a loopback address, else those owning it.
fn listen_transports(devs: &[DeviceInfo], bound: IpAddr) -> Vec<TransportKind> {
    let ip = addr::canonical(bound);
    let mut out: Vec<TransportKind> = Vec::new();
    for d in devs {
        let serves = if addr::is_wildcard(ip) {
            true
        } else if addr::is_loopback(ip) {
            d.loopback
        } else {
            d.owns_ip(ip)
        };
        if serves && !out.contains(&d.transport) {
            out.push(d.transport);
        }
    }
    out
}

/// A connection request reached a listener (progress thread).
fn on_request(
    listener: &Weak<IdInner>,
    ps: PortSpace,
    bound: IpAddr,
    devs: &[DeviceInfo],
    ifaces: &[device::NetIf],
    req: ConnRequest,
) {
    let Some(l) = listener.upgrade() else { return };
    let (local, peer) = (req.local_addr, req.peer_addr);
    let peer_local = addr::is_local(devs, ifaces, peer.ip());
    if let Err(why) = addr::admit(bound, local.ip(), peer.ip(), peer_local) {
        tracing::warn!(%local, %peer, %why, "connection request rejected");
        let mut pd = why.into_bytes();
        pd.truncate(MAX_PRIVATE_DATA);
        let _ = req.reject(&pd);
        return;
    }
    let local_ip = addr::canonical(local.ip());
    let dev = if addr::is_loopback(local_ip) {
        addr::loopback_device(devs).ok()
    } else {
        addr::owner(devs, local_ip)
    };
    let Some(dev) = dev else {
        tracing::warn!(%local, %peer, "connection request on an address no RDMA device serves: rejected");
        let _ = req.reject(b"no RDMA device serves this address");
        return;
    };
    let channel = l.lock().channel.clone();
    let child = CmId::with_channel(ps, channel, false);
    let param = ConnParam {
        private_data: req.private_data.clone(),
        responder_resources: req.ord.min(255) as u8,
        initiator_depth: req.ird.min(255) as u8,
        ..ConnParam::default()
    };
    {
        let mut st = child.lock();
        st.state = CmState::Connect;
        st.local = Some(local);
        st.peer = Some(peer);
        if CmId::attach(&mut st, dev).is_err() {
            return;
        }
        st.request = Some(req);
        st.req_param = Some(param.clone());
    }
    if l.lock().state != CmState::Listen {
        // The listener is being destroyed: the request's id goes with it (its drop rejects).
        return;
    }
    child.inner.post(
        EventType::ConnectRequest,
        0,
        param,
        String::new(),
        Some(CmId { inner: l }),
    );
}
