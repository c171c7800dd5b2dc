/* SPDX-License-Identifier: MIT */
/*
 * The CUDA driver, loaded not linked. Built only with -Dcuda (cuda.h at build
 * time); libdlx opens libcuda.so.1 on first use and resolves every entry
 * point it needs into one table, so a host without a driver runs every CPU
 * path and gets a clear "no CUDA driver" error from the CUDA ones. Tests
 * install a double of the table that works over host memory.
 */
#ifndef DLX_CLIENT_CUDADRV_H
#define DLX_CLIENT_CUDADRV_H

#include <cuda.h>
#include <stdbool.h>

#include "internal.h"

/* Every entry point libdlx uses: the driver API's names without the cu prefix. */
struct dlx_cuda_driver {
        CUresult (*Init)(unsigned int flags);
        CUresult (*GetErrorString)(CUresult error, const char **str);
        CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
        CUresult (*DeviceGetCount)(int *count);
        CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
        CUresult (*CtxPushCurrent)(CUcontext ctx);
        CUresult (*CtxPopCurrent)(CUcontext *ctx);
        CUresult (*PointerGetAttribute)(void *data, CUpointer_attribute attribute, CUdeviceptr ptr);
        CUresult (*MemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
        CUresult (*IpcGetMemHandle)(CUipcMemHandle *handle, CUdeviceptr ptr);
        CUresult (*IpcOpenMemHandle)(CUdeviceptr *ptr, CUipcMemHandle handle, unsigned int flags);
        CUresult (*IpcCloseMemHandle)(CUdeviceptr ptr);
        CUresult (*IpcGetEventHandle)(CUipcEventHandle *handle, CUevent event);
        CUresult (*IpcOpenEventHandle)(CUevent *event, CUipcEventHandle handle);
        CUresult (*EventCreate)(CUevent *event, unsigned int flags);
        CUresult (*EventDestroy)(CUevent event);
        CUresult (*EventRecord)(CUevent event, CUstream stream);
        CUresult (*EventQuery)(CUevent event);
        CUresult (*EventSynchronize)(CUevent event);
        CUresult (*StreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags);
        CUresult (*MemGetAllocationGranularity)(size_t *granularity,
                                                const CUmemAllocationProp *prop,
                                                CUmemAllocationGranularity_flags option);
        CUresult (*MemCreate)(CUmemGenericAllocationHandle *handle, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags);
        CUresult (*MemRelease)(CUmemGenericAllocationHandle handle);
        CUresult (*MemExportToShareableHandle)(void *shareable, CUmemGenericAllocationHandle handle,
                                               CUmemAllocationHandleType type,
                                               unsigned long long flags);
        CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *handle,
                                                 void *shareable, CUmemAllocationHandleType type);
        CUresult (*MemAddressReserve)(CUdeviceptr *ptr, size_t size, size_t alignment,
                                      CUdeviceptr addr, unsigned long long flags);
        CUresult (*MemAddressFree)(CUdeviceptr ptr, size_t size);
        CUresult (*MemMap)(CUdeviceptr ptr, size_t size, size_t offset,
                           CUmemGenericAllocationHandle handle, unsigned long long flags);
        CUresult (*MemUnmap)(CUdeviceptr ptr, size_t size);
        CUresult (*MemSetAccess)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                 size_t count);
        CUresult (*MemHostRegister)(void *p, size_t size, unsigned int flags);
        CUresult (*MemHostUnregister)(void *p);
        CUresult (*MemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t size, CUstream stream);
        CUresult (*MemcpyDtoH)(void *dst, CUdeviceptr src, size_t size);
        CUresult (*MemcpyHtoD)(CUdeviceptr dst, const void *src, size_t size);
};

/*
 * The driver table, loading libcuda.so.1 and calling cuInit on first use.
 * Returns 0 with *ret, or -ENODEV (no driver, or cuInit failed: the detail
 * is in dlx_last_error()).
 */
DLX_HIDDEN int dlx__cuda(const struct dlx_cuda_driver **ret);

/*
 * Replaces the driver for this process (tests: a double over host memory);
 * NULL goes back to loading the real one. Not thread-safe against CUDA calls
 * in flight.
 */
DLX_HIDDEN void dlx__cuda_install(const struct dlx_cuda_driver *driver);

/* A failed driver call as -errno with the driver's own words recorded. */
DLX_HIDDEN int dlx__cuda_fail(const struct dlx_cuda_driver *cu, CUresult r, const char *what);

/*
 * Makes dev's primary context current for the calling thread, remembering
 * what was current so dlx__cuda_leave() restores it: libdlx never leaves a
 * different context current in the caller's thread.
 */
DLX_HIDDEN int dlx__cuda_enter(const struct dlx_cuda_driver *cu, int device);
DLX_HIDDEN void dlx__cuda_leave(const struct dlx_cuda_driver *cu);

#endif /* DLX_CLIENT_CUDADRV_H */
