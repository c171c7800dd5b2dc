/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the frame reader (proto/frame.c), fed as the daemon's and the
 * library's connections feed it: bytes through frame_reader_space() and
 * frame_reader_commit() in chunks of every size, descriptors through
 * frame_reader_push_fds() and frame_reader_take_fds(), frames taken after
 * every chunk. A model of the byte stream and of the fd queue checks every
 * frame that comes out (header, payload, which fds), every error (the one the
 * model expects), frame_reader_pending(), and that every fd is closed once
 * handed back: no fd survives an input.
 *
 * Input: a sequence of operations, each one byte (op % 6) and its arguments;
 * integers are little endian, and an input that ends early reads zeros.
 *
 *   0 BYTES   u8 n, n bytes            append bytes to the stream
 *   1 REPEAT  u8 value, u16 count      append count copies of value
 *   2 HEADER  u32 len, u8 nfds         append a header from frame_header_put()
 *   3 FDS     u8 n                     push n % 20 fresh fds (dups of /dev/null)
 *   4 CMSG    u8 flags, 3 x u8 desc    frame_reader_take_fds() on a message as
 *             recvmsg() leaves it: each desc (desc & 3: none, SCM_RIGHTS,
 *             SCM_CREDENTIALS, empty SCM_RIGHTS) with (desc >> 2) % 17 fds, as
 *             many as fit in a union frame_cmsg_buf; flags & 1: MSG_CTRUNC
 *   5 SPACE                            frame_reader_space() and no bytes
 *
 * After each chunk and each operation the reader's frames are taken until it
 * wants more bytes. An error ends the input, as it ends a connection.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "fuzz.h"

struct model {
        uint8_t *bytes; /* the stream: [start, len) is not framed yet */
        size_t start, len, cap;
        int fds[DLX_MAX_FDS_QUEUED];
        unsigned nfds;
};

static int devnull = -1;

static void model_append(struct model *m, const uint8_t *p, size_t n)
{
        if (m->start > 0 && m->len + n > m->cap) {
                memmove(m->bytes, m->bytes + m->start, m->len - m->start);
                m->len -= m->start;
                m->start = 0;
        }
        if (m->len + n > m->cap) {
                size_t cap = m->cap ? m->cap : 4096;
                while (cap < m->len + n)
                        cap *= 2;
                m->bytes = realloc(m->bytes, cap);
                FUZZ_CHECK(m->bytes != NULL, "out of memory for %zu bytes", cap);
                m->cap = cap;
        }
        memcpy(m->bytes + m->len, p, n);
        m->len += n;
}

static size_t model_pending(const struct model *m)
{
        return m->len - m->start;
}

/* What frame_reader_next() must return now (1, 0 or the error), read as frame.h says. */
static int model_expect(const struct model *m, uint32_t *ret_len, unsigned *ret_nfds)
{
        const uint8_t *h;

        if (model_pending(m) < FRAME_HEADER_SIZE)
                return 0;
        h = m->bytes + m->start;
        *ret_len =
                (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        *ret_nfds = (unsigned)h[4] | (unsigned)h[5] << 8;
        if (h[6] || h[7])
                return -EPROTO;
        if (*ret_len > DLX_MAX_FRAME)
                return -EMSGSIZE;
        if (*ret_nfds > DLX_MAX_FDS_PER_FRAME)
                return -E2BIG;
        if (model_pending(m) < FRAME_HEADER_SIZE + (size_t)*ret_len)
                return 0;
        if (*ret_nfds > m->nfds)
                return -EPROTO;
        return 1;
}

/* Takes every complete frame and checks it against the model; false once the stream is bad. */
static bool drain(struct frame_reader *r, struct model *m)
{
        for (;;) {
                struct frame f;
                uint32_t len = 0;
                unsigned nfds = 0;
                int want = model_expect(m, &len, &nfds);
                int got = frame_reader_next(r, &f);

                FUZZ_CHECK(got == want, "frame_reader_next() gave %d, the model %d", got, want);
                if (got <= 0)
                        return got == 0;
                FUZZ_CHECK(f.len == len && f.nfds == nfds,
                           "frame of %u bytes and %u fds, not %u/%u", f.len, f.nfds, len, nfds);
                FUZZ_CHECK(len == 0 || memcmp(f.payload, m->bytes + m->start + FRAME_HEADER_SIZE,
                                              len) == 0,
                           "payload of %u bytes differs", len);
                for (unsigned i = 0; i < nfds; i++)
                        FUZZ_CHECK(f.fds[i] == m->fds[i], "fd %u of the frame is %d, not %d", i,
                                   f.fds[i], m->fds[i]);
                memmove(m->fds, m->fds + nfds, (m->nfds - nfds) * sizeof(int));
                m->nfds -= nfds;
                m->start += FRAME_HEADER_SIZE + (size_t)len;
                frame_close_fds(&f);
                FUZZ_CHECK(f.nfds == 0, "frame_close_fds() left %u fds", f.nfds);
                for (unsigned i = 0; i < nfds; i++)
                        FUZZ_CHECK(fuzz_fd_is_closed(f.fds[i]), "fd %d still open", f.fds[i]);
        }
}

/* Feeds bytes as recvmsg() would: as much as the reader has room for, then frames. */
static bool feed(struct frame_reader *r, struct model *m, const uint8_t *p, size_t n)
{
        while (n > 0) {
                uint8_t *space;
                size_t avail, take;

                FUZZ_CHECK(frame_reader_space(r, &space, &avail) == 0, "frame_reader_space failed");
                FUZZ_CHECK(avail > 0, "frame_reader_space() gave no room");
                take = n < avail ? n : avail;
                memcpy(space, p, take);
                frame_reader_commit(r, take);
                model_append(m, p, take);
                p += take;
                n -= take;
                if (!drain(r, m))
                        return false;
        }
        return true;
}

static int new_fd(void)
{
        int fd = fcntl(devnull, F_DUPFD_CLOEXEC, 0);

        FUZZ_CHECK(fd >= 0, "cannot duplicate /dev/null: %s", strerror(errno));
        return fd;
}

/* Pushes fds as the reader expects them; false when it refused them (and closed them). */
static bool push(struct frame_reader *r, struct model *m, const int *fds, unsigned n)
{
        int err = frame_reader_push_fds(r, fds, n);

        if (n > DLX_MAX_FDS_QUEUED - m->nfds) {
                FUZZ_CHECK(err == -EMFILE, "pushing %u fds onto %u gave %d", n, m->nfds, err);
                for (unsigned i = 0; i < n; i++)
                        FUZZ_CHECK(fuzz_fd_is_closed(fds[i]), "refused fd %d left open", fds[i]);
                return false;
        }
        FUZZ_CHECK(err == 0, "pushing %u fds onto %u gave %d", n, m->nfds, err);
        memcpy(m->fds + m->nfds, fds, n * sizeof(int));
        m->nfds += n;
        return true;
}

static bool op_fds(struct frame_reader *r, struct model *m, unsigned n)
{
        int fds[20];

        for (unsigned i = 0; i < n; i++)
                fds[i] = new_fd();
        return push(r, m, fds, n);
}

/* A control message as the kernel fills a union frame_cmsg_buf; false when it ends the stream. */
static bool op_cmsg(struct frame_reader *r, struct model *m, struct fuzz_input *in)
{
        union frame_cmsg_buf cbuf;
        struct msghdr msg = {.msg_control = cbuf.buf, .msg_controllen = sizeof(cbuf.buf)};
        uint8_t flags = fuzz_u8(in);
        size_t used = 0;
        bool ok = true;
        struct cmsghdr *cm;
        struct {
                int fds[DLX_MAX_FDS_QUEUED];
                unsigned n;
                bool rights;
        } parts[3];
        unsigned nparts = 0;

        memset(&cbuf, 0, sizeof(cbuf));
        for (int i = 0; i < 3; i++) {
                uint8_t desc = fuzz_u8(in);
                unsigned type = desc & 3, n = (desc >> 2) % 17;
                size_t space;

                if (type == 0)
                        continue;
                if (type == 2) {
                        space = CMSG_SPACE(sizeof(struct ucred));
                } else {
                        if (type == 3)
                                n = 0;
                        /* the kernel fills what fits and reports the rest as truncated */
                        while (n > 0 && used + CMSG_SPACE(n * sizeof(int)) > sizeof(cbuf.buf))
                                n--;
                        space = CMSG_SPACE(n * sizeof(int));
                }
                if (used + space > sizeof(cbuf.buf)) {
                        flags |= 1;
                        break;
                }
                parts[nparts].rights = type != 2;
                parts[nparts].n = type != 2 ? n : 0;
                used += space;
                nparts++;
        }
        msg.msg_controllen = used;
        msg.msg_flags = flags & 1 ? MSG_CTRUNC : 0;
        cm = used ? CMSG_FIRSTHDR(&msg) : NULL;
        for (unsigned i = 0; i < nparts; i++, cm = CMSG_NXTHDR(&msg, cm)) {
                FUZZ_CHECK(cm != NULL, "control message %u does not fit", i);
                cm->cmsg_level = SOL_SOCKET;
                if (parts[i].rights) {
                        cm->cmsg_type = SCM_RIGHTS;
                        cm->cmsg_len = CMSG_LEN(parts[i].n * sizeof(int));
                        for (unsigned j = 0; j < parts[i].n; j++)
                                parts[i].fds[j] = new_fd();
                        memcpy(CMSG_DATA(cm), parts[i].fds, parts[i].n * sizeof(int));
                } else {
                        struct ucred cred = {.pid = getpid(), .uid = getuid(), .gid = getgid()};
                        cm->cmsg_type = SCM_CREDENTIALS;
                        cm->cmsg_len = CMSG_LEN(sizeof(cred));
                        memcpy(CMSG_DATA(cm), &cred, sizeof(cred));
                }
        }

        int err = frame_reader_take_fds(r, &msg);

        /* the model: each SCM_RIGHTS message is queued whole or refused whole */
        for (unsigned i = 0; i < nparts; i++) {
                if (!parts[i].rights)
                        continue;
                if (parts[i].n > DLX_MAX_FDS_QUEUED - m->nfds) {
                        ok = false;
                        for (unsigned j = 0; j < parts[i].n; j++)
                                FUZZ_CHECK(fuzz_fd_is_closed(parts[i].fds[j]),
                                           "refused fd %d left open", parts[i].fds[j]);
                        continue;
                }
                memcpy(m->fds + m->nfds, parts[i].fds, parts[i].n * sizeof(int));
                m->nfds += parts[i].n;
        }
        if (flags & 1)
                ok = false;
        FUZZ_CHECK(err == (ok ? 0 : -EMFILE), "frame_reader_take_fds() gave %d", err);
        return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct fuzz_input in = {data, size};
        struct frame_reader r;
        struct model m = {0};
        int fds_before;
        bool alive = true;

        if (devnull < 0) {
                devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
                FUZZ_CHECK(devnull >= 0, "cannot open /dev/null: %s", strerror(errno));
        }
        fds_before = fuzz_count_fds();
        FUZZ_CHECK(frame_reader_init(&r) == 0, "frame_reader_init failed");

        while (alive && in.left > 0) {
                uint8_t op = fuzz_u8(&in);
                const uint8_t *p;
                uint8_t hdr[FRAME_HEADER_SIZE], *buf;
                size_t n;

                switch (op % FRAME_OP_COUNT) {
                case FRAME_OP_BYTES:
                        n = fuzz_bytes(&in, fuzz_u8(&in), &p);
                        alive = feed(&r, &m, p, n);
                        break;
                case FRAME_OP_REPEAT: {
                        uint8_t value = fuzz_u8(&in);
                        n = fuzz_u16(&in);
                        buf = malloc(n ? n : 1);
                        FUZZ_CHECK(buf != NULL, "out of memory");
                        memset(buf, value, n);
                        alive = feed(&r, &m, buf, n);
                        free(buf);
                        break;
                }
                case FRAME_OP_HEADER: {
                        uint32_t len = fuzz_u32(&in);
                        frame_header_put(hdr, len, fuzz_u8(&in));
                        alive = feed(&r, &m, hdr, sizeof(hdr));
                        break;
                }
                case FRAME_OP_FDS:
                        alive = op_fds(&r, &m, fuzz_u8(&in) % 20);
                        break;
                case FRAME_OP_CMSG:
                        alive = op_cmsg(&r, &m, &in);
                        break;
                default: {
                        uint8_t *space;
                        size_t avail;
                        FUZZ_CHECK(frame_reader_space(&r, &space, &avail) == 0,
                                   "frame_reader_space failed");
                        FUZZ_CHECK(avail > 0, "frame_reader_space() gave no room");
                        break;
                }
                }
                if (alive)
                        alive = drain(&r, &m);
                FUZZ_CHECK(!alive || frame_reader_pending(&r) == model_pending(&m),
                           "%zu bytes pending, the model has %zu", frame_reader_pending(&r),
                           model_pending(&m));
        }

        frame_reader_done(&r);
        for (unsigned i = 0; i < m.nfds; i++)
                FUZZ_CHECK(fuzz_fd_is_closed(m.fds[i]), "queued fd %d left open", m.fds[i]);
        free(m.bytes);
        FUZZ_CHECK(fuzz_count_fds() == fds_before, "%d fds open after the input, %d before",
                   fuzz_count_fds(), fds_before);
        return 0;
}
