/* SPDX-License-Identifier: MIT */
/*
 * A minimal protobuf writer, for payloads the codec (proto/wire.c) will not
 * produce: ndim 33, a NUL inside a name, unknown fields, a missing body, a
 * list page over the limit. Field numbers are dlx.proto's. Header-only and
 * free of Check, for the suites and for tests/fuzz/make-corpus alike; out of
 * memory aborts.
 */
#ifndef DLX_TESTS_PBWRITE_H
#define DLX_TESTS_PBWRITE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A growing message; pb_init() before use, pb_done() after. */
struct pb {
        uint8_t *b;
        size_t n, cap;
};

enum pb_wire_type { PB_VARINT = 0, PB_LEN = 2, PB_GROUP_START = 3, PB_GROUP_END = 4 };

static inline void pb_init(struct pb *p)
{
        p->cap = 256;
        p->n = 0;
        p->b = malloc(p->cap);
        if (!p->b)
                abort();
}

static inline void pb_done(struct pb *p)
{
        free(p->b);
        p->b = NULL;
        p->n = p->cap = 0;
}

static inline void pb_raw(struct pb *p, const void *data, size_t len)
{
        if (p->n + len > p->cap) {
                while (p->n + len > p->cap)
                        p->cap *= 2;
                p->b = realloc(p->b, p->cap);
                if (!p->b)
                        abort();
        }
        if (len)
                memcpy(p->b + p->n, data, len);
        p->n += len;
}

static inline void pb_varint(struct pb *p, uint64_t v)
{
        uint8_t tmp[10];
        size_t n = 0;

        do {
                tmp[n] = (uint8_t)(v & 0x7f);
                v >>= 7;
                if (v)
                        tmp[n] |= 0x80;
                n++;
        } while (v);
        pb_raw(p, tmp, n);
}

static inline void pb_tag(struct pb *p, unsigned field, enum pb_wire_type type)
{
        pb_varint(p, (uint64_t)field << 3 | type);
}

/* A varint field (uint32/uint64/int32/int64/bool/enum); negative values as 10-byte varints. */
static inline void pb_uint(struct pb *p, unsigned field, uint64_t v)
{
        pb_tag(p, field, PB_VARINT);
        pb_varint(p, v);
}

static inline void pb_bytes(struct pb *p, unsigned field, const void *data, size_t len)
{
        pb_tag(p, field, PB_LEN);
        pb_varint(p, len);
        pb_raw(p, data, len);
}

static inline void pb_msg(struct pb *p, unsigned field, const struct pb *sub)
{
        pb_bytes(p, field, sub->b, sub->n);
}

static inline void pb_packed_i64(struct pb *p, unsigned field, const int64_t *v, size_t n)
{
        struct pb sub;

        pb_init(&sub);
        for (size_t i = 0; i < n; i++)
                pb_varint(&sub, (uint64_t)v[i]);
        pb_msg(p, field, &sub);
        pb_done(&sub);
}

#endif /* DLX_TESTS_PBWRITE_H */
