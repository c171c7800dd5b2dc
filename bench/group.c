/* SPDX-License-Identifier: MIT */
/*
 * group: a whole state dict as one group against the same tensors one name
 * each. In one child, N small float32 tensors (20,000; 2,000 with --quick):
 *  - publish: one dlx_publish_group of all N, against N dlx_publish calls;
 *    and the same N filled in place (dlx_group_alloc) and published without
 *    a copy (dlx_group_publish): the floor a copy adds to;
 *  - acquire: one dlx_acquire_group and its release, against N acquires and
 *    releases of the single names; and the group with every member taken as
 *    a DLPack tensor of its own (what Python's acquire_dict does);
 *  - dlxd's memory: its RSS before and after G more groups of N members,
 *    per member (the table itself lives in the group's shared segment, which
 *    counts against the byte limits, not in dlxd's heap).
 *  - stall: another client's worst ping while one publishes a group with a
 *    table of hundreds of megabytes (800,000 members named with 200 bytes;
 *    20,000 with --quick), three times: what dlxd's loop makes others wait
 *    while it checks a table (it checks big ones on its thread pool).
 * Group figures are medians of repeats; the N single calls are timed whole.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#define REPEATS 9
#define MEMBER_FLOATS 16
#define RSS_GROUPS 8
#define STALL_NAME 200
#define STALL_PUBLISHES 3
#define STALL_PINGS (1 << 20)
/* A member's share of the table: its 48-byte record, shape and strides, its name and NUL. */
#define STALL_TABLE_PER_MEMBER (48 + 16 + STALL_NAME + 1)

struct group_run {
        long n;
        double publish_group[REPEATS]; /* ns */
        double publish_alloc[REPEATS]; /* dlx_group_publish of a dlx_group_alloc group */
        double acquire_group[REPEATS];
        double acquire_take[REPEATS];
        double publish_singles, acquire_singles; /* ns, all n */
        long rss_before, rss_after;              /* dlxd's, KiB */
        long rss_members;
        double table_per_member; /* bytes of the group's table, per member */
        long stall_members;
        double stall_max, stall_median, stall_publish; /* ns: pings, and the publishes' median */
        long stall_pings;
        int stall_ready, stall_stop; /* the pinger runs; the publisher is done (atomics) */
};

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;

        return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
        qsort(v, n, sizeof(double), cmp_double);
        return v[n / 2];
}

/* The members: views of one float buffer, MEMBER_FLOATS each, apart (nothing tied). */
static void members_fill(struct dlx_member *ms, char (*names)[48], float *buf, long n)
{
        DLDevice cpu = {kDLCPU, 0};

        for (long i = 0; i < n; i++) {
                snprintf(names[i], sizeof(names[0]), "layers.%ld.mlp.weight", i);
                ms[i].name = names[i];
                /* a gap after each, so that no two touch and each is its own block */
                ms[i].tensor = view_new(buf + i * (MEMBER_FLOATS + 16),
                                        MEMBER_FLOATS * sizeof(float), cpu);
        }
}

static int grouper(int ctl, void *arg)
{
        struct group_run *r = arg;
        long n = r->n;
        dlx_client *c = bench_connect("bench-group");
        struct dlx_member *ms = calloc((size_t)n, sizeof(*ms));
        char(*names)[48] = calloc((size_t)n, sizeof(*names));
        float *buf = calloc((size_t)n * (MEMBER_FLOATS + 16), sizeof(float));
        char gname[128], sname[128];
        dlx_group *g = NULL;
        int err = 0;

        (void)ctl;
        if (!c || !ms || !names || !buf) {
                fprintf(stderr, "dlx-bench: group: out of memory\n");
                return 1;
        }
        pin_self(ROLE_CLIENT);
        bench_name(gname, sizeof(gname), "group/model");

        for (int k = 0; k < REPEATS && err == 0; k++) {
                members_fill(ms, names, buf, n);
                uint64_t t0 = now_ns();
                err = dlx_publish_group(c, gname, ms, (size_t)n, NULL, NULL);
                r->publish_group[k] = (double)(now_ns() - t0);
        }
        if (err < 0)
                goto fail;
        /* the same layout, allocated and filled in place: a publish that copies nothing */
        struct dlx_member_layout *lay = calloc((size_t)n, sizeof(*lay));
        int64_t lshape[1] = {MEMBER_FLOATS};
        for (long i = 0; lay && i < n; i++)
                lay[i] = (struct dlx_member_layout){names[i], {kDLFloat, 32, 1}, 1, lshape};
        for (int k = 0; k < REPEATS && err == 0; k++) {
                dlx_group *a = NULL;
                err = lay ? dlx_group_alloc(c, lay, (size_t)n, &a) : -ENOMEM;
                for (size_t i = 0; err == 0 && i < (size_t)n; i++)
                        ((float *)dlx_group_tensor(a, i)->data)[0] = (float)k;
                uint64_t t0 = now_ns();
                if (err == 0)
                        err = dlx_group_publish(c, gname, a, NULL, NULL);
                r->publish_alloc[k] = (double)(now_ns() - t0);
                dlx_group_release(a);
        }
        free(lay);
        if (err < 0)
                goto fail;
        /* the copied group again, for the acquires below */
        members_fill(ms, names, buf, n);
        err = dlx_publish_group(c, gname, ms, (size_t)n, NULL, NULL);
        for (int k = 0; k < REPEATS && err == 0; k++) {
                uint64_t t0 = now_ns();
                err = dlx_acquire_group(c, gname, NULL, 0, NULL, &g);
                if (err == 0 && dlx_group_count(g) != (size_t)n)
                        err = -EPROTO;
                dlx_group_release(g);
                g = NULL;
                r->acquire_group[k] = (double)(now_ns() - t0);
        }
        for (int k = 0; k < REPEATS && err == 0; k++) {
                uint64_t t0 = now_ns();
                err = dlx_acquire_group(c, gname, NULL, 0, NULL, &g);
                for (size_t i = 0; err == 0 && i < dlx_group_count(g); i++) {
                        DLManagedTensorVersioned *t = NULL;
                        err = dlx_group_take(g, i, &t);
                        if (err == 0)
                                t->deleter(t);
                }
                dlx_group_release(g);
                g = NULL;
                r->acquire_take[k] = (double)(now_ns() - t0);
        }
        if (err < 0)
                goto fail;
        struct dlx_info info;
        err = dlx_stat(c, gname, &info);
        if (err == 0)
                r->table_per_member =
                        (double)(info.segment_size - info.nbytes) / (double)info.members;
        if (err < 0)
                goto fail;

        /*
         * The same tensors, one name each, published from dlx_alloc() memory:
         * the cheapest publish there is (no copy), and small tensors share a
         * segment, so that 20,000 names do not need 20,000 descriptors.
         */
        DLManagedTensorVersioned **singles = calloc((size_t)n, sizeof(*singles));
        int64_t shape[1] = {MEMBER_FLOATS};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}};
        proto.shape = shape;
        for (long i = 0; singles && i < n && err == 0; i++)
                err = dlx_alloc(c, &proto, &singles[i]);
        if (!singles)
                err = -ENOMEM;
        uint64_t t0 = now_ns();
        for (long i = 0; i < n && err == 0; i++) {
                bench_name(sname, sizeof(sname), "group/single/%ld", i);
                err = dlx_publish(c, sname, singles[i], NULL, NULL);
                singles[i] = NULL;
        }
        r->publish_singles = (double)(now_ns() - t0);
        for (long i = 0; singles && i < n; i++)
                if (singles[i])
                        singles[i]->deleter(singles[i]);
        free(singles);
        t0 = now_ns();
        for (long i = 0; i < n && err == 0; i++) {
                DLManagedTensorVersioned *t = NULL;
                bench_name(sname, sizeof(sname), "group/single/%ld", i);
                err = dlx_acquire(c, sname, NULL, &t);
                if (err == 0)
                        t->deleter(t);
        }
        r->acquire_singles = (double)(now_ns() - t0);
        for (long i = 0; i < n; i++) {
                bench_name(sname, sizeof(sname), "group/single/%ld", i);
                dlx_unpublish(c, sname);
        }
        if (err < 0)
                goto fail;

        /* dlxd's memory per member: RSS_GROUPS more groups, alive at once */
        if (opt.daemon_pid) {
                dlx_ping(c);
                r->rss_before = rss_kib(opt.daemon_pid);
                for (int k = 0; k < RSS_GROUPS && err == 0; k++) {
                        members_fill(ms, names, buf, n);
                        bench_name(sname, sizeof(sname), "group/rss/%d", k);
                        err = dlx_publish_group(c, sname, ms, (size_t)n, NULL, NULL);
                }
                dlx_ping(c);
                r->rss_after = rss_kib(opt.daemon_pid);
                r->rss_members = (long)RSS_GROUPS * n;
        }
fail:
        if (err < 0)
                dlx_fail("group", err);
        dlx_close(c);
        free(ms);
        free(names);
        free(buf);
        return err < 0;
}

/* Pings dlxd until the publisher is done: the worst and the median round trip. */
static int stall_pinger(int ctl, void *arg)
{
        struct group_run *r = arg;
        dlx_client *c = bench_connect("bench-group-pinger");
        double *lat = malloc(STALL_PINGS * sizeof(*lat));
        long n = 0;

        (void)ctl;
        if (!c || !lat) {
                fprintf(stderr, "dlx-bench: group: pinger: out of memory\n");
                return 1;
        }
        pin_self(ROLE_CLIENT);
        __atomic_store_n(&r->stall_ready, 1, __ATOMIC_RELEASE);
        while (!__atomic_load_n(&r->stall_stop, __ATOMIC_ACQUIRE) && n < STALL_PINGS) {
                uint64_t t0 = now_ns();
                if (dlx_ping(c) < 0)
                        break;
                lat[n++] = (double)(now_ns() - t0);
        }
        if (n > 0) {
                r->stall_median = median(lat, (size_t)n); /* sorts: the worst is last */
                r->stall_max = lat[n - 1];
        }
        r->stall_pings = n;
        free(lat);
        dlx_close(c);
        return n > 0 ? 0 : 1;
}

/* Publishes a group with a table of hundreds of megabytes, STALL_PUBLISHES times. */
static int stall_publisher(int ctl, void *arg)
{
        struct group_run *r = arg;
        long n = r->stall_members;
        dlx_client *c = bench_connect("bench-group-big");
        DLManagedTensorVersioned *ts = calloc((size_t)n, sizeof(*ts));
        struct dlx_member *ms = calloc((size_t)n, sizeof(*ms));
        char *names = malloc((size_t)n * (STALL_NAME + 1));
        float *data = calloc((size_t)n, sizeof(float));
        double took[STALL_PUBLISHES];
        int64_t one = 1;
        char gname[128];
        int err = 0;

        (void)ctl;
        if (!c || !ts || !ms || !names || !data) {
                fprintf(stderr, "dlx-bench: group: out of memory\n");
                __atomic_store_n(&r->stall_stop, 1, __ATOMIC_RELEASE);
                return 1;
        }
        pin_self(ROLE_CLIENT);
        bench_name(gname, sizeof(gname), "group/big");
        for (long i = 0; i < n; i++) {
                char *nm = names + (size_t)i * (STALL_NAME + 1);
                int k = snprintf(nm, STALL_NAME, "layers.%ld.", i);
                memset(nm + k, 'w', (size_t)(STALL_NAME - k));
                nm[STALL_NAME] = '\0';
        }
        while (!__atomic_load_n(&r->stall_ready, __ATOMIC_ACQUIRE))
                usleep(1000);
        for (int k = 0; k < STALL_PUBLISHES && err == 0; k++) {
                for (long i = 0; i < n; i++) {
                        ts[i] = (DLManagedTensorVersioned){
                                .version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION},
                                .dl_tensor = {.data = data + i,
                                              .device = {kDLCPU, 0},
                                              .ndim = 1,
                                              .dtype = {kDLFloat, 32, 1},
                                              .shape = &one}};
                        ms[i] = (struct dlx_member){names + (size_t)i * (STALL_NAME + 1), &ts[i]};
                }
                uint64_t t0 = now_ns();
                err = dlx_publish_group(c, gname, ms, (size_t)n, NULL, NULL);
                took[k] = (double)(now_ns() - t0);
        }
        __atomic_store_n(&r->stall_stop, 1, __ATOMIC_RELEASE);
        if (err < 0)
                dlx_fail("group", err);
        else
                r->stall_publish = median(took, STALL_PUBLISHES);
        dlx_unpublish(c, gname);
        dlx_close(c);
        free(ts);
        free(ms);
        free(names);
        free(data);
        return err < 0;
}

/* The stall figures: a pinger and a publisher, at once. Returns 0 or -1. */
static int run_stall(struct group_run *r)
{
        struct child pinger, publisher;

        r->stall_members = opt.quick ? 20000 : 800000;
        if (child_start(&pinger, "pinger", stall_pinger, r) < 0)
                return -1;
        if (child_start(&publisher, "publisher", stall_publisher, r) < 0) {
                __atomic_store_n(&r->stall_stop, 1, __ATOMIC_RELEASE);
                child_done(&pinger, 60000, "group");
                return -1;
        }
        int a = child_done(&publisher, 600000, "group");
        int b = child_done(&pinger, 60000, "group");
        return a < 0 || b < 0 ? -1 : 0;
}

int run_group(void)
{
        struct group_run *r = shm_alloc(sizeof(*r));
        struct child ch;
        char label[64];
        int err;

        report_heading("group", "a state dict as one group, against one name per tensor");
        if (!r) {
                report_error("group", "out of memory");
                return -1;
        }
        r->n = opt.quick ? 2000 : 20000;
        err = child_start(&ch, "grouper", grouper, r);
        if (err < 0) {
                report_error("group", "fork failed");
                shm_free(r, sizeof(*r));
                return -1;
        }
        err = child_done(&ch, 600000, "group");
        if (err == 0) {
                double pub = median(r->publish_group, REPEATS);
                double pub_alloc = median(r->publish_alloc, REPEATS);
                double acq = median(r->acquire_group, REPEATS);
                double take = median(r->acquire_take, REPEATS);
                double pub_ratio = r->publish_singles / pub, acq_ratio = r->acquire_singles / acq;

                snprintf(label, sizeof(label), "publish_group, %ld members", r->n);
                report_value("group", "publish_group_ms", label, pub / 1e6, "ms", 0, NULL);
                snprintf(label, sizeof(label), "%ld dlx_publish, one each", r->n);
                report_value("group", "publish_singles_ms", label, r->publish_singles / 1e6, "ms",
                             pub_ratio, "group");
                snprintf(label, sizeof(label), "dlx_group_publish, allocated in place");
                report_value("group", "publish_alloc_ms", label, pub_alloc / 1e6, "ms",
                             pub_alloc / pub, "group");
                snprintf(label, sizeof(label), "acquire_group + release, %ld members", r->n);
                report_value("group", "acquire_group_ms", label, acq / 1e6, "ms", 0, NULL);
                snprintf(label, sizeof(label), "... every member taken as a tensor");
                report_value("group", "acquire_take_ms", label, take / 1e6, "ms", take / acq,
                             "group");
                snprintf(label, sizeof(label), "%ld dlx_acquire + release, one each", r->n);
                report_value("group", "acquire_singles_ms", label, r->acquire_singles / 1e6, "ms",
                             acq_ratio, "group");
                if (r->rss_members) {
                        double per = (double)(r->rss_after - r->rss_before) * 1024.0 /
                                     (double)r->rss_members;
                        snprintf(label, sizeof(label), "dlxd RSS per member (%ld members)",
                                 r->rss_members);
                        report_value("group", "daemon_bytes_per_member", label, per, "B", 0, NULL);
                        report_value("group", "table_bytes_per_member",
                                     "group table per member, in its shared segment",
                                     r->table_per_member, "B", 0, NULL);
                        report_target("daemon_bytes_per_member", "dlxd memory per member <= 512 B",
                                      per, true, 512, "B");
                } else {
                        report_skip("group", "dlxd RSS per member", "dlxd's pid is not known");
                }
                if (run_stall(r) == 0) {
                        snprintf(label, sizeof(label), "publish_group, %ld members, %.0f MB table",
                                 r->stall_members,
                                 (double)r->stall_members * STALL_TABLE_PER_MEMBER / 1e6);
                        report_value("group", "stall_publish_ms", label, r->stall_publish / 1e6,
                                     "ms", 0, NULL);
                        report_value("group", "stall_ping_max_ms",
                                     "... another client's worst ping meanwhile",
                                     r->stall_max / 1e6, "ms", r->stall_max / r->stall_median,
                                     "its median");
                }
                if (!opt.quick) {
                        report_target("acquire_group_ratio", "group acquire >= 50x the singles'",
                                      acq_ratio, false, 50, "x");
                        report_target("acquire_group_ms", "group acquire of 20,000 <= 10 ms",
                                      acq / 1e6, true, 10, "ms");
                        report_target("publish_group_ratio", "group publish >= 50x the singles'",
                                      pub_ratio, false, 50, "x");
                        report_target("publish_group_ms", "group publish of 20,000 <= 10 ms",
                                      pub / 1e6, true, 10, "ms");
                }
        }
        shm_free(r, sizeof(*r));
        return err;
}
