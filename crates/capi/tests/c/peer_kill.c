/*
 * A peer killed with SIGKILL in the middle of an RDMA WRITE stream (issue #12, scope 3): the
 * survivor, a C program with the default SIGPIPE disposition, must get every WR it posted back
 * as a completion (the ones the transport had taken succeed, the rest flush with an error), see
 * its QP in ERR and exit normally. Before MSG_NOSIGNAL, the progress thread's send to the dead
 * iWARP peer raised SIGPIPE and the survivor died with status 141.
 *
 *   peer_kill server PORT          listens on 127.0.0.1:PORT, accepts one connection with a
 *                                  1 MiB REMOTE_WRITE MR, then waits to be killed
 *   peer_kill client PORT PID      connects, streams 64 KiB WRITEs, SIGKILLs PID after 100
 *                                  completions, and checks what follows
 *
 * Built by tests/dropin.rs against the installed headers; run over the drop-in on siw_lo and
 * (SOFTRDMA_TRANSPORTS=roce) on rxe_lo. alarm() bounds both roles.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include "check.h"

#define REGION (1 << 20)
#define CHUNK (64 << 10)
#define DEPTH 32
#define KILL_AFTER 100

struct target {
	uint64_t addr;
	uint32_t rkey;
};

static struct rdma_event_channel *ch;

static struct rdma_cm_event *expect(enum rdma_cm_event_type type)
{
	struct rdma_cm_event *ev = NULL;

	if (rdma_get_cm_event(ch, &ev)) {
		CHECK(0, "rdma_get_cm_event: %s", strerror(errno));
		return NULL;
	}
	CHECK(ev->event == type, "event %s (want %s), status %d", rdma_event_str(ev->event), rdma_event_str(type),
	      ev->status);
	return ev;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = DEPTH, .max_recv_wr = 4, .max_send_sge = 1,
						  .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC };
	return attr;
}

static int server(struct sockaddr_in *sin)
{
	struct rdma_cm_id *listen_id = NULL;

	alarm(60);
	CHECK(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0, "server rdma_create_id");
	CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)sin) == 0, "rdma_bind_addr");
	CHECK(rdma_listen(listen_id, 1) == 0, "rdma_listen");
	struct rdma_cm_event *req = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	if (!req)
		return check_summary();
	struct rdma_cm_id *child = req->id;
	rdma_ack_cm_event(req);
	struct ibv_qp_init_attr attr = qp_attr();
	CHECK(rdma_create_qp(child, NULL, &attr) == 0, "server rdma_create_qp");
	void *buf = calloc(1, REGION);
	struct ibv_mr *mr = ibv_reg_mr(child->pd, buf, REGION, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr != NULL, "server ibv_reg_mr 1 MiB REMOTE_WRITE");
	if (!mr)
		return check_summary();
	struct target t = { .addr = (uintptr_t)buf, .rkey = mr->rkey };
	struct rdma_conn_param cp = { .private_data = &t, .private_data_len = sizeof(t), .responder_resources = 1,
				      .initiator_depth = 1 };
	CHECK(rdma_accept(child, &cp) == 0, "rdma_accept");
	struct rdma_cm_event *ev = expect(RDMA_CM_EVENT_ESTABLISHED);
	if (ev)
		rdma_ack_cm_event(ev);
	/* Wait to be killed (the alarm ends a server nobody kills). */
	for (;;)
		pause();
}

static int client(struct sockaddr_in *dst, pid_t victim)
{
	struct rdma_cm_id *id = NULL;
	struct rdma_cm_event *ev;

	alarm(90);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "client rdma_create_id");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)dst, 2000) == 0, "rdma_resolve_addr");
	if ((ev = expect(RDMA_CM_EVENT_ADDR_RESOLVED)))
		rdma_ack_cm_event(ev);
	/* A short ACK timeout: on RoCE the dead peer is found by retransmissions running out. */
	uint8_t timeout = 14;
	rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof(timeout));
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	if ((ev = expect(RDMA_CM_EVENT_ROUTE_RESOLVED)))
		rdma_ack_cm_event(ev);
	struct ibv_qp_init_attr attr = qp_attr();
	attr.sq_sig_all = 1;
	CHECK(rdma_create_qp(id, NULL, &attr) == 0, "client rdma_create_qp");
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 3 };
	CHECK(rdma_connect(id, &cp) == 0, "rdma_connect");
	ev = expect(RDMA_CM_EVENT_ESTABLISHED);
	if (!ev || !id->qp)
		return check_summary();
	struct target t = { 0 };
	CHECK(ev->param.conn.private_data_len >= sizeof(t), "the server's private data names its MR");
	memcpy(&t, ev->param.conn.private_data, sizeof(t));
	rdma_ack_cm_event(ev);

	void *src = malloc(REGION);
	memset(src, 0x5a, REGION);
	struct ibv_mr *mr = ibv_reg_mr(id->pd, src, REGION, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL, "client ibv_reg_mr");
	if (!mr)
		return check_summary();

	long posted = 0, ok = 0, failed = 0, post_errors = 0;
	int killed = 0, first_error = -1;
	double deadline = now() + 60;
	struct ibv_wc wc[16];
	while (now() < deadline) {
		/* Keep DEPTH WRITEs in flight until the first error completion or post failure. */
		while (first_error < 0 && post_errors == 0 && posted - ok - failed < DEPTH) {
			uint64_t off = (uint64_t)(posted % (REGION / CHUNK)) * CHUNK;
			struct ibv_sge sge = { .addr = (uintptr_t)src + off, .length = CHUNK, .lkey = mr->lkey };
			struct ibv_send_wr wr = { .wr_id = (uint64_t)posted, .sg_list = &sge, .num_sge = 1,
						  .opcode = IBV_WR_RDMA_WRITE },
					   *bad = NULL;
			wr.wr.rdma.remote_addr = t.addr + off;
			wr.wr.rdma.rkey = t.rkey;
			if (ibv_post_send(id->qp, &wr, &bad)) {
				post_errors++;
				break;
			}
			posted++;
		}
		int n = ibv_poll_cq(id->send_cq, 16, wc);
		if (n < 0) {
			CHECK(0, "ibv_poll_cq returned %d", n);
			break;
		}
		for (int i = 0; i < n; i++) {
			if (wc[i].status == IBV_WC_SUCCESS) {
				ok++;
			} else {
				if (first_error < 0)
					first_error = wc[i].status;
				failed++;
			}
		}
		if (!killed && ok >= KILL_AFTER) {
			CHECK(kill(victim, SIGKILL) == 0, "SIGKILL the server (pid %d) after %ld WRITEs", (int)victim, ok);
			killed = 1;
		}
		if ((first_error >= 0 || post_errors) && ok + failed == posted)
			break;
		if (n == 0)
			usleep(100);
	}
	CHECK(killed, "the server was killed mid-stream");
	CHECK(first_error >= 0, "an error completion after the kill (first: %s)",
	      first_error >= 0 ? ibv_wc_status_str(first_error) : "none");
	CHECK(ok + failed == posted, "every posted WRITE completed: %ld posted, %ld ok, %ld with errors", posted, ok,
	      failed);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(id->qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR, "the QP is in ERR");

	/* The CM reports the end of the connection (bounded). */
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 20000) == 1, "a CM event after the peer died");
	if ((ev = expect(RDMA_CM_EVENT_DISCONNECTED)))
		rdma_ack_cm_event(ev);

	ibv_dereg_mr(mr);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
	rdma_destroy_event_channel(ch);
	free(src);
	return check_summary();
}

int main(int argc, char **argv)
{
	if (argc < 3 || (strcmp(argv[1], "client") == 0 && argc < 4)) {
		fprintf(stderr, "usage: %s server PORT | client PORT PID\n", argv[0]);
		return 2;
	}
	ch = rdma_create_event_channel();
	CHECK(ch != NULL, "rdma_create_event_channel");
	if (!ch)
		return check_summary();
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				   .sin_port = htons((uint16_t)atoi(argv[2])) };
	if (strcmp(argv[1], "server") == 0)
		return server(&sin);
	return client(&sin, (pid_t)atoi(argv[3]));
}
