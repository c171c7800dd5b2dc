/* SPDX-License-Identifier: MIT */
/*
 * Per-uid accounting, in one place: what each uid uses (one record per uid,
 * kept in the store while anything is counted in it), the one function that
 * changes those counts (quota_count), and the fair-share arithmetic every
 * per-uid limit goes through. Who counts what: the store bytes and
 * descriptors, session.c clients, registry.c names, the connections what
 * they queue and leave unread; each checks against the caps worked out here.
 */
#ifndef DLX_DAEMON_QUOTA_H
#define DLX_DAEMON_QUOTA_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "avl.h"
#include "wire_limits.h"

struct store;

/*
 * Fair shares of what all uids draw on. A uid holding mine, of all held in
 * all, may hold a share of what the other uids leave of limit, and the rest
 * stays for uids still to come: however many uids fill it, the next one finds
 * room while anything is left. QUOTA_HALF (half, rounded down) for what is in
 * flight (output queued, descriptors unread) and descriptors held; QUOTA_MOST
 * (all but an eighth, rounded down) for clients and names, so that a uid
 * alone may use 7/8 of a limit, and all of one under 8.
 */
enum quota_share { QUOTA_HALF, QUOTA_MOST };

static inline uint64_t quota_fair_cap(uint64_t limit, uint64_t all, uint64_t mine,
                                      enum quota_share share)
{
        uint64_t others = all - mine, left = limit > others ? limit - others : 0;

        return share == QUOTA_HALF ? left / 2 : left - left / 8;
}

/* Whether a uid holding mine may take n more, under its fair share. */
static inline bool quota_fair_share(uint64_t limit, uint64_t all, uint64_t mine, uint64_t n,
                                    enum quota_share share)
{
        return mine + n <= quota_fair_cap(limit, all, mine, share);
}

/*
 * The most one uid may hold of something limited in all to limit (0: none)
 * and per uid to per_uid: 0 for none, a number, or DLX_LIMIT_FAIR (its fair
 * share). UINT64_MAX when nothing bounds it.
 */
static inline uint64_t quota_uid_cap(uint64_t limit, uint64_t per_uid, uint64_t all, uint64_t mine,
                                     enum quota_share share)
{
        if (per_uid != DLX_LIMIT_FAIR)
                return per_uid ? per_uid : UINT64_MAX;
        return limit ? quota_fair_cap(limit, all, mine, share) : UINT64_MAX;
}

/* What one uid uses of the per-uid limits; kept while anything is counted. */
struct uid_use {
        struct avl_node node; /* in store.uids */
        uid_t uid;
        uint32_t clients; /* sessions (the registry counts them) */
        uint64_t names;   /* names it owns with a current version (likewise) */
        uint64_t bytes;   /* bytes of the segments it created or sent */
        uint64_t fds;     /* descriptors held for those segments */
        uint32_t unread;  /* descriptors sent to its connections and not yet read (conn counts) */
        uint64_t queued;  /* bytes of output queued for its connections (likewise) */
};

/* What a uid's record counts. */
enum quota_count { QUOTA_CLIENTS, QUOTA_NAMES, QUOTA_BYTES, QUOTA_FDS, QUOTA_UNREAD, QUOTA_QUEUED };

/*
 * The one way a uid's counts change: what grows by delta (< 0: shrinks).
 * Only a bug takes a count below zero: it stops at zero instead, the broken
 * invariant is reported (invariant.h), and false is returned.
 */
bool quota_count(struct uid_use *u, enum quota_count what, int64_t delta);

/* The uid's record in the store, made if create; NULL if absent (or no memory). */
struct uid_use *quota_uid(struct store *st, uid_t uid, bool create);
/* Frees the record once nothing is counted in it. NULL-safe. */
void quota_uid_put(struct store *st, struct uid_use *u);

#endif /* DLX_DAEMON_QUOTA_H */
