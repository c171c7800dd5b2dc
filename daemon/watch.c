/* SPDX-License-Identifier: MIT */
#include "watch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "invariant.h"
#include "namespace.h"

/* A lookup key: the first len bytes of a name. Every bucket of one tree has this len. */
struct prefix_key {
        const char *p;
        size_t len;
};

static int cmp_bucket(const void *key, const struct avl_node *n)
{
        const struct prefix_key *k = key;

        return memcmp(k->p, avl_entry(n, struct watch_bucket, node)->prefix, k->len);
}

static struct watch_bucket *bucket_find(const struct watch_index *ix, const char *p, size_t len)
{
        struct prefix_key k = {p, len};
        struct avl_node *n = avl_find(&ix->by_len[len], &k, cmp_bucket);

        return n ? avl_entry(n, struct watch_bucket, node) : NULL;
}

void watch_index_init(struct watch_index *ix)
{
        for (size_t l = 0; l <= DLX_NAME_MAX; l++)
                avl_init(&ix->by_len[l]);
        ix->next_id = 1;
        ix->count = 0;
}

int watch_add(struct watch_index *ix, struct session *s, const char *prefix, uint64_t *ret_id)
{
        size_t plen = strlen(prefix);
        struct watch_bucket *b;
        struct watch *w;

        if (plen > DLX_NAME_MAX)
                return -EINVAL;
        w = calloc(1, sizeof(*w));
        if (!w)
                return -ENOMEM;
        b = bucket_find(ix, prefix, plen);
        if (!b) {
                struct prefix_key k = {prefix, plen};

                b = calloc(1, sizeof(*b) + plen + 1);
                if (!b) {
                        free(w);
                        return -ENOMEM;
                }
                memcpy(b->prefix, prefix, plen + 1);
                b->plen = plen;
                list_init(&b->watches);
                avl_insert(&ix->by_len[plen], &b->node, &k, cmp_bucket);
        }
        w->bucket = b;
        w->s = s;
        /* ids only grow, so a bucket's list, appended to, stays in id order */
        w->id = ix->next_id++;
        list_insert_tail(&b->watches, &w->blink);
        list_insert_tail(&s->watches, &w->slink);
        ix->count++;
        s->nwatches++;
        *ret_id = w->id;
        return 0;
}

static void watch_free(struct watch_index *ix, struct watch *w)
{
        struct watch_bucket *b = w->bucket;

        list_remove(&w->blink);
        list_remove(&w->slink);
        count_take(ix->count, 1);
        if (!count_take(w->s->nwatches, 1))
                session_break(w->s, "watch count");
        free(w);
        if (list_empty(&b->watches)) {
                avl_remove(&ix->by_len[b->plen], &b->node);
                free(b);
        }
}

int watch_remove(struct watch_index *ix, struct session *s, uint64_t id)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &s->watches)
        {
                struct watch *w = list_entry(pos, struct watch, slink);
                if (w->id == id) {
                        watch_free(ix, w);
                        return 0;
                }
        }
        return -ENOENT;
}

void watch_session_drop(struct watch_index *ix, struct session *s)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &s->watches)
                watch_free(ix, list_entry(pos, struct watch, slink));
}

/* ---- notify: the matching buckets, merged in id order ------------------------------------ */

struct cursor {
        const struct list *head; /* a matching bucket's watches */
        const struct watch *w;   /* the next one to notify */
};

/* Restores the min-heap on watch id below i, in h[0..n). */
static void heap_down(struct cursor *h, size_t n, size_t i)
{
        for (;;) {
                size_t l = 2 * i + 1, min = i;
                struct cursor t;

                if (l < n && h[l].w->id < h[min].w->id)
                        min = l;
                if (l + 1 < n && h[l + 1].w->id < h[min].w->id)
                        min = l + 1;
                if (min == i)
                        return;
                t = h[i];
                h[i] = h[min];
                h[min] = t;
                i = min;
        }
}

void watch_notify(const struct watch_index *ix, enum wire_event_kind kind, const char *name,
                  size_t len, uint64_t version)
{
        struct cursor heap[DLX_NAME_MAX + 1];
        struct wire_reply rep;
        size_t n = 0;

        if (ix->count == 0)
                return;
        /* at most one bucket per length can match: the name's first l bytes */
        for (size_t l = 0; l <= len && l <= DLX_NAME_MAX; l++) {
                struct watch_bucket *b;

                if (ix->by_len[l].count == 0)
                        continue;
                b = bucket_find(ix, name, l);
                if (b)
                        heap[n++] = (struct cursor){
                                &b->watches, list_entry(b->watches.next, struct watch, blink)};
        }
        if (n == 0)
                return;

        /* one event for all: only the watch id differs from one watcher to the next */
        rep.id = 0;
        rep.status = WIRE_OK;
        rep.error[0] = '\0';
        rep.type = WIRE_REP_EVENT;
        rep.event.kind = kind;
        memcpy(rep.event.name, name, len + 1);
        rep.event.version = version;
        rep.event.token = 0;
        rep.event.segment = 0;
        rep.event.events = NULL;
        rep.event.nevents = 0;

        /*
         * Lowest id first across the buckets. session_send() never ends a session
         * on the spot (a connection is doomed for later), so no watch goes away
         * while the cursors point into the buckets.
         */
        for (size_t i = n / 2; i-- > 0;)
                heap_down(heap, n, i);
        while (n > 0) {
                const struct watch *w = heap[0].w;

                rep.event.watch = w->id;
                session_send(w->s, &rep, -1);
                if (w->blink.next != heap[0].head)
                        heap[0].w = list_entry(w->blink.next, struct watch, blink);
                else
                        heap[0] = heap[--n];
                heap_down(heap, n, 0);
        }
}

/* ---- the watch requests ---- */

void registry_watch(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        struct wire_reply rep;
        uint64_t id;
        int err;

        if (reg->lim.max_watches && s->nwatches >= reg->lim.max_watches) {
                session_fail(s, req->id, -EAGAIN, "this client has %u watches already (the limit)",
                             reg->lim.max_watches);
                return;
        }
        err = watch_add(&reg->watches, s, req->watch.prefix, &id);
        if (err < 0) {
                session_fail(s, req->id, err, "%s",
                             err == -ENOMEM ? "out of memory" : "prefix longer than 255 bytes");
                return;
        }
        reply_init(&rep, req->id, WIRE_REP_WATCH);
        rep.watch.watch = id;
        session_send(s, &rep, -1);
}

void registry_unwatch(struct session *s, const struct wire_request *req)
{
        struct wire_reply rep;

        if (watch_remove(&s->reg->watches, s, req->unwatch.watch) < 0) {
                session_fail(s, req->id, -ENOENT, "no watch %llu",
                             (unsigned long long)req->unwatch.watch);
                return;
        }
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
}
