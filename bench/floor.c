/* SPDX-License-Identifier: MIT */
/*
 * The machine's own floors, measured in the same run as everything they are
 * compared with: an AF_UNIX round trip, the same with an fd passed and mapped,
 * memcpy bandwidth, and a bare epoll echo server for throughput.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"

/* Request and reply of the round-trip floor and the echo server; the one-way message. */
#define MSG_SIZE 64
#define ONEWAY_SIZE 32
/* Size of the memfd the fd floor passes (the cold scenario's tensor size). */
#define FD_FLOOR_SIZE (4 * KIB)
#define LONG_MS 600000

struct floors floors;

static volatile uint8_t sink;

static int read_full(int fd, void *buf, size_t len)
{
        size_t off = 0;

        while (off < len) {
                ssize_t n = recv(fd, (char *)buf + off, len - off, MSG_WAITALL);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return n == 0 ? -EPIPE : -errno;
                off += (size_t)n;
        }
        return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
        size_t off = 0;

        while (off < len) {
                ssize_t n = send(fd, (const char *)buf + off, len - off, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                off += (size_t)n;
        }
        return 0;
}

/* ---- fd passing ------------------------------------------------------------------------ */

static int send_with_fd(int sock, const void *buf, size_t len, int fd)
{
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int))];
        } cbuf;
        struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        struct cmsghdr *cm;
        ssize_t n;

        memset(&cbuf, 0, sizeof(cbuf));
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = sizeof(cbuf.buf);
        cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        do
                n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        /* the fd went with the first byte */
        return (size_t)n == len ? 0 : write_full(sock, (const char *)buf + n, len - (size_t)n);
}

/* Receives len bytes and the fd that rides on them; returns the fd or -errno. */
static int recv_with_fd(int sock, void *buf, size_t len)
{
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int))];
        } cbuf;
        struct iovec iov = {.iov_base = buf, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        struct cmsghdr *cm;
        int fd = -1, err;
        ssize_t n;

        msg.msg_control = cbuf.buf;
        msg.msg_controllen = sizeof(cbuf.buf);
        do
                n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n <= 0)
                return n == 0 ? -EPIPE : -errno;
        for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
                if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
                        memcpy(&fd, CMSG_DATA(cm), sizeof(int));
        if (fd < 0)
                return -EBADMSG;
        if ((size_t)n < len && (err = read_full(sock, (char *)buf + n, len - (size_t)n)) < 0) {
                close(fd);
                return err;
        }
        return fd;
}

/* ---- round trips: the floor service ------------------------------------------------------ */

/*
 * One echo process and one client process stay up for the whole run, so that a
 * block of floor samples can be taken right before each block of a measurement:
 * on a shared machine the floor of a minute ago says little about now. The first
 * byte of a request says what the echo does: 'Q' reply, 'W' reply then read a
 * one-way message, 'F' reply with a memfd attached.
 */

static const char kind_byte[FLOOR_KINDS] = {'Q', 'W', 'F', 'E'};

struct service {
        struct child echo, client;
        double *buf; /* the client's samples of the last block */
        long cap;
        bool up;
        struct cpu_use cpu; /* round trips so far, warm-ups included, and their CPU time */
};

static struct service svc;

static int floor_echo(int ctl, void *p)
{
        int *sv = p, sock = sv[0], mfd, ep;
        uint8_t buf[MSG_SIZE], page[FD_FLOOR_SIZE];
        bool loop = false;

        pin_self(ROLE_SERVER);
        (void)ctl;
        close(sv[1]);
        memset(page, 0x5a, sizeof(page));
        mfd = memfd_create("dlx-bench-floor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (mfd < 0 || pwrite(mfd, page, sizeof(page), 0) != (ssize_t)sizeof(page)) {
                perror("dlx-bench: floor: memfd");
                return 1;
        }
        ep = epoll_create1(EPOLL_CLOEXEC);
        if (ep < 0 ||
            epoll_ctl(ep, EPOLL_CTL_ADD, sock, &(struct epoll_event){.events = EPOLLIN}) < 0) {
                perror("dlx-bench: floor: epoll");
                return 1;
        }
        /*
         * Until the client hangs up. After an 'E' request the server waits for
         * the next one in epoll_wait before reading it: the one system call an
         * event loop such as dlxd's adds to each request.
         */
        for (;;) {
                struct epoll_event ev;
                if (loop && epoll_wait(ep, &ev, 1, -1) < 0 && errno != EINTR)
                        break;
                if (read_full(sock, buf, sizeof(buf)) != 0)
                        break;
                loop = buf[0] == 'E';
                int err = buf[0] == 'F' ? send_with_fd(sock, buf, sizeof(buf), mfd)
                                        : write_full(sock, buf, sizeof(buf));
                if (err == 0 && buf[0] == 'W')
                        err = read_full(sock, buf, ONEWAY_SIZE);
                if (err < 0)
                        break;
        }
        close(ep);
        close(mfd);
        close(sock);
        return 0;
}

static int floor_op(int sock, int kind, uint8_t *buf)
{
        int err;

        buf[0] = (uint8_t)kind_byte[kind];
        err = write_full(sock, buf, MSG_SIZE);
        if (err == 0 && kind == FLOOR_FD) {
                /* what a cold acquire must do at the least: take the fd, map, touch, unmap */
                int fd = recv_with_fd(sock, buf, MSG_SIZE);
                void *m;
                if (fd < 0)
                        return fd;
                m = mmap(NULL, FD_FLOOR_SIZE, PROT_READ, MAP_SHARED, fd, 0);
                if (m == MAP_FAILED) {
                        err = -errno;
                        close(fd);
                        return err;
                }
                sink += *(volatile uint8_t *)m;
                munmap(m, FD_FLOOR_SIZE);
                close(fd);
        } else if (err == 0) {
                err = read_full(sock, buf, MSG_SIZE);
        }
        if (err == 0 && kind == FLOOR_RT_ONEWAY)
                err = write_full(sock, buf, ONEWAY_SIZE);
        return err;
}

/* Serves the parent's requests: kind | n << 8, 0 to stop. */
static int floor_client(int ctl, void *p)
{
        int *sv = p, sock = sv[1];
        uint8_t buf[MSG_SIZE];
        uint64_t req;
        int err = 0;

        pin_self(ROLE_CLIENT);
        close(sv[0]);
        memset(buf, 'Q', sizeof(buf));
        while (err == 0 && msg_recv(ctl, &req, -1) == 0 && req != 0) {
                int kind = (int)(req & 0xff);
                long n = (long)(req >> 8);

                for (int i = 0; i < BLOCK_WARM && err == 0; i++)
                        err = floor_op(sock, kind, buf);
                for (long i = 0; i < n && err == 0; i++) {
                        uint64_t t0 = now_ns();
                        err = floor_op(sock, kind, buf);
                        svc.buf[i] = (double)(now_ns() - t0);
                }
                if (err == 0 && msg_send(ctl, 1) < 0)
                        err = -EPIPE;
        }
        close(sock);
        if (err < 0) {
                fprintf(stderr, "dlx-bench: floor: round trip: %s\n", strerror(-err));
                return 1;
        }
        return 0;
}

int floor_service_start(void)
{
        int sv[2];

        svc.cap = opt.iterations > 4096 ? opt.iterations : 4096;
        svc.buf = shm_alloc((size_t)svc.cap * sizeof(double));
        if (!svc.buf || pair(sv) < 0) {
                report_error("floor", "out of memory or sockets");
                return -1;
        }
        if (child_start_keep(&svc.echo, "floor echo", floor_echo, sv) < 0) {
                close(sv[0]);
                close(sv[1]);
                report_error("floor", "fork failed");
                return -1;
        }
        if (child_start_keep(&svc.client, "floor client", floor_client, sv) < 0) {
                close(sv[0]);
                close(sv[1]);
                child_kill(&svc.echo);
                report_error("floor", "fork failed");
                return -1;
        }
        close(sv[0]);
        close(sv[1]);
        svc.up = true;
        return 0;
}

void floor_service_stop(void)
{
        if (svc.up) {
                msg_send(svc.client.ctl, 0);
                child_done(&svc.client, 10000, "floor");
                child_done(&svc.echo, 10000, "floor");
        }
        svc.up = false;
        shm_free(svc.buf, (size_t)svc.cap * sizeof(double));
        svc.buf = NULL;
}

int floor_sample(enum floor_kind kind, long n, double *out)
{
        uint64_t done;

        if (!svc.up)
                return -1;
        for (long off = 0; off < n;) {
                long m = n - off < svc.cap ? n - off : svc.cap;
                uint64_t client = cpu_ns(svc.client.pid), server = cpu_ns(svc.echo.pid);
                if (msg_send(svc.client.ctl, (uint64_t)kind | (uint64_t)m << 8) < 0 ||
                    msg_recv(svc.client.ctl, &done, LONG_MS) < 0) {
                        child_done(&svc.client, 1000, "floor");
                        child_kill(&svc.echo);
                        svc.up = false;
                        report_error("floor", "the floor service stopped");
                        return -1;
                }
                memcpy(out + off, svc.buf, (size_t)m * sizeof(double));
                off += m;
                svc.cpu.client += cpu_ns(svc.client.pid) - client;
                svc.cpu.server += cpu_ns(svc.echo.pid) - server;
                svc.cpu.ops += (uint64_t)(m + BLOCK_WARM);
        }
        return 0;
}

void floor_cpu(struct cpu_use *ret)
{
        *ret = svc.cpu;
}

void floor_service_repin(void)
{
        if (!svc.up)
                return;
        pin_pid(svc.echo.pid, ROLE_SERVER);
        pin_pid(svc.client.pid, ROLE_CLIENT);
}

/* ---- paced measurements -------------------------------------------------------------------- */

int paced_loop(int ctl, long warm, int block_warm, long n, double *samples, pace_op op, void *ctx)
{
        uint64_t go;

        for (long i = 0; i < warm; i++)
                if (op(ctx, -1) < 0)
                        return -1;
        /* warm: the parent's floor blocks must not overlap our warm-up */
        if (msg_send(ctl, 1) < 0)
                return -1;
        for (int b = 0; b < PACE_BLOCKS; b++) {
                long lo = n * b / PACE_BLOCKS, hi = n * (b + 1) / PACE_BLOCKS;

                if (msg_recv(ctl, &go, -1) < 0)
                        return -1;
                for (int j = 0; j < block_warm; j++)
                        if (op(ctx, -1) < 0)
                                return -1;
                for (long i = lo; i < hi; i++) {
                        uint64_t t0 = now_ns();
                        if (op(ctx, i) < 0)
                                return -1;
                        uint64_t t1 = now_ns();
                        if (samples)
                                samples[i] = (double)(t1 - t0);
                }
                if (msg_send(ctl, 1) < 0)
                        return -1;
        }
        return 0;
}

int paced_run_with(struct child *ch, long n, pace_block block, void *ctx)
{
        uint64_t done;

        if (msg_recv(ch->ctl, &done, LONG_MS) < 0)
                return -1;
        for (int b = 0; b < PACE_BLOCKS; b++) {
                long lo = n * b / PACE_BLOCKS, hi = n * (b + 1) / PACE_BLOCKS;

                if (block(ctx, lo, hi) < 0)
                        return -1;
                if (msg_send(ch->ctl, 1) < 0 || msg_recv(ch->ctl, &done, LONG_MS) < 0)
                        return -1;
        }
        return 0;
}

struct floor_block {
        enum floor_kind kind;
        double *floor;
};

static int floor_block(void *ctx, long lo, long hi)
{
        struct floor_block *f = ctx;

        return floor_sample(f->kind, hi - lo, f->floor + lo);
}

int paced_run(struct child *ch, long n, enum floor_kind kind, double *floor)
{
        struct floor_block f = {.kind = kind, .floor = floor};

        return paced_run_with(ch, n, floor_block, &f);
}

/* ---- bandwidth ------------------------------------------------------------------------------ */

struct bw_arg {
        uint64_t size;
        long warm, n;
        bool memfd; /* pwrite into a fresh memfd each time, instead of memcpy */
        double *samples;
};

static int bandwidth(int ctl, void *p)
{
        struct bw_arg *a = p;
        uint8_t *src = malloc(a->size), *dst = a->memfd ? NULL : malloc(a->size);

        pin_self(ROLE_CLIENT);
        (void)ctl;
        if (!src || (!a->memfd && !dst)) {
                fprintf(stderr, "dlx-bench: floor: out of memory\n");
                return 1;
        }
        /* fault everything in first: the floor is the copy, not the page faults */
        memset(src, 0x5a, a->size);
        if (dst)
                memset(dst, 0xa5, a->size);
        for (long i = 0; i < a->warm + a->n; i++) {
                uint64_t t0 = now_ns();
                if (a->memfd) {
                        /* what a one-copy publish does: fresh shmem pages, written once */
                        int fd = memfd_create("dlx-bench-floor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
                        uint64_t done = 0;
                        if (fd < 0 || ftruncate(fd, (off_t)a->size) < 0) {
                                perror("dlx-bench: floor: memfd");
                                return 1;
                        }
                        while (done < a->size) {
                                ssize_t n = pwrite(fd, src + done, a->size - done, (off_t)done);
                                if (n <= 0) {
                                        perror("dlx-bench: floor: pwrite");
                                        return 1;
                                }
                                done += (uint64_t)n;
                        }
                        close(fd);
                } else {
                        memcpy(dst, src, a->size);
                        sink += dst[a->size / 2];
                }
                uint64_t t1 = now_ns();
                if (i >= a->warm)
                        a->samples[i - a->warm] = (double)(t1 - t0);
        }
        free(src);
        free(dst);
        return 0;
}

static int run_bandwidth(const char *key, const char *label, uint64_t size, bool memfd,
                         double *ret_gbps)
{
        struct bw_arg a = {.size = size, .memfd = memfd};
        struct row r = {.scenario = "floor", .unit = "GB/s"};
        struct child ch;
        int err;

        a.n = opt.quick ? 5 : 20;
        a.warm = 2;
        a.samples = shm_alloc((size_t)a.n * sizeof(double));
        if (!a.samples || child_start(&ch, "bandwidth", bandwidth, &a) < 0) {
                report_error("floor", "cannot start the bandwidth child");
                shm_free(a.samples, (size_t)a.n * sizeof(double));
                return -1;
        }
        err = child_done(&ch, 300000, "floor");
        if (err == 0) {
                stats_of(a.samples, (size_t)a.n, &r.st);
                r.has_stats = true;
                r.has_value = true;
                r.value = (double)size / r.st.median; /* bytes per ns = GB/s */
                snprintf(r.key, sizeof(r.key), "%s", key);
                snprintf(r.label, sizeof(r.label), "%s", label);
                if (memfd && floors.memcpy_gbps > 0) {
                        r.has_ratio = true;
                        r.ratio = r.value / floors.memcpy_gbps;
                        r.ratio_to = "memcpy";
                }
                *ret_gbps = r.value;
                report_row(&r);
        }
        shm_free(a.samples, (size_t)a.n * sizeof(double));
        return err;
}

static int floor_row(enum floor_kind kind, const char *key, const char *label, struct stats *ret)
{
        long n = opt.iterations;
        double *v = malloc((size_t)n * sizeof(double));
        struct row r = {.scenario = "floor", .has_stats = true};

        if (!v || floor_sample(kind, n, v) < 0) {
                free(v);
                return -1;
        }
        stats_of(v, (size_t)n, ret);
        free(v);
        r.st = *ret;
        snprintf(r.key, sizeof(r.key), "%s", key);
        snprintf(r.label, sizeof(r.label), "%s", label);
        if (kind != FLOOR_RT && floors.rt.n) {
                r.has_ratio = true;
                r.ratio = ret->median / floors.rt.median;
                r.ratio_to = "rt";
        }
        report_row(&r);
        return 0;
}

int run_floor(void)
{
        uint64_t size = opt.quick ? 16 * MIB : 256 * MIB, pubsize;
        char sz[32], label[64];
        const char *why;
        int err = 0;

        report_heading("floor", "the machine's own costs, measured now");
        snprintf(label, sizeof(label), "AF_UNIX round trip, %d B", MSG_SIZE);
        if (floor_row(FLOOR_RT, "rt", label, &floors.rt) < 0)
                return -1;
        snprintf(label, sizeof(label), "round trip + %d B one-way message", ONEWAY_SIZE);
        if (floor_row(FLOOR_RT_ONEWAY, "rt_oneway", label, &floors.rt1w) < 0)
                return -1;
        if (floor_row(FLOOR_FD, "fd", "round trip + fd + mmap/munmap", &floors.fd) < 0)
                return -1;
        if (floor_row(FLOOR_LOOP, "loop", "round trip, server in epoll_wait", &floors.loop) < 0)
                return -1;

        /* two buffers of the size, and room to spare */
        while (size > 16 * MIB && !fits(0, 2 * size, &why))
                size /= 2;
        snprintf(label, sizeof(label), "memcpy %s, 1 thread", fmt_size(size, sz, sizeof(sz)));
        err |= run_bandwidth("memcpy", label, size, false, &floors.memcpy_gbps);

        pubsize = 64 * MIB < opt.max_size ? 64 * MIB : opt.max_size;
        while (pubsize > MIB && !fits(0, 2 * pubsize, &why))
                pubsize /= 2;
        snprintf(label, sizeof(label), "memfd pwrite %s, fresh pages",
                 fmt_size(pubsize, sz, sizeof(sz)));
        err |= run_bandwidth("memfd", label, pubsize, true, &floors.memfd_gbps);
        return err ? -1 : 0;
}

/* ---- timed runs of many clients ---------------------------------------------------------------
 */

int timed_ready(int ctl)
{
        uint64_t go;

        if (msg_send(ctl, 1) < 0 || msg_recv(ctl, &go, -1) < 0)
                return -1;
        return 0;
}

int timed_run(struct child *kids, int k, struct timed *t, const char *scenario, double *ret_ops)
{
        uint64_t ready, t0 = 0, total = 0;
        int err = 0;

        for (int i = 0; i < k && err == 0; i++) {
                if (msg_recv(kids[i].ctl, &ready, 120000) < 0) {
                        report_error(scenario, "%s %d did not become ready", kids[i].what, i);
                        err = -1;
                }
        }
        if (err == 0) {
                t0 = now_ns();
                __atomic_store_n(&t->deadline, t0 + (uint64_t)(opt.duration * 1e9),
                                 __ATOMIC_RELEASE);
                for (int i = 0; i < k; i++)
                        msg_send(kids[i].ctl, 1);
        }
        for (int i = 0; i < k; i++) {
                if (err < 0)
                        child_kill(&kids[i]);
                else if (child_done(&kids[i], (int)(opt.duration * 1000) + 120000, scenario) < 0)
                        err = -1;
        }
        if (err < 0)
                return -1;
        for (int i = 0; i < k; i++)
                total += t->counts[i];
        *ret_ops = (double)total / ((double)(t->deadline - t0) / 1e9);
        return 0;
}

/* ---- the echo server ------------------------------------------------------------------------ */

struct echo_arg {
        int *fds;   /* server: every server end; client: every client end */
        int *other; /* server: the client ends, closed in the server */
        int k;
        int idx; /* client: which one is ours */
        struct timed *t;
};

struct echo_conn {
        int fd;
        size_t len;
        uint8_t buf[4 * MSG_SIZE];
};

/*
 * One process, one epoll, level-triggered, one recv per readiness: per operation a
 * request in, a reply out, and a one-way message in, as a dlx acquire and release.
 */
static int echo_server(int ctl, void *p)
{
        struct echo_arg *a = p;
        struct echo_conn *conns = calloc((size_t)a->k, sizeof(*conns));
        struct epoll_event evs[64];
        int ep = epoll_create1(EPOLL_CLOEXEC), live = a->k;
        uint8_t reply[MSG_SIZE];

        pin_self(ROLE_SERVER);
        (void)ctl;
        /* a client's hang-up must reach us: hold none of their ends */
        for (int i = 0; i < a->k; i++)
                close(a->other[i]);
        if (!conns || ep < 0) {
                perror("dlx-bench: echo server");
                return 1;
        }
        memset(reply, 'A', sizeof(reply));
        for (int i = 0; i < a->k; i++) {
                conns[i].fd = a->fds[i];
                fcntl(a->fds[i], F_SETFL, O_NONBLOCK);
                if (epoll_ctl(ep, EPOLL_CTL_ADD, a->fds[i],
                              &(struct epoll_event){.events = EPOLLIN, .data.u32 = (uint32_t)i}) <
                    0) {
                        perror("dlx-bench: echo server: epoll_ctl");
                        return 1;
                }
        }
        while (live > 0) {
                int n = epoll_wait(ep, evs, 64, -1);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        perror("dlx-bench: echo server: epoll_wait");
                        return 1;
                }
                for (int e = 0; e < n; e++) {
                        struct echo_conn *c = &conns[evs[e].data.u32];
                        ssize_t got = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
                        size_t off = 0;

                        if (got < 0 && (errno == EAGAIN || errno == EINTR))
                                continue;
                        if (got <= 0) {
                                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                                close_fd(&c->fd);
                                live--;
                                continue;
                        }
                        c->len += (size_t)got;
                        for (;;) {
                                size_t need;
                                if (c->len - off < 1)
                                        break;
                                need = c->buf[off] == 'Q' ? MSG_SIZE : ONEWAY_SIZE;
                                if (c->len - off < need)
                                        break;
                                if (c->buf[off] == 'Q' &&
                                    write_full(c->fd, reply, sizeof(reply)) < 0) {
                                        fprintf(stderr, "dlx-bench: echo server: send failed\n");
                                        return 1;
                                }
                                off += need;
                        }
                        memmove(c->buf, c->buf + off, c->len - off);
                        c->len -= off;
                }
        }
        close(ep);
        free(conns);
        return 0;
}

static int echo_op(int fd, uint8_t *q, uint8_t *r, uint8_t *rel)
{
        if (write_full(fd, q, MSG_SIZE) < 0 || read_full(fd, r, MSG_SIZE) < 0 ||
            write_full(fd, rel, ONEWAY_SIZE) < 0)
                return -1;
        return 0;
}

static int echo_client(int ctl, void *p)
{
        struct echo_arg *a = p;
        uint8_t q[MSG_SIZE], r[MSG_SIZE], rel[ONEWAY_SIZE];
        uint64_t count = 0, deadline;
        int fd = a->fds[a->idx];

        for (int i = 0; i < a->k; i++)
                if (i != a->idx)
                        close(a->fds[i]);
        memset(q, 'Q', sizeof(q));
        memset(rel, 'R', sizeof(rel));
        for (int i = 0; i < 100; i++)
                if (echo_op(fd, q, r, rel) < 0)
                        goto fail;
        if (timed_ready(ctl) < 0)
                return 1;
        deadline = __atomic_load_n(&a->t->deadline, __ATOMIC_ACQUIRE);
        while (now_ns() < deadline) {
                if (echo_op(fd, q, r, rel) < 0)
                        goto fail;
                count++;
        }
        a->t->counts[a->idx] = count;
        close(fd);
        return 0;
fail:
        fprintf(stderr, "dlx-bench: echo client: %s\n", strerror(errno));
        return 1;
}

int echo_throughput(int k, double *ret_ops)
{
        size_t tsize = sizeof(struct timed) + (size_t)k * sizeof(uint64_t);
        struct timed *t = shm_alloc(tsize);
        int *srv = calloc((size_t)k, sizeof(int)), *cli = calloc((size_t)k, sizeof(int));
        struct child server = {.pid = -1, .ctl = -1}, *kids = calloc((size_t)k, sizeof(*kids));
        struct echo_arg sa = {.fds = srv, .other = cli, .k = k}, ca = {.fds = cli, .k = k, .t = t};
        int err = -1, made = 0;

        if (!t || !srv || !cli || !kids) {
                report_error("throughput", "out of memory");
                goto out;
        }
        for (int i = 0; i < k; i++)
                srv[i] = cli[i] = -1;
        for (made = 0; made < k; made++) {
                int sv[2];
                if (pair(sv) < 0) {
                        report_error("throughput", "socketpair: %s", strerror(errno));
                        goto out;
                }
                srv[made] = sv[0];
                cli[made] = sv[1];
        }
        /* the server gets the server ends; nobody else keeps them */
        for (int i = 0; i < k; i++)
                kids[i].pid = -1;
        if (child_start(&server, "echo server", echo_server, &sa) < 0) {
                report_error("throughput", "fork failed");
                goto out;
        }
        for (int i = 0; i < k; i++)
                close_fd(&srv[i]);
        for (int i = 0; i < k; i++) {
                ca.idx = i;
                if (child_start(&kids[i], "echo client", echo_client, &ca) < 0) {
                        report_error("throughput", "fork failed");
                        for (int j = 0; j < i; j++)
                                child_kill(&kids[j]);
                        child_kill(&server);
                        goto out;
                }
        }
        for (int i = 0; i < k; i++)
                close_fd(&cli[i]);
        err = timed_run(kids, k, t, "throughput", ret_ops);
        if (err < 0)
                child_kill(&server);
        else if (child_done(&server, 30000, "throughput") < 0)
                err = -1;
out:
        for (int i = 0; i < made; i++) {
                close_fd(&srv[i]);
                close_fd(&cli[i]);
        }
        free(srv);
        free(cli);
        free(kids);
        shm_free(t, tsize);
        return err;
}
