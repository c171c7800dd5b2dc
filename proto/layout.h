/* SPDX-License-Identifier: MIT */
/*
 * Checks both sides apply to what a peer describes: names, dtypes, and the
 * bytes a shape/strides/byte_offset layout touches. Pure functions.
 */
#ifndef DLX_PROTO_LAYOUT_H
#define DLX_PROTO_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <dlx/dlpack.h>

#include "wire_limits.h"

/*
 * A tensor name: 1..DLX_NAME_MAX bytes of valid, printable UTF-8 (no C0/C1
 * controls, no DEL), '/'-separated components, none empty, none "." or "..".
 * Returns 0 or -EINVAL with a reason in *ret_why (a static string) if given.
 */
int layout_name_check(const char *name, size_t len, const char **ret_why);

/*
 * Whether len bytes at s are valid UTF-8: no overlong forms, surrogates or
 * code points past U+10FFFF (NUL and controls are valid here).
 */
bool layout_utf8_valid(const char *s, size_t len);

/*
 * A name (or any bytes) as an error message may show it, on one line and
 * harmless to a terminal: len bytes of s into buf (bufsz >= 4), each byte
 * outside printable ASCII as '?', cut with "..." where it does not fit.
 */
void layout_quote(const char *s, size_t len, char *buf, size_t bufsz);
/* Room for a whole name in layout_quote(). */
#define LAYOUT_QUOTED_MAX (DLX_NAME_MAX + 4)

/* A list/watch prefix: empty, or printable UTF-8 of at most DLX_NAME_MAX bytes. */
int layout_prefix_check(const char *prefix, size_t len, const char **ret_why);

/*
 * A dtype dlx can share: a known code (up to kDLFloat4_e2m1fn), bits and lanes
 * non-zero, and a bit width that fits the code (e.g. complex 64/128, bool 8,
 * fp8 8, fp6 6, fp4 4). Returns 0 or -EINVAL.
 */
int layout_dtype_check(DLDataType dtype, const char **ret_why);

/*
 * The bytes the elements of a tensor touch, relative to its data pointer:
 * [*ret_lo, *ret_hi). strides == NULL means compact row-major. Sub-byte
 * packed dtypes must be compact. An empty tensor touches nothing (lo == hi == 0).
 * Returns 0, -EINVAL (negative dim, non-compact packed dtype, bad dtype) or
 * -EOVERFLOW (the extent does not fit in 63 bits).
 */
int layout_extent(DLDataType dtype, int32_t ndim, const int64_t *shape, const int64_t *strides,
                  uint64_t byte_offset, uint64_t flags, int64_t *ret_lo, int64_t *ret_hi,
                  const char **ret_why);

/* Element count, or -EOVERFLOW / -EINVAL (negative dim). */
int layout_numel(int32_t ndim, const int64_t *shape, uint64_t *ret_numel);

/* Fills compact row-major strides for shape. */
void layout_compact_strides(int32_t ndim, const int64_t *shape, int64_t *ret_strides);

/* True when strides (NULL allowed) describe a compact row-major layout. */
bool layout_is_compact(int32_t ndim, const int64_t *shape, const int64_t *strides);

/* Bytes a compact tensor of numel elements occupies (packed sub-byte types rounded up). */
uint64_t layout_compact_bytes(DLDataType dtype, uint64_t numel, uint64_t flags);

/* A dtype in words: "float32", "bfloat16", "float8_e4m3fn", "float32x4", "bool". */
void layout_dtype_name(DLDataType dtype, char *buf, size_t size);

/* A device in words, as DLPack names its types: "cpu:0", "cuda:1", "cuda_host:0". */
void layout_device_name(DLDevice device, char *buf, size_t size);

#endif /* DLX_PROTO_LAYOUT_H */
