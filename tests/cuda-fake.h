/* SPDX-License-Identifier: MIT */
/*
 * A test double of the CUDA driver over host memory, so libdlx's CUDA
 * bookkeeping runs on machines without a GPU. Every entry point of
 * struct dlx_cuda_driver is implemented; nothing links libcuda or libcudart.
 *
 * Memory. "Device memory" is host memory in memfd-backed shared mappings and
 * a CUdeviceptr is the host address of the mapping in the calling process,
 * so tests read and write device memory directly. Legacy IPC handles carry
 * the exporter's pid and memfd number and are opened through
 * /proc/<pid>/fd/<fd>; VMM allocations are memfds, exported as a dup of the
 * memfd (pass it with SCM_RIGHTS as the real one), imported from any fd of
 * that memfd, and mapped with the protection MemSetAccess asks for, so a
 * read-only consumer really faults (SIGSEGV) on a write.
 *
 * Work is immediate: every copy is done and every event complete when the
 * call returns (EventQuery says CUDA_ERROR_NOT_READY, and EventSynchronize
 * waits, only for an event a test holds: cuda_fake_event_hold()). What the
 * tests check instead is a log of calls kept in shared memory by every
 * process forked after cuda_fake_init(), with a global identity for every
 * event.
 *
 * Processes. Per-process state (allocations, handles, mappings, events,
 * registrations, fault injection, settings) lives in ordinary memory, so a
 * forked child starts with a copy of its parent's: fork before creating
 * objects, or count them in the child relative to what it inherited. The
 * context stack is per thread. The log and the state of exported events are
 * shared by the processes forked after the cuda_fake_init() that made them.
 *
 * Deliberately stricter than the driver, to catch libdlx mistakes the real
 * one might forgive or punish later (each is documented where it applies):
 * - the legacy calls (IPC memory and events, events, host registration and
 *   copies) fail with CUDA_ERROR_INVALID_CONTEXT when no context is current
 *   on the calling thread (cuda_fake_require_context());
 * - opening the same IPC memory handle twice in a process fails with
 *   CUDA_ERROR_ALREADY_MAPPED, as older drivers do; current drivers count
 *   references instead (cuda_fake_ipc_refcount());
 * - opening a handle exported by the calling process itself fails with
 *   CUDA_ERROR_INVALID_CONTEXT;
 * - releasing an unknown or already released handle, or closing, unmapping,
 *   freeing or unregistering anything not exactly as it was made, fails
 *   (CUDA_ERROR_INVALID_VALUE unless stated) instead of being undefined;
 * - using an opened IPC event after its exporter destroyed it fails with
 *   CUDA_ERROR_INVALID_HANDLE;
 * - MemAddressFree fails while a mapping is left in the range;
 * - MemHostRegister checks /proc/self/maps: the range must be mapped, and
 *   writable unless CU_MEMHOSTREGISTER_READ_ONLY is given (as the driver
 *   requires on hosts whose devices do not use the host's page tables),
 *   else CUDA_ERROR_INVALID_VALUE;
 * - MemMap needs offset 0 (as cuda.h documents) and size and address
 *   multiples of the granularity; MemUnmap and MemSetAccess need a range
 *   made of whole mappings;
 * - IpcCloseMemHandle must run in the context that opened the mapping
 *   (elsewhere: CUDA_ERROR_INVALID_VALUE, and the mapping stays: a leak);
 * - MemRetainAllocationHandle needs the mapped handle not yet released.
 *
 * As strict as the driver, where earlier doubles were not:
 * - contexts: each device has its primary context, and tests make others
 *   (cuda_fake_ctx_create()); events belong to the context current when they
 *   are created or opened, streams to theirs (cuda_fake_stream_bind(); the
 *   default streams NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD to the
 *   current one). EventRecord needs the event and the stream in one context
 *   (else CUDA_ERROR_INVALID_HANDLE); StreamWaitEvent takes an event of any
 *   context or device. A stream the fake does not know is
 *   CUDA_ERROR_INVALID_HANDLE everywhere;
 * - devices: a process sees the physical devices cuda_fake_set_visible_devices()
 *   names, as CUDA_VISIBLE_DEVICES makes it, in that order: ordinals are the
 *   process's, DeviceGetUuid and the memory are the physical device's;
 * - legacy IPC handles (memory and events) do not open in another PID
 *   namespace than their exporter's (CUDA_ERROR_INVALID_VALUE), and memory
 *   from a pool or managed memory has none (cuda_fake_malloc_kind());
 * - work in flight: cuda_fake_stream_work() queues work on a stream over a
 *   range; it is done once the stream is synchronized (StreamSynchronize, or
 *   EventSynchronize / a successful EventQuery of an event recorded on it
 *   after the work). Unmapping, closing, unregistering or freeing memory with
 *   work not done on it is counted (cuda_fake_violations()) and reported on
 *   stderr: the driver would let the work run on freed memory.
 *
 * PointerGetAttribute answers CONTEXT, MEMORY_TYPE (unsigned int),
 * DEVICE_POINTER, HOST_POINTER (registered host memory only), BUFFER_ID,
 * MEMORY_BLOCK_ID, IS_MANAGED, DEVICE_ORDINAL (int),
 * IS_LEGACY_CUDA_IPC_CAPABLE (cuda_fake_malloc() memory only), RANGE_START_ADDR,
 * RANGE_SIZE (the reservation, for VMM), MAPPING_BASE_ADDR, MAPPING_SIZE,
 * MAPPED, ALLOWED_HANDLE_TYPES and ACCESS_FLAGS (unsigned int); booleans are
 * written as one byte (C bool), as the driver does, so pass a bool or a
 * zeroed int. Other attributes: CUDA_ERROR_NOT_SUPPORTED. Addresses the fake
 * does not know: CUDA_ERROR_INVALID_VALUE (MemGetAddressRange:
 * CUDA_ERROR_NOT_FOUND).
 *
 * Fds: every cuda_fake_malloc() allocation and every live VMM handle holds
 * one memfd open in its process (the real driver holds none), so tests that
 * count open fds see them until cuda_fake_free() / MemRelease. IPC and VMM
 * mappings hold no fd.
 *
 * Thread-safe: driver calls may come from any thread. The cuda_fake_*
 * settings and cuda_fake_init() must not race with calls in flight.
 */
#ifndef DLX_TESTS_CUDA_FAKE_H
#define DLX_TESTS_CUDA_FAKE_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct dlx_cuda_driver;

/* Calls of the driver, one per entry point (in the order of struct dlx_cuda_driver), plus the
 * test helpers' allocations. Used for the log, counting and fault injection. */
enum cuda_fake_op {
        CUDA_FAKE_INIT,
        CUDA_FAKE_GET_ERROR_STRING,
        CUDA_FAKE_DEVICE_GET,
        CUDA_FAKE_DEVICE_GET_COUNT,
        CUDA_FAKE_DEVICE_GET_UUID,
        CUDA_FAKE_DEVICE_PRIMARY_CTX_RETAIN,
        CUDA_FAKE_CTX_PUSH_CURRENT,
        CUDA_FAKE_CTX_POP_CURRENT,
        CUDA_FAKE_POINTER_GET_ATTRIBUTE,
        CUDA_FAKE_MEM_GET_ADDRESS_RANGE,
        CUDA_FAKE_IPC_GET_MEM_HANDLE,
        CUDA_FAKE_IPC_OPEN_MEM_HANDLE,
        CUDA_FAKE_IPC_CLOSE_MEM_HANDLE,
        CUDA_FAKE_IPC_GET_EVENT_HANDLE,
        CUDA_FAKE_IPC_OPEN_EVENT_HANDLE,
        CUDA_FAKE_EVENT_CREATE,
        CUDA_FAKE_EVENT_DESTROY,
        CUDA_FAKE_EVENT_RECORD,
        CUDA_FAKE_EVENT_QUERY,
        CUDA_FAKE_EVENT_SYNCHRONIZE,
        CUDA_FAKE_STREAM_WAIT_EVENT,
        CUDA_FAKE_STREAM_GET_CTX,
        CUDA_FAKE_STREAM_SYNCHRONIZE,
        CUDA_FAKE_MEM_GET_ALLOCATION_GRANULARITY,
        CUDA_FAKE_MEM_CREATE,
        CUDA_FAKE_MEM_RELEASE,
        CUDA_FAKE_MEM_RETAIN_ALLOCATION_HANDLE,
        CUDA_FAKE_MEM_EXPORT_TO_SHAREABLE_HANDLE,
        CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE,
        CUDA_FAKE_MEM_ADDRESS_RESERVE,
        CUDA_FAKE_MEM_ADDRESS_FREE,
        CUDA_FAKE_MEM_MAP,
        CUDA_FAKE_MEM_UNMAP,
        CUDA_FAKE_MEM_SET_ACCESS,
        CUDA_FAKE_MEM_HOST_REGISTER,
        CUDA_FAKE_MEM_HOST_UNREGISTER,
        CUDA_FAKE_MEMCPY_ASYNC,
        CUDA_FAKE_MEMCPY_DTOH,
        CUDA_FAKE_MEMCPY_HTOD,
        CUDA_FAKE_MALLOC,      /* cuda_fake_malloc() */
        CUDA_FAKE_FREE,        /* cuda_fake_free() */
        CUDA_FAKE_STREAM_WORK, /* cuda_fake_stream_work() */
        CUDA_FAKE_OP_COUNT
};

/* Objects alive in the calling process, for leak checks (cuda_fake_live()). */
enum cuda_fake_kind {
        CUDA_FAKE_ALLOCATION,   /* cuda_fake_malloc() not yet cuda_fake_free()d */
        CUDA_FAKE_IPC_MAPPING,  /* IpcOpenMemHandle not yet closed (one per address) */
        CUDA_FAKE_MEM_HANDLE,   /* MemCreate or MemImportFromShareableHandle not yet released */
        CUDA_FAKE_MAPPING,      /* MemMap not yet unmapped */
        CUDA_FAKE_RESERVATION,  /* MemAddressReserve not yet freed */
        CUDA_FAKE_EVENT,        /* EventCreate not yet destroyed */
        CUDA_FAKE_IPC_EVENT,    /* IpcOpenEventHandle not yet destroyed */
        CUDA_FAKE_REGISTRATION, /* MemHostRegister not yet unregistered */
        CUDA_FAKE_KIND_COUNT
};

/* Devices the fake can pretend to have (cuda_fake_set_device_count()). */
#define CUDA_FAKE_MAX_DEVICES 8
/* Default granularity of VMM allocations (MemGetAllocationGranularity). */
#define CUDA_FAKE_GRANULARITY ((size_t)2 << 20)

/*
 * Global event ids: the pid of the process that created the event and a
 * number it gave it, never 0. An event opened from an IPC handle has the id
 * of the exporter's event, so ids compare across processes.
 */
#define CUDA_FAKE_EVENT_PID(id) ((pid_t)((uint64_t)(id) >> 32))

/*
 * Starts a fresh fake for this process and the processes it forks from now
 * on: an empty shared log and table of exported events (a shared anonymous
 * mapping; a previous one is unmapped here, not in processes that have it),
 * no fault armed, 1 device, granularity CUDA_FAKE_GRANULARITY, contexts
 * required, IPC reopening refused. Objects already made are kept. Call it
 * before forking and before the settings below. If a test does not, the
 * first driver call makes the shared region (without resetting anything),
 * shared only with children forked after it. Returns 0 or -ENOMEM.
 */
int cuda_fake_init(void);

/* The driver table, to pass to dlx__cuda_install(). Valid for the life of the process. */
const struct dlx_cuda_driver *cuda_fake_driver(void);

/* --- settings (per process, inherited over fork) ------------------------------------------ */

/*
 * How many devices DeviceGetCount reports (0..CUDA_FAKE_MAX_DEVICES, default
 * 1). Ordinals at or beyond it fail with CUDA_ERROR_INVALID_DEVICE in
 * DeviceGet, DevicePrimaryCtxRetain, MemCreate and MemSetAccess; with 0,
 * Init fails with CUDA_ERROR_NO_DEVICE. Returns 0 or -EINVAL.
 */
int cuda_fake_set_device_count(int count);

/* The VMM granularity: a power of two, at least the page size (default CUDA_FAKE_GRANULARITY).
 * Returns 0 or -EINVAL. Change it only while no VMM object exists. */
int cuda_fake_set_granularity(size_t granularity);

/*
 * Whether the legacy calls need a current context (default true):
 * IpcGetMemHandle, IpcOpenMemHandle, IpcCloseMemHandle, IpcOpenEventHandle,
 * EventCreate, EventRecord, StreamWaitEvent, MemHostRegister,
 * MemHostUnregister and the Memcpy calls fail with
 * CUDA_ERROR_INVALID_CONTEXT when the calling thread has none. VMM calls,
 * queries, EventQuery, EventSynchronize, EventDestroy and IpcGetEventHandle
 * never need one.
 */
void cuda_fake_require_context(bool required);

/*
 * Whether MemSetAccess refuses read-only access (CUDA_ERROR_NOT_SUPPORTED), as
 * some devices and drivers do for VMM memory (default false: granted).
 */
void cuda_fake_refuse_read_only(bool refuse);

/*
 * Opening an IPC memory handle this process already has open: false
 * (default) fails with CUDA_ERROR_ALREADY_MAPPED, as older drivers do, so
 * libdlx must cache its opens; true returns the same address and counts a
 * reference that IpcCloseMemHandle drops, as cuda.h documents for current
 * drivers.
 */
void cuda_fake_ipc_refcount(bool refcount);

/*
 * Fault injection: the next call of op in this process (any thread) fails
 * with r and changes nothing; it is not logged. cuda_fake_fail_after lets
 * `skip` calls of op through first. One fault per op is armed at a time
 * (arming again replaces it); r == CUDA_SUCCESS disarms. For
 * CUDA_FAKE_MALLOC, cuda_fake_malloc() returns 0; for CUDA_FAKE_FREE,
 * cuda_fake_free() returns r.
 */
void cuda_fake_fail_next(enum cuda_fake_op op, CUresult r);
void cuda_fake_fail_after(enum cuda_fake_op op, unsigned skip, CUresult r);

/* --- memory ------------------------------------------------------------------------------- */

/*
 * cuMemAlloc for tests: size bytes of zeroed "device memory" on the device
 * of the current context (device 0 without one), in a memfd mapping of this
 * process that IpcGetMemHandle can export. MemGetAddressRange and
 * PointerGetAttribute answer for any address inside it with its base and
 * size. Returns the address, or 0 (size 0, out of memory, injected fault).
 * Logged as CUDA_FAKE_MALLOC (ptr, size).
 */
CUdeviceptr cuda_fake_malloc(size_t size);

/* What cuda_fake_malloc_kind() pretends the memory came from. */
enum cuda_fake_memory {
        CUDA_FAKE_MEMORY_PLAIN,   /* cuMemAlloc: legacy IPC capable */
        CUDA_FAKE_MEMORY_POOL,    /* cuMemAllocAsync from a pool: MEMPOOL_HANDLE set, no IPC */
        CUDA_FAKE_MEMORY_MANAGED, /* cuMemAllocManaged: IS_MANAGED, no IPC */
};
CUdeviceptr cuda_fake_malloc_kind(size_t size, enum cuda_fake_memory kind);

/*
 * Frees a cuda_fake_malloc() allocation (ptr: its base). Processes that
 * opened it keep their mappings. Returns CUDA_SUCCESS, or
 * CUDA_ERROR_INVALID_VALUE when ptr is not the base of a live allocation.
 */
CUresult cuda_fake_free(CUdeviceptr ptr);

/* --- contexts, streams, devices ---------------------------------------------------------- */

/* A new, non-primary context on device (an ordinal), or NULL (16 at most per process). */
CUcontext cuda_fake_ctx_create(int device);

/*
 * Makes stream a stream of ctx in this process (and the children it forks
 * from now on); ctx NULL forgets it. The default streams cannot be bound.
 * Returns 0, -EINVAL or -ENOSPC (64 streams).
 */
int cuda_fake_stream_bind(CUstream stream, CUcontext ctx);

/* Queues work on stream over [ptr, ptr + size) (see "work in flight"). 0 or -EINVAL. */
int cuda_fake_stream_work(CUstream stream, CUdeviceptr ptr, size_t size);

/* Memory freed under work in flight in this process so far. */
unsigned cuda_fake_violations(void);

/*
 * This process sees the physical devices physical[0..n-1], in that order
 * (ordinal i is physical[i]); the device count becomes n. Distinct, below
 * CUDA_FAKE_MAX_DEVICES. Returns 0 or -EINVAL.
 */
int cuda_fake_set_visible_devices(const int *physical, int n);

/* The UUID DeviceGetUuid reports for a physical device. */
void cuda_fake_uuid(int physical, CUuuid *ret);

/* The primary context of device (0..CUDA_FAKE_MAX_DEVICES-1; NULL beyond), the one
 * DevicePrimaryCtxRetain returns; for tests that push their own context. */
CUcontext cuda_fake_ctx(int device);
/* The calling thread's current context (top of its stack), or NULL. */
CUcontext cuda_fake_ctx_current(void);
/* Depth of the calling thread's context stack: libdlx must leave it as it found it. */
int cuda_fake_ctx_depth(void);

/* --- events ------------------------------------------------------------------------------- */

/* The global id of a live event of this process (created or opened), or 0. */
uint64_t cuda_fake_event_id(CUevent event);

/*
 * Holds an event (by global id, in every process sharing the log): while
 * held, EventQuery on it or on any event opened from it returns
 * CUDA_ERROR_NOT_READY and EventSynchronize waits (polling every
 * millisecond). hold false completes it. Returns 0, or -ENOSPC when
 * the shared table of events is full.
 */
int cuda_fake_event_hold(uint64_t event_id, bool hold);

/* --- the log ------------------------------------------------------------------------------ */

/*
 * One successful call. Logged: every call that changes state (the Ctx
 * calls, DevicePrimaryCtxRetain, IPC, events, VMM, host registration,
 * copies, cuda_fake_malloc/free); never the pure queries (Init,
 * GetErrorString, DeviceGet, DeviceGetCount, PointerGetAttribute,
 * MemGetAddressRange, MemGetAllocationGranularity, EventQuery) nor failed
 * calls. Fields not listed for an op are 0.
 *
 *   DEVICE_PRIMARY_CTX_RETAIN  ptr: the context, aux: the device
 *   CTX_PUSH/POP_CURRENT       ptr: the context pushed or popped
 *   IPC_GET_MEM_HANDLE         ptr, size: the allocation
 *   IPC_OPEN_MEM_HANDLE        ptr, size: the mapping, aux: the exporter's pid
 *   IPC_CLOSE_MEM_HANDLE       ptr: as passed, aux: references left
 *   EVENT_CREATE/DESTROY       event, aux: the creation flags
 *   IPC_GET/OPEN_EVENT_HANDLE  event (the exporter's event)
 *   EVENT_RECORD               event, stream
 *   EVENT_SYNCHRONIZE          event (logged when the wait ends)
 *   STREAM_WAIT_EVENT          event, stream, aux: flags
 *   MEM_CREATE/RELEASE         aux: the handle, size (CREATE)
 *   MEM_EXPORT_TO_SHAREABLE... aux: the handle, size: the new fd
 *   MEM_IMPORT_FROM_SHAREA...  aux: the handle, size: the allocation's
 *   MEM_ADDRESS_RESERVE/FREE   ptr, size
 *   MEM_MAP                    ptr, size, aux: the handle
 *   MEM_UNMAP                  ptr, size
 *   MEM_SET_ACCESS             ptr, size, aux: the CU_MEM_ACCESS_FLAGS_PROT_* applied
 *   MEM_HOST_REGISTER          ptr, size, aux: flags
 *   MEM_HOST_UNREGISTER        ptr, size
 *   MEMCPY_*                   ptr: destination, aux: source, size, stream (ASYNC)
 *   MALLOC / FREE              ptr, size
 */
struct cuda_fake_entry {
        pid_t pid;
        enum cuda_fake_op op;
        uint64_t stream; /* (uintptr_t) of the CUstream; 0 is the default stream */
        uint64_t event;  /* global event id */
        uint64_t ptr;
        uint64_t size;
        uint64_t aux;
};

/* Entries logged so far by every process sharing the log, in the order the calls happened. */
size_t cuda_fake_log_count(void);

/* Entry i (0-based) into *ret; false when i is out of range or the entry is being written. */
bool cuda_fake_log_entry(size_t i, struct cuda_fake_entry *ret);

/* True when entries were dropped because the log was full (1 << 20 entries). */
bool cuda_fake_log_overflowed(void);

/*
 * The index of the first entry at or after `from` with this op, made by pid
 * (0: any) about event (0: any), or -1.
 */
long cuda_fake_find(size_t from, enum cuda_fake_op op, pid_t pid, uint64_t event);

/* Number of logged calls of op made by pid (0: any process). */
int cuda_fake_count(enum cuda_fake_op op, pid_t pid);

/*
 * True when some process made `stream` wait on event (StreamWaitEvent) after
 * the event had been recorded (EventRecord, in any process): e.g. a
 * consumer's stream waiting on what the producer recorded at publish.
 */
bool cuda_fake_waited(CUstream stream, uint64_t event_id);

/* Objects of one kind alive in this process (including any inherited over fork). */
int cuda_fake_live(enum cuda_fake_kind kind);

/* "CUDA_FAKE_MEM_MAP" etc. for messages; "?" when out of range. */
const char *cuda_fake_op_name(enum cuda_fake_op op);

#endif /* DLX_TESTS_CUDA_FAKE_H */
