/* SPDX-License-Identifier: MIT */
/*
 * dlxctl — look at and move tensors in a running dlxd.
 * Exit status: 0 success, 1 error, 2 usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <dlx/dlx.h>
#include <jansson.h>

#include "layout.h"
#include "npy.h"
#include "npz.h"
#include "safetensors.h"
#include "sockpath.h"
#include "tfile.h"
#include "units.h"

#define EXIT_USAGE 2

static const char *socket_path;
static bool json;

/*
 * A command line taken apart: the command and its operands (names, prefixes,
 * files) in order, and the options of commands that have some. main() checks
 * the operand count and which options the command takes before calling it.
 */
struct cmdline {
        int argc;            /* the command itself is argv[0]; argc may pass 4, argv[] keeps 4 */
        char *argv[4];       /* no command takes more than a command and two operands */
        bool writable;       /* put --writable */
        const char *timeout; /* get, watch --timeout MS */
        const char *min_version; /* get --min-version N */
        const char *count;       /* watch --count N */
        bool prometheus;         /* stats --prometheus */
};

static void usage(FILE *f)
{
        fputs("Usage: dlxctl [OPTIONS] COMMAND [ARGS]\n"
              "\n"
              "Commands:\n"
              "  list [PREFIX]                    names, versions, dtypes, shapes and devices\n"
              "  stat NAME                        everything the daemon knows of NAME\n"
              "  put NAME FILE.npy [--writable]   publish a .npy file (persistent: it stays\n"
              "                                   after dlxctl exits, until rm or replaced)\n"
              "  put NAME FILE.safetensors|FILE.npz\n"
              "                                   publish every tensor in the file as one\n"
              "                                   group (persistent, read-only)\n"
              "  get NAME FILE.npy [--timeout MS] [--min-version N]\n"
              "                                   write NAME to a .npy file, waiting up to MS\n"
              "                                   for it (for version N or later)\n"
              "  get NAME FILE.safetensors|FILE.npz [--timeout MS] [--min-version N]\n"
              "                                   write the group NAME to one file\n"
              "  rm NAME                          unpublish NAME\n"
              "  watch [PREFIX] [--count N] [--timeout MS]\n"
              "                                   print events as names change\n"
              "  stats [--prometheus]             the daemon's counters and limits; with\n"
              "                                   --prometheus, its metrics in the Prometheus\n"
              "                                   text format (per-uid series: all uids for\n"
              "                                   dlxd's own uid and root, else the caller's)\n"
              "  peers [SOCKET]                   the federation bridge's peers: who is\n"
              "                                   connected, over what, what moved (asks\n"
              "                                   dlxfed at SOCKET, default: dlxfed.sock\n"
              "                                   next to the daemon socket)\n"
              "\n"
              "Options (before or after the command; after \"--\" every argument is a name,\n"
              "prefix or file, even one that starts with '-'):\n"
              "  -s, --socket PATH  daemon socket (default: $DLX_SOCKET, then\n"
              "                     $XDG_RUNTIME_DIR/dlx/dlxd.sock, then /tmp/dlx-$UID/dlxd.sock)\n"
              "  -j, --json         machine-readable output (list, stat, watch, stats, peers, "
              "put,\n"
              "                     get)\n"
              "  -h, --help         this help\n"
              "  -V, --version      the version\n"
              "\n"
              "Exit status: 0 success, 1 error, 2 usage.\n",
              f);
}

static int fail(int err, const char *what)
{
        const char *detail = dlx_last_error();

        if (detail && *detail)
                fprintf(stderr, "dlxctl: %s: %s\n", what, detail);
        else
                fprintf(stderr, "dlxctl: %s: %s\n", what, dlx_strerror(err));
        return EXIT_FAILURE;
}

static dlx_client *client;

/* Connects on first use, after a command has checked its arguments; exits 1 on failure. */
static dlx_client *ctl_client(void)
{
        struct dlx_connect_options o = {.socket_path = socket_path, .client_name = "dlxctl"};
        int err;

        if (client)
                return client;
        err = dlx_connect(&o, &client);
        if (err < 0)
                exit(fail(err, "cannot connect to dlxd"));
        return client;
}

/* ---- formatting ---------------------------------------------------------------------- */

static void dims_str(const int64_t *dims, int32_t ndim, char *buf, size_t size)
{
        size_t off = 0;

        off += (size_t)snprintf(buf, size, "(");
        for (int32_t i = 0; i < ndim && off < size; i++)
                off += (size_t)snprintf(buf + off, size - off, "%s%" PRId64, i ? ", " : "",
                                        dims[i]);
        if (ndim == 1 && off < size)
                off += (size_t)snprintf(buf + off, size - off, ",");
        if (off < size)
                snprintf(buf + off, size - off, ")");
}

static void json_dims(const int64_t *dims, int32_t ndim)
{
        putchar('[');
        for (int32_t i = 0; i < ndim; i++)
                printf("%s%" PRId64, i ? "," : "", dims[i]);
        putchar(']');
}

/* Names are printable UTF-8, but paths may hold anything: escape what JSON requires. */
static void json_str(const char *s)
{
        putchar('"');
        for (; *s; s++) {
                if (*s == '"' || *s == '\\')
                        printf("\\%c", *s);
                else if ((unsigned char)*s < 0x20)
                        printf("\\u%04x", (unsigned)(unsigned char)*s);
                else
                        putchar(*s);
        }
        putchar('"');
}

static void print_info_json(const struct dlx_info *in)
{
        char dt[48], dev[48];

        layout_dtype_name(in->dtype, dt, sizeof(dt));
        layout_device_name(in->device, dev, sizeof(dev));
        printf("{\"name\":");
        json_str(in->name);
        printf(",\"version\":%" PRIu64 ",\"dtype\":\"%s\",\"dtype_code\":%u,\"bits\":%u,"
               "\"lanes\":%u,\"shape\":",
               in->version, dt, in->dtype.code, in->dtype.bits, in->dtype.lanes);
        json_dims(in->shape, in->ndim);
        printf(",\"strides\":");
        json_dims(in->strides, in->ndim);
        printf(",\"byte_offset\":%" PRIu64 ",\"device\":[%d,%d],\"device_name\":\"%s\","
               "\"read_only\":%s,\"storage\":\"%s\",\"members\":%u,\"nbytes\":%" PRIu64
               ",\"segment\":%" PRIu64 ",\"segment_size\":%" PRIu64
               ",\"owner_uid\":%u,\"producer_pid\":%d,"
               "\"producer\":",
               in->byte_offset, (int)in->device.device_type, in->device.device_id, dev,
               in->flags & DLPACK_FLAG_BITMASK_READ_ONLY ? "true" : "false", in->storage,
               in->members, in->nbytes, in->segment, in->segment_size, in->owner_uid,
               in->producer_pid);
        json_str(in->producer_name);
        printf(",\"persist\":%s,\"leases\":%u,\"live_versions\":%u,\"published_ns\":%" PRIu64
               ",\"origin\":",
               in->persist ? "true" : "false", in->leases, in->live_versions, in->published_ns);
        json_str(in->origin);
        putchar('}');
}

/* ---- commands ------------------------------------------------------------------------- */

struct list_ctx {
        unsigned count;
};

static int list_one(void *ctx, const struct dlx_info *in)
{
        struct list_ctx *l = ctx;
        char dt[48], shape[256], dev[48];

        if (json) {
                printf("%s", l->count ? ",\n " : "");
                print_info_json(in);
        } else {
                layout_dtype_name(in->dtype, dt, sizeof(dt));
                layout_device_name(in->device, dev, sizeof(dev));
                dims_str(in->shape, in->ndim, shape, sizeof(shape));
                if (in->members) {
                        snprintf(dt, sizeof(dt), "group");
                        snprintf(shape, sizeof(shape), "%u members", in->members);
                }
                printf("%-32s %8" PRIu64 " %-14s %-20s %-11s %12" PRIu64 " %6u %s%s%s%s%s\n",
                       in->name, in->version, dt, shape, dev, in->nbytes, in->leases, in->storage,
                       in->persist ? ",persist" : "",
                       in->flags & DLPACK_FLAG_BITMASK_READ_ONLY ? "" : ",writable",
                       in->origin[0] ? "  mirror: " : "", in->origin);
        }
        l->count++;
        return 0;
}

static int cmd_list(const struct cmdline *cl)
{
        struct list_ctx l = {0};
        int n;

        dlx_client *c = ctl_client();
        if (json)
                printf("[");
        else
                printf("%-32s %8s %-14s %-20s %-11s %12s %6s %s\n", "NAME", "VERSION", "DTYPE",
                       "SHAPE", "DEVICE", "BYTES", "LEASES", "FLAGS");
        n = dlx_list(c, cl->argc == 2 ? cl->argv[1] : "", list_one, &l);
        if (json)
                printf("]\n");
        if (n < 0)
                return fail(n, "list");
        return 0;
}

static int cmd_stat(const struct cmdline *cl)
{
        const char *name = cl->argv[1];
        struct dlx_info in;
        char dt[48], shape[512], strides[512], dev[48];
        int err;

        err = dlx_stat(ctl_client(), name, &in);
        if (err < 0)
                return fail(err, name);
        if (json) {
                print_info_json(&in);
                putchar('\n');
                return 0;
        }
        if (in.members) {
                printf("name:          %s\n"
                       "version:       %" PRIu64 "\n"
                       "group:         %u members, %" PRIu64 " bytes of data\n"
                       "access:        read-only\n"
                       "storage:       %s (segment %" PRIu64 ", %" PRIu64 " bytes)\n"
                       "owner uid:     %u\n"
                       "producer:      %s (pid %d%s)\n"
                       "persistent:    %s\n"
                       "leases:        %u\n"
                       "live versions: %u\n",
                       in.name, in.version, in.members, in.nbytes, in.storage, in.segment,
                       in.segment_size, in.owner_uid, in.producer_name, in.producer_pid,
                       in.producer_pid ? "" : ", gone", in.persist ? "yes" : "no", in.leases,
                       in.live_versions);
                if (in.origin[0])
                        printf("origin:        %s\n", in.origin);
                return 0;
        }
        layout_dtype_name(in.dtype, dt, sizeof(dt));
        layout_device_name(in.device, dev, sizeof(dev));
        dims_str(in.shape, in.ndim, shape, sizeof(shape));
        dims_str(in.strides, in.ndim, strides, sizeof(strides));
        printf("name:          %s\n"
               "version:       %" PRIu64 "\n"
               "dtype:         %s (code %u, %u bits, %u lanes)\n"
               "shape:         %s\n"
               "strides:       %s\n"
               "byte_offset:   %" PRIu64 "\n"
               "device:        %s\n"
               "access:        %s\n"
               "storage:       %s (segment %" PRIu64 ", %" PRIu64 " bytes; tensor spans %" PRIu64
               ")\n"
               "owner uid:     %u\n"
               "producer:      %s (pid %d%s)\n"
               "persistent:    %s\n"
               "leases:        %u\n"
               "live versions: %u\n",
               in.name, in.version, dt, in.dtype.code, in.dtype.bits, in.dtype.lanes, shape,
               strides, in.byte_offset, dev,
               in.flags & DLPACK_FLAG_BITMASK_READ_ONLY ? "read-only" : "writable", in.storage,
               in.segment, in.segment_size, in.nbytes, in.owner_uid, in.producer_name,
               in.producer_pid, in.producer_pid ? "" : ", gone", in.persist ? "yes" : "no",
               in.leases, in.live_versions);
        if (in.origin[0])
                printf("origin:        %s\n", in.origin);
        return 0;
}

/* Reads exactly len bytes; the header reader left fd at the data. */
static int read_full(int fd, void *buf, uint64_t len)
{
        uint8_t *p = buf;

        while (len > 0) {
                ssize_t n = read(fd, p, len > (1u << 30) ? (1u << 30) : (size_t)len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -EINVAL;
                p += n;
                len -= (uint64_t)n;
        }
        return 0;
}

/*
 * Below this, put reads into heap memory and publishes a copy: an allocator
 * segment (256 KiB at least) would stay pinned, and charged, for as long as
 * the persistent tensor lives, for a few bytes of it.
 */
#define PUT_COPY_BELOW (UINT64_C(256) << 10)

/* A tensor in heap memory, for put's small files. */
struct heap_tensor {
        DLManagedTensorVersioned mt;
        int64_t shape[DLX_MAX_NDIM], strides[DLX_MAX_NDIM];
        uint8_t data[];
};

static void heap_tensor_deleter(DLManagedTensorVersioned *t)
{
        free(t->manager_ctx);
}

static DLManagedTensorVersioned *heap_tensor(const DLTensor *proto, uint64_t bytes)
{
        struct heap_tensor *h = calloc(1, sizeof(*h) + (bytes ? bytes : 1));

        if (!h)
                return NULL;
        h->mt.version.major = 1;
        h->mt.version.minor = 3;
        h->mt.manager_ctx = h;
        h->mt.deleter = heap_tensor_deleter;
        h->mt.dl_tensor = *proto;
        h->mt.dl_tensor.data = h->data;
        for (int64_t i = proto->ndim - 1, s = 1; i >= 0; i--) {
                h->shape[i] = proto->shape[i];
                h->strides[i] = s;
                s *= proto->shape[i];
        }
        h->mt.dl_tensor.shape = proto->ndim ? h->shape : NULL;
        h->mt.dl_tensor.strides = proto->ndim ? h->strides : NULL;
        return &h->mt;
}

/* A multi-tensor file, by its name's suffix: a group's, or NULL for .npy (anything else). */
static const char *group_file_kind(const char *path)
{
        size_t len = strlen(path);
        static const char *const kinds[] = {".safetensors", ".npz"};

        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
                size_t k = strlen(kinds[i]);
                if (len > k && strcmp(path + len - k, kinds[i]) == 0)
                        return kinds[i];
        }
        return NULL;
}

/* A file's member, borrowed by the group publish: the file outlives it. */
static void borrowed_deleter(DLManagedTensorVersioned *t)
{
        (void)t;
}

static int put_group(const char *name, const char *path, const char *kind, bool writable)
{
        struct dlx_publish_options o = {.persist = true};
        DLManagedTensorVersioned *mts = NULL;
        struct dlx_member *ms = NULL;
        struct tfile *f = NULL;
        char why[512];
        uint64_t version;
        int err;

        if (writable) {
                fprintf(stderr, "dlxctl: %s: a group is read-only: put it without --writable\n",
                        path);
                return EXIT_FAILURE;
        }
        err = strcmp(kind, ".npz") == 0 ? npz_open(path, &f, why, sizeof(why))
                                        : st_open(path, &f, why, sizeof(why));
        if (err < 0) {
                fprintf(stderr, "dlxctl: %s: %s\n", path, why);
                return EXIT_FAILURE;
        }
        if (f->n == 0) {
                fprintf(stderr, "dlxctl: %s: no tensors in it: a group needs one at least\n", path);
                tfile_free(f);
                return EXIT_FAILURE;
        }
        mts = calloc(f->n, sizeof(*mts));
        ms = calloc(f->n, sizeof(*ms));
        if (!mts || !ms) {
                free(mts);
                free(ms);
                tfile_free(f);
                return fail(-ENOMEM, name);
        }
        for (size_t i = 0; i < f->n; i++) {
                mts[i].version.major = 1;
                mts[i].version.minor = 3;
                mts[i].deleter = borrowed_deleter;
                mts[i].dl_tensor = f->members[i].tensor;
                ms[i] = (struct dlx_member){f->members[i].name, &mts[i]};
        }
        /* the one copy: from the file's pages into the group's segment */
        err = dlx_publish_group(ctl_client(), name, ms, f->n, &o, &version);
        size_t n = f->n;
        free(mts);
        free(ms);
        tfile_free(f);
        if (err < 0)
                return fail(err, name);
        if (json) {
                printf("{\"name\":");
                json_str(name);
                printf(",\"version\":%" PRIu64 ",\"members\":%zu}\n", version, n);
        } else
                printf("%s v%" PRIu64 " (%zu members)\n", name, version, n);
        return 0;
}

static int cmd_put(const struct cmdline *cl)
{
        struct dlx_publish_options o = {.persist = true, .writable = cl->writable};
        const char *name = cl->argv[1], *path = cl->argv[2];
        struct npy_info info;
        DLManagedTensorVersioned *t;
        DLTensor proto = {.device = {kDLCPU, 0}};
        char err_text[256];
        uint64_t version;
        int fd, err;

        if (group_file_kind(path))
                return put_group(name, path, group_file_kind(path), cl->writable);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
                fprintf(stderr, "dlxctl: %s: %s\n", path, strerror(errno));
                return EXIT_FAILURE;
        }
        err = npy_read_header(fd, &info, err_text, sizeof(err_text));
        if (err < 0) {
                fprintf(stderr, "dlxctl: %s: %s\n", path, err_text);
                close(fd);
                return EXIT_FAILURE;
        }
        proto.ndim = info.ndim;
        proto.dtype = info.dtype;
        proto.shape = info.shape;
        /* read straight into shared memory (the publish then copies nothing), or for a small
         * file into the heap and publish a copy that is exactly its size */
        if (info.data_bytes < PUT_COPY_BELOW) {
                t = heap_tensor(&proto, info.data_bytes);
                err = t ? 0 : -ENOMEM;
        } else {
                o.copy = DLX_COPY_NEVER;
                err = dlx_alloc(ctl_client(), &proto, &t);
        }
        if (err < 0) {
                close(fd);
                return fail(err, "alloc");
        }
        err = read_full(fd, t->dl_tensor.data, info.data_bytes);
        close(fd);
        if (err < 0) {
                fprintf(stderr, "dlxctl: %s: %s\n", path,
                        err == -EINVAL ? "file shorter than its header says" : strerror(-err));
                t->deleter(t);
                return EXIT_FAILURE;
        }
        npy_to_native(t->dl_tensor.data, &info);
        if (info.fortran_order)
                npy_strides(&info, t->dl_tensor.strides);
        err = dlx_publish(ctl_client(), name, t, &o, &version);
        if (err < 0)
                return fail(err, name);
        if (json) {
                printf("{\"name\":");
                json_str(name);
                printf(",\"version\":%" PRIu64 "}\n", version);
        } else
                printf("%s v%" PRIu64 "\n", name, version);
        return 0;
}

static int parse_ms(const char *s, int64_t *ret)
{
        char *end;
        long long v;

        errno = 0;
        v = strtoll(s, &end, 10);
        if (errno || end == s || *end)
                return -EINVAL;
        *ret = v;
        return 0;
}

static int get_group(const char *name, const char *path, const char *kind,
                     const struct dlx_acquire_options *o)
{
        struct tfile_member *ms = NULL;
        dlx_group *g = NULL;
        char why[512];
        size_t n;
        int err, fd = -1;

        err = dlx_acquire_group(ctl_client(), name, NULL, 0, o, &g);
        if (err == -ENOTDIR) {
                fprintf(stderr, "dlxctl: %s is not a group but a tensor: get it into a .npy file\n",
                        name);
                return EXIT_FAILURE;
        }
        if (err < 0)
                return fail(err, name);
        n = dlx_group_count(g);
        ms = calloc(n, sizeof(*ms));
        if (!ms) {
                dlx_group_release(g);
                return fail(-ENOMEM, name);
        }
        for (size_t i = 0; i < n; i++) {
                const DLTensor *t = dlx_group_tensor(g, i);
                uint64_t numel = 1;
                for (int32_t d = 0; d < t->ndim; d++)
                        numel *= (uint64_t)t->shape[d];
                ms[i] = (struct tfile_member){dlx_group_name(g, i), *t,
                                              (numel * t->dtype.bits * t->dtype.lanes + 7) / 8};
        }
        if (strcmp(kind, ".npz") == 0) {
                err = npz_write(path, ms, n, why, sizeof(why));
        } else {
                fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                if (fd < 0) {
                        err = -errno;
                        snprintf(why, sizeof(why), "%s", strerror(errno));
                } else {
                        err = st_write(fd, ms, n, why, sizeof(why));
                        if (close(fd) < 0 && err == 0) {
                                err = -EIO;
                                snprintf(why, sizeof(why), "%s", strerror(errno));
                        }
                        if (err < 0)
                                unlink(path);
                }
        }
        uint64_t version = dlx_group_version(g);
        free(ms);
        dlx_group_release(g);
        if (err < 0) {
                fprintf(stderr, "dlxctl: %s: %s\n", path, why);
                return EXIT_FAILURE;
        }
        if (json) {
                printf("{\"name\":");
                json_str(name);
                printf(",\"version\":%" PRIu64 ",\"members\":%zu,\"file\":", version, n);
                json_str(path);
                printf("}\n");
        }
        return 0;
}

static int cmd_get(const struct cmdline *cl)
{
        struct dlx_acquire_options o = {0};
        DLManagedTensorVersioned *t;
        const char *name = cl->argv[1], *path = cl->argv[2];
        char err_text[256];
        uint64_t version = 0;
        int fd, err;

        if (cl->timeout && (parse_ms(cl->timeout, &o.timeout_ms) < 0 || o.timeout_ms < 0)) {
                fprintf(stderr, "dlxctl: bad --timeout '%s'\n", cl->timeout);
                return EXIT_USAGE;
        }
        if (cl->min_version) {
                char *end;
                errno = 0;
                o.min_version = strtoull(cl->min_version, &end, 10);
                if (errno || end == cl->min_version || *end || cl->min_version[0] == '-') {
                        fprintf(stderr, "dlxctl: bad --min-version '%s'\n", cl->min_version);
                        return EXIT_USAGE;
                }
        }
        if (group_file_kind(path))
                return get_group(name, path, group_file_kind(path), &o);
        err = dlx_acquire(ctl_client(), name, &o, &t);
        if (err == -EISDIR) {
                fprintf(stderr, "dlxctl: %s is a group: get it into a .safetensors or .npz file\n",
                        name);
                return EXIT_FAILURE;
        }
        if (err < 0)
                return fail(err, name);
        dlx_tensor_info(t, NULL, &version, NULL);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
                fprintf(stderr, "dlxctl: %s: %s\n", path, strerror(errno));
                t->deleter(t);
                return EXIT_FAILURE;
        }
        err = npy_write_fd(fd, &t->dl_tensor, err_text, sizeof(err_text));
        t->deleter(t);
        if (close(fd) < 0 && err == 0) {
                snprintf(err_text, sizeof(err_text), "%s", strerror(errno));
                err = -EIO;
        }
        if (err < 0) {
                fprintf(stderr, "dlxctl: %s: %s\n", path, err_text);
                unlink(path);
                return EXIT_FAILURE;
        }
        if (json) {
                printf("{\"name\":");
                json_str(name);
                printf(",\"version\":%" PRIu64 ",\"file\":", version);
                json_str(path);
                printf("}\n");
        }
        return 0;
}

static int cmd_rm(const struct cmdline *cl)
{
        int err;

        err = dlx_unpublish(ctl_client(), cl->argv[1]);
        if (err < 0)
                return fail(err, cl->argv[1]);
        return 0;
}

static volatile sig_atomic_t stop;

static int64_t mono_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_stop(int sig)
{
        (void)sig;
        stop = 1;
}

static int cmd_watch(const struct cmdline *cl)
{
        static const char *const kinds[] = {"?", "published", "replaced", "unpublished", "lost"};
        const char *prefix = cl->argc == 2 ? cl->argv[1] : "";
        int64_t count = -1, timeout = -1, seen = 0;
        struct sigaction sa = {.sa_handler = on_stop};
        uint64_t id;
        int err;

        if (cl->count && (parse_ms(cl->count, &count) < 0 || count < 1)) {
                fprintf(stderr, "dlxctl: bad --count '%s'\n", cl->count);
                return EXIT_USAGE;
        }
        if (cl->timeout && (parse_ms(cl->timeout, &timeout) < 0 || timeout < 0)) {
                fprintf(stderr, "dlxctl: bad --timeout '%s'\n", cl->timeout);
                return EXIT_USAGE;
        }
        dlx_client *c = ctl_client();
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        err = dlx_watch(c, prefix, &id);
        if (err < 0)
                return fail(err, "watch");
        setvbuf(stdout, NULL, _IOLBF, 0);
        int64_t deadline = timeout >= 0 ? mono_ms() + timeout : INT64_MAX;
        while (!stop && (count < 0 || seen < count)) {
                struct dlx_event ev;
                int64_t left = deadline - mono_ms();

                if (left < 0)
                        break;
                /* wake up now and then to notice a signal */
                err = dlx_next_event(c, &ev, left < 200 ? left : 200);
                if (err == -ETIMEDOUT || err == -EAGAIN)
                        continue;
                if (err < 0)
                        return fail(err, "watch");
                seen++;
                if (json) {
                        printf("{\"event\":\"%s\",\"name\":", kinds[ev.kind <= 4 ? ev.kind : 0]);
                        json_str(ev.name);
                        printf(",\"version\":%" PRIu64 "}\n", ev.version);
                } else {
                        if (ev.kind == DLX_EVENT_LOST)
                                printf("lost        (events were dropped: this watcher read too "
                                       "slowly)\n");
                        else
                                printf("%-11s %s v%" PRIu64 "\n", kinds[ev.kind <= 4 ? ev.kind : 0],
                                       ev.name, ev.version);
                }
        }
        return 0;
}

/* The limits as dlxd's options name them; value 0 means none. */
struct limit_row {
        const char *name;
        uint64_t value;
        bool size;
};

static int limit_rows(const struct dlx_limits *l, struct limit_row *rows)
{
        int n = 0;

        rows[n++] = (struct limit_row){"max-clients", l->max_clients, false};
        rows[n++] = (struct limit_row){"max-clients-per-uid", l->max_clients_per_uid, false};
        rows[n++] = (struct limit_row){"max-bytes", l->max_bytes, true};
        rows[n++] = (struct limit_row){"max-bytes-per-uid", l->max_bytes_per_uid, true};
        rows[n++] = (struct limit_row){"max-names", l->max_names, false};
        rows[n++] = (struct limit_row){"max-names-per-uid", l->max_names_per_uid, false};
        rows[n++] = (struct limit_row){"max-leases", l->max_leases, false};
        rows[n++] = (struct limit_row){"max-watches", l->max_watches, false};
        rows[n++] = (struct limit_row){"max-fds", l->max_fds, false};
        rows[n++] = (struct limit_row){"max-fds-per-uid", l->max_fds_per_uid, false};
        rows[n++] = (struct limit_row){"max-queued", l->max_queued, true};
        rows[n++] = (struct limit_row){"timeout-ms", l->timeout_ms, false};
        rows[n++] = (struct limit_row){"max-group-members", l->max_group_members, false};
        rows[n++] = (struct limit_row){"max-group-table", l->max_group_table, true};
        return n;
}

/* "of 1024" / "of 16 MiB", or "(no limit)" */
static const char *of_limit(uint64_t limit, bool size, char *buf, size_t len)
{
        char v[32];

        if (!limit)
                return "(no limit)";
        if (size)
                units_format_size(limit, v, sizeof(v));
        else
                snprintf(v, sizeof(v), "%" PRIu64, limit);
        snprintf(buf, len, "of %s", v);
        return buf;
}

/* stats --prometheus: the daemon's own text, as node_exporter or a scrape would take it. */
static int print_metrics(void)
{
        char *text;
        int err;

        if (json) {
                fprintf(stderr, "dlxctl: stats: --prometheus and --json do not go together\n");
                return EXIT_USAGE;
        }
        err = dlx_metrics(ctl_client(), &text);
        if (err < 0)
                return fail(err, "stats --prometheus");
        fputs(text, stdout);
        free(text);
        return fflush(stdout) == 0 ? 0 : fail(-errno, "stats --prometheus");
}

static int cmd_stats(const struct cmdline *cl)
{
        struct limit_row rows[16];
        char a[48], b[48], c[48], d[48], e[48];
        struct dlx_stats s;
        int err, n;

        if (cl->prometheus)
                return print_metrics();
        err = dlx_stats(ctl_client(), &s);
        if (err < 0)
                return fail(err, "stats");
        n = limit_rows(&s.limits, rows);
        if (json) {
                printf("{\"names\":%" PRIu64 ",\"versions\":%" PRIu64 ",\"leases\":%" PRIu64
                       ",\"segments\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"max_bytes\":%" PRIu64
                       ",\"clients\":%u,\"max_clients\":%u,\"watchers\":%u,\"uptime_ms\":%" PRIu64
                       ",\"requests\":%" PRIu64 ",\"publishes\":%" PRIu64 ",\"acquires\":%" PRIu64
                       ",\"server\":\"%s\",\"limits\":{",
                       s.names, s.versions, s.leases, s.segments, s.bytes, s.max_bytes, s.clients,
                       s.max_clients, s.watchers, s.uptime_ms, s.requests, s.publishes, s.acquires,
                       dlx_server_version(ctl_client()));
                for (int i = 0; i < n; i++) {
                        char key[32];
                        snprintf(key, sizeof(key), "%s", rows[i].name);
                        for (char *p = key; *p; p++)
                                *p = *p == '-' ? '_' : *p;
                        printf("%s\"%s\":%" PRIu64, i ? "," : "", key, rows[i].value);
                }
                printf("},\"fds\":%" PRIu64 ",\"uid\":{\"uid\":%u,\"clients\":%u,\"bytes\":%" PRIu64
                       ",\"names\":%" PRIu64 ",\"fds\":%" PRIu64 "}}\n",
                       s.fds, s.uid, s.uid_clients, s.uid_bytes, s.uid_names, s.uid_fds);
                return 0;
        }
        printf("server:    %s\n"
               "uptime:    %.1f s\n"
               "names:     %" PRIu64 " %s\n"
               "versions:  %" PRIu64 "\n"
               "leases:    %" PRIu64 "\n"
               "segments:  %" PRIu64 "\n"
               "bytes:     %s %s\n"
               "fds:       %" PRIu64 " %s\n"
               "clients:   %u %s\n"
               "watchers:  %u\n"
               "requests:  %" PRIu64 " (publishes %" PRIu64 ", acquires %" PRIu64 ")\n",
               dlx_server_version(ctl_client()), (double)s.uptime_ms / 1000.0, s.names,
               of_limit(s.limits.max_names, false, a, sizeof(a)), s.versions, s.leases, s.segments,
               units_format_size(s.bytes, c, sizeof(c)), of_limit(s.max_bytes, true, b, sizeof(b)),
               s.fds, of_limit(s.limits.max_fds, false, e, sizeof(e)), s.clients,
               of_limit(s.max_clients, false, d, sizeof(d)), s.watchers, s.requests, s.publishes,
               s.acquires);
        printf("uid %u:   %u clients %s, %s %s, %" PRIu64 " names %s, %" PRIu64 " fds %s\n", s.uid,
               s.uid_clients, of_limit(s.limits.max_clients_per_uid, false, a, sizeof(a)),
               units_format_size(s.uid_bytes, c, sizeof(c)),
               of_limit(s.limits.max_bytes_per_uid, true, b, sizeof(b)), s.uid_names,
               of_limit(s.limits.max_names_per_uid, false, d, sizeof(d)), s.uid_fds,
               of_limit(s.limits.max_fds_per_uid, false, e, sizeof(e)));
        printf("limits (dlxd options; 0: none):\n");
        for (int i = 0; i < n; i++) {
                if (rows[i].size && rows[i].value)
                        printf("  --%-20s %" PRIu64 " (%s)\n", rows[i].name, rows[i].value,
                               units_format_size(rows[i].value, a, sizeof(a)));
                else
                        printf("  --%-20s %" PRIu64 "\n", rows[i].name, rows[i].value);
        }
        return 0;
}

/* Reads all of what dlxfed's control socket at path says (one JSON line); NULL when it cannot. */
static char *read_control(const char *path)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        size_t len = 0, cap = 4096;
        char *buf = NULL;
        ssize_t n;
        int fd;

        if (strlen(path) >= sizeof(sa.sun_path)) {
                fprintf(stderr, "dlxctl: peers: '%s' is too long for a socket path\n", path);
                return NULL;
        }
        strcpy(sa.sun_path, path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                fprintf(stderr, "dlxctl: peers: no dlxfed answers at %s: %s\n", path,
                        strerror(errno));
                if (fd >= 0)
                        close(fd);
                return NULL;
        }
        /* a bridge that is stopped (SIGSTOP) or stuck does not hang us: 5 s, then an error */
        struct timeval tv = {.tv_sec = 5};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        buf = malloc(cap);
        while (buf) {
                if (len + 1 == cap) {
                        char *more = cap < (16u << 20) ? realloc(buf, cap * 2) : NULL;
                        if (!more) {
                                free(buf);
                                buf = NULL;
                                fprintf(stderr, "dlxctl: peers: dlxfed's answer is too long\n");
                                break;
                        }
                        buf = more;
                        cap *= 2;
                }
                n = read(fd, buf + len, cap - len - 1);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        fprintf(stderr, "dlxctl: peers: reading %s: %s\n", path,
                                errno == EAGAIN ? "no answer in 5 s" : strerror(errno));
                        free(buf);
                        buf = NULL;
                        break;
                }
                if (n == 0) {
                        buf[len] = '\0';
                        break;
                }
                len += (size_t)n;
        }
        close(fd);
        return buf;
}

static const char *json_text(const json_t *o, const char *key)
{
        const char *s = json_string_value(json_object_get(o, key));

        return s && *s ? s : "-";
}

static uint64_t json_count(const json_t *o, const char *key)
{
        json_int_t v = json_integer_value(json_object_get(o, key));

        return v > 0 ? (uint64_t)v : 0;
}

static void peer_row(const json_t *e, const char *role, const char *count_key,
                     const char *bytes_key)
{
        char b[48];

        printf("%-16s %-6s %-10s %-12s %-22s %8" PRIu64 " %10s %8" PRIu64 " %7" PRIu64 "\n",
               json_text(e, "alias"), role, json_text(e, "state"), json_text(e, "transport"),
               json_text(e, "address"), json_count(e, count_key),
               units_format_size(json_count(e, bytes_key), b, sizeof(b)), json_count(e, "failures"),
               json_count(e, "follows"));
}

static int cmd_peers(const struct cmdline *cl)
{
        char path[108], dlxd[108];
        json_error_t jerr;
        json_t *o, *a;
        char *text;
        size_t i;
        int err;

        if (cl->argc > 1) {
                snprintf(path, sizeof(path), "%s", cl->argv[1]);
        } else {
                err = sockpath_resolve(socket_path, dlxd, sizeof(dlxd));
                if (err < 0 || sockpath_control(dlxd, path, sizeof(path)) < 0) {
                        fprintf(stderr, "dlxctl: peers: the daemon's socket path is too long\n");
                        return EXIT_FAILURE;
                }
        }
        text = read_control(path);
        if (!text)
                return EXIT_FAILURE;
        o = json_loads(text, 0, &jerr);
        if (!json_is_object(o)) {
                fprintf(stderr, "dlxctl: peers: %s did not answer as dlxfed does: %s\n", path,
                        jerr.text);
                free(text);
                json_decref(o);
                return EXIT_FAILURE;
        }
        if (json) {
                fputs(text, stdout);
        } else {
                printf("dlxfed '%s', %s %s, up %.1f s\n", json_text(o, "alias"),
                       json_is_string(json_object_get(o, "listen")) ? "listening on"
                                                                    : "not listening",
                       json_is_string(json_object_get(o, "listen")) ? json_text(o, "listen") : "",
                       (double)json_count(o, "uptime_ms") / 1000.0);
                printf("%-16s %-6s %-10s %-12s %-22s %8s %10s %8s %7s\n", "PEER", "ROLE", "STATE",
                       "TRANSPORT", "ADDRESS", "VERSIONS", "BYTES", "FAILURES", "FOLLOWS");
                json_array_foreach(json_object_get(o, "peers"), i, a)
                        peer_row(a, "pull", "pulls", "bytes_in");
                json_array_foreach(json_object_get(o, "clients"), i, a)
                        peer_row(a, "serve", "served", "bytes_out");
        }
        free(text);
        json_decref(o);
        return 0;
}

/* The options only some commands take, as bits of struct command's options. */
enum {
        OPT_WRITABLE = 1 << 0,
        OPT_TIMEOUT = 1 << 1,
        OPT_COUNT = 1 << 2,
        OPT_MIN_VERSION = 1 << 3,
        OPT_PROMETHEUS = 1 << 4,
};

static const char *const opt_names[] = {"--writable", "--timeout", "--count", "--min-version",
                                        "--prometheus"};

struct command {
        const char *name;
        int (*fn)(const struct cmdline *cl);
        int min_operands, max_operands; /* not counting the command */
        unsigned options;               /* OPT_* it takes */
        const char *synopsis;
};

static const struct command commands[] = {
        {"list", cmd_list, 0, 1, 0, "list [PREFIX]"},
        {"ls", cmd_list, 0, 1, 0, "ls [PREFIX]"},
        {"stat", cmd_stat, 1, 1, 0, "stat NAME"},
        {"put", cmd_put, 2, 2, OPT_WRITABLE, "put NAME FILE.npy|.safetensors|.npz [--writable]"},
        {"get", cmd_get, 2, 2, OPT_TIMEOUT | OPT_MIN_VERSION,
         "get NAME FILE.npy|.safetensors|.npz [--timeout MS] [--min-version N]"},
        {"rm", cmd_rm, 1, 1, 0, "rm NAME"},
        {"watch", cmd_watch, 0, 1, OPT_COUNT | OPT_TIMEOUT,
         "watch [PREFIX] [--count N] [--timeout MS]"},
        {"stats", cmd_stats, 0, 0, OPT_PROMETHEUS, "stats [--prometheus]"},
        {"peers", cmd_peers, 0, 1, 0, "peers [SOCKET]"},
};

/* Counts every operand; keeps the first few, enough for any valid command line. */
static void add_operand(struct cmdline *cl, char *arg)
{
        if (cl->argc < (int)(sizeof(cl->argv) / sizeof(cl->argv[0])))
                cl->argv[cl->argc] = arg;
        cl->argc++;
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {
                {"socket", required_argument, NULL, 's'},
                {"json", no_argument, NULL, 'j'},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, 'V'},
                {"writable", no_argument, NULL, 'W'},
                {"timeout", required_argument, NULL, 'T'},
                {"count", required_argument, NULL, 'C'},
                {"min-version", required_argument, NULL, 'M'},
                {"prometheus", no_argument, NULL, 'P'},
                {0},
        };
        const struct command *cmd = NULL;
        struct cmdline cl = {0};
        unsigned given = 0;
        int opt, rc;

        /*
         * "-": operands come back in place (as option 1), so options work on
         * either side of the command and never pass for a name; "--" ends the
         * options, after which a name may start with '-'.
         */
        while ((opt = getopt_long(argc, argv, "-s:jhV", opts, NULL)) != -1) {
                switch (opt) {
                case 1:
                        add_operand(&cl, optarg);
                        break;
                case 's':
                        socket_path = optarg;
                        break;
                case 'j':
                        json = true;
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                case 'V':
                        printf("dlxctl %d.%d.%d\n", DLX_VERSION_MAJOR, DLX_VERSION_MINOR,
                               DLX_VERSION_PATCH);
                        return 0;
                case 'W':
                        cl.writable = true;
                        given |= OPT_WRITABLE;
                        break;
                case 'T':
                        cl.timeout = optarg;
                        given |= OPT_TIMEOUT;
                        break;
                case 'C':
                        cl.count = optarg;
                        given |= OPT_COUNT;
                        break;
                case 'M':
                        cl.min_version = optarg;
                        given |= OPT_MIN_VERSION;
                        break;
                case 'P':
                        cl.prometheus = true;
                        given |= OPT_PROMETHEUS;
                        break;
                default:
                        usage(stderr);
                        return EXIT_USAGE;
                }
        }
        while (optind < argc)
                add_operand(&cl, argv[optind++]);
        if (cl.argc == 0) {
                usage(stderr);
                return EXIT_USAGE;
        }
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                if (strcmp(cl.argv[0], commands[i].name) == 0)
                        cmd = &commands[i];
        if (!cmd) {
                fprintf(stderr, "dlxctl: unknown command '%s'\n", cl.argv[0]);
                usage(stderr);
                return EXIT_USAGE;
        }
        /* checked before connecting: a usage error never touches the daemon */
        if (given & ~cmd->options) {
                for (size_t i = 0; i < sizeof(opt_names) / sizeof(opt_names[0]); i++)
                        if (given & ~cmd->options & (1u << i))
                                fprintf(stderr, "dlxctl: %s takes no %s\n", cmd->name,
                                        opt_names[i]);
                fprintf(stderr, "usage: dlxctl [OPTIONS] %s\n", cmd->synopsis);
                return EXIT_USAGE;
        }
        if (cl.argc - 1 < cmd->min_operands || cl.argc - 1 > cmd->max_operands) {
                fprintf(stderr, "dlxctl: wrong number of arguments for %s\n", cmd->name);
                fprintf(stderr, "usage: dlxctl [OPTIONS] %s\n", cmd->synopsis);
                return EXIT_USAGE;
        }
        rc = cmd->fn(&cl);
        dlx_close(client);
        return rc;
}
