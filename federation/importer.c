/* SPDX-License-Identifier: MIT */
/*
 * What local consumers want from peers. dlxd tells us (WANTED) when an
 * acquire waits for "@<alias>/<name>"; we ask the peer (Lookup), take the
 * version's bytes (its DATA: eager when small, a rendezvous when not) into
 * memory dlx_alloc() gave us, and publish them as a read-only mirror that
 * keeps the origin's version number. A group (protocol 1.2) comes as one
 * extent: where its members lie as dlx_group_alloc() would lay them out
 * (a group made that way at its origin), it lands in such a group and is
 * published without a copy; else it lands in one buffer and
 * dlx_publish_group() lays it out, one local copy.
 *
 * Wants of one name are coalesced: a want that a pull under way covers, or
 * that asks for the version another asks for, rides along with it. A want
 * of a higher version than one asked for and not answered yet waits for
 * that answer (the peer has nothing for the lower one yet, or sends what it
 * has, which may do: want.then); a want of a lower version asks on its own,
 * as the peer may have it while it has not the higher one. Of two pulls of
 * a name, the one that brings an older version is dropped when its
 * version is known.
 *
 * Whatever cannot be had fails the waiting acquires through
 * dlx_fetch_failed(), with a message that names the peer. That fails every
 * waiter up to a version, so a failure waits while a want of a lower
 * version of the name is still under way (fail_or_defer()).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fed.h"
#include "fed.pb-c.h"
#include "layout.h"
#include "wire.h"

struct want {
        struct list link; /* in fed.wants */
        struct fed *f;
        struct peer *p;
        struct conn *c; /* once asked */
        uint64_t id;
        uint64_t min_version;
        bool asked, pulling;
        bool ended;   /* its receive is being cancelled: freed when UCX says it is done */
        bool got;     /* its DATA arrived: the peer's lease has ended with the send */
        bool gone;    /* unpublished at its origin meanwhile: its mirror goes once it serves */
        bool done;    /* want_end() ran: once is all (a failed send may end it under its caller) */
        bool offered; /* it came with a follow's news: nobody asked */
        /*
         * Asked before its name was unpublished at the origin, and news of
         * this version of its next life came before the answer: the answer
         * is of that life if it is this version or newer (0: not revived).
         */
        uint64_t revived;
        char name[DLX_NAME_MAX + 1]; /* the local one, "@alias/..." */
        /* the pull */
        DLManagedTensorVersioned *buf;
        Dlxf__Describe *group; /* a group's answer: its members */
        dlx_group *g;          /* a group landing in place */
        uint8_t *dest;         /* where the bytes land: buf's, or g's */
        ucp_mem_h memh;
        void *req;
        uint64_t lease, version, length;
        uint64_t covers; /* the highest version whose waiters it answers (>= min_version) */
        /*
         * Higher versions wanted before the answer, ascending: each asked for
         * then, unless what came covers it (a list, not the highest alone: a
         * want of v2 must not wait on a v5 that may never come).
         */
        uint64_t *then;
        size_t nthen, then_cap;
        /* a failure of a higher version, sent once this want has ended (0: none) */
        uint64_t defer_min;
        int defer_err;
        char defer_msg[256];
        Dlxf__Layout *layout;
        uv_timer_t timer;
        bool timer_on;
};

static void timer_closed(uv_handle_t *h)
{
        free(h->data);
}

/* Ends w: its pull's resources go; err < 0 fails the acquires waiting for it. */
static void want_end(struct want *w, int err, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static void want_free(struct want *w)
{
        struct fed *f = w->f;

        if (w->memh)
                ucp_mem_unmap(f->ctx, w->memh);
        if (w->lease && !w->got && w->c && !w->c->closing) {
                Dlxf__Release r = DLXF__RELEASE__INIT;
                uint8_t b[32];
                r.lease = w->lease;
                fed_send(w->c, FED_AM_RELEASE, b, dlxf__release__pack(&r, b));
        }
        if (w->buf)
                w->buf->deleter(w->buf);
        dlx_group_release(w->g);
        if (w->group)
                dlxf__describe__free_unpacked(w->group, NULL);
        if (w->layout)
                dlxf__layout__free_unpacked(w->layout, NULL);
        free(w->then);
        if (w->timer_on) {
                uv_timer_stop(&w->timer);
                uv_close((uv_handle_t *)&w->timer, timer_closed);
        } else {
                free(w);
        }
}

/*
 * Fails the acquires waiting for name up to min_version, unless a want of a
 * version at most that is still under way: its waiters would fail with
 * these, so the failure waits for that want to end.
 */
static void fail_or_defer(struct fed *f, const char *name, uint64_t min_version, int err,
                          const char *msg)
{
        struct list *pos;

        for (pos = f->wants.next; pos != &f->wants; pos = pos->next) {
                struct want *u = list_entry(pos, struct want, link);
                if (strcmp(u->name, name) != 0 || u->min_version > min_version)
                        continue;
                if (min_version >= u->defer_min) {
                        u->defer_min = min_version;
                        u->defer_err = err;
                        snprintf(u->defer_msg, sizeof(u->defer_msg), "%s", msg);
                }
                return;
        }
        /* what the protocol cannot carry to a waiter reaches it as -EIO */
        if (!wire_errno_carried(err))
                err = -EIO;
        dlx_fetch_failed(f->dlx, name, min_version, err, msg);
}

static void want_end(struct want *w, int err, const char *fmt, ...)
{
        struct fed *f = w->f;

        if (w->done)
                return;
        w->done = true;
        list_remove(&w->link);
        list_init(&w->link);
        f->nwants--;
        fed_follow_kick(f);
        if (w->timer_on)
                uv_timer_stop(&w->timer);
        /*
         * A refusal of this version (writable, a group to an older peer, device
         * memory) says nothing of later ones: the versions wanted behind it are
         * wanted again, not failed with it. Any other failure (the peer lost,
         * or without the version past --wait-ms) is theirs too.
         */
        uint64_t *again = NULL;
        size_t nagain = 0;
        char name[DLX_NAME_MAX + 1];
        if (err == -ENOTSUP && w->nthen) {
                again = w->then;
                nagain = w->nthen;
                w->then = NULL;
                w->nthen = w->then_cap = 0;
                memcpy(name, w->name, sizeof(name));
        }
        if (err < 0) {
                char msg[256];
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(msg, sizeof(msg), fmt, ap);
                va_end(ap);
                fed_log(FED_NOTICE, "%s v%llu+: %s", w->name, (unsigned long long)w->min_version,
                        msg);
                if (w->p)
                        w->p->failures++;
                uint64_t top = w->nthen ? w->then[w->nthen - 1] : 0;
                fail_or_defer(f, w->name, top > w->covers ? top : w->covers, err, msg);
        }
        /* a higher version's failure waited for this want: published, it may not be one */
        if (w->defer_min && (err < 0 || w->defer_min > w->version))
                fail_or_defer(f, w->name, w->defer_min, w->defer_err, w->defer_msg);
        if (w->req) {
                /* the get may still write into the buffer: all stays until it ends */
                w->ended = true;
                ucp_request_cancel(f->worker, w->req);
        } else {
                want_free(w);
        }
        for (size_t i = 0; i < nagain; i++)
                fed_import_wanted(f, name, again[i]);
        free(again);
}

static void on_pull_timeout(uv_timer_t *t)
{
        struct want *w = t->data;

        want_end(w, -ETIMEDOUT, "no answer from peer %s in %u ms for '%s'", w->p->alias,
                 w->f->cfg.pull_ms, w->name);
}

static void ask(struct want *w)
{
        Dlxf__Lookup q = DLXF__LOOKUP__INIT;
        const char *remote = strchr(w->name, '/') + 1;
        uint8_t buf[DLX_NAME_MAX + 64];

        q.id = w->id;
        q.name.data = (uint8_t *)remote;
        q.name.len = strlen(remote);
        q.min_version = w->min_version;
        q.wait_ms = w->f->cfg.wait_ms;
        w->asked = true;
        if (fed_send(w->c, FED_AM_LOOKUP, buf, dlxf__lookup__pack(&q, buf)) < 0)
                want_end(w, -EHOSTUNREACH, "cannot ask peer %s for '%s'", w->p->alias, remote);
}

/* Notes that min_version is wanted once w's answer is known. 0, or -ENOMEM. */
static int then_add(struct want *w, uint64_t min_version)
{
        size_t at = w->nthen;

        while (at > 0 && w->then[at - 1] > min_version)
                at--;
        if (at > 0 && w->then[at - 1] == min_version)
                return 0;
        if (w->nthen == w->then_cap) {
                size_t cap = w->then_cap ? 2 * w->then_cap : 4;
                uint64_t *v = realloc(w->then, cap * sizeof(*v));
                if (!v)
                        return -ENOMEM;
                w->then = v;
                w->then_cap = cap;
        }
        memmove(w->then + at + 1, w->then + at, (w->nthen - at) * sizeof(*w->then));
        w->then[at] = min_version;
        w->nthen++;
        return 0;
}

/* A want of name at min_version or later from p, timed; NULL when out of memory. */
static struct want *want_new(struct fed *f, struct peer *p, const char *name, uint64_t min_version)
{
        struct want *w = calloc(1, sizeof(*w));

        if (!w)
                return NULL;
        w->f = f;
        w->p = p;
        w->id = ++f->next_id;
        w->min_version = min_version;
        w->covers = min_version;
        snprintf(w->name, sizeof(w->name), "%s", name);
        list_insert_tail(&f->wants, &w->link);
        f->nwants++;
        uv_timer_init(f->loop, &w->timer);
        w->timer.data = w;
        w->timer_on = true;
        uv_timer_start(&w->timer, on_pull_timeout, f->cfg.pull_ms + f->cfg.wait_ms, 0);
        return w;
}

void fed_import_wanted(struct fed *f, const char *name, uint64_t min_version)
{
        struct peer *p = fed_peer_of(&f->cfg, name);
        struct list *pos;
        struct want *w;
        char why[200];

        if (!p) {
                dlx_fetch_failed(f->dlx, name, min_version, -ENOENT,
                                 "no such peer in dlxfed's peer list");
                return;
        }
        struct want *lower = NULL;

        for (pos = f->wants.next; pos != &f->wants; pos = pos->next) {
                w = list_entry(pos, struct want, link);
                /* a pull of a life of the name that ended at its origin serves nothing new */
                if (w->gone || strcmp(w->name, name) != 0)
                        continue;
                /* a pull that brings enough, or an ask for the same version: it rides along */
                if (w->pulling ? w->version >= min_version : w->min_version == min_version) {
                        if (min_version > w->covers)
                                w->covers = min_version;
                        return;
                }
                if (!w->pulling && w->min_version < min_version)
                        lower = w;
        }
        if (lower) {
                /* what the lower ask brings may do; if not, this is asked for then */
                if (then_add(lower, min_version) < 0)
                        fail_or_defer(f, name, min_version, -ENOMEM, "dlxfed: out of memory");
                return;
        }
        w = want_new(f, p, name, min_version);
        if (!w) {
                fail_or_defer(f, name, min_version, -ENOMEM, "dlxfed: out of memory");
                return;
        }
        w->c = fed_connect(f, p, why, sizeof(why));
        if (!w->c) {
                want_end(w, -EHOSTUNREACH, "%s", why);
                return;
        }
        if (w->c->authed)
                ask(w);
}

void fed_import_authed(struct conn *c)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &c->fed->wants)
        {
                struct want *w = list_entry(pos, struct want, link);
                if (w->c == c && !w->asked)
                        ask(w);
        }
}

static struct want *want_of(struct conn *c, uint64_t id)
{
        struct list *pos;

        for (pos = c->fed->wants.next; pos != &c->fed->wants; pos = pos->next) {
                struct want *w = list_entry(pos, struct want, link);
                if (w->c == c && w->id == id)
                        return w;
        }
        return NULL;
}

/* The pulled bytes, held by each mirror tensor made of them and by the pull while it publishes. */
struct mbuf {
        DLManagedTensorVersioned *buf;
        unsigned refs;
};

static void mbuf_put(struct mbuf *mb)
{
        if (--mb->refs == 0) {
                mb->buf->deleter(mb->buf);
                free(mb);
        }
}

static void mirror_deleter(DLManagedTensorVersioned *t)
{
        free(t->dl_tensor.shape);
        mbuf_put(t->manager_ctx);
        free(t);
}

/* A read-only tensor of mb's bytes, as the layout says; NULL when out of memory. */
static DLManagedTensorVersioned *mirror_tensor(struct mbuf *mb, const Dlxf__Layout *l)
{
        DLManagedTensorVersioned *t = calloc(1, sizeof(*t));
        int64_t *dims = calloc(2 * l->n_shape + 1, sizeof(int64_t));

        if (!t || !dims) {
                free(t);
                free(dims);
                return NULL;
        }
        if (l->n_shape) {
                memcpy(dims, l->shape, l->n_shape * sizeof(int64_t));
                memcpy(dims + l->n_shape, l->strides, l->n_shape * sizeof(int64_t));
        }
        t->version.major = DLPACK_MAJOR_VERSION;
        t->version.minor = DLPACK_MINOR_VERSION;
        t->manager_ctx = mb;
        mb->refs++;
        t->deleter = mirror_deleter;
        t->flags = DLPACK_FLAG_BITMASK_READ_ONLY | l->flags;
        t->dl_tensor.data = mb->buf->dl_tensor.data;
        t->dl_tensor.device = (DLDevice){kDLCPU, 0};
        t->dl_tensor.ndim = (int32_t)l->n_shape;
        t->dl_tensor.dtype = (DLDataType){
                .code = (uint8_t)l->code, .bits = (uint8_t)l->bits, .lanes = (uint16_t)l->lanes};
        t->dl_tensor.shape = dims;
        t->dl_tensor.strides = dims + l->n_shape;
        t->dl_tensor.byte_offset = l->byte_offset;
        return t;
}

/* A member's name, from the peer's bytes (checked by members_ok()). */
/* The members' names, NUL-terminated, in one allocation (free() it); NULL: out of memory. */
static char **member_names(const Dlxf__Describe *d)
{
        size_t n = d->n_members, bytes = n * sizeof(char *);
        char **v, *at;

        for (size_t i = 0; i < n; i++)
                bytes += d->members[i]->name.len + 1;
        v = malloc(bytes);
        if (!v)
                return NULL;
        at = (char *)(v + n);
        for (size_t i = 0; i < n; i++) {
                v[i] = at;
                memcpy(at, d->members[i]->name.data, d->members[i]->name.len);
                at += d->members[i]->name.len;
                *at++ = '\0';
        }
        return v;
}

/* A group's members, views of mb's bytes, published (dlx_publish_group() lays them out). */
static int publish_members(struct want *w, struct mbuf *mb, const struct dlx_publish_options *o,
                           uint64_t *v)
{
        size_t n = w->group->n_members;
        struct dlx_member *ms = calloc(n, sizeof(*ms));
        char **names = member_names(w->group);
        int err = ms && names ? 0 : -ENOMEM;

        for (size_t i = 0; err == 0 && i < n; i++) {
                ms[i].name = names[i];
                ms[i].tensor = mirror_tensor(mb, w->group->members[i]->layout);
                if (!ms[i].tensor)
                        err = -ENOMEM;
        }
        if (err == 0) {
                /* takes every member's tensor, whatever it returns */
                err = dlx_publish_group(w->f->dlx, w->name, ms, n, o, v);
        } else if (ms) {
                for (size_t i = 0; i < n; i++)
                        if (ms[i].tensor)
                                ms[i].tensor->deleter(ms[i].tensor);
        }
        free(ms);
        free(names);
        return err;
}

/* The mirror of what w brought (mb: its bytes, NULL for a group in place) up as o says. */
static int publish_one(struct want *w, struct mbuf *mb, struct dlx_publish_options *o, uint64_t *v)
{
        DLManagedTensorVersioned *t;

        if (w->g) {
                o->copy = DLX_COPY_NEVER;
                return dlx_group_publish(w->f->dlx, w->name, w->g, o, v);
        }
        if (w->group) {
                o->copy = DLX_COPY_IF_NEEDED;
                return publish_members(w, mb, o, v);
        }
        o->copy = DLX_COPY_NEVER;
        t = mirror_tensor(mb, w->layout);
        return t ? dlx_publish(w->f->dlx, w->name, t, o, v) : -ENOMEM;
}

/*
 * A publish of w's version was refused as not above the mirror's last one:
 * whether the origin numbered the name anew. So it did where the name has
 * no current version here (its copies are held), or where the current
 * mirror is of an older version of the origin's than w's, though numbered
 * higher here (it was numbered anew before).
 */
static bool numbered_anew(const struct want *w)
{
        struct dlx_info in;
        const char *at;
        char *end;
        int err = dlx_stat(w->f->dlx, w->name, &in);

        if (err == -ENOENT)
                return true;
        /* the origin, as publish_mirror() wrote it: "... <alias> v<version>" */
        at = err == 0 ? strrchr(in.origin, 'v') : NULL;
        if (!at || at == in.origin || at[-1] != ' ')
                return false;
        unsigned long long mirrored = strtoull(at + 1, &end, 10);
        return *end == '\0' && mirrored < w->version;
}

/*
 * The bytes are here: the mirror goes up, keeping the origin's version.
 * Where this host still holds copies of a higher version of a name that has
 * none current, the origin numbered the name anew (it was unpublished there
 * and published again, and its dlxd kept no number): the mirror goes up as
 * this host's next version, as versions here never go down; its origin
 * still says which version of the origin's it is (numbered_anew()).
 */
static void publish_mirror(struct want *w)
{
        struct fed *f = w->f;
        struct mbuf *mb = NULL;
        char origin[128];
        uint64_t v = 0;
        int err;

        w->got = true;
        if (w->buf) {
                mb = calloc(1, sizeof(*mb));
                if (!mb) {
                        want_end(w, -ENOMEM, "dlxfed: out of memory");
                        return;
                }
                mb->buf = w->buf;
                mb->refs = 1; /* ours, while publishing */
                w->buf = NULL;
        }
        snprintf(origin, sizeof(origin), "ucx %s \xe2\x86\x90 %s v%llu", w->c->transport,
                 w->p->alias, (unsigned long long)w->version);
        struct dlx_publish_options o = {.origin_version = w->version, .origin = origin};
        err = publish_one(w, mb, &o, &v);
        if (err == -EEXIST && numbered_anew(w)) {
                o.origin_version = 0;
                err = publish_one(w, mb, &o, &v);
                if (err == 0)
                        fed_log(FED_NOTICE,
                                "%s: %s numbered it anew (it was unpublished there and "
                                "published again): its v%llu is v%llu here",
                                w->name, w->p->alias, (unsigned long long)w->version,
                                (unsigned long long)v);
        }
        if (mb)
                mbuf_put(mb);
        if (err == -EEXIST) {
                /* this host has it already, or newer: the waiters have what there is */
                want_end(w, 0, NULL);
                return;
        }
        if (err < 0) {
                want_end(w, err, "cannot publish the mirror of '%s' from peer %s: %s", w->name,
                         w->p->alias, err == -ENOMEM ? "out of memory" : dlx_last_error());
                return;
        }
        w->p->pulls++;
        w->p->bytes_in += w->length;
        if (w->group)
                fed_log(FED_INFO, "%s v%llu: a group of %zu, %llu bytes from %s, %s", w->name,
                        (unsigned long long)w->version, w->group->n_members,
                        (unsigned long long)w->length, w->p->alias,
                        w->g ? "in place" : "laid out here");
        else
                fed_log(FED_INFO, "%s v%llu: %llu bytes from %s%s", w->name,
                        (unsigned long long)w->version, (unsigned long long)w->length, w->p->alias,
                        w->offered ? ", with its news" : "");
        /* the acquires that waited have it now; a follow said it is gone at its origin */
        if (w->gone)
                dlx_unpublish(f->dlx, w->name);
        want_end(w, 0, NULL);
}

static void on_data(void *req, ucs_status_t status, size_t length, void *arg)
{
        struct want *w = arg;

        (void)length;
        ucp_request_free(req);
        w->req = NULL;
        if (w->ended) {
                want_free(w);
                return;
        }
        if (status != UCS_OK) {
                want_end(w, -EHOSTUNREACH, "peer %s lost during the pull of '%s': %s", w->p->alias,
                         w->name, ucs_status_string(status));
                return;
        }
        publish_mirror(w);
}

/*
 * The versions wanted while w's answer was awaited, now that it is known
 * (or w rides along another pull, which then has it: end, and w ends
 * first): each is wanted again, lowest first, and is covered by a pull
 * that brings it or asked for on its own.
 */
static void then_ask(struct want *w, bool end)
{
        struct fed *f = w->f;
        uint64_t *then = w->then;
        size_t n = w->nthen;
        char name[DLX_NAME_MAX + 1];

        w->then = NULL;
        w->nthen = w->then_cap = 0;
        memcpy(name, w->name, sizeof(name));
        if (end)
                want_end(w, 0, NULL);
        for (size_t i = 0; i < n; i++)
                fed_import_wanted(f, name, then[i]);
        free(then);
}

/*
 * Two asks of a name got their answers: a pull of a version as new as w's
 * is under way already, so w's waiters are its, and w's lease goes back.
 */
static bool ride_along(struct want *w)
{
        struct list *pos;

        for (pos = w->f->wants.next; pos != &w->f->wants; pos = pos->next) {
                struct want *u = list_entry(pos, struct want, link);
                if (u == w || !u->pulling || u->gone || strcmp(u->name, w->name) != 0 ||
                    u->version < w->version)
                        continue;
                if (w->covers > u->covers)
                        u->covers = w->covers;
                if (w->defer_min > u->defer_min) {
                        u->defer_min = w->defer_min;
                        u->defer_err = w->defer_err;
                        memcpy(u->defer_msg, w->defer_msg, sizeof(u->defer_msg));
                }
                w->defer_min = 0;
                fed_log(FED_DEBUG, "%s v%llu: pulled once, for wants of v%llu+ and v%llu+", w->name,
                        (unsigned long long)u->version, (unsigned long long)u->min_version,
                        (unsigned long long)w->min_version);
                then_ask(w, true);
                return true;
        }
        return false;
}

/* A layout the peer sent: sound, and inside length bytes ([*lo, *hi) of them). */
static int layout_ok(const Dlxf__Layout *l, uint64_t length, int64_t *lo, int64_t *hi,
                     const char **why)
{
        DLDataType dt;

        if (!l || l->n_shape != l->n_strides || l->n_shape > DLX_MAX_NDIM || l->code > 255 ||
            l->bits > 255 || l->lanes > 65535) {
                *why = "a malformed layout";
                return -EPROTO;
        }
        dt = (DLDataType){
                .code = (uint8_t)l->code, .bits = (uint8_t)l->bits, .lanes = (uint16_t)l->lanes};
        if (layout_extent(dt, (int32_t)l->n_shape, l->shape, l->strides, l->byte_offset, l->flags,
                          lo, hi, why) < 0)
                return -EPROTO;
        if (*lo < 0 || (uint64_t)*hi > length) {
                *why = "a layout past the bytes it describes";
                return -EPROTO;
        }
        return 0;
}

/*
 * A group's members as the peer sent them: each named and laid out inside
 * length bytes. *tight: the members' bytes span all length of them, from
 * the first (what landing in place needs).
 */
static int members_ok(const Dlxf__Describe *d, uint64_t length, bool *tight, const char **why)
{
        int64_t first = INT64_MAX, last = 0, lo, hi;

        for (size_t i = 0; i < d->n_members; i++) {
                const Dlxf__Member *m = d->members[i];
                if (m->name.len == 0 || m->name.len > DLX_NAME_MAX ||
                    memchr(m->name.data, 0, m->name.len)) {
                        *why = "a member without a name";
                        return -EPROTO;
                }
                if (layout_ok(m->layout, length, &lo, &hi, why) < 0)
                        return -EPROTO;
                if (hi > lo) {
                        first = lo < first ? lo : first;
                        last = hi > last ? hi : last;
                }
        }
        *tight = first == INT64_MAX ? length == 0 : first == 0 && (uint64_t)last == length;
        return 0;
}

/*
 * A group whose members lie as dlx_group_alloc() lays them out (compact, in
 * name order, 64-byte aligned: a group made that way at its origin) lands
 * in such a group, to be published without a copy. False: it does not.
 */
static bool land_in_place(struct want *w)
{
        const Dlxf__Describe *d = w->group;
        size_t n = d->n_members;
        struct dlx_member_layout *ls = calloc(n, sizeof(*ls));
        char **names = member_names(d);
        dlx_group *g = NULL;
        uint8_t *base = NULL;
        bool ok = ls && names;

        for (size_t i = 0; ok && i < n; i++) {
                const Dlxf__Layout *l = d->members[i]->layout;
                int64_t compact[DLX_MAX_NDIM];
                layout_compact_strides((int32_t)l->n_shape, l->shape, compact);
                ok = l->flags == 0 &&
                     (l->n_shape == 0 ||
                      memcmp(compact, l->strides, l->n_shape * sizeof(int64_t)) == 0);
                ls[i] = (struct dlx_member_layout){
                        .name = names[i],
                        .dtype = {(uint8_t)l->code, (uint8_t)l->bits, (uint16_t)l->lanes},
                        .ndim = (int32_t)l->n_shape,
                        .shape = l->shape};
        }
        if (ok && dlx_group_alloc(w->f->dlx, ls, n, &g) < 0)
                ok = false;
        for (size_t i = 0; ok && i < n; i++) {
                const Dlxf__Layout *l = d->members[i]->layout;
                int64_t at = dlx_group_find(g, names[i]), lo, hi;
                const char *why;
                const DLTensor *t = at >= 0 ? dlx_group_tensor(g, (size_t)at) : NULL;
                if (!t) {
                        ok = false;
                        break;
                }
                layout_ok(l, w->length, &lo, &hi, &why);
                if (hi <= lo)
                        continue; /* empty: nothing lands in it */
                uint8_t *p = (uint8_t *)t->data + t->byte_offset - l->byte_offset;
                if (!base)
                        base = p;
                ok = p == base;
        }
        free(ls);
        free(names);
        if (!ok) {
                dlx_group_release(g);
                return false;
        }
        static uint8_t nothing;
        w->g = g;
        w->dest = base ? base : &nothing;
        return true;
}

/* Where the answer's bytes land: a group in place, else a dlx_alloc() buffer of this host. */
static int land(struct want *w, bool tight)
{
        int64_t n = (int64_t)(w->length ? w->length : 1);
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = &n};
        int err;

        if (w->group && tight && land_in_place(w))
                return 0;
        err = dlx_alloc(w->f->dlx, &proto, &w->buf);
        if (err == 0)
                w->dest = w->buf->dl_tensor.data;
        return err;
}

/* Frees an answer, unless it is w's group's (freed with w). */
static void describe_drop(struct want *w, Dlxf__Describe *d)
{
        if (d != w->group)
                dlxf__describe__free_unpacked(d, NULL);
}

/* w's answer d (ownership taken): the bytes are here, or come as DATA, or it failed. */
static void answered(struct want *w, Dlxf__Describe *d)
{
        struct fed *f = w->f;
        const char *why = NULL;
        bool tight = false;
        int64_t lo, hi;
        ucs_status_t s;
        int err;

        if (d->errnum) {
                err = d->errnum > 0 && d->errnum < 4096 ? -d->errnum : -EIO;
                want_end(w, err, "peer %s: %s", w->p->alias, d->error ? d->error : "refused");
                dlxf__describe__free_unpacked(d, NULL);
                return;
        }
        w->pulling = true;
        w->lease = d->lease;
        w->version = d->version;
        w->length = d->length;
        if (d->n_members) {
                w->group = d; /* ours now: freed with w */
        } else {
                w->layout = d->layout;
                d->layout = NULL; /* ours now: freed on its own */
        }
        if (w->version == 0)
                why = "no version";
        else if (w->version < w->min_version)
                why = "a version older than the one asked for";
        else if (w->group)
                members_ok(w->group, w->length, &tight, &why);
        else if (!w->layout)
                why = "no layout";
        else
                layout_ok(w->layout, w->length, &lo, &hi, &why);
        if (why) {
                describe_drop(w, d);
                want_end(w, -EPROTO, "peer %s described '%s' wrongly: %s", w->p->alias, w->name,
                         why);
                return;
        }
        if (w->revived && w->version < w->revived) {
                /* of the life that ended: what the news told of is asked for instead */
                describe_drop(w, d);
                if (then_add(w, w->revived) == 0) {
                        then_ask(w, true);
                        return;
                }
                want_end(w, -ENOMEM, "dlxfed: out of memory");
                return;
        }
        if (ride_along(w)) {
                describe_drop(w, d);
                return;
        }
        /* what was wanted meanwhile: covered by what comes, or asked for now */
        then_ask(w, false);
        /* the bytes land in shared memory of this host, where the mirror will be */
        err = land(w, tight);
        if (err < 0) {
                describe_drop(w, d);
                want_end(w, err, "no room for '%s' (%llu bytes) on this host: %s", w->name,
                         (unsigned long long)w->length, dlx_last_error());
                return;
        }
        if (d->inline_) {
                /* a small one: its bytes are here, and the peer holds nothing for it */
                w->lease = 0;
                if (d->data.len != w->length) {
                        describe_drop(w, d);
                        want_end(w, -EPROTO, "peer %s sent %zu bytes of '%s', not %llu",
                                 w->p->alias, d->data.len, w->name, (unsigned long long)w->length);
                        return;
                }
                if (w->length)
                        memcpy(w->dest, d->data.data, w->length);
                describe_drop(w, d);
                publish_mirror(w);
                return;
        }
        describe_drop(w, d);
        if (w->length == 0)
                return; /* its DATA is empty: nothing to register */
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                   .address = w->dest,
                                   .length = w->length};
        s = ucp_mem_map(f->ctx, &mp, &w->memh);
        if (s != UCS_OK)
                want_end(w, -EIO, "cannot register room for '%s' from peer %s: %s", w->name,
                         w->p->alias, ucs_status_string(s));
        /* the DATA follows */
}

void fed_import_describe(struct conn *c, const void *buf, size_t len)
{
        Dlxf__Describe *d = dlxf__describe__unpack(NULL, len, buf);
        struct want *w;

        if (!d) {
                fed_close(c, "an undecodable answer");
                return;
        }
        w = want_of(c, d->id);
        if (!w || w->pulling) {
                /* an answer to a want given up: its lease goes back */
                if (d->errnum == 0 && d->lease) {
                        Dlxf__Release r = DLXF__RELEASE__INIT;
                        uint8_t b[32];
                        r.lease = d->lease;
                        fed_send(c, FED_AM_RELEASE, b, dlxf__release__pack(&r, b));
                }
                dlxf__describe__free_unpacked(d, NULL);
                return;
        }
        answered(w, d);
}

bool fed_import_offered(struct conn *c, const char *name, const void *buf, size_t len)
{
        struct fed *f = c->fed;
        struct peer *p = fed_peer_of(&f->cfg, name);
        Dlxf__Describe *d = dlxf__describe__unpack(NULL, len, buf);
        struct list *pos;
        struct want *w;

        if (!d) {
                fed_close(c, "an undecodable offer");
                return true;
        }
        if (!p || d->errnum || !d->inline_ || d->lease || d->n_members || d->version == 0) {
                dlxf__describe__free_unpacked(d, NULL);
                return false;
        }
        struct want *asked = NULL;

        for (pos = f->wants.next; pos != &f->wants; pos = pos->next) {
                w = list_entry(pos, struct want, link);
                if ((w->gone && w->pulling) || strcmp(w->name, name) != 0)
                        continue;
                /* a pull under way brings it, or newer */
                if (w->pulling && w->version >= d->version) {
                        dlxf__describe__free_unpacked(d, NULL);
                        return true;
                }
                /*
                 * A consumer's want asked of the peer meanwhile (even before an
                 * unpublish there: this is news of the name's next life): this
                 * is its answer.
                 */
                if (!w->pulling && w->c == c && w->min_version <= d->version && !asked)
                        asked = w;
        }
        if (asked) {
                /* the news' own bytes: of the life it tells of, whatever was revived before */
                asked->gone = false;
                asked->revived = 0;
        }
        w = asked ? asked : want_new(f, p, name, d->version);
        if (!w) {
                dlxf__describe__free_unpacked(d, NULL);
                return false;
        }
        w->c = c;
        w->asked = true;
        w->offered = true;
        answered(w, d);
        return true;
}

ucs_status_t fed_import_data(struct conn *c, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
        struct fed *f = c->fed;
        /*
         * A rendezvous DATA we do not take is dropped by returning UCS_OK
         * without receiving it (releasing its descriptor from here would
         * leak UCX's buffer).
         */
        bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
        uint64_t id;
        struct want *w;

        if (header_length != sizeof(id)) {
                fed_close(c, "a DATA message without its header");
                return UCS_OK;
        }
        memcpy(&id, header, sizeof(id));
        w = want_of(c, id);
        if (!w || !w->pulling || w->req || !w->dest) {
                /* a want given up meanwhile: the bytes are dropped, the sender's lease ends */
                return UCS_OK;
        }
        if (length != w->length) {
                want_end(w, -EPROTO, "peer %s sent %zu bytes of '%s', not %llu", w->p->alias,
                         length, w->name, (unsigned long long)w->length);
                return UCS_OK;
        }
        if (!rndv) {
                memcpy(w->dest, data, length);
                publish_mirror(w);
                return UCS_OK;
        }
        ucp_request_param_t p = {.op_attr_mask =
                                         UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                                 .cb.recv_am = on_data,
                                 .user_data = w};
        if (w->memh) {
                p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
                p.memh = w->memh;
        }
        void *r = ucp_am_recv_data_nbx(f->worker, data, w->dest, length, &p);
        if (r == NULL)
                publish_mirror(w);
        else if (UCS_PTR_IS_ERR(r))
                want_end(w, -EHOSTUNREACH, "cannot take '%s' from peer %s: %s", w->name,
                         w->p->alias, ucs_status_string(UCS_PTR_STATUS(r)));
        else
                w->req = r;
        return UCS_OK;
}

/* Unpublishes what came from p: its mirrors go as a producer's tensors go with it. */
static int unpublish_one(void *ctx, const struct dlx_info *in)
{
        struct fed *f = ctx;

        if (in->origin[0])
                dlx_unpublish(f->dlx, in->name);
        return 0;
}

void fed_import_conn_lost(struct conn *c, const char *why)
{
        struct fed *f = c->fed;
        struct list *pos, *tmp;
        char prefix[FED_ALIAS_MAX + 3];

        list_for_each_safe(pos, tmp, &f->wants)
        {
                struct want *w = list_entry(pos, struct want, link);
                if (w->c != c)
                        continue;
                w->c = NULL; /* no release to send: the endpoint is gone */
                want_end(w, -EHOSTUNREACH, "%s", why);
        }
        if (c->peer && !f->stopping) {
                snprintf(prefix, sizeof(prefix), "@%s/", c->peer->alias);
                dlx_list(f->dlx, prefix, unpublish_one, f);
        }
}

void fed_import_origin_gone(struct fed *f, const char *name)
{
        struct list *pos;

        for (pos = f->wants.next; pos != &f->wants; pos = pos->next) {
                struct want *w = list_entry(pos, struct want, link);
                if (strcmp(w->name, name) == 0)
                        w->gone = true;
        }
}

bool fed_import_revive(struct fed *f, const char *name, uint64_t version)
{
        struct list *pos;

        for (pos = f->wants.next; pos != &f->wants; pos = pos->next) {
                struct want *w = list_entry(pos, struct want, link);
                if (w->gone && !w->pulling && w->min_version <= version &&
                    strcmp(w->name, name) == 0) {
                        w->gone = false;
                        w->revived = version;
                        if (version > w->covers)
                                w->covers = version;
                        return true;
                }
        }
        return false;
}

void fed_import_stop(struct fed *f)
{
        while (!list_empty(&f->wants))
                want_end(list_entry(f->wants.next, struct want, link), -ESHUTDOWN,
                         "dlxfed is stopping");
}
