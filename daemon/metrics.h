/* SPDX-License-Identifier: MIT */
/*
 * What dlxd counts for its operators, and the Prometheus text it renders from
 * that and from the registry's gauges: for `dlxctl stats --prometheus` (the
 * Metrics request) and for `dlxd --metrics-file`.
 */
#ifndef DLX_DAEMON_METRICS_H
#define DLX_DAEMON_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire.h"

struct registry;
struct session;

/* Upper bounds of a latency histogram's buckets, 10 us to 10 s; one more is +Inf. */
#define METRICS_BUCKETS 19

struct histogram {
        uint64_t counts[METRICS_BUCKETS + 1]; /* per bucket, not cumulative */
        uint64_t sum_ns;
        uint64_t count;
};

/* The request a reply answers: its id, type and when it arrived (0: not timed). */
struct req_ctx {
        uint64_t id;
        uint64_t t0_ns;
        enum wire_request_type type;
};

struct metrics {
        uint64_t requests[WIRE_REQ_COUNT]; /* received, by type ([0]: an undecodable one) */
        uint64_t errors[WIRE_REQ_COUNT][WIRE_STATUS_COUNT];
        struct histogram acquire, publish; /* arrival to answer, waits included */
};

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t metrics_now_ns(void);

/*
 * A reply addressed to a request (rep->id not 0) leaves s: its status counts
 * under the request's type, and a publish's or acquire's latency, when s->cur
 * or s->late is that request (session.h).
 */
void metrics_answered(struct session *s, const struct wire_reply *rep);

/*
 * The Prometheus text exposition (format 0.0.4) of reg: with all_uids, the
 * per-uid series of every uid; else of uid alone; of at most max_uids uids
 * (0: no limit). Returns the text
 * (NUL-terminated, *ret_len bytes, to free()) or NULL when out of memory.
 */
char *metrics_render(struct registry *reg, bool all_uids, uid_t uid, unsigned max_uids,
                     size_t *ret_len);

/* Per-uid series in a Metrics reply, which must fit in a frame: at most this many uids. */
#define METRICS_REPLY_UIDS 1000

#endif /* DLX_DAEMON_METRICS_H */
