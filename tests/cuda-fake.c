/* SPDX-License-Identifier: MIT */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cuda-fake.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cudadrv.h"

/* --- shared state: the log and exported events ---------------------------------------------- */

#define LOG_CAPACITY ((size_t)1 << 20)
#define EVENT_SLOTS 4096
#define SHARED_MAGIC 0x63756461666b6531ULL

enum { SLOT_DESTROYED = 1, SLOT_HELD = 2 };

struct event_slot {
        uint64_t id; /* 0 while free; claimed with a compare-and-swap */
        uint32_t state;
        uint32_t pad;
};

struct log_slot {
        uint32_t ready; /* set last, so readers never see half an entry */
        struct cuda_fake_entry e;
};

struct shared {
        uint64_t magic;
        uint64_t next; /* slots handed out; may run past LOG_CAPACITY */
        uint32_t overflowed;
        struct event_slot events[EVENT_SLOTS];
        struct log_slot log[LOG_CAPACITY];
};

/* --- per-process state ---------------------------------------------------------------------- */

#define CTX_STACK_MAX 64
#define HANDLE_TAG 0xcf00000000000000ULL
#define IPC_MEM_MAGIC 0x4d494643u   /* "CFIM" */
#define IPC_EVENT_MAGIC 0x45494643u /* "CFIE" */
#define ALLOC_NAME "cuda-fake-alloc-"
#define VMM_NAME "cuda-fake-vmm-"

enum region_kind { R_ALLOC, R_IPC, R_RESERVE, R_MAP, R_HOST };

struct region {
        struct region *next;
        enum region_kind kind;
        uintptr_t base;
        size_t size; /* as reported to callers */
        size_t len;  /* ALLOC, IPC: bytes mapped (size rounded up to pages) */
        int fd;      /* ALLOC: the memfd IPC handles name; else -1 */
        int device;
        uint64_t buffer_id;
        uint64_t nonce;             /* ALLOC, IPC: identifies the allocation across processes */
        pid_t peer;                 /* IPC: the exporter */
        unsigned refs;              /* IPC */
        unsigned access;            /* MAP: CU_MEM_ACCESS_FLAGS_PROT_*; HOST: register flags */
        uint64_t handle_types;      /* MAP: of the handle mapped */
        struct region *reservation; /* MAP: the reservation it lies in */
        CUmemGenericAllocationHandle handle; /* MAP: the handle mapped */
        CUcontext ctx;                       /* IPC: current when it was opened */
        unsigned alloc_kind;                 /* ALLOC: enum cuda_fake_memory */
};

struct mem_handle {
        struct mem_handle *next;
        CUmemGenericAllocationHandle id;
        int fd;
        size_t size;
        int device;
        uint64_t handle_types;
};

struct CUevent_st {
        struct CUevent_st *next;
        unsigned flags;
        uint64_t id;
        bool imported;
        CUcontext ctx;       /* current when it was created or opened */
        CUstream covers;     /* recorded on this stream ... */
        uint64_t covers_seq; /* ... when its work had reached this number */
};

/* device: the physical device (see visible[]) */
struct CUctx_st {
        int device;
        bool primary;
};

/* A stream the test named (cuda_fake_stream_bind) and the context it belongs to. */
struct stream_bind {
        CUstream stream;
        CUcontext ctx;
};

/* Work a test queued on a stream (cuda_fake_stream_work), done once synchronized. */
struct work {
        struct work *next;
        CUstream stream;
        uint64_t seq;
        uintptr_t ptr;
        size_t size;
};

struct ipc_mem_wire {
        uint32_t magic;
        int32_t pid;
        int32_t fd;
        int32_t device; /* physical */
        uint64_t size;
        uint64_t nonce;
        uint64_t pidns; /* the exporter's PID namespace */
        uint8_t pad[24];
};

struct ipc_event_wire {
        uint32_t magic;
        int32_t pid;
        uint64_t id;
        uint32_t flags;
        uint32_t pad0;
        uint64_t pidns;
        uint8_t pad[32];
};

_Static_assert(sizeof(struct ipc_mem_wire) == CU_IPC_HANDLE_SIZE, "IPC memory handle layout");
_Static_assert(sizeof(struct ipc_event_wire) == CU_IPC_HANDLE_SIZE, "IPC event handle layout");

struct fault {
        bool armed;
        unsigned skip;
        CUresult r;
};

/* init_lock guards creating the shared region; lock guards everything else below. */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct shared *shm;

static int device_count = 1;
static size_t granularity = CUDA_FAKE_GRANULARITY;
static bool require_ctx = true;
static bool ipc_refcount;
static bool refuse_read_only;
static struct fault faults[CUDA_FAKE_OP_COUNT];

static struct region *regions;
static struct mem_handle *handles;
static struct CUevent_st *events;
static uint32_t last_event;
static uint64_t last_buffer_id;
static uint64_t last_handle;

static struct CUctx_st contexts[CUDA_FAKE_MAX_DEVICES] = {
        {0, true}, {1, true}, {2, true}, {3, true}, {4, true}, {5, true}, {6, true}, {7, true}};
_Static_assert(CUDA_FAKE_MAX_DEVICES == 8, "contexts[] initialiser");
#define MAX_USER_CONTEXTS 16
static struct CUctx_st user_contexts[MAX_USER_CONTEXTS];
static int nuser_contexts;

/* Ordinal i of this process is physical device visible[i] (CUDA_VISIBLE_DEVICES). */
static int visible[CUDA_FAKE_MAX_DEVICES] = {0, 1, 2, 3, 4, 5, 6, 7};

#define MAX_STREAM_BINDS 64
static struct stream_bind binds[MAX_STREAM_BINDS];
static struct work *works;
static uint64_t last_work;
static unsigned violations;

static __thread CUcontext ctx_stack[CTX_STACK_MAX];
static __thread int ctx_top;

static void atfork_prepare(void)
{
        pthread_mutex_lock(&init_lock);
        pthread_mutex_lock(&lock);
}

static void atfork_release(void)
{
        pthread_mutex_unlock(&lock);
        pthread_mutex_unlock(&init_lock);
}

/* A fork while another thread is inside the fake must not leave the child's locks held. */
__attribute__((constructor)) static void register_atfork(void)
{
        pthread_atfork(atfork_prepare, atfork_release, atfork_release);
}

static struct shared *shared_new(void)
{
        void *p = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        struct shared *s;

        if (p == MAP_FAILED)
                return NULL;
        s = p;
        s->magic = SHARED_MAGIC;
        return s;
}

static struct shared *shared_get(void)
{
        struct shared *s = __atomic_load_n(&shm, __ATOMIC_ACQUIRE);

        if (s)
                return s;
        pthread_mutex_lock(&init_lock);
        s = shm;
        if (!s) {
                s = shared_new();
                __atomic_store_n(&shm, s, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&init_lock);
        return s;
}

int cuda_fake_init(void)
{
        struct shared *s = shared_new(), *old;

        if (!s)
                return -ENOMEM;
        pthread_mutex_lock(&init_lock);
        old = shm;
        __atomic_store_n(&shm, s, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&init_lock);
        if (old)
                munmap(old, sizeof(*old));

        pthread_mutex_lock(&lock);
        device_count = 1;
        granularity = CUDA_FAKE_GRANULARITY;
        require_ctx = true;
        ipc_refcount = false;
        refuse_read_only = false;
        memset(faults, 0, sizeof(faults));
        for (int i = 0; i < CUDA_FAKE_MAX_DEVICES; i++)
                visible[i] = i;
        memset(binds, 0, sizeof(binds));
        violations = 0;
        pthread_mutex_unlock(&lock);
        return 0;
}

static void log_entry(struct cuda_fake_entry e)
{
        struct shared *s = shared_get();
        uint64_t i;

        if (!s)
                return;
        i = __atomic_fetch_add(&s->next, 1, __ATOMIC_ACQ_REL);
        if (i >= LOG_CAPACITY) {
                if (!__atomic_exchange_n(&s->overflowed, 1, __ATOMIC_ACQ_REL))
                        fprintf(stderr, "cuda-fake: log full, dropping entries\n");
                return;
        }
        e.pid = getpid();
        s->log[i].e = e;
        __atomic_store_n(&s->log[i].ready, 1, __ATOMIC_RELEASE);
}

#define LOG(op_, ...) log_entry((struct cuda_fake_entry){.op = (op_), __VA_ARGS__})

/* The shared slot of an event id, claiming a free one when create is set; NULL if none. */
static struct event_slot *slot_find(uint64_t id, bool create)
{
        struct shared *s = shared_get();
        unsigned i;

        if (!s || !id)
                return NULL;
        for (i = 0; i < EVENT_SLOTS; i++) {
                uint64_t cur = __atomic_load_n(&s->events[i].id, __ATOMIC_ACQUIRE);
                if (cur == id)
                        return &s->events[i];
                if (cur == 0) {
                        uint64_t expected = 0;
                        if (!create)
                                return NULL;
                        if (__atomic_compare_exchange_n(&s->events[i].id, &expected, id, false,
                                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                                return &s->events[i];
                        if (expected == id)
                                return &s->events[i];
                }
        }
        return NULL;
}

static uint32_t slot_state(uint64_t id)
{
        struct event_slot *slot = slot_find(id, false);

        return slot ? __atomic_load_n(&slot->state, __ATOMIC_ACQUIRE) : 0;
}

/* --- settings -------------------------------------------------------------------------------- */

int cuda_fake_set_device_count(int count)
{
        if (count < 0 || count > CUDA_FAKE_MAX_DEVICES)
                return -EINVAL;
        pthread_mutex_lock(&lock);
        device_count = count;
        pthread_mutex_unlock(&lock);
        return 0;
}

int cuda_fake_set_granularity(size_t g)
{
        if (g < (size_t)sysconf(_SC_PAGESIZE) || (g & (g - 1)))
                return -EINVAL;
        pthread_mutex_lock(&lock);
        granularity = g;
        pthread_mutex_unlock(&lock);
        return 0;
}

void cuda_fake_require_context(bool required)
{
        pthread_mutex_lock(&lock);
        require_ctx = required;
        pthread_mutex_unlock(&lock);
}

void cuda_fake_refuse_read_only(bool refuse)
{
        pthread_mutex_lock(&lock);
        refuse_read_only = refuse;
        pthread_mutex_unlock(&lock);
}

void cuda_fake_ipc_refcount(bool refcount)
{
        pthread_mutex_lock(&lock);
        ipc_refcount = refcount;
        pthread_mutex_unlock(&lock);
}

void cuda_fake_fail_after(enum cuda_fake_op op, unsigned skip, CUresult r)
{
        if ((unsigned)op >= CUDA_FAKE_OP_COUNT)
                return;
        pthread_mutex_lock(&lock);
        faults[op].armed = r != CUDA_SUCCESS;
        faults[op].skip = skip;
        faults[op].r = r;
        pthread_mutex_unlock(&lock);
}

void cuda_fake_fail_next(enum cuda_fake_op op, CUresult r)
{
        cuda_fake_fail_after(op, 0, r);
}

static bool take_fault(enum cuda_fake_op op, CUresult *ret)
{
        bool hit = false;

        pthread_mutex_lock(&lock);
        if (faults[op].armed) {
                if (faults[op].skip) {
                        faults[op].skip--;
                } else {
                        faults[op].armed = false;
                        *ret = faults[op].r;
                        hit = true;
                }
        }
        pthread_mutex_unlock(&lock);
        return hit;
}

#define FAULT(op)                                                                                  \
        do {                                                                                       \
                CUresult fault_r_;                                                                 \
                if (take_fault(op, &fault_r_))                                                     \
                        return fault_r_;                                                           \
        } while (0)

/* --- helpers --------------------------------------------------------------------------------- */

static size_t page_size(void)
{
        return (size_t)sysconf(_SC_PAGESIZE);
}

static size_t round_up(size_t n, size_t to)
{
        return (n + to - 1) / to * to;
}

/* The physical device of a context the fake made, or -1. */
static int ctx_device(CUcontext ctx)
{
        for (int i = 0; i < CUDA_FAKE_MAX_DEVICES; i++)
                if (ctx == &contexts[i])
                        return i;
        for (int i = 0; i < nuser_contexts; i++)
                if (ctx == &user_contexts[i])
                        return user_contexts[i].device;
        return -1;
}

static CUcontext current_ctx(void)
{
        return ctx_top ? ctx_stack[ctx_top - 1] : NULL;
}

/* The physical device of the current context (that of ordinal 0 without one). */
static int current_device(void)
{
        return ctx_top ? ctx_device(ctx_stack[ctx_top - 1]) : visible[0];
}

/* This process's ordinal of a physical device, or -1 when it is not visible. lock held. */
static int ordinal_of(int physical)
{
        for (int i = 0; i < device_count; i++)
                if (visible[i] == physical)
                        return i;
        return -1;
}

/* The PID namespace of the calling process (its inode), 0 if unknown. */
static uint64_t pid_namespace(void)
{
        struct stat st;

        return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/*
 * The context a stream belongs to: a bound one's, or for the default streams
 * (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) the current context. A
 * stream the fake does not know is CUDA_ERROR_INVALID_HANDLE, as a destroyed
 * one is to the driver. lock held.
 */
static CUresult stream_ctx(CUstream stream, CUcontext *ret)
{
        if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
                *ret = current_ctx();
                return *ret ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
        }
        for (int i = 0; i < MAX_STREAM_BINDS; i++) {
                if (binds[i].stream == stream) {
                        *ret = binds[i].ctx;
                        return CUDA_SUCCESS;
                }
        }
        return CUDA_ERROR_INVALID_HANDLE;
}

/* Work not yet synchronized on [p, p + size): a use-after-free on a GPU. lock held. */
static void check_no_work(const char *what, uintptr_t p, size_t size)
{
        for (struct work *w = works; w; w = w->next) {
                if (w->ptr < p + size && p < w->ptr + w->size) {
                        violations++;
                        fprintf(stderr,
                                "cuda-fake (pid %d): %s of [%#lx, +%zu) while stream %p still has "
                                "work on it (queued as #%llu): the driver would let it run on "
                                "freed memory\n",
                                (int)getpid(), what, (unsigned long)p, size, (void *)w->stream,
                                (unsigned long long)w->seq);
                        return;
                }
        }
}

/* Work on stream up to seq is done. lock held. */
static void work_done(CUstream stream, uint64_t seq)
{
        for (struct work **pp = &works; *pp;) {
                struct work *w = *pp;
                if (w->stream == stream && w->seq <= seq) {
                        *pp = w->next;
                        free(w);
                } else {
                        pp = &w->next;
                }
        }
}

static CUresult need_ctx(void)
{
        bool required;

        pthread_mutex_lock(&lock);
        required = require_ctx;
        pthread_mutex_unlock(&lock);
        return required && ctx_top == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

#define NEED_CTX()                                                                                 \
        do {                                                                                       \
                if (need_ctx() != CUDA_SUCCESS)                                                    \
                        return CUDA_ERROR_INVALID_CONTEXT;                                         \
        } while (0)

/* Whether dev is an ordinal of this process. */
static bool valid_device(int dev)
{
        return dev >= 0 && dev < device_count;
}

static struct region *region_new(enum region_kind kind, uintptr_t base, size_t size)
{
        struct region *r = calloc(1, sizeof(*r));

        if (!r)
                return NULL;
        r->kind = kind;
        r->base = base;
        r->size = size;
        r->fd = -1;
        r->buffer_id = ++last_buffer_id;
        r->next = regions;
        regions = r;
        return r;
}

static void region_remove(struct region *r)
{
        struct region **p;

        for (p = &regions; *p; p = &(*p)->next) {
                if (*p == r) {
                        *p = r->next;
                        free(r);
                        return;
                }
        }
}

/* The region of one of the kinds in mask (1 << kind) that contains p, or NULL. */
static struct region *region_at(uintptr_t p, unsigned mask)
{
        struct region *r;

        for (r = regions; r; r = r->next)
                if ((mask & (1u << r->kind)) && p >= r->base && p - r->base < r->size)
                        return r;
        return NULL;
}

static struct region *region_based(uintptr_t base, enum region_kind kind)
{
        struct region *r;

        for (r = regions; r; r = r->next)
                if (r->kind == kind && r->base == base)
                        return r;
        return NULL;
}

#define MEMORY_KINDS ((1u << R_ALLOC) | (1u << R_IPC) | (1u << R_MAP) | (1u << R_HOST))

/*
 * Checks that [ptr, ptr + size) is exactly a run of whole VMM mappings, and
 * how many; what MemUnmap and MemSetAccess accept.
 */
static int whole_mappings(uintptr_t ptr, size_t size)
{
        struct region *r;
        size_t covered = 0;
        int n = 0;

        if (!size || ptr + size < ptr)
                return -1;
        for (r = regions; r; r = r->next) {
                if (r->kind != R_MAP || r->base >= ptr + size || r->base + r->size <= ptr)
                        continue;
                if (r->base < ptr || r->base + r->size > ptr + size)
                        return -1;
                covered += r->size;
                n++;
        }
        return covered == size ? n : -1;
}

static uint64_t random_nonce(void)
{
        uint64_t n = 0;

        while (!n) {
                if (getrandom(&n, sizeof(n), 0) != (ssize_t)sizeof(n))
                        n = ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)&n ^ ++last_buffer_id;
        }
        return n;
}

/* Whether fd is a memfd whose name starts with prefix (the names the fake gives its memfds). */
static bool memfd_named(int fd, const char *prefix, char *ret_name, size_t name_size)
{
        char path[64], target[256];
        ssize_t n;

        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        n = readlink(path, target, sizeof(target) - 1);
        if (n < 0)
                return false;
        target[n] = '\0';
        if (strncmp(target, "/memfd:", 7) || strncmp(target + 7, prefix, strlen(prefix)))
                return false;
        if (ret_name)
                snprintf(ret_name, name_size, "%s", target + 7);
        return true;
}

/* Whether pid is running (a zombie is not: its fds and events are gone). */
static bool pid_alive(pid_t pid)
{
        char path[64], buf[512], *paren;
        ssize_t n;
        int fd;

        if (pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH))
                return false;
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return false;
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return false;
        buf[n] = '\0';
        paren = strrchr(buf, ')');
        return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

/*
 * Whether [p, p + size) is mapped readable (and writable when write is set),
 * as pinning needs: 0, -EFAULT (a hole or an inaccessible page), -EACCES.
 */
static int check_host_range(uintptr_t p, size_t size, bool write)
{
        size_t page = page_size();
        uintptr_t cur = p / page * page, end = round_up(p + size, page);
        char line[512];
        FILE *f = fopen("/proc/self/maps", "re");
        int err = -EFAULT;

        if (!f)
                return -EFAULT;
        while (fgets(line, sizeof(line), f)) {
                unsigned long lo, hi;
                char perms[8];
                if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
                        continue;
                if (hi <= cur)
                        continue;
                if (lo > cur || perms[0] != 'r')
                        break;
                if (write && perms[1] != 'w') {
                        err = -EACCES;
                        break;
                }
                cur = hi;
                if (cur >= end) {
                        err = 0;
                        break;
                }
        }
        fclose(f);
        return err;
}

/* --- driver entry points --------------------------------------------------------------------- */

static CUresult fake_Init(unsigned int flags)
{
        int n;

        FAULT(CUDA_FAKE_INIT);
        if (flags)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        n = device_count;
        pthread_mutex_unlock(&lock);
        if (!shared_get())
                return CUDA_ERROR_OUT_OF_MEMORY;
        return n ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static const char *result_name(CUresult r)
{
        switch (r) {
#define NAME(x)                                                                                    \
        case x:                                                                                    \
                return #x;
                NAME(CUDA_SUCCESS)
                NAME(CUDA_ERROR_INVALID_VALUE)
                NAME(CUDA_ERROR_OUT_OF_MEMORY)
                NAME(CUDA_ERROR_NOT_INITIALIZED)
                NAME(CUDA_ERROR_DEINITIALIZED)
                NAME(CUDA_ERROR_NO_DEVICE)
                NAME(CUDA_ERROR_INVALID_DEVICE)
                NAME(CUDA_ERROR_INVALID_IMAGE)
                NAME(CUDA_ERROR_INVALID_CONTEXT)
                NAME(CUDA_ERROR_MAP_FAILED)
                NAME(CUDA_ERROR_UNMAP_FAILED)
                NAME(CUDA_ERROR_ALREADY_MAPPED)
                NAME(CUDA_ERROR_NO_BINARY_FOR_GPU)
                NAME(CUDA_ERROR_ALREADY_ACQUIRED)
                NAME(CUDA_ERROR_NOT_MAPPED)
                NAME(CUDA_ERROR_INVALID_SOURCE)
                NAME(CUDA_ERROR_FILE_NOT_FOUND)
                NAME(CUDA_ERROR_OPERATING_SYSTEM)
                NAME(CUDA_ERROR_INVALID_HANDLE)
                NAME(CUDA_ERROR_NOT_FOUND)
                NAME(CUDA_ERROR_NOT_READY)
                NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
                NAME(CUDA_ERROR_LAUNCH_FAILED)
                NAME(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
                NAME(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
                NAME(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
                NAME(CUDA_ERROR_CONTEXT_IS_DESTROYED)
                NAME(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
                NAME(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
                NAME(CUDA_ERROR_TOO_MANY_PEERS)
                NAME(CUDA_ERROR_NOT_PERMITTED)
                NAME(CUDA_ERROR_NOT_SUPPORTED)
                NAME(CUDA_ERROR_SYSTEM_NOT_READY)
                NAME(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)
                NAME(CUDA_ERROR_UNKNOWN)
#undef NAME
        default:
                return NULL;
        }
}

static CUresult fake_GetErrorString(CUresult error, const char **str)
{
        const char *name;

        FAULT(CUDA_FAKE_GET_ERROR_STRING);
        if (!str)
                return CUDA_ERROR_INVALID_VALUE;
        name = result_name(error);
        *str = name;
        return name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_DeviceGet(CUdevice *dev, int ordinal)
{
        CUresult r = CUDA_SUCCESS;

        FAULT(CUDA_FAKE_DEVICE_GET);
        if (!dev)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        if (valid_device(ordinal))
                *dev = ordinal;
        else
                r = CUDA_ERROR_INVALID_DEVICE;
        pthread_mutex_unlock(&lock);
        return r;
}

static CUresult fake_DeviceGetCount(int *count)
{
        FAULT(CUDA_FAKE_DEVICE_GET_COUNT);
        if (!count)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        *count = device_count;
        pthread_mutex_unlock(&lock);
        return CUDA_SUCCESS;
}

static CUresult fake_DevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
        bool ok;

        FAULT(CUDA_FAKE_DEVICE_PRIMARY_CTX_RETAIN);
        if (!ctx)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        ok = valid_device(dev);
        pthread_mutex_unlock(&lock);
        if (!ok)
                return CUDA_ERROR_INVALID_DEVICE;
        *ctx = &contexts[visible[dev]];
        LOG(CUDA_FAKE_DEVICE_PRIMARY_CTX_RETAIN, .ptr = (uintptr_t)*ctx, .aux = (uint64_t)dev);
        return CUDA_SUCCESS;
}

static CUresult fake_CtxPushCurrent(CUcontext ctx)
{
        int dev = ctx_device(ctx);
        bool ok;

        FAULT(CUDA_FAKE_CTX_PUSH_CURRENT);
        pthread_mutex_lock(&lock);
        ok = dev >= 0 && ordinal_of(dev) >= 0;
        pthread_mutex_unlock(&lock);
        if (!ok)
                return CUDA_ERROR_INVALID_CONTEXT;
        if (ctx_top == CTX_STACK_MAX)
                return CUDA_ERROR_OUT_OF_MEMORY;
        ctx_stack[ctx_top++] = ctx;
        LOG(CUDA_FAKE_CTX_PUSH_CURRENT, .ptr = (uintptr_t)ctx);
        return CUDA_SUCCESS;
}

static CUresult fake_CtxPopCurrent(CUcontext *ret)
{
        CUcontext ctx;

        FAULT(CUDA_FAKE_CTX_POP_CURRENT);
        if (!ctx_top)
                return CUDA_ERROR_INVALID_CONTEXT;
        ctx = ctx_stack[--ctx_top];
        if (ret)
                *ret = ctx;
        LOG(CUDA_FAKE_CTX_POP_CURRENT, .ptr = (uintptr_t)ctx);
        return CUDA_SUCCESS;
}

#define PUT(type, value)                                                                           \
        do {                                                                                       \
                type put_ = (value);                                                               \
                memcpy(data, &put_, sizeof(put_));                                                 \
        } while (0)

static CUresult fake_PointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
        struct region *r, *res;
        CUresult ret = CUDA_SUCCESS;

        FAULT(CUDA_FAKE_POINTER_GET_ATTRIBUTE);
        if (!data)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        r = region_at(ptr, MEMORY_KINDS);
        res = r && r->kind == R_MAP ? r->reservation : region_at(ptr, 1u << R_RESERVE);
        if (!r && !res) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (!r) {
                /* reserved address space with nothing mapped there */
                switch (attribute) {
                case CU_POINTER_ATTRIBUTE_MAPPED:
                        PUT(bool, false);
                        break;
                case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
                        PUT(CUdeviceptr, res->base);
                        break;
                case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
                        PUT(size_t, res->size);
                        break;
                default:
                        ret = CUDA_ERROR_INVALID_VALUE;
                }
                pthread_mutex_unlock(&lock);
                return ret;
        }
        switch (attribute) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
                PUT(CUcontext, r->kind == R_IPC && r->ctx ? r->ctx : &contexts[r->device]);
                break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
                PUT(unsigned int, r->kind == R_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE);
                break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
                PUT(CUdeviceptr, ptr);
                break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
                if (r->kind == R_HOST)
                        PUT(void *, (void *)(uintptr_t)ptr);
                else
                        ret = CUDA_ERROR_INVALID_VALUE;
                break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
                PUT(unsigned long long, r->buffer_id);
                break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
                PUT(bool, r->kind == R_ALLOC && r->alloc_kind == CUDA_FAKE_MEMORY_MANAGED);
                break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
                if (ordinal_of(r->device) < 0)
                        ret = CUDA_ERROR_INVALID_VALUE;
                else
                        PUT(int, ordinal_of(r->device));
                break;
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
                PUT(bool, r->kind == R_ALLOC && r->alloc_kind == CUDA_FAKE_MEMORY_PLAIN);
                break;
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
                PUT(void *, r->kind == R_ALLOC && r->alloc_kind == CUDA_FAKE_MEMORY_POOL
                                    ? (void *)&contexts[r->device]
                                    : NULL);
                break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
                PUT(CUdeviceptr, res ? res->base : r->base);
                break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
                PUT(size_t, res ? res->size : r->size);
                break;
        case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
                PUT(void *, (void *)r->base);
                break;
        case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
                PUT(size_t, r->size);
                break;
        case CU_POINTER_ATTRIBUTE_MAPPED:
                PUT(bool, true);
                break;
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
                PUT(unsigned long long, r->kind == R_MAP ? r->handle_types : 0);
                break;
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
                if (r->kind == R_MAP)
                        PUT(unsigned int, r->access);
                else if (r->kind == R_HOST && (r->access & CU_MEMHOSTREGISTER_READ_ONLY))
                        PUT(unsigned int, CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ);
                else
                        PUT(unsigned int, CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
                break;
        default:
                ret = CUDA_ERROR_NOT_SUPPORTED;
        }
        pthread_mutex_unlock(&lock);
        return ret;
}

static CUresult fake_MemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
        struct region *r;

        FAULT(CUDA_FAKE_MEM_GET_ADDRESS_RANGE);
        pthread_mutex_lock(&lock);
        r = region_at(ptr, MEMORY_KINDS);
        if (r) {
                if (base)
                        *base = r->base;
                if (size)
                        *size = r->size;
        }
        pthread_mutex_unlock(&lock);
        return r ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* --- legacy IPC memory ------------------------------------------------------------------------ */

CUdeviceptr cuda_fake_malloc(size_t size)
{
        return cuda_fake_malloc_kind(size, CUDA_FAKE_MEMORY_PLAIN);
}

CUdeviceptr cuda_fake_malloc_kind(size_t size, enum cuda_fake_memory kind)
{
        CUresult fault;
        char name[64];
        struct region *r;
        uint64_t nonce;
        size_t len;
        void *p;
        int fd;

        if (take_fault(CUDA_FAKE_MALLOC, &fault) || !size)
                return 0;
        len = round_up(size, page_size());
        pthread_mutex_lock(&lock);
        nonce = random_nonce();
        pthread_mutex_unlock(&lock);
        snprintf(name, sizeof(name), ALLOC_NAME "%016llx", (unsigned long long)nonce);
        fd = memfd_create(name, MFD_CLOEXEC);
        if (fd < 0)
                return 0;
        if (ftruncate(fd, (off_t)len) < 0) {
                close(fd);
                return 0;
        }
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
                close(fd);
                return 0;
        }
        pthread_mutex_lock(&lock);
        r = region_new(R_ALLOC, (uintptr_t)p, size);
        if (r) {
                r->len = len;
                r->fd = fd;
                r->nonce = nonce;
                r->device = current_device();
                r->alloc_kind = kind;
        }
        pthread_mutex_unlock(&lock);
        if (!r) {
                munmap(p, len);
                close(fd);
                return 0;
        }
        LOG(CUDA_FAKE_MALLOC, .ptr = (uintptr_t)p, .size = size);
        return (uintptr_t)p;
}

CUresult cuda_fake_free(CUdeviceptr ptr)
{
        struct region *r;
        size_t size;

        FAULT(CUDA_FAKE_FREE);
        pthread_mutex_lock(&lock);
        r = region_based(ptr, R_ALLOC);
        if (!r) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        check_no_work("cuda_fake_free", r->base, r->size);
        munmap((void *)r->base, r->len);
        close(r->fd);
        size = r->size;
        region_remove(r);
        pthread_mutex_unlock(&lock);
        LOG(CUDA_FAKE_FREE, .ptr = ptr, .size = size);
        return CUDA_SUCCESS;
}

static CUresult fake_IpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr ptr)
{
        struct ipc_mem_wire w;
        struct region *r;

        FAULT(CUDA_FAKE_IPC_GET_MEM_HANDLE);
        NEED_CTX();
        if (!handle)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        r = region_based(ptr, R_ALLOC);
        /* pools and managed memory have no legacy IPC handle */
        if (!r || r->alloc_kind != CUDA_FAKE_MEMORY_PLAIN) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        memset(&w, 0, sizeof(w));
        w.pidns = pid_namespace();
        w.magic = IPC_MEM_MAGIC;
        w.pid = getpid();
        w.fd = r->fd;
        w.device = r->device;
        w.size = r->size;
        w.nonce = r->nonce;
        pthread_mutex_unlock(&lock);
        memcpy(handle->reserved, &w, sizeof(w));
        LOG(CUDA_FAKE_IPC_GET_MEM_HANDLE, .ptr = ptr, .size = w.size);
        return CUDA_SUCCESS;
}

static CUresult fake_IpcOpenMemHandle(CUdeviceptr *ptr, CUipcMemHandle handle, unsigned int flags)
{
        char path[64], want[64], name[256];
        struct ipc_mem_wire w;
        struct region *r;
        struct stat st;
        size_t len, n;
        void *p;
        int fd;

        FAULT(CUDA_FAKE_IPC_OPEN_MEM_HANDLE);
        NEED_CTX();
        memcpy(&w, handle.reserved, sizeof(w));
        if (!ptr || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ||
            w.magic != IPC_MEM_MAGIC || w.fd < 0 || !w.size || w.device < 0 ||
            w.device >= CUDA_FAKE_MAX_DEVICES)
                return CUDA_ERROR_INVALID_VALUE;
        if (w.pid == getpid())
                return CUDA_ERROR_INVALID_CONTEXT;
        /* legacy IPC finds its exporter by pid: not from another PID namespace */
        if (w.pidns != pid_namespace())
                return CUDA_ERROR_INVALID_VALUE;

        pthread_mutex_lock(&lock);
        for (r = regions; r; r = r->next)
                if (r->kind == R_IPC && r->nonce == w.nonce)
                        break;
        if (r) {
                CUresult ret = CUDA_ERROR_ALREADY_MAPPED;
                if (ipc_refcount) {
                        r->refs++;
                        *ptr = r->base;
                        ret = CUDA_SUCCESS;
                }
                pthread_mutex_unlock(&lock);
                if (ret == CUDA_SUCCESS)
                        LOG(CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .ptr = *ptr, .size = w.size,
                            .aux = (uint64_t)w.pid);
                return ret;
        }

        /* The exporter's memfd, checked by name: its fd number may have been reused. */
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)w.pid, (int)w.fd);
        snprintf(want, sizeof(want), ALLOC_NAME "%016llx", (unsigned long long)w.nonce);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
                pthread_mutex_unlock(&lock);
                return errno == ENOENT || errno == ESRCH ? CUDA_ERROR_INVALID_VALUE
                                                         : CUDA_ERROR_MAP_FAILED;
        }
        len = round_up(w.size, page_size());
        n = strlen(want);
        /* the link reads "/memfd:<name> (deleted)" */
        if (!memfd_named(fd, want, name, sizeof(name)) || (name[n] && name[n] != ' ') ||
            fstat(fd, &st) < 0 || (size_t)st.st_size < len) {
                close(fd);
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_MAP_FAILED;
        }
        r = region_new(R_IPC, (uintptr_t)p, w.size);
        if (!r) {
                munmap(p, len);
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        r->len = len;
        r->nonce = w.nonce;
        r->peer = w.pid;
        r->refs = 1;
        r->device = w.device;
        r->ctx = current_ctx();
        *ptr = (uintptr_t)p;
        pthread_mutex_unlock(&lock);
        LOG(CUDA_FAKE_IPC_OPEN_MEM_HANDLE, .ptr = (uintptr_t)p, .size = w.size,
            .aux = (uint64_t)w.pid);
        return CUDA_SUCCESS;
}

static CUresult fake_IpcCloseMemHandle(CUdeviceptr ptr)
{
        struct region *r;
        unsigned refs;

        FAULT(CUDA_FAKE_IPC_CLOSE_MEM_HANDLE);
        NEED_CTX();
        pthread_mutex_lock(&lock);
        r = region_based(ptr, R_IPC);
        /* Stricter than documented: a mapping is closed in the context that opened it (in
         * another, the driver does not find it, and it leaks). */
        if (!r || r->ctx != current_ctx()) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        refs = --r->refs;
        if (!refs) {
                check_no_work("IpcCloseMemHandle", r->base, r->size);
                munmap((void *)r->base, r->len);
                region_remove(r);
        }
        pthread_mutex_unlock(&lock);
        LOG(CUDA_FAKE_IPC_CLOSE_MEM_HANDLE, .ptr = ptr, .aux = refs);
        return CUDA_SUCCESS;
}

/* --- events ------------------------------------------------------------------------------------
 */

/* The live event ev of this process, or NULL; never dereferences a stranger's pointer. */
static struct CUevent_st *event_find(CUevent ev)
{
        struct CUevent_st *e;

        for (e = events; e; e = e->next)
                if (e == ev)
                        return e;
        return NULL;
}

static struct CUevent_st *event_new(unsigned flags, uint64_t id, bool imported)
{
        struct CUevent_st *e = calloc(1, sizeof(*e));

        if (!e)
                return NULL;
        e->flags = flags;
        e->id = id ? id : ((uint64_t)getpid() << 32) | ++last_event;
        e->imported = imported;
        e->ctx = current_ctx();
        e->next = events;
        events = e;
        return e;
}

/* An opened event whose exporter destroyed the original is unusable (undefined in the driver). */
static bool event_usable(const struct CUevent_st *e)
{
        return !e->imported || !(slot_state(e->id) & SLOT_DESTROYED);
}

uint64_t cuda_fake_event_id(CUevent event)
{
        struct CUevent_st *e;
        uint64_t id;

        pthread_mutex_lock(&lock);
        e = event_find(event);
        id = e ? e->id : 0;
        pthread_mutex_unlock(&lock);
        return id;
}

int cuda_fake_event_hold(uint64_t event_id, bool hold)
{
        struct event_slot *slot = slot_find(event_id, hold);

        if (!slot)
                return hold ? -ENOSPC : 0;
        if (hold)
                __atomic_fetch_or(&slot->state, SLOT_HELD, __ATOMIC_ACQ_REL);
        else
                __atomic_fetch_and(&slot->state, ~(uint32_t)SLOT_HELD, __ATOMIC_ACQ_REL);
        return 0;
}

static CUresult fake_EventCreate(CUevent *event, unsigned int flags)
{
        const unsigned known =
                CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
        struct CUevent_st *e;
        uint64_t id;

        FAULT(CUDA_FAKE_EVENT_CREATE);
        NEED_CTX();
        if (!event || (flags & ~known) ||
            ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        e = event_new(flags, 0, false);
        id = e ? e->id : 0;
        pthread_mutex_unlock(&lock);
        if (!e)
                return CUDA_ERROR_OUT_OF_MEMORY;
        *event = e;
        LOG(CUDA_FAKE_EVENT_CREATE, .event = id, .aux = flags);
        return CUDA_SUCCESS;
}

static CUresult fake_EventDestroy(CUevent event)
{
        struct CUevent_st **p, *e = NULL;

        FAULT(CUDA_FAKE_EVENT_DESTROY);
        pthread_mutex_lock(&lock);
        for (p = &events; *p; p = &(*p)->next) {
                if (*p == event) {
                        e = *p;
                        *p = e->next;
                        break;
                }
        }
        pthread_mutex_unlock(&lock);
        if (!e)
                return CUDA_ERROR_INVALID_HANDLE;
        /* only its creator ends an exported event, not a child that inherited a copy */
        if (!e->imported && CUDA_FAKE_EVENT_PID(e->id) == getpid()) {
                struct event_slot *slot = slot_find(e->id, false);
                if (slot)
                        __atomic_fetch_or(&slot->state, SLOT_DESTROYED, __ATOMIC_ACQ_REL);
        }
        LOG(CUDA_FAKE_EVENT_DESTROY, .event = e->id, .aux = e->flags);
        free(e);
        return CUDA_SUCCESS;
}

/* Looks event up and checks it is usable: CUDA_SUCCESS with *ret_id, or the error to return. */
static CUresult event_use(CUevent event, uint64_t *ret_id, struct CUevent_st *ret_copy)
{
        struct CUevent_st *e;
        CUresult r = CUDA_SUCCESS;

        pthread_mutex_lock(&lock);
        e = event_find(event);
        if (!e)
                r = CUDA_ERROR_INVALID_HANDLE;
        else if (!event_usable(e))
                r = CUDA_ERROR_INVALID_HANDLE;
        else {
                *ret_id = e->id;
                if (ret_copy)
                        *ret_copy = *e;
        }
        pthread_mutex_unlock(&lock);
        return r;
}

static CUresult fake_EventRecord(CUevent event, CUstream stream)
{
        struct CUevent_st *e;
        CUcontext ctx = NULL;
        uint64_t id;
        CUresult r;

        FAULT(CUDA_FAKE_EVENT_RECORD);
        NEED_CTX();
        r = event_use(event, &id, NULL);
        if (r != CUDA_SUCCESS)
                return r;
        pthread_mutex_lock(&lock);
        r = stream_ctx(stream, &ctx);
        e = event_find(event);
        /* the event and the stream must be of one context (the driver's rule) */
        if (r == CUDA_SUCCESS && (!e || e->ctx != ctx))
                r = CUDA_ERROR_INVALID_HANDLE;
        if (r == CUDA_SUCCESS) {
                e->covers = stream;
                e->covers_seq = last_work;
        }
        pthread_mutex_unlock(&lock);
        if (r != CUDA_SUCCESS)
                return r;
        LOG(CUDA_FAKE_EVENT_RECORD, .event = id, .stream = (uintptr_t)stream);
        return CUDA_SUCCESS;
}

/* The work an event covers is done (its wait or query said so). */
static void event_done(CUevent event)
{
        struct CUevent_st *e;

        pthread_mutex_lock(&lock);
        e = event_find(event);
        if (e && !e->imported)
                work_done(e->covers, e->covers_seq);
        pthread_mutex_unlock(&lock);
}

static CUresult fake_EventQuery(CUevent event)
{
        uint64_t id;
        CUresult r;

        FAULT(CUDA_FAKE_EVENT_QUERY);
        r = event_use(event, &id, NULL);
        if (r != CUDA_SUCCESS)
                return r;
        if (slot_state(id) & SLOT_HELD)
                return CUDA_ERROR_NOT_READY;
        event_done(event);
        return CUDA_SUCCESS;
}

static CUresult fake_EventSynchronize(CUevent event)
{
        const struct timespec tick = {0, 1000000};
        uint64_t id;
        CUresult r;

        FAULT(CUDA_FAKE_EVENT_SYNCHRONIZE);
        r = event_use(event, &id, NULL);
        if (r != CUDA_SUCCESS)
                return r;
        /* a held event completes when the test lets it go, from another thread or process */
        while (slot_state(id) & SLOT_HELD)
                nanosleep(&tick, NULL);
        event_done(event);
        LOG(CUDA_FAKE_EVENT_SYNCHRONIZE, .event = id);
        return CUDA_SUCCESS;
}

static CUresult fake_StreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
        uint64_t id;
        CUresult r;

        FAULT(CUDA_FAKE_STREAM_WAIT_EVENT);
        NEED_CTX();
        if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
                return CUDA_ERROR_INVALID_VALUE;
        r = event_use(event, &id, NULL);
        if (r != CUDA_SUCCESS)
                return r;
        /* the event may be of another context or device than the stream, which must be known */
        pthread_mutex_lock(&lock);
        {
                CUcontext ctx;
                r = stream_ctx(stream, &ctx);
        }
        pthread_mutex_unlock(&lock);
        if (r != CUDA_SUCCESS)
                return r;
        LOG(CUDA_FAKE_STREAM_WAIT_EVENT, .event = id, .stream = (uintptr_t)stream, .aux = flags);
        return CUDA_SUCCESS;
}

static CUresult fake_IpcGetEventHandle(CUipcEventHandle *handle, CUevent event)
{
        const unsigned need = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
        struct ipc_event_wire w;
        struct CUevent_st e;
        uint64_t id;
        CUresult r;

        FAULT(CUDA_FAKE_IPC_GET_EVENT_HANDLE);
        if (!handle)
                return CUDA_ERROR_INVALID_VALUE;
        r = event_use(event, &id, &e);
        if (r != CUDA_SUCCESS)
                return r;
        if (e.imported || (e.flags & need) != need)
                return CUDA_ERROR_INVALID_VALUE;
        if (!slot_find(id, true))
                return CUDA_ERROR_OUT_OF_MEMORY;
        memset(&w, 0, sizeof(w));
        w.magic = IPC_EVENT_MAGIC;
        w.pid = getpid();
        w.id = id;
        w.flags = e.flags;
        w.pidns = pid_namespace();
        memcpy(handle->reserved, &w, sizeof(w));
        LOG(CUDA_FAKE_IPC_GET_EVENT_HANDLE, .event = id);
        return CUDA_SUCCESS;
}

static CUresult fake_IpcOpenEventHandle(CUevent *event, CUipcEventHandle handle)
{
        struct ipc_event_wire w;
        struct CUevent_st *e;

        FAULT(CUDA_FAKE_IPC_OPEN_EVENT_HANDLE);
        NEED_CTX();
        memcpy(&w, handle.reserved, sizeof(w));
        if (!event || w.magic != IPC_EVENT_MAGIC || !w.id || CUDA_FAKE_EVENT_PID(w.id) != w.pid)
                return CUDA_ERROR_INVALID_VALUE;
        if (w.pid == getpid())
                return CUDA_ERROR_INVALID_CONTEXT;
        if (w.pidns != pid_namespace() || !pid_alive(w.pid) || (slot_state(w.id) & SLOT_DESTROYED))
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        e = event_new(w.flags, w.id, true);
        pthread_mutex_unlock(&lock);
        if (!e)
                return CUDA_ERROR_OUT_OF_MEMORY;
        *event = e;
        LOG(CUDA_FAKE_IPC_OPEN_EVENT_HANDLE, .event = w.id);
        return CUDA_SUCCESS;
}

static CUresult fake_StreamGetCtx(CUstream stream, CUcontext *ret)
{
        CUresult r;

        FAULT(CUDA_FAKE_STREAM_GET_CTX);
        if (!ret)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        r = stream_ctx(stream, ret);
        pthread_mutex_unlock(&lock);
        return r;
}

static CUresult fake_StreamSynchronize(CUstream stream)
{
        CUcontext ctx;
        CUresult r;

        FAULT(CUDA_FAKE_STREAM_SYNCHRONIZE);
        pthread_mutex_lock(&lock);
        r = stream_ctx(stream, &ctx);
        if (r == CUDA_SUCCESS)
                work_done(stream, UINT64_MAX);
        pthread_mutex_unlock(&lock);
        if (r != CUDA_SUCCESS)
                return r;
        LOG(CUDA_FAKE_STREAM_SYNCHRONIZE, .stream = (uintptr_t)stream);
        return CUDA_SUCCESS;
}

static CUresult fake_DeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
        int physical;

        FAULT(CUDA_FAKE_DEVICE_GET_UUID);
        if (!uuid)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        physical = valid_device(dev) ? visible[dev] : -1;
        pthread_mutex_unlock(&lock);
        if (physical < 0)
                return CUDA_ERROR_INVALID_DEVICE;
        cuda_fake_uuid(physical, uuid);
        return CUDA_SUCCESS;
}

void cuda_fake_uuid(int physical, CUuuid *ret)
{
        memset(ret->bytes, 0, sizeof(ret->bytes));
        memcpy(ret->bytes, "fakegpu-", 8);
        ret->bytes[15] = (char)physical;
}

/* --- VMM ------------------------------------------------------------------------------------- */

/* lock held */
static CUresult check_prop(const CUmemAllocationProp *prop)
{
        if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
            prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
                return CUDA_ERROR_INVALID_VALUE;
        if (!valid_device(prop->location.id))
                return CUDA_ERROR_INVALID_DEVICE;
        if (prop->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                return CUDA_ERROR_NOT_SUPPORTED;
        return CUDA_SUCCESS;
}

static CUresult fake_MemGetAllocationGranularity(size_t *ret, const CUmemAllocationProp *prop,
                                                 CUmemAllocationGranularity_flags option)
{
        CUresult r;

        FAULT(CUDA_FAKE_MEM_GET_ALLOCATION_GRANULARITY);
        if (!ret || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                     option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        r = check_prop(prop);
        if (r == CUDA_SUCCESS)
                *ret = granularity;
        pthread_mutex_unlock(&lock);
        return r;
}

static struct mem_handle *handle_find(CUmemGenericAllocationHandle id)
{
        struct mem_handle *h;

        for (h = handles; h; h = h->next)
                if (h->id == id)
                        return h;
        return NULL;
}

static struct mem_handle *handle_new(int fd, size_t size, int device, uint64_t types)
{
        struct mem_handle *h = calloc(1, sizeof(*h));

        if (!h)
                return NULL;
        h->id = HANDLE_TAG | ++last_handle;
        h->fd = fd;
        h->size = size;
        h->device = device;
        h->handle_types = types;
        h->next = handles;
        handles = h;
        return h;
}

static CUresult fake_MemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
        struct mem_handle *h;
        char name[64];
        CUresult r;
        int fd;

        FAULT(CUDA_FAKE_MEM_CREATE);
        if (!handle || flags)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        r = check_prop(prop);
        if (r == CUDA_SUCCESS && (!size || size % granularity))
                r = CUDA_ERROR_INVALID_VALUE;
        if (r != CUDA_SUCCESS) {
                pthread_mutex_unlock(&lock);
                return r;
        }
        snprintf(name, sizeof(name), VMM_NAME "%d", visible[prop->location.id]);
        fd = memfd_create(name, MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)size) < 0 ||
            !(h = handle_new(fd, size, visible[prop->location.id], prop->requestedHandleTypes))) {
                if (fd >= 0)
                        close(fd);
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *handle = h->id;
        pthread_mutex_unlock(&lock);
        LOG(CUDA_FAKE_MEM_CREATE, .aux = *handle, .size = size);
        return CUDA_SUCCESS;
}

static CUresult fake_MemRelease(CUmemGenericAllocationHandle handle)
{
        struct mem_handle **p, *h = NULL;

        FAULT(CUDA_FAKE_MEM_RELEASE);
        pthread_mutex_lock(&lock);
        for (p = &handles; *p; p = &(*p)->next) {
                if ((*p)->id == handle) {
                        h = *p;
                        *p = h->next;
                        break;
                }
        }
        pthread_mutex_unlock(&lock);
        if (!h)
                return CUDA_ERROR_INVALID_VALUE;
        close(h->fd);
        free(h);
        LOG(CUDA_FAKE_MEM_RELEASE, .aux = handle);
        return CUDA_SUCCESS;
}

static CUresult fake_MemRetainAllocationHandle(CUmemGenericAllocationHandle *ret, void *addr)
{
        struct mem_handle *h, *nh = NULL;
        struct region *r;
        int fd = -1;

        FAULT(CUDA_FAKE_MEM_RETAIN_ALLOCATION_HANDLE);
        if (!ret)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        r = region_at((uintptr_t)addr, 1u << R_MAP);
        /* stricter: the fake finds a mapping's memory through its handle, kept alive */
        h = r ? handle_find(r->handle) : NULL;
        if (h && (fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0)) >= 0)
                nh = handle_new(fd, h->size, h->device, h->handle_types);
        if (nh)
                *ret = nh->id;
        pthread_mutex_unlock(&lock);
        if (!h)
                return CUDA_ERROR_INVALID_VALUE;
        if (!nh) {
                if (fd >= 0)
                        close(fd);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        LOG(CUDA_FAKE_MEM_RETAIN_ALLOCATION_HANDLE, .aux = *ret, .ptr = (uintptr_t)addr);
        return CUDA_SUCCESS;
}

static CUresult fake_MemExportToShareableHandle(void *shareable,
                                                CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType type,
                                                unsigned long long flags)
{
        struct mem_handle *h;
        CUresult r = CUDA_SUCCESS;
        int fd = -1;

        FAULT(CUDA_FAKE_MEM_EXPORT_TO_SHAREABLE_HANDLE);
        if (!shareable || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        h = handle_find(handle);
        if (!h || !(h->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
                r = CUDA_ERROR_INVALID_VALUE;
        else if ((fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0)) < 0)
                r = CUDA_ERROR_OUT_OF_MEMORY;
        pthread_mutex_unlock(&lock);
        if (r != CUDA_SUCCESS)
                return r;
        *(int *)shareable = fd;
        LOG(CUDA_FAKE_MEM_EXPORT_TO_SHAREABLE_HANDLE, .aux = handle, .size = (uint64_t)fd);
        return CUDA_SUCCESS;
}

static CUresult fake_MemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                  void *shareable, CUmemAllocationHandleType type)
{
        uintptr_t raw = (uintptr_t)shareable;
        char name[256];
        struct mem_handle *h;
        struct stat st;
        int fd, device = 0;

        FAULT(CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE);
        if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || raw > INT32_MAX)
                return CUDA_ERROR_INVALID_VALUE;
        if (!memfd_named((int)raw, VMM_NAME, name, sizeof(name)) || fstat((int)raw, &st) < 0 ||
            st.st_size <= 0)
                return CUDA_ERROR_INVALID_VALUE;
        sscanf(name + strlen(VMM_NAME), "%d", &device);
        fd = fcntl((int)raw, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
        if (device < 0 || device >= CUDA_FAKE_MAX_DEVICES)
                device = 0;
        pthread_mutex_lock(&lock);
        h = handle_new(fd, (size_t)st.st_size, device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (h)
                *handle = h->id;
        pthread_mutex_unlock(&lock);
        if (!h) {
                close(fd);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        LOG(CUDA_FAKE_MEM_IMPORT_FROM_SHAREABLE_HANDLE, .aux = *handle,
            .size = (uint64_t)st.st_size);
        return CUDA_SUCCESS;
}

static CUresult fake_MemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags)
{
        uintptr_t start, aligned;
        struct region *r;
        size_t align;
        void *p;

        FAULT(CUDA_FAKE_MEM_ADDRESS_RESERVE);
        (void)addr; /* only a hint to the driver too */
        pthread_mutex_lock(&lock);
        align = alignment > granularity ? alignment : granularity;
        if (!ptr || flags || !size || size % granularity || (alignment & (alignment - 1)) ||
            size + align < size) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        p = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        start = (uintptr_t)p;
        aligned = round_up(start, align);
        if (aligned > start)
                munmap(p, aligned - start);
        if (start + align > aligned)
                munmap((void *)(aligned + size), start + align - aligned);
        r = region_new(R_RESERVE, aligned, size);
        if (!r) {
                munmap((void *)aligned, size);
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *ptr = aligned;
        pthread_mutex_unlock(&lock);
        LOG(CUDA_FAKE_MEM_ADDRESS_RESERVE, .ptr = aligned, .size = size);
        return CUDA_SUCCESS;
}

static CUresult fake_MemAddressFree(CUdeviceptr ptr, size_t size)
{
        struct region *r, *m;

        FAULT(CUDA_FAKE_MEM_ADDRESS_FREE);
        pthread_mutex_lock(&lock);
        r = region_based(ptr, R_RESERVE);
        /* Stricter than the driver: mappings left inside would be leaked there. */
        for (m = regions; r && m; m = m->next)
                if (m->kind == R_MAP && m->reservation == r)
                        r = NULL;
        if (!r || r->size != size) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        munmap((void *)r->base, r->size);
        region_remove(r);
        pthread_mutex_unlock(&lock);
        LOG(CUDA_FAKE_MEM_ADDRESS_FREE, .ptr = ptr, .size = size);
        return CUDA_SUCCESS;
}

/* Puts inaccessible reserved address space back over [base, base + size). */
static void rereserve(uintptr_t base, size_t size)
{
        mmap((void *)base, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
             -1, 0);
}

static CUresult fake_MemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
        struct mem_handle *h;
        struct region *res, *r;
        void *p;

        FAULT(CUDA_FAKE_MEM_MAP);
        pthread_mutex_lock(&lock);
        h = handle_find(handle);
        res = region_at(ptr, 1u << R_RESERVE);
        if (flags || offset || !size || size % granularity || ptr % granularity || !h ||
            size > h->size || !res || ptr + size > res->base + res->size) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        for (r = regions; r; r = r->next) {
                if (r->kind == R_MAP && r->base < ptr + size && ptr < r->base + r->size) {
                        pthread_mutex_unlock(&lock);
                        return CUDA_ERROR_INVALID_VALUE;
                }
        }
        /* Mappings start inaccessible; MemSetAccess opens them. */
        p = mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, 0);
        if (p == MAP_FAILED) {
                int e = errno;
                rereserve(ptr, size);
                pthread_mutex_unlock(&lock);
                return e == ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
        }
        r = region_new(R_MAP, ptr, size);
        if (!r) {
                rereserve(ptr, size);
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        r->device = h->device;
        r->handle_types = h->handle_types;
        r->handle = handle;
        r->access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
        r->reservation = res;
        pthread_mutex_unlock(&lock);
        LOG(CUDA_FAKE_MEM_MAP, .ptr = ptr, .size = size, .aux = handle);
        return CUDA_SUCCESS;
}

static CUresult fake_MemUnmap(CUdeviceptr ptr, size_t size)
{
        struct region *r, *next;

        FAULT(CUDA_FAKE_MEM_UNMAP);
        pthread_mutex_lock(&lock);
        if (whole_mappings(ptr, size) <= 0) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        check_no_work("MemUnmap", ptr, size);
        for (r = regions; r; r = next) {
                next = r->next;
                if (r->kind == R_MAP && r->base >= ptr && r->base < ptr + size) {
                        rereserve(r->base, r->size);
                        region_remove(r);
                }
        }
        pthread_mutex_unlock(&lock);
        LOG(CUDA_FAKE_MEM_UNMAP, .ptr = ptr, .size = size);
        return CUDA_SUCCESS;
}

static CUresult fake_MemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                  size_t count)
{
        unsigned access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
        struct region *r;
        size_t i;
        int prot;

        FAULT(CUDA_FAKE_MEM_SET_ACCESS);
        if (!desc || !count)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        for (i = 0; i < count; i++) {
                unsigned f = (unsigned)desc[i].flags;
                CUresult bad = CUDA_SUCCESS;
                if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
                    (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
                     f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
                        bad = CUDA_ERROR_INVALID_VALUE;
                else if (!valid_device(desc[i].location.id))
                        bad = CUDA_ERROR_INVALID_DEVICE;
                if (bad != CUDA_SUCCESS) {
                        pthread_mutex_unlock(&lock);
                        return bad;
                }
                /* One host stands for every device: the widest access wins. */
                access |= f;
        }
        if (access == CU_MEM_ACCESS_FLAGS_PROT_READ && refuse_read_only) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_NOT_SUPPORTED;
        }
        if (whole_mappings(ptr, size) <= 0) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        prot = access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
               : access == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                            : PROT_NONE;
        if (mprotect((void *)ptr, size, prot) < 0) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        for (r = regions; r; r = r->next)
                if (r->kind == R_MAP && r->base >= ptr && r->base < ptr + size)
                        r->access = access;
        pthread_mutex_unlock(&lock);
        LOG(CUDA_FAKE_MEM_SET_ACCESS, .ptr = ptr, .size = size, .aux = access);
        return CUDA_SUCCESS;
}

/* --- host registration and copies ------------------------------------------------------------ */

static CUresult fake_MemHostRegister(void *p, size_t size, unsigned int flags)
{
        const unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                               CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
        uintptr_t base = (uintptr_t)p;
        struct region *r;

        FAULT(CUDA_FAKE_MEM_HOST_REGISTER);
        NEED_CTX();
        if (!p || !size || (flags & ~known) || base + size < base)
                return CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        for (r = regions; r; r = r->next) {
                if (r->kind == R_HOST && r->base < base + size && base < r->base + r->size) {
                        pthread_mutex_unlock(&lock);
                        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
                }
        }
        /* Pinning needs the pages mapped, and writable unless registered read-only. */
        if (check_host_range(base, size, !(flags & CU_MEMHOSTREGISTER_READ_ONLY)) < 0) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_INVALID_VALUE;
        }
        r = region_new(R_HOST, base, size);
        if (r) {
                r->access = flags;
                r->device = current_device();
        }
        pthread_mutex_unlock(&lock);
        if (!r)
                return CUDA_ERROR_OUT_OF_MEMORY;
        LOG(CUDA_FAKE_MEM_HOST_REGISTER, .ptr = base, .size = size, .aux = flags);
        return CUDA_SUCCESS;
}

static CUresult fake_MemHostUnregister(void *p)
{
        struct region *r;
        size_t size = 0;

        FAULT(CUDA_FAKE_MEM_HOST_UNREGISTER);
        NEED_CTX();
        pthread_mutex_lock(&lock);
        r = region_based((uintptr_t)p, R_HOST);
        if (r) {
                size = r->size;
                check_no_work("MemHostUnregister", r->base, r->size);
                region_remove(r);
        }
        pthread_mutex_unlock(&lock);
        if (!r)
                return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
        LOG(CUDA_FAKE_MEM_HOST_UNREGISTER, .ptr = (uintptr_t)p, .size = size);
        return CUDA_SUCCESS;
}

static CUresult copy(enum cuda_fake_op op, uintptr_t dst, uintptr_t src, size_t size,
                     CUstream stream)
{
        FAULT(op);
        NEED_CTX();
        if (size && (!dst || !src))
                return CUDA_ERROR_INVALID_VALUE;
        if (size)
                memmove((void *)dst, (const void *)src, size);
        LOG(op, .ptr = dst, .aux = src, .size = size, .stream = (uintptr_t)stream);
        return CUDA_SUCCESS;
}

static CUresult fake_MemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t size, CUstream stream)
{
        return copy(CUDA_FAKE_MEMCPY_ASYNC, dst, src, size, stream);
}

static CUresult fake_MemcpyDtoH(void *dst, CUdeviceptr src, size_t size)
{
        return copy(CUDA_FAKE_MEMCPY_DTOH, (uintptr_t)dst, src, size, NULL);
}

static CUresult fake_MemcpyHtoD(CUdeviceptr dst, const void *src, size_t size)
{
        return copy(CUDA_FAKE_MEMCPY_HTOD, dst, (uintptr_t)src, size, NULL);
}

static const struct dlx_cuda_driver fake_driver = {
        .Init = fake_Init,
        .GetErrorString = fake_GetErrorString,
        .DeviceGet = fake_DeviceGet,
        .DeviceGetCount = fake_DeviceGetCount,
        .DeviceGetUuid = fake_DeviceGetUuid,
        .DevicePrimaryCtxRetain = fake_DevicePrimaryCtxRetain,
        .CtxPushCurrent = fake_CtxPushCurrent,
        .CtxPopCurrent = fake_CtxPopCurrent,
        .PointerGetAttribute = fake_PointerGetAttribute,
        .MemGetAddressRange = fake_MemGetAddressRange,
        .IpcGetMemHandle = fake_IpcGetMemHandle,
        .IpcOpenMemHandle = fake_IpcOpenMemHandle,
        .IpcCloseMemHandle = fake_IpcCloseMemHandle,
        .IpcGetEventHandle = fake_IpcGetEventHandle,
        .IpcOpenEventHandle = fake_IpcOpenEventHandle,
        .EventCreate = fake_EventCreate,
        .EventDestroy = fake_EventDestroy,
        .EventRecord = fake_EventRecord,
        .EventQuery = fake_EventQuery,
        .EventSynchronize = fake_EventSynchronize,
        .StreamWaitEvent = fake_StreamWaitEvent,
        .StreamGetCtx = fake_StreamGetCtx,
        .StreamSynchronize = fake_StreamSynchronize,
        .MemGetAllocationGranularity = fake_MemGetAllocationGranularity,
        .MemCreate = fake_MemCreate,
        .MemRelease = fake_MemRelease,
        .MemRetainAllocationHandle = fake_MemRetainAllocationHandle,
        .MemExportToShareableHandle = fake_MemExportToShareableHandle,
        .MemImportFromShareableHandle = fake_MemImportFromShareableHandle,
        .MemAddressReserve = fake_MemAddressReserve,
        .MemAddressFree = fake_MemAddressFree,
        .MemMap = fake_MemMap,
        .MemUnmap = fake_MemUnmap,
        .MemSetAccess = fake_MemSetAccess,
        .MemHostRegister = fake_MemHostRegister,
        .MemHostUnregister = fake_MemHostUnregister,
        .MemcpyAsync = fake_MemcpyAsync,
        .MemcpyDtoH = fake_MemcpyDtoH,
        .MemcpyHtoD = fake_MemcpyHtoD,
};

const struct dlx_cuda_driver *cuda_fake_driver(void)
{
        return &fake_driver;
}

/* --- contexts, queries ------------------------------------------------------------------------ */

CUcontext cuda_fake_ctx(int device)
{
        CUcontext ctx = NULL;

        pthread_mutex_lock(&lock);
        if (valid_device(device))
                ctx = &contexts[visible[device]];
        pthread_mutex_unlock(&lock);
        return ctx;
}

CUcontext cuda_fake_ctx_create(int device)
{
        CUcontext ctx = NULL;

        pthread_mutex_lock(&lock);
        if (valid_device(device) && nuser_contexts < MAX_USER_CONTEXTS) {
                ctx = &user_contexts[nuser_contexts++];
                ctx->device = visible[device];
                ctx->primary = false;
        }
        pthread_mutex_unlock(&lock);
        return ctx;
}

int cuda_fake_stream_bind(CUstream stream, CUcontext ctx)
{
        int err = -ENOSPC;

        if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
                return -EINVAL;
        pthread_mutex_lock(&lock);
        for (int i = 0; i < MAX_STREAM_BINDS; i++) {
                if (binds[i].stream == stream) {
                        binds[i].ctx = ctx;
                        if (!ctx)
                                binds[i].stream = NULL;
                        err = 0;
                        break;
                }
        }
        for (int i = 0; i < MAX_STREAM_BINDS && err < 0 && ctx; i++) {
                if (!binds[i].stream) {
                        binds[i].stream = stream;
                        binds[i].ctx = ctx;
                        err = 0;
                }
        }
        if (!ctx && err < 0)
                err = 0;
        pthread_mutex_unlock(&lock);
        return err;
}

int cuda_fake_stream_work(CUstream stream, CUdeviceptr ptr, size_t size)
{
        struct work *w = calloc(1, sizeof(*w));
        CUcontext ctx;
        CUresult r;

        if (!w)
                return -ENOMEM;
        pthread_mutex_lock(&lock);
        r = stream_ctx(stream, &ctx);
        if (r == CUDA_SUCCESS) {
                w->stream = stream;
                w->seq = ++last_work;
                w->ptr = ptr;
                w->size = size;
                w->next = works;
                works = w;
        }
        pthread_mutex_unlock(&lock);
        if (r != CUDA_SUCCESS) {
                free(w);
                return -EINVAL;
        }
        LOG(CUDA_FAKE_STREAM_WORK, .stream = (uintptr_t)stream, .ptr = ptr, .size = size);
        return 0;
}

unsigned cuda_fake_violations(void)
{
        unsigned n;

        pthread_mutex_lock(&lock);
        n = violations;
        pthread_mutex_unlock(&lock);
        return n;
}

int cuda_fake_set_visible_devices(const int *physical, int n)
{
        if (n < 1 || n > CUDA_FAKE_MAX_DEVICES)
                return -EINVAL;
        for (int i = 0; i < n; i++) {
                if (physical[i] < 0 || physical[i] >= CUDA_FAKE_MAX_DEVICES)
                        return -EINVAL;
                for (int j = 0; j < i; j++)
                        if (physical[j] == physical[i])
                                return -EINVAL;
        }
        pthread_mutex_lock(&lock);
        for (int i = 0; i < n; i++)
                visible[i] = physical[i];
        device_count = n;
        pthread_mutex_unlock(&lock);
        return 0;
}

CUcontext cuda_fake_ctx_current(void)
{
        return ctx_top ? ctx_stack[ctx_top - 1] : NULL;
}

int cuda_fake_ctx_depth(void)
{
        return ctx_top;
}

size_t cuda_fake_log_count(void)
{
        struct shared *s = shared_get();
        uint64_t n;

        if (!s)
                return 0;
        n = __atomic_load_n(&s->next, __ATOMIC_ACQUIRE);
        return n < LOG_CAPACITY ? (size_t)n : LOG_CAPACITY;
}

bool cuda_fake_log_entry(size_t i, struct cuda_fake_entry *ret)
{
        struct shared *s = shared_get();

        if (!s || i >= cuda_fake_log_count() ||
            !__atomic_load_n(&s->log[i].ready, __ATOMIC_ACQUIRE))
                return false;
        *ret = s->log[i].e;
        return true;
}

bool cuda_fake_log_overflowed(void)
{
        struct shared *s = shared_get();

        return s && __atomic_load_n(&s->overflowed, __ATOMIC_ACQUIRE);
}

long cuda_fake_find(size_t from, enum cuda_fake_op op, pid_t pid, uint64_t event)
{
        size_t i, n = cuda_fake_log_count();
        struct cuda_fake_entry e;

        for (i = from; i < n; i++)
                if (cuda_fake_log_entry(i, &e) && e.op == op && (!pid || e.pid == pid) &&
                    (!event || e.event == event))
                        return (long)i;
        return -1;
}

int cuda_fake_count(enum cuda_fake_op op, pid_t pid)
{
        long i = -1;
        int n = 0;

        while ((i = cuda_fake_find((size_t)(i + 1), op, pid, 0)) >= 0)
                n++;
        return n;
}

bool cuda_fake_waited(CUstream stream, uint64_t event_id)
{
        long i = cuda_fake_find(0, CUDA_FAKE_EVENT_RECORD, 0, event_id);
        struct cuda_fake_entry e;

        if (!event_id || i < 0)
                return false;
        while ((i = cuda_fake_find((size_t)(i + 1), CUDA_FAKE_STREAM_WAIT_EVENT, 0, event_id)) >= 0)
                if (cuda_fake_log_entry((size_t)i, &e) && e.stream == (uintptr_t)stream)
                        return true;
        return false;
}

int cuda_fake_live(enum cuda_fake_kind kind)
{
        static const int kinds[] = {
                [R_ALLOC] = CUDA_FAKE_ALLOCATION,    [R_IPC] = CUDA_FAKE_IPC_MAPPING,
                [R_RESERVE] = CUDA_FAKE_RESERVATION, [R_MAP] = CUDA_FAKE_MAPPING,
                [R_HOST] = CUDA_FAKE_REGISTRATION,
        };
        struct region *r;
        struct mem_handle *h;
        struct CUevent_st *e;
        int n = 0;

        pthread_mutex_lock(&lock);
        for (r = regions; r; r = r->next)
                n += kinds[r->kind] == (int)kind;
        if (kind == CUDA_FAKE_MEM_HANDLE)
                for (h = handles; h; h = h->next)
                        n++;
        for (e = events; e; e = e->next)
                n += (kind == CUDA_FAKE_EVENT && !e->imported) ||
                     (kind == CUDA_FAKE_IPC_EVENT && e->imported);
        pthread_mutex_unlock(&lock);
        return n;
}

const char *cuda_fake_op_name(enum cuda_fake_op op)
{
        static const char *const names[CUDA_FAKE_OP_COUNT] = {
#define OP(x) [CUDA_FAKE_##x] = "CUDA_FAKE_" #x
                OP(INIT),
                OP(GET_ERROR_STRING),
                OP(DEVICE_GET),
                OP(DEVICE_GET_COUNT),
                OP(DEVICE_GET_UUID),
                OP(DEVICE_PRIMARY_CTX_RETAIN),
                OP(CTX_PUSH_CURRENT),
                OP(CTX_POP_CURRENT),
                OP(POINTER_GET_ATTRIBUTE),
                OP(MEM_GET_ADDRESS_RANGE),
                OP(IPC_GET_MEM_HANDLE),
                OP(IPC_OPEN_MEM_HANDLE),
                OP(IPC_CLOSE_MEM_HANDLE),
                OP(IPC_GET_EVENT_HANDLE),
                OP(IPC_OPEN_EVENT_HANDLE),
                OP(EVENT_CREATE),
                OP(EVENT_DESTROY),
                OP(EVENT_RECORD),
                OP(EVENT_QUERY),
                OP(EVENT_SYNCHRONIZE),
                OP(STREAM_WAIT_EVENT),
                OP(STREAM_GET_CTX),
                OP(STREAM_SYNCHRONIZE),
                OP(MEM_GET_ALLOCATION_GRANULARITY),
                OP(MEM_CREATE),
                OP(MEM_RELEASE),
                OP(MEM_RETAIN_ALLOCATION_HANDLE),
                OP(MEM_EXPORT_TO_SHAREABLE_HANDLE),
                OP(MEM_IMPORT_FROM_SHAREABLE_HANDLE),
                OP(MEM_ADDRESS_RESERVE),
                OP(MEM_ADDRESS_FREE),
                OP(MEM_MAP),
                OP(MEM_UNMAP),
                OP(MEM_SET_ACCESS),
                OP(MEM_HOST_REGISTER),
                OP(MEM_HOST_UNREGISTER),
                OP(MEMCPY_ASYNC),
                OP(MEMCPY_DTOH),
                OP(MEMCPY_HTOD),
                OP(MALLOC),
                OP(FREE),
                OP(STREAM_WORK),
#undef OP
        };

        return (unsigned)op < CUDA_FAKE_OP_COUNT && names[op] ? names[op] : "?";
}
