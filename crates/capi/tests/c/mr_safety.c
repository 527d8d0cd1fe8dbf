/*
 * Registered memory never faults and never strays (issue #12), through the drop-in library,
 * on the transport rdma_cm picks for 127.0.0.1 (run once per transport by tests/dropin.rs):
 *
 * 1. ibv_reg_mr refuses what the kernel cannot pin: unmapped, PROT_NONE, half-unmapped and
 *    oversized ranges (EFAULT), a range wrapping the address space (EINVAL), read-only memory
 *    with LOCAL_WRITE (EFAULT); read-only memory with remote read only registers.
 * 2. A peer cannot reach a byte outside what was registered: READ and WRITE one byte before
 *    and after an MR whose neighbours hold a secret fail with REM_ACCESS_ERR, and the secret
 *    is unchanged.
 * 3. Deregistration during a 64 MiB WRITE, READ and SEND, of the source and of the target
 *    buffer: on even rounds the buffer is unmapped right after ibv_dereg_mr returns (the
 *    process must not fault); on odd rounds it stays mapped and, once dereg returned, no byte
 *    of it may change (it is compared after the work request completed and the connection
 *    is gone).
 *
 * Usage: mr_safety [ROUNDS]  (default 200 per case). Prints one line per check; exits 0 only
 * if every check passed. alarm() bounds it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include "check.h"

#define BIG (64u << 20)
#define PAGE 4096u

static struct rdma_event_channel *ch;
static struct rdma_cm_id *listener;
static struct sockaddr_in dst;

struct pair {
	struct rdma_cm_id *a, *b; /* a: active side, b: passive side */
};

static int next_event(enum rdma_cm_event_type want, struct rdma_cm_id **id)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(ch, &ev))
		return -1;
	int ok = ev->event == want;
	if (!ok)
		fprintf(stderr, "event %s, wanted %s (status %d)\n", rdma_event_str(ev->event), rdma_event_str(want),
			ev->status);
	if (id)
		*id = ev->id;
	rdma_ack_cm_event(ev);
	return ok ? 0 : -1;
}

static int make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
						  .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	return rdma_create_qp(id, NULL, &attr);
}

/* A connected RC pair on 127.0.0.1, both ends in this process. */
static int connect_pair(struct pair *p)
{
	memset(p, 0, sizeof(*p));
	if (rdma_create_id(ch, &p->a, NULL, RDMA_PS_TCP) || rdma_resolve_addr(p->a, NULL, (struct sockaddr *)&dst, 2000) ||
	    next_event(RDMA_CM_EVENT_ADDR_RESOLVED, NULL) || rdma_resolve_route(p->a, 2000) ||
	    next_event(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL) || make_qp(p->a))
		return -1;
	struct rdma_conn_param cp = { .responder_resources = 4, .initiator_depth = 4, .retry_count = 7,
				      .rnr_retry_count = 7 };
	if (rdma_connect(p->a, &cp) || next_event(RDMA_CM_EVENT_CONNECT_REQUEST, &p->b) || make_qp(p->b) ||
	    rdma_accept(p->b, &cp))
		return -1;
	for (int i = 0; i < 2; i++)
		if (next_event(RDMA_CM_EVENT_ESTABLISHED, NULL))
			return -1;
	return 0;
}

/* Tears a pair down without waiting long for the peer (either side may be in ERR already):
 * disconnect both ids and take up to two DISCONNECTED events within 1 s. */
static void drop_pair(struct pair *p)
{
	struct rdma_cm_id *ids[2] = { p->a, p->b };
	int flags = fcntl(ch->fd, F_GETFL);

	for (int i = 0; i < 2; i++)
		if (ids[i])
			rdma_disconnect(ids[i]);
	fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK);
	int seen = 0;
	for (int tries = 0; tries < 1000 && seen < 2; tries++) {
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev) == 0) {
			seen += ev->event == RDMA_CM_EVENT_DISCONNECTED;
			rdma_ack_cm_event(ev);
		} else {
			usleep(1000);
		}
	}
	fcntl(ch->fd, F_SETFL, flags);
	for (int i = 0; i < 2; i++) {
		if (!ids[i])
			continue;
		rdma_destroy_qp(ids[i]);
		rdma_destroy_id(ids[i]);
	}
}

static void *map_pages(size_t len, int prot)
{
	void *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static int reg_fails(struct ibv_pd *pd, void *addr, size_t len, int access, int want_errno, const char *what)
{
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
	int e = errno;
	CHECK(mr == NULL && e == want_errno, "ibv_reg_mr over %s: %s (want %s)", what, mr ? "registered" : strerror(e),
	      strerror(want_errno));
	if (mr)
		ibv_dereg_mr(mr);
	return 0;
}

/* True if the page at `addr` is mapped (msync answers ENOMEM for an unmapped range). */
static int page_mapped(void *addr)
{
	return msync(addr, PAGE, MS_ASYNC) == 0;
}

/*
 * Registrations over a hole: two pages whose second was unmapped, and the hole alone. Another
 * thread of this process (the library's, or ASan's allocator) may map the freed page again
 * before or during the call; such an attempt proves nothing and is made again with a new hole.
 */
static void unmapped_checks(struct ibv_pd *pd, int access)
{
	struct {
		size_t offset, len;
		const char *what;
	} cases[] = { { 0, 2 * PAGE, "two pages, the second unmapped" }, { PAGE, PAGE, "an unmapped page" } };
	for (unsigned c = 0; c < 2; c++) {
		int done = 0;
		for (int attempt = 0; attempt < 10 && !done; attempt++) {
			char *p = map_pages(2 * PAGE, PROT_READ | PROT_WRITE);
			if (!p)
				break;
			munmap(p + PAGE, PAGE);
			errno = 0;
			struct ibv_mr *mr = page_mapped(p + PAGE) ? NULL : ibv_reg_mr(pd, p + cases[c].offset, cases[c].len, access);
			int e = errno;
			int reused = page_mapped(p + PAGE);
			if (mr)
				ibv_dereg_mr(mr);
			munmap(p, PAGE);
			if (reused)
				continue;
			CHECK(mr == NULL && e == EFAULT, "ibv_reg_mr over %s: %s (want %s)", cases[c].what,
			      mr ? "registered" : strerror(e), strerror(EFAULT));
			done = 1;
		}
		CHECK(done, "ibv_reg_mr over %s: a hole that stayed unmapped within 10 attempts", cases[c].what);
	}
}

static void registration_checks(struct ibv_pd *pd)
{
	char *p = map_pages(4 * PAGE, PROT_READ | PROT_WRITE);
	CHECK(p != NULL, "mmap 4 pages");
	if (!p)
		return;
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *mr = ibv_reg_mr(pd, p, 4 * PAGE, rw);
	CHECK(mr != NULL, "ibv_reg_mr over 4 mapped pages");
	if (mr)
		ibv_dereg_mr(mr);
	reg_fails(pd, p, (size_t)1 << 40, rw, EFAULT, "a 1 TiB range on a 16 KiB mapping");
	reg_fails(pd, (void *)(uintptr_t)(UINTPTR_MAX - PAGE + 1), 2 * PAGE, IBV_ACCESS_LOCAL_WRITE, EINVAL,
		  "a range wrapping the address space");
	mprotect(p + 3 * PAGE, PAGE, PROT_NONE);
	reg_fails(pd, p + 3 * PAGE, PAGE, 0, EFAULT, "a PROT_NONE page");
	mprotect(p + 2 * PAGE, PAGE, PROT_READ);
	reg_fails(pd, p + 2 * PAGE, PAGE, IBV_ACCESS_LOCAL_WRITE, EFAULT, "a read-only page with LOCAL_WRITE");
	reg_fails(pd, p + 2 * PAGE, PAGE, rw, EFAULT, "a read-only page with REMOTE_WRITE");
	mr = ibv_reg_mr(pd, p + 2 * PAGE, PAGE, IBV_ACCESS_REMOTE_READ);
	CHECK(mr != NULL, "ibv_reg_mr of a read-only page for REMOTE_READ only");
	if (mr)
		ibv_dereg_mr(mr);
	munmap(p, 4 * PAGE);
	unmapped_checks(pd, rw);
}

static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc, int ms)
{
	for (int i = 0; i < ms * 10; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		usleep(100);
	}
	return 0;
}

static int post(struct ibv_qp *qp, enum ibv_wr_opcode op, void *buf, uint32_t len, uint32_t lkey, uint64_t raddr,
		uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

/* 2: a secret on both sides of an MR; out-of-bounds READ and WRITE from the peer. */
static void bounds_checks(void)
{
	struct pair p;
	CHECK(connect_pair(&p) == 0, "connect a pair for the bounds checks");
	char *area = map_pages(3 * PAGE, PROT_READ | PROT_WRITE);
	char *mine = map_pages(PAGE, PROT_READ | PROT_WRITE);
	if (!area || !mine || !p.a || !p.b || !p.a->qp || !p.b->qp) {
		CHECK(0, "setup for the bounds checks");
		return;
	}
	memset(area, 'S', 3 * PAGE);
	memset(area + PAGE, 'm', PAGE);
	struct ibv_mr *target = ibv_reg_mr(p.b->pd, area + PAGE, PAGE,
					   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_mr *local = ibv_reg_mr(p.a->pd, mine, PAGE, IBV_ACCESS_LOCAL_WRITE);
	CHECK(target && local, "register the target (between two secret pages) and a local buffer");
	if (!target || !local)
		return;
	struct {
		enum ibv_wr_opcode op;
		int64_t off;
		const char *what;
	} cases[] = { { IBV_WR_RDMA_READ, -1, "READ of the byte before the MR" },
		      { IBV_WR_RDMA_READ, PAGE, "READ of the byte after the MR" },
		      { IBV_WR_RDMA_WRITE, -1, "WRITE of the byte before the MR" },
		      { IBV_WR_RDMA_WRITE, PAGE, "WRITE of the byte after the MR" } };
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (i > 0) {
			/* The error moved the pair to ERR: a fresh one for each case. */
			drop_pair(&p);
			ibv_dereg_mr(target);
			ibv_dereg_mr(local);
			if (connect_pair(&p)) {
				CHECK(0, "reconnect for the bounds checks");
				return;
			}
			target = ibv_reg_mr(p.b->pd, area + PAGE, PAGE,
					    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
			local = ibv_reg_mr(p.a->pd, mine, PAGE, IBV_ACCESS_LOCAL_WRITE);
			if (!target || !local)
				return;
		}
		memset(mine, 'P', PAGE);
		struct ibv_wc wc = { 0 };
		int rc = post(p.a->qp, cases[i].op, mine, 1, local->lkey, (uintptr_t)(area + PAGE) + cases[i].off,
			      target->rkey);
		int n = rc ? 0 : wait_wc(p.a->send_cq, &wc, 5000);
		/* An iWARP WRITE completes at the source once handed to TCP (as with Linux siw);
		 * the peer's Terminate then ends the connection. */
		int iwarp = p.a->verbs->device->transport_type == IBV_TRANSPORT_IWARP;
		int ok = n == 1 && (wc.status == IBV_WC_REM_ACCESS_ERR ||
				    (iwarp && cases[i].op == IBV_WR_RDMA_WRITE && wc.status == IBV_WC_SUCCESS));
		CHECK(ok, "%s: %s", cases[i].what, n ? ibv_wc_status_str(wc.status) : "no completion");
		CHECK(cases[i].op != IBV_WR_RDMA_READ || mine[0] == 'P', "  nothing was read into the local buffer");
	}
	int intact = 1;
	for (unsigned i = 0; i < PAGE; i++)
		intact &= area[i] == 'S' && area[2 * PAGE + i] == 'S';
	CHECK(intact, "the secrets beside the MR are unchanged");
	drop_pair(&p);
	ibv_dereg_mr(target);
	ibv_dereg_mr(local);
	munmap(area, 3 * PAGE);
	munmap(mine, PAGE);
}

enum role { SOURCE, TARGET };

static const char *op_name(enum ibv_wr_opcode op)
{
	return op == IBV_WR_RDMA_WRITE ? "WRITE" : op == IBV_WR_RDMA_READ ? "READ" : "SEND";
}

/*
 * One case: `op` of BIG bytes from p.a, and the buffer of `role` deregistered during it.
 * Which buffer is which: WRITE and SEND move a's buffer into b's; READ moves b's into a's.
 */
static void dereg_during(enum ibv_wr_opcode op, enum role role, int rounds)
{
	int hit = 0, changed = 0, setup_failed = 0;
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	unsigned seed = 12345;
	/* The buffers live across rounds; the one that is unmapped is mapped anew. */
	char *abuf = map_pages(BIG, PROT_READ | PROT_WRITE);
	char *bbuf = map_pages(BIG, PROT_READ | PROT_WRITE);
	char *snapshot = malloc(BIG);
	if (!abuf || !bbuf || !snapshot) {
		CHECK(0, "map the 64 MiB buffers");
		return;
	}
	memset(abuf, 'a', BIG);
	memset(bbuf, 'b', BIG);

	for (int r = 0; r < rounds; r++) {
		struct pair p;
		if (connect_pair(&p)) {
			setup_failed++;
			break;
		}
		struct ibv_mr *amr = ibv_reg_mr(p.a->pd, abuf, BIG, access);
		struct ibv_mr *bmr = ibv_reg_mr(p.b->pd, bbuf, BIG, access);
		if (!amr || !bmr) {
			setup_failed++;
			break;
		}
		if (op == IBV_WR_SEND) {
			struct ibv_sge sge = { .addr = (uintptr_t)bbuf, .length = BIG, .lkey = bmr->lkey };
			struct ibv_recv_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *bad;
			ibv_post_recv(p.b->qp, &wr, &bad);
		}
		if (post(p.a->qp, op, abuf, BIG, amr->lkey, (uintptr_t)bbuf, bmr->rkey)) {
			setup_failed++;
			break;
		}
		/* Let the transfer get going, then pull the buffer away under it. */
		seed = seed * 1103515245 + 12345;
		usleep(200 + (seed >> 16) % 3000);
		int a_side = (op == IBV_WR_RDMA_READ) == (role == TARGET);
		char **buf = a_side ? &abuf : &bbuf;
		struct ibv_mr **mr = a_side ? &amr : &bmr;
		int keep = r % 2;
		ibv_dereg_mr(*mr);
		*mr = NULL;
		if (keep)
			memcpy(snapshot, *buf, BIG);
		else
			munmap(*buf, BIG);
		struct ibv_wc wc = { 0 };
		int n = wait_wc(p.a->send_cq, &wc, 20000);
		if (n == 1 && wc.status != IBV_WC_SUCCESS)
			hit++;
		if (n != 1)
			CHECK(0, "%s, %s deregistered, round %d: no completion within 20 s", op_name(op),
			      role == SOURCE ? "source" : "target", r);
		drop_pair(&p);
		if (keep) {
			usleep(2000);
			if (memcmp(snapshot, *buf, BIG) != 0)
				changed++;
		} else {
			*buf = map_pages(BIG, PROT_READ | PROT_WRITE);
			if (!*buf) {
				setup_failed++;
				break;
			}
		}
		if (amr)
			ibv_dereg_mr(amr);
		if (bmr)
			ibv_dereg_mr(bmr);
	}
	CHECK(setup_failed == 0, "%s, %s deregistered mid-transfer: %d rounds set up", op_name(op),
	      role == SOURCE ? "source" : "target", rounds);
	CHECK(changed == 0, "  no byte changed after dereg returned (%d of %d kept rounds changed)", changed,
	      rounds / 2);
	CHECK(hit * 4 >= rounds, "  %d of %d rounds ended in an error completion (the dereg hit a transfer)", hit,
	      rounds);
	free(snapshot);
	if (abuf)
		munmap(abuf, BIG);
	if (bbuf)
		munmap(bbuf, BIG);
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 200;
	alarm(600);
	ch = rdma_create_event_channel();
	CHECK(ch != NULL, "rdma_create_event_channel");
	if (!ch)
		return 1;
	CHECK(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0, "listener rdma_create_id");
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&sin) == 0 && rdma_listen(listener, 16) == 0,
	      "listen on 127.0.0.1");
	dst = *(struct sockaddr_in *)rdma_get_local_addr(listener);
	CHECK(listener->verbs != NULL, "device %s", listener->verbs ? ibv_get_device_name(listener->verbs->device) : "?");

	struct ibv_pd *pd = ibv_alloc_pd(listener->verbs);
	CHECK(pd != NULL, "ibv_alloc_pd");
	if (!pd)
		return check_summary();
	registration_checks(pd);
	ibv_dealloc_pd(pd);

	bounds_checks();

	enum ibv_wr_opcode ops[] = { IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_SEND };
	for (int o = 0; o < 3; o++)
		for (int role = SOURCE; role <= TARGET; role++)
			dereg_during(ops[o], role, rounds);

	rdma_destroy_id(listener);
	rdma_destroy_event_channel(ch);
	return check_summary();
}
