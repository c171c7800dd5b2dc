/* SPDX-License-Identifier: MIT */
/*
 * Groups: many named tensors published and acquired as one version. A group
 * version is one sealed memfd, a group segment (proto/group.h): its table
 * first, then the members' bytes, copied once. Publish builds it and sends
 * it as one publish; acquire is one acquire, whose segment is mapped as any
 * other, and the members are read from the table in place.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fd.h"
#include "group.h"
#include "internal.h"
#include "gpu.h"
#include "layout.h"

/* ---- publish -------------------------------------------------------------------------- */

/* One member being published. */
struct pub_member {
        const char *name;
        size_t len;
        const DLTensor *t;
        uint64_t flags;
        int64_t lo, hi;  /* its elements, from its data pointer */
        uintptr_t start; /* the first byte its elements touch (data + lo) */
        uint64_t key[2]; /* the name's first 16 bytes, big-endian: most comparisons end here */
        uint64_t offset; /* its data pointer in the segment */
        uint32_t block;  /* the run of source bytes it lies in */
        uint32_t ndim;   /* t->ndim, read where t's memory is not */
};

/* A run of source bytes that members share or touch: copied once, as one. */
struct block {
        uintptr_t start, end;
        uint64_t before; /* how far before start a member's data pointer lies, at most */
        uint64_t at;     /* where it goes in the segment */
};

static int cmp_member_name(const void *a, const void *b)
{
        const struct pub_member *x = *(struct pub_member *const *)a;
        const struct pub_member *y = *(struct pub_member *const *)b;
        if (x->key[0] != y->key[0])
                return x->key[0] < y->key[0] ? -1 : 1;
        if (x->key[1] != y->key[1])
                return x->key[1] < y->key[1] ? -1 : 1;
        if (x->len <= 16 || y->len <= 16)
                return x->len < y->len ? -1 : x->len > y->len; /* the keys held them whole */
        return group_name_cmp(x->name + 16, x->len - 16, y->name + 16, y->len - 16);
}

/* 8 bytes of a name from at, as a number that orders as the bytes do (NUL-padded). */
static uint64_t name_key(const char *name, size_t len, size_t at)
{
        uint64_t k = 0;
        for (size_t i = at; i < at + 8; i++)
                k = k << 8 | (i < len ? (uint8_t)name[i] : 0);
        return k;
}

/* Sorts v unless it is sorted already, as state dicts and buffers often are. */
static void sort_members(struct pub_member **v, size_t n, int (*cmp)(const void *, const void *))
{
        for (size_t i = 1; i < n; i++)
                if (cmp(&v[i - 1], &v[i]) > 0) {
                        qsort(v, n, sizeof(*v), cmp);
                        return;
                }
}

/* A member's place in the name sort: its keys beside it, where the merges read them in order. */
struct name_item {
        uint64_t key[2];
        struct pub_member *m;
};

static inline bool item_before(const struct name_item *x, const struct name_item *y)
{
        if (x->key[0] != y->key[0])
                return x->key[0] < y->key[0];
        if (x->key[1] != y->key[1])
                return x->key[1] < y->key[1];
        return cmp_member_name(&x->m, &y->m) < 0;
}

/* The runs sort_by_name() sorts by insertion before it merges. */
#define SORT_RUN 16

/*
 * Sorts v (n members) by name unless they are in order already, as state
 * dicts and buffers often are, in tmp (room for 2n name_items): a merge
 * sort of items that carry the names' first 16 bytes, so that most
 * comparisons are two integer compares on memory read in order, with no
 * call and no pointer to follow. Runs of SORT_RUN are sorted by insertion
 * first. On 20,000 names like a state dict's, 0.4-0.7 ms where qsort()
 * took 0.65-1.3 ms. Returns a member whose name another has too, or NULL.
 */
static struct pub_member *sort_by_name(struct pub_member **v, size_t n, struct name_item *tmp)
{
        struct name_item *src = tmp, *dst = tmp + n;
        bool in_order = true;

        for (size_t i = 0; i < n; i++) {
                src[i] = (struct name_item){{v[i]->key[0], v[i]->key[1]}, v[i]};
                if (i && in_order && item_before(&src[i], &src[i - 1]))
                        in_order = false;
        }
        for (size_t lo = 0; !in_order && lo < n; lo += SORT_RUN) {
                size_t hi = lo + SORT_RUN < n ? lo + SORT_RUN : n;
                for (size_t i = lo + 1; i < hi; i++) {
                        struct name_item x = src[i];
                        size_t j = i;
                        for (; j > lo && item_before(&x, &src[j - 1]); j--)
                                src[j] = src[j - 1];
                        src[j] = x;
                }
        }
        for (size_t width = SORT_RUN; !in_order && width < n; width *= 2) {
                for (size_t lo = 0; lo < n; lo += 2 * width) {
                        size_t mid = lo + width < n ? lo + width : n;
                        size_t hi = mid + width < n ? mid + width : n;
                        size_t i = lo, j = mid, k = lo;
                        while (i < mid && j < hi)
                                dst[k++] = item_before(&src[j], &src[i]) ? src[j++] : src[i++];
                        while (i < mid)
                                dst[k++] = src[i++];
                        while (j < hi)
                                dst[k++] = src[j++];
                }
                struct name_item *t = src;
                src = dst;
                dst = t;
        }
        for (size_t i = 0; i < n; i++) {
                v[i] = src[i].m;
                if (i && src[i].key[0] == src[i - 1].key[0] && src[i].key[1] == src[i - 1].key[1] &&
                    cmp_member_name(&src[i - 1].m, &src[i].m) == 0)
                        return src[i].m;
        }
        return NULL;
}

static int cmp_member_start(const void *a, const void *b)
{
        const struct pub_member *x = *(struct pub_member *const *)a;
        const struct pub_member *y = *(struct pub_member *const *)b;
        return x->start < y->start ? -1 : x->start > y->start;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
        return (v + a - 1) / a * a;
}

/* Slots of delete_members()'s set of tensors for count members: a power of two, at least 2 count.
 */
static size_t seen_slots(size_t count)
{
        size_t cap = 16;

        while (cap < 2 * count)
                cap *= 2;
        return cap;
}

/* The room delete_members() works in for count members: its set, and the tensors in order. */
static size_t delete_work(size_t count)
{
        return (seen_slots(count) + count) * sizeof(DLManagedTensorVersioned *);
}

/*
 * Runs each member's deleter once, and clears the members: a tensor given
 * under two names (tied weights, in C) is one tensor, deleted once, and
 * the deleters run in the members' order (their tensors' memory read in
 * the order it was likely made). work: worksz bytes it may use
 * (delete_work(count) are enough), else it allocates.
 */
static void delete_members(struct dlx_member *members, size_t count, void *work, size_t worksz)
{
        DLManagedTensorVersioned **seen = NULL, **uniq;
        size_t cap, n = 0;

        if (!members)
                return;
        while (count && !members[count - 1].tensor)
                count--; /* none left at all: a second call, after the first deleted them */
        if (count == 0)
                return;
        cap = seen_slots(count);
        seen = worksz >= delete_work(count) ? work : malloc(delete_work(count));
        if (!seen) {
                /* out of memory: the slow way, each against those before it */
                for (size_t i = 0; i < count; i++) {
                        uintptr_t t = (uintptr_t)members[i].tensor;
                        bool again = false;
                        for (size_t k = 0; k < i && !again; k++)
                                again = (uintptr_t)members[k].tensor == t;
                        if (t && !again && members[i].tensor->deleter)
                                members[i].tensor->deleter(members[i].tensor);
                }
                for (size_t i = 0; i < count; i++)
                        members[i].tensor = NULL;
                return;
        }
        /* the distinct tensors, found with an open-addressed set; then their deleters */
        uniq = seen + cap;
        memset(seen, 0, cap * sizeof(*seen));
        for (size_t i = 0; i < count; i++) {
                DLManagedTensorVersioned *t = members[i].tensor;
                members[i].tensor = NULL;
                if (!t)
                        continue;
                size_t h = (size_t)(((uintptr_t)t >> 4) * UINT64_C(0x9e3779b97f4a7c15)) & (cap - 1);
                while (seen[h] && seen[h] != t)
                        h = (h + 1) & (cap - 1);
                if (!seen[h])
                        uniq[n++] = seen[h] = t;
        }
        for (size_t i = 0; i < n; i++)
                if (uniq[i]->deleter)
                        uniq[i]->deleter(uniq[i]);
        if (seen != work)
                free(seen);
}

/* Checks member i and fills m; the detail goes to dlx__fail. */
static int check_member(const struct dlx_member *src, size_t i, struct pub_member *m)
{
        const DLManagedTensorVersioned *mt = src->tensor;
        const char *why = NULL;
        uint64_t numel = 0;
        const DLTensor *t;
        int err;

        if (!src->name || !mt)
                return dlx__fail(-EINVAL, "group member %zu: NULL name or tensor", i);
        m->name = src->name;
        m->len = strlen(src->name);
        if (layout_name_check(m->name, m->len, &why) < 0)
                return dlx__fail(-EINVAL, "group member %zu: bad name '%s': %s", i,
                                 DLX_QUOTED(m->name), why);
        if (mt->version.major != DLX_DLPACK_MAJOR)
                return dlx__fail(-ENOTSUP, "group member '%s': DLPack major version %u", m->name,
                                 mt->version.major);
        t = &mt->dl_tensor;
        if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDA)
                return dlx__fail(-ENOTSUP,
                                 "group member '%s': device type %d; a group's members are "
                                 "kDLCPU or kDLCUDA tensors",
                                 m->name, (int)t->device.device_type);
        if (t->ndim < 0 || t->ndim > DLX_MAX_NDIM || (t->ndim && !t->shape))
                return dlx__fail(-EINVAL, "group member '%s': bad ndim or shape", m->name);
        m->flags = mt->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
        err = layout_extent(t->dtype, t->ndim, t->shape, t->strides, t->byte_offset, m->flags,
                            &m->lo, &m->hi, &why);
        if (err < 0)
                return dlx__fail(err, "group member '%s': %s", m->name, why);
        if (!t->data && (layout_numel(t->ndim, t->shape, &numel) < 0 || numel))
                return dlx__fail(-EINVAL, "group member '%s': NULL data", m->name);
        m->t = t;
        m->ndim = (uint32_t)t->ndim;
        m->start = (uintptr_t)t->data + (uintptr_t)m->lo;
        m->key[0] = name_key(m->name, m->len, 0);
        m->key[1] = name_key(m->name, m->len, 8);
        return 0;
}

/*
 * Lays the copied bytes out: members whose bytes overlap or touch form one
 * block, copied once, so that tied storage stays tied. Each block keeps its
 * first byte's address modulo GROUP_MEMBER_ALIGN. Returns the data bytes.
 */
static uint64_t lay_out(struct pub_member **by_start, size_t n, struct block *blocks,
                        size_t *ret_nblocks, uint64_t data_off)
{
        size_t nb = 0;
        uint64_t at = data_off;

        for (size_t i = 0; i < n; i++) {
                struct pub_member *m = by_start[i];
                uintptr_t end = m->start + ((uintptr_t)m->hi - (uintptr_t)m->lo);
                if (nb && m->start <= blocks[nb - 1].end) {
                        if (end > blocks[nb - 1].end)
                                blocks[nb - 1].end = end;
                } else {
                        blocks[nb].start = m->start;
                        blocks[nb].end = end;
                        blocks[nb].before = 0;
                        nb++;
                }
                m->block = (uint32_t)(nb - 1);
                /* a byte_offset puts the data pointer lo bytes before the first element */
                struct block *b = &blocks[nb - 1];
                if (m->lo > 0 && (uint64_t)m->lo > m->start - b->start &&
                    (uint64_t)m->lo - (m->start - b->start) > b->before)
                        b->before = (uint64_t)m->lo - (m->start - b->start);
        }
        for (size_t b = 0; b < nb; b++) {
                /*
                 * Each run keeps the alignment its source had, up to 64 bytes: a
                 * float at an address 4 past a 64-byte boundary is 4-aligned, and
                 * costs no 60 bytes of padding.
                 */
                uint64_t start = blocks[b].start, a = start & (~start + 1);
                if (a == 0 || a > GROUP_MEMBER_ALIGN)
                        a = GROUP_MEMBER_ALIGN;
                at = align_up(at, a);
                /* room for every data pointer inside the segment (a hole, if it comes to that) */
                if (at < blocks[b].before)
                        at += align_up(blocks[b].before - at, GROUP_MEMBER_ALIGN);
                blocks[b].at = at;
                at += blocks[b].end - blocks[b].start;
        }
        for (size_t i = 0; i < n; i++) {
                struct pub_member *m = by_start[i];
                const struct block *b = &blocks[m->block];
                /* the data pointer: its first element's place, less lo */
                m->offset = b->at + (m->start - b->start) - (uint64_t)m->lo;
        }
        *ret_nblocks = nb;
        return at - data_off;
}

/* Writes len bytes at off, whatever the short writes. Returns 0 or -errno. */
static int pwrite_all(int fd, const void *buf, uint64_t len, uint64_t off)
{
        const uint8_t *p = buf;

        while (len) {
                ssize_t n = pwrite(fd, p, len, (off_t)off);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return n < 0 ? -errno : -EIO;
                p += n;
                off += (uint64_t)n;
                len -= (uint64_t)n;
        }
        return 0;
}

/* Writes the iovecs (total bytes) at off: one system call as a rule. Returns 0 or -errno. */
static int pwritev_all(int fd, struct iovec *iov, int n, uint64_t total, uint64_t off)
{
        ssize_t done = n ? pwritev(fd, iov, n, (off_t)off) : 0;

        if (done < 0 && errno != EINTR)
                return -errno;
        if (done == (ssize_t)total)
                return 0;
        /* a short write (a signal, say): the rest one piece at a time */
        uint64_t skip = done > 0 ? (uint64_t)done : 0;
        for (int i = 0; i < n; i++) {
                uint64_t len = iov[i].iov_len;
                if (skip >= len) {
                        skip -= len;
                        off += len;
                        continue;
                }
                int err = pwrite_all(fd, (const uint8_t *)iov[i].iov_base + skip, len - skip,
                                     off + skip);
                if (err < 0)
                        return err;
                off += len;
                skip = 0;
        }
        return 0;
}

/* Blocks below this are gathered into a staging buffer, bigger ones written from where they are. */
#define GATHER_BELOW 4096
#define STAGE_SIZE (UINT64_C(1) << 20)
#define WRITE_IOVS 256

/* Runs of the segment's data being written: iovecs over one contiguous range of it. */
struct data_writer {
        int fd;
        struct iovec iov[WRITE_IOVS];
        int n;
        uint64_t run_at, run_len; /* the range in the segment */
        uint8_t *stage;           /* STAGE_SIZE bytes, or NULL: every block as is */
        uint64_t staged;
        bool tail_staged; /* iov[n - 1] ends at stage + staged */
};

static int writer_flush(struct data_writer *w)
{
        int err = pwritev_all(w->fd, w->iov, w->n, w->run_len, w->run_at);

        w->n = 0;
        w->run_len = 0;
        w->staged = 0;
        w->tail_staged = false;
        return err;
}

/* Appends len bytes (from src, or zeros when src is NULL) to the run, staged or as they are. */
static void writer_add(struct data_writer *w, const void *src, uint64_t len, bool stage)
{
        static const uint8_t zeros[GROUP_DATA_ALIGN];

        if (stage) {
                uint8_t *dst = w->stage + w->staged;
                if (src)
                        memcpy(dst, src, len);
                else
                        memset(dst, 0, len);
                if (w->tail_staged)
                        w->iov[w->n - 1].iov_len += len;
                else
                        w->iov[w->n++] = (struct iovec){dst, len};
                w->staged += len;
        } else {
                w->iov[w->n++] = (struct iovec){src ? (void *)src : (void *)zeros, len};
        }
        w->tail_staged = stage;
        w->run_len += len;
}

/*
 * The blocks' bytes, into the segment, a run of them (and the zeros between:
 * alignment) at a time, each one pwritev: write() fills the page cache
 * directly, with no page faults and no mapping to make and tear down. Small
 * blocks (a state dict's biases and norms) are gathered into a staging
 * buffer first, so that a system call carries thousands of them; big ones go
 * from where they are, copied once. A gap wider than a page (room for a
 * byte_offset) stays a hole.
 */
static int write_blocks(int fd, const struct block *blocks, size_t nblocks, uint8_t *stage)
{
        struct data_writer w = {.fd = fd, .stage = stage};
        int err = 0;

        for (size_t b = 0; b < nblocks && err == 0; b++) {
                uint64_t len = blocks[b].end - blocks[b].start;
                uint64_t gap = w.n ? blocks[b].at - (w.run_at + w.run_len) : 0;
                bool staged = w.stage && len < GATHER_BELOW;
                if (w.n && (gap > GROUP_DATA_ALIGN || w.n + 2 > WRITE_IOVS ||
                            (staged && w.staged + gap + len > STAGE_SIZE))) {
                        err = writer_flush(&w);
                        gap = 0;
                }
                if (w.n == 0)
                        w.run_at = blocks[b].at;
                if (gap)
                        writer_add(&w, NULL, gap, staged && w.tail_staged);
                writer_add(&w, (const void *)blocks[b].start, len, staged);
        }
        if (err == 0)
                err = writer_flush(&w);
        return err;
}

/*
 * Whether the daemon knows groups (protocol 1.3): an older one would take a
 * group's publish for a tensor of bytes, and give it to readers as one.
 */
static int check_daemon(dlx_client *c, const char *name)
{
        if (c->server_minor < 3)
                return dlx__fail(-ENOTSUP,
                                 "group '%s': the daemon (protocol 1.%u) has no groups: "
                                 "1.3 does",
                                 name, c->server_minor);
        return 0;
}

/* A member count the daemon takes: 1 to its --max-group-members (hello said which). */
static int check_count(dlx_client *c, const char *name, size_t count)
{
        uint32_t max = c->limits.max_group_members;

        if (max == 0 || max > GROUP_MEMBERS_MAX)
                max = GROUP_MEMBERS_MAX;
        if (count == 0)
                return dlx__fail(-EINVAL, "group '%s' has no members", name);
        if (count > max)
                return dlx__fail(-E2BIG, "group '%s' has %zu members, over the limit of %u", name,
                                 count, max);
        return 0;
}

/* Where a group's table puts its areas, and the data area's start. */
struct table_plan {
        uint64_t members_off, dims_off, ndims, names_off, names_size, data_off;
};

/*
 * Sorts the members by name (in tmp, room for 2 count name_items, or NULL:
 * room of its own), refuses a name given twice, and plans the table; the
 * detail goes to dlx__fail. Returns 0, -EINVAL or -E2BIG.
 */
static int plan_table(dlx_client *c, const char *name, struct pub_member **sorted, size_t count,
                      struct name_item *tmp, struct table_plan *tp)
{
        struct name_item *t = tmp ? tmp : malloc(2 * count * sizeof(*t));
        struct pub_member *twice = NULL;

        tp->ndims = 0;
        tp->names_size = 0;
        for (size_t i = 0; i < count; i++) {
                tp->ndims += 2 * (uint64_t)sorted[i]->ndim;
                tp->names_size += sorted[i]->len + 1;
        }
        if (t) {
                twice = sort_by_name(sorted, count, t);
        } else {
                /* out of memory: the slow way */
                qsort(sorted, count, sizeof(*sorted), cmp_member_name);
                for (size_t i = 1; i < count && !twice; i++)
                        if (cmp_member_name(&sorted[i - 1], &sorted[i]) == 0)
                                twice = sorted[i];
        }
        if (t != tmp)
                free(t);
        if (twice)
                return dlx__fail(-EINVAL, "group '%s' names member '%s' twice", name, twice->name);
        tp->members_off = align_up(sizeof(struct group_head), 8);
        tp->dims_off = tp->members_off + count * sizeof(struct group_member);
        tp->names_off = tp->dims_off + tp->ndims * sizeof(int64_t);
        tp->data_off = align_up(tp->names_off + tp->names_size, GROUP_DATA_ALIGN);
        if (c->limits.max_group_table && tp->data_off > c->limits.max_group_table)
                return dlx__fail(-E2BIG,
                                 "group '%s': its table of %llu bytes is over the limit of %llu",
                                 name, (unsigned long long)tp->data_off,
                                 (unsigned long long)c->limits.max_group_table);
        return 0;
}

/*
 * The table, into base (the client's scratch, kept from one publish to the
 * next): names_off + names_size bytes, the rest up to data_off being zeros
 * (a hole in the segment).
 */
static void table_build(uint8_t *base, struct pub_member **sorted, size_t count,
                        const struct table_plan *tp, uint32_t format)
{
        uint64_t dim_at = 0, name_at = 0;

        /* every byte of the head and the records is written: no memset of the whole table */
        memset(base, 0, tp->members_off);
        struct group_head *h = (struct group_head *)base;
        memcpy(h->magic, GROUP_MAGIC, sizeof(h->magic));
        h->format = format;
        h->count = (uint32_t)count;
        h->members_off = tp->members_off;
        h->dims_off = tp->dims_off;
        h->ndims = tp->ndims;
        h->names_off = tp->names_off;
        h->names_size = tp->names_size;
        h->data_off = tp->data_off;
        struct group_member *gm = (struct group_member *)(base + tp->members_off);
        int64_t *dims = (int64_t *)(base + tp->dims_off);
        char *names = (char *)(base + tp->names_off);
        for (size_t i = 0; i < count; i++) {
                const struct pub_member *m = sorted[i];
                const DLTensor *t = m->t;
                struct group_member *g = &gm[i];
                g->offset = m->offset;
                g->byte_offset = t->byte_offset;
                g->flags = DLPACK_FLAG_BITMASK_READ_ONLY | m->flags;
                g->dims = dim_at;
                g->name_off = (uint32_t)name_at;
                g->name_len = (uint16_t)m->len;
                g->ndim = (uint8_t)t->ndim;
                g->dtype_code = t->dtype.code;
                g->dtype_bits = t->dtype.bits;
                g->dtype_lanes = t->dtype.lanes;
                g->reserved = 0;
                g->reserved2 = 0;
                if (t->ndim) {
                        memcpy(dims + dim_at, t->shape, (size_t)t->ndim * sizeof(int64_t));
                        if (t->strides)
                                memcpy(dims + dim_at + t->ndim, t->strides,
                                       (size_t)t->ndim * sizeof(int64_t));
                        else
                                layout_compact_strides(t->ndim, t->shape, dims + dim_at + t->ndim);
                }
                dim_at += 2 * (uint64_t)t->ndim;
                memcpy(names + name_at, m->name, m->len + 1);
                name_at += m->len + 1;
        }
}

/*
 * A fresh memfd of size bytes with the table of format written in, built in
 * table (NULL: a buffer of its own). Returns the fd or -errno.
 */
static int segment_new(uint8_t *table, struct pub_member **sorted, size_t count,
                       const struct table_plan *tp, uint64_t size, uint32_t format)
{
        uint8_t *own = table ? NULL : malloc(tp->names_off + tp->names_size);
        int fd, err;

        if (!table && !(table = own))
                return -ENOMEM;
        table_build(table, sorted, count, tp, format);
        fd = memfd_create("dlx-group", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        err = fd < 0 ? -errno : 0;
        if (err == 0 && ftruncate(fd, (off_t)size) < 0)
                err = -errno;
        if (err == 0)
                err = pwrite_all(fd, table, tp->names_off + tp->names_size, 0);
        free(own);
        if (err < 0) {
                if (fd >= 0)
                        close(fd);
                return err;
        }
        return fd;
}

#define GROUP_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)

/*
 * Seals an allocated group's segment, which nothing should map writable any
 * more: EBUSY at once says something does (a child forked since the alloc).
 */
static int segment_seal(int fd)
{
        if (fcntl(fd, F_ADD_SEALS, GROUP_SEALS) < 0)
                return -errno;
        return 0;
}

/*
 * Sends a group's publish, fd (borrowed) its segment or a device group's
 * table: 0 with *ret_version, or -errno.
 */
static int group_call(dlx_client *c, struct wire_request *req, int fd, uint64_t *ret_version)
{
        struct pending p;
        int err;

        err = dlx__call(c, req, fd, &p);
        /* a group counts against the byte limits: not beside our own empty segments */
        if (err == -ENOSPC && dlx__arena_give_back_empty(c) > 0) {
                dlx__pending_done(c, &p);
                err = dlx__call(c, req, fd, &p);
        }
        if (err == -EMSGSIZE)
                err = -E2BIG; /* a group limit of the daemon's, which this client did not know */
        if (err == 0 && p.rep.type != WIRE_REP_PUBLISH)
                err = dlx__fail(-EPROTO, "the daemon answered publish with something else");
        if (err == 0)
                *ret_version = p.rep.publish.version;
        dlx__pending_done(c, &p);
        return err;
}

/* Publishes a sealed group segment (fd, borrowed) as the next version of name. */
static int send_group(dlx_client *c, const char *name, int fd, size_t count, uint64_t data_off,
                      uint64_t data_bytes, const struct dlx_publish_options *o,
                      uint64_t *ret_version)
{
        struct wire_request req = {.type = WIRE_REQ_PUBLISH};
        struct wire_tensor *w = &req.publish.tensor;

        wire_strcpy(w->name, sizeof(w->name), name);
        w->dtype = (DLDataType){.code = kDLUInt, .bits = 8, .lanes = 1};
        w->ndim = 1;
        w->shape[0] = (int64_t)data_bytes;
        w->strides[0] = 1;
        w->device_type = kDLCPU;
        w->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        w->storage = WIRE_STORAGE_MEMFD;
        w->offset = data_off;
        w->length = data_bytes;
        w->members = (uint32_t)count;

        uint64_t version = 0;
        int err = dlx__publish_opts(c, &req, o);
        if (err == 0)
                err = group_call(c, &req, fd, &version);
        if (err == 0 && ret_version)
                *ret_version = version;
        return err;
}

/* ---- device groups (1.4) ------------------------------------------------------------------ */

/* What a device group's publish keeps alive until RELEASED: its members, or their copy. */
struct bundle {
        DLManagedTensorVersioned mt;
        size_t count;
        struct dlx_member members[];
};

static void bundle_deleter(DLManagedTensorVersioned *t)
{
        struct bundle *b = t->manager_ctx;

        delete_members(b->members, b->count, NULL, 0);
        free(b);
}

static struct bundle *bundle_new(size_t count)
{
        struct bundle *b = calloc(1, sizeof(*b) + count * sizeof(b->members[0]));

        if (b) {
                b->count = count;
                b->mt.version.major = DLX_DLPACK_MAJOR;
                b->mt.version.minor = DLX_DLPACK_MINOR;
                b->mt.manager_ctx = b;
                b->mt.deleter = bundle_deleter;
        }
        return b;
}

/*
 * Describes the members in place, in the one allocation [lo, hi) lies in,
 * for req: dlx_alloc() memory (a cuda-vmm segment the daemon holds) or a
 * framework's (its IPC handle), with an event recorded on stream. Each
 * member's offset is its data pointer's device address on entry, its
 * offset from the allocation's start on return. -ENOTSUP (nothing recorded
 * to dlx__fail's detail that matters) where the members are not in one such
 * allocation: they are then copied. Lock held.
 */
static int share_in_place(dlx_client *c, struct pub_member **sorted, size_t count, int device,
                          uintptr_t lo, uintptr_t hi, void *stream, struct wire_request *req,
                          struct gpu_pub *gpu)
{
        struct wire_tensor *w = &req->publish.tensor;
        int64_t len = (int64_t)(hi - lo);
        DLTensor anchor = {.data = (void *)lo,
                           .device = {kDLCUDA, device},
                           .ndim = 1,
                           .dtype = {kDLUInt, 8, 1},
                           .shape = &len};
        struct seg_map *map = dlx__arena_find(c, WIRE_STORAGE_CUDA_VMM, (void *)lo, 0, len);
        uint64_t size;
        uintptr_t base;
        int err;

        /* what a first try left (another allocation's handle) goes */
        w->storage = 0;
        w->segment = 0;
        w->has_ipc_handle = w->has_event = false;
        w->pid_namespace = 0;
        req->publish.segment_size = 0;
        w->length = (uint64_t)len;
        err = dlx__gpu_publish(c, &anchor, map, stream, req, gpu);
        if (err < 0)
                return err;
        /* a framework's VMM allocation would need a second fd: copied instead */
        size = map ? map->size : req->publish.segment_size;
        base = lo - (uintptr_t)w->offset;
        if (gpu->has_fd || w->offset > size || (uint64_t)len > size - w->offset) {
                if (gpu->has_fd)
                        close(gpu->fd);
                gpu->has_fd = false;
                dlx__gpu_publish_undo(c, gpu);
                return -ENOTSUP;
        }
        for (size_t i = 0; i < count; i++) {
                struct pub_member *m = sorted[i];
                /* a data pointer before the allocation (a byte_offset into it): copied */
                if (m->hi > m->lo && m->offset < base) {
                        dlx__gpu_publish_undo(c, gpu);
                        return -ENOTSUP;
                }
        }
        for (size_t i = 0; i < count; i++) {
                struct pub_member *m = sorted[i];
                /* an empty member points anywhere inside: at the first member's bytes */
                m->offset = m->hi > m->lo ? m->offset - base : lo - base;
        }
        w->offset = 0;
        w->length = hi - base;
        w->shape[0] = (int64_t)w->length;
        return 0;
}

/*
 * Copies the members' bytes once into one dlx_alloc() buffer on device
 * (*ret_copy), in stream order, laid out as a memfd group's are; each
 * member's offset becomes its data pointer's device address in the copy,
 * and [*ret_lo, *ret_hi) the copy's bytes. Waits on the host for the
 * copies: the originals may go once this returns.
 */
static int copy_once(dlx_client *c, const char *name, struct pub_member **sorted, size_t count,
                     struct pub_member **by_start, size_t nspans, struct block *blocks, int device,
                     void *stream, DLManagedTensorVersioned **ret_copy, uintptr_t *ret_lo,
                     uintptr_t *ret_hi)
{
        size_t nblocks = 0;
        uint64_t bytes = lay_out(by_start, nspans, blocks, &nblocks, 0);
        int64_t shape = bytes ? (int64_t)bytes : 1;
        DLTensor proto = {
                .device = {kDLCUDA, device}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = &shape};
        struct dlx_gpu_copy *v = NULL;
        DLManagedTensorVersioned *copy = NULL;
        uintptr_t at;
        int err;

        err = dlx_alloc(c, &proto, &copy);
        if (err < 0)
                return dlx__fail(err, "publish group '%s': no device memory to copy into: %s", name,
                                 dlx_last_error());
        at = (uintptr_t)copy->dl_tensor.data;
        v = nblocks ? calloc(nblocks, sizeof(*v)) : NULL;
        if (nblocks && !v) {
                err = dlx__fail(-ENOMEM, "out of memory");
                goto fail;
        }
        for (size_t b = 0; b < nblocks; b++)
                v[b] = (struct dlx_gpu_copy){.dst = at + blocks[b].at,
                                             .src = blocks[b].start,
                                             .len = blocks[b].end - blocks[b].start};
        err = dlx__gpu_copy_wait(device, stream, v, nblocks);
        free(v);
        if (err < 0) {
                err = dlx__fail(err, "publish group '%s': cannot copy on the device: %s", name,
                                dlx_last_error());
                goto fail;
        }
        for (size_t i = 0; i < count; i++)
                sorted[i]->offset = sorted[i]->hi > sorted[i]->lo ? at + sorted[i]->offset : at;
        *ret_copy = copy;
        *ret_lo = at;
        *ret_hi = at + (uint64_t)shape;
        return 0;
fail:
        copy->deleter(copy);
        return err;
}

/*
 * A group of CUDA tensors on one device: its table in a memfd of its own,
 * its members' bytes where they are when they all lie in one allocation
 * (dlx_alloc() memory, or one framework allocation), else copied once into
 * dlx_alloc() memory. One event on stream orders every reader after the
 * producer's writes (or the copy). What the members' bytes are in stays
 * alive until the daemon says the version is RELEASED.
 */
static int publish_device_group(dlx_client *c, const char *name, struct dlx_member *members,
                                size_t count, const struct dlx_publish_options *o,
                                struct pub_member **sorted, struct pub_member **by_start,
                                size_t nspans, struct block *blocks, struct table_plan *tp,
                                uint8_t *table, uint64_t *ret_version)
{
        int device = sorted[0]->t->device.device_id;
        struct wire_request req = {.type = WIRE_REQ_PUBLISH};
        struct wire_tensor *w = &req.publish.tensor;
        DLManagedTensorVersioned *copy = NULL;
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        struct bundle *b = NULL;
        struct held *h = NULL;
        void *stream;
        int fd = -1, err = -ENOTSUP;

        if (c->server_minor < 4)
                return dlx__fail(-ENOTSUP,
                                 "group '%s' in device memory: the daemon (protocol 1.%u) "
                                 "takes none: 1.4 does",
                                 name, c->server_minor);
        if (!table)
                return dlx__fail(-ENOMEM, "out of memory");
        wire_strcpy(w->name, sizeof(w->name), name);
        w->dtype = (DLDataType){.code = kDLUInt, .bits = 8, .lanes = 1};
        w->ndim = 1;
        w->strides[0] = 1;
        w->device_type = kDLCUDA;
        w->device_id = device;
        w->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        w->members = (uint32_t)count;
        err = dlx__publish_opts(c, &req, o);
        if (err < 0)
                return err;
        err = -ENOTSUP; /* until the members are found in one allocation */
        /* the table ends the table's segment: the members' bytes are elsewhere */
        tp->data_off = tp->names_off + tp->names_size;

        h = calloc(1, sizeof(*h));
        if (!h)
                return dlx__fail(-ENOMEM, "out of memory");
        pthread_mutex_lock(&c->lock);
        stream = o->stream ? o->stream : dlx__gpu_stream(c, device);
        for (size_t i = 0; i < count; i++) {
                struct pub_member *m = sorted[i];
                m->offset = (uintptr_t)m->t->data;
                if (m->hi > m->lo && m->start < lo)
                        lo = m->start;
                if (m->hi > m->lo && m->start + (uint64_t)(m->hi - m->lo) > hi)
                        hi = m->start + (uint64_t)(m->hi - m->lo);
        }
        if (o->copy != DLX_COPY_ALWAYS && nspans)
                err = share_in_place(c, sorted, count, device, lo, hi, stream, &req, &h->gpu);
        pthread_mutex_unlock(&c->lock);
        if (err == -ENOTSUP && o->copy == DLX_COPY_NEVER) {
                err = dlx__fail(-EXDEV,
                                "publish group '%s': its members are not all in one allocation "
                                "of device %d, and copying is not allowed",
                                name, device);
                goto out;
        }
        if (err == -ENOTSUP) {
                err = copy_once(c, name, sorted, count, by_start, nspans, blocks, device, stream,
                                &copy, &lo, &hi);
                if (err == 0) {
                        pthread_mutex_lock(&c->lock);
                        err = share_in_place(c, sorted, count, device, lo, hi, stream, &req,
                                             &h->gpu);
                        pthread_mutex_unlock(&c->lock);
                }
        }
        if (err < 0)
                goto out;
        h->has_gpu = true;

        /* what the readers' bytes are in: the members themselves, or their copy */
        b = bundle_new(copy ? 1 : count);
        fd = b ? segment_new(table, sorted, count, tp, tp->data_off, GROUP_FORMAT_APART) : -ENOMEM;
        err = fd < 0 ? fd : dlx__seal_fresh(fd, GROUP_SEALS);
        if (err < 0) {
                err = dlx__fail(err, "publish group '%s': cannot make its table: %s", name,
                                strerror(-err));
                pthread_mutex_lock(&c->lock);
                dlx__gpu_publish_undo(c, &h->gpu);
                pthread_mutex_unlock(&c->lock);
                goto out;
        }
        if (copy) {
                b->members[0].tensor = copy;
                copy = NULL;
        } else {
                for (size_t i = 0; i < count; i++) {
                        b->members[i].tensor = members[i].tensor;
                        members[i].tensor = NULL;
                }
        }
        pthread_mutex_lock(&c->lock);
        /* registered before the request: RELEASED may follow the reply at once */
        dlx__held_insert(c, h, name, &b->mt, &req);
        pthread_mutex_unlock(&c->lock);

        uint64_t version = 0;
        err = group_call(c, &req, fd, &version);
        if (err == 0 && ret_version)
                *ret_version = version;
        dlx__held_answered(c, h, req.publish.token, err, version);
        h = NULL;
        if (err < 0)
                b->mt.deleter(&b->mt); /* refused: the members (or the copy) go */
        b = NULL;
out:
        fd_drop(&fd);
        free(b);
        free(h);
        if (copy)
                copy->deleter(copy);
        return err;
}

static int held_publish_group(dlx_client *c, const char *name, struct dlx_member *members,
                              size_t count, const struct dlx_publish_options *opts,
                              uint64_t *ret_version)
{
        struct dlx_publish_options o = {0};
        struct pub_member *ms = NULL, **sorted = NULL, **by_start = NULL;
        struct block *blocks = NULL;
        struct table_plan tp = {0};
        struct dlx_scratch own, *work = NULL;
        void *names_work = NULL;
        size_t names_worksz = 0;
        uint8_t *table, *stage;
        const char *why = NULL;
        size_t nblocks = 0, nspans = 0;
        int fd = -1, err;

        if (opts)
                o = *opts;
        if (!c || !name || (!members && count))
                return dlx__fail(-EINVAL, "NULL argument");
        if ((err = dlx__usable(c)) < 0)
                return err;
        if (layout_name_check(name, strlen(name), &why) < 0)
                return dlx__fail(-EINVAL, "bad group name '%s': %s", DLX_QUOTED(name), why);
        if ((err = check_daemon(c, name)) < 0 || (err = check_count(c, name, count)) < 0)
                return err;
        if (o.copy != DLX_COPY_IF_NEEDED && o.copy != DLX_COPY_NEVER && o.copy != DLX_COPY_ALWAYS)
                return dlx__fail(-EINVAL, "publish group '%s': copy mode %d is not a dlx_copy",
                                 name, (int)o.copy);
        if (o.writable)
                return dlx__fail(-ENOTSUP, "publish group '%s': a group is read-only", name);

        /* count was checked (at most GROUP_MEMBERS_MAX): these sizes cannot overflow */
        work = dlx__scratch_take(c, &own);
        ms = dlx__scratch_get(work, 0,
                              count * (sizeof(*ms) + 2 * sizeof(*sorted) + sizeof(*blocks)));
        if (!ms) {
                err = dlx__fail(-ENOMEM, "out of memory");
                goto out;
        }
        blocks = (struct block *)(ms + count);
        /* the name sort's room, and later delete_members()' */
        names_worksz = 2 * count * sizeof(struct name_item);
        if (names_worksz < delete_work(count))
                names_worksz = delete_work(count);
        if (!(names_work = dlx__scratch_get(work, 3, names_worksz)))
                names_worksz = 0;
        sorted = (struct pub_member **)(blocks + count);
        by_start = sorted + count;
        for (size_t i = 0; i < count; i++) {
                if ((err = check_member(&members[i], i, &ms[i])) < 0)
                        goto out;
                sorted[i] = &ms[i];
                if (ms[i].hi > ms[i].lo)
                        by_start[nspans++] = &ms[i];
                const DLDevice d = ms[i].t->device, d0 = ms[0].t->device;
                if (d.device_type != d0.device_type ||
                    (d.device_type == kDLCUDA && d.device_id != d0.device_id)) {
                        err = dlx__fail(-ENOTSUP,
                                        "publish group '%s': member '%s' is on device %d:%d and "
                                        "'%s' on %d:%d; a group's members are on one device",
                                        name, ms[0].name, (int)d0.device_type, (int)d0.device_id,
                                        ms[i].name, (int)d.device_type, (int)d.device_id);
                        goto out;
                }
        }
        if ((err = plan_table(c, name, sorted, count, names_work, &tp)) < 0)
                goto out;
        if (ms[0].t->device.device_type == kDLCUDA) {
                sort_members(by_start, nspans, cmp_member_start);
                err = publish_device_group(
                        c, name, members, count, &o, sorted, by_start, nspans, blocks, &tp,
                        dlx__scratch_get(work, 1, tp.names_off + tp.names_size), ret_version);
                goto out;
        }
        if (o.copy == DLX_COPY_NEVER) {
                err = dlx__fail(-EXDEV,
                                "publish group '%s': a group is copied once into its own "
                                "segment, and copying is not allowed (dlx_group_alloc() "
                                "memory publishes without a copy)",
                                name);
                goto out;
        }
        sort_members(by_start, nspans, cmp_member_start);
        uint64_t data_bytes = lay_out(by_start, nspans, blocks, &nblocks, tp.data_off);
        /* empty members point at the data area's start */
        for (size_t i = 0; i < count; i++)
                if (ms[i].hi <= ms[i].lo)
                        ms[i].offset = tp.data_off;
        if (data_bytes > DLX_MAX_SEGMENT - tp.data_off) {
                err = dlx__fail(-EOVERFLOW,
                                "group '%s': %llu bytes of data and a %llu-byte table are over "
                                "the 1 TiB a segment may hold",
                                name, (unsigned long long)data_bytes,
                                (unsigned long long)tp.data_off);
                goto out;
        }

        table = dlx__scratch_get(work, 1, tp.names_off + tp.names_size);
        stage = dlx__scratch_get(work, 2, STAGE_SIZE); /* NULL: no staging, slower */
        fd = table ? segment_new(table, sorted, count, &tp, tp.data_off + data_bytes, GROUP_FORMAT)
                   : -ENOMEM;
        err = fd < 0 ? fd : write_blocks(fd, blocks, nblocks, stage);
        /* nothing ever mapped it writable: it can be sealed against writing */
        if (err == 0)
                err = dlx__seal_fresh(fd, GROUP_SEALS);
        if (err < 0) {
                err = dlx__fail(err, "publish group '%s': cannot copy into shared memory: %s", name,
                                strerror(-err));
                goto out;
        }
        /* the copy is all the daemon needs: the originals go now */
        delete_members(members, count, names_work, names_worksz);
        err = send_group(c, name, fd, count, tp.data_off, data_bytes, &o, ret_version);
out:
        fd_drop(&fd);
        delete_members(members, count, names_work, names_worksz);
        if (work)
                dlx__scratch_give(c, work);
        return err;
}

int dlx_publish_group(dlx_client *c, const char *name, struct dlx_member *members, size_t count,
                      const struct dlx_publish_options *opts, uint64_t *ret_version)
{
        int err;

        if (!c) {
                delete_members(members, count, NULL, 0);
                return dlx__fail(-EINVAL, "NULL client");
        }
        err = DLX_HOLDING(c, held_publish_group(c, name, members, count, opts, ret_version));
        delete_members(members, count, NULL, 0); /* every path: those a failure left */
        return err;
}

/* ---- acquire -------------------------------------------------------------------------- */

struct dlx_group {
        dlx_client *c;
        struct seg_map *map;       /* the group's segment; a device group's memory (NULL: IPC) */
        struct seg_map *table_map; /* a device group's table (1.4), else NULL */
        const uint8_t *base;       /* the table, mapped read-only (the group's segment's start) */
        uint32_t storage;          /* the members' memory: memfd, cuda-vmm or cuda-ipc */
        bool has_gpu;              /* a device group: gpu holds its memory and ordering */
        struct gpu_acq gpu;
        uint64_t lease;
        uint64_t version;
        atomic_uint refs; /* the caller's, and one per tensor taken */
        size_t count;
        bool whole;        /* every member, in the table's order: index[i] == i */
        uint32_t *index;   /* the members in the group, as indices into the table */
        DLTensor *tensors; /* count of them, over the mapping */
        /* dlx_group_alloc(): the group's own segment, mapped writable until published */
        bool alloc;
        bool sealed; /* mapped read-only, sealed: publishable, no more writable */
        int fd;
        uint64_t size, data_off, data_bytes;
        pthread_mutex_t lock; /* alloc: serialises dlx_group_publish()'s sealing, and version */
};

static void group_free(dlx_group *g)
{
        dlx_client *c = g->c;
        struct wire_request req = {.type = WIRE_REQ_RELEASE};

        if (g->alloc) {
                /* no lease: the memory is the process's own, and the daemon holds its copy's fd */
                munmap((void *)g->base, g->size);
                fd_drop(&g->fd);
                pthread_mutex_destroy(&g->lock);
                free(g->index);
                free(g->tensors);
                free(g);
                return;
        }

        /* in a child of the process that acquired it: the lease and the mapping are the parent's */
        if (!dlx__forked(c)) {
                req.release.lease = g->lease;
                pthread_mutex_lock(&c->lock);
                /* the reader's stream records when it is done, for the producer to wait on */
                if (g->has_gpu)
                        dlx__gpu_release(c, &g->gpu, &req);
                dlx__release(c, &req);
                if (g->map)
                        dlx__map_unref(c, g->map);
                if (g->table_map)
                        dlx__map_unref(c, g->table_map);
                dlx__acquired_gone(c);
                pthread_mutex_unlock(&c->lock);
                dlx__client_unref(c);
        }
        free(g->index);
        free(g->tensors);
        free(g);
}

static void group_unref(void *hold)
{
        dlx_group *g = hold;

        if (atomic_fetch_sub(&g->refs, 1) == 1)
                group_free(g);
}

/*
 * A device group's memory, opened (a VMM mapping or an IPC handle, cached)
 * and ordered: stream waits once for the producer's event. *ret_data is the
 * device address of the memory's start.
 */
static int open_device_group(dlx_client *c, struct pending *p, void *stream, struct gpu_acq *gpu,
                             uint8_t **ret_data)
{
        const struct wire_tensor *t = &p->rep.acquire.tensor;
        struct seg_map *m = p->map;
        int err;

        if (m && t->length > m->size)
                return dlx__fail(-EPROTO, "the daemon described group '%s' outside its memory",
                                 t->name);
        if (!stream)
                stream = dlx__gpu_stream(c, t->device_id);
        pthread_mutex_lock(&c->lock);
        err = dlx__gpu_acquire(c, t, m, stream, gpu, (void **)ret_data);
        pthread_mutex_unlock(&c->lock);
        return err;
}

/*
 * Builds the group over an acquire reply's mappings, whose references move
 * to it: a group segment, or a device group's table and memory.
 */
static int build_group(dlx_client *c, struct pending *p, const char *name,
                       const char *const *wanted, size_t nwanted, void *stream, dlx_group **ret)
{
        const struct wire_tensor *t = &p->rep.acquire.tensor;
        bool device = t->table_segment != 0;
        struct seg_map *m = device ? p->table_map : p->map;
        struct group_bounds bounds = {.apart_size = device ? t->length : 0};
        struct group_summary sum;
        struct gpu_acq gpu = {0};
        char why[DLX_ERROR_MAX + 1];
        uint8_t *data;
        dlx_group *g;
        int err;

        if (!m || !m->ro ||
            (device ? t->storage != WIRE_STORAGE_CUDA_VMM && t->storage != WIRE_STORAGE_CUDA_IPC
                    : t->storage != WIRE_STORAGE_MEMFD))
                return dlx__fail(-EPROTO, "the daemon gave group '%s' as no group segment", name);
        /* dlxd checked it, and it is sealed: this check is against a daemon gone wrong */
        err = group_check(m->ro, m->size, &bounds, &sum, why, sizeof(why));
        if (err < 0)
                return dlx__fail(-EPROTO, "group '%s' from the daemon: %s", name, why);
        data = (uint8_t *)m->ro;
        if (device && (err = open_device_group(c, p, stream, &gpu, &data)) < 0)
                return err;
        g = calloc(1, sizeof(*g));
        size_t n = wanted ? nwanted : sum.count;
        if (g) {
                g->index = calloc(n ? n : 1, sizeof(*g->index));
                g->tensors = calloc(n ? n : 1, sizeof(*g->tensors));
        }
        if (!g || !g->index || !g->tensors) {
                err = dlx__fail(-ENOMEM, "out of memory");
                goto fail;
        }
        for (size_t i = 0; i < n; i++) {
                int64_t k = (int64_t)i;
                if (wanted) {
                        k = group_find(m->ro, wanted[i], strlen(wanted[i]));
                        if (k < 0) {
                                err = dlx__fail(-ENOENT, "group '%s' v%llu has no member '%s'",
                                                name, (unsigned long long)t->version, wanted[i]);
                                goto fail;
                        }
                }
                const struct group_member *gm = group_member_at(m->ro, (uint32_t)k);
                int64_t *dims = (int64_t *)group_member_dims(m->ro, gm);
                g->index[i] = (uint32_t)k;
                g->tensors[i] = (DLTensor){
                        .data = data + gm->offset,
                        .device =
                                device ? (DLDevice){kDLCUDA, t->device_id} : (DLDevice){kDLCPU, 0},
                        .ndim = gm->ndim,
                        .dtype = {gm->dtype_code, gm->dtype_bits, gm->dtype_lanes},
                        .shape = gm->ndim ? dims : NULL,
                        .strides = gm->ndim ? dims + gm->ndim : NULL,
                        .byte_offset = gm->byte_offset,
                };
        }
        g->c = c;
        g->map = p->map;
        g->table_map = device ? m : NULL;
        g->base = m->ro;
        g->storage = t->storage;
        g->has_gpu = device;
        g->gpu = gpu;
        g->lease = p->rep.acquire.lease;
        g->version = t->version;
        g->count = n;
        g->whole = !wanted;
        atomic_init(&g->refs, 1);
        p->map = p->table_map = NULL;
        dlx__client_ref(c);
        pthread_mutex_lock(&c->lock);
        c->nacquired++;
        pthread_mutex_unlock(&c->lock);
        *ret = g;
        return 0;
fail:
        if (g) {
                free(g->index);
                free(g->tensors);
                free(g);
        }
        if (device) {
                struct wire_request ignored = {.type = WIRE_REQ_RELEASE};
                pthread_mutex_lock(&c->lock);
                dlx__gpu_release(c, &gpu, &ignored);
                pthread_mutex_unlock(&c->lock);
        }
        return err;
}

static int held_acquire_group(dlx_client *c, const char *name, const char *const *wanted,
                              size_t nwanted, const struct dlx_acquire_options *opts,
                              dlx_group **ret_group)
{
        struct wire_request req = {.type = WIRE_REQ_ACQUIRE};
        const char *why = NULL;
        struct pending p;
        int err;

        if (!name || !ret_group || (!wanted && nwanted))
                return dlx__fail(-EINVAL, "NULL argument");
        for (size_t i = 0; i < nwanted; i++)
                if (!wanted[i])
                        return dlx__fail(-EINVAL, "acquire group '%s': member name %zu is NULL",
                                         name, i);
        if (layout_name_check(name, strlen(name), &why) < 0)
                return dlx__fail(-EINVAL, "bad group name: %s", why);
        if ((err = check_daemon(c, name)) < 0)
                return err;
        wire_strcpy(req.acquire.name, sizeof(req.acquire.name), name);
        req.acquire.group = true;
        if (opts) {
                req.acquire.min_version = opts->min_version;
                req.acquire.timeout_ms = opts->timeout_ms < 0 ? -1 : opts->timeout_ms;
        }
        err = dlx__call(c, &req, -1, &p);
        if (err == 0 && (p.rep.type != WIRE_REP_ACQUIRE || !p.rep.acquire.tensor.members))
                err = dlx__fail(-EPROTO, "the daemon answered a group acquire with something else");
        if (err == 0)
                err = build_group(c, &p, name, wanted, nwanted, opts ? opts->stream : NULL,
                                  ret_group);
        if (err < 0 && p.rep.status == WIRE_OK && p.rep.type == WIRE_REP_ACQUIRE)
                dlx__give_back(c, p.rep.acquire.lease); /* granted but unusable here */
        dlx__pending_done(c, &p);
        return err;
}

int dlx_acquire_group(dlx_client *c, const char *name, const char *const *member_names,
                      size_t count, const struct dlx_acquire_options *opts, dlx_group **ret_group)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_acquire_group(c, name, member_names, count, opts, ret_group));
}

uint64_t dlx_group_version(const dlx_group *g)
{
        uint64_t v = 0;

        if (g && g->alloc) {
                pthread_mutex_lock((pthread_mutex_t *)&g->lock);
                v = g->version;
                pthread_mutex_unlock((pthread_mutex_t *)&g->lock);
        } else if (g) {
                v = g->version;
        }
        return v;
}

size_t dlx_group_count(const dlx_group *g)
{
        return g ? g->count : 0;
}

const char *dlx_group_name(const dlx_group *g, size_t i)
{
        if (!g || i >= g->count)
                return NULL;
        return group_member_name(g->base, group_member_at(g->base, g->index[i]));
}

const DLTensor *dlx_group_tensor(const dlx_group *g, size_t i)
{
        return g && i < g->count ? &g->tensors[i] : NULL;
}

int64_t dlx_group_find(const dlx_group *g, const char *name)
{
        if (!g || !name)
                return -ENOENT;
        size_t len = strlen(name);
        if (g->whole) {
                int64_t k = group_find(g->base, name, len);
                return k < 0 ? -ENOENT : k;
        }
        for (size_t i = 0; i < g->count; i++) {
                const struct group_member *gm = group_member_at(g->base, g->index[i]);
                if (group_name_cmp(group_member_name(g->base, gm), gm->name_len, name, len) == 0)
                        return (int64_t)i;
        }
        return -ENOENT;
}

int dlx_group_take(dlx_group *g, size_t i, DLManagedTensorVersioned **ret_tensor)
{
        int err;

        if (!g || i >= g->count || !ret_tensor)
                return dlx__fail(-EINVAL, "no member %zu in the group", i);
        const struct group_member *gm = group_member_at(g->base, g->index[i]);
        atomic_fetch_add(&g->refs, 1);
        /* an allocated group's seal and version change under dlx_group_publish() */
        bool writable = false;
        uint64_t version = g->version;
        if (g->alloc) {
                pthread_mutex_lock(&g->lock);
                writable = !g->sealed;
                version = g->version;
                pthread_mutex_unlock(&g->lock);
        }
        /* device memory refuses writes where it was mapped for reading only (VMM) */
        bool protect = g->has_gpu ? g->map && !g->map->ro_writable : !writable;
        err = dlx__acquired_member(
                &g->tensors[i], gm->flags, writable, protect,
                g->alloc ? WIRE_STORAGE_MEMFD : g->storage, group_member_name(g->base, gm), version,
                g->has_gpu ? g->c : NULL, g->has_gpu ? &g->gpu : NULL, group_unref, g, ret_tensor);
        if (err < 0)
                group_unref(g);
        return err;
}

void dlx_group_release(dlx_group *g)
{
        if (g)
                group_unref(g);
}

/* ---- groups to fill in place ------------------------------------------------------------ */

int dlx_group_alloc(dlx_client *c, const struct dlx_member_layout *layouts, size_t count,
                    dlx_group **ret_group)
{
        struct pub_member *ms = NULL, **sorted = NULL;
        DLTensor *protos = NULL;
        struct table_plan tp = {0};
        dlx_group *g = NULL;
        uint8_t *base = MAP_FAILED;
        int fd = -1, err;

        if (!c || !ret_group || (!layouts && count))
                return dlx__fail(-EINVAL, "NULL argument");
        if ((err = check_count(c, "(allocated)", count)) < 0)
                return err;
        ms = calloc(count, sizeof(*ms));
        sorted = calloc(count, sizeof(*sorted));
        protos = calloc(count, sizeof(*protos));
        g = calloc(1, sizeof(*g));
        if (g) {
                g->index = calloc(count, sizeof(*g->index));
                g->tensors = calloc(count, sizeof(*g->tensors));
        }
        if (!ms || !sorted || !protos || !g || !g->index || !g->tensors) {
                err = dlx__fail(-ENOMEM, "out of memory");
                goto fail;
        }
        /* each a compact kDLCPU tensor: checked as a member of a publish would be */
        for (size_t i = 0; i < count; i++) {
                DLManagedTensorVersioned mt = {.version = {DLX_DLPACK_MAJOR, DLX_DLPACK_MINOR}};
                struct dlx_member m = {layouts[i].name, &mt};
                mt.dl_tensor = (DLTensor){.data = (void *)GROUP_DATA_ALIGN,
                                          .device = {kDLCPU, 0},
                                          .ndim = layouts[i].ndim,
                                          .dtype = layouts[i].dtype,
                                          .shape = (int64_t *)layouts[i].shape};
                protos[i] = mt.dl_tensor;
                m.tensor = &mt;
                if ((err = check_member(&m, i, &ms[i])) < 0)
                        goto fail;
                ms[i].t = &protos[i];
                sorted[i] = &ms[i];
        }
        if ((err = plan_table(c, "(allocated)", sorted, count, NULL, &tp)) < 0)
                goto fail;
        /* in name order, each GROUP_MEMBER_ALIGN-aligned, the empty ones at the start */
        uint64_t at = tp.data_off;
        for (size_t i = 0; i < count; i++) {
                struct pub_member *m = sorted[i];
                if (m->hi <= m->lo) {
                        m->offset = tp.data_off;
                        continue;
                }
                at = align_up(at, GROUP_MEMBER_ALIGN);
                m->offset = at;
                /* at <= DLX_MAX_SEGMENT + GROUP_MEMBER_ALIGN here, hi < 2^63: no wrap */
                at += (uint64_t)m->hi;
                if (at > DLX_MAX_SEGMENT)
                        break;
        }
        if (at > DLX_MAX_SEGMENT) {
                err = dlx__fail(-EOVERFLOW,
                                "a group of %llu bytes, table included, is over the 1 TiB a "
                                "segment may hold",
                                (unsigned long long)at);
                goto fail;
        }
        fd = segment_new(NULL, sorted, count, &tp, at, GROUP_FORMAT);
        if (fd < 0) {
                err = dlx__fail(fd, "cannot make the group's shared memory: %s", strerror(-fd));
                goto fail;
        }
        base = mmap(NULL, at, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) {
                err = dlx__fail(-errno, "cannot map the group's shared memory: %s",
                                strerror(errno));
                goto fail;
        }
        for (size_t i = 0; i < count; i++) {
                const struct group_member *gm = group_member_at(base, (uint32_t)i);
                int64_t *dims = (int64_t *)group_member_dims(base, gm);
                g->index[i] = (uint32_t)i;
                g->tensors[i] = (DLTensor){
                        .data = base + gm->offset,
                        .device = {kDLCPU, 0},
                        .ndim = gm->ndim,
                        .dtype = {gm->dtype_code, gm->dtype_bits, gm->dtype_lanes},
                        .shape = gm->ndim ? dims : NULL,
                        .strides = gm->ndim ? dims + gm->ndim : NULL,
                };
        }
        g->alloc = true;
        g->base = base;
        g->fd = fd;
        g->size = at;
        g->data_off = tp.data_off;
        g->data_bytes = at - tp.data_off;
        g->count = count;
        g->whole = true;
        atomic_init(&g->refs, 1);
        pthread_mutex_init(&g->lock, NULL);
        free(ms);
        free(sorted);
        free(protos);
        *ret_group = g;
        return 0;
fail:
        if (base != MAP_FAILED)
                munmap(base, at);
        fd_drop(&fd);
        if (g) {
                free(g->index);
                free(g->tensors);
                free(g);
        }
        free(ms);
        free(sorted);
        free(protos);
        return err;
}

static int held_group_publish(dlx_client *c, const char *name, dlx_group *g,
                              const struct dlx_publish_options *opts, uint64_t *ret_version)
{
        struct dlx_publish_options o = {0};
        const char *why = NULL;
        int err = 0;

        if (opts)
                o = *opts;
        if (!name || !g)
                return dlx__fail(-EINVAL, "NULL argument");
        if (!g->alloc)
                return dlx__fail(-EINVAL, "publish group '%s': not a group from dlx_group_alloc()",
                                 name);
        if ((err = dlx__usable(c)) < 0)
                return err;
        if (layout_name_check(name, strlen(name), &why) < 0)
                return dlx__fail(-EINVAL, "bad group name '%s': %s", DLX_QUOTED(name), why);
        if (o.writable)
                return dlx__fail(-ENOTSUP, "publish group '%s': a group is read-only", name);
        if ((err = check_daemon(c, name)) < 0)
                return err;
        if (o.copy == DLX_COPY_ALWAYS)
                return dlx__fail(-EINVAL,
                                 "publish group '%s': an allocated group goes as it is, "
                                 "never copied (DLX_COPY_ALWAYS)",
                                 name);
        pthread_mutex_lock(&g->lock);
        if (!g->sealed) {
                /*
                 * The same pages, read-only at the same addresses: every pointer
                 * into them stays good for reading. Private, because a shared
                 * mapping of a read-write descriptor may be made writable again
                 * (mprotect), and the kernel refuses F_SEAL_WRITE while one
                 * exists; a private one reads the same pages, and can never
                 * write them.
                 */
                void *ro = mmap((void *)g->base, g->size, PROT_READ, MAP_PRIVATE | MAP_FIXED, g->fd,
                                0);
                if (ro == MAP_FAILED)
                        err = dlx__fail(-errno, "publish group '%s': cannot map it read-only: %s",
                                        name, strerror(errno));
                else if ((err = segment_seal(g->fd)) < 0) {
                        /*
                         * Someone else maps it writable: a child forked since the
                         * alloc. Writable again, as it was, and nothing published.
                         */
                        if (mmap((void *)g->base, g->size, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_FIXED, g->fd, 0) == MAP_FAILED)
                                dlx__log(c, DLX_LOG_WARNING, "group '%s' stays read-only: %s", name,
                                         strerror(errno));
                        err = dlx__fail(err,
                                        "publish group '%s': cannot seal it (%s): another process "
                                        "maps it writable, a child forked since dlx_group_alloc(); "
                                        "publish once it has exited or called exec",
                                        name, strerror(-err));
                } else {
                        g->sealed = true;
                }
        }
        pthread_mutex_unlock(&g->lock);
        if (err < 0)
                return err;
        uint64_t version = 0;
        err = send_group(c, name, g->fd, g->count, g->data_off, g->data_bytes, &o, &version);
        if (err < 0)
                return err;
        pthread_mutex_lock(&g->lock);
        g->version = version; /* of the publish that returned last */
        pthread_mutex_unlock(&g->lock);
        if (ret_version)
                *ret_version = version;
        return 0;
}

int dlx_group_publish(dlx_client *c, const char *name, dlx_group *group,
                      const struct dlx_publish_options *opts, uint64_t *ret_version)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_group_publish(c, name, group, opts, ret_version));
}
