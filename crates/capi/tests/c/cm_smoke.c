/*
 * librdmacm semantics through the drop-in library, in one process on loopback: an
 * asynchronous listener and client on one event channel; CONNECT_REQUEST ids (inherited
 * context, verbs, private data); reject (and destroying the new id before acking its request,
 * which librdmacm allows); accept with a QP; a SEND; disconnect; a non-blocking channel.
 *
 * Built by tests/dropin.rs: cc -o cm_smoke cm_smoke.c <dropin>/libibverbs.so.1
 * Prints one line per check; exits 0 only if every check passed. alarm() bounds it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include "check.h"

static struct rdma_event_channel *ch;

/* The next event; fails the check (and returns NULL) if it is not `type`. */
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

static struct rdma_cm_id *client(struct sockaddr *dst, int *marker)
{
	struct rdma_cm_id *id = NULL;
	struct rdma_cm_event *ev;

	CHECK(rdma_create_id(ch, &id, marker, RDMA_PS_TCP) == 0, "client rdma_create_id");
	CHECK(rdma_resolve_addr(id, NULL, dst, 2000) == 0, "rdma_resolve_addr");
	ev = expect(RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(ev && ev->id == id && ev->id->context == marker && id->verbs != NULL, "ADDR_RESOLVED on the id");
	if (ev)
		rdma_ack_cm_event(ev);
	struct sockaddr_in *d = (struct sockaddr_in *)rdma_get_peer_addr(id);
	CHECK(d->sin_port == ((struct sockaddr_in *)dst)->sin_port, "route.addr.dst_addr is the destination");
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	ev = expect(RDMA_CM_EVENT_ROUTE_RESOLVED);
	if (ev)
		rdma_ack_cm_event(ev);
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						  .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	CHECK(rdma_create_qp(id, NULL, &attr) == 0, "client rdma_create_qp");
	return id;
}

int main(void)
{
	alarm(20);
	ch = rdma_create_event_channel();
	CHECK(ch != NULL, "rdma_create_event_channel");
	if (!ch)
		return 1;

	int lctx, cctx;
	struct rdma_cm_id *listen_id = NULL;
	CHECK(rdma_create_id(ch, &listen_id, &lctx, RDMA_PS_TCP) == 0, "listener rdma_create_id");
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&sin) == 0, "rdma_bind_addr 127.0.0.1:0");
	CHECK(rdma_listen(listen_id, 0) == 0, "rdma_listen");
	struct sockaddr_in dst = *(struct sockaddr_in *)rdma_get_local_addr(listen_id);
	CHECK(dst.sin_port != 0, "listening on port %d", ntohs(dst.sin_port));

	/* 1: a request that is rejected; its id is destroyed before the event is acked. */
	struct rdma_cm_id *c1 = client((struct sockaddr *)&dst, &cctx);
	struct rdma_conn_param cp = { .private_data = "hello", .private_data_len = 6, .responder_resources = 1,
				      .initiator_depth = 1, .retry_count = 7 };
	CHECK(rdma_connect(c1, &cp) == 0, "rdma_connect with private data");
	struct rdma_cm_event *req = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	if (!req)
		return 1;
	struct rdma_cm_id *child = req->id;
	CHECK(child != listen_id && req->listen_id == listen_id && child->context == &lctx &&
		      child->verbs == listen_id->verbs && child->channel == ch && child->ps == RDMA_PS_TCP &&
		      child->port_num == 1,
	      "CONNECT_REQUEST: a new id inheriting context, channel and ps; listen_id set");
	CHECK(req->param.conn.private_data_len >= 6 && memcmp(req->param.conn.private_data, "hello", 6) == 0,
	      "the request carries the private data (len %d)", req->param.conn.private_data_len);
	CHECK(rdma_reject(child, "no", 3) == 0, "rdma_reject");
	CHECK(rdma_destroy_id(child) == 0, "rdma_destroy_id of the new id before acking its request");
	rdma_ack_cm_event(req);
	struct rdma_cm_event *ev = expect(RDMA_CM_EVENT_REJECTED);
	CHECK(ev && ev->id == c1 && ev->status == -ECONNREFUSED, "REJECTED on the client, status -ECONNREFUSED");
	if (ev)
		rdma_ack_cm_event(ev);
	rdma_destroy_qp(c1);
	CHECK(rdma_destroy_id(c1) == 0, "rdma_destroy_id of the rejected client");

	/* 2: accepted, one SEND, disconnect. */
	struct rdma_cm_id *c2 = client((struct sockaddr *)&dst, &cctx);
	static char rbuf[64], sbuf[64] = "ping over soft-iWARP";
	struct ibv_mr *smr = ibv_reg_mr(c2->pd, sbuf, sizeof(sbuf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(rdma_connect(c2, NULL) == 0, "rdma_connect (default parameters)");
	req = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	if (!req)
		return 1;
	child = req->id;
	rdma_ack_cm_event(req);
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						  .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC };
	CHECK(rdma_create_qp(child, NULL, &attr) == 0 && child->recv_cq && child->recv_cq_channel,
	      "rdma_create_qp on the new id (library CQs)");
	struct ibv_mr *rmr = ibv_reg_mr(child->pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge rsge = { .addr = (uintptr_t)rbuf, .length = sizeof(rbuf), .lkey = rmr ? rmr->lkey : 0 };
	struct ibv_recv_wr rwr = { .wr_id = 42, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
	CHECK(ibv_post_recv(child->qp, &rwr, &bad_r) == 0, "post a receive on the new id");
	CHECK(rdma_accept(child, NULL) == 0, "rdma_accept");
	int established = 0;
	for (int i = 0; i < 2; i++) {
		ev = expect(RDMA_CM_EVENT_ESTABLISHED);
		if (!ev)
			break;
		established |= ev->id == child ? 1 : ev->id == c2 ? 2 : 4;
		rdma_ack_cm_event(ev);
	}
	CHECK(established == 3, "ESTABLISHED on both ids");
	CHECK(c2->qp->state == IBV_QPS_RTS && child->qp->state == IBV_QPS_RTS, "both QPs are RTS in their C struct");

	struct ibv_sge ssge = { .addr = (uintptr_t)sbuf, .length = 21, .lkey = smr ? smr->lkey : 0 };
	struct ibv_send_wr swr = { .wr_id = 7, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED },
			   *bad_s;
	CHECK(ibv_post_send(c2->qp, &swr, &bad_s) == 0, "ibv_post_send");
	struct ibv_wc wc;
	int n = 0;
	for (int spin = 0; spin < 2000000 && n == 0; spin++)
		n = ibv_poll_cq(child->recv_cq, 1, &wc);
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 42 && wc.opcode == IBV_WC_RECV &&
		      wc.byte_len == 21 && wc.qp_num == child->qp->qp_num && strcmp(rbuf, sbuf) == 0,
	      "the receive completes with the data (n=%d byte_len=%u)", n, n == 1 ? wc.byte_len : 0);
	n = 0;
	for (int spin = 0; spin < 2000000 && n == 0; spin++)
		n = ibv_poll_cq(c2->send_cq, 1, &wc);
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 7 && wc.opcode == IBV_WC_SEND,
	      "the send completes");

	CHECK(rdma_disconnect(c2) == 0, "rdma_disconnect");
	int disconnected = 0;
	for (int i = 0; i < 2; i++) {
		ev = expect(RDMA_CM_EVENT_DISCONNECTED);
		if (!ev)
			break;
		disconnected |= ev->id == child ? 1 : ev->id == c2 ? 2 : 4;
		rdma_ack_cm_event(ev);
	}
	CHECK(disconnected == 3, "DISCONNECTED on both ids");
	CHECK(rdma_disconnect(child) == 0, "rdma_disconnect after the peer disconnected: 0");

	int fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "O_NONBLOCK channel: -1/EAGAIN");

	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	rdma_destroy_qp(child);
	rdma_destroy_qp(c2);
	CHECK(rdma_destroy_id(child) == 0 && rdma_destroy_id(c2) == 0 && rdma_destroy_id(listen_id) == 0,
	      "rdma_destroy_id");
	rdma_destroy_event_channel(ch);

	return check_summary();
}
