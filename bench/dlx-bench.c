/* SPDX-License-Identifier: MIT */
/*
 * dlx-bench: latency, size independence and throughput of dlx, each as a ratio
 * to a floor of the same machine measured in the same run.
 *
 * Method. A small shared machine drifts by 3x within a minute, so a floor taken
 * once at the start says little about a measurement taken later. Every latency
 * measurement therefore runs in PACE_BLOCKS blocks, each preceded by a block of
 * floor samples from a floor service (an echo process and a client process that
 * live through the run), and its ratio is its median over the median of those
 * floor samples. Latency processes (and dlxd) are pinned (--pin) because a round
 * trip's cost depends threefold on whether its two ends share a CPU. Producers,
 * consumers, servers and clients are each a child process with its own client;
 * the parent only orchestrates and never initialises libdlx or CUDA itself.
 *
 * Scenarios (in this order): floor, scale (daemon RSS per entry, list), hot
 * (acquire + release of a mapped segment, per size), cold (first acquire of a
 * new segment), publish (zero-copy vs one copy), watch (publish-to-event),
 * watches (publish while many watches match nothing), throughput (1..64
 * consumers vs an epoll echo server), exchange (the DLPackExchangeAPI slots),
 * cuda (with --cuda; skipped without a driver). placement (after watch) runs the
 * round trip, ping, hot 4 KiB and a hand-off against a 3-process relay in every
 * placement --pin asks for (by default all three: same, split and none).
 *
 * This file holds the options, the daemon's lifetime and cleanup on every path.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "units.h"

#ifndef DLXD_PATH
#define DLXD_PATH "dlxd"
#endif

struct options opt;

/* Ours to clean up, also from a signal handler. */
static volatile pid_t daemon_pid;
static char tmpdir[64];
static char socket_path[108];

static void usage(FILE *f)
{
        fprintf(f,
                "Usage: dlx-bench [OPTIONS]\n"
                "Measures dlx against the machine's own floor, in the same run: every figure\n"
                "is also given as a ratio to an AF_UNIX round trip, an fd-passing round trip,\n"
                "memcpy bandwidth or a bare epoll echo server.\n"
                "\n"
                "  --quick             tiny counts and durations, at most 1 MiB tensors\n"
                "  --json              print one JSON object (and nothing else) on stdout\n"
                "  --socket PATH       use the dlxd listening there instead of starting one\n"
                "  --dlxd PATH         the dlxd to start (default: $DLXD, else %s)\n"
                "  --max-size BYTES    largest tensor to use (suffixes K, M, G; default 1G)\n"
                "  --only LIST         scenarios to run, comma-separated: floor, scale, hot,\n"
                "                      cold, publish, watch, placement, watches, throughput,\n"
                "                      exchange, track, group, federation, idle, cuda\n"
                "  --iterations N      timed samples per latency measurement (default 10000)\n"
                "  --duration SECONDS  length of each throughput run (default 2)\n"
                "  --pin MODE          where latency measurements and servers run: same\n"
                "                      (one CPU for all, stable figures), split (clients on\n"
                "                      one CPU, dlxd and echo servers on another: adds the\n"
                "                      machine's cross-CPU wake-up), none (the scheduler's\n"
                "                      choice: what users get) or all (the default: the\n"
                "                      placement scenario runs in each of the three, the\n"
                "                      others on one CPU as with same)\n"
                "  --cuda              also run the CUDA scenario (skipped without a driver)\n"
                "  -h, --help          show this help\n",
                DLXD_PATH);
}

static const struct {
        const char *name;
        unsigned bit;
} scenario_names[] = {
        {"floor", SC_FLOOR},     {"scale", SC_SCALE},           {"hot", SC_HOT},
        {"cold", SC_COLD},       {"publish", SC_PUBLISH},       {"watch", SC_WATCH},
        {"watches", SC_WATCHES}, {"throughput", SC_THROUGHPUT}, {"exchange", SC_EXCHANGE},
        {"cuda", SC_CUDA},       {"placement", SC_PLACEMENT},   {"idle", SC_IDLE},
        {"track", SC_TRACK},     {"group", SC_GROUP},           {"federation", SC_FEDERATION},
};

static int parse_only(const char *s, unsigned *ret)
{
        char buf[256], *save = NULL, *tok;
        unsigned bits = 0;

        snprintf(buf, sizeof(buf), "%s", s);
        for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                size_t i;
                for (i = 0; i < sizeof(scenario_names) / sizeof(scenario_names[0]); i++)
                        if (strcmp(tok, scenario_names[i].name) == 0)
                                break;
                if (i == sizeof(scenario_names) / sizeof(scenario_names[0])) {
                        fprintf(stderr, "dlx-bench: unknown scenario '%s'\n", tok);
                        return -1;
                }
                bits |= scenario_names[i].bit;
        }
        if (!bits)
                return -1;
        *ret = bits;
        return 0;
}

/* ---- the daemon ------------------------------------------------------------------------- */

static void nap_ms(long ms)
{
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};

        nanosleep(&ts, NULL);
}

/*
 * SIGTERM, then up to 10 s, then SIGKILL; removes the socket and the directory.
 * Returns the wait status (0 when there was no daemon of ours), or -1 if it had to
 * be killed. Async-signal-safe.
 */
static int daemon_stop(void)
{
        pid_t pid = daemon_pid;
        int status = 0;

        if (pid > 0)
                kill(pid, SIGTERM);
        for (int i = 0; pid > 0 && i < 1000; i++) {
                pid_t r = waitpid(pid, &status, WNOHANG);
                if (r == pid || (r < 0 && errno != EINTR))
                        break;
                nap_ms(10);
                if (i == 999) {
                        kill(pid, SIGKILL);
                        waitpid(pid, &status, 0);
                        status = -1;
                }
        }
        daemon_pid = 0;
        if (socket_path[0])
                unlink(socket_path); /* dlxd removes it itself when it exits cleanly */
        if (tmpdir[0])
                rmdir(tmpdir);
        tmpdir[0] = '\0';
        return status;
}

static void on_signal(int sig)
{
        children_kill_all();
        daemon_stop();
        _exit(128 + sig);
}

static int daemon_start(void)
{
        char byte;
        struct pollfd pfd;
        int pipefd[2];
        pid_t pid;

        if (access(opt.dlxd, X_OK) != 0) {
                fprintf(stderr, "dlx-bench: cannot run dlxd at %s: %s (use --dlxd)\n", opt.dlxd,
                        strerror(errno));
                return -1;
        }
        snprintf(tmpdir, sizeof(tmpdir), "/tmp/dlx-bench-XXXXXX");
        if (!mkdtemp(tmpdir)) {
                fprintf(stderr, "dlx-bench: mkdtemp: %s\n", strerror(errno));
                tmpdir[0] = '\0';
                return -1;
        }
        snprintf(socket_path, sizeof(socket_path), "%s/dlxd.sock", tmpdir);
        if (pipe2(pipefd, O_CLOEXEC) < 0) {
                fprintf(stderr, "dlx-bench: pipe: %s\n", strerror(errno));
                return -1;
        }
        fflush(NULL);
        pid = fork();
        if (pid < 0) {
                fprintf(stderr, "dlx-bench: fork: %s\n", strerror(errno));
                close(pipefd[0]);
                close(pipefd[1]);
                return -1;
        }
        if (pid == 0) {
                const char *argv[] = {"dlxd", "--socket",    socket_path, "--ready-fd",
                                      "3",    "--log-level", "warning",   NULL};
                /* stop with us, however we end */
                prctl(PR_SET_PDEATHSIG, SIGTERM);
                signal(SIGINT, SIG_IGN); /* a ^C is ours to handle, with a SIGTERM */
                signal(SIGTERM, SIG_DFL);
                signal(SIGHUP, SIG_DFL);
                /* the write end, inherited without CLOEXEC as fd 3 */
                if (dup2(pipefd[1], 3) < 0)
                        _exit(127);
                execv(opt.dlxd, (char *const *)argv);
                _exit(127);
        }
        daemon_pid = pid;
        close(pipefd[1]);
        pfd.fd = pipefd[0];
        pfd.events = POLLIN;
        if (poll(&pfd, 1, 10000) != 1 || read(pipefd[0], &byte, 1) != 1) {
                fprintf(stderr, "dlx-bench: dlxd did not become ready\n");
                close(pipefd[0]);
                return -1;
        }
        close(pipefd[0]);
        opt.socket = socket_path;
        opt.daemon_pid = pid;
        opt.pin_daemon = true;
        pin_pid(pid, ROLE_SERVER);
        return 0;
}

/* The pid of whoever listens on opt.socket, or 0. */
static pid_t peer_pid(void)
{
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        struct ucred cred;
        socklen_t len = sizeof(cred);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        pid_t pid = 0;

        if (fd < 0)
                return 0;
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", opt.socket);
        if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
            getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
                pid = cred.pid;
        close(fd);
        return pid;
}

/* A child says hello to the daemon and brings back its version string. */
static int hello_child(int ctl, void *p)
{
        dlx_client *c = bench_connect("bench-hello");

        (void)ctl;
        if (!c)
                return 1;
        snprintf(p, sizeof(opt.server), "%s", dlx_server_version(c));
        dlx_close(c);
        return 0;
}

static int daemon_hello(void)
{
        char *server = shm_alloc(sizeof(opt.server));
        struct child ch;
        int rc = -1;

        if (server && child_start(&ch, "hello", hello_child, server) == 0 &&
            child_wait(&ch, 30000) == 0) {
                snprintf(opt.server, sizeof(opt.server), "%s", server);
                rc = 0;
        }
        shm_free(server, sizeof(opt.server));
        return rc;
}

static bool daemon_alive(void)
{
        static bool gone;
        int status;

        if (gone || daemon_pid <= 0)
                return !gone; /* not ours: its errors will show */
        if (waitpid(daemon_pid, &status, WNOHANG) == daemon_pid) {
                report_error("dlxd", "exited during the run (wait status 0x%x)", status);
                daemon_pid = 0;
                gone = true;
        }
        return !gone;
}

int main(int argc, char **argv)
{
        static const struct option longopts[] = {
                {"quick", no_argument, NULL, 'q'},
                {"json", no_argument, NULL, 'j'},
                {"socket", required_argument, NULL, 's'},
                {"dlxd", required_argument, NULL, 'd'},
                {"max-size", required_argument, NULL, 'm'},
                {"only", required_argument, NULL, 'o'},
                {"iterations", required_argument, NULL, 'i'},
                {"duration", required_argument, NULL, 'D'},
                {"cuda", no_argument, NULL, 'c'},
                {"pin", required_argument, NULL, 'p'},
                {"help", no_argument, NULL, 'h'},
                {0},
        };
        static const struct {
                unsigned bit;
                int (*run)(void);
                const char *name;
        } order[] = {
                {SC_FLOOR, run_floor, "floor"},
                {SC_SCALE, run_scale, "scale"},
                {SC_HOT, run_hot, "hot"},
                {SC_COLD, run_cold, "cold"},
                {SC_PUBLISH, run_publish, "publish"},
                {SC_WATCH, run_watch, "watch"},
                {SC_PLACEMENT, run_placement, "placement"},
                {SC_WATCHES, run_watches, "watches"},
                {SC_THROUGHPUT, run_throughput, "throughput"},
                {SC_EXCHANGE, run_exchange, "exchange"},
                {SC_TRACK, run_track, "track"},
                {SC_GROUP, run_group, "group"},
                {SC_FEDERATION, run_federation, "federation"},
                {SC_IDLE, run_idle, "idle"},
                {SC_CUDA, run_cuda, "cuda"},
        };
        const char *env = getenv("DLXD");
        bool have_max = false, have_iter = false, have_dur = false, cuda = false;
        struct sigaction sa;
        char *end;
        int c, failures, status;

        opt.only = ~0u & ~(unsigned)SC_CUDA;
        opt.placements = (1u << PIN_MODES) - 1;
        opt.dlxd = env && *env ? env : DLXD_PATH;
        while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
                switch (c) {
                case 'q':
                        opt.quick = true;
                        break;
                case 'j':
                        opt.json = true;
                        break;
                case 's':
                        opt.socket = optarg;
                        break;
                case 'd':
                        opt.dlxd = optarg;
                        break;
                case 'm':
                        if (units_parse_size(optarg, &opt.max_size) < 0 || opt.max_size == 0) {
                                fprintf(stderr, "dlx-bench: bad --max-size '%s'\n", optarg);
                                return 2;
                        }
                        have_max = true;
                        break;
                case 'o':
                        if (parse_only(optarg, &opt.only) < 0) {
                                fprintf(stderr, "dlx-bench: bad --only '%s'\n", optarg);
                                return 2;
                        }
                        break;
                case 'i':
                        errno = 0;
                        opt.iterations = strtol(optarg, &end, 10);
                        if (errno || *end || opt.iterations < 1 || opt.iterations > 100000000) {
                                fprintf(stderr, "dlx-bench: bad --iterations '%s'\n", optarg);
                                return 2;
                        }
                        have_iter = true;
                        break;
                case 'D':
                        errno = 0;
                        opt.duration = strtod(optarg, &end);
                        if (errno || *end || !(opt.duration > 0 && opt.duration <= 3600)) {
                                fprintf(stderr, "dlx-bench: bad --duration '%s'\n", optarg);
                                return 2;
                        }
                        have_dur = true;
                        break;
                case 'c':
                        cuda = true;
                        break;
                case 'p':
                        if (strcmp(optarg, "all") == 0) {
                                opt.pin = PIN_SAME;
                                opt.placements = (1u << PIN_MODES) - 1;
                                break;
                        }
                        for (opt.pin = 0; opt.pin < PIN_MODES; opt.pin++)
                                if (strcmp(optarg, pin_name(opt.pin)) == 0)
                                        break;
                        if (opt.pin == PIN_MODES) {
                                fprintf(stderr, "dlx-bench: bad --pin '%s'\n", optarg);
                                return 2;
                        }
                        opt.placements = 1u << opt.pin;
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "dlx-bench: unexpected argument '%s'\n", argv[optind]);
                usage(stderr);
                return 2;
        }
        if (cuda)
                opt.only |= SC_CUDA;
        if (!have_max)
                opt.max_size = opt.quick ? MIB : GIB;
        if (!have_iter)
                opt.iterations = opt.quick ? 200 : 10000;
        if (!have_dur)
                opt.duration = opt.quick ? 0.2 : 2.0;
        /* every ratio needs its floor from this run */
        if (opt.only & (SC_SCALE | SC_HOT | SC_COLD | SC_PUBLISH | SC_WATCH | SC_WATCHES | SC_CUDA |
                        SC_PLACEMENT))
                opt.only |= SC_FLOOR;
        snprintf(opt.prefix, sizeof(opt.prefix), "dlx-bench-%d", (int)getpid());
        pin_init();

        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);

        if (opt.socket) {
                opt.daemon_pid = peer_pid();
        } else if (daemon_start() < 0) {
                daemon_stop();
                return 1;
        }
        if (daemon_hello() < 0) {
                fprintf(stderr, "dlx-bench: cannot talk to dlxd at %s\n", opt.socket);
                daemon_stop();
                return 1;
        }
        if (!opt.json) {
                char avail[32], maxs[32], pins[96];
                printf("dlx-bench %s against %s (pid %d, %s), %ld CPUs, MemAvailable %s\n",
                       DLX_VERSION, opt.server, (int)opt.daemon_pid,
                       daemon_pid > 0 ? "started for this run" : "--socket",
                       sysconf(_SC_NPROCESSORS_ONLN),
                       fmt_size(mem_available() / MIB * MIB, avail, sizeof(avail)));
                printf("%ld samples per latency (median, p99, min), %.1f s per throughput run, "
                       "tensors up to %s%s\n",
                       opt.iterations, opt.duration, fmt_size(opt.max_size, maxs, sizeof(maxs)),
                       opt.quick ? ", --quick" : "");
                printf("pinning: %s%s\n", pin_describe(pins, sizeof(pins)),
                       daemon_pid > 0 || opt.pin == PIN_NONE ? ""
                                                             : " (dlxd itself: not ours to pin)");
                if (opt.only & SC_PLACEMENT) {
                        printf("placement scenario in:");
                        for (int p = 0; p < PIN_MODES; p++)
                                if (opt.placements & (1u << p))
                                        printf(" %s", pin_name((enum pin)p));
                        printf("\n");
                }
                printf("ratio: median over the median of a floor sampled in alternation with "
                       "it:\n  rt (AF_UNIX round trip), fd (round trip + fd + mmap); or to "
                       "memcpy, echo (epoll echo server)\n");
        }

        /* the floor is sampled alongside every latency measurement */
        if ((opt.only & SC_FLOOR) && floor_service_start() < 0)
                opt.only &= ~(unsigned)(SC_FLOOR | SC_SCALE | SC_HOT | SC_COLD | SC_PUBLISH |
                                        SC_WATCH | SC_WATCHES | SC_PLACEMENT);
        for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
                if (!(opt.only & order[i].bit))
                        continue;
                if (!daemon_alive()) {
                        report_skip(order[i].name, "", "dlxd is gone");
                        continue;
                }
                order[i].run();
                /* a scenario's children never outlive it */
                children_kill_scenario();
        }
        floor_service_stop();
        children_kill_all();

        status = daemon_stop();
        if (status != 0)
                report_error("dlxd", "did not exit 0 on SIGTERM (wait status 0x%x)", status);
        failures = report_finish();
        return failures ? 1 : 0;
}
