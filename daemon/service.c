/* SPDX-License-Identifier: MIT */
#include "service.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "log.h"
#include "metrics.h"
#include "registry.h"
#include "units.h"

/* "a datagram AF_INET socket" and the like, for a refusal. */
static void describe_socket(int fd, char *buf, size_t len)
{
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int type = 0, listening = 0;
        socklen_t il = sizeof(int);
        struct stat st;
        const char *family = "unknown-family", *kind = "";

        if (fstat(fd, &st) < 0) {
                snprintf(buf, len, "not an open descriptor");
                return;
        }
        if (!S_ISSOCK(st.st_mode)) {
                snprintf(buf, len, "not a socket (file mode %06o)", (unsigned)st.st_mode);
                return;
        }
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
                family = ss.ss_family == AF_UNIX      ? "AF_UNIX"
                         : ss.ss_family == AF_INET    ? "AF_INET"
                         : ss.ss_family == AF_INET6   ? "AF_INET6"
                         : ss.ss_family == AF_NETLINK ? "AF_NETLINK"
                                                      : "other-family";
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &il);
        il = sizeof(int);
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &il);
        kind = type == SOCK_STREAM      ? "stream"
               : type == SOCK_DGRAM     ? "datagram"
               : type == SOCK_SEQPACKET ? "seqpacket"
                                        : "other-type";
        snprintf(buf, len, "a%s %s %s socket", listening ? " listening" : " non-listening", family,
                 kind);
}

int service_listen_fd(int *ret_fd)
{
        *ret_fd = -1;
#ifdef HAVE_SYSTEMD
        char what[96];
        int n = sd_listen_fds(1);

        if (n < 0) {
                log_say(LOG_ERR, "cannot take the sockets systemd passed: %s", strerror(-n));
                return n;
        }
        if (n == 0)
                return 0;
        if (n > 1) {
                log_say(LOG_ERR,
                        "systemd passed %d sockets; dlxd listens on exactly one "
                        "(one ListenStream= in dlxd.socket)",
                        n);
                for (int i = 0; i < n; i++)
                        close(SD_LISTEN_FDS_START + i);
                return -EINVAL;
        }
        if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0) <= 0) {
                describe_socket(SD_LISTEN_FDS_START, what, sizeof(what));
                log_say(LOG_ERR,
                        "the socket systemd passed (fd %d) is %s; dlxd takes only a "
                        "listening AF_UNIX stream socket (ListenStream=/path in dlxd.socket)",
                        SD_LISTEN_FDS_START, what);
                close(SD_LISTEN_FDS_START);
                return -EINVAL;
        }
        *ret_fd = SD_LISTEN_FDS_START;
        return 0;
#else
        const char *pid = getenv("LISTEN_PID");

        if (getenv("LISTEN_FDS") && pid && strtol(pid, NULL, 10) == (long)getpid()) {
                log_say(LOG_ERR, "systemd passed a socket, but this dlxd was built without "
                                 "libsystemd (-Dsystemd=disabled) and cannot take it");
                return -ENOTSUP;
        }
        return 0;
#endif
}

/* ---- messages to systemd, from a thread of their own ------------------------------------- */

struct notifier {
        pthread_t thread;
        pthread_mutex_t mu;
        pthread_cond_t wake; /* something is posted, or quit */
        pthread_cond_t done; /* the thread sent all it had */
        /* posted, not yet sent */
        bool ready, stopping, watchdog;
        char status[160]; /* "" when none */
        bool busy, quit;
        bool failing; /* the last message failed: logged once until one goes */
};

static bool pending(const struct notifier *n)
{
        return n->ready || n->stopping || n->watchdog || n->status[0];
}

static void *notify_main(void *arg)
{
        struct notifier *n = arg;
        char msg[256];

        pthread_mutex_lock(&n->mu);
        for (;;) {
                while (!pending(n) && !n->quit)
                        pthread_cond_wait(&n->wake, &n->mu);
                if (!pending(n))
                        break;
                /* one datagram: what was posted meanwhile goes with it */
                snprintf(msg, sizeof(msg), "%s%s%s%s%s", n->ready ? "READY=1\n" : "",
                         n->stopping ? "STOPPING=1\n" : "", n->watchdog ? "WATCHDOG=1\n" : "",
                         n->status[0] ? "STATUS=" : "", n->status);
                /* assignments are separated by newlines, with none at the end */
                if (!n->status[0])
                        msg[strlen(msg) - 1] = '\0';
                n->ready = n->stopping = n->watchdog = false;
                n->status[0] = '\0';
                n->busy = true;
                pthread_mutex_unlock(&n->mu);
#ifdef HAVE_SYSTEMD
                int r = sd_notify(0, msg);
#else
                int r = 0;
#endif
                pthread_mutex_lock(&n->mu);
                n->busy = false;
                if (r < 0 && !n->failing)
                        log_warn("cannot tell systemd what dlxd does: %s (NOTIFY_SOCKET %s)",
                                 strerror(-r), getenv("NOTIFY_SOCKET"));
                else if (r >= 0 && n->failing)
                        log_notice("systemd hears from dlxd again");
                n->failing = r < 0;
                pthread_cond_broadcast(&n->done);
        }
        pthread_cond_broadcast(&n->done);
        pthread_mutex_unlock(&n->mu);
        return NULL;
}

static int notifier_start(struct service *sv)
{
        struct notifier *n = calloc(1, sizeof(*n));
        sigset_t all, old;
        int err;

        if (!n)
                return -ENOMEM;
        pthread_mutex_init(&n->mu, NULL);
        pthread_cond_init(&n->wake, NULL);
        pthread_cond_init(&n->done, NULL);
        /* signals are the loop's: the thread blocks them all */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        err = pthread_create(&n->thread, NULL, notify_main, n);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (err) {
                free(n);
                return -err;
        }
        sv->notifier = n;
        return 0;
}

/* Posts to systemd: never blocks the loop. */
static void post(struct service *sv, bool ready, bool stopping, bool watchdog, const char *status)
{
        struct notifier *n = sv->notifier;

        if (!n)
                return;
        pthread_mutex_lock(&n->mu);
        n->ready |= ready;
        n->stopping |= stopping;
        n->watchdog |= watchdog;
        if (status)
                snprintf(n->status, sizeof(n->status), "%s", status);
        pthread_cond_signal(&n->wake);
        pthread_mutex_unlock(&n->mu);
}

/*
 * Gives the thread drain_ms to send what is posted, then ends it. A thread
 * stuck in sd_notify() (nobody reads the socket) is left behind, with its
 * state: the process is about to exit.
 */
static void notifier_stop(struct service *sv, int drain_ms)
{
        struct notifier *n = sv->notifier;
        struct timespec end;
        bool drained = true;

        if (!n)
                return;
        sv->notifier = NULL;
        clock_gettime(CLOCK_REALTIME, &end);
        end.tv_sec += drain_ms / 1000;
        end.tv_nsec += (long)(drain_ms % 1000) * 1000000L;
        if (end.tv_nsec >= 1000000000L) {
                end.tv_sec++;
                end.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&n->mu);
        n->quit = true;
        pthread_cond_signal(&n->wake);
        while ((pending(n) || n->busy) && drained)
                drained = pthread_cond_timedwait(&n->done, &n->mu, &end) == 0;
        pthread_mutex_unlock(&n->mu);
        if (!drained) {
                log_warn("systemd did not take dlxd's last message in %d ms; not waiting",
                         drain_ms);
                pthread_detach(n->thread);
                return;
        }
        pthread_join(n->thread, NULL);
        pthread_cond_destroy(&n->wake);
        pthread_cond_destroy(&n->done);
        pthread_mutex_destroy(&n->mu);
        free(n);
}

static void update_status(struct service *sv)
{
        const struct registry *reg = sv->reg;
        char line[sizeof(sv->status_line)], held[32];

        units_format_size(reg->store->bytes, held, sizeof(held));
        snprintf(line, sizeof(line), "%llu names, %llu clients, %s held",
                 (unsigned long long)reg->nnames, (unsigned long long)reg->nsessions, held);
        if (strcmp(line, sv->status_line) == 0)
                return;
        snprintf(sv->status_line, sizeof(sv->status_line), "%s", line);
        post(sv, false, false, false, line);
}

/* Writes the metrics beside the file and renames them over it: a reader sees all or none. */
/* One write of the metrics file, rendered on the loop and written off it. */
struct metrics_job {
        uv_work_t work;
        struct service *sv;
        char *text;
        size_t len;
        int err; /* errno of the write, 0 when done */
};

/* Writes the text beside the file and renames it over it: a reader sees all or none. */
static int put_file(const char *path, const char *text, size_t len)
{
        size_t plen = strlen(path);
        char *tmp = malloc(plen + 8);
        int fd, err = 0;

        if (!tmp)
                return ENOMEM;
        /* node_exporter reads *.prom only: the temporary file is never half-read */
        memcpy(tmp, path, plen);
        memcpy(tmp + plen, ".XXXXXX", 8);
        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0) {
                err = errno;
                free(tmp);
                return err;
        }
        for (size_t off = 0; off < len && !err;) {
                ssize_t n = write(fd, text + off, len - off);
                if (n < 0 && errno != EINTR)
                        err = errno;
                else if (n > 0)
                        off += (size_t)n;
        }
        if (!err && fchmod(fd, 0644) < 0)
                err = errno;
        if (close(fd) < 0 && !err)
                err = errno;
        if (!err && rename(tmp, path) < 0)
                err = errno;
        if (err)
                unlink(tmp);
        free(tmp);
        return err;
}

static void metrics_written(struct service *sv, int err)
{
        if (err && !sv->metrics_failing)
                log_err("cannot write the metrics file %s: %s (retrying every %llu s)",
                        sv->metrics_path, strerror(err), (unsigned long long)sv->metrics_ms / 1000);
        else if (!err && sv->metrics_failing)
                log_notice("the metrics file %s is written again", sv->metrics_path);
        sv->metrics_failing = err != 0;
}

static void metrics_work(uv_work_t *w)
{
        struct metrics_job *job = w->data;

        job->err = put_file(job->sv->metrics_path, job->text, job->len);
}

static void metrics_done(uv_work_t *w, int status)
{
        struct metrics_job *job = w->data;
        struct service *sv = job->sv;

        sv->metrics_busy = false;
        metrics_written(sv, status < 0 ? ECANCELED : job->err);
        /* dlxd stopped meanwhile: the file this write made goes too */
        if (sv->metrics_stopped)
                unlink(sv->metrics_path);
        free(job->text);
        free(job);
}

/*
 * The metrics, rendered now and written on the thread pool, where a slow
 * file system cannot hold the loop; a write still under way is not joined by
 * another. inline: written here (at start, before READY=1).
 */
static void write_metrics(struct service *sv, bool inline_)
{
        struct metrics_job *job;

        if (sv->metrics_busy)
                return;
        job = calloc(1, sizeof(*job));
        if (!job || !(job->text = metrics_render(sv->reg, true, 0, 0, &job->len))) {
                free(job);
                metrics_written(sv, ENOMEM);
                return;
        }
        job->sv = sv;
        job->work.data = job;
        if (!inline_ && uv_queue_work(sv->loop, &job->work, metrics_work, metrics_done) == 0) {
                sv->metrics_busy = true;
                return;
        }
        metrics_written(sv, put_file(sv->metrics_path, job->text, job->len));
        free(job->text);
        free(job);
}

static bool on_watchdog(void *ctx)
{
        post(ctx, false, false, true, NULL);
        return true;
}

static bool on_status(void *ctx)
{
        update_status(ctx);
        return true;
}

static bool on_metrics(void *ctx)
{
        write_metrics(ctx, false);
        return true;
}

int service_start(struct service *sv, uv_loop_t *loop, struct registry *reg,
                  const char *metrics_path, uint64_t metrics_ms)
{
        int err = 0;

        memset(sv, 0, sizeof(*sv));
        sv->loop = loop;
        sv->reg = reg;
        sv->watchdog.fd = sv->status.fd = sv->metrics.fd = -1;
        sv->metrics_path = metrics_path;
        sv->metrics_ms = metrics_ms;
#ifdef HAVE_SYSTEMD
        uint64_t usec = 0;

        if (getenv("NOTIFY_SOCKET")) {
                err = notifier_start(sv);
                if (err < 0) {
                        log_err("cannot start the thread that talks to systemd: %s",
                                strerror(-err));
                        return err;
                }
                err = sd_watchdog_enabled(0, &usec);
                if (err < 0)
                        log_warn("ignoring the watchdog systemd asked for: %s", strerror(-err));
                else if (err > 0)
                        sv->watchdog_ms = usec / 2000 ? usec / 2000 : 1;
                err = 0;
        }
#else
        if (getenv("NOTIFY_SOCKET"))
                log_warn("NOTIFY_SOCKET is set, but this dlxd was built without libsystemd "
                         "(-Dsystemd=disabled) and tells systemd nothing (use Type=simple)");
#endif
        if (sv->watchdog_ms)
                err = ticker_init(loop, &sv->watchdog, sv->watchdog_ms, on_watchdog, sv);
        if (!err && sv->notifier)
                err = ticker_init(loop, &sv->status, SERVICE_STATUS_MS, on_status, sv);
        if (!err && metrics_path)
                err = ticker_init(loop, &sv->metrics, metrics_ms, on_metrics, sv);
        if (err < 0) {
                log_err("cannot start the service timers: %s", strerror(-err));
                service_stop(sv);
                return err;
        }
        if (sv->watchdog_ms)
                log_info("watchdog keep-alives every %llu ms", (unsigned long long)sv->watchdog_ms);
        return 0;
}

void service_ready(struct service *sv)
{
        if (sv->notifier) {
                update_status(sv);
                post(sv, true, false, false, NULL);
        }
        if (sv->metrics_path)
                write_metrics(sv, true);
        if (sv->watchdog.fd >= 0)
                ticker_arm(&sv->watchdog, true);
        if (sv->status.fd >= 0)
                ticker_arm(&sv->status, true);
        if (sv->metrics.fd >= 0)
                ticker_arm(&sv->metrics, true);
}

void service_stop(struct service *sv)
{
        post(sv, false, true, false, "stopping");
        notifier_stop(sv, SERVICE_NOTIFY_DRAIN_MS);
        /* a write under way removes what it wrote when it ends (metrics_done()) */
        if (sv->metrics_path && unlink(sv->metrics_path) < 0 && errno != ENOENT)
                log_warn("cannot remove the metrics file %s: %s", sv->metrics_path,
                         strerror(errno));
        sv->metrics_stopped = true;
        ticker_close(&sv->watchdog);
        ticker_close(&sv->status);
        ticker_close(&sv->metrics);
}
