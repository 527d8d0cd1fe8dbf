//! Verbs that need a kernel object softrdma does not have, answering as rdma-core does over
//! Linux rxe/siw, which lack them too:
//! - sharing a context's objects through its kernel command fd (`ibv_import_device`,
//!   `ibv_import_pd`/`_mr`/`_dm` and their `unimport`): a softrdma context has no such fd
//!   (its `cmd_fd` is /dev/null), so nothing can be imported: NULL with `errno = EOPNOTSUPP`;
//! - dma-buf registration (`ibv_reg_dmabuf_mr`): no device memory exists, EOPNOTSUPP;
//! - Enhanced Connection Establishment (`ibv_query_ece`, `ibv_set_ece`): neither rxe nor
//!   siw implements it, so the kernel answers EOPNOTSUPP.

use std::ffi::{c_int, c_void};

use crate::abi::{ibv_context, ibv_mr, ibv_pd, ibv_qp};
use crate::error::{ret_errno, ret_ptr, CError, CResult};
use crate::objects::SoftQp;

fn no_cmd_fd<T>(what: &str) -> CResult<*mut T> {
    Err(CError::unsupported(format!(
        "{what}: softrdma contexts have no kernel command channel to share objects through (cmd_fd is /dev/null)"
    )))
}

fn ece(qp: *mut ibv_qp, ece: *mut c_void, what: &str) -> CResult<()> {
    // SAFETY: `qp` is a QP of this library (C contract); only checked.
    unsafe { SoftQp::from_c(qp)? };
    crate::error::non_null(ece, "ece")?;
    Err(CError::unsupported(format!(
        "{what}: ECE is not supported (as by Linux rxe and siw)"
    )))
}

c_fn! {
    /// `struct ibv_context *ibv_import_device(int cmd_fd)`.
    fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
        ret_ptr(no_cmd_fd("import_device"))
    }

    /// `struct ibv_pd *ibv_import_pd(struct ibv_context *, uint32_t pd_handle)`.
    fn ibv_import_pd(_context: *mut ibv_context, _pd_handle: u32) -> *mut ibv_pd {
        ret_ptr(no_cmd_fd("import_pd"))
    }

    /// `void ibv_unimport_pd(struct ibv_pd *)`: no PD was ever imported; nothing to do.
    fn ibv_unimport_pd(_pd: *mut ibv_pd) {
        crate::error::report(CError::inval("unimport_pd: not an imported PD (none can be)"));
    }

    /// `struct ibv_mr *ibv_import_mr(struct ibv_pd *, uint32_t mr_handle)`.
    fn ibv_import_mr(_pd: *mut ibv_pd, _mr_handle: u32) -> *mut ibv_mr {
        ret_ptr(no_cmd_fd("import_mr"))
    }

    /// `void ibv_unimport_mr(struct ibv_mr *)`: no MR was ever imported; nothing to do.
    fn ibv_unimport_mr(_mr: *mut ibv_mr) {
        crate::error::report(CError::inval("unimport_mr: not an imported MR (none can be)"));
    }

    /// `struct ibv_dm *ibv_import_dm(struct ibv_context *, uint32_t dm_handle)`.
    fn ibv_import_dm(_context: *mut ibv_context, _dm_handle: u32) -> *mut c_void {
        ret_ptr(no_cmd_fd("import_dm"))
    }

    /// `void ibv_unimport_dm(struct ibv_dm *)`: no DM was ever imported; nothing to do.
    fn ibv_unimport_dm(_dm: *mut c_void) {
        crate::error::report(CError::inval("unimport_dm: not an imported DM (none can be)"));
    }

    /// `struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *, uint64_t offset, size_t length,
    /// uint64_t iova, int fd, int access)`.
    fn ibv_reg_dmabuf_mr(_pd: *mut ibv_pd, _offset: u64, _length: usize, _iova: u64, _fd: c_int, _access: c_int) -> *mut ibv_mr {
        ret_ptr::<ibv_mr>(Err(CError::unsupported(
            "reg_dmabuf_mr: dma-buf memory is not supported (as by Linux rxe and siw); register host memory with ibv_reg_mr",
        )))
    }

    /// `int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)`: EOPNOTSUPP.
    fn ibv_query_ece(qp: *mut ibv_qp, ece_out: *mut c_void) -> c_int {
        ret_errno(ece(qp, ece_out, "query_ece"))
    }

    /// `int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)`: EOPNOTSUPP.
    fn ibv_set_ece(qp: *mut ibv_qp, ece_in: *mut c_void) -> c_int {
        ret_errno(ece(qp, ece_in, "set_ece"))
    }
}
