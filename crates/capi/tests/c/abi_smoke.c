/*
 * Exercises the drop-in library through the real rdma-core headers: the inline functions and
 * macros of <infiniband/verbs.h> (extended verbs_context path, ops table), the exported compat
 * calls, the verbs objects (PD, MR, completion channel, CQ, QP, SRQ) and their error
 * conventions, CM ids without a connection (bind, options, rdma_create_qp), rdma_getaddrinfo,
 * rpoll, and the error conventions of rsockets that are not connected.
 *
 * Built by tests/dropin.rs: cc -o abi_smoke abi_smoke.c <dropin>/libibverbs.so.1
 * Prints one line per check; exits 0 only if every check passed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <endian.h>
#include <poll.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include "check.h"

/* Private libibverbs exports (rdma-core's driver.h, not installed); ibv_devinfo uses both. */
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

/* libmlx5 / libefa entry points (declared here to avoid the provider headers). */
struct ibv_context *mlx5dv_open_device(struct ibv_device *device, void *attr);
int efadv_query_device(struct ibv_context *ibvctx, void *attr, uint32_t inlen);

static int compat_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
static void verbs_objects(struct ibv_context *ctx);
static void cm_objects(void);

/* rsockets: what rdma-core's rsocket refuses, and calls on a socket that is not connected. */
static void rsocket_bad_input(void)
{
	char buf[8];
	socklen_t len;
	int v, s;
	struct pollfd p;

	errno = 0;
	CHECK(rsocket(AF_UNIX, SOCK_STREAM, 0) == -1 && errno == EOPNOTSUPP, "rsocket(AF_UNIX): -1/EOPNOTSUPP");
	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) == -1 && errno == EOPNOTSUPP,
	      "rsocket(SOCK_CLOEXEC): -1/EOPNOTSUPP (type flags, as rdma-core)");
	errno = 0;
	CHECK(rfcntl(3, F_SETFL, 0) == -1 && errno == EBADF, "rfcntl (variadic) on a non-rsocket: -1/EBADF");
	errno = 0;
	CHECK(rrecv(12345, buf, 1, 0) == -1 && errno == EBADF, "rrecv on a non-rsocket: -1/EBADF");

	s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0, "rsocket(AF_INET, SOCK_STREAM)");
	if (s < 0)
		return;
	CHECK(rfcntl(s, F_GETFL) == O_RDWR, "rfcntl F_GETFL");
	CHECK(rfcntl(s, F_SETFL, O_NONBLOCK) == 0 && (rfcntl(s, F_GETFL) & O_NONBLOCK), "rfcntl F_SETFL O_NONBLOCK");
	errno = 0;
	CHECK(rfcntl(s, F_DUPFD, 0) == -1 && errno == EOPNOTSUPP, "rfcntl F_DUPFD: -1/EOPNOTSUPP");
	errno = 0;
	CHECK(rrecv(s, buf, sizeof(buf), 0) == -1 && errno == ENOTCONN, "rrecv before connect: -1/ENOTCONN");
	errno = 0;
	CHECK(rsend(s, buf, sizeof(buf), 0) == -1 && errno == ENOTCONN, "rsend before connect: -1/ENOTCONN");
	errno = 0;
	CHECK(rsend(s, NULL, 5, 0) == -1 && errno == EFAULT, "rsend(NULL, 5): -1/EFAULT");
	errno = 0;
	CHECK(rlisten(s, 1) == -1 && errno == EINVAL, "rlisten before rbind: -1/EINVAL");
	errno = 0;
	len = sizeof(buf);
	CHECK(rgetpeername(s, (struct sockaddr *)buf, &len) == -1 && errno == ENOTCONN, "rgetpeername: -1/ENOTCONN");
	v = 1;
	errno = 0;
	CHECK(rsetsockopt(s, SOL_SOCKET, SO_BROADCAST, &v, sizeof(v)) == -1 && errno == ENOPROTOOPT,
	      "rsetsockopt(SO_BROADCAST): -1/ENOPROTOOPT");
	errno = 0;
	CHECK(rsetsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, 2) == -1 && errno == EINVAL, "rsetsockopt with optlen 2: -1/EINVAL");
	len = sizeof(v);
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &v, &len) == 0 && v == 0 && len == sizeof(v), "rgetsockopt(SO_ERROR) = 0");
	errno = 0;
	CHECK(riowrite(s, buf, 4, 0, 0) == (size_t)-1 && errno == ENOTCONN, "riowrite before connect: -1/ENOTCONN");
	p.fd = s;
	p.events = POLLIN | POLLOUT;
	p.revents = 0;
	CHECK(rpoll(&p, 1, 0) == 1 && (p.revents & POLLOUT), "rpoll on a new rsocket: POLLOUT");
	CHECK(rclose(s) == 0, "rclose");
	errno = 0;
	CHECK(rclose(s) == -1 && errno == EBADF, "rclose twice: -1/EBADF");
}

int main(void)
{
	int num = -1;
	struct ibv_device **list = ibv_get_device_list(&num);

	CHECK(list != NULL, "ibv_get_device_list returns a list");
	if (!list)
		return 1;
	CHECK(num >= 1, "at least one device (num=%d)", num);
	CHECK(list[num] == NULL, "the list is NULL-terminated");
	if (num < 1)
		return 1;

	struct ibv_device *dev = list[0];
	CHECK(strcmp(ibv_get_device_name(dev), dev->name) == 0, "ibv_get_device_name == dev->name (%s)", dev->name);
	CHECK(dev->node_type == IBV_NODE_RNIC, "node_type is IBV_NODE_RNIC (%d)", dev->node_type);
	CHECK(dev->transport_type == IBV_TRANSPORT_IWARP, "transport_type is IBV_TRANSPORT_IWARP (%d)",
	      dev->transport_type);
	uint64_t guid = be64toh(ibv_get_device_guid(dev));
	CHECK(guid != 0, "node GUID %016llx", (unsigned long long)guid);

	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx != NULL, "ibv_open_device");
	if (!ctx)
		return 1;
	CHECK(ctx->device == dev, "context->device is the device");
	CHECK(verbs_get_ctx(ctx) != NULL, "verbs_get_ctx finds the extended context");
	CHECK(ctx->ops.post_send && ctx->ops.post_recv && ctx->ops.poll_cq && ctx->ops.req_notify_cq &&
		      ctx->ops.post_srq_recv,
	      "data-path ops slots are set");
	CHECK(ctx->num_comp_vectors >= 1, "num_comp_vectors = %d", ctx->num_comp_vectors);

	struct ibv_device_attr attr;
	memset(&attr, 0, sizeof(attr));
	CHECK(ibv_query_device(ctx, &attr) == 0, "ibv_query_device");
	CHECK(be64toh(attr.node_guid) == guid, "device_attr.node_guid matches ibv_get_device_guid");
	CHECK(attr.phys_port_cnt == 1 && attr.vendor_id == 0xffffff, "phys_port_cnt=%d vendor_id=0x%x",
	      attr.phys_port_cnt, attr.vendor_id);

	struct ibv_device_attr_ex attr_ex;
	memset(&attr_ex, 0xee, sizeof(attr_ex));
	CHECK(ibv_query_device_ex(ctx, NULL, &attr_ex) == 0, "ibv_query_device_ex (inline, extended slot)");
	CHECK(attr_ex.orig_attr.max_qp == attr.max_qp && attr_ex.completion_timestamp_mask == 0 &&
		      attr_ex.phys_port_cnt_ex == 1,
	      "device_attr_ex fields");

	struct ibv_port_attr port;
	memset(&port, 0xee, sizeof(port));
	CHECK(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port (macro -> verbs_context.query_port)");
	CHECK(port.state == IBV_PORT_ACTIVE || port.state == IBV_PORT_DOWN, "port state %d", port.state);
	CHECK(port.link_layer == IBV_LINK_LAYER_ETHERNET && port.gid_tbl_len == 1 && port.port_cap_flags2 == 0,
	      "link_layer=%d gid_tbl_len=%d port_cap_flags2=%d", port.link_layer, port.gid_tbl_len,
	      port.port_cap_flags2);
	CHECK(ibv_query_port(ctx, 2, &port) == EINVAL, "port 2 does not exist (EINVAL)");

	struct ibv_port_attr compat;
	memset(&compat, 0xee, sizeof(compat));
	CHECK(compat_query_port(ctx, 1, &compat) == 0, "exported ibv_query_port@IBVERBS_1.1 (compat)");
	CHECK(compat.port_cap_flags2 == 0xeeee, "compat call leaves port_cap_flags2 (bytes 48..51) alone");
	CHECK(compat.active_mtu == port.active_mtu && compat.state == port.state, "compat and extended agree");

	union ibv_gid gid;
	memset(&gid, 0, sizeof(gid));
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid index 0");
	int nonzero = 0;
	for (int i = 0; i < 16; i++)
		nonzero |= gid.raw[i];
	CHECK(nonzero, "GID[0] %02x%02x:%02x%02x:%02x%02x:... is not empty", gid.raw[0], gid.raw[1], gid.raw[2],
	      gid.raw[3], gid.raw[4], gid.raw[5]);
	errno = 0;
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == -1 && errno == EINVAL, "GID index 1 fails with -1/EINVAL");

	struct ibv_gid_entry entry;
	memset(&entry, 0xee, sizeof(entry));
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &entry, 0) == 0, "ibv_query_gid_ex (-> _ibv_query_gid_ex@IBVERBS_1.11)");
	ibv_query_gid(ctx, 1, 0, &gid);
	CHECK(memcmp(entry.gid.raw, gid.raw, 16) == 0 && entry.gid_index == 0 && entry.port_num == 1 &&
		      entry.gid_type == IBV_GID_TYPE_IB && entry.ndev_ifindex != 0,
	      "gid entry: type=%u ndev_ifindex=%u", entry.gid_type, entry.ndev_ifindex);
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &entry, 1) == EINVAL, "query_gid_ex flags must be 0");

	enum ibv_gid_type_sysfs type = IBV_GID_TYPE_SYSFS_ROCE_V2;
	CHECK(ibv_query_gid_type(ctx, 1, 0, &type) == 0 && type == IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
	      "ibv_query_gid_type@IBVERBS_PRIVATE_34 = %d", type);

	__be16 pkey;
	errno = 0;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == -1 && errno == ENOENT, "iWARP has no P_Key table (-1/ENOENT)");

	char buf[64];
	errno = 0;
	CHECK(ibv_read_sysfs_file(dev->ibdev_path, "board_id", buf, sizeof(buf)) < 0 && errno == ENOENT,
	      "ibv_read_sysfs_file(%s/board_id) fails with ENOENT", dev->ibdev_path);

	CHECK(strcmp(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error") == 0, "ibv_wc_status_str");
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0, "rdma_event_str");

	verbs_objects(ctx);
	cm_objects();

	rsocket_bad_input();

	/* Not an mlx5/EFA device: EOPNOTSUPP, as the real providers answer. */
	errno = 0;
	CHECK(mlx5dv_open_device(dev, NULL) == NULL && errno == EOPNOTSUPP, "mlx5dv_open_device: NULL/EOPNOTSUPP");
	CHECK(efadv_query_device(ctx, NULL, 0) == EOPNOTSUPP, "efadv_query_device: EOPNOTSUPP");

	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);

	return check_summary();
}

/* The exported compat symbol, as binaries built without the extended context call it. */
#undef ibv_query_port
static int compat_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
}

/* PD, MR, completion channel, CQ, QP and SRQ through the exported calls and the inline
 * data-path functions (ops table). */
static void verbs_objects(struct ibv_context *ctx)
{
	errno = 0;
	CHECK(ibv_dealloc_pd(NULL) == EINVAL && errno == EINVAL, "ibv_dealloc_pd(NULL): EINVAL");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd && pd->context == ctx, "ibv_alloc_pd");
	if (!pd)
		return;

	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr && mr->addr == buf && mr->length == sizeof(buf) && mr->pd == pd && mr->context == ctx &&
		      mr->lkey != 0 && mr->rkey != 0,
	      "ibv_reg_mr fills addr, length, pd, context, lkey, rkey");
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	CHECK(mr2 != NULL, "ibv_reg_mr with IBV_ACCESS_RELAXED_ORDERING (-> ibv_reg_mr_iova2, optional bit ignored)");
	CHECK(mr2 && ibv_dereg_mr(mr2) == 0, "ibv_dereg_mr");
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 64, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "REMOTE_WRITE without LOCAL_WRITE: NULL/EINVAL");

	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch && ch->fd >= 0 && fcntl(ch->fd, F_GETFL) >= 0 && ch->context == ctx,
	      "ibv_create_comp_channel: fd %d", ch ? ch->fd : -1);
	int cq_ctx;
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, &cq_ctx, ch, 0);
	CHECK(cq && cq->cqe >= 16 && cq->cq_context == &cq_ctx && cq->channel == ch && cq->context == ctx,
	      "ibv_create_cq: cqe=%d", cq ? cq->cqe : -1);
	struct ibv_cq *cq2 = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK(cq2 != NULL, "ibv_create_cq without a channel");
	CHECK(cq2 && ibv_req_notify_cq(cq2, 0) == 0, "req_notify_cq without a channel: 0 (no effect), as providers");
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "ibv_destroy_comp_channel while a CQ uses it: EBUSY");
	if (!cq || !cq2)
		return;

	struct ibv_wc wc[4];
	CHECK(ibv_poll_cq(cq, 4, wc) == 0, "ibv_poll_cq on an empty CQ: 0");

	struct ibv_qp_init_attr init = {
		.qp_context = &cq_ctx,
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 16 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp && qp->qp_num != 0 && qp->state == IBV_QPS_RESET && qp->context == ctx && qp->pd == pd &&
		      qp->send_cq == cq && qp->qp_context == &cq_ctx && init.cap.max_inline_data >= 16,
	      "ibv_create_qp: qp_num=%u state=%d", qp ? qp->qp_num : 0, qp ? (int)qp->state : -1);
	if (!qp)
		return;
	CHECK(ibv_destroy_cq(cq) == EBUSY, "ibv_destroy_cq while a QP uses it: EBUSY");
	struct ibv_qp_init_attr ud = init;
	ud.qp_type = IBV_QPT_UD;
	errno = 0;
	CHECK(ibv_create_qp(pd, &ud) == NULL && errno == EOPNOTSUPP, "a UD QP on iWARP: NULL/EOPNOTSUPP (as siw)");
	CHECK(ibv_qp_to_qp_ex(qp) == NULL && errno == EINVAL,
	      "ibv_qp_to_qp_ex of a QP made without send_ops_flags: NULL/EINVAL");
	errno = 0;
	CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_2) == NULL && errno == EOPNOTSUPP,
	      "ibv_alloc_mw on iWARP: NULL/EOPNOTSUPP (as siw)");
	/* Foreign pointers and objects of another type are refused, not dereferenced. */
	static char junk[1024] __attribute__((aligned(64)));
	memset(junk, 0x5a, sizeof junk);
	CHECK(ibv_dealloc_pd((struct ibv_pd *)junk) == EINVAL, "ibv_dealloc_pd of a foreign pointer: EINVAL");
	CHECK(ibv_dealloc_pd((struct ibv_pd *)cq) == EINVAL, "ibv_dealloc_pd of a CQ: EINVAL");
	CHECK(ibv_destroy_cq((struct ibv_cq *)junk) == EINVAL, "ibv_destroy_cq of a foreign pointer: EINVAL");
	CHECK(ibv_destroy_qp((struct ibv_qp *)junk) == EINVAL, "ibv_destroy_qp of a foreign pointer: EINVAL");
	CHECK(ibv_dereg_mr((struct ibv_mr *)junk) == EINVAL, "ibv_dereg_mr of a foreign pointer: EINVAL");
	CHECK(ibv_destroy_srq((struct ibv_srq *)junk) == EINVAL, "ibv_destroy_srq of a foreign pointer: EINVAL");
	CHECK(ibv_resize_cq((struct ibv_cq *)junk, 8) == EINVAL, "ibv_resize_cq of a foreign pointer: EINVAL");

	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				    .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0 &&
		      qp->state == IBV_QPS_INIT,
	      "ibv_modify_qp to INIT; qp->state follows (%d)", qp->state);
	attr.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == EINVAL && qp->state == IBV_QPS_INIT,
	      "INIT -> RTS is illegal: EINVAL, state unchanged");
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	memset(&qattr, 0xee, sizeof(qattr));
	CHECK(ibv_query_qp(qp, &qattr, IBV_QP_STATE | IBV_QP_CAP, &qinit) == 0 && qattr.qp_state == IBV_QPS_INIT &&
		      qattr.qp_access_flags == IBV_ACCESS_REMOTE_WRITE && qinit.cap.max_inline_data >= 16 &&
		      qinit.send_cq == cq && qinit.qp_type == IBV_QPT_RC && qinit.qp_context == &cq_ctx,
	      "ibv_query_qp");

	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr ? mr->lkey : 0 };
	struct ibv_send_wr swr[2], *bad_s = NULL;
	memset(swr, 0, sizeof(swr));
	swr[0].wr_id = 1;
	swr[0].next = &swr[1];
	swr[0].sg_list = &sge;
	swr[0].num_sge = 1;
	swr[0].opcode = IBV_WR_SEND;
	swr[1] = swr[0];
	swr[1].next = NULL;
	CHECK(ibv_post_send(qp, swr, &bad_s) == EINVAL && bad_s == &swr[0],
	      "post_send before RTS: EINVAL, *bad_wr = the first WR");

	struct ibv_recv_wr rwr[3], *bad_r = NULL;
	memset(rwr, 0, sizeof(rwr));
	for (int i = 0; i < 3; i++) {
		rwr[i].wr_id = 10 + i;
		rwr[i].next = i < 2 ? &rwr[i + 1] : NULL;
		rwr[i].sg_list = &sge;
		rwr[i].num_sge = 1;
	}
	rwr[2].num_sge = -1;
	CHECK(ibv_post_recv(qp, rwr, &bad_r) == EINVAL && bad_r == &rwr[2],
	      "post_recv chain with a bad third WR: the first two are posted, *bad_wr = the third");

	CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
	attr.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0 && qp->state == IBV_QPS_ERR, "ibv_modify_qp to ERR");
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 2000) == 1, "the flush makes the completion channel readable");
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq && ev_ctx == &cq_ctx,
	      "ibv_get_cq_event returns the CQ and its cq_context");
	ibv_ack_cq_events(cq, 1);
	CHECK(cq->comp_events_completed == 1, "ibv_ack_cq_events counts comp_events_completed");
	int n = ibv_poll_cq(cq, 4, wc);
	CHECK(n == 2 && wc[0].wr_id == 10 && wc[1].wr_id == 11 && wc[0].status == IBV_WC_WR_FLUSH_ERR &&
		      wc[0].opcode == IBV_WC_RECV && wc[0].qp_num == qp->qp_num,
	      "two flushed receives in order (n=%d)", n);
	int fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN, "O_NONBLOCK channel: -1/EAGAIN");

	struct ibv_srq_init_attr sattr = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sattr);
	CHECK(srq && srq->pd == pd && srq->context == ctx, "ibv_create_srq");
	if (srq) {
		struct ibv_recv_wr one = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
		CHECK(ibv_post_srq_recv(srq, &one, &bad) == 0, "ibv_post_srq_recv");
		CHECK(ibv_dealloc_pd(pd) == EBUSY, "ibv_dealloc_pd while objects use it: EBUSY");
		CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
	}

	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_cq(cq2) == 0, "ibv_destroy_cq");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
	CHECK(mr && ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
}

/* Event channel, a synchronous id bound to loopback, options, QP attributes, addrinfo, rpoll. */
static void cm_objects(void)
{
	struct rdma_event_channel *ech = rdma_create_event_channel();
	CHECK(ech && ech->fd >= 0, "rdma_create_event_channel: fd %d", ech ? ech->fd : -1);

	struct rdma_cm_id *id = NULL;
	int ctx_marker;
	CHECK(rdma_create_id(ech, &id, &ctx_marker, RDMA_PS_TCP) == 0 && id->channel == ech &&
		      id->context == &ctx_marker && id->ps == RDMA_PS_TCP && id->qp_type == IBV_QPT_RC &&
		      id->verbs == NULL,
	      "rdma_create_id (async)");
	errno = 0;
	CHECK(rdma_create_id(ech, &id, NULL, 0x4242) == -1 && errno == EINVAL, "unknown port space: -1/EINVAL");

	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&sin) == 0, "rdma_bind_addr 127.0.0.1:0");
	struct sockaddr_in *src = (struct sockaddr_in *)&id->route.addr.src_addr;
	CHECK(id->verbs && id->pd && id->pd->context == id->verbs && id->port_num == 1 &&
		      src->sin_family == AF_INET && src->sin_addr.s_addr == htonl(INADDR_LOOPBACK) && src->sin_port != 0,
	      "after bind: verbs, default pd, port_num 1, route.addr.src_addr with the chosen port");

	struct rdma_cm_id *id2 = NULL;
	CHECK(rdma_create_id(NULL, &id2, NULL, RDMA_PS_TCP) == 0 && id2->channel && id2->channel != ech,
	      "rdma_create_id (synchronous: a private channel)");
	CHECK(rdma_bind_addr(id2, (struct sockaddr *)&sin) == 0 && id2->verbs == id->verbs && id2->pd == id->pd,
	      "one context and default PD per device for the process");

	uint8_t tos = 8;
	int one = 1;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)) == 0, "set TOS");
	errno = 0;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, sizeof(one)) == -1 && errno == EINVAL,
	      "TOS with optlen 4: -1/EINVAL");
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)) == 0, "set REUSEADDR");
	errno = 0;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, 77, &one, sizeof(one)) == -1 && errno == ENOSYS,
	      "unknown option: -1/ENOSYS");

	struct ibv_qp_attr qa;
	int mask = 0;
	memset(&qa, 0, sizeof(qa));
	qa.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(id, &qa, &mask) == 0 && mask == (IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT) &&
		      qa.qp_access_flags == (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) && qa.port_num == 1,
	      "rdma_init_qp_attr INIT (iWARP: state, access, port)");
	errno = 0;
	CHECK(rdma_establish(id) == -1 && errno == EINVAL, "rdma_establish without CONNECT_RESPONSE: -1/EINVAL");

	struct ibv_qp_init_attr qinit = { .cap = { .max_send_wr = 2, .max_recv_wr = 3, .max_send_sge = 1,
						   .max_recv_sge = 1 },
					  .qp_type = IBV_QPT_RC };
	CHECK(rdma_create_qp(id, NULL, &qinit) == 0 && id->qp && id->qp->pd == id->pd && id->send_cq &&
		      id->recv_cq && id->send_cq != id->recv_cq && id->send_cq_channel && id->recv_cq_channel &&
		      id->recv_cq->cq_context == id && qinit.send_cq == id->send_cq && id->qp->state == IBV_QPS_INIT,
	      "rdma_create_qp with NULL pd and CQs: default PD, CQs with channels and cq_context = id, INIT");
	errno = 0;
	CHECK(rdma_create_qp(id, NULL, &qinit) == -1 && errno == EINVAL, "a second QP on the id: -1/EINVAL");
	rdma_destroy_qp(id);
	CHECK(id->qp == NULL && id->send_cq == NULL && id->recv_cq_channel == NULL,
	      "rdma_destroy_qp also destroys the CQs and channels it created");

	CHECK(rdma_destroy_id(id) == 0 && rdma_destroy_id(id2) == 0, "rdma_destroy_id");
	rdma_destroy_event_channel(ech);

	struct rdma_addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	CHECK(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res) == 0 && res && res->ai_src_addr &&
		      res->ai_src_len == sizeof(struct sockaddr_in) && !res->ai_dst_addr &&
		      res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC &&
		      ntohs(((struct sockaddr_in *)res->ai_src_addr)->sin_port) == 7471,
	      "rdma_getaddrinfo RAI_PASSIVE 127.0.0.1:7471 -> ai_src_addr");
	rdma_freeaddrinfo(res);
	hints.ai_flags = 0;
	res = NULL;
	CHECK(rdma_getaddrinfo("::1", "18515", &hints, &res) == 0 && res && res->ai_dst_addr &&
		      res->ai_family == AF_INET6 && res->ai_dst_len == sizeof(struct sockaddr_in6),
	      "rdma_getaddrinfo ::1 -> ai_dst_addr");
	rdma_freeaddrinfo(res);
	CHECK(rdma_getaddrinfo("no.such.host.invalid", "1", &hints, &res) != 0, "an unknown host fails (EAI_*)");
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL, "nothing to resolve: -1/EINVAL");

	int fds[2];
	if (pipe(fds) == 0) {
		struct pollfd p[2] = { { .fd = fds[0], .events = POLLIN }, { .fd = fds[1], .events = POLLOUT } };
		CHECK(rpoll(p, 2, 0) == 1 && p[1].revents == POLLOUT && p[0].revents == 0,
		      "rpoll passes ordinary fds to poll(2)");
		close(fds[0]);
		close(fds[1]);
	}
}
