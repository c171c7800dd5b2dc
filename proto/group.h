/* SPDX-License-Identifier: MIT */
/*
 * A group segment: one sealed memfd holding a whole group version, its table
 * of members first and their bytes after it. The producer writes it, dlxd
 * checks the table once at publish (group_check) and never reads it again,
 * and every consumer maps the same pages. Both sides are on one host: the
 * structs are in host byte order and alignment.
 *
 *   0            struct group_head
 *   members_off  struct group_member[count], sorted by name (bytewise), distinct
 *   dims_off     int64_t[ndims]: each member's shape[ndim], then strides[ndim]
 *   names_off    names, each name_len bytes and a NUL
 *   data_off     the members' bytes, to the end of the segment
 *
 * Every area lies inside [sizeof(head), data_off), and every member's
 * elements inside [data_off, segment size). Members may share bytes (tied
 * weights, views of one buffer): their elements may overlap.
 *
 * A table of GROUP_FORMAT_APART is laid out the same, but its members' bytes
 * are in another segment (a device's memory, which dlxd cannot read): the
 * table's segment ends at data_off, and each member's offset is from the
 * start of that other segment, its elements inside [0, that segment's size).
 */
#ifndef DLX_PROTO_GROUP_H
#define DLX_PROTO_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include <dlx/dlpack.h>

#define GROUP_MAGIC "DLXGROUP"
#define GROUP_FORMAT 1       /* the members' bytes follow the table, in its segment */
#define GROUP_FORMAT_APART 2 /* the members' bytes are in a segment of their own */
/* Members one group may have on the wire, whatever dlxd's --max-group-members. */
#define GROUP_MEMBERS_MAX (1u << 20)
/* Where the members' bytes start: the table is padded to this. */
#define GROUP_DATA_ALIGN 4096
/* Each member's bytes start this aligned within the data area. */
#define GROUP_MEMBER_ALIGN 64

struct group_head {
        char magic[8];   /* GROUP_MAGIC, no NUL */
        uint32_t format; /* GROUP_FORMAT */
        uint32_t count;  /* members */
        uint64_t members_off;
        uint64_t dims_off;
        uint64_t ndims; /* int64 values at dims_off */
        uint64_t names_off;
        uint64_t names_size;
        uint64_t data_off;
};

struct group_member {
        uint64_t offset;      /* of the data pointer, from the segment's start */
        uint64_t byte_offset; /* DLTensor.byte_offset */
        uint64_t flags;       /* DLPACK_FLAG_BITMASK_*: READ_ONLY, IS_SUBBYTE_TYPE_PADDED */
        uint64_t dims;        /* index into the dims array */
        uint32_t name_off;    /* from names_off */
        uint16_t name_len;    /* 1..DLX_NAME_MAX, without the NUL */
        uint8_t ndim;         /* 0..DLX_MAX_NDIM */
        uint8_t dtype_code;
        uint8_t dtype_bits;
        uint8_t reserved; /* 0 */
        uint16_t dtype_lanes;
        uint32_t reserved2; /* 0: the record has no padding, every byte is written */
};

_Static_assert(sizeof(struct group_head) == 64, "the head has no padding");
_Static_assert(sizeof(struct group_member) == 48, "a member record has no padding");

/* What a group table is checked against. */
struct group_bounds {
        uint32_t max_count; /* members, 0: GROUP_MEMBERS_MAX */
        uint64_t max_table; /* bytes of the table (data_off), 0: no limit */
        /*
         * 0: a GROUP_FORMAT table, its members' bytes after it; else a
         * GROUP_FORMAT_APART table whose members' bytes are in a segment of
         * this many bytes. A table of the other format is refused.
         */
        uint64_t apart_size;
};

/* What group_check() learned of a group table. */
struct group_summary {
        uint32_t count;
        uint64_t data_off;   /* bytes of the table, padding included */
        uint64_t data_bytes; /* the data area: segment size - data_off, or apart_size */
};

/*
 * Checks a group segment of size bytes mapped at base: every offset, name,
 * dtype and layout, names sorted and distinct, members' elements within the
 * data area (their data pointers within the segment: a byte_offset may put
 * one before the data area), and the bounds. Returns 0 with *ret, or
 * -EINVAL (with a reason in why), -E2BIG (a count or table over a limit) or
 * -EOVERFLOW.
 */
int group_check(const void *base, uint64_t size, const struct group_bounds *b,
                struct group_summary *ret, char *why, size_t whysz);

/* The member i of a checked table, its name, and its shape and strides. */
static inline const struct group_member *group_member_at(const void *base, uint32_t i)
{
        const struct group_head *h = base;
        return (const struct group_member *)((const uint8_t *)base + h->members_off) + i;
}

static inline const char *group_member_name(const void *base, const struct group_member *m)
{
        const struct group_head *h = base;
        return (const char *)base + h->names_off + m->name_off;
}

static inline const int64_t *group_member_dims(const void *base, const struct group_member *m)
{
        const struct group_head *h = base;
        return (const int64_t *)((const uint8_t *)base + h->dims_off) + m->dims;
}

/*
 * The head's own checks, the first group_check() makes: magic, format,
 * counts and limits, and the table's areas within [sizeof(*h), data_off),
 * data_off within the segment (at its end, apart). What needs no more than
 * the head: dlxd reads the rest only once these pass. Returns as
 * group_check().
 */
int group_check_head(const struct group_head *h, uint64_t size, const struct group_bounds *b,
                     char *why, size_t whysz);

/*
 * Where the last of the table's areas ends (the head included): what
 * group_check() reads of it, and at most data_off. Only for a head that
 * group_check_head() passed.
 */
static inline uint64_t group_table_end(const struct group_head *h)
{
        uint64_t end = sizeof(*h),
                 m = h->members_off + (uint64_t)h->count * sizeof(struct group_member),
                 d = h->dims_off + h->ndims * 8, n = h->names_off + h->names_size;

        end = m > end ? m : end;
        end = d > end ? d : end;
        return n > end ? n : end;
}

/*
 * Index of the member called name (len bytes) in a checked table, or -1:
 * a binary search, the table being sorted.
 */
int64_t group_find(const void *base, const char *name, size_t len);

/* Bytewise order of two names, shorter first on a common prefix: the table's order. */
int group_name_cmp(const char *a, size_t alen, const char *b, size_t blen);

#endif /* DLX_PROTO_GROUP_H */
