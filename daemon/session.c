/* SPDX-License-Identifier: MIT */
/*
 * A session's life (session.h, registry.h): made when a peer connects,
 * retired by its bye (only its leases left), freed when the connection
 * ends, letting go of all it holds; and how its replies and events leave.
 */
#include "session.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "invariant.h"
#include "log.h"
#include "namespace.h"

static int send_with(struct session *s, const struct wire_reply *rep, int fd, struct segment *seg)
{
        int err;

        if (rep->id != 0)
                metrics_answered(s, rep);
        if (!s->io.send)
                return -ENOTCONN;
        err = s->io.send(s->io.ctx, rep, fd, seg);
        if (err == -EMSGSIZE && rep->id != 0) {
                /* the caller still gets an answer, not silence */
                struct wire_reply small = {.id = rep->id, .status = WIRE_TOO_BIG};
                snprintf(small.error, sizeof(small.error), "reply larger than %u bytes",
                         DLX_MAX_FRAME);
                err = s->io.send(s->io.ctx, &small, -1, NULL);
        }
        /* a dropped watch event is the connection's to report (a LOST event) */
        if (err < 0 && err != -ENOBUFS)
                log_session(warn, s, "cannot queue a reply: %s", strerror(-err));
        return err;
}

int session_send(struct session *s, const struct wire_reply *rep, int fd)
{
        return send_with(s, rep, fd, NULL);
}

int session_send_segment(struct session *s, const struct wire_reply *rep, struct segment *seg)
{
        return send_with(s, rep, -1, seg);
}

int session_fail(struct session *s, uint64_t id, int err, const char *fmt, ...)
{
        struct wire_reply rep;
        va_list ap;

        rep.id = id;
        rep.status = wire_errno_status(err);
        rep.type = WIRE_REP_NONE;
        va_start(ap, fmt);
        vsnprintf(rep.error, sizeof(rep.error), fmt, ap);
        va_end(ap);
        log_session(info, s, "request %llu failed: %s", (unsigned long long)id, rep.error);
        return session_send(s, &rep, -1);
}

void session_event_with(struct session *s, enum wire_event_kind kind, uint64_t watch,
                        const char *name, uint64_t version, uint64_t token, uint64_t segment,
                        uint8_t (*events)[DLX_CUDA_HANDLE], uint32_t nevents)
{
        struct wire_reply rep;

        reply_init(&rep, 0, WIRE_REP_EVENT);
        rep.event.kind = kind;
        rep.event.watch = watch;
        snprintf(rep.event.name, sizeof(rep.event.name), "%s", name);
        rep.event.version = version;
        rep.event.token = token;
        rep.event.segment = segment;
        rep.event.events = events;
        rep.event.nevents = nevents;
        session_send(s, &rep, -1);
}

void session_event(struct session *s, enum wire_event_kind kind, uint64_t watch, const char *name,
                   uint64_t version, uint64_t token, uint64_t segment)
{
        session_event_with(s, kind, watch, name, version, token, segment, NULL, 0);
}

struct session *registry_session_new(struct registry *reg, uid_t uid, gid_t gid, pid_t pid)
{
        struct session *s = calloc(1, sizeof(*s));
        struct uid_use *u = s ? quota_uid(reg->store, uid, true) : NULL;

        if (!u) {
                free(s);
                return NULL;
        }
        quota_count(u, QUOTA_CLIENTS, 1);
        s->use = u;
        s->id = reg->next_session++;
        s->uid = uid;
        s->gid = gid;
        s->pid = pid;
        s->reg = reg;
        avl_init(&s->leases);
        avl_init(&s->known);
        avl_init(&s->held);
        list_init(&s->published);
        list_init(&s->watches);
        list_init(&s->waiters);
        list_init(&s->mounts);
        list_insert_tail(&reg->sessions, &s->link);
        reg->nsessions++;
        return s;
}

/*
 * Everything a session holds but its leases: waits, watches, the versions it
 * published (its non-persistent current ones are unpublished; none will be
 * RELEASED to it), the segments whose fds it holds (no SEGMENT_GONE will
 * come) and its allocations. Afterwards nothing is sent to it unasked.
 */
static void session_let_go(struct session *s)
{
        struct registry *reg = s->reg;
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &s->waiters) waiter_end(list_entry(pos, struct waiter, slink));
        mount_session_end(s);
        watch_session_drop(&reg->watches, s);
        track_session_drop(s, false);
        list_for_each_safe(pos, tmp, &s->published)
        {
                struct version *v = list_entry(pos, struct version, plink);
                struct entry *e = v->entry;

                list_remove(&v->plink);
                v->producer = NULL;
                /* the producer's event went with its process: nothing left to wait on */
                v->has_event = false;
                if (e->current == v && !v->persist) {
                        notify_watchers(reg, WIRE_EVENT_UNPUBLISHED, e, v->version);
                        entry_retire_current(reg, e);
                }
        }
        held_drop_all(s);
}

void registry_session_free(struct session *s)
{
        struct registry *reg;
        struct avl_node *n, *next;

        if (!s)
                return;
        reg = s->reg;
        /* nothing may be sent to a peer that is gone */
        s->io.send = NULL;
        registry_group_job_orphan(s);

        for (n = avl_first(&s->leases); n; n = next) {
                next = avl_next(n);
                lease_drop(s, avl_entry(n, struct lease, node));
        }
        session_let_go(s);
        track_session_drop(s, true);
        registry_ring_destroy(s);
        list_remove(&s->link);
        count_take(reg->nsessions, 1);
        quota_count(s->use, QUOTA_CLIENTS, -1);
        quota_uid_put(reg->store, s->use);
        free(s);
}

void session_break(struct session *s, const char *what)
{
        if (s->broken)
                return;
        s->broken = true;
        log_session(err, s, "ended: %s broke an internal invariant (a bug in dlxd); dlxd goes on",
                    what);
        session_fail(s, 0, -EIO,
                     "dlxd ended this session: its %s broke an internal invariant (a bug in dlxd; "
                     "its log says where)",
                     what);
        if (s->io.end)
                s->io.end(s->io.ctx);
}

void registry_bye(struct session *s, const struct wire_request *req)
{
        struct wire_reply rep;

        session_let_go(s);
        s->retired = true;
        log_session(info, s, "bye: %zu leases kept until released", s->leases.count);
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
}
