//! `libmlx5.so.1` and `libefa.so.1` direct-verbs entry points imported by perftest.
//!
//! perftest is linked against both provider libraries, so (with BIND_NOW) their symbols must
//! exist. It only calls them for Mellanox/EFA devices, chosen by `vendor_part_id`, which a
//! softrdma device never has. These are final implementations, not placeholders: a softrdma
//! device is not an mlx5 or EFA device, so each fails exactly as the real provider does for a
//! foreign device: NULL with `errno = EOPNOTSUPP`, or the value EOPNOTSUPP.

use std::ffi::{c_int, c_void};

use crate::abi::{ibv_context, ibv_device, ibv_qp, ibv_qp_ex, ibv_qp_init_attr_ex};
use crate::error::{ret_errno, ret_ptr, CError};

fn not_mlx5() -> CError {
    CError::unsupported("not an mlx5 device")
}

fn not_efa() -> CError {
    CError::unsupported("not an EFA device")
}

c_fn! {
    /// `struct ibv_context *mlx5dv_open_device(struct ibv_device *, struct mlx5dv_context_attr *)`.
    fn mlx5dv_open_device(_device: *mut ibv_device, _attr: *mut c_void) -> *mut ibv_context {
        ret_ptr(Err(not_mlx5()))
    }

    /// `int mlx5dv_devx_general_cmd(struct ibv_context *, const void *in, size_t inlen,
    /// void *out, size_t outlen)`.
    fn mlx5dv_devx_general_cmd(
        _context: *mut ibv_context,
        _in: *const c_void,
        _inlen: usize,
        _out: *mut c_void,
        _outlen: usize,
    ) -> c_int {
        ret_errno(Err(not_mlx5()))
    }

    /// `struct ibv_qp *mlx5dv_create_qp(struct ibv_context *, struct ibv_qp_init_attr_ex *,
    /// struct mlx5dv_qp_init_attr *)`.
    fn mlx5dv_create_qp(
        _context: *mut ibv_context,
        _qp_attr: *mut ibv_qp_init_attr_ex,
        _mlx5_qp_attr: *mut c_void,
    ) -> *mut ibv_qp {
        ret_ptr(Err(not_mlx5()))
    }

    /// `struct mlx5dv_mkey *mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr *)`.
    fn mlx5dv_create_mkey(_mkey_init_attr: *mut c_void) -> *mut c_void {
        ret_ptr(Err(not_mlx5()))
    }

    /// `int mlx5dv_destroy_mkey(struct mlx5dv_mkey *)`.
    fn mlx5dv_destroy_mkey(_mkey: *mut c_void) -> c_int {
        ret_errno(Err(not_mlx5()))
    }

    /// `struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *)`: no softrdma QP
    /// is an mlx5 QP, so NULL (the real one is an unchecked cast).
    fn mlx5dv_qp_ex_from_ibv_qp_ex(_qp: *mut ibv_qp_ex) -> *mut c_void {
        ret_ptr(Err(not_mlx5()))
    }

    /// `int mlx5dv_crypto_login(struct ibv_context *, struct mlx5dv_crypto_login_attr *)`.
    fn mlx5dv_crypto_login(_context: *mut ibv_context, _login_attr: *mut c_void) -> c_int {
        ret_errno(Err(not_mlx5()))
    }

    /// `struct mlx5dv_dek *mlx5dv_dek_create(struct ibv_context *, struct mlx5dv_dek_init_attr *)`.
    fn mlx5dv_dek_create(_context: *mut ibv_context, _init_attr: *mut c_void) -> *mut c_void {
        ret_ptr(Err(not_mlx5()))
    }

    /// `int mlx5dv_dek_destroy(struct mlx5dv_dek *)`.
    fn mlx5dv_dek_destroy(_dek: *mut c_void) -> c_int {
        ret_errno(Err(not_mlx5()))
    }

    /// `struct ibv_qp *efadv_create_qp_ex(struct ibv_context *, struct ibv_qp_init_attr_ex *,
    /// struct efadv_qp_init_attr *, uint32_t inlen)`.
    fn efadv_create_qp_ex(
        _context: *mut ibv_context,
        _attr_ex: *mut ibv_qp_init_attr_ex,
        _efa_attr: *mut c_void,
        _inlen: u32,
    ) -> *mut ibv_qp {
        ret_ptr(Err(not_efa()))
    }

    /// `int efadv_query_device(struct ibv_context *, struct efadv_device_attr *, uint32_t inlen)`.
    fn efadv_query_device(_context: *mut ibv_context, _attr: *mut c_void, _inlen: u32) -> c_int {
        ret_errno(Err(not_efa()))
    }
}
