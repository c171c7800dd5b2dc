/* SPDX-License-Identifier: MIT */
/*
 * Every size a peer controls has a limit here, checked at decode. Both sides
 * build against the same numbers, so a well-behaved client never hits one.
 */
#ifndef DLX_PROTO_WIRE_LIMITS_H
#define DLX_PROTO_WIRE_LIMITS_H

/* Protocol version spoken by this build; a different major is refused. */
#define DLX_PROTO_MAJOR 1
#define DLX_PROTO_MINOR 6

/* Largest frame payload either side accepts (a full list page fits easily). */
#define DLX_MAX_FRAME (1u << 20)
/* File descriptors one frame may carry, and how many may wait in a receive queue. */
#define DLX_MAX_FDS_PER_FRAME 4
#define DLX_MAX_FDS_QUEUED 4
/*
 * Tensor rank, as DLPack frameworks use it (numpy's limit is 64, torch's is
 * 25). This and DLX_NAME_MAX are also the public header's (dlx.h), which the
 * protocol does not include: libdlx includes both, and a redefinition with
 * another value fails its build.
 */
#define DLX_MAX_NDIM 32
/* Bytes of a name, excluding the terminating NUL. */
#define DLX_NAME_MAX 255
/* Bytes of a client name given in hello. */
#define DLX_CLIENT_NAME_MAX 64
/* Bytes of a mirror's origin (Info.origin, 1.5). */
#define DLX_ORIGIN_MAX 127
/* Bytes of a federation peer's alias: a mount's prefix is "@<alias>/" (1.5). */
#define DLX_ALIAS_MAX 32
/* Prefixes one session may mount (1.5). */
#define DLX_MAX_MOUNTS 1024
/* Bytes of a human-readable error carried in a reply. */
#define DLX_ERROR_MAX 255
/* Requests of one session that may wait in the daemon (blocked acquires) at once. */
#define DLX_MAX_INFLIGHT 256
/* Entries in one list reply, at most and by default. */
#define DLX_LIST_PAGE_MAX 512
#define DLX_LIST_PAGE_DEFAULT 256
/* Leases one session may hold at once (dlxd --max-leases; the default). */
#define DLX_MAX_LEASES_PER_SESSION 65536
/* dlxd's other defaults; see dlxd --help. */
#define DLX_DEFAULT_MAX_CLIENTS 1024
#define DLX_DEFAULT_MAX_NAMES 1000000
#define DLX_DEFAULT_MAX_WATCHES 256
#define DLX_DEFAULT_MAX_QUEUED (16u << 20)
#define DLX_DEFAULT_MAX_GROUP_MEMBERS (1u << 20)
#define DLX_DEFAULT_MAX_GROUP_TABLE (UINT64_C(256) << 20)
#define DLX_DEFAULT_DAEMON_TIMEOUT_MS 10000 /* dlxd --timeout-ms */
/* --max-fds by default: derived from the descriptor limit at start. */
#define DLX_FDS_AUTO UINT64_MAX
/*
 * --max-clients-per-uid, --max-names-per-uid and --max-fds-per-uid by
 * default ("fair"): a uid's fair share of the limit in all, worked out as it
 * asks (quota_uid_cap). Never on the wire: a hello or stats reply carries the
 * cap as it stands for the asking uid.
 */
#define DLX_LIMIT_FAIR UINT64_MAX
#define DLX_LIMIT_FAIR32 UINT32_MAX
/* Segments one session may hold for publishing by id (each pins a daemon fd). */
#define DLX_MAX_HELD_SEGMENTS 256
/* Bytes of a CUDA IPC memory or event handle. */
#define DLX_CUDA_HANDLE 64
/* Bytes of a CUDA device UUID. */
#define DLX_CUDA_UUID 16
/* Segments one Forget may name. */
#define DLX_FORGET_MAX 64
/* Distinct consumer release events one version keeps for its producer to wait on. */
#define DLX_MAX_RELEASE_EVENTS 4096
/* ... and from one session (a client cycles through 64 per device). */
#define DLX_MAX_RELEASE_EVENTS_PER_SESSION 64
/* Largest single shared segment (alloc or published memfd): 1 TiB. */
#define DLX_MAX_SEGMENT (UINT64_C(1) << 40)

#endif /* DLX_PROTO_WIRE_LIMITS_H */
