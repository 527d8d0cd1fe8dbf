/*
 * An idle process does not wake (issue #17): with both devices open, their async event
 * fds, a CQ armed on a completion channel, two RC QPs connected on rxe_lo, an rdma_cm
 * listener and an established rdma_cm connection on siw_lo (each path carried verified
 * data once), the process then sleeps in read(2) on a FIFO while tests/dropin.rs reads
 * every thread's context switches and the CPU time from /proc/<pid>.
 *
 * usage: idle READY-FILE FIFO
 *   READY-FILE: written (atomically) once everything is set up and idle;
 *   FIFO: the program blocks reading it; a byte (or EOF) lets it tear down and exit.
 * Prints one line per check; exits 0 only if every check passed. alarm() bounds it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "check.h"
#include "rc_loopback.h"

#define WAIT_MS 10000

static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double deadline = now_ms() + WAIT_MS;
	int n = 0;

	while (n == 0 && now_ms() < deadline)
		n = ibv_poll_cq(cq, 1, wc);
	return n == 1 && wc->status == IBV_WC_SUCCESS;
}

/* rxe_lo: PD, a CQ armed on a completion channel, two connected RC QPs, one verified SEND. */
struct verbs_side {
	struct ibv_context *ctx;
	struct ibv_comp_channel *ch;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
	struct ibv_mr *mr;
	char buf[2][512];
};

static int verbs_open(struct verbs_side *v, struct ibv_device *dev)
{
	struct ibv_qp_init_attr init = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						  .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC };

	v->ctx = ibv_open_device(dev);
	CHECK(v->ctx != NULL, "rxe_lo: ibv_open_device");
	if (!v->ctx)
		return -1;
	v->ch = ibv_create_comp_channel(v->ctx);
	v->pd = ibv_alloc_pd(v->ctx);
	v->cq = v->ch ? ibv_create_cq(v->ctx, 16, NULL, v->ch, 0) : NULL;
	v->mr = v->pd ? ibv_reg_mr(v->pd, v->buf, sizeof(v->buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	init.send_cq = init.recv_cq = v->cq;
	v->a = v->cq ? ibv_create_qp(v->pd, &init) : NULL;
	v->b = v->cq ? ibv_create_qp(v->pd, &init) : NULL;
	CHECK(v->ch && v->pd && v->cq && v->mr && v->a && v->b, "rxe_lo: channel, PD, CQ, MR, two RC QPs");
	if (!v->a || !v->b || !v->mr)
		return -1;
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	int r = rc_to_rts(v->a, v->b->qp_num, access) || rc_to_rts(v->b, v->a->qp_num, access);
	CHECK(r == 0, "rxe_lo: both QPs reach RTS (errno %d)", errno);
	if (r)
		return -1;

	for (int i = 0; i < 512; i++)
		v->buf[0][i] = (char)(i * 7 + 3);
	struct ibv_sge rs = { .addr = (uintptr_t)v->buf[1], .length = 512, .lkey = v->mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *bad_r;
	struct ibv_sge ss = { .addr = (uintptr_t)v->buf[0], .length = 512, .lkey = v->mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED },
			   *bad_s;
	struct ibv_wc w1, w2;
	CHECK(ibv_post_recv(v->b, &rwr, &bad_r) == 0 && ibv_post_send(v->a, &swr, &bad_s) == 0 &&
		      poll_one(v->cq, &w1) && poll_one(v->cq, &w2) && memcmp(v->buf[0], v->buf[1], 512) == 0,
	      "rxe_lo: a SEND arrives intact");
	/* What a sleeping application leaves behind: a receive posted and the CQ armed. */
	CHECK(ibv_post_recv(v->b, &rwr, &bad_r) == 0 && ibv_req_notify_cq(v->cq, 0) == 0,
	      "rxe_lo: a receive posted, the CQ armed on its channel");
	return 0;
}

static void verbs_close(struct verbs_side *v)
{
	ibv_destroy_qp(v->a);
	ibv_destroy_qp(v->b);
	ibv_dereg_mr(v->mr);
	ibv_destroy_cq(v->cq);
	ibv_destroy_comp_channel(v->ch);
	ibv_dealloc_pd(v->pd);
	ibv_close_device(v->ctx);
}

/* siw_lo through rdma_cm on 127.0.0.1: a listener, and one established connection. */
struct cm_side {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *lid, *cid, *sid;
	struct ibv_mr *rmr, *smr;
	char rbuf[256], sbuf[256];
};

static int cm_open(struct cm_side *c)
{
	struct rdma_cm_event *ev;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						  .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };

	c->ch = rdma_create_event_channel();
	CHECK(c->ch && rdma_create_id(c->ch, &c->lid, NULL, RDMA_PS_TCP) == 0 &&
		      rdma_bind_addr(c->lid, (struct sockaddr *)&sin) == 0 && rdma_listen(c->lid, 4) == 0,
	      "rdma_cm: a listener on 127.0.0.1 (errno %d)", errno);
	if (!c->lid)
		return -1;
	struct sockaddr_in dst = *(struct sockaddr_in *)rdma_get_local_addr(c->lid);
	CHECK(rdma_create_id(c->ch, &c->cid, NULL, RDMA_PS_TCP) == 0 &&
		      rdma_resolve_addr(c->cid, NULL, (struct sockaddr *)&dst, 2000) == 0,
	      "rdma_cm: rdma_resolve_addr");
	if (!(ev = expect_event(c->ch, RDMA_CM_EVENT_ADDR_RESOLVED, "rdma_cm")))
		return -1;
	rdma_ack_cm_event(ev);
	CHECK(rdma_resolve_route(c->cid, 2000) == 0, "rdma_cm: rdma_resolve_route");
	if (!(ev = expect_event(c->ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "rdma_cm")))
		return -1;
	rdma_ack_cm_event(ev);
	CHECK(rdma_create_qp(c->cid, NULL, &attr) == 0 && rdma_connect(c->cid, NULL) == 0,
	      "rdma_cm: client QP, rdma_connect");
	if (!(ev = expect_event(c->ch, RDMA_CM_EVENT_CONNECT_REQUEST, "rdma_cm")))
		return -1;
	c->sid = ev->id;
	rdma_ack_cm_event(ev);
	struct ibv_qp_init_attr sattr = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						   .max_recv_sge = 1 },
					  .qp_type = IBV_QPT_RC };
	CHECK(rdma_create_qp(c->sid, NULL, &sattr) == 0, "rdma_cm: server QP");
	c->rmr = ibv_reg_mr(c->sid->pd, c->rbuf, sizeof(c->rbuf), IBV_ACCESS_LOCAL_WRITE);
	c->smr = ibv_reg_mr(c->cid->pd, c->sbuf, sizeof(c->sbuf), IBV_ACCESS_LOCAL_WRITE);
	if (!c->rmr || !c->smr || !c->sid->qp) {
		CHECK(0, "rdma_cm: MRs");
		return -1;
	}
	struct ibv_sge rsge = { .addr = (uintptr_t)c->rbuf, .length = sizeof(c->rbuf), .lkey = c->rmr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 42, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
	CHECK(ibv_post_recv(c->sid->qp, &rwr, &bad_r) == 0 && rdma_accept(c->sid, NULL) == 0,
	      "rdma_cm: a receive posted, rdma_accept");
	for (int i = 0; i < 2; i++) {
		if (!(ev = expect_event(c->ch, RDMA_CM_EVENT_ESTABLISHED, "rdma_cm")))
			return -1;
		rdma_ack_cm_event(ev);
	}
	for (int i = 0; i < (int)sizeof(c->sbuf); i++)
		c->sbuf[i] = (char)(i * 13 + 1);
	struct ibv_sge ssge = { .addr = (uintptr_t)c->sbuf, .length = sizeof(c->sbuf), .lkey = c->smr->lkey };
	struct ibv_send_wr swr = { .wr_id = 7, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad_s;
	struct ibv_wc w1, w2;
	CHECK(ibv_post_send(c->cid->qp, &swr, &bad_s) == 0 && poll_one(c->sid->recv_cq, &w1) &&
		      poll_one(c->cid->send_cq, &w2) && memcmp(c->rbuf, c->sbuf, sizeof(c->sbuf)) == 0,
	      "rdma_cm: a SEND arrives intact on the established connection");
	return 0;
}

static void cm_close(struct cm_side *c)
{
	struct rdma_cm_event *ev;

	CHECK(rdma_disconnect(c->cid) == 0, "rdma_cm: rdma_disconnect after the idle time");
	for (int i = 0; i < 2; i++)
		if ((ev = expect_event(c->ch, RDMA_CM_EVENT_DISCONNECTED, "rdma_cm")))
			rdma_ack_cm_event(ev);
	ibv_dereg_mr(c->rmr);
	ibv_dereg_mr(c->smr);
	rdma_destroy_qp(c->sid);
	rdma_destroy_qp(c->cid);
	rdma_destroy_id(c->sid);
	rdma_destroy_id(c->cid);
	rdma_destroy_id(c->lid);
	rdma_destroy_event_channel(c->ch);
}

int main(int argc, char **argv)
{
	alarm(120);
	if (argc != 3) {
		fprintf(stderr, "usage: idle READY-FILE FIFO\n");
		return 2;
	}
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_device *rxe = NULL;
	struct ibv_context *siw = NULL;
	for (int i = 0; list && i < num; i++) {
		if (strcmp(ibv_get_device_name(list[i]), "rxe_lo") == 0)
			rxe = list[i];
		else if (strcmp(ibv_get_device_name(list[i]), "siw_lo") == 0)
			siw = ibv_open_device(list[i]);
	}
	CHECK(rxe && siw, "rxe_lo listed, siw_lo opened");
	if (!rxe || !siw)
		return check_summary();
	struct ibv_async_event aev;
	fcntl(siw->async_fd, F_SETFL, fcntl(siw->async_fd, F_GETFL) | O_NONBLOCK);
	CHECK(ibv_get_async_event(siw, &aev) == -1 && errno == EAGAIN, "siw_lo: no async event pending");

	struct verbs_side v;
	memset(&v, 0, sizeof(v));
	struct cm_side c;
	memset(&c, 0, sizeof(c));
	if (verbs_open(&v, rxe) || cm_open(&c))
		return check_summary();

	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", argv[1]);
	FILE *f = fopen(tmp, "w");
	CHECK(f && fprintf(f, "%d\n", (int)getpid()) > 0 && fclose(f) == 0 && rename(tmp, argv[1]) == 0,
	      "idle: ready file written");
	/* The idle time: one blocking read, until the test has measured. */
	int fd = open(argv[2], O_RDONLY);
	char b;
	CHECK(fd >= 0 && read(fd, &b, 1) >= 0, "idle: woken by the test");
	if (fd >= 0)
		close(fd);

	cm_close(&c);
	verbs_close(&v);
	ibv_close_device(siw);
	ibv_free_device_list(list);
	return check_summary();
}
