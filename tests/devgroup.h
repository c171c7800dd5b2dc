/* SPDX-License-Identifier: MIT */
/*
 * Raw peers of device groups (protocol 1.4), for the suites that attack
 * dlxd's side of them (test-device-group, test-device-group-attacks): dlxd
 * started with --cuda-device-number of /dev/ptmx, whose masters stand in for
 * the driver's VMM exports (a pty number tells one open from another);
 * publishes with a table attached; acquires that read the SEGMENT reply
 * before the ACQUIRE reply; and what a refused publish must leave as it was.
 */
#ifndef DLX_TESTS_DEVGROUP_H
#define DLX_TESTS_DEVGROUP_H

#include <stdbool.h>
#include <stdint.h>

#include <dlx/dlx.h>

#include "tables.h"
#include "wire.h"

#define MEM_BYTES (1u << 20) /* the device memory a group's members are in */

/* Two members: "a", 16 float32 at 0, and "b", 4 float32 in the last 16 bytes of the memory. */
extern const struct gspec two[2];

/* Starts the fixture's dlxd taking /dev/ptmx masters as VMM exports, with more (may be NULL). */
void devgroup_dlxd_start(const char *const *more);

/* A pty master standing in for a VMM export; its pty number to *ret_pty (may be NULL). */
int vmm_export(unsigned *ret_pty);
/* A fresh export of size bytes held by sock's session (alloc id): its segment id. */
uint64_t vmm_segment(int sock, uint64_t id, uint64_t size, unsigned *ret_pty);

/* Sends req with fd (-1: none) and reads its answer, events skipped; returns its status. */
int call(int sock, const struct wire_request *req, int fd, struct wire_reply *rep, int *ret_fd);

/* Publishes g as a device group over segment (0: IPC), table fd tfd (-1: a fresh sealed one). */
int publish_fd(int sock, uint64_t id, const char *name, const struct gseg *g, uint64_t segment,
               int tfd, struct wire_reply *rep);
int publish(int sock, uint64_t id, const char *name, const struct gseg *g, uint64_t segment,
            struct wire_reply *rep);
/* The group of two over segment as name, built into *g, published (request id 3). */
void publish_two(int prod, const char *name, uint64_t segment, struct gseg *g);

/* What an acquire of a device group brought. */
struct got {
        bool segment;   /* a SEGMENT reply came first */
        uint64_t table; /* its segment id */
        uint64_t table_size;
        int table_fd;
        struct wire_reply acq;
        int fd; /* the ACQUIRE reply's */
};

void acquire_send(int sock, uint64_t id, const char *name, bool group, uint64_t min_version,
                  int64_t timeout_ms);
/* Reads the answer to acquire id: the SEGMENT reply if one comes, then the ACQUIRE reply. */
int acquire_read(int sock, uint64_t id, struct got *g, int timeout_ms);
/* A group acquire that does not wait, answered. */
int acquire(int sock, uint64_t id, const char *name, struct got *g);
void got_close(struct got *g);
/* Releases lease and waits for dlxd to have done so (a ping). */
void release(int sock, uint64_t lease);

/* The daemon's counters a refused publish must leave as they were. */
struct held {
        uint64_t segments, bytes, fds, names, versions, leases;
};

struct held held_now(dlx_client *c);
/* Within 3 s: a big segment's fd may be closed off the loop, a little later. */
void expect_held(dlx_client *c, const struct held *before, const char *what);

#endif /* DLX_TESTS_DEVGROUP_H */
