/* SPDX-License-Identifier: MIT */
/*
 * The group table's check (proto/group.h) at its edges, for both formats:
 * members' bytes after the table (GROUP_FORMAT) and in a segment apart
 * (GROUP_FORMAT_APART, a device's memory): each bound passes at its value
 * and fails one past it, and a table of one format is never taken for the
 * other.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "group.h"
#include "toolkit.h"

struct spec {
        const char *name;
        int64_t n;      /* elements of a 1-D float32 member */
        int64_t stride; /* in elements */
        uint64_t at;    /* the data pointer, from the data area's start */
        uint64_t byte_offset;
};

struct table {
        uint8_t *base;
        uint64_t size; /* of the table's segment */
        uint64_t data_off;
};

/*
 * A table of the members (sorted by name already). apart: GROUP_FORMAT_APART,
 * the segment ends at the table; else GROUP_FORMAT with data_bytes after the
 * table, which is padded to 64.
 */
static struct table build(const struct spec *ms, uint32_t n, bool apart, uint64_t data_bytes)
{
        struct group_head h = {.format = apart ? GROUP_FORMAT_APART : GROUP_FORMAT, .count = n};
        uint64_t names = 0;
        struct table t;

        for (uint32_t i = 0; i < n; i++)
                names += strlen(ms[i].name) + 1;
        memcpy(h.magic, GROUP_MAGIC, sizeof(h.magic));
        h.members_off = sizeof(h);
        h.dims_off = h.members_off + n * sizeof(struct group_member);
        h.ndims = 2 * (uint64_t)n;
        h.names_off = h.dims_off + h.ndims * 8;
        h.names_size = names;
        h.data_off = apart ? h.names_off + names : (h.names_off + names + 63) / 64 * 64;
        t.data_off = h.data_off;
        t.size = h.data_off + (apart ? 0 : data_bytes);
        t.base = calloc(1, t.size);
        ck_assert_ptr_nonnull(t.base);
        memcpy(t.base, &h, sizeof(h));

        struct group_member *m = (struct group_member *)(t.base + h.members_off);
        int64_t *dims = (int64_t *)(t.base + h.dims_off);
        char *name = (char *)t.base + h.names_off;
        for (uint32_t i = 0; i < n; i++) {
                m[i] = (struct group_member){
                        .offset = (apart ? 0 : h.data_off) + ms[i].at,
                        .byte_offset = ms[i].byte_offset,
                        .flags = DLPACK_FLAG_BITMASK_READ_ONLY,
                        .dims = 2 * (uint64_t)i,
                        .name_off = (uint32_t)(name - (char *)t.base - h.names_off),
                        .name_len = (uint16_t)strlen(ms[i].name),
                        .ndim = 1,
                        .dtype_code = kDLFloat,
                        .dtype_bits = 32,
                        .dtype_lanes = 1,
                };
                dims[2 * i] = ms[i].n;
                dims[2 * i + 1] = ms[i].stride;
                strcpy(name, ms[i].name);
                name += strlen(ms[i].name) + 1;
        }
        return t;
}

static int check(const struct table *t, uint32_t max_count, uint64_t max_table, uint64_t apart,
                 struct group_summary *sum, char *why)
{
        struct group_bounds b = {max_count, max_table, apart};
        struct group_summary ignored;

        why[0] = '\0';
        int err = group_check(t->base, t->size, &b, sum ? sum : &ignored, why, 256);
        ck_assert_msg(err == 0 || why[0], "a refusal without a reason");
        return err;
}

/* Two members: "a" 16 float32 at 0, "b" 8 float32 at 64 (bytes [64, 96)). */
static const struct spec two[] = {{"a", 16, 1, 0, 0}, {"b", 8, 1, 64, 0}};

START_TEST(formats_are_never_mixed)
{
        struct table in = build(two, 2, false, 96), ap = build(two, 2, true, 0);
        struct group_summary sum;
        char why[256];

        ck_assert_int_eq(check(&in, 0, 0, 0, &sum, why), 0);
        ck_assert_uint_eq(sum.count, 2);
        ck_assert_uint_eq(sum.data_off, in.data_off);
        ck_assert_uint_eq(sum.data_bytes, 96);
        ck_assert_int_eq(check(&ap, 0, 0, 96, &sum, why), 0);
        ck_assert_uint_eq(sum.data_off, ap.size);
        ck_assert_uint_eq(sum.data_bytes, 96);
        /* either, taken for the other */
        ck_assert_int_eq(check(&in, 0, 0, 96, NULL, why), -EINVAL);
        ck_assert_msg(strstr(why, "format 1 is not 2"), "%s", why);
        ck_assert_int_eq(check(&ap, 0, 0, 0, NULL, why), -EINVAL);
        ck_assert_msg(strstr(why, "format 2 is not 1"), "%s", why);
        free(in.base);
        free(ap.base);
}
END_TEST

START_TEST(apart_elements_end_at_the_segment_end)
{
        struct table t = build(two, 2, true, 0);
        char why[256];

        ck_assert_int_eq(check(&t, 0, 0, 96, NULL, why), 0);
        ck_assert_int_eq(check(&t, 0, 0, 95, NULL, why), -EINVAL);
        ck_assert_msg(strstr(why, "member 'b'") && strstr(why, "outside"), "%s", why);
        /* a huge segment is no overflow */
        ck_assert_int_eq(check(&t, 0, 0, (uint64_t)INT64_MAX, NULL, why), 0);
        ck_assert_int_eq(check(&t, 0, 0, (uint64_t)INT64_MAX + 1, NULL, why), -EOVERFLOW);
        ck_assert_int_eq(check(&t, 0, 0, UINT64_MAX, NULL, why), -EOVERFLOW);
        free(t.base);
}
END_TEST

START_TEST(apart_pointers_and_reversed_members)
{
        /* "r": 4 float32 walked backwards from its pointer at 12: bytes [0, 16) */
        const struct spec rev[] = {{"r", 4, -1, 12, 0}};
        const struct spec before[] = {{"r", 4, -1, 8, 0}};   /* would start at -4 */
        const struct spec past[] = {{"z", 0, 1, 4097, 0}};   /* empty, pointer past the end */
        const struct spec at_end[] = {{"z", 0, 1, 4096, 0}}; /* empty, pointer at the end */
        const struct spec byte_off[] = {{"o", 2, 1, 0, 8}};  /* elements [8, 16) */
        struct table t;
        char why[256];

        t = build(rev, 1, true, 0);
        ck_assert_int_eq(check(&t, 0, 0, 16, NULL, why), 0);
        ck_assert_int_eq(check(&t, 0, 0, 15, NULL, why), -EINVAL);
        free(t.base);
        t = build(before, 1, true, 0);
        ck_assert_int_eq(check(&t, 0, 0, 4096, NULL, why), -EINVAL);
        free(t.base);
        t = build(past, 1, true, 0);
        ck_assert_int_eq(check(&t, 0, 0, 4096, NULL, why), -EINVAL);
        ck_assert_msg(strstr(why, "data pointer"), "%s", why);
        free(t.base);
        t = build(at_end, 1, true, 0);
        ck_assert_int_eq(check(&t, 0, 0, 4096, NULL, why), 0);
        free(t.base);
        t = build(byte_off, 1, true, 0);
        ck_assert_int_eq(check(&t, 0, 0, 16, NULL, why), 0);
        ck_assert_int_eq(check(&t, 0, 0, 15, NULL, why), -EINVAL);
        free(t.base);
}
END_TEST

START_TEST(apart_table_is_all_of_its_segment)
{
        struct table t = build(two, 2, true, 0);
        uint8_t *longer = calloc(1, t.size + 64);
        struct group_bounds b = {0, 0, 96};
        struct group_summary sum;
        char why[256] = "";

        ck_assert_ptr_nonnull(longer);
        memcpy(longer, t.base, t.size);
        ck_assert_int_eq(group_check(longer, t.size + 64, &b, &sum, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "apart"), "%s", why);
        free(longer);
        free(t.base);
}
END_TEST

START_TEST(limits_pass_at_their_value)
{
        struct table in = build(two, 2, false, 96), ap = build(two, 2, true, 0);
        char why[256];

        for (int k = 0; k < 2; k++) {
                struct table *t = k ? &ap : &in;
                uint64_t apart = k ? 96 : 0;
                ck_assert_int_eq(check(t, 2, 0, apart, NULL, why), 0);
                ck_assert_int_eq(check(t, 1, 0, apart, NULL, why), -E2BIG);
                ck_assert_int_eq(check(t, 0, t->data_off, apart, NULL, why), 0);
                ck_assert_int_eq(check(t, 0, t->data_off - 1, apart, NULL, why), -E2BIG);
        }
        free(in.base);
        free(ap.base);
}
END_TEST

START_TEST(inline_elements_stay_in_the_data_area)
{
        /* "a" at -64 from the data area: in the segment (the table), not in its data */
        const struct spec low[] = {{"a", 16, 1, 0, 0}};
        struct table t = build(low, 1, false, 64);
        struct group_member *m;
        char why[256];

        ck_assert_int_eq(check(&t, 0, 0, 0, NULL, why), 0);
        m = (struct group_member *)(t.base + sizeof(struct group_head));
        m->offset -= 64;
        ck_assert_int_eq(check(&t, 0, 0, 0, NULL, why), -EINVAL);
        ck_assert_msg(strstr(why, "outside the group's data"), "%s", why);
        /* a pointer before the data area is allowed when byte_offset brings it back */
        m->byte_offset = 64;
        ck_assert_int_eq(check(&t, 0, 0, 0, NULL, why), 0);
        free(t.base);
}
END_TEST

Suite *group_table_suite(void)
{
        Suite *s = suite_create("group-table");
        TCase *tc = tcase_create("check");

        tcase_add_test(tc, formats_are_never_mixed);
        tcase_add_test(tc, apart_elements_end_at_the_segment_end);
        tcase_add_test(tc, apart_pointers_and_reversed_members);
        tcase_add_test(tc, apart_table_is_all_of_its_segment);
        tcase_add_test(tc, limits_pass_at_their_value);
        tcase_add_test(tc, inline_elements_stay_in_the_data_area);
        suite_add_tcase(s, tc);
        return s;
}
