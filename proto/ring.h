/* SPDX-License-Identifier: MIT */
/*
 * The release ring: a page of shared memory per session where a client posts
 * lease releases without a system call, so that acquire + release costs one
 * round trip. The daemon creates it (a sealed memfd sent with the hello
 * reply), drains it before every batch of that client's requests (so a
 * release always precedes whatever the client sent after it), and shortly
 * after the client goes quiet. It then marks itself asleep; a client that
 * sees the daemon asleep after posting sends a socket release of lease 0 as
 * well, which wakes it and, like every release that succeeds, is not
 * answered: a client that only lets tensors go has nothing to read. The
 * seq_cst store/load pairs on both sides (post, then check asleep; sleep,
 * then check posted) mean no release is ever left unseen.
 *
 * The client is the only writer of head and of the slots; the daemon the only
 * writer of tail and asleep. The daemon trusts nothing it reads here: lease
 * ids are looked up in the session's own leases, and a head that runs more
 * than RING_SLOTS ahead of tail ends the session.
 */
#ifndef DLX_PROTO_RING_H
#define DLX_PROTO_RING_H

#include <stdint.h>

#define RING_MAGIC 0x646c7852u /* "dlxR" */
#define RING_SLOTS 1024

struct release_ring {
        uint32_t magic;
        uint32_t slots;
        uint64_t head; /* next slot the client writes (client-owned) */
        uint8_t pad1[48];
        uint64_t tail;   /* next slot the daemon reads (daemon-owned) */
        uint32_t asleep; /* the daemon will not look until the client's next frame */
        uint8_t pad2[52];
        uint64_t lease[RING_SLOTS];
};

_Static_assert(sizeof(struct release_ring) == 128 + RING_SLOTS * 8, "release_ring layout");

#endif /* DLX_PROTO_RING_H */
