/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory allocator behind dlx_alloc(): tensors carved out of
 * segments the daemon holds for this client (memfd, cuda-host or cuda-vmm),
 * mapped through the mapping cache (segment.c), packed 64-byte aligned, and
 * given back to the daemon when a segment is empty and not worth keeping.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"
#include "internal.h"

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

        if (storage_kind(kind)->host_mapped) {
                req.alloc.size = size;
                err = dlx__call(c, &req, -1, &p);
                if (err == 0 && (!p.map || !p.map->rw || p.rep.type != WIRE_REP_ALLOC))
                        err = dlx__fail(-EPROTO, "alloc reply without a usable segment");
                m = p.map;
                p.map = NULL;
                if (err == 0 && storage_kind(kind)->needs_cuda) {
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
                if (!dlx__map_insert(c, m)) {
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
        bool host = storage_kind(kind)->host_mapped;

        for (struct arena_seg *a = c->arena; a; a = a->next) {
                uintptr_t base = (uintptr_t)a->map->rw;
                uint64_t off;

                /* host tensors may come from either host arena; device ones from VMM only */
                if (storage_kind(a->kind)->host_mapped != host)
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

void dlx__arena_final(dlx_client *c)
{
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
}
