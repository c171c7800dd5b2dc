/* SPDX-License-Identifier: MIT */
/*
 * A client whose own process runs out: of memory while it reads a reply, of
 * descriptors while the daemon passes it one. Neither is the daemon's fault,
 * so neither may be reported as -EPROTO; a reply whose loss leaves the
 * client and the daemon agreeing fails only its own call.
 *
 * This executable interposes malloc and calloc over glibc's (__libc_*), to
 * fail chosen attempts made by the calling thread. AddressSanitizer and
 * valgrind own the allocator: the cases that need it are left out there.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"
#include "toolkit.h"

#if !TOOLKIT_SANITIZED
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);

/* The calling thread's next allocation attempts to skip, then the one to fail (0: none). */
static __thread unsigned skip, fail_one;

static bool fails_now(void)
{
        if (!fail_one)
                return false;
        if (skip) {
                skip--;
                return false;
        }
        fail_one = 0;
        return true;
}

void *malloc(size_t size)
{
        if (fails_now()) {
                errno = ENOMEM;
                return NULL;
        }
        return __libc_malloc(size);
}

void *calloc(size_t n, size_t size)
{
        if (fails_now()) {
                errno = ENOMEM;
                return NULL;
        }
        return __libc_calloc(n, size);
}
#endif

/*
 * A list whose reply cannot be decoded for want of memory fails alone with
 * -ENOMEM, whichever allocation fails, and the client goes on (dlx_list
 * returns how many entries it gave).
 */
#if !TOOLKIT_SANITIZED
static int count_entries(void *ctx, const struct dlx_info *info)
{
        (void)info;
        (*(int *)ctx)++;
        return 0;
}
#endif

START_TEST(out_of_memory_reading_a_list_fails_only_the_list)
{
#if !TOOLKIT_SANITIZED
        dlx_client *c = fx_connect(&fx, "nomem");
        int failed = 0;

        publish_ok(c, "nomem/a", fx_plain_f32(4, 0, NULL), NULL, NULL);
        publish_ok(c, "nomem/b", fx_plain_f32(4, 0, NULL), NULL, NULL);
        for (unsigned n = 0; n < 64; n++) {
                int entries = 0, err;

                skip = n;
                fail_one = 1;
                err = dlx_list(c, "nomem/", count_entries, &entries);
                bool reached = fail_one == 0;
                fail_one = 0;
                if (!reached) {
                        ck_assert_int_eq(err, 2);
                        break; /* every allocation of a list has been failed once */
                }
                ck_assert_msg(err == 2 || err == -ENOMEM, "allocation %u failed: list gave %d (%s)",
                              n, err, dlx_last_error());
                if (err == -ENOMEM) {
                        failed++;
                        expect_last_error("out of memory");
                }
                ck_assert_msg(dlx_ping(c) == 0, "after allocation %u failed: %s", n,
                              dlx_last_error());
                entries = 0;
                ck_assert_int_eq(dlx_list(c, "nomem/", count_entries, &entries), 2);
                ck_assert_int_eq(entries, 2);
        }
        ck_assert_int_gt(failed, 0);
        ck_assert_int_eq(dlx_unpublish(c, "nomem/a"), 0);
        ck_assert_int_eq(dlx_unpublish(c, "nomem/b"), 0);
        dlx_close(c);
#endif
}
END_TEST

/* In a child: it changes its own descriptor limit. */
static int acquire_at_the_fd_limit(void *arg)
{
        struct rlimit rl;
        dlx_client *c = fx_connect(&fx, "emfile");
        DLManagedTensorVersioned *t = NULL;
        int top = -1, err;

        (void)arg;
        /* every descriptor up to a limit just above the highest open one is taken */
        for (int fd = 0; fd < 4096; fd++)
                if (fcntl(fd, F_GETFD) >= 0)
                        top = fd;
        for (int fd = 0; fd < top; fd++)
                if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDONLY | O_CLOEXEC) != fd)
                        return 10;
        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
        rl.rlim_cur = (rlim_t)top + 1;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
        /* the limit holds: not one descriptor more */
        int probe = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (probe >= 0 || errno != EMFILE) {
                fprintf(stderr, "RLIMIT_NOFILE %d does not hold: open gave %d\n", top + 1, probe);
                return 14;
        }

        err = dlx_acquire(c, "emfile/a", NULL, &t);
        if (err != -EMFILE || !strstr(dlx_last_error(), "descriptor limit")) {
                fprintf(stderr, "acquire at the limit: %d (%s)\n", err, dlx_last_error());
                return 11;
        }
        /* the connection is closed, and says why, not that the daemon misbehaved */
        rl.rlim_cur = rl.rlim_max;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
        err = dlx_ping(c);
        if (err != -EMFILE || !strstr(dlx_last_error(), "descriptor limit")) {
                fprintf(stderr, "ping after: %d (%s)\n", err, dlx_last_error());
                return 12;
        }
        dlx_close(c);
        /* a new connection works */
        c = fx_connect(&fx, "emfile-again");
        t = acquire_ok(c, "emfile/a", NULL);
        if (!fx_vec_is(t, 8, 3))
                return 13;
        t->deleter(t);
        dlx_close(c);
        return 0;
}

START_TEST(descriptor_limit_is_not_a_protocol_error)
{
        dlx_client *p = fx_connect(&fx, "producer");

        publish_ok(p, "emfile/a", fx_vec_f32(p, 8, 3), NULL, NULL);
        ck_assert_int_eq(fx_wait(fx_spawn(acquire_at_the_fd_limit, NULL)), 0);
        ck_assert_int_eq(dlx_unpublish(p, "emfile/a"), 0);
        dlx_close(p);
}
END_TEST

Suite *exhaustion_suite(void)
{
        Suite *s = suite_create("exhaustion");
        TCase *tc = tcase_create("client");

        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        if (!TOOLKIT_SANITIZED && !RUNNING_ON_VALGRIND)
                tcase_add_test(tc, out_of_memory_reading_a_list_fails_only_the_list);
        /* valgrind keeps descriptor limits of its own: setrlimit() does not bind there */
        if (!RUNNING_ON_VALGRIND)
                tcase_add_test(tc, descriptor_limit_is_not_a_protocol_error);
        suite_add_tcase(s, tc);
        return s;
}
