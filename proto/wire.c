/* SPDX-License-Identifier: MIT */
#include "wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlx.pb-c.h"
#include "layout.h"

/* ---- status <-> errno: the only table ------------------------------------------------- */

static const int status_errno[WIRE_STATUS_COUNT] = {
        [WIRE_OK] = 0,
        [WIRE_INVALID] = EINVAL,
        [WIRE_NOT_FOUND] = ENOENT,
        [WIRE_PERMISSION] = EACCES,
        [WIRE_TIMEOUT] = ETIMEDOUT,
        [WIRE_NO_SPACE] = ENOSPC,
        [WIRE_LIMIT] = EAGAIN,
        [WIRE_PROTOCOL] = EPROTO,
        [WIRE_VERSION] = EPROTONOSUPPORT,
        [WIRE_BAD_FD] = EBADF,
        [WIRE_TOO_BIG] = EMSGSIZE,
        [WIRE_BUSY] = EBUSY,
        [WIRE_EXISTS] = EEXIST,
        [WIRE_NO_MEMORY] = ENOMEM,
        [WIRE_INTERNAL] = EIO,
        [WIRE_NOT_SUPPORTED] = ENOTSUP,
        [WIRE_SHUTDOWN] = ESHUTDOWN,
        [WIRE_CLOSED] = ECONNRESET,
        [WIRE_IS_GROUP] = EISDIR,
        [WIRE_NOT_GROUP] = ENOTDIR,
        [WIRE_UNREACHABLE] = EHOSTUNREACH,
};

int wire_status_errno(int status)
{
        if (status < 0 || status >= WIRE_STATUS_COUNT)
                return EPROTO;
        return status_errno[status];
}

bool wire_errno_carried(int err)
{
        return err < 0 && err >= -4095 && wire_status_errno(wire_errno_status(err)) == -err;
}

enum wire_status wire_errno_status(int err)
{
        if (err < 0)
                err = -err;
        if (err == 0)
                return WIRE_OK;
        if (err == EPERM)
                return WIRE_PERMISSION;
        if (err == EOVERFLOW || err == E2BIG)
                return WIRE_TOO_BIG;
        for (int s = 1; s < WIRE_STATUS_COUNT; s++)
                if (status_errno[s] == err)
                        return (enum wire_status)s;
        return WIRE_INTERNAL;
}

static const char *const request_names[WIRE_REQ_COUNT] = {
        [WIRE_REQ_NONE] = "none",       [WIRE_REQ_HELLO] = "hello",
        [WIRE_REQ_PUBLISH] = "publish", [WIRE_REQ_ACQUIRE] = "acquire",
        [WIRE_REQ_RELEASE] = "release", [WIRE_REQ_UNPUBLISH] = "unpublish",
        [WIRE_REQ_LIST] = "list",       [WIRE_REQ_STAT] = "stat",
        [WIRE_REQ_WATCH] = "watch",     [WIRE_REQ_UNWATCH] = "unwatch",
        [WIRE_REQ_ALLOC] = "alloc",     [WIRE_REQ_FREE] = "free",
        [WIRE_REQ_FORGET] = "forget",   [WIRE_REQ_STATS] = "stats",
        [WIRE_REQ_PING] = "ping",       [WIRE_REQ_BYE] = "bye",
        [WIRE_REQ_TRACK] = "track",     [WIRE_REQ_UNTRACK] = "untrack",
        [WIRE_REQ_MOUNT] = "mount",     [WIRE_REQ_FETCH_FAILED] = "fetch-failed",
        [WIRE_REQ_METRICS] = "metrics",
};

const char *wire_request_name(enum wire_request_type type)
{
        if ((unsigned)type >= WIRE_REQ_COUNT)
                return "unknown";
        return request_names[type];
}

/* ---- helpers -------------------------------------------------------------------------- */

static int fail(char *err, size_t errsz, int code, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errsz, int code, const char *fmt, ...)
{
        if (err && errsz) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(err, errsz, fmt, ap);
                va_end(ap);
        }
        return code;
}

/* A bytes field into a fixed buffer; refuses embedded NULs and overlong values. */
static int take_bytes(char *dst, size_t cap, ProtobufCBinaryData src)
{
        if (src.len >= cap || (src.len && memchr(src.data, 0, src.len)))
                return -EINVAL;
        if (src.len)
                memcpy(dst, src.data, src.len);
        dst[src.len] = '\0';
        return 0;
}

static ProtobufCBinaryData give_bytes(const char *s)
{
        ProtobufCBinaryData b = {.len = strlen(s), .data = (uint8_t *)s};
        return b;
}

/* A fixed-size bytes field (a CUDA handle, a UUID): absent, or exactly len bytes. */
static int take_fixed(uint8_t *dst, size_t len, bool *ret_has, ProtobufCBinaryData src)
{
        *ret_has = src.len != 0;
        if (src.len == 0)
                return 0;
        if (src.len != len)
                return -EINVAL;
        memcpy(dst, src.data, len);
        return 0;
}

static ProtobufCBinaryData give_fixed(const uint8_t *src, size_t len, bool has)
{
        ProtobufCBinaryData b = {.len = has ? len : 0, .data = (uint8_t *)src};
        return b;
}

static int take_handle(uint8_t *dst, bool *ret_has, ProtobufCBinaryData src)
{
        return take_fixed(dst, DLX_CUDA_HANDLE, ret_has, src);
}

static ProtobufCBinaryData give_handle(const uint8_t *src, bool has)
{
        return give_fixed(src, DLX_CUDA_HANDLE, has);
}

/* A string field carried for people: absent, or printable UTF-8 that fits cap. */
static int take_text(char *dst, size_t cap, const char *src)
{
        size_t n = src ? strlen(src) : 0;

        if (n >= cap)
                return -EINVAL;
        memcpy(dst, src ? src : "", n + 1);
        return wire_text_valid(dst) ? 0 : -EINVAL;
}

bool wire_text_valid(const char *s)
{
        return layout_prefix_check(s, strlen(s), NULL) == 0;
}

int wire_mount_check(const char *prefix, const char **ret_why)
{
        size_t len = strlen(prefix);
        const char *slash = memchr(prefix, '/', len);
        const char *reason = NULL;

        if (len < 3 || prefix[0] != '@' || !slash || slash != prefix + len - 1)
                reason = "a mount prefix is '@', an alias, then '/'";
        else if (len - 2 > DLX_ALIAS_MAX)
                reason = "an alias is at most 32 bytes";
        else if (layout_name_check(prefix, len - 1, &reason) == 0) /* printable, as a name */
                return 0;
        if (ret_why)
                *ret_why = reason;
        return -EINVAL;
}

/* Strings we emit must be terminated within their buffers. */
static bool bounded(const char *s, size_t cap)
{
        return memchr(s, 0, cap) != NULL;
}

/* ---- decoding arena ------------------------------------------------------------------- */

/*
 * protobuf-c allocates every unpacked message, repeated field and bytes value
 * separately. A request or reply on the hot path needs well under 2 KiB, so a
 * decode takes that from the caller's stack and only what does not fit (a list
 * page, a big shape) goes to the heap; the arena is then dropped whole, and
 * free_unpacked only runs when something did go to the heap.
 */
#define PB_ARENA_SIZE 4096

struct pb_arena {
        ProtobufCAllocator allocator;
        size_t used;
        unsigned heap; /* allocations that did not fit */
        bool failed;   /* one of them found no memory: a NULL unpack is not the peer's fault */
        max_align_t buf[PB_ARENA_SIZE / sizeof(max_align_t)];
};

static void *pb_arena_alloc(void *data, size_t size)
{
        struct pb_arena *a = data;
        size_t need = (size + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);

        if (need >= size && need <= sizeof(a->buf) - a->used) {
                void *p = (uint8_t *)a->buf + a->used;
                a->used += need;
                return p;
        }
        void *p = malloc(size);
        a->heap++;
        a->failed |= p == NULL;
        return p;
}

static void pb_arena_free(void *data, void *p)
{
        struct pb_arena *a = data;
        uintptr_t u = (uintptr_t)p, lo = (uintptr_t)a->buf;

        if (u < lo || u >= lo + sizeof(a->buf))
                free(p);
}

static void pb_arena_init(struct pb_arena *a)
{
        a->allocator.alloc = pb_arena_alloc;
        a->allocator.free = pb_arena_free;
        a->allocator.allocator_data = a;
        a->used = 0;
        a->heap = 0;
        a->failed = false;
}

/* ---- tensor --------------------------------------------------------------------------- */

/* Storage for one tensor's nested messages while packing; lives on the caller's stack. */
struct tensor_pb {
        Dlxp__Tensor t;
        Dlxp__DType dtype;
        Dlxp__Device device;
};

static int tensor_to_pb(const struct wire_tensor *src, struct tensor_pb *pb)
{
        if (!bounded(src->name, sizeof(src->name)) || src->ndim < 0 || src->ndim > DLX_MAX_NDIM)
                return -EINVAL;
        dlxp__tensor__init(&pb->t);
        dlxp__dtype__init(&pb->dtype);
        dlxp__device__init(&pb->device);
        pb->dtype.code = src->dtype.code;
        pb->dtype.bits = src->dtype.bits;
        pb->dtype.lanes = src->dtype.lanes;
        pb->device.type = src->device_type;
        pb->device.id = src->device_id;
        pb->t.name = give_bytes(src->name);
        pb->t.version = src->version;
        pb->t.dtype = &pb->dtype;
        pb->t.n_shape = (size_t)src->ndim;
        pb->t.shape = (int64_t *)src->shape;
        pb->t.n_strides = (size_t)src->ndim;
        pb->t.strides = (int64_t *)src->strides;
        pb->t.byte_offset = src->byte_offset;
        pb->t.device = &pb->device;
        pb->t.flags = src->flags;
        pb->t.storage = (Dlxp__Storage)src->storage;
        pb->t.segment = src->segment;
        pb->t.offset = src->offset;
        pb->t.length = src->length;
        pb->t.ipc_handle = give_handle(src->ipc_handle, src->has_ipc_handle);
        pb->t.event = give_handle(src->event, src->has_event);
        pb->t.device_uuid = give_fixed(src->device_uuid, DLX_CUDA_UUID, src->has_device_uuid);
        pb->t.pid_namespace = src->pid_namespace;
        pb->t.event_session = src->event_session;
        pb->t.members = src->members;
        pb->t.table_segment = src->table_segment;
        return 0;
}

int wire_tensor_check(const struct wire_tensor *t, const char **ret_why)
{
        int err;

        if (t->ndim < 0 || t->ndim > DLX_MAX_NDIM) {
                if (ret_why)
                        *ret_why = "ndim over 32";
                return -EINVAL;
        }
        err = layout_name_check(t->name, strlen(t->name), ret_why);
        if (err < 0)
                return err;
        err = layout_dtype_check(t->dtype, ret_why);
        if (err < 0)
                return err;
        for (int32_t i = 0; i < t->ndim; i++) {
                if (t->shape[i] < 0) {
                        if (ret_why)
                                *ret_why = "negative dimension";
                        return -EINVAL;
                }
        }
        return 0;
}

static int tensor_from_pb(const Dlxp__Tensor *src, struct wire_tensor *dst, char *why, size_t whysz)
{
        memset(dst, 0, offsetof(struct wire_tensor, shape));
        if (take_bytes(dst->name, sizeof(dst->name), src->name) < 0)
                return fail(why, whysz, -EINVAL, "tensor name too long or contains NUL");
        if (src->n_shape > DLX_MAX_NDIM)
                return fail(why, whysz, -EINVAL, "ndim %zu over the limit of %d", src->n_shape,
                            DLX_MAX_NDIM);
        if (src->n_strides != src->n_shape)
                return fail(why, whysz, -EINVAL, "%zu strides for %zu dimensions", src->n_strides,
                            src->n_shape);
        if (!src->dtype)
                return fail(why, whysz, -EINVAL, "tensor without dtype");
        if (src->dtype->code > 255 || src->dtype->bits > 255 || src->dtype->lanes > 65535)
                return fail(why, whysz, -EINVAL, "dtype field out of range");
        dst->version = src->version;
        dst->dtype.code = (uint8_t)src->dtype->code;
        dst->dtype.bits = (uint8_t)src->dtype->bits;
        dst->dtype.lanes = (uint16_t)src->dtype->lanes;
        dst->ndim = (int32_t)src->n_shape;
        if (src->n_shape) {
                memcpy(dst->shape, src->shape, src->n_shape * sizeof(int64_t));
                memcpy(dst->strides, src->strides, src->n_shape * sizeof(int64_t));
        }
        dst->byte_offset = src->byte_offset;
        if (src->device) {
                dst->device_type = src->device->type;
                dst->device_id = src->device->id;
        }
        dst->flags = src->flags;
        dst->storage = (uint32_t)src->storage;
        dst->segment = src->segment;
        dst->offset = src->offset;
        dst->length = src->length;
        if (take_handle(dst->ipc_handle, &dst->has_ipc_handle, src->ipc_handle) < 0 ||
            take_handle(dst->event, &dst->has_event, src->event) < 0)
                return fail(why, whysz, -EINVAL, "a CUDA handle must be %d bytes", DLX_CUDA_HANDLE);
        if (take_fixed(dst->device_uuid, DLX_CUDA_UUID, &dst->has_device_uuid, src->device_uuid) <
            0)
                return fail(why, whysz, -EINVAL, "a device UUID must be %d bytes", DLX_CUDA_UUID);
        dst->pid_namespace = src->pid_namespace;
        dst->event_session = src->event_session;
        dst->members = src->members;
        dst->table_segment = src->table_segment;
        return 0;
}

/* Full descriptor validation for descriptors a peer wants the other side to act on. */
static int tensor_valid(const struct wire_tensor *t, char *why, size_t whysz)
{
        const char *reason = NULL;

        if (wire_tensor_check(t, &reason) < 0)
                return fail(why, whysz, -EINVAL, "bad tensor '%s': %s", t->name, reason);
        return 0;
}

static int info_to_pb(const struct wire_info *src, Dlxp__Info *pb, struct tensor_pb *tpb)
{
        if (!bounded(src->producer_name, sizeof(src->producer_name)) ||
            !bounded(src->origin, sizeof(src->origin)) || tensor_to_pb(&src->tensor, tpb) < 0)
                return -EINVAL;
        dlxp__info__init(pb);
        pb->tensor = &tpb->t;
        pb->owner_uid = src->owner_uid;
        pb->producer_pid = src->producer_pid;
        pb->persist = src->persist;
        pb->leases = src->leases;
        pb->segment_size = src->segment_size;
        pb->published_ns = src->published_ns;
        pb->live_versions = src->live_versions;
        pb->producer_name = (char *)src->producer_name;
        pb->origin = (char *)src->origin;
        return 0;
}

static int info_from_pb(const Dlxp__Info *src, struct wire_info *dst, char *why, size_t whysz)
{
        int r;

        if (!src->tensor)
                return fail(why, whysz, -EINVAL, "info without tensor");
        r = tensor_from_pb(src->tensor, &dst->tensor, why, whysz);
        if (r == 0)
                r = tensor_valid(&dst->tensor, why, whysz);
        if (r < 0)
                return r;
        dst->owner_uid = src->owner_uid;
        dst->producer_pid = src->producer_pid;
        dst->persist = src->persist;
        dst->leases = src->leases;
        dst->segment_size = src->segment_size;
        dst->published_ns = src->published_ns;
        dst->live_versions = src->live_versions;
        snprintf(dst->producer_name, sizeof(dst->producer_name), "%s",
                 src->producer_name ? src->producer_name : "");
        if (take_text(dst->origin, sizeof(dst->origin), src->origin) < 0)
                return fail(why, whysz, -EINVAL, "an origin must be printable and at most %d bytes",
                            DLX_ORIGIN_MAX);
        return 0;
}

/* ---- requests ------------------------------------------------------------------------- */

/*
 * Builds the protobuf view of a request. Every nested message lives in *s, so
 * nothing is allocated; pointers into req stay borrowed.
 */
struct request_pb {
        Dlxp__Request r;
        union {
                Dlxp__Hello hello;
                Dlxp__Publish publish;
                Dlxp__Acquire acquire;
                Dlxp__Release release;
                Dlxp__Unpublish unpublish;
                Dlxp__List list;
                Dlxp__Stat stat;
                Dlxp__Watch watch;
                Dlxp__Unwatch unwatch;
                Dlxp__Alloc alloc;
                Dlxp__Free free;
                Dlxp__Forget forget;
                Dlxp__Stats stats;
                Dlxp__Ping ping;
                Dlxp__Bye bye;
                Dlxp__Track track;
                Dlxp__Untrack untrack;
                Dlxp__Mount mount;
                Dlxp__FetchFailed fetch_failed;
                Dlxp__Metrics metrics;
        };
        struct tensor_pb tensor;
};

static int request_to_pb(const struct wire_request *q, struct request_pb *s)
{
        Dlxp__Request *r = &s->r;

        dlxp__request__init(r);
        r->id = q->id;
        switch (q->type) {
        case WIRE_REQ_HELLO:
                if (!bounded(q->hello.client_name, sizeof(q->hello.client_name)))
                        return -EINVAL;
                dlxp__hello__init(&s->hello);
                s->hello.major = q->hello.major;
                s->hello.minor = q->hello.minor;
                s->hello.client_name = give_bytes(q->hello.client_name);
                s->hello.pid = q->hello.pid;
                r->body_case = DLXP__REQUEST__BODY_HELLO;
                r->hello = &s->hello;
                return 0;
        case WIRE_REQ_PUBLISH:
                dlxp__publish__init(&s->publish);
                if (tensor_to_pb(&q->publish.tensor, &s->tensor) < 0)
                        return -EINVAL;
                s->publish.tensor = &s->tensor.t;
                s->publish.persist = q->publish.persist;
                s->publish.token = q->publish.token;
                s->publish.hold = q->publish.hold;
                s->publish.segment_size = q->publish.segment_size;
                if (!bounded(q->publish.origin, sizeof(q->publish.origin)))
                        return -EINVAL;
                s->publish.origin_version = q->publish.origin_version;
                s->publish.origin = (char *)q->publish.origin;
                r->body_case = DLXP__REQUEST__BODY_PUBLISH;
                r->publish = &s->publish;
                return 0;
        case WIRE_REQ_ACQUIRE:
                if (!bounded(q->acquire.name, sizeof(q->acquire.name)))
                        return -EINVAL;
                dlxp__acquire__init(&s->acquire);
                s->acquire.name = give_bytes(q->acquire.name);
                s->acquire.min_version = q->acquire.min_version;
                s->acquire.timeout_ms = q->acquire.timeout_ms;
                s->acquire.group = q->acquire.group;
                r->body_case = DLXP__REQUEST__BODY_ACQUIRE;
                r->acquire = &s->acquire;
                return 0;
        case WIRE_REQ_RELEASE:
                dlxp__release__init(&s->release);
                s->release.lease = q->release.lease;
                s->release.event = give_handle(q->release.event, q->release.has_event);
                r->body_case = DLXP__REQUEST__BODY_RELEASE;
                r->release = &s->release;
                return 0;
        case WIRE_REQ_UNPUBLISH:
                if (!bounded(q->unpublish.name, sizeof(q->unpublish.name)))
                        return -EINVAL;
                dlxp__unpublish__init(&s->unpublish);
                s->unpublish.name = give_bytes(q->unpublish.name);
                r->body_case = DLXP__REQUEST__BODY_UNPUBLISH;
                r->unpublish = &s->unpublish;
                return 0;
        case WIRE_REQ_LIST:
                if (!bounded(q->list.prefix, sizeof(q->list.prefix)) ||
                    !bounded(q->list.after, sizeof(q->list.after)))
                        return -EINVAL;
                dlxp__list__init(&s->list);
                s->list.prefix = give_bytes(q->list.prefix);
                s->list.after = give_bytes(q->list.after);
                s->list.limit = q->list.limit;
                r->body_case = DLXP__REQUEST__BODY_LIST;
                r->list = &s->list;
                return 0;
        case WIRE_REQ_STAT:
                if (!bounded(q->stat.name, sizeof(q->stat.name)))
                        return -EINVAL;
                dlxp__stat__init(&s->stat);
                s->stat.name = give_bytes(q->stat.name);
                r->body_case = DLXP__REQUEST__BODY_STAT;
                r->stat = &s->stat;
                return 0;
        case WIRE_REQ_WATCH:
                if (!bounded(q->watch.prefix, sizeof(q->watch.prefix)))
                        return -EINVAL;
                dlxp__watch__init(&s->watch);
                s->watch.prefix = give_bytes(q->watch.prefix);
                r->body_case = DLXP__REQUEST__BODY_WATCH;
                r->watch = &s->watch;
                return 0;
        case WIRE_REQ_TRACK:
                if (!bounded(q->track.name, sizeof(q->track.name)))
                        return -EINVAL;
                dlxp__track__init(&s->track);
                s->track.name = give_bytes(q->track.name);
                r->body_case = DLXP__REQUEST__BODY_TRACK;
                r->track = &s->track;
                return 0;
        case WIRE_REQ_UNTRACK:
                dlxp__untrack__init(&s->untrack);
                s->untrack.slot = q->untrack.slot;
                r->body_case = DLXP__REQUEST__BODY_UNTRACK;
                r->untrack = &s->untrack;
                return 0;
        case WIRE_REQ_UNWATCH:
                dlxp__unwatch__init(&s->unwatch);
                s->unwatch.watch = q->unwatch.watch;
                r->body_case = DLXP__REQUEST__BODY_UNWATCH;
                r->unwatch = &s->unwatch;
                return 0;
        case WIRE_REQ_ALLOC:
                dlxp__alloc__init(&s->alloc);
                s->alloc.size = q->alloc.size;
                s->alloc.storage = (Dlxp__Storage)q->alloc.storage;
                r->body_case = DLXP__REQUEST__BODY_ALLOC;
                r->alloc = &s->alloc;
                return 0;
        case WIRE_REQ_FREE:
                dlxp__free__init(&s->free);
                s->free.segment = q->free.segment;
                r->body_case = DLXP__REQUEST__BODY_FREE;
                r->free = &s->free;
                return 0;
        case WIRE_REQ_FORGET:
                if (q->forget.count == 0 || q->forget.count > DLX_FORGET_MAX)
                        return -EINVAL;
                dlxp__forget__init(&s->forget);
                s->forget.n_segments = q->forget.count;
                s->forget.segments = (uint64_t *)q->forget.segments;
                r->body_case = DLXP__REQUEST__BODY_FORGET;
                r->forget = &s->forget;
                return 0;
        case WIRE_REQ_STATS:
                dlxp__stats__init(&s->stats);
                r->body_case = DLXP__REQUEST__BODY_STATS;
                r->stats = &s->stats;
                return 0;
        case WIRE_REQ_PING:
                dlxp__ping__init(&s->ping);
                s->ping.nonce = q->ping.nonce;
                r->body_case = DLXP__REQUEST__BODY_PING;
                r->ping = &s->ping;
                return 0;
        case WIRE_REQ_BYE:
                dlxp__bye__init(&s->bye);
                r->body_case = DLXP__REQUEST__BODY_BYE;
                r->bye = &s->bye;
                return 0;
        case WIRE_REQ_MOUNT:
                if (!bounded(q->mount.prefix, sizeof(q->mount.prefix)))
                        return -EINVAL;
                dlxp__mount__init(&s->mount);
                s->mount.prefix = give_bytes(q->mount.prefix);
                r->body_case = DLXP__REQUEST__BODY_MOUNT;
                r->mount = &s->mount;
                return 0;
        case WIRE_REQ_FETCH_FAILED:
                if (!bounded(q->fetch_failed.name, sizeof(q->fetch_failed.name)) ||
                    !bounded(q->fetch_failed.error, sizeof(q->fetch_failed.error)))
                        return -EINVAL;
                dlxp__fetch_failed__init(&s->fetch_failed);
                s->fetch_failed.name = give_bytes(q->fetch_failed.name);
                s->fetch_failed.min_version = q->fetch_failed.min_version;
                s->fetch_failed.status = (Dlxp__Status)q->fetch_failed.status;
                s->fetch_failed.error = (char *)q->fetch_failed.error;
                r->body_case = DLXP__REQUEST__BODY_FETCH_FAILED;
                r->fetch_failed = &s->fetch_failed;
                return 0;
        case WIRE_REQ_METRICS:
                dlxp__metrics__init(&s->metrics);
                r->body_case = DLXP__REQUEST__BODY_METRICS;
                r->metrics = &s->metrics;
                return 0;
        case WIRE_REQ_NONE:
        case WIRE_REQ_COUNT:
                break;
        }
        return -EINVAL;
}

int wire_request_size(const struct wire_request *req, size_t *ret_size)
{
        struct request_pb s;
        int err = request_to_pb(req, &s);

        if (err < 0)
                return err;
        *ret_size = dlxp__request__get_packed_size(&s.r);
        return 0;
}

size_t wire_request_pack(const struct wire_request *req, uint8_t *buf)
{
        struct request_pb s;

        if (request_to_pb(req, &s) < 0)
                return 0;
        return dlxp__request__pack(&s.r, buf);
}

static int request_from_pb(const Dlxp__Request *r, struct wire_request *q, char *why, size_t whysz)
{
        const char *reason = NULL;

        switch (r->body_case) {
        case DLXP__REQUEST__BODY_HELLO:
                q->type = WIRE_REQ_HELLO;
                q->hello.major = r->hello->major;
                q->hello.minor = r->hello->minor;
                q->hello.pid = r->hello->pid;
                if (take_bytes(q->hello.client_name, sizeof(q->hello.client_name),
                               r->hello->client_name) < 0 ||
                    layout_prefix_check(q->hello.client_name, strlen(q->hello.client_name),
                                        &reason) < 0)
                        return fail(why, whysz, -EINVAL,
                                    "client name must be printable and at most %d bytes",
                                    DLX_CLIENT_NAME_MAX);
                return 0;
        case DLXP__REQUEST__BODY_PUBLISH: {
                int e;
                q->type = WIRE_REQ_PUBLISH;
                if (!r->publish->tensor)
                        return fail(why, whysz, -EINVAL, "publish without a tensor");
                e = tensor_from_pb(r->publish->tensor, &q->publish.tensor, why, whysz);
                if (e < 0)
                        return e;
                q->publish.persist = r->publish->persist;
                q->publish.token = r->publish->token;
                q->publish.hold = r->publish->hold;
                q->publish.segment_size = r->publish->segment_size;
                q->publish.origin_version = r->publish->origin_version;
                if (take_text(q->publish.origin, sizeof(q->publish.origin), r->publish->origin) < 0)
                        return fail(why, whysz, -EINVAL,
                                    "an origin must be printable and at most %d bytes",
                                    DLX_ORIGIN_MAX);
                return tensor_valid(&q->publish.tensor, why, whysz);
        }
        case DLXP__REQUEST__BODY_ACQUIRE:
                q->type = WIRE_REQ_ACQUIRE;
                q->acquire.min_version = r->acquire->min_version;
                q->acquire.timeout_ms = r->acquire->timeout_ms;
                q->acquire.group = r->acquire->group;
                if (take_bytes(q->acquire.name, sizeof(q->acquire.name), r->acquire->name) < 0)
                        return fail(why, whysz, -EINVAL, "name too long or contains NUL");
                if (layout_name_check(q->acquire.name, strlen(q->acquire.name), &reason) < 0)
                        return fail(why, whysz, -EINVAL, "bad name: %s", reason);
                return 0;
        case DLXP__REQUEST__BODY_RELEASE:
                q->type = WIRE_REQ_RELEASE;
                q->release.lease = r->release->lease;
                if (take_handle(q->release.event, &q->release.has_event, r->release->event) < 0)
                        return fail(why, whysz, -EINVAL, "a CUDA event handle must be %d bytes",
                                    DLX_CUDA_HANDLE);
                return 0;
        case DLXP__REQUEST__BODY_UNPUBLISH:
                q->type = WIRE_REQ_UNPUBLISH;
                if (take_bytes(q->unpublish.name, sizeof(q->unpublish.name), r->unpublish->name) <
                    0)
                        return fail(why, whysz, -EINVAL, "name too long or contains NUL");
                if (layout_name_check(q->unpublish.name, strlen(q->unpublish.name), &reason) < 0)
                        return fail(why, whysz, -EINVAL, "bad name: %s", reason);
                return 0;
        case DLXP__REQUEST__BODY_LIST:
                q->type = WIRE_REQ_LIST;
                q->list.limit = r->list->limit;
                if (take_bytes(q->list.prefix, sizeof(q->list.prefix), r->list->prefix) < 0 ||
                    take_bytes(q->list.after, sizeof(q->list.after), r->list->after) < 0)
                        return fail(why, whysz, -EINVAL, "prefix too long or contains NUL");
                if (layout_prefix_check(q->list.prefix, strlen(q->list.prefix), &reason) < 0 ||
                    layout_prefix_check(q->list.after, strlen(q->list.after), &reason) < 0)
                        return fail(why, whysz, -EINVAL, "bad prefix: %s", reason);
                return 0;
        case DLXP__REQUEST__BODY_STAT:
                q->type = WIRE_REQ_STAT;
                if (take_bytes(q->stat.name, sizeof(q->stat.name), r->stat->name) < 0)
                        return fail(why, whysz, -EINVAL, "name too long or contains NUL");
                if (layout_name_check(q->stat.name, strlen(q->stat.name), &reason) < 0)
                        return fail(why, whysz, -EINVAL, "bad name: %s", reason);
                return 0;
        case DLXP__REQUEST__BODY_WATCH:
                q->type = WIRE_REQ_WATCH;
                if (take_bytes(q->watch.prefix, sizeof(q->watch.prefix), r->watch->prefix) < 0)
                        return fail(why, whysz, -EINVAL, "prefix too long or contains NUL");
                if (layout_prefix_check(q->watch.prefix, strlen(q->watch.prefix), &reason) < 0)
                        return fail(why, whysz, -EINVAL, "bad prefix: %s", reason);
                return 0;
        case DLXP__REQUEST__BODY_TRACK:
                q->type = WIRE_REQ_TRACK;
                if (take_bytes(q->track.name, sizeof(q->track.name), r->track->name) < 0)
                        return fail(why, whysz, -EINVAL, "name too long or contains NUL");
                if (layout_name_check(q->track.name, strlen(q->track.name), &reason) < 0)
                        return fail(why, whysz, -EINVAL, "bad name: %s", reason);
                return 0;
        case DLXP__REQUEST__BODY_UNTRACK:
                q->type = WIRE_REQ_UNTRACK;
                q->untrack.slot = r->untrack->slot;
                return 0;
        case DLXP__REQUEST__BODY_UNWATCH:
                q->type = WIRE_REQ_UNWATCH;
                q->unwatch.watch = r->unwatch->watch;
                return 0;
        case DLXP__REQUEST__BODY_ALLOC:
                q->type = WIRE_REQ_ALLOC;
                q->alloc.size = r->alloc->size;
                q->alloc.storage = (uint32_t)r->alloc->storage;
                return 0;
        case DLXP__REQUEST__BODY_FREE:
                q->type = WIRE_REQ_FREE;
                q->free.segment = r->free->segment;
                return 0;
        case DLXP__REQUEST__BODY_FORGET:
                q->type = WIRE_REQ_FORGET;
                if (r->forget->n_segments == 0 || r->forget->n_segments > DLX_FORGET_MAX)
                        return fail(why, whysz, -EINVAL, "a forget names 1 to %d segments, not %zu",
                                    DLX_FORGET_MAX, r->forget->n_segments);
                q->forget.count = (uint32_t)r->forget->n_segments;
                memcpy(q->forget.segments, r->forget->segments,
                       r->forget->n_segments * sizeof(uint64_t));
                return 0;
        case DLXP__REQUEST__BODY_STATS:
                q->type = WIRE_REQ_STATS;
                return 0;
        case DLXP__REQUEST__BODY_METRICS:
                q->type = WIRE_REQ_METRICS;
                return 0;
        case DLXP__REQUEST__BODY_PING:
                q->type = WIRE_REQ_PING;
                q->ping.nonce = r->ping->nonce;
                return 0;
        case DLXP__REQUEST__BODY_BYE:
                q->type = WIRE_REQ_BYE;
                return 0;
        case DLXP__REQUEST__BODY_MOUNT:
                q->type = WIRE_REQ_MOUNT;
                if (take_bytes(q->mount.prefix, sizeof(q->mount.prefix), r->mount->prefix) < 0)
                        return fail(why, whysz, -EINVAL, "prefix too long or contains NUL");
                if (wire_mount_check(q->mount.prefix, &reason) < 0)
                        return fail(why, whysz, -EINVAL, "bad mount prefix: %s", reason);
                return 0;
        case DLXP__REQUEST__BODY_FETCH_FAILED:
                q->type = WIRE_REQ_FETCH_FAILED;
                q->fetch_failed.min_version = r->fetch_failed->min_version;
                q->fetch_failed.status = (int)r->fetch_failed->status;
                if (take_bytes(q->fetch_failed.name, sizeof(q->fetch_failed.name),
                               r->fetch_failed->name) < 0)
                        return fail(why, whysz, -EINVAL, "name too long or contains NUL");
                if (layout_name_check(q->fetch_failed.name, strlen(q->fetch_failed.name), &reason) <
                    0)
                        return fail(why, whysz, -EINVAL, "bad name: %s", reason);
                if (q->fetch_failed.status <= WIRE_OK ||
                    q->fetch_failed.status >= WIRE_STATUS_COUNT)
                        return fail(why, whysz, -EINVAL,
                                    "a fetch fails with an error status, not %d",
                                    q->fetch_failed.status);
                if (take_text(q->fetch_failed.error, sizeof(q->fetch_failed.error),
                              r->fetch_failed->error) < 0)
                        return fail(why, whysz, -EINVAL,
                                    "a fetch's error must be printable and at most %d bytes",
                                    DLX_ERROR_MAX);
                return 0;
        default:
                return fail(why, whysz, -EINVAL, "unknown request type");
        }
}

int wire_request_decode(const uint8_t *buf, size_t len, struct wire_request *ret, char *why,
                        size_t whysz)
{
        struct pb_arena arena;
        Dlxp__Request *r;
        int e;

        pb_arena_init(&arena);
        r = dlxp__request__unpack(&arena.allocator, len, buf);

        ret->id = 0;
        ret->type = WIRE_REQ_NONE;
        if (!r && arena.failed)
                return fail(why, whysz, -ENOMEM, "out of memory decoding a request");
        if (!r)
                return fail(why, whysz, -EPROTO, "undecodable request");
        ret->id = r->id;
        if (r->id == 0)
                e = fail(why, whysz, -EPROTO, "request id 0");
        else
                e = request_from_pb(r, ret, why, whysz);
        if (arena.heap)
                dlxp__request__free_unpacked(r, &arena.allocator);
        return e;
}

/* ---- replies -------------------------------------------------------------------------- */

struct reply_pb {
        Dlxp__Reply r;
        union {
                Dlxp__HelloReply hello;
                Dlxp__PublishReply publish;
                Dlxp__AcquireReply acquire;
                Dlxp__ListReply list;
                Dlxp__StatReply stat;
                Dlxp__WatchReply watch;
                Dlxp__TrackReply track;
                Dlxp__AllocReply alloc;
                Dlxp__SegmentReply segment;
                Dlxp__StatsReply stats;
                Dlxp__Pong pong;
                Dlxp__Event event;
                Dlxp__MetricsReply metrics;
        };
        Dlxp__Info info;
        Dlxp__Limits limits; /* a stats or hello reply's, beside it */
        struct tensor_pb tensor;
        /* RELEASED events: one binary per consumer event, allocated */
        ProtobufCBinaryData *events;
        /* list replies: one of each per entry, allocated */
        Dlxp__Info *infos;
        Dlxp__Info **info_ptrs;
        struct tensor_pb *tensors;
};

static void limits_to_pb(const struct wire_limit_set *l, Dlxp__Limits *pb)
{
        dlxp__limits__init(pb);
        pb->max_clients = l->max_clients;
        pb->max_clients_per_uid = l->max_clients_per_uid;
        pb->max_bytes = l->max_bytes;
        pb->max_bytes_per_uid = l->max_bytes_per_uid;
        pb->max_names = l->max_names;
        pb->max_names_per_uid = l->max_names_per_uid;
        pb->max_leases = l->max_leases;
        pb->max_watches = l->max_watches;
        pb->max_queued = l->max_queued;
        pb->timeout_ms = l->timeout_ms;
        pb->max_fds = l->max_fds;
        pb->max_fds_per_uid = l->max_fds_per_uid;
        pb->max_group_members = l->max_group_members;
        pb->max_group_table = l->max_group_table;
}

/* An older daemon sends none: all zero, "no limit known". */
static void limits_from_pb(const Dlxp__Limits *pb, struct wire_limit_set *l)
{
        memset(l, 0, sizeof(*l));
        if (!pb)
                return;
        l->max_clients = pb->max_clients;
        l->max_clients_per_uid = pb->max_clients_per_uid;
        l->max_bytes = pb->max_bytes;
        l->max_bytes_per_uid = pb->max_bytes_per_uid;
        l->max_names = pb->max_names;
        l->max_names_per_uid = pb->max_names_per_uid;
        l->max_leases = pb->max_leases;
        l->max_watches = pb->max_watches;
        l->max_queued = pb->max_queued;
        l->timeout_ms = pb->timeout_ms;
        l->max_fds = pb->max_fds;
        l->max_fds_per_uid = pb->max_fds_per_uid;
        l->max_group_members = pb->max_group_members;
        l->max_group_table = pb->max_group_table;
}

static void reply_pb_done(struct reply_pb *s)
{
        free(s->events);
        free(s->infos);
        free(s->info_ptrs);
        free(s->tensors);
}

static int reply_to_pb(const struct wire_reply *p, struct reply_pb *s)
{
        Dlxp__Reply *r = &s->r;

        s->events = NULL;
        s->infos = NULL;
        s->info_ptrs = NULL;
        s->tensors = NULL;
        dlxp__reply__init(r);
        r->id = p->id;
        r->status = (Dlxp__Status)p->status;
        if (!bounded(p->error, sizeof(p->error)))
                return -EINVAL;
        r->error = (char *)p->error;
        switch (p->type) {
        case WIRE_REP_NONE:
                return 0;
        case WIRE_REP_HELLO:
                if (!bounded(p->hello.server, sizeof(p->hello.server)))
                        return -EINVAL;
                dlxp__hello_reply__init(&s->hello);
                s->hello.major = p->hello.major;
                s->hello.minor = p->hello.minor;
                s->hello.session = p->hello.session;
                s->hello.server = (char *)p->hello.server;
                s->hello.uid = p->hello.uid;
                s->hello.max_frame = p->hello.max_frame;
                s->hello.max_inflight = p->hello.max_inflight;
                s->hello.release_ring = p->hello.release_ring;
                limits_to_pb(&p->hello.limits, &s->limits);
                s->hello.limits = &s->limits;
                r->body_case = DLXP__REPLY__BODY_HELLO;
                r->hello = &s->hello;
                return 0;
        case WIRE_REP_PUBLISH:
                dlxp__publish_reply__init(&s->publish);
                s->publish.version = p->publish.version;
                s->publish.segment = p->publish.segment;
                r->body_case = DLXP__REPLY__BODY_PUBLISH;
                r->publish = &s->publish;
                return 0;
        case WIRE_REP_ACQUIRE:
                dlxp__acquire_reply__init(&s->acquire);
                if (tensor_to_pb(&p->acquire.tensor, &s->tensor) < 0)
                        return -EINVAL;
                s->acquire.tensor = &s->tensor.t;
                s->acquire.lease = p->acquire.lease;
                s->acquire.segment_size = p->acquire.segment_size;
                s->acquire.writable = p->acquire.writable;
                r->body_case = DLXP__REPLY__BODY_ACQUIRE;
                r->acquire = &s->acquire;
                return 0;
        case WIRE_REP_LIST:
                dlxp__list_reply__init(&s->list);
                if (!bounded(p->list.next, sizeof(p->list.next)) ||
                    p->list.count > DLX_LIST_PAGE_MAX)
                        return -EINVAL;
                if (p->list.count) {
                        s->infos = calloc(p->list.count, sizeof(*s->infos));
                        s->info_ptrs = calloc(p->list.count, sizeof(*s->info_ptrs));
                        s->tensors = calloc(p->list.count, sizeof(*s->tensors));
                        if (!s->infos || !s->info_ptrs || !s->tensors)
                                return -ENOMEM;
                }
                for (uint32_t i = 0; i < p->list.count; i++) {
                        if (info_to_pb(&p->list.entries[i], &s->infos[i], &s->tensors[i]) < 0)
                                return -EINVAL;
                        s->info_ptrs[i] = &s->infos[i];
                }
                s->list.n_entries = p->list.count;
                s->list.entries = s->info_ptrs;
                s->list.next = give_bytes(p->list.next);
                r->body_case = DLXP__REPLY__BODY_LIST;
                r->list = &s->list;
                return 0;
        case WIRE_REP_STAT:
                dlxp__stat_reply__init(&s->stat);
                if (info_to_pb(&p->stat.info, &s->info, &s->tensor) < 0)
                        return -EINVAL;
                s->stat.info = &s->info;
                r->body_case = DLXP__REPLY__BODY_STAT;
                r->stat = &s->stat;
                return 0;
        case WIRE_REP_WATCH:
                dlxp__watch_reply__init(&s->watch);
                s->watch.watch = p->watch.watch;
                r->body_case = DLXP__REPLY__BODY_WATCH;
                r->watch = &s->watch;
                return 0;
        case WIRE_REP_TRACK:
                dlxp__track_reply__init(&s->track);
                s->track.slot = p->track.slot;
                s->track.version = p->track.version;
                s->track.slots = p->track.slots;
                s->track.page = p->track.page;
                r->body_case = DLXP__REPLY__BODY_TRACK;
                r->track = &s->track;
                return 0;
        case WIRE_REP_ALLOC:
                dlxp__alloc_reply__init(&s->alloc);
                s->alloc.segment = p->alloc.segment;
                s->alloc.size = p->alloc.size;
                r->body_case = DLXP__REPLY__BODY_ALLOC;
                r->alloc = &s->alloc;
                return 0;
        case WIRE_REP_SEGMENT:
                dlxp__segment_reply__init(&s->segment);
                s->segment.segment = p->segment.segment;
                s->segment.size = p->segment.size;
                r->body_case = DLXP__REPLY__BODY_SEGMENT;
                r->segment = &s->segment;
                return 0;
        case WIRE_REP_STATS:
                dlxp__stats_reply__init(&s->stats);
                s->stats.names = p->stats.names;
                s->stats.versions = p->stats.versions;
                s->stats.leases = p->stats.leases;
                s->stats.segments = p->stats.segments;
                s->stats.bytes = p->stats.bytes;
                s->stats.max_bytes = p->stats.max_bytes;
                s->stats.clients = p->stats.clients;
                s->stats.max_clients = p->stats.max_clients;
                s->stats.watchers = p->stats.watchers;
                s->stats.uptime_ms = p->stats.uptime_ms;
                s->stats.requests = p->stats.requests;
                s->stats.publishes = p->stats.publishes;
                s->stats.acquires = p->stats.acquires;
                limits_to_pb(&p->stats.limits, &s->limits);
                s->stats.limits = &s->limits;
                s->stats.uid = p->stats.uid;
                s->stats.uid_clients = p->stats.uid_clients;
                s->stats.uid_bytes = p->stats.uid_bytes;
                s->stats.uid_names = p->stats.uid_names;
                s->stats.fds = p->stats.fds;
                s->stats.uid_fds = p->stats.uid_fds;
                s->stats.queued = p->stats.queued;
                s->stats.uid_queued = p->stats.uid_queued;
                r->body_case = DLXP__REPLY__BODY_STATS;
                r->stats = &s->stats;
                return 0;
        case WIRE_REP_METRICS:
                dlxp__metrics_reply__init(&s->metrics);
                s->metrics.text.data = (uint8_t *)p->metrics.text;
                s->metrics.text.len = p->metrics.len;
                r->body_case = DLXP__REPLY__BODY_METRICS;
                r->metrics = &s->metrics;
                return 0;
        case WIRE_REP_PONG:
                dlxp__pong__init(&s->pong);
                s->pong.nonce = p->pong.nonce;
                r->body_case = DLXP__REPLY__BODY_PONG;
                r->pong = &s->pong;
                return 0;
        case WIRE_REP_EVENT:
                if (!bounded(p->event.name, sizeof(p->event.name)))
                        return -EINVAL;
                dlxp__event__init(&s->event);
                s->event.kind = (Dlxp__Event__Kind)p->event.kind;
                s->event.watch = p->event.watch;
                s->event.name = give_bytes(p->event.name);
                s->event.version = p->event.version;
                s->event.token = p->event.token;
                s->event.segment = p->event.segment;
                if (p->event.nevents > DLX_MAX_RELEASE_EVENTS)
                        return -EINVAL;
                if (p->event.nevents) {
                        s->events = calloc(p->event.nevents, sizeof(*s->events));
                        if (!s->events)
                                return -ENOMEM;
                        for (uint32_t i = 0; i < p->event.nevents; i++)
                                s->events[i] = give_handle(p->event.events[i], true);
                        s->event.n_events = p->event.nevents;
                        s->event.events = s->events;
                }
                r->body_case = DLXP__REPLY__BODY_EVENT;
                r->event = &s->event;
                return 0;
        }
        return -EINVAL;
}

int wire_reply_size(const struct wire_reply *rep, size_t *ret_size)
{
        struct reply_pb s;
        int err = reply_to_pb(rep, &s);

        if (err == 0)
                *ret_size = dlxp__reply__get_packed_size(&s.r);
        reply_pb_done(&s);
        return err;
}

size_t wire_reply_pack(const struct wire_reply *rep, uint8_t *buf)
{
        struct reply_pb s;
        size_t n = 0;

        if (reply_to_pb(rep, &s) == 0)
                n = dlxp__reply__pack(&s.r, buf);
        reply_pb_done(&s);
        return n;
}

int wire_reply_encode(const struct wire_reply *rep, uint8_t *buf, size_t cap, size_t *ret_size)
{
        struct reply_pb s;
        int err = reply_to_pb(rep, &s);

        if (err == 0) {
                *ret_size = dlxp__reply__get_packed_size(&s.r);
                if (*ret_size > cap)
                        err = -ENOBUFS;
                else
                        dlxp__reply__pack(&s.r, buf);
        }
        reply_pb_done(&s);
        return err;
}

static int reply_from_pb(const Dlxp__Reply *r, struct wire_reply *p, char *why, size_t whysz)
{
        int e;

        switch (r->body_case) {
        case DLXP__REPLY__BODY__NOT_SET:
                p->type = WIRE_REP_NONE;
                return 0;
        case DLXP__REPLY__BODY_HELLO:
                p->type = WIRE_REP_HELLO;
                p->hello.major = r->hello->major;
                p->hello.minor = r->hello->minor;
                p->hello.session = r->hello->session;
                snprintf(p->hello.server, sizeof(p->hello.server), "%s",
                         r->hello->server ? r->hello->server : "");
                p->hello.uid = r->hello->uid;
                p->hello.max_frame = r->hello->max_frame;
                p->hello.max_inflight = r->hello->max_inflight;
                p->hello.release_ring = r->hello->release_ring;
                limits_from_pb(r->hello->limits, &p->hello.limits);
                return 0;
        case DLXP__REPLY__BODY_PUBLISH:
                p->type = WIRE_REP_PUBLISH;
                p->publish.version = r->publish->version;
                p->publish.segment = r->publish->segment;
                return 0;
        case DLXP__REPLY__BODY_ACQUIRE:
                p->type = WIRE_REP_ACQUIRE;
                if (!r->acquire->tensor)
                        return fail(why, whysz, -EINVAL, "acquire reply without tensor");
                e = tensor_from_pb(r->acquire->tensor, &p->acquire.tensor, why, whysz);
                if (e < 0)
                        return e;
                p->acquire.lease = r->acquire->lease;
                p->acquire.segment_size = r->acquire->segment_size;
                p->acquire.writable = r->acquire->writable;
                return tensor_valid(&p->acquire.tensor, why, whysz);
        case DLXP__REPLY__BODY_LIST:
                p->type = WIRE_REP_LIST;
                if (r->list->n_entries > DLX_LIST_PAGE_MAX)
                        return fail(why, whysz, -EINVAL, "list page too large");
                if (take_bytes(p->list.next, sizeof(p->list.next), r->list->next) < 0)
                        return fail(why, whysz, -EINVAL, "bad list cursor");
                if (r->list->n_entries) {
                        p->list.entries = calloc(r->list->n_entries, sizeof(struct wire_info));
                        if (!p->list.entries)
                                return fail(why, whysz, -ENOMEM, "out of memory");
                }
                for (size_t i = 0; i < r->list->n_entries; i++) {
                        e = info_from_pb(r->list->entries[i], &p->list.entries[i], why, whysz);
                        if (e < 0)
                                return e;
                        p->list.count++;
                }
                return 0;
        case DLXP__REPLY__BODY_STAT:
                p->type = WIRE_REP_STAT;
                if (!r->stat->info)
                        return fail(why, whysz, -EINVAL, "stat reply without info");
                return info_from_pb(r->stat->info, &p->stat.info, why, whysz);
        case DLXP__REPLY__BODY_WATCH:
                p->type = WIRE_REP_WATCH;
                p->watch.watch = r->watch->watch;
                return 0;
        case DLXP__REPLY__BODY_TRACK:
                p->type = WIRE_REP_TRACK;
                p->track.slot = r->track->slot;
                p->track.version = r->track->version;
                p->track.slots = r->track->slots;
                p->track.page = r->track->page;
                return 0;
        case DLXP__REPLY__BODY_ALLOC:
                p->type = WIRE_REP_ALLOC;
                p->alloc.segment = r->alloc->segment;
                p->alloc.size = r->alloc->size;
                return 0;
        case DLXP__REPLY__BODY_SEGMENT:
                p->type = WIRE_REP_SEGMENT;
                p->segment.segment = r->segment->segment;
                p->segment.size = r->segment->size;
                return 0;
        case DLXP__REPLY__BODY_STATS:
                p->type = WIRE_REP_STATS;
                p->stats.names = r->stats->names;
                p->stats.versions = r->stats->versions;
                p->stats.leases = r->stats->leases;
                p->stats.segments = r->stats->segments;
                p->stats.bytes = r->stats->bytes;
                p->stats.max_bytes = r->stats->max_bytes;
                p->stats.clients = r->stats->clients;
                p->stats.max_clients = r->stats->max_clients;
                p->stats.watchers = r->stats->watchers;
                p->stats.uptime_ms = r->stats->uptime_ms;
                p->stats.requests = r->stats->requests;
                p->stats.publishes = r->stats->publishes;
                p->stats.acquires = r->stats->acquires;
                limits_from_pb(r->stats->limits, &p->stats.limits);
                p->stats.uid = r->stats->uid;
                p->stats.uid_clients = r->stats->uid_clients;
                p->stats.uid_bytes = r->stats->uid_bytes;
                p->stats.uid_names = r->stats->uid_names;
                p->stats.fds = r->stats->fds;
                p->stats.uid_fds = r->stats->uid_fds;
                p->stats.queued = r->stats->queued;
                p->stats.uid_queued = r->stats->uid_queued;
                return 0;
        case DLXP__REPLY__BODY_METRICS:
                p->type = WIRE_REP_METRICS;
                if (r->metrics->text.len >= DLX_MAX_FRAME)
                        return fail(why, whysz, -EPROTO, "metrics of %zu bytes",
                                    r->metrics->text.len);
                p->metrics.text = malloc(r->metrics->text.len + 1);
                if (!p->metrics.text)
                        return fail(why, whysz, -ENOMEM, "out of memory");
                if (r->metrics->text.len)
                        memcpy(p->metrics.text, r->metrics->text.data, r->metrics->text.len);
                p->metrics.text[r->metrics->text.len] = '\0';
                p->metrics.len = (uint32_t)r->metrics->text.len;
                return 0;
        case DLXP__REPLY__BODY_PONG:
                p->type = WIRE_REP_PONG;
                p->pong.nonce = r->pong->nonce;
                return 0;
        case DLXP__REPLY__BODY_EVENT:
                p->type = WIRE_REP_EVENT;
                p->event.kind = (enum wire_event_kind)r->event->kind;
                p->event.watch = r->event->watch;
                p->event.version = r->event->version;
                p->event.token = r->event->token;
                p->event.segment = r->event->segment;
                p->event.events = NULL;
                p->event.nevents = 0;
                if (take_bytes(p->event.name, sizeof(p->event.name), r->event->name) < 0)
                        return fail(why, whysz, -EINVAL, "bad event name");
                /* a name, when there is one (a SEGMENT_GONE has none), is a valid one */
                if (p->event.name[0]) {
                        const char *reason = NULL;
                        if (layout_name_check(p->event.name, strlen(p->event.name), &reason) < 0)
                                return fail(why, whysz, -EINVAL, "bad event name: %s", reason);
                }
                if (r->event->n_events > DLX_MAX_RELEASE_EVENTS)
                        return fail(why, whysz, -EINVAL, "too many release events");
                if (r->event->n_events) {
                        p->event.events = calloc(r->event->n_events, DLX_CUDA_HANDLE);
                        if (!p->event.events)
                                return fail(why, whysz, -ENOMEM, "out of memory");
                }
                for (size_t i = 0; i < r->event->n_events; i++) {
                        bool has;
                        if (take_handle(p->event.events[i], &has, r->event->events[i]) < 0 || !has)
                                return fail(why, whysz, -EINVAL,
                                            "a CUDA event handle must be %d bytes",
                                            DLX_CUDA_HANDLE);
                        p->event.nevents++;
                }
                return 0;
        default:
                return fail(why, whysz, -EINVAL, "unknown reply type");
        }
}

int wire_reply_decode(const uint8_t *buf, size_t len, struct wire_reply *ret, char *why,
                      size_t whysz)
{
        struct pb_arena arena;
        Dlxp__Reply *r;
        int e;

        pb_arena_init(&arena);
        r = dlxp__reply__unpack(&arena.allocator, len, buf);

        ret->id = 0;
        ret->status = WIRE_OK;
        ret->error[0] = '\0';
        ret->type = WIRE_REP_NONE;
        ret->list.entries = NULL;
        ret->list.count = 0;
        if (!r && arena.failed)
                return fail(why, whysz, -ENOMEM, "out of memory decoding a reply");
        if (!r)
                return fail(why, whysz, -EPROTO, "undecodable reply");
        ret->id = r->id;
        ret->status = (int)r->status;
        wire_strcpy(ret->error, sizeof(ret->error), r->error ? r->error : "");
        e = reply_from_pb(r, ret, why, whysz);
        if (arena.heap)
                dlxp__reply__free_unpacked(r, &arena.allocator);
        if (e < 0)
                wire_reply_done(ret);
        return e;
}

void wire_reply_done(struct wire_reply *rep)
{
        if (rep->type == WIRE_REP_LIST) {
                free(rep->list.entries);
                rep->list.entries = NULL;
                rep->list.count = 0;
        } else if (rep->type == WIRE_REP_EVENT) {
                free(rep->event.events);
                rep->event.events = NULL;
                rep->event.nevents = 0;
        } else if (rep->type == WIRE_REP_METRICS) {
                free(rep->metrics.text);
                rep->metrics.text = NULL;
                rep->metrics.len = 0;
        }
}
