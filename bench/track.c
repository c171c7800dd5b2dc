/* SPDX-License-Identifier: MIT */
/*
 * track: "is there a newer version of X?" answered from the version page
 * (dlx_track_version, a load) and, for comparison, by asking the daemon
 * (dlx_stat, a round trip). In one child, against a name it publishes, in
 * blocks: the median block's time per call. The hand-off a tracker wakes for
 * is measured in the placement scenario ("tracked").
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

#define BLOCKS 11

struct track_run {
        long calls;          /* per block, dlx_track_version */
        long stats;          /* per block, dlx_stat */
        double peek[BLOCKS]; /* ns per call, each block */
        double stat[BLOCKS];
};

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;

        return (x > y) - (x < y);
}

static int tracker(int ctl, void *arg)
{
        struct track_run *r = arg;
        int64_t shape[1] = {64};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};
        DLManagedTensorVersioned *t = NULL;
        struct dlx_info info;
        char name[128];
        dlx_client *c = bench_connect("bench-track");
        uint64_t v = 0, sum = 0;
        uint32_t track;
        int err;

        (void)ctl;
        proto.shape = shape;
        if (!c)
                return 1;
        pin_self(ROLE_CLIENT); /* dlx_stat's round trip, like the other scenarios' */
        bench_name(name, sizeof(name), "track/peek");
        err = dlx_alloc(c, &proto, &t);
        if (err == 0)
                err = dlx_publish(c, name, t, NULL, NULL);
        if (err == 0)
                err = dlx_track(c, name, &track);
        if (err < 0) {
                dlx_close(c);
                return dlx_fail("track: setup", err) < 0;
        }
        for (int b = 0; b < BLOCKS && err == 0; b++) {
                uint64_t t0 = now_ns();
                for (long i = 0; i < r->calls && err == 0; i++) {
                        err = dlx_track_version(c, track, &v);
                        sum += v;
                }
                r->peek[b] = (double)(now_ns() - t0) / (double)r->calls;
                t0 = now_ns();
                for (long i = 0; i < r->stats && err == 0; i++)
                        err = dlx_stat(c, name, &info);
                r->stat[b] = (double)(now_ns() - t0) / (double)r->stats;
        }
        if (err < 0)
                dlx_fail("track: a call", err);
        else if (sum != (uint64_t)BLOCKS * (uint64_t)r->calls)
                err = -1, fprintf(stderr, "dlx-bench: track: the version read was not 1\n");
        dlx_close(c);
        return err < 0;
}

int run_track(void)
{
        struct track_run *r = shm_alloc(sizeof(*r));
        struct child ch;
        struct row row = {.scenario = "track", .has_value = true, .unit = "ns"};
        double peek, stat;
        int err;

        report_heading("track", "is there a newer version? from the version page, and by asking");
        if (!r) {
                report_error("track", "out of memory");
                return -1;
        }
        r->calls = opt.quick ? 10000 : 1000000;
        r->stats = opt.quick ? 100 : 2000;
        err = child_start(&ch, "tracker", tracker, r);
        if (err < 0) {
                report_error("track", "fork failed");
                shm_free(r, sizeof(*r));
                return -1;
        }
        err = child_done(&ch, 600000, "track");
        if (err == 0) {
                qsort(r->peek, BLOCKS, sizeof(double), cmp_double);
                qsort(r->stat, BLOCKS, sizeof(double), cmp_double);
                peek = r->peek[BLOCKS / 2];
                stat = r->stat[BLOCKS / 2];
                snprintf(row.key, sizeof(row.key), "track_version");
                snprintf(row.label, sizeof(row.label), "dlx_track_version, per call");
                row.value = peek;
                report_row(&row);
                snprintf(row.key, sizeof(row.key), "stat");
                snprintf(row.label, sizeof(row.label), "dlx_stat (a round trip), per call");
                row.value = stat;
                row.has_ratio = true;
                row.ratio = stat / peek;
                row.ratio_to = "track";
                report_row(&row);
                report_target("track_version", "dlx_track_version <= 1 us", peek, true, 1000, "ns");
        }
        shm_free(r, sizeof(*r));
        return err;
}
