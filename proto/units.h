/* SPDX-License-Identifier: MIT */
/* Sizes as people type them on command lines: "64M", "1GiB", "4096". */
#ifndef DLX_PROTO_UNITS_H
#define DLX_PROTO_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* Parses a count of bytes with an optional K/M/G/T suffix (powers of 1024, "B" or "iB"
 * may follow). Returns 0 with *ret, or -EINVAL (malformed, negative or overflowing). */
int units_parse_size(const char *s, uint64_t *ret);

/* v as people read it: "512 B", "4 KiB", "1.5 GiB". Returns buf. */
const char *units_format_size(uint64_t v, char *buf, size_t len);

#endif /* DLX_PROTO_UNITS_H */
