/*
 * bad_rkey_read SERVER PORT: connects with rdma_cm to a server that accepts and then waits
 * (rping -s), and issues an RDMA READ with an rkey the server never gave out. The responder
 * must refuse it (iWARP: a Terminate, remote protection error; RoCE: a NAK, remote access
 * error), and this side must report what ibv_poll_cq(3) documents for it:
 *   - the READ completes with IBV_WC_REM_ACCESS_ERR, within a bound, never a hang;
 *   - the QP is in the error state: a SEND posted afterwards completes with IBV_WC_WR_FLUSH_ERR;
 *   - the process goes on working: disconnect and teardown return.
 * Every wait is bounded; prints one line per check and "PASSED"/"FAILED" (check.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

/* Never handed out by the server: siw and rxe index their keys from small numbers. */
#define BAD_RKEY 0xfffffe42u
#define BOUND_MS 20000

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Polls cq for one completion for up to BOUND_MS; returns 1 and fills wc, or 0. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	long deadline = now_ms() + BOUND_MS;
	struct timespec pause = { 0, 1000000 };

	while (now_ms() < deadline) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n < 0)
			return 0;
		if (n == 1)
			return 1;
		nanosleep(&pause, NULL);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints = { 0 }, *res = NULL;
	struct ibv_qp_init_attr attr = { 0 };
	struct rdma_conn_param param = { 0 };
	struct rdma_cm_id *id = NULL;
	struct ibv_mr *mr = NULL;
	struct ibv_wc wc;
	static char buf[4096];
	long start;
	int ret;

	if (argc != 3) {
		fprintf(stderr, "usage: %s SERVER PORT\n", argv[0]);
		return 2;
	}
	hints.ai_port_space = RDMA_PS_TCP;
	ret = rdma_getaddrinfo(argv[1], argv[2], &hints, &res);
	CHECK(ret == 0, "rdma_getaddrinfo %s:%s: %s", argv[1], argv[2], ret ? strerror(errno) : "ok");
	if (ret)
		return check_summary();
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 1;
	ret = rdma_create_ep(&id, res, NULL, &attr);
	rdma_freeaddrinfo(res);
	CHECK(ret == 0, "rdma_create_ep: %s", ret ? strerror(errno) : "ok");
	if (ret)
		return check_summary();
	mr = rdma_reg_msgs(id, buf, sizeof(buf));
	CHECK(mr != NULL, "rdma_reg_msgs: %s", mr ? "ok" : strerror(errno));
	if (!mr)
		return check_summary();
	param.initiator_depth = 1;
	param.responder_resources = 1;
	param.retry_count = 7;
	ret = rdma_connect(id, &param);
	CHECK(ret == 0, "rdma_connect to %s:%s: %s", argv[1], argv[2], ret ? strerror(errno) : "ok");
	if (ret)
		return check_summary();

	start = now_ms();
	ret = rdma_post_read(id, (void *)1, buf, sizeof(buf), mr, IBV_SEND_SIGNALED, 0x1000, BAD_RKEY);
	CHECK(ret == 0, "rdma_post_read with rkey %#x: %s", BAD_RKEY, ret ? strerror(ret) : "posted");
	if (ret)
		return check_summary();
	ret = poll_one(id->send_cq, &wc);
	CHECK(ret == 1, "the READ completed within %d ms", BOUND_MS);
	if (ret == 1) {
		CHECK(wc.wr_id == 1 && wc.status == IBV_WC_REM_ACCESS_ERR,
		      "the READ's status: %s (%d, vendor_err %#x) after %ld ms, expected %s", ibv_wc_status_str(wc.status),
		      wc.status, wc.vendor_err, now_ms() - start, ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
	}

	ret = rdma_post_send(id, (void *)2, buf, 64, mr, IBV_SEND_SIGNALED);
	if (ret == 0) {
		ret = poll_one(id->send_cq, &wc);
		CHECK(ret == 1 && wc.wr_id == 2 && wc.status == IBV_WC_WR_FLUSH_ERR,
		      "a SEND posted after the error: %s (the QP is in the error state)",
		      ret == 1 ? ibv_wc_status_str(wc.status) : "no completion");
	} else {
		/* Also documented: the provider may refuse posts to a QP in the error state. */
		CHECK(ret == EINVAL || ret == ENOMEM, "a SEND posted after the error is refused: %s", strerror(ret));
	}

	start = now_ms();
	rdma_disconnect(id);
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	CHECK(now_ms() - start < BOUND_MS, "disconnect and teardown took %ld ms", now_ms() - start);
	return check_summary();
}
