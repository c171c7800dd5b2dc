/* SPDX-License-Identifier: MIT */
#include "registry.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "layout.h"
#include "ring.h"
#include "log.h"

struct entry {
        struct avl_node node; /* in registry.names */
        uid_t owner;
        uint64_t last_version;
        struct version *current; /* NULL: unpublished, kept for old versions or waiters */
        struct list versions;    /* struct version, oldest first */
        struct list waiters;     /* struct waiter */
        size_t len;
        char name[];
};

struct version {
        struct list link;  /* in entry.versions */
        struct list plink; /* in producer.published while the producer lives */
        struct entry *entry;
        struct session *producer; /* NULL once it has gone */
        struct segment *seg;      /* one reference */
        uint64_t version;
        uint64_t token;
        uint64_t published_ns;
        uint64_t byte_offset, flags, offset, length;
        DLDataType dtype;
        int32_t ndim;
        int32_t device_type, device_id;
        uint32_t storage;
        uint32_t leases;
        pid_t producer_pid;
        bool persist;
        bool has_event;
        char producer_name[DLX_CLIENT_NAME_MAX + 1];
        uint8_t event[DLX_CUDA_HANDLE]; /* the producer's, recorded at publish */
        /* consumers' release events, distinct, for the producer to wait on */
        uint8_t (*rel_events)[DLX_CUDA_HANDLE];
        uint64_t *rel_owners; /* the session each came from */
        uint32_t nrel_events;
        bool rel_overflow_logged;
        int64_t dims[]; /* shape[ndim], then strides[ndim] */
};

struct lease {
        struct avl_node node; /* in session.leases */
        uint64_t id;
        struct version *v;
};

struct hold {
        struct avl_node node; /* in session.held, by segment id */
        struct segment *seg;
};

struct waiter {
        struct list elink; /* in entry.waiters */
        struct list slink; /* in session.waiters */
        struct session *s;
        struct entry *e;
        uint64_t req_id;
        uint64_t min_version;
        bool timed;
        uv_timer_t timer;
};

/* ---- small helpers ------------------------------------------------------------------- */

static uint64_t now_ms(uv_loop_t *loop)
{
        return uv_now(loop);
}

static uint64_t realtime_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_name(const void *key, const struct avl_node *n)
{
        return strcmp((const char *)key, avl_entry(n, struct entry, node)->name);
}

static int cmp_lease(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct lease, node)->id);
}

static int cmp_hold(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct hold, node)->seg->id);
}

static int cmp_known(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct known, node)->seg->id);
}

static bool may_write(const struct session *s, const struct entry *e)
{
        return s->uid == 0 || e->owner == s->uid;
}

static void reply_init(struct wire_reply *rep, uint64_t id, enum wire_reply_type type)
{
        rep->id = id;
        rep->status = WIRE_OK;
        rep->error[0] = '\0';
        rep->type = type;
}

static void send_event_with(struct session *s, enum wire_event_kind kind, uint64_t watch,
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

static void send_event(struct session *s, enum wire_event_kind kind, uint64_t watch,
                       const char *name, uint64_t version, uint64_t token, uint64_t segment)
{
        send_event_with(s, kind, watch, name, version, token, segment, NULL, 0);
}

static void notify_watchers(struct registry *reg, enum wire_event_kind kind, struct entry *e,
                            uint64_t version)
{
        watch_notify(&reg->watches, kind, e->name, e->len, version);
}

/* ---- entries and versions ------------------------------------------------------------ */

static struct entry *entry_find(struct registry *reg, const char *name)
{
        struct avl_node *n = avl_find(&reg->names, name, cmp_name);
        return n ? avl_entry(n, struct entry, node) : NULL;
}

static struct entry *entry_get(struct registry *reg, const char *name, uid_t owner)
{
        struct entry *e = entry_find(reg, name);
        size_t len;

        if (e)
                return e;
        len = strlen(name);
        e = calloc(1, sizeof(*e) + len + 1);
        if (!e)
                return NULL;
        memcpy(e->name, name, len + 1);
        e->len = len;
        e->owner = owner;
        list_init(&e->versions);
        list_init(&e->waiters);
        avl_insert(&reg->names, &e->node, e->name, cmp_name);
        return e;
}

static void entry_maybe_free(struct registry *reg, struct entry *e)
{
        if (e->current || !list_empty(&e->versions) || !list_empty(&e->waiters))
                return;
        avl_remove(&reg->names, &e->node);
        free(e);
}

static void version_destroy(struct registry *reg, struct version *v)
{
        struct entry *e = v->entry;

        if (v->producer) {
                if (v->token)
                        send_event_with(v->producer, WIRE_EVENT_RELEASED, 0, e->name, v->version,
                                        v->token, v->seg->id, v->rel_events, v->nrel_events);
                list_remove(&v->plink);
        }
        free(v->rel_events);
        free(v->rel_owners);
        list_remove(&v->link);
        segment_unref(reg->store, v->seg);
        reg->nversions--;
        log_debug("%s v%llu gone", e->name, (unsigned long long)v->version);
        free(v);
        entry_maybe_free(reg, e);
}

/*
 * v becomes e's current version (NULL: none); the old one dies now if nobody
 * leases it. A name with a current version counts against its owner's uid.
 */
static void entry_set_current(struct registry *reg, struct entry *e, struct version *v,
                              struct uid_use *owner_use)
{
        struct version *old = e->current;

        if (!old && v) {
                reg->nnames++;
                owner_use->names++;
        } else if (old && !v) {
                struct uid_use *u = store_uid(reg->store, e->owner, false);
                reg->nnames--;
                if (u) {
                        u->names--;
                        store_uid_put(reg->store, u);
                }
        }
        e->current = v;
        if (old && old->leases == 0)
                version_destroy(reg, old);
}

/* The current version stops being current; it dies now if nobody leases it. */
static void entry_retire_current(struct registry *reg, struct entry *e)
{
        entry_set_current(reg, e, NULL, NULL);
}

static void version_describe(const struct version *v, struct wire_tensor *t)
{
        size_t len = strlen(v->entry->name); /* checked at publish: within DLX_NAME_MAX */

        memcpy(t->name, v->entry->name, len + 1);
        t->version = v->version;
        t->dtype = v->dtype;
        t->ndim = v->ndim;
        memcpy(t->shape, v->dims, (size_t)v->ndim * sizeof(int64_t));
        memcpy(t->strides, v->dims + v->ndim, (size_t)v->ndim * sizeof(int64_t));
        t->byte_offset = v->byte_offset;
        t->device_type = v->device_type;
        t->device_id = v->device_id;
        t->flags = v->flags;
        t->storage = v->storage;
        t->segment = v->seg->id;
        t->offset = v->offset;
        t->length = v->length;
        t->has_ipc_handle = v->seg->kind == WIRE_STORAGE_CUDA_IPC;
        if (t->has_ipc_handle)
                memcpy(t->ipc_handle, v->seg->ipc_handle, DLX_CUDA_HANDLE);
        t->has_event = v->has_event;
        if (v->has_event)
                memcpy(t->event, v->event, DLX_CUDA_HANDLE);
}

static void entry_info(const struct entry *e, struct wire_info *info)
{
        const struct version *v = e->current;
        struct list *pos;

        memset(info, 0, offsetof(struct wire_info, tensor.shape));
        version_describe(v, &info->tensor);
        info->owner_uid = e->owner;
        info->producer_pid = v->producer ? v->producer_pid : 0;
        info->persist = v->persist;
        info->leases = v->leases;
        info->segment_size = v->seg->size;
        info->published_ns = v->published_ns;
        info->live_versions = 0;
        for (pos = e->versions.next; pos != &e->versions; pos = pos->next)
                info->live_versions++;
        snprintf(info->producer_name, sizeof(info->producer_name), "%s", v->producer_name);
}

/* ---- leases and waiters --------------------------------------------------------------- */

static struct known *known_find(struct session *s, uint64_t seg_id)
{
        struct avl_node *n = avl_find(&s->known, &seg_id, cmp_known);
        return n ? avl_entry(n, struct known, node) : NULL;
}

static struct known *known_add(struct session *s, struct segment *seg)
{
        struct known *k = known_find(s, seg->id);

        if (k)
                return k;
        k = calloc(1, sizeof(*k));
        if (!k)
                return NULL;
        k->seg = seg;
        k->session = s;
        avl_insert(&s->known, &k->node, &seg->id, cmp_known);
        list_insert_tail(&seg->known, &k->link);
        return k;
}

static void known_drop(struct session *s, struct known *k)
{
        avl_remove(&s->known, &k->node);
        list_remove(&k->link);
        free(k);
}

/*
 * A record made for an fd that was then never sent: the peer does not hold the
 * segment, and must hear nothing of it (no SEGMENT_GONE). NULL-safe.
 */
static void known_drop_unsent(struct session *s, struct known *k)
{
        if (k && !k->ro && !k->rw)
                known_drop(s, k);
}

/* A segment whose fd this session holds is gone: forget it and tell the peer. */
static void on_segment_gone(struct session *s, uint64_t seg_id)
{
        struct known *k = known_find(s, seg_id);

        if (k)
                known_drop(s, k);
        send_event(s, WIRE_EVENT_SEGMENT_GONE, 0, "", 0, 0, seg_id);
}

/*
 * Creates a lease on v for s and sends the acquire reply, attaching the
 * segment's fd unless the peer already holds a suitable one.
 */
static void grant(struct session *s, uint64_t req_id, struct version *v)
{
        struct registry *reg = s->reg;
        struct segment *seg = v->seg;
        bool writable = !(v->flags & DLPACK_FLAG_BITMASK_READ_ONLY) && !seg->write_sealed &&
                        !seg->fd_readonly;
        struct wire_reply rep;
        struct lease *l;
        struct known *k;

        if (reg->lim.max_leases && s->leases.count >= reg->lim.max_leases) {
                session_fail(s, req_id, -EAGAIN, "this client holds %u leases already (the limit)",
                             reg->lim.max_leases);
                return;
        }
        l = calloc(1, sizeof(*l));
        /* an IPC handle travels in the descriptor itself: no fd to track */
        k = seg->fd >= 0 ? known_add(s, seg) : NULL;
        if (!l || (seg->fd >= 0 && !k)) {
                free(l);
                known_drop_unsent(s, k);
                session_fail(s, req_id, -ENOMEM, "out of memory");
                return;
        }
        /*
         * The fd goes again when the peer needs a mapping of another mode: a
         * read-only tensor is mapped read-only, never inside a writable view
         * (unless the segment is sealed, when no view of it writes anyway).
         */
        bool send_fd = k && (writable ? !k->rw : !(k->ro || (k->rw && seg->write_sealed)));

        if (send_fd && s->io.fd_share && !s->io.fd_share(s->io.ctx)) {
                free(l);
                known_drop_unsent(s, k);
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

static void lease_drop(struct session *s, struct lease *l)
{
        struct registry *reg = s->reg;
        struct version *v = l->v;

        avl_remove(&s->leases, &l->node);
        free(l);
        reg->nleases--;
        if (--v->leases == 0 && v->entry->current != v)
                version_destroy(reg, v);
}

static void waiter_free_cb(uv_handle_t *h)
{
        free(h->data);
}

/* Unlinks a waiter and frees it (after its timer closes, if it has one). */
static void waiter_end(struct waiter *w)
{
        struct registry *reg = w->s->reg;
        struct entry *e = w->e;

        list_remove(&w->elink);
        list_remove(&w->slink);
        w->s->nwaiters--;
        if (w->timed) {
                uv_timer_stop(&w->timer);
                uv_close((uv_handle_t *)&w->timer, waiter_free_cb);
        } else {
                free(w);
        }
        entry_maybe_free(reg, e);
}

static void on_waiter_timeout(uv_timer_t *t)
{
        struct waiter *w = t->data;
        struct session *s = w->s;
        uint64_t id = w->req_id;
        char name[DLX_NAME_MAX + 1];

        snprintf(name, sizeof(name), "%s", w->e->name);
        waiter_end(w);
        session_fail(s, id, -ETIMEDOUT, "timed out waiting for '%s'", name);
}

/* A new version was published: grant it to every waiter it satisfies. */
static void wake_waiters(struct entry *e)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &e->waiters)
        {
                struct waiter *w = list_entry(pos, struct waiter, elink);
                struct session *s = w->s;
                uint64_t id = w->req_id;

                if (!e->current || e->current->version < w->min_version)
                        continue;
                /* keep the entry alive across waiter_end: it has a current version */
                waiter_end(w);
                grant(s, id, e->current);
        }
}

/* ---- sessions -------------------------------------------------------------------------- */

void registry_default_limits(struct wire_limit_set *lim)
{
        memset(lim, 0, sizeof(*lim));
        lim->max_clients = DLX_DEFAULT_MAX_CLIENTS;
        lim->max_names = DLX_DEFAULT_MAX_NAMES;
        lim->max_leases = DLX_MAX_LEASES_PER_SESSION;
        lim->max_watches = DLX_DEFAULT_MAX_WATCHES;
        lim->max_fds = DLX_FDS_AUTO;
        lim->max_clients_per_uid = DLX_LIMIT_FAIR32;
        lim->max_names_per_uid = DLX_LIMIT_FAIR;
        lim->max_fds_per_uid = DLX_LIMIT_FAIR;
        lim->max_queued = DLX_DEFAULT_MAX_QUEUED;
        lim->timeout_ms = DLX_DEFAULT_DAEMON_TIMEOUT_MS;
}

void registry_init(struct registry *reg, uv_loop_t *loop, struct store *st,
                   const struct wire_limit_set *lim)
{
        memset(reg, 0, sizeof(*reg));
        reg->loop = loop;
        reg->store = st;
        avl_init(&reg->names);
        list_init(&reg->sessions);
        watch_index_init(&reg->watches);
        reg->next_session = 1;
        reg->next_lease = 1;
        reg->started_ms = now_ms(loop);
        if (lim)
                reg->lim = *lim;
        else
                registry_default_limits(&reg->lim);
        st->max_bytes = reg->lim.max_bytes;
        st->max_bytes_per_uid = reg->lim.max_bytes_per_uid;
        st->max_fds = reg->lim.max_fds;
        st->max_fds_per_uid = reg->lim.max_fds_per_uid;
        st->on_gone = on_segment_gone;
}

void registry_done(struct registry *reg)
{
        struct list *pos, *tmp;
        struct avl_node *n, *next;

        list_for_each_safe(pos, tmp, &reg->sessions)
                registry_session_free(list_entry(pos, struct session, link));
        /* persistent versions outlive their producers; drop them now */
        for (n = avl_first(&reg->names); n; n = next) {
                struct entry *e = avl_entry(n, struct entry, node);
                next = avl_next(n);
                entry_retire_current(reg, e);
        }
}

/* The most clients u's uid may have connected (UINT64_MAX: no bound). */
static uint64_t clients_cap(const struct registry *reg, const struct uid_use *u)
{
        uint32_t per_uid = reg->lim.max_clients_per_uid;

        return store_uid_cap(reg->lim.max_clients,
                             per_uid == DLX_LIMIT_FAIR32 ? DLX_LIMIT_FAIR : per_uid,
                             reg->nsessions + reg->nlingering, u->clients, STORE_MOST);
}

/* The most names u's uid may own (UINT64_MAX: no bound). */
static uint64_t names_cap(const struct registry *reg, const struct uid_use *u)
{
        return store_uid_cap(reg->lim.max_names, reg->lim.max_names_per_uid, reg->nnames, u->names,
                             STORE_MOST);
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
                store_uid_cap(st->max_fds, st->max_fds_per_uid, st->fds, s->use->fds, STORE_HALF));
}

int registry_admit(struct registry *reg, uid_t uid, char *why, size_t whysz)
{
        const struct uid_use *u = store_uid(reg->store, uid, false);

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

struct session *registry_session_new(struct registry *reg, uid_t uid, gid_t gid, pid_t pid)
{
        struct session *s = calloc(1, sizeof(*s));
        struct uid_use *u = s ? store_uid(reg->store, uid, true) : NULL;

        if (!u) {
                free(s);
                return NULL;
        }
        u->clients++;
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
        list_insert_tail(&reg->sessions, &s->link);
        reg->nsessions++;
        return s;
}

static int ring_drain(struct session *s)
{
        struct release_ring *r = s->ring;
        uint64_t h = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE), t = r->tail;

        if (h - t > RING_SLOTS)
                return -EPROTO;
        for (; t != h; t++) {
                uint64_t id = __atomic_load_n(&r->lease[t % RING_SLOTS], __ATOMIC_RELAXED);
                struct avl_node *n = avl_find(&s->leases, &id, cmp_lease);
                /* a stale or foreign id releases nothing: the ring is the client's own */
                if (n)
                        lease_drop(s, avl_entry(n, struct lease, node));
        }
        __atomic_store_n(&r->tail, t, __ATOMIC_RELEASE);
        return 0;
}

int registry_ring_create(struct session *s)
{
        int fd = memfd_create("ring-of-dlx", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        void *p;

        if (fd < 0)
                return -errno;
        if (ftruncate(fd, sizeof(struct release_ring)) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
            (p = mmap(NULL, sizeof(struct release_ring), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      0)) == MAP_FAILED) {
                int err = -errno;
                close(fd);
                return err;
        }
        s->ring = p;
        s->ring->magic = RING_MAGIC;
        s->ring->slots = RING_SLOTS;
        return fd;
}

int registry_ring_spare_fd(int fd)
{
        int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);

        if (dup < 0)
                return -errno;
        close(dup);
        return 0;
}

void registry_ring_destroy(struct session *s)
{
        if (s->ring)
                munmap(s->ring, sizeof(*s->ring));
        s->ring = NULL;
}

int registry_ring_wake(struct session *s)
{
        __atomic_store_n(&s->ring->asleep, 0, __ATOMIC_SEQ_CST);
        return ring_drain(s);
}

int registry_ring_sleep(struct session *s)
{
        int err = ring_drain(s);

        if (err < 0)
                return err;
        __atomic_store_n(&s->ring->asleep, 1, __ATOMIC_SEQ_CST);
        /* a post that raced the store saw us awake and sent nothing: take it now */
        return ring_drain(s);
}

static void session_let_go(struct session *s);

void registry_session_free(struct session *s)
{
        struct registry *reg;
        struct avl_node *n, *next;

        if (!s)
                return;
        reg = s->reg;
        /* nothing may be sent to a peer that is gone */
        s->io.send = NULL;

        for (n = avl_first(&s->leases); n; n = next) {
                next = avl_next(n);
                lease_drop(s, avl_entry(n, struct lease, node));
        }
        session_let_go(s);
        registry_ring_destroy(s);
        list_remove(&s->link);
        reg->nsessions--;
        s->use->clients--;
        store_uid_put(reg->store, s->use);
        free(s);
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
        struct avl_node *n, *next;

        list_for_each_safe(pos, tmp, &s->waiters) waiter_end(list_entry(pos, struct waiter, slink));
        watch_session_drop(&reg->watches, s);
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
        for (n = avl_first(&s->known); n; n = next) {
                next = avl_next(n);
                known_drop(s, avl_entry(n, struct known, node));
        }
        for (n = avl_first(&s->held); n; n = next) {
                struct hold *h = avl_entry(n, struct hold, node);
                next = avl_next(n);
                avl_remove(&s->held, n);
                h->seg->holder = NULL;
                segment_unref(reg->store, h->seg);
                free(h);
        }
        s->nheld = 0;
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

/* ---- requests -------------------------------------------------------------------------- */

static struct hold *hold_find(struct session *s, uint64_t seg_id)
{
        struct avl_node *n = avl_find(&s->held, &seg_id, cmp_hold);
        return n ? avl_entry(n, struct hold, node) : NULL;
}

/* Whether a new name would pass the limit on names, in all or of the session's uid. */
static bool names_full(struct session *s, char *why, size_t whysz)
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

/* Checks a descriptor's bytes lie inside its segment. */
static int check_extent(const struct wire_tensor *t, const struct segment *seg, char *why,
                        size_t whysz)
{
        const char *reason = NULL;
        int64_t lo, hi;
        int err;

        err = layout_extent(t->dtype, t->ndim, t->shape, t->strides, t->byte_offset, t->flags, &lo,
                            &hi, &reason);
        if (err < 0) {
                snprintf(why, whysz, "bad layout for '%s': %s", t->name, reason);
                return err;
        }
        if (t->offset > seg->size || t->length > seg->size - t->offset) {
                snprintf(why, whysz,
                         "'%s': offset %llu + length %llu is beyond the segment's %llu bytes",
                         t->name, (unsigned long long)t->offset, (unsigned long long)t->length,
                         (unsigned long long)seg->size);
                return -EINVAL;
        }
        if (hi > lo && (lo < 0 ? (0 - (uint64_t)lo) > t->offset : false)) {
                snprintf(why, whysz, "'%s': elements start before the segment", t->name);
                return -EINVAL;
        }
        if (hi > lo && (uint64_t)hi > t->length) {
                snprintf(why, whysz,
                         "'%s': shape, strides and byte_offset reach %lld bytes past the data "
                         "pointer, beyond the %llu-byte region",
                         t->name, (long long)hi, (unsigned long long)t->length);
                return -EINVAL;
        }
        return 0;
}

/*
 * A read-only version must not change under its readers: its memfd is sealed
 * against writing before anyone can acquire it, and a segment readers may
 * map writable cannot carry one. A writable version needs a segment its
 * readers can map writable. CUDA memory has no such seal: read-only there
 * is what libdlx maps (README, "Access").
 */
static int check_access(const struct wire_tensor *t, struct segment *seg, char *why, size_t whysz)
{
        const char *reason = NULL;
        int err;

        if (seg->kind != WIRE_STORAGE_MEMFD && seg->kind != WIRE_STORAGE_CUDA_HOST)
                return 0;
        if (t->flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
                err = segment_seal_ro(seg, &reason);
                if (err < 0)
                        snprintf(why, whysz, "'%s' cannot be read-only: %s", t->name, reason);
                return err;
        }
        if (seg->write_sealed || seg->fd_readonly) {
                snprintf(why, whysz,
                         "'%s' cannot be writable: segment %llu is %s, so readers could not map "
                         "it writable",
                         t->name, (unsigned long long)seg->id,
                         seg->fd_readonly ? "a read-only fd"
                                          : "sealed against writing (it carries read-only "
                                            "versions)");
                return -EBUSY;
        }
        return 0;
}

/* The device each storage kind lives on. */
static int32_t storage_device(uint32_t storage)
{
        switch (storage) {
        case WIRE_STORAGE_MEMFD:
                return kDLCPU;
        case WIRE_STORAGE_CUDA_HOST:
                return kDLCUDAHost;
        case WIRE_STORAGE_CUDA_IPC:
        case WIRE_STORAGE_CUDA_VMM:
                return kDLCUDA;
        default:
                return -1;
        }
}

/* Whether a segment of kind may carry a tensor published as storage. */
static bool kind_fits(uint32_t kind, uint32_t storage)
{
        if (storage == WIRE_STORAGE_CUDA_HOST)
                return kind == WIRE_STORAGE_MEMFD || kind == WIRE_STORAGE_CUDA_HOST;
        return kind == storage;
}

/*
 * The segment a publish refers to, with one reference: an attached fd
 * (adopted, and held for this session if asked), an IPC handle, or a
 * segment this session holds. fd is consumed on every path.
 */
static int publish_segment(struct session *s, const struct wire_request *req, int fd,
                           struct segment **ret, char *why, size_t whysz)
{
        struct registry *reg = s->reg;
        const struct wire_tensor *t = &req->publish.tensor;
        const char *reason = NULL;
        struct segment *seg;
        struct hold *h;
        int err;

        if (storage_device(t->storage) < 0) {
                if (fd >= 0)
                        close(fd);
                snprintf(why, whysz, "storage kind %u is not supported", t->storage);
                return -ENOTSUP;
        }
        if (t->device_type != storage_device(t->storage)) {
                if (fd >= 0)
                        close(fd);
                snprintf(why, whysz, "a %s tensor cannot be on device type %d",
                         wire_storage_name(t->storage), t->device_type);
                return -EINVAL;
        }
        if (t->has_event && t->storage == WIRE_STORAGE_MEMFD) {
                if (fd >= 0)
                        close(fd);
                snprintf(why, whysz, "a CPU tensor carries no CUDA event");
                return -EINVAL;
        }

        if (t->storage == WIRE_STORAGE_CUDA_IPC) {
                if (fd >= 0) {
                        close(fd);
                        snprintf(why, whysz, "a cuda-ipc tensor travels as a handle, not an fd");
                        return -EINVAL;
                }
                if (!t->has_ipc_handle) {
                        snprintf(why, whysz, "a cuda-ipc tensor needs its memory handle");
                        return -EINVAL;
                }
                if (req->publish.persist) {
                        snprintf(why, whysz,
                                 "legacy CUDA IPC memory dies with its producer and cannot "
                                 "persist; allocate it with dlx_alloc (cuda-vmm) instead");
                        return -ENOTSUP;
                }
                err = store_ipc(reg->store, t->ipc_handle, req->publish.segment_size, s->uid, ret);
                if (err < 0)
                        snprintf(why, whysz, "bad allocation size %llu",
                                 (unsigned long long)req->publish.segment_size);
                return err;
        }

        if (fd < 0) {
                h = hold_find(s, t->segment);
                if (!h || !kind_fits(h->seg->kind, t->storage)) {
                        snprintf(why, whysz,
                                 "no fd attached and segment %llu is not a %s segment held by "
                                 "this session",
                                 (unsigned long long)t->segment, wire_storage_name(t->storage));
                        return -EBADF;
                }
                segment_ref(h->seg);
                *ret = h->seg;
                return 0;
        }

        err = store_adopt(reg->store, fd, t->storage, req->publish.segment_size, s->uid, &seg,
                          &reason);
        if (err < 0) {
                snprintf(why, whysz, "%s", reason ? reason : strerror(-err));
                return err;
        }
        *ret = seg;
        return 0;
}

/* Keeps an adopted segment for this session's later publishes (after every check passed). */
static int hold_segment(struct session *s, struct segment *seg)
{
        struct hold *h;

        if (s->nheld >= DLX_MAX_HELD_SEGMENTS)
                return -EAGAIN;
        h = calloc(1, sizeof(*h));
        if (!h)
                return -ENOMEM;
        h->seg = seg;
        seg->holder = s;
        segment_ref(seg);
        avl_insert(&s->held, &h->node, &seg->id, cmp_hold);
        s->nheld++;
        return 0;
}

void registry_publish(struct session *s, const struct wire_request *req, int fd)
{
        struct registry *reg = s->reg;
        const struct wire_tensor *t = &req->publish.tensor;
        struct segment *seg = NULL;
        struct entry *e;
        struct version *v;
        struct wire_reply rep;
        char why[320];
        bool replaced;
        int err;

        e = entry_find(reg, t->name);
        if (e && e->current && !may_write(s, e)) {
                if (fd >= 0)
                        close(fd);
                session_fail(s, req->id, -EACCES, "'%s' is owned by uid %u", t->name,
                             (unsigned)e->owner);
                return;
        }
        if (!(e && e->current) && names_full(s, why, sizeof(why))) {
                if (fd >= 0)
                        close(fd);
                session_fail(s, req->id, -EAGAIN, "publish '%s': %s", t->name, why);
                return;
        }
        err = publish_segment(s, req, fd, &seg, why, sizeof(why));
        if (err < 0) {
                session_fail(s, req->id, err, "publish '%s': %s", t->name, why);
                return;
        }

        err = check_extent(t, seg, why, sizeof(why));
        if (err == 0)
                err = check_access(t, seg, why, sizeof(why));
        /*
         * The entry and the version before the hold: a publish failing after
         * it would leave the segment held, its bytes charged, and the peer
         * never told which segment that is.
         */
        e = err == 0 ? entry_get(reg, t->name, s->uid) : NULL;
        v = e ? calloc(1, sizeof(*v) + 2 * (size_t)t->ndim * sizeof(int64_t)) : NULL;
        if (err == 0 && !v) {
                err = -ENOMEM;
                snprintf(why, sizeof(why), "out of memory");
        }
        if (err == 0 && fd >= 0 && req->publish.hold) {
                err = hold_segment(s, seg);
                if (err < 0)
                        snprintf(why, sizeof(why), "cannot hold the segment: %s",
                                 err == -EAGAIN ? "too many held segments" : strerror(-err));
        }
        if (err < 0) {
                free(v);
                segment_unref(reg->store, seg);
                if (e)
                        entry_maybe_free(reg, e);
                session_fail(s, req->id, err, "%s", why);
                return;
        }
        v->entry = e;
        v->producer = s;
        v->seg = seg;
        v->version = ++e->last_version;
        v->token = req->publish.token;
        v->published_ns = realtime_ns();
        v->byte_offset = t->byte_offset;
        v->flags = t->flags &
                   (DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
        v->offset = t->offset;
        v->length = t->length;
        v->dtype = t->dtype;
        v->ndim = t->ndim;
        v->device_type = t->device_type;
        v->device_id = t->device_id;
        v->storage = t->storage;
        v->producer_pid = s->pid;
        v->persist = req->publish.persist;
        v->has_event = t->has_event;
        if (t->has_event)
                memcpy(v->event, t->event, DLX_CUDA_HANDLE);
        snprintf(v->producer_name, sizeof(v->producer_name), "%s", s->name);
        memcpy(v->dims, t->shape, (size_t)t->ndim * sizeof(int64_t));
        memcpy(v->dims + t->ndim, t->strides, (size_t)t->ndim * sizeof(int64_t));
        list_insert_tail(&e->versions, &v->link);
        list_insert_tail(&s->published, &v->plink);
        if (!(v->flags & DLPACK_FLAG_BITMASK_READ_ONLY))
                seg->shared_rw = true; /* never sealed read-only now: readers may write */
        reg->nversions++;
        reg->publishes++;

        replaced = e->current != NULL;
        if (!replaced)
                e->owner = s->uid; /* a free name (or one only waited for) is taken */
        entry_set_current(reg, e, v, s->use);

        log_session(info, s, "published %s v%llu (%llu bytes, segment %llu%s)", e->name,
                    (unsigned long long)v->version, (unsigned long long)v->length,
                    (unsigned long long)seg->id, v->persist ? ", persistent" : "");

        reply_init(&rep, req->id, WIRE_REP_PUBLISH);
        rep.publish.version = v->version;
        rep.publish.segment = seg->id;
        session_send(s, &rep, -1);

        notify_watchers(reg, replaced ? WIRE_EVENT_REPLACED : WIRE_EVENT_PUBLISHED, e, v->version);
        wake_waiters(e);
}

void registry_acquire(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        const char *name = req->acquire.name;
        struct entry *e = entry_find(reg, name);
        struct waiter *w;

        if (e && e->current && e->current->version >= req->acquire.min_version) {
                grant(s, req->id, e->current);
                return;
        }
        if (req->acquire.timeout_ms == 0) {
                if (e && e->current)
                        session_fail(s, req->id, -ENOENT, "'%s' is at version %llu, not yet %llu",
                                     name, (unsigned long long)e->current->version,
                                     (unsigned long long)req->acquire.min_version);
                else
                        session_fail(s, req->id, -ENOENT, "no tensor named '%s'", name);
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
        w->min_version = req->acquire.min_version;
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
}

void registry_release(struct session *s, const struct wire_request *req)
{
        struct avl_node *n = avl_find(&s->leases, &req->release.lease, cmp_lease);

        /* success is silent: a release costs the client one send and no round trip */
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

void registry_unpublish(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        struct entry *e = entry_find(reg, req->unpublish.name);
        struct wire_reply rep;
        uint64_t version;

        if (!e || !e->current) {
                session_fail(s, req->id, -ENOENT, "no tensor named '%s'", req->unpublish.name);
                return;
        }
        if (!may_write(s, e)) {
                session_fail(s, req->id, -EACCES, "'%s' is owned by uid %u", e->name,
                             (unsigned)e->owner);
                return;
        }
        version = e->current->version;
        log_session(info, s, "unpublished %s v%llu", e->name, (unsigned long long)version);
        notify_watchers(reg, WIRE_EVENT_UNPUBLISHED, e, version);
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
        /* last: this may free e */
        entry_retire_current(reg, e);
}

void registry_list(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        const char *prefix = req->list.prefix;
        size_t plen = strlen(prefix);
        uint32_t limit = req->list.limit;
        struct wire_reply rep;
        struct avl_node *n;

        if (limit == 0)
                limit = DLX_LIST_PAGE_DEFAULT;
        if (limit > DLX_LIST_PAGE_MAX)
                limit = DLX_LIST_PAGE_MAX;
        reply_init(&rep, req->id, WIRE_REP_LIST);
        rep.list.count = 0;
        rep.list.next[0] = '\0';
        rep.list.entries = malloc(limit * sizeof(struct wire_info));
        if (!rep.list.entries) {
                session_fail(s, req->id, -ENOMEM, "out of memory");
                return;
        }
        if (req->list.after[0] && strcmp(req->list.after, prefix) >= 0)
                n = avl_upper_bound(&reg->names, req->list.after, cmp_name);
        else
                n = avl_lower_bound(&reg->names, prefix, cmp_name);
        for (; n; n = avl_next(n)) {
                struct entry *e = avl_entry(n, struct entry, node);

                if (strncmp(e->name, prefix, plen) != 0)
                        break;
                if (!e->current)
                        continue;
                if (rep.list.count == limit) {
                        /* there is more: the cursor is the last name sent */
                        snprintf(rep.list.next, sizeof(rep.list.next), "%s",
                                 rep.list.entries[limit - 1].tensor.name);
                        break;
                }
                entry_info(e, &rep.list.entries[rep.list.count++]);
        }
        session_send(s, &rep, -1);
        free(rep.list.entries);
}

void registry_stat(struct session *s, const struct wire_request *req)
{
        struct entry *e = entry_find(s->reg, req->stat.name);
        struct wire_reply rep;

        if (!e || !e->current) {
                session_fail(s, req->id, -ENOENT, "no tensor named '%s'", req->stat.name);
                return;
        }
        reply_init(&rep, req->id, WIRE_REP_STAT);
        entry_info(e, &rep.stat.info);
        session_send(s, &rep, -1);
}

void registry_watch(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        struct wire_reply rep;
        uint64_t id;
        int err;

        if (reg->lim.max_watches && s->nwatches >= reg->lim.max_watches) {
                session_fail(s, req->id, -EAGAIN, "this client has %u watches already (the limit)",
                             reg->lim.max_watches);
                return;
        }
        err = watch_add(&reg->watches, s, req->watch.prefix, &id);
        if (err < 0) {
                session_fail(s, req->id, err, "%s",
                             err == -ENOMEM ? "out of memory" : "prefix longer than 255 bytes");
                return;
        }
        reply_init(&rep, req->id, WIRE_REP_WATCH);
        rep.watch.watch = id;
        session_send(s, &rep, -1);
}

void registry_unwatch(struct session *s, const struct wire_request *req)
{
        struct wire_reply rep;

        if (watch_remove(&s->reg->watches, s, req->unwatch.watch) < 0) {
                session_fail(s, req->id, -ENOENT, "no watch %llu",
                             (unsigned long long)req->unwatch.watch);
                return;
        }
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
}

void registry_alloc(struct session *s, const struct wire_request *req, int fd)
{
        struct registry *reg = s->reg;
        uint32_t storage = req->alloc.storage;
        const char *reason = NULL;
        struct segment *seg;
        struct wire_reply rep;
        struct known *k;
        int err;

        if (fd >= 0 ? storage != WIRE_STORAGE_CUDA_VMM
                    : storage != WIRE_STORAGE_UNSPECIFIED && storage != WIRE_STORAGE_MEMFD) {
                if (fd >= 0)
                        close(fd);
                session_fail(s, req->id, -EINVAL,
                             "alloc: the daemon creates memfd segments; only a cuda-vmm "
                             "segment comes with its fd");
                return;
        }
        /* a memfd of ours goes back with the reply: the uid must have room for it in flight */
        if (fd < 0 && s->io.fd_share && !s->io.fd_share(s->io.ctx)) {
                session_fail(s, req->id, -EAGAIN,
                             "alloc: the clients of uid %u hold %u descriptors unread, their "
                             "share of what the daemon may have in flight: read them, or close",
                             (unsigned)s->uid, s->use->unread);
                return;
        }
        if (fd >= 0)
                err = store_adopt(reg->store, fd, storage, req->alloc.size, s->uid, &seg, &reason);
        else
                err = store_alloc(reg->store, req->alloc.size, s->uid, &seg, &reason);
        if (err < 0) {
                session_fail(s, req->id, err, "alloc of %llu bytes: %s",
                             (unsigned long long)req->alloc.size, reason ? reason : strerror(-err));
                return;
        }
        k = known_add(s, seg);
        err = k ? hold_segment(s, seg) : -ENOMEM;
        if (err < 0)
                known_drop_unsent(s, k); /* it never learns of this segment */
        /* the hold took its own reference: the creation's goes either way */
        segment_unref(reg->store, seg);
        if (err < 0) {
                session_fail(s, req->id, err, "alloc: %s",
                             err == -EAGAIN ? "this session holds too many segments"
                                            : "out of memory");
                return;
        }
        reply_init(&rep, req->id, WIRE_REP_ALLOC);
        rep.alloc.segment = seg->id;
        rep.alloc.size = seg->size;
        /* a segment the client brought needs no fd back: it holds one already */
        if (session_send_segment(s, &rep, fd >= 0 ? NULL : seg) == 0)
                k->rw = true;
}

void registry_free(struct session *s, const struct wire_request *req)
{
        struct hold *h = hold_find(s, req->free.segment);
        struct wire_reply rep;
        struct segment *seg;

        if (!h) {
                session_fail(s, req->id, -ENOENT, "segment %llu is not allocated by this session",
                             (unsigned long long)req->free.segment);
                return;
        }
        seg = h->seg;
        avl_remove(&s->held, &h->node);
        s->nheld--;
        free(h);
        seg->holder = NULL;
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
        segment_unref(s->reg->store, seg);
}

void registry_forget(struct session *s, const struct wire_request *req)
{
        struct wire_reply rep;

        /* forgetting a segment already gone is fine: the event may have crossed the request */
        for (uint32_t i = 0; i < req->forget.count; i++) {
                struct known *k = known_find(s, req->forget.segments[i]);
                if (k)
                        known_drop(s, k);
        }
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
}

void registry_stats(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        struct wire_reply rep;

        reply_init(&rep, req->id, WIRE_REP_STATS);
        rep.stats.names = reg->nnames;
        rep.stats.versions = reg->nversions;
        rep.stats.leases = reg->nleases;
        rep.stats.segments = reg->store->segments.count;
        rep.stats.bytes = reg->store->bytes;
        rep.stats.max_bytes = reg->store->max_bytes;
        rep.stats.clients = (uint32_t)reg->nsessions;
        rep.stats.max_clients = reg->lim.max_clients;
        registry_limits_for(s, &rep.stats.limits);
        rep.stats.uid = s->uid;
        rep.stats.uid_clients = s->use->clients;
        rep.stats.uid_bytes = s->use->bytes;
        rep.stats.uid_names = s->use->names;
        rep.stats.fds = reg->store->fds;
        rep.stats.uid_fds = s->use->fds;
        rep.stats.queued = reg->queued;
        rep.stats.uid_queued = s->use->queued;
        rep.stats.watchers = (uint32_t)reg->watches.count;
        rep.stats.uptime_ms = now_ms(reg->loop) - reg->started_ms;
        rep.stats.requests = reg->requests;
        rep.stats.publishes = reg->publishes;
        rep.stats.acquires = reg->acquires;
        session_send(s, &rep, -1);
}
