/* SPDX-License-Identifier: MIT */
/*
 * The libdlx scenarios. Producers and consumers are child processes, each with
 * its own client; the parent starts them, relays "ready" and "done", and reads
 * their samples from shared memory.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#define CPU ((DLDevice){kDLCPU, 0})
/* How long the parent waits for a child that should be quick, and for one doing work. */
#define SHORT_MS 120000
#define LONG_MS 600000

static volatile uint8_t sink;

static long warm_of(long n)
{
        return n / 10 + 10;
}

/* A tensor on the stack over memory that is not ours to free: published by copy. */
struct stack_tensor {
        DLManagedTensorVersioned mt;
        int64_t shape[1];
};

static void stack_tensor_init(struct stack_tensor *s, void *data, uint64_t bytes)
{
        memset(s, 0, sizeof(*s));
        s->mt.version.major = DLX_DLPACK_MAJOR;
        s->mt.version.minor = DLX_DLPACK_MINOR;
        proto_u8(&s->mt.dl_tensor, s->shape, bytes, CPU);
        s->mt.dl_tensor.data = data;
}

/* A latency row; floor (n samples taken alongside, may be NULL) gives the ratio, returned;
 * wakes >= 0 is shown as the daemon's runs (context switches) per operation, cpu (may be
 * NULL) as CPU time per operation. */
static double wake_row(const char *scenario, const char *key, const char *label, double *v,
                       size_t n, double *floor, const char *floor_name, struct stats *ret,
                       double wakes, const struct cpu_use *cpu)
{
        struct latency l = {.scenario = scenario,
                            .cpu = cpu,
                            .key = key,
                            .label = label,
                            .v = v,
                            .n = n,
                            .floor = floor,
                            .floor_name = floor_name,
                            .wakes = wakes};

        return latency_row(&l, ret);
}

static double sample_row(const char *scenario, const char *key, const char *label, double *v,
                         size_t n, double *floor, const char *floor_name, struct stats *ret)
{
        return wake_row(scenario, key, label, v, n, floor, floor_name, ret, -1, NULL);
}

/* Ends a paced child: reaps it, and kills it if the pacing broke. Returns 0 or -1. */
static int paced_end(struct child *ch, int paced, const char *scenario)
{
        int err = child_done(ch, paced < 0 ? 2000 : LONG_MS, scenario);

        return paced < 0 ? -1 : err;
}

/* ---- a producer of named tensors, kept until the parent says done -------------------------- */

struct producer_arg {
        char base[64]; /* names are <prefix>/<base>/<i> */
        int count;
        uint64_t size;
        bool fill;
};

static int producer(int ctl, void *p)
{
        struct producer_arg *a = p;
        dlx_client *c = bench_connect("bench-producer");
        char name[256];
        uint64_t done;
        int rc = 1;

        if (!c)
                return 1;
        for (int i = 0; i < a->count; i++) {
                DLManagedTensorVersioned *t;
                DLTensor proto;
                int64_t shape[1];
                int err;

                proto_u8(&proto, shape, a->size, CPU);
                err = dlx_alloc(c, &proto, &t);
                if (err < 0) {
                        dlx_fail("producer: dlx_alloc", err);
                        goto out;
                }
                /* real pages, as a real tensor has */
                if (a->fill)
                        memset(t->dl_tensor.data, 0x5a, a->size);
                else
                        ((uint8_t *)t->dl_tensor.data)[0] = 0x5a;
                bench_name(name, sizeof(name), "%s/%d", a->base, i);
                err = dlx_publish(c, name, t, NULL, NULL);
                if (err < 0) {
                        dlx_fail("producer: dlx_publish", err);
                        goto out;
                }
        }
        if (msg_send(ctl, 1) == 0 && msg_recv(ctl, &done, -1) == 0)
                rc = 0;
out:
        dlx_close(c);
        return rc;
}

static int producer_start(struct child *ch, struct producer_arg *a, const char *scenario)
{
        uint64_t ready;

        if (child_start(ch, "producer", producer, a) < 0) {
                report_error(scenario, "fork failed");
                return -1;
        }
        /* filling a large tensor takes a while on a busy machine */
        if (msg_recv(ch->ctl, &ready, LONG_MS) < 0) {
                child_done(ch, 1000, scenario);
                if (ch->pid > 0)
                        child_kill(ch);
                return -1;
        }
        return 0;
}

static int producer_stop(struct child *ch, const char *scenario)
{
        msg_send(ch->ctl, 1);
        return child_done(ch, SHORT_MS, scenario);
}

/* ---- hot: acquire + read a byte + release of a segment already mapped ------------------------ */

struct hot_arg {
        char name[256];
        long warm, n;
        double *samples;
        bool ping; /* dlx_ping instead: the library's and daemon's bare round trip */
        dlx_client *c;
};

static int hot_op(void *ctx, long i)
{
        struct hot_arg *a = ctx;
        DLManagedTensorVersioned *t;
        int err;

        (void)i;
        if (a->ping) {
                err = dlx_ping(a->c);
                return err < 0 ? dlx_fail("hot: dlx_ping", err) : 0;
        }
        err = dlx_acquire(a->c, a->name, NULL, &t);
        if (err < 0)
                return dlx_fail("hot: dlx_acquire", err);
        sink += *(volatile const uint8_t *)t->dl_tensor.data;
        t->deleter(t);
        return 0;
}

static int hot_consumer(int ctl, void *p)
{
        struct hot_arg *a = p;
        int err;

        pin_self(ROLE_CLIENT);
        a->c = bench_connect("bench-hot-consumer");
        if (!a->c)
                return 1;
        err = paced_loop(ctl, a->warm, BLOCK_WARM, a->n, a->samples, hot_op, a);
        dlx_close(a->c);
        return err < 0;
}

/*
 * One paced hot consumer of name (or pinger); samples and floor filled, and the
 * daemon's context switches per operation (how many times each one runs it) into
 * *ret_wakes, the consumer's and the daemon's CPU time into *ret_cpu.
 */
static int hot_run(struct hot_arg *ha, double *floor, double *ret_wakes, struct cpu_use *ret_cpu)
{
        long ops = ha->warm + ha->n + PACE_BLOCKS * BLOCK_WARM, before = switches(opt.daemon_pid);
        uint64_t daemon_cpu = cpu_ns(opt.daemon_pid);
        struct child cons;
        int paced;

        if (child_start(&cons, ha->ping ? "pinger" : "consumer", hot_consumer, ha) < 0) {
                report_error("hot", "fork failed");
                return -1;
        }
        paced = paced_run(&cons, ha->n, FLOOR_RT, floor);
        /* before it is reaped: its connect, hello and close count, a little */
        ret_cpu->client = cpu_ns(cons.pid);
        ret_cpu->server = cpu_ns(opt.daemon_pid) - daemon_cpu;
        ret_cpu->ops = (uint64_t)ops;
        long after = switches(opt.daemon_pid);
        /* the connect, hello and close cost the daemon a few wake-ups of their own */
        *ret_wakes = before >= 0 && after >= before ? (double)(after - before) / (double)ops : -1;
        return paced_end(&cons, paced, "hot");
}

int hot_measure(uint64_t size, long n, double *samples, double *floor, double *ret_wakes,
                struct cpu_use *ret_cpu)
{
        struct producer_arg pa = {.count = 1, .size = size, .fill = true};
        struct hot_arg ha = {.warm = warm_of(n), .n = n, .samples = samples, .ping = size == 0};
        struct child prod;
        int err;

        if (ha.ping)
                return hot_run(&ha, floor, ret_wakes, ret_cpu);
        snprintf(pa.base, sizeof(pa.base), "hot/%llu", (unsigned long long)size);
        bench_name(ha.name, sizeof(ha.name), "%s/0", pa.base);
        if (producer_start(&prod, &pa, "hot") < 0)
                return -1;
        err = hot_run(&ha, floor, ret_wakes, ret_cpu);
        if (producer_stop(&prod, "hot") < 0)
                err = -1;
        return err;
}

/* A ratio of a median to the event-loop floor of this run's floor section. */
static void loop_row(const char *key, const char *label, const struct stats *st)
{
        struct row r = {.scenario = "hot", .has_ratio = true, .ratio_to = "loop"};

        if (!st->n || !floors.loop.n)
                return;
        snprintf(r.key, sizeof(r.key), "%s", key);
        snprintf(r.label, sizeof(r.label), "%s", label);
        r.ratio = st->median / floors.loop.median;
        r.floor_median = floors.loop.median;
        report_row(&r);
}

int run_hot(void)
{
        static const uint64_t sizes[] = {4 * KIB, MIB, 64 * MIB, GIB};
        struct stats st[4] = {0}, ping = {0};
        double ratio[4] = {0}, wakes;
        struct cpu_use cpu;
        long n = opt.iterations;
        size_t bytes = (size_t)n * sizeof(double);
        double *samples = shm_alloc(bytes), *floor = malloc(bytes);
        int err = 0, largest = -1;
        char sz[32], label[64], key[32], what[128];

        report_heading("hot", "acquire + read a byte + release of a mapped segment "
                              "(figure: dlxd context switches/op)");
        if (!samples || !floor) {
                report_error("hot", "out of memory");
                err = -1;
        }
        if (err == 0) {
                /* the same traffic without a tensor: what any request costs */
                err = hot_measure(0, n, samples, floor, &wakes, &cpu);
                if (err == 0)
                        wake_row("hot", "ping", "dlx_ping (one round trip)", samples, (size_t)n,
                                 floor, "rt", &ping, wakes, &cpu);
        }
        for (int s = 0; s < 4 && err == 0; s++) {
                const char *why;

                fmt_size(sizes[s], sz, sizeof(sz));
                snprintf(label, sizeof(label), "acquire+release %s", sz);
                /* the tensor itself, and a quarter more for the page tables and the rest */
                if (!fits(sizes[s], sizes[s] + sizes[s] / 4, &why)) {
                        report_skip("hot", label, why);
                        continue;
                }
                err = hot_measure(sizes[s], n, samples, floor, &wakes, &cpu);
                if (err < 0)
                        break;
                snprintf(key, sizeof(key), "%llu", (unsigned long long)sizes[s]);
                ratio[s] = wake_row("hot", key, label, samples, (size_t)n, floor, "rt", &st[s],
                                    wakes, &cpu);
                largest = s;
        }
        shm_free(samples, bytes);
        free(floor);
        /* what is left once the event loop's own system call is paid for */
        loop_row("ping_loop", "dlx_ping over the event-loop floor", &ping);
        loop_row("4096_loop", "acquire+release 4 KiB over it", &st[0]);
        if (st[0].n) {
                floors.hot4k = st[0];
                report_target("hot.4096", "hot acquire+release 4 KiB <= 1.3x round trip", ratio[0],
                              true, 1.3, "x");
        }
        if (st[0].n && largest > 0) {
                /* each against the floor sampled with it, so that drift between them cancels */
                snprintf(what, sizeof(what), "hot %s / 4 KiB (each over its floor) <= 1.1%s",
                         fmt_size(sizes[largest], sz, sizeof(sz)),
                         largest == 3 ? "" : " (1 GiB not run)");
                report_target("hot.size_ratio", what, ratio[largest] / ratio[0], true, 1.1, "x");
        }
        return err;
}

/* ---- cold: the first acquire of a new segment ------------------------------------------------ */

#define COLD_BATCH 64
#define COLD_SIZE (4 * KIB)

struct cold_arg {
        int peer[2]; /* producer's end, consumer's end */
        long rounds, warm_rounds;
        double *samples, *pub_samples;
};

static int cold_producer(int ctl, void *p)
{
        struct cold_arg *a = p;
        dlx_client *c;
        uint8_t *buf = malloc(COLD_SIZE);
        char name[256];
        uint64_t version = 0, ack;
        int err = 0;

        pin_self(ROLE_CLIENT);
        (void)ctl;
        close(a->peer[1]);
        c = bench_connect("bench-cold-producer");
        if (!c || !buf)
                return 1;
        memset(buf, 0x5a, COLD_SIZE);
        for (long r = 0; r < a->rounds + a->warm_rounds && err == 0; r++) {
                for (int i = 0; i < COLD_BATCH; i++) {
                        struct stack_tensor st;
                        /* plain memory: one copy into a fresh sealed memfd, a new segment */
                        stack_tensor_init(&st, buf, COLD_SIZE);
                        bench_name(name, sizeof(name), "cold/%d", i);
                        uint64_t t0 = now_ns();
                        err = dlx_publish(c, name, &st.mt, NULL, &version);
                        uint64_t t1 = now_ns();
                        if (err < 0) {
                                dlx_fail("cold: dlx_publish", err);
                                break;
                        }
                        if (r >= a->warm_rounds)
                                a->pub_samples[(r - a->warm_rounds) * COLD_BATCH + i] =
                                        (double)(t1 - t0);
                }
                if (err == 0 &&
                    (msg_send(a->peer[0], version) < 0 || msg_recv(a->peer[0], &ack, LONG_MS) < 0))
                        err = -1;
        }
        dlx_close(c);
        free(buf);
        return err < 0;
}

static int cold_consumer(int ctl, void *p)
{
        struct cold_arg *a = p;
        char names[COLD_BATCH][256];
        dlx_client *c;
        uint64_t version, go;
        int err = 0;

        pin_self(ROLE_CLIENT);
        close(a->peer[0]);
        c = bench_connect("bench-cold-consumer");
        if (!c)
                return 1;
        for (int i = 0; i < COLD_BATCH; i++)
                bench_name(names[i], sizeof(names[i]), "cold/%d", i);
        /*
         * The parent's floor block runs between our rounds, while the producer and
         * we both wait: so "done" goes only once the next round is published.
         */
        if (msg_recv(a->peer[1], &version, LONG_MS) < 0)
                err = -1;
        for (long r = 0; r < a->rounds + a->warm_rounds && err == 0; r++) {
                struct dlx_acquire_options o = {.timeout_ms = 10000, .min_version = version};
                bool timed = r >= a->warm_rounds;

                if (r == a->warm_rounds && msg_send(ctl, 1) < 0) {
                        err = -1;
                        break;
                }
                if (timed && msg_recv(ctl, &go, -1) < 0) {
                        err = -1;
                        break;
                }
                for (int i = 0; i < COLD_BATCH; i++) {
                        DLManagedTensorVersioned *t;
                        uint64_t t0 = now_ns();
                        err = dlx_acquire(c, names[i], &o, &t);
                        if (err < 0) {
                                dlx_fail("cold: dlx_acquire", err);
                                break;
                        }
                        sink += *(volatile const uint8_t *)t->dl_tensor.data;
                        t->deleter(t);
                        uint64_t t1 = now_ns();
                        if (timed)
                                a->samples[(r - a->warm_rounds) * COLD_BATCH + i] =
                                        (double)(t1 - t0);
                }
                if (err == 0 && msg_send(a->peer[1], 1) < 0)
                        err = -1;
                if (err == 0 && r + 1 < a->rounds + a->warm_rounds &&
                    msg_recv(a->peer[1], &version, LONG_MS) < 0)
                        err = -1;
                if (err == 0 && timed && msg_send(ctl, 1) < 0)
                        err = -1;
        }
        dlx_close(c);
        return err < 0;
}

int run_cold(void)
{
        struct cold_arg a = {.peer = {-1, -1}};
        struct child prod, cons;
        double *floor = NULL;
        size_t n, bytes;
        uint64_t done;
        double ratio;
        int err = -1, paced = 0;

        report_heading("cold", "first acquire (fd passed, mmap) of a new 4 KiB segment + release");
        a.rounds = (opt.iterations + COLD_BATCH - 1) / COLD_BATCH;
        a.warm_rounds = 1 + a.rounds / 10;
        n = (size_t)a.rounds * COLD_BATCH;
        bytes = n * sizeof(double);
        a.samples = shm_alloc(bytes);
        a.pub_samples = shm_alloc(bytes);
        floor = malloc(bytes);
        if (!a.samples || !a.pub_samples || !floor || pair(a.peer) < 0) {
                report_error("cold", "out of memory or sockets");
                goto out;
        }
        if (child_start(&prod, "producer", cold_producer, &a) < 0) {
                report_error("cold", "fork failed");
                goto out;
        }
        if (child_start(&cons, "consumer", cold_consumer, &a) < 0) {
                report_error("cold", "fork failed");
                child_kill(&prod);
                goto out;
        }
        close_fd(&a.peer[0]);
        close_fd(&a.peer[1]);
        /* one block of the fd floor before each round of the consumer's, once it is warm */
        if (msg_recv(cons.ctl, &done, LONG_MS) < 0)
                paced = -1;
        for (long r = 0; r < a.rounds && paced == 0; r++) {
                if (floor_sample(FLOOR_FD, COLD_BATCH, floor + r * COLD_BATCH) < 0 ||
                    msg_send(cons.ctl, 1) < 0 || msg_recv(cons.ctl, &done, LONG_MS) < 0)
                        paced = -1;
        }
        err = paced_end(&cons, paced, "cold");
        if (child_done(&prod, paced < 0 ? 2000 : SHORT_MS, "cold") < 0)
                err = -1;
        if (err < 0)
                goto out;
        ratio = sample_row("cold", "4096", "first acquire+release 4 KiB", a.samples, n, floor, "fd",
                           NULL);
        report_target("cold.4096", "cold acquire+release 4 KiB <= 1.3x fd+mmap round trip", ratio,
                      true, 1.3, "x");
        sample_row("cold", "publish_copy_4096", "publish 4 KiB (one copy, new memfd)",
                   a.pub_samples, n, NULL, NULL, NULL);
out:
        close_fd(&a.peer[0]);
        close_fd(&a.peer[1]);
        shm_free(a.samples, bytes);
        shm_free(a.pub_samples, bytes);
        free(floor);
        return err;
}

/* ---- publish: zero-copy from dlx_alloc() vs one copy from malloc() ----------------------------
 */

struct pub_arg {
        uint64_t size;
        long warm, n_zc, n_copy;
        double *zc, *copy;
        dlx_client *c;
        DLManagedTensorVersioned *t;
        char name[256];
};

/* A view of the same shared memory each time: a new version, no copy. */
static int zero_copy_op(void *ctx, long i)
{
        struct pub_arg *a = ctx;
        DLManagedTensorVersioned *v = view_new(a->t->dl_tensor.data, a->size, CPU);
        int err;

        (void)i;
        if (!v)
                return -1;
        err = dlx_publish(a->c, a->name, v, NULL, NULL);
        return err < 0 ? dlx_fail("publish: zero-copy dlx_publish", err) : 0;
}

static int publisher(int ctl, void *p)
{
        struct pub_arg *a = p;
        DLTensor proto;
        int64_t shape[1];
        uint8_t *buf;
        int err;

        pin_self(ROLE_CLIENT);
        a->c = bench_connect("bench-publisher");
        if (!a->c)
                return 1;
        bench_name(a->name, sizeof(a->name), "publish/zero-copy/%llu", (unsigned long long)a->size);
        proto_u8(&proto, shape, a->size, CPU);
        err = dlx_alloc(a->c, &proto, &a->t);
        if (err < 0) {
                dlx_fail("publish: dlx_alloc", err);
                goto fail;
        }
        memset(a->t->dl_tensor.data, 0x5a, a->size);
        err = paced_loop(ctl, a->warm, BLOCK_WARM, a->n_zc, a->zc, zero_copy_op, a);
        if (err == 0 && (err = dlx_unpublish(a->c, a->name)) < 0)
                dlx_fail("publish: dlx_unpublish", err);
        a->t->deleter(a->t);
        if (err < 0)
                goto fail;

        bench_name(a->name, sizeof(a->name), "publish/copy/%llu", (unsigned long long)a->size);
        buf = malloc(a->size);
        if (!buf) {
                fprintf(stderr, "dlx-bench: publish: out of memory\n");
                goto fail;
        }
        memset(buf, 0x5a, a->size);
        for (long i = 0; i < 1 + a->n_copy; i++) {
                struct stack_tensor st;
                stack_tensor_init(&st, buf, a->size);
                uint64_t t0 = now_ns();
                err = dlx_publish(a->c, a->name, &st.mt, NULL, NULL);
                uint64_t t1 = now_ns();
                if (err < 0) {
                        dlx_fail("publish: one-copy dlx_publish", err);
                        break;
                }
                if (i >= 1)
                        a->copy[i - 1] = (double)(t1 - t0);
        }
        if (err == 0 && (err = dlx_unpublish(a->c, a->name)) < 0)
                dlx_fail("publish: dlx_unpublish", err);
        free(buf);
        dlx_close(a->c);
        return err < 0;
fail:
        dlx_close(a->c);
        return 1;
}

int run_publish(void)
{
        static const uint64_t sizes[] = {64 * MIB, GIB};
        char sz[32], label[64], key[48];
        int err = 0;

        report_heading("publish", "zero-copy (dlx_alloc memory) vs one copy (malloc memory)");
        for (int s = 0; s < 2 && err == 0; s++) {
                uint64_t size = sizes[s];
                struct pub_arg a = {.warm = 1};
                struct row r = {.scenario = "publish", .has_stats = true};
                double *floor;
                struct child ch;
                const char *why;
                size_t bytes;

                /* under --max-size, the largest size allowed stands in for 64 MiB */
                if (s == 0 && size > opt.max_size)
                        size = opt.max_size;
                fmt_size(size, sz, sizeof(sz));
                snprintf(label, sizeof(label), "publish %s", sz);
                /* the source, the copy being made and the version it replaces */
                if (!fits(size, 3 * size, &why)) {
                        report_skip("publish", label, why);
                        continue;
                }
                a.size = size;
                a.n_zc = opt.iterations < 2000 ? opt.iterations : 2000;
                a.n_copy = (long)((4 * GIB) / size);
                if (a.n_copy > opt.iterations)
                        a.n_copy = opt.iterations;
                if (a.n_copy < 3)
                        a.n_copy = 3;
                bytes = (size_t)(a.n_zc > a.n_copy ? a.n_zc : a.n_copy) * sizeof(double);
                a.zc = shm_alloc(bytes);
                a.copy = shm_alloc(bytes);
                floor = malloc(bytes);
                if (!a.zc || !a.copy || !floor ||
                    child_start(&ch, "publisher", publisher, &a) < 0) {
                        report_error("publish", "cannot start the publisher");
                        shm_free(a.zc, bytes);
                        shm_free(a.copy, bytes);
                        free(floor);
                        return -1;
                }
                err = paced_end(&ch, paced_run(&ch, a.n_zc, FLOOR_RT, floor), "publish");
                if (err == 0) {
                        snprintf(key, sizeof(key), "zero_copy_%llu", (unsigned long long)size);
                        snprintf(label, sizeof(label), "zero-copy publish %s", sz);
                        sample_row("publish", key, label, a.zc, (size_t)a.n_zc, floor, "rt", NULL);
                        stats_of(a.copy, (size_t)a.n_copy, &r.st);
                        snprintf(r.key, sizeof(r.key), "copy_%llu", (unsigned long long)size);
                        snprintf(r.label, sizeof(r.label), "one-copy publish %s", sz);
                        r.has_value = true;
                        r.value = (double)size / r.st.median;
                        r.unit = "GB/s";
                        if (floors.memcpy_gbps > 0) {
                                r.has_ratio = true;
                                r.ratio = r.value / floors.memcpy_gbps;
                                r.ratio_to = "memcpy";
                        }
                        report_row(&r);
                }
                shm_free(a.zc, bytes);
                shm_free(a.copy, bytes);
                free(floor);
        }
        return err;
}

/* ---- watch: publish-to-notification latency ------------------------------------------------- */

struct watch_arg {
        int peer[2]; /* producer's end, watcher's end */
        long warm, n;
        double *samples;
        uint64_t *stamps; /* the producer's clock just before each publish */
};

static int watcher(int ctl, void *p)
{
        struct watch_arg *a = p;
        char prefix[256];
        dlx_client *c;
        int err;

        pin_self(ROLE_CLIENT);
        close(a->peer[0]);
        c = bench_connect("bench-watcher");
        if (!c)
                return 1;
        bench_name(prefix, sizeof(prefix), "watch/");
        err = dlx_watch(c, prefix, NULL);
        if (err < 0) {
                dlx_fail("watch: dlx_watch", err);
                goto out;
        }
        if (msg_send(ctl, 1) < 0) {
                err = -1;
                goto out;
        }
        for (long i = 0; i < a->warm + a->n; i++) {
                struct dlx_event ev;
                err = dlx_next_event(c, &ev, 30000);
                uint64_t t1 = now_ns();
                if (err < 0) {
                        dlx_fail("watch: dlx_next_event", err);
                        break;
                }
                uint64_t t0 = __atomic_load_n(&a->stamps[i], __ATOMIC_ACQUIRE);
                if (i >= a->warm)
                        a->samples[i - a->warm] = (double)(t1 - t0);
                if (msg_send(a->peer[1], 1) < 0) {
                        err = -1;
                        break;
                }
        }
out:
        dlx_close(c);
        return err < 0;
}

struct watch_pub {
        struct watch_arg *a;
        dlx_client *c;
        char name[256];
        long seq; /* publishes so far: the watcher's event index */
};

/* One publish, timed by the watcher from the stamp to its event; then wait for it. */
static int watch_op(void *ctx, long i)
{
        struct watch_pub *w = ctx;
        DLManagedTensorVersioned *t;
        DLTensor proto;
        int64_t shape[1];
        uint64_t ack;
        int err;

        (void)i;
        proto_u8(&proto, shape, 64, CPU);
        err = dlx_alloc(w->c, &proto, &t);
        if (err < 0)
                return dlx_fail("watch: dlx_alloc", err);
        __atomic_store_n(&w->a->stamps[w->seq++], now_ns(), __ATOMIC_RELEASE);
        err = dlx_publish(w->c, w->name, t, NULL, NULL);
        if (err < 0)
                return dlx_fail("watch: dlx_publish", err);
        /* one event at a time: the latency of each, not of a queue */
        return msg_recv(w->a->peer[0], &ack, LONG_MS) < 0 ? -1 : 0;
}

static int watch_producer(int ctl, void *p)
{
        struct watch_pub w = {.a = p};
        int err;

        pin_self(ROLE_CLIENT);
        close(w.a->peer[1]);
        w.c = bench_connect("bench-watch-producer");
        if (!w.c)
                return 1;
        bench_name(w.name, sizeof(w.name), "watch/tensor");
        err = paced_loop(ctl, w.a->warm, 0, w.a->n, NULL, watch_op, &w);
        dlx_close(w.c);
        return err < 0;
}

int run_watch(void)
{
        struct watch_arg a = {.peer = {-1, -1}};
        struct child w, prod;
        double *floor = NULL;
        size_t bytes;
        uint64_t ready;
        long before, after;
        int err = -1;

        report_heading("watch", "publish (zero-copy, 64 B) to the watcher's dlx_next_event()");
        a.n = opt.iterations < 2000 ? opt.iterations : 2000;
        a.warm = warm_of(a.n);
        bytes = (size_t)(a.n + a.warm) * sizeof(double);
        a.samples = shm_alloc(bytes);
        a.stamps = shm_alloc(bytes);
        floor = malloc(bytes);
        if (!a.samples || !a.stamps || !floor || pair(a.peer) < 0) {
                report_error("watch", "out of memory or sockets");
                goto out;
        }
        if (child_start(&w, "watcher", watcher, &a) < 0) {
                report_error("watch", "fork failed");
                goto out;
        }
        if (msg_recv(w.ctl, &ready, SHORT_MS) < 0) {
                child_done(&w, 1000, "watch");
                goto out;
        }
        if (child_start(&prod, "producer", watch_producer, &a) < 0) {
                report_error("watch", "fork failed");
                child_kill(&w);
                goto out;
        }
        close_fd(&a.peer[0]);
        close_fd(&a.peer[1]);
        before = switches(opt.daemon_pid);
        err = paced_end(&prod, paced_run(&prod, a.n, FLOOR_RT, floor), "watch");
        after = switches(opt.daemon_pid);
        if (child_done(&w, err < 0 ? 2000 : SHORT_MS, "watch") < 0)
                err = -1;
        if (err == 0)
                wake_row("watch", "latency", "publish to event", a.samples, (size_t)a.n, floor,
                         "rt", NULL,
                         before >= 0 && after >= before
                                 ? (double)(after - before) / (double)(a.n + a.warm)
                                 : -1,
                         NULL);
out:
        close_fd(&a.peer[0]);
        close_fd(&a.peer[1]);
        shm_free(a.samples, bytes);
        shm_free(a.stamps, bytes);
        free(floor);
        return err;
}

/* ---- watches: publish latency against many watches that do not match ------------------------ */

/*
 * A daemon serving many watchers must not make every publish pay for the watches it does
 * not match. One child holds clients x per watches, none matching the name published;
 * another publishes that name (zero-copy, 64 B) in paced blocks. The name is 255 bytes, the
 * longest there is, so that an index probing one prefix length at a time probes all it can.
 */
enum watches_kind {
        WATCHES_NONE,
        WATCHES_ELSEWHERE, /* each client its own prefixes, under another folder */
        WATCHES_NEAR_MISS, /* every prefix length, each one byte or two short of matching */
        WATCHES_KINDS
};

struct holder_arg {
        int clients, per;
        enum watches_kind kind;
        char name[256]; /* the publisher's */
};

/*
 * Watch k of a holder. A near miss is the name's first L bytes with the last one or two
 * made upper case (the name has none), for L = 1..255 in turn: a scan compares up to L
 * bytes before it misses, and an index finds a prefix of every length to look up.
 */
static void holder_prefix(const struct holder_arg *a, long k, char *buf, size_t len)
{
        size_t nlen = strlen(a->name), l;
        long j;

        if (a->kind == WATCHES_ELSEWHERE) {
                bench_name(buf, len, "watches/elsewhere/%03ld/%03ld/", k / a->per, k % a->per);
                return;
        }
        l = 1 + (size_t)k % nlen;
        j = k / (long)nlen;
        memcpy(buf, a->name, l);
        buf[l] = '\0';
        buf[l - 1] = (char)('A' + j % 26);
        if (l >= 2)
                buf[l - 2] = (char)('A' + (j / 26) % 26);
}

static int watch_holder(int ctl, void *p)
{
        struct holder_arg *a = p;
        dlx_client **c = calloc((size_t)a->clients, sizeof(*c));
        char prefix[256];
        uint64_t done;
        int rc = 1;

        if (!c)
                return 1;
        for (int i = 0; i < a->clients; i++) {
                c[i] = bench_connect("bench-watch-holder");
                if (!c[i])
                        goto out;
                for (int w = 0; w < a->per; w++) {
                        int err;
                        holder_prefix(a, (long)i * a->per + w, prefix, sizeof(prefix));
                        err = dlx_watch(c[i], prefix, NULL);
                        if (err < 0) {
                                dlx_fail("watches: dlx_watch", err);
                                goto out;
                        }
                }
        }
        if (msg_send(ctl, 1) == 0 && msg_recv(ctl, &done, -1) == 0)
                rc = 0;
out:
        for (int i = 0; i < a->clients; i++)
                dlx_close(c[i]);
        free(c);
        return rc;
}

static int watches_publisher(int ctl, void *p)
{
        struct pub_arg *a = p;
        DLTensor proto;
        int64_t shape[1];
        int err;

        pin_self(ROLE_CLIENT);
        a->c = bench_connect("bench-watches-publisher");
        if (!a->c)
                return 1;
        proto_u8(&proto, shape, a->size, CPU);
        err = dlx_alloc(a->c, &proto, &a->t);
        if (err < 0) {
                dlx_fail("watches: dlx_alloc", err);
                dlx_close(a->c);
                return 1;
        }
        err = paced_loop(ctl, a->warm, BLOCK_WARM, a->n_zc, a->zc, zero_copy_op, a);
        a->t->deleter(a->t);
        dlx_close(a->c); /* the name goes with its producer */
        return err < 0;
}

/* One paced publisher with kind of watches held meanwhile; its ratio to rt into *ret. */
static int watches_run(struct holder_arg *h, struct pub_arg *a, double *floor, double *ret)
{
        static const char *const keys[] = {"publish_none", "publish_elsewhere",
                                           "publish_near_miss"};
        long total = (long)h->clients * h->per;
        struct child holder = {.pid = 0}, ch;
        char label[64];
        uint64_t ready;
        int err;

        if (h->kind != WATCHES_NONE) {
                if (child_start(&holder, "watch-holder", watch_holder, h) < 0) {
                        report_error("watches", "fork failed");
                        return -1;
                }
                if (msg_recv(holder.ctl, &ready, LONG_MS) < 0) {
                        child_done(&holder, 1000, "watches");
                        return -1;
                }
        }
        if (child_start(&ch, "publisher", watches_publisher, a) < 0) {
                report_error("watches", "fork failed");
                err = -1;
        } else {
                err = paced_end(&ch, paced_run(&ch, a->n_zc, FLOOR_RT, floor), "watches");
        }
        if (h->kind != WATCHES_NONE) {
                msg_send(holder.ctl, 1);
                if (child_done(&holder, SHORT_MS, "watches") < 0)
                        err = -1;
        }
        if (err < 0)
                return -1;
        if (h->kind == WATCHES_NONE)
                snprintf(label, sizeof(label), "publish, no watches");
        else
                snprintf(label, sizeof(label), "publish, %ld %s watches", total,
                         h->kind == WATCHES_ELSEWHERE ? "other" : "near-miss");
        *ret = sample_row("watches", keys[h->kind], label, a->zc, (size_t)a->n_zc, floor, "rt",
                          NULL);
        return 0;
}

int run_watches(void)
{
        /* per: dlxd's default --max-watches */
        struct holder_arg h = {.clients = opt.quick ? 8 : 200, .per = 256};
        struct pub_arg a = {.size = 64};
        double ratio[WATCHES_KINDS] = {0}, *floor;
        char what[96];
        size_t bytes, nlen;
        int err = 0;

        snprintf(what, sizeof(what),
                 "publish (zero-copy, 64 B, 255-byte name); %d clients x %d watches, no match",
                 h.clients, h.per);
        report_heading("watches", what);
        /* a valid name of exactly DLX_NAME_MAX bytes, without upper case (see holder_prefix) */
        bench_name(h.name, sizeof(h.name), "watches/");
        for (nlen = strlen(h.name); nlen < DLX_NAME_MAX; nlen++)
                h.name[nlen] = (char)('a' + nlen % 16);
        h.name[nlen] = '\0';
        snprintf(a.name, sizeof(a.name), "%s", h.name);
        a.n_zc = opt.iterations < 2000 ? opt.iterations : 2000;
        a.warm = warm_of(a.n_zc);
        bytes = (size_t)a.n_zc * sizeof(double);
        a.zc = shm_alloc(bytes);
        floor = malloc(bytes);
        if (!a.zc || !floor) {
                report_error("watches", "out of memory");
                err = -1;
        }
        for (int k = 0; k < WATCHES_KINDS && err == 0; k++) {
                h.kind = (enum watches_kind)k;
                err = watches_run(&h, &a, floor, &ratio[k]);
        }
        /* the claim; the near misses are the worst shape, reported as measured */
        if (err == 0 && ratio[WATCHES_NONE] > 0) {
                snprintf(what, sizeof(what), "publish with %d other watches <= 1.2x with none",
                         h.clients * h.per);
                report_target("watches.elsewhere", what,
                              ratio[WATCHES_ELSEWHERE] / ratio[WATCHES_NONE], true, 1.2, "x");
        }
        shm_free(a.zc, bytes);
        free(floor);
        return err;
}

/* ---- throughput: many consumers for a fixed time --------------------------------------------- */

struct tp_arg {
        char name[256];
        int idx;
        struct timed *t;
};

static int tp_consumer(int ctl, void *p)
{
        struct tp_arg *a = p;
        dlx_client *c = bench_connect("bench-tp-consumer");
        uint64_t count = 0, deadline;
        int err = 0;

        if (!c)
                return 1;
        for (int i = 0; i < 100 && err == 0; i++) {
                DLManagedTensorVersioned *t;
                err = dlx_acquire(c, a->name, NULL, &t);
                if (err == 0)
                        t->deleter(t);
        }
        if (err < 0) {
                dlx_fail("throughput: dlx_acquire", err);
                goto out;
        }
        if (timed_ready(ctl) < 0) {
                err = -EPIPE;
                goto out;
        }
        deadline = __atomic_load_n(&a->t->deadline, __ATOMIC_ACQUIRE);
        while (now_ns() < deadline) {
                DLManagedTensorVersioned *t;
                err = dlx_acquire(c, a->name, NULL, &t);
                if (err < 0) {
                        dlx_fail("throughput: dlx_acquire", err);
                        break;
                }
                sink += *(volatile const uint8_t *)t->dl_tensor.data;
                t->deleter(t);
                count++;
        }
        a->t->counts[a->idx] = count;
out:
        dlx_close(c);
        return err < 0;
}

/* k consumers on distinct names (shared: all on the last one); ops/s into *ret. */
static int dlx_throughput(int k, bool shared, int kmax, double *ret)
{
        size_t tsize = sizeof(struct timed) + (size_t)k * sizeof(uint64_t);
        struct timed *t = shm_alloc(tsize);
        struct child *kids = calloc((size_t)k, sizeof(*kids));
        struct tp_arg a = {0};
        int err = -1;

        if (!t || !kids) {
                report_error("throughput", "out of memory");
                goto out;
        }
        a.t = t;
        for (int i = 0; i < k; i++) {
                a.idx = i;
                bench_name(a.name, sizeof(a.name), "tp/%d", shared ? kmax : i);
                if (child_start(&kids[i], "consumer", tp_consumer, &a) < 0) {
                        report_error("throughput", "fork failed");
                        for (int j = 0; j < i; j++)
                                child_kill(&kids[j]);
                        goto out;
                }
        }
        err = timed_run(kids, k, t, "throughput", ret);
out:
        free(kids);
        shm_free(t, tsize);
        return err;
}

static void tp_row(const char *key, const char *label, double ops, double echo)
{
        struct row r = {.scenario = "throughput", .has_value = true, .value = ops, .unit = "op/s"};

        snprintf(r.key, sizeof(r.key), "%s", key);
        snprintf(r.label, sizeof(r.label), "%s", label);
        if (echo > 0) {
                r.has_ratio = true;
                r.ratio = ops / echo;
                r.ratio_to = "echo";
        }
        report_row(&r);
}

int run_throughput(void)
{
        static const int ks[] = {1, 4, 16, 64};
        int nk = opt.quick ? 2 : 4, kmax = ks[nk - 1];
        struct producer_arg pa = {.count = kmax + 1, .size = 4 * KIB, .fill = true};
        struct child prod;
        char key[32], label[64];
        int err = 0;

        report_heading("throughput", "acquire + read one byte + release, total over all clients");
        snprintf(pa.base, sizeof(pa.base), "tp");
        if (producer_start(&prod, &pa, "throughput") < 0)
                return -1;
        for (int i = 0; i < nk && err == 0; i++) {
                int k = ks[i];
                double echo = 0, distinct = 0, shared = 0;

                err = echo_throughput(k, &echo);
                if (err < 0)
                        break;
                snprintf(key, sizeof(key), "echo_%d", k);
                snprintf(label, sizeof(label), "echo server, %d client%s", k, k > 1 ? "s" : "");
                tp_row(key, label, echo, 0);

                err = dlx_throughput(k, false, kmax, &distinct);
                if (err < 0)
                        break;
                snprintf(key, sizeof(key), "distinct_%d", k);
                snprintf(label, sizeof(label), "dlx, %d consumer%s, distinct names", k,
                         k > 1 ? "s" : "");
                tp_row(key, label, distinct, echo);

                err = dlx_throughput(k, true, kmax, &shared);
                if (err < 0)
                        break;
                snprintf(key, sizeof(key), "shared_%d", k);
                snprintf(label, sizeof(label), "dlx, %d consumer%s, one shared name", k,
                         k > 1 ? "s" : "");
                tp_row(key, label, shared, echo);

                if (k == 16)
                        report_target("throughput.distinct_16",
                                      "16-consumer throughput >= 0.7x echo server", distinct / echo,
                                      false, 0.7, "x");
        }
        if (producer_stop(&prod, "throughput") < 0)
                err = -1;
        return err;
}

/* ---- scale: daemon memory per entry, list latency ------------------------------------------- */

struct scale_arg {
        long names, lists;
        pid_t daemon;
        long rss[3]; /* before, after publishing, after unpublishing (KiB) */
        long listed;
        double *pub, *list, *unpub;
        /* in the child */
        dlx_client *c;
        DLManagedTensorVersioned **tensors;
};

static int count_entry(void *ctx, const struct dlx_info *info)
{
        (void)info;
        (*(long *)ctx)++;
        return 0;
}

static int scale_publish(void *ctx, long i)
{
        struct scale_arg *a = ctx;
        struct dlx_publish_options po = {.persist = true};
        char name[256];
        int err;

        bench_name(name, sizeof(name), "scale/%07ld", i);
        err = dlx_publish(a->c, name, a->tensors[i], &po, NULL);
        a->tensors[i] = NULL;
        return err < 0 ? dlx_fail("scale: dlx_publish", err) : 0;
}

static int scale_unpublish(void *ctx, long i)
{
        struct scale_arg *a = ctx;
        char name[256];
        int err;

        bench_name(name, sizeof(name), "scale/%07ld", i);
        err = dlx_unpublish(a->c, name);
        return err < 0 ? dlx_fail("scale: dlx_unpublish", err) : 0;
}

static int scale_child(int ctl, void *p)
{
        struct scale_arg *a = p;
        char prefix[256];
        int err = 0;

        pin_self(ROLE_CLIENT);
        a->c = bench_connect("bench-scale");
        a->tensors = calloc((size_t)a->names, sizeof(*a->tensors));
        if (!a->c || !a->tensors)
                goto out;
        bench_name(prefix, sizeof(prefix), "scale/");
        /* small tensors from one client's allocator: few segments, many names */
        for (long i = 0; i < a->names; i++) {
                DLTensor proto;
                int64_t shape[1];
                proto_u8(&proto, shape, 16, CPU);
                err = dlx_alloc(a->c, &proto, &a->tensors[i]);
                if (err < 0) {
                        dlx_fail("scale: dlx_alloc", err);
                        goto out;
                }
        }
        a->rss[0] = a->daemon > 0 ? rss_kib(a->daemon) : -1;
        err = paced_loop(ctl, 0, 0, a->names, a->pub, scale_publish, a);
        if (err < 0)
                goto out;
        a->rss[1] = a->daemon > 0 ? rss_kib(a->daemon) : -1;
        for (long l = 0; l < a->lists; l++) {
                long seen = 0;
                uint64_t t0 = now_ns();
                err = dlx_list(a->c, prefix, count_entry, &seen);
                uint64_t t1 = now_ns();
                if (err < 0) {
                        dlx_fail("scale: dlx_list", err);
                        goto out;
                }
                a->list[l] = (double)(t1 - t0);
                a->listed = seen;
        }
        err = paced_loop(ctl, 0, 0, a->names, a->unpub, scale_unpublish, a);
        a->rss[2] = a->daemon > 0 ? rss_kib(a->daemon) : -1;
out:
        for (long i = 0; a->tensors && i < a->names; i++)
                if (a->tensors[i])
                        a->tensors[i]->deleter(a->tensors[i]);
        free(a->tensors);
        dlx_close(a->c);
        return !a->c || !a->tensors || err < 0;
}

int run_scale(void)
{
        struct scale_arg *a = shm_alloc(sizeof(*a));
        long names = opt.quick ? 10000 : 100000;
        size_t bytes = (size_t)names * sizeof(double);
        double *floor_pub = malloc(bytes), *floor_unpub = malloc(bytes);
        char label[64];
        struct child ch;
        int err = -1, paced;

        snprintf(label, sizeof(label), "%ld small persistent names from one client's allocator",
                 names);
        report_heading("scale", label);
        if (!a || !floor_pub || !floor_unpub) {
                report_error("scale", "out of memory");
                goto out;
        }
        a->names = names;
        a->lists = opt.quick ? 3 : 5;
        a->daemon = opt.daemon_pid;
        a->pub = shm_alloc(bytes);
        a->unpub = shm_alloc(bytes);
        a->list = shm_alloc((size_t)a->lists * sizeof(double));
        if (!a->pub || !a->unpub || !a->list || child_start(&ch, "scale", scale_child, a) < 0) {
                report_error("scale", "cannot start the scale child");
                goto out;
        }
        paced = paced_run(&ch, names, FLOOR_RT, floor_pub);
        if (paced == 0)
                paced = paced_run(&ch, names, FLOOR_RT, floor_unpub);
        err = paced_end(&ch, paced, "scale");
        if (err < 0)
                goto out;
        sample_row("scale", "publish", "publish one small persistent name", a->pub, (size_t)names,
                   floor_pub, "rt", NULL);
        if (a->rss[0] > 0 && a->rss[1] > 0) {
                struct row r = {.scenario = "scale", .has_value = true, .unit = "B/entry"};
                double per = (double)(a->rss[1] - a->rss[0]) * 1024.0 / (double)names;
                snprintf(r.key, sizeof(r.key), "rss_per_entry");
                snprintf(r.label, sizeof(r.label), "dlxd RSS growth per entry");
                r.value = per;
                report_row(&r);
                snprintf(label, sizeof(label), "dlxd RSS <= 1 KiB per entry at %ld names", names);
                report_target("scale.rss_per_entry", label, per, true, 1024, "B/entry");
        } else {
                report_skip("scale", "dlxd RSS growth per entry", "dlxd's pid or status unknown");
        }
        if (a->listed != names) {
                report_error("scale", "dlx_list saw %ld names, %ld were published", a->listed,
                             names);
                err = -1;
        } else {
                struct row r = {.scenario = "scale", .has_stats = true, .has_value = true};
                stats_of(a->list, (size_t)a->lists, &r.st);
                snprintf(r.key, sizeof(r.key), "list");
                snprintf(r.label, sizeof(r.label), "dlx_list of all %ld names", names);
                r.value = r.st.median / (double)names;
                r.unit = "ns/entry";
                report_row(&r);
        }
        sample_row("scale", "unpublish", "unpublish one name", a->unpub, (size_t)names, floor_unpub,
                   "rt", NULL);
out:
        if (a) {
                shm_free(a->pub, bytes);
                shm_free(a->unpub, bytes);
                shm_free(a->list, (size_t)a->lists * sizeof(double));
        }
        shm_free(a, sizeof(*a));
        free(floor_pub);
        free(floor_unpub);
        return err;
}

/* ---- exchange: the DLPackExchangeAPI slots in-process ------------------------------------- */

enum { EX_MALLOC, EX_ALLOC, EX_FROM, EX_TO, EX_VIEW, EX_STREAM_CPU, EX_STREAM_CUDA, EX_SLOTS };

static const char *const ex_label[EX_SLOTS] = {
        "reference: malloc+free 64 B", "managed_tensor_allocator+deleter",
        "from_py_object+deleter",      "to_py_object+unref",
        "dltensor_from_py_object",     "current_work_stream (CPU)",
        "current_work_stream (CUDA)",
};
static const char *const ex_key[EX_SLOTS] = {
        "malloc_free",   "allocator",  "from_object", "to_object",
        "dltensor_view", "stream_cpu", "stream_cuda",
};

#define EX_BATCH 64

struct ex_arg {
        long n;
        double *samples; /* EX_SLOTS * n, ns per call */
};

static int exchange_child(int ctl, void *p)
{
        struct ex_arg *a = p;
        const DLPackExchangeAPI *api = dlx_exchange_api();
        dlx_client *c = bench_connect("bench-exchange");
        DLManagedTensorVersioned *mt, *out;
        dlx_tensor *h = NULL;
        DLTensor proto, view;
        int64_t shape[1];
        void *obj, *stream;
        int bad = 0, err;

        pin_self(ROLE_CLIENT);
        (void)ctl;
        if (!c)
                return 1;
        dlx_set_default_client(c);
        proto_u8(&proto, shape, 4 * KIB, CPU);
        err = dlx_alloc(c, &proto, &mt);
        if (err < 0 || (err = dlx_tensor_wrap(mt, &h)) < 0) {
                dlx_fail("exchange: a tensor to exchange", err);
                dlx_close(c);
                return 1;
        }
        for (int slot = 0; slot < EX_SLOTS; slot++) {
                for (long i = 0; i < a->n / 10 + a->n; i++) {
                        uint64_t t0 = now_ns();
                        for (int b = 0; b < EX_BATCH; b++) {
                                switch (slot) {
                                case EX_MALLOC: {
                                        void *volatile m = malloc(64);
                                        free(m);
                                        break;
                                }
                                case EX_ALLOC:
                                        if (api->managed_tensor_allocator(&proto, &out, NULL,
                                                                          NULL) != 0)
                                                bad++;
                                        else
                                                out->deleter(out);
                                        break;
                                case EX_FROM:
                                        if (api->managed_tensor_from_py_object_no_sync(h, &out))
                                                bad++;
                                        else
                                                out->deleter(out);
                                        break;
                                case EX_TO: {
                                        struct stack_tensor st;
                                        stack_tensor_init(&st, NULL, 0);
                                        if (api->managed_tensor_to_py_object_no_sync(&st.mt, &obj))
                                                bad++;
                                        else
                                                dlx_tensor_unref(obj);
                                        break;
                                }
                                case EX_VIEW:
                                        bad += api->dltensor_from_py_object_no_sync(h, &view) != 0;
                                        break;
                                case EX_STREAM_CPU:
                                        bad += api->current_work_stream(kDLCPU, 0, &stream) != 0;
                                        break;
                                case EX_STREAM_CUDA:
                                        bad += api->current_work_stream(kDLCUDA, 0, &stream) != 0;
                                        break;
                                }
                        }
                        uint64_t t1 = now_ns();
                        if (i >= a->n / 10)
                                a->samples[slot * a->n + i - a->n / 10] =
                                        (double)(t1 - t0) / EX_BATCH;
                }
        }
        dlx_tensor_unref(h);
        dlx_close(c);
        if (bad)
                fprintf(stderr, "dlx-bench: exchange: %d calls failed\n", bad);
        return bad != 0;
}

int run_exchange(void)
{
        struct ex_arg a;
        struct child ch;
        size_t bytes;
        int err;

        report_heading("exchange", "DLPackExchangeAPI slots in-process, ns per call");
        a.n = opt.iterations < 2000 ? opt.iterations : 2000;
        bytes = (size_t)a.n * EX_SLOTS * sizeof(double);
        a.samples = shm_alloc(bytes);
        if (!a.samples || child_start(&ch, "exchange", exchange_child, &a) < 0) {
                report_error("exchange", "cannot start the exchange child");
                shm_free(a.samples, bytes);
                return -1;
        }
        err = child_done(&ch, LONG_MS, "exchange");
        if (err == 0)
                for (int s = 0; s < EX_SLOTS; s++)
                        sample_row("exchange", ex_key[s], ex_label[s], a.samples + s * a.n,
                                   (size_t)a.n, NULL, NULL, NULL);
        shm_free(a.samples, bytes);
        return err;
}
