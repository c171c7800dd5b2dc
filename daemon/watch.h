/* SPDX-License-Identifier: MIT */
/*
 * Watches: a session asks for an event whenever a name under a prefix is
 * published, replaced or unpublished. A watch belongs to its session (in
 * session.watches, counted in session.nwatches) and to the registry's index,
 * which finds the watches a name matches. Events leave through
 * session_send(); the registry decides when a name changes and calls
 * watch_notify().
 */
#ifndef DLX_DAEMON_WATCH_H
#define DLX_DAEMON_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "list.h"
#include "session.h"
#include "wire.h"

struct watch_index {
        struct list all; /* struct watch, oldest first */
        uint64_t next_id;
        uint64_t count; /* watches of all sessions */
};

void watch_index_init(struct watch_index *ix);

/*
 * A new watch of prefix (at most DLX_NAME_MAX bytes) for s; its id, unique
 * in ix, into *ret_id. Returns 0, -EINVAL for a prefix too long, or -ENOMEM
 * (nothing changed). Limits are the caller's to check.
 */
int watch_add(struct watch_index *ix, struct session *s, const char *prefix, uint64_t *ret_id);

/* Ends s's watch id. Returns 0, or -ENOENT when s has no such watch. */
int watch_remove(struct watch_index *ix, struct session *s, uint64_t id);

/* Ends every watch of s (a closing session). */
void watch_session_drop(struct watch_index *ix, struct session *s);

/*
 * Sends an event of kind about name (len bytes) at version to every watch
 * whose prefix the name starts with, in the order the watches were made.
 */
void watch_notify(struct watch_index *ix, enum wire_event_kind kind, const char *name, size_t len,
                  uint64_t version);

#endif /* DLX_DAEMON_WATCH_H */
