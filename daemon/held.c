/* SPDX-License-Identifier: MIT */
/*
 * The segments a session holds (namespace.h): the fds its peer has been sent
 * (known: so that a repeated acquire sends none, and a destroyed segment is
 * announced) and its allocations (held: segments it publishes into by id,
 * by alloc or by a publish that asked to hold its fd). Alloc, free and
 * forget are its requests.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fd.h"
#include "invariant.h"
#include "namespace.h"

static int cmp_hold(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct hold, node)->seg->id);
}

static int cmp_known(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct known, node)->seg->id);
}

static struct known *known_find(struct session *s, uint64_t seg_id)
{
        struct avl_node *n = avl_find(&s->known, &seg_id, cmp_known);
        return n ? avl_entry(n, struct known, node) : NULL;
}

struct known *known_add(struct session *s, struct segment *seg)
{
        struct known *k = known_find(s, seg->id);

        if (k)
                return k;
        k = calloc(1, sizeof(*k));
        if (!k)
                return NULL;
        k->seg = seg;
        k->session = s;
        avl_insert(&s->known, &k->node, &seg->id, cmp_known);
        list_insert_tail(&seg->known, &k->link);
        return k;
}

static void known_drop(struct session *s, struct known *k)
{
        avl_remove(&s->known, &k->node);
        list_remove(&k->link);
        free(k);
}

void known_drop_unsent(struct session *s, struct known *k)
{
        if (k && !k->ro && !k->rw)
                known_drop(s, k);
}

void on_segment_gone(struct session *s, uint64_t seg_id)
{
        struct known *k = known_find(s, seg_id);

        if (k)
                known_drop(s, k);
        session_event(s, WIRE_EVENT_SEGMENT_GONE, 0, "", 0, 0, seg_id);
}

struct hold *hold_find(struct session *s, uint64_t seg_id)
{
        struct avl_node *n = avl_find(&s->held, &seg_id, cmp_hold);
        return n ? avl_entry(n, struct hold, node) : NULL;
}

int hold_segment(struct session *s, struct segment *seg)
{
        struct hold *h;

        if (s->nheld >= DLX_MAX_HELD_SEGMENTS)
                return -EAGAIN;
        h = calloc(1, sizeof(*h));
        if (!h)
                return -ENOMEM;
        h->seg = seg;
        seg->holder = s;
        segment_ref(seg);
        avl_insert(&s->held, &h->node, &seg->id, cmp_hold);
        s->nheld++;
        return 0;
}

void registry_alloc(struct session *s, const struct wire_request *req, int fd)
{
        struct registry *reg = s->reg;
        uint32_t storage = req->alloc.storage;
        const char *reason = NULL;
        struct segment *seg;
        struct wire_reply rep;
        struct known *k;
        int err;

        /* what the daemon makes is a memfd; what a producer made comes with its fd */
        const struct storage_kind *kind = storage_kind(storage);
        if (fd >= 0 ? !kind || kind->check != STORAGE_CHECK_DRIVER_FD
                    : storage != WIRE_STORAGE_UNSPECIFIED && storage != WIRE_STORAGE_MEMFD) {
                fd_drop(&fd);
                session_fail(s, req->id, -EINVAL,
                             "alloc: the daemon creates memfd segments; only a cuda-vmm "
                             "segment comes with its fd");
                return;
        }
        /* a memfd of ours goes back with the reply: the uid must have room for it in flight */
        if (fd < 0 && s->io.fd_share && !s->io.fd_share(s->io.ctx, 1)) {
                session_fail(s, req->id, -EAGAIN,
                             "alloc: the clients of uid %u hold %u descriptors unread, their "
                             "share of what the daemon may have in flight: read them, or close",
                             (unsigned)s->uid, s->use->unread);
                return;
        }
        if (fd >= 0)
                err = store_adopt(reg->store, fd, storage, req->alloc.size, s->uid, &seg, &reason);
        else
                err = store_alloc(reg->store, req->alloc.size, s->uid, &seg, &reason);
        if (err < 0) {
                session_fail(s, req->id, err, "alloc of %llu bytes: %s",
                             (unsigned long long)req->alloc.size, reason ? reason : strerror(-err));
                return;
        }
        k = known_add(s, seg);
        err = k ? hold_segment(s, seg) : -ENOMEM;
        if (err < 0)
                known_drop_unsent(s, k); /* it never learns of this segment */
        /* the hold took its own reference: the creation's goes either way */
        segment_unref(reg->store, seg);
        if (err < 0) {
                session_fail(s, req->id, err, "alloc: %s",
                             err == -EAGAIN ? "this session holds too many segments"
                                            : "out of memory");
                return;
        }
        reply_init(&rep, req->id, WIRE_REP_ALLOC);
        rep.alloc.segment = seg->id;
        rep.alloc.size = seg->size;
        /* a segment the client brought needs no fd back: it holds one already */
        if (session_send_segment(s, &rep, fd >= 0 ? NULL : seg) == 0)
                k->rw = true;
}

void registry_free(struct session *s, const struct wire_request *req)
{
        struct hold *h = hold_find(s, req->free.segment);
        struct wire_reply rep;
        struct segment *seg;

        if (!h) {
                session_fail(s, req->id, -ENOENT, "segment %llu is not allocated by this session",
                             (unsigned long long)req->free.segment);
                return;
        }
        seg = h->seg;
        avl_remove(&s->held, &h->node);
        if (!count_take(s->nheld, 1))
                session_break(s, "count of allocations");
        free(h);
        seg->holder = NULL;
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
        segment_unref(s->reg->store, seg);
}

void registry_forget(struct session *s, const struct wire_request *req)
{
        struct wire_reply rep;

        /* forgetting a segment already gone is fine: the event may have crossed the request */
        for (uint32_t i = 0; i < req->forget.count; i++) {
                struct known *k = known_find(s, req->forget.segments[i]);
                if (k)
                        known_drop(s, k);
        }
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
}

void held_drop_all(struct session *s)
{
        struct avl_node *n, *next;

        for (n = avl_first(&s->known); n; n = next) {
                next = avl_next(n);
                known_drop(s, avl_entry(n, struct known, node));
        }
        for (n = avl_first(&s->held); n; n = next) {
                struct hold *h = avl_entry(n, struct hold, node);
                next = avl_next(n);
                avl_remove(&s->held, n);
                h->seg->holder = NULL;
                segment_unref(s->reg->store, h->seg);
                free(h);
        }
        s->nheld = 0;
}
