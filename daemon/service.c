/* SPDX-License-Identifier: MIT */
#include "service.h"

#include <errno.h>
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

static uint64_t mono_ms(void)
{
        return metrics_now_ns() / 1000000u;
}

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
                fprintf(stderr, "dlxd: cannot take the sockets systemd passed: %s\n", strerror(-n));
                return n;
        }
        if (n == 0)
                return 0;
        if (n > 1) {
                fprintf(stderr,
                        "dlxd: systemd passed %d sockets; dlxd listens on exactly one "
                        "(one ListenStream= in dlxd.socket)\n",
                        n);
                for (int i = 0; i < n; i++)
                        close(SD_LISTEN_FDS_START + i);
                return -EINVAL;
        }
        if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0) <= 0) {
                describe_socket(SD_LISTEN_FDS_START, what, sizeof(what));
                fprintf(stderr,
                        "dlxd: the socket systemd passed (fd %d) is %s; dlxd takes only a "
                        "listening AF_UNIX stream socket (ListenStream=/path in dlxd.socket)\n",
                        SD_LISTEN_FDS_START, what);
                close(SD_LISTEN_FDS_START);
                return -EINVAL;
        }
        *ret_fd = SD_LISTEN_FDS_START;
        return 0;
#else
        const char *pid = getenv("LISTEN_PID");

        if (getenv("LISTEN_FDS") && pid && strtol(pid, NULL, 10) == (long)getpid()) {
                fprintf(stderr, "dlxd: systemd passed a socket, but this dlxd was built without "
                                "libsystemd (-Dsystemd=disabled) and cannot take it\n");
                return -ENOTSUP;
        }
        return 0;
#endif
}

/* Tells systemd state; a failure is logged once until a message goes through again. */
static void notify(struct service *sv, const char *state)
{
#ifdef HAVE_SYSTEMD
        int r = sd_notify(0, state);

        if (r < 0 && !sv->notify_failing)
                log_warn("cannot tell systemd '%s': %s (NOTIFY_SOCKET %s)", state, strerror(-r),
                         getenv("NOTIFY_SOCKET"));
        sv->notify_failing = r < 0;
#else
        (void)sv;
        (void)state;
#endif
}

static void update_status(struct service *sv)
{
        const struct registry *reg = sv->reg;
        char line[sizeof(sv->status)], held[32];

        units_format_size(reg->store->bytes, held, sizeof(held));
        snprintf(line, sizeof(line), "STATUS=%llu names, %llu clients, %s held",
                 (unsigned long long)reg->nnames, (unsigned long long)reg->nsessions, held);
        if (strcmp(line, sv->status) == 0)
                return;
        snprintf(sv->status, sizeof(sv->status), "%s", line);
        notify(sv, line);
}

/* Writes the metrics beside the file and renames them over it: a reader sees all or none. */
static void write_metrics(struct service *sv)
{
        size_t len, plen = strlen(sv->metrics_path);
        char *text = metrics_render(sv->reg, true, 0, &len);
        char *tmp = malloc(plen + 8);
        int fd = -1, err = 0;

        if (!text || !tmp) {
                err = ENOMEM;
                goto out;
        }
        /* node_exporter reads *.prom only: the temporary file is never half-read */
        memcpy(tmp, sv->metrics_path, plen);
        memcpy(tmp + plen, ".XXXXXX", 8);
        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0) {
                err = errno;
                goto out;
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
        if (!err && rename(tmp, sv->metrics_path) < 0)
                err = errno;
        if (err)
                unlink(tmp);
out:
        if (err && !sv->metrics_failing)
                log_err("cannot write the metrics file %s: %s (retrying every %llu s)",
                        sv->metrics_path, strerror(err), (unsigned long long)sv->metrics_ms / 1000);
        else if (!err && sv->metrics_failing)
                log_notice("the metrics file %s is written again", sv->metrics_path);
        sv->metrics_failing = err != 0;
        free(text);
        free(tmp);
}

static bool on_tick(void *ctx)
{
        struct service *sv = ctx;
        uint64_t now = mono_ms();

        if (sv->watchdog_ms && now >= sv->next_watchdog) {
                notify(sv, "WATCHDOG=1");
                sv->next_watchdog = now + sv->watchdog_ms;
        }
        if (sv->notify && now >= sv->next_status) {
                update_status(sv);
                sv->next_status = now + SERVICE_STATUS_MS;
        }
        if (sv->metrics_path && now >= sv->next_metrics) {
                write_metrics(sv);
                sv->next_metrics = now + sv->metrics_ms;
        }
        return true;
}

int service_start(struct service *sv, uv_loop_t *loop, struct registry *reg,
                  const char *metrics_path, uint64_t metrics_ms)
{
        uint64_t period = 0;
        int err;

        memset(sv, 0, sizeof(*sv));
        sv->reg = reg;
        sv->ticker.fd = -1;
        sv->metrics_path = metrics_path;
        sv->metrics_ms = metrics_ms;
#ifdef HAVE_SYSTEMD
        uint64_t usec = 0;

        sv->notify = getenv("NOTIFY_SOCKET") != NULL;
        err = sd_watchdog_enabled(0, &usec);
        if (err < 0)
                log_warn("ignoring the watchdog systemd asked for: %s", strerror(-err));
        else if (err > 0)
                sv->watchdog_ms = usec / 2000 ? usec / 2000 : 1;
#else
        if (getenv("NOTIFY_SOCKET"))
                log_warn("NOTIFY_SOCKET is set, but this dlxd was built without libsystemd "
                         "(-Dsystemd=disabled) and tells systemd nothing (use Type=simple)");
#endif
        if (sv->watchdog_ms)
                period = sv->watchdog_ms;
        if (sv->notify && (!period || SERVICE_STATUS_MS < period))
                period = SERVICE_STATUS_MS;
        if (metrics_path && (!period || metrics_ms < period))
                period = metrics_ms;
        if (!period)
                return 0;
        err = ticker_init(loop, &sv->ticker, period, on_tick, sv);
        if (err < 0) {
                log_err("cannot start the service timer: %s", strerror(-err));
                return err;
        }
        if (sv->watchdog_ms)
                log_info("watchdog keep-alives every %llu ms", (unsigned long long)sv->watchdog_ms);
        return 0;
}

void service_ready(struct service *sv)
{
        uint64_t now = mono_ms();

        if (sv->notify) {
                update_status(sv);
                notify(sv, "READY=1");
        }
        if (sv->metrics_path)
                write_metrics(sv);
        sv->next_watchdog = now + sv->watchdog_ms;
        sv->next_status = now + SERVICE_STATUS_MS;
        sv->next_metrics = now + sv->metrics_ms;
        if (sv->ticker.fd >= 0)
                ticker_arm(&sv->ticker, true);
}

void service_stopping(struct service *sv)
{
        if (sv->notify)
                notify(sv, "STOPPING=1\nSTATUS=stopping");
        if (sv->metrics_path && unlink(sv->metrics_path) < 0 && errno != ENOENT)
                log_warn("cannot remove the metrics file %s: %s", sv->metrics_path,
                         strerror(errno));
        if (sv->ticker.fd >= 0)
                ticker_arm(&sv->ticker, false);
}

void service_done(struct service *sv)
{
        ticker_close(&sv->ticker);
}
