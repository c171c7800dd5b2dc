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
#include <cudaTypedefs.h>
#include <stdbool.h>

#include "internal.h"

/*
 * Every entry point libdlx uses: the driver API's names without the cu prefix,
 * each typed by the ABI version libdlx resolves (cudaTypedefs.h's PFN_ names),
 * never by the newest one cuda.h maps the name to: cuStreamGetCtx gained an
 * argument in 12.5 under the same name, and a table typed by the header would
 * call it with one too few.
 */
#define DLX_CUDA_ENTRY_POINTS(X)                                                                   \
        X(Init, cuInit, 2000)                                                                      \
        X(GetErrorString, cuGetErrorString, 6000)                                                  \
        X(DeviceGet, cuDeviceGet, 2000)                                                            \
        X(DeviceGetCount, cuDeviceGetCount, 2000)                                                  \
        X(DeviceGetUuid, cuDeviceGetUuid, 11040)                                                   \
        X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000)                                  \
        X(CtxPushCurrent, cuCtxPushCurrent, 4000)                                                  \
        X(CtxPopCurrent, cuCtxPopCurrent, 4000)                                                    \
        X(PointerGetAttribute, cuPointerGetAttribute, 4000)                                        \
        X(MemGetAddressRange, cuMemGetAddressRange, 3020)                                          \
        X(IpcGetMemHandle, cuIpcGetMemHandle, 4010)                                                \
        X(IpcOpenMemHandle, cuIpcOpenMemHandle, 11000)                                             \
        X(IpcCloseMemHandle, cuIpcCloseMemHandle, 4010)                                            \
        X(IpcGetEventHandle, cuIpcGetEventHandle, 4010)                                            \
        X(IpcOpenEventHandle, cuIpcOpenEventHandle, 4010)                                          \
        X(EventCreate, cuEventCreate, 2000)                                                        \
        X(EventDestroy, cuEventDestroy, 4000)                                                      \
        X(EventRecord, cuEventRecord, 2000)                                                        \
        X(EventQuery, cuEventQuery, 2000)                                                          \
        X(EventSynchronize, cuEventSynchronize, 2000)                                              \
        X(StreamWaitEvent, cuStreamWaitEvent, 3020)                                                \
        X(StreamGetCtx, cuStreamGetCtx, 9020)                                                      \
        X(StreamSynchronize, cuStreamSynchronize, 2000)                                            \
        X(MemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020)                       \
        X(MemCreate, cuMemCreate, 10020)                                                           \
        X(MemRelease, cuMemRelease, 10020)                                                         \
        X(MemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000)                           \
        X(MemExportToShareableHandle, cuMemExportToShareableHandle, 10020)                         \
        X(MemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020)                     \
        X(MemAddressReserve, cuMemAddressReserve, 10020)                                           \
        X(MemAddressFree, cuMemAddressFree, 10020)                                                 \
        X(MemMap, cuMemMap, 10020)                                                                 \
        X(MemUnmap, cuMemUnmap, 10020)                                                             \
        X(MemSetAccess, cuMemSetAccess, 10020)                                                     \
        X(MemHostRegister, cuMemHostRegister, 6050)                                                \
        X(MemHostUnregister, cuMemHostUnregister, 4000)                                            \
        X(MemcpyAsync, cuMemcpyAsync, 4000)                                                        \
        X(MemcpyDtoH, cuMemcpyDtoH, 3020)                                                          \
        X(MemcpyHtoD, cuMemcpyHtoD, 3020)

#define DLX_CUDA_FIELD(field, name, version) PFN_##name##_v##version field;
struct dlx_cuda_driver {
        DLX_CUDA_ENTRY_POINTS(DLX_CUDA_FIELD)
};
#undef DLX_CUDA_FIELD

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
/* dev's primary context, retained once per process: 0 with *ret, or -errno. */
DLX_HIDDEN int dlx__cuda_primary(const struct dlx_cuda_driver *cu, int device, CUcontext *ret);
/*
 * Makes the context stream belongs to current (dlx__cuda_leave() undoes it),
 * with *ret_ctx: for the default streams (NULL, CU_STREAM_LEGACY,
 * CU_STREAM_PER_THREAD) device's primary context, for any other the one
 * cuStreamGetCtx names. Events are recorded in their stream's context, so an
 * event for a stream is made there. 0 or -errno (-EINVAL: not a live stream).
 */
DLX_HIDDEN int dlx__cuda_enter_stream(const struct dlx_cuda_driver *cu, int device, void *stream,
                                      CUcontext *ret_ctx);
/*
 * Devices by UUID: a process numbers the devices it sees (CUDA_VISIBLE_DEVICES),
 * so ordinals do not travel; UUIDs do. dlx__cuda_uuid: 0 or -ENODEV;
 * dlx__cuda_ordinal: 0 with *ret, -ENOENT (not a device this process sees).
 */
DLX_HIDDEN int dlx__cuda_uuid(const struct dlx_cuda_driver *cu, int device,
                              uint8_t ret[DLX_CUDA_UUID]);
DLX_HIDDEN int dlx__cuda_ordinal(const struct dlx_cuda_driver *cu,
                                 const uint8_t uuid[DLX_CUDA_UUID], int *ret);
/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the current context's own streams. */
DLX_HIDDEN bool dlx__cuda_default_stream(void *stream);

#endif /* DLX_CLIENT_CUDADRV_H */
