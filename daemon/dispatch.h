/* SPDX-License-Identifier: MIT */
/* One request frame in, replies out through the session: decode, gate on hello, route. */
#ifndef DLX_DAEMON_DISPATCH_H
#define DLX_DAEMON_DISPATCH_H

#include "frame.h"
#include "session.h"

enum dispatch_result {
        DISPATCH_OK,    /* keep reading */
        DISPATCH_CLOSE, /* the peer broke the protocol: send what is queued, then close */
};

/* Handles one frame; its fds are consumed on every path. */
enum dispatch_result dispatch_frame(struct session *s, struct frame *f);

#endif /* DLX_DAEMON_DISPATCH_H */
