/* SPDX-License-Identifier: MIT */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

uint8_t fuzz_u8(struct fuzz_input *in)
{
        if (in->left == 0)
                return 0;
        in->left--;
        return *in->p++;
}

uint16_t fuzz_u16(struct fuzz_input *in)
{
        uint16_t lo = fuzz_u8(in);

        return (uint16_t)(lo | fuzz_u8(in) << 8);
}

uint32_t fuzz_u32(struct fuzz_input *in)
{
        uint32_t lo = fuzz_u16(in);

        return lo | (uint32_t)fuzz_u16(in) << 16;
}

uint64_t fuzz_u64(struct fuzz_input *in)
{
        uint64_t lo = fuzz_u32(in);

        return lo | (uint64_t)fuzz_u32(in) << 32;
}

size_t fuzz_bytes(struct fuzz_input *in, size_t n, const uint8_t **ret)
{
        if (n > in->left)
                n = in->left;
        *ret = in->p;
        in->p += n;
        in->left -= n;
        return n;
}

void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
        va_list ap;

        fprintf(stderr, "%s:%d: invariant broken: %s: ", file, line, cond);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        abort();
}

int fuzz_count_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        int n = 0;

        FUZZ_CHECK(d != NULL, "cannot open /proc/self/fd: %s", strerror(errno));
        while ((e = readdir(d)))
                if (e->d_name[0] != '.')
                        n++;
        closedir(d);
        return n - 1; /* the directory's own fd */
}

bool fuzz_fd_is_closed(int fd)
{
        errno = 0;
        return fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

static uint64_t size_class(unsigned param)
{
        static const uint64_t sizes[8] = {
                1, 24, 4096, 65536, 1u << 20, 1u << 24, 1u << 30, UINT64_C(1) << 40,
        };

        return sizes[param & 7];
}

/* A memfd of size bytes (sparse: nothing is touched) with the given seals. */
static int memfd(uint64_t size, unsigned seals, bool sealable)
{
        int fd = memfd_create("dlx-fuzz", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));

        if (fd < 0)
                return -1;
        /* a size the kernel refuses still leaves a usable (empty) memfd */
        if (size)
                (void)ftruncate(fd, (off_t)size);
        if (seals)
                (void)fcntl(fd, F_ADD_SEALS, seals);
        return fd;
}

/* A new open file description of fd with another access mode; fd is consumed. */
static int reopen(int fd, int flags)
{
        char path[64];
        int r;

        if (fd < 0)
                return -1;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        r = open(path, flags | O_CLOEXEC);
        close(fd);
        return r;
}

static int pipe_end(bool write_end)
{
        int p[2];

        if (pipe2(p, O_CLOEXEC) < 0)
                return -1;
        close(p[write_end ? 0 : 1]);
        return p[write_end ? 1 : 0];
}

static int socket_end(void)
{
        int sv[2];

        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
                return -1;
        close(sv[1]);
        return sv[0];
}

static int tmpfile_fd(uint64_t size)
{
        int fd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

        if (fd >= 0 && size)
                (void)ftruncate(fd, (off_t)(size & 0xffffff));
        return fd;
}

int fuzz_make_fd(uint8_t byte)
{
        unsigned kind = byte & 15, param = byte >> 4;
        const unsigned sealed = F_SEAL_SHRINK | F_SEAL_GROW;
        uint64_t size = size_class(param);
        static const uint64_t big[4] = {
                UINT64_C(1) << 40,
                (UINT64_C(1) << 40) + 4096,
                UINT64_C(1) << 50,
                3,
        };

        switch (kind) {
        case FUZZ_FD_MEMFD:
                return memfd(size, sealed | (param & 8 ? F_SEAL_WRITE : 0), true);
        case FUZZ_FD_MEMFD_RO:
                return reopen(memfd(size, sealed, true), O_RDONLY);
        case FUZZ_FD_MEMFD_WO:
                return reopen(memfd(size, sealed, true), O_WRONLY);
        case FUZZ_FD_UNSEALED:
                return memfd(size, param & 8 ? F_SEAL_SHRINK : 0, true);
        case FUZZ_FD_NOSEAL:
                return memfd(size, 0, false);
        case FUZZ_FD_EMPTY:
                return memfd(0, sealed, true);
        case FUZZ_FD_PIPE:
                return pipe_end(param & 1);
        case FUZZ_FD_SOCKET:
                return socket_end();
        case FUZZ_FD_DEVNULL:
                return open("/dev/null", O_RDWR | O_CLOEXEC);
        case FUZZ_FD_DIR:
                return open("/", (param & 1 ? O_PATH : O_RDONLY | O_DIRECTORY) | O_CLOEXEC);
        case FUZZ_FD_EVENTFD:
                return eventfd(0, EFD_CLOEXEC);
        case FUZZ_FD_TMPFILE:
                return tmpfile_fd(size);
        case FUZZ_FD_FUTURE:
                return memfd(size, sealed | F_SEAL_FUTURE_WRITE, true);
        case FUZZ_FD_TIMERFD:
                return timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
        case FUZZ_FD_UNBOUND:
                return socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        case FUZZ_FD_MEMFD_BIG:
        default:
                return memfd(big[param & 3], sealed, true);
        }
}
