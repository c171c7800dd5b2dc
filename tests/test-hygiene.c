/* SPDX-License-Identifier: MIT */
/*
 * dlxd's own hygiene: a libuv handle it cannot set up makes it exit 1 with a
 * message, never run half set up or crash; a handle it leaves open at exit
 * makes it exit 1 naming the handle, so that every suite (whose fixture
 * requires exit 0) notices a leak.
 *
 * The faults come from tests/uvfault.c, preloaded into dlxd (DLX_UVFAULT).
 * Preloading does not mix with sanitizers or valgrind: skipped (77) there.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"

struct run {
        int status;     /* exit status, 128 + signal, or -1 when it did not end in time */
        char err[8192]; /* its stderr */
};

/*
 * Runs dlxd with DLX_UVFAULT=fault preloaded; stops it with SIGTERM once
 * ready, if it gets there. Fails the test if it neither ends nor gets ready.
 */
static void run_dlxd(const char *fault, struct run *ret)
{
        char dir[] = "/tmp/dlx-hygiene-XXXXXX", sock[128], readyfd[16];
        int ready[2], errp[2], status;
        struct pollfd pfd;
        size_t got = 0;
        ssize_t n;
        pid_t pid;
        char byte;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(sock, sizeof(sock), "%s/dlxd.sock", dir);
        ck_assert_int_eq(pipe2(ready, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(errp, O_CLOEXEC), 0);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                if (dup2(ready[1], 3) < 0 || dup2(errp[1], 2) < 0)
                        _exit(127);
                snprintf(readyfd, sizeof(readyfd), "3");
                setenv("LD_PRELOAD", getenv("DLX_TEST_UVFAULT"), 1);
                setenv("DLX_UVFAULT", fault, 1);
                execl(getenv("DLXD"), "dlxd", "--socket", sock, "--ready-fd", readyfd,
                      (char *)NULL);
                _exit(127);
        }
        close(ready[1]);
        close(errp[1]);
        pfd = (struct pollfd){.fd = ready[0], .events = POLLIN};
        if (poll(&pfd, 1, 10000) == 1 && read(ready[0], &byte, 1) == 1)
                kill(pid, SIGTERM);
        close(ready[0]);
        while (got < sizeof(ret->err) - 1 &&
               (n = read(errp[0], ret->err + got, sizeof(ret->err) - 1 - got)) > 0)
                got += (size_t)n;
        ret->err[got] = '\0';
        close(errp[0]);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ret->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        unlink(sock);
        rmdir(dir);
}

static bool preloadable(void)
{
        return !TOOLKIT_SANITIZED && !getenv("DLX_TEST_VALGRIND") && getenv("DLX_TEST_UVFAULT");
}

/* Each handle dlxd sets up, failing in turn: exit 1, a reason, nothing left open. */
START_TEST(failed_inits_exit_cleanly)
{
        static const char *const faults[] = {
                "loop:1", "signal:1", "signal:2", "poll:1", "poll:2",
                "poll:3", "poll:4",   "timer:1",  "idle:1", "idle:2",
        };
        struct run r;

        if (!preloadable())
                return;
        for (size_t i = 0; i < N_ELEMS(faults); i++) {
                run_dlxd(faults[i], &r);
                ck_assert_msg(r.status == 1, "%s: dlxd ended with %d: %s", faults[i], r.status,
                              r.err);
                ck_assert_msg(strstr(r.err, "cannot"), "%s: no reason given: %s", faults[i], r.err);
                ck_assert_msg(!strstr(r.err, "still open"), "%s: a handle leaked: %s", faults[i],
                              r.err);
        }
        /* and with nothing failing, the same run ends 0 */
        run_dlxd("none:1", &r);
        ck_assert_msg(r.status == 0, "dlxd ended with %d: %s", r.status, r.err);
}
END_TEST

/* A handle left open at exit is named, and the exit status says so. */
START_TEST(leaked_handle_fails_the_exit)
{
        struct run r;

        if (!preloadable())
                return;
        run_dlxd("leak", &r);
        ck_assert_msg(r.status == 1, "dlxd leaked a handle and ended with %d: %s", r.status, r.err);
        ck_assert_msg(strstr(r.err, "idle handle is still open"), "not named: %s", r.err);
}
END_TEST

Suite *hygiene_suite(void)
{
        Suite *s = suite_create("hygiene");
        TCase *tc = tcase_create("uv");

        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, failed_inits_exit_cleanly);
        tcase_add_test(tc, leaked_handle_fails_the_exit);
        suite_add_tcase(s, tc);
        return s;
}
