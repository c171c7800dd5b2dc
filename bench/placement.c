/* SPDX-License-Identifier: MIT */
/*
 * placement: the latencies users meet, in each placement of the processes.
 *
 * Pinning every process to one CPU gives stable figures, but it flatters: users do
 * not pin, and the scheduler puts a client and dlxd on different CPUs, where every
 * message pays for waking the other CPU (from an idle state, on a VM a hypervisor
 * exit). So for each placement asked for (same, split, none) this runs, each
 * against its floor measured in the same placement:
 *   - the AF_UNIX round trip (the floor service),
 *   - dlx_ping and the hot acquire+release of 4 KiB (against that round trip),
 *   - the hand-off: a consumer blocked in dlx_acquire() with min_version = the next
 *     version, and a producer that publishes it; from the producer's clock just
 *     before dlx_publish() to the consumer's just after dlx_acquire() returns,
 *   - the relay floor of the same hand-off without dlx: producer -> broker ->
 *     consumer over AF_UNIX sockets, the broker a plain blocking read/write loop,
 *   - the tracked hand-off: the consumer asleep in dlx_track_wait() on the name,
 *     until the producer's dlx_publish() changes its version (the daemon wakes it
 *     through the version page's futex, with no message; no lease is taken),
 *   - its floor, the bare pipe: the producer writes, the consumer blocked reading.
 * The hand-offs and their floors run in alternating blocks. Each row also shows
 * the CPU time per operation of the clients and of the server (dlxd, the echo or
 * the broker), from /proc/PID/schedstat.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define CPU ((DLDevice){kDLCPU, 0})
#define HANDOFF_SIZE (4 * KIB)
#define RELAY_MSG 64
/* The producer's pause after each acknowledgement, so that the consumer is waiting
 * (blocked in dlx_acquire or read) when the next version comes: a hand-off, not a queue. */
#define HANDOFF_GAP_US 100
#define LONG_MS 600000

static volatile uint8_t sink;

enum via { VIA_DLX, VIA_RELAY, VIA_PIPE, VIA_TRACK };

/* One hand-off: a producer, a consumer and (VIA_RELAY) a broker. */
struct handoff {
        enum via via;
        int ack[2]; /* the consumer's acknowledgements: producer's end, consumer's end */
        int in[2];  /* producer -> broker (or consumer: a pipe): producer's end, the other */
        int out[2]; /* broker -> consumer: broker's end, consumer's end */
        long warm, n;
        double *samples;  /* the consumer's, n */
        uint64_t *stamps; /* the producer's clock before each hand-off, warm + n */
        char name[256];
        struct child prod, cons, broker;
        /* in the producer */
        dlx_client *c;
        DLManagedTensorVersioned *t;
        long seq;
};

/* Closes every socket end of h but keep (and keep2). */
static void keep_only(struct handoff *h, int keep, int keep2)
{
        int *fds[] = {&h->ack[0], &h->ack[1], &h->in[0], &h->in[1], &h->out[0], &h->out[1]};

        for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
                if (*fds[i] != keep && *fds[i] != keep2)
                        close_fd(fds[i]);
}

static int send_all(int fd, const void *buf, size_t len)
{
        ssize_t n;

        do
                n = send(fd, buf, len, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        return n == (ssize_t)len ? 0 : -1;
}

static int recv_all(int fd, void *buf, size_t len)
{
        ssize_t n;

        do
                n = recv(fd, buf, len, MSG_WAITALL);
        while (n < 0 && errno == EINTR);
        return n == (ssize_t)len ? 0 : -1;
}

/* The pipe floor's ends are a pipe's: plain read and write. */
static int write_all(int fd, const void *buf, size_t len)
{
        ssize_t n;

        do
                n = write(fd, buf, len);
        while (n < 0 && errno == EINTR);
        return n == (ssize_t)len ? 0 : -1;
}

static int read_all(int fd, void *buf, size_t len)
{
        size_t got = 0;

        while (got < len) {
                ssize_t n = read(fd, (uint8_t *)buf + got, len - got);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return -1;
                got += (size_t)n;
        }
        return 0;
}

static int broker(int ctl, void *p)
{
        struct handoff *h = p;
        uint8_t buf[RELAY_MSG];

        (void)ctl;
        pin_self(ROLE_SERVER);
        keep_only(h, h->in[1], h->out[0]);
        /* until the producer hangs up */
        while (recv_all(h->in[1], buf, sizeof(buf)) == 0)
                if (send_all(h->out[0], buf, sizeof(buf)) < 0)
                        return 1;
        return 0;
}

static int handoff_consumer(int ctl, void *p)
{
        struct handoff *h = p;
        uint8_t buf[RELAY_MSG];
        dlx_client *c = NULL;
        uint64_t next = 1;
        int err = 0;

        uint32_t track = 0;
        uint64_t seen = 0;

        (void)ctl;
        pin_self(ROLE_CLIENT);
        keep_only(h, h->ack[1], h->via == VIA_PIPE ? h->in[1] : h->out[1]);
        if ((h->via == VIA_DLX || h->via == VIA_TRACK) &&
            !(c = bench_connect("bench-handoff-consumer")))
                return 1;
        if (h->via == VIA_TRACK && (err = dlx_track(c, h->name, &track)) < 0) {
                dlx_close(c);
                return dlx_fail("handoff: dlx_track", err) < 0;
        }
        for (long i = 0; i < h->warm + h->n && err == 0; i++) {
                uint64_t t1;

                if (h->via == VIA_TRACK) {
                        err = dlx_track_wait(c, track, seen, 30000, &seen);
                        t1 = now_ns();
                        if (err < 0) {
                                dlx_fail("handoff: dlx_track_wait", err);
                                break;
                        }
                } else if (h->via == VIA_PIPE) {
                        err = read_all(h->in[1], buf, sizeof(buf));
                        t1 = now_ns();
                } else if (h->via == VIA_DLX) {
                        struct dlx_acquire_options o = {.timeout_ms = 30000, .min_version = next};
                        DLManagedTensorVersioned *t;
                        uint64_t version = 0;

                        err = dlx_acquire(c, h->name, &o, &t);
                        t1 = now_ns();
                        if (err < 0) {
                                dlx_fail("handoff: dlx_acquire", err);
                                break;
                        }
                        dlx_tensor_info(t, NULL, &version, NULL);
                        next = version + 1;
                        sink += *(volatile const uint8_t *)t->dl_tensor.data;
                        t->deleter(t);
                } else {
                        err = recv_all(h->out[1], buf, sizeof(buf));
                        t1 = now_ns();
                }
                uint64_t t0 = __atomic_load_n(&h->stamps[i], __ATOMIC_ACQUIRE);
                if (i >= h->warm)
                        h->samples[i - h->warm] = (double)(t1 - t0);
                if (err == 0)
                        err = msg_send(h->ack[1], 1);
        }
        dlx_close(c);
        return err < 0;
}

/* One hand-off, then the consumer's acknowledgement, then a pause. */
static int handoff_op(void *ctx, long i)
{
        struct handoff *h = ctx;
        struct timespec gap = {.tv_nsec = HANDOFF_GAP_US * 1000};
        uint8_t buf[RELAY_MSG] = {0};
        uint64_t ack;
        int err;

        (void)i;
        if (h->via == VIA_DLX || h->via == VIA_TRACK) {
                DLManagedTensorVersioned *v = view_new(h->t->dl_tensor.data, HANDOFF_SIZE, CPU);
                if (!v)
                        return -1;
                __atomic_store_n(&h->stamps[h->seq++], now_ns(), __ATOMIC_RELEASE);
                err = dlx_publish(h->c, h->name, v, NULL, NULL);
                if (err < 0)
                        return dlx_fail("handoff: dlx_publish", err);
        } else {
                __atomic_store_n(&h->stamps[h->seq++], now_ns(), __ATOMIC_RELEASE);
                if ((h->via == VIA_PIPE ? write_all : send_all)(h->in[0], buf, sizeof(buf)) < 0)
                        return -1;
        }
        if (msg_recv(h->ack[0], &ack, LONG_MS) < 0)
                return -1;
        nanosleep(&gap, NULL);
        return 0;
}

static int handoff_producer(int ctl, void *p)
{
        struct handoff *h = p;
        DLTensor proto;
        int64_t shape[1];
        int err;

        pin_self(ROLE_CLIENT);
        keep_only(h, h->ack[0], h->in[0]);
        if (h->via == VIA_DLX || h->via == VIA_TRACK) {
                h->c = bench_connect("bench-handoff-producer");
                if (!h->c)
                        return 1;
                proto_u8(&proto, shape, HANDOFF_SIZE, CPU);
                err = dlx_alloc(h->c, &proto, &h->t);
                if (err < 0) {
                        dlx_fail("handoff: dlx_alloc", err);
                        dlx_close(h->c);
                        return 1;
                }
                memset(h->t->dl_tensor.data, 0x5a, HANDOFF_SIZE);
        }
        err = paced_loop(ctl, h->warm, 0, h->n, NULL, handoff_op, h);
        if (h->t)
                h->t->deleter(h->t);
        dlx_close(h->c);
        close_fd(&h->in[0]); /* the broker's cue to stop */
        return err < 0;
}

static void handoff_close(struct handoff *h)
{
        keep_only(h, -1, -1);
        shm_free(h->samples, (size_t)h->n * sizeof(double));
        shm_free(h->stamps, (size_t)(h->warm + h->n) * sizeof(uint64_t));
}

static void handoff_init(struct handoff *h, enum via via, long n)
{
        memset(h, 0, sizeof(*h));
        h->ack[0] = h->ack[1] = h->in[0] = h->in[1] = h->out[0] = h->out[1] = -1;
        h->prod.pid = h->cons.pid = h->broker.pid = -1;
        h->via = via;
        h->n = n;
        h->warm = n / 10 + 10;
}

/* Sockets, shared memory and the processes of h (prod.pid > 0 once started). */
static int handoff_start(struct handoff *h, const char *placement)
{
        enum via via = h->via;
        long n = h->n;

        h->samples = shm_alloc((size_t)n * sizeof(double));
        h->stamps = shm_alloc((size_t)(h->warm + n) * sizeof(uint64_t));
        bench_name(h->name, sizeof(h->name), "handoff/%s%s", placement,
                   via == VIA_TRACK ? "/tracked" : "");
        if (via == VIA_PIPE) {
                int fds[2];
                if (pipe2(fds, O_CLOEXEC) < 0) {
                        report_error("placement", "pipe: %s", strerror(errno));
                        return -1;
                }
                h->in[0] = fds[1]; /* the producer writes */
                h->in[1] = fds[0];
        }
        if (!h->samples || !h->stamps || pair(h->ack) < 0 ||
            (via == VIA_RELAY && (pair(h->in) < 0 || pair(h->out) < 0))) {
                report_error("placement", "out of memory or sockets");
                return -1;
        }
        if ((via == VIA_RELAY && child_start(&h->broker, "broker", broker, h) < 0) ||
            child_start(&h->cons, "consumer", handoff_consumer, h) < 0 ||
            child_start(&h->prod, "producer", handoff_producer, h) < 0) {
                report_error("placement", "fork failed");
                return -1;
        }
        keep_only(h, -1, -1);
        return 0;
}

/* Reaps h's processes, killing them if the pacing broke; their CPU time into *ret. */
static int handoff_end(struct handoff *h, int paced, struct cpu_use *ret)
{
        int wait_ms = paced < 0 ? 2000 : LONG_MS, err = paced;

        /* not reaped yet: their whole lives, connect and close included (a little) */
        ret->client = cpu_ns(h->prod.pid) + cpu_ns(h->cons.pid);
        if (h->via == VIA_RELAY)
                ret->server = cpu_ns(h->broker.pid);
        ret->ops = (uint64_t)(h->warm + h->n);
        struct child *kids[] = {&h->prod, &h->cons, &h->broker};
        for (size_t i = 0; i < sizeof(kids) / sizeof(kids[0]); i++)
                if (kids[i]->pid > 0 && child_done(kids[i], wait_ms, "placement") < 0)
                        err = -1;
        return err;
}

/* The hand-offs that run a block before each of dlx's: the floors and the tracked one. */
struct others {
        struct handoff *h[3];
        uint64_t track_daemon_cpu; /* dlxd's CPU time during the tracked blocks */
};

static int others_block(void *ctx, long lo, long hi)
{
        struct others *o = ctx;
        uint64_t done;

        (void)lo;
        (void)hi;
        for (size_t i = 0; i < sizeof(o->h) / sizeof(o->h[0]); i++) {
                struct handoff *h = o->h[i];
                uint64_t d0 = cpu_ns(opt.daemon_pid);
                if (msg_send(h->prod.ctl, 1) < 0 || msg_recv(h->prod.ctl, &done, LONG_MS) < 0)
                        return -1;
                if (h->via == VIA_TRACK)
                        o->track_daemon_cpu += cpu_ns(opt.daemon_pid) - d0;
        }
        return 0;
}

static int handoffs(const char *placement)
{
        long n = opt.iterations < 2000 ? opt.iterations : 2000;
        struct handoff dlx, relay, pipe_, track;
        struct others o = {.h = {&relay, &pipe_, &track}};
        struct cpu_use dlx_cpu = {0}, relay_cpu = {0}, pipe_cpu = {0}, track_cpu = {0};
        uint64_t daemon_cpu = cpu_ns(opt.daemon_pid), warm;
        int err = -1;

        handoff_init(&relay, VIA_RELAY, n);
        handoff_init(&pipe_, VIA_PIPE, n);
        handoff_init(&track, VIA_TRACK, n);
        handoff_init(&dlx, VIA_DLX, n);
        if (handoff_start(&relay, placement) == 0 && handoff_start(&pipe_, placement) == 0 &&
            handoff_start(&track, placement) == 0 && handoff_start(&dlx, placement) == 0) {
                err = 0;
                for (size_t i = 0; i < sizeof(o.h) / sizeof(o.h[0]) && err == 0; i++)
                        err = msg_recv(o.h[i]->prod.ctl, &warm, LONG_MS);
                if (err == 0)
                        err = paced_run_with(&dlx.prod, n, others_block, &o);
        }
        dlx_cpu.server = cpu_ns(opt.daemon_pid) - daemon_cpu - o.track_daemon_cpu;
        track_cpu.server = o.track_daemon_cpu;
        if (handoff_end(&relay, err, &relay_cpu) < 0 || handoff_end(&pipe_, err, &pipe_cpu) < 0 ||
            handoff_end(&track, err, &track_cpu) < 0 || handoff_end(&dlx, err, &dlx_cpu) < 0)
                err = -1;
        if (err == 0) {
                struct latency l = {.scenario = "placement",
                                    .key = "relay",
                                    .label = "relay floor: prod>broker>cons",
                                    .placement = placement,
                                    .v = relay.samples,
                                    .n = (size_t)n,
                                    .wakes = -1,
                                    .cpu = &relay_cpu};
                latency_row(&l, NULL);
                l.key = "handoff";
                l.label = "hand-off: publish>waiting acquire";
                l.v = dlx.samples;
                l.floor = relay.samples;
                l.floor_name = "relay";
                l.cpu = &dlx_cpu;
                latency_row(&l, NULL);
                l.key = "pipe";
                l.label = "pipe floor: prod>cons";
                l.v = pipe_.samples;
                l.floor = NULL;
                l.cpu = &pipe_cpu;
                latency_row(&l, NULL);
                l.key = "tracked";
                l.label = "tracked: publish>track_wait";
                l.v = track.samples;
                l.floor = pipe_.samples;
                l.floor_name = "pipe";
                l.cpu = &track_cpu;
                latency_row(&l, NULL);
        }
        handoff_close(&relay);
        handoff_close(&pipe_);
        handoff_close(&track);
        handoff_close(&dlx);
        return err;
}

/* Everything of one placement: the floor, ping, hot 4 KiB, the hand-off and its relay. */
static int place(enum pin pin)
{
        long n = opt.iterations;
        size_t bytes = (size_t)n * sizeof(double);
        double *samples = shm_alloc(bytes), *floor = malloc(bytes), *floor_rt = malloc(bytes);
        const char *name = pin_name(pin);
        struct cpu_use cpu, f0, f1;
        double wakes;
        int err = -1;

        opt.pin = pin;
        if (opt.pin_daemon)
                pin_pid(opt.daemon_pid, ROLE_SERVER);
        floor_service_repin();
        if (!samples || !floor || !floor_rt) {
                report_error("placement", "out of memory");
                goto out;
        }
        floor_cpu(&f0);
        /* the round-trip floor is the one sampled alongside ping: reported first */
        err = hot_measure(0, n, samples, floor_rt, &wakes, &cpu);
        floor_cpu(&f1);
        if (err == 0) {
                struct cpu_use fc = {.client = f1.client - f0.client,
                                     .server = f1.server - f0.server,
                                     .ops = f1.ops - f0.ops};
                struct latency l = {.scenario = "placement",
                                    .key = "rt",
                                    .label = "AF_UNIX round trip (floor)",
                                    .placement = name,
                                    .v = floor,
                                    .n = (size_t)n,
                                    .wakes = -1,
                                    .cpu = &fc};
                /* latency_row sorts: report the floor from a copy */
                memcpy(floor, floor_rt, bytes);
                latency_row(&l, NULL);
                l.key = "ping";
                l.label = "dlx_ping";
                l.v = samples;
                l.floor = floor_rt;
                l.floor_name = "rt";
                l.wakes = wakes;
                l.cpu = &cpu;
                latency_row(&l, NULL);
        }
        if (err == 0 && (err = hot_measure(4 * KIB, n, samples, floor_rt, &wakes, &cpu)) == 0) {
                struct latency l = {.scenario = "placement",
                                    .key = "hot_4096",
                                    .label = "acquire+release 4 KiB",
                                    .placement = name,
                                    .v = samples,
                                    .n = (size_t)n,
                                    .floor = floor_rt,
                                    .floor_name = "rt",
                                    .wakes = wakes,
                                    .cpu = &cpu};
                latency_row(&l, NULL);
        }
        if (err == 0)
                err = handoffs(name);
out:
        shm_free(samples, bytes);
        free(floor);
        free(floor_rt);
        return err;
}

int run_placement(void)
{
        enum pin run_pin = opt.pin;
        int err = 0;

        report_heading("placement", "the same latencies in each placement, each against its "
                                    "floor there; cpu: clients + server per op");
        for (int p = 0; p < PIN_MODES && err == 0; p++)
                if (opt.placements & (1u << p))
                        err = place((enum pin)p);
        /* the scenarios after this one run where --pin put them */
        opt.pin = run_pin;
        if (opt.pin_daemon)
                pin_pid(opt.daemon_pid, ROLE_SERVER);
        floor_service_repin();
        return err;
}
