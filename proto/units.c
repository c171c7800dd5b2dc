/* SPDX-License-Identifier: MIT */
#include "units.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int units_parse_size(const char *s, uint64_t *ret)
{
        static const char suffixes[] = "KMGT";
        unsigned long long v;
        unsigned shift = 0;
        const char *p;
        char *end;

        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno || end == s || *s == '-')
                return -EINVAL;
        if (*end) {
                p = strchr(suffixes, *end >= 'a' ? *end - 'a' + 'A' : *end);
                if (!p || !*p)
                        return -EINVAL;
                shift = 10 * (unsigned)(p - suffixes + 1);
                if (end[1] && strcmp(end + 1, "iB") != 0 && strcmp(end + 1, "B") != 0)
                        return -EINVAL;
        }
        if (shift && v > (UINT64_MAX >> shift))
                return -EINVAL;
        *ret = (uint64_t)v << shift;
        return 0;
}

const char *units_format_size(uint64_t v, char *buf, size_t len)
{
        static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
        double d = (double)v;
        int u = 0;

        while (d >= 1024 && u < 6) {
                d /= 1024;
                u++;
        }
        if (u == 0)
                snprintf(buf, len, "%llu B", (unsigned long long)v);
        else if (d == (double)(uint64_t)d)
                snprintf(buf, len, "%.0f %s", d, units[u]);
        else
                snprintf(buf, len, "%.1f %s", d, units[u]);
        return buf;
}
