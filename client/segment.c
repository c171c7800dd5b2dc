/* SPDX-License-Identifier: MIT */
/*
 * Segment mappings and the shared-memory allocator.
 *
 * A segment is mapped once per process and reference-counted by the tensors
 * (and the allocator) using it. When the last user goes, the mapping stays
 * cached (idle) so that acquiring the same tensor again costs one round trip
 * and no mmap: the daemon remembers which segments this session holds and
 * attaches no fd for them.
 *
 * That memory must stay in step with the daemon's. The daemon attaches no fd
 * only while it believes we hold the segment, and it changes its belief only
 * on our Forget (or when the segment dies, which it announces with
 * SEGMENT_GONE). Replies arrive in order, so an idle mapping is unmapped only
 * once the reply to its Forget has been read: any fd-less reply that crossed
 * the Forget finds the mapping still there and revives it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpu.h"
#include "internal.h"

/*
 * Idle mappings kept for quick re-acquire. Past that, the oldest are forgotten
 * FORGET_BATCH at a time, in one request: a consumer cycling through new
 * segments pays one Forget round trip per batch, not one per segment.
 */
#define MAX_IDLE_MAPS 32
#define FORGET_BATCH 16
_Static_assert(FORGET_BATCH <= DLX_FORGET_MAX, "one Forget carries the batch");
/*
 * Allocator segments start small and double up to ARENA_SEGMENT_MAX, so a
 * process that shares one small tensor does not pin (or get charged for) a
 * large segment, while one that shares many amortises the round trips.
 * Larger tensors get a segment of their own, rounded to ARENA_ROUND.
 *
 * Under a byte limit every segment counts whole, free space included, so
 * growth stops at 1/ARENA_LIMIT_SHARE of the smaller limit: what partly
 * filled segments leave unused stays a small share of the limit. A tensor
 * larger than that gets a segment of exactly its 64-byte chunk, and, should
 * even that pass the limit, of exactly its bytes (see dlx__arena_alloc).
 */
#define ARENA_SEGMENT_MIN (UINT64_C(256) << 10)
#define ARENA_SEGMENT_MAX (UINT64_C(64) << 20)
#define ARENA_ROUND (UINT64_C(64) << 10)
#define ARENA_ALIGN 64
#define ARENA_LIMIT_SHARE 16

struct arena_range {
        struct arena_range *next;
        uint64_t off, len;
};

struct arena_seg {
        struct arena_seg *next;
        struct seg_map *map;
        uint32_t kind; /* memfd, cuda-host (a pinned memfd) or cuda-vmm */
        int device;
        uint64_t size;
        uint64_t used;
        struct arena_range *free; /* sorted by offset, coalesced */
};

/*
 * Every read-only mapping of every client in the process, by address. A
 * tensor handed back through a consumer that dropped its DLPack flags (tvm-ffi
 * keeps none) is still known to be read-only by where its bytes lie, and a
 * writable view of such memory would kill the process at its first write.
 * Mappings are added and removed under their client's lock; ro_lock nests
 * inside it and nothing is called while it is held.
 */
static pthread_mutex_t ro_lock = PTHREAD_MUTEX_INITIALIZER;
static struct avl_tree ro_maps;

static int cmp_ro(const void *key, const struct avl_node *n)
{
        uintptr_t a = *(const uintptr_t *)key;
        uintptr_t b = (uintptr_t)avl_entry(n, struct seg_map, ro_node)->ro;

        return a < b ? -1 : a > b;
}

void dlx__segment_fork(enum dlx_fork_step step)
{
        /* the mappings are the child's too: fork() copies them, the tree stays true */
        if (step == DLX_FORK_PREPARE)
                pthread_mutex_lock(&ro_lock);
        else
                pthread_mutex_unlock(&ro_lock);
}

static void ro_add(struct seg_map *m)
{
        uintptr_t key = (uintptr_t)m->ro;

        pthread_mutex_lock(&ro_lock);
        avl_insert(&ro_maps, &m->ro_node, &key, cmp_ro);
        pthread_mutex_unlock(&ro_lock);
}

static void ro_remove(struct seg_map *m)
{
        pthread_mutex_lock(&ro_lock);
        avl_remove(&ro_maps, &m->ro_node);
        pthread_mutex_unlock(&ro_lock);
}

bool dlx__mapped_read_only(const void *data, int64_t lo, int64_t hi)
{
        uintptr_t start = (uintptr_t)data + (uintptr_t)lo, end = (uintptr_t)data + (uintptr_t)hi;
        struct avl_node *n;
        bool ro = false;

        if (!data || hi <= lo)
                return false;
        pthread_mutex_lock(&ro_lock);
        /* mappings do not overlap: only the last one starting before end can hold a byte */
        n = avl_lower_bound(&ro_maps, &end, cmp_ro);
        n = n ? avl_prev(n) : avl_last(&ro_maps);
        if (n) {
                const struct seg_map *m = avl_entry(n, struct seg_map, ro_node);
                ro = (uintptr_t)m->ro + m->size > start;
        }
        pthread_mutex_unlock(&ro_lock);
        return ro;
}

static int cmp_map(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct seg_map, node)->id);
}

struct seg_map *dlx__map_find(dlx_client *c, uint64_t id)
{
        struct avl_node *n = avl_find(&c->maps, &id, cmp_map);
        return n ? avl_entry(n, struct seg_map, node) : NULL;
}

static void idle_remove(dlx_client *c, struct seg_map *m)
{
        if (m->idle_prev)
                m->idle_prev->idle_next = m->idle_next;
        else if (c->idle_head == m)
                c->idle_head = m->idle_next;
        else
                return; /* not in the list */
        if (m->idle_next)
                m->idle_next->idle_prev = m->idle_prev;
        else
                c->idle_tail = m->idle_prev;
        m->idle_prev = m->idle_next = NULL;
        c->nidle--;
}

static void map_destroy(dlx_client *c, struct seg_map *m)
{
        idle_remove(c, m);
        avl_remove(&c->maps, &m->node);
        if (m->ro)
                ro_remove(m);
        if (m->kind == WIRE_STORAGE_CUDA_VMM) {
                dlx__gpu_vmm_unmap(m);
        } else {
                dlx__gpu_unregister_host(m);
                if (m->ro)
                        munmap(m->ro, m->size);
                if (m->rw)
                        munmap(m->rw, m->size);
        }
        free(m);
}

static int map_mode(struct seg_map *m, int fd, bool writable)
{
        if (m->kind == WIRE_STORAGE_CUDA_VMM) {
                int err = dlx__gpu_vmm_map(m, fd, writable);
                if (err == 0 && !writable)
                        ro_add(m);
                return err;
        }

        void *p = mmap(NULL, m->size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd,
                       0);

        if (p == MAP_FAILED)
                return -errno;
        if (writable) {
                m->rw = p;
        } else {
                m->ro = p;
                ro_add(m);
        }
        return 0;
}

int dlx__map_get(dlx_client *c, uint64_t id, uint32_t kind, int device, uint64_t size, int fd,
                 bool writable, struct seg_map **ret)
{
        struct seg_map *m = dlx__map_find(c, id);
        bool have;
        int err = 0;

        if (!m) {
                if (fd < 0)
                        return -EPROTO; /* the daemon thinks we hold a segment we do not */
                if (size == 0 || size > DLX_MAX_SEGMENT) {
                        close(fd);
                        return -EPROTO;
                }
                m = calloc(1, sizeof(*m));
                if (!m) {
                        close(fd);
                        return -ENOMEM;
                }
                m->id = id;
                m->size = size;
                /* a cuda-host segment is a memfd like any other until a tensor pins it */
                m->kind = kind == WIRE_STORAGE_CUDA_VMM ? kind : WIRE_STORAGE_MEMFD;
                m->device = device;
                avl_insert(&c->maps, &m->node, &m->id, cmp_map);
        } else if ((m->kind == WIRE_STORAGE_CUDA_VMM) != (kind == WIRE_STORAGE_CUDA_VMM)) {
                if (fd >= 0)
                        close(fd);
                return -EPROTO; /* one segment cannot be both host and device memory */
        }
        have = writable ? m->rw != NULL : (m->ro || m->rw);
        if (fd >= 0) {
                /* the daemon sent it again: it counts us as holding the segment once more */
                m->forgotten = false;
                /* a read-only fd came: map it read-only even if a writable mapping exists */
                if (!have || (!writable && !m->ro))
                        err = map_mode(m, fd, writable);
                close(fd);
        } else if (!have) {
                err = -EPROTO;
        }
        if (err < 0) {
                if (m->refs == 0 && !m->ro && !m->rw)
                        map_destroy(c, m);
                return err;
        }
        if (m->refs++ == 0)
                idle_remove(c, m);
        *ret = m;
        return 0;
}

/* Forgets up to n of the least recently used idle mappings, in one request. */
static void forget_oldest(dlx_client *c, unsigned n)
{
        struct wire_request req = {.type = WIRE_REQ_FORGET};
        struct seg_map *batch[FORGET_BATCH];
        unsigned k = 0;

        while (k < n && k < FORGET_BATCH && c->idle_head) {
                struct seg_map *m = c->idle_head;
                idle_remove(c, m);
                batch[k] = m;
                req.forget.segments[k++] = m->id;
        }
        if (k == 0)
                return;
        req.forget.count = k;
        if (dlx__send(c, &req, -1) < 0) {
                /* the session is broken: nothing more comes without an fd */
                for (unsigned i = 0; i < k; i++)
                        map_destroy(c, batch[i]);
                return;
        }
        for (unsigned i = 0; i < k; i++)
                batch[i]->forget_id = req.id;
}

void dlx__map_unref(dlx_client *c, struct seg_map *m)
{
        if (--m->refs > 0)
                return;
        if (m->gone || m->forgotten || c->closed) {
                /* the daemon no longer counts us as holding it: keeping it would go stale */
                map_destroy(c, m);
                return;
        }
        if (m->forget_id)
                return; /* its Forget reply will unmap it */
        m->idle_prev = c->idle_tail;
        m->idle_next = NULL;
        if (c->idle_tail)
                c->idle_tail->idle_next = m;
        else
                c->idle_head = m;
        c->idle_tail = m;
        c->nidle++;
        if (c->nidle > MAX_IDLE_MAPS)
                forget_oldest(c, FORGET_BATCH);
}

void dlx__map_gone(dlx_client *c, uint64_t id)
{
        struct seg_map *m = dlx__map_find(c, id);

        if (!m)
                return;
        m->gone = true;
        if (m->refs == 0)
                map_destroy(c, m);
}

void dlx__map_forgotten(dlx_client *c, uint64_t forget_id)
{
        struct avl_node *n, *next;

        /* every mapping of the batch that Forget named */
        for (n = avl_first(&c->maps); n; n = next) {
                struct seg_map *m = avl_entry(n, struct seg_map, node);
                next = avl_next(n);
                if (m->forget_id != forget_id)
                        continue;
                m->forget_id = 0;
                if (m->refs == 0)
                        map_destroy(c, m);
                else
                        m->forgotten = true; /* revived by a reply that crossed the Forget */
        }
}

void dlx__maps_close(dlx_client *c)
{
        while (c->idle_head)
                map_destroy(c, c->idle_head);
}

void dlx__maps_final(dlx_client *c)
{
        struct avl_node *n, *next;

        while (c->arena) {
                struct arena_seg *a = c->arena;
                c->arena = a->next;
                while (a->free) {
                        struct arena_range *r = a->free;
                        a->free = r->next;
                        free(r);
                }
                free(a);
        }
        for (n = avl_first(&c->maps); n; n = next) {
                next = avl_next(n);
                map_destroy(c, avl_entry(n, struct seg_map, node));
        }
}

/* ---- the allocator ---------------------------------------------------------------------- */

static uint64_t round_up(uint64_t v, uint64_t to)
{
        return (v + to - 1) / to * to;
}

/*
 * A chunk of bytes takes round_up(bytes, ARENA_ALIGN), so that the next one
 * starts aligned, except at the end of a segment, which may be shorter: a
 * segment sized to exactly the bytes a limit leaves still holds its tensor.
 * Offsets stay multiples of ARENA_ALIGN, since only a segment's last chunk is
 * ever short.
 */
static uint64_t chunk_len(const struct arena_seg *a, uint64_t offset, uint64_t bytes)
{
        uint64_t n = round_up(bytes ? bytes : 1, ARENA_ALIGN);

        return n < a->size - offset ? n : a->size - offset;
}

/* First fit in one segment; returns the offset or UINT64_MAX. */
static uint64_t carve(struct arena_seg *a, uint64_t bytes)
{
        uint64_t need = bytes ? bytes : 1;

        for (struct arena_range **pp = &a->free; *pp; pp = &(*pp)->next) {
                struct arena_range *r = *pp;
                uint64_t off, n;

                if (r->len < need)
                        continue;
                n = chunk_len(a, r->off, bytes);
                if (r->len < n)
                        continue;
                off = r->off;
                r->off += n;
                r->len -= n;
                if (r->len == 0) {
                        *pp = r->next;
                        free(r);
                }
                a->used += n;
                return off;
        }
        return UINT64_MAX;
}

/* Gives an allocator segment back to the daemon, whose limits stop counting it. Lock held. */
static void arena_give_back(dlx_client *c, struct arena_seg *a)
{
        struct wire_request req = {.type = WIRE_REQ_FREE};
        struct seg_map *m = a->map;

        for (struct arena_seg **ap = &c->arena; *ap; ap = &(*ap)->next) {
                if (*ap == a) {
                        *ap = a->next;
                        break;
                }
        }
        req.free.segment = m->id;
        dlx__send(c, &req, -1);
        while (a->free) {
                struct arena_range *r = a->free;
                a->free = r->next;
                free(r);
        }
        m->arena = NULL;
        free(a);
        dlx__map_unref(c, m);
}

unsigned dlx__arena_give_back_empty(dlx_client *c)
{
        struct arena_seg *a, *next;
        unsigned n = 0;

        pthread_mutex_lock(&c->lock);
        for (a = c->arena; a; a = next) {
                next = a->next;
                if (a->used == 0) {
                        arena_give_back(c, a);
                        n++;
                }
        }
        pthread_mutex_unlock(&c->lock);
        return n;
}

/* The smaller of the daemon's byte limits, or 0 when neither is set. */
static uint64_t byte_limit(const dlx_client *c)
{
        uint64_t lim = c->limits.max_bytes;

        if (c->limits.max_bytes_per_uid && (!lim || c->limits.max_bytes_per_uid < lim))
                lim = c->limits.max_bytes_per_uid;
        return lim;
}

/*
 * The largest segment the allocator grows to: a share of the byte limit, if
 * any. Under a limit below ARENA_LIMIT_SHARE chunks it is 0: every tensor
 * gets a segment sized to it.
 */
static uint64_t arena_growth_cap(uint64_t lim)
{
        uint64_t cap;

        if (!lim)
                return ARENA_SEGMENT_MAX;
        cap = lim / ARENA_LIMIT_SHARE / ARENA_ALIGN * ARENA_ALIGN;
        return cap < ARENA_SEGMENT_MAX ? cap : ARENA_SEGMENT_MAX;
}

/*
 * A new segment for the allocator, with one reference: from the daemon (a
 * memfd, pinned with the driver for cuda-host), or a VMM allocation of ours
 * registered with the daemon by its exported fd.
 */
static int arena_segment(dlx_client *c, uint32_t kind, int device, uint64_t size,
                         struct seg_map **ret)
{
        struct wire_request req = {.type = WIRE_REQ_ALLOC};
        struct dlx_gpu_vmm v;
        struct seg_map *m;
        struct pending p;
        int err;

        if (kind != WIRE_STORAGE_CUDA_VMM) {
                req.alloc.size = size;
                err = dlx__call(c, &req, -1, &p);
                if (err == 0 && (!p.map || !p.map->rw || p.rep.type != WIRE_REP_ALLOC))
                        err = dlx__fail(-EPROTO, "alloc reply without a usable segment");
                m = p.map;
                p.map = NULL;
                if (err == 0 && kind == WIRE_STORAGE_CUDA_HOST) {
                        pthread_mutex_lock(&c->lock);
                        err = dlx__gpu_register_host(c, m);
                        pthread_mutex_unlock(&c->lock);
                        if (err < 0) {
                                struct wire_request fr = {.type = WIRE_REQ_FREE};
                                fr.free.segment = m->id;
                                pthread_mutex_lock(&c->lock);
                                dlx__send(c, &fr, -1);
                                dlx__map_unref(c, m);
                                pthread_mutex_unlock(&c->lock);
                        }
                }
                dlx__pending_done(c, &p);
                if (err == 0)
                        *ret = m;
                return err;
        }

        err = dlx__gpu_vmm_create(c, device, size, &v);
        if (err < 0)
                return err;
        req.alloc.size = v.size;
        req.alloc.storage = WIRE_STORAGE_CUDA_VMM;
        err = dlx__call(c, &req, v.fd, &p);
        close(v.fd);
        if (err == 0 && p.rep.type != WIRE_REP_ALLOC)
                err = dlx__fail(-EPROTO, "alloc reply without a segment");
        m = err == 0 ? calloc(1, sizeof(*m)) : NULL;
        if (err == 0 && !m)
                err = dlx__fail(-ENOMEM, "out of memory");
        if (err == 0) {
                m->id = p.rep.alloc.segment;
                m->size = v.size;
                m->kind = WIRE_STORAGE_CUDA_VMM;
                m->device = device;
                m->vmm_handle = v.handle;
                m->rw = (uint8_t *)(uintptr_t)v.ptr;
                m->refs = 1;
                pthread_mutex_lock(&c->lock);
                if (avl_insert(&c->maps, &m->node, &m->id, cmp_map)) {
                        free(m);
                        m = NULL;
                        err = dlx__fail(-EPROTO, "the daemon reused segment id %llu",
                                        (unsigned long long)p.rep.alloc.segment);
                }
                pthread_mutex_unlock(&c->lock);
        }
        dlx__pending_done(c, &p);
        if (err < 0) {
                dlx__gpu_vmm_destroy(&v);
                return err;
        }
        *ret = m;
        return 0;
}

int dlx__arena_alloc(dlx_client *c, uint32_t kind, int device, uint64_t bytes,
                     struct seg_map **ret_map, uint64_t *ret_offset)
{
        uint64_t n = round_up(bytes ? bytes : 1, ARENA_ALIGN), exact = bytes ? bytes : 1;
        uint64_t off, want, lim, size;
        unsigned given_back;
        struct arena_seg *a;
        struct arena_range *r;
        struct seg_map *m = NULL;
        int err;

        if (bytes > DLX_MAX_SEGMENT)
                return dlx__fail(-EINVAL, "allocation of %llu bytes is over the 1 TiB limit",
                                 (unsigned long long)bytes);
        pthread_mutex_lock(&c->lock);
        for (int pass = 0; pass < 2; pass++) {
                for (a = c->arena; a; a = a->next) {
                        if (a->kind != kind || a->device != device)
                                continue;
                        off = carve(a, bytes);
                        if (off != UINT64_MAX) {
                                a->map->refs++;
                                *ret_map = a->map;
                                *ret_offset = off;
                                pthread_mutex_unlock(&c->lock);
                                return 0;
                        }
                }
                /*
                 * Before asking for a new segment: versions of ours may be gone
                 * with their RELEASED notices still unread (a producer that only
                 * allocates and publishes reads no replies in between), and their
                 * memory is what a new tensor should reuse.
                 */
                if (pass > 0 || c->held.count == 0)
                        break;
                dlx__poll_notices(c);
        }
        lim = byte_limit(c);
        want = ARENA_SEGMENT_MIN << (c->arena_grown < 8 ? c->arena_grown : 8);
        if (want > arena_growth_cap(lim))
                want = arena_growth_cap(lim);
        c->arena_grown++;
        pthread_mutex_unlock(&c->lock);

        if (n <= want)
                size = want;
        else if (lim)
                size = n; /* under a limit, rounding would waste what it allows */
        else
                size = round_up(n, ARENA_ROUND);
        err = arena_segment(c, kind, device, size, &m);
        if (err == -ENOSPC) {
                /*
                 * The limit may still hold the tensor itself: without the empty
                 * segments kept for reuse (the daemon takes the Free before the
                 * Alloc that follows it), and without the growth or rounding.
                 * The daemon's answer to that is the one that counts.
                 */
                given_back = dlx__arena_give_back_empty(c);
                if (size > exact || given_back > 0)
                        err = arena_segment(c, kind, device, exact, &m);
        }
        if (err < 0)
                return err;
        a = calloc(1, sizeof(*a));
        r = a ? calloc(1, sizeof(*r)) : NULL;
        pthread_mutex_lock(&c->lock);
        /* the size came from the daemon: a smaller one would leave no offset to hand out */
        if (!r || m->size < exact) {
                struct wire_request fr = {.type = WIRE_REQ_FREE};
                uint64_t got = m->size;
                bool oom = !r;
                free(r);
                free(a);
                fr.free.segment = m->id;
                dlx__send(c, &fr, -1);
                dlx__map_unref(c, m);
                pthread_mutex_unlock(&c->lock);
                if (oom)
                        return dlx__fail(-ENOMEM, "out of memory");
                return dlx__fail(-EPROTO, "alloc: a segment of %llu bytes for %llu",
                                 (unsigned long long)got, (unsigned long long)exact);
        }
        a->map = m; /* the segment's reference becomes the allocator's */
        a->size = m->size;
        a->kind = kind;
        a->device = device;
        m->arena = a;
        r->off = 0;
        r->len = a->size;
        a->free = r;
        off = carve(a, bytes);
        m->refs++;
        a->next = c->arena;
        c->arena = a;
        *ret_map = m;
        *ret_offset = off;
        pthread_mutex_unlock(&c->lock);
        return 0;
}

struct seg_map *dlx__arena_find(dlx_client *c, uint32_t kind, const void *data, int64_t lo,
                                int64_t hi)
{
        uintptr_t p = (uintptr_t)data;
        bool device = kind == WIRE_STORAGE_CUDA_VMM;

        for (struct arena_seg *a = c->arena; a; a = a->next) {
                uintptr_t base = (uintptr_t)a->map->rw;
                uint64_t off;

                /* host tensors may come from either host arena; device ones from VMM only */
                if ((a->kind == WIRE_STORAGE_CUDA_VMM) != device)
                        continue;
                /* segments may sit back to back: one's end is the next one's start */
                if (p < base || p - base > a->size)
                        continue;
                off = p - base;
                if (hi > lo && (lo < 0 ? (0 - (uint64_t)lo) > off : false))
                        continue;
                if (hi > lo && hi > 0 && (uint64_t)hi > a->size - off)
                        continue;
                return a->map;
        }
        return NULL;
}

void dlx__arena_free(dlx_client *c, struct seg_map *m, uint64_t offset, uint64_t bytes)
{
        struct arena_seg *a = m->arena, *other = NULL;
        struct arena_range **pp, *prev = NULL, *r;
        uint64_t n;

        if (!a) {
                dlx__map_unref(c, m);
                return;
        }
        n = chunk_len(a, offset, bytes);
        for (pp = &a->free; *pp && (*pp)->off < offset; pp = &(*pp)->next)
                prev = *pp;
        if (prev && prev->off + prev->len == offset) {
                prev->len += n;
                r = prev;
        } else {
                r = malloc(sizeof(*r));
                if (!r) {
                        /* the range stays unusable; nothing else is lost */
                        dlx__map_unref(c, m);
                        return;
                }
                r->off = offset;
                r->len = n;
                r->next = *pp;
                *pp = r;
        }
        if (r->next && r->off + r->len == r->next->off) {
                struct arena_range *nx = r->next;
                r->len += nx->len;
                r->next = nx->next;
                free(nx);
        }
        a->used -= n;
        dlx__map_unref(c, m);

        if (a->used != 0 || c->closed)
                return;
        /*
         * Keep one empty segment per kind and device, the larger, for the next
         * allocation (a producer that allocates a tensor per version then cycles
         * through a few segments its consumers have mapped already); give back
         * the other.
         */
        for (struct arena_seg *o = c->arena; o && !other; o = o->next)
                if (o != a && o->used == 0 && o->kind == a->kind && o->device == a->device)
                        other = o;
        if (!other)
                return;
        /* give back the smaller */
        arena_give_back(c, other->size < a->size ? other : a);
}
