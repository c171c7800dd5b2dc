/* SPDX-License-Identifier: MIT */
/*
 * libdlx's CUDA backend: sharing device memory through legacy IPC handles,
 * ordering with interprocess events on the producer's and consumer's work
 * streams (gpu.c), and the memory libdlx makes or maps itself, VMM and
 * pinned host (gpumem.c). Everything here runs with client->lock held unless it says
 * otherwise, and enters the device's primary context only around driver
 * calls. Without -Dcuda, every entry point answers -ENOTSUP.
 */
#ifndef DLX_CLIENT_GPU_H
#define DLX_CLIENT_GPU_H

#include <errno.h>

#include "internal.h"

/* One copy between device addresses (dlx__gpu_copy_wait). */
struct dlx_gpu_copy {
        uint64_t dst, src, len;
};

/* A VMM allocation of ours: exported fd, handle, and its mapping on this side. */
struct dlx_gpu_vmm {
        int fd;
        uint64_t handle;
        uint64_t ptr;
        uint64_t size;
        int device;
};

#ifdef DLX_HAVE_CUDA

/* 0, or -ENODEV with a detail when device is not one libdlx can address. */
DLX_HIDDEN int dlx__gpu_device_ok(int device);
struct dlx_cuda_driver;
/*
 * Checks device, loads the driver and makes device's primary context current
 * (dlx__cuda_leave() undoes it): 0 with *ret_cu, or -errno with a detail.
 */
DLX_HIDDEN int dlx__gpu_enter(int device, const struct dlx_cuda_driver **ret_cu);

/*
 * Creates a shareable VMM allocation of at least size bytes on device (rounded
 * to the driver's granularity), mapped read-write here, with its POSIX fd
 * exported. Lock not needed.
 */
DLX_HIDDEN int dlx__gpu_vmm_create(dlx_client *c, int device, uint64_t size,
                                   struct dlx_gpu_vmm *ret);
/* Undoes dlx__gpu_vmm_create() (the fd is the caller's to close). */
DLX_HIDDEN void dlx__gpu_vmm_destroy(struct dlx_gpu_vmm *v);
/* Imports a received VMM fd (borrowed) into m and maps it with the access asked for. */
DLX_HIDDEN int dlx__gpu_vmm_map(struct seg_map *m, int fd, bool writable);
/*
 * Unmaps and releases m's VMM memory once the work queued on it is done: its
 * last reader's (the release event), and where this process could write it,
 * what is queued on the stream of its last publish and on the client's current
 * stream for the device (waited for on the host: unmapping is).
 */
DLX_HIDDEN void dlx__gpu_vmm_unmap(dlx_client *c, struct seg_map *m);

/*
 * Describes a kDLCUDA tensor for publishing: its allocation's IPC handle and
 * the offset into it, and an event recorded on stream (the options', else
 * the client's current one). Fills req's tensor storage fields and *ret.
 * Returns 0 or -errno (-ENODEV without a driver).
 */
DLX_HIDDEN int dlx__gpu_publish(dlx_client *c, const DLTensor *t, struct seg_map *vmm, void *stream,
                                struct wire_request *req, struct gpu_pub *ret);
/*
 * A cuda-host tensor going zero-copy: an event recorded on stream (in its
 * context) for readers to wait on, as for device memory. Fills req's event.
 */
DLX_HIDDEN int dlx__gpu_publish_host(dlx_client *c, int device, void *stream,
                                     struct wire_request *req, struct gpu_pub *ret);
/* Waits on the host for the work queued so far on stream (a copy is about to read). */
DLX_HIDDEN int dlx__gpu_stream_wait(int device, void *stream);
/* Queues n copies between device addresses on stream, in order, then waits as above. */
DLX_HIDDEN int dlx__gpu_copy_wait(int device, void *stream, const struct dlx_gpu_copy *v, size_t n);
/* The publish failed: give back what dlx__gpu_publish() took. */
DLX_HIDDEN void dlx__gpu_publish_undo(dlx_client *c, struct gpu_pub *pub);
/*
 * The version is gone: make the producer's stream wait for every reader's
 * release event, then recycle the publish event.
 */
DLX_HIDDEN void dlx__gpu_released(dlx_client *c, struct gpu_pub *pub,
                                  uint8_t (*events)[DLX_CUDA_HANDLE], uint32_t nevents);

/*
 * Opens what an acquire reply describes (the IPC allocation, cached per
 * process) and makes stream wait for the producer's event. *ret_data is the
 * device pointer of the tensor's data; for cuda-host (host memory the caller
 * has mapped and pinned) only the wait is done and *ret_data is not set.
 */
DLX_HIDDEN int dlx__gpu_acquire(dlx_client *c, const struct wire_tensor *t, struct seg_map *vmm,
                                void *stream, struct gpu_acq *ret, void **ret_data);
/* Waits on the host for the producer's writes (dlx_tensor_wait). */
DLX_HIDDEN int dlx__gpu_wait_producer(struct gpu_acq *acq, int64_t timeout_ms);
/* Makes stream wait for the producer's write too, and the release for stream's work. */
DLX_HIDDEN int dlx__gpu_sync(dlx_client *c, struct gpu_acq *acq, void *stream);
/* Records the consumer's release event into req (when it can) and drops the IPC reference. */
DLX_HIDDEN void dlx__gpu_release(dlx_client *c, struct gpu_acq *acq, struct wire_request *req);

/* Makes stream wait for events (release events a RELEASED notice carried). */
DLX_HIDDEN int dlx__gpu_wait_events(dlx_client *c, int device, void *stream,
                                    uint8_t (*events)[DLX_CUDA_HANDLE], uint32_t nevents);

/* Pins a mapped segment with the driver (once) for cuda-host tensors. */
DLX_HIDDEN int dlx__gpu_register_host(dlx_client *c, struct seg_map *m);
/* Unpins it before it is unmapped. */
DLX_HIDDEN void dlx__gpu_unregister_host(struct seg_map *m);

/* The calling process's PID namespace (the inode of /proc/self/ns/pid), 0 if unknown. */
DLX_HIDDEN uint64_t dlx__pid_namespace(void);
/*
 * Before anything of an acquired CUDA tensor is mapped: -EXDEV when it needs
 * legacy IPC from another PID namespace; then its device_id as this process
 * numbers it, found by the UUID the producer sent (-ENODEV: a GPU this process
 * does not see). 0 when it can be had here.
 */
DLX_HIDDEN int dlx__gpu_reachable(struct wire_tensor *t);

/* The client's current stream for a device (NULL: the legacy default stream). */
DLX_HIDDEN void *dlx__gpu_stream(dlx_client *c, int device);

/*
 * dlx_close() begins: waits on the host for the work each version this client
 * still holds was published after, so that what outlives the client (a
 * persistent version, a reader's lease) never races its producer's writes;
 * their events are kept for the process's life (a reader may still wait on
 * them: dlx__gpu_retired). Lock held.
 */
DLX_HIDDEN void dlx__gpu_close(dlx_client *c);

/* Frees the backend's caches and pools (the client's last reference went). */
DLX_HIDDEN void dlx__gpu_final(dlx_client *c);
/*
 * Interprocess events kept after their client closed (tests count them): publish
 * events for the process's life, release events until a later client reuses them.
 */
DLX_HIDDEN unsigned dlx__gpu_retired(void);
/* 0 when CUDA can be used in this process, else -ENODEV saying why (fork, no driver). */
DLX_HIDDEN int dlx__gpu_usable(void);

#else

/* Fails with -ENOTSUP; the constant lets the compiler see outputs are not used after it. */
static inline int no_cuda(const char *why)
{
        dlx__fail(-ENOTSUP, "%s", why);
        return -ENOTSUP;
}
static inline int dlx__gpu_vmm_create(dlx_client *c, int device, uint64_t size,
                                      struct dlx_gpu_vmm *ret)
{
        (void)c, (void)device, (void)size, (void)ret;
        return no_cuda("libdlx was built without CUDA");
}
static inline void dlx__gpu_vmm_destroy(struct dlx_gpu_vmm *v)
{
        (void)v;
}
static inline int dlx__gpu_vmm_map(struct seg_map *m, int fd, bool writable)
{
        (void)m, (void)fd, (void)writable;
        return no_cuda("libdlx was built without CUDA");
}
static inline void dlx__gpu_vmm_unmap(dlx_client *c, struct seg_map *m)
{
        (void)c, (void)m;
}
static inline int dlx__gpu_publish(dlx_client *c, const DLTensor *t, struct seg_map *vmm,
                                   void *stream, struct wire_request *req, struct gpu_pub *ret)
{
        (void)c, (void)t, (void)vmm, (void)stream, (void)req, (void)ret;
        return no_cuda("libdlx was built without CUDA");
}
static inline int dlx__gpu_publish_host(dlx_client *c, int device, void *stream,
                                        struct wire_request *req, struct gpu_pub *ret)
{
        (void)c, (void)device, (void)stream, (void)req, (void)ret;
        return no_cuda("libdlx was built without CUDA: cuda-host tensors need it");
}
static inline int dlx__gpu_copy_wait(int device, void *stream, const struct dlx_gpu_copy *v,
                                     size_t n)
{
        (void)device, (void)stream, (void)v, (void)n;
        return no_cuda("libdlx was built without CUDA: device tensors need it");
}
static inline int dlx__gpu_stream_wait(int device, void *stream)
{
        (void)device, (void)stream;
        return no_cuda("libdlx was built without CUDA: cuda-host tensors need it");
}
static inline void dlx__gpu_publish_undo(dlx_client *c, struct gpu_pub *pub)
{
        (void)c, (void)pub;
}
static inline void dlx__gpu_released(dlx_client *c, struct gpu_pub *pub,
                                     uint8_t (*events)[DLX_CUDA_HANDLE], uint32_t nevents)
{
        (void)c, (void)pub, (void)events, (void)nevents;
}
static inline int dlx__gpu_acquire(dlx_client *c, const struct wire_tensor *t, struct seg_map *vmm,
                                   void *stream, struct gpu_acq *ret, void **ret_data)
{
        (void)c, (void)t, (void)vmm, (void)stream, (void)ret, (void)ret_data;
        return no_cuda("libdlx was built without CUDA");
}
static inline int dlx__gpu_wait_producer(struct gpu_acq *acq, int64_t timeout_ms)
{
        (void)acq, (void)timeout_ms;
        return 0; /* nothing acquired here is on a GPU */
}
static inline int dlx__gpu_sync(dlx_client *c, struct gpu_acq *acq, void *stream)
{
        (void)c, (void)acq, (void)stream;
        return 0; /* nothing acquired here is on a GPU */
}
static inline void dlx__gpu_release(dlx_client *c, struct gpu_acq *acq, struct wire_request *req)
{
        (void)c, (void)acq, (void)req;
}
static inline int dlx__gpu_wait_events(dlx_client *c, int device, void *stream,
                                       uint8_t (*events)[DLX_CUDA_HANDLE], uint32_t nevents)
{
        (void)c, (void)device, (void)stream, (void)events, (void)nevents;
        return 0;
}
static inline int dlx__gpu_register_host(dlx_client *c, struct seg_map *m)
{
        (void)c, (void)m;
        return no_cuda("libdlx was built without CUDA: cuda-host tensors need it");
}
static inline void dlx__gpu_unregister_host(struct seg_map *m)
{
        (void)m;
}
static inline int dlx__gpu_usable(void)
{
        return no_cuda("libdlx was built without CUDA");
}
static inline int dlx__gpu_reachable(struct wire_tensor *t)
{
        (void)t;
        return 0;
}
static inline void *dlx__gpu_stream(dlx_client *c, int device)
{
        (void)c, (void)device;
        return NULL;
}
static inline void dlx__gpu_close(dlx_client *c)
{
        (void)c;
}
static inline void dlx__gpu_final(dlx_client *c)
{
        (void)c;
}

#endif /* DLX_HAVE_CUDA */
#endif /* DLX_CLIENT_GPU_H */
