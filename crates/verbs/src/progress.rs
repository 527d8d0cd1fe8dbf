//! The per-process progress thread: one epoll loop that drives every transport socket and timer.
//!
//! Sources (a listening socket, a handshake, a connected QP) register an fd and get called on
//! readiness, on a `kick` from another thread (new work was posted), and on their timers (one
//! timerfd, `timer_clock`). The thread sleeps in `epoll_wait` when idle (≈0% CPU); it never
//! spins (a spinning mode was measured slower everywhere and retired, see
//! `settings::RETIRED`). Application threads run rounds themselves instead: one that waits
//! for a CM event, one whose CQ poll found nothing (`caller_round`).

use crate::fork::PerProcess;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod caller_round;
mod timer_clock;
pub use caller_round::Driving;
use timer_clock::TimerClock;

/// Identifies a registered source.
pub type Token = u64;

const WAKER: Token = 0;
/// The token of the kick eventfd in the sources' set (see [`Reactor::kick`]).
const KICKS: Token = u64::MAX - 2;
/// The token of the sources' epoll set in the progress thread's (see [`Reactor`]).
const SOURCES: Token = u64::MAX - 1;
/// The token of the timerfd ([`TimerClock`]).
const TIMERS: Token = u64::MAX;

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

impl Interest {
    /// Readable only.
    pub const READ: Interest = Interest {
        read: true,
        write: false,
    };
}

/// Something the progress thread drives.
pub trait Source: Send + Sync {
    /// Called on the progress thread, or on an application thread that runs a round
    /// ([`Reactor::caller_round`]); never by two rounds at once. Must not block.
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
    /// The deadline the timerfd is armed for.
    armed: Option<Instant>,
    /// Application threads running rounds (`Reactor::drive`).
    drivers: usize,
    /// No thread drives, but the sources' set stays out of the progress thread's until then
    /// (see `Reactor::drive`): the timerfd wakes it to put the set back.
    linger: Option<Instant>,
    /// The kick eventfd was written and not read since.
    kick_signalled: bool,
}

impl State {
    /// The sources' set is out of the progress thread's: an application thread drives, or
    /// will again soon (see `Reactor::drive`).
    fn sources_out(&self) -> bool {
        self.drivers > 0 || self.linger.is_some()
    }
}

/// The reactor. One per process: [`Reactor::global`].
///
/// Two epoll sets: the sources' fds and the kick eventfd are in `epfd`; the progress thread
/// waits on `outer`, which holds `epfd` itself, the waker and the timerfd. An application
/// thread that runs rounds itself (`caller_round`) takes `epfd` out of `outer` meanwhile (and
/// a linger after), so that the readiness and the kicks it handles do not also wake the
/// progress thread.
pub struct Reactor {
    epfd: OwnedFd,
    outer: OwnedFd,
    waker: OwnedFd,
    /// In the sources' set: kicks made while the set is out of the progress thread's reach
    /// the thread that drives (see [`Reactor::kick`]).
    kick_fd: OwnedFd,
    clock: TimerClock,
    state: Mutex<State>,
    /// Signals `fork_pause` / `parked` changes between the forking and the progress thread.
    fork_cv: Condvar,
    /// Held while a round calls its sources, by the progress thread or by an application
    /// thread (`caller_round`): rounds never overlap.
    turn: Mutex<()>,
}

/// How near an armed timerfd deadline that is no longer needed may be to stay armed (see
/// `Reactor::rearm`). Well under a second: an idle process is not woken later than this
/// after its last timer was withdrawn.
const REARM_SLACK: Duration = Duration::from_millis(250);

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
        let epfd = new_epoll()?;
        let outer = new_epoll()?;
        let waker = new_eventfd()?;
        let kick_fd = new_eventfd()?;
        let clock = TimerClock::new()?;
        epoll_add(&epfd, kick_fd.as_raw_fd(), KICKS)?;
        epoll_add(&outer, waker.as_raw_fd(), WAKER)?;
        epoll_add(&outer, clock.raw_fd(), TIMERS)?;
        epoll_add(&outer, epfd.as_raw_fd(), SOURCES)?;
        crate::settings::notice_retired();
        Ok(Reactor {
            epfd,
            outer,
            waker,
            kick_fd,
            clock,
            state: Mutex::new(State {
                sources: HashMap::new(),
                next: 1,
                kicked: Vec::new(),
                timers: BinaryHeap::new(),
                sleeping: false,
                fds: HashMap::new(),
                fork_pause: false,
                parked: false,
                armed: None,
                drivers: 0,
                linger: None,
                kick_signalled: false,
            }),
            fork_cv: Condvar::new(),
            turn: Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        eventfd_signal(&self.waker);
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
            // Failure (the fd already gone) is harmless.
            let _ = epoll_del(&self.epfd, fd);
        }
        let mut st = self.lock();
        st.sources.remove(&token);
        st.fds.remove(&token);
    }

    /// Asks for a call of the source with `kicked` soon, in a round of the thread that serves
    /// the sources: the progress thread, or the application thread that drives (see
    /// [`Reactor::drive`]; the kick eventfd in the sources' set wakes it). Callable from any
    /// thread. A kick made inside a round is served by that round before it ends (an
    /// application thread's too, see `caller_round`), so it wakes no thread.
    pub fn kick(&self, token: Token) {
        let mut st = self.lock();
        if !st.kicked.contains(&token) {
            st.kicked.push(token);
        }
        if caller_round::in_round() {
            return;
        }
        let wake = self.route_kicks(&mut st);
        drop(st);
        if wake {
            self.wake();
        }
    }

    /// Tells the thread that serves the sources about the kicks pending: while the sources'
    /// set is out, by making it readable (the kick eventfd, once until the kicks are taken);
    /// otherwise true if the progress thread sleeps and must be woken (by the caller, with
    /// the state unlocked).
    fn route_kicks(&self, st: &mut State) -> bool {
        if st.kicked.is_empty() {
            return false;
        }
        if !st.sources_out() {
            return st.sleeping;
        }
        if !st.kick_signalled {
            eventfd_signal(&self.kick_fd);
            st.kick_signalled = true;
        }
        false
    }

    /// Calls the source with `timer` at (or soon after) `deadline`. The progress thread is
    /// not woken for it: the timerfd is re-armed when `deadline` is the earliest.
    pub fn set_timer(&self, token: Token, deadline: Instant) {
        let mut st = self.lock();
        st.timers.push(Reverse((deadline, token)));
        self.arm_by(&mut st, deadline);
    }

    /// Arms the timerfd for `deadline` unless it fires sooner already.
    fn arm_by(&self, st: &mut State, deadline: Instant) {
        if st.armed.is_none_or(|a| deadline < a) {
            self.clock.arm(Some(deadline));
            st.armed = Some(deadline);
        }
    }

    /// Arms the timerfd for the earliest timer (disarms it when there is none), unless it is
    /// armed for that already, or for an earlier time less than [`REARM_SLACK`] away: that
    /// costs one early round of the progress thread, where re-arming would cost a system call
    /// each time (soft-RoCE sets and withdraws an ACK timer for every message).
    fn rearm(&self, st: &mut State) {
        let next = match (st.timers.peek().map(|Reverse((d, _))| *d), st.linger) {
            (Some(t), Some(l)) => Some(t.min(l)),
            (t, l) => t.or(l),
        };
        let now = Instant::now();
        let keep = match st.armed {
            Some(a) if Some(a) == next => true,
            Some(a) => a > now && a <= now + REARM_SLACK && next.is_none_or(|n| a < n),
            None => next.is_none(),
        };
        if !keep {
            self.clock.arm(next);
            st.armed = next;
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
    /// wanted, such as a handshake's bound once the connection is up): the source is not
    /// called for it, and the progress thread is not woken for it later than
    /// [`REARM_SLACK`] from now. A source still ignores a timer event it did not expect.
    pub fn cancel_timer(&self, token: Token, deadline: Instant) {
        let mut st = self.lock();
        st.timers.retain(|Reverse((d, t))| !(*t == token && *d == deadline));
        self.rearm(&mut st);
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
                // Timers wake it through the timerfd. While the sources are out, the kicks
                // (those its last round made, too) are the driving thread's.
                self.route_kicks(&mut st);
                let t = if !st.kicked.is_empty() && !st.sources_out() {
                    0
                } else {
                    -1
                };
                st.sleeping = t != 0;
                t
            };
            let mut ctl = [libc::epoll_event { events: 0, u64: 0 }; 3];
            // SAFETY: valid epoll fd and a buffer of `ctl.len()` entries.
            let m = unsafe { libc::epoll_wait(self.outer.as_raw_fd(), ctl.as_mut_ptr(), ctl.len() as i32, timeout_ms) };
            let mut sources = {
                let mut st = self.lock();
                st.sleeping = false;
                self.end_linger_if_due(&mut st)
            };
            for e in ctl.iter().take(m.max(0) as usize) {
                match e.u64 {
                    WAKER => eventfd_clear(&self.waker),
                    TIMERS => self.clock.clear(),
                    _ => sources = true,
                }
            }
            let turn = self.take_turn();
            // Under the turn: what an application thread's round handled meanwhile is gone.
            let n = if sources { self.harvest(&mut events, 0) } else { 0 };
            let calls = self.collect(&events[..n], true);
            turn.dispatch(calls);
        }
    }

    /// `epoll_wait` into `events`; the number of events (0 on an error).
    fn harvest(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> usize {
        // SAFETY: valid epoll fd and a buffer of `events.len()` entries.
        let n = unsafe {
            libc::epoll_wait(
                self.epfd.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout_ms,
            )
        };
        n.max(0) as usize
    }

    /// The calls a round makes: one per fd event of a known source and, for the progress
    /// thread's rounds (`whole`), the kicks and the due timers.
    fn collect(&self, events: &[libc::epoll_event], whole: bool) -> Vec<(Arc<dyn Source>, Token, Event)> {
        let mut calls: Vec<(Arc<dyn Source>, Token, Event)> = Vec::new();
        let mut st = self.lock();
        for e in events {
            let token = e.u64;
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
        if !whole {
            return calls;
        }
        // While the sources are out, the kicks are the driving thread's (`run` signals them).
        if !st.sources_out() {
            self.take_kicks(&mut st, &mut calls);
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
        self.rearm(&mut st);
        calls
    }
}

impl Reactor {
    /// The calls for the sources kicked since the last round (the kicks, and the kick
    /// eventfd's signal, are taken).
    fn take_kicks(&self, st: &mut State, calls: &mut Vec<(Arc<dyn Source>, Token, Event)>) {
        if std::mem::take(&mut st.kick_signalled) {
            eventfd_clear(&self.kick_fd);
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
    }
}

/// A non-blocking, close-on-exec eventfd.
fn new_eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; result checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `fd` (an eventfd) readable.
fn eventfd_signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

/// Reads `fd` (a non-blocking eventfd) back to not readable.
fn eventfd_clear(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: reading 8 bytes into a valid u64 from our non-blocking eventfd.
    unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
}

fn new_epoll() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; result checked.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `fd`, readable, to the epoll set `ep` under `token`.
fn epoll_add(ep: &OwnedFd, fd: RawFd, token: Token) -> std::io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: valid epoll fd, an fd the caller keeps open, a valid event struct.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `fd` from the epoll set `ep`.
fn epoll_del(ep: &OwnedFd, fd: RawFd) -> std::io::Result<()> {
    // SAFETY: valid epoll fd; a null event is allowed for EPOLL_CTL_DEL.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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
        [
            self.reactor.epfd.as_raw_fd(),
            self.reactor.outer.as_raw_fd(),
            self.reactor.waker.as_raw_fd(),
            self.reactor.kick_fd.as_raw_fd(),
            self.reactor.clock.raw_fd(),
        ]
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
    use super::caller_round::DRIVE_LINGER;
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

    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    /// Reads what arrives on its socket and records the thread of each call.
    struct Recorder {
        sock: UnixStream,
        threads: Mutex<Vec<Option<String>>>,
        /// When each call came.
        times: Mutex<Vec<Instant>>,
    }

    impl Source for Recorder {
        fn on_event(&self, _token: Token, ev: Event) {
            if !ev.readable {
                return;
            }
            let mut buf = [0u8; 64];
            while matches!((&self.sock).read(&mut buf), Ok(n) if n > 0) {}
            let name = std::thread::current().name().map(str::to_owned);
            self.threads.lock().unwrap().push(name);
            self.times.lock().unwrap().push(Instant::now());
        }
    }

    /// The tests whose threads drive the reactor take turns: a round run by one would serve
    /// the other's sources too.
    fn one_driver_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static SERIAL: Mutex<()> = Mutex::new(());
        SERIAL.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits (5 s at most) for the sources' set to be readable, as a driving thread does.
    fn assert_sources_ready(reactor: &Reactor) {
        let mut fds = [nix::poll::PollFd::new(reactor.ready_fd(), nix::poll::PollFlags::POLLIN)];
        let n = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(5000u16)).expect("poll");
        assert_eq!(n, 1, "the sources' set is readable");
    }

    fn calls(r: &Recorder) -> Vec<Option<String>> {
        r.threads.lock().unwrap().clone()
    }

    /// A [`Recorder`] registered for reads on one end of a socket pair: the reactor, the
    /// recorder, the other end, its token and fd.
    fn recorded_socket() -> (&'static Arc<Reactor>, Arc<Recorder>, UnixStream, Token, RawFd) {
        let reactor = Reactor::global().expect("reactor");
        let (ours, peer) = UnixStream::pair().expect("socketpair");
        ours.set_nonblocking(true).expect("O_NONBLOCK");
        let fd = ours.as_raw_fd();
        let rec = Arc::new(Recorder {
            sock: ours,
            threads: Mutex::new(Vec::new()),
            times: Mutex::new(Vec::new()),
        });
        let token = reactor.register(fd, Interest::READ, rec.clone()).expect("register");
        (reactor, rec, peer, token, fd)
    }

    #[test]
    fn a_driving_thread_runs_the_round_itself_and_then_hands_the_sources_back() {
        let _serial = one_driver_at_a_time();
        let (reactor, rec, peer, token, fd) = recorded_socket();
        let me = std::thread::current().name().map(str::to_owned);
        {
            let _driving = reactor.drive();
            (&peer).write_all(b"x").expect("write");
            assert_sources_ready(reactor);
            assert!(reactor.caller_round(), "the round called the source");
            assert_eq!(calls(&rec), vec![me.clone()], "on this thread");
            // The progress thread was not woken to handle it as well.
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(calls(&rec).len(), 1);
        }
        // Driving over: the progress thread serves the source again.
        (&peer).write_all(b"y").expect("write");
        wait_for("the progress thread's call", || calls(&rec).len() == 2);
        assert_eq!(calls(&rec)[1].as_deref(), Some("softrdma-progress"));
        reactor.deregister(token, Some(fd));
    }

    #[test]
    fn a_polling_round_handles_what_is_ready_on_its_thread_and_never_waits_for_another_round() {
        let _serial = one_driver_at_a_time();
        let (reactor, rec, peer, token, fd) = recorded_socket();
        let me = std::thread::current().name().map(str::to_owned);
        // Driving keeps the progress thread off the source, so only this thread's rounds run.
        let driving = reactor.drive();
        assert!(!reactor.polling_round(), "nothing is ready");
        (&peer).write_all(b"x").expect("write");
        let turn = reactor.take_turn();
        let t0 = Instant::now();
        assert!(!reactor.polling_round(), "a round is under way: this one does nothing");
        assert!(t0.elapsed() < Duration::from_secs(1), "without waiting for it");
        assert!(calls(&rec).is_empty());
        drop(turn);
        assert!(reactor.polling_round(), "the round called the source");
        assert_eq!(calls(&rec), vec![me], "on this thread");
        assert!(!reactor.polling_round(), "handled: nothing is ready any more");
        drop(driving);
        reactor.deregister(token, Some(fd));
    }

    #[test]
    fn the_sources_stay_with_the_application_for_the_linger_after_its_last_wait() {
        let _serial = one_driver_at_a_time();
        let (reactor, rec, peer, token, fd) = recorded_socket();
        // Readiness just after the last driver left: the progress thread serves it, but not
        // before the linger is over (the thread could have come back for it until then).
        let driving = reactor.drive();
        let left = Instant::now();
        drop(driving);
        (&peer).write_all(b"x").expect("write");
        wait_for("the progress thread's call", || calls(&rec).len() == 1);
        assert_eq!(calls(&rec)[0].as_deref(), Some("softrdma-progress"));
        let served = rec.times.lock().unwrap()[0];
        assert!(
            served >= left + DRIVE_LINGER,
            "served {:?} after the driver left",
            served - left
        );
        // A driver that hands the sources back leaves no linger: they are served at once
        // (well within the wait, which is all a test can tell).
        reactor.drive().hand_back();
        (&peer).write_all(b"y").expect("write");
        wait_for("the progress thread's second call", || calls(&rec).len() == 2);
        assert_eq!(calls(&rec)[1].as_deref(), Some("softrdma-progress"));
        reactor.deregister(token, Some(fd));
    }

    #[test]
    fn a_kick_while_a_thread_drives_is_that_threads_to_serve() {
        let _serial = one_driver_at_a_time();
        let reactor = Reactor::global().expect("reactor");
        let counter = Arc::new(Counter(AtomicU32::new(0)));
        let token = reactor.add(counter.clone());
        let driving = reactor.drive();
        // Kicked from another thread: the sources' set becomes readable for the driver, and
        // the progress thread leaves the kick alone.
        std::thread::spawn(move || reactor.kick(token)).join().expect("kicker");
        assert_sources_ready(reactor);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(counter.0.load(Ordering::SeqCst), 0, "the progress thread took the kick");
        assert!(reactor.caller_round(), "the round served the kick");
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert!(
            !reactor.caller_round(),
            "nothing is left: the kick's signal was taken too"
        );
        drop(driving);
        // Without a driver (and its linger over), a kick goes to the progress thread again.
        reactor.drive().hand_back();
        reactor.kick(token);
        wait_for("the progress thread's kick", || counter.0.load(Ordering::SeqCst) == 2);
        reactor.deregister(token, None);
    }

    /// Counts timer calls and when they came.
    struct Timed(Mutex<Vec<Instant>>);

    impl Source for Timed {
        fn on_event(&self, _token: Token, ev: Event) {
            if ev.timer {
                self.0.lock().unwrap().push(Instant::now());
            }
        }
    }

    #[test]
    fn timers_fire_through_the_timerfd_no_earlier_and_a_cancelled_one_never() {
        let reactor = Reactor::global().expect("reactor");
        let timed = Arc::new(Timed(Mutex::new(Vec::new())));
        let token = reactor.add(timed.clone());
        let t0 = Instant::now();
        let (later, sooner) = (t0 + Duration::from_millis(40), t0 + Duration::from_millis(20));
        reactor.set_timer(token, later);
        // Sooner: the timerfd is re-armed for it; cancelled: re-armed for `later` again.
        reactor.set_timer(token, sooner);
        reactor.cancel_timer(token, sooner);
        wait_for("the timer", || !timed.0.lock().unwrap().is_empty());
        std::thread::sleep(Duration::from_millis(60));
        let fired = timed.0.lock().unwrap().clone();
        assert_eq!(fired.len(), 1, "one call: the cancelled timer never fired");
        assert!(fired[0] >= later, "not before its deadline");
        reactor.deregister(token, None);
    }
}
