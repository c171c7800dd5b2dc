/* SPDX-License-Identifier: MIT */
#include "session.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

int session_send(struct session *s, const struct wire_reply *rep, int fd)
{
        int err;

        if (!s->io.send)
                return -ENOTCONN;
        err = s->io.send(s->io.ctx, rep, fd);
        if (err == -EMSGSIZE && rep->id != 0) {
                /* the caller still gets an answer, not silence */
                struct wire_reply small = {.id = rep->id, .status = WIRE_TOO_BIG};
                snprintf(small.error, sizeof(small.error), "reply larger than %u bytes",
                         DLX_MAX_FRAME);
                err = s->io.send(s->io.ctx, &small, -1);
        }
        if (err < 0)
                log_warn("session %llu pid %d uid %u: cannot queue a reply: %s",
                         (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid, strerror(-err));
        return err;
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
        log_info("session %llu pid %d uid %u: request %llu failed: %s", (unsigned long long)s->id,
                 (int)s->pid, (unsigned)s->uid, (unsigned long long)id, rep.error);
        return session_send(s, &rep, -1);
}
