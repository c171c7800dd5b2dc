/* SPDX-License-Identifier: MIT */
/*
 * One accepted connection: the only place the daemon calls recvmsg/sendmsg.
 * A raw non-blocking socket watched by a uv_poll_t, since libuv's pipes
 * cannot receive arbitrary descriptors. Bytes and fds go into a frame
 * reader; replies wait in an output queue that is flushed once per batch.
 */
#ifndef DLX_DAEMON_CONN_H
#define DLX_DAEMON_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "frame.h"
#include "list.h"

struct server;
struct session;

/*
 * How long a client may stay quiet before its release ring is drained and put to
 * sleep (posts after that wake the daemon with a frame): one to two sweeps.
 * Short periods cost the hot path: a timer firing every millisecond made each
 * round trip slower by half.
 */
#define CONN_QUIET_MS 10
/* How often a connection whose next fd waits looks again whether its peer has read. */
#define CONN_FD_WAIT_MS 10
/* Descriptors one connection may have sent and its peer not yet read. */
#define CONN_MAX_FDS_UNREAD 32

/*
 * Flow control. Replies are queued while a batch of requests is dispatched
 * and sent when it ends (or once a batch has queued CONN_BATCH_*). What the
 * peer does not read yet stays queued; past --max-queued bytes or
 * CONN_MAX_QUEUED_FDS descriptors the connection reads no more requests
 * until the queue shrinks: a peer that pipelines is slowed down, never
 * dropped. Only a peer that reads nothing for the timeout (--timeout-ms)
 * while an answer it asked for waits is dropped; notifications it did not
 * ask for may wait for an idle peer as long as it likes.
 */
#define CONN_BATCH_BYTES (256u << 10)
#define CONN_BATCH_FDS 8
#define CONN_MAX_QUEUED_FDS 64

struct conn {
        uv_poll_t poll;
        int fd;
        int events; /* what poll is started with */
        struct server *srv;
        struct session *session;
        struct frame_reader reader;
        struct list outq; /* struct outbuf */
        size_t outq_bytes;
        unsigned queued_fds;      /* descriptors waiting in outq */
        unsigned queued_replies;  /* answers to requests waiting in outq (the rest: events) */
        unsigned fds_unread;      /* sent since the peer was last seen to have read everything */
        struct list fd_wait_link; /* in server.fd_wait while an fd must wait for reading */
        bool dispatching;         /* replies are coalesced until the batch ends */
        bool blocked;             /* too much output waits: no request is read meanwhile */
        bool full;                /* the socket took not all we had to send */
        bool eof;                 /* the peer sends no more: answer what came, then close */
        bool close_pending;       /* being dropped: send what goes without waiting, then close */
        bool closing;
        bool events_lost;        /* watch events were dropped for want of room: say so */
        bool active;             /* frames came since the last sweep of the rings */
        struct list link;        /* in server.conns */
        struct list awake_link;  /* in server.awake while the release ring is awake */
        struct list stall_link;  /* in server.stalled while on the clock (watch_stall) */
        uint64_t stalled_since;  /* loop time it went on the clock */
        struct list unread_link; /* in server.unread while the peer owes us a read */
        uint64_t unread_since;   /* loop time its reading last made progress */
        int unread_seen;         /* bytes it had not read at the last look */
        struct list doom_link;   /* in server.doomed while a close is scheduled */
        struct list dirty_link;  /* in server.dirty while replies wait for the flush */
};

/* Takes ownership of fd (a connected, non-blocking socket). Returns 0 or -errno. */
int conn_start(struct server *srv, int fd, struct session *session);

/* Closes now: queued output is dropped, the session and its holdings released. */
void conn_close(struct conn *c);

/*
 * Closes now, after telling the peer why (a failure addressed to nobody) and
 * sending what queued output the socket takes without waiting.
 */
void conn_goodbye(struct conn *c, int err, const char *why);

/*
 * Closes soon, from the loop: for code that may be walking registry lists
 * (sending a reply) and must not have a session freed under it.
 */
void conn_doom(struct conn *c);

/* Closes every doomed connection (the server's idle callback). */
void conn_reap(struct server *srv);

/* Sends what other code queued on connections outside their own batch (check callback). */
void conn_flush_dirty(struct server *srv);

/*
 * One sweep of the awake release rings: a ring whose client sent nothing since
 * the last sweep is drained and put to sleep, and leaves srv->awake.
 */
void conn_sweep_rings(struct server *srv);

/*
 * Drops connections on the clock past the timeout: no hello, inside a frame,
 * or not reading what waits for them.
 */
void conn_check_stalled(struct server *srv);

/* Whether one more descriptor may be sent to this session's peer without waiting. */
bool conn_fd_room(void *ctx);
/* Whether the peer's uid has room for n more descriptors in flight (session_io.fd_share). */
bool conn_fd_share(void *ctx, unsigned n);

/* Ends lingering sockets (linger()) whose peers have read or closed; all when all is set. */
void conn_check_lingering(struct server *srv, bool all);

/* Sends again to connections whose next fd waited for their peer to read (a tick). */
void conn_check_fd_wait(struct server *srv);
/* Every connection's (and lingering socket's) descriptors in flight, as its peer has read them. */
void conn_refresh_fds(void *srv);

#endif /* DLX_DAEMON_CONN_H */
