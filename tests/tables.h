/* SPDX-License-Identifier: MIT */
/*
 * Group tables (proto/group.h) built by hand, for the suites that send them
 * as a raw peer would: any layout, any format, later corrupted at will.
 */
#ifndef DLX_TESTS_TABLES_H
#define DLX_TESTS_TABLES_H

#include <stdbool.h>
#include <stdint.h>

#include "group.h"
#include "wire.h"

/* One member: its name, dtype and layout, and where its data pointer is in the data area. */
struct gspec {
        const char *name;
        DLDataType dt;
        int ndim;
        int64_t shape[3];
        int64_t strides[3];
        uint64_t byte_offset;
        uint64_t data_at;
};

struct gseg {
        uint8_t *p; /* malloc'd image of the segment: the table, then the data area if any */
        uint64_t size;
        uint32_t count;
        uint64_t data_bytes; /* the data area's: after the table, or the device memory's */
        bool apart;
};

static inline struct group_head *ghead(struct gseg *g)
{
        return (struct group_head *)g->p;
}

static inline struct group_member *gmember(struct gseg *g, uint32_t i)
{
        return (struct group_member *)(g->p + ghead(g)->members_off) + i;
}

/*
 * A valid group table of n members (specs sorted by name), every member
 * READ_ONLY. GROUP_FORMAT: data_bytes bytes of data area follow the table,
 * filled with i & 0xff. apart (GROUP_FORMAT_APART): the segment ends at the
 * table, and data_bytes is the size of the memory the members are in.
 */
void gbuild(struct gseg *g, const struct gspec *s, uint32_t n, uint64_t data_bytes, bool apart);

/* The segment as a sealed memfd: shrink and grow sealed, and extra_seals. */
int gmemfd(const struct gseg *g, int extra_seals);

/*
 * A group publish as libdlx sends it: the data area as bytes, members =
 * count. For a table apart, a device group: cuda-vmm memory held as segment
 * (or, segment 0, cuda-ipc memory of that handle), the table attached.
 */
void group_publish_req(struct wire_request *req, uint64_t id, const char *name,
                       const struct gseg *g);
void device_group_publish_req(struct wire_request *req, uint64_t id, const char *name,
                              const struct gseg *g, uint64_t segment);

#endif /* DLX_TESTS_TABLES_H */
