//! Address handles (`ibv_create_ah`): where a UD send goes.
//!
//! An [`Ah`] is a checked [`AhAttr`] in a protection domain. Only soft-RoCE devices have them:
//! a RoCEv2 packet is routed by IP, so the attributes must carry a GRH (`is_global`) whose
//! `dgid` is the destination's IP address as a GID and whose `sgid_index` names one of the
//! device's GIDs (the source address). LIDs mean nothing on Ethernet and are ignored.

use crate::device::{gid_to_ip, DeviceInfo, Gid, TransportKind};
use crate::pd::Pd;
use crate::qp::AhAttr;
use crate::wr::UdDest;
use crate::{bail, Result};

/// An address handle (`struct ibv_ah`). Cloning shares nothing mutable: the attributes are
/// fixed at creation.
#[derive(Debug, Clone)]
pub struct Ah {
    pd: Pd,
    attr: AhAttr,
    /// Keeps the PD in use and counts against the device's `max_ah`.
    _use: std::sync::Arc<crate::pd::PdUse>,
}

impl Ah {
    /// Creates an address handle in `pd` (`ibv_create_ah`) after [`Ah::check`]ing `attr`
    /// on the PD's device.
    pub fn create(pd: &Pd, attr: &AhAttr) -> Result<Ah> {
        Ah::check(pd.context().device(), attr, "create_ah")?;
        let pd_use = crate::pd::PdUse::take(pd, crate::quota::ObjKind::Ah, "create_ah")?;
        Ok(Ah {
            pd: pd.clone(),
            attr: *attr,
            _use: std::sync::Arc::new(pd_use),
        })
    }

    /// Checks that `dev` can send with the address vector `attr` (an AH's, or a connected
    /// QP's primary path); `op` starts every message (`create_ah`, `modify_qp 0x12`).
    ///
    /// Errors:
    /// - EOPNOTSUPP on an iWARP device ("iWARP devices have no address handles");
    /// - EINVAL for a port other than 1, for attributes without a GRH (`is_global = 0`,
    ///   which is what the `ibv_*_pingpong` examples send without `-g`), an all-zero `dgid`,
    ///   an `sgid_index` outside the GID table, or a `dgid` whose IP family differs from the
    ///   source GID's (an IPv4-mapped GID cannot reach an IPv6 one).
    pub fn check(dev: &DeviceInfo, attr: &AhAttr, op: &str) -> Result<()> {
        let name = &dev.name;
        if dev.transport == TransportKind::Iwarp {
            bail!(OpNotSupp, "{op} on {name}: iWARP devices have no address handles");
        }
        if attr.port_num != 1 {
            bail!(
                Inval,
                "{op} on {name}: port {} does not exist (the device has port 1)",
                attr.port_num
            );
        }
        if !attr.is_global {
            bail!(
                Inval,
                "{op} on {name}: RoCE address handles need a GRH: set is_global=1 and dgid (run ibv_*_pingpong with -g 0)"
            );
        }
        let dgid = Gid(attr.dgid);
        if dgid.is_zero() {
            bail!(Inval, "{op} on {name}: dgid is all zeros");
        }
        let gids = dev.gids();
        let Some(sgid) = gids.get(usize::from(attr.sgid_index)).copied() else {
            bail!(
                Inval,
                "{op} on {name}: sgid_index {} is outside the GID table ({} entries)",
                attr.sgid_index,
                gids.len()
            );
        };
        let (src, dst) = (gid_to_ip(sgid), gid_to_ip(dgid));
        if src.is_ipv4() != dst.is_ipv4() {
            bail!(
                Inval,
                "{op} on {name}: dgid {dst} and the source GID {src} (sgid_index {}) are of different IP families",
                attr.sgid_index
            );
        }
        Ok(())
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The attributes, as given at creation.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }

    /// The destination of a UD send through this AH (`ibv_send_wr.wr.ud`).
    pub fn ud_dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            ah: self.attr,
            remote_qpn: remote_qpn & 0xff_ffff,
            remote_qkey,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{IfAddr, PortState};
    use crate::{Context, Errno};

    fn device(transport: TransportKind) -> DeviceInfo {
        let addr = |ip: &str, prefix_len| IfAddr {
            ip: ip.parse().unwrap(),
            prefix_len,
            scope_id: 0,
        };
        DeviceInfo {
            name: transport.default_device_name("lo"),
            transport,
            netdev: "lo".into(),
            ifindex: 1,
            loopback: true,
            addrs: vec![addr("127.0.0.1", 8), addr("::1", 128)],
            mtu: 65536,
            mac: [0; 6],
            speed_mbps: None,
            port_state: PortState::Active,
            loopback_reason: None,
            is_loopback_netdev: true,
        }
    }

    fn pd(transport: TransportKind) -> Pd {
        Context::open(&device(transport)).unwrap().alloc_pd().unwrap()
    }

    fn grh(dgid: &str, sgid_index: u8) -> AhAttr {
        AhAttr {
            dgid: Gid::from_ip(dgid.parse().unwrap()).0,
            sgid_index,
            hop_limit: 64,
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        }
    }

    #[test]
    fn roce_ah_with_a_grh() {
        let pd = pd(TransportKind::Roce);
        let ah = Ah::create(&pd, &grh("127.0.0.1", 0)).unwrap();
        assert_eq!(ah.attr().sgid_index, 0);
        assert_eq!(ah.pd().id(), pd.id());
        let dest = ah.clone().ud_dest(0x1234_5678, 0x1111);
        assert_eq!(dest.remote_qpn, 0x34_5678);
        assert_eq!(dest.remote_qkey, 0x1111);
        assert_eq!(dest.ah, *ah.attr());
        Ah::create(&pd, &grh("::1", 1)).unwrap();
    }

    #[test]
    fn roce_ah_without_grh_says_how_to_fix_it() {
        let attr = AhAttr {
            is_global: false,
            dlid: 0,
            port_num: 1,
            ..AhAttr::default()
        };
        let e = Ah::create(&pd(TransportKind::Roce), &attr).unwrap_err();
        assert_eq!(e.errno, Errno::Inval);
        assert!(
            e.msg
                .contains("RoCE address handles need a GRH: set is_global=1 and dgid (run ibv_*_pingpong with -g 0)"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn roce_ah_checks_port_sgid_and_families() {
        let pd = pd(TransportKind::Roce);
        let e = Ah::create(&pd, &grh("127.0.0.1", 2)).unwrap_err();
        assert_eq!(e.errno, Errno::Inval);
        assert!(
            e.msg.contains("sgid_index 2 is outside the GID table (2 entries)"),
            "{}",
            e.msg
        );
        let e = Ah::create(
            &pd,
            &AhAttr {
                port_num: 2,
                ..grh("127.0.0.1", 0)
            },
        )
        .unwrap_err();
        assert!(e.msg.contains("port 2 does not exist"), "{}", e.msg);
        let e = Ah::create(&pd, &grh("::1", 0)).unwrap_err();
        assert!(e.msg.contains("different IP families"), "{}", e.msg);
        let e = Ah::create(
            &pd,
            &AhAttr {
                dgid: [0; 16],
                ..grh("127.0.0.1", 0)
            },
        )
        .unwrap_err();
        assert!(e.msg.contains("dgid is all zeros"), "{}", e.msg);
    }

    #[test]
    fn iwarp_has_no_address_handles() {
        let e = Ah::create(&pd(TransportKind::Iwarp), &grh("127.0.0.1", 0)).unwrap_err();
        assert_eq!(e.errno, Errno::OpNotSupp);
        assert!(e.msg.contains("iWARP devices have no address handles"), "{}", e.msg);
    }
}
