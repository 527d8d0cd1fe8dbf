//! The passive side's first step: listeners by service ID, and a REQ or SIDR_REQ becoming a
//! new id with a CONNECT_REQUEST (Linux `cma_ib_req_handler`, `cma_ib_id_from_event`).
//!
//! A REQ is matched by service ID (port space and port), then by the CMA header's destination
//! against the listener's bound address (a wildcard takes any; AFONLY as the kernel). The
//! loopback rules apply as on iWARP (LOOPBACK.md R4, R12): a listener on a loopback address
//! admits only this host, and a remote request naming a loopback address is rejected with the
//! reason in the REJ's private data. A full backlog drops the REQ without an answer: the
//! active side sends it again (rdma_cm.md §3.5).

use super::agent::{Agent, ListenEntry};
use super::conn::Conn;
use super::ids::random_psn;
use super::link::{IbHandle, Kind, Link, LinkState};
use super::privdata::split_header;
use super::qp_setup::{RcPath, DEFAULT_ACK_TIMEOUT, RDMA_UDP_QKEY};
use super::sidr::SidrServer;
use super::timing::Timing;
use super::{mad_io, wire_ps};
use crate::addr;
use crate::event::EventType;
use crate::id::{CmId, IdInner};
use crate::param::{ConnParam, UdParam};
use crate::state::{CmState, PortSpace};
use softrdma_roce::gsi::GsiPeer;
use softrdma_verbs::device::{self, DeviceInfo, TransportKind};
use softrdma_verbs::Result;
use softrdma_wire::ibcm::{
    service_id, service_id_parts, CmMad, CmMessage, CmaHeader, Rej, RejReason, Req, SidrRep, SidrReq, SidrStatus,
    CM_MSG_REQ, REJ_PRIVATE_LEN, SIDR_REP_PRIVATE_LEN,
};
use std::collections::hash_map::Entry;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};

/// A listener's registration; dropping it stops the listen (and frees the service ID once
/// no listener of this process uses it).
#[derive(Debug)]
pub(crate) struct ListenGuard {
    token: u64,
}

impl Drop for ListenGuard {
    fn drop(&mut self) {
        let Some(agent) = Agent::existing() else { return };
        let mut t = agent.tables();
        let Some(i) = t.listeners.iter().position(|l| l.token == self.token) else {
            return;
        };
        let sid = t.listeners.remove(i).service_id;
        let last = t.claims.get_mut(&sid).map(|(_, n)| {
            *n -= 1;
            *n == 0
        });
        if last == Some(true) {
            t.claims.remove(&sid);
        }
    }
}

/// Listens for REQs (and SIDR_REQs) to `ps`/`bound.port()` on this host's RoCE devices.
/// EADDRINUSE when another process listens on the same service ID.
pub(crate) fn listen(
    id: &Arc<IdInner>,
    ps: PortSpace,
    bound: SocketAddr,
    backlog: u32,
    af_only: bool,
) -> Result<ListenGuard> {
    let agent = Agent::get()?;
    let sid = service_id(wire_ps(ps)?, bound.port());
    let mut t = agent.tables();
    let users = match t.claims.entry(sid) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(v) => v.insert((mad_io::claim(sid)?, 0)),
    };
    users.1 += 1;
    t.next_token += 1;
    let token = t.next_token;
    t.listeners.push(ListenEntry {
        token,
        service_id: sid,
        bound: bound.ip(),
        af_only,
        backlog,
        id: Arc::downgrade(id),
    });
    Ok(ListenGuard { token })
}

/// Whether a listener bound to `bound` takes a request for `dst`: a wildcard of the family
/// (`::` also IPv4 ones unless the listener is AF-only), else the same address.
fn bound_matches(bound: IpAddr, af_only: bool, dst: IpAddr) -> bool {
    let dst = addr::canonical(dst);
    match bound {
        IpAddr::V4(b) => dst.is_ipv4() && (b.is_unspecified() || IpAddr::V4(b) == dst),
        IpAddr::V6(b) if b.is_unspecified() => dst.is_ipv6() || !af_only,
        IpAddr::V6(_) => addr::canonical(bound) == dst,
    }
}

/// The listener for `sid` and destination `dst`: an exact address before a wildcard.
fn find_listener(agent: &Agent, sid: u64, dst: IpAddr) -> Option<(Weak<IdInner>, IpAddr, u32)> {
    let t = agent.tables();
    let mut hits: Vec<&ListenEntry> = t
        .listeners
        .iter()
        .filter(|l| l.service_id == sid && bound_matches(l.bound, l.af_only, dst))
        .collect();
    hits.sort_by_key(|l| addr::is_wildcard(l.bound));
    hits.first().map(|l| (l.id.clone(), l.bound, l.backlog))
}

/// Why a request does not become a CONNECT_REQUEST.
enum Refusal {
    /// No listener for the service / address (REJ 8, SIDR unsupported).
    NoListener,
    /// Refused with a reason (REJ 28 / SIDR reject, the reason in the private data).
    Refused(String),
    /// Backlog full or listener going away: no answer (the peer retries).
    Drop,
}

/// A request admitted to a listener.
struct Admitted {
    listener: Arc<IdInner>,
    dst: IpAddr,
    port: u16,
    hdr: CmaHeader,
    user: Vec<u8>,
    dev: DeviceInfo,
}

/// Finds the listener, checks backlog and the loopback rules, and picks the device.
fn admit(agent: &Agent, peer: GsiPeer, sid: u64, field: &[u8]) -> std::result::Result<Admitted, Refusal> {
    let Some((_, port)) = service_id_parts(sid) else {
        return Err(Refusal::NoListener);
    };
    let (hdr, user) = split_header(field).map_err(Refusal::Refused)?;
    let dst = addr::canonical(hdr.dst);
    if dst.is_ipv4() != peer.local.is_ipv4() {
        return Err(Refusal::Refused(format!(
            "the CMA header's destination {dst} is not of the family the request came over ({})",
            peer.local
        )));
    }
    let Some((weak, bound, backlog)) = find_listener(agent, sid, dst) else {
        return Err(Refusal::NoListener);
    };
    let Some(listener) = weak.upgrade() else {
        return Err(Refusal::NoListener);
    };
    {
        let st = listener.lock();
        if st.state != CmState::Listen {
            return Err(Refusal::Drop);
        }
        if st.unacked >= backlog {
            tracing::debug!(%dst, port, backlog, "IB CM: backlog full, request dropped (the peer retries)");
            return Err(Refusal::Drop);
        }
    }
    let devs = crate::devices::cached().map_err(|e| Refusal::Refused(e.msg))?;
    // Loopback and device addresses are local without the interface list (a netlink dump).
    let known_local = |ip: IpAddr| addr::is_local(&devs, &[], ip);
    let peer_local = if known_local(peer.remote) && known_local(hdr.src) {
        true
    } else {
        let ifaces = device::list_interfaces().map_err(|e| Refusal::Refused(e.msg))?;
        addr::is_local(&devs, &ifaces, peer.remote) && addr::is_local(&devs, &ifaces, hdr.src)
    };
    if let Err(why) = addr::admit(bound, dst, hdr.src, peer_local) {
        tracing::warn!(from = %peer.remote, %dst, port, %why, "connection request rejected");
        return Err(Refusal::Refused(why));
    }
    let roce: Vec<DeviceInfo> = devs
        .into_iter()
        .filter(|d| d.transport == TransportKind::Roce)
        .collect();
    let dev = if addr::is_loopback(dst) {
        addr::loopback_device(&roce).ok()
    } else {
        addr::owner(&roce, dst)
    };
    let Some(dev) = dev else {
        return Err(Refusal::Refused(format!("no RoCE device serves {dst}")));
    };
    Ok(Admitted {
        listener,
        dst,
        port,
        hdr,
        user,
        dev,
    })
}

/// The id of an admitted request (state CONNECT, addresses from the CMA header, device
/// attached), reporting to the listener's channel.
fn child(a: &Admitted) -> Result<CmId> {
    let channel = a.listener.lock().channel.clone();
    let c = CmId::with_channel(a.listener.ps, channel, false);
    {
        let mut st = c.lock();
        st.state = CmState::Connect;
        st.local = Some(SocketAddr::new(a.dst, a.port));
        st.peer = Some(SocketAddr::new(a.hdr.src, a.hdr.src_port));
        CmId::attach(&mut st, a.dev.clone())?;
    }
    Ok(c)
}

fn listener_timing(l: &IdInner) -> Timing {
    let o = l.lock().opts;
    Timing::for_id(o.ack_timeout, o.cm_response_timeout, o.cm_retries)
}

/// A REQ arrived (the agent's round, on the progress thread).
pub(crate) fn on_req(agent: &Arc<Agent>, peer: GsiPeer, tid: u64, req: &Req) {
    let dup = agent
        .tables()
        .by_remote
        .get(&(peer.remote, req.local_comm_id, false))
        .cloned();
    if let Some(l) = dup {
        let m = CmMad {
            tid,
            msg: CmMessage::Req(*req),
        };
        return l.on_mad(agent, peer, &m);
    }
    let refuse = |reason: RejReason, text: &str| {
        let mut pd = [0u8; REJ_PRIVATE_LEN];
        let n = text.len().min(REJ_PRIVATE_LEN);
        pd[..n].copy_from_slice(&text.as_bytes()[..n]);
        let rej = Rej {
            local_comm_id: 0,
            remote_comm_id: req.local_comm_id,
            message_rejected: CM_MSG_REQ,
            reason,
            private_data: pd,
            ..Rej::default()
        };
        mad_io::send(peer.local, peer.remote, &CmMad { tid, msg: rej.into() });
    };
    let a = match admit(agent, peer, req.service_id, &req.private_data) {
        Ok(a) => a,
        Err(Refusal::NoListener) => return refuse(RejReason::InvalidServiceId, ""),
        Err(Refusal::Refused(why)) => return refuse(RejReason::ConsumerDefined, &why),
        Err(Refusal::Drop) => return,
    };
    let id = match child(&a) {
        Ok(c) => c,
        Err(e) => return refuse(RejReason::NoResources, &e.msg),
    };
    let timing = listener_timing(&a.listener);
    let local_id = agent.alloc_id();
    let ack_timeout = a.listener.lock().opts.ack_timeout;
    let dev_mtu = a.dev.port_attr().active_mtu as u8;
    let path = RcPath {
        path_mtu: if req.path_mtu == 0 {
            dev_mtu
        } else {
            req.path_mtu.min(dev_mtu)
        },
        peer: Some(super::active::peer_gid(&a.dev, peer.remote)),
        sgid_index: a.dev.gid_index_of(a.dst).unwrap_or(0) as u8,
        traffic_class: req.primary_path.traffic_class,
        remote_qpn: req.local_qpn,
        remote_psn: req.starting_psn,
        local_psn: random_psn(),
        // The REQ's values, mirrored (as the kernel's CM keeps them), so rdma_init_qp_attr
        // before rdma_accept has them; rdma_accept sets its own.
        responder_resources: i32::from(req.initiator_depth).min(a.dev.attr().max_qp_rd_atom.max(1)) as u8,
        initiator_depth: i32::from(req.responder_resources).min(a.dev.attr().max_qp_init_rd_atom.max(1)) as u8,
        retry_count: req.retry_count,
        rnr_retry: req.rnr_retry_count,
        ack_timeout: ack_timeout.unwrap_or(match req.primary_path.local_ack_timeout {
            0 => DEFAULT_ACK_TIMEOUT,
            t => t,
        }),
    };
    let key = (peer.remote, req.local_comm_id, false);
    let link = Link::new(
        local_id,
        LinkState {
            kind: Kind::Rc(Conn::passive(local_id, tid, req, timing)),
            id: Arc::downgrade(id.inner()),
            local: peer.local,
            remote: peer.remote,
            peer: SocketAddr::new(a.hdr.src, a.hdr.src_port),
            path,
            req: Some(Box::new(*req)),
            remote_key: Some(key),
            guid: a.dev.node_guid(),
            timing,
            qkey: 0,
            scheduled: None,
            abandoned: false,
        },
    );
    let param = ConnParam {
        private_data: a.user.clone(),
        responder_resources: req.initiator_depth,
        initiator_depth: req.responder_resources,
        flow_control: u8::from(req.end_to_end_flow_control),
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        srq: req.srq,
        qp_num: req.local_qpn,
    };
    {
        let mut st = id.lock();
        st.ib = Some(IbHandle { link: link.clone() });
        st.req_param = Some(param.clone());
    }
    agent.insert(&link, Some(key));
    tracing::debug!(from = %peer.remote, dst = %a.dst, port = a.port, "IB CM: connection request");
    id.inner().post(
        EventType::ConnectRequest,
        0,
        param,
        String::new(),
        Some(CmId::from_inner(a.listener.clone())),
    );
}

/// A SIDR_REQ arrived (the agent's round, on the progress thread).
pub(crate) fn on_sidr_req(agent: &Arc<Agent>, peer: GsiPeer, tid: u64, req: &SidrReq) {
    let dup = agent
        .tables()
        .by_remote
        .get(&(peer.remote, req.request_id, true))
        .cloned();
    if let Some(l) = dup {
        let m = CmMad {
            tid,
            msg: CmMessage::SidrReq(*req),
        };
        return l.on_mad(agent, peer, &m);
    }
    let answer = |status: SidrStatus, text: &str| {
        let mut pd = [0u8; SIDR_REP_PRIVATE_LEN];
        let n = text.len().min(SIDR_REP_PRIVATE_LEN);
        pd[..n].copy_from_slice(&text.as_bytes()[..n]);
        let rep = SidrRep {
            request_id: req.request_id,
            status,
            service_id: req.service_id,
            private_data: pd,
            ..SidrRep::default()
        };
        mad_io::send(peer.local, peer.remote, &CmMad { tid, msg: rep.into() });
    };
    let a = match admit(agent, peer, req.service_id, &req.private_data) {
        Ok(a) => a,
        Err(Refusal::NoListener) => return answer(SidrStatus::Unsupported, ""),
        Err(Refusal::Refused(why)) => return answer(SidrStatus::Reject, &why),
        Err(Refusal::Drop) => return,
    };
    let id = match child(&a) {
        Ok(c) => c,
        Err(e) => return answer(SidrStatus::NoQp, &e.msg),
    };
    let timing = listener_timing(&a.listener);
    let local_id = agent.alloc_id();
    let key = (peer.remote, req.request_id, true);
    let link = Link::new(
        local_id,
        LinkState {
            kind: Kind::SidrServer(SidrServer::new(tid, req, timing)),
            id: Arc::downgrade(id.inner()),
            local: peer.local,
            remote: peer.remote,
            peer: SocketAddr::new(a.hdr.src, a.hdr.src_port),
            path: RcPath {
                peer: Some(super::active::peer_gid(&a.dev, peer.remote)),
                sgid_index: a.dev.gid_index_of(a.dst).unwrap_or(0) as u8,
                ..RcPath::default()
            },
            req: None,
            remote_key: Some(key),
            guid: a.dev.node_guid(),
            timing,
            qkey: RDMA_UDP_QKEY,
            scheduled: None,
            abandoned: false,
        },
    );
    let param = ConnParam {
        private_data: a.user.clone(),
        ..ConnParam::default()
    };
    {
        let mut st = id.lock();
        st.ib = Some(IbHandle { link: link.clone() });
        st.req_param = Some(param.clone());
    }
    agent.insert(&link, Some(key));
    id.inner().post_ud(
        EventType::ConnectRequest,
        0,
        param,
        String::new(),
        Some(CmId::from_inner(a.listener.clone())),
        Some(UdParam::default()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn address_matching() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(bound_matches("0.0.0.0".parse().unwrap(), true, lo));
        assert!(bound_matches("127.0.0.1".parse().unwrap(), true, lo));
        assert!(!bound_matches("127.0.0.2".parse().unwrap(), true, lo));
        assert!(bound_matches("::".parse().unwrap(), false, lo));
        assert!(!bound_matches("::".parse().unwrap(), true, lo));
        assert!(bound_matches("::ffff:127.0.0.1".parse().unwrap(), true, lo));
        assert!(!bound_matches("::1".parse().unwrap(), false, lo));
    }

    #[test]
    fn ipv6_address_matching() {
        let lo6: IpAddr = "::1".parse().unwrap();
        assert!(
            bound_matches("::".parse().unwrap(), true, lo6),
            "an AF-only :: takes IPv6"
        );
        assert!(bound_matches("::".parse().unwrap(), false, lo6));
        assert!(bound_matches("::1".parse().unwrap(), true, lo6));
        assert!(!bound_matches("::2".parse().unwrap(), true, lo6));
        assert!(
            !bound_matches("0.0.0.0".parse().unwrap(), false, lo6),
            "IPv4 wildcards take IPv4 only"
        );
        assert!(!bound_matches("127.0.0.1".parse().unwrap(), false, lo6));
    }
}
