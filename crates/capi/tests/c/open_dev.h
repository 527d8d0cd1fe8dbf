/*
 * open_dev(NAME): opens the verbs device called NAME (NULL if there is none), for the C test
 * programs that pick a device by name.
 */
#ifndef SOFTRDMA_TEST_OPEN_DEV_H
#define SOFTRDMA_TEST_OPEN_DEV_H

#include <string.h>
#include <infiniband/verbs.h>

static inline struct ibv_context *open_dev(const char *name)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;

	for (int i = 0; list && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	return ctx;
}

#endif
