/* SPDX-License-Identifier: MIT */
/* Where the daemon's socket lives: one rule, shared by dlxd and libdlx. */
#ifndef DLX_PROTO_SOCKPATH_H
#define DLX_PROTO_SOCKPATH_H

#include <stddef.h>

/*
 * The socket path: opt if non-empty, else $DLX_SOCKET, else
 * $XDG_RUNTIME_DIR/dlx/dlxd.sock, else /tmp/dlx-$UID/dlxd.sock.
 * Returns 0, or -ENAMETOOLONG when it does not fit in size bytes.
 */
int sockpath_resolve(const char *opt, char *buf, size_t size);

#endif /* DLX_PROTO_SOCKPATH_H */
