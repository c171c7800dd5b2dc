/* SPDX-License-Identifier: MIT */
/*
 * dlxfed: the federation bridge of one host. An ordinary libdlx client of
 * the local dlxd, and a UCX worker on its own libuv loop:
 *
 *   federation.c  main: options and config file, the loop, signals, dlxd's events
 *   transport.c   UCX: context, worker on the loop, listener, endpoints, messages,
 *                 the handshake (allow-list, HMAC, versions)
 *   exporter.c    what peers may take from this host: lookups, leases, deadlines
 *   importer.c    what local consumers want from peers: pulls and mirrors
 *
 * Exporter and importer meet only through struct conn: a UCX endpoint, the
 * server's side (a peer pulls from us) or the client's (we pull from a peer).
 */
#ifndef DLX_FEDERATION_FED_H
#define DLX_FEDERATION_FED_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <dlx/dlx.h>
#include <ucp/api/ucp.h>
#include <uv.h>

#include "list.h"

#define FED_PROTO_MAJOR 1
#define FED_PROTO_MINOR 2 /* 1.1: Follow, Change; 1.2: groups (Describe.members) */
#define FED_ALIAS_MAX 32
#define FED_NONCE 32
#define FED_MAC 32
#define FED_MAX_PEERS 256
#define FED_MAX_EXPORTS 64
#define FED_MAX_ALLOW 64
/* Tensors up to this size travel inside their Describe: one message, no lease held. */
#define FED_INLINE_MAX (16u << 10)
/*
 * A Describe, a group's members included, is at most this long: control
 * messages go eagerly, and a peer holds each whole while it reads it.
 */
#define FED_DESCRIBE_MAX (16u << 20)
/* Any control message (a Change carries a Describe) is refused past this. */
#define FED_CONTROL_MAX (FED_DESCRIBE_MAX + 4096)
/* Lookups waiting on the thread pool for a version: in all, and from one peer. */
#define FED_MAX_WAITING 48
#define FED_MAX_WAITING_PEER 16
#define FED_THREADPOOL "64"
/* An endpoint has this long to complete its handshake; so many may be without one at once. */
#define FED_HANDSHAKE_MS 10000
#define FED_MAX_UNPROVEN 64
/* Prefixes one host follows (--follow), and one peer may follow here. */
#define FED_MAX_FOLLOWS 64
/* Pulls under way at once for what is followed; the rest wait their turn. */
#define FED_MAX_EAGER 16
/* Names of one listing a follower keeps, to drop what it no longer names. */
#define FED_MAX_LISTED (1u << 20)

/* Active-message ids: one per message of fed.proto. */
/* Change.kind beyond dlx_event_kind's */
enum fed_change { FED_CHANGE_BEGIN = 4, FED_CHANGE_SYNCED = 5, FED_CHANGE_REFUSED = 6 };

enum fed_am {
        FED_AM_HELLO = 1,
        FED_AM_HELLO_REPLY,
        FED_AM_AUTH,
        FED_AM_REFUSED,
        FED_AM_LOOKUP,
        FED_AM_DESCRIBE,
        FED_AM_RELEASE,
        FED_AM_DATA, /* not protobuf: an 8-byte header (the lookup's id), then the bytes */
        FED_AM_FOLLOW,
        FED_AM_CHANGE,
        FED_AM_COUNT
};

struct fed_addr {
        struct sockaddr_storage sa;
        socklen_t len;
};

/* An allow-list entry: an address and a prefix length. */
struct fed_net {
        int family;
        uint8_t addr[16];
        unsigned bits;
};

struct peer {
        char alias[FED_ALIAS_MAX + 1];
        char where[80]; /* host:port as given */
        struct fed_addr addr;
        struct conn *conn; /* ours to it (we pull), NULL until first wanted */
        uint64_t pulls, bytes_in, failures;
};

struct fed_config {
        const char *alias;  /* this host's, as its peers name it */
        const char *listen; /* ADDR:PORT, NULL: serve nothing */
        const char *socket; /* dlxd's, NULL: the default */
        const char *secret_file;
        const char *control; /* dlxctl peers asks here; NULL: next to dlxd's socket */
        struct peer peers[FED_MAX_PEERS];
        unsigned npeers;
        char *exports[FED_MAX_EXPORTS];
        unsigned nexports;
        char *follows[FED_MAX_FOLLOWS]; /* local prefixes, "@alias/..." */
        unsigned nfollows;
        struct fed_net allow[FED_MAX_ALLOW];
        unsigned nallow;
        bool allow_ucx_mismatch;
        bool require_rdma; /* --require-rdma: no peer over emulated RMA */
        uint32_t wait_ms;  /* an importer's lookup waits this long at the origin */
        uint32_t lease_ms; /* a remote lease lasts at most this long */
        uint32_t pull_ms;  /* a pull of nothing is given up after this long */
        int ready_fd;
};

struct fed {
        struct fed_config cfg;
        uv_loop_t *loop;
        dlx_client *dlx;
        uv_poll_t dlx_poll;
        /* UCX */
        ucp_context_h ctx;
        ucp_worker_h worker;
        ucp_listener_h listener;
        struct fed_addr listen_addr;
        uv_timer_t listen_timer; /* tries again while the address is in use */
        unsigned listen_tries;
        bool listen_failed;
        uv_poll_t ucx_poll;
        uv_prepare_t ucx_prepare;
        uv_timer_t sweep; /* endpoints past their handshake's deadline go */
        int efd;
        /*
         * What this bridge says it speaks (Hello, HelloReply, the MAC): its
         * own protocol and UCX versions. The tests make a bridge claim others
         * (DLXFED_TEST_CLAIM, fed_ucx_start()) to see a mismatch refused.
         */
        unsigned ucx_major, ucx_minor, ucx_release;
        uint32_t proto_major, proto_minor;
        uint8_t secret[256];
        size_t secret_len;
        struct list conns;   /* struct conn */
        struct list closing; /* struct conn, being closed */
        struct list wants;   /* struct want (importer.c) */
        unsigned nwants;
        uint64_t next_id;
        /* follow.c: ours of peers' prefixes, and eager pulls waiting their turn */
        struct list follows; /* struct ifollow */
        struct list eager;   /* struct eager */
        uv_timer_t eager_timer;
        /* follow.c: peers' of ours */
        struct list rfollows; /* struct rfollow */
        /* control.c */
        uv_pipe_t control;
        bool control_on;
        char control_path[108];
        dev_t control_dev; /* the socket bound there, to unlink only our own */
        ino_t control_ino;
        uint64_t started_ms;
        bool stopping;
        bool dlxd_lost; /* the local dlxd went away: dlxfed exits 1 */
        /* exporter.c */
        struct list leases; /* struct rlease */
        uint64_t next_lease;
        struct list waitings; /* struct waiting: lookups on the thread pool */
        unsigned waiting;     /* how many */
        uint64_t bytes_out, exports_served;
};

struct conn {
        struct list link; /* in fed.conns or fed.closing */
        struct fed *fed;
        ucp_ep_h ep;
        bool client; /* we connected: we pull from it */
        bool authed;
        bool closing;
        bool closed; /* UCX is done with it: freed from the loop (conns_reap()) */
        bool freed_leases;
        struct peer *peer; /* client side: whom we connected to */
        char who[160];     /* for logs: alias and address */
        char addr[80];     /* the peer's address, numeric */
        char transport[64];
        uint8_t nonce_mine[FED_NONCE], nonce_theirs[FED_NONCE];
        char their_alias[FED_ALIAS_MAX + 1];
        unsigned their_ucx[3];
        uint32_t their_proto[2]; /* the peer's protocol major and minor, from its hello */
        unsigned waiting;        /* its lookups waiting on the thread pool (exporter.c) */
        uint64_t born_ms;        /* when it came, for the handshake's deadline */
        bool hello_seen;
        uint64_t served, bytes_out; /* server side: versions sent to the peer, their bytes */
        void *close_req;
        ucs_status_t error; /* UCS_OK until the endpoint failed */
};

/* The minor of protocol 1 both ends of c speak (a bridge may claim an older one: tests). */
uint32_t fed_minor(const struct conn *c);

/* ---- federation.c ---- */
void fed_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define FED_ERR 3
#define FED_WARN 4
#define FED_NOTICE 5
#define FED_INFO 6
#define FED_DEBUG 7
extern int fed_log_level;

/* The peer whose mount name ("@alias/...") is under; NULL: none. */
struct peer *fed_peer_of(struct fed_config *cfg, const char *name);
/* HOST:PORT or [HOST6]:PORT, numeric: 0 or -EINVAL. */
int fed_parse_addr(const char *s, struct fed_addr *ret);

/* ---- transport.c ---- */
int fed_ucx_start(struct fed *f);
void fed_ucx_stop(struct fed *f);
/* Our endpoint to p, made (and its handshake begun) on first use; NULL when it cannot be. */
struct conn *fed_connect(struct fed *f, struct peer *p, char *why, size_t whysz);
/* Sends message id (a packed fed.proto message, copied) on c; -errno closes nothing. */
int fed_send(struct conn *c, enum fed_am id, const void *buf, size_t len);
/* Ends c now (force): its requests fail, its leases go once UCX is done with it. */
void fed_close(struct conn *c, const char *why);

/* ---- exporter.c ---- */
/* Whether peers may have name: under an exported prefix, and not a mirror. */
bool fed_exported(const struct fed *f, const char *name);
void fed_export_lookup(struct conn *c, const void *buf, size_t len);
void fed_export_release(struct conn *c, const void *buf, size_t len);
/* c is gone and UCX reads no more through it: its leases go. */
void fed_export_conn_gone(struct conn *c);
/*
 * For a follower (c) told of name's version: that version, when small
 * (FED_INLINE_MAX), as a packed inline Describe (malloc()ed, *ret_len
 * bytes); NULL: not offered, the follower asks. *ret_stale: name has a
 * newer version already, whose own news follows (this news need not go).
 */
uint8_t *fed_export_offer(struct conn *c, const char *name, uint64_t version, size_t *ret_len,
                          bool *ret_stale);
void fed_export_stop(struct fed *f);

/* ---- importer.c ---- */
void fed_import_wanted(struct fed *f, const char *name, uint64_t min_version);
void fed_import_authed(struct conn *c);
/*
 * A follower's offer of name (a packed inline Describe, from a Change) taken
 * as if asked for and answered. False: not one to take (ask instead).
 */
bool fed_import_offered(struct conn *c, const char *name, const void *buf, size_t len);
void fed_import_describe(struct conn *c, const void *buf, size_t len);
/* A DATA message: its header, and data as the AM handler has it. Returns the handler's status. */
ucs_status_t fed_import_data(struct conn *c, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param);
/* c failed or closed: its pulls fail, its peer's mirrors go. */
void fed_import_conn_lost(struct conn *c, const char *why);
void fed_import_stop(struct fed *f);
/* A follow heard name is unpublished at its origin: pulls under way serve, then go. */
void fed_import_origin_gone(struct fed *f, const char *name);
/*
 * News of name's version after it was unpublished at the origin: a want
 * asked before, still unanswered, is taken as asking for that life (its
 * answer checked against version). True: one was; nothing more to ask.
 */
bool fed_import_revive(struct fed *f, const char *name, uint64_t version);

/* ---- control.c: what dlxctl peers reads ---- */
/* Listens at cfg.control (or next to dlxd's socket): 0, or -errno, said on stderr. */
int fed_control_start(struct fed *f);
void fed_control_stop(struct fed *f);
/* Prefixes followed on p's endpoint, for the report (follow.c). */
unsigned fed_follow_count(const struct fed *f, const struct peer *p);
unsigned fed_rfollow_count(const struct fed *f, const struct conn *c);

/* ---- follow.c ---- */
/* Server side: a peer's Follow; an event of a watch of ours (LOST: every listing again). */
void fed_export_follow(struct conn *c, const void *buf, size_t len);
void fed_export_event(struct fed *f, const struct dlx_event *ev);
/* c is gone: its follows' watches go. */
void fed_export_follows_gone(struct conn *c);
/* Client side: what --follow named is asked for, again after its endpoint is lost. */
void fed_follow_start(struct fed *f);
void fed_follow_authed(struct conn *c);
void fed_follow_change(struct conn *c, const void *buf, size_t len);
void fed_follow_conn_lost(struct conn *c);
/* A want ended: eager pulls waiting their turn may go. */
void fed_follow_kick(struct fed *f);
void fed_follow_stop(struct fed *f);

#endif /* DLX_FEDERATION_FED_H */
