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
#include "cycle_leaks.h"


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

int main(int argc, char **argv)
{
	int cycles = argc > 1 ? atoi(argv[1]) : 100;
	CHECK(cycle(0) == 0, "warm-up cycle (domain %s)", domain_name);
	check_cycles_leak_nothing(cycle, cycles, "opened and closed fabric and domain");
	return check_summary();
}
