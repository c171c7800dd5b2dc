/* SPDX-License-Identifier: MIT */
/*
 * A producer waiting for its readers: dlx_wait_released(). The reader in
 * client.c records each RELEASED the daemon sends (client->released, the
 * last RELEASED_KEPT versions); this file waits, through the same reader,
 * until the asked-for version is among them, then orders the caller's stream
 * after the readers' CUDA release events.
 */
#include <errno.h>
#include <string.h>

#include "gpu.h"
#include "internal.h"
#include "layout.h"

static struct released *find_released(dlx_client *c, const char *name, uint64_t version)
{
        for (int i = 0; i < RELEASED_KEPT; i++) {
                struct released *r = &c->released[i];
                if (r->version == version && strcmp(r->name, name) == 0)
                        return r;
        }
        return NULL;
}

/* A tensor of ours under name that may be this version (its publish reply may not be in). */
static bool still_held(dlx_client *c, const char *name, uint64_t version)
{
        for (struct avl_node *n = avl_first(&c->held); n; n = avl_next(n)) {
                struct held *h = avl_entry(n, struct held, node);
                if ((h->version == version || h->version == 0) && strcmp(h->name, name) == 0)
                        return true;
        }
        return false;
}

static int held_wait_released(dlx_client *c, const char *name, uint64_t version, void *stream,
                              int64_t timeout_ms)
{
        int64_t deadline = timeout_ms > 0 ? dlx__deadline_ms(timeout_ms) : 0;
        struct released *r;
        const char *why;
        int err = 0;

        if (!c || !name || version == 0)
                return dlx__fail(-EINVAL, "NULL client or name, or version 0");
        if (layout_name_check(name, strlen(name), &why) < 0)
                return dlx__fail(-EINVAL, "bad name '%s': %s", DLX_QUOTED(name), why);
        if ((err = dlx__usable(c)) < 0)
                return err;
        pthread_mutex_lock(&c->lock);
        while (!(r = find_released(c, name, version))) {
                int64_t left = -1;

                /* a client closed (or broken) meanwhile holds nothing any more */
                if (c->closed || c->broken)
                        return dlx__fail_unlock(c, c->broken ? c->broken : -ECONNRESET);
                if (!still_held(c, name, version)) {
                        pthread_mutex_unlock(&c->lock);
                        return dlx__fail(-ENOENT,
                                         "'%s' v%llu is not a version this client published, "
                                         "or was released long ago",
                                         name, (unsigned long long)version);
                }
                if (timeout_ms == 0) {
                        /* no waiting, but a RELEASED already sent must still be read */
                        err = c->reading ? -ETIMEDOUT : dlx__pump(c, 0);
                        if (err == 0 && !find_released(c, name, version))
                                err = -ETIMEDOUT;
                        if (err == 0)
                                continue;
                } else if (timeout_ms > 0 && (left = deadline - dlx__now_ms()) <= 0) {
                        err = -ETIMEDOUT;
                }
                if (err == 0) {
                        err = dlx__wait_step(c, timeout_ms > 0 ? deadline : -1);
                        if (c->broken)
                                return dlx__fail_unlock(c, c->broken);
                        if (err == -ETIMEDOUT && timeout_ms < 0)
                                err = 0;
                }
                if (err == -ETIMEDOUT && timeout_ms >= 0 && dlx__now_ms() < deadline)
                        err = 0;
                if (err < 0) {
                        pthread_mutex_unlock(&c->lock);
                        if (err == -ETIMEDOUT)
                                return dlx__fail(err, "'%s' v%llu is still current or still leased",
                                                 name, (unsigned long long)version);
                        return dlx__fail(err, "%s", dlx_strerror(err));
                }
        }
        if (r->device >= 0)
                err = dlx__gpu_wait_events(c, r->device,
                                           stream ? stream : dlx__gpu_stream(c, r->device),
                                           r->events, r->nevents);
        pthread_mutex_unlock(&c->lock);
        return err;
}

int dlx_wait_released(dlx_client *c, const char *name, uint64_t version, void *stream,
                      int64_t timeout_ms)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client or name, or version 0");
        return DLX_HOLDING(c, held_wait_released(c, name, version, stream, timeout_ms));
}
