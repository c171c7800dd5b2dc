/* SPDX-License-Identifier: MIT */
/*
 * A second reader's attacks on dlxd as an operated service: socket
 * activation (promise 1), Type=notify and journald (promise 2), the
 * Prometheus metrics (promise 3) and the metrics file (promise 4), as the
 * issue, `dlxd --help`, `dlxctl --help` and dlx_metrics() in dlx.h promise
 * them. Each test names the promise it checks.
 *
 * Other uids are played by forked children that drop to other uids (root
 * needed: those tests skip otherwise). Notifications go to a test-owned
 * datagram socket (NOTIFY_SOCKET).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "rawpeer.h"

#define NOBODY 65534
#define NOGROUP 65534

/* ---- a daemon started as systemd starts it ------------------------------------------------ */

/* unit_spawn() runs dlxd as this uid (group NOGROUP) when not 0. */
static uid_t spawn_as;

struct unit {
        char dir[64];
        char socket[108]; /* the listening socket's path */
        char notify[108]; /* the notification socket's path */
        char log[128];    /* dlxd's stderr */
        int notify_fd;    /* bound datagram socket the test reads */
        pid_t pid;
};

/*
 * A failing check ends the test's process at once (_exit): what it started
 * (a unit's dlxd, directories) is ended and removed by ops_cleanup(), the
 * test case's unchecked teardown in the runner. Every directory a test
 * makes is named after the runner ("/tmp/dlx-ops-<runner pid>-..."); a
 * unit's dlxd leaves its pid in a file "pid" in its directory.
 */
static pid_t runner_pid;

static void ops_setup(void)
{
        runner_pid = getpid();
        fx_reaper_init();
}

static void ops_cleanup(void)
{
        char prefix[64], path[400], cmd[512], exe[64], link[400];
        struct dirent *e;
        DIR *d;

        fx_reaper_run();
        snprintf(prefix, sizeof(prefix), "dlx-ops-%d-", (int)runner_pid);
        d = opendir("/tmp");
        while (d && (e = readdir(d))) {
                FILE *f;
                int pid = 0;
                ssize_t n;
                if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
                        continue;
                snprintf(path, sizeof(path), "/tmp/%s/pid", e->d_name);
                f = fopen(path, "r");
                if (f && fscanf(f, "%d", &pid) == 1 && pid > 0) {
                        /* only if that pid is still a dlxd */
                        snprintf(exe, sizeof(exe), "/proc/%d/exe", pid);
                        n = readlink(exe, link, sizeof(link) - 1);
                        if (n > 0) {
                                link[n] = '\0';
                                if (strstr(link, "dlxd"))
                                        kill(pid, SIGKILL);
                        }
                }
                if (f)
                        fclose(f);
                snprintf(cmd, sizeof(cmd), "rm -rf '/tmp/%.300s'", e->d_name);
                (void)!system(cmd);
        }
        if (d)
                closedir(d);
}

/* A directory of the test's own in /tmp (see ops_cleanup()); the test fails without. */
static void make_dir(char *buf, size_t len)
{
        snprintf(buf, len, "/tmp/dlx-ops-%d-XXXXXX", (int)(runner_pid ? runner_pid : getpid()));
        ck_assert_ptr_nonnull(mkdtemp(buf));
}

static void unit_done(struct unit *u);

static void unit_init(struct unit *u)
{
        struct sockaddr_un a = {.sun_family = AF_UNIX};

        memset(u, 0, sizeof(*u));
        make_dir(u->dir, sizeof(u->dir));
        snprintf(u->socket, sizeof(u->socket), "%s/dlxd.sock", u->dir);
        snprintf(u->notify, sizeof(u->notify), "%s/notify", u->dir);
        snprintf(u->log, sizeof(u->log), "%s/dlxd.log", u->dir);
        u->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(u->notify_fd, 0);
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", u->notify);
        ck_assert_int_eq(bind(u->notify_fd, (struct sockaddr *)&a, sizeof(a)), 0);
}

static int unix_listener_at(const char *path, int backlog)
{
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

        ck_assert_int_ge(fd, 0);
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        ck_assert_int_eq(listen(fd, backlog), 0);
        return fd;
}

/*
 * Runs dlxd with fds[0..nfds) as fds 3.. and LISTEN_FDS/LISTEN_PID (its own
 * pid; nfds -1: LISTEN_FDS=1 and fd 3 closed), NOTIFY_SOCKET u->notify unless
 * env sets another, env added, args
 * after its own, stderr to u->log (opened without truncating when it is
 * there: JOURNAL_STREAM names its inode).
 */
static void unit_spawn(struct unit *u, const int *fds, int nfds, const char *const *env,
                       const char *const *args)
{
        const char *dlxd = getenv("DLXD");

        sigset_t term, old;

        ck_assert_ptr_nonnull(dlxd);
        /* the child takes SIGTERM and SIGINT by their default actions, even before exec */
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        sigaddset(&term, SIGINT);
        sigprocmask(SIG_BLOCK, &term, &old);
        u->pid = fork();
        if (u->pid == 0) {
                signal(SIGTERM, SIG_DFL);
                signal(SIGINT, SIG_DFL);
                sigprocmask(SIG_SETMASK, &old, NULL);
        } else {
                char pidfile[128];
                FILE *f;
                sigprocmask(SIG_SETMASK, &old, NULL);
                snprintf(pidfile, sizeof(pidfile), "%s/pid", u->dir);
                f = fopen(pidfile, "w");
                if (f) {
                        fprintf(f, "%d\n", (int)u->pid);
                        fclose(f);
                }
        }
        ck_assert_int_ge(u->pid, 0);
        if (u->pid == 0) {
                const char *argv[64];
                char words[512], num[32];
                int n = 0, err = open(u->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
                int moved[8];

                if (err < 0 || dup2(err, 2) < 0)
                        _exit(127);
                for (int i = 0; i < nfds; i++)
                        if ((moved[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100)) < 0)
                                _exit(127);
                for (int i = 0; i < nfds; i++)
                        if (dup2(moved[i], 3 + i) < 0)
                                _exit(127);
                if (nfds < 0) {
                        /* LISTEN_FDS=1, but fd 3 is not open */
                        close(3);
                        nfds = 1;
                        snprintf(num, sizeof(num), "%d", nfds);
                        setenv("LISTEN_FDS", num, 1);
                        snprintf(num, sizeof(num), "%d", (int)getpid());
                        setenv("LISTEN_PID", num, 1);
                } else if (nfds) {
                        snprintf(num, sizeof(num), "%d", nfds);
                        setenv("LISTEN_FDS", num, 1);
                        snprintf(num, sizeof(num), "%d", (int)getpid());
                        setenv("LISTEN_PID", num, 1);
                }
                setenv("NOTIFY_SOCKET", u->notify, 1);
                unsetenv("DLX_SOCKET");
                unsetenv("JOURNAL_STREAM");
                unsetenv("WATCHDOG_USEC");
                unsetenv("WATCHDOG_PID");
                for (int i = 0; env && env[i]; i++)
                        putenv((char *)env[i]);
                if (spawn_as &&
                    (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(spawn_as) != 0))
                        _exit(126);
                n = fx_daemon_argv(argv, words, sizeof(words));
                argv[n++] = "--log-level";
                argv[n++] = "info";
                for (int i = 0; args && args[i] && n < 63; i++)
                        argv[n++] = args[i];
                argv[n] = NULL;
                execvp(argv[0], (char *const *)argv);
                _exit(127);
        }
}

static bool next_note_fd(int fd, char *buf, size_t len, int timeout_ms)
{
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n;

        if (poll(&p, 1, timeout_ms < 0 ? 0 : timeout_ms * fx_slowdown()) != 1)
                return false;
        n = recv(fd, buf, len - 1, 0);
        ck_assert_int_gt(n, 0);
        buf[n] = '\0';
        return true;
}

static bool next_note(struct unit *u, char *buf, size_t len, int timeout_ms)
{
        return next_note_fd(u->notify_fd, buf, len, timeout_ms);
}

static void expect_note_fd(int fd, const char *what, char *buf, size_t len, int timeout_ms)
{
        int64_t end = fx_now_ms() + (int64_t)timeout_ms * fx_slowdown();

        buf[0] = '\0';
        while (fx_now_ms() < end)
                if (next_note_fd(fd, buf, len, (int)(end - fx_now_ms()))) {
                        if (getenv("DLX_OPS_DEBUG"))
                                fprintf(stderr, "%lld note: %s\n", (long long)fx_now_ms(), buf);
                        if (strstr(buf, what))
                                return;
                }
        ck_abort_msg("no notification with '%s' in %d ms (last: '%s')", what, timeout_ms, buf);
}

static void expect_note(struct unit *u, const char *what, char *buf, size_t len, int timeout_ms)
{
        expect_note_fd(u->notify_fd, what, buf, len, timeout_ms);
}

static char *slurp(const char *path)
{
        static char buf[1 << 20];
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        size_t off = 0;
        ssize_t n = 0;

        while (fd >= 0 && off < sizeof(buf) - 1 &&
               (n = read(fd, buf + off, sizeof(buf) - 1 - off)) > 0)
                off += (size_t)n;
        if (fd >= 0)
                close(fd);
        buf[off] = '\0';
        return buf;
}

static int unit_wait(struct unit *u)
{
        int status;

        ck_assert_int_eq(waitpid(u->pid, &status, 0), u->pid);
        u->pid = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Waits up to ms for u's dlxd to end; its status as unit_wait(), or -1 if it still runs. */
static int unit_wait_ms(struct unit *u, int ms)
{
        int64_t end = fx_now_ms() + (int64_t)ms * fx_slowdown();
        int status;

        for (;;) {
                pid_t r = waitpid(u->pid, &status, WNOHANG);
                if (r == u->pid) {
                        u->pid = 0;
                        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                }
                if (fx_now_ms() >= end)
                        return -1;
                fx_sleep_ms(5);
        }
}

static void unit_stop(struct unit *u)
{
        char note[512];

        ck_assert_int_eq(kill(u->pid, SIGTERM), 0);
        expect_note(u, "STOPPING=1", note, sizeof(note), 10000);
        ck_assert_msg(unit_wait(u) == 0, "dlxd exited non-zero: %s", slurp(u->log));
}

/* Removes everything in u->dir (files only) and the directory. */
static void unit_done(struct unit *u)
{
        DIR *d;
        struct dirent *e;
        char path[400];

        if (u->pid > 0) {
                kill(u->pid, SIGKILL);
                waitpid(u->pid, NULL, 0);
                u->pid = 0;
        }
        if (u->notify_fd >= 0)
                close(u->notify_fd);
        u->notify_fd = -1;
        d = opendir(u->dir);
        while (d && (e = readdir(d)))
                if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                        snprintf(path, sizeof(path), "%s/%s", u->dir, e->d_name);
                        if (unlink(path) < 0)
                                rmdir(path);
                }
        if (d)
                closedir(d);
        rmdir(u->dir);
}

static dlx_client *connect_to(const char *path, int timeout_ms)
{
        struct dlx_connect_options o = {.socket_path = path,
                                        .client_name = "ops-attack",
                                        .timeout_ms = timeout_ms * fx_slowdown()};
        dlx_client *c = NULL;

        ck_assert_msg(dlx_connect(&o, &c) == 0, "connect to %s: %s", path, dlx_last_error());
        return c;
}

static void publish_vec(dlx_client *c, const char *name)
{
        struct dlx_publish_options o = {.persist = true};

        publish_ok(c, name, fx_vec_f32(c, 16, 1.0f), &o, NULL);
}

/* The JOURNAL_STREAM value naming u->log (made first, so that its inode is known). */
static void journal_env(struct unit *u, char *env, size_t len)
{
        struct stat st;

        close(open(u->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
        ck_assert_int_eq(stat(u->log, &st), 0);
        snprintf(env, len, "JOURNAL_STREAM=%llu:%llu", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino);
}

/* Every line of text starts with "<N>" (N a digit 0-7); else the test fails, showing it. */
static void every_line_prefixed(const char *text)
{
        const char *p = text;

        while (*p) {
                const char *nl = strchr(p, '\n');
                size_t n = nl ? (size_t)(nl - p) : strlen(p);
                ck_assert_msg(n >= 3 && p[0] == '<' && p[1] >= '0' && p[1] <= '7' && p[2] == '>',
                              "a log line under journald without its priority: '%.*s'\n"
                              "(whole log: %s)",
                              (int)n, p, text);
                p += n + (nl ? 1 : 0);
        }
}

/* ---- the metrics text --------------------------------------------------------------------- */

/* The value of the series line that starts with series (name and labels), or -1. */
static long long series(const char *text, const char *name)
{
        size_t len = strlen(name);

        for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
                if (strncmp(p, name, len) == 0 && p[len] == ' ')
                        return strtoll(p + len + 1, NULL, 10);
        return -1;
}

/* The lines of text that contain what and do not start with '#' and end in " 0" (at most 2 KiB). */
static const char *lines_with(const char *text, const char *what)
{
        static char buf[2048];
        size_t off = 0;

        buf[0] = '\0';
        for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
                const char *nl = strchr(p, '\n');
                size_t n = nl ? (size_t)(nl - p) : strlen(p);
                if (*p == '#' || (n >= 2 && p[n - 2] == ' ' && p[n - 1] == '0'))
                        continue;
                if (memmem(p, n, what, strlen(what)) && off + n + 2 < sizeof(buf)) {
                        memcpy(buf + off, p, n);
                        off += n;
                        buf[off++] = '\n';
                        buf[off] = '\0';
                }
        }
        return buf;
}

/* series() with a missing series read as 0 (an error count never seen). */
static long long series0(const char *text, const char *name)
{
        long long v = series(text, name);

        return v < 0 ? 0 : v;
}

static double series_f(const char *text, const char *name)
{
        size_t len = strlen(name);

        for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
                if (strncmp(p, name, len) == 0 && p[len] == ' ')
                        return strtod(p + len + 1, NULL);
        return -1;
}

/*
 * A histogram's buckets are cumulative (never decreasing), the +Inf bucket
 * equals _count, and _sum is 0 exactly when _count is (else the test fails).
 */
static void histogram_consistent(const char *text, const char *name)
{
        char pat[128], line[160];
        long long prev = 0, inf, count;
        double sum;
        int buckets = 0;

        snprintf(pat, sizeof(pat), "%s_bucket{le=\"", name);
        for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
                if (strncmp(p, pat, strlen(pat)) != 0)
                        continue;
                const char *sp = strchr(p, ' ');
                long long v = strtoll(sp + 1, NULL, 10);
                snprintf(line, sizeof(line), "%.*s", (int)(sp - p), p);
                ck_assert_msg(v >= prev, "%s: %lld after %lld: not cumulative", line, v, prev);
                prev = v;
                buckets++;
        }
        snprintf(line, sizeof(line), "%s_bucket{le=\"+Inf\"}", name);
        inf = series(text, line);
        snprintf(line, sizeof(line), "%s_count", name);
        count = series(text, line);
        snprintf(line, sizeof(line), "%s_sum", name);
        sum = series_f(text, line);
        ck_assert_msg(buckets >= 2, "%s: %d buckets", name, buckets);
        ck_assert_msg(inf == count && prev == count, "%s: +Inf %lld, last %lld, _count %lld", name,
                      inf, prev, count);
        ck_assert_msg((count == 0) == (sum == 0.0) && sum >= 0, "%s: _sum %f with _count %lld",
                      name, sum, count);
}

static char *metrics_of(dlx_client *c)
{
        char *text = NULL;

        ck_assert_msg(dlx_metrics(c, &text) == 0, "dlx_metrics: %s", dlx_last_error());
        ck_assert_ptr_nonnull(text);
        histogram_consistent(text, "dlx_acquire_duration_seconds");
        histogram_consistent(text, "dlx_publish_duration_seconds");
        return text;
}

/* promtool check metrics on text, where promtool is found; the test fails on any complaint. */
static void promtool_ok(const char *text)
{
        const char *tool = getenv("DLX_PROMTOOL");
        char path[] = "/tmp/dlx-prom-XXXXXX", cmd[512], out[4096];
        FILE *p;
        size_t n, len = strlen(text);
        int fd, status;

        if (!tool || !*tool || access(tool, X_OK) != 0) {
                fprintf(stderr, "promtool not found (DLX_PROMTOOL): the text is not linted\n");
                return;
        }
        fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
        close(fd);
        snprintf(cmd, sizeof(cmd), "%s check metrics < %s 2>&1", tool, path);
        p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        status = pclose(p);
        unlink(path);
        ck_assert_msg(status == 0 && n == 0, "promtool check metrics: %s", out);
}

/* The raw peer reads answers until one with id comes (events skipped); returns its status. */
static int answer_of(int sock, uint64_t id, int timeout_ms)
{
        struct wire_reply rep;
        int64_t end = fx_now_ms() + (int64_t)timeout_ms * fx_slowdown();

        for (;;) {
                int left = (int)(end - fx_now_ms());
                int r = rp_read_answer(sock, &rep, left > 0 ? left : 1, NULL);
                ck_assert_msg(r == 1, "no answer to request %llu: %d", (unsigned long long)id, r);
                if (rep.id == id)
                        return rep.status;
        }
}

/* ==== 1. socket activation ================================================================= */

static int nobody_connects(void *arg)
{
        const char *path = arg;
        struct dlx_connect_options o = {.socket_path = path, .timeout_ms = 5000};
        dlx_client *c = NULL;
        int err;

        if (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(NOBODY) != 0)
                return 90;
        err = dlx_connect(&o, &c);
        if (c)
                dlx_close(c);
        if (err == 0)
                return 0;
        return err == -EACCES ? 1 : 2;
}

struct stranger {
        const char *path;
        uid_t uid;
        gid_t gid;
};

static int stranger_connects(void *arg)
{
        const struct stranger *s = arg;
        struct dlx_connect_options o = {.socket_path = s->path, .timeout_ms = 5000};
        dlx_client *c = NULL;
        int err;

        if (setgroups(0, NULL) != 0 || setgid(s->gid) != 0 || setuid(s->uid) != 0)
                return 90;
        err = dlx_connect(&o, &c);
        if (c) {
                if (dlx_ping(c) != 0)
                        err = -EIO;
                dlx_close(c);
        }
        if (err == 0)
                return 0;
        return err == -EACCES ? 1 : 2;
}

/*
 * Promise 1: the peer checks hold on an inherited socket. systemd's socket is
 * often 0666 (SocketMode=): dlxd itself must refuse another uid when private.
 */
START_TEST(activated_private_refuses_other_uid)
{
        struct unit u;
        char note[512];
        dlx_client *c;
        int lfd;

        if (geteuid() != 0) {
                fprintf(stderr, "skipped: needs root to play another uid\n");
                return;
        }
        unit_init(&u);
        ck_assert_int_eq(chmod(u.dir, 0755), 0);
        lfd = unix_listener_at(u.socket, 16);
        ck_assert_int_eq(chmod(u.socket, 0666), 0);
        unit_spawn(&u, &lfd, 1, NULL, NULL);
        close(lfd);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        /* uid nobody reaches the socket (0666), and dlxd refuses it itself */
        ck_assert_int_eq(fx_wait(fx_spawn(nobody_connects, u.socket)), 1);
        /* its own uid is served */
        c = connect_to(u.socket, 5000);
        ck_assert_int_eq(dlx_ping(c), 0);
        dlx_close(c);
        ck_assert_ptr_nonnull(strstr(slurp(u.log), "may not connect"));
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

/* Promise 1: --group on an inherited socket: that group's members, and only they, connect. */
START_TEST(activated_group_admits_only_members)
{
        struct unit u;
        char note[512];
        const char *args[] = {"--group", "65534", NULL};
        struct stranger member = {.uid = 64000, .gid = NOGROUP};
        struct stranger outsider = {.uid = 64001, .gid = 64001};
        int lfd;

        if (geteuid() != 0) {
                fprintf(stderr, "skipped: needs root to play another uid\n");
                return;
        }
        unit_init(&u);
        ck_assert_int_eq(chmod(u.dir, 0755), 0);
        lfd = unix_listener_at(u.socket, 16);
        ck_assert_int_eq(chmod(u.socket, 0666), 0);
        unit_spawn(&u, &lfd, 1, NULL, args);
        close(lfd);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        member.path = outsider.path = u.socket;
        ck_assert_int_eq(fx_wait(fx_spawn(stranger_connects, &member)), 0);
        ck_assert_int_eq(fx_wait(fx_spawn(stranger_connects, &outsider)), 1);
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

/*
 * Promise 1: the inherited listening socket may be bound to an abstract
 * address (ListenStream=@name): it is an AF_UNIX stream socket, served.
 */
START_TEST(activated_abstract_socket_serves)
{
        struct unit u;
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        struct wire_request req = {.id = 1, .type = WIRE_REQ_HELLO};
        char note[512];
        socklen_t alen;
        int lfd, sock, ring = -1;

        unit_init(&u);
        snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "dlx-ops-abstract-%d", (int)getpid());
        alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1));
        lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(lfd, 0);
        ck_assert_int_eq(bind(lfd, (struct sockaddr *)&a, alen), 0);
        ck_assert_int_eq(listen(lfd, 16), 0);
        unit_spawn(&u, &lfd, 1, NULL, NULL);
        close(lfd);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(sock, 0);
        ck_assert_int_eq(connect(sock, (struct sockaddr *)&a, alen), 0);
        req.hello.major = DLX_PROTO_MAJOR;
        req.hello.minor = DLX_PROTO_MINOR;
        snprintf(req.hello.client_name, sizeof(req.hello.client_name), "abstract");
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, 1, WIRE_REP_HELLO, NULL, &ring);
        if (ring >= 0)
                close(ring);
        rp_ping(sock, 2);
        close(sock);
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

static int early_client(void *arg)
{
        const char *path = arg;
        struct dlx_connect_options o = {.socket_path = path, .timeout_ms = 15000};
        dlx_client *c = NULL;
        int rc = 0;

        if (dlx_connect(&o, &c) != 0)
                return 1;
        if (dlx_ping(c) != 0)
                rc = 2;
        dlx_close(c);
        return rc;
}

/*
 * Promise 1: clients that connected (and sent their hello) to the socket
 * before dlxd started wait in its backlog: dlxd serves every one of them.
 * Then SIGINT: STOPPING=1, exit 0, and the socket file stays (systemd's).
 */
START_TEST(activated_serves_connections_queued_before_start)
{
        enum { EARLY = 8 };
        struct unit u;
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        struct wire_request req = {.id = 1, .type = WIRE_REQ_HELLO};
        char note[512];
        pid_t kids[EARLY];
        struct stat st;
        int lfd, raw, ring = -1;

        unit_init(&u);
        lfd = unix_listener_at(u.socket, 64);
        for (int i = 0; i < EARLY; i++)
                kids[i] = fx_spawn(early_client, u.socket);
        /* and a raw one whose hello is in the socket before dlxd exists */
        raw = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", u.socket);
        ck_assert_int_eq(connect(raw, (struct sockaddr *)&a, sizeof(a)), 0);
        req.hello.major = DLX_PROTO_MAJOR;
        req.hello.minor = DLX_PROTO_MINOR;
        snprintf(req.hello.client_name, sizeof(req.hello.client_name), "early-raw");
        rp_send(raw, &req, -1);
        fx_sleep_ms(300);
        unit_spawn(&u, &lfd, 1, NULL, NULL);
        close(lfd);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        rp_expect_ok(raw, 1, WIRE_REP_HELLO, NULL, &ring);
        if (ring >= 0)
                close(ring);
        rp_ping(raw, 2);
        close(raw);
        for (int i = 0; i < EARLY; i++)
                ck_assert_msg(fx_wait(kids[i]) == 0, "early client %d was not served", i);
        ck_assert_int_eq(kill(u.pid, SIGINT), 0);
        expect_note(&u, "STOPPING=1", note, sizeof(note), 10000);
        ck_assert_msg(unit_wait(&u) == 0, "dlxd exited non-zero: %s", slurp(u.log));
        ck_assert_int_eq(lstat(u.socket, &st), 0);
        ck_assert(S_ISSOCK(st.st_mode));
        unit_done(&u);
}
END_TEST

/* Runs dlxd with these fds passed; it must exit non-zero, its message naming what it got. */
static void expect_refused(const int *fds, int nfds, const char *words)
{
        struct unit u;
        char note[256];
        int rc;

        unit_init(&u);
        unit_spawn(&u, fds, nfds, NULL, NULL);
        rc = unit_wait_ms(&u, 10000);
        ck_assert_msg(rc > 0 && rc < 128, "dlxd passed %s: status %d (log: %s)", words, rc,
                      slurp(u.log));
        ck_assert_msg(strstr(slurp(u.log), words), "refusal without '%s': %s", words, slurp(u.log));
        ck_assert_msg(!next_note(&u, note, sizeof(note), 0), "a notification: %s", note);
        unit_done(&u);
}

/* Promise 1: anything but an AF_UNIX stream listener is refused clearly. */
START_TEST(refuses_seqpacket_and_closed_fd)
{
        struct unit other;
        int fd;

        unit_init(&other);
        /* a listening AF_UNIX seqpacket socket: AF_UNIX and listening, not a stream */
        {
                struct sockaddr_un a = {.sun_family = AF_UNIX};
                fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
                ck_assert_int_ge(fd, 0);
                snprintf(a.sun_path, sizeof(a.sun_path), "%s", other.socket);
                ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
                ck_assert_int_eq(listen(fd, 4), 0);
        }
        expect_refused(&fd, 1, "seqpacket");
        close(fd);
        unit_done(&other);
        /* LISTEN_FDS=1 naming fd 3, which is not open: refused, not served on something else */
        expect_refused(NULL, -1, "descriptor");
}
END_TEST

/* ==== 2. notification ====================================================================== */

/* Promise 2: READY=1 means served: a client connecting right then is served at once. */
START_TEST(ready_means_served)
{
        for (int round = 0; round < 4; round++) {
                struct unit u;
                char note[512], own[160];
                const char *args[] = {"--socket", own, NULL};
                dlx_client *c;
                int lfd;

                unit_init(&u);
                snprintf(own, sizeof(own), "%s/own.sock", u.dir);
                if (round % 2) {
                        lfd = unix_listener_at(u.socket, 16);
                        unit_spawn(&u, &lfd, 1, NULL, NULL);
                        close(lfd);
                } else {
                        unit_spawn(&u, NULL, 0, NULL, args);
                }
                expect_note(&u, "READY=1", note, sizeof(note), 10000);
                /* no retries: the socket answers now */
                c = connect_to(round % 2 ? u.socket : own, 1000);
                ck_assert_int_eq(dlx_ping(c), 0);
                dlx_close(c);
                unit_stop(&u);
                unit_done(&u);
        }
}
END_TEST

/*
 * Promise 2: SIGTERM arriving at any moment before READY. dlxd stops (exit 0,
 * or the signal's default action before it watches signals), never says
 * READY=1 after STOPPING=1, says STOPPING=1 after any READY=1, and leaves no
 * socket file and no metrics file of its own behind.
 */
START_TEST(sigterm_before_ready)
{
        int readies = 0;

        /* valgrind takes a signal that comes during its own start-up for itself */
        if (getenv("DLX_TEST_VALGRIND")) {
                fprintf(stderr, "sigterm_before_ready: skipped under valgrind\n");
                return;
        }
        /* every 40 us from 0 to 6.4 ms: before exec, before the socket, before the handlers... */
        for (int i = 0; i < 160; i++) {
                int delay_us = i * 40;
                struct unit u;
                char note[512], own[160], prom[160];
                const char *args[] = {"--socket", own, "--metrics-file", prom, NULL};
                bool ready = false, stopping = false;
                int rc;

                unit_init(&u);
                snprintf(own, sizeof(own), "%s/own.sock", u.dir);
                snprintf(prom, sizeof(prom), "%s/dlx.prom", u.dir);
                unit_spawn(&u, NULL, 0, NULL, args);
                if (delay_us)
                        usleep((useconds_t)delay_us);
                ck_assert_int_eq(kill(u.pid, SIGTERM), 0);
                rc = unit_wait_ms(&u, 10000);
                ck_assert_msg(rc == 0 || rc == 128 + SIGTERM,
                              "SIGTERM after %d us: status %d (log: %s)", delay_us, rc,
                              slurp(u.log));
                while (next_note(&u, note, sizeof(note), 0)) {
                        if (strstr(note, "READY=1")) {
                                ck_assert_msg(!stopping, "READY=1 after STOPPING=1 (%d us)",
                                              delay_us);
                                ready = true;
                        }
                        if (strstr(note, "STOPPING=1"))
                                stopping = true;
                }
                ck_assert_msg(!ready || stopping, "READY=1 without STOPPING=1 (%d us)", delay_us);
                readies += ready;
                ck_assert_msg(access(own, F_OK) != 0,
                              "SIGTERM %d us after start left its socket file (status %d)",
                              delay_us, rc);
                ck_assert_msg(access(prom, F_OK) != 0,
                              "SIGTERM %d us after start left the metrics file (status %d)",
                              delay_us, rc);
                unit_done(&u);
        }
        fprintf(stderr, "sigterm_before_ready: %d of the starts got to READY=1\n", readies);
}
END_TEST

/* Promise 2: a NOTIFY_SOCKET that does not exist: dlxd serves all the same, and stops 0. */
START_TEST(missing_notify_socket_still_serves)
{
        struct unit u;
        char own[160], env_notify[200];
        const char *args[] = {"--socket", own, NULL};
        const char *env[] = {env_notify, "WATCHDOG_USEC=100000", NULL};
        dlx_client *c = NULL;
        int err = -1;

        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        snprintf(env_notify, sizeof(env_notify), "NOTIFY_SOCKET=%s/no/such/notify", u.dir);
        unit_spawn(&u, NULL, 0, env, args);
        for (int i = 0; i < 200 * fx_slowdown() && err != 0; i++) {
                struct dlx_connect_options o = {.socket_path = own, .timeout_ms = 2000};
                fx_sleep_ms(25);
                err = dlx_connect(&o, &c);
        }
        ck_assert_msg(err == 0, "never served: %s (log: %s)", dlx_last_error(), slurp(u.log));
        publish_vec(c, "ops/nonotify");
        fx_sleep_ms(400); /* a few keep-alives with nobody to hear them */
        ck_assert_int_eq(dlx_ping(c), 0);
        ck_assert_int_eq(dlx_unpublish(c, "ops/nonotify"), 0);
        dlx_close(c);
        ck_assert_int_eq(kill(u.pid, SIGTERM), 0);
        ck_assert_msg(unit_wait_ms(&u, 10000) == 0, "log: %s", slurp(u.log));
        unit_done(&u);
}
END_TEST

/*
 * Promise 2: the notification socket may be abstract ("@name"), and a
 * notification socket replaced under the same path (a second one) gets the
 * keep-alives from then on.
 */
START_TEST(abstract_and_replaced_notify_sockets)
{
        struct unit u;
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        char note[512], own[160], env_notify[160];
        const char *args[] = {"--socket", own, NULL};
        const char *env[] = {env_notify, "WATCHDOG_USEC=200000", NULL};
        socklen_t alen;
        int abs_fd, second;

        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        /* abstract */
        abs_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "dlx-ops-notify-%d", (int)getpid());
        alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1));
        ck_assert_int_eq(bind(abs_fd, (struct sockaddr *)&a, alen), 0);
        snprintf(env_notify, sizeof(env_notify), "NOTIFY_SOCKET=@%s", a.sun_path + 1);
        unit_spawn(&u, NULL, 0, env, args);
        expect_note_fd(abs_fd, "READY=1", note, sizeof(note), 10000);
        expect_note_fd(abs_fd, "WATCHDOG=1", note, sizeof(note), 2000);
        ck_assert_int_eq(kill(u.pid, SIGTERM), 0);
        expect_note_fd(abs_fd, "STOPPING=1", note, sizeof(note), 10000);
        ck_assert_int_eq(unit_wait_ms(&u, 10000), 0);
        close(abs_fd);

        /* a path socket, replaced by a second one while dlxd runs */
        unit_spawn(&u, NULL, 0, (const char *[]){"WATCHDOG_USEC=200000", NULL}, args);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        close(u.notify_fd);
        ck_assert_int_eq(unlink(u.notify), 0);
        second = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        memset(&a, 0, sizeof(a));
        a.sun_family = AF_UNIX;
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", u.notify);
        ck_assert_int_eq(bind(second, (struct sockaddr *)&a, sizeof(a)), 0);
        u.notify_fd = second;
        expect_note(&u, "WATCHDOG=1", note, sizeof(note), 2000);
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

static int pinger(void *arg)
{
        const char *path = arg;
        dlx_client *c = connect_to(path, 5000);
        int64_t end = fx_now_ms() + 5000;

        while (fx_now_ms() < end)
                if (dlx_ping(c) != 0)
                        return 1;
        dlx_close(c);
        return 0;
}

/*
 * Collects WATCHDOG=1 arrival times for ms, as the kernel stamped them
 * (SO_TIMESTAMPNS: the test's own scheduling does not count); returns the
 * largest gap between two, in ms.
 */
static int64_t watchdog_gaps(struct unit *u, int ms, int *count)
{
        int64_t end = fx_now_ms() + ms, last = -1, worst = 0;
        int on = 1;

        ck_assert_int_eq(setsockopt(u->notify_fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on)), 0);
        *count = 0;
        while (fx_now_ms() < end) {
                struct pollfd p = {.fd = u->notify_fd, .events = POLLIN};
                char note[256], ctl[CMSG_SPACE(sizeof(struct timespec))];
                struct iovec iov = {.iov_base = note, .iov_len = sizeof(note) - 1};
                struct msghdr mh = {.msg_iov = &iov,
                                    .msg_iovlen = 1,
                                    .msg_control = ctl,
                                    .msg_controllen = sizeof(ctl)};
                struct cmsghdr *cm;
                int64_t at = -1;
                ssize_t n;

                if (poll(&p, 1, (int)(end - fx_now_ms())) != 1)
                        continue;
                n = recvmsg(u->notify_fd, &mh, 0);
                ck_assert_int_gt(n, 0);
                note[n] = '\0';
                for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
                        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS) {
                                struct timespec ts;
                                memcpy(&ts, CMSG_DATA(cm), sizeof(ts));
                                at = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
                        }
                ck_assert_int_ge(at, 0);
                if (strcmp(note, "WATCHDOG=1") != 0)
                        continue;
                if (last >= 0 && at - last > worst)
                        worst = at - last;
                last = at;
                (*count)++;
        }
        return worst;
}

/*
 * Promise 2: WATCHDOG=1 at half of WATCHDOG_USEC, so that no keep-alive is
 * ever a whole WatchdogSec late (systemd would kill dlxd then): here one
 * every 30 ms of 60, over 5 s while a client keeps dlxd busy, timed by the
 * kernel's receive stamps. A keep-alive skipped shows as a gap of 60 ms.
 */
START_TEST(watchdog_never_misses_a_period)
{
        struct unit u;
        char note[512], own[160];
        const char *args[] = {"--socket", own, NULL};
        const char *env[] = {"WATCHDOG_USEC=60000", NULL};
        int64_t worst;
        int n;
        pid_t kid;

        if (fx_slowdown() > 1) {
                fprintf(stderr, "skipped: timing under a slow wrapper\n");
                return;
        }
        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        unit_spawn(&u, NULL, 0, env, args);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        kid = fx_spawn(pinger, own);
        worst = watchdog_gaps(&u, 5000, &n);
        ck_assert_int_eq(fx_wait(kid), 0);
        ck_assert_msg(worst < 55,
                      "a keep-alive %lld ms after the one before (WatchdogSec 60 ms), %d in 5 s",
                      (long long)worst, n);
        ck_assert_msg(n >= 120, "%d keep-alives in 5 s at a period of 30 ms", n);
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

/*
 * Promise 2: keep-alives at half the period also beside a metrics file
 * rewritten every second: WATCHDOG_USEC 2.4 s means one every 1.2 s.
 */
START_TEST(watchdog_half_period_beside_metrics_file)
{
        struct unit u;
        char note[512], own[160], prom[160];
        const char *args[] = {"--socket", own, "--metrics-file", prom, "--metrics-interval",
                              "1",        NULL};
        const char *env[] = {"WATCHDOG_USEC=2400000", NULL};
        int64_t worst;
        int n;

        if (fx_slowdown() > 1) {
                fprintf(stderr, "skipped: timing under a slow wrapper\n");
                return;
        }
        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        snprintf(prom, sizeof(prom), "%s/dlx.prom", u.dir);
        unit_spawn(&u, NULL, 0, env, args);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        worst = watchdog_gaps(&u, 5000, &n);
        ck_assert_msg(worst <= 1500,
                      "keep-alives %lld ms apart with WATCHDOG_USEC=2400000 (half: 1200 ms), %d "
                      "in 5 s",
                      (long long)worst, n);
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

/*
 * Promise 2: a notification socket that nobody reads (a wedged manager, a
 * full queue) must not stop dlxd serving: keep-alives every millisecond
 * (WATCHDOG_USEC=2000) fill its queue within a second; a client then.
 */
START_TEST(unread_notify_socket_does_not_stall_serving)
{
        struct unit u;
        char own[160];
        const char *args[] = {"--socket", own, NULL};
        const char *env[] = {"WATCHDOG_USEC=2000", NULL};
        struct dlx_connect_options o = {.socket_path = own, .timeout_ms = 3000};
        dlx_client *c = NULL;
        int err = -1;

        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        unit_spawn(&u, NULL, 0, env, args);
        /* the test reads nothing from u.notify_fd */
        for (int i = 0; i < 200 && access(own, F_OK) != 0; i++)
                fx_sleep_ms(10);
        fx_sleep_ms(2000);
        err = dlx_connect(&o, &c);
        ck_assert_msg(err == 0, "dlxd no longer serves while its notification socket is full: %s",
                      dlx_last_error());
        ck_assert_int_eq(dlx_ping(c), 0);
        dlx_close(c);
        ck_assert_int_eq(kill(u.pid, SIGTERM), 0);
        ck_assert_msg(unit_wait_ms(&u, 5000) == 0, "dlxd did not stop on SIGTERM in 5 s");
        unit_done(&u);
}
END_TEST

/*
 * Promise 2: the STATUS= line is kept up to date: clients leaving and names
 * going show within a few seconds.
 */
START_TEST(status_follows_clients_and_names)
{
        struct unit u;
        char note[512], own[160];
        const char *args[] = {"--socket", own, NULL};
        dlx_client *a, *b;

        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        unit_spawn(&u, NULL, 0, NULL, args);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        a = connect_to(own, 5000);
        b = connect_to(own, 5000);
        publish_vec(a, "ops/s1");
        publish_vec(b, "ops/s2");
        publish_vec(b, "ops/s3");
        expect_note(&u, "STATUS=3 names, 2 clients", note, sizeof(note), 8000);
        ck_assert_int_eq(dlx_unpublish(b, "ops/s3"), 0);
        dlx_close(a);
        expect_note(&u, "STATUS=2 names, 1 clients", note, sizeof(note), 8000);
        ck_assert_int_eq(dlx_unpublish(b, "ops/s1"), 0);
        ck_assert_int_eq(dlx_unpublish(b, "ops/s2"), 0);
        dlx_close(b);
        expect_note(&u, "STATUS=0 names, 0 clients, 0 B held", note, sizeof(note), 8000);
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

/*
 * Promise 2: under journald every line dlxd writes starts with "<N>", its
 * refusal of a passed socket included.
 */
START_TEST(journal_prefix_on_refusal)
{
        struct unit u;
        char env_js[64];
        const char *env[] = {env_js, NULL};
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        int rc;

        unit_init(&u);
        journal_env(&u, env_js, sizeof(env_js));
        unit_spawn(&u, &fd, 1, env, NULL);
        close(fd);
        rc = unit_wait_ms(&u, 10000);
        ck_assert_msg(rc > 0 && rc < 128, "status %d", rc);
        ck_assert_ptr_nonnull(strstr(slurp(u.log), "datagram"));
        every_line_prefixed(slurp(u.log));
        unit_done(&u);
}
END_TEST

/*
 * Promise 2: under journald every line starts with "<N>", also where what is
 * logged (a socket path: any byte but NUL may be in it) holds a newline.
 */
START_TEST(journal_prefix_with_newline_in_path)
{
        struct unit u;
        char note[512], env_js[64], own[160];
        const char *args[] = {"--socket", own, NULL};
        const char *env[] = {env_js, NULL};

        unit_init(&u);
        snprintf(own, sizeof(own), "%s/a\nb.sock", u.dir);
        journal_env(&u, env_js, sizeof(env_js));
        unit_spawn(&u, NULL, 0, env, args);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        unit_stop(&u);
        ck_assert_ptr_nonnull(strstr(slurp(u.log), "listening on"));
        every_line_prefixed(slurp(u.log));
        unit_done(&u);
}
END_TEST

/* ==== 3. metrics =========================================================================== */

static const char *const shared_args[] = {"--group", "65534", NULL};

/*
 * Promise 3: an acquire whose name is invalid is still an acquire: counted
 * by its type, its error by type and status, and timed as an answer.
 */
START_TEST(metrics_bad_request_counted_by_its_type)
{
        struct wire_request req;
        dlx_client *c;
        char *m0, *m1;
        int sock;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "counter");
        sock = rp_connect(fx.socket, "bad-names");
        m0 = metrics_of(c);
        rp_acquire_req(&req, 2, "bad//name");
        rp_send(sock, &req, -1);
        ck_assert_int_eq(answer_of(sock, 2, 5000), WIRE_INVALID);
        rp_ping(sock, 3); /* the connection lives on */
        m1 = metrics_of(c);
        promtool_ok(m1);
        ck_assert_msg(series0(m1, "dlx_requests_total{type=\"acquire\"}") -
                                      series0(m0, "dlx_requests_total{type=\"acquire\"}") ==
                              1,
                      "an acquire with a bad name is not counted as an acquire:\n%s",
                      lines_with(m1, "dlx_request"));
        ck_assert_msg(
                series0(m1, "dlx_request_errors_total{type=\"acquire\",status=\"invalid\"}") == 1,
                "its error is not counted as an acquire's:\n%s", lines_with(m1, "errors_total{"));
        ck_assert_int_eq(series(m1, "dlx_acquire_duration_seconds_count") -
                                 series(m0, "dlx_acquire_duration_seconds_count"),
                         1);
        free(m0);
        free(m1);
        close(sock);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Promise 3: pipelined requests, every one counted once by its type, every
 * error once by type and status, every acquire answered timed once.
 */
START_TEST(metrics_exact_for_pipelined_requests)
{
        enum { N = 25 };
        struct wire_request req;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        dlx_client *c;
        char *m0, *m1;
        uint64_t id = 10;
        int sock;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "counter");
        publish_vec(c, "ops/there");
        sock = rp_connect(fx.socket, "pipeliner");
        m0 = metrics_of(c);
        for (int i = 0; i < N; i++) {
                memset(&req, 0, sizeof(req));
                req.id = id++;
                req.type = WIRE_REQ_PING;
                req.ping.nonce = (uint64_t)i;
                rp_frame_append(&buf, &len, &cap, &req);
                rp_acquire_req(&req, id++, "ops/missing");
                rp_frame_append(&buf, &len, &cap, &req);
                memset(&req, 0, sizeof(req));
                req.id = id++;
                req.type = WIRE_REQ_STAT;
                snprintf(req.stat.name, sizeof(req.stat.name), "ops/missing");
                rp_frame_append(&buf, &len, &cap, &req);
                memset(&req, 0, sizeof(req));
                req.id = id++;
                req.type = WIRE_REQ_STATS;
                rp_frame_append(&buf, &len, &cap, &req);
        }
        ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
        free(buf);
        for (uint64_t want = 10; want < id; want++)
                (void)answer_of(sock, want, 5000);
        m1 = metrics_of(c);
#define DELTA(name) (series0(m1, name) - series0(m0, name))
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"ping\"}"), N);
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"acquire\"}"), N);
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"stat\"}"), N);
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"stats\"}"), N);
        ck_assert_int_eq(DELTA("dlx_request_errors_total{type=\"acquire\",status=\"not_found\"}"),
                         N);
        ck_assert_int_eq(DELTA("dlx_request_errors_total{type=\"stat\",status=\"not_found\"}"), N);
        ck_assert_int_eq(DELTA("dlx_acquire_duration_seconds_count"), N);
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"undecodable\"}"), 0);
        ck_assert_int_eq(DELTA("dlx_acquires_total"), 0);
#undef DELTA
        promtool_ok(m1);
        free(m0);
        free(m1);
        close(sock);
        ck_assert_int_eq(dlx_unpublish(c, "ops/there"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

static int waits_then_killed(void *arg)
{
        const char *path = arg;
        struct dlx_acquire_options w = {.timeout_ms = 30000};
        DLManagedTensorVersioned *t;
        dlx_client *c = connect_to(path, 5000);

        (void)dlx_acquire(c, "ops/never", &w, &t);
        return 5;
}

/*
 * Promise 3: acquires that wait: granted, timed out, cancelled by the
 * client being killed, cancelled by a raw client closing. Each counted once;
 * only the answered ones timed, with their waits in the time.
 */
START_TEST(metrics_waits_granted_timed_out_cancelled)
{
        struct dlx_acquire_options w300 = {.timeout_ms = 300};
        struct wire_request req;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        char *m0, *m1;
        pid_t kid;
        int sock;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "counter");
        m0 = metrics_of(c);
        /* a raw client that waits 30 s, then closes */
        sock = rp_connect(fx.socket, "closer");
        rp_acquire_req(&req, 2, "ops/never");
        req.acquire.timeout_ms = 30000;
        rp_send(sock, &req, -1);
        /* a libdlx client that waits, killed */
        kid = fx_spawn(waits_then_killed, fx.socket);
        /* one that times out */
        ck_assert_int_eq(dlx_acquire(c, "ops/late", &w300, &t), -ETIMEDOUT);
        ck_assert_int_eq(kill(kid, SIGKILL), 0);
        ck_assert_int_eq(fx_wait(kid), 128 + SIGKILL);
        close(sock);
        ck_assert_uint_eq(fx_wait_clients(c, 1, 5000), 1);
        m1 = metrics_of(c);
#define DELTA(name) (series0(m1, name) - series0(m0, name))
        /* the metrics request in m0 is counted in m1 */
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"acquire\"}"), 3);
        ck_assert_int_eq(DELTA("dlx_request_errors_total{type=\"acquire\",status=\"timeout\"}"), 1);
        ck_assert_int_eq(DELTA("dlx_acquire_duration_seconds_count"), 1);
        ck_assert_int_eq(DELTA("dlx_acquire_duration_seconds_bucket{le=\"0.25\"}"), 0);
        ck_assert(series_f(m1, "dlx_acquire_duration_seconds_sum") >= 0.29);
        ck_assert_int_eq(series(m1, "dlx_watches"), 0);
        free(m1);
        /* and one granted after 400 ms */
        kid = fork();
        ck_assert_int_ge(kid, 0);
        if (kid == 0) {
                dlx_client *p;
                fx_sleep_ms(400);
                p = fx_connect(&fx, "producer");
                publish_vec(p, "ops/later");
                dlx_close(p);
                fx_child_exit(0);
        }
        {
                struct dlx_acquire_options w = {.timeout_ms = 10000};
                ck_assert_int_eq(dlx_acquire(c, "ops/later", &w, &t), 0);
                t->deleter(t);
        }
        ck_assert_int_eq(fx_wait(kid), 0);
        m1 = metrics_of(c);
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"acquire\"}"), 4);
        ck_assert_int_eq(DELTA("dlx_acquire_duration_seconds_count"), 2);
        ck_assert_int_eq(DELTA("dlx_acquire_duration_seconds_bucket{le=\"0.25\"}"), 0);
        ck_assert_int_eq(DELTA("dlx_acquires_total"), 1);
        ck_assert(series_f(m1, "dlx_acquire_duration_seconds_sum") >= 0.68);
#undef DELTA
        free(m0);
        free(m1);
        ck_assert_int_eq(dlx_unpublish(c, "ops/later"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Promise 3: a hostile peer that reuses a request id (an acquire that waits,
 * then a ping of the same id): the acquire's answer is still an acquire's,
 * counted and timed as one.
 */
START_TEST(metrics_exact_when_ids_are_reused)
{
        struct wire_request req;
        dlx_client *c;
        char *m0, *m1;
        int sock;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "counter");
        sock = rp_connect(fx.socket, "reuser");
        m0 = metrics_of(c);
        rp_acquire_req(&req, 7, "ops/never");
        req.acquire.timeout_ms = 300;
        rp_send(sock, &req, -1);
        rp_ping(sock, 7);
        ck_assert_int_eq(answer_of(sock, 7, 5000), WIRE_TIMEOUT);
        m1 = metrics_of(c);
#define DELTA(name) (series0(m1, name) - series0(m0, name))
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"acquire\"}"), 1);
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"ping\"}"), 1);
        ck_assert_msg(DELTA("dlx_request_errors_total{type=\"acquire\",status=\"timeout\"}") == 1,
                      "the acquire's timeout is not counted as an acquire's:\n%s",
                      lines_with(m1, "errors_total{"));
        ck_assert_int_eq(DELTA("dlx_request_errors_total{type=\"ping\",status=\"timeout\"}"), 0);
        ck_assert_int_eq(DELTA("dlx_acquire_duration_seconds_count"), 1);
#undef DELTA
        free(m0);
        free(m1);
        close(sock);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Promise 3: group publishes (dlx_publish_group, dlx_group_alloc +
 * dlx_group_publish): each a publish request, answered and timed once.
 */
START_TEST(metrics_count_group_publishes)
{
        static const int64_t shape[] = {8};
        struct dlx_member_layout layouts[] = {
                {.name = "w", .dtype = {kDLFloat, 32, 1}, .ndim = 1, .shape = shape},
                {.name = "b", .dtype = {kDLFloat, 32, 1}, .ndim = 1, .shape = shape},
        };
        struct dlx_member members[2];
        dlx_group *g;
        dlx_client *c;
        char *m0, *m1;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "grouper");
        m0 = metrics_of(c);
        members[0] = (struct dlx_member){"x", fx_plain_f32(4, 0, NULL)};
        members[1] = (struct dlx_member){"y", fx_plain_f32(4, 1, NULL)};
        ck_assert_msg(dlx_publish_group(c, "ops/g1", members, 2, NULL, NULL) == 0, "%s",
                      dlx_last_error());
        ck_assert_int_eq(dlx_group_alloc(c, layouts, 2, &g), 0);
        ck_assert_msg(dlx_group_publish(c, "ops/g2", g, NULL, NULL) == 0, "%s", dlx_last_error());
        ck_assert_msg(dlx_group_publish(c, "ops/g3", g, NULL, NULL) == 0, "%s", dlx_last_error());
        dlx_group_release(g);
        /* and a group acquired: one acquire, answered (a segment ahead of its answer) once */
        ck_assert_int_eq(dlx_acquire_group(c, "ops/g2", NULL, 0, NULL, &g), 0);
        dlx_group_release(g);
        m1 = metrics_of(c);
        promtool_ok(m1);
#define DELTA(name) (series0(m1, name) - series0(m0, name))
        ck_assert_int_eq(DELTA("dlx_publishes_total"), 3);
        ck_assert_int_eq(DELTA("dlx_publish_duration_seconds_count"),
                         DELTA("dlx_requests_total{type=\"publish\"}"));
        ck_assert_int_ge(DELTA("dlx_requests_total{type=\"publish\"}"), 3);
        ck_assert_int_eq(series(m1, "dlx_names"), 3);
        ck_assert_int_eq(DELTA("dlx_requests_total{type=\"acquire\"}"), 1);
        ck_assert_int_eq(DELTA("dlx_acquire_duration_seconds_count"), 1);
        ck_assert_int_eq(DELTA("dlx_acquires_total"), 1);
#undef DELTA
        free(m0);
        free(m1);
        ck_assert_int_eq(dlx_unpublish(c, "ops/g1"), 0);
        ck_assert_int_eq(dlx_unpublish(c, "ops/g2"), 0);
        ck_assert_int_eq(dlx_unpublish(c, "ops/g3"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Promise 3: clients that die mid-request (requests pipelined, the socket
 * closed before any answer is read): what is counted stays consistent:
 * each counted acquire has its error counted and its answer timed once.
 */
START_TEST(metrics_consistent_when_clients_die_mid_request)
{
        struct wire_request req;
        dlx_client *c;
        char *m0, *m1;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "counter");
        m0 = metrics_of(c);
        for (int round = 0; round < 10; round++) {
                uint8_t *buf = NULL;
                size_t len = 0, cap = 0;
                int sock = rp_connect(fx.socket, "dier");
                for (int i = 0; i < 20; i++) {
                        rp_acquire_req(&req, (uint64_t)(2 + i), "ops/missing");
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
                free(buf);
                close(sock);
        }
        ck_assert_uint_eq(fx_wait_clients(c, 1, 5000), 1);
        m1 = metrics_of(c);
#define DELTA(name) (series0(m1, name) - series0(m0, name))
        {
                long long req_n = DELTA("dlx_requests_total{type=\"acquire\"}");
                long long err_n =
                        DELTA("dlx_request_errors_total{type=\"acquire\",status=\"not_found\"}");
                long long timed = DELTA("dlx_acquire_duration_seconds_count");
                ck_assert_msg(req_n == err_n && err_n == timed && req_n <= 200,
                              "acquires %lld, not_found %lld, timed %lld", req_n, err_n, timed);
                ck_assert_int_eq(DELTA("dlx_requests_total{type=\"hello\"}"), 10);
        }
#undef DELTA
        ck_assert_int_eq(series(m1, "dlx_clients"), 1);
        free(m0);
        free(m1);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

struct uid_view {
        const char *socket;
        uid_t uid;
        bool ctl; /* through dlxctl stats --prometheus, not dlx_metrics */
};

/* Exit 0 when the metrics that uid sees hold no other uid's series. */
static int look_as(void *arg)
{
        const struct uid_view *v = arg;
        char *text = NULL, mine[32];
        dlx_client *c;

        if (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(v->uid) != 0)
                return 90;
        if (v->ctl) {
                char cmd[512];
                FILE *p;
                size_t n, cap = 1 << 20;
                text = calloc(1, cap);
                snprintf(cmd, sizeof(cmd), "%s --socket '%s' stats --prometheus", getenv("DLXCTL"),
                         v->socket);
                p = popen(cmd, "r");
                if (!p)
                        return 91;
                n = fread(text, 1, cap - 1, p);
                text[n] = '\0';
                if (pclose(p) != 0)
                        return 92;
        } else {
                struct dlx_connect_options o = {.socket_path = v->socket, .timeout_ms = 5000};
                if (dlx_connect(&o, &c) != 0)
                        return 93;
                publish_vec(c, "ops/peek");
                if (dlx_metrics(c, &text) != 0)
                        return 94;
                dlx_unpublish(c, "ops/peek");
                dlx_close(c);
        }
        snprintf(mine, sizeof(mine), "uid=\"%u\"", (unsigned)v->uid);
        for (const char *p = strstr(text, "uid=\""); p; p = strstr(p + 1, "uid=\""))
                if (strncmp(p, mine, strlen(mine)) != 0) {
                        fprintf(stderr, "uid %u sees another uid's series: %.60s\n",
                                (unsigned)v->uid, p);
                        return 1;
                }
        if (!v->ctl && !strstr(text, mine))
                return 2;
        free(text);
        return 0;
}

/*
 * Promise 3: a uid other than dlxd's or root sees only its own per-uid
 * series, through dlx_metrics() and through dlxctl stats --prometheus, while
 * other uids hold names; root sees them all, and the text passes promtool.
 */
START_TEST(metrics_other_uids_see_only_their_own)
{
        struct uid_view a = {.uid = 64010}, b = {.uid = 64011, .ctl = true};
        dlx_client *c;
        char *m, line[64];
        pid_t holder;
        int pipefd[2];

        if (geteuid() != 0) {
                fprintf(stderr, "skipped: needs root to play another uid\n");
                return;
        }
        dlxd_start(&fx, shared_args);
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        a.socket = b.socket = fx.socket;
        c = fx_connect(&fx, "root");
        publish_vec(c, "ops/root");
        /* uid 64012 holds a name and a client the whole time */
        ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
        holder = fork();
        ck_assert_int_ge(holder, 0);
        if (holder == 0) {
                dlx_client *h;
                char x;
                close(pipefd[1]);
                if (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(64012) != 0)
                        fx_child_exit(90);
                h = connect_to(fx.socket, 5000);
                publish_vec(h, "ops/holder");
                (void)!read(pipefd[0], &x, 1);
                dlx_unpublish(h, "ops/holder");
                dlx_close(h);
                fx_child_exit(0);
        }
        close(pipefd[0]);
        ck_assert_uint_eq(fx_wait_clients(c, 2, 5000), 2);
        ck_assert_int_eq(fx_wait(fx_spawn(look_as, &a)), 0);
        ck_assert_int_eq(fx_wait(fx_spawn(look_as, &b)), 0);
        m = metrics_of(c);
        promtool_ok(m);
        snprintf(line, sizeof(line), "dlx_uid_names{uid=\"64012\"}");
        ck_assert_int_eq(series(m, line), 1);
        free(m);
        close(pipefd[1]);
        ck_assert_int_eq(fx_wait(holder), 0);
        ck_assert_int_eq(dlx_unpublish(c, "ops/root"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

struct peek {
        const char *socket;
        uid_t uid;
        const char *must;     /* a label the text must have (NULL: none) */
        const char *must_not; /* a label it must not have: another uid's */
};

static int peek_as(void *arg)
{
        const struct peek *k = arg;
        struct dlx_connect_options o = {.socket_path = k->socket, .timeout_ms = 5000};
        char *text = NULL;
        dlx_client *c;
        int rc = 0;

        if (k->uid && (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(k->uid) != 0))
                return 90;
        if (dlx_connect(&o, &c) != 0) {
                fprintf(stderr, "uid %u cannot connect: %s\n", (unsigned)k->uid, dlx_last_error());
                return 91;
        }
        if (dlx_metrics(c, &text) != 0)
                rc = 92;
        else if (k->must && !strstr(text, k->must))
                rc = 1;
        else if (k->must_not && strstr(text, k->must_not))
                rc = 2;
        free(text);
        dlx_close(c);
        return rc;
}

/*
 * Promise 3: dlxd running as a uid of its own (not root): that uid and root
 * see every uid's series, a third uid only its own.
 */
START_TEST(metrics_privacy_when_dlxd_is_not_root)
{
        struct unit u;
        char note[512], own[160];
        const char *args[] = {"--socket", own, "--group", "65534", NULL};
        struct peek self = {.uid = 64030, .must = "uid=\"64031\"", .must_not = NULL};
        struct peek root = {.uid = 0, .must = "uid=\"64031\"", .must_not = NULL};
        struct peek third = {.uid = 64031, .must = "uid=\"64031\"", .must_not = "uid=\"64030\""};
        struct peek third2 = {.uid = 64031, .must = NULL, .must_not = "uid=\"0\""};
        pid_t holder;
        int pipefd[2], readyfd[2];
        char r;

        if (geteuid() != 0) {
                fprintf(stderr, "skipped: needs root to play other uids\n");
                return;
        }
        unit_init(&u);
        ck_assert_int_eq(chown(u.dir, 64030, NOGROUP), 0);
        ck_assert_int_eq(chmod(u.dir, 0711), 0);
        ck_assert_int_eq(chown(u.notify, 64030, NOGROUP), 0);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        spawn_as = 64030;
        unit_spawn(&u, NULL, 0, NULL, args);
        spawn_as = 0;
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        self.socket = root.socket = third.socket = third2.socket = own;
        /* uid 64031 keeps a client connected, so that it has series of its own */
        ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(readyfd, O_CLOEXEC), 0);
        holder = fork();
        ck_assert_int_ge(holder, 0);
        if (holder == 0) {
                struct dlx_connect_options o = {.socket_path = own, .timeout_ms = 5000};
                dlx_client *h;
                char x;
                close(pipefd[1]);
                close(readyfd[0]);
                if (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(64031) != 0)
                        fx_child_exit(90);
                if (dlx_connect(&o, &h) != 0)
                        fx_child_exit(91);
                (void)!write(readyfd[1], "R", 1);
                (void)!read(pipefd[0], &x, 1);
                dlx_close(h);
                fx_child_exit(0);
        }
        close(pipefd[0]);
        close(readyfd[1]);
        ck_assert_int_eq(read(readyfd[0], &r, 1), 1);
        close(readyfd[0]);
        {
                /* uid 64030 (dlxd's) and root keep clients too, as they ask */
                struct peek hold_root = {.socket = own, .uid = 0, .must = "uid=\"0\""};
                ck_assert_int_eq(fx_wait(fx_spawn(peek_as, &self)), 0);
                ck_assert_int_eq(fx_wait(fx_spawn(peek_as, &root)), 0);
                ck_assert_int_eq(fx_wait(fx_spawn(peek_as, &hold_root)), 0);
                ck_assert_int_eq(fx_wait(fx_spawn(peek_as, &third)), 0);
                ck_assert_int_eq(fx_wait(fx_spawn(peek_as, &third2)), 0);
        }
        close(pipefd[1]);
        ck_assert_int_eq(fx_wait(holder), 0);
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

/*
 * Promise 3 (dlx.h): dlx_metrics() sets *ret_text to NULL on every failure,
 * a daemon gone mid-session among them.
 */
START_TEST(metrics_call_fails_cleanly_when_daemon_dies)
{
        char *text = (char *)"untouched";
        dlx_client *c;
        int status, err;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "orphan");
        ck_assert_int_eq(kill(fx.pid, SIGKILL), 0);
        ck_assert_int_eq(waitpid(fx.pid, &status, 0), fx.pid);
        fx.pid = 0;
        err = dlx_metrics(c, &text);
        ck_assert_int_lt(err, 0);
        ck_assert_ptr_null(text);
        dlx_close(c);
        dlxd_restart(&fx, NULL);
        dlxd_stop(&fx);
}
END_TEST

/* The sum of every series of family (name{...} value lines) in text. */
static long long family_sum(const char *text, const char *family)
{
        size_t len = strlen(family);
        long long sum = 0;

        for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
                if (strncmp(p, family, len) == 0 && p[len] == '{')
                        sum += strtoll(strchr(p, ' ') + 1, NULL, 10);
        return sum;
}

static int hold_and_die(void *arg)
{
        const char *path = arg;
        struct dlx_connect_options o = {.socket_path = path, .timeout_ms = 5000};
        struct dlx_publish_options po = {.persist = true};
        DLManagedTensorVersioned *t;
        dlx_client *c;

        if (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(64041) != 0)
                return 90;
        if (dlx_connect(&o, &c) != 0)
                return 91;
        if (dlx_publish(c, "ops/sum-b", fx_plain_f32(4096, 0, NULL), &po, NULL) != 0)
                return 92;
        if (dlx_acquire(c, "ops/sum-a", NULL, &t) != 0)
                return 93;
        /* dies holding a lease, a name and its segment: the daemon cleans up after it */
        raise(SIGKILL);
        return 94;
}

/*
 * Promise 3: the per-uid series add up to the totals they break down (names,
 * bytes held, clients, segment descriptors), as root sees them, after uids
 * published, acquired, and one died holding a lease.
 */
START_TEST(metrics_per_uid_series_add_up)
{
        dlx_client *c, *idle;
        char *m;
        int sock;

        if (geteuid() != 0) {
                fprintf(stderr, "skipped: needs root to play other uids\n");
                return;
        }
        dlxd_start(&fx, shared_args);
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        c = fx_connect(&fx, "root");
        publish_vec(c, "ops/sum-a");
        idle = fx_connect(&fx, "idle");
        sock = fx_raw_connect(&fx); /* a peer that never says hello */
        ck_assert_int_eq(fx_wait(fx_spawn(hold_and_die, fx.socket)), 128 + SIGKILL);
        ck_assert_uint_eq(fx_wait_clients(c, 3, 5000), 3);
        fx_sleep_ms(200);
        m = metrics_of(c);
        promtool_ok(m);
        ck_assert_int_eq(series(m, "dlx_names"), 2);
        ck_assert_int_eq(family_sum(m, "dlx_uid_names"), series(m, "dlx_names"));
        ck_assert_msg(family_sum(m, "dlx_uid_held_bytes") == series(m, "dlx_held_bytes"),
                      "per-uid bytes %lld, held bytes %lld:\n%s",
                      family_sum(m, "dlx_uid_held_bytes"), series(m, "dlx_held_bytes"),
                      lines_with(m, "held_bytes"));
        ck_assert_msg(family_sum(m, "dlx_uid_clients") == series(m, "dlx_clients"),
                      "per-uid clients %lld, clients %lld:\n%s", family_sum(m, "dlx_uid_clients"),
                      series(m, "dlx_clients"), lines_with(m, "clients"));
        ck_assert_msg(family_sum(m, "dlx_uid_segment_fds") == series(m, "dlx_segment_fds"),
                      "per-uid fds %lld, fds %lld:\n%s", family_sum(m, "dlx_uid_segment_fds"),
                      series(m, "dlx_segment_fds"), lines_with(m, "segment_fds"));
        ck_assert_int_eq(series(m, "dlx_leases"), 0);
        free(m);
        close(sock);
        dlx_close(idle);
        ck_assert_int_eq(dlx_unpublish(c, "ops/sum-a"), 0);
        ck_assert_int_eq(dlx_unpublish(c, "ops/sum-b"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* Polls c's metrics until series has value v, up to ms; returns the last value. */
static long long wait_series(dlx_client *c, const char *name, long long v, int ms)
{
        int64_t end = fx_now_ms() + (int64_t)ms * fx_slowdown();
        long long got;

        for (;;) {
                char *m = metrics_of(c);
                got = series(m, name);
                free(m);
                if (got == v || fx_now_ms() >= end)
                        return got;
                fx_sleep_ms(20);
        }
}

/*
 * Promise 3: descriptors in flight (sent, not yet received) against their
 * budget: a peer that pipelines acquires and reads nothing has them all in
 * flight, in all and for its uid; once it reads them, none; once it is
 * gone, no lease either. dlxd can only tell that a peer read everything
 * sent to it (SIOCOUTQ), so while replies wait unread the count may include
 * a descriptor read before them (the release ring's): never fewer than the
 * unread ones, and none once all is read.
 */
START_TEST(metrics_fds_in_flight_follow_the_peer)
{
        enum { N = 5 };
        struct wire_request req;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        dlx_client *c;
        char *m, line[64], seen[512];
        long long all, mine;
        int sock, got = 0;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "counter");
        publish_vec(c, "ops/fds");
        sock = rp_connect(fx.socket, "unread");
        for (int i = 0; i < N; i++) {
                rp_acquire_req(&req, (uint64_t)(10 + i), "ops/fds");
                rp_frame_append(&buf, &len, &cap, &req);
        }
        ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
        free(buf);
        ck_assert_int_eq(wait_series(c, "dlx_leases", N, 5000), N);
        fx_sleep_ms(300);
        m = metrics_of(c);
        snprintf(line, sizeof(line), "dlx_uid_fds_in_flight{uid=\"%u\"}", (unsigned)getuid());
        all = series(m, "dlx_fds_in_flight");
        mine = series(m, line);
        snprintf(seen, sizeof(seen), "%s", lines_with(m, "in_flight"));
        ck_assert_int_gt(series(m, "dlx_fds_in_flight_limit"), 0);
        free(m);
        /* what was in flight: the descriptors the peer now receives */
        for (int i = 0; i < N; i++) {
                struct wire_reply rep;
                int fd = -1;
                ck_assert_int_eq(rp_read_answer(sock, &rep, 5000, &fd), 1);
                ck_assert_int_eq(rep.status, WIRE_OK);
                if (fd >= 0) {
                        close(fd);
                        got++;
                }
        }
        {
                /* every descriptor sent has now been received: none is in flight */
                long long after = wait_series(c, "dlx_fds_in_flight", 0, 3000);
                ck_assert_msg(
                        all >= got && all <= got + 1 && mine == all && after == 0,
                        "the peer had %d descriptors unread (and the other client none); "
                        "the metrics said:\n%s"
                        "and, with every descriptor received, dlx_fds_in_flight %lld 3 s later",
                        got, seen, after);
        }
        close(sock);
        ck_assert_int_eq(wait_series(c, "dlx_leases", 0, 5000), 0);
        ck_assert_int_eq(dlx_unpublish(c, "ops/fds"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* Whether name ends with suffix. */
static bool ends_with(const char *name, const char *suffix)
{
        size_t n = strlen(name), k = strlen(suffix);

        return n >= k && strcmp(name + n - k, suffix) == 0;
}

/*
 * Promise 3: every promised family is there, and names follow Prometheus
 * conventions: counters end in _total, a unit (bytes, seconds) is the last
 * word of a name (before _total), histograms of time are in _seconds.
 */
START_TEST(metrics_families_and_names)
{
        static const char *const families[] = {"dlx_requests_total",
                                               "dlx_request_errors_total",
                                               "dlx_publishes_total",
                                               "dlx_acquires_total",
                                               "dlx_names",
                                               "dlx_versions",
                                               "dlx_leases",
                                               "dlx_segments",
                                               "dlx_held_bytes",
                                               "dlx_uid_held_bytes",
                                               "dlx_clients",
                                               "dlx_watches",
                                               "dlx_segment_fds",
                                               "dlx_segment_fds_limit",
                                               "dlx_fds_in_flight",
                                               "dlx_fds_in_flight_limit",
                                               "dlx_acquire_duration_seconds",
                                               "dlx_publish_duration_seconds"};
        static const char *const limits[] = {
                "--max-bytes", "1G", "--max-bytes-per-uid", "512M", "--max-names", "100", NULL};
        char bad[1024] = "";
        dlx_client *c;
        char *m;

        dlxd_start(&fx, limits);
        c = fx_connect(&fx, "names");
        publish_vec(c, "ops/n");
        m = metrics_of(c);
        promtool_ok(m);
        for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
                char t[128];
                snprintf(t, sizeof(t), "# TYPE %s ", families[i]);
                ck_assert_msg(strstr(m, t), "no family %s", families[i]);
        }
        for (const char *p = strstr(m, "# TYPE "); p; p = strstr(p + 1, "# TYPE ")) {
                char name[128], type[32];
                if (sscanf(p, "# TYPE %127s %31s", name, type) != 2)
                        continue;
                bool ok = true;
                if (strcmp(type, "counter") == 0)
                        ok = ends_with(name, "_total");
                else if (strcmp(type, "histogram") == 0)
                        ok = ends_with(name, "_seconds") || ends_with(name, "_bytes");
                else if (strstr(name, "_bytes") || strstr(name, "_seconds"))
                        ok = ends_with(name, "_bytes") || ends_with(name, "_seconds");
                if (!ok && strlen(bad) + strlen(name) + 2 < sizeof(bad)) {
                        strcat(bad, name);
                        strcat(bad, " ");
                }
        }
        ck_assert_msg(bad[0] == '\0', "names whose unit is not their last word: %s", bad);
        free(m);
        ck_assert_int_eq(dlx_unpublish(c, "ops/n"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* ==== 4. the metrics file ================================================================== */

struct many {
        const char *socket;
        uid_t first;
        int count;
};

/* Each uid in turn: connect, publish a persistent name, leave. */
static int many_uids(void *arg)
{
        const struct many *m = arg;

        for (int i = 0; i < m->count; i++) {
                pid_t kid = fork();
                if (kid < 0)
                        return 1;
                if (kid == 0) {
                        struct dlx_connect_options o = {.socket_path = m->socket,
                                                        .timeout_ms = 10000};
                        struct dlx_publish_options po = {.persist = true};
                        dlx_client *c;
                        char name[64];
                        if (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 ||
                            setuid(m->first + (uid_t)i) != 0)
                                _exit(90);
                        if (dlx_connect(&o, &c) != 0)
                                _exit(91);
                        snprintf(name, sizeof(name), "ops/u%u", (unsigned)(m->first + (uid_t)i));
                        if (dlx_publish(c, name, fx_plain_f32(1, 0, NULL), &po, NULL) != 0)
                                _exit(92);
                        dlx_close(c);
                        _exit(0);
                }
                int st;
                if (waitpid(kid, &st, 0) != kid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
                        return 2;
        }
        return 0;
}

/*
 * Promise 4: the metrics file holds every uid's series, however many uids:
 * here 1030 uids each own a name.
 */
START_TEST(metrics_file_has_every_uid)
{
        enum { UIDS = 1030, WORKERS = 10 };
        char dir[64], path[128];
        const char *args[] = {"--group", "65534", "--metrics-file", path, "--metrics-interval",
                              "1",       NULL};
        struct many work[WORKERS];
        pid_t kids[WORKERS];
        dlx_client *c;
        char *text, line[64];
        long long names = -1;
        int missing = 0;

        if (geteuid() != 0) {
                fprintf(stderr, "skipped: needs root to play other uids\n");
                return;
        }
        make_dir(dir, sizeof(dir));
        snprintf(path, sizeof(path), "%s/dlx.prom", dir);
        dlxd_start(&fx, args);
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        for (int w = 0; w < WORKERS; w++) {
                work[w] = (struct many){fx.socket, 100000 + (uid_t)(w * (UIDS / WORKERS)),
                                        UIDS / WORKERS};
                kids[w] = fx_spawn(many_uids, &work[w]);
        }
        for (int w = 0; w < WORKERS; w++)
                ck_assert_int_eq(fx_wait(kids[w]), 0);
        c = fx_connect(&fx, "root");
        for (int i = 0; i < 50 && names != UIDS; i++) {
                fx_sleep_ms(100);
                names = series(slurp(path), "dlx_names");
        }
        ck_assert_int_eq(names, UIDS);
        text = slurp(path);
        for (int i = 0; i < UIDS; i++) {
                snprintf(line, sizeof(line), "dlx_uid_names{uid=\"%u\"}", 100000u + (unsigned)i);
                if (series(text, line) != 1)
                        missing++;
        }
        ck_assert_msg(missing == 0,
                      "%d of %d uids have no dlx_uid_names in the metrics file "
                      "(dlx_uids_omitted %lld)",
                      missing, UIDS, series(text, "dlx_uids_omitted"));
        dlx_close(c);
        dlxd_stop(&fx);
        rmdir(dir);
}
END_TEST

static int plant_symlink(void *arg)
{
        const char *const *p = arg; /* link, target */

        if (setgroups(0, NULL) != 0 || setgid(NOGROUP) != 0 || setuid(NOBODY) != 0)
                return 90;
        return symlink(p[1], p[0]) == 0 ? 0 : 1;
}

/*
 * Promise 4: a metrics PATH in a world-writable sticky directory, where uid
 * nobody planted a symlink to a file of root's: dlxd (root) must not write
 * through it (the target stays as it was), keeps a file of its own there,
 * mode 0644, whatever its umask, and removes only that at exit.
 */
START_TEST(metrics_file_planted_symlink_in_tmp)
{
        char dir[64], path[128], target[160], tmpl[160];
        const char *args[] = {"--metrics-file", path, "--metrics-interval", "1", NULL};
        const char *link_target[] = {path, target};
        struct stat st, before;
        mode_t old;
        int fd;

        if (geteuid() != 0) {
                fprintf(stderr, "skipped: needs root to play another uid\n");
                return;
        }
        make_dir(dir, sizeof(dir));
        ck_assert_int_eq(chmod(dir, 01777), 0);
        snprintf(path, sizeof(path), "%s/dlx.prom", dir);
        snprintf(tmpl, sizeof(tmpl), "%s-target-XXXXXX", dir);
        fd = mkstemp(tmpl);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, "precious\n", 9), 9);
        close(fd);
        snprintf(target, sizeof(target), "%s", tmpl);
        ck_assert_int_eq(stat(target, &before), 0);
        ck_assert_int_eq(fx_wait(fx_spawn(plant_symlink, (void *)link_target)), 0);
        old = umask(077);
        dlxd_start(&fx, args);
        umask(old);
        fx_sleep_ms(1500);
        ck_assert_str_eq(slurp(target), "precious\n");
        ck_assert_int_eq(stat(target, &st), 0);
        ck_assert_int_eq(st.st_size, before.st_size);
        ck_assert_int_eq(lstat(path, &st), 0);
        ck_assert_msg(S_ISREG(st.st_mode) && st.st_uid == 0 && (st.st_mode & 0777) == 0644,
                      "PATH is mode %o, uid %u", (unsigned)st.st_mode, (unsigned)st.st_uid);
        ck_assert_int_ge(series(slurp(path), "dlx_clients"), 0);
        dlxd_stop(&fx);
        ck_assert_int_eq(access(path, F_OK), -1);
        ck_assert_str_eq(slurp(target), "precious\n");
        ck_assert_int_eq(unlink(target), 0);
        ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

static int churn(void *arg)
{
        const char *path = arg;
        int64_t end = fx_now_ms() + 3000;
        dlx_client *c = connect_to(path, 5000);
        int i = 0;

        while (fx_now_ms() < end) {
                char name[32];
                struct dlx_publish_options o = {.persist = false};
                snprintf(name, sizeof(name), "ops/churn%d", i++ % 50);
                if (dlx_publish(c, name, fx_plain_f32(64, 0, NULL), &o, NULL) != 0)
                        return 1;
        }
        dlx_close(c);
        return 0;
}

/* Names in dir ending in ".prom" other than keep; the count. */
static int other_proms(const char *dir, const char *keep, char *seen, size_t len)
{
        DIR *d = opendir(dir);
        struct dirent *e;
        int n = 0;

        seen[0] = '\0';
        while (d && (e = readdir(d))) {
                size_t l = strlen(e->d_name);
                if (l >= 5 && strcmp(e->d_name + l - 5, ".prom") == 0 &&
                    strcmp(e->d_name, keep) != 0) {
                        n++;
                        snprintf(seen + strlen(seen), len - strlen(seen), "%s ", e->d_name);
                }
        }
        if (d)
                closedir(d);
        return n;
}

/*
 * Promise 4: under load the file is always whole (a reader never sees a
 * partial one), no other *.prom ever lies beside it, and after dlxd is
 * killed with SIGKILL none is left either.
 */
START_TEST(metrics_file_whole_under_load_and_kill)
{
        char dir[64], path[128], seen[512];
        const char *args[] = {"--metrics-file", path, "--metrics-interval", "1", NULL};
        pid_t kids[4];
        int reads = 0, whole = 0, status;
        int64_t end;

        make_dir(dir, sizeof(dir));
        snprintf(path, sizeof(path), "%s/dlx.prom", dir);
        dlxd_start(&fx, args);
        for (int i = 0; i < 4; i++)
                kids[i] = fx_spawn(churn, fx.socket);
        end = fx_now_ms() + 2500;
        while (fx_now_ms() < end) {
                const char *t = slurp(path);
                size_t l = strlen(t);
                reads++;
                if (l > 0 && t[l - 1] == '\n' && strstr(t, "\ndlx_uids_omitted ") &&
                    strncmp(t, "# HELP dlx_build_info", 21) == 0)
                        whole++;
                else
                        ck_abort_msg("a partial metrics file (%zu bytes): ...%s", l,
                                     l > 200 ? t + l - 200 : t);
                ck_assert_msg(other_proms(dir, "dlx.prom", seen, sizeof(seen)) == 0,
                              "beside the metrics file: %s", seen);
        }
        for (int i = 0; i < 4; i++)
                ck_assert_int_eq(fx_wait(kids[i]), 0);
        promtool_ok(slurp(path));
        ck_assert_int_eq(kill(fx.pid, SIGKILL), 0);
        ck_assert_int_eq(waitpid(fx.pid, &status, 0), fx.pid);
        fx.pid = 0;
        ck_assert_msg(other_proms(dir, "dlx.prom", seen, sizeof(seen)) == 0,
                      "after SIGKILL, beside the metrics file: %s", seen);
        fprintf(stderr, "metrics_file_whole_under_load_and_kill: %d whole reads\n", whole);
        /* the next dlxd on the same socket and file serves, and its exit removes the file */
        dlxd_restart(&fx, args);
        dlxd_stop(&fx);
        ck_assert_int_eq(access(path, F_OK), -1);
        {
                DIR *d = opendir(dir);
                struct dirent *e;
                char p[400];
                while (d && (e = readdir(d)))
                        if (e->d_name[0] != '.') {
                                snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
                                unlink(p);
                        }
                if (d)
                        closedir(d);
        }
        ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/*
 * Promise 4: the file is rewritten every interval (1 s here): each rewrite is
 * a new inode (written beside, renamed over); none may be two intervals late.
 */
START_TEST(metrics_file_rewritten_every_interval)
{
        char dir[64], path[128];
        const char *args[] = {"--metrics-file", path, "--metrics-interval", "1", NULL};
        struct stat st;
        ino_t last_ino = 0;
        int64_t last = -1, worst = 0, end;
        int rewrites = 0;

        if (fx_slowdown() > 1) {
                fprintf(stderr, "skipped: timing under a slow wrapper\n");
                return;
        }
        make_dir(dir, sizeof(dir));
        snprintf(path, sizeof(path), "%s/dlx.prom", dir);
        dlxd_start(&fx, args);
        end = fx_now_ms() + 7000;
        while (fx_now_ms() < end) {
                if (stat(path, &st) == 0 && st.st_ino != last_ino) {
                        int64_t now = fx_now_ms();
                        if (last_ino && last >= 0 && now - last > worst)
                                worst = now - last;
                        if (last_ino)
                                rewrites++;
                        last = now;
                        last_ino = st.st_ino;
                }
                fx_sleep_ms(5);
        }
        ck_assert_msg(worst <= 1500 && rewrites >= 5,
                      "with --metrics-interval 1: %d rewrites in 7 s, %lld ms apart at worst",
                      rewrites, (long long)worst);
        dlxd_stop(&fx);
        ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/*
 * Promise 4: a PATH that cannot be written (under a file; an existing
 * directory) does not stop dlxd serving, and its exit leaves what is there
 * alone; the interval's edges 1 and 86400 are taken.
 */
START_TEST(metrics_file_unwritable_paths_serve)
{
        char dir[64], under_file[160], a_dir[160];
        const char *args1[] = {"--metrics-file", under_file, "--metrics-interval", "86400", NULL};
        const char *args2[] = {"--metrics-file", a_dir, "--metrics-interval", "1", NULL};
        dlx_client *c;
        struct stat st;

        make_dir(dir, sizeof(dir));
        snprintf(under_file, sizeof(under_file), "/etc/passwd/dlx.prom");
        snprintf(a_dir, sizeof(a_dir), "%s/isadir.prom", dir);
        ck_assert_int_eq(mkdir(a_dir, 0755), 0);

        dlxd_start(&fx, args1);
        c = fx_connect(&fx, "under-file");
        publish_vec(c, "ops/uf");
        ck_assert_int_eq(dlx_unpublish(c, "ops/uf"), 0);
        dlx_close(c);
        dlxd_stop(&fx);

        dlxd_start(&fx, args2);
        c = fx_connect(&fx, "a-dir");
        fx_sleep_ms(1200);
        ck_assert_int_eq(dlx_ping(c), 0);
        dlx_close(c);
        dlxd_stop(&fx);
        ck_assert_int_eq(stat(a_dir, &st), 0);
        ck_assert(S_ISDIR(st.st_mode));
        ck_assert_int_eq(rmdir(a_dir), 0);
        ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

Suite *ops_attacks_suite(void)
{
        Suite *s = suite_create("ops-attacks");
        TCase *act = tcase_create("activation");
        TCase *note = tcase_create("notification");
        TCase *met = tcase_create("metrics");
        TCase *file = tcase_create("metrics-file");

        tcase_set_timeout(act, 60);
        tcase_add_unchecked_fixture(act, ops_setup, ops_cleanup);
        tcase_add_test(act, activated_private_refuses_other_uid);
        tcase_add_test(act, activated_group_admits_only_members);
        tcase_add_test(act, activated_abstract_socket_serves);
        tcase_add_test(act, activated_serves_connections_queued_before_start);
        tcase_add_test(act, refuses_seqpacket_and_closed_fd);
        suite_add_tcase(s, act);

        tcase_set_timeout(note, 60);
        tcase_add_unchecked_fixture(note, ops_setup, ops_cleanup);
        tcase_add_test(note, ready_means_served);
        tcase_add_test(note, sigterm_before_ready);
        tcase_add_test(note, missing_notify_socket_still_serves);
        tcase_add_test(note, abstract_and_replaced_notify_sockets);
        tcase_add_test(note, watchdog_never_misses_a_period);
        tcase_add_test(note, watchdog_half_period_beside_metrics_file);
        tcase_add_test(note, unread_notify_socket_does_not_stall_serving);
        tcase_add_test(note, status_follows_clients_and_names);
        tcase_add_test(note, journal_prefix_on_refusal);
        tcase_add_test(note, journal_prefix_with_newline_in_path);
        suite_add_tcase(s, note);

        tcase_set_timeout(met, 60);
        tcase_add_unchecked_fixture(met, ops_setup, ops_cleanup);
        tcase_add_test(met, metrics_bad_request_counted_by_its_type);
        tcase_add_test(met, metrics_exact_for_pipelined_requests);
        tcase_add_test(met, metrics_waits_granted_timed_out_cancelled);
        tcase_add_test(met, metrics_exact_when_ids_are_reused);
        tcase_add_test(met, metrics_count_group_publishes);
        tcase_add_test(met, metrics_consistent_when_clients_die_mid_request);
        tcase_add_test(met, metrics_other_uids_see_only_their_own);
        tcase_add_test(met, metrics_families_and_names);
        tcase_add_test(met, metrics_per_uid_series_add_up);
        tcase_add_test(met, metrics_fds_in_flight_follow_the_peer);
        tcase_add_test(met, metrics_privacy_when_dlxd_is_not_root);
        tcase_add_test(met, metrics_call_fails_cleanly_when_daemon_dies);
        suite_add_tcase(s, met);

        tcase_set_timeout(file, 90);
        tcase_add_unchecked_fixture(file, ops_setup, ops_cleanup);
        tcase_add_test(file, metrics_file_has_every_uid);
        tcase_add_test(file, metrics_file_planted_symlink_in_tmp);
        tcase_add_test(file, metrics_file_whole_under_load_and_kill);
        tcase_add_test(file, metrics_file_rewritten_every_interval);
        tcase_add_test(file, metrics_file_unwritable_paths_serve);
        suite_add_tcase(s, file);
        return s;
}
