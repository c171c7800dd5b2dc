/* SPDX-License-Identifier: MIT */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dispatch.h"
#include "log.h"
#include "registry.h"
#include "server.h"
#include "session.h"
#include "wire.h"

/* Reads per wakeup before yielding to other connections. */
#define CONN_READS_PER_WAKEUP 16
/* Frames coalesced into one sendmsg. */
#define CONN_IOV_MAX 64
/* Replies up to this size are packed on the stack, in one pass. */
#define CONN_SMALL_REPLY 1024
/* Descriptors one peer may leave unread in its output queue. */
#define CONN_MAX_QUEUED_FDS 64

struct outbuf {
        struct list link;
        size_t len;
        size_t off;
        int fd; /* owned duplicate, -1 for none */
        uint8_t data[];
};

static void conn_flush(struct conn *c);
static bool fd_may_go(struct conn *c);
static void on_poll(uv_poll_t *h, int status, int events);
static void watch_stall(struct conn *c, bool progressed);

static void outbuf_free(struct conn *c, struct outbuf *b)
{
        if (b->fd >= 0) {
                close(b->fd);
                c->queued_fds--;
        }
        free(b);
}

static void on_closed(uv_handle_t *h)
{
        struct conn *c = h->data;
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &c->outq) outbuf_free(c, list_entry(pos, struct outbuf, link));
        frame_reader_done(&c->reader);
        close(c->fd);
        free(c);
}

void conn_close(struct conn *c)
{
        if (c->closing)
                return;
        c->closing = true;
        log_info("session %llu pid %d uid %u: closed", (unsigned long long)c->session->id,
                 (int)c->session->pid, (unsigned)c->session->uid);
        registry_session_free(c->session);
        c->session = NULL;
        list_remove(&c->link);
        if (list_linked(&c->doom_link))
                list_remove(&c->doom_link);
        if (list_linked(&c->dirty_link))
                list_remove(&c->dirty_link);
        if (list_linked(&c->awake_link))
                list_remove(&c->awake_link);
        if (list_linked(&c->stall_link))
                list_remove(&c->stall_link);
        if (list_linked(&c->fd_wait_link))
                list_remove(&c->fd_wait_link);
        /* what it left unread stays charged to us until its peer closes: not ours to know */
        c->srv->fds_unread -= c->fds_unread;
        server_conn_gone(c->srv);
        uv_poll_stop(&c->poll);
        uv_close((uv_handle_t *)&c->poll, on_closed);
}

/* ---- descriptors in flight ---------------------------------------------------------- */

/* Whether the peer has read all we sent: the socket's unread output is empty. */
static bool peer_read_all(const struct conn *c)
{
        int unread = 0;

        return ioctl(c->fd, SIOCOUTQ, &unread) == 0 && unread == 0;
}

/* What the peer has read is no longer in flight. */
static void fds_refresh(struct conn *c)
{
        if (c->fds_unread && peer_read_all(c)) {
                c->srv->fds_unread -= c->fds_unread;
                c->fds_unread = 0;
        }
}

static bool fd_room(const struct conn *c)
{
        return c->fds_unread < CONN_MAX_FDS_UNREAD && c->srv->fds_unread < c->srv->fds_budget;
}

/* Whether one more fd may go to c now; if not, c waits on srv->fd_wait for a tick. */
static bool fd_may_go(struct conn *c)
{
        if (fd_room(c))
                return true;
        fds_refresh(c);
        if (fd_room(c))
                return true;
        if (!list_linked(&c->fd_wait_link)) {
                list_insert_tail(&c->srv->fd_wait, &c->fd_wait_link);
                server_schedule_fd_wait(c->srv);
        }
        return false;
}

void conn_check_fd_wait(struct server *srv)
{
        struct list *pos, *tmp;

        /* over the budget, anyone's count may be stale: look at all who hold some */
        if (srv->fds_unread >= srv->fds_budget)
                for (pos = srv->conns.next; pos != &srv->conns; pos = pos->next)
                        fds_refresh(list_entry(pos, struct conn, link));
        list_for_each_safe(pos, tmp, &srv->fd_wait)
        {
                struct conn *c = list_entry(pos, struct conn, fd_wait_link);

                fds_refresh(c);
                if (!fd_room(c))
                        continue;
                list_remove(&c->fd_wait_link);
                conn_flush(c);
        }
}

void conn_goodbye(struct conn *c, int err, const char *why)
{
        if (c->closing)
                return;
        if (!c->close_pending)
                session_fail(c->session, 0, err, "%s", why);
        c->close_pending = true;
        conn_flush(c); /* closes once it has sent what it can */
        conn_close(c);
}

void conn_sweep_rings(struct server *srv)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &srv->awake)
        {
                struct conn *c = list_entry(pos, struct conn, awake_link);

                if (c->active) {
                        /* frames came since the last sweep: look again at the next */
                        c->active = false;
                        continue;
                }
                /* quiet for a whole period: take its last releases, then sleep on its ring */
                list_remove(&c->awake_link);
                if (registry_ring_sleep(c->session) < 0) {
                        log_notice("session %llu pid %d uid %u: dropped: corrupt release ring",
                                   (unsigned long long)c->session->id, (int)c->session->pid,
                                   (unsigned)c->session->uid);
                        conn_close(c);
                }
        }
}

static void set_events(struct conn *c, int events)
{
        if (c->closing || events == c->events)
                return;
        c->events = events;
        uv_poll_start(&c->poll, events, on_poll);
}

/* Queues one reply; called by the session. fd is borrowed and duplicated. */
static int conn_send(void *ctx, const struct wire_reply *rep, int fd)
{
        struct conn *c = ctx;
        struct outbuf *b;
        /* most replies are packed once, here; a list page is sized first, then packed */
        uint8_t small[CONN_SMALL_REPLY];
        size_t size;
        int err;

        if (c->closing || c->close_pending)
                return -ENOTCONN;
        err = wire_reply_encode(rep, small, sizeof(small), &size);
        if (err < 0 && err != -ENOBUFS)
                return err;
        if (size > DLX_MAX_FRAME)
                return -EMSGSIZE;
        if (c->srv->reg->lim.max_queued && c->outq_bytes + size > c->srv->reg->lim.max_queued) {
                log_notice("session %llu pid %d uid %u: not reading its replies, disconnected",
                           (unsigned long long)c->session->id, (int)c->session->pid,
                           (unsigned)c->session->uid);
                c->close_pending = true;
                conn_doom(c);
                return -ENOBUFS;
        }
        if (fd >= 0 && c->queued_fds >= CONN_MAX_QUEUED_FDS) {
                log_notice("session %llu pid %d uid %u: %d descriptors unread, disconnected",
                           (unsigned long long)c->session->id, (int)c->session->pid,
                           (unsigned)c->session->uid, CONN_MAX_QUEUED_FDS);
                c->close_pending = true;
                conn_doom(c);
                return -ENOBUFS;
        }
        b = malloc(sizeof(*b) + FRAME_HEADER_SIZE + size);
        if (b) {
                b->fd = -1;
                if (fd >= 0 && (b->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
                        free(b);
                        b = NULL;
                }
        }
        if (!b) {
                /*
                 * A reply we cannot queue must not leave the peer waiting forever
                 * (nor with a lease it never heard of): end the session instead.
                 */
                err = errno ? -errno : -ENOMEM;
                log_warn("session %llu pid %d uid %u: cannot queue a reply (%s), disconnected",
                         (unsigned long long)c->session->id, (int)c->session->pid,
                         (unsigned)c->session->uid, strerror(-err));
                c->close_pending = true;
                conn_doom(c);
                return err;
        }
        if (b->fd >= 0)
                c->queued_fds++;
        frame_header_put(b->data, (uint32_t)size, fd >= 0 ? 1 : 0);
        if (size <= sizeof(small))
                memcpy(b->data + FRAME_HEADER_SIZE, small, size);
        else
                wire_reply_pack(rep, b->data + FRAME_HEADER_SIZE);
        b->len = FRAME_HEADER_SIZE + size;
        b->off = 0;
        list_insert_tail(&c->outq, &b->link);
        c->outq_bytes += b->len;
        /*
         * Never write from here: the caller may be walking registry lists that
         * a failed write (closing this session) would change under it. Replies
         * made while dispatching go out at the end of the batch; others as
         * soon as the loop sees the socket writable.
         */
        if (!c->dispatching && !list_linked(&c->dirty_link)) {
                list_insert_tail(&c->srv->dirty, &c->dirty_link);
                server_schedule_flush(c->srv);
        }
        return 0;
}

void conn_flush_dirty(struct server *srv)
{
        while (!list_empty(&srv->dirty)) {
                struct conn *c = list_entry(srv->dirty.next, struct conn, dirty_link);
                list_remove(&c->dirty_link);
                conn_flush(c);
        }
}

/* Sends as much of the output queue as the socket takes, in few syscalls. */
static void conn_flush(struct conn *c)
{
        while (!list_empty(&c->outq) && !c->closing) {
                struct iovec iov[CONN_IOV_MAX];
                union frame_cmsg_one cbuf;
                struct msghdr msg = {.msg_iov = iov};
                struct list *pos;
                ssize_t n;
                int niov = 0;

                for (pos = c->outq.next; pos != &c->outq && niov < CONN_IOV_MAX; pos = pos->next) {
                        struct outbuf *b = list_entry(pos, struct outbuf, link);
                        /* an fd rides on the first byte of its frame, alone in its sendmsg */
                        if (b->fd >= 0 && niov > 0)
                                break;
                        if (b->fd >= 0 && b->off == 0) {
                                if (!fd_may_go(c)) {
                                        /* a peer being dropped is not waited for */
                                        if (c->close_pending) {
                                                conn_close(c);
                                                return;
                                        }
                                        /* the rest waits for the peer to read (a tick) */
                                        set_events(c, UV_READABLE);
                                        return;
                                }
                                frame_attach_fd(&msg, &cbuf, b->fd);
                        }
                        iov[niov].iov_base = b->data + b->off;
                        iov[niov].iov_len = b->len - b->off;
                        niov++;
                }
                msg.msg_iovlen = (size_t)niov;
                n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN || errno == EWOULDBLOCK) {
                                /* a peer being dropped gets no more of our time */
                                if (c->close_pending)
                                        conn_close(c);
                                else
                                        set_events(c, UV_READABLE | UV_WRITABLE);
                                return;
                        }
                        log_info("session %llu: send failed: %s",
                                 (unsigned long long)c->session->id, strerror(errno));
                        conn_close(c);
                        return;
                }
                c->outq_bytes -= (size_t)n;
                if (msg.msg_control && n > 0) {
                        c->fds_unread++;
                        c->srv->fds_unread++;
                }
                while (n > 0) {
                        struct outbuf *b = list_entry(c->outq.next, struct outbuf, link);
                        size_t left = b->len - b->off;
                        if ((size_t)n < left) {
                                b->off += (size_t)n;
                                /* the fd went with the first byte: never send it twice */
                                if (b->fd >= 0) {
                                        close(b->fd);
                                        b->fd = -1;
                                        c->queued_fds--;
                                }
                                break;
                        }
                        n -= (ssize_t)left;
                        list_remove(&b->link);
                        outbuf_free(c, b);
                }
        }
        if (c->closing)
                return;
        if (c->close_pending) {
                conn_close(c);
                return;
        }
        set_events(c, UV_READABLE);
}

/* Reads once; returns bytes read, 0 at EOF, -EAGAIN, or another -errno. */
static ssize_t conn_read(struct conn *c, bool *ret_drained)
{
        union frame_cmsg_buf cbuf;
        struct iovec iov;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        uint8_t *space;
        size_t avail;
        ssize_t n;
        int err;

        err = frame_reader_space(&c->reader, &space, &avail);
        if (err < 0)
                return err;
        iov.iov_base = space;
        iov.iov_len = avail;
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = sizeof(cbuf.buf);
        do
                n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        err = frame_reader_take_fds(&c->reader, &msg);
        if (err < 0)
                return err;
        frame_reader_commit(&c->reader, (size_t)n);
        /* a short read took all there was: no second recvmsg just to hear EAGAIN */
        *ret_drained = (size_t)n < avail;
        return n;
}

static void on_poll(uv_poll_t *h, int status, int events)
{
        struct conn *c = h->data;

        if (status < 0) {
                conn_close(c);
                return;
        }
        if (events & UV_WRITABLE)
                conn_flush(c);
        if (c->closing || !(events & UV_READABLE) || c->close_pending)
                return;

        c->dispatching = true;
        bool progressed = false;
        /* releases posted in the ring came before anything this batch holds */
        if (c->session->ring && registry_ring_wake(c->session) < 0) {
                log_notice("session %llu pid %d uid %u: dropped: corrupt release ring",
                           (unsigned long long)c->session->id, (int)c->session->pid,
                           (unsigned)c->session->uid);
                conn_close(c);
                return;
        }
        for (int i = 0; i < CONN_READS_PER_WAKEUP && !c->close_pending && !c->closing; i++) {
                bool drained = false;
                ssize_t n = conn_read(c, &drained);
                struct frame f;
                int r;

                if (n == -EAGAIN || n == -EWOULDBLOCK)
                        break;
                if (n == 0) {
                        /* the peer is done sending: answer what it asked, then close */
                        c->close_pending = true;
                        break;
                }
                if (n < 0) {
                        if (n == -EMFILE)
                                log_notice("session %llu pid %d uid %u: dropped: too many fds",
                                           (unsigned long long)c->session->id, (int)c->session->pid,
                                           (unsigned)c->session->uid);
                        else if (n != -ECONNRESET)
                                log_info("session %llu: read failed: %s",
                                         (unsigned long long)c->session->id, strerror((int)-n));
                        conn_close(c);
                        return;
                }
                while (!c->close_pending && (r = frame_reader_next(&c->reader, &f)) != 0) {
                        if (r < 0) {
                                log_notice("session %llu pid %d uid %u: dropped: bad frame: %s",
                                           (unsigned long long)c->session->id, (int)c->session->pid,
                                           (unsigned)c->session->uid, strerror(-r));
                                session_fail(c->session, 0, r, "bad frame: %s", strerror(-r));
                                c->close_pending = true;
                                break;
                        }
                        if (dispatch_frame(c->session, &f) == DISPATCH_CLOSE)
                                c->close_pending = true;
                        progressed = true;
                }
                if (drained)
                        break; /* level-triggered: the loop wakes us when more comes */
        }
        c->dispatching = false;
        /* no timer per batch: a flag, and a sweep of all awake rings once a period */
        if (!c->closing && c->session->ring) {
                c->active = true;
                if (!list_linked(&c->awake_link)) {
                        list_insert_tail(&c->srv->awake, &c->awake_link);
                        server_schedule_sweep(c->srv);
                }
        }
        if (!c->closing)
                watch_stall(c, progressed);
        if (!c->closing)
                conn_flush(c);
}

/*
 * A peer that has not said hello, or has sent part of a frame, is on the
 * clock: the rest must come within the timeout (from the last frame that did
 * complete), or it is dropped. Slow senders cannot hold a connection open
 * with a byte at a time.
 */
static void watch_stall(struct conn *c, bool progressed)
{
        struct server *srv = c->srv;
        bool stalled = srv->reg->lim.timeout_ms &&
                       (!c->session->greeted || frame_reader_pending(&c->reader) > 0 ||
                        c->reader.nfds > 0);

        if (!stalled) {
                if (list_linked(&c->stall_link))
                        list_remove(&c->stall_link);
                return;
        }
        if (progressed || !list_linked(&c->stall_link))
                c->stalled_since = uv_now(srv->loop);
        if (!list_linked(&c->stall_link)) {
                list_insert_tail(&srv->stalled, &c->stall_link);
                server_schedule_watchdog(srv);
        }
}

void conn_check_stalled(struct server *srv)
{
        uint64_t now = uv_now(srv->loop), limit = srv->reg->lim.timeout_ms;
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &srv->stalled)
        {
                struct conn *c = list_entry(pos, struct conn, stall_link);
                struct session *s = c->session;

                if (now - c->stalled_since < limit)
                        continue;
                list_remove(&c->stall_link);
                log_notice("session %llu pid %d uid %u: dropped: %s for %llu ms",
                           (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid,
                           s->greeted ? "inside a frame" : "no hello", (unsigned long long)limit);
                session_fail(s, 0, -ETIMEDOUT,
                             s->greeted ? "timed out: a frame started %llu ms ago is not complete"
                                        : "timed out: no hello within %llu ms",
                             (unsigned long long)limit);
                /* the message goes out with the next flush, and the connection closes */
                c->close_pending = true;
                if (!list_linked(&c->dirty_link)) {
                        list_insert_tail(&srv->dirty, &c->dirty_link);
                        server_schedule_flush(srv);
                }
        }
}

void conn_doom(struct conn *c)
{
        if (c->closing || list_linked(&c->doom_link))
                return;
        list_insert_tail(&c->srv->doomed, &c->doom_link);
        server_schedule_reap(c->srv);
}

void conn_reap(struct server *srv)
{
        while (!list_empty(&srv->doomed))
                conn_close(list_entry(srv->doomed.next, struct conn, doom_link));
}

int conn_start(struct server *srv, int fd, struct session *session)
{
        struct conn *c = calloc(1, sizeof(*c));
        int err;

        if (!c) {
                close(fd);
                return -ENOMEM;
        }
        c->fd = fd;
        c->srv = srv;
        c->session = session;
        list_init(&c->outq);
        list_init(&c->doom_link);
        list_init(&c->dirty_link);
        list_init(&c->awake_link);
        list_init(&c->stall_link);
        list_init(&c->fd_wait_link);
        err = frame_reader_init(&c->reader);
        if (err == 0)
                err = uv_poll_init(srv->loop, &c->poll, fd);
        if (err < 0) {
                frame_reader_done(&c->reader);
                close(fd);
                free(c);
                return err;
        }
        c->poll.data = c;
        session->io.send = conn_send;
        session->io.ctx = c;
        list_insert_tail(&srv->conns, &c->link);
        c->events = UV_READABLE;
        uv_poll_start(&c->poll, UV_READABLE, on_poll);
        watch_stall(c, false);
        return 0;
}
