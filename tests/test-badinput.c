/* SPDX-License-Identifier: MIT */
/*
 * Hostile and malformed input against a real dlxd. Every case asserts the exact
 * outcome the offending client sees (a reply with a given status and a message,
 * or a hang-up), and then that the daemon still serves a well-behaved client
 * connected before the attack, and a new one.
 *
 * Raw connections speak the framing by hand (proto/frame.h); requests are packed
 * with the codec (proto/wire.h) when they are well-formed protobuf, and with the
 * small protobuf writer of pbwrite.h when they must be something the codec refuses to
 * produce (ndim 33, a NUL inside a name, unknown fields, a missing body).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "pbwrite.h"
#include "rawpeer.h"
#include "frame.h"
#include "wire.h"

/* Long enough for a loaded (or sanitized) daemon; short enough that a hang fails fast. */
#define REPLY_TIMEOUT_MS 5000
#define HELLO_ID 1
/* Most fds one test sendmsg() carries. */
#define MAX_SEND_FDS 32

/* ---- time and process helpers -------------------------------------------------------- */

/* CPU time (user + system) the daemon has used, in clock ticks. */
static long daemon_cpu_ticks(void)
{
        char path[64], buf[1024], *p;
        unsigned long utime = 0, stime = 0;
        FILE *f;
        size_t n;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int)fx.pid);
        f = fopen(path, "re");
        ck_assert_msg(f, "open %s: %s", path, strerror(errno));
        n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        /* fields after the command name, which may hold spaces: state is field 3 */
        p = strrchr(buf, ')');
        ck_assert_ptr_nonnull(p);
        ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                                &utime, &stime),
                         2);
        return (long)(utime + stime);
}

/* ---- payloads the codec will not produce (pbwrite.h) ------------------------------- */

/* What a publish request describes, with room for every way of getting it wrong. */
struct tspec {
        uint8_t name[512];
        size_t name_len;
        uint32_t code, bits, lanes;
        size_t ndim, nstrides;
        int64_t shape[40], strides[40];
        uint64_t byte_offset;
        int32_t device_type;
        uint64_t flags;
        uint32_t storage;
        uint64_t segment, offset, length;
};

static void tspec_name(struct tspec *t, const void *name, size_t len)
{
        ck_assert_uint_le(len, sizeof(t->name));
        memcpy(t->name, name, len);
        t->name_len = len;
}

/* A valid descriptor: float32[bytes / 4], compact, at offset 0 of a memfd segment. */
static void tspec_init(struct tspec *t, const char *name, uint64_t bytes)
{
        memset(t, 0, sizeof(*t));
        tspec_name(t, name, strlen(name));
        t->code = kDLFloat;
        t->bits = 32;
        t->lanes = 1;
        t->ndim = t->nstrides = 1;
        t->shape[0] = (int64_t)(bytes / 4);
        t->strides[0] = 1;
        t->device_type = kDLCPU;
        t->storage = WIRE_STORAGE_MEMFD;
        t->length = bytes;
}

/* Request { id, publish { tensor { ... }, persist, token } } */
static void pb_publish(struct pb *p, uint64_t id, const struct tspec *t)
{
        struct pb tensor, dtype, device, publish;

        pb_init(&tensor);
        pb_init(&dtype);
        pb_init(&device);
        pb_init(&publish);
        pb_uint(&dtype, 1, t->code);
        pb_uint(&dtype, 2, t->bits);
        pb_uint(&dtype, 3, t->lanes);
        pb_uint(&device, 1, (uint64_t)(int64_t)t->device_type);
        pb_uint(&device, 2, 0);
        pb_bytes(&tensor, 1, t->name, t->name_len);
        pb_msg(&tensor, 3, &dtype);
        if (t->ndim)
                pb_packed_i64(&tensor, 4, t->shape, t->ndim);
        if (t->nstrides)
                pb_packed_i64(&tensor, 5, t->strides, t->nstrides);
        pb_uint(&tensor, 6, t->byte_offset);
        pb_msg(&tensor, 7, &device);
        pb_uint(&tensor, 8, t->flags);
        pb_uint(&tensor, 9, t->storage);
        pb_uint(&tensor, 10, t->segment);
        pb_uint(&tensor, 11, t->offset);
        pb_uint(&tensor, 12, t->length);
        pb_msg(&publish, 1, &tensor);
        pb_uint(p, 1, id);
        pb_msg(p, 3, &publish);
        pb_done(&tensor);
        pb_done(&dtype);
        pb_done(&device);
        pb_done(&publish);
}

/* Request { id, <field> { name } } for the requests whose body is one bytes field 1. */
static void pb_named(struct pb *p, uint64_t id, unsigned body_field, const void *name, size_t len)
{
        struct pb body;

        pb_init(&body);
        pb_bytes(&body, 1, name, len);
        pb_uint(p, 1, id);
        pb_msg(p, body_field, &body);
        pb_done(&body);
}

/* Request field numbers of the bodies used above. */
enum {
        PB_REQ_HELLO = 2,
        PB_REQ_PUBLISH = 3,
        PB_REQ_ACQUIRE = 4,
        PB_REQ_LIST = 7,
        PB_REQ_STAT = 8,
        PB_REQ_WATCH = 9,
        PB_REQ_PING = 15,
};

/* ---- framing and requests ------------------------------------------------------------ */

/* A frame whose header announces `announced` fds while nfds travel with it. */
static int send_frame_ex(int fd, const void *payload, uint32_t len, unsigned announced,
                         const int *fds, unsigned nfds)
{
        uint8_t *buf = malloc(FRAME_HEADER_SIZE + (size_t)len);
        int r;

        ck_assert_ptr_nonnull(buf);
        frame_header_put(buf, len, announced);
        if (len)
                memcpy(buf + FRAME_HEADER_SIZE, payload, len);
        r = rp_send_raw(fd, buf, FRAME_HEADER_SIZE + (size_t)len, fds, nfds);
        free(buf);
        return r;
}

static void send_frame(int fd, const void *payload, uint32_t len, const int *fds, unsigned nfds)
{
        int r = send_frame_ex(fd, payload, len, nfds, fds, nfds);
        ck_assert_msg(r == 0, "send: %s", strerror(-r));
}

static void send_pb(int fd, const struct pb *p, int attach_fd)
{
        send_frame(fd, p->b, (uint32_t)p->n, &attach_fd, attach_fd >= 0 ? 1 : 0);
}

/* One status-only reply with this id and status, with a non-empty message; returns it. */
static void expect_error_msg(int fd, uint64_t id, enum wire_status status, char *ret_msg,
                             size_t msgsz)
{
        struct wire_reply rep;

        rp_expect_error(fd, id, status, &rep);
        if (ret_msg)
                snprintf(ret_msg, msgsz, "%s", rep.error);
}

static void expect_error(int fd, uint64_t id, enum wire_status status)
{
        rp_expect_error(fd, id, status, NULL);
}

/* The daemon hung up on this client without sending anything (more). */
static void expect_closed(int fd)
{
        struct wire_reply rep;
        int r = rp_read(fd, &rep, REPLY_TIMEOUT_MS, NULL);

        ck_assert_msg(r == 0 || r == -ECONNRESET,
                      "expected the daemon to hang up, got %s (id %llu status %d '%s')",
                      r == 1 ? "a reply" : strerror(-r), (unsigned long long)rep.id, rep.status,
                      rep.error);
}

/* The refusal of request id with this status, then the hang-up; closes fd. */
static void expect_hangup(int fd, uint64_t id, enum wire_status status)
{
        expect_error(fd, id, status);
        expect_closed(fd);
        close(fd);
}

static void send_hello(int fd, uint64_t id, uint32_t major, int attach_fd)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_HELLO};

        req.hello.major = major;
        req.hello.minor = DLX_PROTO_MINOR;
        req.hello.pid = (int32_t)getpid();
        snprintf(req.hello.client_name, sizeof(req.hello.client_name), "badinput");
        rp_send(fd, &req, attach_fd);
}

static void hello(int fd)
{
        struct wire_reply rep;

        send_hello(fd, HELLO_ID, DLX_PROTO_MAJOR, -1);
        rp_expect_ok(fd, HELLO_ID, WIRE_REP_HELLO, &rep, NULL);
        ck_assert_uint_eq(rep.hello.major, DLX_PROTO_MAJOR);
}

static int raw_hello(void)
{
        int fd = fx_raw_connect(&fx);
        hello(fd);
        return fd;
}

/* Publishes t with attach_fd (borrowed; -1: none) and expects status (OK: a publish reply). */
static void publish_expect(int fd, uint64_t id, const struct tspec *t, int attach_fd,
                           enum wire_status status)
{
        struct pb p;

        pb_init(&p);
        pb_publish(&p, id, t);
        send_pb(fd, &p, attach_fd);
        pb_done(&p);
        if (status == WIRE_OK)
                rp_expect_ok(fd, id, WIRE_REP_PUBLISH, NULL, NULL);
        else
                expect_error(fd, id, status);
}

/* Same, attaching a fresh sealed memfd of memfd_size bytes. */
static void publish_memfd_expect(int fd, uint64_t id, const struct tspec *t, uint64_t memfd_size,
                                 enum wire_status status)
{
        int mfd = sealed_memfd(memfd_size);
        publish_expect(fd, id, t, mfd, status);
        close(mfd);
}

/* ---- the well-behaved side ----------------------------------------------------------- */

static int serial;

/*
 * The daemon still serves: the client connected before the attack pings, allocates,
 * publishes and acquires its own data back, and a brand-new client reads it too.
 */
static void assert_daemon_serves(dlx_client *good)
{
        int64_t shape[1] = {257};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}};
        DLManagedTensorVersioned *t, *got[2];
        dlx_client *newcomer;
        char name[64];
        uint64_t version = 0;
        int n = ++serial;

        proto.shape = shape;
        ck_assert_msg(dlx_ping(good) == 0, "ping from the good client: %s", dlx_last_error());
        ck_assert_int_eq(dlx_alloc(good, &proto, &t), 0);
        float *data = (float *)((uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset);
        for (int i = 0; i < 257; i++)
                data[i] = (float)i * 0.5f + (float)n;
        snprintf(name, sizeof(name), "badinput/survivor/%d", n);
        ck_assert_msg(dlx_publish(good, name, t, NULL, &version) == 0, "publish: %s",
                      dlx_last_error());
        ck_assert_uint_ge(version, 1);

        newcomer = fx_connect(&fx, "newcomer");
        ck_assert_msg(dlx_acquire(good, name, NULL, &got[0]) == 0, "acquire: %s", dlx_last_error());
        ck_assert_msg(dlx_acquire(newcomer, name, NULL, &got[1]) == 0, "acquire: %s",
                      dlx_last_error());
        for (int k = 0; k < 2; k++) {
                const DLTensor *d = &got[k]->dl_tensor;
                const float *v = (const float *)((const uint8_t *)d->data + d->byte_offset);
                ck_assert_int_eq(d->ndim, 1);
                ck_assert_int_eq(d->shape[0], 257);
                ck_assert_int_eq(d->dtype.code, kDLFloat);
                ck_assert_int_eq(d->dtype.bits, 32);
                for (int i = 0; i < 257; i++)
                        ck_assert_msg(v[i] == (float)i * 0.5f + (float)n, "element %d is %f", i,
                                      (double)v[i]);
                got[k]->deleter(got[k]);
        }
        ck_assert_int_eq(dlx_ping(newcomer), 0);
        dlx_close(newcomer);
        ck_assert_int_eq(dlx_unpublish(good, name), 0);
        ck_assert_int_eq(dlx_ping(good), 0);
}

static dlx_client *attack_begin(void)
{
        return fx_connect(&fx, "good");
}

/* After the attack (every raw socket closed): still serving, and no fd left behind. */
static void attack_end(dlx_client *good)
{
        int fds;

        assert_daemon_serves(good);
        dlx_close(good);
        fds = wait_daemon_fds(&fx, fx.daemon_fds, 5000);
        ck_assert_msg(fds == fx.daemon_fds, "dlxd holds %d fds after the attack, %d before", fds,
                      fx.daemon_fds);
}

/* ---- framing ------------------------------------------------------------------------- */

START_TEST(test_truncated_frame_then_close)
{
        dlx_client *good = attack_begin();
        uint8_t hdr[FRAME_HEADER_SIZE], junk[10] = {0};
        int fd = raw_hello(), mfd;

        /* a header promising 100 bytes, 10 of them, and the writer goes away */
        frame_header_put(hdr, 100, 0);
        ck_assert_int_eq(rp_send_raw(fd, hdr, sizeof(hdr), NULL, 0), 0);
        ck_assert_int_eq(rp_send_raw(fd, junk, sizeof(junk), NULL, 0), 0);
        ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
        expect_closed(fd);
        close(fd);

        /* the same with an fd announced and attached: it must not stay open in the daemon */
        fd = raw_hello();
        mfd = sealed_memfd(4096);
        frame_header_put(hdr, 100, 1);
        ck_assert_int_eq(rp_send_raw(fd, hdr, sizeof(hdr), &mfd, 1), 0);
        close(mfd);
        ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
        expect_closed(fd);
        close(fd);

        /* and without waiting for anything: an abrupt close mid-header */
        fd = raw_hello();
        ck_assert_int_eq(rp_send_raw(fd, hdr, 3, NULL, 0), 0);
        close(fd);
        attack_end(good);
}
END_TEST

START_TEST(test_oversized_length)
{
        static const uint32_t lengths[] = {DLX_MAX_FRAME + 1, 0x7fffffffu, 0xffffffffu};
        dlx_client *good = attack_begin();

        for (size_t i = 0; i < N_ELEMS(lengths); i++) {
                uint8_t hdr[FRAME_HEADER_SIZE];
                int fd = raw_hello();

                frame_header_put(hdr, lengths[i], 0);
                ck_assert_int_eq(rp_send_raw(fd, hdr, sizeof(hdr), NULL, 0), 0);
                expect_hangup(fd, 0, WIRE_TOO_BIG);
        }
        attack_end(good);
}
END_TEST

START_TEST(test_max_frame_of_garbage)
{
        dlx_client *good = attack_begin();
        uint8_t *junk = malloc(DLX_MAX_FRAME);
        int fd = raw_hello();

        /* the largest frame allowed, all of it undecodable: read whole, then refused */
        ck_assert_ptr_nonnull(junk);
        memset(junk, 0xff, DLX_MAX_FRAME);
        send_frame(fd, junk, DLX_MAX_FRAME, NULL, 0);
        free(junk);
        expect_hangup(fd, 0, WIRE_PROTOCOL);
        attack_end(good);
}
END_TEST

START_TEST(test_reserved_header_bytes)
{
        static const uint8_t reserved[][2] = {{0, 1}, {0x80, 0}, {0xff, 0xff}};
        dlx_client *good = attack_begin();

        for (size_t i = 0; i < N_ELEMS(reserved); i++) {
                struct wire_request req = {.id = 2, .type = WIRE_REQ_PING};
                uint8_t frame[64];
                size_t size;
                int fd = raw_hello();

                /* an otherwise perfect ping */
                ck_assert_int_eq(wire_request_size(&req, &size), 0);
                ck_assert_uint_le(size, sizeof(frame) - FRAME_HEADER_SIZE);
                wire_request_pack(&req, frame + FRAME_HEADER_SIZE);
                frame_header_put(frame, (uint32_t)size, 0);
                frame[6] = reserved[i][0];
                frame[7] = reserved[i][1];
                ck_assert_int_eq(rp_send_raw(fd, frame, FRAME_HEADER_SIZE + size, NULL, 0), 0);
                expect_hangup(fd, 0, WIRE_PROTOCOL);
        }
        attack_end(good);
}
END_TEST

START_TEST(test_zero_length_frame)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();

        /* an empty payload is a valid empty Request: id 0, which is never allowed */
        send_frame(fd, NULL, 0, NULL, 0);
        expect_hangup(fd, 0, WIRE_PROTOCOL);
        attack_end(good);
}
END_TEST

START_TEST(test_garbage_payload)
{
        static const uint8_t garbage[][12] = {
                /* a tag varint that never ends */
                {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
                /* field 1 with wire type 7, which does not exist */
                {0x0f, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b},
                /* field 3 (publish) claiming 100 bytes of a 12-byte payload */
                {0x08, 0x05, 0x1a, 0x64, 0x0a, 0x02, 0x61, 0x62, 0x10, 0x01, 0x18, 0x01},
        };
        dlx_client *good = attack_begin();

        for (size_t i = 0; i < N_ELEMS(garbage); i++) {
                int fd = raw_hello();

                send_frame(fd, garbage[i], sizeof(garbage[i]), NULL, 0);
                expect_hangup(fd, 0, WIRE_PROTOCOL);
        }
        /* before hello too */
        int fd = fx_raw_connect(&fx);
        send_frame(fd, garbage[0], sizeof(garbage[0]), NULL, 0);
        expect_hangup(fd, 0, WIRE_PROTOCOL);
        attack_end(good);
}
END_TEST

/*
 * Protobuf lets a field repeat: a singular field's last value wins, a message
 * field's repeats merge. A peer may repeat one a hundred thousand times in a
 * frame, pack a shape of a hundred thousand dimensions, or nest groups deep;
 * the daemon answers each at once and keeps serving others.
 */
START_TEST(test_repeated_and_nested_fields)
{
        dlx_client *good = attack_begin();
        char msg[DLX_ERROR_MAX + 1], name[32];
        struct pb req, sub, t;
        int fd = raw_hello();

        /* an acquire whose name is given 40000 times: the last one is asked for */
        pb_init(&sub);
        for (int i = 0; i < 40000; i++) {
                snprintf(name, sizeof(name), "rep/%d", i);
                pb_bytes(&sub, 1, name, strlen(name));
        }
        pb_init(&req);
        pb_uint(&req, 1, 7);
        pb_msg(&req, 4, &sub);
        ck_assert_uint_lt(req.n, DLX_MAX_FRAME);
        send_frame(fd, req.b, (uint32_t)req.n, NULL, 0);
        expect_error_msg(fd, 7, WIRE_NOT_FOUND, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "rep/39999"), "not the last name: %s", msg);
        pb_done(&req);
        pb_done(&sub);

        /* the acquire message itself repeated 20000 times: merged, last name wins */
        pb_init(&sub);
        pb_bytes(&sub, 1, "merged/x", 8);
        pb_init(&req);
        pb_uint(&req, 1, 8);
        for (int i = 0; i < 20000; i++)
                pb_msg(&req, 4, &sub);
        send_frame(fd, req.b, (uint32_t)req.n, NULL, 0);
        expect_error_msg(fd, 8, WIRE_NOT_FOUND, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "merged/x"), "%s", msg);
        pb_done(&req);
        pb_done(&sub);

        /* a publish with 100000 dimensions, packed: refused for its rank */
        pb_init(&sub);
        for (int i = 0; i < 100000; i++)
                pb_varint(&sub, 1);
        pb_init(&t);
        pb_bytes(&t, 1, "rank/x", 6);
        pb_bytes(&t, 4, sub.b, sub.n);
        pb_bytes(&t, 5, sub.b, sub.n);
        pb_done(&sub);
        pb_init(&sub);
        pb_msg(&sub, 1, &t);
        pb_init(&req);
        pb_uint(&req, 1, 9);
        pb_msg(&req, 3, &sub);
        send_frame(fd, req.b, (uint32_t)req.n, NULL, 0);
        expect_error_msg(fd, 9, WIRE_INVALID, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "ndim"), "%s", msg);
        pb_done(&req);
        pb_done(&sub);
        pb_done(&t);
        rp_ping(fd, 10);
        close(fd);

        /* groups (wire type 3) nested 100000 deep in an unknown field: not protobuf we take */
        fd = raw_hello();
        pb_init(&req);
        pb_uint(&req, 1, 11);
        for (int i = 0; i < 100000; i++)
                pb_tag(&req, 99, PB_GROUP_START);
        for (int i = 0; i < 100000; i++)
                pb_tag(&req, 99, PB_GROUP_END);
        send_frame(fd, req.b, (uint32_t)req.n, NULL, 0);
        pb_done(&req);
        expect_hangup(fd, 0, WIRE_PROTOCOL);
        attack_end(good);
}
END_TEST

START_TEST(test_unknown_request_type)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();
        struct pb p;

        /* a Request with an id and no body: valid protobuf, no request type */
        pb_init(&p);
        pb_uint(&p, 1, 7);
        send_pb(fd, &p, -1);
        pb_done(&p);
        expect_error(fd, 7, WIRE_INVALID);
        rp_ping(fd, 8);

        /* a body field this daemon does not know (a future request type) */
        pb_init(&p);
        pb_uint(&p, 1, 9);
        pb_bytes(&p, 99, "\x08\x01", 2);
        send_pb(fd, &p, -1);
        pb_done(&p);
        expect_error(fd, 9, WIRE_INVALID);
        rp_ping(fd, 10);
        close(fd);
        attack_end(good);
}
END_TEST

START_TEST(test_unknown_fields_ignored)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();
        struct wire_reply rep;
        struct pb p, body;

        /* fields are only ever added: a ping carrying fields from the future is still a ping */
        pb_init(&p);
        pb_init(&body);
        pb_uint(&body, 1, 4242);
        pb_uint(&body, 77, 1);
        pb_bytes(&body, 78, "future", 6);
        pb_uint(&p, 1, 3);
        pb_msg(&p, PB_REQ_PING, &body);
        pb_uint(&p, 1000, 5);
        send_pb(fd, &p, -1);
        pb_done(&p);
        pb_done(&body);
        rp_expect_ok(fd, 3, WIRE_REP_PONG, &rep, NULL);
        ck_assert_uint_eq(rep.pong.nonce, 4242);
        close(fd);
        attack_end(good);
}
END_TEST

START_TEST(test_unknown_request_type_before_hello)
{
        dlx_client *good = attack_begin();
        int fd = fx_raw_connect(&fx);
        struct pb p;

        pb_init(&p);
        pb_uint(&p, 1, 7);
        send_pb(fd, &p, -1);
        pb_done(&p);
        expect_hangup(fd, 7, WIRE_INVALID);
        attack_end(good);
}
END_TEST

START_TEST(test_request_id_zero)
{
        dlx_client *good = attack_begin();
        struct wire_request req = {.id = 0, .type = WIRE_REQ_PING};
        int fd = raw_hello();

        rp_send(fd, &req, -1);
        expect_hangup(fd, 0, WIRE_PROTOCOL);

        /* a hello with id 0 never greets */
        fd = fx_raw_connect(&fx);
        send_hello(fd, 0, DLX_PROTO_MAJOR, -1);
        expect_hangup(fd, 0, WIRE_PROTOCOL);
        attack_end(good);
}
END_TEST

START_TEST(test_request_before_hello)
{
        dlx_client *good = attack_begin();
        struct wire_request req = {.id = 5, .type = WIRE_REQ_ACQUIRE};
        char msg[DLX_ERROR_MAX + 1];
        struct tspec t;
        int fd, mfd;

        fd = fx_raw_connect(&fx);
        snprintf(req.acquire.name, sizeof(req.acquire.name), "badinput/early");
        rp_send(fd, &req, -1);
        expect_error_msg(fd, 5, WIRE_PROTOCOL, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "hello"), "message '%s' does not mention hello", msg);
        expect_closed(fd);
        close(fd);

        /* a release, which would be silent on success */
        fd = fx_raw_connect(&fx);
        req = (struct wire_request){.id = 6, .type = WIRE_REQ_RELEASE};
        req.release.lease = 1;
        rp_send(fd, &req, -1);
        expect_hangup(fd, 6, WIRE_PROTOCOL);

        /* a publish with its memfd: refused, and the fd closed in the daemon */
        fd = fx_raw_connect(&fx);
        mfd = sealed_memfd(4096);
        tspec_init(&t, "badinput/early", 4096);
        publish_expect(fd, 7, &t, mfd, WIRE_PROTOCOL);
        close(mfd);
        expect_closed(fd);
        close(fd);
        attack_end(good);
}
END_TEST

START_TEST(test_hello_unknown_major)
{
        static const uint32_t majors[] = {99, 0, 2, 0xffffffffu};
        dlx_client *good = attack_begin();

        for (size_t i = 0; i < N_ELEMS(majors); i++) {
                char msg[DLX_ERROR_MAX + 1], want[32];
                int fd = fx_raw_connect(&fx);

                send_hello(fd, HELLO_ID, majors[i], -1);
                expect_error_msg(fd, HELLO_ID, WIRE_VERSION, msg, sizeof(msg));
                snprintf(want, sizeof(want), "version %u.", majors[i]);
                ck_assert_msg(strstr(msg, want), "message '%s' does not name version %s", msg,
                              want);
                expect_closed(fd);
                close(fd);
        }
        attack_end(good);
}
END_TEST

START_TEST(test_hello_twice)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();

        send_hello(fd, 2, DLX_PROTO_MAJOR, -1);
        expect_hangup(fd, 2, WIRE_PROTOCOL);
        attack_end(good);
}
END_TEST

START_TEST(test_hello_bad_client_name)
{
        static const char *const names[] = {
                "bad\x01name", "bad\xffname", "a\0b",
                "0123456789012345678901234567890123456789012345678901234567890123X", /* 65 */
        };
        static const size_t lens[] = {8, 8, 3, 65};
        dlx_client *good = attack_begin();

        for (size_t i = 0; i < N_ELEMS(names); i++) {
                int fd = fx_raw_connect(&fx);
                struct pb p, body;

                pb_init(&p);
                pb_init(&body);
                pb_uint(&body, 1, DLX_PROTO_MAJOR);
                pb_uint(&body, 2, DLX_PROTO_MINOR);
                pb_bytes(&body, 3, names[i], lens[i]);
                pb_uint(&body, 4, (uint64_t)getpid());
                pb_uint(&p, 1, HELLO_ID);
                pb_msg(&p, PB_REQ_HELLO, &body);
                send_pb(fd, &p, -1);
                pb_done(&p);
                pb_done(&body);
                expect_hangup(fd, HELLO_ID, WIRE_INVALID);
        }
        attack_end(good);
}
END_TEST

/* ---- file descriptors ---------------------------------------------------------------- */

START_TEST(test_fd_on_ping)
{
        dlx_client *good = attack_begin();
        struct wire_request req = {.id = 2, .type = WIRE_REQ_PING};
        int fd = raw_hello(), mfd = sealed_memfd(4096);
        char msg[DLX_ERROR_MAX + 1];

        rp_send(fd, &req, mfd);
        close(mfd);
        expect_error_msg(fd, 2, WIRE_PROTOCOL, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "1 fds attached to a ping"), "message: %s", msg);
        expect_closed(fd);
        close(fd);
        attack_end(good);
}
END_TEST

/* A raw producer publishes a 4 KiB memfd sealed only against resizing; returns the memfd. */
static int publish_raw_memfd(int prod, uint64_t id, const char *name, uint64_t flags, int mfd)
{
        struct wire_request req;

        if (mfd < 0)
                mfd = sealed_memfd(4096);
        rp_publish_req(&req, id, name, 4096, 0, flags);
        rp_send(prod, &req, mfd);
        return mfd;
}

/* CUDA fields on a memfd tensor are refused: each would be a lie. */
static void with_ipc_handle(struct wire_tensor *t)
{
        t->has_ipc_handle = true;
        memset(t->ipc_handle, 0xab, DLX_CUDA_HANDLE);
}

static void with_device_uuid(struct wire_tensor *t)
{
        t->has_device_uuid = true;
        memset(t->device_uuid, 0xcd, DLX_CUDA_UUID);
}

static void with_pid_namespace(struct wire_tensor *t)
{
        t->pid_namespace = 4026531836u;
}

static void (*const cuda_lies[])(struct wire_tensor *) = {with_ipc_handle, with_device_uuid,
                                                          with_pid_namespace};

START_TEST(test_memfd_publish_with_cuda_fields)
{
        dlx_client *good = attack_begin();
        int prod = raw_hello(), mfd = sealed_memfd(4096);
        struct wire_request req;

        rp_publish_req(&req, 2, "badinput/handle", 4096, 0, 0);
        cuda_lies[_i](&req.publish.tensor);
        rp_send(prod, &req, mfd);
        close(mfd);
        expect_error(prod, 2, WIRE_INVALID);
        rp_ping(prod, 3);
        close(prod);
        attack_end(good);
}
END_TEST

/*
 * A writable version's readers get its memfd open for writing. None of them
 * may seal it against writing (F_SEAL_WRITE), which would take every other
 * reader's writable mapping away: dlxd seals it against new seals first.
 */
START_TEST(test_reader_cannot_seal_a_writable_segment)
{
        dlx_client *good = attack_begin();
        int prod = raw_hello(), reader = raw_hello(), rfd = -1, mfd;
        DLManagedTensorVersioned *t;
        struct wire_request req;
        struct wire_reply rep;

        mfd = publish_raw_memfd(prod, 2, "badinput/w", 0, -1);
        rp_expect_ok(prod, 2, WIRE_REP_PUBLISH, NULL, NULL);

        rp_acquire_req(&req, 2, "badinput/w");
        rp_send(reader, &req, -1);
        rp_expect_ok(reader, 2, WIRE_REP_ACQUIRE, &rep, &rfd);
        ck_assert(rep.acquire.writable);
        ck_assert_int_ge(rfd, 0);
        ck_assert_int_eq(fcntl(rfd, F_ADD_SEALS, F_SEAL_WRITE), -1);
        ck_assert_int_eq(errno, EPERM);
        ck_assert_int_eq(fcntl(rfd, F_GET_SEALS) & F_SEAL_SEAL, F_SEAL_SEAL);
        close(rfd);

        /* nor by publishing the fd read-only under a name of its own */
        publish_raw_memfd(prod, 3, "badinput/ro", DLPACK_FLAG_BITMASK_READ_ONLY, mfd);
        expect_error(prod, 3, WIRE_BAD_FD);
        close(mfd);

        /* and an honest reader still maps it writable */
        ck_assert_int_eq(dlx_acquire(good, "badinput/w", NULL, &t), 0);
        ck_assert(!(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
        ((volatile uint8_t *)t->dl_tensor.data)[0] = 1;
        t->deleter(t);

        close(reader);
        close(prod);
        attack_end(good);
}
END_TEST

START_TEST(test_fd_on_hello)
{
        dlx_client *good = attack_begin();
        int fd = fx_raw_connect(&fx), pfd[2];

        ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
        send_hello(fd, HELLO_ID, DLX_PROTO_MAJOR, pfd[0]);
        close(pfd[0]);
        close(pfd[1]);
        expect_hangup(fd, HELLO_ID, WIRE_PROTOCOL);
        attack_end(good);
}
END_TEST

START_TEST(test_two_fds_on_publish)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello(), mfds[2] = {sealed_memfd(4096), sealed_memfd(4096)};
        struct tspec t;
        struct pb p;

        tspec_init(&t, "badinput/two", 4096);
        pb_init(&p);
        pb_publish(&p, 2, &t);
        send_frame(fd, p.b, (uint32_t)p.n, mfds, 2);
        pb_done(&p);
        close(mfds[0]);
        close(mfds[1]);
        expect_hangup(fd, 2, WIRE_PROTOCOL);
        attack_end(good);
}
END_TEST

START_TEST(test_too_many_fds_in_header)
{
        dlx_client *good = attack_begin();
        struct wire_request req = {.id = 2, .type = WIRE_REQ_PING};
        uint8_t payload[64];
        size_t size;
        int fd, mfds[DLX_MAX_FDS_PER_FRAME + 1];

        ck_assert_int_eq(wire_request_size(&req, &size), 0);
        wire_request_pack(&req, payload);

        /* announced but not sent */
        fd = raw_hello();
        ck_assert_int_eq(
                send_frame_ex(fd, payload, (uint32_t)size, DLX_MAX_FDS_PER_FRAME + 1, NULL, 0), 0);
        expect_hangup(fd, 0, WIRE_TOO_BIG);

        /* announced and sent: the daemon must close all of them */
        fd = raw_hello();
        for (int i = 0; i <= DLX_MAX_FDS_PER_FRAME; i++)
                mfds[i] = sealed_memfd(4096);
        send_frame(fd, payload, (uint32_t)size, mfds, DLX_MAX_FDS_PER_FRAME + 1);
        for (int i = 0; i <= DLX_MAX_FDS_PER_FRAME; i++)
                close(mfds[i]);
        expect_hangup(fd, 0, WIRE_TOO_BIG);

        /* 65535 announced */
        fd = raw_hello();
        ck_assert_int_eq(send_frame_ex(fd, payload, (uint32_t)size, 0xffff, NULL, 0), 0);
        expect_hangup(fd, 0, WIRE_TOO_BIG);
        attack_end(good);
}
END_TEST

START_TEST(test_announced_fd_missing)
{
        dlx_client *good = attack_begin();
        struct wire_request req = {.id = 2, .type = WIRE_REQ_PING};
        uint8_t payload[64];
        size_t size;
        int fd = raw_hello();

        ck_assert_int_eq(wire_request_size(&req, &size), 0);
        wire_request_pack(&req, payload);
        ck_assert_int_eq(send_frame_ex(fd, payload, (uint32_t)size, 1, NULL, 0), 0);
        expect_hangup(fd, 0, WIRE_PROTOCOL);
        attack_end(good);
}
END_TEST

/* Sends `rounds` one-byte messages carrying `per` fds each, without any frame. */
static void fd_flood(int fd, int rounds, unsigned per)
{
        int fds[MAX_SEND_FDS], pfd[2];
        uint8_t byte = 0;

        ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
        for (unsigned i = 0; i < per; i++)
                fds[i] = i % 2 ? pfd[1] : pfd[0];
        for (int i = 0; i < rounds; i++) {
                /* the daemon may hang up halfway: later sends then fail, which is fine */
                if (rp_send_raw(fd, &byte, 1, fds, per) < 0)
                        break;
        }
        close(pfd[0]);
        close(pfd[1]);
}

/* 200 fds without a frame, more than the daemon holds: said, then hung up. */
static const struct fd_flood_row {
        const char *what;
        int rounds;
        unsigned per;
} fd_flood_rows[] = {
        {"10 messages of 20: more than one receive can hold", 10, 20},
        {"25 messages of 8: more than the queue holds", 25, 8},
};

START_TEST(fd_flood_is_refused_then_hung_up)
{
        const struct fd_flood_row *row = &fd_flood_rows[_i];
        dlx_client *good = attack_begin();
        int fd = raw_hello();

        fd_flood(fd, row->rounds, row->per);
        expect_hangup(fd, 0, WIRE_TOO_BIG);
        attack_end(good);
}
END_TEST

START_TEST(test_unannounced_fd)
{
        dlx_client *good = attack_begin();
        struct wire_request req = {.id = 2, .type = WIRE_REQ_PING};
        uint8_t payload[64];
        size_t size;
        int fd = raw_hello(), mfd = sealed_memfd(4096);

        /*
         * An fd riding on a frame that announces none waits in the receive queue
         * (fds may arrive ahead of the frame that claims them); it must be closed
         * when the connection ends.
         */
        ck_assert_int_eq(wire_request_size(&req, &size), 0);
        wire_request_pack(&req, payload);
        ck_assert_int_eq(send_frame_ex(fd, payload, (uint32_t)size, 0, &mfd, 1), 0);
        close(mfd);
        rp_expect_ok(fd, 2, WIRE_REP_PONG, NULL, NULL);
        rp_ping(fd, 3);
        close(fd);
        attack_end(good);
}
END_TEST

/* ---- publish: what the fd is --------------------------------------------------------- */

START_TEST(test_publish_wrong_fd_kinds)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello(), pfd[2], sfd[2], dfd, wfd, mfd;
        char path[64];
        struct tspec t;
        FILE *tmp;

        tspec_init(&t, "badinput/kinds", 4096);

        ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
        publish_expect(fd, 2, &t, pfd[0], WIRE_BAD_FD);
        publish_expect(fd, 3, &t, pfd[1], WIRE_BAD_FD);
        close(pfd[0]);
        close(pfd[1]);

        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sfd), 0);
        publish_expect(fd, 4, &t, sfd[0], WIRE_BAD_FD);
        close(sfd[0]);
        close(sfd[1]);

        dfd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        ck_assert_int_ge(dfd, 0);
        publish_expect(fd, 5, &t, dfd, WIRE_BAD_FD);
        close(dfd);

        /* a regular file of the right size that cannot carry seals */
        tmp = tmpfile();
        ck_assert_ptr_nonnull(tmp);
        ck_assert_int_eq(ftruncate(fileno(tmp), 4096), 0);
        publish_expect(fd, 6, &t, fileno(tmp), WIRE_BAD_FD);
        fclose(tmp);

        /* /dev/null: a character device */
        dfd = open("/dev/null", O_RDWR | O_CLOEXEC);
        ck_assert_int_ge(dfd, 0);
        publish_expect(fd, 7, &t, dfd, WIRE_BAD_FD);
        close(dfd);

        /* a sealed memfd reopened write-only: the daemon could never map it */
        mfd = sealed_memfd(4096);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", mfd);
        wfd = open(path, O_WRONLY | O_CLOEXEC);
        ck_assert_int_ge(wfd, 0);
        publish_expect(fd, 8, &t, wfd, WIRE_BAD_FD);
        close(wfd);

        /* the same memfd as it is: accepted, the connection is fine throughout */
        publish_expect(fd, 9, &t, mfd, WIRE_OK);
        close(mfd);
        rp_ping(fd, 10);
        close(fd);
        attack_end(good);
}
END_TEST

START_TEST(test_publish_unsealed_memfd)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello(), mfd;
        struct tspec t;

        tspec_init(&t, "badinput/unsealed", 4096);
        mfd = make_memfd(4096, 0);
        publish_expect(fd, 2, &t, mfd, WIRE_BAD_FD);
        close(mfd);
        /* half the seals are not enough either way */
        mfd = make_memfd(4096, F_SEAL_SHRINK);
        publish_expect(fd, 3, &t, mfd, WIRE_BAD_FD);
        close(mfd);
        mfd = make_memfd(4096, F_SEAL_GROW);
        publish_expect(fd, 4, &t, mfd, WIRE_BAD_FD);
        close(mfd);
        /* a memfd created without MFD_ALLOW_SEALING is sealed against sealing only */
        mfd = memfd_create("badinput-nosealing", MFD_CLOEXEC);
        ck_assert_int_ge(mfd, 0);
        ck_assert_int_eq(ftruncate(mfd, 4096), 0);
        publish_expect(fd, 5, &t, mfd, WIRE_BAD_FD);
        close(mfd);
        /* sealed but empty */
        t.shape[0] = 0;
        t.length = 0;
        mfd = sealed_memfd(0);
        publish_expect(fd, 6, &t, mfd, WIRE_BAD_FD);
        close(mfd);
        rp_ping(fd, 7);
        close(fd);
        attack_end(good);
}
END_TEST

/* ---- cuda-vmm: only a driver export ------------------------------------------------- */

#define NVIDIA_EXPORT "a cuda-vmm fd must be an NVIDIA driver export (/dev/nvidiactl, char 195:255)"
#define VMM_BYTES 4096

/* An fd a peer passes off as a VMM export, and what dlxd must call it. */
struct impostor {
        const char *what;
        int fd;
        uint64_t declared; /* the segment size claimed for it */
        char says[64];
        const char *unsaid; /* NULL, or what the refusal must not call it */
};

static void impostor(struct impostor *v, size_t *n, const char *what, int fd, const char *says)
{
        ck_assert_msg(fd >= 0, "%s: %s", what, strerror(errno));
        v[*n] = (struct impostor){.what = what, .fd = fd, .declared = VMM_BYTES};
        snprintf(v[*n].says, sizeof(v[*n].says), "%s", says);
        (*n)++;
}

/* A character device, named as dlxd names it: by its number. */
static void impostor_dev(struct impostor *v, size_t *n, const char *path)
{
        int fd = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
        struct stat sb;
        char says[64];

        ck_assert_msg(fd >= 0 && fstat(fd, &sb) == 0, "%s: %s", path, strerror(errno));
        snprintf(says, sizeof(says), "not character device %u:%u", major(sb.st_rdev),
                 minor(sb.st_rdev));
        impostor(v, n, path, fd, says);
}

/*
 * Every kind of fd that is not a file of NVIDIA's control device: what a
 * careless or hostile peer could attach to a cuda-vmm alloc or publish.
 * Returns how many (at most 16); impostors_close() closes them.
 */
static size_t impostors(struct impostor *v)
{
        int pfd[2], sfd[2], fd;
        size_t n = 0;

        impostor(v, &n, "an unsealed memfd", make_memfd(VMM_BYTES, 0),
                 "not a regular file (a memfd)");
        impostor(v, &n, "a sealed memfd",
                 make_memfd(VMM_BYTES, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE),
                 "not a regular file (a memfd)");
        fd = open(fx.dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        ck_assert_msg(fd < 0 || ftruncate(fd, VMM_BYTES) == 0, "ftruncate: %s", strerror(errno));
        impostor(v, &n, "an O_TMPFILE file", fd, "not a regular file");
        v[n - 1].unsaid = "memfd";
        impostor_dev(v, &n, "/dev/zero");
        v[n - 1].declared = DLX_MAX_SEGMENT; /* endless bytes, declared as 1 TiB */
        impostor_dev(v, &n, "/dev/null");
        /* a character device whose every open is distinct (the CUDA double exports through it) */
        impostor_dev(v, &n, "/dev/ptmx");
        impostor(v, &n, "an eventfd", eventfd(0, EFD_CLOEXEC), "not an anonymous inode (eventfd)");
        ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
        impostor(v, &n, "a pipe's read end", pfd[0], "not a pipe");
        impostor(v, &n, "a pipe's write end", pfd[1], "not a pipe");
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sfd), 0);
        impostor(v, &n, "a socket", sfd[0], "not a socket");
        close(sfd[1]);
        impostor(v, &n, "a directory", open(fx.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC),
                 "not a directory");
        /* which no driver can use, whatever device it is a file of */
        impostor(v, &n, "an O_PATH fd of /dev/ptmx", open("/dev/ptmx", O_PATH | O_CLOEXEC),
                 "not an O_PATH descriptor");
        return n;
}

static void impostors_close(struct impostor *v, size_t n)
{
        for (size_t i = 0; i < n; i++)
                close(v[i].fd);
}

/* The refusal of request id, which must say why (prefix) and name what came (says). */
static void expect_impostor_refused(int fd, uint64_t id, const char *prefix,
                                    const struct impostor *v)
{
        char msg[DLX_ERROR_MAX + 1];

        expect_error_msg(fd, id, WIRE_BAD_FD, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, prefix) && strstr(msg, v->says),
                      "%s as a cuda-vmm fd: '%s' lacks '%s' or '%s'", v->what, msg, prefix,
                      v->says);
        ck_assert_msg(!v->unsaid || !strstr(msg, v->unsaid), "%s as a cuda-vmm fd: '%s' says '%s'",
                      v->what, msg, v->unsaid);
}

static void send_vmm_alloc(int fd, uint64_t id, uint64_t size, int attach_fd)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_ALLOC};

        req.alloc.size = size;
        req.alloc.storage = WIRE_STORAGE_CUDA_VMM;
        rp_send(fd, &req, attach_fd);
}

/* Publishes name as bytes of uint8 on cuda:0 at offset 0 of segment (0 with attach_fd). */
static void send_vmm_publish(int fd, uint64_t id, const char *name, uint64_t segment,
                             uint64_t segment_size, int attach_fd)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_PUBLISH};
        struct wire_tensor *t = &req.publish.tensor;

        snprintf(t->name, sizeof(t->name), "%s", name);
        t->dtype = (DLDataType){kDLUInt, 8, 1};
        t->ndim = 1;
        t->shape[0] = VMM_BYTES;
        t->strides[0] = 1;
        t->device_type = kDLCUDA;
        t->storage = WIRE_STORAGE_CUDA_VMM;
        t->segment = segment;
        t->length = VMM_BYTES;
        req.publish.segment_size = segment_size;
        rp_send(fd, &req, attach_fd);
}

/*
 * A cuda-vmm alloc with anything but a file of NVIDIA's control device is
 * refused: BAD_FD, saying what the fd is, the fd closed, the connection kept.
 */
START_TEST(test_alloc_vmm_impostors)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();
        struct impostor v[16];
        size_t n = impostors(v);

        for (size_t i = 0; i < n; i++) {
                send_vmm_alloc(fd, 2 + 2 * i, v[i].declared, v[i].fd);
                expect_impostor_refused(fd, 2 + 2 * i, NVIDIA_EXPORT, &v[i]);
                rp_ping(fd, 3 + 2 * i);
        }
        impostors_close(v, n);
        close(fd);
        attack_end(good);
}
END_TEST

/*
 * Nor does one reach a consumer through a publish: attached to it, or named
 * by a segment id its refused alloc never got. A consumer waiting for the
 * name gets the first tensor that is really published under it.
 */
START_TEST(test_publish_vmm_impostors)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello(), consumer = raw_hello();
        struct wire_request acq = {.id = 2, .type = WIRE_REQ_ACQUIRE};
        struct impostor v[16];
        struct wire_reply rep;
        struct tspec t;
        size_t n = impostors(v);
        uint64_t id = 2;

        snprintf(acq.acquire.name, sizeof(acq.acquire.name), "badinput/vmm");
        acq.acquire.timeout_ms = 4 * REPLY_TIMEOUT_MS;
        rp_send(consumer, &acq, -1);
        for (size_t i = 0; i < n; i++) {
                send_vmm_alloc(fd, id, v[i].declared, v[i].fd);
                expect_impostor_refused(fd, id++, NVIDIA_EXPORT, &v[i]);
                send_vmm_publish(fd, id, "badinput/vmm", 0, v[i].declared, v[i].fd);
                expect_impostor_refused(fd, id++, NVIDIA_EXPORT, &v[i]);
        }
        for (uint64_t seg = 1; seg <= n + 2; seg++) {
                send_vmm_publish(fd, id, "badinput/vmm", seg, VMM_BYTES, -1);
                expect_error(fd, id++, WIRE_BAD_FD);
        }
        impostors_close(v, n);
        rp_ping(fd, id);

        /* the first publish of the name that was accepted: a CPU tensor, version 1 */
        tspec_init(&t, "badinput/vmm", VMM_BYTES);
        publish_memfd_expect(fd, ++id, &t, VMM_BYTES, WIRE_OK);
        rp_expect_ok(consumer, 2, WIRE_REP_ACQUIRE, &rep, NULL);
        ck_assert_uint_eq(rep.acquire.tensor.storage, WIRE_STORAGE_MEMFD);
        ck_assert_uint_eq(rep.acquire.tensor.version, 1);
        close(consumer);
        close(fd);
        attack_end(good);
}
END_TEST

/* ---- publish: the descriptor against its segment ------------------------------------- */

/*
 * A valid descriptor as tspec_init(name, bytes) makes it, the fields after it
 * overriding its own (a row spoils one thing at a time).
 */
#define SPEC(name_, bytes, ...)                                                                    \
        {                                                                                          \
                .name = name_, .name_len = sizeof(name_) - 1, .code = kDLFloat, .bits = 32,        \
                .lanes = 1, .ndim = 1, .nstrides = 1, .shape[0] = (bytes) / 4, .strides[0] = 1,    \
                .device_type = kDLCPU, .storage = WIRE_STORAGE_MEMFD, .length = (bytes),           \
                __VA_ARGS__                                                                        \
        }
#define SHORT(...) SPEC("badinput/short", __VA_ARGS__)
#define EXTENT(...) SPEC("badinput/extent", __VA_ARGS__)
#define NEGATIVE(dim)                                                                              \
        SPEC("badinput/negative", 4096, .ndim = 2, .nstrides = 2, .shape[0] = dim, .shape[1] = 4,  \
             .strides[0] = 4, .strides[1] = 1)
#define STRIDES(...)                                                                               \
        SPEC("badinput/strides", 64, .ndim = 2, .shape[0] = 4, .shape[1] = 4, .strides[0] = 4,     \
             .strides[1] = 1, __VA_ARGS__)
#define OVERFLOW(...) SPEC("badinput/overflow", __VA_ARGS__)
#define DTYPE(code_, bits_, lanes_)                                                                \
        SPEC("badinput/dtype", 4096, .code = (code_), .bits = (bits_), .lanes = (lanes_))
#define DEVICE(type) SPEC("badinput/device", 4096, .device_type = (type))
#define STORAGE(kind) SPEC("badinput/storage", 4096, .storage = (kind))

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
/*
 * Publishes over a 4 KiB memfd: the descriptor against its segment, and its
 * arithmetic; without_fd: refused the same with no fd at all.
 */
static const struct publish_row {
        const char *what;
        struct tspec t;
        enum wire_status status;
        bool without_fd;
} publish_rows[] = {
        {"an fd attached and a segment named", SPEC("badinput/both", 4096, .segment = 1),
         WIRE_INVALID},
        {"length beyond the memfd", SHORT(8192), WIRE_INVALID},
        {"offset beyond the memfd", SHORT(4, .offset = 4097), WIRE_INVALID},
        {"offset + length just past the end", SHORT(200, .offset = 3900), WIRE_INVALID},
        {"offset + length wrapping around 2^64", SHORT(16, .offset = 64, .length = UINT64_MAX - 32),
         WIRE_INVALID},
        {"exactly fitting", SHORT(196, .offset = 3900), WIRE_OK},
        {"strides twice the element count", EXTENT(4096, .strides[0] = 2), WIRE_INVALID},
        {"byte_offset pushes the one element past the region",
         EXTENT(4, .byte_offset = 4096, .length = 4096), WIRE_INVALID},
        {"two dims, 64 KiB of elements in a 4 KiB memfd",
         EXTENT(4096, .ndim = 2, .nstrides = 2, .shape[0] = 128, .shape[1] = 128, .strides[0] = 128,
                .strides[1] = 1),
         WIRE_INVALID},
        {"a huge stride on a dimension of 2", EXTENT(8, .shape[0] = 2, .strides[0] = 1 << 20),
         WIRE_INVALID},
        {"a negative stride reaching before the start of the segment", EXTENT(16, .strides[0] = -1),
         WIRE_INVALID},
        {"a complex dtype whose 16-byte elements overrun a region sized for float32",
         EXTENT(4096, .code = kDLComplex, .bits = 128), WIRE_INVALID},
        {"a sub-byte packed dtype with non-compact strides",
         EXTENT(4096, .code = kDLInt, .bits = 4, .shape[0] = 16, .strides[0] = 2), WIRE_INVALID},
        {"the same negative stride starting from the end",
         EXTENT(4, .shape[0] = 4, .strides[0] = -1, .offset = 12), WIRE_OK},
        {"dimension -1", NEGATIVE(-1), WIRE_INVALID},
        {"dimension -2", NEGATIVE(-2), WIRE_INVALID},
        {"dimension INT64_MIN", NEGATIVE(INT64_MIN), WIRE_INVALID},
        {"no strides for two dims", STRIDES(.nstrides = 0), WIRE_INVALID},
        {"one stride for two dims", STRIDES(.nstrides = 1), WIRE_INVALID},
        {"three strides for two dims", STRIDES(.nstrides = 3, .strides[2] = 1), WIRE_INVALID},
        {"strides without any shape", STRIDES(.ndim = 0, .nstrides = 1, .strides[2] = 1),
         WIRE_INVALID},
        /* byte_offset near 2^64: does not fit in the 63 bits an extent has */
        {"byte_offset near 2^64", OVERFLOW(4, .byte_offset = UINT64_MAX - 3), WIRE_TOO_BIG},
        {"byte_offset that fits, but the extent after it does not",
         OVERFLOW(8, .shape[0] = 2, .byte_offset = (uint64_t)INT64_MAX - 1), WIRE_TOO_BIG},
        {"an element count past 2^63",
         OVERFLOW(4096, .ndim = 2, .nstrides = 2, .shape[0] = INT64_MAX, .shape[1] = 4,
                  .strides[0] = 4, .strides[1] = 1),
         WIRE_TOO_BIG},
        {"a stride times its dimension past 2^63",
         OVERFLOW(8, .shape[0] = 2, .strides[0] = INT64_MAX / 2), WIRE_TOO_BIG},
        {"a large byte_offset that fits in 63 bits but not in the segment",
         OVERFLOW(4, .byte_offset = UINT64_C(1) << 62), WIRE_INVALID},
        {"an unknown dtype code", DTYPE(200, 32, 1), WIRE_INVALID},
        {"a float of 7 bits", DTYPE(kDLFloat, 7, 1), WIRE_INVALID},
        {"a float of 8 bits: not a float8 code", DTYPE(kDLFloat, 8, 1), WIRE_INVALID},
        {"a bfloat of 32 bits (bfloat is 16)", DTYPE(kDLBfloat, 32, 1), WIRE_INVALID},
        {"a complex of 16 bits", DTYPE(kDLComplex, 16, 1), WIRE_INVALID},
        {"a bool of 16 bits", DTYPE(kDLBool, 16, 1), WIRE_INVALID},
        {"an int of zero bits", DTYPE(kDLInt, 0, 1), WIRE_INVALID},
        {"zero lanes", DTYPE(kDLFloat, 32, 0), WIRE_INVALID},
        {"an opaque handle: a pointer means nothing elsewhere", DTYPE(kDLOpaqueHandle, 64, 1),
         WIRE_INVALID},
        {"a dtype code out of the wire range", DTYPE(300, 32, 1), WIRE_INVALID},
        {"dtype bits out of the wire range", DTYPE(kDLFloat, 256, 1), WIRE_INVALID},
        {"dtype lanes out of the wire range", DTYPE(kDLFloat, 32, 70000), WIRE_INVALID},
        {"a CUDA device on a memfd", DEVICE(kDLCUDA), WIRE_INVALID},
        {"a CUDA host device on a memfd", DEVICE(kDLCUDAHost), WIRE_INVALID},
        {"a ROCm device", DEVICE(kDLROCM), WIRE_INVALID},
        {"device type -1", DEVICE(-1), WIRE_INVALID},
        {"device type 1000", DEVICE(1000), WIRE_INVALID},
        /* with its fd attached, which must be closed, and without */
        {"storage 99", STORAGE(99), WIRE_NOT_SUPPORTED, true},
        {"storage unspecified", STORAGE(WIRE_STORAGE_UNSPECIFIED), WIRE_NOT_SUPPORTED, true},
        {"storage 5", STORAGE(5), WIRE_NOT_SUPPORTED, true},
        {"storage INT32_MAX", STORAGE(0x7fffffff), WIRE_NOT_SUPPORTED, true},
};
#pragma GCC diagnostic pop

START_TEST(publish_checks_the_descriptor_against_its_segment)
{
        const struct publish_row *row = &publish_rows[_i];
        dlx_client *good = attack_begin();
        int fd = raw_hello();

        publish_memfd_expect(fd, 2, &row->t, 4096, row->status);
        if (row->without_fd)
                publish_expect(fd, 3, &row->t, -1, row->status);
        rp_ping(fd, 4); /* the connection goes on */
        close(fd);
        attack_end(good);
}
END_TEST

START_TEST(test_publish_ndim_33)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();
        struct tspec t;

        tspec_init(&t, "badinput/ndim", 4);
        t.ndim = t.nstrides = DLX_MAX_NDIM + 1;
        for (size_t i = 0; i < t.ndim; i++) {
                t.shape[i] = 1;
                t.strides[i] = 1;
        }
        publish_memfd_expect(fd, 2, &t, 4096, WIRE_INVALID);
        t.ndim = t.nstrides = 40;
        publish_memfd_expect(fd, 3, &t, 4096, WIRE_INVALID);
        /* 32 is fine */
        t.ndim = t.nstrides = DLX_MAX_NDIM;
        publish_memfd_expect(fd, 4, &t, 4096, WIRE_OK);
        close(fd);
        attack_end(good);
}
END_TEST

/* ---- names --------------------------------------------------------------------------- */

struct bad_name {
        const char *name;
        size_t len;
};

/* clang-format off */
#define BAD(s) {(s), sizeof(s) - 1}
/* clang-format on */

static const struct bad_name bad_names[] = {
        BAD(""),
        BAD("a//b"),
        BAD("/a"),
        BAD("a/"),
        BAD("a/../b"),
        BAD("a/./b"),
        BAD("."),
        BAD(".."),
        BAD("/"),
        BAD("\x01"),
        BAD("a\x1f"
            "b"),
        BAD("a\x7f"),
        BAD("tab\tname"),
        BAD("line\nbreak"),
        BAD("\xff"),
        BAD("a\xc3"),            /* truncated sequence */
        BAD("\xc0\xaf"),         /* overlong '/' */
        BAD("\xed\xa0\x80"),     /* a UTF-16 surrogate */
        BAD("\xf4\x90\x80\x80"), /* past U+10FFFF */
        BAD("\xc2\x85"),         /* C1 control NEL */
        BAD("a\0b"),             /* embedded NUL */
        BAD("\0"),
};

/* A name of n bytes of 'x'. */
static void long_name(char *buf, size_t n)
{
        memset(buf, 'x', n);
        buf[n] = '\0';
}

START_TEST(test_publish_bad_names)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();
        char name[DLX_NAME_MAX + 2];
        uint64_t id = 2;
        struct tspec t;

        for (size_t i = 0; i < N_ELEMS(bad_names); i++) {
                tspec_init(&t, "x", 4096);
                tspec_name(&t, bad_names[i].name, bad_names[i].len);
                publish_memfd_expect(fd, id++, &t, 4096, WIRE_INVALID);
        }
        long_name(name, DLX_NAME_MAX + 1);
        tspec_init(&t, name, 4096);
        publish_memfd_expect(fd, id++, &t, 4096, WIRE_INVALID);
        /* 255 bytes is the longest name */
        long_name(name, DLX_NAME_MAX);
        tspec_init(&t, name, 4096);
        publish_memfd_expect(fd, id++, &t, 4096, WIRE_OK);
        close(fd);
        attack_end(good);
}
END_TEST

/*
 * Each of names, and a name one byte too long, in a request of each of the
 * two body kinds: every one refused as invalid, the connection kept.
 */
static void named_requests_refused(const struct bad_name *names, size_t n, const unsigned bodies[2])
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();
        char name[DLX_NAME_MAX + 2];
        uint64_t id = 2;
        struct pb p;

        long_name(name, DLX_NAME_MAX + 1);
        for (size_t b = 0; b < 2; b++) {
                for (size_t i = 0; i <= n; i++) {
                        bool last = i == n;
                        pb_init(&p);
                        pb_named(&p, id, bodies[b], last ? name : names[i].name,
                                 last ? strlen(name) : names[i].len);
                        send_pb(fd, &p, -1);
                        pb_done(&p);
                        expect_error(fd, id++, WIRE_INVALID);
                }
        }
        rp_ping(fd, id);
        close(fd);
        attack_end(good);
}

START_TEST(test_acquire_stat_bad_names)
{
        static const unsigned bodies[] = {PB_REQ_ACQUIRE, PB_REQ_STAT};

        named_requests_refused(bad_names, N_ELEMS(bad_names), bodies);
}
END_TEST

START_TEST(test_bad_prefixes)
{
        static const struct bad_name prefixes[] = {BAD("\x01"), BAD("\xff"), BAD("a\0b"),
                                                   BAD("\xc2\x9f")};
        static const unsigned bodies[] = {PB_REQ_LIST, PB_REQ_WATCH};

        named_requests_refused(prefixes, N_ELEMS(prefixes), bodies);
}
END_TEST

/* ---- dtype, storage, device, segment ------------------------------------------------- */

START_TEST(test_publish_foreign_segment)
{
        dlx_client *good = attack_begin();
        int owner = raw_hello(), thief = raw_hello();
        uint64_t seg = rp_alloc(owner, 2, 4096, NULL);
        struct tspec t;

        tspec_init(&t, "badinput/segment", 4096);
        /* no fd and no segment */
        publish_expect(thief, 2, &t, -1, WIRE_BAD_FD);
        /* a segment that does not exist */
        t.segment = 12345;
        publish_expect(thief, 3, &t, -1, WIRE_BAD_FD);
        t.segment = UINT64_MAX;
        publish_expect(thief, 4, &t, -1, WIRE_BAD_FD);
        /* another session's allocation */
        t.segment = seg;
        publish_expect(thief, 5, &t, -1, WIRE_BAD_FD);
        /* the owner may */
        publish_expect(owner, 3, &t, -1, WIRE_OK);
        rp_ping(thief, 6);
        close(thief);
        close(owner);
        attack_end(good);
}
END_TEST

/* ---- leases, segments, watches ------------------------------------------------------- */

static void send_release(int fd, uint64_t id, uint64_t lease)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_RELEASE};

        req.release.lease = lease;
        rp_send(fd, &req, -1);
}

START_TEST(test_release_bad_leases)
{
        dlx_client *good = attack_begin();
        int owner = raw_hello(), other = raw_hello();
        struct wire_request req = {.id = 4, .type = WIRE_REQ_ACQUIRE};
        struct wire_reply rep;
        uint64_t seg, lease;
        struct tspec t;

        /* a lease that never existed */
        send_release(other, 2, 987654321);
        expect_error(other, 2, WIRE_NOT_FOUND);
        /* lease 0 is the release ring's wake-up: silent, the next reply is the pong */
        send_release(other, 3, 0);
        rp_ping(other, 30);

        /* owner takes a real lease */
        seg = rp_alloc(owner, 2, 4096, NULL);
        tspec_init(&t, "badinput/lease", 4096);
        t.segment = seg;
        publish_expect(owner, 3, &t, -1, WIRE_OK);
        snprintf(req.acquire.name, sizeof(req.acquire.name), "badinput/lease");
        rp_send(owner, &req, -1);
        rp_expect_ok(owner, 4, WIRE_REP_ACQUIRE, &rep, NULL);
        lease = rep.acquire.lease;

        /* someone else's lease */
        send_release(other, 4, lease);
        expect_error(other, 4, WIRE_NOT_FOUND);

        /* the owner's release is silent: the next reply is the pong */
        send_release(owner, 5, lease);
        rp_ping(owner, 6);
        /* and the second one is an error */
        send_release(owner, 7, lease);
        expect_error(owner, 7, WIRE_NOT_FOUND);
        rp_ping(owner, 8);
        rp_ping(other, 5);
        close(other);
        close(owner);
        attack_end(good);
}
END_TEST

START_TEST(test_alloc_bad_sizes)
{
        static const uint64_t sizes[] = {0, DLX_MAX_SEGMENT + 1, UINT64_MAX, UINT64_C(1) << 63};
        dlx_client *good = attack_begin();
        int fd = raw_hello();

        for (size_t i = 0; i < N_ELEMS(sizes); i++) {
                struct wire_request req = {.id = 2 + i, .type = WIRE_REQ_ALLOC};
                req.alloc.size = sizes[i];
                rp_send(fd, &req, -1);
                expect_error(fd, 2 + i, WIRE_INVALID);
        }
        rp_ping(fd, 100);
        close(fd);
        attack_end(good);
}
END_TEST

START_TEST(test_free_unwatch_unknown)
{
        dlx_client *good = attack_begin();
        int owner = raw_hello(), other = raw_hello();
        struct wire_request req;
        struct wire_reply rep;
        uint64_t seg = rp_alloc(owner, 2, 4096, NULL);

        req = (struct wire_request){.id = 2, .type = WIRE_REQ_FREE};
        req.free.segment = 424242;
        rp_send(other, &req, -1);
        expect_error(other, 2, WIRE_NOT_FOUND);
        /* another session's segment */
        req = (struct wire_request){.id = 3, .type = WIRE_REQ_FREE};
        req.free.segment = seg;
        rp_send(other, &req, -1);
        expect_error(other, 3, WIRE_NOT_FOUND);
        req = (struct wire_request){.id = 4, .type = WIRE_REQ_UNWATCH};
        req.unwatch.watch = 31337;
        rp_send(other, &req, -1);
        expect_error(other, 4, WIRE_NOT_FOUND);
        /* the owner frees it once, and only once */
        req = (struct wire_request){.id = 3, .type = WIRE_REQ_FREE};
        req.free.segment = seg;
        rp_send(owner, &req, -1);
        rp_expect_ok(owner, 3, WIRE_REP_NONE, NULL, NULL);
        /* its last reference gone, the segment is destroyed and the owner told */
        rp_expect_ok(owner, 0, WIRE_REP_EVENT, &rep, NULL);
        ck_assert_int_eq(rep.event.kind, WIRE_EVENT_SEGMENT_GONE);
        ck_assert_uint_eq(rep.event.segment, seg);
        req.id = 4;
        rp_send(owner, &req, -1);
        expect_error(owner, 4, WIRE_NOT_FOUND);
        rp_ping(owner, 5);
        rp_ping(other, 5);
        close(other);
        close(owner);
        attack_end(good);
}
END_TEST

START_TEST(test_watch_flood)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();
        uint64_t id = 2;

        /* 256 watches per session, then LIMIT */
        for (int i = 0; i < 256; i++, id++) {
                struct wire_request req = {.id = id, .type = WIRE_REQ_WATCH};
                snprintf(req.watch.prefix, sizeof(req.watch.prefix), "badinput/w%d", i);
                rp_send(fd, &req, -1);
                rp_expect_ok(fd, id, WIRE_REP_WATCH, NULL, NULL);
        }
        for (int i = 0; i < 10; i++, id++) {
                struct wire_request req = {.id = id, .type = WIRE_REQ_WATCH};
                rp_send(fd, &req, -1);
                expect_error(fd, id, WIRE_LIMIT);
        }
        rp_ping(fd, id);
        close(fd);
        attack_end(good);
}
END_TEST

START_TEST(test_acquire_extreme_timeouts)
{
        static const int64_t forever[] = {INT64_MAX, INT64_MIN, -1};
        dlx_client *good = attack_begin();
        struct wire_request req = {.type = WIRE_REQ_ACQUIRE};
        int fd = raw_hello(), mfd = sealed_memfd(4096);
        struct tspec t;

        /* every one of these waits, without a reply, for a name nobody publishes */
        snprintf(req.acquire.name, sizeof(req.acquire.name), "badinput/never");
        for (size_t i = 0; i < N_ELEMS(forever); i++) {
                req.id = 2 + i;
                req.acquire.timeout_ms = forever[i];
                rp_send(fd, &req, -1);
        }
        /* an impossible version of a name that exists, without waiting */
        tspec_init(&t, "badinput/exists", 4096);
        publish_expect(fd, 9, &t, mfd, WIRE_OK);
        close(mfd);
        req.id = 10;
        req.acquire.timeout_ms = 0;
        req.acquire.min_version = UINT64_MAX;
        snprintf(req.acquire.name, sizeof(req.acquire.name), "badinput/exists");
        rp_send(fd, &req, -1);
        expect_error(fd, 10, WIRE_NOT_FOUND);
        /* and with a 1 ms timeout: the timer fires */
        req.id = 11;
        req.acquire.timeout_ms = 1;
        rp_send(fd, &req, -1);
        expect_error(fd, 11, WIRE_TIMEOUT);
        rp_ping(fd, 12);
        /* the peer leaves with its waiters (one with a timer) pending */
        req.id = 13;
        req.acquire.timeout_ms = 60000;
        rp_send(fd, &req, -1);
        rp_ping(fd, 14);
        close(fd);
        attack_end(good);
}
END_TEST

/* ---- floods and slow peers ----------------------------------------------------------- */

#define FLOOD_REQUESTS 10000

START_TEST(test_acquire_flood)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();
        const uint64_t base = 100;
        uint8_t *buf;
        size_t size, frame, off = 0;
        struct wire_request req = {.type = WIRE_REQ_ACQUIRE};
        struct wire_reply rep;

        /* 10k acquires waiting forever on a name nobody has published, in one stream */
        snprintf(req.acquire.name, sizeof(req.acquire.name), "badinput/flood/missing");
        req.acquire.timeout_ms = -1;
        req.id = base + FLOOD_REQUESTS;
        ck_assert_int_eq(wire_request_size(&req, &size), 0);
        buf = malloc((FRAME_HEADER_SIZE + size) * FLOOD_REQUESTS);
        ck_assert_ptr_nonnull(buf);
        for (uint64_t i = 1; i <= FLOOD_REQUESTS; i++) {
                req.id = base + i;
                ck_assert_int_eq(wire_request_size(&req, &frame), 0);
                frame_header_put(buf + off, (uint32_t)frame, 0);
                ck_assert_uint_eq(wire_request_pack(&req, buf + off + FRAME_HEADER_SIZE), frame);
                off += FRAME_HEADER_SIZE + frame;
        }
        ck_assert_int_eq(rp_send_raw(fd, buf, off, NULL, 0), 0);
        free(buf);

        /* the first DLX_MAX_INFLIGHT wait silently; every later one is refused, in order */
        for (uint64_t i = DLX_MAX_INFLIGHT + 1; i <= FLOOD_REQUESTS; i++)
                expect_error(fd, base + i, WIRE_LIMIT);
        rp_ping(fd, 2);

        /* publishing the name satisfies exactly the waiting ones, in order */
        DLManagedTensorVersioned *t;
        int64_t shape[1] = {4};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}};
        proto.shape = shape;
        ck_assert_int_eq(dlx_alloc(good, &proto, &t), 0);
        ck_assert_int_eq(dlx_publish(good, "badinput/flood/missing", t, NULL, NULL), 0);
        for (uint64_t i = 1; i <= DLX_MAX_INFLIGHT; i++) {
                rp_expect_ok(fd, base + i, WIRE_REP_ACQUIRE, &rep, NULL);
                ck_assert_str_eq(rep.acquire.tensor.name, "badinput/flood/missing");
        }
        rp_ping(fd, 3);
        close(fd);
        ck_assert_int_eq(fx_wait_leases(good, 0, 5000), 0);
        ck_assert_int_eq(dlx_unpublish(good, "badinput/flood/missing"), 0);
        attack_end(good);
}
END_TEST

START_TEST(test_slow_partial_frame)
{
        dlx_client *good = attack_begin();
        struct wire_request req = {.id = HELLO_ID, .type = WIRE_REQ_HELLO};
        uint8_t frame[256];
        struct wire_reply rep;
        size_t size;
        int fd = fx_raw_connect(&fx);

        req.hello.major = DLX_PROTO_MAJOR;
        snprintf(req.hello.client_name, sizeof(req.hello.client_name), "slowpoke");
        ck_assert_int_eq(wire_request_size(&req, &size), 0);
        frame_header_put(frame, (uint32_t)size, 0);
        wire_request_pack(&req, frame + FRAME_HEADER_SIZE);

        /* half a header, then the rest of the world carries on */
        ck_assert_int_eq(rp_send_raw(fd, frame, 3, NULL, 0), 0);
        assert_daemon_serves(good);
        /* a byte at a time, the good client interleaved */
        for (size_t i = 3; i < FRAME_HEADER_SIZE + size; i++) {
                ck_assert_int_eq(rp_send_raw(fd, frame + i, 1, NULL, 0), 0);
                ck_assert_int_eq(dlx_ping(good), 0);
                fx_sleep_ms(2);
                /* nothing may come back before the frame is whole */
                if (i + 1 < FRAME_HEADER_SIZE + size)
                        ck_assert_int_eq(rp_read(fd, &rep, 0, NULL), -ETIMEDOUT);
        }
        rp_expect_ok(fd, HELLO_ID, WIRE_REP_HELLO, NULL, NULL);

        /* a ping split exactly at the header/payload boundary, with a pause there */
        req = (struct wire_request){.id = 2, .type = WIRE_REQ_PING};
        ck_assert_int_eq(wire_request_size(&req, &size), 0);
        frame_header_put(frame, (uint32_t)size, 0);
        wire_request_pack(&req, frame + FRAME_HEADER_SIZE);
        ck_assert_int_eq(rp_send_raw(fd, frame, FRAME_HEADER_SIZE, NULL, 0), 0);
        assert_daemon_serves(good);
        ck_assert_int_eq(rp_send_raw(fd, frame + FRAME_HEADER_SIZE, size, NULL, 0), 0);
        rp_expect_ok(fd, 2, WIRE_REP_PONG, NULL, NULL);
        close(fd);
        attack_end(good);
}
END_TEST

/* Names long enough that a list page of them is big. */
#define HOG_NAMES 64

START_TEST(test_peer_not_reading)
{
        dlx_client *good = attack_begin();
        int fd = raw_hello();
        uint64_t seg = rp_alloc(fd, 2, 4096, NULL), id = 100;
        struct wire_request list = {.type = WIRE_REQ_LIST};
        struct dlx_stats st;
        struct tspec t;
        uint8_t frame[128];
        size_t size;
        long sent = 0;
        char name[DLX_NAME_MAX + 1];

        /* 64 names of 250 bytes: every list reply is some 20 KiB */
        for (int i = 0; i < HOG_NAMES; i++) {
                memset(name, 'h', 250);
                snprintf(name, sizeof(name), "badinput/hog/%02d/", i);
                name[strlen(name)] = 'h';
                name[250] = '\0';
                tspec_init(&t, name, 4);
                t.segment = seg;
                publish_expect(fd, 3 + (uint64_t)i, &t, -1, WIRE_OK);
        }
        ck_assert_int_eq(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);

        /* ask for lists and never read them, until the daemon stops taking requests */
        snprintf(list.list.prefix, sizeof(list.list.prefix), "badinput/hog/");
        for (;;) {
                list.id = id++;
                ck_assert_int_eq(wire_request_size(&list, &size), 0);
                frame_header_put(frame, (uint32_t)size, 0);
                wire_request_pack(&list, frame + FRAME_HEADER_SIZE);
                ssize_t n = send(fd, frame, FRAME_HEADER_SIZE + size, MSG_NOSIGNAL);
                if (n < 0 && errno == EAGAIN) {
                        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                        if (poll(&pfd, 1, 1000) == 0)
                                break; /* the daemon no longer reads this peer */
                        id--;
                        continue;
                }
                if (n < 0)
                        break; /* hung up on */
                /* a frame is small enough to go whole into a socket with any room */
                ck_assert_int_eq(n, (ssize_t)(FRAME_HEADER_SIZE + size));
                ck_assert_msg(++sent < 5000,
                              "the daemon kept queueing replies for a peer that reads none: "
                              "%ld list replies",
                              sent);
        }
        /* several MiB at least, whatever the exact size of a reply */
        ck_assert_int_gt(sent, 400);

        /*
         * The daemon stopped reading it (flow control), and once it has read
         * nothing for the timeout the peer is disconnected: its session (and
         * its 64 names) go without its help, and the daemon does not spin on
         * it meanwhile.
         */
        long ticks = sysconf(_SC_CLK_TCK), cpu0 = daemon_cpu_ticks();
        int64_t start = fx_now_ms(), deadline = start + DLX_DEFAULT_DAEMON_TIMEOUT_MS + 5000;
        do {
                fx_sleep_ms(50);
                ck_assert_int_eq(dlx_stats(good, &st), 0);
        } while (st.clients != 1 && fx_now_ms() < deadline);
        long used = daemon_cpu_ticks() - cpu0;
        int64_t waited = fx_now_ms() - start;
        ck_assert_msg(st.clients == 1 && st.names == 0,
                      "a peer that stopped reading its replies is still connected %lld ms after "
                      "the daemon stopped reading it (%u clients, %llu names); meanwhile dlxd "
                      "used %ld ms of CPU",
                      (long long)waited, st.clients, (unsigned long long)st.names,
                      used * 1000 / ticks);
        ck_assert_msg(used * 1000 / ticks < waited / 2 + 100,
                      "dlxd used %ld ms of CPU in %lld ms while a peer was not reading",
                      used * 1000 / ticks, (long long)waited);

        /* what it gets when it does read: replies, then the hang-up */
        ck_assert_int_eq(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK), 0);
        for (;;) {
                struct wire_reply rep;
                int r = rp_read(fd, &rep, REPLY_TIMEOUT_MS, NULL);
                if (r != 1) {
                        ck_assert_msg(r == 0 || r == -ECONNRESET || r == -EPROTO,
                                      "after its replies, the peer gets %s", strerror(-r));
                        break;
                }
                ck_assert_int_eq(rep.status, WIRE_OK);
        }
        close(fd);
        attack_end(good);
}
END_TEST

/* ---- the client limit (its own daemon) ----------------------------------------------- */

START_TEST(test_client_limit)
{
        static const char *const args[] = {"--max-clients", "2", NULL};
        dlx_client *good;
        int fd, extra;

        dlxd_start(&fx, args);
        good = fx_connect(&fx, "good");
        fd = raw_hello();
        /* a third: refused with LIMIT, addressed to nobody, and hung up on */
        extra = fx_raw_connect(&fx);
        expect_hangup(extra, 0, WIRE_LIMIT);
        rp_ping(fd, 2);
        ck_assert_int_eq(dlx_ping(good), 0);
        /* the slot comes back once a client leaves */
        close(fd);
        int64_t deadline = fx_now_ms() + 5000;
        struct dlx_stats st;
        do {
                ck_assert_int_eq(dlx_stats(good, &st), 0);
                if (st.clients == 1)
                        break;
                fx_sleep_ms(10);
        } while (fx_now_ms() < deadline);
        ck_assert_uint_eq(st.clients, 1);
        assert_daemon_serves(good);
        dlx_close(good);
        dlxd_stop(&fx);
}
END_TEST

/* ---- cuda-vmm: a daemon told another device ------------------------------------------ */

/*
 * Told a device number (--cuda-device-number), dlxd takes files of that
 * device as cuda-vmm segments, at their declared size within the bounds, and
 * hands consumers the very file: here a /dev/ptmx master, whose pty number
 * tells one open from another. Anything else is still refused, now naming
 * the device asked for; an O_PATH fd of the right device too.
 */
START_TEST(test_vmm_device_number)
{
        char arg[32], want[128];
        const char *const args[] = {"--cuda-device-number", arg, NULL};
        struct wire_request acq = {.id = 2, .type = WIRE_REQ_ACQUIRE};
        int m, fd, consumer, got = -1;
        unsigned pty = 0, got_pty = ~0u;
        struct impostor v[16];
        struct wire_reply rep;
        struct stat sb, gsb;
        dlx_client *good;
        uint64_t id = 2;
        size_t n;

        /* the fixture counts the fds open before it starts dlxd and after it stops it */
        m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
        ck_assert_msg(m >= 0 && fstat(m, &sb) == 0, "/dev/ptmx: %s", strerror(errno));
        close(m);
        snprintf(arg, sizeof(arg), "%u:%u", major(sb.st_rdev), minor(sb.st_rdev));
        dlxd_start(&fx, args);
        m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
        ck_assert_msg(m >= 0 && ioctl(m, TIOCGPTN, &pty) == 0, "/dev/ptmx: %s", strerror(errno));
        good = fx_connect(&fx, "good");
        fd = raw_hello();
        consumer = raw_hello();

        /* the declared size stays bounded */
        send_vmm_alloc(fd, id, 0, m);
        expect_error(fd, id++, WIRE_INVALID);
        send_vmm_alloc(fd, id, DLX_MAX_SEGMENT + 1, m);
        expect_error(fd, id++, WIRE_INVALID);

        /* adopted (nothing sent back: the client has it), published by id, acquired */
        send_vmm_alloc(fd, id, VMM_BYTES, m);
        rp_expect_ok(fd, id++, WIRE_REP_ALLOC, &rep, &got);
        ck_assert_int_eq(got, -1);
        ck_assert_uint_eq(rep.alloc.size, VMM_BYTES);
        send_vmm_publish(fd, id, "badinput/vmm", rep.alloc.segment, 0, -1);
        rp_expect_ok(fd, id++, WIRE_REP_PUBLISH, NULL, NULL);
        snprintf(acq.acquire.name, sizeof(acq.acquire.name), "badinput/vmm");
        rp_send(consumer, &acq, -1);
        rp_expect_ok(consumer, 2, WIRE_REP_ACQUIRE, &rep, &got);
        ck_assert_uint_eq(rep.acquire.tensor.storage, WIRE_STORAGE_CUDA_VMM);
        ck_assert_msg(got >= 0 && fstat(got, &gsb) == 0 && ioctl(got, TIOCGPTN, &got_pty) == 0,
                      "the consumer's fd (%d) is not a pty master", got);
        ck_assert(S_ISCHR(gsb.st_mode) && gsb.st_rdev == sb.st_rdev);
        ck_assert_uint_eq(got_pty, pty);
        close(got);

        snprintf(want, sizeof(want),
                 "a cuda-vmm fd must be a driver export (char %s, as --cuda-device-number says)",
                 arg);
        n = impostors(v);
        for (size_t i = 0; i < n; i++) {
                if (strcmp(v[i].what, "/dev/ptmx") == 0)
                        continue; /* the device it was told */
                send_vmm_alloc(fd, id, v[i].declared, v[i].fd);
                expect_impostor_refused(fd, id++, want, &v[i]);
        }
        impostors_close(v, n);
        rp_ping(fd, id);
        close(consumer);
        close(fd);
        close(m);
        assert_daemon_serves(good);
        dlx_close(good);
        dlxd_stop(&fx);
}
END_TEST

/* ---- slowloris: a daemon with a short timeout ------------------------------------------ */

#define SHORT_TIMEOUT_MS 300

/* Reads the timeout error a stalled peer gets, then the hang-up; returns when it came. */
static int64_t expect_timed_out(int fd, const char *why)
{
        char msg[DLX_ERROR_MAX + 1];

        expect_error_msg(fd, 0, WIRE_TIMEOUT, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, why), "timeout message '%s' does not say '%s'", msg, why);
        int64_t at = fx_now_ms();
        expect_closed(fd);
        return at;
}

/* A peer that connects and says nothing is dropped after the timeout, with a reason. */
START_TEST(test_slowloris_no_hello)
{
        static const char *const args[] = {"--timeout-ms", "300", NULL};
        dlx_client *good;
        int64_t t0, at;
        int fd;

        dlxd_start(&fx, args);
        good = fx_connect(&fx, "good");
        t0 = fx_now_ms();
        fd = fx_raw_connect(&fx);
        at = expect_timed_out(fd, "no hello within 300 ms");
        ck_assert_msg(at - t0 >= SHORT_TIMEOUT_MS - 20, "dropped after %lld ms, before the timeout",
                      (long long)(at - t0));
        close(fd);
        /* an idle client that did say hello is never on the clock */
        ck_assert_int_eq(dlx_ping(good), 0);
        assert_daemon_serves(good);
        dlx_close(good);
        dlxd_stop(&fx);
}
END_TEST

/* Part of a frame, then silence: dropped; frames that keep completing are not. */
START_TEST(test_slowloris_partial_frame)
{
        static const char *const args[] = {"--timeout-ms", "300", NULL};
        struct wire_request req = {.id = 2, .type = WIRE_REQ_PING};
        uint8_t frame[64];
        dlx_client *good;
        size_t size;
        int fd, steady;

        dlxd_start(&fx, args);
        good = fx_connect(&fx, "good");
        ck_assert_int_eq(wire_request_size(&req, &size), 0);
        frame_header_put(frame, (uint32_t)size, 0);
        wire_request_pack(&req, frame + FRAME_HEADER_SIZE);

        /* a steady client: a complete ping every 100 ms for twice the timeout */
        steady = raw_hello();
        for (int i = 0; i < 6; i++) {
                rp_ping(steady, 10 + (uint64_t)i);
                fx_sleep_ms(100);
        }

        /* three bytes of a header, and nothing more */
        fd = raw_hello();
        ck_assert_int_eq(rp_send_raw(fd, frame, 3, NULL, 0), 0);
        expect_timed_out(fd, "a frame started 300 ms ago is not complete");
        close(fd);

        /* a whole header and half a payload: the same */
        fd = raw_hello();
        ck_assert_int_eq(rp_send_raw(fd, frame, FRAME_HEADER_SIZE + size / 2, NULL, 0), 0);
        expect_timed_out(fd, "is not complete");
        close(fd);

        /* dribbling a frame out a byte every 50 ms: it must be whole within the timeout */
        fd = raw_hello();
        ck_assert_int_eq(rp_send_raw(fd, frame, 1, NULL, 0), 0);
        for (size_t i = 1; i < FRAME_HEADER_SIZE + size; i++) {
                fx_sleep_ms(50);
                if (rp_send_raw(fd, frame + i, 1, NULL, 0) < 0)
                        break; /* already hung up on */
        }
        expect_timed_out(fd, "is not complete");
        close(fd);

        rp_ping(steady, 20);
        close(steady);
        assert_daemon_serves(good);
        dlx_close(good);
        dlxd_stop(&fx);
}
END_TEST

/* Connections to try against a daemon started with this many fds allowed. */
#define FD_LIMIT 48
#define FD_FLOOD_CONNS 64

START_TEST(test_daemon_out_of_fds)
{
        struct rlimit saved, low;
        int conns[FD_FLOOD_CONNS];
        bool answered[FD_FLOOD_CONNS] = {false};
        int nanswered = 0, nwaiting = 0;
        dlx_client *good;

        /* a daemon that may only open FD_LIMIT fds: a connection flood exhausts it */
        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
        dlxd_start(&fx, NULL);
        /* dlxd raises its soft limit to the hard one at start: cap both, from outside */
        low.rlim_cur = low.rlim_max = FD_LIMIT;
        ck_assert_int_eq(prlimit(fx.pid, RLIMIT_NOFILE, &low, NULL), 0);
        good = fx_connect(&fx, "good");

        for (int i = 0; i < FD_FLOOD_CONNS; i++) {
                conns[i] = fx_raw_connect(&fx);
                send_hello(conns[i], HELLO_ID, DLX_PROTO_MAJOR, -1);
        }
        /* those the daemon could accept are greeted; the others wait in the backlog */
        for (int i = 0; i < FD_FLOOD_CONNS; i++) {
                struct wire_reply rep;
                int r = rp_read(conns[i], &rep, i < FD_LIMIT / 2 ? REPLY_TIMEOUT_MS : 300, NULL);
                if (r == 1) {
                        ck_assert_int_eq(rep.status, WIRE_OK);
                        ck_assert_int_eq(rep.type, WIRE_REP_HELLO);
                        answered[i] = true;
                        nanswered++;
                } else {
                        ck_assert_int_eq(r, -ETIMEDOUT);
                }
        }
        ck_assert_int_ge(nanswered, FD_LIMIT / 2);
        ck_assert_int_lt(nanswered, FD_FLOOD_CONNS);
        ck_assert_int_eq(dlx_ping(good), 0);

        /* out of fds, the daemon backs off rather than spinning on accept */
        long ticks = sysconf(_SC_CLK_TCK), cpu0 = daemon_cpu_ticks();
        fx_sleep_ms(1000);
        long used = daemon_cpu_ticks() - cpu0;
        ck_assert_msg(used * 4 < ticks, "dlxd used %ld ms of CPU in 1 s out of fds",
                      used * 1000 / ticks);

        /* the greeted ones leave: every waiting connection is then served */
        for (int i = 0; i < FD_FLOOD_CONNS; i++) {
                if (answered[i]) {
                        close(conns[i]);
                        conns[i] = -1;
                }
        }
        for (int i = 0; i < FD_FLOOD_CONNS; i++) {
                if (conns[i] < 0)
                        continue;
                nwaiting++;
                rp_expect_ok(conns[i], HELLO_ID, WIRE_REP_HELLO, NULL, NULL);
                rp_ping(conns[i], 2);
                close(conns[i]);
        }
        ck_assert_int_eq(nanswered + nwaiting, FD_FLOOD_CONNS);
        assert_daemon_serves(good);
        dlx_close(good);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A publish with hold = true and its memfd attached that is refused (here the
 * tensor does not fit the memfd) leaves nothing held: the error reply names
 * no segment, so the client could never free one.
 */
START_TEST(test_refused_hold_publish_holds_nothing)
{
        int sock = rp_connect(fx.socket, "holder"), mfd;
        struct wire_request req;
        struct wire_reply rep;
        int r;

        mfd = sealed_memfd(4096);
        /* 8 KiB of floats described over a 4 KiB memfd: refused */
        rp_publish_req(&req, 2, "badinput/held", 8192, 0, 0);
        req.publish.hold = true;
        rp_send(sock, &req, mfd);
        close(mfd);
        r = rp_read_answer(sock, &rep, REPLY_TIMEOUT_MS, NULL);
        ck_assert_int_eq(r, 1);
        ck_assert_int_eq(rep.id, 2);
        ck_assert_int_eq(rep.status, WIRE_INVALID);

        req = (struct wire_request){.id = 3, .type = WIRE_REQ_STATS};
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, 3, WIRE_REP_STATS, &rep, NULL);
        ck_assert_msg(rep.stats.segments == 0 && rep.stats.bytes == 0,
                      "a refused publish (hold = true) left %llu segment(s), %llu bytes, held "
                      "by a session that was never told its id",
                      (unsigned long long)rep.stats.segments, (unsigned long long)rep.stats.bytes);
        close(sock);
}
END_TEST

/* ---- the API: every failure says why, and the detail outlives later successes ------------ */

static int list_nothing(void *ctx, const struct dlx_info *info)
{
        (void)ctx, (void)info;
        return 0;
}

/* Each one fails; api_row says how. */
static int fail_connect(dlx_client *c)
{
        struct dlx_connect_options o = {.socket_path = "/nonexistent/dlx/dlxd.sock"};
        dlx_client *other = NULL;

        (void)c;
        return dlx_connect(&o, &other);
}
static int fail_publish_null(dlx_client *c)
{
        return dlx_publish(c, "a/b", NULL, NULL, NULL);
}
static int fail_publish_legacy_null(dlx_client *c)
{
        return dlx_publish_legacy(c, "a/b", NULL, NULL, NULL);
}
static int fail_publish_from_null(dlx_client *c)
{
        return dlx_publish_from(c, "a/b", NULL, NULL, NULL, NULL);
}
static int fail_unpublish_missing(dlx_client *c)
{
        return dlx_unpublish(c, "not/there");
}
static int fail_unpublish_null(dlx_client *c)
{
        (void)c;
        return dlx_unpublish(NULL, "a/b");
}
static int fail_alloc_null(dlx_client *c)
{
        DLManagedTensorVersioned *t = NULL;
        return dlx_alloc(c, NULL, &t);
}
static int fail_alloc_ndim(dlx_client *c)
{
        int64_t shape[1] = {1};
        DLTensor proto = {.ndim = DLX_MAX_NDIM + 1,
                          .shape = shape,
                          .dtype = {kDLFloat, 32, 1},
                          .device = {kDLCPU, 0}};
        DLManagedTensorVersioned *t = NULL;
        return dlx_alloc(c, &proto, &t);
}
static int fail_acquire_null(dlx_client *c)
{
        DLManagedTensorVersioned *t = NULL;
        return dlx_acquire(c, NULL, NULL, &t);
}
static int fail_tensor_info_null(dlx_client *c)
{
        (void)c;
        return dlx_tensor_info(NULL, NULL, NULL, NULL);
}
static int fail_tensor_sync_null(dlx_client *c)
{
        (void)c;
        return dlx_tensor_sync(NULL, NULL);
}
static int fail_set_stream_device(dlx_client *c)
{
        return dlx_set_stream(c, -1, NULL);
}
static int fail_wait_released_v0(dlx_client *c)
{
        return dlx_wait_released(c, "a/b", 0, NULL, 0);
}
static int fail_wait_released_unknown(dlx_client *c)
{
        return dlx_wait_released(c, "never/published", 1, NULL, 0);
}
static int fail_stat_missing(dlx_client *c)
{
        struct dlx_info info;
        return dlx_stat(c, "not/there", &info);
}
static int fail_list_null(dlx_client *c)
{
        return dlx_list(c, "", NULL, NULL);
}
static int fail_list_prefix(dlx_client *c)
{
        return dlx_list(c, "\x01", list_nothing, NULL);
}
static int fail_stats_null(dlx_client *c)
{
        return dlx_stats(c, NULL);
}
static int fail_ping_null(dlx_client *c)
{
        (void)c;
        return dlx_ping(NULL);
}
static int fail_watch_prefix(dlx_client *c)
{
        uint64_t w;
        return dlx_watch(c, "\x01", &w);
}
static int fail_unwatch_unknown(dlx_client *c)
{
        return dlx_unwatch(c, 12345);
}
static int fail_next_event_none(dlx_client *c)
{
        struct dlx_event ev;
        return dlx_next_event(c, &ev, 0);
}
static int fail_fd_null(dlx_client *c)
{
        (void)c;
        return dlx_fd(NULL);
}
static int fail_process_events_null(dlx_client *c)
{
        (void)c;
        return dlx_process_events(NULL);
}
static int fail_tensor_wrap_null(dlx_client *c)
{
        dlx_tensor *h = NULL;
        (void)c;
        return dlx_tensor_wrap(NULL, &h);
}

static const struct api_row {
        const char *call;
        int (*run)(dlx_client *c);
        int err;
} api_rows[] = {
        {"dlx_connect to no daemon", fail_connect, -ENOENT},
        {"dlx_publish of NULL", fail_publish_null, -EINVAL},
        {"dlx_publish_legacy of NULL", fail_publish_legacy_null, -EINVAL},
        {"dlx_publish_from of NULL", fail_publish_from_null, -EINVAL},
        {"dlx_unpublish of a missing name", fail_unpublish_missing, -ENOENT},
        {"dlx_unpublish on no client", fail_unpublish_null, -EINVAL},
        {"dlx_alloc of NULL", fail_alloc_null, -EINVAL},
        {"dlx_alloc of ndim 33", fail_alloc_ndim, -EINVAL},
        {"dlx_acquire of NULL", fail_acquire_null, -EINVAL},
        {"dlx_tensor_info of NULL", fail_tensor_info_null, -EINVAL},
        {"dlx_tensor_sync of NULL", fail_tensor_sync_null, -EINVAL},
        {"dlx_set_stream on device -1", fail_set_stream_device, -EINVAL},
        {"dlx_wait_released of version 0", fail_wait_released_v0, -EINVAL},
        {"dlx_wait_released of nothing published", fail_wait_released_unknown, -ENOENT},
        {"dlx_stat of a missing name", fail_stat_missing, -ENOENT},
        {"dlx_list with no callback", fail_list_null, -EINVAL},
        {"dlx_list of a bad prefix", fail_list_prefix, -EINVAL},
        {"dlx_stats into NULL", fail_stats_null, -EINVAL},
        {"dlx_ping on no client", fail_ping_null, -EINVAL},
        {"dlx_watch of a bad prefix", fail_watch_prefix, -EINVAL},
        {"dlx_unwatch of an unknown watch", fail_unwatch_unknown, -ENOENT},
        {"dlx_next_event with none queued", fail_next_event_none, -EAGAIN},
        {"dlx_fd of no client", fail_fd_null, -EINVAL},
        {"dlx_process_events on no client", fail_process_events_null, -EINVAL},
        {"dlx_tensor_wrap of NULL", fail_tensor_wrap_null, -EINVAL},
};

/*
 * dlx.h: dlx_last_error() is the detail of the thread's last failed call. So
 * each failure replaces the one before with its own, and a success after it
 * leaves it be.
 */
START_TEST(every_failure_says_why_and_successes_keep_it)
{
        const struct api_row *row = &api_rows[_i];
        dlx_client *c = fx_connect(&fx, "api");
        DLManagedTensorVersioned *t = NULL;
        char detail[DLX_ERROR_MAX + 64];
        int err;

        /* an earlier failure, whose detail the row's must replace */
        ck_assert_int_eq(dlx_acquire(c, "earlier/failure", NULL, &t), -ENOENT);
        expect_last_error("earlier/failure");

        err = row->run(c);
        snprintf(detail, sizeof(detail), "%s", dlx_last_error());
        ck_assert_msg(err == row->err, "%s: %d (%s), expected %d", row->call, err,
                      dlx_strerror(err), row->err);
        ck_assert_msg(detail[0] && !strstr(detail, "earlier/failure"),
                      "%s failed without a detail of its own: \"%s\"", row->call, detail);

        ck_assert_int_eq(dlx_ping(c), 0);
        ck_assert_msg(strcmp(dlx_last_error(), detail) == 0,
                      "after %s, a successful ping changed the detail \"%s\" to \"%s\"", row->call,
                      detail, dlx_last_error());
        dlx_close(c);
}
END_TEST

Suite *badinput_suite(void)
{
        Suite *s = suite_create("badinput");
        TCase *frames = tcase_create("frames");
        TCase *fds = tcase_create("fds");
        TCase *publish = tcase_create("publish");
        TCase *requests = tcase_create("requests");
        TCase *floods = tcase_create("floods");
        TCase *limits = tcase_create("limits");
        TCase *api = tcase_create("api");

        tcase_add_checked_fixture(frames, fx_setup, fx_teardown);
        tcase_add_test(frames, test_truncated_frame_then_close);
        tcase_add_test(frames, test_oversized_length);
        tcase_add_test(frames, test_max_frame_of_garbage);
        tcase_add_test(frames, test_reserved_header_bytes);
        tcase_add_test(frames, test_zero_length_frame);
        tcase_add_test(frames, test_garbage_payload);
        tcase_add_test(frames, test_repeated_and_nested_fields);
        tcase_add_test(frames, test_unknown_request_type);
        tcase_add_test(frames, test_unknown_fields_ignored);
        tcase_add_test(frames, test_unknown_request_type_before_hello);
        tcase_add_test(frames, test_request_id_zero);
        tcase_add_test(frames, test_request_before_hello);
        tcase_add_test(frames, test_hello_unknown_major);
        tcase_add_test(frames, test_hello_twice);
        tcase_add_test(frames, test_hello_bad_client_name);
        suite_add_tcase(s, frames);

        tcase_add_checked_fixture(fds, fx_setup, fx_teardown);
        tcase_add_test(fds, test_fd_on_ping);
        tcase_add_test(fds, test_fd_on_hello);
        tcase_add_test(fds, test_reader_cannot_seal_a_writable_segment);
        tcase_add_rows(fds, test_memfd_publish_with_cuda_fields, cuda_lies);
        tcase_add_test(fds, test_two_fds_on_publish);
        tcase_add_test(fds, test_too_many_fds_in_header);
        tcase_add_test(fds, test_announced_fd_missing);
        tcase_add_rows(fds, fd_flood_is_refused_then_hung_up, fd_flood_rows);
        tcase_add_test(fds, test_unannounced_fd);
        tcase_add_test(fds, test_publish_wrong_fd_kinds);
        tcase_add_test(fds, test_publish_unsealed_memfd);
        tcase_add_test(fds, test_refused_hold_publish_holds_nothing);
        tcase_add_test(fds, test_alloc_vmm_impostors);
        tcase_add_test(fds, test_publish_vmm_impostors);
        suite_add_tcase(s, fds);

        tcase_add_checked_fixture(publish, fx_setup, fx_teardown);
        tcase_add_rows(publish, publish_checks_the_descriptor_against_its_segment, publish_rows);
        tcase_add_test(publish, test_publish_ndim_33);
        tcase_add_test(publish, test_publish_bad_names);
        tcase_add_test(publish, test_publish_foreign_segment);
        suite_add_tcase(s, publish);

        tcase_add_checked_fixture(requests, fx_setup, fx_teardown);
        tcase_add_test(requests, test_acquire_stat_bad_names);
        tcase_add_test(requests, test_bad_prefixes);
        tcase_add_test(requests, test_release_bad_leases);
        tcase_add_test(requests, test_alloc_bad_sizes);
        tcase_add_test(requests, test_free_unwatch_unknown);
        tcase_add_test(requests, test_watch_flood);
        tcase_add_test(requests, test_acquire_extreme_timeouts);
        suite_add_tcase(s, requests);

        tcase_add_checked_fixture(api, fx_setup, fx_teardown);
        tcase_add_rows(api, every_failure_says_why_and_successes_keep_it, api_rows);
        suite_add_tcase(s, api);

        tcase_add_checked_fixture(floods, fx_setup, fx_teardown);
        tcase_add_test(floods, test_acquire_flood);
        tcase_add_test(floods, test_slow_partial_frame);
        tcase_add_test(floods, test_peer_not_reading);
        suite_add_tcase(s, floods);

        /* starts its own daemon with a client limit */
        tcase_add_test(limits, test_client_limit);
        tcase_add_test(limits, test_vmm_device_number);
        tcase_add_test(limits, test_slowloris_no_hello);
        tcase_add_test(limits, test_slowloris_partial_frame);
        tcase_add_test(limits, test_daemon_out_of_fds);
        suite_add_tcase(s, limits);
        return s;
}
