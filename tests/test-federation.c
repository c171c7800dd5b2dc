/* SPDX-License-Identifier: MIT */
/*
 * Federation on loopback: two hosts, each a dlxd and a dlxfed, UCX over TCP
 * on lo (UCX_TLS=tcp, UCX_NET_DEVICES=lo, always pinned). What the README
 * and dlxfed --help promise a user of host B:
 *  - a name N that host A exports is acquired on B as "@a/N": its bytes,
 *    dtype, shape and strides whatever the layout, read-only, with A's
 *    version number, and an origin saying how it came;
 *  - min_version means the same on both hosts; a version not there yet is
 *    waited for at the origin;
 *  - what A does not export is refused, naming the peer; so is a peer
 *    without the shared secret, or off the allow-list;
 *  - a peer that dies takes its mirrors with it (leased copies stay
 *    readable), and its waiters hear which peer went; an importer that
 *    dies leaves the exporter holding nothing;
 *  - both bridges stop cleanly on SIGTERM.
 */
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

#include "fixture.h"

#define DLXV(call)                                                                                 \
        do {                                                                                       \
                int err_ = (call);                                                                 \
                ck_assert_msg(err_ == 0, "%s: %s (%s)", #call, dlx_strerror(err_),                 \
                              dlx_last_error());                                                   \
        } while (0)

struct host {
        struct dlxd_fixture d;
        pid_t fed;
        int port;
        char log[128];
};

static struct host A, B;

/* A free TCP port on the loopback (the kernel's choice, given back at once). */
static int free_port(void)
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

static void write_secret(const char *path, const char *text)
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
static int fed_start(struct host *h, const char *alias, const char *secret,
                     const char *const *extra)
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
static void fed_stop(struct host *h)
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

static void fed_kill(struct host *h)
{
        int status;

        ck_assert_int_eq(kill(h->fed, SIGKILL), 0);
        ck_assert_int_eq(waitpid(h->fed, &status, 0), h->fed);
        h->fed = 0;
}

static void hosts_up(void)
{
        char uid[16];
        const char *extra[] = {"--federation-uid", uid, NULL};

        snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
        dlxd_start(&A.d, extra);
        dlxd_start(&B.d, extra);
        A.port = free_port();
        B.port = free_port();
        A.fed = B.fed = 0;
}

/* A bridge that aborted, or broke an invariant of its own, said so in its log. */
static void log_clean(struct host *h)
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

static void hosts_down(void)
{
        fed_stop(&B);
        fed_stop(&A);
        log_clean(&A);
        log_clean(&B);
        dlxd_stop(&B.d);
        dlxd_stop(&A.d);
}

/* The usual pair: A exports "model/" and "kv/"; B pulls from A (A's peer list admits B). */
static void feds_up(void)
{
        char peer_a[64], peer_b[64];
        const char *a_args[] = {"--export", "model/", "--export", "kv/", "--peer", peer_b, NULL};
        const char *b_args[] = {"--peer", peer_a, NULL};

        snprintf(peer_a, sizeof(peer_a), "a=127.0.0.1:%d", A.port);
        snprintf(peer_b, sizeof(peer_b), "b=127.0.0.1:%d", B.port);
        ck_assert_int_eq(fed_start(&A, "a", "a shared secret of the pair", a_args), 0);
        ck_assert_int_eq(fed_start(&B, "b", "a shared secret of the pair", b_args), 0);
}

static DLManagedTensorVersioned *acquire_at(dlx_client *c, const char *name, uint64_t min_version,
                                            int64_t timeout_ms, int *ret_err)
{
        struct dlx_acquire_options o = {.min_version = min_version, .timeout_ms = timeout_ms};
        DLManagedTensorVersioned *t = NULL;

        *ret_err = dlx_acquire(c, name, &o, &t);
        return t;
}

/* A tensor over plain bytes of ours: published by copy, with any layout. */
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

static DLManagedTensorVersioned *raw_new(DLDataType dt, int ndim, const int64_t *shape,
                                         const int64_t *strides, size_t nbytes,
                                         uint64_t byte_offset)
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

static void expect_same(const DLTensor *a, const DLTensor *b, const char *what)
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

START_TEST(every_dtype_and_layout_crosses)
{
        static const struct {
                const char *name;
                DLDataType dt;
                int ndim;
                int64_t shape[3], strides[3];
                bool strided;
                uint64_t byte_offset;
                size_t nbytes;
        } rows[] = {
                {"model/f32", {kDLFloat, 32, 1}, 2, {3, 5}, {0}, false, 0, 60},
                {"model/f64-t", {kDLFloat, 64, 1}, 2, {4, 3}, {1, 4}, true, 0, 96},
                {"model/i8-3d", {kDLInt, 8, 1}, 3, {2, 3, 4}, {0}, false, 0, 24},
                {"model/u16-off", {kDLUInt, 16, 1}, 1, {5}, {0}, false, 6, 16},
                {"model/bf16", {kDLBfloat, 16, 1}, 1, {7}, {0}, false, 0, 14},
                {"model/bool", {kDLBool, 8, 1}, 1, {9}, {0}, false, 0, 9},
                {"model/c64-step", {kDLComplex, 64, 1}, 1, {4}, {2}, true, 8, 72},
                {"model/fp8", {kDLFloat8_e4m3fn, 8, 1}, 2, {2, 2}, {0}, false, 0, 4},
                {"model/scalar", {kDLFloat, 32, 1}, 0, {0}, {0}, false, 0, 4},
                {"model/empty", {kDLFloat, 32, 1}, 2, {0, 3}, {0}, false, 0, 0},
                {"model/broadcast", {kDLInt, 32, 1}, 2, {3, 4}, {0, 1}, true, 0, 16},
        };
        dlx_client *pa, *pb;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
                DLManagedTensorVersioned *src = raw_new(rows[i].dt, rows[i].ndim, rows[i].shape,
                                                        rows[i].strided ? rows[i].strides : NULL,
                                                        rows[i].nbytes, rows[i].byte_offset);
                DLManagedTensorVersioned *here, *there;
                char remote[128];
                uint64_t v, rv;
                int err;

                DLXV(dlx_publish(pa, rows[i].name, src, NULL, &v));
                here = acquire_ok(pa, rows[i].name, NULL);
                snprintf(remote, sizeof(remote), "@a/%s", rows[i].name);
                there = acquire_at(pb, remote, 0, 10000 * fx_slowdown(), &err);
                ck_assert_msg(err == 0, "%s: %s (%s)", remote, dlx_strerror(err), dlx_last_error());
                expect_same(&here->dl_tensor, &there->dl_tensor, remote);
                ck_assert(there->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
                DLXV(dlx_tensor_info(there, NULL, &rv, NULL));
                ck_assert_uint_eq(rv, v);
                struct dlx_info in;
                DLXV(dlx_stat(pb, remote, &in));
                ck_assert_msg(strstr(in.origin, "ucx tcp/lo") && strstr(in.origin, " a v1"),
                              "origin '%s'", in.origin);
                here->deleter(here);
                there->deleter(there);
        }
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(versions_mean_the_same_on_both_hosts)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        uint64_t v;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int i = 0; i < 3; i++)
                publish_ok(pa, "model/w", fx_vec_f32(pa, 64, (float)i), NULL, &v);
        ck_assert_uint_eq(v, 3);
        t = acquire_at(pb, "@a/model/w", 2, 10000 * fx_slowdown(), &err);
        DLXV(err);
        ck_assert(fx_vec_is(t, 64, 2));
        DLXV(dlx_tensor_info(t, NULL, &v, NULL));
        ck_assert_uint_eq(v, 3);
        t->deleter(t);
        /* a version not there yet is waited for at the origin */
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                dlx_client *p = fx_connect(&A.d, "later");
                fx_sleep_ms(300);
                publish_ok(p, "model/w", fx_vec_f32(p, 64, 4), NULL, NULL);
                dlx_close(p);
                fx_child_exit(0);
        }
        t = acquire_at(pb, "@a/model/w", 4, 10000 * fx_slowdown(), &err);
        DLXV(err);
        ck_assert_int_eq(fx_wait(child), 0);
        DLXV(dlx_tensor_info(t, NULL, &v, NULL));
        ck_assert_uint_eq(v, 4);
        ck_assert(fx_vec_is(t, 64, 4));
        t->deleter(t);
        /* the mirror is a cache: an acquire of any version takes it, no pull */
        t = acquire_at(pb, "@a/model/w", 0, 0, &err);
        DLXV(err);
        t->deleter(t);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(what_is_not_exported_is_refused)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "secret/w", fx_vec_f32(pa, 8, 0), NULL, NULL);
        t = acquire_at(pb, "@a/secret/w", 0, 10000 * fx_slowdown(), &err);
        ck_assert_ptr_null(t);
        ck_assert_int_eq(err, -ENOENT);
        expect_last_error("not exported by a");
        /* writable versions are not exported */
        struct dlx_publish_options w = {.writable = true};
        publish_ok(pa, "model/rw", fx_vec_f32(pa, 8, 0), &w, NULL);
        t = acquire_at(pb, "@a/model/rw", 0, 10000 * fx_slowdown(), &err);
        ck_assert_int_eq(err, -ENOTSUP);
        expect_last_error("read-only");
        /* nothing was mirrored */
        struct dlx_info in;
        ck_assert_int_eq(dlx_stat(pb, "@a/secret/w", &in), -ENOENT);
        ck_assert_int_eq(dlx_stat(pb, "@a/model/rw", &in), -ENOENT);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(a_peer_without_the_secret_gets_nothing)
{
        char peer_a[64];
        const char *a_args[] = {"--export", "model/", "--allow", "127.0.0.1", NULL};
        const char *b_args[] = {"--peer", peer_a, NULL};
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        snprintf(peer_a, sizeof(peer_a), "a=127.0.0.1:%d", A.port);
        ck_assert_int_eq(fed_start(&A, "a", "the secret of host a's cluster", a_args), 0);
        ck_assert_int_eq(fed_start(&B, "b", "another cluster's secret here", b_args), 0);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 8, 0), NULL, NULL);
        t = acquire_at(pb, "@a/model/w", 0, 10000 * fx_slowdown(), &err);
        ck_assert_ptr_null(t);
        ck_assert_msg(err == -EACCES || err == -EHOSTUNREACH, "err %d (%s)", err, dlx_last_error());
        expect_last_error("HMAC");
        struct dlx_stats st = fx_stats(pa);
        ck_assert_uint_eq(st.leases, 0);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(a_peer_off_the_allow_list_gets_nothing)
{
        char peer_a[64];
        const char *a_args[] = {"--export", "model/", "--allow", "192.0.2.0/24", NULL};
        const char *b_args[] = {"--peer", peer_a, "--pull-ms", "3000", "--wait-ms", "1000", NULL};
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        snprintf(peer_a, sizeof(peer_a), "a=127.0.0.1:%d", A.port);
        ck_assert_int_eq(fed_start(&A, "a", "a shared secret of the pair", a_args), 0);
        ck_assert_int_eq(fed_start(&B, "b", "a shared secret of the pair", b_args), 0);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 8, 0), NULL, NULL);
        t = acquire_at(pb, "@a/model/w", 0, 20000 * fx_slowdown(), &err);
        ck_assert_ptr_null(t);
        ck_assert_msg(err == -EHOSTUNREACH || err == -ETIMEDOUT, "err %d (%s)", err,
                      dlx_last_error());
        expect_last_error("peer a");
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(bad_configurations_are_refused)
{
        const char *at_export[] = {"--export", "@b/x", NULL};
        const char *bad_peer[] = {"--peer", "no-address", NULL};
        const char *bad_allow[] = {"--allow", "300.1.1.1/8", NULL};
        char secret_path[160];

        hosts_up();
        ck_assert_int_eq(fed_start(&A, "a", "a shared secret of the pair", at_export), 2);
        ck_assert_int_eq(fed_start(&A, "a", "a shared secret of the pair", bad_peer), 2);
        ck_assert_int_eq(fed_start(&A, "a", "a shared secret of the pair", bad_allow), 2);
        ck_assert_int_eq(fed_start(&A, "a@b", "a shared secret of the pair", NULL), 2);
        /* a short secret, and one others may read */
        ck_assert_int_eq(fed_start(&A, "a", "short", NULL), 1);
        snprintf(secret_path, sizeof(secret_path), "%s/secret-a", A.d.dir);
        ck_assert_int_eq(chmod(secret_path, 0640), 0);
        ck_assert_int_eq(fed_start(&A, "a", "a shared secret of the pair", NULL), 1);
        ck_assert_int_eq(chmod(secret_path, 0600), 0);
        ck_assert_int_eq(fed_start(&A, "a", "a shared secret of the pair", NULL), 0);
        fed_stop(&A);
        hosts_down();
}
END_TEST

START_TEST(a_dead_exporter_takes_its_mirrors)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t, *held;
        struct dlx_info in;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 256, 7), NULL, NULL);
        held = acquire_at(pb, "@a/model/w", 0, 10000 * fx_slowdown(), &err);
        DLXV(err);
        fed_kill(&A);
        /* the mirror goes; the copy held stays readable */
        for (int i = 0; i < 200 && dlx_stat(pb, "@a/model/w", &in) == 0; i++)
                fx_sleep_ms(50);
        ck_assert_int_eq(dlx_stat(pb, "@a/model/w", &in), -ENOENT);
        ck_assert(fx_vec_is(held, 256, 7));
        held->deleter(held);
        /* a new want hears which peer is gone */
        t = acquire_at(pb, "@a/model/w", 0, 20000 * fx_slowdown(), &err);
        ck_assert_ptr_null(t);
        ck_assert_int_eq(err, -EHOSTUNREACH);
        expect_last_error("peer a");
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/* A big tensor on host A: 1 GiB (256 MiB under valgrind), every byte set. */
static int64_t publish_big(dlx_client *pa, const char *name)
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
static void wait_pull_started(dlx_client *pa)
{
        for (int i = 0; i < 2000 && fx_stats(pa).leases == 0; i++)
                fx_sleep_ms(1);
}

START_TEST(an_importer_killed_mid_pull_leaves_the_exporter_nothing)
{
        dlx_client *pa, *pb;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_big(pa, "model/big");
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                dlx_client *c = fx_connect(&B.d, "doomed");
                /* its bridge dies under it: the wait ends at its timeout */
                DLManagedTensorVersioned *x = acquire_at(c, "@a/model/big", 0, 3000, &err);
                (void)x;
                fx_child_exit(0);
        }
        wait_pull_started(pa);
        fed_kill(&B);
        fx_wait(child);
        /* the exporter's lease ends with the endpoint; its bridge lives on and serves */
        ck_assert_uint_eq(fx_wait_leases(pa, 0, 20000 * fx_slowdown()), 0);
        ck_assert_int_eq(kill(A.fed, 0), 0);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(an_exporter_killed_mid_pull_leaves_the_importer_nothing)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        struct dlx_stats before;
        struct dlx_info in;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        before = fx_stats(pb);
        publish_big(pa, "model/big");
        pid_t killer = fork();
        ck_assert_int_ge(killer, 0);
        if (killer == 0) {
                dlx_client *c = fx_connect(&A.d, "killer");
                wait_pull_started(c);
                kill(A.fed, SIGKILL);
                dlx_close(c);
                fx_child_exit(0);
        }
        t = acquire_at(pb, "@a/model/big", 0, 30000 * fx_slowdown(), &err);
        ck_assert_int_eq(fx_wait(killer), 0);
        ck_assert_int_eq(waitpid(A.fed, NULL, 0), A.fed);
        A.fed = 0;
        if (err == 0) {
                /* the pull won the race: the whole of it, then */
                ck_assert_uint_eq(t->dl_tensor.shape[0], (fx_slowdown() > 1 ? 256 : 1024) << 20);
                t->deleter(t);
        } else {
                ck_assert_int_eq(err, -EHOSTUNREACH);
                expect_last_error("peer a");
        }
        /*
         * Nothing of a half pull stays: no mirror, and no bytes but the one
         * empty segment a client keeps for reuse (dlx.h, dlx_alloc).
         */
        for (int i = 0; i < 200 && dlx_stat(pb, "@a/model/big", &in) == 0; i++)
                fx_sleep_ms(50);
        ck_assert_int_eq(dlx_stat(pb, "@a/model/big", &in), -ENOENT);
        uint64_t big = (uint64_t)(fx_slowdown() > 1 ? 256 : 1024) << 20;
        for (int i = 0; i < 200 && fx_stats(pb).bytes > before.bytes + big + (1u << 20); i++)
                fx_sleep_ms(50);
        ck_assert_uint_le(fx_stats(pb).bytes, before.bytes + big + (1u << 20));
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

Suite *federation_suite(void)
{
        Suite *s = suite_create("federation");
        TCase *tc = tcase_create("loopback");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, every_dtype_and_layout_crosses);
        tcase_add_test(tc, versions_mean_the_same_on_both_hosts);
        tcase_add_test(tc, what_is_not_exported_is_refused);
        tcase_add_test(tc, a_peer_without_the_secret_gets_nothing);
        tcase_add_test(tc, a_peer_off_the_allow_list_gets_nothing);
        tcase_add_test(tc, bad_configurations_are_refused);
        tcase_add_test(tc, a_dead_exporter_takes_its_mirrors);
        tcase_add_test(tc, an_importer_killed_mid_pull_leaves_the_exporter_nothing);
        tcase_add_test(tc, an_exporter_killed_mid_pull_leaves_the_importer_nothing);
        suite_add_tcase(s, tc);
        return s;
}
