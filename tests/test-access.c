/* SPDX-License-Identifier: MIT */
/*
 * Who may connect, and what they may do: a private daemon (the default)
 * refuses every other uid, at the socket's mode and again on its own; a daemon
 * shared with a group (--group) lets its members in, primary or supplementary,
 * and its names stay writable only by their owners.
 *
 * Other users are played by forked children that drop to uid nobody with
 * chosen groups, so the suite needs root; it skips (77) otherwise.
 */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "rawpeer.h"

#define NOBODY 65534
#define NOGROUP 65534
#define USERS 100

static DLManagedTensorVersioned *vec(dlx_client *c, float v)
{
        int64_t shape[1] = {4};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}};
        DLManagedTensorVersioned *t = NULL;

        proto.shape = shape;
        ck_assert_msg(dlx_alloc(c, &proto, &t) == 0, "dlx_alloc: %s", dlx_last_error());
        for (int i = 0; i < 4; i++)
                ((float *)t->dl_tensor.data)[i] = v;
        return t;
}

/* How a child becomes someone else, and what it then does. */
struct persona {
        gid_t gid;
        int ngroups; /* supplementary */
        gid_t groups[4];
        int (*body)(dlx_client *c); /* NULL: only connect, and report how that went */
};

/*
 * Exit status: the body's result, or for a persona without a body 0 when
 * connected, 1 for -EACCES from the daemon's refusal with a reason, 2 for
 * -EACCES from the socket's mode, 3 for any other failure.
 */
static int persona_main(void *p)
{
        const struct persona *who = p;
        struct dlx_connect_options o = {.socket_path = fx.socket};
        dlx_client *c = NULL;
        int err, rc;

        if (setgroups((size_t)who->ngroups, who->groups) != 0 || setgid(who->gid) != 0 ||
            setuid(NOBODY) != 0)
                return 90;
        err = dlx_connect(&o, &c);
        if (!who->body) {
                if (c)
                        dlx_close(c);
                if (err == 0)
                        return 0;
                if (err != -EACCES)
                        return 3;
                return strstr(dlx_last_error(), "may not connect") ||
                                       strstr(dlx_last_error(), "is not in group")
                               ? 1
                               : 2;
        }
        if (err != 0)
                return 91;
        rc = who->body(c);
        dlx_close(c);
        return rc;
}

static int run_as(const struct persona *who)
{
        return fx_wait(fx_spawn(persona_main, (void *)who));
}

/* Lets others traverse to the socket, and (when open) write to it too. */
static void open_path(bool socket_too)
{
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        if (socket_too)
                ck_assert_int_eq(chmod(fx.socket, 0666), 0);
}

/* ---- private ------------------------------------------------------------------------------- */

START_TEST(private_refuses_other_uids)
{
        struct persona nobody = {.gid = NOGROUP};
        struct stat st;

        dlxd_start(&fx, NULL);
        ck_assert_int_eq(stat(fx.socket, &st), 0);
        ck_assert_uint_eq(st.st_mode & 0777, 0600);
        /* the kernel refuses first: the socket is 0600 */
        open_path(false);
        ck_assert_int_eq(run_as(&nobody), 2);
        /* with the socket opened by mistake, the daemon still refuses, saying why */
        open_path(true);
        ck_assert_int_eq(run_as(&nobody), 1);
        dlxd_stop(&fx);
}
END_TEST

/* ---- shared with a group ------------------------------------------------------------------- */

static const char *const shared_args[] = {"--group", "65534", NULL};

START_TEST(group_socket_mode)
{
        struct stat st;

        dlxd_start(&fx, shared_args);
        ck_assert_int_eq(stat(fx.socket, &st), 0);
        ck_assert_uint_eq(st.st_mode & 0777, 0660);
        ck_assert_uint_eq(st.st_gid, NOGROUP);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(group_members_only)
{
        struct persona member = {.gid = NOGROUP};
        struct persona supplementary = {.gid = USERS, .ngroups = 1, .groups = {NOGROUP}};
        struct persona outsider = {.gid = USERS};

        dlxd_start(&fx, shared_args);
        open_path(false);
        ck_assert_int_eq(run_as(&member), 0);
        ck_assert_int_eq(run_as(&supplementary), 0);
        /* not in the group: the socket's mode says no */
        ck_assert_int_eq(run_as(&outsider), 2);
        /* and so does the daemon, if the mode is opened by mistake */
        open_path(true);
        ck_assert_int_eq(run_as(&outsider), 1);
        dlxd_stop(&fx);
}
END_TEST

/* As a member: root's name is readable, not writable; its own name is its own. */
static int member_reads_and_owns(dlx_client *c)
{
        DLManagedTensorVersioned *t;
        struct dlx_publish_options persist = {.persist = true};

        if (dlx_acquire(c, "own/root", NULL, &t) != 0)
                return 10;
        int ok = ((const float *)t->dl_tensor.data)[0] == 1.0f;
        t->deleter(t);
        if (!ok)
                return 11;
        if (dlx_publish(c, "own/root", vec(c, 2), NULL, NULL) != -EACCES)
                return 12;
        if (!strstr(dlx_last_error(), "owned by uid 0"))
                return 13;
        if (dlx_unpublish(c, "own/root") != -EACCES)
                return 14;
        /* persistent, so that root can look at it once this client has gone */
        if (dlx_publish(c, "own/nobody", vec(c, 3), &persist, NULL) != 0)
                return 15;
        return 0;
}

START_TEST(names_belong_to_their_uid)
{
        struct persona member = {.gid = NOGROUP, .body = member_reads_and_owns};
        struct dlx_info info;
        dlx_client *c;

        dlxd_start(&fx, shared_args);
        open_path(false);
        c = fx_connect(&fx, "root");
        ck_assert_int_eq(dlx_publish(c, "own/root", vec(c, 1), NULL, NULL), 0);
        ck_assert_int_eq(run_as(&member), 0);
        ck_assert_int_eq(dlx_stat(c, "own/nobody", &info), 0);
        ck_assert_uint_eq(info.owner_uid, NOBODY);
        /* root may replace and remove anyone's name */
        ck_assert_int_eq(dlx_publish(c, "own/nobody", vec(c, 4), NULL, NULL), 0);
        ck_assert_int_eq(dlx_unpublish(c, "own/nobody"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* ---- read-only means read-only, for every consumer of any uid ------------------------------ */

/* A raw publish of a 4096-byte memfd (read-only unless flags say otherwise). */
static void raw_publish(int sock, uint64_t id, const char *name, int memfd, uint64_t flags)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_PUBLISH};
        struct wire_tensor *t = &req.publish.tensor;

        snprintf(t->name, sizeof(t->name), "%s", name);
        t->dtype = (DLDataType){kDLFloat, 32, 1};
        t->ndim = 1;
        t->shape[0] = 1024;
        t->strides[0] = 1;
        t->device_type = kDLCPU;
        t->storage = WIRE_STORAGE_MEMFD;
        t->length = 4096;
        t->flags = flags;
        rp_send(sock, &req, memfd);
}

/* A memfd of 4096 bytes holding 1.0f, sealed only against resizing, mode 0777 as made. */
static int producer_memfd(void)
{
        int fd = memfd_create("producer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        float v[1024];

        ck_assert_int_ge(fd, 0);
        for (int i = 0; i < 1024; i++)
                v[i] = 1.0f;
        ck_assert_int_eq(pwrite(fd, v, sizeof(v), 0), (ssize_t)sizeof(v));
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
        return fd;
}

/*
 * Whatever a consumer holding fd tries, nothing it does can write: a
 * writable mapping, write(), a read-only mapping made writable, a read-write
 * reopen through /proc (mode bits do not matter to root or the file's owner).
 * 0: all refused; 1: it wrote; 2: it could not even map it read-only.
 */
static int try_to_write(int fd)
{
        char path[64];
        bool wrote;
        float *w;
        int rw;

        w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (w != MAP_FAILED) {
                w[0] = -7.0f;
                return 1;
        }
        if (pwrite(fd, "\0\0\0\0", 4, 0) == 4)
                return 1;
        w = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
        if (w == MAP_FAILED)
                return 2; /* a reader must at least map it read-only */
        if (mprotect(w, 4096, PROT_READ | PROT_WRITE) == 0) {
                w[0] = -7.0f;
                return 1;
        }
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        rw = open(path, O_RDWR | O_CLOEXEC);
        if (rw < 0)
                return 0;
        w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        if (w != MAP_FAILED) {
                w[0] = -7.0f;
                close(rw);
                return 1;
        }
        wrote = pwrite(rw, "\0\0\0\0", 4, 0) == 4;
        close(rw);
        return wrote ? 1 : 0;
}

/* As uid nobody (gid), on a raw connection: acquire name and try to write it. */
struct raw_consumer {
        const char *name;
        gid_t gid;
};

static int raw_consumer_main(void *p)
{
        const struct raw_consumer *rc = p;
        struct wire_request req = {.id = 2, .type = WIRE_REQ_ACQUIRE};
        struct wire_reply rep;
        int sock, fd = -1;

        if (setgroups(0, NULL) != 0 || setgid(rc->gid) != 0 || setuid(NOBODY) != 0)
                return 90;
        sock = rp_connect(fx.socket, "consumer");
        snprintf(req.acquire.name, sizeof(req.acquire.name), "%s", rc->name);
        rp_send(sock, &req, -1);
        if (rp_read(sock, &rep, 10000, &fd) != 1 || rep.status != WIRE_OK || fd < 0)
                return 91;
        if (rep.acquire.writable || !(rep.acquire.tensor.flags & DLPACK_FLAG_BITMASK_READ_ONLY))
                return 92;
        return try_to_write(fd);
}

/*
 * A producer's own memfd, not sealed against writes, published read-only:
 * dlxd seals it, so no consumer, of another uid or of the producer's, can
 * write it; the producer's own mapping made before still writes (its data).
 */
START_TEST(producer_memfd_sealed_for_every_reader)
{
        struct raw_consumer other = {.name = "ro/producer", .gid = NOGROUP};
        int sock, fd, seals;

        dlxd_start(&fx, shared_args);
        open_path(false);
        sock = rp_connect(fx.socket, "producer");
        fd = producer_memfd();
        raw_publish(sock, 3, "ro/producer", fd, DLPACK_FLAG_BITMASK_READ_ONLY);
        rp_expect_ok(sock, 3, WIRE_REP_PUBLISH, NULL, NULL);
        seals = fcntl(fd, F_GET_SEALS);
        ck_assert_msg(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE), "seals %#x", seals);
        /* another uid, and this one (root), both fail */
        ck_assert_int_eq(fx_wait(fx_spawn(raw_consumer_main, &other)), 0);
        ck_assert_int_eq(try_to_write(fd), 0);
        close(fd);
        close(sock);
        dlxd_stop(&fx);
}
END_TEST

/* One dlxd cannot seal (a read-only fd, or F_SEAL_SEAL): refused, saying why; nothing leaks. */
START_TEST(unsealable_memfd_refused_read_only)
{
        struct wire_reply rep;
        char path[64];
        int sock, fd, ro;

        dlxd_start(&fx, shared_args);
        sock = rp_connect(fx.socket, "producer");
        fd = producer_memfd();
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        ro = open(path, O_RDONLY | O_CLOEXEC);
        ck_assert_int_ge(ro, 0);
        raw_publish(sock, 3, "ro/rdonly", ro, DLPACK_FLAG_BITMASK_READ_ONLY);
        rp_expect_error(sock, 3, WIRE_BAD_FD, &rep);
        ck_assert_msg(strstr(rep.error, "cannot be read-only"), "message: %s", rep.error);
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL), 0);
        raw_publish(sock, 4, "ro/sealseal", fd, DLPACK_FLAG_BITMASK_READ_ONLY);
        rp_expect_error(sock, 4, WIRE_BAD_FD, &rep);
        /* writable, either is fine: its readers may write */
        raw_publish(sock, 5, "ro/writable", fd, 0);
        rp_expect_ok(sock, 5, WIRE_REP_PUBLISH, NULL, NULL);

        /* a memfd mapped writable somewhere (here, by anybody) could change under readers */
        int mapped = producer_memfd();
        float *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mapped, 0);
        ck_assert_ptr_ne(w, MAP_FAILED);
        raw_publish(sock, 6, "ro/mapped", mapped, DLPACK_FLAG_BITMASK_READ_ONLY);
        rp_expect_error(sock, 6, WIRE_BUSY, &rep);
        ck_assert_msg(strstr(rep.error, "mapped writable"), "message: %s", rep.error);
        munmap(w, 4096);
        /* unmapped, the same memfd is sealed and taken */
        raw_publish(sock, 7, "ro/mapped", mapped, DLPACK_FLAG_BITMASK_READ_ONLY);
        rp_expect_ok(sock, 7, WIRE_REP_PUBLISH, NULL, NULL);
        ck_assert_int_eq(try_to_write(mapped), 0);
        close(mapped);
        close(ro);
        close(fd);
        close(sock);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Through libdlx: tensors from one allocator, some writable and some
 * read-only, never leave a read-only one writable to anybody: the mixing
 * publish is copied, and the read-only tensor's segment is sealed.
 */
START_TEST(mixed_allocations_stay_read_only)
{
        struct raw_consumer other = {.name = "ro/r", .gid = NOGROUP};
        dlx_client *p;
        DLManagedTensorVersioned *w, *r;
        int64_t shape[1] = {1024};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}};
        struct dlx_publish_options rw = {.writable = true}, never = {.copy = DLX_COPY_NEVER};

        proto.shape = shape;
        dlxd_start(&fx, shared_args);
        open_path(false);
        p = fx_connect(&fx, "producer");
        ck_assert_int_eq(dlx_alloc(p, &proto, &w), 0);
        ck_assert_int_eq(dlx_publish(p, "ro/w", w, &rw, NULL), 0);
        /* zero-copy is impossible now, and said */
        ck_assert_int_eq(dlx_alloc(p, &proto, &r), 0);
        ck_assert_int_eq(dlx_publish(p, "ro/r", r, &never, NULL), -EXDEV);
        expect_last_error("writable version");
        ck_assert_int_eq(dlx_alloc(p, &proto, &r), 0);
        ck_assert_int_eq(dlx_publish(p, "ro/r", r, NULL, NULL), 0);
        ck_assert_int_eq(fx_wait(fx_spawn(raw_consumer_main, &other)), 0);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A daemon-allocated segment (dlx_alloc()'s kind) published read-only, while
 * its producer still maps it writable: no consumer of another uid can write
 * it through the fd it is handed, reopened through /proc included.
 */
START_TEST(alloc_segment_read_only_for_every_reader)
{
        struct raw_consumer other = {.name = "ro/alloc", .gid = NOGROUP};
        struct wire_request req;
        volatile float *mine;
        uint64_t seg;
        int prod, pfd;

        dlxd_start(&fx, shared_args);
        open_path(false);
        prod = rp_connect(fx.socket, "producer");
        seg = rp_alloc(prod, 2, 4096, &pfd);
        mine = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        ck_assert_ptr_ne((void *)mine, MAP_FAILED);
        mine[0] = 1.0f;
        rp_publish_req(&req, 3, "ro/alloc", 4096, seg, DLPACK_FLAG_BITMASK_READ_ONLY);
        rp_send(prod, &req, -1);
        rp_expect_ok(prod, 3, WIRE_REP_PUBLISH, NULL, NULL);
        ck_assert_int_eq(fx_wait(fx_spawn(raw_consumer_main, &other)), 0);
        ck_assert_msg(mine[0] == 1.0f, "the producer's bytes changed under it: %f",
                      (double)mine[0]);
        munmap((void *)mine, 4096);
        close(pfd);
        close(prod);
        dlxd_stop(&fx);
}
END_TEST

/* ---- whose daemon the default path reaches ------------------------------------------------ */

struct squat {
        char dir[64];
        int ready[2];
};

/* As uid nobody: listens on DIR/dlx/dlxd.sock, as a squatter of a default path would. */
static int squatter_main(void *arg)
{
        struct squat *q = arg;
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        int sock;

        if (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(NOBODY) != 0)
                return 90;
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/dlx", q->dir);
        if (mkdir(addr.sun_path, 0777) < 0)
                return 91;
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/dlx/dlxd.sock", q->dir);
        sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (sock < 0 || bind(sock, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
            chmod(addr.sun_path, 0777) < 0 || listen(sock, 8) < 0)
                return 92;
        (void)!write(q->ready[1], "r", 1);
        pause();
        return 0;
}

/*
 * The default socket path means the user's own daemon: a listener of
 * another uid there (a squatter of /tmp/dlx-$UID, say) is refused before
 * anything is sent to it; the same path given explicitly is the caller's
 * choice.
 */
START_TEST(default_path_refuses_another_uids_daemon)
{
        struct squat q;
        dlx_client *c = NULL;
        pid_t squatter;
        char byte;
        int err;

        snprintf(q.dir, sizeof(q.dir), "/tmp/dlx-squat-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(q.dir));
        ck_assert_int_eq(chmod(q.dir, 0777), 0);
        ck_assert_int_eq(pipe(q.ready), 0);
        squatter = fx_spawn(squatter_main, &q);
        ck_assert_int_eq(read(q.ready[0], &byte, 1), 1);
        unsetenv("DLX_SOCKET");
        setenv("XDG_RUNTIME_DIR", q.dir, 1);
        err = dlx_connect(NULL, &c);
        ck_assert_int_eq(err, -EACCES);
        ck_assert_ptr_null(c);
        expect_last_error("not your dlxd");
        kill(squatter, SIGKILL);
        fx_wait(squatter);
        close(q.ready[0]);
        close(q.ready[1]);
        char path[128];
        snprintf(path, sizeof(path), "%s/dlx/dlxd.sock", q.dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/dlx", q.dir);
        rmdir(path);
        rmdir(q.dir);
}
END_TEST

Suite *access_suite(void)
{
        Suite *s;
        TCase *tc;

        if (geteuid() != 0) {
                fprintf(stderr, "access: needs root to play other users; skipped\n");
                exit(77);
        }
        s = suite_create("access");
        tc = tcase_create("access");
        tcase_add_test(tc, private_refuses_other_uids);
        tcase_add_test(tc, group_socket_mode);
        tcase_add_test(tc, group_members_only);
        tcase_add_test(tc, names_belong_to_their_uid);
        tcase_add_test(tc, producer_memfd_sealed_for_every_reader);
        tcase_add_test(tc, unsealable_memfd_refused_read_only);
        tcase_add_test(tc, mixed_allocations_stay_read_only);
        tcase_add_test(tc, alloc_segment_read_only_for_every_reader);
        tcase_add_test(tc, default_path_refuses_another_uids_daemon);
        suite_add_tcase(s, tc);
        return s;
}
