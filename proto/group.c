/* SPDX-License-Identifier: MIT */
/* The group table's check (proto/group.h): what dlxd and every consumer trust it for. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "group.h"
#include "layout.h"
#include "wire_limits.h"

int group_name_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
        int c = memcmp(a, b, alen < blen ? alen : blen);
        if (c)
                return c;
        return alen < blen ? -1 : alen > blen;
}

/* Whether [off, off + len) lies within [lo, hi), without overflow. */
static bool within(uint64_t off, uint64_t len, uint64_t lo, uint64_t hi)
{
        return off >= lo && off <= hi && len <= hi - off;
}

#define FAIL(err, ...)                                                                             \
        do {                                                                                       \
                snprintf(why, whysz, __VA_ARGS__);                                                 \
                return (err);                                                                      \
        } while (0)

/*
 * Member i of a table whose members' data pointers lie in [0, limit) of
 * their segment and whose elements lie in [data_lo, limit).
 */
static int check_member(const uint8_t *base, const struct group_head *h, uint64_t data_lo,
                        uint64_t limit, uint32_t i, const struct group_member *prev, char *why,
                        size_t whysz)
{
        const struct group_member *m = group_member_at(base, i);
        const char *reason = NULL;
        const char *name;
        int64_t lo, hi;
        int err;

        if (m->name_len == 0 || m->name_len > DLX_NAME_MAX || m->reserved || m->reserved2)
                FAIL(-EINVAL, "member %u: name length %u, or reserved fields not 0", i,
                     m->name_len);
        if (!within(m->name_off, (uint64_t)m->name_len + 1, 0, h->names_size))
                FAIL(-EINVAL, "member %u: its name lies outside the names", i);
        name = group_member_name(base, m);
        if (name[m->name_len] != '\0')
                FAIL(-EINVAL, "member %u: its name has no NUL after %u bytes", i, m->name_len);
        if (layout_name_check(name, m->name_len, &reason) < 0)
                FAIL(-EINVAL, "member %u ('%.*s'): %s", i, (int)m->name_len, name, reason);
        if (prev &&
            group_name_cmp(group_member_name(base, prev), prev->name_len, name, m->name_len) >= 0)
                FAIL(-EINVAL, "member '%.*s' is out of order or named twice", (int)m->name_len,
                     name);
        if (m->ndim > DLX_MAX_NDIM)
                FAIL(-EINVAL, "member '%s': %u dimensions", name, m->ndim);
        if (m->dims > h->ndims || 2 * (uint64_t)m->ndim > h->ndims - m->dims)
                FAIL(-EINVAL, "member '%s': its dims lie outside the dims array", name);
        if (m->flags &
            ~(uint64_t)(DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED))
                FAIL(-EINVAL, "member '%s': unknown flags 0x%llx", name,
                     (unsigned long long)m->flags);

        DLDataType dt = {.code = m->dtype_code, .bits = m->dtype_bits, .lanes = m->dtype_lanes};
        const int64_t *dims = group_member_dims(base, m);
        err = layout_extent(dt, m->ndim, dims, dims + m->ndim, m->byte_offset, m->flags, &lo, &hi,
                            &reason);
        if (err < 0)
                FAIL(err, "member '%s': %s", name, reason);
        /* the elements, [offset + lo, offset + hi), lie in the data area */
        /* (a byte_offset may put the pointer itself before the data area, in the segment) */
        if (m->offset > limit)
                FAIL(-EINVAL, "member '%s': its data pointer lies outside the group's segment",
                     name);
        if (hi > lo) {
                uint64_t neg = lo < 0 ? 0 - (uint64_t)lo : 0;
                /* offset <= limit < 2^63 and lo < 2^63: no overflow */
                uint64_t start = lo < 0 ? m->offset - neg : m->offset + (uint64_t)lo;
                if (neg > m->offset || !within(start, (uint64_t)hi - (uint64_t)lo, data_lo, limit))
                        FAIL(-EINVAL,
                             "member '%s': its elements reach outside the group's data "
                             "(offset %llu, extent [%lld, %lld), data [%llu, %llu))",
                             name, (unsigned long long)m->offset, (long long)lo, (long long)hi,
                             (unsigned long long)data_lo, (unsigned long long)limit);
        }
        return 0;
}

int group_check_head(const struct group_head *h, uint64_t size, const struct group_bounds *b,
                     char *why, size_t whysz)
{
        uint32_t max_count = b->max_count,
                 format = b->apart_size ? GROUP_FORMAT_APART : GROUP_FORMAT;
        uint64_t max_table = b->max_table, members_bytes;

        if (size < sizeof(*h))
                FAIL(-EINVAL, "a group segment of %llu bytes has no room for its head",
                     (unsigned long long)size);
        if (size > INT64_MAX)
                FAIL(-EOVERFLOW, "a group segment of %llu bytes", (unsigned long long)size);
        if (memcmp(h->magic, GROUP_MAGIC, sizeof(h->magic)) != 0)
                FAIL(-EINVAL, "not a group segment (bad magic)");
        if (h->format != format)
                FAIL(-EINVAL, "group format %u is not %u (%s)", h->format, format,
                     b->apart_size ? "its members' bytes in a segment of their own"
                                   : "its members' bytes after the table");
        if (b->apart_size > INT64_MAX)
                FAIL(-EOVERFLOW, "a group data segment of %llu bytes",
                     (unsigned long long)b->apart_size);
        if (max_count == 0 || max_count > GROUP_MEMBERS_MAX)
                max_count = GROUP_MEMBERS_MAX;
        if (h->count == 0)
                FAIL(-EINVAL, "a group has no members");
        if (h->count > max_count)
                FAIL(-E2BIG, "a group of %u members is over the limit of %u", h->count, max_count);
        if (h->data_off < sizeof(*h) || h->data_off > size)
                FAIL(-EINVAL, "the data area's start %llu is outside the %llu-byte segment",
                     (unsigned long long)h->data_off, (unsigned long long)size);
        if (b->apart_size && h->data_off != size)
                FAIL(-EINVAL,
                     "the table ends at %llu, and its %llu-byte segment holds nothing else: "
                     "the members' bytes are apart",
                     (unsigned long long)h->data_off, (unsigned long long)size);
        if (max_table && h->data_off > max_table)
                FAIL(-E2BIG, "a group table of %llu bytes is over the limit of %llu",
                     (unsigned long long)h->data_off, (unsigned long long)max_table);
        members_bytes = (uint64_t)h->count * sizeof(struct group_member);
        if (h->members_off % 8 || h->dims_off % 8 || h->ndims > (UINT64_MAX / 8) ||
            !within(h->members_off, members_bytes, sizeof(*h), h->data_off) ||
            !within(h->dims_off, h->ndims * 8, sizeof(*h), h->data_off) ||
            !within(h->names_off, h->names_size, sizeof(*h), h->data_off) ||
            h->names_size > UINT32_MAX)
                FAIL(-EINVAL, "the group table's areas lie outside it, or are misaligned");
        return 0;
}

int group_check(const void *base_, uint64_t size, const struct group_bounds *b,
                struct group_summary *ret, char *why, size_t whysz)
{
        const uint8_t *base = base_;
        const struct group_head *h = base_;
        uint64_t data_lo, limit;
        int err;

        if (size < sizeof(*h))
                FAIL(-EINVAL, "a group segment of %llu bytes has no room for its head",
                     (unsigned long long)size);
        if ((err = group_check_head(h, size, b, why, whysz)) < 0)
                return err;
        data_lo = b->apart_size ? 0 : h->data_off;
        limit = b->apart_size ? b->apart_size : size;
        for (uint32_t i = 0; i < h->count; i++) {
                err = check_member(base, h, data_lo, limit, i,
                                   i ? group_member_at(base, i - 1) : NULL, why, whysz);
                if (err < 0)
                        return err;
        }
        ret->count = h->count;
        ret->data_off = h->data_off;
        ret->data_bytes = limit - data_lo;
        return 0;
}

int64_t group_find(const void *base, const char *name, size_t len)
{
        const struct group_head *h = base;
        uint32_t lo = 0, hi = h->count;

        while (lo < hi) {
                uint32_t mid = lo + (hi - lo) / 2;
                const struct group_member *m = group_member_at(base, mid);
                int c = group_name_cmp(group_member_name(base, m), m->name_len, name, len);
                if (c == 0)
                        return mid;
                if (c < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return -1;
}
