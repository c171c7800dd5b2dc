/* SPDX-License-Identifier: MIT */
#include "units.h"

#include <errno.h>
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
