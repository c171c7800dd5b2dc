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

static void request_roundtrip(const struct wire_request *q, struct wire_request *out)
{
        char err[128] = "";
        size_t n;
        uint8_t *buf = encode_request(q, &n);

        memset(out, 0x5a, sizeof(*out));
        ck_assert_msg(wire_request_decode(buf, n, out, err, sizeof(err)) == 0, "decode: %s", err);
        ck_assert_uint_eq(out->id, q->id);
        ck_assert_int_eq(out->type, q->type);
        free(buf);
}

static void reply_roundtrip(const struct wire_reply *p, struct wire_reply *out)
{
        char err[128] = "";
        size_t n;
        uint8_t *buf = encode_reply(p, &n);

        memset(out, 0x5a, sizeof(*out));
        ck_assert_msg(wire_reply_decode(buf, n, out, err, sizeof(err)) == 0, "decode: %s", err);
        ck_assert_uint_eq(out->id, p->id);
        ck_assert_int_eq(out->status, p->status);
        ck_assert_str_eq(out->error, p->error);
        ck_assert_int_eq(out->type, p->type);
        free(buf);
}

/* Packs a hand-built protobuf request; the caller frees. */
static uint8_t *pack_pb_request(const Dlxp__Request *r, size_t *ret_len)
{
        size_t n = dlxp__request__get_packed_size(r);
        uint8_t *buf = malloc(n ? n : 1);

        ck_assert_ptr_nonnull(buf);
        ck_assert_uint_eq(dlxp__request__pack(r, buf), n);
        *ret_len = n;
        return buf;
}

static uint8_t *pack_pb_reply(const Dlxp__Reply *r, size_t *ret_len)
{
        size_t n = dlxp__reply__get_packed_size(r);
        uint8_t *buf = malloc(n ? n : 1);

        ck_assert_ptr_nonnull(buf);
        ck_assert_uint_eq(dlxp__reply__pack(r, buf), n);
        *ret_len = n;
        return buf;
}

/* Decodes a hand-built request; checks the reason is written on failure. */
static int decode_pb_request(const Dlxp__Request *r, struct wire_request *out)
{
        char err[128];
        size_t n;
        uint8_t *buf = pack_pb_request(r, &n);
        int rc;

        err[0] = '\0';
        rc = wire_request_decode(buf, n, out, err, sizeof(err));
        if (rc < 0)
                ck_assert_msg(err[0] != '\0', "no reason given for %d", rc);
        free(buf);
        return rc;
}

static int decode_pb_reply(const Dlxp__Reply *r, struct wire_reply *out)
{
        char err[128];
        size_t n;
        uint8_t *buf = pack_pb_reply(r, &n);
        int rc;

        err[0] = '\0';
        rc = wire_reply_decode(buf, n, out, err, sizeof(err));
        if (rc < 0)
                ck_assert_msg(err[0] != '\0', "no reason given for %d", rc);
        free(buf);
        return rc;
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

/* A publish request around a protobuf tensor. */
struct pb_publish {
        Dlxp__Request r;
        Dlxp__Publish publish;
        struct pb_tensor tensor;
};

static void pb_publish_init(struct pb_publish *p, uint64_t id, const char *name, size_t ndim)
{
        dlxp__request__init(&p->r);
        dlxp__publish__init(&p->publish);
        pb_tensor_init(&p->tensor, name, ndim);
        p->publish.tensor = &p->tensor.t;
        p->r.id = id;
        p->r.body_case = DLXP__REQUEST__BODY_PUBLISH;
        p->r.publish = &p->publish;
}

/* ---- requests: round trips ---------------------------------------------------------------- */

START_TEST(test_request_hello)
{
        struct wire_request q, out;

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_HELLO;
        q.hello.major = DLX_PROTO_MAJOR;
        q.hello.minor = UINT32_MAX;
        q.hello.pid = -12345;
        memset(q.hello.client_name, 'c', DLX_CLIENT_NAME_MAX);
        q.hello.client_name[DLX_CLIENT_NAME_MAX] = '\0';
        request_roundtrip(&q, &out);
        ck_assert_uint_eq(out.hello.major, DLX_PROTO_MAJOR);
        ck_assert_uint_eq(out.hello.minor, UINT32_MAX);
        ck_assert_int_eq(out.hello.pid, -12345);
        ck_assert_str_eq(out.hello.client_name, q.hello.client_name);

        snprintf(q.hello.client_name, sizeof(q.hello.client_name), "%s", "");
        request_roundtrip(&q, &out);
        ck_assert_str_eq(out.hello.client_name, "");
}
END_TEST

START_TEST(test_request_publish)
{
        struct wire_request q, out;

        memset(&q, 0, sizeof(q));
        q.id = UINT64_MAX;
        q.type = WIRE_REQ_PUBLISH;
        make_tensor(&q.publish.tensor, "models/\xc3\xbc/w", 5);
        q.publish.persist = true;
        q.publish.token = UINT64_C(0xfeedfacecafebeef);
        request_roundtrip(&q, &out);
        expect_tensor_eq(&out.publish.tensor, &q.publish.tensor);
        ck_assert(out.publish.persist);
        ck_assert_uint_eq(out.publish.token, q.publish.token);

        /* 0-d, and the maximum rank */
        make_tensor(&q.publish.tensor, "scalar", 0);
        q.publish.persist = false;
        request_roundtrip(&q, &out);
        expect_tensor_eq(&out.publish.tensor, &q.publish.tensor);
        ck_assert(!out.publish.persist);
        make_tensor(&q.publish.tensor, "rank32", DLX_MAX_NDIM);
        request_roundtrip(&q, &out);
        expect_tensor_eq(&out.publish.tensor, &q.publish.tensor);
}
END_TEST

START_TEST(test_request_names)
{
        struct wire_request q, out;
        char longest[DLX_NAME_MAX + 1];

        memset(longest, 'n', DLX_NAME_MAX);
        longest[DLX_NAME_MAX] = '\0';

        memset(&q, 0, sizeof(q));
        q.id = 3;
        q.type = WIRE_REQ_ACQUIRE;
        snprintf(q.acquire.name, sizeof(q.acquire.name), "%s", longest);
        q.acquire.min_version = UINT64_MAX - 5;
        q.acquire.timeout_ms = -1;
        request_roundtrip(&q, &out);
        ck_assert_str_eq(out.acquire.name, longest);
        ck_assert_uint_eq(out.acquire.min_version, UINT64_MAX - 5);
        ck_assert_int_eq(out.acquire.timeout_ms, -1);
        q.acquire.timeout_ms = INT64_MAX;
        request_roundtrip(&q, &out);
        ck_assert_int_eq(out.acquire.timeout_ms, INT64_MAX);

        memset(&q, 0, sizeof(q));
        q.id = 5;
        q.type = WIRE_REQ_UNPUBLISH;
        snprintf(q.unpublish.name, sizeof(q.unpublish.name), "%s", "a/b");
        request_roundtrip(&q, &out);
        ck_assert_str_eq(out.unpublish.name, "a/b");

        memset(&q, 0, sizeof(q));
        q.id = 7;
        q.type = WIRE_REQ_STAT;
        snprintf(q.stat.name, sizeof(q.stat.name), "%s", "\xe5\x90\x8d");
        request_roundtrip(&q, &out);
        ck_assert_str_eq(out.stat.name, "\xe5\x90\x8d");

        memset(&q, 0, sizeof(q));
        q.id = 8;
        q.type = WIRE_REQ_LIST;
        snprintf(q.list.prefix, sizeof(q.list.prefix), "%s", "models/");
        snprintf(q.list.after, sizeof(q.list.after), "%s", "models/b");
        q.list.limit = DLX_LIST_PAGE_MAX;
        request_roundtrip(&q, &out);
        ck_assert_str_eq(out.list.prefix, "models/");
        ck_assert_str_eq(out.list.after, "models/b");
        ck_assert_uint_eq(out.list.limit, DLX_LIST_PAGE_MAX);
        memset(&q.list, 0, sizeof(q.list));
        request_roundtrip(&q, &out);
        ck_assert_str_eq(out.list.prefix, "");
        ck_assert_str_eq(out.list.after, "");
        ck_assert_uint_eq(out.list.limit, 0);

        memset(&q, 0, sizeof(q));
        q.id = 9;
        q.type = WIRE_REQ_WATCH;
        snprintf(q.watch.prefix, sizeof(q.watch.prefix), "%s", longest);
        request_roundtrip(&q, &out);
        ck_assert_str_eq(out.watch.prefix, longest);
        q.watch.prefix[0] = '\0';
        request_roundtrip(&q, &out);
        ck_assert_str_eq(out.watch.prefix, "");
}
END_TEST

START_TEST(test_request_scalars)
{
        struct wire_request q, out;

        memset(&q, 0, sizeof(q));
        q.id = 4;
        q.type = WIRE_REQ_RELEASE;
        q.release.lease = UINT64_MAX;
        request_roundtrip(&q, &out);
        ck_assert_uint_eq(out.release.lease, UINT64_MAX);

        memset(&q, 0, sizeof(q));
        q.id = 10;
        q.type = WIRE_REQ_UNWATCH;
        q.unwatch.watch = 0x1234;
        request_roundtrip(&q, &out);
        ck_assert_uint_eq(out.unwatch.watch, 0x1234);

        memset(&q, 0, sizeof(q));
        q.id = 11;
        q.type = WIRE_REQ_ALLOC;
        q.alloc.size = DLX_MAX_SEGMENT;
        request_roundtrip(&q, &out);
        ck_assert_uint_eq(out.alloc.size, DLX_MAX_SEGMENT);

        memset(&q, 0, sizeof(q));
        q.id = 12;
        q.type = WIRE_REQ_FREE;
        q.free.segment = 99;
        request_roundtrip(&q, &out);
        ck_assert_uint_eq(out.free.segment, 99);

        memset(&q, 0, sizeof(q));
        q.id = 13;
        q.type = WIRE_REQ_FORGET;
        q.forget.segments[0] = UINT64_MAX - 1;
        q.forget.segments[1] = 7;
        q.forget.count = 2;
        request_roundtrip(&q, &out);
        ck_assert_uint_eq(out.forget.count, 2);
        ck_assert_uint_eq(out.forget.segments[0], UINT64_MAX - 1);
        ck_assert_uint_eq(out.forget.segments[1], 7);

        memset(&q, 0, sizeof(q));
        q.id = 14;
        q.type = WIRE_REQ_STATS;
        request_roundtrip(&q, &out);

        memset(&q, 0, sizeof(q));
        q.id = 15;
        q.type = WIRE_REQ_PING;
        q.ping.nonce = UINT64_C(0xa5a5a5a5a5a5a5a5);
        request_roundtrip(&q, &out);
        ck_assert_uint_eq(out.ping.nonce, q.ping.nonce);
        /* zero values are not lost by proto3's defaults */
        q.ping.nonce = 0;
        request_roundtrip(&q, &out);
        ck_assert_uint_eq(out.ping.nonce, 0);
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

START_TEST(test_reply_status_only)
{
        struct wire_reply p, out;

        reply_init(&p, 77, WIRE_REP_NONE);
        p.status = WIRE_NOT_FOUND;
        snprintf(p.error, sizeof(p.error), "%s", "no tensor named 'x'");
        reply_roundtrip(&p, &out);
        wire_reply_done(&out);

        /* the longest error */
        memset(p.error, 'e', DLX_ERROR_MAX);
        p.error[DLX_ERROR_MAX] = '\0';
        p.status = WIRE_SHUTDOWN;
        reply_roundtrip(&p, &out);
        wire_reply_done(&out);

        /* an unknown status survives decode and maps to EPROTO */
        p.status = 99;
        p.error[0] = '\0';
        reply_roundtrip(&p, &out);
        ck_assert_int_eq(out.status, 99);
        ck_assert_int_eq(wire_status_errno(out.status), EPROTO);
}
END_TEST

START_TEST(test_reply_hello)
{
        struct wire_reply p, out;

        reply_init(&p, 1, WIRE_REP_HELLO);
        p.hello.major = DLX_PROTO_MAJOR;
        p.hello.minor = DLX_PROTO_MINOR + 3;
        p.hello.session = UINT64_MAX;
        snprintf(p.hello.server, sizeof(p.hello.server), "%s", "dlxd 0.1.0");
        p.hello.uid = 4294967294u;
        p.hello.max_frame = DLX_MAX_FRAME;
        p.hello.max_inflight = DLX_MAX_INFLIGHT;
        reply_roundtrip(&p, &out);
        ck_assert_uint_eq(out.hello.major, p.hello.major);
        ck_assert_uint_eq(out.hello.minor, p.hello.minor);
        ck_assert_uint_eq(out.hello.session, p.hello.session);
        ck_assert_str_eq(out.hello.server, "dlxd 0.1.0");
        ck_assert_uint_eq(out.hello.uid, p.hello.uid);
        ck_assert_uint_eq(out.hello.max_frame, DLX_MAX_FRAME);
        ck_assert_uint_eq(out.hello.max_inflight, DLX_MAX_INFLIGHT);
}
END_TEST

START_TEST(test_reply_publish_watch_alloc_pong)
{
        struct wire_reply p, out;

        reply_init(&p, 2, WIRE_REP_PUBLISH);
        p.publish.version = 41;
        p.publish.segment = UINT64_MAX;
        reply_roundtrip(&p, &out);
        ck_assert_uint_eq(out.publish.version, 41);
        ck_assert_uint_eq(out.publish.segment, UINT64_MAX);

        reply_init(&p, 3, WIRE_REP_WATCH);
        p.watch.watch = 12;
        reply_roundtrip(&p, &out);
        ck_assert_uint_eq(out.watch.watch, 12);

        reply_init(&p, 4, WIRE_REP_ALLOC);
        p.alloc.segment = 5;
        p.alloc.size = DLX_MAX_SEGMENT;
        reply_roundtrip(&p, &out);
        ck_assert_uint_eq(out.alloc.segment, 5);
        ck_assert_uint_eq(out.alloc.size, DLX_MAX_SEGMENT);

        reply_init(&p, 5, WIRE_REP_PONG);
        p.pong.nonce = UINT64_C(0x0123456789abcdef);
        reply_roundtrip(&p, &out);
        ck_assert_uint_eq(out.pong.nonce, p.pong.nonce);
}
END_TEST

START_TEST(test_reply_acquire)
{
        struct wire_reply p, out;

        reply_init(&p, 6, WIRE_REP_ACQUIRE);
        make_tensor(&p.acquire.tensor, "deep/tensor", DLX_MAX_NDIM);
        p.acquire.tensor.dtype.code = kDLFloat4_e2m1fn;
        p.acquire.tensor.dtype.bits = 4;
        p.acquire.tensor.dtype.lanes = 1;
        p.acquire.lease = UINT64_MAX - 2;
        p.acquire.segment_size = UINT64_C(1) << 36;
        p.acquire.writable = true;
        reply_roundtrip(&p, &out);
        ck_assert_int_eq(out.acquire.tensor.ndim, DLX_MAX_NDIM);
        expect_tensor_eq(&out.acquire.tensor, &p.acquire.tensor);
        ck_assert_uint_eq(out.acquire.lease, UINT64_MAX - 2);
        ck_assert_uint_eq(out.acquire.segment_size, UINT64_C(1) << 36);
        ck_assert(out.acquire.writable);

        p.acquire.writable = false;
        reply_roundtrip(&p, &out);
        ck_assert(!out.acquire.writable);
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
        reply_roundtrip(&p, &out);
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
        reply_roundtrip(&p, &out);
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
        reply_roundtrip(&p, &out);
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

START_TEST(test_reply_stat)
{
        struct wire_reply p, out;

        reply_init(&p, 10, WIRE_REP_STAT);
        make_info(&p.stat.info, "stat/me", 3, 5);
        memset(p.stat.info.producer_name, 'P', DLX_CLIENT_NAME_MAX);
        p.stat.info.producer_name[DLX_CLIENT_NAME_MAX] = '\0';
        reply_roundtrip(&p, &out);
        expect_info_eq(&out.stat.info, &p.stat.info);

        make_info(&p.stat.info, "stat/me", 0, 6);
        p.stat.info.producer_name[0] = '\0';
        reply_roundtrip(&p, &out);
        expect_info_eq(&out.stat.info, &p.stat.info);
}
END_TEST

START_TEST(test_reply_stats)
{
        struct wire_reply p, out;

        reply_init(&p, 11, WIRE_REP_STATS);
        p.stats.names = 1;
        p.stats.versions = 2;
        p.stats.leases = 3;
        p.stats.segments = 4;
        p.stats.bytes = UINT64_MAX;
        p.stats.max_bytes = UINT64_MAX - 1;
        p.stats.clients = 7;
        p.stats.max_clients = UINT32_MAX;
        p.stats.watchers = 9;
        p.stats.uptime_ms = 10;
        p.stats.requests = 11;
        p.stats.publishes = 12;
        p.stats.acquires = 13;
        reply_roundtrip(&p, &out);
        ck_assert_uint_eq(out.stats.names, 1);
        ck_assert_uint_eq(out.stats.versions, 2);
        ck_assert_uint_eq(out.stats.leases, 3);
        ck_assert_uint_eq(out.stats.segments, 4);
        ck_assert_uint_eq(out.stats.bytes, UINT64_MAX);
        ck_assert_uint_eq(out.stats.max_bytes, UINT64_MAX - 1);
        ck_assert_uint_eq(out.stats.clients, 7);
        ck_assert_uint_eq(out.stats.max_clients, UINT32_MAX);
        ck_assert_uint_eq(out.stats.watchers, 9);
        ck_assert_uint_eq(out.stats.uptime_ms, 10);
        ck_assert_uint_eq(out.stats.requests, 11);
        ck_assert_uint_eq(out.stats.publishes, 12);
        ck_assert_uint_eq(out.stats.acquires, 13);
}
END_TEST

START_TEST(test_reply_events)
{
        static const enum wire_event_kind kinds[] = {
                WIRE_EVENT_PUBLISHED, WIRE_EVENT_REPLACED,     WIRE_EVENT_UNPUBLISHED,
                WIRE_EVENT_RELEASED,  WIRE_EVENT_SEGMENT_GONE,
        };
        struct wire_reply p, out;

        for (size_t i = 0; i < N_ELEMS(kinds); i++) {
                reply_init(&p, 0, WIRE_REP_EVENT);
                p.event.kind = kinds[i];
                p.event.watch = 100 + i;
                snprintf(p.event.name, sizeof(p.event.name), "ev/%zu", i);
                p.event.version = 200 + i;
                p.event.token = UINT64_MAX - i;
                p.event.segment = 300 + i;
                reply_roundtrip(&p, &out);
                ck_assert_uint_eq(out.id, 0);
                ck_assert_int_eq(out.event.kind, kinds[i]);
                ck_assert_uint_eq(out.event.watch, 100 + i);
                ck_assert_str_eq(out.event.name, p.event.name);
                ck_assert_uint_eq(out.event.version, 200 + i);
                ck_assert_uint_eq(out.event.token, UINT64_MAX - i);
                ck_assert_uint_eq(out.event.segment, 300 + i);
        }
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
        };

        ck_assert_int_eq(WIRE_STATUS_COUNT, 18);
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

START_TEST(test_decode_garbage)
{
        static const struct {
                size_t len;
                const char *bytes;
        } cases[] = {
                {1, "\x0f"},     /* wire type 7 does not exist */
                {2, "\x08\xff"}, /* truncated varint id */
                {11, "\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"}, /* 11-byte varint */
                {3, "\x12\x50\x01"},                     /* hello longer than the buffer */
                {4, "\x08\x01\x7a\x05"},                 /* ping cut short */
                {2, "\x00\x00"},                         /* field number 0 */
                {4, "\x0a\x02\x01\x02"},                 /* id with the wrong wire type */
                {8, "\x08\x05\x12\x04\x1a\x05\x61\x62"}, /* client name overruns hello */
        };
        struct wire_request q;
        char err[64];

        for (size_t i = 0; i < N_ELEMS(cases); i++) {
                memset(&q, 0x5a, sizeof(q));
                err[0] = '\0';
                ck_assert_msg(wire_request_decode((const uint8_t *)cases[i].bytes, cases[i].len, &q,
                                                  err, sizeof(err)) == -EPROTO,
                              "case %zu not refused as garbage", i);
                ck_assert_uint_eq(q.id, 0);
                ck_assert_int_eq(q.type, WIRE_REQ_NONE);
                ck_assert_str_ne(err, "");
        }
        /* no room for a reason is fine */
        ck_assert_int_eq(wire_request_decode((const uint8_t *)"\x0f", 1, &q, NULL, 0), -EPROTO);
}
END_TEST

START_TEST(test_decode_id_zero)
{
        Dlxp__Request r;
        Dlxp__Ping ping;
        struct wire_request q;
        char err[64] = "";

        dlxp__request__init(&r);
        dlxp__ping__init(&ping);
        ping.nonce = 5;
        r.body_case = DLXP__REQUEST__BODY_PING;
        r.ping = &ping;
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
        size_t n;
        uint8_t *buf;
        uint8_t unknown[32];

        dlxp__request__init(&r);
        r.id = 42;
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 42);

        /* a body from a future protocol: field 99, unknown to this build */
        r.id = 43;
        buf = pack_pb_request(&r, &n);
        ck_assert_uint_le(n + 3, sizeof(unknown));
        memcpy(unknown, buf, n);
        unsigned tag = 99u << 3 | 2u; /* field 99, length-delimited: a two-byte varint */
        unknown[n] = (uint8_t)((tag & 0x7f) | 0x80);
        unknown[n + 1] = (uint8_t)(tag >> 7);
        unknown[n + 2] = 0; /* empty message */
        free(buf);
        memset(&q, 0x5a, sizeof(q));
        ck_assert_int_eq(wire_request_decode(unknown, n + 3, &q, NULL, 0), -EINVAL);
        ck_assert_uint_eq(q.id, 43);
}
END_TEST

START_TEST(test_decode_ndim)
{
        struct pb_publish p;
        struct wire_request q;

        pb_publish_init(&p, 50, "t", DLX_MAX_NDIM);
        ck_assert_int_eq(decode_pb_request(&p.r, &q), 0);
        ck_assert_int_eq(q.publish.tensor.ndim, DLX_MAX_NDIM);

        pb_publish_init(&p, 51, "t", DLX_MAX_NDIM + 1);
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 51);

        pb_publish_init(&p, 52, "t", DLX_MAX_NDIM + 2);
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 52);
}
END_TEST

START_TEST(test_decode_strides_count)
{
        struct pb_publish p;
        struct wire_request q;

        pb_publish_init(&p, 60, "t", 3);
        p.tensor.t.n_strides = 2;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 60);

        pb_publish_init(&p, 61, "t", 3);
        p.tensor.t.n_strides = 0; /* strides are always sent */
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);

        pb_publish_init(&p, 62, "t", 0);
        p.tensor.t.n_strides = 1;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);

        pb_publish_init(&p, 63, "t", 2);
        p.tensor.t.n_strides = 3;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
}
END_TEST

START_TEST(test_decode_tensor_fields)
{
        struct pb_publish p;
        struct wire_request q;

        pb_publish_init(&p, 70, "ok", 2);
        ck_assert_int_eq(decode_pb_request(&p.r, &q), 0);

        /* out-of-range dtype fields must not be truncated into valid ones */
        pb_publish_init(&p, 71, "t", 1);
        p.tensor.dtype.code = 256 + kDLFloat;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 71);
        pb_publish_init(&p, 72, "t", 1);
        p.tensor.dtype.bits = 256 + 32;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        pb_publish_init(&p, 73, "t", 1);
        p.tensor.dtype.lanes = 65536 + 1;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        pb_publish_init(&p, 74, "t", 1);
        p.tensor.dtype.code = UINT32_MAX;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        /* in range but not a shareable dtype */
        pb_publish_init(&p, 75, "t", 1);
        p.tensor.dtype.code = kDLOpaqueHandle;
        p.tensor.dtype.bits = 64;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        pb_publish_init(&p, 76, "t", 1);
        p.tensor.dtype.lanes = 0;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        pb_publish_init(&p, 77, "t", 1);
        p.tensor.dtype.bits = 7;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        /* the widest legal values */
        pb_publish_init(&p, 78, "t", 1);
        p.tensor.dtype.lanes = 65535;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), 0);
        ck_assert_uint_eq(q.publish.tensor.dtype.lanes, 65535);

        /* no dtype at all */
        pb_publish_init(&p, 79, "t", 1);
        p.tensor.t.dtype = NULL;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 79);

        /* negative dimension */
        pb_publish_init(&p, 80, "t", 3);
        p.tensor.shape[2] = -1;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        /* negative strides are fine */
        pb_publish_init(&p, 81, "t", 3);
        p.tensor.shape[1] = 4;
        p.tensor.strides[1] = -1;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), 0);
        ck_assert_int_eq(q.publish.tensor.strides[1], -1);

        /* publish without a tensor */
        pb_publish_init(&p, 82, "t", 1);
        p.publish.tensor = NULL;
        ck_assert_int_eq(decode_pb_request(&p.r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 82);
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
struct pb_named {
        Dlxp__Request r;
        Dlxp__Acquire acquire;
        Dlxp__Stat stat;
        Dlxp__Unpublish unpublish;
        Dlxp__List list;
        Dlxp__Watch watch;
};

static void pb_named_init(struct pb_named *p, int which, ProtobufCBinaryData name)
{
        dlxp__request__init(&p->r);
        p->r.id = 300 + (uint64_t)which;
        switch (which) {
        case 0:
                dlxp__acquire__init(&p->acquire);
                p->acquire.name = name;
                p->r.body_case = DLXP__REQUEST__BODY_ACQUIRE;
                p->r.acquire = &p->acquire;
                break;
        case 1:
                dlxp__stat__init(&p->stat);
                p->stat.name = name;
                p->r.body_case = DLXP__REQUEST__BODY_STAT;
                p->r.stat = &p->stat;
                break;
        case 2:
                dlxp__unpublish__init(&p->unpublish);
                p->unpublish.name = name;
                p->r.body_case = DLXP__REQUEST__BODY_UNPUBLISH;
                p->r.unpublish = &p->unpublish;
                break;
        case 3:
                dlxp__list__init(&p->list);
                p->list.prefix = name;
                p->r.body_case = DLXP__REQUEST__BODY_LIST;
                p->r.list = &p->list;
                break;
        case 4:
                dlxp__list__init(&p->list);
                p->list.after = name;
                p->r.body_case = DLXP__REQUEST__BODY_LIST;
                p->r.list = &p->list;
                break;
        default:
                dlxp__watch__init(&p->watch);
                p->watch.prefix = name;
                p->r.body_case = DLXP__REQUEST__BODY_WATCH;
                p->r.watch = &p->watch;
                break;
        }
}

START_TEST(test_decode_request_names)
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
        char longest[DLX_NAME_MAX + 1];
        struct pb_named p;
        struct wire_request q;

        memset(longest, 'y', sizeof(longest));
        for (int which = 0; which < 6; which++) {
                bool is_name = which < 3;

                for (size_t i = 0; i < N_ELEMS(bad_both); i++) {
                        pb_named_init(&p, which, str(bad_both[i]));
                        ck_assert_msg(decode_pb_request(&p.r, &q) == -EINVAL,
                                      "body %d: bad string #%zu accepted", which, i);
                        ck_assert_uint_eq(q.id, 300 + (uint64_t)which);
                }
                for (size_t i = 0; i < N_ELEMS(bad_name); i++) {
                        pb_named_init(&p, which, str(bad_name[i]));
                        ck_assert_msg(decode_pb_request(&p.r, &q) == (is_name ? -EINVAL : 0),
                                      "body %d: '%s'", which, bad_name[i]);
                }
                pb_named_init(&p, which, bin("a\0b", 3));
                ck_assert_msg(decode_pb_request(&p.r, &q) == -EINVAL, "body %d: NUL", which);
                pb_named_init(&p, which, bin(longest, DLX_NAME_MAX));
                ck_assert_msg(decode_pb_request(&p.r, &q) == 0, "body %d: 255 bytes", which);
                pb_named_init(&p, which, bin(longest, DLX_NAME_MAX + 1));
                ck_assert_msg(decode_pb_request(&p.r, &q) == -EINVAL, "body %d: 256 bytes", which);
                ck_assert_uint_eq(q.id, 300 + (uint64_t)which);
        }
}
END_TEST

START_TEST(test_decode_client_name)
{
        Dlxp__Request r;
        Dlxp__Hello hello;
        struct wire_request q;
        char name[DLX_CLIENT_NAME_MAX + 1];

        dlxp__request__init(&r);
        dlxp__hello__init(&hello);
        r.id = 400;
        r.body_case = DLXP__REQUEST__BODY_HELLO;
        r.hello = &hello;
        hello.major = 1;

        memset(name, 'k', sizeof(name));
        hello.client_name = bin(name, DLX_CLIENT_NAME_MAX);
        ck_assert_int_eq(decode_pb_request(&r, &q), 0);
        ck_assert_uint_eq(strlen(q.hello.client_name), DLX_CLIENT_NAME_MAX);
        hello.client_name = bin(name, DLX_CLIENT_NAME_MAX + 1);
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        ck_assert_uint_eq(q.id, 400);
        hello.client_name = str("\x01"
                                "abc");
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        hello.client_name = str("tab\there");
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        hello.client_name = str("del\x7f");
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        hello.client_name = str("\xc2\x9b");
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        hello.client_name = str("bad\xc3");
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        hello.client_name = bin("a\0", 2);
        ck_assert_int_eq(decode_pb_request(&r, &q), -EINVAL);
        hello.client_name = str("python3 / trainer \xe2\x9c\x93");
        ck_assert_int_eq(decode_pb_request(&r, &q), 0);
        ck_assert_str_eq(q.hello.client_name, "python3 / trainer \xe2\x9c\x93");
}
END_TEST

/* ---- encode refusals ---------------------------------------------------------------------- */

START_TEST(test_encode_refuses)
{
        struct wire_request q;
        size_t n = 12345;
        uint8_t buf[64];

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_ACQUIRE;
        memset(q.acquire.name, 'a', sizeof(q.acquire.name)); /* unterminated */
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);
        ck_assert_uint_eq(n, 12345);
        ck_assert_uint_eq(wire_request_pack(&q, buf), 0);

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_HELLO;
        memset(q.hello.client_name, 'c', sizeof(q.hello.client_name));
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_LIST;
        memset(q.list.after, 'z', sizeof(q.list.after));
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);
        memset(&q.list, 0, sizeof(q.list));
        memset(q.list.prefix, 'z', sizeof(q.list.prefix));
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_STAT;
        memset(q.stat.name, 's', sizeof(q.stat.name));
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_UNPUBLISH;
        memset(q.unpublish.name, 'u', sizeof(q.unpublish.name));
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_WATCH;
        memset(q.watch.prefix, 'w', sizeof(q.watch.prefix));
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_PUBLISH;
        make_tensor(&q.publish.tensor, "t", 1);
        q.publish.tensor.ndim = DLX_MAX_NDIM + 1;
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);
        ck_assert_uint_eq(wire_request_pack(&q, buf), 0);
        q.publish.tensor.ndim = -1;
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);
        q.publish.tensor.ndim = 1;
        memset(q.publish.tensor.name, 'n', sizeof(q.publish.tensor.name));
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);

        memset(&q, 0, sizeof(q));
        q.id = 1;
        q.type = WIRE_REQ_NONE;
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);
        q.type = WIRE_REQ_COUNT;
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);
        q.type = (enum wire_request_type)99;
        ck_assert_int_eq(wire_request_size(&q, &n), -EINVAL);
        ck_assert_uint_eq(n, 12345);
}
END_TEST

START_TEST(test_encode_reply_refuses)
{
        struct wire_reply p;
        struct wire_info entry;
        size_t n = 12345;

        reply_init(&p, 1, WIRE_REP_NONE);
        memset(p.error, 'e', sizeof(p.error));
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);

        reply_init(&p, 1, WIRE_REP_HELLO);
        memset(p.hello.server, 's', sizeof(p.hello.server));
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);

        reply_init(&p, 1, WIRE_REP_EVENT);
        memset(p.event.name, 'e', sizeof(p.event.name));
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);

        reply_init(&p, 1, WIRE_REP_ACQUIRE);
        make_tensor(&p.acquire.tensor, "t", 1);
        p.acquire.tensor.ndim = DLX_MAX_NDIM + 1;
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);

        reply_init(&p, 1, WIRE_REP_LIST);
        memset(p.list.next, 'x', sizeof(p.list.next));
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);

        reply_init(&p, 1, WIRE_REP_LIST);
        make_info(&entry, "e", 1, 1);
        memset(entry.tensor.name, 'x', sizeof(entry.tensor.name));
        p.list.entries = &entry;
        p.list.count = 1;
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);

        reply_init(&p, 1, WIRE_REP_STAT);
        make_info(&p.stat.info, "s", 1, 1);
        memset(p.stat.info.tensor.name, 'x', sizeof(p.stat.info.tensor.name));
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);

        reply_init(&p, 1, (enum wire_reply_type)99);
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);
        ck_assert_uint_eq(n, 12345);
}
END_TEST

/*
 * A stat reply whose tensor has more dims than the wire allows must be
 * refused like an acquire reply's, not packed from a half-built message.
 */
START_TEST(test_encode_stat_reply_ndim)
{
        struct wire_reply p;
        size_t n = 12345;

        reply_init(&p, 1, WIRE_REP_STAT);
        make_info(&p.stat.info, "s", 1, 1);
        p.stat.info.tensor.ndim = DLX_MAX_NDIM + 1;
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);
        p.stat.info.tensor.ndim = -1;
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);
        ck_assert_uint_eq(n, 12345);
}
END_TEST

START_TEST(test_encode_list_reply_ndim)
{
        struct wire_info entries[2];
        struct wire_reply p;
        size_t n = 12345;

        make_info(&entries[0], "a", 1, 1);
        make_info(&entries[1], "b", 1, 2);
        entries[1].tensor.ndim = DLX_MAX_NDIM + 1;
        reply_init(&p, 1, WIRE_REP_LIST);
        p.list.entries = entries;
        p.list.count = 2;
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);
        ck_assert_uint_eq(n, 12345);
}
END_TEST

/* An unterminated producer name is "an unterminated string" like any other. */
START_TEST(test_encode_producer_name_unterminated)
{
        struct wire_reply p;
        size_t n = 12345;

        reply_init(&p, 1, WIRE_REP_STAT);
        make_info(&p.stat.info, "s", 1, 1);
        memset(p.stat.info.producer_name, 'p', sizeof(p.stat.info.producer_name));
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);
        ck_assert_uint_eq(n, 12345);
}
END_TEST

/* The same in a list entry on the heap, filled to the end of its allocation. */
START_TEST(test_encode_list_producer_name_unterminated)
{
        struct wire_reply p;
        struct wire_info *entry = malloc(sizeof(*entry));
        size_t n = 12345;

        ck_assert_ptr_nonnull(entry);
        make_info(entry, "e", 1, 1);
        memset(entry->producer_name, 'p',
               sizeof(*entry) - offsetof(struct wire_info, producer_name));
        reply_init(&p, 1, WIRE_REP_LIST);
        p.list.entries = entry;
        p.list.count = 1;
        ck_assert_int_eq(wire_reply_size(&p, &n), -EINVAL);
        ck_assert_uint_eq(n, 12345);
        free(entry);
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
        dlxp__request__init(&r);
        dlxp__forget__init(&f);
        r.id = 9;
        r.body_case = DLXP__REQUEST__BODY_FORGET;
        r.forget = &f;
        f.segments = segs;

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

        dlxp__reply__init(&r);
        dlxp__event__init(&ev);
        r.id = 0;
        r.body_case = DLXP__REPLY__BODY_EVENT;
        r.event = &ev;
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
        dlxp__reply__init(&r);
        dlxp__list_reply__init(&list);
        r.id = 500;
        r.body_case = DLXP__REPLY__BODY_LIST;
        r.list = &list;
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

        /* garbage */
        ck_assert_int_eq(wire_reply_decode((const uint8_t *)"\x0f", 1, &out, NULL, 0), -EPROTO);
        ck_assert_int_eq(wire_reply_decode((const uint8_t *)"\x08\xff", 2, &out, NULL, 0), -EPROTO);

        /* a list whose last entry is bad: nothing leaks, nothing is returned */
        pb_info_init(&good, "good");
        pb_info_init(&bad, "bad");
        bad.tensor.t.n_strides = 1;
        dlxp__info__init(&empty);
        dlxp__reply__init(&r);
        dlxp__list_reply__init(&list);
        r.id = 501;
        r.body_case = DLXP__REPLY__BODY_LIST;
        r.list = &list;
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
        dlxp__reply__init(&r);
        dlxp__acquire_reply__init(&acq);
        r.id = 502;
        r.body_case = DLXP__REPLY__BODY_ACQUIRE;
        r.acquire = &acq;
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
        dlxp__reply__init(&r);
        dlxp__stat_reply__init(&stat);
        r.id = 503;
        r.body_case = DLXP__REPLY__BODY_STAT;
        r.stat = &stat;
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
        dlxp__reply__init(&r);
        dlxp__event__init(&event);
        r.body_case = DLXP__REPLY__BODY_EVENT;
        r.event = &event;
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

        dlxp__reply__init(&r);
        dlxp__stat_reply__init(&stat);
        r.id = 504;
        r.body_case = DLXP__REPLY__BODY_STAT;
        r.stat = &stat;
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

        dlxp__reply__init(&r);
        dlxp__list_reply__init(&list);
        r.id = 505;
        r.body_case = DLXP__REPLY__BODY_LIST;
        r.list = &list;
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
        memset(&q, 0, sizeof(q));
        q.id = 2;
        q.type = WIRE_REQ_HELLO;
        q.hello.major = 1;
        snprintf(q.hello.client_name, sizeof(q.hello.client_name), "%s", "fuzzer");
        corpus_add_request(&c, &q);
        memset(&q, 0, sizeof(q));
        q.id = 3;
        q.type = WIRE_REQ_ACQUIRE;
        snprintf(q.acquire.name, sizeof(q.acquire.name), "%s", "a/b/c");
        q.acquire.timeout_ms = -1;
        corpus_add_request(&c, &q);
        memset(&q, 0, sizeof(q));
        q.id = 4;
        q.type = WIRE_REQ_LIST;
        snprintf(q.list.prefix, sizeof(q.list.prefix), "%s", "a/");
        snprintf(q.list.after, sizeof(q.list.after), "%s", "a/b");
        q.list.limit = 3;
        corpus_add_request(&c, &q);
        memset(&q, 0, sizeof(q));
        q.id = 5;
        q.type = WIRE_REQ_WATCH;
        snprintf(q.watch.prefix, sizeof(q.watch.prefix), "%s", "w");
        corpus_add_request(&c, &q);
        memset(&q, 0, sizeof(q));
        q.id = 6;
        q.type = WIRE_REQ_STAT;
        snprintf(q.stat.name, sizeof(q.stat.name), "%s", "s");
        corpus_add_request(&c, &q);
        memset(&q, 0, sizeof(q));
        q.id = UINT64_MAX;
        q.type = WIRE_REQ_PING;
        q.ping.nonce = 77;
        corpus_add_request(&c, &q);
        memset(&q, 0, sizeof(q));
        q.id = 8;
        q.type = WIRE_REQ_ALLOC;
        q.alloc.size = 4096;
        corpus_add_request(&c, &q);

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
        reply_init(&p, 0, WIRE_REP_EVENT);
        p.event.kind = WIRE_EVENT_REPLACED;
        snprintf(p.event.name, sizeof(p.event.name), "%s", "ev");
        corpus_add_reply(&c, &p);
        reply_init(&p, 4, WIRE_REP_HELLO);
        snprintf(p.hello.server, sizeof(p.hello.server), "%s", "dlxd 0.1.0");
        corpus_add_reply(&c, &p);
        reply_init(&p, 5, WIRE_REP_NONE);
        p.status = WIRE_INVALID;
        snprintf(p.error, sizeof(p.error), "%s", "bad");
        corpus_add_reply(&c, &p);
        reply_init(&p, 6, WIRE_REP_STATS);
        p.stats.bytes = 1 << 20;
        corpus_add_reply(&c, &p);

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

        tcase_add_test(tc, test_request_hello);
        tcase_add_test(tc, test_request_publish);
        tcase_add_test(tc, test_request_names);
        tcase_add_test(tc, test_request_scalars);
        tcase_add_test(tc, test_request_names_table);
        tcase_add_test(tc, test_storage_kinds_table);
        suite_add_tcase(s, tc);

        tc = tcase_create("replies");
        tcase_add_test(tc, test_reply_status_only);
        tcase_add_test(tc, test_reply_hello);
        tcase_add_test(tc, test_reply_publish_watch_alloc_pong);
        tcase_add_test(tc, test_reply_acquire);
        tcase_add_test(tc, test_reply_list);
        tcase_add_test(tc, test_reply_list_full_page);
        tcase_add_test(tc, test_reply_stat);
        tcase_add_test(tc, test_reply_stats);
        tcase_add_test(tc, test_reply_events);
        suite_add_tcase(s, tc);

        tc = tcase_create("status");
        tcase_add_test(tc, test_status_table);
        tcase_add_test(tc, test_status_unknown);
        suite_add_tcase(s, tc);

        tc = tcase_create("decode");
        tcase_add_test(tc, test_decode_garbage);
        tcase_add_test(tc, test_decode_id_zero);
        tcase_add_test(tc, test_decode_no_body);
        tcase_add_test(tc, test_decode_ndim);
        tcase_add_test(tc, test_decode_strides_count);
        tcase_add_test(tc, test_decode_tensor_fields);
        tcase_add_test(tc, test_decode_tensor_names);
        tcase_add_test(tc, test_decode_request_names);
        tcase_add_test(tc, test_decode_client_name);
        tcase_add_test(tc, test_decode_list_page_limit);
        tcase_add_test(tc, test_forget_bounds);
        tcase_add_test(tc, test_decode_event_names);
        tcase_add_test(tc, test_decode_reply_rejections);
        tcase_add_test(tc, test_decode_info_tensor_validated);
        suite_add_tcase(s, tc);

        tc = tcase_create("encode");
        tcase_add_test(tc, test_encode_refuses);
        tcase_add_test(tc, test_encode_reply_refuses);
        tcase_add_test(tc, test_encode_stat_reply_ndim);
        tcase_add_test(tc, test_encode_list_reply_ndim);
        tcase_add_test(tc, test_encode_producer_name_unterminated);
        tcase_add_test(tc, test_encode_list_producer_name_unterminated);
        suite_add_tcase(s, tc);

        tc = tcase_create("fuzz");
        tcase_add_test(tc, test_fuzz_requests);
        tcase_add_test(tc, test_fuzz_replies);
        suite_add_tcase(s, tc);
        return s;
}
