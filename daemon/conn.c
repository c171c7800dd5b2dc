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
#include "invariant.h"
#include "log.h"
#include "registry.h"
#include "server.h"
#include "session.h"
#include "store.h"
#include "wire.h"

/* Reads per wakeup before yielding to other connections. */
#define CONN_READS_PER_WAKEUP 16
/* Frames coalesced into one sendmsg. */
#define CONN_IOV_MAX 64
/* Replies up to this size are packed on the stack, in one pass. */
#define CONN_SMALL_REPLY 1024

/*
 * A queued frame. Its fd is attached when it leaves: a segment's (a queued
 * reply costs a reference, not a descriptor) or an owned duplicate (the
 * release ring's, at hello).
 */
struct outbuf {
        struct list link;
        size_t len;
        size_t off;
        struct segment *seg; /* one reference, or NULL */
        int fd;              /* owned duplicate, -1 for none */
        bool reply;          /* an answer to a request (else an event) */
        uint8_t data[];
};

static bool outbuf_has_fd(const struct outbuf *b)
{
        return b->seg || b->fd >= 0;
}

static void conn_flush(struct conn *c);
static bool fd_may_go(struct conn *c);
static int peer_unread(const struct conn *c);
static void on_poll(uv_poll_t *h, int status, int events);
static void watch_stall(struct conn *c, bool progressed);
static void watch_unread(struct conn *c);

/* The frame's fd went with its first byte, or it will not go at all. */
static void outbuf_drop_fd(struct conn *c, struct outbuf *b)
{
        if (!outbuf_has_fd(b))
                return;
        if (b->seg)
                segment_unref(c->srv->reg->store, b->seg);
        else
                close(b->fd);
        b->seg = NULL;
        b->fd = -1;
        count_take(c->queued_fds, 1);
}

static void outbuf_free(struct conn *c, struct outbuf *b)
{
        outbuf_drop_fd(c, b);
        count_take(c->queued_replies, b->reply);
        free(b);
}

static void on_closed(uv_handle_t *h)
{
        struct conn *c = h->data;
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &c->outq) outbuf_free(c, list_entry(pos, struct outbuf, link));
        frame_reader_done(&c->reader);
        if (c->fd >= 0) /* -1: kept lingering (linger()) */
                close(c->fd);
        free(c);
}

/* Output queued for c changes by delta bytes: c's, its uid's and the server's count. */
static void queued_add(struct conn *c, int64_t delta)
{
        c->outq_bytes += (size_t)delta;
        quota_count(c->session->use, QUOTA_QUEUED, delta);
        c->srv->reg->queued += (uint64_t)delta;
}

/* Bytes of output all connections together may have queued: 16 times one's. */
static uint64_t queued_budget(const struct server *srv)
{
        uint64_t max = srv->reg->lim.max_queued;

        return 16 * (max ? max : DLX_DEFAULT_MAX_QUEUED);
}

/*
 * Whether c may queue n more bytes: within --max-queued for one connection
 * (0: no such limit), and within its uid's fair share of what all together
 * may queue, so that slow readers of one uid cannot take the daemon's memory
 * from the others.
 */
static bool queue_room(const struct conn *c, size_t n)
{
        uint64_t max = c->srv->reg->lim.max_queued;

        if (max && c->outq_bytes + n > max)
                return false;
        return quota_fair_share(queued_budget(c->srv), c->srv->reg->queued, c->session->use->queued,
                                n, QUOTA_HALF);
}

/*
 * A connection dropped while its peer had descriptors unread: they stay in
 * flight, charged by the kernel to our uid, until the peer reads them or
 * closes its end, however long that is. The socket is kept (unwatched) to
 * see when, and until then the charge stays with the peer's uid, with a
 * client slot: getting dropped does not shed what a peer holds.
 */
struct lingering {
        struct list link; /* in server.lingering */
        int fd;
        unsigned fds;
        struct uid_use *use;
};

/* Keeps c's socket lingering if its peer has fds unread; returns whether it did. */
static bool linger(struct conn *c)
{
        struct lingering *l;

        if (!c->fds_unread || peer_unread(c) == 0 || !(l = malloc(sizeof(*l))))
                return false;
        l->fd = c->fd;
        l->fds = c->fds_unread;
        l->use = c->session->use;
        quota_count(l->use, QUOTA_CLIENTS, 1); /* the session's goes with it; this one stays */
        c->srv->reg->nlingering++;
        list_insert_tail(&c->srv->lingering, &l->link);
        server_schedule_watchdog(c->srv);
        c->fds_unread = 0; /* the charge moves to l, uncounted here */
        c->fd = -1;
        return true;
}

static void lingering_end(struct server *srv, struct lingering *l)
{
        list_remove(&l->link);
        count_take(srv->fds_unread, l->fds);
        quota_count(l->use, QUOTA_UNREAD, -(int64_t)l->fds);
        quota_count(l->use, QUOTA_CLIENTS, -1);
        count_take(srv->reg->nlingering, 1);
        quota_uid_put(srv->reg->store, l->use);
        close(l->fd);
        free(l);
}

/* Ends the lingering sockets whose peers have read or closed (all of them: at a stop). */
void conn_check_lingering(struct server *srv, bool all)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &srv->lingering)
        {
                struct lingering *l = list_entry(pos, struct lingering, link);
                int unread = 0;

                if (all || ioctl(l->fd, SIOCOUTQ, &unread) < 0 || unread == 0)
                        lingering_end(srv, l);
        }
}

static void unlink_if(struct list *n)
{
        if (list_linked(n))
                list_remove(n);
}

/* What a connection has in flight leaves the counts (the server's and its uid's). */
static void fds_forget(struct conn *c)
{
        count_take(c->srv->fds_unread, c->fds_unread);
        quota_count(c->session->use, QUOTA_UNREAD, -(int64_t)c->fds_unread);
        c->fds_unread = 0;
}

void conn_close(struct conn *c)
{
        if (c->closing)
                return;
        c->closing = true;
        log_session(info, c->session, "closed");
        /* what it left unread stays charged until its peer reads it or closes */
        if (!linger(c))
                fds_forget(c);
        queued_add(c, -(int64_t)c->outq_bytes);
        registry_session_free(c->session);
        c->session = NULL;
        list_remove(&c->link);
        unlink_if(&c->doom_link);
        unlink_if(&c->dirty_link);
        unlink_if(&c->awake_link);
        unlink_if(&c->stall_link);
        unlink_if(&c->unread_link);
        unlink_if(&c->fd_wait_link);
        server_conn_gone(c->srv);
        uv_poll_stop(&c->poll);
        uv_close((uv_handle_t *)&c->poll, on_closed);
}

/* ---- descriptors in flight ---------------------------------------------------------- */

/* Bytes sent that the peer has not read yet, or -1 if the socket cannot say. */
static int peer_unread(const struct conn *c)
{
        int unread = 0;

        return ioctl(c->fd, SIOCOUTQ, &unread) == 0 ? unread : -1;
}

/* What the peer has read is no longer in flight. */
static void fds_refresh(struct conn *c)
{
        if (c->fds_unread && peer_unread(c) == 0)
                fds_forget(c);
}

/*
 * Descriptors in flight count against our uid's limit in the kernel. Each
 * connection may have a few unread, all of them together a budget, and the
 * connections of one uid at most half of what the other uids leave of it, so
 * that no number of peers (or uids) that do not read can stop the others, or
 * new clients, from getting theirs.
 */
static bool fd_share(const struct conn *c, unsigned n)
{
        const struct server *srv = c->srv;

        return quota_fair_share(srv->fds_budget, srv->fds_unread, c->session->use->unread, n,
                                QUOTA_HALF);
}

static bool fd_room(const struct conn *c)
{
        return c->fds_unread < CONN_MAX_FDS_UNREAD && fd_share(c, 1);
}

bool conn_fd_share(void *ctx, unsigned n)
{
        struct conn *c = ctx;

        if (fd_share(c, n))
                return true;
        fds_refresh(c);
        return fd_share(c, n);
}

bool conn_fd_room(void *ctx)
{
        struct conn *c = ctx;

        if (fd_room(c))
                return true;
        fds_refresh(c);
        return fd_room(c);
}

/* Whether one more fd may go to c now; if not, c waits on srv->fd_wait for a tick. */
static bool fd_may_go(struct conn *c)
{
        if (conn_fd_room(c))
                return true;
        if (!list_linked(&c->fd_wait_link)) {
                list_insert_tail(&c->srv->fd_wait, &c->fd_wait_link);
                server_schedule_fd_wait(c->srv);
        }
        /* waiting for the shared budget: the watchdog finds who holds it and reads nothing */
        if (c->fds_unread < CONN_MAX_FDS_UNREAD && c->srv->reg->lim.timeout_ms)
                server_schedule_watchdog(c->srv);
        return false;
}

void conn_refresh_fds(void *ctx)
{
        struct server *srv = ctx;

        for (struct list *pos = srv->conns.next; pos != &srv->conns; pos = pos->next)
                fds_refresh(list_entry(pos, struct conn, link));
        conn_check_lingering(srv, false);
}

void conn_check_fd_wait(struct server *srv)
{
        struct list *pos, *tmp;

        /* over the budget, anyone's count may be stale: look at all who hold some */
        if (srv->fds_unread >= srv->fds_budget / 2)
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
                        log_session(notice, c->session, "dropped: corrupt release ring");
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

/* Watch events (and a bridge's WANTED) may be dropped when the peer leaves too much unread. */
static bool droppable(const struct wire_reply *rep)
{
        return rep->type == WIRE_REP_EVENT &&
               (rep->event.kind == WIRE_EVENT_PUBLISHED || rep->event.kind == WIRE_EVENT_REPLACED ||
                rep->event.kind == WIRE_EVENT_UNPUBLISHED || rep->event.kind == WIRE_EVENT_WANTED);
}

/* Queues one reply; called by the session. fd is borrowed and duplicated; seg referenced. */
static int conn_send(void *ctx, const struct wire_reply *rep, int fd, struct segment *seg)
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
        /*
         * Replies cannot pile up (requests wait while output does), but
         * another client's publishes can bury a slow watcher in events: past
         * the limit they are dropped, and the peer is told once it has read.
         */
        if (droppable(rep) && !queue_room(c, FRAME_HEADER_SIZE + size)) {
                if (!c->events_lost)
                        log_session(notice, c->session,
                                    "%zu bytes unread: dropping watch events until it reads",
                                    c->outq_bytes);
                c->events_lost = true;
                return -ENOBUFS;
        }
        b = malloc(sizeof(*b) + FRAME_HEADER_SIZE + size);
        if (b) {
                b->seg = NULL;
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
                log_session(warn, c->session, "cannot queue a reply (%s), disconnected",
                            strerror(-err));
                c->close_pending = true;
                conn_doom(c);
                return err;
        }
        if (seg && seg->fd >= 0) {
                segment_ref(seg);
                b->seg = seg;
        }
        b->reply = rep->id != 0;
        c->queued_replies += b->reply;
        if (outbuf_has_fd(b))
                c->queued_fds++;
        frame_header_put(b->data, (uint32_t)size, outbuf_has_fd(b) ? 1 : 0);
        if (size <= sizeof(small))
                memcpy(b->data + FRAME_HEADER_SIZE, small, size);
        else
                wire_reply_pack(rep, b->data + FRAME_HEADER_SIZE);
        b->len = FRAME_HEADER_SIZE + size;
        b->off = 0;
        list_insert_tail(&c->outq, &b->link);
        queued_add(c, (int64_t)b->len);
        /*
         * Never write from here: the caller may be walking registry lists that
         * a failed write (closing this session) would change under it. Replies
         * made while dispatching go out at the end of the batch; others as
         * soon as the loop sees the socket writable.
         */
        if (!c->dispatching && !c->blocked && !list_linked(&c->dirty_link)) {
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

/* Tells a peer whose watch events were dropped, once there is room again. */
static void report_lost(struct conn *c)
{
        struct wire_reply rep = {.id = 0, .status = WIRE_OK, .type = WIRE_REP_EVENT};

        rep.event.kind = WIRE_EVENT_LOST;
        c->events_lost = false;
        conn_send(c, &rep, -1, NULL);
}

/*
 * Sends as much of the output queue as the socket takes, in few syscalls.
 * Returns true when all of it went, false when some waits for the peer
 * (socket full: *ret_full; or the fd budget) or the connection closed.
 */
static bool send_queued(struct conn *c, bool *ret_full)
{
        *ret_full = c->full = false;
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
                        if (outbuf_has_fd(b) && niov > 0)
                                break;
                        if (outbuf_has_fd(b) && b->off == 0) {
                                if (!fd_may_go(c))
                                        return false; /* the fd ticker looks again */
                                frame_attach_fd(&msg, &cbuf, b->seg ? b->seg->fd : b->fd);
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
                                *ret_full = c->full = true;
                                return false;
                        }
                        log_session(info, c->session, "send failed: %s", strerror(errno));
                        conn_close(c);
                        return false;
                }
                queued_add(c, -(int64_t)n);
                /* the peer read enough to make room: progress, whatever else it owes */
                c->unread_since = uv_now(c->srv->loop);
                if (msg.msg_control && n > 0) {
                        c->fds_unread++;
                        c->srv->fds_unread++;
                        quota_count(c->session->use, QUOTA_UNREAD, 1);
                }
                while (n > 0) {
                        struct outbuf *b = list_entry(c->outq.next, struct outbuf, link);
                        size_t left = b->len - b->off;
                        if ((size_t)n < left) {
                                b->off += (size_t)n;
                                /* the fd went with the first byte: never send it twice */
                                outbuf_drop_fd(c, b);
                                break;
                        }
                        n -= (ssize_t)left;
                        list_remove(&b->link);
                        outbuf_free(c, b);
                }
        }
        return !c->closing;
}

static void dispatch_frames(struct conn *c, bool *ret_progressed);

/*
 * c reads and answers no requests for now, and nothing about its peer is
 * timed meanwhile: too much of its output waits for the peer to read
 * (blocked), or a group it published is being checked on the thread pool
 * (answered in order: what came after it waits). conn_flush() and
 * conn_resume() take it up again.
 */
static bool requests_held(const struct conn *c)
{
        return c->blocked || c->session->group_job != NULL;
}

/* Output queued past which no more requests are read until the peer reads. */
static bool over_pause(const struct conn *c)
{
        uint64_t max = c->srv->reg->lim.max_queued;

        /*
         * A connection with nothing queued answers on: what it adds is one
         * batch at most, and its peer may well read it at once. (A uid over
         * its share pauses where its output does wait.)
         */
        if (list_empty(&c->outq))
                return false;
        return c->queued_fds >= CONN_MAX_QUEUED_FDS || (max && c->outq_bytes >= max) ||
               !queue_room(c, 0);
}

/*
 * Sends what is queued. Output the peer does not take yet stays queued, and
 * past over_pause() the connection reads no more requests until it shrinks
 * (flow control, not a drop); requests received meanwhile are answered then.
 */
static void conn_flush(struct conn *c)
{
        bool all, full, progressed = false;

        for (;;) {
                if (c->closing)
                        return;
                all = send_queued(c, &full);
                if (c->closing)
                        return;
                /* a peer being dropped gets no more of our time */
                if (c->close_pending) {
                        conn_close(c);
                        return;
                }
                if (all && c->events_lost) {
                        report_lost(c);
                        continue;
                }
                if (!c->blocked || over_pause(c) || c->dispatching)
                        break;
                /* room again: go on with the requests that waited */
                c->blocked = false;
                dispatch_frames(c, &progressed);
                watch_stall(c, progressed);
        }
        watch_unread(c);
        /* a peer that sends no more is answered in full, then closed */
        if (all && c->eof && !c->dispatching && !requests_held(c) &&
            frame_reader_pending(&c->reader) == 0) {
                conn_close(c);
                return;
        }
        /* full socket: writable wakes us; an fd waiting for the budget: the fd ticker does */
        set_events(c, (full ? UV_WRITABLE : 0) | (requests_held(c) || c->eof ? 0 : UV_READABLE));
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

/*
 * Answers the complete requests received, in order, until output has to
 * wait for the peer: a batch that queued a lot is sent at once, and what
 * the socket does not take stops the batch (conn_flush() resumes it).
 */
static void dispatch_frames(struct conn *c, bool *ret_progressed)
{
        struct frame f;
        int r = 1;

        c->dispatching = true;
        while (!c->closing && !c->close_pending) {
                if (c->outq_bytes >= CONN_BATCH_BYTES || c->queued_fds >= CONN_BATCH_FDS) {
                        bool full;
                        send_queued(c, &full);
                        if (c->closing)
                                return;
                }
                if (over_pause(c))
                        c->blocked = true;
                if (requests_held(c))
                        break;
                r = frame_reader_next(&c->reader, &f);
                if (r == 0)
                        break;
                if (r < 0) {
                        log_session(notice, c->session, "dropped: bad frame: %s", strerror(-r));
                        session_fail(c->session, 0, r, "bad frame: %s", strerror(-r));
                        c->close_pending = true;
                        break;
                }
                if (dispatch_frame(c->session, &f) == DISPATCH_CLOSE)
                        c->close_pending = true;
                *ret_progressed = true;
        }
        c->dispatching = false;
        /* a peer that has sent its last byte leaves no partial frame worth waiting for */
        if (c->eof && r == 0 && (frame_reader_pending(&c->reader) > 0 || c->reader.nfds > 0)) {
                log_session(info, c->session, "ended inside a frame");
                frame_reader_discard(&c->reader);
        }
}

static void on_readable(struct conn *c)
{
        bool progressed = false;

        /* releases posted in the ring came before anything this batch holds */
        if (c->session->ring && registry_ring_wake(c->session) < 0) {
                log_session(notice, c->session, "dropped: corrupt release ring");
                conn_close(c);
                return;
        }
        for (int i = 0; i < CONN_READS_PER_WAKEUP && !c->close_pending && !c->closing &&
                        !requests_held(c) && !c->eof;
             i++) {
                bool drained = false;
                ssize_t n = conn_read(c, &drained);

                if (n == -EAGAIN || n == -EWOULDBLOCK)
                        break;
                if (n == 0) {
                        /* the peer is done sending: answer what it asked, then close */
                        c->eof = true;
                } else if (n == -EMFILE) {
                        log_session(notice, c->session, "dropped: too many fds at once");
                        conn_goodbye(c, -E2BIG,
                                     "more descriptors at once than a frame may carry, or than "
                                     "the daemon has room for");
                        return;
                } else if (n < 0) {
                        if (n != -ECONNRESET)
                                log_session(info, c->session, "read failed: %s", strerror((int)-n));
                        conn_close(c);
                        return;
                }
                dispatch_frames(c, &progressed);
                /*
                 * No request before hello carries one (a whole frame was
                 * answered, by its id): none is parked in the reader either.
                 */
                if (!c->closing && !c->close_pending && !c->session->greeted &&
                    c->reader.nfds > 0) {
                        log_session(notice, c->session, "dropped: descriptors before hello");
                        conn_goodbye(c, -EPROTO, "descriptors sent before hello");
                        return;
                }
                if (drained)
                        break; /* level-triggered: the loop wakes us when more comes */
        }
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
        if (c->closing)
                return;
        if ((events & UV_READABLE) && !c->close_pending && !requests_held(c) && !c->eof) {
                on_readable(c);
                /*
                 * What the batch queued for others goes first: a publish's
                 * waiting acquires and watch events are what someone waits
                 * for, its own reply only tells the publisher a number. On a
                 * shared CPU the first woken runs first.
                 */
                server_flush(c->srv);
        }
        if (!c->closing)
                conn_flush(c);
}

/*
 * A peer that has not said hello, or has sent part of a frame, is on the
 * clock: the rest must come within the timeout (from the last frame that did
 * complete), or it is dropped. Slow senders cannot hold a connection open
 * with a byte at a time. A connection whose requests wait for output to go
 * is not: it is the peer's reading that is timed then (watch_unread).
 */
static void watch_stall(struct conn *c, bool progressed)
{
        struct server *srv = c->srv;
        bool stalled = srv->reg->lim.timeout_ms && !requests_held(c) && !c->eof &&
                       (!c->session->greeted || frame_reader_pending(&c->reader) > 0 ||
                        c->reader.nfds > 0);

        if (!stalled) {
                unlink_if(&c->stall_link);
                return;
        }
        if (progressed || !list_linked(&c->stall_link))
                c->stalled_since = uv_now(srv->loop);
        if (!list_linked(&c->stall_link)) {
                list_insert_tail(&srv->stalled, &c->stall_link);
                server_schedule_watchdog(srv);
        }
}

/*
 * Whether c waits for its own peer to read an answer it asked for: a full
 * socket, or its own descriptors unread. Notifications it did not ask for
 * (watch events, RELEASED, SEGMENT_GONE) may wait for an idle client as long
 * as it likes: watch events past --max-queued are dropped instead, the
 * others are bounded by what the session holds. A session that said bye is
 * owed nothing: it is kept for the leases of tensors still alive in a
 * process that may never read again (a client given up on a stopped
 * daemon), and what it left unread stays charged to its uid.
 */
static bool waits_for_peer(const struct conn *c)
{
        return c->queued_replies > 0 && (c->full || c->fds_unread >= CONN_MAX_FDS_UNREAD) &&
               !c->session->retired;
}

/* Whether c owes a read of the descriptors it holds unread while others wait for the budget. */
static bool owes_fds(const struct conn *c)
{
        return c->fds_unread && !c->session->retired;
}

/*
 * A peer owes us a read while its output waits for it to read (watch_unread),
 * and, while others wait for the shared descriptor budget, while descriptors
 * sent to it are unread. It must make progress (read something) within the
 * timeout, or it is dropped. A peer that reads, however slowly its requests
 * are served, is not; nor is an idle one holding nothing anybody waits for.
 */
static void watch_unread(struct conn *c)
{
        struct server *srv = c->srv;

        if (!srv->reg->lim.timeout_ms || list_linked(&c->unread_link) || !waits_for_peer(c))
                return;
        c->unread_since = uv_now(srv->loop);
        c->unread_seen = peer_unread(c);
        list_insert_tail(&srv->unread, &c->unread_link);
        server_schedule_watchdog(srv);
}

/* Whether a connection waits for the shared descriptor budget, not for its own peer. */
static bool budget_pressure(struct server *srv)
{
        for (struct list *pos = srv->fd_wait.next; pos != &srv->fd_wait; pos = pos->next)
                if (list_entry(pos, struct conn, fd_wait_link)->fds_unread < CONN_MAX_FDS_UNREAD)
                        return true;
        return false;
}

static void drop_stalled(struct conn *c, uint64_t limit)
{
        struct session *s = c->session;

        log_session(notice, s, "dropped: %s for %llu ms",
                    s->greeted ? "inside a frame" : "no hello", (unsigned long long)limit);
        session_fail(s, 0, -ETIMEDOUT,
                     s->greeted ? "timed out: a frame started %llu ms ago is not complete"
                                : "timed out: no hello within %llu ms",
                     (unsigned long long)limit);
        /* the message goes out with the next flush, and the connection closes */
        c->close_pending = true;
        if (!list_linked(&c->dirty_link)) {
                list_insert_tail(&c->srv->dirty, &c->dirty_link);
                server_schedule_flush(c->srv);
        }
}

void conn_check_stalled(struct server *srv)
{
        uint64_t now = uv_now(srv->loop), limit = srv->reg->lim.timeout_ms;
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &srv->stalled)
        {
                struct conn *c = list_entry(pos, struct conn, stall_link);

                if (now - c->stalled_since < limit)
                        continue;
                list_remove(&c->stall_link);
                drop_stalled(c, limit);
        }
        /* the budget is short: whoever holds some and reads nothing owes it */
        bool pressure = budget_pressure(srv);
        if (pressure && limit) {
                for (pos = srv->conns.next; pos != &srv->conns; pos = pos->next) {
                        struct conn *c = list_entry(pos, struct conn, link);
                        fds_refresh(c);
                        if (owes_fds(c) && !list_linked(&c->unread_link)) {
                                c->unread_since = now;
                                c->unread_seen = peer_unread(c);
                                list_insert_tail(&srv->unread, &c->unread_link);
                        }
                }
        }
        list_for_each_safe(pos, tmp, &srv->unread)
        {
                struct conn *c = list_entry(pos, struct conn, unread_link);
                int unread = peer_unread(c);

                fds_refresh(c);
                if (!waits_for_peer(c) && !(pressure && owes_fds(c))) {
                        list_remove(&c->unread_link); /* it owes nothing now */
                        continue;
                }
                if (unread >= 0 && unread < c->unread_seen)
                        c->unread_since = now; /* it reads: slowly is fine */
                c->unread_seen = unread;
                if (now - c->unread_since < limit)
                        continue;
                log_session(notice, c->session,
                            "dropped: read nothing for %llu ms (%u descriptors unread, %zu bytes "
                            "waiting)",
                            (unsigned long long)limit, c->fds_unread, c->outq_bytes);
                conn_close(c);
        }
}

/*
 * The group publish that paused c is done (session.io.resume): the requests
 * that came meanwhile are answered, and reading goes on.
 */
static void conn_resume(void *ctx)
{
        struct conn *c = ctx;
        bool progressed = false;

        if (c->closing)
                return;
        if (!requests_held(c) && !c->dispatching)
                dispatch_frames(c, &progressed);
        if (c->closing)
                return;
        watch_stall(c, progressed);
        conn_flush(c);
}

static void conn_end(void *ctx)
{
        struct conn *c = ctx;

        c->close_pending = true; /* what is queued goes first, as far as the socket takes it */
        conn_doom(c);
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
        list_init(&c->unread_link);
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
        session->io.fd_room = conn_fd_room;
        session->io.fd_share = conn_fd_share;
        session->io.end = conn_end;
        session->io.resume = conn_resume;
        session->io.ctx = c;
        list_insert_tail(&srv->conns, &c->link);
        c->events = UV_READABLE;
        err = uv_poll_start(&c->poll, UV_READABLE, on_poll);
        if (err < 0) {
                /* the caller frees the session; the handle closes, then frees c */
                session->io.send = NULL;
                list_remove(&c->link);
                c->closing = true;
                uv_close((uv_handle_t *)&c->poll, on_closed);
                return err;
        }
        watch_stall(c, false);
        return 0;
}
