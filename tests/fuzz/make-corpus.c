/* SPDX-License-Identifier: MIT */
/*
 * Writes the seed corpus of a fuzz target from valid traffic: every request
 * and reply type as wire.c encodes it (fuzz-request), the same framed and fed
 * in pieces with descriptors (fuzz-frame), and whole conversations of three
 * clients with a daemon (fuzz-session): publish, acquire, release through
 * frames and through the ring, replace, unpublish, list pages, watch events,
 * waiting acquires, alloc/free/forget, CUDA kinds, persist, errors; and group
 * segments as libdlx lays them out (fuzz-group).
 *
 * Usage: make-corpus frame|request|session|group DIR   (DIR is created if missing)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frame.h"
#include "fuzz.h"
#include "group.h"
#include "layout.h"
#include "pbwrite.h"
#include "ring.h"
#include "wire.h"

struct buf {
        uint8_t *p;
        size_t len, cap;
};

static const char *out_dir;
static unsigned nfiles;

static void die(const char *what)
{
        fprintf(stderr, "make-corpus: %s: %s\n", what, strerror(errno));
        exit(1);
}

static void put(struct buf *b, const void *data, size_t n)
{
        if (b->len + n > b->cap) {
                size_t cap = b->cap ? b->cap : 256;
                while (cap < b->len + n)
                        cap *= 2;
                b->p = realloc(b->p, cap);
                if (!b->p)
                        die("realloc");
                b->cap = cap;
        }
        memcpy(b->p + b->len, data, n);
        b->len += n;
}

static void put_u8(struct buf *b, uint8_t v)
{
        put(b, &v, 1);
}

static void put_u16(struct buf *b, uint16_t v)
{
        put_u8(b, (uint8_t)v);
        put_u8(b, (uint8_t)(v >> 8));
}

static void put_u32(struct buf *b, uint32_t v)
{
        put_u16(b, (uint16_t)v);
        put_u16(b, (uint16_t)(v >> 16));
}

static void save(const char *name, struct buf *b)
{
        char path[4096];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", out_dir, name);
        f = fopen(path, "wb");
        if (!f || (b->len && fwrite(b->p, 1, b->len, f) != b->len) || fclose(f) != 0)
                die(path);
        free(b->p);
        memset(b, 0, sizeof(*b));
        nfiles++;
}

/* ---- messages -------------------------------------------------------------------------------- */

static uint64_t next_id = 1;

static struct wire_request *req(enum wire_request_type type)
{
        static struct wire_request q;

        memset(&q, 0, sizeof(q));
        q.id = next_id++;
        q.type = type;
        return &q;
}

static struct buf pack_request(const struct wire_request *q)
{
        struct buf b = {0};
        size_t size;

        if (wire_request_size(q, &size) < 0) {
                fprintf(stderr, "make-corpus: a %s request does not encode\n",
                        wire_request_name(q->type));
                exit(1);
        }
        b.p = malloc(size ? size : 1);
        if (!b.p)
                die("malloc");
        b.cap = size;
        b.len = wire_request_pack(q, b.p);
        return b;
}

static struct buf pack_reply(const struct wire_reply *p)
{
        struct buf b = {0};
        size_t size;

        if (wire_reply_size(p, &size) < 0) {
                fprintf(stderr, "make-corpus: a reply of type %d does not encode\n", (int)p->type);
                exit(1);
        }
        b.p = malloc(size ? size : 1);
        if (!b.p)
                die("malloc");
        b.cap = size;
        b.len = wire_reply_pack(p, b.p);
        return b;
}

static void tensor(struct wire_tensor *t, const char *name, DLDataType dtype, int32_t ndim,
                   const int64_t *shape, uint32_t storage)
{
        uint64_t numel = 0;

        wire_strcpy(t->name, sizeof(t->name), name);
        t->dtype = dtype;
        t->ndim = ndim;
        if (ndim)
                memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
        layout_compact_strides(ndim, shape, t->strides);
        t->storage = storage;
        t->device_type = storage == WIRE_STORAGE_MEMFD       ? kDLCPU
                         : storage == WIRE_STORAGE_CUDA_HOST ? kDLCUDAHost
                                                             : kDLCUDA;
        layout_numel(ndim, shape, &numel);
        t->length = layout_compact_bytes(dtype, numel, 0);
}

static const DLDataType f32 = {kDLFloat, 32, 1};
static const int64_t shape48[2] = {4, 8};

static struct wire_request *hello(void)
{
        struct wire_request *q = req(WIRE_REQ_HELLO);

        q->hello.major = DLX_PROTO_MAJOR;
        q->hello.minor = DLX_PROTO_MINOR;
        q->hello.pid = 4242;
        wire_strcpy(q->hello.client_name, sizeof(q->hello.client_name), "fuzz-seed");
        return q;
}

/* A float32 4x8 memfd publish of name: with an fd attached, or from a held segment. */
static struct wire_request *publish(const char *name, uint64_t segment, uint64_t token)
{
        struct wire_request *q = req(WIRE_REQ_PUBLISH);

        tensor(&q->publish.tensor, name, f32, 2, shape48, WIRE_STORAGE_MEMFD);
        q->publish.tensor.segment = segment;
        q->publish.token = token;
        return q;
}

static struct wire_request *named(enum wire_request_type type, const char *name)
{
        struct wire_request *q = req(type);

        switch (type) {
        case WIRE_REQ_ACQUIRE:
                wire_strcpy(q->acquire.name, sizeof(q->acquire.name), name);
                break;
        case WIRE_REQ_UNPUBLISH:
                wire_strcpy(q->unpublish.name, sizeof(q->unpublish.name), name);
                break;
        case WIRE_REQ_STAT:
                wire_strcpy(q->stat.name, sizeof(q->stat.name), name);
                break;
        case WIRE_REQ_WATCH:
                wire_strcpy(q->watch.prefix, sizeof(q->watch.prefix), name);
                break;
        case WIRE_REQ_LIST:
                wire_strcpy(q->list.prefix, sizeof(q->list.prefix), name);
                break;
        case WIRE_REQ_TRACK:
                wire_strcpy(q->track.name, sizeof(q->track.name), name);
                break;
        default:
                break;
        }
        return q;
}

static struct wire_request *acquire(const char *name, uint64_t min_version, int64_t timeout_ms)
{
        struct wire_request *q = named(WIRE_REQ_ACQUIRE, name);

        q->acquire.min_version = min_version;
        q->acquire.timeout_ms = timeout_ms;
        return q;
}

static struct wire_request *with_u64(enum wire_request_type type, uint64_t v)
{
        struct wire_request *q = req(type);

        switch (type) {
        case WIRE_REQ_RELEASE:
                q->release.lease = v;
                break;
        case WIRE_REQ_UNWATCH:
                q->unwatch.watch = v;
                break;
        case WIRE_REQ_ALLOC:
                q->alloc.size = v;
                break;
        case WIRE_REQ_FREE:
                q->free.segment = v;
                break;
        case WIRE_REQ_PING:
                q->ping.nonce = v;
                break;
        case WIRE_REQ_FORGET:
                q->forget.count = 1;
                q->forget.segments[0] = v;
                break;
        case WIRE_REQ_UNTRACK:
                q->untrack.slot = (uint32_t)v;
                break;
        default:
                break;
        }
        return q;
}

/*
 * Every request type, and the tensor shapes worth having: one per call, in
 * order; *ret_fds is how many fds it is sent with. NULL after the last.
 */
static struct wire_request *sample_request(unsigned i, const char **ret_name, unsigned *ret_fds)
{
        static const int64_t big[3] = {2, 3, 5};
        static const int64_t thirteen[1] = {13};
        struct wire_request *q;

        *ret_fds = 0;
        switch (i) {
        case 0:
                *ret_name = "hello";
                return hello();
        case 1:
                *ret_name = "publish-fd";
                *ret_fds = 1;
                return publish("model/weights", 0, 7);
        case 2:
                *ret_name = "publish-held";
                return publish("model/held", 1, 0);
        case 3:
                *ret_name = "publish-hold";
                *ret_fds = 1;
                q = publish("model/hold", 0, 9);
                q->publish.hold = true;
                q->publish.persist = true;
                return q;
        case 4:
                *ret_name = "publish-cuda-ipc";
                q = publish("gpu/ipc", 0, 3);
                tensor(&q->publish.tensor, "gpu/ipc", f32, 2, shape48, WIRE_STORAGE_CUDA_IPC);
                q->publish.tensor.has_ipc_handle = true;
                memset(q->publish.tensor.ipc_handle, 0xab, DLX_CUDA_HANDLE);
                q->publish.tensor.has_event = true;
                memset(q->publish.tensor.event, 0xcd, DLX_CUDA_HANDLE);
                q->publish.segment_size = 1 << 20;
                return q;
        case 5:
                *ret_name = "publish-cuda-host";
                *ret_fds = 1;
                q = publish("gpu/host", 0, 4);
                tensor(&q->publish.tensor, "gpu/host", f32, 2, shape48, WIRE_STORAGE_CUDA_HOST);
                return q;
        case 6:
                *ret_name = "publish-scalar";
                *ret_fds = 1;
                q = publish("shape/scalar", 0, 0);
                tensor(&q->publish.tensor, "shape/scalar", (DLDataType){kDLInt, 64, 1}, 0, NULL,
                       WIRE_STORAGE_MEMFD);
                return q;
        case 7:
                *ret_name = "publish-strided";
                *ret_fds = 1;
                q = publish("shape/strided", 0, 0);
                tensor(&q->publish.tensor, "shape/strided", (DLDataType){kDLFloat, 64, 1}, 3, big,
                       WIRE_STORAGE_MEMFD);
                q->publish.tensor.strides[0] = -1;
                q->publish.tensor.strides[1] = 10;
                q->publish.tensor.strides[2] = 2;
                q->publish.tensor.byte_offset = 64;
                q->publish.tensor.offset = 128;
                q->publish.tensor.length = 1024;
                q->publish.tensor.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
                return q;
        case 8:
                *ret_name = "publish-bool1";
                *ret_fds = 1;
                q = publish("shape/bits", 0, 0);
                tensor(&q->publish.tensor, "shape/bits", (DLDataType){kDLBool, 1, 1}, 1, thirteen,
                       WIRE_STORAGE_MEMFD);
                return q;
        case 9:
                *ret_name = "publish-fp4x2";
                *ret_fds = 1;
                q = publish("shape/fp4", 0, 0);
                tensor(&q->publish.tensor, "shape/fp4", (DLDataType){kDLFloat4_e2m1fn, 4, 2}, 2,
                       shape48, WIRE_STORAGE_MEMFD);
                return q;
        case 10:
                *ret_name = "acquire";
                return acquire("model/weights", 0, 0);
        case 11:
                *ret_name = "acquire-wait";
                return acquire("model/weights", 2, 1);
        case 12:
                *ret_name = "acquire-forever";
                return acquire("model/later", 0, -1);
        case 13:
                *ret_name = "release";
                return with_u64(WIRE_REQ_RELEASE, 1);
        case 14:
                *ret_name = "release-event";
                q = with_u64(WIRE_REQ_RELEASE, 1);
                q->release.has_event = true;
                memset(q->release.event, 0x5a, DLX_CUDA_HANDLE);
                return q;
        case 15:
                *ret_name = "unpublish";
                return named(WIRE_REQ_UNPUBLISH, "model/weights");
        case 16:
                *ret_name = "list-page";
                q = named(WIRE_REQ_LIST, "model/");
                q->list.limit = 1;
                wire_strcpy(q->list.after, sizeof(q->list.after), "model/a");
                return q;
        case 17:
                *ret_name = "list-all";
                return named(WIRE_REQ_LIST, "");
        case 18:
                *ret_name = "stat";
                return named(WIRE_REQ_STAT, "model/weights");
        case 19:
                *ret_name = "watch";
                return named(WIRE_REQ_WATCH, "model/");
        case 20:
                *ret_name = "unwatch";
                return with_u64(WIRE_REQ_UNWATCH, 1);
        case 21:
                *ret_name = "alloc";
                return with_u64(WIRE_REQ_ALLOC, 4096);
        case 22:
                *ret_name = "alloc-vmm";
                *ret_fds = 1;
                q = with_u64(WIRE_REQ_ALLOC, 8192);
                q->alloc.storage = WIRE_STORAGE_CUDA_VMM;
                return q;
        case 23:
                *ret_name = "free";
                return with_u64(WIRE_REQ_FREE, 1);
        case 24:
                *ret_name = "forget";
                q = with_u64(WIRE_REQ_FORGET, 1);
                q->forget.count = 3;
                q->forget.segments[1] = 2;
                q->forget.segments[2] = 3;
                return q;
        case 25:
                *ret_name = "stats";
                return req(WIRE_REQ_STATS);
        case 26:
                *ret_name = "ping";
                return with_u64(WIRE_REQ_PING, 0x1122334455667788u);
        case 27:
                *ret_name = "bye";
                return req(WIRE_REQ_BYE);
        case 28:
                *ret_name = "track";
                return named(WIRE_REQ_TRACK, "model/weights");
        case 29:
                *ret_name = "untrack";
                return with_u64(WIRE_REQ_UNTRACK, 0);
        case 30:
                *ret_name = "mount";
                q = req(WIRE_REQ_MOUNT);
                wire_strcpy(q->mount.prefix, sizeof(q->mount.prefix), "@gpu3/");
                return q;
        case 31:
                *ret_name = "fetch-failed";
                q = req(WIRE_REQ_FETCH_FAILED);
                wire_strcpy(q->fetch_failed.name, sizeof(q->fetch_failed.name), "@gpu3/model/w");
                q->fetch_failed.min_version = 7;
                q->fetch_failed.status = WIRE_UNREACHABLE;
                wire_strcpy(q->fetch_failed.error, sizeof(q->fetch_failed.error),
                            "peer gpu3 lost during the pull");
                return q;
        case 32:
                *ret_name = "metrics";
                return req(WIRE_REQ_METRICS);
        default:
                return NULL;
        }
}

static void info(struct wire_info *in, const char *name)
{
        memset(in, 0, sizeof(*in));
        tensor(&in->tensor, name, f32, 2, shape48, WIRE_STORAGE_MEMFD);
        in->tensor.version = 3;
        in->tensor.segment = 2;
        in->owner_uid = 1000;
        in->producer_pid = 77;
        in->leases = 2;
        in->segment_size = 4096;
        in->live_versions = 2;
        wire_strcpy(in->producer_name, sizeof(in->producer_name), "producer");
}

/* Every reply type dlxd sends; NULL after the last. The reply owns no memory of its own. */
static struct wire_reply *sample_reply(unsigned i, const char **ret_name)
{
        static struct wire_reply p;
        static struct wire_info entries[2];
        static uint8_t events[2][DLX_CUDA_HANDLE];

        memset(&p, 0, sizeof(p));
        p.id = 1 + i;
        switch (i) {
        case 0:
                *ret_name = "hello";
                p.type = WIRE_REP_HELLO;
                p.hello.major = DLX_PROTO_MAJOR;
                p.hello.session = 5;
                wire_strcpy(p.hello.server, sizeof(p.hello.server), "dlxd " DLX_VERSION);
                p.hello.uid = 1000;
                p.hello.max_frame = DLX_MAX_FRAME;
                p.hello.max_inflight = DLX_MAX_INFLIGHT;
                p.hello.release_ring = true;
                return &p;
        case 1:
                *ret_name = "publish";
                p.type = WIRE_REP_PUBLISH;
                p.publish.version = 2;
                p.publish.segment = 3;
                return &p;
        case 2:
                *ret_name = "acquire";
                p.type = WIRE_REP_ACQUIRE;
                info(&entries[0], "model/weights");
                p.acquire.tensor = entries[0].tensor;
                p.acquire.lease = 9;
                p.acquire.segment_size = 4096;
                p.acquire.writable = true;
                return &p;
        case 3:
                *ret_name = "list";
                p.type = WIRE_REP_LIST;
                info(&entries[0], "model/a");
                info(&entries[1], "model/b");
                p.list.entries = entries;
                p.list.count = 2;
                wire_strcpy(p.list.next, sizeof(p.list.next), "model/b");
                return &p;
        case 4:
                *ret_name = "stat";
                p.type = WIRE_REP_STAT;
                info(&p.stat.info, "model/weights");
                return &p;
        case 5:
                *ret_name = "watch";
                p.type = WIRE_REP_WATCH;
                p.watch.watch = 4;
                return &p;
        case 6:
                *ret_name = "alloc";
                p.type = WIRE_REP_ALLOC;
                p.alloc.segment = 6;
                p.alloc.size = 4096;
                return &p;
        case 7:
                *ret_name = "stats";
                p.type = WIRE_REP_STATS;
                p.stats.names = 3;
                p.stats.versions = 4;
                p.stats.leases = 5;
                p.stats.segments = 2;
                p.stats.bytes = 8192;
                p.stats.max_bytes = 1 << 20;
                p.stats.clients = 2;
                p.stats.max_clients = 64;
                p.stats.uptime_ms = 1000;
                p.stats.requests = 99;
                return &p;
        case 8:
                *ret_name = "pong";
                p.type = WIRE_REP_PONG;
                p.pong.nonce = 0x1122334455667788u;
                return &p;
        case 9:
                *ret_name = "event-published";
                p.id = 0;
                p.type = WIRE_REP_EVENT;
                p.event.kind = WIRE_EVENT_PUBLISHED;
                p.event.watch = 1;
                wire_strcpy(p.event.name, sizeof(p.event.name), "model/weights");
                p.event.version = 1;
                return &p;
        case 10:
                *ret_name = "event-released";
                p.id = 0;
                p.type = WIRE_REP_EVENT;
                p.event.kind = WIRE_EVENT_RELEASED;
                wire_strcpy(p.event.name, sizeof(p.event.name), "model/weights");
                p.event.version = 1;
                p.event.token = 7;
                p.event.segment = 2;
                memset(events[0], 1, DLX_CUDA_HANDLE);
                memset(events[1], 2, DLX_CUDA_HANDLE);
                p.event.events = events;
                p.event.nevents = 2;
                return &p;
        case 11:
                *ret_name = "event-segment-gone";
                p.id = 0;
                p.type = WIRE_REP_EVENT;
                p.event.kind = WIRE_EVENT_SEGMENT_GONE;
                p.event.segment = 2;
                return &p;
        case 12:
                *ret_name = "error";
                p.status = WIRE_NOT_FOUND;
                wire_strcpy(p.error, sizeof(p.error), "no tensor named 'model/weights'");
                return &p;
        case 13:
                *ret_name = "segment";
                p.type = WIRE_REP_SEGMENT;
                p.segment.segment = 5;
                p.segment.size = 8192;
                return &p;
        case 14:
                *ret_name = "metrics";
                p.type = WIRE_REP_METRICS;
                p.metrics.text = (char *)"# TYPE dlx_names gauge\ndlx_names 2\n";
                p.metrics.len = (uint32_t)strlen(p.metrics.text);
                return &p;
        default:
                return NULL;
        }
}

/* ---- fuzz-request ---------------------------------------------------------------------------- */

static void corpus_request(void)
{
        const char *name;
        char file[64];
        unsigned nfds;
        struct wire_request *q;
        struct wire_reply *p;
        struct buf b;

        for (unsigned i = 0; (q = sample_request(i, &name, &nfds)); i++) {
                b = pack_request(q);
                snprintf(file, sizeof(file), "request-%s", name);
                save(file, &b);
        }
        for (unsigned i = 0; (p = sample_reply(i, &name)); i++) {
                b = pack_reply(p);
                snprintf(file, sizeof(file), "reply-%s", name);
                save(file, &b);
        }

        /*
         * Limits only big messages reach, which wire.c will not encode: a list
         * page of 513 (empty) entries and 4097 (empty) release events. Raw
         * protobuf: Reply.id = 1, Reply.list = 7 { entries = 1 }, Reply.event =
         * 13 { kind = 1, events = 7 }.
         */
        struct pb body, reply;
        pb_init(&body);
        pb_init(&reply);
        for (unsigned i = 0; i <= DLX_LIST_PAGE_MAX; i++)
                pb_bytes(&body, 1, "", 0);
        pb_uint(&reply, 1, 1);
        pb_msg(&reply, 7, &body);
        put(&b, reply.b, reply.n);
        save("reply-list-over-the-limit", &b);
        body.n = reply.n = 0;
        pb_uint(&body, 1, WIRE_EVENT_RELEASED);
        for (unsigned i = 0; i <= DLX_MAX_RELEASE_EVENTS; i++)
                pb_bytes(&body, 7, "", 0);
        pb_msg(&reply, 13, &body);
        put(&b, reply.b, reply.n);
        save("reply-events-over-the-limit", &b);
        pb_done(&body);
        pb_done(&reply);
}

/* ---- fuzz-frame ------------------------------------------------------------------------------ */

static void frame_bytes(struct buf *b, const uint8_t *p, size_t n)
{
        while (n > 0) {
                size_t take = n < 255 ? n : 255;
                put_u8(b, FRAME_OP_BYTES);
                put_u8(b, (uint8_t)take);
                put(b, p, take);
                p += take;
                n -= take;
        }
}

static void frame_fds(struct buf *b, unsigned n)
{
        put_u8(b, FRAME_OP_FDS);
        put_u8(b, (uint8_t)n);
}

static void frame_header(struct buf *b, uint32_t len, unsigned nfds)
{
        put_u8(b, FRAME_OP_HEADER);
        put_u32(b, len);
        put_u8(b, (uint8_t)nfds);
}

static void frame_repeat(struct buf *b, uint8_t value, uint32_t count)
{
        while (count > 0) {
                uint16_t take = count > 0xffff ? 0xffff : (uint16_t)count;
                put_u8(b, FRAME_OP_REPEAT);
                put_u8(b, value);
                put_u16(b, take);
                count -= take;
        }
}

static void corpus_frame(void)
{
        const char *name;
        char file[64];
        unsigned nfds;
        struct wire_request *q;
        struct buf b = {0}, all = {0}, payload;
        uint8_t hdr[FRAME_HEADER_SIZE];

        /* each request as its own frame: fds first, as they ride the first byte */
        for (unsigned i = 0; (q = sample_request(i, &name, &nfds)); i++) {
                payload = pack_request(q);
                if (nfds)
                        frame_fds(&b, nfds);
                frame_header(&b, (uint32_t)payload.len, nfds);
                frame_bytes(&b, payload.p, payload.len);
                snprintf(file, sizeof(file), "frame-%s", name);
                save(file, &b);
                /* and all of them in one stream of raw bytes, as a busy client sends */
                frame_header_put(hdr, (uint32_t)payload.len, nfds);
                if (nfds)
                        frame_fds(&all, nfds);
                frame_bytes(&all, hdr, sizeof(hdr));
                frame_bytes(&all, payload.p, payload.len);
                free(payload.p);
        }
        save("frame-pipeline", &all);

        /* fds through control messages: one of 1 and one of 2, then a 3-fd frame */
        put_u8(&b, FRAME_OP_CMSG);
        put_u8(&b, 0);
        put_u8(&b, 1 | 1 << 2);
        put_u8(&b, 2);
        put_u8(&b, 1 | 2 << 2);
        frame_header(&b, 3, 3);
        frame_bytes(&b, (const uint8_t *)"abc", 3);
        put_u8(&b, FRAME_OP_SPACE);
        save("frame-cmsg", &b);

        /* a frame of the largest size, and one byte over */
        frame_header(&b, DLX_MAX_FRAME, 0);
        frame_repeat(&b, 0x41, DLX_MAX_FRAME);
        frame_header(&b, 0, 0);
        save("frame-max", &b);
        frame_header(&b, DLX_MAX_FRAME + 1, 0);
        save("frame-too-long", &b);
        frame_fds(&b, 5);
        frame_header(&b, 0, 5);
        save("frame-too-many-fds", &b);
        frame_header(&b, 0, 2);
        save("frame-missing-fds", &b);
        frame_fds(&b, 17);
        save("frame-fd-flood", &b);
        hdr[0] = 1;
        memset(hdr + 1, 0, sizeof(hdr) - 1);
        hdr[7] = 1;
        frame_bytes(&b, hdr, sizeof(hdr));
        save("frame-reserved", &b);
}

/* ---- fuzz-session ---------------------------------------------------------------------------- */

static void s_op(struct buf *b, enum session_op kind, unsigned peer)
{
        put_u8(b, (uint8_t)(kind << 2 | peer));
}

/* A request from peer, with fds of the given kinds attached. */
static void s_send(struct buf *b, unsigned peer, const struct wire_request *q, const uint8_t *fds,
                   unsigned nfds)
{
        struct buf payload = pack_request(q);

        if (nfds) {
                s_op(b, SESSION_OP_FDS, peer);
                put_u8(b, (uint8_t)nfds);
                put(b, fds, nfds);
        }
        s_op(b, SESSION_OP_REQUEST, peer);
        put_u8(b, (uint8_t)nfds);
        put_u16(b, (uint16_t)payload.len);
        put(b, payload.p, payload.len);
        free(payload.p);
}

/* The same as the raw bytes of a frame, header included. */
static void s_send_raw(struct buf *b, unsigned peer, const struct wire_request *q)
{
        struct buf payload = pack_request(q);
        uint8_t hdr[FRAME_HEADER_SIZE];

        frame_header_put(hdr, (uint32_t)payload.len, 0);
        s_op(b, SESSION_OP_DATA, peer);
        put_u16(b, (uint16_t)(payload.len + sizeof(hdr)));
        put(b, hdr, sizeof(hdr));
        put(b, payload.p, payload.len);
        free(payload.p);
}

static const uint8_t memfd_4k[1] = {FUZZ_FD(FUZZ_FD_MEMFD, 2)};

static void s_hello_all(struct buf *b)
{
        for (unsigned peer = 0; peer < 3; peer++)
                s_send(b, peer, hello(), NULL, 0);
}

static void s_post(struct buf *b, unsigned peer, uint8_t lease)
{
        s_op(b, SESSION_OP_POST, peer);
        put_u8(b, 1);
        put_u8(b, lease);
}

static void corpus_session(void)
{
        struct buf b = {0};
        struct wire_request *q;
        const char *name;
        unsigned nfds;

        /* publish, watch, acquire, stat, list, replace, release, unpublish across peers */
        put_u8(&b, 0);
        s_hello_all(&b);
        s_send(&b, 0, publish("model/weights", 0, 7), memfd_4k, 1);
        s_send(&b, 1, named(WIRE_REQ_WATCH, "model/"), NULL, 0);
        s_send(&b, 1, acquire("model/weights", 0, 0), NULL, 0);
        s_send(&b, 1, named(WIRE_REQ_STAT, "model/weights"), NULL, 0);
        s_send(&b, 2, named(WIRE_REQ_LIST, ""), NULL, 0);
        s_send(&b, 0, publish("model/weights", 0, 8), memfd_4k, 1);
        s_send(&b, 1, with_u64(WIRE_REQ_RELEASE, 1), NULL, 0);
        s_send(&b, 2, named(WIRE_REQ_UNPUBLISH, "model/weights"), NULL, 0);
        s_send(&b, 1, acquire("model/weights", 0, 0), NULL, 0);
        s_send(&b, 0, named(WIRE_REQ_UNPUBLISH, "model/weights"), NULL, 0);
        s_send(&b, 1, req(WIRE_REQ_STATS), NULL, 0);
        s_send(&b, 2, with_u64(WIRE_REQ_PING, 1), NULL, 0);
        s_op(&b, SESSION_OP_CLOSE, 0);
        s_send(&b, 1, with_u64(WIRE_REQ_RELEASE, 2), NULL, 0);
        save("session-basic", &b);

        /* allocations: publish from a held segment, free it under a reader, forget */
        put_u8(&b, 0);
        s_hello_all(&b);
        s_send(&b, 0, with_u64(WIRE_REQ_ALLOC, 4096), NULL, 0);
        s_send(&b, 0, publish("alloc/x", 1, 5), NULL, 0);
        s_send(&b, 1, acquire("alloc/x", 0, 0), NULL, 0);
        /* a read-only version of the same segment: its reader gets the read-only reopen */
        q = publish("alloc/ro", 1, 0);
        q->publish.tensor.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        s_send(&b, 0, q, NULL, 0);
        s_send(&b, 1, acquire("alloc/ro", 0, 0), NULL, 0);
        s_send(&b, 2, acquire("alloc/ro", 0, 0), NULL, 0);
        s_send(&b, 2, acquire("alloc/x", 0, 0), NULL, 0);
        s_send(&b, 0, with_u64(WIRE_REQ_FREE, 1), NULL, 0);
        s_send(&b, 0, publish("alloc/x", 1, 6), NULL, 0);
        q = publish("alloc/y", 0, 0);
        q->publish.hold = true;
        s_send(&b, 0, q, memfd_4k, 1);
        s_send(&b, 0, publish("alloc/z", 2, 0), NULL, 0);
        s_send(&b, 1, with_u64(WIRE_REQ_FORGET, 1), NULL, 0);
        s_send(&b, 1, with_u64(WIRE_REQ_RELEASE, 1), NULL, 0);
        s_send(&b, 2, with_u64(WIRE_REQ_FREE, 2), NULL, 0);
        save("session-alloc", &b);

        /* waiting acquires: granted by a publish, timed out, or left when the waiter goes */
        put_u8(&b, 0);
        s_hello_all(&b);
        s_send(&b, 1, acquire("wait/t", 0, -1), NULL, 0);
        s_send(&b, 2, acquire("wait/t", 2, -1), NULL, 0);
        s_send(&b, 1, acquire("wait/u", 0, 1), NULL, 0);
        s_op(&b, SESSION_OP_TICK, 0);
        s_send(&b, 0, publish("wait/t", 0, 1), memfd_4k, 1);
        s_send(&b, 0, publish("wait/t", 0, 2), memfd_4k, 1);
        s_send(&b, 1, acquire("wait/v", 0, 100000), NULL, 0);
        s_op(&b, SESSION_OP_CLOSE, 1);
        s_op(&b, SESSION_OP_TICK, 0);
        save("session-wait", &b);

        /* releases through the ring, a sweep, and a corrupted ring */
        put_u8(&b, 0);
        s_hello_all(&b);
        s_send(&b, 0, publish("ring/a", 0, 3), memfd_4k, 1);
        s_send(&b, 1, acquire("ring/a", 0, 0), NULL, 0);
        s_send(&b, 1, acquire("ring/a", 0, 0), NULL, 0);
        s_post(&b, 1, 1);
        s_send(&b, 1, with_u64(WIRE_REQ_PING, 2), NULL, 0);
        s_post(&b, 1, 2);
        s_op(&b, SESSION_OP_SWEEP, 1);
        s_send(&b, 2, acquire("ring/a", 0, 0), NULL, 0);
        s_op(&b, SESSION_OP_HEAD, 2);
        put_u16(&b, RING_SLOTS + 1);
        s_op(&b, SESSION_OP_SWEEP, 2);
        save("session-ring", &b);

        /* protocol errors: a request before hello, hello twice, a future major, stray fds */
        put_u8(&b, 0);
        s_send_raw(&b, 0, with_u64(WIRE_REQ_PING, 3));
        s_send_raw(&b, 1, hello());
        s_send_raw(&b, 1, hello());
        q = hello();
        q->hello.major = DLX_PROTO_MAJOR + 1;
        s_send(&b, 2, q, NULL, 0);
        s_send_raw(&b, 0, hello());
        s_send(&b, 0, with_u64(WIRE_REQ_PING, 4), memfd_4k, 1);
        s_send_raw(&b, 0, hello());
        s_op(&b, SESSION_OP_DATA, 0);
        put_u16(&b, 9);
        put(&b, "\x01\0\0\0\0\0\0\0\xff", 9);
        save("session-errors", &b);

        /* a persistent tensor outlives its producer; CUDA kinds and release events */
        put_u8(&b, 0x20);
        s_hello_all(&b);
        q = publish("keep/a", 0, 0);
        q->publish.persist = true;
        s_send(&b, 0, q, memfd_4k, 1);
        s_op(&b, SESSION_OP_CLOSE, 0);
        s_send(&b, 1, acquire("keep/a", 0, 0), NULL, 0);
        s_send(&b, 1, acquire("keep/a", 2, 0), NULL, 0);
        s_send(&b, 2, named(WIRE_REQ_LIST, "keep/"), NULL, 0);
        s_send(&b, 2, named(WIRE_REQ_UNPUBLISH, "keep/a"), NULL, 0);
        s_send(&b, 0, hello(), NULL, 0);
        for (unsigned i = 0; (q = sample_request(i, &name, &nfds)); i++) {
                /* fuzz-session takes /dev/null for the driver's device; eventfds it refuses */
                static const uint8_t vmm[1] = {FUZZ_FD(FUZZ_FD_DEVNULL, 0)};
                if (q->type == WIRE_REQ_PUBLISH || q->type == WIRE_REQ_ALLOC)
                        s_send(&b, 0, q, q->type == WIRE_REQ_ALLOC ? vmm : memfd_4k, nfds);
        }
        q = publish("gpu/cpu-event", 0, 0);
        q->publish.tensor.has_event = true;
        s_send(&b, 0, q, memfd_4k, 1);
        s_send(&b, 1, acquire("gpu/ipc", 0, 0), NULL, 0);
        s_send(&b, 1, acquire("gpu/host", 0, 0), NULL, 0);
        s_send(&b, 2, acquire("gpu/ipc", 0, 0), NULL, 0);
        /* consumers' release events reach the producer with RELEASED */
        for (unsigned lease = 2; lease <= 4; lease++) {
                q = with_u64(WIRE_REQ_RELEASE, lease);
                q->release.has_event = true;
                memset(q->release.event, 0x50 + (lease & 1), DLX_CUDA_HANDLE);
                s_send(&b, lease == 4 ? 2 : 1, q, NULL, 0);
        }
        s_send(&b, 0, named(WIRE_REQ_UNPUBLISH, "gpu/ipc"), NULL, 0);
        save("session-kinds", &b);

        /* list pages, and a stalled watcher dropped by an event */
        put_u8(&b, 0);
        s_hello_all(&b);
        s_send(&b, 0, publish("page/a", 0, 0), memfd_4k, 1);
        s_send(&b, 0, publish("page/b", 0, 0), memfd_4k, 1);
        s_send(&b, 0, publish("page/c", 0, 0), memfd_4k, 1);
        q = named(WIRE_REQ_LIST, "page/");
        q->list.limit = 1;
        s_send(&b, 1, q, NULL, 0);
        q = named(WIRE_REQ_LIST, "page/");
        q->list.limit = 1;
        wire_strcpy(q->list.after, sizeof(q->list.after), "page/a");
        s_send(&b, 1, q, NULL, 0);
        s_send(&b, 2, named(WIRE_REQ_WATCH, ""), NULL, 0);
        s_op(&b, SESSION_OP_STALL, 2);
        s_send(&b, 0, named(WIRE_REQ_UNPUBLISH, "page/b"), NULL, 0);
        s_send(&b, 2, with_u64(WIRE_REQ_UNWATCH, 1), NULL, 0);
        save("session-pages", &b);

        /* a client closing with a lease kept: bye, then only releases and pings count */
        put_u8(&b, 0);
        s_hello_all(&b);
        s_send(&b, 0, publish("bye/a", 0, 5), memfd_4k, 1);
        s_send(&b, 1, publish("bye/own", 0, 6), memfd_4k, 1);
        s_send(&b, 1, named(WIRE_REQ_WATCH, "bye/"), NULL, 0);
        s_send(&b, 1, acquire("bye/a", 0, 0), NULL, 0);
        s_send(&b, 1, acquire("bye/never", 0, -1), NULL, 0);
        s_send(&b, 1, req(WIRE_REQ_BYE), NULL, 0);
        s_send(&b, 1, acquire("bye/a", 0, 0), NULL, 0);
        s_send(&b, 1, with_u64(WIRE_REQ_PING, 1), NULL, 0);
        s_send(&b, 0, named(WIRE_REQ_UNPUBLISH, "bye/a"), NULL, 0);
        s_send(&b, 0, publish("bye/never", 0, 7), memfd_4k, 1);
        s_send(&b, 1, with_u64(WIRE_REQ_RELEASE, 1), NULL, 0);
        s_op(&b, SESSION_OP_CLOSE, 1);
        save("session-bye", &b);

        /* every kind of fd offered as a memfd, in 7-byte chunks */
        put_u8(&b, 2 << 6);
        s_hello_all(&b);
        for (unsigned kind = 0; kind < 16; kind++) {
                uint8_t fd = FUZZ_FD(kind, kind & 1 ? 3 : 2);
                char n[32];
                snprintf(n, sizeof(n), "fd/kind%u", kind);
                s_send(&b, kind % 3, publish(n, 0, kind), &fd, 1);
        }
        s_send(&b, 1, acquire("fd/kind0", 0, 0), NULL, 0);
        s_send(&b, 2, acquire("fd/kind1", 0, 0), NULL, 0);
        save("session-fds", &b);

        /* tight limits: clients per uid, names, bytes per uid, leases, watches */
        put_u8(&b, 1 << 3 | 0x20);
        s_hello_all(&b);
        s_op(&b, SESSION_OP_CLOSE, 0);
        s_send(&b, 1, hello(), NULL, 0);
        for (unsigned i = 0; i < 12; i++) {
                char n[32];
                snprintf(n, sizeof(n), "tight/%u", i);
                s_send(&b, i % 2 ? 1 : 2, publish(n, 0, i), memfd_4k, 1);
        }
        for (unsigned i = 0; i < 6; i++) {
                s_send(&b, 1, acquire("tight/0", 0, 0), NULL, 0);
                s_send(&b, 2, named(WIRE_REQ_WATCH, "tight/"), NULL, 0);
        }
        save("session-tight", &b);
}

/* ---- group segments --------------------------------------------------------------------- */

struct seed_member {
        const char *name;
        DLDataType dtype;
        int ndim;
        int64_t shape[3], strides[3];
        uint64_t byte_offset, at; /* at: the data pointer, from the data area's start */
};

/*
 * A group segment of the members (sorted by name already), limits and the
 * apart segment's size first: apart 0, the data follows the table; else the
 * table is all of the segment, in GROUP_FORMAT_APART.
 */
static void group_seed(const char *file, uint32_t max_count, uint32_t max_table, uint32_t apart,
                       const struct seed_member *ms, uint32_t n, uint64_t data_bytes)
{
        struct buf b = {0};
        uint64_t ndims = 0, names = 0;

        for (uint32_t i = 0; i < n; i++) {
                ndims += 2 * (uint64_t)ms[i].ndim;
                names += strlen(ms[i].name) + 1;
        }
        struct group_head h = {.format = apart ? GROUP_FORMAT_APART : GROUP_FORMAT, .count = n};
        memcpy(h.magic, GROUP_MAGIC, sizeof(h.magic));
        h.members_off = sizeof(h);
        h.dims_off = h.members_off + n * sizeof(struct group_member);
        h.ndims = ndims;
        h.names_off = h.dims_off + ndims * 8;
        h.names_size = names;
        h.data_off = apart ? h.names_off + names : (h.names_off + names + 63) / 64 * 64;
        put(&b, &max_count, 4);
        put(&b, &max_table, 4);
        put(&b, &apart, 4);
        put(&b, &h, sizeof(h));
        uint64_t dim = 0, name = 0;
        for (uint32_t i = 0; i < n; i++) {
                struct group_member m = {
                        .offset = (apart ? 0 : h.data_off) + ms[i].at,
                        .byte_offset = ms[i].byte_offset,
                        .flags = DLPACK_FLAG_BITMASK_READ_ONLY,
                        .dims = dim,
                        .name_off = (uint32_t)name,
                        .name_len = (uint16_t)strlen(ms[i].name),
                        .ndim = (uint8_t)ms[i].ndim,
                        .dtype_code = ms[i].dtype.code,
                        .dtype_bits = ms[i].dtype.bits,
                        .dtype_lanes = ms[i].dtype.lanes,
                };
                put(&b, &m, sizeof(m));
                dim += 2 * (uint64_t)ms[i].ndim;
                name += strlen(ms[i].name) + 1;
        }
        for (uint32_t i = 0; i < n; i++) {
                put(&b, ms[i].shape, (size_t)ms[i].ndim * 8);
                put(&b, ms[i].strides, (size_t)ms[i].ndim * 8);
        }
        for (uint32_t i = 0; i < n; i++)
                put(&b, ms[i].name, strlen(ms[i].name) + 1);
        while (!apart && b.len < 12 + h.data_off + data_bytes)
                put_u8(&b, (uint8_t)b.len);
        save(file, &b);
}

static void corpus_group(void)
{
        static const struct seed_member one[] = {
                {"w", {kDLFloat, 32, 1}, 2, {2, 3}, {3, 1}, 0, 0},
        };
        static const struct seed_member several[] = {
                {"a.bias", {kDLFloat, 16, 1}, 1, {4}, {1}, 0, 0},
                {"a.weight", {kDLBfloat, 16, 1}, 2, {2, 4}, {1, 2}, 0, 64},
                {"b/tied", {kDLBfloat, 16, 1}, 2, {4, 2}, {2, 1}, 0, 64},
                {"c.rev", {kDLInt, 8, 1}, 1, {5}, {-1}, 4, 128},
                {"d.scalar", {kDLFloat, 64, 1}, 0, {0}, {0}, 0, 192},
                {"e.empty", {kDLFloat, 32, 1}, 2, {0, 3}, {3, 1}, 0, 0},
                {"f.offset", {kDLUInt, 8, 1}, 1, {3}, {1}, 16, 200},
        };
        group_seed("group-one", 0, 0, 0, one, 1, 64);
        group_seed("group-several", 0, 0, 0, several, 7, 256);
        group_seed("group-limited", 4, 4096, 0, several, 7, 256);
        group_seed("group-apart", 0, 0, 256, several, 7, 0);
        group_seed("group-apart-short", 0, 0, 200, several, 7, 0);
}

int main(int argc, char **argv)
{
        if (argc != 3) {
                fprintf(stderr, "usage: %s frame|request|session|group DIR\n", argv[0]);
                return 2;
        }
        out_dir = argv[2];
        if (mkdir(out_dir, 0755) < 0 && errno != EEXIST)
                die(out_dir);
        if (strcmp(argv[1], "frame") == 0)
                corpus_frame();
        else if (strcmp(argv[1], "request") == 0)
                corpus_request();
        else if (strcmp(argv[1], "session") == 0)
                corpus_session();
        else if (strcmp(argv[1], "group") == 0)
                corpus_group();
        else {
                fprintf(stderr, "usage: %s frame|request|session|group DIR\n", argv[0]);
                return 2;
        }
        printf("%u seeds in %s\n", nfiles, out_dir);
        return 0;
}
