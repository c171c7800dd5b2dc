/* SPDX-License-Identifier: MIT */
/*
 * Following a peer's prefix (--follow): the eager side of federation.
 *
 * The importer sends Follow{prefix}; the exporter watches that prefix on its
 * dlxd and answers with a listing of what is there (BEGIN, PUBLISHED each,
 * SYNCED), then a Change for each event of the watch under its exports.
 * The importer pulls each new version at once (through importer.c, so that
 * a consumer's want of the same version shares the pull), unpublishes a
 * mirror whose origin was unpublished, and, after a listing, every mirror
 * the listing no longer names (events that were lost on the way).
 *
 * A lost endpoint takes the peer's mirrors with it (importer.c); a follow
 * asks again after a second, then after twice as long each time, up to
 * 30 s, and the listing that answers brings the mirrors back.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fed.h"
#include "fed.pb-c.h"
#include "layout.h"

#define RETRY_MIN_MS 1000
#define RETRY_MAX_MS 30000

/* ---- the exporter: peers following prefixes of ours ---- */

struct rfollow {
        struct list link; /* in fed.rfollows */
        struct conn *c;   /* freed with its endpoint (fed_export_follows_gone()) */
        uint64_t id, watch;
        uint64_t listings; /* how many began */
        uint64_t listed;   /* names the one under way named */
        char prefix[DLX_NAME_MAX + 1];
};

/* A Change; offer: a packed Describe of the version (offer_len bytes), or NULL. */
static void change_offer(struct conn *c, uint64_t follow, unsigned kind, const char *name,
                         uint64_t version, int err, const char *error, uint64_t listing,
                         const uint8_t *offer, size_t offer_len)
{
        Dlxf__Change m = DLXF__CHANGE__INIT;
        uint8_t small[DLX_NAME_MAX + 400], *buf = small;
        size_t len;

        m.follow = follow;
        m.listing = listing;
        m.kind = kind;
        m.name.data = (uint8_t *)name;
        m.name.len = strlen(name);
        m.version = version;
        m.errnum = err < 0 ? -err : err;
        m.error = (char *)(error ? error : "");
        m.describe.data = (uint8_t *)offer;
        m.describe.len = offer ? offer_len : 0;
        len = dlxf__change__get_packed_size(&m);
        if (len > sizeof(small) && !(buf = malloc(len))) {
                /* the client asks instead */
                m.describe.len = 0;
                buf = small;
        }
        fed_send(c, FED_AM_CHANGE, buf, dlxf__change__pack(&m, buf));
        if (buf != small)
                free(buf);
}

static void change_send(struct conn *c, uint64_t follow, unsigned kind, const char *name,
                        uint64_t version, int err, const char *error, uint64_t listing)
{
        change_offer(c, follow, kind, name, version, err, error, listing, NULL, 0);
}

static int list_one(void *ctx, const struct dlx_info *in)
{
        struct rfollow *r = ctx;

        /* what a Lookup would refuse is not offered: writable versions, groups before 1.2 */
        if (fed_exported(r->c->fed, in->name) && (in->members == 0 || fed_minor(r->c) >= 2) &&
            (in->flags & DLPACK_FLAG_BITMASK_READ_ONLY)) {
                change_send(r->c, r->id, DLX_EVENT_PUBLISHED, in->name, in->version, 0, NULL,
                            r->listings);
                r->listed++;
        }
        return 0;
}

static void listing(struct rfollow *r)
{
        struct fed *f = r->c->fed;
        int err;

        r->listings++;
        r->listed = 0;
        change_send(r->c, r->id, FED_CHANGE_BEGIN, "", 0, 0, NULL, r->listings);
        err = dlx_list(f->dlx, r->prefix, list_one, r);
        if (err < 0) {
                /* no SYNCED: the client keeps what it has, and hears of changes */
                fed_log(FED_WARN, "%s: cannot list '%s': %s", r->c->who, r->prefix,
                        dlx_last_error());
                return;
        }
        change_send(r->c, r->id, FED_CHANGE_SYNCED, "", r->listed, 0, NULL, r->listings);
        fed_log(FED_DEBUG, "%s: '%s' listed", r->c->who, r->prefix);
}

/* Whether anything under prefix may be exported: it is under an export, or holds one. */
static bool overlaps_exports(const struct fed *f, const char *prefix)
{
        size_t len = strlen(prefix);

        for (unsigned i = 0; i < f->cfg.nexports; i++) {
                size_t elen = strlen(f->cfg.exports[i]);
                if (strncmp(prefix, f->cfg.exports[i], len < elen ? len : elen) == 0)
                        return true;
        }
        return false;
}

void fed_export_follow(struct conn *c, const void *buf, size_t len)
{
        struct fed *f = c->fed;
        Dlxf__Follow *m = dlxf__follow__unpack(NULL, len, buf);
        const char *why = NULL;
        char prefix[DLX_NAME_MAX + 1];
        unsigned n = 0;
        struct rfollow *r;
        int err;

        if (!m) {
                fed_close(c, "an undecodable follow");
                return;
        }
        if (m->prefix.len > DLX_NAME_MAX ||
            (m->prefix.len &&
             (memchr(m->prefix.data, 0, m->prefix.len) ||
              layout_prefix_check((const char *)m->prefix.data, m->prefix.len, &why) < 0))) {
                change_send(c, m->id, FED_CHANGE_REFUSED, "", 0, -EINVAL, "not a prefix of names",
                            0);
                dlxf__follow__free_unpacked(m, NULL);
                return;
        }
        if (m->prefix.len)
                memcpy(prefix, m->prefix.data, m->prefix.len);
        prefix[m->prefix.len] = '\0';
        for (struct list *pos = f->rfollows.next; pos != &f->rfollows; pos = pos->next)
                n += list_entry(pos, struct rfollow, link)->c == c;
        if (prefix[0] == '@' || !overlaps_exports(f, prefix)) {
                change_send(c, m->id, FED_CHANGE_REFUSED, "", 0, -EACCES,
                            "nothing under that prefix is exported", 0);
        } else if (n >= FED_MAX_FOLLOWS) {
                change_send(c, m->id, FED_CHANGE_REFUSED, "", 0, -EAGAIN,
                            "that peer follows as many prefixes as it may", 0);
        } else if (!(r = calloc(1, sizeof(*r)))) {
                change_send(c, m->id, FED_CHANGE_REFUSED, "", 0, -ENOMEM, "out of memory", 0);
        } else if ((err = dlx_watch(f->dlx, prefix, &r->watch)) < 0) {
                change_send(c, m->id, FED_CHANGE_REFUSED, "", 0, err, dlx_last_error(), 0);
                free(r);
        } else {
                r->c = c;
                r->id = m->id;
                memcpy(r->prefix, prefix, sizeof(prefix));
                list_insert_tail(&f->rfollows, &r->link);
                fed_log(FED_INFO, "%s follows '%s'", c->who, prefix);
                listing(r);
        }
        dlxf__follow__free_unpacked(m, NULL);
}

/*
 * A send that fails at once closes its endpoint, which is freed (and its
 * follows with it) only from the loop (conns_reap()): the list stays as it
 * is while it is walked.
 */
void fed_export_event(struct fed *f, const struct dlx_event *ev)
{
        struct list *pos;

        for (pos = f->rfollows.next; pos != &f->rfollows; pos = pos->next) {
                struct rfollow *r = list_entry(pos, struct rfollow, link);
                if (r->c->closing)
                        continue;
                if (ev->kind == DLX_EVENT_LOST) {
                        /* what changed meanwhile is not known: all of it again */
                        fed_log(FED_NOTICE, "%s: events of '%s' were dropped: listing it again",
                                r->c->who, r->prefix);
                        listing(r);
                } else if (r->watch == ev->watch && fed_exported(f, ev->name)) {
                        /* a small new version goes with its news; news read late, not at all */
                        size_t len = 0;
                        bool stale = false;
                        uint8_t *offer = ev->kind != DLX_EVENT_UNPUBLISHED && fed_minor(r->c) >= 2
                                                 ? fed_export_offer(r->c, ev->name, ev->version,
                                                                    &len, &stale)
                                                 : NULL;
                        if (!stale)
                                change_offer(r->c, r->id, ev->kind, ev->name, ev->version, 0, NULL,
                                             0, offer, len);
                        free(offer);
                }
        }
}

void fed_export_follows_gone(struct conn *c)
{
        struct fed *f = c->fed;
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &f->rfollows)
        {
                struct rfollow *r = list_entry(pos, struct rfollow, link);
                if (r->c != c)
                        continue;
                if (f->dlx)
                        dlx_unwatch(f->dlx, r->watch);
                list_remove(&r->link);
                free(r);
        }
}

/* ---- the importer: prefixes of peers we follow ---- */

struct ifollow {
        struct list link; /* in fed.follows */
        struct fed *f;
        struct peer *p;
        struct conn *c; /* the endpoint its Follow goes or went on; NULL: none */
        uint64_t id;
        bool sent;
        bool refused;
        uv_timer_t retry;
        uint32_t backoff_ms;
        /* the names the latest listing named, so far (listing: its number) */
        uint64_t listing;
        char **seen;
        size_t nseen, cap;
        size_t alias_len; /* of "@alias/" */
        char local[DLX_NAME_MAX + 1];
};

/* A pull of what a follow saw, waiting for its turn (FED_MAX_EAGER). */
struct eager {
        struct list link; /* in fed.eager */
        uint64_t version;
        char name[];
};

static void seen_clear(struct ifollow *fl)
{
        for (size_t i = 0; i < fl->nseen; i++)
                free(fl->seen[i]);
        free(fl->seen);
        fl->seen = NULL;
        fl->nseen = fl->cap = 0;
}

/*
 * Keeps a name a listing named. Past FED_MAX_LISTED of them the listing
 * cannot be seen whole: its count will not match, and nothing is dropped.
 */
static void seen_add(struct ifollow *fl, const char *name)
{
        char *copy;

        if (fl->nseen >= FED_MAX_LISTED)
                return;
        if (fl->nseen == fl->cap) {
                size_t cap = fl->cap ? 2 * fl->cap : 64;
                char **s = realloc(fl->seen, cap * sizeof(*s));
                if (!s)
                        return; /* its mirror may go after the listing, and come back */
                fl->seen = s;
                fl->cap = cap;
        }
        copy = strdup(name);
        if (copy)
                fl->seen[fl->nseen++] = copy;
}

static int cmp_str(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

static void ask(struct ifollow *fl);

static void on_retry(uv_timer_t *t)
{
        ask(t->data);
}

/* Asks again later: after a second, then twice as long each time, up to 30 s. */
static void schedule_retry(struct ifollow *fl)
{
        if (fl->f->stopping || fl->refused)
                return;
        fl->backoff_ms = fl->backoff_ms ? fl->backoff_ms * 2 : RETRY_MIN_MS;
        if (fl->backoff_ms > RETRY_MAX_MS)
                fl->backoff_ms = RETRY_MAX_MS;
        uv_timer_start(&fl->retry, on_retry, fl->backoff_ms, 0);
}

static void send_follow(struct ifollow *fl)
{
        Dlxf__Follow m = DLXF__FOLLOW__INIT;
        uint8_t buf[DLX_NAME_MAX + 32];
        struct conn *c = fl->c;

        if (c->their_proto[1] < 1) {
                fed_log(FED_ERR,
                        "cannot follow '%s': peer %s speaks protocol %u.%u, following needs 1.1",
                        fl->local, fl->p->alias, (unsigned)c->their_proto[0],
                        (unsigned)c->their_proto[1]);
                fl->refused = true;
                return;
        }
        fl->id = ++fl->f->next_id;
        m.id = fl->id;
        m.prefix.data = (uint8_t *)fl->local + fl->alias_len;
        m.prefix.len = strlen(fl->local) - fl->alias_len;
        fl->sent = true;
        fed_send(c, FED_AM_FOLLOW, buf, dlxf__follow__pack(&m, buf));
}

static void ask(struct ifollow *fl)
{
        char why[200];

        if (fl->f->stopping || fl->refused)
                return;
        fl->c = fed_connect(fl->f, fl->p, why, sizeof(why));
        if (!fl->c) {
                fed_log(FED_NOTICE, "cannot follow '%s' yet: %s", fl->local, why);
                schedule_retry(fl);
                return;
        }
        if (fl->c->authed)
                send_follow(fl);
        /* else once its handshake is over (fed_follow_authed) */
}

void fed_follow_start(struct fed *f)
{
        for (unsigned i = 0; i < f->cfg.nfollows; i++) {
                const char *pre = f->cfg.follows[i];
                struct ifollow *fl = calloc(1, sizeof(*fl));

                if (!fl) {
                        fed_log(FED_ERR, "cannot follow '%s': out of memory", pre);
                        continue;
                }
                fl->f = f;
                fl->p = fed_peer_of(&f->cfg, pre); /* run() made sure it is one */
                fl->alias_len = strlen(fl->p->alias) + 2;
                snprintf(fl->local, sizeof(fl->local), "%s", pre);
                uv_timer_init(f->loop, &fl->retry);
                fl->retry.data = fl;
                list_insert_tail(&f->follows, &fl->link);
        }
        for (struct list *pos = f->follows.next; pos != &f->follows; pos = pos->next)
                ask(list_entry(pos, struct ifollow, link));
}

void fed_follow_authed(struct conn *c)
{
        struct list *pos;

        for (pos = c->fed->follows.next; pos != &c->fed->follows; pos = pos->next) {
                struct ifollow *fl = list_entry(pos, struct ifollow, link);
                if (fl->c == c && !fl->sent)
                        send_follow(fl);
        }
}

void fed_follow_conn_lost(struct conn *c)
{
        struct list *pos;

        for (pos = c->fed->follows.next; pos != &c->fed->follows; pos = pos->next) {
                struct ifollow *fl = list_entry(pos, struct ifollow, link);
                if (fl->c != c)
                        continue;
                fl->c = NULL;
                fl->sent = false;
                fl->listing = 0;
                seen_clear(fl);
                schedule_retry(fl);
        }
}

/*
 * Pulls name's version; in turn past FED_MAX_EAGER. ask: whether dlxd is
 * asked first if this host has it or newer (a listing's names; a live
 * event's version is new here, and needs no round trip).
 */
static void pull(struct fed *f, const char *name, uint64_t version, bool ask)
{
        struct dlx_info in;
        struct eager *e;

        if (ask && dlx_stat(f->dlx, name, &in) == 0 && in.version >= version)
                return;
        if (f->nwants < FED_MAX_EAGER) {
                fed_import_wanted(f, name, version);
                return;
        }
        e = malloc(sizeof(*e) + strlen(name) + 1);
        if (!e) {
                fed_log(FED_WARN, "%s v%llu: not pulled: out of memory", name,
                        (unsigned long long)version);
                return;
        }
        e->version = version;
        strcpy(e->name, name);
        list_insert_tail(&f->eager, &e->link);
}

static void on_eager(uv_timer_t *t)
{
        struct fed *f = t->data;

        while (!f->stopping && f->nwants < FED_MAX_EAGER && !list_empty(&f->eager)) {
                struct eager *e = list_entry(f->eager.next, struct eager, link);
                list_remove(&e->link);
                pull(f, e->name, e->version, true);
                free(e);
        }
}

void fed_follow_kick(struct fed *f)
{
        /* from the loop, not from within the want's end */
        if (!list_empty(&f->eager) && !f->stopping)
                uv_timer_start(&f->eager_timer, on_eager, 0, 0);
}

/* Drops the pulls waiting their turn: of name, or (NULL) all. */
static void eager_drop(struct fed *f, const char *name)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &f->eager)
        {
                struct eager *e = list_entry(pos, struct eager, link);
                if (!name || strcmp(e->name, name) == 0) {
                        list_remove(&e->link);
                        free(e);
                }
        }
}

static void unpublish_mirror(struct fed *f, const char *name)
{
        struct dlx_info in;

        eager_drop(f, name);
        fed_import_origin_gone(f, name);
        if (dlx_stat(f->dlx, name, &in) == 0 && in.origin[0] && dlx_unpublish(f->dlx, name) == 0)
                fed_log(FED_INFO, "%s: unpublished at its origin", name);
}

struct gone {
        struct ifollow *fl;
        char **names;
        size_t n, cap;
};

/* A mirror under fl the listing did not name: its origin went while we did not hear. */
static int not_listed(void *ctx, const struct dlx_info *in)
{
        struct gone *g = ctx;
        const char *key = in->name;
        char *copy;

        if (!in->origin[0] || (g->fl->nseen && bsearch(&key, g->fl->seen, g->fl->nseen,
                                                       sizeof(char *), cmp_str) != NULL))
                return 0;
        if (g->n == g->cap) {
                size_t cap = g->cap ? 2 * g->cap : 16;
                char **s = realloc(g->names, cap * sizeof(*s));
                if (!s)
                        return 1;
                g->names = s;
                g->cap = cap;
        }
        copy = strdup(in->name);
        if (copy)
                g->names[g->n++] = copy;
        return 0;
}

static void synced(struct ifollow *fl)
{
        struct gone g = {.fl = fl};

        fed_log(FED_INFO, "'%s' listed by peer %s: %zu names", fl->local, fl->p->alias, fl->nseen);
        if (fl->nseen)
                qsort(fl->seen, fl->nseen, sizeof(char *), cmp_str);
        dlx_list(fl->f->dlx, fl->local, not_listed, &g);
        for (size_t i = 0; i < g.n; i++) {
                unpublish_mirror(fl->f, g.names[i]);
                free(g.names[i]);
        }
        free(g.names);
        seen_clear(fl);
        fl->backoff_ms = 0; /* the follow stands: a later loss retries after a second */
}

void fed_follow_change(struct conn *c, const void *buf, size_t len)
{
        struct fed *f = c->fed;
        Dlxf__Change *m = dlxf__change__unpack(NULL, len, buf);
        struct ifollow *fl = NULL;
        char name[DLX_NAME_MAX + 1];
        struct list *pos;

        if (!m) {
                fed_close(c, "an undecodable change");
                return;
        }
        for (pos = f->follows.next; pos != &f->follows; pos = pos->next) {
                struct ifollow *x = list_entry(pos, struct ifollow, link);
                if (x->c == c && x->sent && x->id == m->follow)
                        fl = x;
        }
        if (!fl || f->stopping)
                goto out;
        /* a later listing begins with whichever of its messages comes first */
        if (m->listing > fl->listing) {
                seen_clear(fl);
                fl->listing = m->listing;
        }
        switch (m->kind) {
        case FED_CHANGE_BEGIN:
                break;
        case FED_CHANGE_SYNCED:
                /* only a listing seen whole tells what is gone */
                if (m->listing == fl->listing && m->version == fl->nseen)
                        synced(fl);
                else
                        fed_log(FED_NOTICE,
                                "peer %s listed %llu names under '%s', %zu came: nothing dropped",
                                fl->p->alias, (unsigned long long)m->version,
                                fl->local + fl->alias_len, fl->nseen);
                seen_clear(fl);
                break;
        case FED_CHANGE_REFUSED:
                fed_log(FED_ERR, "peer %s will not let us follow '%s': %s%s%s", fl->p->alias,
                        fl->local + fl->alias_len, strerror((int)m->errnum),
                        m->error && m->error[0] ? ": " : "", m->error ? m->error : "");
                fl->refused = true;
                break;
        case DLX_EVENT_PUBLISHED:
        case DLX_EVENT_REPLACED:
        case DLX_EVENT_UNPUBLISHED:
                /* the peer's name, as it is here: under our follow's prefix, or not taken */
                if (m->name.len == 0 || fl->alias_len + m->name.len > DLX_NAME_MAX ||
                    memchr(m->name.data, 0, m->name.len)) {
                        fed_log(FED_WARN, "peer %s: a change of no name or too long a one",
                                fl->p->alias);
                        break;
                }
                memcpy(name, fl->local, fl->alias_len);
                memcpy(name + fl->alias_len, m->name.data, m->name.len);
                name[fl->alias_len + m->name.len] = '\0';
                if (strncmp(name, fl->local, strlen(fl->local)) != 0) {
                        fed_log(FED_WARN, "peer %s: a change of '%s', not under '%s'", fl->p->alias,
                                name, fl->local);
                        break;
                }
                if (m->kind == DLX_EVENT_UNPUBLISHED) {
                        unpublish_mirror(f, name);
                        break;
                }
                if (m->listing && m->listing == fl->listing)
                        seen_add(fl, name);
                /* a small version may come with its news (1.2): taken as a pull's answer */
                if (m->version &&
                    !(m->describe.len && !m->listing &&
                      fed_import_offered(c, name, m->describe.data, m->describe.len)) &&
                    !fed_import_revive(f, name, m->version))
                        pull(f, name, m->version, m->listing != 0);
                break;
        default:
                break; /* a kind of a later minor */
        }
out:
        dlxf__change__free_unpacked(m, NULL);
}

static void follow_closed(uv_handle_t *h)
{
        free(h->data);
}

void fed_follow_stop(struct fed *f)
{
        while (!list_empty(&f->follows)) {
                struct ifollow *fl = list_entry(f->follows.next, struct ifollow, link);
                list_remove(&fl->link);
                seen_clear(fl);
                uv_timer_stop(&fl->retry);
                uv_close((uv_handle_t *)&fl->retry, follow_closed);
        }
        eager_drop(f, NULL);
        uv_timer_stop(&f->eager_timer);
        uv_close((uv_handle_t *)&f->eager_timer, NULL);
}

unsigned fed_follow_count(const struct fed *f, const struct peer *p)
{
        unsigned n = 0;

        for (const struct list *pos = f->follows.next; pos != &f->follows; pos = pos->next)
                n += list_entry(pos, struct ifollow, link)->p == p;
        return n;
}

unsigned fed_rfollow_count(const struct fed *f, const struct conn *c)
{
        unsigned n = 0;

        for (const struct list *pos = f->rfollows.next; pos != &f->rfollows; pos = pos->next)
                n += list_entry(pos, struct rfollow, link)->c == c;
        return n;
}
