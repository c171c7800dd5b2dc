/* SPDX-License-Identifier: MIT */
/* The daemon's half of a session's release ring (proto/ring.h; registry.h). */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "namespace.h"
#include "ring.h"

static int ring_drain(struct session *s)
{
        struct release_ring *r = s->ring;
        uint64_t h = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE), t = r->tail;

        if (h - t > RING_SLOTS)
                return -EPROTO;
        for (; t != h; t++) {
                uint64_t id = __atomic_load_n(&r->lease[t % RING_SLOTS], __ATOMIC_RELAXED);
                /* a stale or foreign id releases nothing: the ring is the client's own */
                lease_drop_id(s, id);
        }
        __atomic_store_n(&r->tail, t, __ATOMIC_RELEASE);
        return 0;
}

int registry_ring_create(struct session *s)
{
        int fd = memfd_create("ring-of-dlx", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        void *p;

        if (fd < 0)
                return -errno;
        if (ftruncate(fd, sizeof(struct release_ring)) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
            (p = mmap(NULL, sizeof(struct release_ring), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      0)) == MAP_FAILED) {
                int err = -errno;
                close(fd);
                return err;
        }
        s->ring = p;
        s->ring->magic = RING_MAGIC;
        s->ring->slots = RING_SLOTS;
        return fd;
}

int registry_ring_spare_fd(int fd)
{
        int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);

        if (dup < 0)
                return -errno;
        close(dup);
        return 0;
}

void registry_ring_destroy(struct session *s)
{
        if (s->ring)
                munmap(s->ring, sizeof(*s->ring));
        s->ring = NULL;
}

int registry_ring_wake(struct session *s)
{
        __atomic_store_n(&s->ring->asleep, 0, __ATOMIC_SEQ_CST);
        return ring_drain(s);
}

int registry_ring_sleep(struct session *s)
{
        int err = ring_drain(s);

        if (err < 0)
                return err;
        __atomic_store_n(&s->ring->asleep, 1, __ATOMIC_SEQ_CST);
        /* a post that raced the store saw us awake and sent nothing: take it now */
        return ring_drain(s);
}
