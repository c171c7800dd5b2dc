/* SPDX-License-Identifier: MIT */
/*
 * CUDA sharing by legacy IPC handles, ordered by interprocess events (the
 * memory libdlx makes or maps itself, VMM and pinned host, is gpumem.c).
 *
 * Producer: a tensor's allocation base is exported once as an IPC handle
 * (with the tensor's offset into it) and an event from the client's pool is
 * recorded on the producer's stream. The event goes back to the pool only
 * when the version is RELEASED, that is after every lease that could wait on
 * it has gone, and the producer's stream then waits for each reader's
 * release event before the tensor's deleter runs.
 *
 * Consumer: each handle is opened once per process (CUDA refuses a second
 * open) and shared by every tensor in it; the consumer's stream waits on the
 * producer's event, and on release an event recorded on that stream tells
 * the producer when the reader is done. An allocation whose last tensor is
 * released is closed only once the reader's work on it has completed.
 */
#include "gpu.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cudadrv.h"

/* Release events each client cycles through per context (not the release ring: no leases here). */
#define RELEASE_EVENTS 64
/* Opened foreign events kept per process. */
#define MAX_OPENED_EVENTS 4096

/* An interprocess event of ours, made in (and recorded only on streams of) one context. */
struct gpu_event {
        struct gpu_event *next;
        CUevent ev;
        CUcontext ctx;
        bool recorded;
        CUipcEventHandle handle;
};

/* The release events of one context, reused in turn. */
struct rel_ring {
        struct rel_ring *next;
        CUcontext ctx;
        unsigned next_slot;
        struct gpu_event slot[RELEASE_EVENTS];
};

struct gpu_state {
        struct gpu_event *pool; /* free publish events, of every context */
        struct rel_ring *rings;
};

/* An IPC allocation opened in this process. */
struct gpu_ipc {
        struct avl_node node;
        uint8_t key[DLX_CUDA_HANDLE];
        CUdeviceptr base;
        int device;
        unsigned refs;
        CUevent done; /* while closing: the last reader's release event */
        bool own;     /* exported by this process: never opened, never closed */
        struct gpu_ipc *next_closing;
};

/* A producer's event opened here: by its handle and its producer's session (the daemon's). */
#define EVENT_KEY (DLX_CUDA_HANDLE + sizeof(uint64_t))
struct opened_event {
        struct avl_node node;
        uint8_t key[EVENT_KEY];
        CUevent ev;
};

/* CUDA allows one open per handle per process: the caches are the process's. */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
/* Interprocess events this process made (drivers fail at some tens of thousands). cache_lock. */
static unsigned ipc_events;
/*
 * Publish events of versions a client still held when it closed: readers may
 * hold leases on them, and wait on the event, for as long as they like. Their
 * work is done (dlx__gpu_close), so such a wait ends at once; destroyed, the
 * event would leave the wait undefined. Kept while the process lives, and
 * counted among its interprocess events. cache_lock.
 */
static struct gpu_event *retired;
static unsigned nretired;
/*
 * Release events of clients that closed, their work done. A producer may have
 * opened one and not yet enqueued its wait: destroyed, the event would leave
 * that wait undefined. Kept for the process's later clients to record again
 * (which only makes such a wait longer), counted with the retired. cache_lock.
 */
static struct gpu_event *spare;
static unsigned nspare;
static struct avl_tree ipc_cache;
static struct avl_tree event_cache;
static struct gpu_ipc *closing;

/*
 * What this process exported itself: a process cannot open its own IPC
 * handles, so a client acquiring what it (or another client in the process)
 * published uses the original pointer or event instead.
 */
struct exported {
        struct avl_node node;
        uint8_t key[DLX_CUDA_HANDLE];
        CUdeviceptr base; /* a memory handle's allocation, or 0 */
        CUevent ev;       /* an event handle's event, or NULL */
};
static struct avl_tree exported;

static int cmp_exported(const void *key, const struct avl_node *n)
{
        return memcmp(key, avl_entry(n, struct exported, node)->key, DLX_CUDA_HANDLE);
}

/* Remembers one of our handles (idempotent). cache_lock held. */
static void export_note(const uint8_t key[DLX_CUDA_HANDLE], CUdeviceptr base, CUevent ev)
{
        struct exported *x;

        if (avl_find(&exported, key, cmp_exported))
                return;
        x = calloc(1, sizeof(*x));
        if (!x)
                return; /* an own acquire will then fail clearly in the driver */
        memcpy(x->key, key, DLX_CUDA_HANDLE);
        x->base = base;
        x->ev = ev;
        avl_insert(&exported, &x->node, x->key, cmp_exported);
}

static void export_forget_event(const uint8_t key[DLX_CUDA_HANDLE])
{
        struct avl_node *n = avl_find(&exported, key, cmp_exported);

        if (n) {
                avl_remove(&exported, n);
                free(avl_entry(n, struct exported, node));
        }
}

static struct exported *export_find(const uint8_t key[DLX_CUDA_HANDLE])
{
        struct avl_node *n = avl_find(&exported, key, cmp_exported);
        return n ? avl_entry(n, struct exported, node) : NULL;
}

static int cmp_key(const void *key, const uint8_t *node_key)
{
        return memcmp(key, node_key, DLX_CUDA_HANDLE);
}

static int cmp_ipc(const void *key, const struct avl_node *n)
{
        return cmp_key(key, avl_entry(n, struct gpu_ipc, node)->key);
}

static int cmp_event(const void *key, const struct avl_node *n)
{
        return memcmp(key, avl_entry(n, struct opened_event, node)->key, EVENT_KEY);
}

int dlx__gpu_device_ok(int device)
{
        if (device < 0 || device >= DLX_GPU_MAX_DEVICES)
                return dlx__fail(-ENODEV, "CUDA device %d is out of range", device);
        return 0;
}

int dlx__gpu_enter(int device, const struct dlx_cuda_driver **ret_cu)
{
        int err = dlx__gpu_device_ok(device);

        if (err == 0)
                err = dlx__cuda(ret_cu);
        if (err == 0)
                err = dlx__cuda_enter(*ret_cu, device);
        return err;
}

uint64_t dlx__pid_namespace(void)
{
        /* a process's own namespace never changes; a child's may be another */
        static pid_t pid;
        static uint64_t ns;
        pid_t now = getpid();
        struct stat st;

        if (__atomic_load_n(&pid, __ATOMIC_ACQUIRE) == now)
                return __atomic_load_n(&ns, __ATOMIC_RELAXED);
        if (stat("/proc/self/ns/pid", &st) < 0)
                return 0;
        __atomic_store_n(&ns, (uint64_t)st.st_ino, __ATOMIC_RELAXED);
        __atomic_store_n(&pid, now, __ATOMIC_RELEASE);
        return (uint64_t)st.st_ino;
}

int dlx__gpu_reachable(struct wire_tensor *t)
{
        const struct dlx_cuda_driver *cu;
        int err, ordinal;
        char hex[2 * DLX_CUDA_UUID + 1];

        /* legacy IPC finds its exporter by pid: within one PID namespace only */
        if (t->pid_namespace && dlx__pid_namespace() && t->pid_namespace != dlx__pid_namespace()) {
                if (t->storage == WIRE_STORAGE_CUDA_IPC)
                        return dlx__fail(-EXDEV,
                                         "'%s' is shared by legacy CUDA IPC from another PID "
                                         "namespace (a container that does not share the "
                                         "producer's), where its handle cannot open: publish "
                                         "it persistent from dlx_alloc() memory (cuda-vmm, "
                                         "whose fd travels through dlxd), or share the PID "
                                         "namespace",
                                         t->name);
                if (t->has_event)
                        return dlx__fail(-EXDEV,
                                         "'%s' is ordered by a legacy CUDA IPC event from "
                                         "another PID namespace, where it cannot open: publish "
                                         "it persistent (its writes are then done when it is "
                                         "published, and it needs no event), or share the PID "
                                         "namespace",
                                         t->name);
        }
        if (t->device_type != kDLCUDA || !t->has_device_uuid)
                return 0;
        err = dlx__cuda(&cu);
        if (err == 0)
                err = dlx__cuda_ordinal(cu, t->device_uuid, &ordinal);
        if (err == 0) {
                t->device_id = ordinal;
                return 0;
        }
        if (err != -ENOENT)
                return err;
        for (int i = 0; i < DLX_CUDA_UUID; i++)
                snprintf(hex + 2 * i, 3, "%02x", t->device_uuid[i]);
        return dlx__fail(-ENODEV,
                         "'%s' is on a GPU this process does not see (UUID %s, the producer's "
                         "device %d): is CUDA_VISIBLE_DEVICES narrower here?",
                         t->name, hex, t->device_id);
}

static struct gpu_state *state(dlx_client *c)
{
        if (!c->gpu)
                c->gpu = calloc(1, sizeof(*c->gpu));
        return c->gpu;
}

void *dlx__gpu_stream(dlx_client *c, int device)
{
        return device >= 0 && device < DLX_GPU_MAX_DEVICES ? c->streams[device] : NULL;
}

/* Closes an opened IPC allocation in the context that opened it (elsewhere it leaks). */
static void ipc_close(const struct dlx_cuda_driver *cu, struct gpu_ipc *m)
{
        if (!m->own && dlx__cuda_enter(cu, m->device) == 0) {
                CUresult r = cu->IpcCloseMemHandle(m->base);
                dlx__cuda_leave(cu);
                if (r != CUDA_SUCCESS)
                        dlx__cuda_fail(cu, r, "cuIpcCloseMemHandle"); /* recorded, nothing more */
        }
        free(m);
}

/* Closes IPC allocations whose last reader's work is done. cache_lock held. */
static void sweep_closing(const struct dlx_cuda_driver *cu)
{
        for (struct gpu_ipc **pp = &closing; *pp;) {
                struct gpu_ipc *m = *pp;
                if (m->done && cu->EventQuery(m->done) == CUDA_ERROR_NOT_READY) {
                        pp = &m->next_closing;
                        continue;
                }
                *pp = m->next_closing;
                ipc_close(cu, m);
        }
}

/*
 * Opens an event another process exported (*ret_own false: the caller
 * destroys it; a wait already enqueued on an event survives that), or finds
 * one of ours (*ret_own true). cache_lock held.
 */
static int open_once(const struct dlx_cuda_driver *cu, const uint8_t handle[DLX_CUDA_HANDLE],
                     CUevent *ret, bool *ret_own)
{
        struct exported *x = export_find(handle);
        CUipcEventHandle h;
        CUresult r;

        *ret_own = x && x->ev;
        if (*ret_own) {
                *ret = x->ev; /* our own event: wait on it directly */
                return 0;
        }
        memcpy(h.reserved, handle, DLX_CUDA_HANDLE);
        r = cu->IpcOpenEventHandle(ret, h);
        if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_HANDLE)
                /* what the driver says of a handle whose process has exited */
                return dlx__fail(-ESRCH, "cuIpcOpenEventHandle: the event's process is gone");
        if (r == CUDA_ERROR_INVALID_CONTEXT)
                /* one of this process's, no longer known: its client closed, its work done */
                return dlx__fail(-ESRCH, "cuIpcOpenEventHandle: the event's client has closed");
        if (r != CUDA_SUCCESS)
                return dlx__cuda_fail(cu, r, "cuIpcOpenEventHandle");
        return 0;
}

/*
 * A producer's event, opened once per producer session and kept: the session
 * (the daemon's number for the producer, never reused) keeps an event of a
 * process that has gone from standing for another's with the same handle.
 * cache_lock held.
 */
static int open_event(const struct dlx_cuda_driver *cu, const uint8_t handle[DLX_CUDA_HANDLE],
                      uint64_t session, CUevent *ret)
{
        uint8_t key[EVENT_KEY];
        struct avl_node *n;
        struct opened_event *o;
        bool own;
        int err;

        memcpy(key, handle, DLX_CUDA_HANDLE);
        memcpy(key + DLX_CUDA_HANDLE, &session, sizeof(session));
        n = avl_find(&event_cache, key, cmp_event);
        if (n) {
                *ret = avl_entry(n, struct opened_event, node)->ev;
                return 0;
        }
        if (event_cache.count >= MAX_OPENED_EVENTS) {
                /* a wait already enqueued on an event survives its destruction */
                o = avl_entry(avl_first(&event_cache), struct opened_event, node);
                avl_remove(&event_cache, &o->node);
                cu->EventDestroy(o->ev);
                free(o);
        }
        o = calloc(1, sizeof(*o));
        if (!o)
                return dlx__fail(-ENOMEM, "out of memory");
        err = open_once(cu, handle, &o->ev, &own);
        if (err < 0 || own) {
                *ret = o->ev;
                free(o);
                return err;
        }
        memcpy(o->key, key, EVENT_KEY);
        avl_insert(&event_cache, &o->node, o->key, cmp_event);
        *ret = o->ev;
        return 0;
}

int dlx__gpu_wait_events(dlx_client *c, int device, void *stream,
                         uint8_t (*events)[DLX_CUDA_HANDLE], uint32_t nevents)
{
        const struct dlx_cuda_driver *cu;
        int err;

        if (nevents == 0)
                return 0;
        err = dlx__gpu_enter(device, &cu);
        if (err < 0)
                return err;
        pthread_mutex_lock(&cache_lock);
        for (uint32_t i = 0; i < nevents && err == 0; i++) {
                CUevent ev = NULL;
                CUresult r;
                bool own;
                /*
                 * A reader that has exited cannot be waited for, and need not be:
                 * its context, and the work queued in it, went with it. A reader's
                 * event is opened for this wait alone: kept, it could outlive its
                 * reader and stand for another process's later.
                 */
                err = open_once(cu, events[i], &ev, &own);
                if (err == -ESRCH) {
                        dlx__log(c, DLX_LOG_DEBUG, "a reader's release event is gone");
                        err = 0;
                        continue;
                }
                if (err == 0 && (r = cu->StreamWaitEvent(stream, ev, 0)) != CUDA_SUCCESS)
                        err = dlx__cuda_fail(cu, r, "cuStreamWaitEvent");
                if (ev && !own)
                        cu->EventDestroy(ev);
        }
        pthread_mutex_unlock(&cache_lock);
        dlx__cuda_leave(cu);
        return err;
}

/* ---- producer ------------------------------------------------------------------------- */

/* Makes an interprocess event in the current context, ctx. -ENOSPC: the process has its most. */
static int event_make(const struct dlx_cuda_driver *cu, CUcontext ctx, struct gpu_event *e)
{
        CUresult r;

        pthread_mutex_lock(&cache_lock);
        if (ipc_events >= DLX_GPU_IPC_EVENTS) {
                pthread_mutex_unlock(&cache_lock);
                return -ENOSPC;
        }
        ipc_events++;
        pthread_mutex_unlock(&cache_lock);
        r = cu->EventCreate(&e->ev, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS);
        if (r == CUDA_SUCCESS) {
                r = cu->IpcGetEventHandle(&e->handle, e->ev);
                if (r != CUDA_SUCCESS)
                        cu->EventDestroy(e->ev);
        }
        pthread_mutex_lock(&cache_lock);
        if (r == CUDA_SUCCESS)
                export_note((const uint8_t *)e->handle.reserved, 0, e->ev);
        else
                ipc_events--;
        pthread_mutex_unlock(&cache_lock);
        if (r != CUDA_SUCCESS) {
                e->ev = NULL;
                return dlx__cuda_fail(cu, r, "interprocess event");
        }
        e->ctx = ctx;
        e->recorded = false;
        return 0;
}

/* Destroys one of our events (its work done, or no longer anyone's to wait for). */
static void event_unmake(const struct dlx_cuda_driver *cu, struct gpu_event *e)
{
        pthread_mutex_lock(&cache_lock);
        export_forget_event((const uint8_t *)e->handle.reserved);
        ipc_events--;
        pthread_mutex_unlock(&cache_lock);
        cu->EventDestroy(e->ev);
        e->ev = NULL;
}

/* A publish event of ctx (current): from the pool, or made. -ENOSPC as event_make(). */
static int take_event(const struct dlx_cuda_driver *cu, struct gpu_state *g, CUcontext ctx,
                      struct gpu_event **ret)
{
        struct gpu_event *e;
        int err;

        for (struct gpu_event **pp = &g->pool; (e = *pp); pp = &e->next) {
                if (e->ctx == ctx) {
                        *pp = e->next;
                        *ret = e;
                        return 0;
                }
        }
        e = calloc(1, sizeof(*e));
        if (!e)
                return dlx__fail(-ENOMEM, "out of memory");
        err = event_make(cu, ctx, e);
        if (err < 0) {
                free(e);
                return err;
        }
        *ret = e;
        return 0;
}

/*
 * Orders readers after the work queued so far on stream: an event recorded
 * on it, in its context, into req and *ret. When the process has made its
 * most interprocess events (DLX_GPU_IPC_EVENTS), waits for that work on the
 * host instead and gives no event: readers then need none.
 */
static int publish_event(const struct dlx_cuda_driver *cu, dlx_client *c, int device, void *stream,
                         struct wire_request *req, struct gpu_pub *ret)
{
        struct wire_tensor *w = &req->publish.tensor;
        struct gpu_event *e = NULL;
        CUcontext ctx;
        CUresult r;
        int err;

        err = dlx__cuda_enter_stream(cu, device, stream, &ctx);
        if (err < 0)
                return err;
        /*
         * A persistent version outlives its producer and may be read from
         * anywhere, from other PID namespaces too, where a legacy IPC event
         * cannot open: its writes are done before it is published, and it
         * carries no event.
         */
        err = req->publish.persist ? -ENOSPC : take_event(cu, c->gpu, ctx, &e);
        if (err == -ENOSPC && req->publish.persist) {
                r = cu->StreamSynchronize((CUstream)stream);
                err = r == CUDA_SUCCESS ? 0 : dlx__cuda_fail(cu, r, "cuStreamSynchronize");
                e = NULL;
        } else if (err == -ENOSPC) {
                dlx__log(c, DLX_LOG_DEBUG,
                         "%d interprocess events in this process: waiting for the stream on "
                         "the host instead",
                         DLX_GPU_IPC_EVENTS);
                r = cu->StreamSynchronize((CUstream)stream);
                err = r == CUDA_SUCCESS ? 0 : dlx__cuda_fail(cu, r, "cuStreamSynchronize");
                e = NULL;
        } else if (err == 0) {
                r = cu->EventRecord(e->ev, (CUstream)stream);
                if (r != CUDA_SUCCESS) {
                        e->next = c->gpu->pool;
                        c->gpu->pool = e;
                        err = dlx__cuda_fail(cu, r, "cuEventRecord");
                } else {
                        e->recorded = true;
                }
        }
        dlx__cuda_leave(cu);
        if (err < 0)
                return err;
        w->has_event = e != NULL;
        if (e)
                memcpy(w->event, e->handle.reserved, DLX_CUDA_HANDLE);
        /* legacy IPC (memory, events) opens only in the producer's PID namespace */
        if (e || w->storage == WIRE_STORAGE_CUDA_IPC)
                w->pid_namespace = dlx__pid_namespace();
        ret->device = device;
        ret->stream = stream;
        ret->event = e;
        return 0;
}

/* A pointer attribute, or false when the driver cannot say (older drivers lack some). */
static bool attribute(const struct dlx_cuda_driver *cu, void *ret, CUpointer_attribute a,
                      CUdeviceptr p)
{
        return cu->PointerGetAttribute(ret, a, p) == CUDA_SUCCESS;
}

/*
 * Memory a framework allocated: by legacy IPC when the driver says it can
 * (cuMemAlloc, cudaMalloc), as an exported VMM allocation when it was made
 * shareable as a POSIX fd (ret->fd then goes with the publish), else refused
 * with what it is: managed memory, a stream-ordered pool's, or a VMM
 * allocation made without a shareable handle (PyTorch's expandable segments).
 */
static int share_foreign(const struct dlx_cuda_driver *cu, const DLTensor *t,
                         struct wire_request *req, struct gpu_pub *ret)
{
        const char *name = req->publish.tensor.name;
        struct wire_tensor *w = &req->publish.tensor;
        CUdeviceptr base, data = (CUdeviceptr)(uintptr_t)t->data;
        unsigned long long types = 0;
        void *pool = NULL, *mbase = NULL;
        bool managed = false, legacy = true;
        size_t size = 0;
        CUipcMemHandle h;
        CUresult r;

        r = cu->MemGetAddressRange(&base, &size, data);
        if (r != CUDA_SUCCESS) {
                const char *what = NULL;
                cu->GetErrorString(r, &what);
                return dlx__fail(-EINVAL, "the tensor's data is not CUDA device memory (%s)",
                                 what ? what : "unknown error");
        }
        if (attribute(cu, &managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, data) && managed)
                return dlx__fail(-ENOTSUP,
                                 "publish '%s': managed memory (cudaMallocManaged) cannot be "
                                 "shared between processes; allocate it with dlx_alloc(), or "
                                 "copy it into such memory",
                                 name);
        if (attribute(cu, &pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, data) && pool)
                return dlx__fail(-ENOTSUP,
                                 "publish '%s': memory from a stream-ordered pool "
                                 "(cudaMallocAsync, a CUDA memory pool) has no IPC handle; "
                                 "allocate it with dlx_alloc(), or copy it into such memory",
                                 name);
        attribute(cu, &legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, data);
        if (!legacy) {
                CUmemGenericAllocationHandle handle;
                int fd = -1;

                if (!attribute(cu, &types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, data) ||
                    !(types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
                        return dlx__fail(-ENOTSUP,
                                         "publish '%s': this CUDA memory was made by cuMemCreate "
                                         "without a POSIX file descriptor handle type (PyTorch's "
                                         "expandable_segments, say) and cannot be shared; "
                                         "allocate it with dlx_alloc(), or turn expandable "
                                         "segments off",
                                         name);
                if (!attribute(cu, &mbase, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, data) ||
                    !attribute(cu, &size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, data) || !size)
                        return dlx__fail(-ENOTSUP,
                                         "publish '%s': the driver does not say which VMM "
                                         "allocation the tensor is in",
                                         name);
                w->offset = data - (CUdeviceptr)(uintptr_t)mbase;
                if (w->offset > size || w->length > size - w->offset)
                        return dlx__fail(-ENOTSUP,
                                         "publish '%s': the tensor spans more than one VMM "
                                         "allocation (%zu bytes mapped at its start); copy it",
                                         name, size);
                r = cu->MemRetainAllocationHandle(&handle, (void *)(uintptr_t)data);
                if (r != CUDA_SUCCESS)
                        return dlx__cuda_fail(cu, r, "cuMemRetainAllocationHandle");
                r = cu->MemExportToShareableHandle(&fd, handle,
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                cu->MemRelease(handle); /* the mapping keeps the allocation, the fd its share */
                if (r != CUDA_SUCCESS)
                        return dlx__cuda_fail(cu, r, "cuMemExportToShareableHandle");
                w->storage = WIRE_STORAGE_CUDA_VMM;
                req->publish.segment_size = size;
                ret->has_fd = true;
                ret->fd = fd;
                return 0;
        }
        if (data - base > size || w->length > size - (data - base))
                return dlx__fail(-ENOTSUP,
                                 "publish '%s': the tensor spans more than one allocation (%zu "
                                 "bytes at its start); copy it",
                                 name, size - (size_t)(data - base));
        r = cu->IpcGetMemHandle(&h, base);
        if (r != CUDA_SUCCESS)
                return dlx__cuda_fail(cu, r,
                                      "cuIpcGetMemHandle (memory from cuMemCreate or a pool "
                                      "cannot be shared by legacy IPC: allocate it with "
                                      "dlx_alloc)");
        w->storage = WIRE_STORAGE_CUDA_IPC;
        w->has_ipc_handle = true;
        memcpy(w->ipc_handle, h.reserved, DLX_CUDA_HANDLE);
        w->offset = data - base;
        req->publish.segment_size = size;
        pthread_mutex_lock(&cache_lock);
        export_note(w->ipc_handle, base, NULL);
        pthread_mutex_unlock(&cache_lock);
        return 0;
}

int dlx__gpu_publish(dlx_client *c, const DLTensor *t, struct seg_map *vmm, void *stream,
                     struct wire_request *req, struct gpu_pub *ret)
{
        struct wire_tensor *w = &req->publish.tensor;
        const struct dlx_cuda_driver *cu;
        int device = t->device.device_id;
        struct gpu_state *g = state(c);
        CUdeviceptr data = (CUdeviceptr)(uintptr_t)t->data;
        int err;

        if (!g)
                return dlx__fail(-ENOMEM, "out of memory");
        err = dlx__gpu_device_ok(device);
        if (err == 0 && vmm && vmm->device != device)
                err = dlx__fail(-EINVAL, "the tensor says device %d, its memory is on %d", device,
                                vmm->device);
        if (err == 0)
                err = dlx__cuda(&cu);
        if (err == 0)
                err = dlx__cuda_enter(cu, device);
        if (err < 0)
                return err;
        /* the device by what names it in every process, not by this one's ordinal */
        err = dlx__cuda_uuid(cu, device, w->device_uuid);
        if (err < 0)
                goto out;
        w->has_device_uuid = true;
        if (vmm) {
                /* our allocator's memory: the segment the daemon already holds */
                w->storage = WIRE_STORAGE_CUDA_VMM;
                w->segment = vmm->id;
                vmm->wrote_on = stream; /* unmapping waits for it */
                w->offset = data - (CUdeviceptr)(uintptr_t)vmm->rw;
        } else {
                err = share_foreign(cu, t, req, ret);
                if (err < 0)
                        goto out;
        }
        err = publish_event(cu, c, device, stream, req, ret);
out:
        dlx__cuda_leave(cu);
        return err;
}

int dlx__gpu_publish_host(dlx_client *c, int device, void *stream, struct wire_request *req,
                          struct gpu_pub *ret)
{
        const struct dlx_cuda_driver *cu;
        int err;

        if (!state(c))
                return dlx__fail(-ENOMEM, "out of memory");
        err = dlx__cuda(&cu);
        if (err == 0)
                err = publish_event(cu, c, device, stream, req, ret);
        return err;
}

int dlx__gpu_stream_wait(int device, void *stream)
{
        return dlx__gpu_copy_wait(device, stream, NULL, 0);
}

int dlx__gpu_copy_wait(int device, void *stream, const struct dlx_gpu_copy *v, size_t n)
{
        const struct dlx_cuda_driver *cu;
        CUcontext ctx;
        CUresult r = CUDA_SUCCESS;
        int err;

        err = dlx__cuda(&cu);
        if (err == 0)
                err = dlx__cuda_enter_stream(cu, device, stream, &ctx);
        if (err < 0)
                return err;
        for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++)
                r = cu->MemcpyAsync((CUdeviceptr)v[i].dst, (CUdeviceptr)v[i].src, v[i].len,
                                    (CUstream)stream);
        if (r != CUDA_SUCCESS) {
                err = dlx__cuda_fail(cu, r, "cuMemcpyAsync");
        } else {
                r = cu->StreamSynchronize((CUstream)stream);
                err = r == CUDA_SUCCESS ? 0 : dlx__cuda_fail(cu, r, "cuStreamSynchronize");
        }
        dlx__cuda_leave(cu);
        return err;
}

void dlx__gpu_publish_undo(dlx_client *c, struct gpu_pub *pub)
{
        if (pub->event && c->gpu) {
                pub->event->next = c->gpu->pool;
                c->gpu->pool = pub->event;
        }
        pub->event = NULL;
}

void dlx__gpu_released(dlx_client *c, struct gpu_pub *pub, uint8_t (*events)[DLX_CUDA_HANDLE],
                       uint32_t nevents)
{
        int err = dlx__gpu_wait_events(c, pub->device, pub->stream, events, nevents);

        if (err < 0)
                dlx__log(c, DLX_LOG_WARNING,
                         "cannot order the producer's stream after its readers: %s",
                         dlx_last_error());
        dlx__gpu_publish_undo(c, pub);
}

/* ---- consumer ------------------------------------------------------------------------- */

/* Opens (or finds) an IPC allocation, one reference. cache_lock held. */
static int ipc_open(const struct dlx_cuda_driver *cu, const struct wire_tensor *t,
                    struct gpu_ipc **ret)
{
        struct avl_node *n = avl_find(&ipc_cache, t->ipc_handle, cmp_ipc);
        struct gpu_ipc *m;
        CUipcMemHandle h;
        CUresult r;

        if (n) {
                m = avl_entry(n, struct gpu_ipc, node);
                m->refs++;
                *ret = m;
                return 0;
        }
        /* an opening still waiting for its last reader to finish: take it back */
        for (struct gpu_ipc **pp = &closing; *pp; pp = &(*pp)->next_closing) {
                if (memcmp((*pp)->key, t->ipc_handle, DLX_CUDA_HANDLE) != 0)
                        continue;
                m = *pp;
                *pp = m->next_closing;
                m->next_closing = NULL;
                m->done = NULL;
                m->refs = 1;
                avl_insert(&ipc_cache, &m->node, m->key, cmp_ipc);
                *ret = m;
                return 0;
        }
        m = calloc(1, sizeof(*m));
        if (!m)
                return dlx__fail(-ENOMEM, "out of memory");
        struct exported *x = export_find(t->ipc_handle);
        if (x && x->base) {
                m->base = x->base; /* our own allocation: nothing to open */
                m->own = true;
        } else {
                memcpy(h.reserved, t->ipc_handle, DLX_CUDA_HANDLE);
                r = cu->IpcOpenMemHandle(&m->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
                if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_HANDLE) {
                        free(m);
                        /* what the driver says of an allocation whose process is gone */
                        return dlx__fail(-ESRCH,
                                         "cuIpcOpenMemHandle: the producer's allocation is gone "
                                         "(it exited or freed it): acquire again");
                }
                if (r != CUDA_SUCCESS) {
                        free(m);
                        return dlx__cuda_fail(cu, r, "cuIpcOpenMemHandle");
                }
        }
        memcpy(m->key, t->ipc_handle, DLX_CUDA_HANDLE);
        m->device = t->device_id;
        m->refs = 1;
        avl_insert(&ipc_cache, &m->node, m->key, cmp_ipc);
        *ret = m;
        return 0;
}

static void ipc_unref_now(const struct dlx_cuda_driver *cu, struct gpu_ipc *m)
{
        if (--m->refs > 0)
                return;
        avl_remove(&ipc_cache, &m->node);
        ipc_close(cu, m);
}

int dlx__gpu_acquire(dlx_client *c, const struct wire_tensor *t, struct seg_map *vmm, void *stream,
                     struct gpu_acq *ret, void **ret_data)
{
        const struct dlx_cuda_driver *cu;
        int device = t->device_id;
        struct gpu_ipc *m = NULL;
        CUdeviceptr base;
        int err;

        (void)c;
        bool host = t->storage == WIRE_STORAGE_CUDA_HOST;

        if (t->storage == WIRE_STORAGE_CUDA_IPC && !t->has_ipc_handle)
                return dlx__fail(-EPROTO, "a cuda-ipc tensor without its handle");
        if (t->storage == WIRE_STORAGE_CUDA_VMM && (!vmm || vmm->device != device))
                return dlx__fail(-EPROTO, "a cuda-vmm tensor without its mapping on device %d",
                                 device);
        err = dlx__gpu_enter(device, &cu);
        if (err < 0)
                return err;
        pthread_mutex_lock(&cache_lock);
        sweep_closing(cu);
        if (host) {
                base = 0; /* host memory: the caller's mapping */
        } else if (vmm) {
                base = (CUdeviceptr)(uintptr_t)(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY && vmm->ro
                                                        ? vmm->ro
                                                        : (vmm->rw ? vmm->rw : vmm->ro));
        } else {
                err = ipc_open(cu, t, &m);
                if (err < 0)
                        goto out;
                base = m->base;
        }
        if (t->has_event) {
                CUevent ev = NULL;
                CUresult r;
                /* never read before the producer's write: no event, no tensor (the daemon
                 * drops the event of a producer that has gone) */
                err = open_event(cu, t->event, t->event_session, &ev);
                if (err == 0 && (r = cu->StreamWaitEvent(stream, ev, 0)) != CUDA_SUCCESS)
                        err = dlx__cuda_fail(cu, r, "cuStreamWaitEvent");
                if (err < 0) {
                        if (m)
                                ipc_unref_now(cu, m);
                        goto out;
                }
        }
        ret->device = device;
        ret->stream = stream;
        ret->ipc = m;
        ret->vmm = vmm; /* cuda-host: the host mapping, for its last reader too */
        ret->host = host;
        ret->also = NULL;
        ret->nalso = ret->cap = 0;
        ret->has_event = t->has_event;
        ret->event_session = t->event_session;
        if (t->has_event)
                memcpy(ret->event, t->event, DLX_CUDA_HANDLE);
        if (!host)
                *ret_data = (void *)(uintptr_t)(base + t->offset);
out:
        pthread_mutex_unlock(&cache_lock);
        dlx__cuda_leave(cu);
        return err;
}

/* NULL and CU_STREAM_LEGACY name the same stream. */
static bool same_stream(void *a, void *b)
{
        return a == b || ((a == NULL || a == (void *)CU_STREAM_LEGACY) &&
                          (b == NULL || b == (void *)CU_STREAM_LEGACY));
}

int dlx__gpu_sync(dlx_client *c, struct gpu_acq *acq, void *stream)
{
        const struct dlx_cuda_driver *cu;
        CUevent ev = NULL;
        CUcontext ctx;
        CUresult r;
        int err;

        (void)c;
        if (same_stream(stream, acq->stream))
                return 0;
        for (unsigned i = 0; i < acq->nalso; i++)
                if (same_stream(acq->also[i], stream))
                        return 0;
        if (acq->nalso == acq->cap) {
                unsigned cap = acq->cap ? 2 * acq->cap : 4;
                void **also;
                if (acq->cap == DLX_SYNC_STREAMS)
                        return dlx__fail(-ENOSPC,
                                         "a tensor is ordered on at most %d streams besides "
                                         "acquire's",
                                         DLX_SYNC_STREAMS);
                also = realloc(acq->also, cap * sizeof(*also));
                if (!also)
                        return dlx__fail(-ENOMEM, "out of memory");
                acq->also = also;
                acq->cap = cap;
        }
        err = dlx__cuda(&cu);
        if (err < 0)
                return err;
        /* a stream of any context or device: known now, not when the release needs it */
        err = dlx__cuda_enter_stream(cu, acq->device, stream, &ctx);
        if (err < 0)
                return err;
        dlx__cuda_leave(cu);
        err = dlx__cuda_enter(cu, acq->device);
        if (err < 0)
                return err;
        pthread_mutex_lock(&cache_lock);
        if (acq->has_event) {
                err = open_event(cu, acq->event, acq->event_session, &ev);
                if (err == -ESRCH) {
                        /* its producer has exited: no work of it is left to wait for */
                        err = 0;
                } else if (err == 0 && (r = cu->StreamWaitEvent(stream, ev, 0)) != CUDA_SUCCESS) {
                        err = dlx__cuda_fail(cu, r, "cuStreamWaitEvent");
                }
        }
        pthread_mutex_unlock(&cache_lock);
        dlx__cuda_leave(cu);
        if (err == 0)
                acq->also[acq->nalso++] = stream;
        return err;
}

int dlx__gpu_wait_producer(struct gpu_acq *acq, int64_t timeout_ms)
{
        const struct timespec most = {0, 10 * 1000 * 1000};
        const struct dlx_cuda_driver *cu;
        struct timespec nap = {0, 50 * 1000};
        int64_t deadline = timeout_ms < 0 ? -1 : dlx__deadline_ms(timeout_ms);
        CUresult r;
        int err;

        if (!acq->has_event)
                return 0; /* written before publish returned: nothing to wait for */
        err = dlx__gpu_enter(acq->device, &cu);
        if (err < 0)
                return err;
        for (;;) {
                CUevent ev = NULL;
                pthread_mutex_lock(&cache_lock);
                err = open_event(cu, acq->event, acq->event_session, &ev);
                r = err == 0 ? cu->EventQuery(ev) : CUDA_SUCCESS;
                pthread_mutex_unlock(&cache_lock);
                if (err < 0 || r != CUDA_ERROR_NOT_READY)
                        break;
                if (deadline >= 0 && dlx__now_ms() >= deadline) {
                        err = dlx__fail(-ETIMEDOUT,
                                        "the producer's writes are not done after %lld ms",
                                        (long long)timeout_ms);
                        break;
                }
                nanosleep(&nap, NULL);
                /* 50 us, doubling up to 10 ms: quick for short work, idle for long */
                if (nap.tv_nsec < most.tv_nsec)
                        nap.tv_nsec =
                                nap.tv_nsec * 2 < most.tv_nsec ? nap.tv_nsec * 2 : most.tv_nsec;
        }
        if (err == 0 && r != CUDA_SUCCESS) {
                err = r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE
                              ? dlx__fail(-ESRCH, "the producer's event is gone with its "
                                                  "process: whether its writes were done is "
                                                  "unknown")
                              : dlx__cuda_fail(cu, r, "cuEventQuery");
        }
        dlx__cuda_leave(cu);
        return err;
}

/* Makes acq->stream wait for what is queued on also, whatever its context: or the host. */
static void join_stream(const struct dlx_cuda_driver *cu, dlx_client *c, struct gpu_acq *acq,
                        void *also)
{
        CUevent ev = NULL;
        CUcontext ctx;
        CUresult r = CUDA_ERROR_INVALID_CONTEXT;

        /* the event is recorded in also's context; acq->stream may wait on any */
        if (dlx__cuda_enter_stream(cu, acq->device, also, &ctx) == 0) {
                r = cu->EventCreate(&ev, CU_EVENT_DISABLE_TIMING);
                if (r == CUDA_SUCCESS) {
                        r = cu->EventRecord(ev, (CUstream)also);
                        if (r == CUDA_SUCCESS)
                                r = cu->StreamWaitEvent((CUstream)acq->stream, ev, 0);
                        /* a wait already enqueued on an event survives its destruction */
                        cu->EventDestroy(ev);
                }
                dlx__cuda_leave(cu);
        }
        if (r == CUDA_SUCCESS)
                return;
        /* never a lost fence: the release goes once that stream's work is done */
        r = cu->StreamSynchronize((CUstream)also);
        if (r == CUDA_SUCCESS)
                dlx__log(c, DLX_LOG_DEBUG,
                         "stream %p could not be joined on the GPU: waited for it on the host",
                         also);
        else
                dlx__log(c, DLX_LOG_ERR,
                         "stream %p can neither be joined nor waited for (%s): the producer "
                         "may overwrite the tensor under its work",
                         also, dlx_last_error());
}

/* Makes acq->stream wait for the work queued so far on the other streams the tensor is used on. */
static void join_streams(const struct dlx_cuda_driver *cu, dlx_client *c, struct gpu_acq *acq)
{
        for (unsigned i = 0; i < acq->nalso; i++)
                join_stream(cu, c, acq, acq->also[i]);
        free(acq->also);
        acq->also = NULL;
        acq->nalso = acq->cap = 0;
}

/* Fills e with a spare release event of ctx, if the process has one. */
static bool take_spare(CUcontext ctx, struct gpu_event *e)
{
        struct gpu_event *x = NULL;

        pthread_mutex_lock(&cache_lock);
        for (struct gpu_event **pp = &spare; (x = *pp); pp = &x->next) {
                if (x->ctx == ctx) {
                        *pp = x->next;
                        nspare--;
                        break;
                }
        }
        pthread_mutex_unlock(&cache_lock);
        if (!x)
                return false;
        *e = *x;
        e->next = NULL;
        free(x);
        return true;
}

/* Keeps a closing client's release event, its work done, for a later client (see spare). */
static void keep_spare(const struct dlx_cuda_driver *cu, struct gpu_event *e)
{
        struct gpu_event *x = malloc(sizeof(*x));

        if (e->recorded)
                cu->EventSynchronize(e->ev);
        if (!x) {
                event_unmake(cu, e); /* rare, and only a producer already late is exposed */
                return;
        }
        *x = *e;
        pthread_mutex_lock(&cache_lock);
        x->next = spare;
        spare = x;
        nspare++;
        pthread_mutex_unlock(&cache_lock);
        e->ev = NULL;
}

/*
 * The release event for stream, recorded on it: the next of its context's
 * ring (re-recording one a producer has not waited on yet only makes it wait
 * longer). NULL when none can be: then the caller waits on the host.
 */
static struct gpu_event *release_event(const struct dlx_cuda_driver *cu, struct gpu_state *g,
                                       int device, void *stream)
{
        struct gpu_event *e = NULL;
        struct rel_ring *ring;
        CUcontext ctx;

        if (!g || dlx__cuda_enter_stream(cu, device, stream, &ctx) < 0)
                return NULL;
        for (ring = g->rings; ring && ring->ctx != ctx; ring = ring->next)
                ;
        if (!ring && (ring = calloc(1, sizeof(*ring)))) {
                ring->ctx = ctx;
                ring->next = g->rings;
                g->rings = ring;
        }
        if (ring) {
                e = &ring->slot[ring->next_slot++ % RELEASE_EVENTS];
                if (!e->ev && !take_spare(ctx, e) && event_make(cu, ctx, e) < 0)
                        e = NULL;
        }
        if (e && cu->EventRecord(e->ev, (CUstream)stream) != CUDA_SUCCESS)
                e = NULL;
        if (e)
                e->recorded = true;
        dlx__cuda_leave(cu);
        return e;
}

void dlx__gpu_release(dlx_client *c, struct gpu_acq *acq, struct wire_request *req)
{
        const struct dlx_cuda_driver *cu;
        struct gpu_state *g = state(c);
        struct gpu_event *e;
        struct gpu_ipc *m = acq->ipc;

        if (dlx__cuda(&cu) < 0 || dlx__cuda_enter(cu, acq->device) < 0) {
                free(acq->also);
                acq->also = NULL;
                return;
        }
        join_streams(cu, c, acq);
        e = release_event(cu, g, acq->device, acq->stream);
        if (e) {
                req->release.has_event = true;
                memcpy(req->release.event, e->handle.reserved, DLX_CUDA_HANDLE);
        } else {
                /* no event for the producer to wait on: the reader's work is done first */
                CUresult r = cu->StreamSynchronize((CUstream)acq->stream);
                if (r == CUDA_SUCCESS)
                        dlx__log(c, DLX_LOG_DEBUG,
                                 "no release event: waited for the reader's stream on the host");
                else
                        dlx__log(c, DLX_LOG_ERR,
                                 "no release event, and the reader's stream cannot be waited for "
                                 "(%s): the producer may overwrite the tensor under its work",
                                 dlx_last_error());
        }
        if (acq->vmm && e)
                acq->vmm->last_reader = e->ev; /* unmapping waits for it */
        pthread_mutex_lock(&cache_lock);
        if (m && --m->refs == 0) {
                avl_remove(&ipc_cache, &m->node);
                /* close once the reader's queued work is done, never under it */
                m->done = e ? e->ev : NULL;
                m->next_closing = closing;
                closing = m;
        }
        sweep_closing(cu);
        pthread_mutex_unlock(&cache_lock);
        acq->ipc = NULL;
        acq->vmm = NULL;
        dlx__cuda_leave(cu);
}

void dlx__gpu_close(dlx_client *c)
{
        const struct dlx_cuda_driver *cu;

        if (!c->gpu || dlx__cuda(&cu) < 0)
                return;
        /*
         * What this client published may outlive it (persistent versions) or
         * be read after it (leases): its producer's writes must be done before
         * the process can go, and its events can be destroyed.
         */
        for (struct avl_node *n = avl_first(&c->held); n; n = avl_next(n)) {
                struct held *h = avl_entry(n, struct held, node);
                struct gpu_event *e = h->has_gpu ? h->gpu.event : NULL;
                if (!e)
                        continue;
                if (e->recorded)
                        cu->EventSynchronize(e->ev);
                h->gpu.event = NULL;
                pthread_mutex_lock(&cache_lock);
                e->next = retired;
                retired = e;
                nretired++;
                pthread_mutex_unlock(&cache_lock);
        }
}

int dlx__gpu_usable(void)
{
        const struct dlx_cuda_driver *cu;

        return dlx__cuda(&cu);
}

unsigned dlx__gpu_retired(void)
{
        unsigned n;

        pthread_mutex_lock(&cache_lock);
        n = nretired + nspare;
        pthread_mutex_unlock(&cache_lock);
        return n;
}

void dlx__gpu_final(dlx_client *c)
{
        const struct dlx_cuda_driver *cu;
        struct gpu_state *g = c->gpu;

        if (!g)
                return;
        if (dlx__cuda(&cu) == 0) {
                /* allocations waiting on this client's release events: finish them now */
                pthread_mutex_lock(&cache_lock);
                for (struct gpu_ipc *m = closing; m; m = m->next_closing)
                        if (m->done) {
                                cu->EventSynchronize(m->done);
                                m->done = NULL;
                        }
                sweep_closing(cu);
                pthread_mutex_unlock(&cache_lock);
                while (g->pool) {
                        struct gpu_event *e = g->pool;
                        g->pool = e->next;
                        event_unmake(cu, e);
                        free(e);
                }
                while (g->rings) {
                        struct rel_ring *ring = g->rings;
                        g->rings = ring->next;
                        for (int i = 0; i < RELEASE_EVENTS; i++) {
                                struct gpu_event *e = &ring->slot[i];
                                if (e->ev)
                                        keep_spare(cu, e);
                        }
                        free(ring);
                }
        }
        free(g);
        c->gpu = NULL;
}
