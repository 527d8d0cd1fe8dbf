/*
 * A small MPI benchmark for scripts/bench-engines.sh (not a test): between ranks 0 and 1,
 *   - latency: ITERS round trips of an 8-byte message, half the mean round trip in µs;
 *   - bandwidth: 1 MiB messages, WINDOW in flight (MPI_Isend / MPI_Irecv, one MPI_Waitall,
 *     then an 8-byte acknowledgement), ROUNDS times, in MB/s (10^6 bytes per second).
 * Rank 0 prints "lat_us <value>" and "bw_MBps <value>". Each message's first and last
 * bytes are checked, so a run that moved nothing is not mistaken for a fast one.
 *
 *   mpirun -np 2 ... mpi_pingpong [ITERS] [ROUNDS]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIG (1 << 20)
#define WINDOW 16

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	int iters = argc > 1 ? atoi(argv[1]) : 10000;
	int rounds = argc > 2 ? atoi(argv[2]) : 100;
	int peer = 1 - rank, bad = 0;
	if (rank > 1) {
		MPI_Finalize();
		return 0;
	}
	char small[8] = {0};
	for (int i = 0; i < 100; i++) { /* warm-up: connections, registrations */
		if (rank == 0) {
			MPI_Send(small, 8, MPI_CHAR, peer, 0, MPI_COMM_WORLD);
			MPI_Recv(small, 8, MPI_CHAR, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(small, 8, MPI_CHAR, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(small, 8, MPI_CHAR, peer, 0, MPI_COMM_WORLD);
		}
	}
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (int i = 0; i < iters; i++) {
		if (rank == 0) {
			small[0] = (char)i;
			MPI_Send(small, 8, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
			MPI_Recv(small, 8, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad += small[0] != (char)(i + 1);
		} else {
			MPI_Recv(small, 8, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			small[0]++;
			MPI_Send(small, 8, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
		}
	}
	double lat = (MPI_Wtime() - t0) / iters / 2 * 1e6;

	char *buf = malloc((size_t)BIG * WINDOW);
	memset(buf, rank ? 0 : 0x5a, (size_t)BIG * WINDOW);
	MPI_Request req[WINDOW];
	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (int r = 0; r < rounds; r++) {
		for (int w = 0; w < WINDOW; w++) {
			char *b = buf + (size_t)w * BIG;
			if (rank == 0)
				MPI_Isend(b, BIG, MPI_CHAR, peer, 2, MPI_COMM_WORLD, &req[w]);
			else
				MPI_Irecv(b, BIG, MPI_CHAR, peer, 2, MPI_COMM_WORLD, &req[w]);
		}
		MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
		if (rank == 0) {
			MPI_Recv(small, 8, MPI_CHAR, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			for (int w = 0; w < WINDOW; w++)
				bad += buf[(size_t)w * BIG] != 0x5a || buf[(size_t)w * BIG + BIG - 1] != 0x5a;
			MPI_Send(small, 8, MPI_CHAR, peer, 3, MPI_COMM_WORLD);
		}
	}
	double bw = (double)BIG * WINDOW * rounds / (MPI_Wtime() - t0) / 1e6;
	int total = 0;
	MPI_Reduce(&bad, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("lat_us %.2f\nbw_MBps %.1f\n", lat, bw);
		if (total)
			printf("ERROR: %d messages arrived wrong\n", total);
	}
	free(buf);
	MPI_Finalize();
	return total != 0;
}
