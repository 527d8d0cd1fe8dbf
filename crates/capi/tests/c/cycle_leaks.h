/*
 * The leak check of the init/cleanup cycle programs (ucx_cycles.c, fi_cycles.c): the counts
 * of open fds and threads once they settle, before and after the cycles, and the fds listed
 * when they differ. Include after check.h.
 */
#ifndef CYCLE_LEAKS_H
#define CYCLE_LEAKS_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* Runs `cycle(1..cycles)` after the caller's warm-up cycle and checks that every cycle
 * succeeded (`what` says what a cycle does) and that no fd or thread was left behind. */
static void check_cycles_leak_nothing(int (*cycle)(int), int cycles, const char *what)
{
	int fds0 = settled("/proc/self/fd"), tasks0 = settled("/proc/self/task");
	fd_list(fds_before, sizeof(fds_before));
	printf("after the warm-up: %d fds, %d threads\n", fds0, tasks0);
	double t0 = now();
	int bad = 0;
	for (int i = 1; i <= cycles; i++)
		bad += cycle(i);
	int fds1 = settled("/proc/self/fd"), tasks1 = settled("/proc/self/task");
	printf("after %d more cycles (%.1f s): %d fds, %d threads\n", cycles, now() - t0, fds1, tasks1);
	CHECK(bad == 0, "%d cycles %s (%d failed)", cycles, what, bad);
	if (fds1 != fds0) {
		fd_list(fds_after, sizeof(fds_after));
		printf("fds after the warm-up:\n%sfds at the end:\n%s", fds_before, fds_after);
	}
	CHECK(fds1 == fds0, "no fd leaked (%d before, %d after)", fds0, fds1);
	CHECK(tasks1 == tasks0, "no thread leaked (%d before, %d after)", tasks0, tasks1);
}

#endif
