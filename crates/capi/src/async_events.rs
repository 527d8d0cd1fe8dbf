//! `ibv_get_async_event` / `ibv_ack_async_event` over the verbs context's event queue, whose
//! eventfd is `ibv_context.async_fd`.
//!
//! As in libibverbs, each event handed out must be acknowledged, and destroying its QP, CQ
//! or SRQ waits for that (`events_completed` in the C object, under its mutex and cond):
//! the application may still be reading the event's object. The wait is bounded: after
//! [`ACK_WAIT`] the destroy fails with EBUSY, naming the missing acknowledgements, instead of
//! hanging as rdma-core would. Events still queued for an object being destroyed are
//! discarded, as the kernel does.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use softrdma_verbs::{AsyncElement, AsyncEvents};

use crate::abi::{ibv_async_event, ibv_context, ibv_cq, ibv_qp, ibv_srq};
use crate::context::with_context;
use crate::error::{non_null, ret_neg1, CError, CResult};

/// How long a destroy waits for the application to acknowledge the object's events.
const ACK_WAIT: Duration = Duration::from_secs(2);

/// Which C object an event names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Object {
    Qp(u32),
    Cq(u64),
    Srq(u64),
}

/// Live CQs and SRQs by verbs id (QPs are found by number in `objects`), and how many events
/// each C object (by address) was handed.
#[derive(Default)]
struct Registry {
    objects: HashMap<Object, usize>,
    reported: HashMap<usize, u32>,
}

/// Per fork generation (see `softrdma_verbs::fork`).
static REGISTRY: softrdma_verbs::fork::PerProcess<Mutex<Option<Registry>>> = softrdma_verbs::fork::PerProcess::new();

fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g = REGISTRY
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(Registry::default))
}

/// Records a new CQ, SRQ or QP so its events can name it.
pub(crate) fn register(obj: Object, c: *mut c_void) {
    with_registry(|r| r.objects.insert(obj, c as usize));
}

/// The C object's `mutex`, `cond` and `events_completed` (`async_events_completed` of a CQ).
struct AckFields {
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
    completed: *mut u32,
}

/// # Safety
/// `c` is the live C header of `obj`'s type.
unsafe fn ack_fields(obj: Object, c: *mut c_void) -> AckFields {
    macro_rules! fields {
        ($t:ty, $completed:ident) => {{
            let p = c.cast::<$t>();
            // SAFETY: `p` is a live header of this type (the caller's contract); field
            // addresses only.
            unsafe {
                AckFields {
                    mutex: ptr::addr_of_mut!((*p).mutex),
                    cond: ptr::addr_of_mut!((*p).cond),
                    completed: ptr::addr_of_mut!((*p).$completed),
                }
            }
        }};
    }
    match obj {
        Object::Qp(_) => fields!(ibv_qp, events_completed),
        Object::Cq(_) => fields!(ibv_cq, async_events_completed),
        Object::Srq(_) => fields!(ibv_srq, events_completed),
    }
}

fn element_object(e: AsyncElement) -> Option<Object> {
    match e {
        AsyncElement::Qp(n) => Some(Object::Qp(n)),
        AsyncElement::Cq(id) => Some(Object::Cq(id)),
        AsyncElement::Srq(id) => Some(Object::Srq(id)),
        AsyncElement::Port(_) | AsyncElement::Device => None,
    }
}

/// Before an object's destroy: discards its queued events and waits (bounded) until the
/// application acknowledged the ones it took. EBUSY if it did not; the object stays valid.
pub(crate) fn before_destroy(events: &AsyncEvents, obj: Object, c: *mut c_void) -> CResult<()> {
    let element = match obj {
        Object::Qp(n) => AsyncElement::Qp(n),
        Object::Cq(id) => AsyncElement::Cq(id),
        Object::Srq(id) => AsyncElement::Srq(id),
    };
    events.discard(|e| e.element == element);
    let reported = with_registry(|r| r.reported.get(&(c as usize)).copied().unwrap_or(0));
    if reported == 0 {
        return Ok(());
    }
    // SAFETY: `c` is the live header of `obj` (the destroy's caller holds it).
    let f = unsafe { ack_fields(obj, c) };
    let deadline = Instant::now() + ACK_WAIT;
    // SAFETY: the header's mutex and cond were initialised at creation; events_completed is
    // only written under the mutex.
    unsafe {
        libc::pthread_mutex_lock(f.mutex);
        while *f.completed < reported && Instant::now() < deadline {
            let mut ts: libc::timespec = std::mem::zeroed();
            libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
            ts.tv_nsec += 10_000_000;
            if ts.tv_nsec >= 1_000_000_000 {
                ts.tv_sec += 1;
                ts.tv_nsec -= 1_000_000_000;
            }
            libc::pthread_cond_timedwait(f.cond, f.mutex, &ts);
        }
        let completed = *f.completed;
        libc::pthread_mutex_unlock(f.mutex);
        if completed < reported {
            return Err(CError::new(
                libc::EBUSY,
                format!(
                    "{} async event(s) of this object were not acknowledged after {ACK_WAIT:?}: call ibv_ack_async_event for each",
                    reported - completed
                ),
            ));
        }
    }
    Ok(())
}

/// After a destroy: forgets the object.
pub(crate) fn unregister(obj: Object, c: *mut c_void) {
    with_registry(|r| {
        r.objects.remove(&obj);
        r.reported.remove(&(c as usize));
    });
}

fn get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> CResult<c_int> {
    non_null(event, "event")?;
    let events = with_context(ctx, |c| Ok(c.verbs().async_events().clone())).map_err(crate::exit::unless_exiting)?;
    loop {
        // Blocks outside every lock (the context cannot be closed under a reader: the
        // application owns that ordering, as with rdma-core).
        let ev = events.get()?;
        let element = match (element_object(ev.element), ev.element) {
            (Some(obj), _) => {
                let found = with_registry(|r| {
                    let c = r.objects.get(&obj).copied()?;
                    *r.reported.entry(c).or_insert(0) += 1;
                    Some(c)
                });
                match found {
                    Some(c) => c as *mut c_void,
                    None => continue, // destroyed meanwhile
                }
            }
            (None, AsyncElement::Port(p)) => usize::from(p) as *mut c_void,
            (None, _) => ptr::null_mut(),
        };
        // SAFETY: non-NULL (checked), the caller's struct ibv_async_event.
        unsafe {
            event.write(ibv_async_event {
                element,
                event_type: ev.kind.value(),
            });
        }
        return Ok(0);
    }
}

/// True for the event types that name a QP, CQ or SRQ (whose destroy waits for the
/// acknowledgement); the device, port and WQ events name none of those.
fn names_an_object(event_type: u32) -> Option<bool> {
    match event_type {
        0..=7 | 14..=16 => Some(true),
        8..=13 | 17..=19 => Some(false),
        _ => None,
    }
}

fn ack_async_event(event: *mut ibv_async_event) -> CResult<()> {
    non_null(event, "event")?;
    // SAFETY: non-NULL, the caller's event as returned by ibv_get_async_event.
    let ev = unsafe { event.read() };
    let element = ev.element;
    let Some(counted) = names_an_object(ev.event_type) else {
        return Err(CError::inval(format!(
            "ack_async_event: unknown event type {}",
            ev.event_type
        )));
    };
    if !counted {
        return Ok(());
    }
    let obj = with_registry(|r| {
        r.reported
            .contains_key(&(element as usize))
            .then(|| r.objects.iter().find(|(_, &c)| c == element as usize).map(|(o, _)| *o))
            .flatten()
    });
    let Some(obj) = obj else {
        return Err(CError::inval(
            "ack_async_event: the event's object is not one this library reported",
        ));
    };
    // SAFETY: registered objects are live until unregister, which their destroy calls only
    // after the acknowledgements it waits for.
    let f = unsafe { ack_fields(obj, element) };
    // SAFETY: initialised at creation; events_completed is written under the mutex.
    unsafe {
        libc::pthread_mutex_lock(f.mutex);
        *f.completed = (*f.completed).wrapping_add(1);
        libc::pthread_cond_signal(f.cond);
        libc::pthread_mutex_unlock(f.mutex);
    }
    Ok(())
}

c_fn! {
    /// `int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)`:
    /// waits for the next event (EAGAIN at once if `async_fd` was set O_NONBLOCK).
    fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
        ret_neg1(get_async_event(context, event))
    }

    /// `void ibv_ack_async_event(struct ibv_async_event *event)`.
    fn ibv_ack_async_event(event: *mut ibv_async_event) {
        let _ = ack_async_event(event).map_err(crate::error::report);
    }
}
