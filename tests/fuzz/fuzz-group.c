/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the group table's check (proto/group.c), which dlxd runs on a
 * peer's group segment before anyone reads it, and every consumer after.
 *
 * Input: u32 max_count, u32 max_table (0: none), u32 apart (below 1 MiB: 0,
 * the members' bytes follow the table; else the size of the segment apart
 * that holds them, GROUP_FORMAT_APART), then the segment's bytes. The bytes
 * (and the apart segment, zeroed) are copied into buffers of exactly their
 * size, 8-byte aligned as a mapping is, so that a read past either is a
 * sanitizer's report. The check may read only the table (up to data_off); a
 * table it accepts must hold what consumers rely on, and this target checks
 * that without the check's own code: every member's name is NUL-terminated,
 * sorted, distinct and found by group_find(); every element byte of every
 * member lies in the data area (read, up to 4096 of each member's: a stride
 * of 0 repeats one element without end); the counts and limits were
 * honoured, and an apart table is all of its segment.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "group.h"
#include "layout.h"

/* Reads every byte member m's elements cover, walking its shape and strides. */
static uint64_t touch(const uint8_t *data, const int64_t *shape, const int64_t *strides, int ndim,
                      uint64_t elem, const uint8_t *lo, const uint8_t *hi)
{
        uint64_t sum = 0, idx[DLX_MAX_NDIM] = {0}, budget = 4096;

        for (int d = 0; d < ndim; d++)
                if (shape[d] == 0)
                        return 0;
        for (;;) {
                const uint8_t *p = data;
                for (int d = 0; d < ndim; d++)
                        p += (int64_t)idx[d] * strides[d] * (int64_t)elem;
                FUZZ_CHECK(p >= lo && p + elem <= hi, "an element outside the data area");
                for (uint64_t b = 0; b < elem; b++)
                        sum += p[b];
                if (--budget == 0)
                        return sum;
                int d = ndim - 1;
                while (d >= 0 && ++idx[d] == (uint64_t)shape[d])
                        idx[d--] = 0;
                if (d < 0)
                        return sum;
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct fuzz_input in = {data, size};
        uint32_t max_count = fuzz_u32(&in), max_table = fuzz_u32(&in);
        uint32_t apart = fuzz_u32(&in) % (1u << 20);
        const uint8_t *bytes;
        size_t n = fuzz_bytes(&in, in.left, &bytes);
        struct group_bounds bounds = {max_count, max_table, apart};
        struct group_summary sum;
        char why[256];
        uint8_t *seg, *other;

        seg = malloc(n ? n : 1);
        other = apart ? calloc(apart, 1) : NULL;
        if (!seg || (apart && !other)) {
                free(seg);
                free(other);
                return 0;
        }
        memcpy(seg, bytes, n);
        if (group_check(seg, n, &bounds, &sum, why, sizeof(why)) < 0) {
                FUZZ_CHECK(why[0] != '\0', "a refusal without a reason");
                free(seg);
                free(other);
                return 0;
        }
        const struct group_head *h = (const struct group_head *)seg;
        FUZZ_CHECK(sum.count == h->count && sum.count > 0, "count %u", sum.count);
        FUZZ_CHECK(max_count == 0 || sum.count <= max_count, "over max_count");
        FUZZ_CHECK(max_table == 0 || h->data_off <= max_table, "over max_table");
        FUZZ_CHECK(sum.data_off == h->data_off && h->data_off <= n, "data_off");
        FUZZ_CHECK(h->format == (apart ? GROUP_FORMAT_APART : GROUP_FORMAT), "format %u",
                   h->format);
        FUZZ_CHECK(!apart || (h->data_off == n && sum.data_bytes == apart), "apart table");
        /* where the members' data pointers are from, and the bytes they may cover */
        const uint8_t *from = apart ? other : seg, *lo = apart ? other : seg + h->data_off,
                      *hi = apart ? other + apart : seg + n;
        for (uint32_t i = 0; i < h->count; i++) {
                const struct group_member *m = group_member_at(seg, i);
                const char *name = group_member_name(seg, m);
                FUZZ_CHECK(strlen(name) == m->name_len, "member %u: no NUL after its name", i);
                FUZZ_CHECK(group_find(seg, name, m->name_len) == i, "member %u not found", i);
                if (i) {
                        const struct group_member *p = group_member_at(seg, i - 1);
                        FUZZ_CHECK(strcmp(group_member_name(seg, p), name) < 0,
                                   "members %u and %u out of order", i - 1, i);
                }
                const int64_t *dims = group_member_dims(seg, m);
                DLDataType dt = {m->dtype_code, m->dtype_bits, m->dtype_lanes};
                uint64_t bits = (uint64_t)dt.bits * dt.lanes;
                /* packed sub-byte members are compact: their bytes are checked as one run */
                if (bits % 8 == 0 && m->ndim <= DLX_MAX_NDIM)
                        touch(from + m->offset + m->byte_offset, dims, dims + m->ndim, m->ndim,
                              bits / 8, lo, hi);
        }
        free(seg);
        free(other);
        return 0;
}
