/* SPDX-License-Identifier: MIT */
/*
 * --cuda: GPU tensors through libdlx. Everything CUDA happens in children (a
 * CUDA context does not survive fork), and the driver is loaded with dlopen,
 * so the bench builds and runs without CUDA and skips this part cleanly.
 *
 *  - cached acquire+release of a VMM tensor and of a legacy-IPC tensor (one
 *    lease held throughout, so the handle stays open), against the CPU's 4 KiB
 *    hot acquire; the driver's own event record + stream wait as a floor
 *  - first acquire of a new legacy IPC handle and of a new VMM fd
 *  - "weights update": many tensors totalling a few GiB, from one dlx_alloc
 *    arena vs one cuMemAlloc per tensor; publish and acquire times
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define GPU ((DLDevice){kDLCUDA, 0})
#define SHORT_MS 120000
#define LONG_MS 600000

/* ---- the few driver entry points the bench itself calls --------------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;

#define CU_EVENT_DISABLE_TIMING 0x2

struct drv {
        CUresult (*Init)(unsigned);
        CUresult (*DeviceGet)(CUdevice *, int);
        CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
        CUresult (*CtxSetCurrent)(CUcontext);
        CUresult (*MemAlloc)(CUdeviceptr *, size_t);
        CUresult (*MemFree)(CUdeviceptr);
        CUresult (*EventCreate)(CUevent *, unsigned);
        CUresult (*EventRecord)(CUevent, CUstream);
        CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
        CUresult (*EventDestroy)(CUevent);
        CUresult (*CtxSynchronize)(void);
        CUresult (*GetErrorString)(CUresult, const char **);
};

static struct drv drv;

static int cu_check(CUresult r, const char *what)
{
        const char *s = NULL;

        if (r == 0)
                return 0;
        if (drv.GetErrorString)
                drv.GetErrorString(r, &s);
        fprintf(stderr, "dlx-bench: cuda: %s: %s (%d)\n", what, s ? s : "error", r);
        return -1;
}

/* Loads the driver and makes device 0's primary context current. In a child only. */
static int drv_open(void)
{
        static const struct {
                const char *sym;
                size_t off;
        } syms[] = {
                {"cuInit", offsetof(struct drv, Init)},
                {"cuDeviceGet", offsetof(struct drv, DeviceGet)},
                {"cuDevicePrimaryCtxRetain", offsetof(struct drv, DevicePrimaryCtxRetain)},
                {"cuCtxSetCurrent", offsetof(struct drv, CtxSetCurrent)},
                {"cuMemAlloc_v2", offsetof(struct drv, MemAlloc)},
                {"cuMemFree_v2", offsetof(struct drv, MemFree)},
                {"cuEventCreate", offsetof(struct drv, EventCreate)},
                {"cuEventRecord", offsetof(struct drv, EventRecord)},
                {"cuStreamWaitEvent", offsetof(struct drv, StreamWaitEvent)},
                {"cuEventDestroy_v2", offsetof(struct drv, EventDestroy)},
                {"cuCtxSynchronize", offsetof(struct drv, CtxSynchronize)},
                {"cuGetErrorString", offsetof(struct drv, GetErrorString)},
        };
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        CUcontext ctx;
        CUdevice dev;

        if (!lib) {
                fprintf(stderr, "dlx-bench: cuda: %s\n", dlerror());
                return -1;
        }
        for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
                void *fn = dlsym(lib, syms[i].sym);
                if (!fn) {
                        fprintf(stderr, "dlx-bench: cuda: the driver lacks %s\n", syms[i].sym);
                        return -1;
                }
                memcpy((char *)&drv + syms[i].off, &fn, sizeof(fn));
        }
        if (cu_check(drv.Init(0), "cuInit") < 0 ||
            cu_check(drv.DeviceGet(&dev, 0), "cuDeviceGet") ||
            cu_check(drv.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
            cu_check(drv.CtxSetCurrent(ctx), "cuCtxSetCurrent"))
                return -1;
        return 0;
}

/* ---- is there CUDA at all? --------------------------------------------------------------------
 */

#define PROBE_SKIP 77

static int probe(int ctl, void *p)
{
        dlx_client *c = bench_connect("bench-cuda-probe");
        DLManagedTensorVersioned *t;
        DLTensor proto;
        int64_t shape[1];
        int err;

        (void)ctl;
        if (!c)
                return 1;
        proto_u8(&proto, shape, 4 * KIB, GPU);
        err = dlx_alloc(c, &proto, &t);
        if (err == 0)
                t->deleter(t);
        else
                snprintf(p, 160, "%s", dlx_last_error());
        dlx_close(c);
        if (err == -ENODEV || err == -ENOTSUP)
                return PROBE_SKIP;
        if (err < 0)
                return dlx_fail("cuda: dlx_alloc of a kDLCUDA tensor", err), 1;
        return 0;
}

/* ---- producers ---------------------------------------------------------------------------- */

enum gpu_kind { KIND_VMM, KIND_IPC };

struct gprod_arg {
        enum gpu_kind kind;
        char base[64];
        int count;
        uint64_t size;
        bool fresh_segments; /* VMM: one client per tensor, so each has its own segment */
        double *samples;     /* publish times, or NULL */
        double *total;       /* allocate + publish, all tensors */
};

static int gpu_producer(int ctl, void *p)
{
        struct gprod_arg *a = p;
        int nclients = a->kind == KIND_VMM && a->fresh_segments ? a->count : 1;
        dlx_client **cs = calloc((size_t)nclients, sizeof(*cs));
        CUdeviceptr *ptrs = a->kind == KIND_IPC ? calloc((size_t)a->count, sizeof(*ptrs)) : NULL;
        char name[256];
        uint64_t done, start;
        int err = 0, rc = 1, made = 0;

        pin_self(ROLE_CLIENT);
        if (!cs || (a->kind == KIND_IPC && !ptrs))
                return 1;
        if (a->kind == KIND_IPC && drv_open() < 0)
                return 1;
        for (made = 0; made < nclients; made++)
                if (!(cs[made] = bench_connect("bench-cuda-producer")))
                        goto out;
        start = now_ns();
        for (int i = 0; i < a->count; i++) {
                dlx_client *c = cs[nclients == 1 ? 0 : i];
                DLManagedTensorVersioned *t;

                if (a->kind == KIND_VMM) {
                        DLTensor proto;
                        int64_t shape[1];
                        proto_u8(&proto, shape, a->size, GPU);
                        err = dlx_alloc(c, &proto, &t);
                        if (err < 0) {
                                dlx_fail("cuda: dlx_alloc", err);
                                goto out;
                        }
                } else {
                        /* memory of the framework's own: shared through its legacy IPC handle */
                        if (cu_check(drv.MemAlloc(&ptrs[i], a->size), "cuMemAlloc") < 0)
                                goto out;
                        t = view_new((void *)(uintptr_t)ptrs[i], a->size, GPU);
                        if (!t)
                                goto out;
                }
                bench_name(name, sizeof(name), "%s/%d", a->base, i);
                uint64_t t0 = now_ns();
                err = dlx_publish(c, name, t, NULL, NULL);
                uint64_t t1 = now_ns();
                if (err < 0) {
                        dlx_fail("cuda: dlx_publish", err);
                        goto out;
                }
                if (a->samples)
                        a->samples[i] = (double)(t1 - t0);
        }
        if (a->total)
                *a->total = (double)(now_ns() - start);
        if (msg_send(ctl, 1) == 0 && msg_recv(ctl, &done, -1) == 0)
                rc = 0;
out:
        for (int i = 0; i < made; i++)
                dlx_close(cs[i]);
        /* the clients are closed and every reader's work waited for: the memory is ours again */
        for (int i = 0; ptrs && i < a->count; i++)
                if (ptrs[i])
                        drv.MemFree(ptrs[i]);
        free(ptrs);
        free(cs);
        return rc;
}

static int gpu_producer_start(struct child *ch, struct gprod_arg *a)
{
        uint64_t ready;

        if (child_start(ch, "cuda producer", gpu_producer, a) < 0) {
                report_error("cuda", "fork failed");
                return -1;
        }
        if (msg_recv(ch->ctl, &ready, LONG_MS) < 0) {
                child_done(ch, 1000, "cuda");
                if (ch->pid > 0)
                        child_kill(ch);
                return -1;
        }
        return 0;
}

static int gpu_producer_stop(struct child *ch)
{
        msg_send(ch->ctl, 1);
        return child_done(ch, SHORT_MS, "cuda");
}

/* ---- consumers ------------------------------------------------------------------------------ */

struct hot_ctx {
        dlx_client *c;
        const char *name;
};

static int gpu_hot_op(void *ctx, long i)
{
        struct hot_ctx *h = ctx;
        DLManagedTensorVersioned *t;
        int err;

        (void)i;
        err = dlx_acquire(h->c, h->name, NULL, &t);
        if (err < 0)
                return dlx_fail("cuda: dlx_acquire", err);
        t->deleter(t);
        return 0;
}

struct gcons_arg {
        char base[64];
        enum { HOT, FIRST, ALL } mode;
        int count;       /* FIRST, ALL: tensors <base>/0..count-1 (FIRST: 0 is the warm-up) */
        long warm, n;    /* HOT */
        double *samples; /* HOT: n; FIRST: count - 1; ALL: count */
        double *floor;   /* HOT: n driver event record + stream wait, ns per pair */
        double *total;   /* ALL: every acquire */
};

static int gpu_consumer(int ctl, void *p)
{
        struct gcons_arg *a = p;
        dlx_client *c = bench_connect("bench-cuda-consumer");
        DLManagedTensorVersioned *held = NULL, **all = NULL, *t;
        char name[256];
        int err = 0;

        pin_self(ROLE_CLIENT);
        (void)ctl;
        if (!c)
                return 1;
        if (a->mode == HOT) {
                bench_name(name, sizeof(name), "%s/0", a->base);
                /* a lease held throughout keeps the handle open: every acquire below is cached */
                err = dlx_acquire(c, name, NULL, &held);
                if (err < 0) {
                        dlx_fail("cuda: dlx_acquire", err);
                } else {
                        struct hot_ctx h = {.c = c, .name = name};
                        err = paced_loop(ctl, a->warm, BLOCK_WARM, a->n, a->samples, gpu_hot_op,
                                         &h);
                }
                if (err == 0 && a->floor) {
                        CUevent ev;
                        if (drv_open() < 0 ||
                            cu_check(drv.EventCreate(&ev, CU_EVENT_DISABLE_TIMING),
                                     "cuEventCreate"))
                                err = -1;
                        for (long i = 0; err == 0 && i < a->warm + a->n; i++) {
                                uint64_t t0 = now_ns();
                                if (cu_check(drv.EventRecord(ev, NULL), "cuEventRecord") ||
                                    cu_check(drv.StreamWaitEvent(NULL, ev, 0), "cuStreamWaitEvent"))
                                        err = -1;
                                uint64_t t1 = now_ns();
                                if (i >= a->warm)
                                        a->floor[i - a->warm] = (double)(t1 - t0);
                        }
                        if (err == 0) {
                                drv.CtxSynchronize();
                                drv.EventDestroy(ev);
                        }
                }
        } else if (a->mode == FIRST) {
                for (int i = 0; err == 0 && i < a->count; i++) {
                        bench_name(name, sizeof(name), "%s/%d", a->base, i);
                        uint64_t t0 = now_ns();
                        err = dlx_acquire(c, name, NULL, &t);
                        uint64_t t1 = now_ns();
                        if (err < 0) {
                                dlx_fail("cuda: dlx_acquire", err);
                                break;
                        }
                        /* the first one also brings the driver up: not counted */
                        if (i > 0)
                                a->samples[i - 1] = (double)(t1 - t0);
                        t->deleter(t);
                }
        } else {
                /* a reader of new weights maps them all and keeps them */
                all = calloc((size_t)a->count, sizeof(*all));
                uint64_t start = now_ns();
                for (int i = 0; all && err == 0 && i < a->count; i++) {
                        bench_name(name, sizeof(name), "%s/%d", a->base, i);
                        uint64_t t0 = now_ns();
                        err = dlx_acquire(c, name, NULL, &all[i]);
                        uint64_t t1 = now_ns();
                        if (err < 0) {
                                dlx_fail("cuda: dlx_acquire", err);
                                break;
                        }
                        a->samples[i] = (double)(t1 - t0);
                }
                *a->total = (double)(now_ns() - start);
                for (int i = 0; all && i < a->count; i++)
                        if (all[i])
                                all[i]->deleter(all[i]);
                if (!all)
                        err = -ENOMEM;
                free(all);
        }
        if (held)
                held->deleter(held);
        dlx_close(c);
        return err < 0;
}

/* ---- the runs ------------------------------------------------------------------------------- */

/* A latency row: its ratio to paired (floor samples taken alongside) or else to floor. */
static void gpu_row(const char *key, const char *label, double *v, size_t n, double *paired,
                    const struct stats *floor, const char *floor_name, struct stats *ret)
{
        struct row r = {.scenario = "cuda", .has_stats = true};
        struct stats f = {0};

        stats_of(v, n, &r.st);
        snprintf(r.key, sizeof(r.key), "%s", key);
        snprintf(r.label, sizeof(r.label), "%s", label);
        if (paired) {
                stats_of(paired, n, &f);
                r.floor_median = f.median;
        } else if (floor) {
                f = *floor;
        }
        if (f.n) {
                r.has_ratio = true;
                r.ratio = r.st.median / f.median;
                r.ratio_to = floor_name;
        }
        report_row(&r);
        if (ret)
                *ret = r.st;
}

/* A producer of count tensors and a consumer in mode over them; floor: paced (HOT). */
static int gpu_pair(struct gprod_arg *pa, struct gcons_arg *ca, double *floor)
{
        struct child prod, cons;
        int err;

        if (gpu_producer_start(&prod, pa) < 0)
                return -1;
        if (child_start(&cons, "cuda consumer", gpu_consumer, ca) < 0) {
                report_error("cuda", "fork failed");
                child_kill(&prod);
                return -1;
        }
        if (floor && paced_run(&cons, ca->n, FLOOR_RT, floor) < 0) {
                child_done(&cons, 2000, "cuda");
                err = -1;
        } else {
                err = child_done(&cons, LONG_MS, "cuda");
        }
        if (gpu_producer_stop(&prod) < 0)
                err = -1;
        return err;
}

static int cuda_hot(void)
{
        static const char *const kinds[] = {"vmm", "ipc"};
        long n = opt.iterations;
        size_t bytes = (size_t)n * sizeof(double);
        double *samples = shm_alloc(bytes), *driver = shm_alloc(bytes), *floor = malloc(bytes);
        struct stats st, fl = {0};
        char key[48], label[64];
        int err = 0;

        if (!samples || !driver || !floor) {
                report_error("cuda", "out of memory");
                err = -1;
        }
        for (int k = 0; k < 2 && err == 0; k++) {
                struct gprod_arg pa = {.kind = k ? KIND_IPC : KIND_VMM, .count = 1, .size = MIB};
                struct gcons_arg ca = {.mode = HOT, .warm = n / 10 + 10, .n = n};

                snprintf(pa.base, sizeof(pa.base), "cuda/hot/%s", kinds[k]);
                snprintf(ca.base, sizeof(ca.base), "%s", pa.base);
                ca.samples = samples;
                ca.floor = k == 0 ? driver : NULL;
                err = gpu_pair(&pa, &ca, floor);
                if (err < 0)
                        break;
                if (k == 0)
                        gpu_row("driver_event_floor", "driver: event record+stream wait", driver,
                                (size_t)n, NULL, NULL, NULL, &fl);
                snprintf(key, sizeof(key), "hot_%s", kinds[k]);
                snprintf(label, sizeof(label), "cached acquire+release 1 MiB, %s", kinds[k]);
                gpu_row(key, label, samples, (size_t)n, floor, NULL, "rt", &st);
                if (floors.hot4k.n) {
                        /* what the events add: record on release, stream wait on acquire */
                        struct row r = {.scenario = "cuda", .has_value = true, .unit = "ns"};
                        snprintf(r.key, sizeof(r.key), "event_overhead_%s", kinds[k]);
                        snprintf(r.label, sizeof(r.label), "  minus CPU hot 4 KiB");
                        r.value = st.median - floors.hot4k.median;
                        if (fl.n) {
                                r.has_ratio = true;
                                r.ratio = r.value / fl.median;
                                r.ratio_to = "driver";
                        }
                        report_row(&r);
                }
        }
        shm_free(samples, bytes);
        shm_free(driver, bytes);
        free(floor);
        return err;
}

static int cuda_first(void)
{
        int count = (int)(opt.iterations < 64 ? opt.iterations : 64);
        double *samples;
        int err = 0;

        if (opt.quick && count > 8)
                count = 8;
        if (count < 2)
                count = 2;
        samples = shm_alloc((size_t)count * sizeof(double));
        if (!samples) {
                report_error("cuda", "out of memory");
                return -1;
        }
        for (int k = 0; k < 2 && err == 0; k++) {
                struct gprod_arg pa = {.kind = k ? KIND_IPC : KIND_VMM,
                                       .count = count,
                                       .size = 2 * MIB,
                                       .fresh_segments = true};
                struct gcons_arg ca = {.mode = FIRST, .count = count, .samples = samples};

                snprintf(pa.base, sizeof(pa.base), "cuda/first/%s", k ? "ipc" : "vmm");
                snprintf(ca.base, sizeof(ca.base), "%s", pa.base);
                err = gpu_pair(&pa, &ca, NULL);
                if (err < 0)
                        break;
                gpu_row(k ? "first_ipc" : "first_vmm",
                        k ? "first acquire, new IPC handle" : "first acquire, new VMM fd", samples,
                        (size_t)count - 1, NULL, &floors.fd, "fd", NULL);
        }
        shm_free(samples, (size_t)count * sizeof(double));
        return err;
}

static int cuda_weights(void)
{
        int count = opt.quick ? 1000 : 20000;
        uint64_t total = opt.quick ? 64 * MIB : 2 * GIB;
        uint64_t size = (total / (uint64_t)count + 255) / 256 * 256;
        size_t bytes = (size_t)count * sizeof(double);
        double *pub = shm_alloc(bytes), *acq = shm_alloc(bytes),
               *totals = shm_alloc(4 * sizeof(double));
        double arena_pub = 0, arena_acq = 0;
        char sz[32], label[64];
        int err = 0;

        if (!pub || !acq || !totals) {
                report_error("cuda", "out of memory");
                err = -1;
        }
        for (int k = 0; k < 2 && err == 0; k++) {
                struct gprod_arg pa = {
                        .kind = k ? KIND_IPC : KIND_VMM, .count = count, .size = size};
                struct gcons_arg ca = {.mode = ALL, .count = count};
                struct row r = {.scenario = "cuda",
                                .has_stats = true,
                                .has_value = true,
                                .unit = "ms total"};
                const char *how = k ? "cuMemAlloc each" : "one arena";

                snprintf(pa.base, sizeof(pa.base), "cuda/weights/%s", k ? "each" : "arena");
                snprintf(ca.base, sizeof(ca.base), "%s", pa.base);
                pa.samples = pub;
                pa.total = &totals[0];
                ca.samples = acq;
                ca.total = &totals[1];
                err = gpu_pair(&pa, &ca, NULL);
                if (err < 0)
                        break;

                stats_of(pub, (size_t)count, &r.st);
                snprintf(r.key, sizeof(r.key), "weights_publish_%s", k ? "each" : "arena");
                snprintf(r.label, sizeof(r.label), "weights: publish, %s", how);
                r.value = totals[0] / 1e6;
                if (k == 0) {
                        arena_pub = totals[0];
                } else if (arena_pub > 0) {
                        r.has_ratio = true;
                        r.ratio = totals[0] / arena_pub;
                        r.ratio_to = "arena";
                }
                report_row(&r);

                r.has_ratio = false;
                stats_of(acq, (size_t)count, &r.st);
                snprintf(r.key, sizeof(r.key), "weights_acquire_%s", k ? "each" : "arena");
                snprintf(r.label, sizeof(r.label), "weights: acquire, %s", how);
                r.value = totals[1] / 1e6;
                if (k == 0) {
                        arena_acq = totals[1];
                } else if (arena_acq > 0) {
                        r.has_ratio = true;
                        r.ratio = totals[1] / arena_acq;
                        r.ratio_to = "arena";
                }
                report_row(&r);
        }
        if (err == 0 && !opt.json)
                printf("%-8s  (weights: %d tensors of %s, %s in all, from one client's dlx_alloc "
                       "arena or one cuMemAlloc each; figure: allocate + publish, or acquire, "
                       "all of them)\n",
                       "cuda", count, fmt_size(size, sz, sizeof(sz)),
                       fmt_size(total, label, sizeof(label)));
        shm_free(pub, bytes);
        shm_free(acq, bytes);
        shm_free(totals, 4 * sizeof(double));
        return err;
}

int run_cuda(void)
{
        char *why = shm_alloc(160);
        struct child ch;
        int rc;

        report_heading("cuda", "GPU tensors (device 0)");
        if (!why || child_start(&ch, "cuda probe", probe, why) < 0) {
                report_error("cuda", "cannot start the probe");
                shm_free(why, 160);
                return -1;
        }
        rc = child_wait(&ch, SHORT_MS);
        if (rc == PROBE_SKIP) {
                if (opt.json || getenv("DLX_BENCH_VERBOSE"))
                        fprintf(stderr, "dlx-bench: cuda: %s\n", why);
                report_skip("cuda", "", "no driver");
                shm_free(why, 160);
                return 0;
        }
        shm_free(why, 160);
        if (rc != 0) {
                report_error("cuda", "the probe failed (status %d)", rc);
                return -1;
        }
        if (cuda_hot() < 0 || cuda_first() < 0 || cuda_weights() < 0)
                return -1;
        return 0;
}
