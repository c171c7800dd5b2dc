/* SPDX-License-Identifier: MIT */
/*
 * dlx-gpu-probe: five questions about NVIDIA's driver that libdlx's CUDA paths rest on, asked
 * of the real driver. tests/gpu/run.sh runs them first on a machine with a GPU
 * (docs/gpu-run.md); docs/gpu-results.md records the answers.
 *
 *   dlx-gpu-probe [all | a | b | c | d | e]...
 *
 *   a  read-only access to an imported VMM allocation: does cuMemSetAccess(PROT_READ) take on
 *      an imported handle, do reads through it work, and do writes through it fail, and how?
 *   b  a VMM allocation's fd outlives its exporter: exported, held by a CUDA-free process (as
 *      dlxd holds it), the exporter exits (or is SIGKILLed), then a third process imports it
 *      and reads the data.
 *   c  an interprocess event after its exporter destroyed it, or was SIGKILLed with work
 *      unfinished before the event (a host function blocked on a pipe, or a
 *      cuStreamWaitValue32 on memory nobody writes): what cuIpcOpenEventHandle and
 *      cuStreamWaitEvent return, and whether cuStreamSynchronize returns (10 s watchdog).
 *   d  cuIpcGetMemHandle asked twice for one allocation, and again after another allocation:
 *      byte-identical handles or not.
 *   e  an event of device 0's primary context recorded on a stream of another device, and on
 *      a stream of a non-primary context (cuCtxCreate) of device 0.
 *
 * Each probe runs in processes of its own. Neither this program nor a probe's coordinator
 * ever loads CUDA: the driver is loaded (dlopen("libcuda.so.1"), as libdlx does; nothing
 * links libcudart) only in the worker processes that use it, each forked from a CUDA-free
 * parent. A worker that does not answer in time is killed and reported "hung", and so is a
 * probe as a whole. Each probe prints one line, "probe X (what): VERDICT: observations",
 * where VERDICT is PASS or FAIL where libdlx counts on one answer, INFO where the answer is
 * only recorded, and ERROR where the probe could not set itself up; the observations are the
 * CUresult names the driver returned.
 *
 * Exit status: 0 every probe ran (whatever it found), 1 a probe could not run or hung as a
 * whole, 2 bad usage, 77 no CUDA driver or no device (nothing to probe).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the driver, loaded at run time ---------------------------------------------------- */

/* Every entry point the probes use. A member is named as cuda.h names the function after its
 * macros (cuMemcpyDtoH is cuMemcpyDtoH_v2): the same token everywhere it is used. */
#define CU_FNS(X)                                                                                  \
        X(cuInit)                                                                                  \
        X(cuDriverGetVersion)                                                                      \
        X(cuGetErrorName)                                                                          \
        X(cuDeviceGet)                                                                             \
        X(cuDeviceGetCount)                                                                        \
        X(cuDeviceGetName)                                                                         \
        X(cuDeviceGetAttribute)                                                                    \
        X(cuDevicePrimaryCtxRetain)                                                                \
        X(cuCtxSetCurrent)                                                                         \
        X(cuCtxCreate)                                                                             \
        X(cuCtxSynchronize)                                                                        \
        X(cuStreamCreate)                                                                          \
        X(cuStreamQuery)                                                                           \
        X(cuStreamSynchronize)                                                                     \
        X(cuStreamWaitEvent)                                                                       \
        X(cuStreamWaitValue32)                                                                     \
        X(cuLaunchHostFunc)                                                                        \
        X(cuEventCreate)                                                                           \
        X(cuEventRecord)                                                                           \
        X(cuEventQuery)                                                                            \
        X(cuEventSynchronize)                                                                      \
        X(cuEventDestroy)                                                                          \
        X(cuIpcGetEventHandle)                                                                     \
        X(cuIpcOpenEventHandle)                                                                    \
        X(cuIpcGetMemHandle)                                                                       \
        X(cuMemAlloc)                                                                              \
        X(cuMemGetAllocationGranularity)                                                           \
        X(cuMemCreate)                                                                             \
        X(cuMemRelease)                                                                            \
        X(cuMemExportToShareableHandle)                                                            \
        X(cuMemImportFromShareableHandle)                                                          \
        X(cuMemAddressReserve)                                                                     \
        X(cuMemAddressFree)                                                                        \
        X(cuMemMap)                                                                                \
        X(cuMemUnmap)                                                                              \
        X(cuMemSetAccess)                                                                          \
        X(cuMemcpyDtoH)                                                                            \
        X(cuMemcpyHtoD)                                                                            \
        X(cuMemsetD8)                                                                              \
        X(cuMemsetD32)

#define CU_MEMBER(f) __typeof__(&f) f;
static struct {
        CU_FNS(CU_MEMBER)
} cu;

typedef CUresult (*get_proc_fn)(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                CUdriverProcAddressQueryResult *status);

static char load_why[256];

/* By cuGetProcAddress (the ABI version of the cuda.h built against), else by the versioned
 * symbol cuda.h maps the name to. */
static void *resolve(void *lib, get_proc_fn get_proc, const char *name, const char *symbol)
{
        void *fn = NULL;

        if (get_proc) {
                CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
                if (get_proc(name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) !=
                            CUDA_SUCCESS ||
                    status != CU_GET_PROC_ADDRESS_SUCCESS)
                        fn = NULL;
        }
        return fn ? fn : dlsym(lib, symbol);
}

#define STRING(x) #x
#define EXPANDED_STRING(x) STRING(x)

/* 0 loaded and initialised; 77 no driver or no device; 1 a driver that is not usable. */
static int load_driver(void)
{
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        get_proc_fn get_proc;
        void *fn;
        CUresult r;
        const char *name = NULL;

        if (!lib) {
                const char *e = dlerror();
                snprintf(load_why, sizeof(load_why), "no CUDA driver (%s)",
                         e ? e : "libcuda.so.1 not found");
                return 77;
        }
        fn = dlsym(lib, "cuGetProcAddress_v2");
        memcpy(&get_proc, &fn, sizeof(fn));
#define CU_RESOLVE(f)                                                                              \
        fn = resolve(lib, get_proc, #f, EXPANDED_STRING(f));                                       \
        if (!fn) {                                                                                 \
                snprintf(load_why, sizeof(load_why), "the CUDA driver lacks %s", #f);              \
                return 1;                                                                          \
        }                                                                                          \
        memcpy(&cu.f, &fn, sizeof(fn));
        CU_FNS(CU_RESOLVE)
#undef CU_RESOLVE
        r = cu.cuInit(0);
        if (r != CUDA_SUCCESS) {
                cu.cuGetErrorName(r, &name);
                snprintf(load_why, sizeof(load_why), "%s (cuInit: %s)",
                         r == CUDA_ERROR_NO_DEVICE ? "no CUDA device" : "CUDA driver unusable",
                         name ? name : "?");
                return r == CUDA_ERROR_NO_DEVICE ? 77 : 1;
        }
        return 0;
}

static const char *rname(CUresult r)
{
        static char other[8][32];
        static unsigned next;
        const char *s = NULL;
        char *b;

        if (cu.cuGetErrorName && cu.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
                return s;
        b = other[next++ % 8];
        snprintf(b, sizeof(other[0]), "CUresult %d", (int)r);
        return b;
}

/* ---- workers: processes that use CUDA, and report key=value lines ---------------------- */

static int report_fd = -1;

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
        char line[512];
        va_list ap;
        int n;

        va_start(ap, fmt);
        n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
        va_end(ap);
        if (n < 0)
                return;
        if ((size_t)n > sizeof(line) - 2)
                n = sizeof(line) - 2;
        line[n++] = '\n';
        if (write(report_fd, line, (size_t)n) < 0) {
                /* the coordinator is gone: nobody to tell */
        }
}

/* A setup step that must work: on failure says fail=what: CUresult. */
static bool need(const char *what, CUresult r)
{
        if (r == CUDA_SUCCESS)
                return true;
        say("fail=%s: %s", what, rname(r));
        return false;
}

/* Loads the driver and makes device ordinal's primary context current. */
static bool cu_up(int ordinal, CUcontext *ctx)
{
        CUdevice dev;
        int st = load_driver();

        if (st) {
                say("fail=%s", load_why);
                return false;
        }
        return need("cuDeviceGet", cu.cuDeviceGet(&dev, ordinal)) &&
               need("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ctx, dev)) &&
               need("cuCtxSetCurrent", cu.cuCtxSetCurrent(*ctx));
}

struct worker {
        pid_t pid;
        int fd;      /* read end of its report pipe; -1 once closed */
        bool eof;    /* its report pipe closed (it exited, or closed it) */
        bool hung;   /* killed for not finishing in time */
        bool reaped; /* status is valid */
        int status;
        size_t len;
        char buf[8192];
};

static double now(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Forks a worker that runs fn(arg) and exits. It keeps stdin, stdout, stderr, its report
 * pipe and the descriptors in keep[] (nkeep of them), and closes the rest: a descriptor of
 * another worker's kept open here would hide that worker's end from its peers. */
static bool start(struct worker *w, void (*fn)(const void *), const void *arg, const int *keep,
                  int nkeep)
{
        int p[2];

        memset(w, 0, sizeof(*w));
        w->fd = -1;
        w->pid = -1;
        w->eof = true; /* until it runs */
        if (pipe(p) < 0)
                return false;
        fflush(NULL);
        w->pid = fork();
        if (w->pid < 0) {
                close(p[0]);
                close(p[1]);
                return false;
        }
        if (w->pid == 0) {
                for (int fd = 3; fd < 1024; fd++) {
                        bool kept = fd == p[1];
                        for (int i = 0; i < nkeep; i++)
                                kept = kept || fd == keep[i];
                        if (!kept)
                                close(fd);
                }
                report_fd = p[1];
                signal(SIGPIPE, SIG_IGN);
                alarm(120); /* the last resort, should its coordinator be gone */
                fn(arg);
                _exit(0);
        }
        close(p[1]);
        w->fd = p[0];
        w->eof = false;
        return true;
}

static bool has_key(const struct worker *w, const char *key)
{
        size_t k = strlen(key);

        for (const char *l = w->buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
                if (!strncmp(l, key, k) && l[k] == '=')
                        return true;
        return false;
}

static const char *val(const struct worker *w, const char *key);

/* Reads the worker's report until a line key=... has come (key=value if value is not NULL;
 * key NULL: until the report ends), or secs have passed. True if it came. */
static bool wait_key(struct worker *w, const char *key, const char *value, double secs)
{
        double end = now() + secs;

        for (;;) {
                struct pollfd p = {.fd = w->fd, .events = POLLIN};
                double left;
                ssize_t n;

                if (key && has_key(w, key) && (!value || !strcmp(val(w, key), value)))
                        return true;
                if (w->eof)
                        return !key;
                left = end - now();
                if (left <= 0)
                        return false;
                if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
                        continue;
                n = read(w->fd, w->buf + w->len, sizeof(w->buf) - 1 - w->len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        w->eof = true;
                        continue;
                }
                w->len += (size_t)n;
                w->buf[w->len] = '\0';
        }
}

/* Waits up to secs for the worker to finish its report; kills it if it does not (hung), and
 * reaps it (a process the driver keeps from dying is left behind after 5 s). */
static void finish(struct worker *w, double secs)
{
        double end;

        if (w->pid <= 0)
                return;
        if (!wait_key(w, NULL, NULL, secs)) {
                w->hung = true;
                kill(w->pid, SIGKILL);
        }
        end = now() + 5;
        while (!w->reaped && now() < end) {
                pid_t p = waitpid(w->pid, &w->status, WNOHANG);
                if (p == w->pid || (p < 0 && errno == ECHILD))
                        w->reaped = p == w->pid;
                if (p != 0)
                        break;
                usleep(10000);
        }
        if (w->fd >= 0)
                close(w->fd);
        w->fd = -1;
        w->pid = -1;
}

/* Every value val() handed out, kept reachable (a leak checker's view) until the run ends. */
struct kept {
        struct kept *next;
        char s[];
};
static struct kept *kept;

/* The last value reported for key, or NULL. What val() and outcome() return lives until the
 * process ends: a coordinator lives for one probe. */
static const char *val(const struct worker *w, const char *key)
{
        size_t k = strlen(key), n;
        const char *found = NULL;
        struct kept *v;

        for (const char *l = w->buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
                if (!strncmp(l, key, k) && l[k] == '=')
                        found = l + k + 1;
        if (!found)
                return NULL;
        n = strcspn(found, "\n");
        v = malloc(sizeof(*v) + n + 1);
        if (!v)
                return "(out of memory)";
        memcpy(v->s, found, n);
        v->s[n] = '\0';
        v->next = kept;
        kept = v;
        return v->s;
}

/* What the worker reported for key or, if nothing, why not. */
static const char *outcome(const struct worker *w, const char *key)
{
        const char *v = val(w, key), *stage = val(w, "stage"), *fail = val(w, "fail");
        char *o = NULL;
        int n;

        if (v)
                return v;
        if (fail)
                n = asprintf(&o, "not reached (%s)", fail);
        else if (w->hung)
                n = asprintf(&o, "hung%s%s", stage ? " in " : "", stage ? stage : "");
        else if (w->reaped && WIFSIGNALED(w->status))
                n = asprintf(&o, "crashed (signal %d)", WTERMSIG(w->status));
        else
                n = asprintf(&o, "not reached");
        return n < 0 ? "?" : o;
}

static bool is(const char *v, const char *want)
{
        return v && !strcmp(v, want);
}

/* ---- passing descriptors and bytes between processes ----------------------------------- */

static bool ready(int fd, double secs)
{
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n;

        do
                n = poll(&p, 1, (int)(secs * 1000));
        while (n < 0 && errno == EINTR);
        return n > 0;
}

static bool send_fd(int sock, int fd)
{
        char byte = 'f';
        struct iovec iov = {.iov_base = &byte, .iov_len = 1};
        union {
                struct cmsghdr h;
                char space[CMSG_SPACE(sizeof(int))];
        } c;
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = c.space,
                           .msg_controllen = sizeof(c.space)};
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);

        memset(&c, 0, sizeof(c));
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &fd, sizeof(int));
        return sendmsg(sock, &m, MSG_NOSIGNAL) == 1;
}

static int recv_fd(int sock, double secs)
{
        char byte;
        struct iovec iov = {.iov_base = &byte, .iov_len = 1};
        union {
                struct cmsghdr h;
                char space[CMSG_SPACE(sizeof(int))];
        } c;
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = c.space,
                           .msg_controllen = sizeof(c.space)};
        struct cmsghdr *h;
        int fd = -1;

        if (!ready(sock, secs) || recvmsg(sock, &m, MSG_CMSG_CLOEXEC) != 1)
                return -1;
        h = CMSG_FIRSTHDR(&m);
        if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
                memcpy(&fd, CMSG_DATA(h), sizeof(int));
        return fd;
}

static bool send_bytes(int fd, const void *p, size_t n)
{
        const char *c = p;

        while (n) {
                ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return false;
                c += k;
                n -= (size_t)k;
        }
        return true;
}

static bool recv_bytes(int fd, void *p, size_t n, double secs)
{
        char *c = p;
        double end = now() + secs;

        while (n) {
                ssize_t k;
                if (!ready(fd, end - now()))
                        return false;
                k = read(fd, c, n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return false;
                c += k;
                n -= (size_t)k;
        }
        return true;
}

/* ---- VMM helpers (in workers) ------------------------------------------------------------ */

#define PATTERN 0x5a /* what exporters write */
#define OTHER 0xa5   /* what importers try to write */
#define WORD 0xdecafbadu
#define CHUNK 65536 /* bytes read or written through an import */

static CUmemAllocationProp vmm_prop(void)
{
        CUmemAllocationProp p;

        memset(&p, 0, sizeof(p));
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = 0;
        p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        return p;
}

static CUmemAccessDesc access_desc(CUmemAccess_flags flags)
{
        CUmemAccessDesc d;

        memset(&d, 0, sizeof(d));
        d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = 0;
        d.flags = flags;
        return d;
}

/* Creates a VMM allocation of one granule on device 0, maps it read-write, exports it. */
static bool vmm_export(CUmemGenericAllocationHandle *h, size_t *size, CUdeviceptr *va, int *fd)
{
        CUmemAllocationProp prop = vmm_prop();
        CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

        return need("cuMemGetAllocationGranularity",
                    cu.cuMemGetAllocationGranularity(size, &prop,
                                                     CU_MEM_ALLOC_GRANULARITY_MINIMUM)) &&
               need("cuMemCreate", cu.cuMemCreate(h, *size, &prop, 0)) &&
               need("cuMemAddressReserve", cu.cuMemAddressReserve(va, *size, 0, 0, 0)) &&
               need("cuMemMap", cu.cuMemMap(*va, *size, 0, *h, 0)) &&
               need("cuMemSetAccess(PROT_READWRITE)", cu.cuMemSetAccess(*va, *size, &rw, 1)) &&
               need("cuMemExportToShareableHandle",
                    cu.cuMemExportToShareableHandle(fd, *h,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
}

/* Imports an exported fd and maps it (no access set yet). */
static bool vmm_import(int fd, size_t size, CUdeviceptr *va)
{
        CUmemGenericAllocationHandle h;
        CUresult r = cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

        say("import=%s", rname(r));
        return r == CUDA_SUCCESS &&
               need("cuMemAddressReserve", cu.cuMemAddressReserve(va, size, 0, 0, 0)) &&
               need("cuMemMap", cu.cuMemMap(*va, size, 0, h, 0));
}

static bool all_bytes(const unsigned char *p, size_t n, unsigned char want)
{
        for (size_t i = 0; i < n; i++)
                if (p[i] != want)
                        return false;
        return true;
}

/* ---- probe a: read-only access on an imported VMM handle --------------------------------- */

enum ro_mode { RO_READ, RO_HTOD, RO_MEMSET };

struct ro_arg {
        int fd;
        size_t size;
        enum ro_mode mode;
};

static void a_exporter(const void *arg)
{
        int sock = *(const int *)arg, fd = -1;
        CUcontext ctx;
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        size_t size;
        static unsigned char buf[CHUNK];
        char c = 0;

        if (!cu_up(0, &ctx) || !vmm_export(&h, &size, &va, &fd) ||
            !need("cuMemsetD8", cu.cuMemsetD8(va, PATTERN, size)) ||
            !need("cuCtxSynchronize", cu.cuCtxSynchronize()))
                return;
        say("size=%zu", size);
        if (!send_fd(sock, fd))
                return;
        /* after the importers: does this writable mapping see what they wrote? */
        if (!recv_bytes(sock, &c, 1, 100) || c != 'c')
                return;
        if (need("cuMemcpyDtoH", cu.cuMemcpyDtoH(buf, va, sizeof(buf))))
                say("exporter_sees=%s",
                    all_bytes(buf, sizeof(buf), PATTERN) ? "unchanged" : "changed");
        send_bytes(sock, "d", 1);
}

static void a_importer(const void *arg)
{
        const struct ro_arg *a = arg;
        static unsigned char buf[CHUNK];
        CUcontext ctx;
        CUdeviceptr va;
        CUmemAccessDesc ro = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READ);
        CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        CUresult r;

        if (!cu_up(0, &ctx) || !vmm_import(a->fd, a->size, &va))
                return;
        r = cu.cuMemSetAccess(va, a->size, &ro, 1);
        say("set_read=%s", rname(r));
        if (r != CUDA_SUCCESS) {
                if (a->mode == RO_READ)
                        say("set_rw=%s", rname(cu.cuMemSetAccess(va, a->size, &rw, 1)));
                return;
        }
        if (a->mode == RO_READ) {
                say("stage=cuMemcpyDtoH");
                r = cu.cuMemcpyDtoH(buf, va, sizeof(buf));
                say("read=%s", rname(r));
                if (r == CUDA_SUCCESS)
                        say("data=%s", all_bytes(buf, sizeof(buf), PATTERN) ? "ok" : "wrong");
                return;
        }
        memset(buf, OTHER, sizeof(buf));
        if (a->mode == RO_HTOD) {
                say("stage=cuMemcpyHtoD");
                say("write=%s", rname(cu.cuMemcpyHtoD(va, buf, sizeof(buf))));
        } else {
                say("stage=cuMemsetD8");
                say("write=%s", rname(cu.cuMemsetD8(va, OTHER, sizeof(buf))));
        }
        say("stage=cuCtxSynchronize");
        say("sync=%s", rname(cu.cuCtxSynchronize()));
        say("stage=cuMemcpyDtoH");
        r = cu.cuMemcpyDtoH(buf, va, sizeof(buf));
        say("reread=%s", rname(r));
        if (r == CUDA_SUCCESS)
                say("reread_data=%s", all_bytes(buf, sizeof(buf), PATTERN) ? "old"
                                      : all_bytes(buf, sizeof(buf), OTHER) ? "written"
                                                                           : "other");
}

static int probe_a(void)
{
        const char *title = "probe a (read-only access on an imported VMM handle)";
        struct worker e, b[3];
        struct ro_arg ra[3];
        const char *set_read, *verdict, *why, *sees;
        char c = 0;
        int sv[2], fd;
        bool writes_failed = true, written = false;

        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0 ||
            !start(&e, a_exporter, &sv[1], &sv[1], 1))
                return printf("%s: ERROR: socketpair or fork: %s\n", title, strerror(errno)), 1;
        close(sv[1]);
        fd = recv_fd(sv[0], 30);
        if (fd < 0 || !wait_key(&e, "size", NULL, 5)) {
                finish(&e, 5);
                printf("%s: ERROR: the exporter: %s\n", title, outcome(&e, "size"));
                return 1;
        }
        for (int m = RO_READ; m <= RO_MEMSET; m++) {
                ra[m] = (struct ro_arg){.fd = fd,
                                        .size = strtoull(val(&e, "size"), NULL, 10),
                                        .mode = (enum ro_mode)m};
                if (start(&b[m], a_importer, &ra[m], &fd, 1))
                        finish(&b[m], 20);
        }
        close(fd);
        if (send_bytes(sv[0], "c", 1))
                recv_bytes(sv[0], &c, 1, 20);
        finish(&e, 10);
        close(sv[0]);

        set_read = outcome(&b[RO_READ], "set_read");
        sees = outcome(&e, "exporter_sees");
        for (int m = RO_HTOD; m <= RO_MEMSET; m++) {
                writes_failed = writes_failed && !is(val(&b[m], "write"), "CUDA_SUCCESS");
                written = written || is(val(&b[m], "reread_data"), "written");
        }
        if (!is(set_read, "CUDA_SUCCESS")) {
                verdict = "FAIL";
                why = "cuMemSetAccess(PROT_READ) refused";
        } else if (!is(val(&b[RO_READ], "data"), "ok")) {
                verdict = "FAIL";
                why = "reading through it does not work";
        } else if (written || is(sees, "changed")) {
                verdict = "FAIL";
                why = "writes through it go through";
        } else if (is(sees, "unchanged")) {
                verdict = "PASS";
                why = writes_failed ? "read-only: writes fail" : "read-only: writes lost";
        } else {
                verdict = "INFO";
                why = "the exporter could not check its data";
        }
        printf("%s: %s: %s: cuMemSetAccess(PROT_READ)=%s", title, verdict, why, set_read);
        if (val(&b[RO_READ], "set_rw"))
                printf(" (PROT_READWRITE=%s)", val(&b[RO_READ], "set_rw"));
        printf("; read=%s, data %s", outcome(&b[RO_READ], "read"), outcome(&b[RO_READ], "data"));
        printf("; cuMemcpyHtoD=%s, then sync=%s, reread=%s (%s)", outcome(&b[RO_HTOD], "write"),
               outcome(&b[RO_HTOD], "sync"), outcome(&b[RO_HTOD], "reread"),
               outcome(&b[RO_HTOD], "reread_data"));
        printf("; cuMemsetD8=%s, then sync=%s, reread=%s (%s)", outcome(&b[RO_MEMSET], "write"),
               outcome(&b[RO_MEMSET], "sync"), outcome(&b[RO_MEMSET], "reread"),
               outcome(&b[RO_MEMSET], "reread_data"));
        printf("; the exporter's own mapping: %s\n", sees);
        return 0;
}

/* ---- probe b: the fd outlives its exporter ----------------------------------------------- */

struct b_arg {
        int sock;
        bool killed; /* wait to be killed instead of exiting */
        int fd;
        size_t size;
};

static void b_exporter(const void *arg)
{
        const struct b_arg *a = arg;
        CUcontext ctx;
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        size_t size;
        int fd = -1;
        char c;

        if (!cu_up(0, &ctx) || !vmm_export(&h, &size, &va, &fd) ||
            !need("cuMemsetD32", cu.cuMemsetD32(va, WORD, size / 4)) ||
            !need("cuCtxSynchronize", cu.cuCtxSynchronize()))
                return;
        say("size=%zu", size);
        if (!send_fd(a->sock, fd))
                return;
        close(fd);
        if (a->killed) {
                say("waiting=1");
                recv_bytes(a->sock, &c, 1, 100);
                return;
        }
        say("unmap=%s", rname(cu.cuMemUnmap(va, size)));
        say("release=%s", rname(cu.cuMemRelease(h)));
        say("exiting=1");
}

static void b_reader(const void *arg)
{
        const struct b_arg *a = arg;
        CUcontext ctx;
        CUdeviceptr va;
        CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        uint32_t *buf;
        CUresult r;
        size_t bad = 0;

        if (!cu_up(0, &ctx) || !vmm_import(a->fd, a->size, &va) ||
            !need("cuMemSetAccess", cu.cuMemSetAccess(va, a->size, &rw, 1)))
                return;
        buf = malloc(a->size);
        if (!buf)
                return;
        say("stage=cuMemcpyDtoH");
        r = cu.cuMemcpyDtoH(buf, va, a->size);
        say("read=%s", rname(r));
        if (r != CUDA_SUCCESS)
                return;
        for (size_t i = 0; i < a->size / 4; i++)
                bad += buf[i] != WORD;
        if (bad)
                say("data=wrong (%zu of %zu words)", bad, a->size / 4);
        else
                say("data=ok");
}

/* One round: 0 the reader got its answer, 1 the exporter could not set up. */
static int b_round(bool killed, char *out, size_t outlen)
{
        struct worker e, r;
        struct b_arg a = {.killed = killed, .fd = -1};
        int sv[2];

        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
                return snprintf(out, outlen, "socketpair: %s", strerror(errno)), 1;
        a.sock = sv[1];
        if (!start(&e, b_exporter, &a, &sv[1], 1)) {
                close(sv[0]);
                close(sv[1]);
                return snprintf(out, outlen, "fork: %s", strerror(errno)), 1;
        }
        close(sv[1]);
        a.fd = recv_fd(sv[0], 30);
        if (a.fd < 0 || !wait_key(&e, "size", NULL, 5) ||
            (killed && !wait_key(&e, "waiting", NULL, 5))) {
                finish(&e, 5);
                close(sv[0]);
                if (a.fd >= 0)
                        close(a.fd);
                return snprintf(out, outlen, "the exporter: %s", outcome(&e, "size")), 1;
        }
        a.size = strtoull(val(&e, "size"), NULL, 10);
        if (killed)
                kill(e.pid, SIGKILL);
        finish(&e, 15);
        close(sv[0]);
        if (killed)
                snprintf(out, outlen, "exporter killed%s: ", e.reaped ? "" : " (not reaped!)");
        else
                snprintf(out, outlen,
                         "exporter exited (cuMemRelease=%s%s): ", outcome(&e, "release"),
                         e.reaped ? "" : ", not reaped!");
        if (start(&r, b_reader, &a, &a.fd, 1))
                finish(&r, 20);
        close(a.fd);
        snprintf(out + strlen(out), outlen - strlen(out), "import=%s, read=%s, data %s",
                 outcome(&r, "import"), outcome(&r, "read"), outcome(&r, "data"));
        return is(val(&r, "data"), "ok") ? 0 : 2;
}

static int probe_b(void)
{
        char exited[600], killed[600];
        int x = b_round(false, exited, sizeof(exited));
        int k = b_round(true, killed, sizeof(killed));

        printf("probe b (a VMM fd held by a CUDA-free process outlives its exporter): %s: %s; %s\n",
               x == 1 || k == 1 ? "ERROR"
               : x || k         ? "FAIL"
                                : "PASS",
               exited, killed);
        return x == 1 || k == 1;
}

/* ---- probe c: an IPC event whose exporter is gone ---------------------------------------- */

enum blocker { DESTROYED, HOST_FUNC, WAIT_VALUE };

struct c_arg {
        int sock;
        enum blocker blocker;
        CUipcEventHandle handle;
        int go; /* the waiter: -1, or a socket to wait on before cuStreamSynchronize */
};

static void CUDA_CB block_on_pipe(void *arg)
{
        char c;

        while (read(*(int *)arg, &c, 1) < 0 && errno == EINTR)
                ;
}

static void c_exporter(const void *arg)
{
        const struct c_arg *a = arg;
        static int pipefd[2];
        CUcontext ctx;
        CUstream s;
        CUevent ev;
        CUdeviceptr m;
        CUipcEventHandle h;
        char c;

        if (!cu_up(0, &ctx) || !need("cuStreamCreate", cu.cuStreamCreate(&s, 0)) ||
            !need("cuEventCreate",
                  cu.cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)))
                return;
        switch (a->blocker) {
        case DESTROYED:
                if (!need("cuEventRecord", cu.cuEventRecord(ev, s)) ||
                    !need("cuEventSynchronize", cu.cuEventSynchronize(ev)))
                        return;
                break;
        case HOST_FUNC:
                if (pipe(pipefd) < 0) {
                        say("fail=pipe: %s", strerror(errno));
                        return;
                }
                if (!need("cuLaunchHostFunc", cu.cuLaunchHostFunc(s, block_on_pipe, &pipefd[0])))
                        return;
                break;
        case WAIT_VALUE:
                if (!need("cuMemAlloc", cu.cuMemAlloc(&m, 4)) ||
                    !need("cuMemsetD32", cu.cuMemsetD32(m, 0, 1)) ||
                    !need("cuCtxSynchronize", cu.cuCtxSynchronize()) ||
                    !need("cuStreamWaitValue32",
                          cu.cuStreamWaitValue32(s, m, 1, CU_STREAM_WAIT_VALUE_GEQ)))
                        return;
                break;
        }
        if (a->blocker != DESTROYED) {
                if (!need("cuEventRecord", cu.cuEventRecord(ev, s)))
                        return;
                say("pending=%s", rname(cu.cuEventQuery(ev)));
        }
        if (!need("cuIpcGetEventHandle", cu.cuIpcGetEventHandle(&h, ev)))
                return;
        if (a->blocker == DESTROYED)
                say("destroy=%s", rname(cu.cuEventDestroy(ev)));
        if (!send_bytes(a->sock, &h, sizeof(h)))
                return;
        say("ready=1");
        recv_bytes(a->sock, &c, 1, 100); /* until told to go, or killed */
}

static void c_waiter(const void *arg)
{
        const struct c_arg *a = arg;
        CUcontext ctx;
        CUevent ev;
        CUstream s;
        CUresult r;
        char c;

        if (!cu_up(0, &ctx) || !need("cuStreamCreate", cu.cuStreamCreate(&s, 0)))
                return;
        say("stage=cuIpcOpenEventHandle");
        r = cu.cuIpcOpenEventHandle(&ev, a->handle);
        say("open=%s", rname(r));
        if (r == CUDA_SUCCESS) {
                say("stage=cuStreamWaitEvent");
                say("wait=%s", rname(cu.cuStreamWaitEvent(s, ev, 0)));
        }
        if (a->go >= 0) {
                say("query=%s", rname(cu.cuStreamQuery(s)));
                say("waiting=1");
                recv_bytes(a->go, &c, 1, 60);
        }
        say("stage=cuStreamSynchronize");
        say("sync=%s", rname(cu.cuStreamSynchronize(s)));
}

/* One case: the exporter destroys the event, or is SIGKILLed with it pending; the waiter opens
 * it afterwards, or (waiting_first) opens and waits on it before the kill. */
static bool c_case(enum blocker blocker, bool waiting_first, char *out, size_t outlen)
{
        static const char *names[] = {"destroyed", "killed (host func)", "killed (wait value)"};
        struct worker e, w = {.pid = -1, .fd = -1, .eof = true};
        struct c_arg a = {.blocker = blocker, .go = -1};
        int sv[2], gv[2] = {-1, -1};
        size_t n;

        snprintf(out, outlen, "%s%s: ", names[blocker],
                 blocker == DESTROYED ? ""
                 : waiting_first      ? ", waiting before"
                                      : ", opened after");
        n = strlen(out);
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0 ||
            (waiting_first && socketpair(AF_UNIX, SOCK_STREAM, 0, gv) < 0))
                return snprintf(out + n, outlen - n, "ERROR socketpair"), false;
        a.sock = sv[1];
        if (!start(&e, c_exporter, &a, &sv[1], 1))
                return snprintf(out + n, outlen - n, "ERROR fork"), false;
        close(sv[1]);
        if (!recv_bytes(sv[0], &a.handle, sizeof(a.handle), 30) ||
            !wait_key(&e, "ready", NULL, 5)) {
                finish(&e, 5);
                close(sv[0]);
                snprintf(out + n, outlen - n, "ERROR: the exporter: %s", outcome(&e, "ready"));
                return false;
        }
        if (blocker != DESTROYED && !is(val(&e, "pending"), "CUDA_ERROR_NOT_READY"))
                n += (size_t)snprintf(out + n, outlen - n, "(the event was %s, not pending) ",
                                      outcome(&e, "pending"));
        if (waiting_first) {
                a.go = gv[1];
                if (start(&w, c_waiter, &a, &gv[1], 1))
                        wait_key(&w, "waiting", NULL, 30);
                close(gv[1]);
        }
        if (blocker != DESTROYED) {
                kill(e.pid, SIGKILL);
                finish(&e, 10);
        }
        if (waiting_first) {
                send_bytes(gv[0], "g", 1);
                close(gv[0]);
        } else if (!start(&w, c_waiter, &a, NULL, 0)) {
                snprintf(out + n, outlen - n, "ERROR fork");
                w.pid = -1;
        }
        /* 10 s for cuStreamSynchronize once it is called (30 s for what comes before) */
        if (wait_key(&w, "stage", "cuStreamSynchronize", 30))
                finish(&w, 10);
        else
                finish(&w, 1);
        if (blocker == DESTROYED) {
                /* the exporter lived, its event destroyed, until the waiter was done */
                send_bytes(sv[0], "q", 1);
                finish(&e, 10);
        }
        close(sv[0]);
        n += (size_t)snprintf(out + n, outlen - n, "cuIpcOpenEventHandle=%s", outcome(&w, "open"));
        if (val(&w, "wait"))
                n += (size_t)snprintf(out + n, outlen - n, ", cuStreamWaitEvent=%s",
                                      val(&w, "wait"));
        if (val(&w, "query"))
                n += (size_t)snprintf(out + n, outlen - n, ", cuStreamQuery before=%s",
                                      val(&w, "query"));
        n += (size_t)snprintf(out + n, outlen - n, ", cuStreamSynchronize=%s%s",
                              outcome(&w, "sync"), w.hung ? " (killed after 10 s)" : "");
        return !w.hung;
}

static int probe_c(void)
{
        char out[5][700];
        bool returns = true;
        int k = 0;

        returns = c_case(DESTROYED, false, out[k++], sizeof(out[0])) && returns;
        for (int b = HOST_FUNC; b <= WAIT_VALUE; b++) {
                returns = c_case((enum blocker)b, false, out[k++], sizeof(out[0])) && returns;
                returns = c_case((enum blocker)b, true, out[k++], sizeof(out[0])) && returns;
        }
        printf("probe c (an IPC event whose exporter is gone): %s:", returns ? "PASS" : "FAIL");
        for (int i = 0; i < k; i++)
                printf("%s %s", i ? ";" : "", out[i]);
        printf("\n");
        return 0;
}

/* ---- probe d: cuIpcGetMemHandle stability ------------------------------------------------ */

static const char *compare(const CUipcMemHandle *x, const CUipcMemHandle *y)
{
        static char out[4][48];
        static unsigned next;
        char *o = out[next++ % 4];
        int n = 0;

        for (size_t i = 0; i < sizeof(x->reserved); i++)
                n += x->reserved[i] != y->reserved[i];
        if (!n)
                return "identical";
        snprintf(o, sizeof(out[0]), "differ (%d of %zu bytes)", n, sizeof(x->reserved));
        return o;
}

static void d_worker(const void *arg)
{
        CUcontext ctx;
        CUdeviceptr p, q;
        CUipcMemHandle h1, h2, h3, hq, hi;
        CUresult r;

        (void)arg;
        if (!cu_up(0, &ctx) || !need("cuMemAlloc", cu.cuMemAlloc(&p, 2 << 20)) ||
            !need("cuIpcGetMemHandle", cu.cuIpcGetMemHandle(&h1, p)) ||
            !need("cuIpcGetMemHandle", cu.cuIpcGetMemHandle(&h2, p)))
                return;
        say("twice=%s", compare(&h1, &h2));
        if (!need("cuMemAlloc", cu.cuMemAlloc(&q, 2 << 20)) ||
            !need("cuIpcGetMemHandle", cu.cuIpcGetMemHandle(&h3, p)) ||
            !need("cuIpcGetMemHandle", cu.cuIpcGetMemHandle(&hq, q)))
                return;
        say("after_alloc=%s", compare(&h1, &h3));
        say("other_alloc=%s", compare(&h1, &hq));
        r = cu.cuIpcGetMemHandle(&hi, p + 4096);
        say("interior=%s", r == CUDA_SUCCESS ? compare(&h1, &hi) : rname(r));
}

static int probe_d(void)
{
        const char *title = "probe d (cuIpcGetMemHandle for one base pointer)";
        struct worker w;

        if (!start(&w, d_worker, NULL, NULL, 0))
                return printf("%s: ERROR: fork: %s\n", title, strerror(errno)), 1;
        finish(&w, 20);
        if (!val(&w, "twice"))
                return printf("%s: ERROR: %s\n", title, outcome(&w, "twice")), 1;
        printf("%s: %s: asked twice: %s; again after another allocation: %s; "
               "the other allocation's: %s; for base+4096: %s\n",
               title,
               is(val(&w, "twice"), "identical") && is(val(&w, "after_alloc"), "identical")
                       ? "PASS"
                       : "FAIL",
               val(&w, "twice"), outcome(&w, "after_alloc"), outcome(&w, "other_alloc"),
               outcome(&w, "interior"));
        return 0;
}

/* ---- probe e: an event of the primary context recorded elsewhere ------------------------- */

static void e_worker(const void *arg)
{
        CUcontext ctx0, ctx1, other;
        CUdevice dev0, dev1;
        CUevent ev;
        CUstream s1, s2;
        int count = 0;

        (void)arg;
        if (!cu_up(0, &ctx0) || !need("cuDeviceGetCount", cu.cuDeviceGetCount(&count)) ||
            !need("cuDeviceGet", cu.cuDeviceGet(&dev0, 0)) ||
            !need("cuEventCreate", cu.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING)))
                return;
        if (count < 2) {
                say("device=skipped: %d device", count);
        } else if (need("cuDeviceGet(1)", cu.cuDeviceGet(&dev1, 1)) &&
                   need("cuDevicePrimaryCtxRetain(1)", cu.cuDevicePrimaryCtxRetain(&ctx1, dev1)) &&
                   need("cuCtxSetCurrent(1)", cu.cuCtxSetCurrent(ctx1)) &&
                   need("cuStreamCreate(1)", cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING))) {
                say("stage=cuEventRecord on device 1");
                say("device=%s", rname(cu.cuEventRecord(ev, s1)));
                say("device_wait=%s", rname(cu.cuStreamWaitEvent(s1, ev, 0)));
                say("stage=cuStreamSynchronize on device 1");
                say("device_sync=%s", rname(cu.cuStreamSynchronize(s1)));
        }
        if (!need("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx0)) ||
            !need("cuCtxCreate", cu.cuCtxCreate(&other, NULL, 0, dev0)) ||
            !need("cuStreamCreate", cu.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING)))
                return;
        say("stage=cuEventRecord in a created context");
        say("context=%s", rname(cu.cuEventRecord(ev, s2)));
        say("context_wait=%s", rname(cu.cuStreamWaitEvent(s2, ev, 0)));
        say("stage=cuStreamSynchronize in a created context");
        say("context_sync=%s", rname(cu.cuStreamSynchronize(s2)));
        if (need("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx0)))
                say("context_primary_current=%s", rname(cu.cuEventRecord(ev, s2)));
}

static int probe_e(void)
{
        const char *title = "probe e (an event of device 0's primary context recorded elsewhere)";
        struct worker w;

        if (!start(&w, e_worker, NULL, NULL, 0))
                return printf("%s: ERROR: fork: %s\n", title, strerror(errno)), 1;
        finish(&w, 30);
        if (!val(&w, "device") && !val(&w, "context"))
                return printf("%s: ERROR: %s\n", title, outcome(&w, "context")), 1;
        printf("%s: INFO: on a stream of device 1: ", title);
        if (val(&w, "device_wait"))
                printf("cuEventRecord=%s (cuStreamWaitEvent=%s, cuStreamSynchronize=%s)",
                       val(&w, "device"), val(&w, "device_wait"), outcome(&w, "device_sync"));
        else
                printf("%s", outcome(&w, "device"));
        printf("; on a stream of a cuCtxCreate context of device 0: cuEventRecord=%s "
               "(cuStreamWaitEvent=%s, cuStreamSynchronize=%s; with the primary context "
               "current: cuEventRecord=%s)\n",
               outcome(&w, "context"), outcome(&w, "context_wait"), outcome(&w, "context_sync"),
               outcome(&w, "context_primary_current"));
        return 0;
}

/* ---- main: the driver check, then each probe under a watchdog ---------------------------- */

static void driver_worker(const void *arg)
{
        int st = load_driver(), version = 0, count = 0, major = 0, minor = 0;
        CUdevice dev;
        char name[128] = "?";

        (void)arg;
        if (st) {
                say("none=%s", load_why);
                _exit(st);
        }
        cu.cuDriverGetVersion(&version);
        cu.cuDeviceGetCount(&count);
        if (count > 0 && cu.cuDeviceGet(&dev, 0) == CUDA_SUCCESS) {
                cu.cuDeviceGetName(name, sizeof(name), dev);
                cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
                cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
        }
        say("driver=CUDA %d.%d (cuDriverGetVersion %d; built against cuda.h %d), %d device%s, "
            "device 0: %s (compute capability %d.%d)",
            version / 1000, version % 1000 / 10, version, CUDA_VERSION, count,
            count == 1 ? "" : "s", name, major, minor);
        _exit(count > 0 ? 0 : 77);
}

struct probe {
        char letter;
        int (*run)(void);
        int limit; /* seconds for the whole probe */
};

static const struct probe probes[] = {
        {'a', probe_a, 120}, {'b', probe_b, 120}, {'c', probe_c, 240},
        {'d', probe_d, 40},  {'e', probe_e, 60},
};
#define N_PROBES (sizeof(probes) / sizeof(probes[0]))

static volatile sig_atomic_t running; /* the process group of the probe running, or 0 */

/* Stopped from outside (timeout(1)): the running probe's processes go too. */
static void on_stop(int sig)
{
        if (running)
                kill(-(pid_t)running, SIGKILL);
        signal(sig, SIG_DFL);
        raise(sig);
}

/* Runs a probe's coordinator in a process group of its own, killed whole if it overruns. */
static int run_probe(const struct probe *p)
{
        double end = now() + p->limit;
        int status;
        pid_t pid;

        fflush(NULL);
        pid = fork();
        if (pid < 0)
                return printf("probe %c: ERROR: fork: %s\n", p->letter, strerror(errno)), 1;
        if (pid == 0) {
                setpgid(0, 0);
                _exit(p->run());
        }
        setpgid(pid, pid);
        running = pid;
        while (now() < end) {
                pid_t r = waitpid(pid, &status, WNOHANG);
                if (r == pid || r < 0) {
                        /* its workers too, should one outlive it */
                        kill(-pid, SIGKILL);
                        running = 0;
                        return r == pid && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
                }
                usleep(20000);
        }
        kill(-pid, SIGKILL);
        running = 0;
        waitpid(pid, &status, 0);
        printf("probe %c: FAIL: no answer in %d s (hung); killed\n", p->letter, p->limit);
        return 1;
}

int main(int argc, char **argv)
{
        bool want[N_PROBES] = {false};
        struct worker w;
        int rc = 0;

        setvbuf(stdout, NULL, _IOLBF, 0);
        signal(SIGTERM, on_stop);
        signal(SIGINT, on_stop);
        signal(SIGHUP, on_stop);
        for (int i = 1; i < argc; i++) {
                bool known = !strcmp(argv[i], "all");
                for (size_t k = 0; k < N_PROBES; k++) {
                        if (!strcmp(argv[i], "all") ||
                            (argv[i][0] == probes[k].letter && !argv[i][1])) {
                                want[k] = true;
                                known = true;
                        }
                }
                if (!known) {
                        fprintf(stderr, "usage: %s [all | a | b | c | d | e]...\n", argv[0]);
                        return 2;
                }
        }
        if (argc < 2)
                for (size_t k = 0; k < N_PROBES; k++)
                        want[k] = true;

        /* the driver and its devices, asked in a child: this process never loads CUDA */
        if (!start(&w, driver_worker, NULL, NULL, 0)) {
                perror("fork");
                return 1;
        }
        finish(&w, 30);
        if (w.hung) {
                printf("dlx-gpu-probe: FAIL: loading the CUDA driver hung (> 30 s)\n");
                return 1;
        }
        if (val(&w, "none")) {
                printf("dlx-gpu-probe: %s: skipped\n", val(&w, "none"));
                return w.reaped && WIFEXITED(w.status) ? WEXITSTATUS(w.status) : 1;
        }
        if (!val(&w, "driver")) {
                printf("dlx-gpu-probe: ERROR: the driver check %s\n", outcome(&w, "driver"));
                return 1;
        }
        printf("driver: %s\n", val(&w, "driver"));
        if (!w.reaped || !WIFEXITED(w.status) || WEXITSTATUS(w.status) != 0) {
                printf("dlx-gpu-probe: no CUDA device: skipped\n");
                return 77;
        }
        for (size_t k = 0; k < N_PROBES; k++)
                if (want[k] && run_probe(&probes[k]))
                        rc = 1;
        return rc;
}
