/* SPDX-License-Identifier: MIT */
/* See tmpfiles.h. */
#include "tmpfiles.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char tmpdir[PATH_MAX];

void tmpdir_make(const char *tag)
{
        const char *base = getenv("TMPDIR");

        snprintf(tmpdir, sizeof(tmpdir), "%s/dlx-%s-XXXXXX", base && *base ? base : "/tmp", tag);
        ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st;
        (void)flag;
        (void)ftw;
        remove(path);
        return 0;
}

void remove_tree(const char *path)
{
        struct stat st;

        ck_assert_int_eq(nftw(path, remove_one, 8, FTW_DEPTH | FTW_PHYS), 0);
        ck_assert_msg(stat(path, &st) < 0 && errno == ENOENT, "%s is still there", path);
}

void tmpdir_remove(void)
{
        remove_tree(tmpdir);
}

const char *path_of(const char *name)
{
        static char bufs[4][PATH_MAX + 256];
        static unsigned next;
        char *p = bufs[next++ % 4];

        snprintf(p, sizeof(bufs[0]), "%s/%s", tmpdir, name);
        return p;
}

void write_file(const char *path, const void *buf, size_t n)
{
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

        ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
        ck_assert_int_eq(write(fd, buf, n), (ssize_t)n);
        ck_assert_int_eq(close(fd), 0);
}

uint8_t *slurp(const char *path, size_t *ret_len)
{
        struct stat st;
        uint8_t *buf;
        int fd = open(path, O_RDONLY | O_CLOEXEC);

        ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
        ck_assert_int_eq(fstat(fd, &st), 0);
        buf = malloc((size_t)st.st_size + 1);
        ck_assert_ptr_nonnull(buf);
        ck_assert_int_eq(read(fd, buf, (size_t)st.st_size), (ssize_t)st.st_size);
        close(fd);
        buf[st.st_size] = '\0';
        *ret_len = (size_t)st.st_size;
        return buf;
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
        size_t isz = (size_t)t->dtype.bits * t->dtype.lanes / 8u, n = numel(t);

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
