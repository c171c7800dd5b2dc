/* SPDX-License-Identifier: MIT */
/*
 * dlx-bench internals: options, statistics, child processes, reporting.
 *
 * Every figure dlx-bench prints is a ratio to a floor measured in the same run, so
 * that a noisy shared machine still gives comparable numbers. Producers, consumers,
 * echo servers and clients each run in a child process of their own; the parent only
 * orchestrates (it never talks to the daemon through libdlx, and never touches CUDA,
 * so nothing is initialised across fork()).
 */
#ifndef DLX_BENCH_H
#define DLX_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <dlx/dlx.h>

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

/* Scenarios, as --only names them. */
enum scenario {
        SC_FLOOR = 1u << 0,
        SC_SCALE = 1u << 1,
        SC_HOT = 1u << 2,
        SC_COLD = 1u << 3,
        SC_PUBLISH = 1u << 4,
        SC_WATCH = 1u << 5,
        SC_THROUGHPUT = 1u << 6,
        SC_EXCHANGE = 1u << 7,
        SC_CUDA = 1u << 8,
        SC_WATCHES = 1u << 9,
        SC_PLACEMENT = 1u << 10,
        SC_IDLE = 1u << 11,
        SC_TRACK = 1u << 12,
        SC_GROUP = 1u << 13,
        SC_FEDERATION = 1u << 14,
};

/* Where latency measurements run: see pin_self(). */
enum pin {
        PIN_SAME,  /* everything on one CPU (the default for all but the placement scenario) */
        PIN_SPLIT, /* clients on one CPU, servers (dlxd, echo) on another */
        PIN_NONE,  /* wherever the scheduler puts it */
        PIN_MODES
};

/* Roles of processes, for pinning. */
enum role {
        ROLE_CLIENT, /* a measuring client, a producer, a consumer */
        ROLE_SERVER, /* the daemon, an echo server */
};

struct options {
        enum pin pin;        /* the placement now (every scenario but placement: --pin's) */
        unsigned placements; /* 1 << enum pin: the placements the placement scenario runs */
        bool pin_daemon;     /* dlxd is ours to pin */
        bool quick;
        bool json;
        unsigned only;      /* enum scenario bits to run */
        long iterations;    /* timed samples of a latency measurement */
        double duration;    /* seconds of each throughput run */
        uint64_t max_size;  /* largest tensor any scenario allocates */
        const char *socket; /* the daemon's socket (ours, or --socket) */
        const char *dlxd;   /* the daemon binary we start */
        pid_t daemon_pid;   /* 0 when unknown */
        char prefix[64];    /* every name this run publishes starts with it */
        char server[64];    /* the daemon's version string */
};

extern struct options opt;

/* ---- time and statistics ------------------------------------------------------------- */

uint64_t now_ns(void);

struct stats {
        size_t n;
        double median, p99, min, max, mean;
};

/* Sorts v (n > 0) in place and fills *ret. */
void stats_of(double *v, size_t n, struct stats *ret);

/* ---- the machine ---------------------------------------------------------------------- */

/* /proc/meminfo MemAvailable in bytes, or 0 when unknown. */
uint64_t mem_available(void);
/* VmRSS of pid in KiB, or -1. */
long rss_kib(pid_t pid);
/* CPU time pid has used so far (ns, /proc/PID/schedstat), or 0 when unknown. */
uint64_t cpu_ns(pid_t pid);
/* Times pid was switched out, waiting or preempted (its context switches), or -1: about
 * how many times it ran. */
long switches(pid_t pid);
/* Whether a scenario may use need bytes of memory: --max-size, then MemAvailable with
 * room to spare. Sets *why (static text) when not. */
bool fits(uint64_t size, uint64_t need, const char **why);

/*
 * Pinning. On a small shared machine a round trip costs three times as much when
 * its two ends happen to sit on different CPUs as when they share one, and the
 * scheduler moves them at will: unpinned medians are bimodal. Pinning every
 * latency measurement the same way (its floor included) makes them comparable.
 * pin_init() picks the CPUs (PIN_SPLIT falls back to PIN_SAME on one CPU). Under
 * PIN_NONE pin_pid() gives a process every CPU the run started with back.
 */
void pin_init(void);
/* Pins the calling process (pin_pid: another one) to its role's CPU. Returns 0 or -errno. */
int pin_self(enum role role);
int pin_pid(pid_t pid, enum role role);
/* "same", "split", "none" */
const char *pin_name(enum pin pin);
/* "split (CPUs 0 and 1)" ... */
const char *pin_describe(char *buf, size_t len);

/* "4 KiB", "64 MiB", "1 GiB", "1000 B": into buf, which it returns. */
const char *fmt_size(uint64_t bytes, char *buf, size_t len);

/* Memory shared with the children forked after this call; zeroed. */
void *shm_alloc(size_t size);
void shm_free(void *p, size_t size);

/* ---- child processes ------------------------------------------------------------------------ */

/*
 * A child runs fn(ctl, arg) and exits with its return value (0: success; it prints
 * its own error). ctl is its end of a control socket to the parent; the parent's end
 * is child.ctl. Children die with the parent (PDEATHSIG) and close the parent's
 * control ends of other children.
 */
typedef int (*child_fn)(int ctl, void *arg);

struct child {
        pid_t pid;
        int ctl;
        const char *what;
};

/* Returns 0 or -errno. */
int child_start(struct child *ch, const char *what, child_fn fn, void *arg);
/* The same for a child that outlives scenarios (children_kill_scenario() spares it). */
int child_start_keep(struct child *ch, const char *what, child_fn fn, void *arg);
/*
 * Waits up to timeout_ms for the child to exit (then kills it). Returns its exit
 * status, 128 + signal, or -ETIMEDOUT. Closes the control socket. Idempotent.
 */
int child_wait(struct child *ch, int timeout_ms);
/* SIGKILL, reap, close. Idempotent. */
void child_kill(struct child *ch);
/* child_wait() that reports a non-zero result as an error of scenario; returns 0 or -1. */
int child_done(struct child *ch, int timeout_ms, const char *scenario);

/* Kills every child still running (error paths and signals). Async-signal-safe. */
void children_kill_all(void);
/* Kills the children a scenario left behind (none, unless it failed badly). */
void children_kill_scenario(void);

/* Small messages on a control or peer socket: one uint64_t each. Return 0 or -errno
 * (-EPIPE when the other side is gone, -ETIMEDOUT). timeout_ms < 0: no limit. */
int msg_send(int fd, uint64_t v);
int msg_recv(int fd, uint64_t *v, int timeout_ms);

/* A connected pair of CLOEXEC stream sockets, or -errno. */
int pair(int sv[2]);
void close_fd(int *fd);

/* ---- libdlx helpers used in children --------------------------------------------------------- */

/* Connects to opt.socket as client_name; prints the error on failure. */
dlx_client *bench_connect(const char *client_name);
/* Prints "dlx-bench: what: error (detail)" for a libdlx failure; returns -1. */
int dlx_fail(const char *what, int err);
/* A 1-D uint8 prototype of bytes on device. */
void proto_u8(DLTensor *t, int64_t *shape, uint64_t bytes, DLDevice device);
/* A new tensor viewing bytes at data (not owned): its deleter frees only the view. */
DLManagedTensorVersioned *view_new(void *data, uint64_t bytes, DLDevice device);
/* name under opt.prefix: "<prefix>/<fmt...>". */
void bench_name(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* CPU time (ns) of a client and of a server over ops operations. */
struct cpu_use {
        uint64_t client, server, ops;
};

/* ---- reporting ------------------------------------------------------------------------------ */

struct row {
        const char *scenario;
        char key[64];   /* stable id within the scenario, for JSON consumers */
        char label[64]; /* what a person reads */
        bool has_stats; /* latency samples, in ns */
        struct stats st;
        bool has_value; /* one figure: GB/s, ops/s, bytes/entry ... */
        double value;
        const char *unit;
        bool has_ratio;
        double ratio;
        const char *ratio_to;  /* "rt", "fd", "memcpy", "echo", ... */
        double floor_median;   /* the floor sampled alongside (ns), 0 when none */
        const char *placement; /* "same", "split", "none" (shown in place of the scenario) */
        bool has_cpu;          /* CPU time per operation (ns): the clients' and the server's */
        double cpu_client, cpu_server;
};

/* Prints the row (unless --json) and keeps it for the JSON report. */
void report_row(const struct row *r);
/* A row of latency samples v (n, in ns): wakes < 0 and cpu NULL are not shown. */
struct latency {
        const char *scenario, *key, *label;
        const char *placement; /* NULL: the run's own */
        double *v;
        size_t n;
        double *floor; /* n samples of a floor taken alongside, or NULL: gives the ratio */
        const char *floor_name;
        double wakes;              /* dlxd context switches per operation */
        const struct cpu_use *cpu; /* CPU time of cpu->ops operations */
};
/* Reports it (sorting v and floor); its stats into *ret (may be NULL). Returns the ratio, or 0. */
double latency_row(const struct latency *l, struct stats *ret);
/* One figure (GB/s, B, ms ...), with its ratio to what ratio_to names when ratio > 0. */
void report_value(const char *scenario, const char *key, const char *label, double value,
                  const char *unit, double ratio, const char *ratio_to);
/* A target: value op limit, printed as met or missed (never a failure). */
void report_target(const char *key, const char *what, double value, bool at_most, double limit,
                   const char *unit);
/* A measurement not taken, and why. */
void report_skip(const char *scenario, const char *what, const char *why);
/* Marks scenario failed and prints the message. */
void report_error(const char *scenario, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A section heading of the table (unless --json). */
void report_heading(const char *scenario, const char *text);
/* The summary of targets (table) or the whole JSON object. Returns the number of failures. */
int report_finish(void);

/* ---- scenarios ---------------------------------------------------------------------------- */

/* Floors measured so far in this run (zero n when not measured). */
struct floors {
        struct stats rt;    /* AF_UNIX round trip, 64 B each way */
        struct stats rt1w;  /* the same plus a one-way message: the shape of acquire+release */
        struct stats fd;    /* the same plus an fd, mmap, one byte read, munmap */
        struct stats loop;  /* round trip with an event loop's epoll_wait on the server side */
        double memcpy_gbps; /* single-thread memcpy bandwidth */
        double memfd_gbps;  /* pwrite into fresh memfd pages */
        struct stats hot4k; /* hot acquire+release of 4 KiB, for the CUDA comparison */
};
extern struct floors floors;

/*
 * Many clients for opt.duration: each child calls timed_ready() once warmed up, then
 * works until t->deadline and stores its operation count in t->counts[its index].
 * timed_run() waits until all k are ready, starts them together and reaps them.
 */
struct timed {
        uint64_t deadline; /* CLOCK_MONOTONIC ns */
        uint64_t counts[];
};
int timed_ready(int ctl);
int timed_run(struct child *kids, int k, struct timed *t, const char *scenario, double *ret_ops);

/*
 * The floor service: an echo process and a client process that live through the
 * whole run, so that floor samples can be taken in alternation with the blocks
 * of each measurement and every ratio compares like with like in time.
 */
enum floor_kind {
        FLOOR_RT,        /* 64 B request, 64 B reply */
        FLOOR_RT_ONEWAY, /* the same, then a 32 B one-way message */
        FLOOR_FD,        /* the reply carries a memfd, mapped, read, unmapped, closed */
        FLOOR_LOOP,      /* FLOOR_RT against a server that waits in epoll_wait, as dlxd does */
        FLOOR_KINDS
};
int floor_service_start(void);
void floor_service_stop(void);
/* Pins the floor service's processes again, after opt.pin changed. */
void floor_service_repin(void);
/* The floor service's round trips so far and the CPU time they took. */
void floor_cpu(struct cpu_use *ret);
/* n samples (ns) of kind into out, after a short untimed warm-up. Returns 0 or -1. */
int floor_sample(enum floor_kind kind, long n, double *out);

/*
 * Paced measurements: the child runs n timed operations in PACE_BLOCKS blocks, each
 * when the parent says go; the parent takes a block of floor samples before each.
 * op(ctx, i) does operation i (i < 0: an untimed warm-up) and returns 0 or -1.
 */
#define PACE_BLOCKS 10
#define BLOCK_WARM 16
typedef int (*pace_op)(void *ctx, long i);
/* In the child: warm untimed operations, then the blocks (block_warm untimed ones first
 * in each); samples may be NULL. Returns 0 or -1. */
int paced_loop(int ctl, long warm, int block_warm, long n, double *samples, pace_op op, void *ctx);
/* In the parent: n floor samples of kind into floor, alternating with the child's blocks. */
int paced_run(struct child *ch, long n, enum floor_kind kind, double *floor);
/* The same with block(ctx, lo, hi) before each of the child's blocks, in place of the floor. */
typedef int (*pace_block)(void *ctx, long lo, long hi);
int paced_run_with(struct child *ch, long n, pace_block block, void *ctx);

int run_floor(void);
/* Echo-server throughput with k clients for opt.duration; ops/s into *ret. */
int echo_throughput(int k, double *ret_ops);

/*
 * A paced hot consumer of a tensor of size bytes (0: dlx_ping) that a producer child
 * publishes: n samples, and n of the round-trip floor alongside; the daemon's context
 * switches per operation, and the consumer's and the daemon's CPU time. 0 or -1.
 */
int hot_measure(uint64_t size, long n, double *samples, double *floor, double *ret_wakes,
                struct cpu_use *ret_cpu);

int run_scale(void);
int run_hot(void);
int run_cold(void);
int run_publish(void);
int run_watch(void);
int run_watches(void);
int run_throughput(void);
int run_exchange(void);
int run_cuda(void);
int run_placement(void);
int run_idle(void);
int run_track(void);
int run_group(void);
int run_federation(void);

#endif /* DLX_BENCH_H */
