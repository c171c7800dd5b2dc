/* SPDX-License-Identifier: MIT */
/*
 * The namespace: names -> versions -> leases, plus watchers (watch.h) and
 * waiting acquires. Every operation takes the acting session; ownership,
 * limits and lifetimes are decided here. Replies and events leave through
 * session_send(); nothing here knows about sockets. This is the whole of
 * what the connection layer sees; namespace.h says which file does what.
 *
 * Lifetimes:
 *  - A version lives while it is its name's current version or any lease
 *    holds it. When it dies, its producer (if still connected) is sent
 *    RELEASED with the token it published under, so the producer can run the
 *    original tensor's deleter.
 *  - A non-persistent version is unpublished when its producer's session
 *    closes; a persistent one stays until replaced or unpublished.
 *  - A closing session releases every lease it holds at once.
 */
#ifndef DLX_DAEMON_REGISTRY_H
#define DLX_DAEMON_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "avl.h"
#include "list.h"
#include "metrics.h"
#include "session.h"
#include "store.h"
#include "watch.h"
#include "wire.h"

struct registry {
        uv_loop_t *loop;
        struct store *store;
        struct avl_tree names; /* struct entry, by name */
        struct list sessions;
        struct watch_index watches;
        struct avl_tree mounts; /* struct mount (mount.c), by prefix */
        bool federation;        /* --federation-uid was given: that uid may mount */
        uid_t federation_uid;
        uint64_t next_session;
        uint64_t next_lease;
        uint64_t started_ms;
        struct wire_limit_set lim; /* 0: none; max_bytes* are the store's */
        /* counters for stats; nnames counts names with a current version */
        uint64_t nnames, nversions, nleases, nsessions;
        uint64_t nlingering; /* dropped connections kept for descriptors their peers hold unread */
        uint64_t queued;     /* output bytes waiting for all clients to read (the connections') */
        uint64_t requests, publishes, acquires;
        struct metrics metrics;
        uint64_t started_unix; /* for dlx_start_time_seconds */
        /* descriptors in flight to all connections, and their budget (the server's; NULL: none) */
        const unsigned *fds_in_flight, *fds_in_flight_budget;
        /* brings fds_in_flight up to date with what peers have read (the server's; NULL: none) */
        void (*refresh_in_flight)(void *ctx);
        void *refresh_ctx;
};

/* The defaults of dlxd's limits (what dlxd --help shows). */
void registry_default_limits(struct wire_limit_set *lim);

/* lim: the limits (copied; NULL: the defaults); its byte limits go to the store. */
void registry_init(struct registry *reg, uv_loop_t *loop, struct store *st,
                   const struct wire_limit_set *lim);
/* Closes every session still open (they must have no connection left) and frees all. */
void registry_done(struct registry *reg);

/*
 * The limits as they stand for s's uid: a fair per-uid limit as the cap it
 * works out to now (0 where nothing bounds it).
 */
void registry_limits_for(const struct session *s, struct wire_limit_set *ret);

/*
 * Whether one more client of uid may connect: 0, or -EAGAIN with the limit
 * it would pass written to why.
 */
int registry_admit(struct registry *reg, uid_t uid, char *why, size_t whysz);
/* A new session for a connected peer; NULL on allocation failure. */
struct session *registry_session_new(struct registry *reg, uid_t uid, gid_t gid, pid_t pid);
/* Releases everything the session holds and frees it. NULL-safe. */
void registry_session_free(struct session *s);

/*
 * Each request handler below replies itself (success or failure) through the
 * session, addressing the reply to req->id. fd is the one descriptor attached
 * to the request frame, or -1; it is consumed on every path.
 */
void registry_publish(struct session *s, const struct wire_request *req, int fd);
/* s ends: a group publish of its being checked off the loop is dropped when the check is done. */
void registry_group_job_orphan(struct session *s);
void registry_acquire(struct session *s, const struct wire_request *req);
void registry_release(struct session *s, const struct wire_request *req);
void registry_unpublish(struct session *s, const struct wire_request *req);
void registry_list(struct session *s, const struct wire_request *req);
void registry_stat(struct session *s, const struct wire_request *req);
void registry_watch(struct session *s, const struct wire_request *req);
void registry_unwatch(struct session *s, const struct wire_request *req);
void registry_track(struct session *s, const struct wire_request *req);
/*
 * The daemon stops: every version page stays as it is now, closed, so that no
 * tracker sees the names of sessions closed before its own as unpublished.
 */
void registry_pages_close(struct registry *reg);
void registry_untrack(struct session *s, const struct wire_request *req);
void registry_alloc(struct session *s, const struct wire_request *req, int fd);
void registry_free(struct session *s, const struct wire_request *req);
void registry_forget(struct session *s, const struct wire_request *req);
void registry_stats(struct session *s, const struct wire_request *req);
/* The metrics text: every uid's series for dlxd's own uid and root, else the asker's uid's. */
void registry_metrics(struct session *s, const struct wire_request *req);
/* Federation (mount.c, 1.5): a mount of "@<alias>/", and a fetch the bridge could not do. */
void registry_mount(struct session *s, const struct wire_request *req);
void registry_fetch_failed(struct session *s, const struct wire_request *req);
/*
 * The client is closing with tensors it acquired still in use: everything
 * the session holds goes as if it had disconnected, but its leases, which
 * stay until released or until the connection ends.
 */
void registry_bye(struct session *s, const struct wire_request *req);

/*
 * The session's release ring (proto/ring.h). create makes it and returns its
 * fd for the hello reply (the caller closes it once sent); wake drains it and
 * marks the daemon awake (a batch of the client's frames is coming); sleep
 * drains it, marks the daemon asleep, and drains once more for anything
 * posted meanwhile. Both return -EPROTO for a ring the client corrupted.
 */
int registry_ring_create(struct session *s);
/* Whether one more descriptor can be had for sending fd (0) or not (-errno). */
int registry_ring_spare_fd(int fd);
void registry_ring_destroy(struct session *s);
int registry_ring_wake(struct session *s);
int registry_ring_sleep(struct session *s);

#endif /* DLX_DAEMON_REGISTRY_H */
