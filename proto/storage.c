/* SPDX-License-Identifier: MIT */
/* The table of storage kinds (storage.h). */
#include <stddef.h>

#include <dlx/dlpack.h>

#include "storage.h"

#define BIT(kind) (1u << (kind))

/* Indexed by id, so that the acquire path's lookups are an array access. */
static const struct storage_kind kinds[] = {
        [WIRE_STORAGE_MEMFD] =
                {
                        .id = WIRE_STORAGE_MEMFD,
                        .name = "memfd",
                        .device_type = kDLCPU,
                        .check = STORAGE_CHECK_MEMFD,
                        .host_mapped = true,
                        .may_persist = true,
                        .allocated = true,
                        .segments = BIT(WIRE_STORAGE_MEMFD),
                },
        [WIRE_STORAGE_CUDA_HOST] =
                {
                        /* a memfd the consumer pins with the driver: any host segment carries it */
                        .id = WIRE_STORAGE_CUDA_HOST,
                        .name = "cuda-host",
                        .device_type = kDLCUDAHost,
                        .check = STORAGE_CHECK_MEMFD,
                        .host_mapped = true,
                        .needs_cuda = true,
                        .may_persist = true,
                        .takes_event = true,
                        .allocated = true,
                        .segments = BIT(WIRE_STORAGE_MEMFD) | BIT(WIRE_STORAGE_CUDA_HOST),
                },
        [WIRE_STORAGE_CUDA_IPC] =
                {
                        /* legacy IPC: the memory is the producer's, and dies with it */
                        .id = WIRE_STORAGE_CUDA_IPC,
                        .name = "cuda-ipc",
                        .device_type = kDLCUDA,
                        .check = STORAGE_CHECK_HANDLE,
                        .needs_cuda = true,
                        .takes_event = true,
                        .segments = BIT(WIRE_STORAGE_CUDA_IPC),
                },
        [WIRE_STORAGE_CUDA_VMM] =
                {
                        /* device memory from cuMemCreate, exported as a POSIX fd */
                        .id = WIRE_STORAGE_CUDA_VMM,
                        .name = "cuda-vmm",
                        .device_type = kDLCUDA,
                        .check = STORAGE_CHECK_DRIVER_FD,
                        .needs_cuda = true,
                        .may_persist = true,
                        .takes_event = true,
                        .allocated = true,
                        .segments = BIT(WIRE_STORAGE_CUDA_VMM),
                },
};

const struct storage_kind *storage_kind(uint32_t id)
{
        /* UNSPECIFIED's slot, and any hole, has no name */
        return id < sizeof(kinds) / sizeof(kinds[0]) && kinds[id].name ? &kinds[id] : NULL;
}

const struct storage_kind *storage_allocated_on(int32_t device_type)
{
        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
                if (kinds[i].name && kinds[i].allocated && kinds[i].device_type == device_type)
                        return &kinds[i];
        return NULL;
}

bool storage_fits(uint32_t seg, uint32_t t)
{
        const struct storage_kind *k = storage_kind(t);

        return k && seg < 32 && (k->segments & BIT(seg));
}

const char *storage_name(uint32_t id)
{
        const struct storage_kind *k = storage_kind(id);

        return k ? k->name : "unknown";
}
