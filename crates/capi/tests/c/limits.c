/*
 * Limits (issue #12, scope 6): what ibv_query_device advertises is what is enforced.
 *   - PDs, CQs, QPs, SRQs and MRs are created on siw_lo up to max_pd, max_cq, max_qp,
 *     max_srq and max_mr: every one of them succeeds, the next fails with ENOMEM (as Linux
 *     siw), and after freeing one, one more can be created again. Memory windows and AHs on
 *     rxe_lo likewise, up to max_mw and max_ah.
 *   - Caps beyond the device's: create_qp with max_send_wr / max_recv_wr above max_qp_wr,
 *     max_send_sge above max_sge, create_cq with cqe above max_cqe, create_srq with max_wr
 *     above max_srq_wr: EINVAL.
 *   - A cyclic WR list (wr.next = &wr) for ibv_post_send (UD on rxe_lo), ibv_post_recv and
 *     ibv_post_srq_recv: ENOMEM, *bad_wr = &wr, after posting exactly the queue's capacity;
 *     a queue that is already full gives ENOMEM with *bad_wr on the first WR.
 *   - Out of file descriptors: completion channels, QPs on rxe_lo (which need a UDP socket
 *     per 255 QPs) and rdma_cm event channels fail with EMFILE, never EIO.
 *
 * Built by tests/dropin.rs against the installed headers, run with a config holding siw_lo
 * and rxe_lo. Prints one line per check; exits 0 only if every check passed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "check.h"
#include "open_dev.h"

/* 0 with --no-counts (the ASan run: hundreds of thousands of objects take too long there). */
static int do_counts = 1;

/* Creates objects with `make` until it fails; checks that exactly `max` succeeded and that
 * the failure is ENOMEM; frees one, creates one more, then frees them all. */
#define FILL(what, max, type, make, destroy)                                                           \
	do {                                                                                           \
		if (!do_counts) {                                                                      \
			printf("skip %s: object counts not checked in this run (--no-counts)\n", what); \
			break;                                                                         \
		}                                                                                      \
		long lim_ = (max), n_ = 0;                                                             \
		type **objs_ = calloc((size_t)lim_ + 2, sizeof(*objs_));                               \
		int err_ = 0;                                                                          \
		while (n_ <= lim_) {                                                                   \
			errno = 0;                                                                     \
			type *o_ = (make);                                                             \
			if (!o_) {                                                                     \
				err_ = errno;                                                          \
				break;                                                                 \
			}                                                                              \
			objs_[n_++] = o_;                                                              \
		}                                                                                      \
		CHECK(n_ == lim_ && err_ == ENOMEM, "%s: %ld created of %ld advertised, then %s", what, n_, \
		      lim_, strerror(err_));                                                           \
		if (n_ > 0) {                                                                          \
			CHECK(destroy(objs_[n_ - 1]) == 0, "%s: free one", what);                      \
			type *o_ = (make);                                                             \
			CHECK(o_ != NULL, "%s: one more after freeing one", what);                     \
			objs_[n_ - 1] = o_;                                                            \
		}                                                                                      \
		int bad_ = 0;                                                                          \
		for (long i_ = 0; i_ < n_; i_++)                                                       \
			if (objs_[i_] && destroy(objs_[i_]))                                           \
				bad_++;                                                                \
		CHECK(bad_ == 0, "%s: all %ld freed", what, n_);                                       \
		free(objs_);                                                                           \
	} while (0)

static int dereg(struct ibv_mr *mr)
{
	return ibv_dereg_mr(mr);
}

static void counts(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	static char buf[64];

	FILL("PDs", a->max_pd - 1, struct ibv_pd, ibv_alloc_pd(ctx), ibv_dealloc_pd);
	FILL("CQs", a->max_cq - 1, struct ibv_cq, ibv_create_cq(ctx, 1, NULL, NULL, 0), ibv_destroy_cq);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	FILL("QPs", a->max_qp, struct ibv_qp, ibv_create_qp(pd, &qa), ibv_destroy_qp);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 1, .max_sge = 1 } };
	FILL("SRQs", a->max_srq, struct ibv_srq, ibv_create_srq(pd, &sa), ibv_destroy_srq);
	FILL("MRs", a->max_mr, struct ibv_mr, ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE), dereg);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

static void caps(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *qp;

	qa.cap.max_send_wr = a->max_qp_wr + 1;
	errno = 0;
	qp = ibv_create_qp(pd, &qa);
	CHECK(!qp && errno == EINVAL, "create_qp max_send_wr max_qp_wr+1: EINVAL (%s)", strerror(errno));
	qa.cap.max_send_wr = 1;
	qa.cap.max_recv_wr = a->max_qp_wr + 1;
	errno = 0;
	qp = ibv_create_qp(pd, &qa);
	CHECK(!qp && errno == EINVAL, "create_qp max_recv_wr max_qp_wr+1: EINVAL (%s)", strerror(errno));
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = a->max_sge + 1;
	errno = 0;
	qp = ibv_create_qp(pd, &qa);
	CHECK(!qp && errno == EINVAL, "create_qp max_send_sge max_sge+1: EINVAL (%s)", strerror(errno));
	qa.cap.max_send_sge = 1;
	qa.cap.max_send_wr = a->max_qp_wr;
	qp = ibv_create_qp(pd, &qa);
	CHECK(qp != NULL, "create_qp with max_send_wr = max_qp_wr (%d)", a->max_qp_wr);
	if (qp)
		ibv_destroy_qp(qp);
	errno = 0;
	struct ibv_cq *big = ibv_create_cq(ctx, a->max_cqe + 1, NULL, NULL, 0);
	CHECK(!big && errno == EINVAL, "create_cq max_cqe+1: EINVAL (%s)", strerror(errno));
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = a->max_srq_wr + 1, .max_sge = 1 } };
	errno = 0;
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(!srq && errno == EINVAL, "create_srq max_wr max_srq_wr+1: EINVAL (%s)", strerror(errno));
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

/* Cyclic receive lists on siw_lo: a QP in INIT takes receives; so does an SRQ. */
static void cyclic_recv(struct ibv_context *ctx)
{
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	CHECK(qp && mr, "QP and MR for the cyclic receive lists");
	if (!qp || !mr)
		return;
	struct ibv_qp_attr init = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				    .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
	CHECK(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
	      "QP to INIT");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof(buf), .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
	wr.next = &wr;
	int rc = ibv_post_recv(qp, &wr, &bad);
	CHECK(rc == ENOMEM && bad == &wr, "post_recv of a cyclic list: ENOMEM, bad_wr = the WR (rc %d)", rc);
	/* Exactly the queue's capacity was posted: one more is refused at once. */
	wr.next = NULL;
	bad = NULL;
	rc = ibv_post_recv(qp, &wr, &bad);
	CHECK(rc == ENOMEM && bad == &wr, "the receive queue is full after it (rc %d)", rc);

	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(srq != NULL, "create_srq");
	if (srq) {
		struct ibv_srq_attr got;
		ibv_query_srq(srq, &got);
		wr.next = &wr;
		bad = NULL;
		rc = ibv_post_srq_recv(srq, &wr, &bad);
		CHECK(rc == ENOMEM && bad == &wr, "post_srq_recv of a cyclic list: ENOMEM, bad_wr = the WR (rc %d)",
		      rc);
		wr.next = NULL;
		rc = ibv_post_srq_recv(srq, &wr, &bad);
		CHECK(rc == ENOMEM, "the SRQ (max_wr %u) is full after it (rc %d)", got.max_wr, rc);
		CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq");
	}
	CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

/* A UD QP on rxe_lo reaches RTS alone: a cyclic send list. Then MW and AH counts. */
static void rxe_checks(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	union ibv_gid gid;
	CHECK(qp && mr && ibv_query_gid(ctx, 1, 0, &gid) == 0, "UD QP, MR and GID 0 on rxe_lo");
	if (!qp || !mr)
		return;
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11 };
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0, "INIT");
	at.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == 0, "RTR");
	at.qp_state = IBV_QPS_RTS;
	at.sq_psn = 1;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah != NULL, "create_ah to GID 0");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad = NULL;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0xfffff0; /* nobody: the datagrams are dropped */
	wr.wr.ud.remote_qkey = 0x11;
	wr.next = &wr;
	int rc = ah ? ibv_post_send(qp, &wr, &bad) : -1;
	CHECK(rc == ENOMEM && bad == &wr, "post_send of a cyclic list: ENOMEM, bad_wr = the WR (rc %d)", rc);

	/* Unsignaled sends leave the queue by themselves; the CQ stays empty. */
	CHECK(ibv_destroy_qp(qp) == 0, "destroy the UD QP");
	if (ah)
		CHECK(ibv_destroy_ah(ah) == 0, "destroy_ah");

	FILL("MWs", a->max_mw, struct ibv_mw, ibv_alloc_mw(pd, IBV_MW_TYPE_1), ibv_dealloc_mw);
	FILL("AHs", a->max_ah, struct ibv_ah, ibv_create_ah(pd, &aa), ibv_destroy_ah);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

/* Out of fds: EMFILE, never EIO. */
static void out_of_fds(struct ibv_context *rxe)
{
	struct rlimit old, low;
	getrlimit(RLIMIT_NOFILE, &old);
	struct ibv_pd *pd = ibv_alloc_pd(rxe);
	struct ibv_cq *cq = ibv_create_cq(rxe, 1, NULL, NULL, 0);
	/* Use every fd below the limit. */
	int fds[4096], nfd = 0;
	low = old;
	low.rlim_cur = 256;
	CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "RLIMIT_NOFILE 256");
	for (int fd; nfd < 4096 && (fd = dup(0)) >= 0;)
		fds[nfd++] = fd;
	errno = 0;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(rxe);
	CHECK(!ch && errno == EMFILE, "create_comp_channel without fds: EMFILE (%s)", strerror(errno));
	errno = 0;
	struct rdma_event_channel *ech = rdma_create_event_channel();
	CHECK(!ech && errno == EMFILE, "rdma_create_event_channel without fds: EMFILE (%s)", strerror(errno));
	/* QPs on rxe_lo take a UDP socket per 255: create until one fails. */
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *qps[600];
	int nq = 0, err = 0;
	while (nq < 600) {
		errno = 0;
		struct ibv_qp *q = ibv_create_qp(pd, &qa);
		if (!q) {
			err = errno;
			break;
		}
		qps[nq++] = q;
	}
	CHECK(nq < 600 && (err == EMFILE || err == ENOMEM), "create_qp on rxe_lo without fds fails after %d: %s", nq,
	      strerror(err));
	while (nq > 0)
		ibv_destroy_qp(qps[--nq]);
	while (nfd > 0)
		close(fds[--nfd]);
	setrlimit(RLIMIT_NOFILE, &old);
	ch = ibv_create_comp_channel(rxe);
	CHECK(ch != NULL, "create_comp_channel once fds are back");
	if (ch)
		ibv_destroy_comp_channel(ch);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

int main(int argc, char **argv)
{
	alarm(290);
	do_counts = !(argc > 1 && strcmp(argv[1], "--no-counts") == 0);
	struct ibv_context *siw = open_dev("siw_lo"), *rxe = open_dev("rxe_lo");
	CHECK(siw && rxe, "open siw_lo and rxe_lo");
	if (!siw || !rxe)
		return check_summary();
	struct ibv_device_attr a, ra;
	CHECK(ibv_query_device(siw, &a) == 0 && ibv_query_device(rxe, &ra) == 0, "ibv_query_device");
	printf("siw_lo: max_pd %d max_cq %d max_qp %d max_srq %d max_mr %d; rxe_lo: max_mw %d max_ah %d\n", a.max_pd,
	       a.max_cq, a.max_qp, a.max_srq, a.max_mr, ra.max_mw, ra.max_ah);
	counts(siw, &a);
	caps(siw, &a);
	cyclic_recv(siw);
	rxe_checks(rxe, &ra);
	out_of_fds(rxe);
	ibv_close_device(siw);
	ibv_close_device(rxe);
	return check_summary();
}
