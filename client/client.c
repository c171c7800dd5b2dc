/* SPDX-License-Identifier: MIT */
/* The connection: connect and hello, request/reply, the shared reader, events. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fd.h"
#include "gpu.h"
#include "internal.h"
#include "ring.h"
#include "sockpath.h"
#include "wire_limits.h"

/* ---- lifetime ----------------------------------------------------------------------------- */

/*
 * Bumped in every child a fork makes: a client remembers the generation it
 * was connected in, and one from an older generation belongs to an ancestor
 * (its socket, its leases, and locks another thread may have held at the
 * fork). No system call on the way: getpid() would cost one per call.
 */
static unsigned fork_generation;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/*
 * Clients whose connection is open in this process, newest first. A child
 * made by fork() closes its copies of their descriptors at once: a child that
 * outlives a killed parent (a worker process, say) must not keep the
 * parent's connection, and with it its leases and names, alive. The exchange
 * API allocates from the one pinned with dlx_set_default_client(), else from
 * the oldest not closing.
 */
static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;
static dlx_client *conns;
static dlx_client *pinned;

/*
 * The process-wide locks, taken in one order before a fork and let go after
 * it on both sides: each is innermost where it is used (nothing else is taken
 * while it is held), so no thread can hold one while waiting for another.
 * The GPU files' locks are not among them: a forked child cannot use CUDA
 * its parent used (dlx__cuda_fork() tells the driver table), so never takes
 * them.
 */
static void on_fork_prepare(void)
{
        pthread_mutex_lock(&conn_lock);
        dlx__segment_fork(DLX_FORK_PREPARE);
}

static void on_fork_parent(void)
{
        dlx__segment_fork(DLX_FORK_PARENT);
        pthread_mutex_unlock(&conn_lock);
}

static void on_fork_child(void)
{
        __atomic_add_fetch(&fork_generation, 1, __ATOMIC_RELAXED);
        /* only this thread runs here: no client lock is taken, another thread may hold one */
        for (dlx_client *c = conns; c; c = c->conn_next) {
                fd_drop(&c->fd);
                fd_drop(&c->efd);
                fd_drop(&c->pfd);
        }
        conns = pinned = NULL; /* none of them is this process's */
        dlx__segment_fork(DLX_FORK_CHILD);
        dlx__cuda_fork(DLX_FORK_CHILD);
        pthread_mutex_unlock(&conn_lock);
}

static void watch_forks(void)
{
        pthread_atfork(on_fork_prepare, on_fork_parent, on_fork_child);
}

static void conn_register(dlx_client *c)
{
        pthread_mutex_lock(&conn_lock);
        c->conn_prev = NULL;
        c->conn_next = conns;
        if (conns)
                conns->conn_prev = c;
        conns = c;
        pthread_mutex_unlock(&conn_lock);
}

/* The connection's descriptor is closed from here on (c->lock held, or c not shared yet). */
/* dlx_close() began: c is no longer the exchange API's default. */
static void conn_closing(dlx_client *c)
{
        pthread_mutex_lock(&conn_lock);
        c->closing = true;
        if (pinned == c)
                pinned = NULL;
        pthread_mutex_unlock(&conn_lock);
}

void dlx_set_default_client(dlx_client *c)
{
        pthread_mutex_lock(&conn_lock);
        pinned = c;
        pthread_mutex_unlock(&conn_lock);
}

dlx_client *dlx__default_client_ref(void)
{
        dlx_client *c;

        pthread_mutex_lock(&conn_lock);
        c = pinned;
        /* newest first: the last one not closing is the oldest */
        for (dlx_client *o = conns; !pinned && o; o = o->conn_next)
                if (!o->closing)
                        c = o;
        if (c)
                dlx__client_ref(c);
        pthread_mutex_unlock(&conn_lock);
        return c;
}

static void conn_closed(dlx_client *c)
{
        pthread_mutex_lock(&conn_lock);
        if (c->conn_prev)
                c->conn_prev->conn_next = c->conn_next;
        else if (conns == c)
                conns = c->conn_next;
        if (c->conn_next)
                c->conn_next->conn_prev = c->conn_prev;
        c->conn_prev = c->conn_next = NULL;
        fd_drop(&c->fd);
        pthread_mutex_unlock(&conn_lock);
}

struct dlx_scratch *dlx__scratch_take(dlx_client *c, struct dlx_scratch *own)
{
        *own = (struct dlx_scratch){0};
        if (pthread_mutex_trylock(&c->scratch_lock) != 0)
                return own;
        c->scratch.kept = true;
        return &c->scratch;
}

void *dlx__scratch_get(struct dlx_scratch *s, unsigned slot, size_t size)
{
        if (slot >= DLX_SCRATCH_SLOTS)
                return NULL;
        if (size == 0)
                size = 1;
        if (s->cap[slot] < size) {
                free(s->buf[slot]);
                s->cap[slot] = 0;
                s->buf[slot] = malloc(size);
                if (!s->buf[slot])
                        return NULL;
                s->cap[slot] = size;
        }
        return s->buf[slot];
}

void dlx__scratch_give(dlx_client *c, struct dlx_scratch *s)
{
        size_t total = 0;

        for (unsigned i = 0; i < DLX_SCRATCH_SLOTS; i++)
                total += s->cap[i];
        if (!s->kept || total > DLX_SCRATCH_KEEP)
                for (unsigned i = 0; i < DLX_SCRATCH_SLOTS; i++) {
                        free(s->buf[i]);
                        s->buf[i] = NULL;
                        s->cap[i] = 0;
                }
        if (s->kept) {
                s->kept = false;
                pthread_mutex_unlock(&c->scratch_lock);
        }
}

bool dlx__forked(const dlx_client *c)
{
        return c->generation != __atomic_load_n(&fork_generation, __ATOMIC_RELAXED);
}

int dlx__usable(const dlx_client *c)
{
        if (dlx__forked(c))
                return dlx__fail(-ESTALE, "this client was connected by the parent process; "
                                          "connect again in this one");
        return 0;
}

void dlx__client_ref(dlx_client *c)
{
        __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

void dlx__client_unref(dlx_client *c)
{
        if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
                return;
        if (c->ring)
                munmap(c->ring, sizeof(*c->ring));
        dlx__track_final(c);
        if (c->efd >= 0)
                close(c->efd);
        if (c->pfd >= 0)
                close(c->pfd);
        dlx__arena_final(c);
        dlx__maps_final(c);
        dlx__gpu_final(c);
        for (int i = 0; i < RELEASED_KEPT; i++)
                free(c->released[i].events);
        frame_reader_done(&c->reader);
        pthread_mutex_destroy(&c->lock);
        pthread_mutex_destroy(&c->send_lock);
        pthread_mutex_destroy(&c->track_lock);
        for (unsigned i = 0; i < DLX_SCRATCH_SLOTS; i++)
                free(c->scratch.buf[i]);
        pthread_mutex_destroy(&c->scratch_lock);
        pthread_cond_destroy(&c->cond);
        free(c);
}

/* Every waiter learns the connection is gone. Lock held. */
static void fail_pending(dlx_client *c)
{
        for (struct pending *p = c->pending; p; p = p->next) {
                p->done = true;
                p->err = c->broken ? c->broken : -ECONNRESET;
        }
        c->pending = NULL;
        pthread_cond_broadcast(&c->cond);
}

static void bye_late(dlx_client *c);

/*
 * The daemon does not answer: the client is unusable from now on and every
 * waiter fails (a reader blocked on the socket wakes at its receive timeout).
 * The socket stays open: tensors acquired through it may be alive, and their
 * leases end with the session, whose end must wait for theirs (dlx_close()).
 * Lock held.
 */
static void __attribute__((format(printf, 3, 4)))
break_connection(dlx_client *c, int err, const char *fmt, ...)
{
        va_list ap;

        if (c->broken)
                return;
        c->broken = err;
        va_start(ap, fmt);
        vsnprintf(c->broken_why, sizeof(c->broken_why), fmt, ap);
        va_end(ap);
        dlx__log(c, DLX_LOG_ERR, "%s", c->broken_why);
        fail_pending(c);
        /*
         * The client reads nothing more: say bye now, so that a daemon that
         * was only stopped owes it nothing when it resumes (answers to the
         * calls given up on included) and keeps the session for its leases,
         * instead of dropping a peer that does not read.
         */
        if (err == -ETIMEDOUT)
                bye_late(c);
}

/* ---- sending ----------------------------------------------------------------------------------
 */

static int send_frame(dlx_client *c, const uint8_t *buf, size_t len, int fd)
{
        union frame_cmsg_one cbuf;
        struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        size_t off = 0;

        if (fd >= 0)
                frame_attach_fd(&msg, &cbuf, fd);
        while (off < len) {
                ssize_t n;

                iov.iov_base = (void *)(buf + off);
                iov.iov_len = len - off;
                n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        int err = errno;
                        /* whatever follows would be read as the rest of this frame */
                        if (off > 0)
                                c->torn = true;
                        /* SO_SNDTIMEO: the daemon read nothing for the client's timeout */
                        if (err == EAGAIN || err == EWOULDBLOCK)
                                return -ETIMEDOUT;
                        return err == EPIPE ? -ECONNRESET : -err;
                }
                off += (size_t)n;
                /* the fd went with the first byte */
                msg.msg_control = NULL;
                msg.msg_controllen = 0;
        }
        return 0;
}

/* Encodes and sends; req->id is assigned here. Lock held by caller. */
static int encode_send(dlx_client *c, struct wire_request *req, int fd)
{
        uint8_t stackbuf[2048];
        uint8_t *buf = stackbuf;
        size_t size;
        int err;

        req->id = c->next_id++;
        err = wire_request_size(req, &size);
        if (err < 0)
                return err;
        if (size > DLX_MAX_FRAME)
                return -EMSGSIZE;
        if (FRAME_HEADER_SIZE + size > sizeof(stackbuf)) {
                buf = malloc(FRAME_HEADER_SIZE + size);
                if (!buf)
                        return -ENOMEM;
        }
        frame_header_put(buf, (uint32_t)size, fd >= 0 ? 1 : 0);
        wire_request_pack(req, buf + FRAME_HEADER_SIZE);
        pthread_mutex_lock(&c->send_lock);
        err = send_frame(c, buf, FRAME_HEADER_SIZE + size, fd);
        pthread_mutex_unlock(&c->send_lock);
        if (buf != stackbuf)
                free(buf);
        return err;
}

/* Sends a request on a working connection, and notes what its failure means. Lock held. */
static int send_locked(dlx_client *c, struct wire_request *req, int fd)
{
        int err;

        if (c->broken)
                return c->broken;
        /* a closed client's connection carries the releases of its tensors (and a wake-up) */
        if (c->closed &&
            !(c->retired && (req->type == WIRE_REQ_RELEASE || req->type == WIRE_REQ_PING)))
                return -ECONNRESET;
        err = encode_send(c, req, fd);
        /* everything but a release is answered: the daemon's silence counts from here */
        if (err == 0 && req->type != WIRE_REQ_RELEASE && req->type != WIRE_REQ_PING)
                c->asked_ms = dlx__now_ms();
        if (err == -ETIMEDOUT)
                break_connection(c, err, "the daemon read nothing from us for %lld ms",
                                 (long long)c->timeout_ms);
        else if (err < 0 && !c->broken)
                c->broken = err;
        return err;
}

int dlx__send(dlx_client *c, struct wire_request *req, int fd)
{
        return send_locked(c, req, fd);
}

void dlx__give_back(dlx_client *c, uint64_t lease)
{
        struct wire_request rel = {.type = WIRE_REQ_RELEASE};

        rel.release.lease = lease;
        pthread_mutex_lock(&c->lock);
        dlx__send(c, &rel, -1);
        pthread_mutex_unlock(&c->lock);
}

void dlx__release(dlx_client *c, struct wire_request *req)
{
        struct release_ring *r = c->ring;

        /* a closed session's leases go with it, at the daemon */
        if ((c->closed && !c->retired) || c->broken)
                return;
        /* retired: no ring, whose wake-up ping would get a reply nobody reads */
        if (r && !req->release.has_event && !c->retired) {
                uint64_t h = r->head;
                if (h - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) < RING_SLOTS) {
                        r->lease[h % RING_SLOTS] = req->release.lease;
                        __atomic_store_n(&r->head, h + 1, __ATOMIC_SEQ_CST);
                        /*
                         * The daemon is asleep on the ring: any frame wakes it, and
                         * a release of lease 0 (1.1) is one it does not answer.
                         * Nothing may come back that no call is there to read.
                         */
                        if (__atomic_load_n(&r->asleep, __ATOMIC_SEQ_CST)) {
                                struct wire_request wake = {.type = WIRE_REQ_RELEASE};
                                if (c->server_minor < 1)
                                        wake.type = WIRE_REQ_PING;
                                send_locked(c, &wake, -1);
                        }
                        return;
                }
        }
        send_locked(c, req, -1);
}

/* ---- receiving ------------------------------------------------------------------------------- */

/* The caller waiting for reply id, taken off the list if take; NULL if none. */
static struct pending *pending_find(dlx_client *c, uint64_t id, bool take)
{
        for (struct pending **pp = &c->pending; *pp; pp = &(*pp)->next) {
                if ((*pp)->id == id) {
                        if (!take)
                                return *pp;
                        struct pending *p = *pp;
                        *pp = p->next;
                        return p;
                }
        }
        return NULL;
}

/* Watch events kept for dlx_next_event() before new ones are dropped. */
#define MAX_QUEUED_EVENTS 65536

/* Appends an event; a dropped one (queue full, no memory) leaves a LOST to report. */
static void enqueue_event(dlx_client *c, enum dlx_event_kind kind, uint64_t watch, uint64_t version,
                          const char *name)
{
        struct event_node *n;

        if (c->nevents >= MAX_QUEUED_EVENTS) {
                if (!c->events_dropped)
                        dlx__log(c, DLX_LOG_WARNING,
                                 "%d watch events unread: dropping new ones until some are read",
                                 MAX_QUEUED_EVENTS);
                c->events_dropped = true;
                return;
        }
        n = calloc(1, sizeof(*n));
        if (!n) {
                dlx__log(c, DLX_LOG_WARNING, "out of memory: watch event on '%s' dropped", name);
                c->events_dropped = true;
                return;
        }
        n->ev.kind = kind;
        n->ev.watch = watch;
        n->ev.version = version;
        wire_strcpy(n->ev.name, sizeof(n->ev.name), name);
        if (c->ev_tail)
                c->ev_tail->next = n;
        else
                c->ev_head = n;
        c->ev_tail = n;
        /* dlx_fd() polls readable while events wait, whoever read them off the socket */
        if (c->nevents++ == 0) {
                uint64_t one = 1;
                (void)!write(c->efd, &one, sizeof(one));
        }
}

static void queue_event(dlx_client *c, const struct wire_reply *rep)
{
        enqueue_event(c, (enum dlx_event_kind)rep->event.kind, rep->event.watch, rep->event.version,
                      rep->event.name);
}

static int cmp_token(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct held, node)->token);
}

/* Keeps what dlx_wait_released() needs of a RELEASED notice, in a ring. */
static void remember_released(dlx_client *c, const struct wire_reply *rep, int device)
{
        struct released *r = &c->released[c->released_next++ % RELEASED_KEPT];

        free(r->events);
        memset(r, 0, sizeof(*r));
        snprintf(r->name, sizeof(r->name), "%s", rep->event.name);
        r->version = rep->event.version;
        r->device = device;
        if (rep->event.nevents) {
                r->events = malloc((size_t)rep->event.nevents * DLX_CUDA_HANDLE);
                if (r->events) {
                        memcpy(r->events, rep->event.events,
                               (size_t)rep->event.nevents * DLX_CUDA_HANDLE);
                        r->nevents = rep->event.nevents;
                }
        }
}

static void on_event(dlx_client *c, const struct wire_reply *rep)
{
        struct avl_node *n;

        switch (rep->event.kind) {
        case WIRE_EVENT_PUBLISHED:
        case WIRE_EVENT_REPLACED:
        case WIRE_EVENT_UNPUBLISHED:
                queue_event(c, rep);
                break;
        case WIRE_EVENT_LOST:
                /* the daemon dropped some for want of room: say so where they would be */
                enqueue_event(c, DLX_EVENT_LOST, 0, 0, "");
                break;
        case WIRE_EVENT_WANTED:
                enqueue_event(c, DLX_EVENT_WANTED, 0, rep->event.version, rep->event.name);
                break;
        case WIRE_EVENT_RELEASED:
                n = avl_find(&c->held, &rep->event.token, cmp_token);
                if (n) {
                        struct held *h = avl_entry(n, struct held, node);
                        avl_remove(&c->held, n);
                        remember_released(c, rep, h->has_gpu ? h->gpu.device : -1);
                        /* reuse of the memory waits, on the GPU, for every reader */
                        if (h->has_gpu)
                                dlx__gpu_released(c, &h->gpu, rep->event.events,
                                                  rep->event.nevents);
                        h->next_deleter = c->deleters;
                        c->deleters = h;
                } else {
                        remember_released(c, rep, -1);
                }
                break;
        case WIRE_EVENT_SEGMENT_GONE:
                dlx__map_gone(c, rep->event.segment);
                break;
        default:
                dlx__log(c, DLX_LOG_DEBUG, "unknown event kind %d ignored", rep->event.kind);
                break;
        }
}

/*
 * An fd the daemon counts as delivered could not be used: make it send one
 * again next time.
 */
static void forget_one(dlx_client *c, uint64_t seg_id)
{
        struct wire_request fr = {.type = WIRE_REQ_FORGET};
        struct seg_map *m = dlx__map_find(c, seg_id);

        fr.forget.segments[0] = seg_id;
        fr.forget.count = 1;
        dlx__send(c, &fr, -1);
        if (m)
                m->forgotten = true;
}

/*
 * Replies that carry a segment are resolved to a mapping here, in stream
 * order, so a reply without an fd always finds the mapping it relies on.
 */
static void resolve_segment(dlx_client *c, struct pending *p)
{
        struct wire_reply *rep = &p->rep;
        int fd = p->fd, err = 0;
        bool had_fd = fd >= 0;

        p->fd = -1;
        if (rep->status == WIRE_OK && rep->type == WIRE_REP_ACQUIRE &&
            (rep->acquire.tensor.table_segment || p->table_fd >= 0)) {
                /* a device group's table first: a read-only memfd, like a group's */
                int tfd = p->table_fd;
                p->table_fd = -1;
                if (tfd >= 0 && p->table_seg != rep->acquire.tensor.table_segment) {
                        close(tfd);
                        err = -EPROTO;
                } else {
                        err = dlx__map_get(c, rep->acquire.tensor.table_segment, WIRE_STORAGE_MEMFD,
                                           0, p->table_size, tfd, false, &p->table_map);
                }
                if (err < 0 && tfd >= 0)
                        forget_one(c, p->table_seg);
        }
        if (err < 0) {
                /* nothing more to map */
        } else if (rep->status == WIRE_OK && rep->type == WIRE_REP_ACQUIRE) {
                struct wire_tensor *t = &rep->acquire.tensor;
                const struct storage_kind *kind = storage_kind(t->storage);
                if (!kind) {
                        err = dlx__fail(-ENOTSUP,
                                        "'%s' is shared as storage kind %u, which this build "
                                        "cannot map",
                                        t->name, t->storage);
                } else if (kind->needs_cuda && (err = dlx__gpu_reachable(t)) < 0) {
                        /* another PID namespace, or a GPU not seen here: nothing to map */
                } else if (kind->check != STORAGE_CHECK_HANDLE) {
                        /* (a handle travels in the descriptor: no segment to map) */
                        err = dlx__map_get(c, t->segment, t->storage, t->device_id,
                                           rep->acquire.segment_size, fd, rep->acquire.writable,
                                           &p->map);
                        fd = -1;
                }
        } else if (rep->status == WIRE_OK &&
                   (rep->type == WIRE_REP_HELLO || rep->type == WIRE_REP_TRACK) && fd >= 0) {
                p->fd = fd; /* the release ring or the version page: the caller maps it */
                fd = -1;
        } else if (rep->status == WIRE_OK && rep->type == WIRE_REP_ALLOC && fd >= 0) {
                /* a memfd the daemon made; a VMM segment of ours comes back without one */
                err = dlx__map_get(c, rep->alloc.segment, WIRE_STORAGE_MEMFD, 0, rep->alloc.size,
                                   fd, true, &p->map);
                fd = -1;
        }
        fd_drop(&fd);
        if (err < 0 && had_fd && rep->type == WIRE_REP_ACQUIRE)
                forget_one(c, rep->acquire.tensor.segment);
        if (err < 0) {
                p->err = err;
                /* recorded for the waiting thread: this may be another thread reading */
                snprintf(p->why, sizeof(p->why), "cannot map segment: %s",
                         *dlx_last_error() ? dlx_last_error() : dlx_strerror(err));
        }
}

/*
 * Whether the reply to a request of type may be lost without the client and
 * the daemon disagreeing on anything after (a lease, a watch, a held segment
 * or a descriptor the daemon counts as delivered, a published version).
 */
static bool leaves_nothing(uint32_t type)
{
        switch (type) {
        case WIRE_REQ_LIST:
        case WIRE_REQ_STAT:
        case WIRE_REQ_STATS:
        case WIRE_REQ_PING:
                return true;
        default:
                return false;
        }
}

/* One complete frame from the daemon. Lock held. */
static void on_frame(dlx_client *c, struct frame *f)
{
        struct wire_reply rep;
        struct pending *p;
        char err[128];
        int r;

        r = wire_reply_decode(f->payload, f->len, &rep, err, sizeof(err));
        if (r == -ENOMEM && !f->nfds && (p = pending_find(c, rep.id, false)) &&
            leaves_nothing(p->type)) {
                /* only its caller loses: the daemon keeps nothing for it that we must know */
                pending_find(c, rep.id, true);
                p->err = -ENOMEM;
                snprintf(p->why, sizeof(p->why), "%s", err);
                p->done = true;
                return;
        }
        if (r < 0) {
                frame_close_fds(f);
                dlx__log(c, DLX_LOG_ERR, "bad reply from the daemon: %s", err);
                if (r == -ENOMEM)
                        snprintf(c->broken_why, sizeof(c->broken_why),
                                 "%s, one that left state in the daemon: the connection is closed",
                                 err);
                c->broken = r == -ENOMEM ? -ENOMEM : -EPROTO;
                return;
        }
        if (rep.id == 0) {
                frame_close_fds(f);
                if (rep.type == WIRE_REP_EVENT) {
                        on_event(c, &rep);
                } else if (rep.status != WIRE_OK) {
                        /* a connection-level refusal: the daemon hangs up next */
                        dlx__log(c, DLX_LOG_ERR, "daemon: %s", rep.error);
                        snprintf(c->broken_why, sizeof(c->broken_why), "%s", rep.error);
                        c->broken = -wire_status_errno(rep.status);
                }
                wire_reply_done(&rep);
                return;
        }
        if (rep.type == WIRE_REP_SEGMENT && rep.status == WIRE_OK) {
                /* (1.4) a device group's table, before the acquire reply that names it */
                p = pending_find(c, rep.id, false);
                if (p && p->type == WIRE_REQ_ACQUIRE && p->table_fd < 0 && f->nfds == 1) {
                        p->table_fd = f->fds[0];
                        p->table_seg = rep.segment.segment;
                        p->table_size = rep.segment.size;
                        f->nfds = 0;
                } else {
                        frame_close_fds(f);
                        dlx__log(c, DLX_LOG_ERR, "a segment reply to request %llu, unasked for",
                                 (unsigned long long)rep.id);
                        snprintf(c->broken_why, sizeof(c->broken_why),
                                 "the daemon sent a segment no request of this client waits for");
                        c->broken = -EPROTO;
                }
                wire_reply_done(&rep);
                return;
        }
        p = pending_find(c, rep.id, true);
        if (!p) {
                /* answers to one-way requests: only failures and forgets matter */
                frame_close_fds(f);
                if (rep.status != WIRE_OK)
                        dlx__log(c, DLX_LOG_WARNING, "request %llu failed: %s",
                                 (unsigned long long)rep.id, rep.error);
                dlx__map_forgotten(c, rep.id);
                wire_reply_done(&rep);
                return;
        }
        p->rep = rep;
        if (f->nfds > 0) {
                p->fd = f->fds[0];
                for (unsigned i = 1; i < f->nfds; i++)
                        close(f->fds[i]);
                f->nfds = 0;
        }
        resolve_segment(c, p);
        p->done = true;
}

/* Reads once without the lock (blocking or not); returns bytes, 0 on EOF, -EAGAIN or -errno. */
static ssize_t read_some(dlx_client *c, bool block)
{
        union frame_cmsg_buf cbuf;
        struct iovec iov;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        uint8_t *space;
        size_t avail;
        ssize_t n;

        if (frame_reader_space(&c->reader, &space, &avail) < 0)
                return -ENOMEM;
        iov.iov_base = space;
        iov.iov_len = avail;
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = sizeof(cbuf.buf);
        do
                n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | (block ? 0 : MSG_DONTWAIT));
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return -errno;
        if (frame_reader_take_fds(&c->reader, &msg) < 0) {
                /*
                 * The daemon sends one descriptor per message: a truncated one
                 * means this process is at its descriptor limit, and the
                 * kernel dropped one the daemon counts as ours.
                 */
                return msg.msg_flags & MSG_CTRUNC ? -EMFILE : -EPROTO;
        }
        frame_reader_commit(&c->reader, (size_t)n);
        return n;
}

int64_t dlx__now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t dlx__deadline_ms(int64_t timeout_ms)
{
        int64_t now = dlx__now_ms();

        return timeout_ms > INT64_MAX - now ? INT64_MAX : now + timeout_ms;
}

/*
 * Makes progress on the socket for up to timeout_ms (< 0: until something
 * arrives). Lock held on entry and exit. If another thread is reading, waits
 * for it to publish what it read instead. Returns 0, or -ETIMEDOUT when
 * nothing happened in time, or the connection's error.
 */
int dlx__pump(dlx_client *c, int64_t timeout_ms)
{
        struct frame f;
        ssize_t n;
        int r;

        if (c->broken)
                return c->broken;
        if (c->closed)
                return -ECONNRESET;
        if (c->reading) {
                if (timeout_ms < 0) {
                        pthread_cond_wait(&c->cond, &c->lock);
                } else {
                        struct timespec ts;
                        clock_gettime(CLOCK_REALTIME, &ts);
                        ts.tv_sec += timeout_ms / 1000;
                        ts.tv_nsec += (timeout_ms % 1000) * 1000000;
                        if (ts.tv_nsec >= 1000000000) {
                                ts.tv_sec++;
                                ts.tv_nsec -= 1000000000;
                        }
                        if (pthread_cond_timedwait(&c->cond, &c->lock, &ts) == ETIMEDOUT)
                                return -ETIMEDOUT;
                }
                return 0;
        }

        c->reading = true;
        pthread_mutex_unlock(&c->lock);
        for (;;) {
                /*
                 * Waiting without a limit: one blocking recvmsg, no poll. The
                 * socket's SO_RCVTIMEO (the client's timeout) ends it when the
                 * daemon stays silent: dlx__wait_step() decides what that means.
                 */
                n = read_some(c, timeout_ms < 0);
                if (n == -EAGAIN && timeout_ms < 0) {
                        n = -ETIMEDOUT;
                        break;
                }
                if (n != -EAGAIN)
                        break;
                struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
                r = poll(&pfd, 1,
                         timeout_ms < 0 ? -1
                                        : (int)(timeout_ms > INT32_MAX ? INT32_MAX : timeout_ms));
                if (r == 0) {
                        n = -ETIMEDOUT;
                        break;
                }
                if (r < 0 && errno != EINTR) {
                        n = -errno;
                        break;
                }
        }
        pthread_mutex_lock(&c->lock);
        c->reading = false;
        if (n > 0)
                c->heard_ms = dlx__now_ms();
        if (n == 0 || (n < 0 && n != -ETIMEDOUT)) {
                if (!c->broken && n == -EMFILE)
                        snprintf(c->broken_why, sizeof(c->broken_why),
                                 "this process reached its descriptor limit (RLIMIT_NOFILE), so "
                                 "a descriptor the daemon sent was lost: the connection is closed");
                if (!c->broken)
                        c->broken = n == 0 || n == -ECONNRESET ? -ECONNRESET : (int)n;
        }
        while (!c->broken && (r = frame_reader_next(&c->reader, &f)) != 0) {
                if (r < 0) {
                        c->broken = -EPROTO;
                        break;
                }
                on_frame(c, &f);
        }
        if (c->broken)
                fail_pending(c);
        pthread_cond_broadcast(&c->cond);
        if (c->deleters) {
                pthread_mutex_unlock(&c->lock);
                dlx__run_deleters(c);
                pthread_mutex_lock(&c->lock);
        }
        return n == -ETIMEDOUT ? -ETIMEDOUT : c->broken;
}

void dlx__poll_notices(dlx_client *c)
{
        (void)dlx__pump(c, 0);
}

void dlx__run_deleters(dlx_client *c)
{
        struct held *h;

        pthread_mutex_lock(&c->lock);
        h = c->deleters;
        c->deleters = NULL;
        pthread_mutex_unlock(&c->lock);
        while (h) {
                struct held *next = h->next_deleter;
                if (h->tensor->deleter)
                        h->tensor->deleter(h->tensor);
                free(h);
                h = next;
        }
}

/*
 * Lock held. Waits once for the daemon, until deadline (monotonic ms; < 0:
 * none), and keeps it honest meanwhile: a daemon silent for the client's
 * timeout since it was last asked something or last heard from, while a
 * caller waits, gets a ping, and one that leaves the ping unanswered as long
 * again breaks the connection with -ETIMEDOUT. A blocked acquire keeps its
 * connection (the daemon answers the pings), and so does a wait for events
 * however long (a ping each timeout). Returns 0, -ETIMEDOUT (the deadline or
 * a silence passed) or the connection's error.
 */
int dlx__wait_step(dlx_client *c, int64_t deadline)
{
        int64_t now = dlx__now_ms(), wake = deadline;

        if (c->timeout_ms > 0 && !c->broken && !c->closed) {
                int64_t heard = c->heard_ms > c->asked_ms ? c->heard_ms : c->asked_ms;
                bool pinged = c->ping_ms > heard;

                if (pinged && now - c->ping_ms >= c->timeout_ms) {
                        break_connection(c, -ETIMEDOUT,
                                         "the daemon has not answered for %lld ms (nor a ping)",
                                         (long long)(now - heard));
                        return c->broken;
                }
                if (!pinged && now - heard >= c->timeout_ms) {
                        struct wire_request ping = {.type = WIRE_REQ_PING};
                        c->ping_ms = now;
                        pinged = true;
                        if (send_locked(c, &ping, -1) < 0)
                                return c->broken ? c->broken : -ECONNRESET;
                }
                int64_t check = (pinged ? c->ping_ms : heard) + c->timeout_ms;
                if (deadline >= 0 && deadline < check)
                        check = deadline;
                wake = check;
                /* no deadline of the caller's: the socket's SO_RCVTIMEO is this one */
                if (deadline < 0)
                        return dlx__pump(c, -1);
        }
        if (wake < 0)
                return dlx__pump(c, -1);
        return dlx__pump(c, wake > now ? wake - now : 0);
}

static int call(dlx_client *c, struct wire_request *req, int fd, struct pending *p)
{
        int err;

        memset(p, 0, sizeof(*p));
        p->fd = p->table_fd = -1;
        pthread_mutex_lock(&c->lock);
        err = send_locked(c, req, fd);
        if (err == -ECONNRESET && !c->reading && !c->closed && !c->broken_why[0]) {
                /* the daemon may have said why it hung up (a client limit, say) */
                c->broken = 0;
                dlx__pump(c, 0);
                if (!c->broken)
                        c->broken = err;
                err = c->broken;
        }
        if (err < 0) {
                pthread_mutex_unlock(&c->lock);
                if (c->broken_why[0])
                        return dlx__fail(err, "%s", c->broken_why);
                return dlx__fail(err, "cannot send %s: %s", wire_request_name(req->type),
                                 dlx_strerror(err));
        }
        p->id = req->id;
        p->type = req->type;
        p->next = c->pending;
        c->pending = p;
        while (!p->done) {
                err = dlx__wait_step(c, -1);
                if (err < 0 && err != -ETIMEDOUT && !p->done) {
                        pending_find(c, p->id, true);
                        p->done = true;
                        p->err = err;
                }
        }
        pthread_mutex_unlock(&c->lock);
        if (p->err < 0 && p->why[0])
                return dlx__fail(p->err, "%s: %s", wire_request_name(req->type), p->why);
        if (p->err < 0 && c->broken_why[0])
                return dlx__fail(p->err, "%s", c->broken_why);
        if (p->err < 0)
                return dlx__fail(p->err, "%s: %s", wire_request_name(req->type),
                                 p->err == -ECONNRESET ? "the connection to the daemon was lost"
                                                       : dlx_strerror(p->err));
        if (p->rep.status != WIRE_OK)
                return dlx__fail(-wire_status_errno(p->rep.status), "%s", p->rep.error);
        return 0;
}

int dlx__call(dlx_client *c, struct wire_request *req, int fd, struct pending *p)
{
        int err;

        memset(p, 0, sizeof(*p));
        p->fd = p->table_fd = -1;
        err = dlx__usable(c);
        if (err < 0)
                return err;

        /* a dlx_close() racing this call must not free the client under it */
        dlx__client_ref(c);
        err = call(c, req, fd, p);
        dlx__client_unref(c);
        return err;
}

void dlx__pending_done(dlx_client *c, struct pending *p)
{
        if (p->map || p->table_map) {
                pthread_mutex_lock(&c->lock);
                if (p->map)
                        dlx__map_unref(c, p->map);
                if (p->table_map)
                        dlx__map_unref(c, p->table_map);
                pthread_mutex_unlock(&c->lock);
                p->map = p->table_map = NULL;
        }
        fd_drop(&p->fd);
        fd_drop(&p->table_fd);
        wire_reply_done(&p->rep);
}

/* ---- connect / close ------------------------------------------------------------------- */

static int hello(dlx_client *c, const char *name)
{
        struct wire_request req = {.type = WIRE_REQ_HELLO};
        struct pending p;
        int err;

        req.hello.major = DLX_PROTO_MAJOR;
        req.hello.minor = DLX_PROTO_MINOR;
        req.hello.pid = (int32_t)getpid();
        snprintf(req.hello.client_name, sizeof(req.hello.client_name), "%s", name);
        err = dlx__call(c, &req, -1, &p);
        if (err == 0 && p.rep.type != WIRE_REP_HELLO)
                err = dlx__fail(-EPROTO, "the daemon answered hello with something else");
        if (err == 0) {
                c->session = p.rep.hello.session;
                c->uid = p.rep.hello.uid;
                c->server_minor = p.rep.hello.minor;
                c->limits = p.rep.hello.limits;
                snprintf(c->server, sizeof(c->server), "%s", p.rep.hello.server);
        }
        if (err == 0 && p.rep.hello.release_ring && p.fd >= 0) {
                void *r = mmap(NULL, sizeof(struct release_ring), PROT_READ | PROT_WRITE,
                               MAP_SHARED, p.fd, 0);
                /* without a usable ring, releases travel as frames: slower, never wrong */
                if (r != MAP_FAILED && ((struct release_ring *)r)->magic == RING_MAGIC &&
                    ((struct release_ring *)r)->slots == RING_SLOTS)
                        c->ring = r;
                else if (r != MAP_FAILED)
                        munmap(r, sizeof(struct release_ring));
        }
        dlx__pending_done(c, &p);
        return err;
}

/* What connect()'s commonest failures mean for dlx, after the system's words. */
static const char *connect_hint(int err)
{
        switch (err) {
        case -ENOENT:
                return " (no socket there: is dlxd running, and on this path?)";
        case -ECONNREFUSED:
                return " (a socket file no daemon listens on: dlxd stopped or died)";
        default:
                return "";
        }
}

int dlx_connect(const struct dlx_connect_options *opts, dlx_client **ret_client)
{
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        char name[DLX_CLIENT_NAME_MAX + 1];
        const char *dbg;
        dlx_client *c;
        int err;

        if (!ret_client)
                return dlx__fail(-EINVAL, "ret_client is NULL");
        err = sockpath_resolve(opts ? opts->socket_path : NULL, addr.sun_path,
                               sizeof(addr.sun_path));
        if (err < 0)
                return dlx__fail(err,
                                 "socket path '%.40s...' is too long: a Unix socket path holds "
                                 "at most %zu bytes",
                                 addr.sun_path, sizeof(addr.sun_path) - 1);

        if (opts && opts->timeout_ms > INT32_MAX)
                return dlx__fail(-EINVAL, "timeout_ms %lld is over %d", (long long)opts->timeout_ms,
                                 INT32_MAX);
        pthread_once(&fork_once, watch_forks);
        c = calloc(1, sizeof(*c));
        if (!c)
                return dlx__fail(-ENOMEM, "out of memory");
        c->generation = __atomic_load_n(&fork_generation, __ATOMIC_RELAXED);
        c->timeout_ms = !opts || opts->timeout_ms == 0 ? DLX_DEFAULT_TIMEOUT_MS : opts->timeout_ms;
        c->refs = 1;
        c->next_id = 1;
        c->next_token = 1;
        c->fd = -1;
        c->efd = -1;
        c->pfd = -1;
        avl_init(&c->held);
        avl_init(&c->maps);
        pthread_mutex_init(&c->lock, NULL);
        pthread_mutex_init(&c->send_lock, NULL);
        pthread_mutex_init(&c->track_lock, NULL);
        pthread_mutex_init(&c->scratch_lock, NULL);
        pthread_cond_init(&c->cond, NULL);
        if (opts) {
                c->log = opts->log;
                c->log_ctx = opts->log_ctx;
        }
        dbg = getenv("DLX_DEBUG");
        c->log_stderr = dbg && *dbg && strcmp(dbg, "0") != 0;
        if (frame_reader_init(&c->reader) < 0) {
                dlx__client_unref(c);
                return dlx__fail(-ENOMEM, "out of memory");
        }

        c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c->fd < 0) {
                err = -errno;
                dlx__client_unref(c);
                return dlx__fail(err, "socket: %s", strerror(-err));
        }
        /* dlx_fd(): one descriptor readable when the socket is, or events wait in the queue */
        c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        c->pfd = epoll_create1(EPOLL_CLOEXEC);
        if (c->efd < 0 || c->pfd < 0 ||
            epoll_ctl(c->pfd, EPOLL_CTL_ADD, c->fd,
                      &(struct epoll_event){.events = EPOLLIN, .data.fd = c->fd}) < 0 ||
            epoll_ctl(c->pfd, EPOLL_CTL_ADD, c->efd,
                      &(struct epoll_event){.events = EPOLLIN, .data.fd = c->efd}) < 0) {
                err = -errno;
                close(c->fd);
                dlx__client_unref(c);
                return dlx__fail(err, "epoll/eventfd: %s", strerror(-err));
        }
        /*
         * The timeout bounds connect() (a daemon whose backlog is full), every
         * blocking send (a daemon that reads nothing) and every blocking
         * receive (dlx__wait_step() then pings it before giving up).
         */
        if (c->timeout_ms > 0) {
                struct timeval tv = {.tv_sec = c->timeout_ms / 1000,
                                     .tv_usec = (c->timeout_ms % 1000) * 1000};
                if (setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
                    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0) {
                        err = -errno;
                        close(c->fd);
                        dlx__client_unref(c);
                        return dlx__fail(err, "socket timeouts: %s", strerror(-err));
                }
        }
        if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
                int64_t waited = c->timeout_ms;

                err = -errno;
                close(c->fd);
                dlx__client_unref(c);
                if (err == -EAGAIN || err == -EINPROGRESS)
                        return dlx__fail(-ETIMEDOUT,
                                         "cannot connect to dlxd at %s: it accepted no connection "
                                         "within %lld ms",
                                         addr.sun_path, (long long)waited);
                return dlx__fail(err, "cannot connect to dlxd at %s: %s%s", addr.sun_path,
                                 strerror(-err), connect_hint(err));
        }
        c->heard_ms = dlx__now_ms();
        /*
         * The default path means the user's own daemon: one of another uid
         * (a squatter of /tmp/dlx-$UID, say) must not get our tensors. A path
         * given explicitly is the caller's to trust.
         */
        if (sockpath_is_default(opts ? opts->socket_path : NULL)) {
                struct ucred cred;
                socklen_t len = sizeof(cred);
                if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 ||
                    (cred.uid != getuid() && cred.uid != 0)) {
                        unsigned peer = len == sizeof(cred) ? (unsigned)cred.uid : 0;
                        close(c->fd);
                        dlx__client_unref(c);
                        return dlx__fail(-EACCES,
                                         "the daemon at %s runs as uid %u, neither yours (%u) "
                                         "nor root: not your dlxd (set DLX_SOCKET to use "
                                         "another's on purpose)",
                                         addr.sun_path, peer, (unsigned)getuid());
                }
        }
        if (opts && opts->client_name)
                snprintf(name, sizeof(name), "%s", opts->client_name);
        else
                snprintf(name, sizeof(name), "%s", program_invocation_short_name);
        /* the daemon accepts printable names only: replace anything else */
        for (char *p = name; *p; p++)
                if ((unsigned char)*p < 0x20 || *p == 0x7f)
                        *p = '?';
        err = hello(c, name);
        if (err < 0) {
                close(c->fd);
                dlx__client_unref(c);
                return err;
        }
        dlx__log(c, DLX_LOG_DEBUG, "connected to %s at %s as session %llu", c->server,
                 addr.sun_path, (unsigned long long)c->session);
        conn_register(c);
        *ret_client = c;
        return 0;
}

/*
 * A client closed by a process it was not connected in: that process's
 * copies of its descriptors go, nothing else. The connection, its leases and
 * its locks (which another thread may have held at the fork) are the
 * parent's.
 */
static void close_inherited(dlx_client *c)
{
        /* the fork closed them already (on_fork_child); nothing else is this process's */
        (void)c;
}

/*
 * A bye on a connection given up for a silent daemon, if the socket has room
 * for it now and no frame went out in part. Lock held.
 */
static void bye_late(dlx_client *c)
{
        struct wire_request bye = {.type = WIRE_REQ_BYE};
        struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};

        if (c->bye_sent || c->torn || c->server_minor < 1 || poll(&pfd, 1, 0) != 1 ||
            !(pfd.revents & POLLOUT))
                return;
        if (encode_send(c, &bye, -1) == 0) {
                c->bye_sent = true;
                dlx__log(c, DLX_LOG_DEBUG, "a bye left for the daemon to read when it can");
        }
}

void dlx_close(dlx_client *c)
{
        struct wire_request bye = {.type = WIRE_REQ_BYE};
        struct event_node *ev;
        struct avl_node *n, *next;
        struct pending p;
        bool said_bye = false;

        if (!c)
                return;
        if (dlx__forked(c)) {
                close_inherited(c);
                return;
        }
        pthread_mutex_lock(&c->lock);
        dlx__gpu_close(c);
        pthread_mutex_unlock(&c->lock);
        conn_closing(c);
        /*
         * The daemon lets go of everything the session holds but its leases,
         * and answers: when dlx_close() returns, its names, watches, waits and
         * allocations are gone. Tensors acquired through it and still alive
         * then keep the connection, for their leases alone, until the last
         * one's deleter ends it (dlx__acquired_gone).
         */
        if (c->server_minor >= 1) {
                said_bye = dlx__call(c, &bye, -1, &p) == 0;
                dlx__pending_done(c, &p);
        }
        pthread_mutex_lock(&c->lock);
        c->closed = true;
        /*
         * Tensors alive keep the connection whatever happened to it: their
         * leases end with the session. A daemon that did not answer the bye
         * in time (stopped, say) gets one anyway if the socket takes it, to
         * let go of the rest when it comes back; the leases then go all at
         * once, with the last tensor.
         */
        c->retired = c->nacquired > 0;
        if (c->retired && !said_bye && c->broken == -ETIMEDOUT)
                bye_late(c);
        /* the daemon sees EOF and releases everything this session held */
        if (!c->retired) {
                shutdown(c->fd, SHUT_RDWR);
        } else if (c->reading) {
                /* a thread blocked on the socket wakes with the answer */
                struct wire_request ping = {.type = WIRE_REQ_PING};
                send_locked(c, &ping, -1);
        }
        /* calls still waiting fail */
        fail_pending(c);
        for (n = avl_first(&c->held); n; n = next) {
                struct held *h = avl_entry(n, struct held, node);
                next = avl_next(n);
                avl_remove(&c->held, n);
                if (h->has_gpu)
                        dlx__gpu_publish_undo(c, &h->gpu);
                h->next_deleter = c->deleters;
                c->deleters = h;
        }
        while ((ev = c->ev_head)) {
                c->ev_head = ev->next;
                free(ev);
        }
        c->ev_tail = NULL;
        pthread_cond_broadcast(&c->cond);
        while (c->reading)
                pthread_cond_wait(&c->cond, &c->lock);
        pthread_mutex_unlock(&c->lock);
        dlx__run_deleters(c);
        pthread_mutex_lock(&c->lock);
        dlx__maps_close(c);
        /* a retired connection ends with the last tensor (dlx__acquired_gone) */
        if (!c->retired)
                conn_closed(c);
        pthread_mutex_unlock(&c->lock);
        dlx__client_unref(c);
}

void dlx__acquired_gone(dlx_client *c)
{
        /* lock held by the caller (the tensor's deleter) */
        if (--c->nacquired == 0 && c->retired) {
                c->retired = false;
                /* EOF: the daemon ends the session, the last leases with it */
                shutdown(c->fd, SHUT_RDWR);
                conn_closed(c);
        }
}

const char *dlx_server_version(const dlx_client *c)
{
        return c ? c->server : "";
}

/* ---- events ------------------------------------------------------------------------------- */

int dlx_fd(const dlx_client *c)
{
        return c ? c->pfd : dlx__fail(-EINVAL, "NULL client");
}

/* Unlocks c and fails with err, and the daemon's words or the reason it was given up. */
int dlx__fail_unlock(dlx_client *c, int err)
{
        char why[sizeof(c->broken_why)];

        wire_strcpy(why, sizeof(why), c->broken_why);
        pthread_mutex_unlock(&c->lock);
        return dlx__fail(err, "%s", why[0] ? why : dlx_strerror(err));
}

static int held_process_events(dlx_client *c)
{
        int err, count;

        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        if ((err = dlx__usable(c)) < 0)
                return err;
        pthread_mutex_lock(&c->lock);
        if (c->reading) {
                /* another thread is reading right now and will dispatch what came */
                count = (int)c->nevents;
                pthread_mutex_unlock(&c->lock);
                return count;
        }
        err = dlx__pump(c, 0);
        count = (int)c->nevents;
        pthread_mutex_unlock(&c->lock);
        if (err < 0 && err != -ETIMEDOUT)
                return dlx__fail(err, "%s", dlx_strerror(err));
        return count;
}

int dlx_process_events(dlx_client *c)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_process_events(c));
}

static int held_next_event(dlx_client *c, struct dlx_event *ret_event, int64_t timeout_ms)
{
        int64_t deadline = timeout_ms > 0 ? dlx__deadline_ms(timeout_ms) : 0;
        int err = 0;

        if (!c || !ret_event)
                return dlx__fail(-EINVAL, "NULL argument");
        if ((err = dlx__usable(c)) < 0)
                return err;
        pthread_mutex_lock(&c->lock);
        while (!c->ev_head) {
                if (timeout_ms == 0) {
                        err = dlx__pump(c, 0);
                        if (!c->ev_head) {
                                pthread_mutex_unlock(&c->lock);
                                if (err < 0 && err != -ETIMEDOUT)
                                        return dlx__fail(err, "%s", dlx_strerror(err));
                                return dlx__fail(-EAGAIN, "no event pending");
                        }
                        break;
                }
                if (timeout_ms > 0 && dlx__now_ms() >= deadline) {
                        pthread_mutex_unlock(&c->lock);
                        return dlx__fail(-ETIMEDOUT, "no event within %lld ms",
                                         (long long)timeout_ms);
                }
                err = dlx__wait_step(c, timeout_ms > 0 ? deadline : -1);
                if (c->broken || (err < 0 && err != -ETIMEDOUT))
                        return dlx__fail_unlock(c, c->broken ? c->broken : err);
        }
        struct event_node *n = c->ev_head;
        c->ev_head = n->next;
        if (!c->ev_head)
                c->ev_tail = NULL;
        if (--c->nevents == 0) {
                uint64_t count;
                (void)!read(c->efd, &count, sizeof(count));
        }
        /* room again after dropping some: the caller learns it after what came before */
        if (c->events_dropped) {
                c->events_dropped = false;
                enqueue_event(c, DLX_EVENT_LOST, 0, 0, "");
        }
        pthread_mutex_unlock(&c->lock);
        *ret_event = n->ev;
        free(n);
        return 0;
}

int dlx_next_event(dlx_client *c, struct dlx_event *ret_event, int64_t timeout_ms)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL argument");
        return DLX_HOLDING(c, held_next_event(c, ret_event, timeout_ms));
}
