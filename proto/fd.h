/* SPDX-License-Identifier: MIT */
/*
 * A descriptor consumed on every path: fd_drop(&fd) closes it if open and
 * marks it gone, so that no later path can close it again or forget it.
 * Shared by dlxd and libdlx, which both take ownership of received fds.
 */
#ifndef DLX_PROTO_FD_H
#define DLX_PROTO_FD_H

#include <unistd.h>

static inline void fd_drop(int *fd)
{
        if (*fd >= 0)
                close(*fd);
        *fd = -1;
}

#endif /* DLX_PROTO_FD_H */
