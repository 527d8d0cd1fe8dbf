/*
 * Exercises a soft-RoCE device (rxe_lo) of the drop-in library through the real rdma-core
 * headers: what perftest and ibv_*_pingpong read from it (node and transport type, vendor ids,
 * port state and link layer, GID 0 = ::ffff:127.0.0.1 of type RoCE v2, the GID table, P_Key
 * 0), the emulated sysfs files, address handles (ibv_create_ah, ibv_init_ah_from_wc and
 * ibv_create_ah_from_wc over an IPv4 GRH area as the engine writes it), UD QPs, the UD send
 * path's AH check and multicast argument checks. No packet is sent.
 *
 * Built by tests/dropin.rs: cc -o roce_smoke roce_smoke.c <dropin>/libibverbs.so.1, run with a
 * config holding rxe_lo. Prints one line per check; exits 0 only if every check passed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <endian.h>
#include <arpa/inet.h>
#include <netinet/ip.h>
#include <infiniband/verbs.h>

#include "check.h"

/* Private libibverbs exports (rdma-core's driver.h, not installed); ibv_devinfo uses both. */
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

static const uint8_t LO_GID[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1 };

/* The 40 bytes in front of a UD receive of an IPv4 packet: 20 zero bytes, the IPv4 header. */
static void ipv4_grh(struct ibv_grh *grh, uint8_t ttl)
{
	uint8_t *raw = (uint8_t *)grh;
	struct iphdr ip;
	uint32_t sum = 0;
	uint16_t words[10];

	memset(raw, 0, 40);
	memset(&ip, 0, sizeof(ip));
	ip.version = 4;
	ip.ihl = 5;
	ip.tos = 0;
	ip.tot_len = htons(20 + 8 + 12 + 8 + 64 + 4);
	ip.ttl = ttl;
	ip.protocol = 17;
	ip.saddr = htonl(0x7f000001);
	ip.daddr = htonl(0x7f000001);
	memcpy(words, &ip, 20);
	for (int i = 0; i < 10; i++)
		sum += words[i];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	ip.check = (uint16_t)~sum;
	memcpy(raw + 20, &ip, 20);
}

static void address_handles(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_ah_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.port_num = 1;
	errno = 0;
	CHECK(ibv_create_ah(pd, &attr) == NULL && errno == EINVAL, "ibv_create_ah without a GRH: NULL/EINVAL");
	attr.is_global = 1;
	memcpy(attr.grh.dgid.raw, LO_GID, 16);
	attr.grh.hop_limit = 0xff;
	attr.grh.sgid_index = 0;
	struct ibv_ah *ah = ibv_create_ah(pd, &attr);
	CHECK(ah != NULL && ah->pd == pd && ah->context == ctx, "ibv_create_ah with a GRH (errno %d)", errno);
	attr.grh.sgid_index = 200;
	CHECK(ibv_create_ah(pd, &attr) == NULL && errno == EINVAL, "sgid_index past the table: NULL/EINVAL");

	struct ibv_grh grh;
	struct ibv_wc wc;
	struct ibv_ah_attr from;

	ipv4_grh(&grh, 64);
	memset(&wc, 0, sizeof(wc));
	wc.wc_flags = IBV_WC_GRH;
	wc.src_qp = 0x123;
	memset(&from, 0xee, sizeof(from));
	CHECK(ibv_init_ah_from_wc(ctx, 1, &wc, &grh, &from) == 0, "ibv_init_ah_from_wc (errno %d)", errno);
	CHECK(from.is_global == 1 && from.port_num == 1 && from.grh.sgid_index == 0 && from.grh.hop_limit == 64 &&
		      memcmp(from.grh.dgid.raw, LO_GID, 16) == 0 && from.dlid == 0,
	      "AH attributes from the IPv4 GRH: is_global=%d sgid_index=%d hop_limit=%d", from.is_global,
	      from.grh.sgid_index, from.grh.hop_limit);
	struct ibv_ah *back = ibv_create_ah_from_wc(pd, &wc, &grh, 1);
	CHECK(back != NULL, "ibv_create_ah_from_wc (errno %d)", errno);
	wc.wc_flags = 0;
	errno = 0;
	CHECK(ibv_init_ah_from_wc(ctx, 1, &wc, &grh, &from) == -1 && errno == EINVAL,
	      "a completion without IBV_WC_GRH: -1/EINVAL on RoCE");
	CHECK(ibv_create_ah_from_wc(pd, &wc, &grh, 1) == NULL && errno == EINVAL, "ibv_create_ah_from_wc: NULL/EINVAL");

	CHECK(back && ibv_destroy_ah(back) == 0, "ibv_destroy_ah (from wc)");
	CHECK(ah && ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
}

static void ud_qp(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr init;

	CHECK(cq != NULL, "ibv_create_cq");
	memset(&init, 0, sizeof(init));
	init.send_cq = cq;
	init.recv_cq = cq;
	init.cap.max_send_wr = 4;
	init.cap.max_recv_wr = 4;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	init.qp_type = IBV_QPT_UD;
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp != NULL && qp->qp_type == IBV_QPT_UD && qp->qp_num != 0, "UD QP on a RoCE device (errno %d)", errno);
	if (!qp)
		return;

	struct ibv_send_wr wr, *bad = NULL;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.wr.ud.ah = NULL;
	wr.wr.ud.remote_qpn = 1;
	wr.wr.ud.remote_qkey = 0x11111111;
	CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL && bad == &wr, "UD send without an AH: EINVAL, bad_wr set");

	union ibv_gid unicast;
	memcpy(unicast.raw, LO_GID, 16);
	CHECK(ibv_attach_mcast(qp, &unicast, 0) == EINVAL, "ibv_attach_mcast of a unicast GID: EINVAL");
	CHECK(ibv_detach_mcast(qp, &unicast, 0) == EINVAL, "ibv_detach_mcast of a unicast GID: EINVAL");

	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
}

int main(void)
{
	int num = -1;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_device *dev = NULL;

	CHECK(list != NULL, "ibv_get_device_list");
	for (int i = 0; list && i < num; i++)
		if (strcmp(ibv_get_device_name(list[i]), "rxe_lo") == 0)
			dev = list[i];
	CHECK(dev != NULL, "rxe_lo is listed");
	if (!dev)
		return 1;
	CHECK(dev->node_type == IBV_NODE_CA && dev->transport_type == IBV_TRANSPORT_IB,
	      "node_type CA, transport IB (%d, %d)", dev->node_type, dev->transport_type);

	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx != NULL, "ibv_open_device");
	if (!ctx)
		return 1;

	struct ibv_device_attr attr;
	CHECK(ibv_query_device(ctx, &attr) == 0, "ibv_query_device");
	CHECK(attr.vendor_id == 0xffffff && attr.vendor_part_id == 0, "vendor 0xffffff/0 (perftest: UNKNOWN)");
	CHECK(attr.atomic_cap == IBV_ATOMIC_HCA && attr.max_ah > 0 && attr.max_mcast_grp > 0 &&
		      attr.max_qp_rd_atom > 0 && attr.max_pkeys == 1,
	      "atomic_cap=%d max_ah=%d max_mcast_grp=%d max_qp_rd_atom=%d", attr.atomic_cap, attr.max_ah,
	      attr.max_mcast_grp, attr.max_qp_rd_atom);

	struct ibv_port_attr port;
	CHECK(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port");
	CHECK(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET &&
		      port.active_mtu == IBV_MTU_4096 && port.max_mtu == IBV_MTU_4096 && port.lid == 0 &&
		      port.pkey_tbl_len == 1 && port.gid_tbl_len >= 1 && !(port.port_cap_flags & IBV_PORT_SM),
	      "port: state=%d link_layer=%d active_mtu=%d gid_tbl_len=%d", port.state, port.link_layer,
	      port.active_mtu, port.gid_tbl_len);

	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0 && memcmp(gid.raw, LO_GID, 16) == 0, "GID[0] = ::ffff:127.0.0.1");
	struct ibv_gid_entry entry;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &entry, 0) == 0 && entry.gid_type == IBV_GID_TYPE_ROCE_V2 &&
		      entry.ndev_ifindex != 0,
	      "ibv_query_gid_ex: type %u (RoCE v2 = 2)", entry.gid_type);
	enum ibv_gid_type_sysfs type = IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
	CHECK(ibv_query_gid_type(ctx, 1, 0, &type) == 0 && type == IBV_GID_TYPE_SYSFS_ROCE_V2,
	      "ibv_query_gid_type: %d (sysfs RoCE v2 = 1)", type);
	struct ibv_gid_entry table[64];
	ssize_t n = ibv_query_gid_table(ctx, table, 64, 0);
	CHECK(n >= 1 && n < port.gid_tbl_len && memcmp(table[0].gid.raw, LO_GID, 16) == 0 &&
		      table[0].gid_type == IBV_GID_TYPE_ROCE_V2,
	      "ibv_query_gid_table (-> _ibv_query_gid_table@IBVERBS_1.11): %zd entries of %d", n, port.gid_tbl_len);
	errno = 0;
	CHECK(ibv_query_gid_ex(ctx, 1, port.gid_tbl_len - 1, &entry, 0) == ENODATA,
	      "ibv_query_gid_ex of an empty entry: ENODATA");
	__be16 pkey = 0;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && be16toh(pkey) == 0xffff, "P_Key[0] = 0xffff");

	char buf[64];
	CHECK(ibv_read_sysfs_file(dev->ibdev_path, "ports/1/gid_attrs/types/0", buf, sizeof(buf)) > 0 &&
		      strcmp(buf, "RoCE v2") == 0,
	      "sysfs gid_attrs/types/0 = RoCE v2");
	CHECK(ibv_read_sysfs_file(dev->ibdev_path, "ports/1/gid_attrs/ndevs/0", buf, sizeof(buf)) > 0 &&
		      strcmp(buf, "lo") == 0,
	      "sysfs gid_attrs/ndevs/0 = lo");
	CHECK(ibv_read_sysfs_file(dev->ibdev_path, "ports/1/link_layer", buf, sizeof(buf)) > 0 &&
		      strcmp(buf, "Ethernet") == 0,
	      "sysfs link_layer = Ethernet");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "ibv_alloc_pd");
	if (pd) {
		address_handles(ctx, pd);
		ud_qp(ctx, pd);
		struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1), *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		CHECK(mw1 && mw2 && mw1->pd == pd && mw2->type == IBV_MW_TYPE_2 && mw1->rkey != mw2->rkey,
		      "ibv_alloc_mw: types 1 and 2 (rkeys %#x, %#x)", mw1 ? mw1->rkey : 0, mw2 ? mw2->rkey : 0);
		errno = 0;
		CHECK(ibv_alloc_mw(pd, (enum ibv_mw_type)3) == NULL && errno == EINVAL, "ibv_alloc_mw of type 3: NULL/EINVAL");
		CHECK(mw1 && ibv_dealloc_mw(mw1) == 0 && mw2 && ibv_dealloc_mw(mw2) == 0, "ibv_dealloc_mw");
		CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	}
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);

	return check_summary();
}
