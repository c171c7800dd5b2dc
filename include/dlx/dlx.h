/* SPDX-License-Identifier: MIT */
/*
 * libdlx — share DLPack tensors between processes on one machine, zero-copy.
 *
 * A producer publishes a DLManagedTensorVersioned under a name; the dlxd
 * daemon records it; consumers acquire it and map the very same pages. The
 * bytes never pass through the daemon.
 *
 * Conventions (every function):
 *  - Returns >= 0 on success and a negative errno on failure; dlx_strerror()
 *    gives the text and dlx_last_error() the detail of the calling thread's
 *    last failure (often the daemon's own message).
 *  - Invalid arguments return -EINVAL; nothing aborts.
 *  - Out-parameters are named ret_* and are untouched on failure.
 *  - A dlx_client is thread-safe: any number of threads may call into the same
 *    client at once. Blocking calls block only the calling thread.
 *  - The library never prints, except to stderr when DLX_DEBUG is set in the
 *    environment; give a log callback to see what it would say.
 *
 * Errors common to every call that talks to the daemon:
 *   -ECONNRESET / -EPIPE  the daemon went away; the client is unusable and
 *                          should be closed (tensors already acquired stay valid)
 *   -ESHUTDOWN            the same, when the daemon said it was stopping
 *   -ETIMEDOUT            the daemon stopped answering (see below): the client
 *                          is unusable likewise, and has said bye (its acquired
 *                          tensors keep their leases)
 *   -ESTALE               the client was connected by another process (this
 *                          one is a fork of it): connect again in this one
 *   -EPROTO               the daemon sent something malformed
 *   -EMFILE               this process was at its descriptor limit when the
 *                          daemon passed it one, which the kernel dropped: the
 *                          client is unusable likewise (connect again)
 *   -ENOMEM               out of memory; the call fails alone, unless the
 *                          reply it lost held something the daemon now counts
 *                          as this client's (a lease, a segment, a watch, a
 *                          version): the client is unusable then, likewise
 *
 * No call waits forever by default: a call gives up when the daemon has sent
 * nothing for the client's timeout (dlx_connect_options.timeout_ms, default
 * DLX_DEFAULT_TIMEOUT_MS) and then leaves a ping unanswered as long again.
 * Waits that were asked for (an acquire waiting for a version, an event, a
 * release) go on as long as asked, the daemon answering the pings meanwhile.
 */
#ifndef DLX_DLX_H
#define DLX_DLX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <dlx/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libdlx is built with hidden visibility; everything declared here is its public ABI. */
#pragma GCC visibility push(default)

#define DLX_VERSION_MAJOR 0
#define DLX_VERSION_MINOR 1
#define DLX_VERSION_PATCH 0

/* Longest tensor name in bytes (without the NUL), and the largest rank. */
#define DLX_NAME_MAX 255
#define DLX_MAX_NDIM 32

typedef struct dlx_client dlx_client;

/* ---- connecting --------------------------------------------------------------------- */

/* Log levels passed to a dlx_log_fn (syslog's numbering). */
#define DLX_LOG_ERR 3
#define DLX_LOG_WARNING 4
#define DLX_LOG_INFO 6
#define DLX_LOG_DEBUG 7

/* Receives one message; msg is borrowed for the duration of the call. It runs with the
 * client's lock held: it must not call into libdlx. */
typedef void (*dlx_log_fn)(void *ctx, int level, const char *msg);

struct dlx_connect_options {
        /* Daemon socket; NULL: $DLX_SOCKET, else $XDG_RUNTIME_DIR/dlx/dlxd.sock, else
         * /tmp/dlx-$UID/dlxd.sock. */
        const char *socket_path;
        /* Shown in the daemon's logs and in stat; NULL: the program's name. */
        const char *client_name;
        dlx_log_fn log;
        void *log_ctx;
        /*
         * How long connecting, and any call, waits for the daemon to answer
         * before giving up with -ETIMEDOUT (a silent daemon is pinged first):
         * 0: DLX_DEFAULT_TIMEOUT_MS; < 0: no limit. At most INT32_MAX.
         */
        int64_t timeout_ms;
};

/* The timeout of a client whose connect options say 0. */
#define DLX_DEFAULT_TIMEOUT_MS 10000

/*
 * Connects and greets the daemon. opts may be NULL.
 * Returns 0 with *ret_client, or:
 *   -ENOENT / -ECONNREFUSED  no daemon listening on the socket
 *   -ETIMEDOUT               the daemon did not accept or greet us within timeout_ms
 *   -EPROTONOSUPPORT         the daemon speaks another protocol major version
 *   -EAGAIN                  the daemon's client limit is reached
 *   -ENAMETOOLONG            the socket path does not fit a sockaddr_un
 *   -EINVAL                  timeout_ms over INT32_MAX
 */
int dlx_connect(const struct dlx_connect_options *opts, dlx_client **ret_client);

/*
 * Closes the client: no new call may start on it, and calls still running in
 * other threads fail with -ECONNRESET. Its watches, waits and allocations end
 * and its non-persistent tensors are unpublished before it returns (the daemon
 * confirms; within the client's timeout), and the deleters of tensors it
 * published run now (readers keep the pages mapped).
 *
 * Tensors acquired through it, and every view of them (exchange-API exports,
 * framework tensors holding them), stay valid and keep their leases: while
 * any of them is alive the connection stays open for them alone, so the
 * producer cannot reuse their memory; the last one's deleter ends it. With
 * none alive the connection ends at once, and with it every lease. The same
 * holds for a client given up on a silent daemon (-ETIMEDOUT), whose close
 * is not confirmed: its live tensors keep the connection, and their leases.
 *
 * CUDA: first waits on the host for the GPU work each version this client still
 * holds was published after (its stream's, at publish), so that a reader's
 * lease or a persistent version never outlives the producer's writes; those
 * versions' interprocess events are kept for the life of the process (readers
 * may still wait on them), counted against its 1024 (dlx_publish()).
 *
 * In a process forked from the one that connected, dlx_close() only closes
 * this process's copies of the client's descriptors: the connection and its
 * leases are the parent's. NULL-safe.
 */
void dlx_close(dlx_client *client);

/* The daemon's protocol version and server string seen at connect; borrowed. */
const char *dlx_server_version(const dlx_client *client);

/* ---- publishing ---------------------------------------------------------------------- */

enum dlx_copy {
        /* Zero-copy when the bytes lie in dlx_alloc() memory of this client, else one copy. */
        DLX_COPY_IF_NEEDED = 0,
        /* Fail with -EXDEV rather than copy. */
        DLX_COPY_NEVER = 1,
        /* Always copy into fresh shared memory. */
        DLX_COPY_ALWAYS = 2,
};

struct dlx_publish_options {
        /* Kept by the daemon after this client disconnects, until unpublished or replaced. */
        bool persist;
        /* Consumers may write through their mapping. Default (false): read-only. */
        bool writable;
        enum dlx_copy copy;
        /* Producer work stream (CUstream) for CUDA tensors; NULL: dlx_set_stream()'s. */
        void *stream;
        /*
         * Federation bridges only: a mirror published under a prefix this
         * client mounted (dlx_mount()). origin_version: the version to
         * publish as, the origin's number (0: the next, as for any publish),
         * so that min_version means the same on every host; it must be above
         * the name's last version (-EEXIST), or equal to it while the name
         * has no current version (the same origin version mirrored again).
         * origin: where the mirror came from, for people (dlx_info.origin;
         * printable, at most 127 bytes). Elsewhere both must be 0/NULL
         * (-EINVAL).
         */
        uint64_t origin_version;
        const char *origin;
};

/*
 * Publishes tensor under name as a new version (the first is 1). opts may be NULL
 * (defaults: not persistent, read-only, DLX_COPY_IF_NEEDED).
 *
 * CUDA (kDLCUDA, and kDLCUDAHost: pinned memory a GPU may write). Readers are
 * ordered after the work queued on the stream (opts->stream, else
 * dlx_set_stream()'s; NULL is the legacy default stream of the device's
 * primary context) by an interprocess event recorded on it, in the stream's
 * own context. Publish does not wait for that work, with three exceptions
 * that wait on the host instead (cuStreamSynchronize on that stream, never a
 * device-wide sync): a persistent version, whose writes are done before it
 * is published so that it needs no event (legacy IPC events open only in the
 * producer's PID namespace, and a persistent version may be read from
 * anywhere, after the producer has gone); a copy of kDLCUDAHost memory; and a
 * process past its 1024 interprocess events (libdlx's bound; drivers fail
 * somewhere above some tens of thousands), until versions are released. Device
 * memory travels as a cuda-vmm segment when it came from dlx_alloc() or is a
 * framework's VMM allocation made shareable as a POSIX fd (exported; the
 * tensor must lie within one mapping), else by its legacy IPC handle
 * (cuda-ipc: cudaMalloc memory, which cannot persist). Devices travel by UUID,
 * so a consumer that numbers its GPUs otherwise (CUDA_VISIBLE_DEVICES) gets
 * the right one, as its own ordinal.
 *
 * Takes ownership of tensor on every path. A tensor whose bytes lie in memory
 * dlx_alloc() gave this client (the allocated tensor itself, or any view of it
 * with its own deleter, such as a framework's re-export) is shared as is, and
 * its deleter runs once the version is gone: replaced or unpublished and its
 * last lease released, or this client closed. Other CPU memory is copied once
 * into a fresh sealed segment and the deleter runs before this returns. On
 * failure the deleter has run too.
 *
 * Returns 0 with *ret_version (may be NULL), or:
 *   -EINVAL   bad name (1-255 bytes of printable UTF-8, '/'-separated, no empty,
 *             "." or ".." component), bad dtype, ndim over 32, negative shape
 *   -EACCES   the name is owned by another user, or is under '@' (a federation
 *             peer's, published only by the bridge that mounted it)
 *   -EEXIST   opts->origin_version is below the name's last version (or equal
 *             to it while the name has a current version)
 *   -EOVERFLOW also: the name's last version was UINT64_MAX (a mirror's), and
 *             there is no next one
 *   -EXDEV    DLX_COPY_NEVER and the memory did not come from dlx_alloc()
 *   -ENOTSUP  a device dlx cannot share (kDLCPU, kDLCUDAHost and kDLCUDA are),
 *             DLX_COPY_ALWAYS for a CUDA tensor, or CUDA memory that cannot be
 *             shared, the message naming which: managed memory, a stream-ordered
 *             pool's (cudaMallocAsync), a VMM allocation made without a POSIX-fd
 *             handle type (PyTorch's expandable segments), a tensor across two
 *             VMM mappings
 *   -EINVAL   also: a CUDA tensor whose data is not device memory, or a stream
 *             that is not a live CUDA stream
 *   -ENODEV   a CUDA tensor and no CUDA driver (or device), or a process
 *             forked from one that used CUDA (CUDA does not survive fork())
 *   -ENOSPC   the daemon's shared-bytes limit is reached
 *   -EOVERFLOW the layout's extent does not fit in 63 bits
 */
int dlx_publish(dlx_client *client, const char *name, DLManagedTensorVersioned *tensor,
                const struct dlx_publish_options *opts, uint64_t *ret_version);

/* Same, for a legacy (pre-1.0) DLManagedTensor; takes ownership on every path. */
int dlx_publish_legacy(dlx_client *client, const char *name, DLManagedTensor *tensor,
                       const struct dlx_publish_options *opts, uint64_t *ret_version);

/*
 * A DLPack 1.x tensor over a legacy one (a group member, say), not read-only
 * and of the same layout; its deleter runs the legacy one's. Takes ownership
 * on every path. Returns 0 with *ret_tensor, -EINVAL (NULL) or -ENOMEM.
 */
int dlx_tensor_from_legacy(DLManagedTensor *tensor, DLManagedTensorVersioned **ret_tensor);

/*
 * Publishes a framework's tensor through that framework's exchange-API table:
 * api->managed_tensor_from_py_object_no_sync(object) gives the tensor, and for
 * device tensors api->current_work_stream() the stream to order on (unless
 * opts->stream is set). object is borrowed.
 * Returns what dlx_publish() returns, or -EIO when the table's call fails.
 */
int dlx_publish_from(dlx_client *client, const char *name, const DLPackExchangeAPI *api,
                     void *object, const struct dlx_publish_options *opts, uint64_t *ret_version);

/*
 * Removes name: new acquires no longer find it; versions already leased stay
 * readable until released.
 * Returns 0, -ENOENT (no such name) or -EACCES (owned by another user).
 */
int dlx_unpublish(dlx_client *client, const char *name);

/* ---- shareable memory ------------------------------------------------------------------ */

/*
 * Allocates a compact row-major tensor in shared memory, to fill in place and
 * publish without a copy. Only prototype's dtype, ndim, shape and device are
 * read: kDLCPU (a memfd segment), kDLCUDAHost (the same, pinned with the CUDA
 * driver) or kDLCUDA (a CUDA VMM allocation exported as a POSIX fd, on
 * device_id). The result is writable, owned by the caller, and 64-byte
 * aligned; its deleter returns the memory, which later allocations reuse (one
 * empty segment per device, the largest, stays mapped for them; contents are
 * not cleared).
 *
 * Under a byte limit (dlxd --max-bytes, --max-bytes-per-uid), a kDLCPU or
 * kDLCUDAHost tensor of B bytes (its compact size; 0 counts as 1) fails with
 * -ENOSPC only if, for a limit that is set, B > limit - used + cached, where
 * used is what dlx_stats() reports just before the call (uid_bytes for
 * --max-bytes-per-uid, bytes for --max-bytes), cached is the size of the empty
 * segments this client keeps for reuse (it gives them back before failing),
 * and nothing else allocates meanwhile. Every segment counts whole, so used
 * holds more than the bytes of live tensors: the free space inside this
 * client's segments that hold a tensor (a segment shared by small tensors is at
 * most 1/16 of the smaller byte limit; a larger tensor gets a segment of its
 * own, at most 63 bytes over B), the segments of every other client of the uid
 * (each keeps up to one empty segment per device), and copies and versions
 * still published or leased. A kDLCUDA segment is rounded up to the device's
 * allocation granularity (often 2 MiB) and counts at that size.
 *
 * Returns 0 with *ret_tensor, or -EINVAL, -EOVERFLOW (the shape's size
 * overflows or passes 1 TiB), -ENOTSUP (device), -ENODEV (no CUDA driver),
 * -ENOMEM, -EAGAIN (the daemon's descriptor limit), or -ENOSPC (a byte limit,
 * as above; dlx_last_error() has the daemon's message naming it).
 */
int dlx_alloc(dlx_client *client, const DLTensor *prototype, DLManagedTensorVersioned **ret_tensor);

/* ---- acquiring ------------------------------------------------------------------------- */

struct dlx_acquire_options {
        /* Wait up to this long for the name (or min_version) to appear:
         * 0 (default) does not wait, < 0 waits without limit. */
        int64_t timeout_ms;
        /* Only a version >= this one will do; 0: any. */
        uint64_t min_version;
        /* Consumer work stream (CUstream) for CUDA tensors; NULL: dlx_set_stream()'s. */
        void *stream;
};

/*
 * Takes a lease on the current version of name and maps it. opts may be NULL.
 * The tensor is DLPack 1.3, owned by the caller (shape and strides included),
 * READ_ONLY unless published writable; its deleter releases the lease exactly
 * once (without a system call: the daemon takes the release with this client's
 * next request, or within about 20 ms). A segment is mapped once per process
 * and shared by every tensor in it, so acquiring again costs one round trip
 * and no mapping.
 * Returns 0 with *ret_tensor, or:
 *   -ENOENT     no such name (or not the wanted version) and no waiting asked
 *   -ETIMEDOUT  waited timeout_ms for it
 *   -EINVAL     bad name
 *   -EAGAIN     too many acquires of this client waiting at once
 *   -ENODEV     a CUDA tensor and no CUDA driver (or device), or on a GPU this
 *               process does not see (the message names its UUID)
 *   -ESRCH      a CUDA tensor whose producer has exited but is still listed, or
 *               whose IPC allocation it freed (retry)
 *   -EXDEV      a CUDA tensor that cannot cross PID namespaces (a container not
 *               sharing the producer's): a cuda-ipc one, or one ordered by a
 *               legacy IPC event; a persistent dlx_alloc() tensor can
 *
 * CUDA tensors: the stream (opts->stream, else dlx_set_stream()'s) waits on
 * the GPU for the producer's event; acquire itself does not wait. The
 * tensor's device_id is this process's ordinal of the producer's GPU.
 */
int dlx_acquire(dlx_client *client, const char *name, const struct dlx_acquire_options *opts,
                DLManagedTensorVersioned **ret_tensor);

/*
 * The name, version and sharing path of a tensor dlx_acquire() returned (or an
 * export of it through libdlx's exchange API): "memfd", "cuda-ipc", "cuda-vmm"
 * or "cuda-host". Any of the out-parameters may be NULL; the strings live as
 * long as the tensor. Needs no daemon: works after dlx_close() too, and in a
 * forked child. Returns 0, or -EINVAL for NULL or a tensor libdlx did not
 * acquire (dlx_alloc() results and published tensors included).
 */
int dlx_tensor_info(const DLManagedTensorVersioned *tensor, const char **ret_name,
                    uint64_t *ret_version, const char **ret_storage);

/*
 * Whether writing through a tensor dlx_acquire() returned (or an export of it)
 * faults in this process: 1 when its mapping refuses writes (a read-only
 * memfd, cuda-host or cuda-vmm tensor whose pages or device access are
 * read-only), 0 when it is read-only by DLPACK_FLAG_BITMASK_READ_ONLY alone
 * or writable: a cuda-ipc tensor (the driver maps IPC memory read-write), and
 * a read-only cuda-vmm tensor on a device that refuses read-only access to
 * VMM memory (libdlx then maps it read-write rather than fail). Returns 1, 0,
 * or -EINVAL as dlx_tensor_info().
 */
int dlx_tensor_write_protected(const DLManagedTensorVersioned *tensor);

/* ---- CUDA ordering ----------------------------------------------------------------------- */

/*
 * A tensor dlx_acquire() returned (or an export of it through libdlx's exchange
 * API) is also going to be used on stream (a CUstream; NULL and 0x1 are the
 * legacy default stream, 0x2 the per-thread one), as DLPack's
 * __dlpack__(stream=) asks: stream waits, on the GPU, for the producer's write,
 * and the tensor's release waits for the work queued on stream before it (the
 * release is recorded on acquire's stream, which then waits for stream). No host
 * wait. stream may be of any context and any device (the events are made in
 * each stream's own context). The stream must stay valid until the tensor is
 * released, and 0x2 then means the releasing thread's stream; one that can
 * no longer be joined on the GPU then is waited for on the host, as is
 * acquire's own stream when no release event can be recorded: a fence is
 * never dropped. acquire's own stream, or one given before, is a no-op; CPU
 * tensors need nothing. Returns 0, -EINVAL (not an acquired tensor, or not a
 * live CUDA stream), -ENOSPC (more than 64 streams besides acquire's),
 * -ENOMEM or a CUDA failure (-ENODEV, -EIO).
 */
int dlx_tensor_sync(DLManagedTensorVersioned *tensor, void *stream);

/*
 * Waits on the host, at most timeout_ms (< 0: no limit, 0: only looks), until
 * the producer's writes that a tensor dlx_acquire() returned (or an export of
 * it) was published after are done: what acquire made its stream wait for on
 * the GPU. The bounded way out for a consumer that must not queue work behind
 * a wait that may not end: a producer killed with work unfinished can leave
 * its event incomplete (what a driver then does with waits on it is its own;
 * the README's GPU section says what is known). Polls, from 50 us up to every
 * 10 ms. CPU tensors, and versions whose writes were done when they were
 * published (persistent ones), return 0 at once. Needs no daemon. Returns 0,
 * -ETIMEDOUT, -ESRCH (the producer's event is gone with its process: whether
 * its writes were done is unknown), -EINVAL (not an acquired tensor) or a
 * CUDA failure (-ENODEV, -EIO).
 */
int dlx_tensor_wait(const DLManagedTensorVersioned *tensor, int64_t timeout_ms);

/*
 * The CUDA stream (a CUstream, borrowed) this client orders on for device_id
 * when publish or acquire options name none; NULL (the default) is the legacy
 * default stream. libdlx's exchange API reports it as current_work_stream.
 * Returns 0, -EINVAL (device out of range) or -ENOTSUP (built without CUDA).
 */
int dlx_set_stream(dlx_client *client, int device_id, void *stream);
/* The stream set for device_id, or NULL. */
void *dlx_get_stream(dlx_client *client, int device_id);

/*
 * Double buffering without device syncs: waits until version of name
 * (published by this client) can have no readers, now or later: until it is
 * no longer current (a later publish replaced it, or it was unpublished) and
 * every lease of it has been released. A version still current never
 * qualifies, leased or not, as any consumer may acquire it next. Then makes
 * stream (NULL: the current stream of the tensor's device) wait, on the GPU,
 * for the work each reader recorded before releasing. CPU tensors need only
 * the host wait. timeout_ms as for acquire (0: do not wait, < 0: no limit).
 * Returns 0, -ETIMEDOUT, -ENOENT (not a version this client published zero-copy,
 * or one released too long ago to remember: 64 are kept; a copied publish has
 * no readers of the caller's memory to wait for) or -EINVAL.
 */
int dlx_wait_released(dlx_client *client, const char *name, uint64_t version, void *stream,
                      int64_t timeout_ms);

/* ---- groups ----------------------------------------------------------------------------- */

/*
 * A group is many named tensors under one name, published as one version and
 * acquired as one: a consumer sees every member of version N or none of it
 * (a model's state dict, a batch of named inputs). A group's name lives in
 * the same namespace as tensors' names and follows the same rules; its
 * members' names follow them too (state-dict keys such as
 * "layers.0.attn.weight" do) and are its own: they make no names of their
 * own in the namespace. Watches and tracks see one version per group
 * version; dlx_stat() and dlx_list() show a group with its member count.
 */
struct dlx_member {
        const char *name;                 /* within the group: 1-255 bytes, as a name */
        DLManagedTensorVersioned *tensor; /* taken by dlx_publish_group() */
};

/*
 * Publishes count members (1 to the daemon's max_group_members) as version
 * N of the group name, atomically: the new version replaces the old one
 * whole. opts as for dlx_publish() (NULL: defaults); a group is read-only
 * (opts->writable gives -ENOTSUP) and its members are kDLCPU tensors, or
 * kDLCUDA tensors all on one device (a device group, protocol 1.4).
 *
 * kDLCPU members' bytes are copied once, into one fresh sealed segment that
 * holds the whole version (dlx_group_alloc() memory is published without
 * a copy, by dlx_group_publish()); members that share storage (tied weights, views
 * of one buffer, whose bytes overlap or touch) share it in the copy too, at
 * the same distance apart. Each member keeps its dtype, shape, strides and
 * byte_offset. Takes ownership of every member's tensor on every path: each
 * deleter has run when this returns, once per tensor (one given under two
 * names, tied, is deleted once), and members[i].tensor is NULL.
 *
 * kDLCUDA members that all lie in one allocation (dlx_alloc() memory of this
 * client, or one allocation with a legacy IPC handle: cudaMalloc, a block
 * of PyTorch's caching allocator) are published where they are, ordered by
 * one event recorded on opts->stream (NULL: the client's current stream for
 * the device); their deleters then run when the version is released, as a
 * zero-copy dlx_publish()'s does. Other kDLCUDA members are copied once,
 * device to device on that stream, into one dlx_alloc() buffer (tied members
 * staying tied), and this waits on the host for the copy: their deleters
 * have run when it returns. Readers wait for the event on their own stream.
 *
 * Returns 0 with *ret_version (may be NULL), or:
 *   -EINVAL   bad group or member name, two members of one name, no members,
 *             a member as dlx_publish() refuses it (dtype, ndim, shape, NULL)
 *   -E2BIG    more members than max_group_members, or a table over
 *             max_group_table bytes (dlx_stats() gives both limits)
 *   -ENOTSUP  a member on neither kDLCPU nor kDLCUDA, members on more than one
 *             device, opts->writable, or a daemon older than protocol 1.3
 *             (so does every group call that reaches the daemon;
 *             dlx_group_alloc() needs none), or than 1.4 for kDLCUDA members
 *   -EXDEV    opts->copy is DLX_COPY_NEVER and the members must be copied
 *             (kDLCPU members always are)
 *   -ENODEV   kDLCUDA members and no CUDA driver (as for dlx_publish())
 *   -EACCES, -ENOSPC, -EAGAIN and -EOVERFLOW as for dlx_publish(); -ENOMEM
 * A group name that holds a tensor becomes a group, and the other way round.
 */
int dlx_publish_group(dlx_client *client, const char *name, struct dlx_member *members,
                      size_t count, const struct dlx_publish_options *opts, uint64_t *ret_version);

typedef struct dlx_group dlx_group;

/*
 * Takes one lease on the current version of the group name and maps it: one
 * round trip, one descriptor at most, whatever the member count. opts as for
 * dlx_acquire() (timeout_ms, min_version; NULL: do not wait, any version).
 * With member_names (count names), only those members are in the group, in
 * that order; NULL takes every member, in name order.
 *
 * A device group's members are kDLCUDA tensors on this process's ordinal of
 * the producer's GPU: its table and its memory come as two descriptors at
 * most (the table's alone for an IPC handle; neither while this client
 * holds them), the memory is opened once, and opts->stream (NULL: the
 * client's current stream for the device) waits once for the producer's
 * event before this returns. Releasing the group records one event on that
 * stream for the producer to wait on. Errors as for dlx_acquire() of a CUDA
 * tensor too (-ENODEV, -EXDEV), and -ENOTSUP from a daemon older than 1.4.
 *
 * Returns 0 with *ret_group, or:
 *   -ENOENT     no such group (or not the wanted version) and no waiting
 *               asked, or a listed member is not in the group (the message
 *               names it)
 *   -ENOTDIR    name holds a tensor, not a group (dlx_acquire() on a group
 *               gives -EISDIR)
 *   -EINVAL     a bad name, or a NULL among member_names
 *   -ETIMEDOUT, -EAGAIN as for dlx_acquire(); -ENOMEM
 * A name listed twice is in the group twice.
 */
int dlx_acquire_group(dlx_client *client, const char *name, const char *const *member_names,
                      size_t count, const struct dlx_acquire_options *opts, dlx_group **ret_group);

/* The version acquired, and the members in the group (all, or those listed). */
uint64_t dlx_group_version(const dlx_group *group);
size_t dlx_group_count(const dlx_group *group);
/*
 * Member i (below dlx_group_count()): its name, and its tensor, read-only,
 * borrowed: both live as long as the group. NULL when i is out of range.
 */
const char *dlx_group_name(const dlx_group *group, size_t i);
const DLTensor *dlx_group_tensor(const dlx_group *group, size_t i);
/* The index of the member called name, or -ENOENT. */
int64_t dlx_group_find(const dlx_group *group, const char *name);
/*
 * Member i as a DLPack tensor of its own, for a framework to take
 * (torch.from_dlpack): owned by the caller, READ_ONLY, and it keeps the
 * group's lease alive until its deleter runs, whenever that is: after
 * dlx_group_release(), or after dlx_close() too. dlx_tensor_info() gives its
 * member name, the group's version and "memfd" (a device group's: "cuda-vmm"
 * or "cuda-ipc"). A device group's member orders as an acquired CUDA tensor
 * does, through the group: dlx_tensor_sync() makes another stream wait for
 * the producer, and the group's release then waits for that stream too;
 * dlx_tensor_wait() waits on the host. Each call makes a new one.
 * Returns 0, -EINVAL (out of range, NULL) or -ENOMEM.
 */
int dlx_group_take(dlx_group *group, size_t i, DLManagedTensorVersioned **ret_tensor);
/*
 * Drops the caller's hold: the lease is released (without a system call, as
 * for a tensor) once the group and every tensor taken from it are gone.
 * Borrowed names and tensors die now, and so does the handle: no call on
 * another thread may be using it (dlx_group_publish(), dlx_group_take()),
 * as for any object a free ends. NULL-safe.
 */
void dlx_group_release(dlx_group *group);

/* A member of a group to fill in place: a compact row-major kDLCPU tensor. */
struct dlx_member_layout {
        const char *name; /* as for struct dlx_member */
        DLDataType dtype;
        int32_t ndim;
        const int64_t *shape;
};

/*
 * A group to fill in place and publish without a copy: one memfd laid out
 * as a published group is, each member compact and 64-byte aligned, zeroed.
 * dlx_group_tensor() gives the members (in name order) and their data is
 * writable until dlx_group_publish(); dlx_group_take() gives writable
 * tensors of their own until then too (not READ_ONLY: a flag a tensor
 * keeps, though a write through it faults once the group is published),
 * read-only ones after. A child forked after this call maps it too, and
 * writable: the group cannot be published while one lives. The daemon sees nothing of it before it
 * is published; its memory is this process's until dlx_group_release() and the last taken tensor.
 * Returns 0 with *ret_group, or -EINVAL (a bad name, dtype, shape, a name
 * twice, none), -E2BIG (members or table over the daemon's limits, as for
 * dlx_publish_group()), -EOVERFLOW (over 1 TiB, the table included: the
 * most a segment holds) or -ENOMEM.
 */
int dlx_group_alloc(dlx_client *client, const struct dlx_member_layout *layouts, size_t count,
                    dlx_group **ret_group);

/*
 * Publishes a group from dlx_group_alloc() as the next version of name,
 * without copying it: its pages become read-only at the same addresses, in
 * this process too (a write through any pointer into them faults from the
 * first publish on), and are sealed, so that readers see exactly what was
 * written: no thread may write to it while the first publish is in
 * progress (even one that fails with -EBUSY, whose pages are read-only for
 * a moment). It may be published again, under this name or another, as it is.
 * dlx_group_version() then gives the version of the publish that returned
 * last. opts as for dlx_publish_group() (NULL: defaults; persist is
 * honoured, DLX_COPY_ALWAYS is -EINVAL). Returns 0 with *ret_version (may
 * be NULL), or -EINVAL (NULL, a bad name, a group not from
 * dlx_group_alloc()), -ENOTSUP (writable), -EBUSY (a child forked since the
 * alloc still maps it writable: nothing is published, and the group stays
 * writable), and the daemon's errors as for dlx_publish_group().
 */
int dlx_group_publish(dlx_client *client, const char *name, dlx_group *group,
                      const struct dlx_publish_options *opts, uint64_t *ret_version);

/* ---- inspecting ------------------------------------------------------------------------ */

struct dlx_info {
        char name[DLX_NAME_MAX + 1];
        uint64_t version;
        DLDataType dtype;
        int32_t ndim;
        int64_t shape[DLX_MAX_NDIM];
        int64_t strides[DLX_MAX_NDIM];
        uint64_t byte_offset;
        DLDevice device;
        uint64_t flags;      /* DLPACK_FLAG_BITMASK_* */
        const char *storage; /* "memfd"; static string */
        uint64_t nbytes;     /* bytes the tensor's region spans */
        uint64_t segment;    /* daemon segment id */
        uint64_t segment_size;
        uint32_t owner_uid;
        int32_t producer_pid; /* 0 when the producer has gone (persistent tensors) */
        char producer_name[65];
        bool persist;
        uint32_t leases; /* on the current version */
        uint32_t live_versions;
        uint64_t published_ns; /* CLOCK_REALTIME */
        /*
         * A group's member count; 0 for a tensor. A group is described as
         * its data area: dtype uint8, ndim 1, nbytes the bytes its members'
         * data takes (storage they share counted once), with the padding
         * between pieces that lay apart: a copied piece keeps the alignment
         * its source had, up to 64 bytes.
         */
        uint32_t members;
        /*
         * A federation mirror's origin, as its bridge reports it: the
         * transport, the peer and the origin's version, e.g.
         * "ucx tcp/eth1 <- gpu3 v7". Empty for a name published on this host.
         */
        char origin[128];
};

/* Returns 0 with *ret_info, -ENOENT or -EINVAL. */
int dlx_stat(dlx_client *client, const char *name, struct dlx_info *ret_info);

/* Called once per entry, in name order; info is borrowed; return non-zero to stop. */
typedef int (*dlx_list_fn)(void *ctx, const struct dlx_info *info);

/*
 * Lists every name starting with prefix (NULL or "" for all), paging through the
 * daemon as needed. Returns the number of entries visited, or -errno (the
 * callback's non-zero return stops the walk and is not an error).
 */
int dlx_list(dlx_client *client, const char *prefix, dlx_list_fn fn, void *ctx);

/*
 * The daemon's limits, as dlxd was started with them (0: none; see dlxd
 * --help). A per-uid limit left "fair" (dlxd's default for clients, names and
 * descriptors) is given as the cap it works out to for the caller's uid when
 * asked: its fair share of what the other uids leave of the limit in all.
 */
struct dlx_limits {
        uint32_t max_clients, max_clients_per_uid; /* connected clients */
        uint64_t max_bytes, max_bytes_per_uid;     /* shared bytes the daemon holds */
        uint64_t max_names, max_names_per_uid;     /* published names (a uid's: it owns) */
        uint32_t max_leases;                       /* leases one client holds at once */
        uint32_t max_watches;                      /* watches of one client */
        /* output queued for a client before its requests wait and its watch events drop */
        uint64_t max_queued;
        /* for hello, a started frame, and a client reading nothing while output waits */
        uint32_t timeout_ms;
        uint64_t max_fds, max_fds_per_uid; /* descriptors held for segments */
        uint32_t max_group_members;        /* members of one group */
        uint64_t max_group_table;          /* bytes of one group's table (names and layouts) */
};

/*
 * The daemon's counters and limits, and what the calling client's uid uses of
 * the per-uid limits (names it owns, bytes and descriptors of the segments it
 * created or sent, clients connected). Returns 0, or a connection error.
 */
struct dlx_stats {
        uint64_t names, versions, leases, segments;
        uint64_t bytes, max_bytes; /* shared bytes held; 0: no limit */
        uint32_t clients, max_clients, watchers;
        uint64_t uptime_ms, requests, publishes, acquires;
        struct dlx_limits limits;
        /* the calling client's uid, and what that uid uses of the per-uid limits */
        uint32_t uid, uid_clients;
        uint64_t uid_bytes, uid_names;
        uint64_t fds, uid_fds;       /* descriptors held for segments: in all, and for uid */
        uint64_t queued, uid_queued; /* bytes of output waiting for clients: all, uid's */
};

/*
 * The daemon's counters and limits, and what the caller's uid uses of them: one
 * round trip. Returns 0 with *ret_stats, or -EINVAL (NULL argument) and the
 * errors common to every call.
 */
int dlx_stats(dlx_client *client, struct dlx_stats *ret_stats);

/*
 * The daemon's metrics in the Prometheus text exposition format (0.0.4), as
 * `dlxctl stats --prometheus` prints them and `dlxd --metrics-file` writes
 * them: request and error counts by type and status, publishes and acquires,
 * latency histograms of acquire and publish, the namespace's gauges, what is
 * held against each limit, and per-uid series. The caller's uid sees the
 * per-uid series of every uid if it is dlxd's own uid or root, else of its
 * own uid only. One round trip. Returns 0 with *ret_text (NUL-terminated;
 * release it with free()), or -EINVAL (NULL argument; *ret_text is left
 * alone only when ret_text is NULL, else set to NULL on every failure),
 * -ENOTSUP (a daemon older than protocol 1.6), and the errors common to
 * every call.
 */
int dlx_metrics(dlx_client *client, char **ret_text);

/* One round trip. Returns 0 or -errno. */
int dlx_ping(dlx_client *client);

/* ---- federation bridges ------------------------------------------------------------------- */

/*
 * For a federation bridge (dlxfed): this client serves the names under
 * prefix, "@<alias>/" (an alias of 1 to 32 printable bytes without '/'),
 * until it closes. Only the uid dlxd was started with --federation-uid may
 * mount. From then on:
 *   - only this client publishes under prefix (others get -EACCES);
 *   - an acquire anywhere on this host that waits (timeout_ms != 0) for a
 *     name under prefix, and finds no version it may take, queues a
 *     DLX_EVENT_WANTED for this client (dlx_next_event()), as do the
 *     acquires that were already waiting when the mount came;
 *   - the bridge answers each with a publish of the name (opts->origin_version
 *     and opts->origin) or with dlx_fetch_failed().
 * A bridge that reads its events late loses some, as a watcher does: past
 * dlxd --max-queued (or its uid's share) WANTED events are dropped, and a
 * DLX_EVENT_LOST comes when there is room again. Mounting a prefix this
 * client has mounted already then succeeds and announces every waiting
 * acquire whose WANTED was dropped. Returns 0, or:
 *   -EINVAL   NULL argument or a prefix not of that form
 *   -EACCES   this uid is not dlxd's --federation-uid (or none was given)
 *   -EBUSY    another client has mounted prefix
 *   -EAGAIN   this client has 1024 mounts already
 *   -ENOTSUP  the daemon speaks protocol 1.4 or older
 * and the errors common to every call. Names under a mounted prefix are
 * unpublished only by the mounting client (others get -EACCES, whatever
 * their uid).
 */
int dlx_mount(dlx_client *client, const char *prefix);

/*
 * For a federation bridge: fetching name (under a prefix this client mounted)
 * failed. Every acquire waiting for it at a min_version of at most
 * min_version fails with err and message (NULL: a generic one; printable,
 * at most 255 bytes; naming the peer is the bridge's part). err is one of
 * the errnos the protocol carries: -ENOENT, -EACCES, -ETIMEDOUT, -ENOSPC,
 * -EAGAIN, -EINVAL, -EPROTO, -EPROTONOSUPPORT, -EBADF, -EMSGSIZE, -EBUSY,
 * -EEXIST, -ENOMEM, -EIO, -ENOTSUP, -ESHUTDOWN, -ECONNRESET, -EISDIR,
 * -ENOTDIR or -EHOSTUNREACH (a lost or unreachable peer; a waiter of a
 * protocol 1.4 client sees -EIO). Acquires waiting for a higher version go
 * on waiting. Returns 0, or -EINVAL (NULL client or name, another err, a
 * bad message), -EACCES (the prefix is not this client's), -ENOTSUP
 * (protocol 1.4 or older), and the errors common to every call.
 */
int dlx_fetch_failed(dlx_client *client, const char *name, uint64_t min_version, int err,
                     const char *message);

/* ---- watching and event loops ------------------------------------------------------------ */

enum dlx_event_kind {
        DLX_EVENT_PUBLISHED = 1,   /* a name got its first version */
        DLX_EVENT_REPLACED = 2,    /* a name got a newer version */
        DLX_EVENT_UNPUBLISHED = 3, /* a name was removed (or its producer left) */
        /*
         * Events were dropped: this client left too many unread (dlxd --max-queued,
         * or 65536 in the library's queue). name is empty and watch 0; list the
         * watched prefixes again to catch up.
         */
        DLX_EVENT_LOST = 4,
        /*
         * Federation bridges only (dlx_mount()): an acquire waits for name at
         * version >= version (0: any) under a prefix this client mounted, and
         * nothing there satisfies it yet. watch is 0. Sent once per name and
         * version while acquires wait for it: until the name gets such a
         * version, dlx_fetch_failed() fails them (it, or a higher version),
         * or they time out or go; an acquire of it that comes after that is
         * announced again. A version lower than one asked for already is
         * asked for too: the peer may have it and not the higher one.
         * Dropped as watch events are when the bridge reads too late: after
         * a DLX_EVENT_LOST, dlx_mount() again to hear of the acquires still
         * waiting whose WANTED was dropped.
         */
        DLX_EVENT_WANTED = 5,
};

struct dlx_event {
        enum dlx_event_kind kind;
        uint64_t watch;
        uint64_t version;
        char name[DLX_NAME_MAX + 1];
};

/*
 * Starts receiving events for names starting with prefix ("" or NULL for all);
 * events follow the watch, not a snapshot: list the prefix after watching to
 * know what was there before. ret_watch may be NULL. Returns 0 with *ret_watch,
 * or:
 *   -EINVAL   NULL client, or a prefix no name could start with (longer than
 *             DLX_NAME_MAX bytes, or not printable UTF-8; dlx_last_error() says)
 *   -EAGAIN   this client has dlxd --max-watches watches already
 * and the errors common to every call.
 */
int dlx_watch(dlx_client *client, const char *prefix, uint64_t *ret_watch);
/* Stops a watch; events already received stay queued. Returns 0 or -ENOENT. */
int dlx_unwatch(dlx_client *client, uint64_t watch);

/*
 * Takes the next watch event, waiting up to timeout_ms (0: no wait, < 0: no limit).
 * Returns 0 with *ret_event, or -ETIMEDOUT (-EAGAIN when timeout_ms is 0).
 */
int dlx_next_event(dlx_client *client, struct dlx_event *ret_event, int64_t timeout_ms);

/*
 * For callers with their own event loop: a descriptor that polls readable
 * while the daemon has sent something unread or watch events wait in the
 * client's queue (any call may read them off the socket). When it polls
 * readable, call dlx_process_events(), then dlx_next_event(.., 0) until
 * -EAGAIN. Borrowed; valid until dlx_close().
 */
int dlx_fd(const dlx_client *client);

/*
 * Reads whatever the daemon has sent without blocking: runs the deleters of
 * tensors whose versions are gone, unmaps dead segments, queues watch events.
 * Returns the number of watch events queued, or -errno.
 */
int dlx_process_events(dlx_client *client);

/* ---- tracking: the current version without a round trip ------------------------------------ */

/*
 * Follows name's current version in this client's version page: memory the
 * daemon shares with this client alone, read-only here, and keeps current.
 * name need not be published yet. Tracking a name this client already tracks
 * returns the same track, and each dlx_track() needs its own dlx_untrack().
 * Like a file descriptor, a track number may be given again, to another name,
 * once its last dlx_untrack() is done.
 * Returns 0 with *ret_track (never 0), or:
 *   -EINVAL   NULL argument, or a bad name
 *   -EAGAIN   this client tracks dlxd --max-watches names already (65536 at most;
 *             tracks and watches are counted apart)
 *   -ENOTSUP  a daemon older than this library's protocol 1.2
 * and the errors common to every call.
 */
int dlx_track(dlx_client *client, const char *name, uint32_t *ret_track);

/*
 * The tracked name's current version, 0 when it has none (not published, or
 * unpublished since): a load from memory, no system call. The daemon changes
 * it before it answers the publish or unpublish that changed it, so once
 * dlx_publish() returns in any process, every tracker reads that version or a
 * newer one. Returns 0 with *ret_version, or:
 *   -EINVAL      NULL argument, or not a track of this client (untracked)
 *   -ECONNRESET  the session has ended (dlxd stopped, or ended it), or the
 *                client's connection has (lost, or given up on: a call timed
 *                out): *ret_version is the last version the page held, and
 *                will not change any more
 *   -ESTALE      the client was connected by the parent process
 */
int dlx_track_version(dlx_client *client, uint32_t track, uint64_t *ret_version);

/*
 * Waits until the tracked version is no longer version (a newer one, or 0
 * once unpublished), up to timeout_ms (0: no wait, < 0: no limit), asleep on
 * a futex in the version page: the daemon wakes it without sending a
 * message, and nothing runs meanwhile but a look, once a second, at whether
 * the connection to the daemon is still there. Any number of threads may wait
 * on one track. Returns 0 with *ret_version (ret_version may be NULL), or:
 *   -ETIMEDOUT   still version after timeout_ms (-EAGAIN when timeout_ms is 0)
 *   -ECONNRESET  as dlx_track_version(), *ret_version likewise; a daemon
 *                killed outright is noticed within about a second
 *   -EINVAL      NULL client, not a track of this client, or untracked while
 *                waited on (even if the number was given to another name since)
 *   -ESTALE      the client was connected by the parent process
 */
int dlx_track_wait(dlx_client *client, uint32_t track, uint64_t version, int64_t timeout_ms,
                   uint64_t *ret_version);

/* Ends one dlx_track() of a name. Returns 0, or -EINVAL (not a track of this client). */
int dlx_untrack(dlx_client *client, uint32_t track);

/* ---- errors ------------------------------------------------------------------------------ */

/* Text for a (negative or positive) errno value; static storage. */
const char *dlx_strerror(int err);

/*
 * Detail of the calling thread's last failed dlx call ("" if none): every
 * failure records its own, and a call that succeeds leaves it as it was, as
 * with errno. Thread-local storage.
 */
const char *dlx_last_error(void);

/* ---- the DLPack exchange API ---------------------------------------------------------------- */

/*
 * A reference-counted handle on a DLManagedTensorVersioned: the "object" of
 * libdlx's DLPackExchangeAPI table.
 */
typedef struct dlx_tensor dlx_tensor;

/*
 * Wraps tensor (ownership taken on every path). A tensor whose bytes lie in
 * memory libdlx mapped read-only in this process (an acquired read-only
 * tensor handed back by a consumer that dropped its flags) gets
 * DLPACK_FLAG_BITMASK_READ_ONLY set, so that no export of it is writable.
 * Returns 0 with *ret_handle, -EINVAL, -ENOMEM.
 */
int dlx_tensor_wrap(DLManagedTensorVersioned *tensor, dlx_tensor **ret_handle);
/* New reference. */
dlx_tensor *dlx_tensor_ref(dlx_tensor *handle);
/* Drops a reference; the last one runs the wrapped tensor's deleter. NULL-safe. */
void dlx_tensor_unref(dlx_tensor *handle);
/* The wrapped tensor's view; borrowed while the handle lives. */
const DLTensor *dlx_tensor_dltensor(const dlx_tensor *handle);

/*
 * libdlx's exchange-API table (DLPack >= 1.2), valid for the whole process:
 *  - managed_tensor_allocator: shared memory from dlx_alloc() on the client set
 *    with dlx_set_default_client() (else the oldest one open in this process)
 *  - managed_tensor_from_py_object_no_sync: a new owning DLManagedTensorVersioned
 *    that keeps the dlx_tensor handle alive until its deleter runs; same flags
 *  - managed_tensor_to_py_object_no_sync: wraps (steals) a tensor into a new handle,
 *    as dlx_tensor_wrap() does (READ_ONLY restored for read-only mappings)
 *  - dltensor_from_py_object_no_sync: a non-owning view of the handle's tensor
 *    (a DLTensor has no flags: a consumer of the view learns nothing of READ_ONLY)
 *  - current_work_stream: NULL for CPU; the current stream for CUDA devices
 */
const DLPackExchangeAPI *dlx_exchange_api(void);

/*
 * The client the exchange-API allocator uses (borrowed; it reverts when that
 * client closes). NULL restores the default: the oldest client still open.
 */
void dlx_set_default_client(dlx_client *client);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* DLX_DLX_H */
