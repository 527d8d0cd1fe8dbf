//! Memory windows (`ibv_alloc_mw`, types 1 and 2), as Linux rxe has them.
//!
//! A window owns a key index (the upper 24 bits of its rkey); a bind makes the key (index +
//! an 8-bit tag) an entry of the key table that grants `access` to a range of a bound MR, so
//! remote requests find it as they find an MR. A type-1 window is bound with `ibv_bind_mw`
//! (a new tag each bind, a length of 0 unbinds); a type-2 window with a BIND_MW work request
//! whose rkey the application picks, is usable only through the QP that bound it, and is
//! freed again by LOCAL_INV or by a peer's SEND_WITH_INV. Deallocating a window removes its
//! entry; an MR with windows bound cannot be deregistered (EBUSY).

use crate::mr::{lookup_key, release_window_key, with_table, KeyError, MrInner};
use crate::pd::Pd;
use crate::wr::{Access, MwBind};
use crate::{bail, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// `enum ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// Bound with `ibv_bind_mw`.
    Type1 = 1,
    /// Bound with a BIND_MW work request, to one QP.
    Type2 = 2,
}

/// An allocated memory window. Freed (its entry gone) when dropped.
#[derive(Debug)]
pub struct Mw {
    /// Its type.
    pub mw_type: MwType,
    pd_id: u64,
    /// The key's index (its upper 24 bits).
    index: u32,
    /// Keeps the PD in use and counts against the device's `max_mw`.
    _use: crate::pd::PdUse,
}

impl Mw {
    /// Allocates a window of `mw_type` in `pd`.
    pub fn alloc(pd: &Pd, mw_type: MwType) -> Result<Mw> {
        let pd_use = crate::pd::PdUse::take(pd, crate::quota::ObjKind::Mw, "alloc_mw")?;
        let Some(index) = crate::mr::new_window_key() else {
            bail!(Io, "alloc_mw: key table poisoned");
        };
        Ok(Mw {
            mw_type,
            pd_id: pd.id(),
            index,
            _use: pd_use,
        })
    }

    /// The key a fresh window reports (`ibv_mw.rkey`): its index, tag 0.
    pub fn initial_rkey(&self) -> u32 {
        self.index
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        release_window_key(self.index);
    }
}

/// The remote rights a window may grant.
const WINDOW_RIGHTS: u32 = Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0;

/// Executes a bind on QP `qpn` of PD `pd_id` (in send-queue order: the engine calls it when
/// the WR's turn comes). The error says why, for the MW_BIND_ERR completion.
pub fn bind(b: &MwBind, qp_pd: u64, qpn: u32) -> std::result::Result<(), String> {
    let index = b.mw_rkey & 0xffff_ff00;
    if !crate::mr::is_window_index(index) || b.new_rkey & 0xffff_ff00 != index {
        return Err(format!(
            "rkey {:#x} is not a key of memory window {:#x}",
            b.new_rkey, b.mw_rkey
        ));
    }
    let mw_type = b.mw_type;
    if b.length == 0 {
        if mw_type == 2 {
            return Err("a type-2 window cannot be bound with length 0".into());
        }
        unbind(index);
        return Ok(());
    }
    let mr = lookup_key(b.mr_lkey).map_err(|e| format!("MR lkey {:#x}: {e}", b.mr_lkey))?;
    if mr.lkey != b.mr_lkey || mr.window.is_some() {
        return Err(format!("lkey {:#x} is not an MR's", b.mr_lkey));
    }
    if mr.pd_id != qp_pd || b.mw_pd != qp_pd {
        return Err("the MR, the window and the QP are not all of one PD".into());
    }
    if !mr.access.contains(Access::MW_BIND) {
        return Err("the MR was registered without IBV_ACCESS_MW_BIND".into());
    }
    // LOCAL_WRITE is accepted and means nothing for a window (rdma-core's tests pass it);
    // anything else (zero-based addressing, MW_BIND) is refused.
    if b.access.0 & !(WINDOW_RIGHTS | Access::LOCAL_WRITE.0) != 0 {
        return Err(format!(
            "access {:#x}: a window grants remote read, write and atomic rights only",
            b.access.0
        ));
    }
    let rights = Access(b.access.0 & WINDOW_RIGHTS);
    let writes = rights.0 & (Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0) != 0;
    if writes && !mr.access.contains(Access::LOCAL_WRITE) {
        return Err("remote write or atomic rights need an MR with LOCAL_WRITE".into());
    }
    mr.check_range(b.addr, b.length, Access(0))
        .map_err(|e| format!("range {:#x}+{:#x}: {e}", b.addr, b.length))?;
    let end = b.addr + b.length;
    let entry = Arc::new(MrInner {
        lkey: 0,
        rkey: b.new_rkey,
        pd_id: qp_pd,
        iova: mr.iova,
        access: rights,
        region: mr.region.clone(),
        remote_valid: AtomicBool::new(true),
        window: Some((b.addr, end)),
        bound_qpn: (mw_type == 2).then_some(qpn),
        parent: Some(mr.clone()),
        mw_binds: AtomicU32::new(0),
    });
    with_table(|t| {
        if mw_type == 2 && t.iter().any(|(k, e)| k & 0xffff_ff00 == index && e.window.is_some()) {
            return Err("a type-2 window is bound already: invalidate it first".to_owned());
        }
        unbind_all(t, index);
        mr.mw_binds.fetch_add(1, Ordering::AcqRel);
        t.insert(b.new_rkey, entry);
        Ok(())
    })
    .unwrap_or_else(|| Err("key table poisoned".into()))?;
    tracing::debug!(
        rkey = format_args!("{:#x}", b.new_rkey),
        addr = b.addr,
        len = b.length,
        "bind_mw"
    );
    Ok(())
}

fn unbind(index: u32) {
    with_table(|t| unbind_all(t, index));
}

/// Removes the key-table entry `key` of a window, releasing its MR.
fn remove_entry(t: &mut HashMap<u32, Arc<MrInner>>, key: u32) {
    if let Some(old) = t.remove(&key) {
        if let Some(p) = &old.parent {
            p.mw_binds.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Removes every entry of the window with key index `index` (its upper 24 bits).
pub(crate) fn unbind_all(t: &mut HashMap<u32, Arc<MrInner>>, index: u32) {
    let bound: Vec<u32> = t
        .iter()
        .filter(|(k, e)| *k & 0xffff_ff00 == index && e.window.is_some())
        .map(|(k, _)| *k)
        .collect();
    for k in bound {
        remove_entry(t, k);
    }
}

/// Invalidates the bound window `rkey` of PD `pd_id` (LOCAL_INV, or a peer's
/// SEND_WITH_INV): its entry goes; the window can be bound again.
pub fn invalidate(rkey: u32, pd_id: u64) -> std::result::Result<(), KeyError> {
    with_table(|t| {
        let Some(e) = t.get(&rkey) else {
            return Err(KeyError::InvalidKey);
        };
        if e.window.is_none() {
            return Err(KeyError::InvalidKey);
        }
        if e.pd_id != pd_id {
            return Err(KeyError::WrongPd);
        }
        remove_entry(t, rkey);
        Ok(())
    })
    .unwrap_or(Err(KeyError::InvalidKey))
}

impl Mw {
    /// The window's PD id.
    pub fn pd_id(&self) -> u64 {
        self.pd_id
    }
}
