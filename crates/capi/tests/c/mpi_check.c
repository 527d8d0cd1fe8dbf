/*
 * An MPI job that checks every byte it moves (issue #16): run with 2 or more ranks.
 *
 *  - ping-pong between ranks 0 and 1 at sizes from 1 byte to 1 MiB (odd sizes too): rank 1
 *    checks what arrives and sends back its complement, rank 0 checks that;
 *  - MPI_Allreduce (sum of 64-bit integers, 100,000 elements);
 *  - MPI_Alltoall (a distinct value per source, destination and element);
 *  - a non-blocking ring exchange: 4 messages of 256 KiB each way with MPI_Isend / MPI_Irecv
 *    and one MPI_Waitall;
 *  - one-sided: MPI_Put into the right neighbour's window and MPI_Get from it, under fences
 *    and under a passive-target lock.
 *
 * Every rank counts its failures; rank 0 prints each check and the summary line of check.h
 * ("PASSED: 0 failure(s)") with the total of all ranks, and the exit status says the same.
 *
 * With the argument "kill-rank-1", the last rank kills itself (SIGKILL) after the ping-pong,
 * while the others wait in MPI_Recv for a message from it that never comes: the job must end
 * (with an error) in bounded time, not hang.
 */
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static int rank, nranks;

static unsigned char pattern(size_t i, int size_seed, int iter, int from)
{
	return (unsigned char)((i * 131u) ^ (unsigned)(size_seed * 7 + iter * 13 + from * 29));
}

/* A check of rank 0 only; the others just count. */
#define RCHECK(cond, ...)                     \
	do {                                  \
		if (rank == 0) {              \
			CHECK(cond, __VA_ARGS__); \
		} else if (!(cond)) {         \
			failures++;           \
		}                             \
	} while (0)

static int all_ok(int local_bad)
{
	int bad = 0;

	MPI_Allreduce(&local_bad, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	return bad == 0;
}

static void pingpong(void)
{
	static const size_t sizes[] = {1, 7, 64, 1000, 4096, 8193, 65536, 100000, 262144, 1048576};
	unsigned char *buf = malloc(1048576);

	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t n = sizes[s];
		int bad = 0;

		for (int iter = 0; iter < 5; iter++) {
			if (rank == 0) {
				for (size_t i = 0; i < n; i++)
					buf[i] = pattern(i, (int)s, iter, 0);
				MPI_Send(buf, (int)n, MPI_BYTE, 1, iter, MPI_COMM_WORLD);
				memset(buf, 0, n);
				MPI_Recv(buf, (int)n, MPI_BYTE, 1, iter, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (size_t i = 0; i < n; i++)
					bad += buf[i] != (unsigned char)~pattern(i, (int)s, iter, 0);
			} else if (rank == 1) {
				MPI_Status st;
				int count = -1;

				memset(buf, 0, n);
				MPI_Recv(buf, (int)n, MPI_BYTE, 0, iter, MPI_COMM_WORLD, &st);
				MPI_Get_count(&st, MPI_BYTE, &count);
				bad += count != (int)n;
				for (size_t i = 0; i < n; i++) {
					bad += buf[i] != pattern(i, (int)s, iter, 0);
					buf[i] = (unsigned char)~buf[i];
				}
				MPI_Send(buf, (int)n, MPI_BYTE, 0, iter, MPI_COMM_WORLD);
			}
		}
		RCHECK(all_ok(bad), "ping-pong of %zu bytes, 5 round trips, every byte both ways", n);
	}
	free(buf);
}

static void allreduce(void)
{
	enum { N = 100000 };
	int64_t *in = malloc(N * sizeof(*in)), *out = malloc(N * sizeof(*out));
	int bad = 0;

	for (int64_t i = 0; i < N; i++)
		in[i] = (int64_t)rank * i + 1;
	MPI_Allreduce(in, out, N, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
	for (int64_t i = 0; i < N; i++)
		bad += out[i] != i * ((int64_t)nranks * (nranks - 1) / 2) + nranks;
	RCHECK(all_ok(bad), "MPI_Allreduce sum of %d int64 on %d ranks", N, nranks);
	free(in);
	free(out);
}

static void alltoall(void)
{
	enum { K = 16384 };
	int32_t *send = malloc((size_t)nranks * K * sizeof(int32_t));
	int32_t *recv = malloc((size_t)nranks * K * sizeof(int32_t));
	int bad = 0;

	for (int to = 0; to < nranks; to++)
		for (int k = 0; k < K; k++)
			send[to * K + k] = (rank * 1000 + to) * K + k;
	memset(recv, 0xff, (size_t)nranks * K * sizeof(int32_t));
	MPI_Alltoall(send, K, MPI_INT32_T, recv, K, MPI_INT32_T, MPI_COMM_WORLD);
	for (int from = 0; from < nranks; from++)
		for (int k = 0; k < K; k++)
			bad += recv[from * K + k] != (from * 1000 + rank) * K + k;
	RCHECK(all_ok(bad), "MPI_Alltoall of %d int32 per pair", K);
	free(send);
	free(recv);
}

static void nonblocking(void)
{
	enum { MSGS = 4, LEN = 262144 };
	int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
	unsigned char *out = malloc((size_t)MSGS * LEN), *in = malloc((size_t)MSGS * LEN);
	MPI_Request req[2 * MSGS];
	int bad = 0;

	memset(in, 0, (size_t)MSGS * LEN);
	for (int m = 0; m < MSGS; m++) {
		for (size_t i = 0; i < LEN; i++)
			out[(size_t)m * LEN + i] = pattern(i, m, 99, rank);
		MPI_Irecv(in + (size_t)m * LEN, LEN, MPI_BYTE, left, 100 + m, MPI_COMM_WORLD, &req[m]);
	}
	for (int m = 0; m < MSGS; m++)
		MPI_Isend(out + (size_t)m * LEN, LEN, MPI_BYTE, right, 100 + m, MPI_COMM_WORLD,
			  &req[MSGS + m]);
	MPI_Waitall(2 * MSGS, req, MPI_STATUSES_IGNORE);
	for (int m = 0; m < MSGS; m++)
		for (size_t i = 0; i < LEN; i++)
			bad += in[(size_t)m * LEN + i] != pattern(i, m, 99, left);
	RCHECK(all_ok(bad), "Isend/Irecv ring: %d messages of %d bytes, one Waitall", MSGS, LEN);
	free(out);
	free(in);
}

static void one_sided(void)
{
	enum { LEN = 1048576 };
	int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
	unsigned char *base, *src = malloc(LEN), *got = malloc(LEN);
	MPI_Win win;
	int bad = 0;

	MPI_Win_allocate(LEN, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
	memset(base, 0, LEN);
	for (size_t i = 0; i < LEN; i++)
		src[i] = pattern(i, 5, 7, rank);

	/* Active target: Put into the right neighbour, then check what the left one put. */
	MPI_Win_fence(0, win);
	MPI_Put(src, LEN, MPI_BYTE, right, 0, LEN, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	for (size_t i = 0; i < LEN; i++)
		bad += base[i] != pattern(i, 5, 7, left);
	RCHECK(all_ok(bad), "MPI_Put of %d bytes into the neighbour's window (fence)", LEN);

	/* Get it back from the right neighbour: there it is what this rank put. */
	bad = 0;
	memset(got, 0, LEN);
	MPI_Win_fence(0, win);
	MPI_Get(got, LEN, MPI_BYTE, right, 0, LEN, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	for (size_t i = 0; i < LEN; i++)
		bad += got[i] != src[i];
	RCHECK(all_ok(bad), "MPI_Get of %d bytes from the neighbour's window (fence)", LEN);

	/* Passive target: an odd-sized Put at an odd offset and a Get of it, under a lock. */
	bad = 0;
	memset(got, 0, LEN);
	MPI_Win_lock(MPI_LOCK_EXCLUSIVE, right, 0, win);
	MPI_Put(src, 4099, MPI_BYTE, right, 333, 4099, MPI_BYTE, win);
	MPI_Win_flush(right, win);
	MPI_Get(got, 4099, MPI_BYTE, right, 333, 4099, MPI_BYTE, win);
	MPI_Win_unlock(right, win);
	bad += memcmp(got, src, 4099) != 0;
	MPI_Barrier(MPI_COMM_WORLD);
	for (size_t i = 0; i < 333; i++)
		bad += base[i] != pattern(i, 5, 7, left);
	for (size_t i = 0; i < 4099; i++)
		bad += base[333 + i] != pattern(i, 5, 7, left);
	RCHECK(all_ok(bad), "MPI_Put and MPI_Get of 4099 bytes at offset 333 under MPI_Win_lock");

	MPI_Win_free(&win);
	free(src);
	free(got);
}

int main(int argc, char **argv)
{
	int total = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	RCHECK(nranks >= 2, "%d ranks (at least 2)", nranks);
	if (nranks >= 2) {
		pingpong();
		if (argc > 1 && strcmp(argv[1], "kill-rank-1") == 0) {
			char byte;

			printf("rank %d: ping-pong done, the last rank dies now\n", rank);
			fflush(stdout);
			MPI_Barrier(MPI_COMM_WORLD);
			if (rank == nranks - 1) {
				/* give mpirun a moment to forward the output above */
				usleep(500000);
				raise(SIGKILL);
			}
			MPI_Recv(&byte, 1, MPI_BYTE, nranks - 1, 999, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			printf("rank %d: received from a dead rank\n", rank);
			return 3;
		}
		allreduce();
		alltoall();
		nonblocking();
		one_sided();
	}
	MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	failures = total;
	MPI_Finalize();
	if (rank == 0)
		return check_summary();
	return failures ? 1 : 0;
}
