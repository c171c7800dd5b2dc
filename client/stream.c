/* SPDX-License-Identifier: MIT */
/*
 * CUDA ordering settings: the stream a client's work on each device is on
 * (dlx_set_stream), which publishes record on and acquires wait on. Built
 * with and without CUDA: without, setting one says so.
 */
#include <errno.h>
#include <pthread.h>

#include "internal.h"

static int held_set_stream(dlx_client *c, int device_id, void *stream)
{
        if (!c || device_id < 0 || device_id >= DLX_GPU_MAX_DEVICES)
                return dlx__fail(-EINVAL, "NULL client or device %d out of range", device_id);
#ifndef DLX_HAVE_CUDA
        (void)stream;
        return dlx__fail(-ENOTSUP, "libdlx was built without CUDA");
#else
        pthread_mutex_lock(&c->lock);
        c->streams[device_id] = stream;
        pthread_mutex_unlock(&c->lock);
        return 0;
#endif
}

int dlx_set_stream(dlx_client *c, int device_id, void *stream)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_set_stream(c, device_id, stream));
}

void *dlx_get_stream(dlx_client *c, int device_id)
{
        void *s;

        if (!c || device_id < 0 || device_id >= DLX_GPU_MAX_DEVICES)
                return NULL;
        pthread_mutex_lock(&c->lock);
        s = c->streams[device_id];
        pthread_mutex_unlock(&c->lock);
        return s;
}
