/*
 * Exercises the drop-in library through the real rdma-core headers: the inline functions and
 * macros of <infiniband/verbs.h> (extended verbs_context path), the exported compat calls,
 * and the failure conventions of the entry points that are not implemented yet.
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
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

/* Private libibverbs exports (rdma-core's driver.h, not installed); ibv_devinfo uses both. */
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

/* libmlx5 / libefa entry points (declared here to avoid the provider headers). */
struct ibv_context *mlx5dv_open_device(struct ibv_device *device, void *attr);
int efadv_query_device(struct ibv_context *ibvctx, void *attr, uint32_t inlen);

static int failures;

#define CHECK(cond, ...)                                              \
	do {                                                          \
		if (cond) {                                           \
			printf("ok   ");                              \
		} else {                                              \
			printf("FAIL ");                              \
			failures++;                                   \
		}                                                     \
		printf(__VA_ARGS__);                                  \
		printf("   [%s:%d]\n", __FILE__, __LINE__);           \
	} while (0)

static int compat_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);

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

	/* Not implemented yet: documented failure values with ENOSYS. */
	errno = 0;
	CHECK(ibv_alloc_pd(ctx) == NULL && errno == ENOSYS, "ibv_alloc_pd: NULL/ENOSYS");
	CHECK(ibv_dealloc_pd(NULL) == ENOSYS, "ibv_dealloc_pd: returns ENOSYS");
	errno = 0;
	CHECK(rdma_create_event_channel() == NULL && errno == ENOSYS, "rdma_create_event_channel: NULL/ENOSYS");
	errno = 0;
	CHECK(rdma_create_id(NULL, NULL, NULL, RDMA_PS_TCP) == -1 && errno == ENOSYS, "rdma_create_id: -1/ENOSYS");
	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_STREAM, 0) == -1 && errno == ENOSYS, "rsocket: -1/ENOSYS");
	errno = 0;
	CHECK(rfcntl(3, F_SETFL, 0) == -1 && errno == ENOSYS, "rfcntl (variadic): -1/ENOSYS");
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	struct ibv_qp fake_qp = { .context = ctx };
	CHECK(ibv_post_send(&fake_qp, &wr, &bad) == ENOSYS && bad == &wr, "ops.post_send: ENOSYS, *bad_wr = wr");

	/* Not an mlx5/EFA device: EOPNOTSUPP, as the real providers answer. */
	errno = 0;
	CHECK(mlx5dv_open_device(dev, NULL) == NULL && errno == EOPNOTSUPP, "mlx5dv_open_device: NULL/EOPNOTSUPP");
	CHECK(efadv_query_device(ctx, NULL, 0) == EOPNOTSUPP, "efadv_query_device: EOPNOTSUPP");

	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);

	printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
	return failures ? 1 : 0;
}

/* The exported compat symbol, as binaries built without the extended context call it. */
#undef ibv_query_port
static int compat_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
}
