//! The endpoint's QP1 side: routing CM MADs to the process that owns their service or
//! communication ID, answering for absent listeners, and sending MADs.

use super::endpoint::Endpoint;
use super::forward::{self, Origin};
use crate::gsi::{GsiPeer, MadHandler};
use softrdma_verbs::{Errno, Error, Result};
use softrdma_wire::ibcm::{CmAttr, CmMad, CmMessage, Rej, RejReason, SidrRep, SidrStatus, CM_MSG_REQ, MAD_LEN};
use softrdma_wire::roce::{icrc, icrc_bytes, Bth, Deth, RoceHeaders, RoceOpcode, RocePacket, GSI_QKEY, ICRC_LEN};
use std::net::IpAddr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// The abstract socket name of a claimed service ID.
pub(crate) fn service_socket_name(service_id: u64) -> String {
    format!("softrdma-rxe-svc-{service_id:016x}")
}

/// The prefix of the marker a claim's owner binds next to the claim, naming its home port:
/// `@softrdma-rxe-svc-<sid>-home-<port>`. Forwarders find it in /proc/net/unix and forward
/// REQs by UDP (deep socket buffers) instead of through the claim's Unix datagram queue,
/// which holds only `net.unix.max_dgram_qlen` (10) messages.
fn owner_marker_prefix(service_id: u64) -> String {
    format!("{}-home-", service_socket_name(service_id))
}

/// The home port of the process that claims `service_id`, from /proc/net/unix.
fn find_owner_port(service_id: u64) -> Option<u16> {
    let want = format!("@{}", owner_marker_prefix(service_id));
    let table = std::fs::read_to_string("/proc/net/unix").ok()?;
    table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .find_map(|path| path.strip_prefix(want.as_str())?.parse().ok())
}

/// How long a found owner is trusted without looking again.
const OWNER_CACHE: std::time::Duration = std::time::Duration::from_secs(1);

/// Holds a service ID for this process; dropping it releases the ID.
#[derive(Debug)]
pub struct ServiceClaim {
    pub(crate) service_id: u64,
    pub(crate) endpoint: std::sync::Weak<Endpoint>,
}

impl Drop for ServiceClaim {
    fn drop(&mut self) {
        if let Some(ep) = self.endpoint.upgrade() {
            ep.release_service(self.service_id);
        }
    }
}

/// Where a MAD must go, read from its header and the first bytes of its data.
enum Route {
    Service(u64),
    CommId(u32),
    Drop,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn route(mad: &[u8]) -> Route {
    let attr = u16::from_be_bytes([mad[16], mad[17]]);
    let data = &mad[24..];
    match CmAttr::from_u16(attr) {
        Some(CmAttr::Req) | Some(CmAttr::SidrReq) => {
            Route::Service((u64::from(be32(data, 8)) << 32) | u64::from(be32(data, 12)))
        }
        Some(CmAttr::SidrRep) => Route::CommId(be32(data, 0)),
        Some(CmAttr::Rep | CmAttr::Rtu | CmAttr::Rej | CmAttr::Mra | CmAttr::Dreq | CmAttr::Drep) => {
            Route::CommId(be32(data, 4))
        }
        _ => Route::Drop,
    }
}

static GSI_PSN: AtomicU32 = AtomicU32::new(0);

impl Endpoint {
    /// A datagram for QP1 (ICRC verified).
    pub(crate) fn on_gsi(&self, transport: &[u8], origin: &Origin, raw: &[u8], forwarded: bool) {
        let pkt = match RocePacket::parse(transport) {
            Ok(p) => p,
            Err(_) => {
                self.counters.malformed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let h = &pkt.headers;
        let qkey_ok = h.deth.is_some_and(|d| d.qkey == GSI_QKEY);
        if h.bth.opcode != RoceOpcode::UdSendOnly || !qkey_ok || pkt.payload.len() < MAD_LEN {
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mad = &pkt.payload[..MAD_LEN];
        let (remote, local) = (origin.src.ip().to_canonical(), origin.dst_ip.to_canonical());
        if remote.is_ipv4() != local.is_ipv4() {
            self.counters.unsupported.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let peer = GsiPeer { local, remote };
        match route(mad) {
            Route::Service(sid) => {
                if self.claims_service(sid) {
                    self.hand_to_cm(peer, mad);
                } else if forwarded {
                    self.answer_no_listener(peer, mad);
                } else if let Some(port) = self.owner_port(sid) {
                    if self.forward_to_home(port, raw, origin) {
                        self.counters.forwarded_out.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    match self.forward_to(&service_socket_name(sid), raw, origin) {
                        Ok(()) => {
                            self.counters.forwarded_out.fetch_add(1, Ordering::Relaxed);
                        }
                        // The owner's queue is full: drop it like a full backlog; the CM retries.
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            self.counters.gsi_dropped.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => self.answer_no_listener(peer, mad),
                    }
                }
            }
            Route::CommId(id) => {
                let port = (id & 0xffff) as u16;
                if self.owns_home_port(port) {
                    self.hand_to_cm(peer, mad);
                } else if !forwarded && self.forward_to_home(port, raw, origin) {
                    self.counters.forwarded_out.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.counters.unknown_qpn.fetch_add(1, Ordering::Relaxed);
                }
            }
            Route::Drop => {
                self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn hand_to_cm(&self, peer: GsiPeer, mad: &[u8]) {
        match self.mad_handler() {
            Some(h) => h.on_mad(peer, mad),
            None => {
                self.counters.gsi_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Nobody on this host listens: answer as the kernel CM does.
    fn answer_no_listener(&self, peer: GsiPeer, mad: &[u8]) {
        let Ok(m) = CmMad::parse(mad) else {
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let reply = match m.msg {
            CmMessage::Req(req) => CmMessage::Rej(Rej {
                local_comm_id: 0,
                remote_comm_id: req.local_comm_id,
                message_rejected: CM_MSG_REQ,
                reason: RejReason::InvalidServiceId,
                ..Rej::default()
            }),
            CmMessage::SidrReq(req) => CmMessage::SidrRep(SidrRep {
                request_id: req.request_id,
                status: SidrStatus::Unsupported,
                service_id: req.service_id,
                ..SidrRep::default()
            }),
            _ => return,
        };
        let out = CmMad { tid: m.tid, msg: reply }.emit();
        if let Err(e) = self.send_mad(peer.local, peer.remote, &out) {
            tracing::debug!("soft-RoCE: cannot answer a REQ for an unclaimed service: {e}");
        }
    }

    /// Sends `datagram` (as received) with its origin to the abstract socket `name`.
    fn forward_to(&self, name: &str, datagram: &[u8], origin: &Origin) -> std::io::Result<()> {
        let mut msg = Vec::with_capacity(forward::FORWARD_HDR_LEN + datagram.len());
        forward::encode(origin, &mut msg);
        msg.extend_from_slice(datagram);
        let addr = UnixAddr::from_abstract_name(name.as_bytes())?;
        let s = UnixDatagram::unbound()?;
        s.set_nonblocking(true)?;
        s.send_to_addr(&msg, &addr).map(|_| ())
    }

    /// The home port of another process on this host that claims `sid` (cached for a second).
    fn owner_port(&self, sid: u64) -> Option<u16> {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, port)) = owners.get(&sid) {
            if at.elapsed() < OWNER_CACHE {
                return Some(*port);
            }
        }
        let found = find_owner_port(sid);
        match found {
            Some(port) => {
                owners.insert(sid, (std::time::Instant::now(), port));
            }
            None => {
                owners.remove(&sid);
            }
        }
        found
    }

    /// Sends a MAD from `local` to QP1 at `remote`.
    pub(crate) fn send_mad(&self, local: IpAddr, remote: IpAddr, mad: &[u8; MAD_LEN]) -> Result<()> {
        let (local, remote) = (local.to_canonical(), remote.to_canonical());
        if local.is_ipv4() != remote.is_ipv4() {
            return Err(Error::inval(format!(
                "soft-RoCE: a MAD from {local} to {remote} mixes IPv4 and IPv6"
            )));
        }
        let home = self.first_home()?;
        let mut bth = Bth::new(
            RoceOpcode::UdSendOnly,
            super::qpn::GSI_QPN,
            GSI_PSN.fetch_add(1, Ordering::Relaxed) & 0xff_ffff,
        );
        bth.mig_req = true;
        let mut h = RoceHeaders::new(bth);
        h.deth = Some(Deth {
            qkey: GSI_QKEY,
            src_qp: super::qpn::GSI_QPN,
        });
        let mut buf = Vec::with_capacity(MAD_LEN + 64);
        h.emit(mad, &mut buf);
        if self.direct_local() && self.is_local(remote) {
            // For this host: route it here, by service or communication ID, straight to the
            // owning process, so no other member of the port-4791 group can stall it.
            let port = self.roce_port();
            let ip = super::endpoint::icrc_ip(local, remote);
            buf.extend_from_slice(&icrc_bytes(icrc(&ip, home.port, port, &buf)));
            let origin = Origin {
                src: std::net::SocketAddr::new(local, home.port),
                dst_ip: remote,
                dst_port: port,
                hop_limit: forward::DEFAULT_HOP_LIMIT,
                traffic_class: 0,
            };
            let for_us = match route(mad) {
                Route::Service(sid) => self.claims_service(sid),
                Route::CommId(id) => self.owns_home_port((id & 0xffff) as u16),
                Route::Drop => true,
            };
            if for_us {
                // Our own CM: its handler runs on the progress thread, never inside a caller
                // that may hold the CM's locks.
                self.loop_back(buf, origin);
            } else {
                // Another process: hand it over now (non-blocking sends only), so a process
                // that exits right after, say, its DREQ still delivers it.
                let transport = &buf[..buf.len() - ICRC_LEN];
                self.on_gsi(transport, &origin, &buf, false);
            }
        } else {
            let scope = self.scope_for(local, remote);
            self.transmit(&home, local, remote, scope, &buf);
        }
        Ok(())
    }

    /// See [`crate::gsi::comm_id_port`].
    pub(crate) fn comm_id_port(&self) -> Result<u16> {
        Ok(self.first_home()?.port)
    }

    /// See [`crate::gsi::claim_service`].
    pub(crate) fn claim_service(self: &Arc<Self>, service_id: u64) -> Result<ServiceClaim> {
        let name = service_socket_name(service_id);
        let addr = UnixAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| Error::new(Errno::Inval, format!("rdma_listen: service {service_id:#x}: {e}")))?;
        let sock = UnixDatagram::bind_addr(&addr).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                Error::new(
                    Errno::AddrInUse,
                    format!(
                        "rdma_listen: another process on this host already listens on RoCE service {service_id:#018x}"
                    ),
                )
            } else {
                Error::os(format_args!("rdma_listen: service socket {name}"), &e)
            }
        })?;
        sock.set_nonblocking(true).map_err(|e| Error::os("rdma_listen", &e))?;
        // The marker naming our home port (see `owner_marker_prefix`); without it forwarders
        // fall back to the claim socket itself.
        let home = self.first_home()?;
        let marker =
            UnixAddr::from_abstract_name(format!("{}{}", owner_marker_prefix(service_id), home.port).as_bytes())
                .and_then(|a| UnixDatagram::bind_addr(&a))
                .ok();
        self.add_service(service_id, sock, marker)?;
        Ok(ServiceClaim {
            service_id,
            endpoint: Arc::downgrade(self),
        })
    }

    pub(crate) fn set_mad_handler(&self, h: Arc<dyn MadHandler>) {
        *self.handler.write().unwrap_or_else(|p| p.into_inner()) = Some(h);
    }

    fn mad_handler(&self) -> Option<Arc<dyn MadHandler>> {
        self.handler.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::ibcm::{Dreq, Req, SidrRep};

    #[test]
    fn routes_by_service_or_comm_id() {
        let req = CmMad {
            tid: 1,
            msg: CmMessage::Req(Req {
                local_comm_id: 0x0001_1234,
                service_id: 0x0106_1234_5678_9abc,
                ..Req::default()
            }),
        }
        .emit();
        assert!(matches!(route(&req), Route::Service(0x0106_1234_5678_9abc)));
        let dreq = CmMad {
            tid: 2,
            msg: CmMessage::Dreq(Dreq {
                local_comm_id: 7,
                remote_comm_id: 0x0002_c350,
                ..Dreq::default()
            }),
        }
        .emit();
        assert!(matches!(route(&dreq), Route::CommId(0x0002_c350)));
        let sidr = CmMad {
            tid: 3,
            msg: CmMessage::SidrRep(SidrRep {
                request_id: 0x0003_c351,
                ..SidrRep::default()
            }),
        }
        .emit();
        assert!(matches!(route(&sidr), Route::CommId(0x0003_c351)));
        let mut junk = req;
        junk[16] = 0xee;
        assert!(matches!(route(&junk), Route::Drop));
        assert_eq!(
            service_socket_name(0x106_0000_1234),
            "softrdma-rxe-svc-0000010600001234"
        );
    }
}
