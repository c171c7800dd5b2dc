/* SPDX-License-Identifier: MIT */
#include "devgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "rawpeer.h"

#define F32                                                                                        \
        {                                                                                          \
                kDLFloat, 32, 1                                                                    \
        }

const struct gspec two[2] = {
        {"a", F32, 1, {16}, {1}, 0, 0},
        {"b", F32, 1, {4}, {1}, 0, MEM_BYTES - 16},
};

void devgroup_dlxd_start(const char *const *more)
{
        static char ptmx_arg[32];
        const char *args[8] = {"--cuda-device-number", ptmx_arg};
        struct stat sb;
        int n = 2;

        ck_assert_int_eq(stat("/dev/ptmx", &sb), 0);
        snprintf(ptmx_arg, sizeof(ptmx_arg), "%u:%u", major(sb.st_rdev), minor(sb.st_rdev));
        for (; more && *more && n < 7; more++)
                args[n++] = *more;
        args[n] = NULL;
        dlxd_start(&fx, args);
}

int vmm_export(unsigned *ret_pty)
{
        unsigned pty;
        int m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);

        ck_assert_msg(m >= 0 && ioctl(m, TIOCGPTN, &pty) == 0, "/dev/ptmx: %s", strerror(errno));
        if (ret_pty)
                *ret_pty = pty;
        return m;
}

int call(int sock, const struct wire_request *req, int fd, struct wire_reply *rep, int *ret_fd)
{
        int r;

        rp_send(sock, req, fd);
        r = rp_read_answer(sock, rep, 10000 * fx_slowdown(), ret_fd);
        ck_assert_msg(r == 1, "request %llu: no answer (%d)", (unsigned long long)req->id, r);
        ck_assert_uint_eq(rep->id, req->id);
        return rep->status;
}

uint64_t vmm_segment(int sock, uint64_t id, uint64_t size, unsigned *ret_pty)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_ALLOC};
        struct wire_reply rep;
        int m = vmm_export(ret_pty), fd = -1;

        req.alloc.size = size;
        req.alloc.storage = WIRE_STORAGE_CUDA_VMM;
        ck_assert_int_eq(call(sock, &req, m, &rep, &fd), WIRE_OK);
        ck_assert_int_eq(fd, -1);
        close(m);
        return rep.alloc.segment;
}

int publish_fd(int sock, uint64_t id, const char *name, const struct gseg *g, uint64_t segment,
               int tfd, struct wire_reply *rep)
{
        struct wire_request req;
        int fd = tfd >= 0 ? tfd : gmemfd(g, F_SEAL_WRITE), st;

        device_group_publish_req(&req, id, name, g, segment);
        st = call(sock, &req, fd, rep, NULL);
        if (tfd < 0)
                close(fd);
        return st;
}

int publish(int sock, uint64_t id, const char *name, const struct gseg *g, uint64_t segment,
            struct wire_reply *rep)
{
        return publish_fd(sock, id, name, g, segment, -1, rep);
}

int acquire_read(int sock, uint64_t id, struct got *g, int timeout_ms)
{
        struct wire_reply rep;
        int fd = -1, r;

        memset(g, 0, sizeof(*g));
        g->table_fd = g->fd = -1;
        r = rp_read_answer(sock, &rep, timeout_ms, &fd);
        ck_assert_msg(r == 1, "acquire %llu: no answer (%d)", (unsigned long long)id, r);
        ck_assert_uint_eq(rep.id, id);
        if (rep.status == WIRE_OK && rep.type == WIRE_REP_SEGMENT) {
                g->segment = true;
                g->table = rep.segment.segment;
                g->table_size = rep.segment.size;
                g->table_fd = fd;
                fd = -1;
                ck_assert_int_eq(rp_read_answer(sock, &rep, timeout_ms, &fd), 1);
                ck_assert_uint_eq(rep.id, id);
                ck_assert_msg(rep.type == WIRE_REP_ACQUIRE || rep.status != WIRE_OK,
                              "a SEGMENT reply followed by reply type %d", rep.type);
        }
        g->acq = rep;
        g->fd = fd;
        return rep.status;
}

void acquire_send(int sock, uint64_t id, const char *name, bool group, uint64_t min_version,
                  int64_t timeout_ms)
{
        struct wire_request req;

        rp_acquire_req(&req, id, name);
        req.acquire.group = group;
        req.acquire.min_version = min_version;
        req.acquire.timeout_ms = timeout_ms;
        rp_send(sock, &req, -1);
}

int acquire(int sock, uint64_t id, const char *name, struct got *g)
{
        acquire_send(sock, id, name, true, 0, 0);
        return acquire_read(sock, id, g, 10000 * fx_slowdown());
}

void got_close(struct got *g)
{
        if (g->table_fd >= 0)
                close(g->table_fd);
        if (g->fd >= 0)
                close(g->fd);
        g->table_fd = g->fd = -1;
}

void release(int sock, uint64_t lease)
{
        struct wire_request rel = {.id = 998, .type = WIRE_REQ_RELEASE};
        struct wire_reply rep;

        rel.release.lease = lease;
        rp_send(sock, &rel, -1);
        ck_assert_int_eq(call(sock, &(struct wire_request){.id = 999, .type = WIRE_REQ_PING}, -1,
                              &rep, NULL),
                         WIRE_OK);
}

struct held held_now(dlx_client *c)
{
        struct dlx_stats st;

        ck_assert_int_eq(dlx_stats(c, &st), 0);
        return (struct held){st.segments, st.bytes, st.fds, st.names, st.versions, st.leases};
}

void expect_held(dlx_client *c, const struct held *before, const char *what)
{
        struct held now = held_now(c);

        for (int i = 0; i < 300 && memcmp(&now, before, sizeof(now)) != 0; i++) {
                fx_sleep_ms(10);
                now = held_now(c);
        }
        ck_assert_msg(memcmp(&now, before, sizeof(now)) == 0,
                      "%s: segments %llu -> %llu, bytes %llu -> %llu, fds %llu -> %llu, names "
                      "%llu -> %llu, versions %llu -> %llu, leases %llu -> %llu",
                      what, (unsigned long long)before->segments, (unsigned long long)now.segments,
                      (unsigned long long)before->bytes, (unsigned long long)now.bytes,
                      (unsigned long long)before->fds, (unsigned long long)now.fds,
                      (unsigned long long)before->names, (unsigned long long)now.names,
                      (unsigned long long)before->versions, (unsigned long long)now.versions,
                      (unsigned long long)before->leases, (unsigned long long)now.leases);
}

void publish_two(int prod, const char *name, uint64_t segment, struct gseg *g)
{
        struct wire_reply rep;

        gbuild(g, two, 2, MEM_BYTES, true);
        ck_assert_int_eq(publish(prod, 3, name, g, segment, &rep), WIRE_OK);
        ck_assert_uint_eq(rep.publish.segment, segment);
}
