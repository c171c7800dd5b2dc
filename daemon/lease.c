/* SPDX-License-Identifier: MIT */
/*
 * Leases (namespace.h): an acquire is granted at once when its version is
 * there, or waits for it (a waiter, timed or not) until a publish wakes it;
 * a release, by frame or through the ring, drops the lease, and the last
 * lease of a version no longer current ends it. Consumers' CUDA release
 * events are kept on the version for its producer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "invariant.h"
#include "log.h"
#include "namespace.h"

static int cmp_lease(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct lease, node)->id);
}

void grant(struct session *s, uint64_t req_id, struct version *v, bool group)
{
        struct registry *reg = s->reg;
        struct segment *seg = v->seg;
        bool writable = !(v->flags & DLPACK_FLAG_BITMASK_READ_ONLY) && !seg->write_sealed &&
                        !seg->fd_readonly;
        struct wire_reply rep;
        struct lease *l;
        struct known *k, *kt = NULL;

        if (group != (v->members > 0)) {
                /* a client of 1.2 or older knows neither status: it gets EINVAL */
                int err = s->minor < 3 ? -EINVAL : v->members ? -EISDIR : -ENOTDIR;
                if (v->members)
                        session_fail(s, req_id, err,
                                     "'%s' is a group of %u members: acquire it as a group",
                                     v->entry->name, v->members);
                else
                        session_fail(s, req_id, err, "'%s' is a tensor, not a group",
                                     v->entry->name);
                return;
        }
        if (v->table && s->minor < 4) {
                session_fail(s, req_id, -ENOTSUP,
                             "'%s' is a group in device memory, which needs protocol 1.4; this "
                             "client speaks 1.%u",
                             v->entry->name, (unsigned)s->minor);
                return;
        }
        if (reg->lim.max_leases && s->leases.count >= reg->lim.max_leases) {
                session_fail(s, req_id, -EAGAIN, "this client holds %u leases already (the limit)",
                             reg->lim.max_leases);
                return;
        }
        l = calloc(1, sizeof(*l));
        /* an IPC handle travels in the descriptor itself: no fd to track */
        k = seg->fd >= 0 ? known_add(s, seg) : NULL;
        /* a device group's table is a sealed memfd of its own, always mapped read-only */
        if (v->table)
                kt = known_add(s, v->table);
        if (!l || (seg->fd >= 0 && !k) || (v->table && !kt)) {
                free(l);
                known_drop_unsent(s, k);
                known_drop_unsent(s, kt);
                session_fail(s, req_id, -ENOMEM, "out of memory");
                return;
        }
        /*
         * The fd goes again when the peer needs a mapping of another mode: a
         * read-only tensor is mapped read-only, never inside a writable view
         * (unless the segment is sealed, when no view of it writes anyway).
         */
        bool send_fd = k && (writable ? !k->rw : !(k->ro || (k->rw && seg->write_sealed)));
        bool send_table = kt && !kt->ro && !kt->rw;
        unsigned nfds = send_fd + send_table;

        if (nfds && s->io.fd_share && !s->io.fd_share(s->io.ctx, nfds)) {
                free(l);
                known_drop_unsent(s, k);
                known_drop_unsent(s, kt);
                session_fail(s, req_id, -EAGAIN,
                             "the clients of uid %u hold %u descriptors unread, their share of "
                             "what the daemon may have in flight: read them, or close",
                             (unsigned)s->uid, s->use->unread);
                return;
        }
        l->id = reg->next_lease++;
        l->v = v;
        avl_insert(&s->leases, &l->node, &l->id, cmp_lease);
        v->leases++;
        reg->nleases++;
        reg->acquires++;

        if (send_table) {
                /* first, in a frame of its own: a frame carries one fd */
                reply_init(&rep, req_id, WIRE_REP_SEGMENT);
                rep.segment.segment = v->table->id;
                rep.segment.size = v->table->size;
                if (session_send_segment(s, &rep, v->table) == 0)
                        kt->ro = true;
                known_drop_unsent(s, kt);
        }
        reply_init(&rep, req_id, WIRE_REP_ACQUIRE);
        version_describe(v, &rep.acquire.tensor);
        if (!writable)
                rep.acquire.tensor.flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
        rep.acquire.lease = l->id;
        rep.acquire.segment_size = seg->size;
        rep.acquire.writable = writable;
        if (session_send_segment(s, &rep, send_fd ? seg : NULL) == 0 && send_fd) {
                if (writable)
                        k->rw = true;
                else
                        k->ro = true;
        }
        known_drop_unsent(s, k);
}

/*
 * Keeps a consumer's release event for the producer: distinct handles, at
 * most DLX_MAX_RELEASE_EVENTS_PER_SESSION from any one session so that no
 * consumer can crowd the others out, and DLX_MAX_RELEASE_EVENTS in all.
 */
static void version_add_release_event(struct version *v, const struct session *s,
                                      const uint8_t event[DLX_CUDA_HANDLE])
{
        uint8_t(*grown)[DLX_CUDA_HANDLE];
        uint64_t *owners;
        unsigned mine = 0;

        for (uint32_t i = 0; i < v->nrel_events; i++) {
                if (memcmp(v->rel_events[i], event, DLX_CUDA_HANDLE) == 0)
                        return; /* a consumer's pooled event again: its later record covers both */
                mine += v->rel_owners[i] == s->id;
        }
        if (mine >= DLX_MAX_RELEASE_EVENTS_PER_SESSION ||
            v->nrel_events >= DLX_MAX_RELEASE_EVENTS) {
                if (!v->rel_overflow_logged)
                        log_warn("%s v%llu: session %llu: release events over the limit; the "
                                 "producer will not wait for some readers",
                                 v->entry->name, (unsigned long long)v->version,
                                 (unsigned long long)s->id);
                v->rel_overflow_logged = true;
                return;
        }
        grown = realloc(v->rel_events, (v->nrel_events + 1) * sizeof(*grown));
        if (!grown)
                return;
        v->rel_events = grown;
        owners = realloc(v->rel_owners, (v->nrel_events + 1) * sizeof(*owners));
        if (!owners)
                return;
        v->rel_owners = owners;
        v->rel_owners[v->nrel_events] = s->id;
        memcpy(v->rel_events[v->nrel_events++], event, DLX_CUDA_HANDLE);
}

void lease_drop(struct session *s, struct lease *l)
{
        struct registry *reg = s->reg;
        struct version *v = l->v;

        avl_remove(&s->leases, &l->node);
        free(l);
        bool counted = count_take(v->leases, 1);
        if (!count_take(reg->nleases, 1) || !counted)
                session_break(s, "lease count");
        /* a version whose count was already 0 is left alone: better leaked than freed twice */
        if (counted && v->leases == 0 && v->entry->current != v)
                version_destroy(reg, v);
}

static void waiter_free_cb(uv_handle_t *h)
{
        free(h->data);
}

void waiter_end(struct waiter *w)
{
        struct registry *reg = w->s->reg;
        struct entry *e = w->e;

        waiter_detach(w);
        entry_maybe_free(reg, e);
}

void waiter_detach(struct waiter *w)
{
        mount_waiter_gone(w);
        list_remove(&w->elink);
        list_remove(&w->slink);
        if (!count_take(w->s->nwaiters, 1))
                session_break(w->s, "count of waiting acquires");
        if (w->timed) {
                uv_timer_stop(&w->timer);
                uv_close((uv_handle_t *)&w->timer, waiter_free_cb);
        } else {
                free(w);
        }
}

static void on_waiter_timeout(uv_timer_t *t)
{
        struct waiter *w = t->data;
        struct session *s = w->s;
        uint64_t id = w->req_id;
        char name[DLX_NAME_MAX + 1];

        snprintf(name, sizeof(name), "%s", w->e->name);
        session_answering(s, id, WIRE_REQ_ACQUIRE, w->t0_ns);
        waiter_end(w);
        session_fail(s, id, -ETIMEDOUT, "timed out waiting for '%s'", name);
}

void wake_waiters(struct entry *e)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &e->waiters)
        {
                struct waiter *w = list_entry(pos, struct waiter, elink);
                struct session *s = w->s;
                uint64_t id = w->req_id;
                bool group = w->group;

                if (!e->current || e->current->version < w->min_version)
                        continue;
                /* keep the entry alive across waiter_end: it has a current version */
                session_answering(s, id, WIRE_REQ_ACQUIRE, w->t0_ns);
                waiter_end(w);
                grant(s, id, e->current, group);
        }
}

void registry_acquire(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        const char *name = req->acquire.name;
        struct entry *e = entry_find(reg, name);
        struct waiter *w;

        if (e && e->current && e->current->version >= req->acquire.min_version) {
                grant(s, req->id, e->current, req->acquire.group);
                return;
        }
        if (req->acquire.timeout_ms == 0) {
                if (e && e->current)
                        session_fail(s, req->id, -ENOENT, "'%s' is at version %llu, not yet %llu",
                                     name, (unsigned long long)e->current->version,
                                     (unsigned long long)req->acquire.min_version);
                else if (name[0] == '@')
                        session_fail(s, req->id, -ENOENT,
                                     "no %s named '%s' here: a peer's name is fetched for an "
                                     "acquire that waits (timeout_ms not 0)",
                                     req->acquire.group ? "group" : "tensor", name);
                else
                        session_fail(s, req->id, -ENOENT, "no %s named '%s'",
                                     req->acquire.group ? "group" : "tensor", name);
                return;
        }
        if (s->nwaiters >= DLX_MAX_INFLIGHT) {
                session_fail(s, req->id, -EAGAIN, "more than %d acquires waiting",
                             DLX_MAX_INFLIGHT);
                return;
        }
        e = entry_get(reg, name, s->uid);
        w = e ? calloc(1, sizeof(*w)) : NULL;
        if (!w) {
                if (e)
                        entry_maybe_free(reg, e);
                session_fail(s, req->id, -ENOMEM, "out of memory");
                return;
        }
        w->s = s;
        w->e = e;
        w->req_id = req->id;
        w->t0_ns = s->cur.t0_ns;
        w->min_version = req->acquire.min_version;
        w->group = req->acquire.group;
        if (req->acquire.timeout_ms > 0) {
                int err = uv_timer_init(reg->loop, &w->timer);
                if (err < 0) {
                        free(w);
                        entry_maybe_free(reg, e);
                        session_fail(s, req->id, err, "cannot time the wait: %s", strerror(-err));
                        return;
                }
                w->timer.data = w;
                w->timed = true;
                uv_timer_start(&w->timer, on_waiter_timeout, (uint64_t)req->acquire.timeout_ms, 0);
        }
        list_insert_tail(&e->waiters, &w->elink);
        list_insert_tail(&s->waiters, &w->slink);
        s->nwaiters++;
        mount_wanted(reg, w);
}

void registry_release(struct session *s, const struct wire_request *req)
{
        struct avl_node *n = avl_find(&s->leases, &req->release.lease, cmp_lease);

        /*
         * Success is silent: a release costs the client one send and no round
         * trip. Lease 0 is a wake-up after a post to the release ring, which
         * the connection drained on its way here: silent too, or a client that
         * only lets go of tensors would pile up answers it never reads.
         */
        if (req->release.lease == 0)
                return;
        if (!n) {
                session_fail(s, req->id, -ENOENT, "no lease %llu held by this session",
                             (unsigned long long)req->release.lease);
                return;
        }
        if (req->release.has_event)
                version_add_release_event(avl_entry(n, struct lease, node)->v, s,
                                          req->release.event);
        lease_drop(s, avl_entry(n, struct lease, node));
}

bool lease_drop_id(struct session *s, uint64_t id)
{
        struct avl_node *n = avl_find(&s->leases, &id, cmp_lease);

        if (n)
                lease_drop(s, avl_entry(n, struct lease, node));
        return n != NULL;
}
