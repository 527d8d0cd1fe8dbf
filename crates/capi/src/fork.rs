//! Fork support: `ibv_fork_init`, `ibv_is_fork_initialized`, `ibv_dontfork_range` and
//! `ibv_dofork_range`.
//!
//! A kernel RDMA driver pins registered pages, so a fork that makes them copy-on-write would
//! leave the device writing pages the parent no longer sees; rdma-core marks them
//! `MADV_DONTFORK` unless the kernel copies pinned pages at fork. softrdma pins nothing: its
//! transport reads and writes registered memory through the process's own mappings, which a
//! fork does not take from the parent. So fork protection is unneeded, exactly what
//! rdma-core answers on a kernel with copy-on-fork (`IBV_FORK_UNNEEDED`).

use std::ffi::{c_int, c_void};

/// `enum ibv_fork_status` `IBV_FORK_UNNEEDED`.
const IBV_FORK_UNNEEDED: c_int = 2;

c_fn! {
    /// `int ibv_fork_init(void)`: 0, nothing to set up.
    fn ibv_fork_init() -> c_int {
        0
    }

    /// `enum ibv_fork_status ibv_is_fork_initialized(void)`: `IBV_FORK_UNNEEDED`.
    fn ibv_is_fork_initialized() -> c_int {
        IBV_FORK_UNNEEDED
    }

    /// `int ibv_dontfork_range(void *base, size_t size)`: 0, nothing is pinned.
    fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
        0
    }

    /// `int ibv_dofork_range(void *base, size_t size)`: 0, nothing is pinned.
    fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
        0
    }
}
