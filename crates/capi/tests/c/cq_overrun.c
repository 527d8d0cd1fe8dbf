/*
 * CQ overrun (issue #12, scope 5) on rxe_lo: an RC QP connected to itself, its send CQ of 4
 * entries, 64 signaled RDMA WRITEs posted and nothing polled until they had time to complete.
 * As IBTA says (and Linux rxe does), the overrun is an error: IBV_EVENT_CQ_ERR naming the CQ
 * on async_fd, the QP moved to ERR (ibv_query_qp), and the CQ still hands out every completion
 * it queued (4, all successful). Posting to the QP afterwards gives flushed completions.
 *
 * Built by tests/dropin.rs against the installed headers, run with a config holding rxe_lo.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "open_dev.h"

#define CQE 4
#define WRS 64

static int drain(struct ibv_cq *cq, int *ok, int *flushed, int *other)
{
	struct ibv_wc wc[8];
	int got = 0, n;
	while ((n = ibv_poll_cq(cq, 8, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			if (wc[i].status == IBV_WC_SUCCESS)
				(*ok)++;
			else if (wc[i].status == IBV_WC_WR_FLUSH_ERR)
				(*flushed)++;
			else
				(*other)++;
		}
		got += n;
	}
	return got;
}

int main(void)
{
	alarm(30);
	struct ibv_context *ctx = open_dev("rxe_lo");
	CHECK(ctx != NULL, "open rxe_lo");
	if (!ctx)
		return check_summary();
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "GID 0");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *scq = ibv_create_cq(ctx, CQE, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	static char src[4096], dst[4096];
	struct ibv_mr *smr = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof(dst), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp_init_attr qa = { .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
				       .cap = { .max_send_wr = WRS, .max_recv_wr = 4, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	CHECK(pd && scq && rcq && smr && dmr && qp, "PD, CQs of %d and 16 entries, MRs, RC QP", CQE);
	if (!qp || !smr || !dmr)
		return check_summary();

	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 1;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
	      "RTR, connected to itself");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "RTS");

	int posted = 0;
	for (int i = 0; i < WRS; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)src + (i % 64) * 64, .length = 64, .lkey = smr->lkey };
		struct ibv_send_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE },
				   *bad;
		wr.wr.rdma.remote_addr = (uintptr_t)dst + (i % 64) * 64;
		wr.wr.rdma.rkey = dmr->rkey;
		if (ibv_post_send(qp, &wr, &bad))
			break;
		posted++;
	}
	CHECK(posted == WRS, "%d signaled WRITEs posted to a QP whose send CQ holds %d", posted, CQE);

	/* The overrun is reported: CQ_ERR on the CQ (bounded wait). */
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int cq_err = 0;
	while (!cq_err && poll(&p, 1, 5000) == 1 && ibv_get_async_event(ctx, &ev) == 0) {
		if (ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == scq)
			cq_err = 1;
		ibv_ack_async_event(&ev);
	}
	CHECK(cq_err, "IBV_EVENT_CQ_ERR for the send CQ");
	/* The QP moves to ERR (it may take the progress thread a moment). */
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	int in_err = 0;
	for (int i = 0; i < 200 && !in_err; i++) {
		in_err = ibv_query_qp(qp, &q, IBV_QP_STATE, &qi) == 0 && q.qp_state == IBV_QPS_ERR;
		if (!in_err)
			usleep(10000);
	}
	CHECK(in_err, "the QP is in ERR after the overrun");

	int ok = 0, flushed = 0, other = 0;
	usleep(100000);
	int got = drain(scq, &ok, &flushed, &other);
	CHECK(got == CQE && ok == CQE && other == 0,
	      "every completion the CQ queued is polled: %d (%d ok, %d flushed, %d other)", got, ok, flushed, other);

	/* With room again, new work on the QP in ERR completes flushed. */
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = 64, .lkey = smr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1000, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = dmr->rkey;
	int rc = ibv_post_send(qp, &wr, &bad);
	int n = 0;
	for (int i = 0; i < 200 && n == 0 && rc == 0; i++) {
		ok = flushed = other = 0;
		n = drain(scq, &ok, &flushed, &other);
		if (!n)
			usleep(10000);
	}
	CHECK(rc == 0 && n == 1 && flushed == 1, "a WRITE posted after it is flushed (rc %d, %d completion(s))", rc, n);

	CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	CHECK(ibv_destroy_cq(scq) == 0 && ibv_destroy_cq(rcq) == 0, "destroy the CQs");
	ibv_dealloc_pd(pd);
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	return check_summary();
}
