/* SPDX-License-Identifier: MIT */
#include "session.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

static int send_with(struct session *s, const struct wire_reply *rep, int fd, struct segment *seg)
{
        int err;

        if (!s->io.send)
                return -ENOTCONN;
        err = s->io.send(s->io.ctx, rep, fd, seg);
        if (err == -EMSGSIZE && rep->id != 0) {
                /* the caller still gets an answer, not silence */
                struct wire_reply small = {.id = rep->id, .status = WIRE_TOO_BIG};
                snprintf(small.error, sizeof(small.error), "reply larger than %u bytes",
                         DLX_MAX_FRAME);
                err = s->io.send(s->io.ctx, &small, -1, NULL);
        }
        /* a dropped watch event is the connection's to report (a LOST event) */
        if (err < 0 && err != -ENOBUFS)
                log_session(warn, s, "cannot queue a reply: %s", strerror(-err));
        return err;
}

int session_send(struct session *s, const struct wire_reply *rep, int fd)
{
        return send_with(s, rep, fd, NULL);
}

int session_send_segment(struct session *s, const struct wire_reply *rep, struct segment *seg)
{
        return send_with(s, rep, -1, seg);
}

int session_fail(struct session *s, uint64_t id, int err, const char *fmt, ...)
{
        struct wire_reply rep;
        va_list ap;

        rep.id = id;
        rep.status = wire_errno_status(err);
        rep.type = WIRE_REP_NONE;
        va_start(ap, fmt);
        vsnprintf(rep.error, sizeof(rep.error), fmt, ap);
        va_end(ap);
        log_session(info, s, "request %llu failed: %s", (unsigned long long)id, rep.error);
        return session_send(s, &rep, -1);
}
