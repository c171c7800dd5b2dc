/* SPDX-License-Identifier: MIT */
/*
 * dlxd as a Linux service, without PID 1: socket activation (a socket handed
 * over as systemd does, LISTEN_FDS/LISTEN_PID, and through
 * systemd-socket-activate where it is installed), notification on a
 * test-owned NOTIFY_SOCKET (READY=1, STATUS=, STOPPING=1, WATCHDOG=1),
 * journald's priority prefixes, the metrics (the Metrics request and the
 * metrics file, checked by promtool where it is found: DLX_PROMTOOL or PATH).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

#define NOBODY 65534

/* ---- a daemon started as systemd starts it ------------------------------------------------ */

struct unit {
        char dir[64];
        char socket[108]; /* the listening socket's path ("" for other kinds) */
        char notify[108]; /* the notification socket's path */
        char log[128];    /* dlxd's stderr */
        int notify_fd;    /* bound datagram socket the test reads */
        pid_t pid;
};

static void unit_init(struct unit *u)
{
        struct sockaddr_un a = {.sun_family = AF_UNIX};

        memset(u, 0, sizeof(*u));
        snprintf(u->dir, sizeof(u->dir), "/tmp/dlx-svc-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(u->dir));
        snprintf(u->socket, sizeof(u->socket), "%s/dlxd.sock", u->dir);
        snprintf(u->notify, sizeof(u->notify), "%s/notify", u->dir);
        snprintf(u->log, sizeof(u->log), "%s/dlxd.log", u->dir);
        u->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(u->notify_fd, 0);
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", u->notify);
        ck_assert_int_eq(bind(u->notify_fd, (struct sockaddr *)&a, sizeof(a)), 0);
}

/* A listening AF_UNIX stream socket at u->socket, as dlxd.socket makes it. */
static int unix_listener(const struct unit *u)
{
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

        ck_assert_int_ge(fd, 0);
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", u->socket);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        ck_assert_int_eq(listen(fd, 64), 0);
        return fd;
}

/*
 * Runs dlxd with fds[0..nfds) as fds 3.. and LISTEN_FDS=nfds, LISTEN_PID its
 * own pid unless listen_pid_other (then 1: the sockets are not for it), env
 * (NAME=VALUE, NULL-terminated) added, args after its own, stderr to u->log.
 */
static void unit_spawn(struct unit *u, const int *fds, int nfds, bool listen_pid_other,
                       const char *const *env, const char *const *args)
{
        const char *dlxd = getenv("DLXD");

        ck_assert_ptr_nonnull(dlxd);
        u->pid = fork();
        ck_assert_int_ge(u->pid, 0);
        if (u->pid == 0) {
                const char *argv[64];
                char words[512], num[32];
                int n = 0, err = open(u->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

                if (err < 0 || dup2(err, 2) < 0)
                        _exit(127);
                /* fds 3.. as systemd passes them: first moved out of the way, then placed */
                int moved[8];
                for (int i = 0; i < nfds; i++)
                        if ((moved[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100)) < 0)
                                _exit(127);
                for (int i = 0; i < nfds; i++)
                        if (dup2(moved[i], 3 + i) < 0)
                                _exit(127);
                if (nfds) {
                        snprintf(num, sizeof(num), "%d", nfds);
                        setenv("LISTEN_FDS", num, 1);
                        snprintf(num, sizeof(num), "%d", listen_pid_other ? 1 : (int)getpid());
                        setenv("LISTEN_PID", num, 1);
                }
                setenv("NOTIFY_SOCKET", u->notify, 1);
                unsetenv("DLX_SOCKET");
                unsetenv("JOURNAL_STREAM");
                unsetenv("WATCHDOG_USEC");
                unsetenv("WATCHDOG_PID");
                for (int i = 0; env && env[i]; i++)
                        putenv((char *)env[i]);
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

/* The next notification within timeout_ms into buf; false if none came. */
static bool next_note(struct unit *u, char *buf, size_t len, int timeout_ms)
{
        struct pollfd p = {.fd = u->notify_fd, .events = POLLIN};
        ssize_t n;

        if (poll(&p, 1, timeout_ms * fx_slowdown()) != 1)
                return false;
        n = recv(u->notify_fd, buf, len - 1, 0);
        ck_assert_int_gt(n, 0);
        buf[n] = '\0';
        return true;
}

/* Waits for a notification containing what; returns it in buf (the test fails without). */
static void expect_note(struct unit *u, const char *what, char *buf, size_t len, int timeout_ms)
{
        int64_t end = fx_now_ms() + (int64_t)timeout_ms * fx_slowdown();

        buf[0] = '\0';
        while (fx_now_ms() < end) {
                if (next_note(u, buf, len, (int)(end - fx_now_ms())) && strstr(buf, what))
                        return;
        }
        ck_abort_msg("no notification with '%s' in %d ms (last: '%s')", what, timeout_ms, buf);
}

static char *slurp(const char *path)
{
        static char buf[1 << 16];
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);

        if (fd >= 0)
                close(fd);
        buf[n > 0 ? n : 0] = '\0';
        return buf;
}

static int unit_wait(struct unit *u)
{
        int status;

        ck_assert_int_eq(waitpid(u->pid, &status, 0), u->pid);
        u->pid = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* SIGTERM; STOPPING=1 must come, then exit status 0. */
static void unit_stop(struct unit *u)
{
        char note[512];

        ck_assert_int_eq(kill(u->pid, SIGTERM), 0);
        expect_note(u, "STOPPING=1", note, sizeof(note), 10000);
        ck_assert_msg(unit_wait(u) == 0, "dlxd exited non-zero: %s", slurp(u->log));
}

static void unit_done(struct unit *u)
{
        char path[200];

        if (u->pid > 0) {
                kill(u->pid, SIGKILL);
                waitpid(u->pid, NULL, 0);
        }
        close(u->notify_fd);
        unlink(u->socket);
        unlink(u->notify);
        unlink(u->log);
        snprintf(path, sizeof(path), "%s/dlx.prom", u->dir);
        unlink(path);
        rmdir(u->dir);
}

static dlx_client *connect_to(const char *path)
{
        struct dlx_connect_options o = {.socket_path = path,
                                        .client_name = "service-test",
                                        .timeout_ms = 10000 * fx_slowdown()};
        dlx_client *c = NULL;

        ck_assert_msg(dlx_connect(&o, &c) == 0, "connect to %s: %s", path, dlx_last_error());
        return c;
}

static void publish_vec(dlx_client *c, const char *name)
{
        struct dlx_publish_options o = {.persist = true};

        publish_ok(c, name, fx_vec_f32(c, 16, 1.0f), &o, NULL);
}

/* ---- socket activation -------------------------------------------------------------------- */

START_TEST(activated_serves_and_notifies)
{
        struct unit u;
        char note[512];
        struct stat st;
        dlx_client *c;
        int lfd;

        unit_init(&u);
        lfd = unix_listener(&u);
        unit_spawn(&u, &lfd, 1, false, NULL, NULL);
        close(lfd);
#ifdef DLX_HAVE_SYSTEMD
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        c = connect_to(u.socket);
        publish_vec(c, "svc/a");
        publish_vec(c, "svc/b");
        /* the status line follows the namespace within its period (5 s) */
        expect_note(&u, "STATUS=2 names, 1 clients", note, sizeof(note), 8000);
        ck_assert_ptr_nonnull(strstr(note, "B held"));
        ck_assert_int_eq(dlx_unpublish(c, "svc/a"), 0);
        ck_assert_int_eq(dlx_unpublish(c, "svc/b"), 0);
        dlx_close(c);
        unit_stop(&u);
        /* the socket's file is its owner's: dlxd leaves it for the next start */
        ck_assert_int_eq(lstat(u.socket, &st), 0);
        ck_assert(S_ISSOCK(st.st_mode));
        ck_assert_ptr_nonnull(strstr(slurp(u.log), "listening on"));
#else
        (void)note, (void)st, (void)c;
        ck_assert_int_eq(unit_wait(&u), 1);
        ck_assert_ptr_nonnull(strstr(slurp(u.log), "without libsystemd"));
#endif
        unit_done(&u);
}
END_TEST

#ifdef DLX_HAVE_SYSTEMD
/* One socket, then another dlxd on the same socket after the first stopped: nothing is lost. */
START_TEST(activated_socket_survives_a_restart)
{
        struct unit u;
        char note[512];
        dlx_client *c;
        int lfd;

        unit_init(&u);
        lfd = unix_listener(&u);
        for (int round = 0; round < 2; round++) {
                unit_spawn(&u, &lfd, 1, false, NULL, NULL);
                expect_note(&u, "READY=1", note, sizeof(note), 10000);
                c = connect_to(u.socket);
                ck_assert_int_eq(dlx_ping(c), 0);
                dlx_close(c);
                unit_stop(&u);
        }
        close(lfd);
        unit_done(&u);
}
END_TEST

/* A --socket given beside a passed socket: the passed one is used, and the log says so. */
START_TEST(activated_wins_over_socket_option)
{
        struct unit u;
        char note[512], other[160];
        const char *args[] = {"--socket", other, NULL};
        dlx_client *c;
        int lfd;

        unit_init(&u);
        snprintf(other, sizeof(other), "%s/other.sock", u.dir);
        lfd = unix_listener(&u);
        unit_spawn(&u, &lfd, 1, false, NULL, args);
        close(lfd);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        c = connect_to(u.socket);
        dlx_close(c);
        ck_assert_int_eq(access(other, F_OK), -1);
        unit_stop(&u);
        ck_assert_ptr_nonnull(strstr(slurp(u.log), "not --socket"));
        unit_done(&u);
}
END_TEST
#endif

/* What dlxd must refuse, and the words its refusal must have. */
static void expect_refusal(const int *fds, int nfds, const char *words)
{
        struct unit u;
        char note[256];

        unit_init(&u);
        unit_spawn(&u, fds, nfds, false, NULL, NULL);
        ck_assert_int_eq(unit_wait(&u), 1);
#ifdef DLX_HAVE_SYSTEMD
        ck_assert_msg(strstr(slurp(u.log), words), "refusal without '%s': %s", words, slurp(u.log));
#else
        (void)words;
        ck_assert_ptr_nonnull(strstr(slurp(u.log), "without libsystemd"));
#endif
        /* never ready */
        ck_assert(!next_note(&u, note, sizeof(note), 0));
        unit_done(&u);
}

START_TEST(refuses_a_datagram_socket)
{
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

        expect_refusal(&fd, 1, "datagram socket; dlxd takes only a listening AF_UNIX stream");
        close(fd);
}
END_TEST

START_TEST(refuses_a_tcp_socket)
{
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        ck_assert_int_eq(listen(fd, 4), 0);
        expect_refusal(&fd, 1, "a listening AF_INET stream socket");
        close(fd);
}
END_TEST

START_TEST(refuses_a_connected_stream)
{
        int sv[2];

        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        expect_refusal(sv, 1, "a non-listening AF_UNIX stream socket");
        close(sv[0]);
        close(sv[1]);
}
END_TEST

START_TEST(refuses_a_file)
{
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

        expect_refusal(&fd, 1, "not a socket");
        close(fd);
}
END_TEST

START_TEST(refuses_two_sockets)
{
        struct unit other;
        int fds[2];

        unit_init(&other);
        fds[0] = unix_listener(&other);
        fds[1] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        expect_refusal(fds, 2, "passed 2 sockets; dlxd listens on exactly one");
        close(fds[0]);
        close(fds[1]);
        unit_done(&other);
}
END_TEST

/* LISTEN_PID names another process: the sockets are not dlxd's, and it binds its own. */
START_TEST(listen_pid_of_another_is_ignored)
{
        struct unit u;
        char note[512], own[160];
        const char *args[] = {"--socket", own, NULL};
        dlx_client *c;
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        unit_spawn(&u, &fd, 1, true, NULL, args);
        close(fd);
#ifdef DLX_HAVE_SYSTEMD
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
#else
        (void)note;
        fx_sleep_ms(500);
#endif
        c = connect_to(own);
        dlx_close(c);
        ck_assert_int_eq(kill(u.pid, SIGTERM), 0);
        ck_assert_int_eq(unit_wait(&u), 0);
        ck_assert_int_eq(access(own, F_OK), -1); /* its own socket, removed at exit */
        unit_done(&u);
}
END_TEST

/* Through systemd's own tool, where it is installed: dlxd starts on the first connection. */
START_TEST(systemd_socket_activate)
{
        struct unit u;
        char note[512], notify_env[160];
        const char *tool = "/usr/bin/systemd-socket-activate";
        dlx_client *c;

        if (access(tool, X_OK) != 0 || getenv("DLX_TEST_DAEMON_WRAPPER")) {
                fprintf(stderr, "skipped: no %s (or under a wrapper)\n", tool);
                return;
        }
        unit_init(&u);
        snprintf(notify_env, sizeof(notify_env), "NOTIFY_SOCKET=%s", u.notify);
        u.pid = fork();
        ck_assert_int_ge(u.pid, 0);
        if (u.pid == 0) {
                int log = open(u.log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
                if (log < 0 || dup2(log, 2) < 0)
                        _exit(127);
                unsetenv("DLX_SOCKET");
                execl(tool, tool, "-l", u.socket, "-E", notify_env, getenv("DLXD"), "--log-level",
                      "info", (char *)NULL);
                _exit(127);
        }
        for (int i = 0; i < 200 && access(u.socket, F_OK) != 0; i++)
                fx_sleep_ms(10);
        /* the tool listens; the first connection execs dlxd in its place */
        c = connect_to(u.socket);
#ifdef DLX_HAVE_SYSTEMD
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        publish_vec(c, "svc/tool");
        ck_assert_int_eq(dlx_unpublish(c, "svc/tool"), 0);
        dlx_close(c);
        unit_stop(&u);
#else
        (void)note;
        dlx_close(c);
        unit_wait(&u);
#endif
        unit_done(&u);
}
END_TEST

/* ---- notification ------------------------------------------------------------------------- */

#ifdef DLX_HAVE_SYSTEMD
static int count_watchdogs(struct unit *u, int ms)
{
        char note[256];
        int n = 0;
        int64_t end = fx_now_ms() + ms;

        while (fx_now_ms() < end)
                if (next_note(u, note, sizeof(note), (int)(end - fx_now_ms())) &&
                    strcmp(note, "WATCHDOG=1") == 0)
                        n++;
        return n;
}

START_TEST(watchdog_keepalives_at_half_the_period)
{
        struct unit u;
        char note[512], own[160];
        const char *args[] = {"--socket", own, NULL};
        const char *env[] = {"WATCHDOG_USEC=400000", NULL};
        int n;

        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        unit_spawn(&u, NULL, 0, false, env, args);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        /* every 200 ms: about 10 in 2 s (a loaded machine may lose a few, never gain) */
        n = count_watchdogs(&u, 2000);
        ck_assert_msg(n >= 4 * (fx_slowdown() > 1 ? 0 : 1) && n <= 11, "%d keep-alives in 2 s", n);
        ck_assert_int_ge(n, 1);
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

/* WATCHDOG_PID names another process: the watchdog is not dlxd's. */
START_TEST(watchdog_of_another_pid_is_not_ours)
{
        struct unit u;
        char note[512], own[160];
        const char *args[] = {"--socket", own, NULL};
        const char *env[] = {"WATCHDOG_USEC=200000", "WATCHDOG_PID=1", NULL};

        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        unit_spawn(&u, NULL, 0, false, env, args);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        ck_assert_int_eq(count_watchdogs(&u, 800), 0);
        unit_stop(&u);
        unit_done(&u);
}
END_TEST

/* Under journald, each line is "<N>message": the priority, no time of its own. */
START_TEST(journal_lines_carry_priorities)
{
        struct unit u;
        char note[512], own[160], env_js[64];
        const char *args[] = {"--socket", own, NULL};
        const char *env[] = {env_js, NULL};
        struct stat st;
        char *log;

        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        /* the log file dlxd's stderr will be: made first, to name it */
        close(open(u.log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
        ck_assert_int_eq(stat(u.log, &st), 0);
        snprintf(env_js, sizeof(env_js), "JOURNAL_STREAM=%llu:%llu", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino);
        /* unit_spawn truncates and reopens the same file: same device and inode */
        unit_spawn(&u, NULL, 0, false, env, args);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        unit_stop(&u);
        log = slurp(u.log);
        ck_assert_msg(strncmp(log, "<", 1) == 0, "%s", log);
        ck_assert_ptr_nonnull(strstr(log, "<5>listening on "));
        ck_assert_ptr_nonnull(strstr(log, "<5>stopped"));
        ck_assert_ptr_null(strstr(log, "dlxd notice:"));
        unit_done(&u);

        /* a JOURNAL_STREAM that is not stderr's (inherited from elsewhere) changes nothing */
        unit_init(&u);
        snprintf(own, sizeof(own), "%s/own.sock", u.dir);
        snprintf(env_js, sizeof(env_js), "JOURNAL_STREAM=1:1");
        unit_spawn(&u, NULL, 0, false, env, args);
        expect_note(&u, "READY=1", note, sizeof(note), 10000);
        unit_stop(&u);
        log = slurp(u.log);
        ck_assert_ptr_nonnull(strstr(log, "dlxd notice: listening on "));
        ck_assert_ptr_null(strstr(log, "<5>"));
        unit_done(&u);
}
END_TEST
#endif

/* ---- metrics ------------------------------------------------------------------------------ */

/* The value of the series line that starts with series (name and labels), or -1. */
static long long series(const char *text, const char *name)
{
        size_t len = strlen(name);

        for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
                if (strncmp(p, name, len) == 0 && p[len] == ' ')
                        return strtoll(p + len + 1, NULL, 10);
        return -1;
}

static char *metrics_of(dlx_client *c)
{
        char *text = NULL;

        ck_assert_msg(dlx_metrics(c, &text) == 0, "dlx_metrics: %s", dlx_last_error());
        ck_assert_ptr_nonnull(text);
        return text;
}

/* promtool check metrics on text, where promtool is found: true when it passes or is absent. */
static void promtool_ok(const char *text)
{
        const char *tool = getenv("DLX_PROMTOOL");
        char path[] = "/tmp/dlx-prom-XXXXXX", cmd[512], out[4096];
        FILE *p;
        size_t n;
        int fd, status;

        if (!tool || !*tool || access(tool, X_OK) != 0) {
                fprintf(stderr, "promtool not found (DLX_PROMTOOL): the text is not linted\n");
                return;
        }
        fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
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

START_TEST(metrics_count_requests_errors_and_latency)
{
        struct dlx_acquire_options wait = {.timeout_ms = 300 * fx_slowdown()};
        struct dlx_acquire_options now = {.timeout_ms = 0};
        static const char *const one_name[] = {"--max-names", "1", NULL};
        DLManagedTensorVersioned *t;
        dlx_client *c;
        char *m;

        dlxd_start(&fx, one_name);
        c = fx_connect(&fx, "metrics");
        m = metrics_of(c);
        promtool_ok(m);
        ck_assert_int_eq(series(m, "dlx_requests_total{type=\"publish\"}"), 0);
        ck_assert_int_eq(series(m, "dlx_requests_total{type=\"metrics\"}"), 1);
        ck_assert_int_eq(series(m, "dlx_names"), 0);
        free(m);

        publish_vec(c, "m/a");
        t = acquire_ok(c, "m/a", NULL);
        t->deleter(t);
        /* two failures: a name that is not there, and a wait that times out */
        ck_assert_int_eq(dlx_acquire(c, "m/none", &now, &t), -ENOENT);
        ck_assert_int_eq(dlx_acquire(c, "m/late", &wait, &t), -ETIMEDOUT);
        /* and one the daemon refuses: a second name past --max-names 1 */
        ck_assert_int_eq(dlx_publish(c, "m/b", fx_vec_f32(c, 4, 0), NULL, NULL), -EAGAIN);

        m = metrics_of(c);
        promtool_ok(m);
        ck_assert_int_eq(series(m, "dlx_requests_total{type=\"publish\"}"), 2);
        ck_assert_int_eq(series(m, "dlx_requests_total{type=\"acquire\"}"), 3);
        ck_assert_int_eq(series(m, "dlx_requests_total{type=\"metrics\"}"), 2);
        ck_assert_int_eq(
                series(m, "dlx_request_errors_total{type=\"acquire\",status=\"not_found\"}"), 1);
        ck_assert_int_eq(series(m, "dlx_request_errors_total{type=\"acquire\",status=\"timeout\"}"),
                         1);
        ck_assert_int_eq(series(m, "dlx_request_errors_total{type=\"publish\",status=\"limit\"}"),
                         1);
        ck_assert_int_eq(series(m, "dlx_names_limit"), 1);
        ck_assert_int_eq(series(m, "dlx_publishes_total"), 1);
        ck_assert_int_eq(series(m, "dlx_acquires_total"), 1);
        ck_assert_int_eq(series(m, "dlx_names"), 1);
        ck_assert_int_ge(series(m, "dlx_held_bytes"), 64);
        ck_assert_int_eq(series(m, "dlx_clients"), 1);
        /* every acquire answered is timed, the one that waited 300 ms among them */
        ck_assert_int_eq(series(m, "dlx_acquire_duration_seconds_count"), 3);
        ck_assert_int_eq(series(m, "dlx_acquire_duration_seconds_bucket{le=\"+Inf\"}"), 3);
        ck_assert_int_eq(series(m, "dlx_acquire_duration_seconds_bucket{le=\"0.25\"}"), 2);
        ck_assert_int_eq(series(m, "dlx_publish_duration_seconds_count"), 2);
        {
                char line[64];
                snprintf(line, sizeof(line), "dlx_uid_names{uid=\"%u\"}", (unsigned)getuid());
                ck_assert_int_eq(series(m, line), 1);
        }
        free(m);
        ck_assert_int_eq(dlx_unpublish(c, "m/a"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* An acquire that waits is answered when the version comes: timed from its arrival. */
START_TEST(metrics_time_a_granted_wait)
{
        struct dlx_acquire_options wait = {.timeout_ms = 10000 * fx_slowdown()};
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c, *p;
        char *m;
        pid_t kid;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "waiter");
        kid = fork();
        ck_assert_int_ge(kid, 0);
        if (kid == 0) {
                fx_sleep_ms(600);
                p = fx_connect(&fx, "late-producer");
                publish_vec(p, "m/later");
                dlx_close(p);
                fx_child_exit(0);
        }
        ck_assert_int_eq(dlx_acquire(c, "m/later", &wait, &t), 0);
        t->deleter(t);
        ck_assert_int_eq(fx_wait(kid), 0);
        m = metrics_of(c);
        ck_assert_int_eq(series(m, "dlx_acquire_duration_seconds_count"), 1);
        ck_assert_int_eq(series(m, "dlx_acquire_duration_seconds_bucket{le=\"0.5\"}"), 0);
        ck_assert_int_eq(series(m, "dlx_acquire_duration_seconds_bucket{le=\"+Inf\"}"), 1);
        free(m);
        ck_assert_int_eq(dlx_unpublish(c, "m/later"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* Another uid sees its own per-uid series only; dlxd's own uid sees every uid's. */
START_TEST(metrics_per_uid_privacy)
{
        static const char *const shared[] = {"--group", "65534", NULL};
        dlx_client *c;
        char *m, mine[64];
        pid_t kid;

        if (geteuid() != 0) {
                fprintf(stderr, "skipped: needs root to play another uid\n");
                return;
        }
        dlxd_start(&fx, shared);
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        c = fx_connect(&fx, "owner");
        publish_vec(c, "m/root");
        kid = fork();
        ck_assert_int_ge(kid, 0);
        if (kid == 0) {
                dlx_client *n;
                char *t;
                if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
                        fx_child_exit(3);
                n = fx_connect(&fx, "nobody");
                publish_vec(n, "m/nobody");
                if (dlx_metrics(n, &t) != 0)
                        fx_child_exit(4);
                /* its own series, nobody else's */
                if (series(t, "dlx_uid_names{uid=\"65534\"}") != 1 ||
                    series(t, "dlx_uid_names{uid=\"0\"}") != -1 || series(t, "dlx_names") != 2)
                        fx_child_exit(5);
                free(t);
                dlx_unpublish(n, "m/nobody");
                dlx_close(n);
                fx_child_exit(0);
        }
        ck_assert_int_eq(fx_wait(kid), 0);
        publish_vec(c, "m/root2");
        m = metrics_of(c);
        snprintf(mine, sizeof(mine), "dlx_uid_names{uid=\"%u\"}", (unsigned)getuid());
        ck_assert_int_eq(series(m, mine), 2);
        ck_assert_int_ne(series(m, "dlx_uid_clients{uid=\"0\"}"), -1);
        free(m);
        ck_assert_int_eq(dlx_unpublish(c, "m/root"), 0);
        ck_assert_int_eq(dlx_unpublish(c, "m/root2"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* Nothing but FILE and no FILE.* of its own in the directory. */
static void only_the_file(const char *dir, const char *file)
{
        char cmd[256], out[512];
        FILE *p;
        size_t n;

        snprintf(cmd, sizeof(cmd), "ls -A %s", dir);
        p = popen(cmd, "r");
        n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        pclose(p);
        snprintf(cmd, sizeof(cmd), "%s\n", file);
        ck_assert_msg(strcmp(out, cmd) == 0, "in %s: %s", dir, out);
}

START_TEST(metrics_file_is_kept_and_removed)
{
        char dir[] = "/tmp/dlx-prom-XXXXXX", path[128], arg[160];
        const char *args[] = {"--metrics-file", arg, "--metrics-interval", "1", NULL};
        struct stat st;
        dlx_client *c;
        long long published = -1;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/dlx.prom", dir);
        snprintf(arg, sizeof(arg), "%s", path);
        dlxd_start(&fx, args);
        /* there from the start, readable by a collector of another uid */
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert_uint_eq(st.st_mode & 0777, 0644);
        ck_assert_int_eq(series(slurp(path), "dlx_publishes_total"), 0);
        promtool_ok(slurp(path));
        c = fx_connect(&fx, "file");
        publish_vec(c, "m/file");
        for (int i = 0; i < 50 * fx_slowdown() && published != 1; i++) {
                fx_sleep_ms(100);
                published = series(slurp(path), "dlx_publishes_total");
        }
        ck_assert_int_eq(published, 1);
        only_the_file(dir, "dlx.prom");
        ck_assert_int_eq(dlx_unpublish(c, "m/file"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
        ck_assert_int_eq(access(path, F_OK), -1);
        ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* A directory that is not there yet: dlxd serves, says so once, and writes once it is. */
START_TEST(metrics_file_recovers)
{
        char dir[] = "/tmp/dlx-prom-XXXXXX", sub[128], path[160];
        const char *args[] = {"--metrics-file", path, "--metrics-interval", "1", NULL};
        dlx_client *c;
        bool there = false;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(sub, sizeof(sub), "%s/later", dir);
        snprintf(path, sizeof(path), "%s/dlx.prom", sub);
        dlxd_start(&fx, args);
        c = fx_connect(&fx, "recover");
        ck_assert_int_eq(dlx_ping(c), 0);
        ck_assert_int_eq(mkdir(sub, 0755), 0);
        for (int i = 0; i < 50 * fx_slowdown() && !there; i++) {
                fx_sleep_ms(100);
                there = access(path, F_OK) == 0;
        }
        ck_assert(there);
        dlx_close(c);
        dlxd_stop(&fx);
        ck_assert_int_eq(rmdir(sub), 0);
        ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(metrics_options_checked)
{
        static const char *const bad[][2] = {
                {"--metrics-interval", "0"},  {"--metrics-interval", "86401"},
                {"--metrics-interval", "-1"}, {"--metrics-interval", "1s"},
                {"--metrics-interval", ""},   {"--metrics-file", ""},
        };

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                pid_t pid = fork();
                ck_assert_int_ge(pid, 0);
                if (pid == 0) {
                        int null = open("/dev/null", O_WRONLY);
                        dup2(null, 2);
                        execl(getenv("DLXD"), "dlxd", "--socket", "/tmp/dlx-never/x.sock",
                              bad[i][0], bad[i][1], (char *)NULL);
                        _exit(127);
                }
                ck_assert_msg(fx_wait(pid) == 2, "%s '%s' was taken", bad[i][0], bad[i][1]);
        }
}
END_TEST

/* NULL arguments are refused before anything is asked. */
START_TEST(metrics_null_arguments)
{
        char *text = (char *)"untouched";
        dlx_client *c;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "null");
        ck_assert_int_eq(dlx_metrics(NULL, &text), -EINVAL);
        ck_assert_int_eq(dlx_metrics(c, NULL), -EINVAL);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

Suite *service_suite(void)
{
        Suite *s = suite_create("service");
        TCase *act = tcase_create("activation");
        TCase *note = tcase_create("notification");
        TCase *met = tcase_create("metrics");

        tcase_set_timeout(act, 60);
        tcase_add_test(act, activated_serves_and_notifies);
#ifdef DLX_HAVE_SYSTEMD
        tcase_add_test(act, activated_socket_survives_a_restart);
        tcase_add_test(act, activated_wins_over_socket_option);
#endif
        tcase_add_test(act, refuses_a_datagram_socket);
        tcase_add_test(act, refuses_a_tcp_socket);
        tcase_add_test(act, refuses_a_connected_stream);
        tcase_add_test(act, refuses_a_file);
        tcase_add_test(act, refuses_two_sockets);
        tcase_add_test(act, listen_pid_of_another_is_ignored);
        tcase_add_test(act, systemd_socket_activate);
        suite_add_tcase(s, act);
#ifdef DLX_HAVE_SYSTEMD
        tcase_set_timeout(note, 60);
        tcase_add_test(note, watchdog_keepalives_at_half_the_period);
        tcase_add_test(note, watchdog_of_another_pid_is_not_ours);
        tcase_add_test(note, journal_lines_carry_priorities);
        suite_add_tcase(s, note);
#else
        (void)note;
#endif
        tcase_set_timeout(met, 60);
        tcase_add_test(met, metrics_count_requests_errors_and_latency);
        tcase_add_test(met, metrics_time_a_granted_wait);
        tcase_add_test(met, metrics_per_uid_privacy);
        tcase_add_test(met, metrics_file_is_kept_and_removed);
        tcase_add_test(met, metrics_file_recovers);
        tcase_add_test(met, metrics_options_checked);
        tcase_add_test(met, metrics_null_arguments);
        suite_add_tcase(s, met);
        return s;
}
