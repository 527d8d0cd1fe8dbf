/*
 * Helpers of the C test programs that connect RC QPs on 127.0.0.1 themselves (fork.c,
 * idle.c, async_events.c): a monotonic clock in ms, INIT → RTR → RTS towards a QP of the same
 * process (by default over the GID ::ffff:127.0.0.1, rxe_lo), and the next rdma_cm event of an
 * expected type.
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

/* Moves `qp` (port 1) from RESET through INIT to RTR, connected to QP `remote_qpn` at GID
 * `dgid`, with `access` as its remote access flags; 0 on success. */
static inline int rc_to_rtr(struct ibv_qp *qp, uint32_t remote_qpn, const union ibv_gid *dgid, int access)
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
	at.ah_attr.grh.dgid = *dgid;
	at.ah_attr.grh.hop_limit = 64;
	at.ah_attr.grh.sgid_index = 0;
	at.ah_attr.port_num = 1;
	return ibv_modify_qp(qp, &at,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

/* Moves `qp` from RTR to RTS with the given ACK timeout and retry counts; 0 on success. */
static inline int rc_rtr_to_rts(struct ibv_qp *qp, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry)
{
	struct ibv_qp_attr at;

	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = timeout;
	at.retry_cnt = retry_cnt;
	at.rnr_retry = rnr_retry;
	at.sq_psn = 0;
	at.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &at,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Moves `qp` (port 1) to RTS, connected to QP `remote_qpn` at 127.0.0.1, with `access` as its
 * remote access flags (ACK timeout 14, 7 retries, 7 RNR retries); 0 on success. */
static inline int rc_to_rts(struct ibv_qp *qp, uint32_t remote_qpn, int access)
{
	union ibv_gid lo;

	memcpy(lo.raw, LO_GID, sizeof(lo.raw));
	if (rc_to_rtr(qp, remote_qpn, &lo, access))
		return -1;
	return rc_rtr_to_rts(qp, 14, 7, 7);
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
