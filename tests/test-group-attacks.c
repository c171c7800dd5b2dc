/* SPDX-License-Identifier: MIT */
/*
 * Groups, read by a second reader: the promises of dlx.h "groups",
 * proto/group.h and proto/dlx.proto (Tensor.members, Acquire.group,
 * STATUS_IS_GROUP/NOT_GROUP, Limits) attacked, each test named after the
 * promise it checks. test-group.c is the author's suite; nothing here
 * repeats it.
 *
 * The promises:
 *  G1 "a consumer sees every member of version N or none"; a failed
 *     publish leaves nothing visible and nothing leaked, the version it
 *     would have replaced stays whole.
 *  G2 proto/group.h: "dlxd checks the table once at publish (group_check)
 *     and never reads it again, and every consumer maps the same pages":
 *     a table a raw peer builds is refused unless every area, name, dtype
 *     and layout is in bounds, and once accepted no one can change it.
 *  G3 "one lease for the whole group, at most one descriptor per segment",
 *     the usual timeout_ms/min_version semantics, -ENOTDIR/-EISDIR.
 *  G4 Members keep their DLPack layout; storage they share stays shared.
 *  G5 Taken tensors outlive the group, dlx_close() and a fork's child.
 *  G6 Watches and tracks see one version per group version; stat and list
 *     show the member count and the bytes.
 *  G7 Limits: member count and table size bounded and configurable.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "group.h"
#include "rawpeer.h"
#include "tables.h"
#include "tensors.h"

#define DLXV(call) ck_assert_int_eq((call), 0)
#define NOBODY 65534
#define REPLY_MS 10000

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* ---- helpers -------------------------------------------------------------------------------- */

/* A view over memory the test owns: its deleter frees the view, not the bytes. */
struct view {
        DLManagedTensorVersioned mt;
        int *deleted;
        int64_t shape[DLX_MAX_NDIM], strides[DLX_MAX_NDIM];
};

static void view_deleter(DLManagedTensorVersioned *t)
{
        struct view *v = t->manager_ctx;
        if (v->deleted)
                ++*v->deleted;
        free(v);
}

static DLManagedTensorVersioned *view_of(void *data, DLDataType dt, int32_t ndim,
                                         const int64_t *shape, const int64_t *strides,
                                         uint64_t byte_offset, uint64_t flags, int *deleted)
{
        struct view *v = calloc(1, sizeof(*v));

        ck_assert_ptr_nonnull(v);
        ck_assert_int_le(ndim, DLX_MAX_NDIM);
        if (ndim)
                memcpy(v->shape, shape, (size_t)ndim * sizeof(int64_t));
        if (strides && ndim)
                memcpy(v->strides, strides, (size_t)ndim * sizeof(int64_t));
        v->deleted = deleted;
        v->mt.version.major = DLPACK_MAJOR_VERSION;
        v->mt.version.minor = DLPACK_MINOR_VERSION;
        v->mt.manager_ctx = v;
        v->mt.deleter = view_deleter;
        v->mt.flags = flags;
        v->mt.dl_tensor = (DLTensor){.data = data,
                                     .device = {kDLCPU, 0},
                                     .ndim = ndim,
                                     .dtype = dt,
                                     .shape = ndim ? v->shape : NULL,
                                     .strides = strides ? v->strides : NULL,
                                     .byte_offset = byte_offset};
        return &v->mt;
}

static DLManagedTensorVersioned *vec_f32(float *data, int64_t n, int *deleted)
{
        return view_of(data, DT(kDLFloat, 32, 1), 1, &n, NULL, 0, 0, deleted);
}

static dlx_group *acquire_group_ok(dlx_client *c, const char *name, const char *const *names,
                                   size_t n, const struct dlx_acquire_options *o)
{
        dlx_group *g = NULL;
        int err = dlx_acquire_group(c, name, names, n, o, &g);

        ck_assert_msg(err == 0, "acquire group %s: %s (%s)", name, dlx_strerror(err),
                      dlx_last_error());
        return g;
}

/* Publishes n one-float members "m0".."m<n-1>" holding base + i; the version to *ret. */
static void publish_small_group(dlx_client *c, const char *name, int n, float base,
                                const struct dlx_publish_options *o, uint64_t *ret)
{
        struct dlx_member ms[16];
        char names[16][8];
        float vals[16];
        int err;

        ck_assert_int_le(n, 16);
        for (int i = 0; i < n; i++) {
                snprintf(names[i], sizeof(names[i]), "m%d", i);
                vals[i] = base + (float)i;
                ms[i] = (struct dlx_member){names[i], vec_f32(&vals[i], 1, NULL)};
        }
        err = dlx_publish_group(c, name, ms, (size_t)n, o, ret);
        ck_assert_msg(err == 0, "publish group %s: %s (%s)", name, dlx_strerror(err),
                      dlx_last_error());
}

/* Whether g is the group publish_small_group() made with n members and base. */
static bool small_group_is(const dlx_group *g, int n, float base)
{
        char name[8];

        if (dlx_group_count(g) != (size_t)n)
                return false;
        for (int i = 0; i < n; i++) {
                snprintf(name, sizeof(name), "m%d", i);
                int64_t k = dlx_group_find(g, name);
                if (k < 0 ||
                    *(const float *)dlx_group_tensor(g, (size_t)k)->data != base + (float)i)
                        return false;
        }
        return true;
}

/* A line of /proc/<pid>/status ("VmRSS:") as a number (kB), or -1. */
static long proc_status_kb(pid_t pid, const char *key)
{
        char path[64], line[256];
        long v = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, key, strlen(key)) == 0)
                        v = strtol(line + strlen(key), NULL, 10);
        fclose(f);
        return v;
}

/* Lets other uids in group nobody reach the fixture's socket (the daemon runs --group 65534). */
static void open_to_others(void)
{
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        ck_assert_int_eq(chmod(fx.socket, 0666), 0);
}

/* In a forked child: becomes uid (group nobody) and connects; NULL if it cannot. */
static dlx_client *connect_as(uid_t uid)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "other-uid"};
        dlx_client *c = NULL;

        if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(uid) != 0)
                return NULL;
        return dlx_connect(&o, &c) == 0 ? c : NULL;
}

/* ---- a group segment built by hand (proto/group.h) ----------------------------------------- */

/* Two float32 members over the first 64 bytes, "a" (16 floats) and "b" (4 floats at 16). */
static const struct gspec two_members[] = {
        {"a", {kDLFloat, 32, 1}, 1, {16}, {1}, 0, 0},
        {"b", {kDLFloat, 32, 1}, 1, {4}, {1}, 0, 64},
};

static void gbuild_two(struct gseg *g)
{
        gbuild(g, two_members, 2, 4096, false);
}

/* Sends req with fd (-1: none) and reads its answer (events skipped); returns the status. */
static int raw_call(int sock, const struct wire_request *req, int fd, struct wire_reply *rep,
                    int *ret_fd)
{
        int r;

        rp_send(sock, req, fd);
        r = rp_read_answer(sock, rep, REPLY_MS * fx_slowdown(), ret_fd);
        ck_assert_msg(r == 1, "request %llu: no answer (%d): is the daemon alive?",
                      (unsigned long long)req->id, r);
        ck_assert_uint_eq(rep->id, req->id);
        return rep->status;
}

/* Publishes g under name from a fresh memfd (extra seals as given); returns the status. */
static int raw_publish_group(int sock, uint64_t id, const char *name, const struct gseg *g,
                             int extra_seals, struct wire_reply *rep)
{
        struct wire_request req;
        int fd = gmemfd(g, extra_seals), st;

        group_publish_req(&req, id, name, g);
        st = raw_call(sock, &req, fd, rep, NULL);
        close(fd);
        return st;
}

/* What a refused publish must leave: no name, bytes and fds as before, a daemon that answers. */
static void expect_nothing_left(dlx_client *c, const char *name, const struct dlx_stats *before,
                                const char *what)
{
        struct dlx_info info;
        struct dlx_stats now;

        ck_assert_msg(dlx_stat(c, name, &info) == -ENOENT, "%s: %s is visible", what, name);
        for (int i = 0; i < 200; i++) {
                now = fx_stats(c);
                if (now.bytes == before->bytes && now.fds == before->fds &&
                    now.segments == before->segments)
                        break;
                fx_sleep_ms(10);
        }
        ck_assert_msg(now.bytes == before->bytes && now.fds == before->fds &&
                              now.segments == before->segments && now.names == before->names,
                      "%s: left bytes %" PRIu64 " (was %" PRIu64 "), fds %" PRIu64 " (was %" PRIu64
                      "), segments %" PRIu64 " (was %" PRIu64 ")",
                      what, now.bytes, before->bytes, now.fds, before->fds, now.segments,
                      before->segments);
}

/*
 * In a child: acquires name as a group with a client of its own and reads
 * every byte each member's elements span, and every name: whatever a
 * table holds, a consumer must not fault on it. Exits 0 when it read all,
 * 2 when the acquire failed (an error is no fault).
 */
static int consume_all(void *arg)
{
        const char *name = arg;
        dlx_client *c = NULL;
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "reader"};
        dlx_group *g = NULL;
        volatile uint8_t sink = 0;

        if (dlx_connect(&o, &c) != 0)
                return 3;
        if (dlx_acquire_group(c, name, NULL, 0, NULL, &g) != 0) {
                dlx_close(c);
                return 2;
        }
        for (size_t i = 0; i < dlx_group_count(g); i++) {
                const DLTensor *t = dlx_group_tensor(g, i);
                const char *n = dlx_group_name(g, i);
                __int128 lo = 0, hi = 0, numel = 1;
                uint64_t esz = ((uint64_t)t->dtype.bits * t->dtype.lanes + 7) / 8;

                DLManagedTensorVersioned *mt = NULL;

                if (!t || !n || strlen(n) > DLX_NAME_MAX)
                        return 4;
                if (dlx_group_take(g, i, &mt) != 0)
                        return 6;
                bool ro = (mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
                mt->deleter(mt);
                if (!ro)
                        return 7; /* dlx.h: a taken member is READ_ONLY */
                for (int d = 0; d < t->ndim; d++) {
                        int64_t st = t->strides ? t->strides[d] : 1;
                        numel *= t->shape[d];
                        if (t->shape[d] > 0 && st > 0)
                                hi += (__int128)(t->shape[d] - 1) * st;
                        else if (t->shape[d] > 0)
                                lo += (__int128)(t->shape[d] - 1) * st;
                }
                if (numel == 0)
                        continue;
                const uint8_t *base = (const uint8_t *)t->data + t->byte_offset;
                /* first and last bytes, and every page between */
                for (__int128 b = lo * (__int128)esz; b <= hi * (__int128)esz + (__int128)esz - 1;
                     b += 4096) {
                        if (b > ((__int128)1 << 40) || b < -((__int128)1 << 40))
                                return 5; /* a span no real segment has */
                        sink ^= base[(ptrdiff_t)b];
                }
                sink ^= base[(ptrdiff_t)(hi * (__int128)esz + (__int128)esz - 1)];
        }
        (void)sink;
        dlx_group_release(g);
        dlx_close(c);
        return 0;
}

/* The status a consumer process ends with; a signal (>= 128) is a fault. */
static int consume_in_child_status(const char *name)
{
        return fx_wait(fx_spawn(consume_all, (void *)name));
}

/* ---- G2: hand-made tables -------------------------------------------------------------------- */

/* A table libdlx never makes, built right, is acquirable through libdlx with its layout. */
START_TEST(raw_built_table_is_a_group)
{
        int sock = rp_connect(fx.socket, "hostile");
        dlx_client *q = fx_connect(&fx, "lib");
        struct wire_reply rep;
        struct gseg g;

        gbuild_two(&g);
        ck_assert_msg(raw_publish_group(sock, 2, "raw", &g, F_SEAL_WRITE, &rep) == WIRE_OK,
                      "a valid hand-made group refused: %d %s", rep.status, rep.error);
        dlx_group *grp = acquire_group_ok(q, "raw", NULL, 0, NULL);
        ck_assert_uint_eq(dlx_group_count(grp), 2);
        ck_assert_str_eq(dlx_group_name(grp, 0), "a");
        ck_assert_str_eq(dlx_group_name(grp, 1), "b");
        const DLTensor *a = dlx_group_tensor(grp, 0), *b = dlx_group_tensor(grp, 1);
        ck_assert_int_eq(a->shape[0], 16);
        ck_assert_int_eq(b->shape[0], 4);
        ck_assert_ptr_eq((const uint8_t *)b->data, (const uint8_t *)a->data + 64);
        ck_assert_uint_eq(((const uint8_t *)a->data)[5], 5);
        ck_assert_uint_eq(((const uint8_t *)b->data)[1], 65);
        struct dlx_info info;
        DLXV(dlx_stat(q, "raw", &info));
        ck_assert_uint_eq(info.members, 2);
        dlx_group_release(grp);
        /* unsealed against writing but mapped nowhere: dlxd seals it itself */
        ck_assert_msg(raw_publish_group(sock, 3, "raw", &g, 0, &rep) == WIRE_OK,
                      "an unmapped memfd refused: %d %s", rep.status, rep.error);
        free(g.p);
        close(sock);
        dlx_close(q);
}
END_TEST

struct mutation {
        const char *what;
        bool must_refuse; /* else: may be taken, but then no consumer may fault on it */
};

static const struct mutation mutations[] = {
        {"bad magic", true},                                /* 0 */
        {"format 2", true},                                 /* 1 */
        {"head count above Tensor.members", true},          /* 2 */
        {"Tensor.members above head count", true},          /* 3 */
        {"members_off inside the head", true},              /* 4 */
        {"members_off at data_off", true},                  /* 5 */
        {"members_off misaligned", false},                  /* 6 */
        {"dims_off misaligned", false},                     /* 7 */
        {"ndims wraps ndims * 8 to 0", true},               /* 8 */
        {"ndims 0 under members of ndim 1", true},          /* 9 */
        {"a member's strides past the dims area", true},    /* 10 */
        {"a member's dims index 2^60", true},               /* 11 */
        {"names_size wraps names_off + names_size", true},  /* 12 */
        {"names_off at data_off", true},                    /* 13 */
        {"name_off past names_size", true},                 /* 14 */
        {"a name without its NUL", true},                   /* 15 */
        {"a NUL inside a name", true},                      /* 16 */
        {"name_len 0", true},                               /* 17 */
        {"name_len 256", true},                             /* 18 */
        {"names not sorted", true},                         /* 19 */
        {"two members of one name", true},                  /* 20 */
        {"a member name a//b", true},                       /* 21 */
        {"ndim 33", true},                                  /* 22 */
        {"dtype bits 0", true},                             /* 23 */
        {"dtype lanes 0", true},                            /* 24 */
        {"dtype code 99", true},                            /* 25 */
        {"reserved not 0", false},                          /* 26 */
        {"a member not READ_ONLY", false},                  /* 27 */
        {"a member's data in the table", true},             /* 28 */
        {"a member's data at the segment's end", true},     /* 29 */
        {"a member's offset near 2^64", true},              /* 30 */
        {"elements one past the end", true},                /* 31 */
        {"a negative stride before the data area", true},   /* 32 */
        {"byte_offset wrapping to the head", true},         /* 33 */
        {"byte_offset 2^63", true},                         /* 34 */
        {"shape * stride wrapping to 0", true},             /* 35 */
        {"shape 2^62 wrapping numel * 4", true},            /* 36 */
        {"a negative shape", true},                         /* 37 */
        {"data_off past the segment", true},                /* 38 */
        {"data_off not page aligned", false},               /* 39 */
        {"Tensor.offset and length over the table", false}, /* 40 */
        {"Tensor as float32 2-D", false},                   /* 41 */
        {"count 2^20 + 1", true},                           /* 42 */
        {"Tensor.members 2^20 + 1", true},                  /* 43 */
        {"a scalar's dims index 2^62", false},              /* 44 */
        {"a scalar half past the end", true},               /* 45 */
        {"packed int4 one byte past the end", true},        /* 46 */
        {"float32x4 lanes past the end", true},             /* 47 */
        {"a member 4 bytes into the data area", false},     /* 48 */
        {"a stride 0 over 2^62 elements", false},           /* 49 */
        {"Tensor not READ_ONLY", false},                    /* 50 */
        {"a member of dtype bits 12", true},                /* 51 */
        {"Tensor on kDLCUDA", true},                        /* 52 */
        {"shape 0 beside a huge stride", false},            /* 53 */
};

static void mutate(int row, struct gseg *g, struct wire_request *req)
{
        struct group_head *h = ghead(g);
        struct group_member *m0 = gmember(g, 0), *m1 = gmember(g, 1);
        int64_t *dims = (int64_t *)(g->p + h->dims_off);
        char *names = (char *)(g->p + h->names_off);
        struct wire_tensor *t = &req->publish.tensor;

        switch (row) {
        case 0:
                h->magic[0] = 'X';
                break;
        case 1:
                h->format = GROUP_FORMAT + 1;
                break;
        case 2:
                h->count = 3;
                break;
        case 3:
                t->members = 3;
                break;
        case 4:
                h->members_off = 8;
                break;
        case 5:
                h->members_off = h->data_off;
                break;
        case 6:
                memmove(g->p + h->members_off + 4, g->p + h->members_off,
                        2 * sizeof(struct group_member));
                h->members_off += 4;
                break;
        case 7:
                memmove(g->p + h->dims_off + 4, g->p + h->dims_off, h->ndims * 8);
                h->dims_off += 4;
                break;
        case 8:
                h->ndims = (uint64_t)1 << 61;
                break;
        case 9:
                h->ndims = 0;
                break;
        case 10:
                m1->dims = h->ndims - 1;
                break;
        case 11:
                m0->dims = (uint64_t)1 << 60;
                break;
        case 12:
                h->names_size = UINT64_MAX - 50;
                break;
        case 13:
                h->names_off = h->data_off;
                break;
        case 14:
                m1->name_off = (uint32_t)h->names_size;
                break;
        case 15:
                names[1] = 'x';
                break;
        case 16:
                m0->name_len = 3;
                break; /* "a\0b" */
        case 17:
                m0->name_len = 0;
                break;
        case 18:
                m0->name_len = 256;
                break;
        case 19: {
                struct group_member tmp = *m0;
                *m0 = *m1;
                *m1 = tmp;
                break;
        }
        case 20:
                m1->name_off = m0->name_off;
                m1->name_len = m0->name_len;
                break;
        case 21: /* rebuilt by the caller with a bad name */
                break;
        case 22:
                m0->ndim = 33;
                break;
        case 23:
                m0->dtype_bits = 0;
                break;
        case 24:
                m0->dtype_lanes = 0;
                break;
        case 25:
                m0->dtype_code = 99;
                break;
        case 26:
                m0->reserved = 1;
                break;
        case 27:
                m1->flags = 0;
                break;
        case 28:
                m0->offset = h->data_off - 64;
                break;
        case 29:
                m1->offset = g->size;
                break;
        case 30:
                m1->offset = UINT64_MAX - 3;
                break;
        case 31:
                dims[0] = (int64_t)(g->data_bytes / 4) + 1;
                break;
        case 32:
                dims[1] = -1;
                break; /* a: 16 floats going down from the data area's start */
        case 33:
                m0->byte_offset = (uint64_t)0 - h->data_off;
                break;
        case 34:
                m0->byte_offset = (uint64_t)1 << 63;
                break;
        case 35: /* b: 2 floats, the second 2^62 floats on: 2^64 bytes, 0 when wrapped */
                dims[2] = 2;
                dims[3] = (int64_t)1 << 62;
                break;
        case 36:
                dims[0] = (int64_t)1 << 62;
                break;
        case 37:
                dims[2] = -4;
                break;
        case 38:
                h->data_off = g->size + 4096;
                break;
        case 39:
                h->data_off -= 8;
                break;
        case 40:
                t->offset = 0;
                t->length = g->size;
                t->shape[0] = (int64_t)g->size;
                break;
        case 41:
                t->dtype = (DLDataType){kDLFloat, 32, 1};
                t->ndim = 2;
                t->shape[0] = 2;
                t->shape[1] = (int64_t)g->data_bytes / 8;
                t->strides[0] = t->shape[1];
                t->strides[1] = 1;
                break;
        case 42:
                h->count = GROUP_MEMBERS_MAX + 1;
                t->members = GROUP_MEMBERS_MAX + 1;
                break;
        case 43:
                t->members = GROUP_MEMBERS_MAX + 1;
                break;
        case 44: /* rebuilt by the caller: a scalar */
                m0->dims = (uint64_t)1 << 62;
                break;
        case 45: /* rebuilt by the caller: a scalar */
                m0->offset = g->size - 2;
                break;
        case 46: /* rebuilt: int4 packed */
                dims[0] += 2;
                break;
        case 47: /* rebuilt: float32x4 */
                dims[0] += 1;
                break;
        case 48:
                m0->offset += 4;
                break;
        case 49:
                dims[0] = (int64_t)1 << 62;
                dims[1] = 0;
                break;
        case 50:
                t->flags = 0;
                break;
        case 51:
                m0->dtype_bits = 12;
                break;
        case 52:
                t->device_type = kDLCUDA;
                break;
        case 53:
                dims[2] = 0;
                dims[3] = INT64_MAX;
                break;
        default:
                ck_abort_msg("no mutation %d", row);
        }
}

/*
 * G2, G1: every table that breaks proto/group.h is refused (or, where the
 * header is silent, taken only when no consumer can fault on it), and a
 * refusal leaves no name, bytes nor descriptor; the daemon goes on.
 */
START_TEST(raw_bad_tables_refused)
{
        const struct mutation *mu = &mutations[_i];
        int sock = rp_connect(fx.socket, "hostile");
        dlx_client *q = fx_connect(&fx, "lib");
        struct dlx_stats before = fx_stats(q);
        struct wire_request req;
        struct wire_reply rep;
        struct gseg g;
        int fd, st;

        if (_i == 21) {
                static const struct gspec bad[] = {
                        {"a//b", {kDLFloat, 32, 1}, 1, {16}, {1}, 0, 0},
                        {"b", {kDLFloat, 32, 1}, 1, {4}, {1}, 0, 64},
                };
                gbuild(&g, bad, 2, 4096, false);
        } else if (_i == 44 || _i == 45) {
                static const struct gspec sc[] = {
                        {"a", {kDLFloat, 32, 1}, 0, {0}, {0}, 0, 0},
                        {"b", {kDLFloat, 32, 1}, 1, {4}, {1}, 0, 64},
                };
                gbuild(&g, sc, 2, 4096, false);
        } else if (_i == 46) {
                static const struct gspec i4[] = {
                        {"a", {kDLInt, 4, 1}, 1, {8192}, {1}, 0, 0},
                        {"b", {kDLFloat, 32, 1}, 1, {4}, {1}, 0, 64},
                };
                gbuild(&g, i4, 2, 4096, false);
        } else if (_i == 47) {
                static const struct gspec x4[] = {
                        {"a", {kDLFloat, 32, 4}, 1, {256}, {1}, 0, 0},
                        {"b", {kDLFloat, 32, 1}, 1, {4}, {1}, 0, 64},
                };
                gbuild(&g, x4, 2, 4096, false);
        } else {
                gbuild_two(&g);
        }
        group_publish_req(&req, 2, "victim", &g);
        mutate(_i, &g, &req);
        fd = gmemfd(&g, F_SEAL_WRITE);
        st = raw_call(sock, &req, fd, &rep, NULL);
        close(fd);
        rp_ping(sock, 3);
        if (st == WIRE_OK) {
                ck_assert_msg(!mu->must_refuse, "row %d: %s: a bad table was published", _i,
                              mu->what);
                st = consume_in_child_status("victim");
                ck_assert_msg(st < 128, "row %d: %s: taken, and a consumer died of signal %d", _i,
                              mu->what, st - 128);
                struct dlx_info info;
                DLXV(dlx_stat(q, "victim", &info));
                ck_assert_msg(info.nbytes <= g.data_bytes,
                              "row %d: %s: stat says %" PRIu64 " bytes of a %" PRIu64
                              "-byte data area",
                              _i, mu->what, info.nbytes, g.data_bytes);
                DLXV(dlx_unpublish(q, "victim"));
        } else {
                ck_assert_msg(rep.error[0], "row %d: %s: refused without a reason", _i, mu->what);
                expect_nothing_left(q, "victim", &before, mu->what);
        }
        /* the session goes on: a good table after a bad one */
        free(g.p);
        gbuild_two(&g);
        ck_assert_msg(raw_publish_group(sock, 4, "victim", &g, F_SEAL_WRITE, &rep) == WIRE_OK,
                      "row %d: a good table after the bad one: %d %s", _i, rep.status, rep.error);
        free(g.p);
        close(sock);
        dlx_close(q);
}
END_TEST

/* ---- G2: no one changes a table once checked ------------------------------------------------ */

/*
 * Makes the table of a published group hostile through a writable mapping
 * the attacker kept: member 0 (a) now claims 2^40 floats, 2^30 bytes past
 * the segment.
 */
static void make_hostile(uint8_t *map)
{
        struct group_head *h = (struct group_head *)map;
        struct group_member *m = (struct group_member *)(map + h->members_off);
        int64_t *dims = (int64_t *)(map + h->dims_off);

        m[0].offset = (uint64_t)1 << 30;
        dims[0] = (int64_t)1 << 40;
}

/*
 * G2 ("dlxd checks the table once at publish and never reads it again, and
 * every consumer maps the same pages"): a memfd still mapped writable by
 * its sender, unsealed or sealed only F_SEAL_FUTURE_WRITE, is refused as a
 * group; were it taken, the sender could rewrite the checked table under
 * every consumer.
 */
START_TEST(raw_table_writable_by_sender_refused)
{
        int sock = rp_connect(fx.socket, "hostile");
        dlx_client *q = fx_connect(&fx, "lib");
        struct dlx_stats before = fx_stats(q);
        struct wire_request req;
        struct wire_reply rep;
        struct gseg g;

        gbuild_two(&g);
        for (int round = 0; round < 2; round++) {
                int fd = gmemfd(&g, 0);
                uint8_t *map = mmap(NULL, g.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                ck_assert_ptr_ne(map, MAP_FAILED);
                if (round == 1)
                        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
                group_publish_req(&req, 10 + (uint64_t)round, "victim", &g);
                int st = raw_call(sock, &req, fd, &rep, NULL);
                if (st == WIRE_OK) {
                        make_hostile(map);
                        st = consume_in_child_status("victim");
                        ck_abort_msg("round %d (%s): a memfd mapped writable by its sender was "
                                     "published as a group; after the sender rewrote its table "
                                     "a consumer ended with status %d",
                                     round, round ? "F_SEAL_FUTURE_WRITE" : "no write seal", st);
                }
                munmap(map, g.size);
                close(fd);
                expect_nothing_left(q, "victim", &before, "writable group memfd");
        }
        free(g.p);
        close(sock);
        dlx_close(q);
}
END_TEST

/*
 * G2 for a segment the daemon made (dlx_alloc's kind): its allocator keeps
 * its writable mapping after a read-only publish (F_SEAL_FUTURE_WRITE), so a
 * group published from it by id could have its table rewritten after the
 * check. Either dlxd refuses such a group, or no consumer may fault on what
 * the allocator writes afterwards.
 */
START_TEST(raw_group_by_segment_id_table_immutable)
{
        int sock = rp_connect(fx.socket, "hostile");
        dlx_client *q = fx_connect(&fx, "lib");
        struct dlx_stats before = fx_stats(q);
        struct wire_request req;
        struct wire_reply rep;
        struct gseg g;
        int fd = -1;

        gbuild_two(&g);
        uint64_t seg = rp_alloc(sock, 2, g.size, &fd);
        ck_assert_int_ge(fd, 0);
        uint8_t *map = mmap(NULL, g.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ck_assert_ptr_ne(map, MAP_FAILED);
        memcpy(map, g.p, g.size);
        group_publish_req(&req, 3, "victim", &g);
        req.publish.tensor.segment = seg;
        int st = raw_call(sock, &req, -1, &rep, NULL);
        if (st == WIRE_OK) {
                /* the checked table, as a consumer sees it now */
                ck_assert_int_eq(consume_in_child_status("victim"), 0);
                make_hostile(map);
                st = consume_in_child_status("victim");
                ck_assert_msg(st < 128,
                              "a group published from an allocated segment by id: its "
                              "allocator rewrote the checked table through its writable "
                              "mapping, and a consumer died of signal %d",
                              st - 128);
                DLXV(dlx_unpublish(q, "victim"));
        }
        munmap(map, g.size);
        close(fd);
        close(sock);
        free(g.p);
        expect_nothing_left(q, "victim", &before, "group by segment id");
        dlx_close(q);
}
END_TEST

struct scribbler {
        int fd;
        const struct gseg *good;
        uint8_t *bad;
        volatile int stop;
        long writes;
};

static void *scribble(void *arg)
{
        struct scribbler *s = arg;

        while (!s->stop) {
                const uint8_t *img = (s->writes & 1) ? s->bad : s->good->p;
                if (pwrite(s->fd, img, 4096, 0) < 0)
                        break; /* sealed */
                s->writes++;
        }
        return NULL;
}

/*
 * G2: the table dlxd checks is the table consumers map. A sender that keeps
 * write()ing a good and a bad table into the memfd (mapped nowhere) while
 * dlxd seals it: whatever the last write before the seal was, a publish
 * that succeeds has a table that passes group_check().
 */
START_TEST(raw_table_checked_is_table_sealed)
{
        int sock = rp_connect(fx.socket, "hostile");
        const int ROUNDS = fx_slowdown() > 1 ? 20 : 300;
        struct wire_request req;
        struct wire_reply rep;
        struct gseg g;
        int taken = 0, bad_taken = 0;
        char why[256];

        gbuild_two(&g);
        uint8_t *bad = malloc(4096);
        ck_assert_ptr_nonnull(bad);
        memcpy(bad, g.p, 4096);
        make_hostile(bad);
        for (int r = 0; r < ROUNDS; r++) {
                struct scribbler s = {.fd = gmemfd(&g, 0), .good = &g, .bad = bad};
                pthread_t th;

                ck_assert_int_eq(pthread_create(&th, NULL, scribble, &s), 0);
                while (s.writes < 2)
                        sched_yield();
                group_publish_req(&req, 10 + (uint64_t)r, "race", &g);
                int st = raw_call(sock, &req, s.fd, &rep, NULL);
                s.stop = 1;
                pthread_join(th, NULL);
                if (st == WIRE_OK) {
                        struct group_summary sum;
                        const void *map = mmap(NULL, g.size, PROT_READ, MAP_SHARED, s.fd, 0);
                        ck_assert_ptr_ne(map, MAP_FAILED);
                        taken++;
                        if (group_check(map, g.size, &(struct group_bounds){0}, &sum, why,
                                        sizeof(why)) != 0)
                                bad_taken++;
                        munmap((void *)map, g.size);
                }
                close(s.fd);
        }
        ck_assert_msg(bad_taken == 0,
                      "%d of %d groups taken hold a table that fails group_check() (the table "
                      "changed between the check and the seal)",
                      bad_taken, taken);
        free(bad);
        free(g.p);
        close(sock);
}
END_TEST

/*
 * G2 with hold: a group's segment kept for later publishes by id cannot
 * become a writable tensor (its readers' table would be rewritable), and
 * freeing it leaves the published group whole.
 */
START_TEST(raw_held_group_segment_stays_read_only)
{
        int sock = rp_connect(fx.socket, "hostile");
        dlx_client *q = fx_connect(&fx, "lib");
        struct wire_request req;
        struct wire_reply rep;
        struct gseg g;
        int fd;

        gbuild_two(&g);
        fd = gmemfd(&g, 0);
        group_publish_req(&req, 2, "held", &g);
        req.publish.hold = true;
        int st = raw_call(sock, &req, fd, &rep, NULL);
        close(fd);
        if (st == WIRE_OK) {
                uint64_t seg = rep.publish.segment;
                /* the same segment as a writable float tensor */
                rp_publish_req(&req, 3, "held-rw", 4096, seg, 0);
                req.publish.tensor.offset = ghead(&g)->data_off;
                st = raw_call(sock, &req, -1, &rep, NULL);
                ck_assert_msg(st != WIRE_OK, "a group's segment became a writable tensor");
                /* the same segment as a writable tensor over its table */
                rp_publish_req(&req, 4, "held-rw", 4096, seg, 0);
                st = raw_call(sock, &req, -1, &rep, NULL);
                ck_assert_msg(st != WIRE_OK, "a group's table became a writable tensor");
                /* by id again, as a group: a new version of the same table */
                group_publish_req(&req, 5, "held", &g);
                req.publish.tensor.segment = seg;
                st = raw_call(sock, &req, -1, &rep, NULL);
                ck_assert_msg(st == WIRE_OK, "a held group segment republished by id: %d %s", st,
                              rep.error);
                memset(&req, 0, sizeof(req));
                req.id = 6;
                req.type = WIRE_REQ_FREE;
                req.free.segment = seg;
                raw_call(sock, &req, -1, &rep, NULL);
                ck_assert_int_eq(consume_in_child_status("held"), 0);
        } else {
                ck_assert_msg(rep.error[0], "hold refused without a reason");
        }
        free(g.p);
        close(sock);
        dlx_close(q);
}
END_TEST

/*
 * G3/G2 with a raw consumer: Acquire.group on a group answers the group with
 * its member count, one fd; an Acquire without it answers IS_GROUP; a
 * segment already held comes without a second descriptor.
 */
START_TEST(raw_acquire_group_one_descriptor)
{
        int sock = rp_connect(fx.socket, "consumer");
        dlx_client *p = fx_connect(&fx, "producer");
        struct wire_request req;
        struct wire_reply rep;
        int fd = -1;

        publish_small_group(p, "g", 8, 0, NULL, NULL);
        rp_acquire_req(&req, 2, "g");
        ck_assert_int_eq(raw_call(sock, &req, -1, &rep, &fd), WIRE_IS_GROUP);
        ck_assert_int_eq(fd, -1);
        req.id = 3;
        req.acquire.group = true;
        ck_assert_int_eq(raw_call(sock, &req, -1, &rep, &fd), WIRE_OK);
        ck_assert_int_ge(fd, 0);
        ck_assert_uint_eq(rep.acquire.tensor.members, 8);
        ck_assert(!rep.acquire.writable);
        /* read-only: no writable shared mapping of the group's fd */
        void *w = mmap(NULL, rep.acquire.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ck_assert_ptr_eq(w, MAP_FAILED);
        close(fd);
        fd = -1;
        req.id = 4;
        ck_assert_int_eq(raw_call(sock, &req, -1, &rep, &fd), WIRE_OK);
        ck_assert_msg(fd == -1, "a segment this session holds came with a second descriptor");
        struct dlx_info info;
        DLXV(dlx_stat(p, "g", &info));
        ck_assert_uint_eq(info.leases, 2);
        close(sock);
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        dlx_close(p);
}
END_TEST

/* ---- G3: waiting, kinds, leases -------------------------------------------------------------- */

struct later {
        int kind; /* 0: a tensor, 1: a group */
        int delay_ms;
        const char *name;
};

static int publish_later(void *arg)
{
        const struct later *l = arg;
        dlx_client *p = fx_connect(&fx, "later");
        struct dlx_publish_options persist = {.persist = true};

        fx_sleep_ms(l->delay_ms);
        if (l->kind == 0)
                publish_ok(p, l->name, fx_plain_f32(4, 0, NULL), &persist, NULL);
        else
                publish_small_group(p, l->name, 3, 0, &persist, NULL);
        dlx_close(p);
        return 0;
}

/*
 * G3 ("the usual timeout_ms/min_version semantics", -ENOTDIR): a group
 * acquire waiting for a name that then gets a tensor either fails
 * -ENOTDIR at once or waits on; it never takes the tensor for a group. The
 * same the other way round (-EISDIR).
 */
START_TEST(waiting_acquire_meets_the_other_kind)
{
        dlx_client *q = fx_connect(&fx, "waiter");
        struct dlx_acquire_options wait = {.timeout_ms = 3000};
        struct later t = {0, 200, "w/tensor"}, gr = {1, 200, "w/group"};
        DLManagedTensorVersioned *mt = NULL;
        dlx_group *g = NULL;
        pid_t pid;
        int64_t t0;
        int err;

        pid = fx_spawn(publish_later, &t);
        t0 = fx_now_ms();
        err = dlx_acquire_group(q, "w/tensor", NULL, 0, &wait, &g);
        ck_assert_int_eq(fx_wait(pid), 0);
        ck_assert_msg(err == -ENOTDIR || err == -ETIMEDOUT,
                      "a waiting group acquire met a tensor: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        if (err == -ETIMEDOUT)
                ck_assert_int_ge(fx_now_ms() - t0, 2900);
        ck_assert_ptr_null(g);

        pid = fx_spawn(publish_later, &gr);
        err = dlx_acquire(q, "w/group", &wait, &mt);
        ck_assert_int_eq(fx_wait(pid), 0);
        ck_assert_msg(err == -EISDIR || err == -ETIMEDOUT,
                      "a waiting tensor acquire met a group: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_ptr_null(mt);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
}
END_TEST

struct bumper {
        const char *name;
        int versions;
};

static int bump_group(void *arg)
{
        const struct bumper *b = arg;
        dlx_client *p = fx_connect(&fx, "bumper");
        struct dlx_publish_options persist = {.persist = true};

        for (int v = 0; v < b->versions; v++) {
                fx_sleep_ms(50);
                publish_small_group(p, b->name, 4, (float)(100 * (v + 2)), &persist, NULL);
        }
        dlx_close(p);
        return 0;
}

/* G3: min_version waits for a group version at least that new, with every member of it. */
START_TEST(min_version_waits_for_whole_group)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "waiter");
        struct dlx_publish_options persist = {.persist = true};
        struct bumper b = {"mv", 3};
        struct dlx_acquire_options o = {.timeout_ms = 5000, .min_version = 3};
        dlx_group *g;

        publish_small_group(p, "mv", 4, 100, &persist, NULL);
        pid_t pid = fx_spawn(bump_group, &b);
        g = acquire_group_ok(q, "mv", NULL, 0, &o);
        ck_assert_uint_ge(dlx_group_version(g), 3);
        ck_assert_msg(small_group_is(g, 4, (float)(100 * dlx_group_version(g))),
                      "version %" PRIu64 " with members of another", dlx_group_version(g));
        dlx_group_release(g);
        ck_assert_int_eq(fx_wait(pid), 0);
        /* a version never reached: ETIMEDOUT; no wait: ENOENT */
        o.min_version = 99;
        o.timeout_ms = 100;
        g = NULL;
        ck_assert_int_eq(dlx_acquire_group(q, "mv", NULL, 0, &o, &g), -ETIMEDOUT);
        o.timeout_ms = 0;
        ck_assert_int_eq(dlx_acquire_group(q, "mv", NULL, 0, &o, &g), -ENOENT);
        ck_assert_ptr_null(g);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/*
 * G3 with a listed subset: a NULL, empty or over-long name is -EINVAL (or
 * -ENOENT), a name listed twice is refused or comes twice, and no failure
 * leaves a lease.
 */
START_TEST(subset_bad_lists_leave_no_lease)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        char longname[DLX_NAME_MAX + 2];
        dlx_group *g = NULL;
        int err;

        memset(longname, 'm', sizeof(longname) - 1);
        longname[sizeof(longname) - 1] = '\0';
        publish_small_group(p, "sub", 3, 0, NULL, NULL);
        const char *with_null[] = {"m0", NULL};
        ck_assert_int_eq(dlx_acquire_group(q, "sub", with_null, 2, NULL, &g), -EINVAL);
        const char *with_empty[] = {"m0", ""};
        err = dlx_acquire_group(q, "sub", with_empty, 2, NULL, &g);
        ck_assert_msg(err == -EINVAL || err == -ENOENT, "an empty member name: %d", err);
        const char *with_long[] = {longname};
        err = dlx_acquire_group(q, "sub", with_long, 1, NULL, &g);
        ck_assert_msg(err == -EINVAL || err == -ENOENT, "a 256-byte member name: %d", err);
        ck_assert_ptr_null(g);
        const char *twice[] = {"m1", "m1", "m2"};
        err = dlx_acquire_group(q, "sub", twice, 3, NULL, &g);
        if (err == 0) {
                ck_assert_uint_eq(dlx_group_count(g), 3);
                ck_assert_str_eq(dlx_group_name(g, 0), "m1");
                ck_assert_str_eq(dlx_group_name(g, 1), "m1");
                ck_assert_ptr_eq(dlx_group_tensor(g, 0)->data, dlx_group_tensor(g, 1)->data);
                ck_assert_float_eq(*(const float *)dlx_group_tensor(g, 2)->data, 2);
                dlx_group_release(g);
        } else {
                ck_assert_int_eq(err, -EINVAL);
        }
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* G3 ("one lease for the whole group"): --max-leases counts a group once, taken tensors not at all.
 */
START_TEST(max_leases_count_a_group_once)
{
        static const char *const args[] = {"--max-leases", "3", NULL};
        DLManagedTensorVersioned *t[8];
        dlx_group *g[4] = {NULL};

        dlxd_start(&fx, args);
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        publish_small_group(p, "lg", 8, 0, NULL, NULL);
        for (int i = 0; i < 3; i++)
                g[i] = acquire_group_ok(q, "lg", NULL, 0, NULL);
        for (int i = 0; i < 8; i++)
                DLXV(dlx_group_take(g[0], (size_t)i, &t[i]));
        ck_assert_uint_eq(fx_stats(q).leases, 3);
        ck_assert_int_eq(dlx_acquire_group(q, "lg", NULL, 0, NULL, &g[3]), -EAGAIN);
        dlx_group_release(g[1]);
        g[3] = acquire_group_ok(q, "lg", NULL, 0, NULL);
        /* g[0] released, its taken tensors still hold its one lease */
        dlx_group_release(g[0]);
        ck_assert_int_eq(dlx_acquire_group(q, "lg", NULL, 0, NULL, &g[1]), -EAGAIN);
        for (int i = 0; i < 8; i++)
                t[i]->deleter(t[i]);
        ck_assert_int_eq(fx_wait_leases(q, 2, 5000), 2);
        g[1] = acquire_group_ok(q, "lg", NULL, 0, NULL);
        dlx_group_release(g[1]);
        dlx_group_release(g[2]);
        dlx_group_release(g[3]);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* ---- G5: lifetimes ------------------------------------------------------------------------- */

/*
 * G5: after fork, the child reads the parent's taken tensor and group and
 * drops them (deleter, release); the parent's lease and mapping are
 * untouched.
 */
START_TEST(fork_child_drops_do_not_release_parent)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t;
        struct dlx_info info;

        publish_small_group(p, "fk", 4, 10, NULL, NULL);
        dlx_group *g = acquire_group_ok(q, "fk", NULL, 0, NULL);
        DLXV(dlx_group_take(g, 1, &t));
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int ok = *(const float *)t->dl_tensor.data == 11 && small_group_is(g, 4, 10);
                t->deleter(t);
                dlx_group_release(g);
                dlx_close(q);
                fx_child_exit(ok ? 0 : 1);
        }
        ck_assert_int_eq(fx_wait(pid), 0);
        fx_sleep_ms(50);
        DLXV(dlx_stat(p, "fk", &info));
        ck_assert_uint_eq(info.leases, 1);
        ck_assert(small_group_is(g, 4, 10));
        ck_assert_float_eq(*(const float *)t->dl_tensor.data, 11);
        dlx_group_release(g);
        DLXV(dlx_stat(p, "fk", &info));
        ck_assert_uint_eq(info.leases, 1);
        t->deleter(t);
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

static int publish_and_exit(void *arg)
{
        const struct dlx_publish_options *o = arg;
        dlx_client *p = fx_connect(&fx, "short-lived");

        publish_small_group(p, o->persist ? "pers" : "gone", 5, 7, o, NULL);
        _exit(0); /* no close: the connection just ends */
}

/*
 * G5 (README "Persistence"): a group dies with its producer's connection
 * unless persistent; a version leased before stays readable, and its bytes
 * go back when the lease does.
 */
START_TEST(producer_exit_ends_nonpersistent_group)
{
        dlx_client *q = fx_connect(&fx, "consumer");
        struct dlx_publish_options plain = {0}, persist = {.persist = true};
        struct dlx_acquire_options wait = {.timeout_ms = 5000};
        struct dlx_info info;
        uint64_t watch;
        struct dlx_event ev;

        DLXV(dlx_watch(q, "gone", &watch));
        /* the producer blocks on nothing: acquire as it publishes, before it exits */
        pid_t pid = fx_spawn(publish_and_exit, &plain);
        dlx_group *g = acquire_group_ok(q, "gone", NULL, 0, &wait);
        ck_assert_int_eq(fx_wait(pid), 0);
        for (int i = 0; i < 500 && dlx_stat(q, "gone", &info) == 0; i++)
                fx_sleep_ms(10);
        ck_assert_int_eq(dlx_stat(q, "gone", &info), -ENOENT);
        ck_assert(small_group_is(g, 5, 7));
        int published = 0, unpublished = 0;
        while (dlx_next_event(q, &ev, 300) == 0) {
                published += ev.kind == DLX_EVENT_PUBLISHED;
                unpublished += ev.kind == DLX_EVENT_UNPUBLISHED;
        }
        ck_assert_int_eq(published, 1);
        ck_assert_int_eq(unpublished, 1);
        dlx_group_release(g);
        for (int i = 0; i < 500 && fx_stats(q).bytes != 0; i++)
                fx_sleep_ms(10);
        ck_assert_uint_eq(fx_stats(q).bytes, 0);

        pid = fx_spawn(publish_and_exit, &persist);
        ck_assert_int_eq(fx_wait(pid), 0);
        g = acquire_group_ok(q, "pers", NULL, 0, &wait);
        ck_assert(small_group_is(g, 5, 7));
        DLXV(dlx_stat(q, "pers", &info));
        ck_assert(info.persist);
        ck_assert_int_eq(info.producer_pid, 0);
        ck_assert_uint_eq(info.members, 5);
        dlx_group_release(g);
        dlx_close(q);
}
END_TEST

/*
 * G5: a group held (not taken) across dlx_close() can still be released
 * afterwards, and a taken tensor still reads.
 */
START_TEST(group_released_after_close)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t;

        publish_small_group(p, "cl", 3, 1, NULL, NULL);
        dlx_group *g = acquire_group_ok(q, "cl", NULL, 0, NULL);
        DLXV(dlx_group_take(g, 2, &t));
        dlx_close(q);
        ck_assert_float_eq(*(const float *)t->dl_tensor.data, 3);
        dlx_group_release(g);
        ck_assert_float_eq(*(const float *)t->dl_tensor.data, 3);
        t->deleter(t);
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        dlx_close(p);
}
END_TEST

/* ---- G6: watches, tracks, stat and list ------------------------------------------------------ */

static int count_groups(void *ctx, const struct dlx_info *info)
{
        uint64_t *seen = ctx;

        if (info->members) {
                seen[0]++;
                seen[1] += info->members;
                seen[2] += info->nbytes;
        }
        return 0;
}

/*
 * G6: a track counts one version per group version; an unpublish is one
 * event; dlx_list shows each group with its member count and data bytes.
 */
START_TEST(track_list_and_unpublish_see_whole_groups)
{
        dlx_client *p = fx_connect(&fx, "producer"), *w = fx_connect(&fx, "watcher");
        uint32_t tr = track_ok(w, "tl/g");
        struct dlx_event ev;
        uint64_t watch, v = 0, seen[3] = {0};

        DLXV(dlx_watch(w, "tl/", &watch));
        for (int i = 0; i < 3; i++)
                publish_small_group(p, "tl/g", 16, 0, NULL, &v);
        ck_assert_uint_eq(v, 3);
        ck_assert_uint_eq(tracked_version(w, tr), 3);
        publish_small_group(p, "tl/h", 2, 0, NULL, NULL);
        publish_ok(p, "tl/t", fx_plain_f32(4, 0, NULL), NULL, NULL);
        ck_assert_int_eq(dlx_list(w, "tl/", count_groups, seen), 3);
        ck_assert_uint_eq(seen[0], 2);
        ck_assert_uint_eq(seen[1], 18);
        /* each member one float, each 64-aligned: at least 4 bytes, at most 64, a member */
        ck_assert_uint_ge(seen[2], 18 * 4);
        ck_assert_uint_le(seen[2], 18 * GROUP_MEMBER_ALIGN);
        DLXV(dlx_unpublish(p, "tl/g"));
        ck_assert_uint_eq(tracked_version(w, tr), 0);
        int events = 0, unpub = 0;
        while (dlx_next_event(w, &ev, 300) == 0) {
                events++;
                unpub += ev.kind == DLX_EVENT_UNPUBLISHED;
        }
        /* tl/g: 3 versions and an unpublish; tl/h and tl/t one each */
        ck_assert_int_eq(events, 6);
        ck_assert_int_eq(unpub, 1);
        dlx_close(w);
        dlx_close(p);
}
END_TEST

/* ---- G4: layouts at their edges ----------------------------------------------------------------
 */

/* G4: member names of 255 bytes come back whole; 256 is -EINVAL, deleting every member. */
START_TEST(member_names_at_the_limit)
{
        dlx_client *p = fx_connect(&fx, "producer");
        char n255a[DLX_NAME_MAX + 1], n255b[DLX_NAME_MAX + 1], n256[DLX_NAME_MAX + 2];
        float a = 1, b = 2;
        int deleted = 0;

        memset(n255a, 'a', DLX_NAME_MAX);
        n255a[DLX_NAME_MAX] = '\0';
        memcpy(n255b, n255a, sizeof(n255b));
        n255b[DLX_NAME_MAX - 1] = 'b';
        memset(n256, 'c', DLX_NAME_MAX + 1);
        n256[DLX_NAME_MAX + 1] = '\0';
        struct dlx_member ms[] = {{n255b, vec_f32(&b, 1, &deleted)},
                                  {n255a, vec_f32(&a, 1, &deleted)}};
        DLXV(dlx_publish_group(p, "names", ms, 2, NULL, NULL));
        dlx_group *g = acquire_group_ok(p, "names", NULL, 0, NULL);
        ck_assert_str_eq(dlx_group_name(g, 0), n255a);
        ck_assert_str_eq(dlx_group_name(g, 1), n255b);
        ck_assert_float_eq(*(const float *)dlx_group_tensor(g, 1)->data, 2);
        const char *one[] = {n255b};
        dlx_group_release(g);
        g = acquire_group_ok(p, "names", one, 1, NULL);
        ck_assert_float_eq(*(const float *)dlx_group_tensor(g, 0)->data, 2);
        dlx_group_release(g);
        struct dlx_member bad[] = {{n255a, vec_f32(&a, 1, &deleted)},
                                   {n256, vec_f32(&a, 1, &deleted)}};
        ck_assert_int_eq(dlx_publish_group(p, "names2", bad, 2, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleted, 4);
        dlx_close(p);
}
END_TEST

/*
 * G4: members of no elements, NULL data included, and a group of nothing
 * else, publish and come back with their shapes.
 */
START_TEST(empty_members_with_null_data)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        int64_t zero = 0, z2[2] = {3, 0};
        float x[2] = {5, 6};
        int err;

        struct dlx_member only[] = {
                {"e0", view_of(NULL, DT(kDLFloat, 32, 1), 1, &zero, NULL, 0, 0, NULL)},
                {"e1", view_of(NULL, DT(kDLInt, 8, 1), 2, z2, NULL, 0, 0, NULL)},
        };
        err = dlx_publish_group(p, "empty", only, 2, NULL, NULL);
        ck_assert_msg(err == 0, "a group of empty members: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        dlx_group *g = acquire_group_ok(q, "empty", NULL, 0, NULL);
        ck_assert_uint_eq(dlx_group_count(g), 2);
        ck_assert_int_eq(dlx_group_tensor(g, 0)->shape[0], 0);
        ck_assert_int_eq(dlx_group_tensor(g, 1)->ndim, 2);
        ck_assert_int_eq(dlx_group_tensor(g, 1)->shape[1], 0);
        struct dlx_info info;
        DLXV(dlx_stat(q, "empty", &info));
        ck_assert_uint_eq(info.nbytes, 0);
        dlx_group_release(g);

        struct dlx_member mixed[] = {
                {"e", view_of(NULL, DT(kDLFloat, 32, 1), 1, &zero, NULL, 0, 0, NULL)},
                {"x", vec_f32(x, 2, NULL)},
        };
        err = dlx_publish_group(p, "mixed", mixed, 2, NULL, NULL);
        ck_assert_msg(err == 0, "an empty member beside a full one: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        g = acquire_group_ok(q, "mixed", NULL, 0, NULL);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 1)->data)[1], 6);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* G4: packed and padded sub-byte members keep their bytes, flags and shapes. */
START_TEST(subbyte_members_keep_bytes_and_flags)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        static uint8_t packed[3] = {0x21, 0x43, 0x05}, padded[5] = {1, 2, 3, 4, 5};
        static uint8_t fp4[2] = {0xab, 0xcd};
        int64_t five = 5, four = 4;
        struct dlx_member ms[] = {
                {"int4", view_of(packed, DT(kDLInt, 4, 1), 1, &five, NULL, 0, 0, NULL)},
                {"int4pad", view_of(padded, DT(kDLInt, 4, 1), 1, &five, NULL, 0,
                                    DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, NULL)},
                {"fp4", view_of(fp4, DT(kDLFloat4_e2m1fn, 4, 1), 1, &four, NULL, 0, 0, NULL)},
        };
        int err = dlx_publish_group(p, "sb", ms, N_ELEMS(ms), NULL, NULL);
        ck_assert_msg(err == 0, "sub-byte members: %s (%s)", dlx_strerror(err), dlx_last_error());
        dlx_group *g = acquire_group_ok(q, "sb", NULL, 0, NULL);
        DLManagedTensorVersioned *t;
        int64_t i4 = dlx_group_find(g, "int4"), pd = dlx_group_find(g, "int4pad");
        int64_t f4 = dlx_group_find(g, "fp4");
        ck_assert(i4 >= 0 && pd >= 0 && f4 >= 0);
        ck_assert_int_eq(memcmp(dlx_group_tensor(g, (size_t)i4)->data, packed, 3), 0);
        ck_assert_int_eq(memcmp(dlx_group_tensor(g, (size_t)pd)->data, padded, 5), 0);
        ck_assert_int_eq(memcmp(dlx_group_tensor(g, (size_t)f4)->data, fp4, 2), 0);
        ck_assert_int_eq(dlx_group_tensor(g, (size_t)i4)->dtype.bits, 4);
        DLXV(dlx_group_take(g, (size_t)pd, &t));
        ck_assert(t->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
        ck_assert(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        t->deleter(t);
        DLXV(dlx_group_take(g, (size_t)i4, &t));
        ck_assert(!(t->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED));
        t->deleter(t);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

static const float *elem0(const dlx_group *g, const char *name)
{
        int64_t i = dlx_group_find(g, name);
        ck_assert_msg(i >= 0, "no member %s", name);
        const DLTensor *t = dlx_group_tensor(g, (size_t)i);
        return (const float *)((const uint8_t *)t->data + t->byte_offset);
}

/*
 * G4 ("members that share storage ... share it in the copy too, at the same
 * distance apart"): storage shared through negative strides, byte_offset,
 * other dtypes, interleaved strides and chains of overlaps stays shared,
 * every element where it was.
 */
START_TEST(odd_overlaps_stay_shared)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        float *buf = calloc(64, sizeof(float));
        int64_t n16 = 16, n32 = 32, n64b = 256, n10 = 10, n8 = 8;
        int64_t m1 = -1, s2 = 2;

        ck_assert_ptr_nonnull(buf);
        for (int i = 0; i < 64; i++)
                buf[i] = (float)i;
        struct dlx_member ms[] = {
                {"fwd", vec_f32(buf, 16, NULL)},
                /* the same 16 floats backwards, data at the last one */
                {"rev", view_of(buf + 15, DT(kDLFloat, 32, 1), 1, &n16, &m1, 0, 0, NULL)},
                /* backwards again, reached through byte_offset */
                {"revoff", view_of(buf, DT(kDLFloat, 32, 1), 1, &n16, &m1, 60, 0, NULL)},
                /* the whole buffer as bytes */
                {"bytes", view_of(buf, DT(kDLUInt, 8, 1), 1, &n64b, NULL, 0, 0, NULL)},
                /* even and odd elements of [32, 64) */
                {"even", view_of(buf + 32, DT(kDLFloat, 32, 1), 1, &n16, &s2, 0, 0, NULL)},
                {"odd", view_of(buf + 33, DT(kDLFloat, 32, 1), 1, &n16, &s2, 0, 0, NULL)},
                /* a chain: [16,26) [21,31) [28,36): each overlaps the next only */
                {"c0", view_of(buf + 16, DT(kDLFloat, 32, 1), 1, &n10, NULL, 0, 0, NULL)},
                {"c1", view_of(buf + 21, DT(kDLFloat, 32, 1), 1, &n10, NULL, 0, 0, NULL)},
                {"c2", view_of(buf + 28, DT(kDLFloat, 32, 1), 1, &n8, NULL, 0, 0, NULL)},
                {"tail", view_of(buf + 32, DT(kDLFloat, 32, 1), 1, &n32, NULL, 0, 0, NULL)},
        };
        int err = dlx_publish_group(p, "odd", ms, N_ELEMS(ms), NULL, NULL);
        ck_assert_msg(err == 0, "%s (%s)", dlx_strerror(err), dlx_last_error());
        free(buf);
        dlx_group *g = acquire_group_ok(q, "odd", NULL, 0, NULL);
        const float *fwd = elem0(g, "fwd");
        ck_assert_ptr_eq(elem0(g, "rev"), fwd + 15);
        ck_assert_ptr_eq(elem0(g, "revoff"), fwd + 15);
        ck_assert_ptr_eq((const void *)elem0(g, "bytes"), (const void *)fwd);
        ck_assert_ptr_eq(elem0(g, "even"), fwd + 32);
        ck_assert_ptr_eq(elem0(g, "odd"), fwd + 33);
        ck_assert_ptr_eq(elem0(g, "c0"), fwd + 16);
        ck_assert_ptr_eq(elem0(g, "c1"), fwd + 21);
        ck_assert_ptr_eq(elem0(g, "c2"), fwd + 28);
        ck_assert_ptr_eq(elem0(g, "tail"), fwd + 32);
        for (int i = 0; i < 64; i++)
                ck_assert_float_eq(fwd[i], (float)i);
        /* the whole buffer is one stretch of 256 bytes, after up to 63 that keep its alignment */
        struct dlx_info info;
        DLXV(dlx_stat(q, "odd", &info));
        ck_assert_uint_ge(info.nbytes, 256);
        ck_assert_uint_lt(info.nbytes, 256 + GROUP_MEMBER_ALIGN);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/*
 * byte_offsets a member may come with, its data pointer at data_at past a
 * 64-aligned address, its elements byte_offset bytes after it. The last row
 * is test-group.c's "offset" member (byte_offset 24) when malloc() put its
 * buffer 48 past a 64-byte boundary.
 */
static const struct {
        uint64_t data_at, byte_offset;
} byte_offsets[] = {{0, 8}, {0, 64}, {0, 200}, {0, 4096}, {48, 24}};

START_TEST(members_keep_any_byte_offset)
{
        const uint64_t off = byte_offsets[_i].byte_offset, at = byte_offsets[_i].data_at;
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        uint8_t *buf = aligned_alloc(4096, 8192 + 4096);
        float *far = aligned_alloc(64, 64);
        int64_t four = 4;
        int err;

        ck_assert(buf && far);
        float *elems = (float *)(buf + at + off);
        for (int i = 0; i < 4; i++) {
                elems[i] = 10.0f + (float)i;
                far[i] = 20.0f + (float)i;
        }
        /* alone */
        struct dlx_member one = {
                "w", view_of(buf + at, DT(kDLFloat, 32, 1), 1, &four, NULL, off, 0, NULL)};
        err = dlx_publish_group(p, "bo1", &one, 1, NULL, NULL);
        ck_assert_msg(err == 0, "a member of byte_offset %" PRIu64 " alone: %s (%s)", off,
                      dlx_strerror(err), dlx_last_error());
        dlx_group *g = acquire_group_ok(q, "bo1", NULL, 0, NULL);
        const DLTensor *t = dlx_group_tensor(g, 0);
        ck_assert_uint_eq(t->byte_offset, off);
        for (int i = 0; i < 4; i++)
                ck_assert_float_eq(((const float *)((const uint8_t *)t->data + off))[i],
                                   10.0f + (float)i);
        dlx_group_release(g);
        /* beside another member in memory of its own, the lowest or not */
        struct dlx_member two[] = {
                {"a", view_of(buf + at, DT(kDLFloat, 32, 1), 1, &four, NULL, off, 0, NULL)},
                {"b", vec_f32(far, 4, NULL)},
        };
        err = dlx_publish_group(p, "bo2", two, 2, NULL, NULL);
        ck_assert_msg(err == 0, "a member of byte_offset %" PRIu64 " beside another: %s (%s)", off,
                      dlx_strerror(err), dlx_last_error());
        g = acquire_group_ok(q, "bo2", NULL, 0, NULL);
        t = dlx_group_tensor(g, 0);
        ck_assert_uint_eq(t->byte_offset, off);
        ck_assert_float_eq(((const float *)((const uint8_t *)t->data + off))[3], 13.0f);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 1)->data)[3], 23.0f);
        dlx_group_release(g);
        free(buf);
        free(far);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/*
 * G4/G5: tensors taken from one group publish again, as members of another
 * group (a subset re-shared), their bytes copied out of the read-only
 * mapping; the first group's lease goes when they do.
 */
START_TEST(taken_members_publish_as_a_new_group)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "relay");
        DLManagedTensorVersioned *t0, *t2;

        publish_small_group(p, "src", 4, 5, NULL, NULL);
        dlx_group *g = acquire_group_ok(q, "src", NULL, 0, NULL);
        DLXV(dlx_group_take(g, 0, &t0));
        DLXV(dlx_group_take(g, 2, &t2));
        dlx_group_release(g);
        struct dlx_member ms[] = {{"m0", t0}, {"m2", t2}};
        int err = dlx_publish_group(q, "relayed", ms, 2, NULL, NULL);
        ck_assert_msg(err == 0, "%s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        g = acquire_group_ok(p, "relayed", NULL, 0, NULL);
        ck_assert_float_eq(*(const float *)dlx_group_tensor(g, 0)->data, 5);
        ck_assert_float_eq(*(const float *)dlx_group_tensor(g, 1)->data, 7);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- G3: many threads, other uids ------------------------------------------------------------ */

struct puller {
        dlx_client *c;
        int rounds;
        int bad;
};

static void *pull(void *arg)
{
        struct puller *pl = arg;
        const char *sub[] = {"m3", "m0"};

        for (int r = 0; r < pl->rounds; r++) {
                dlx_group *g = NULL;
                int err = dlx_acquire_group(pl->c, "mt", (r & 1) ? sub : NULL, (r & 1) ? 2 : 0,
                                            NULL, &g);
                if (err != 0) {
                        pl->bad++;
                        continue;
                }
                uint64_t v = dlx_group_version(g);
                if (r & 1) {
                        if (dlx_group_count(g) != 2 ||
                            *(const float *)dlx_group_tensor(g, 0)->data != (float)(v * 10 + 3))
                                pl->bad++;
                } else if (!small_group_is(g, 8, (float)(v * 10))) {
                        pl->bad++;
                }
                dlx_group_release(g);
        }
        return NULL;
}

/*
 * G3/G1: threads of one client acquiring (whole and subsets) while another
 * client publishes each see whole versions, and leave no lease.
 */
START_TEST(threads_acquire_whole_versions)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        struct puller pl[6];
        pthread_t th[6];
        const int ROUNDS = fx_slowdown() > 1 ? 30 : 300;
        uint64_t v = 0;

        publish_small_group(p, "mt", 8, 10, NULL, &v);
        for (int i = 0; i < 6; i++) {
                pl[i] = (struct puller){q, ROUNDS, 0};
                ck_assert_int_eq(pthread_create(&th[i], NULL, pull, &pl[i]), 0);
        }
        for (int i = 0; i < ROUNDS / 3; i++)
                publish_small_group(p, "mt", 8, (float)((v + 1) * 10), NULL, &v);
        for (int i = 0; i < 6; i++) {
                pthread_join(th[i], NULL);
                ck_assert_msg(pl[i].bad == 0, "thread %d: %d bad acquires", i, pl[i].bad);
        }
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

struct other_uid_result {
        int read_ok;
        int replace_err;
        int unpublish_err;
        int own_err;
};

static int other_uid_child(void *arg)
{
        struct other_uid_result *r = arg;
        dlx_client *c = connect_as(NOBODY);
        dlx_group *g = NULL;
        float a = 1;
        struct dlx_member m = {"x", vec_f32(&a, 1, NULL)};
        struct dlx_member m2 = {"y", vec_f32(&a, 1, NULL)};

        if (!c)
                return 3;
        if (dlx_acquire_group(c, "rootg", NULL, 0, NULL, &g) == 0) {
                r->read_ok = small_group_is(g, 4, 0);
                dlx_group_release(g);
        }
        r->replace_err = dlx_publish_group(c, "rootg", &m, 1, NULL, NULL);
        r->unpublish_err = dlx_unpublish(c, "rootg");
        r->own_err = dlx_publish_group(c, "nobodyg", &m2, 1, NULL, NULL);
        dlx_close(c);
        return 0;
}

/*
 * G3 and README "Access": another uid reads a root group, cannot replace or
 * remove it (-EACCES, the group whole), and its own group is charged to it.
 */
START_TEST(other_uid_reads_but_cannot_replace)
{
        static const char *const args[] = {"--group", "65534", NULL};
        struct other_uid_result *r;

        if (geteuid() != 0) { /* the child becomes another uid */
                fprintf(stderr, "other_uid_reads_but_cannot_replace: not root, skipped\n");
                return;
        }
        r = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        ck_assert_ptr_ne(r, MAP_FAILED);
        dlxd_start(&fx, args);
        open_to_others();
        dlx_client *p = fx_connect(&fx, "root");
        publish_small_group(p, "rootg", 4, 0, NULL, NULL);
        ck_assert_int_eq(fx_wait(fx_spawn(other_uid_child, r)), 0);
        ck_assert_int_eq(r->read_ok, 1);
        ck_assert_int_eq(r->replace_err, -EACCES);
        ck_assert_int_eq(r->unpublish_err, -EACCES);
        dlx_group *g = acquire_group_ok(p, "rootg", NULL, 0, NULL);
        ck_assert_uint_eq(dlx_group_version(g), 1);
        ck_assert(small_group_is(g, 4, 0));
        dlx_group_release(g);
        ck_assert_int_eq(r->own_err, 0);
        /* nobody's group died with its connection */
        struct dlx_info info;
        for (int i = 0; i < 500 && dlx_stat(p, "nobodyg", &info) == 0; i++)
                fx_sleep_ms(10);
        ck_assert_int_eq(dlx_stat(p, "nobodyg", &info), -ENOENT);
        munmap(r, 4096);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* ---- G1/G7: failures leave the last version whole ---------------------------------------------
 */

/*
 * G1 ("the new version replaces the old one whole"; "a partial or failed
 * group publish leaves nothing visible and nothing leaked"): a group over
 * --max-bytes is -ENOSPC, the version before stays current and whole, and
 * the bytes held are as before.
 */
START_TEST(failed_replace_keeps_last_version)
{
        static const char *const args[] = {"--max-bytes", "64K", NULL};
        float *big = calloc(32768, sizeof(float));
        int deleted = 0;

        ck_assert_ptr_nonnull(big);
        dlxd_start(&fx, args);
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        publish_small_group(p, "keep", 4, 1, NULL, NULL);
        struct dlx_stats before = fx_stats(q);
        struct dlx_member ms[] = {{"m0", vec_f32(big, 32768, &deleted)},
                                  {"m1", vec_f32(big, 4, &deleted)}};
        int err = dlx_publish_group(p, "keep", ms, 2, NULL, NULL);
        ck_assert_int_eq(err, -ENOSPC);
        ck_assert_int_eq(deleted, 2);
        dlx_group *g = acquire_group_ok(q, "keep", NULL, 0, NULL);
        ck_assert_uint_eq(dlx_group_version(g), 1);
        ck_assert(small_group_is(g, 4, 1));
        dlx_group_release(g);
        struct dlx_stats after = fx_stats(q);
        ck_assert_uint_eq(after.bytes, before.bytes);
        ck_assert_uint_eq(after.segments, before.segments);
        ck_assert_uint_eq(after.fds, before.fds);
        /* and a group under the limit still goes */
        publish_small_group(p, "keep", 4, 2, NULL, NULL);
        free(big);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/*
 * G7 for raw peers: --max-group-members and --max-group-table bind a table
 * a raw peer builds, not only what libdlx sends.
 */
START_TEST(raw_group_limits_bind_raw_peers)
{
        static const char *const args[] = {"--max-group-members", "2", "--max-group-table", "4K",
                                           NULL};
        static const struct gspec three[] = {
                {"a", {kDLFloat, 32, 1}, 1, {16}, {1}, 0, 0},
                {"b", {kDLFloat, 32, 1}, 1, {4}, {1}, 0, 64},
                {"c", {kDLFloat, 32, 1}, 1, {4}, {1}, 0, 128},
        };
        struct gspec longnames[16];
        char names[16][200];
        struct wire_reply rep;
        struct gseg g;

        dlxd_start(&fx, args);
        int sock = rp_connect(fx.socket, "hostile");
        dlx_client *q = fx_connect(&fx, "lib");
        struct dlx_stats before = fx_stats(q);
        gbuild(&g, three, 3, 4096, false);
        ck_assert_int_ne(raw_publish_group(sock, 2, "lim", &g, F_SEAL_WRITE, &rep), WIRE_OK);
        expect_nothing_left(q, "lim", &before, "3 members over --max-group-members 2");
        free(g.p);
        /* two members, but a table of over 4 KiB: names of 199 bytes do not make it; pad
         * the table with unused names instead */
        for (int i = 0; i < 2; i++) {
                memset(names[i], 'a' + i, 199);
                names[i][199] = '\0';
                longnames[i] = three[i];
                longnames[i].name = names[i];
        }
        gbuild(&g, longnames, 2, 4096, false);
        ck_assert_int_eq(raw_publish_group(sock, 3, "lim", &g, F_SEAL_WRITE, &rep), WIRE_OK);
        /* the same two members, names_size declaring 8 KiB of names: a table over the limit */
        struct gseg big;
        big.count = 2;
        big.data_bytes = 4096;
        big.size = 3 * 4096 + 4096;
        big.p = calloc(1, big.size);
        ck_assert_ptr_nonnull(big.p);
        memcpy(big.p, g.p, ghead(&g)->data_off);
        ghead(&big)->names_size = 8192;
        ghead(&big)->data_off = 3 * 4096;
        gmember(&big, 0)->offset = 3 * 4096;
        gmember(&big, 1)->offset = 3 * 4096 + 64;
        before = fx_stats(q);
        int st = raw_publish_group(sock, 4, "lim2", &big, F_SEAL_WRITE, &rep);
        ck_assert_msg(st != WIRE_OK, "a 12 KiB table taken under --max-group-table 4K");
        expect_nothing_left(q, "lim2", &before, "a table over --max-group-table");
        free(big.p);
        free(g.p);
        close(sock);
        dlx_close(q);
        dlxd_stop(&fx);
}
END_TEST

/* ---- scale ---------------------------------------------------------------------------------- */

/*
 * G3/G7 at scale: 100k members (2k under valgrind) publish and acquire,
 * whole, under one lease and one descriptor; times and the daemon's memory
 * per member are printed, not asserted.
 */
START_TEST(many_members_one_lease)
{
        const int N = fx_slowdown() > 1 || TOOLKIT_SANITIZED ? 2000 : 100000;
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        struct dlx_member *ms = calloc((size_t)N, sizeof(*ms));
        char(*names)[32] = calloc((size_t)N, 32);
        float *vals = calloc((size_t)N, sizeof(float));
        long rss0 = proc_status_kb(fx.pid, "VmRSS:");
        int q_fds0 = count_fds(0);

        ck_assert(ms && names && vals);
        for (int i = 0; i < N; i++) {
                snprintf(names[i], 32, "layers.%d.weight", i);
                vals[i] = (float)i;
                ms[i] = (struct dlx_member){names[i], vec_f32(&vals[i], 1, NULL)};
        }
        int64_t t0 = fx_now_ms();
        int err = dlx_publish_group(p, "big", ms, (size_t)N, NULL, NULL);
        int64_t t1 = fx_now_ms();
        ck_assert_msg(err == 0, "%d members: %s (%s)", N, dlx_strerror(err), dlx_last_error());
        dlx_group *g = acquire_group_ok(q, "big", NULL, 0, NULL);
        int64_t t2 = fx_now_ms();
        ck_assert_uint_eq(dlx_group_count(g), (size_t)N);
        ck_assert_uint_eq(fx_stats(q).leases, 1);
        ck_assert_int_le(count_fds(0) - q_fds0, 1);
        for (int i = 0; i < N; i += 997) {
                int64_t k = dlx_group_find(g, names[i]);
                ck_assert_int_ge(k, 0);
                ck_assert_float_eq(*(const float *)dlx_group_tensor(g, (size_t)k)->data, (float)i);
        }
        long rss1 = proc_status_kb(fx.pid, "VmRSS:");
        struct dlx_info info;
        DLXV(dlx_stat(q, "big", &info));
        ck_assert_uint_eq(info.members, (uint32_t)N);
        fprintf(stderr,
                "many_members_one_lease: %d members: publish %lld ms, acquire %lld ms, segment "
                "%" PRIu64 " bytes, daemon RSS %ld -> %ld kB (%.1f bytes/member)\n",
                N, (long long)(t1 - t0), (long long)(t2 - t1), info.segment_size, rss0, rss1,
                (double)(rss1 - rss0) * 1024.0 / N);
        /* a subset of 1000, every 100th */
        const char **sub = calloc(1000, sizeof(*sub));
        ck_assert_ptr_nonnull(sub);
        int ns = N / 100 < 1000 ? N / 100 : 1000;
        for (int i = 0; i < ns; i++)
                sub[i] = names[i * 100];
        dlx_group *s = acquire_group_ok(q, "big", sub, (size_t)ns, NULL);
        for (int i = 0; i < ns; i++)
                ck_assert_float_eq(*(const float *)dlx_group_tensor(s, (size_t)i)->data,
                                   (float)(i * 100));
        dlx_group_release(s);
        dlx_group_release(g);
        free(sub);
        free(ms);
        free(names);
        free(vals);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/*
 * A sparse memfd, sealed, sent as a group: whether its head is garbage or
 * says its table is the whole segment, dlxd reads what it checks and
 * allocates none of the segment's pages (which the sender would keep,
 * charged to dlxd, for as long as it held the fd).
 */
START_TEST(sparse_segment_allocates_nothing)
{
        static const struct {
                const char *what;
                bool good_magic;
                uint64_t data_off; /* 0: the segment's size */
        } rows[] = {
                {"garbage head", false, 4096},
                {"a table as big as the segment", true, 0},
                {"a table past the segment", true, UINT64_MAX / 2},
        };
        const uint64_t size = UINT64_C(1) << 30;
        dlx_client *c = fx_connect(&fx, "observer");
        int sock = rp_connect(fx.socket, "hostile");

        for (size_t i = 0; i < N_ELEMS(rows); i++) {
                struct group_head h = {.format = GROUP_FORMAT, .count = 1};
                struct wire_request req = {.id = 100 + i, .type = WIRE_REQ_PUBLISH};
                struct wire_tensor *t = &req.publish.tensor;
                struct wire_reply rep;
                struct stat st;
                int fd = memfd_create("sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING);

                memcpy(h.magic, rows[i].good_magic ? GROUP_MAGIC : "NOTAGRUP", 8);
                h.members_off = sizeof(h);
                h.dims_off = sizeof(h) + sizeof(struct group_member);
                h.names_off = h.dims_off;
                h.names_size = 2;
                h.data_off = rows[i].data_off ? rows[i].data_off : size;
                ck_assert_int_ge(fd, 0);
                ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
                ck_assert_int_eq(pwrite(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
                ck_assert_int_eq(fcntl(fd, F_ADD_SEALS,
                                       F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL),
                                 0);
                snprintf(t->name, sizeof(t->name), "sparse/%zu", i);
                t->dtype = (DLDataType){kDLUInt, 8, 1};
                t->ndim = 1;
                t->shape[0] = 0;
                t->strides[0] = 1;
                t->device_type = kDLCPU;
                t->storage = WIRE_STORAGE_MEMFD;
                t->offset = size;
                t->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
                t->members = 1;
                ck_assert_int_ne(raw_call(sock, &req, fd, &rep, NULL), WIRE_OK);
                ck_assert_int_eq(fstat(fd, &st), 0);
                ck_assert_msg((uint64_t)st.st_blocks * 512 <= (UINT64_C(1) << 20),
                              "%s: %llu bytes of the sparse segment allocated", rows[i].what,
                              (unsigned long long)st.st_blocks * 512);
                close(fd);
        }
        close(sock);
        dlx_close(c);
}
END_TEST

/* ---- tables checked off dlxd's loop ------------------------------------------------------ */

/* A valid segment of n float32 members of 1 element whose names are long: a table over 4 MiB. */
static void gbuild_big(struct gseg *g, uint32_t n, char (**ret_names)[80])
{
        char(*names)[80] = calloc(n, sizeof(*names));
        struct gspec *specs = calloc(n, sizeof(*specs));

        ck_assert(names && specs);
        for (uint32_t i = 0; i < n; i++) {
                /* zero-padded: the names sort as they are made */
                snprintf(names[i], sizeof(names[0]),
                         "layers.%07u.self_attention.query_key_value.weight.shard", i);
                specs[i] = (struct gspec){names[i], {kDLFloat, 32, 1}, 1, {1}, {1}, 0, 4 * i};
        }
        gbuild(g, specs, n, 4 * (uint64_t)n, false);
        ck_assert_uint_gt(ghead(g)->data_off, 4u << 20); /* past what dlxd checks inline */
        free(specs);
        *ret_names = names;
}

/*
 * A table over 4 MiB is checked off dlxd's loop, and its session is
 * answered in order all the same: an acquire sent right behind the
 * publish, in the same write, sees the version the publish made, and a
 * defect at the table's very end is refused as it is inline, leaving
 * nothing. A peer that hangs up right after sending a persistent one has
 * it published all the same, as a publish checked inline would be.
 */
START_TEST(big_tables_answered_in_order)
{
        enum { N = 70000 };
        dlx_client *c = fx_connect(&fx, "reader");
        int sock = rp_connect(fx.socket, "hostile");
        struct gseg g;
        char(*names)[80];
        struct wire_request req, acq;
        struct wire_reply rep;
        uint8_t frames[4096];
        size_t len;
        int fd, got = -1;

        gbuild_big(&g, N, &names);
        for (int round = 0; round < 2; round++) {
                fd = gmemfd(&g, F_SEAL_WRITE);
                group_publish_req(&req, 10 + 2 * (uint64_t)round, "big/ordered", &g);
                rp_acquire_req(&acq, 11 + 2 * (uint64_t)round, "big/ordered");
                acq.acquire.group = true;
                len = rp_frame(&req, 1, frames, sizeof(frames));
                len += rp_frame(&acq, 0, frames + len, sizeof(frames) - len);
                ck_assert_int_eq(rp_send_raw(sock, frames, len, &fd, 1), 0);
                close(fd);
                rp_expect_ok(sock, req.id, WIRE_REP_PUBLISH, &rep, NULL);
                uint64_t version = rep.publish.version;
                ck_assert_uint_eq(version, (uint64_t)round + 1);
                rp_expect_ok(sock, acq.id, WIRE_REP_ACQUIRE, &rep, &got);
                ck_assert_uint_eq(rep.acquire.tensor.version, version);
                if (got >= 0)
                        close(got);
        }

        /* what the publish made, whole, to another client */
        dlx_group *grp = acquire_group_ok(c, "big/ordered", NULL, 0, NULL);
        ck_assert_uint_eq(dlx_group_count(grp), N);
        ck_assert_str_eq(dlx_group_name(grp, N - 1), names[N - 1]);
        dlx_group_release(grp);

        /* the last member's name out of order: found at the table's end, off the loop */
        struct group_member *last = gmember(&g, N - 1);
        char *last_name = (char *)g.p + ghead(&g)->names_off + last->name_off;
        last_name[0] = 'a';
        struct dlx_stats before = fx_stats(c);
        ck_assert_int_eq(raw_publish_group(sock, 20, "big/bad", &g, F_SEAL_WRITE, &rep),
                         WIRE_INVALID);
        ck_assert_msg(strstr(rep.error, "out of order"), "%s", rep.error);
        expect_nothing_left(c, "big/bad", &before, "a big bad table");
        last_name[0] = 'l';

        /* sent, and hung up on at once: published, as the peer asked */
        fd = gmemfd(&g, F_SEAL_WRITE);
        group_publish_req(&req, 30, "big/orphan", &g);
        req.publish.persist = true;
        rp_send(sock, &req, fd);
        close(fd);
        close(sock);
        struct dlx_info info;
        int err = -ENOENT;
        for (int waited = 0; err == -ENOENT && waited < 10000 * fx_slowdown(); waited += 10) {
                err = dlx_stat(c, "big/orphan", &info);
                if (err == -ENOENT)
                        fx_sleep_ms(10);
        }
        ck_assert_int_eq(err, 0);
        ck_assert_uint_eq(info.members, N);
        ck_assert_int_eq(dlx_unpublish(c, "big/orphan"), 0);

        free(names);
        free(g.p);
        dlx_close(c);
}
END_TEST

Suite *group_attacks_suite(void)
{
        Suite *s = suite_create("group-attacks");
        TCase *raw = tcase_create("raw-peer");
        TCase *tc = tcase_create("promises");
        TCase *own = tcase_create("own-daemon");

        tcase_add_unchecked_fixture(raw, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(raw, fx_setup, fx_teardown);
        tcase_set_timeout(raw, 120);
        tcase_add_test(raw, raw_built_table_is_a_group);
        tcase_add_loop_test(raw, raw_bad_tables_refused, 0, (int)N_ELEMS(mutations));
        tcase_add_test(raw, raw_table_writable_by_sender_refused);
        tcase_add_test(raw, sparse_segment_allocates_nothing);
        tcase_add_test(raw, raw_group_by_segment_id_table_immutable);
        tcase_add_test(raw, raw_table_checked_is_table_sealed);
        tcase_add_test(raw, raw_held_group_segment_stays_read_only);
        tcase_add_test(raw, raw_acquire_group_one_descriptor);
        suite_add_tcase(s, raw);

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, waiting_acquire_meets_the_other_kind);
        tcase_add_test(tc, min_version_waits_for_whole_group);
        tcase_add_test(tc, subset_bad_lists_leave_no_lease);
        tcase_add_test(tc, fork_child_drops_do_not_release_parent);
        tcase_add_test(tc, producer_exit_ends_nonpersistent_group);
        tcase_add_test(tc, group_released_after_close);
        tcase_add_test(tc, track_list_and_unpublish_see_whole_groups);
        tcase_add_test(tc, member_names_at_the_limit);
        tcase_add_test(tc, empty_members_with_null_data);
        tcase_add_test(tc, subbyte_members_keep_bytes_and_flags);
        tcase_add_test(tc, odd_overlaps_stay_shared);
        tcase_add_rows(tc, members_keep_any_byte_offset, byte_offsets);
        tcase_add_test(tc, taken_members_publish_as_a_new_group);
        tcase_add_test(tc, threads_acquire_whole_versions);
        tcase_add_test(tc, many_members_one_lease);
        tcase_add_test(tc, big_tables_answered_in_order);
        suite_add_tcase(s, tc);

        tcase_add_unchecked_fixture(own, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(own, 120);
        tcase_add_test(own, max_leases_count_a_group_once);
        tcase_add_test(own, other_uid_reads_but_cannot_replace);
        tcase_add_test(own, failed_replace_keeps_last_version);
        tcase_add_test(own, raw_group_limits_bind_raw_peers);
        suite_add_tcase(s, own);
        return s;
}
