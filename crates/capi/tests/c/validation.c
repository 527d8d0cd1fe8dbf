/*
 * Validation (issue #12, scope 7): attributes checked against the device with the kernel's
 * errno, on rxe_lo.
 *   - modify_qp: pkey_index past pkey_tbl_len, port 2, path_mtu 0 and 99, min_rnr_timer 32,
 *     max_dest_rd_atomic and max_rd_atomic past the device's, timeout 32, retry_cnt 8,
 *     rnr_retry 8: EINVAL, and the QP keeps its state (query_qp never reports a refused
 *     value); the valid values then move it RESET -> INIT -> RTR -> RTS (a QP connected to
 *     itself).
 *   - create_cq: cqe 0, comp_vector past num_comp_vectors: EINVAL.
 *   - reg_mr: length 0: EINVAL.
 *   - dealloc_pd with a live AH, memory window, MR, QP or SRQ: EBUSY; 0 once they are gone.
 *   - create_ah: port 2, sgid_index past gid_tbl_len, no GRH: EINVAL.
 *   - What held already: post_send in RESET is EINVAL; an unknown QP state is EINVAL.
 *
 * Built by tests/dropin.rs against the installed headers, run with a config holding rxe_lo.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "open_dev.h"

static enum ibv_qp_state state_of(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &i))
		return (enum ibv_qp_state)-1;
	return a.qp_state;
}

/* modify_qp(attr, mask) must fail with EINVAL and leave the state alone. */
#define REFUSED(qp, attr, mask, what)                                                                  \
	do {                                                                                       \
		enum ibv_qp_state before_ = state_of(qp);                                          \
		int rc_ = ibv_modify_qp(qp, attr, mask);                                           \
		CHECK(rc_ == EINVAL && state_of(qp) == before_, "modify_qp %s: EINVAL (rc %d)", what, rc_); \
	} while (0)

int main(void)
{
	alarm(30);
	struct ibv_context *ctx = open_dev("rxe_lo");
	CHECK(ctx != NULL, "open rxe_lo");
	if (!ctx)
		return check_summary();
	struct ibv_device_attr dev;
	struct ibv_port_attr port;
	union ibv_gid gid;
	CHECK(ibv_query_device(ctx, &dev) == 0 && ibv_query_port(ctx, 1, &port) == 0 &&
		      ibv_query_gid(ctx, 1, 0, &gid) == 0,
	      "query device, port and GID 0");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	CHECK(pd && cq && qp, "PD, CQ and RC QP");
	if (!qp)
		return check_summary();

	/* What held already. */
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr ? mr->lkey : 0 };
	struct ibv_send_wr swr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;
	CHECK(ibv_post_send(qp, &swr, &bad) == EINVAL && bad == &swr, "post_send in RESET: EINVAL");
	struct ibv_qp_attr a = { .qp_state = 42 };
	REFUSED(qp, &a, IBV_QP_STATE, "to state 42");

	/* RESET -> INIT */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
	int init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	a.pkey_index = port.pkey_tbl_len;
	REFUSED(qp, &a, init_mask, "pkey_index = pkey_tbl_len");
	a.pkey_index = 999;
	REFUSED(qp, &a, init_mask, "pkey_index 999");
	a.pkey_index = 0;
	a.port_num = 2;
	REFUSED(qp, &a, init_mask, "port 2");
	a.port_num = 1;
	CHECK(ibv_modify_qp(qp, &a, init_mask) == 0, "INIT with valid values");

	/* INIT -> RTR, connected to itself. */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 1;
	int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	a.path_mtu = 0;
	REFUSED(qp, &a, rtr_mask, "path_mtu 0");
	a.path_mtu = 99;
	REFUSED(qp, &a, rtr_mask, "path_mtu 99");
	a.path_mtu = IBV_MTU_1024;
	a.min_rnr_timer = 32;
	REFUSED(qp, &a, rtr_mask, "min_rnr_timer 32");
	a.min_rnr_timer = 12;
	a.max_dest_rd_atomic = dev.max_qp_rd_atom + 1;
	REFUSED(qp, &a, rtr_mask, "max_dest_rd_atomic past max_qp_rd_atom");
	a.max_dest_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a, rtr_mask) == 0, "RTR with valid values");
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(qp, &q, IBV_QP_PATH_MTU | IBV_QP_PKEY_INDEX, &qi) == 0 && q.path_mtu == IBV_MTU_1024 &&
		      q.pkey_index == 0,
	      "query_qp reports the accepted path_mtu %d and pkey_index %d", q.path_mtu, q.pkey_index);

	/* RTR -> RTS */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	int rts_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		       IBV_QP_MAX_QP_RD_ATOMIC;
	a.timeout = 32;
	REFUSED(qp, &a, rts_mask, "timeout 32");
	a.timeout = 14;
	a.retry_cnt = 8;
	REFUSED(qp, &a, rts_mask, "retry_cnt 8");
	a.retry_cnt = 7;
	a.rnr_retry = 8;
	REFUSED(qp, &a, rts_mask, "rnr_retry 8");
	a.rnr_retry = 7;
	a.max_rd_atomic = dev.max_qp_init_rd_atom + 1;
	REFUSED(qp, &a, rts_mask, "max_rd_atomic past max_qp_init_rd_atom");
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a, rts_mask) == 0 && state_of(qp) == IBV_QPS_RTS, "RTS with valid values");

	/* create_cq and reg_mr */
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL, "create_cq cqe 0: EINVAL (%s)",
	      strerror(errno));
	errno = 0;
	CHECK(ibv_create_cq(ctx, 4, NULL, NULL, 1000) == NULL && errno == EINVAL,
	      "create_cq comp_vector 1000 (num_comp_vectors %d): EINVAL (%s)", ctx->num_comp_vectors, strerror(errno));
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL, "reg_mr length 0: EINVAL (%s)",
	      strerror(errno));

	/* create_ah against the device */
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } };
	aa.port_num = 2;
	errno = 0;
	CHECK(ibv_create_ah(pd, &aa) == NULL && errno == EINVAL, "create_ah port 2: EINVAL (%s)", strerror(errno));
	aa.port_num = 1;
	aa.grh.sgid_index = (uint8_t)(port.gid_tbl_len < 255 ? port.gid_tbl_len : 255);
	errno = 0;
	CHECK(ibv_create_ah(pd, &aa) == NULL && errno == EINVAL, "create_ah sgid_index %d (gid_tbl_len %d): EINVAL (%s)",
	      aa.grh.sgid_index, port.gid_tbl_len, strerror(errno));
	aa.grh.sgid_index = 0;
	aa.is_global = 0;
	errno = 0;
	CHECK(ibv_create_ah(pd, &aa) == NULL && errno == EINVAL, "create_ah without a GRH: EINVAL (%s)",
	      strerror(errno));
	aa.is_global = 1;

	/* dealloc_pd with users: EBUSY, one kind at a time. */
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	struct ibv_ah *ah = ibv_create_ah(pd2, &aa);
	CHECK(ah != NULL, "create_ah on a second PD");
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "dealloc_pd with a live AH: EBUSY");
	CHECK(ibv_destroy_ah(ah) == 0, "destroy_ah");
	struct ibv_mw *mw = ibv_alloc_mw(pd2, IBV_MW_TYPE_1);
	CHECK(mw != NULL, "alloc_mw");
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "dealloc_pd with a live memory window: EBUSY");
	CHECK(ibv_dealloc_mw(mw) == 0, "dealloc_mw");
	struct ibv_mr *mr2 = ibv_reg_mr(pd2, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "dealloc_pd with a live MR: EBUSY");
	CHECK(mr2 && ibv_dereg_mr(mr2) == 0, "dereg_mr");
	struct ibv_qp *qp2 = ibv_create_qp(pd2, &qa);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "dealloc_pd with a live QP: EBUSY");
	CHECK(qp2 && ibv_destroy_qp(qp2) == 0, "destroy_qp");
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd2, &sa);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "dealloc_pd with a live SRQ: EBUSY");
	CHECK(srq && ibv_destroy_srq(srq) == 0, "destroy_srq");
	CHECK(ibv_dealloc_pd(pd2) == 0, "dealloc_pd once nothing uses it");

	CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
	if (mr)
		ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	return check_summary();
}
