/* SPDX-License-Identifier: MIT */
/*
 * Attacks on the README's limits paragraph (--max-fds,
 * --max-fds-per-uid, the default derived from the descriptor limit, what is
 * kept spare for new connections, big destroyed segments closing just after
 * the reply) and on its groups section (big tables checked off the loop and
 * answered in order, the group limits at their exact edges, one watch event
 * per group version). Only README.md and dlx.h say what is right here.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "group.h"
#include "rawpeer.h"

#define DLXV(call) ck_assert_int_eq((call), 0)
#define NOBODY 65534
#define REPLY_MS 20000

/* ---- helpers -------------------------------------------------------------------------------- */

struct view {
        DLManagedTensorVersioned mt;
        int64_t shape[1];
        void *own; /* freed with the view, may be NULL */
        atomic_int *deleted;
};

static void view_deleter(DLManagedTensorVersioned *t)
{
        struct view *v = t->manager_ctx;
        if (v->deleted)
                atomic_fetch_add(v->deleted, 1);
        free(v->own);
        free(v);
}

/* A 1-D tensor over data (not owned unless own), n elements of dt. */
static DLManagedTensorVersioned *view_of(void *data, void *own, DLDataType dt, int64_t n,
                                         atomic_int *deleted)
{
        struct view *v = calloc(1, sizeof(*v));

        ck_assert_ptr_nonnull(v);
        v->shape[0] = n;
        v->own = own;
        v->deleted = deleted;
        v->mt.version.major = DLPACK_MAJOR_VERSION;
        v->mt.version.minor = DLPACK_MINOR_VERSION;
        v->mt.manager_ctx = v;
        v->mt.deleter = view_deleter;
        v->mt.dl_tensor = (DLTensor){
                .data = data, .device = {kDLCPU, 0}, .ndim = 1, .dtype = dt, .shape = v->shape};
        return &v->mt;
}

static float one_float = 1.0f;

static DLManagedTensorVersioned *small_f32(atomic_int *deleted)
{
        return view_of(&one_float, NULL, (DLDataType){kDLFloat, 32, 1}, 1, deleted);
}

/* A heap tensor of n bytes filled with v: copied when published. */
static DLManagedTensorVersioned *heap_bytes(size_t n, uint8_t v)
{
        void *p = malloc(n);

        ck_assert_ptr_nonnull(p);
        memset(p, v, n);
        return view_of(p, p, (DLDataType){kDLUInt, 8, 1}, (int64_t)n, NULL);
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
        return (v + a - 1) / a * a;
}

/* A group segment built by hand (proto/group.h): n 1-D float32 members of one element. */
struct gseg {
        uint8_t *p;
        uint64_t size, data_bytes, table_end;
        uint32_t count;
};

static struct group_head *ghead(struct gseg *g)
{
        return (struct group_head *)g->p;
}

static void gbuild_names(struct gseg *g, const char *const *names, uint32_t n, uint64_t data_bytes)
{
        uint64_t names_size = 0, members_off, dims_off, names_off, data_off;

        for (uint32_t i = 0; i < n; i++)
                names_size += strlen(names[i]) + 1;
        members_off = sizeof(struct group_head);
        dims_off = members_off + (uint64_t)n * sizeof(struct group_member);
        names_off = dims_off + (uint64_t)n * 16;
        g->table_end = names_off + names_size;
        data_off = align_up(g->table_end, GROUP_DATA_ALIGN);
        if (data_bytes < 4 * (uint64_t)n)
                data_bytes = 4 * (uint64_t)n;
        g->size = data_off + data_bytes;
        g->count = n;
        g->data_bytes = data_bytes;
        g->p = calloc(1, g->size);
        ck_assert_ptr_nonnull(g->p);
        struct group_head *h = ghead(g);
        memcpy(h->magic, GROUP_MAGIC, 8);
        h->format = GROUP_FORMAT;
        h->count = n;
        h->members_off = members_off;
        h->dims_off = dims_off;
        h->ndims = 2 * (uint64_t)n;
        h->names_off = names_off;
        h->names_size = names_size;
        h->data_off = data_off;
        int64_t *dims = (int64_t *)(g->p + dims_off);
        uint64_t no = 0;
        for (uint32_t i = 0; i < n; i++) {
                struct group_member *m = (struct group_member *)(g->p + members_off) + i;
                size_t len = strlen(names[i]);
                m->offset = data_off + 4 * (uint64_t)i;
                m->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
                m->dims = 2 * (uint64_t)i;
                m->name_off = (uint32_t)no;
                m->name_len = (uint16_t)len;
                m->ndim = 1;
                m->dtype_code = kDLFloat;
                m->dtype_bits = 32;
                m->dtype_lanes = 1;
                dims[2 * i] = 1;
                dims[2 * i + 1] = 1;
                memcpy(g->p + names_off + no, names[i], len + 1);
                no += len + 1;
        }
}

/* n members with long zero-padded names (sorted as made): past 4 MiB of table from ~60000. */
static void gbuild_big(struct gseg *g, uint32_t n, bool short_names)
{
        char **names = calloc(n, sizeof(*names));

        ck_assert_ptr_nonnull(names);
        for (uint32_t i = 0; i < n; i++) {
                names[i] = malloc(96);
                ck_assert_ptr_nonnull(names[i]);
                if (short_names)
                        snprintf(names[i], 96, "m%07u", i);
                else
                        snprintf(names[i], 96,
                                 "layers.%07u.self_attention.query_key_value.weight.shard", i);
        }
        gbuild_names(g, (const char *const *)names, n, 0);
        for (uint32_t i = 0; i < n; i++)
                free(names[i]);
        free(names);
}

static int gmemfd(const struct gseg *g)
{
        int fd = memfd_create("limit-edges-group", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, (off_t)g->size), 0);
        ck_assert_int_eq(pwrite(fd, g->p, g->size, 0), (ssize_t)g->size);
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE), 0);
        return fd;
}

static void group_publish_req(struct wire_request *req, uint64_t id, const char *name,
                              const struct gseg *g, bool persist)
{
        struct wire_tensor *t = &req->publish.tensor;
        const struct group_head *h = (const struct group_head *)g->p;

        memset(req, 0, sizeof(*req));
        req->id = id;
        req->type = WIRE_REQ_PUBLISH;
        req->publish.persist = persist;
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->dtype = (DLDataType){kDLUInt, 8, 1};
        t->ndim = 1;
        t->shape[0] = (int64_t)g->data_bytes;
        t->strides[0] = 1;
        t->device_type = kDLCPU;
        t->storage = WIRE_STORAGE_MEMFD;
        t->offset = h->data_off;
        t->length = g->data_bytes;
        t->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        t->members = g->count;
}

/* Sends a group publish of g with a fresh memfd, without reading the answer. */
static void send_group_publish(int sock, uint64_t id, const char *name, const struct gseg *g,
                               bool persist)
{
        struct wire_request req;
        int fd = gmemfd(g);

        group_publish_req(&req, id, name, g, persist);
        rp_send(sock, &req, fd);
        close(fd);
}

static void simple_req(struct wire_request *req, uint64_t id, enum wire_request_type type,
                       const char *name)
{
        memset(req, 0, sizeof(*req));
        req->id = id;
        req->type = type;
        if (type == WIRE_REQ_PING)
                req->ping.nonce = id;
        else if (type == WIRE_REQ_UNPUBLISH)
                snprintf(req->unpublish.name, sizeof(req->unpublish.name), "%s", name);
        else if (type == WIRE_REQ_STAT)
                snprintf(req->stat.name, sizeof(req->stat.name), "%s", name);
}

/* The next answer (events skipped): id and status as given; returns the reply's type. */
static struct wire_reply expect_answer(int sock, uint64_t id, int status)
{
        struct wire_reply rep;
        int fd = -1, r = rp_read_answer(sock, &rep, REPLY_MS * fx_slowdown(), &fd);

        ck_assert_msg(r == 1, "waiting for the answer to %llu: got %d (dropped or silent)",
                      (unsigned long long)id, r);
        if (fd >= 0)
                close(fd);
        ck_assert_msg(rep.id == id, "answers out of order: %llu came where %llu was due",
                      (unsigned long long)rep.id, (unsigned long long)id);
        ck_assert_msg(rep.status == status, "request %llu: status %d, not %d (%s)",
                      (unsigned long long)id, rep.status, status, rep.error);
        return rep;
}

/* Waits up to 10 s for the daemon to be back at what before says (names, fds, bytes, segments). */
static void expect_back_to(dlx_client *c, const struct dlx_stats *before, const char *what)
{
        struct dlx_stats now = {0};

        for (int i = 0; i < 1000 * fx_slowdown(); i++) {
                now = fx_stats(c);
                if (now.bytes == before->bytes && now.fds == before->fds &&
                    now.segments == before->segments && now.names == before->names)
                        return;
                fx_sleep_ms(10);
        }
        ck_abort_msg("%s: names %" PRIu64 " (was %" PRIu64 "), fds %" PRIu64 " (was %" PRIu64
                     "), bytes %" PRIu64 " (was %" PRIu64 "), segments %" PRIu64 " (was %" PRIu64
                     ")",
                     what, now.names, before->names, now.fds, before->fds, now.bytes, before->bytes,
                     now.segments, before->segments);
}

/* Lets other uids in group nobody reach the fixture's socket (daemon run with --group 65534). */
static void open_to_others(void)
{
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        ck_assert_int_eq(chmod(fx.socket, 0666), 0);
}

/* ---- groups: big tables checked off the loop ------------------------------------------------ */

/*
 * README: "a table over 4 MiB is checked on a worker thread, so that other
 * clients are not kept waiting, and the publisher's later requests are
 * still answered after it." Two big publishes back to back, then a run of
 * requests about them in one write: all answered, in order, each seeing
 * what the ones before it did.
 */
START_TEST(requests_behind_two_big_publishes_in_order)
{
        struct gseg g;
        struct wire_request req;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        int sock = rp_connect(fx.socket, "pipeliner");
        dlx_client *c = fx_connect(&fx, "observer");
        struct dlx_stats before = fx_stats(c);

        gbuild_big(&g, 70000, false);
        ck_assert_uint_gt(ghead(&g)->data_off, 4u << 20);
        send_group_publish(sock, 10, "po/a", &g, false);
        send_group_publish(sock, 11, "po/b", &g, false);
        simple_req(&req, 12, WIRE_REQ_PING, NULL);
        rp_frame_append(&buf, &len, &cap, &req);
        rp_acquire_req(&req, 13, "po/a");
        req.acquire.group = true;
        rp_frame_append(&buf, &len, &cap, &req);
        rp_acquire_req(&req, 14, "po/b");
        req.acquire.group = true;
        rp_frame_append(&buf, &len, &cap, &req);
        simple_req(&req, 15, WIRE_REQ_STAT, "po/a");
        rp_frame_append(&buf, &len, &cap, &req);
        simple_req(&req, 16, WIRE_REQ_UNPUBLISH, "po/a");
        rp_frame_append(&buf, &len, &cap, &req);
        rp_acquire_req(&req, 17, "po/a");
        req.acquire.group = true;
        rp_frame_append(&buf, &len, &cap, &req);
        simple_req(&req, 18, WIRE_REQ_UNPUBLISH, "po/b");
        rp_frame_append(&buf, &len, &cap, &req);
        simple_req(&req, 19, WIRE_REQ_PING, NULL);
        rp_frame_append(&buf, &len, &cap, &req);
        ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);

        struct wire_reply rep = expect_answer(sock, 10, WIRE_OK);
        ck_assert_uint_eq(rep.publish.version, 1);
        rep = expect_answer(sock, 11, WIRE_OK);
        ck_assert_uint_eq(rep.publish.version, 1);
        expect_answer(sock, 12, WIRE_OK);
        rep = expect_answer(sock, 13, WIRE_OK);
        ck_assert_uint_eq(rep.acquire.tensor.members, 70000);
        rep = expect_answer(sock, 14, WIRE_OK);
        ck_assert_uint_eq(rep.acquire.tensor.members, 70000);
        rep = expect_answer(sock, 15, WIRE_OK);
        ck_assert_uint_eq(rep.stat.info.tensor.members, 70000);
        expect_answer(sock, 16, WIRE_OK);
        expect_answer(sock, 17, WIRE_NOT_FOUND);
        expect_answer(sock, 18, WIRE_OK);
        expect_answer(sock, 19, WIRE_OK);
        close(sock);
        expect_back_to(c, &before, "after the pipeliner left");
        free(buf);
        free(g.p);
        dlx_close(c);
}
END_TEST

/*
 * The same client replaces its big group, still being checked, with a
 * tensor, then acquires: answered in order, the tensor is version 2 and
 * what is there (an acquire of it as a group is -ENOTDIR's NOT_GROUP).
 */
START_TEST(tensor_behind_big_group_of_same_name_wins)
{
        struct gseg g;
        struct wire_request req;
        struct wire_reply rep;
        dlx_client *c = fx_connect(&fx, "observer");
        int sock = rp_connect(fx.socket, "pipeliner");
        struct dlx_info info;

        gbuild_big(&g, 70000, false);
        for (int round = 0; round < 3; round++) {
                uint64_t id = 10 + 10 * (uint64_t)round;
                send_group_publish(sock, id, "tb/x", &g, false);
                int fd = make_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
                rp_publish_req(&req, id + 1, "tb/x", 4096, 0, DLPACK_FLAG_BITMASK_READ_ONLY);
                rp_send(sock, &req, fd);
                close(fd);
                rp_acquire_req(&req, id + 2, "tb/x");
                req.acquire.group = true;
                rp_send(sock, &req, -1);
                rp_acquire_req(&req, id + 3, "tb/x");
                rp_send(sock, &req, -1);
                rep = expect_answer(sock, id, WIRE_OK);
                ck_assert_uint_eq(rep.publish.version, 2 * (uint64_t)round + 1);
                rep = expect_answer(sock, id + 1, WIRE_OK);
                ck_assert_uint_eq(rep.publish.version, 2 * (uint64_t)round + 2);
                expect_answer(sock, id + 2, WIRE_NOT_GROUP);
                rep = expect_answer(sock, id + 3, WIRE_OK);
                ck_assert_uint_eq(rep.acquire.tensor.version, 2 * (uint64_t)round + 2);
                ck_assert_uint_eq(rep.acquire.tensor.members, 0);
                DLXV(dlx_stat(c, "tb/x", &info));
                ck_assert_uint_eq(info.members, 0);
                ck_assert_uint_eq(info.version, 2 * (uint64_t)round + 2);
        }
        close(sock);
        free(g.p);
        dlx_close(c);
}
END_TEST

/*
 * README: "a half-closed client gets every reply it asked for, then the
 * connection ends", with a big table still being checked when the peer
 * shuts its sending side; its non-persistent group dies with it.
 */
START_TEST(half_closed_during_big_check_gets_every_reply)
{
        struct gseg g;
        struct wire_request req;
        struct wire_reply rep;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        dlx_client *c = fx_connect(&fx, "observer");
        struct dlx_stats before = fx_stats(c);

        gbuild_big(&g, 70000, false);
        for (int round = 0; round < 3; round++) {
                int sock = rp_connect(fx.socket, "half-closer");
                len = 0;
                send_group_publish(sock, 10, "hc/a", &g, false);
                rp_acquire_req(&req, 11, "hc/a");
                req.acquire.group = true;
                rp_frame_append(&buf, &len, &cap, &req);
                for (int i = 0; i < 20; i++) {
                        simple_req(&req, 12 + (uint64_t)i, WIRE_REQ_PING, NULL);
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
                ck_assert_int_eq(shutdown(sock, SHUT_WR), 0);
                expect_answer(sock, 10, WIRE_OK);
                rep = expect_answer(sock, 11, WIRE_OK);
                ck_assert_uint_eq(rep.acquire.tensor.members, 70000);
                for (int i = 0; i < 20; i++)
                        expect_answer(sock, 12 + (uint64_t)i, WIRE_OK);
                ck_assert_int_eq(rp_read(sock, &rep, REPLY_MS, NULL), 0); /* then EOF */
                close(sock);
                expect_back_to(c, &before, "after a half-closed publisher");
        }
        free(buf);
        free(g.p);
        dlx_close(c);
}
END_TEST

/*
 * A publisher that hangs up (or is killed) while its big non-persistent
 * group is being checked: README "A tensor dies with its producer's
 * connection (after its last lease) unless published with persist". The
 * daemon ends with nothing of it: no name, no descriptor, no bytes, and a
 * watcher that saw it published sees it unpublished.
 */
static int publish_then_die(void *arg)
{
        const struct gseg *g = arg;
        int sock = rp_connect(fx.socket, "doomed");
        struct wire_request req;
        int fd = gmemfd(g);

        group_publish_req(&req, 10, "die/g", g, false);
        rp_send(sock, &req, fd);
        raise(SIGKILL);
        return 1;
}

START_TEST(hangup_during_big_check_leaves_nothing)
{
        struct gseg g;
        struct dlx_event ev;
        dlx_client *c = fx_connect(&fx, "observer"), *w = fx_connect(&fx, "watcher");
        struct dlx_stats before;
        struct dlx_info info;
        int published = 0, unpublished = 0;

        DLXV(dlx_watch(w, "die/", NULL));
        before = fx_stats(c);
        gbuild_big(&g, 70000, false);
        for (int round = 0; round < 6; round++) {
                if (round % 2 == 0) {
                        int sock = rp_connect(fx.socket, "hangs-up");
                        send_group_publish(sock, 10, "die/g", &g, false);
                        if (round == 2)
                                shutdown(sock, SHUT_WR);
                        close(sock);
                } else {
                        ck_assert_int_eq(fx_wait(fx_spawn(publish_then_die, &g)), 128 + SIGKILL);
                }
                expect_back_to(c, &before, "after a publisher hung up mid-check");
                ck_assert_int_eq(dlx_stat(c, "die/g", &info), -ENOENT);
        }
        while (dlx_next_event(w, &ev, 300) == 0) {
                if (ev.kind == DLX_EVENT_UNPUBLISHED)
                        unpublished++;
                else
                        published++;
        }
        ck_assert_int_eq(published, unpublished);
        free(g.p);
        dlx_close(w);
        dlx_close(c);
}
END_TEST

struct pinger {
        dlx_client *c;
        atomic_bool stop;
        int64_t worst_ms;
        int n;
};

static void *ping_loop(void *arg)
{
        struct pinger *p = arg;

        while (!atomic_load(&p->stop)) {
                int64_t t0 = fx_now_ms();
                if (dlx_ping(p->c) != 0)
                        break;
                int64_t dt = fx_now_ms() - t0;
                if (dt > p->worst_ms)
                        p->worst_ms = dt;
                p->n++;
        }
        return NULL;
}

/*
 * README: a big table "is checked on a worker thread, so that other clients
 * are not kept waiting". A table of a million members takes dlxd a while to
 * check; a second client's pings meanwhile come back in a small fraction of
 * that time.
 */
START_TEST(pings_stay_fast_during_a_huge_check)
{
        struct gseg g;
        struct pinger p = {.c = fx_connect(&fx, "pinger")};
        pthread_t th;
        int sock = rp_connect(fx.socket, "huge");
        int64_t t0, rt;

        if (getenv("DLX_TEST_VALGRIND")) { /* timing means nothing under memcheck */
                close(sock);
                dlx_close(p.c);
                return;
        }
        gbuild_big(&g, 1000000, true);
        ck_assert_int_eq(dlx_ping(p.c), 0);
        int fd = gmemfd(&g);
        struct wire_request req;
        group_publish_req(&req, 10, "huge/g", &g, false);
        ck_assert_int_eq(pthread_create(&th, NULL, ping_loop, &p), 0);
        fx_sleep_ms(50);
        t0 = fx_now_ms();
        rp_send(sock, &req, fd);
        close(fd);
        expect_answer(sock, 10, WIRE_OK);
        rt = fx_now_ms() - t0;
        fx_sleep_ms(20);
        atomic_store(&p.stop, true);
        pthread_join(th, NULL);
        fprintf(stderr, "huge check: publish answered in %lld ms; %d pings, worst %lld ms\n",
                (long long)rt, p.n, (long long)p.worst_ms);
        ck_assert_msg(p.worst_ms * 4 < rt || p.worst_ms < 20,
                      "a ping took %lld ms while a %lld ms check ran", (long long)p.worst_ms,
                      (long long)rt);
        close(sock);
        free(g.p);
        dlx_close(p.c);
}
END_TEST

/*
 * Another client replaces (with a tensor) and unpublishes the name while a
 * big group of it is being checked. Versions go up one by one in the order
 * the daemon answered, the current version is the last answered, and a
 * watcher sees exactly one event per version, in order.
 */
START_TEST(replace_and_unpublish_race_a_big_check)
{
        struct gseg g;
        struct dlx_event ev;
        dlx_client *b = fx_connect(&fx, "racer"), *w = fx_connect(&fx, "watcher");
        int sock = rp_connect(fx.socket, "big");
        uint64_t versions[64];
        int nv = 0;

        DLXV(dlx_watch(w, "race/", NULL));
        gbuild_big(&g, 70000, false);
        for (int round = 0; round < 8; round++) {
                uint64_t vb = 0;
                send_group_publish(sock, 10 + (uint64_t)round, "race/g", &g, true);
                /* right behind it, from another client */
                if (round % 2 == 0) {
                        DLXV(dlx_publish(b, "race/g", small_f32(NULL), NULL, &vb));
                } else {
                        int err = dlx_unpublish(b, "race/g");
                        ck_assert_msg(err == 0 || err == -ENOENT, "unpublish: %d", err);
                }
                struct wire_reply rep = expect_answer(sock, 10 + (uint64_t)round, WIRE_OK);
                uint64_t vg = rep.publish.version;
                struct dlx_info info;
                int err = dlx_stat(b, "race/g", &info);
                fprintf(stderr, "race round %d: group v%llu, tensor v%llu, now v%llu (%d)\n", round,
                        (unsigned long long)vg, (unsigned long long)vb,
                        (unsigned long long)(err ? 0 : info.version), err);
                if (round % 2 == 0) {
                        ck_assert_uint_ne(vg, vb);
                        ck_assert_int_eq(err, 0);
                        uint64_t hi = vg > vb ? vg : vb;
                        ck_assert_uint_eq(info.version, hi);
                        /* the one with the higher version is what is there */
                        ck_assert_uint_eq(info.members, vg > vb ? 70000u : 0u);
                } else if (err == 0) {
                        ck_assert_uint_eq(info.version, vg);
                        ck_assert_uint_eq(info.members, 70000);
                }
                /* gone already where the unpublish came after the check, not during it */
                if (err == 0)
                        DLXV(dlx_unpublish(b, "race/g"));
        }
        /* events: versions strictly increasing, one per version made */
        uint64_t last = 0;
        int events = 0, ups = 0;
        while (dlx_next_event(w, &ev, 300) == 0) {
                fprintf(stderr, "race event: kind %d v%llu\n", (int)ev.kind,
                        (unsigned long long)ev.version);
                ck_assert_str_eq(ev.name, "race/g");
                ck_assert_int_ne(ev.kind, DLX_EVENT_LOST);
                if (ev.kind == DLX_EVENT_UNPUBLISHED) {
                        ups++;
                        last = 0; /* the name is gone: its next version may start again */
                        continue;
                }
                ck_assert_msg(ev.version > last, "event for v%llu after v%llu",
                              (unsigned long long)ev.version, (unsigned long long)last);
                last = ev.version;
                if (nv < 64)
                        versions[nv++] = ev.version;
                events++;
        }
        (void)versions;
        ck_assert_int_ge(events, 12); /* 8 groups, 4 tensors */
        ck_assert_int_ge(ups, 8);
        close(sock);
        free(g.p);
        dlx_close(w);
        dlx_close(b);
}
END_TEST

/*
 * README: "Watches and tracks see one version per group version", with
 * groups checked off the loop among them, pipelined, and a refused one
 * that makes no version and no event.
 */
START_TEST(watch_sees_one_event_per_big_version)
{
        struct gseg g, bad;
        struct dlx_event ev;
        dlx_client *w = fx_connect(&fx, "watcher");
        int sock = rp_connect(fx.socket, "big");
        uint32_t track = track_ok(w, "wv/g");

        DLXV(dlx_watch(w, "wv/", NULL));
        gbuild_big(&g, 70000, false);
        gbuild_big(&bad, 70000, false);
        /* the last name out of order: refused, at the table's end */
        struct group_head *h = ghead(&bad);
        struct group_member *lm = (struct group_member *)(bad.p + h->members_off) + 69999;
        char *lname = (char *)bad.p + h->names_off + lm->name_off;
        lname[0] = 'a';
        for (int i = 0; i < 3; i++)
                send_group_publish(sock, 10 + (uint64_t)i, "wv/g", &g, false);
        send_group_publish(sock, 13, "wv/g", &bad, false);
        for (int i = 0; i < 3; i++)
                send_group_publish(sock, 14 + (uint64_t)i, "wv/g", &g, false);
        for (int i = 0; i < 3; i++)
                ck_assert_uint_eq(expect_answer(sock, 10 + (uint64_t)i, WIRE_OK).publish.version,
                                  (uint64_t)i + 1);
        expect_answer(sock, 13, WIRE_INVALID);
        for (int i = 0; i < 3; i++)
                ck_assert_uint_eq(expect_answer(sock, 14 + (uint64_t)i, WIRE_OK).publish.version,
                                  (uint64_t)i + 4);
        ck_assert_uint_eq(tracked_version(w, track), 6);
        for (uint64_t v = 1; v <= 6; v++) {
                DLXV(dlx_next_event(w, &ev, 5000));
                ck_assert_str_eq(ev.name, "wv/g");
                ck_assert_int_eq(ev.kind, v == 1 ? DLX_EVENT_PUBLISHED : DLX_EVENT_REPLACED);
                ck_assert_uint_eq(ev.version, v);
        }
        ck_assert_int_eq(dlx_next_event(w, &ev, 300), -ETIMEDOUT);
        close(sock);
        free(g.p);
        free(bad.p);
        dlx_close(w);
}
END_TEST

/* ---- groups: limits at their edges ------------------------------------------------------------
 */

struct members {
        struct dlx_member ms[1100];
        struct dlx_member_layout ls[1100];
        char names[1100][260];
        int64_t one[1];
        atomic_int deleted;
};

static void members_fill(struct members *m, int n, size_t name_len)
{
        m->one[0] = 1;
        for (int i = 0; i < n; i++) {
                memset(m->names[i], 'x', name_len);
                snprintf(m->names[i], sizeof(m->names[i]), "%05d", i);
                if (name_len > 5)
                        memset(m->names[i] + 5, 'x', name_len - 5);
                m->names[i][name_len > 5 ? name_len : 5] = '\0';
                m->ms[i] = (struct dlx_member){m->names[i], small_f32(&m->deleted)};
                m->ls[i] = (struct dlx_member_layout){m->names[i], {kDLFloat, 32, 1}, 1, m->one};
        }
}

static void nothing_happened(dlx_client *c, dlx_client *w, const struct dlx_stats *before)
{
        struct dlx_event ev;
        struct dlx_stats now = fx_stats(c);

        ck_assert_uint_eq(now.names, before->names);
        ck_assert_uint_eq(now.segments, before->segments);
        ck_assert_uint_eq(now.fds, before->fds);
        ck_assert_uint_eq(now.bytes, before->bytes);
        ck_assert_int_eq(dlx_next_event(w, &ev, 100), -ETIMEDOUT);
}

/*
 * --max-group-members N: N members pass, N + 1 fail with -E2BIG and leave
 * nothing (no event, no version, nothing held), through dlx_publish_group(),
 * dlx_group_alloc() and a raw peer alike.
 */
START_TEST(max_group_members_exact_edge)
{
        static const char *const args[] = {"--max-group-members", "1000", NULL};
        static struct members m;
        struct dlx_event ev;
        struct dlx_stats before;
        uint64_t v = 0;
        dlx_group *grp = NULL;

        dlxd_start(&fx, args);
        dlx_client *c = fx_connect(&fx, "p"), *w = fx_connect(&fx, "w");
        ck_assert_uint_eq(fx_stats(c).limits.max_group_members, 1000);
        DLXV(dlx_watch(w, "edge", NULL));

        members_fill(&m, 1000, 8);
        DLXV(dlx_publish_group(c, "edge", m.ms, 1000, NULL, &v));
        ck_assert_uint_eq(v, 1);
        DLXV(dlx_next_event(w, &ev, 5000));
        before = fx_stats(c);
        members_fill(&m, 1001, 8);
        atomic_store(&m.deleted, 0);
        ck_assert_int_eq(dlx_publish_group(c, "edge", m.ms, 1001, NULL, &v), -E2BIG);
        ck_assert_int_eq(atomic_load(&m.deleted), 1001);
        nothing_happened(c, w, &before);
        ck_assert_int_eq(dlx_group_alloc(c, m.ls, 1001, &grp), -E2BIG);
        ck_assert_ptr_null(grp);
        nothing_happened(c, w, &before);
        DLXV(dlx_group_alloc(c, m.ls, 1000, &grp));
        DLXV(dlx_group_publish(c, "edge", grp, NULL, &v));
        ck_assert_uint_eq(v, 2);
        dlx_group_release(grp);
        DLXV(dlx_next_event(w, &ev, 5000));
        ck_assert_uint_eq(ev.version, 2);

        /* a raw peer */
        const char *names[1001];
        for (int i = 0; i < 1001; i++)
                names[i] = m.names[i];
        struct gseg g;
        gbuild_names(&g, names, 1001, 0);
        int sock = rp_connect(fx.socket, "raw");
        before = fx_stats(c);
        send_group_publish(sock, 10, "edge", &g, false);
        expect_answer(sock, 10, WIRE_TOO_BIG);
        nothing_happened(c, w, &before);
        free(g.p);
        gbuild_names(&g, names, 1000, 0);
        send_group_publish(sock, 11, "edge", &g, false);
        ck_assert_uint_eq(expect_answer(sock, 11, WIRE_OK).publish.version, 3);
        free(g.p);
        close(sock);
        dlx_close(w);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * README: "--max-group-members ... (more than 1048576 is 1048576)": stats
 * says so. And "0 meaning none" (dlx.h: the limits "as dlxd was started
 * with them (0: none)"): 0 is shown as 0.
 */
START_TEST(max_group_members_over_cap_reads_as_cap)
{
        static const struct {
                const char *arg;
                uint32_t shown;
        } rows[] = {
                {"2000000", 1048576}, {"1048577", 1048576}, {"1048576", 1048576}, {"0", 1048576}};

        for (size_t i = 0; i < N_ELEMS(rows); i++) {
                const char *const args[] = {"--max-group-members", rows[i].arg, NULL};
                dlxd_start(&fx, args);
                dlx_client *c = fx_connect(&fx, "p");
                uint32_t shown = fx_stats(c).limits.max_group_members;
                ck_assert_msg(shown == rows[i].shown,
                              "--max-group-members %s: dlx_stats() shows %u, not %u", rows[i].arg,
                              shown, rows[i].shown);
                dlx_close(c);
                dlxd_stop(&fx);
        }
}
END_TEST

/*
 * The same cap where it binds: a daemon told --max-group-members 2000000
 * takes 1048576; a group of 1048577 is -E2BIG from dlx_publish_group() and
 * dlx_group_alloc() (dlx.h: "-E2BIG (members or table over the daemon's
 * limits, as for dlx_publish_group())"), and leaves nothing.
 */
START_TEST(members_over_the_cap_are_e2big_everywhere)
{
        static const char *const args[] = {"--max-group-members", "2000000", NULL};
        enum { N = 1048577 };
        struct dlx_member *ms = calloc(N, sizeof(*ms));
        struct dlx_member_layout *ls = calloc(N, sizeof(*ls));
        char(*names)[12] = calloc(N, sizeof(*names));
        static int64_t one[1] = {1};
        atomic_int deleted = 0;
        dlx_group *grp = NULL;

        ck_assert(ms && ls && names);
        if (getenv("DLX_TEST_VALGRIND")) { /* a million members: too slow under memcheck */
                free(ms);
                free(ls);
                free(names);
                return;
        }
        dlxd_start(&fx, args);
        dlx_client *c = fx_connect(&fx, "p");
        struct dlx_stats before = fx_stats(c);
        for (int i = 0; i < N; i++) {
                snprintf(names[i], sizeof(names[i]), "m%07d", i);
                ls[i] = (struct dlx_member_layout){names[i], {kDLFloat, 32, 1}, 1, one};
        }
        int ea = dlx_group_alloc(c, ls, N, &grp);
        if (ea == 0) {
                int ep = dlx_group_publish(c, "cap", grp, NULL, NULL);
                dlx_group_release(grp);
                ck_abort_msg("dlx_group_alloc of %d members passed (publish then: %d, %s)", N, ep,
                             dlx_last_error());
        }
        ck_assert_int_eq(ea, -E2BIG);
        for (int i = 0; i < N; i++)
                ms[i] = (struct dlx_member){names[i], small_f32(&deleted)};
        int eg = dlx_publish_group(c, "cap", ms, N, NULL, NULL);
        ck_assert_msg(eg == -E2BIG, "publish of %d members: %d (%s)", N, eg, dlx_last_error());
        ck_assert_int_eq(atomic_load(&deleted), N);
        expect_back_to(c, &before, "a refused group over the cap");
        free(ms);
        free(ls);
        free(names);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * --max-group-table: "bytes of one group's table: its members' names and
 * layouts, padded to 4 KiB". A raw table that ends at exactly the limit
 * passes; one byte more (padded: 4 KiB more) fails with -E2BIG.
 */
static const uint64_t table_limits[] = {8192, 16384, 12288};

START_TEST(max_group_table_exact_edge_raw)
{
        char lim[32];
        uint64_t limit = table_limits[_i];
        const char *args[] = {"--max-group-table", lim, NULL};
        static char names[128][256];
        const char *np[128];
        struct gseg g;

        snprintf(lim, sizeof(lim), "%" PRIu64, limit);
        dlxd_start(&fx, args);
        dlx_client *c = fx_connect(&fx, "p");
        ck_assert_uint_eq(fx_stats(c).limits.max_group_table, limit);
        int sock = rp_connect(fx.socket, "raw");
        /* n members of 64 + names bytes each; names fill the table to exactly limit */
        uint32_t n = (uint32_t)(limit / 200);
        uint64_t fixed = sizeof(struct group_head) + (uint64_t)n * 64, room = limit - fixed;
        for (uint32_t i = 0; i < n; i++) {
                uint64_t len = room / n - 1 + (i < room % n ? 1 : 0);
                ck_assert_uint_le(len, 255);
                memset(names[i], 'a', len);
                names[i][len] = '\0';
                snprintf(names[i], 6, "%05u", i % 100000u);
                names[i][5] = 'a';
                np[i] = names[i];
        }
        gbuild_names(&g, np, n, 0);
        ck_assert_uint_eq(g.table_end, limit);
        send_group_publish(sock, 10, "t", &g, false);
        expect_answer(sock, 10, WIRE_OK);
        free(g.p);
        size_t l = strlen(names[n - 1]);
        names[n - 1][l] = 'b';
        names[n - 1][l + 1] = '\0';
        gbuild_names(&g, np, n, 0);
        ck_assert_uint_eq(g.table_end, limit + 1);
        struct dlx_stats before = fx_stats(c);
        send_group_publish(sock, 11, "t", &g, false);
        expect_answer(sock, 11, WIRE_TOO_BIG);
        ck_assert_uint_eq(fx_stats(c).fds, before.fds);
        free(g.p);
        close(sock);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * The same edge through libdlx: whatever table libdlx lays out, what
 * dlx_group_alloc() accepts dlx_group_publish() publishes, and
 * dlx_publish_group() of the same members agrees with both (dlx.h:
 * "-E2BIG (members or table over the daemon's limits, as for
 * dlx_publish_group())"); and a table that fits by the README's count
 * ("names and layouts, padded to 4 KiB") is accepted.
 */
START_TEST(max_group_table_edge_libdlx_agrees)
{
        char lim[32];
        uint64_t limit = table_limits[_i];
        const char *args[] = {"--max-group-table", lim, NULL};
        static struct members m;
        int passes = 0, fails = 0;

        snprintf(lim, sizeof(lim), "%" PRIu64, limit);
        dlxd_start(&fx, args);
        dlx_client *c = fx_connect(&fx, "p");
        uint32_t n = (uint32_t)(limit / 200);
        uint64_t fixed = sizeof(struct group_head) + (uint64_t)n * 64;
        /* name lengths around the edge: n names of len + 1 bytes each */
        uint64_t edge_len = (limit - fixed) / n - 1;
        for (uint64_t len = edge_len - 3; len <= edge_len + 3 && len <= 255; len++) {
                dlx_group *grp = NULL;
                uint64_t table = fixed + n * (len + 1);
                members_fill(&m, (int)n, len);
                int ea = dlx_group_alloc(c, m.ls, n, &grp);
                int ep = -1;
                if (ea == 0) {
                        ep = dlx_group_publish(c, "t", grp, NULL, NULL);
                        dlx_group_release(grp);
                        ck_assert_msg(ep == 0, "len %llu: alloc passed, publish %d (%s)",
                                      (unsigned long long)len, ep, dlx_last_error());
                } else {
                        ck_assert_int_eq(ea, -E2BIG);
                }
                int eg = dlx_publish_group(c, "t", m.ms, n, NULL, NULL);
                ck_assert_msg(eg == ea, "len %llu (table %llu of %llu): alloc %d, publish_group %d",
                              (unsigned long long)len, (unsigned long long)table,
                              (unsigned long long)limit, ea, eg);
                if (table <= limit)
                        ck_assert_msg(ea == 0, "table of %llu bytes refused under %llu (%s)",
                                      (unsigned long long)table, (unsigned long long)limit,
                                      dlx_last_error());
                ea == 0 ? passes++ : fails++;
        }
        ck_assert_int_gt(passes, 0);
        ck_assert_int_gt(fails, 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* ---- limits: the default --max-fds ------------------------------------------------------------
 */

struct fd_row {
        rlim_t limit;
        const char *max_clients; /* NULL: default 1024 */
        uint64_t max_fds;
};

/*
 * README: "By default --max-fds is the descriptor limit less 64 and 6 per
 * --max-clients ..., at least half the limit"; and a per-uid limit left
 * fair is, for a uid alone, "half of descriptors".
 */
static const struct fd_row fd_rows[] = {
        {1024, NULL, 512},   /* 1024 - 64 - 6144 < 512 */
        {1024, "16", 864},   /* 1024 - 64 - 96 */
        {2048, "100", 1384}, /* 2048 - 64 - 600 */
        {1000, "100", 500},  /* 336 < 500 */
        {4096, "500", 2048}, /* 4096 - 64 - 3000 = 1032 < 2048 */
        {8192, "64", 7744},  /* 8192 - 64 - 384 */
};

static void start_with_nofile(rlim_t limit, const char *const *args)
{
        struct rlimit low = {.rlim_cur = limit, .rlim_max = limit}, saved;

        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
        ck_assert_uint_ge(saved.rlim_max, limit);
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
        dlxd_start(&fx, args);
        setrlimit(RLIMIT_NOFILE, &saved); /* may fail: a hard limit once lowered stays */
}

/*
 * start_with_nofile(), with the daemon's stderr (its log) in a file of its
 * own at path (PATH_MAX), named after tag, for log_says_starved() to read.
 * Returns the test's own stderr, a descriptor to close after dlxd_stop()
 * (the fixture counts the test's descriptors from dlxd_start() on).
 */
static int start_logged(rlim_t limit, const char *const *args, const char *tag, char *path)
{
        int saved = dup(2), fd;

        snprintf(path, PATH_MAX, "/tmp/dlx-limit-edges-%s-%d.log", tag, (int)getpid());
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        ck_assert_int_ge(saved, 0);
        ck_assert_int_ge(fd, 0);
        dup2(fd, 2);
        close(fd);
        start_with_nofile(limit, args);
        dup2(saved, 2);
        return saved;
}

START_TEST(default_max_fds_exact)
{
        const struct fd_row *r = &fd_rows[_i];
        const char *args[] = {"--max-clients", r->max_clients, NULL};

        if (getenv("DLX_TEST_VALGRIND"))
                return;
        start_with_nofile(r->limit, r->max_clients ? args : NULL);
        dlx_client *c = fx_connect(&fx, "stats");
        struct dlx_stats st = fx_stats(c);
        ck_assert_msg(st.limits.max_fds == r->max_fds,
                      "limit %llu, --max-clients %s: max_fds %llu, README says %llu",
                      (unsigned long long)r->limit, r->max_clients ? r->max_clients : "1024",
                      (unsigned long long)st.limits.max_fds, (unsigned long long)r->max_fds);
        ck_assert_uint_eq(st.limits.max_fds_per_uid, r->max_fds / 2);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* ---- limits: churning big segments under a low descriptor limit -------------------------------
 */

#define CHURN_MS 4000
#define BIG_SEG (2u << 20)

struct churn {
        uid_t uid;
        int id;
        bool groups; /* big groups instead of big tensors */
};

/* Counts of what a churner saw, through its exit status: 0 fine, else what broke. */
static int churn_main(void *arg)
{
        const struct churn *ch = arg;
        enum { WINDOW = 24 };
        struct wire_request req;
        struct wire_reply rep;
        uint8_t f[4096];
        uint64_t sent = 0, got = 0;
        struct gseg g = {0};

        if (ch->uid != 0 &&
            (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(ch->uid) != 0))
                return 90;
        int sock = rp_connect(fx.socket, "churner");
        if (ch->groups) {
                static const char *const nm[] = {"a", "b"};
                gbuild_names(&g, nm, 2, BIG_SEG);
        }
        int64_t end = fx_now_ms() + CHURN_MS;
        while (fx_now_ms() < end || got < sent) {
                while (sent - got < WINDOW && fx_now_ms() < end) {
                        char name[64];
                        uint64_t id = 100 + sent;
                        snprintf(name, sizeof(name), "churn/%d/%u/%llu", ch->id, (unsigned)ch->uid,
                                 (unsigned long long)(sent % 6));
                        if (sent % 3 == 2) {
                                simple_req(&req, id, WIRE_REQ_UNPUBLISH, name);
                                size_t n = rp_frame(&req, 0, f, sizeof(f));
                                if (rp_send_raw(sock, f, n, NULL, 0) != 0)
                                        return 10;
                        } else {
                                int fd;
                                if (ch->groups) {
                                        fd = memfd_create("g", MFD_CLOEXEC | MFD_ALLOW_SEALING);
                                        if (fd < 0 || ftruncate(fd, (off_t)g.size) != 0 ||
                                            pwrite(fd, g.p, ghead(&g)->data_off, 0) < 0 ||
                                            fcntl(fd, F_ADD_SEALS,
                                                  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0)
                                                return 11;
                                        group_publish_req(&req, id, name, &g, false);
                                } else {
                                        fd = memfd_create("b", MFD_CLOEXEC | MFD_ALLOW_SEALING);
                                        if (fd < 0 || ftruncate(fd, BIG_SEG) != 0 ||
                                            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) !=
                                                    0)
                                                return 11;
                                        rp_publish_req(&req, id, name, 4096, 0,
                                                       DLPACK_FLAG_BITMASK_READ_ONLY);
                                }
                                size_t n = rp_frame(&req, 1, f, sizeof(f));
                                int err = rp_send_raw(sock, f, n, &fd, 1);
                                close(fd);
                                if (err != 0)
                                        return 12;
                        }
                        sent++;
                }
                if (got < sent) {
                        int r = rp_read_answer(sock, &rep, REPLY_MS, NULL);
                        if (r != 1) {
                                fprintf(stderr, "churner %d (uid %u): dropped after %llu (%d)\n",
                                        ch->id, (unsigned)ch->uid, (unsigned long long)got, r);
                                return 20;
                        }
                        if (rep.id != 100 + got)
                                return 21;
                        if (rep.status != WIRE_OK && rep.status != WIRE_LIMIT &&
                            rep.status != WIRE_NOT_FOUND) {
                                fprintf(stderr, "churner %d: request %llu: %d %s\n", ch->id,
                                        (unsigned long long)rep.id, rep.status, rep.error);
                                return 22;
                        }
                        got++;
                }
        }
        close(sock);
        free(g.p);
        return 0;
}

struct sampler {
        pid_t pid;
        atomic_bool stop;
        int worst;
};

static void *sample_fds(void *arg)
{
        struct sampler *s = arg;

        while (!atomic_load(&s->stop)) {
                int n = count_fds(s->pid);
                if (n > s->worst)
                        s->worst = n;
                fx_sleep_ms(2);
        }
        return NULL;
}

/*
 * Publishes persistent segments of size bytes from peer, "fill/0" on, until
 * a limit refuses one or max are held: how many it holds.
 */
static int fill_until_refused(int peer, uint64_t size, int max)
{
        struct wire_request req;
        struct wire_reply rep;
        int held = 0;

        for (int i = 0; i < max; i++) {
                char name[32];
                int fd = make_memfd(size, F_SEAL_SHRINK | F_SEAL_GROW);
                snprintf(name, sizeof(name), "fill/%d", i);
                rp_publish_req(&req, 10 + (uint64_t)i, name, 4096, 0,
                               DLPACK_FLAG_BITMASK_READ_ONLY);
                req.publish.persist = true;
                rp_send(peer, &req, fd);
                close(fd);
                ck_assert_int_eq(rp_read_answer(peer, &rep, REPLY_MS, NULL), 1);
                if (rep.status != WIRE_OK) {
                        ck_assert_int_eq(rep.status, WIRE_LIMIT);
                        break;
                }
                held++;
        }
        return held;
}

/* Echoes dlxd's log at path to stderr and removes it: whether it ran out of descriptors. */
static bool log_says_starved(const char *path)
{
        FILE *lf = fopen(path, "re");
        char line[512];
        bool starved = false;

        ck_assert_ptr_nonnull(lf);
        while (fgets(line, sizeof(line), lf)) {
                fputs(line, stderr);
                if (strstr(line, "pausing accepts") || strstr(line, "too many fds"))
                        starved = true;
        }
        fclose(lf);
        unlink(path);
        return starved;
}

/*
 * README: "--max-fds ... so that no client can take the descriptor table
 * from new connections", "A client that follows the protocol is never
 * dropped", big destroyed segments "close just after the reply that
 * destroyed them". dlxd under RLIMIT_NOFILE 1024 with --max-clients 24; a
 * filler holds its fair share of descriptors in big persistent segments;
 * five churners of three uids replace and unpublish big tensors and big
 * groups, pipelined; meanwhile the test connects, acquires, publishes and
 * reads stats over and over. Every connect and acquire succeeds, nobody is
 * dropped, dlxd never runs out of descriptors, and stats report the limits
 * as documented throughout.
 */
START_TEST(churning_big_segments_never_starve_new_connections)
{
        static const char *const args[] = {"--max-clients", "24", "--group", "65534", NULL};
        char logpath[PATH_MAX];
        struct sampler s = {0};
        pthread_t th;

        if (getenv("DLX_TEST_VALGRIND"))
                return;
        if (geteuid() != 0) { /* the churners run as three uids */
                fprintf(stderr, "churning_big_segments_never_starve_new_connections: not root, "
                                "skipped\n");
                return;
        }
        int saved_err = start_logged(1024, args, "churn", logpath);
        open_to_others();

        dlx_client *c = fx_connect(&fx, "observer");
        struct dlx_stats st = fx_stats(c);
        const uint64_t max_fds = 1024 - 64 - 6 * 24;
        ck_assert_uint_eq(st.limits.max_fds, max_fds);

        /* the filler: big persistent segments until refused */
        int filler = rp_connect(fx.socket, "filler");
        int held = 0;
        DLXV(dlx_publish(c, "keep", small_f32(NULL), &(struct dlx_publish_options){.persist = true},
                         NULL));
        held = 1;
        held += fill_until_refused(filler, BIG_SEG, 2000);
        st = fx_stats(c);
        fprintf(stderr, "churn: filler holds %d of max_fds %llu (per uid %llu)\n", held,
                (unsigned long long)st.limits.max_fds,
                (unsigned long long)st.limits.max_fds_per_uid);
        close(filler);

        s.pid = fx.pid;
        ck_assert_int_eq(pthread_create(&th, NULL, sample_fds, &s), 0);
        static struct churn chs[] = {
                {0, 1, false}, {0, 2, true}, {NOBODY, 3, false}, {1001, 4, false}, {1001, 5, true},
        };
        pid_t kids[N_ELEMS(chs)];
        for (size_t i = 0; i < N_ELEMS(chs); i++)
                kids[i] = fx_spawn(churn_main, &chs[i]);

        int64_t end = fx_now_ms() + CHURN_MS, worst_connect = 0;
        int rounds = 0;
        while (fx_now_ms() < end) {
                struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "new"};
                dlx_client *n = NULL;
                DLManagedTensorVersioned *t = NULL;
                int64_t t0 = fx_now_ms();
                int err = dlx_connect(&o, &n);
                int64_t dt = fx_now_ms() - t0;
                if (dt > worst_connect)
                        worst_connect = dt;
                ck_assert_msg(err == 0, "connect %d: %s (%s)", rounds, dlx_strerror(err),
                              dlx_last_error());
                err = dlx_acquire(n, "keep", NULL, &t);
                ck_assert_msg(err == 0, "acquire %d: %s (%s)", rounds, dlx_strerror(err),
                              dlx_last_error());
                t->deleter(t);
                err = dlx_publish(n, "new/x", heap_bytes(64, 1), NULL, NULL);
                ck_assert_msg(err == 0 || err == -EAGAIN, "publish %d: %s (%s)", rounds,
                              dlx_strerror(err), dlx_last_error());
                st = fx_stats(n);
                ck_assert_uint_eq(st.limits.max_fds, max_fds);
                ck_assert_uint_le(st.fds, max_fds);
                dlx_close(n);
                rounds++;
        }
        for (size_t i = 0; i < N_ELEMS(chs); i++) {
                int rc = fx_wait(kids[i]);
                ck_assert_msg(rc == 0, "churner %zu (uid %u) ended with %d", i,
                              (unsigned)chs[i].uid, rc);
        }
        atomic_store(&s.stop, true);
        pthread_join(th, NULL);
        fprintf(stderr, "churn: %d connects, worst %lld ms; dlxd held at most %d fds of 1024\n",
                rounds, (long long)worst_connect, s.worst);

        /* what dlxd said about its descriptors */
        ck_assert_msg(!log_says_starved(logpath), "dlxd ran out of descriptors (its log above)");
        ck_assert_int_lt(s.worst, 1024);
        dlx_close(c);
        dlxd_stop(&fx);
        close(saved_err);
}
END_TEST

/* Reads the daemon log at path to stderr; whether it ran out of descriptors. */
/*
 * The reserve, taken at its word: "--max-fds is the descriptor limit less
 * 64 and 6 per --max-clients (kept for the daemon and its connections: a
 * socket, a release ring on its way, and at most 4 descriptors a connection
 * may have sent ahead of its frame ...), ... so that no client can take the
 * descriptor table from new connections. The daemon's 64 include up to 32
 * descriptors of destroyed segments of 1 MiB or more". RLIMIT_NOFILE 2048,
 * --max-clients 100: --max-fds 1384, filled; 96 peers each track a name,
 * have a big group publish in the daemon and 4 descriptors sent ahead of a
 * frame; 70 big segments are destroyed at once; a new client still connects,
 * acquires and tracks, and dlxd never runs out.
 */
START_TEST(every_client_holding_all_it_may_leaves_room)
{
        enum { HOGS = 96, LIMIT = 2048 };
        static const char *const args[] = {"--max-clients",
                                           "100",
                                           "--max-clients-per-uid",
                                           "0",
                                           "--max-fds-per-uid",
                                           "0",
                                           "--timeout-ms",
                                           "60000",
                                           NULL};
        char logpath[PATH_MAX];
        struct sampler smp = {0};
        pthread_t th;
        struct wire_request req;
        struct wire_reply rep;
        int hogs[HOGS];

        if (getenv("DLX_TEST_VALGRIND"))
                return;
        int saved_err = start_logged(LIMIT, args, "hold", logpath);

        dlx_client *c = fx_connect(&fx, "observer");
        const uint64_t max_fds = LIMIT - 64 - 6 * 100;
        ck_assert_uint_eq(fx_stats(c).limits.max_fds, max_fds);
        DLXV(dlx_publish(c, "keep", small_f32(NULL), &(struct dlx_publish_options){.persist = true},
                         NULL));
        /* 70 big segments, to be destroyed at once */
        int bigholder = rp_connect(fx.socket, "bigholder");
        for (int i = 0; i < 70; i++) {
                char name[32];
                int fd = make_memfd(BIG_SEG, F_SEAL_SHRINK | F_SEAL_GROW);
                snprintf(name, sizeof(name), "big/%d", i);
                rp_publish_req(&req, 10 + (uint64_t)i, name, 4096, 0,
                               DLPACK_FLAG_BITMASK_READ_ONLY);
                rp_send(bigholder, &req, fd);
                close(fd);
                expect_answer(bigholder, req.id, WIRE_OK);
        }
        /* the rest of --max-fds */
        int filler = rp_connect(fx.socket, "filler"), held = 71;
        held += fill_until_refused(filler, 4096, 3000);
        close(filler);
        ck_assert_uint_eq(fx_stats(c).fds, max_fds);
        fprintf(stderr, "hold: dlxd has %d fds with --max-fds %llu full (%d held)\n",
                count_fds(fx.pid), (unsigned long long)max_fds, held);

        smp.pid = fx.pid;
        ck_assert_int_eq(pthread_create(&th, NULL, sample_fds, &smp), 0);
        struct gseg g;
        gbuild_big(&g, 70000, false);
        int gfd = gmemfd(&g);
        for (int i = 0; i < HOGS; i++) {
                uint8_t hdr[FRAME_HEADER_SIZE];
                int ahead[4];
                hogs[i] = rp_connect(fx.socket, "hog");
                memset(&req, 0, sizeof(req));
                req.id = 2;
                req.type = WIRE_REQ_TRACK;
                snprintf(req.track.name, sizeof(req.track.name), "t/%d", i);
                rp_send(hogs[i], &req, -1);
                int page = -1;
                ck_assert_int_eq(rp_read_answer(hogs[i], &rep, REPLY_MS, &page), 1);
                ck_assert_int_eq(rep.status, WIRE_OK);
                if (page >= 0)
                        close(page);
                char name[32];
                snprintf(name, sizeof(name), "hog/%d", i);
                group_publish_req(&req, 3, name, &g, false);
                rp_send(hogs[i], &req, gfd);
                for (int k = 0; k < 4; k++)
                        ahead[k] = make_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
                frame_header_put(hdr, 64, 4);
                ck_assert_int_eq(rp_send_raw(hogs[i], hdr, 1, ahead, 4), 0);
                for (int k = 0; k < 4; k++)
                        close(ahead[k]);
        }
        close(gfd);
        fx_sleep_ms(200);
        close(bigholder); /* 70 big segments destroyed at once */
        int64_t worst = 0;
        for (int round = 0; round < 20; round++) {
                struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "new"};
                dlx_client *n = NULL;
                DLManagedTensorVersioned *t = NULL;
                uint32_t track = 0;
                int64_t t0 = fx_now_ms();
                int err = dlx_connect(&o, &n);
                if (fx_now_ms() - t0 > worst)
                        worst = fx_now_ms() - t0;
                ck_assert_msg(err == 0, "connect %d: %s (%s)", round, dlx_strerror(err),
                              dlx_last_error());
                err = dlx_acquire(n, "keep", NULL, &t);
                ck_assert_msg(err == 0, "acquire %d: %s (%s)", round, dlx_strerror(err),
                              dlx_last_error());
                t->deleter(t);
                err = dlx_track(n, "keep", &track);
                ck_assert_msg(err == 0, "track %d: %s (%s)", round, dlx_strerror(err),
                              dlx_last_error());
                dlx_close(n);
        }
        atomic_store(&smp.stop, true);
        pthread_join(th, NULL);
        fprintf(stderr, "hold: dlxd held at most %d fds of %d; worst connect %lld ms\n", smp.worst,
                LIMIT, (long long)worst);
        for (int i = 0; i < HOGS; i++)
                close(hogs[i]);
        free(g.p);
        ck_assert_msg(!log_says_starved(logpath), "dlxd ran out of descriptors (its log above)");
        ck_assert_int_lt(smp.worst, LIMIT);
        dlx_close(c);
        dlxd_stop(&fx);
        close(saved_err);
}
END_TEST

/*
 * README: "up to 64 descriptors of destroyed segments of 1 MiB or more,
 * which close just after the reply that destroyed them" are what the
 * reserve keeps for them, and "A client that follows the protocol is never
 * dropped, however it pipelines: replies it has not read yet wait in the
 * daemon". Ten peers, --max-fds full of their big segments, each with a
 * socket full of replies it has not read yet, each replace all theirs
 * (unpublish, publish a fresh one) pipelined: the replies that destroyed the
 * old segments wait in the daemon. dlxd must not run out of descriptors
 * (nor drop a peer for it), and every request is answered.
 */
START_TEST(deferred_closes_behind_unread_replies_stay_bounded)
{
        enum { PEERS = 10, EACH = 184, LIMIT = 2048 };
        static const char *const args[] = {"--max-clients",
                                           "24",
                                           "--max-clients-per-uid",
                                           "0",
                                           "--max-fds-per-uid",
                                           "0",
                                           "--timeout-ms",
                                           "60000",
                                           NULL};
        char logpath[PATH_MAX];
        struct sampler smp = {0};
        pthread_t th;
        struct wire_request req;
        struct wire_reply rep;
        int peers[PEERS];
        uint64_t next_id[PEERS];

        if (getenv("DLX_TEST_VALGRIND"))
                return;
        int saved_err = start_logged(LIMIT, args, "defer", logpath);

        dlx_client *c = fx_connect(&fx, "observer");
        const uint64_t max_fds = LIMIT - 64 - 6 * 24;
        ck_assert_uint_eq(fx_stats(c).limits.max_fds, max_fds);
        for (int p = 0; p < PEERS; p++) {
                peers[p] = rp_connect(fx.socket, "peer");
                next_id[p] = 10;
                for (int i = 0; i < EACH; i++) {
                        char name[32];
                        int fd = make_memfd(BIG_SEG, F_SEAL_SHRINK | F_SEAL_GROW);
                        snprintf(name, sizeof(name), "d/%d/%d", p, i);
                        rp_publish_req(&req, next_id[p]++, name, 4096, 0,
                                       DLPACK_FLAG_BITMASK_READ_ONLY);
                        rp_send(peers[p], &req, fd);
                        close(fd);
                        expect_answer(peers[p], req.id, WIRE_OK);
                }
        }
        ck_assert_uint_eq(fx_stats(c).fds, max_fds);
        int base = count_fds(fx.pid);
        smp.pid = fx.pid;
        ck_assert_int_eq(pthread_create(&th, NULL, sample_fds, &smp), 0);
        /* fill each peer's socket with replies it does not read: lists of every name */
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        for (int p = 0; p < PEERS; p++) {
                len = 0;
                for (int k = 0; k < 40; k++) {
                        memset(&req, 0, sizeof(req));
                        req.id = next_id[p]++;
                        req.type = WIRE_REQ_LIST;
                        req.list.limit = 1000;
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                ck_assert_int_eq(rp_send_raw(peers[p], buf, len, NULL, 0), 0);
        }
        fx_sleep_ms(300);
        /* then replace every big segment, pipelined, reading nothing */
        for (int i = 0; i < EACH; i++) {
                for (int p = 0; p < PEERS; p++) {
                        char name[32];
                        uint8_t f[4096];
                        snprintf(name, sizeof(name), "d/%d/%d", p, i);
                        simple_req(&req, next_id[p]++, WIRE_REQ_UNPUBLISH, name);
                        size_t n = rp_frame(&req, 0, f, sizeof(f));
                        ck_assert_int_eq(rp_send_raw(peers[p], f, n, NULL, 0), 0);
                        int fd = make_memfd(BIG_SEG, F_SEAL_SHRINK | F_SEAL_GROW);
                        rp_publish_req(&req, next_id[p]++, name, 4096, 0,
                                       DLPACK_FLAG_BITMASK_READ_ONLY);
                        n = rp_frame(&req, 1, f, sizeof(f));
                        ck_assert_int_eq(rp_send_raw(peers[p], f, n, &fd, 1), 0);
                        close(fd);
                }
        }
        fx_sleep_ms(1000);
        int while_unread = count_fds(fx.pid);
        /* a newcomer connects meanwhile */
        dlx_client *n = fx_connect(&fx, "newcomer");
        ck_assert_int_eq(dlx_ping(n), 0);
        dlx_close(n);
        /* now read everything: every request answered, none refused but by a limit */
        int refused = 0;
        for (int p = 0; p < PEERS; p++) {
                for (uint64_t id = 10 + EACH; id < next_id[p]; id++) {
                        int r = rp_read_answer(peers[p], &rep, REPLY_MS, NULL);
                        ck_assert_msg(r == 1, "peer %d: request %llu not answered (%d): dropped", p,
                                      (unsigned long long)id, r);
                        ck_assert_uint_eq(rep.id, id);
                        if (rep.status == WIRE_LIMIT)
                                refused++;
                        else
                                ck_assert_msg(rep.status == WIRE_OK, "peer %d request %llu: %d %s",
                                              p, (unsigned long long)id, rep.status, rep.error);
                }
        }
        atomic_store(&smp.stop, true);
        pthread_join(th, NULL);
        fprintf(stderr,
                "defer: dlxd at %d fds full, %d with replies unread, at most %d of %d; %d "
                "publishes refused\n",
                base, while_unread, smp.worst, LIMIT, refused);
        ck_assert_msg(!log_says_starved(logpath), "dlxd ran out of descriptors (its log above)");
        ck_assert_int_le(smp.worst, base + 64 + 4 * PEERS + 2);
        for (int p = 0; p < PEERS; p++)
                close(peers[p]);
        free(buf);
        dlx_close(c);
        dlxd_stop(&fx);
        close(saved_err);
}
END_TEST

Suite *limit_edges_suite(void)
{
        Suite *s = suite_create("limit-edges");
        TCase *tc = tcase_create("groups");
        TCase *own = tcase_create("own-daemon");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, requests_behind_two_big_publishes_in_order);
        tcase_add_test(tc, tensor_behind_big_group_of_same_name_wins);
        tcase_add_test(tc, half_closed_during_big_check_gets_every_reply);
        tcase_add_test(tc, hangup_during_big_check_leaves_nothing);
        tcase_add_test(tc, pings_stay_fast_during_a_huge_check);
        tcase_add_test(tc, replace_and_unpublish_race_a_big_check);
        tcase_add_test(tc, watch_sees_one_event_per_big_version);
        suite_add_tcase(s, tc);

        tcase_add_unchecked_fixture(own, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(own, 120);
        tcase_add_test(own, max_group_members_exact_edge);
        tcase_add_test(own, max_group_members_over_cap_reads_as_cap);
        tcase_add_test(own, members_over_the_cap_are_e2big_everywhere);
        tcase_add_rows(own, max_group_table_exact_edge_raw, table_limits);
        tcase_add_rows(own, max_group_table_edge_libdlx_agrees, table_limits);
        tcase_add_rows(own, default_max_fds_exact, fd_rows);
        tcase_add_test(own, churning_big_segments_never_starve_new_connections);
        tcase_add_test(own, every_client_holding_all_it_may_leaves_room);
        tcase_add_test(own, deferred_closes_behind_unread_replies_stay_bounded);
        suite_add_tcase(s, own);
        return s;
}
