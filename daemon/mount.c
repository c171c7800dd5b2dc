/* SPDX-License-Identifier: MIT */
/*
 * Mounts (1.5): the names under "@<alias>/" are mirrors of a federation
 * peer's, published by the one session that mounted that prefix: the
 * federation bridge of this host (dlxfed), running as --federation-uid.
 *
 *  - Nobody else publishes under '@': a mirror's bytes come from its origin.
 *  - An acquire that waits for a name under a mounted prefix, and finds no
 *    version it may take, sends the mount session a WANTED event: once per
 *    name and wanted version while acquires wait for it (a lower version
 *    is asked for too, as the peer may have it where it has not the
 *    higher), so that the bridge fetches it. A waiter that came before
 * the mount is announced when the mount comes (a bridge restarting).
 *  - The bridge's FetchFailed fails the waiters it could not serve, with its
 *    status and message.
 *  - A mirror keeps its origin's version number (Publish.origin_version),
 *    so that min_version means the same on every host.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "namespace.h"

struct mount {
        struct avl_node node; /* in registry.mounts, by prefix */
        struct list slink;    /* in session.mounts */
        struct session *s;
        size_t len;
        char prefix[]; /* "@<alias>/" */
};

/* A prefix as a key: its bytes and length (names are not terminated at the prefix's end). */
struct prefix_key {
        const char *p;
        size_t len;
};

static int cmp_prefix(const void *key, const struct avl_node *n)
{
        const struct prefix_key *k = key;
        const struct mount *m = avl_entry(n, struct mount, node);
        size_t len = k->len < m->len ? k->len : m->len;
        int c = memcmp(k->p, m->prefix, len);

        if (c)
                return c;
        return k->len < m->len ? -1 : k->len > m->len;
}

/* The length of name's mount prefix ("@alias/"), or 0 when name is not under one. */
static size_t mount_prefix_len(const char *name)
{
        const char *slash;

        if (name[0] != '@')
                return 0;
        slash = strchr(name, '/');
        return slash ? (size_t)(slash - name) + 1 : 0;
}

static struct mount *mount_of(struct registry *reg, const char *name)
{
        struct prefix_key k = {name, mount_prefix_len(name)};
        struct avl_node *n;

        if (k.len == 0)
                return NULL;
        n = avl_find(&reg->mounts, &k, cmp_prefix);
        return n ? avl_entry(n, struct mount, node) : NULL;
}

int mount_check_publish(struct session *s, const struct wire_request *req, const struct entry *e,
                        char *why, size_t whysz)
{
        const char *name = req->publish.tensor.name;
        struct mount *m = mount_of(s->reg, name);

        if (name[0] == '@' && (!m || m->s != s)) {
                snprintf(why, whysz,
                         "names under '@' are mirrors of federation peers: only the bridge "
                         "that mounted the prefix publishes there");
                return -EACCES;
        }
        if (name[0] != '@' && (req->publish.origin_version || req->publish.origin[0])) {
                snprintf(why, whysz, "an origin is only for a mirror, under a mounted '@' prefix");
                return -EINVAL;
        }
        return mount_check_version(e, req->publish.origin_version, why, whysz);
}

bool mount_may_unpublish(struct session *s, const char *name)
{
        struct mount *m = mount_of(s->reg, name);

        return !m || m->s == s;
}

int mount_check_version(const struct entry *e, uint64_t origin_version, char *why, size_t whysz)
{
        if (e && !origin_version && e->last_version == UINT64_MAX) {
                snprintf(why, whysz, "its versions are spent: the last was %llu",
                         (unsigned long long)UINT64_MAX);
                return -EOVERFLOW;
        }
        /*
         * Equal is fine where nothing is current: the same origin version
         * mirrored again (its earlier mirror went with a lost peer, and a
         * lease keeps the name's number).
         */
        if (e && origin_version &&
            (origin_version < e->last_version ||
             (origin_version == e->last_version && e->current))) {
                snprintf(why, whysz,
                         "origin version %llu is not above the mirror's last version %llu",
                         (unsigned long long)origin_version, (unsigned long long)e->last_version);
                return -EEXIST;
        }
        return 0;
}

/*
 * What WANTED events asked of the bridge for e, while acquires wait: one
 * event per name and version. Each version asked for counts the waiters it
 * stands for (those announced, and those that came after with the same
 * version); it is forgotten with the last of them: served by a publish,
 * failed by a FetchFailed, timed out or gone with its client. So what dlxd
 * keeps is bounded by the acquires that wait, and an acquire that comes
 * later is announced again.
 */

/* The index of min_version in e->wanted, or where it would go (*found false). */
static unsigned want_index(const struct entry *e, uint64_t min_version, bool *found)
{
        unsigned lo = 0, hi = e->nwanted;

        while (lo < hi) {
                unsigned mid = lo + (hi - lo) / 2;
                if (e->wanted[mid].min_version < min_version)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        *found = lo < e->nwanted && e->wanted[lo].min_version == min_version;
        return lo;
}

/* w is counted under its version, which its bridge was told of. */
static void count(struct entry *e, struct waiter *w)
{
        bool found;
        unsigned i = want_index(e, w->min_version, &found);

        if (!found) {
                if (e->nwanted == e->wanted_cap) {
                        unsigned cap = e->wanted_cap ? 2 * e->wanted_cap : 4;
                        struct mount_want *n = realloc(e->wanted, cap * sizeof(*n));
                        if (!n)
                                return; /* not counted: announced again when asked */
                        e->wanted = n;
                        e->wanted_cap = cap;
                }
                memmove(&e->wanted[i + 1], &e->wanted[i], (e->nwanted - i) * sizeof(*e->wanted));
                e->wanted[i] = (struct mount_want){w->min_version, 0};
                e->nwanted++;
        }
        e->wanted[i].waiters++;
        w->announced = true;
}

void mount_waiter_gone(struct waiter *w)
{
        struct entry *e = w->e;
        bool found;
        unsigned i;

        if (!w->announced)
                return;
        w->announced = false;
        i = want_index(e, w->min_version, &found);
        if (!found || --e->wanted[i].waiters > 0)
                return;
        memmove(&e->wanted[i], &e->wanted[i + 1], (e->nwanted - i - 1) * sizeof(*e->wanted));
        e->nwanted--;
}

void mount_entry_free(struct entry *e)
{
        free(e->wanted);
        e->wanted = NULL;
        e->nwanted = e->wanted_cap = 0;
}

/*
 * Tells m's session that w waits for its entry at its min_version or later,
 * unless it was told already. The event goes as a watch event goes: past
 * the session's share of queued output it is dropped, and the bridge hears
 * DLX_EVENT_LOST instead, then mounts again to hear of what was dropped.
 * Only what went is counted, so that what was dropped is announced then.
 */
static void announce(struct mount *m, struct waiter *w)
{
        struct entry *e = w->e;
        struct wire_reply rep;
        bool found;

        want_index(e, w->min_version, &found);
        if (found) {
                count(e, w);
                return;
        }
        reply_init(&rep, 0, WIRE_REP_EVENT);
        rep.event.kind = WIRE_EVENT_WANTED;
        rep.event.watch = 0;
        memcpy(rep.event.name, e->name, e->len + 1);
        rep.event.version = w->min_version;
        rep.event.token = 0;
        rep.event.segment = 0;
        rep.event.events = NULL;
        rep.event.nevents = 0;
        if (session_send(m->s, &rep, -1) == 0)
                count(e, w);
}

void mount_wanted(struct registry *reg, struct waiter *w)
{
        struct mount *m;

        if (w->e->name[0] != '@')
                return;
        m = mount_of(reg, w->e->name);
        if (m)
                announce(m, w);
}

void registry_mount(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        const char *prefix = req->mount.prefix;
        struct prefix_key k = {prefix, strlen(prefix)};
        struct avl_node *n = avl_find(&reg->mounts, &k, cmp_prefix);
        struct wire_reply rep;
        struct mount *m;

        if (s->minor < 5) {
                session_fail(s, req->id, -ENOTSUP,
                             "mount '%s': a bridge speaks protocol 1.5; this client speaks 1.%u",
                             prefix, (unsigned)s->minor);
                return;
        }
        if (!reg->federation || s->uid != reg->federation_uid) {
                session_fail(s, req->id, -EACCES,
                             reg->federation ? "mount '%s': only uid %u mounts federation prefixes"
                                             : "mount '%s': dlxd was started without "
                                               "--federation-uid",
                             prefix, (unsigned)reg->federation_uid);
                return;
        }
        bool again = n != NULL;

        if (n) {
                m = avl_entry(n, struct mount, node);
                if (m->s != s) {
                        session_fail(s, req->id, -EBUSY,
                                     "mount '%s': mounted by another session (pid %d)", prefix,
                                     (int)m->s->pid);
                        return;
                }
        } else if (s->nmounts >= DLX_MAX_MOUNTS) {
                session_fail(s, req->id, -EAGAIN, "mount '%s': this client has %d mounts already",
                             prefix, DLX_MAX_MOUNTS);
                return;
        } else {
                m = malloc(sizeof(*m) + k.len + 1);
                if (!m) {
                        session_fail(s, req->id, -ENOMEM, "out of memory");
                        return;
                }
                m->s = s;
                m->len = k.len;
                memcpy(m->prefix, prefix, k.len + 1);
                avl_insert(&reg->mounts, &m->node, &k, cmp_prefix);
                list_insert_tail(&s->mounts, &m->slink);
                s->nmounts++;
                log_session(notice, s, "mounted %s", prefix);
        }

        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
        /*
         * The acquires waiting under the prefix: a new mount hears of all of
         * them (a bridge that starts knows of none); a mount again, of those
         * whose WANTED was dropped.
         */
        for (n = avl_lower_bound(&reg->names, prefix, entry_cmp_name); n; n = avl_next(n)) {
                struct entry *e = avl_entry(n, struct entry, node);
                struct list *pos;

                if (strncmp(e->name, prefix, k.len) != 0)
                        break;
                if (!again) {
                        for (pos = e->waiters.next; pos != &e->waiters; pos = pos->next)
                                list_entry(pos, struct waiter, elink)->announced = false;
                        e->nwanted = 0;
                }
                for (pos = e->waiters.next; pos != &e->waiters; pos = pos->next) {
                        struct waiter *w = list_entry(pos, struct waiter, elink);
                        if (!w->announced)
                                announce(m, w);
                }
        }
}

void mount_session_end(struct session *s)
{
        while (!list_empty(&s->mounts)) {
                struct mount *m = list_entry(s->mounts.next, struct mount, slink);

                log_session(notice, s, "unmounted %s", m->prefix);
                list_remove(&m->slink);
                avl_remove(&s->reg->mounts, &m->node);
                free(m);
        }
        s->nmounts = 0;
}

void registry_fetch_failed(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        const char *name = req->fetch_failed.name;
        struct mount *m = mount_of(reg, name);
        struct entry *e;
        struct list *pos, *tmp;
        struct wire_reply rep;
        int err = wire_status_errno(req->fetch_failed.status);
        unsigned failed = 0;
        int e_ws;

        if (!m || m->s != s) {
                session_fail(s, req->id, -EACCES,
                             "fetch-failed '%s': this client has not mounted its prefix", name);
                return;
        }
        /* answered first: failing the last waiter may free the entry, never this session */
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
        e = entry_find(reg, name);
        if (!e)
                return;
        /* the entry is freed once, at the end, if nothing holds it then */
        list_for_each_safe(pos, tmp, &e->waiters)
        {
                struct waiter *w = list_entry(pos, struct waiter, elink);
                struct session *ws = w->s;
                uint64_t id = w->req_id;

                if (w->min_version > req->fetch_failed.min_version)
                        continue;
                failed++;
                session_answering(ws, id, WIRE_REQ_ACQUIRE, w->t0_ns);
                waiter_detach(w);
                /* a status a client of 1.4 knows */
                e_ws = err == -EHOSTUNREACH && ws->minor < 5 ? -EIO : err;
                if (req->fetch_failed.error[0])
                        session_fail(ws, id, e_ws, "%s", req->fetch_failed.error);
                else
                        session_fail(ws, id, e_ws, "fetching '%s' failed: %s", name,
                                     strerror(-err));
        }
        entry_maybe_free(reg, e);
        log_session(info, s, "fetch of %s failed (%s): %u waiting acquires failed", name,
                    strerror(-err), failed);
}
