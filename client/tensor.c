/* SPDX-License-Identifier: MIT */
/* Tensors in and out: publish (zero-copy or one copy), acquire, alloc. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fd.h"
#include "gpu.h"
#include "internal.h"
#include "layout.h"

/* What dlx_acquire() hands out: the tensor first, so one allocation holds everything. */
struct acquired {
        DLManagedTensorVersioned mt;
        dlx_client *c;
        struct seg_map *map; /* NULL for CUDA IPC tensors */
        bool has_gpu;
        struct gpu_acq gpu;
        uint64_t lease;
        uint64_t version;
        uint32_t storage;
        bool write_protected; /* its mapping refuses writes (dlx_tensor_write_protected) */
        /* a group's member (dlx_group_take): the group's hold, dropped instead of a lease */
        void (*drop)(void *hold);
        void *hold;
        struct gpu_acq *group_gpu; /* a device group's member: the group's ordering */
        char name[DLX_NAME_MAX + 1];
        int64_t dims[]; /* shape[ndim], strides[ndim] */
};

/* What dlx_alloc() hands out. */
struct allocated {
        DLManagedTensorVersioned mt;
        dlx_client *c;
        struct seg_map *map;
        uint64_t offset;
        uint64_t bytes;
        int64_t dims[];
};

/* Adapter that lets a legacy DLManagedTensor travel as a versioned one. */
struct legacy {
        DLManagedTensorVersioned mt;
        DLManagedTensor *orig;
};

static void delete_tensor(DLManagedTensorVersioned *t)
{
        if (t && t->deleter)
                t->deleter(t);
}

/* ---- acquire -------------------------------------------------------------------------- */

static void acquired_deleter(DLManagedTensorVersioned *t)
{
        struct acquired *a = t->manager_ctx;
        dlx_client *c = a->c;
        struct wire_request req = {.type = WIRE_REQ_RELEASE};

        /*
         * In a child of the process that acquired it: the lease, the mapping's
         * bookkeeping and the client's lock are the parent's. Only this copy
         * of the tensor goes; the pages stay mapped until the child exits.
         */
        if (a->drop) {
                a->drop(a->hold); /* the group knows about forks itself */
                free(a);
                return;
        }
        if (dlx__forked(c)) {
                free(a);
                return;
        }
        req.release.lease = a->lease;
        pthread_mutex_lock(&c->lock);
        /* the reader's stream records when it is done, for the producer to wait on */
        if (a->has_gpu)
                dlx__gpu_release(c, &a->gpu, &req);
        /* release before the mapping can be forgotten: the daemon sees them in this order */
        dlx__release(c, &req);
        if (a->map)
                dlx__map_unref(c, a->map);
        dlx__acquired_gone(c);
        pthread_mutex_unlock(&c->lock);
        free(a);
        dlx__client_unref(c);
}

/* Fills a's tensor as t over data, with t's shape and strides copied into a. */
static void acquired_init(struct acquired *a, const DLTensor *t, uint64_t flags)
{
        memcpy(a->dims, t->shape, (size_t)t->ndim * sizeof(int64_t));
        memcpy(a->dims + t->ndim, t->strides, (size_t)t->ndim * sizeof(int64_t));
        a->mt.version.major = DLX_DLPACK_MAJOR;
        a->mt.version.minor = DLX_DLPACK_MINOR;
        a->mt.manager_ctx = a;
        a->mt.deleter = acquired_deleter;
        a->mt.flags = flags &
                      (DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
        a->mt.dl_tensor = *t;
        a->mt.dl_tensor.shape = t->ndim ? a->dims : NULL;
        a->mt.dl_tensor.strides = t->ndim ? a->dims + t->ndim : NULL;
}

static int build_acquired(dlx_client *c, struct pending *p, void *stream,
                          DLManagedTensorVersioned **ret)
{
        const struct wire_tensor *t = &p->rep.acquire.tensor;
        struct seg_map *m = p->map;
        struct gpu_acq gpu = {0};
        struct acquired *a;
        uint8_t *data;
        int err;

        const struct storage_kind *kind = storage_kind(t->storage);

        if (!kind->host_mapped) {
                if (!stream)
                        stream = dlx__gpu_stream(c, t->device_id);
                if (m && (t->offset > m->size || t->length > m->size - t->offset))
                        return dlx__fail(-EPROTO, "the daemon described '%s' outside its segment",
                                         t->name);
                pthread_mutex_lock(&c->lock);
                err = dlx__gpu_acquire(c, t, m, stream, &gpu, (void **)&data);
                pthread_mutex_unlock(&c->lock);
                if (err < 0)
                        return err;
        } else {
                uint8_t *base = p->rep.acquire.writable ? m->rw : (m->ro ? m->ro : m->rw);
                if (!base || t->offset > m->size || t->length > m->size - t->offset)
                        return dlx__fail(-EPROTO, "the daemon described '%s' outside its segment",
                                         t->name);
                if (kind->needs_cuda) {
                        /* pinned host memory a GPU may write: ordered like device memory */
                        if (!stream)
                                stream = dlx__gpu_stream(c, t->device_id);
                        pthread_mutex_lock(&c->lock);
                        err = dlx__gpu_register_host(c, m);
                        if (err == 0)
                                err = dlx__gpu_acquire(c, t, m, stream, &gpu, NULL);
                        pthread_mutex_unlock(&c->lock);
                        if (err < 0)
                                return err;
                }
                data = base + t->offset;
        }
        a = calloc(1, sizeof(*a) + 2 * (size_t)t->ndim * sizeof(int64_t));
        if (!a) {
                if (gpu.ipc || gpu.vmm || gpu.host) {
                        struct wire_request ignored = {.type = WIRE_REQ_RELEASE};
                        pthread_mutex_lock(&c->lock);
                        dlx__gpu_release(c, &gpu, &ignored);
                        pthread_mutex_unlock(&c->lock);
                }
                return dlx__fail(-ENOMEM, "out of memory");
        }
        a->c = c;
        a->map = m;
        a->has_gpu = gpu.ipc != NULL || gpu.vmm != NULL || gpu.host;
        a->gpu = gpu;
        a->lease = p->rep.acquire.lease;
        a->version = t->version;
        a->storage = t->storage;
        /* a mapping that refuses writes: host pages mapped read-only, VMM granted read access */
        a->write_protected =
                m && m->ro && data >= m->ro && data < m->ro + m->size &&
                (kind->host_mapped || (t->storage == WIRE_STORAGE_CUDA_VMM && !m->ro_writable));
        wire_strcpy(a->name, sizeof(a->name), t->name);
        acquired_init(a,
                      &(DLTensor){.data = data,
                                  .device = {(DLDeviceType)t->device_type, t->device_id},
                                  .ndim = t->ndim,
                                  .dtype = t->dtype,
                                  .shape = (int64_t *)t->shape,
                                  .strides = (int64_t *)t->strides,
                                  .byte_offset = t->byte_offset},
                      t->flags | (p->rep.acquire.writable ? 0 : DLPACK_FLAG_BITMASK_READ_ONLY));
        /* the mapping reference moves from the reply to the tensor */
        p->map = NULL;
        dlx__client_ref(c);
        pthread_mutex_lock(&c->lock);
        c->nacquired++;
        pthread_mutex_unlock(&c->lock);
        *ret = &a->mt;
        return 0;
}

int dlx__acquired_member(const DLTensor *t, uint64_t flags, bool writable, bool write_protected,
                         uint32_t storage, const char *name, uint64_t version, dlx_client *c,
                         struct gpu_acq *group_gpu, void (*drop)(void *hold), void *hold,
                         DLManagedTensorVersioned **ret)
{
        struct acquired *a = calloc(1, sizeof(*a) + 2 * (size_t)t->ndim * sizeof(int64_t));

        if (!a)
                return dlx__fail(-ENOMEM, "out of memory");
        a->drop = drop;
        a->hold = hold;
        a->c = c;
        a->group_gpu = group_gpu;
        a->version = version;
        a->storage = storage;
        a->write_protected = write_protected;
        wire_strcpy(a->name, sizeof(a->name), name);
        acquired_init(a, t,
                      writable ? flags & ~(uint64_t)DLPACK_FLAG_BITMASK_READ_ONLY
                               : flags | DLPACK_FLAG_BITMASK_READ_ONLY);
        *ret = &a->mt;
        return 0;
}

static int held_acquire(dlx_client *c, const char *name, const struct dlx_acquire_options *opts,
                        DLManagedTensorVersioned **ret_tensor)
{
        struct wire_request req = {.type = WIRE_REQ_ACQUIRE};
        const char *why = NULL;
        struct pending p;
        int err;

        if (!c || !name || !ret_tensor)
                return dlx__fail(-EINVAL, "NULL argument");
        if (layout_name_check(name, strlen(name), &why) < 0)
                return dlx__fail(-EINVAL, "bad name: %s", why);
        wire_strcpy(req.acquire.name, sizeof(req.acquire.name), name);
        if (opts) {
                req.acquire.min_version = opts->min_version;
                req.acquire.timeout_ms = opts->timeout_ms < 0 ? -1 : opts->timeout_ms;
        }
        err = dlx__call(c, &req, -1, &p);
        if (err == 0 && p.rep.type != WIRE_REP_ACQUIRE)
                err = dlx__fail(-EPROTO, "the daemon answered acquire with something else");
        if (err == 0)
                err = build_acquired(c, &p, opts ? opts->stream : NULL, ret_tensor);
        if (err < 0 && p.rep.status == WIRE_OK && p.rep.type == WIRE_REP_ACQUIRE)
                dlx__give_back(c, p.rep.acquire.lease); /* granted but unusable here */
        dlx__pending_done(c, &p);
        return err;
}

int dlx_acquire(dlx_client *c, const char *name, const struct dlx_acquire_options *opts,
                DLManagedTensorVersioned **ret_tensor)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL argument");
        return DLX_HOLDING(c, held_acquire(c, name, opts, ret_tensor));
}

/* The acquired tensor behind t (through exchange-API exports), or NULL. */
static struct acquired *acquired_of(const DLManagedTensorVersioned *t)
{
        t = dlx__exchange_unwrap(t);
        return t && t->deleter == acquired_deleter ? t->manager_ctx : NULL;
}

int dlx_tensor_info(const DLManagedTensorVersioned *t, const char **ret_name, uint64_t *ret_version,
                    const char **ret_storage)
{
        const struct acquired *a = acquired_of(t);

        if (!a)
                return dlx__fail(-EINVAL, "not a tensor from dlx_acquire()");
        if (ret_name)
                *ret_name = a->name;
        if (ret_version)
                *ret_version = a->version;
        if (ret_storage)
                *ret_storage = storage_name(a->storage);
        return 0;
}

int dlx_tensor_write_protected(const DLManagedTensorVersioned *t)
{
        const struct acquired *a = acquired_of(t);

        if (!a)
                return dlx__fail(-EINVAL, "not a tensor from dlx_acquire()");
        return a->write_protected ? 1 : 0;
}

int dlx_tensor_wait(const DLManagedTensorVersioned *t, int64_t timeout_ms)
{
        struct acquired *a = (struct acquired *)acquired_of(t);

        if (!a)
                return dlx__fail(-EINVAL, "not a tensor from dlx_acquire()");
        if (a->group_gpu)
                return dlx__gpu_wait_producer(a->group_gpu, timeout_ms);
        if (!a->has_gpu)
                return 0; /* host memory: every write was done before publish returned */
        return dlx__gpu_wait_producer(&a->gpu, timeout_ms);
}

int dlx_tensor_sync(DLManagedTensorVersioned *t, void *stream)
{
        struct acquired *a = acquired_of(t);
        int err;

        if (!a)
                return dlx__fail(-EINVAL, "not a tensor from dlx_acquire()");
        if (!a->has_gpu && !a->group_gpu)
                return 0; /* host memory: every write was done before publish returned */
        /* in a forked child: CUDA's own answer (-ENODEV, saying why) before the client's */
        if ((err = dlx__gpu_usable()) < 0 || (err = dlx__usable(a->c)) < 0)
                return err;
        pthread_mutex_lock(&a->c->lock);
        /* a device group's member: the group's release waits for this stream too */
        err = dlx__gpu_sync(a->c, a->group_gpu ? a->group_gpu : &a->gpu, stream);
        pthread_mutex_unlock(&a->c->lock);
        return err;
}

/* ---- alloc ---------------------------------------------------------------------------- */

static void allocated_deleter(DLManagedTensorVersioned *t)
{
        struct allocated *a = t->manager_ctx;
        dlx_client *c = a->c;

        /* a forked child's copy: the allocator is the parent's (see acquired_deleter) */
        if (dlx__forked(c)) {
                free(a);
                return;
        }

        pthread_mutex_lock(&c->lock);
        dlx__arena_free(c, a->map, a->offset, a->bytes);
        pthread_mutex_unlock(&c->lock);
        free(a);
        dlx__client_unref(c);
}

int dlx_alloc(dlx_client *c, const DLTensor *proto, DLManagedTensorVersioned **ret_tensor)
{
        const char *why = NULL;
        struct allocated *a;
        struct seg_map *m;
        uint64_t numel, bytes, off;
        int err;

        if (!c || !proto || !ret_tensor)
                return dlx__fail(-EINVAL, "NULL argument");
        int usable = dlx__usable(c);
        if (usable < 0)
                return usable;
        const struct storage_kind *made = storage_allocated_on(proto->device.device_type);
        if (!made)
                return dlx__fail(-ENOTSUP, "dlx_alloc: device type %d is not supported",
                                 (int)proto->device.device_type);
        uint32_t kind = made->id;
        int device = proto->device.device_type == kDLCPU ? 0 : proto->device.device_id;
        if (proto->ndim < 0 || proto->ndim > DLX_MAX_NDIM || (proto->ndim && !proto->shape))
                return dlx__fail(-EINVAL, "dlx_alloc: bad ndim %d or NULL shape", (int)proto->ndim);
        if (layout_dtype_check(proto->dtype, &why) < 0)
                return dlx__fail(-EINVAL, "dlx_alloc: %s", why);
        err = layout_numel(proto->ndim, proto->shape, &numel);
        if (err < 0)
                return dlx__fail(err, "dlx_alloc: %s",
                                 err == -EINVAL ? "negative dimension" : "size overflows");
        /* the bit count can pass 64 bits before the byte count does: check in 128 */
        if ((unsigned __int128)numel * proto->dtype.bits * proto->dtype.lanes >
            (unsigned __int128)DLX_MAX_SEGMENT * 8)
                return dlx__fail(-EOVERFLOW, "dlx_alloc: %llu elements are over the 1 TiB limit",
                                 (unsigned long long)numel);
        bytes = layout_compact_bytes(proto->dtype, numel, 0);

        a = calloc(1, sizeof(*a) + 2 * (size_t)proto->ndim * sizeof(int64_t));
        if (!a)
                return dlx__fail(-ENOMEM, "out of memory");
        /* the tensor's reference, taken first: the allocator may drop the lock to read
         * notices, and a dlx_close() racing it must not free the client under it */
        dlx__client_ref(c);
        err = dlx__arena_alloc(c, kind, device, bytes, &m, &off);
        if (err < 0) {
                dlx__client_unref(c);
                free(a);
                return err;
        }
        a->c = c;
        a->map = m;
        a->offset = off;
        a->bytes = bytes;
        if (proto->ndim) {
                memcpy(a->dims, proto->shape, (size_t)proto->ndim * sizeof(int64_t));
                layout_compact_strides(proto->ndim, proto->shape, a->dims + proto->ndim);
        }
        a->mt.version.major = DLX_DLPACK_MAJOR;
        a->mt.version.minor = DLX_DLPACK_MINOR;
        a->mt.manager_ctx = a;
        a->mt.deleter = allocated_deleter;
        a->mt.flags = 0;
        a->mt.dl_tensor.data = m->rw + off;
        a->mt.dl_tensor.device.device_type = proto->device.device_type;
        a->mt.dl_tensor.device.device_id = device;
        a->mt.dl_tensor.ndim = proto->ndim;
        a->mt.dl_tensor.dtype = proto->dtype;
        a->mt.dl_tensor.shape = proto->ndim ? a->dims : NULL;
        a->mt.dl_tensor.strides = proto->ndim ? a->dims + proto->ndim : NULL;
        a->mt.dl_tensor.byte_offset = 0;
        *ret_tensor = &a->mt;
        return 0;
}

/* ---- publish -------------------------------------------------------------------------- */

static int cmp_token(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct held, node)->token);
}

void dlx__held_insert(dlx_client *c, struct held *h, const char *name,
                      DLManagedTensorVersioned *tensor, struct wire_request *req)
{
        h->token = c->next_token++;
        h->tensor = tensor;
        snprintf(h->name, sizeof(h->name), "%s", name);
        avl_insert(&c->held, &h->node, &h->token, cmp_token);
        req->publish.token = h->token;
}

void dlx__held_answered(dlx_client *c, struct held *h, uint64_t token, int err, uint64_t version)
{
        pthread_mutex_lock(&c->lock);
        if (err == 0) {
                /* unless it is already released (and h gone), note its version */
                if (avl_find(&c->held, &token, cmp_token) == &h->node)
                        h->version = version;
        } else {
                avl_remove(&c->held, &h->node);
                if (h->has_gpu)
                        dlx__gpu_publish_undo(c, &h->gpu);
        }
        pthread_mutex_unlock(&c->lock);
        if (err < 0)
                free(h);
}

/* Copies [lo, hi) around the data pointer into a fresh sealed memfd; returns the fd. */
static int copy_to_memfd(const DLTensor *t, int64_t lo, int64_t hi, bool read_only,
                         uint64_t *ret_offset, uint64_t *ret_size)
{
        uint64_t seg_off = lo < 0 ? (0 - (uint64_t)lo) : 0;
        uint64_t size = seg_off + (hi > 0 ? (uint64_t)hi : 0);
        const uint8_t *src = (const uint8_t *)t->data + lo;
        uint64_t done = 0, len = hi > lo ? (uint64_t)(hi - lo) : 0;
        int fd, err;

        if (size == 0)
                size = 1; /* an empty memfd cannot be shared; one byte stands for nothing */
        fd = memfd_create("dlx-copy", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, (off_t)size) < 0)
                goto fail;
        /* write() fills the page cache directly: no page faults, exactly one copy */
        while (done < len) {
                ssize_t n = pwrite(fd, src + done, len - done,
                                   (off_t)((int64_t)seg_off + lo + (int64_t)done));
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        goto fail;
                }
                done += (uint64_t)n;
        }
        err = dlx__seal_fresh(fd, F_SEAL_SHRINK | F_SEAL_GROW | (read_only ? F_SEAL_WRITE : 0) |
                                          F_SEAL_SEAL);
        if (err < 0) {
                close(fd);
                return err;
        }
        *ret_offset = seg_off;
        *ret_size = size;
        return fd;
fail:
        err = -errno;
        close(fd);
        return err;
}

static int held_publish(dlx_client *c, const char *name, DLManagedTensorVersioned *tensor,
                        const struct dlx_publish_options *opts, uint64_t *ret_version);

int dlx_publish(dlx_client *c, const char *name, DLManagedTensorVersioned *tensor,
                const struct dlx_publish_options *opts, uint64_t *ret_version)
{
        if (!c)
                return held_publish(c, name, tensor, opts, ret_version); /* fails, deletes */
        return DLX_HOLDING(c, held_publish(c, name, tensor, opts, ret_version));
}

static int held_publish(dlx_client *c, const char *name, DLManagedTensorVersioned *tensor,
                        const struct dlx_publish_options *opts, uint64_t *ret_version)
{
        struct dlx_publish_options o = {0};
        struct wire_request req = {.type = WIRE_REQ_PUBLISH};
        struct wire_tensor *w = &req.publish.tensor;
        const DLTensor *t;
        const char *why = NULL;
        struct seg_map *map = NULL;
        struct held *h = NULL;
        struct pending p;
        int64_t lo, hi;
        int fd = -1, err;

        if (!c || !name || !tensor) {
                delete_tensor(tensor);
                return dlx__fail(-EINVAL, "NULL argument");
        }
        if ((err = dlx__usable(c)) < 0) {
                delete_tensor(tensor);
                return err;
        }
        if (tensor->version.major != DLX_DLPACK_MAJOR) {
                unsigned major = tensor->version.major;
                delete_tensor(tensor);
                return dlx__fail(-ENOTSUP, "DLPack major version %u is not supported", major);
        }
        if (opts)
                o = *opts;
        t = &tensor->dl_tensor;
        if (layout_name_check(name, strlen(name), &why) < 0) {
                err = dlx__fail(-EINVAL, "bad name '%s': %s", DLX_QUOTED(name), why);
                goto out_delete;
        }
        if (o.copy != DLX_COPY_IF_NEEDED && o.copy != DLX_COPY_NEVER && o.copy != DLX_COPY_ALWAYS) {
                err = dlx__fail(-EINVAL, "publish '%s': copy mode %d is not a dlx_copy", name,
                                (int)o.copy);
                goto out_delete;
        }
        /* a tensor may be published from the device types dlx_alloc() makes memory on */
        const struct storage_kind *made = storage_allocated_on(t->device.device_type);
        if (!made) {
                err = dlx__fail(-ENOTSUP, "publish '%s': device type %d is not supported", name,
                                (int)t->device.device_type);
                goto out_delete;
        }
        if (t->device.device_type == kDLCUDA && o.copy == DLX_COPY_ALWAYS) {
                err = dlx__fail(-ENOTSUP,
                                "publish '%s': copying a CUDA tensor is not supported; publish "
                                "it zero-copy (DLX_COPY_IF_NEEDED or DLX_COPY_NEVER)",
                                name);
                goto out_delete;
        }
        if (t->ndim < 0 || t->ndim > DLX_MAX_NDIM || (t->ndim && !t->shape) ||
            (!t->data && t->ndim >= 0)) {
                uint64_t numel = 0;
                if (t->ndim < 0 || t->ndim > DLX_MAX_NDIM || (t->ndim && !t->shape) ||
                    layout_numel(t->ndim, t->shape, &numel) < 0 || numel) {
                        err = dlx__fail(-EINVAL, "publish '%s': bad ndim, shape or data", name);
                        goto out_delete;
                }
        }
        err = layout_extent(t->dtype, t->ndim, t->shape, t->strides, t->byte_offset, tensor->flags,
                            &lo, &hi, &why);
        if (err < 0) {
                err = dlx__fail(err, "publish '%s': %s", name, why);
                goto out_delete;
        }

        snprintf(w->name, sizeof(w->name), "%s", name);
        w->dtype = t->dtype;
        w->ndim = t->ndim;
        if (t->ndim) {
                memcpy(w->shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
                if (t->strides)
                        memcpy(w->strides, t->strides, (size_t)t->ndim * sizeof(int64_t));
                else
                        layout_compact_strides(t->ndim, t->shape, w->strides);
        }
        w->byte_offset = t->byte_offset;
        w->device_type = t->device.device_type;
        w->device_id = t->device.device_type == kDLCPU ? 0 : t->device.device_id;
        w->flags = (o.writable ? 0 : DLPACK_FLAG_BITMASK_READ_ONLY) |
                   (tensor->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
        /* as the allocator (where a copy would go) makes it; gpu.c says which CUDA kind */
        w->storage = made->id;
        w->length = hi > 0 ? (uint64_t)hi : 0;
        err = dlx__publish_opts(c, &req, &o);
        if (err < 0)
                goto out_delete;

        pthread_mutex_lock(&c->lock);
        bool cuda = !made->host_mapped;
        const char *mixed = NULL;
        /* any tensor whose bytes lie in our allocator's memory goes as is */
        if (o.copy != DLX_COPY_ALWAYS && t->data)
                map = dlx__arena_find(c, made->id, t->data, lo, hi);
        /*
         * ... unless its segment already went the other way: dlxd seals a
         * segment against writing for its first read-only version, and one
         * whose readers may map it writable can carry no read-only version.
         */
        if (map && !cuda && !o.writable && map->shared_rw)
                mixed = "its segment carries a writable version, whose readers may write it";
        else if (map && !cuda && o.writable && map->sealed)
                mixed = "its segment is sealed against writing by a read-only version";
        if (mixed)
                map = NULL;
        else if (map && !cuda && o.writable)
                map->shared_rw = true;
        else if (map && !cuda)
                map->sealed = true;
        /* other device memory goes as is too, through its allocation's IPC handle */
        bool zero_copy = map != NULL || cuda;
        if (zero_copy) {
                h = calloc(1, sizeof(*h));
                if (!h) {
                        pthread_mutex_unlock(&c->lock);
                        err = dlx__fail(-ENOMEM, "out of memory");
                        goto out_delete;
                }
                if (!cuda) {
                        w->offset = (uint64_t)((const uint8_t *)t->data - map->rw);
                        w->segment = map->id;
                }
                if (!cuda && made->needs_cuda) {
                        /* pinned host memory: readers wait for the GPU's writes too */
                        void *stream =
                                o.stream ? o.stream : dlx__gpu_stream(c, t->device.device_id);
                        err = dlx__gpu_publish_host(c, t->device.device_id, stream, &req, &h->gpu);
                        if (err < 0) {
                                pthread_mutex_unlock(&c->lock);
                                free(h);
                                goto out_delete;
                        }
                        h->has_gpu = true;
                } else if (cuda) {
                        void *stream =
                                o.stream ? o.stream : dlx__gpu_stream(c, t->device.device_id);
                        err = dlx__gpu_publish(c, t, map, stream, &req, &h->gpu);
                        if (err < 0) {
                                pthread_mutex_unlock(&c->lock);
                                free(h);
                                goto out_delete; /* the detail is recorded already */
                        }
                        h->has_gpu = true;
                        /* a framework's VMM allocation, exported: the daemon keeps its fd */
                        if (h->gpu.has_fd) {
                                fd = h->gpu.fd;
                                h->gpu.has_fd = false;
                        }
                }
                /* registered before the request: RELEASED may follow the reply at once */
                dlx__held_insert(c, h, name, tensor, &req);
        }
        pthread_mutex_unlock(&c->lock);

        if (!zero_copy) {
                uint64_t size;
                if (o.copy == DLX_COPY_NEVER && mixed) {
                        err = dlx__fail(-EXDEV,
                                        "publish '%s' %s: %s, and copying is not allowed; "
                                        "allocate it from another client",
                                        name, o.writable ? "writable" : "read-only", mixed);
                        goto out_delete;
                }
                if (o.copy == DLX_COPY_NEVER) {
                        err = dlx__fail(-EXDEV,
                                        "publish '%s': the memory is not from dlx_alloc() on "
                                        "this client and copying is not allowed",
                                        name);
                        goto out_delete;
                }
                /* pinned host memory a GPU may still be writing: its work first */
                if (made->needs_cuda) {
                        err = dlx__gpu_stream_wait(
                                t->device.device_id,
                                o.stream ? o.stream : dlx__gpu_stream(c, t->device.device_id));
                        if (err < 0)
                                goto out_delete;
                }
                fd = copy_to_memfd(t, lo, hi, !o.writable, &w->offset, &size);
                if (fd < 0) {
                        err = dlx__fail(fd, "publish '%s': cannot copy into shared memory: %s",
                                        name, strerror(-fd));
                        goto out_delete;
                }
                /* the copy is all the daemon needs: the original goes now */
                delete_tensor(tensor);
                tensor = NULL;
        }

        err = dlx__call(c, &req, fd, &p);
        /* a copy counts against the byte limits: not beside our own empty segments */
        if (err == -ENOSPC && fd >= 0 && dlx__arena_give_back_empty(c) > 0) {
                dlx__pending_done(c, &p);
                err = dlx__call(c, &req, fd, &p);
        }
        fd_drop(&fd);
        if (err == 0 && p.rep.type != WIRE_REP_PUBLISH)
                err = dlx__fail(-EPROTO, "the daemon answered publish with something else");
        if (err == 0 && ret_version)
                *ret_version = p.rep.publish.version;
        /* refused, a zero-copy publish leaves the tensor ours to delete */
        if (h)
                dlx__held_answered(c, h, req.publish.token, err, p.rep.publish.version);
        dlx__pending_done(c, &p);
        if (err == 0 || !h)
                return err;
out_delete:
        delete_tensor(tensor);
        return err;
}

static void legacy_deleter(DLManagedTensorVersioned *t)
{
        struct legacy *l = t->manager_ctx;

        if (l->orig->deleter)
                l->orig->deleter(l->orig);
        free(l);
}

int dlx_tensor_from_legacy(DLManagedTensor *tensor, DLManagedTensorVersioned **ret_tensor)
{
        struct legacy *l;

        if (!tensor || !ret_tensor) {
                if (tensor && tensor->deleter)
                        tensor->deleter(tensor);
                return dlx__fail(-EINVAL, "NULL tensor");
        }
        l = calloc(1, sizeof(*l));
        if (!l) {
                if (tensor->deleter)
                        tensor->deleter(tensor);
                return dlx__fail(-ENOMEM, "out of memory");
        }
        l->orig = tensor;
        l->mt.version.major = DLX_DLPACK_MAJOR;
        l->mt.version.minor = DLX_DLPACK_MINOR;
        l->mt.manager_ctx = l;
        l->mt.deleter = legacy_deleter;
        l->mt.dl_tensor = tensor->dl_tensor;
        *ret_tensor = &l->mt;
        return 0;
}

int dlx_publish_legacy(dlx_client *c, const char *name, DLManagedTensor *tensor,
                       const struct dlx_publish_options *opts, uint64_t *ret_version)
{
        DLManagedTensorVersioned *mt;
        int err = dlx_tensor_from_legacy(tensor, &mt);

        if (err < 0)
                return err;
        return dlx_publish(c, name, mt, opts, ret_version);
}

int dlx_publish_from(dlx_client *c, const char *name, const DLPackExchangeAPI *api, void *object,
                     const struct dlx_publish_options *opts, uint64_t *ret_version)
{
        struct dlx_publish_options o = {0};
        DLManagedTensorVersioned *mt = NULL;

        if (!api || !api->managed_tensor_from_py_object_no_sync)
                return dlx__fail(-EINVAL, "no exchange-API table or no from-object slot");
        if (api->header.version.major != DLX_DLPACK_MAJOR)
                return dlx__fail(-ENOTSUP, "exchange API of DLPack major %u",
                                 (unsigned)api->header.version.major);
        if (api->managed_tensor_from_py_object_no_sync(object, &mt) != 0 || !mt)
                return dlx__fail(-EIO, "the producer's exchange API could not export the object");
        if (opts)
                o = *opts;
        if (mt->dl_tensor.device.device_type != kDLCPU && !o.stream && api->current_work_stream &&
            api->current_work_stream(mt->dl_tensor.device.device_type,
                                     mt->dl_tensor.device.device_id, &o.stream) != 0) {
                mt->deleter ? mt->deleter(mt) : (void)0;
                return dlx__fail(-EIO, "the producer's exchange API has no current stream");
        }
        return dlx_publish(c, name, mt, &o, ret_version);
}
