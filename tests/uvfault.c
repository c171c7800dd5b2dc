/* SPDX-License-Identifier: MIT */
/*
 * Preloaded into dlxd by test-hygiene: makes one libuv call fail, or one
 * handle leak, as DLX_UVFAULT says:
 *   NAME:N   the Nth call of uv_NAME_init (loop, signal, poll, timer, idle)
 *            returns UV_ENOMEM;
 *   leak     the first uv_close() of an idle handle is not done.
 * Everything else goes to the real libuv.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

static bool fail_now(const char *name)
{
        static char counted[16];
        static int calls;
        const char *spec = getenv("DLX_UVFAULT");
        size_t len = strlen(name);

        if (!spec || strncmp(spec, name, len) != 0 || spec[len] != ':')
                return false;
        if (strcmp(counted, name) != 0) {
                snprintf(counted, sizeof(counted), "%s", name);
                calls = 0;
        }
        return ++calls == atoi(spec + len + 1);
}

#define REAL(name, type) ((type)dlsym(RTLD_NEXT, name))

int uv_loop_init(uv_loop_t *loop)
{
        if (fail_now("loop"))
                return UV_ENOMEM;
        return REAL("uv_loop_init", int (*)(uv_loop_t *))(loop);
}

int uv_signal_init(uv_loop_t *loop, uv_signal_t *h)
{
        if (fail_now("signal"))
                return UV_ENOMEM;
        return REAL("uv_signal_init", int (*)(uv_loop_t *, uv_signal_t *))(loop, h);
}

int uv_poll_init(uv_loop_t *loop, uv_poll_t *h, int fd)
{
        if (fail_now("poll"))
                return UV_ENOMEM;
        return REAL("uv_poll_init", int (*)(uv_loop_t *, uv_poll_t *, int))(loop, h, fd);
}

int uv_timer_init(uv_loop_t *loop, uv_timer_t *h)
{
        if (fail_now("timer"))
                return UV_ENOMEM;
        return REAL("uv_timer_init", int (*)(uv_loop_t *, uv_timer_t *))(loop, h);
}

int uv_idle_init(uv_loop_t *loop, uv_idle_t *h)
{
        if (fail_now("idle"))
                return UV_ENOMEM;
        return REAL("uv_idle_init", int (*)(uv_loop_t *, uv_idle_t *))(loop, h);
}

void uv_close(uv_handle_t *h, uv_close_cb cb)
{
        static bool leaked;
        const char *spec = getenv("DLX_UVFAULT");

        if (spec && strcmp(spec, "leak") == 0 && !leaked && h->type == UV_IDLE) {
                leaked = true;
                return;
        }
        REAL("uv_close", void (*)(uv_handle_t *, uv_close_cb))(h, cb);
}
