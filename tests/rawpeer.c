/* SPDX-License-Identifier: MIT */
#include "rawpeer.h"

#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define RP_MAX_FDS 4       /* kept from one reply */
#define RP_MAX_SEND_FDS 64 /* attached to one send: more than a frame may carry, for tests */
#define RP_REPLY_TIMEOUT_MS 10000

static int64_t now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int rp_send_raw(int sock, const void *buf, size_t len, const int *fds, unsigned nfds)
{
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * RP_MAX_SEND_FDS)];
        } cbuf;
        struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        size_t off = 0;

        ck_assert_uint_le(nfds, RP_MAX_SEND_FDS);
        if (nfds) {
                memset(&cbuf, 0, sizeof(cbuf));
                msg.msg_control = cbuf.buf;
                msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
                memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
        }
        while (off < len) {
                ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
                if (n < 0) {
                        struct pollfd p = {.fd = sock, .events = POLLOUT};
                        if (errno == EINTR)
                                continue;
                        /* a non-blocking socket: wait a while for room, then give up */
                        if (errno == EAGAIN && poll(&p, 1, 1000) == 1)
                                continue;
                        return -errno;
                }
                off += (size_t)n;
                iov.iov_base = (uint8_t *)buf + off;
                iov.iov_len = len - off;
                msg.msg_control = NULL;
                msg.msg_controllen = 0;
        }
        return 0;
}

size_t rp_frame(const struct wire_request *req, unsigned nfds, uint8_t *buf, size_t cap)
{
        size_t size;

        ck_assert_int_eq(wire_request_size(req, &size), 0);
        ck_assert_uint_le(FRAME_HEADER_SIZE + size, cap);
        frame_header_put(buf, (uint32_t)size, nfds);
        ck_assert_uint_eq(wire_request_pack(req, buf + FRAME_HEADER_SIZE), size);
        return FRAME_HEADER_SIZE + size;
}

void rp_send(int sock, const struct wire_request *req, int attach_fd)
{
        size_t size, n;
        uint8_t *buf;
        int err;

        ck_assert_int_eq(wire_request_size(req, &size), 0);
        buf = malloc(FRAME_HEADER_SIZE + size);
        ck_assert_ptr_nonnull(buf);
        n = rp_frame(req, attach_fd >= 0 ? 1 : 0, buf, FRAME_HEADER_SIZE + size);
        err = rp_send_raw(sock, buf, n, &attach_fd, attach_fd >= 0 ? 1 : 0);
        free(buf);
        ck_assert_msg(err == 0, "send: %s", strerror(-err));
}

/*
 * Reads exactly len bytes before the deadline, keeping up to RP_MAX_FDS
 * descriptors in fds (extras are closed). Returns len, fewer at EOF,
 * -ETIMEDOUT or -errno.
 */
static ssize_t read_exact(int sock, uint8_t *buf, size_t len, int64_t deadline, int *fds,
                          unsigned *nfds)
{
        size_t off = 0;

        while (off < len) {
                union {
                        struct cmsghdr align;
                        char buf[CMSG_SPACE(sizeof(int) * 64)];
                } cbuf;
                struct iovec iov = {.iov_base = buf + off, .iov_len = len - off};
                struct msghdr msg = {.msg_iov = &iov,
                                     .msg_iovlen = 1,
                                     .msg_control = cbuf.buf,
                                     .msg_controllen = sizeof(cbuf.buf)};
                struct pollfd pfd = {.fd = sock, .events = POLLIN};
                int64_t left = deadline - now_ms();
                ssize_t n;
                int r;

                r = poll(&pfd, 1, left < 0 ? 0 : (int)left);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r == 0)
                        return -ETIMEDOUT;
                n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
                if (n < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
                        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                                continue;
                        unsigned k = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                        for (unsigned i = 0; i < k; i++) {
                                int got;
                                memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                                if (*nfds < RP_MAX_FDS)
                                        fds[(*nfds)++] = got;
                                else
                                        close(got);
                        }
                }
                if (n == 0)
                        return (ssize_t)off;
                off += (size_t)n;
        }
        return (ssize_t)off;
}

static int read_reply(int sock, struct wire_reply *rep, int timeout_ms, int *ret_fd, bool keep)
{
        int64_t deadline = now_ms() + timeout_ms;
        uint8_t hdr[FRAME_HEADER_SIZE], *payload;
        int fds[RP_MAX_FDS];
        unsigned nfds = 0, announced;
        uint32_t len;
        char err[DLX_ERROR_MAX + 1];
        ssize_t n;
        int r;

        if (ret_fd)
                *ret_fd = -1;
        memset(rep, 0, sizeof(*rep));
        n = read_exact(sock, hdr, sizeof(hdr), deadline, fds, &nfds);
        if (n == 0 && nfds == 0)
                return 0;
        if (n < 0 && n != -ETIMEDOUT && nfds == 0)
                return (int)n;
        if (n != (ssize_t)sizeof(hdr)) {
                r = n == -ETIMEDOUT ? -ETIMEDOUT : -EPROTO;
                goto out_fds;
        }
        r = frame_header_get(hdr, &len, &announced);
        ck_assert_msg(r == 0, "the daemon sent a bad frame header: %s", strerror(-r));
        payload = malloc(len ? len : 1);
        ck_assert_ptr_nonnull(payload);
        n = read_exact(sock, payload, len, deadline, fds, &nfds);
        if (n != (ssize_t)len) {
                free(payload);
                r = n == -ETIMEDOUT ? -ETIMEDOUT : -EPROTO;
                goto out_fds;
        }
        ck_assert_msg(announced == nfds, "reply announces %u fds, %u came", announced, nfds);
        r = wire_reply_decode(payload, len, rep, err, sizeof(err));
        free(payload);
        ck_assert_msg(r == 0, "the daemon sent an undecodable reply: %s", err);
        if (!keep)
                wire_reply_done(rep);
        if (ret_fd && nfds) {
                *ret_fd = fds[0];
                fds[0] = -1;
        }
        r = 1;
out_fds:
        for (unsigned i = 0; i < nfds; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        return r;
}

int rp_read(int sock, struct wire_reply *rep, int timeout_ms, int *ret_fd)
{
        return read_reply(sock, rep, timeout_ms, ret_fd, false);
}

int rp_read_keep(int sock, struct wire_reply *rep, int timeout_ms, int *ret_fd)
{
        return read_reply(sock, rep, timeout_ms, ret_fd, true);
}

void rp_expect_ok(int sock, uint64_t id, enum wire_reply_type type, struct wire_reply *ret,
                  int *ret_fd)
{
        struct wire_reply rep;
        int r = rp_read(sock, &rep, RP_REPLY_TIMEOUT_MS, ret_fd);

        ck_assert_msg(r == 1, "request %llu: no reply (%s)", (unsigned long long)id,
                      r == 0 ? "EOF" : strerror(-r));
        ck_assert_msg(rep.id == id && rep.status == WIRE_OK && rep.type == type,
                      "request %llu: expected an OK reply of type %d, got id %llu status %d "
                      "type %d: %s",
                      (unsigned long long)id, (int)type, (unsigned long long)rep.id, rep.status,
                      (int)rep.type, rep.error);
        if (ret)
                *ret = rep;
}

void rp_expect_error(int sock, uint64_t id, enum wire_status status, struct wire_reply *ret)
{
        struct wire_reply rep;
        int r = rp_read(sock, &rep, RP_REPLY_TIMEOUT_MS, NULL);

        ck_assert_msg(r == 1, "request %llu: no reply (%s)", (unsigned long long)id,
                      r == 0 ? "EOF" : strerror(-r));
        ck_assert_msg(rep.id == id && rep.status == (int)status && rep.type == WIRE_REP_NONE &&
                              rep.error[0],
                      "request %llu: expected status %d with a message, got id %llu status %d "
                      "type %d: '%s'",
                      (unsigned long long)id, (int)status, (unsigned long long)rep.id, rep.status,
                      (int)rep.type, rep.error);
        if (ret)
                *ret = rep;
}

int rp_connect(const char *socket_path, const char *name)
{
        return rp_connect_minor(socket_path, name, DLX_PROTO_MINOR);
}

int rp_connect_minor(const char *socket_path, const char *name, uint32_t minor)
{
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        struct wire_request req = {.id = 1, .type = WIRE_REQ_HELLO};
        int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), ring = -1;

        ck_assert_int_ge(sock, 0);
        ck_assert_uint_lt(strlen(socket_path), sizeof(addr.sun_path));
        strcpy(addr.sun_path, socket_path);
        ck_assert_msg(connect(sock, (struct sockaddr *)&addr, sizeof(addr)) == 0, "connect: %s",
                      strerror(errno));
        req.hello.major = DLX_PROTO_MAJOR;
        req.hello.minor = minor;
        snprintf(req.hello.client_name, sizeof(req.hello.client_name), "%s", name);
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, 1, WIRE_REP_HELLO, NULL, &ring);
        if (ring >= 0)
                close(ring);
        return sock;
}

int rp_read_answer(int sock, struct wire_reply *rep, int timeout_ms, int *ret_fd)
{
        for (;;) {
                int r = rp_read(sock, rep, timeout_ms, ret_fd);
                if (r != 1 || rep->type != WIRE_REP_EVENT)
                        return r;
                if (ret_fd && *ret_fd >= 0)
                        close(*ret_fd);
        }
}

void rp_frame_append(uint8_t **buf, size_t *len, size_t *cap, const struct wire_request *req)
{
        size_t size;

        ck_assert_int_eq(wire_request_size(req, &size), 0);
        while (*len + FRAME_HEADER_SIZE + size > *cap) {
                *cap = *cap ? *cap * 2 : 4096;
                *buf = realloc(*buf, *cap);
                ck_assert_ptr_nonnull(*buf);
        }
        *len += rp_frame(req, 0, *buf + *len, *cap - *len);
}

int rp_send_until_stalled(int sock, const uint8_t *buf, size_t len, int stall_ms)
{
        size_t off = 0;

        while (off < len) {
                ssize_t n = send(sock, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN) {
                                struct pollfd p = {.fd = sock, .events = POLLOUT};
                                if (poll(&p, 1, stall_ms) == 0)
                                        return -ETIMEDOUT;
                                continue;
                        }
                        return -errno;
                }
                off += (size_t)n;
        }
        return 0;
}

void rp_acquire_req(struct wire_request *req, uint64_t id, const char *name)
{
        memset(req, 0, sizeof(*req));
        req->id = id;
        req->type = WIRE_REQ_ACQUIRE;
        snprintf(req->acquire.name, sizeof(req->acquire.name), "%s", name);
}

void rp_publish_req(struct wire_request *req, uint64_t id, const char *name, uint64_t bytes,
                    uint64_t segment, uint64_t flags)
{
        struct wire_tensor *t = &req->publish.tensor;

        memset(req, 0, sizeof(*req));
        req->id = id;
        req->type = WIRE_REQ_PUBLISH;
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->dtype = (DLDataType){kDLFloat, 32, 1};
        t->ndim = 1;
        t->shape[0] = (int64_t)(bytes / 4);
        t->strides[0] = 1;
        t->device_type = kDLCPU;
        t->storage = WIRE_STORAGE_MEMFD;
        t->length = bytes;
        t->segment = segment;
        t->flags = flags;
}

void rp_ping(int sock, uint64_t id)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_PING};
        struct wire_reply rep;

        req.ping.nonce = id * 7919 + 1;
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, id, WIRE_REP_PONG, &rep, NULL);
        ck_assert_uint_eq(rep.pong.nonce, id * 7919 + 1);
}

uint64_t rp_alloc(int sock, uint64_t id, uint64_t size, int *ret_fd)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_ALLOC};
        struct wire_reply rep;
        int fd;

        req.alloc.size = size;
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, id, WIRE_REP_ALLOC, &rep, &fd);
        ck_assert_msg(fd >= 0, "alloc reply without an fd");
        ck_assert_uint_eq(rep.alloc.size, size);
        if (ret_fd)
                *ret_fd = fd;
        else
                close(fd);
        return rep.alloc.segment;
}
