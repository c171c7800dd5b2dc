/* SPDX-License-Identifier: MIT */
/*
 * The version page (protocol 1.2): shared memory per session where the daemon
 * keeps the current version of each name the client tracks, so that "is
 * there a newer version of X?" is a load, not a round trip.
 *
 * The daemon creates it at the session's first Track (a memfd attached to the
 * reply), maps it writable and then seals it with F_SEAL_FUTURE_WRITE: the
 * client can map it only read-only, cannot make that mapping writable, and
 * cannot write() or resize it. Each session has its own page, so no client can
 * change what another sees, nor what it sees itself.
 *
 * A slot's writer is the daemon alone. On every change of the name's current
 * version (publish, replace, unpublish) it stores version (release), then
 * increments seq (release) and wakes seq's futex waiters. A reader loads seq
 * (acquire), then version: if version is not what it has, it has news; else it
 * may FUTEX_WAIT on seq with the value it loaded, which returns at once if a
 * change came in between. An Untrack sets its slot's version to 0 (and bumps,
 * and wakes) before the slot may go to another name. When the session ends
 * (bye, hang-up, dropped) or the daemon stops (every page at once, before any
 * session ends, so that no name reads as unpublished for it), the daemon sets
 * closed, bumps every tracked slot's seq and wakes them all; the versions stay
 * what they were, and nothing is written there after. A daemon that dies
 * without that wakes no one: readers wait in slices and look at the
 * connection between them.
 */
#ifndef DLX_PROTO_VERPAGE_H
#define DLX_PROTO_VERPAGE_H

#include <stdint.h>

#define VERPAGE_MAGIC 0x646c7856u /* "dlxV" */

struct verpage_slot {
        uint64_t version; /* the name's current version; 0: none (not or no longer published) */
        uint32_t seq;     /* bumped after each change of version: the futex word */
        uint32_t pad;
};

struct version_page {
        uint32_t magic;
        uint32_t slots;
        uint32_t closed; /* the session has ended: nothing here changes any more */
        uint8_t pad[52];
        struct verpage_slot slot[];
};

_Static_assert(sizeof(struct verpage_slot) == 16, "verpage_slot layout");
_Static_assert(sizeof(struct version_page) == 64, "version_page layout");

/* Bytes of a page of n slots. */
#define VERPAGE_SIZE(n) (sizeof(struct version_page) + (uint64_t)(n) * sizeof(struct verpage_slot))

#endif /* DLX_PROTO_VERPAGE_H */
