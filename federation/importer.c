/* SPDX-License-Identifier: MIT */
/*
 * What local consumers want from peers. dlxd tells us (WANTED) when an
 * acquire waits for "@<alias>/<name>"; we ask the peer (Lookup), take the
 * version's bytes (its DATA: eager when small, a rendezvous when not) into
 * memory dlx_alloc() gave us, and publish them as a read-only mirror that
 * keeps the origin's version number.
 *
 * Wants of one name are coalesced: a want that a pull under way covers, or
 * that asks for the version another asks for, rides along with it. A want
 * of a higher version than one asked for and not answered yet waits for
 * that answer (the peer has nothing for the lower one yet, or sends what it
 * has, which may do: then_min); a want of a lower version asks on its own,
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
        bool ended; /* its receive is being cancelled: freed when UCX says it is done */
        bool got;   /* its DATA arrived: the peer's lease has ended with the send */
        bool gone;  /* unpublished at its origin meanwhile: its mirror goes once it serves */
        bool done;  /* want_end() ran: once is all (a failed send may end it under its caller) */
        char name[DLX_NAME_MAX + 1]; /* the local one, "@alias/..." */
        /* the pull */
        DLManagedTensorVersioned *buf;
        ucp_mem_h memh;
        void *req;
        uint64_t lease, version, length;
        uint64_t covers; /* the highest version whose waiters it answers (>= min_version) */
        /* a higher version wanted before the answer: asked for then, unless it is covered */
        uint64_t then_min;
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
        if (w->layout)
                dlxf__layout__free_unpacked(w->layout, NULL);
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
                fail_or_defer(f, w->name, w->then_min > w->covers ? w->then_min : w->covers, err,
                              msg);
        }
        /* a higher version's failure waited for this want: published, it may not be one */
        if (w->defer_min && (err < 0 || w->defer_min > w->version))
                fail_or_defer(f, w->name, w->defer_min, w->defer_err, w->defer_msg);
        if (w->req) {
                /* the get may still write into the buffer: all stays until it ends */
                w->ended = true;
                ucp_request_cancel(f->worker, w->req);
                return;
        }
        want_free(w);
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
                if (min_version > lower->then_min)
                        lower->then_min = min_version;
                return;
        }
        w = calloc(1, sizeof(*w));
        if (!w) {
                fail_or_defer(f, name, min_version, -ENOMEM, "dlxfed: out of memory");
                return;
        }
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

/*
 * The bytes are here: the mirror goes up, keeping the origin's version.
 * Where this host still holds copies of a higher version of a name that has
 * none current, the origin numbered the name anew (it was unpublished there
 * and published again, and its dlxd kept no number): the mirror goes up as
 * this host's next version, as versions here never go down; its origin
 * still says which version of the origin's it is.
 */
static void publish_mirror(struct want *w)
{
        struct fed *f = w->f;
        struct mbuf *mb = calloc(1, sizeof(*mb));
        DLManagedTensorVersioned *t;
        struct dlx_info in;
        char origin[128];
        uint64_t v = 0;
        int err;

        w->got = true;
        if (!mb) {
                want_end(w, -ENOMEM, "dlxfed: out of memory");
                return;
        }
        mb->buf = w->buf;
        mb->refs = 1; /* ours, while publishing */
        w->buf = NULL;
        snprintf(origin, sizeof(origin), "ucx %s \xe2\x86\x90 %s v%llu", w->c->transport,
                 w->p->alias, (unsigned long long)w->version);
        struct dlx_publish_options o = {
                .copy = DLX_COPY_NEVER, .origin_version = w->version, .origin = origin};
        t = mirror_tensor(mb, w->layout);
        err = t ? dlx_publish(f->dlx, w->name, t, &o, &v) : -ENOMEM;
        if (err == -EEXIST && dlx_stat(f->dlx, w->name, &in) == -ENOENT) {
                o.origin_version = 0;
                t = mirror_tensor(mb, w->layout);
                err = t ? dlx_publish(f->dlx, w->name, t, &o, &v) : -ENOMEM;
                if (err == 0)
                        fed_log(FED_NOTICE,
                                "%s: %s numbered it anew, and copies of a higher version are "
                                "held here: its v%llu is v%llu here",
                                w->name, w->p->alias, (unsigned long long)w->version,
                                (unsigned long long)v);
        }
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
        fed_log(FED_INFO, "%s v%llu: %llu bytes from %s", w->name, (unsigned long long)w->version,
                (unsigned long long)w->length, w->p->alias);
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
                char name[DLX_NAME_MAX + 1];
                uint64_t then = w->then_min;
                memcpy(name, w->name, sizeof(name));
                want_end(w, 0, NULL);
                if (then)
                        fed_import_wanted(u->f, name, then);
                return true;
        }
        return false;
}

static int layout_ok(const Dlxf__Layout *l, uint64_t length, const char **why)
{
        DLDataType dt;
        int64_t lo, hi;

        if (l->n_shape != l->n_strides || l->n_shape > DLX_MAX_NDIM || l->code > 255 ||
            l->bits > 255 || l->lanes > 65535) {
                *why = "a malformed layout";
                return -EPROTO;
        }
        dt = (DLDataType){
                .code = (uint8_t)l->code, .bits = (uint8_t)l->bits, .lanes = (uint16_t)l->lanes};
        if (layout_extent(dt, (int32_t)l->n_shape, l->shape, l->strides, l->byte_offset, l->flags,
                          &lo, &hi, why) < 0)
                return -EPROTO;
        if (lo < 0 || (uint64_t)hi > length) {
                *why = "a layout past the bytes it describes";
                return -EPROTO;
        }
        return 0;
}

void fed_import_describe(struct conn *c, const void *buf, size_t len)
{
        struct fed *f = c->fed;
        Dlxf__Describe *d = dlxf__describe__unpack(NULL, len, buf);
        const char *why = NULL;
        struct want *w;
        ucs_status_t s;
        int err;

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
        w->layout = d->layout;
        d->layout = NULL; /* ours now: freed on its own */
        if (w->version < w->min_version)
                why = "a version older than the one asked for";
        if (!w->layout || why || (err = layout_ok(w->layout, w->length, &why)) < 0 ||
            w->version == 0) {
                dlxf__describe__free_unpacked(d, NULL);
                want_end(w, -EPROTO, "peer %s described '%s' wrongly: %s", w->p->alias, w->name,
                         why ? why : "no layout or version");
                return;
        }
        if (ride_along(w)) {
                dlxf__describe__free_unpacked(d, NULL);
                return;
        }
        if (w->then_min) {
                /* what was wanted meanwhile: covered by what comes, or asked for now */
                uint64_t then = w->then_min;
                w->then_min = 0;
                if (then <= w->version) {
                        if (then > w->covers)
                                w->covers = then;
                } else {
                        fed_import_wanted(f, w->name, then);
                }
        }
        /* the bytes land in shared memory of this host, where the mirror will be */
        int64_t n = (int64_t)(w->length ? w->length : 1);
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = &n};
        err = dlx_alloc(f->dlx, &proto, &w->buf);
        if (err < 0) {
                dlxf__describe__free_unpacked(d, NULL);
                want_end(w, err, "no room for '%s' (%llu bytes) on this host: %s", w->name,
                         (unsigned long long)w->length, dlx_last_error());
                return;
        }
        if (d->inline_) {
                /* a small one: its bytes are here, and the peer holds nothing for it */
                w->lease = 0;
                if (d->data.len != w->length) {
                        dlxf__describe__free_unpacked(d, NULL);
                        want_end(w, -EPROTO, "peer %s sent %zu bytes of '%s', not %llu",
                                 w->p->alias, d->data.len, w->name, (unsigned long long)w->length);
                        return;
                }
                if (w->length)
                        memcpy(w->buf->dl_tensor.data, d->data.data, w->length);
                dlxf__describe__free_unpacked(d, NULL);
                publish_mirror(w);
                return;
        }
        dlxf__describe__free_unpacked(d, NULL);
        if (w->length == 0)
                return; /* its DATA is empty: nothing to register */
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                   .address = w->buf->dl_tensor.data,
                                   .length = w->length};
        s = ucp_mem_map(f->ctx, &mp, &w->memh);
        if (s != UCS_OK)
                want_end(w, -EIO, "cannot register room for '%s' from peer %s: %s", w->name,
                         w->p->alias, ucs_status_string(s));
        /* the DATA follows */
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
        if (!w || !w->pulling || w->req || !w->buf) {
                /* a want given up meanwhile: the bytes are dropped, the sender's lease ends */
                return UCS_OK;
        }
        if (length != w->length) {
                want_end(w, -EPROTO, "peer %s sent %zu bytes of '%s', not %llu", w->p->alias,
                         length, w->name, (unsigned long long)w->length);
                return UCS_OK;
        }
        if (!rndv) {
                memcpy(w->buf->dl_tensor.data, data, length);
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
        void *r = ucp_am_recv_data_nbx(f->worker, data, w->buf->dl_tensor.data, length, &p);
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

void fed_import_stop(struct fed *f)
{
        while (!list_empty(&f->wants))
                want_end(list_entry(f->wants.next, struct want, link), -ESHUTDOWN,
                         "dlxfed is stopping");
}
