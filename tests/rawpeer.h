/* SPDX-License-Identifier: MIT */
/*
 * A raw protocol peer for the integration suites: frames built with the
 * codec and written by hand, replies read back with whatever descriptors
 * ride on them, so a test can behave exactly as badly (or as well) as it
 * means to: pipeline, stop reading, half-close, hold fds unread.
 *
 * Functions named rp_expect_* and rp_send fail the running test on error;
 * the others return what happened.
 */
#ifndef DLX_TESTS_RAWPEER_H
#define DLX_TESTS_RAWPEER_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "wire.h"

/*
 * Sends bytes, fds (borrowed) on the first byte; on a non-blocking socket,
 * waits up to a second at a time for room. Returns 0 or -errno (EPIPE: hung
 * up on; EAGAIN: no room came).
 */
int rp_send_raw(int sock, const void *buf, size_t len, const int *fds, unsigned nfds);

/*
 * Appends req as one frame announcing nfds descriptors to buf (cap bytes).
 * Returns the bytes written; fails the test when it does not fit.
 */
size_t rp_frame(const struct wire_request *req, unsigned nfds, uint8_t *buf, size_t cap);

/* Sends req as one frame, attach_fd (borrowed, -1 for none) on it. */
void rp_send(int sock, const struct wire_request *req, int attach_fd);

/*
 * Reads one reply within timeout_ms and decodes it (list entries freed).
 * Returns 1 with *rep filled, 0 at a clean EOF, -ETIMEDOUT, -ECONNRESET, or
 * -EPROTO for a truncated frame. The fd that came with it goes to *ret_fd
 * when given (else -1 there); otherwise it is closed.
 */
int rp_read(int sock, struct wire_reply *rep, int timeout_ms, int *ret_fd);
/* The same, keeping what the reply allocated (list entries, release events) for
 * wire_reply_done(). */
int rp_read_keep(int sock, struct wire_reply *rep, int timeout_ms, int *ret_fd);

/* The next reply: id, status OK and type as given; its fd to *ret_fd when given. */
void rp_expect_ok(int sock, uint64_t id, enum wire_reply_type type, struct wire_reply *ret,
                  int *ret_fd);

/* The next reply: a failure of this id with this status, no body, and a message. */
void rp_expect_error(int sock, uint64_t id, enum wire_status status, struct wire_reply *ret);

/* The next reply that is not an event (events are skipped, their fds closed); as rp_read(). */
int rp_read_answer(int sock, struct wire_reply *rep, int timeout_ms, int *ret_fd);

/* Appends req as one frame without fds to *buf (len used, cap allocated), grown as needed. */
void rp_frame_append(uint8_t **buf, size_t *len, size_t *cap, const struct wire_request *req);

/*
 * Sends all of buf without fds, giving up when the socket takes nothing for
 * stall_ms (the daemon stopped reading). Returns 0, -ETIMEDOUT or -errno.
 */
int rp_send_until_stalled(int sock, const uint8_t *buf, size_t len, int stall_ms);

/* Request builders: req zeroed, then id, type and the given fields set. */
void rp_acquire_req(struct wire_request *req, uint64_t id, const char *name);
/* A publish of a 1-D float32 tensor over [0, bytes) of a memfd segment. */
void rp_publish_req(struct wire_request *req, uint64_t id, const char *name, uint64_t bytes,
                    uint64_t segment, uint64_t flags);

/* A ping answered by the pong of its nonce (an event first fails the test). */
void rp_ping(int sock, uint64_t id);

/*
 * An alloc of size bytes, granted as asked: returns the segment id; its fd to
 * *ret_fd, or closed when NULL.
 */
uint64_t rp_alloc(int sock, uint64_t id, uint64_t size, int *ret_fd);

/*
 * A connected, greeted peer of the fixture's daemon (hello id 1). The release
 * ring's fd, if one came, is closed: a raw peer releases with frames.
 */
int rp_connect(const char *socket, const char *name);
/* The same, saying it speaks protocol 1.minor. */
int rp_connect_minor(const char *socket, const char *name, uint32_t minor);

#endif /* DLX_TESTS_RAWPEER_H */
