/* The drop-in's pure helpers against Debian's libibverbs: this program prints what each
 * string, rate and marshalling helper returns for every value of its domain and beyond; the
 * test runs it once over the real library and once over the drop-in and compares the output
 * byte for byte. */
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>

/* Exported by libibverbs (IBVERBS_1.0 / 1.1); declared by no installed header. */
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);

static void pattern(void *p, size_t n, unsigned seed)
{
	unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(seed + i * 7u);
}

static void dump(const char *what, const void *p, size_t n)
{
	const unsigned char *b = p;
	printf("%s:", what);
	for (size_t i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

#define COPY(fn, D, S, seed)                                \
	do {                                                    \
		D dst;                                              \
		S src;                                              \
		memset(&dst, 0xaa, sizeof dst);                     \
		pattern(&src, sizeof src, seed);                    \
		fn(&dst, &src);                                     \
		dump(#fn, &dst, sizeof dst);                        \
	} while (0)

int main(void)
{
	for (int v = -2; v <= 26; v++) {
		printf("wc_status %d: %s\n", v, ibv_wc_status_str(v));
		printf("event_type %d: %s\n", v, ibv_event_type_str(v));
		printf("node_type %d: %s\n", v, ibv_node_type_str(v));
		printf("port_state %d: %s\n", v, ibv_port_state_str(v));
		printf("rate %d: mult %d mbps %d\n", v, ibv_rate_to_mult(v), ibv_rate_to_mbps(v));
	}
	for (int m = -1; m <= 260; m++)
		printf("mult %d: rate %d\n", m, mult_to_ibv_rate(m));
	for (int v = 0; v <= 26; v++) {
		int mbps = ibv_rate_to_mbps(v);
		printf("mbps %d: rate %d, mbps+1: rate %d\n", mbps, mbps_to_ibv_rate(mbps), mbps_to_ibv_rate(mbps + 1));
	}
	for (unsigned seed = 1; seed <= 3; seed++) {
		COPY(ibv_copy_qp_attr_from_kern, struct ibv_qp_attr, struct ib_uverbs_qp_attr, seed);
		COPY(ibv_copy_ah_attr_from_kern, struct ibv_ah_attr, struct ib_uverbs_ah_attr, seed);
		COPY(ibv_copy_path_rec_from_kern, struct ibv_sa_path_rec, struct ib_user_path_rec, seed);
		COPY(ibv_copy_path_rec_to_kern, struct ib_user_path_rec, struct ibv_sa_path_rec, seed);
	}
	return 0;
}
