/* SPDX-License-Identifier: MIT */
/*
 * The federation scenario: two hosts on the loopback, each a dlxd of its own
 * and a dlxfed (UCX over TCP on lo), against TCP floors measured in the same
 * run:
 *  - a cold pull of --max-size (1 GiB) bytes, against one TCP stream moving
 *    as many bytes from a mapped memfd into a mapped memfd;
 *  - an acquire on B of a 4 KiB name B has not seen, against a 64-byte
 *    TCP_NODELAY ping-pong;
 *  - an acquire on B of a mirror B has (cached), against an acquire on B
 *    of a name published on B;
 *  - the same cold pull again with UCX's own TCP segment sizes (what
 *    dlxfed's 256 KiB segments are for).
 * Skipped where dlxfed was not built.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#ifndef DLXFED_PATH
#define DLXFED_PATH ""
#endif

#define SCENARIO "federation"

struct fedhost {
        char sock[128];
        pid_t dlxd, fed;
        int port;
};

static char dir[64];
static struct fedhost ha, hb;

/* Starts argv (NULL-terminated) with fd 3 a pipe it writes a byte to when ready. */
static pid_t spawn_ready(char *const *argv, char *const *env, const char *log)
{
        int p[2], logfd;
        char byte;
        struct pollfd pfd;
        pid_t pid;

        if (pipe2(p, O_CLOEXEC) < 0)
                return -1;
        pid = fork();
        if (pid == 0) {
                logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
                if (dup2(p[1], 3) < 0 || logfd < 0 || dup2(logfd, 2) < 0)
                        _exit(127);
                for (int i = 0; env && env[i]; i++)
                        putenv(env[i]);
                execv(argv[0], argv);
                _exit(127);
        }
        close(p[1]);
        pfd = (struct pollfd){.fd = p[0], .events = POLLIN};
        if (pid < 0 || poll(&pfd, 1, 30000) != 1 || read(p[0], &byte, 1) != 1) {
                close(p[0]);
                if (pid > 0) {
                        kill(pid, SIGKILL);
                        waitpid(pid, NULL, 0);
                }
                return -1;
        }
        close(p[0]);
        return pid;
}

static void stop_pid(pid_t *pid)
{
        if (*pid <= 0)
                return;
        kill(*pid, SIGTERM);
        waitpid(*pid, NULL, 0);
        *pid = 0;
}

static int free_port(void)
{
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(sa);
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

        if (s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
            getsockname(s, (struct sockaddr *)&sa, &len) == 0)
                port = ntohs(sa.sin_port);
        if (s >= 0)
                close(s);
        return port;
}

static int start_dlxd(struct fedhost *h, const char *name)
{
        char uid[16], log[128];
        char *argv[] = {(char *)opt.dlxd,   "--socket", h->sock, "--ready-fd", "3",
                        "--federation-uid", uid,        NULL};

        snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
        snprintf(h->sock, sizeof(h->sock), "%s/%s.sock", dir, name);
        snprintf(log, sizeof(log), "%s/dlxd-%s.log", dir, name);
        h->dlxd = spawn_ready(argv, NULL, log);
        return h->dlxd > 0 ? 0 : -1;
}

/* h's bridge, alias name, pulling from peer (alias palias); default_segments: UCX's own. */
static int start_fed(struct fedhost *h, const char *name, const struct fedhost *peer,
                     const char *palias, bool exporter, bool default_segments, const char *follow)
{
        char listen[32], peerarg[64], secret[128], log[128], exp[80], fol[120];
        char *argv[24];
        /* UCX's own segment sizes, where asked, come from the environment (dlxfed defers) */
        char *env[] = {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo",
                       default_segments ? "UCX_TCP_TX_SEG_SIZE=8k" : NULL,
                       "UCX_TCP_RX_SEG_SIZE=64k", NULL};
        int n = 0;

        snprintf(listen, sizeof(listen), "127.0.0.1:%d", h->port);
        snprintf(peerarg, sizeof(peerarg), "%s=127.0.0.1:%d", palias, peer->port);
        snprintf(secret, sizeof(secret), "%s/secret", dir);
        snprintf(log, sizeof(log), "%s/dlxfed-%s.log", dir, name);
        argv[n++] = DLXFED_PATH;
        argv[n++] = "--alias";
        argv[n++] = (char *)name;
        argv[n++] = "--listen";
        argv[n++] = listen;
        argv[n++] = "--peer";
        argv[n++] = peerarg;
        argv[n++] = "--secret-file";
        argv[n++] = secret;
        argv[n++] = "--socket";
        argv[n++] = h->sock;
        argv[n++] = "--ready-fd";
        argv[n++] = "3";
        argv[n++] = "--lease-ms";
        argv[n++] = "600000";
        if (exporter) {
                snprintf(exp, sizeof(exp), "%s/", opt.prefix);
                argv[n++] = "--export";
                argv[n++] = exp;
        }
        if (follow) {
                snprintf(fol, sizeof(fol), "@%s/%s/%s", palias, opt.prefix, follow);
                argv[n++] = "--follow";
                argv[n++] = fol;
        }
        argv[n] = NULL;
        h->fed = spawn_ready(argv, env, log);
        return h->fed > 0 ? 0 : -1;
}

static dlx_client *connect_to(const struct fedhost *h, const char *name)
{
        struct dlx_connect_options o = {.socket_path = h->sock, .client_name = name};
        dlx_client *c = NULL;

        return dlx_connect(&o, &c) == 0 ? c : NULL;
}

/* ---- floors: TCP on the loopback ---- */

static int tcp_pair(int *ret_client, int *ret_server)
{
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(sa);
        int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), c = -1, s = -1, one = 1;

        if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(l, 1) < 0 ||
            getsockname(l, (struct sockaddr *)&sa, &len) < 0)
                goto out;
        c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof(sa)) < 0)
                goto out;
        s = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (s >= 0)
                setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
out:
        if (l >= 0)
                close(l);
        if (s < 0) {
                if (c >= 0)
                        close(c);
                return -1;
        }
        *ret_client = c;
        *ret_server = s;
        return 0;
}

static int full_io(int fd, void *buf, size_t len, bool writing)
{
        uint8_t *p = buf;

        while (len) {
                ssize_t n = writing ? write(fd, p, len) : read(fd, p, len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return -1;
                p += n;
                len -= (size_t)n;
        }
        return 0;
}

/* n 64-byte round trips (ns each) against an echo child. */
static int tcp_rtt(long n, double *out)
{
        int c, s;
        uint8_t buf[64] = {0};
        pid_t pid;

        if (tcp_pair(&c, &s) < 0)
                return -1;
        pid = fork();
        if (pid == 0) {
                close(c);
                while (full_io(s, buf, sizeof(buf), false) == 0 &&
                       full_io(s, buf, sizeof(buf), true) == 0)
                        ;
                _exit(0);
        }
        close(s);
        for (long i = -100; i < n; i++) {
                uint64_t t0 = now_ns();
                if (full_io(c, buf, sizeof(buf), true) < 0 ||
                    full_io(c, buf, sizeof(buf), false) < 0)
                        break;
                if (i >= 0)
                        out[i] = (double)(now_ns() - t0);
        }
        close(c);
        waitpid(pid, NULL, 0);
        return 0;
}

/* One TCP stream: size bytes from a mapped memfd into a mapped memfd; ns, or < 0. */
static double tcp_bulk(uint64_t size)
{
        int c, s, fd;
        uint8_t *src, ack = 0;
        pid_t pid;
        uint64_t t0;

        if (tcp_pair(&c, &s) < 0)
                return -1;
        int bufsz = 4 << 20;
        setsockopt(c, SOL_SOCKET, SO_SNDBUF, &bufsz, sizeof(bufsz));
        setsockopt(s, SOL_SOCKET, SO_RCVBUF, &bufsz, sizeof(bufsz));
        pid = fork();
        if (pid == 0) {
                int mfd = memfd_create("bench-tcp-in", MFD_CLOEXEC);
                uint8_t *dst;
                close(c);
                if (mfd < 0 || ftruncate(mfd, (off_t)size) < 0)
                        _exit(1);
                dst = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
                if (dst == MAP_FAILED || full_io(s, dst, size, false) < 0 ||
                    full_io(s, &ack, 1, true) < 0)
                        _exit(1);
                _exit(0);
        }
        close(s);
        fd = memfd_create("bench-tcp-out", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
                close(c);
                return -1;
        }
        src = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (src == MAP_FAILED) {
                close(c);
                return -1;
        }
        memset(src, 0x5a, size);
        t0 = now_ns();
        double t = full_io(c, src, size, true) == 0 && full_io(c, &ack, 1, false) == 0
                           ? (double)(now_ns() - t0)
                           : -1;
        munmap(src, size);
        close(c);
        waitpid(pid, NULL, 0);
        return t;
}

/*
 * Touches size bytes of fresh memory and gives them back, so that what the
 * next transfer writes into is memory this host used a moment ago. In a VM
 * that reports free pages to its host (virtio-balloon), memory not touched
 * for a while costs about twice as much to fault in (the host backs it
 * again), and which of two transfers gets such memory would decide their
 * ratio: each floor and each pull is measured after this, alike.
 */
static void warm(uint64_t size)
{
        uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

        if (p == MAP_FAILED)
                return;
        for (uint64_t i = 0; i < size; i += 4096)
                p[i] = 1;
        munmap(p, size);
}

/* ---- the measurements ---- */

static int publish_bytes(dlx_client *c, const char *name, uint64_t size)
{
        int64_t n = (int64_t)size;
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = &n};
        DLManagedTensorVersioned *t;
        int err = dlx_alloc(c, &proto, &t);

        if (err < 0)
                return err;
        memset(t->dl_tensor.data, 0x5a, size);
        return dlx_publish(c, name, t, NULL, NULL);
}

/* One acquire on B of name, timed (ns); the tensor is released at once. */
static double acquire_ns(dlx_client *b, const char *name)
{
        struct dlx_acquire_options o = {.timeout_ms = 60000};
        DLManagedTensorVersioned *t;
        uint64_t t0 = now_ns();
        int err = dlx_acquire(b, name, &o, &t);
        double ns = (double)(now_ns() - t0);

        if (err < 0)
                return -1;
        t->deleter(t);
        return ns;
}

/*
 * A replace on A of a 4 KiB name B follows, until an acquire on B of that
 * version returns (ns): the watch event, the Change, the pull and the
 * mirror's publish. -1 on error.
 */
static double follow_ns(dlx_client *a, dlx_client *b, const char *name, const char *remote)
{
        int64_t n = 4096;
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = &n};
        struct dlx_acquire_options o = {.timeout_ms = 60000};
        DLManagedTensorVersioned *t;
        uint64_t t0;
        int err = dlx_alloc(a, &proto, &t);

        if (err < 0)
                return -1;
        memset(t->dl_tensor.data, 0x5a, 4096);
        t0 = now_ns();
        if (dlx_publish(a, name, t, NULL, &o.min_version) < 0 || dlx_acquire(b, remote, &o, &t) < 0)
                return -1;
        double ns = (double)(now_ns() - t0);
        t->deleter(t);
        return ns;
}

static int median_of(double *v, int n, double *ret)
{
        struct stats st;

        for (int i = 0; i < n; i++)
                if (v[i] < 0)
                        return -1;
        stats_of(v, (size_t)n, &st);
        *ret = st.median;
        return 0;
}

/* Cold pulls of size bytes: the median of k, each a name B has not seen. */
static int cold_pulls(dlx_client *a, dlx_client *b, uint64_t size, int k, const char *tag,
                      double *ret_ns)
{
        double t[5];
        char name[96], remote[112];

        for (int i = 0; i < k; i++) {
                bench_name(name, sizeof(name), "bench/fed/%s/%d", tag, i);
                snprintf(remote, sizeof(remote), "@a/%s", name);
                if (publish_bytes(a, name, size) < 0)
                        return -1;
                warm(size);
                t[i] = acquire_ns(b, remote);
                dlx_unpublish(a, name);
        }
        return median_of(t, k, ret_ns);
}

static int measure(void)
{
        uint64_t big =
                opt.quick ? (1u << 20) : (opt.max_size < (1u << 30) ? opt.max_size : 1u << 30);
        long n = opt.quick ? 50 : 400;
        int k = opt.quick ? 1 : 3;
        double *rtt = calloc((size_t)n, sizeof(double)), *cold = calloc((size_t)n, sizeof(double));
        double *cached = calloc((size_t)n, sizeof(double)),
               *local = calloc((size_t)n, sizeof(double));
        double bulk[5], bulk_ns, pull_ns, dflt_ns = 0;
        dlx_client *a = NULL, *b = NULL;
        const char *why = NULL;
        char name[96], remote[112], label[64];
        int err = -1;

        if (!rtt || !cold || !cached || !local)
                goto out;
        if (!fits(big, 4 * big, &why)) {
                report_skip(SCENARIO, "cold pulls", why);
                goto out;
        }
        a = connect_to(&ha, "bench-fed-a");
        b = connect_to(&hb, "bench-fed-b");
        if (!a || !b)
                goto out;

        /* floors */
        for (int i = 0; i < k; i++) {
                warm(big);
                bulk[i] = tcp_bulk(big);
        }
        if (median_of(bulk, k, &bulk_ns) < 0 || tcp_rtt(n, rtt) < 0)
                goto out;

        /* the cold pull of big bytes, against one TCP stream */
        if (cold_pulls(a, b, big, k, "big", &pull_ns) < 0)
                goto out;
        snprintf(label, sizeof(label), "TCP stream, %llu MiB memfd to memfd",
                 (unsigned long long)(big >> 20));
        report_value(SCENARIO, "tcp_stream_gbps", label, (double)big / bulk_ns, "GB/s", 0, NULL);
        snprintf(label, sizeof(label), "cold pull of %llu MiB (acquire on B)",
                 (unsigned long long)(big >> 20));
        report_value(SCENARIO, "cold_pull_gbps", label, (double)big / pull_ns, "GB/s",
                     bulk_ns / pull_ns, "tcp stream");

        /* uncached 4 KiB acquires, against a TCP round trip */
        for (long i = 0; i < n; i++) {
                bench_name(name, sizeof(name), "bench/fed/small/%ld", i);
                if (publish_bytes(a, name, 4096) < 0)
                        goto out;
        }
        for (long i = 0; i < n; i++) {
                bench_name(name, sizeof(name), "bench/fed/small/%ld", i);
                snprintf(remote, sizeof(remote), "@a/%s", name);
                cold[i] = acquire_ns(b, remote);
                if (cold[i] < 0)
                        goto out;
        }
        struct stats st_rtt, st_cold;
        stats_of(rtt, (size_t)n, &st_rtt);
        stats_of(cold, (size_t)n, &st_cold);
        report_value(SCENARIO, "tcp_rtt_us", "TCP round trip, 64 B, TCP_NODELAY",
                     st_rtt.median / 1e3, "us", 0, NULL);
        report_value(SCENARIO, "uncached_4k_us", "acquire on B of a 4 KiB name B lacks",
                     st_cold.median / 1e3, "us", st_cold.median / st_rtt.median, "tcp rt");

        /* the mirror again (cached), against a name of B's own */
        bench_name(name, sizeof(name), "bench/fed/small/%d", 0);
        snprintf(remote, sizeof(remote), "@a/%s", name);
        bench_name(name, sizeof(name), "bench/fed/local");
        if (publish_bytes(b, name, 4096) < 0)
                goto out;
        for (long i = -50; i < n; i++) {
                double c = acquire_ns(b, remote), l = acquire_ns(b, name);
                if (c < 0 || l < 0)
                        goto out;
                if (i >= 0) {
                        cached[i] = c;
                        local[i] = l;
                }
        }
        struct stats st_cached, st_local;
        stats_of(cached, (size_t)n, &st_cached);
        stats_of(local, (size_t)n, &st_local);
        report_value(SCENARIO, "local_acquire_us", "acquire on B of a name of B's",
                     st_local.median / 1e3, "us", 0, NULL);
        report_value(SCENARIO, "cached_mirror_us", "acquire on B of a mirror it has",
                     st_cached.median / 1e3, "us", st_cached.median / st_local.median, "local");

        /* UCX's own segment sizes: both bridges again, told by the environment */
        dlx_close(a);
        dlx_close(b);
        a = b = NULL;
        stop_pid(&hb.fed);
        stop_pid(&ha.fed);
        /* ports of their own: the old ones wait out their closed connections (TIME_WAIT) */
        ha.port = free_port();
        hb.port = free_port();
        if (start_fed(&ha, "a", &hb, "b", true, true, NULL) < 0 ||
            start_fed(&hb, "b", &ha, "a", false, true, "bench/fed/follow/") < 0)
                goto out;
        a = connect_to(&ha, "bench-fed-a");
        b = connect_to(&hb, "bench-fed-b");
        if (!a || !b || cold_pulls(a, b, big, k, "dflt", &dflt_ns) < 0)
                goto out;
        snprintf(label, sizeof(label), "... with UCX's segments (8K/64K)");
        report_value(SCENARIO, "cold_pull_default_segments_gbps", label, (double)big / dflt_ns,
                     "GB/s", bulk_ns / dflt_ns, "tcp stream");

        /* B follows A's fed/follow/: a replace on A, until B has it */
        bench_name(name, sizeof(name), "bench/fed/follow/w");
        snprintf(remote, sizeof(remote), "@a/%s", name);
        for (long i = -20; i < n; i++) {
                double f = follow_ns(a, b, name, remote);
                if (f < 0)
                        goto out;
                if (i >= 0)
                        cold[i] = f;
        }
        struct stats st_follow;
        stats_of(cold, (size_t)n, &st_follow);
        report_value(SCENARIO, "follow_4k_us", "a replace on A until B acquires it (--follow)",
                     st_follow.median / 1e3, "us", st_follow.median / st_rtt.median, "tcp rt");

        if (!opt.quick) {
                report_target("federation_cold_pull", "cold pull >= 0.8x one TCP stream",
                              bulk_ns / pull_ns, false, 0.8, "x");
                report_target("federation_uncached_4k", "uncached 4 KiB acquire <= 4x TCP rt",
                              st_cold.median / st_rtt.median, true, 4, "x");
                report_target("federation_cached", "cached mirror acquire <= 1.3x a local one",
                              st_cached.median / st_local.median, true, 1.3, "x");
        }
        err = 0;
out:
        if (a)
                dlx_close(a);
        if (b)
                dlx_close(b);
        free(rtt);
        free(cold);
        free(cached);
        free(local);
        return err;
}

int run_federation(void)
{
        char secret[128];
        int fd, err = -1;

        report_heading(SCENARIO, "two hosts on the loopback (dlxd + dlxfed each), UCX over TCP");
        if (!DLXFED_PATH[0] || access(DLXFED_PATH, X_OK) != 0) {
                report_skip(SCENARIO, "federation", "dlxfed was not built (-Dfederation)");
                return 0;
        }
        snprintf(dir, sizeof(dir), "/tmp/dlx-bench-fed-XXXXXX");
        if (!mkdtemp(dir))
                return -1;
        snprintf(secret, sizeof(secret), "%s/secret", dir);
        fd = open(secret, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 || write(fd, "the bench's shared secret\n", 26) != 26) {
                if (fd >= 0)
                        close(fd);
                return -1;
        }
        close(fd);
        memset(&ha, 0, sizeof(ha));
        memset(&hb, 0, sizeof(hb));
        ha.port = free_port();
        hb.port = free_port();
        if (start_dlxd(&ha, "a") == 0 && start_dlxd(&hb, "b") == 0 &&
            start_fed(&ha, "a", &hb, "b", true, false, NULL) == 0 &&
            start_fed(&hb, "b", &ha, "a", false, false, NULL) == 0)
                err = measure();
        if (err < 0)
                report_error(SCENARIO,
                             "the two hosts did not come up or a measurement failed: see "
                             "the logs in %s",
                             dir);
        stop_pid(&hb.fed);
        stop_pid(&ha.fed);
        stop_pid(&hb.dlxd);
        stop_pid(&ha.dlxd);
        if (err == 0) {
                char path[160];
                const char *const files[] = {"secret", "dlxd-a.log", "dlxd-b.log", "dlxfed-a.log",
                                             "dlxfed-b.log"};
                for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
                        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
                        unlink(path);
                }
                rmdir(dir);
        }
        return err < 0 ? -1 : 0;
}
