/* SPDX-License-Identifier: MIT */
#ifndef DLX_DAEMON_TICKER_H
#define DLX_DAEMON_TICKER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/*
 * A periodic timerfd watched by the loop, armed only while there is work for
 * it. Not a uv timer: an active uv timer gives every epoll_wait a timeout, and
 * the kernel then arms and cancels an hrtimer around each wait (about half a
 * microsecond per request here); a timerfd's is armed once per period.
 */
struct ticker {
        int fd; /* -1: none */
        uv_poll_t poll;
        bool armed;
        uint64_t period_ms;
        void *ctx;
        /* returns whether to keep ticking */
        bool (*tick)(void *ctx);
};

/* A disarmed ticker on loop. Returns 0 or -errno (t->fd stays -1). */
int ticker_init(uv_loop_t *loop, struct ticker *t, uint64_t period_ms, bool (*tick)(void *ctx),
                void *ctx);
/* Starts (on) or stops ticking every period_ms. */
void ticker_arm(struct ticker *t, bool on);
/* Closes the ticker (its fd once the loop lets go of it); a ticker never made is left alone. */
void ticker_close(struct ticker *t);

#endif /* DLX_DAEMON_TICKER_H */
