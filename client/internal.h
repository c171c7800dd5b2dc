/* SPDX-License-Identifier: MIT */
/*
 * libdlx internals. Everything here is hidden (dlx__ prefix, hidden
 * visibility); only dlx_* in include/dlx/dlx.h is exported.
 *
 * Locking: client->lock guards all state below it in struct dlx_client;
 * client->send_lock serialises writes to the socket so frames never
 * interleave. Order: lock, then send_lock. Deleters supplied by users run
 * with neither held.
 *
 * Reading: whichever thread needs progress becomes the reader (one at a
 * time), polls and reads the socket without the lock, then takes the lock to
 * dispatch every complete frame: replies to their waiting callers, events to
 * their queues. Segment mappings change only there, in stream order, which
 * is what makes the fd-less acquire replies safe (see segment.c).
 *
 * Files, and who calls whom. error.c is a leaf. client.c (the connection,
 * the reader, the process's clients) is the hub; api.c, stream.c, release.c
 * and tensor.c sit above it; arena.c (the allocator) calls down into segment.c
 * (the mapping cache), gpumem.c and the connection; exchange.c calls
 * tensor.c, stream.c and client.c.
 * One circle is left, and the design needs it: client.c <-> segment.c. The
 * reader maps and unmaps segments as replies arrive, in stream order (see
 * above), and the cache sends Forget and reads its reply through the
 * connection. Apart from that, only lifetimes go upward: client.c, which
 * owns a client's, frees the allocator's records when the client dies.
 * Anything else that needs to go both ways between two files goes in the
 * lower one.
 */
#ifndef DLX_CLIENT_INTERNAL_H
#define DLX_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <dlx/dlx.h>

#include "avl.h"
#include "frame.h"
#include "layout.h"
#include "wire.h"

#define DLX_HIDDEN __attribute__((visibility("hidden")))

/* A segment mapped in this process: shared by every tensor inside it. */
struct seg_map {
        struct avl_node node; /* in client.maps, by id */
        uint64_t id;
        uint64_t size;
        uint8_t *ro;        /* read-only mapping, or NULL */
        uint8_t *rw;        /* writable mapping, or NULL */
        unsigned refs;      /* tensors and arena using it */
        bool gone;          /* the daemon destroyed it: never Forget, unmap at refs 0 */
        uint64_t forget_id; /* a Forget in flight: keep mapped until its reply */
        bool forgotten;     /* the daemon forgot it while we still used it */
        struct seg_map *idle_prev, *idle_next; /* idle LRU while refs == 0 */
        struct avl_node ro_node;               /* in segment.c's read-only mappings, by ro */
        struct arena_seg *arena;               /* set while this client's allocator uses it */
        bool host_registered;                  /* pinned with the CUDA driver (cuda-host) */
        /* an allocator segment of ours carries read-only versions: dlxd sealed it */
        bool sealed;
        /* ... writable ones: readers may map it writable, so it never carries read-only ones */
        bool shared_rw;
        uint32_t kind;       /* enum wire_storage of the segment */
        int device;          /* cuda-vmm: the device it is mapped on */
        uint64_t vmm_handle; /* cuda-vmm: the imported or created handle */
        void *last_reader;   /* cuda-vmm, cuda-host: event of the last release */
        void *wrote_on;      /* cuda-vmm: the stream of its last publish here */
        bool ro_writable;    /* cuda-vmm: ro is mapped read-write (the device refused read-only) */
};

/* A reply being waited for by one caller. */
struct pending {
        struct pending *next;
        uint64_t id;
        uint32_t type; /* enum wire_request_type of the request */
        bool done;
        int err;             /* transport failure, or a local failure while dispatching */
        int fd;              /* received with the reply, -1; consumed by dispatch for acquires */
        struct seg_map *map; /* acquire/alloc: the mapping, one reference taken */
        /* a device group's acquire (1.4): its table's segment, whose fd came first, -1 */
        int table_fd;
        uint64_t table_seg, table_size;
        struct seg_map *table_map;   /* the table's mapping, one reference taken */
        char why[DLX_ERROR_MAX + 1]; /* detail of a local failure while dispatching */
        struct wire_reply rep;
};

/* A watch event waiting for dlx_next_event(). */
struct event_node {
        struct event_node *next;
        struct dlx_event ev;
};

/* What a CUDA publish keeps with its held tensor until RELEASED (gpu.c). */
struct gpu_pub {
        int device;
        void *stream;            /* the producer's stream at publish */
        struct gpu_event *event; /* recorded at publish, back to the pool at RELEASED */
        bool has_fd;             /* fd: a framework's VMM allocation exported, for the publish */
        int fd;
};

/* What a CUDA acquire keeps with its tensor until release (gpu.c). */
#define DLX_SYNC_STREAMS 64
struct gpu_acq {
        int device;
        void *stream;        /* the consumer's stream: release is recorded on it */
        struct gpu_ipc *ipc; /* the opened IPC allocation, one reference; NULL for VMM */
        struct seg_map *vmm; /* the VMM mapping (its reference is the tensor's) */
        bool host;           /* cuda-host: pinned host memory, ordered like device memory */
        /* more streams the tensor is used on (dlx_tensor_sync): release waits for them */
        void **also;
        unsigned nalso, cap;
        bool has_event; /* the producer's event, for those streams to wait on */
        uint8_t event[DLX_CUDA_HANDLE];
        uint64_t event_session; /* its producer's session: with the handle, the cache key */
};

/* A tensor this client published zero-copy, kept until the daemon says RELEASED. */
struct held {
        struct avl_node node; /* in client.held, by token */
        uint64_t token;
        uint64_t version; /* once the publish reply is in; 0 before */
        DLManagedTensorVersioned *tensor;
        struct held *next_deleter; /* while queued to run */
        bool has_gpu;
        struct gpu_pub gpu;
        char name[DLX_NAME_MAX + 1];
};

/* A version of ours that was RELEASED, remembered for dlx_wait_released(). */
struct released {
        char name[DLX_NAME_MAX + 1];
        uint64_t version;
        int device; /* -1: not a CUDA tensor */
        uint32_t nevents;
        uint8_t (*events)[DLX_CUDA_HANDLE];
};

#define RELEASED_KEPT 64
/* CUDA devices libdlx addresses (ids 0..63): streams, events, primary contexts. */
#define DLX_GPU_MAX_DEVICES 64
/* Interprocess CUDA events libdlx makes per process, at most (dlx.h: publish, release). */
#define DLX_GPU_IPC_EVENTS 1024

/*
 * Working memory that a big call (dlx_publish_group()) keeps from one call
 * to the next: a repeat then touches pages it already has, where fresh
 * allocations of megabytes come from mmap and fault page by page. One
 * caller at a time has the client's (scratch_lock, tried, never waited
 * for); another gets a set of its own, freed when it is done.
 */
enum { DLX_SCRATCH_SLOTS = 4 };
struct dlx_scratch {
        void *buf[DLX_SCRATCH_SLOTS];
        size_t cap[DLX_SCRATCH_SLOTS];
        bool kept; /* the client's: scratch_lock is held */
};
/* What a client keeps between calls, at most: bigger buffers go back at once. */
#define DLX_SCRATCH_KEEP ((size_t)64 << 20)

struct dlx_client {
        int fd;
        int efd;       /* eventfd: readable while watch events wait in the queue */
        int pfd;       /* epoll of fd and efd: what dlx_fd() hands out */
        unsigned refs; /* the handle, plus every tensor it gave out; atomic */
        pthread_mutex_t lock;
        pthread_mutex_t send_lock;
        pthread_cond_t cond;

        /* --- under lock --- */
        bool reading;
        bool closed;        /* dlx_close() has begun: no new call */
        bool retired;       /* closed, the connection kept for the leases of tensors still alive */
        unsigned nacquired; /* acquired tensors alive (their deleters not run yet) */
        int64_t heard_ms;   /* monotonic ms when the daemon was last heard from */
        int64_t asked_ms;   /* ... last sent a request it answers */
        int64_t ping_ms;    /* when a ping went to a silent daemon, 0: none since heard */
        int broken;         /* 0, or -errno once the connection failed */
        bool torn;          /* a frame went out in part: nothing more may follow it */
        bool bye_sent;      /* a bye went out unanswered (bye_late): no second one */
        char broken_why[DLX_ERROR_MAX + 1]; /* the daemon's reason, when it gave one */
        uint64_t next_id;
        uint64_t next_token;
        struct pending *pending;
        struct event_node *ev_head, *ev_tail;
        unsigned nevents;
        bool events_dropped;
        struct avl_tree held;
        struct held *deleters; /* tensors whose versions are gone: run unlocked */
        struct avl_tree maps;
        struct seg_map *idle_head, *idle_tail; /* least recently used first */
        unsigned nidle;
        struct arena_seg *arena;
        unsigned arena_grown;                    /* segments the allocator asked for so far */
        struct released released[RELEASED_KEPT]; /* ring, for dlx_wait_released() */
        unsigned released_next;
        struct gpu_state *gpu;              /* CUDA pools, created on first use */
        void *streams[DLX_GPU_MAX_DEVICES]; /* current stream per CUDA device */
        /* the version page (track.c), mapped read-only at the first track; then set for good */
        const struct version_page *vpage;
        size_t vpage_size;
        uint32_t *track_refs; /* per slot: dlx_track()s not yet untracked; atomic reads */
        uint32_t *track_gen;  /* per slot: bumped when its last track ends (a wait's ABA guard) */
        pthread_mutex_t track_lock;   /* one first dlx_track() at a time: the page comes once */
        pthread_mutex_t scratch_lock; /* the caller that has scratch */
        struct dlx_scratch scratch;

        /* --- under exchange.c's lock: the process's open clients --- */
        /* --- under client.c's fork lock: clients whose connection is open (fork closes it) --- */
        struct dlx_client *conn_prev, *conn_next; /* in client.c's list of open connections */
        bool closing; /* dlx_close() began: no longer the exchange API's default (conn_lock) */

        /* --- set at connect, read-only after --- */
        struct release_ring *ring;  /* releases posted without a syscall, or NULL */
        struct frame_reader reader; /* touched only by the reader thread */
        uint64_t session;
        uint32_t uid;
        uint32_t server_minor;
        int64_t timeout_ms;  /* for an answer from the daemon; < 0: none */
        unsigned generation; /* the process's fork generation at connect */
        char server[64];
        struct wire_limit_set limits; /* the daemon's, from hello (all 0 from a 1.0 daemon) */
        dlx_log_fn log;
        void *log_ctx;
        bool log_stderr;
};

/* ---- error.c: a leaf, calling no other file ---- */
DLX_HIDDEN void dlx__log(dlx_client *c, int level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
/* Records a thread-local detail for dlx_last_error() and returns err. */
DLX_HIDDEN int dlx__fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A publish's persist and (federation, 1.5) origin fields from o: 0 or -errno, reported. */
DLX_HIDDEN int dlx__publish_opts(dlx_client *c, struct wire_request *req,
                                 const struct dlx_publish_options *o);

/* ---- client.c ---- */
DLX_HIDDEN void dlx__client_ref(dlx_client *c);
/*
 * The client the exchange API allocates from, with a reference: the one set
 * with dlx_set_default_client(), else the oldest of this process not closing;
 * NULL when there is none.
 */
DLX_HIDDEN dlx_client *dlx__default_client_ref(void);
DLX_HIDDEN void dlx__client_unref(dlx_client *c);
/*
 * Evaluates call with a reference on c (not NULL) held: a public entry point
 * wraps its body in it, so that a dlx_close() in another thread, which drops
 * the handle's reference, cannot free the client under a call in progress.
 */
#define DLX_HOLDING(c, call)                                                                       \
        __extension__({                                                                            \
                dlx__client_ref(c);                                                                \
                __typeof__(call) held_result__ = (call);                                           \
                dlx__client_unref(c);                                                              \
                held_result__;                                                                     \
        })
/*
 * A name a check refused, as a message may show it: one line, harmless to a
 * terminal (layout_quote). The buffer lives as long as the enclosing block.
 */
#define DLX_QUOTED(name) dlx__quote((name), (char[LAYOUT_QUOTED_MAX]){0})
static inline const char *dlx__quote(const char *name, char *buf)
{
        layout_quote(name, strlen(name), buf, LAYOUT_QUOTED_MAX);
        return buf;
}

/* The client's scratch, if no other call has it, else an empty set of the caller's own in *own. */
DLX_HIDDEN struct dlx_scratch *dlx__scratch_take(dlx_client *c, struct dlx_scratch *own);
/* Buffer slot of s, at least size bytes (its contents not kept), or NULL when out of memory. */
DLX_HIDDEN void *dlx__scratch_get(struct dlx_scratch *s, unsigned slot, size_t size);
/* Gives s back: the client's keeps what is under DLX_SCRATCH_KEEP, the caller's own is freed. */
DLX_HIDDEN void dlx__scratch_give(dlx_client *c, struct dlx_scratch *s);
/*
 * Whether c was connected by another process (this one forked since): its
 * socket, locks and leases are the parent's, not to be touched here.
 */
DLX_HIDDEN bool dlx__forked(const dlx_client *c);
/*
 * The steps of a fork, for the process-wide locks of other files: each holds
 * its own across the fork (so that a child never inherits one another thread
 * held), and a child drops what belongs to the parent. client.c's handlers
 * call them, in one order.
 */
enum dlx_fork_step { DLX_FORK_PREPARE, DLX_FORK_PARENT, DLX_FORK_CHILD };
/* -ESTALE with a detail when c belongs to another process, else 0. Any thread, no lock. */
DLX_HIDDEN int dlx__usable(const dlx_client *c);
/* An acquired tensor ended (its deleter ran); the last one ends a closed client's connection. */
DLX_HIDDEN void dlx__acquired_gone(dlx_client *c);

/*
 * One request, one reply: sends req (with fd attached if >= 0; borrowed) and
 * waits. Lock not held on entry. On success, *ret_p is filled; the caller
 * must call dlx__pending_done(). A reply with an error status returns its
 * -errno (detail recorded) after dispatch cleanup; *ret_p is still filled.
 */
DLX_HIDDEN int dlx__call(dlx_client *c, struct wire_request *req, int fd, struct pending *p);
DLX_HIDDEN void dlx__pending_done(dlx_client *c, struct pending *p);
/* Releases a lease: posted in the release ring when there is room (no syscall), else sent.
 * Lock held. */
DLX_HIDDEN void dlx__release(dlx_client *c, struct wire_request *req);
/* Releases a lease granted to a call that then failed here, by frame (takes the lock). */
DLX_HIDDEN void dlx__give_back(dlx_client *c, uint64_t lease);
/* Sends without waiting (release, free, forget). Lock may be held. Returns id or -errno. */
DLX_HIDDEN int dlx__send(dlx_client *c, struct wire_request *req, int fd);
/* Runs queued deleters; lock not held. */
DLX_HIDDEN void dlx__run_deleters(dlx_client *c);
/*
 * Takes in what the daemon has sent without waiting (RELEASED notices run
 * their deleters, unlocked). Lock held; it is dropped and retaken.
 */
DLX_HIDDEN void dlx__poll_notices(dlx_client *c);
/* Monotonic milliseconds. */
DLX_HIDDEN int64_t dlx__now_ms(void);
/* dlx__now_ms() + timeout_ms (>= 0), saturated: INT64_MAX is a timeout too. */
DLX_HIDDEN int64_t dlx__deadline_ms(int64_t timeout_ms);
/*
 * The reader (see above): makes progress on the socket for up to timeout_ms
 * (< 0: until something arrives), or waits for the thread reading. Lock held
 * on entry and exit. Returns 0, -ETIMEDOUT or the connection's error.
 */
DLX_HIDDEN int dlx__pump(dlx_client *c, int64_t timeout_ms);
/*
 * One wait for the daemon until deadline (monotonic ms, < 0: none), pinging
 * a daemon silent for the client's timeout and breaking the connection when
 * the ping goes unanswered as long. Lock held. Returns as dlx__pump().
 */
DLX_HIDDEN int dlx__wait_step(dlx_client *c, int64_t deadline);
/* Unlocks c and fails with err and the daemon's words or why it was given up. */
DLX_HIDDEN int dlx__fail_unlock(dlx_client *c, int err);

/* ---- segment.c ---- */
DLX_HIDDEN struct seg_map *dlx__map_find(dlx_client *c, uint64_t id);
/* Adds a mapping made elsewhere (a VMM segment of ours); false if the id is taken. Lock held. */
DLX_HIDDEN bool dlx__map_insert(dlx_client *c, struct seg_map *m);
/*
 * Mapping for a reply about segment id: maps fd (consumed) if given and the
 * needed mode is missing, else revives the cached one. Takes one reference.
 * Lock held. Returns 0 or -errno.
 */
DLX_HIDDEN int dlx__map_get(dlx_client *c, uint64_t id, uint32_t kind, int device, uint64_t size,
                            int fd, bool writable, struct seg_map **ret);
DLX_HIDDEN void dlx__map_unref(dlx_client *c, struct seg_map *m);
DLX_HIDDEN void dlx__map_gone(dlx_client *c, uint64_t id);
DLX_HIDDEN void dlx__map_forgotten(dlx_client *c, uint64_t forget_id);
/* Unmaps every idle mapping (at close). Lock held. */
DLX_HIDDEN void dlx__maps_close(dlx_client *c);
/* Frees every mapping (the last reference to the client went; the allocator's records first). */
DLX_HIDDEN void dlx__maps_final(dlx_client *c);

/*
 * Whether any of the bytes [data + lo, data + hi) lie in a mapping libdlx made
 * read-only, by any client of this process (host or CUDA VMM addresses). Takes
 * a lock of its own, the innermost of all; no client lock is needed.
 */
DLX_HIDDEN bool dlx__mapped_read_only(const void *data, int64_t lo, int64_t hi);
DLX_HIDDEN void dlx__segment_fork(enum dlx_fork_step step);
/* cudadrv.c's: a child may not use CUDA its parent used, and gets a clear error instead. */
#ifdef DLX_HAVE_CUDA
DLX_HIDDEN void dlx__cuda_fork(enum dlx_fork_step step);
#else
static inline void dlx__cuda_fork(enum dlx_fork_step step)
{
        (void)step;
}
#endif

/* ---- arena.c ---- */
/* Frees the allocator's records of c's segments (their mappings go with the cache). */
DLX_HIDDEN void dlx__arena_final(dlx_client *c);
/* The allocator. alloc takes the lock itself (it may ask the daemon for a segment);
 * free is called with the lock held. Each chunk holds one reference on its map. */
DLX_HIDDEN int dlx__arena_alloc(dlx_client *c, uint32_t kind, int device, uint64_t bytes,
                                struct seg_map **ret_map, uint64_t *ret_offset);
DLX_HIDDEN void dlx__arena_free(dlx_client *c, struct seg_map *m, uint64_t offset, uint64_t bytes);
/*
 * Gives back every empty segment the allocator keeps for reuse, of any kind
 * or device (a byte limit counts them all): what to do before trying again
 * what a byte limit refused. Returns how many it gave back. Takes the lock.
 */
DLX_HIDDEN unsigned dlx__arena_give_back_empty(dlx_client *c);
/*
 * The allocator segment holding the bytes [data + lo, data + hi) and data
 * itself, or NULL: memory any tensor (a dlx_alloc() result or a framework view
 * of one) can be published from without a copy. Lock held.
 */
DLX_HIDDEN struct seg_map *dlx__arena_find(dlx_client *c, uint32_t kind, const void *data,
                                           int64_t lo, int64_t hi);

/*
 * Adds seals to a memfd this process filled with write() and that nobody
 * ever mapped. F_SEAL_WRITE may still meet EBUSY: a fresh page the kernel
 * briefly counts as pinned (a per-CPU batch another CPU has not drained, on
 * a loaded machine). That is retried, about a second at most in all.
 * Returns 0 or -errno.
 */
DLX_HIDDEN int dlx__seal_fresh(int fd, int seals);

/* ---- tensor.c ---- */
/*
 * Registers h for the RELEASED of the zero-copy publish req is about to make
 * of tensor (h's gpu set already): a token for req. Lock held.
 */
DLX_HIDDEN void dlx__held_insert(dlx_client *c, struct held *h, const char *name,
                                 DLManagedTensorVersioned *tensor, struct wire_request *req);
/*
 * The publish of h (token) was answered: err 0 notes its version, unless the
 * version is already released; else h is undone and freed, its tensor the
 * caller's again. Lock not held.
 */
DLX_HIDDEN void dlx__held_answered(dlx_client *c, struct held *h, uint64_t token, int err,
                                   uint64_t version);
DLX_HIDDEN void dlx__info_from_wire(const struct wire_info *w, struct dlx_info *info);

/* ---- track.c ---- */
/* Unmaps the version page (the client's last reference went). */
DLX_HIDDEN void dlx__track_final(dlx_client *c);

/* ---- exchange.c ---- */
/* The tensor an exchange-API export (of an export...) stands for; t itself otherwise. */
/*
 * A tensor of its own for t, a group member (tensor.c) with its DLPack flags: an acquired tensor
 * whose deleter calls drop(hold) instead of releasing a lease, so that
 * dlx_tensor_info() and the exchange API treat it as any acquired tensor.
 * t's shape and strides are copied; its data stays. write_protected: its
 * mapping refuses writes; storage: the wire storage kind of its memory. A
 * device group's member orders through the group's gpu (of client c, alive
 * while hold is): dlx_tensor_sync() and dlx_tensor_wait() act on it.
 * Returns 0 or -ENOMEM.
 */
DLX_HIDDEN int dlx__acquired_member(const DLTensor *t, uint64_t flags, bool writable,
                                    bool write_protected, uint32_t storage, const char *name,
                                    uint64_t version, dlx_client *c, struct gpu_acq *group_gpu,
                                    void (*drop)(void *hold), void *hold,
                                    DLManagedTensorVersioned **ret);
DLX_HIDDEN const DLManagedTensorVersioned *dlx__exchange_unwrap(const DLManagedTensorVersioned *t);

#endif /* DLX_CLIENT_INTERNAL_H */
