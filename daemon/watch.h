/* SPDX-License-Identifier: MIT */
/*
 * Watches: a session asks for an event whenever a name under a prefix is
 * published, replaced or unpublished. A watch belongs to its session (in
 * session.watches, counted in session.nwatches) and to the registry's index,
 * which finds the watches a name matches. Events leave through
 * session_send(); the registry decides when a name changes and calls
 * watch_notify().
 *
 * The index. Watches of one prefix share a bucket, and a bucket lives in the
 * tree of its prefix's length, ordered by the prefix's bytes. A name of n
 * bytes starts with exactly one string of each length L <= n, its first L
 * bytes, so it matches at most one bucket per length: a notify looks that
 * string up in each tree that is not empty, for L = 0..n, and sends one event
 * per watch in the buckets found. What a publish costs no longer grows with
 * the watches that do not match it, only with the lengths they have.
 *
 * The worst case, bounded. Watches in all number at most --max-clients x
 * --max-watches (1024 x 256 = 262,144 by default), and so do buckets. A
 * lookup in an AVL tree of m buckets visits fewer than 1.44 log2(m + 2)
 * nodes, each a memcmp of L <= 255 bytes. Over the 256 lengths a hostile
 * set of watches could fill, the sum is largest when they spread evenly
 * (1,024 buckets per length): about 256 x 14.4 = 3,700 node visits per
 * notify, a few hundred kilobytes compared, against 262,144 prefix
 * comparisons for a scan of every watch. dlx-bench's "watches" scenario
 * measures the shape (every length, each prefix one byte or two short of
 * the name). Matches then cost one event each, plus O(log k) to keep k
 * matching buckets (k <= 256) in watch-id order.
 */
#ifndef DLX_DAEMON_WATCH_H
#define DLX_DAEMON_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "avl.h"
#include "list.h"
#include "session.h"
#include "wire.h"
#include "wire_limits.h"

/* The watches of one prefix. Freed with its last watch: a bucket is never empty. */
struct watch_bucket {
        struct avl_node node; /* in watch_index.by_len[plen], by prefix */
        struct list watches;  /* struct watch, oldest (lowest id) first */
        size_t plen;
        char prefix[];
};

struct watch {
        struct list blink; /* in bucket.watches */
        struct list slink; /* in session.watches */
        struct watch_bucket *bucket;
        struct session *s;
        uint64_t id;
};

struct watch_index {
        struct avl_tree by_len[DLX_NAME_MAX + 1]; /* struct watch_bucket, one tree per length */
        uint64_t next_id;
        uint64_t count; /* watches of all sessions */
};

void watch_index_init(struct watch_index *ix);

/*
 * A new watch of prefix (at most DLX_NAME_MAX bytes) for s; its id, unique
 * in ix and higher than any before it, into *ret_id. Returns 0, -EINVAL for
 * a prefix too long, or -ENOMEM (nothing changed). Limits are the caller's
 * to check.
 */
int watch_add(struct watch_index *ix, struct session *s, const char *prefix, uint64_t *ret_id);

/* Ends s's watch id. Returns 0, or -ENOENT when s has no such watch. */
int watch_remove(struct watch_index *ix, struct session *s, uint64_t id);

/* Ends every watch of s (a closing session). */
void watch_session_drop(struct watch_index *ix, struct session *s);

/*
 * Sends an event of kind about name (len bytes, NUL-terminated) at version
 * to every watch whose prefix the name starts with, in the order the
 * watches were made (as when every publish scanned them all, so a session
 * with several matching watches sees their events in the same order).
 */
void watch_notify(const struct watch_index *ix, enum wire_event_kind kind, const char *name,
                  size_t len, uint64_t version);

#endif /* DLX_DAEMON_WATCH_H */
