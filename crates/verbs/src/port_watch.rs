//! The link state behind each port: one thread per process reads the netdev's
//! `/sys/class/net/<netdev>/operstate` every [`PERIOD`] for the contexts that watch their
//! port (those whose async events someone asked for), updates the port state that
//! `ibv_query_port` reports, and posts `IBV_EVENT_PORT_ERR` when the link goes down and
//! `IBV_EVENT_PORT_ACTIVE` when it comes back, as the kernel does for rxe and siw.

use crate::async_event::{AsyncElement, AsyncEventKind, AsyncEvents};
use crate::device::PortState;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often the links are read.
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
}

fn start_thread() {
    WATCHER.get_or_init(Watcher::new).started.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("softrdma-ports".into())
            .spawn(|| loop {
                std::thread::sleep(PERIOD);
                let _round = crate::fork_gate::busy();
                poll_once();
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the port watcher: no PORT_ACTIVE/PORT_ERR events");
        }
    });
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
