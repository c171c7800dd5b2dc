/* SPDX-License-Identifier: MIT */
/*
 * The codec: plain C messages <-> protobuf payloads, with every limit checked
 * at decode. The generated protobuf-c names stay inside wire.c; both the
 * daemon and libdlx speak only these structs.
 */
#ifndef DLX_PROTO_WIRE_H
#define DLX_PROTO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <dlx/dlpack.h>

#include "storage.h"
#include "wire_limits.h"

/*
 * Copies src into dst (cap > 0 bytes), truncated and terminated: what
 * snprintf(dst, cap, "%s", src) does, at a tenth of the cost on the hot path.
 */
static inline void wire_strcpy(char *dst, size_t cap, const char *src)
{
        size_t n = strnlen(src, cap - 1);

        memcpy(dst, src, n);
        dst[n] = '\0';
}

/* Mirrors dlxp.Status; wire_status_errno() is the one errno table. */
enum wire_status {
        WIRE_OK = 0,
        WIRE_INVALID = 1,
        WIRE_NOT_FOUND = 2,
        WIRE_PERMISSION = 3,
        WIRE_TIMEOUT = 4,
        WIRE_NO_SPACE = 5,
        WIRE_LIMIT = 6,
        WIRE_PROTOCOL = 7,
        WIRE_VERSION = 8,
        WIRE_BAD_FD = 9,
        WIRE_TOO_BIG = 10,
        WIRE_BUSY = 11,
        WIRE_EXISTS = 12,
        WIRE_NO_MEMORY = 13,
        WIRE_INTERNAL = 14,
        WIRE_NOT_SUPPORTED = 15,
        WIRE_SHUTDOWN = 16,
        WIRE_CLOSED = 17,
        WIRE_IS_GROUP = 18,
        WIRE_NOT_GROUP = 19,
        WIRE_UNREACHABLE = 20, /* 1.5 */
        WIRE_STATUS_COUNT
};

/* Positive errno for a status (WIRE_OK -> 0; unknown values -> EPROTO). */
int wire_status_errno(int status);
/* Status for a positive or negative errno (unlisted ones -> WIRE_INTERNAL). */
enum wire_status wire_errno_status(int err);
/* Whether -err (err negative) reaches a peer as itself: a status of its own carries it. */
bool wire_errno_carried(int err);

struct wire_tensor {
        char name[DLX_NAME_MAX + 1];
        uint64_t version;
        DLDataType dtype;
        int32_t ndim;
        int64_t shape[DLX_MAX_NDIM];
        int64_t strides[DLX_MAX_NDIM];
        uint64_t byte_offset;
        int32_t device_type;
        int32_t device_id;
        uint64_t flags;
        uint32_t storage;
        uint64_t segment;
        uint64_t offset;
        uint64_t length;
        bool has_ipc_handle;
        bool has_event;
        bool has_device_uuid;
        uint8_t ipc_handle[DLX_CUDA_HANDLE];
        uint8_t event[DLX_CUDA_HANDLE];
        uint8_t device_uuid[DLX_CUDA_UUID];
        uint64_t pid_namespace;
        uint64_t event_session;
        uint32_t members;       /* a group's (1.3); 0: a tensor */
        uint64_t table_segment; /* a device group's table (1.4); 0: none */
};

struct wire_info {
        struct wire_tensor tensor;
        uint32_t owner_uid;
        int32_t producer_pid;
        bool persist;
        uint32_t leases;
        uint64_t segment_size;
        uint64_t published_ns;
        uint32_t live_versions;
        char producer_name[DLX_CLIENT_NAME_MAX + 1];
        char origin[DLX_ORIGIN_MAX + 1]; /* a mirror's (1.5); "" for a local name */
};

enum wire_request_type {
        WIRE_REQ_NONE = 0,
        WIRE_REQ_HELLO,
        WIRE_REQ_PUBLISH,
        WIRE_REQ_ACQUIRE,
        WIRE_REQ_RELEASE,
        WIRE_REQ_UNPUBLISH,
        WIRE_REQ_LIST,
        WIRE_REQ_STAT,
        WIRE_REQ_WATCH,
        WIRE_REQ_UNWATCH,
        WIRE_REQ_ALLOC,
        WIRE_REQ_FREE,
        WIRE_REQ_FORGET,
        WIRE_REQ_STATS,
        WIRE_REQ_PING,
        WIRE_REQ_BYE,
        WIRE_REQ_TRACK,
        WIRE_REQ_UNTRACK,
        WIRE_REQ_MOUNT,        /* 1.5 */
        WIRE_REQ_FETCH_FAILED, /* 1.5 */
        WIRE_REQ_METRICS,      /* 1.6 */
        WIRE_REQ_COUNT
};

/* Name of a request type for logs ("publish"). */
const char *wire_request_name(enum wire_request_type type);

struct wire_request {
        uint64_t id;
        enum wire_request_type type;
        union {
                struct {
                        uint32_t major;
                        uint32_t minor;
                        char client_name[DLX_CLIENT_NAME_MAX + 1];
                        int32_t pid;
                } hello;
                struct {
                        struct wire_tensor tensor;
                        bool persist;
                        uint64_t token;
                        bool hold;
                        uint64_t segment_size;
                        uint64_t origin_version;         /* 1.5: a mirror's; 0: none */
                        char origin[DLX_ORIGIN_MAX + 1]; /* 1.5: a mirror's; "" none */
                } publish;
                struct {
                        char name[DLX_NAME_MAX + 1];
                        uint64_t min_version;
                        int64_t timeout_ms;
                        bool group; /* 1.3 */
                } acquire;
                struct {
                        uint64_t lease;
                        bool has_event;
                        uint8_t event[DLX_CUDA_HANDLE];
                } release;
                struct {
                        char name[DLX_NAME_MAX + 1];
                } unpublish, stat, track;
                struct {
                        uint32_t slot;
                } untrack;
                struct {
                        char prefix[DLX_NAME_MAX + 1];
                        char after[DLX_NAME_MAX + 1];
                        uint32_t limit;
                } list;
                struct {
                        char prefix[DLX_NAME_MAX + 1];
                } watch;
                struct {
                        uint64_t watch;
                } unwatch;
                struct {
                        uint64_t size;
                        uint32_t storage; /* 0 or MEMFD: the daemon creates it; CUDA_VMM: fd */
                } alloc;
                struct {
                        uint64_t segment;
                } free;
                struct {
                        uint64_t segments[DLX_FORGET_MAX];
                        uint32_t count; /* 1 to DLX_FORGET_MAX */
                } forget;
                struct {
                        uint64_t nonce;
                } ping;
                struct {
                        char prefix[DLX_NAME_MAX + 1]; /* "@<alias>/" (wire_mount_check) */
                } mount;
                struct {
                        char name[DLX_NAME_MAX + 1];
                        uint64_t min_version;
                        int status; /* enum wire_status, never WIRE_OK */
                        char error[DLX_ERROR_MAX + 1];
                } fetch_failed;
        };
};

enum wire_reply_type {
        WIRE_REP_NONE = 0, /* status only */
        WIRE_REP_HELLO,
        WIRE_REP_PUBLISH,
        WIRE_REP_ACQUIRE,
        WIRE_REP_LIST,
        WIRE_REP_STAT,
        WIRE_REP_WATCH,
        WIRE_REP_ALLOC,
        WIRE_REP_STATS,
        WIRE_REP_PONG,
        WIRE_REP_EVENT,
        WIRE_REP_TRACK,
        WIRE_REP_SEGMENT, /* (1.4) a segment the next reply names, its fd attached */
        WIRE_REP_METRICS, /* (1.6) */
};

enum wire_event_kind {
        WIRE_EVENT_NONE = 0,
        WIRE_EVENT_PUBLISHED = 1,
        WIRE_EVENT_REPLACED = 2,
        WIRE_EVENT_UNPUBLISHED = 3,
        WIRE_EVENT_RELEASED = 4,
        WIRE_EVENT_SEGMENT_GONE = 5,
        WIRE_EVENT_LOST = 6,
        WIRE_EVENT_WANTED = 7, /* 1.5: to a mount session; version is the wait's min_version */
};

/* The daemon's limits (0: none); dlxd's configuration and what stats reports. */
struct wire_limit_set {
        uint32_t max_clients;         /* connections, all uids */
        uint32_t max_clients_per_uid; /* connections of one uid */
        uint64_t max_bytes;           /* shared bytes held: memfds dlxd keeps */
        uint64_t max_bytes_per_uid;   /* ... charged to one uid */
        uint64_t max_names;           /* names with a current version */
        uint64_t max_names_per_uid;   /* ... owned by one uid */
        uint32_t max_leases;          /* leases one connection holds at once */
        uint32_t max_watches;         /* watches of one connection */
        uint64_t max_queued;          /* reply bytes a connection leaves unread */
        uint32_t timeout_ms;          /* for hello, a started frame, and a peer not reading */
        uint64_t max_fds;             /* descriptors held for segments, in all */
        uint64_t max_fds_per_uid;     /* ... charged to one uid */
        uint32_t max_group_members;   /* members of one group (1.3) */
        uint64_t max_group_table;     /* bytes of one group's table (1.3) */
};

struct wire_stats {
        uint64_t names, versions, leases, segments, bytes, max_bytes;
        uint32_t clients, max_clients, watchers;
        uint64_t uptime_ms, requests, publishes, acquires;
        struct wire_limit_set limits;
        uint32_t uid, uid_clients; /* the asking client's uid, and its usage */
        uint64_t uid_bytes, uid_names;
        uint64_t fds, uid_fds;       /* descriptors held for segments: in all, and for uid */
        uint64_t queued, uid_queued; /* output waiting for clients to read: all, uid's */
};

struct wire_reply {
        uint64_t id;
        int status; /* enum wire_status; kept int so unknown peer values survive decode */
        char error[DLX_ERROR_MAX + 1];
        enum wire_reply_type type;
        union {
                struct {
                        uint32_t major;
                        uint32_t minor;
                        uint64_t session;
                        char server[64];
                        uint32_t uid;
                        uint32_t max_frame;
                        uint32_t max_inflight;
                        bool release_ring;
                        struct wire_limit_set limits; /* all zero from a 1.0 daemon */
                } hello;
                struct {
                        uint64_t version;
                        uint64_t segment;
                } publish;
                struct {
                        struct wire_tensor tensor;
                        uint64_t lease;
                        uint64_t segment_size;
                        bool writable;
                } acquire;
                struct {
                        struct wire_info *entries; /* see wire_reply_done() */
                        uint32_t count;
                        char next[DLX_NAME_MAX + 1];
                } list;
                struct {
                        struct wire_info info;
                } stat;
                struct {
                        uint64_t watch;
                } watch;
                struct {
                        uint32_t slot;
                        uint64_t version;
                        uint32_t slots;
                        bool page; /* the version page's fd is attached */
                } track;
                struct {
                        uint64_t segment;
                        uint64_t size;
                } alloc, segment;
                struct wire_stats stats;
                struct {
                        uint64_t nonce;
                } pong;
                struct {
                        enum wire_event_kind kind;
                        uint64_t watch;
                        char name[DLX_NAME_MAX + 1];
                        uint64_t version;
                        uint64_t token;
                        uint64_t segment;
                        /* RELEASED: consumers' release events; see wire_reply_done() */
                        uint8_t (*events)[DLX_CUDA_HANDLE];
                        uint32_t nevents;
                } event;
                struct {
                        /* Prometheus text, NUL-terminated; allocated when decoded (wire_reply_done)
                         */
                        char *text;
                        uint32_t len;
                } metrics;
        };
};

/*
 * Encoding: the packed payload size, then the payload into buf (of at least
 * that size). Returns the size, or -EINVAL for a message that breaks a limit
 * (too many dims, an unterminated string) and so could never decode.
 */
int wire_request_size(const struct wire_request *req, size_t *ret_size);
size_t wire_request_pack(const struct wire_request *req, uint8_t *buf);
int wire_reply_size(const struct wire_reply *rep, size_t *ret_size);
size_t wire_reply_pack(const struct wire_reply *rep, uint8_t *buf);
/*
 * Both in one pass: *ret_size is the payload size, packed into buf when it fits
 * in cap. Returns 0, -ENOBUFS (too big for cap: nothing written) or -EINVAL.
 */
int wire_reply_encode(const struct wire_reply *rep, uint8_t *buf, size_t cap, size_t *ret_size);

/*
 * Decoding with validation: names, prefixes, dims, dtypes, string lengths.
 * Returns 0, -EPROTO (not a valid message: garbage, unknown body), -EINVAL
 * (valid protobuf breaking a limit; *ret has the id when it could be read so
 * a reply can be addressed) or -ENOMEM. A short reason is written to why.
 */
int wire_request_decode(const uint8_t *buf, size_t len, struct wire_request *ret, char *why,
                        size_t whysz);
/* Same for replies; a list reply's entries are allocated: free with wire_reply_done(). */
int wire_reply_decode(const uint8_t *buf, size_t len, struct wire_reply *ret, char *why,
                      size_t whysz);
void wire_reply_done(struct wire_reply *rep);

/*
 * Checks a tensor descriptor's own fields: name, ndim, dims, dtype. The
 * device and storage kind are the daemon's to judge, and so is the extent
 * against a segment (layout_extent()).
 */
int wire_tensor_check(const struct wire_tensor *t, const char **ret_why);

/*
 * A mount prefix (1.5): "@", an alias of 1 to DLX_ALIAS_MAX bytes of
 * printable UTF-8 without '/', then "/".
 * Returns 0 or -EINVAL with a reason.
 */
int wire_mount_check(const char *prefix, const char **ret_why);
/* Text carried for people (an origin, a fetch's error): printable UTF-8, no controls. */
bool wire_text_valid(const char *s);

#endif /* DLX_PROTO_WIRE_H */
