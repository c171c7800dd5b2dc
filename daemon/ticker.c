/* SPDX-License-Identifier: MIT */
#include "ticker.h"

#include <errno.h>
#include <sys/timerfd.h>
#include <unistd.h>

static void on_tick(uv_poll_t *h, int status, int events)
{
        struct ticker *t = h->data;
        uint64_t ticks;

        (void)status;
        (void)events;
        if (read(t->fd, &ticks, sizeof(ticks)) < 0 && errno == EAGAIN)
                return;
        if (!t->tick(t->ctx))
                ticker_arm(t, false);
}

void ticker_arm(struct ticker *t, bool on)
{
        struct itimerspec its = {0};

        if (on) {
                its.it_value.tv_sec = (time_t)(t->period_ms / 1000);
                its.it_value.tv_nsec = (long)(t->period_ms % 1000) * 1000000L;
                its.it_interval = its.it_value;
        }
        /* cannot fail for a valid timerfd and a sane period */
        timerfd_settime(t->fd, 0, &its, NULL);
        if (on)
                uv_poll_start(&t->poll, UV_READABLE, on_tick);
        else
                uv_poll_stop(&t->poll);
        t->armed = on;
}

int ticker_init(uv_loop_t *loop, struct ticker *t, uint64_t period_ms, bool (*tick)(void *ctx),
                void *ctx)
{
        int err;

        t->ctx = ctx;
        t->tick = tick;
        t->period_ms = period_ms;
        t->armed = false;
        t->fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (t->fd < 0)
                return -errno;
        err = uv_poll_init(loop, &t->poll, t->fd);
        if (err < 0) {
                close(t->fd);
                t->fd = -1;
                return err;
        }
        t->poll.data = t;
        return 0;
}

static void on_ticker_closed(uv_handle_t *h)
{
        struct ticker *t = h->data;

        close(t->fd);
        t->fd = -1;
}

void ticker_close(struct ticker *t)
{
        if (t->fd < 0)
                return;
        uv_poll_stop(&t->poll);
        uv_close((uv_handle_t *)&t->poll, on_ticker_closed);
}
