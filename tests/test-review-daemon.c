/* SPDX-License-Identifier: MIT */
/*
 * A second reader's findings against dlxd, each one a test that states what the
 * daemon should do. Integration cases speak the framing by hand over raw
 * sockets (every read has a deadline, so a lost reply fails instead of hanging),
 * against a real dlxd from tests/fixture.h. The cases in "limits" start their
 * own daemon with a small RLIMIT_NOFILE, as test-badinput.c's out-of-fds case does.
 *
 * Build (tests/meson.build does not list this file): link tests/check-main.c
 * with -DDLX_SUITE=review_daemon_suite against libdlx-test-fixture.a,
 * libdlxproto.a and libdlx; run with DLXD set to the dlxd under test.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "rawpeer.h"
#include "frame.h"
#include "wire.h"

#define REPLY_TIMEOUT_MS 5000
#define HELLO_ID 1

/* ---- time ------------------------------------------------------------------------------ */

/* ---- daemons left behind by a failed test -------------------------------------------------- */

/*
 * A failing check ends the forked test process without its teardown, and the
 * dlxd it started would live on. Each test records its daemon in a page shared
 * with the runner, whose unchecked teardown kills whatever is still running.
 */
#define MAX_DAEMONS 16

struct started {
        pid_t pid;
        char socket[108];
        char dir[64];
};

static struct {
        unsigned n;
        struct started d[MAX_DAEMONS];
} * reaper;

static void reaper_init(void)
{
        if (reaper)
                return;
        reaper = mmap(NULL, sizeof(*reaper), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                      0);
        ck_assert_ptr_ne(reaper, MAP_FAILED);
        memset(reaper, 0, sizeof(*reaper));
}

static void reaper_add(const struct dlxd_fixture *f)
{
        unsigned i = __atomic_fetch_add(&reaper->n, 1, __ATOMIC_SEQ_CST);

        if (i >= MAX_DAEMONS)
                return;
        reaper->d[i].pid = f->pid;
        snprintf(reaper->d[i].socket, sizeof(reaper->d[i].socket), "%s", f->socket);
        snprintf(reaper->d[i].dir, sizeof(reaper->d[i].dir), "%s", f->dir);
}

/* Kills a recorded dlxd that is still running (checked by its command line). */
static void reaper_run(void)
{
        for (unsigned i = 0; reaper && i < reaper->n && i < MAX_DAEMONS; i++) {
                struct started *d = &reaper->d[i];
                char path[64], cmd[512];
                ssize_t n;
                int fd;

                snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)d->pid);
                fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd >= 0) {
                        n = read(fd, cmd, sizeof(cmd) - 1);
                        close(fd);
                        if (n > 0) {
                                cmd[n] = '\0';
                                for (ssize_t k = 0; k < n; k++)
                                        if (!cmd[k])
                                                cmd[k] = ' ';
                                if (strstr(cmd, "dlxd") && strstr(cmd, d->socket))
                                        kill(d->pid, SIGKILL);
                        }
                }
                unlink(d->socket);
                rmdir(d->dir);
        }
        if (reaper)
                reaper->n = 0;
}

static void start_daemon(const char *const *extra)
{
        dlxd_start(&fx, extra);
        reaper_add(&fx);
}

/* Starts dlxd with its soft RLIMIT_NOFILE at most limit; returns the limit it runs with. */
static long start_daemon_fd_limit(rlim_t limit);

static void rd_setup(void)
{
        start_daemon(NULL);
}

/* ---- raw framing --------------------------------------------------------------------------- */

/* Sends all of buf, with fd (borrowed, -1: none) on the first byte. Returns 0 or -errno. */
static int send_all(int sock, const void *buf, size_t len, int fd)
{
        return rp_send_raw(sock, buf, len, &fd, fd >= 0 ? 1 : 0);
}

/*
 * Sends all of buf without an fd, giving up when the socket takes nothing for
 * stall_ms (the daemon stopped reading). Returns 0, -ETIMEDOUT or -errno.
 */
static int send_until_stalled(int sock, const uint8_t *buf, size_t len, int stall_ms)
{
        size_t off = 0;

        while (off < len) {
                ssize_t n = send(sock, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN) {
                                struct pollfd p = {.fd = sock, .events = POLLOUT};
                                if (poll(&p, 1, stall_ms) == 0)
                                        return -ETIMEDOUT;
                                continue;
                        }
                        return -errno;
                }
                off += (size_t)n;
        }
        return 0;
}

/* Appends one request frame to buf (grown as needed). */
static void frame_append(uint8_t **buf, size_t *len, size_t *cap, const struct wire_request *req)
{
        size_t size;

        ck_assert_int_eq(wire_request_size(req, &size), 0);
        while (*len + FRAME_HEADER_SIZE + size > *cap) {
                *cap = *cap ? *cap * 2 : 4096;
                *buf = realloc(*buf, *cap);
                ck_assert_ptr_nonnull(*buf);
        }
        frame_header_put(*buf + *len, (uint32_t)size, 0);
        ck_assert_uint_eq(wire_request_pack(req, *buf + *len + FRAME_HEADER_SIZE), size);
        *len += FRAME_HEADER_SIZE + size;
}

static void send_request(int sock, const struct wire_request *req, int fd)
{
        uint8_t buf[FRAME_HEADER_SIZE + 4096];
        size_t size;
        int r;

        ck_assert_int_eq(wire_request_size(req, &size), 0);
        ck_assert_uint_le(size, sizeof(buf) - FRAME_HEADER_SIZE);
        frame_header_put(buf, (uint32_t)size, fd >= 0 ? 1 : 0);
        ck_assert_uint_eq(wire_request_pack(req, buf + FRAME_HEADER_SIZE), size);
        r = send_all(sock, buf, FRAME_HEADER_SIZE + size, fd);
        ck_assert_msg(r == 0, "send: %s", strerror(-r));
}

/* The next reply that is not an event. */
static int read_answer(int sock, struct wire_reply *rep, int timeout_ms, int *ret_fd)
{
        for (;;) {
                int r = rp_read(sock, rep, timeout_ms, ret_fd);
                if (r != 1 || rep->type != WIRE_REP_EVENT)
                        return r;
                if (ret_fd && *ret_fd >= 0)
                        close(*ret_fd);
        }
}

static void expect_ok(int sock, uint64_t id, enum wire_reply_type type, struct wire_reply *ret,
                      int *ret_fd)
{
        struct wire_reply rep;
        int r = read_answer(sock, &rep, REPLY_TIMEOUT_MS, ret_fd);

        ck_assert_msg(r == 1, "request %llu: no reply within %d ms (%s)", (unsigned long long)id,
                      REPLY_TIMEOUT_MS, r == 0 ? "EOF" : strerror(-r));
        ck_assert_msg(rep.id == id && rep.status == WIRE_OK && rep.type == type,
                      "request %llu: expected OK of type %d, got id %llu status %d type %d: %s",
                      (unsigned long long)id, (int)type, (unsigned long long)rep.id, rep.status,
                      (int)rep.type, rep.error);
        if (ret)
                *ret = rep;
}

static void hello(int sock, const char *name)
{
        struct wire_request req = {.id = HELLO_ID, .type = WIRE_REQ_HELLO};

        req.hello.major = DLX_PROTO_MAJOR;
        req.hello.minor = DLX_PROTO_MINOR;
        snprintf(req.hello.client_name, sizeof(req.hello.client_name), "%s", name);
        send_request(sock, &req, -1);
        expect_ok(sock, HELLO_ID, WIRE_REP_HELLO, NULL, NULL);
}

static int raw_client(const char *name)
{
        int sock = fx_raw_connect(&fx);
        hello(sock, name);
        return sock;
}

static void ping(int sock, uint64_t id)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_PING};
        send_request(sock, &req, -1);
        expect_ok(sock, id, WIRE_REP_PONG, NULL, NULL);
}

/* Allocates a daemon segment; returns its id and its fd in *ret_fd. */
static uint64_t raw_alloc(int sock, uint64_t id, uint64_t size, int *ret_fd)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_ALLOC};
        struct wire_reply rep;
        int fd;

        req.alloc.size = size;
        send_request(sock, &req, -1);
        expect_ok(sock, id, WIRE_REP_ALLOC, &rep, &fd);
        ck_assert_msg(fd >= 0, "alloc reply without an fd");
        if (ret_fd)
                *ret_fd = fd;
        else
                close(fd);
        return rep.alloc.segment;
}

/* A 1-D float32 tensor over [0, bytes) of a segment. */
static void tensor_f32(struct wire_tensor *t, const char *name, uint64_t bytes)
{
        memset(t, 0, sizeof(*t));
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->dtype = (DLDataType){kDLFloat, 32, 1};
        t->ndim = 1;
        t->shape[0] = (int64_t)(bytes / 4);
        t->strides[0] = 1;
        t->device_type = kDLCPU;
        t->storage = WIRE_STORAGE_MEMFD;
        t->length = bytes;
}

static void fill_publish(struct wire_request *req, uint64_t id, const char *name, uint64_t bytes,
                         uint64_t segment, uint64_t flags, bool persist)
{
        memset(req, 0, sizeof(*req));
        req->id = id;
        req->type = WIRE_REQ_PUBLISH;
        tensor_f32(&req->publish.tensor, name, bytes);
        req->publish.tensor.segment = segment;
        req->publish.tensor.flags = flags;
        req->publish.persist = persist;
}

/* The daemon's soft RLIMIT_NOFILE, from /proc/<pid>/limits. */
static long daemon_fd_limit(void)
{
        char path[64], line[256];
        long soft = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/limits", (int)fx.pid);
        f = fopen(path, "re");
        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, "Max open files", 14) == 0)
                        sscanf(line + 14, "%ld", &soft);
        fclose(f);
        ck_assert_int_gt(soft, 0);
        return soft;
}

static long start_daemon_fd_limit(rlim_t limit)
{
        struct rlimit saved, low;
        long got;

        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
        start_daemon(NULL);
        /* dlxd raises its soft limit to the hard one at start: cap both, from outside */
        low.rlim_cur = low.rlim_max = saved.rlim_cur < limit ? saved.rlim_cur : limit;
        ck_assert_int_eq(prlimit(fx.pid, RLIMIT_NOFILE, &low, NULL), 0);
        got = daemon_fd_limit();
        return got > 70000 ? 70000 : got;
}

/* ---- read-only means read-only ------------------------------------------------------------ */

/*
 * The consumer, in its own process and (when the test runs as root) without
 * root's privileges once connected: acquires review/ro, then tries to write
 * through a reopened fd. Exit 0: refused; 1: it wrote; 2+: setup failures.
 */
static int ro_consumer(void *p)
{
        struct wire_request req = {.id = 2, .type = WIRE_REQ_ACQUIRE};
        struct wire_reply rep;
        char path[64];
        int sock, cfd = -1, rw;

        (void)p;
        sock = fx_raw_connect(&fx);
        hello(sock, "consumer");
        if (geteuid() == 0 && (setresgid(65534, 65534, 65534) < 0 || setgroups(0, NULL) < 0 ||
                               setresuid(65534, 65534, 65534) < 0))
                return 2;
        snprintf(req.acquire.name, sizeof(req.acquire.name), "review/ro");
        send_request(sock, &req, -1);
        if (read_answer(sock, &rep, REPLY_TIMEOUT_MS, &cfd) != 1 || rep.status != WIRE_OK ||
            cfd < 0)
                return 3;
        if (rep.acquire.writable || !(rep.acquire.tensor.flags & DLPACK_FLAG_BITMASK_READ_ONLY))
                return 4;
        /* the fd itself: a writable mapping, a write, a read-only mapping made writable */
        float *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0);
        if (w != MAP_FAILED) {
                w[0] = -7.0f;
                return 1;
        }
        if (pwrite(cfd, "\0\0\0\0", 4, 0) == 4)
                return 1;
        w = mmap(NULL, 4096, PROT_READ, MAP_SHARED, cfd, 0);
        if (w == MAP_FAILED)
                return 5;
        if (mprotect(w, 4096, PROT_READ | PROT_WRITE) == 0) {
                w[0] = -7.0f;
                return 1;
        }
        munmap(w, 4096);
        /* and a read-write reopen through /proc, whatever the fd's mode or file's mode */
        snprintf(path, sizeof(path), "/proc/self/fd/%d", cfd);
        rw = open(path, O_RDWR | O_CLOEXEC);
        if (rw < 0)
                return 0;
        w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        if (w != MAP_FAILED) {
                w[0] = -7.0f;
                return 1;
        }
        return pwrite(rw, "\0\0\0\0", 4, 0) == 4 ? 1 : 0;
}

/*
 * store.c segment_fd() / registry.c grant(): a consumer of a READ_ONLY version of
 * a segment that is not write-sealed (every dlx_alloc() segment published
 * read-only, the default) gets a fresh O_RDONLY open of the memfd, "so it cannot
 * map the segment writable, whatever it tries". But a memfd's inode has mode
 * 0777: any consumer, of any uid, reopens /proc/self/fd/N with O_RDWR (the very
 * trick the daemon uses to make the read-only fd), maps it writable and changes
 * the producer's bytes under every other reader.
 */
START_TEST(rd_read_only_fd_reopens_writable)
{
        int prod = raw_client("producer"), pfd, rc;
        struct wire_request req;
        uint64_t seg = raw_alloc(prod, 2, 4096, &pfd);
        volatile float *mine;

        mine = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        ck_assert_ptr_ne((void *)mine, MAP_FAILED);
        mine[0] = 1.0f;
        fill_publish(&req, 3, "review/ro", 4096, seg, DLPACK_FLAG_BITMASK_READ_ONLY, false);
        send_request(prod, &req, -1);
        expect_ok(prod, 3, WIRE_REP_PUBLISH, NULL, NULL);

        rc = fx_wait(fx_spawn(ro_consumer, NULL));
        ck_assert_msg(rc <= 1, "consumer setup failed (%d)", rc);
        ck_assert_msg(rc == 0 && mine[0] == 1.0f,
                      "a consumer (uid %d) handed a read-only fd for a read-only tensor reopened "
                      "it O_RDWR and overwrote the producer's bytes (now %f)",
                      geteuid() == 0 ? 65534 : (int)geteuid(), (double)mine[0]);
        munmap((void *)mine, 4096);
        close(pfd);
        close(prod);
}
END_TEST

/* ---- one client and the daemon's descriptor table ------------------------------------------ */

/* Asks the daemon for an allocation and tells how it went; closes any fd. */
static int try_alloc(int sock, uint64_t id, int timeout_ms, struct wire_reply *rep)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_ALLOC};
        int fd = -1, r;

        req.alloc.size = 4096;
        send_request(sock, &req, -1);
        r = read_answer(sock, rep, timeout_ms, &fd);
        if (fd >= 0)
                close(fd);
        return r;
}

static const char *outcome(int r)
{
        return r == 1 ? "an error" : r == 0 ? "EOF" : strerror(-r);
}

/*
 * Allocates 4 KiB segments on sock until the daemon refuses (or stops
 * answering); returns how many it got.
 */
static long hog_allocations(int sock, long max)
{
        struct wire_reply rep;
        long held = 0;

        for (uint64_t id = 1000; held < max; id++) {
                int r = try_alloc(sock, id, 2000, &rep);
                if (r != 1 || rep.status != WIRE_OK)
                        break;
                held++;
        }
        return held;
}

/*
 * registry.c registry_alloc() / registry_publish(), store.c: nothing bounds how
 * many segments, each one a descriptor in dlxd, a single client holds; only
 * bytes are limited, and by default not at all. One peer allocating 4 KiB
 * segments fills dlxd's descriptor table, after which every other client's
 * alloc fails, a publish with a memfd gets its publisher disconnected
 * (MSG_CTRUNC: "too many fds") and new clients are no longer accepted. The hog
 * should meet a per-client limit (LIMIT) while others still have room.
 */
START_TEST(rd_one_client_fills_fd_table)
{
        long limit = start_daemon_fd_limit(1024), held;
        int hog, good, r;
        struct wire_reply rep;

        good = raw_client("good");
        hog = raw_client("hog");
        held = hog_allocations(hog, limit + 64);
        r = try_alloc(good, 2, REPLY_TIMEOUT_MS, &rep);
        ck_assert_msg(r == 1 && rep.status == WIRE_OK,
                      "after one client took %ld segments (dlxd allows itself %ld fds), another "
                      "client's alloc gets %s (status %d: '%s')",
                      held, limit, outcome(r), rep.status, rep.error);
        close(hog);
        close(good);
        dlxd_stop(&fx);
}
END_TEST

/*
 * conn.c conn_send(): every queued reply that carries an fd holds a dup of it
 * until it is written, and the output queue is bounded in bytes only (16 MiB,
 * about 100k small replies). A peer that repeats acquire + forget on one tensor
 * and reads nothing makes dlxd dup the segment's fd once per reply: its
 * descriptor table fills up, and other clients can no longer be served.
 */
START_TEST(rd_unread_fd_replies_fill_fd_table)
{
        long limit = start_daemon_fd_limit(1024), pairs = limit + 1000, fds;
        struct wire_request req;
        struct wire_reply rep;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        int prod, hog, good, r, sr;
        uint64_t seg;

        prod = raw_client("producer");
        good = raw_client("good");
        seg = raw_alloc(prod, 2, 4096, NULL);
        fill_publish(&req, 3, "review/hot", 4096, seg, 0, false);
        send_request(prod, &req, -1);
        expect_ok(prod, 3, WIRE_REP_PUBLISH, NULL, NULL);

        hog = raw_client("hog");
        for (long i = 0; i < pairs; i++) {
                req = (struct wire_request){.id = 100 + 2 * (uint64_t)i, .type = WIRE_REQ_ACQUIRE};
                snprintf(req.acquire.name, sizeof(req.acquire.name), "review/hot");
                frame_append(&buf, &len, &cap, &req);
                req = (struct wire_request){.id = 101 + 2 * (uint64_t)i, .type = WIRE_REQ_FORGET};
                req.forget.segments[0] = seg;
                req.forget.count = 1;
                frame_append(&buf, &len, &cap, &req);
        }
        sr = send_until_stalled(hog, buf, len, 2000);
        free(buf);
        /* the good client's pings go through after the daemon has read the flood */
        ping(good, 3);
        ping(good, 4);
        fds = count_fds(fx.pid);

        r = try_alloc(good, 5, REPLY_TIMEOUT_MS, &rep);
        ck_assert_msg(r == 1 && rep.status == WIRE_OK,
                      "a peer that reads none of its %ld acquire replies (send: %s) left dlxd "
                      "with %ld of %ld fds open; another client's alloc then gets %s "
                      "(status %d: '%s')",
                      pairs, sr ? strerror(-sr) : "all sent", fds, limit, outcome(r), rep.status,
                      rep.error);
        close(hog);
        close(good);
        close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * conn.c conn_flush(): any sendmsg() failure other than EAGAIN/EINTR closes the
 * connection it was for. For a dlxd that does not run as root, the kernel
 * charges every fd in flight on a Unix socket (sent, not yet received) to the
 * sending user and refuses more than RLIMIT_NOFILE of them (ETOOMANYREFS). A
 * few peers that request fds and never read their sockets keep that many in
 * flight in their receive queues; from then on every reply carrying an fd
 * fails, and dlxd hangs up on whichever innocent client it was answering.
 * (As root, CAP_SYS_RESOURCE lifts the limit; the test drops to nobody.)
 * Fixed: a connection may have CONN_MAX_FDS_UNREAD fds unread, all of them
 * half the limit; past that its next fd waits until its peer reads.
 */
START_TEST(rd_unread_fds_in_flight_drop_others)
{
        enum { HOGS = 4, PAIRS = 100, BURST = 20 };
        int hogs[HOGS], prod, good, r, fd = -1;
        struct wire_request req;
        struct wire_reply rep;
        uint64_t seg;
        long limit;

        if (geteuid() == 0) {
                ck_assert_int_eq(setgroups(0, NULL), 0);
                ck_assert_int_eq(setresgid(65534, 65534, 65534), 0);
                ck_assert_int_eq(setresuid(65534, 65534, 65534), 0);
        }
        limit = start_daemon_fd_limit(256);

        prod = raw_client("producer");
        good = raw_client("good");
        seg = raw_alloc(prod, 2, 4096, NULL);
        fill_publish(&req, 3, "review/inflight", 4096, seg, 0, false);
        send_request(prod, &req, -1);
        expect_ok(prod, 3, WIRE_REP_PUBLISH, NULL, NULL);

        for (int h = 0; h < HOGS; h++)
                hogs[h] = raw_client("hog");
        /* in small bursts, so that dlxd writes each batch out before the next */
        for (int b = 0; b < PAIRS / BURST; b++) {
                for (int h = 0; h < HOGS; h++) {
                        uint8_t *buf = NULL;
                        size_t len = 0, cap = 0;
                        for (int i = 0; i < BURST; i++) {
                                uint64_t id = 100 + 2 * (uint64_t)(b * BURST + i);
                                req = (struct wire_request){.id = id, .type = WIRE_REQ_ACQUIRE};
                                snprintf(req.acquire.name, sizeof(req.acquire.name),
                                         "review/inflight");
                                frame_append(&buf, &len, &cap, &req);
                                req = (struct wire_request){.id = id + 1, .type = WIRE_REQ_FORGET};
                                req.forget.segments[0] = seg;
                                req.forget.count = 1;
                                frame_append(&buf, &len, &cap, &req);
                        }
                        send_until_stalled(hogs[h], buf, len, 1000);
                        free(buf);
                }
                fx_sleep_ms(20);
        }
        ping(prod, 4);

        req = (struct wire_request){.id = 2, .type = WIRE_REQ_ACQUIRE};
        snprintf(req.acquire.name, sizeof(req.acquire.name), "review/inflight");
        send_request(good, &req, -1);
        r = read_answer(good, &rep, REPLY_TIMEOUT_MS, &fd);
        if (fd >= 0)
                close(fd);
        ck_assert_msg(r == 1 && rep.status == WIRE_OK && fd >= 0,
                      "%d peers not reading %d fd-carrying replies each (dlxd's limit: %ld fds "
                      "in flight); a well-behaved client's acquire then gets %s",
                      HOGS, PAIRS, limit, r == 1 ? "a reply without its fd" : outcome(r));
        for (int h = 0; h < HOGS; h++)
                close(hogs[h]);
        close(good);
        close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * registry.c grant() with session.c session_send(): when the reply cannot be
 * queued (conn_send: -EMFILE from F_DUPFD_CLOEXEC when dlxd is out of fds, or
 * -ENOMEM) the failure is only logged. The consumer gets no reply and no
 * hang-up, so it waits forever (libdlx waits without a timeout), while the
 * lease the daemon created for it stays, pinning the version and withholding
 * RELEASED from the producer until the consumer disconnects. A request must get
 * an answer (an error without the fd) or the session must end.
 */
START_TEST(rd_reply_lost_when_out_of_fds)
{
        long limit = start_daemon_fd_limit(64);
        int conns[256], nconns = 0;
        struct wire_request req;
        struct wire_reply rep;
        int prod, cons, r, fd = -1;
        uint64_t seg;

        prod = raw_client("producer");
        cons = raw_client("consumer");
        seg = raw_alloc(prod, 2, 4096, NULL);
        /* writable: its acquire reply carries the segment's own fd, a dup */
        fill_publish(&req, 3, "review/lost", 4096, seg, 0, false);
        send_request(prod, &req, -1);
        expect_ok(prod, 3, WIRE_REP_PUBLISH, NULL, NULL);

        /* other clients connect until dlxd has no descriptor left for the next one */
        while (nconns < (int)(N_ELEMS(conns))) {
                struct wire_request h = {.id = HELLO_ID, .type = WIRE_REQ_HELLO};
                int c = fx_raw_connect(&fx);
                h.hello.major = DLX_PROTO_MAJOR;
                send_request(c, &h, -1);
                conns[nconns++] = c;
                if (read_answer(c, &rep, 500, NULL) != 1)
                        break; /* not accepted: the table is full */
        }
        ck_assert_msg(nconns < (int)(N_ELEMS(conns)), "dlxd (limit %ld fds) kept accepting", limit);

        req = (struct wire_request){.id = 2, .type = WIRE_REQ_ACQUIRE};
        snprintf(req.acquire.name, sizeof(req.acquire.name), "review/lost");
        send_request(cons, &req, -1);
        r = read_answer(cons, &rep, REPLY_TIMEOUT_MS, &fd);
        if (fd >= 0)
                close(fd);
        ck_assert_msg(r != -ETIMEDOUT,
                      "with dlxd out of fds (%d clients connected), an acquire got neither a "
                      "reply nor a hang-up in %d ms",
                      nconns, REPLY_TIMEOUT_MS);
        for (int i = 0; i < nconns; i++)
                close(conns[i]);
        if (r != 1 || rep.status != WIRE_OK) {
                /* refused or hung up on: it must not hold a lease it never heard of */
                req = (struct wire_request){.id = 4, .type = WIRE_REQ_STATS};
                send_request(prod, &req, -1);
                expect_ok(prod, 4, WIRE_REP_STATS, &rep, NULL);
                ck_assert_uint_eq(rep.stats.leases, 0);
        }
        close(cons);
        close(prod);
        dlxd_stop(&fx);
}
END_TEST

/* Stops the daemon (SIGSTOP) and waits until it is stopped. */
static void stop_daemon_and_wait(void)
{
        char path[64], buf[512], *p;
        ssize_t n;
        int fd;

        ck_assert_int_eq(kill(fx.pid, SIGSTOP), 0);
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)fx.pid);
        for (int waited = 0; waited < 5000; waited += 1) {
                fd = open(path, O_RDONLY | O_CLOEXEC);
                ck_assert_int_ge(fd, 0);
                n = read(fd, buf, sizeof(buf) - 1);
                close(fd);
                ck_assert_int_gt(n, 0);
                buf[n] = '\0';
                p = strrchr(buf, ')');
                if (p && (p[2] == 'T' || p[2] == 't'))
                        return;
                fx_sleep_ms(1);
        }
        ck_abort_msg("dlxd did not stop");
}

/* ---- segments held by a publish that failed ----------------------------------------------- */

/*
 * registry.c publish_segment() / registry_publish(): a publish with hold = true
 * and an attached fd adopts the segment and puts it in the session's holds
 * before the descriptor is checked against it. When check_extent() (or the
 * version's allocation) then fails, only the caller's reference is dropped:
 * the hold stays, with its fd and bytes, yet the error reply carries no segment
 * id, so the client can never FREE it. Each failed publish leaks one segment
 * (and, with --max-bytes, its bytes from the shared limit) until disconnect.
 */
START_TEST(rd_failed_hold_publish_leaks_segment)
{
        int sock = raw_client("holder"), mfd;
        struct wire_request req;
        struct wire_reply rep;
        int r;

        mfd = memfd_create("review", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        ck_assert_int_ge(mfd, 0);
        ck_assert_int_eq(ftruncate(mfd, 4096), 0);
        ck_assert_int_eq(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
        /* 8 KiB of floats described over a 4 KiB memfd: refused */
        fill_publish(&req, 2, "review/held", 8192, 0, 0, false);
        req.publish.hold = true;
        send_request(sock, &req, mfd);
        close(mfd);
        r = read_answer(sock, &rep, REPLY_TIMEOUT_MS, NULL);
        ck_assert_int_eq(r, 1);
        ck_assert_int_eq(rep.id, 2);
        ck_assert_int_eq(rep.status, WIRE_INVALID);

        req = (struct wire_request){.id = 3, .type = WIRE_REQ_STATS};
        send_request(sock, &req, -1);
        expect_ok(sock, 3, WIRE_REP_STATS, &rep, NULL);
        ck_assert_msg(rep.stats.segments == 0 && rep.stats.bytes == 0,
                      "a refused publish (hold = true) left %llu segment(s), %llu bytes, held "
                      "by a session that was never told its id",
                      (unsigned long long)rep.stats.segments, (unsigned long long)rep.stats.bytes);
        close(sock);
}
END_TEST

/* ---- release events ------------------------------------------------------------------------ */

static void handle_fill(uint8_t h[DLX_CUDA_HANDLE], uint32_t seed)
{
        for (int i = 0; i < DLX_CUDA_HANDLE; i++)
                h[i] = (uint8_t)(seed >> (8 * (i % 4)));
        h[0] ^= 0x5a;
}

/* Acquires name and releases it with a release event made from seed. */
static void acquire_release_with_event(int sock, uint64_t id, const char *name, uint32_t seed)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_ACQUIRE};
        struct wire_reply rep;

        snprintf(req.acquire.name, sizeof(req.acquire.name), "%s", name);
        send_request(sock, &req, -1);
        expect_ok(sock, id, WIRE_REP_ACQUIRE, &rep, NULL);
        req = (struct wire_request){.id = id + 1, .type = WIRE_REQ_RELEASE};
        req.release.lease = rep.acquire.lease;
        req.release.has_event = true;
        handle_fill(req.release.event, seed);
        send_request(sock, &req, -1);
}

/*
 * registry.c version_add_release_event(): a version keeps at most
 * DLX_MAX_RELEASE_EVENTS distinct consumer release events, first come first
 * kept, across all consumers. One consumer that acquires and releases with a
 * fresh event 1024 times fills the table; the release event of any other
 * consumer is then dropped ("the producer will not wait for the rest"), so the
 * producer reuses its memory while that consumer's GPU work may still read it.
 * Checked with a cuda-ipc tensor, which the daemon handles without a GPU.
 */
START_TEST(rd_release_events_crowded_out)
{
        int prod = raw_client("producer"), hog = raw_client("hog"), good = raw_client("good");
        uint8_t mine[DLX_CUDA_HANDLE];
        struct wire_request req;
        struct wire_reply rep;
        bool found = false;
        uint32_t nevents = 0;

        fill_publish(&req, 2, "review/gpu", 4096, 0, 0, false);
        req.publish.tensor.storage = WIRE_STORAGE_CUDA_IPC;
        req.publish.tensor.device_type = kDLCUDA;
        req.publish.tensor.has_ipc_handle = true;
        handle_fill(req.publish.tensor.ipc_handle, 0xabcdef);
        req.publish.segment_size = 4096;
        req.publish.token = 99;
        send_request(prod, &req, -1);
        expect_ok(prod, 2, WIRE_REP_PUBLISH, NULL, NULL);

        for (uint32_t i = 0; i < DLX_MAX_RELEASE_EVENTS + 8; i++)
                acquire_release_with_event(hog, 10 + 2 * (uint64_t)i, "review/gpu", i + 1);
        ping(hog, 5);
        acquire_release_with_event(good, 10, "review/gpu", 0xfeedface);
        ping(good, 20);
        handle_fill(mine, 0xfeedface);

        req = (struct wire_request){.id = 3, .type = WIRE_REQ_UNPUBLISH};
        snprintf(req.unpublish.name, sizeof(req.unpublish.name), "review/gpu");
        send_request(prod, &req, -1);
        for (;;) {
                int r = rp_read_keep(prod, &rep, REPLY_TIMEOUT_MS, NULL);
                ck_assert_msg(r == 1, "no RELEASED for the producer (%s)", outcome(r));
                if (rep.type == WIRE_REP_EVENT && rep.event.kind == WIRE_EVENT_RELEASED) {
                        nevents = rep.event.nevents;
                        for (uint32_t i = 0; i < rep.event.nevents; i++)
                                if (memcmp(rep.event.events[i], mine, DLX_CUDA_HANDLE) == 0)
                                        found = true;
                        wire_reply_done(&rep);
                        break;
                }
                wire_reply_done(&rep);
        }
        ck_assert_msg(found,
                      "RELEASED hands the producer %u release events, all from one consumer; "
                      "another consumer's event was dropped",
                      nevents);
        close(good);
        close(hog);
        close(prod);
}
END_TEST

/* ---- half-closed peers --------------------------------------------------------------------- */

/*
 * conn.c on_poll(): a read that returns EOF closes the connection at once,
 * dropping replies already queued for requests of the same batch. A client
 * that writes its requests, shuts down its sending side and then reads (a
 * one-shot tool, `printf ... | socat`) gets nothing back.
 */
START_TEST(rd_half_close_loses_replies)
{
        struct wire_request req = {.id = HELLO_ID, .type = WIRE_REQ_HELLO};
        struct wire_reply rep;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        int sock = fx_raw_connect(&fx), r;

        req.hello.major = DLX_PROTO_MAJOR;
        snprintf(req.hello.client_name, sizeof(req.hello.client_name), "oneshot");
        frame_append(&buf, &len, &cap, &req);
        req = (struct wire_request){.id = 2, .type = WIRE_REQ_STATS};
        frame_append(&buf, &len, &cap, &req);
        /* the daemon finds the requests and the end of the stream in one wakeup */
        stop_daemon_and_wait();
        ck_assert_int_eq(send_all(sock, buf, len, -1), 0);
        free(buf);
        ck_assert_int_eq(shutdown(sock, SHUT_WR), 0);
        ck_assert_int_eq(kill(fx.pid, SIGCONT), 0);

        r = read_answer(sock, &rep, REPLY_TIMEOUT_MS, NULL);
        ck_assert_msg(r == 1 && rep.id == HELLO_ID && rep.type == WIRE_REP_HELLO,
                      "a half-closed client got %s instead of its hello reply",
                      r == 0  ? "EOF"
                      : r < 0 ? strerror(-r)
                              : "another reply");
        r = read_answer(sock, &rep, REPLY_TIMEOUT_MS, NULL);
        ck_assert_msg(r == 1 && rep.id == 2 && rep.type == WIRE_REP_STATS,
                      "a half-closed client got %s instead of its stats reply",
                      r == 0  ? "EOF"
                      : r < 0 ? strerror(-r)
                              : "another reply");
        close(sock);
}
END_TEST

Suite *review_daemon_suite(void)
{
        Suite *s = suite_create("review-daemon");
        TCase *integ = tcase_create("integration");
        TCase *limits = tcase_create("limits");

        tcase_add_unchecked_fixture(integ, reaper_init, reaper_run);
        tcase_add_checked_fixture(integ, rd_setup, fx_teardown);
        tcase_add_test(integ, rd_read_only_fd_reopens_writable);
        tcase_add_test(integ, rd_half_close_loses_replies);
        tcase_add_test(integ, rd_failed_hold_publish_leaks_segment);
        tcase_add_test(integ, rd_release_events_crowded_out);
        suite_add_tcase(s, integ);

        /* each starts its own daemon, with at most 1024 fds */
        tcase_set_timeout(limits, 120);
        tcase_add_unchecked_fixture(limits, reaper_init, reaper_run);
        tcase_add_test(limits, rd_one_client_fills_fd_table);
        tcase_add_test(limits, rd_unread_fd_replies_fill_fd_table);
        tcase_add_test(limits, rd_reply_lost_when_out_of_fds);
        tcase_add_test(limits, rd_unread_fds_in_flight_drop_others);
        suite_add_tcase(s, limits);
        return s;
}
