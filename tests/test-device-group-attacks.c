/* SPDX-License-Identifier: MIT */
/*
 * A second reader's attacks on device groups in dlxd (protocol 1.4), from
 * raw peers: what README's "Device groups", proto/dlx.proto (table_segment,
 * SegmentReply) and proto/group.h (GROUP_FORMAT_APART) promise, tried the
 * way a hostile or careless peer would. Each test is named after the
 * promise it checks.
 *
 * As in test-device-group.c, dlxd runs with --cuda-device-number of
 * /dev/ptmx, whose masters stand in for the driver's VMM exports.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "rawpeer.h"
#include "devgroup.h"
#include "tables.h"

#define DLXV(call) ck_assert_int_eq((call), 0)
#define F32                                                                                        \
        {                                                                                          \
                kDLFloat, 32, 1                                                                    \
        }
#define NOBODY 65534

static void setup(void)
{
        devgroup_dlxd_start(NULL);
}

static void setup_shared(void)
{
        const char *const more[] = {"--group", "65534", NULL};

        /* only root makes a child of another uid (the test skips otherwise) */
        devgroup_dlxd_start(geteuid() == 0 ? more : NULL);
}

/* ---- the table is a sealed memfd nobody can write ----------------------------------------------
 */

/*
 * Promise: the table travels as a *sealed* memfd that dlxd checks once and
 * never reads again. A memfd already carrying a writable version (whose
 * readers map it writable, and which dlxd sealed with F_SEAL_SEAL) cannot
 * be sealed against writing: as a device group's table it must be refused,
 * else any reader of the writable tensor rewrites a checked table.
 */
START_TEST(table_is_sealed_never_a_writable_segment)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_request req;
        struct wire_reply rep;
        struct held before;
        struct gseg g;
        int m;

        gbuild(&g, two, 2, MEM_BYTES, true);
        ck_assert_uint_eq(g.size % 4, 0);
        m = gmemfd(&g, 0);
        rp_publish_req(&req, 3, "w", g.size, 0, 0);
        ck_assert_int_eq(call(prod, &req, m, &rep, NULL), WIRE_OK);
        before = held_now(obs);
        int st = publish_fd(prod, 4, "dg", &g, seg, m, &rep);
        if (st == WIRE_OK) {
                /* show what it allows: a reader of "w" rewrites the table under "dg" */
                int fd = -1;
                rp_acquire_req(&req, 5, "w");
                ck_assert_int_eq(call(cons, &req, -1, &rep, &fd), WIRE_OK);
                uint8_t *p = mmap(NULL, g.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                ck_assert_msg(p == MAP_FAILED,
                              "a writable version's memfd was accepted as a device group's table, "
                              "and a reader of that version maps it writable");
        }
        ck_assert_msg(st != WIRE_OK, "a memfd carrying a writable version became a table");
        ck_assert_msg(rep.error[0], "refused without a reason");
        expect_held(obs, &before, "a refused table");
        close(m);
        close(cons);
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

/*
 * Promise (proto/group.h): a GROUP_FORMAT_APART table's segment ends at
 * data_off. A table memfd with bytes after the table is refused, leaving
 * nothing.
 */
START_TEST(apart_table_ends_at_data_off)
{
        int prod = rp_connect(fx.socket, "producer");
        dlx_client *obs = fx_connect(&fx, "observer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_reply rep;
        struct held before;
        struct gseg g, big;

        gbuild(&g, two, 2, MEM_BYTES, true);
        big = g;
        big.size = g.size + 4096;
        big.p = calloc(1, big.size);
        memcpy(big.p, g.p, g.size);
        before = held_now(obs);
        int st = publish(prod, 3, "dg", &big, seg, &rep);
        ck_assert_msg(st == WIRE_INVALID, "a table with 4096 bytes after data_off: status %d (%s)",
                      st, rep.error);
        expect_held(obs, &before, "a table with a tail");
        close(prod);
        dlx_close(obs);
        free(g.p);
        free(big.p);
}
END_TEST

/*
 * Promise: a device group is a group (members > 0). A table of no members,
 * announced as members = 0 (a plain VMM tensor with a table attached), is
 * refused, leaving nothing; so is one of 0 members announced as 1.
 */
START_TEST(device_group_has_members)
{
        int prod = rp_connect(fx.socket, "producer");
        dlx_client *obs = fx_connect(&fx, "observer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_request req;
        struct wire_reply rep;
        struct held before;
        struct gseg g;

        gbuild(&g, NULL, 0, MEM_BYTES, true);
        for (uint32_t members = 0; members < 2; members++) {
                int fd = gmemfd(&g, F_SEAL_WRITE);
                device_group_publish_req(&req, 3 + members, "dg", &g, seg);
                req.publish.tensor.members = members;
                before = held_now(obs);
                int st = call(prod, &req, fd, &rep, NULL);
                close(fd);
                ck_assert_msg(st != WIRE_OK, "a table of 0 members, announced as %u, published",
                              members);
                expect_held(obs, &before, "a group of no members");
        }
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

/* Promise: cuda-ipc memory is never persistent; as a device group's too. Nothing left. */
START_TEST(ipc_device_group_never_persists)
{
        int prod = rp_connect(fx.socket, "producer");
        dlx_client *obs = fx_connect(&fx, "observer");
        struct wire_request req;
        struct wire_reply rep;
        struct held before;
        struct gseg g;
        int fd, st;

        gbuild(&g, two, 2, MEM_BYTES, true);
        fd = gmemfd(&g, F_SEAL_WRITE);
        device_group_publish_req(&req, 3, "dg", &g, 0);
        req.publish.persist = true;
        before = held_now(obs);
        st = call(prod, &req, fd, &rep, NULL);
        close(fd);
        ck_assert_msg(st != WIRE_OK, "a persistent cuda-ipc device group was published");
        ck_assert_msg(rep.error[0], "refused without a reason");
        expect_held(obs, &before, "a persistent IPC group");
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

/* Promise: the table is checked against the bytes described: for IPC, within segment_size. */
START_TEST(ipc_group_within_its_declared_size)
{
        int prod = rp_connect(fx.socket, "producer");
        dlx_client *obs = fx_connect(&fx, "observer");
        struct wire_request req;
        struct wire_reply rep;
        struct held before;
        struct gseg g;
        int fd, st;

        gbuild(&g, two, 2, MEM_BYTES, true);
        fd = gmemfd(&g, F_SEAL_WRITE);
        device_group_publish_req(&req, 3, "dg", &g, 0);
        req.publish.segment_size = MEM_BYTES - 4096; /* the members span more than that */
        before = held_now(obs);
        st = call(prod, &req, fd, &rep, NULL);
        close(fd);
        ck_assert_msg(st == WIRE_INVALID, "members past the IPC memory's size: status %d (%s)", st,
                      rep.error);
        expect_held(obs, &before, "an IPC group past its memory");
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

/* ---- descriptors once per session ------------------------------------------------------------ */

/*
 * Promise: each fd once per session while it holds it. Forgotten alone, the
 * memory's fd comes again, and only it (the table is still held).
 */
START_TEST(forgotten_memory_is_sent_again_alone)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_request fr = {.id = 4, .type = WIRE_REQ_FORGET};
        struct wire_reply rep;
        struct gseg g;
        struct got a;

        gbuild(&g, two, 2, MEM_BYTES, true);
        ck_assert_int_eq(publish(prod, 3, "dg", &g, seg, &rep), WIRE_OK);
        ck_assert_int_eq(acquire(cons, 2, "dg", &a), WIRE_OK);
        ck_assert(a.segment && a.table_fd >= 0 && a.fd >= 0);
        fr.forget.segments[0] = seg;
        fr.forget.count = 1;
        got_close(&a);
        ck_assert_int_eq(call(cons, &fr, -1, &rep, NULL), WIRE_OK);
        ck_assert_int_eq(acquire(cons, 5, "dg", &a), WIRE_OK);
        ck_assert_msg(!a.segment && a.table_fd == -1, "the held table came again");
        ck_assert_msg(a.fd >= 0, "the forgotten memory's fd did not come again");
        got_close(&a);
        close(cons);
        close(prod);
        free(g.p);
}
END_TEST

/*
 * Promise: each fd once per session, pipelining or not: five acquires of
 * one group sent at once bring one table fd and one memory fd in all, each
 * acquire's SEGMENT reply (if any) before its ACQUIRE reply.
 */
START_TEST(pipelined_acquires_send_each_fd_once)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_reply rep;
        int tables = 0, mems = 0;
        struct gseg g;
        struct got a;

        gbuild(&g, two, 2, MEM_BYTES, true);
        ck_assert_int_eq(publish(prod, 3, "dg", &g, seg, &rep), WIRE_OK);
        for (uint64_t id = 10; id < 15; id++)
                acquire_send(cons, id, "dg", true, 0, 0);
        for (uint64_t id = 10; id < 15; id++) {
                ck_assert_int_eq(acquire_read(cons, id, &a, 10000), WIRE_OK);
                tables += a.table_fd >= 0;
                mems += a.fd >= 0;
                ck_assert_uint_ne(a.acq.acquire.tensor.table_segment, 0);
                got_close(&a);
        }
        ck_assert_int_eq(tables, 1);
        ck_assert_int_eq(mems, 1);
        close(cons);
        close(prod);
        free(g.p);
}
END_TEST

/*
 * Promise: the SEGMENT reply comes before the ACQUIRE reply on every path,
 * the waiting one too: an acquire that waits for a device group gets the
 * table's fd, then the memory's, when it is published.
 */
START_TEST(waiting_acquire_gets_table_first)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_reply rep;
        struct gseg g;
        struct got a;

        gbuild(&g, two, 2, MEM_BYTES, true);
        acquire_send(cons, 7, "later", true, 0, 5000);
        rp_ping(cons, 8); /* the acquire is waiting */
        ck_assert_int_eq(publish(prod, 3, "later", &g, seg, &rep), WIRE_OK);
        ck_assert_int_eq(acquire_read(cons, 7, &a, 5000), WIRE_OK);
        ck_assert_msg(a.segment && a.table_fd >= 0, "a waited-for device group came without its "
                                                    "table");
        ck_assert_msg(a.fd >= 0, "a waited-for device group came without its memory");
        ck_assert_uint_eq(a.acq.acquire.tensor.table_segment, a.table);
        ck_assert_uint_eq(a.acq.acquire.tensor.members, 2);
        got_close(&a);

        /* and for a newer version (min_version), the new table */
        acquire_send(cons, 9, "later", true, 2, 5000);
        rp_ping(cons, 10);
        ck_assert_int_eq(publish(prod, 4, "later", &g, seg, &rep), WIRE_OK);
        ck_assert_int_eq(acquire_read(cons, 9, &a, 5000), WIRE_OK);
        ck_assert_msg(a.segment && a.table_fd >= 0, "version 2's table did not come");
        ck_assert_msg(a.fd == -1, "the held memory came again");
        ck_assert_uint_eq(a.acq.acquire.tensor.version, 2);
        got_close(&a);
        close(cons);
        close(prod);
        free(g.p);
}
END_TEST

/*
 * Promise: peers of 1.3 cannot acquire a device group (ENOTSUP), on the
 * waiting path too: a 1.3 acquire waiting for a name that becomes a device
 * group gets ENOTSUP, no SEGMENT reply, no fd, no lease.
 */
START_TEST(old_peer_waiting_acquire_gets_enotsup)
{
        int prod = rp_connect(fx.socket, "producer"), old = rp_connect_minor(fx.socket, "old", 3);
        dlx_client *obs = fx_connect(&fx, "observer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_reply rep;
        struct dlx_info info;
        struct gseg g;
        struct got a;

        gbuild(&g, two, 2, MEM_BYTES, true);
        acquire_send(old, 7, "later", true, 0, 5000);
        rp_ping(old, 8);
        ck_assert_int_eq(publish(prod, 3, "later", &g, seg, &rep), WIRE_OK);
        ck_assert_int_eq(acquire_read(old, 7, &a, 5000), WIRE_NOT_SUPPORTED);
        ck_assert_msg(!a.segment && a.fd == -1, "a refused acquire came with descriptors");
        DLXV(dlx_stat(obs, "later", &info));
        ck_assert_uint_eq(info.leases, 0);
        close(old);
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

/*
 * Promise: a tensor and a group do not stand in for each other: a plain
 * acquire of a device group is IS_GROUP, with no SEGMENT reply, fd or lease.
 */
START_TEST(plain_acquire_of_device_group_sends_nothing)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_reply rep;
        struct dlx_info info;
        struct gseg g;
        struct got a;

        gbuild(&g, two, 2, MEM_BYTES, true);
        ck_assert_int_eq(publish(prod, 3, "dg", &g, seg, &rep), WIRE_OK);
        acquire_send(cons, 7, "dg", false, 0, 0);
        ck_assert_int_eq(acquire_read(cons, 7, &a, 5000), WIRE_IS_GROUP);
        ck_assert_msg(!a.segment && a.fd == -1, "a refused acquire came with descriptors");
        DLXV(dlx_stat(obs, "dg", &info));
        ck_assert_uint_eq(info.leases, 0);
        /* the session holds nothing: a group acquire now brings both fds */
        ck_assert_int_eq(acquire(cons, 8, "dg", &a), WIRE_OK);
        ck_assert_msg(a.segment && a.table_fd >= 0 && a.fd >= 0,
                      "after a refused acquire, the group's fds did not come");
        got_close(&a);
        close(cons);
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

/*
 * Promise (flow control + two fds per acquire): a consumer that pipelines
 * acquires of 24 device groups (48 fds) and reads nothing for a while is
 * not dropped; every acquire is answered, table first, each with both fds.
 */
START_TEST(many_device_groups_unread_all_arrive)
{
        enum { N = 24 };
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        struct held empty = held_now(obs);
        uint64_t leases[N];
        struct wire_reply rep;
        struct gseg g;
        struct got a;
        char name[16];

        gbuild(&g, two, 2, MEM_BYTES, true);
        for (int i = 0; i < N; i++) {
                uint64_t seg = vmm_segment(prod, 100 + (uint64_t)i, MEM_BYTES, NULL);
                snprintf(name, sizeof(name), "dg%02d", i);
                ck_assert_int_eq(publish(prod, 200 + (uint64_t)i, name, &g, seg, &rep), WIRE_OK);
        }
        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "dg%02d", i);
                acquire_send(cons, 10 + (uint64_t)i, name, true, 0, 0);
        }
        fx_sleep_ms(300);
        for (int i = 0; i < N; i++) {
                int st = acquire_read(cons, 10 + (uint64_t)i, &a, 10000);
                ck_assert_msg(st == WIRE_OK, "acquire %d: status %d (%s)", i, st, a.acq.error);
                ck_assert_msg(a.segment && a.table_fd >= 0 && a.fd >= 0,
                              "acquire %d: table fd %d, memory fd %d", i, a.table_fd, a.fd);
                ck_assert_uint_eq(a.acq.acquire.tensor.table_segment, a.table);
                leases[i] = a.acq.acquire.lease;
                got_close(&a);
        }
        for (int i = 0; i < N; i++)
                release(cons, leases[i]);
        close(prod);
        close(cons);
        expect_held(obs, &empty, "24 device groups released, their producer gone");
        dlx_close(obs);
        free(g.p);
}
END_TEST

/*
 * Promise: a consumer that closes with acquires answered but unread (fds in
 * flight) leaves nothing behind once its producer goes too.
 */
START_TEST(unread_device_group_fds_return_on_close)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        struct held empty = held_now(obs);
        struct wire_reply rep;
        struct gseg g;
        char name[16];

        gbuild(&g, two, 2, MEM_BYTES, true);
        for (int i = 0; i < 8; i++) {
                uint64_t seg = vmm_segment(prod, 100 + (uint64_t)i, MEM_BYTES, NULL);
                snprintf(name, sizeof(name), "dg%d", i);
                ck_assert_int_eq(publish(prod, 200 + (uint64_t)i, name, &g, seg, &rep), WIRE_OK);
                acquire_send(cons, 10 + (uint64_t)i, name, true, 0, 0);
        }
        rp_ping(prod, 50);
        fx_sleep_ms(100);
        close(cons);
        close(prod);
        expect_held(obs, &empty, "unread device groups of a consumer gone");
        dlx_close(obs);
        free(g.p);
}
END_TEST

/* ---- versions and replacements --------------------------------------------------------------- */

/*
 * Promise: a version lives while current or leased, and a group and a
 * tensor kind may replace each other under one name. Device group v1
 * leased, replaced by a CPU group v2, then by a device group v3 on the
 * same memory: the consumer reads v1's table intact throughout, gets v3's
 * table fresh (not v1's), no memory fd again; after release, the held
 * counts fall back to one version, and to nothing at the end.
 */
START_TEST(device_cpu_device_replacement_under_a_lease)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        struct held empty = held_now(obs);
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        const struct gspec three[] = {
                {"a", F32, 1, {16}, {1}, 0, 0},
                {"b", F32, 1, {4}, {1}, 0, 64},
                {"c", F32, 1, {4}, {1}, 0, 128},
        };
        struct wire_request req;
        struct wire_reply rep;
        struct gseg g1, gc, g3;
        struct got a1, a2, a3;
        int fd;

        gbuild(&g1, two, 2, MEM_BYTES, true);
        gbuild(&gc, two, 2, MEM_BYTES, false);
        gbuild(&g3, three, 3, MEM_BYTES, true);
        ck_assert_int_eq(publish(prod, 3, "x", &g1, seg, &rep), WIRE_OK);
        ck_assert_int_eq(acquire(cons, 4, "x", &a1), WIRE_OK);
        ck_assert(a1.segment && a1.fd >= 0);

        fd = gmemfd(&gc, F_SEAL_WRITE);
        group_publish_req(&req, 5, "x", &gc);
        ck_assert_int_eq(call(prod, &req, fd, &rep, NULL), WIRE_OK);
        close(fd);
        ck_assert_int_eq(acquire(cons, 6, "x", &a2), WIRE_OK);
        ck_assert_msg(!a2.segment, "a CPU group came with a SEGMENT reply");
        ck_assert_int_ge(a2.fd, 0);
        ck_assert_uint_eq(a2.acq.acquire.tensor.table_segment, 0);
        ck_assert_uint_eq(a2.acq.acquire.tensor.storage, WIRE_STORAGE_MEMFD);
        release(cons, a2.acq.acquire.lease);

        ck_assert_int_eq(publish(prod, 7, "x", &g3, seg, &rep), WIRE_OK);
        ck_assert_int_eq(acquire(cons, 8, "x", &a3), WIRE_OK);
        ck_assert_msg(a3.segment && a3.table_fd >= 0, "v3's table did not come");
        ck_assert_uint_ne(a3.table, a1.table);
        ck_assert_msg(a3.fd == -1, "the held memory came again");
        ck_assert_uint_eq(a3.acq.acquire.tensor.members, 3);
        ck_assert_uint_eq(a3.table_size, g3.size);
        uint8_t *t = mmap(NULL, g3.size, PROT_READ, MAP_SHARED, a3.table_fd, 0);
        ck_assert_ptr_ne(t, MAP_FAILED);
        ck_assert_msg(memcmp(t, g3.p, g3.size) == 0, "v3's table is not what was published");
        munmap(t, g3.size);
        /* v1's table, still leased, is v1's */
        t = mmap(NULL, g1.size, PROT_READ, MAP_SHARED, a1.table_fd, 0);
        ck_assert_ptr_ne(t, MAP_FAILED);
        ck_assert_msg(memcmp(t, g1.p, g1.size) == 0, "v1's table changed under its lease");
        munmap(t, g1.size);

        struct dlx_stats st;
        release(cons, a1.acq.acquire.lease);
        release(cons, a3.acq.acquire.lease);
        for (int i = 0; i < 300; i++) {
                DLXV(dlx_stats(obs, &st));
                if (st.versions == empty.versions + 1 && st.segments == empty.segments + 2)
                        break;
                fx_sleep_ms(10);
        }
        ck_assert_msg(st.versions == empty.versions + 1 && st.segments == empty.segments + 2,
                      "current v3 alone: versions %llu, segments %llu (empty %llu, %llu)",
                      (unsigned long long)st.versions, (unsigned long long)st.segments,
                      (unsigned long long)empty.versions, (unsigned long long)empty.segments);
        got_close(&a1);
        got_close(&a2);
        got_close(&a3);
        close(cons);
        close(prod);
        expect_held(obs, &empty, "all gone");
        dlx_close(obs);
        free(g1.p);
        free(gc.p);
        free(g3.p);
}
END_TEST

/*
 * Promise: many versions leased at once, each with a table of its own, all
 * on one memory: 16 tables come (one per version), the memory once; when
 * every lease goes, dlxd holds the current version alone, and nothing once
 * its producer goes.
 */
START_TEST(many_leased_versions_return_to_baseline)
{
        enum { N = 16 };
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        struct held empty = held_now(obs), one;
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL), leases[N];
        struct wire_reply rep;
        int tables = 0, mems = 0;
        struct gseg g;
        struct got a;

        gbuild(&g, two, 2, MEM_BYTES, true);
        for (int i = 0; i < N; i++) {
                ck_assert_int_eq(publish(prod, 10 + (uint64_t)i, "dg", &g, seg, &rep), WIRE_OK);
                if (i == 0) {
                        one = held_now(obs);
                }
                ck_assert_int_eq(acquire(cons, 100 + (uint64_t)i, "dg", &a), WIRE_OK);
                tables += a.table_fd >= 0;
                mems += a.fd >= 0;
                leases[i] = a.acq.acquire.lease;
                got_close(&a);
        }
        ck_assert_int_eq(tables, N);
        ck_assert_int_eq(mems, 1);
        for (int i = 0; i < N; i++)
                release(cons, leases[i]);
        one.leases = 0;
        expect_held(obs, &one, "16 versions released, the last current");
        close(cons);
        close(prod);
        expect_held(obs, &empty, "producer gone");
        dlx_close(obs);
        free(g.p);
}
END_TEST

/*
 * Promise: the same table memfd sent for two versions (and two names) is
 * two tables a consumer can hold; all goes back to nothing at the end.
 */
START_TEST(one_table_memfd_for_two_versions)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        struct held empty = held_now(obs);
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_reply rep;
        struct got a, b, c;
        struct gseg g;
        int fd;

        gbuild(&g, two, 2, MEM_BYTES, true);
        fd = gmemfd(&g, F_SEAL_WRITE);
        ck_assert_int_eq(publish_fd(prod, 3, "dg", &g, seg, fd, &rep), WIRE_OK);
        ck_assert_int_eq(acquire(cons, 4, "dg", &a), WIRE_OK);
        ck_assert_int_eq(publish_fd(prod, 5, "dg", &g, seg, fd, &rep), WIRE_OK);
        ck_assert_int_eq(publish_fd(prod, 6, "other", &g, seg, fd, &rep), WIRE_OK);
        ck_assert_int_eq(acquire(cons, 7, "dg", &b), WIRE_OK);
        ck_assert_int_eq(acquire(cons, 8, "other", &c), WIRE_OK);
        ck_assert_uint_eq(b.acq.acquire.tensor.version, 2);
        ck_assert_uint_ne(b.acq.acquire.tensor.table_segment, 0);
        ck_assert_uint_ne(c.acq.acquire.tensor.table_segment, 0);
        close(fd);
        release(cons, a.acq.acquire.lease);
        release(cons, b.acq.acquire.lease);
        release(cons, c.acq.acquire.lease);
        got_close(&a);
        got_close(&b);
        got_close(&c);
        close(cons);
        close(prod);
        expect_held(obs, &empty, "one table memfd, three versions, all gone");
        dlx_close(obs);
        free(g.p);
}
END_TEST

/*
 * Promise: a refused publish leaves nothing held; a producer that dies
 * mid-publish (half a frame sent, its table attached, then killed)
 * leaves nothing either once its held memory goes with it.
 */
START_TEST(producer_killed_mid_publish_leaves_nothing)
{
        dlx_client *obs = fx_connect(&fx, "observer");
        struct held empty = held_now(obs);
        int sv[2];
        pid_t pid;

        ck_assert_int_eq(pipe(sv), 0);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int prod = rp_connect(fx.socket, "doomed");
                uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
                struct wire_request req;
                struct gseg g;
                uint8_t buf[4096];
                size_t len;
                int fd;

                gbuild(&g, two, 2, MEM_BYTES, true);
                fd = gmemfd(&g, F_SEAL_WRITE);
                device_group_publish_req(&req, 3, "dg", &g, seg);
                len = rp_frame(&req, 1, buf, sizeof(buf));
                if (rp_send_raw(prod, buf, len / 2, &fd, 1) != 0)
                        _exit(2);
                if (write(sv[1], "x", 1) != 1)
                        _exit(3);
                pause();
                _exit(0);
        }
        close(sv[1]);
        char x;
        ck_assert_int_eq(read(sv[0], &x, 1), 1);
        close(sv[0]);
        fx_sleep_ms(100);
        kill(pid, SIGKILL);
        ck_assert_int_eq(fx_wait(pid), 128 + SIGKILL);
        expect_held(obs, &empty, "a producer killed mid-publish");
        ck_assert_int_eq(dlx_stat(obs, "dg", &(struct dlx_info){0}), -ENOENT);
        dlx_close(obs);
}
END_TEST

/* ---- other uids -------------------------------------------------------------------------------
 */

/*
 * Promise: a name belongs to the uid that published it, and a refused
 * publish leaves nothing held or charged: another uid's device group under
 * root's name is EACCES, and its table is not kept (its uid charged
 * nothing more than its own memory). It may still acquire root's group.
 */
START_TEST(other_uid_cannot_replace_a_device_group)
{
        if (geteuid() != 0) {
                fprintf(stderr, "not root, skipped\n");
                return;
        }
        int prod = rp_connect(fx.socket, "producer");
        dlx_client *obs = fx_connect(&fx, "observer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_reply rep;
        struct gseg g;
        pid_t pid;

        gbuild(&g, two, 2, MEM_BYTES, true);
        ck_assert_int_eq(publish(prod, 3, "dg", &g, seg, &rep), WIRE_OK);
        struct held before = held_now(obs);
        ck_assert_int_eq(chmod(fx.dir, 0711), 0); /* as test-access does: the path to the socket */
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
                        _exit(10);
                int other = rp_connect(fx.socket, "other");
                uint64_t oseg = vmm_segment(other, 2, MEM_BYTES, NULL);
                struct got a;
                int st = publish(other, 3, "dg", &g, oseg, &rep);
                if (st != WIRE_PERMISSION) {
                        fprintf(stderr, "other uid's device group over root's: status %d (%s)\n",
                                st, rep.error);
                        _exit(11);
                }
                if (acquire(other, 4, "dg", &a) != WIRE_OK || !a.segment || a.fd < 0) {
                        fprintf(stderr, "other uid cannot acquire: %s\n", a.acq.error);
                        _exit(12);
                }
                got_close(&a);
                pause();
                _exit(0);
        }
        /* while the child waits, its refused table must not be held */
        struct held now;
        for (int i = 0; i < 300; i++) {
                now = held_now(obs);
                int status;
                if (waitpid(pid, &status, WNOHANG) == pid)
                        ck_abort_msg("the other uid's child ended: status %d",
                                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
                if (now.leases == before.leases + 1)
                        break;
                fx_sleep_ms(10);
        }
        ck_assert_uint_eq(now.leases, before.leases + 1);
        /* one more segment (the other's VMM alloc), no table */
        ck_assert_msg(now.segments == before.segments + 1,
                      "segments %llu -> %llu: the refused table is held",
                      (unsigned long long)before.segments, (unsigned long long)now.segments);
        kill(pid, SIGKILL);
        fx_wait(pid);
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

Suite *device_group_attacks_suite(void)
{
        Suite *s = suite_create("device-group-attacks");
        TCase *tc = tcase_create("raw");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, setup, fx_teardown);
        tcase_set_timeout(tc, 30);
        tcase_add_test(tc, table_is_sealed_never_a_writable_segment);
        tcase_add_test(tc, apart_table_ends_at_data_off);
        tcase_add_test(tc, device_group_has_members);
        tcase_add_test(tc, ipc_device_group_never_persists);
        tcase_add_test(tc, ipc_group_within_its_declared_size);
        tcase_add_test(tc, forgotten_memory_is_sent_again_alone);
        tcase_add_test(tc, pipelined_acquires_send_each_fd_once);
        tcase_add_test(tc, waiting_acquire_gets_table_first);
        tcase_add_test(tc, old_peer_waiting_acquire_gets_enotsup);
        tcase_add_test(tc, plain_acquire_of_device_group_sends_nothing);
        tcase_add_test(tc, many_device_groups_unread_all_arrive);
        tcase_add_test(tc, unread_device_group_fds_return_on_close);
        tcase_add_test(tc, device_cpu_device_replacement_under_a_lease);
        tcase_add_test(tc, many_leased_versions_return_to_baseline);
        tcase_add_test(tc, one_table_memfd_for_two_versions);
        tcase_add_test(tc, producer_killed_mid_publish_leaves_nothing);
        suite_add_tcase(s, tc);

        tc = tcase_create("uids");
        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, setup_shared, fx_teardown);
        tcase_set_timeout(tc, 30);
        tcase_add_test(tc, other_uid_cannot_replace_a_device_group);
        suite_add_tcase(s, tc);
        return s;
}
