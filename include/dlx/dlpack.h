/* SPDX-License-Identifier: MIT */
/*
 * dlx/dlpack.h — DLPack 1.3 types for dlx, written by this project from the
 * DLPack specification.
 *
 * Three cases, decided at preprocessing time:
 *
 *   1. A system <dlpack/dlpack.h> of version >= 1.2 is available (or was already
 *      included): it is used as is.
 *   2. An older system header (0.x, as Debian 12's libdlpack-dev 0.6) is available
 *      or was included: its base types (DLDevice, DLDataType, DLTensor,
 *      DLManagedTensor) are ABI-identical to 1.3 and are kept; this header adds
 *      what 0.x lacks: DLPackVersion, DLManagedTensorVersioned, the flag bits, the
 *      later device-type and dtype codes (as constants), and the exchange API.
 *   3. No system header, or DLX_DLPACK_BUNDLED is defined before inclusion: every
 *      type is defined here. The system header's include guard is then defined
 *      too, so a later #include <dlpack/dlpack.h> is a no-op instead of a clash.
 *
 * Whatever the case, after this header:
 *   DLX_DLPACK_SOURCE is one of DLX_DLPACK_SYSTEM, DLX_DLPACK_SYSTEM_0X,
 *   DLX_DLPACK_OWN, and every name of the DLPack 1.3 C API is usable.
 */
#ifndef DLX_DLPACK_H
#define DLX_DLPACK_H

#include <stddef.h>
#include <stdint.h>

#define DLX_DLPACK_SYSTEM 1
#define DLX_DLPACK_SYSTEM_0X 2
#define DLX_DLPACK_OWN 3

#if !defined(DLX_DLPACK_BUNDLED) && !defined(DLPACK_DLPACK_H_) && defined(__has_include)
#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
#endif
#endif

#if defined(DLPACK_DLPACK_H_) && defined(DLX_DLPACK_BUNDLED) && !defined(DLX_DLPACK_OWN_TYPES)
#error "DLX_DLPACK_BUNDLED is set but <dlpack/dlpack.h> was already included: include dlx first"
#endif

#if defined(DLPACK_DLPACK_H_) && defined(DLPACK_MAJOR_VERSION)
/* ---- case 1: a 1.x system header ------------------------------------------------------ */
#if DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION < 2
#error "the system <dlpack/dlpack.h> is 1.0 or 1.1: dlx needs >= 1.2 or the 0.x header"
#endif
#define DLX_DLPACK_SOURCE DLX_DLPACK_SYSTEM

#elif defined(DLPACK_DLPACK_H_)
/* ---- case 2: a 0.x system header ------------------------------------------------------ */
#define DLX_DLPACK_SOURCE DLX_DLPACK_SYSTEM_0X
#define DLX_DLPACK_NEED_V1_TYPES 1
/* the API this header completes 0.x to, as a 1.x header says it */
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 3

/* Codes that 0.x's enums lack; values are fixed by the 1.3 specification. */
#if DLPACK_VERSION < 70
#define kDLOneAPI ((DLDeviceType)14)
#define kDLWebGPU ((DLDeviceType)15)
#define kDLHexagon ((DLDeviceType)16)
#endif
#define kDLMAIA ((DLDeviceType)17)
#define kDLTrn ((DLDeviceType)18)

#define kDLBool ((DLDataTypeCode)6)
#define kDLFloat8_e3m4 ((DLDataTypeCode)7)
#define kDLFloat8_e4m3 ((DLDataTypeCode)8)
#define kDLFloat8_e4m3b11fnuz ((DLDataTypeCode)9)
#define kDLFloat8_e4m3fn ((DLDataTypeCode)10)
#define kDLFloat8_e4m3fnuz ((DLDataTypeCode)11)
#define kDLFloat8_e5m2 ((DLDataTypeCode)12)
#define kDLFloat8_e5m2fnuz ((DLDataTypeCode)13)
#define kDLFloat8_e8m0fnu ((DLDataTypeCode)14)
#define kDLFloat6_e2m3fn ((DLDataTypeCode)15)
#define kDLFloat6_e3m2fn ((DLDataTypeCode)16)
#define kDLFloat4_e2m1fn ((DLDataTypeCode)17)

#else
/* ---- case 3: the project's own definitions -------------------------------------------- */
#define DLX_DLPACK_SOURCE DLX_DLPACK_OWN
#define DLX_DLPACK_OWN_TYPES 1
#define DLX_DLPACK_NEED_V1_TYPES 1
/* Claim the system header's guard: a later include of it is then a no-op. */
#define DLPACK_DLPACK_H_
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 3
#ifdef __cplusplus
#define DLPACK_EXTERN_C extern "C"
#else
#define DLPACK_EXTERN_C
#endif
#define DLPACK_DLL

#ifdef __cplusplus
extern "C" {
#endif

/* Where a tensor's memory lives. */
typedef enum {
        kDLCPU = 1,
        kDLCUDA = 2,
        kDLCUDAHost = 3, /* pinned host memory from cudaMallocHost */
        kDLOpenCL = 4,
        kDLVulkan = 7,
        kDLMetal = 8,
        kDLVPI = 9,
        kDLROCM = 10,
        kDLROCMHost = 11,
        kDLExtDev = 12,
        kDLCUDAManaged = 13,
        kDLOneAPI = 14,
        kDLWebGPU = 15,
        kDLHexagon = 16,
        kDLMAIA = 17,
        kDLTrn = 18,
} DLDeviceType;

typedef struct {
        DLDeviceType device_type;
        int32_t device_id;
} DLDevice;

/* Element type families; sub-byte types are packed, little bit-endian. */
typedef enum {
        kDLInt = 0U,
        kDLUInt = 1U,
        kDLFloat = 2U,
        kDLOpaqueHandle = 3U,
        kDLBfloat = 4U,
        kDLComplex = 5U,
        kDLBool = 6U,
        kDLFloat8_e3m4 = 7U,
        kDLFloat8_e4m3 = 8U,
        kDLFloat8_e4m3b11fnuz = 9U,
        kDLFloat8_e4m3fn = 10U,
        kDLFloat8_e4m3fnuz = 11U,
        kDLFloat8_e5m2 = 12U,
        kDLFloat8_e5m2fnuz = 13U,
        kDLFloat8_e8m0fnu = 14U,
        kDLFloat6_e2m3fn = 15U,
        kDLFloat6_e3m2fn = 16U,
        kDLFloat4_e2m1fn = 17U,
} DLDataTypeCode;

typedef struct {
        uint8_t code;   /* a DLDataTypeCode */
        uint8_t bits;   /* bits per lane */
        uint16_t lanes; /* vector lanes, 1 for scalars */
} DLDataType;

/* A non-owning view: element i lives at data + byte_offset + sum(i_k * strides_k) * size. */
typedef struct {
        void *data;
        DLDevice device;
        int32_t ndim;
        DLDataType dtype;
        int64_t *shape;
        int64_t *strides; /* in elements; NULL means compact row-major */
        uint64_t byte_offset;
} DLTensor;

/* Legacy (pre-1.0) owning wrapper. */
typedef struct DLManagedTensor {
        DLTensor dl_tensor;
        void *manager_ctx;
        void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#ifdef __cplusplus
}
#endif
#endif /* case 3 */

#ifdef DLX_DLPACK_NEED_V1_TYPES
#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
        uint32_t major; /* ABI-breaking changes */
        uint32_t minor; /* additions only */
} DLPackVersion;

/* The tensor may not be written through. */
#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
/* The producer made a copy: the consumer owns the data alone. */
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)
/* Sub-byte elements are padded to whole bytes instead of packed. */
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (UINT64_C(1) << 2)

typedef struct DLManagedTensorVersioned {
        DLPackVersion version;
        void *manager_ctx;
        void (*deleter)(struct DLManagedTensorVersioned *self);
        uint64_t flags;
        DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* The C exchange API (DLPack 1.2+): a table a framework publishes on its tensor type. */
typedef int (*DLPackManagedTensorAllocator)(DLTensor *prototype, DLManagedTensorVersioned **out,
                                            void *error_ctx,
                                            void (*SetError)(void *error_ctx, const char *kind,
                                                             const char *message));
typedef int (*DLPackManagedTensorFromPyObjectNoSync)(void *py_object,
                                                     DLManagedTensorVersioned **out);
typedef int (*DLPackManagedTensorToPyObjectNoSync)(DLManagedTensorVersioned *tensor,
                                                   void **out_py_object);
typedef int (*DLPackDLTensorFromPyObjectNoSync)(void *py_object, DLTensor *out);
typedef int (*DLPackCurrentWorkStream)(DLDeviceType device_type, int32_t device_id,
                                       void **out_current_stream);

typedef struct DLPackExchangeAPIHeader {
        DLPackVersion version;
        struct DLPackExchangeAPIHeader *prev_api;
} DLPackExchangeAPIHeader;

typedef struct DLPackExchangeAPI {
        DLPackExchangeAPIHeader header;
        DLPackManagedTensorAllocator managed_tensor_allocator;
        DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync;
        DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync;
        DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync;
        DLPackCurrentWorkStream current_work_stream;
} DLPackExchangeAPI;

#ifdef __cplusplus
}
#endif
#endif /* DLX_DLPACK_NEED_V1_TYPES */

/* The version dlx speaks: what it puts in every tensor it hands out. */
#define DLX_DLPACK_MAJOR 1
#define DLX_DLPACK_MINOR 3

/* Layout checks: the ABI is fixed by the specification, whoever defined the types. */
#if defined(__cplusplus)
#define DLX_DLPACK_ASSERT(c, m) static_assert(c, m)
#else
#define DLX_DLPACK_ASSERT(c, m) _Static_assert(c, m)
#endif
DLX_DLPACK_ASSERT(sizeof(DLDevice) == 8, "DLDevice is 8 bytes");
DLX_DLPACK_ASSERT(sizeof(DLDataType) == 4, "DLDataType is 4 bytes");
DLX_DLPACK_ASSERT(sizeof(DLPackVersion) == 8, "DLPackVersion is 8 bytes");
DLX_DLPACK_ASSERT(offsetof(DLTensor, device) == sizeof(void *), "DLTensor.device");
DLX_DLPACK_ASSERT(offsetof(DLTensor, ndim) == sizeof(void *) + 8, "DLTensor.ndim");
DLX_DLPACK_ASSERT(offsetof(DLTensor, dtype) == sizeof(void *) + 12, "DLTensor.dtype");
DLX_DLPACK_ASSERT(offsetof(DLTensor, shape) == sizeof(void *) + 16, "DLTensor.shape");
DLX_DLPACK_ASSERT(offsetof(DLTensor, byte_offset) == 3 * sizeof(void *) + 16,
                  "DLTensor.byte_offset");
DLX_DLPACK_ASSERT(sizeof(DLTensor) == 3 * sizeof(void *) + 24, "DLTensor size");
DLX_DLPACK_ASSERT(offsetof(DLManagedTensorVersioned, manager_ctx) == 8,
                  "DLManagedTensorVersioned.manager_ctx");
DLX_DLPACK_ASSERT(offsetof(DLManagedTensorVersioned, flags) == 8 + 2 * sizeof(void *),
                  "DLManagedTensorVersioned.flags");
DLX_DLPACK_ASSERT(offsetof(DLManagedTensorVersioned, dl_tensor) == 16 + 2 * sizeof(void *),
                  "DLManagedTensorVersioned.dl_tensor");
DLX_DLPACK_ASSERT(offsetof(DLManagedTensor, manager_ctx) == sizeof(DLTensor),
                  "DLManagedTensor.manager_ctx");
DLX_DLPACK_ASSERT(sizeof(DLPackExchangeAPIHeader) == 8 + sizeof(void *),
                  "DLPackExchangeAPIHeader size");
DLX_DLPACK_ASSERT(offsetof(DLPackExchangeAPI, managed_tensor_allocator) ==
                          sizeof(DLPackExchangeAPIHeader),
                  "DLPackExchangeAPI.managed_tensor_allocator");
DLX_DLPACK_ASSERT(sizeof(DLPackExchangeAPI) ==
                          sizeof(DLPackExchangeAPIHeader) + 5 * sizeof(void (*)(void)),
                  "DLPackExchangeAPI size");
DLX_DLPACK_ASSERT(kDLFloat4_e2m1fn == 17 && kDLBool == 6 && kDLTrn == 18, "DLPack 1.3 code values");

#endif /* DLX_DLPACK_H */
