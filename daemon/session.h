/* SPDX-License-Identifier: MIT */
/*
 * One session per connection: who the peer is (from SO_PEERCRED), and what it
 * holds in the registry: leases, published versions, segment fds, watches,
 * waiting acquires. Closing a session releases all of it at once.
 */
#ifndef DLX_DAEMON_SESSION_H
#define DLX_DAEMON_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "avl.h"
#include "wire_limits.h"
#include "list.h"
#include "metrics.h"
#include "wire.h"

struct registry;
struct segment;
struct track;
struct version_page;
struct uid_use;

/* How a session's replies leave: set by the connection that owns it. */
struct session_io {
        /*
         * Queues a reply, with one fd: fd (borrowed; -1 for none), or the fd
         * of seg (NULL for none), attached when the reply leaves and held by
         * a reference until then. Returns 0 or -errno.
         */
        int (*send)(void *ctx, const struct wire_reply *rep, int fd, struct segment *seg);
        /* Whether an fd sent now would go without waiting for the peer to read (NULL: yes). */
        bool (*fd_room)(void *ctx);
        /*
         * Whether the peer's uid has room for n more descriptors in flight,
         * whatever this peer itself has unread (NULL: yes). A reply with an fd
         * past it is refused (-EAGAIN), not kept waiting: what the uid's peers
         * hold unread may stay so for ever.
         */
        bool (*fd_share)(void *ctx, unsigned n);
        /* Ends the connection soon, from the loop, not within this call (NULL: nothing). */
        void (*end)(void *ctx);
        /*
         * Goes on reading and answering requests once group_job is done
         * (NULL: no group is checked off the loop for this session).
         */
        void (*resume)(void *ctx);
        void *ctx;
};

struct session {
        uint64_t id;
        uid_t uid;
        gid_t gid;
        pid_t pid;
        char name[DLX_CLIENT_NAME_MAX + 1];
        bool greeted;   /* hello done: other requests are allowed */
        uint32_t minor; /* the protocol minor its hello gave */
        bool retired;   /* bye done: only its leases are left; it may release them and ping */
        bool broken;    /* its state broke an invariant: its connection is ending */
        struct registry *reg;
        struct session_io io;

        struct avl_tree leases; /* struct lease, by id */
        struct list published;  /* struct version this session produced */
        struct avl_tree known;  /* struct known, by segment id: fds this peer holds */
        struct avl_tree held;   /* struct hold, by segment id: its allocations */
        unsigned nheld;
        unsigned nwatches;
        struct uid_use *use; /* its uid's counts, in the store */
        struct list watches; /* struct watch */
        struct list waiters; /* struct waiter: acquires waiting for a version */
        struct list mounts;  /* struct mount (mount.c): prefixes it serves */
        unsigned nmounts;
        struct release_ring *ring;  /* posted releases, NULL until hello */
        struct version_page *vpage; /* tracked versions (track.c), NULL until the first track */
        size_t vpage_size;
        struct track **tracks; /* by slot, vpage->slots of them */
        uint32_t ntracks, track_hint;
        unsigned nwaiters;
        struct list link; /* in registry.sessions */
        /* a group publish being checked off the loop (registry.c): no request is read meanwhile */
        struct group_job *group_job;
        /*
         * The request being answered (dispatch sets it) and a request answered
         * later (a wait's grant, a group's check: they set it before answering),
         * for the metrics (metrics_answered()).
         */
        struct req_ctx cur, late;
};

/* An answer to request id of type, which arrived at t0_ns, follows (see cur, late). */
static inline void session_answering(struct session *s, uint64_t id, enum wire_request_type type,
                                     uint64_t t0_ns)
{
        s->late = (struct req_ctx){.id = id, .t0_ns = t0_ns, .type = type};
}

/* Sends a reply or an event; a failure to queue is logged and ends nothing here. */
int session_send(struct session *s, const struct wire_reply *rep, int fd);
/* The same, with seg's fd attached (seg may be NULL: none). */
int session_send_segment(struct session *s, const struct wire_reply *rep, struct segment *seg);

/* Sends an event (reply id 0); events: the consumers' CUDA release events, for RELEASED. */
void session_event_with(struct session *s, enum wire_event_kind kind, uint64_t watch,
                        const char *name, uint64_t version, uint64_t token, uint64_t segment,
                        uint8_t (*events)[DLX_CUDA_HANDLE], uint32_t nevents);
void session_event(struct session *s, enum wire_event_kind kind, uint64_t watch, const char *name,
                   uint64_t version, uint64_t token, uint64_t segment);

/*
 * What s holds broke an internal invariant (invariant.h), described by what:
 * the peer is told, and its connection ends soon, as a peer's protocol error
 * would end it. dlxd goes on. Nothing is freed here: callers may be walking
 * the registry.
 */
void session_break(struct session *s, const char *what);

/* Sends a status-only reply with a formatted message. */
int session_fail(struct session *s, uint64_t id, int err, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

#endif /* DLX_DAEMON_SESSION_H */
