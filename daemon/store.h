/* SPDX-License-Identifier: MIT */
/*
 * Shared-memory segments the daemon holds: one sealed memfd each, created on
 * request (alloc) or received from a client (publish). The daemon never maps
 * them; it keeps the descriptors, checks seals and sizes, and accounts bytes,
 * in all and per uid (with the other per-uid counts the registry keeps).
 */
#ifndef DLX_DAEMON_STORE_H
#define DLX_DAEMON_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "avl.h"
#include "list.h"
#include "wire_limits.h"

struct session;

/*
 * NVIDIA's driver exports a VMM allocation as a file of its control device,
 * /dev/nvidiactl (NV_MAJOR_DEVICE_NUMBER and
 * NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE in the driver's
 * nv-chardev-numbers.h), and imports nothing else: store.vmm_dev unless
 * dlxd is told otherwise (--cuda-device-number).
 */
#define STORE_VMM_MAJOR 195
#define STORE_VMM_MINOR 255

struct segment {
        struct avl_node node; /* in store.segments, by id */
        uint64_t id;
        uint32_t kind; /* enum wire_storage: how consumers reach the memory */
        int fd;        /* as created or received; -1 for a CUDA IPC handle */
        uint64_t size;
        uid_t uid;              /* who created or sent it: its bytes and fd are charged there */
        struct session *holder; /* session holding it as an allocation, or NULL */
        /*
         * F_SEAL_WRITE or F_SEAL_FUTURE_WRITE: no new writable mapping of it
         * can exist, through any fd, in any process. Every read-only version
         * lives in a sealed segment (segment_seal_ro()), so its fd can be
         * handed out as is.
         */
        bool write_sealed;
        bool fd_readonly;  /* our fd is O_RDONLY: consumers cannot map it writable either */
        bool ours;         /* made by store_alloc(), not sent by a peer */
        bool shared_rw;    /* a writable version was published from it: never sealed after */
        unsigned refs;     /* versions using it, plus one while held */
        struct list known; /* struct known records: sessions that hold its fd */
        uint8_t ipc_handle[DLX_CUDA_HANDLE]; /* CUDA IPC: the allocation's handle */
};

/*
 * Fair shares of what all uids draw on. A uid holding mine, of all held in
 * all, may hold a share of what the other uids leave of limit, and the rest
 * stays for uids still to come: however many uids fill it, the next one finds
 * room while anything is left. STORE_HALF (half, rounded down) for what is in
 * flight (output queued, descriptors unread) and descriptors held; STORE_MOST
 * (all but an eighth, rounded down) for clients and names, so that a uid
 * alone may use 7/8 of a limit, and all of one under 8.
 */
enum store_share { STORE_HALF, STORE_MOST };

static inline uint64_t store_fair_cap(uint64_t limit, uint64_t all, uint64_t mine,
                                      enum store_share share)
{
        uint64_t others = all - mine, left = limit > others ? limit - others : 0;

        return share == STORE_HALF ? left / 2 : left - left / 8;
}

/* Whether a uid holding mine may take n more, under its fair share. */
static inline bool store_fair_share(uint64_t limit, uint64_t all, uint64_t mine, uint64_t n,
                                    enum store_share share)
{
        return mine + n <= store_fair_cap(limit, all, mine, share);
}

/*
 * The most one uid may hold of something limited in all to limit (0: none)
 * and per uid to per_uid: 0 for none, a number, or DLX_LIMIT_FAIR (its fair
 * share). UINT64_MAX when nothing bounds it.
 */
static inline uint64_t store_uid_cap(uint64_t limit, uint64_t per_uid, uint64_t all, uint64_t mine,
                                     enum store_share share)
{
        if (per_uid != DLX_LIMIT_FAIR)
                return per_uid ? per_uid : UINT64_MAX;
        return limit ? store_fair_cap(limit, all, mine, share) : UINT64_MAX;
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

struct store {
        struct avl_tree segments;
        struct avl_tree uids; /* struct uid_use */
        uint64_t next_id;
        uint64_t bytes;
        uint64_t max_bytes;         /* 0: no limit */
        uint64_t max_bytes_per_uid; /* 0: no limit */
        uint64_t fds;               /* descriptors held for segments */
        uint64_t max_fds;           /* 0: no limit */
        uint64_t max_fds_per_uid;   /* 0: no limit */
        dev_t vmm_dev;              /* the character device every cuda-vmm fd is a file of */
        char why[224];              /* the reason for the last refusal (-ENOSPC, -EAGAIN, -EBADF) */
        /* called for each session that holds the fd of a segment being destroyed */
        void (*on_gone)(struct session *s, uint64_t segment_id);
};

/*
 * No byte limits until the registry sets them (registry_init); cuda-vmm fds
 * must be files of STORE_VMM_MAJOR:STORE_VMM_MINOR until vmm_dev is set.
 */
void store_init(struct store *st);
/* Destroys every segment (daemon exit). */
void store_done(struct store *st);

/* The uid's record, made if create; NULL if absent (or no memory). */
struct uid_use *store_uid(struct store *st, uid_t uid, bool create);
/* Frees the record once nothing is counted in it. NULL-safe. */
void store_uid_put(struct store *st, struct uid_use *u);

/*
 * Creates a memfd of size bytes sealed against shrinking and growing, charged
 * (bytes and one descriptor) to uid. Returns 0 with *ret (one reference), or
 * -EINVAL (size 0 or over DLX_MAX_SEGMENT), -ENOSPC (over max_bytes, in all or
 * for uid), -EAGAIN (over max_fds, in all or for uid) with the reason in
 * *ret_why, or -errno.
 */
int store_alloc(struct store *st, uint64_t size, uid_t uid, struct segment **ret,
                const char **ret_why);

/*
 * Adopts a received fd as a segment of the given kind, charged to uid;
 * consumed on every path. A memfd kind (memfd, cuda-host) must be a memfd
 * sealed against shrinking and growing, and is measured with fstat. A CUDA
 * VMM fd must be a file of the character device st->vmm_dev (not opened
 * O_PATH), which is all dlxd can check without a driver: -EBADF otherwise,
 * with a reason that names what the fd is; declared_size is its size.
 * Returns 0 with *ret (one reference), -EBADF, -EINVAL, -ENOSPC or -EAGAIN
 * with a reason in *ret_why (valid until the next call), or -errno.
 */
int store_adopt(struct store *st, int fd, uint32_t kind, uint64_t declared_size, uid_t uid,
                struct segment **ret, const char **ret_why);

/*
 * A segment that is only a CUDA IPC handle of a producer's allocation of
 * size bytes: no fd, and no bytes charged (the producer's process holds the
 * memory). Returns 0 with *ret (one reference), -EINVAL or -ENOMEM.
 */
int store_ipc(struct store *st, const uint8_t handle[DLX_CUDA_HANDLE], uint64_t size, uid_t uid,
              struct segment **ret);

struct segment *store_find(struct store *st, uint64_t id);

void segment_ref(struct segment *seg);
/* Drops a reference; the last one closes the fds and tells every holder of its fd. */
void segment_unref(struct store *st, struct segment *seg);

/*
 * Seals a memfd segment against writing so that it can carry read-only
 * versions: from then on nobody can map it writable or write() to it,
 * whatever fd they hold. One of ours gets F_SEAL_FUTURE_WRITE, which keeps the
 * writable mapping of the client it was made for (the producer's own); one a
 * peer sent gets F_SEAL_WRITE, which the kernel grants only when no writable
 * mapping of it exists anywhere. Returns 0 (sealed, or sealed already),
 * -EBUSY (a writable version was published from it, or a writable mapping
 * of it exists) or -EBADF (the fd cannot be sealed: opened read-only, or
 * F_SEAL_SEAL), with the reason in *ret_why.
 */
int segment_seal_ro(struct segment *seg, const char **ret_why);

/*
 * Which sessions hold a segment's fd, so a repeated acquire sends none and a
 * destroyed segment can be announced. One record per (session, segment).
 */
struct known {
        struct avl_node node; /* in session.known, by segment id */
        struct list link;     /* in segment.known */
        struct segment *seg;
        struct session *session;
        bool ro, rw; /* which of the segment's fds the peer has been sent */
};

#endif /* DLX_DAEMON_STORE_H */
