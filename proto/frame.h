/* SPDX-License-Identifier: MIT */
/*
 * Sans-I/O framing: bytes and file descriptors in, whole frames out.
 *
 * A frame is an 8-byte header followed by a protobuf payload:
 *
 *   u32 payload length (little endian) | u16 fd count | u16 reserved (0)
 *
 * The fds a frame names are attached (SCM_RIGHTS) to the sendmsg() carrying
 * its first byte, so by the time a frame's last byte has arrived its fds have
 * too. The reader queues received fds and hands each frame exactly the number
 * its header announces. Nothing here reads or writes a socket.
 */
#ifndef DLX_PROTO_FRAME_H
#define DLX_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "wire_limits.h"

#define FRAME_HEADER_SIZE 8

/* Writes a header for a payload of len bytes carrying nfds descriptors. */
void frame_header_put(uint8_t hdr[FRAME_HEADER_SIZE], uint32_t len, unsigned nfds);

/*
 * Reads and checks a header.
 * Returns 0, -EMSGSIZE (length over DLX_MAX_FRAME), -E2BIG (more than
 * DLX_MAX_FDS_PER_FRAME fds) or -EPROTO (reserved bits set).
 */
int frame_header_get(const uint8_t hdr[FRAME_HEADER_SIZE], uint32_t *ret_len, unsigned *ret_nfds);

/* One decoded frame: payload borrowed from the reader until its next call, fds owned. */
struct frame {
        const uint8_t *payload;
        uint32_t len;
        unsigned nfds;
        int fds[DLX_MAX_FDS_PER_FRAME];
};

struct frame_reader {
        uint8_t *buf;
        size_t cap;
        size_t start; /* first unconsumed byte */
        size_t end;   /* one past the last received byte */
        unsigned nfds;
        int fds[DLX_MAX_FDS_QUEUED];
};

/* Returns 0 or -ENOMEM. */
int frame_reader_init(struct frame_reader *r);
/* Frees the buffer and closes every queued fd. */
void frame_reader_done(struct frame_reader *r);

/*
 * Room to receive at least one more byte: *ret_ptr and *ret_avail describe free
 * space after the buffered bytes. Grows the buffer up to one whole frame.
 * Returns 0 or -ENOMEM.
 */
int frame_reader_space(struct frame_reader *r, uint8_t **ret_ptr, size_t *ret_avail);
/* Accounts n bytes written into the space frame_reader_space() gave. */
void frame_reader_commit(struct frame_reader *r, size_t n);

/*
 * Queues received fds; consumed on every path. Returns 0, or -EMFILE when the
 * queue would exceed DLX_MAX_FDS_QUEUED (the fds are closed: a peer flooding
 * fds is a protocol violation).
 */
int frame_reader_push_fds(struct frame_reader *r, const int *fds, unsigned n);

/* Control buffer for one recvmsg(): room for a whole fd queue. */
union frame_cmsg_buf {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * DLX_MAX_FDS_QUEUED)];
};

/* Control buffer for one sendmsg() carrying one fd. */
union frame_cmsg_one {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
};

/* Attaches fd (borrowed) to msg through cbuf, which must outlive the sendmsg(). */
void frame_attach_fd(struct msghdr *msg, union frame_cmsg_one *cbuf, int fd);

/*
 * Queues the SCM_RIGHTS descriptors of a message recvmsg() filled (consumed
 * on every path). Returns 0, or -EMFILE when they overflow the queue or the
 * kernel truncated them (MSG_CTRUNC): the peer sent more fds than allowed.
 */
int frame_reader_take_fds(struct frame_reader *r, const struct msghdr *msg);

/*
 * Takes the next complete frame.
 * Returns 1 with *ret filled (its fds now belong to the caller), 0 when more
 * bytes are needed, or a negative errno from frame_header_get(), or -EPROTO
 * when a complete frame announces fds that never came.
 */
int frame_reader_next(struct frame_reader *r, struct frame *ret);

/* Bytes buffered but not yet returned as a frame (a partial frame pending). */
size_t frame_reader_pending(const struct frame_reader *r);

/* Forgets the buffered bytes (a partial frame that will never complete) and closes queued fds. */
void frame_reader_discard(struct frame_reader *r);

/* Closes the fds a frame still owns and forgets them. */
void frame_close_fds(struct frame *f);

#endif /* DLX_PROTO_FRAME_H */
