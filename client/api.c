/* SPDX-License-Identifier: MIT */
/* The request/reply calls that move no tensor: unpublish, stat, list, watch, stats, ping. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "layout.h"

static int check_name(const char *name)
{
        const char *why = NULL;

        if (!name)
                return dlx__fail(-EINVAL, "NULL name");
        if (layout_name_check(name, strlen(name), &why) < 0)
                return dlx__fail(-EINVAL, "bad name '%s': %s", DLX_QUOTED(name), why);
        return 0;
}

static int check_prefix(const char *prefix)
{
        const char *why = NULL;

        if (layout_prefix_check(prefix, strlen(prefix), &why) < 0)
                return dlx__fail(-EINVAL, "bad prefix: %s", why);
        return 0;
}

/* A status-only request: returns 0 or the daemon's error. */
static int simple_call(dlx_client *c, struct wire_request *req)
{
        struct pending p;
        int err = dlx__call(c, req, -1, &p);

        dlx__pending_done(c, &p);
        return err;
}

static int held_unpublish(dlx_client *c, const char *name)
{
        struct wire_request req = {.type = WIRE_REQ_UNPUBLISH};
        int err;

        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        err = check_name(name);
        if (err < 0)
                return err;
        snprintf(req.unpublish.name, sizeof(req.unpublish.name), "%s", name);
        return simple_call(c, &req);
}

int dlx_unpublish(dlx_client *c, const char *name)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL argument");
        return DLX_HOLDING(c, held_unpublish(c, name));
}

void dlx__info_from_wire(const struct wire_info *w, struct dlx_info *info)
{
        const struct wire_tensor *t = &w->tensor;

        memset(info, 0, sizeof(*info));
        snprintf(info->name, sizeof(info->name), "%s", t->name);
        info->version = t->version;
        info->dtype = t->dtype;
        info->ndim = t->ndim;
        memcpy(info->shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
        memcpy(info->strides, t->strides, (size_t)t->ndim * sizeof(int64_t));
        info->byte_offset = t->byte_offset;
        info->device.device_type = (DLDeviceType)t->device_type;
        info->device.device_id = t->device_id;
        info->flags = t->flags;
        info->storage = storage_name(t->storage);
        info->nbytes = t->length;
        info->segment = t->segment;
        info->segment_size = w->segment_size;
        info->owner_uid = w->owner_uid;
        info->producer_pid = w->producer_pid;
        snprintf(info->producer_name, sizeof(info->producer_name), "%s", w->producer_name);
        info->persist = w->persist;
        info->leases = w->leases;
        info->live_versions = w->live_versions;
        info->members = t->members;
        info->published_ns = w->published_ns;
        snprintf(info->origin, sizeof(info->origin), "%s", w->origin);
}

int dlx__publish_opts(dlx_client *c, struct wire_request *req, const struct dlx_publish_options *o)
{
        req->publish.persist = o->persist;
        if (!o->origin_version && !o->origin)
                return 0;
        if (c->server_minor < 5)
                return dlx__fail(-ENOTSUP,
                                 "publish '%s': a mirror's origin needs protocol 1.5; the daemon "
                                 "speaks 1.%u",
                                 req->publish.tensor.name, c->server_minor);
        if (o->origin &&
            (strlen(o->origin) >= sizeof(req->publish.origin) || !wire_text_valid(o->origin)))
                return dlx__fail(-EINVAL,
                                 "publish '%s': an origin is printable and at most %zu bytes",
                                 req->publish.tensor.name, sizeof(req->publish.origin) - 1);
        req->publish.origin_version = o->origin_version;
        wire_strcpy(req->publish.origin, sizeof(req->publish.origin), o->origin ? o->origin : "");
        return 0;
}

static int held_mount(dlx_client *c, const char *prefix)
{
        struct wire_request req = {.type = WIRE_REQ_MOUNT};
        const char *why = NULL;

        if (!prefix)
                return dlx__fail(-EINVAL, "NULL prefix");
        if (strlen(prefix) >= sizeof(req.mount.prefix) || wire_mount_check(prefix, &why) < 0)
                return dlx__fail(-EINVAL, "mount: bad prefix: %s",
                                 why ? why : "longer than 255 bytes");
        if (c->server_minor < 5)
                return dlx__fail(-ENOTSUP, "mount needs protocol 1.5; the daemon speaks 1.%u",
                                 c->server_minor);
        wire_strcpy(req.mount.prefix, sizeof(req.mount.prefix), prefix);
        return simple_call(c, &req);
}

int dlx_mount(dlx_client *c, const char *prefix)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_mount(c, prefix));
}

static int held_fetch_failed(dlx_client *c, const char *name, uint64_t min_version, int err,
                             const char *message)
{
        struct wire_request req = {.type = WIRE_REQ_FETCH_FAILED};
        int e = check_name(name);

        if (e < 0)
                return e;
        if (!wire_errno_carried(err))
                return dlx__fail(-EINVAL,
                                 "fetch-failed '%s': err %d is not an errno a waiter can be told "
                                 "(dlx.h lists them)",
                                 name, err);
        if (message &&
            (strlen(message) >= sizeof(req.fetch_failed.error) || !wire_text_valid(message)))
                return dlx__fail(-EINVAL,
                                 "fetch-failed '%s': a message is printable and at most %zu bytes",
                                 name, sizeof(req.fetch_failed.error) - 1);
        if (c->server_minor < 5)
                return dlx__fail(-ENOTSUP,
                                 "fetch-failed needs protocol 1.5; the daemon speaks 1.%u",
                                 c->server_minor);
        wire_strcpy(req.fetch_failed.name, sizeof(req.fetch_failed.name), name);
        req.fetch_failed.min_version = min_version;
        req.fetch_failed.status = (int)wire_errno_status(err);
        wire_strcpy(req.fetch_failed.error, sizeof(req.fetch_failed.error), message ? message : "");
        return simple_call(c, &req);
}

int dlx_fetch_failed(dlx_client *c, const char *name, uint64_t min_version, int err,
                     const char *message)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_fetch_failed(c, name, min_version, err, message));
}

static int held_stat(dlx_client *c, const char *name, struct dlx_info *ret_info)
{
        struct wire_request req = {.type = WIRE_REQ_STAT};
        struct pending p;
        int err;

        if (!c || !ret_info)
                return dlx__fail(-EINVAL, "NULL argument");
        err = check_name(name);
        if (err < 0)
                return err;
        snprintf(req.stat.name, sizeof(req.stat.name), "%s", name);
        err = dlx__call(c, &req, -1, &p);
        if (err == 0 && p.rep.type != WIRE_REP_STAT)
                err = dlx__fail(-EPROTO, "the daemon answered stat with something else");
        if (err == 0)
                dlx__info_from_wire(&p.rep.stat.info, ret_info);
        dlx__pending_done(c, &p);
        return err;
}

int dlx_stat(dlx_client *c, const char *name, struct dlx_info *ret_info)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL argument");
        return DLX_HOLDING(c, held_stat(c, name, ret_info));
}

static int held_list(dlx_client *c, const char *prefix, dlx_list_fn fn, void *ctx)
{
        struct wire_request req = {.type = WIRE_REQ_LIST};
        struct dlx_info info;
        int err, visited = 0;

        if (!c || !fn)
                return dlx__fail(-EINVAL, "NULL argument");
        if (!prefix)
                prefix = "";
        err = check_prefix(prefix);
        if (err < 0)
                return err;
        snprintf(req.list.prefix, sizeof(req.list.prefix), "%s", prefix);
        for (;;) {
                struct pending p;
                bool stop = false;

                err = dlx__call(c, &req, -1, &p);
                if (err == 0 && p.rep.type != WIRE_REP_LIST)
                        err = dlx__fail(-EPROTO, "the daemon answered list with something else");
                if (err < 0) {
                        dlx__pending_done(c, &p);
                        return err;
                }
                for (uint32_t i = 0; i < p.rep.list.count && !stop; i++) {
                        dlx__info_from_wire(&p.rep.list.entries[i], &info);
                        visited++;
                        stop = fn(ctx, &info) != 0;
                }
                /* the cursor must move forward, or a confused daemon could loop us */
                if (stop || !p.rep.list.next[0] || strcmp(p.rep.list.next, req.list.after) <= 0) {
                        dlx__pending_done(c, &p);
                        return visited;
                }
                snprintf(req.list.after, sizeof(req.list.after), "%s", p.rep.list.next);
                dlx__pending_done(c, &p);
        }
}

int dlx_list(dlx_client *c, const char *prefix, dlx_list_fn fn, void *ctx)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL argument");
        return DLX_HOLDING(c, held_list(c, prefix, fn, ctx));
}

static int held_watch(dlx_client *c, const char *prefix, uint64_t *ret_watch)
{
        struct wire_request req = {.type = WIRE_REQ_WATCH};
        struct pending p;
        int err;

        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        if (!prefix)
                prefix = "";
        err = check_prefix(prefix);
        if (err < 0)
                return err;
        snprintf(req.watch.prefix, sizeof(req.watch.prefix), "%s", prefix);
        err = dlx__call(c, &req, -1, &p);
        if (err == 0 && p.rep.type != WIRE_REP_WATCH)
                err = dlx__fail(-EPROTO, "the daemon answered watch with something else");
        if (err == 0 && ret_watch)
                *ret_watch = p.rep.watch.watch;
        dlx__pending_done(c, &p);
        return err;
}

int dlx_watch(dlx_client *c, const char *prefix, uint64_t *ret_watch)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL argument");
        return DLX_HOLDING(c, held_watch(c, prefix, ret_watch));
}

static int held_unwatch(dlx_client *c, uint64_t watch)
{
        struct wire_request req = {.type = WIRE_REQ_UNWATCH};

        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        req.unwatch.watch = watch;
        return simple_call(c, &req);
}

int dlx_unwatch(dlx_client *c, uint64_t watch)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_unwatch(c, watch));
}

static int held_stats(dlx_client *c, struct dlx_stats *ret_stats)
{
        struct wire_request req = {.type = WIRE_REQ_STATS};
        struct pending p;
        int err;

        if (!c || !ret_stats)
                return dlx__fail(-EINVAL, "NULL argument");
        err = dlx__call(c, &req, -1, &p);
        if (err == 0 && p.rep.type != WIRE_REP_STATS)
                err = dlx__fail(-EPROTO, "the daemon answered stats with something else");
        if (err == 0) {
                const struct wire_stats *s = &p.rep.stats;
                ret_stats->names = s->names;
                ret_stats->versions = s->versions;
                ret_stats->leases = s->leases;
                ret_stats->segments = s->segments;
                ret_stats->bytes = s->bytes;
                ret_stats->max_bytes = s->max_bytes;
                ret_stats->clients = s->clients;
                ret_stats->max_clients = s->max_clients;
                ret_stats->watchers = s->watchers;
                ret_stats->uptime_ms = s->uptime_ms;
                ret_stats->requests = s->requests;
                ret_stats->publishes = s->publishes;
                ret_stats->acquires = s->acquires;
                ret_stats->limits = (struct dlx_limits){
                        .max_clients = s->limits.max_clients,
                        .max_clients_per_uid = s->limits.max_clients_per_uid,
                        .max_bytes = s->limits.max_bytes,
                        .max_bytes_per_uid = s->limits.max_bytes_per_uid,
                        .max_names = s->limits.max_names,
                        .max_names_per_uid = s->limits.max_names_per_uid,
                        .max_leases = s->limits.max_leases,
                        .max_watches = s->limits.max_watches,
                        .max_queued = s->limits.max_queued,
                        .timeout_ms = s->limits.timeout_ms,
                        .max_fds = s->limits.max_fds,
                        .max_fds_per_uid = s->limits.max_fds_per_uid,
                        .max_group_members = s->limits.max_group_members,
                        .max_group_table = s->limits.max_group_table,
                };
                ret_stats->uid = s->uid;
                ret_stats->uid_clients = s->uid_clients;
                ret_stats->uid_bytes = s->uid_bytes;
                ret_stats->uid_names = s->uid_names;
                ret_stats->fds = s->fds;
                ret_stats->uid_fds = s->uid_fds;
                ret_stats->queued = s->queued;
                ret_stats->uid_queued = s->uid_queued;
        }
        dlx__pending_done(c, &p);
        return err;
}

int dlx_stats(dlx_client *c, struct dlx_stats *ret_stats)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL argument");
        return DLX_HOLDING(c, held_stats(c, ret_stats));
}

static int held_metrics(dlx_client *c, char **ret_text)
{
        struct wire_request req = {.type = WIRE_REQ_METRICS};
        struct pending p;
        int err;

        if (c->server_minor < 6)
                return dlx__fail(-ENOTSUP, "the daemon speaks protocol 1.%u; metrics need 1.6",
                                 c->server_minor);
        err = dlx__call(c, &req, -1, &p);
        if (err == 0 && p.rep.type != WIRE_REP_METRICS)
                err = dlx__fail(-EPROTO, "the daemon answered metrics with something else");
        if (err == 0) {
                *ret_text = p.rep.metrics.text;
                p.rep.metrics.text = NULL;
                p.rep.metrics.len = 0;
        }
        dlx__pending_done(c, &p);
        return err;
}

int dlx_metrics(dlx_client *c, char **ret_text)
{
        if (!c || !ret_text)
                return dlx__fail(-EINVAL, "NULL argument");
        *ret_text = NULL;
        return DLX_HOLDING(c, held_metrics(c, ret_text));
}

static int held_ping(dlx_client *c)
{
        struct wire_request req = {.type = WIRE_REQ_PING};

        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        req.ping.nonce = 0x646c78;
        return simple_call(c, &req);
}

int dlx_ping(dlx_client *c)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_ping(c));
}
