/* SPDX-License-Identifier: MIT */
/*
 * Errors and logging: the thread-local detail behind dlx_last_error(), the
 * words of dlx_strerror(), and a client's log. A leaf: every other file of
 * libdlx may call it, and it calls none of them.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/*
 * The detail of the thread's last failure. Calls that succeed leave it be,
 * as errno is left: every failure, so every path returning one to the
 * caller, records its own through dlx__fail().
 */
static __thread char last_error[DLX_ERROR_MAX + 64];

int dlx__fail(int err, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(last_error, sizeof(last_error), fmt, ap);
        va_end(ap);
        return err;
}

const char *dlx_last_error(void)
{
        return last_error;
}

const char *dlx_strerror(int err)
{
        if (err == INT_MIN)
                return "unknown error";
        if (err < 0)
                err = -err;
        switch (err) {
        case 0:
                return "success";
        case EINVAL:
                return "invalid argument";
        case ENOENT:
                return "not found (no such tensor, or no daemon at the socket path)";
        case EACCES:
                return "permission denied: the name belongs to another user";
        case EPERM:
                return "operation not permitted";
        case ETIMEDOUT:
                return "timed out";
        case ENOSPC:
                return "the daemon's shared-memory limit is reached";
        case EAGAIN:
                return "a daemon limit is reached; try again later";
        case EPROTO:
                return "protocol error";
        case EPROTONOSUPPORT:
                return "the daemon speaks an incompatible protocol version";
        case EBADF:
                return "bad or unsuitable file descriptor";
        case EMSGSIZE:
                return "message or size over a limit";
        case EOVERFLOW:
                return "size overflows";
        case EXDEV:
                return "the memory is not shareable without a copy";
        case ENOTSUP:
                return "not supported";
        case ENOMEM:
                return "out of memory";
        case ECONNREFUSED:
                return "no daemon listening on the socket";
        case ECONNRESET:
        case EPIPE:
                return "the connection to the daemon was lost";
        case ESHUTDOWN:
                return "the daemon is shutting down";
        case ENAMETOOLONG:
                return "socket path too long";
        case ENODEV:
                return "no such device";
        case ESTALE:
                return "the client belongs to the process that connected it (this one forked "
                       "since): connect again here";
        default:
                return strerror(err);
        }
}

void dlx__log(dlx_client *c, int level, const char *fmt, ...)
{
        char msg[512];
        va_list ap;

        if (!c->log && !c->log_stderr)
                return;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        if (c->log)
                c->log(c->log_ctx, level, msg);
        if (c->log_stderr)
                fprintf(stderr, "libdlx[%d]: %s\n", (int)getpid(), msg);
}
