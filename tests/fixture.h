/* SPDX-License-Identifier: MIT */
/*
 * Integration-test helpers: a real dlxd per test in a mkdtemp directory,
 * readiness signalled on an inherited pipe (no sleeps, no log scraping),
 * stopped with SIGTERM and required to exit 0, with open fds counted in the
 * test process and in the daemon before and after.
 *
 * Environment: DLXD (path of the daemon binary, set by meson),
 * DLX_TEST_LOG (the daemon's --log-level, default "notice").
 */
#ifndef DLX_TESTS_FIXTURE_H
#define DLX_TESTS_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <dlx/dlx.h>

#include "toolkit.h"

struct dlxd_fixture {
        char dir[64];
        char socket[108];
        pid_t pid;
        int self_fds;   /* open fds of the test process before the daemon started */
        int daemon_fds; /* open fds of the daemon once ready */
};

/* The fixture of the running test (checked fixtures take no arguments). */
extern struct dlxd_fixture fx;

/* Words of DLX_TEST_DAEMON_WRAPPER taken at most, before dlxd's own arguments. */
#define FX_WRAPPER_WORDS 24
/*
 * The start of dlxd's argv: the words of DLX_TEST_DAEMON_WRAPPER (valgrind and
 * its options, space-separated; none when unset), then $DLXD, for execvp().
 * words holds the wrapper's words. Returns how many entries were set.
 */
int fx_daemon_argv(const char **argv, char *words, size_t wsz);

/* Starts dlxd with extra arguments (NULL-terminated, may be NULL); fails the test on error. */
void dlxd_start(struct dlxd_fixture *f, const char *const *extra);
/*
 * Starts dlxd again in f's directory, on the same socket path, after the test
 * ended the previous one itself (signalled and reaped it, then set f->pid to
 * 0). The fd count of the test process taken by dlxd_start() stays the one
 * dlxd_stop() compares with.
 */
void dlxd_restart(struct dlxd_fixture *f, const char *const *extra);
/*
 * Removes every name still published, waits for the daemon's fd count to
 * return to its baseline, stops it with SIGTERM, asserts exit status 0 and
 * that the test process has as many fds open as before dlxd_start().
 */
void dlxd_stop(struct dlxd_fixture *f);

/*
 * dlxd_start() for a daemon whose soft and hard RLIMIT_NOFILE are at most
 * limit (set from outside, as dlxd raises its soft limit at start); returns
 * the limit it runs with, at most 70000.
 */
long dlxd_start_fd_limit(struct dlxd_fixture *f, rlim_t limit);

/* Stops f's daemon with SIGSTOP and waits until it is stopped (SIGCONT resumes it). */
void fx_stop_daemon(const struct dlxd_fixture *f);

/*
 * A failing check ends a forked test without its checked teardown, and the
 * dlxd it started would live on. Between fx_reaper_init() and fx_reaper_run()
 * (a TCase's unchecked fixture) every daemon started is recorded in a page
 * shared with the runner, and fx_reaper_run() kills whatever still runs.
 */
void fx_reaper_init(void);
void fx_reaper_run(void);

/* Checked-fixture wrappers around fx. */
void fx_setup(void);
void fx_teardown(void);

/* Polls until the daemon has n fds open, up to timeout_ms; returns the last count. */
int wait_daemon_fds(const struct dlxd_fixture *f, int n, int timeout_ms);

/* Connects to f's daemon or fails the test. */
dlx_client *fx_connect(const struct dlxd_fixture *f, const char *name);

/* Runs fn(arg) in a child process; the child exits with fn's return value. */
pid_t fx_spawn(int (*fn)(void *arg), void *arg);
/*
 * How a forked child (without exec) ends: _exit(status), except under valgrind,
 * where it leaves by exec so that memcheck does not report the parent's heap
 * as the child's leaks (status 99 if the child made a memory error).
 */
void fx_child_exit(int status) __attribute__((noreturn));
/* Waits for a child; returns its exit status, or 128 + signal. */
int fx_wait(pid_t pid);

/* A 1-D float32 tensor of n elements from dlx_alloc() (the test fails if it cannot be had). */
DLManagedTensorVersioned *fx_alloc_f32(dlx_client *c, int64_t n);
/*
 * A 1-D float32 vector of n elements in plain heap memory, element i = base + i:
 * published by copy. Its deleter adds one to *deleted (when not NULL).
 */
DLManagedTensorVersioned *fx_plain_f32(int64_t n, float base, int *deleted);
/* fx_alloc_f32() with element i = base + i. */
DLManagedTensorVersioned *fx_vec_f32(dlx_client *c, int64_t n, float base);
/*
 * Wraps inner (ownership taken) so that its deletion adds one to *count,
 * atomically: the counter may be shared with other processes.
 */
DLManagedTensorVersioned *fx_counted(DLManagedTensorVersioned *inner, int *count);
/* Whether t is a 1-D float32 vector of n elements, element i = base + i. */
bool fx_vec_is(const DLManagedTensorVersioned *t, int64_t n, float base);

/* dlx_publish() (o and ret_version may be NULL); the test fails if it does. */
void publish_ok(dlx_client *c, const char *name, DLManagedTensorVersioned *t,
                const struct dlx_publish_options *o, uint64_t *ret_version);
/* dlx_acquire() (o may be NULL); the test fails if it does. */
DLManagedTensorVersioned *acquire_ok(dlx_client *c, const char *name,
                                     const struct dlx_acquire_options *o);
/* dlx_track() (the track, never 0), and dlx_track_version(); the test fails if they do. */
uint32_t track_ok(dlx_client *c, const char *name);
uint64_t tracked_version(dlx_client *c, uint32_t track);
/* The thread's dlx_last_error() contains what; else the test fails, showing it. */
void expect_last_error(const char *what);

/* Milliseconds on the monotonic clock; a nap. */
int64_t fx_now_ms(void);
/*
 * How much slower than usual the test and its daemon run: 10 under valgrind
 * (DLX_TEST_VALGRIND), else 1. For the few tests that a slow test process
 * would fail by itself, e.g. a reader meant to be slow but not that slow.
 */
int fx_slowdown(void);
void fx_sleep_ms(int ms);

/* A raw connected socket to f's daemon (no hello sent). */
int fx_raw_connect(const struct dlxd_fixture *f);

/* The daemon's stats through c (the test fails if it cannot have them). */
struct dlx_stats fx_stats(dlx_client *c);
/* Polls the daemon's stats until clients == n, up to timeout_ms; returns the last count. */
uint32_t fx_wait_clients(dlx_client *c, uint32_t n, int timeout_ms);

/* Polls the daemon's stats until leases == n, up to timeout_ms; returns the last count. */
long fx_wait_leases(dlx_client *c, unsigned long long n, int timeout_ms);

#endif /* DLX_TESTS_FIXTURE_H */
