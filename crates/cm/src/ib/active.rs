//! The active side: `rdma_connect` as a REQ (RC) or SIDR_REQ (UD), and `rdma_establish` for
//! ids that took the REP without a QP (CONNECT_RESPONSE).

use super::agent::Agent;
use super::conn::{Actions, Conn, State};
use super::ids::random_psn;
use super::link::{IbHandle, Kind, Link, LinkState};
use super::privdata::{self, with_header, REQ_USER_LEN, SIDR_REQ_USER_LEN};
use super::qp_setup::{self, RcPath, DEFAULT_ACK_TIMEOUT, HOP_LIMIT, RDMA_UDP_QKEY};
use super::sidr::SidrClient;
use super::timing::Timing;
use super::{is_ud, wire_ps};
use crate::addr;
use crate::event::EventType;
use crate::id::{resources, CmId, IdInner, IdState};
use crate::param::ConnParam;
use crate::state::CmState;
use socket2::{Domain, Protocol, Socket, Type};
use softrdma_verbs::{bail, Errno, Error, Result};
use softrdma_wire::ibcm::{
    service_id, CmPath, CmaHeader, RejReason, Req, SidrReq, CM_TRANSPORT_RC, REQ_PRIVATE_LEN, SIDR_REQ_PRIVATE_LEN,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// P_Key of every CM message (the default partition).
const PKEY: u16 = 0xffff;

/// The id's source and destination addresses (IPv4-mapped ones as IPv4), of one family.
fn ip_pair(st: &IdState) -> Result<(SocketAddr, IpAddr, SocketAddr, IpAddr)> {
    let (Some(local), Some(peer)) = (st.local, st.peer) else {
        bail!(Inval, "rdma_connect: the id has no resolved address");
    };
    let (s, d) = (addr::canonical(local.ip()), addr::canonical(peer.ip()));
    if s.is_ipv4() != d.is_ipv4() {
        return Err(Error::new(
            Errno::Inval,
            format!("rdma_connect {peer}: the source address {s} is of another family"),
        ));
    }
    Ok((local, s, peer, d))
}

/// The peer's GID (as an address) for a destination: the destination itself, except
/// that an address of this host that is not in the device's GID table (127.1.2.3 on `lo`)
/// stands for the GID the passive side will send from (the table's entry for it, 127.0.0.1),
/// and a loopback address on a loopback-capable device on another netdev stands for that
/// device's GID of its family (where its packets come from). The passive side maps the
/// requester's address the same way.
pub(super) fn peer_gid(dev: &softrdma_verbs::device::DeviceInfo, dst: IpAddr) -> IpAddr {
    match dev
        .gid_index_of(dst)
        .and_then(|i| dev.gid(i))
        .map(softrdma_verbs::device::gid_to_ip)
    {
        Some(ip) if ip.is_ipv4() == dst.is_ipv4() => ip,
        _ => dst,
    }
}

/// Gives an id without a port one (the kernel binds on resolve): a socket of the port space's
/// protocol bound to the source address holds it.
/// `ifindex` is the scope of a link-local IPv6 `src` when the id's address has none.
fn reserve_port(st: &mut IdState, src: IpAddr, ifindex: u32, udp: bool) -> Result<u16> {
    if let Some(p) = st.local.map(|a| a.port()).filter(|p| *p != 0) {
        return Ok(p);
    }
    let scope = match st.local {
        Some(SocketAddr::V6(v6)) if v6.scope_id() != 0 => v6.scope_id(),
        _ if addr::is_link_local_v6(src) => ifindex,
        _ => 0,
    };
    let at = |port: u16| match src {
        IpAddr::V6(v6) => SocketAddr::V6(std::net::SocketAddrV6::new(v6, port, 0, scope)),
        v4 => SocketAddr::new(v4, port),
    };
    let domain = if src.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let sock = if udp {
        Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))
    } else {
        Socket::new(domain, Type::STREAM, Some(Protocol::TCP))
    }
    .map_err(|e| Error::os("rdma_connect: port", &e))?;
    sock.bind(&at(0).into())
        .map_err(|e| Error::os(format!("rdma_connect: bind {src}"), &e))?;
    let port = sock
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .unwrap_or(0);
    st.reserved = Some(sock);
    st.local = Some(at(port));
    Ok(port)
}

/// An active id's connect, kept for [`retry_unclaimed`].
#[derive(Debug, Clone)]
pub(crate) struct ConnectRetry {
    param: ConnParam,
    first: Instant,
    tries: u32,
}

/// `rdma_connect` on a RoCE id: REQ (RC) or SIDR_REQ (UD). ESTABLISHED (CONNECT_RESPONSE
/// without a QP), REJECTED (status: REJ reason), UNREACHABLE (-ETIMEDOUT, or a SIDR status).
pub(crate) fn connect(id: &CmId, param: &ConnParam) -> Result<()> {
    id.lock().connect_retry = Some(ConnectRetry {
        param: param.clone(),
        first: Instant::now(),
        tries: 0,
    });
    let ud = start(id, param)?;
    if ud {
        id.wait_sync(&[EventType::Established])
    } else {
        id.wait_sync(&[EventType::Established, EventType::ConnectResponse])
    }
}

/// An RC REQ found no listener (REJ reason 8): instead of REJECTED, the connect starts again
/// after 2, 4, 8, ... ms, for at most [`crate::id::NO_LISTENER_RETRY_BUDGET`]. The kernel reports REJECTED at once, but its active side takes far
/// longer from `rdma_resolve_addr` to the REQ than this CM does, so applications that re-listen
/// just before their peer connects (perftest `-R` destroys its first listener, exchanges data
/// and listens again while the client resolves and connects) find the listener in time there;
/// over this CM they would race it. Returns true when a retry is scheduled.
pub(crate) fn retry_unclaimed(ls: &LinkState, id: &Arc<IdInner>) -> bool {
    let active = matches!(&ls.kind, Kind::Rc(c) if c.is_active());
    if !active {
        return false;
    }
    let old = {
        let mut st = id.lock();
        let same_link = st.ib.as_ref().map(|h| h.link.local_id);
        let connecting = st.state == CmState::Connect && !st.disconnected;
        let Some(r) = st.connect_retry.as_mut() else {
            return false;
        };
        if !connecting || r.first.elapsed() >= crate::id::NO_LISTENER_RETRY_BUDGET {
            return false;
        }
        let delay = Duration::from_millis(2u64 << r.tries.min(7));
        r.tries += 1;
        (same_link, delay)
    };
    let (Some(link_id), delay) = old else { return false };
    let Ok(reactor) = softrdma_verbs::progress::Reactor::global() else {
        return false;
    };
    tracing::debug!(peer = %ls.peer, ?delay, "IB CM: nothing listens there yet, REQ again");
    // A timer of the progress thread, as iWARP's retry (`IdInner::retry_refused`).
    let w = Arc::downgrade(id);
    let _ = reactor.call_at(
        Instant::now() + delay,
        Box::new(move || {
            if let Some(id) = w.upgrade() {
                restart(&CmId::from_inner(id), link_id);
            }
        }),
    );
    true
}

/// The retry of [`retry_unclaimed`]: a new REQ (new communication ID and PSN) on the same id,
/// unless the id moved on meanwhile.
fn restart(id: &CmId, old_link: u32) {
    let (param, old) = {
        let mut st = id.lock();
        let same = st.ib.as_ref().is_some_and(|h| h.link.local_id == old_link);
        let Some(r) = st.connect_retry.clone() else { return };
        if !same || st.state != CmState::Connect || st.disconnected {
            return;
        }
        st.state = CmState::RouteResolved;
        (r.param, st.ib.take())
    };
    drop(old);
    if let Err(e) = start(id, &param) {
        let qp = id.lock().qp.clone();
        if let Some(q) = qp {
            qp_setup::to_error(&q);
        }
        let why = format!("connect again after REJ reason 8: {e}");
        id.inner().post(EventType::Rejected, 8, ConnParam::default(), why, None);
    }
}

/// Sends the REQ or SIDR_REQ of `rdma_connect`; true for a UD id.
fn start(id: &CmId, param: &ConnParam) -> Result<bool> {
    let agent = Agent::get()?;
    let ps = id.port_space();
    let now = Instant::now();
    let (link, acts, ud) = {
        let mut st = id.lock();
        if st.state != CmState::RouteResolved {
            bail!(
                Inval,
                "rdma_connect: the id is in {}; resolve the address and route first",
                st.state
            );
        }
        let ud = is_ud(ps, st.qp.as_ref());
        if ud {
            privdata::check(
                "rdma_connect",
                "SIDR_REQ: 216 minus the 36-byte CMA header",
                param.private_data.len(),
                SIDR_REQ_USER_LEN,
            )?;
        } else {
            privdata::check(
                "rdma_connect",
                "REQ: 92 minus the 36-byte CMA header",
                param.private_data.len(),
                REQ_USER_LEN,
            )?;
        }
        let Some(dev) = st.device.clone() else {
            bail!(Inval, "rdma_connect: the id has no device");
        };
        let (_, src, peer, dst) = ip_pair(&st)?;
        let src_port = reserve_port(&mut st, src, dev.ifindex, ps == crate::state::PortSpace::Udp)?;
        let hdr = CmaHeader { src_port, src, dst };
        let sid = service_id(wire_ps(ps)?, peer.port());
        let o = st.opts;
        let timing = Timing {
            give_up: Some(o.connect_timeout),
            ..Timing::for_id(o.ack_timeout, o.cm_response_timeout, o.cm_retries)
        };
        let local_id = agent.alloc_id();
        let tid = agent.ids.tid();
        let sgid_index = dev.gid_index_of(src).unwrap_or(0) as u8;
        let tos = o.tos.unwrap_or(0);
        let dgid = peer_gid(&dev, dst);
        let mut path = RcPath {
            peer: Some(dgid),
            sgid_index,
            traffic_class: tos,
            ..RcPath::default()
        };
        let (kind, acts) = if ud {
            let req = SidrReq {
                request_id: local_id,
                pkey: PKEY,
                service_id: sid,
                private_data: with_header::<SIDR_REQ_PRIVATE_LEN>(&hdr, &param.private_data)?,
            };
            let (c, acts) = SidrClient::start(local_id, tid, req, timing, now);
            (Kind::SidrClient(c), acts)
        } else {
            let qpn = match &st.qp {
                Some(q) => q.qpn(),
                None if param.qp_num != 0 => param.qp_num,
                None => bail!(
                    Inval,
                    "rdma_connect: the id has no QP and conn_param.qp_num names none (rdma_create_qp first)"
                ),
            };
            let attr = dev.attr();
            let rr = resources(param.responder_resources, attr.max_qp_rd_atom, "responder_resources")?;
            let depth = resources(param.initiator_depth, attr.max_qp_init_rd_atom, "initiator_depth")?;
            let ack_timeout = o.ack_timeout.unwrap_or(DEFAULT_ACK_TIMEOUT);
            path.path_mtu = dev.port_attr().active_mtu as u8;
            path.local_psn = random_psn();
            path.responder_resources = rr.min(255) as u8;
            path.initiator_depth = depth.min(255) as u8;
            path.retry_count = param.retry_count & 7;
            path.ack_timeout = ack_timeout;
            let resp = timing.response_exponent();
            let req = Req {
                service_id: sid,
                local_ca_guid: dev.node_guid(),
                local_qpn: qpn,
                responder_resources: path.responder_resources,
                initiator_depth: path.initiator_depth,
                remote_cm_response_timeout: resp,
                transport_service_type: CM_TRANSPORT_RC,
                end_to_end_flow_control: param.flow_control != 0,
                starting_psn: path.local_psn,
                local_cm_response_timeout: resp,
                retry_count: path.retry_count,
                pkey: PKEY,
                path_mtu: path.path_mtu,
                rnr_retry_count: param.rnr_retry_count & 7,
                max_cm_retries: timing.retries,
                srq: param.srq,
                primary_path: CmPath {
                    local_lid: 0xffff,
                    remote_lid: 0xffff,
                    local_gid: softrdma_verbs::device::Gid::from_ip(src).0,
                    remote_gid: softrdma_verbs::device::Gid::from_ip(dgid).0,
                    traffic_class: tos,
                    hop_limit: HOP_LIMIT,
                    local_ack_timeout: ack_timeout,
                    ..CmPath::default()
                },
                private_data: with_header::<REQ_PRIVATE_LEN>(&hdr, &param.private_data)?,
                ..Req::default()
            };
            let (c, acts) = Conn::active(local_id, tid, req, timing, now);
            (Kind::Rc(c), acts)
        };
        let link = Link::new(
            local_id,
            LinkState {
                kind,
                id: Arc::downgrade(id.inner()),
                local: src,
                remote: dst,
                peer,
                path,
                req: None,
                remote_key: None,
                guid: dev.node_guid(),
                timing,
                qkey: RDMA_UDP_QKEY,
                scheduled: None,
                abandoned: false,
            },
        );
        st.state = CmState::Connect;
        st.disconnected = false;
        st.ib = Some(IbHandle { link: link.clone() });
        (link, acts, ud)
    };
    agent.insert(&link, None);
    link.step(&agent, |_, _| (acts, ()));
    Ok(ud)
}

/// `rdma_establish` (or `rdma_accept` on the active side) after CONNECT_RESPONSE: moves the
/// id's QP, if it has one now, to RTS and sends the RTU.
pub(crate) fn establish(id: &CmId) -> Result<()> {
    let (link, qp) = {
        let st = id.lock();
        let Some(h) = &st.ib else {
            bail!(Inval, "rdma_establish: the id has no IB CM connection");
        };
        (h.link.clone(), st.qp.clone())
    };
    let agent = Agent::get()?;
    link.step(&agent, |ls, now| -> (Actions, Result<()>) {
        let path = ls.path;
        let Kind::Rc(c) = &mut ls.kind else {
            return (
                Vec::new(),
                Err(Error::inval("rdma_establish: UD ids have no connection to establish")),
            );
        };
        if !c.is_active() || !matches!(c.state(), State::RepRcvd | State::MraRepSent) {
            return (
                Vec::new(),
                Err(Error::inval(
                    "rdma_establish: no connection reply to complete (wait for CONNECT_RESPONSE)",
                )),
            );
        }
        if let Some(qp) = &qp {
            if let Err(e) = qp_setup::bring_up_rc(qp, &path) {
                qp_setup::to_error(qp);
                let acts = c.reject(RejReason::ConsumerDefined, &[], now).unwrap_or_default();
                return (acts, Err(e));
            }
        }
        (c.rtu(&[]).unwrap_or_default(), Ok(()))
    })
}
