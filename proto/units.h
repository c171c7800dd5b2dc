/* SPDX-License-Identifier: MIT */
/* Sizes as people type them on command lines: "64M", "1GiB", "4096". */
#ifndef DLX_PROTO_UNITS_H
#define DLX_PROTO_UNITS_H

#include <stdint.h>

/* Parses a count of bytes with an optional K/M/G/T suffix (powers of 1024, "B" or "iB"
 * may follow). Returns 0 with *ret, or -EINVAL (malformed, negative or overflowing). */
int units_parse_size(const char *s, uint64_t *ret);

#endif /* DLX_PROTO_UNITS_H */
