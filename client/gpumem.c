/* SPDX-License-Identifier: MIT */
/*
 * CUDA memory libdlx makes or maps itself: VMM allocations exported as POSIX
 * fds (cuda-vmm: made by a producer's dlx_alloc(), imported by a consumer),
 * and host memory pinned with the driver (cuda-host). The sharing of
 * memory a framework allocated, and all ordering, is gpu.c.
 */
#include "gpu.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "cudadrv.h"

static void vmm_prop(CUmemAllocationProp *prop, int device)
{
        memset(prop, 0, sizeof(*prop));
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = device;
}

/*
 * Reserves, maps and grants access to a VMM handle; returns the address in
 * *ret. A read-only mapping the device refuses (not every device and driver
 * grant CU_MEM_ACCESS_FLAGS_PROT_READ) is made read-write instead, and
 * *ret_writable says so: never silently (dlx_tensor_write_protected()).
 */
static int vmm_map(const struct dlx_cuda_driver *cu, CUmemGenericAllocationHandle h, uint64_t size,
                   int device, bool writable, CUdeviceptr *ret, bool *ret_writable)
{
        CUmemAccessDesc access = {
                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
                .flags = writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                  : CU_MEM_ACCESS_FLAGS_PROT_READ,
        };
        CUdeviceptr ptr;
        CUresult r;

        r = cu->MemAddressReserve(&ptr, size, 0, 0, 0);
        if (r != CUDA_SUCCESS)
                return dlx__cuda_fail(cu, r, "cuMemAddressReserve");
        r = cu->MemMap(ptr, size, 0, h, 0);
        if (r != CUDA_SUCCESS) {
                cu->MemAddressFree(ptr, size);
                return dlx__cuda_fail(cu, r, "cuMemMap");
        }
        r = cu->MemSetAccess(ptr, size, &access, 1);
        if (!writable && (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE)) {
                access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                r = cu->MemSetAccess(ptr, size, &access, 1);
                writable = true;
        }
        if (r != CUDA_SUCCESS) {
                cu->MemUnmap(ptr, size);
                cu->MemAddressFree(ptr, size);
                return dlx__cuda_fail(cu, r, "cuMemSetAccess");
        }
        *ret = ptr;
        if (ret_writable)
                *ret_writable = writable;
        return 0;
}

int dlx__gpu_vmm_create(dlx_client *c, int device, uint64_t size, struct dlx_gpu_vmm *ret)
{
        const struct dlx_cuda_driver *cu;
        CUmemAllocationProp prop;
        CUmemGenericAllocationHandle h;
        size_t gran = 0;
        CUdeviceptr ptr;
        CUresult r;
        int fd = -1, err;

        (void)c;
        err = dlx__gpu_enter(device, &cu);
        if (err < 0)
                return err;
        vmm_prop(&prop, device);
        r = cu->MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r != CUDA_SUCCESS || gran == 0) {
                err = dlx__cuda_fail(cu, r ? r : CUDA_ERROR_NOT_SUPPORTED,
                                     "cuMemGetAllocationGranularity");
                goto out;
        }
        size = (size + gran - 1) / gran * gran;
        r = cu->MemCreate(&h, size, &prop, 0);
        if (r != CUDA_SUCCESS) {
                err = dlx__cuda_fail(cu, r, "cuMemCreate (POSIX fd shareable)");
                goto out;
        }
        r = cu->MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r != CUDA_SUCCESS) {
                cu->MemRelease(h);
                err = dlx__cuda_fail(cu, r, "cuMemExportToShareableHandle");
                goto out;
        }
        err = vmm_map(cu, h, size, device, true, &ptr, NULL);
        if (err < 0) {
                close(fd);
                cu->MemRelease(h);
                goto out;
        }
        ret->fd = fd;
        ret->handle = h;
        ret->ptr = ptr;
        ret->size = size;
        ret->device = device;
out:
        dlx__cuda_leave(cu);
        return err;
}

void dlx__gpu_vmm_destroy(struct dlx_gpu_vmm *v)
{
        const struct dlx_cuda_driver *cu;

        if (dlx__cuda(&cu) < 0 || dlx__cuda_enter(cu, v->device) < 0)
                return;
        cu->MemUnmap(v->ptr, v->size);
        cu->MemAddressFree(v->ptr, v->size);
        cu->MemRelease(v->handle);
        dlx__cuda_leave(cu);
}

int dlx__gpu_vmm_map(struct seg_map *m, int fd, bool writable)
{
        const struct dlx_cuda_driver *cu;
        bool rw = false;
        CUdeviceptr ptr;
        CUresult r;
        int err;

        err = dlx__gpu_enter(m->device, &cu);
        if (err < 0)
                return err;
        if (!m->vmm_handle) {
                CUmemGenericAllocationHandle h;
                r = cu->MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
                if (r != CUDA_SUCCESS) {
                        err = dlx__cuda_fail(cu, r, "cuMemImportFromShareableHandle");
                        goto out;
                }
                m->vmm_handle = h;
        }
        err = vmm_map(cu, m->vmm_handle, m->size, m->device, writable, &ptr, &rw);
        if (err == 0 && writable) {
                m->rw = (uint8_t *)(uintptr_t)ptr;
        } else if (err == 0) {
                m->ro = (uint8_t *)(uintptr_t)ptr;
                m->ro_writable = rw; /* dlx_tensor_write_protected() says so */
        }
out:
        dlx__cuda_leave(cu);
        return err;
}

/* Waits on the host for what is queued on stream (m's producer may have written with it). */
static void wait_writer(const struct dlx_cuda_driver *cu, dlx_client *c, struct seg_map *m,
                        void *stream)
{
        CUcontext ctx;
        CUresult r = CUDA_ERROR_INVALID_CONTEXT;

        if (dlx__cuda_enter_stream(cu, m->device, stream, &ctx) == 0) {
                r = cu->StreamSynchronize((CUstream)stream);
                dlx__cuda_leave(cu);
        }
        if (r != CUDA_SUCCESS)
                dlx__log(c, DLX_LOG_WARNING,
                         "unmapping segment %llu without waiting for stream %p: %s",
                         (unsigned long long)m->id, stream, dlx_last_error());
}

void dlx__gpu_vmm_unmap(dlx_client *c, struct seg_map *m)
{
        const struct dlx_cuda_driver *cu;
        void *current;

        if (dlx__cuda(&cu) < 0 || dlx__cuda_enter(cu, m->device) < 0)
                return;
        /* the last reader's queued work must not find its memory gone */
        if (m->last_reader)
                cu->EventSynchronize(m->last_reader);
        /* nor the writer's: work queued to fill it may still be running */
        if (m->rw) {
                current = dlx__gpu_stream(c, m->device);
                if (m->wrote_on && m->wrote_on != current)
                        wait_writer(cu, c, m, m->wrote_on);
                wait_writer(cu, c, m, current);
        }
        if (m->ro) {
                cu->MemUnmap((CUdeviceptr)(uintptr_t)m->ro, m->size);
                cu->MemAddressFree((CUdeviceptr)(uintptr_t)m->ro, m->size);
        }
        if (m->rw) {
                cu->MemUnmap((CUdeviceptr)(uintptr_t)m->rw, m->size);
                cu->MemAddressFree((CUdeviceptr)(uintptr_t)m->rw, m->size);
        }
        if (m->vmm_handle)
                cu->MemRelease(m->vmm_handle);
        dlx__cuda_leave(cu);
}

int dlx__gpu_register_host(dlx_client *c, struct seg_map *m)
{
        const struct dlx_cuda_driver *cu;
        CUresult r;
        int err;

        (void)c;
        if (m->host_registered)
                return 0;
        err = dlx__cuda(&cu);
        if (err == 0)
                err = dlx__cuda_enter(cu, m->device);
        if (err < 0)
                return err;
        /* the whole mapping, whichever view a tensor uses; portable: pinned for every context */
        if (m->ro) {
                r = cu->MemHostRegister(m->ro, m->size,
                                        CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_READ_ONLY);
                if (r != CUDA_SUCCESS) {
                        err = dlx__cuda_fail(cu, r, "cuMemHostRegister");
                        goto out;
                }
        }
        if (m->rw) {
                r = cu->MemHostRegister(m->rw, m->size, CU_MEMHOSTREGISTER_PORTABLE);
                if (r != CUDA_SUCCESS) {
                        if (m->ro)
                                cu->MemHostUnregister(m->ro);
                        err = dlx__cuda_fail(cu, r, "cuMemHostRegister");
                        goto out;
                }
        }
        m->host_registered = true;
out:
        dlx__cuda_leave(cu);
        return err;
}

void dlx__gpu_unregister_host(struct seg_map *m)
{
        const struct dlx_cuda_driver *cu;

        if (!m->host_registered || dlx__cuda(&cu) < 0 || dlx__cuda_enter(cu, m->device) < 0)
                return;
        /* the last reader's queued work must not find the pages gone */
        if (m->last_reader)
                cu->EventSynchronize(m->last_reader);
        if (m->ro)
                cu->MemHostUnregister(m->ro);
        if (m->rw)
                cu->MemHostUnregister(m->rw);
        m->host_registered = false;
        dlx__cuda_leave(cu);
}
