/*
 * Asynchronous events of the drop-in through the real rdma-core headers, on rxe_lo: two RC
 * QPs connected to each other with ibv_modify_qp (GID 0 = ::ffff:127.0.0.1), the receiver on
 * an SRQ. Every event is awaited with poll(2) on ibv_context.async_fd (bounded), then read
 * with ibv_get_async_event and acknowledged:
 *   - COMM_EST when the first message reaches the receiver while it is in RTR,
 *   - SRQ_LIMIT_REACHED once the armed SRQ falls below its limit (ibv_modify_srq IBV_SRQ_LIMIT),
 *   - QP_LAST_WQE_REACHED when the SRQ's QP is moved to ERR,
 *   - QP_FATAL when the sender's retries to that QP run out,
 *   - CQ_ERR when a CQ overflows,
 *   - EAGAIN from ibv_get_async_event on an O_NONBLOCK async_fd with nothing pending,
 *   - ibv_destroy_qp waits for the acknowledgement of its events (EBUSY after its bound).
 *
 * Built by tests/dropin.rs against the drop-in, run with a config holding rxe_lo. Prints one
 * line per check; exits 0 only if every check passed.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "rc_loopback.h"

/* Waits (at most `ms`) for the next async event; 0 if one was read into *ev. */
static int next_event(struct ibv_context *ctx, struct ibv_async_event *ev, int ms)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	if (poll(&p, 1, ms) != 1)
		return -1;
	return ibv_get_async_event(ctx, ev);
}

/* RESET -> INIT -> RTR -> RTS, connected to remote_qpn; no RNR retries. */
static int to_rts(struct ibv_qp *qp, uint32_t remote_qpn, union ibv_gid *gid, uint8_t timeout, uint8_t retry)
{
	if (rc_to_rtr(qp, remote_qpn, gid, IBV_ACCESS_REMOTE_WRITE))
		return -1;
	return rc_rtr_to_rts(qp, timeout, retry, 0);
}

static int send_one(struct ibv_qp *qp, struct ibv_mr *mr, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	return ibv_post_send(qp, &wr, &bad);
}

/* Polls `cq` until one completion arrives (bounded). */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 5000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	return 0;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *dev = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), "rxe_lo"))
			dev = list[i];
	CHECK(dev != NULL, "rxe_lo is listed");
	if (!dev)
		return 1;
	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx != NULL && ctx->async_fd >= 0, "ibv_open_device: async_fd %d", ctx ? ctx->async_fd : -1);
	struct ibv_async_event ev;
	CHECK(next_event(ctx, &ev, 0) == -1, "no event pending at first: async_fd not readable");

	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "GID 0");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_srq_init_attr sia = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sia);
	CHECK(pd && mr && cq && srq, "PD, MR, CQ and SRQ");

	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .cap = { .max_send_wr = 16, .max_recv_wr = 16,
			.max_send_sge = 1, .max_recv_sge = 1 }, .qp_type = IBV_QPT_RC };
	struct ibv_qp *sender = ibv_create_qp(pd, &ia);
	ia.srq = srq;
	struct ibv_qp *receiver = ibv_create_qp(pd, &ia);
	CHECK(sender && receiver, "two RC QPs, the receiver on the SRQ");
	/* timeout 8 (~1 ms), 1 retry: the sender gives up quickly once the receiver is gone. The
	 * receiver stays in RTR for the first message: COMM_EST. */
	CHECK(to_rts(sender, receiver->qp_num, &gid, 8, 1) == 0 &&
		      rc_to_rtr(receiver, sender->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE) == 0,
	      "sender in RTS, receiver in RTR");

	for (int i = 0; i < 10; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf + 2048, .length = 64, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		ibv_post_srq_recv(srq, &wr, &bad);
	}
	struct ibv_srq_attr sa = { .srq_limit = 8 };
	CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0, "ibv_modify_srq arms the limit at 8 (10 posted)");
	struct ibv_srq_attr q;
	CHECK(ibv_query_srq(srq, &q) == 0 && q.srq_limit == 8 && q.max_wr >= 16, "ibv_query_srq: limit 8");

	struct ibv_wc wc;
	int sent = 0;
	if (send_one(sender, mr, 99) == 0 && wait_wc(cq, &wc) && wait_wc(cq, &wc))
		sent++;
	CHECK(sent == 1, "a SEND to the QP in RTR is delivered");
	CHECK(next_event(ctx, &ev, 2000) == 0 && ev.event_type == IBV_EVENT_COMM_EST && ev.element.qp == receiver,
	      "COMM_EST for the receiver (its first packet, in RTR)");
	ibv_ack_async_event(&ev);
	CHECK(rc_rtr_to_rts(receiver, 8, 1, 0) == 0, "receiver to RTS");
	sent = 0;
	for (int i = 0; i < 2; i++) {
		if (send_one(sender, mr, i) == 0 && wait_wc(cq, &wc) && wait_wc(cq, &wc))
			sent++;
	}
	CHECK(sent == 2, "3 SENDs delivered through the SRQ in all");
	CHECK(next_event(ctx, &ev, 2000) == 0 && ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq,
	      "SRQ_LIMIT_REACHED for the SRQ (7 WRs left < 8)");
	ibv_ack_async_event(&ev);
	CHECK(ibv_query_srq(srq, &q) == 0 && q.srq_limit == 0, "the limit disarmed itself");

	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(receiver, &err, IBV_QP_STATE) == 0, "receiver to ERR");
	CHECK(next_event(ctx, &ev, 2000) == 0 && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
		      ev.element.qp == receiver,
	      "QP_LAST_WQE_REACHED for the receiver");
	ibv_ack_async_event(&ev);

	CHECK(send_one(sender, mr, 50) == 0, "a SEND to the QP in ERR");
	CHECK(wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_RETRY_EXC_ERR, "it completes with RETRY_EXC_ERR (status %d)",
	      wc.status);
	CHECK(next_event(ctx, &ev, 2000) == 0 && ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == sender,
	      "QP_FATAL for the sender");
	/* Not acknowledged yet: destroying the sender must wait for it, then give up (EBUSY). */
	CHECK(ibv_destroy_qp(sender) == EBUSY, "ibv_destroy_qp with an unacknowledged event: EBUSY");
	ibv_ack_async_event(&ev);

	struct ibv_cq *tiny = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	ia.srq = NULL;
	ia.send_cq = ia.recv_cq = tiny;
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
	CHECK(tiny && a && b && to_rts(a, b->qp_num, &gid, 14, 7) == 0 && to_rts(b, a->qp_num, &gid, 14, 7) == 0,
	      "two more QPs on a CQ of one entry");
	for (int i = 0; i < 3; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED, .wr.rdma = { (uintptr_t)buf + 1024, mr->rkey } },
				   *bad;
		ibv_post_send(a, &wr, &bad);
	}
	CHECK(next_event(ctx, &ev, 2000) == 0 && ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == tiny,
	      "CQ_ERR when three completions meet a CQ of one entry");
	ibv_ack_async_event(&ev);

	int flags = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "O_NONBLOCK async_fd, nothing pending: EAGAIN");

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0 && ibv_destroy_qp(sender) == 0 &&
		      ibv_destroy_qp(receiver) == 0,
	      "QPs destroyed once their events are acknowledged");
	CHECK(ibv_destroy_srq(srq) == 0 && ibv_destroy_cq(tiny) == 0 && ibv_destroy_cq(cq) == 0 &&
		      ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0,
	      "everything else released");
	ibv_free_device_list(list);
	return check_summary();
}
