//! Object limits: what `ibv_query_device` advertises (`max_pd`, `max_cq`, `max_qp`, `max_srq`,
//! `max_mr`, `max_mw`, `max_ah`) is enforced, per device, within this process.
//!
//! Every object holds a [`Charge`] on its device's counter from creation until it is dropped;
//! the object past the limit is refused with ENOMEM, as Linux siw refuses it (`siw_alloc_pd`,
//! `siw_create_qp`, ... return -ENOMEM once `num_pd` etc. pass `SIW_MAX_*`). Two contexts on
//! one device share the counts, as the kernel's per-device counters are shared by every
//! context. A device advertising 0 of a kind (siw has no AHs or memory windows) refuses that
//! kind before the count matters, with its own errno.

use crate::device::DeviceAttr;
use crate::{Errno, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A kind of counted object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjKind {
    /// Protection domains (`max_pd`).
    Pd,
    /// Completion queues (`max_cq`).
    Cq,
    /// Queue pairs (`max_qp`).
    Qp,
    /// Shared receive queues (`max_srq`).
    Srq,
    /// Memory regions (`max_mr`).
    Mr,
    /// Memory windows (`max_mw`).
    Mw,
    /// Address handles (`max_ah`).
    Ah,
}

const KINDS: usize = 7;

impl ObjKind {
    fn index(self) -> usize {
        self as usize
    }

    /// The object's name in messages ("QP").
    pub fn name(self) -> &'static str {
        match self {
            ObjKind::Pd => "PD",
            ObjKind::Cq => "CQ",
            ObjKind::Qp => "QP",
            ObjKind::Srq => "SRQ",
            ObjKind::Mr => "MR",
            ObjKind::Mw => "MW",
            ObjKind::Ah => "AH",
        }
    }

    /// The `ibv_device_attr` field that advertises the limit.
    pub fn attr_name(self) -> &'static str {
        match self {
            ObjKind::Pd => "max_pd",
            ObjKind::Cq => "max_cq",
            ObjKind::Qp => "max_qp",
            ObjKind::Srq => "max_srq",
            ObjKind::Mr => "max_mr",
            ObjKind::Mw => "max_mw",
            ObjKind::Ah => "max_ah",
        }
    }

    /// The advertised limit.
    pub fn limit(self, a: &DeviceAttr) -> usize {
        let v = match self {
            ObjKind::Pd => a.max_pd,
            ObjKind::Cq => a.max_cq,
            ObjKind::Qp => a.max_qp,
            ObjKind::Srq => a.max_srq,
            ObjKind::Mr => a.max_mr,
            ObjKind::Mw => a.max_mw,
            ObjKind::Ah => a.max_ah,
        };
        usize::try_from(v).unwrap_or(0)
    }
}

/// The live objects of one device in this process, by kind.
#[derive(Debug, Default)]
pub(crate) struct Counts([AtomicUsize; KINDS]);

/// The counters of device `name` (one set per device name, shared by its contexts).
pub(crate) fn counts_for(name: &str) -> Arc<Counts> {
    static ALL: OnceLock<Mutex<HashMap<String, Arc<Counts>>>> = OnceLock::new();
    let mut all = ALL
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    all.entry(name.to_owned()).or_default().clone()
}

/// One live object counted against its device's limit; released when dropped.
#[derive(Debug)]
pub struct Charge {
    counts: Arc<Counts>,
    kind: ObjKind,
}

impl Charge {
    /// Counts one more object of `kind`; ENOMEM naming `op`, the device and the limit once
    /// `limit` objects are live.
    pub(crate) fn take(counts: &Arc<Counts>, kind: ObjKind, limit: usize, op: &str, device: &str) -> Result<Charge> {
        let c = &counts.0[kind.index()];
        let prev = c.fetch_add(1, Ordering::AcqRel);
        if prev >= limit {
            c.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!(device, kind = kind.name(), limit, "object limit reached");
            return Err(Error::new(
                Errno::NoMem,
                format!(
                    "{op} on {device}: the device's {limit} {}s are all in use ({} {limit})",
                    kind.name(),
                    kind.attr_name()
                ),
            ));
        }
        Ok(Charge {
            counts: counts.clone(),
            kind,
        })
    }

    /// Live objects of this charge's kind on its device.
    pub fn live(&self) -> usize {
        self.counts.0[self.kind.index()].load(Ordering::Acquire)
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.counts.0[self.kind.index()].fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_past_the_limit_is_enomem_and_a_release_frees_a_slot() {
        let counts = Arc::new(Counts::default());
        let held: Vec<Charge> = (0..3)
            .map(|_| Charge::take(&counts, ObjKind::Qp, 3, "create_qp", "siw_x").unwrap())
            .collect();
        let e = Charge::take(&counts, ObjKind::Qp, 3, "create_qp", "siw_x").unwrap_err();
        assert_eq!(e.errno, Errno::NoMem);
        assert!(
            e.msg.contains("create_qp on siw_x") && e.msg.contains("max_qp 3"),
            "{e}"
        );
        // Other kinds are counted apart.
        let _cq = Charge::take(&counts, ObjKind::Cq, 3, "create_cq", "siw_x").unwrap();
        assert_eq!(held[0].live(), 3);
        drop(held);
        let again = Charge::take(&counts, ObjKind::Qp, 3, "create_qp", "siw_x").unwrap();
        assert_eq!(again.live(), 1);
        assert_eq!(
            Charge::take(&counts, ObjKind::Mw, 0, "alloc_mw", "siw_x")
                .unwrap_err()
                .errno,
            Errno::NoMem
        );
    }
}
