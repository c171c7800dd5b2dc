/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the codec (proto/wire.c) as both ends meet it. The input is
 * one frame payload, given to wire_request_decode() (what dlxd does with a
 * client's frame) and to wire_reply_decode() (what libdlx does with the
 * daemon's). For each decode that succeeds:
 *
 *  - every limit wire.h and wire_limits.h document holds: names pass
 *    layout_name_check(), prefixes layout_prefix_check(), tensors
 *    wire_tensor_check() (so ndim <= DLX_MAX_NDIM), counts their maxima,
 *    every string is terminated inside its buffer;
 *  - it encodes again (wire_*_size, wire_*_pack and wire_reply_encode agree
 *    on the bytes), and the encoding decodes to the same struct;
 *  - the layout functions run over every tensor in it, as the daemon runs
 *    them at publish (extent arithmetic is where overflows hide).
 *
 * A failed decode must say why in a terminated message, and a request that
 * failed with -EINVAL must still carry its id when the protobuf was readable.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "layout.h"
#include "wire.h"

#define STR_OK(s) (strnlen((s), sizeof(s)) < sizeof(s))

static void check_name(const char *name, size_t cap, const char *what)
{
        const char *why = NULL;
        size_t len = strnlen(name, cap);

        FUZZ_CHECK(len < cap, "%s not terminated", what);
        FUZZ_CHECK(layout_name_check(name, len, &why) == 0, "%s '%s' decoded but: %s", what, name,
                   why);
}

static void check_prefix(const char *prefix, size_t cap, const char *what)
{
        const char *why = NULL;
        size_t len = strnlen(prefix, cap);

        FUZZ_CHECK(len < cap, "%s not terminated", what);
        FUZZ_CHECK(layout_prefix_check(prefix, len, &why) == 0, "%s decoded but: %s", what, why);
}

/* The arithmetic the daemon does on a published descriptor, with its own consistency. */
static void exercise_layout(const struct wire_tensor *t)
{
        int64_t compact[DLX_MAX_NDIM], lo = 1, hi = 1;
        uint64_t numel = 0;
        const char *why = NULL;
        char name[64];
        int err, nerr;

        nerr = layout_numel(t->ndim, t->shape, &numel);
        err = layout_extent(t->dtype, t->ndim, t->shape, t->strides, t->byte_offset, t->flags, &lo,
                            &hi, &why);
        FUZZ_CHECK(err == 0 || err == -EINVAL || err == -EOVERFLOW, "layout_extent gave %d", err);
        FUZZ_CHECK(err != 0 || lo <= hi, "extent [%lld, %lld)", (long long)lo, (long long)hi);
        FUZZ_CHECK(err != 0 || nerr != 0 || numel != 0 || (lo == 0 && hi == 0),
                   "an empty tensor touches [%lld, %lld)", (long long)lo, (long long)hi);
        /* compact strides describe a compact layout whenever the shape has a size */
        layout_compact_strides(t->ndim, t->shape, compact);
        if (nerr == 0)
                FUZZ_CHECK(layout_is_compact(t->ndim, t->shape, compact),
                           "layout_compact_strides() is not compact");
        (void)layout_is_compact(t->ndim, t->shape, t->strides);
        if (nerr == 0)
                (void)layout_compact_bytes(t->dtype, numel, t->flags);
        layout_dtype_name(t->dtype, name, sizeof(name));
        FUZZ_CHECK(STR_OK(name), "dtype name not terminated");
        layout_dtype_name(t->dtype, name, 5);
}

static void check_tensor(const struct wire_tensor *t, const char *what)
{
        const char *why = NULL;

        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= DLX_MAX_NDIM, "%s with ndim %d", what, t->ndim);
        check_name(t->name, sizeof(t->name), what);
        FUZZ_CHECK(wire_tensor_check(t, &why) == 0, "%s decoded but: %s", what, why);
        exercise_layout(t);
}

static void check_request(const struct wire_request *q)
{
        FUZZ_CHECK(q->id != 0, "request with id 0 decoded");
        switch (q->type) {
        case WIRE_REQ_HELLO:
                check_prefix(q->hello.client_name, sizeof(q->hello.client_name), "client name");
                FUZZ_CHECK(strlen(q->hello.client_name) <= DLX_CLIENT_NAME_MAX, "long client name");
                break;
        case WIRE_REQ_PUBLISH:
                check_tensor(&q->publish.tensor, "published tensor");
                check_prefix(q->publish.origin, sizeof(q->publish.origin), "origin");
                FUZZ_CHECK(strlen(q->publish.origin) <= DLX_ORIGIN_MAX, "long origin");
                break;
        case WIRE_REQ_MOUNT: {
                const char *why = NULL;
                check_prefix(q->mount.prefix, sizeof(q->mount.prefix), "mount prefix");
                FUZZ_CHECK(wire_mount_check(q->mount.prefix, &why) == 0, "mount prefix: %s", why);
                break;
        }
        case WIRE_REQ_FETCH_FAILED:
                check_name(q->fetch_failed.name, sizeof(q->fetch_failed.name), "fetch-failed name");
                check_prefix(q->fetch_failed.error, sizeof(q->fetch_failed.error), "fetch error");
                FUZZ_CHECK(q->fetch_failed.status > WIRE_OK &&
                                   q->fetch_failed.status < WIRE_STATUS_COUNT,
                           "fetch-failed status %d", q->fetch_failed.status);
                break;
        case WIRE_REQ_ACQUIRE:
                check_name(q->acquire.name, sizeof(q->acquire.name), "acquire name");
                break;
        case WIRE_REQ_UNPUBLISH:
                check_name(q->unpublish.name, sizeof(q->unpublish.name), "unpublish name");
                break;
        case WIRE_REQ_STAT:
                check_name(q->stat.name, sizeof(q->stat.name), "stat name");
                break;
        case WIRE_REQ_LIST:
                check_prefix(q->list.prefix, sizeof(q->list.prefix), "list prefix");
                check_prefix(q->list.after, sizeof(q->list.after), "list cursor");
                break;
        case WIRE_REQ_WATCH:
                check_prefix(q->watch.prefix, sizeof(q->watch.prefix), "watch prefix");
                break;
        case WIRE_REQ_FORGET:
                FUZZ_CHECK(q->forget.count >= 1 && q->forget.count <= DLX_FORGET_MAX,
                           "forget of %u segments", q->forget.count);
                break;
        case WIRE_REQ_TRACK:
                check_name(q->track.name, sizeof(q->track.name), "track name");
                break;
        case WIRE_REQ_RELEASE:
        case WIRE_REQ_UNTRACK:
        case WIRE_REQ_UNWATCH:
        case WIRE_REQ_ALLOC:
        case WIRE_REQ_FREE:
        case WIRE_REQ_STATS:
        case WIRE_REQ_METRICS:
        case WIRE_REQ_PING:
        case WIRE_REQ_BYE:
                break;
        default:
                FUZZ_CHECK(false, "request of type %d decoded", (int)q->type);
        }
        FUZZ_CHECK(strcmp(wire_request_name(q->type), "unknown") != 0, "unnamed type %d",
                   (int)q->type);
}

static void check_info(const struct wire_info *info, const char *what)
{
        check_tensor(&info->tensor, what);
        FUZZ_CHECK(STR_OK(info->producer_name), "%s: producer name not terminated", what);
        check_prefix(info->origin, sizeof(info->origin), "origin");
}

static void check_reply(const struct wire_reply *p)
{
        FUZZ_CHECK(STR_OK(p->error), "error text not terminated");
        switch (p->type) {
        case WIRE_REP_NONE:
        case WIRE_REP_PUBLISH:
        case WIRE_REP_WATCH:
        case WIRE_REP_TRACK:
        case WIRE_REP_ALLOC:
        case WIRE_REP_SEGMENT:
        case WIRE_REP_STATS:
        case WIRE_REP_PONG:
                break;
        case WIRE_REP_HELLO:
                FUZZ_CHECK(STR_OK(p->hello.server), "server name not terminated");
                break;
        case WIRE_REP_ACQUIRE:
                check_tensor(&p->acquire.tensor, "acquired tensor");
                break;
        case WIRE_REP_STAT:
                check_info(&p->stat.info, "stat info");
                break;
        case WIRE_REP_LIST:
                FUZZ_CHECK(p->list.count <= DLX_LIST_PAGE_MAX, "list page of %u", p->list.count);
                FUZZ_CHECK((p->list.count == 0) == (p->list.entries == NULL), "%u entries at %p",
                           p->list.count, (void *)p->list.entries);
                FUZZ_CHECK(STR_OK(p->list.next), "list cursor not terminated");
                for (uint32_t i = 0; i < p->list.count; i++)
                        check_info(&p->list.entries[i], "list entry");
                break;
        case WIRE_REP_METRICS:
                FUZZ_CHECK(p->metrics.text && p->metrics.len < DLX_MAX_FRAME &&
                                   p->metrics.text[p->metrics.len] == '\0',
                           "metrics text of %u bytes not terminated", p->metrics.len);
                break;
        case WIRE_REP_EVENT:
                FUZZ_CHECK(STR_OK(p->event.name), "event name not terminated");
                FUZZ_CHECK(p->event.nevents <= DLX_MAX_RELEASE_EVENTS, "%u release events",
                           p->event.nevents);
                FUZZ_CHECK((p->event.nevents == 0) == (p->event.events == NULL), "%u events at %p",
                           p->event.nevents, (void *)p->event.events);
                break;
        default:
                FUZZ_CHECK(false, "reply of type %d decoded", (int)p->type);
        }
}

static void round_trip_request(const struct wire_request *q)
{
        struct wire_request again;
        char err[DLX_ERROR_MAX + 1];
        size_t size = 0, packed;
        uint8_t *buf;
        int r;

        r = wire_request_size(q, &size);
        FUZZ_CHECK(r == 0, "a decoded request does not encode: %d", r);
        FUZZ_CHECK(size <= DLX_MAX_FRAME, "a decoded request encodes to %zu bytes", size);
        buf = malloc(size ? size : 1);
        FUZZ_CHECK(buf != NULL, "out of memory");
        packed = wire_request_pack(q, buf);
        FUZZ_CHECK(packed == size, "packed %zu bytes, sized %zu", packed, size);
        memset(&again, 0, sizeof(again));
        r = wire_request_decode(buf, size, &again, err, sizeof(err));
        FUZZ_CHECK(r == 0, "a re-encoded request does not decode: %s", err);
        FUZZ_CHECK(memcmp(q, &again, sizeof(again)) == 0, "request of type %s changed on the way",
                   wire_request_name(q->type));
        free(buf);
}

/* Compares decoded replies; their allocated arrays by content. */
static void compare_replies(const struct wire_reply *a, const struct wire_reply *b)
{
        struct wire_reply x = *a, y = *b;

        FUZZ_CHECK(a->type == b->type, "reply type %d came back as %d", a->type, b->type);
        if (a->type == WIRE_REP_LIST) {
                FUZZ_CHECK(a->list.count == b->list.count, "%u entries came back as %u",
                           a->list.count, b->list.count);
                FUZZ_CHECK(a->list.count == 0 ||
                                   memcmp(a->list.entries, b->list.entries,
                                          a->list.count * sizeof(struct wire_info)) == 0,
                           "list entries changed on the way");
                x.list.entries = y.list.entries = NULL;
        } else if (a->type == WIRE_REP_EVENT) {
                FUZZ_CHECK(a->event.nevents == b->event.nevents, "%u events came back as %u",
                           a->event.nevents, b->event.nevents);
                FUZZ_CHECK(a->event.nevents == 0 ||
                                   memcmp(a->event.events, b->event.events,
                                          (size_t)a->event.nevents * DLX_CUDA_HANDLE) == 0,
                           "release events changed on the way");
                x.event.events = y.event.events = NULL;
        } else if (a->type == WIRE_REP_METRICS) {
                FUZZ_CHECK(a->metrics.len == b->metrics.len &&
                                   memcmp(a->metrics.text, b->metrics.text, a->metrics.len) == 0,
                           "metrics text changed on the way");
                x.metrics.text = y.metrics.text = NULL;
        }
        FUZZ_CHECK(memcmp(&x, &y, sizeof(x)) == 0, "reply of type %d changed on the way",
                   (int)a->type);
}

static void round_trip_reply(const struct wire_reply *p)
{
        struct wire_reply again;
        char err[DLX_ERROR_MAX + 1];
        size_t size = 0, size2 = 0, packed;
        uint8_t *buf, *buf2;
        int r;

        r = wire_reply_size(p, &size);
        FUZZ_CHECK(r == 0, "a decoded reply does not encode: %d", r);
        buf = malloc(size ? size : 1);
        buf2 = malloc(size + 1);
        FUZZ_CHECK(buf && buf2, "out of memory");
        packed = wire_reply_pack(p, buf);
        FUZZ_CHECK(packed == size, "packed %zu bytes, sized %zu", packed, size);
        if (size > 0) {
                r = wire_reply_encode(p, buf2, size - 1, &size2);
                FUZZ_CHECK(r == -ENOBUFS && size2 == size, "encode into %zu bytes gave %d, %zu",
                           size - 1, r, size2);
        }
        r = wire_reply_encode(p, buf2, size + 1, &size2);
        FUZZ_CHECK(r == 0 && size2 == size, "encode gave %d, %zu bytes for %zu", r, size2, size);
        FUZZ_CHECK(size == 0 || memcmp(buf, buf2, size) == 0, "encode and pack differ");

        memset(&again, 0, sizeof(again));
        r = wire_reply_decode(buf, size, &again, err, sizeof(err));
        FUZZ_CHECK(r == 0, "a re-encoded reply does not decode: %s", err);
        compare_replies(p, &again);
        wire_reply_done(&again);
        free(buf);
        free(buf2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char err[DLX_ERROR_MAX + 1];
        struct wire_request q;
        struct wire_reply p;
        int r;

        if (size > DLX_MAX_FRAME)
                return 0; /* no frame carries more */

        memset(&q, 0, sizeof(q));
        err[0] = '\0';
        r = wire_request_decode(data, size, &q, err, sizeof(err));
        FUZZ_CHECK(r == 0 || r == -EPROTO || r == -EINVAL || r == -ENOMEM,
                   "wire_request_decode gave %d", r);
        if (r == 0) {
                check_request(&q);
                round_trip_request(&q);
        } else {
                FUZZ_CHECK(STR_OK(err) && err[0], "a failed decode without a reason");
                /* a readable request always has an id: 0 is -EPROTO */
                FUZZ_CHECK(r != -EINVAL || q.id != 0, "-EINVAL without the request's id");
        }

        memset(&p, 0, sizeof(p));
        err[0] = '\0';
        r = wire_reply_decode(data, size, &p, err, sizeof(err));
        FUZZ_CHECK(r == 0 || r == -EPROTO || r == -EINVAL || r == -ENOMEM,
                   "wire_reply_decode gave %d", r);
        if (r == 0) {
                check_reply(&p);
                round_trip_reply(&p);
                wire_reply_done(&p);
        } else {
                FUZZ_CHECK(STR_OK(err) && err[0], "a failed decode without a reason");
                /* a failed decode owns nothing: wire_reply_done() is a no-op, and safe */
                wire_reply_done(&p);
        }
        return 0;
}
