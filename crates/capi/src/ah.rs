//! Address handles and multicast: `ibv_create_ah`, `ibv_destroy_ah`, `ibv_init_ah_from_wc`,
//! `ibv_create_ah_from_wc`, `ibv_attach_mcast`, `ibv_detach_mcast`.
//!
//! An AH is a [`SoftAh`]: the C `struct ibv_ah` first, then the verbs [`Ah`] (checked
//! attributes; only RoCE devices have AHs). Live AHs are registered, so the send path can
//! refuse a WR whose `wr.ud.ah` is NULL, destroyed or not ours instead of reading garbage
//! ([`ud_dest`]).
//!
//! `ibv_init_ah_from_wc` follows rdma-core's algorithm over the 40 bytes in front of a UD
//! receive, which the RoCE engine fills as Linux rxe does: for an IPv4 packet 20 zero bytes
//! then the IPv4 header, for IPv6 the IPv6 header ([`ah_attr_from_grh`]).

use std::ffi::c_int;
use std::mem::offset_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ptr;

use softrdma_verbs::device::{DeviceInfo, Gid, TransportKind};
use softrdma_verbs::qp::AhAttr;
use softrdma_verbs::wr::{wc_flags, UdDest};
use softrdma_verbs::Ah;

use crate::abi::{ibv_ah, ibv_ah_attr, ibv_context, ibv_gid, ibv_grh, ibv_pd, ibv_qp, ibv_wc};
use crate::context::with_context;
use crate::error::{non_null, ret_errno, ret_neg1, ret_ptr, CError, CResult};
use crate::objects::{ah_from_c, ah_to_c, c_object, SoftPd, SoftQp};

/// `struct ibv_ah` plus the verbs AH.
#[repr(C)]
pub(crate) struct SoftAh {
    c: ibv_ah,
    ah: Ah,
}
c_object!(SoftAh, ibv_ah, "ah");

/// The destination of a UD send WR (`wr.ud`) on a QP in the PD with id `pd_id`; the reason
/// (for an EINVAL) if `ah` is NULL, not a live AH of this library, or of another PD.
pub(crate) fn ud_dest(ah: *mut ibv_ah, pd_id: u64, remote_qpn: u32, remote_qkey: u32) -> Result<UdDest, &'static str> {
    if ah.is_null() {
        return Err("wr.ud.ah is NULL");
    }
    let live = SoftAh::live();
    if !live.contains(&(ah as usize)) {
        return Err("wr.ud.ah is not a live address handle of this library");
    }
    // SAFETY: registered AHs are live; destroy_ah unregisters (under this lock) before freeing.
    let soft = unsafe { &*ah.cast::<SoftAh>() };
    if soft.ah.pd().id() != pd_id {
        return Err("the address handle belongs to another protection domain than the QP");
    }
    Ok(soft.ah.ud_dest(remote_qpn, remote_qkey))
}

fn new_ah(pd_ptr: *mut ibv_pd, pd: &SoftPd, attr: &AhAttr) -> CResult<*mut ibv_ah> {
    let ah = Ah::create(&pd.pd, attr).map_err(|e| {
        // The GRH hint ("run ibv_*_pingpong with -g 0") is printed: the examples only say
        // "Failed to create AH".
        let no_grh = !attr.is_global && e.errno == softrdma_verbs::Errno::Inval;
        let e = CError::from(e);
        if no_grh {
            e.loud()
        } else {
            e
        }
    })?;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let c = ibv_ah {
        context: pd.context(),
        pd: pd_ptr,
        handle: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    Ok(SoftAh { c, ah }.into_c())
}

fn create_ah(p: *mut ibv_pd, attr: *mut ibv_ah_attr) -> CResult<*mut ibv_ah> {
    // SAFETY: `p` is a PD of this library (C contract).
    let pd = unsafe { SoftPd::from_c(p)? };
    non_null(attr, "ah_attr")?;
    // SAFETY: non-NULL; the caller's struct ibv_ah_attr.
    let a = ah_from_c(unsafe { &*attr });
    new_ah(p, pd, &a)
}

fn destroy_ah(p: *mut ibv_ah) -> CResult<()> {
    // SAFETY: checked to be a live AH of this library before it is taken back.
    unsafe { SoftAh::from_c(p)? };
    // SAFETY: live (checked above); from_c_owned leaves the live set (under the lock the send
    // path holds while it reads an AH) before the free.
    drop(unsafe { SoftAh::from_c_owned(p) });
    Ok(())
}

/// Bytes of the GRH area in front of a UD receive.
const GRH_LEN: usize = 40;
/// `next_hdr` of a RoCE v2 IPv6 packet: UDP.
const NEXT_HDR_UDP: u8 = 17;
/// `next_hdr` of an IB GRH (RoCE v1 / InfiniBand): BTH follows.
const NEXT_HDR_IB: u8 = 0x1b;

/// The IP version of the headers in a GRH area, as rdma-core's `get_grh_header_version`: 6
/// unless the first nibble is not 6 (then 4 if the IPv4 header says so), and a valid IPv4
/// header (IHL 5, correct checksum) at byte 20 wins over an IPv6 version nibble.
fn grh_version(grh: &[u8; GRH_LEN]) -> CResult<u8> {
    let ip4 = &grh[20..40];
    if grh[0] >> 4 != 6 {
        if ip4[0] >> 4 == 4 {
            return Ok(4);
        }
        return Err(CError::new(
            libc::EPROTONOSUPPORT,
            "the GRH holds neither an IPv4 nor an IPv6 header",
        ));
    }
    if ip4[0] & 0x0f != 5 {
        return Ok(6);
    }
    let mut sum: u32 = 0;
    for (i, pair) in ip4.chunks_exact(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let check = !(sum as u16);
    Ok(if check == u16::from_be_bytes([ip4[10], ip4[11]]) {
        4
    } else {
        6
    })
}

/// The local GID index of `dst` (the packet's destination) on `dev`.
fn local_gid_index(dev: &DeviceInfo, dst: IpAddr) -> CResult<u8> {
    let index = dev.gid_index_of(dst).ok_or_else(|| {
        CError::inval(format!(
            "the packet's destination {dst} is not in the GID table of {}",
            dev.name
        ))
    })?;
    u8::try_from(index).map_err(|_| CError::inval(format!("GID index {index} does not fit sgid_index")))
}

/// `ibv_init_ah_from_wc` on `dev`: the address vector that answers the sender of a UD
/// receive completion (`wc_flags`, `slid`, `sl`) whose GRH area is `grh`.
///
/// As rdma-core: `dlid`/`sl` from the completion; with `IBV_WC_GRH`, `is_global = 1`,
/// `dgid` = the packet's source (IPv4-mapped for IPv4), `sgid_index` = the local GID of its
/// destination, `hop_limit` = its TTL / hop limit, `traffic_class` = its TOS / traffic class,
/// `flow_label` from the first word. A multicast destination is EINVAL (no GID to answer
/// from), as is a completion without a GRH on a RoCE device; an iWARP device has no AHs.
pub(crate) fn ah_attr_from_grh(
    dev: &DeviceInfo,
    port_num: u8,
    wc_flags_value: u32,
    slid: u16,
    sl: u8,
    grh: Option<&[u8; GRH_LEN]>,
) -> CResult<AhAttr> {
    if dev.transport == TransportKind::Iwarp {
        return Err(CError::unsupported(format!(
            "{}: iWARP devices have no address handles",
            dev.name
        )));
    }
    if port_num != 1 {
        return Err(CError::inval(format!(
            "port {port_num} does not exist (the device has port 1)"
        )));
    }
    if wc_flags_value & wc_flags::GRH == 0 {
        return Err(CError::inval(
            "the completion has no GRH (wc_flags lacks IBV_WC_GRH); RoCE address handles need one",
        ));
    }
    let Some(grh) = grh else {
        return Err(CError::inval("grh is NULL but the completion has IBV_WC_GRH"));
    };
    let word0 = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
    let mut a = AhAttr {
        dlid: slid,
        sl,
        port_num,
        is_global: true,
        flow_label: word0 & 0xf_ffff,
        ..AhAttr::default()
    };
    if grh_version(grh)? == 4 {
        let ip4 = &grh[20..40];
        let src = Ipv4Addr::new(ip4[12], ip4[13], ip4[14], ip4[15]);
        let dst = Ipv4Addr::new(ip4[16], ip4[17], ip4[18], ip4[19]);
        if dst.is_multicast() {
            return Err(CError::inval(format!(
                "the packet went to the multicast address {dst}: no local GID to answer from"
            )));
        }
        a.sgid_index = local_gid_index(dev, IpAddr::V4(dst))?;
        a.dgid = Gid::from_ip(IpAddr::V4(src)).0;
        a.hop_limit = ip4[8];
        a.traffic_class = ip4[1];
    } else {
        let mut sgid = [0u8; 16];
        let mut dgid = [0u8; 16];
        sgid.copy_from_slice(&grh[8..24]);
        dgid.copy_from_slice(&grh[24..40]);
        if dgid[0] == 0xff {
            return Err(CError::inval(format!(
                "the packet went to the multicast GID {}: no local GID to answer from",
                Ipv6Addr::from(dgid)
            )));
        }
        match grh[6] {
            NEXT_HDR_UDP => {}
            NEXT_HDR_IB => {
                return Err(CError::inval(format!(
                    "the GRH is an IB GRH (RoCE v1); {} has RoCE v2 GIDs only",
                    dev.name
                )))
            }
            other => {
                return Err(CError::new(
                    libc::EPROTONOSUPPORT,
                    format!("the IPv6 header's next header is {other}, neither UDP nor IB"),
                ))
            }
        }
        a.sgid_index = local_gid_index(dev, IpAddr::V6(Ipv6Addr::from(dgid)))?;
        a.dgid = sgid;
        a.hop_limit = grh[7];
        a.traffic_class = ((word0 >> 20) & 0xff) as u8;
    }
    Ok(a)
}

/// Reads what `ibv_init_ah_from_wc` needs from the C completion and GRH pointers.
///
/// # Safety
/// `wc` points to a readable `struct ibv_wc`; if it has `IBV_WC_GRH`, `grh` is NULL or points
/// to 40 readable bytes.
unsafe fn attr_from_c(dev: &DeviceInfo, port_num: u8, wc: *const ibv_wc, grh: *const ibv_grh) -> CResult<AhAttr> {
    non_null(wc, "wc")?;
    // SAFETY: per the contract.
    let (flags, slid, sl) = unsafe { ((*wc).wc_flags, (*wc).slid, (*wc).sl) };
    let bytes = if flags & wc_flags::GRH != 0 && !grh.is_null() {
        // SAFETY: per the contract, 40 readable bytes (read unaligned: it is a byte buffer).
        Some(unsafe { grh.cast::<[u8; GRH_LEN]>().read_unaligned() })
    } else {
        None
    };
    ah_attr_from_grh(dev, port_num, flags, slid, sl, bytes.as_ref())
}

fn init_ah_from_wc(
    ctx: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> CResult<c_int> {
    non_null(ah_attr, "ah_attr")?;
    let dev = with_context(ctx, |c| Ok(c.verbs().device().clone()))?;
    // SAFETY: the caller's completion and GRH (C contract).
    let a = unsafe { attr_from_c(&dev, port_num, wc, grh)? };
    // SAFETY: non-NULL; the caller's struct ibv_ah_attr.
    unsafe { ah_attr.write(ah_to_c(&a)) };
    Ok(0)
}

fn create_ah_from_wc(p: *mut ibv_pd, wc: *mut ibv_wc, grh: *mut ibv_grh, port_num: u8) -> CResult<*mut ibv_ah> {
    // SAFETY: `p` is a PD of this library (C contract).
    let pd = unsafe { SoftPd::from_c(p)? };
    let dev = pd.pd.context().device().clone();
    // SAFETY: the caller's completion and GRH (C contract).
    let a = unsafe { attr_from_c(&dev, port_num, wc, grh)? };
    new_ah(p, pd, &a)
}

fn mcast(qp: *mut ibv_qp, gid: *const ibv_gid, attach: bool) -> CResult<()> {
    // SAFETY: `qp` is a QP of this library (C contract).
    let qp = unsafe { SoftQp::from_c(qp)? };
    non_null(gid, "gid")?;
    // SAFETY: non-NULL; every bit pattern is a valid `raw` view of the caller's GID union.
    let raw = unsafe { ptr::addr_of!((*gid).raw).read_unaligned() };
    if !Gid(raw).is_multicast() {
        return Err(CError::inval(format!("{} is not a multicast GID", Ipv6Addr::from(raw))));
    }
    if attach {
        qp.qp.attach_mcast(raw)?;
    } else {
        qp.qp.detach_mcast(raw)?;
    }
    Ok(())
}

c_fn! {
    /// `struct ibv_ah *ibv_create_ah(struct ibv_pd *, struct ibv_ah_attr *)`: NULL and errno
    /// EINVAL for attributes a RoCE device cannot route (no GRH, bad `sgid_index` or port),
    /// EOPNOTSUPP on an iWARP device.
    fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
        ret_ptr(create_ah(pd, attr))
    }

    /// `int ibv_destroy_ah(struct ibv_ah *)`: 0 or errno.
    fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
        ret_errno(destroy_ah(ah))
    }

    /// `int ibv_init_ah_from_wc(struct ibv_context *, uint8_t port_num, struct ibv_wc *,
    /// struct ibv_grh *, struct ibv_ah_attr *)`: 0, or -1 and errno.
    fn ibv_init_ah_from_wc(
        context: *mut ibv_context,
        port_num: u8,
        wc: *mut ibv_wc,
        grh: *mut ibv_grh,
        ah_attr: *mut ibv_ah_attr,
    ) -> c_int {
        ret_neg1(init_ah_from_wc(context, port_num, wc, grh, ah_attr))
    }

    /// `struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *, struct ibv_wc *,
    /// struct ibv_grh *, uint8_t port_num)`: an AH back to the sender of a UD receive.
    fn ibv_create_ah_from_wc(pd: *mut ibv_pd, wc: *mut ibv_wc, grh: *mut ibv_grh, port_num: u8) -> *mut ibv_ah {
        ret_ptr(create_ah_from_wc(pd, wc, grh, port_num))
    }

    /// `int ibv_attach_mcast(struct ibv_qp *, const union ibv_gid *, uint16_t lid)`: 0 or
    /// errno. The LID is ignored (RoCE); the GID must be multicast and the QP UD.
    fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
        ret_errno(mcast(qp, gid, true))
    }

    /// `int ibv_detach_mcast(struct ibv_qp *, const union ibv_gid *, uint16_t lid)`: 0 or
    /// errno.
    fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
        ret_errno(mcast(qp, gid, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_verbs::device::{IfAddr, PortState};

    fn rxe_lo() -> DeviceInfo {
        let addr = |ip: &str, prefix_len| IfAddr {
            ip: ip.parse().unwrap(),
            prefix_len,
            scope_id: 0,
        };
        DeviceInfo {
            name: "rxe_lo".into(),
            transport: TransportKind::Roce,
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

    /// The GRH area of an IPv4 packet: 20 zero bytes, then the IPv4 header.
    fn grh_v4(src: [u8; 4], dst: [u8; 4], ttl: u8, tos: u8) -> [u8; 40] {
        let mut g = [0u8; 40];
        let h = &mut g[20..40];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&60u16.to_be_bytes());
        h[8] = ttl;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let mut sum: u32 = h
            .chunks_exact(2)
            .map(|p| u32::from(u16::from_be_bytes([p[0], p[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        g
    }

    fn grh_v6(src: &str, dst: &str, hop: u8, tclass: u8, flow: u32, next_hdr: u8) -> [u8; 40] {
        let mut g = [0u8; 40];
        let word0 = (6u32 << 28) | (u32::from(tclass) << 20) | flow;
        g[0..4].copy_from_slice(&word0.to_be_bytes());
        g[6] = next_hdr;
        g[7] = hop;
        g[8..24].copy_from_slice(&src.parse::<Ipv6Addr>().unwrap().octets());
        g[24..40].copy_from_slice(&dst.parse::<Ipv6Addr>().unwrap().octets());
        g
    }

    #[test]
    fn ipv4_grh_answers_the_sender() {
        let g = grh_v4([127, 0, 0, 9], [127, 0, 0, 1], 64, 0x10);
        assert_eq!(grh_version(&g).unwrap(), 4);
        let a = ah_attr_from_grh(&rxe_lo(), 1, wc_flags::GRH, 0, 0, Some(&g)).unwrap();
        assert!(a.is_global);
        assert_eq!(a.dgid, Gid::from_ip("127.0.0.9".parse().unwrap()).0);
        assert_eq!(a.sgid_index, 0);
        assert_eq!(a.hop_limit, 64);
        assert_eq!(a.traffic_class, 0x10);
        assert_eq!(a.flow_label, 0);
        assert_eq!(a.port_num, 1);
        // The AH it describes is valid on the device.
        let ctx = softrdma_verbs::Context::open(&rxe_lo()).unwrap();
        Ah::create(&ctx.alloc_pd().unwrap(), &a).unwrap();
    }

    #[test]
    fn ipv6_grh_answers_the_sender() {
        let g = grh_v6("::1", "::1", 255, 0x20, 0x12345, NEXT_HDR_UDP);
        assert_eq!(grh_version(&g).unwrap(), 6);
        let a = ah_attr_from_grh(&rxe_lo(), 1, wc_flags::GRH, 0, 0, Some(&g)).unwrap();
        assert_eq!(a.dgid, Gid::from_ip("::1".parse().unwrap()).0);
        assert_eq!(a.sgid_index, 1);
        assert_eq!((a.hop_limit, a.traffic_class, a.flow_label), (255, 0x20, 0x12345));
        let ib = grh_v6("::1", "::1", 255, 0, 0, NEXT_HDR_IB);
        assert_eq!(
            ah_attr_from_grh(&rxe_lo(), 1, wc_flags::GRH, 0, 0, Some(&ib))
                .unwrap_err()
                .errno(),
            libc::EINVAL
        );
        let tcp = grh_v6("::1", "::1", 255, 0, 0, 6);
        assert_eq!(
            ah_attr_from_grh(&rxe_lo(), 1, wc_flags::GRH, 0, 0, Some(&tcp))
                .unwrap_err()
                .errno(),
            libc::EPROTONOSUPPORT
        );
    }

    #[test]
    fn bad_completions_are_refused() {
        let dev = rxe_lo();
        let g = grh_v4([127, 0, 0, 9], [127, 0, 0, 1], 64, 0);
        let e = ah_attr_from_grh(&dev, 1, 0, 0, 0, Some(&g)).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "no IBV_WC_GRH on a RoCE device");
        assert_eq!(
            ah_attr_from_grh(&dev, 2, wc_flags::GRH, 0, 0, Some(&g))
                .unwrap_err()
                .errno(),
            libc::EINVAL
        );
        let mcast = grh_v4([127, 0, 0, 9], [239, 1, 1, 1], 64, 0);
        assert_eq!(
            ah_attr_from_grh(&dev, 1, wc_flags::GRH, 0, 0, Some(&mcast))
                .unwrap_err()
                .errno(),
            libc::EINVAL
        );
        let elsewhere = grh_v4([127, 0, 0, 9], [192, 0, 2, 1], 64, 0);
        assert_eq!(
            ah_attr_from_grh(&dev, 1, wc_flags::GRH, 0, 0, Some(&elsewhere))
                .unwrap_err()
                .errno(),
            libc::EINVAL
        );
        let garbage = [0u8; 40];
        assert_eq!(
            ah_attr_from_grh(&dev, 1, wc_flags::GRH, 0, 0, Some(&garbage))
                .unwrap_err()
                .errno(),
            libc::EPROTONOSUPPORT
        );
        let mut siw = rxe_lo();
        siw.transport = TransportKind::Iwarp;
        assert_eq!(
            ah_attr_from_grh(&siw, 1, wc_flags::GRH, 0, 0, Some(&g))
                .unwrap_err()
                .errno(),
            libc::EOPNOTSUPP
        );
    }

    #[test]
    fn an_ipv4_header_behind_a_version_6_nibble_wins_only_with_a_good_checksum() {
        let mut g = grh_v4([127, 0, 0, 9], [127, 0, 0, 1], 64, 0);
        g[0] = 0x60;
        assert_eq!(grh_version(&g).unwrap(), 4);
        g[20 + 10] ^= 1;
        assert_eq!(grh_version(&g).unwrap(), 6);
    }

    #[test]
    fn ud_dest_needs_a_live_ah() {
        assert_eq!(ud_dest(ptr::null_mut(), 1, 2, 3).unwrap_err(), "wr.ud.ah is NULL");
        let mut bogus = [0u64; 8];
        let e = ud_dest(bogus.as_mut_ptr().cast(), 1, 2, 3).unwrap_err();
        assert!(e.contains("not a live address handle"), "{e}");
        assert_eq!(destroy_ah(bogus.as_mut_ptr().cast()).unwrap_err().errno(), libc::EINVAL);
    }

    /// Opens `rxe_lo` (None on a host whose device list has none).
    fn open_rxe_lo() -> Option<*mut ibv_context> {
        let dev = crate::device::current_devices()
            .unwrap()
            .into_iter()
            .find(|d| d.info().name == "rxe_lo")?;
        // SAFETY: a device of this library.
        let ctx = unsafe { crate::context::ibv_open_device(dev.as_ptr()) };
        assert!(!ctx.is_null());
        Some(ctx)
    }

    #[test]
    fn address_handles_and_ud_sends_through_the_c_api() {
        let Some(ctx) = open_rxe_lo() else {
            return;
        };
        // SAFETY: every pointer below is either from this library or a valid local.
        unsafe {
            let pd = crate::objects::ibv_alloc_pd(ctx);
            assert!(!pd.is_null());
            let mut attr = ibv_ah_attr::zeroed();
            attr.port_num = 1;
            assert!(ibv_create_ah(pd, &mut attr).is_null(), "no GRH");
            assert_eq!(*libc::__errno_location(), libc::EINVAL);
            attr.is_global = 1;
            attr.grh.dgid = ibv_gid {
                raw: Gid::from_ip("127.0.0.1".parse().unwrap()).0,
            };
            attr.grh.hop_limit = 0xff;
            let ah = ibv_create_ah(pd, &mut attr);
            assert!(!ah.is_null());
            assert_eq!((*ah).pd, pd);
            assert_eq!((*ah).context, ctx);
            let soft = SoftPd::from_c(pd).unwrap();
            let dest = ud_dest(ah, soft.pd.id(), 0x12, 0x11111111).unwrap();
            assert_eq!((dest.remote_qpn, dest.remote_qkey), (0x12, 0x11111111));
            assert!(dest.ah.is_global);
            assert!(ud_dest(ah, soft.pd.id() + 1_000_000, 0, 0).is_err(), "another PD");

            // A UD QP: a send WR without a live AH fails at once, naming that WR.
            let cq = crate::objects::create_cq(ctx, 16, ptr::null_mut(), ptr::null_mut()).unwrap();
            let mut init = crate::abi::ibv_qp_init_attr::zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.cap.max_send_wr = 4;
            init.cap.max_recv_wr = 4;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            init.qp_type = 4; // IBV_QPT_UD
            let qp = crate::objects::ibv_create_qp(pd, &mut init);
            assert!(!qp.is_null(), "UD QPs are accepted on RoCE devices");
            let mut wr = crate::abi::ibv_send_wr::zeroed();
            wr.opcode = IBV_WR_SEND;
            wr.wr.ud = crate::abi::ibv_send_wr_ud {
                ah: ptr::null_mut(),
                remote_qpn: 1,
                remote_qkey: 1,
            };
            let mut bad: *mut crate::abi::ibv_send_wr = ptr::null_mut();
            assert_eq!(crate::datapath::ibv_post_send(qp, &mut wr, &mut bad), libc::EINVAL);
            assert_eq!(bad, ptr::addr_of_mut!(wr));

            // Multicast needs a multicast GID.
            let unicast = ibv_gid {
                raw: Gid::from_ip("127.0.0.1".parse().unwrap()).0,
            };
            assert_eq!(ibv_attach_mcast(qp, &unicast, 0), libc::EINVAL);

            assert_eq!(ibv_destroy_ah(ah), 0);
            assert_eq!(ibv_destroy_ah(ah), libc::EINVAL, "double destroy is detected");
            assert!(ud_dest(ah, soft.pd.id(), 0, 0).is_err());
            assert_eq!(crate::objects::ibv_destroy_qp(qp), 0);
            crate::objects::destroy_cq(cq).unwrap();
            assert_eq!(crate::objects::ibv_dealloc_pd(pd), 0);
            assert_eq!(crate::context::ibv_close_device(ctx), 0);
        }
    }

    /// `IBV_WR_SEND`.
    const IBV_WR_SEND: u32 = 2;
}
