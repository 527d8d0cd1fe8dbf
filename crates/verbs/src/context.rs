//! An opened device.

use crate::async_event::AsyncEvents;
use crate::channel::CompChannel;
use crate::cq::Cq;
use crate::device::DeviceInfo;
use crate::pd::Pd;
use crate::port_watch::LivePort;
use crate::quota::{Charge, Counts, ObjKind};
use crate::Result;
use std::sync::Arc;

#[derive(Debug)]
struct ContextInner {
    device: DeviceInfo,
    events: AsyncEvents,
    /// Port 1's state, followed by the port watcher once the async events are in use.
    port: Arc<LivePort>,
    /// The device's object counts in this process (shared with its other contexts).
    counts: Arc<Counts>,
}

/// An open device context (`ibv_context`). Cloning shares it.
///
/// ```
/// use softrdma_verbs::{device, Context};
///
/// // This host's devices: a soft-iWARP `siw_<if>` and a soft-RoCE `rxe_<if>` per interface.
/// let devices = device::list_devices()?;
/// let lo = devices.iter().find(|d| d.name == "rxe_lo").expect("rxe_lo");
/// let ctx = Context::open(lo)?; // or Context::open_by_name("rxe_lo")
/// assert_eq!(ctx.device().name, "rxe_lo");
/// assert!(ctx.query_device().max_qp > 0);
/// // GID 0 of a RoCE device is its first IP address as an IPv4-mapped IPv6 address.
/// let gid = ctx.query_gid(1, 0)?;
/// println!("{}: GID 0 {gid:?}", lo.name);
/// # Ok::<(), softrdma_verbs::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl Context {
    /// Opens a device.
    pub fn open(device: &DeviceInfo) -> Result<Context> {
        // The counter socket of `softrdma stat` exists from the first open device on, so the
        // process's fds do not change when its first connection comes up.
        crate::stats::ensure_server();
        Ok(Context {
            inner: Arc::new(ContextInner {
                device: device.clone(),
                events: AsyncEvents::new()?,
                port: Arc::new(LivePort::new(device.port_state)),
                counts: crate::quota::counts_for(&device.name),
            }),
        })
    }

    /// Opens the device with this name (ENODEV names the ones that exist).
    pub fn open_by_name(name: &str) -> Result<Context> {
        Context::open(&crate::device::find_device(name)?)
    }

    /// The context's asynchronous events (`ibv_get_async_event`).
    pub fn async_events(&self) -> &AsyncEvents {
        &self.inner.events
    }

    /// The async events' fd (`ibv_context.async_fd`). From now on the port follows its
    /// netdev's link: `query_port` reports it and PORT_ERR / PORT_ACTIVE are posted.
    pub fn async_fd(&self) -> Result<std::os::fd::RawFd> {
        let fd = self.inner.events.fd()?;
        crate::port_watch::watch(&self.inner.device.netdev, &self.inner.port, &self.inner.events);
        Ok(fd)
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &DeviceInfo {
        &self.inner.device
    }

    /// Device attributes (`ibv_query_device`).
    pub fn query_device(&self) -> crate::device::DeviceAttr {
        self.inner.device.attr()
    }

    /// Port attributes (`ibv_query_port`); the device has port 1 only. The state is the
    /// port's live one (see [`Context::async_fd`]), the device's at open time otherwise.
    pub fn query_port(&self, port: u8) -> Result<crate::device::PortAttr> {
        if port != 1 {
            crate::bail!(
                Inval,
                "query_port: {} has port 1 only (asked for {port})",
                self.inner.device.name
            );
        }
        let live = self.inner.port.state();
        if live == self.inner.device.port_state {
            return Ok(self.inner.device.port_attr());
        }
        let mut d = self.inner.device.clone();
        d.port_state = live;
        Ok(d.port_attr())
    }

    /// GID table entry (`ibv_query_gid`). An index inside the table (`gid_tbl_len`) whose
    /// entry is empty (a RoCE netdev without addresses) reads as the all-zero GID; an index
    /// past the table is EINVAL.
    pub fn query_gid(&self, port: u8, index: usize) -> Result<crate::device::Gid> {
        let len = self.query_port(port)?.gid_tbl_len;
        match self.inner.device.gid(index) {
            Some(gid) => Ok(gid),
            None if index < usize::try_from(len).unwrap_or(0) => Ok(crate::device::Gid::default()),
            None => Err(crate::Error::inval(format!(
                "query_gid: {} has no GID at index {index} (gid_tbl_len {len})",
                self.inner.device.name
            ))),
        }
    }

    /// The type of GID table entry `index` (`ibv_query_gid_ex`'s `gid_type`): EINVAL for a
    /// bad port or an index without a GID.
    pub fn query_gid_type(&self, port: u8, index: usize) -> Result<crate::device::GidType> {
        self.query_port(port)?;
        self.inner.device.gid_type(index).ok_or_else(|| {
            crate::Error::inval(format!(
                "query_gid_type: {} has no GID at index {index}",
                self.inner.device.name
            ))
        })
    }

    /// Counts one more object of `kind` against the device's advertised limit (ENOMEM past
    /// it, naming `op`); the object keeps the charge until it is dropped.
    pub fn charge(&self, kind: ObjKind, op: &str) -> Result<Charge> {
        let limit = kind.limit(&self.inner.device.attr());
        Charge::take(&self.inner.counts, kind, limit, op, &self.inner.device.name)
    }

    /// Allocates a protection domain (ENOMEM past the device's `max_pd`).
    pub fn alloc_pd(&self) -> Result<Pd> {
        let charge = self.charge(ObjKind::Pd, "alloc_pd")?;
        Ok(Pd::new(self.clone(), charge))
    }

    /// Creates a completion channel.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        CompChannel::new()
    }

    /// Creates a CQ with room for at least `cqe` entries, optionally tied to a channel
    /// (EINVAL outside `1..=max_cqe`, ENOMEM past the device's `max_cq`).
    pub fn create_cq(&self, cqe: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        let max = self.inner.device.attr().max_cqe.max(1) as u32;
        let charge = match cqe {
            1.. if cqe <= max => Some(self.charge(ObjKind::Cq, "create_cq")?),
            _ => None,
        };
        Cq::new(cqe, max, channel.cloned(), Some(self.inner.events.clone()), charge)
    }
}
