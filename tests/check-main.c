/* SPDX-License-Identifier: MIT */
/*
 * One main for every Check binary: the build names the suite with
 * -DDLX_SUITE=<area>_suite. Exit status: 0 all passed, 1 a failure,
 * 77 (meson's skip) when the suite's setup says this host has nothing to test.
 *
 * Every suite, unit suites included, also gets a check that it leaks no file
 * descriptor. Check runs each test in a child of this process (CK_FORK, the
 * default), so the count is taken in two places:
 *  - in each test's child, from the fork to its exit (after the checked
 *    teardown): more fds at the end makes the test an error ("Early exit");
 *  - here around srunner_run_all(), for what stays in this process: unchecked
 *    fixtures, and every test when CK_FORK=no.
 * What the code under test keeps open for the life of the process by design
 * (libuv's signal pipe) is no leak: a suite that has such fds defines
 * suite_open_process_fds() to open them before anything is counted.
 */
#include <check.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "toolkit.h"

Suite *DLX_SUITE(void);
void suite_open_process_fds(void) __attribute__((weak));

#define STRING(x) #x
#define NAME_OF(x) STRING(x)
#define DLX_SUITE_NAME NAME_OF(DLX_SUITE)

static pid_t main_pid;
static int test_child_fds = -1; /* in a test's child: fds open at the fork */

static void list_fds(void)
{
        char path[300], target[PATH_MAX];
        struct dirent *d;
        DIR *dir = opendir("/proc/self/fd");

        if (!dir)
                return;
        while ((d = readdir(dir))) {
                ssize_t n;

                if (d->d_name[0] == '.' || atoi(d->d_name) == dirfd(dir))
                        continue;
                snprintf(path, sizeof(path), "/proc/self/fd/%s", d->d_name);
                n = readlink(path, target, sizeof(target) - 1);
                target[n < 0 ? 0 : n] = '\0';
                fprintf(stderr, "  fd %s -> %s\n", d->d_name, target);
        }
        closedir(dir);
}

/* Only Check forks from this process while the tests run: a child of it is a test. */
static void on_fork_child(void)
{
        test_child_fds = getppid() == main_pid ? count_fds(0) : -1;
}

static void on_test_exit(void)
{
        int now;

        if (test_child_fds < 0 || getpid() == main_pid)
                return;
        now = count_fds(0);
        if (now <= test_child_fds)
                return;
        fprintf(stderr, "%s: the test left %d fd(s) open (%d at its start, %d at its end):\n",
                DLX_SUITE_NAME, now - test_child_fds, test_child_fds, now);
        list_fds();
        _exit(EXIT_FAILURE);
}

int main(void)
{
        SRunner *sr = srunner_create(DLX_SUITE());
        int failed, before, after;

        main_pid = getpid();
        if (suite_open_process_fds)
                suite_open_process_fds();
        if (srunner_fork_status(sr) == CK_FORK) {
                pthread_atfork(NULL, NULL, on_fork_child);
                atexit(on_test_exit);
        }
        before = count_fds(0);
        srunner_run_all(sr, CK_NORMAL);
        after = count_fds(0);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        if (after > before) {
                fprintf(stderr, "%s: %d fd(s) open after the suite, %d before:\n", DLX_SUITE_NAME,
                        after, before);
                list_fds();
                return EXIT_FAILURE;
        }
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
