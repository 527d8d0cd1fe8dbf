/*
 * The teardown of rping in rdma-core 44: an event thread loops on rdma_get_cm_event and is
 * never joined; main destroys the ids and the channel and returns. Here the thread handles a
 * loopback connection's events (and main a SEND on it), then calls rdma_get_cm_event once
 * more, after main destroyed the channel and returned: this program's destructor, which runs
 * during exit() before the library's (the program is finalized first), lets it.
 * That call must wait for the exit, not fail: the thread would exit(3) (rping: exit(-1)) and
 * the process would end with its status instead of main's. The destructor ends the process with
 * status 4 if the thread never made the call (the test would prove nothing).
 *
 * Built by tests/dropin.rs: cc -o exit_with_event_thread exit_with_event_thread.c
 * <dropin>/libibverbs.so.1. Exits 0 (PASSED) only if every check passed and the thread's late
 * call did not end the process. alarm() bounds it.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include "check.h"

static struct rdma_event_channel *ch;
/* Posted by the thread after each event; by the destructor once the exit has started. */
static sem_t handled, exiting;
/* Set by the thread just before its late call. */
static volatile int late_call;
/* Written by the thread before it posts `handled`. */
static enum rdma_cm_event_type last;
static int last_status;
static struct rdma_cm_id *child;

static void *event_thread(void *arg)
{
	int established = 0;

	(void)arg;
	for (;;) {
		struct rdma_cm_event *ev;

		if (rdma_get_cm_event(ch, &ev)) {
			printf("event thread: rdma_get_cm_event: %s\n", strerror(errno));
			fflush(stdout);
			exit(3);
		}
		last = ev->event;
		last_status = ev->status;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			child = ev->id;
		if (ev->event == RDMA_CM_EVENT_ESTABLISHED)
			established++;
		rdma_ack_cm_event(ev);
		sem_post(&handled);
		if (established == 2) {
			/* The late call: main destroyed the channel, and the exit has started. */
			sem_wait(&exiting);
			late_call = 1;
		}
	}
	return NULL;
}

/*
 * The program's destructor: runs during exit(), after the atexit handlers (the library marks
 * the exit in one) and before the library's destructor. Lets the thread make its late call,
 * and gives the call 50 ms to fail.
 */
__attribute__((destructor)) static void let_the_thread_call(void)
{
	if (!ch)
		return;
	sem_post(&exiting);
	for (int ms = 0; ms < 2000 && !late_call; ms++)
		usleep(1000);
	if (!late_call) {
		printf("destructor: the event thread never made its late call\n");
		fflush(stdout);
		_exit(4);
	}
	usleep(50000);
}

/* Waits for the thread's next event and checks its type. */
static void expect(enum rdma_cm_event_type type)
{
	sem_wait(&handled);
	CHECK(last == type && last_status == 0, "%s (want %s), status %d", rdma_event_str(last), rdma_event_str(type),
	      last_status);
}

int main(void)
{
	alarm(20);
	sem_init(&handled, 0, 0);
	sem_init(&exiting, 0, 0);
	ch = rdma_create_event_channel();
	CHECK(ch != NULL, "rdma_create_event_channel");
	if (!ch)
		return 1;

	struct rdma_cm_id *listen_id = NULL, *id = NULL;
	CHECK(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0, "listener rdma_create_id");
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&sin) == 0, "rdma_bind_addr 127.0.0.1:0");
	CHECK(rdma_listen(listen_id, 0) == 0, "rdma_listen");
	struct sockaddr_in dst = *(struct sockaddr_in *)rdma_get_local_addr(listen_id);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "client rdma_create_id");

	pthread_t t;
	CHECK(pthread_create(&t, NULL, event_thread, NULL) == 0, "the event thread starts");

	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0, "rdma_resolve_addr");
	expect(RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED);
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						  .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC };
	CHECK(rdma_create_qp(id, NULL, &attr) == 0, "client rdma_create_qp");
	CHECK(rdma_connect(id, NULL) == 0, "rdma_connect");
	expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	/* A fresh one: rdma_create_qp wrote the client's CQs into `attr`. */
	struct ibv_qp_init_attr cattr = { .cap = attr.cap, .qp_type = IBV_QPT_RC };
	CHECK(child && rdma_create_qp(child, NULL, &cattr) == 0 && child->recv_cq, "rdma_create_qp on the new id");
	static char rbuf[16], sbuf[16] = "last words";
	struct ibv_mr *rmr = ibv_reg_mr(child->pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(id->pd, sbuf, sizeof(sbuf), 0);
	CHECK(rmr && smr, "ibv_reg_mr of both buffers");
	struct ibv_sge rsge = { .addr = (uintptr_t)rbuf, .length = sizeof(rbuf), .lkey = rmr ? rmr->lkey : 0 };
	struct ibv_recv_wr rwr = { .sg_list = &rsge, .num_sge = 1 }, *bad_r;
	CHECK(ibv_post_recv(child->qp, &rwr, &bad_r) == 0, "post a receive on the new id");
	CHECK(rdma_accept(child, NULL) == 0, "rdma_accept");
	expect(RDMA_CM_EVENT_ESTABLISHED);
	expect(RDMA_CM_EVENT_ESTABLISHED);

	/* Bytes received just now: the destructor waits out the FIN grace after them. */
	struct ibv_sge ssge = { .addr = (uintptr_t)sbuf, .length = sizeof(sbuf), .lkey = smr ? smr->lkey : 0 };
	struct ibv_send_wr swr = { .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad_s;
	CHECK(ibv_post_send(id->qp, &swr, &bad_s) == 0, "ibv_post_send");
	struct ibv_wc wc;
	int n = 0;
	for (int spin = 0; spin < 2000000 && n == 0; spin++)
		n = ibv_poll_cq(child->recv_cq, 1, &wc);
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && strcmp(rbuf, sbuf) == 0, "the SEND arrives");
	ibv_dereg_mr(rmr);
	ibv_dereg_mr(smr);

	/* rping's order: the connection's ids (no disconnect first), the listener, the channel. */
	rdma_destroy_qp(child);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(child) == 0 && rdma_destroy_id(id) == 0 && rdma_destroy_id(listen_id) == 0,
	      "rdma_destroy_id of the connected ids and the listener");
	rdma_destroy_event_channel(ch);
	return check_summary();
}
