/* SPDX-License-Identifier: MIT */
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "quota.h"
#include "registry.h"
#include "session.h"
#include "store.h"

/* The buckets' upper bounds: in nanoseconds, and as Prometheus reads them. */
static const uint64_t bucket_ns[METRICS_BUCKETS] = {
        10000,     25000,      50000,      100000,     250000,      500000,    1000000,
        2500000,   5000000,    10000000,   25000000,   50000000,    100000000, 250000000,
        500000000, 1000000000, 2500000000, 5000000000, 10000000000,
};
static const char *const bucket_le[METRICS_BUCKETS] = {
        "1e-05",  "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001",
        "0.0025", "0.005",   "0.01",  "0.025",  "0.05",    "0.1",    "0.25",
        "0.5",    "1",       "2.5",   "5",      "10",
};

/* Status labels, as dlx_strerror() names the errors they carry, in snake case. */
static const char *const status_names[WIRE_STATUS_COUNT] = {
        [WIRE_OK] = "ok",
        [WIRE_INVALID] = "invalid",
        [WIRE_NOT_FOUND] = "not_found",
        [WIRE_PERMISSION] = "permission",
        [WIRE_TIMEOUT] = "timeout",
        [WIRE_NO_SPACE] = "no_space",
        [WIRE_LIMIT] = "limit",
        [WIRE_PROTOCOL] = "protocol",
        [WIRE_VERSION] = "version",
        [WIRE_BAD_FD] = "bad_fd",
        [WIRE_TOO_BIG] = "too_big",
        [WIRE_BUSY] = "busy",
        [WIRE_EXISTS] = "exists",
        [WIRE_NO_MEMORY] = "no_memory",
        [WIRE_INTERNAL] = "internal",
        [WIRE_NOT_SUPPORTED] = "not_supported",
        [WIRE_SHUTDOWN] = "shutdown",
        [WIRE_CLOSED] = "closed",
        [WIRE_IS_GROUP] = "is_group",
        [WIRE_NOT_GROUP] = "not_group",
        [WIRE_UNREACHABLE] = "unreachable",
};

/* A request type's label; an undecodable request has none of its own. */
static const char *type_label(int type)
{
        return type == WIRE_REQ_NONE ? "undecodable" : wire_request_name(type);
}

uint64_t metrics_now_ns(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void observe(struct histogram *h, uint64_t ns)
{
        unsigned i = 0;

        while (i < METRICS_BUCKETS && ns > bucket_ns[i])
                i++;
        h->counts[i]++;
        h->sum_ns += ns;
        h->count++;
}

void metrics_answered(struct session *s, const struct wire_reply *rep)
{
        struct metrics *m = &s->reg->metrics;
        struct req_ctx late = s->late;
        const struct req_ctx *c;
        enum wire_request_type type;
        int status = rep->status;

        /* a group's segment goes ahead of the answer proper */
        if (rep->type == WIRE_REP_SEGMENT)
                return;
        /*
         * A late answer was announced just before it (session_answering()), and
         * is taken first: a peer may have reused its id for the request being
         * dispatched now. The announcement is used up.
         */
        if (late.id && rep->id == late.id) {
                s->late.id = 0;
                c = &late;
        } else {
                c = rep->id == s->cur.id ? &s->cur : NULL;
        }
        /* cur's type is one of WIRE_REQ_COUNT (dispatch), late's a constant */
        type = c ? c->type : WIRE_REQ_NONE;
        if (status != WIRE_OK)
                m->errors[type]
                         [status > 0 && status < WIRE_STATUS_COUNT ? status : WIRE_INTERNAL]++;
        if (c && c->t0_ns && (type == WIRE_REQ_ACQUIRE || type == WIRE_REQ_PUBLISH))
                observe(type == WIRE_REQ_ACQUIRE ? &m->acquire : &m->publish,
                        metrics_now_ns() - c->t0_ns);
}

/* ---- rendering ------------------------------------------------------------------------ */

static void head(FILE *f, const char *name, const char *type, const char *help)
{
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
        head(f, name, type, help);
        fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

/* A limit's gauge, only where the limit is set (0: none). */
static void limit(FILE *f, const char *name, const char *help, uint64_t v)
{
        if (v)
                one(f, name, "gauge", help, v);
}

static void histogram(FILE *f, const char *name, const char *help, const struct histogram *h)
{
        uint64_t cum = 0;

        head(f, name, "histogram", help);
        for (unsigned i = 0; i < METRICS_BUCKETS; i++) {
                cum += h->counts[i];
                fprintf(f, "%s_bucket{le=\"%s\"} %llu\n", name, bucket_le[i],
                        (unsigned long long)cum);
        }
        fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
        fprintf(f, "%s_sum %llu.%09llu\n", name, (unsigned long long)(h->sum_ns / 1000000000u),
                (unsigned long long)(h->sum_ns % 1000000000u));
        fprintf(f, "%s_count %llu\n", name, (unsigned long long)h->count);
}

/* What each uid uses, one family per count. */
static const struct {
        const char *name, *help;
        size_t off;
        bool wide;
} uid_series[] = {
        {"dlx_uid_held_bytes", "Shared bytes held for the segments a uid created or sent.",
         offsetof(struct uid_use, bytes), true},
        {"dlx_uid_names", "Names a uid owns with a current version.",
         offsetof(struct uid_use, names), true},
        {"dlx_uid_clients", "Connected clients of a uid.", offsetof(struct uid_use, clients),
         false},
        {"dlx_uid_segment_fds", "Descriptors held for a uid's segments.",
         offsetof(struct uid_use, fds), true},
        {"dlx_uid_fds_in_flight", "Descriptors sent to a uid's clients and not yet received.",
         offsetof(struct uid_use, unread), false},
        {"dlx_uid_queued_bytes", "Output queued for a uid's clients to read.",
         offsetof(struct uid_use, queued), true},
};

static uint64_t uid_value(const struct uid_use *u, size_t i)
{
        const char *p = (const char *)u + uid_series[i].off;

        return uid_series[i].wide ? *(const uint64_t *)p : *(const uint32_t *)p;
}

static unsigned render_uids(FILE *f, const struct registry *reg, bool all_uids, uid_t uid,
                            unsigned max_uids)
{
        unsigned omitted = 0;

        for (size_t i = 0; i < sizeof(uid_series) / sizeof(uid_series[0]); i++) {
                unsigned n = 0;

                head(f, uid_series[i].name, "gauge", uid_series[i].help);
                omitted = 0;
                for (struct avl_node *a = avl_first(&reg->store->uids); a; a = avl_next(a)) {
                        const struct uid_use *u = avl_entry(a, struct uid_use, node);

                        if (!all_uids && u->uid != uid)
                                continue;
                        if (max_uids && n == max_uids) {
                                omitted++;
                                continue;
                        }
                        n++;
                        fprintf(f, "%s{uid=\"%u\"} %llu\n", uid_series[i].name, (unsigned)u->uid,
                                (unsigned long long)uid_value(u, i));
                }
        }
        return omitted;
}

char *metrics_render(struct registry *reg, bool all_uids, uid_t uid, unsigned max_uids,
                     size_t *ret_len)
{
        const struct metrics *m = &reg->metrics;
        const struct wire_limit_set *lim = &reg->lim;
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);

        if (!f)
                return NULL;
        if (reg->refresh_in_flight)
                reg->refresh_in_flight(reg->refresh_ctx);
        head(f, "dlx_build_info", "gauge", "The dlxd version and protocol, as labels.");
        fprintf(f, "dlx_build_info{version=\"%s\",protocol=\"%d.%d\"} 1\n", DLX_VERSION,
                DLX_PROTO_MAJOR, DLX_PROTO_MINOR);
        one(f, "dlx_start_time_seconds", "gauge", "When dlxd started, in seconds since the epoch.",
            reg->started_unix);

        head(f, "dlx_requests_total", "counter", "Requests received, by type.");
        for (int t = 0; t < WIRE_REQ_COUNT; t++)
                fprintf(f, "dlx_requests_total{type=\"%s\"} %llu\n", type_label(t),
                        (unsigned long long)m->requests[t]);
        head(f, "dlx_request_errors_total", "counter",
             "Requests answered with an error, by type and status.");
        for (int t = 0; t < WIRE_REQ_COUNT; t++)
                for (int st = 1; st < WIRE_STATUS_COUNT; st++)
                        if (m->errors[t][st])
                                fprintf(f,
                                        "dlx_request_errors_total{type=\"%s\",status=\"%s\"} "
                                        "%llu\n",
                                        type_label(t), status_names[st],
                                        (unsigned long long)m->errors[t][st]);
        one(f, "dlx_publishes_total", "counter", "Versions published.", reg->publishes);
        one(f, "dlx_acquires_total", "counter", "Leases granted.", reg->acquires);
        histogram(f, "dlx_acquire_duration_seconds",
                  "From an acquire's arrival to its answer, waits for a version included.",
                  &m->acquire);
        histogram(f, "dlx_publish_duration_seconds",
                  "From a publish's arrival to its answer, a group's table check included.",
                  &m->publish);

        one(f, "dlx_names", "gauge", "Names with a current version.", reg->nnames);
        limit(f, "dlx_names_limit", "The most names (--max-names).", lim->max_names);
        one(f, "dlx_versions", "gauge", "Versions alive: current, or replaced and still leased.",
            reg->nversions);
        one(f, "dlx_leases", "gauge", "Leases held by clients.", reg->nleases);
        one(f, "dlx_segments", "gauge", "Shared-memory segments held.", reg->store->segments.count);
        one(f, "dlx_held_bytes", "gauge", "Shared bytes held (the segments' sizes).",
            reg->store->bytes);
        limit(f, "dlx_held_limit_bytes", "The most shared bytes held (--max-bytes).",
              reg->store->max_bytes);
        limit(f, "dlx_uid_held_limit_bytes", "The most shared bytes held for one uid.",
              reg->store->max_bytes_per_uid);
        one(f, "dlx_clients", "gauge", "Connected clients.", reg->nsessions);
        limit(f, "dlx_clients_limit", "The most connected clients (--max-clients).",
              lim->max_clients);
        one(f, "dlx_lingering_connections", "gauge",
            "Ended connections kept until their peers read the descriptors sent to them.",
            reg->nlingering);
        one(f, "dlx_watches", "gauge", "Watches of all clients.", reg->watches.count);
        one(f, "dlx_segment_fds", "gauge", "Descriptors held for segments.", reg->store->fds);
        limit(f, "dlx_segment_fds_limit", "The most descriptors held for segments (--max-fds).",
              lim->max_fds);
        if (reg->fds_in_flight) {
                one(f, "dlx_fds_in_flight", "gauge",
                    "Descriptors sent to clients and not yet received by them.",
                    *reg->fds_in_flight);
                limit(f, "dlx_fds_in_flight_limit",
                      "The most descriptors in flight to all clients at once.",
                      *reg->fds_in_flight_budget);
        }
        one(f, "dlx_queued_bytes", "gauge", "Output queued for clients to read.", reg->queued);
        limit(f, "dlx_client_queued_limit_bytes",
              "Output queued for one client past which its requests wait (--max-queued).",
              lim->max_queued);
        unsigned omitted = render_uids(f, reg, all_uids, uid, max_uids);
        one(f, "dlx_uids_omitted", "gauge",
            "Uids left out of the per-uid series of a reply (which must fit in a frame).", omitted);
        if (fclose(f) != 0) {
                free(text);
                return NULL;
        }
        *ret_len = len;
        return text;
}
