/* SPDX-License-Identifier: MIT */
#include "cudadrv.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static struct dlx_cuda_driver loaded;
static const struct dlx_cuda_driver *installed;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_error; /* 0 or -ENODEV */
static char load_why[200];

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
/* Devices whose primary context this process has retained (never released: it lives as long
 * as the process, as the runtime's does). */
static CUcontext primary[DLX_GPU_MAX_DEVICES];
/* The UUIDs of this process's devices by ordinal, read once (-1: not yet). ctx_lock. */
static CUuuid uuids[DLX_GPU_MAX_DEVICES];
static int nuuids = -1;

/*
 * Forks this process is a child of (counted in each child), and how many
 * there were when CUDA was first used; UINT_MAX: not yet. CUDA does not
 * survive fork(): a child of a process that initialised it cannot use it,
 * and libdlx's CUDA caches and their locks are the parent's there. Such a
 * child gets a clear error instead.
 */
static unsigned generation;
static unsigned used_in = UINT_MAX;

void dlx__cuda_fork(enum dlx_fork_step step)
{
        /* a child runs this before it has a second thread */
        if (step == DLX_FORK_CHILD)
                __atomic_add_fetch(&generation, 1, __ATOMIC_RELAXED);
}

static int check_generation(void)
{
        unsigned now = __atomic_load_n(&generation, __ATOMIC_RELAXED), was = UINT_MAX;

        if (__atomic_compare_exchange_n(&used_in, &was, now, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED) ||
            was == now)
                return 0;
        return dlx__fail(-ENODEV, "CUDA was used in this process's parent before it forked: a "
                                  "child made by fork() cannot use it (start GPU workers with "
                                  "spawn, or fork before using CUDA)");
}

typedef CUresult (*get_proc_fn)(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                CUdriverProcAddressQueryResult *status);

/* One entry point at the ABI version the table's type for it names. */
static int resolve(get_proc_fn get_proc, const char *name, int version, void **ret)
{
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        void *fn = NULL;

        if (get_proc(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
            status != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
                snprintf(load_why, sizeof(load_why), "the CUDA driver lacks %s (ABI %d.%d)", name,
                         version / 1000, version % 1000 / 10);
                return -ENODEV;
        }
        *ret = fn;
        return 0;
}

static void load(void)
{
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        get_proc_fn get_proc;
        CUresult r;

        if (!lib) {
                const char *e = dlerror();
                snprintf(load_why, sizeof(load_why), "no CUDA driver (%s)",
                         e ? e : "libcuda.so.1 not found");
                load_error = -ENODEV;
                return;
        }
        /* every entry point by the version its signature is: cuGetProcAddress_v2, CUDA 12.0 */
        get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
        if (!get_proc) {
                snprintf(load_why, sizeof(load_why),
                         "the CUDA driver is older than 12.0 (no cuGetProcAddress_v2)");
                load_error = -ENODEV;
                return;
        }

#define RESOLVE(field, name, version)                                                              \
        do {                                                                                       \
                void *fn_;                                                                         \
                if (resolve(get_proc, #name, version, &fn_) < 0) {                                 \
                        load_error = -ENODEV;                                                      \
                        return;                                                                    \
                }                                                                                  \
                memcpy(&loaded.field, &fn_, sizeof(fn_));                                          \
        } while (0);
        DLX_CUDA_ENTRY_POINTS(RESOLVE)
#undef RESOLVE

        r = loaded.Init(0);
        if (r != CUDA_SUCCESS) {
                const char *s = NULL;
                loaded.GetErrorString(r, &s);
                snprintf(load_why, sizeof(load_why), "cuInit failed: %s%s", s ? s : "unknown error",
                         __atomic_load_n(&generation, __ATOMIC_RELAXED) > 0
                                 ? " (this process was made by fork(): if its parent used "
                                   "CUDA, the child cannot; start GPU workers with spawn)"
                                 : "");
                load_error = -ENODEV;
        }
}

int dlx__cuda(const struct dlx_cuda_driver **ret)
{
        const struct dlx_cuda_driver *cu = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);
        int err;

        if (!cu) {
                pthread_once(&load_once, load);
                if (load_error)
                        return dlx__fail(load_error, "%s", load_why);
                cu = &loaded;
        }
        err = check_generation();
        if (err < 0)
                return err;
        *ret = cu;
        return 0;
}

void dlx__cuda_install(const struct dlx_cuda_driver *driver)
{
        pthread_mutex_lock(&ctx_lock);
        memset(primary, 0, sizeof(primary));
        nuuids = -1;
        pthread_mutex_unlock(&ctx_lock);
        /* a new driver: nothing of it used yet, in this process or another */
        __atomic_store_n(&used_in, UINT_MAX, __ATOMIC_RELAXED);
        __atomic_store_n(&installed, driver, __ATOMIC_RELEASE);
}

int dlx__cuda_fail(const struct dlx_cuda_driver *cu, CUresult r, const char *what)
{
        const char *s = NULL;

        if (cu->GetErrorString(r, &s) != CUDA_SUCCESS || !s)
                s = "unknown CUDA error";
        /* what a forked child of a process with CUDA gets from the driver: say so */
        if (__atomic_load_n(&generation, __ATOMIC_RELAXED) > 0 &&
            (r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_DEINITIALIZED ||
             r == CUDA_ERROR_CONTEXT_IS_DESTROYED))
                return dlx__fail(-ENODEV,
                                 "%s: %s (this process was made by fork(): if its parent used "
                                 "CUDA, a framework included, the child cannot; start GPU "
                                 "workers with spawn, or fork before using CUDA)",
                                 what, s);
        switch (r) {
        case CUDA_ERROR_OUT_OF_MEMORY:
                return dlx__fail(-ENOMEM, "%s: %s", what, s);
        case CUDA_ERROR_INVALID_VALUE:
        case CUDA_ERROR_INVALID_HANDLE:
                return dlx__fail(-EINVAL, "%s: %s", what, s);
        case CUDA_ERROR_NOT_SUPPORTED:
                return dlx__fail(-ENOTSUP, "%s: %s", what, s);
        case CUDA_ERROR_INVALID_DEVICE:
        case CUDA_ERROR_NO_DEVICE:
                return dlx__fail(-ENODEV, "%s: %s", what, s);
        default:
                return dlx__fail(-EIO, "%s: %s", what, s);
        }
}

int dlx__cuda_primary(const struct dlx_cuda_driver *cu, int device, CUcontext *ret)
{
        CUcontext ctx;
        CUresult r;

        if (device < 0 || device >= DLX_GPU_MAX_DEVICES)
                return dlx__fail(-ENODEV, "CUDA device %d is out of range", device);
        pthread_mutex_lock(&ctx_lock);
        ctx = primary[device];
        if (!ctx) {
                CUdevice dev;
                r = cu->DeviceGet(&dev, device);
                if (r == CUDA_SUCCESS)
                        r = cu->DevicePrimaryCtxRetain(&ctx, dev);
                if (r != CUDA_SUCCESS) {
                        pthread_mutex_unlock(&ctx_lock);
                        return dlx__cuda_fail(cu, r, "CUDA device");
                }
                primary[device] = ctx;
        }
        pthread_mutex_unlock(&ctx_lock);
        *ret = ctx;
        return 0;
}

int dlx__cuda_enter(const struct dlx_cuda_driver *cu, int device)
{
        CUcontext ctx = NULL;
        CUresult r;
        int err = dlx__cuda_primary(cu, device, &ctx);

        if (err < 0)
                return err;
        r = cu->CtxPushCurrent(ctx);
        if (r != CUDA_SUCCESS)
                return dlx__cuda_fail(cu, r, "cuCtxPushCurrent");
        return 0;
}

/* Reads the devices' UUIDs once. ctx_lock held. */
static int load_uuids(const struct dlx_cuda_driver *cu)
{
        int count = 0;
        CUresult r;

        if (nuuids >= 0)
                return 0;
        r = cu->DeviceGetCount(&count);
        if (r != CUDA_SUCCESS)
                return dlx__cuda_fail(cu, r, "cuDeviceGetCount");
        if (count > DLX_GPU_MAX_DEVICES)
                count = DLX_GPU_MAX_DEVICES;
        for (int i = 0; i < count; i++) {
                CUdevice dev;
                r = cu->DeviceGet(&dev, i);
                if (r == CUDA_SUCCESS)
                        r = cu->DeviceGetUuid(&uuids[i], dev);
                if (r != CUDA_SUCCESS)
                        return dlx__cuda_fail(cu, r, "cuDeviceGetUuid");
        }
        nuuids = count;
        return 0;
}

int dlx__cuda_uuid(const struct dlx_cuda_driver *cu, int device, uint8_t ret[DLX_CUDA_UUID])
{
        int err;

        pthread_mutex_lock(&ctx_lock);
        err = load_uuids(cu);
        if (err == 0 && (device < 0 || device >= nuuids))
                err = dlx__fail(-ENODEV, "CUDA device %d: this process sees %d", device, nuuids);
        if (err == 0)
                memcpy(ret, uuids[device].bytes, DLX_CUDA_UUID);
        pthread_mutex_unlock(&ctx_lock);
        return err;
}

int dlx__cuda_ordinal(const struct dlx_cuda_driver *cu, const uint8_t uuid[DLX_CUDA_UUID], int *ret)
{
        int err, found = -1;

        pthread_mutex_lock(&ctx_lock);
        err = load_uuids(cu);
        for (int i = 0; err == 0 && i < nuuids && found < 0; i++)
                if (memcmp(uuids[i].bytes, uuid, DLX_CUDA_UUID) == 0)
                        found = i;
        pthread_mutex_unlock(&ctx_lock);
        if (err < 0)
                return err;
        if (found < 0)
                return -ENOENT;
        *ret = found;
        return 0;
}

bool dlx__cuda_default_stream(void *stream)
{
        return !stream || stream == (void *)CU_STREAM_LEGACY ||
               stream == (void *)CU_STREAM_PER_THREAD;
}

int dlx__cuda_enter_stream(const struct dlx_cuda_driver *cu, int device, void *stream,
                           CUcontext *ret_ctx)
{
        CUcontext ctx;
        CUresult r;
        int err;

        if (dlx__cuda_default_stream(stream)) {
                err = dlx__cuda_primary(cu, device, &ctx);
                if (err < 0)
                        return err;
        } else {
                r = cu->StreamGetCtx((CUstream)stream, &ctx);
                if (r != CUDA_SUCCESS) {
                        const char *s = NULL;
                        cu->GetErrorString(r, &s);
                        return dlx__fail(-EINVAL, "stream %p is not a live CUDA stream (%s)",
                                         stream, s ? s : "cuStreamGetCtx failed");
                }
        }
        r = cu->CtxPushCurrent(ctx);
        if (r != CUDA_SUCCESS)
                return dlx__cuda_fail(cu, r, "cuCtxPushCurrent");
        *ret_ctx = ctx;
        return 0;
}

void dlx__cuda_leave(const struct dlx_cuda_driver *cu)
{
        CUcontext ignored;

        cu->CtxPopCurrent(&ignored);
}
