/* SPDX-License-Identifier: MIT */
#include "fixture.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif

struct dlxd_fixture fx;

/* Daemons started while the reaper is on, in a page shared with the runner. */
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

void fx_reaper_init(void)
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
void fx_reaper_run(void)
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

int64_t fx_now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fx_sleep_ms(int ms)
{
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
}

int wait_daemon_fds(const struct dlxd_fixture *f, int n, int timeout_ms)
{
        int count = count_fds(f->pid);

        for (int waited = 0; count != n && waited < timeout_ms; waited += 5) {
                fx_sleep_ms(5);
                count = count_fds(f->pid);
        }
        return count;
}

int fx_daemon_argv(const char **argv, char *words, size_t wsz)
{
        const char *wrapper = getenv("DLX_TEST_DAEMON_WRAPPER");
        char *save = NULL;
        int n = 0;

        if (wrapper && *wrapper) {
                snprintf(words, wsz, "%s", wrapper);
                for (char *w = strtok_r(words, " ", &save); w && n < FX_WRAPPER_WORDS;
                     w = strtok_r(NULL, " ", &save))
                        argv[n++] = w;
        }
        argv[n++] = getenv("DLXD");
        return n;
}

/* Runs dlxd on f->socket and waits until it is ready. */
static void spawn(struct dlxd_fixture *f, const char *const *extra)
{
        const char *dlxd = getenv("DLXD");
        const char *level = getenv("DLX_TEST_LOG");
        int pipefd[2];
        char ready[16], byte;
        struct pollfd pfd;

        ck_assert_msg(dlxd && *dlxd, "DLXD is not set");
        ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);

        f->pid = fork();
        ck_assert_int_ge(f->pid, 0);
        if (f->pid == 0) {
                const char *argv[64];
                char words[512];
                int n = fx_daemon_argv(argv, words, sizeof(words));
                /* the write end, inherited without CLOEXEC as fd 3 */
                if (dup2(pipefd[1], 3) < 0)
                        _exit(127);
                snprintf(ready, sizeof(ready), "%d", 3);
                argv[n++] = "--socket";
                argv[n++] = f->socket;
                argv[n++] = "--ready-fd";
                argv[n++] = ready;
                argv[n++] = "--log-level";
                argv[n++] = level && *level ? level : "notice";
                for (int i = 0; extra && extra[i] && n < 63; i++)
                        argv[n++] = extra[i];
                argv[n] = NULL;
                execvp(argv[0], (char *const *)argv);
                _exit(127);
        }
        close(pipefd[1]);
        pfd.fd = pipefd[0];
        pfd.events = POLLIN;
        ck_assert_msg(poll(&pfd, 1, 30000) == 1, "dlxd did not become ready in 30 s");
        ck_assert_msg(read(pipefd[0], &byte, 1) == 1, "dlxd exited before becoming ready");
        /* dlxd closes the ready fd after writing: count its fds only after that */
        ck_assert_msg(poll(&pfd, 1, 10000) == 1 && read(pipefd[0], &byte, 1) == 0,
                      "dlxd kept its ready fd open");
        close(pipefd[0]);
        f->daemon_fds = count_fds(f->pid);
        ck_assert_int_gt(f->daemon_fds, 0);
        if (reaper)
                reaper_add(f);
}

void dlxd_start(struct dlxd_fixture *f, const char *const *extra)
{
        memset(f, 0, sizeof(*f));
        f->self_fds = count_fds(0);
        snprintf(f->dir, sizeof(f->dir), "/tmp/dlx-test-XXXXXX");
        ck_assert_msg(mkdtemp(f->dir), "mkdtemp: %s", strerror(errno));
        snprintf(f->socket, sizeof(f->socket), "%s/dlxd.sock", f->dir);
        spawn(f, extra);
}

void dlxd_restart(struct dlxd_fixture *f, const char *const *extra)
{
        ck_assert_msg(f->pid == 0 && f->dir[0], "dlxd_restart: the daemon must be stopped first");
        spawn(f, extra);
}

static int unpublish_one(void *ctx, const struct dlx_info *info)
{
        dlx_unpublish(ctx, info->name);
        return 0;
}

void dlxd_stop(struct dlxd_fixture *f)
{
        struct dlx_connect_options o = {.socket_path = f->socket, .client_name = "teardown"};
        dlx_client *c;
        int status, fds;

        if (f->pid <= 0)
                return;
        /* persistent tensors legitimately hold fds: remove them, then count */
        if (dlx_connect(&o, &c) == 0) {
                dlx_list(c, "", unpublish_one, c);
                dlx_close(c);
        }
        fds = wait_daemon_fds(f, f->daemon_fds, 5000);
        ck_assert_msg(fds == f->daemon_fds, "dlxd holds %d fds at the end, %d at the start", fds,
                      f->daemon_fds);
        ck_assert_int_eq(kill(f->pid, SIGTERM), 0);
        ck_assert_int_eq(waitpid(f->pid, &status, 0), f->pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "dlxd did not exit 0 on SIGTERM (status 0x%x)", status);
        f->pid = 0;
        ck_assert_msg(access(f->socket, F_OK) != 0, "dlxd left its socket behind");
        rmdir(f->dir);
        fds = count_fds(0);
        ck_assert_msg(fds == f->self_fds, "the test has %d fds open, %d before", fds, f->self_fds);
}

void fx_setup(void)
{
        dlxd_start(&fx, NULL);
}

void fx_teardown(void)
{
        dlxd_stop(&fx);
}

dlx_client *fx_connect(const struct dlxd_fixture *f, const char *name)
{
        /* under valgrind (a daemon and clients ten times slower) ten times the default */
        struct dlx_connect_options o = {.socket_path = f->socket,
                                        .client_name = name,
                                        .timeout_ms =
                                                (int64_t)DLX_DEFAULT_TIMEOUT_MS * fx_slowdown()};
        dlx_client *c = NULL;
        int err = dlx_connect(&o, &c);

        ck_assert_msg(err == 0, "connect: %s (%s)", dlx_strerror(err), dlx_last_error());
        return c;
}

int fx_slowdown(void)
{
        return getenv("DLX_TEST_VALGRIND") ? 10 : 1;
}

void fx_child_exit(int status)
{
#if __has_include(<valgrind/valgrind.h>)
        if (RUNNING_ON_VALGRIND) {
                /*
                 * A forked child shares its parent's heap, so memcheck's leak
                 * report at its exit would list the parent's blocks. Leave by
                 * exec instead (memcheck does not follow it); memory errors the
                 * child made still fail it.
                 */
                char code[16];
                if (VALGRIND_COUNT_ERRORS > 0)
                        status = 99;
                snprintf(code, sizeof(code), "%d", status & 0xff);
                execl("/bin/sh", "sh", "-c", "exit \"$1\"", "sh", code, (char *)NULL);
        }
#endif
        _exit(status);
}

pid_t fx_spawn(int (*fn)(void *arg), void *arg)
{
        pid_t pid = fork();

        ck_assert_int_ge(pid, 0);
        if (pid == 0)
                fx_child_exit(fn(arg));
        return pid;
}

int fx_wait(pid_t pid)
{
        int status;

        if (waitpid(pid, &status, 0) != pid)
                return -1;
        if (WIFSIGNALED(status))
                return 128 + WTERMSIG(status);
        return WEXITSTATUS(status);
}

int fx_raw_connect(const struct dlxd_fixture *f)
{
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

        ck_assert_int_ge(fd, 0);
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", f->socket);
        ck_assert_msg(connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0, "connect: %s",
                      strerror(errno));
        return fd;
}

long fx_wait_leases(dlx_client *c, unsigned long long n, int timeout_ms)
{
        struct dlx_stats s;

        for (int waited = 0;; waited += 5) {
                ck_assert_int_eq(dlx_stats(c, &s), 0);
                if (s.leases == n || waited >= timeout_ms)
                        return (long)s.leases;
                fx_sleep_ms(5);
        }
}

DLManagedTensorVersioned *fx_alloc_f32(dlx_client *c, int64_t n)
{
        int64_t shape[1] = {n};
        DLTensor proto = {
                .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}, .shape = shape};
        DLManagedTensorVersioned *t = NULL;
        int err = dlx_alloc(c, &proto, &t);

        ck_assert_msg(err == 0, "dlx_alloc: %s (%s)", dlx_strerror(err), dlx_last_error());
        return t;
}

bool fx_vec_is(const DLManagedTensorVersioned *t, int64_t n, float base)
{
        const float *v =
                (const float *)((const char *)t->dl_tensor.data + t->dl_tensor.byte_offset);

        if (t->dl_tensor.ndim != 1 || t->dl_tensor.shape[0] != n)
                return false;
        for (int64_t i = 0; i < n; i++)
                if (v[i] != base + (float)i)
                        return false;
        return true;
}

DLManagedTensorVersioned *fx_vec_f32(dlx_client *c, int64_t n, float base)
{
        DLManagedTensorVersioned *t = fx_alloc_f32(c, n);

        for (int64_t i = 0; i < n; i++)
                ((float *)t->dl_tensor.data)[i] = base + (float)i;
        return t;
}

struct counted {
        DLManagedTensorVersioned mt;
        DLManagedTensorVersioned *inner;
        int *count;
};

static void counted_deleter(DLManagedTensorVersioned *t)
{
        struct counted *w = t->manager_ctx;

        __atomic_add_fetch(w->count, 1, __ATOMIC_SEQ_CST);
        w->inner->deleter(w->inner);
        free(w);
}

DLManagedTensorVersioned *fx_counted(DLManagedTensorVersioned *inner, int *count)
{
        struct counted *w = calloc(1, sizeof(*w));

        ck_assert_ptr_nonnull(w);
        w->mt = *inner;
        w->mt.manager_ctx = w;
        w->mt.deleter = counted_deleter;
        w->inner = inner;
        w->count = count;
        return &w->mt;
}

void publish_ok(dlx_client *c, const char *name, DLManagedTensorVersioned *t,
                const struct dlx_publish_options *o, uint64_t *ret_version)
{
        int err = dlx_publish(c, name, t, o, ret_version);

        ck_assert_msg(err == 0, "publish %s: %s (%s)", name, dlx_strerror(err), dlx_last_error());
}

DLManagedTensorVersioned *acquire_ok(dlx_client *c, const char *name,
                                     const struct dlx_acquire_options *o)
{
        DLManagedTensorVersioned *t = NULL;
        int err = dlx_acquire(c, name, o, &t);

        ck_assert_msg(err == 0, "acquire %s: %s (%s)", name, dlx_strerror(err), dlx_last_error());
        return t;
}

void expect_last_error(const char *what)
{
        ck_assert_msg(strstr(dlx_last_error(), what), "message '%s' does not say '%s'",
                      dlx_last_error(), what);
}

struct plain {
        DLManagedTensorVersioned mt;
        int64_t shape[1];
        int *deleted;
        float data[];
};

static void plain_deleter(DLManagedTensorVersioned *t)
{
        struct plain *p = t->manager_ctx;

        if (p->deleted)
                __atomic_add_fetch(p->deleted, 1, __ATOMIC_SEQ_CST);
        free(p);
}

DLManagedTensorVersioned *fx_plain_f32(int64_t n, float base, int *deleted)
{
        struct plain *p = calloc(1, sizeof(*p) + (size_t)n * sizeof(float));

        ck_assert_ptr_nonnull(p);
        for (int64_t i = 0; i < n; i++)
                p->data[i] = base + (float)i;
        p->shape[0] = n;
        p->deleted = deleted;
        p->mt.version.major = 1;
        p->mt.version.minor = 3;
        p->mt.manager_ctx = p;
        p->mt.deleter = plain_deleter;
        p->mt.dl_tensor = (DLTensor){.data = p->data,
                                     .device = {kDLCPU, 0},
                                     .ndim = 1,
                                     .dtype = {kDLFloat, 32, 1},
                                     .shape = p->shape};
        return &p->mt;
}

struct dlx_stats fx_stats(dlx_client *c)
{
        struct dlx_stats st;
        int err = dlx_stats(c, &st);

        ck_assert_msg(err == 0, "stats: %s (%s)", dlx_strerror(err), dlx_last_error());
        return st;
}

uint32_t fx_wait_clients(dlx_client *c, uint32_t n, int timeout_ms)
{
        int64_t deadline = fx_now_ms() + timeout_ms;
        uint32_t got;

        while ((got = fx_stats(c).clients) != n && fx_now_ms() < deadline)
                fx_sleep_ms(10);
        return got;
}

/* The daemon's soft RLIMIT_NOFILE, from /proc/<pid>/limits. */
static long daemon_fd_limit(const struct dlxd_fixture *f)
{
        char path[64], line[256];
        long soft = -1;
        FILE *in;

        snprintf(path, sizeof(path), "/proc/%d/limits", (int)f->pid);
        in = fopen(path, "re");
        ck_assert_ptr_nonnull(in);
        while (fgets(line, sizeof(line), in))
                if (strncmp(line, "Max open files", 14) == 0)
                        sscanf(line + 14, "%ld", &soft);
        fclose(in);
        ck_assert_int_gt(soft, 0);
        return soft;
}

long dlxd_start_fd_limit(struct dlxd_fixture *f, rlim_t limit)
{
        struct rlimit saved, low;
        long got;

        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
        dlxd_start(f, NULL);
        /* dlxd raises its soft limit to the hard one at start: cap both, from outside */
        low.rlim_cur = low.rlim_max = saved.rlim_cur < limit ? saved.rlim_cur : limit;
        ck_assert_int_eq(prlimit(f->pid, RLIMIT_NOFILE, &low, NULL), 0);
        got = daemon_fd_limit(f);
        return got > 70000 ? 70000 : got;
}

/* Stops the daemon (SIGSTOP) and waits until it is stopped. */
void fx_stop_daemon(const struct dlxd_fixture *f)
{
        char path[64], buf[512], *p;
        ssize_t n;
        int fd;

        ck_assert_int_eq(kill(f->pid, SIGSTOP), 0);
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)f->pid);
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

uint32_t track_ok(dlx_client *c, const char *name)
{
        uint32_t t = 0;
        int err = dlx_track(c, name, &t);

        ck_assert_msg(err == 0, "dlx_track %s: %s (%s)", name, dlx_strerror(err), dlx_last_error());
        ck_assert_uint_ne(t, 0);
        return t;
}

uint64_t tracked_version(dlx_client *c, uint32_t track)
{
        uint64_t v = ~0ull;
        int err = dlx_track_version(c, track, &v);

        ck_assert_msg(err == 0, "dlx_track_version: %s (%s)", dlx_strerror(err), dlx_last_error());
        return v;
}
