/* SPDX-License-Identifier: MIT */
/*
 * A tensor file's storage and the checks every multi-tensor format shares:
 * member names, their order, their uniqueness. See tfile.h.
 */
#include "tfile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "layout.h"

int tfile_fail(char *why, size_t whysz, int code, const char *fmt, ...)
{
        if (why && whysz > 0) {
                va_list ap;

                va_start(ap, fmt);
                vsnprintf(why, whysz, fmt, ap);
                va_end(ap);
        }
        return code;
}

struct tfile *tfile_new(size_t n, size_t ndims, size_t name_bytes)
{
        struct tfile *t = calloc(1, sizeof(*t));

        if (!t)
                return NULL;
        /* calloc checks n * size for overflow; +1 keeps an empty file's pools non-NULL. */
        t->members = calloc(n + 1, sizeof(*t->members));
        t->dims = calloc(ndims + 1, sizeof(*t->dims));
        t->names = malloc(name_bytes + 1);
        if (!t->members || !t->dims || !t->names) {
                tfile_free(t);
                return NULL;
        }
        t->n = n;
        t->dims_cap = ndims;
        t->names_cap = name_bytes;
        return t;
}

void tfile_free(struct tfile *t)
{
        if (!t)
                return;
        if (t->map)
                munmap(t->map, t->map_len);
        free(t->members);
        free(t->dims);
        free(t->names);
        free(t);
}

int64_t *tfile_dims(struct tfile *t, size_t count)
{
        int64_t *d;

        if (count > t->dims_cap - t->dims_used)
                return NULL;
        d = t->dims + t->dims_used;
        t->dims_used += count;
        return d;
}

const char *tfile_name(struct tfile *t, const char *name, size_t len)
{
        char *s;

        if (len >= t->names_cap - t->names_used)
                return NULL;
        s = t->names + t->names_used;
        memcpy(s, name, len);
        s[len] = '\0';
        t->names_used += len + 1;
        return s;
}

static int by_name(const void *a, const void *b)
{
        return strcmp(((const struct tfile_member *)a)->name,
                      ((const struct tfile_member *)b)->name);
}

int tfile_sort(struct tfile *t, char *why, size_t whysz)
{
        char shown[64];

        qsort(t->members, t->n, sizeof(*t->members), by_name);
        for (size_t i = 1; i < t->n; i++) {
                if (strcmp(t->members[i - 1].name, t->members[i].name) == 0) {
                        layout_quote(t->members[i].name, strlen(t->members[i].name), shown,
                                     sizeof(shown));
                        return tfile_fail(why, whysz, -EINVAL, "two tensors are named '%s'", shown);
                }
        }
        return 0;
}

int tfile_name_check(const char *name, size_t len, const char **ret_why)
{
        const char *why = NULL;

        if (!name || len == 0)
                why = "a tensor name is empty";
        else if (len > TFILE_NAME_MAX)
                why = "a tensor name is longer than 255 bytes";
        else if (memchr(name, '\0', len))
                why = "a tensor name contains a NUL byte";
        else if (!layout_utf8_valid(name, len))
                why = "a tensor name is not valid UTF-8";
        if (!why)
                return 0;
        if (ret_why)
                *ret_why = why;
        return -EINVAL;
}

static int by_member_name(const void *a, const void *b, void *arg)
{
        const struct tfile_member *m = arg;

        return strcmp(m[*(const size_t *)a].name, m[*(const size_t *)b].name);
}

int tfile_check_names(const struct tfile_member *members, size_t n, size_t *ret_order, char *why,
                      size_t whysz)
{
        char shown[64];

        for (size_t i = 0; i < n; i++) {
                const char *name = members[i].name;
                const char *reason;
                /* strnlen: a name longer than the limit is refused without reading all of it. */
                size_t len = name ? strnlen(name, TFILE_NAME_MAX + 1) : 0;

                if (tfile_name_check(name, len, &reason) < 0) {
                        layout_quote(name ? name : "", len, shown, sizeof(shown));
                        return tfile_fail(why, whysz, -EINVAL, "tensor %zu ('%s'): %s", i, shown,
                                          reason);
                }
                ret_order[i] = i;
        }
        qsort_r(ret_order, n, sizeof(*ret_order), by_member_name, (void *)members);
        for (size_t i = 1; i < n; i++) {
                const char *name = members[ret_order[i]].name;

                if (strcmp(members[ret_order[i - 1]].name, name) == 0) {
                        layout_quote(name, strlen(name), shown, sizeof(shown));
                        return tfile_fail(why, whysz, -EINVAL, "two tensors are named '%s'", shown);
                }
        }
        return 0;
}
