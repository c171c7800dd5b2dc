/* SPDX-License-Identifier: MIT */
/*
 * What every suite may need, unit suites included (nothing here links libdlx):
 * an assertion for hot loops, a portable RNG, array lengths, open fds and
 * memfds. After libuv's test/task.h. Integration helpers are in fixture.h,
 * the raw protocol peer in rawpeer.h.
 */
#ifndef DLX_TESTS_TOOLKIT_H
#define DLX_TESTS_TOOLKIT_H

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/*
 * TOOLKIT_SANITIZED: 1 when a sanitizer owns malloc (AddressSanitizer,
 * ThreadSanitizer, MemorySanitizer), where an interposed malloc or a preload
 * cannot work. RUNNING_ON_VALGRIND: valgrind's own test, 0 without its header.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TOOLKIT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                         \
        __has_feature(memory_sanitizer)
#define TOOLKIT_SANITIZED 1
#endif
#endif
#ifndef TOOLKIT_SANITIZED
#define TOOLKIT_SANITIZED 0
#endif
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

/*
 * A table-driven test: fn runs once a row of the static array rows, as its
 * own case (Check names the row's index, _i, in a failure).
 */
#define tcase_add_rows(tc, fn, rows) tcase_add_loop_test((tc), (fn), 0, (int)N_ELEMS(rows))

/*
 * For hot loops: every passing ck_assert*() writes a location record to
 * Check's log, which made the randomized tests spend most of their time in
 * write(2). This one only reaches Check when the condition fails.
 */
#define expect(cond, fmt, ...)                                                                     \
        do {                                                                                       \
                if (!(cond))                                                                       \
                        ck_abort_msg("expected %s: " fmt, #cond, __VA_ARGS__);                     \
        } while (0)

/* splitmix64: our own generator, so that a seed gives the same sequence on every libc. */
static inline uint64_t rng_next(uint64_t *state)
{
        uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);

        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
}

/* A number in [0, n), n > 0 (with the modulo's slight bias, harmless here). */
static inline uint64_t rng_below(uint64_t *state, uint64_t n)
{
        return rng_next(state) % n;
}

/* Open fds of a process (0: this one), or -1. */
static inline int count_fds(pid_t pid)
{
        char path[64];
        struct dirent *d;
        DIR *dir;
        int n = 0;

        if (pid)
                snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
        else
                snprintf(path, sizeof(path), "/proc/self/fd");
        dir = opendir(path);
        if (!dir)
                return -1;
        while ((d = readdir(dir)))
                if (d->d_name[0] != '.')
                        n++;
        closedir(dir);
        /* opendir's own fd is counted for ourselves */
        return pid ? n : n - 1;
}

static inline bool fd_is_open(int fd)
{
        return fcntl(fd, F_GETFD) != -1;
}

/*
 * A memfd (close-on-exec, sealing allowed) of size bytes with exactly the
 * given seals (0: none); the test fails if it cannot be had.
 */
static inline int make_memfd(uint64_t size, int seals)
{
        int fd = memfd_create("dlx-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
        if (seals)
                ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
        return fd;
}

/* The same, sealed against resizing only: what the daemon requires of a segment. */
static inline int sealed_memfd(uint64_t size)
{
        return make_memfd(size, F_SEAL_SHRINK | F_SEAL_GROW);
}

#endif /* DLX_TESTS_TOOLKIT_H */
