/* SPDX-License-Identifier: MIT */
/* See tmpfiles.h. */
#include "tmpfiles.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char tmpdir[PATH_MAX];

void tmpdir_make(const char *tag)
{
        const char *base = getenv("TMPDIR");

        snprintf(tmpdir, sizeof(tmpdir), "%s/dlx-%s-XXXXXX", base && *base ? base : "/tmp", tag);
        ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

void tmpdir_remove(void)
{
        DIR *d = opendir(tmpdir);
        struct dirent *e;
        char path[PATH_MAX + 256];

        ck_assert_ptr_nonnull(d);
        while ((e = readdir(d))) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                        continue;
                snprintf(path, sizeof(path), "%s/%s", tmpdir, e->d_name);
                if (rmdir(path) < 0)
                        unlink(path);
        }
        closedir(d);
        ck_assert_int_eq(rmdir(tmpdir), 0);
}

const char *path_of(const char *name)
{
        static char path[PATH_MAX + 256];

        snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
        return path;
}

int open_new(const char *name)
{
        int fd = open(path_of(name), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

        ck_assert_int_ge(fd, 0);
        return fd;
}

void put(int fd, const void *buf, size_t n)
{
        ck_assert_int_eq(write(fd, buf, n), (ssize_t)n);
}

int count_maps(const char *also)
{
        FILE *f = fopen("/proc/self/maps", "re");
        char line[PATH_MAX + 128];
        int n = 0;

        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f))
                n += strstr(line, tmpdir) != NULL || (also && strstr(line, also) != NULL);
        fclose(f);
        return n;
}

DLTensor host_tensor(void *data, DLDataType dtype, int32_t ndim, int64_t *shape, int64_t *strides,
                     uint64_t byte_offset)
{
        DLTensor t = {
                .data = data,
                .device = {kDLCPU, 0},
                .ndim = ndim,
                .dtype = dtype,
                .shape = shape,
                .strides = strides,
                .byte_offset = byte_offset,
        };
        return t;
}

size_t numel(const DLTensor *t)
{
        size_t n = 1;

        for (int32_t k = 0; k < t->ndim; k++)
                n *= (size_t)t->shape[k];
        return n;
}

void naive_gather(const DLTensor *t, void *out)
{
        size_t isz = t->dtype.bits / 8u, n = numel(t);

        for (size_t i = 0; i < n; i++) {
                size_t rest = i;
                int64_t off = 0;

                for (int32_t k = t->ndim - 1; k >= 0; k--) {
                        int64_t idx = (int64_t)(rest % (size_t)t->shape[k]);

                        rest /= (size_t)t->shape[k];
                        off += idx * (t->strides ? t->strides[k] : 0);
                }
                if (!t->strides)
                        off = (int64_t)i;
                memcpy((char *)out + i * isz,
                       (const char *)t->data + t->byte_offset + off * (int64_t)isz, isz);
        }
}
