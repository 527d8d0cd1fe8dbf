/*
 * UCP over a sockaddr (connection-manager) connection (issue #16): the server listens with
 * ucp_listener_create on ADDR:PORT and accepts the connection request with
 * ucp_ep_create(UCP_EP_PARAM_FIELD_CONN_REQUEST); the client connects with
 * ucp_ep_create(UCP_EP_PARAM_FIELD_SOCK_ADDR). Which connection manager is used is UCX's
 * choice, narrowed by UCX_SOCKADDR_TLS_PRIORITY (the test sets "rdmacm").
 *
 *   ucx_sockaddr server ADDR PORT
 *   ucx_sockaddr client ADDR PORT
 *
 * Then tag-matched messages of 8 B, 4 KiB, 64 KiB and 1 MiB, ITERS of each: the client sends
 * a pattern, the server checks every byte and answers with another pattern, which the client
 * checks. Then one-sided: the server maps a window (ucp_mem_map) and sends its address and
 * packed rkey; the client puts 1 MiB into it (ucp_put_nbx, then ucp_ep_flush_nbx) and gets
 * 4,099 bytes the server wrote at an odd offset (ucp_get_nbx), checking them; the server checks
 * every byte the put left once the client says it is done. Every wait is bounded (20 s); the
 * output ends with check.h's summary line.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "check.h"

#define ITERS 5
#define BOUND_SECONDS 20
#define PUT_SIZE (1 << 20)
#define GET_OFFSET (PUT_SIZE + 3)
#define GET_SIZE 4099
#define TAG_RKEY 0xAA0000000000ull
#define TAG_DONE 0xAB0000000000ull

static const size_t sizes[] = {8, 4096, 65536, 1 << 20};

static ucp_worker_h worker;
static ucp_conn_request_h conn_request;
static ucs_status_t peer_error = UCS_OK;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static unsigned char pattern(size_t i, size_t size, int iter, int dir)
{
	return (unsigned char)(i * 7u + size * 3u + (unsigned)iter * 13u + (unsigned)dir * 101u);
}

static void on_conn_request(ucp_conn_request_h req, void *arg)
{
	(void)arg;
	if (conn_request == NULL)
		conn_request = req;
	else
		ucp_listener_reject(NULL, req);
}

static void on_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	(void)arg;
	(void)ep;
	peer_error = status;
}

/* Progresses until `req` completes; its status (a timeout is UCS_ERR_TIMED_OUT). */
static ucs_status_t wait_request(ucs_status_ptr_t req)
{
	if (req == NULL)
		return UCS_OK;
	if (UCS_PTR_IS_ERR(req))
		return UCS_PTR_STATUS(req);
	double deadline = now() + BOUND_SECONDS;
	ucs_status_t st;
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
		ucp_worker_progress(worker);
		if (now() > deadline) {
			ucp_request_cancel(worker, req);
			while (ucp_request_check_status(req) == UCS_INPROGRESS)
				ucp_worker_progress(worker);
			ucp_request_free(req);
			return UCS_ERR_TIMED_OUT;
		}
	}
	ucp_request_free(req);
	return st;
}

static ucs_status_t send_msg(ucp_ep_h ep, void *buf, size_t len, ucp_tag_t tag)
{
	ucp_request_param_t p = {0};
	return wait_request(ucp_tag_send_nbx(ep, buf, len, tag, &p));
}

static ucs_status_t recv_msg(void *buf, size_t len, ucp_tag_t tag)
{
	ucp_request_param_t p = {0};
	return wait_request(ucp_tag_recv_nbx(worker, buf, len, tag, (ucp_tag_t)-1, &p));
}

static size_t mismatches(const unsigned char *buf, size_t size, int iter, int dir)
{
	size_t bad = 0;
	for (size_t i = 0; i < size; i++)
		bad += buf[i] != pattern(i, size, iter, dir);
	return bad;
}

/* The one-sided part (see the top); `ctx` maps the server's window. */
static void rma(ucp_context_h ctx, ucp_ep_h ep, int server)
{
	struct {
		uint64_t addr;
		uint64_t rkey_len;
		unsigned char rkey[1000];
	} msg = {0};
	ucs_status_t st;
	if (server) {
		size_t win_len = GET_OFFSET + GET_SIZE;
		unsigned char *win = calloc(1, win_len);
		for (size_t i = 0; i < GET_SIZE; i++)
			win[GET_OFFSET + i] = pattern(i, GET_SIZE, 0, 2);
		ucp_mem_map_params_t mp = {
			.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
			.address = win,
			.length = win_len,
		};
		ucp_mem_h memh;
		st = ucp_mem_map(ctx, &mp, &memh);
		CHECK(st == UCS_OK, "ucp_mem_map of %zu bytes: %s", win_len, ucs_status_string(st));
		if (st != UCS_OK)
			return;
		void *rkey_buf;
		size_t rkey_len;
		st = ucp_rkey_pack(ctx, memh, &rkey_buf, &rkey_len);
		CHECK(st == UCS_OK && rkey_len <= sizeof(msg.rkey), "ucp_rkey_pack: %s, %zu bytes",
		      ucs_status_string(st), rkey_len);
		if (st == UCS_OK && rkey_len <= sizeof(msg.rkey)) {
			msg.addr = (uint64_t)(uintptr_t)win;
			msg.rkey_len = rkey_len;
			memcpy(msg.rkey, rkey_buf, rkey_len);
			st = send_msg(ep, &msg, sizeof(msg), TAG_RKEY);
			CHECK(st == UCS_OK, "window address and rkey sent: %s", ucs_status_string(st));
			uint64_t done = 0;
			st = recv_msg(&done, sizeof(done), TAG_DONE);
			CHECK(st == UCS_OK && done == 1, "the client's put/get are done: %s", ucs_status_string(st));
			size_t bad = mismatches(win, PUT_SIZE, 0, 3);
			CHECK(st == UCS_OK && bad == 0, "every byte of the 1 MiB put arrived (%zu wrong)", bad);
			ucp_rkey_buffer_release(rkey_buf);
		}
		ucp_mem_unmap(ctx, memh);
		free(win);
		return;
	}
	st = recv_msg(&msg, sizeof(msg), TAG_RKEY);
	CHECK(st == UCS_OK, "window address and rkey received: %s", ucs_status_string(st));
	if (st != UCS_OK)
		return;
	ucp_rkey_h rkey;
	st = ucp_ep_rkey_unpack(ep, msg.rkey, &rkey);
	CHECK(st == UCS_OK, "ucp_ep_rkey_unpack: %s", ucs_status_string(st));
	if (st != UCS_OK)
		return;
	unsigned char *local = malloc(PUT_SIZE);
	for (size_t i = 0; i < PUT_SIZE; i++)
		local[i] = pattern(i, PUT_SIZE, 0, 3);
	ucp_request_param_t p = {0};
	st = wait_request(ucp_put_nbx(ep, local, PUT_SIZE, msg.addr, rkey, &p));
	if (st == UCS_OK)
		st = wait_request(ucp_ep_flush_nbx(ep, &p));
	CHECK(st == UCS_OK, "ucp_put_nbx of 1 MiB and ucp_ep_flush_nbx: %s", ucs_status_string(st));
	memset(local, 0, GET_SIZE);
	st = wait_request(ucp_get_nbx(ep, local, GET_SIZE, msg.addr + GET_OFFSET, rkey, &p));
	size_t bad = mismatches(local, GET_SIZE, 0, 2);
	CHECK(st == UCS_OK && bad == 0, "ucp_get_nbx of %d bytes at an odd offset: %s, %zu wrong", GET_SIZE,
	      ucs_status_string(st), bad);
	ucp_rkey_destroy(rkey);
	free(local);
	uint64_t done = 1;
	st = send_msg(ep, &done, sizeof(done), TAG_DONE);
	CHECK(st == UCS_OK, "done sent: %s", ucs_status_string(st));
}

int main(int argc, char **argv)
{
	if (argc != 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: %s server|client ADDR PORT\n", argv[0]);
		return 2;
	}
	int server = strcmp(argv[1], "server") == 0;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
	if (inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", argv[2]);
		return 2;
	}

	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG | UCP_FEATURE_RMA};
	ucp_context_h ctx;
	ucs_status_t st = ucp_init(&params, NULL, &ctx);
	CHECK(st == UCS_OK, "ucp_init: %s", ucs_status_string(st));
	if (st != UCS_OK)
		return check_summary();
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
				  .thread_mode = UCS_THREAD_MODE_SINGLE};
	st = ucp_worker_create(ctx, &wp, &worker);
	CHECK(st == UCS_OK, "ucp_worker_create: %s", ucs_status_string(st));
	if (st != UCS_OK)
		return check_summary();

	ucp_ep_params_t ep_params = {
		.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
		.err_mode = UCP_ERR_HANDLING_MODE_PEER,
		.err_handler = {.cb = on_error, .arg = NULL},
	};
	ucp_listener_h listener = NULL;
	if (server) {
		ucp_listener_params_t lp = {
			.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
			.sockaddr = {.addr = (const struct sockaddr *)&sa, .addrlen = sizeof(sa)},
			.conn_handler = {.cb = on_conn_request, .arg = NULL},
		};
		st = ucp_listener_create(worker, &lp, &listener);
		CHECK(st == UCS_OK, "ucp_listener_create on %s:%s: %s", argv[2], argv[3], ucs_status_string(st));
		if (st != UCS_OK)
			return check_summary();
		double deadline = now() + BOUND_SECONDS;
		while (conn_request == NULL && now() < deadline)
			ucp_worker_progress(worker);
		CHECK(conn_request != NULL, "a connection request within %d s", BOUND_SECONDS);
		if (conn_request == NULL)
			return check_summary();
		ucp_conn_request_attr_t ra = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
		if (ucp_conn_request_query(conn_request, &ra) == UCS_OK) {
			char host[64] = "?";
			const struct sockaddr_in *c = (const struct sockaddr_in *)&ra.client_address;
			inet_ntop(AF_INET, &c->sin_addr, host, sizeof(host));
			printf("connection request from %s\n", host);
		}
		ep_params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
		ep_params.conn_request = conn_request;
	} else {
		ep_params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
		ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
		ep_params.sockaddr.addr = (const struct sockaddr *)&sa;
		ep_params.sockaddr.addrlen = sizeof(sa);
	}
	ucp_ep_h ep;
	st = ucp_ep_create(worker, &ep_params, &ep);
	CHECK(st == UCS_OK, "ucp_ep_create (%s): %s", server ? "accept" : "connect", ucs_status_string(st));
	if (st != UCS_OK)
		return check_summary();

	unsigned char *buf = malloc(1 << 20);
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t size = sizes[s];
		size_t bad_total = 0;
		int failed = 0;
		for (int iter = 0; iter < ITERS && !failed; iter++) {
			ucp_tag_t tag = ((ucp_tag_t)s << 32) | (ucp_tag_t)iter;
			if (server) {
				memset(buf, 0, size);
				st = recv_msg(buf, size, tag);
				bad_total += mismatches(buf, size, iter, 0);
				for (size_t i = 0; st == UCS_OK && i < size; i++)
					buf[i] = pattern(i, size, iter, 1);
				if (st == UCS_OK)
					st = send_msg(ep, buf, size, tag | (1ull << 48));
			} else {
				for (size_t i = 0; i < size; i++)
					buf[i] = pattern(i, size, iter, 0);
				st = send_msg(ep, buf, size, tag);
				memset(buf, 0, size);
				if (st == UCS_OK)
					st = recv_msg(buf, size, tag | (1ull << 48));
				bad_total += mismatches(buf, size, iter, 1);
			}
			failed = st != UCS_OK;
		}
		CHECK(!failed, "%zu B x %d: transfers complete (%s)", size, ITERS, ucs_status_string(st));
		CHECK(!failed && bad_total == 0, "%zu B x %d: every byte %s checked (%zu wrong)", size, ITERS,
		      server ? "received" : "echoed", bad_total);
		if (failed)
			break;
	}
	free(buf);
	if (!failures)
		rma(ctx, ep, server);

	/* Both sides have their last message: the client's reply came, the server's send
	 * completed. A flushing close; the peer may close at the same moment. */
	ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = 0};
	st = wait_request(ucp_ep_close_nbx(ep, &cp));
	printf("ep close: %s\n", ucs_status_string(st));
	CHECK(st == UCS_OK || st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT,
	      "ep close ends (%s)", ucs_status_string(st));
	CHECK(peer_error == UCS_OK || peer_error == UCS_ERR_CONNECTION_RESET,
	      "no peer error other than the peer's close (%s)", ucs_status_string(peer_error));
	if (listener)
		ucp_listener_destroy(listener);
	ucp_worker_destroy(worker);
	ucp_cleanup(ctx);
	return check_summary();
}
