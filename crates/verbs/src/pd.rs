//! Protection domains.

use crate::context::Context;
use crate::memory::MemRegion;
use crate::mr::Mr;
use crate::wr::Access;
use crate::{bail, Result};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Shared state of a PD; the data path compares `id`s.
#[derive(Debug)]
pub struct PdInner {
    /// Process-unique id.
    pub id: u64,
    /// Live MRs registered in this PD.
    pub mr_count: AtomicU32,
    /// Live QPs and SRQs created in this PD.
    pub qp_count: AtomicU32,
    /// Live address handles and memory windows of this PD.
    pub ah_mw_count: AtomicU32,
    /// The context the PD was allocated on.
    pub context: Context,
    /// Counted against the device's `max_pd`.
    _charge: crate::quota::Charge,
}

/// An address handle's or memory window's hold on its PD (so `dealloc_pd` is EBUSY while it
/// lives) and on the device's `max_ah` / `max_mw`; released when dropped.
#[derive(Debug)]
pub struct PdUse {
    pd: Arc<PdInner>,
    _charge: crate::quota::Charge,
}

impl PdUse {
    /// Takes a use of `pd` for an object of `kind` (ENOMEM past the device's limit).
    pub(crate) fn take(pd: &Pd, kind: crate::quota::ObjKind, op: &str) -> Result<PdUse> {
        let charge = pd.context().charge(kind, op)?;
        pd.inner.ah_mw_count.fetch_add(1, Ordering::Relaxed);
        Ok(PdUse {
            pd: pd.inner.clone(),
            _charge: charge,
        })
    }
}

impl Drop for PdUse {
    fn drop(&mut self) {
        self.pd.ah_mw_count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A protection domain. Cloning shares it.
///
/// MRs and QPs live in a PD; a remote access is checked against the PD of the QP it arrives
/// on. A PD cannot be deallocated while its MRs or QPs exist:
///
/// ```
/// use softrdma_verbs::{Access, Context, Errno};
///
/// let ctx = Context::open_by_name("siw_lo")?;
/// let pd = ctx.alloc_pd()?;
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
/// let busy = pd.clone().dealloc().unwrap_err();
/// assert_eq!(busy.errno, Errno::Busy);
/// drop(mr); // deregisters
/// pd.dealloc()?;
/// # Ok::<(), softrdma_verbs::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Pd {
    inner: Arc<PdInner>,
}

impl Pd {
    pub(crate) fn new(context: Context, charge: crate::quota::Charge) -> Pd {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Pd {
            inner: Arc::new(PdInner {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                mr_count: AtomicU32::new(0),
                qp_count: AtomicU32::new(0),
                ah_mw_count: AtomicU32::new(0),
                context,
                _charge: charge,
            }),
        }
    }

    /// Process-unique id.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Shared state.
    pub fn inner(&self) -> &Arc<PdInner> {
        &self.inner
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.context
    }

    /// Registers application memory.
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid for reads and writes until the MR is deregistered
    /// (remote peers may write it at any time while the MR allows it).
    pub unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, iova: u64, access: Access) -> Result<Mr> {
        // SAFETY: forwarded from the caller's contract.
        let region = unsafe { MemRegion::from_raw(addr, len) };
        Mr::register(self, region, iova, access)
    }

    /// Re-registers `mr` in place (see [`Mr::rereg`]): into this PD if `move_here`, onto
    /// `addr..addr+len` at `iova` if given, with `access` if given.
    ///
    /// # Safety
    /// A new range must satisfy [`Pd::reg_mr_raw`]'s contract.
    pub unsafe fn rereg_mr_raw(
        &self,
        mr: &mut Mr,
        move_here: bool,
        translation: Option<(*mut u8, usize, u64)>,
        access: Option<Access>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        let translation = translation.map(|(addr, len, iova)| (unsafe { MemRegion::from_raw(addr, len) }, iova));
        mr.rereg(move_here.then_some(self), translation, access)
    }

    /// Allocates a zeroed buffer of `len` bytes owned by the MR and registers it.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<Mr> {
        let region = MemRegion::allocate(len);
        let iova = region.addr();
        Mr::register(self, region, iova, access)
    }

    /// Deallocates: EBUSY while MRs, QPs, SRQs, AHs or memory windows still use it (as
    /// the kernel's uverbs refuses to destroy a PD with users).
    pub fn dealloc(self) -> Result<()> {
        let mrs = self.inner.mr_count.load(Ordering::Relaxed);
        let qps = self.inner.qp_count.load(Ordering::Relaxed);
        let ahs = self.inner.ah_mw_count.load(Ordering::Relaxed);
        if mrs > 0 || qps > 0 || ahs > 0 {
            bail!(
                Busy,
                "dealloc_pd {}: still used by {mrs} MR(s), {qps} QP/SRQ(s) and {ahs} AH/MW(s)",
                self.inner.id
            );
        }
        Ok(())
    }
}
