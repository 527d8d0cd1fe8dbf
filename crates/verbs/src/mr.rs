//! Memory regions and the process-wide key table.
//!
//! Keys are unguessable: 24 random bits from the OS CSPRNG plus an 8-bit generation counter,
//! never 0, never a key that is live. A deregistered key stops working at once: the table
//! entry is removed before `dereg` returns, so a remote access that races it fails the lookup.

use crate::memory::MemRegion;
use crate::pd::Pd;
use crate::wr::Access;
use crate::{bail, Errno, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

/// The registered state of one MR, shared with the data path.
#[derive(Debug)]
pub struct MrInner {
    /// Local key.
    pub lkey: u32,
    /// Remote key (the iWARP STag).
    pub rkey: u32,
    /// Owning protection domain id.
    pub pd_id: u64,
    /// Address the peer and the SGEs use for byte 0 of the region (`iova`).
    pub iova: u64,
    /// Access rights.
    pub access: Access,
    /// The memory (shared by a re-registration that keeps the translation).
    pub region: Arc<MemRegion>,
    /// Cleared by SEND_WITH_INV: the rkey then refuses remote access.
    pub remote_valid: AtomicBool,
    /// A memory window's entry: the bound range `[start, end)` inside its MR.
    pub window: Option<(u64, u64)>,
    /// A type-2 window: the only QP (by number) it may be used through.
    pub bound_qpn: Option<u32>,
    /// A memory window's MR.
    pub parent: Option<Arc<MrInner>>,
    /// Windows bound to this MR now (its deregistration waits for none: EBUSY).
    pub mw_binds: AtomicU32,
}

/// Why a key check failed. Maps onto iWARP Terminate codes and IB NAKs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// No such key, or it was invalidated.
    InvalidKey,
    /// The key belongs to another protection domain.
    WrongPd,
    /// The range leaves the region.
    Bounds,
    /// The region lacks the needed access flag.
    Rights,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyError::InvalidKey => "invalid key",
            KeyError::WrongPd => "key belongs to another protection domain",
            KeyError::Bounds => "range outside the memory region",
            KeyError::Rights => "access flag missing",
        })
    }
}

impl MrInner {
    /// A memory region (not a window) under `key` (its lkey and rkey), remotely valid.
    pub fn region(key: u32, pd_id: u64, iova: u64, access: Access, region: MemRegion) -> MrInner {
        MrInner {
            lkey: key,
            rkey: key,
            pd_id,
            iova,
            access,
            region: Arc::new(region),
            remote_valid: AtomicBool::new(true),
            window: None,
            bound_qpn: None,
            parent: None,
            mw_binds: AtomicU32::new(0),
        }
    }

    /// Checks `[addr, addr+len)` against the region and `need`; returns the byte offset.
    pub fn check_range(&self, addr: u64, len: u64, need: Access) -> std::result::Result<usize, KeyError> {
        if !self.access.contains(need) {
            return Err(KeyError::Rights);
        }
        if let Some((start, end)) = self.window {
            let last = addr.checked_add(len).ok_or(KeyError::Bounds)?;
            if addr < start || last > end {
                return Err(KeyError::Bounds);
            }
        }
        let off = addr.checked_sub(self.iova).ok_or(KeyError::Bounds)?;
        let end = off.checked_add(len).ok_or(KeyError::Bounds)?;
        if end > self.region.len() as u64 {
            return Err(KeyError::Bounds);
        }
        Ok(off as usize)
    }
}

#[derive(Default)]
struct KeyTable {
    by_key: HashMap<u32, Arc<MrInner>>,
    /// Key indices (upper 24 bits) of allocated memory windows, bound or not.
    mw_indices: std::collections::HashSet<u32>,
}

fn table() -> &'static RwLock<KeyTable> {
    // One table per fork generation: a child never waits for a lock the parent's progress
    // thread held at the fork, and the parent's keys mean nothing to the child's QPs.
    static T: crate::fork::PerProcess<RwLock<KeyTable>> = crate::fork::PerProcess::new();
    T.get_or_init(|| RwLock::new(KeyTable::default()))
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    if getrandom::getrandom(&mut b).is_err() {
        // The OS RNG failing is not input-reachable; fall back to time-seeded bits rather than panic.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0x5eed);
        return t.wrapping_mul(0x9e37_79b9);
    }
    u32::from_ne_bytes(b)
}

fn new_key(t: &KeyTable) -> u32 {
    static GEN: AtomicU32 = AtomicU32::new(0);
    loop {
        let gen = GEN.fetch_add(1, Ordering::Relaxed) & 0xff;
        let key = (random_u32() & 0xffff_ff00) | gen;
        if key != 0 && !t.by_key.contains_key(&key) && !t.mw_indices.contains(&(key & 0xffff_ff00)) {
            return key;
        }
    }
}

/// Looks up a key for the data path. Invalidated keys are reported as `InvalidKey`.
pub fn lookup_key(key: u32) -> std::result::Result<Arc<MrInner>, KeyError> {
    let t = table().read().map_err(|_| KeyError::InvalidKey)?;
    t.by_key.get(&key).cloned().ok_or(KeyError::InvalidKey)
}

/// Full remote-access check of a request arriving at QP `qpn`: key, PD, rights, bounds (and,
/// for a type-2 memory window, that it is bound to that QP). Returns the MR and the offset.
pub fn check_remote(
    rkey: u32,
    pd_id: u64,
    qpn: u32,
    addr: u64,
    len: u64,
    need: Access,
) -> std::result::Result<(Arc<MrInner>, usize), KeyError> {
    remote_match(lookup_key(rkey)?, rkey, pd_id, qpn, addr, len, need)
}

/// [`check_remote`]'s checks of a region already found under `rkey` (in whatever table).
pub fn remote_match(
    mr: Arc<MrInner>,
    rkey: u32,
    pd_id: u64,
    qpn: u32,
    addr: u64,
    len: u64,
    need: Access,
) -> std::result::Result<(Arc<MrInner>, usize), KeyError> {
    if mr.rkey != rkey || !mr.remote_valid.load(Ordering::Acquire) {
        return Err(KeyError::InvalidKey);
    }
    if mr.pd_id != pd_id {
        return Err(KeyError::WrongPd);
    }
    if mr.bound_qpn.is_some_and(|q| q != qpn) {
        return Err(KeyError::InvalidKey);
    }
    let off = mr.check_range(addr, len, need)?;
    Ok((mr, off))
}

/// Local-access check for an SGE (lkey, PD, bounds, and LOCAL_WRITE when `write`).
pub fn check_local(
    lkey: u32,
    pd_id: u64,
    addr: u64,
    len: u64,
    write: bool,
) -> std::result::Result<(Arc<MrInner>, usize), KeyError> {
    local_match(lookup_key(lkey)?, lkey, pd_id, addr, len, write)
}

/// [`check_local`]'s checks of a region already found under `lkey` (in whatever table).
pub fn local_match(
    mr: Arc<MrInner>,
    lkey: u32,
    pd_id: u64,
    addr: u64,
    len: u64,
    write: bool,
) -> std::result::Result<(Arc<MrInner>, usize), KeyError> {
    if mr.lkey != lkey || mr.window.is_some() {
        return Err(KeyError::InvalidKey);
    }
    if mr.pd_id != pd_id {
        return Err(KeyError::WrongPd);
    }
    let need = if write { Access::LOCAL_WRITE } else { Access(0) };
    let off = mr.check_range(addr, len, need)?;
    Ok((mr, off))
}

/// A registered memory region. Deregistered on drop (or explicitly with [`Mr::dereg`]).
///
/// Work requests name an MR's bytes with an [`Sge`](crate::Sge) (address, length, lkey); a
/// peer names them with the MR's address and rkey.
///
/// ```
/// use softrdma_verbs::{Access, Context};
///
/// let pd = Context::open_by_name("rxe_lo")?.alloc_pd()?;
/// let mr = pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)?;
/// mr.write(8, b"hello")?;
/// let mut out = [0u8; 5];
/// mr.read(8, &mut out)?;
/// assert_eq!(&out, b"hello");
/// let sge = mr.sge(8, 5); // for a SEND or WRITE of those 5 bytes
/// assert_eq!((sge.addr, sge.length, sge.lkey), (mr.addr() + 8, 5, mr.lkey()));
/// println!("a peer may write here: addr {:#x} rkey {:#x}", mr.addr(), mr.rkey());
/// # Ok::<(), softrdma_verbs::Error>(())
/// ```
#[derive(Debug)]
pub struct Mr {
    inner: Arc<MrInner>,
    pd: Arc<crate::pd::PdInner>,
    registered: bool,
    /// Counted against the device's `max_mr` while the MR lives.
    _charge: crate::quota::Charge,
}

impl Mr {
    pub(crate) fn register(pd: &Pd, region: MemRegion, iova: u64, access: Access) -> Result<Mr> {
        if access.0 & !Access::KNOWN_MASK != 0 {
            bail!(
                Inval,
                "reg_mr: unknown access flags {:#x}",
                access.0 & !Access::KNOWN_MASK
            );
        }
        let needs_local_write = access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
        if needs_local_write && !access.contains(Access::LOCAL_WRITE) {
            bail!(
                Inval,
                "reg_mr: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE (access {access})"
            );
        }
        region.check_mapped("reg_mr", access.contains(Access::LOCAL_WRITE))?;
        let charge = pd.context().charge(crate::quota::ObjKind::Mr, "reg_mr")?;
        let mut t = table()
            .write()
            .map_err(|_| Error::new(Errno::Io, "reg_mr: key table poisoned"))?;
        let key = new_key(&t);
        let inner = Arc::new(MrInner::region(key, pd.id(), iova, access, region));
        t.by_key.insert(key, inner.clone());
        drop(t);
        pd.inner().mr_count.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(lkey = format_args!("{key:#x}"), len = inner.region.len(), %access, "reg_mr");
        Ok(Mr {
            inner,
            pd: pd.inner().clone(),
            registered: true,
            _charge: charge,
        })
    }

    /// Re-registers in place (`ibv_rereg_mr`), keeping the keys, as Linux rxe does: a new
    /// PD, a new translation (`region` at `iova`) and/or new access rights. The key table
    /// switches to the new registration at once; on error nothing changed.
    pub fn rereg(
        &mut self,
        pd: Option<&Pd>,
        translation: Option<(MemRegion, u64)>,
        access: Option<Access>,
    ) -> Result<()> {
        if !self.registered {
            bail!(Inval, "rereg_mr: the MR is deregistered");
        }
        let access = access.unwrap_or(self.inner.access);
        if access.0 & !Access::KNOWN_MASK != 0 {
            bail!(
                Inval,
                "rereg_mr: unknown access flags {:#x}",
                access.0 & !Access::KNOWN_MASK
            );
        }
        let needs_local_write = access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
        if needs_local_write && !access.contains(Access::LOCAL_WRITE) {
            bail!(
                Inval,
                "rereg_mr: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE (access {access})"
            );
        }
        let (region, iova) = match translation {
            Some((r, iova)) => (Arc::new(r), iova),
            None => (self.inner.region.clone(), self.inner.iova),
        };
        region.check_mapped("rereg_mr", access.contains(Access::LOCAL_WRITE))?;
        let new_pd = pd.map(|p| p.inner().clone()).unwrap_or_else(|| self.pd.clone());
        let inner = Arc::new(MrInner {
            lkey: self.inner.lkey,
            rkey: self.inner.rkey,
            pd_id: new_pd.id,
            iova,
            access,
            region,
            remote_valid: AtomicBool::new(true),
            window: None,
            bound_qpn: None,
            parent: None,
            mw_binds: AtomicU32::new(0),
        });
        if self.inner.mw_binds.load(Ordering::Acquire) > 0 {
            bail!(
                Busy,
                "rereg_mr: memory windows are bound to the MR; invalidate or free them first"
            );
        }
        let mut t = table()
            .write()
            .map_err(|_| Error::new(Errno::Io, "rereg_mr: key table poisoned"))?;
        t.by_key.insert(inner.lkey, inner.clone());
        drop(t);
        if !Arc::ptr_eq(&new_pd, &self.pd) {
            new_pd.mr_count.fetch_add(1, Ordering::Relaxed);
            self.pd.mr_count.fetch_sub(1, Ordering::Relaxed);
            self.pd = new_pd;
        }
        tracing::debug!(lkey = format_args!("{:#x}", inner.lkey), len = inner.region.len(), %access, "rereg_mr");
        let old = std::mem::replace(&mut self.inner, inner);
        if !Arc::ptr_eq(&old.region, &self.inner.region) {
            // The old buffer may be freed once this returns: no access reaches it again.
            old.region.revoke();
        }
        Ok(())
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.inner.rkey
    }

    /// The address byte 0 is known by (what SGEs and peers use).
    pub fn addr(&self) -> u64 {
        self.inner.iova
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.region.len()
    }

    /// True for a zero-length MR.
    pub fn is_empty(&self) -> bool {
        self.inner.region.is_empty()
    }

    /// Access flags.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// An SGE covering `[offset, offset+len)` of this MR.
    pub fn sge(&self, offset: usize, len: u32) -> crate::wr::Sge {
        crate::wr::Sge {
            addr: self.inner.iova + offset as u64,
            length: len,
            lkey: self.inner.lkey,
        }
    }

    /// Copies bytes into the MR (the application writing its own buffer).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        if !self.inner.region.write(offset, data) {
            bail!(
                Inval,
                "MR {:#x}: write of {} bytes at {offset} is out of bounds (len {})",
                self.lkey(),
                data.len(),
                self.len()
            );
        }
        Ok(())
    }

    /// Copies bytes out of the MR.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        if !self.inner.region.read(offset, out) {
            bail!(
                Inval,
                "MR {:#x}: read of {} bytes at {offset} is out of bounds (len {})",
                self.lkey(),
                out.len(),
                self.len()
            );
        }
        Ok(())
    }

    /// One byte, read with a volatile load (for polling a flag byte a peer writes).
    pub fn read_byte_volatile(&self, offset: usize) -> Option<u8> {
        self.inner.region.read_volatile_u8(offset)
    }

    /// A copy of the whole MR contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        let _ = self.inner.region.read(0, &mut v);
        v
    }

    /// Raw pointer to byte 0 (for C callers and memory-polling latency loops).
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.region.as_ptr()
    }

    /// Shared registered state.
    pub fn inner(&self) -> &Arc<MrInner> {
        &self.inner
    }

    /// Deregisters now: the keys are invalid when this returns.
    pub fn dereg(mut self) -> Result<()> {
        self.unregister();
        Ok(())
    }

    fn unregister(&mut self) {
        if !self.registered {
            return;
        }
        self.registered = false;
        if let Ok(mut t) = table().write() {
            t.by_key.remove(&self.inner.lkey);
            // Windows still bound (the MR dropped without dereg) must not outlive it. Binds
            // and unbinds keep `mw_binds` under this lock, so with none bound there is
            // nothing to look for (the scan is over the whole table: without this check,
            // deregistering n MRs took O(n^2)).
            let inner = &self.inner;
            if inner.mw_binds.load(Ordering::Acquire) > 0 {
                t.by_key
                    .retain(|_, e| !e.parent.as_ref().is_some_and(|p| Arc::ptr_eq(p, inner)));
            }
        }
        // The keys are gone, so no new access starts; wait for the ones in progress. Then
        // the application may free the buffer: nothing touches it again.
        self.inner.region.revoke();
        self.pd.mr_count.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(lkey = format_args!("{:#x}", self.inner.lkey), "dereg_mr");
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.unregister();
    }
}

/// Invalidates a remote key on behalf of SEND_WITH_INV arriving on a QP of `pd_id`.
pub fn invalidate_remote(rkey: u32, pd_id: u64) -> std::result::Result<(), KeyError> {
    let mr = lookup_key(rkey)?;
    if mr.pd_id != pd_id {
        return Err(KeyError::WrongPd);
    }
    if mr.window.is_some() {
        return crate::mw::invalidate(rkey, pd_id);
    }
    mr.remote_valid.store(false, Ordering::Release);
    Ok(())
}

/// The key table's write side, for the memory-window module.
pub(crate) fn with_table<R>(f: impl FnOnce(&mut HashMap<u32, Arc<MrInner>>) -> R) -> Option<R> {
    let mut t = table().write().ok()?;
    Some(f(&mut t.by_key))
}

/// True if `index` (a key's upper 24 bits) belongs to an allocated memory window.
pub(crate) fn is_window_index(index: u32) -> bool {
    table()
        .read()
        .is_ok_and(|t| t.mw_indices.contains(&(index & 0xffff_ff00)))
}

/// A fresh key whose index (upper 24 bits) no live key uses, reserved for a new memory
/// window until [`release_window_key`].
pub(crate) fn new_window_key() -> Option<u32> {
    let mut t = table().write().ok()?;
    loop {
        let key = new_key(&t) & 0xffff_ff00;
        if key != 0 && !t.by_key.keys().any(|k| k & 0xffff_ff00 == key) {
            t.mw_indices.insert(key);
            return Some(key);
        }
    }
}

/// Frees a window's key index and removes its entry (bound or not).
pub(crate) fn release_window_key(key: u32) {
    if let Ok(mut t) = table().write() {
        let index = key & 0xffff_ff00;
        t.mw_indices.remove(&index);
        crate::mw::unbind_all(&mut t.by_key, index);
    }
}
