/*
 * UCX init/cleanup cycles in one process (issue #16): each cycle is ucp_init, two workers,
 * an endpoint from one to the other (by worker address, so over the transports UCX_TLS and
 * UCX_NET_DEVICES allow: the test gives it the softrdma RoCE device), one 4 KiB tag message
 * checked byte by byte, the endpoint closed, the workers destroyed and ucp_cleanup. After a
 * warm-up cycle (which may leave what lives for the whole process: loaded modules, the
 * drop-in's progress thread) the open fds (/proc/self/fd) and threads (/proc/self/task)
 * must be the same after CYCLES more cycles.
 *
 *   ucx_cycles CYCLES
 */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include "check.h"
#include "cycle_leaks.h"

#define SIZE 4096
#define BOUND_SECONDS 10


/* Progresses both workers until `req` completes; its status. */
static ucs_status_t wait2(ucp_worker_h a, ucp_worker_h b, ucs_status_ptr_t req)
{
	if (req == NULL)
		return UCS_OK;
	if (UCS_PTR_IS_ERR(req))
		return UCS_PTR_STATUS(req);
	double deadline = now() + BOUND_SECONDS;
	ucs_status_t st;
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && now() < deadline) {
		ucp_worker_progress(a);
		ucp_worker_progress(b);
	}
	if (st == UCS_INPROGRESS) {
		ucp_request_cancel(a, req);
		return UCS_ERR_TIMED_OUT; /* the request is leaked: the run fails anyway */
	}
	ucp_request_free(req);
	return st;
}

/* One cycle; 0 if everything worked and the data arrived intact. */
static int cycle(int n)
{
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
	ucp_context_h ctx;
	ucs_status_t st = ucp_init(&params, NULL, &ctx);
	if (st != UCS_OK) {
		printf("cycle %d: ucp_init: %s\n", n, ucs_status_string(st));
		return 1;
	}
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
				  .thread_mode = UCS_THREAD_MODE_SINGLE};
	ucp_worker_h a, b;
	int bad = 1;
	if ((st = ucp_worker_create(ctx, &wp, &a)) != UCS_OK)
		goto out_ctx;
	if ((st = ucp_worker_create(ctx, &wp, &b)) != UCS_OK)
		goto out_a;
	ucp_address_t *addr;
	size_t addr_len;
	if ((st = ucp_worker_get_address(b, &addr, &addr_len)) != UCS_OK)
		goto out_b;
	ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = addr};
	ucp_ep_h ep;
	st = ucp_ep_create(a, &ep_params, &ep);
	ucp_worker_release_address(b, addr);
	if (st != UCS_OK)
		goto out_b;
	static unsigned char out[SIZE], in[SIZE];
	for (size_t i = 0; i < SIZE; i++)
		out[i] = (unsigned char)(i * 11u + (unsigned)n);
	memset(in, 0, SIZE);
	ucp_request_param_t p = {0};
	ucs_status_ptr_t rreq = ucp_tag_recv_nbx(b, in, SIZE, 7, (ucp_tag_t)-1, &p);
	st = wait2(a, b, ucp_tag_send_nbx(ep, out, SIZE, 7, &p));
	ucs_status_t rst = wait2(a, b, rreq);
	bad = st != UCS_OK || rst != UCS_OK || memcmp(in, out, SIZE) != 0;
	if (bad)
		printf("cycle %d: send %s, receive %s, data %s\n", n, ucs_status_string(st), ucs_status_string(rst),
		       memcmp(in, out, SIZE) ? "differs" : "intact");
	ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = 0};
	st = wait2(a, b, ucp_ep_close_nbx(ep, &cp));
	if (st != UCS_OK) {
		printf("cycle %d: ep close: %s\n", n, ucs_status_string(st));
		bad = 1;
	}
out_b:
	ucp_worker_destroy(b);
out_a:
	ucp_worker_destroy(a);
out_ctx:
	ucp_cleanup(ctx);
	if (st != UCS_OK && bad)
		printf("cycle %d: %s\n", n, ucs_status_string(st));
	return bad;
}

int main(int argc, char **argv)
{
	int cycles = argc > 1 ? atoi(argv[1]) : 100;
	int failed = cycle(0);
	CHECK(!failed, "warm-up cycle");
	check_cycles_leak_nothing(cycle, cycles, "moved and checked their data");
	return check_summary();
}
