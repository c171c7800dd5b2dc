/* SPDX-License-Identifier: MIT */
/*
 * Per-uid limits on what sessions hold in the registry: clients and names,
 * and the descriptor cap as it stands for a uid. A per-uid limit left "fair"
 * is a share of what the other uids leave of the limit in all
 * (quota_uid_cap); the counts themselves live in the uid records (quota.h),
 * kept in the store.
 */
#include "quota.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "invariant.h"
#include "namespace.h"

static int cmp_uid(const void *key, const struct avl_node *n)
{
        uid_t a = *(const uid_t *)key, b = avl_entry(n, struct uid_use, node)->uid;

        return a < b ? -1 : a > b;
}

struct uid_use *quota_uid(struct store *st, uid_t uid, bool create)
{
        struct avl_node *n = avl_find(&st->uids, &uid, cmp_uid);
        struct uid_use *u;

        if (n || !create)
                return n ? avl_entry(n, struct uid_use, node) : NULL;
        u = calloc(1, sizeof(*u));
        if (!u)
                return NULL;
        u->uid = uid;
        avl_insert(&st->uids, &u->node, &u->uid, cmp_uid);
        return u;
}

static bool move64(uint64_t *x, int64_t delta)
{
        if (delta >= 0) {
                *x += (uint64_t)delta;
                return true;
        }
        return count_take(*x, 0 - (uint64_t)delta);
}

static bool move32(uint32_t *x, int64_t delta)
{
        uint64_t v = *x;
        bool ok = move64(&v, delta);

        *x = (uint32_t)v;
        return ok;
}

bool quota_count(struct uid_use *u, enum quota_count what, int64_t delta)
{
        switch (what) {
        case QUOTA_CLIENTS:
                return move32(&u->clients, delta);
        case QUOTA_NAMES:
                return move64(&u->names, delta);
        case QUOTA_BYTES:
                return move64(&u->bytes, delta);
        case QUOTA_FDS:
                return move64(&u->fds, delta);
        case QUOTA_UNREAD:
                return move32(&u->unread, delta);
        case QUOTA_QUEUED:
                return move64(&u->queued, delta);
        }
        return invariant(!"a quota count");
}

void quota_uid_put(struct store *st, struct uid_use *u)
{
        if (!u || u->clients || u->names || u->bytes || u->fds || u->unread || u->queued)
                return;
        avl_remove(&st->uids, &u->node);
        free(u);
}

/* The most clients u's uid may have connected (UINT64_MAX: no bound). */
static uint64_t clients_cap(const struct registry *reg, const struct uid_use *u)
{
        uint32_t per_uid = reg->lim.max_clients_per_uid;

        return quota_uid_cap(reg->lim.max_clients,
                             per_uid == DLX_LIMIT_FAIR32 ? DLX_LIMIT_FAIR : per_uid,
                             reg->nsessions + reg->nlingering, u->clients, QUOTA_MOST);
}

/* The most names u's uid may own (UINT64_MAX: no bound). */
static uint64_t names_cap(const struct registry *reg, const struct uid_use *u)
{
        return quota_uid_cap(reg->lim.max_names, reg->lim.max_names_per_uid, reg->nnames, u->names,
                             QUOTA_MOST);
}

static uint64_t cap_wire(uint64_t cap)
{
        return cap == UINT64_MAX ? 0 : cap;
}

void registry_limits_for(const struct session *s, struct wire_limit_set *ret)
{
        const struct registry *reg = s->reg;
        const struct store *st = reg->store;

        *ret = reg->lim;
        ret->max_clients_per_uid = (uint32_t)cap_wire(clients_cap(reg, s->use));
        ret->max_names_per_uid = cap_wire(names_cap(reg, s->use));
        ret->max_fds_per_uid = cap_wire(
                quota_uid_cap(st->max_fds, st->max_fds_per_uid, st->fds, s->use->fds, QUOTA_HALF));
}

int registry_admit(struct registry *reg, uid_t uid, char *why, size_t whysz)
{
        const struct uid_use *u = quota_uid(reg->store, uid, false);

        /* a dropped peer's socket kept for the descriptors it holds unread takes a slot too */
        if (reg->lim.max_clients && reg->nsessions + reg->nlingering >= reg->lim.max_clients) {
                snprintf(why, whysz, "too many clients (limit %u)", reg->lim.max_clients);
                return -EAGAIN;
        }
        if (u && u->clients >= clients_cap(reg, u)) {
                if (reg->lim.max_clients_per_uid == DLX_LIMIT_FAIR32)
                        snprintf(why, whysz,
                                 "too many clients of uid %u (%u: its fair share, 7/8 of what "
                                 "other uids leave of %u)",
                                 (unsigned)uid, u->clients, reg->lim.max_clients);
                else
                        snprintf(why, whysz, "too many clients of uid %u (limit %u)", (unsigned)uid,
                                 reg->lim.max_clients_per_uid);
                return -EAGAIN;
        }
        return 0;
}

bool names_full(struct session *s, char *why, size_t whysz)
{
        const struct wire_limit_set *lim = &s->reg->lim;

        if (lim->max_names && s->reg->nnames >= lim->max_names) {
                snprintf(why, whysz, "the daemon holds %llu names (the limit)",
                         (unsigned long long)lim->max_names);
                return true;
        }
        if (s->use->names >= names_cap(s->reg, s->use)) {
                if (lim->max_names_per_uid == DLX_LIMIT_FAIR)
                        snprintf(why, whysz,
                                 "uid %u owns %llu names (its fair share, 7/8 of what other "
                                 "uids leave of %llu)",
                                 (unsigned)s->uid, (unsigned long long)s->use->names,
                                 (unsigned long long)lim->max_names);
                else
                        snprintf(why, whysz, "uid %u owns %llu names (the limit)", (unsigned)s->uid,
                                 (unsigned long long)lim->max_names_per_uid);
                return true;
        }
        return false;
}
