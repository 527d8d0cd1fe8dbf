/*
 * fork() after the library was used (issue #12, scope 4): the child gets a fresh library
 * state, and the parent is not disturbed.
 *
 * The parent opens rxe_lo, connects two RC QPs to each other and moves verified data (so the
 * progress thread and the soft-RoCE endpoint exist), and listens with rdma_cm on 127.0.0.1
 * (siw_lo). Then it forks. The child:
 *   - finds the parent's objects unusable but never hangs on them: ibv_poll_cq fails,
 *     ibv_post_send fails, ibv_alloc_pd on the parent's context and rdma_get_cm_event on the
 *     parent's channel are EINVAL at once;
 *   - opens rxe_lo (through the device list inherited from the parent) and runs verified RC
 *     RDMA WRITEs and SENDs between two new QPs;
 *   - connects with rdma_cm on 127.0.0.1 (listen, connect, accept, a verified SEND,
 *     disconnect), with a device list and event channel of its own;
 *   - tells the parent, and waits until the parent says it may exit.
 * Meanwhile the parent keeps moving verified data on its QPs. While the child is still alive
 * it destroys its listener and listens again on the same port (the child must not hold the
 * parent's listening socket or port claim). Then it reaps the child (exit status 0) and checks
 * its own traffic again.
 *
 * Built by tests/dropin.rs: cc -o fork fork.c <dropin>/libibverbs.so.1, run with a config
 * holding siw_lo and rxe_lo. Prints one line per check; exits 0 only if every check passed.
 * alarm() bounds both processes.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/wait.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "check.h"
#include "rc_loopback.h"

#if defined(__SANITIZE_ADDRESS__)
#define CHILD_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHILD_UNDER_ASAN 1
#endif
#endif
#ifndef CHILD_UNDER_ASAN
#define CHILD_UNDER_ASAN 0
#endif

#define BUF 65536
#define WAIT_MS 10000

/* Two RC QPs on one context, connected to each other. */
struct pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
	uint8_t *src, *dst;
	struct ibv_mr *src_mr, *dst_mr;
};

static struct ibv_qp *rc_qp(struct pair *p)
{
	struct ibv_qp_init_attr init;

	memset(&init, 0, sizeof(init));
	init.send_cq = p->cq;
	init.recv_cq = p->cq;
	init.cap.max_send_wr = 16;
	init.cap.max_recv_wr = 16;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	init.qp_type = IBV_QPT_RC;
	return ibv_create_qp(p->pd, &init);
}

/* Opens `dev` and connects two RC QPs; 0 on success. */
static int pair_open(struct pair *p, struct ibv_device *dev, const char *who)
{
	memset(p, 0, sizeof(*p));
	p->ctx = ibv_open_device(dev);
	CHECK(p->ctx != NULL, "%s: ibv_open_device rxe_lo (errno %d)", who, errno);
	if (!p->ctx)
		return -1;
	p->pd = ibv_alloc_pd(p->ctx);
	p->cq = ibv_create_cq(p->ctx, 64, NULL, NULL, 0);
	p->src = malloc(BUF);
	p->dst = malloc(BUF);
	CHECK(p->pd && p->cq && p->src && p->dst, "%s: PD, CQ, buffers", who);
	if (!p->pd || !p->cq || !p->src || !p->dst)
		return -1;
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	p->src_mr = ibv_reg_mr(p->pd, p->src, BUF, access);
	p->dst_mr = ibv_reg_mr(p->pd, p->dst, BUF, access);
	p->a = rc_qp(p);
	p->b = rc_qp(p);
	CHECK(p->src_mr && p->dst_mr && p->a && p->b, "%s: MRs and two RC QPs (errno %d)", who, errno);
	if (!p->src_mr || !p->dst_mr || !p->a || !p->b)
		return -1;
	int r = rc_to_rts(p->a, p->b->qp_num, access) || rc_to_rts(p->b, p->a->qp_num, access);
	CHECK(r == 0, "%s: both QPs reach RTS (errno %d)", who, errno);
	return r ? -1 : 0;
}

static void pair_close(struct pair *p)
{
	ibv_destroy_qp(p->a);
	ibv_destroy_qp(p->b);
	ibv_dereg_mr(p->src_mr);
	ibv_dereg_mr(p->dst_mr);
	ibv_destroy_cq(p->cq);
	ibv_dealloc_pd(p->pd);
	ibv_close_device(p->ctx);
	free(p->src);
	free(p->dst);
}

/* Waits for `want` successful completions on the pair's CQ; 0 on success. */
static int wait_wc(struct pair *p, int want, const char *who)
{
	double deadline = now_ms() + WAIT_MS;
	struct ibv_wc wc[4];
	int got = 0;

	while (got < want && now_ms() < deadline) {
		int n = ibv_poll_cq(p->cq, 4, wc);
		if (n < 0) {
			printf("%s: ibv_poll_cq: %d\n", who, n);
			return -1;
		}
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				printf("%s: completion wr_id %lu status %s\n", who, (unsigned long)wc[i].wr_id,
				       ibv_wc_status_str(wc[i].status));
				return -1;
			}
		}
		got += n;
		if (n == 0)
			usleep(50);
	}
	if (got < want)
		printf("%s: %d of %d completions within %d ms\n", who, got, want, WAIT_MS);
	return got == want ? 0 : -1;
}

/*
 * One verified round: an RDMA WRITE of BUF bytes from a to b's dst buffer, then a SEND of
 * 4096 bytes from a into a receive posted on b. Returns 0 when both arrived intact.
 */
static int round_trip(struct pair *p, unsigned seed, const char *who)
{
	for (int i = 0; i < BUF; i++)
		p->src[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
	memset(p->dst, 0, BUF);

	struct ibv_sge s = { .addr = (uintptr_t)p->src, .length = BUF, .lkey = p->src_mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	w.wr.rdma.remote_addr = (uintptr_t)p->dst;
	w.wr.rdma.rkey = p->dst_mr->rkey;
	if (ibv_post_send(p->a, &w, &bad) || wait_wc(p, 1, who))
		return -1;
	if (memcmp(p->src, p->dst, BUF) != 0) {
		printf("%s: RDMA WRITE data differ\n", who);
		return -1;
	}

	memset(p->dst, 0, BUF);
	struct ibv_sge rs = { .addr = (uintptr_t)p->dst, .length = 4096, .lkey = p->dst_mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *bad_r;
	s.length = 4096;
	s.addr = (uintptr_t)(p->src + 1000);
	w.opcode = IBV_WR_SEND;
	w.wr_id = 3;
	if (ibv_post_recv(p->b, &r, &bad_r) || ibv_post_send(p->a, &w, &bad) || wait_wc(p, 2, who))
		return -1;
	if (memcmp(p->src + 1000, p->dst, 4096) != 0) {
		printf("%s: SEND data differ\n", who);
		return -1;
	}
	return 0;
}

/* The child's rdma_cm connection on 127.0.0.1: listen, connect, accept, one SEND, disconnect. */
static void child_cm(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid = NULL, *cid = NULL, *sid = NULL;
	struct rdma_cm_event *ev;

	CHECK(ch != NULL, "child: rdma_create_event_channel");
	if (!ch)
		return;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0 && rdma_bind_addr(lid, (struct sockaddr *)&sin) == 0 &&
		      rdma_listen(lid, 4) == 0,
	      "child: rdma_cm listener on 127.0.0.1 (errno %d)", errno);
	struct sockaddr_in dst = *(struct sockaddr_in *)rdma_get_local_addr(lid);

	CHECK(rdma_create_id(ch, &cid, NULL, RDMA_PS_TCP) == 0 &&
		      rdma_resolve_addr(cid, NULL, (struct sockaddr *)&dst, 2000) == 0,
	      "child: client id, rdma_resolve_addr");
	if ((ev = expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, "child")))
		rdma_ack_cm_event(ev);
	CHECK(rdma_resolve_route(cid, 2000) == 0, "child: rdma_resolve_route");
	if ((ev = expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "child")))
		rdma_ack_cm_event(ev);
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						  .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	CHECK(rdma_create_qp(cid, NULL, &attr) == 0, "child: client rdma_create_qp (errno %d)", errno);
	CHECK(rdma_connect(cid, NULL) == 0, "child: rdma_connect");
	ev = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, "child");
	if (!ev)
		return;
	sid = ev->id;
	rdma_ack_cm_event(ev);
	/* A fresh attr: rdma_create_qp wrote the client's CQs into the first one. */
	struct ibv_qp_init_attr sattr = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						   .max_recv_sge = 1 },
					  .qp_type = IBV_QPT_RC };
	CHECK(rdma_create_qp(sid, NULL, &sattr) == 0 && sid->recv_cq && cid->send_cq,
	      "child: server rdma_create_qp, library CQs on both ids (errno %d)", errno);
	if (!sid->recv_cq || !cid->send_cq)
		return;
	static char rbuf[256], sbuf[256];
	for (int i = 0; i < (int)sizeof(sbuf); i++)
		sbuf[i] = (char)(i * 13 + getpid());
	struct ibv_mr *rmr = ibv_reg_mr(sid->pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(cid->pd, sbuf, sizeof(sbuf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(rmr && smr, "child: MRs on the ids' PDs");
	if (!rmr || !smr)
		return;
	struct ibv_sge rsge = { .addr = (uintptr_t)rbuf, .length = sizeof(rbuf), .lkey = rmr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 42, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
	CHECK(ibv_post_recv(sid->qp, &rwr, &bad_r) == 0, "child: post a receive");
	CHECK(rdma_accept(sid, NULL) == 0, "child: rdma_accept");
	for (int i = 0; i < 2; i++)
		if ((ev = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED, "child")))
			rdma_ack_cm_event(ev);

	struct ibv_sge ssge = { .addr = (uintptr_t)sbuf, .length = sizeof(sbuf), .lkey = smr->lkey };
	struct ibv_send_wr swr = { .wr_id = 7, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad_s;
	CHECK(ibv_post_send(cid->qp, &swr, &bad_s) == 0, "child: ibv_post_send on the cm QP");
	struct ibv_wc wc;
	int n = 0;
	double deadline = now_ms() + WAIT_MS;
	while (n == 0 && now_ms() < deadline)
		n = ibv_poll_cq(sid->recv_cq, 1, &wc);
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 42 && wc.byte_len == sizeof(sbuf) &&
		      memcmp(rbuf, sbuf, sizeof(sbuf)) == 0,
	      "child: the rdma_cm SEND arrives intact (n=%d)", n);
	n = 0;
	deadline = now_ms() + WAIT_MS;
	while (n == 0 && now_ms() < deadline)
		n = ibv_poll_cq(cid->send_cq, 1, &wc);
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 7, "child: the SEND completes");

	CHECK(rdma_disconnect(cid) == 0, "child: rdma_disconnect");
	for (int i = 0; i < 2; i++)
		if ((ev = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, "child")))
			rdma_ack_cm_event(ev);
	ibv_dereg_mr(rmr);
	ibv_dereg_mr(smr);
	rdma_destroy_qp(sid);
	rdma_destroy_qp(cid);
	CHECK(rdma_destroy_id(sid) == 0 && rdma_destroy_id(cid) == 0 && rdma_destroy_id(lid) == 0,
	      "child: rdma_destroy_id");
	rdma_destroy_event_channel(ch);
}

static void child(struct pair *parent, struct rdma_event_channel *parent_ch, struct ibv_device *rxe, int up,
		  int down)
{
	alarm(40);
	/* The parent's objects: unusable, never a hang. */
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(parent->cq, 1, &wc) < 0, "child: ibv_poll_cq on the parent's CQ fails");
	struct ibv_sge s = { .addr = (uintptr_t)parent->src, .length = 8, .lkey = parent->src_mr->lkey };
	struct ibv_send_wr w = { .wr_id = 9, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad = NULL;
	int r = ibv_post_send(parent->a, &w, &bad);
	CHECK(r != 0 && bad == &w, "child: ibv_post_send on the parent's QP fails (%d)", r);
	errno = 0;
	CHECK(ibv_alloc_pd(parent->ctx) == NULL && errno == EINVAL, "child: ibv_alloc_pd on the parent's context: EINVAL");
	struct rdma_cm_event *ev = NULL;
	errno = 0;
	CHECK(rdma_get_cm_event(parent_ch, &ev) == -1 && errno == EINVAL,
	      "child: rdma_get_cm_event on the parent's channel: EINVAL at once");

	/* A fresh RoCE context through the inherited device pointer: verified RC traffic. */
	struct pair p;
	if (pair_open(&p, rxe, "child") == 0) {
		int ok = 0;
		for (unsigned i = 0; i < 5; i++)
			ok += round_trip(&p, 1000 + i, "child") == 0;
		CHECK(ok == 5, "child: RC RDMA WRITE + SEND on rxe_lo, %d of 5 rounds verified", ok);
		pair_close(&p);
	}

	/* A fresh device list and an rdma_cm connection (siw_lo on 127.0.0.1). */
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num == 2, "child: ibv_get_device_list (%d devices)", num);
	ibv_free_device_list(list);
	child_cm();

	char c = 'd';
	CHECK(write(up, &c, 1) == 1, "child: tell the parent");
	struct pollfd pfd = { .fd = down, .events = POLLIN };
	CHECK(poll(&pfd, 1, 20000) == 1 && read(down, &c, 1) == 1, "child: the parent lets it exit");
	printf("child: %s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
	fflush(stdout);
#if CHILD_UNDER_ASAN
	/* LeakSanitizer's exit check cannot tell the memory of the parent's threads (gone here,
	 * their thread-locals and stacks unreachable) from leaks; ASan errors still abort. */
	_exit(failures ? 1 : 0);
#else
	exit(failures ? 1 : 0); /* through the library's exit-time destructor, as a real child */
#endif
}

int main(void)
{
	alarm(60);
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_device *rxe = NULL;
	for (int i = 0; list && i < num; i++)
		if (strcmp(ibv_get_device_name(list[i]), "rxe_lo") == 0)
			rxe = list[i];
	CHECK(rxe != NULL, "rxe_lo is listed");
	if (!rxe)
		return 1;

	struct pair p;
	if (pair_open(&p, rxe, "parent"))
		return check_summary();
	int ok = 0;
	for (unsigned i = 0; i < 3; i++)
		ok += round_trip(&p, i, "parent") == 0;
	CHECK(ok == 3, "parent: %d of 3 rounds verified before fork", ok);

	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid = NULL;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(ch && rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0 &&
		      rdma_bind_addr(lid, (struct sockaddr *)&sin) == 0 && rdma_listen(lid, 4) == 0,
	      "parent: rdma_cm listener on 127.0.0.1 (errno %d)", errno);
	if (!lid)
		return check_summary();
	struct sockaddr_in bound = *(struct sockaddr_in *)rdma_get_local_addr(lid);

	int up[2], down[2];
	CHECK(pipe(up) == 0 && pipe(down) == 0, "pipes");
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0)
		child(&p, ch, rxe, up[1], down[0]);
	CHECK(pid > 0, "fork");
	if (pid < 0)
		return check_summary();

	/* Parent traffic while the child works, until it reports (bounded). */
	int rounds = 0, bad_rounds = 0, child_done = 0;
	double deadline = now_ms() + 40000;
	while (!child_done && now_ms() < deadline) {
		if (round_trip(&p, 100 + rounds, "parent"))
			bad_rounds++;
		rounds++;
		struct pollfd pfd = { .fd = up[0], .events = POLLIN };
		char c;
		if (poll(&pfd, 1, 0) == 1)
			child_done = read(up[0], &c, 1) == 1;
	}
	CHECK(child_done, "the child reported its work done");
	CHECK(rounds > 0 && bad_rounds == 0, "parent: %d rounds during the child's work, %d failed", rounds, bad_rounds);

	/* The child is alive and holds none of the parent's sockets or claims: the port is free
	 * again once the parent destroys its listener. */
	CHECK(rdma_destroy_id(lid) == 0, "parent: rdma_destroy_id of the listener");
	lid = NULL;
	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0 && rdma_bind_addr(lid, (struct sockaddr *)&bound) == 0 &&
		      rdma_listen(lid, 4) == 0,
	      "parent: listens again on port %d while the child lives (errno %d)", ntohs(bound.sin_port), errno);

	char c = 'x';
	CHECK(write(down[1], &c, 1) == 1, "parent: let the child exit");
	int status = -1;
	pid_t w = 0;
	deadline = now_ms() + 20000;
	while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_ms() < deadline)
		if (round_trip(&p, 5000 + rounds++, "parent"))
			bad_rounds++;
	if (w == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
	}
	CHECK(w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child exited with status 0 (%#x)", status);
	ok = 0;
	for (unsigned i = 0; i < 3; i++)
		ok += round_trip(&p, 9000 + i, "parent") == 0;
	CHECK(ok == 3 && bad_rounds == 0, "parent: traffic verified after the child ended (%d of 3, %d failed of %d)", ok,
	      bad_rounds, rounds);

	rdma_destroy_id(lid);
	rdma_destroy_event_channel(ch);
	pair_close(&p);
	ibv_free_device_list(list);
	return check_summary();
}
