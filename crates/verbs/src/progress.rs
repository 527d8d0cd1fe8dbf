//! The per-process progress thread: one epoll loop that drives every transport socket and timer.
//!
//! Sources (a listening socket, a handshake, a connected QP) register an fd and get called on
//! readiness, on a `kick` from another thread (new work was posted), and on their timers. The
//! thread sleeps in `epoll_wait` when idle (≈0% CPU). With `SOFTRDMA_POLL=1` it never sleeps:
//! it spins on `epoll_wait(…, 0)`, trading a CPU for the ~50 µs cross-CPU wakeup.

use crate::fork::PerProcess;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Identifies a registered source.
pub type Token = u64;

const WAKER: Token = 0;

/// What happened to a source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Event {
    /// The fd is readable.
    pub readable: bool,
    /// The fd is writable.
    pub writable: bool,
    /// The fd reported an error or hang-up.
    pub error: bool,
    /// Another thread called [`Reactor::kick`].
    pub kicked: bool,
    /// A timer set with [`Reactor::set_timer`] expired.
    pub timer: bool,
}

/// Which readiness a source wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// Wake on readable.
    pub read: bool,
    /// Wake on writable.
    pub write: bool,
}

/// Something the progress thread drives.
pub trait Source: Send + Sync {
    /// Called on the progress thread. Must not block.
    fn on_event(&self, token: Token, ev: Event);
}

struct State {
    sources: HashMap<Token, Arc<dyn Source>>,
    next: Token,
    kicked: Vec<Token>,
    timers: BinaryHeap<Reverse<(Instant, Token)>>,
    sleeping: bool,
    /// The fd of each source registered with one (a forked child replaces them, see `fork`).
    fds: HashMap<Token, RawFd>,
    /// A thread is about to fork: the progress thread parks between two rounds (see `ForkHold`).
    fork_pause: bool,
    /// The progress thread is parked for the fork.
    parked: bool,
}

/// The reactor. One per process: [`Reactor::global`].
pub struct Reactor {
    epfd: OwnedFd,
    waker: OwnedFd,
    state: Mutex<State>,
    /// Signals `fork_pause` / `parked` changes between the forking and the progress thread.
    fork_cv: Condvar,
    polling: bool,
}

/// How long `fork` waits for the progress thread to park before it goes ahead regardless.
const FORK_PARK_WAIT: Duration = Duration::from_secs(2);

fn epoll_events(i: Interest) -> u32 {
    let mut e = (libc::EPOLLRDHUP | libc::EPOLLERR | libc::EPOLLHUP) as u32;
    if i.read {
        e |= libc::EPOLLIN as u32;
    }
    if i.write {
        e |= libc::EPOLLOUT as u32;
    }
    e
}

impl Reactor {
    /// The process-wide reactor; starts the progress thread on first use.
    /// Fails only if the OS refuses an epoll fd, an eventfd or a thread.
    pub fn global() -> crate::Result<&'static Arc<Reactor>> {
        let r = REACTOR.get_or_init(|| {
            let r = Arc::new(Reactor::new().map_err(|e| format!("epoll/eventfd: {e}"))?);
            let r2 = r.clone();
            std::thread::Builder::new()
                .name("softrdma-progress".into())
                .spawn(move || r2.run())
                .map_err(|e| format!("spawn: {e}"))?;
            Ok(r)
        });
        r.as_ref().map_err(|e| {
            crate::Error::new(
                crate::Errno::NoMem,
                format!("softrdma: cannot start the progress thread: {e}"),
            )
        })
    }

    /// This process's reactor if it was started (not one inherited through `fork`).
    pub fn existing() -> Option<&'static Arc<Reactor>> {
        REACTOR.get().and_then(|r| r.as_ref().ok())
    }

    fn new() -> std::io::Result<Reactor> {
        // SAFETY: plain syscalls; results checked.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fresh fd we own.
        let epfd = unsafe { OwnedFd::from_raw_fd(epfd) };
        // SAFETY: plain syscall; result checked.
        let wfd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fresh fd we own.
        let waker = unsafe { OwnedFd::from_raw_fd(wfd) };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: WAKER,
        };
        // SAFETY: valid epoll fd, valid eventfd, valid event struct.
        if unsafe { libc::epoll_ctl(epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, waker.as_raw_fd(), &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let polling = crate::settings::POLL.is_on();
        Ok(Reactor {
            epfd,
            waker,
            state: Mutex::new(State {
                sources: HashMap::new(),
                next: 1,
                kicked: Vec::new(),
                timers: BinaryHeap::new(),
                sleeping: false,
                fds: HashMap::new(),
                fork_pause: false,
                parked: false,
            }),
            fork_cv: Condvar::new(),
            polling,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.waker.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Registers a source without an fd (timers and kicks only).
    pub fn add(&self, source: Arc<dyn Source>) -> Token {
        self.insert(source, None)
    }

    /// A new token for `source` (and its `fd`, under the same lock, so a fork never sees
    /// the source without its fd).
    fn insert(&self, source: Arc<dyn Source>, fd: Option<RawFd>) -> Token {
        let mut st = self.lock();
        let t = st.next;
        st.next += 1;
        st.sources.insert(t, source);
        if let Some(fd) = fd {
            st.fds.insert(t, fd);
        }
        t
    }

    /// Registers `fd` with the given interest.
    pub fn register(&self, fd: RawFd, interest: Interest, source: Arc<dyn Source>) -> std::io::Result<Token> {
        let token = self.insert(source, Some(fd));
        let mut ev = libc::epoll_event {
            events: epoll_events(interest),
            u64: token,
        };
        // SAFETY: valid epoll fd; `fd` is owned by the caller and open; valid event struct.
        if unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            let e = std::io::Error::last_os_error();
            let mut st = self.lock();
            st.sources.remove(&token);
            st.fds.remove(&token);
            return Err(e);
        }
        Ok(token)
    }

    /// Changes the interest of a registered fd.
    pub fn set_interest(&self, token: Token, fd: RawFd, interest: Interest) {
        let mut ev = libc::epoll_event {
            events: epoll_events(interest),
            u64: token,
        };
        // SAFETY: valid epoll fd and event; a stale fd only makes epoll_ctl fail, which we ignore.
        unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, &mut ev) };
    }

    /// Removes a source; its fd (if any) must still be open and is removed from epoll.
    pub fn deregister(&self, token: Token, fd: Option<RawFd>) {
        if let Some(fd) = fd {
            // SAFETY: valid epoll fd; failure (fd already gone) is harmless.
            unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        }
        let mut st = self.lock();
        st.sources.remove(&token);
        st.fds.remove(&token);
    }

    /// Asks the progress thread to call the source with `kicked` soon. Callable from any thread.
    pub fn kick(&self, token: Token) {
        let sleeping = {
            let mut st = self.lock();
            if !st.kicked.contains(&token) {
                st.kicked.push(token);
            }
            st.sleeping
        };
        if sleeping {
            self.wake();
        }
    }

    /// Calls the source with `timer` at (or soon after) `deadline`.
    pub fn set_timer(&self, token: Token, deadline: Instant) {
        let sleeping = {
            let mut st = self.lock();
            st.timers.push(Reverse((deadline, token)));
            st.sleeping
        };
        if sleeping {
            self.wake();
        }
    }

    /// Calls `f` once, on the progress thread, at (or soon after) `at`: a one-shot timer
    /// with no source of its own to keep (it is registered, under the token returned, until
    /// it has run).
    pub fn call_at(&self, at: Instant, f: Box<dyn FnOnce() + Send>) -> Token {
        let token = self.add(Arc::new(CallOnce(Mutex::new(Some(f)))));
        self.set_timer(token, at);
        token
    }

    /// Withdraws the timer set for `token` at exactly `deadline` (one that is no longer
    /// wanted, such as a handshake's bound once the connection is up), so that it never wakes
    /// the progress thread. A source still ignores a timer event it did not expect.
    pub fn cancel_timer(&self, token: Token, deadline: Instant) {
        self.lock()
            .timers
            .retain(|Reverse((d, t))| !(*t == token && *d == deadline));
    }

    /// Number of registered sources (for leak checks).
    pub fn source_count(&self) -> usize {
        self.lock().sources.len()
    }

    /// Parks the progress thread while another thread forks (see `ForkHold`): it waits here,
    /// between two rounds, holding no lock and in no allocator, until the fork is over.
    fn park_for_fork<'a>(&'a self, mut st: std::sync::MutexGuard<'a, State>) -> std::sync::MutexGuard<'a, State> {
        st.parked = true;
        self.fork_cv.notify_all();
        while st.fork_pause {
            st = self.fork_cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.parked = false;
        st
    }

    fn run(self: Arc<Self>) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        loop {
            let timeout_ms = {
                let mut st = self.lock();
                if st.fork_pause {
                    st = self.park_for_fork(st);
                }
                // The timers of sources that are gone would only wake the thread for nothing.
                while let Some(Reverse((_, token))) = st.timers.peek() {
                    if st.sources.contains_key(token) {
                        break;
                    }
                    st.timers.pop();
                }
                let t = if !st.kicked.is_empty() || self.polling {
                    0
                } else {
                    match st.timers.peek() {
                        Some(Reverse((d, _))) => {
                            let left = d.saturating_duration_since(Instant::now());
                            (left.as_micros().div_ceil(1000)).min(60_000) as i32
                        }
                        None => -1,
                    }
                };
                st.sleeping = t != 0;
                t
            };
            // SAFETY: valid epoll fd and a buffer of `events.len()` entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.epfd.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    timeout_ms,
                )
            };
            self.lock().sleeping = false;
            let mut calls: Vec<(Arc<dyn Source>, Token, Event)> = Vec::new();
            {
                let mut st = self.lock();
                for e in events.iter().take(n.max(0) as usize) {
                    let token = e.u64;
                    if token == WAKER {
                        let mut v: u64 = 0;
                        // SAFETY: reading 8 bytes into a valid u64 from our non-blocking eventfd.
                        unsafe { libc::read(self.waker.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
                        continue;
                    }
                    let bits = e.events;
                    let ev = Event {
                        readable: bits & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP) as u32 != 0,
                        writable: bits & libc::EPOLLOUT as u32 != 0,
                        error: bits & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0,
                        ..Event::default()
                    };
                    if let Some(s) = st.sources.get(&token) {
                        calls.push((s.clone(), token, ev));
                    }
                }
                for token in std::mem::take(&mut st.kicked) {
                    if let Some(s) = st.sources.get(&token) {
                        calls.push((
                            s.clone(),
                            token,
                            Event {
                                kicked: true,
                                ..Event::default()
                            },
                        ));
                    }
                }
                let now = Instant::now();
                while let Some(Reverse((d, token))) = st.timers.peek().copied() {
                    if d > now {
                        break;
                    }
                    st.timers.pop();
                    if let Some(s) = st.sources.get(&token) {
                        calls.push((
                            s.clone(),
                            token,
                            Event {
                                timer: true,
                                ..Event::default()
                            },
                        ));
                    }
                }
            }
            for (s, token, ev) in calls {
                s.on_event(token, ev);
            }
        }
    }
}

/// A source that runs its function at its timer, once, and then removes itself
/// ([`Reactor::call_at`]).
struct CallOnce(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl Source for CallOnce {
    fn on_event(&self, token: Token, ev: Event) {
        if !ev.timer {
            return;
        }
        let f = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(r) = Reactor::existing() {
            r.deregister(token, None);
        }
        if let Some(f) = f {
            f();
        }
    }
}

/// The reactor of each fork generation (see `fork`).
static REACTOR: PerProcess<std::result::Result<Arc<Reactor>, String>> = PerProcess::new();

/// The reactor's lock, held across `fork` by the forking thread (see `fork`): the child then
/// finds the fd table complete, and replaces those fds.
///
/// Before it keeps the lock, `take` parks the progress thread between two rounds. A child
/// inherits only the forking thread, so a lock that another thread holds at the fork stays
/// held in the child for good. glibc's malloc takes its own locks around `fork`, but other
/// allocators do not (AddressSanitizer's in GCC 12, for one): a progress thread caught
/// inside `malloc` would leave the child's next allocation waiting forever. The wait is
/// bounded ([`FORK_PARK_WAIT`]); a thread that does not park in time is left running.
pub(crate) struct ForkHold {
    reactor: &'static Reactor,
    state: Option<std::sync::MutexGuard<'static, State>>,
}

impl ForkHold {
    /// Parks this process's progress thread and locks its reactor, if it has one.
    pub(crate) fn take() -> Option<ForkHold> {
        let reactor: &'static Reactor = Reactor::existing()?;
        let mut st = reactor.lock();
        st.fork_pause = true;
        reactor.wake();
        let (st, _) = reactor
            .fork_cv
            .wait_timeout_while(st, FORK_PARK_WAIT, |st| !st.parked)
            .unwrap_or_else(|p| p.into_inner());
        Some(ForkHold {
            reactor,
            state: Some(st),
        })
    }

    /// Every fd the reactor owns or drives: its epoll fd, its waker and each source's fd.
    pub(crate) fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        [self.reactor.epfd.as_raw_fd(), self.reactor.waker.as_raw_fd()]
            .into_iter()
            .chain(self.state.iter().flat_map(|st| st.fds.values().copied()))
    }
}

impl Drop for ForkHold {
    /// Lets the progress thread go on (in the parent; a child has none, and never runs it).
    fn drop(&mut self) {
        if let Some(mut st) = self.state.take() {
            st.fork_pause = false;
            drop(st);
            self.reactor.fork_cv.notify_all();
        }
    }
}

/// Bytes a TCP socket has sent but the peer has not acknowledged (`SIOCOUTQ`).
pub fn socket_unacked(fd: RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int into `n`; a bad fd only makes the ioctl fail.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    (r == 0 && n >= 0).then_some(n as u64)
}

/// A short sleep used by blocking helpers that poll.
pub const POLL_SLICE: Duration = Duration::from_micros(200);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Counter(AtomicU32);

    impl Source for Counter {
        fn on_event(&self, _token: Token, ev: Event) {
            if ev.kicked {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < deadline, "{what} within 5 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_fork_hold_parks_the_progress_thread_until_it_is_dropped() {
        let reactor = Reactor::global().expect("reactor");
        let counter = Arc::new(Counter(AtomicU32::new(0)));
        let token = reactor.add(counter.clone());
        reactor.kick(token);
        wait_for("the first kick", || counter.0.load(Ordering::SeqCst) == 1);

        let hold = ForkHold::take().expect("this process has a reactor");
        assert!(
            hold.state.as_ref().is_some_and(|st| st.parked),
            "the progress thread parked before the hold was granted"
        );
        // A kick from another thread waits for the lock: nothing runs while the hold lasts.
        let kicker = std::thread::spawn(move || reactor.kick(token));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        drop(hold);
        kicker.join().expect("kicker");
        wait_for("the kick after the hold", || counter.0.load(Ordering::SeqCst) == 2);
        assert!(!reactor.lock().fork_pause);
        reactor.deregister(token, None);
    }

    #[test]
    fn call_at_runs_once_on_the_progress_thread_no_earlier_and_leaves_no_source() {
        let reactor = Reactor::global().expect("reactor");
        let ran = Arc::new(Mutex::new(Vec::new()));
        let r = ran.clone();
        let at = Instant::now() + Duration::from_millis(20);
        let token = reactor.call_at(
            at,
            Box::new(move || {
                let name = std::thread::current().name().map(str::to_owned);
                r.lock().unwrap().push((Instant::now(), name));
            }),
        );
        wait_for("the call", || !ran.lock().unwrap().is_empty());
        // The source is gone once it ran: another kick or timer cannot call it again.
        std::thread::sleep(Duration::from_millis(50));
        let ran = ran.lock().unwrap();
        assert_eq!(ran.len(), 1);
        assert!(ran[0].0 >= at, "not before its time");
        assert_eq!(ran[0].1.as_deref(), Some("softrdma-progress"));
        assert!(!reactor.lock().sources.contains_key(&token));
    }
}
