/* SPDX-License-Identifier: MIT */
/*
 * Storage kinds: how a segment's bytes reach a consumer. One row per kind,
 * and every layer (the codec's names, dlxd's checks, libdlx's mapping and
 * allocating) asks the row instead of listing kinds. A new kind is a row
 * here plus the file that maps it (client) and the check that adopts it
 * (dlxd's store).
 */
#ifndef DLX_PROTO_STORAGE_H
#define DLX_PROTO_STORAGE_H

#include <stdbool.h>
#include <stdint.h>

/* The values of the protocol's Storage enum (dlx.proto). */
enum wire_storage {
        WIRE_STORAGE_UNSPECIFIED = 0,
        WIRE_STORAGE_MEMFD = 1,
        WIRE_STORAGE_CUDA_IPC = 2,
        WIRE_STORAGE_CUDA_VMM = 3,
        WIRE_STORAGE_CUDA_HOST = 4,
};

/* How dlxd tells a producer's segment of this kind from an impostor (daemon/store.c). */
enum storage_check {
        /* a memfd sealed against shrinking and growing, open for reading; its size is its own */
        STORAGE_CHECK_MEMFD,
        /* a file of the CUDA driver's control device; the size is the producer's word */
        STORAGE_CHECK_DRIVER_FD,
        /* no descriptor: a driver handle in the message, the size the producer's word */
        STORAGE_CHECK_HANDLE,
};

struct storage_kind {
        enum wire_storage id;
        const char *name;    /* as dlx_info.storage, dlxctl and the logs say it */
        int32_t device_type; /* DLDeviceType of the tensors published in it */
        enum storage_check check;
        /* consumers mmap() the fd: host memory, which seals make read-only */
        bool host_mapped;
        /* consumers need the CUDA driver: to import it, or to pin it (cuda-host) */
        bool needs_cuda;
        /* may outlive its producer (dlx_publish_options.persist) */
        bool may_persist;
        /* a CUDA event may come with a version, to order readers after the producer */
        bool takes_event;
        /* what dlx_alloc() makes for a prototype on device_type */
        bool allocated;
        /* the segment kinds a tensor of this kind may live in: bit 1u << kind */
        uint32_t segments;
};

/* The row of a kind, or NULL for UNSPECIFIED and values this build does not know. */
const struct storage_kind *storage_kind(uint32_t id);
/* The kind dlx_alloc() makes on a DLPack device type, or NULL where it makes none. */
const struct storage_kind *storage_allocated_on(int32_t device_type);
/* Whether a segment of kind seg may carry a tensor published as kind t (both known). */
bool storage_fits(uint32_t seg, uint32_t t);
/* The row's name, or "unknown". */
const char *storage_name(uint32_t id);

#endif
