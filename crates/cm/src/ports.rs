//! The rdma_cm port space: which ids may hold a port at once (Linux cma.c `cma_use_port`,
//! `cma_check_port`, and the re-check in `rdma_listen`).
//!
//! The kernel keeps one table per port space and network namespace; a port belongs to the ids
//! bound to it until they are destroyed, whatever their connections' TCP state. softrdma's
//! iWARP ids hold real TCP sockets, which bring TCP's own rules: a closed connection leaves
//! TIME_WAIT on the listener's port for a minute, and with SO_REUSEADDR (which the CM sets, as
//! siw does on its listening sockets, so TIME_WAIT does not block a new listener) TCP lets any
//! number of bound-but-not-listening sockets share a port. The table here restores the
//! rdma_cm rules on top: every bound id of every softrdma process on the host registers a
//! [`PortClaim`], an abstract Unix socket whose name carries the binding (port space, port,
//! address, REUSEADDR, AFONLY, owner). A new binding reads the others from /proc/net/unix and
//! applies [`conflict`]. Abstract names are per network namespace and vanish with their
//! process, as the kernel's table and its ids do.
//!
//! The rules are sans-I/O ([`conflict`], [`Binding`] names); [`PortClaim`] does the I/O.

use crate::state::PortSpace;
use softrdma_verbs::{Errno, Error, Result};
use std::net::{IpAddr, SocketAddr};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::sync::atomic::{AtomicU32, Ordering};

/// The prefix of every claim name (after the `@` /proc/net/unix shows for abstract names).
const PREFIX: &str = "softrdma-cm-port/";

/// One id's hold on a port (what `cma_check_port` compares).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Binding {
    pub ps: PortSpace,
    pub port: u16,
    pub ip: IpAddr,
    /// The IPv6 scope id (link-local addresses); 0 otherwise.
    pub scope: u32,
    pub af_only: bool,
    pub reuse: bool,
}

impl Binding {
    /// The binding of `addr` (its port must be the bound one, not 0).
    pub fn new(ps: PortSpace, addr: SocketAddr, af_only: bool, reuse: bool) -> Binding {
        let scope = match addr {
            SocketAddr::V6(v6) => v6.scope_id(),
            SocketAddr::V4(_) => 0,
        };
        Binding {
            ps,
            port: addr.port(),
            ip: addr.ip(),
            scope,
            af_only,
            reuse,
        }
    }

    fn any_addr(&self) -> bool {
        // `cma_any_addr`: 0.0.0.0 or :: (a v4-mapped 0.0.0.0 is not the IPv6 wildcard).
        self.ip.is_unspecified()
    }

    fn same_addr(&self, o: &Binding) -> bool {
        // `cma_addr_cmp`: the family, the address, and for IPv6 link-local the scope.
        match (self.ip, o.ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => a == b,
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let link_local = (a.segments()[0] & 0xffc0) == 0xfe80;
                a == b && (!link_local || self.scope == o.scope)
            }
            _ => false,
        }
    }

    /// The claim name prefix of every binding of (`ps`, `port`).
    fn port_prefix(ps: PortSpace, port: u16) -> String {
        format!("{PREFIX}{:04x}/{port}/", ps as u32)
    }

    /// `softrdma-cm-port/<ps>/<port>/<r|-><a|->/<ip>%<scope>/<pid>.<n>`.
    fn name(&self, owner: &str) -> String {
        format!(
            "{}{}{}/{}%{}/{owner}",
            Self::port_prefix(self.ps, self.port),
            if self.reuse { 'r' } else { '-' },
            if self.af_only { 'a' } else { '-' },
            self.ip,
            self.scope
        )
    }

    /// Parses a claim name of (`ps`, `port`) (without the `@`); `None` for other names.
    fn parse(ps: PortSpace, port: u16, name: &str) -> Option<(Binding, &str)> {
        let rest = name.strip_prefix(&Self::port_prefix(ps, port))?;
        let mut parts = rest.splitn(3, '/');
        let flags = parts.next()?.as_bytes();
        let (ip, scope) = parts.next()?.split_once('%')?;
        let owner = parts.next()?;
        if flags.len() != 2 {
            return None;
        }
        Some((
            Binding {
                ps,
                port,
                ip: ip.parse().ok()?,
                scope: scope.parse().ok()?,
                reuse: flags[0] == b'r',
                af_only: flags[1] == b'a',
            },
            owner,
        ))
    }
}

/// Whether `new` may join `cur` on their port (`cma_check_port`): `reuse` is the REUSEADDR
/// the check runs with (the new id's own, or false for the check of `rdma_listen`).
/// Both REUSEADDR: fine. Both AFONLY and of different families: fine. Either a wildcard:
/// EADDRNOTAVAIL. The same address: EADDRINUSE.
pub(crate) fn conflict(new: &Binding, cur: &Binding, reuse: bool) -> Option<Errno> {
    if reuse && cur.reuse {
        return None;
    }
    if new.af_only && cur.af_only && new.ip.is_ipv4() != cur.ip.is_ipv4() {
        return None;
    }
    if new.any_addr() || cur.any_addr() {
        return Some(Errno::AddrNotAvail);
    }
    if new.same_addr(cur) {
        return Some(Errno::AddrInUse);
    }
    None
}

/// The claim names in /proc/net/unix (this network namespace), without the `@`.
fn claim_names(ps: PortSpace, port: u16) -> Result<Vec<String>> {
    let want = format!("@{}", Binding::port_prefix(ps, port));
    let table = std::fs::read_to_string("/proc/net/unix")
        .map_err(|e| Error::new(Errno::Io, format!("rdma_bind_addr: /proc/net/unix: {e}")))?;
    Ok(table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|p| p.starts_with(&want))
        .map(|p| p[1..].to_string())
        .collect())
}

/// The first binding among `others` that `me` conflicts with, and the errno.
fn first_conflict(me: &Binding, my_owner: &str, names: &[String], reuse: bool) -> Option<(Errno, Binding)> {
    names.iter().find_map(|n| {
        let (b, owner) = Binding::parse(me.ps, me.port, n)?;
        if owner == my_owner {
            return None;
        }
        conflict(me, &b, reuse).map(|e| (e, b))
    })
}

/// A bound id's entry in the port space; dropping it frees the port for other ids.
#[derive(Debug)]
pub(crate) struct PortClaim {
    binding: Binding,
    owner: String,
    /// A forked child drops its copy (see `softrdma_verbs::fork`): the claim ends with the
    /// parent's id, not with the last process holding the socket.
    _sock: softrdma_verbs::fork::CloseInChild<UnixDatagram>,
}

fn next_owner() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{}.{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn register(b: &Binding, owner: &str) -> Result<UnixDatagram> {
    let name = b.name(owner);
    UnixAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| UnixDatagram::bind_addr(&a))
        .map_err(|e| Error::os(format_args!("rdma_bind_addr: port claim {name}"), &e))
}

fn refusal(op: &str, me: &Binding, errno: Errno, other: &Binding) -> Error {
    let why = match errno {
        Errno::AddrNotAvail => "a wildcard binding and another one on the same port",
        _ => "the address and port are taken",
    };
    Error::new(
        errno,
        format!(
            "{op} {}: {why}: another rdma_cm id holds {} port {}{}",
            SocketAddr::new(me.ip, me.port),
            other.ip,
            other.port,
            if other.reuse { " (REUSEADDR)" } else { "" }
        ),
    )
}

impl PortClaim {
    /// Takes `b` in the port space, or fails as `rdma_bind_addr` would (EADDRINUSE,
    /// EADDRNOTAVAIL). The claim is registered before the others are read, so of two ids
    /// that bind the same port at the same moment at most one succeeds (both may fail).
    pub fn take(b: Binding) -> Result<PortClaim> {
        let owner = next_owner();
        let sock = register(&b, &owner)?;
        let claim = PortClaim {
            binding: b,
            owner,
            _sock: softrdma_verbs::fork::CloseInChild::new(sock),
        };
        let names = claim_names(claim.binding.ps, claim.binding.port)?;
        if let Some((errno, other)) = first_conflict(&claim.binding, &claim.owner, &names, claim.binding.reuse) {
            tracing::debug!(?other, "rdma_bind_addr: port conflict");
            return Err(refusal("rdma_bind_addr", &claim.binding, errno, &other));
        }
        Ok(claim)
    }

    /// The check of `rdma_listen` for an id bound with REUSEADDR: no other id may hold the
    /// address, REUSEADDR or not; the listener then holds it alone (its REUSEADDR is cleared).
    pub fn make_exclusive(&mut self) -> Result<()> {
        if !self.binding.reuse {
            return Ok(());
        }
        let names = claim_names(self.binding.ps, self.binding.port)?;
        if let Some((errno, other)) = first_conflict(&self.binding, &self.owner, &names, false) {
            return Err(refusal("rdma_listen", &self.binding, errno, &other));
        }
        self.set_reuse(false)
    }

    /// Records a changed REUSEADDR (`rdma_set_option` on a bound id).
    pub fn set_reuse(&mut self, reuse: bool) -> Result<()> {
        if self.binding.reuse == reuse {
            return Ok(());
        }
        let mut b = self.binding.clone();
        b.reuse = reuse;
        let owner = next_owner();
        // The new name before the old one goes: the port is never unclaimed in between.
        self._sock = softrdma_verbs::fork::CloseInChild::new(register(&b, &owner)?);
        self.binding = b;
        self.owner = owner;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(addr: &str, af_only: bool, reuse: bool) -> Binding {
        Binding::new(PortSpace::Tcp, addr.parse().unwrap(), af_only, reuse)
    }

    #[test]
    fn the_kernel_rules() {
        let lo = b("127.0.0.1:7000", true, false);
        let lo_r = b("127.0.0.1:7000", true, true);
        let other = b("127.0.0.2:7000", true, false);
        let any = b("0.0.0.0:7000", true, false);
        let any6 = b("[::]:7000", false, false);
        let any6_only = b("[::]:7000", true, false);
        assert_eq!(conflict(&lo, &lo, false), Some(Errno::AddrInUse));
        assert_eq!(conflict(&lo_r, &lo, true), Some(Errno::AddrInUse));
        assert_eq!(conflict(&lo_r, &lo_r, true), None);
        // rdma_listen checks without the listener's REUSEADDR.
        assert_eq!(conflict(&lo_r, &lo_r, false), Some(Errno::AddrInUse));
        assert_eq!(conflict(&lo, &other, false), None);
        assert_eq!(conflict(&lo, &any, false), Some(Errno::AddrNotAvail));
        assert_eq!(conflict(&any, &lo, false), Some(Errno::AddrNotAvail));
        assert_eq!(conflict(&any, &any6, false), Some(Errno::AddrNotAvail));
        assert_eq!(conflict(&any, &any6_only, false), None);
        let ll1: Binding = Binding::new(
            PortSpace::Tcp,
            SocketAddr::V6(std::net::SocketAddrV6::new("fe80::1".parse().unwrap(), 7000, 0, 1)),
            false,
            false,
        );
        let mut ll2 = ll1.clone();
        ll2.scope = 2;
        assert_eq!(conflict(&ll1, &ll1, false), Some(Errno::AddrInUse));
        assert_eq!(conflict(&ll1, &ll2, false), None);
    }

    #[test]
    fn names_round_trip() {
        for (a, af, r) in [
            ("127.0.0.1:1", true, false),
            ("[fe80::1%3]:65535", false, true),
            ("[::ffff:10.0.0.1]:80", true, true),
        ] {
            let mut x = b(a, af, r);
            if let SocketAddr::V6(v6) = a.parse::<SocketAddr>().unwrap() {
                x.scope = v6.scope_id();
            }
            let name = x.name("12.3");
            assert!(name.len() <= 107, "{name}");
            let (y, owner) = Binding::parse(PortSpace::Tcp, x.port, &name).unwrap();
            assert_eq!((y, owner), (x.clone(), "12.3"));
            assert!(Binding::parse(PortSpace::Udp, x.port, &name).is_none());
            assert!(Binding::parse(PortSpace::Tcp, x.port.wrapping_add(1), &name).is_none());
        }
    }

    #[test]
    fn claims_conflict_until_dropped() {
        // A port nobody uses in this test binary (the claims are host-wide names).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let first = PortClaim::take(b(&addr, true, false)).unwrap();
        let e = PortClaim::take(b(&addr, true, false)).unwrap_err();
        assert_eq!(e.errno, Errno::AddrInUse, "{e}");
        let e = PortClaim::take(b(&format!("0.0.0.0:{port}"), true, false)).unwrap_err();
        assert_eq!(e.errno, Errno::AddrNotAvail, "{e}");
        drop(first);
        let mut r1 = PortClaim::take(b(&addr, true, true)).unwrap();
        let r2 = PortClaim::take(b(&addr, true, true)).unwrap();
        assert_eq!(r1.make_exclusive().unwrap_err().errno, Errno::AddrInUse);
        drop(r2);
        r1.make_exclusive().unwrap();
        let e = PortClaim::take(b(&addr, true, true)).unwrap_err();
        assert_eq!(e.errno, Errno::AddrInUse, "{e}");
    }
}
