//! Socket options (`rsetsockopt` / `rgetsockopt`) and the sizes they set.

use crate::error::{Result, RsError};

/// `SOL_RDMA` (rsocket.h).
pub const SOL_RDMA: i32 = 0x10000;
/// `RDMA_SQSIZE`.
pub const RDMA_SQSIZE: i32 = 0;
/// `RDMA_RQSIZE`.
pub const RDMA_RQSIZE: i32 = 1;
/// `RDMA_INLINE`.
pub const RDMA_INLINE: i32 = 2;
/// `RDMA_IOMAPSIZE`.
pub const RDMA_IOMAPSIZE: i32 = 3;
/// `RDMA_ROUTE`.
pub const RDMA_ROUTE: i32 = 4;

/// Largest queue (`RS_QP_MAX_SIZE`).
const QP_MAX: u32 = 0xFFFE;

/// Buffer and queue sizes of a socket, fixed when it connects (rdma-core's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Send buffer bytes.
    pub sbuf_size: u32,
    /// Receive buffer bytes.
    pub rbuf_size: u32,
    /// Send queue.
    pub sq_size: u16,
    /// Receive queue.
    pub rq_size: u16,
    /// Inline data.
    pub sq_inline: u32,
    /// Target iomap entries (`RDMA_IOMAPSIZE`).
    pub iomap_size: u16,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes {
            sbuf_size: 1 << 17,
            rbuf_size: 1 << 17,
            sq_size: 384,
            rq_size: 384,
            sq_inline: 64,
            iomap_size: 0,
        }
    }
}

/// Every option a socket keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// Sizes.
    pub sizes: Sizes,
    /// SO_REUSEADDR.
    pub reuseaddr: bool,
    /// SO_KEEPALIVE.
    pub keepalive: bool,
    /// TCP_KEEPIDLE seconds.
    pub keepidle: i32,
    /// TCP_NODELAY (always in effect; remembered).
    pub nodelay: bool,
    /// SO_OOBINLINE (remembered).
    pub oobinline: bool,
    /// SO_LINGER (onoff, seconds).
    pub linger: (i32, i32),
    /// IPV6_V6ONLY.
    pub v6only: bool,
}

fn int(val: &[u8], what: &str) -> Result<i32> {
    if val.len() < 4 {
        return Err(RsError::new(
            libc::EINVAL,
            format!("rsetsockopt {what}: optlen {} is shorter than an int", val.len()),
        ));
    }
    Ok(i32::from_ne_bytes([val[0], val[1], val[2], val[3]]))
}

impl Options {
    /// Applies `rsetsockopt(level, name, val)`; `connected` sockets keep their sizes.
    /// Returns the SO_REUSEADDR / IPV6_V6ONLY value when the CM id must hear it.
    pub fn set(&mut self, level: i32, name: i32, val: &[u8], connected: bool) -> Result<()> {
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => self.reuseaddr = int(val, "SO_REUSEADDR")? != 0,
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => self.keepalive = int(val, "SO_KEEPALIVE")? != 0,
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => self.oobinline = int(val, "SO_OOBINLINE")? != 0,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                let v = int(val, "SO_SNDBUF")?.max(0) as u32;
                if !connected {
                    self.sizes.sbuf_size = v.saturating_mul(2).clamp(crate::flow::SNDLOWAT << 1, 1 << 30);
                }
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
                let v = int(val, "SO_RCVBUF")?.max(0) as u32;
                if !connected {
                    // two halves of a whole number of 4-byte words, at least 2 KiB
                    self.sizes.rbuf_size = (v.saturating_mul(2).clamp(2048, 1 << 30)) & !7;
                }
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if val.len() < std::mem::size_of::<libc::linger>() {
                    return Err(RsError::new(libc::EINVAL, "rsetsockopt SO_LINGER: optlen too short"));
                }
                self.linger = (int(&val[0..4], "SO_LINGER")?, int(&val[4..8], "SO_LINGER")?);
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => self.nodelay = int(val, "TCP_NODELAY")? != 0,
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => {
                int(val, "TCP_MAXSEG")?;
            }
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                let v = int(val, "TCP_KEEPIDLE")?;
                if v <= 0 {
                    return Err(RsError::new(libc::EINVAL, "rsetsockopt TCP_KEEPIDLE: must be positive"));
                }
                self.keepidle = v;
            }
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => self.v6only = int(val, "IPV6_V6ONLY")? != 0,
            (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE) if connected => {
                return Err(RsError::new(
                    libc::EINVAL,
                    "rsetsockopt SOL_RDMA: queue and buffer sizes must be set before the socket connects",
                ));
            }
            (SOL_RDMA, RDMA_SQSIZE) => self.sizes.sq_size = (int(val, "RDMA_SQSIZE")?.max(0) as u32).min(QP_MAX) as u16,
            (SOL_RDMA, RDMA_RQSIZE) => self.sizes.rq_size = (int(val, "RDMA_RQSIZE")?.max(0) as u32).min(QP_MAX) as u16,
            (SOL_RDMA, RDMA_INLINE) => self.sizes.sq_inline = (int(val, "RDMA_INLINE")?.max(0) as u32).min(QP_MAX),
            (SOL_RDMA, RDMA_IOMAPSIZE) => {
                let v = (int(val, "RDMA_IOMAPSIZE")?.max(0) as u32).min(QP_MAX);
                self.sizes.iomap_size = crate::wire::scale_to_value(crate::wire::value_to_scale(v)) as u16;
            }
            (SOL_RDMA, RDMA_ROUTE) => {
                return Err(RsError::new(
                    libc::EOPNOTSUPP,
                    "rsetsockopt RDMA_ROUTE: path records are InfiniBand; softrdma resolves routes itself (EOPNOTSUPP)",
                ))
            }
            _ => {
                return Err(RsError::new(
                    libc::ENOPROTOOPT,
                    format!("rsetsockopt: level {level} option {name} is not an rsocket option (ENOPROTOOPT)"),
                ))
            }
        }
        Ok(())
    }

    /// The value of `rgetsockopt(level, name)` (SO_ERROR is the socket's business).
    pub fn get(&self, level: i32, name: i32) -> Result<Vec<u8>> {
        let i = |v: i32| Ok(v.to_ne_bytes().to_vec());
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => i(self.reuseaddr as i32),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => i(self.keepalive as i32),
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => i(self.oobinline as i32),
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => i((self.sizes.sbuf_size >> 1) as i32),
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => i((self.sizes.rbuf_size >> 1) as i32),
            (libc::SOL_SOCKET, libc::SO_TYPE) => i(libc::SOCK_STREAM),
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                let mut v = self.linger.0.to_ne_bytes().to_vec();
                v.extend_from_slice(&self.linger.1.to_ne_bytes());
                Ok(v)
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => i(self.nodelay as i32),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => i(2048),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => i(self.keepidle),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => i(self.v6only as i32),
            (SOL_RDMA, RDMA_SQSIZE) => i(i32::from(self.sizes.sq_size)),
            (SOL_RDMA, RDMA_RQSIZE) => i(i32::from(self.sizes.rq_size)),
            (SOL_RDMA, RDMA_INLINE) => i(self.sizes.sq_inline as i32),
            (SOL_RDMA, RDMA_IOMAPSIZE) => i(i32::from(self.sizes.iomap_size)),
            _ => Err(RsError::new(
                libc::ENOPROTOOPT,
                format!("rgetsockopt: level {level} option {name} is not an rsocket option (ENOPROTOOPT)"),
            )),
        }
    }
}
