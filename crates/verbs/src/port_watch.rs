//! The link state behind each port: one thread per process reads the netdev's
//! `/sys/class/net/<netdev>/operstate` for the contexts that watch their port (those whose
//! async events someone asked for), updates the port state that `ibv_query_port` reports, and
//! posts `IBV_EVENT_PORT_ERR` when the link goes down and `IBV_EVENT_PORT_ACTIVE` when it
//! comes back, as the kernel does for rxe and siw.
//!
//! The thread sleeps in `recv` on an rtnetlink socket subscribed to link changes
//! (`RTMGRP_LINK`, open to any user) and reads the links again on each message, so an idle
//! process never wakes for it. Where no such socket can be had, it reads them every
//! [`PERIOD`] instead.

use crate::async_event::{AsyncElement, AsyncEventKind, AsyncEvents};
use crate::device::PortState;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often the links are read when no rtnetlink socket reports their changes.
pub const PERIOD: Duration = Duration::from_millis(100);

/// A port's live state, shared by its context and the watcher.
#[derive(Debug)]
pub struct LivePort {
    state: AtomicU8,
}

fn encode(s: PortState) -> u8 {
    match s {
        PortState::Active => 4,
        PortState::Armed => 3,
        PortState::Init => 2,
        _ => 1,
    }
}

fn decode(v: u8) -> PortState {
    match v {
        4 => PortState::Active,
        3 => PortState::Armed,
        2 => PortState::Init,
        _ => PortState::Down,
    }
}

impl LivePort {
    /// A port starting in `state`.
    pub fn new(state: PortState) -> LivePort {
        LivePort {
            state: AtomicU8::new(encode(state)),
        }
    }

    /// The state now.
    pub fn state(&self) -> PortState {
        decode(self.state.load(Ordering::Relaxed))
    }

    fn set(&self, s: PortState) -> PortState {
        decode(self.state.swap(encode(s), Ordering::Relaxed))
    }
}

struct Watched {
    netdev: String,
    port: Weak<LivePort>,
    events: AsyncEvents,
}

/// The watched ports and the watcher thread of each fork generation (see `fork`).
struct Watcher {
    watched: Mutex<Vec<Watched>>,
    started: std::sync::Once,
}

impl Watcher {
    fn new() -> Watcher {
        Watcher {
            watched: Mutex::new(Vec::new()),
            started: std::sync::Once::new(),
        }
    }
}

static WATCHER: crate::fork::PerProcess<Watcher> = crate::fork::PerProcess::new();

fn watched() -> std::sync::MutexGuard<'static, Vec<Watched>> {
    WATCHER
        .get_or_init(Watcher::new)
        .watched
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The link state of `netdev`: ACTIVE when it is up with carrier (`operstate` "up", or
/// "unknown" for interfaces such as `lo` that do not report one), DOWN otherwise or when it
/// is gone.
pub fn link_state(netdev: &str) -> PortState {
    let base = format!("/sys/class/net/{netdev}");
    let oper = std::fs::read_to_string(format!("{base}/operstate")).unwrap_or_default();
    let up = match oper.trim() {
        "up" => true,
        "unknown" => std::fs::read_to_string(format!("{base}/flags"))
            .ok()
            .and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok())
            .is_some_and(|flags| flags & 1 != 0),
        _ => false,
    };
    if up {
        PortState::Active
    } else {
        PortState::Down
    }
}

/// Starts watching `netdev` for `port`, posting its events to `events`; the watch ends when
/// the port (its context) is dropped.
pub fn watch(netdev: &str, port: &Arc<LivePort>, events: &AsyncEvents) {
    let mut w = watched();
    if w.iter()
        .any(|x| x.port.upgrade().is_some_and(|p| Arc::ptr_eq(&p, port)))
    {
        return;
    }
    let first = w.is_empty();
    w.push(Watched {
        netdev: netdev.to_owned(),
        port: Arc::downgrade(port),
        events: events.clone(),
    });
    drop(w);
    if first {
        start_thread();
    }
    // A change between the port's first reading and its entry in the list came before
    // anyone looked for it: read the link once more now.
    poll_once();
}

fn start_thread() {
    WATCHER.get_or_init(Watcher::new).started.call_once(|| {
        let spawned = std::thread::Builder::new().name("softrdma-ports".into()).spawn(run);
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the port watcher: no PORT_ACTIVE/PORT_ERR events");
        }
    });
}

/// The watcher thread: a round on each link change, or every [`PERIOD`] without rtnetlink.
fn run() {
    match link_changes() {
        Ok(nl) => {
            // Anything that changed before the subscription started.
            poll_once();
            let mut buf = [0u8; 8192];
            loop {
                match nix::sys::socket::recv(nl.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::empty()) {
                    // ENOBUFS: messages were lost, the links are read all the same.
                    Ok(_) | Err(nix::errno::Errno::ENOBUFS) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "port watcher: rtnetlink failed, reading the links every {PERIOD:?}");
                        break;
                    }
                }
                let _round = crate::fork_gate::busy();
                poll_once();
            }
        }
        Err(e) => tracing::debug!(error = %e, "port watcher: no rtnetlink socket, reading the links every {PERIOD:?}"),
    }
    loop {
        std::thread::sleep(PERIOD);
        let _round = crate::fork_gate::busy();
        poll_once();
    }
}

/// An rtnetlink socket that receives a message on every link change (`RTMGRP_LINK`). A forked
/// child does not keep it (its own watcher opens another).
fn link_changes() -> nix::Result<crate::fork::CloseInChild<std::os::fd::OwnedFd>> {
    use nix::sys::socket::{bind, socket, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType};
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, libc::RTMGRP_LINK as u32))?;
    Ok(crate::fork::CloseInChild::new(fd))
}

/// One round: every watched port's link read once (once per netdev), changes reported.
pub fn poll_once() {
    let mut w = watched();
    w.retain(|x| x.port.strong_count() > 0);
    let mut seen: Vec<(String, PortState)> = Vec::new();
    for x in w.iter() {
        let now = match seen.iter().find(|(n, _)| *n == x.netdev) {
            Some(&(_, s)) => s,
            None => {
                let s = link_state(&x.netdev);
                seen.push((x.netdev.clone(), s));
                s
            }
        };
        let Some(port) = x.port.upgrade() else { continue };
        let before = port.set(now);
        if before != now {
            let kind = if now == PortState::Active {
                AsyncEventKind::PortActive
            } else {
                AsyncEventKind::PortErr
            };
            tracing::info!(netdev = %x.netdev, from = %before, to = %now, "port state changed");
            x.events.post(kind, AsyncElement::Port(1));
        }
    }
}
