/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: dlxd's whole session layer in one process, without sockets.
 * A registry and store (daemon/namespace.h lists its files) serve three peers; each
 * peer's bytes and descriptors go through a frame reader into dispatch_frame()
 * exactly as daemon/conn.c sends them (its release ring drained before each
 * batch, a bad frame or DISPATCH_CLOSE ending the session once its replies are
 * out). Replies leave through a fake send that packs each one as the
 * connection would and decodes it as libdlx would. A finding is a reply the
 * client cannot decode, a reply to a request id the session did not send (or
 * one answered already), an fd sent that is not open, or an acquired tensor
 * whose fd maps writable when it is read-only, or not when it is writable
 * (the consumer's mmap would fail). The peers share names, so watch
 * events, leases across sessions, replacement, unpublish and RELEASED events
 * all run.
 *
 * After every operation the registry's counts are checked against what the
 * sessions hold. After each input every session is closed (in an order the
 * input picks) and the registry, store and loop torn down; then nothing may be
 * left: no segment, name, uid record or timer, and exactly the fds open before
 * the input (LeakSanitizer finds the bytes).
 *
 * Input: byte 0 configures the run:
 *   bits 0-2  the order the peers are closed in at the end (of the 6, mod 6)
 *   bits 3-4  limits: 0 1 MiB shared bytes, otherwise dlxd's defaults; 1 tight
 *             limits everywhere (2 clients, 1 per uid, 4 leases, 4 watches,
 *             8 names, 64 KiB per uid...);
 *             2 1 GiB in all but 64 KiB per uid; 3 no limits at all
 *   bit 5     peer 2 is root (uid 0), else uid 1001; peers 0 and 1 are uid 1000
 *   bits 6-7  bytes reach a reader in chunks of at most: any, 1, 7 or 61 bytes
 * then operations, each a byte: op & 3 the peer (3 is peer 0), op >> 2 the kind
 * (mod 9, enum session_op); integers are little endian, missing bytes read 0:
 *   0 DATA   u16 n, n bytes  a batch the peer sent: its ring drained
 *                            (registry_ring_wake), the bytes fed to its reader,
 *                            each complete frame dispatched
 *   1 FDS    u8 n, n % 20 fd-kind bytes (fuzz.h)  descriptors that come with
 *                            the peer's next bytes (SCM_RIGHTS)
 *   2 POST   u8 n, n u8 lease ids   releases posted in the peer's ring
 *   3 HEAD   u16 v           the peer sets its ring's head to tail + v
 *                            (over RING_SLOTS: a corrupt ring)
 *   4 SWEEP                  the peer went quiet: registry_ring_sleep()
 *   5 TICK                   the loop runs once, waiting at most 2 ms for a
 *                            timer that is due (acquire timeouts)
 *   6 CLOSE                  the peer hangs up
 *   7 STALL                  the peer stops reading: its next reply cannot be
 *                            queued, and it is dropped (as conn_send does)
 *   8 REQUEST u8 f, u16 n, n bytes  as DATA, of one frame with this payload and
 *                            f % 8 fds announced: the header always fits, so
 *                            that mutations reach the codec and the registry
 * A peer that is not connected connects (a new session) when it next acts,
 * up to 32 sessions per input.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "dispatch.h"
#include "frame.h"
#include "fuzz.h"
#include "log.h"
#include "registry.h"
#include "ring.h"
#include "session.h"
#include "store.h"
#include "wire.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1; glibc 2.36 names it */
#endif

#define NPEERS 3
#define MAX_CONNECTS 32
/* Replies up to this size are packed on the stack, as conn_send() does. */
#define SMALL_REPLY 1024

/* Requests of a peer that may still be answered: id, and how many were sent with it. */
struct pending {
        uint64_t id;
        unsigned count;
};

struct peer {
        struct session *s; /* NULL while not connected */
        struct frame_reader reader;
        uid_t uid;
        bool stalled; /* its sends fail */
        bool dropped; /* closes at the end of the operation; sends fail meanwhile */
        struct pending *pending;
        size_t npending, cap;
};

static struct {
        bool warm;
        uv_loop_t loop;
        struct store store;
        struct registry reg;
        struct peer peers[NPEERS];
        unsigned connects;
        size_t chunk;
        bool verbose; /* DLX_FUZZ_LOG is set: replies are printed too */
} F;

/* ---- the fake connection --------------------------------------------------------------------- */

/* The peer sent a request with this id: one reply may come for it. */
static void expect_reply(struct peer *p, uint64_t id)
{
        for (size_t i = 0; i < p->npending; i++) {
                if (p->pending[i].id == id) {
                        p->pending[i].count++;
                        return;
                }
        }
        if (p->npending == p->cap) {
                p->cap = p->cap ? 2 * p->cap : 16;
                p->pending = realloc(p->pending, p->cap * sizeof(*p->pending));
                FUZZ_CHECK(p->pending != NULL, "out of memory");
        }
        p->pending[p->npending++] = (struct pending){id, 1};
}

/*
 * A reply to id goes to this peer: it must have asked, and not been answered
 * already (a reply to another session's request, or a second reply, is a bug).
 */
static void take_reply(struct peer *p, uint64_t id)
{
        for (size_t i = 0; i < p->npending; i++) {
                if (p->pending[i].id == id) {
                        if (--p->pending[i].count == 0)
                                p->pending[i] = p->pending[--p->npending];
                        return;
                }
        }
        FUZZ_CHECK(false, "session %llu got a reply to request %llu it did not send (or twice)",
                   (unsigned long long)p->s->id, (unsigned long long)id);
}

static int fake_send(void *ctx, const struct wire_reply *rep, int fd_arg, struct segment *seg)
{
        /* a segment's fd is what the connection would attach */
        int fd = seg ? seg->fd : fd_arg;
        struct peer *p = ctx;
        uint8_t small[SMALL_REPLY], *buf = small;
        struct wire_reply back;
        char why[DLX_ERROR_MAX + 1];
        size_t size = 0;
        int err;

        FUZZ_CHECK(p->s != NULL, "a reply sent to a peer that is gone");
        if (fd >= 0) {
                int fl = fcntl(fd, F_GETFD);
                FUZZ_CHECK(fl >= 0, "a reply carries fd %d, which is not open", fd);
                FUZZ_CHECK(fl & FD_CLOEXEC, "a reply carries fd %d without close-on-exec", fd);
        }
        if (fd >= 0 && rep->type == WIRE_REP_ACQUIRE &&
            rep->acquire.tensor.storage != WIRE_STORAGE_CUDA_VMM) {
                /* what the consumer will mmap: writable exactly when the reply says so */
                int mode = fcntl(fd, F_GETFL), seals = fcntl(fd, F_GET_SEALS);
                bool can_write = mode >= 0 && (mode & O_ACCMODE) == O_RDWR &&
                                 !(seals >= 0 && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)));
                FUZZ_CHECK(rep->acquire.writable || !can_write,
                           "read-only '%s' sent on fd %d, which maps writable",
                           rep->acquire.tensor.name, fd);
                FUZZ_CHECK(!rep->acquire.writable || can_write,
                           "writable '%s' sent on fd %d, which cannot map writable (seals %#x)",
                           rep->acquire.tensor.name, fd, seals);
        }
        err = wire_reply_encode(rep, small, sizeof(small), &size);
        FUZZ_CHECK(err == 0 || err == -ENOBUFS,
                   "dlxd made a reply of type %d it cannot encode (%d)", (int)rep->type, err);
        if (size > DLX_MAX_FRAME)
                return -EMSGSIZE; /* session_send() answers with a short reply instead */
        if (rep->id != 0)
                take_reply(p, rep->id);
        if (p->dropped)
                return -ENOTCONN;
        if (p->stalled) {
                p->dropped = true;
                return -ENOBUFS;
        }
        if (err == -ENOBUFS) {
                buf = malloc(size);
                FUZZ_CHECK(buf != NULL, "out of memory");
                FUZZ_CHECK(wire_reply_pack(rep, buf) == size, "pack and size disagree");
        }
        memset(&back, 0, sizeof(back));
        err = wire_reply_decode(buf, size, &back, why, sizeof(why));
        FUZZ_CHECK(err == 0, "libdlx cannot decode a reply of type %d from dlxd: %s",
                   (int)rep->type, why);
        FUZZ_CHECK(back.id == rep->id && back.type == rep->type && back.status == rep->status,
                   "reply %llu changed on the wire", (unsigned long long)rep->id);
        FUZZ_CHECK(rep->type != WIRE_REP_EVENT || rep->id == 0, "an event with id %llu",
                   (unsigned long long)rep->id);
        if (F.verbose)
                fprintf(stderr, "peer %d <- id %llu type %d status %d%s%s%s\n", (int)(p - F.peers),
                        (unsigned long long)back.id, (int)back.type, back.status,
                        back.error[0] ? " (" : "", back.error, back.error[0] ? ")" : "");
        wire_reply_done(&back);
        if (buf != small)
                free(buf);
        return 0;
}

/* The peer, connected now if it was not (and the server admits it). */
static struct peer *peer_get(unsigned i)
{
        struct peer *p = &F.peers[i];
        char why[128];

        if (p->s || F.connects >= MAX_CONNECTS)
                return p;
        F.connects++;
        if (registry_admit(&F.reg, p->uid, why, sizeof(why)) < 0) {
                FUZZ_CHECK(why[0], "a refusal without a reason");
                return p;
        }
        FUZZ_CHECK(frame_reader_init(&p->reader) == 0, "frame_reader_init failed");
        p->s = registry_session_new(&F.reg, p->uid, p->uid, (pid_t)(100 + i));
        FUZZ_CHECK(p->s != NULL, "registry_session_new failed");
        p->s->io.send = fake_send;
        p->s->io.ctx = p;
        p->stalled = p->dropped = false;
        return p;
}

static void peer_close(struct peer *p)
{
        if (!p->s)
                return;
        registry_session_free(p->s);
        p->s = NULL;
        frame_reader_done(&p->reader);
        p->npending = 0;
}

/* Closes every dropped peer; closing one may send to (and drop) a stalled other. */
static void reap(void)
{
        bool again = true;

        while (again) {
                again = false;
                for (unsigned i = 0; i < NPEERS; i++) {
                        if (F.peers[i].s && F.peers[i].dropped) {
                                peer_close(&F.peers[i]);
                                again = true;
                        }
                }
        }
}

/* ---- operations ------------------------------------------------------------------------------ */

static void op_data(struct peer *p, const uint8_t *data, size_t n)
{
        /* releases posted in the ring came before anything in this batch */
        if (p->s->ring && registry_ring_wake(p->s) < 0) {
                p->dropped = true;
                return;
        }
        while (n > 0 && !p->dropped) {
                uint8_t *space;
                size_t avail, take;
                struct frame f;
                int r;

                if (frame_reader_space(&p->reader, &space, &avail) < 0) {
                        p->dropped = true;
                        break;
                }
                take = n < avail ? n : avail;
                if (F.chunk && take > F.chunk)
                        take = F.chunk;
                memcpy(space, data, take);
                frame_reader_commit(&p->reader, take);
                data += take;
                n -= take;
                while (!p->dropped && (r = frame_reader_next(&p->reader, &f)) != 0) {
                        if (r < 0) {
                                session_fail(p->s, 0, r, "bad frame: %s", strerror(-r));
                                p->dropped = true;
                                break;
                        }
                        /* the id dlxd reads, even from a request it refuses */
                        struct wire_request req;
                        char why[DLX_ERROR_MAX + 1];
                        wire_request_decode(f.payload, f.len, &req, why, sizeof(why));
                        if (req.id)
                                expect_reply(p, req.id);
                        if (dispatch_frame(p->s, &f) == DISPATCH_CLOSE)
                                p->dropped = true;
                        FUZZ_CHECK(f.nfds == 0, "dispatch_frame() left %u fds in the frame",
                                   f.nfds);
                }
        }
}

static void op_request(struct peer *p, unsigned nfds, const uint8_t *payload, size_t n)
{
        uint8_t *frame = malloc(FRAME_HEADER_SIZE + n);

        FUZZ_CHECK(frame != NULL, "out of memory");
        frame_header_put(frame, (uint32_t)n, nfds);
        if (n)
                memcpy(frame + FRAME_HEADER_SIZE, payload, n);
        op_data(p, frame, FRAME_HEADER_SIZE + n);
        free(frame);
}

static void op_fds(struct peer *p, struct fuzz_input *in)
{
        unsigned n = fuzz_u8(in) % 20, k = 0;
        int fds[20];

        for (unsigned i = 0; i < n; i++) {
                int fd = fuzz_make_fd(fuzz_u8(in));
                if (fd >= 0)
                        fds[k++] = fd;
        }
        /* too many queued: the connection's read fails with -EMFILE and it closes */
        if (k && frame_reader_push_fds(&p->reader, fds, k) < 0)
                p->dropped = true;
}

static void op_post(struct peer *p, struct fuzz_input *in)
{
        struct release_ring *ring = p->s->ring;
        unsigned n = fuzz_u8(in);

        for (unsigned i = 0; i < n; i++) {
                uint64_t id = fuzz_u8(in);
                if (!ring)
                        continue;
                uint64_t h = __atomic_load_n(&ring->head, __ATOMIC_RELAXED);
                __atomic_store_n(&ring->lease[h % RING_SLOTS], id, __ATOMIC_RELAXED);
                __atomic_store_n(&ring->head, h + 1, __ATOMIC_RELEASE);
        }
}

static void op_head(struct peer *p, uint16_t v)
{
        struct release_ring *ring = p->s->ring;

        if (ring)
                __atomic_store_n(&ring->head, ring->tail + v, __ATOMIC_RELEASE);
}

/* Timers due within 2 ms fire; the loop never blocks longer (UV_RUN_ONCE could, for hours). */
static void op_tick(void)
{
        int timeout;

        uv_update_time(&F.loop);
        timeout = uv_backend_timeout(&F.loop);
        if (timeout > 0 && timeout <= 2)
                usleep((useconds_t)timeout * 1000);
        uv_run(&F.loop, UV_RUN_NOWAIT);
}

/* ---- invariants ------------------------------------------------------------------------------ */

static size_t list_length(const struct list *l)
{
        size_t n = 0;

        for (const struct list *pos = l->next; pos != l; pos = pos->next)
                n++;
        return n;
}

static bool is_live_session(const struct session *s)
{
        for (unsigned i = 0; i < NPEERS; i++)
                if (F.peers[i].s == s)
                        return true;
        return false;
}

/*
 * The watches in the registry's index, each bucket checked on the way: in the
 * tree of its prefix's length, never empty, its watches its own, of live
 * sessions and in rising id order (the order events go out in).
 */
static uint64_t index_watches(const struct watch_index *ix)
{
        uint64_t total = 0;

        for (size_t l = 0; l <= DLX_NAME_MAX; l++) {
                for (struct avl_node *n = avl_first(&ix->by_len[l]); n; n = avl_next(n)) {
                        const struct watch_bucket *b = avl_entry(n, struct watch_bucket, node);
                        uint64_t last = 0;

                        FUZZ_CHECK(b->plen == l && strlen(b->prefix) == l,
                                   "bucket '%s' in the tree of length %zu", b->prefix, l);
                        FUZZ_CHECK(!list_empty(&b->watches), "bucket '%s' is empty", b->prefix);
                        for (const struct list *pos = b->watches.next; pos != &b->watches;
                             pos = pos->next) {
                                const struct watch *w = list_entry(pos, struct watch, blink);
                                FUZZ_CHECK(w->bucket == b && is_live_session(w->s) && w->id > last,
                                           "watch %llu in bucket '%s' is not its own, live or "
                                           "in order",
                                           (unsigned long long)w->id, b->prefix);
                                last = w->id;
                                total++;
                        }
                }
        }
        return total;
}

static void check_counts(void)
{
        const struct wire_limit_set *lim = &F.reg.lim;
        uint64_t leases = 0, watches = 0, sessions = 0, bytes = 0, uid_bytes = 0, fds = 0,
                 uid_fds = 0;

        for (unsigned i = 0; i < NPEERS; i++) {
                const struct session *s = F.peers[i].s;
                if (!s)
                        continue;
                sessions++;
                leases += s->leases.count;
                watches += list_length(&s->watches);
                FUZZ_CHECK(!lim->max_leases || s->leases.count <= lim->max_leases,
                           "session holds %zu leases", s->leases.count);
                FUZZ_CHECK(s->nheld == s->held.count && s->nheld <= DLX_MAX_HELD_SEGMENTS,
                           "session counts %u held segments, holds %zu", s->nheld, s->held.count);
                FUZZ_CHECK(s->nwaiters == list_length(&s->waiters) &&
                                   s->nwaiters <= DLX_MAX_INFLIGHT,
                           "session counts %u waiters", s->nwaiters);
                FUZZ_CHECK(s->nwatches == list_length(&s->watches), "session counts %u watches",
                           s->nwatches);
                FUZZ_CHECK(!lim->max_watches || s->nwatches <= lim->max_watches,
                           "session has %u watches", s->nwatches);
                /* after bye a session holds its leases and nothing else */
                FUZZ_CHECK(!s->retired || (list_empty(&s->watches) && list_empty(&s->waiters) &&
                                           list_empty(&s->published) && s->known.count == 0 &&
                                           s->held.count == 0),
                           "session %llu holds more than leases after bye",
                           (unsigned long long)s->id);
        }
        FUZZ_CHECK(F.reg.nsessions == sessions, "registry counts %llu sessions, %llu are open",
                   (unsigned long long)F.reg.nsessions, (unsigned long long)sessions);
        FUZZ_CHECK(F.reg.nleases == leases, "registry counts %llu leases, sessions hold %llu",
                   (unsigned long long)F.reg.nleases, (unsigned long long)leases);
        FUZZ_CHECK(F.reg.watches.count == watches && watches == index_watches(&F.reg.watches),
                   "registry counts %llu watches, sessions have %llu",
                   (unsigned long long)F.reg.watches.count, (unsigned long long)watches);
        FUZZ_CHECK(!lim->max_names || F.reg.nnames <= lim->max_names, "%llu names",
                   (unsigned long long)F.reg.nnames);

        for (struct avl_node *n = avl_first(&F.store.segments); n; n = avl_next(n)) {
                const struct segment *seg = avl_entry(n, struct segment, node);
                FUZZ_CHECK(seg->refs > 0, "segment %llu without references",
                           (unsigned long long)seg->id);
                if (seg->fd >= 0) {
                        bytes += seg->size;
                        fds++;
                }
                for (const struct list *pos = seg->known.next; pos != &seg->known;
                     pos = pos->next) {
                        const struct known *k = list_entry(pos, struct known, link);
                        FUZZ_CHECK(k->seg == seg && is_live_session(k->session),
                                   "segment %llu known by a session that is gone",
                                   (unsigned long long)seg->id);
                }
                FUZZ_CHECK(!seg->holder || is_live_session(seg->holder),
                           "segment %llu held by a session that is gone",
                           (unsigned long long)seg->id);
        }
        FUZZ_CHECK(F.store.bytes == bytes, "store counts %llu bytes, its segments have %llu",
                   (unsigned long long)F.store.bytes, (unsigned long long)bytes);
        FUZZ_CHECK(!F.store.max_bytes || F.store.bytes <= F.store.max_bytes,
                   "%llu bytes held, the limit is %llu", (unsigned long long)F.store.bytes,
                   (unsigned long long)F.store.max_bytes);
        FUZZ_CHECK(F.store.fds == fds, "store counts %llu fds, its segments have %llu",
                   (unsigned long long)F.store.fds, (unsigned long long)fds);
        FUZZ_CHECK(!F.store.max_fds || F.store.fds <= F.store.max_fds,
                   "%llu fds held, the limit is %llu", (unsigned long long)F.store.fds,
                   (unsigned long long)F.store.max_fds);
        for (struct avl_node *n = avl_first(&F.store.uids); n; n = avl_next(n)) {
                const struct uid_use *u = avl_entry(n, struct uid_use, node);
                uid_bytes += u->bytes;
                uid_fds += u->fds;
                FUZZ_CHECK(!F.store.max_fds_per_uid || u->fds <= F.store.max_fds_per_uid,
                           "uid %u holds %llu fds", (unsigned)u->uid, (unsigned long long)u->fds);
                FUZZ_CHECK(!F.store.max_bytes_per_uid || u->bytes <= F.store.max_bytes_per_uid,
                           "uid %u holds %llu bytes", (unsigned)u->uid,
                           (unsigned long long)u->bytes);
        }
        FUZZ_CHECK(uid_bytes == bytes, "uids are charged %llu bytes, segments have %llu",
                   (unsigned long long)uid_bytes, (unsigned long long)bytes);
        FUZZ_CHECK(uid_fds == fds, "uids are charged %llu fds, segments have %llu",
                   (unsigned long long)uid_fds, (unsigned long long)fds);
}

/* ---- one input ------------------------------------------------------------------------------- */

static void setup(uint8_t config)
{
        static const size_t chunks[4] = {0, 1, 7, 61};
        struct wire_limit_set lim;

        registry_default_limits(&lim);
        switch ((config >> 3) & 3) {
        case 0:
                lim.max_bytes = 1 << 20;
                break;
        case 1:
                lim.max_clients = 2;
                lim.max_clients_per_uid = 1;
                lim.max_bytes = 1 << 20;
                lim.max_bytes_per_uid = 64 << 10;
                lim.max_names = 8;
                lim.max_names_per_uid = 4;
                lim.max_leases = 4;
                lim.max_watches = 4;
                break;
        case 2:
                lim.max_bytes = 1 << 30;
                lim.max_bytes_per_uid = 64 << 10;
                lim.max_fds = 12;
                lim.max_fds_per_uid = 8;
                break;
        default:
                memset(&lim, 0, sizeof(lim));
                break;
        }
        FUZZ_CHECK(uv_loop_init(&F.loop) == 0, "uv_loop_init failed");
        store_init(&F.store);
        /* no NVIDIA device here: /dev/null stands for it, so the accepting path is reached too */
        struct stat null;
        if (stat("/dev/null", &null) == 0)
                F.store.vmm_dev = null.st_rdev;
        registry_init(&F.reg, &F.loop, &F.store, &lim);
        for (unsigned i = 0; i < NPEERS; i++)
                F.peers[i] = (struct peer){.uid = 1000};
        F.peers[2].uid = config & 0x20 ? 0 : 1001;
        F.connects = 0;
        F.chunk = chunks[config >> 6];
}

static void teardown(uint8_t config)
{
        static const uint8_t orders[6][NPEERS] = {
                {0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0},
        };
        const uint8_t *order = orders[(config & 7) % 6];

        for (unsigned i = 0; i < NPEERS; i++)
                peer_close(&F.peers[order[i]]);
        for (unsigned i = 0; i < NPEERS; i++)
                free(F.peers[i].pending);
        registry_done(&F.reg);
        FUZZ_CHECK(F.store.segments.count == 0, "%zu segments outlive every session and name",
                   F.store.segments.count);
        FUZZ_CHECK(F.store.uids.count == 0, "%zu uid records outlive every session",
                   F.store.uids.count);
        FUZZ_CHECK(F.reg.names.count == 0, "%zu names outlive every session", F.reg.names.count);
        FUZZ_CHECK(F.reg.nnames == 0 && F.reg.nversions == 0 && F.reg.nleases == 0 &&
                           F.reg.watches.count == 0 && F.reg.nsessions == 0,
                   "counts left: %llu names, %llu versions, %llu leases, %llu watches, %llu "
                   "sessions",
                   (unsigned long long)F.reg.nnames, (unsigned long long)F.reg.nversions,
                   (unsigned long long)F.reg.nleases, (unsigned long long)F.reg.watches.count,
                   (unsigned long long)F.reg.nsessions);
        store_done(&F.store);
        FUZZ_CHECK(F.store.bytes == 0, "%llu bytes counted in an empty store",
                   (unsigned long long)F.store.bytes);
        /* closing waiter timers finish here; none may still be running */
        uv_run(&F.loop, UV_RUN_NOWAIT);
        FUZZ_CHECK(!uv_loop_alive(&F.loop), "a timer outlived its waiter");
        FUZZ_CHECK(uv_loop_close(&F.loop) == 0, "the loop does not close");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct fuzz_input in = {data, size};
        uint8_t config;
        int fds_before;

        if (!F.warm) {
                /* libuv keeps a process-wide signal pipe from its first loop on */
                FUZZ_CHECK(uv_loop_init(&F.loop) == 0, "uv_loop_init failed");
                FUZZ_CHECK(uv_loop_close(&F.loop) == 0, "uv_loop_close failed");
                F.warm = true;
                F.verbose = getenv("DLX_FUZZ_LOG") != NULL;
        }
        fds_before = fuzz_count_fds();
        config = fuzz_u8(&in);
        setup(config);

        while (in.left > 0) {
                uint8_t op = fuzz_u8(&in);
                unsigned kind = (op >> 2) % SESSION_OP_COUNT;
                struct peer *p = &F.peers[(op & 3) % NPEERS];
                const uint8_t *bytes;
                size_t n;

                if (kind != SESSION_OP_TICK && kind != SESSION_OP_CLOSE)
                        p = peer_get((op & 3) % NPEERS);
                switch (kind) {
                case SESSION_OP_DATA:
                        n = fuzz_bytes(&in, fuzz_u16(&in), &bytes);
                        if (p->s)
                                op_data(p, bytes, n);
                        break;
                case SESSION_OP_FDS:
                        if (p->s)
                                op_fds(p, &in);
                        else
                                fuzz_bytes(&in, fuzz_u8(&in) % 20, &bytes);
                        break;
                case SESSION_OP_POST:
                        if (p->s)
                                op_post(p, &in);
                        else
                                fuzz_bytes(&in, fuzz_u8(&in), &bytes);
                        break;
                case SESSION_OP_HEAD: {
                        uint16_t v = fuzz_u16(&in);
                        if (p->s)
                                op_head(p, v);
                        break;
                }
                case SESSION_OP_SWEEP:
                        if (p->s && p->s->ring && registry_ring_sleep(p->s) < 0)
                                p->dropped = true;
                        break;
                case SESSION_OP_TICK:
                        op_tick();
                        break;
                case SESSION_OP_CLOSE:
                        peer_close(p);
                        break;
                case SESSION_OP_REQUEST: {
                        unsigned nfds = fuzz_u8(&in) % 8;
                        n = fuzz_bytes(&in, fuzz_u16(&in), &bytes);
                        if (p->s)
                                op_request(p, nfds, bytes, n);
                        break;
                }
                default:
                        p->stalled = p->s != NULL;
                        break;
                }
                reap();
                check_counts();
        }

        teardown(config);
        FUZZ_CHECK(fuzz_count_fds() == fds_before, "%d fds open after the input, %d before",
                   fuzz_count_fds(), fds_before);
        return 0;
}
