/* SPDX-License-Identifier: MIT */
/*
 * idle: what waiting costs. A dlxd that nobody asks anything should not run, and
 * neither should a client blocked in a wait. This connects IDLE_CLIENTS clients
 * (each published a tensor, acquired and released it, half of them watch a
 * prefix), clients blocked in dlx_acquire() on a version that never comes and in
 * dlx_next_event() on a watch that never fires, lets them settle, and then
 * counts, over a window (10 s, --quick 1 s), the CPU time and the times each
 * process ran (context switches): dlxd's, and each blocked client's. Blocked
 * clients come in two kinds: with the default timeout_ms, which pings a silent
 * daemon once per timeout (10 s) to see it is still there ("no call waits
 * forever"), and with timeout_ms < 0, which never looks.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench.h"

#define IDLE_CLIENTS 64
/* After the last client is ready: the daemon takes deferred releases within ~20 ms. */
#define SETTLE_MS 500
#define LONG_MS 600000

static void sleep_ms(long ms)
{
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

/* A connected client that has done something (published, acquired, released; watches if odd),
 * then waits on its control socket, not on the daemon, until the parent says stop. */
static int sitter(int ctl, void *arg)
{
        long i = (long)(intptr_t)arg;
        int64_t shape[1] = {64};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};
        DLManagedTensorVersioned *t = NULL;
        char name[128];
        uint64_t stop;
        dlx_client *c = bench_connect("bench-idle");
        int err;

        proto.shape = shape;
        if (!c)
                return 1;
        bench_name(name, sizeof(name), "idle/%ld", i);
        err = dlx_alloc(c, &proto, &t);
        if (err == 0)
                err = dlx_publish(c, name, t, NULL, NULL);
        if (err == 0)
                err = dlx_acquire(c, name, NULL, &t);
        if (err == 0) {
                t->deleter(t);
                if (i % 2)
                        err = dlx_watch(c, name, NULL);
        }
        if (err < 0) {
                dlx_close(c);
                return dlx_fail("idle: a client's setup", err) < 0;
        }
        err = msg_send(ctl, 1);
        if (err == 0)
                err = msg_recv(ctl, &stop, LONG_MS);
        dlx_close(c);
        return err < 0;
}

/* How a blocked client waits: in acquire or next_event, pinging a silent daemon or not. */
struct how {
        bool in_acquire;
        bool no_timeout;
};

/* Blocked in the daemon's call until the parent kills it. */
static int blocked(int ctl, void *arg)
{
        const struct how *how = arg;
        bool in_acquire = how->in_acquire;
        struct dlx_connect_options co = {.socket_path = opt.socket,
                                         .client_name = "bench-idle-blocked",
                                         .timeout_ms = how->no_timeout ? -1 : 0};
        dlx_client *c = NULL;
        char name[128];
        int err;

        err = dlx_connect(&co, &c);
        if (err < 0)
                return dlx_fail("idle: connect", err) < 0;
        bench_name(name, sizeof(name), "idle-never/%s%s", in_acquire ? "acquire" : "event",
                   how->no_timeout ? "-nt" : "");
        if (!in_acquire && (err = dlx_watch(c, name, NULL)) < 0)
                return dlx_fail("idle: dlx_watch", err) < 0;
        if (msg_send(ctl, 1) < 0)
                return 1;
        if (in_acquire) {
                struct dlx_acquire_options o = {.timeout_ms = -1, .min_version = 1};
                DLManagedTensorVersioned *t;
                err = dlx_acquire(c, name, &o, &t);
                dlx_fail("idle: dlx_acquire returned", err);
        } else {
                struct dlx_event ev;
                err = dlx_next_event(c, &ev, -1);
                dlx_fail("idle: dlx_next_event returned", err);
        }
        return 1; /* it should not have returned */
}

struct probe {
        pid_t pid;
        uint64_t cpu;
        long runs;
};

static void probe_start(struct probe *p, pid_t pid)
{
        p->pid = pid;
        p->cpu = cpu_ns(pid);
        p->runs = switches(pid);
}

/* CPU ns and runs since probe_start() into p. */
static void probe_end(struct probe *p)
{
        long runs = switches(p->pid);

        p->cpu = cpu_ns(p->pid) - p->cpu;
        p->runs = runs < 0 || p->runs < 0 ? -1 : runs - p->runs;
}

int run_idle(void)
{
        static const struct how hows[4] = {
                {true, false}, {false, false}, {true, true}, {false, true}};
        static const char *const labels[4][2] = {
                {"blocked in acquire: CPU", "blocked in acquire: ran"},
                {"blocked in next_event: CPU", "blocked in next_event: ran"},
                {"... timeout_ms < 0, acquire: CPU", "... timeout_ms < 0, acquire: ran"},
                {"... timeout_ms < 0, next_event: CPU", "... timeout_ms < 0, next_event: ran"},
        };
        static struct child kids[IDLE_CLIENTS], waits[4];
        long window_ms = opt.quick ? 1000 : 10000;
        struct probe d, pw[4];
        uint64_t ready, t0;
        double secs, pinging = 0, silent = 0;
        int started = 0, nwaits = 0, err = 0;
        char key[32];

        report_heading("idle", "nothing asked: CPU and times run over the window, per process");
        if (opt.daemon_pid <= 0) {
                report_skip("idle", "", "dlxd's pid is unknown");
                return 0;
        }
        for (; started < IDLE_CLIENTS && err == 0; started++)
                err = child_start(&kids[started], "idle client", sitter, (void *)(intptr_t)started);
        for (; nwaits < 4 && err == 0; nwaits++)
                err = child_start(&waits[nwaits], "blocked client", blocked, (void *)&hows[nwaits]);
        if (err < 0) {
                report_error("idle", "fork failed");
                goto out;
        }
        for (int i = 0; i < started && err == 0; i++)
                err = msg_recv(kids[i].ctl, &ready, 30000);
        for (int i = 0; i < nwaits && err == 0; i++)
                err = msg_recv(waits[i].ctl, &ready, 30000);
        if (err < 0) {
                report_error("idle", "a client did not become ready (%s)", strerror(-err));
                goto out;
        }
        /* the blocked calls are sent and answered with nothing: give them time to block */
        sleep_ms(SETTLE_MS);
        t0 = now_ns();
        probe_start(&d, opt.daemon_pid);
        for (int i = 0; i < 4; i++)
                probe_start(&pw[i], waits[i].pid);
        sleep_ms(window_ms);
        probe_end(&d);
        for (int i = 0; i < 4; i++)
                probe_end(&pw[i]);
        secs = (double)(now_ns() - t0) / 1e9;
        report_value("idle", "dlxd_cpu", "dlxd, 64 clients connected: CPU",
                     100.0 * (double)d.cpu / 1e9 / secs, "% of a CPU", 0, NULL);
        report_value("idle", "dlxd_runs", "dlxd: times it ran", (double)d.runs / secs, "per s", 0,
                     NULL);
        for (int i = 0; i < 4; i++) {
                snprintf(key, sizeof(key), "blocked_%d_cpu", i);
                report_value("idle", key, labels[i][0], (double)pw[i].cpu / 1e3 / secs, "us per s",
                             0, NULL);
                snprintf(key, sizeof(key), "blocked_%d_runs", i);
                report_value("idle", key, labels[i][1], (double)pw[i].runs / secs, "per s", 0,
                             NULL);
                if (hows[i].no_timeout)
                        silent += (double)pw[i].runs;
                else if ((double)pw[i].runs / secs > pinging)
                        pinging = (double)pw[i].runs / secs;
        }
        report_target("idle_dlxd", "idle dlxd with 64 clients < 0.5% of a CPU",
                      100.0 * (double)d.cpu / 1e9 / secs, true, 0.5, "%");
        report_target("idle_blocked", "blocked clients (timeout_ms < 0) run (times in window)",
                      silent, true, 0, "runs");
        /* its liveness ping: a send, then a wake for the pong, once per 10 s of silence */
        report_target("idle_pinging", "blocked clients (10 s timeout) run <= 0.3 per s, most",
                      pinging, true, 0.3, "per s");
out:
        for (int i = 0; i < nwaits; i++)
                child_kill(&waits[i]);
        for (int i = 0; i < started; i++)
                if (kids[i].pid > 0 && msg_send(kids[i].ctl, 1) == 0 &&
                    child_done(&kids[i], 30000, "idle") < 0)
                        err = -1;
        for (int i = 0; i < started; i++)
                child_kill(&kids[i]);
        return err < 0 ? -1 : 0;
}
