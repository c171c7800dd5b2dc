/* SPDX-License-Identifier: MIT */
/*
 * The registry's own view of its data, shared by the files that make it up
 * and by nothing else (the connection layer sees registry.h alone):
 *
 *   registry.c  names and their versions: publish, unpublish, stat, list, stats
 *   lease.c     leases: acquire (at once, or waiting for a version), release
 *   held.c      segments a session holds: its allocations, and the fds its peer has
 *   session.c   a session's life: new, bye, free, and what it lets go of
 *   quota.c     per-uid limits: clients, names, descriptors (fair shares)
 *   watch.c     watches: the prefix index, and the watch requests
 *   ring.c      the daemon's half of the release ring
 *   track.c     tracks: the version page of a session, one slot per name it follows
 *   mount.c     mounts (1.5): the federation bridge's '@' prefixes, WANTED, fetch failures
 *
 * An entry is a name; its versions are what was published under it, oldest
 * first, the current one last (or none: unpublished, kept for old versions'
 * leases or for acquires waiting for the name). A version lives while it is
 * current or leased.
 */
#ifndef DLX_DAEMON_NAMESPACE_H
#define DLX_DAEMON_NAMESPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "registry.h"

struct entry {
        struct avl_node node; /* in registry.names */
        uid_t owner;
        uint64_t last_version;
        struct version *current; /* NULL: unpublished, kept for old versions or waiters */
        struct list versions;    /* struct version, oldest first */
        struct list waiters;     /* struct waiter */
        struct list tracks;      /* struct track (track.c): sessions that follow its version */
        /*
         * Under a mount: the min_versions its WANTED events asked for, each
         * with the count of waiters it stands for (mount.c), by version.
         */
        struct mount_want *wanted;
        unsigned nwanted, wanted_cap;
        size_t len;
        char name[];
};

struct mount_want {
        uint64_t min_version;
        uint32_t waiters;
};

struct version {
        struct list link;  /* in entry.versions */
        struct list plink; /* in producer.published while the producer lives */
        struct entry *entry;
        struct session *producer; /* NULL once it has gone */
        struct segment *seg;      /* one reference */
        struct segment *table;    /* a device group's table (proto/group.h), one reference */
        uint64_t version;
        uint64_t token;
        uint64_t published_ns;
        uint64_t byte_offset, flags, offset, length;
        DLDataType dtype;
        int32_t ndim;
        int32_t device_type, device_id;
        uint32_t storage;
        uint32_t members; /* a group's (proto/group.h); 0: a tensor */
        uint32_t leases;
        pid_t producer_pid;
        bool persist;
        bool has_event;
        char producer_name[DLX_CLIENT_NAME_MAX + 1];
        uint8_t event[DLX_CUDA_HANDLE]; /* the producer's, recorded at publish */
        bool has_device_uuid;
        uint8_t device_uuid[DLX_CUDA_UUID]; /* kDLCUDA: the device, whatever its ordinals */
        uint64_t pid_namespace;             /* cuda-ipc: the producer's */
        char *origin;                       /* a mirror's (1.5), NULL: none */
        /* consumers' release events, distinct, for the producer to wait on */
        uint8_t (*rel_events)[DLX_CUDA_HANDLE];
        uint64_t *rel_owners; /* the session each came from */
        uint32_t nrel_events;
        bool rel_overflow_logged;
        int64_t dims[]; /* shape[ndim], then strides[ndim] */
};

struct lease {
        struct avl_node node; /* in session.leases */
        uint64_t id;
        struct version *v;
};

struct hold {
        struct avl_node node; /* in session.held, by segment id */
        struct segment *seg;
};

struct waiter {
        struct list elink; /* in entry.waiters */
        struct list slink; /* in session.waiters */
        struct session *s;
        struct entry *e;
        uint64_t req_id;
        uint64_t t0_ns; /* when the acquire arrived (metrics) */
        uint64_t min_version;
        bool group;     /* a group is wanted (1.3) */
        bool announced; /* its mount's bridge was told (WANTED): counted in e->wanted */
        bool timed;
        uv_timer_t timer;
};

static inline void reply_init(struct wire_reply *rep, uint64_t id, enum wire_reply_type type)
{
        rep->id = id;
        rep->status = WIRE_OK;
        rep->error[0] = '\0';
        rep->type = type;
}

/* ---- registry.c: names and versions ---- */

struct entry *entry_find(struct registry *reg, const char *name);
/* The names tree's order (an entry's name against a key string). */
int entry_cmp_name(const void *key, const struct avl_node *n);
/* The entry of name, made (owned by owner) if there is none; NULL when out of memory. */
struct entry *entry_get(struct registry *reg, const char *name, uid_t owner);
/* Frees e once nothing refers to it: no current version, no old ones, no waiters, no tracks. */
void entry_maybe_free(struct registry *reg, struct entry *e);
/* The current version stops being current; it dies now if nobody leases it. */
void entry_retire_current(struct registry *reg, struct entry *e);
/*
 * Frees a version no longer current nor leased; a producer still connected
 * that published it with a token is told (RELEASED).
 */
void version_destroy(struct registry *reg, struct version *v);
void version_describe(const struct version *v, struct wire_tensor *t);
void notify_watchers(struct registry *reg, enum wire_event_kind kind, struct entry *e,
                     uint64_t version);

/* ---- lease.c: leases and waiting acquires ---- */

/*
 * Creates a lease on v for s and sends the acquire reply, attaching the
 * segment's fd unless the peer already holds a suitable one. group: what the
 * acquire asked for; a version of the other kind is refused (EISDIR, ENOTDIR).
 */
void grant(struct session *s, uint64_t req_id, struct version *v, bool group);
void lease_drop(struct session *s, struct lease *l);
/* Drops s's lease id if it holds one; returns whether it did. */
bool lease_drop_id(struct session *s, uint64_t id);
/* Unlinks a waiter and frees it (after its timer closes, if it has one). */
void waiter_end(struct waiter *w);
/* The same, leaving its entry for the caller to entry_maybe_free(). */
void waiter_detach(struct waiter *w);
/* A new version was published: grant it to every waiter it satisfies. */
void wake_waiters(struct entry *e);

/* ---- track.c: version pages ---- */

/* e's current version changed: every track of it sees the new one (0: none). */
void tracks_update(struct entry *e);
/*
 * Ends all of s's tracks and marks its page closed, waking its waiters; with
 * unmap, the page goes too (the session's end; bye keeps it for the client).
 */
void track_session_drop(struct session *s, bool unmap);

/* ---- held.c: segments a session holds ---- */

struct known *known_add(struct session *s, struct segment *seg);
/*
 * A record made for an fd that was then never sent: the peer does not hold the
 * segment, and must hear nothing of it (no SEGMENT_GONE). NULL-safe.
 */
void known_drop_unsent(struct session *s, struct known *k);
/* A segment whose fd this session holds is gone: forget it and tell the peer (store.on_gone). */
void on_segment_gone(struct session *s, uint64_t seg_id);
struct hold *hold_find(struct session *s, uint64_t seg_id);
/* Keeps an adopted segment for this session's later publishes (after every check passed). */
int hold_segment(struct session *s, struct segment *seg);
/* Forgets every fd the peer holds and lets go of every allocation (no events). */
void held_drop_all(struct session *s);

/* ---- quota.c: per-uid limits ---- */

/* Whether a new name would pass the limit on names, in all or of the session's uid. */
bool names_full(struct session *s, char *why, size_t whysz);

/* ---- mount.c: federation mounts (1.5) ---- */

/*
 * Whether s may publish req, whose name's entry is e (NULL: none yet): a
 * name under '@' only from the session that mounted its prefix, origin
 * fields only there, an origin version only above the name's last. 0, or -EACCES/-EINVAL/-EEXIST
 * with why.
 */
int mount_check_publish(struct session *s, const struct wire_request *req, const struct entry *e,
                        char *why, size_t whysz);
/* s may unpublish name: not under another session's mount. */
bool mount_may_unpublish(struct session *s, const char *name);
/*
 * An origin version above the last version of entry e (NULL: none yet; -EEXIST),
 * or none (0) and a next one to be had (-EOVERFLOW after UINT64_MAX): 0, or
 * -errno with why.
 */
int mount_check_version(const struct entry *e, uint64_t origin_version, char *why, size_t whysz);
/* An acquire waits on e for min_version: its mount session is told (WANTED), once. */
void mount_wanted(struct registry *reg, struct waiter *w);
void mount_waiter_gone(struct waiter *w);
/* e got version: what was wanted up to it is no longer outstanding. */
void mount_entry_free(struct entry *e);
/* s lets go of its mounts (closing, or bye). */
void mount_session_end(struct session *s);

#endif /* DLX_DAEMON_NAMESPACE_H */
