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

#define SIZE 4096
#define BOUND_SECONDS 10

/* "fd -> target" lines of the open fds, into buf. */
static void fd_list(char *buf, size_t len)
{
	DIR *d = opendir("/proc/self/fd");
	size_t used = 0;
	struct dirent *e;
	buf[0] = 0;
	while (d && (e = readdir(d)) != NULL && used + 300 < len) {
		if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
			continue;
		char path[300], target[256] = "?";
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		target[n > 0 ? n : 1] = 0;
		used += (size_t)snprintf(buf + used, len - used, "  %s -> %s\n", e->d_name, target);
	}
	if (d)
		closedir(d);
}

static char fds_before[16384], fds_after[16384];

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n - (strcmp(dir, "/proc/self/fd") == 0); /* the DIR's own fd */
}

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

/* The entries of `dir` once they have stayed the same for 200 ms (2 s at most): what a
 * close or a thread exit still under way in the background leaves must not count. */
static int settled(const char *dir)
{
	double deadline = now() + 2;
	int n = count_entries(dir), same = 0;
	while (same < 4 && now() < deadline) {
		usleep(50000);
		int m = count_entries(dir);
		same = m == n ? same + 1 : 0;
		n = m;
	}
	return n;
}

int main(int argc, char **argv)
{
	int cycles = argc > 1 ? atoi(argv[1]) : 100;
	int failed = cycle(0);
	CHECK(!failed, "warm-up cycle");
	int fds0 = settled("/proc/self/fd"), tasks0 = settled("/proc/self/task");
	fd_list(fds_before, sizeof(fds_before));
	printf("after the warm-up: %d fds, %d threads\n", fds0, tasks0);
	double t0 = now();
	int bad = 0;
	for (int i = 1; i <= cycles; i++)
		bad += cycle(i);
	int fds1 = settled("/proc/self/fd"), tasks1 = settled("/proc/self/task");
	printf("after %d more cycles (%.1f s): %d fds, %d threads\n", cycles, now() - t0, fds1, tasks1);
	CHECK(bad == 0, "%d cycles moved and checked their data (%d failed)", cycles, bad);
	if (fds1 != fds0) {
		fd_list(fds_after, sizeof(fds_after));
		printf("fds after the warm-up:\n%sfds at the end:\n%s", fds_before, fds_after);
	}
	CHECK(fds1 == fds0, "no fd leaked (%d before, %d after)", fds0, fds1);
	CHECK(tasks1 == tasks0, "no thread leaked (%d before, %d after)", tasks0, tasks1);
	return check_summary();
}
