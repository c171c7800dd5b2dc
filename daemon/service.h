/* SPDX-License-Identifier: MIT */
/*
 * dlxd as a Linux service: what systemd hands it (a listening socket), what
 * it tells systemd (ready, status, stopping, watchdog keep-alives), and the
 * metrics file it keeps for node_exporter. Built without libsystemd
 * (-Dsystemd=disabled), dlxd refuses an inherited socket and ignores
 * NOTIFY_SOCKET, each with a message saying so.
 */
#ifndef DLX_DAEMON_SERVICE_H
#define DLX_DAEMON_SERVICE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "ticker.h"

struct registry;

/* How often the STATUS= line is brought up to date. */
#define SERVICE_STATUS_MS 5000

struct service {
        struct registry *reg;
        struct ticker ticker;
        bool notify;          /* systemd listens (NOTIFY_SOCKET) */
        uint64_t watchdog_ms; /* keep-alives every so often (half of WATCHDOG_USEC); 0: none */
        const char *metrics_path;
        uint64_t metrics_ms;
        uint64_t next_status, next_watchdog, next_metrics; /* CLOCK_MONOTONIC ms */
        char status[160];                                  /* the last STATUS= sent */
        bool metrics_failing; /* the last write failed (logged once until one succeeds) */
        bool notify_failing;  /* likewise for a message to systemd */
};

/*
 * The socket systemd passed (socket activation), in *ret_fd, or -1 when
 * none was. Exactly one listening AF_UNIX stream socket is taken; anything
 * else is refused with a message on stderr. Returns 0 or -errno.
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
/* dlxd stops: STOPPING=1; the metrics file goes (stale numbers would mislead). */
void service_stopping(struct service *sv);
/* Closes its handles. */
void service_done(struct service *sv);

#endif /* DLX_DAEMON_SERVICE_H */
