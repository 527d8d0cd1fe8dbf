/*
 * libfabric init/close cycles in one process (issue #16): each cycle is fi_getinfo for the
 * verbs provider, fi_fabric and fi_domain on its first answer from the verbs provider itself
 * (not a utility provider layered over it), both closed, fi_freeinfo.
 * After a warm-up cycle (libfabric loads its providers once per process) the open fds
 * (/proc/self/fd) and threads (/proc/self/task) must be the same after CYCLES more cycles.
 *
 *   fi_cycles CYCLES
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include "check.h"

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
	return n - (strcmp(dir, "/proc/self/fd") == 0);
}

static char domain_name[128];

static int cycle(int n)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->fabric_attr->prov_name = strdup("verbs");
	/* every mode and the usual MR modes: a verbs DGRAM domain needs FI_MSG_PREFIX */
	hints->mode = ~0ULL;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints, &info);
	fi_freeinfo(hints);
	if (ret || !info) {
		printf("cycle %d: fi_getinfo: %s\n", n, fi_strerror(-ret));
		return 1;
	}
	struct fi_info *core = info;
	while (core && strcmp(core->fabric_attr->prov_name, "verbs") != 0)
		core = core->next;
	if (!core) {
		printf("cycle %d: no answer from the verbs provider itself\n", n);
		fi_freeinfo(info);
		return 1;
	}
	snprintf(domain_name, sizeof(domain_name), "%s", core->domain_attr->name);
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	int bad = 0;
	if ((ret = fi_fabric(core->fabric_attr, &fabric, NULL))) {
		printf("cycle %d: fi_fabric: %s\n", n, fi_strerror(-ret));
		bad = 1;
	} else if ((ret = fi_domain(fabric, core, &domain, NULL))) {
		printf("cycle %d: fi_domain %s: %s\n", n, core->domain_attr->name, fi_strerror(-ret));
		bad = 1;
	}
	if (domain && (ret = fi_close(&domain->fid)))
		bad = printf("cycle %d: closing the domain: %s\n", n, fi_strerror(-ret)) > 0;
	if (fabric && (ret = fi_close(&fabric->fid)))
		bad = printf("cycle %d: closing the fabric: %s\n", n, fi_strerror(-ret)) > 0;
	fi_freeinfo(info);
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
	CHECK(cycle(0) == 0, "warm-up cycle (domain %s)", domain_name);
	int fds0 = settled("/proc/self/fd"), tasks0 = settled("/proc/self/task");
	fd_list(fds_before, sizeof(fds_before));
	printf("after the warm-up: %d fds, %d threads\n", fds0, tasks0);
	double t0 = now();
	int bad = 0;
	for (int i = 1; i <= cycles; i++)
		bad += cycle(i);
	int fds1 = settled("/proc/self/fd"), tasks1 = settled("/proc/self/task");
	printf("after %d more cycles (%.1f s): %d fds, %d threads\n", cycles, now() - t0, fds1, tasks1);
	CHECK(bad == 0, "%d cycles opened and closed fabric and domain (%d failed)", cycles, bad);
	if (fds1 != fds0) {
		fd_list(fds_after, sizeof(fds_after));
		printf("fds after the warm-up:\n%sfds at the end:\n%s", fds_before, fds_after);
	}
	CHECK(fds1 == fds0, "no fd leaked (%d before, %d after)", fds0, fds1);
	CHECK(tasks1 == tasks0, "no thread leaked (%d before, %d after)", tasks0, tasks1);
	return check_summary();
}
