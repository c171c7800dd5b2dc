/* SPDX-License-Identifier: MIT */
/* Where the daemon's socket lives: one rule, shared by dlxd and libdlx. */
#ifndef DLX_PROTO_SOCKPATH_H
#define DLX_PROTO_SOCKPATH_H

#include <stdbool.h>
#include <stddef.h>

/*
 * The socket path: opt if non-empty, else $DLX_SOCKET, else
 * $XDG_RUNTIME_DIR/dlx/dlxd.sock, else /tmp/dlx-$UID/dlxd.sock.
 * Returns 0, or -ENAMETOOLONG when it does not fit in size bytes.
 */
int sockpath_resolve(const char *opt, char *buf, size_t size);

/*
 * Whether the path comes from the defaults (neither opt nor $DLX_SOCKET
 * names one): the user's own daemon is meant, and a client checks the peer
 * runs as the user (or root), since the /tmp fallback can be squatted.
 */
bool sockpath_is_default(const char *opt);

/*
 * The federation bridge's control socket for the dlxd at dlxd: dlxfed.sock
 * beside it, or dlxfed-NAME beside a socket named NAME other than dlxd.sock
 * (two daemons in one directory, two bridges). 0, or -ENAMETOOLONG.
 */
int sockpath_control(const char *dlxd, char *buf, size_t size);

#endif /* DLX_PROTO_SOCKPATH_H */
