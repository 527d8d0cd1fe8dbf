//! softrdma's drop-in C library: one shared object that is `libibverbs.so.1`,
//! `librdmacm.so.1`, `libmlx5.so.1` and `libefa.so.1` at once (symlinks to `libsoftrdma.so`,
//! SONAME `libibverbs.so.1`), so unmodified rdma-core binaries run over softrdma devices with
//! `LD_LIBRARY_PATH=<dir>`. `cargo xtask dropin` builds that directory.
//!
//! Layout of the crate:
//! - [`abi`]: `#[repr(C)]` mirrors of the rdma-core 44 structs, with layout checks.
//! - [`error`]: the only place where failures become return values and `errno`; the panic guard.
//! - `device`, `context`, `strings`, `sysfs`: the device list (soft-iWARP `siw_*` devices are
//!   RNIC/iWARP, soft-RoCE `rxe_*` devices CA/InfiniBand as Linux rxe), open/close, query
//!   device/port/GID/P_Key, string helpers, and the emulated sysfs tree of each device.
//! - `objects`: PDs, MRs, completion channels, CQs, QPs and SRQs. Each is a `#[repr(C)]`
//!   struct whose first field is the C header (const-asserted at offset 0), created with
//!   `Box::into_raw` and freed only by its destroy call.
//! - `ah`: address handles (`ibv_create_ah`, `ibv_create_ah_from_wc`, `ibv_init_ah_from_wc`)
//!   and QP multicast (`ibv_attach_mcast` / `ibv_detach_mcast`); RoCE devices only.
//! - `datapath`: the `ibv_context.ops` callbacks (poll, notify, post send/recv/SRQ recv) the
//!   headers' inline functions call; they cast the object pointer, no lookup (except the AH
//!   of a UD send WR, which is checked against the live AHs).
//! - `cm`, `addrinfo`: librdmacm over `softrdma-cm` (event channels, ids, events,
//!   `rdma_create_ep`/`rdma_get_request`, `rdma_getaddrinfo`, `rpoll`).
//! - `vendor_dv`: `mlx5dv_*` / `efadv_*`, which fail with EOPNOTSUPP as the real providers do
//!   for a device that is not theirs.
//! - `unimplemented_abi`: every other imported symbol (rsockets), failing with
//!   ENOSYS until a later slice implements it.
//!
//! Every exported function is declared with [`c_fn!`], which wraps its body in
//! [`error::guard`] (no panic crosses `extern "C"`) and gives it its real symbol version
//! (`ibv_get_device_list@@IBVERBS_1.1`) with `.symver`; the Rust function itself stays local.
//! The version nodes are defined by the version script that `build.rs` writes.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

/// Declares `unsafe extern "C"` functions whose bodies run inside [`error::guard`]; with
/// `#[symver = "NODE"]` the function is also exported from the shared object as
/// `name@@NODE` (default version). Without it, it is a callback for a C function-pointer slot.
///
/// The Rust symbol is mangled and local: only the versioned C name is exported. In unit tests
/// (`cfg(test)`) the `.symver` directive is left out, since a test executable has no version
/// script.
macro_rules! c_fn {
    ($(
        $(#[doc = $doc:literal])*
        $(#[symver = $ver:literal])?
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Called from C: every pointer argument must satisfy the C API's contract.
        #[cfg_attr(test, allow(dead_code))]
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            $crate::error::guard(stringify!($name), move || $body)
        }
        $(
            #[cfg(not(test))]
            ::core::arch::global_asm!(
                ".globl {f}",
                concat!(".symver {f}, ", stringify!($name), "@@", $ver),
                f = sym $name,
            );
        )?
    )*};
}

pub mod abi;
mod addrinfo;
mod ah;
mod cm;
mod context;
mod datapath;
mod device;
mod error;
mod objects;
mod strings;
mod sysfs;
mod unimplemented_abi;
mod vendor_dv;
