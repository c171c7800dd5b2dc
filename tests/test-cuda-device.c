/* SPDX-License-Identifier: MIT */
/*
 * libdlx on a real GPU, against a real dlxd: legacy IPC views, VMM memory
 * that outlives its producer, ordering by interprocess events, the release
 * fence, the per-process IPC handle cache, a consumer killed while holding
 * a lease, and both ends in one process.
 *
 * Every producer and consumer is a child process that loads the driver and
 * calls cuInit itself; the test process (and the suite's probe, also a
 * child) never touch CUDA, so forking is always safe. Children report
 * failures in a shared page and by exit status, never with ck_assert.
 *
 * Where the outcome could depend on timing, a host function parks a stream
 * on a pipe until the other side has queued its work: a library that
 * forgot an ordering then fails every time, not now and then.
 *
 * No driver or no device: the suite's constructor exits 77 (meson's skip).
 */
#include <check.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"

/* How long a child waits for a step of the other side, and lives at all. */
#define WAIT_MS 30000
#define CHILD_LIMIT_S 100
/* How long a gate keeps a stream parked before giving up (and failing the case). */
#define GATE_MS 20000

#define MIB (UINT64_C(1) << 20)

/* ---- the driver, loaded here as libdlx loads it ---------------------------------------- */

/*
 * Each entry point by the ABI version its typedef names: cuGetProcAddress
 * with the CUDA version of the header would hand out newer ABIs under old
 * names (cuCtxSynchronize takes a context from 13.0 on).
 */
static struct {
        PFN_cuInit_v2000 Init;
        PFN_cuGetErrorName_v6000 GetErrorName;
        PFN_cuGetErrorString_v6000 GetErrorString;
        PFN_cuDriverGetVersion_v2020 DriverGetVersion;
        PFN_cuDeviceGetCount_v2000 DeviceGetCount;
        PFN_cuDeviceGet_v2000 DeviceGet;
        PFN_cuDeviceGetName_v2000 DeviceGetName;
        PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
        PFN_cuDevicePrimaryCtxRetain_v7000 DevicePrimaryCtxRetain;
        PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
        PFN_cuCtxSynchronize_v2000 CtxSynchronize;
        PFN_cuMemAlloc_v3020 MemAlloc;
        PFN_cuMemFree_v3020 MemFree;
        PFN_cuMemAllocHost_v3020 MemAllocHost;
        PFN_cuMemFreeHost_v2000 MemFreeHost;
        PFN_cuStreamCreate_v2000 StreamCreate;
        PFN_cuStreamDestroy_v4000 StreamDestroy;
        PFN_cuStreamSynchronize_v2000 StreamSynchronize;
        PFN_cuStreamQuery_v2000 StreamQuery;
        PFN_cuLaunchHostFunc_v10000 LaunchHostFunc;
        PFN_cuMemsetD32_v3020 MemsetD32;
        PFN_cuMemsetD32Async_v3020 MemsetD32Async;
        PFN_cuMemcpyHtoD_v3020 MemcpyHtoD;
        PFN_cuMemcpyDtoH_v3020 MemcpyDtoH;
        PFN_cuMemcpyDtoHAsync_v3020 MemcpyDtoHAsync;
} cu;

static void *resolve(void *lib, PFN_cuGetProcAddress_v12000 get_proc, const char *name, int version,
                     const char *symbol)
{
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        void *fn = NULL;

        if (get_proc && (get_proc(name, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) !=
                                 CUDA_SUCCESS ||
                         status != CU_GET_PROC_ADDRESS_SUCCESS))
                fn = NULL;
        if (!fn)
                fn = dlsym(lib, symbol);
        return fn;
}

/* Loads libcuda.so.1 into cu; returns 0, or -1 with the reason in why. */
static int cu_load(char *why, size_t len)
{
        PFN_cuGetProcAddress_v12000 get_proc = NULL;
        void *lib, *fn;

        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
                const char *e = dlerror();
                snprintf(why, len, "cannot load libcuda.so.1: %s", e ? e : "?");
                return -1;
        }
        fn = dlsym(lib, "cuGetProcAddress_v2");
        memcpy(&get_proc, &fn, sizeof(fn));

#define LOAD(field, name, version, symbol)                                                         \
        do {                                                                                       \
                fn = resolve(lib, get_proc, name, version, symbol);                                \
                if (!fn) {                                                                         \
                        snprintf(why, len, "the CUDA driver lacks %s", symbol);                    \
                        return -1;                                                                 \
                }                                                                                  \
                memcpy(&cu.field, &fn, sizeof(fn));                                                \
        } while (0)

        LOAD(Init, "cuInit", 2000, "cuInit");
        LOAD(GetErrorName, "cuGetErrorName", 6000, "cuGetErrorName");
        LOAD(GetErrorString, "cuGetErrorString", 6000, "cuGetErrorString");
        LOAD(DriverGetVersion, "cuDriverGetVersion", 2020, "cuDriverGetVersion");
        LOAD(DeviceGetCount, "cuDeviceGetCount", 2000, "cuDeviceGetCount");
        LOAD(DeviceGet, "cuDeviceGet", 2000, "cuDeviceGet");
        LOAD(DeviceGetName, "cuDeviceGetName", 2000, "cuDeviceGetName");
        LOAD(DeviceGetAttribute, "cuDeviceGetAttribute", 2000, "cuDeviceGetAttribute");
        LOAD(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain");
        LOAD(CtxSetCurrent, "cuCtxSetCurrent", 4000, "cuCtxSetCurrent");
        LOAD(CtxSynchronize, "cuCtxSynchronize", 2000, "cuCtxSynchronize");
        LOAD(MemAlloc, "cuMemAlloc", 3020, "cuMemAlloc_v2");
        LOAD(MemFree, "cuMemFree", 3020, "cuMemFree_v2");
        LOAD(MemAllocHost, "cuMemAllocHost", 3020, "cuMemAllocHost_v2");
        LOAD(MemFreeHost, "cuMemFreeHost", 2000, "cuMemFreeHost");
        LOAD(StreamCreate, "cuStreamCreate", 2000, "cuStreamCreate");
        LOAD(StreamDestroy, "cuStreamDestroy", 4000, "cuStreamDestroy_v2");
        LOAD(StreamSynchronize, "cuStreamSynchronize", 2000, "cuStreamSynchronize");
        LOAD(StreamQuery, "cuStreamQuery", 2000, "cuStreamQuery");
        LOAD(LaunchHostFunc, "cuLaunchHostFunc", 10000, "cuLaunchHostFunc");
        LOAD(MemsetD32, "cuMemsetD32", 3020, "cuMemsetD32_v2");
        LOAD(MemsetD32Async, "cuMemsetD32Async", 3020, "cuMemsetD32Async");
        LOAD(MemcpyHtoD, "cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2");
        LOAD(MemcpyDtoH, "cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2");
        LOAD(MemcpyDtoHAsync, "cuMemcpyDtoHAsync", 3020, "cuMemcpyDtoHAsync_v2");
#undef LOAD
        return 0;
}

static const char *cu_error(CUresult r)
{
        static char buf[256];
        const char *name = NULL, *text = NULL;

        if (cu.GetErrorName)
                cu.GetErrorName(r, &name);
        if (cu.GetErrorString)
                cu.GetErrorString(r, &text);
        snprintf(buf, sizeof(buf), "%s (%d): %s", name ? name : "CUDA error", (int)r,
                 text ? text : "?");
        return buf;
}

/* ---- children: roles, reports, steps ---------------------------------------------------- */

enum role { PRODUCER, CONSUMER, NROLES };
static const char *const role_name[NROLES] = {"producer", "consumer"};

/* One page shared by the test process and its children. */
struct shared {
        char why[NROLES][600];
        int gate_timed_out[NROLES];
        int busy_at_publish;
};

static struct shared *sh;
static enum role me;

/* One-way steps between processes: a byte down a pipe. */
enum chan { CH_READY, CH_PUBLISHED, CH_RELEASED, CH_GO, CH_STEP, CH_DONE, NCHANS };
static int chans[NCHANS][2];

/* A child's failure: recorded for the test process, then the child exits 1. */
__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(sh->why[me], sizeof(sh->why[me]), fmt, ap);
        va_end(ap);
        fprintf(stderr, "test-cuda-device %s[%d]: %s\n", role_name[me], (int)getpid(), sh->why[me]);
        _exit(1);
}

#define EXPECT(cond, ...)                                                                          \
        do {                                                                                       \
                if (!(cond))                                                                       \
                        die(__VA_ARGS__);                                                          \
        } while (0)

#define CU(call) cu_ok((call), #call, __LINE__)
static void cu_ok(CUresult r, const char *what, int line)
{
        if (r != CUDA_SUCCESS)
                die("line %d: %s: %s", line, what, cu_error(r));
}

#define DLX(call) dlx_ok((call), #call, __LINE__)
static int dlx_ok(int err, const char *what, int line)
{
        if (err < 0)
                die("line %d: %s: %s (%s)", line, what, dlx_strerror(err), dlx_last_error());
        return err;
}

static void post(enum chan c)
{
        char b = 1;

        while (write(chans[c][1], &b, 1) < 0)
                if (errno != EINTR)
                        die("write to a step pipe: %s", strerror(errno));
}

/* Waits up to ms for one step; returns whether it came. */
static bool step_wait(enum chan c, int ms)
{
        struct pollfd p = {.fd = chans[c][0], .events = POLLIN};
        char b;
        int r;

        do
                r = poll(&p, 1, ms);
        while (r < 0 && errno == EINTR);
        if (r != 1)
                return false;
        while (read(chans[c][0], &b, 1) < 0)
                if (errno != EINTR)
                        return false;
        return true;
}

static void await_step(enum chan c, const char *what)
{
        if (!step_wait(c, WAIT_MS))
                die("waited %d s for %s", WAIT_MS / 1000, what);
}

/*
 * A gate: a host function that parks stream until a step arrives on chan
 * (or GATE_MS pass, noted in *timed_out). It blocks nothing but that stream.
 */
struct gate {
        enum chan chan;
        int *timed_out;
};

static void CUDA_CB gate_fn(void *arg)
{
        struct gate *g = arg;

        /* a driver thread: no CUDA calls here, and no exit */
        if (!step_wait(g->chan, GATE_MS))
                __atomic_store_n(g->timed_out, 1, __ATOMIC_SEQ_CST);
}

static void gate_close(CUstream s, enum chan c, int *timed_out)
{
        static struct gate gates[4];
        static int ngates;

        EXPECT(ngates < 4, "too many gates");
        gates[ngates] = (struct gate){.chan = c, .timed_out = timed_out};
        CU(cu.LaunchHostFunc(s, gate_fn, &gates[ngates]));
        ngates++;
}

/* The driver, device 0's primary context current, and a non-blocking stream. */
static CUstream gpu_begin(void)
{
        char why[256];
        CUcontext ctx;
        CUdevice dev;
        CUstream s;

        if (cu_load(why, sizeof(why)) < 0)
                die("%s", why);
        CU(cu.Init(0));
        CU(cu.DeviceGet(&dev, 0));
        CU(cu.DevicePrimaryCtxRetain(&ctx, dev));
        CU(cu.CtxSetCurrent(ctx));
        CU(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
        return s;
}

static dlx_client *connect_or_die(const char *name)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = name};
        dlx_client *c = NULL;

        DLX(dlx_connect(&o, &c));
        return c;
}

/* ---- data ------------------------------------------------------------------------------- */

static uint32_t pat(uint32_t seed, uint64_t i)
{
        return seed ^ (uint32_t)(i * UINT64_C(2654435761));
}

/* Writes pat(seed, first + i) to n words at d, and waits until the device has them. */
static void fill(CUdeviceptr d, uint64_t first, size_t n, uint32_t seed)
{
        uint32_t *h = malloc(n * sizeof(*h));

        EXPECT(h, "out of memory");
        for (size_t i = 0; i < n; i++)
                h[i] = pat(seed, first + i);
        CU(cu.MemcpyHtoD(d, h, n * sizeof(*h)));
        /* a pageable copy may return before the DMA lands */
        CU(cu.CtxSynchronize());
        free(h);
}

static void expect_words(const uint32_t *h, size_t n, uint64_t first, uint32_t seed,
                         const char *what)
{
        for (size_t i = 0; i < n; i++)
                EXPECT(h[i] == pat(seed, first + i), "%s: word %zu is 0x%08x, want 0x%08x", what, i,
                       h[i], pat(seed, first + i));
}

static void *host_alloc(size_t bytes)
{
        void *p = NULL;

        CU(cu.MemAllocHost(&p, bytes));
        return p;
}

static CUdeviceptr dev_ptr(const DLTensor *t)
{
        return (CUdeviceptr)(uintptr_t)t->data + t->byte_offset;
}

/* A tensor over device memory it does not own: its deleter only counts. */
struct view {
        DLManagedTensorVersioned mt;
        int64_t shape[2];
        int *deleted;
};

static void view_deleter(DLManagedTensorVersioned *t)
{
        struct view *v = t->manager_ctx;

        __atomic_add_fetch(v->deleted, 1, __ATOMIC_SEQ_CST);
        free(v);
}

static DLManagedTensorVersioned *view_new(CUdeviceptr data, uint64_t byte_offset, int64_t rows,
                                          int64_t cols, int *deleted)
{
        struct view *v = calloc(1, sizeof(*v));

        EXPECT(v, "out of memory");
        v->mt.version.major = DLX_DLPACK_MAJOR;
        v->mt.version.minor = DLX_DLPACK_MINOR;
        v->mt.manager_ctx = v;
        v->mt.deleter = view_deleter;
        v->mt.dl_tensor.data = (void *)(uintptr_t)data;
        v->mt.dl_tensor.device.device_type = kDLCUDA;
        v->mt.dl_tensor.device.device_id = 0;
        v->mt.dl_tensor.ndim = 2;
        v->mt.dl_tensor.dtype.code = kDLUInt;
        v->mt.dl_tensor.dtype.bits = 32;
        v->mt.dl_tensor.dtype.lanes = 1;
        v->shape[0] = rows;
        v->shape[1] = cols;
        v->mt.dl_tensor.shape = v->shape;
        v->mt.dl_tensor.byte_offset = byte_offset;
        v->deleted = deleted;
        return &v->mt;
}

/* A compact uint32 [rows, cols] tensor in dlx_alloc's device memory. */
static DLManagedTensorVersioned *alloc_device(dlx_client *c, int64_t rows, int64_t cols)
{
        int64_t shape[2] = {rows, cols};
        DLTensor proto = {.device = {kDLCUDA, 0}, .ndim = 2, .shape = shape};
        DLManagedTensorVersioned *t = NULL;

        proto.dtype.code = kDLUInt;
        proto.dtype.bits = 32;
        proto.dtype.lanes = 1;
        DLX(dlx_alloc(c, &proto, &t));
        EXPECT(t->dl_tensor.device.device_type == kDLCUDA && t->dl_tensor.data,
               "dlx_alloc gave device type %d, data %p", (int)t->dl_tensor.device.device_type,
               t->dl_tensor.data);
        return t;
}

static void publish_on(dlx_client *c, const char *name, DLManagedTensorVersioned *t, CUstream s,
                       bool persist, uint64_t *ret_version)
{
        struct dlx_publish_options o = {.persist = persist, .stream = s};
        int err = dlx_publish(c, name, t, &o, ret_version);

        EXPECT(err == 0, "publish %s: %s (%s)", name, dlx_strerror(err), dlx_last_error());
}

/* Acquires name (waiting for it) on stream s (NULL: the client's) and checks how it came. */
static DLManagedTensorVersioned *acquire_cuda(dlx_client *c, const char *name, CUstream s,
                                              const char *storage, int64_t rows, int64_t cols)
{
        struct dlx_acquire_options o = {.timeout_ms = WAIT_MS, .stream = s};
        DLManagedTensorVersioned *t = NULL;
        const char *got = NULL;
        const DLTensor *d;
        int err;

        err = dlx_acquire(c, name, &o, &t);
        EXPECT(err == 0, "acquire %s: %s (%s)", name, dlx_strerror(err), dlx_last_error());
        DLX(dlx_tensor_info(t, NULL, NULL, &got));
        EXPECT(strcmp(got, storage) == 0, "%s came as %s, want %s", name, got, storage);
        d = &t->dl_tensor;
        EXPECT(d->device.device_type == kDLCUDA && d->device.device_id == 0,
               "%s: device (%d, %d), want (kDLCUDA, 0)", name, (int)d->device.device_type,
               (int)d->device.device_id);
        EXPECT(d->ndim == 2 && d->shape[0] == rows && d->shape[1] == cols,
               "%s: ndim %d shape [%lld, %lld], want [%lld, %lld]", name, (int)d->ndim,
               d->ndim > 0 ? (long long)d->shape[0] : -1LL,
               d->ndim > 1 ? (long long)d->shape[1] : -1LL, (long long)rows, (long long)cols);
        EXPECT(!d->strides || (d->strides[0] == cols && d->strides[1] == 1),
               "%s: strides [%lld, %lld], want compact", name, (long long)d->strides[0],
               (long long)d->strides[1]);
        EXPECT(d->dtype.code == kDLUInt && d->dtype.bits == 32 && d->dtype.lanes == 1,
               "%s: wrong dtype", name);
        EXPECT(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, "%s: not marked read-only", name);
        return t;
}

static void release(DLManagedTensorVersioned *t)
{
        t->deleter(t);
}

/* Reads dlx's events for up to ms, or until *flag is set. */
static void pump_until(dlx_client *c, const int *flag, int ms)
{
        struct timespec t0, t;

        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
                struct pollfd p = {.fd = dlx_fd(c), .events = POLLIN};
                int64_t left;

                DLX(dlx_process_events(c));
                if (flag && __atomic_load_n(flag, __ATOMIC_SEQ_CST))
                        return;
                clock_gettime(CLOCK_MONOTONIC, &t);
                left = ms - ((int64_t)(t.tv_sec - t0.tv_sec) * 1000 +
                             (t.tv_nsec - t0.tv_nsec) / 1000000);
                if (left <= 0)
                        return;
                poll(&p, 1, left > 50 ? 50 : (int)left);
        }
}

/* ---- the test process: spawning, reaping, reporting ------------------------------------ */

struct kid {
        pid_t pid;
        enum role role;
        void (*body)(void);
        int status;
};

static int kid_main(void *arg)
{
        struct kid *k = arg;

        me = k->role;
        /* nothing outlives the test: not a hung test, not a timed-out one */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(CHILD_LIMIT_S);
        k->body();
        return 0;
}

static void run_begin(void)
{
        sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        ck_assert_ptr_ne(sh, MAP_FAILED);
        memset(sh, 0, sizeof(*sh));
        for (int i = 0; i < NCHANS; i++)
                ck_assert_int_eq(pipe2(chans[i], O_CLOEXEC), 0);
}

static void spawn(struct kid *k, enum role role, void (*body)(void))
{
        k->role = role;
        k->body = body;
        k->status = -1;
        fflush(NULL);
        k->pid = fx_spawn(kid_main, k);
}

static int decode_status(int st)
{
        return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

/* Waits for every kid; once one fails, the others are killed rather than left to time out. */
static void reap(struct kid *kids, int n)
{
        for (;;) {
                bool failed = false;
                int left = 0;

                for (int i = 0; i < n; i++) {
                        int st;
                        if (kids[i].pid <= 0 || kids[i].status >= 0)
                                continue;
                        if (waitpid(kids[i].pid, &st, WNOHANG) == kids[i].pid)
                                kids[i].status = decode_status(st);
                        else
                                left++;
                }
                if (left == 0)
                        return;
                for (int i = 0; i < n; i++)
                        failed |= kids[i].status > 0;
                for (int i = 0; failed && i < n; i++)
                        if (kids[i].pid > 0 && kids[i].status < 0)
                                kill(kids[i].pid, SIGKILL);
                nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
        }
}

static void close_chans(void)
{
        for (int i = 0; i < NCHANS; i++) {
                if (chans[i][0] > 0)
                        close(chans[i][0]);
                if (chans[i][1] > 0)
                        close(chans[i][1]);
                chans[i][0] = chans[i][1] = -1;
        }
}

/* Which failure to tell first: one with a message, then one that died on its own. */
static int failure_rank(const struct kid *k)
{
        if (sh->why[k->role][0])
                return 0;
        return k->status == 128 + SIGKILL ? 2 : 1;
}

static void expect_kids_ok(const struct kid *kids, int n)
{
        char msg[2 * sizeof(sh->why) + 256] = "";
        size_t len = 0;

        for (int rank = 0; rank < 3; rank++) {
                for (int i = 0; i < n; i++) {
                        const struct kid *k = &kids[i];
                        char how[64];
                        if (k->status == 0 || failure_rank(k) != rank)
                                continue;
                        if (k->status > 128)
                                snprintf(how, sizeof(how), "died of signal %d%s", k->status - 128,
                                         k->status == 128 + SIGALRM ? " (its time limit)" : "");
                        else
                                snprintf(how, sizeof(how), "exited with %d", k->status);
                        len += (size_t)snprintf(
                                msg + len, len < sizeof(msg) ? sizeof(msg) - len : 0, "%s%s %s: %s",
                                len ? "; " : "", role_name[k->role], how,
                                rank == 0   ? sh->why[k->role]
                                : rank == 2 ? "killed once the other had failed"
                                            : "no message (see its stderr)");
                }
        }
        ck_assert_msg(msg[0] == '\0', "%s", msg);
}

/* Reaps, closes the steps, asserts every kid succeeded and no lease is left. */
static void run_end(struct kid *kids, int n)
{
        dlx_client *c;

        reap(kids, n);
        close_chans();
        expect_kids_ok(kids, n);
        munmap(sh, sizeof(*sh));
        c = fx_connect(&fx, "gpu-check");
        ck_assert_int_eq(fx_wait_leases(c, 0, 5000), 0);
        dlx_close(c);
}

/* A producer and a consumer process, from run_begin() to run_end(). */
static void run_pair(void (*producer)(void), void (*consumer)(void))
{
        struct kid k[2];

        run_begin();
        spawn(&k[0], PRODUCER, producer);
        spawn(&k[1], CONSUMER, consumer);
        run_end(k, 2);
}

/* ---- legacy IPC: a view at an offset into a cuMemAlloc allocation ---------------------- */

#define IPC_BYTES (64 * MIB)
#define IPC_DATA_OFF (3 * MIB + 4096)
#define IPC_BYTE_OFF 1024
#define IPC_ROWS 1000
#define IPC_COLS 1024
#define IPC_SEED 0xa5a5f00du

static void ipc_producer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-producer");
        struct dlx_info info;
        int deleted = 0;
        uint64_t v = 0;
        CUdeviceptr buf;

        CU(cu.MemAlloc(&buf, IPC_BYTES));
        fill(buf, 0, IPC_BYTES / 4, IPC_SEED);
        publish_on(c, "gpu/ipc",
                   view_new(buf + IPC_DATA_OFF, IPC_BYTE_OFF, IPC_ROWS, IPC_COLS, &deleted), s,
                   false, &v);
        EXPECT(v == 1, "first version is %llu", (unsigned long long)v);
        DLX(dlx_stat(c, "gpu/ipc", &info));
        EXPECT(info.device.device_type == kDLCUDA && info.ndim == 2,
               "stat: device type %d, ndim %d", (int)info.device.device_type, (int)info.ndim);
        await_step(CH_DONE, "the consumer's check");
        EXPECT(deleted == 0, "the deleter ran while the tensor was published");
        dlx_close(c);
        EXPECT(deleted == 1, "the deleter ran %d times on close, want 1", deleted);
        CU(cu.StreamSynchronize(s));
        CU(cu.StreamDestroy(s));
        CU(cu.MemFree(buf));
}

static void ipc_consumer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-consumer");
        size_t n = (size_t)IPC_ROWS * IPC_COLS;
        uint32_t *h = host_alloc(n * 4);
        DLManagedTensorVersioned *t;

        t = acquire_cuda(c, "gpu/ipc", s, "cuda-ipc", IPC_ROWS, IPC_COLS);
        /* the acquire made s wait for the producer's event */
        CU(cu.MemcpyDtoHAsync(h, dev_ptr(&t->dl_tensor), n * 4, s));
        CU(cu.StreamSynchronize(s));
        expect_words(h, n, (IPC_DATA_OFF + IPC_BYTE_OFF) / 4, IPC_SEED, "gpu/ipc as read");
        release(t);
        dlx_close(c);
        post(CH_DONE);
        CU(cu.MemFreeHost(h));
        CU(cu.StreamDestroy(s));
}

START_TEST(ipc_view_between_processes)
{
        run_pair(ipc_producer, ipc_consumer);
}
END_TEST

/* ---- device groups: one arena buffer in place, two cuMemAlloc buffers copied once ------ */

#define DG_ROWS 256
#define DG_COLS 1024
#define DG_WORDS ((size_t)DG_ROWS * DG_COLS)
#define DG_SEED_A 0x13579bdfu
#define DG_SEED_C 0x2468ace0u

/* "a" and "b" (tied) over one region, "c" over another; in place or copied once. */
static void dgroup_producer_of(bool in_place)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-producer");
        struct dlx_publish_options o = {.stream = s, .copy = in_place ? DLX_COPY_NEVER : 0};
        DLManagedTensorVersioned *buf = NULL;
        CUdeviceptr a, cc, mem[2] = {0, 0};
        struct dlx_member ms[3];
        int deleted = 0;
        uint64_t v = 0;
        int err;

        if (in_place) {
                buf = alloc_device(c, 2 * DG_ROWS, DG_COLS);
                a = (CUdeviceptr)(uintptr_t)buf->dl_tensor.data;
                cc = a + DG_WORDS * 4;
        } else {
                CU(cu.MemAlloc(&mem[0], DG_WORDS * 4));
                CU(cu.MemAlloc(&mem[1], DG_WORDS * 4));
                a = mem[0];
                cc = mem[1];
        }
        fill(a, 0, DG_WORDS, DG_SEED_A);
        fill(cc, 0, DG_WORDS, DG_SEED_C);
        ms[0] = (struct dlx_member){"a", view_new(a, 0, DG_ROWS, DG_COLS, &deleted)};
        ms[1] = (struct dlx_member){"b", view_new(a, 0, DG_ROWS, DG_COLS, &deleted)};
        ms[2] = (struct dlx_member){"c", view_new(cc, 0, DG_ROWS, DG_COLS, &deleted)};
        err = dlx_publish_group(c, "gpu/group", ms, 3, &o, &v);
        EXPECT(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        /* in place, the members live until released; copied, they went with the copy done */
        EXPECT(deleted == (in_place ? 0 : 3), "%d deleters ran at publish", deleted);
        if (!in_place) {
                CU(cu.MemFree(mem[0]));
                CU(cu.MemFree(mem[1]));
        }
        await_step(CH_DONE, "the consumer's check");
        dlx_close(c);
        EXPECT(deleted == 3, "%d deleters ran by close, want 3", deleted);
        if (buf)
                release(buf);
        CU(cu.StreamSynchronize(s));
        CU(cu.StreamDestroy(s));
}

static void dgroup_producer(void)
{
        dgroup_producer_of(true);
}

static void dgroup_copy_producer(void)
{
        dgroup_producer_of(false);
}

static void dgroup_consumer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-consumer");
        struct dlx_acquire_options o = {.timeout_ms = WAIT_MS, .stream = s};
        uint32_t *h = host_alloc(DG_WORDS * 4);
        DLManagedTensorVersioned *t = NULL;
        const char *storage = NULL;
        dlx_group *g = NULL;
        int err;

        err = dlx_acquire_group(c, "gpu/group", NULL, 0, &o, &g);
        EXPECT(err == 0, "acquire group: %s (%s)", dlx_strerror(err), dlx_last_error());
        EXPECT(dlx_group_count(g) == 3, "%zu members", dlx_group_count(g));
        for (size_t i = 0; i < 3; i++)
                EXPECT(dlx_group_tensor(g, i)->device.device_type == kDLCUDA,
                       "member %zu not on the GPU", i);
        EXPECT(dlx_group_tensor(g, 0)->data == dlx_group_tensor(g, 1)->data,
               "tied members came apart");
        /* the acquire made s wait for the producer's event */
        CU(cu.MemcpyDtoHAsync(h, dev_ptr(dlx_group_tensor(g, 0)), DG_WORDS * 4, s));
        CU(cu.StreamSynchronize(s));
        expect_words(h, DG_WORDS, 0, DG_SEED_A, "member a");
        DLX(dlx_group_take(g, 2, &t));
        DLX(dlx_tensor_info(t, NULL, NULL, &storage));
        EXPECT(strcmp(storage, "cuda-vmm") == 0 || strcmp(storage, "cuda-ipc") == 0,
               "a member came as %s", storage);
        dlx_group_release(g);
        CU(cu.MemcpyDtoHAsync(h, dev_ptr(&t->dl_tensor), DG_WORDS * 4, s));
        CU(cu.StreamSynchronize(s));
        expect_words(h, DG_WORDS, 0, DG_SEED_C, "member c, taken, after the group's release");
        release(t);
        dlx_close(c);
        post(CH_DONE);
        CU(cu.MemFreeHost(h));
        CU(cu.StreamDestroy(s));
}

START_TEST(device_group_in_place)
{
        run_pair(dgroup_producer, dgroup_consumer);
}
END_TEST

START_TEST(device_group_copied_once)
{
        run_pair(dgroup_copy_producer, dgroup_consumer);
}
END_TEST

/* ---- VMM: dlx_alloc device memory, persistent, outliving its producer ------------------ */

#define VMM_ROWS 4096
#define VMM_COLS 1024
#define VMM_SEED 0x0badcafeu

static void vmm_producer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-producer");
        DLManagedTensorVersioned *t;
        uint64_t v = 0;

        DLX(dlx_set_stream(c, 0, s));
        EXPECT(dlx_get_stream(c, 0) == (void *)s, "dlx_get_stream does not give the stream set");
        t = alloc_device(c, VMM_ROWS, VMM_COLS);
        fill((CUdeviceptr)(uintptr_t)t->dl_tensor.data, 0, (size_t)VMM_ROWS * VMM_COLS, VMM_SEED);
        /* no stream in the options: dlx_set_stream's */
        publish_on(c, "gpu/vmm", t, NULL, true, &v);
        EXPECT(v == 1, "first version is %llu", (unsigned long long)v);
        dlx_close(c);
        CU(cu.StreamSynchronize(s));
        CU(cu.StreamDestroy(s));
}

static void vmm_consumer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-consumer");
        size_t n = (size_t)VMM_ROWS * VMM_COLS;
        uint32_t *h = host_alloc(n * 4);
        DLManagedTensorVersioned *t1, *t2;

        DLX(dlx_set_stream(c, 0, s));
        t1 = acquire_cuda(c, "gpu/vmm", NULL, "cuda-vmm", VMM_ROWS, VMM_COLS);
        CU(cu.MemcpyDtoHAsync(h, dev_ptr(&t1->dl_tensor), n * 4, s));
        CU(cu.StreamSynchronize(s));
        expect_words(h, n, 0, VMM_SEED, "gpu/vmm after its producer exited");
        /* a segment is mapped once per process */
        t2 = acquire_cuda(c, "gpu/vmm", NULL, "cuda-vmm", VMM_ROWS, VMM_COLS);
        EXPECT(dev_ptr(&t2->dl_tensor) == dev_ptr(&t1->dl_tensor),
               "a second acquire mapped the segment again (0x%llx, first 0x%llx)",
               (unsigned long long)dev_ptr(&t2->dl_tensor),
               (unsigned long long)dev_ptr(&t1->dl_tensor));
        release(t1);
        memset(h, 0, n * 4);
        CU(cu.MemcpyDtoHAsync(h, dev_ptr(&t2->dl_tensor), n * 4, s));
        CU(cu.StreamSynchronize(s));
        expect_words(h, n, 0, VMM_SEED, "gpu/vmm through the second lease");
        release(t2);
        dlx_close(c);
        CU(cu.MemFreeHost(h));
        CU(cu.StreamDestroy(s));
}

START_TEST(vmm_persistent_outlives_producer)
{
        struct dlx_info info;
        struct kid p, k;
        dlx_client *c;

        run_begin();
        spawn(&p, PRODUCER, vmm_producer);
        reap(&p, 1);
        expect_kids_ok(&p, 1);
        /* the producer has gone (and its CUDA context with it) before anyone maps the memory */
        spawn(&k, CONSUMER, vmm_consumer);
        run_end(&k, 1);

        c = fx_connect(&fx, "gpu-check");
        ck_assert_int_eq(dlx_stat(c, "gpu/vmm", &info), 0);
        ck_assert(info.persist);
        ck_assert_int_eq(info.producer_pid, 0);
        ck_assert_int_eq(info.device.device_type, kDLCUDA);
        ck_assert_int_eq(dlx_unpublish(c, "gpu/vmm"), 0);
        dlx_close(c);
}
END_TEST

/* ---- ordering: the consumer's stream waits for the producer's unfinished writes -------- */

#define ORD_BYTES (1024 * MIB)
#define ORD_WORDS (ORD_BYTES / 4)
#define ORD_COLS 4096
#define ORD_ROWS (ORD_WORDS / ORD_COLS)
#define ORD_SLICE (256 * 1024) /* words read at the start, middle and end */
#define ORD_OLD 0x01010101u
#define ORD_FINAL 0x7e57f1a1u

static bool ord_gated;
/* the consumer reads on a second stream of its own, ordered with dlx_tensor_sync() */
static bool ord_other, fence_other;

/* A second consumer stream for t, ordered after the producer's write; s itself if !other. */
static CUstream other_stream(DLManagedTensorVersioned *t, CUstream s, bool other)
{
        CUstream r;

        if (!other)
                return s;
        CU(cu.StreamCreate(&r, CU_STREAM_NON_BLOCKING));
        DLX(dlx_tensor_sync(t, (void *)r));
        DLX(dlx_tensor_sync(t, (void *)r)); /* the same stream again: nothing more */
        return r;
}

static void ord_producer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-producer");
        int passes = ord_gated ? 16 : 64, deleted = 0;
        CUdeviceptr buf;

        CU(cu.MemAlloc(&buf, ORD_BYTES));
        CU(cu.MemsetD32(buf, ORD_OLD, ORD_WORDS));
        CU(cu.CtxSynchronize());
        await_step(CH_READY, "the consumer to be ready");
        /* gated: nothing below runs before the consumer has queued its copy */
        if (ord_gated)
                gate_close(s, CH_GO, &sh->gate_timed_out[PRODUCER]);
        for (int k = 0; k < passes; k++)
                CU(cu.MemsetD32Async(buf, 0x5c000000u + (unsigned)k, ORD_WORDS, s));
        CU(cu.MemsetD32Async(buf, ORD_FINAL, ORD_WORDS, s));
        /* published without synchronising: the event carries the order */
        publish_on(c, "gpu/order", view_new(buf, 0, ORD_ROWS, ORD_COLS, &deleted), s, false, NULL);
        sh->busy_at_publish = cu.StreamQuery(s) == CUDA_ERROR_NOT_READY;
        EXPECT(!__atomic_load_n(&sh->gate_timed_out[PRODUCER], __ATOMIC_SEQ_CST),
               "dlx_publish waited %d s for the producer's queued writes (a driver call in it "
               "synchronised the stream)",
               GATE_MS / 1000);
        await_step(CH_DONE, "the consumer's check");
        CU(cu.StreamSynchronize(s));
        EXPECT(!sh->gate_timed_out[PRODUCER],
               "the gate on the producer's stream was never opened: the consumer (or the "
               "publish) blocked on work queued behind it");
        dlx_close(c);
        EXPECT(deleted == 1, "the deleter ran %d times, want 1", deleted);
        CU(cu.StreamDestroy(s));
        CU(cu.MemFree(buf));
}

static void ord_consumer(void)
{
        static const uint64_t at[3] = {0, ORD_WORDS / 2 - ORD_SLICE / 2, ORD_WORDS - ORD_SLICE};
        CUstream s = gpu_begin(), r;
        dlx_client *c = connect_or_die("gpu-consumer");
        uint32_t *h = host_alloc(3 * ORD_SLICE * 4);
        DLManagedTensorVersioned *t;
        CUdeviceptr d;

        post(CH_READY);
        t = acquire_cuda(c, "gpu/order", s, "cuda-ipc", ORD_ROWS, ORD_COLS);
        r = other_stream(t, s, ord_other);
        d = dev_ptr(&t->dl_tensor);
        for (int k = 0; k < 3; k++)
                CU(cu.MemcpyDtoHAsync(h + k * ORD_SLICE, d + at[k] * 4, ORD_SLICE * 4, r));
        if (ord_gated)
                post(CH_GO);
        CU(cu.StreamSynchronize(r));
        for (size_t i = 0; i < 3 * ORD_SLICE; i++)
                EXPECT(h[i] == ORD_FINAL, "word %llu reads 0x%08x, want 0x%08x: %s",
                       (unsigned long long)(at[i / ORD_SLICE] + i % ORD_SLICE), h[i], ORD_FINAL,
                       h[i] == ORD_OLD ? "the copy ran before the producer's writes"
                                       : "the copy ran amid the producer's writes");
        release(t);
        dlx_close(c);
        post(CH_DONE);
        CU(cu.MemFreeHost(h));
        if (r != s)
                CU(cu.StreamDestroy(r));
        CU(cu.StreamDestroy(s));
}

static void ordering_case(bool gated, bool other)
{
        struct kid k[2];
        int busy;

        ord_gated = gated;
        ord_other = other;
        run_begin();
        spawn(&k[0], PRODUCER, ord_producer);
        spawn(&k[1], CONSUMER, ord_consumer);
        reap(k, 2);
        busy = k[0].status == 0 ? sh->busy_at_publish : -1;
        run_end(k, 2);
        if (busy == 0)
                fprintf(stderr,
                        "test-cuda-device: note: the producer's %s stream had drained before "
                        "the publish returned; this run did not race\n",
                        gated ? "gated" : "ungated");
        ck_assert_msg(!gated || busy == 1, "the gated stream was idle at publish");
}

static const struct {
        bool gated, other;
} ordering_rows[] = {
        {true, false},  /* gated */
        {false, false}, /* a slow write */
        /* __dlpack__(stream=): the consumer reads on another stream than acquire's */
        {true, true},
};

START_TEST(ordering)
{
        ordering_case(ordering_rows[_i].gated, ordering_rows[_i].other);
}
END_TEST

/* ---- the release fence: the producer reuses the memory only after the reader's copy ---- */

#define FENCE_ROWS 4096
#define FENCE_COLS 4096
#define FENCE_WORDS ((size_t)FENCE_ROWS * FENCE_COLS)
#define FENCE_SEED 0x600dda7au
#define FENCE_NEW 0xdeadbeefu

static bool fence_vmm;

static void fence_producer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-producer");
        DLManagedTensorVersioned *alloc = NULL;
        int deleted = 0;
        uint32_t word = 0;
        uint64_t v = 0;
        CUdeviceptr buf;

        if (fence_vmm) {
                alloc = alloc_device(c, FENCE_ROWS, FENCE_COLS);
                buf = (CUdeviceptr)(uintptr_t)alloc->dl_tensor.data;
        } else {
                CU(cu.MemAlloc(&buf, FENCE_WORDS * 4));
        }
        fill(buf, 0, FENCE_WORDS, FENCE_SEED);
        /* a view of our own: the memory stays ours after the version goes */
        publish_on(c, "gpu/fence", view_new(buf, 0, FENCE_ROWS, FENCE_COLS, &deleted), s, false,
                   &v);
        await_step(CH_RELEASED, "the consumer to acquire, queue its copy and release");
        DLX(dlx_unpublish(c, "gpu/fence"));
        DLX(dlx_wait_released(c, "gpu/fence", v, s, WAIT_MS));
        EXPECT(deleted == 1, "after dlx_wait_released the deleter has run %d times, want 1",
               deleted);
        /* s now waits, on the GPU, for the reader's copy still parked behind its gate */
        CU(cu.MemsetD32Async(buf, FENCE_NEW, FENCE_WORDS, s));
        post(CH_GO);
        CU(cu.StreamSynchronize(s));
        CU(cu.MemcpyDtoH(&word, buf + (FENCE_WORDS - 1) * 4, 4));
        EXPECT(word == FENCE_NEW, "the overwrite did not land (0x%08x)", word);
        await_step(CH_DONE, "the consumer's check");
        if (alloc)
                release(alloc);
        else
                CU(cu.MemFree(buf));
        dlx_close(c);
        CU(cu.StreamDestroy(s));
}

static void fence_consumer(void)
{
        CUstream s = gpu_begin(), r;
        dlx_client *c = connect_or_die("gpu-consumer");
        uint32_t *h = host_alloc(FENCE_WORDS * 4);
        DLManagedTensorVersioned *t;

        t = acquire_cuda(c, "gpu/fence", s, fence_vmm ? "cuda-vmm" : "cuda-ipc", FENCE_ROWS,
                         FENCE_COLS);
        /* with fence_other the copy is on a second stream: the release must wait for it too */
        r = other_stream(t, s, fence_other);
        /* the copy waits for the producer's go, which comes only after its overwrite is queued */
        gate_close(r, CH_GO, &sh->gate_timed_out[CONSUMER]);
        CU(cu.MemcpyDtoHAsync(h, dev_ptr(&t->dl_tensor), FENCE_WORDS * 4, r));
        release(t);
        EXPECT(!__atomic_load_n(&sh->gate_timed_out[CONSUMER], __ATOMIC_SEQ_CST),
               "releasing waited %d s for the reader's own queued copy (a driver call in the "
               "deleter synchronised the stream)",
               GATE_MS / 1000);
        post(CH_RELEASED);
        CU(cu.StreamSynchronize(r));
        CU(cu.StreamSynchronize(s));
        EXPECT(!sh->gate_timed_out[CONSUMER],
               "the producer never said go (its dlx_wait_released or overwrite is stuck)");
        for (size_t i = 0; i < FENCE_WORDS; i++)
                EXPECT(h[i] == pat(FENCE_SEED, i), "word %zu reads 0x%08x, want 0x%08x%s", i, h[i],
                       pat(FENCE_SEED, i),
                       h[i] == FENCE_NEW ? ": the producer overwrote it before the reader's "
                                           "copy (the release fence did not hold)"
                                         : "");
        dlx_close(c);
        post(CH_DONE);
        CU(cu.MemFreeHost(h));
        if (r != s)
                CU(cu.StreamDestroy(r));
        CU(cu.StreamDestroy(s));
}

static const struct {
        bool vmm, other;
} fence_rows[] = {
        {false, false}, /* legacy IPC */
        {true, false},  /* VMM */
        /* the reader's copy on a second stream (dlx_tensor_sync): the release joins it */
        {false, true},
};

START_TEST(release_fence)
{
        fence_vmm = fence_rows[_i].vmm;
        fence_other = fence_rows[_i].other;
        run_pair(fence_producer, fence_consumer);
}
END_TEST

/* ---- the IPC handle cache: 100 views of one allocation in one process ------------------ */

#define CACHE_N 100
#define CACHE_BYTES (64 * MIB)
#define CACHE_STRIDE (256 * 1024)
#define CACHE_COLS 1024
#define CACHE_ROUNDS 5
#define CACHE_SEED 0xc0ffee00u

static void cache_producer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-producer");
        int deleted = 0;
        CUdeviceptr buf;
        char name[64];

        CU(cu.MemAlloc(&buf, CACHE_BYTES));
        fill(buf, 0, CACHE_BYTES / 4, CACHE_SEED);
        for (int i = 0; i < CACHE_N; i++) {
                snprintf(name, sizeof(name), "gpu/cache/%03d", i);
                publish_on(
                        c, name,
                        view_new(buf + (CUdeviceptr)i * CACHE_STRIDE, 0, 1, CACHE_COLS, &deleted),
                        s, false, NULL);
        }
        post(CH_PUBLISHED);
        await_step(CH_DONE, "the consumer's rounds");
        EXPECT(deleted == 0, "%d deleters ran while published", deleted);
        dlx_close(c);
        EXPECT(deleted == CACHE_N, "%d deleters ran on close, want %d", deleted, CACHE_N);
        CU(cu.StreamSynchronize(s));
        CU(cu.StreamDestroy(s));
        CU(cu.MemFree(buf));
}

/* Acquires views [from, to) into t, all of which must lie in one mapping at base. */
static void cache_acquire(dlx_client *c, CUstream s, DLManagedTensorVersioned **t, int from, int to,
                          CUdeviceptr *base, const char *when)
{
        char name[64];

        for (int i = from; i < to; i++) {
                struct dlx_acquire_options o = {.stream = s};
                CUdeviceptr b;
                int err;

                snprintf(name, sizeof(name), "gpu/cache/%03d", i);
                err = dlx_acquire(c, name, &o, &t[i]);
                EXPECT(err == 0, "%s: acquire %s: %s (%s)", when, name, dlx_strerror(err),
                       dlx_last_error());
                b = dev_ptr(&t[i]->dl_tensor) - (CUdeviceptr)i * CACHE_STRIDE;
                if (!*base)
                        *base = b;
                EXPECT(b == *base,
                       "%s: %s is mapped at base 0x%llx, the others at 0x%llx: one allocation "
                       "was opened twice",
                       when, name, (unsigned long long)b, (unsigned long long)*base);
        }
}

static void cache_copy(DLManagedTensorVersioned **t, uint32_t *h, CUstream s)
{
        for (int i = 0; i < CACHE_N; i++)
                CU(cu.MemcpyDtoHAsync(h + (size_t)i * CACHE_COLS, dev_ptr(&t[i]->dl_tensor),
                                      CACHE_COLS * 4, s));
}

static void cache_check(const uint32_t *h, const char *when)
{
        char what[128];

        for (int i = 0; i < CACHE_N; i++) {
                snprintf(what, sizeof(what), "%s: view %d", when, i);
                expect_words(h + (size_t)i * CACHE_COLS, CACHE_COLS, (uint64_t)i * CACHE_STRIDE / 4,
                             CACHE_SEED, what);
        }
}

static void cache_release(DLManagedTensorVersioned **t, int from, int to, bool backwards)
{
        for (int i = 0; i < to - from; i++) {
                int j = backwards ? to - 1 - i : from + i;
                release(t[j]);
                t[j] = NULL;
        }
}

static void cache_consumer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-consumer");
        uint32_t *h = host_alloc((size_t)CACHE_N * CACHE_COLS * 4);
        uint32_t *h2 = host_alloc((size_t)CACHE_N * CACHE_COLS * 4);
        DLManagedTensorVersioned *t[CACHE_N], *extra = NULL;
        struct dlx_acquire_options extra_opts = {.stream = s};
        char when[96];
        int parked = 0;

        await_step(CH_PUBLISHED, "the producer's 100 tensors");
        for (int r = 0; r < CACHE_ROUNDS; r++) {
                CUdeviceptr base = 0;

                snprintf(when, sizeof(when), "round %d", r);
                cache_acquire(c, s, t, 0, CACHE_N, &base, when);
                if (r == 2) {
                        /* all but one go; the rest come back from the open allocation */
                        cache_release(t, 1, CACHE_N, false);
                        cache_acquire(c, s, t, 1, CACHE_N, &base, "round 2, re-acquired");
                }
                cache_copy(t, h, s);
                CU(cu.StreamSynchronize(s));
                cache_check(h, when);
                if (r == 3) {
                        /*
                         * Released while the copies that read them are still queued
                         * (parked behind a gate), then acquired again at once: the
                         * allocation is still open, waiting to close.
                         */
                        CUdeviceptr again = 0;
                        gate_close(s, CH_STEP, &parked);
                        cache_copy(t, h2, s);
                        cache_release(t, 0, CACHE_N, true);
                        cache_acquire(c, s, t, 0, CACHE_N, &again,
                                      "round 3, re-acquired while the last reads were queued");
                        EXPECT(!__atomic_load_n(&parked, __ATOMIC_SEQ_CST),
                               "round 3: re-acquiring waited %d s for the reader's queued "
                               "copies (a driver call in dlx_acquire synchronised the stream)",
                               GATE_MS / 1000);
                        post(CH_STEP);
                        CU(cu.StreamSynchronize(s));
                        EXPECT(!parked, "round 3: nothing opened the gate in %d s", GATE_MS / 1000);
                        cache_check(h2, "round 3, the reads queued before the release");
                        /* this acquire's sweep closes the old opening: the new one must survive */
                        DLX(dlx_acquire(c, "gpu/cache/000", &extra_opts, &extra));
                        memset(h, 0, (size_t)CACHE_N * CACHE_COLS * 4);
                        cache_copy(t, h, s);
                        CU(cu.StreamSynchronize(s));
                        cache_check(h, "round 3, after the old opening was swept");
                        release(extra);
                }
                cache_release(t, 0, CACHE_N, r % 2 == 1);
                /* the release events complete: the next round closes and reopens */
                CU(cu.StreamSynchronize(s));
        }
        dlx_close(c);
        post(CH_DONE);
        CU(cu.MemFreeHost(h));
        CU(cu.MemFreeHost(h2));
        CU(cu.StreamDestroy(s));
}

START_TEST(ipc_handle_cache)
{
        run_pair(cache_producer, cache_consumer);
}
END_TEST

/* ---- a consumer killed with -9 while holding a lease ----------------------------------- */

#define KILL_BYTES (64 * MIB)
#define KILL_SEED 0x4b111ed0u

static void kill_producer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-producer");
        int deleted = 0;
        CUdeviceptr buf;

        CU(cu.MemAlloc(&buf, KILL_BYTES));
        fill(buf, 0, KILL_BYTES / 4, KILL_SEED);
        publish_on(c, "gpu/victim", view_new(buf, 0, KILL_BYTES / 4 / 1024, 1024, &deleted), s,
                   false, NULL);
        await_step(CH_STEP, "the consumer to hold its lease");
        DLX(dlx_unpublish(c, "gpu/victim"));
        pump_until(c, &deleted, 300);
        EXPECT(deleted == 0, "the deleter ran while a consumer held a lease");
        post(CH_RELEASED);
        await_step(CH_GO, "the consumer to be killed");
        pump_until(c, &deleted, 10000);
        EXPECT(deleted == 1, "the deleter ran %d times within 10 s of the kill, want 1", deleted);
        CU(cu.StreamSynchronize(s));
        CU(cu.MemFree(buf));
        /* the memory is really back: the same size again */
        CU(cu.MemAlloc(&buf, KILL_BYTES));
        CU(cu.MemFree(buf));
        dlx_close(c);
        CU(cu.StreamDestroy(s));
}

static void kill_consumer(void)
{
        CUstream s = gpu_begin();
        dlx_client *c = connect_or_die("gpu-consumer");
        uint32_t *h = host_alloc(1024 * 4);
        DLManagedTensorVersioned *t;

        t = acquire_cuda(c, "gpu/victim", s, "cuda-ipc", KILL_BYTES / 4 / 1024, 1024);
        CU(cu.MemcpyDtoHAsync(h, dev_ptr(&t->dl_tensor), 1024 * 4, s));
        CU(cu.StreamSynchronize(s));
        expect_words(h, 1024, 0, KILL_SEED, "gpu/victim");
        post(CH_READY);
        /* held until killed */
        step_wait(CH_DONE, WAIT_MS * 2);
        die("was not killed");
}

START_TEST(killed_consumer_lease)
{
        struct kid k[2];
        dlx_client *c;
        int st;

        run_begin();
        spawn(&k[0], PRODUCER, kill_producer);
        spawn(&k[1], CONSUMER, kill_consumer);
        if (!step_wait(CH_READY, WAIT_MS + 5000)) {
                reap(k, 2); /* one of them failed, or both will time out */
                close_chans();
                expect_kids_ok(k, 2);
                ck_abort_msg("the consumer never said it holds the lease");
        }
        c = fx_connect(&fx, "gpu-watch");
        ck_assert_int_eq(fx_wait_leases(c, 1, 5000), 1);
        post(CH_STEP);
        if (!step_wait(CH_RELEASED, WAIT_MS + 5000)) {
                kill(k[1].pid, SIGKILL);
                reap(k, 2);
                close_chans();
                expect_kids_ok(k, 1);
                ck_abort_msg("the producer never unpublished");
        }
        ck_assert_int_eq(kill(k[1].pid, SIGKILL), 0);
        st = fx_wait(k[1].pid);
        k[1].pid = 0;
        k[1].status = 0;
        ck_assert_msg(st == 128 + SIGKILL, "the consumer ended with %d before the kill: %s", st,
                      sh->why[CONSUMER]);
        ck_assert_int_eq(fx_wait_leases(c, 0, 5000), 0);
        post(CH_GO);
        dlx_close(c);
        run_end(k, 2);
}
END_TEST

/* ---- both ends in one process: a process's own handles --------------------------------- */

#define SELF_ROWS 512
#define SELF_COLS 1024
#define SELF_SEED 0x5e1f5e1fu

static void self_read(dlx_client *reader, const char *name, CUstream s, const char *storage)
{
        size_t n = (size_t)SELF_ROWS * SELF_COLS;
        uint32_t *h = host_alloc(n * 4);
        DLManagedTensorVersioned *t;

        t = acquire_cuda(reader, name, s, storage, SELF_ROWS, SELF_COLS);
        CU(cu.MemcpyDtoHAsync(h, dev_ptr(&t->dl_tensor), n * 4, s));
        CU(cu.StreamSynchronize(s));
        expect_words(h, n, 0, SELF_SEED, name);
        release(t);
        CU(cu.MemFreeHost(h));
}

static void self_body(void)
{
        CUstream s = gpu_begin();
        dlx_client *pub = connect_or_die("gpu-publisher");
        dlx_client *reader = connect_or_die("gpu-reader");
        DLManagedTensorVersioned *t;
        int deleted = 0;
        CUdeviceptr buf;

        CU(cu.MemAlloc(&buf, (size_t)SELF_ROWS * SELF_COLS * 4));
        fill(buf, 0, (size_t)SELF_ROWS * SELF_COLS, SELF_SEED);
        publish_on(pub, "gpu/self-ipc", view_new(buf, 0, SELF_ROWS, SELF_COLS, &deleted), s, false,
                   NULL);
        self_read(reader, "gpu/self-ipc", s, "cuda-ipc");
        /* twice: the own-allocation path must not have cached anything wrong */
        self_read(reader, "gpu/self-ipc", s, "cuda-ipc");

        t = alloc_device(pub, SELF_ROWS, SELF_COLS);
        fill((CUdeviceptr)(uintptr_t)t->dl_tensor.data, 0, (size_t)SELF_ROWS * SELF_COLS,
             SELF_SEED);
        publish_on(pub, "gpu/self-vmm", t, s, false, NULL);
        self_read(reader, "gpu/self-vmm", s, "cuda-vmm");

        dlx_close(reader);
        dlx_close(pub);
        EXPECT(deleted == 1, "the IPC view's deleter ran %d times, want 1", deleted);
        CU(cu.StreamSynchronize(s));
        CU(cu.MemFree(buf));
        CU(cu.StreamDestroy(s));
}

START_TEST(same_process_both_ends)
{
        struct kid k;

        run_begin();
        spawn(&k, PRODUCER, self_body);
        run_end(&k, 1);
}
END_TEST

/* ---- the suite ----------------------------------------------------------------------------- */

/*
 * Whether this host has a driver and a device, asked in a child so that this
 * process (which forks every test) never initialises CUDA. Prints what it found.
 */
static void require_gpu(void)
{
        int st = 0;
        pid_t pid;

        fflush(NULL);
        pid = fork();
        if (pid == 0) {
                char why[256], name[128] = "?";
                int n = 0, version = 0, vmm = -1, fd = -1, ipc_ev = -1, mode = -1;
                CUdevice dev;
                CUresult r;

                if (cu_load(why, sizeof(why)) < 0) {
                        fprintf(stderr, "test-cuda-device: %s\n", why);
                        _exit(1);
                }
                if ((r = cu.Init(0)) != CUDA_SUCCESS ||
                    (r = cu.DeviceGetCount(&n)) != CUDA_SUCCESS || n < 1) {
                        fprintf(stderr, "test-cuda-device: %s\n",
                                r != CUDA_SUCCESS ? cu_error(r) : "no CUDA device");
                        _exit(1);
                }
                cu.DriverGetVersion(&version);
                if (cu.DeviceGet(&dev, 0) == CUDA_SUCCESS) {
                        cu.DeviceGetName(name, sizeof(name), dev);
                        cu.DeviceGetAttribute(
                                &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
                        cu.DeviceGetAttribute(
                                &fd,
                                CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                dev);
                        cu.DeviceGetAttribute(&ipc_ev, CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED,
                                              dev);
                        /* 2, exclusive-process, would refuse the second process of every case */
                        cu.DeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev);
                }
                fprintf(stderr,
                        "test-cuda-device: %d device(s); device 0: %s; driver %d.%d; VMM %d, "
                        "POSIX-fd "
                        "handles %d, IPC events %d, compute mode %d\n",
                        n, name, version / 1000, version % 1000 / 10, vmm, fd, ipc_ev, mode);
                _exit(0);
        }
        if (pid < 0 || waitpid(pid, &st, 0) != pid) {
                fprintf(stderr, "test-cuda-device: cannot run the CUDA probe: %s\n",
                        strerror(errno));
                exit(EXIT_FAILURE);
        }
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
                return;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 1) {
                printf("no CUDA driver/device: skipping\n");
                fflush(stdout);
                exit(77);
        }
        fprintf(stderr, "test-cuda-device: the CUDA probe itself failed (status 0x%x)\n", st);
        exit(EXIT_FAILURE);
}

Suite *cuda_device_suite(void)
{
        Suite *s;
        TCase *tc;

        require_gpu();
        s = suite_create("cuda-device");
        tc = tcase_create("hardware");
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 150);
        tcase_add_test(tc, ipc_view_between_processes);
        tcase_add_test(tc, vmm_persistent_outlives_producer);
        tcase_add_rows(tc, ordering, ordering_rows);
        tcase_add_rows(tc, release_fence, fence_rows);
        tcase_add_test(tc, ipc_handle_cache);
        tcase_add_test(tc, killed_consumer_lease);
        tcase_add_test(tc, same_process_both_ends);
        tcase_add_test(tc, device_group_in_place);
        tcase_add_test(tc, device_group_copied_once);
        suite_add_tcase(s, tc);
        return s;
}
