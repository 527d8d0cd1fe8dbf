//! `rdma_join_multicast` / `rdma_leave_multicast` on RoCE ids, as the kernel's
//! `cma_iboe_join_multicast` does for RoCE v2 (there is no SA): the MGID is the IPv4-mapped
//! group address, the join completes at once with MULTICAST_JOIN, whose UD parameters carry
//! the group's address vector, QPN 0xFFFFFF and Q_Key RDMA_UDP_QKEY. The id's QP, if it has
//! one, is attached to the group (librdmacm attaches it when the event is taken), unless the
//! join is send-only; leaving detaches it.

use super::qp_setup::{ah_attr, RDMA_UDP_QKEY};
use crate::addr;
use crate::event::EventType;
use crate::id::CmId;
use crate::param::{ConnParam, UdParam};
use crate::state::CmState;
use softrdma_verbs::device::TransportKind;
use softrdma_verbs::{bail, Errno, Error, Qp, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The destination QPN of multicast sends (`param.ud.qp_num` of MULTICAST_JOIN).
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// One group an id joined.
#[derive(Debug)]
pub(crate) struct Joined {
    group: Ipv4Addr,
    /// The QP attached to the group (None: send-only, or no QP at join time).
    attached: Option<Qp>,
}

impl Joined {
    fn gid(&self) -> [u8; 16] {
        self.group.to_ipv6_mapped().octets()
    }

    /// Detaches the QP; errors are ignored, as librdmacm ignores `ibv_detach_mcast`'s (the QP
    /// may be gone already, which detached it).
    pub(crate) fn leave(self) {
        let gid = self.gid();
        if let Some(qp) = self.attached {
            let _ = qp.detach_mcast(gid);
        }
    }
}

/// The IPv4 group of a join address (IPv4 or IPv4-mapped, 224.0.0.0/4).
fn group_of(op: &str, a: SocketAddr) -> Result<Ipv4Addr> {
    match addr::canonical(a.ip()) {
        IpAddr::V4(g) if g.is_multicast() => Ok(g),
        IpAddr::V4(g) if g.is_unspecified() => bail!(
            Inval,
            "{op} {g}: RoCE has no SA to assign a group; name an IPv4 multicast address"
        ),
        IpAddr::V4(g) => bail!(Inval, "{op} {g}: not an IPv4 multicast address (224.0.0.0/4)"),
        IpAddr::V6(g) => Err(Error::new(
            Errno::OpNotSupp,
            format!("{op} {g}: IPv6 multicast over soft-RoCE is not supported (IPv4 groups are)"),
        )),
    }
}

impl CmId {
    /// Joins the IPv4 multicast group `group` (`rdma_join_multicast[_ex]`) on a bound or
    /// resolved UD id of a RoCE device: MULTICAST_JOIN follows at once, its [`CmEvent::ud`]
    /// holding the group's address vector (GRH to `::ffff:<group>`, hop limit 64), QPN
    /// 0xFFFFFF and Q_Key RDMA_UDP_QKEY. The id's QP joins the group too unless `send_only`.
    /// iWARP ids: EOPNOTSUPP.
    ///
    /// [`CmEvent::ud`]: crate::CmEvent::ud
    pub fn join_multicast(&self, group: SocketAddr, send_only: bool) -> Result<()> {
        const OP: &str = "rdma_join_multicast";
        let g = group_of(OP, group)?;
        let ud = {
            let mut st = self.lock();
            let Some(dev) = st.device.clone() else {
                bail!(
                    Inval,
                    "{OP} {g}: the id has no device (bind it to a local address or resolve one first)"
                );
            };
            if dev.transport != TransportKind::Roce {
                bail!(
                    OpNotSupp,
                    "{OP} {g}: {} is an iWARP device, and iWARP has no multicast (use a RoCE device: SOFTRDMA_TRANSPORTS=roce)",
                    dev.name
                );
            }
            if !matches!(st.state, CmState::AddrBound | CmState::AddrResolved) {
                bail!(
                    Inval,
                    "{OP} {g}: the id is in {}; join after binding or resolving an address",
                    st.state
                );
            }
            if !super::is_ud(self.port_space(), st.qp.as_ref()) {
                bail!(
                    Inval,
                    "{OP} {g}: multicast needs a UD id (RDMA_PS_UDP), this one is {:?}",
                    self.port_space()
                );
            }
            if st.mcast.iter().any(|j| j.group == g) {
                bail!(AddrInUse, "{OP} {g}: the id already joined this group");
            }
            let src = st
                .local
                .map(|a| addr::canonical(a.ip()))
                .filter(|ip| !addr::is_wildcard(*ip));
            let sgid_index = src.and_then(|ip| dev.gid_index_of(ip)).unwrap_or(0) as u8;
            let tos = st.opts.tos.unwrap_or(0);
            let ud = UdParam {
                qp_num: MULTICAST_QPN,
                qkey: RDMA_UDP_QKEY,
                ah_attr: ah_attr(IpAddr::V4(g), sgid_index, tos),
            };
            let mut joined = Joined {
                group: g,
                attached: None,
            };
            match st.qp.clone() {
                Some(qp) if !send_only => match qp.attach_mcast(joined.gid()) {
                    Ok(()) => joined.attached = Some(qp),
                    Err(e) => {
                        // librdmacm turns a failed attach into MULTICAST_ERROR (its param.ud
                        // still names the group).
                        drop(st);
                        let why = format!("{OP} {g}: attaching QP {}: {e}", qp.qpn());
                        tracing::warn!("{why}");
                        let ud = UdParam {
                            qp_num: 0,
                            qkey: 0,
                            ..ud
                        };
                        self.inner().post_ud(
                            EventType::MulticastError,
                            -e.errno.raw(),
                            ConnParam::default(),
                            why,
                            None,
                            Some(ud),
                        );
                        return self.wait_sync(&[EventType::MulticastJoin]);
                    }
                },
                _ => {}
            }
            st.mcast.push(joined);
            ud
        };
        tracing::debug!(group = %g, send_only, "multicast join");
        self.inner().post_ud(
            EventType::MulticastJoin,
            0,
            ConnParam::default(),
            String::new(),
            None,
            Some(ud),
        );
        self.wait_sync(&[EventType::MulticastJoin])
    }

    /// Leaves a group joined with [`CmId::join_multicast`] (`rdma_leave_multicast`),
    /// detaching the QP; EADDRNOTAVAIL for a group the id did not join.
    pub fn leave_multicast(&self, group: SocketAddr) -> Result<()> {
        const OP: &str = "rdma_leave_multicast";
        let g = group_of(OP, group)?;
        let joined = {
            let mut st = self.lock();
            let Some(i) = st.mcast.iter().position(|j| j.group == g) else {
                bail!(AddrNotAvail, "{OP} {g}: the id did not join this group");
            };
            st.mcast.remove(i)
        };
        joined.leave();
        Ok(())
    }

    /// The groups the id joined.
    pub fn multicast_groups(&self) -> Vec<Ipv4Addr> {
        self.lock().mcast.iter().map(|j| j.group).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_addresses() {
        let sa = |s: &str| -> SocketAddr { s.parse().unwrap() };
        assert_eq!(group_of("j", sa("239.1.2.3:0")).unwrap(), Ipv4Addr::new(239, 1, 2, 3));
        assert_eq!(
            group_of("j", sa("[::ffff:224.0.0.9]:0")).unwrap(),
            Ipv4Addr::new(224, 0, 0, 9)
        );
        assert_eq!(group_of("j", sa("10.0.0.1:0")).unwrap_err().errno, Errno::Inval);
        assert_eq!(group_of("j", sa("0.0.0.0:0")).unwrap_err().errno, Errno::Inval);
        assert_eq!(group_of("j", sa("[ff02::1]:0")).unwrap_err().errno, Errno::OpNotSupp);
        let a = ah_attr(IpAddr::V4(Ipv4Addr::new(239, 1, 1, 1)), 2, 0);
        assert!(a.is_global);
        assert_eq!(&a.dgid[10..], &[0xff, 0xff, 239, 1, 1, 1]);
        assert_eq!((a.sgid_index, a.hop_limit), (2, 64));
    }
}
