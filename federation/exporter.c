/* SPDX-License-Identifier: MIT */
/*
 * What peers take from this host. A Lookup of an exported name is served
 * from a real dlx lease, taken for the whole transfer: a replace or an
 * unpublish meanwhile changes nothing the peer reads. The version's bytes
 * are registered with UCX for that lease alone and sent as one DATA message
 * (UCX's rendezvous protocol for all but small ones, which go eagerly in
 * one round trip); the lease ends when UCX says the send is over: delivered,
 * or failed with the endpoint (its peer died, or --lease-ms passed and the
 * endpoint was closed). Only read-only CPU versions of exported names
 * leave; nothing under '@' is ever exported again. A group (protocol 1.2)
 * goes as one: one group lease, one Describe naming its members, and the
 * span of memory its members lie in as one DATA.
 *
 * Why not a get: UCX 1.13 serves a get over TCP in software, from this
 * process's worker, and aborts the process (ucs_fatal) when the peer's
 * socket fails while it sends the reply. A dying importer must never take
 * the exporter with it. A send is a request of ours, and fails
 * as one; with RDMA, the importer's NIC reads the registered bytes itself.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fed.h"
#include "fed.pb-c.h"
#include "layout.h"

/* What a lease holds: a tensor, or a group. */
struct hold {
        DLManagedTensorVersioned *t;
        dlx_group *g;
};

static void hold_drop(struct hold *h)
{
        if (h->t)
                h->t->deleter(h->t);
        dlx_group_release(h->g);
        *h = (struct hold){0};
}

struct rlease {
        struct list link; /* in fed.leases */
        struct fed *f;
        struct conn *c;
        uint64_t id;
        struct hold h;
        ucp_mem_h memh;
        uint64_t header; /* the DATA's: the lookup's id */
        bool sending;    /* UCX has the send: the lease ends in its callback */
        uv_timer_t deadline;
};

/* A lookup waiting on the thread pool for its version. */
struct waiting {
        uv_work_t work;
        struct fed *f;
        struct conn *c; /* NULL once its endpoint is gone */
        struct list link;
        uint64_t id, min_version;
        uint32_t wait_ms;
        char name[DLX_NAME_MAX + 1];
        bool groups; /* the peer takes groups */
        struct hold h;
        int err;
        char error[256];
};

bool fed_exported(const struct fed *f, const char *name)
{
        if (name[0] == '@')
                return false;
        for (unsigned i = 0; i < f->cfg.nexports; i++)
                if (strncmp(name, f->cfg.exports[i], strlen(f->cfg.exports[i])) == 0)
                        return true;
        return false;
}

static void describe_error(struct conn *c, uint64_t id, int err, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

static void describe_error(struct conn *c, uint64_t id, int err, const char *fmt, ...)
{
        Dlxf__Describe d = DLXF__DESCRIBE__INIT;
        char msg[256];
        uint8_t buf[400];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        d.id = id;
        d.errnum = err < 0 ? -err : err;
        d.error = msg;
        fed_send(c, FED_AM_DESCRIBE, buf, dlxf__describe__pack(&d, buf));
}

/* A lookup dlxd refused: err and its message, a group said as what it is. */
static void lookup_failed(struct conn *c, uint64_t id, const char *name, int err, const char *msg)
{
        struct dlx_info in;

        /* device memory this host cannot map (no CUDA driver, say) is refused as device memory */
        if (err != -ENOENT && err != -ETIMEDOUT && err != -EAGAIN &&
            dlx_stat(c->fed->dlx, name, &in) == 0 && in.device.device_type != kDLCPU)
                describe_error(c, id, ENOTSUP,
                               "'%s' on %s is in device memory (%s): only CPU %s travel yet", name,
                               c->fed->cfg.alias, in.storage, in.members ? "groups" : "tensors");
        else if (err == -EISDIR)
                describe_error(c, id, ENOTSUP,
                               "'%s' on %s is a group: groups cross hosts from protocol 1.2, "
                               "and this link speaks 1.%u",
                               name, c->fed->cfg.alias, (unsigned)fed_minor(c));
        else
                describe_error(c, id, err, "%s", msg);
}

/*
 * A version of name at o's min_version, as a tensor or (groups) as a group,
 * waiting as o says. A name may turn from one to the other between two
 * calls: asked again then, a few times.
 */
static int acquire_any(dlx_client *dlx, const char *name, const struct dlx_acquire_options *o,
                       bool groups, struct hold *h)
{
        int err = -EAGAIN;

        for (int tries = 0; tries < 4; tries++) {
                err = dlx_acquire(dlx, name, o, &h->t);
                if (err != -EISDIR || !groups)
                        return err;
                err = dlx_acquire_group(dlx, name, NULL, 0, o, &h->g);
                if (err != -ENOTDIR)
                        return err;
        }
        return err;
}

static void lease_closed(uv_handle_t *h)
{
        free(h->data);
}

static void lease_end(struct rlease *l)
{
        list_remove(&l->link);
        if (l->memh)
                ucp_mem_unmap(l->f->ctx, l->memh);
        hold_drop(&l->h);
        uv_timer_stop(&l->deadline);
        uv_close((uv_handle_t *)&l->deadline, lease_closed);
}

static void on_deadline(uv_timer_t *t)
{
        struct rlease *l = t->data;

        if (!l->c)
                return;
        fed_log(FED_WARN, "%s: lease %llu past its deadline: the peer's endpoint goes", l->c->who,
                (unsigned long long)l->id);
        /* the send fails with the endpoint, and its callback ends the lease */
        fed_close(l->c, "a remote lease past its deadline");
}

static void on_data_sent(void *req, ucs_status_t status, void *arg)
{
        struct rlease *l = arg;

        ucp_request_free(req);
        l->sending = false;
        if (status != UCS_OK)
                fed_log(FED_NOTICE, "lease %llu: the transfer failed: %s",
                        (unsigned long long)l->id, ucs_status_string(status));
        lease_end(l);
}

/* The bytes of l go to c as DATA; the lease ends once they have (or could not). */
static void send_data(struct conn *c, struct rlease *l, const void *start, size_t length)
{
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                 UCP_OP_ATTR_FIELD_USER_DATA |
                                                 UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_AM_SEND_FLAG_REPLY,
                                 .cb.send = on_data_sent,
                                 .user_data = l};
        void *r;

        if (l->memh) {
                p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
                p.memh = l->memh;
        }
        r = ucp_am_send_nbx(c->ep, FED_AM_DATA, &l->header, sizeof(l->header), start, length, &p);
        if (r == NULL) {
                lease_end(l);
        } else if (UCS_PTR_IS_ERR(r)) {
                fed_log(FED_NOTICE, "%s: lease %llu: cannot send: %s", c->who,
                        (unsigned long long)l->id, ucs_status_string(UCS_PTR_STATUS(r)));
                lease_end(l);
        } else {
                l->sending = true;
        }
}

/*
 * d's layout (flags: its DLPack flags), element 0 at byte_offset from the
 * extent's first byte; strides: room for ndim.
 */
static void describe_layout(const DLTensor *d, uint64_t flags, uint64_t byte_offset,
                            Dlxf__Layout *lay, int64_t *strides)
{
        if (d->strides)
                memcpy(strides, d->strides, (size_t)d->ndim * sizeof(int64_t));
        else
                layout_compact_strides(d->ndim, d->shape, strides);
        lay->code = d->dtype.code;
        lay->bits = d->dtype.bits;
        lay->lanes = d->dtype.lanes;
        lay->n_shape = lay->n_strides = (size_t)d->ndim;
        lay->shape = d->shape;
        lay->strides = strides;
        lay->byte_offset = byte_offset;
        lay->flags = flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
}

/* desc packed into a buffer of its own (free() it), *ret_len bytes; NULL: -E2BIG or -ENOMEM. */
static uint8_t *describe_pack(const Dlxf__Describe *desc, size_t *ret_len, int *ret_err)
{
        size_t size = dlxf__describe__get_packed_size(desc);
        uint8_t *buf = size <= FED_DESCRIBE_MAX ? malloc(size) : NULL;

        if (!buf) {
                *ret_err = size > FED_DESCRIBE_MAX ? -E2BIG : -ENOMEM;
                return NULL;
        }
        dlxf__describe__pack(desc, buf);
        *ret_len = size;
        return buf;
}

/* The answer to a lookup: packed and sent, or -ENOMEM / -E2BIG. */
static int describe_send(struct conn *c, const Dlxf__Describe *desc)
{
        size_t size = 0;
        int err = 0;
        uint8_t *buf = describe_pack(desc, &size, &err);

        if (!buf)
                return err;
        fed_send(c, FED_AM_DESCRIBE, buf, size);
        free(buf);
        return 0;
}

/* desc carries the bytes at start itself (desc->length of them): a small version's. */
static void describe_inline(Dlxf__Describe *desc, const uint8_t *start)
{
        desc->inline_ = true;
        desc->data.data = (uint8_t *)start;
        desc->data.len = (size_t)desc->length;
}

static void count_served(struct conn *c, uint64_t bytes)
{
        c->fed->exports_served++;
        c->fed->bytes_out += bytes;
        c->served++;
        c->bytes_out += bytes;
}

/*
 * Sends desc (its version and layout or members filled in) and the bytes
 * [start, start + desc->length) it describes, held by h (ownership taken):
 * inside the Describe when small, else as DATA under a lease of their own.
 */
static void serve_bytes(struct conn *c, uint64_t id, Dlxf__Describe *desc, struct hold *h,
                        const uint8_t *start)
{
        struct fed *f = c->fed;
        struct rlease *l;
        int err;

        desc->id = id;
        if (desc->length <= FED_INLINE_MAX) {
                /* a small one: one message, and no lease held */
                describe_inline(desc, start);
                err = describe_send(c, desc);
                if (err == 0)
                        count_served(c, desc->length);
                goto out;
        }
        l = calloc(1, sizeof(*l));
        if (!l) {
                err = -ENOMEM;
                goto out;
        }
        /*
         * Read-only: what a lease maps is (a sealed memfd, mapped PROT_READ),
         * and an RDMA registration that asks for no write access pins such
         * pages; the peer's NIC only reads them.
         */
        ucp_mem_map_params_t mp = {
                .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                              UCP_MEM_MAP_PARAM_FIELD_PROT | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
                .address = (void *)start,
                .length = (size_t)desc->length,
                .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ,
                .memory_type = UCS_MEMORY_TYPE_HOST};
        ucs_status_t s = ucp_mem_map(f->ctx, &mp, &l->memh);
        if (s != UCS_OK) {
                if (l->memh)
                        ucp_mem_unmap(f->ctx, l->memh);
                free(l);
                describe_error(c, id, EIO, "cannot register it with UCX: %s", ucs_status_string(s));
                hold_drop(h);
                return;
        }
        l->f = f;
        l->c = c;
        l->h = *h;
        *h = (struct hold){0};
        l->id = ++f->next_lease;
        l->header = id;
        desc->lease = l->id;
        desc->deadline_ms = f->cfg.lease_ms;
        uv_timer_init(f->loop, &l->deadline);
        l->deadline.data = l;
        uv_timer_start(&l->deadline, on_deadline, f->cfg.lease_ms, 0);
        list_insert_tail(&f->leases, &l->link);
        err = describe_send(c, desc);
        if (err < 0) {
                lease_end(l);
                goto out;
        }
        count_served(c, desc->length);
        fed_log(FED_INFO, "%s: lease %llu on v%llu (%llu bytes%s)", c->who,
                (unsigned long long)l->id, (unsigned long long)desc->version,
                (unsigned long long)desc->length, desc->n_members ? ", a group" : "");
        send_data(c, l, start, (size_t)desc->length);
        return;
out:
        if (err == -E2BIG)
                describe_error(c, id, E2BIG,
                               "its description is over the %u bytes one message may hold",
                               FED_DESCRIBE_MAX);
        else if (err < 0)
                describe_error(c, id, ENOMEM, "out of memory");
        hold_drop(h);
}

/*
 * desc's version, layout (lay, strides: room for DLX_MAX_NDIM) and length
 * for t, and the first byte of its extent in *start. 0, or a positive
 * errno and why in msg: what federation does not export.
 */
static int describe_tensor(const DLManagedTensorVersioned *t, Dlxf__Describe *desc,
                           Dlxf__Layout *lay, int64_t *strides, const uint8_t **start, char *msg,
                           size_t msglen)
{
        const DLTensor *d = &t->dl_tensor;
        int64_t lo = 0, hi = 0;
        const char *why = NULL;

        dlx_tensor_info(t, NULL, &desc->version, NULL);
        if (!(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY)) {
                snprintf(msg, msglen, "federation exports read-only versions only");
                return ENOTSUP;
        }
        if (d->device.device_type != kDLCPU) {
                snprintf(msg, msglen, "device %d: only CPU tensors travel yet",
                         (int)d->device.device_type);
                return ENOTSUP;
        }
        if (layout_extent(d->dtype, d->ndim, d->shape, d->strides, d->byte_offset, t->flags, &lo,
                          &hi, &why) < 0) {
                snprintf(msg, msglen, "its layout: %s", why);
                return EINVAL;
        }
        describe_layout(d, t->flags, (uint64_t)((int64_t)d->byte_offset - lo), lay, strides);
        desc->layout = lay;
        desc->length = (uint64_t)(hi - lo);
        *start = (const uint8_t *)d->data + lo;
        return 0;
}

/* Serves an acquired version (ownership taken) to c as the answer to id. */
static void serve(struct conn *c, uint64_t id, struct hold *h)
{
        Dlxf__Describe desc = DLXF__DESCRIBE__INIT;
        Dlxf__Layout lay = DLXF__LAYOUT__INIT;
        int64_t strides[DLX_MAX_NDIM];
        const uint8_t *start = NULL;
        char msg[200];
        int err = describe_tensor(h->t, &desc, &lay, strides, &start, msg, sizeof(msg));

        if (err) {
                describe_error(c, id, err, "%s", msg);
                hold_drop(h);
                return;
        }
        serve_bytes(c, id, &desc, h, start);
}

uint8_t *fed_export_offer(struct conn *c, const char *name, uint64_t version, size_t *ret_len,
                          bool *ret_stale)
{
        struct dlx_acquire_options o = {.min_version = version, .timeout_ms = 0};
        Dlxf__Describe desc = DLXF__DESCRIBE__INIT;
        Dlxf__Layout lay = DLXF__LAYOUT__INIT;
        DLManagedTensorVersioned *t = NULL;
        int64_t strides[DLX_MAX_NDIM];
        const uint8_t *start = NULL;
        uint8_t *buf = NULL;
        char msg[200];

        *ret_stale = false;
        if (dlx_acquire(c->fed->dlx, name, &o, &t) < 0)
                return NULL; /* a group, or gone already: the client asks */
        /* news read late: a newer version's news is on its way, and carries it */
        if (dlx_tensor_info(t, NULL, &desc.version, NULL) == 0 && desc.version > version) {
                *ret_stale = true;
                t->deleter(t);
                return NULL;
        }
        if (describe_tensor(t, &desc, &lay, strides, &start, msg, sizeof(msg)) == 0 &&
            desc.length <= FED_INLINE_MAX) {
                int err = 0;
                describe_inline(&desc, start);
                buf = describe_pack(&desc, ret_len, &err);
                if (buf)
                        count_served(c, desc.length);
        }
        t->deleter(t);
        return buf;
}

/*
 * Member i's DLPack flags, which a DLTensor does not carry: whether a
 * sub-byte member is padded (a byte per element) decides its layout.
 */
static uint64_t member_flags(dlx_group *g, size_t i)
{
        DLManagedTensorVersioned *t;
        uint64_t flags;

        if (dlx_group_tensor(g, i)->dtype.bits >= 8 || dlx_group_take(g, i, &t) < 0)
                return 0;
        flags = t->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
        t->deleter(t);
        return flags;
}

/*
 * Serves an acquired group (ownership taken): its members' layouts, relative
 * to the first byte of the span of memory they lie in (one mapping), and
 * that span as one DATA.
 */
static void serve_group(struct conn *c, uint64_t id, struct hold *h)
{
        dlx_group *g = h->g;
        size_t n = dlx_group_count(g);
        Dlxf__Describe desc = DLXF__DESCRIBE__INIT;
        Dlxf__Member *ms = calloc(n, sizeof(*ms));
        Dlxf__Member **mp = calloc(n, sizeof(*mp));
        Dlxf__Layout *lays = calloc(n, sizeof(*lays));
        int64_t *strides = calloc(n * DLX_MAX_NDIM + 1, sizeof(int64_t));
        int64_t *los = calloc(n + 1, sizeof(int64_t)), *his = calloc(n + 1, sizeof(int64_t));
        uint64_t *flags = calloc(n + 1, sizeof(uint64_t));
        uintptr_t start = UINTPTR_MAX, end = 0;
        const char *why = NULL;

        if (!ms || !mp || !lays || !strides || !los || !his || !flags) {
                describe_error(c, id, ENOMEM, "out of memory");
                hold_drop(h);
                goto out;
        }
        desc.version = dlx_group_version(g);
        for (size_t i = 0; i < n; i++) {
                const DLTensor *d = dlx_group_tensor(g, i);
                flags[i] = member_flags(g, i);
                if (d->device.device_type != kDLCPU) {
                        describe_error(c, id, ENOTSUP,
                                       "a device group: only CPU groups travel yet");
                        hold_drop(h);
                        goto out;
                }
                if (layout_extent(d->dtype, d->ndim, d->shape, d->strides, d->byte_offset, flags[i],
                                  &los[i], &his[i], &why) < 0) {
                        describe_error(c, id, EINVAL, "member '%s': %s", dlx_group_name(g, i), why);
                        hold_drop(h);
                        goto out;
                }
                if (his[i] > los[i]) {
                        uintptr_t a = (uintptr_t)d->data + (uintptr_t)los[i];
                        if (a < start)
                                start = a;
                        if (a + (uintptr_t)(his[i] - los[i]) > end)
                                end = a + (uintptr_t)(his[i] - los[i]);
                }
        }
        if (end == 0)
                start = end = 0; /* every member empty: no bytes */
        for (size_t i = 0; i < n; i++) {
                const DLTensor *d = dlx_group_tensor(g, i);
                Dlxf__Layout *lay = &lays[i];

                dlxf__layout__init(lay);
                dlxf__member__init(&ms[i]);
                /* an empty member reads nothing: its place is the extent's start */
                describe_layout(d, flags[i],
                                his[i] > los[i] ? (uintptr_t)d->data + d->byte_offset - start : 0,
                                lay, strides + i * DLX_MAX_NDIM);
                ms[i].name.data = (uint8_t *)dlx_group_name(g, i);
                ms[i].name.len = strlen(dlx_group_name(g, i));
                ms[i].layout = lay;
                mp[i] = &ms[i];
        }
        desc.n_members = n;
        desc.members = mp;
        desc.length = end - start;
        serve_bytes(c, id, &desc, h, (const uint8_t *)start);
out:
        free(ms);
        free(mp);
        free(lays);
        free(strides);
        free(los);
        free(his);
        free(flags);
}

/* Serves what was acquired for id, a tensor or a group (ownership taken). */
static void serve_held(struct conn *c, uint64_t id, struct hold *h)
{
        if (h->g)
                serve_group(c, id, h);
        else
                serve(c, id, h);
}

static void wait_work(uv_work_t *w)
{
        struct waiting *q = w->data;
        struct dlx_acquire_options o = {.min_version = q->min_version, .timeout_ms = q->wait_ms};

        q->err = acquire_any(q->f->dlx, q->name, &o, q->groups, &q->h);
        if (q->err < 0)
                snprintf(q->error, sizeof(q->error), "%s", dlx_last_error());
}

static void wait_done(uv_work_t *w, int status)
{
        struct waiting *q = w->data;

        (void)status;
        list_remove(&q->link);
        q->f->waiting--;
        if (q->c)
                q->c->waiting--;
        if (!q->c) {
                hold_drop(&q->h);
        } else if (q->err == 0) {
                serve_held(q->c, q->id, &q->h);
        } else {
                lookup_failed(q->c, q->id, q->name, q->err, q->error);
        }
        free(q);
}

void fed_export_lookup(struct conn *c, const void *buf, size_t len)
{
        struct fed *f = c->fed;
        Dlxf__Lookup *q = dlxf__lookup__unpack(NULL, len, buf);
        struct dlx_acquire_options o = {.timeout_ms = 0};
        char name[DLX_NAME_MAX + 1];
        const char *why = NULL;
        struct hold h = {0};
        bool groups = fed_minor(c) >= 2;
        uint64_t id;
        int err;

        if (!q || q->name.len == 0 || q->name.len > DLX_NAME_MAX ||
            memchr(q->name.data, 0, q->name.len)) {
                if (q)
                        dlxf__lookup__free_unpacked(q, NULL);
                fed_close(c, "a bad lookup");
                return;
        }
        id = q->id;
        memcpy(name, q->name.data, q->name.len);
        name[q->name.len] = '\0';
        o.min_version = q->min_version;
        /* the peer asks; this bridge's --wait-ms bounds it */
        uint32_t wait_ms = q->wait_ms < f->cfg.wait_ms ? q->wait_ms : f->cfg.wait_ms;
        dlxf__lookup__free_unpacked(q, NULL);
        if (layout_name_check(name, strlen(name), &why) < 0) {
                describe_error(c, id, EINVAL, "bad name: %s", why);
                return;
        }
        if (!fed_exported(f, name)) {
                /* the same answer whether or not it exists: nothing to learn */
                describe_error(c, id, ENOENT, "'%s' is not exported by %s", name, f->cfg.alias);
                return;
        }
        err = acquire_any(f->dlx, name, &o, groups, &h);
        if (err == 0) {
                serve_held(c, id, &h);
                return;
        }
        if ((err == -ENOENT || err == -ETIMEDOUT) && wait_ms > 0) {
                /* the waits take threads: none of them for ever, and no peer all of them */
                if (f->waiting >= FED_MAX_WAITING || c->waiting >= FED_MAX_WAITING_PEER) {
                        describe_error(c, id, EAGAIN,
                                       "%s: too many lookups waiting (%u from this peer, %u in "
                                       "all): ask again later",
                                       f->cfg.alias, c->waiting, f->waiting);
                        return;
                }
                struct waiting *w = calloc(1, sizeof(*w));
                if (w) {
                        w->work.data = w;
                        w->f = f;
                        w->c = c;
                        w->id = id;
                        w->min_version = o.min_version;
                        w->wait_ms = wait_ms;
                        w->groups = groups;
                        snprintf(w->name, sizeof(w->name), "%s", name);
                        list_insert_tail(&f->waitings, &w->link);
                        f->waiting++;
                        c->waiting++;
                        uv_queue_work(f->loop, &w->work, wait_work, wait_done);
                        return;
                }
        }
        char msg[300];
        snprintf(msg, sizeof(msg), "%s: %s", f->cfg.alias, dlx_last_error());
        lookup_failed(c, id, name, err, msg);
}

void fed_export_release(struct conn *c, const void *buf, size_t len)
{
        Dlxf__Release *r = dlxf__release__unpack(NULL, len, buf);
        struct list *pos;

        if (!r) {
                fed_close(c, "a bad release");
                return;
        }
        /*
         * A transfer under way cannot be called back (UCX cancels no send): it
         * ends as it ends, and its lease with it. Nothing else is held.
         */
        for (pos = c->fed->leases.next; pos != &c->fed->leases; pos = pos->next) {
                struct rlease *l = list_entry(pos, struct rlease, link);
                if (l->id == r->lease && l->c == c && !l->sending) {
                        lease_end(l);
                        break;
                }
        }
        dlxf__release__free_unpacked(r, NULL);
}

void fed_export_conn_gone(struct conn *c)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &c->fed->leases)
        {
                struct rlease *l = list_entry(pos, struct rlease, link);
                if (l->c != c)
                        continue;
                l->c = NULL;
                /* a send UCX still has ends the lease in its callback */
                if (!l->sending)
                        lease_end(l);
        }
        for (pos = c->fed->waitings.next; pos != &c->fed->waitings; pos = pos->next) {
                struct waiting *w = list_entry(pos, struct waiting, link);
                if (w->c == c)
                        w->c = NULL;
        }
        fed_export_follows_gone(c);
}

void fed_export_stop(struct fed *f)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &f->leases) lease_end(list_entry(pos, struct rlease, link));
}
