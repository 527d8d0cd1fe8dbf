/*
 * Helpers of the C test programs that connect RC QPs on 127.0.0.1 themselves (fork.c,
 * idle.c): a monotonic clock in ms, INIT → RTR → RTS towards a QP of the same process over the
 * GID ::ffff:127.0.0.1 (rxe_lo), and the next rdma_cm event of an expected type.
 * Include check.h first.
 */
#ifndef SOFTRDMA_TEST_RC_LOOPBACK_H
#define SOFTRDMA_TEST_RC_LOOPBACK_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static const uint8_t LO_GID[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1 };

static inline double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Moves `qp` (port 1) to RTS, connected to QP `remote_qpn` at 127.0.0.1, with `access` as its
 * remote access flags; 0 on success. */
static inline int rc_to_rts(struct ibv_qp *qp, uint32_t remote_qpn, int access)
{
	struct ibv_qp_attr at;

	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_INIT;
	at.port_num = 1;
	at.qp_access_flags = access;
	if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = IBV_MTU_1024;
	at.dest_qp_num = remote_qpn;
	at.rq_psn = 0;
	at.max_dest_rd_atomic = 1;
	at.min_rnr_timer = 12;
	at.ah_attr.is_global = 1;
	memcpy(at.ah_attr.grh.dgid.raw, LO_GID, 16);
	at.ah_attr.grh.hop_limit = 64;
	at.ah_attr.grh.sgid_index = 0;
	at.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &at,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = 14;
	at.retry_cnt = 7;
	at.rnr_retry = 7;
	at.sq_psn = 0;
	at.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &at,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

/* The next CM event on `ch`, NULL (and a failed check naming `who`) if it is not `type`. */
static inline struct rdma_cm_event *expect_event(struct rdma_event_channel *ch, enum rdma_cm_event_type type,
						  const char *who)
{
	struct rdma_cm_event *ev = NULL;

	if (rdma_get_cm_event(ch, &ev)) {
		CHECK(0, "%s: rdma_get_cm_event: %s", who, strerror(errno));
		return NULL;
	}
	CHECK(ev->event == type, "%s: event %s (want %s), status %d", who, rdma_event_str(ev->event),
	      rdma_event_str(type), ev->status);
	if (ev->event != type) {
		rdma_ack_cm_event(ev);
		return NULL;
	}
	return ev;
}

#endif
