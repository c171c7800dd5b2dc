/* SPDX-License-Identifier: MIT */
/*
 * dlx_group_alloc() and dlx_group_publish(), read by a second reader: the
 * promises of dlx.h attacked, each test named after the promise it checks.
 *
 *  A1 alloc: "one memfd laid out as a published group is, each member compact
 *     and 64-byte aligned, zeroed"; members in name order; -EINVAL (a bad
 *     name, dtype, shape, a name twice, none), -E2BIG, -EOVERFLOW, -ENOMEM.
 *  A2 "writable until dlx_group_publish()"; taken tensors writable (not
 *     READ_ONLY) until then, READ_ONLY after.
 *  A3 publish: "its pages become read-only at the same addresses, in this
 *     process too (a write through any pointer into them faults from the
 *     first publish on), and are sealed, so that readers see exactly what
 *     was written".
 *  A4 "It may be published again, under this name or another, as it is";
 *     dlx_group_version() gives the last version published.
 *  A5 "its memory is this process's until dlx_group_release() and the last
 *     taken tensor": not the client's.
 *  A6 errors: -EINVAL (NULL, bad name, not from dlx_group_alloc(),
 *     DLX_COPY_ALWAYS), -ENOTSUP (writable), the daemon's (-ENOSPC); persist.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "tensors.h"

#define DLXV(call) ck_assert_int_eq((call), 0)

/* ---- helpers -------------------------------------------------------------------------------- */

static const int64_t n16 = 16, n4 = 4;

static dlx_group *alloc_ok(dlx_client *c, const struct dlx_member_layout *l, size_t n)
{
        dlx_group *g = NULL;
        int err = dlx_group_alloc(c, l, n, &g);

        ck_assert_msg(err == 0, "dlx_group_alloc: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_ptr_nonnull(g);
        return g;
}

/* Two float32 members, "a" (16) and "b" (4). */
static dlx_group *alloc_two(dlx_client *c)
{
        const struct dlx_member_layout l[] = {
                {"b", DT(kDLFloat, 32, 1), 1, &n4},
                {"a", DT(kDLFloat, 32, 1), 1, &n16},
        };
        return alloc_ok(c, l, N_ELEMS(l));
}

static float *member_f32(dlx_group *g, const char *name)
{
        int64_t k = dlx_group_find(g, name);

        ck_assert_msg(k >= 0, "no member %s", name);
        return (float *)dlx_group_tensor(g, (size_t)k)->data;
}

/* Fills alloc_two()'s members: a[i] = base + i, b[i] = -(base + i). */
static void fill_two(dlx_group *g, float base)
{
        float *a = member_f32(g, "a"), *b = member_f32(g, "b");

        for (int i = 0; i < 16; i++)
                a[i] = base + (float)i;
        for (int i = 0; i < 4; i++)
                b[i] = -(base + (float)i);
}

static bool two_is(const dlx_group *g, float base)
{
        int64_t ka = dlx_group_find(g, "a"), kb = dlx_group_find(g, "b");

        if (ka < 0 || kb < 0)
                return false;
        const float *a = dlx_group_tensor(g, (size_t)ka)->data;
        const float *b = dlx_group_tensor(g, (size_t)kb)->data;
        for (int i = 0; i < 16; i++)
                if (a[i] != base + (float)i)
                        return false;
        for (int i = 0; i < 4; i++)
                if (b[i] != -(base + (float)i))
                        return false;
        return true;
}

static void publish_ok_g(dlx_client *c, const char *name, dlx_group *g,
                         const struct dlx_publish_options *o, uint64_t *ret)
{
        int err = dlx_group_publish(c, name, g, o, ret);

        ck_assert_msg(err == 0, "dlx_group_publish %s: %s (%s)", name, dlx_strerror(err),
                      dlx_last_error());
}

static dlx_group *acquire_ok_g(dlx_client *c, const char *name)
{
        dlx_group *g = NULL;
        int err = dlx_acquire_group(c, name, NULL, 0, NULL, &g);

        ck_assert_msg(err == 0, "acquire %s: %s (%s)", name, dlx_strerror(err), dlx_last_error());
        return g;
}

/* A fresh consumer's view of name: whether it is alloc_two()'s content for base. */
static bool consumer_sees_two(dlx_client *q, const char *name, float base)
{
        dlx_group *g = acquire_ok_g(q, name);
        bool ok = two_is(g, base);

        dlx_group_release(g);
        return ok;
}

/* In a child: writes *p = v. */
struct poke {
        volatile float *p;
        float v;
};

static int poke_child(void *arg)
{
        struct poke *k = arg;
        struct rlimit no_core = {0, 0};

        /* the default action, not a sanitizer's handler, and no core */
        setrlimit(RLIMIT_CORE, &no_core);
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        *k->p = k->v;
        return 0;
}

/* Writes in a child; returns its status (128 + signal on a fault). */
static int poke_in_child(float *p, float v)
{
        struct poke k = {p, v};

        return fx_wait(fx_spawn(poke_child, &k));
}

static bool is_fault(int status)
{
        return status == 128 + SIGSEGV || status == 128 + SIGBUS;
}

/* ---- A1: the layout ------------------------------------------------------------------------- */

/* A1: members in name order, compact, 64-byte aligned, zeroed; their dtypes and shapes kept. */
START_TEST(alloc_gives_zeroed_aligned_members_in_name_order)
{
        dlx_client *c = fx_connect(&fx, "producer");
        const int64_t sh2[] = {3, 5}, one = 1;
        const struct dlx_member_layout l[] = {
                {"z.bias", DT(kDLFloat, 32, 1), 1, &one},
                {"a.weight", DT(kDLFloat, 16, 1), 2, sh2},
                {"m", DT(kDLUInt, 8, 1), 1, &n16},
        };
        dlx_group *g = alloc_ok(c, l, N_ELEMS(l));

        ck_assert_uint_eq(dlx_group_count(g), 3);
        ck_assert_str_eq(dlx_group_name(g, 0), "a.weight");
        ck_assert_str_eq(dlx_group_name(g, 1), "m");
        ck_assert_str_eq(dlx_group_name(g, 2), "z.bias");
        ck_assert_ptr_null(dlx_group_tensor(g, 3));
        for (size_t i = 0; i < 3; i++) {
                const DLTensor *t = dlx_group_tensor(g, i);
                ck_assert_int_eq(t->device.device_type, kDLCPU);
                ck_assert_uint_eq(((uintptr_t)t->data + t->byte_offset) % 64, 0);
                ck_assert(is_compact(t));
                uint64_t nb = numel_of(t->ndim, t->shape) * elem_size(t->dtype, 0);
                for (uint64_t b = 0; b < nb; b++)
                        ck_assert_uint_eq(((const uint8_t *)t->data + t->byte_offset)[b], 0);
                memset((uint8_t *)t->data + t->byte_offset, 0xa5, nb);
        }
        ck_assert_int_eq(dlx_group_tensor(g, 0)->ndim, 2);
        ck_assert_int_eq(dlx_group_tensor(g, 0)->shape[1], 5);
        ck_assert_int_eq(dlx_group_tensor(g, 0)->dtype.bits, 16);
        /* the memory is not handed to the daemon: nothing published, nothing held */
        ck_assert_uint_eq(fx_stats(c).segments, 0);
        dlx_group_release(g);
        dlx_close(c);
}
END_TEST

struct bad_alloc {
        const char *why;
        struct dlx_member_layout l[2];
        size_t n;
        int err, alt; /* the error expected, or alt */
};

static const int64_t neg = -1, huge2[] = {INT64_C(1) << 62, 8}, big59 = INT64_C(1) << 59;
static const int64_t sh33[33] = {1};
static char name256[257], name0[1];

static const struct bad_alloc bad_allocs[] = {
        {"no members", {{0}}, 0, -EINVAL, -EINVAL},
        {"a name twice",
         {{"x", DT(kDLFloat, 32, 1), 1, &n4}, {"x", DT(kDLFloat, 32, 1), 1, &n4}},
         2,
         -EINVAL,
         -EINVAL},
        {"a NULL name", {{NULL, DT(kDLFloat, 32, 1), 1, &n4}}, 1, -EINVAL, -EINVAL},
        {"an empty name", {{name0, DT(kDLFloat, 32, 1), 1, &n4}}, 1, -EINVAL, -EINVAL},
        {"a 256-byte name", {{name256, DT(kDLFloat, 32, 1), 1, &n4}}, 1, -EINVAL, -EINVAL},
        {"a negative dim", {{"x", DT(kDLFloat, 32, 1), 1, &neg}}, 1, -EINVAL, -EINVAL},
        {"a NULL shape", {{"x", DT(kDLFloat, 32, 1), 1, NULL}}, 1, -EINVAL, -EINVAL},
        {"ndim -1", {{"x", DT(kDLFloat, 32, 1), -1, &n4}}, 1, -EINVAL, -EINVAL},
        {"ndim 33", {{"x", DT(kDLFloat, 32, 1), 33, sh33}}, 1, -EINVAL, -EINVAL},
        {"bits 0", {{"x", DT(kDLFloat, 0, 1), 1, &n4}}, 1, -EINVAL, -EINVAL},
        {"lanes 0", {{"x", DT(kDLFloat, 32, 0), 1, &n4}}, 1, -EINVAL, -EINVAL},
        {"numel overflows", {{"x", DT(kDLFloat, 32, 1), 2, huge2}}, 1, -EOVERFLOW, -EINVAL},
        {"bytes overflow", {{"x", DT(kDLFloat, 32, 4), 1, &big59}}, 1, -EOVERFLOW, -EINVAL},
        /* 2^61 bytes each: the sum fits in 64 bits, no machine has it */
        {"2^62 bytes in all",
         {{"x", DT(kDLFloat, 32, 1), 1, &big59}, {"y", DT(kDLFloat, 32, 1), 1, &big59}},
         2,
         -ENOMEM,
         -EOVERFLOW},
};

/* A1: every bad layout is refused with the error dlx.h names, and leaves no fd behind. */
START_TEST(alloc_refuses_bad_layouts)
{
        const struct bad_alloc *r = &bad_allocs[_i];
        dlx_client *c = fx_connect(&fx, "producer");
        dlx_group *g = (dlx_group *)(uintptr_t)1;
        int fds = count_fds(0);

        memset(name256, 'n', 256);
        int err = dlx_group_alloc(c, r->l, r->n, &g);
        ck_assert_msg(err == r->err || err == r->alt, "%s: %d (%s), expected %d", r->why, err,
                      dlx_last_error(), r->err);
        ck_assert_int_eq(count_fds(0), fds);
        ck_assert_int_eq(dlx_group_alloc(c, NULL, 1, &g), -EINVAL);
        ck_assert_int_eq(dlx_group_alloc(c, bad_allocs[1].l, 1, NULL), -EINVAL);
        dlx_close(c);
}
END_TEST

/* A1: a 255-byte member name is a name; sub-byte and multi-lane dtypes keep their bytes. */
START_TEST(alloc_long_names_and_packed_dtypes_publish)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        static char name255[256];
        const int64_t five = 5, three = 3;
        memset(name255, 'w', 255);
        const struct dlx_member_layout l[] = {
                {name255, DT(kDLFloat, 32, 1), 1, &n4},
                {"int4", DT(kDLInt, 4, 1), 1, &five},
                {"f32x4", DT(kDLFloat, 32, 4), 1, &three},
                {"empty", DT(kDLFloat, 32, 1), 1, &(const int64_t){0}},
        };
        dlx_group *g = alloc_ok(p, l, N_ELEMS(l));
        static const uint8_t packed[3] = {0x21, 0x43, 0x05};
        uint8_t *i4 = (uint8_t *)member_f32(g, "int4");
        float *lanes = member_f32(g, "f32x4");

        memcpy(i4, packed, 3);
        for (int i = 0; i < 12; i++)
                lanes[i] = (float)i;
        member_f32(g, name255)[3] = 42;
        publish_ok_g(p, "packed", g, NULL, NULL);
        dlx_group *r = acquire_ok_g(q, "packed");
        ck_assert_uint_eq(dlx_group_count(r), 4);
        const DLTensor *t = dlx_group_tensor(r, (size_t)dlx_group_find(r, "int4"));
        ck_assert_int_eq(t->dtype.bits, 4);
        ck_assert_int_eq(t->shape[0], 5);
        ck_assert_int_eq(memcmp(t->data, packed, 3), 0);
        t = dlx_group_tensor(r, (size_t)dlx_group_find(r, "f32x4"));
        ck_assert_int_eq(t->dtype.lanes, 4);
        ck_assert_int_eq(t->shape[0], 3);
        ck_assert_float_eq(((const float *)t->data)[11], 11);
        ck_assert_float_eq(member_f32(r, name255)[3], 42);
        ck_assert_int_eq(dlx_group_tensor(r, (size_t)dlx_group_find(r, "empty"))->shape[0], 0);
        dlx_group_release(r);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A1: one member over the daemon's 2^20 is -E2BIG, before any memory is had. */
START_TEST(alloc_over_max_group_members_is_e2big)
{
        dlx_client *c = fx_connect(&fx, "producer");
        struct dlx_stats st = fx_stats(c);
        size_t n = (size_t)st.limits.max_group_members + 1;
        struct dlx_member_layout *l = calloc(n, sizeof(*l));
        char(*names)[12] = calloc(n, 12);
        dlx_group *g = NULL;

        ck_assert(l && names);
        ck_assert_uint_eq(st.limits.max_group_members, 1u << 20);
        for (size_t i = 0; i < n; i++) {
                snprintf(names[i], 12, "m%zu", i);
                l[i] = (struct dlx_member_layout){names[i], DT(kDLFloat, 32, 1), 1, &n4};
        }
        int err = dlx_group_alloc(c, l, n, &g);
        ck_assert_msg(err == -E2BIG, "%zu members: %d (%s)", n, err, dlx_last_error());
        free(l);
        free(names);
        dlx_close(c);
}
END_TEST

/*
 * A1: over a TiB is a size the memfd holds sparsely: either refused
 * (-ENOMEM/-EOVERFLOW) or given at once, without touching (zeroing) every page.
 */
START_TEST(alloc_past_a_tebibyte_is_refused_or_sparse)
{
        dlx_client *c = fx_connect(&fx, "producer");
        const int64_t n = (INT64_C(1) << 38) + 1; /* float32: 1 TiB + 4 bytes */
        const struct dlx_member_layout l[] = {{"huge", DT(kDLFloat, 32, 1), 1, &n}};
        dlx_group *g = NULL;
        int64_t t0 = fx_now_ms();
        int err = dlx_group_alloc(c, l, 1, &g);

        ck_assert_msg(err == 0 || err == -ENOMEM || err == -EOVERFLOW || err == -E2BIG,
                      "1 TiB: %d (%s)", err, dlx_last_error());
        ck_assert_int_lt(fx_now_ms() - t0, 5000 * fx_slowdown());
        if (err == 0) {
                float *d = member_f32(g, "huge");
                d[n - 1] = 7;
                ck_assert_float_eq(d[n - 1], 7);
                dlx_group_release(g);
        }
        dlx_close(c);
}
END_TEST

/* ---- A2/A3: writable, then read-only and sealed -----------------------------------------------
 */

/*
 * A2/A3: a tensor taken before publish is writable (not READ_ONLY) and what
 * is written through it is what readers see; after publish a write through
 * it, or through dlx_group_tensor()'s pointer got before, faults; a tensor
 * taken after is READ_ONLY.
 */
START_TEST(publish_makes_earlier_pointers_fault)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        dlx_group *g = alloc_two(p);
        DLManagedTensorVersioned *before = NULL, *after = NULL;
        float *a = member_f32(g, "a");

        DLXV(dlx_group_take(g, (size_t)dlx_group_find(g, "b"), &before));
        ck_assert(!(before->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
        /* writable: no fault before publish (the memfd is shared: fill_two() overwrites it) */
        ck_assert_int_eq(poke_in_child(a + 3, 99), 0);
        fill_two(g, 1);
        ((float *)before->dl_tensor.data)[0] = -1; /* the same as fill_two's, through the take */
        publish_ok_g(p, "pub", g, NULL, NULL);
        ck_assert(consumer_sees_two(q, "pub", 1));
        int st = poke_in_child(a + 3, 99);
        ck_assert_msg(is_fault(st), "write through dlx_group_tensor() after publish: status %d",
                      st);
        st = poke_in_child((float *)before->dl_tensor.data + 1, 99);
        ck_assert_msg(is_fault(st), "write through a tensor taken before publish: status %d", st);
        DLXV(dlx_group_take(g, 0, &after));
        ck_assert(after->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert_float_eq(((float *)before->dl_tensor.data)[1], -2);
        ck_assert(consumer_sees_two(q, "pub", 1));
        before->deleter(before);
        dlx_group_release(g);
        after->deleter(after);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* In a child: every way this process has to write the published pages. */
static int tamper_child(void *arg)
{
        float *p = arg;
        const float v = 1234;
        int changed = 0;
        char path[128];

        /* 1: make the pages writable again */
        if (mprotect((void *)((uintptr_t)p & ~(uintptr_t)4095), 4096, PROT_READ | PROT_WRITE) ==
            0) {
                *(volatile float *)p = v;
                changed |= 1;
        }
        /* 2: /proc/self/mem, which writes through page protection */
        int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
                if (pwrite(fd, &v, sizeof(v), (off_t)(uintptr_t)p) == (ssize_t)sizeof(v))
                        changed |= 2;
                close(fd);
        }
        /* 3: the mapping's file, reopened writable through /proc/self/map_files */
        FILE *maps = fopen("/proc/self/maps", "r");
        unsigned long lo, hi, off;
        char line[512];
        while (maps && fgets(line, sizeof(line), maps)) {
                if (sscanf(line, "%lx-%lx %*s %lx", &lo, &hi, &off) != 3 || (uintptr_t)p < lo ||
                    (uintptr_t)p >= hi)
                        continue;
                snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", lo, hi);
                fd = open(path, O_RDWR | O_CLOEXEC);
                if (fd >= 0) {
                        off_t at = (off_t)(off + ((uintptr_t)p - lo));
                        if (pwrite(fd, &v, sizeof(v), at) == (ssize_t)sizeof(v))
                                changed |= 4;
                        void *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                                       (off_t)(at & ~(off_t)4095));
                        if (w != MAP_FAILED) {
                                ((volatile float *)w)[(at & 4095) / 4] = v;
                                changed |= 8;
                                munmap(w, 4096);
                        }
                        close(fd);
                }
        }
        if (maps)
                fclose(maps);
        return changed;
}

/*
 * A3 "sealed, so that readers see exactly what was written": no way the
 * producer's process has (mprotect, /proc/self/mem, the mapping's file
 * reopened) changes what a reader maps.
 */
START_TEST(published_bytes_cannot_be_changed_by_producer)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        dlx_group *g = alloc_two(p);

        fill_two(g, 5);
        publish_ok_g(p, "sealed", g, NULL, NULL);
        dlx_group *held = acquire_ok_g(q, "sealed");
        int st = fx_wait(fx_spawn(tamper_child, member_f32(g, "a") + 2));
        ck_assert_msg(two_is(held, 5) && consumer_sees_two(q, "sealed", 5),
                      "published bytes changed after publish (tamper mask %d: 1 mprotect, 2 "
                      "/proc/self/mem, 4 map_files write, 8 map_files mmap)",
                      st);
        ck_assert(two_is(g, 5));
        dlx_group_release(held);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

struct fork_writer {
        int go[2], done[2];
        float *p;
};

/* A child forked before publish: waits for the publish, then writes. */
static int late_writer(void *arg)
{
        struct fork_writer *w = arg;
        char c;

        close(w->go[1]);
        close(w->done[0]);
        if (read(w->go[0], &c, 1) != 1)
                return 3;
        if (write(w->done[1], "w", 1) != 1) /* about to write: a fault ends the child */
                return 4;
        *(volatile float *)w->p = 4321;
        return 0;
}

/*
 * A3 with fork: a child forked after dlx_group_alloc() shares the memfd; the
 * parent's publish makes the pages read-only "in this process", but sealed
 * means no one writes them after: either publish fails, or the child's write
 * faults, or it does not reach what readers see.
 */
START_TEST(fork_before_publish_cannot_change_published_bytes)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        dlx_group *g = alloc_two(p);
        struct fork_writer w;
        char c;

        fill_two(g, 3);
        w.p = member_f32(g, "a") + 1;
        ck_assert_int_eq(pipe(w.go), 0);
        ck_assert_int_eq(pipe(w.done), 0);
        pid_t pid = fx_spawn(late_writer, &w);
        close(w.go[0]);
        close(w.done[1]);
        /* before publish: the child's writes are the memfd's (shared), not a promise: skip */
        int err = dlx_group_publish(p, "forked", g, NULL, NULL);
        ck_assert_int_eq(write(w.go[1], "g", 1), 1);
        ck_assert_int_eq(read(w.done[0], &c, 1), 1);
        int st = fx_wait(pid);
        close(w.go[1]);
        close(w.done[0]);
        if (err == 0) {
                ck_assert_msg(consumer_sees_two(q, "forked", 3),
                              "a child forked before publish wrote the published group (child "
                              "status %d, a[1] now %g)",
                              st, (double)member_f32(g, "a")[1]);
        } else {
                /* refused while the child's writable mapping lived: once it is gone the
                 * same group publishes, and readers see the producer's bytes exactly */
                fprintf(stderr, "fork_before_publish: publish refused: %s (%s)\n",
                        dlx_strerror(err), dlx_last_error());
                float a1 = member_f32(g, "a")[1];
                int refused = err;
                /* dlx.h: nothing published, and the group stays writable */
                ck_assert_msg(!is_fault(poke_in_child(member_f32(g, "a") + 3, 4)),
                              "after a refused publish the group is not writable");
                err = dlx_group_publish(p, "forked", g, NULL, NULL);
                ck_assert_msg(err == 0, "after the child is gone: %s (%s)", dlx_strerror(err),
                              dlx_last_error());
                dlx_group *r = acquire_ok_g(q, "forked");
                ck_assert_float_eq(member_f32(r, "a")[1], a1);
                ck_assert_float_eq(member_f32(r, "a")[2], 5);
                dlx_group_release(r);
                st = poke_in_child(member_f32(g, "a"), 1);
                ck_assert_msg(is_fault(st), "published, yet writable: child status %d", st);
                /* dlx.h: -EINVAL, -ENOTSUP, -EBUSY (this very case), and the daemon's errors */
                ck_assert_msg(refused == -EBUSY || refused == -EINVAL || refused == -ENOTSUP ||
                                      refused == -EACCES || refused == -ENOSPC ||
                                      refused == -EAGAIN || refused == -EOVERFLOW ||
                                      refused == -ENOMEM || refused == -E2BIG,
                              "a publish refused with an error dlx.h does not list: %s (%s)",
                              dlx_strerror(refused), "a child forked before holds a mapping");
        }
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A3: a child forked after publish inherits read-only pages: its write faults. */
START_TEST(fork_after_publish_write_faults)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        dlx_group *g = alloc_two(p);

        fill_two(g, 2);
        publish_ok_g(p, "fa", g, NULL, NULL);
        int st = poke_in_child(member_f32(g, "b"), 77);
        ck_assert_msg(is_fault(st), "child status %d", st);
        ck_assert(consumer_sees_two(q, "fa", 2));
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- A4: published again --------------------------------------------------------------------- */

struct racer {
        dlx_client *c;
        dlx_group *g;
        char name[16];
        uint64_t version;
        int err;
        pthread_barrier_t *bar;
};

static void *race_publish(void *arg)
{
        struct racer *r = arg;

        pthread_barrier_wait(r->bar);
        r->err = dlx_group_publish(r->c, r->name, r->g, NULL, &r->version);
        return NULL;
}

/*
 * A4 under races: 8 threads publish one allocated group at once, 4 under one
 * name and 4 under names of their own; all succeed, the shared name gets 4
 * distinct versions, dlx_group_version() is one of them or another's, and
 * every name reads the same bytes.
 */
START_TEST(concurrent_publishes_of_one_group_all_succeed)
{
        dlx_client *p = fx_connect(&fx, "producer"), *p2 = fx_connect(&fx, "producer2");
        dlx_client *q = fx_connect(&fx, "consumer");
        dlx_group *g = alloc_two(p);
        struct racer r[8];
        pthread_t th[8];
        pthread_barrier_t bar;

        fill_two(g, 9);
        pthread_barrier_init(&bar, NULL, 8);
        for (int i = 0; i < 8; i++) {
                r[i] = (struct racer){.c = i % 2 ? p2 : p, .g = g, .bar = &bar};
                snprintf(r[i].name, sizeof(r[i].name), i < 4 ? "same" : "own%d", i);
                ck_assert_int_eq(pthread_create(&th[i], NULL, race_publish, &r[i]), 0);
        }
        for (int i = 0; i < 8; i++)
                pthread_join(th[i], NULL);
        pthread_barrier_destroy(&bar);
        uint64_t seen = 0, last = dlx_group_version(g);
        bool last_is_one = false;
        for (int i = 0; i < 8; i++) {
                ck_assert_msg(r[i].err == 0, "thread %d (%s): %s", i, r[i].name,
                              dlx_strerror(r[i].err));
                last_is_one |= r[i].version == last;
                if (i < 4) {
                        ck_assert(r[i].version >= 1 && r[i].version <= 4);
                        ck_assert_msg(!(seen & (1u << r[i].version)), "version %" PRIu64 " twice",
                                      r[i].version);
                        seen |= 1u << r[i].version;
                }
                ck_assert(consumer_sees_two(q, r[i].name, 9));
        }
        ck_assert_msg(last_is_one, "dlx_group_version() %" PRIu64 " is no version published", last);
        /* and again, as it is, after the race */
        uint64_t v;
        publish_ok_g(p, "same", g, NULL, &v);
        ck_assert_uint_eq(v, 5);
        ck_assert_uint_eq(dlx_group_version(g), 5);
        ck_assert(consumer_sees_two(q, "same", 9));
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p2);
        dlx_close(p);
}
END_TEST

/* A4: a reader holding version 1 still reads it whole after versions 2 and 3 of the same memory. */
START_TEST(republished_versions_share_the_bytes)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        dlx_group *g = alloc_two(p);
        uint64_t v1, v2, v3;

        fill_two(g, 4);
        publish_ok_g(p, "rv", g, NULL, &v1);
        dlx_group *held = acquire_ok_g(q, "rv");
        publish_ok_g(p, "rv", g, NULL, &v2);
        publish_ok_g(p, "rv2", g, NULL, &v3);
        ck_assert_uint_eq(v2, v1 + 1);
        ck_assert_uint_eq(dlx_group_version(g), v3);
        ck_assert_uint_eq(dlx_group_version(held), v1);
        ck_assert(two_is(held, 4));
        ck_assert(consumer_sees_two(q, "rv", 4));
        ck_assert(consumer_sees_two(q, "rv2", 4));
        dlx_group_release(held);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/*
 * A4 "dlx_group_version() then gives the last version published", whether
 * the caller asked for the version (ret_version) or not.
 */
START_TEST(group_version_is_last_published_without_ret_version)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_group *g = alloc_two(p);
        struct dlx_info info;

        ck_assert_uint_eq(dlx_group_version(g), 0);
        publish_ok_g(p, "nv", g, NULL, NULL);
        publish_ok_g(p, "nv", g, NULL, NULL);
        DLXV(dlx_stat(p, "nv", &info));
        ck_assert_uint_eq(info.version, 2);
        ck_assert_msg(dlx_group_version(g) == 2,
                      "dlx_group_version() %" PRIu64 " after publishing version 2 (NULL "
                      "ret_version)",
                      dlx_group_version(g));
        dlx_group_release(g);
        dlx_close(p);
}
END_TEST

/*
 * A1/A4: a group whose members are all empty (shape 0) and a group of exactly
 * DLX_MAX_SEGMENT (1 TiB) of data: either refused at alloc, or published and read.
 */
START_TEST(edge_sized_groups_publish_or_refuse_at_alloc)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        const int64_t zero = 0, tib = INT64_C(1) << 38;
        const struct dlx_member_layout e[] = {{"e", DT(kDLFloat, 32, 1), 1, &zero}};
        const struct dlx_member_layout t[] = {{"t", DT(kDLFloat, 32, 1), 1, &tib}};
        dlx_group *g = alloc_ok(p, e, 1), *r;

        int err = dlx_group_publish(p, "empty", g, NULL, NULL);
        ck_assert_msg(err == 0, "all-empty group: %s (%s)", dlx_strerror(err), dlx_last_error());
        r = acquire_ok_g(q, "empty");
        ck_assert_int_eq(dlx_group_tensor(r, 0)->shape[0], 0);
        dlx_group_release(r);
        dlx_group_release(g);
        err = dlx_group_alloc(p, t, 1, &g);
        /* valgrind maps no TiB (mmap gives EINVAL there); 1 TiB of data and a table are
         * over what a segment holds: refused at alloc (dlx.h: -EOVERFLOW) */
        ck_assert_msg(err == 0 || err == -ENOMEM || err == -EOVERFLOW || fx_slowdown() > 1,
                      "1 TiB: %s (%s)", dlx_strerror(err), dlx_last_error());
        if (err == 0) {
                member_f32(g, "t")[tib - 1] = 3;
                err = dlx_group_publish(p, "tib", g, NULL, NULL);
                ck_assert_msg(err == 0 || err == -ENOSPC, "1 TiB publish: %s (%s)",
                              dlx_strerror(err), dlx_last_error());
                if (err == 0) {
                        r = acquire_ok_g(q, "tib");
                        ck_assert_float_eq(member_f32(r, "t")[tib - 1], 3);
                        dlx_group_release(r);
                }
                dlx_group_release(g);
        }
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- A5: the memory is the process's, not the client's ----------------------------------------
 */

/*
 * A5: tensors taken before publish keep the memory alive, writable, after
 * dlx_group_release() and dlx_close() of the client that allocated; no fd
 * outlives the last of them.
 */
START_TEST(taken_tensors_outlive_release_and_close)
{
        int fds = count_fds(0);
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_group *g = alloc_two(p);
        DLManagedTensorVersioned *ta, *tb;

        DLXV(dlx_group_take(g, (size_t)dlx_group_find(g, "a"), &ta));
        DLXV(dlx_group_take(g, (size_t)dlx_group_find(g, "a"), &tb));
        ck_assert_ptr_ne(ta, tb);
        dlx_group_release(g);
        dlx_close(p);
        float *d = ta->dl_tensor.data;
        for (int i = 0; i < 16; i++)
                d[i] = (float)i;
        ck_assert_float_eq(((float *)tb->dl_tensor.data)[15], 15);
        ta->deleter(ta);
        ck_assert_float_eq(((float *)tb->dl_tensor.data)[15], 15);
        tb->deleter(tb);
        ck_assert_int_eq(count_fds(0), fds);
}
END_TEST

/*
 * A5: the group is not tied to the client that allocated it: after that
 * client's dlx_close() another client publishes it, and readers see it.
 */
START_TEST(publish_with_another_client_after_close)
{
        dlx_client *a = fx_connect(&fx, "allocator"), *b = fx_connect(&fx, "publisher");
        dlx_client *q = fx_connect(&fx, "consumer");
        dlx_group *g = alloc_two(a);

        fill_two(g, 6);
        dlx_close(a);
        publish_ok_g(b, "other", g, NULL, NULL);
        ck_assert(consumer_sees_two(q, "other", 6));
        struct dlx_info info;
        DLXV(dlx_stat(q, "other", &info));
        ck_assert_int_eq(info.producer_pid, getpid());
        ck_assert_uint_eq(info.members, 2);
        dlx_group_release(g);
        ck_assert(consumer_sees_two(q, "other", 6));
        dlx_close(b);
        dlx_close(q);
}
END_TEST

static int persist_and_exit(void *arg)
{
        (void)arg;
        dlx_client *p = fx_connect(&fx, "short-lived");
        struct dlx_publish_options o = {.persist = true};
        dlx_group *g = alloc_two(p);

        fill_two(g, 8);
        if (dlx_group_publish(p, "kept", g, &o, NULL) != 0)
                return 2;
        _exit(0); /* no release, no close: the process just ends */
}

/* A6: persist is honoured: the producer exits, its group stays, whole. */
START_TEST(persisted_group_outlives_producer)
{
        dlx_client *q = fx_connect(&fx, "consumer");
        struct dlx_info info;

        ck_assert_int_eq(fx_wait(fx_spawn(persist_and_exit, NULL)), 0);
        ck_assert(consumer_sees_two(q, "kept", 8));
        DLXV(dlx_stat(q, "kept", &info));
        ck_assert(info.persist);
        ck_assert_uint_eq(info.members, 2);
        dlx_close(q);
}
END_TEST

/* ---- A6: errors ------------------------------------------------------------------------------ */

/*
 * A6: -EINVAL for NULL, a bad name, DLX_COPY_ALWAYS and a group not from
 * dlx_group_alloc(); -ENOTSUP for writable. None of these is a publish: the
 * group stays writable ("from the first publish on") and publishes after.
 */
START_TEST(refused_publishes_leave_group_writable)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        dlx_group *g = alloc_two(p), *acq;
        struct dlx_publish_options always = {.copy = DLX_COPY_ALWAYS}, wr = {.writable = true};

        fill_two(g, 1);
        ck_assert_int_eq(dlx_group_publish(NULL, "x", g, NULL, NULL), -EINVAL);
        ck_assert_int_eq(dlx_group_publish(p, NULL, g, NULL, NULL), -EINVAL);
        ck_assert_int_eq(dlx_group_publish(p, "x", NULL, NULL, NULL), -EINVAL);
        ck_assert_int_eq(dlx_group_publish(p, "", g, NULL, NULL), -EINVAL);
        ck_assert_int_eq(dlx_group_publish(p, "bad name\n", g, NULL, NULL), -EINVAL);
        ck_assert_int_eq(dlx_group_publish(p, "x", g, &always, NULL), -EINVAL);
        ck_assert_int_eq(dlx_group_publish(p, "x", g, &wr, NULL), -ENOTSUP);
        ck_assert_int_eq(dlx_stat(q, "x", &(struct dlx_info){0}), -ENOENT);
        int st = poke_in_child(member_f32(g, "a"), 1);
        ck_assert_msg(st == 0, "refused publishes made the group read-only: child status %d", st);
        fill_two(g, 2);
        publish_ok_g(p, "x", g, NULL, NULL);
        acq = acquire_ok_g(q, "x");
        ck_assert_int_eq(dlx_group_publish(q, "y", acq, NULL, NULL), -EINVAL);
        ck_assert(two_is(acq, 2));
        dlx_group_release(acq);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/*
 * A6 with --max-bytes: a publish over the limit is -ENOSPC and leaves nothing
 * held, no fd in this process or the daemon; once room is made the same
 * group publishes, with the bytes written before.
 */
START_TEST(enospc_publish_leaves_group_publishable)
{
        static const char *const args[] = {"--max-bytes", "64K", NULL};
        const int64_t n = 8192; /* 32 KiB */
        const struct dlx_member_layout l[] = {{"a", DT(kDLFloat, 32, 1), 1, &n16},
                                              {"big", DT(kDLFloat, 32, 1), 1, &n},
                                              {"b", DT(kDLFloat, 32, 1), 1, &n4}};

        dlxd_start(&fx, args);
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        int64_t hog_n = 10240; /* 40 KiB */
        DLManagedTensorVersioned *hog = fx_alloc_f32(p, hog_n);
        publish_ok(p, "hog", hog, NULL, NULL);
        struct dlx_stats before = fx_stats(q);
        int fds = count_fds(0);
        dlx_group *g = alloc_ok(p, l, N_ELEMS(l));
        fill_two(g, 11);
        member_f32(g, "big")[n - 1] = 5;
        int err = dlx_group_publish(p, "grp", g, NULL, NULL);
        ck_assert_msg(err == -ENOSPC, "over --max-bytes: %d (%s)", err, dlx_last_error());
        struct dlx_stats after = fx_stats(q);
        ck_assert_uint_eq(after.bytes, before.bytes);
        ck_assert_uint_eq(after.fds, before.fds);
        ck_assert_uint_eq(after.segments, before.segments);
        ck_assert_int_eq(dlx_stat(q, "grp", &(struct dlx_info){0}), -ENOENT);
        DLXV(dlx_unpublish(p, "hog"));
        err = dlx_group_publish(p, "grp", g, NULL, NULL);
        ck_assert_msg(err == 0, "after -ENOSPC, with room: %d (%s)", err, dlx_last_error());
        dlx_group *r = acquire_ok_g(q, "grp");
        ck_assert(two_is(r, 11));
        ck_assert_float_eq(member_f32(r, "big")[n - 1], 5);
        dlx_group_release(r);
        dlx_group_release(g);
        DLXV(dlx_unpublish(p, "grp"));
        for (int i = 0; i < 500 && fx_stats(q).bytes != 0; i++)
                fx_sleep_ms(10);
        ck_assert_uint_eq(fx_stats(q).bytes, 0);
        ck_assert_int_eq(count_fds(0), fds);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

Suite *group_alloc_attacks_suite(void)
{
        Suite *s = suite_create("group-alloc-attacks");
        TCase *tc = tcase_create("promises");
        TCase *own = tcase_create("own-daemon");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, alloc_gives_zeroed_aligned_members_in_name_order);
        tcase_add_rows(tc, alloc_refuses_bad_layouts, bad_allocs);
        tcase_add_test(tc, alloc_long_names_and_packed_dtypes_publish);
        tcase_add_test(tc, alloc_over_max_group_members_is_e2big);
        tcase_add_test(tc, alloc_past_a_tebibyte_is_refused_or_sparse);
        tcase_add_test(tc, publish_makes_earlier_pointers_fault);
        tcase_add_test(tc, published_bytes_cannot_be_changed_by_producer);
        tcase_add_test(tc, fork_before_publish_cannot_change_published_bytes);
        tcase_add_test(tc, fork_after_publish_write_faults);
        tcase_add_test(tc, concurrent_publishes_of_one_group_all_succeed);
        tcase_add_test(tc, republished_versions_share_the_bytes);
        tcase_add_test(tc, group_version_is_last_published_without_ret_version);
        tcase_add_test(tc, edge_sized_groups_publish_or_refuse_at_alloc);
        tcase_add_test(tc, taken_tensors_outlive_release_and_close);
        tcase_add_test(tc, publish_with_another_client_after_close);
        tcase_add_test(tc, persisted_group_outlives_producer);
        tcase_add_test(tc, refused_publishes_leave_group_writable);
        suite_add_tcase(s, tc);

        tcase_add_unchecked_fixture(own, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(own, 60);
        tcase_add_test(own, enospc_publish_leaves_group_publishable);
        suite_add_tcase(s, own);
        return s;
}
