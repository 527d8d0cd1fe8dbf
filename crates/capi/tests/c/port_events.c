/*
 * PORT_ERR and PORT_ACTIVE through ibv_context.async_fd when the device's netdev goes down
 * and up. Run as root inside a network namespace (tests/roce_multihost.rs):
 *   port_events <device> <netdev>
 * It sets the link down and up itself (`ip link set dev <netdev> down|up`), and checks after
 * each step the event (awaited with poll(2), bounded) and the state ibv_query_port reports.
 * Prints one line per check; exits 0 only if every check passed.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"

/* The next event within `ms`, acknowledged; its type, or -1. */
static int next_event(struct ibv_context *ctx, int ms, int *port)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	if (poll(&p, 1, ms) != 1 || ibv_get_async_event(ctx, &ev))
		return -1;
	int type = ev.event_type;
	*port = ev.element.port_num;
	ibv_ack_async_event(&ev);
	return type;
}

static int port_state(struct ibv_context *ctx)
{
	struct ibv_port_attr a;
	return ibv_query_port(ctx, 1, &a) ? -1 : (int)a.state;
}

static int link(const char *netdev, const char *how)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "ip link set dev %s %s", netdev, how);
	return system(cmd);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: port_events <device> <netdev>\n");
		return 2;
	}
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *dev = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			dev = list[i];
	CHECK(dev != NULL, "%s is listed", argv[1]);
	if (!dev)
		return 1;
	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx && port_state(ctx) == IBV_PORT_ACTIVE, "opened, port ACTIVE");
	if (!ctx)
		return 1;
	int port = 0;
	CHECK(link(argv[2], "down") == 0, "ip link set dev %s down", argv[2]);
	int t = next_event(ctx, 5000, &port);
	CHECK(t == IBV_EVENT_PORT_ERR && port == 1, "PORT_ERR on port 1 (got %d, port %d)", t, port);
	CHECK(port_state(ctx) == IBV_PORT_DOWN, "ibv_query_port: DOWN");
	CHECK(link(argv[2], "up") == 0, "ip link set dev %s up", argv[2]);
	t = next_event(ctx, 5000, &port);
	CHECK(t == IBV_EVENT_PORT_ACTIVE && port == 1, "PORT_ACTIVE on port 1 (got %d, port %d)", t, port);
	CHECK(port_state(ctx) == IBV_PORT_ACTIVE, "ibv_query_port: ACTIVE");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
	return check_summary();
}
