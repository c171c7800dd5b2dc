/* SPDX-License-Identifier: MIT */
/*
 * dlxd as a Linux service: what systemd hands it (a listening socket), what
 * it tells systemd (ready, status, stopping, watchdog keep-alives), and the
 * metrics file it keeps for node_exporter. Built without libsystemd
 * (-Dsystemd=disabled), dlxd refuses an inherited socket and ignores
 * NOTIFY_SOCKET, each with a message saying so.
 *
 * Each job has a timer of its own, ticking on a fixed schedule: a keep-alive
 * is never late because another job's tick came first. Messages to systemd go
 * from a thread of their own: sd_notify() blocks while the receiver's queue is
 * full, and a service manager that stops reading must not stop dlxd serving.
 * What is posted while the thread waits is merged into its next message. The
 * metrics file is likewise written on libuv's thread pool (a slow file system
 * must not hold the loop), except the first, before READY=1.
 */
#ifndef DLX_DAEMON_SERVICE_H
#define DLX_DAEMON_SERVICE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "ticker.h"

struct registry;
struct notifier;

/* How often the STATUS= line is brought up to date. */
#define SERVICE_STATUS_MS 5000
/* How long a stopping dlxd waits for its last message to systemd to go. */
#define SERVICE_NOTIFY_DRAIN_MS 1000

struct service {
        uv_loop_t *loop;
        struct registry *reg;
        struct notifier *notifier; /* NULL: systemd is not listening */
        uint64_t watchdog_ms;      /* keep-alives every so often (half of WATCHDOG_USEC); 0: none */
        struct ticker watchdog, status, metrics;
        const char *metrics_path;
        uint64_t metrics_ms;
        char status_line[160]; /* the last STATUS= posted */
        bool metrics_failing;  /* the last write failed (logged once until one succeeds) */
        bool metrics_busy;     /* a write is under way on the thread pool */
        bool metrics_stopped;  /* dlxd stopped: the file must not outlive it */
};

/*
 * The socket systemd passed (socket activation), in *ret_fd, or -1 when
 * none was. Exactly one listening AF_UNIX stream socket is taken; anything
 * else is refused with a message logged. Returns 0 or -errno.
 */
int service_listen_fd(int *ret_fd);

/*
 * Starts the keep-alives, status updates and metrics file (metrics_path NULL:
 * none, else rewritten every metrics_ms) on loop. Returns 0 or -errno, with a
 * message logged.
 */
int service_start(struct service *sv, uv_loop_t *loop, struct registry *reg,
                  const char *metrics_path, uint64_t metrics_ms);
/* dlxd serves: READY=1 and the first status, and the first metrics file. */
void service_ready(struct service *sv);
/*
 * dlxd stops: STOPPING=1, given SERVICE_NOTIFY_DRAIN_MS to go; the metrics
 * file goes (stale numbers would mislead); the timers close.
 */
void service_stop(struct service *sv);

#endif /* DLX_DAEMON_SERVICE_H */
