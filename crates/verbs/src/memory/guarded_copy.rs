//! Copies into and out of application memory that turn a fault into an error.
//!
//! An application may `munmap` or `mprotect` registered memory behind softrdma's back (a
//! kernel RNIC would keep writing its pinned pages; softrdma goes through the process's own
//! mappings). A plain copy would then take SIGSEGV or SIGBUS on the progress thread and kill
//! the process. On x86-64 every such copy runs one `rep movsb` instruction whose address the
//! library knows, as the kernel's `copy_from_user` does with its exception table: a fault
//! handler that finds the faulting instruction there resumes at a fixup that returns the
//! number of bytes not copied. Any other fault goes to the handler that was installed before
//! (or to the default action, which kills the process as it would have without softrdma).
//! Elsewhere the copy is `process_vm_readv`/`process_vm_writev` on the own process, which
//! answers EFAULT (about 1.6 µs per call here against 3 ns for `rep movsb` at 8 bytes, and
//! 8 GB/s against 40 GB/s at 1 MiB; measured, see the README's security notes).
//!
//! The handler is installed on the first guarded copy. A program that installs its own
//! SIGSEGV handler later without chaining loses the guarantee (the fault then reaches its
//! handler, as it would have without softrdma).

use std::ffi::c_void;

/// Copies `len` bytes from `src` to `dst`; returns the number of bytes *not* copied (0 on
/// success). A fault on either side stops the copy; the bytes before it were copied.
///
/// # Safety
/// `dst` and `src` must not overlap, and neither range may belong to memory that Rust code
/// holds a reference to while the copy runs (the copy may race with other writers, exactly
/// as an RNIC's DMA would).
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    imp::copy(dst, src, len)
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::c_void;
    use std::sync::Once;
    use std::sync::OnceLock;

    // One instruction does the whole copy, so the fault handler recognises it by address.
    // SysV: rdi = dst, rsi = src, rdx = len; the direction flag is clear on entry. A fault
    // leaves rcx = the bytes not yet copied, and the handler resumes at the fixup, which
    // returns it (after a complete copy rcx is 0).
    std::arch::global_asm!(
        ".pushsection .text.softrdma_guarded_copy,\"ax\",@progbits",
        ".p2align 4",
        ".globl softrdma_guarded_copy",
        ".hidden softrdma_guarded_copy",
        ".type softrdma_guarded_copy,@function",
        "softrdma_guarded_copy:",
        "    mov rcx, rdx",
        ".globl softrdma_guarded_copy_insn",
        ".hidden softrdma_guarded_copy_insn",
        "softrdma_guarded_copy_insn:",
        "    rep movsb",
        ".globl softrdma_guarded_copy_fixup",
        ".hidden softrdma_guarded_copy_fixup",
        "softrdma_guarded_copy_fixup:",
        "    mov rax, rcx",
        "    ret",
        ".size softrdma_guarded_copy, .-softrdma_guarded_copy",
        ".popsection",
    );

    extern "C" {
        fn softrdma_guarded_copy(dst: *mut u8, src: *const u8, len: usize) -> usize;
        static softrdma_guarded_copy_insn: u8;
        static softrdma_guarded_copy_fixup: u8;
    }

    fn insn_addr() -> usize {
        // Only the address of the label is taken; it is never read.
        std::ptr::addr_of!(softrdma_guarded_copy_insn) as usize
    }

    fn fixup_addr() -> usize {
        std::ptr::addr_of!(softrdma_guarded_copy_fixup) as usize
    }

    /// The actions that were installed before ours, for SIGSEGV and SIGBUS.
    struct Previous(libc::sigaction);
    // SAFETY: a sigaction is plain data (handler address, mask, flags), written once before
    // it is published through the OnceLock and only read afterwards.
    unsafe impl Sync for Previous {}
    // SAFETY: see `Sync`.
    unsafe impl Send for Previous {}

    static PREV_SEGV: OnceLock<Previous> = OnceLock::new();
    static PREV_BUS: OnceLock<Previous> = OnceLock::new();

    fn previous(sig: libc::c_int) -> Option<&'static Previous> {
        match sig {
            libc::SIGSEGV => PREV_SEGV.get(),
            libc::SIGBUS => PREV_BUS.get(),
            _ => None,
        }
    }

    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        if !ctx.is_null() {
            // SAFETY: an SA_SIGINFO handler's third argument is the interrupted thread's
            // ucontext_t, which the kernel restores from on return.
            let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
            let rip = &mut uc.uc_mcontext.gregs[libc::REG_RIP as usize];
            if *rip as usize == insn_addr() {
                *rip = fixup_addr() as i64;
                return;
            }
        }
        chain(sig, info, ctx);
    }

    /// Hands a fault that is not ours to the previous action.
    fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        let Some(prev) = previous(sig) else {
            return restore_default(sig);
        };
        let handler = prev.0.sa_sigaction;
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            // Returning re-executes the faulting instruction under the default action, which
            // ends the process with the signal, as without softrdma.
            return restore_default(sig);
        }
        if prev.0.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the previous action was installed with SA_SIGINFO, so its handler has
            // the three-argument signature, and is called with what the kernel gave us.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(handler) };
            f(sig, info, ctx);
        } else {
            // SAFETY: without SA_SIGINFO the handler has the one-argument signature.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            f(sig);
        }
    }

    fn restore_default(sig: libc::c_int) {
        // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask and no flags.
        let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
        dfl.sa_sigaction = libc::SIG_DFL;
        // SAFETY: valid signal number and a fully initialised action; sigaction is
        // async-signal-safe.
        unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
    }

    fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            for (sig, slot) in [(libc::SIGSEGV, &PREV_SEGV), (libc::SIGBUS, &PREV_BUS)] {
                // SAFETY: zeroed is a valid sigaction (SIG_DFL, empty mask); the fields we
                // need are set below.
                let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
                act.sa_sigaction = on_fault as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
                // SAFETY: as above.
                let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
                // SAFETY: valid signal number, initialised action and out-pointer. The
                // previous action is published before ours can run, so a fault that is not
                // ours always finds it.
                unsafe {
                    libc::sigemptyset(&mut act.sa_mask);
                    libc::sigaction(sig, std::ptr::null(), &mut old);
                }
                let _ = slot.set(Previous(old));
                // SAFETY: as above.
                if unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) } != 0 {
                    tracing::warn!(sig, "guarded copy: installing the fault handler failed");
                }
            }
        });
    }

    pub(super) fn copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
        install();
        // SAFETY: the routine copies at most `len` bytes between the given ranges; a fault
        // inside it is turned into a short count by `on_fault` (the caller's contract covers
        // the rest).
        unsafe { softrdma_guarded_copy(dst, src, len) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::c_void;

    /// `process_vm_writev` when `dst` is the guarded side, else `process_vm_readv`: both
    /// answer EFAULT for an unmapped or protected range on either side.
    pub(super) fn copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
        let local = libc::iovec {
            iov_base: dst as *mut c_void,
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: src as *mut c_void,
            iov_len: len,
        };
        // SAFETY: the iovecs describe the caller's ranges; the kernel checks them.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if n < 0 {
            len
        } else {
            len - (n as usize).min(len)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::copy;

    /// Two pages of an anonymous mapping whose second page is `PROT_NONE` (memory an
    /// application protected behind softrdma's back); unmapped when dropped.
    pub(crate) struct HalfProtected {
        pub base: *mut u8,
        pub page: usize,
    }

    impl HalfProtected {
        pub(crate) fn new() -> HalfProtected {
            let page = 4096usize;
            // SAFETY: an anonymous private mapping of our own, checked below.
            let map = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    2 * page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(map, libc::MAP_FAILED);
            let base = map as *mut u8;
            // SAFETY: the second page of that mapping.
            assert_eq!(
                unsafe { libc::mprotect(base.add(page) as *mut _, page, libc::PROT_NONE) },
                0
            );
            HalfProtected { base, page }
        }
    }

    impl Drop for HalfProtected {
        fn drop(&mut self) {
            // SAFETY: the mapping `new` made; nothing uses it after the drop.
            unsafe { libc::munmap(self.base as *mut _, 2 * self.page) };
        }
    }

    #[test]
    fn copies_and_reports_faults_instead_of_dying() {
        let src = vec![7u8; 10_000];
        let mut dst = vec![0u8; 10_000];
        // SAFETY: two distinct live buffers of the given length.
        assert_eq!(unsafe { copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) }, 0);
        assert_eq!(dst, src);

        // Two pages, the second made inaccessible: the copy stops at the boundary.
        let m = HalfProtected::new();
        let (base, page) = (m.base, m.page);
        let src = vec![9u8; 2 * page];
        // SAFETY: the destination may fault; that is what is tested.
        let left = unsafe { copy(base.add(page / 2), src.as_ptr(), page) };
        assert_eq!(left, page / 2, "the copy stops where the protected page starts");
        let mut back = vec![0u8; page];
        // SAFETY: reading from a range whose second half faults.
        let left = unsafe { copy(back.as_mut_ptr(), base.add(page / 2), page) };
        assert_eq!(left, page / 2);
        assert!(back[..page / 2].iter().all(|&b| b == 9));
    }
}
