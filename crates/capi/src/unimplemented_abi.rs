//! Every imported symbol that this slice does not implement yet, failing honestly.
//!
//! The binaries are linked BIND_NOW, so each of these must exist for them to load at all.
//! Each has its real C signature and fails with the C convention of the real function and
//! `errno = ENOSYS`, printing `softrdma: NAME is not implemented yet (ENOSYS)` once per process
//! (see [`not_implemented_here`]). Nothing here pretends to succeed. The next slices move
//! functions out of this file as they implement them:
//! - verbs objects and data path (PD, MR, CQ, completion channel, QP, SRQ, AH, multicast);
//! - the connection manager (`rdma_*`);
//! - rsockets (`r*`).
//!
//! It also holds the data-path callbacks of `ibv_context.ops`, which the headers' inline
//! functions call without a NULL check; they fail the same way.

use std::ffi::{c_char, c_int, c_long, c_uint, c_void};

use libc::{nfds_t, off_t, pollfd, sockaddr, socklen_t};

use crate::abi::{
    ibv_ah, ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_context_ops, ibv_cq, ibv_gid, ibv_grh, ibv_mr, ibv_pd,
    ibv_qp, ibv_qp_attr, ibv_qp_ex, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_recv_wr, ibv_send_wr, ibv_srq,
    ibv_srq_init_attr, ibv_wc, rdma_addrinfo, rdma_cm_event, rdma_cm_id, rdma_cm_join_mc_attr_ex, rdma_conn_param,
    rdma_event_channel,
};
use crate::error::{not_implemented_here, ret_errno, ret_neg1, ret_or, ret_ptr, write_out};

/// The `ibv_context.ops` table of every context: the data-path slots point at the callbacks
/// below; memory windows are unsupported (NULL, which the inline functions report as
/// EOPNOTSUPP); the `_compat_*` slots are unused by current binaries.
pub(crate) fn context_ops() -> ibv_context_ops {
    let mut ops = ibv_context_ops::zeroed();
    ops.poll_cq = Some(ibv_poll_cq);
    ops.req_notify_cq = Some(ibv_req_notify_cq);
    ops.post_srq_recv = Some(ibv_post_srq_recv);
    ops.post_send = Some(ibv_post_send);
    ops.post_recv = Some(ibv_post_recv);
    ops
}

// ---- ibv_context.ops callbacks (not exported) ----

c_fn! {
    /// `ops.poll_cq`: a negative value on failure.
    fn ibv_poll_cq(_cq: *mut ibv_cq, _num_entries: c_int, _wc: *mut ibv_wc) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `ops.req_notify_cq`: 0 or errno.
    fn ibv_req_notify_cq(_cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `ops.post_send`: errno, with `*bad_wr` = the first WR.
    fn ibv_post_send(_qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
        // SAFETY: `bad_wr` is NULL or a valid out-pointer (C contract).
        unsafe { write_out(bad_wr, wr) };
        ret_errno(Err(not_implemented_here()))
    }

    /// `ops.post_recv`: errno, with `*bad_wr` = the first WR.
    fn ibv_post_recv(_qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
        // SAFETY: `bad_wr` is NULL or a valid out-pointer (C contract).
        unsafe { write_out(bad_wr, wr) };
        ret_errno(Err(not_implemented_here()))
    }

    /// `ops.post_srq_recv`: errno, with `*bad_wr` = the first WR.
    fn ibv_post_srq_recv(_srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
        // SAFETY: `bad_wr` is NULL or a valid out-pointer (C contract).
        unsafe { write_out(bad_wr, wr) };
        ret_errno(Err(not_implemented_here()))
    }
}

// ---- libibverbs ----

c_fn! {
    /// `struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *)`.
    #[symver = "IBVERBS_1.0"]
    fn ibv_create_comp_channel(_context: *mut ibv_context) -> *mut ibv_comp_channel {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `int ibv_destroy_comp_channel(struct ibv_comp_channel *)`: 0 or errno.
    #[symver = "IBVERBS_1.0"]
    fn ibv_destroy_comp_channel(_channel: *mut ibv_comp_channel) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `struct ibv_pd *ibv_alloc_pd(struct ibv_context *)`.
    #[symver = "IBVERBS_1.1"]
    fn ibv_alloc_pd(_context: *mut ibv_context) -> *mut ibv_pd {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `int ibv_dealloc_pd(struct ibv_pd *)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_dealloc_pd(_pd: *mut ibv_pd) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `struct ibv_mr *ibv_reg_mr(struct ibv_pd *, void *addr, size_t length, int access)`.
    #[symver = "IBVERBS_1.1"]
    fn ibv_reg_mr(_pd: *mut ibv_pd, _addr: *mut c_void, _length: usize, _access: c_int) -> *mut ibv_mr {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *, void *addr, size_t length,
    /// uint64_t iova, unsigned int access)`.
    #[symver = "IBVERBS_1.8"]
    fn ibv_reg_mr_iova2(_pd: *mut ibv_pd, _addr: *mut c_void, _length: usize, _iova: u64, _access: c_uint) -> *mut ibv_mr {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `int ibv_dereg_mr(struct ibv_mr *)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_dereg_mr(_mr: *mut ibv_mr) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `struct ibv_cq *ibv_create_cq(struct ibv_context *, int cqe, void *cq_context,
    /// struct ibv_comp_channel *, int comp_vector)`.
    #[symver = "IBVERBS_1.1"]
    fn ibv_create_cq(
        _context: *mut ibv_context,
        _cqe: c_int,
        _cq_context: *mut c_void,
        _channel: *mut ibv_comp_channel,
        _comp_vector: c_int,
    ) -> *mut ibv_cq {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `int ibv_destroy_cq(struct ibv_cq *)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_destroy_cq(_cq: *mut ibv_cq) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `int ibv_get_cq_event(struct ibv_comp_channel *, struct ibv_cq **, void **)`: 0, or -1
    /// and errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_get_cq_event(_channel: *mut ibv_comp_channel, _cq: *mut *mut ibv_cq, _cq_context: *mut *mut c_void) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `void ibv_ack_cq_events(struct ibv_cq *, unsigned int nevents)`: no CQ can exist yet,
    /// so there is nothing to acknowledge; sets errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_ack_cq_events(_cq: *mut ibv_cq, _nevents: c_uint) {
        ret_or(Err(not_implemented_here()), ())
    }

    /// `struct ibv_qp *ibv_create_qp(struct ibv_pd *, struct ibv_qp_init_attr *)`.
    #[symver = "IBVERBS_1.1"]
    fn ibv_create_qp(_pd: *mut ibv_pd, _qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `int ibv_modify_qp(struct ibv_qp *, struct ibv_qp_attr *, int attr_mask)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_modify_qp(_qp: *mut ibv_qp, _attr: *mut ibv_qp_attr, _attr_mask: c_int) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `int ibv_query_qp(struct ibv_qp *, struct ibv_qp_attr *, int attr_mask,
    /// struct ibv_qp_init_attr *)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_query_qp(
        _qp: *mut ibv_qp,
        _attr: *mut ibv_qp_attr,
        _attr_mask: c_int,
        _init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `int ibv_destroy_qp(struct ibv_qp *)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_destroy_qp(_qp: *mut ibv_qp) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *)`.
    #[symver = "IBVERBS_1.6"]
    fn ibv_qp_to_qp_ex(_qp: *mut ibv_qp) -> *mut ibv_qp_ex {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `struct ibv_srq *ibv_create_srq(struct ibv_pd *, struct ibv_srq_init_attr *)`.
    #[symver = "IBVERBS_1.1"]
    fn ibv_create_srq(_pd: *mut ibv_pd, _srq_init_attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `int ibv_destroy_srq(struct ibv_srq *)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_destroy_srq(_srq: *mut ibv_srq) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `struct ibv_ah *ibv_create_ah(struct ibv_pd *, struct ibv_ah_attr *)`.
    #[symver = "IBVERBS_1.1"]
    fn ibv_create_ah(_pd: *mut ibv_pd, _attr: *mut ibv_ah_attr) -> *mut ibv_ah {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *, struct ibv_wc *,
    /// struct ibv_grh *, uint8_t port_num)`.
    #[symver = "IBVERBS_1.1"]
    fn ibv_create_ah_from_wc(_pd: *mut ibv_pd, _wc: *mut ibv_wc, _grh: *mut ibv_grh, _port_num: u8) -> *mut ibv_ah {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `int ibv_destroy_ah(struct ibv_ah *)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_destroy_ah(_ah: *mut ibv_ah) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `int ibv_attach_mcast(struct ibv_qp *, const union ibv_gid *, uint16_t lid)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }

    /// `int ibv_detach_mcast(struct ibv_qp *, const union ibv_gid *, uint16_t lid)`: 0 or errno.
    #[symver = "IBVERBS_1.1"]
    fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
        ret_errno(Err(not_implemented_here()))
    }
}

// ---- librdmacm: connection manager ----

c_fn! {
    /// `struct rdma_event_channel *rdma_create_event_channel(void)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_create_event_channel() -> *mut rdma_event_channel {
        ret_ptr(Err(not_implemented_here()))
    }

    /// `void rdma_destroy_event_channel(struct rdma_event_channel *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_destroy_event_channel(_channel: *mut rdma_event_channel) {
        ret_or(Err(not_implemented_here()), ())
    }

    /// `int rdma_create_id(struct rdma_event_channel *, struct rdma_cm_id **, void *context,
    /// enum rdma_port_space ps)`: 0, or -1 and errno (as every `int rdma_*` call).
    #[symver = "RDMACM_1.0"]
    fn rdma_create_id(
        _channel: *mut rdma_event_channel,
        _id: *mut *mut rdma_cm_id,
        _context: *mut c_void,
        _ps: c_int,
    ) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_create_ep(struct rdma_cm_id **, struct rdma_addrinfo *, struct ibv_pd *,
    /// struct ibv_qp_init_attr *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_create_ep(
        _id: *mut *mut rdma_cm_id,
        _res: *mut rdma_addrinfo,
        _pd: *mut ibv_pd,
        _qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `void rdma_destroy_ep(struct rdma_cm_id *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_destroy_ep(_id: *mut rdma_cm_id) {
        ret_or(Err(not_implemented_here()), ())
    }

    /// `int rdma_destroy_id(struct rdma_cm_id *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_destroy_id(_id: *mut rdma_cm_id) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_bind_addr(struct rdma_cm_id *, struct sockaddr *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_bind_addr(_id: *mut rdma_cm_id, _addr: *mut sockaddr) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_resolve_addr(struct rdma_cm_id *, struct sockaddr *src, struct sockaddr *dst,
    /// int timeout_ms)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_resolve_addr(_id: *mut rdma_cm_id, _src: *mut sockaddr, _dst: *mut sockaddr, _timeout_ms: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_resolve_route(struct rdma_cm_id *, int timeout_ms)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_resolve_route(_id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_create_qp(struct rdma_cm_id *, struct ibv_pd *, struct ibv_qp_init_attr *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_create_qp(_id: *mut rdma_cm_id, _pd: *mut ibv_pd, _qp_init_attr: *mut ibv_qp_init_attr) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_create_qp_ex(struct rdma_cm_id *, struct ibv_qp_init_attr_ex *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_create_qp_ex(_id: *mut rdma_cm_id, _qp_init_attr: *mut ibv_qp_init_attr_ex) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `void rdma_destroy_qp(struct rdma_cm_id *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_destroy_qp(_id: *mut rdma_cm_id) {
        ret_or(Err(not_implemented_here()), ())
    }

    /// `int rdma_connect(struct rdma_cm_id *, struct rdma_conn_param *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_connect(_id: *mut rdma_cm_id, _conn_param: *mut rdma_conn_param) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_establish(struct rdma_cm_id *)`.
    #[symver = "RDMACM_1.2"]
    fn rdma_establish(_id: *mut rdma_cm_id) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_listen(struct rdma_cm_id *, int backlog)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_listen(_id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_get_request(_listen: *mut rdma_cm_id, _id: *mut *mut rdma_cm_id) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_accept(struct rdma_cm_id *, struct rdma_conn_param *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_accept(_id: *mut rdma_cm_id, _conn_param: *mut rdma_conn_param) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_reject(struct rdma_cm_id *, const void *private_data, uint8_t len)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_reject(_id: *mut rdma_cm_id, _private_data: *const c_void, _private_data_len: u8) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_disconnect(struct rdma_cm_id *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_disconnect(_id: *mut rdma_cm_id) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_join_multicast_ex(struct rdma_cm_id *, struct rdma_cm_join_mc_attr_ex *,
    /// void *context)`.
    #[symver = "RDMACM_1.1"]
    fn rdma_join_multicast_ex(
        _id: *mut rdma_cm_id,
        _mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
        _context: *mut c_void,
    ) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_leave_multicast(struct rdma_cm_id *, struct sockaddr *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut sockaddr) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_get_cm_event(struct rdma_event_channel *, struct rdma_cm_event **)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_get_cm_event(_channel: *mut rdma_event_channel, _event: *mut *mut rdma_cm_event) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_ack_cm_event(struct rdma_cm_event *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_ack_cm_event(_event: *mut rdma_cm_event) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_set_option(struct rdma_cm_id *, int level, int optname, void *optval,
    /// size_t optlen)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_set_option(
        _id: *mut rdma_cm_id,
        _level: c_int,
        _optname: c_int,
        _optval: *mut c_void,
        _optlen: usize,
    ) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_migrate_id(struct rdma_cm_id *, struct rdma_event_channel *)`.
    #[symver = "RDMACM_1.0"]
    fn rdma_migrate_id(_id: *mut rdma_cm_id, _channel: *mut rdma_event_channel) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rdma_getaddrinfo(const char *node, const char *service,
    /// const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)`: -1 and errno, as
    /// rdma-core fails when the CM is unavailable.
    #[symver = "RDMACM_1.0"]
    fn rdma_getaddrinfo(
        _node: *const c_char,
        _service: *const c_char,
        _hints: *const rdma_addrinfo,
        _res: *mut *mut rdma_addrinfo,
    ) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `void rdma_freeaddrinfo(struct rdma_addrinfo *)`: `rdma_getaddrinfo` never returns a
    /// list yet, so there is nothing to free.
    #[symver = "RDMACM_1.0"]
    fn rdma_freeaddrinfo(_res: *mut rdma_addrinfo) {
        ret_or(Err(not_implemented_here()), ())
    }

    /// `int rdma_init_qp_attr(struct rdma_cm_id *, struct ibv_qp_attr *, int *qp_attr_mask)`.
    #[symver = "RDMACM_1.2"]
    fn rdma_init_qp_attr(_id: *mut rdma_cm_id, _qp_attr: *mut ibv_qp_attr, _qp_attr_mask: *mut c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }
}

// ---- librdmacm: rsockets ----

c_fn! {
    /// `int rsocket(int domain, int type, int protocol)`.
    #[symver = "RDMACM_1.0"]
    fn rsocket(_domain: c_int, _type: c_int, _protocol: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rbind(int socket, const struct sockaddr *, socklen_t)`.
    #[symver = "RDMACM_1.0"]
    fn rbind(_socket: c_int, _addr: *const sockaddr, _addrlen: socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rlisten(int socket, int backlog)`.
    #[symver = "RDMACM_1.0"]
    fn rlisten(_socket: c_int, _backlog: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int raccept(int socket, struct sockaddr *, socklen_t *)`.
    #[symver = "RDMACM_1.0"]
    fn raccept(_socket: c_int, _addr: *mut sockaddr, _addrlen: *mut socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rconnect(int socket, const struct sockaddr *, socklen_t)`.
    #[symver = "RDMACM_1.0"]
    fn rconnect(_socket: c_int, _addr: *const sockaddr, _addrlen: socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rshutdown(int socket, int how)`.
    #[symver = "RDMACM_1.0"]
    fn rshutdown(_socket: c_int, _how: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rclose(int socket)`.
    #[symver = "RDMACM_1.0"]
    fn rclose(_socket: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `ssize_t rrecv(int socket, void *buf, size_t len, int flags)`.
    #[symver = "RDMACM_1.0"]
    fn rrecv(_socket: c_int, _buf: *mut c_void, _len: usize, _flags: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `ssize_t rsend(int socket, const void *buf, size_t len, int flags)`.
    #[symver = "RDMACM_1.0"]
    fn rsend(_socket: c_int, _buf: *const c_void, _len: usize, _flags: c_int) -> isize {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)`.
    #[symver = "RDMACM_1.0"]
    fn rpoll(_fds: *mut pollfd, _nfds: nfds_t, _timeout: c_int) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t)`.
    #[symver = "RDMACM_1.0"]
    fn rsetsockopt(_socket: c_int, _level: c_int, _optname: c_int, _optval: *const c_void, _optlen: socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *)`.
    #[symver = "RDMACM_1.0"]
    fn rgetsockopt(_socket: c_int, _level: c_int, _optname: c_int, _optval: *mut c_void, _optlen: *mut socklen_t) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `int rfcntl(int socket, int cmd, ... /* arg */)`: C-variadic; on x86_64 SysV the first
    /// variadic integer argument arrives in the same register as a third fixed `long`, so this
    /// signature is ABI-compatible (abi.md section 7).
    #[symver = "RDMACM_1.0"]
    fn rfcntl(_socket: c_int, _cmd: c_int, _arg: c_long) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset)`.
    #[symver = "RDMACM_1.0"]
    fn riomap(_socket: c_int, _buf: *mut c_void, _len: usize, _prot: c_int, _flags: c_int, _offset: off_t) -> off_t {
        ret_or(Err(not_implemented_here()), -1)
    }

    /// `int riounmap(int socket, void *buf, size_t len)`.
    #[symver = "RDMACM_1.0"]
    fn riounmap(_socket: c_int, _buf: *mut c_void, _len: usize) -> c_int {
        ret_neg1(Err(not_implemented_here()))
    }

    /// `size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)`:
    /// `(size_t)-1` and errno.
    #[symver = "RDMACM_1.0"]
    fn riowrite(_socket: c_int, _buf: *const c_void, _count: usize, _offset: off_t, _flags: c_int) -> usize {
        ret_or(Err(not_implemented_here()), usize::MAX)
    }
}
