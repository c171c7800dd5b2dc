/* SPDX-License-Identifier: MIT */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conn.h"
#include "frame.h"
#include "log.h"
#include "registry.h"
#include "wire.h"

/* How long accepting pauses when the process is out of descriptors. */
#define ACCEPT_BACKOFF_MS 100

static int check_dir(const struct server *srv, const char *dir)
{
        struct stat st;
        bool made = mkdir(dir, 0700) == 0;

        if (!made && errno != EEXIST) {
                int err = -errno;
                log_err("cannot create socket directory %s: %s", dir, strerror(errno));
                return err;
        }
        /* the group must reach the socket: traverse, not list */
        if (made && srv->shared &&
            (chown(dir, (uid_t)-1, srv->group) < 0 || chmod(dir, 0710) < 0)) {
                int err = -errno;
                log_err("cannot give socket directory %s to group %u: %s", dir,
                        (unsigned)srv->group, strerror(errno));
                return err;
        }
        if (lstat(dir, &st) < 0) {
                int err = -errno;
                log_err("cannot inspect socket directory %s: %s", dir, strerror(errno));
                return err;
        }
        if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
                log_err("socket directory %s is not a directory (or is a symlink)", dir);
                return -ENOTDIR;
        }
        if (st.st_uid != geteuid() && st.st_uid != 0) {
                log_err("socket directory %s belongs to uid %u, not to us (uid %u)", dir,
                        (unsigned)st.st_uid, (unsigned)geteuid());
                return -EPERM;
        }
        /* others may write only where the sticky bit protects our socket (as in /tmp) */
        if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_uid == 0 && (st.st_mode & S_ISVTX))) {
                log_err("socket directory %s is writable by others (mode %04o)", dir,
                        (unsigned)(st.st_mode & 07777));
                return -EPERM;
        }
        if (srv->shared && !(st.st_mode & S_IXOTH) &&
            !(st.st_gid == srv->group && (st.st_mode & S_IXGRP)))
                log_warn("socket directory %s (mode %04o, group %u) does not let group %u reach "
                         "the socket",
                         dir, (unsigned)(st.st_mode & 07777), (unsigned)st.st_gid,
                         (unsigned)srv->group);
        return 0;
}

/* Whether a peer of another uid is a member of the shared group (primary or supplementary). */
static bool peer_in_group(int fd, const struct ucred *cred, gid_t group)
{
        gid_t small[64], *gids = small;
        socklen_t len = sizeof(small);
        bool in = cred->gid == group;

        if (in)
                return true;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, gids, &len) < 0) {
                if (errno != ERANGE || !(gids = malloc(len)))
                        return false;
                if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, gids, &len) < 0) {
                        free(gids);
                        return false;
                }
        }
        for (size_t i = 0; i < len / sizeof(gid_t) && !in; i++)
                in = gids[i] == group;
        if (gids != small)
                free(gids);
        return in;
}

/* Who may connect: our uid, root, and the shared group's members. */
static int peer_allowed(const struct server *srv, int fd, const struct ucred *cred, char *why,
                        size_t whysz)
{
        if (cred->uid == geteuid() || cred->uid == 0)
                return 0;
        if (srv->shared && peer_in_group(fd, cred, srv->group))
                return 0;
        if (srv->shared)
                snprintf(why, whysz, "uid %u is not in group %u, which this daemon is shared with",
                         (unsigned)cred->uid, (unsigned)srv->group);
        else
                snprintf(why, whysz,
                         "uid %u may not connect: this daemon is private to uid %u "
                         "(dlxd --group shares it)",
                         (unsigned)cred->uid, (unsigned)geteuid());
        return -EACCES;
}

/* A socket file already at path: refuse if a daemon answers there, else remove it. */
static int clear_stale(const char *path)
{
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        struct stat st;
        int fd, r;

        if (lstat(path, &st) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (!S_ISSOCK(st.st_mode)) {
                log_err("%s exists and is not a socket; not touching it", path);
                return -EEXIST;
        }
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        memcpy(addr.sun_path, path, strlen(path) + 1);
        r = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
        close(fd);
        if (r == 0) {
                log_err("another dlxd is already listening on %s", path);
                return -EADDRINUSE;
        }
        if (errno != ECONNREFUSED) {
                log_err("cannot probe %s: %s", path, strerror(errno));
                return -errno;
        }
        log_notice("removing stale socket %s", path);
        if (unlink(path) < 0 && errno != ENOENT)
                return -errno;
        return 0;
}

/* Not admitted: say why in one reply addressed to nobody, then hang up. */
static void refuse(int fd, int err, const char *why)
{
        struct wire_reply rep = {.id = 0, .status = wire_errno_status(err), .type = WIRE_REP_NONE};
        uint8_t buf[FRAME_HEADER_SIZE + 512];
        size_t size;

        wire_strcpy(rep.error, sizeof(rep.error), why);
        if (wire_reply_encode(&rep, buf + FRAME_HEADER_SIZE, sizeof(buf) - FRAME_HEADER_SIZE,
                              &size) == 0) {
                frame_header_put(buf, (uint32_t)size, 0);
                (void)!send(fd, buf, FRAME_HEADER_SIZE + size, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        close(fd);
}

static void on_listen(uv_poll_t *h, int status, int events);

static void on_backoff(uv_timer_t *t)
{
        struct server *srv = t->data;

        if (srv->listening)
                uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen);
}

static void on_listen(uv_poll_t *h, int status, int events)
{
        struct server *srv = h->data;

        (void)events;
        if (status < 0) {
                log_err("listening socket failed: %s", uv_strerror(status));
                return;
        }
        for (int i = 0; i < 64; i++) {
                struct ucred cred;
                socklen_t len = sizeof(cred);
                char why[128];
                struct session *s;
                int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

                if (fd < 0) {
                        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                            errno == ENOMEM) {
                                /* stop polling for a while rather than spin on a full table */
                                if (!srv->backoff_logged)
                                        log_warn("accept: %s; pausing accepts %d ms at a time "
                                                 "until descriptors free up",
                                                 strerror(errno), ACCEPT_BACKOFF_MS);
                                srv->backoff_logged = true;
                                uv_poll_stop(&srv->listen_poll);
                                uv_timer_start(&srv->backoff, on_backoff, ACCEPT_BACKOFF_MS, 0);
                        }
                        return;
                }
                srv->backoff_logged = false;
                if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                        log_warn("SO_PEERCRED: %s", strerror(errno));
                        close(fd);
                        continue;
                }
                int err = peer_allowed(srv, fd, &cred, why, sizeof(why));
                if (err == 0)
                        err = registry_admit(srv->reg, cred.uid, why, sizeof(why));
                if (err < 0) {
                        log_notice("refused pid %d uid %u: %s", (int)cred.pid, (unsigned)cred.uid,
                                   why);
                        refuse(fd, err, why);
                        continue;
                }
                s = registry_session_new(srv->reg, cred.uid, cred.gid, cred.pid);
                if (!s) {
                        close(fd);
                        continue;
                }
                if (conn_start(srv, fd, s) < 0) {
                        registry_session_free(s);
                        continue;
                }
                srv->nconns++;
                log_session(info, s, "connected");
        }
}

static bool sweep_tick(void *ctx)
{
        struct server *srv = ctx;

        conn_sweep_rings(srv);
        return !list_empty(&srv->awake);
}

static bool watchdog_tick(void *ctx)
{
        struct server *srv = ctx;

        conn_check_stalled(srv);
        conn_check_lingering(srv, false);
        return !list_empty(&srv->stalled) || !list_empty(&srv->unread) ||
               !list_empty(&srv->fd_wait) || !list_empty(&srv->lingering);
}

static bool fd_wait_tick(void *ctx)
{
        struct server *srv = ctx;

        conn_check_fd_wait(srv);
        return !list_empty(&srv->fd_wait);
}

/* Descriptors all connections together may have in flight: half the (raised) limit. */
static unsigned fd_budget(void)
{
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
                return 1u << 16;
        return rl.rlim_cur / 2 > (1u << 20) ? 1u << 20 : (unsigned)(rl.rlim_cur / 2);
}

/* A few looks per timeout, from 10 ms to 1 s apart. */
static uint64_t watchdog_period(const struct registry *reg)
{
        uint64_t p = reg->lim.timeout_ms / 4;

        return p < 10 ? 10 : p > 1000 ? 1000 : p;
}

static void schedule_close(void *ctx);

static void server_init(struct server *srv, uv_loop_t *loop, struct registry *reg, bool shared,
                        gid_t group)
{
        memset(srv, 0, sizeof(*srv));
        srv->loop = loop;
        srv->reg = reg;
        srv->listen_fd = -1;
        srv->shared = shared;
        srv->group = group;
        list_init(&srv->conns);
        list_init(&srv->doomed);
        list_init(&srv->dirty);
        list_init(&srv->awake);
        list_init(&srv->stalled);
        list_init(&srv->unread);
        list_init(&srv->lingering);
        list_init(&srv->fd_wait);
        srv->sweep.fd = -1;
        srv->watchdog.fd = -1;
        srv->fd_ticker.fd = -1;
        srv->fds_budget = fd_budget();
        reg->fds_in_flight = &srv->fds_unread;
        reg->fds_in_flight_budget = &srv->fds_budget;
        reg->refresh_in_flight = conn_refresh_fds;
        reg->refresh_ctx = srv;
}

static int serve(struct server *srv, int fd);

int server_start(struct server *srv, uv_loop_t *loop, struct registry *reg, const char *path,
                 bool shared, gid_t group)
{
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        char dir[sizeof(srv->path)];
        char *slash;
        mode_t old;
        int fd, err;

        server_init(srv, loop, reg, shared, group);
        if (strlen(path) >= sizeof(srv->path)) {
                log_err("socket path too long: %s", path);
                return -ENAMETOOLONG;
        }
        snprintf(srv->path, sizeof(srv->path), "%s", path);
        snprintf(dir, sizeof(dir), "%s", path);
        slash = strrchr(dir, '/');
        if (slash && slash != dir) {
                *slash = '\0';
                err = check_dir(srv, dir);
                if (err < 0)
                        return err;
        }
        err = clear_stale(path);
        if (err < 0)
                return err;

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        memcpy(addr.sun_path, path, strlen(path) + 1);
        old = umask(0177);
        err = bind(fd, (struct sockaddr *)&addr, sizeof(addr));
        umask(old);
        if (err == 0 && shared && chown(path, (uid_t)-1, group) < 0)
                err = -1;
        if (err < 0 || chmod(path, shared ? 0660 : 0600) < 0 || listen(fd, SOMAXCONN) < 0) {
                err = -errno;
                log_err("cannot listen on %s: %s", path, strerror(errno));
                close(fd);
                return err;
        }
        err = serve(srv, fd);
        if (err < 0)
                unlink(path);
        return err;
}

int server_adopt(struct server *srv, uv_loop_t *loop, struct registry *reg, int fd, bool shared,
                 gid_t group)
{
        struct sockaddr_un addr;
        socklen_t len = sizeof(addr);
        int flags = fcntl(fd, F_GETFL);

        server_init(srv, loop, reg, shared, group);
        srv->adopted = true;
        if (getsockname(fd, (struct sockaddr *)&addr, &len) == 0 &&
            len > offsetof(struct sockaddr_un, sun_path)) {
                size_t n = len - offsetof(struct sockaddr_un, sun_path);
                /* an abstract socket's name starts with a NUL: shown with '@' */
                if (addr.sun_path[0] == '\0')
                        addr.sun_path[0] = '@';
                snprintf(srv->path, sizeof(srv->path), "%.*s", (int)strnlen(addr.sun_path, n),
                         addr.sun_path);
        }
        if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ||
            fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
                int err = -errno;
                log_err("cannot set up the inherited socket: %s", strerror(errno));
                return err;
        }
        return serve(srv, fd);
}

/* Watches fd, a listening socket, and the server's timers. Returns 0 or -errno (fd closed). */
static int serve(struct server *srv, int fd)
{
        uv_loop_t *loop = srv->loop;
        int err;

        err = ticker_init(loop, &srv->sweep, CONN_QUIET_MS, sweep_tick, srv);
        if (err == 0)
                err = ticker_init(loop, &srv->watchdog, watchdog_period(srv->reg), watchdog_tick,
                                  srv);
        if (err == 0)
                err = ticker_init(loop, &srv->fd_ticker, CONN_FD_WAIT_MS, fd_wait_tick, srv);
        /* on failure every handle made is closed again: the loop must close empty */
        uv_handle_t *made[5];
        int nmade = 0;
        if (err == 0 && (err = uv_poll_init(loop, &srv->listen_poll, fd)) == 0)
                made[nmade++] = (uv_handle_t *)&srv->listen_poll;
        if (err == 0 && (err = uv_timer_init(loop, &srv->backoff)) == 0)
                made[nmade++] = (uv_handle_t *)&srv->backoff;
        if (err == 0 && (err = uv_idle_init(loop, &srv->reaper)) == 0)
                made[nmade++] = (uv_handle_t *)&srv->reaper;
        if (err == 0 && (err = uv_idle_init(loop, &srv->flusher)) == 0)
                made[nmade++] = (uv_handle_t *)&srv->flusher;
        if (err == 0 && (err = uv_idle_init(loop, &srv->closer)) == 0)
                made[nmade++] = (uv_handle_t *)&srv->closer;
        if (err == 0)
                err = uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen);
        if (err < 0) {
                log_err("cannot watch %s: %s", srv->path, strerror(-err));
                while (nmade > 0)
                        uv_close(made[--nmade], NULL);
                ticker_close(&srv->sweep);
                ticker_close(&srv->watchdog);
                ticker_close(&srv->fd_ticker);
                close(fd);
                return err;
        }
        srv->listen_fd = fd;
        srv->listen_poll.data = srv;
        srv->backoff.data = srv;
        srv->reaper.data = srv;
        srv->flusher.data = srv;
        srv->closer.data = srv;
        srv->reg->store->on_defer = schedule_close;
        srv->reg->store->defer_ctx = srv;
        srv->listening = true;
        return 0;
}

/* Descriptors of destroyed big segments, closed on libuv's thread pool. */
struct closing {
        uv_work_t work;
        struct store *st;
        unsigned n;
        int fds[STORE_DEFER_MAX];
};

static void close_work(uv_work_t *w)
{
        struct closing *job = w->data;

        for (unsigned i = 0; i < job->n; i++)
                close(job->fds[i]);
}

static void close_done(uv_work_t *w, int status)
{
        struct closing *job = w->data;

        if (status < 0) /* cancelled: not run */
                close_work(w);
        job->st->deferred_closing -= job->n;
        free(job);
}

/*
 * The descriptors of destroyed big segments close a loop iteration after
 * the request that destroyed them: its reply has gone (on_poll sends it),
 * and what other connections wait for goes first too. They close on the
 * thread pool, since freeing the pages of a group of hundreds of megabytes
 * takes tens of milliseconds that no other client should wait for; inline
 * where that cannot be had.
 */
static void on_close_deferred(uv_idle_t *h)
{
        struct server *srv = h->data;
        struct store *st = srv->reg->store;
        struct closing *job = malloc(sizeof(*job));

        uv_idle_stop(h);
        server_flush(srv);
        if (job) {
                job->work.data = job;
                job->st = st;
                job->n = st->ndeferred;
                memcpy(job->fds, st->deferred, st->ndeferred * sizeof(int));
                if (uv_queue_work(srv->loop, &job->work, close_work, close_done) == 0) {
                        st->deferred_closing += job->n;
                        st->ndeferred = 0;
                        return;
                }
                free(job);
        }
        store_close_deferred(st);
}

static void schedule_close(void *ctx)
{
        struct server *srv = ctx;

        uv_idle_start(&srv->closer, on_close_deferred);
}

static void on_listen_closed(uv_handle_t *h)
{
        struct server *srv = h->data;

        close(srv->listen_fd);
        srv->listen_fd = -1;
}

void server_stop(struct server *srv)
{
        struct list *pos, *tmp;

        if (!srv->listening)
                return;
        srv->listening = false;
        uv_poll_stop(&srv->listen_poll);
        uv_close((uv_handle_t *)&srv->listen_poll, on_listen_closed);
        uv_timer_stop(&srv->backoff);
        uv_close((uv_handle_t *)&srv->backoff, NULL);
        /* an inherited socket's file is its owner's (systemd's), and stays for the next start */
        if (!srv->adopted)
                unlink(srv->path);
        registry_pages_close(srv->reg);
        /* closing sessions sends events to the others: the handles that send them go last */
        list_for_each_safe(pos, tmp, &srv->conns) conn_goodbye(
                list_entry(pos, struct conn, link), -ESHUTDOWN, "the daemon is stopping");
        conn_check_lingering(srv, true);
        uv_idle_stop(&srv->reaper);
        uv_close((uv_handle_t *)&srv->reaper, NULL);
        uv_idle_stop(&srv->flusher);
        uv_close((uv_handle_t *)&srv->flusher, NULL);
        srv->reg->store->on_defer = NULL;
        store_close_deferred(srv->reg->store);
        uv_idle_stop(&srv->closer);
        uv_close((uv_handle_t *)&srv->closer, NULL);
        ticker_close(&srv->sweep);
        ticker_close(&srv->watchdog);
        ticker_close(&srv->fd_ticker);
}

void server_conn_gone(struct server *srv)
{
        srv->nconns--;
}

static void on_reap(uv_idle_t *h)
{
        struct server *srv = h->data;

        uv_idle_stop(h);
        conn_reap(srv);
}

void server_schedule_reap(struct server *srv)
{
        uv_idle_start(&srv->reaper, on_reap);
}

/*
 * Events and late replies for other connections go out in one pass before
 * the loop next polls: no epoll_ctl to watch for writability, which a socket
 * with room to spare does not need. An idle handle, because a timer callback
 * (a waiter's timeout, a release ring drained) may queue them too, and the
 * loop must not block before they are sent.
 */
static void on_flush(uv_idle_t *h)
{
        server_flush(h->data);
}

void server_flush(struct server *srv)
{
        uv_idle_stop(&srv->flusher);
        conn_flush_dirty(srv);
}

void server_schedule_flush(struct server *srv)
{
        uv_idle_start(&srv->flusher, on_flush);
}

void server_schedule_sweep(struct server *srv)
{
        if (!srv->sweep.armed && srv->sweep.fd >= 0)
                ticker_arm(&srv->sweep, true);
}

void server_schedule_watchdog(struct server *srv)
{
        if (!srv->watchdog.armed && srv->watchdog.fd >= 0)
                ticker_arm(&srv->watchdog, true);
}

void server_schedule_fd_wait(struct server *srv)
{
        if (!srv->fd_ticker.armed && srv->fd_ticker.fd >= 0)
                ticker_arm(&srv->fd_ticker, true);
}
