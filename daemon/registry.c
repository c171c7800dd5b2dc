/* SPDX-License-Identifier: MIT */
/*
 * Names and their versions (namespace.h): publishing, unpublishing, stat,
 * list and stats, and the registry itself.
 */
#include "registry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "fd.h"
#include "group.h"
#include "invariant.h"
#include "layout.h"
#include "log.h"
#include "namespace.h"

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

int entry_cmp_name(const void *key, const struct avl_node *n)
{
        return strcmp((const char *)key, avl_entry(n, struct entry, node)->name);
}

static bool may_write(const struct session *s, const struct entry *e)
{
        return s->uid == 0 || e->owner == s->uid;
}

void notify_watchers(struct registry *reg, enum wire_event_kind kind, struct entry *e,
                     uint64_t version)
{
        watch_notify(&reg->watches, kind, e->name, e->len, version);
}

struct entry *entry_find(struct registry *reg, const char *name)
{
        struct avl_node *n = avl_find(&reg->names, name, entry_cmp_name);
        return n ? avl_entry(n, struct entry, node) : NULL;
}

struct entry *entry_get(struct registry *reg, const char *name, uid_t owner)
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
        list_init(&e->tracks);
        avl_insert(&reg->names, &e->node, e->name, entry_cmp_name);
        return e;
}

void entry_maybe_free(struct registry *reg, struct entry *e)
{
        if (e->current || !list_empty(&e->versions) || !list_empty(&e->waiters) ||
            !list_empty(&e->tracks))
                return;
        avl_remove(&reg->names, &e->node);
        mount_entry_free(e);
        free(e);
}

void version_destroy(struct registry *reg, struct version *v)
{
        struct entry *e = v->entry;

        if (v->producer) {
                if (v->token)
                        session_event_with(v->producer, WIRE_EVENT_RELEASED, 0, e->name, v->version,
                                           v->token, v->seg->id, v->rel_events, v->nrel_events);
                list_remove(&v->plink);
        }
        free(v->rel_events);
        free(v->rel_owners);
        free(v->origin);
        list_remove(&v->link);
        segment_unref(reg->store, v->seg);
        if (v->table)
                segment_unref(reg->store, v->table);
        count_take(reg->nversions, 1);
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
                quota_count(owner_use, QUOTA_NAMES, 1);
        } else if (old && !v) {
                struct uid_use *u = quota_uid(reg->store, e->owner, false);
                count_take(reg->nnames, 1);
                if (u) {
                        quota_count(u, QUOTA_NAMES, -1);
                        quota_uid_put(reg->store, u);
                }
        }
        e->current = v;
        if (old != v)
                tracks_update(e);
        if (old && old->leases == 0)
                version_destroy(reg, old);
}

void entry_retire_current(struct registry *reg, struct entry *e)
{
        entry_set_current(reg, e, NULL, NULL);
}

void version_describe(const struct version *v, struct wire_tensor *t)
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
        t->members = v->members;
        t->table_segment = v->table ? v->table->id : 0;
        t->segment = v->seg->id;
        t->offset = v->offset;
        t->length = v->length;
        t->has_ipc_handle = storage_kind(v->seg->kind)->check == STORAGE_CHECK_HANDLE;
        if (t->has_ipc_handle)
                memcpy(t->ipc_handle, v->seg->ipc_handle, DLX_CUDA_HANDLE);
        t->has_event = v->has_event;
        if (v->has_event)
                memcpy(t->event, v->event, DLX_CUDA_HANDLE);
        t->has_device_uuid = v->has_device_uuid;
        if (v->has_device_uuid)
                memcpy(t->device_uuid, v->device_uuid, DLX_CUDA_UUID);
        t->pid_namespace = v->pid_namespace;
        t->event_session = v->has_event && v->producer ? v->producer->id : 0;
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
        snprintf(info->origin, sizeof(info->origin), "%s", v->origin ? v->origin : "");
}

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
        lim->max_group_members = DLX_DEFAULT_MAX_GROUP_MEMBERS;
        lim->max_group_table = DLX_DEFAULT_MAX_GROUP_TABLE;
}

void registry_init(struct registry *reg, uv_loop_t *loop, struct store *st,
                   const struct wire_limit_set *lim)
{
        memset(reg, 0, sizeof(*reg));
        reg->loop = loop;
        reg->store = st;
        avl_init(&reg->names);
        avl_init(&reg->mounts);
        list_init(&reg->sessions);
        watch_index_init(&reg->watches);
        reg->next_session = 1;
        reg->next_lease = 1;
        reg->started_ms = now_ms(loop);
        reg->started_unix = (uint64_t)time(NULL);
        if (lim)
                reg->lim = *lim;
        else
                registry_default_limits(&reg->lim);
        /* the limit in force, as stats tell it: no group has more on the wire, even with "none" */
        if (reg->lim.max_group_members == 0 || reg->lim.max_group_members > GROUP_MEMBERS_MAX)
                reg->lim.max_group_members = GROUP_MEMBERS_MAX;
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
 * readers can map writable, and keep: sealed against new seals, so that no
 * reader can seal it against writing under the others. CUDA memory has no
 * such seal: read-only there is what libdlx maps (README, "Access").
 */
static int check_access(const struct wire_tensor *t, struct segment *seg, char *why, size_t whysz)
{
        const char *reason = NULL;
        int err;

        if (!storage_kind(seg->kind)->host_mapped)
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
        err = segment_seal_rw(seg, &reason);
        if (err < 0)
                snprintf(why, whysz, "'%s' cannot be writable: %s", t->name, reason);
        return err;
}

/*
 * What a group's table is checked against: the limits, and where its
 * members' bytes are: after it (apart_size 0), or in the first apart_size
 * bytes of a device group's memory (what its tensor describes).
 */
static struct group_bounds group_bounds_of(const struct registry *reg, uint64_t apart_size)
{
        return (struct group_bounds){.max_count = reg->lim.max_group_members,
                                     .max_table = reg->lim.max_group_table,
                                     .apart_size = apart_size};
}

/* A device group (1.4): members in CUDA memory, the table in a memfd of its own. */
static bool device_group(const struct wire_tensor *t)
{
        return t->members &&
               (t->storage == WIRE_STORAGE_CUDA_VMM || t->storage == WIRE_STORAGE_CUDA_IPC);
}

/*
 * A group's table, checked once, after its segment was sealed against
 * writing (check_access): nothing reads it in dlxd again, and no peer can
 * change it under its readers. This part checks what the publish says of
 * it and reads its head into *head; check_table() the rest. The publish's
 * tensor must describe the table's data area as bytes, so that stat and
 * list describe a group as they describe a tensor (a peer that knows no
 * groups is refused its acquire: grant()). table is the group's segment,
 * or a device group's table segment, whose members are in data.
 */
static int check_group(struct session *s, const struct wire_request *req, bool attached,
                       struct segment *table, const struct segment *data, struct group_head *head,
                       char *why, size_t whysz)
{
        const struct wire_tensor *t = &req->publish.tensor;

        if (!attached || req->publish.hold || (!data && t->storage != WIRE_STORAGE_MEMFD)) {
                snprintf(why, whysz,
                         data ? "a device group's table travels in a memfd of its own, attached"
                              : "a group travels in a memfd of its own, attached");
                return -EINVAL;
        }
        if (!(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY) || !table->write_sealed) {
                snprintf(why, whysz, "a group is read-only: writable groups are not supported");
                return -ENOTSUP;
        }
        if (table->size < sizeof(*head) ||
            pread(table->fd, head, sizeof(*head), 0) != (ssize_t)sizeof(*head)) {
                snprintf(why, whysz, "a group segment of %llu bytes has no room for its head",
                         (unsigned long long)table->size);
                return -EINVAL;
        }
        if (data && (t->offset || !t->length)) {
                snprintf(why, whysz,
                         "a device group's tensor describes its memory from offset 0, as "
                         "many bytes as its members span");
                return -EINVAL;
        }
        struct group_bounds b = group_bounds_of(s->reg, data ? t->length : 0);
        return group_check_head(head, table->size, &b, why, whysz);
}

/*
 * The rest of a group's table, whose head passed check_group(): fd, size
 * and the limits are all it reads, so that it may run on a worker thread.
 * The table is mapped where every page of it exists: the memfd is
 * write-sealed, so no page can change or turn into a hole (punching one is
 * a write), and the check reads the pages in place. Where the table has a
 * hole (a peer's sparse memfd) it is read instead: a read of a hole
 * allocates nothing, where a mapping's faults would allocate pages charged
 * to dlxd. A failure to read leaves *ret_errno set and why empty.
 */
static int check_table(int fd, uint64_t size, const struct group_head *head,
                       const struct wire_tensor *t, const struct group_bounds *b, int *ret_errno,
                       char *why, size_t whysz)
{
        uint64_t end = group_table_end(head);
        off_t hole = lseek(fd, 0, SEEK_HOLE);
        struct statfs fs;
        struct group_summary sum;
        uint8_t *table = NULL;
        size_t mapped = 0;
        int err = 0;

        *ret_errno = 0;
        /* shmem only: a hugetlbfs memfd reports no holes, and faulting one in may SIGBUS */
        if (hole >= 0 && (uint64_t)hole >= end && fstatfs(fd, &fs) == 0 &&
            fs.f_type == TMPFS_MAGIC) {
                void *p = mmap(NULL, end, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
                if (p != MAP_FAILED) {
                        table = p;
                        mapped = end;
                }
        }
        /* read up to the last area's end: the padding and holes up to data_off cost nothing */
        if (!table && !(table = malloc(end))) {
                snprintf(why, whysz, "out of memory for a %llu-byte group table",
                         (unsigned long long)end);
                return -ENOMEM;
        }
        for (uint64_t done = 0; !mapped && done < end;) {
                ssize_t n = pread(fd, table + done, end - done, (off_t)done);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        err = n < 0 ? -errno : -EIO;
                        *ret_errno = -err;
                        break;
                }
                done += (uint64_t)n;
        }
        if (err == 0)
                err = group_check(table, size, b, &sum, why, whysz);
        if (mapped)
                munmap(table, mapped);
        else
                free(table);
        if (err < 0)
                return err;
        /* a device group's data area is its device memory, whole */
        uint64_t data_off = b->apart_size ? 0 : sum.data_off;
        if (sum.count != t->members || t->dtype.code != kDLUInt || t->dtype.bits != 8 ||
            t->dtype.lanes != 1 || t->ndim != 1 || (uint64_t)t->shape[0] != sum.data_bytes ||
            t->strides[0] != 1 || t->byte_offset || t->offset != data_off ||
            t->length != sum.data_bytes) {
                snprintf(why, whysz,
                         "the group's tensor must describe its %u members' data area as %llu "
                         "bytes from offset %llu",
                         sum.count, (unsigned long long)sum.data_bytes,
                         (unsigned long long)data_off);
                return -EINVAL;
        }
        return 0;
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
        const struct storage_kind *kind = storage_kind(t->storage);
        const char *reason = NULL;
        struct segment *seg;
        struct hold *h;
        int err;

        if (!kind) {
                fd_drop(&fd);
                snprintf(why, whysz, "storage kind %u is not supported", t->storage);
                return -ENOTSUP;
        }
        if (t->device_type != kind->device_type) {
                fd_drop(&fd);
                snprintf(why, whysz, "a %s tensor cannot be on device type %d", kind->name,
                         t->device_type);
                return -EINVAL;
        }
        if (t->has_event && !kind->takes_event) {
                fd_drop(&fd);
                snprintf(why, whysz, "a %s tensor carries no CUDA event", kind->name);
                return -EINVAL;
        }
        if (t->has_ipc_handle && kind->check != STORAGE_CHECK_HANDLE) {
                fd_drop(&fd);
                snprintf(why, whysz, "a %s tensor carries no CUDA IPC handle", kind->name);
                return -EINVAL;
        }
        if (t->has_device_uuid && kind->device_type != kDLCUDA) {
                fd_drop(&fd);
                snprintf(why, whysz, "a %s tensor carries no CUDA device UUID", kind->name);
                return -EINVAL;
        }
        if (t->pid_namespace && !kind->takes_event) {
                fd_drop(&fd);
                snprintf(why, whysz, "a %s tensor carries no PID namespace", kind->name);
                return -EINVAL;
        }
        if (fd >= 0 && t->segment) {
                fd_drop(&fd);
                snprintf(why, whysz,
                         "a publish attaches a segment's fd or names a segment it holds, not "
                         "both (segment %llu)",
                         (unsigned long long)t->segment);
                return -EINVAL;
        }
        if (kind->check == STORAGE_CHECK_HANDLE && fd >= 0) {
                close(fd);
                snprintf(why, whysz, "a %s tensor travels as a handle, not an fd", kind->name);
                return -EINVAL;
        }
        if (kind->check == STORAGE_CHECK_HANDLE && !t->has_ipc_handle) {
                snprintf(why, whysz, "a %s tensor needs its memory handle", kind->name);
                return -EINVAL;
        }
        if (req->publish.persist && !kind->may_persist) {
                fd_drop(&fd);
                snprintf(why, whysz,
                         "%s memory dies with its producer and cannot persist; allocate it "
                         "with dlx_alloc (cuda-vmm) instead",
                         kind->name);
                return -ENOTSUP;
        }

        if (kind->check == STORAGE_CHECK_HANDLE) {
                err = store_ipc(reg->store, t->ipc_handle, req->publish.segment_size, s->uid, ret);
                if (err < 0)
                        snprintf(why, whysz, "bad allocation size %llu",
                                 (unsigned long long)req->publish.segment_size);
                return err;
        }

        if (fd < 0) {
                h = hold_find(s, t->segment);
                if (!h || !storage_fits(h->seg->kind, t->storage)) {
                        snprintf(why, whysz,
                                 "no fd attached and segment %llu is not a %s segment held by "
                                 "this session",
                                 (unsigned long long)t->segment, kind->name);
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

/*
 * The rest of a publish, once its segment and descriptor passed (err 0) or
 * failed (err, with why): the version, its reply and its events. attached:
 * the publish came with an fd (seg's). Takes seg's reference, and table's (a
 * device group's table segment, else NULL).
 */
static void publish_finish(struct session *s, const struct wire_request *req, bool attached,
                           struct segment *seg, struct segment *table, int err, const char *why_in)
{
        struct registry *reg = s->reg;
        const struct wire_tensor *t = &req->publish.tensor;
        struct entry *e;
        struct version *v;
        struct wire_reply rep;
        char why[320], *origin = NULL;
        bool replaced;

        /* why_in is only written where a check failed */
        snprintf(why, sizeof(why), "%s", err < 0 ? why_in : "");
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
        /* a group checked off the loop: the name may have moved on meanwhile */
        if (err == 0)
                err = mount_check_version(e, req->publish.origin_version, why, sizeof(why));
        if (err == 0 && req->publish.origin[0] && !(origin = strdup(req->publish.origin))) {
                err = -ENOMEM;
                snprintf(why, sizeof(why), "out of memory");
        }
        if (err == 0 && attached && req->publish.hold) {
                err = hold_segment(s, seg);
                if (err < 0)
                        snprintf(why, sizeof(why), "cannot hold the segment: %s",
                                 err == -EAGAIN ? "too many held segments" : strerror(-err));
        }
        if (err < 0) {
                free(v);
                free(origin);
                segment_unref(reg->store, seg);
                if (table)
                        segment_unref(reg->store, table);
                if (e)
                        entry_maybe_free(reg, e);
                session_fail(s, req->id, err, "%s", why);
                return;
        }
        v->entry = e;
        v->producer = s;
        v->seg = seg;
        v->table = table;
        v->version =
                req->publish.origin_version ? req->publish.origin_version : e->last_version + 1;
        e->last_version = v->version;
        v->origin = origin;
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
        v->members = t->members;
        v->producer_pid = s->pid;
        v->persist = req->publish.persist;
        v->has_event = t->has_event;
        if (t->has_event)
                memcpy(v->event, t->event, DLX_CUDA_HANDLE);
        v->has_device_uuid = t->has_device_uuid;
        if (t->has_device_uuid)
                memcpy(v->device_uuid, t->device_uuid, DLX_CUDA_UUID);
        v->pid_namespace = t->pid_namespace;
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

        log_session(info, s, "published %s%s v%llu (%llu bytes, segment %llu%s)",
                    v->members ? "group " : "", e->name, (unsigned long long)v->version,
                    (unsigned long long)v->length, (unsigned long long)seg->id,
                    v->persist ? ", persistent" : "");

        reply_init(&rep, req->id, WIRE_REP_PUBLISH);
        rep.publish.version = v->version;
        rep.publish.segment = seg->id;
        session_send(s, &rep, -1);

        notify_watchers(reg, replaced ? WIRE_EVENT_REPLACED : WIRE_EVENT_PUBLISHED, e, v->version);
        wake_waiters(e);
}

/*
 * A group publish whose table is bigger than GROUP_CHECK_INLINE is checked
 * on libuv's thread pool, not on the loop: a table of hundreds of
 * megabytes (within the default limits) took a quarter of a second, during
 * which every other client waited. Its session reads no more requests
 * meanwhile (conn.c asks session.group_job), so that what it sent next is
 * answered after the publish, as ever. The worker reads only what the job
 * holds: the segment's fd (sealed: nothing changes it), its size, and
 * copies of the request and of the limits.
 */
/* Tables up to this many bytes (a 20,000-member state dict's is 1.7 MB) are checked inline. */
#define GROUP_CHECK_INLINE ((uint64_t)4 << 20)

struct group_job {
        uv_work_t work;
        struct registry *reg;
        struct session *s; /* NULL once the session has ended: the publish is dropped */
        struct wire_request req;
        struct segment *table; /* one reference: the segment whose table is read */
        struct segment *data;  /* a device group's memory, one reference; else NULL */
        int fd;
        uint64_t size;
        struct group_head head;
        struct group_bounds bounds;
        int err, read_errno;
        uint64_t t0_ns; /* when the publish arrived (metrics) */
        char why[320];
};

static void group_job_work(uv_work_t *w)
{
        struct group_job *job = w->data;

        job->err = check_table(job->fd, job->size, &job->head, &job->req.publish.tensor,
                               &job->bounds, &job->read_errno, job->why, sizeof(job->why));
}

static void group_job_done(uv_work_t *w, int status)
{
        struct group_job *job = w->data;
        struct session *s = job->s;

        if (!s) {
                segment_unref(job->reg->store, job->table);
                if (job->data)
                        segment_unref(job->reg->store, job->data);
                free(job);
                return;
        }
        s->group_job = NULL;
        session_answering(s, job->req.id, WIRE_REQ_PUBLISH, job->t0_ns);
        if (status < 0) {
                job->err = -ECANCELED;
                snprintf(job->why, sizeof(job->why), "the group's check was cancelled");
        } else if (job->read_errno) {
                snprintf(job->why, sizeof(job->why), "cannot read the group's table: %s",
                         strerror(job->read_errno));
        }
        if (job->data)
                publish_finish(s, &job->req, false, job->data, job->table, job->err, job->why);
        else
                publish_finish(s, &job->req, true, job->table, NULL, job->err, job->why);
        free(job);
        if (s->io.resume)
                s->io.resume(s->io.ctx);
}

/*
 * Queues the check of table's table (data: as check_group()); false where it
 * cannot be (then the caller checks it). Takes both references when queued.
 */
static bool group_job_start(struct session *s, const struct wire_request *req,
                            struct segment *table, struct segment *data,
                            const struct group_head *head)
{
        struct registry *reg = s->reg;
        struct group_job *job;

        if (!reg->loop || !s->io.resume || !(job = calloc(1, sizeof(*job))))
                return false;
        job->work.data = job;
        job->reg = reg;
        job->s = s;
        job->req = *req;
        job->t0_ns = s->cur.t0_ns;
        job->table = table;
        job->data = data;
        job->fd = table->fd;
        job->size = table->size;
        job->head = *head;
        job->bounds = group_bounds_of(reg, data ? req->publish.tensor.length : 0);
        if (uv_queue_work(reg->loop, &job->work, group_job_work, group_job_done) < 0) {
                free(job);
                return false;
        }
        s->group_job = job;
        return true;
}

void registry_group_job_orphan(struct session *s)
{
        if (s->group_job) {
                s->group_job->s = NULL;
                s->group_job = NULL;
        }
}

/*
 * A device group's table: the memfd attached to its publish, adopted and
 * sealed against writing (a group is read-only). fd is consumed.
 */
static int adopt_table(struct session *s, int fd, struct segment **ret, char *why, size_t whysz)
{
        const char *reason = NULL;
        int err;

        *ret = NULL;
        if (fd < 0) {
                snprintf(why, whysz,
                         "a device group's table travels in a memfd of its own, "
                         "attached");
                return -EBADF;
        }
        err = store_adopt(s->reg->store, fd, WIRE_STORAGE_MEMFD, 0, s->uid, ret, &reason);
        if (err < 0) {
                snprintf(why, whysz, "the group's table: %s", reason ? reason : strerror(-err));
                return err;
        }
        err = segment_seal_ro(*ret, &reason);
        if (err < 0) {
                snprintf(why, whysz, "the group's table cannot be read-only: %s", reason);
                segment_unref(s->reg->store, *ret);
                *ret = NULL;
        }
        return err;
}

void registry_publish(struct session *s, const struct wire_request *req, int fd)
{
        struct registry *reg = s->reg;
        const struct wire_tensor *t = &req->publish.tensor;
        struct segment *seg = NULL, *table = NULL;
        bool device = device_group(t);
        int table_fd = -1;
        struct entry *e;
        char why[320];
        int err;

        e = entry_find(reg, t->name);
        err = mount_check_publish(s, req, e, why, sizeof(why));
        if (err < 0) {
                fd_drop(&fd);
                session_fail(s, req->id, err, "publish '%s': %s", t->name, why);
                return;
        }
        if (e && e->current && !may_write(s, e)) {
                fd_drop(&fd);
                session_fail(s, req->id, -EACCES, "'%s' is owned by uid %u", t->name,
                             (unsigned)e->owner);
                return;
        }
        if (!(e && e->current) && names_full(s, why, sizeof(why))) {
                fd_drop(&fd);
                session_fail(s, req->id, -EAGAIN, "publish '%s': %s", t->name, why);
                return;
        }
        if (device && s->minor < 4) {
                fd_drop(&fd);
                session_fail(s, req->id, -ENOTSUP,
                             "publish '%s': a group in device memory needs protocol 1.4; this "
                             "client speaks 1.%u",
                             t->name, (unsigned)s->minor);
                return;
        }
        if (device) {
                /* the attached fd is the table's: the members' memory is held, or a handle */
                table_fd = fd;
                fd = -1;
        }
        err = publish_segment(s, req, fd, &seg, why, sizeof(why));
        if (err < 0) {
                fd_drop(&table_fd);
                session_fail(s, req->id, err, "publish '%s': %s", t->name, why);
                return;
        }
        if (device)
                err = adopt_table(s, table_fd, &table, why, sizeof(why));
        if (err == 0)
                err = check_extent(t, seg, why, sizeof(why));
        if (err == 0)
                err = check_access(t, seg, why, sizeof(why));
        if (err == 0 && t->members) {
                struct segment *tseg = device ? table : seg, *data = device ? seg : NULL;
                struct group_head head;
                struct group_bounds b = group_bounds_of(reg, device ? t->length : 0);
                int read_errno = 0;
                err = check_group(s, req, device || fd >= 0, tseg, data, &head, why, sizeof(why));
                if (err == 0 && head.data_off > GROUP_CHECK_INLINE &&
                    group_job_start(s, req, tseg, data, &head))
                        return; /* group_job_done() goes on */
                if (err == 0)
                        err = check_table(tseg->fd, tseg->size, &head, t, &b, &read_errno, why,
                                          sizeof(why));
                if (read_errno)
                        snprintf(why, sizeof(why), "cannot read the group's table: %s",
                                 strerror(read_errno));
        }
        publish_finish(s, req, fd >= 0, seg, table, err, why);
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
        if (!mount_may_unpublish(s, e->name)) {
                session_fail(s, req->id, -EACCES,
                             "'%s' is a mirror: only the bridge that mounted its prefix "
                             "unpublishes it",
                             e->name);
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
                n = avl_upper_bound(&reg->names, req->list.after, entry_cmp_name);
        else
                n = avl_lower_bound(&reg->names, prefix, entry_cmp_name);
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

void registry_metrics(struct session *s, const struct wire_request *req)
{
        struct wire_reply rep;
        size_t len;
        char *text = metrics_render(s->reg, s->uid == geteuid() || s->uid == 0, s->uid,
                                    METRICS_REPLY_UIDS, &len);

        if (!text) {
                session_fail(s, req->id, -ENOMEM, "out of memory");
                return;
        }
        reply_init(&rep, req->id, WIRE_REP_METRICS);
        rep.metrics.text = text;
        rep.metrics.len = (uint32_t)len;
        session_send(s, &rep, -1);
        free(text);
}
