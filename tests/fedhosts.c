/* SPDX-License-Identifier: MIT */
/* Two hosts on the loopback for the federation suites: see fedhosts.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fedhosts.h"

struct host A, B;

/* A free TCP port on the loopback (the kernel's choice, given back at once). */
int free_port(void)
{
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof(sa);
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        ck_assert_int_ge(s, 0);
        ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
        ck_assert_int_eq(getsockname(s, (struct sockaddr *)&sa, &len), 0);
        close(s);
        return ntohs(sa.sin_port);
}

void write_secret(const char *path, const char *text)
{
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
}

/*
 * Starts h's dlxfed: alias, the secret's text, then extra arguments. Waits
 * until it serves. Returns 0, or its exit status when it would not start.
 */
int fed_start(struct host *h, const char *alias, const char *secret, const char *const *extra)
{
        const char *dlxfed = getenv("DLXFED");
        char listen[32], secret_path[128], ready[8], byte;
        int pipefd[2], status;
        struct pollfd pfd;

        ck_assert_msg(dlxfed && *dlxfed, "DLXFED is not set");
        snprintf(secret_path, sizeof(secret_path), "%s/secret-%s", h->d.dir, alias);
        write_secret(secret_path, secret);
        snprintf(listen, sizeof(listen), "127.0.0.1:%d", h->port);
        snprintf(h->log, sizeof(h->log), "%s/dlxfed.log", h->d.dir);
        ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
        h->fed = fork();
        ck_assert_int_ge(h->fed, 0);
        if (h->fed == 0) {
                const char *argv[48];
                int n = 0, logfd = open(h->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
                /* a test that fails takes its bridges with it */
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (dup2(pipefd[1], 3) < 0 || logfd < 0 || dup2(logfd, 2) < 0)
                        _exit(127);
                snprintf(ready, sizeof(ready), "3");
                setenv("UCX_TLS", "tcp", 1);
                setenv("UCX_NET_DEVICES", "lo", 1);
                argv[n++] = "dlxfed";
                argv[n++] = "--alias";
                argv[n++] = alias;
                argv[n++] = "--listen";
                argv[n++] = listen;
                argv[n++] = "--secret-file";
                argv[n++] = secret_path;
                argv[n++] = "--socket";
                argv[n++] = h->d.socket;
                argv[n++] = "--ready-fd";
                argv[n++] = ready;
                argv[n++] = "--log-level";
                argv[n++] = "info";
                for (int i = 0; extra && extra[i] && n < 47; i++)
                        argv[n++] = extra[i];
                argv[n] = NULL;
                execv(dlxfed, (char *const *)argv);
                _exit(127);
        }
        close(pipefd[1]);
        pfd.fd = pipefd[0];
        pfd.events = POLLIN;
        ck_assert_msg(poll(&pfd, 1, 30000 * fx_slowdown()) == 1, "dlxfed did not start in 30 s");
        if (read(pipefd[0], &byte, 1) == 1) {
                close(pipefd[0]);
                return 0;
        }
        close(pipefd[0]);
        ck_assert_int_eq(waitpid(h->fed, &status, 0), h->fed);
        h->fed = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* SIGTERM; it must exit 0. */
void fed_stop(struct host *h)
{
        int status;

        if (h->fed <= 0)
                return;
        ck_assert_int_eq(kill(h->fed, SIGTERM), 0);
        ck_assert_int_eq(waitpid(h->fed, &status, 0), h->fed);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "dlxfed did not exit 0 on SIGTERM (status 0x%x); see %s", status, h->log);
        h->fed = 0;
}

void fed_kill(struct host *h)
{
        int status;

        ck_assert_int_eq(kill(h->fed, SIGKILL), 0);
        ck_assert_int_eq(waitpid(h->fed, &status, 0), h->fed);
        h->fed = 0;
}

void hosts_up(void)
{
        hosts_up_a(NULL, NULL);
}

void hosts_up_a(const char *key, const char *value)
{
        char uid[16];
        const char *extra[] = {"--federation-uid", uid, key, value, NULL};

        snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
        dlxd_start(&A.d, extra);
        extra[2] = NULL;
        dlxd_start(&B.d, extra);
        A.port = free_port();
        B.port = free_port();
        A.fed = B.fed = 0;
}

/* A bridge that aborted, or broke an invariant of its own, said so in its log. */
void log_clean(struct host *h)
{
        char line[512], path[160];
        FILE *in = fopen(h->log, "re");

        while (in && fgets(line, sizeof(line), in))
                ck_assert_msg(!strstr(line, "Fatal") && !strstr(line, "broken invariant") &&
                                      !strstr(line, "backtrace") &&
                                      !strstr(line, "runtime error") &&
                                      !strstr(line, "Sanitizer") &&
                                      !strstr(line, "invalid configuration"),
                              "%s: %s", h->log, line);
        if (in)
                fclose(in);
        unlink(h->log);
        for (const char *const *a = (const char *const[]){"a", "b", "a@b", NULL}; *a; a++) {
                snprintf(path, sizeof(path), "%s/secret-%s", h->d.dir, *a);
                unlink(path);
        }
}

void hosts_down(void)
{
        fed_stop(&B);
        fed_stop(&A);
        log_clean(&A);
        log_clean(&B);
        dlxd_stop(&B.d);
        dlxd_stop(&A.d);
}

/* The usual pair: A exports "model/" and "kv/"; B pulls from A (A's peer list admits B). */
char peer_a[64], peer_b[64];

void set_peers(void)
{
        snprintf(peer_a, sizeof(peer_a), "a=127.0.0.1:%d", A.port);
        snprintf(peer_b, sizeof(peer_b), "b=127.0.0.1:%d", B.port);
}

/* args: "--peer", peer, then extra (NULL-terminated, at most 20). */
static void peer_args(const char **args, const char *peer, const char *const *extra)
{
        int n = 2;

        args[0] = "--peer";
        args[1] = peer;
        for (int i = 0; extra && extra[i]; i++) {
                ck_assert_int_lt(n, 22);
                args[n++] = extra[i];
        }
        args[n] = NULL;
}

/*
 * h's bridge with args, on a port nobody else took meanwhile: free_port()
 * gives a port back before the bridge binds it, and a suite running beside
 * may take it first (the bridge then serves, trying to listen each second).
 */
static void start_listening(struct host *h, const char *alias, const char *const *args)
{
        for (int tries = 0;; tries++) {
                int before = log_count(h, "is in use");
                ck_assert_int_eq(fed_start(h, alias, FED_SECRET, args), 0);
                if (log_count(h, "is in use") == before || tries == 4)
                        return;
                fed_kill(h);
                h->port = free_port();
                set_peers(); /* the other's --peer names the new port */
        }
}

void pair_up(const char *const *a_extra, const char *const *b_extra)
{
        const char *a_args[24], *b_args[24];

        set_peers();
        peer_args(a_args, peer_b, a_extra);
        peer_args(b_args, peer_a, b_extra);
        start_listening(&A, "a", a_args);
        start_listening(&B, "b", b_args);
}

void b_again(const char *const *b_extra)
{
        const char *b_args[24];

        peer_args(b_args, peer_a, b_extra);
        B.port = free_port();
        ck_assert_int_eq(fed_start(&B, "b", FED_SECRET, b_args), 0);
}

void feds_up(void)
{
        const char *a_args[] = {"--export", "model/", "--export", "kv/", NULL};

        pair_up(a_args, NULL);
}

struct dlx_info wait_for_ms(dlx_client *c, const char *name, uint64_t version, int ms)
{
        struct dlx_info in;
        int err = 0;

        memset(&in, 0, sizeof(in));
        for (int i = 0; i < ms / 50 * fx_slowdown(); i++) {
                err = dlx_stat(c, name, &in);
                if (version ? err == 0 && in.version == version : err == -ENOENT)
                        return in;
                fx_sleep_ms(50);
        }
        ck_abort_msg("'%s' on B: %s at v%llu, not %s v%llu", name, err ? dlx_strerror(err) : "is",
                     (unsigned long long)(err ? 0 : in.version), version ? "at" : "gone at",
                     (unsigned long long)version);
        return in;
}

struct dlx_info wait_for(dlx_client *c, const char *name, uint64_t version)
{
        return wait_for_ms(c, name, version, 15000);
}

DLManagedTensorVersioned *acquire_at(dlx_client *c, const char *name, uint64_t min_version,
                                     int64_t timeout_ms, int *ret_err)
{
        struct dlx_acquire_options o = {.min_version = min_version, .timeout_ms = timeout_ms};
        DLManagedTensorVersioned *t = NULL;

        *ret_err = dlx_acquire(c, name, &o, &t);
        return t;
}

/* A big tensor on host A: 1 GiB (256 MiB under valgrind), every byte set. */
int64_t publish_big(dlx_client *pa, const char *name)
{
        int64_t n = (fx_slowdown() > 1 ? 256 : 1024) << 20;
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = &n};
        DLManagedTensorVersioned *t;

        DLXV(dlx_alloc(pa, &proto, &t));
        memset(t->dl_tensor.data, 0x5a, (size_t)n);
        publish_ok(pa, name, t, NULL, NULL);
        return n;
}

/* Waits until A's bridge holds a lease: the pull has begun. */
void wait_pull_started(dlx_client *pa)
{
        for (int i = 0; i < 2000 && fx_stats(pa).leases == 0; i++)
                fx_sleep_ms(1);
}

/* Occurrences of needle in h's log so far. */
int log_count(struct host *h, const char *needle)
{
        char line[512];
        int n = 0;
        FILE *in = fopen(h->log, "re");

        while (in && fgets(line, sizeof(line), in))
                n += strstr(line, needle) != NULL;
        if (in)
                fclose(in);
        return n;
}

struct raw {
        DLManagedTensorVersioned mt;
        int64_t shape[4], strides[4];
        uint8_t *bytes;
};

static void raw_deleter(DLManagedTensorVersioned *t)
{
        struct raw *r = t->manager_ctx;
        free(r->bytes);
        free(r);
}

DLManagedTensorVersioned *raw_new(DLDataType dt, int ndim, const int64_t *shape,
                                  const int64_t *strides, size_t nbytes, uint64_t byte_offset)
{
        struct raw *r = calloc(1, sizeof(*r));

        ck_assert_ptr_nonnull(r);
        r->bytes = malloc(nbytes ? nbytes : 1);
        ck_assert_ptr_nonnull(r->bytes);
        for (size_t i = 0; i < nbytes; i++)
                r->bytes[i] = (uint8_t)(i * 7 + 3);
        memcpy(r->shape, shape, (size_t)ndim * sizeof(int64_t));
        if (strides)
                memcpy(r->strides, strides, (size_t)ndim * sizeof(int64_t));
        r->mt.version.major = DLPACK_MAJOR_VERSION;
        r->mt.version.minor = DLPACK_MINOR_VERSION;
        r->mt.manager_ctx = r;
        r->mt.deleter = raw_deleter;
        r->mt.dl_tensor = (DLTensor){.data = r->bytes,
                                     .device = {kDLCPU, 0},
                                     .ndim = ndim,
                                     .dtype = dt,
                                     .shape = r->shape,
                                     .strides = strides ? r->strides : NULL,
                                     .byte_offset = byte_offset};
        return &r->mt;
}

/* Element i's bytes of t (row-major order of its shape), through its own strides. */
static const uint8_t *element(const DLTensor *t, uint64_t i)
{
        int64_t at = 0, stride = 1;
        size_t esize = (size_t)(t->dtype.bits * t->dtype.lanes + 7) / 8;

        for (int d = t->ndim - 1; d >= 0; d--) {
                int64_t idx = (int64_t)(i % (uint64_t)t->shape[d]);
                i /= (uint64_t)t->shape[d];
                at += idx * (t->strides ? t->strides[d] : stride);
                stride *= t->shape[d];
        }
        return (const uint8_t *)t->data + t->byte_offset + at * (int64_t)esize;
}

void expect_same(const DLTensor *a, const DLTensor *b, const char *what)
{
        uint64_t n = 1;
        size_t esize = (size_t)(a->dtype.bits * a->dtype.lanes + 7) / 8;

        ck_assert_msg(a->ndim == b->ndim && a->dtype.code == b->dtype.code &&
                              a->dtype.bits == b->dtype.bits && a->dtype.lanes == b->dtype.lanes,
                      "%s: dtype or rank differs", what);
        for (int d = 0; d < a->ndim; d++) {
                ck_assert_msg(a->shape[d] == b->shape[d], "%s: shape differs in dim %d", what, d);
                n *= (uint64_t)a->shape[d];
        }
        for (uint64_t i = 0; i < n; i++)
                ck_assert_msg(memcmp(element(a, i), element(b, i), esize) == 0,
                              "%s: element %" PRIu64 " differs", what, i);
}
