//! The one place where failures become C return values and `errno`.
//!
//! Rust code returns [`CResult`]; the exported function turns it into its C convention with
//! one of the `ret_*` helpers, which set `errno` (and, for loud errors, print one line). The
//! conventions used by rdma-core:
//! - pointer results: NULL + `errno` ([`ret_ptr`]);
//! - most `ibv_*` int results: 0, or the positive errno value (also stored in `errno`)
//!   ([`ret_errno`]);
//! - `rdma_*`, `r*` socket calls and some `ibv_*` calls: the value, or -1 + `errno`
//!   ([`ret_neg1`]);
//! - anything else: a caller-chosen failure value + `errno` ([`ret_or`]).
//!
//! [`guard`] wraps every exported function: a panic never unwinds into C; it becomes the
//! function's failure value with `errno = EIO`.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::ffi::c_int;
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, PoisonError};

/// A failure on its way to C: an errno, an optional message, and whether to print it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CError {
    errno: c_int,
    msg: Option<String>,
    loud: bool,
}

/// Result type of the Rust side of every exported function.
pub(crate) type CResult<T> = Result<T, CError>;

impl CError {
    /// An error with this errno and message (printed only if [`loud`](Self::loud)).
    pub(crate) fn new(errno: c_int, msg: impl Into<String>) -> CError {
        CError {
            errno,
            msg: Some(msg.into()),
            loud: false,
        }
    }

    /// EINVAL with a message.
    pub(crate) fn inval(msg: impl Into<String>) -> CError {
        CError::new(libc::EINVAL, msg)
    }

    /// EOPNOTSUPP with a message: the operation exists but this device cannot do it.
    pub(crate) fn unsupported(msg: impl Into<String>) -> CError {
        CError::new(libc::EOPNOTSUPP, msg)
    }

    /// Print the message to stderr when this error reaches C (for errors the user must fix,
    /// such as a bad `SOFTRDMA_CONFIG`, which rdma-core callers would only see as an errno).
    pub(crate) fn loud(mut self) -> CError {
        self.loud = true;
        self
    }

    /// The errno value.
    pub(crate) fn errno(&self) -> c_int {
        self.errno
    }
}

impl From<softrdma_verbs::Error> for CError {
    fn from(e: softrdma_verbs::Error) -> CError {
        CError::new(e.errno.raw(), e.msg)
    }
}

impl From<std::io::Error> for CError {
    fn from(e: std::io::Error) -> CError {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        CError::new(errno, e.to_string())
    }
}

/// Prints `softrdma: FUNC: msg` under `SOFTRDMA_DEBUG` (for a call that succeeds but did
/// less than asked).
pub(crate) fn debug_note(msg: &str) {
    if debug_enabled() {
        let func = CURRENT.with(Cell::get);
        stderr_line(format_args!("softrdma: {func}: {msg}"));
    }
}

/// A direct-verbs call of `lib` (`libmlx5.so.1`, `libefa.so.1`) on a softrdma device, which is
/// neither: sets `errno = EOPNOTSUPP` and returns EOPNOTSUPP, as the real provider answers for
/// a foreign device. Quiet unless `SOFTRDMA_DEBUG` is set: programs probe these on purpose.
pub(crate) fn not_this_device(name: &'static str, lib: &'static str) -> c_int {
    fail(CError::unsupported(format!(
        "{name}: not a device of {lib} (softrdma devices are rxe/siw-like)"
    )))
}

/// A compat name of libibverbs' pre-2006 ABI, whose structures have other layouts: sets
/// `errno = ENOSYS` and says so once per name and process.
pub(crate) fn compat_abi_unsupported(name: &'static str) {
    static SEEN: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    if SEEN.lock().unwrap_or_else(PoisonError::into_inner).insert(name) {
        stderr_line(format_args!(
            "softrdma: {name}@IBVERBS_1.0 is libibverbs' pre-2006 ABI, which softrdma does not serve (ENOSYS): rebuild the program against rdma-core"
        ));
    }
    set_errno(libc::ENOSYS);
}

/// NULL and `errno` on failure.
pub(crate) fn ret_ptr<T>(r: CResult<*mut T>) -> *mut T {
    r.unwrap_or_else(|e| {
        fail(e);
        std::ptr::null_mut()
    })
}

/// 0, or the positive errno value (also stored in `errno`).
pub(crate) fn ret_errno(r: CResult<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// The value, or -1 and `errno`.
pub(crate) fn ret_neg1(r: CResult<c_int>) -> c_int {
    r.unwrap_or_else(|e| {
        fail(e);
        -1
    })
}

/// The value, or `on_error` and `errno`.
pub(crate) fn ret_or<T>(r: CResult<T>, on_error: T) -> T {
    r.unwrap_or_else(|e| {
        fail(e);
        on_error
    })
}

/// For a `void` function's failure: stores the errno and prints the error under
/// `SOFTRDMA_DEBUG` (or when loud).
pub(crate) fn report(e: CError) {
    fail(e);
}

/// Stores the errno, prints loud errors, and returns the errno value.
fn fail(e: CError) -> c_int {
    if (e.loud && !quiet()) || debug_enabled() {
        let func = CURRENT.with(Cell::get);
        let desc = std::io::Error::from_raw_os_error(e.errno);
        match &e.msg {
            Some(msg) => stderr_line(format_args!("softrdma: {func}: {msg} ({desc})")),
            None => stderr_line(format_args!("softrdma: {func}: {desc}")),
        }
    }
    set_errno(e.errno);
    e.errno
}

/// `SOFTRDMA_QUIET=1`: the hints of loud errors are not printed (`SOFTRDMA_DEBUG=1` wins).
fn quiet() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| softrdma_verbs::settings::QUIET.is_on())
}

/// `SOFTRDMA_DEBUG=1`: print every failing call with its reason (not only the loud ones).
fn debug_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| softrdma_verbs::settings::DEBUG.is_on())
}

pub(crate) fn set_errno(errno: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, valid for writes
    // for the thread's lifetime.
    unsafe { *libc::__errno_location() = errno };
}

/// Writes one line to stderr, ignoring write errors (`eprintln!` would panic on them).
fn stderr_line(args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

thread_local! {
    /// The exported function being run on this thread, for messages.
    static CURRENT: Cell<&'static str> = const { Cell::new("?") };
}

/// What an exported function returns when it panicked (always a failure value).
pub(crate) trait PanicValue {
    /// The failure value.
    fn panic_value() -> Self;
}

impl PanicValue for () {
    fn panic_value() -> Self {}
}

/// `bool` results (`mlx5dv_is_supported`): false.
impl PanicValue for bool {
    fn panic_value() -> Self {
        false
    }
}

impl PanicValue for i32 {
    fn panic_value() -> Self {
        -1
    }
}

impl PanicValue for i64 {
    fn panic_value() -> Self {
        -1
    }
}

impl PanicValue for isize {
    fn panic_value() -> Self {
        -1
    }
}

/// `size_t` results (`riowrite`): `(size_t)-1`.
impl PanicValue for usize {
    fn panic_value() -> Self {
        usize::MAX
    }
}

/// `uint8_t` / `uint32_t` getters (`ibv_wc_read_sl`, `ibv_wc_read_opcode`): 0.
impl PanicValue for u8 {
    fn panic_value() -> Self {
        0
    }
}

impl PanicValue for u32 {
    fn panic_value() -> Self {
        0
    }
}

/// `__be16` results (`rdma_get_src_port`): 0.
impl PanicValue for u16 {
    fn panic_value() -> Self {
        0
    }
}

/// `__be64` results (`ibv_get_device_guid`): 0.
impl PanicValue for u64 {
    fn panic_value() -> Self {
        0
    }
}

impl<T> PanicValue for *mut T {
    fn panic_value() -> Self {
        std::ptr::null_mut()
    }
}

impl<T> PanicValue for *const T {
    fn panic_value() -> Self {
        std::ptr::null()
    }
}

/// Runs the body of exported function `name`: records the name for messages and turns a
/// panic into the function's failure value with `errno = EIO` (the panic hook has already
/// printed the panic message).
pub(crate) fn guard<R: PanicValue>(name: &'static str, body: impl FnOnce() -> R) -> R {
    init_logging();
    let outer = CURRENT.with(|c| c.replace(name));
    let result = catch_unwind(AssertUnwindSafe(body));
    CURRENT.with(|c| c.set(outer));
    result.unwrap_or_else(|_| {
        stderr_line(format_args!(
            "softrdma: internal error (panic) in {name}; returning failure"
        ));
        set_errno(libc::EIO);
        R::panic_value()
    })
}

/// Writes `value` through the out-parameter `out`, unless `out` is NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-NULL and valid for writes per this function's contract.
        unsafe { out.write(value) };
    }
}

/// A NULL-argument check: EINVAL naming the argument.
pub(crate) fn non_null<T>(p: *const T, what: &str) -> CResult<()> {
    if p.is_null() {
        return Err(CError::inval(format!("{what} is NULL")));
    }
    Ok(())
}

/// `SOFTRDMA_LOG=<filter>` prints the library's diagnostics to stderr (the CLI's setup,
/// `softrdma_verbs::logging`). Installed on the first call into the library; a host
/// application that installed its own subscriber keeps it.
fn init_logging() {
    softrdma_verbs::logging::init(softrdma_verbs::logging::LogUser::Library);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> c_int {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }

    #[test]
    fn conventions_set_errno() {
        assert_eq!(ret_errno(Err(CError::inval("x"))), libc::EINVAL);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(ret_neg1(Err(CError::new(libc::ENOENT, "x"))), -1);
        assert_eq!(errno(), libc::ENOENT);
        assert!(ret_ptr::<u8>(Err(CError::unsupported("x"))).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(ret_or(Err(CError::new(libc::ENOSYS, "x")), 7u64), 7);
        assert_eq!(errno(), libc::ENOSYS);
        assert_eq!(ret_neg1(Ok(5)), 5);
        assert_eq!(ret_errno(Ok(())), 0);
    }

    #[test]
    fn verbs_errors_keep_their_errno() {
        let e: CError = softrdma_verbs::Error::new(softrdma_verbs::Errno::NoDev, "gone").into();
        assert_eq!(e.errno(), libc::ENODEV);
    }

    #[test]
    fn panics_become_failure_values() {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r: c_int = guard("test_panic", || panic!("boom"));
        let p: *mut u8 = guard("test_panic", || panic!("boom"));
        std::panic::set_hook(hook);
        assert_eq!(r, -1);
        assert!(p.is_null());
        assert_eq!(errno(), libc::EIO);
        assert_eq!(guard("test_ok", || 3), 3);
    }
}
