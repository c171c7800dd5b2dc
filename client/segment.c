/* SPDX-License-Identifier: MIT */
/*
 * Segment mappings (the allocator that carves tensors out of them is
 * arena.c).
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
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fd.h"
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

bool dlx__map_insert(dlx_client *c, struct seg_map *m)
{
        return avl_insert(&c->maps, &m->node, &m->id, cmp_map) == NULL;
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
        if (!storage_kind(m->kind)->host_mapped) {
                dlx__gpu_vmm_unmap(c, m);
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
        if (!storage_kind(m->kind)->host_mapped) {
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
                m->kind = storage_kind(kind)->host_mapped ? WIRE_STORAGE_MEMFD : kind;
                m->device = device;
                avl_insert(&c->maps, &m->node, &m->id, cmp_map);
        } else if (storage_kind(m->kind)->host_mapped != storage_kind(kind)->host_mapped) {
                fd_drop(&fd);
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

        for (n = avl_first(&c->maps); n; n = next) {
                next = avl_next(n);
                map_destroy(c, avl_entry(n, struct seg_map, node));
        }
}

int dlx__seal_fresh(int fd, int seals)
{
        for (int i = 0;; i++) {
                if (fcntl(fd, F_ADD_SEALS, seals) == 0)
                        return 0;
                if ((errno != EBUSY && errno != EINTR) || i == 6)
                        return -errno;
                /* each refusal waited up to 150 ms in the kernel already */
                usleep(1000u << i);
        }
}
