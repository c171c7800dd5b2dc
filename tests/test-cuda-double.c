/* SPDX-License-Identifier: MIT */
/*
 * libdlx's CUDA backend against a double of the driver over host memory
 * (tests/cuda-fake.h), with a real dlxd per test. Producers and consumers
 * run in different processes: "device memory" is host memory in the fake, so
 * bytes are read directly, and what the driver was asked to do is checked in
 * the fake's call log, shared by every process forked after cuda_fake_init().
 *
 * Covered: legacy IPC sharing and its ordering events, the per-process
 * handle cache and its deferred close, the release fence and
 * dlx_wait_released(), the producer's event pool, a killed consumer, VMM
 * allocations (read-only and writable imports, persistence), pinned host
 * memory, running without a driver, the caller's context stack on every
 * path (fault injection included), own-process publications and the
 * exchange API's current stream.
 *
 * Processes. The parent forks its children before it touches CUDA or
 * connects: a child inherits its parent's fake objects and libdlx's
 * process-wide caches, which would let it pass for the exporter of what the
 * parent published. Children report with exit status and stderr; parents
 * and children talk over pipes (struct chan), never by sleeping.
 *
 * VMM exports are /dev/ptmx masters, each naming a memfd that a keeper
 * process holds (see keep_export): dlxd takes only files of one character
 * device as cuda-vmm segments, and the fake exports memfds.
 *
 * DLX_CUDA_ONLY=<test> runs one test; DLX_TEST_CUDA_LOG=1 prints the
 * driver log when a test passes its teardown.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "cuda-fake.h"
#include "cudadrv.h"
#include "fixture.h"
#include "tensors.h"

/* Streams are opaque to libdlx and the fake: any distinct values do. */
#define P_STREAM ((CUstream)(uintptr_t)0x5000)  /* a producer's */
#define C_STREAM ((CUstream)(uintptr_t)0xc000)  /* a consumer's, set with dlx_set_stream */
#define C2_STREAM ((CUstream)(uintptr_t)0xc200) /* a consumer's, given in acquire options */
#define W_STREAM ((CUstream)(uintptr_t)0x7000)  /* given to dlx_wait_released */
#define W2_STREAM ((CUstream)(uintptr_t)0x7200)
static const CUstream named_streams[] = {P_STREAM, C_STREAM, C2_STREAM, W_STREAM, W2_STREAM};
#define S(x) ((uint64_t)(uintptr_t)(x))

#define TIMEOUT_MS 20000

/* ---- state shared by the processes of one test ---------------------------------------------- */

#define SLOTS 64

struct shared_area {
        int runs[SLOTS];         /* deleter runs per slot */
        uint64_t run_log[SLOTS]; /* the log's length when that deleter last ran */
        uint64_t producer_pid;   /* the producer of the test */
        uint64_t group_ipc;      /* device groups: the consumer expects cuda-ipc memory */
        uint64_t publish_log;    /* the log's length before the producer published */
};

static struct shared_area *sh;

/* ---- checking the caller's context stack around every libdlx call --------------------------- */

static int ctx_bad; /* per process */

/* The first failure whose message did not name the failed call (checked at a test's end). */
static char unclear[512];

static void ctx_check(int depth, CUcontext cur, const char *what, int line)
{
        if (cuda_fake_ctx_depth() == depth && cuda_fake_ctx_current() == cur)
                return;
        ctx_bad++;
        fprintf(stderr,
                "pid %d line %d: %s changed the caller's context stack: depth %d -> %d, "
                "current %p -> %p\n",
                (int)getpid(), line, what, depth, cuda_fake_ctx_depth(), (void *)cur,
                (void *)cuda_fake_ctx_current());
}

/* A libdlx call with a result, checked to leave the context stack as it found it. */
#define DLX(expr)                                                                                  \
        __extension__({                                                                            \
                int d_ = cuda_fake_ctx_depth();                                                    \
                CUcontext c_ = cuda_fake_ctx_current();                                            \
                __typeof__(expr) r_ = (expr);                                                      \
                ctx_check(d_, c_, #expr, __LINE__);                                                \
                r_;                                                                                \
        })
/* Same for a statement (deleters, dlx_close). */
#define DLXV(stmt)                                                                                 \
        do {                                                                                       \
                int d_ = cuda_fake_ctx_depth();                                                    \
                CUcontext c_ = cuda_fake_ctx_current();                                            \
                stmt;                                                                              \
                ctx_check(d_, c_, #stmt, __LINE__);                                                \
        } while (0)

/* ---- children ------------------------------------------------------------------------------- */

/* In a child: report and fail (the parent sees a non-zero exit status). */
#define CHECK(cond, ...)                                                                           \
        do {                                                                                       \
                if (!(cond)) {                                                                     \
                        fprintf(stderr, "%s (pid %d) line %d: check failed: %s: ", __func__,       \
                                (int)getpid(), __LINE__, #cond);                                   \
                        fprintf(stderr, __VA_ARGS__);                                              \
                        fputc('\n', stderr);                                                       \
                        return 1;                                                                  \
                }                                                                                  \
        } while (0)

/* Two pipes between a parent and one child: down (to the child) and up (to the parent). */
struct chan {
        int down[2];
        int up[2];
};

static void chan_open(struct chan *ch)
{
        ck_assert_int_eq(pipe2(ch->down, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(ch->up, O_CLOEXEC), 0);
}

static void close_fd(int *fd)
{
        if (*fd >= 0)
                close(*fd);
        *fd = -1;
}

static void chan_parent(struct chan *ch)
{
        close_fd(&ch->down[0]);
        close_fd(&ch->up[1]);
}

static void chan_child(struct chan *ch)
{
        close_fd(&ch->down[1]);
        close_fd(&ch->up[0]);
}

static void chan_close(struct chan *ch)
{
        close_fd(&ch->down[0]);
        close_fd(&ch->down[1]);
        close_fd(&ch->up[0]);
        close_fd(&ch->up[1]);
}

static int put64(int fd, uint64_t v)
{
        return write(fd, &v, sizeof(v)) == (ssize_t)sizeof(v) ? 0 : -1;
}

static int get64(int fd, uint64_t *v, int timeout_ms)
{
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r;

        do
                r = poll(&p, 1, timeout_ms);
        while (r < 0 && errno == EINTR);
        if (r != 1)
                return -1;
        return read(fd, v, sizeof(*v)) == (ssize_t)sizeof(*v) ? 0 : -1;
}

/* Parent side. */
static void tell(struct chan *ch, uint64_t v)
{
        ck_assert_msg(put64(ch->down[1], v) == 0, "the child is gone (see its message above)");
}

static uint64_t hear(struct chan *ch)
{
        uint64_t v = 0;

        ck_assert_msg(get64(ch->up[0], &v, TIMEOUT_MS) == 0,
                      "no word from the child: it failed (see its message above) or hangs");
        return v;
}

/* Child side: 0 or -1. */
static int c_tell(struct chan *ch, uint64_t v)
{
        return put64(ch->up[1], v);
}

static int c_hear(struct chan *ch, uint64_t *v)
{
        return get64(ch->down[0], v, TIMEOUT_MS);
}

static void reap(pid_t pid, const char *who)
{
        int st = fx_wait(pid);

        ck_assert_msg(st == 0, "%s (pid %d) failed with status %d (see its message above)", who,
                      (int)pid, st);
}

static dlx_client *child_connect(const char *name)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = name};
        dlx_client *c = NULL;
        int err = dlx_connect(&o, &c);

        if (err < 0) {
                fprintf(stderr, "pid %d: connect: %s (%s)\n", (int)getpid(), dlx_strerror(err),
                        dlx_last_error());
                return NULL;
        }
        return c;
}

/*
 * In a child: takes its ends of ch, waits for the parent's go when go, and
 * connects as name, with stream current on device 0 when not NULL. NULL on
 * failure, said on stderr.
 */
static dlx_client *child_start(struct chan *ch, bool go, const char *name, CUstream stream)
{
        dlx_client *c;
        uint64_t v;

        chan_child(ch);
        if (go && c_hear(ch, &v) < 0) {
                fprintf(stderr, "%s (pid %d): no go from the parent\n", name, (int)getpid());
                return NULL;
        }
        c = child_connect(name);
        if (c && stream && DLX(dlx_set_stream(c, 0, stream)) != 0) {
                fprintf(stderr, "%s (pid %d): dlx_set_stream: %s\n", name, (int)getpid(),
                        dlx_last_error());
                dlx_close(c);
                return NULL;
        }
        return c;
}

/* Parent side: forks fn(arg), which talks over ch (see child_start). */
static pid_t spawn_on(struct chan *ch, int (*fn)(void *), void *arg)
{
        pid_t pid;

        chan_open(ch);
        pid = fx_spawn(fn, arg);
        chan_parent(ch);
        return pid;
}

/* ---- the log -------------------------------------------------------------------------------- */

/* What to look for: op, and each other field when set (stream when by_stream). */
struct q {
        enum cuda_fake_op op;
        pid_t pid;
        uint64_t event;
        uint64_t ptr;
        uint64_t size;
        uint64_t aux;
        bool by_aux;
        bool by_stream;
        uint64_t stream;
        size_t from;
        size_t to; /* 0: the end */
};

static bool log_at(long i, struct cuda_fake_entry *e)
{
        return i >= 0 && cuda_fake_log_entry((size_t)i, e);
}

static long qfind(struct q q)
{
        size_t n = cuda_fake_log_count();
        struct cuda_fake_entry e;

        if (q.to && q.to < n)
                n = q.to;
        for (size_t i = q.from; i < n; i++) {
                if (!cuda_fake_log_entry(i, &e) || e.op != q.op)
                        continue;
                if ((q.pid && e.pid != q.pid) || (q.event && e.event != q.event) ||
                    (q.ptr && e.ptr != q.ptr) || (q.size && e.size != q.size) ||
                    (q.by_aux && e.aux != q.aux) || (q.by_stream && e.stream != q.stream))
                        continue;
                return (long)i;
        }
        return -1;
}

static int qcount(struct q q)
{
        int n = 0;
        long i;

        while ((i = qfind(q)) >= 0) {
                n++;
                q.from = (size_t)i + 1;
        }
        return n;
}

#define QFIND(...) qfind((struct q){__VA_ARGS__})
#define QCOUNT(...) qcount((struct q){__VA_ARGS__})

static size_t log_now(void)
{
        return cuda_fake_log_count();
}

/* For debugging a failure: DLX_TEST_CUDA_LOG=1 prints the log at teardown. */
static void log_dump(void)
{
        struct cuda_fake_entry e;

        for (size_t i = 0; i < cuda_fake_log_count(); i++)
                if (cuda_fake_log_entry(i, &e))
                        fprintf(stderr,
                                "%5zu pid %-7d %-40s stream %#llx event %#llx ptr %#llx size "
                                "%llu aux %#llx\n",
                                i, (int)e.pid, cuda_fake_op_name(e.op),
                                (unsigned long long)e.stream, (unsigned long long)e.event,
                                (unsigned long long)e.ptr, (unsigned long long)e.size,
                                (unsigned long long)e.aux);
}

/* The event a process recorded on stream at or after from (0 if none). */
static uint64_t recorded_event(pid_t pid, CUstream stream, size_t from, size_t to)
{
        struct cuda_fake_entry e;
        long i = QFIND(.op = CUDA_FAKE_EVENT_RECORD, .pid = pid, .by_stream = true,
                       .stream = S(stream), .from = from, .to = to);

        return log_at(i, &e) ? e.event : 0;
}

/* ---- leak counters -------------------------------------------------------------------------- */

/*
 * Every kind but opened foreign events, which libdlx keeps in a process-wide
 * cache by design (gpu.c: MAX_OPENED_EVENTS).
 */
static const enum cuda_fake_kind leak_kinds[] = {
        CUDA_FAKE_ALLOCATION,  CUDA_FAKE_IPC_MAPPING, CUDA_FAKE_MEM_HANDLE,   CUDA_FAKE_MAPPING,
        CUDA_FAKE_RESERVATION, CUDA_FAKE_EVENT,       CUDA_FAKE_REGISTRATION,
};
static const char *const leak_names[] = {
        "allocations",  "IPC mappings", "VMM handles",        "VMM mappings",
        "reservations", "events",       "host registrations",
};

/*
 * What may be alive by design: the publish events of versions a client still
 * held when it closed, which libdlx keeps for the process's life (a reader
 * may wait on them: gpu.h, dlx__gpu_retired).
 */
unsigned dlx__gpu_retired(void); /* client/gpu.h's, built here without DLX_HAVE_CUDA */

static int live_by_design(enum cuda_fake_kind kind)
{
        return kind == CUDA_FAKE_EVENT ? (int)dlx__gpu_retired() : 0;
}

/* 0, or the first kind still alive (for a message). */
static int live_kind(void)
{
        for (size_t i = 0; i < N_ELEMS(leak_kinds); i++)
                if (cuda_fake_live(leak_kinds[i]) != live_by_design(leak_kinds[i]))
                        return (int)i + 1;
        return 0;
}

static void assert_nothing_live(const char *when)
{
        int k = live_kind();

        ck_assert_msg(k == 0, "%s: %d %s still alive in the test process", when,
                      k ? cuda_fake_live(leak_kinds[k - 1]) : 0, k ? leak_names[k - 1] : "");
}

/*
 * In a child, after its client closed: 0 if no libdlx call changed the
 * context stack and, with nothing_live, nothing of CUDA is alive.
 */
static int child_done(const char *who, bool nothing_live)
{
        int k = live_kind();

        CHECK(ctx_bad == 0, "%s: the context stack changed (above)", who);
        CHECK(!nothing_live || k == 0, "%s after close: %d %s still alive", who,
              k ? cuda_fake_live(leak_kinds[k - 1]) : 0, k ? leak_names[k - 1] : "");
        return 0;
}

/*
 * Requires that `$DLXCTL --socket <fx.socket> args` exits 0 and prints a line
 * that contains want: how the command-line tool shows what the daemon holds.
 */
static void assert_dlxctl_says(const char *args, const char *want)
{
        char cmd[512], line[1024], seen[4096] = "";
        const char *ctl = getenv("DLXCTL");
        bool found = false;
        FILE *f;

        ck_assert_msg(ctl, "DLXCTL is not set");
        snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' %s", ctl, fx.socket, args);
        f = popen(cmd, "r");
        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f)) {
                found = found || strstr(line, want) != NULL;
                strncat(seen, line, sizeof(seen) - strlen(seen) - 1);
        }
        ck_assert_msg(pclose(f) == 0, "%s failed: %s", cmd, seen);
        ck_assert_msg(found, "%s does not say '%s': %s", cmd, want, seen);
}

/* ---- tensors over fake device memory -------------------------------------------------------- */

static uint8_t pat(unsigned seed, size_t i)
{
        return (uint8_t)(i * 131u + seed * 29u + 7u);
}

static void fill(void *p, size_t n, unsigned seed)
{
        for (size_t i = 0; i < n; i++)
                ((uint8_t *)p)[i] = pat(seed, i);
}

static bool same(const void *p, size_t n, unsigned seed)
{
        for (size_t i = 0; i < n; i++)
                if (((const uint8_t *)p)[i] != pat(seed, i))
                        return false;
        return true;
}

struct dev_tensor {
        DLManagedTensorVersioned mt;
        int64_t shape[1];
        int slot;
        CUdeviceptr free_base; /* cuda_fake_free()d by the deleter when set */
};

static void dev_deleter(DLManagedTensorVersioned *t)
{
        struct dev_tensor *d = t->manager_ctx;

        sh->run_log[d->slot] = log_now();
        __atomic_add_fetch(&sh->runs[d->slot], 1, __ATOMIC_SEQ_CST);
        if (d->free_base)
                cuda_fake_free(d->free_base);
        free(d);
}

/* A 1-D uint8 tensor of n bytes at data, counted in slot; not a dlx_alloc() tensor. */
static DLManagedTensorVersioned *dev_tensor(DLDeviceType type, CUdeviceptr data, int64_t n,
                                            int slot, CUdeviceptr free_base)
{
        struct dev_tensor *d = calloc(1, sizeof(*d));

        if (!d)
                return NULL;
        d->slot = slot;
        d->free_base = free_base;
        d->shape[0] = n;
        d->mt.version.major = 1;
        d->mt.version.minor = 3;
        d->mt.manager_ctx = d;
        d->mt.deleter = dev_deleter;
        d->mt.dl_tensor.data = (void *)(uintptr_t)data;
        d->mt.dl_tensor.device.device_type = type;
        d->mt.dl_tensor.device.device_id = 0;
        d->mt.dl_tensor.ndim = 1;
        d->mt.dl_tensor.dtype = (DLDataType){kDLUInt, 8, 1};
        d->mt.dl_tensor.shape = d->shape;
        return &d->mt;
}

static int runs(int slot)
{
        return __atomic_load_n(&sh->runs[slot], __ATOMIC_SEQ_CST);
}

/* Publishes a device tensor (parent side, asserting success). */
static uint64_t publish_dev(dlx_client *c, const char *name, CUdeviceptr data, int64_t n, int slot,
                            const struct dlx_publish_options *o)
{
        uint64_t version = 0;
        int err = DLX(dlx_publish(c, name, dev_tensor(kDLCUDA, data, n, slot, 0), o, &version));

        ck_assert_msg(err == 0, "publish %s: %s (%s)", name, dlx_strerror(err), dlx_last_error());
        return version;
}

/* Unpublishes name and waits until version is released (parent side). */
static void unpublish_wait(dlx_client *c, const char *name, uint64_t version)
{
        int err = DLX(dlx_unpublish(c, name));

        ck_assert_msg(err == 0 || err == -ENOENT, "unpublish %s: %s", name, dlx_strerror(err));
        err = DLX(dlx_wait_released(c, name, version, NULL, TIMEOUT_MS));
        ck_assert_msg(err == 0, "wait_released %s v%llu: %s (%s)", name,
                      (unsigned long long)version, dlx_strerror(err), dlx_last_error());
}

static DLManagedTensorVersioned *alloc_on(dlx_client *c, DLDeviceType type, int64_t n)
{
        int64_t shape[1] = {n};
        DLTensor proto = {.device = {type, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = shape};
        DLManagedTensorVersioned *t = NULL;
        int err = DLX(dlx_alloc(c, &proto, &t));

        if (err < 0) {
                fprintf(stderr, "pid %d: dlx_alloc(device type %d): %s (%s)\n", (int)getpid(),
                        (int)type, dlx_strerror(err), dlx_last_error());
                return NULL;
        }
        return t;
}

static const char *storage_of(const DLManagedTensorVersioned *t)
{
        const char *s = NULL;

        return dlx_tensor_info(t, NULL, NULL, &s) == 0 ? s : "(not acquired)";
}

static uint64_t version_of(const DLManagedTensorVersioned *t)
{
        uint64_t v = 0;

        dlx_tensor_info(t, NULL, &v, NULL);
        return v;
}

/* Pushes a context of our own, so that "unchanged" means more than an empty stack. */
static void push_own_context(int device)
{
        ck_assert_int_eq(cuda_fake_driver()->CtxPushCurrent(cuda_fake_ctx(device)), CUDA_SUCCESS);
}

static void pop_own_context(void)
{
        CUcontext ctx = NULL;

        ck_assert_int_eq(cuda_fake_driver()->CtxPopCurrent(&ctx), CUDA_SUCCESS);
}

/* ---- VMM exports the daemon accepts ---------------------------------------------------------- */

/*
 * NVIDIA's driver exports a VMM allocation as a file of its control device
 * (/dev/nvidiactl, char 195:255), and dlxd takes nothing else as a cuda-vmm
 * segment (daemon/store.c adopt_vmm); the fake exports a memfd. So the
 * driver these tests install wraps the fake's export and import, and makes
 * each export what the driver's is: a file of one character device, with
 * an identity of its own, that names the allocation only to the driver.
 * That device is /dev/ptmx, which every Linux has: each open of it is a new
 * pty, numbered (TIOCGPTN), and dlxd is told its number
 * (--cuda-device-number). The memfd is kept by a keeper process, forked with
 * it (so it is there as soon as fork returns) and living until dlxd is gone;
 * the keeper holds the pty's master too, so that its number names this
 * export as long as anyone may import it. A file in the test's directory,
 * vmm-pty-<number>, names the keeper's pid and fd, and the import opens the
 * memfd again through /proc. Like the driver's, the import takes nothing
 * else: any other fd, or a pty that no export made, is
 * CUDA_ERROR_INVALID_VALUE. libdlx sees an opaque fd either way, and a VMM
 * segment survives its exporter as it does with the driver.
 */
static struct dlx_cuda_driver driver;
static dev_t export_dev; /* /dev/ptmx's number */
static char export_arg[32];

#define EXPORT_PREFIX "vmm-pty-"

static __attribute__((noreturn)) void keeper(int a, int b, pid_t dlxd)
{
        const struct timespec tick = {0, 10 * 1000 * 1000};
        int lo = a < b ? a : b, hi = a < b ? b : a;

        if (lo > 0)
                close_range(0, (unsigned)lo - 1, 0);
        if (hi > lo + 1)
                close_range((unsigned)lo + 1, (unsigned)hi - 1, 0);
        close_range((unsigned)hi + 1, ~0U, 0);
        while (kill(dlxd, 0) == 0)
                nanosleep(&tick, NULL);
        _exit(0);
}

/* Names keeper k's fd as export pty (written whole, then renamed: an import never reads half). */
static int export_name(unsigned pty, pid_t k, int fd)
{
        char path[128], tmp[160];
        FILE *f;
        int ok;

        snprintf(path, sizeof(path), "%s/" EXPORT_PREFIX "%u", fx.dir, pty);
        snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
        f = fopen(tmp, "wex");
        if (!f)
                return -1;
        ok = fprintf(f, "%d %d\n", (int)k, fd) > 0;
        ok = fclose(f) == 0 && ok;
        if (ok && rename(tmp, path) == 0)
                return 0;
        unlink(tmp);
        return -1;
}

static CUresult keep_export(void *shareable, CUmemGenericAllocationHandle h,
                            CUmemAllocationHandleType type, unsigned long long flags)
{
        unsigned pty = 0;
        int fd = -1, m;
        CUresult r;
        pid_t k = -1;

        if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !shareable)
                return cuda_fake_driver()->MemExportToShareableHandle(shareable, h, type, flags);
        r = cuda_fake_driver()->MemExportToShareableHandle(&fd, h, type, flags);
        if (r != CUDA_SUCCESS)
                return r;
        m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (m >= 0 && ioctl(m, TIOCGPTN, &pty) == 0) {
                k = fork();
                if (k == 0)
                        keeper(fd, m, fx.pid);
        }
        if (k > 0 && export_name(pty, k, fd) < 0) {
                kill(k, SIGKILL);
                waitpid(k, NULL, 0);
                k = -1;
        }
        close(fd);
        if (k < 0) {
                if (m >= 0)
                        close(m);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *(int *)shareable = m;
        return CUDA_SUCCESS;
}

static CUresult keep_import(CUmemGenericAllocationHandle *h, void *shareable,
                            CUmemAllocationHandleType type)
{
        int fd = (int)(uintptr_t)shareable, kpid = 0, kfd = -1, got = 0, memfd;
        char path[128];
        unsigned pty;
        struct stat sb;
        CUresult r;
        FILE *f;

        if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || (uintptr_t)shareable > INT32_MAX)
                return cuda_fake_driver()->MemImportFromShareableHandle(h, shareable, type);
        if (fstat(fd, &sb) < 0 || !S_ISCHR(sb.st_mode) || sb.st_rdev != export_dev ||
            ioctl(fd, TIOCGPTN, &pty) < 0)
                return CUDA_ERROR_INVALID_VALUE;
        snprintf(path, sizeof(path), "%s/" EXPORT_PREFIX "%u", fx.dir, pty);
        f = fopen(path, "re");
        if (f) {
                got = fscanf(f, "%d %d", &kpid, &kfd);
                fclose(f);
        }
        if (got != 2)
                return CUDA_ERROR_INVALID_VALUE; /* a pty, but no export */
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", kpid, kfd);
        memfd = open(path, O_RDWR | O_CLOEXEC);
        if (memfd < 0)
                return CUDA_ERROR_INVALID_VALUE;
        r = cuda_fake_driver()->MemImportFromShareableHandle(h, (void *)(uintptr_t)memfd, type);
        close(memfd);
        return r;
}

static const struct dlx_cuda_driver *test_driver(void)
{
        driver = *cuda_fake_driver();
        driver.MemExportToShareableHandle = keep_export;
        driver.MemImportFromShareableHandle = keep_import;
        return &driver;
}

/* Forgets every export's name, so that the fixture can remove the test's directory. */
static void exports_forget(void)
{
        DIR *d = opendir(fx.dir);
        struct dirent *de;

        while (d && (de = readdir(d)))
                if (strncmp(de->d_name, EXPORT_PREFIX, strlen(EXPORT_PREFIX)) == 0)
                        unlinkat(dirfd(d), de->d_name, 0);
        if (d)
                closedir(d);
}

/* ---- the fixture ---------------------------------------------------------------------------- */

static void cuda_setup(void)
{
        const char *const args[] = {"--cuda-device-number", export_arg, NULL};
        struct stat sb;
        int m;

        sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        ck_assert_ptr_ne(sh, MAP_FAILED);
        /* before anything forks: dlxd and every child share the log from here */
        ck_assert_int_eq(cuda_fake_init(), 0);
        dlx__cuda_install(test_driver());
        /* the named streams are device 0's, in its primary context, in every child */
        for (unsigned i = 0; i < sizeof(named_streams) / sizeof(named_streams[0]); i++)
                ck_assert_int_eq(cuda_fake_stream_bind(named_streams[i], cuda_fake_ctx(0)), 0);
        ctx_bad = 0;
        unclear[0] = 0;
        /* what an export is a file of, and what dlxd is told to take */
        m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
        ck_assert_msg(m >= 0 && fstat(m, &sb) == 0 && S_ISCHR(sb.st_mode), "/dev/ptmx: %s",
                      strerror(errno));
        close(m);
        export_dev = sb.st_rdev;
        snprintf(export_arg, sizeof(export_arg), "%u:%u", major(export_dev), minor(export_dev));
        dlxd_start(&fx, args);
}

static void cuda_teardown(void)
{
        const char *dump = getenv("DLX_TEST_CUDA_LOG");

        if (dump && *dump == '1')
                log_dump();
        exports_forget();
        fx_teardown();
        dlx__cuda_install(test_driver());
        munmap(sh, sizeof(*sh));
        sh = NULL;
}

/* =============================================================================================
 * 1. Legacy IPC: a tensor inside an allocation, at an offset, with its own deleter.
 */

#define IPC_SIZE ((size_t)1 << 20)
#define IPC_OFF 4096
#define IPC_LEN 8192

static int ipc_consumer(void *arg)
{
        struct chan *ch = arg;
        struct dlx_acquire_options ao = {.stream = C2_STREAM};
        DLManagedTensorVersioned *t = NULL, *t2 = NULL;
        pid_t me = getpid(), producer;
        struct cuda_fake_entry e;
        size_t before, after;
        uint64_t go, ev;
        dlx_client *c;
        long i;
        int err;

        c = child_start(ch, true, "ipc-consumer", C_STREAM);
        CHECK(c, "start");
        producer = (pid_t)sh->producer_pid;
        CHECK(dlx_get_stream(c, 0) == C_STREAM, "dlx_get_stream");

        before = log_now();
        err = DLX(dlx_acquire(c, "ipc/t", NULL, &t));
        after = log_now();
        CHECK(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(strcmp(storage_of(t), "cuda-ipc") == 0, "storage %s", storage_of(t));
        CHECK(version_of(t) == 1, "version %llu", (unsigned long long)version_of(t));
        CHECK(t->dl_tensor.device.device_type == kDLCUDA && t->dl_tensor.device.device_id == 0,
              "device %d:%d", (int)t->dl_tensor.device.device_type,
              (int)t->dl_tensor.device.device_id);
        CHECK(t->dl_tensor.ndim == 1 && t->dl_tensor.shape[0] == IPC_LEN &&
                      t->dl_tensor.dtype.code == kDLUInt && t->dl_tensor.dtype.bits == 8,
              "shape or dtype differ");
        CHECK(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, "not read-only");

        /* the allocation was opened here, and the data is its base plus the offset */
        i = QFIND(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me, .from = before, .to = after);
        CHECK(log_at(i, &e), "no IpcOpenMemHandle in this process during acquire");
        CHECK(e.aux == (uint64_t)producer, "opened a handle of pid %llu, not of the producer %d",
              (unsigned long long)e.aux, (int)producer);
        CHECK(e.size == IPC_SIZE, "opened %llu bytes, the allocation has %zu",
              (unsigned long long)e.size, IPC_SIZE);
        CHECK((uintptr_t)t->dl_tensor.data == e.ptr + IPC_OFF && t->dl_tensor.byte_offset == 0,
              "data %p, opened base %#llx + offset %d", t->dl_tensor.data,
              (unsigned long long)e.ptr, IPC_OFF);
        CHECK(same(t->dl_tensor.data, IPC_LEN, 1), "the bytes differ");

        /* the consumer's stream waits, before acquire returns, for what the producer recorded */
        ev = recorded_event(producer, P_STREAM, sh->publish_log, 0);
        CHECK(ev != 0, "the producer recorded no event on its stream at publish");
        CHECK(CUDA_FAKE_EVENT_PID(ev) == producer, "the event is not the producer's");
        i = QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev, .by_stream = true,
                  .stream = S(C_STREAM), .from = before, .to = after);
        CHECK(i >= 0, "stream C did not wait on the producer's event %#llx before acquire returned",
              (unsigned long long)ev);
        CHECK(cuda_fake_waited(C_STREAM, ev), "cuda_fake_waited(C, event)");

        /* the options' stream wins over the client's; the allocation is not opened again */
        before = log_now();
        err = DLX(dlx_acquire(c, "ipc/t", &ao, &t2));
        after = log_now();
        CHECK(err == 0, "second acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(t2->dl_tensor.data == t->dl_tensor.data, "a second mapping");
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me) == 1,
              "the allocation was opened %d times",
              QCOUNT(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me));
        CHECK(QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev, .by_stream = true,
                    .stream = S(C2_STREAM), .from = before, .to = after) >= 0,
              "the options' stream did not wait on the producer's event");
        CHECK(QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .by_stream = true,
                    .stream = S(C_STREAM), .from = before, .to = after) < 0,
              "the client's stream was used although the options named one");

        DLXV(t2->deleter(t2));
        DLXV(t->deleter(t));
        /* the release events must outlive the producer's wait on them */
        CHECK(c_tell(ch, 1) == 0, "tell");
        CHECK(c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

START_TEST(ipc_publish_acquire)
{
        struct chan ch;
        dlx_client *c;
        CUdeviceptr base;
        uint64_t version = 0;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, ipc_consumer, &ch);

        c = fx_connect(&fx, "ipc-producer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        base = cuda_fake_malloc(IPC_SIZE);
        ck_assert(base != 0);
        fill((void *)(uintptr_t)(base + IPC_OFF), IPC_LEN, 1);
        sh->producer_pid = (uint64_t)getpid();
        sh->publish_log = log_now();
        err = DLX(dlx_publish(c, "ipc/t", dev_tensor(kDLCUDA, base + IPC_OFF, IPC_LEN, 0, 0), NULL,
                              &version));
        ck_assert_msg(err == 0, "publish: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_uint_eq(version, 1);
        ck_assert_msg(QFIND(.op = CUDA_FAKE_IPC_GET_MEM_HANDLE, .pid = getpid(),
                            .ptr = (uint64_t)base, .from = sh->publish_log) >= 0,
                      "the handle exported is not the allocation's base");
        ck_assert_msg(recorded_event(getpid(), P_STREAM, sh->publish_log, 0) != 0,
                      "no event recorded on the producer's stream at publish");

        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 1);

        ck_assert_int_eq(runs(0), 0); /* still published */
        ck_assert_int_eq(DLX(dlx_unpublish(c, "ipc/t")), 0);
        err = DLX(dlx_wait_released(c, "ipc/t", 1, NULL, TIMEOUT_MS));
        ck_assert_msg(err == 0, "wait_released: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(runs(0), 1);
        /* both reader streams' release events ordered the publish stream before the deleter */
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = getpid(),
                                .by_stream = true, .stream = S(P_STREAM), .to = sh->run_log[0]),
                         2);
        ck_assert_msg(cuda_fake_waited(P_STREAM, recorded_event(pid, C_STREAM, 0, 0)),
                      "the publish stream did not wait on the release recorded on stream C");
        ck_assert_msg(cuda_fake_waited(P_STREAM, recorded_event(pid, C2_STREAM, 0, 0)),
                      "the publish stream did not wait on the release recorded on stream C2");
        tell(&ch, 2);
        reap(pid, "consumer");
        DLXV(dlx_close(c));
        ck_assert_int_eq(runs(0), 1);
        ck_assert_int_eq(cuda_fake_free(base), CUDA_SUCCESS);
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/* =============================================================================================
 * 2. The handle cache: one open per allocation and process; the close waits for the last
 *    reader's release event.
 */

#define CACHE_A_SIZE ((size_t)1 << 20)
#define CACHE_B_SIZE ((size_t)64 << 10)
#define CACHE_OFF_A1 0
#define CACHE_OFF_B (64 << 10)
#define CACHE_OFF_C (128 << 10)
#define CACHE_OFF_A2 (192 << 10)
#define CACHE_LEN 4096
#define CACHE_BYTE_OFFSET 128

/*
 * The event the client's next release will record. A client cycles through
 * a ring of release events: release the warm tensor until the recorded ids
 * repeat, then the next one is known in advance (to hold it).
 */
static uint64_t next_release_event(dlx_client *c, const char *warm, size_t from)
{
        uint64_t ids[600];

        for (int round = 0; round < 400; round++) {
                DLManagedTensorVersioned *t = NULL;
                int n = 0;
                long i = (long)from - 1;
                struct cuda_fake_entry e;

                while (n < 600 && (i = QFIND(.op = CUDA_FAKE_EVENT_RECORD, .pid = getpid(),
                                             .from = (size_t)(i + 1))) >= 0)
                        if (log_at(i, &e))
                                ids[n++] = e.event;
                for (int r = 1; r < n; r++)
                        if (ids[r] == ids[0])
                                return ids[n % r];
                if (DLX(dlx_acquire(c, warm, NULL, &t)) < 0)
                        return 0;
                DLXV(t->deleter(t));
        }
        return 0;
}

static int cache_consumer(void *arg)
{
        struct chan *ch = arg;
        struct dlx_acquire_options v2 = {.min_version = 2, .timeout_ms = TIMEOUT_MS};
        DLManagedTensorVersioned *a1, *b, *cc, *a2, *w;
        struct cuda_fake_entry e;
        pid_t me = getpid();
        size_t start, mark, unheld;
        uint64_t go, ev, base;
        dlx_client *c;
        long i, close_at;
        int err;

        c = child_start(ch, true, "cache-consumer", C_STREAM);
        CHECK(c, "start");
        start = log_now();
        err = DLX(dlx_acquire(c, "cache/a", NULL, &a1));
        CHECK(err == 0, "acquire a: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_acquire(c, "cache/b", NULL, &b));
        CHECK(err == 0, "acquire b: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_acquire(c, "cache/c", NULL, &cc));
        CHECK(err == 0, "acquire c: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me, .size = CACHE_A_SIZE) == 1,
              "allocation A opened %d times for three names",
              QCOUNT(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me, .size = CACHE_A_SIZE));
        i = QFIND(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me, .size = CACHE_A_SIZE);
        CHECK(log_at(i, &e), "no open of A");
        base = e.ptr;
        CHECK((uintptr_t)a1->dl_tensor.data == base + CACHE_OFF_A1, "a: data %p, base %#llx",
              a1->dl_tensor.data, (unsigned long long)base);
        CHECK((uintptr_t)b->dl_tensor.data == base + CACHE_OFF_B, "b: data %p, base %#llx",
              b->dl_tensor.data, (unsigned long long)base);
        CHECK((uintptr_t)cc->dl_tensor.data == base + CACHE_OFF_C &&
                      cc->dl_tensor.byte_offset == CACHE_BYTE_OFFSET,
              "c: data %p byte_offset %llu, base %#llx", cc->dl_tensor.data,
              (unsigned long long)cc->dl_tensor.byte_offset, (unsigned long long)base);
        CHECK(same(a1->dl_tensor.data, CACHE_LEN, 11), "a's bytes");
        CHECK(same(b->dl_tensor.data, CACHE_LEN, 12), "b's bytes");
        CHECK(same((uint8_t *)cc->dl_tensor.data + CACHE_BYTE_OFFSET, CACHE_LEN, 13), "c's bytes");

        CHECK(c_tell(ch, 1) == 0, "tell");
        CHECK(c_hear(ch, &go) == 0, "no v2");
        err = DLX(dlx_acquire(c, "cache/a", &v2, &a2));
        CHECK(err == 0, "acquire a v2: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(version_of(a2) == 2, "version %llu", (unsigned long long)version_of(a2));
        CHECK((uintptr_t)a2->dl_tensor.data == base + CACHE_OFF_A2, "a v2: data %p, base %#llx",
              a2->dl_tensor.data, (unsigned long long)base);
        CHECK(same(a2->dl_tensor.data, CACHE_LEN, 14), "a v2's bytes");
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me, .size = CACHE_A_SIZE) == 1,
              "allocation A opened again for a new version");

        /* releasing all but one keeps the allocation open */
        DLXV(a1->deleter(a1));
        DLXV(b->deleter(b));
        DLXV(cc->deleter(cc));
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me, .ptr = base) == 0,
              "A closed while a tensor in it is held");
        CHECK(cuda_fake_live(CUDA_FAKE_IPC_MAPPING) == 1, "%d IPC mappings",
              cuda_fake_live(CUDA_FAKE_IPC_MAPPING));

        /* the last release: its event is held, so the close must wait */
        ev = next_release_event(c, "cache/warm", start);
        CHECK(ev != 0, "cannot tell which event the next release records");
        CHECK(cuda_fake_event_hold(ev, true) == 0, "hold");
        mark = log_now();
        DLXV(a2->deleter(a2));
        CHECK(QFIND(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .event = ev, .by_stream = true,
                    .stream = S(C_STREAM), .from = mark) >= 0,
              "the last release did not record event %#llx on the consumer's stream",
              (unsigned long long)ev);
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me, .ptr = base) == 0,
              "A closed while the reader's release event is still pending");
        CHECK(cuda_fake_live(CUDA_FAKE_IPC_MAPPING) == 1, "A unmapped under pending work");
        /* more traffic while it is pending changes nothing */
        err = DLX(dlx_acquire(c, "cache/warm", NULL, &w));
        CHECK(err == 0, "acquire warm: %s", dlx_strerror(err));
        DLXV(w->deleter(w));
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me, .ptr = base) == 0,
              "A closed while the reader's release event is still pending");

        /* completed: the next call that sweeps closes it, once */
        unheld = log_now();
        CHECK(cuda_fake_event_hold(ev, false) == 0, "unhold");
        err = DLX(dlx_acquire(c, "cache/warm", NULL, &w));
        CHECK(err == 0, "acquire warm: %s", dlx_strerror(err));
        DLXV(w->deleter(w));
        close_at = QFIND(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me, .ptr = base);
        CHECK(close_at >= 0, "A never closed after its release event completed");
        CHECK((size_t)close_at > unheld, "A closed before the release event completed");
        /* A's mapping lasts until another opens at its address (valgrind reuses addresses) */
        long reopen = QFIND(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me, .ptr = base,
                            .from = (size_t)i + 1);
        size_t a_end = reopen >= 0 ? (size_t)reopen : 0;
        int closes = QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me, .ptr = base,
                            .from = (size_t)i, .to = a_end);
        CHECK(closes == 1, "A closed %d times", closes);
        CHECK(cuda_fake_live(CUDA_FAKE_IPC_MAPPING) == 0, "%d IPC mappings left",
              cuda_fake_live(CUDA_FAKE_IPC_MAPPING));
        CHECK(c_tell(ch, 2) == 0, "tell");
        /* keep the release events alive until the producer has waited on them */
        CHECK(c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

/* Publishes the cache test's tensors (A: a, b, c; B: warm). */
static void cache_publish(dlx_client *c, CUdeviceptr a, CUdeviceptr b)
{
        DLManagedTensorVersioned *t;

        fill((void *)(uintptr_t)(a + CACHE_OFF_A1), CACHE_LEN, 11);
        fill((void *)(uintptr_t)(a + CACHE_OFF_B), CACHE_LEN, 12);
        fill((void *)(uintptr_t)(a + CACHE_OFF_C + CACHE_BYTE_OFFSET), CACHE_LEN, 13);
        fill((void *)(uintptr_t)b, CACHE_LEN, 15);
        publish_dev(c, "cache/a", a + CACHE_OFF_A1, CACHE_LEN, 0, NULL);
        publish_dev(c, "cache/b", a + CACHE_OFF_B, CACHE_LEN, 1, NULL);
        t = dev_tensor(kDLCUDA, a + CACHE_OFF_C, CACHE_LEN, 2, 0);
        t->dl_tensor.byte_offset = CACHE_BYTE_OFFSET;
        ck_assert_int_eq(DLX(dlx_publish(c, "cache/c", t, NULL, NULL)), 0);
        publish_dev(c, "cache/warm", b, CACHE_LEN, 3, NULL);
}

START_TEST(ipc_handle_cache)
{
        struct chan ch;
        dlx_client *c;
        CUdeviceptr a, b;
        pid_t pid;

        pid = spawn_on(&ch, cache_consumer, &ch);
        c = fx_connect(&fx, "cache-producer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        a = cuda_fake_malloc(CACHE_A_SIZE);
        b = cuda_fake_malloc(CACHE_B_SIZE);
        ck_assert(a && b);
        cache_publish(c, a, b);
        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 1);
        fill((void *)(uintptr_t)(a + CACHE_OFF_A2), CACHE_LEN, 14);
        ck_assert_uint_eq(publish_dev(c, "cache/a", a + CACHE_OFF_A2, CACHE_LEN, 4, NULL), 2);
        tell(&ch, 2);
        ck_assert_uint_eq(hear(&ch), 2);
        unpublish_wait(c, "cache/a", 1);
        unpublish_wait(c, "cache/a", 2);
        unpublish_wait(c, "cache/b", 1);
        unpublish_wait(c, "cache/c", 1);
        unpublish_wait(c, "cache/warm", 1);
        tell(&ch, 3);
        reap(pid, "consumer");

        DLXV(dlx_close(c));
        for (int s = 0; s <= 4; s++)
                ck_assert_msg(runs(s) == 1, "deleter %d ran %d times", s, runs(s));
        ck_assert_int_eq(cuda_fake_free(a), CUDA_SUCCESS);
        ck_assert_int_eq(cuda_fake_free(b), CUDA_SUCCESS);
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/*
 * 2b. An allocation whose close was deferred behind a pending release event
 *     is closed by the time the client is: closing is the last chance.
 */
static int deferred_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        struct cuda_fake_entry e;
        pid_t me = getpid();
        size_t start;
        uint64_t ev;
        dlx_client *c;
        int err;

        c = child_start(ch, true, "deferred-consumer", NULL);
        CHECK(c, "start");
        start = log_now();
        err = DLX(dlx_acquire(c, "cache/a", NULL, &t));
        CHECK(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        ev = next_release_event(c, "cache/warm", start);
        CHECK(ev != 0, "cannot tell which event the next release records");
        CHECK(cuda_fake_event_hold(ev, true) == 0, "hold");
        DLXV(t->deleter(t));
        CHECK(log_at(QFIND(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me, .size = CACHE_A_SIZE),
                     &e),
              "allocation A was never opened");
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me, .ptr = e.ptr) == 0,
              "A closed while the reader's release event is still pending");
        CHECK(cuda_fake_live(CUDA_FAKE_IPC_MAPPING) == 1, "A closed under pending work");
        /* the reader's work completes; then the client closes without another acquire */
        CHECK(cuda_fake_event_hold(ev, false) == 0, "unhold");
        DLXV(dlx_close(c));
        CHECK(cuda_fake_live(CUDA_FAKE_IPC_MAPPING) == 0,
              "dlx_close() left %d IPC mapping(s) open: an allocation whose close was deferred "
              "behind a release event is never closed unless another acquire or release "
              "comes",
              cuda_fake_live(CUDA_FAKE_IPC_MAPPING));
        CHECK(c_tell(ch, 1) == 0, "tell");
        return 0;
}

START_TEST(ipc_deferred_close_done_by_close)
{
        struct chan ch;
        dlx_client *c;
        CUdeviceptr a, b;
        pid_t pid;

        pid = spawn_on(&ch, deferred_consumer, &ch);
        c = fx_connect(&fx, "deferred-producer");
        a = cuda_fake_malloc(CACHE_A_SIZE);
        b = cuda_fake_malloc(CACHE_B_SIZE);
        ck_assert(a && b);
        cache_publish(c, a, b);
        tell(&ch, 1);
        reap(pid, "consumer");
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(a), CUDA_SUCCESS);
        ck_assert_int_eq(cuda_fake_free(b), CUDA_SUCCESS);
        assert_nothing_live("producer after close");
        chan_close(&ch);
}
END_TEST

/* =============================================================================================
 * 3. The release fence, and dlx_wait_released().
 */

/*
 * A consumer child: acquires name (version 1) on C_STREAM when told, releases
 * it when told again and reports the event the release recorded, then closes
 * when told (after the producer waited on the event). With nothing_live, it
 * also checks that nothing of its CUDA state outlives the close.
 */
struct releaser {
        struct chan *ch;
        const char *name;
        bool nothing_live;
};

static int releasing_consumer(void *arg)
{
        const struct releaser *r = arg;
        struct chan *ch = r->ch;
        DLManagedTensorVersioned *t;
        uint64_t go, ev;
        size_t mark;
        dlx_client *c;
        int err;

        c = child_start(ch, true, "releasing-consumer", C_STREAM);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, r->name, NULL, &t));
        CHECK(err == 0, "acquire %s: %s (%s)", r->name, dlx_strerror(err), dlx_last_error());
        CHECK(version_of(t) == 1, "version %llu", (unsigned long long)version_of(t));
        CHECK(c_tell(ch, 1) == 0, "tell");
        CHECK(c_hear(ch, &go) == 0, "no release order");
        mark = log_now();
        DLXV(t->deleter(t));
        ev = recorded_event(getpid(), C_STREAM, mark, 0);
        CHECK(ev != 0, "release recorded no event on the consumer's stream");
        CHECK(c_tell(ch, ev) == 0, "tell");
        /* the event must outlive the producer's wait on it */
        CHECK(c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("consumer", r->nothing_live);
}

START_TEST(release_fence)
{
        struct dlx_publish_options po = {.stream = P_STREAM};
        struct chan ch;
        dlx_client *c;
        CUdeviceptr x, y;
        uint64_t ev;
        long pw, ww, i;
        pid_t pid, me = getpid();
        int err;

        pid = spawn_on(&ch, releasing_consumer,
                       &(struct releaser){.ch = &ch, .name = "fence/t", .nothing_live = true});
        c = fx_connect(&fx, "fence-producer");
        /* the client's stream is another: the options' one is the publish stream */
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, W2_STREAM)), 0);
        x = cuda_fake_malloc(IPC_SIZE);
        y = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x && y);
        fill((void *)(uintptr_t)x, IPC_LEN, 3);
        ck_assert_int_eq(
                DLX(dlx_publish(c, "fence/t", dev_tensor(kDLCUDA, x, IPC_LEN, 0, x), &po, NULL)),
                0);
        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 1);

        /* leased: not released */
        err = DLX(dlx_wait_released(c, "fence/t", 1, W_STREAM, 0));
        ck_assert_msg(err == -ETIMEDOUT, "wait_released (no wait) on a leased version: %s",
                      dlx_strerror(err));
        err = DLX(dlx_wait_released(c, "fence/t", 1, W_STREAM, 100));
        ck_assert_msg(err == -ETIMEDOUT, "wait_released (100 ms) on a leased version: %s",
                      dlx_strerror(err));
        err = DLX(dlx_wait_released(c, "fence/t", 99, W_STREAM, 100));
        ck_assert_msg(err == -ENOENT, "wait_released on an unknown version: %s", dlx_strerror(err));
        err = DLX(dlx_wait_released(c, "fence/none", 1, W_STREAM, 100));
        ck_assert_msg(err == -ENOENT, "wait_released on an unknown name: %s", dlx_strerror(err));

        /* replaced but still leased */
        ck_assert_int_eq(
                DLX(dlx_publish(c, "fence/t", dev_tensor(kDLCUDA, y, IPC_LEN, 1, y), &po, NULL)),
                0);
        ck_assert_int_ge(DLX(dlx_process_events(c)), 0);
        ck_assert_int_eq(runs(0), 0);
        err = DLX(dlx_wait_released(c, "fence/t", 1, W_STREAM, 100));
        ck_assert_msg(err == -ETIMEDOUT, "wait_released on a replaced, leased version: %s",
                      dlx_strerror(err));
        ck_assert_int_eq(runs(0), 0);

        /* the reader releases: its event orders the producer's stream, then the deleter runs */
        tell(&ch, 2);
        ev = hear(&ch);
        ck_assert_uint_ne(ev, 0);
        err = DLX(dlx_wait_released(c, "fence/t", 1, W_STREAM, TIMEOUT_MS));
        ck_assert_msg(err == 0, "wait_released: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(runs(0), 1);
        ck_assert_int_eq(runs(1), 0);
        pw = QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev, .by_stream = true,
                   .stream = S(P_STREAM));
        ck_assert_msg(pw >= 0, "the publish stream never waited on the reader's release event");
        ck_assert_msg(QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev,
                             .by_stream = true, .stream = S(P_STREAM)) == 1,
                      "the publish stream waited %d times on the release event",
                      QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev,
                             .by_stream = true, .stream = S(P_STREAM)));
        ck_assert_msg((uint64_t)pw < sh->run_log[0],
                      "the deleter ran (log %llu) before the publish stream waited (log %ld)",
                      (unsigned long long)sh->run_log[0], pw);
        i = QFIND(.op = CUDA_FAKE_FREE, .pid = me, .ptr = (uint64_t)x);
        ck_assert_msg(i > pw, "the memory was freed (log %ld) before the wait (log %ld)", i, pw);
        ck_assert_msg(cuda_fake_waited(P_STREAM, ev), "cuda_fake_waited(P, release event)");
        ww = QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev, .by_stream = true,
                   .stream = S(W_STREAM));
        ck_assert_msg(ww >= 0, "dlx_wait_released did not make its stream wait on the reader");
        ck_assert_msg(QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .by_stream = true,
                            .stream = S(W2_STREAM)) < 0,
                      "the client's current stream was used instead of the publish stream");

        /* remembered: again, on another stream; NULL means the client's current stream */
        err = DLX(dlx_wait_released(c, "fence/t", 1, NULL, 0));
        ck_assert_msg(err == 0, "wait_released again: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_msg(QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev,
                            .by_stream = true, .stream = S(W2_STREAM)) >= 0,
                      "wait_released(NULL stream) did not use the client's current stream");
        ck_assert_int_eq(runs(0), 1);

        tell(&ch, 3);
        reap(pid, "consumer");
        ck_assert_int_eq(DLX(dlx_unpublish(c, "fence/t")), 0);
        err = DLX(dlx_wait_released(c, "fence/t", 2, NULL, TIMEOUT_MS));
        ck_assert_msg(err == 0, "wait_released v2: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(runs(1), 1);
        DLXV(dlx_close(c));
        ck_assert_int_eq(runs(0), 1);
        ck_assert_int_eq(runs(1), 1);
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/*
 * 3b. A reader that released and then exited: its work is over, so waiting
 *     for the version's readers succeeds (its release event can no longer be
 *     opened, and need not be).
 */
static int leaving_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        int err;

        c = child_start(ch, true, "leaving-consumer", C_STREAM);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, "leave/t", NULL, &t));
        CHECK(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        DLXV(t->deleter(t));
        DLXV(dlx_close(c));
        return 0;
}

START_TEST(wait_released_after_reader_exit)
{
        struct chan ch;
        dlx_client *c;
        CUdeviceptr x;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, leaving_consumer, &ch);
        c = fx_connect(&fx, "leave-producer");
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        ck_assert_int_eq(
                DLX(dlx_publish(c, "leave/t", dev_tensor(kDLCUDA, x, IPC_LEN, 0, x), NULL, NULL)),
                0);
        tell(&ch, 1);
        reap(pid, "consumer");
        ck_assert_int_eq(DLX(dlx_unpublish(c, "leave/t")), 0);
        err = DLX(dlx_wait_released(c, "leave/t", 1, W_STREAM, TIMEOUT_MS));
        ck_assert_int_eq(runs(0), 1);
        ck_assert_msg(err == 0,
                      "dlx_wait_released() after the only reader released and exited: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        DLXV(dlx_close(c));
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/* =============================================================================================
 * 4. The producer's event pool: bounded, and an event is recorded again only after its
 *    version was released.
 */

#define POOL_FIRST 20
#define POOL_MORE 4

START_TEST(publish_event_pool)
{
        struct chan ch;
        dlx_client *c;
        CUdeviceptr base;
        size_t start;
        uint64_t e1, rel;
        long first, again, rel_at, pw;
        pid_t pid, me = getpid();
        int creates, err;

        pid = spawn_on(&ch, releasing_consumer, &(struct releaser){.ch = &ch, .name = "pool/t"});
        c = fx_connect(&fx, "pool-producer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        base = cuda_fake_malloc(IPC_SIZE);
        ck_assert(base);
        start = log_now();
        ck_assert_uint_eq(publish_dev(c, "pool/t", base + 4096, 4096, 1, NULL), 1);
        first = QFIND(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .by_stream = true,
                      .stream = S(P_STREAM), .from = start);
        e1 = recorded_event(me, P_STREAM, start, 0);
        ck_assert_msg(e1 != 0, "no event recorded at publish");
        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 1);

        for (int v = 2; v <= POOL_FIRST; v++) {
                ck_assert_uint_eq(
                        publish_dev(c, "pool/t", base + 4096 * (uint64_t)v, 4096, v, NULL),
                        (uint64_t)v);
                ck_assert_int_eq(DLX(dlx_ping(c)), 0);
        }
        creates = QCOUNT(.op = CUDA_FAKE_EVENT_CREATE, .pid = me, .from = start);
        ck_assert_msg(creates >= 1 && creates <= 3,
                      "%d events created for %d versions, one of them leased", creates, POOL_FIRST);
        ck_assert_msg(QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .event = e1) == 1,
                      "the leased version's publish event was recorded again (%d records)",
                      QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .event = e1));
        ck_assert_int_eq(runs(1), 0);
        for (int v = 2; v < POOL_FIRST; v++)
                ck_assert_msg(runs(v) == 1, "version %d: deleter ran %d times", v, runs(v));
        ck_assert_int_eq(runs(POOL_FIRST), 0);

        /* the lease goes: the event may come back, after the release */
        tell(&ch, 2);
        rel = hear(&ch);
        err = DLX(dlx_wait_released(c, "pool/t", 1, NULL, TIMEOUT_MS));
        ck_assert_msg(err == 0, "wait_released: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(runs(1), 1);
        pw = QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = rel, .by_stream = true,
                   .stream = S(P_STREAM));
        ck_assert_msg(pw >= 0 && (uint64_t)pw < sh->run_log[1],
                      "the publish stream did not wait on the release event before the deleter");
        rel_at = QFIND(.op = CUDA_FAKE_EVENT_RECORD, .pid = pid, .event = rel);
        ck_assert(rel_at >= 0);
        for (int v = POOL_FIRST + 1; v <= POOL_FIRST + POOL_MORE; v++) {
                ck_assert_uint_eq(
                        publish_dev(c, "pool/t", base + 4096 * (uint64_t)v, 4096, v, NULL),
                        (uint64_t)v);
                ck_assert_int_eq(DLX(dlx_ping(c)), 0);
        }
        again = QFIND(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .event = e1,
                      .from = (size_t)first + 1);
        ck_assert_msg(again >= 0, "the released version's event was never reused");
        ck_assert_msg(again > rel_at, "event reused (log %ld) before the reader released (log %ld)",
                      again, rel_at);
        creates = QCOUNT(.op = CUDA_FAKE_EVENT_CREATE, .pid = me, .from = start);
        ck_assert_msg(creates <= 3, "%d events created for %d versions", creates,
                      POOL_FIRST + POOL_MORE);

        unpublish_wait(c, "pool/t", POOL_FIRST + POOL_MORE);
        tell(&ch, 3);
        reap(pid, "consumer");
        DLXV(dlx_close(c));
        for (int v = 1; v <= POOL_FIRST + POOL_MORE; v++)
                ck_assert_msg(runs(v) == 1, "version %d: deleter ran %d times", v, runs(v));
        ck_assert_int_eq(cuda_fake_free(base), CUDA_SUCCESS);
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/* =============================================================================================
 * 5. kill -9 of a consumer holding a lease on a CUDA tensor.
 */

static int kill_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        int err;

        c = child_start(ch, true, "doomed-consumer", NULL);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, "kill/t", NULL, &t));
        CHECK(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(same(t->dl_tensor.data, IPC_LEN, 5), "bytes");
        CHECK(c_tell(ch, 1) == 0, "tell");
        for (;;)
                pause(); /* until SIGKILL */
        return 0;
}

START_TEST(kill9_consumer_releases)
{
        struct chan ch;
        dlx_client *c;
        CUdeviceptr x;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, kill_consumer, &ch);
        c = fx_connect(&fx, "kill-producer");
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        fill((void *)(uintptr_t)x, IPC_LEN, 5);
        ck_assert_int_eq(
                DLX(dlx_publish(c, "kill/t", dev_tensor(kDLCUDA, x, IPC_LEN, 0, x), NULL, NULL)),
                0);
        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 1);
        ck_assert_int_eq(DLX(dlx_unpublish(c, "kill/t")), 0);
        err = DLX(dlx_wait_released(c, "kill/t", 1, NULL, 100));
        ck_assert_msg(err == -ETIMEDOUT, "released under a live lease: %s", dlx_strerror(err));
        ck_assert_int_eq(runs(0), 0);

        ck_assert_int_eq(kill(pid, SIGKILL), 0);
        ck_assert_int_eq(fx_wait(pid), 128 + SIGKILL);
        err = DLX(dlx_wait_released(c, "kill/t", 1, NULL, TIMEOUT_MS));
        ck_assert_msg(err == 0, "wait_released after the kill: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_int_eq(runs(0), 1);
        ck_assert_int_eq(fx_wait_leases(c, 0, 1000), 0);
        DLXV(dlx_close(c));
        ck_assert_int_eq(runs(0), 1);
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/* =============================================================================================
 * 6. VMM: dlx_alloc on a CUDA device, cuda-vmm sharing, read-only and writable imports.
 */

#define VMM_LEN 4096

/* The VMM mapping (MEM_MAP entry) of pid that holds p, logged at or after from. */
static long vmm_map_of(pid_t pid, const void *p, size_t from, struct cuda_fake_entry *ret)
{
        struct cuda_fake_entry e;
        long i = (long)from - 1;

        while ((i = QFIND(.op = CUDA_FAKE_MEM_MAP, .pid = pid, .from = (size_t)(i + 1))) >= 0)
                if (log_at(i, &e) && (uintptr_t)p >= e.ptr && (uintptr_t)p < e.ptr + e.size) {
                        *ret = e;
                        return i;
                }
        return -1;
}

/* The access last set on the mapping holding p by pid (or -1). */
static int64_t vmm_access_of(pid_t pid, const void *p)
{
        struct cuda_fake_entry e;
        int64_t access = -1;
        long i = -1;

        while ((i = QFIND(.op = CUDA_FAKE_MEM_SET_ACCESS, .pid = pid, .from = (size_t)(i + 1))) >=
               0)
                if (log_at(i, &e) && (uintptr_t)p >= e.ptr && (uintptr_t)p < e.ptr + e.size)
                        access = (int64_t)e.aux;
        return access;
}

static int vmm_producer(void *arg)
{
        struct chan *ch = arg;
        struct dlx_publish_options ro = {.copy = DLX_COPY_NEVER, .stream = P_STREAM};
        struct dlx_publish_options rw = {
                .copy = DLX_COPY_NEVER, .writable = true, .stream = P_STREAM};
        DLManagedTensorVersioned *t[3];
        struct cuda_fake_entry e;
        struct dlx_info info;
        pid_t me = getpid();
        uint8_t *rw_data;
        size_t start;
        uint64_t go;
        dlx_client *c;
        int err;

        c = child_start(ch, false, "vmm-producer", NULL);
        CHECK(c, "start");
        start = log_now();
        for (int i = 0; i < 3; i++) {
                t[i] = alloc_on(c, kDLCUDA, VMM_LEN);
                CHECK(t[i], "dlx_alloc kDLCUDA");
                CHECK(t[i]->dl_tensor.device.device_type == kDLCUDA &&
                              t[i]->dl_tensor.device.device_id == 0,
                      "device %d", (int)t[i]->dl_tensor.device.device_type);
                CHECK(!(t[i]->flags & DLPACK_FLAG_BITMASK_READ_ONLY), "read-only allocation");
                CHECK(vmm_map_of(me, t[i]->dl_tensor.data, start, &e) >= 0,
                      "the data is not in a VMM mapping of this process");
                CHECK(vmm_access_of(me, t[i]->dl_tensor.data) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                      "the allocation is not mapped read-write");
                fill(t[i]->dl_tensor.data, VMM_LEN, (unsigned)(20 + i));
        }
        CHECK(QCOUNT(.op = CUDA_FAKE_MEM_CREATE, .pid = me, .from = start) >= 1, "no MemCreate");
        CHECK(QCOUNT(.op = CUDA_FAKE_MEM_EXPORT_TO_SHAREABLE_HANDLE, .pid = me, .from = start) ==
                      QCOUNT(.op = CUDA_FAKE_MEM_CREATE, .pid = me, .from = start),
              "not every VMM allocation was exported as an fd");
        rw_data = t[2]->dl_tensor.data;
        err = DLX(dlx_publish(c, "vmm/ro", t[0], &ro, NULL));
        CHECK(err == 0, "publish ro: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_publish(c, "vmm/ro2", t[1], &ro, NULL));
        CHECK(err == 0, "publish ro2: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_publish(c, "vmm/rw", t[2], &rw, NULL));
        CHECK(err == 0, "publish rw: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(DLX(dlx_stat(c, "vmm/ro", &info)) == 0 && strcmp(info.storage, "cuda-vmm") == 0,
              "stat storage %s", info.storage);
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_GET_MEM_HANDLE, .pid = me) == 0,
              "a VMM tensor went through legacy IPC");
        CHECK(recorded_event(me, P_STREAM, start, 0) != 0, "no event recorded at publish");
        CHECK(c_tell(ch, 1) == 0, "tell");
        /* the consumer wrote through its writable mapping, and released */
        CHECK(c_hear(ch, &go) == 0, "no word");
        CHECK(rw_data[0] == 0x5a && rw_data[VMM_LEN - 1] == 0xa5,
              "the consumer's write is not in the producer's memory");
        for (int i = 0; i < 3; i++) {
                static const char *const names[] = {"vmm/ro", "vmm/ro2", "vmm/rw"};
                CHECK(DLX(dlx_unpublish(c, names[i])) == 0, "unpublish %s", names[i]);
                err = DLX(dlx_wait_released(c, names[i], 1, NULL, TIMEOUT_MS));
                CHECK(err == 0, "wait_released %s: %s (%s)", names[i], dlx_strerror(err),
                      dlx_last_error());
        }
        CHECK(QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .by_stream = true,
                     .stream = S(P_STREAM)) >= 3,
              "the publish stream did not wait on the readers' release events");
        CHECK(c_tell(ch, 2) == 0, "tell");
        CHECK(c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("producer", true);
}

static int vmm_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *ro, *ro2, *rw;
        struct cuda_fake_entry e;
        pid_t me = getpid(), g;
        size_t start;
        uint64_t go, ev;
        dlx_client *c;
        int err, st;

        c = child_start(ch, true, "vmm-consumer", C_STREAM);
        CHECK(c, "start");
        start = log_now();
        err = DLX(dlx_acquire(c, "vmm/ro", NULL, &ro));
        CHECK(err == 0, "acquire ro: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(strcmp(storage_of(ro), "cuda-vmm") == 0, "storage %s", storage_of(ro));
        CHECK(ro->dl_tensor.device.device_type == kDLCUDA, "device type %d",
              (int)ro->dl_tensor.device.device_type);
        CHECK(ro->flags & DLPACK_FLAG_BITMASK_READ_ONLY, "not read-only");
        CHECK(same(ro->dl_tensor.data, VMM_LEN, 20), "ro's bytes");
        CHECK(vmm_map_of(me, ro->dl_tensor.data, start, &e) >= 0, "not in a VMM mapping");
        CHECK(vmm_access_of(me, ro->dl_tensor.data) == CU_MEM_ACCESS_FLAGS_PROT_READ,
              "a read-only version mapped with access %lld",
              (long long)vmm_access_of(me, ro->dl_tensor.data));
        ev = recorded_event((pid_t)sh->producer_pid, P_STREAM, 0, 0);
        CHECK(ev && cuda_fake_waited(C_STREAM, ev),
              "the consumer's stream did not wait on the producer's publish event");

        err = DLX(dlx_acquire(c, "vmm/ro2", NULL, &ro2));
        CHECK(err == 0, "acquire ro2: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(same(ro2->dl_tensor.data, VMM_LEN, 21), "ro2's bytes");
        CHECK(QCOUNT(.op = CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, .pid = me) == 1,
              "%d imports for two tensors of one segment",
              QCOUNT(.op = CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, .pid = me));

        /* a write through the read-only mapping faults (in a grandchild) */
        g = fork();
        CHECK(g >= 0, "fork");
        if (g == 0) {
                struct rlimit no_core = {0, 0};
                setrlimit(RLIMIT_CORE, &no_core);
                signal(SIGSEGV, SIG_DFL);
                *(volatile uint8_t *)ro->dl_tensor.data = 1;
                _exit(0);
        }
        st = fx_wait(g);
        CHECK(st == 128 + SIGSEGV, "writing through a read-only VMM mapping: status %d", st);
        CHECK(same(ro->dl_tensor.data, VMM_LEN, 20), "ro's bytes changed");

        /* a writable version of the same segment: mapped read-write, still one import */
        err = DLX(dlx_acquire(c, "vmm/rw", NULL, &rw));
        CHECK(err == 0, "acquire rw: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(!(rw->flags & DLPACK_FLAG_BITMASK_READ_ONLY), "a writable version is read-only");
        CHECK(same(rw->dl_tensor.data, VMM_LEN, 22), "rw's bytes");
        CHECK(vmm_access_of(me, rw->dl_tensor.data) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
              "a writable version mapped with access %lld",
              (long long)vmm_access_of(me, rw->dl_tensor.data));
        CHECK(QCOUNT(.op = CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, .pid = me) == 1,
              "%d imports for one segment",
              QCOUNT(.op = CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, .pid = me));
        ((uint8_t *)rw->dl_tensor.data)[0] = 0x5a;
        ((uint8_t *)rw->dl_tensor.data)[VMM_LEN - 1] = 0xa5;

        DLXV(ro->deleter(ro));
        DLXV(ro2->deleter(ro2));
        DLXV(rw->deleter(rw));
        /* the release events must outlive the producer's wait on them */
        CHECK(c_tell(ch, 1) == 0, "tell");
        CHECK(c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        CHECK(QCOUNT(.op = CUDA_FAKE_MEM_RELEASE, .pid = me) == 1, "%d releases of one import",
              QCOUNT(.op = CUDA_FAKE_MEM_RELEASE, .pid = me));
        return child_done("consumer", true);
}

START_TEST(vmm_alloc_share)
{
        struct chan pc, cc;
        pid_t prod, cons;

        prod = spawn_on(&pc, vmm_producer, &pc);
        sh->producer_pid = (uint64_t)prod;
        cons = spawn_on(&cc, vmm_consumer, &cc);
        ck_assert_uint_eq(hear(&pc), 1); /* published */
        tell(&cc, 1);
        ck_assert_uint_eq(hear(&cc), 1); /* read, wrote, released */
        tell(&pc, 1);
        ck_assert_uint_eq(hear(&pc), 2); /* checked the write, waited for the readers */
        tell(&cc, 2);
        reap(cons, "consumer");
        tell(&pc, 3);
        reap(prod, "producer");
        chan_close(&pc);
        chan_close(&cc);
}
END_TEST

/* 6b. A persistent VMM tensor outlives its producer process. */

static int persist_producer(void *arg)
{
        struct chan *ch = arg;
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER, .persist = true};
        DLManagedTensorVersioned *t;
        dlx_client *c;
        int err;

        c = child_start(ch, false, "persist-producer", NULL);
        CHECK(c, "start");
        t = alloc_on(c, kDLCUDA, VMM_LEN);
        CHECK(t, "dlx_alloc");
        fill(t->dl_tensor.data, VMM_LEN, 30);
        err = DLX(dlx_publish(c, "vmm/keep", t, &o, NULL));
        CHECK(err == 0, "publish: %s (%s)", dlx_strerror(err), dlx_last_error());
        DLXV(dlx_close(c));
        return child_done("producer", false);
}

static int persist_consumer(void *arg)
{
        DLManagedTensorVersioned *t;
        struct dlx_info info;
        pid_t me = getpid();
        dlx_client *c;
        int err;

        (void)arg;
        c = child_connect("persist-consumer");
        CHECK(c, "connect");
        CHECK(DLX(dlx_stat(c, "vmm/keep", &info)) == 0, "stat");
        CHECK(info.producer_pid == 0, "producer pid %d", (int)info.producer_pid);
        CHECK(strcmp(info.storage, "cuda-vmm") == 0, "storage %s", info.storage);
        err = DLX(dlx_acquire(c, "vmm/keep", NULL, &t));
        CHECK(err == 0, "acquire of a persistent cuda-vmm tensor whose producer exited: %s (%s)",
              dlx_strerror(err), dlx_last_error());
        CHECK(strcmp(storage_of(t), "cuda-vmm") == 0, "storage %s", storage_of(t));
        CHECK(same(t->dl_tensor.data, VMM_LEN, 30), "the bytes differ");
        CHECK(QCOUNT(.op = CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, .pid = me) == 1, "imports");
        DLXV(t->deleter(t));
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

START_TEST(vmm_persist_outlives_producer)
{
        struct chan ch;
        pid_t pid;

        pid = spawn_on(&ch, persist_producer, &ch);
        reap(pid, "producer");
        pid = fx_spawn(persist_consumer, NULL);
        reap(pid, "new consumer");
        chan_close(&ch);
}
END_TEST

/*
 * 6c. Only what the driver makes travels: dlxd refuses an export that is not
 *     a file of the device it was told (the fake's own memfd export here),
 *     and libdlx says so and keeps nothing; the double's import, like the
 *     driver's, takes its own exports and nothing else.
 */
START_TEST(vmm_only_driver_exports)
{
        int64_t shape[1] = {VMM_LEN};
        DLTensor proto = {
                .device = {kDLCUDA, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = shape};
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0},
                                    .requestedHandleTypes =
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
        const CUmemAllocationHandleType posix = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        const struct dlx_cuda_driver *fake = cuda_fake_driver();
        CUmemGenericAllocationHandle h, got;
        DLManagedTensorVersioned *t = NULL;
        struct dlx_stats st;
        int fds, err, memfd = -1, exp = -1, other;
        size_t gran = 0;
        dlx_client *c;

        dlx__cuda_install(fake);
        c = fx_connect(&fx, "memfd-exporter");
        fds = count_fds(0);
        err = DLX(dlx_alloc(c, &proto, &t));
        ck_assert_msg(err == -EBADF, "dlx_alloc with a memfd for an export: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        ck_assert_ptr_null(t);
        ck_assert_msg(strstr(dlx_last_error(), "cuda-vmm") &&
                              strstr(dlx_last_error(), "a regular file (a memfd)"),
                      "message: %s", dlx_last_error());
        assert_nothing_live("after the refused alloc");
        ck_assert_int_eq(count_fds(0), fds);
        ck_assert_int_eq(DLX(dlx_stats(c, &st)), 0);
        ck_assert_uint_eq(st.segments, 0);
        ck_assert_int_eq(DLX(dlx_ping(c)), 0);
        DLXV(dlx_close(c));
        dlx__cuda_install(test_driver());

        ck_assert_int_eq(
                fake->MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                CUDA_SUCCESS);
        ck_assert_int_eq(fake->MemCreate(&h, gran, &prop, 0), CUDA_SUCCESS);
        ck_assert_int_eq(fake->MemExportToShareableHandle(&memfd, h, posix, 0), CUDA_SUCCESS);
        ck_assert_int_eq(driver.MemExportToShareableHandle(&exp, h, posix, 0), CUDA_SUCCESS);
        ck_assert_int_eq(driver.MemImportFromShareableHandle(&got, (void *)(uintptr_t)memfd, posix),
                         CUDA_ERROR_INVALID_VALUE);
        other = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC); /* a pty no export made */
        ck_assert_int_ge(other, 0);
        ck_assert_int_eq(driver.MemImportFromShareableHandle(&got, (void *)(uintptr_t)other, posix),
                         CUDA_ERROR_INVALID_VALUE);
        close(other);
        other = open("/dev/null", O_RDWR | O_CLOEXEC);
        ck_assert_int_ge(other, 0);
        ck_assert_int_eq(driver.MemImportFromShareableHandle(&got, (void *)(uintptr_t)other, posix),
                         CUDA_ERROR_INVALID_VALUE);
        close(other);
        ck_assert_int_eq(driver.MemImportFromShareableHandle(&got, (void *)(uintptr_t)exp, posix),
                         CUDA_SUCCESS);
        ck_assert_int_eq(fake->MemRelease(got), CUDA_SUCCESS);
        ck_assert_int_eq(fake->MemRelease(h), CUDA_SUCCESS);
        close(memfd);
        close(exp);
        assert_nothing_live("after the imports");
}
END_TEST

/* =============================================================================================
 * 7. cuda-host: pinned host memory, registered on both sides.
 */

/* The registration (MEM_HOST_REGISTER) of pid covering p, or -1. */
static long registration_of(pid_t pid, const void *p, struct cuda_fake_entry *ret)
{
        struct cuda_fake_entry e;
        long i = -1;

        while ((i = QFIND(.op = CUDA_FAKE_MEM_HOST_REGISTER, .pid = pid,
                          .from = (size_t)(i + 1))) >= 0)
                if (log_at(i, &e) && (uintptr_t)p >= e.ptr && (uintptr_t)p < e.ptr + e.size) {
                        *ret = e;
                        return i;
                }
        return -1;
}

static int host_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        struct cuda_fake_entry reg;
        pid_t me = getpid();
        dlx_client *c;
        int err;

        c = child_start(ch, true, "host-consumer", NULL);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, "host/t", NULL, &t));
        CHECK(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(strcmp(storage_of(t), "cuda-host") == 0, "storage %s", storage_of(t));
        CHECK(t->dl_tensor.device.device_type == kDLCUDAHost, "device type %d",
              (int)t->dl_tensor.device.device_type);
        CHECK(same(t->dl_tensor.data, VMM_LEN, 40), "the bytes differ");
        CHECK(registration_of(me, t->dl_tensor.data, &reg) >= 0,
              "the consumer's mapping is not registered with the driver");
        CHECK(cuda_fake_live(CUDA_FAKE_REGISTRATION) == 1, "%d registrations",
              cuda_fake_live(CUDA_FAKE_REGISTRATION));
        DLXV(t->deleter(t));
        DLXV(dlx_close(c));
        CHECK(QFIND(.op = CUDA_FAKE_MEM_HOST_UNREGISTER, .pid = me, .ptr = reg.ptr) >= 0,
              "the mapping was not unregistered when unmapped");
        return child_done("consumer", true);
}

START_TEST(cuda_host_share)
{
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER};
        DLManagedTensorVersioned *t;
        struct cuda_fake_entry reg;
        struct dlx_info info;
        struct chan ch;
        dlx_client *c;
        pid_t pid, me = getpid();
        int err;

        pid = spawn_on(&ch, host_consumer, &ch);
        c = fx_connect(&fx, "host-producer");
        t = alloc_on(c, kDLCUDAHost, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(t->dl_tensor.device.device_type, kDLCUDAHost);
        ck_assert_msg(registration_of(me, t->dl_tensor.data, &reg) >= 0,
                      "dlx_alloc(kDLCUDAHost) memory is not registered with the driver");
        ck_assert_msg(!(reg.aux & CU_MEMHOSTREGISTER_READ_ONLY), "registered read-only");
        fill(t->dl_tensor.data, VMM_LEN, 40);
        err = DLX(dlx_publish(c, "host/t", t, &o, NULL));
        ck_assert_msg(err == 0, "publish: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(DLX(dlx_stat(c, "host/t", &info)), 0);
        ck_assert_str_eq(info.storage, "cuda-host");
        assert_dlxctl_says("stat host/t", "device:        cuda_host:0\n");
        assert_dlxctl_says("list host/", " cuda_host:0 ");
        assert_dlxctl_says("stat host/t --json",
                           "\"device\":[3,0],\"device_name\":\"cuda_host:0\"");
        tell(&ch, 1);
        reap(pid, "consumer");
        DLXV(dlx_close(c));
        ck_assert_msg(QFIND(.op = CUDA_FAKE_MEM_HOST_UNREGISTER, .pid = me, .ptr = reg.ptr) >= 0,
                      "the producer's segment was not unregistered when unmapped");
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/* =============================================================================================
 * 8. No driver: CUDA paths fail with -ENODEV and say why; CPU paths still work.
 */

static int nodrv_producer(void *arg)
{
        struct chan *ch = arg;
        dlx_client *c;
        CUdeviceptr x;
        uint64_t go;
        int err;

        c = child_start(ch, false, "nodrv-producer", NULL);
        CHECK(c, "start");
        x = cuda_fake_malloc(IPC_SIZE);
        CHECK(x, "malloc");
        err = DLX(dlx_publish(c, "nodrv/gpu", dev_tensor(kDLCUDA, x, IPC_LEN, 1, x), NULL, NULL));
        CHECK(err == 0, "publish: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(c_tell(ch, 1) == 0, "tell");
        CHECK(c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return 0;
}

static bool has_libcuda(void)
{
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

        if (lib)
                dlclose(lib);
        return lib != NULL;
}

START_TEST(no_driver)
{
        int64_t shape[1] = {IPC_LEN};
        DLTensor proto = {.ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = shape};
        DLManagedTensorVersioned *t = NULL, *got = NULL;
        struct chan ch;
        dlx_client *c;
        void *host;
        pid_t pid;
        int err;

        if (has_libcuda()) {
                fprintf(stderr, "no_driver: libcuda.so.1 exists on this host; nothing to test\n");
                return;
        }
        pid = spawn_on(&ch, nodrv_producer, &ch); /* with the fake, before it goes */
        ck_assert_uint_eq(hear(&ch), 1);

        dlx__cuda_install(NULL);
        c = fx_connect(&fx, "nodrv");
        ck_assert_int_eq(dlx_set_stream(c, 0, C_STREAM), 0); /* needs no driver */

        proto.device = (DLDevice){kDLCUDA, 0};
        err = dlx_alloc(c, &proto, &t);
        ck_assert_msg(err == -ENODEV, "dlx_alloc(kDLCUDA): %s", dlx_strerror(err));
        expect_last_error("CUDA driver");
        ck_assert_ptr_null(t);

        proto.device = (DLDevice){kDLCUDAHost, 0};
        err = dlx_alloc(c, &proto, &t);
        ck_assert_msg(err == -ENODEV, "dlx_alloc(kDLCUDAHost): %s", dlx_strerror(err));
        expect_last_error("CUDA driver");
        ck_assert_ptr_null(t);

        host = calloc(1, IPC_LEN);
        ck_assert_ptr_nonnull(host);
        err = dlx_publish(c, "nodrv/t",
                          dev_tensor(kDLCUDA, (CUdeviceptr)(uintptr_t)host, IPC_LEN, 0, 0), NULL,
                          NULL);
        ck_assert_msg(err == -ENODEV, "publish kDLCUDA: %s", dlx_strerror(err));
        expect_last_error("CUDA driver");
        ck_assert_int_eq(runs(0), 1);
        free(host);

        err = dlx_acquire(c, "nodrv/gpu", NULL, &got);
        ck_assert_msg(err == -ENODEV, "acquire of a CUDA tensor: %s", dlx_strerror(err));
        expect_last_error("CUDA driver");
        ck_assert_int_eq(fx_wait_leases(c, 0, 2000), 0);

        /* the CPU paths, in the same process */
        proto.device = (DLDevice){kDLCPU, 0};
        err = dlx_alloc(c, &proto, &t);
        ck_assert_msg(err == 0, "dlx_alloc(kDLCPU): %s (%s)", dlx_strerror(err), dlx_last_error());
        fill(t->dl_tensor.data, IPC_LEN, 50);
        ck_assert_int_eq(dlx_publish(c, "nodrv/cpu", t, NULL, NULL), 0);
        got = acquire_ok(c, "nodrv/cpu", NULL);
        ck_assert_str_eq(storage_of(got), "memfd");
        ck_assert(same(got->dl_tensor.data, IPC_LEN, 50));
        got->deleter(got);

        tell(&ch, 1);
        reap(pid, "producer");
        dlx_close(c);
        chan_close(&ch);
}
END_TEST

/*
 * CUDA does not survive fork(): a child of a process that used it gets a
 * clear -ENODEV from every CUDA path (never a hang on a lock a parent thread
 * held, nor the parent's handles), and its CPU paths work.
 */
static int forked_after_cuda(void *arg)
{
        int64_t shape[1] = {IPC_LEN};
        DLTensor proto = {.ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = shape};
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c;

        (void)arg;
        c = fx_connect(&fx, "forked");
        proto.device = (DLDevice){kDLCUDA, 0};
        if (dlx_alloc(c, &proto, &t) != -ENODEV || t)
                return 2;
        if (!strstr(dlx_last_error(), "fork"))
                return 3;
        if (dlx_acquire(c, "fork/gpu", NULL, &t) != -ENODEV)
                return 4;
        proto.device = (DLDevice){kDLCPU, 0};
        if (dlx_alloc(c, &proto, &t) != 0)
                return 5;
        t->deleter(t);
        dlx_close(c);
        return 0;
}

START_TEST(fork_after_cuda)
{
        int64_t shape[1] = {IPC_LEN};
        DLTensor proto = {.device = {kDLCUDA, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c = fx_connect(&fx, "parent");
        int rc;

        proto.shape = shape;
        ck_assert_int_eq(DLX(dlx_alloc(c, &proto, &t)), 0);
        ck_assert_int_eq(DLX(dlx_publish(c, "fork/gpu", t, NULL, NULL)), 0);
        rc = fx_wait(fx_spawn(forked_after_cuda, NULL));
        ck_assert_msg(rc == 0, "child: %d", rc);
        /* the parent's CUDA is its own still */
        t = NULL;
        ck_assert_int_eq(DLX(dlx_alloc(c, &proto, &t)), 0);
        t->deleter(t);
        DLXV(dlx_close(c));
        assert_nothing_live("after close");
}
END_TEST

/* =============================================================================================
 * 9. The caller's contexts and every failure path: clear errors, nothing leaked.
 */

START_TEST(faults_publish)
{
        CUdeviceptr x = cuda_fake_malloc(IPC_SIZE);
        struct dlx_info info;
        dlx_client *c;
        void *host;
        int err, slot = 0;
        static const struct {
                enum cuda_fake_op op;
                CUresult r;
                int err;
                const char *says;
        } faults[] = {
                /* first: the primary context is retained once per process */
                {CUDA_FAKE_DEVICE_PRIMARY_CTX_RETAIN, CUDA_ERROR_INVALID_DEVICE, -ENODEV,
                 "CUDA device"},
                {CUDA_FAKE_IPC_GET_MEM_HANDLE, CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM,
                 "cuIpcGetMemHandle"},
                {CUDA_FAKE_IPC_GET_MEM_HANDLE, CUDA_ERROR_INVALID_VALUE, -EINVAL,
                 "cuIpcGetMemHandle"},
                {CUDA_FAKE_EVENT_CREATE, CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM, "event"},
                {CUDA_FAKE_IPC_GET_EVENT_HANDLE, CUDA_ERROR_UNKNOWN, -EIO, "event"},
                {CUDA_FAKE_EVENT_RECORD, CUDA_ERROR_LAUNCH_FAILED, -EIO, "cuEventRecord"},
                {CUDA_FAKE_CTX_PUSH_CURRENT, CUDA_ERROR_INVALID_CONTEXT, -EIO, "cuCtxPushCurrent"},
        };

        ck_assert(x);
        ck_assert_int_eq(cuda_fake_set_device_count(2), 0);
        c = fx_connect(&fx, "faults-producer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        /* half the runs with a context of another device current: it must stay current */
        for (int own = 0; own < 2; own++) {
                if (own)
                        push_own_context(1);
                for (size_t i = 0; i < N_ELEMS(faults); i++, slot++) {
                        /* retained once per process: no second call to fail; and by the
                         * second round the failed record gave an event to the pool */
                        if (own && (faults[i].op == CUDA_FAKE_DEVICE_PRIMARY_CTX_RETAIN ||
                                    faults[i].op == CUDA_FAKE_EVENT_CREATE ||
                                    faults[i].op == CUDA_FAKE_IPC_GET_EVENT_HANDLE))
                                continue;
                        cuda_fake_fail_next(faults[i].op, faults[i].r);
                        err = DLX(dlx_publish(c, "faults/t",
                                              dev_tensor(kDLCUDA, x + 4096, IPC_LEN, slot, 0), NULL,
                                              NULL));
                        cuda_fake_fail_next(faults[i].op, CUDA_SUCCESS);
                        ck_assert_msg(err == faults[i].err, "%s failing with %d: publish gave %s",
                                      cuda_fake_op_name(faults[i].op), (int)faults[i].r,
                                      dlx_strerror(err));
                        ck_assert_msg(strstr(dlx_last_error(), faults[i].says),
                                      "%s failing: message '%s' does not mention %s",
                                      cuda_fake_op_name(faults[i].op), dlx_last_error(),
                                      faults[i].says);
                        ck_assert_msg(runs(slot) == 1, "%s failing: the deleter ran %d times",
                                      cuda_fake_op_name(faults[i].op), runs(slot));
                        ck_assert_int_eq(DLX(dlx_stat(c, "faults/t", &info)), -ENOENT);
                        ck_assert_msg(
                                cuda_fake_live(CUDA_FAKE_EVENT) <= 1, "%s failing: %d events alive",
                                cuda_fake_op_name(faults[i].op), cuda_fake_live(CUDA_FAKE_EVENT));
                }
                if (own) {
                        ck_assert_ptr_eq(cuda_fake_ctx_current(), cuda_fake_ctx(1));
                        pop_own_context();
                }
        }
        ck_assert_int_eq(cuda_fake_ctx_depth(), 0);

        /* not device memory at all */
        host = calloc(1, IPC_LEN);
        err = DLX(dlx_publish(c, "faults/t",
                              dev_tensor(kDLCUDA, (CUdeviceptr)(uintptr_t)host, IPC_LEN, slot, 0),
                              NULL, NULL));
        ck_assert_msg(err < 0, "host memory as kDLCUDA: %s", dlx_strerror(err));
        expect_last_error("not CUDA device memory");
        ck_assert_int_eq(runs(slot), 1);
        slot++;
        free(host);
        /* a device the driver does not have */
        {
                DLManagedTensorVersioned *t = dev_tensor(kDLCUDA, x + 4096, IPC_LEN, slot, 0);
                t->dl_tensor.device.device_id = 7;
                err = DLX(dlx_publish(c, "faults/t", t, NULL, NULL));
                ck_assert_msg(err == -ENODEV, "device 7: %s", dlx_strerror(err));
                ck_assert_int_eq(runs(slot), 1);
                slot++;
        }

        /* and then it works */
        err = DLX(dlx_publish(c, "faults/t", dev_tensor(kDLCUDA, x + 4096, IPC_LEN, slot, 0), NULL,
                              NULL));
        ck_assert_msg(err == 0, "publish after the faults: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_int_eq(DLX(dlx_unpublish(c, "faults/t")), 0);
        ck_assert_int_eq(DLX(dlx_wait_released(c, "faults/t", 1, NULL, TIMEOUT_MS)), 0);
        ck_assert_int_eq(runs(slot), 1);
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/* A producer child for the consumer-side fault tests: publishes, then waits to be told to go. */
struct side_producer {
        struct chan ch;
        bool vmm;
        char name[32];
};

static int side_producer(void *arg)
{
        struct side_producer *sp = arg;
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER, .stream = P_STREAM};
        DLManagedTensorVersioned *t;
        dlx_client *c;
        CUdeviceptr x = 0;
        uint64_t go;
        int err;

        c = child_start(&sp->ch, false, "side-producer", NULL);
        CHECK(c, "start");
        if (sp->vmm) {
                t = alloc_on(c, kDLCUDA, VMM_LEN);
                CHECK(t, "dlx_alloc");
                fill(t->dl_tensor.data, VMM_LEN, 60);
        } else {
                x = cuda_fake_malloc(IPC_SIZE);
                CHECK(x, "malloc");
                fill((void *)(uintptr_t)(x + IPC_OFF), VMM_LEN, 60);
                t = dev_tensor(kDLCUDA, x + IPC_OFF, VMM_LEN, 0, x);
        }
        err = DLX(dlx_publish(c, sp->name, t, &o, NULL));
        CHECK(err == 0, "publish: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(c_tell(&sp->ch, 1) == 0, "tell");
        CHECK(c_hear(&sp->ch, &go) == 0, "no end");
        CHECK(DLX(dlx_unpublish(c, sp->name)) == 0, "unpublish");
        err = DLX(dlx_wait_released(c, sp->name, 1, NULL, TIMEOUT_MS));
        CHECK(err == 0, "wait_released: %s (%s)", dlx_strerror(err), dlx_last_error());
        DLXV(dlx_close(c));
        return child_done("producer", true);
}

/*
 * Starts a producer publishing one tensor as name. Like every child, before
 * this process uses CUDA: a test needing several starts them all first.
 */
static pid_t side_start(struct side_producer *sp, bool vmm, const char *name)
{
        pid_t pid;

        sp->vmm = vmm;
        snprintf(sp->name, sizeof(sp->name), "%s", name);
        pid = spawn_on(&sp->ch, side_producer, sp);
        ck_assert_uint_eq(hear(&sp->ch), 1);
        return pid;
}

static void side_stop(struct side_producer *sp, pid_t pid)
{
        tell(&sp->ch, 1);
        reap(pid, "producer");
        chan_close(&sp->ch);
}

struct fault {
        enum cuda_fake_op op;
        CUresult r;
        int err;
        const char *says;
};

static void assert_messages_clear(void)
{
        ck_assert_msg(!unclear[0], "%s", unclear);
}

/* Acquires side/t with op failing: a clear error, the context intact, the lease given back. */
static void acquire_failing(dlx_client *c, const struct fault *f, const char *name)
{
        DLManagedTensorVersioned *t = NULL;
        int err;

        cuda_fake_fail_next(f->op, f->r);
        err = DLX(dlx_acquire(c, name, NULL, &t));
        cuda_fake_fail_next(f->op, CUDA_SUCCESS);
        ck_assert_msg(err == f->err, "%s failing with %d: acquire gave %s (%s)",
                      cuda_fake_op_name(f->op), (int)f->r, dlx_strerror(err), dlx_last_error());
        ck_assert_ptr_null(t);
        if (!strstr(dlx_last_error(), f->says) && !unclear[0])
                snprintf(unclear, sizeof(unclear),
                         "%s failing: dlx_last_error() after the failed acquire is '%s', which "
                         "does not say '%s'",
                         cuda_fake_op_name(f->op), dlx_last_error(), f->says);
        ck_assert_msg(fx_wait_leases(c, 0, 2000) == 0, "%s failing: the lease was kept",
                      cuda_fake_op_name(f->op));
}

START_TEST(faults_acquire_ipc)
{
        static const struct fault faults[] = {
                {CUDA_FAKE_IPC_OPEN_MEM_HANDLE, CUDA_ERROR_MAP_FAILED, -EIO, "cuIpcOpenMemHandle"},
                /* what the driver answers for an allocation whose process has gone (dlx.h) */
                {CUDA_FAKE_IPC_OPEN_MEM_HANDLE, CUDA_ERROR_INVALID_VALUE, -ESRCH,
                 "cuIpcOpenMemHandle"},
                /* what the driver answers for a handle whose process has gone */
                {CUDA_FAKE_IPC_OPEN_EVENT_HANDLE, CUDA_ERROR_INVALID_VALUE, -ESRCH,
                 "cuIpcOpenEventHandle"},
                {CUDA_FAKE_IPC_OPEN_EVENT_HANDLE, CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM,
                 "cuIpcOpenEventHandle"},
                {CUDA_FAKE_STREAM_WAIT_EVENT, CUDA_ERROR_LAUNCH_FAILED, -EIO, "cuStreamWaitEvent"},
        };
        struct side_producer sp;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        pid_t pid, me = getpid();
        int err;

        pid = side_start(&sp, false, "side/t");
        c = fx_connect(&fx, "faults-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, C_STREAM)), 0);
        push_own_context(0);
        for (size_t i = 0; i < N_ELEMS(faults); i++) {
                acquire_failing(c, &faults[i], "side/t");
                ck_assert_msg(cuda_fake_live(CUDA_FAKE_IPC_MAPPING) == 0,
                              "%s failing: the allocation stays mapped",
                              cuda_fake_op_name(faults[i].op));
        }
        err = DLX(dlx_acquire(c, "side/t", NULL, &t));
        ck_assert_msg(err == 0, "acquire after the faults: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert(same(t->dl_tensor.data, VMM_LEN, 60));
        DLXV(t->deleter(t));
        ck_assert_ptr_eq(cuda_fake_ctx_current(), cuda_fake_ctx(0));
        pop_own_context();
        side_stop(&sp, pid);
        DLXV(dlx_close(c));
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me),
                         QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me));
        assert_nothing_live("consumer after close");
        ck_assert_int_eq(ctx_bad, 0);
        assert_messages_clear();
}
END_TEST

START_TEST(faults_vmm_alloc)
{
        static const struct fault faults[] = {
                {CUDA_FAKE_MEM_GET_ALLOCATION_GRANULARITY, CUDA_ERROR_NOT_SUPPORTED, -ENOTSUP,
                 "cuMemGetAllocationGranularity"},
                {CUDA_FAKE_MEM_CREATE, CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM, "cuMemCreate"},
                {CUDA_FAKE_MEM_CREATE, CUDA_ERROR_NOT_SUPPORTED, -ENOTSUP, "cuMemCreate"},
                {CUDA_FAKE_MEM_EXPORT_TO_SHAREABLE_HANDLE, CUDA_ERROR_UNKNOWN, -EIO,
                 "cuMemExportToShareableHandle"},
                {CUDA_FAKE_MEM_ADDRESS_RESERVE, CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM,
                 "cuMemAddressReserve"},
                {CUDA_FAKE_MEM_MAP, CUDA_ERROR_UNKNOWN, -EIO, "cuMemMap"},
                {CUDA_FAKE_MEM_MAP, CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM, "cuMemMap"},
                {CUDA_FAKE_MEM_SET_ACCESS, CUDA_ERROR_INVALID_VALUE, -EINVAL, "cuMemSetAccess"},
        };
        DLManagedTensorVersioned *t;
        struct dlx_stats st;
        dlx_client *c;
        int fds, err;

        c = fx_connect(&fx, "faults-vmm");
        fds = count_fds(0);
        for (int own = 0; own < 2; own++) {
                if (own)
                        push_own_context(0);
                for (size_t i = 0; i < N_ELEMS(faults); i++) {
                        int64_t shape[1] = {VMM_LEN};
                        DLTensor proto = {.device = {kDLCUDA, 0},
                                          .ndim = 1,
                                          .dtype = {kDLUInt, 8, 1},
                                          .shape = shape};
                        t = NULL;
                        cuda_fake_fail_next(faults[i].op, faults[i].r);
                        err = DLX(dlx_alloc(c, &proto, &t));
                        cuda_fake_fail_next(faults[i].op, CUDA_SUCCESS);
                        ck_assert_msg(err == faults[i].err, "%s failing with %d: alloc gave %s",
                                      cuda_fake_op_name(faults[i].op), (int)faults[i].r,
                                      dlx_strerror(err));
                        ck_assert_ptr_null(t);
                        ck_assert_msg(strstr(dlx_last_error(), faults[i].says),
                                      "%s failing: message '%s' lacks '%s'",
                                      cuda_fake_op_name(faults[i].op), dlx_last_error(),
                                      faults[i].says);
                        ck_assert_msg(live_kind() == 0, "%s failing: %s left alive",
                                      cuda_fake_op_name(faults[i].op),
                                      live_kind() ? leak_names[live_kind() - 1] : "");
                        ck_assert_msg(count_fds(0) == fds, "%s failing: %d fds open, %d before",
                                      cuda_fake_op_name(faults[i].op), count_fds(0), fds);
                        ck_assert_int_eq(DLX(dlx_stats(c, &st)), 0);
                        ck_assert_msg(
                                st.segments == 0, "%s failing: the daemon holds %llu segments",
                                cuda_fake_op_name(faults[i].op), (unsigned long long)st.segments);
                }
                if (own) {
                        ck_assert_ptr_eq(cuda_fake_ctx_current(), cuda_fake_ctx(0));
                        pop_own_context();
                }
        }
        t = alloc_on(c, kDLCUDA, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        DLXV(t->deleter(t));

        /* pinned host memory whose registration fails */
        cuda_fake_fail_next(CUDA_FAKE_MEM_HOST_REGISTER, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        {
                int64_t shape[1] = {VMM_LEN};
                DLTensor proto = {.device = {kDLCUDAHost, 0},
                                  .ndim = 1,
                                  .dtype = {kDLUInt, 8, 1},
                                  .shape = shape};
                t = NULL;
                err = DLX(dlx_alloc(c, &proto, &t));
        }
        cuda_fake_fail_next(CUDA_FAKE_MEM_HOST_REGISTER, CUDA_SUCCESS);
        ck_assert_msg(err < 0, "alloc kDLCUDAHost with registration failing: %s",
                      dlx_strerror(err));
        expect_last_error("cuMemHostRegister");
        ck_assert_int_eq(cuda_fake_live(CUDA_FAKE_REGISTRATION), 0);
        t = alloc_on(c, kDLCUDAHost, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        DLXV(t->deleter(t));

        DLXV(dlx_close(c));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * A VMM import failing at one step, in a consumer with a context of its own
 * current: a clear error, the context intact, nothing of the import left
 * alive. With retry (9b), the same client then acquires the same segment
 * again and must get it: the daemon sent its fd once, so the client must not
 * have forgotten it silently.
 */
static const struct import_fault {
        struct fault f;
        bool retry;
} import_faults[] = {
        {{CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, CUDA_ERROR_INVALID_VALUE, -EINVAL,
          "cuMemImportFromShareableHandle"},
         false},
        {{CUDA_FAKE_MEM_MAP, CUDA_ERROR_UNKNOWN, -EIO, "cuMemMap"}, false},
        {{CUDA_FAKE_MEM_SET_ACCESS, CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM, "cuMemSetAccess"}, false},
        {{CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, CUDA_ERROR_INVALID_VALUE, -EINVAL,
          "cuMemImportFromShareableHandle"},
         true},
        {{CUDA_FAKE_MEM_MAP, CUDA_ERROR_UNKNOWN, -EIO, "cuMemMap"}, true},
};

START_TEST(faults_vmm_import)
{
        const struct import_fault *row = &import_faults[_i];
        const struct fault *f = &row->f;
        struct side_producer sp;
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c;
        pid_t pid;
        int err;

        pid = side_start(&sp, true, "side/t");
        c = fx_connect(&fx, row->retry ? "retry-consumer" : "faults-vmm-consumer");
        if (!row->retry)
                push_own_context(0);
        acquire_failing(c, f, sp.name);
        if (row->retry) {
                err = DLX(dlx_acquire(c, sp.name, NULL, &t));
                ck_assert_msg(err == 0,
                              "row %d: after %s failed once, acquiring the same tensor again gave "
                              "%s (%s)",
                              _i, cuda_fake_op_name(f->op), dlx_strerror(err), dlx_last_error());
                ck_assert(same(t->dl_tensor.data, VMM_LEN, 60));
                DLXV(t->deleter(t));
        } else {
                ck_assert_msg(live_kind() == 0, "row %d: %s failing: %s left alive", _i,
                              cuda_fake_op_name(f->op),
                              live_kind() ? leak_names[live_kind() - 1] : "");
                pop_own_context();
        }
        side_stop(&sp, pid);
        DLXV(dlx_close(c));
        assert_nothing_live("consumer after close");
        ck_assert_int_eq(ctx_bad, 0);
        assert_messages_clear();
}
END_TEST

/*
 * 9c. A producer that closes with CUDA versions still published waits for
 *     their writes, and keeps their publish events for the process's life:
 *     readers may hold leases, and wait on them, after it has gone. No more.
 */
START_TEST(close_with_published_cuda_tensors)
{
        CUdeviceptr x = cuda_fake_malloc(IPC_SIZE);
        unsigned before = dlx__gpu_retired();
        size_t start;
        dlx_client *c;

        ck_assert(x);
        c = fx_connect(&fx, "close-producer");
        publish_dev(c, "close/a", x, 4096, 0, NULL);
        publish_dev(c, "close/b", x + 4096, 4096, 1, NULL);
        ck_assert_int_eq(cuda_fake_live(CUDA_FAKE_EVENT), 2);
        start = log_now();
        DLXV(dlx_close(c));
        ck_assert_int_eq(runs(0), 1);
        ck_assert_int_eq(runs(1), 1);
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_EVENT_SYNCHRONIZE, .from = start), 2);
        ck_assert_msg(cuda_fake_live(CUDA_FAKE_EVENT) == 2 && dlx__gpu_retired() == before + 2,
                      "dlx_close() left %d publish event(s) alive, %u kept for readers",
                      cuda_fake_live(CUDA_FAKE_EVENT), dlx__gpu_retired() - before);
        assert_nothing_live("after close");
}
END_TEST

/* =============================================================================================
 * 10. A client acquiring what its own process published.
 */

START_TEST(own_process_acquire)
{
        CUdeviceptr x = cuda_fake_malloc(IPC_SIZE);
        DLManagedTensorVersioned *t, *t1;
        dlx_client *p, *q;
        size_t before, after, start;
        uint64_t ev, rel;
        pid_t me = getpid();
        long pw;
        int err;

        ck_assert(x);
        fill((void *)(uintptr_t)(x + IPC_OFF), IPC_LEN, 70);
        p = fx_connect(&fx, "own-producer");
        q = fx_connect(&fx, "own-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_set_stream(q, 0, C_STREAM)), 0);
        start = log_now();
        publish_dev(p, "own/t", x + IPC_OFF, IPC_LEN, 0, NULL);
        ev = recorded_event(me, P_STREAM, start, 0);
        ck_assert(ev);
        assert_dlxctl_says("stat own/t", "device:        cuda:0\n");
        assert_dlxctl_says("list own/", " cuda:0 ");

        before = log_now();
        err = DLX(dlx_acquire(q, "own/t", NULL, &t));
        after = log_now();
        ck_assert_msg(err == 0, "acquire from another client of this process: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        ck_assert_str_eq(storage_of(t), "cuda-ipc");
        ck_assert_ptr_eq(t->dl_tensor.data, (void *)(uintptr_t)(x + IPC_OFF));
        ck_assert(same(t->dl_tensor.data, IPC_LEN, 70));
        ck_assert_msg(QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev,
                            .by_stream = true, .stream = S(C_STREAM), .from = before,
                            .to = after) >= 0,
                      "the consumer's stream did not wait on the publish event");
        err = DLX(dlx_acquire(p, "own/t", NULL, &t1));
        ck_assert_msg(err == 0, "acquire from the publishing client: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_ptr_eq(t1->dl_tensor.data, (void *)(uintptr_t)(x + IPC_OFF));
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .pid = me), 0);
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_IPC_OPEN_EVENT_HANDLE, .pid = me), 0);

        before = log_now();
        DLXV(t->deleter(t));
        rel = recorded_event(me, C_STREAM, before, 0);
        ck_assert(rel);
        DLXV(t1->deleter(t1));
        ck_assert_int_eq(DLX(dlx_unpublish(p, "own/t")), 0);
        err = DLX(dlx_wait_released(p, "own/t", 1, NULL, TIMEOUT_MS));
        ck_assert_msg(err == 0, "wait_released: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(runs(0), 1);
        pw = QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = rel, .by_stream = true,
                   .stream = S(P_STREAM));
        ck_assert_msg(pw >= 0 && (uint64_t)pw < sh->run_log[0],
                      "the publish stream did not wait on the own reader's release event first");
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_IPC_OPEN_EVENT_HANDLE, .pid = me), 0);
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me), 0);
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(cuda_fake_live(CUDA_FAKE_IPC_EVENT), 0);
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/* =============================================================================================
 * 11. The exchange API's current stream.
 */

START_TEST(exchange_current_stream)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *t;
        dlx_tensor *h = NULL;
        CUdeviceptr x = cuda_fake_malloc(IPC_SIZE);
        dlx_client *a, *b;
        void *s = (void *)1;
        size_t start;

        ck_assert(x);
        ck_assert_ptr_nonnull(api->current_work_stream);
        a = fx_connect(&fx, "exchange-a");
        ck_assert_int_eq(api->current_work_stream(kDLCUDA, 0, &s), 0);
        ck_assert_ptr_null(s); /* nothing set: the legacy default stream */
        ck_assert_int_eq(dlx_set_stream(a, 0, P_STREAM), 0);
        ck_assert_int_eq(dlx_set_stream(a, 1, W_STREAM), 0);
        ck_assert_int_eq(api->current_work_stream(kDLCUDA, 0, &s), 0);
        ck_assert_ptr_eq(s, P_STREAM);
        ck_assert_int_eq(api->current_work_stream(kDLCUDA, 1, &s), 0);
        ck_assert_ptr_eq(s, W_STREAM);
        s = (void *)1;
        ck_assert_int_eq(api->current_work_stream(kDLCPU, 0, &s), 0);
        ck_assert_ptr_null(s);

        /* a later client is not the default until made so */
        b = fx_connect(&fx, "exchange-b");
        ck_assert_int_eq(dlx_set_stream(b, 0, C_STREAM), 0);
        ck_assert_int_eq(api->current_work_stream(kDLCUDA, 0, &s), 0);
        ck_assert_ptr_eq(s, P_STREAM);
        dlx_set_default_client(b);
        ck_assert_int_eq(api->current_work_stream(kDLCUDA, 0, &s), 0);
        ck_assert_ptr_eq(s, C_STREAM);
        dlx_set_default_client(NULL);
        ck_assert_int_eq(api->current_work_stream(kDLCUDA, 0, &s), 0);
        ck_assert_ptr_eq(s, P_STREAM);

        /* dlx_publish_from orders on that stream */
        t = dev_tensor(kDLCUDA, x, IPC_LEN, 0, 0);
        ck_assert_int_eq(dlx_tensor_wrap(t, &h), 0);
        start = log_now();
        ck_assert_int_eq(DLX(dlx_publish_from(a, "exchange/t", api, h, NULL, NULL)), 0);
        ck_assert_msg(recorded_event(getpid(), P_STREAM, start, 0) != 0,
                      "publish_from did not record on the exchange API's current stream");
        dlx_tensor_unref(h);
        ck_assert_int_eq(runs(0), 0); /* the published view keeps it */
        unpublish_wait(a, "exchange/t", 1);
        ck_assert_int_eq(runs(0), 1);
        DLXV(dlx_close(b));
        DLXV(dlx_close(a));
        ck_assert_int_eq(runs(0), 1);
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/* =============================================================================================
 * 9. What a real driver requires and the first doubles forgave: streams of
 *    other contexts and devices, mappings closed where they were opened,
 *    cuda-host ordering, a bounded number of interprocess events, writes done
 *    before the producer goes, work done before its memory is unmapped.
 */

#define X_STREAM ((CUstream)(uintptr_t)0xd000)  /* device 0, a context of the user's own */
#define D1_STREAM ((CUstream)(uintptr_t)0xd100) /* device 1, its primary context */

/* Two devices, X_STREAM in a non-primary context of device 0, D1_STREAM on device 1. */
static void two_devices_and_own_context(void)
{
        CUcontext mine;

        ck_assert_int_eq(cuda_fake_set_device_count(2), 0);
        mine = cuda_fake_ctx_create(0);
        ck_assert_ptr_nonnull(mine);
        ck_assert_int_eq(cuda_fake_stream_bind(X_STREAM, mine), 0);
        ck_assert_int_eq(cuda_fake_stream_bind(D1_STREAM, cuda_fake_ctx(1)), 0);
}

static int ctx_consumer(void *arg)
{
        struct chan *ch = arg;
        struct dlx_acquire_options ao = {.stream = X_STREAM};
        DLManagedTensorVersioned *t;
        pid_t me = getpid();
        uint64_t ev, rel;
        dlx_client *c;
        size_t mark;
        int err;

        c = child_start(ch, true, "ctx-consumer", NULL);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, "ctx/t", &ao, &t));
        CHECK(err == 0, "acquire on a stream of a non-primary context: %s (%s)", dlx_strerror(err),
              dlx_last_error());
        CHECK(cuda_fake_waited(X_STREAM, sh->producer_pid), "X did not wait for the producer");
        err = DLX(dlx_tensor_sync(t, D1_STREAM));
        CHECK(err == 0, "dlx_tensor_sync with device 1's stream: %s (%s)", dlx_strerror(err),
              dlx_last_error());
        err = DLX(dlx_tensor_sync(t, (void *)(uintptr_t)0xdead0));
        CHECK(err == -EINVAL && strstr(dlx_last_error(), "not a live CUDA stream"),
              "dlx_tensor_sync with no stream at all: %s (%s)", dlx_strerror(err),
              dlx_last_error());
        mark = log_now();
        DLXV(t->deleter(t));
        /* the release waits, on the GPU, for device 1's stream: recorded there, waited on by X */
        ev = recorded_event(me, D1_STREAM, mark, 0);
        CHECK(ev != 0, "nothing was recorded on device 1's stream at release");
        CHECK(QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev, .by_stream = true,
                    .stream = S(X_STREAM), .from = mark) >= 0,
              "the acquire stream did not wait for device 1's stream before the release");
        rel = recorded_event(me, X_STREAM, mark, 0);
        CHECK(rel != 0 && rel != ev, "no release event was recorded on the acquire stream");
        CHECK(QCOUNT(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me) == 0,
              "a host wait where the GPU could wait");
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

START_TEST(streams_of_other_contexts)
{
        struct dlx_publish_options po = {.stream = X_STREAM};
        struct chan ch;
        dlx_client *c;
        CUdeviceptr x;
        size_t start;
        pid_t pid;

        two_devices_and_own_context();
        pid = spawn_on(&ch, ctx_consumer, &ch);
        c = fx_connect(&fx, "ctx-producer");
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x != 0);
        start = log_now();
        publish_dev(c, "ctx/t", x, IPC_LEN, 0, &po);
        sh->producer_pid = recorded_event(getpid(), X_STREAM, start, 0);
        ck_assert_msg(sh->producer_pid != 0, "publish recorded nothing on its stream");
        tell(&ch, 1);
        reap(pid, "consumer");
        unpublish_wait(c, "ctx/t", 1);
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

static int two_device_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t1, *t0;
        pid_t me = getpid();
        dlx_client *c;
        int err;

        c = child_start(ch, true, "two-device-consumer", NULL);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, "dev/1", NULL, &t1));
        CHECK(err == 0, "acquire dev/1: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(t1->dl_tensor.device.device_id == 1, "dev/1 on device %d",
              (int)t1->dl_tensor.device.device_id);
        CHECK(same(t1->dl_tensor.data, IPC_LEN, 91), "dev/1's bytes differ");
        /* the reader's work is still running at release: the mapping is closed later */
        cuda_fake_fail_next(CUDA_FAKE_EVENT_QUERY, CUDA_ERROR_NOT_READY);
        DLXV(t1->deleter(t1));
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me) == 0, "closed at once");
        /* the next driver call happens in device 0's context: dev/1's mapping is closed there */
        err = DLX(dlx_acquire(c, "dev/0", NULL, &t0));
        CHECK(err == 0, "acquire dev/0: %s (%s)", dlx_strerror(err), dlx_last_error());
        DLXV(t0->deleter(t0));
        DLXV(dlx_close(c));
        CHECK(QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me) == 2,
              "%d of 2 IPC mappings closed",
              QCOUNT(.op = CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .pid = me));
        return child_done("consumer", true);
}

START_TEST(ipc_closed_in_its_context)
{
        DLManagedTensorVersioned *t;
        struct chan ch;
        dlx_client *c;
        CUdeviceptr x0, x1;
        pid_t pid;

        ck_assert_int_eq(cuda_fake_set_device_count(2), 0);
        pid = spawn_on(&ch, two_device_consumer, &ch);
        c = fx_connect(&fx, "two-device-producer");
        push_own_context(1);
        x1 = cuda_fake_malloc(IPC_SIZE);
        pop_own_context();
        x0 = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x0 && x1);
        fill((void *)(uintptr_t)x1, IPC_LEN, 91);
        t = dev_tensor(kDLCUDA, x1, IPC_LEN, 1, 0);
        t->dl_tensor.device.device_id = 1;
        ck_assert_int_eq(DLX(dlx_publish(c, "dev/1", t, NULL, NULL)), 0);
        publish_dev(c, "dev/0", x0, IPC_LEN, 0, NULL);
        tell(&ch, 1);
        reap(pid, "consumer");
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(x0), CUDA_SUCCESS);
        ck_assert_int_eq(cuda_fake_free(x1), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

static int host_order_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        pid_t me = getpid();
        dlx_client *c;
        size_t mark;
        int err;

        uint64_t rel, go;
        long sync, unreg;

        c = child_start(ch, true, "host-order-consumer", C_STREAM);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, "host/o", NULL, &t));
        CHECK(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(cuda_fake_waited(C_STREAM, sh->producer_pid),
              "the consumer's stream did not wait for the producer's event on cuda-host memory");
        CHECK(same(t->dl_tensor.data, VMM_LEN, 44), "the bytes differ");
        mark = log_now();
        DLXV(t->deleter(t));
        rel = recorded_event(me, C_STREAM, mark, 0);
        CHECK(rel != 0, "no release event recorded on the consumer's stream for cuda-host memory");
        /* alive (its event with it) until the producer has waited for it */
        CHECK(c_tell(ch, 2) == 0 && c_hear(ch, &go) == 0, "no go");
        mark = log_now();
        DLXV(dlx_close(c));
        sync = QFIND(.op = CUDA_FAKE_EVENT_SYNCHRONIZE, .pid = me, .event = rel, .from = mark);
        unreg = QFIND(.op = CUDA_FAKE_MEM_HOST_UNREGISTER, .pid = me, .from = mark);
        CHECK(unreg >= 0 && sync >= 0 && sync < unreg,
              "the pages were unpinned (log %ld) before the reader's work was done (log %ld)",
              unreg, sync);
        return child_done("consumer", true);
}

START_TEST(cuda_host_ordered_like_device_memory)
{
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER, .stream = P_STREAM};
        struct dlx_publish_options copy = {.stream = P_STREAM};
        DLManagedTensorVersioned *t;
        uint8_t *plain;
        struct chan ch;
        dlx_client *c;
        size_t start;
        uint64_t rel;
        pid_t pid, me = getpid();

        pid = spawn_on(&ch, host_order_consumer, &ch);
        c = fx_connect(&fx, "host-order-producer");
        t = alloc_on(c, kDLCUDAHost, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        fill(t->dl_tensor.data, VMM_LEN, 44);
        start = log_now();
        ck_assert_int_eq(DLX(dlx_publish(c, "host/o", t, &o, NULL)), 0);
        sh->producer_pid = recorded_event(me, P_STREAM, start, 0);
        ck_assert_msg(sh->producer_pid != 0, "no event recorded on the publish stream");
        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 2);
        /* the producer's stream waits for the reader's release before the memory is reused */
        start = log_now();
        unpublish_wait(c, "host/o", 1);
        rel = 0;
        {
                struct cuda_fake_entry e;
                long i = QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .by_stream = true,
                               .stream = S(P_STREAM), .from = start);
                if (log_at(i, &e))
                        rel = e.event;
        }
        ck_assert_msg(rel != 0, "the publish stream did not wait for the reader's release");
        tell(&ch, 3);
        reap(pid, "consumer");
        /* a copy of pinned host memory waits for the GPU's writes to it first */
        plain = aligned_alloc(64, 4096);
        ck_assert_ptr_nonnull(plain);
        memset(plain, 0x5a, 4096);
        start = log_now();
        ck_assert_int_eq(DLX(dlx_publish(c, "host/copy",
                                         dev_tensor(kDLCUDAHost, (uintptr_t)plain, 4096, 2, 0),
                                         &copy, NULL)),
                         0);
        ck_assert_msg(QFIND(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me, .by_stream = true,
                            .stream = S(P_STREAM), .from = start) >= 0,
                      "copying cuda-host memory did not wait for the publish stream");
        DLXV(dlx_close(c));
        free(plain);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

START_TEST(interprocess_events_bounded)
{
        const int n = DLX_GPU_IPC_EVENTS + 8;
        dlx_client *c;
        CUdeviceptr x;
        char name[32];
        pid_t me = getpid();
        int made = 0, synced;
        long i = -1;

        c = fx_connect(&fx, "many-events");
        x = cuda_fake_malloc((size_t)n * 64);
        ck_assert(x != 0);
        for (int k = 0; k < n; k++) {
                snprintf(name, sizeof(name), "many/%d", k);
                publish_dev(c, name, x + (CUdeviceptr)k * 64, 64, 3, NULL);
        }
        /* every version is alive: each keeps its event, up to the process's bound */
        while ((i = QFIND(.op = CUDA_FAKE_EVENT_CREATE, .pid = me, .from = (size_t)(i + 1))) >= 0) {
                struct cuda_fake_entry e;
                if (log_at(i, &e) && (e.aux & CU_EVENT_INTERPROCESS))
                        made++;
        }
        ck_assert_msg(made <= DLX_GPU_IPC_EVENTS, "%d interprocess events made (bound %d)", made,
                      DLX_GPU_IPC_EVENTS);
        synced = QCOUNT(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me);
        ck_assert_msg(synced >= n - DLX_GPU_IPC_EVENTS,
                      "%d publishes past the bound, %d waited for their stream on the host",
                      n - DLX_GPU_IPC_EVENTS, synced);
        DLXV(dlx_close(c));
        ck_assert_int_eq(runs(3), n);
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
}
END_TEST

START_TEST(close_waits_for_published_writes)
{
        /* (a persistent version's writes are done at publish: ipc_refused_across_pid_namespaces) */
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER, .stream = P_STREAM};
        DLManagedTensorVersioned *t;
        dlx_client *c;
        size_t start;
        uint64_t ev;
        pid_t me = getpid();

        c = fx_connect(&fx, "persist-closer");
        t = alloc_on(c, kDLCUDA, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        start = log_now();
        ck_assert_int_eq(DLX(dlx_publish(c, "keep/w", t, &o, NULL)), 0);
        ev = recorded_event(me, P_STREAM, start, 0);
        ck_assert(ev != 0);
        start = log_now();
        DLXV(dlx_close(c));
        /* a reader may hold it past the producer: its writes are done before the client goes */
        ck_assert_msg(QFIND(.op = CUDA_FAKE_EVENT_SYNCHRONIZE, .pid = me, .event = ev,
                            .from = start) >= 0,
                      "dlx_close did not wait for the writes a version it held was published "
                      "after");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

START_TEST(unmap_waits_for_queued_work)
{
        DLManagedTensorVersioned *t;
        dlx_client *c;

        c = fx_connect(&fx, "worker");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        t = alloc_on(c, kDLCUDA, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        /* a kernel filling it, still running when the memory goes back */
        ck_assert_int_eq(cuda_fake_stream_work(P_STREAM, (uintptr_t)t->dl_tensor.data, VMM_LEN), 0);
        DLXV(t->deleter(t));
        DLXV(dlx_close(c));
        ck_assert_msg(cuda_fake_violations() == 0,
                      "VMM memory was unmapped under work queued on the client's stream");
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/* Devices by UUID: a producer that numbers the GPUs otherwise (CUDA_VISIBLE_DEVICES). */

static int remap_producer(void *arg)
{
        const int order[2] = {1, 0}; /* its device 0 is the machine's 1 */
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER};
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        CUdeviceptr x;
        uint64_t go;
        int err;

        CHECK(cuda_fake_set_visible_devices(order, 2) == 0, "visible devices");
        c = child_start(ch, false, "remap-producer", NULL);
        CHECK(c, "start");
        CHECK(cuda_fake_driver()->CtxPushCurrent(cuda_fake_ctx(0)) == CUDA_SUCCESS, "push");
        x = cuda_fake_malloc(IPC_SIZE);
        cuda_fake_driver()->CtxPopCurrent(NULL);
        CHECK(x, "malloc");
        fill((void *)(uintptr_t)x, IPC_LEN, 51);
        err = DLX(dlx_publish(c, "remap/ipc", dev_tensor(kDLCUDA, x, IPC_LEN, 0, x), NULL, NULL));
        CHECK(err == 0, "publish remap/ipc: %s (%s)", dlx_strerror(err), dlx_last_error());
        t = alloc_on(c, kDLCUDA, VMM_LEN);
        CHECK(t, "dlx_alloc");
        fill(t->dl_tensor.data, VMM_LEN, 52);
        err = DLX(dlx_publish(c, "remap/vmm", t, &o, NULL));
        CHECK(err == 0, "publish remap/vmm: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(c_tell(ch, 1) == 0 && c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("producer", false);
}

/* Which physical device the fake says data is on, as this process numbers it. */
static int ordinal_of_data(const void *data)
{
        int ordinal = -1;

        if (cuda_fake_driver()->PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                                    (CUdeviceptr)(uintptr_t)data) != CUDA_SUCCESS)
                return -1;
        return ordinal;
}

static int remap_consumer(void *arg)
{
        static const char *const names[] = {"remap/ipc", "remap/vmm"};
        static const unsigned seeds[] = {51, 52};
        static const int64_t lens[] = {IPC_LEN, VMM_LEN};
        DLManagedTensorVersioned *t;
        dlx_client *c;
        int err;

        (void)arg;
        c = child_connect("remap-consumer");
        CHECK(c, "connect");
        for (int i = 0; i < 2; i++) {
                err = DLX(dlx_acquire(c, names[i], NULL, &t));
                CHECK(err == 0, "acquire %s: %s (%s)", names[i], dlx_strerror(err),
                      dlx_last_error());
                /* the producer's device 0 is this process's 1 */
                CHECK(t->dl_tensor.device.device_id == 1, "%s: device %d, not 1", names[i],
                      (int)t->dl_tensor.device.device_id);
                CHECK(ordinal_of_data(t->dl_tensor.data) == 1, "%s: mapped on device %d", names[i],
                      ordinal_of_data(t->dl_tensor.data));
                CHECK(same(t->dl_tensor.data, lens[i], seeds[i]), "%s: the bytes differ", names[i]);
                DLXV(t->deleter(t));
        }
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

static int narrow_consumer(void *arg)
{
        const int only[1] = {0}; /* not the machine's device 1 */
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c;
        int err;

        (void)arg;
        CHECK(cuda_fake_set_visible_devices(only, 1) == 0, "visible devices");
        c = child_connect("narrow-consumer");
        CHECK(c, "connect");
        err = DLX(dlx_acquire(c, "remap/vmm", NULL, &t));
        CHECK(err == -ENODEV && strstr(dlx_last_error(), "does not see"),
              "acquire of a tensor on a GPU this process does not see: %s (%s)", dlx_strerror(err),
              dlx_last_error());
        CHECK(fx_wait_leases(c, 0, 2000) == 0, "the lease was kept");
        DLXV(dlx_close(c));
        return child_done("narrow consumer", true);
}

START_TEST(devices_by_uuid)
{
        struct chan ch;
        pid_t prod, pid;

        ck_assert_int_eq(cuda_fake_set_device_count(2), 0);
        prod = spawn_on(&ch, remap_producer, &ch);
        ck_assert_uint_eq(hear(&ch), 1);
        pid = fx_spawn(remap_consumer, NULL);
        reap(pid, "consumer");
        pid = fx_spawn(narrow_consumer, NULL);
        reap(pid, "narrow consumer");
        tell(&ch, 1);
        reap(prod, "producer");
        chan_close(&ch);
}
END_TEST

/* Legacy IPC across PID namespaces (containers): refused with the way that works. */

/* Set in pidns_consumer() when only a user namespace of its own let it make the PID one. */
static bool pidns_in_userns;

static int pidns_reader(void)
{
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c;
        int err;

        c = child_connect("pidns-consumer");
        CHECK(c, "connect");
        err = DLX(dlx_acquire(c, "ns/ipc", NULL, &t));
        CHECK(err == -EXDEV && strstr(dlx_last_error(), "PID namespace") &&
                      strstr(dlx_last_error(), "dlx_alloc"),
              "acquire of a cuda-ipc tensor from another PID namespace: %s (%s)", dlx_strerror(err),
              dlx_last_error());
        CHECK(fx_wait_leases(c, 0, 2000) == 0, "the lease was kept");
        /*
         * What travels through the daemon works from anywhere. Not checked
         * in a user namespace of our own (not root): the driver double reads
         * a VMM fd's memfd name in /proc/self/fd, which that namespace may
         * not read, where the real driver asks the kernel driver.
         */
        if (pidns_in_userns) {
                fprintf(stderr, "pidns_reader: in a user namespace, ns/vmm not acquired\n");
                DLXV(dlx_close(c));
                return child_done("consumer", true);
        }
        err = DLX(dlx_acquire(c, "ns/vmm", NULL, &t));
        CHECK(err == 0, "acquire ns/vmm: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(same(t->dl_tensor.data, VMM_LEN, 62), "the bytes differ");
        DLXV(t->deleter(t));
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

/* Reads ns/ipc from a new PID namespace: unshare, then a child there (its pid 1). */
static int pidns_consumer(void *arg)
{
        struct chan *ch = arg;
        uint64_t go;
        pid_t pid;
        int st;

        chan_child(ch);
        CHECK(c_hear(ch, &go) == 0, "no go");
        if (unshare(CLONE_NEWPID) < 0) {
                if (unshare(CLONE_NEWUSER | CLONE_NEWPID) < 0) {
                        fprintf(stderr, "pidns_consumer: unshare: %s\n", strerror(errno));
                        return 2;
                }
                pidns_in_userns = true;
        }
        pid = fork();
        if (pid == 0)
                _exit(pidns_reader());
        CHECK(pid > 0, "fork: %s", strerror(errno));
        CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

START_TEST(ipc_refused_across_pid_namespaces)
{
        struct dlx_publish_options o = {
                .copy = DLX_COPY_NEVER, .persist = true, .stream = P_STREAM};
        DLManagedTensorVersioned *t;
        struct chan ch;
        dlx_client *c;
        CUdeviceptr x;
        size_t start;
        pid_t pid;

        /* forked before this process uses CUDA, as CUDA wants */
        pid = spawn_on(&ch, pidns_consumer, &ch);
        c = fx_connect(&fx, "pidns-producer");
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x != 0);
        publish_dev(c, "ns/ipc", x, IPC_LEN, 0, NULL);
        t = alloc_on(c, kDLCUDA, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        fill(t->dl_tensor.data, VMM_LEN, 62);
        start = log_now();
        ck_assert_int_eq(DLX(dlx_publish(c, "ns/vmm", t, &o, NULL)), 0);
        /* persistent: its writes done at publish, no event that only one namespace can open */
        ck_assert_msg(QFIND(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .by_stream = true,
                            .stream = S(P_STREAM), .from = start) >= 0,
                      "a persistent publish did not wait for its stream");
        ck_assert_msg(recorded_event(getpid(), P_STREAM, start, 0) == 0,
                      "a persistent publish recorded an event");
        tell(&ch, 1);
        reap(pid, "consumer in another PID namespace");
        chan_close(&ch);
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
}
END_TEST

/* Memory a framework allocated: shared when it can be, else refused with what it is. */

struct own_vmm {
        CUdeviceptr ptr;
        size_t size;
        CUmemGenericAllocationHandle h[2];
        int n;
};

/* n mappings of 2 MiB, side by side in one reservation, as an expandable segment grows. */
static void own_vmm_make(struct own_vmm *v, int n, unsigned long long types)
{
        const struct dlx_cuda_driver *d = test_driver();
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0},
                                    .requestedHandleTypes = (CUmemAllocationHandleType)types};
        CUmemAccessDesc rw = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

        v->n = n;
        v->size = (size_t)n * CUDA_FAKE_GRANULARITY;
        ck_assert_int_eq(d->MemAddressReserve(&v->ptr, v->size, 0, 0, 0), CUDA_SUCCESS);
        for (int i = 0; i < n; i++) {
                CUdeviceptr at = v->ptr + (CUdeviceptr)i * CUDA_FAKE_GRANULARITY;
                ck_assert_int_eq(d->MemCreate(&v->h[i], CUDA_FAKE_GRANULARITY, &prop, 0),
                                 CUDA_SUCCESS);
                ck_assert_int_eq(d->MemMap(at, CUDA_FAKE_GRANULARITY, 0, v->h[i], 0), CUDA_SUCCESS);
        }
        ck_assert_int_eq(d->MemSetAccess(v->ptr, v->size, &rw, 1), CUDA_SUCCESS);
}

static void own_vmm_free(struct own_vmm *v)
{
        const struct dlx_cuda_driver *d = test_driver();

        ck_assert_int_eq(d->MemUnmap(v->ptr, v->size), CUDA_SUCCESS);
        ck_assert_int_eq(d->MemAddressFree(v->ptr, v->size), CUDA_SUCCESS);
        for (int i = 0; i < v->n; i++)
                ck_assert_int_eq(d->MemRelease(v->h[i]), CUDA_SUCCESS);
}

static int framework_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        int err;

        c = child_start(ch, true, "framework-consumer", NULL);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, "fw/vmm", NULL, &t));
        CHECK(err == 0, "acquire fw/vmm: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(strcmp(storage_of(t), "cuda-vmm") == 0, "storage %s", storage_of(t));
        CHECK(same(t->dl_tensor.data, 8192, 71), "the bytes differ");
        DLXV(t->deleter(t));
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

/* Publishing memory that cannot be shared fails with -ENOTSUP naming what it is. */
static void refused(dlx_client *c, const char *name, CUdeviceptr p, const char *says)
{
        int err = DLX(dlx_publish(c, name, dev_tensor(kDLCUDA, p, 8192, 5, 0), NULL, NULL));

        ck_assert_msg(err == -ENOTSUP && strstr(dlx_last_error(), says),
                      "publish %s: %s (%s), not -ENOTSUP saying '%s'", name, dlx_strerror(err),
                      dlx_last_error(), says);
}

START_TEST(framework_memory)
{
        struct own_vmm shareable, closed, grown;
        struct dlx_info info;
        struct chan ch;
        dlx_client *c;
        CUdeviceptr pool, managed;
        pid_t pid;

        pid = spawn_on(&ch, framework_consumer, &ch);
        c = fx_connect(&fx, "framework");
        /* made shareable as a POSIX fd: exported, and it travels as cuda-vmm */
        own_vmm_make(&shareable, 1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        fill((void *)(uintptr_t)(shareable.ptr + 4096), 8192, 71);
        publish_dev(c, "fw/vmm", shareable.ptr + 4096, 8192, 0, NULL);
        ck_assert_int_eq(DLX(dlx_stat(c, "fw/vmm", &info)), 0);
        ck_assert_str_eq(info.storage, "cuda-vmm");
        tell(&ch, 1);
        reap(pid, "consumer");
        /* what cannot be shared says what it is */
        own_vmm_make(&closed, 1, 0);
        refused(c, "fw/closed", closed.ptr, "expandable_segments");
        own_vmm_make(&grown, 2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        refused(c, "fw/spans", grown.ptr + CUDA_FAKE_GRANULARITY - 4096, "more than one VMM");
        pool = cuda_fake_malloc_kind(IPC_SIZE, CUDA_FAKE_MEMORY_POOL);
        managed = cuda_fake_malloc_kind(IPC_SIZE, CUDA_FAKE_MEMORY_MANAGED);
        ck_assert(pool && managed);
        refused(c, "fw/pool", pool, "stream-ordered pool");
        refused(c, "fw/managed", managed, "managed memory");
        ck_assert_int_eq(runs(5), 4); /* each refused tensor was deleted */
        unpublish_wait(c, "fw/vmm", 1);
        DLXV(dlx_close(c));
        own_vmm_free(&shareable);
        own_vmm_free(&closed);
        own_vmm_free(&grown);
        ck_assert_int_eq(cuda_fake_free(pool), CUDA_SUCCESS);
        ck_assert_int_eq(cuda_fake_free(managed), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/* Read-only VMM access where the device grants it, a read-write mapping said so where not. */

static int ro_reader(void *arg)
{
        struct dlx_acquire_options wait = {.timeout_ms = TIMEOUT_MS};
        bool refuse = arg != NULL;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        int err, wp;

        cuda_fake_refuse_read_only(refuse);
        c = child_connect("ro-reader");
        CHECK(c, "connect");
        err = DLX(dlx_acquire(c, "ro/vmm", &wait, &t));
        CHECK(err == 0, "acquire (device %s read-only access): %s (%s)",
              refuse ? "refusing" : "granting", dlx_strerror(err), dlx_last_error());
        CHECK(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, "not flagged read-only");
        CHECK(same(t->dl_tensor.data, VMM_LEN, 81), "the bytes differ");
        wp = dlx_tensor_write_protected(t);
        CHECK(wp == (refuse ? 0 : 1), "write protected says %d where the device %s read-only", wp,
              refuse ? "refuses" : "grants");
        DLXV(t->deleter(t));
        DLXV(dlx_close(c));
        return child_done("reader", true);
}

START_TEST(read_only_vmm_where_granted)
{
        /* persistent: read again after its producer has gone */
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER, .persist = true};
        DLManagedTensorVersioned *t, *got, *host;
        dlx_client *c;
        CUdeviceptr x;
        pid_t pid, pid2;

        /* forked before this process uses CUDA */
        pid = fx_spawn(ro_reader, NULL);
        pid2 = fx_spawn(ro_reader, (void *)1);
        c = fx_connect(&fx, "ro-producer");
        t = alloc_on(c, kDLCUDA, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        fill(t->dl_tensor.data, VMM_LEN, 81);
        ck_assert_int_eq(DLX(dlx_publish(c, "ro/vmm", t, &o, NULL)), 0);
        reap(pid, "reader on a device that grants read-only access");
        reap(pid2, "reader on a device that refuses it");
        DLXV(dlx_close(c));
        /* the other kinds: a read-only memfd faults, cuda-ipc is the driver's read-write map */
        c = fx_connect(&fx, "ro-others");
        host = owned_2d((DLDataType){kDLUInt, 8, 1}, 8, 8, 3);
        ck_assert_ptr_nonnull(host);
        ck_assert_int_eq(DLX(dlx_publish(c, "ro/cpu", host, NULL, NULL)), 0);
        ck_assert_int_eq(DLX(dlx_acquire(c, "ro/cpu", NULL, &got)), 0);
        ck_assert_int_eq(dlx_tensor_write_protected(got), 1);
        got->deleter(got);
        x = cuda_fake_malloc(IPC_SIZE);
        publish_dev(c, "ro/ipc", x, IPC_LEN, 0, NULL);
        ck_assert_int_eq(DLX(dlx_acquire(c, "ro/ipc", NULL, &got)), 0);
        ck_assert_int_eq(dlx_tensor_write_protected(got), 0);
        got->deleter(got);
        ck_assert_int_eq(dlx_tensor_write_protected(NULL), -EINVAL);
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
}
END_TEST

/* A producer killed with its writes unfinished: the consumer's bounded way out. */

static int killed_producer(void *arg)
{
        struct chan *ch = arg;
        dlx_client *c;
        CUdeviceptr x;
        uint64_t go;
        size_t start;
        int err;

        c = child_start(ch, false, "killed-producer", P_STREAM);
        CHECK(c, "start");
        x = cuda_fake_malloc(IPC_SIZE);
        CHECK(x, "malloc");
        start = log_now();
        err = DLX(dlx_publish(c, "kill/t", dev_tensor(kDLCUDA, x, IPC_LEN, 0, x), NULL, NULL));
        CHECK(err == 0, "publish: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(c_tell(ch, recorded_event(getpid(), P_STREAM, start, 0)) == 0, "tell");
        c_hear(ch, &go); /* killed here */
        return 1;
}

START_TEST(consumer_way_out_of_a_killed_producer)
{
        DLManagedTensorVersioned *t, *cpu;
        struct chan ch;
        dlx_client *c;
        uint64_t ev;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, killed_producer, &ch);
        ev = hear(&ch);
        ck_assert(ev != 0);
        /* the kernel writing it is still running */
        ck_assert_int_eq(cuda_fake_event_hold(ev, true), 0);
        c = fx_connect(&fx, "waiting-consumer");
        ck_assert_int_eq(DLX(dlx_acquire(c, "kill/t", NULL, &t)), 0);
        err = DLX(dlx_tensor_wait(t, 0));
        ck_assert_msg(err == -ETIMEDOUT, "a poll of unfinished writes: %s", dlx_strerror(err));
        /* the producer dies with its work unfinished: its event never completes here */
        kill(pid, SIGKILL);
        ck_assert_int_eq(fx_wait(pid), 128 + SIGKILL);
        err = DLX(dlx_tensor_wait(t, 50));
        ck_assert_msg(err == -ETIMEDOUT && strstr(dlx_last_error(), "not done"),
                      "a bounded wait on a killed producer's writes: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        /* done after all (the driver finished the work): the wait says so */
        ck_assert_int_eq(cuda_fake_event_hold(ev, false), 0);
        ck_assert_int_eq(DLX(dlx_tensor_wait(t, -1)), 0);
        DLXV(t->deleter(t));
        /* CPU tensors have nothing to wait for */
        cpu = owned_2d((DLDataType){kDLUInt, 8, 1}, 4, 4, 1);
        ck_assert_int_eq(DLX(dlx_publish(c, "kill/cpu", cpu, NULL, NULL)), 0);
        ck_assert_int_eq(DLX(dlx_acquire(c, "kill/cpu", NULL, &t)), 0);
        ck_assert_int_eq(dlx_tensor_wait(t, 0), 0);
        t->deleter(t);
        ck_assert_int_eq(dlx_tensor_wait(NULL, 0), -EINVAL);
        DLXV(dlx_close(c));
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/* =============================================================================================
 * reader13: a second reader's attacks on the CUDA promises (dlx.h, README "GPU tensors
 * (CUDA)", issue 13), written from the promises alone. Each test names the promise it
 * checks; a failure here is a break of that promise, not of an implementation detail.
 */

#define D1B_STREAM ((CUstream)(uintptr_t)0xd1b0) /* device 1, primary context: a consumer's */
#define BOGUS_STREAM ((CUstream)(uintptr_t)0xdead0)

/* The first event recorded by pid at or after from, and the stream it was recorded on. */
static uint64_t any_record(pid_t pid, size_t from, uint64_t *ret_stream)
{
        struct cuda_fake_entry e;
        long i = QFIND(.op = CUDA_FAKE_EVENT_RECORD, .pid = pid, .from = from);

        if (!log_at(i, &e))
                return 0;
        if (ret_stream)
                *ret_stream = e.stream;
        return e.event;
}

/* Waits (StreamWaitEvent) by pid on stream at or after from. */
static int waits_on(pid_t pid, CUstream stream, size_t from)
{
        return QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = pid, .by_stream = true,
                      .stream = S(stream), .from = from);
}

/* 1 when a write to p faults (tried in a grandchild, rewriting the byte there), else 0. */
static int write_faults(void *p)
{
        pid_t g = fork();
        int st;

        if (g < 0)
                return -1;
        if (g == 0) {
                struct rlimit no_core = {0, 0};
                volatile uint8_t *b = p;

                setrlimit(RLIMIT_CORE, &no_core);
                signal(SIGSEGV, SIG_DFL);
                signal(SIGBUS, SIG_DFL);
                *b = *b;
                _exit(0);
        }
        st = fx_wait(g);
        if (st == 128 + SIGSEGV || st == 128 + SIGBUS)
                return 1;
        return st == 0 ? 0 : -1;
}

/*
 * dlx_publish: "opts->stream, else dlx_set_stream()'s; NULL is the legacy default stream of
 * the device's primary context"; dlx_set_stream: "The CUDA stream ... this client orders on
 * for device_id". A client that set a stream for device 0 only publishes a device-1 tensor:
 * it must not be ordered on device 0's stream. Likewise a consumer with a stream per device
 * waits on the tensor's device's, and dlx_wait_released(NULL) uses "the current stream of
 * the tensor's device".
 */
START_TEST(attack_default_stream_is_per_device)
{
        DLManagedTensorVersioned *t;
        dlx_client *p, *q;
        CUdeviceptr x1;
        size_t start, mark;
        uint64_t ev, st = 99;
        pid_t me = getpid();
        int err;

        two_devices_and_own_context();
        ck_assert_int_eq(cuda_fake_stream_bind(D1B_STREAM, cuda_fake_ctx(1)), 0);
        p = fx_connect(&fx, "per-device-producer");
        q = fx_connect(&fx, "per-device-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_set_stream(q, 0, C_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_set_stream(q, 1, D1B_STREAM)), 0);
        push_own_context(1);
        x1 = cuda_fake_malloc(IPC_SIZE);
        pop_own_context();
        ck_assert(x1);
        t = dev_tensor(kDLCUDA, x1, IPC_LEN, 0, 0);
        t->dl_tensor.device.device_id = 1;
        start = log_now();
        err = DLX(dlx_publish(p, "pd/t", t, NULL, NULL));
        ck_assert_msg(err == 0, "publish: %s (%s)", dlx_strerror(err), dlx_last_error());
        ev = any_record(me, start, &st);
        ck_assert_msg(ev != 0, "no event recorded for a device-1 publish");
        ck_assert_msg(st == 0 || st == 1,
                      "a device-1 tensor, no stream set for device 1: its event was recorded on "
                      "stream %#llx, not device 1's legacy default stream",
                      (unsigned long long)st);

        mark = log_now();
        err = DLX(dlx_acquire(q, "pd/t", NULL, &t));
        ck_assert_msg(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(t->dl_tensor.device.device_id, 1);
        ck_assert_msg(waits_on(me, C_STREAM, mark) == 0,
                      "a device-1 tensor was ordered on the consumer's device-0 stream");
        ck_assert_msg(cuda_fake_waited(D1B_STREAM, ev),
                      "the consumer's device-1 stream did not wait for the producer's event");
        DLXV(t->deleter(t));
        ck_assert_int_eq(DLX(dlx_unpublish(p, "pd/t")), 0);
        mark = log_now();
        err = DLX(dlx_wait_released(p, "pd/t", 1, NULL, TIMEOUT_MS));
        ck_assert_msg(err == 0, "wait_released: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_msg(waits_on(me, P_STREAM, mark) == 0,
                      "dlx_wait_released(NULL) of a device-1 version waited on device 0's stream");
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x1), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * dlx_tensor_sync: "NULL and 0x1 are the legacy default stream, 0x2 the per-thread one" ...
 * "acquire's own stream, or one given before, is a no-op". A consumer with no stream set
 * acquires on the legacy default stream: syncing with NULL or 0x1 adds no wait.
 */
START_TEST(attack_sync_legacy_aliases)
{
        DLManagedTensorVersioned *t;
        dlx_client *p, *q;
        CUdeviceptr x;
        size_t mark;
        uint64_t ev;
        pid_t me = getpid();
        int err, n;

        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        p = fx_connect(&fx, "alias-producer");
        q = fx_connect(&fx, "alias-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
        mark = log_now();
        publish_dev(p, "alias/t", x, IPC_LEN, 0, NULL);
        ev = recorded_event(me, P_STREAM, mark, 0);
        ck_assert(ev);
        err = DLX(dlx_acquire(q, "alias/t", NULL, &t));
        ck_assert_msg(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        mark = log_now();
        err = DLX(dlx_tensor_sync(t, NULL));
        ck_assert_msg(err == 0, "sync NULL: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_tensor_sync(t, CU_STREAM_LEGACY));
        ck_assert_msg(err == 0, "sync 0x1: %s (%s)", dlx_strerror(err), dlx_last_error());
        n = QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .from = mark);
        ck_assert_msg(n == 0,
                      "syncing with acquire's own stream (the legacy default, as NULL or 0x1) "
                      "queued %d more waits: not a no-op",
                      n);
        mark = log_now();
        err = DLX(dlx_tensor_sync(t, CU_STREAM_PER_THREAD));
        ck_assert_msg(err == 0, "sync 0x2: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_msg(cuda_fake_waited(CU_STREAM_PER_THREAD, ev),
                      "the per-thread stream did not wait for the producer");
        mark = log_now();
        DLXV(t->deleter(t));
        ck_assert_msg(recorded_event(me, CU_STREAM_PER_THREAD, mark, 0) != 0,
                      "the release did not record the per-thread stream's work");
        unpublish_wait(p, "alias/t", 1);
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * dlx_tensor_sync: "stream may be of any context and any device (the events are made in each
 * stream's own context)" and "No host wait". Acquired on a primary-context stream, used on a
 * stream of the user's own context: the release is joined on the GPU.
 */
START_TEST(attack_sync_stream_of_own_context)
{
        DLManagedTensorVersioned *t;
        dlx_client *p, *q;
        CUdeviceptr x;
        size_t mark;
        uint64_t ev, rel;
        pid_t me = getpid();
        int err;

        two_devices_and_own_context();
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        p = fx_connect(&fx, "ownctx-producer");
        q = fx_connect(&fx, "ownctx-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_set_stream(q, 0, C_STREAM)), 0);
        publish_dev(p, "ownctx/t", x, IPC_LEN, 0, NULL);
        err = DLX(dlx_acquire(q, "ownctx/t", NULL, &t));
        ck_assert_msg(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        push_own_context(1); /* whatever the caller has current */
        err = DLX(dlx_tensor_sync(t, X_STREAM));
        pop_own_context();
        ck_assert_msg(err == 0, "sync with a stream of a non-primary context: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        mark = log_now();
        DLXV(t->deleter(t));
        ev = recorded_event(me, X_STREAM, mark, 0);
        ck_assert_msg(ev != 0, "nothing recorded on the non-primary stream at release");
        ck_assert_msg(QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev,
                            .by_stream = true, .stream = S(C_STREAM), .from = mark) >= 0,
                      "the acquire stream did not wait for the non-primary stream's work");
        rel = recorded_event(me, C_STREAM, mark, 0);
        ck_assert_msg(rel != 0, "no release event on the acquire stream");
        ck_assert_msg(QCOUNT(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me, .from = mark) == 0,
                      "a host wait where the GPU could wait");
        unpublish_wait(p, "ownctx/t", 1);
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * Streams that are not streams. dlx_publish: "-EINVAL also: ... a stream that is not a live
 * CUDA stream"; header: "Invalid arguments return -EINVAL"; issue 1: "never lose a fence
 * silently". An acquire or a dlx_wait_released given a bogus stream must fail, not succeed
 * with no wait queued.
 */
START_TEST(attack_bogus_streams)
{
        struct dlx_publish_options bad = {.stream = BOGUS_STREAM};
        struct dlx_acquire_options abad = {.stream = BOGUS_STREAM};
        DLManagedTensorVersioned *t = NULL;
        struct dlx_info info;
        dlx_client *p, *q;
        CUdeviceptr x;
        size_t mark;
        pid_t me = getpid();
        int err;

        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        p = fx_connect(&fx, "bogus-producer");
        q = fx_connect(&fx, "bogus-consumer");
        err = DLX(dlx_publish(p, "bogus/t", dev_tensor(kDLCUDA, x, IPC_LEN, 0, 0), &bad, NULL));
        ck_assert_msg(err == -EINVAL, "publish on a bogus stream: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_int_eq(runs(0), 1);
        ck_assert_int_eq(DLX(dlx_stat(p, "bogus/t", &info)), -ENOENT);

        ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
        publish_dev(p, "bogus/t", x, IPC_LEN, 1, NULL);
        mark = log_now();
        err = DLX(dlx_acquire(q, "bogus/t", &abad, &t));
        ck_assert_msg(err == -EINVAL,
                      "acquire with a bogus stream: %s (%s); %d waits queued for it",
                      dlx_strerror(err), dlx_last_error(), waits_on(me, BOGUS_STREAM, mark));
        ck_assert_ptr_null(t);
        ck_assert_msg(fx_wait_leases(q, 0, 2000) == 0, "the failed acquire kept its lease");

        /* a reader, released; then waiting for it on a bogus stream */
        err = DLX(dlx_acquire(q, "bogus/t", NULL, &t));
        ck_assert_msg(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        DLXV(t->deleter(t));
        ck_assert_int_eq(DLX(dlx_unpublish(p, "bogus/t")), 0);
        ck_assert_int_eq(DLX(dlx_wait_released(p, "bogus/t", 1, NULL, TIMEOUT_MS)), 0);
        mark = log_now();
        err = DLX(dlx_wait_released(p, "bogus/t", 1, BOGUS_STREAM, TIMEOUT_MS));
        ck_assert_msg(err == -EINVAL,
                      "dlx_wait_released on a bogus stream: %s (%s); the reader's fence was "
                      "queued on it %d times",
                      dlx_strerror(err), dlx_last_error(), waits_on(me, BOGUS_STREAM, mark));
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * dlx_tensor_sync: "one that can no longer be joined on the GPU then is waited for on the
 * host, as is acquire's own stream when no release event can be recorded: a fence is never
 * dropped". The release's first, then its second EventRecord fails: some host wait follows.
 */
START_TEST(attack_release_record_fails)
{
        DLManagedTensorVersioned *t;
        dlx_client *p, *q;
        CUdeviceptr x;
        size_t mark;
        pid_t me = getpid();
        int err;

        two_devices_and_own_context();
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        p = fx_connect(&fx, "recfail-producer");
        q = fx_connect(&fx, "recfail-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_set_stream(q, 0, C_STREAM)), 0);
        publish_dev(p, "recfail/t", x, IPC_LEN, 0, NULL);
        for (unsigned skip = 0; skip < 2; skip++) {
                int records, syncs;

                err = DLX(dlx_acquire(q, "recfail/t", NULL, &t));
                ck_assert_msg(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
                err = DLX(dlx_tensor_sync(t, D1_STREAM));
                ck_assert_msg(err == 0, "sync: %s (%s)", dlx_strerror(err), dlx_last_error());
                mark = log_now();
                cuda_fake_fail_after(CUDA_FAKE_EVENT_RECORD, skip, CUDA_ERROR_LAUNCH_FAILED);
                DLXV(t->deleter(t));
                cuda_fake_fail_next(CUDA_FAKE_EVENT_RECORD, CUDA_SUCCESS);
                records = QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .from = mark);
                syncs = QCOUNT(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me, .from = mark) +
                        QCOUNT(.op = CUDA_FAKE_EVENT_SYNCHRONIZE, .pid = me, .from = mark);
                ck_assert_msg(syncs >= 1,
                              "release with EventRecord #%u failing: %d records went through "
                              "and nothing was waited for on the host: a fence dropped",
                              skip + 1, records);
        }
        unpublish_wait(p, "recfail/t", 1);
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * dlx_tensor_write_protected: "Whether writing through a tensor dlx_acquire() returned ...
 * faults in this process: 1 when its mapping refuses writes (a read-only memfd, cuda-host or
 * cuda-vmm tensor ...), 0 when it is read-only by DLPACK_FLAG_BITMASK_READ_ONLY alone or
 * writable". For every storage kind, read-only and writable, in another process and in the
 * producer's own: the answer is what a write really does.
 */
static const struct wp_case {
        const char *name;
        int expect; /* in another process; -1: only that it tells the truth */
} wp_cases[] = {
        {"wp/cpu-ro", 1},  {"wp/cpu-rw", 0}, {"wp/cpu-copy", 1}, {"wp/host-ro", 1},
        {"wp/host-rw", 0}, {"wp/vmm-ro", 1}, {"wp/vmm-rw", 0},   {"wp/ipc", 0},
};

/* 0 when every case tells the truth (and, with strict, the value dlx.h gives), else 1. */
static int wp_check_all(dlx_client *c, bool strict, const char *who)
{
        int bad = 0;

        for (size_t i = 0; i < N_ELEMS(wp_cases); i++) {
                DLManagedTensorVersioned *t = NULL;
                int err = DLX(dlx_acquire(c, wp_cases[i].name, NULL, &t)), wp, faults;

                if (err < 0) {
                        fprintf(stderr, "%s: acquire %s: %s (%s)\n", who, wp_cases[i].name,
                                dlx_strerror(err), dlx_last_error());
                        bad = 1;
                        continue;
                }
                wp = dlx_tensor_write_protected(t);
                faults = write_faults((uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset);
                if (wp != faults ||
                    (strict && wp_cases[i].expect >= 0 && wp != wp_cases[i].expect)) {
                        fprintf(stderr,
                                "%s: %s (%s, %s): dlx_tensor_write_protected says %d, a write "
                                "%s%s\n",
                                who, wp_cases[i].name, storage_of(t),
                                t->flags & DLPACK_FLAG_BITMASK_READ_ONLY ? "READ_ONLY" : "writable",
                                wp,
                                faults == 1   ? "faults"
                                : faults == 0 ? "does not fault"
                                              : "?",
                                strict ? "" : " (the producer's own process)");
                        bad = 1;
                }
                DLXV(t->deleter(t));
        }
        return bad;
}

static int wp_consumer(void *arg)
{
        struct chan *ch = arg;
        dlx_client *c;
        uint64_t go;
        int bad;

        c = child_start(ch, true, "wp-consumer", C_STREAM);
        CHECK(c, "start");
        bad = wp_check_all(c, true, "another process");
        CHECK(c_tell(ch, 1) == 0 && c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        CHECK(bad == 0, "dlx_tensor_write_protected is not what a write does (above)");
        return child_done("wp consumer", true);
}

START_TEST(attack_write_protected_tells_the_truth)
{
        static const struct {
                const char *name;
                DLDeviceType type;
                bool writable;
        } allocs[] = {
                {"wp/cpu-ro", kDLCPU, false},       {"wp/cpu-rw", kDLCPU, true},
                {"wp/host-ro", kDLCUDAHost, false}, {"wp/host-rw", kDLCUDAHost, true},
                {"wp/vmm-ro", kDLCUDA, false},      {"wp/vmm-rw", kDLCUDA, true},
        };
        struct chan ch;
        dlx_client *p, *p2, *q;
        CUdeviceptr x;
        pid_t pid;
        int bad;

        pid = spawn_on(&ch, wp_consumer, &ch);
        p = fx_connect(&fx, "wp-producer");
        /* writable versions from a client of their own: segments are sealed per client */
        p2 = fx_connect(&fx, "wp-producer-rw");
        ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
        for (size_t i = 0; i < N_ELEMS(allocs); i++) {
                struct dlx_publish_options o = {.copy = DLX_COPY_NEVER,
                                                .writable = allocs[i].writable};
                dlx_client *by = allocs[i].writable ? p2 : p;
                DLManagedTensorVersioned *t = alloc_on(by, allocs[i].type, VMM_LEN);
                int err;

                ck_assert_ptr_nonnull(t);
                fill(t->dl_tensor.data, VMM_LEN, 90 + (unsigned)i);
                err = DLX(dlx_publish(by, allocs[i].name, t, &o, NULL));
                ck_assert_msg(err == 0, "publish %s: %s (%s)", allocs[i].name, dlx_strerror(err),
                              dlx_last_error());
        }
        ck_assert_int_eq(
                DLX(dlx_publish(p, "wp/cpu-copy", owned_2d((DLDataType){kDLUInt, 8, 1}, 8, 8, 3),
                                NULL, NULL)),
                0);
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        publish_dev(p, "wp/ipc", x, IPC_LEN, 0, NULL);
        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 1);
        tell(&ch, 2);
        reap(pid, "consumer");
        /* the producer's own process */
        q = fx_connect(&fx, "wp-own");
        bad = wp_check_all(q, false, "the producer's process");
        DLXV(dlx_close(q));
        ck_assert_msg(bad == 0, "in the producer's own process, dlx_tensor_write_protected is not "
                                "what a write does (above)");
        DLXV(dlx_close(p2));
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        chan_close(&ch);
}
END_TEST

/*
 * dlx_acquire: "-EXDEV a CUDA tensor that cannot cross PID namespaces ...: a cuda-ipc one, or
 * one ordered by a legacy IPC event; a persistent dlx_alloc() tensor can"; README: cuda-host
 * is "ordered by events like device memory". From another PID namespace: a non-persistent
 * cuda-vmm or cuda-host version is -EXDEV saying why, with no lease and nothing of CUDA
 * kept; a persistent cuda-host one works.
 */
static int pidns2_reader(void)
{
        static const char *const refused_names[] = {"ns2/vmm", "ns2/host"};
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c;
        int err;

        c = child_connect("pidns2-consumer");
        CHECK(c, "connect");
        for (int i = 0; i < 2; i++) {
                t = NULL;
                err = DLX(dlx_acquire(c, refused_names[i], NULL, &t));
                CHECK(err == -EXDEV && strstr(dlx_last_error(), "PID namespace"),
                      "acquire of non-persistent %s from another PID namespace: %s (%s)",
                      refused_names[i], dlx_strerror(err), dlx_last_error());
                CHECK(t == NULL, "ret_tensor set on failure");
                CHECK(fx_wait_leases(c, 0, 2000) == 0, "%s: the lease was kept", refused_names[i]);
                if (live_kind() != 0)
                        fprintf(stderr, "note: %s: %d %s alive after the refusal (until close)\n",
                                refused_names[i], cuda_fake_live(leak_kinds[live_kind() - 1]),
                                leak_names[live_kind() - 1]);
        }
        err = DLX(dlx_acquire(c, "ns2/host-p", NULL, &t));
        CHECK(err == 0,
              "acquire of a persistent cuda-host tensor from another PID namespace: %s "
              "(%s)",
              dlx_strerror(err), dlx_last_error());
        CHECK(same(t->dl_tensor.data, VMM_LEN, 64), "the bytes differ");
        DLXV(t->deleter(t));
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

static int pidns2_consumer(void *arg)
{
        struct chan *ch = arg;
        uint64_t go;
        pid_t pid;
        int st;

        chan_child(ch);
        CHECK(c_hear(ch, &go) == 0, "no go");
        if (unshare(CLONE_NEWPID) < 0 && unshare(CLONE_NEWUSER | CLONE_NEWPID) < 0) {
                fprintf(stderr, "pidns2_consumer: unshare: %s\n", strerror(errno));
                return 2;
        }
        pid = fork();
        if (pid == 0)
                _exit(pidns2_reader());
        CHECK(pid > 0, "fork: %s", strerror(errno));
        CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

START_TEST(attack_pidns_vmm_and_host)
{
        struct dlx_publish_options np = {.copy = DLX_COPY_NEVER, .stream = P_STREAM};
        struct dlx_publish_options ps = {
                .copy = DLX_COPY_NEVER, .persist = true, .stream = P_STREAM};
        DLManagedTensorVersioned *t;
        struct chan ch;
        dlx_client *c;
        pid_t pid;

        pid = spawn_on(&ch, pidns2_consumer, &ch);
        c = fx_connect(&fx, "pidns2-producer");
        t = alloc_on(c, kDLCUDA, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        fill(t->dl_tensor.data, VMM_LEN, 62);
        ck_assert_int_eq(DLX(dlx_publish(c, "ns2/vmm", t, &np, NULL)), 0);
        t = alloc_on(c, kDLCUDAHost, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        fill(t->dl_tensor.data, VMM_LEN, 63);
        ck_assert_int_eq(DLX(dlx_publish(c, "ns2/host", t, &np, NULL)), 0);
        t = alloc_on(c, kDLCUDAHost, VMM_LEN);
        ck_assert_ptr_nonnull(t);
        fill(t->dl_tensor.data, VMM_LEN, 64);
        ck_assert_int_eq(DLX(dlx_publish(c, "ns2/host-p", t, &ps, NULL)), 0);
        tell(&ch, 1);
        reap(pid, "consumer in another PID namespace");
        chan_close(&ch);
        DLXV(dlx_close(c));
        assert_nothing_live("after close");
}
END_TEST

/*
 * dlx_acquire: "-ESRCH a CUDA tensor whose producer has exited but is still listed". The
 * producer exits while a process it forked keeps its connection (so the daemon still lists
 * its versions): cuda-ipc, cuda-vmm and cuda-host versions it published are -ESRCH, leases
 * given back.
 */
/* Dups every socket this process has open, so that a child forked next holds them too. */
static void dup_sockets(void)
{
        int fds[64], n = 0;
        char path[300], target[128];
        struct dirent *de;
        DIR *d = opendir("/proc/self/fd");
        int self = d ? dirfd(d) : -1; /* the listing's own fd, gone after closedir */

        while (d && n < 64 && (de = readdir(d))) {
                ssize_t len;

                snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
                len = readlink(path, target, sizeof(target) - 1);
                if (len > 0 && (target[len] = 0, strncmp(target, "socket:", 7) == 0))
                        fds[n++] = atoi(de->d_name);
        }
        if (d)
                closedir(d);
        for (int i = 0; i < n; i++)
                if (fds[i] != self)
                        (void)dup(fds[i]);
}

static int gone_producer(void *arg)
{
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER};
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        CUdeviceptr x;
        pid_t keep;
        int err;

        c = child_start(ch, false, "gone-producer", P_STREAM);
        CHECK(c, "start");
        x = cuda_fake_malloc(IPC_SIZE);
        CHECK(x, "malloc");
        fill((void *)(uintptr_t)x, IPC_LEN, 41);
        err = DLX(dlx_publish(c, "gone/ipc", dev_tensor(kDLCUDA, x, IPC_LEN, 0, 0), NULL, NULL));
        CHECK(err == 0, "publish ipc: %s (%s)", dlx_strerror(err), dlx_last_error());
        t = alloc_on(c, kDLCUDA, VMM_LEN);
        CHECK(t, "alloc vmm");
        err = DLX(dlx_publish(c, "gone/vmm", t, &o, NULL));
        CHECK(err == 0, "publish vmm: %s (%s)", dlx_strerror(err), dlx_last_error());
        t = alloc_on(c, kDLCUDAHost, VMM_LEN);
        CHECK(t, "alloc host");
        err = DLX(dlx_publish(c, "gone/host", t, &o, NULL));
        CHECK(err == 0, "publish host: %s (%s)", dlx_strerror(err), dlx_last_error());
        dup_sockets(); /* the connection, whatever the library closes in a forked child */
        keep = fork();
        if (keep == 0) {
                for (;;)
                        pause(); /* holds the connection until killed */
        }
        CHECK(keep > 0, "fork");
        c_tell(ch, (uint64_t)keep);
        _exit(0); /* no close, no exit handlers: the connection lives on in keep */
}

START_TEST(attack_producer_exited_still_listed)
{
        static const char *const names[] = {"gone/ipc", "gone/vmm", "gone/host"};
        struct dlx_info info;
        struct chan ch;
        dlx_client *c;
        pid_t pid, keep;
        int bad = 0;

        pid = spawn_on(&ch, gone_producer, &ch);
        keep = (pid_t)hear(&ch);
        ck_assert_int_eq(fx_wait(pid), 0); /* exited, and reaped */
        c = fx_connect(&fx, "gone-consumer");
        ck_assert_int_eq(DLX(dlx_stat(c, "gone/ipc", &info)), 0); /* still listed */
        for (size_t i = 0; i < N_ELEMS(names); i++) {
                DLManagedTensorVersioned *t = NULL;
                int err = DLX(dlx_acquire(c, names[i], NULL, &t));

                if (err != -ESRCH) {
                        fprintf(stderr, "acquire %s of an exited producer: %s (%s)\n", names[i],
                                dlx_strerror(err), dlx_last_error());
                        bad++;
                }
                if (t)
                        DLXV(t->deleter(t));
                ck_assert_msg(fx_wait_leases(c, 0, 2000) == 0, "%s: a lease was kept", names[i]);
        }
        kill(keep, SIGKILL);
        DLXV(dlx_close(c));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
        ck_assert_msg(bad == 0, "%d of %zu tensors of an exited producer were not -ESRCH (above)",
                      bad, N_ELEMS(names));
}
END_TEST

/* dlx_acquire: "-ESRCH a CUDA tensor ... whose IPC allocation it freed (retry)". */
static int freed_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c;
        uint64_t go;
        int err;

        c = child_start(ch, true, "freed-consumer", C_STREAM);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, "freed/t", NULL, &t));
        CHECK(err == -ESRCH, "acquire of a cuda-ipc tensor whose allocation was freed: %s (%s)",
              dlx_strerror(err), dlx_last_error());
        CHECK(fx_wait_leases(c, 0, 2000) == 0, "the lease was kept");
        CHECK(live_kind() == 0, "%s left alive", leak_names[live_kind() - 1]);
        CHECK(c_tell(ch, 1) == 0 && c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

START_TEST(attack_ipc_allocation_freed)
{
        struct chan ch;
        dlx_client *c;
        CUdeviceptr x;
        pid_t pid;

        pid = spawn_on(&ch, freed_consumer, &ch);
        c = fx_connect(&fx, "freed-producer");
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        publish_dev(c, "freed/t", x, IPC_LEN, 0, NULL);
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 1);
        tell(&ch, 2);
        reap(pid, "consumer");
        DLXV(dlx_close(c));
        chan_close(&ch);
}
END_TEST

/*
 * dlx_publish: "a process past its 1024 interprocess events ... , until versions are
 * released". Once they are, publishing orders by an event again, without a host wait.
 */
START_TEST(attack_events_come_back_after_release)
{
        const int n = DLX_GPU_IPC_EVENTS + 8;
        dlx_client *c;
        CUdeviceptr x;
        char name[32];
        size_t mark;
        pid_t me = getpid();

        c = fx_connect(&fx, "events-back");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        x = cuda_fake_malloc((size_t)n * 64 + 64);
        ck_assert(x != 0);
        for (int k = 0; k < n; k++) {
                snprintf(name, sizeof(name), "back/%d", k);
                publish_dev(c, name, x + (CUdeviceptr)k * 64, 64, 3, NULL);
        }
        for (int k = 0; k < n; k++) {
                snprintf(name, sizeof(name), "back/%d", k);
                unpublish_wait(c, name, 1);
        }
        ck_assert_int_eq(runs(3), n);
        mark = log_now();
        publish_dev(c, "back/again", x + (CUdeviceptr)n * 64, 64, 4, NULL);
        ck_assert_msg(recorded_event(me, P_STREAM, mark, 0) != 0,
                      "every version released, and publishing records no event");
        ck_assert_msg(QCOUNT(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me, .from = mark) == 0,
                      "every version released, and publishing still waits on the host");
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
}
END_TEST

/*
 * dlx_tensor_wait: "< 0: no limit, 0: only looks" ... "Needs no daemon" ... "persistent
 * ones, return 0 at once"; dlx_acquire: the deleter "releases the lease exactly once";
 * dlx_publish: "-ENODEV ... a process forked from one that used CUDA"; issue 11: "a CUDA
 * call failing after fork gives no hint". After the consumer's client closed, in a forked
 * child, and with a negative timeout other than -1.
 */
struct forkwait {
        DLManagedTensorVersioned *t, *tp;
        CUdeviceptr x;
};

static int forked_waiter(void *arg)
{
        struct forkwait *f = arg;
        dlx_client *c;
        int err, bad = 0;

        err = dlx_tensor_wait(f->tp, 0);
        CHECK(err == 0, "dlx_tensor_wait of a persistent version in a forked child: %s (%s)",
              dlx_strerror(err), dlx_last_error());
        err = dlx_tensor_wait(f->t, 0);
        CHECK(err == -ENODEV && strstr(dlx_last_error(), "fork"),
              "dlx_tensor_wait in a child forked after CUDA: %s (%s)", dlx_strerror(err),
              dlx_last_error());
        err = dlx_tensor_sync(f->t, C2_STREAM);
        if (!(err == -ENODEV && strstr(dlx_last_error(), "fork"))) {
                /* dlx_tensor_sync returns "0, -EINVAL, -ENOSPC, -ENOMEM or a CUDA failure
                 * (-ENODEV, -EIO)"; checked last, so that the rest runs */
                fprintf(stderr, "dlx_tensor_sync in a child forked after CUDA: %d %s (%s)\n", err,
                        dlx_strerror(err), dlx_last_error());
                bad = 1;
        }
        c = child_connect("forked-publisher");
        CHECK(c, "connect");
        err = dlx_publish(c, "forked/pub", dev_tensor(kDLCUDA, f->x, 64, 6, 0), NULL, NULL);
        CHECK(err == -ENODEV && strstr(dlx_last_error(), "fork"),
              "dlx_publish of a CUDA tensor in a child forked after CUDA: %s (%s)",
              dlx_strerror(err), dlx_last_error());
        CHECK(runs(6) == 1, "the deleter ran %d times", runs(6));
        dlx_close(c);
        /* the parent's tensor, inherited: its lease is the parent's */
        f->t->deleter(f->t);
        f->tp->deleter(f->tp);
        CHECK(bad == 0, "dlx_tensor_sync in a forked child (above)");
        return 0;
}

static void *unhold_later(void *arg)
{
        fx_sleep_ms(100);
        cuda_fake_event_hold(*(uint64_t *)arg, false);
        return NULL;
}

START_TEST(attack_tensor_wait_edges)
{
        struct dlx_publish_options ps = {.copy = DLX_COPY_NEVER, .persist = true};
        struct forkwait f;
        DLManagedTensorVersioned *tv;
        dlx_client *p, *q;
        pthread_t th;
        size_t mark;
        uint64_t ev;
        pid_t me = getpid();
        int err, rc;

        f.x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(f.x);
        p = fx_connect(&fx, "tw-producer");
        q = fx_connect(&fx, "tw-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
        mark = log_now();
        publish_dev(p, "tw/t", f.x, IPC_LEN, 0, NULL);
        ev = recorded_event(me, P_STREAM, mark, 0);
        ck_assert(ev);
        tv = alloc_on(p, kDLCUDA, VMM_LEN);
        ck_assert_ptr_nonnull(tv);
        ck_assert_int_eq(DLX(dlx_publish(p, "tw/p", tv, &ps, NULL)), 0);
        ck_assert_int_eq(cuda_fake_event_hold(ev, true), 0);
        ck_assert_int_eq(DLX(dlx_acquire(q, "tw/t", NULL, &f.t)), 0);
        ck_assert_int_eq(DLX(dlx_acquire(q, "tw/p", NULL, &f.tp)), 0);
        err = DLX(dlx_tensor_wait(f.tp, 0));
        ck_assert_msg(err == 0, "persistent version: %s (%s)", dlx_strerror(err), dlx_last_error());
        /* the consumer's client closes: its live tensors keep their leases, and need no daemon */
        DLXV(dlx_close(q));
        err = DLX(dlx_tensor_wait(f.t, 0));
        ck_assert_msg(err == -ETIMEDOUT, "looking after dlx_close: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        err = DLX(dlx_tensor_wait(f.t, 30));
        ck_assert_msg(err == -ETIMEDOUT, "30 ms after dlx_close: %s (%s)", dlx_strerror(err),
                      dlx_last_error());

        rc = fx_wait(fx_spawn(forked_waiter, &f));
        ck_assert_msg(rc == 0, "the forked child failed (%d, see above)", rc);
        fx_sleep_ms(300);
        ck_assert_msg(fx_stats(p).leases == 2,
                      "the parent's leases after a forked child ran the inherited deleters: "
                      "%llu, not 2",
                      (unsigned long long)fx_stats(p).leases);

        ck_assert_int_eq(pthread_create(&th, NULL, unhold_later, &ev), 0);
        err = DLX(dlx_tensor_wait(f.t, -7));
        pthread_join(th, NULL);
        ck_assert_msg(err == 0, "a negative timeout (no limit): %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        DLXV(f.t->deleter(f.t));
        DLXV(f.tp->deleter(f.tp));
        ck_assert_int_eq(fx_wait_leases(p, 0, 2000), 0);
        unpublish_wait(p, "tw/t", 1);
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(f.x), CUDA_SUCCESS);
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * dlx_publish: a framework's VMM allocation made shareable "is exported (...); the tensor must
 * lie within one mapping". The tensor's data pointer is in one mapping and its byte_offset
 * puts every byte in the next one: published, a consumer must read those bytes; and a
 * byte_offset that makes it straddle two mappings is -ENOTSUP.
 */
static int bo_consumer(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        uint64_t go;
        int err;

        chan_child(ch);
        CHECK(c_hear(ch, &go) == 0, "no go");
        if (go != 1)
                return 0; /* refused: nothing to read */
        c = child_connect("bo-consumer");
        CHECK(c, "connect");
        err = DLX(dlx_acquire(c, "bo/next", NULL, &t));
        CHECK(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(same((uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset, 8192, 73),
              "the bytes differ from those the producer's tensor describes (data %p, "
              "byte_offset %llu)",
              t->dl_tensor.data, (unsigned long long)t->dl_tensor.byte_offset);
        DLXV(t->deleter(t));
        CHECK(c_tell(ch, 1) == 0 && c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

START_TEST(attack_vmm_byte_offset_in_next_mapping)
{
        struct own_vmm grown;
        DLManagedTensorVersioned *t;
        struct chan ch;
        dlx_client *c;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, bo_consumer, &ch);
        c = fx_connect(&fx, "bo-producer");
        own_vmm_make(&grown, 2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        fill((void *)(uintptr_t)(grown.ptr + CUDA_FAKE_GRANULARITY + 4096), 8192, 73);
        t = dev_tensor(kDLCUDA, grown.ptr, 8192, 0, 0);
        t->dl_tensor.byte_offset = CUDA_FAKE_GRANULARITY + 4096;
        err = DLX(dlx_publish(c, "bo/next", t, NULL, NULL));
        if (err == 0) {
                tell(&ch, 1);
                ck_assert_uint_eq(hear(&ch), 1);
        } else {
                fprintf(stderr, "note: bo/next refused: %s (%s)\n", dlx_strerror(err),
                        dlx_last_error());
                tell(&ch, 2);
        }
        ck_assert_msg(err == 0 || (err == -ENOTSUP && strstr(dlx_last_error(), "VMM")),
                      "a tensor within one VMM mapping, by its byte_offset: publish %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        if (err == 0)
                tell(&ch, 2);
        reap(pid, "consumer");
        t = dev_tensor(kDLCUDA, grown.ptr, 8192, 1, 0);
        t->dl_tensor.byte_offset = CUDA_FAKE_GRANULARITY - 4096;
        err = DLX(dlx_publish(c, "bo/straddle", t, NULL, NULL));
        ck_assert_msg(err == -ENOTSUP && strstr(dlx_last_error(), "more than one VMM"),
                      "a byte_offset that straddles two mappings: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        if (runs(0) == 0)
                unpublish_wait(c, "bo/next", 1);
        DLXV(dlx_close(c));
        own_vmm_free(&grown);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/*
 * dlx_tensor_sync, dlx_tensor_wait, dlx_tensor_info, dlx_tensor_write_protected: "A tensor
 * dlx_acquire() returned (or an export of it through libdlx's exchange API)". Through the
 * exchange API's managed_tensor_from_py_object_no_sync, all four work as on the tensor.
 */
START_TEST(attack_exchange_export_of_acquired)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *t, *out = NULL;
        const char *storage = NULL;
        dlx_tensor *h = NULL;
        dlx_client *p, *q;
        CUdeviceptr x;
        size_t mark;
        uint64_t ev;
        pid_t me = getpid();
        int err, wp;

        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        p = fx_connect(&fx, "ex-producer");
        q = fx_connect(&fx, "ex-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_set_stream(q, 0, C_STREAM)), 0);
        mark = log_now();
        publish_dev(p, "ex/t", x, IPC_LEN, 0, NULL);
        ev = recorded_event(me, P_STREAM, mark, 0);
        ck_assert_int_eq(DLX(dlx_acquire(q, "ex/t", NULL, &t)), 0);
        wp = dlx_tensor_write_protected(t);
        ck_assert_int_eq(dlx_tensor_wrap(t, &h), 0);
        ck_assert_int_eq(api->managed_tensor_from_py_object_no_sync(h, &out), 0);
        ck_assert_ptr_nonnull(out);
        err = dlx_tensor_info(out, NULL, NULL, &storage);
        ck_assert_msg(err == 0 && storage && strcmp(storage, "cuda-ipc") == 0,
                      "dlx_tensor_info of an export: %s", dlx_strerror(err));
        ck_assert_int_eq(dlx_tensor_write_protected(out), wp);
        err = DLX(dlx_tensor_wait(out, 0));
        ck_assert_msg(err == 0, "dlx_tensor_wait of an export: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        err = DLX(dlx_tensor_sync(out, C2_STREAM));
        ck_assert_msg(err == 0, "dlx_tensor_sync of an export: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_msg(cuda_fake_waited(C2_STREAM, ev),
                      "the export's sync stream did not wait for the producer");
        DLXV(out->deleter(out));
        mark = log_now();
        DLXV(dlx_tensor_unref(h));
        ck_assert_msg(recorded_event(me, C2_STREAM, mark, 0) != 0,
                      "the release did not record the work of the stream the export was synced "
                      "with");
        unpublish_wait(p, "ex/t", 1);
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * Three devices numbered otherwise on each side (README: "a consumer whose
 * CUDA_VISIBLE_DEVICES numbers the GPUs otherwise gets the producer's GPU under its own
 * ordinal"), and the consumer's stream for that ordinal (dlx_set_stream per device_id) is the
 * one that waits.
 */
#define R_STREAM(i) ((CUstream)(uintptr_t)(0xe000 + 0x100 * (i)))

static int remap3_producer(void *arg)
{
        const int order[3] = {2, 0, 1};
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER};
        int64_t shape[1] = {VMM_LEN};
        DLTensor proto = {
                .device = {kDLCUDA, 2}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = shape};
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        CUdeviceptr x;
        uint64_t go;
        int err;

        CHECK(cuda_fake_set_visible_devices(order, 3) == 0, "visible devices");
        c = child_start(ch, false, "remap3-producer", NULL);
        CHECK(c, "start");
        CHECK(cuda_fake_driver()->CtxPushCurrent(cuda_fake_ctx(0)) == CUDA_SUCCESS, "push");
        x = cuda_fake_malloc(IPC_SIZE);
        cuda_fake_driver()->CtxPopCurrent(NULL);
        CHECK(x, "malloc");
        fill((void *)(uintptr_t)x, IPC_LEN, 53);
        err = DLX(dlx_publish(c, "r3/ipc", dev_tensor(kDLCUDA, x, IPC_LEN, 0, x), NULL, NULL));
        CHECK(err == 0, "publish r3/ipc: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_alloc(c, &proto, &t));
        CHECK(err == 0, "dlx_alloc on device 2: %s (%s)", dlx_strerror(err), dlx_last_error());
        fill(t->dl_tensor.data, VMM_LEN, 54);
        err = DLX(dlx_publish(c, "r3/vmm", t, &o, NULL));
        CHECK(err == 0, "publish r3/vmm: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(c_tell(ch, 1) == 0 && c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("producer", false);
}

static int remap3_consumer(void *arg)
{
        const int order[3] = {1, 2, 0};
        /* the producer's ordinal 0 is the machine's 2, here 1; its 2 is the machine's 1, here 0 */
        static const char *const names[] = {"r3/ipc", "r3/vmm"};
        static const int want[] = {1, 0};
        static const unsigned seeds[] = {53, 54};
        static const int64_t lens[] = {IPC_LEN, VMM_LEN};
        DLManagedTensorVersioned *t;
        pid_t me = getpid();
        dlx_client *c;
        size_t mark;
        int err;

        (void)arg;
        CHECK(cuda_fake_set_visible_devices(order, 3) == 0, "visible devices");
        for (int i = 0; i < 3; i++)
                CHECK(cuda_fake_stream_bind(R_STREAM(i), cuda_fake_ctx(i)) == 0, "bind");
        c = child_connect("remap3-consumer");
        CHECK(c, "connect");
        for (int i = 0; i < 3; i++)
                CHECK(DLX(dlx_set_stream(c, i, R_STREAM(i))) == 0, "set_stream %d", i);
        for (int i = 0; i < 2; i++) {
                mark = log_now();
                err = DLX(dlx_acquire(c, names[i], NULL, &t));
                CHECK(err == 0, "acquire %s: %s (%s)", names[i], dlx_strerror(err),
                      dlx_last_error());
                CHECK(t->dl_tensor.device.device_id == want[i], "%s: device %d, not %d", names[i],
                      (int)t->dl_tensor.device.device_id, want[i]);
                CHECK(ordinal_of_data(t->dl_tensor.data) == want[i], "%s: mapped on device %d",
                      names[i], ordinal_of_data(t->dl_tensor.data));
                CHECK(same(t->dl_tensor.data, lens[i], seeds[i]), "%s: the bytes differ", names[i]);
                for (int d = 0; d < 3; d++)
                        CHECK((waits_on(me, R_STREAM(d), mark) > 0) == (d == want[i]),
                              "%s (this process's device %d): device %d's stream %s", names[i],
                              want[i], d, d == want[i] ? "did not wait" : "waited");
                DLXV(t->deleter(t));
        }
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

START_TEST(attack_three_devices_remapped)
{
        struct chan ch;
        pid_t prod, pid;

        ck_assert_int_eq(cuda_fake_set_device_count(3), 0);
        prod = spawn_on(&ch, remap3_producer, &ch);
        ck_assert_uint_eq(hear(&ch), 1);
        pid = fx_spawn(remap3_consumer, NULL);
        reap(pid, "consumer");
        tell(&ch, 1);
        reap(prod, "producer");
        chan_close(&ch);
}
END_TEST

/*
 * dlx_publish: "Readers are ordered after the work queued on the stream (opts->stream ...) by
 * an interprocess event recorded on it, in the stream's own context" (a stream of another
 * device than the tensor's included: issue 1); dlx_wait_released: "makes stream ... wait, on
 * the GPU, for the work each reader recorded before releasing" (a stream of any context).
 */
START_TEST(attack_streams_of_other_devices_for_publish_and_wait)
{
        struct dlx_publish_options o = {.stream = D1_STREAM};
        DLManagedTensorVersioned *t;
        dlx_client *p, *q;
        CUdeviceptr x;
        size_t mark;
        uint64_t ev, rel;
        pid_t me = getpid();
        int err;

        two_devices_and_own_context();
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        p = fx_connect(&fx, "od-producer");
        q = fx_connect(&fx, "od-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(q, 0, C_STREAM)), 0);
        mark = log_now();
        err = DLX(dlx_publish(p, "od/t", dev_tensor(kDLCUDA, x, IPC_LEN, 0, 0), &o, NULL));
        ck_assert_msg(err == 0, "publish a device-0 tensor on device 1's stream: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        ev = recorded_event(me, D1_STREAM, mark, 0);
        ck_assert_msg(ev != 0, "no event recorded on the publish stream (device 1's)");
        ck_assert_int_eq(DLX(dlx_acquire(q, "od/t", NULL, &t)), 0);
        ck_assert_msg(cuda_fake_waited(C_STREAM, ev), "the consumer did not wait for it");
        mark = log_now();
        DLXV(t->deleter(t));
        rel = recorded_event(me, C_STREAM, mark, 0);
        ck_assert(rel);
        ck_assert_int_eq(DLX(dlx_unpublish(p, "od/t")), 0);
        ck_assert_int_eq(DLX(dlx_wait_released(p, "od/t", 1, NULL, TIMEOUT_MS)), 0);
        mark = log_now();
        err = DLX(dlx_wait_released(p, "od/t", 1, X_STREAM, 0));
        ck_assert_msg(err == 0, "wait_released on a non-primary context's stream: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        ck_assert_msg(cuda_fake_waited(X_STREAM, rel), "X did not wait for the reader");
        err = DLX(dlx_wait_released(p, "od/t", 1, D1_STREAM, 0));
        ck_assert_msg(err == 0, "wait_released on device 1's stream: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_msg(cuda_fake_waited(D1_STREAM, rel), "device 1's stream did not wait");
        ck_assert_msg(QCOUNT(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me, .from = mark) == 0,
                      "a host wait where the GPU could wait");
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * dlx_tensor_sync: "-ENOSPC (more than 64 streams besides acquire's)"; and the 64 it took are
 * each joined by the release ("the tensor's release waits for the work queued on stream").
 * The legacy (NULL) and per-thread (0x2) streams count as streams.
 */
#define MANY_STREAM(i) ((CUstream)(uintptr_t)(0x100000 + 0x100 * (i)))

START_TEST(attack_sync_64_streams)
{
        CUstream given[70];
        DLManagedTensorVersioned *t;
        dlx_client *p, *q;
        CUdeviceptr x;
        size_t mark;
        pid_t me = getpid();
        int n = 0, err, missing = 0, bound = 0;

        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        while (bound < 64 && cuda_fake_stream_bind(MANY_STREAM(bound), cuda_fake_ctx(0)) == 0)
                bound++;
        given[n++] = P_STREAM;
        given[n++] = C2_STREAM;
        given[n++] = W_STREAM;
        given[n++] = W2_STREAM;
        given[n++] = CU_STREAM_PER_THREAD;
        for (int i = 0; i < bound && n < 64; i++)
                given[n++] = MANY_STREAM(i);
        ck_assert_int_eq(n, 64);
        given[n++] = NULL; /* the 65th */
        p = fx_connect(&fx, "many-producer");
        q = fx_connect(&fx, "many-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(q, 0, C_STREAM)), 0);
        publish_dev(p, "many/t", x, IPC_LEN, 0, NULL);
        ck_assert_int_eq(DLX(dlx_acquire(q, "many/t", NULL, &t)), 0);
        for (int i = 0; i < 64; i++) {
                err = DLX(dlx_tensor_sync(t, given[i]));
                ck_assert_msg(err == 0, "sync #%d: %s (%s)", i + 1, dlx_strerror(err),
                              dlx_last_error());
        }
        err = DLX(dlx_tensor_sync(t, given[64]));
        ck_assert_msg(err == -ENOSPC, "a 65th stream besides acquire's: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        mark = log_now();
        DLXV(t->deleter(t));
        for (int i = 0; i < 64; i++)
                if (recorded_event(me, given[i], mark, 0) == 0 &&
                    QFIND(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me, .by_stream = true,
                          .stream = S(given[i]), .from = mark) < 0)
                        missing++;
        ck_assert_msg(missing == 0,
                      "the release joined %d of the 64 streams given neither on the "
                      "GPU nor on the host",
                      missing);
        unpublish_wait(p, "many/t", 1);
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * Issue 4: "invalidate cached opened events when their exporter's session ends". A consumer
 * reads a version, its producer closes its client and publishes again from a new one (same
 * process): the consumer's stream waits on the new session's event, and acquiring works.
 */
static int session_consumer(void *arg)
{
        struct dlx_acquire_options wait = {.timeout_ms = TIMEOUT_MS};
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        uint64_t ev;
        int err;

        c = child_start(ch, false, "session-consumer", C_STREAM);
        CHECK(c, "start");
        for (int round = 0; round < 3; round++) {
                CHECK(c_hear(ch, &ev) == 0, "no event id");
                err = DLX(dlx_acquire(c, "sess/t", &wait, &t));
                CHECK(err == 0, "round %d: acquire: %s (%s)", round, dlx_strerror(err),
                      dlx_last_error());
                CHECK(cuda_fake_waited(C_STREAM, ev),
                      "round %d: the stream did not wait on this session's event %#llx", round,
                      (unsigned long long)ev);
                err = DLX(dlx_tensor_wait(t, TIMEOUT_MS));
                CHECK(err == 0, "round %d: dlx_tensor_wait: %s (%s)", round, dlx_strerror(err),
                      dlx_last_error());
                DLXV(t->deleter(t));
                CHECK(c_tell(ch, 1) == 0, "tell");
        }
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

START_TEST(attack_events_of_an_ended_session)
{
        struct chan ch;
        CUdeviceptr x;
        pid_t pid, me = getpid();

        pid = spawn_on(&ch, session_consumer, &ch);
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        for (int round = 0; round < 3; round++) {
                dlx_client *p = fx_connect(&fx, "session-producer");
                size_t mark = log_now();

                ck_assert_int_eq(DLX(dlx_set_stream(p, 0, P_STREAM)), 0);
                publish_dev(p, "sess/t", x, IPC_LEN, round, NULL);
                tell(&ch, recorded_event(me, P_STREAM, mark, 0));
                ck_assert_uint_eq(hear(&ch), 1);
                unpublish_wait(p, "sess/t", 1);
                DLXV(dlx_close(p));
        }
        reap(pid, "consumer");
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        chan_close(&ch);
}
END_TEST

/*
 * The same race in one step: a producer may have opened a reader's release
 * event and not yet enqueued its wait when the reader's client closes. So
 * closing never destroys a release event (a wait on a destroyed event is
 * undefined): its work is waited for, and the process's next client records
 * the same event again instead of making another.
 */
START_TEST(release_events_outlive_their_client)
{
        DLManagedTensorVersioned *t;
        dlx_client *p, *q;
        CUdeviceptr x;
        uint64_t rel, again;
        size_t mark;
        pid_t me = getpid();

        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        p = fx_connect(&fx, "outlive-producer");
        publish_dev(p, "outlive/t", x, IPC_LEN, 0, NULL);
        q = fx_connect(&fx, "outlive-reader");
        ck_assert_int_eq(DLX(dlx_set_stream(q, 0, C_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_acquire(q, "outlive/t", NULL, &t)), 0);
        mark = log_now();
        DLXV(t->deleter(t));
        rel = recorded_event(me, C_STREAM, mark, 0);
        ck_assert_msg(rel != 0, "the release recorded no event");
        mark = log_now();
        DLXV(dlx_close(q));
        ck_assert_msg(QFIND(.op = CUDA_FAKE_EVENT_DESTROY, .event = rel, .from = mark) < 0,
                      "closing the reader destroyed its release event %#llx",
                      (unsigned long long)rel);
        ck_assert_msg(QFIND(.op = CUDA_FAKE_EVENT_SYNCHRONIZE, .event = rel, .from = mark) >= 0,
                      "closing the reader did not wait for its release event");

        q = fx_connect(&fx, "outlive-reader-2");
        ck_assert_int_eq(DLX(dlx_set_stream(q, 0, C_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_acquire(q, "outlive/t", NULL, &t)), 0);
        mark = log_now();
        DLXV(t->deleter(t));
        again = recorded_event(me, C_STREAM, mark, 0);
        ck_assert_msg(again == rel, "the next client made event %#llx instead of reusing %#llx",
                      (unsigned long long)again, (unsigned long long)rel);
        ck_assert_msg(QFIND(.op = CUDA_FAKE_EVENT_CREATE, .from = mark) < 0,
                      "the next client's release made a new event");
        DLXV(dlx_close(q));
        unpublish_wait(p, "outlive/t", 1);
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
}
END_TEST

/*
 * Header: "No call waits forever by default". A reader releases with its work unfinished
 * (its release event held) and is killed: the producer's wait_released, unpublish and close
 * all return.
 */
static int doomed_reader(void *arg)
{
        struct chan *ch = arg;
        DLManagedTensorVersioned *t;
        dlx_client *c;
        size_t mark;
        uint64_t rel;
        int err;

        c = child_start(ch, true, "doomed-reader", C_STREAM);
        CHECK(c, "start");
        err = DLX(dlx_acquire(c, "doom/t", NULL, &t));
        CHECK(err == 0, "acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        mark = log_now();
        DLXV(t->deleter(t));
        rel = recorded_event(getpid(), C_STREAM, mark, 0);
        CHECK(rel != 0, "no release event");
        CHECK(cuda_fake_event_hold(rel, true) == 0, "hold");
        CHECK(c_tell(ch, rel) == 0, "tell");
        for (;;)
                pause();
        return 0;
}

START_TEST(attack_reader_killed_with_release_unfinished)
{
        struct chan ch;
        dlx_client *c;
        CUdeviceptr x;
        int64_t t0;
        uint64_t rel;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, doomed_reader, &ch);
        c = fx_connect(&fx, "doom-producer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        publish_dev(c, "doom/t", x, IPC_LEN, 0, NULL);
        tell(&ch, 1);
        rel = hear(&ch);
        ck_assert(rel);
        kill(pid, SIGKILL);
        ck_assert_int_eq(fx_wait(pid), 128 + SIGKILL);
        t0 = fx_now_ms();
        ck_assert_int_eq(DLX(dlx_unpublish(c, "doom/t")), 0);
        err = DLX(dlx_wait_released(c, "doom/t", 1, W_STREAM, 5000));
        ck_assert_msg(err == 0 || err == -ETIMEDOUT, "wait_released: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        DLXV(dlx_close(c));
        ck_assert_msg(fx_now_ms() - t0 < 8000,
                      "the producer took %lld ms to let go of a killed reader's version",
                      (long long)(fx_now_ms() - t0));
        cuda_fake_event_hold(rel, false);
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        chan_close(&ch);
}
END_TEST

/*
 * README: "A process makes at most 1024 interprocess events". Readers' release events are
 * interprocess events too: a process that holds more than 1024 leases and releases them all,
 * with its own publications alive, stays within the bound (counted live, from the log).
 */
static int max_live_interprocess(pid_t pid)
{
        struct cuda_fake_entry e;
        int live = 0, most = 0;

        for (size_t i = 0; i < cuda_fake_log_count(); i++) {
                if (!cuda_fake_log_entry(i, &e) || e.pid != pid || !(e.aux & CU_EVENT_INTERPROCESS))
                        continue;
                if (e.op == CUDA_FAKE_EVENT_CREATE && ++live > most)
                        most = live;
                else if (e.op == CUDA_FAKE_EVENT_DESTROY)
                        live--;
        }
        return most;
}

static int many_producer(void *arg)
{
        struct chan *ch = arg;
        dlx_client *c;
        CUdeviceptr x;
        char name[32];
        uint64_t go;
        int err;

        c = child_start(ch, false, "many-producer", P_STREAM);
        CHECK(c, "start");
        x = cuda_fake_malloc((size_t)(DLX_GPU_IPC_EVENTS + 64) * 64);
        CHECK(x, "malloc");
        for (int k = 0; k < DLX_GPU_IPC_EVENTS + 64; k++) {
                snprintf(name, sizeof(name), "lots/%d", k);
                err = DLX(dlx_publish(c, name,
                                      dev_tensor(kDLCUDA, x + (CUdeviceptr)k * 64, 64, 7, 0), NULL,
                                      NULL));
                CHECK(err == 0, "publish %s: %s (%s)", name, dlx_strerror(err), dlx_last_error());
        }
        CHECK(c_tell(ch, 1) == 0 && c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return 0;
}

START_TEST(attack_release_events_bounded)
{
        const int n = DLX_GPU_IPC_EVENTS + 64;
        DLManagedTensorVersioned **ts = calloc((size_t)n, sizeof(*ts));
        struct chan ch;
        dlx_client *c;
        char name[32];
        pid_t pid, me = getpid();
        int most;

        ck_assert_ptr_nonnull(ts);
        pid = spawn_on(&ch, many_producer, &ch);
        ck_assert_uint_eq(hear(&ch), 1);
        c = fx_connect(&fx, "many-reader");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, C_STREAM)), 0);
        for (int k = 0; k < n; k++) {
                int err;

                snprintf(name, sizeof(name), "lots/%d", k);
                err = DLX(dlx_acquire(c, name, NULL, &ts[k]));
                ck_assert_msg(err == 0, "acquire %s: %s (%s)", name, dlx_strerror(err),
                              dlx_last_error());
        }
        for (int k = 0; k < n; k++)
                DLXV(ts[k]->deleter(ts[k]));
        most = max_live_interprocess(me);
        tell(&ch, 1);
        reap(pid, "producer");
        DLXV(dlx_close(c));
        free(ts);
        chan_close(&ch);
        ck_assert_msg(most <= DLX_GPU_IPC_EVENTS,
                      "a reader releasing %d tensors had %d interprocess events alive at once "
                      "(bound %d)",
                      n, most, DLX_GPU_IPC_EVENTS);
        assert_nothing_live("after close");
}
END_TEST

/*
 * README: "A process makes at most 1024 interprocess events; past that, publishing waits for
 * its stream on the host". Per process, not per client: two clients of one process publish
 * 600 live versions each.
 */
START_TEST(attack_event_bound_is_per_process)
{
        const int per = 600;
        dlx_client *a, *b;
        CUdeviceptr x;
        char name[32];
        pid_t me = getpid();
        int most;

        a = fx_connect(&fx, "bound-a");
        b = fx_connect(&fx, "bound-b");
        ck_assert_int_eq(DLX(dlx_set_stream(a, 0, P_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_set_stream(b, 0, W_STREAM)), 0);
        x = cuda_fake_malloc((size_t)per * 2 * 64);
        ck_assert(x);
        for (int k = 0; k < per; k++) {
                snprintf(name, sizeof(name), "ba/%d", k);
                publish_dev(a, name, x + (CUdeviceptr)k * 64, 64, 3, NULL);
                snprintf(name, sizeof(name), "bb/%d", k);
                publish_dev(b, name, x + (CUdeviceptr)(per + k) * 64, 64, 3, NULL);
        }
        most = max_live_interprocess(me);
        DLXV(dlx_close(b));
        DLXV(dlx_close(a));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        ck_assert_msg(most <= DLX_GPU_IPC_EVENTS,
                      "two clients of one process, %d live versions: %d interprocess events "
                      "alive at once (bound %d per process)",
                      2 * per, most, DLX_GPU_IPC_EVENTS);
        assert_nothing_live("after close");
}
END_TEST

/*
 * dlx_close: "first waits on the host for the GPU work each version this client still holds
 * was published after ..., so that a reader's lease or a persistent version never outlives
 * the producer's writes". Versions replaced or unpublished but still leased are held too.
 */
START_TEST(attack_close_waits_for_replaced_leased_versions)
{
        struct dlx_publish_options o = {.stream = P_STREAM};
        DLManagedTensorVersioned *t1, *t2;
        dlx_client *p, *q;
        CUdeviceptr x;
        size_t start;
        uint64_t e1, e2;
        pid_t me = getpid();
        bool w1, w2;

        x = cuda_fake_malloc(IPC_SIZE);
        ck_assert(x);
        p = fx_connect(&fx, "replacer");
        q = fx_connect(&fx, "holder");
        start = log_now();
        ck_assert_int_eq(DLX(dlx_publish(p, "rep/t", dev_tensor(kDLCUDA, x, 4096, 0, 0), &o, NULL)),
                         0);
        e1 = recorded_event(me, P_STREAM, start, 0);
        ck_assert_int_eq(DLX(dlx_acquire(q, "rep/t", NULL, &t1)), 0);
        start = log_now();
        ck_assert_int_eq(
                DLX(dlx_publish(p, "rep/u", dev_tensor(kDLCUDA, x + 4096, 4096, 1, 0), &o, NULL)),
                0);
        e2 = recorded_event(me, P_STREAM, start, 0);
        ck_assert_int_eq(DLX(dlx_acquire(q, "rep/u", NULL, &t2)), 0);
        /* v1 of rep/t replaced, rep/u unpublished: both still leased by q */
        ck_assert_int_eq(
                DLX(dlx_publish(p, "rep/t", dev_tensor(kDLCUDA, x + 8192, 4096, 2, 0), &o, NULL)),
                0);
        ck_assert_int_eq(DLX(dlx_unpublish(p, "rep/u")), 0);
        ck_assert(e1 && e2 && e1 != e2);
        start = log_now();
        DLXV(dlx_close(p));
        /* a host wait on each event, or on the stream they were recorded on, after both */
        w1 = QFIND(.op = CUDA_FAKE_EVENT_SYNCHRONIZE, .pid = me, .event = e1, .from = start) >= 0;
        w2 = QFIND(.op = CUDA_FAKE_EVENT_SYNCHRONIZE, .pid = me, .event = e2, .from = start) >= 0;
        if (QFIND(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me, .by_stream = true,
                  .stream = S(P_STREAM), .from = start) >= 0)
                w1 = w2 = true;
        ck_assert_msg(w1, "dlx_close did not wait for the writes of a replaced version still "
                          "leased");
        ck_assert_msg(w2, "dlx_close did not wait for the writes of an unpublished version still "
                          "leased");
        DLXV(t1->deleter(t1));
        DLXV(t2->deleter(t2));
        DLXV(dlx_close(q));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * dlx_publish: a persistent version waits "on the host instead (cuStreamSynchronize on that
 * stream, never a device-wide sync)": on the publish stream, even one of a non-primary
 * context or of another device.
 */
START_TEST(attack_persistent_publish_syncs_its_stream)
{
        static const CUstream streams[] = {X_STREAM, D1_STREAM};
        dlx_client *c;
        pid_t me = getpid();

        two_devices_and_own_context();
        c = fx_connect(&fx, "persist-streams");
        for (int i = 0; i < 2; i++) {
                struct dlx_publish_options o = {
                        .copy = DLX_COPY_NEVER, .persist = true, .stream = streams[i]};
                DLManagedTensorVersioned *t = alloc_on(c, kDLCUDA, VMM_LEN);
                char name[32];
                size_t start;
                int err;

                ck_assert_ptr_nonnull(t);
                snprintf(name, sizeof(name), "pst/%d", i);
                start = log_now();
                err = DLX(dlx_publish(c, name, t, &o, NULL));
                ck_assert_msg(err == 0, "persistent publish on stream %p: %s (%s)",
                              (void *)streams[i], dlx_strerror(err), dlx_last_error());
                ck_assert_msg(QFIND(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me,
                                    .by_stream = true, .stream = S(streams[i]), .from = start) >= 0,
                              "a persistent publish on stream %p did not synchronize it",
                              (void *)streams[i]);
        }
        DLXV(dlx_close(c));
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * After its producer's client closed (the process alive; dlx_close waited for the writes),
 * dlx_tensor_wait has nothing to wait for: -ESRCH is "the producer's event is gone with its
 * process: whether its writes were done is unknown", and neither holds. dlx_tensor_sync and
 * the release still work once the consumer's own client is closed too.
 */
static int closing_producer(void *arg)
{
        struct chan *ch = arg;
        dlx_client *c;
        CUdeviceptr x;
        uint64_t go;
        int err;

        c = child_start(ch, false, "closing-producer", P_STREAM);
        CHECK(c, "start");
        x = cuda_fake_malloc(IPC_SIZE);
        CHECK(x, "malloc");
        fill((void *)(uintptr_t)x, IPC_LEN, 17);
        err = DLX(dlx_publish(c, "cl/t", dev_tensor(kDLCUDA, x, IPC_LEN, 0, 0), NULL, NULL));
        CHECK(err == 0, "publish: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(c_tell(ch, 1) == 0 && c_hear(ch, &go) == 0, "no close order");
        DLXV(dlx_close(c));
        CHECK(c_tell(ch, 2) == 0 && c_hear(ch, &go) == 0, "no end");
        return 0;
}

START_TEST(attack_wait_after_producer_closed)
{
        DLManagedTensorVersioned *t;
        char bad[2048] = "";
        struct chan ch;
        dlx_client *c;
        size_t mark;
        pid_t pid, me = getpid();
        int err;

        pid = spawn_on(&ch, closing_producer, &ch);
        ck_assert_uint_eq(hear(&ch), 1);
        c = fx_connect(&fx, "after-close-consumer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, C_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_acquire(c, "cl/t", NULL, &t)), 0);
        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 2); /* its client closed (confirmed), the process alive */
        ck_assert_int_eq(DLX(dlx_ping(c)), 0); /* whatever the daemon said of it is read */
        err = DLX(dlx_tensor_wait(t, 0));
        if (err != 0)
                snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad),
                         "\n  dlx_tensor_wait, the producer's client closed (its writes waited "
                         "for), its process alive: %s (%s)",
                         dlx_strerror(err), dlx_last_error());
        /* a stream of this process, live: only the producer's event is gone */
        err = DLX(dlx_tensor_sync(t, C2_STREAM));
        if (err != 0)
                snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad),
                         "\n  dlx_tensor_sync(a live stream), the producer's client closed: %s "
                         "(%s)",
                         dlx_strerror(err), dlx_last_error());
        DLXV(dlx_close(c));
        err = DLX(dlx_tensor_sync(t, W_STREAM));
        if (err != 0)
                snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad),
                         "\n  dlx_tensor_sync(a live stream) after the consumer's dlx_close "
                         "too: %s (%s)",
                         dlx_strerror(err), dlx_last_error());
        mark = log_now();
        DLXV(t->deleter(t));
        if (err == 0 && recorded_event(me, W_STREAM, mark, 0) == 0 &&
            QFIND(.op = CUDA_FAKE_STREAM_SYNCHRONIZE, .pid = me, .by_stream = true,
                  .stream = S(W_STREAM), .from = mark) < 0)
                snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad),
                         "\n  the release did not join the stream synced after close");
        tell(&ch, 2);
        reap(pid, "producer");
        chan_close(&ch);
        assert_nothing_live("after close");
        ck_assert_msg(!bad[0], "after the producer's dlx_close:%s", bad);
}
END_TEST

/* dlx_publish: "-ENOTSUP a device dlx cannot share ..., DLX_COPY_ALWAYS for a CUDA tensor". */
START_TEST(attack_publish_refusals)
{
        struct dlx_publish_options always = {.copy = DLX_COPY_ALWAYS};
        DLManagedTensorVersioned *t;
        dlx_client *c;
        CUdeviceptr x, m;
        int err;

        x = cuda_fake_malloc(IPC_SIZE);
        m = cuda_fake_malloc_kind(IPC_SIZE, CUDA_FAKE_MEMORY_MANAGED);
        ck_assert(x && m);
        c = fx_connect(&fx, "refusals");
        err = DLX(dlx_publish(c, "ref/always", dev_tensor(kDLCUDA, x, 4096, 0, 0), &always, NULL));
        ck_assert_msg(err == -ENOTSUP, "DLX_COPY_ALWAYS of a CUDA tensor: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(runs(0), 1);
        t = dev_tensor(kDLCUDAManaged, m, 4096, 1, 0);
        err = DLX(dlx_publish(c, "ref/managed-type", t, NULL, NULL));
        ck_assert_msg(err == -ENOTSUP, "a kDLCUDAManaged tensor: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_int_eq(runs(1), 1);
        t = dev_tensor(kDLCUDA, x, 4096, 2, 0);
        t->dl_tensor.device.device_id = -1;
        err = DLX(dlx_publish(c, "ref/negative-device", t, NULL, NULL));
        ck_assert_msg(err == -EINVAL || err == -ENODEV, "device_id -1: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_int_eq(runs(2), 1);
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(x), CUDA_SUCCESS);
        ck_assert_int_eq(cuda_fake_free(m), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * Issue 4: "Waiting on a destroyed or dead peer's IPC event is undefined and can hang a
 * stream for ever". After the producer is killed (its work done), dlx_tensor_sync with a live
 * stream must not queue a wait on its dead event; dlx_tensor_sync's "-EINVAL (not an acquired
 * tensor, or not a live CUDA stream)" does not describe this case.
 */
START_TEST(attack_sync_after_producer_killed)
{
        DLManagedTensorVersioned *t;
        struct chan ch;
        dlx_client *c;
        uint64_t ev;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, killed_producer, &ch);
        ev = hear(&ch);
        ck_assert(ev != 0);
        c = fx_connect(&fx, "sync-after-kill");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, C_STREAM)), 0);
        ck_assert_int_eq(DLX(dlx_acquire(c, "kill/t", NULL, &t)), 0);
        kill(pid, SIGKILL);
        ck_assert_int_eq(fx_wait(pid), 128 + SIGKILL);
        ck_assert_int_eq(DLX(dlx_ping(c)), 0);
        err = DLX(dlx_tensor_sync(t, C2_STREAM));
        ck_assert_msg(err != -EINVAL,
                      "dlx_tensor_sync(a live stream) after the producer was killed: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        DLXV(t->deleter(t));
        DLXV(dlx_close(c));
        chan_close(&ch);
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/* DLX_CUDA_ONLY=<test name> runs one test, every row of a table test (for debugging). */
/* =============================================================================================
 * Device groups (protocol 1.4): kDLCUDA members travel as one memory, a VMM segment or one
 * allocation's IPC handle, with their table beside it and one event; members in several
 * allocations are copied once on the device, in stream order.
 */

#define DG_LEN 4096
#define DG_GAP 64

/* Members "a" (seed 30), "b" tied to it, and "c" (seed 31) at c_off from a; slots 1-3. */
static void dgroup_members(struct dlx_member *ms, CUdeviceptr a, CUdeviceptr c, int slot0)
{
        ms[0] = (struct dlx_member){"a", dev_tensor(kDLCUDA, a, DG_LEN, slot0, 0)};
        ms[1] = (struct dlx_member){"b", dev_tensor(kDLCUDA, a, DG_LEN, slot0 + 1, 0)};
        ms[2] = (struct dlx_member){"c", dev_tensor(kDLCUDA, c, DG_LEN, slot0 + 2, 0)};
}

static int dgroup_consumer(void *arg)
{
        struct chan *ch = arg;
        const char *want = sh->group_ipc ? "cuda-ipc" : "cuda-vmm";
        enum cuda_fake_op open_op = sh->group_ipc ? CUDA_FAKE_IPC_OPEN_MEM_HANDLE
                                                  : CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE;
        pid_t me = getpid(), producer = (pid_t)sh->producer_pid;
        DLManagedTensorVersioned *t = NULL;
        dlx_group *g = NULL, *g2 = NULL;
        size_t before, after;
        uint64_t go, ev;
        dlx_client *c;
        int err;

        c = child_start(ch, true, "dgroup-consumer", C_STREAM);
        CHECK(c, "start");
        before = log_now();
        err = DLX(dlx_acquire_group(c, "dg", NULL, 0, NULL, &g));
        after = log_now();
        CHECK(err == 0, "acquire group: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(dlx_group_count(g) == 3, "%zu members", dlx_group_count(g));
        for (size_t i = 0; i < 3; i++) {
                const DLTensor *m = dlx_group_tensor(g, i);
                CHECK(m->device.device_type == kDLCUDA && m->device.device_id == 0,
                      "member %zu on %d:%d", i, (int)m->device.device_type,
                      (int)m->device.device_id);
                CHECK(m->ndim == 1 && m->shape[0] == DG_LEN, "member %zu's shape", i);
        }
        CHECK(strcmp(dlx_group_name(g, 1), "b") == 0, "member 1 is %s", dlx_group_name(g, 1));
        CHECK(dlx_group_tensor(g, 0)->data == dlx_group_tensor(g, 1)->data,
              "tied members came apart");
        CHECK(same(dlx_group_tensor(g, 0)->data, DG_LEN, 30), "a's bytes");
        CHECK(same(dlx_group_tensor(g, 2)->data, DG_LEN, 31), "c's bytes");
        CHECK(QCOUNT(.op = open_op, .pid = me) == 1, "%d opens of the group's memory",
              QCOUNT(.op = open_op, .pid = me));
        /* one wait, on the consumer's stream, for the producer's one event, before it returns */
        ev = recorded_event(producer, P_STREAM, sh->publish_log, 0);
        CHECK(ev != 0, "the producer recorded no event");
        CHECK(QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .from = before, .to = after) ==
                      1,
              "%d stream waits in a group acquire",
              QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .from = before, .to = after));
        CHECK(QFIND(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .event = ev, .by_stream = true,
                    .stream = S(C_STREAM), .from = before, .to = after) >= 0,
              "stream C did not wait for the producer's event");

        err = DLX(dlx_group_take(g, 2, &t));
        CHECK(err == 0, "take: %s", dlx_strerror(err));
        CHECK(strcmp(storage_of(t), want) == 0, "a member's storage is %s", storage_of(t));
        CHECK(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, "a member is not read-only");
        CHECK(t->dl_tensor.data == dlx_group_tensor(g, 2)->data, "a taken member moved");
        /* a member used on another stream: it waits for the producer too, and the release for it */
        CHECK(!cuda_fake_waited(C2_STREAM, ev), "stream C2 waited before it was asked to");
        err = DLX(dlx_tensor_sync(t, C2_STREAM));
        CHECK(err == 0, "sync a member: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(cuda_fake_waited(C2_STREAM, ev),
              "a member synced to stream C2 did not make it wait for the producer's event");
        err = DLX(dlx_tensor_wait(t, 1000));
        CHECK(err == 0, "wait for a member's producer: %s (%s)", dlx_strerror(err),
              dlx_last_error());

        /* again: the session holds the table and the memory, nothing is opened twice */
        err = DLX(dlx_acquire_group(c, "dg", NULL, 0, NULL, &g2));
        CHECK(err == 0, "acquire group again: %s (%s)", dlx_strerror(err), dlx_last_error());
        CHECK(dlx_group_tensor(g2, 2)->data == dlx_group_tensor(g, 2)->data, "mapped twice");
        CHECK(QCOUNT(.op = open_op, .pid = me) == 1, "the memory was opened again");
        dlx_group_release(g2);

        before = log_now();
        dlx_group_release(g);
        CHECK(same(t->dl_tensor.data, DG_LEN, 31), "a taken member lost its bytes");
        DLXV(t->deleter(t));
        CHECK(QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .by_stream = true,
                     .stream = S(C_STREAM), .from = before) == 1,
              "%d release events recorded on stream C",
              QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .by_stream = true,
                     .stream = S(C_STREAM), .from = before));
        CHECK(QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .by_stream = true,
                     .stream = S(C2_STREAM), .from = before) == 1,
              "the release did not join stream C2, which a member was synced to");
        /* the release events must outlive the producer's wait on them */
        CHECK(c_tell(ch, 1) == 0, "tell");
        CHECK(c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

/* The parent's part: members published (the caller checked how), then read and released. */
static void dgroup_share(dlx_client *c, pid_t consumer, struct chan *ch, uint64_t version)
{
        struct dlx_info info;

        ck_assert_int_eq(DLX(dlx_stat(c, "dg", &info)), 0);
        ck_assert_uint_eq(info.members, 3);
        ck_assert_str_eq(info.storage, sh->group_ipc ? "cuda-ipc" : "cuda-vmm");
        tell(ch, 1);
        ck_assert_uint_eq(hear(ch), 1);
        unpublish_wait(c, "dg", version);
        ck_assert_msg(cuda_fake_waited(P_STREAM, recorded_event(consumer, C_STREAM, 0, 0)),
                      "the publish stream did not wait for the reader's release event");
        tell(ch, 2);
        reap(consumer, "consumer");
}

/* Members in dlx_alloc() memory: one VMM segment, no copy, one event, deleted at release. */
START_TEST(device_group_from_one_arena)
{
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        DLManagedTensorVersioned *buf;
        struct dlx_member ms[3];
        uint64_t version = 0;
        struct chan ch;
        uint8_t *data;
        dlx_client *c;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, dgroup_consumer, &ch);
        c = fx_connect(&fx, "dgroup-producer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        buf = alloc_on(c, kDLCUDA, 2 * DG_LEN + DG_GAP);
        ck_assert_ptr_nonnull(buf);
        data = buf->dl_tensor.data;
        fill(data, DG_LEN, 30);
        fill(data + DG_LEN + DG_GAP, DG_LEN, 31);
        dgroup_members(ms, (uintptr_t)data, (uintptr_t)(data + DG_LEN + DG_GAP), 1);
        sh->producer_pid = (uint64_t)getpid();
        sh->publish_log = log_now();
        err = DLX(dlx_publish_group(c, "dg", ms, 3, &never, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert(!ms[0].tensor && !ms[1].tensor && !ms[2].tensor);
        ck_assert_int_eq(
                QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = getpid(), .from = sh->publish_log), 1);
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_MEMCPY_ASYNC, .pid = getpid()), 0);
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_IPC_GET_MEM_HANDLE, .pid = getpid()), 0);
        /* published in place: the members live until the version is released */
        ck_assert_int_eq(runs(1) + runs(2) + runs(3), 0);
        dgroup_share(c, pid, &ch, version);
        ck_assert_int_eq(runs(1), 1);
        ck_assert_int_eq(runs(2), 1);
        ck_assert_int_eq(runs(3), 1);
        DLXV(buf->deleter(buf));
        DLXV(dlx_close(c));
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/* Members in one framework allocation: its IPC handle, once, no copy. */
START_TEST(device_group_of_one_allocation)
{
        struct dlx_member ms[3];
        uint64_t version = 0;
        CUdeviceptr base;
        struct chan ch;
        dlx_client *c;
        pid_t pid;
        int err;

        sh->group_ipc = 1;
        pid = spawn_on(&ch, dgroup_consumer, &ch);
        base = cuda_fake_malloc(3 * DG_LEN);
        ck_assert(base != 0);
        c = fx_connect(&fx, "dgroup-producer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        fill((void *)(uintptr_t)(base + DG_LEN), DG_LEN, 30);
        fill((void *)(uintptr_t)(base + 2 * DG_LEN), DG_LEN, 31);
        dgroup_members(ms, base + DG_LEN, base + 2 * DG_LEN, 1);
        sh->producer_pid = (uint64_t)getpid();
        sh->publish_log = log_now();
        err = DLX(dlx_publish_group(c, "dg", ms, 3, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_IPC_GET_MEM_HANDLE, .pid = getpid()), 1);
        ck_assert_msg(QFIND(.op = CUDA_FAKE_IPC_GET_MEM_HANDLE, .pid = getpid(),
                            .ptr = (uint64_t)base) >= 0,
                      "the handle is not the allocation's");
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_MEMCPY_ASYNC, .pid = getpid()), 0);
        ck_assert_int_eq(
                QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = getpid(), .from = sh->publish_log), 1);
        ck_assert_int_eq(runs(1) + runs(2) + runs(3), 0);
        dgroup_share(c, pid, &ch, version);
        ck_assert_int_eq(runs(1) + runs(2) + runs(3), 3);
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(base), CUDA_SUCCESS);
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/*
 * Members in two allocations: refused with DLX_COPY_NEVER (every member
 * deleted); else copied once into dlx_alloc() memory, a copy per run of
 * bytes, in order on the producer's stream, which is waited for: the
 * originals go before the publish returns. The tied members stay tied.
 */
START_TEST(device_group_copied_once)
{
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        struct dlx_member ms[3];
        uint64_t version = 0;
        CUdeviceptr a, b;
        struct chan ch;
        size_t at;
        dlx_client *c;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, dgroup_consumer, &ch);
        a = cuda_fake_malloc(DG_LEN);
        b = cuda_fake_malloc(DG_LEN);
        ck_assert(a && b);
        c = fx_connect(&fx, "dgroup-producer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        fill((void *)(uintptr_t)a, DG_LEN, 30);
        fill((void *)(uintptr_t)b, DG_LEN, 31);
        dgroup_members(ms, a, b, 4);
        err = DLX(dlx_publish_group(c, "dg", ms, 3, &never, NULL));
        ck_assert_int_eq(err, -EXDEV);
        ck_assert_int_eq(runs(4) + runs(5) + runs(6), 3);
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_MEMCPY_ASYNC, .pid = getpid()), 0);

        dgroup_members(ms, a, b, 1);
        sh->producer_pid = (uint64_t)getpid();
        sh->publish_log = at = log_now();
        err = DLX(dlx_publish_group(c, "dg", ms, 3, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        /* a copy per run of bytes: one, where the two allocations happen to touch */
        int copies = QCOUNT(.op = CUDA_FAKE_MEMCPY_ASYNC, .pid = getpid(), .by_stream = true,
                            .stream = S(P_STREAM), .from = at);
        ck_assert_msg(copies == (b == a + DG_LEN || a == b + DG_LEN ? 1 : 2),
                      "%d copies for two runs of bytes", copies);
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_MEMCPY_ASYNC, .pid = getpid()), copies);
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_IPC_GET_MEM_HANDLE, .pid = getpid()), 0);
        ck_assert_int_eq(QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = getpid(), .from = at), 1);
        /* the copies were waited for: the originals went before the publish returned */
        ck_assert_int_eq(runs(1) + runs(2) + runs(3), 3);
        ck_assert_int_eq(cuda_fake_free(a), CUDA_SUCCESS);
        ck_assert_int_eq(cuda_fake_free(b), CUDA_SUCCESS);
        dgroup_share(c, pid, &ch, version);
        DLXV(dlx_close(c));
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/* What a device group cannot be: every member deleted, nothing published, nothing live. */
START_TEST(device_group_refusals)
{
        struct dlx_publish_options writable = {.writable = true};
        CUdeviceptr a = cuda_fake_malloc(DG_LEN);
        uint8_t host[DG_LEN];
        struct dlx_member ms[3];
        struct dlx_info info;
        dlx_client *c;

        ck_assert(a != 0);
        c = fx_connect(&fx, "dgroup-producer");
        dgroup_members(ms, a, a, 1);
        ms[2].tensor->dl_tensor.device.device_type = kDLCPU;
        ms[2].tensor->dl_tensor.data = host;
        ck_assert_int_eq(DLX(dlx_publish_group(c, "dg", ms, 3, NULL, NULL)), -ENOTSUP);
        ck_assert_msg(strstr(dlx_last_error(), "one device"), "%s", dlx_last_error());
        ck_assert_int_eq(runs(1) + runs(2) + runs(3), 3);
        dgroup_members(ms, a, a, 4);
        ck_assert_int_eq(DLX(dlx_publish_group(c, "dg", ms, 3, &writable, NULL)), -ENOTSUP);
        ck_assert_int_eq(runs(4) + runs(5) + runs(6), 3);
        ck_assert_int_eq(DLX(dlx_stat(c, "dg", &info)), -ENOENT);
        DLXV(dlx_close(c));
        ck_assert_int_eq(cuda_fake_free(a), CUDA_SUCCESS);
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/* =============================================================================================
 * device-group attacks: a second reader's attacks on device groups (protocol 1.4) through libdlx,
 * each test named after the promise it checks. Producer and consumer are two clients of this
 * process (an own-process acquire), so the fake's memory is read directly.
 */

/* dlx_stat()'s lease count of name through c, or -1. */
static long rdg_leases(dlx_client *c, const char *name)
{
        struct dlx_info info;

        return DLX(dlx_stat(c, name, &info)) == 0 ? (long)info.leases : -1;
}

/* Members of one dlx_alloc() buffer, each with a byte_offset: read at data + byte_offset. */
START_TEST(rdg_byte_offset_members_read_where_they_point)
{
        DLManagedTensorVersioned *buf;
        struct dlx_member ms[2];
        uint64_t version = 0;
        dlx_group *g = NULL;
        dlx_client *p, *q;
        uint8_t *data;
        int err;

        p = fx_connect(&fx, "rdg-producer");
        q = fx_connect(&fx, "rdg-consumer");
        buf = alloc_on(p, kDLCUDA, 3 * DG_LEN);
        ck_assert_ptr_nonnull(buf);
        data = buf->dl_tensor.data;
        fill(data + DG_LEN, DG_LEN, 40);
        fill(data + 2 * DG_LEN, DG_LEN, 41);
        ms[0] = (struct dlx_member){"a", dev_tensor(kDLCUDA, (uintptr_t)data, DG_LEN, 1, 0)};
        ms[0].tensor->dl_tensor.byte_offset = DG_LEN;
        ms[1] = (struct dlx_member){"c",
                                    dev_tensor(kDLCUDA, (uintptr_t)(data + DG_LEN), DG_LEN, 2, 0)};
        ms[1].tensor->dl_tensor.byte_offset = DG_LEN;
        err = DLX(dlx_publish_group(p, "dg", ms, 2, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_acquire_group(q, "dg", NULL, 0, NULL, &g));
        ck_assert_msg(err == 0, "acquire group: %s (%s)", dlx_strerror(err), dlx_last_error());
        for (size_t i = 0; i < 2; i++) {
                const DLTensor *m = dlx_group_tensor(g, i);
                ck_assert_uint_eq(m->byte_offset, DG_LEN);
                ck_assert_msg(same((const uint8_t *)m->data + m->byte_offset, DG_LEN, 40 + (int)i),
                              "member %zu: not its bytes at data + byte_offset", i);
        }
        dlx_group_release(g);
        unpublish_wait(p, "dg", version);
        ck_assert_int_eq(runs(1), 1);
        ck_assert_int_eq(runs(2), 1);
        DLXV(buf->deleter(buf));
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/* Copied members with a byte_offset: the copy keeps what data + byte_offset points to. */
START_TEST(rdg_copied_byte_offset_members_keep_their_bytes)
{
        CUdeviceptr a = cuda_fake_malloc(2 * DG_LEN), b = cuda_fake_malloc(2 * DG_LEN);
        struct dlx_member ms[2];
        uint64_t version = 0;
        dlx_group *g = NULL;
        dlx_client *p, *q;
        int err;

        ck_assert(a && b);
        p = fx_connect(&fx, "rdg-producer");
        q = fx_connect(&fx, "rdg-consumer");
        fill((void *)(uintptr_t)(a + 100), DG_LEN, 42);
        fill((void *)(uintptr_t)(b + 200), DG_LEN, 43);
        ms[0] = (struct dlx_member){"a", dev_tensor(kDLCUDA, a, DG_LEN, 1, 0)};
        ms[0].tensor->dl_tensor.byte_offset = 100;
        ms[1] = (struct dlx_member){"b", dev_tensor(kDLCUDA, b, DG_LEN, 2, 0)};
        ms[1].tensor->dl_tensor.byte_offset = 200;
        err = DLX(dlx_publish_group(p, "dg", ms, 2, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(runs(1) + runs(2), 2);
        /* the originals may go: they were copied */
        memset((void *)(uintptr_t)a, 0, 2 * DG_LEN);
        memset((void *)(uintptr_t)b, 0, 2 * DG_LEN);
        ck_assert_int_eq(cuda_fake_free(a), CUDA_SUCCESS);
        ck_assert_int_eq(cuda_fake_free(b), CUDA_SUCCESS);
        err = DLX(dlx_acquire_group(q, "dg", NULL, 0, NULL, &g));
        ck_assert_msg(err == 0, "acquire group: %s (%s)", dlx_strerror(err), dlx_last_error());
        for (size_t i = 0; i < 2; i++) {
                const DLTensor *m = dlx_group_tensor(g, i);
                ck_assert_msg(same((const uint8_t *)m->data + m->byte_offset, DG_LEN, 42 + (int)i),
                              "copied member %zu: not its bytes at data + byte_offset %llu", i,
                              (unsigned long long)m->byte_offset);
        }
        dlx_group_release(g);
        unpublish_wait(p, "dg", version);
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/* A view of a member (b inside a) in one allocation, c in another: copied, b stays inside a. */
START_TEST(rdg_copied_views_keep_their_distance)
{
        CUdeviceptr a = cuda_fake_malloc(DG_LEN), c = cuda_fake_malloc(DG_LEN);
        struct dlx_member ms[3];
        uint64_t version = 0;
        dlx_group *g = NULL;
        dlx_client *p, *q;
        int err;

        ck_assert(a && c);
        p = fx_connect(&fx, "rdg-producer");
        q = fx_connect(&fx, "rdg-consumer");
        fill((void *)(uintptr_t)a, DG_LEN, 44);
        fill((void *)(uintptr_t)c, DG_LEN, 45);
        ms[0] = (struct dlx_member){"a", dev_tensor(kDLCUDA, a, DG_LEN, 1, 0)};
        ms[1] = (struct dlx_member){"b", dev_tensor(kDLCUDA, a + 1000, 1000, 2, 0)};
        ms[2] = (struct dlx_member){"c", dev_tensor(kDLCUDA, c, DG_LEN, 3, 0)};
        err = DLX(dlx_publish_group(p, "dg", ms, 3, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(runs(1) + runs(2) + runs(3), 3);
        ck_assert_int_eq(cuda_fake_free(a), CUDA_SUCCESS);
        ck_assert_int_eq(cuda_fake_free(c), CUDA_SUCCESS);
        err = DLX(dlx_acquire_group(q, "dg", NULL, 0, NULL, &g));
        ck_assert_msg(err == 0, "acquire group: %s (%s)", dlx_strerror(err), dlx_last_error());
        const uint8_t *ga = dlx_group_tensor(g, 0)->data, *gb = dlx_group_tensor(g, 1)->data;
        ck_assert_msg(gb == ga + 1000, "a view 1000 bytes into its base came %td bytes from it",
                      gb - ga);
        ck_assert(same(ga, DG_LEN, 44));
        ck_assert(same(dlx_group_tensor(g, 2)->data, DG_LEN, 45));
        dlx_group_release(g);
        unpublish_wait(p, "dg", version);
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/* A group of zero-element members only, in one dlx_alloc() buffer: published, acquired, empty. */
START_TEST(rdg_empty_members_only)
{
        DLManagedTensorVersioned *buf;
        struct dlx_member ms[2];
        uint64_t version = 0;
        dlx_group *g = NULL;
        dlx_client *p, *q;
        uint8_t *data;
        int err;

        p = fx_connect(&fx, "rdg-producer");
        q = fx_connect(&fx, "rdg-consumer");
        buf = alloc_on(p, kDLCUDA, DG_LEN);
        ck_assert_ptr_nonnull(buf);
        data = buf->dl_tensor.data;
        ms[0] = (struct dlx_member){"a", dev_tensor(kDLCUDA, (uintptr_t)data, 0, 1, 0)};
        ms[1] = (struct dlx_member){"b", dev_tensor(kDLCUDA, (uintptr_t)(data + 64), 0, 2, 0)};
        err = DLX(dlx_publish_group(p, "dg", ms, 2, NULL, &version));
        if (err != 0) {
                ck_assert_int_eq(runs(1) + runs(2), 2);
                ck_abort_msg("a device group of empty members: %s (%s)", dlx_strerror(err),
                             dlx_last_error());
        }
        err = DLX(dlx_acquire_group(q, "dg", NULL, 0, NULL, &g));
        ck_assert_msg(err == 0, "acquire group: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_uint_eq(dlx_group_count(g), 2);
        ck_assert_int_eq(dlx_group_tensor(g, 0)->shape[0], 0);
        ck_assert_int_eq(dlx_group_tensor(g, 0)->device.device_type, kDLCUDA);
        dlx_group_release(g);
        unpublish_wait(p, "dg", version);
        ck_assert_int_eq(runs(1) + runs(2), 2);
        DLXV(buf->deleter(buf));
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * A subset acquire (member_names) of a device group: those members, in that order, a name
 * twice twice; a missing name is -ENOENT and leaves no lease.
 */
START_TEST(rdg_subset_acquire)
{
        DLManagedTensorVersioned *buf;
        const char *want[] = {"c", "a", "c"}, *missing[] = {"a", "zz"};
        struct dlx_member ms[3];
        uint64_t version = 0;
        dlx_group *g = NULL;
        dlx_client *p, *q;
        uint8_t *data;
        int err;

        p = fx_connect(&fx, "rdg-producer");
        q = fx_connect(&fx, "rdg-consumer");
        buf = alloc_on(p, kDLCUDA, 2 * DG_LEN + DG_GAP);
        ck_assert_ptr_nonnull(buf);
        data = buf->dl_tensor.data;
        fill(data, DG_LEN, 30);
        fill(data + DG_LEN + DG_GAP, DG_LEN, 31);
        dgroup_members(ms, (uintptr_t)data, (uintptr_t)(data + DG_LEN + DG_GAP), 1);
        err = DLX(dlx_publish_group(p, "dg", ms, 3, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_acquire_group(q, "dg", missing, 2, NULL, &g));
        ck_assert_int_eq(err, -ENOENT);
        ck_assert_msg(strstr(dlx_last_error(), "zz"), "%s", dlx_last_error());
        /* the refused acquire's lease goes (released through the ring: give it time) */
        for (int i = 0; i < 200 && rdg_leases(p, "dg") != 0; i++)
                fx_sleep_ms(10);
        ck_assert_int_eq(rdg_leases(p, "dg"), 0);
        err = DLX(dlx_acquire_group(q, "dg", want, 3, NULL, &g));
        ck_assert_msg(err == 0, "acquire subset: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_uint_eq(dlx_group_count(g), 3);
        ck_assert_str_eq(dlx_group_name(g, 0), "c");
        ck_assert_str_eq(dlx_group_name(g, 1), "a");
        ck_assert_str_eq(dlx_group_name(g, 2), "c");
        ck_assert(same(dlx_group_tensor(g, 0)->data, DG_LEN, 31));
        ck_assert(same(dlx_group_tensor(g, 1)->data, DG_LEN, 30));
        ck_assert_ptr_eq(dlx_group_tensor(g, 0)->data, dlx_group_tensor(g, 2)->data);
        ck_assert_int_eq(dlx_group_tensor(g, 1)->device.device_type, kDLCUDA);
        ck_assert_int_eq(dlx_group_find(g, "b"), -ENOENT);
        dlx_group_release(g);
        unpublish_wait(p, "dg", version);
        ck_assert_int_eq(runs(1) + runs(2) + runs(3), 3);
        DLXV(buf->deleter(buf));
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * dlx_group_take(): the taken member keeps the group's lease after dlx_group_release() and
 * after dlx_close() of its client; its bytes stay; its deleter ends the lease, and then the
 * in-place members' deleters run once the version is released.
 */
START_TEST(rdg_taken_member_outlives_release_and_close)
{
        DLManagedTensorVersioned *buf, *t = NULL;
        struct dlx_member ms[3];
        uint64_t version = 0;
        dlx_group *g = NULL;
        dlx_client *p, *q;
        uint8_t *data;
        int err;

        p = fx_connect(&fx, "rdg-producer");
        q = fx_connect(&fx, "rdg-consumer");
        buf = alloc_on(p, kDLCUDA, 2 * DG_LEN + DG_GAP);
        ck_assert_ptr_nonnull(buf);
        data = buf->dl_tensor.data;
        fill(data, DG_LEN, 30);
        fill(data + DG_LEN + DG_GAP, DG_LEN, 31);
        dgroup_members(ms, (uintptr_t)data, (uintptr_t)(data + DG_LEN + DG_GAP), 1);
        err = DLX(dlx_publish_group(p, "dg", ms, 3, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_acquire_group(q, "dg", NULL, 0, NULL, &g));
        ck_assert_msg(err == 0, "acquire group: %s (%s)", dlx_strerror(err), dlx_last_error());
        DLXV(dlx_group_take(g, 2, &t));
        ck_assert_str_eq(storage_of(t), "cuda-vmm");
        ck_assert_uint_eq(version_of(t), version);
        dlx_group_release(g);
        DLXV(dlx_close(q));
        ck_assert_int_eq(rdg_leases(p, "dg"), 1);
        ck_assert_msg(same(t->dl_tensor.data, DG_LEN, 31), "a taken member lost its bytes");
        ck_assert_int_eq(t->dl_tensor.device.device_type, kDLCUDA);
        DLXV(dlx_unpublish(p, "dg"));
        ck_assert_int_eq(runs(1) + runs(2) + runs(3), 0);
        DLXV(t->deleter(t));
        err = DLX(dlx_wait_released(p, "dg", version, NULL, TIMEOUT_MS));
        ck_assert_msg(err == 0, "wait_released: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(runs(1), 1);
        ck_assert_int_eq(runs(2), 1);
        ck_assert_int_eq(runs(3), 1);
        DLXV(buf->deleter(buf));
        DLXV(dlx_close(p));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * Publish refusals with one tensor given under two names (tied): each deleter runs exactly
 * once on every path: -EXDEV (DLX_COPY_NEVER, two allocations), -ENOTSUP (two devices;
 * kDLCUDAHost beside kDLCUDA), -EINVAL (two members of one name).
 */
START_TEST(rdg_refusals_delete_tied_members_once)
{
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        CUdeviceptr a = cuda_fake_malloc(DG_LEN), c = cuda_fake_malloc(DG_LEN);
        DLManagedTensorVersioned *tied;
        struct dlx_member ms[3];
        dlx_client *p;
        int err;

        ck_assert(a && c);
        ck_assert_int_eq(cuda_fake_set_device_count(2), 0);
        p = fx_connect(&fx, "rdg-producer");
        for (int row = 0; row < 4; row++) {
                int s0 = 1 + 2 * row;
                const struct dlx_publish_options *o = row == 0 ? &never : NULL;
                int want = row == 0 ? -EXDEV : row == 3 ? -EINVAL : -ENOTSUP;

                tied = dev_tensor(kDLCUDA, a, DG_LEN, s0, 0);
                ms[0] = (struct dlx_member){"a", tied};
                ms[1] = (struct dlx_member){row == 3 ? "a" : "b", tied};
                ms[2] = (struct dlx_member){"c", dev_tensor(kDLCUDA, c, DG_LEN, s0 + 1, 0)};
                if (row == 1)
                        ms[2].tensor->dl_tensor.device.device_id = 1;
                if (row == 2)
                        ms[2].tensor->dl_tensor.device.device_type = kDLCUDAHost;
                err = DLX(dlx_publish_group(p, "dg", ms, 3, o, NULL));
                ck_assert_msg(err == want, "row %d: %s (%s), not %s", row, dlx_strerror(err),
                              dlx_last_error(), dlx_strerror(want));
                ck_assert_msg(runs(s0) == 1 && runs(s0 + 1) == 1,
                              "row %d: the tied tensor deleted %d times, the other %d", row,
                              runs(s0), runs(s0 + 1));
                ck_assert(!ms[0].tensor && !ms[1].tensor && !ms[2].tensor);
        }
        ck_assert_int_eq(rdg_leases(p, "dg"), -1);
        DLXV(dlx_close(p));
        ck_assert_int_eq(cuda_fake_free(a), CUDA_SUCCESS);
        ck_assert_int_eq(cuda_fake_free(c), CUDA_SUCCESS);
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * dlx_close() of the producer and of the consumer with a device group held (published in
 * place): the held group stays readable; every member's deleter runs exactly once in the end.
 */
START_TEST(rdg_close_with_device_group_held)
{
        DLManagedTensorVersioned *buf;
        struct dlx_member ms[3];
        uint64_t version = 0;
        dlx_group *g = NULL;
        dlx_client *p, *q;
        uint8_t *data;
        int err;

        p = fx_connect(&fx, "rdg-producer");
        q = fx_connect(&fx, "rdg-consumer");
        buf = alloc_on(p, kDLCUDA, 2 * DG_LEN + DG_GAP);
        ck_assert_ptr_nonnull(buf);
        data = buf->dl_tensor.data;
        fill(data, DG_LEN, 30);
        fill(data + DG_LEN + DG_GAP, DG_LEN, 31);
        dgroup_members(ms, (uintptr_t)data, (uintptr_t)(data + DG_LEN + DG_GAP), 1);
        err = DLX(dlx_publish_group(p, "dg", ms, 3, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_acquire_group(q, "dg", NULL, 0, NULL, &g));
        ck_assert_msg(err == 0, "acquire group: %s (%s)", dlx_strerror(err), dlx_last_error());
        DLXV(buf->deleter(buf));
        DLXV(dlx_close(p));
        DLXV(dlx_close(q));
        ck_assert_msg(same(dlx_group_tensor(g, 0)->data, DG_LEN, 30) &&
                              same(dlx_group_tensor(g, 2)->data, DG_LEN, 31),
                      "a held device group lost its bytes when both clients closed");
        ck_assert_int_le(runs(1) + runs(2) + runs(3), 3);
        dlx_group_release(g);
        for (int i = 0; i < 200 && runs(1) + runs(2) + runs(3) < 3; i++)
                fx_sleep_ms(10);
        ck_assert_msg(runs(1) == 1 && runs(2) == 1 && runs(3) == 1, "deleters ran %d, %d, %d times",
                      runs(1), runs(2), runs(3));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

/*
 * Acquire again after a release of the whole group: the memory is opened once per process
 * (VMM import counted), and each acquire's stream waits exactly once.
 */
static int rdg_twice_consumer(void *arg)
{
        struct chan *ch = arg;
        pid_t me = getpid();
        dlx_group *g = NULL;
        size_t before, after;
        dlx_client *c;
        int err;

        c = child_start(ch, true, "rdg-consumer", C_STREAM);
        CHECK(c, "start");
        for (int i = 0; i < 3; i++) {
                before = log_now();
                err = DLX(dlx_acquire_group(c, "dg", (const char *const[]){"c"}, 1, NULL, &g));
                after = log_now();
                CHECK(err == 0, "acquire %d: %s (%s)", i, dlx_strerror(err), dlx_last_error());
                CHECK(same(dlx_group_tensor(g, 0)->data, DG_LEN, 31), "acquire %d: c's bytes", i);
                CHECK(QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .from = before,
                             .to = after) == 1,
                      "acquire %d: %d stream waits", i,
                      QCOUNT(.op = CUDA_FAKE_STREAM_WAIT_EVENT, .pid = me, .from = before,
                             .to = after));
                before = log_now();
                dlx_group_release(g);
                CHECK(QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .from = before) == 1,
                      "release %d: %d events recorded", i,
                      QCOUNT(.op = CUDA_FAKE_EVENT_RECORD, .pid = me, .from = before));
        }
        CHECK(QCOUNT(.op = CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, .pid = me) <= 1,
              "the group's memory was imported %d times",
              QCOUNT(.op = CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, .pid = me));
        CHECK(c_tell(ch, 1) == 0, "tell");
        uint64_t go;
        CHECK(c_hear(ch, &go) == 0, "no end");
        DLXV(dlx_close(c));
        return child_done("consumer", true);
}

START_TEST(rdg_subset_reacquire_opens_once_waits_once)
{
        DLManagedTensorVersioned *buf;
        struct dlx_member ms[3];
        uint64_t version = 0;
        struct chan ch;
        uint8_t *data;
        dlx_client *c;
        pid_t pid;
        int err;

        pid = spawn_on(&ch, rdg_twice_consumer, &ch);
        c = fx_connect(&fx, "rdg-producer");
        ck_assert_int_eq(DLX(dlx_set_stream(c, 0, P_STREAM)), 0);
        buf = alloc_on(c, kDLCUDA, 2 * DG_LEN + DG_GAP);
        ck_assert_ptr_nonnull(buf);
        data = buf->dl_tensor.data;
        fill(data, DG_LEN, 30);
        fill(data + DG_LEN + DG_GAP, DG_LEN, 31);
        dgroup_members(ms, (uintptr_t)data, (uintptr_t)(data + DG_LEN + DG_GAP), 1);
        err = DLX(dlx_publish_group(c, "dg", ms, 3, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        tell(&ch, 1);
        ck_assert_uint_eq(hear(&ch), 1);
        unpublish_wait(c, "dg", version);
        tell(&ch, 2);
        reap(pid, "consumer");
        DLXV(buf->deleter(buf));
        DLXV(dlx_close(c));
        assert_nothing_live("producer after close");
        ck_assert_int_eq(ctx_bad, 0);
        chan_close(&ch);
}
END_TEST

/*
 * fork() after a group acquire: in the child, dlx_group_release() frees only the child's copy
 * (the parent's lease stays, its bytes stay readable); the parent's release then ends it.
 */
START_TEST(rdg_fork_after_acquire_keeps_the_parents_lease)
{
        DLManagedTensorVersioned *buf;
        struct dlx_member ms[3];
        uint64_t version = 0;
        dlx_group *g = NULL;
        dlx_client *p, *q;
        uint8_t *data;
        pid_t pid;
        int err;

        p = fx_connect(&fx, "rdg-producer");
        q = fx_connect(&fx, "rdg-consumer");
        buf = alloc_on(p, kDLCUDA, 2 * DG_LEN + DG_GAP);
        ck_assert_ptr_nonnull(buf);
        data = buf->dl_tensor.data;
        fill(data, DG_LEN, 30);
        fill(data + DG_LEN + DG_GAP, DG_LEN, 31);
        dgroup_members(ms, (uintptr_t)data, (uintptr_t)(data + DG_LEN + DG_GAP), 1);
        err = DLX(dlx_publish_group(p, "dg", ms, 3, NULL, &version));
        ck_assert_msg(err == 0, "publish group: %s (%s)", dlx_strerror(err), dlx_last_error());
        err = DLX(dlx_acquire_group(q, "dg", NULL, 0, NULL, &g));
        ck_assert_msg(err == 0, "acquire group: %s (%s)", dlx_strerror(err), dlx_last_error());
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                dlx_group *g2 = NULL;
                int e = dlx_acquire_group(q, "dg", NULL, 0, NULL, &g2);

                dlx_group_release(g);
                dlx_close(q);
                dlx_close(p);
                fx_child_exit(e == -ESTALE ? 0 : 1);
        }
        ck_assert_msg(fx_wait(pid) == 0, "a forked child's acquire on the parent's client "
                                         "was not -ESTALE");
        fx_sleep_ms(100);
        ck_assert_int_eq(rdg_leases(p, "dg"), 1);
        ck_assert(same(dlx_group_tensor(g, 2)->data, DG_LEN, 31));
        dlx_group_release(g);
        for (int i = 0; i < 200 && rdg_leases(p, "dg") != 0; i++)
                fx_sleep_ms(10);
        ck_assert_int_eq(rdg_leases(p, "dg"), 0);
        unpublish_wait(p, "dg", version);
        ck_assert_int_eq(runs(1) + runs(2) + runs(3), 3);
        DLXV(buf->deleter(buf));
        DLXV(dlx_close(q));
        DLXV(dlx_close(p));
        assert_nothing_live("after close");
        ck_assert_int_eq(ctx_bad, 0);
}
END_TEST

static void add_loop(TCase *tc, const TTest *t, int rows)
{
        const char *only = getenv("DLX_CUDA_ONLY");

        if (!only || !*only || strcmp(only, t->name) == 0)
                tcase_add_loop_test(tc, t, 0, rows);
}

#define add(tc, t) add_loop((tc), (t), 1)
#define add_rows(tc, t, rows) add_loop((tc), (t), (int)N_ELEMS(rows))

Suite *cuda_double_suite(void)
{
        Suite *s = suite_create("cuda-double");
        TCase *tc = tcase_create("fake-driver");

        tcase_add_checked_fixture(tc, cuda_setup, cuda_teardown);
        tcase_set_timeout(tc, 120);
        add(tc, ipc_publish_acquire);
        add(tc, ipc_handle_cache);
        add(tc, ipc_deferred_close_done_by_close);
        add(tc, release_fence);
        add(tc, wait_released_after_reader_exit);
        add(tc, publish_event_pool);
        add(tc, kill9_consumer_releases);
        add(tc, vmm_alloc_share);
        add(tc, vmm_persist_outlives_producer);
        add(tc, vmm_only_driver_exports);
        add(tc, cuda_host_share);
        add(tc, no_driver);
        add(tc, fork_after_cuda);
        add(tc, faults_publish);
        add(tc, faults_acquire_ipc);
        add(tc, faults_vmm_alloc);
        add_rows(tc, faults_vmm_import, import_faults);
        add(tc, close_with_published_cuda_tensors);
        add(tc, own_process_acquire);
        add(tc, exchange_current_stream);
        add(tc, streams_of_other_contexts);
        add(tc, ipc_closed_in_its_context);
        add(tc, cuda_host_ordered_like_device_memory);
        add(tc, interprocess_events_bounded);
        add(tc, close_waits_for_published_writes);
        add(tc, unmap_waits_for_queued_work);
        add(tc, devices_by_uuid);
        add(tc, ipc_refused_across_pid_namespaces);
        add(tc, framework_memory);
        add(tc, read_only_vmm_where_granted);
        add(tc, consumer_way_out_of_a_killed_producer);
        add(tc, device_group_from_one_arena);
        add(tc, device_group_of_one_allocation);
        add(tc, device_group_copied_once);
        add(tc, device_group_refusals);
        suite_add_tcase(s, tc);

        /* reader13: a second reader's attacks on the CUDA promises */
        tc = tcase_create("reader13-attacks");
        tcase_add_checked_fixture(tc, cuda_setup, cuda_teardown);
        tcase_set_timeout(tc, 120);
        add(tc, attack_default_stream_is_per_device);
        add(tc, attack_sync_legacy_aliases);
        add(tc, attack_sync_stream_of_own_context);
        add(tc, attack_bogus_streams);
        add(tc, attack_release_record_fails);
        add(tc, attack_write_protected_tells_the_truth);
        add(tc, attack_pidns_vmm_and_host);
        add(tc, attack_producer_exited_still_listed);
        add(tc, attack_ipc_allocation_freed);
        add(tc, attack_events_come_back_after_release);
        add(tc, attack_tensor_wait_edges);
        add(tc, attack_vmm_byte_offset_in_next_mapping);
        add(tc, attack_exchange_export_of_acquired);
        add(tc, attack_three_devices_remapped);
        add(tc, attack_streams_of_other_devices_for_publish_and_wait);
        add(tc, attack_sync_64_streams);
        add(tc, attack_events_of_an_ended_session);
        add(tc, release_events_outlive_their_client);
        add(tc, attack_reader_killed_with_release_unfinished);
        add(tc, attack_release_events_bounded);
        add(tc, attack_event_bound_is_per_process);
        add(tc, attack_close_waits_for_replaced_leased_versions);
        add(tc, attack_persistent_publish_syncs_its_stream);
        add(tc, attack_wait_after_producer_closed);
        add(tc, attack_publish_refusals);
        add(tc, attack_sync_after_producer_killed);
        suite_add_tcase(s, tc);

        /* a second reader's attacks on device groups */
        tc = tcase_create("device-group-attacks");
        tcase_add_checked_fixture(tc, cuda_setup, cuda_teardown);
        tcase_set_timeout(tc, 60);
        add(tc, rdg_byte_offset_members_read_where_they_point);
        add(tc, rdg_copied_byte_offset_members_keep_their_bytes);
        add(tc, rdg_copied_views_keep_their_distance);
        add(tc, rdg_empty_members_only);
        add(tc, rdg_subset_acquire);
        add(tc, rdg_taken_member_outlives_release_and_close);
        add(tc, rdg_refusals_delete_tied_members_once);
        add(tc, rdg_close_with_device_group_held);
        add(tc, rdg_subset_reacquire_opens_once_waits_once);
        add(tc, rdg_fork_after_acquire_keeps_the_parents_lease);
        suite_add_tcase(s, tc);
        return s;
}
