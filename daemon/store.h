/* SPDX-License-Identifier: MIT */
/*
 * Shared-memory segments the daemon holds: one sealed memfd each, created on
 * request (alloc) or received from a client (publish). The daemon never maps
 * them; it keeps the descriptors, checks seals and sizes, and accounts bytes,
 * in all and per uid (quota.h).
 */
#ifndef DLX_DAEMON_STORE_H
#define DLX_DAEMON_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "avl.h"
#include "list.h"
#include "quota.h"
#include "wire_limits.h"

struct session;

/*
 * NVIDIA's driver exports a VMM allocation as a file of its control device,
 * /dev/nvidiactl (NV_MAJOR_DEVICE_NUMBER and
 * NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE in the driver's
 * nv-chardev-numbers.h), and imports nothing else: store.vmm_dev unless
 * dlxd is told otherwise (--cuda-device-number).
 */
/*
 * Closing the last descriptor of a big memfd frees its pages there and then:
 * half a millisecond for a few megabytes. A destroyed segment of at least
 * STORE_DEFER_BYTES has its descriptor closed once the loop has sent what
 * the request that destroyed it answers (store_close_deferred), up to
 * STORE_DEFER_MAX open at a time, waiting or being closed; smaller ones, and
 * any past that, close at once. These no longer count against max_fds: they
 * are among the DAEMON_OWN_FDS that the default max_fds leaves the daemon
 * (with its socket, its loop's, its log's: a dozen).
 */
#define STORE_DEFER_BYTES ((uint64_t)1 << 20)
#define STORE_DEFER_MAX 32
#define DAEMON_OWN_FDS 64
_Static_assert(STORE_DEFER_MAX <= DAEMON_OWN_FDS / 2, "room for the daemon's own beside them");

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
        /* asks for store_close_deferred() soon; NULL: every descriptor closes at once */
        void (*on_defer)(void *ctx);
        void *defer_ctx;
        int deferred[STORE_DEFER_MAX]; /* descriptors of destroyed segments, to close */
        unsigned ndeferred;
        unsigned deferred_closing; /* taken from deferred by the closer, not closed yet */
};

/*
 * No byte limits until the registry sets them (registry_init); cuda-vmm fds
 * must be files of STORE_VMM_MAJOR:STORE_VMM_MINOR until vmm_dev is set.
 */
void store_init(struct store *st);
/* Destroys every segment (daemon exit). */
void store_done(struct store *st);
/* Closes the descriptors whose close segment destruction deferred. */
void store_close_deferred(struct store *st);

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
 * Readies a memfd segment to carry writable versions, whose readers get its
 * fd open for writing: seals it against further seals (F_SEAL_SEAL), so
 * that no holder of that fd can seal it against writing afterwards and so
 * take every other reader's writable mapping away. Then reads its seals
 * back, not trusting what dlxd saw at adoption. Returns 0, -EBUSY (sealed
 * against writing: it carries read-only versions, or its sender sealed it
 * meanwhile) or -EIO, with the reason in *ret_why.
 */
int segment_seal_rw(struct segment *seg, const char **ret_why);

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
