/* SPDX-License-Identifier: MIT */
#include "frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Enough for many small frames per read; grows to a full frame only when one needs it. */
#define READER_INITIAL 4096

void frame_header_put(uint8_t hdr[FRAME_HEADER_SIZE], uint32_t len, unsigned nfds)
{
        hdr[0] = (uint8_t)len;
        hdr[1] = (uint8_t)(len >> 8);
        hdr[2] = (uint8_t)(len >> 16);
        hdr[3] = (uint8_t)(len >> 24);
        hdr[4] = (uint8_t)nfds;
        hdr[5] = (uint8_t)(nfds >> 8);
        hdr[6] = 0;
        hdr[7] = 0;
}

int frame_header_get(const uint8_t hdr[FRAME_HEADER_SIZE], uint32_t *ret_len, unsigned *ret_nfds)
{
        uint32_t len = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
                       (uint32_t)hdr[3] << 24;
        unsigned nfds = (unsigned)hdr[4] | (unsigned)hdr[5] << 8;

        if (hdr[6] != 0 || hdr[7] != 0)
                return -EPROTO;
        if (len > DLX_MAX_FRAME)
                return -EMSGSIZE;
        if (nfds > DLX_MAX_FDS_PER_FRAME)
                return -E2BIG;
        *ret_len = len;
        *ret_nfds = nfds;
        return 0;
}

int frame_reader_init(struct frame_reader *r)
{
        memset(r, 0, sizeof(*r));
        r->buf = malloc(READER_INITIAL);
        if (!r->buf)
                return -ENOMEM;
        r->cap = READER_INITIAL;
        return 0;
}

void frame_reader_done(struct frame_reader *r)
{
        for (unsigned i = 0; i < r->nfds; i++)
                close(r->fds[i]);
        r->nfds = 0;
        free(r->buf);
        r->buf = NULL;
        r->cap = r->start = r->end = 0;
}

/* Bytes the frame at the head of the buffer needs in all, if its header is here. */
static size_t head_frame_size(const struct frame_reader *r)
{
        uint32_t len;
        unsigned nfds;

        if (r->end - r->start < FRAME_HEADER_SIZE)
                return FRAME_HEADER_SIZE;
        if (frame_header_get(r->buf + r->start, &len, &nfds) < 0)
                return FRAME_HEADER_SIZE; /* reported by frame_reader_next() */
        return FRAME_HEADER_SIZE + (size_t)len;
}

int frame_reader_space(struct frame_reader *r, uint8_t **ret_ptr, size_t *ret_avail)
{
        size_t used = r->end - r->start;
        size_t need = head_frame_size(r);

        if (r->start > 0 && (r->end == r->cap || r->start + need > r->cap)) {
                memmove(r->buf, r->buf + r->start, used);
                r->start = 0;
                r->end = used;
        }
        if (r->end == r->cap || need > r->cap) {
                size_t cap = r->cap * 2;
                while (cap < need)
                        cap *= 2;
                uint8_t *buf = realloc(r->buf, cap);
                if (!buf)
                        return -ENOMEM;
                r->buf = buf;
                r->cap = cap;
        }
        *ret_ptr = r->buf + r->end;
        *ret_avail = r->cap - r->end;
        return 0;
}

void frame_reader_commit(struct frame_reader *r, size_t n)
{
        r->end += n;
}

int frame_reader_push_fds(struct frame_reader *r, const int *fds, unsigned n)
{
        if (n > DLX_MAX_FDS_QUEUED - r->nfds) {
                for (unsigned i = 0; i < n; i++)
                        close(fds[i]);
                return -EMFILE;
        }
        memcpy(r->fds + r->nfds, fds, n * sizeof(int));
        r->nfds += n;
        return 0;
}

void frame_attach_fd(struct msghdr *msg, union frame_cmsg_one *cbuf, int fd)
{
        struct cmsghdr *cm;

        memset(cbuf, 0, sizeof(*cbuf));
        msg->msg_control = cbuf->buf;
        msg->msg_controllen = sizeof(cbuf->buf);
        cm = CMSG_FIRSTHDR(msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
}

int frame_reader_take_fds(struct frame_reader *r, const struct msghdr *msg)
{
        int err = 0;

        for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm;
             cm = CMSG_NXTHDR((struct msghdr *)msg, cm)) {
                int fds[DLX_MAX_FDS_QUEUED];
                unsigned n;

                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                        continue;
                n = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                if (n > DLX_MAX_FDS_QUEUED)
                        n = DLX_MAX_FDS_QUEUED; /* cannot happen with a frame_cmsg_buf */
                memcpy(fds, CMSG_DATA(cm), n * sizeof(int));
                /* push_fds closes them even when it refuses */
                if (frame_reader_push_fds(r, fds, n) < 0)
                        err = -EMFILE;
        }
        if (msg->msg_flags & MSG_CTRUNC)
                err = -EMFILE;
        return err;
}

int frame_reader_next(struct frame_reader *r, struct frame *ret)
{
        uint32_t len;
        unsigned nfds;
        int err;

        if (r->end - r->start < FRAME_HEADER_SIZE)
                return 0;
        err = frame_header_get(r->buf + r->start, &len, &nfds);
        if (err < 0)
                return err;
        if (r->end - r->start < FRAME_HEADER_SIZE + (size_t)len)
                return 0;
        if (nfds > r->nfds)
                return -EPROTO;

        ret->payload = r->buf + r->start + FRAME_HEADER_SIZE;
        ret->len = len;
        ret->nfds = nfds;
        memcpy(ret->fds, r->fds, nfds * sizeof(int));
        memmove(r->fds, r->fds + nfds, (r->nfds - nfds) * sizeof(int));
        r->nfds -= nfds;
        r->start += FRAME_HEADER_SIZE + (size_t)len;
        if (r->start == r->end)
                r->start = r->end = 0;
        return 1;
}

size_t frame_reader_pending(const struct frame_reader *r)
{
        return r->end - r->start;
}

void frame_reader_discard(struct frame_reader *r)
{
        for (unsigned i = 0; i < r->nfds; i++)
                close(r->fds[i]);
        r->nfds = 0;
        r->start = r->end = 0;
}

void frame_close_fds(struct frame *f)
{
        for (unsigned i = 0; i < f->nfds; i++)
                if (f->fds[i] >= 0)
                        close(f->fds[i]);
        f->nfds = 0;
}
