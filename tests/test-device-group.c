/* SPDX-License-Identifier: MIT */
/*
 * Device groups in dlxd (protocol 1.4), from raw peers: a group whose
 * members are in CUDA memory (a held cuda-vmm segment, or a cuda-ipc
 * handle) and whose table is a memfd of its own (GROUP_FORMAT_APART). dlxd
 * checks the table against the device memory the publish describes, keeps
 * both, and hands a consumer the table's fd in a SEGMENT reply before the
 * ACQUIRE reply that carries the memory's: each only once per session.
 * Peers of 1.3 neither publish nor acquire one. A refused publish leaves
 * nothing held, charged or visible.
 *
 * dlxd runs with --cuda-device-number of /dev/ptmx: its masters stand in
 * for the driver's VMM exports (test-badinput checks that nothing else
 * passes), and a pty number tells one open from another.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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

static void setup(void)
{
        devgroup_dlxd_start(NULL);
}

/*
 * A VMM group: the consumer gets the table's fd (the very table, read-only)
 * in a SEGMENT reply, then the ACQUIRE reply with the memory's fd, naming
 * the table; acquired again, neither fd comes. stat shows the group.
 */
START_TEST(vmm_group_sends_each_descriptor_once)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        unsigned pty = 0, got_pty = ~0u;
        uint64_t seg = vmm_segment(prod, 2, 2 * MEM_BYTES, &pty);
        struct dlx_info info;
        struct gseg g;
        struct got a;
        struct stat sb;

        publish_two(prod, "dg", seg, &g);

        ck_assert_int_eq(acquire(cons, 2, "dg", &a), WIRE_OK);
        ck_assert_msg(a.segment && a.table_fd >= 0, "no SEGMENT reply with the table's fd");
        ck_assert_uint_eq(a.table_size, g.size);
        ck_assert_uint_eq(a.acq.acquire.tensor.table_segment, a.table);
        ck_assert_uint_ne(a.table, seg);
        ck_assert_int_eq(fstat(a.table_fd, &sb), 0);
        ck_assert_int_eq(sb.st_size, (off_t)g.size);
        uint8_t *t = mmap(NULL, g.size, PROT_READ, MAP_SHARED, a.table_fd, 0);
        ck_assert_ptr_ne(t, MAP_FAILED);
        ck_assert_msg(memcmp(t, g.p, g.size) == 0, "the table changed on its way");
        munmap(t, g.size);
        ck_assert_ptr_eq(mmap(NULL, g.size, PROT_READ | PROT_WRITE, MAP_SHARED, a.table_fd, 0),
                         MAP_FAILED);
        ck_assert_int_ge(a.fd, 0);
        ck_assert_msg(ioctl(a.fd, TIOCGPTN, &got_pty) == 0 && got_pty == pty,
                      "the memory's fd is not the export published");
        const struct wire_tensor *w = &a.acq.acquire.tensor;
        ck_assert_uint_eq(w->members, 2);
        ck_assert_uint_eq(w->storage, WIRE_STORAGE_CUDA_VMM);
        ck_assert_uint_eq(w->segment, seg);
        ck_assert_uint_eq(w->length, MEM_BYTES);
        ck_assert_uint_eq(w->offset, 0);
        ck_assert(w->has_event && w->has_device_uuid);
        ck_assert_uint_eq(a.acq.acquire.segment_size, 2 * MEM_BYTES);
        ck_assert(!a.acq.acquire.writable);
        got_close(&a);

        /* the session holds both now */
        uint64_t table = a.table;
        ck_assert_int_eq(acquire(cons, 3, "dg", &a), WIRE_OK);
        ck_assert_msg(!a.segment && a.fd == -1, "a second acquire came with descriptors");
        ck_assert_uint_eq(a.acq.acquire.tensor.table_segment, table);

        DLXV(dlx_stat(obs, "dg", &info));
        ck_assert_uint_eq(info.members, 2);
        ck_assert_uint_eq(info.leases, 2);
        ck_assert_uint_eq(info.nbytes, MEM_BYTES);
        ck_assert_str_eq(info.storage, "cuda-vmm");
        close(cons);
        ck_assert_int_eq(fx_wait_leases(obs, 0, 5000), 0);
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

/* Forgotten, the table's fd comes again (and only it: the memory's is still held). */
START_TEST(forgotten_table_is_sent_again)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_request fr = {.id = 4, .type = WIRE_REQ_FORGET};
        struct wire_reply rep;
        struct gseg g;
        struct got a;

        publish_two(prod, "dg", seg, &g);
        ck_assert_int_eq(acquire(cons, 2, "dg", &a), WIRE_OK);
        ck_assert(a.segment && a.fd >= 0);
        fr.forget.segments[0] = a.table;
        fr.forget.count = 1;
        got_close(&a);
        ck_assert_int_eq(call(cons, &fr, -1, &rep, NULL), WIRE_OK);
        ck_assert_int_eq(acquire(cons, 5, "dg", &a), WIRE_OK);
        ck_assert_msg(a.segment && a.table_fd >= 0, "the forgotten table did not come again");
        ck_assert_msg(a.fd == -1, "the memory's fd came again, unforgotten");
        got_close(&a);
        close(cons);
        close(prod);
        free(g.p);
}
END_TEST

/* A cuda-ipc group: the handle in the reply, the table's fd its only descriptor. */
START_TEST(ipc_group_sends_the_table_alone)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        struct wire_reply rep;
        struct gseg g;
        struct got a;

        gbuild(&g, two, 2, MEM_BYTES, true);
        ck_assert_int_eq(publish(prod, 2, "ipc", &g, 0, &rep), WIRE_OK);
        ck_assert_int_eq(acquire(cons, 2, "ipc", &a), WIRE_OK);
        ck_assert(a.segment && a.table_fd >= 0);
        ck_assert_int_eq(a.fd, -1);
        ck_assert(a.acq.acquire.tensor.has_ipc_handle);
        ck_assert_uint_eq(a.acq.acquire.tensor.storage, WIRE_STORAGE_CUDA_IPC);
        ck_assert_uint_eq(a.acq.acquire.tensor.table_segment, a.table);
        ck_assert_uint_eq(a.acq.acquire.tensor.members, 2);
        got_close(&a);
        close(cons);
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

/*
 * Peers of protocol 1.3 know no SEGMENT reply: one cannot acquire a device
 * group (ENOTSUP, no lease, no fd), nor publish one.
 */
START_TEST(old_peers_neither_publish_nor_acquire)
{
        int prod = rp_connect(fx.socket, "producer"), old = rp_connect_minor(fx.socket, "old", 3);
        dlx_client *obs = fx_connect(&fx, "observer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL), oseg;
        struct held before;
        struct wire_reply rep;
        struct dlx_info info;
        struct gseg g;
        struct got a;

        publish_two(prod, "dg", seg, &g);
        ck_assert_int_eq(acquire(old, 2, "dg", &a), WIRE_NOT_SUPPORTED);
        ck_assert_msg(!a.segment && a.fd == -1, "a refused acquire came with descriptors");
        ck_assert_msg(strstr(a.acq.error, "1.4"), "%s", a.acq.error);
        DLXV(dlx_stat(obs, "dg", &info));
        ck_assert_uint_eq(info.leases, 0);

        oseg = vmm_segment(old, 3, MEM_BYTES, NULL);
        before = held_now(obs);
        ck_assert_int_eq(publish(old, 4, "old", &g, oseg, &rep), WIRE_NOT_SUPPORTED);
        expect_held(obs, &before, "a 1.3 peer's device group");
        close(old);
        close(prod);
        dlx_close(obs);
        free(g.p);
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------------ */

enum bad {
        BAD_FORMAT,     /* a table of the members-after-it format */
        BAD_BEYOND,     /* a member past the bytes the tensor describes */
        BAD_LENGTH,     /* the tensor says more bytes than the memory has */
        BAD_OFFSET,     /* the tensor's bytes not from 0 */
        BAD_NO_TABLE,   /* no fd attached */
        BAD_PIPE,       /* the fd attached is not a memfd */
        BAD_UNSEALED,   /* a memfd the sender still maps writable */
        BAD_HOLD,       /* asks dlxd to hold the fd */
        BAD_NOT_HELD,   /* names a segment its session does not hold */
        BAD_WRITABLE,   /* not read-only */
        BAD_COUNT,      /* members != the table's count */
        BAD_CPU_DEVICE, /* device type kDLCPU for cuda-vmm memory */
        BAD_N,
};

static const struct {
        const char *what;
        enum wire_status status;
} bads[BAD_N] = {
        [BAD_FORMAT] = {"a table with its members' bytes after it", WIRE_INVALID},
        [BAD_BEYOND] = {"a member past the memory described", WIRE_INVALID},
        [BAD_LENGTH] = {"more bytes than the memory has", WIRE_INVALID},
        [BAD_OFFSET] = {"bytes from offset 64", WIRE_INVALID},
        [BAD_NO_TABLE] = {"no table attached", WIRE_BAD_FD},
        [BAD_PIPE] = {"a pipe for a table", WIRE_BAD_FD},
        [BAD_UNSEALED] = {"a table its sender maps writable", WIRE_BUSY},
        [BAD_HOLD] = {"a held table", WIRE_INVALID},
        [BAD_NOT_HELD] = {"memory of a segment not held", WIRE_BAD_FD},
        [BAD_WRITABLE] = {"a writable group", WIRE_NOT_SUPPORTED},
        [BAD_COUNT] = {"a member count unlike the table's", WIRE_INVALID},
        [BAD_CPU_DEVICE] = {"cuda-vmm memory on kDLCPU", WIRE_INVALID},
};

/*
 * Each bad device group is refused with its status and a message, leaving
 * no segment, byte, fd, name or version behind; the same group, well made,
 * then publishes.
 */
START_TEST(bad_device_groups_leave_nothing)
{
        int row = _i;
        int prod = rp_connect(fx.socket, "producer");
        dlx_client *obs = fx_connect(&fx, "observer");
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        int fd = -1, pipefd[2] = {-1, -1};
        struct wire_request req;
        struct wire_reply rep;
        struct held before;
        void *map = NULL;
        struct gseg g;

        gbuild(&g, two, 2, MEM_BYTES, row != BAD_FORMAT);
        if (row == BAD_BEYOND)
                gmember(&g, 1)->offset = MEM_BYTES - 12;
        if (row == BAD_UNSEALED) {
                fd = gmemfd(&g, 0);
                map = mmap(NULL, g.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                ck_assert_ptr_ne(map, MAP_FAILED);
        } else if (row == BAD_PIPE) {
                ck_assert_int_eq(pipe(pipefd), 0);
                fd = pipefd[0];
        } else if (row != BAD_NO_TABLE) {
                fd = gmemfd(&g, F_SEAL_WRITE);
        }
        device_group_publish_req(&req, 3, "bad", &g, seg);
        switch (row) {
        case BAD_FORMAT:
                req.publish.tensor.offset = 0;
                break;
        case BAD_LENGTH:
                req.publish.tensor.length = MEM_BYTES + 1;
                req.publish.tensor.shape[0] = MEM_BYTES + 1;
                break;
        case BAD_OFFSET:
                req.publish.tensor.offset = 64;
                req.publish.tensor.length = MEM_BYTES - 64;
                req.publish.tensor.shape[0] = MEM_BYTES - 64;
                break;
        case BAD_HOLD:
                req.publish.hold = true;
                break;
        case BAD_NOT_HELD:
                req.publish.tensor.segment = seg + 1000;
                break;
        case BAD_WRITABLE:
                req.publish.tensor.flags = 0;
                break;
        case BAD_COUNT:
                req.publish.tensor.members = 3;
                break;
        case BAD_CPU_DEVICE:
                req.publish.tensor.device_type = kDLCPU;
                break;
        default:
                break;
        }
        before = held_now(obs);
        ck_assert_msg(call(prod, &req, fd, &rep, NULL) == (int)bads[row].status,
                      "%s: status %d, not %d (%s)", bads[row].what, rep.status,
                      (int)bads[row].status, rep.error);
        ck_assert_msg(rep.error[0], "%s: refused without a reason", bads[row].what);
        expect_held(obs, &before, bads[row].what);
        ck_assert_int_eq(dlx_stat(obs, "bad", &(struct dlx_info){0}), -ENOENT);

        /* well made, it publishes */
        struct gseg ok;
        gbuild(&ok, two, 2, MEM_BYTES, true);
        ck_assert_int_eq(publish(prod, 4, "bad", &ok, seg, &rep), WIRE_OK);
        if (map)
                munmap(map, g.size);
        if (fd >= 0)
                close(fd);
        if (pipefd[1] >= 0)
                close(pipefd[1]);
        close(prod);
        dlx_close(obs);
        free(g.p);
        free(ok.p);
}
END_TEST

/*
 * A table over 4 MiB is checked off the loop, as a memfd group's: the
 * requests pipelined behind its publish are answered after it, in order;
 * a bad one there is refused as inline, leaving nothing.
 */
START_TEST(big_device_tables_checked_in_order)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        const uint32_t n = 70000;
        struct gspec *specs = calloc(n, sizeof(*specs));
        char(*names)[16] = calloc(n, 16);
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_request req, ping = {.id = 4, .type = WIRE_REQ_PING};
        struct wire_reply rep;
        struct held before;
        struct gseg g;
        struct got a;
        int fd;

        ck_assert(specs && names);
        for (uint32_t i = 0; i < n; i++) {
                snprintf(names[i], 16, "w%07u", i); /* sorted as built */
                specs[i] = (struct gspec){names[i], F32, 1, {4}, {1}, 0, (uint64_t)(i % 4096) * 16};
        }
        gbuild(&g, specs, n, 4096 * 16, true);
        ck_assert_uint_gt(ghead(&g)->data_off, 4u << 20);

        for (int bad = 1; bad >= 0; bad--) {
                gmember(&g, n - 1)->offset = bad ? 4096 * 16 : (4095 * 16);
                fd = gmemfd(&g, F_SEAL_WRITE);
                device_group_publish_req(&req, 3, "big", &g, seg);
                before = held_now(obs);
                rp_send(prod, &req, fd);
                ping.ping.nonce = 77;
                rp_send(prod, &ping, -1);
                close(fd);
                ck_assert_int_eq(rp_read_answer(prod, &rep, 60000 * fx_slowdown(), NULL), 1);
                ck_assert_uint_eq(rep.id, 3);
                ck_assert_msg(rep.status == (bad ? WIRE_INVALID : WIRE_OK), "%s: %s",
                              bad ? "the bad table" : "the good table", rep.error);
                rp_expect_ok(prod, 4, WIRE_REP_PONG, &rep, NULL);
                if (bad)
                        expect_held(obs, &before, "a bad big table");
        }
        ck_assert_int_eq(acquire(cons, 2, "big", &a), WIRE_OK);
        ck_assert(a.segment && a.table_fd >= 0 && a.fd >= 0);
        ck_assert_uint_eq(a.acq.acquire.tensor.members, n);
        got_close(&a);
        close(cons);
        close(prod);
        dlx_close(obs);
        free(g.p);
        free(specs);
        free(names);
}
END_TEST

/*
 * A producer that goes while a consumer holds its group: the version lives
 * on, both fds with it, until the lease goes; then dlxd holds nothing of it.
 */
START_TEST(leased_group_outlives_its_producer)
{
        int prod = rp_connect(fx.socket, "producer"), cons = rp_connect(fx.socket, "consumer");
        dlx_client *obs = fx_connect(&fx, "observer");
        struct held empty = held_now(obs);
        uint64_t seg = vmm_segment(prod, 2, MEM_BYTES, NULL);
        struct wire_request rel = {.id = 3, .type = WIRE_REQ_RELEASE};
        struct wire_reply rep;
        struct dlx_stats st;
        struct gseg g;
        struct got a;

        publish_two(prod, "dg", seg, &g);
        ck_assert_int_eq(acquire(cons, 2, "dg", &a), WIRE_OK);
        got_close(&a);
        close(prod);
        /* the name goes with its producer; the leased version stays, table and memory */
        for (int i = 0; i < 500 && dlx_stat(obs, "dg", &(struct dlx_info){0}) == 0; i++)
                fx_sleep_ms(10);
        ck_assert_int_eq(dlx_stat(obs, "dg", &(struct dlx_info){0}), -ENOENT);
        DLXV(dlx_stats(obs, &st));
        ck_assert_uint_eq(st.versions, empty.versions + 1);
        ck_assert_uint_eq(st.segments, empty.segments + 2);
        rel.release.lease = a.acq.acquire.lease;
        rp_send(cons, &rel, -1);
        /* its SEGMENT_GONE events skipped */
        ck_assert_int_eq(
                call(cons, &(struct wire_request){.id = 4, .type = WIRE_REQ_PING}, -1, &rep, NULL),
                WIRE_OK);
        expect_held(obs, &empty, "a released group of a producer gone");
        close(cons);
        dlx_close(obs);
        free(g.p);
}
END_TEST

Suite *device_group_suite(void)
{
        Suite *s = suite_create("device-group");
        TCase *tc = tcase_create("raw");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, setup, fx_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, vmm_group_sends_each_descriptor_once);
        tcase_add_test(tc, forgotten_table_is_sent_again);
        tcase_add_test(tc, ipc_group_sends_the_table_alone);
        tcase_add_test(tc, old_peers_neither_publish_nor_acquire);
        tcase_add_loop_test(tc, bad_device_groups_leave_nothing, 0, BAD_N);
        tcase_add_test(tc, big_device_tables_checked_in_order);
        tcase_add_test(tc, leased_group_outlives_its_producer);
        suite_add_tcase(s, tc);
        return s;
}
