/* SPDX-License-Identifier: MIT */
/*
 * Tests for proto/wire.c: every request and reply through encode and decode,
 * the status <-> errno table, and what decode must refuse. Hostile payloads
 * are built with the generated protobuf-c structs, since the codec itself
 * refuses to encode them; a deterministic fuzz loop feeds mutated payloads
 * to both decoders.
 */
#include "wire.h"

#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlx.pb-c.h"
#include "pbwrite.h"
#include "toolkit.h"

/* ---- builders and comparisons ------------------------------------------------------------- */

static void make_tensor(struct wire_tensor *t, const char *name, int32_t ndim)
{
        memset(t, 0, sizeof(*t));
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->version = UINT64_C(0x0102030405060708);
        t->dtype.code = kDLFloat;
        t->dtype.bits = 32;
        t->dtype.lanes = 2;
        t->ndim = ndim;
        for (int32_t i = 0; i < ndim; i++) {
                t->shape[i] = i == 0 ? INT64_C(1) << 40 : i + 1;
                t->strides[i] = (i % 3 == 1) ? -(int64_t)(i * 1000) : (int64_t)i * 7 + 1;
        }
        t->byte_offset = UINT64_MAX - 1;
        t->device_type = kDLCPU;
        t->device_id = -3;
        t->flags = DLPACK_FLAG_BITMASK_READ_ONLY | (UINT64_C(1) << 63);
        t->storage = WIRE_STORAGE_MEMFD;
        t->segment = UINT64_MAX;
        t->offset = 4096;
        t->length = UINT64_C(1) << 40;
        t->has_device_uuid = true;
        for (int i = 0; i < DLX_CUDA_UUID; i++)
                t->device_uuid[i] = (uint8_t)(0xf0 + i);
        t->pid_namespace = UINT64_MAX - 5;
        t->event_session = UINT64_MAX - 9;
        t->members = UINT32_MAX - 3;
        t->table_segment = UINT64_MAX - 7;
}

static void expect_tensor_eq(const struct wire_tensor *a, const struct wire_tensor *b)
{
        ck_assert_str_eq(a->name, b->name);
        ck_assert_uint_eq(a->version, b->version);
        ck_assert_uint_eq(a->dtype.code, b->dtype.code);
        ck_assert_uint_eq(a->dtype.bits, b->dtype.bits);
        ck_assert_uint_eq(a->dtype.lanes, b->dtype.lanes);
        ck_assert_int_eq(a->ndim, b->ndim);
        for (int32_t i = 0; i < a->ndim; i++) {
                ck_assert_int_eq(a->shape[i], b->shape[i]);
                ck_assert_int_eq(a->strides[i], b->strides[i]);
        }
        ck_assert_uint_eq(a->byte_offset, b->byte_offset);
        ck_assert_int_eq(a->device_type, b->device_type);
        ck_assert_int_eq(a->device_id, b->device_id);
        ck_assert_uint_eq(a->flags, b->flags);
        ck_assert_uint_eq(a->storage, b->storage);
        ck_assert_uint_eq(a->segment, b->segment);
        ck_assert_uint_eq(a->offset, b->offset);
        ck_assert_uint_eq(a->length, b->length);
        ck_assert_int_eq(a->has_ipc_handle, b->has_ipc_handle);
        ck_assert_int_eq(a->has_event, b->has_event);
        ck_assert_int_eq(a->has_device_uuid, b->has_device_uuid);
        ck_assert(!a->has_ipc_handle || !memcmp(a->ipc_handle, b->ipc_handle, DLX_CUDA_HANDLE));
        ck_assert(!a->has_event || !memcmp(a->event, b->event, DLX_CUDA_HANDLE));
        ck_assert(!a->has_device_uuid || !memcmp(a->device_uuid, b->device_uuid, DLX_CUDA_UUID));
        ck_assert_uint_eq(a->pid_namespace, b->pid_namespace);
        ck_assert_uint_eq(a->event_session, b->event_session);
        ck_assert_uint_eq(a->members, b->members);
        ck_assert_uint_eq(a->table_segment, b->table_segment);
}

static void make_info(struct wire_info *info, const char *name, int32_t ndim, uint32_t salt)
{
        memset(info, 0, sizeof(*info));
        make_tensor(&info->tensor, name, ndim);
        info->tensor.version = salt;
        info->owner_uid = 1000 + salt;
        info->producer_pid = (int32_t)(4000 + salt);
        info->persist = salt & 1;
        info->leases = 7 * salt;
        info->segment_size = (UINT64_C(1) << 33) + salt;
        info->published_ns = UINT64_C(1700000000000000000) + salt;
        info->live_versions = 2 + salt;
        snprintf(info->producer_name, sizeof(info->producer_name), "producer-%u", salt);
}

static void expect_info_eq(const struct wire_info *a, const struct wire_info *b)
{
        expect_tensor_eq(&a->tensor, &b->tensor);
        ck_assert_uint_eq(a->owner_uid, b->owner_uid);
        ck_assert_int_eq(a->producer_pid, b->producer_pid);
        ck_assert_int_eq(a->persist, b->persist);
        ck_assert_uint_eq(a->leases, b->leases);
        ck_assert_uint_eq(a->segment_size, b->segment_size);
        ck_assert_uint_eq(a->published_ns, b->published_ns);
        ck_assert_uint_eq(a->live_versions, b->live_versions);
        ck_assert_str_eq(a->producer_name, b->producer_name);
}

/* Encodes with the codec; the caller frees. */
static uint8_t *encode_request(const struct wire_request *q, size_t *ret_len)
{
        size_t n = 0;

        ck_assert_int_eq(wire_request_size(q, &n), 0);
        uint8_t *buf = malloc(n ? n : 1);
        ck_assert_ptr_nonnull(buf);
        ck_assert_uint_eq(wire_request_pack(q, buf), n);
        *ret_len = n;
        return buf;
}

static uint8_t *encode_reply(const struct wire_reply *p, size_t *ret_len)
{
        size_t n = 0;

        ck_assert_int_eq(wire_reply_size(p, &n), 0);
        uint8_t *buf = malloc(n ? n : 1);
        ck_assert_ptr_nonnull(buf);
        ck_assert_uint_eq(wire_reply_pack(p, buf), n);
        *ret_len = n;
        return buf;
}

static void request_roundtrip(const struct wire_request *q, struct wire_request *out,
                              const char *what)
{
        char err[128] = "";
        size_t n;
        uint8_t *buf = encode_request(q, &n);

        memset(out, 0x5a, sizeof(*out));
        ck_assert_msg(wire_request_decode(buf, n, out, err, sizeof(err)) == 0, "%s: decode: %s",
                      what, err);
        ck_assert_uint_eq(out->id, q->id);
        ck_assert_int_eq(out->type, q->type);
        free(buf);
}

static void reply_roundtrip(const struct wire_reply *p, struct wire_reply *out, const char *what)
{
        char err[128] = "";
        size_t n;
        uint8_t *buf = encode_reply(p, &n);

        memset(out, 0x5a, sizeof(*out));
        ck_assert_msg(wire_reply_decode(buf, n, out, err, sizeof(err)) == 0, "%s: decode: %s", what,
                      err);
        ck_assert_uint_eq(out->id, p->id);
        ck_assert_int_eq(out->status, p->status);
        ck_assert_str_eq(out->error, p->error);
        ck_assert_int_eq(out->type, p->type);
        free(buf);
}

/*
 * Decodes a hand-built request (reply when reply) into out; checks that the
 * reason is written on failure.
 */
static int decode_pb(const ProtobufCMessage *m, bool reply, void *out)
{
        size_t n = protobuf_c_message_get_packed_size(m);
        uint8_t *buf = malloc(n ? n : 1);
        char err[128] = "";
        int rc;

        ck_assert_ptr_nonnull(buf);
        ck_assert_uint_eq(protobuf_c_message_pack(m, buf), n);
        rc = reply ? wire_reply_decode(buf, n, out, err, sizeof(err))
                   : wire_request_decode(buf, n, out, err, sizeof(err));
        if (rc < 0)
                ck_assert_msg(err[0] != '\0', "no reason given for %d", rc);
        free(buf);
        return rc;
}

static int decode_pb_request(const Dlxp__Request *r, struct wire_request *out)
{
        return decode_pb(&r->base, false, out);
}

static int decode_pb_reply(const Dlxp__Reply *r, struct wire_reply *out)
{
        return decode_pb(&r->base, true, out);
}

static ProtobufCBinaryData bin(const void *data, size_t len)
{
        ProtobufCBinaryData b = {.len = len, .data = (uint8_t *)data};
        return b;
}

static ProtobufCBinaryData str(const char *s)
{
        return bin(s, strlen(s));
}

/* A valid protobuf tensor to spoil one field at a time. */
struct pb_tensor {
        Dlxp__Tensor t;
        Dlxp__DType dtype;
        Dlxp__Device device;
        int64_t shape[DLX_MAX_NDIM + 2];
        int64_t strides[DLX_MAX_NDIM + 2];
};

static void pb_tensor_init(struct pb_tensor *p, const char *name, size_t ndim)
{
        dlxp__tensor__init(&p->t);
        dlxp__dtype__init(&p->dtype);
        dlxp__device__init(&p->device);
        p->dtype.code = kDLFloat;
        p->dtype.bits = 32;
        p->dtype.lanes = 1;
        p->device.type = kDLCPU;
        for (size_t i = 0; i < N_ELEMS(p->shape); i++) {
                p->shape[i] = 1;
                p->strides[i] = 1;
        }
        p->t.name = str(name);
        p->t.dtype = &p->dtype;
        p->t.device = &p->device;
        p->t.n_shape = ndim;
        p->t.shape = p->shape;
        p->t.n_strides = ndim;
        p->t.strides = p->strides;
        p->t.storage = DLXP__STORAGE__STORAGE_MEMFD;
}

/*
 * Sets m, a message of d (a Request or a Reply), to one of this id whose body
 * (its field name in dlx.proto: "acquire") is msg.
 */
static void pb_body(const ProtobufCMessageDescriptor *d, void *m, uint64_t id, const char *body,
                    void *msg)
{
        const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field_by_name(d, body);
        const ProtobufCFieldDescriptor *idf =
                protobuf_c_message_descriptor_get_field_by_name(d, "id");

        ck_assert_ptr_nonnull(f);
        ck_assert_ptr_nonnull(idf);
        protobuf_c_message_init(d, m);
        *(uint64_t *)((char *)m + idf->offset) = id;
        /* a oneof member's quantifier is the case, and protobuf-c's cases are the field numbers */
        *(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
        *(void **)((char *)m + f->offset) = msg;
}

static void pb_request_body(Dlxp__Request *r, uint64_t id, const char *body, void *msg)
{
        pb_body(&dlxp__request__descriptor, r, id, body, msg);
}

static void pb_reply_body(Dlxp__Reply *r, uint64_t id, const char *body, void *msg)
{
        pb_body(&dlxp__reply__descriptor, r, id, body, msg);
}

/* A publish request around a protobuf tensor. */
struct pb_publish {
        Dlxp__Request r;
        Dlxp__Publish publish;
        struct pb_tensor tensor;
};

static void pb_publish_init(struct pb_publish *p, uint64_t id, const char *name, size_t ndim)
{
        dlxp__publish__init(&p->publish);
        pb_tensor_init(&p->tensor, name, ndim);
        p->publish.tensor = &p->tensor.t;
        pb_request_body(&p->r, id, "publish", &p->publish);
}

/* ---- requests: round trips ---------------------------------------------------------------- */

/* A string field of a message filled to len bytes of c (off 0: none). */
struct longest {
        size_t off, len;
        char c;
};
#define LONGEST(type, field, n, ch)                                                                \
        {                                                                                          \
                offsetof(type, field), (n), (ch)                                                   \
        }

static void fill_longest(void *msg, struct longest l)
{
        if (!l.off)
                return;
        memset((char *)msg + l.off, l.c, l.len);
        ((char *)msg)[l.off + l.len] = '\0';
}

/* Every field a request of its type carries, compared. */
static void expect_request_eq(const struct wire_request *a, const struct wire_request *b)
{
        ck_assert_uint_eq(a->id, b->id);
        ck_assert_int_eq(a->type, b->type);
        switch (b->type) {
        case WIRE_REQ_HELLO:
                ck_assert_uint_eq(a->hello.major, b->hello.major);
                ck_assert_uint_eq(a->hello.minor, b->hello.minor);
                ck_assert_int_eq(a->hello.pid, b->hello.pid);
                ck_assert_str_eq(a->hello.client_name, b->hello.client_name);
                break;
        case WIRE_REQ_PUBLISH:
                expect_tensor_eq(&a->publish.tensor, &b->publish.tensor);
                ck_assert_int_eq(a->publish.persist, b->publish.persist);
                ck_assert_uint_eq(a->publish.token, b->publish.token);
                ck_assert_uint_eq(a->publish.origin_version, b->publish.origin_version);
                ck_assert_str_eq(a->publish.origin, b->publish.origin);
                break;
        case WIRE_REQ_MOUNT:
                ck_assert_str_eq(a->mount.prefix, b->mount.prefix);
                break;
        case WIRE_REQ_FETCH_FAILED:
                ck_assert_str_eq(a->fetch_failed.name, b->fetch_failed.name);
                ck_assert_uint_eq(a->fetch_failed.min_version, b->fetch_failed.min_version);
                ck_assert_int_eq(a->fetch_failed.status, b->fetch_failed.status);
                ck_assert_str_eq(a->fetch_failed.error, b->fetch_failed.error);
                break;
        case WIRE_REQ_ACQUIRE:
                ck_assert_str_eq(a->acquire.name, b->acquire.name);
                ck_assert_uint_eq(a->acquire.min_version, b->acquire.min_version);
                ck_assert_int_eq(a->acquire.timeout_ms, b->acquire.timeout_ms);
                ck_assert_int_eq(a->acquire.group, b->acquire.group);
                break;
        case WIRE_REQ_UNPUBLISH:
                ck_assert_str_eq(a->unpublish.name, b->unpublish.name);
                break;
        case WIRE_REQ_STAT:
                ck_assert_str_eq(a->stat.name, b->stat.name);
                break;
        case WIRE_REQ_LIST:
                ck_assert_str_eq(a->list.prefix, b->list.prefix);
                ck_assert_str_eq(a->list.after, b->list.after);
                ck_assert_uint_eq(a->list.limit, b->list.limit);
                break;
        case WIRE_REQ_WATCH:
                ck_assert_str_eq(a->watch.prefix, b->watch.prefix);
                break;
        case WIRE_REQ_RELEASE:
                ck_assert_uint_eq(a->release.lease, b->release.lease);
                break;
        case WIRE_REQ_UNWATCH:
                ck_assert_uint_eq(a->unwatch.watch, b->unwatch.watch);
                break;
        case WIRE_REQ_TRACK:
                ck_assert_str_eq(a->track.name, b->track.name);
                break;
        case WIRE_REQ_UNTRACK:
                ck_assert_uint_eq(a->untrack.slot, b->untrack.slot);
                break;
        case WIRE_REQ_ALLOC:
                ck_assert_uint_eq(a->alloc.size, b->alloc.size);
                break;
        case WIRE_REQ_FREE:
                ck_assert_uint_eq(a->free.segment, b->free.segment);
                break;
        case WIRE_REQ_FORGET:
                ck_assert_uint_eq(a->forget.count, b->forget.count);
                for (uint32_t i = 0; i < b->forget.count; i++)
                        ck_assert_uint_eq(a->forget.segments[i], b->forget.segments[i]);
                break;
        case WIRE_REQ_PING:
                ck_assert_uint_eq(a->ping.nonce, b->ping.nonce);
                break;
        default: /* stats: no body */
                break;
        }
}

#define REQ(id_, type_) .id = (id_), .type = WIRE_REQ_##type_
#define HELLO                                                                                      \
        {                                                                                          \
                .major = DLX_PROTO_MAJOR, .minor = UINT32_MAX, .pid = -12345                       \
        }
#define ACQUIRE(timeout)                                                                           \
        {                                                                                          \
                .min_version = UINT64_MAX - 5, .timeout_ms = (timeout), .group = true              \
        }
#define TOKEN UINT64_C(0xfeedfacecafebeef)

/* One row a request; a publish gets make_tensor(tensor, ndim). */
static const struct request_row {
        const char *what;
        struct wire_request q;
        const char *tensor;
        int32_t ndim;
        struct longest longest;
} request_rows[] = {
        {"hello, the longest client name",
         {REQ(1, HELLO), .hello = HELLO},
         .longest = LONGEST(struct wire_request, hello.client_name, DLX_CLIENT_NAME_MAX, 'c')},
        {"hello, an empty client name", {REQ(1, HELLO), .hello = HELLO}},
        {"publish, persistent, a UTF-8 name",
         {REQ(UINT64_MAX, PUBLISH), .publish = {.persist = true, .token = TOKEN}},
         "models/\xc3\xbc/w",
         5},
        {"publish, 0-d", {REQ(UINT64_MAX, PUBLISH), .publish.token = TOKEN}, "scalar", 0},
        {"publish, the maximum rank",
         {REQ(UINT64_MAX, PUBLISH), .publish.token = TOKEN},
         "rank32",
         DLX_MAX_NDIM},
        {"acquire, the longest name, no timeout",
         {REQ(3, ACQUIRE), .acquire = ACQUIRE(-1)},
         .longest = LONGEST(struct wire_request, acquire.name, DLX_NAME_MAX, 'n')},
        {"acquire, the longest timeout",
         {REQ(3, ACQUIRE), .acquire = ACQUIRE(INT64_MAX)},
         .longest = LONGEST(struct wire_request, acquire.name, DLX_NAME_MAX, 'n')},
        {"unpublish", {REQ(5, UNPUBLISH), .unpublish.name = "a/b"}},
        {"stat, a UTF-8 name", {REQ(7, STAT), .stat.name = "\xe5\x90\x8d"}},
        {"list, a full page after a name",
         {REQ(8, LIST), .list = {"models/", "models/b", DLX_LIST_PAGE_MAX}}},
        {"list, every default", {REQ(8, LIST)}},
        {"watch, the longest prefix",
         {REQ(9, WATCH)},
         .longest = LONGEST(struct wire_request, watch.prefix, DLX_NAME_MAX, 'n')},
        {"watch, every name", {REQ(9, WATCH)}},
        {"release", {REQ(4, RELEASE), .release.lease = UINT64_MAX}},
        {"unwatch", {REQ(10, UNWATCH), .unwatch.watch = 0x1234}},
        {"track, the longest name",
         {REQ(16, TRACK)},
         .longest = LONGEST(struct wire_request, track.name, DLX_NAME_MAX, 't')},
        {"untrack, the last slot", {REQ(17, UNTRACK), .untrack.slot = UINT32_MAX}},
        {"untrack, slot 0", {REQ(17, UNTRACK)}},
        {"alloc, the largest segment", {REQ(11, ALLOC), .alloc.size = DLX_MAX_SEGMENT}},
        {"free", {REQ(12, FREE), .free.segment = 99}},
        {"forget, two segments", {REQ(13, FORGET), .forget = {{UINT64_MAX - 1, 7}, 2}}},
        {"stats", {REQ(14, STATS)}},
        {"metrics", {REQ(14, METRICS)}},
        {"ping", {REQ(15, PING), .ping.nonce = UINT64_C(0xa5a5a5a5a5a5a5a5)}},
        /* zero values are not lost by proto3's defaults */
        {"ping, nonce 0", {REQ(15, PING)}},
        {"publish, a mirror's origin",
         {REQ(18, PUBLISH), .publish = {.origin_version = UINT64_MAX,
                                        .origin = "ucx tcp/veth-b \xe2\x86\x90 gpu3 v7"}},
         "@gpu3/model/w",
         2},
        {"mount", {REQ(19, MOUNT), .mount.prefix = "@gpu3/"}},
        {"mount, the longest alias",
         {REQ(19, MOUNT), .mount.prefix = "@abcdefghijklmnopqrstuvwxyz012345/"}},
        {"fetch-failed",
         {REQ(20, FETCH_FAILED),
          .fetch_failed = {"@gpu3/model/w", UINT64_MAX, WIRE_UNREACHABLE, "peer gpu3 lost"}}},
        {"fetch-failed, the longest error",
         {REQ(20, FETCH_FAILED), .fetch_failed = {"@a/b", 0, WIRE_TIMEOUT}},
         .longest = LONGEST(struct wire_request, fetch_failed.error, DLX_ERROR_MAX, 'e')},
};

START_TEST(request_round_trip_keeps_every_field)
{
        const struct request_row *row = &request_rows[_i];
        struct wire_request q = row->q, out;

        if (q.type == WIRE_REQ_PUBLISH)
                make_tensor(&q.publish.tensor, row->tensor, row->ndim);
        fill_longest(&q, row->longest);
        request_roundtrip(&q, &out, row->what);
        expect_request_eq(&out, &q);
}
END_TEST

START_TEST(test_request_names_table)
{
        ck_assert_str_eq(wire_request_name(WIRE_REQ_PUBLISH), "publish");
        ck_assert_str_eq(wire_request_name(WIRE_REQ_PING), "ping");
        ck_assert_str_eq(wire_request_name(WIRE_REQ_COUNT), "unknown");
        ck_assert_str_eq(wire_request_name((enum wire_request_type) - 1), "unknown");
        for (int t = 0; t < WIRE_REQ_COUNT; t++)
                ck_assert_ptr_nonnull(wire_request_name((enum wire_request_type)t));
        ck_assert_str_eq(storage_name(WIRE_STORAGE_MEMFD), "memfd");
        ck_assert_str_eq(storage_name(77), "unknown");
}
END_TEST

/* The storage table has one row per value of the protocol's Storage enum, named after it. */
START_TEST(test_storage_kinds_table)
{
        const ProtobufCEnumDescriptor *d = &dlxp__storage__descriptor;
        unsigned rows = 0;

        for (unsigned i = 0; i < d->n_values; i++) {
                const ProtobufCEnumValue *v = &d->values[i];
                const struct storage_kind *k = storage_kind((uint32_t)v->value);
                char want[32];

                if (v->value == WIRE_STORAGE_UNSPECIFIED) {
                        ck_assert_ptr_null(k);
                        continue;
                }
                ck_assert_msg(k, "no row for %s", v->name);
                ck_assert_uint_eq(k->id, (uint32_t)v->value);
                /* STORAGE_CUDA_HOST -> cuda-host */
                snprintf(want, sizeof(want), "%s", v->name + strlen("STORAGE_"));
                for (char *c = want; *c; c++)
                        *c = *c == '_' ? '-' : (char)(*c - 'A' + 'a');
                ck_assert_str_eq(k->name, want);
                ck_assert_str_eq(storage_name(k->id), want);
                /* a kind carries its own tensors; seals and mmap go together with a memfd */
                ck_assert(storage_fits(k->id, k->id));
                ck_assert_int_eq(k->host_mapped, k->check == STORAGE_CHECK_MEMFD);
                rows++;
        }
        ck_assert_uint_eq(rows, 4);
        ck_assert_ptr_null(storage_kind((uint32_t)d->n_values));
        ck_assert_ptr_null(storage_kind(UINT32_MAX));

        ck_assert_uint_eq(storage_allocated_on(kDLCPU)->id, WIRE_STORAGE_MEMFD);
        ck_assert_uint_eq(storage_allocated_on(kDLCUDAHost)->id, WIRE_STORAGE_CUDA_HOST);
        ck_assert_uint_eq(storage_allocated_on(kDLCUDA)->id, WIRE_STORAGE_CUDA_VMM);
        ck_assert_ptr_null(storage_allocated_on(kDLROCM));
        ck_assert_ptr_null(storage_allocated_on(-1));

        /* pinned host tensors may live in any host segment; nothing else crosses kinds */
        ck_assert(storage_fits(WIRE_STORAGE_MEMFD, WIRE_STORAGE_CUDA_HOST));
        ck_assert(!storage_fits(WIRE_STORAGE_CUDA_HOST, WIRE_STORAGE_MEMFD));
        ck_assert(!storage_fits(WIRE_STORAGE_CUDA_VMM, WIRE_STORAGE_CUDA_IPC));
        ck_assert(!storage_fits(WIRE_STORAGE_MEMFD, WIRE_STORAGE_CUDA_VMM));
        ck_assert(!storage_fits(40, WIRE_STORAGE_MEMFD));
        ck_assert(!storage_fits(WIRE_STORAGE_MEMFD, 40));
        /* legacy IPC memory is the producer's: it cannot persist, nor be made by dlx_alloc */
        ck_assert(!storage_kind(WIRE_STORAGE_CUDA_IPC)->may_persist);
        ck_assert(!storage_kind(WIRE_STORAGE_CUDA_IPC)->allocated);
        ck_assert(!storage_kind(WIRE_STORAGE_MEMFD)->takes_event);
}
END_TEST

/* ---- replies: round trips ----------------------------------------------------------------- */

static void reply_init(struct wire_reply *p, uint64_t id, enum wire_reply_type type)
{
        memset(p, 0, sizeof(*p));
        p->id = id;
        p->type = type;
}

/* Every field a reply of its type carries, compared (list entries: see the list tests). */
static void expect_reply_eq(const struct wire_reply *a, const struct wire_reply *b)
{
        switch (b->type) {
        case WIRE_REP_HELLO:
                ck_assert_uint_eq(a->hello.major, b->hello.major);
                ck_assert_uint_eq(a->hello.minor, b->hello.minor);
                ck_assert_uint_eq(a->hello.session, b->hello.session);
                ck_assert_str_eq(a->hello.server, b->hello.server);
                ck_assert_uint_eq(a->hello.uid, b->hello.uid);
                ck_assert_uint_eq(a->hello.max_frame, b->hello.max_frame);
                ck_assert_uint_eq(a->hello.max_inflight, b->hello.max_inflight);
                break;
        case WIRE_REP_PUBLISH:
                ck_assert_uint_eq(a->publish.version, b->publish.version);
                ck_assert_uint_eq(a->publish.segment, b->publish.segment);
                break;
        case WIRE_REP_WATCH:
                ck_assert_uint_eq(a->watch.watch, b->watch.watch);
                break;
        case WIRE_REP_TRACK:
                ck_assert_uint_eq(a->track.slot, b->track.slot);
                ck_assert_uint_eq(a->track.version, b->track.version);
                ck_assert_uint_eq(a->track.slots, b->track.slots);
                ck_assert_int_eq(a->track.page, b->track.page);
                break;
        case WIRE_REP_ALLOC:
                ck_assert_uint_eq(a->alloc.segment, b->alloc.segment);
                ck_assert_uint_eq(a->alloc.size, b->alloc.size);
                break;
        case WIRE_REP_SEGMENT:
                ck_assert_uint_eq(a->segment.segment, b->segment.segment);
                ck_assert_uint_eq(a->segment.size, b->segment.size);
                break;
        case WIRE_REP_PONG:
                ck_assert_uint_eq(a->pong.nonce, b->pong.nonce);
                break;
        case WIRE_REP_ACQUIRE:
                expect_tensor_eq(&a->acquire.tensor, &b->acquire.tensor);
                ck_assert_uint_eq(a->acquire.lease, b->acquire.lease);
                ck_assert_uint_eq(a->acquire.segment_size, b->acquire.segment_size);
                ck_assert_int_eq(a->acquire.writable, b->acquire.writable);
                break;
        case WIRE_REP_STAT:
                expect_info_eq(&a->stat.info, &b->stat.info);
                break;
        case WIRE_REP_STATS:
                ck_assert_uint_eq(a->stats.names, b->stats.names);
                ck_assert_uint_eq(a->stats.versions, b->stats.versions);
                ck_assert_uint_eq(a->stats.leases, b->stats.leases);
                ck_assert_uint_eq(a->stats.segments, b->stats.segments);
                ck_assert_uint_eq(a->stats.bytes, b->stats.bytes);
                ck_assert_uint_eq(a->stats.max_bytes, b->stats.max_bytes);
                ck_assert_uint_eq(a->stats.clients, b->stats.clients);
                ck_assert_uint_eq(a->stats.max_clients, b->stats.max_clients);
                ck_assert_uint_eq(a->stats.watchers, b->stats.watchers);
                ck_assert_uint_eq(a->stats.uptime_ms, b->stats.uptime_ms);
                ck_assert_uint_eq(a->stats.requests, b->stats.requests);
                ck_assert_uint_eq(a->stats.publishes, b->stats.publishes);
                ck_assert_uint_eq(a->stats.acquires, b->stats.acquires);
                break;
        case WIRE_REP_EVENT:
                ck_assert_int_eq(a->event.kind, b->event.kind);
                ck_assert_uint_eq(a->event.watch, b->event.watch);
                ck_assert_str_eq(a->event.name, b->event.name);
                ck_assert_uint_eq(a->event.version, b->event.version);
                ck_assert_uint_eq(a->event.token, b->event.token);
                ck_assert_uint_eq(a->event.segment, b->event.segment);
                break;
        default: /* status only */
                break;
        }
}

#define REP(id_, type_) .id = (id_), .type = WIRE_REP_##type_
#define EVENT(i, kind_)                                                                            \
        {                                                                                          \
                "event " #kind_,                                                                   \
                {                                                                                  \
                        REP(0, EVENT), .event = {                                                  \
                                WIRE_EVENT_##kind_,                                                \
                                100 + (i),                                                         \
                                "ev/" #i,                                                          \
                                200 + (i),                                                         \
                                UINT64_MAX - (i),                                                  \
                                300 + (i)                                                          \
                        }                                                                          \
                }                                                                                  \
        }
#define ACQUIRED(w)                                                                                \
        {                                                                                          \
                .lease = UINT64_MAX - 2, .segment_size = UINT64_C(1) << 36, .writable = (w)        \
        }
#define STAT_ME(ndim_, salt_) .info = "stat/me", .ndim = (ndim_), .salt = (salt_)
#define PRODUCER_NAME(n) LONGEST(struct wire_reply, stat.info.producer_name, (n), 'P')

/*
 * One row a reply, and the errno its status maps to. An acquire gets
 * make_tensor(tensor, ndim) and then dtype when given; a stat make_info(info,
 * ndim, salt).
 */
static const struct reply_row {
        const char *what;
        struct wire_reply p;
        int status_errno;
        const char *tensor;
        int32_t ndim;
        DLDataType dtype;
        const char *info;
        uint32_t salt;
        struct longest longest;
} reply_rows[] = {
        {"status only",
         {REP(77, NONE), .status = WIRE_NOT_FOUND, .error = "no tensor named 'x'"},
         ENOENT},
        {"status only, the longest error",
         {REP(77, NONE), .status = WIRE_SHUTDOWN},
         ESHUTDOWN,
         .longest = LONGEST(struct wire_reply, error, DLX_ERROR_MAX, 'e')},
        /* an unknown status survives decode and maps to EPROTO */
        {"status only, an unknown status", {REP(77, NONE), .status = 99}, EPROTO},
        {"hello",
         {REP(1, HELLO), .hello = {DLX_PROTO_MAJOR, DLX_PROTO_MINOR + 3, UINT64_MAX, "dlxd 0.1.0",
                                   4294967294u, DLX_MAX_FRAME, DLX_MAX_INFLIGHT}}},
        {"publish", {REP(2, PUBLISH), .publish = {41, UINT64_MAX}}},
        {"watch", {REP(3, WATCH), .watch.watch = 12}},
        {"track, with the page", {REP(3, TRACK), .track = {UINT32_MAX, UINT64_MAX, 65536, true}}},
        {"track, zeros", {REP(3, TRACK)}},
        {"alloc", {REP(4, ALLOC), .alloc = {5, DLX_MAX_SEGMENT}}},
        {"segment", {REP(4, SEGMENT), .segment = {UINT64_MAX, DLX_MAX_SEGMENT}}},
        {"pong", {REP(5, PONG), .pong.nonce = UINT64_C(0x0123456789abcdef)}},
        {"acquire, writable, a 4-bit dtype, the maximum rank",
         {REP(6, ACQUIRE), .acquire = ACQUIRED(true)},
         .tensor = "deep/tensor",
         .ndim = DLX_MAX_NDIM,
         .dtype = {kDLFloat4_e2m1fn, 4, 1}},
        {"acquire, read-only",
         {REP(6, ACQUIRE), .acquire = ACQUIRED(false)},
         .tensor = "deep/tensor",
         .ndim = DLX_MAX_NDIM,
         .dtype = {kDLFloat4_e2m1fn, 4, 1}},
        {"stat, the longest producer name",
         {REP(10, STAT)},
         STAT_ME(3, 5),
         .longest = PRODUCER_NAME(DLX_CLIENT_NAME_MAX)},
        {"stat, 0-d, no producer name",
         {REP(10, STAT)},
         STAT_ME(0, 6),
         .longest = PRODUCER_NAME(0)},
        {"stats",
         {REP(11, STATS),
          .stats = {1, 2, 3, 4, UINT64_MAX, UINT64_MAX - 1, 7, UINT32_MAX, 9, 10, 11, 12, 13}}},
        EVENT(0, PUBLISHED),
        EVENT(1, REPLACED),
        EVENT(2, UNPUBLISHED),
        EVENT(3, RELEASED),
        EVENT(4, SEGMENT_GONE),
};

START_TEST(reply_round_trip_keeps_every_field)
{
        const struct reply_row *row = &reply_rows[_i];
        struct wire_reply p = row->p, out;

        if (row->tensor) {
                make_tensor(&p.acquire.tensor, row->tensor, row->ndim);
                if (row->dtype.bits)
                        p.acquire.tensor.dtype = row->dtype;
        }
        if (row->info)
                make_info(&p.stat.info, row->info, row->ndim, row->salt);
        fill_longest(&p, row->longest);
        reply_roundtrip(&p, &out, row->what);
        expect_reply_eq(&out, &p);
        ck_assert_int_eq(wire_status_errno(out.status), row->status_errno);
        wire_reply_done(&out);
}
END_TEST

/* The metrics text: its bytes, NUL-terminated on decode, freed by wire_reply_done(). */
START_TEST(test_reply_metrics)
{
        static const char text[] = "# TYPE dlx_names gauge\ndlx_names 3\n";
        struct wire_reply p, out;

        reply_init(&p, 9, WIRE_REP_METRICS);
        p.metrics.text = (char *)text;
        p.metrics.len = (uint32_t)strlen(text);
        reply_roundtrip(&p, &out, "metrics");
        ck_assert_int_eq(out.type, WIRE_REP_METRICS);
        ck_assert_uint_eq(out.metrics.len, strlen(text));
        ck_assert_ptr_ne(out.metrics.text, text);
        ck_assert_str_eq(out.metrics.text, text);
        wire_reply_done(&out);
        ck_assert_ptr_null(out.metrics.text);
        ck_assert_uint_eq(out.metrics.len, 0);

        /* empty text: still a string */
        p.metrics.text = (char *)"";
        p.metrics.len = 0;
        reply_roundtrip(&p, &out, "empty metrics");
        ck_assert_ptr_nonnull(out.metrics.text);
        ck_assert_str_eq(out.metrics.text, "");
        wire_reply_done(&out);
}
END_TEST

START_TEST(test_reply_list)
{
        enum { N = 5 };
        struct wire_info entries[N];
        struct wire_reply p, out;

        for (uint32_t i = 0; i < N; i++) {
                char name[32];

                snprintf(name, sizeof(name), "list/entry-%u", i);
                make_info(&entries[i], name, (int32_t)i, i);
        }
        reply_init(&p, 7, WIRE_REP_LIST);
        p.list.entries = entries;
        p.list.count = N;
        snprintf(p.list.next, sizeof(p.list.next), "%s", "list/entry-4");
        reply_roundtrip(&p, &out, "a list page");
        ck_assert_uint_eq(out.list.count, N);
        ck_assert_ptr_nonnull(out.list.entries);
        ck_assert_ptr_ne(out.list.entries, entries);
        for (uint32_t i = 0; i < N; i++)
                expect_info_eq(&out.list.entries[i], &entries[i]);
        ck_assert_str_eq(out.list.next, "list/entry-4");
        wire_reply_done(&out);
        ck_assert_ptr_null(out.list.entries);
        ck_assert_uint_eq(out.list.count, 0);

        /* an empty page */
        reply_init(&p, 8, WIRE_REP_LIST);
        reply_roundtrip(&p, &out, "an empty list page");
        ck_assert_uint_eq(out.list.count, 0);
        ck_assert_ptr_null(out.list.entries);
        ck_assert_str_eq(out.list.next, "");
        wire_reply_done(&out);
}
END_TEST

START_TEST(test_reply_list_full_page)
{
        struct wire_info *entries = calloc(DLX_LIST_PAGE_MAX, sizeof(*entries));
        struct wire_reply p, out;

        ck_assert_ptr_nonnull(entries);
        for (uint32_t i = 0; i < DLX_LIST_PAGE_MAX; i++) {
                char name[32];

                snprintf(name, sizeof(name), "page/%04u", i);
                make_info(&entries[i], name, 2, i);
        }
        reply_init(&p, 9, WIRE_REP_LIST);
        p.list.entries = entries;
        p.list.count = DLX_LIST_PAGE_MAX;
        reply_roundtrip(&p, &out, "a full list page");
        ck_assert_uint_eq(out.list.count, DLX_LIST_PAGE_MAX);
        expect_info_eq(&out.list.entries[0], &entries[0]);
        expect_info_eq(&out.list.entries[DLX_LIST_PAGE_MAX - 1], &entries[DLX_LIST_PAGE_MAX - 1]);
        wire_reply_done(&out);

        /* one more is refused at encode */
        size_t n = 0;
        p.list.count = DLX_LIST_PAGE_MAX + 1;
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);
        free(entries);
}
END_TEST

/* ---- status <-> errno --------------------------------------------------------------------- */

START_TEST(test_status_table)
{
        /* dlx.proto's comments are the specification */
        static const int want[WIRE_STATUS_COUNT] = {
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

        ck_assert_int_eq(WIRE_STATUS_COUNT, 21);
        ck_assert_int_eq(WIRE_UNREACHABLE, DLXP__STATUS__STATUS_UNREACHABLE);
        ck_assert_int_eq(WIRE_IS_GROUP, DLXP__STATUS__STATUS_IS_GROUP);
        ck_assert_int_eq(WIRE_NOT_GROUP, DLXP__STATUS__STATUS_NOT_GROUP);
        ck_assert_int_eq(WIRE_SHUTDOWN, DLXP__STATUS__STATUS_SHUTDOWN);
        ck_assert_int_eq(WIRE_CLOSED, DLXP__STATUS__STATUS_CLOSED);
        for (int s = 0; s < WIRE_STATUS_COUNT; s++) {
                int e = wire_status_errno(s);

                ck_assert_msg(e == want[s], "status %d -> errno %d, want %d", s, e, want[s]);
                ck_assert_msg((int)wire_errno_status(e) == s, "errno %d -> status %d, want %d", e,
                              (int)wire_errno_status(e), s);
                ck_assert_msg((int)wire_errno_status(-e) == s, "errno -%d -> status %d, want %d", e,
                              (int)wire_errno_status(-e), s);
        }
}
END_TEST

START_TEST(test_status_unknown)
{
        ck_assert_int_eq(wire_status_errno(WIRE_STATUS_COUNT), EPROTO);
        ck_assert_int_eq(wire_status_errno(-1), EPROTO);
        ck_assert_int_eq(wire_status_errno(1000), EPROTO);
        ck_assert_int_eq(wire_status_errno(INT32_MIN), EPROTO);
        ck_assert_int_eq(wire_status_errno(INT32_MAX), EPROTO);

        /* errnos with no status of their own */
        ck_assert_int_eq(wire_errno_status(EPERM), WIRE_PERMISSION);
        ck_assert_int_eq(wire_errno_status(-EPERM), WIRE_PERMISSION);
        ck_assert_int_eq(wire_errno_status(EOVERFLOW), WIRE_TOO_BIG);
        ck_assert_int_eq(wire_errno_status(-E2BIG), WIRE_TOO_BIG);
        ck_assert_int_eq(wire_errno_status(EWOULDBLOCK), WIRE_LIMIT);
        ck_assert_int_eq(wire_errno_status(EOPNOTSUPP), WIRE_NOT_SUPPORTED);
        ck_assert_int_eq(wire_errno_status(ENOEXEC), WIRE_INTERNAL);
        ck_assert_int_eq(wire_errno_status(-ECHILD), WIRE_INTERNAL);
        ck_assert_int_eq(wire_errno_status(4095), WIRE_INTERNAL);
        ck_assert_int_eq(wire_errno_status(0), WIRE_OK);
}
END_TEST

/* ---- request decode: rejections ----------------------------------------------------------- */

/* Payloads that are not protobuf at all, as requests and as replies. */
static const struct {
        size_t len;
        const char *bytes;
} garbage_rows[] = {
        {1, "\x0f"},                                          /* wire type 7 does not exist */
        {2, "\x08\xff"},                                      /* truncated varint id */
        {11, "\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"}, /* 11-byte varint */
        {3, "\x12\x50\x01"},                                  /* hello longer than the buffer */
        {4, "\x08\x01\x7a\x05"},                              /* ping cut short */
        {2, "\x00\x00"},                                      /* field number 0 */
        {4, "\x0a\x02\x01\x02"},                              /* id with the wrong wire type */
        {8, "\x08\x05\x12\x04\x1a\x05\x61\x62"},              /* client name overruns hello */
};

START_TEST(decode_refuses_garbage_with_a_reason)
{
        const uint8_t *bytes = (const uint8_t *)garbage_rows[_i].bytes;
        size_t len = garbage_rows[_i].len;
        struct wire_request q;
        struct wire_reply p;
        char err[64] = "";

        memset(&q, 0x5a, sizeof(q));
        ck_assert_msg(wire_request_decode(bytes, len, &q, err, sizeof(err)) == -EPROTO,
                      "garbage #%d not refused as garbage", _i);
        ck_assert_uint_eq(q.id, 0);
        ck_assert_int_eq(q.type, WIRE_REQ_NONE);
        ck_assert_str_ne(err, "");
        /* no room for a reason is fine */
        ck_assert_int_eq(wire_request_decode(bytes, len, &q, NULL, 0), -EPROTO);
        ck_assert_int_eq(wire_reply_decode(bytes, len, &p, NULL, 0), -EPROTO);
}
END_TEST

START_TEST(test_decode_id_zero)
{
        Dlxp__Request r;
        Dlxp__Ping ping;
        struct wire_request q;
        char err[64] = "";

        dlxp__ping__init(&ping);
        ping.nonce = 5;
        pb_request_body(&r, 0, "ping", &ping);
        ck_assert_int_eq(decode_pb_request(&r, &q), -EPROTO);
        ck_assert_uint_eq(q.id, 0);
        /* an empty payload is a request with id 0 and no body */
        ck_assert_int_eq(wire_request_decode((const uint8_t *)"", 0, &q, err, sizeof(err)),
                         -EPROTO);
        ck_assert_str_ne(err, "");
}
END_TEST

START_TEST(test_decode_no_body)
{
        Dlxp__Request r;
        struct wire_request q;
        struct pb unknown;

        dlxp__request__init(&r);
        r.id = 42;
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 42);

        /* a body from a future protocol: field 99, unknown to this build, an empty message */
        pb_init(&unknown);
        pb_uint(&unknown, 1, 43);
        pb_bytes(&unknown, 99, "", 0);
        memset(&q, 0x5a, sizeof(q));
        ck_assert_int_eq(wire_request_decode(unknown.b, unknown.n, &q, NULL, 0), -EINVAL);
        ck_assert_uint_eq(q.id, 43);
        pb_done(&unknown);
}
END_TEST

/* A publish request's tensor with one field set, to a value out of range or the widest legal. */
enum tensor_field {
        T_NONE,
        T_N_STRIDES,
        T_CODE,
        T_BITS,
        T_LANES,
        T_OPAQUE,
        T_NO_DTYPE,
        T_SHAPE_2,
        T_STRIDE_1,
        T_NO_TENSOR,
        T_UUID_LEN,
};

static const struct tensor_row {
        const char *what;
        size_t ndim;
        enum tensor_field field;
        int64_t value;
        int want;
} tensor_rows[] = {
        {"a valid tensor", 2, T_NONE, 0, 0},
        {"the most dimensions", DLX_MAX_NDIM, T_NONE, 0, 0},
        {"one dimension too many", DLX_MAX_NDIM + 1, T_NONE, 0, -EINVAL},
        {"two dimensions too many", DLX_MAX_NDIM + 2, T_NONE, 0, -EINVAL},
        {"fewer strides than dimensions", 3, T_N_STRIDES, 2, -EINVAL},
        {"no strides (they are always sent)", 3, T_N_STRIDES, 0, -EINVAL},
        {"a stride for no dimension", 0, T_N_STRIDES, 1, -EINVAL},
        {"more strides than dimensions", 2, T_N_STRIDES, 3, -EINVAL},
        /* out-of-range dtype fields must not be truncated into valid ones */
        {"dtype code 256 + float", 1, T_CODE, 256 + kDLFloat, -EINVAL},
        {"dtype bits 256 + 32", 1, T_BITS, 256 + 32, -EINVAL},
        {"dtype lanes 65536 + 1", 1, T_LANES, 65536 + 1, -EINVAL},
        {"dtype code UINT32_MAX", 1, T_CODE, UINT32_MAX, -EINVAL},
        /* in range but not a shareable dtype */
        {"an opaque handle of 64 bits", 1, T_OPAQUE, 0, -EINVAL},
        {"dtype lanes 0", 1, T_LANES, 0, -EINVAL},
        {"dtype bits 7", 1, T_BITS, 7, -EINVAL},
        {"the most lanes", 1, T_LANES, 65535, 0},
        {"no dtype", 1, T_NO_DTYPE, 0, -EINVAL},
        {"a negative dimension", 3, T_SHAPE_2, -1, -EINVAL},
        {"a negative stride (fine)", 3, T_STRIDE_1, -1, 0},
        {"publish without a tensor", 1, T_NO_TENSOR, 0, -EINVAL},
        {"a device UUID of 16 bytes", 1, T_UUID_LEN, DLX_CUDA_UUID, 0},
        {"a device UUID of 15 bytes", 1, T_UUID_LEN, DLX_CUDA_UUID - 1, -EINVAL},
        {"a device UUID of 17 bytes", 1, T_UUID_LEN, DLX_CUDA_UUID + 1, -EINVAL},
};

static uint8_t uuid_bytes[DLX_CUDA_UUID + 1];

START_TEST(decode_checks_each_tensor_field)
{
        const struct tensor_row *row = &tensor_rows[_i];
        uint64_t id = 50 + (uint64_t)_i;
        struct pb_publish p;
        struct wire_request q;
        int rc;

        pb_publish_init(&p, id, "t", row->ndim);
        switch (row->field) {
        case T_NONE:
                break;
        case T_N_STRIDES:
                p.tensor.t.n_strides = (size_t)row->value;
                break;
        case T_CODE:
                p.tensor.dtype.code = (uint32_t)row->value;
                break;
        case T_BITS:
                p.tensor.dtype.bits = (uint32_t)row->value;
                break;
        case T_LANES:
                p.tensor.dtype.lanes = (uint32_t)row->value;
                break;
        case T_OPAQUE:
                p.tensor.dtype.code = kDLOpaqueHandle;
                p.tensor.dtype.bits = 64;
                break;
        case T_NO_DTYPE:
                p.tensor.t.dtype = NULL;
                break;
        case T_SHAPE_2:
                p.tensor.shape[2] = row->value;
                break;
        case T_STRIDE_1:
                p.tensor.shape[1] = 4;
                p.tensor.strides[1] = row->value;
                break;
        case T_NO_TENSOR:
                p.publish.tensor = NULL;
                break;
        case T_UUID_LEN:
                p.tensor.t.device_uuid.len = (size_t)row->value;
                p.tensor.t.device_uuid.data = uuid_bytes;
                break;
        }
        rc = decode_pb_request(&p.r, &q);
        ck_assert_msg(rc == row->want, "%s: decode gave %d, not %d", row->what, rc, row->want);
        ck_assert_msg(q.id == id, "%s: id %llu", row->what, (unsigned long long)q.id);
        if (rc < 0)
                return;
        ck_assert_int_eq(q.publish.tensor.ndim, (int32_t)row->ndim);
        ck_assert_uint_eq(q.publish.tensor.dtype.lanes, p.tensor.dtype.lanes);
        for (size_t i = 0; i < row->ndim; i++) {
                ck_assert_int_eq(q.publish.tensor.shape[i], p.tensor.shape[i]);
                ck_assert_int_eq(q.publish.tensor.strides[i], p.tensor.strides[i]);
        }
}
END_TEST

START_TEST(test_decode_tensor_names)
{
        static const char *const bad[] = {
                "",
                "/a",
                "a/",
                "a//b",
                ".",
                "..",
                "a/../b",
                "a/./b",
                "a\x01",
                "a\x7f",
                "\xc2\x85",
                "\xc0\x80",
                "\xed\xa0\x80",
                "\xf4\x90\x80\x80",
                "\xe5\x90",
        };
        struct pb_publish p;
        struct wire_request q;
        char longest[DLX_NAME_MAX + 2];

        for (size_t i = 0; i < N_ELEMS(bad); i++) {
                pb_publish_init(&p, 90 + i, bad[i], 1);
                ck_assert_msg(decode_pb_request(&p.r, &q) == -EINVAL, "bad name #%zu accepted", i);
                ck_assert_uint_eq(q.id, 90 + i);
        }
        pb_publish_init(&p, 200, "t", 1);
        p.tensor.t.name = bin("a\0b", 3);
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        p.tensor.t.name = bin("ab\0", 3);
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);

        memset(longest, 'x', sizeof(longest));
        p.tensor.t.name = bin(longest, DLX_NAME_MAX);
        ck_assert_int_eq(decode_pb_request(&p.r, &q), 0);
        ck_assert_uint_eq(strlen(q.publish.tensor.name), DLX_NAME_MAX);
        p.tensor.t.name = bin(longest, DLX_NAME_MAX + 1);
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 200);
}
END_TEST

/* Acquire, stat and unpublish share one name rule; list and watch take prefixes. */
static const struct named_row {
        const char *body, *field;
        bool is_name;
} named_rows[] = {
        {"acquire", "name", true}, {"stat", "name", true},   {"unpublish", "name", true},
        {"list", "prefix", false}, {"list", "after", false}, {"watch", "prefix", false},
};

struct pb_named {
        Dlxp__Request r;
        union {
                Dlxp__Acquire acquire;
                Dlxp__Stat stat;
                Dlxp__Unpublish unpublish;
                Dlxp__List list;
                Dlxp__Watch watch;
        } body;
};

/* A request (id 300 + row) whose row's string field is name. */
static void pb_named_init(struct pb_named *p, int row, ProtobufCBinaryData name)
{
        const struct named_row *n = &named_rows[row];
        const ProtobufCMessageDescriptor *d =
                protobuf_c_message_descriptor_get_field_by_name(&dlxp__request__descriptor, n->body)
                        ->descriptor;
        const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field_by_name(d, n->field);

        protobuf_c_message_init(d, &p->body);
        *(ProtobufCBinaryData *)((char *)&p->body + f->offset) = name;
        pb_request_body(&p->r, 300 + (uint64_t)row, n->body, &p->body);
}

START_TEST(request_names_and_prefixes_refuse_bad_strings)
{
        /* bad for names and prefixes alike */
        static const char *const bad_both[] = {
                "a\x01",
                "\x1f",
                "a\x7f",
                "\xc2\x85",
                "\xc0\x80",
                "\xed\xa0\x80",
                "\xf4\x90\x80\x80",
                "\xe5\x90",
                "\xff",
                "\x80",
        };
        /* bad only as names */
        static const char *const bad_name[] = {"", "/a", "a/", "a//b", ".", "..", "a/../b"};
        const struct named_row *row = &named_rows[_i];
        char longest[DLX_NAME_MAX + 1];
        struct pb_named p;
        struct wire_request q;

        memset(longest, 'y', sizeof(longest));
        for (size_t i = 0; i < N_ELEMS(bad_both); i++) {
                pb_named_init(&p, _i, str(bad_both[i]));
                ck_assert_msg(decode_pb_request(&p.r, &q) == -EINVAL,
                              "%s.%s: bad string #%zu accepted", row->body, row->field, i);
                ck_assert_uint_eq(q.id, 300 + (uint64_t)_i);
        }
        for (size_t i = 0; i < N_ELEMS(bad_name); i++) {
                pb_named_init(&p, _i, str(bad_name[i]));
                ck_assert_msg(decode_pb_request(&p.r, &q) == (row->is_name ? -EINVAL : 0),
                              "%s.%s: '%s'", row->body, row->field, bad_name[i]);
        }
        pb_named_init(&p, _i, bin("a\0b", 3));
        ck_assert_msg(decode_pb_request(&p.r, &q) == -EINVAL, "%s.%s: NUL", row->body, row->field);
        pb_named_init(&p, _i, bin(longest, DLX_NAME_MAX));
        ck_assert_msg(decode_pb_request(&p.r, &q) == 0, "%s.%s: 255 bytes", row->body, row->field);
        pb_named_init(&p, _i, bin(longest, DLX_NAME_MAX + 1));
        ck_assert_msg(decode_pb_request(&p.r, &q) == -EINVAL, "%s.%s: 256 bytes", row->body,
                      row->field);
        ck_assert_uint_eq(q.id, 300 + (uint64_t)_i);
}
END_TEST

START_TEST(test_decode_client_name)
{
        /* control characters (in octal, which stops at 3 digits), C1 controls, broken UTF-8, NUL */
        static const struct {
                const char *s;
                size_t len;
        } bad[] = {{"\001abc", 4},  {"tab\there", 8}, {"del\x7f", 4},
                   {"\xc2\x9b", 2}, {"bad\xc3", 4},   {"a\0", 2}};
        Dlxp__Request r;
        Dlxp__Hello hello;
        struct wire_request q;
        char name[DLX_CLIENT_NAME_MAX + 1];

        dlxp__hello__init(&hello);
        hello.major = 1;
        pb_request_body(&r, 400, "hello", &hello);

        memset(name, 'k', sizeof(name));
        hello.client_name = bin(name, DLX_CLIENT_NAME_MAX);
        ck_assert_int_eq(decode_pb_request(&r, &q), 0);
        ck_assert_uint_eq(strlen(q.hello.client_name), DLX_CLIENT_NAME_MAX);
        hello.client_name = bin(name, DLX_CLIENT_NAME_MAX + 1);
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 400);
        for (size_t i = 0; i < N_ELEMS(bad); i++) {
                hello.client_name = bin(bad[i].s, bad[i].len);
                ck_assert_msg(decode_pb_request(&r, &q) == -EINVAL, "bad client name #%zu accepted",
                              i);
        }
        hello.client_name = str("python3 / trainer \xe2\x9c\x93");
        ck_assert_int_eq(decode_pb_request(&r, &q), 0);
        ck_assert_str_eq(q.hello.client_name, "python3 / trainer \xe2\x9c\x93");
}
END_TEST

/* Federation (1.5): mount prefixes, fetch failures and origins are checked at decode. */
START_TEST(test_decode_federation)
{
        static const char *const bad_prefixes[] = {
                "",        "@",
                "@/",      "gpu3/",
                "@gpu3",   "@gpu3/x/",
                "@gp/u3/", "@\001/",
                "@a\x7f/", "@abcdefghijklmnopqrstuvwxyz0123456/", /* a 33-byte alias */
        };
        Dlxp__Request r;
        Dlxp__Mount mount;
        Dlxp__FetchFailed ff;
        struct pb_publish pub;
        struct wire_request q;
        char origin[DLX_ORIGIN_MAX + 2];

        dlxp__mount__init(&mount);
        pb_request_body(&r, 500, "mount", &mount);
        for (size_t i = 0; i < N_ELEMS(bad_prefixes); i++) {
                mount.prefix = str(bad_prefixes[i]);
                ck_assert_msg(decode_pb_request(&r, &q) == -EINVAL, "mount prefix '%s' accepted",
                              bad_prefixes[i]);
        }
        mount.prefix = str("@abcdefghijklmnopqrstuvwxyz012345/");
        ck_assert_int_eq(decode_pb_request(&r, &q), 0);
        mount.prefix = str("@\xc3\xbc.b-c_1/");
        ck_assert_int_eq(decode_pb_request(&r, &q), 0);

        dlxp__fetch_failed__init(&ff);
        pb_request_body(&r, 501, "fetch_failed", &ff);
        ff.name = str("@gpu3/w");
        ff.status = DLXP__STATUS__STATUS_OK; /* a failure that is not one */
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        ff.status = (Dlxp__Status)WIRE_STATUS_COUNT;
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        ff.status = DLXP__STATUS__STATUS_UNREACHABLE;
        ck_assert_int_eq(decode_pb_request(&r, &q), 0);
        ck_assert_int_eq(wire_status_errno(q.fetch_failed.status), EHOSTUNREACH);
        ff.error = "line\nbreak";
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        ff.error = "";
        ff.name = str("@gpu3//w");
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);

        pb_publish_init(&pub, 502, "@gpu3/w", 1);
        memset(origin, 'o', sizeof(origin));
        origin[DLX_ORIGIN_MAX] = '\0';
        pub.publish.origin = origin;
        ck_assert_int_eq(decode_pb_request(&pub.r, &q), 0);
        ck_assert_uint_eq(strlen(q.publish.origin), DLX_ORIGIN_MAX);
        origin[DLX_ORIGIN_MAX] = 'o';
        origin[DLX_ORIGIN_MAX + 1] = '\0';
        ck_assert_int_eq(decode_pb_request(&pub.r, &q), -EINVAL);
        pub.publish.origin = "esc\033[2J";
        ck_assert_int_eq(decode_pb_request(&pub.r, &q), -EINVAL);
}
END_TEST

/* ---- encode refusals ---------------------------------------------------------------------- */

/* A string field of a message filled to its last byte, unterminated (size 0: none). */
struct unterminated {
        size_t off, size;
        char c;
};
#define UNTERMINATED(type, field, ch)                                                              \
        {                                                                                          \
                offsetof(type, field), sizeof(((type *)0)->field), (ch)                            \
        }

#define REQ_UNTERMINATED(field, ch) UNTERMINATED(struct wire_request, field, ch)
#define REP_UNTERMINATED(field, ch) UNTERMINATED(struct wire_reply, field, ch)

static void fill_unterminated(void *msg, struct unterminated u)
{
        memset((char *)msg + u.off, u.c, u.size);
}

/* One row a request encode must refuse; a publish gets make_tensor("t", 1), then ndim if given. */
static const struct encode_request_row {
        const char *what;
        struct wire_request q;
        struct unterminated unterminated;
        int32_t ndim;
} encode_request_rows[] = {
        {"acquire, an unterminated name", {REQ(1, ACQUIRE)}, REQ_UNTERMINATED(acquire.name, 'a')},
        {"hello, an unterminated client name",
         {REQ(1, HELLO)},
         REQ_UNTERMINATED(hello.client_name, 'c')},
        {"list, an unterminated after", {REQ(1, LIST)}, REQ_UNTERMINATED(list.after, 'z')},
        {"list, an unterminated prefix", {REQ(1, LIST)}, REQ_UNTERMINATED(list.prefix, 'z')},
        {"stat, an unterminated name", {REQ(1, STAT)}, REQ_UNTERMINATED(stat.name, 's')},
        {"unpublish, an unterminated name",
         {REQ(1, UNPUBLISH)},
         REQ_UNTERMINATED(unpublish.name, 'u')},
        {"watch, an unterminated prefix", {REQ(1, WATCH)}, REQ_UNTERMINATED(watch.prefix, 'w')},
        {"publish, one dimension too many", {REQ(1, PUBLISH)}, .ndim = DLX_MAX_NDIM + 1},
        {"publish, a negative rank", {REQ(1, PUBLISH)}, .ndim = -1},
        {"publish, an unterminated tensor name",
         {REQ(1, PUBLISH)},
         REQ_UNTERMINATED(publish.tensor.name, 'n')},
        {"no type", {REQ(1, NONE)}},
        {"type COUNT", {REQ(1, COUNT)}},
        {"type 99", {.id = 1, .type = (enum wire_request_type)99}},
};

START_TEST(encode_refuses_an_invalid_request)
{
        const struct encode_request_row *row = &encode_request_rows[_i];
        struct wire_request q = row->q;
        size_t n = 12345;
        uint8_t buf[64];
        int rc;

        if (q.type == WIRE_REQ_PUBLISH) {
                make_tensor(&q.publish.tensor, "t", 1);
                if (row->ndim)
                        q.publish.tensor.ndim = row->ndim;
        }
        fill_unterminated(&q, row->unterminated);
        rc = wire_request_size(&q, &n);
        ck_assert_msg(rc == -EINVAL, "%s: size gave %d", row->what, rc);
        ck_assert_msg(n == 12345, "%s: a size was written", row->what);
        ck_assert_msg(wire_request_pack(&q, buf) == 0, "%s: packed", row->what);
}
END_TEST

/*
 * One row a reply encode must refuse. An acquire gets make_tensor("t", 1), a
 * stat make_info("s", 1, 1), a list entries of make_info() on the heap; then
 * that tensor (the last entry's) gets ndim if given, the last entry its
 * unterminated field and the reply its own.
 */
static const struct encode_reply_row {
        const char *what;
        struct wire_reply p;
        struct unterminated unterminated;
        int32_t ndim;
        uint32_t entries;
        struct unterminated entry;
} encode_reply_rows[] = {
        {"status only, an unterminated error", {REP(1, NONE)}, REP_UNTERMINATED(error, 'e')},
        {"hello, an unterminated server", {REP(1, HELLO)}, REP_UNTERMINATED(hello.server, 's')},
        {"event, an unterminated name", {REP(1, EVENT)}, REP_UNTERMINATED(event.name, 'e')},
        {"acquire, one dimension too many", {REP(1, ACQUIRE)}, .ndim = DLX_MAX_NDIM + 1},
        {"list, an unterminated next", {REP(1, LIST)}, REP_UNTERMINATED(list.next, 'x')},
        {"list, an entry's unterminated tensor name",
         {REP(1, LIST)},
         .entries = 1,
         .entry = UNTERMINATED(struct wire_info, tensor.name, 'x')},
        {"list, a second entry with one dimension too many",
         {REP(1, LIST)},
         .ndim = DLX_MAX_NDIM + 1,
         .entries = 2},
        /* an unterminated producer name is "an unterminated string" like any other */
        {"list, an entry's producer name filled to the end of its allocation",
         {REP(1, LIST)},
         .entries = 1,
         .entry = {offsetof(struct wire_info, producer_name),
                   sizeof(struct wire_info) - offsetof(struct wire_info, producer_name), 'p'}},
        {"stat, an unterminated tensor name",
         {REP(1, STAT)},
         REP_UNTERMINATED(stat.info.tensor.name, 'x')},
        /* refused like an acquire reply's, not packed from a half-built message */
        {"stat, one dimension too many", {REP(1, STAT)}, .ndim = DLX_MAX_NDIM + 1},
        {"stat, a negative rank", {REP(1, STAT)}, .ndim = -1},
        {"stat, an unterminated producer name",
         {REP(1, STAT)},
         REP_UNTERMINATED(stat.info.producer_name, 'p')},
        {"type 99", {.id = 1, .type = (enum wire_reply_type)99}},
};

START_TEST(encode_refuses_an_invalid_reply)
{
        const struct encode_reply_row *row = &encode_reply_rows[_i];
        struct wire_reply p = row->p;
        struct wire_info *entries = NULL;
        struct wire_tensor *tensor = NULL;
        size_t n = 12345;
        uint8_t buf[64];
        int rc;

        if (p.type == WIRE_REP_ACQUIRE) {
                make_tensor(&p.acquire.tensor, "t", 1);
                tensor = &p.acquire.tensor;
        } else if (p.type == WIRE_REP_STAT) {
                make_info(&p.stat.info, "s", 1, 1);
                tensor = &p.stat.info.tensor;
        } else if (row->entries) {
                entries = calloc(row->entries, sizeof(*entries));
                ck_assert_ptr_nonnull(entries);
                for (uint32_t i = 0; i < row->entries; i++) {
                        char name[16];

                        snprintf(name, sizeof(name), "e%u", i);
                        make_info(&entries[i], name, 1, i + 1);
                }
                fill_unterminated(&entries[row->entries - 1], row->entry);
                tensor = &entries[row->entries - 1].tensor;
                p.list.entries = entries;
                p.list.count = row->entries;
        }
        if (row->ndim)
                tensor->ndim = row->ndim;
        fill_unterminated(&p, row->unterminated);
        rc = wire_reply_size(&p, &n);
        ck_assert_msg(rc == -EINVAL, "%s: size gave %d", row->what, rc);
        ck_assert_msg(n == 12345, "%s: a size was written", row->what);
        ck_assert_msg(wire_reply_pack(&p, buf) == 0, "%s: packed", row->what);
        free(entries);
}
END_TEST

/* ---- reply decode: rejections ------------------------------------------------------------- */

/* A protobuf Info with a valid tensor, shared by many list entries. */
struct pb_info {
        Dlxp__Info info;
        struct pb_tensor tensor;
};

static void pb_info_init(struct pb_info *p, const char *name)
{
        dlxp__info__init(&p->info);
        pb_tensor_init(&p->tensor, name, 2);
        p->info.tensor = &p->tensor.t;
        p->info.producer_name = (char *)"prod";
}

/* A Forget names 1 to DLX_FORGET_MAX segments, on both sides of the wire. */
START_TEST(test_forget_bounds)
{
        uint64_t segs[DLX_FORGET_MAX + 1];
        struct wire_request q, out;
        Dlxp__Request r;
        Dlxp__Forget f;
        size_t n;

        for (size_t i = 0; i <= DLX_FORGET_MAX; i++)
                segs[i] = 1000 + i;
        dlxp__forget__init(&f);
        f.segments = segs;
        pb_request_body(&r, 9, "forget", &f);

        f.n_segments = DLX_FORGET_MAX;
        ck_assert_int_eq(decode_pb_request(&r, &out), 0);
        ck_assert_uint_eq(out.forget.count, DLX_FORGET_MAX);
        ck_assert_uint_eq(out.forget.segments[DLX_FORGET_MAX - 1], 1000 + DLX_FORGET_MAX - 1);
        f.n_segments = DLX_FORGET_MAX + 1;
        ck_assert_int_eq(decode_pb_request(&r, &out), -EINVAL);
        ck_assert_uint_eq(out.id, 9);
        f.n_segments = 0;
        ck_assert_int_eq(decode_pb_request(&r, &out), -EINVAL);

        /* one segment as a plain (unpacked) varint field decodes as a batch of one */
        {
                const uint8_t one[] = {0x08, 0x09, 0x6a, 0x02, 0x08, 0x2a};
                ck_assert_int_eq(wire_request_decode(one, sizeof(one), &out, NULL, 0), 0);
                ck_assert_int_eq(out.type, WIRE_REQ_FORGET);
                ck_assert_uint_eq(out.forget.count, 1);
                ck_assert_uint_eq(out.forget.segments[0], 42);
        }

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_FORGET;
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);
        q.forget.count = DLX_FORGET_MAX + 1;
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);
}
END_TEST

/* Event names follow the name rules like every other name; SEGMENT_GONE has none. */
START_TEST(test_decode_event_names)
{
        static const char *const bad[] = {"a//b", "/lead", "trail/", "a/../b", "tab\tbed"};
        Dlxp__Reply r;
        Dlxp__Event ev;
        struct wire_reply out;

        dlxp__event__init(&ev);
        pb_reply_body(&r, 0, "event", &ev);
        ev.kind = DLXP__EVENT__KIND__PUBLISHED;
        ev.name = str("ok/name");
        ck_assert_int_eq(decode_pb_reply(&r, &out), 0);
        ck_assert_str_eq(out.event.name, "ok/name");
        wire_reply_done(&out);
        for (size_t i = 0; i < N_ELEMS(bad); i++) {
                ev.name = str(bad[i]);
                ck_assert_msg(decode_pb_reply(&r, &out) == -EINVAL, "event name '%s' accepted",
                              bad[i]);
        }
        ev.kind = DLXP__EVENT__KIND__SEGMENT_GONE;
        ev.name = str("");
        ev.segment = 9;
        ck_assert_int_eq(decode_pb_reply(&r, &out), 0);
        ck_assert_uint_eq(out.event.segment, 9);
        wire_reply_done(&out);
}
END_TEST

START_TEST(test_decode_list_page_limit)
{
        struct pb_info info;
        Dlxp__Info **ptrs = calloc(DLX_LIST_PAGE_MAX + 1, sizeof(*ptrs));
        Dlxp__Reply r;
        Dlxp__ListReply list;
        struct wire_reply out;

        ck_assert_ptr_nonnull(ptrs);
        pb_info_init(&info, "same");
        for (size_t i = 0; i <= DLX_LIST_PAGE_MAX; i++)
                ptrs[i] = &info.info;
        dlxp__list_reply__init(&list);
        pb_reply_body(&r, 500, "list", &list);
        list.entries = ptrs;

        list.n_entries = DLX_LIST_PAGE_MAX;
        ck_assert_int_eq(decode_pb_reply(&r, &out), 0);
        ck_assert_uint_eq(out.list.count, DLX_LIST_PAGE_MAX);
        ck_assert_str_eq(out.list.entries[DLX_LIST_PAGE_MAX - 1].tensor.name, "same");
        wire_reply_done(&out);

        list.n_entries = DLX_LIST_PAGE_MAX + 1;
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        ck_assert_uint_eq(out.id, 500);
        ck_assert_ptr_null(out.list.entries);
        ck_assert_uint_eq(out.list.count, 0);
        free(ptrs);
}
END_TEST

START_TEST(test_decode_reply_rejections)
{
        struct pb_info good, bad;
        Dlxp__Info empty;
        Dlxp__Info *ptrs[3];
        Dlxp__Reply r;
        Dlxp__ListReply list;
        Dlxp__AcquireReply acq;
        Dlxp__StatReply stat;
        Dlxp__Event event;
        struct pb_tensor t;
        struct wire_reply out;

        /* garbage: see decode_refuses_garbage_with_a_reason */
        /* a list whose last entry is bad: nothing leaks, nothing is returned */
        pb_info_init(&good, "good");
        pb_info_init(&bad, "bad");
        bad.tensor.t.n_strides = 1;
        dlxp__info__init(&empty);
        dlxp__list_reply__init(&list);
        pb_reply_body(&r, 501, "list", &list);
        ptrs[0] = &good.info;
        ptrs[1] = &good.info;
        ptrs[2] = &bad.info;
        list.entries = ptrs;
        list.n_entries = 3;
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        ck_assert_ptr_null(out.list.entries);
        ptrs[2] = &empty; /* no tensor */
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        ck_assert_ptr_null(out.list.entries);
        ptrs[2] = &good.info;
        list.next = bin("a\0", 2);
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        ck_assert_ptr_null(out.list.entries);

        /* acquire replies are validated like publish requests */
        dlxp__acquire_reply__init(&acq);
        pb_reply_body(&r, 502, "acquire", &acq);
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL); /* no tensor */
        pb_tensor_init(&t, "x", DLX_MAX_NDIM);
        acq.tensor = &t.t;
        ck_assert_int_eq(decode_pb_reply(&r, &out), 0);
        pb_tensor_init(&t, "x", DLX_MAX_NDIM + 1);
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        pb_tensor_init(&t, "x/../y", 1);
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        pb_tensor_init(&t, "x", 1);
        t.dtype.code = 300;
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        pb_tensor_init(&t, "x", 1);
        t.shape[0] = -2;
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        ck_assert_uint_eq(out.id, 502);

        /* stat without info */
        dlxp__stat_reply__init(&stat);
        pb_reply_body(&r, 503, "stat", &stat);
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        /* the rank limit protects the fixed arrays: stat and list tensors too */
        struct pb_info deep;
        pb_info_init(&deep, "deep");
        deep.tensor.t.n_shape = deep.tensor.t.n_strides = DLX_MAX_NDIM;
        stat.info = &deep.info;
        ck_assert_int_eq(decode_pb_reply(&r, &out), 0);
        ck_assert_int_eq(out.stat.info.tensor.ndim, DLX_MAX_NDIM);
        deep.tensor.t.n_shape = deep.tensor.t.n_strides = DLX_MAX_NDIM + 1;
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        ptrs[0] = &deep.info;
        list.n_entries = 1;
        list.next = bin("", 0);
        r.body_case = DLXP__REPLY__BODY_LIST;
        r.list = &list;
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        ck_assert_ptr_null(out.list.entries);

        /* event names */
        dlxp__event__init(&event);
        pb_reply_body(&r, 0, "event", &event);
        event.kind = DLXP__EVENT__KIND__RELEASED;
        event.name = bin("a\0b", 3);
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        char longest[DLX_NAME_MAX + 1];
        memset(longest, 'l', sizeof(longest));
        event.name = bin(longest, DLX_NAME_MAX + 1);
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        event.name = bin(longest, DLX_NAME_MAX);
        ck_assert_int_eq(decode_pb_reply(&r, &out), 0);
        ck_assert_int_eq(out.event.kind, WIRE_EVENT_RELEASED);
}
END_TEST

/*
 * Stat and list replies describe tensors just as acquire replies do; the
 * header promises decode validates names, dims and dtypes, so a descriptor
 * an acquire reply would be refused for must be refused here too.
 */
START_TEST(test_decode_info_tensor_validated)
{
        struct pb_info info;
        Dlxp__Info *ptrs[1];
        Dlxp__Reply r;
        Dlxp__StatReply stat;
        Dlxp__ListReply list;
        struct wire_reply out;

        dlxp__stat_reply__init(&stat);
        pb_reply_body(&r, 504, "stat", &stat);
        stat.info = &info.info;
        pb_info_init(&info, "ok");
        ck_assert_int_eq(decode_pb_reply(&r, &out), 0);
        pb_info_init(&info, "../escape");
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        pb_info_init(&info, "ok");
        info.tensor.shape[0] = -5;
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);
        pb_info_init(&info, "ok");
        info.tensor.dtype.code = kDLOpaqueHandle;
        ck_assert_int_eq(decode_pb_reply(&r, &out), -EINVAL);

        dlxp__list_reply__init(&list);
        pb_reply_body(&r, 505, "list", &list);
        ptrs[0] = &info.info;
        list.entries = ptrs;
        list.n_entries = 1;
        pb_info_init(&info, "a\x01");
        int rc = decode_pb_reply(&r, &out);
        wire_reply_done(&out);
        ck_assert_int_eq(rc, -EINVAL);
}
END_TEST

/* ---- fuzz --------------------------------------------------------------------------------- */

struct corpus {
        uint8_t *buf[32];
        size_t len[32];
        int n;
};

static void corpus_add_request(struct corpus *c, const struct wire_request *q)
{
        ck_assert_int_lt(c->n, 32);
        c->buf[c->n] = encode_request(q, &c->len[c->n]);
        c->n++;
}

static void corpus_add_reply(struct corpus *c, const struct wire_reply *p)
{
        ck_assert_int_lt(c->n, 32);
        c->buf[c->n] = encode_reply(p, &c->len[c->n]);
        c->n++;
}

static void corpus_free(struct corpus *c)
{
        for (int i = 0; i < c->n; i++)
                free(c->buf[i]);
}

/* One to four edits: bit flips, byte overwrites, truncation, insertion, deletion. */
static size_t mutate(uint64_t *rng, const uint8_t *src, size_t len, uint8_t *dst, size_t cap)
{
        size_t n = len;
        int edits = 1 + (int)rng_below(rng, 4);

        memcpy(dst, src, len);
        for (int e = 0; e < edits; e++) {
                switch (rng_below(rng, 6)) {
                case 0:
                case 1:
                        if (n)
                                dst[rng_below(rng, n)] ^= (uint8_t)(1u << rng_below(rng, 8));
                        break;
                case 2:
                        if (n)
                                dst[rng_below(rng, n)] = (uint8_t)rng_next(rng);
                        break;
                case 3:
                        n = (size_t)rng_below(rng, n + 1);
                        break;
                case 4:
                        if (n < cap) {
                                size_t at = (size_t)rng_below(rng, n + 1);
                                memmove(dst + at + 1, dst + at, n - at);
                                dst[at] = (uint8_t)rng_next(rng);
                                n++;
                        }
                        break;
                default:
                        if (n) {
                                size_t at = (size_t)rng_below(rng, n);
                                memmove(dst + at, dst + at + 1, n - at - 1);
                                n--;
                        }
                        break;
                }
        }
        return n;
}

/* The corpus of test_fuzz_requests after its two publishes. */
static const struct wire_request fuzz_requests[] = {
        {REQ(2, HELLO), .hello = {.major = 1, .client_name = "fuzzer"}},
        {REQ(3, ACQUIRE), .acquire = {.name = "a/b/c", .timeout_ms = -1}},
        {REQ(4, LIST), .list = {"a/", "a/b", 3}},
        {REQ(5, WATCH), .watch.prefix = "w"},
        {REQ(6, STAT), .stat.name = "s"},
        {REQ(UINT64_MAX, PING), .ping.nonce = 77},
        {REQ(8, ALLOC), .alloc.size = 4096},
};

START_TEST(test_fuzz_requests)
{
        struct corpus c = {0};
        struct wire_request q, out, again;
        uint64_t rng = 0xf022ed0001ULL;
        uint8_t *mut;
        size_t cap = 0;
        int counts[3] = {0};

        memset(&q, 0, sizeof(q));
        q.id = 0x1234567;
        q.type = WIRE_REQ_PUBLISH;
        make_tensor(&q.publish.tensor, "fuzz/pub", 4);
        q.publish.token = 9;
        corpus_add_request(&c, &q);
        make_tensor(&q.publish.tensor, "fuzz/\xe5\x90\x8d", 1);
        corpus_add_request(&c, &q);
        for (size_t i = 0; i < N_ELEMS(fuzz_requests); i++)
                corpus_add_request(&c, &fuzz_requests[i]);
        for (int i = 0; i < c.n; i++)
                cap = c.len[i] + 8 > cap ? c.len[i] + 8 : cap;
        mut = malloc(cap);
        ck_assert_ptr_nonnull(mut);

        for (int iter = 0; iter < 20000; iter++) {
                int k = (int)rng_below(&rng, (uint64_t)c.n);
                size_t n = mutate(&rng, c.buf[k], c.len[k], mut, cap);
                char err[96];
                int rc;

                memset(err, 0x7e, sizeof(err));
                rc = wire_request_decode(mut, n, &out, err, sizeof(err));
                expect(rc == 0 || rc == -EPROTO || rc == -EINVAL, "iteration %d: rc %d", iter, rc);
                if (rc < 0) {
                        expect(memchr(err, 0, sizeof(err)) && err[0],
                               "iteration %d: no terminated reason", iter);
                        counts[rc == -EPROTO ? 1 : 2]++;
                        continue;
                }
                counts[0]++;
                /* whatever decodes must encode again and decode to the same thing */
                size_t n2;
                expect(out.id != 0, "iteration %d: id 0 accepted", iter);
                expect(wire_request_size(&out, &n2) == 0, "iteration %d: re-encode refused", iter);
                uint8_t *buf2 = malloc(n2 ? n2 : 1);
                ck_assert_ptr_nonnull(buf2);
                expect(wire_request_pack(&out, buf2) == n2, "iteration %d: pack size", iter);
                rc = wire_request_decode(buf2, n2, &again, NULL, 0);
                expect(rc == 0, "iteration %d: re-decode %d", iter, rc);
                expect(again.id == out.id && again.type == out.type, "iteration %d: changed", iter);
                free(buf2);
        }
        /* the mutations exercised every outcome */
        ck_assert_int_gt(counts[0], 100);
        ck_assert_int_gt(counts[1], 100);
        ck_assert_int_gt(counts[2], 100);
        free(mut);
        corpus_free(&c);
}
END_TEST

/* The corpus of test_fuzz_replies after its list, acquire and stat. */
static const struct wire_reply fuzz_replies[] = {
        {REP(0, EVENT), .event = {.kind = WIRE_EVENT_REPLACED, .name = "ev"}},
        {REP(4, HELLO), .hello.server = "dlxd 0.1.0"},
        {REP(5, NONE), .status = WIRE_INVALID, .error = "bad"},
        {REP(6, STATS), .stats.bytes = 1 << 20},
};

START_TEST(test_fuzz_replies)
{
        struct corpus c = {0};
        struct wire_info entries[3];
        struct wire_reply p, out;
        uint64_t rng = 0xf022ed0002ULL;
        uint8_t *mut;
        size_t cap = 0;

        for (uint32_t i = 0; i < 3; i++)
                make_info(&entries[i], i == 1 ? "l/\xc3\xbc" : "l/x", (int32_t)i + 1, i);
        reply_init(&p, 1, WIRE_REP_LIST);
        p.list.entries = entries;
        p.list.count = 3;
        snprintf(p.list.next, sizeof(p.list.next), "%s", "l/x");
        corpus_add_reply(&c, &p);
        reply_init(&p, 2, WIRE_REP_ACQUIRE);
        make_tensor(&p.acquire.tensor, "acq", 3);
        corpus_add_reply(&c, &p);
        reply_init(&p, 3, WIRE_REP_STAT);
        make_info(&p.stat.info, "st", 2, 7);
        corpus_add_reply(&c, &p);
        for (size_t i = 0; i < N_ELEMS(fuzz_replies); i++)
                corpus_add_reply(&c, &fuzz_replies[i]);
        for (int i = 0; i < c.n; i++)
                cap = c.len[i] + 8 > cap ? c.len[i] + 8 : cap;
        mut = malloc(cap);
        ck_assert_ptr_nonnull(mut);
        for (int iter = 0; iter < 20000; iter++) {
                int k = (int)rng_below(&rng, (uint64_t)c.n);
                size_t n = mutate(&rng, c.buf[k], c.len[k], mut, cap);
                int rc = wire_reply_decode(mut, n, &out, NULL, 0);

                expect(rc == 0 || rc == -EPROTO || rc == -EINVAL, "iteration %d: rc %d", iter, rc);
                if (rc == 0 && out.type == WIRE_REP_LIST)
                        expect(out.list.count == 0 || out.list.entries,
                               "iteration %d: %u entries, none allocated", iter, out.list.count);
                wire_reply_done(&out);
        }
        free(mut);
        corpus_free(&c);
}
END_TEST

Suite *wire_suite(void)
{
        Suite *s = suite_create("wire");
        TCase *tc = tcase_create("requests");

        tcase_add_rows(tc, request_round_trip_keeps_every_field, request_rows);
        tcase_add_test(tc, test_request_names_table);
        tcase_add_test(tc, test_storage_kinds_table);
        suite_add_tcase(s, tc);

        tc = tcase_create("replies");
        tcase_add_rows(tc, reply_round_trip_keeps_every_field, reply_rows);
        tcase_add_test(tc, test_reply_list);
        tcase_add_test(tc, test_reply_metrics);
        tcase_add_test(tc, test_reply_list_full_page);
        suite_add_tcase(s, tc);

        tc = tcase_create("status");
        tcase_add_test(tc, test_status_table);
        tcase_add_test(tc, test_status_unknown);
        suite_add_tcase(s, tc);

        tc = tcase_create("decode");
        tcase_add_rows(tc, decode_refuses_garbage_with_a_reason, garbage_rows);
        tcase_add_test(tc, test_decode_id_zero);
        tcase_add_test(tc, test_decode_no_body);
        tcase_add_rows(tc, decode_checks_each_tensor_field, tensor_rows);
        tcase_add_test(tc, test_decode_tensor_names);
        tcase_add_rows(tc, request_names_and_prefixes_refuse_bad_strings, named_rows);
        tcase_add_test(tc, test_decode_client_name);
        tcase_add_test(tc, test_decode_federation);
        tcase_add_test(tc, test_decode_list_page_limit);
        tcase_add_test(tc, test_forget_bounds);
        tcase_add_test(tc, test_decode_event_names);
        tcase_add_test(tc, test_decode_reply_rejections);
        tcase_add_test(tc, test_decode_info_tensor_validated);
        suite_add_tcase(s, tc);

        tc = tcase_create("encode");
        tcase_add_rows(tc, encode_refuses_an_invalid_request, encode_request_rows);
        tcase_add_rows(tc, encode_refuses_an_invalid_reply, encode_reply_rows);
        suite_add_tcase(s, tc);

        tc = tcase_create("fuzz");
        tcase_add_test(tc, test_fuzz_requests);
        tcase_add_test(tc, test_fuzz_replies);
        suite_add_tcase(s, tc);
        return s;
}
