/* SPDX-License-Identifier: MIT */
/*
 * safetensors: the reader (map, parse the JSON header with jansson, check
 * every entry and that the regions tile the data area) and the writer. See
 * safetensors.h.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "layout.h"
#include "npy.h"

#define ST_LEN_BYTES 8
#define METADATA_KEY "__metadata__"
#define MSG_MAX 256

/* safetensors data is little-endian; a big-endian host would need a swapped copy. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_IS_LE 1
#else
#define HOST_IS_LE 0
#endif

/* ---- dtypes ------------------------------------------------------------------------------- */

struct st_type {
        const char *name;
        uint8_t code; /* DLDataTypeCode */
        uint8_t bits;
};

static const struct st_type st_types[] = {
        {"BOOL", kDLBool, 8},
        {"U8", kDLUInt, 8},
        {"I8", kDLInt, 8},
        {"U16", kDLUInt, 16},
        {"I16", kDLInt, 16},
        {"U32", kDLUInt, 32},
        {"I32", kDLInt, 32},
        {"U64", kDLUInt, 64},
        {"I64", kDLInt, 64},
        {"F16", kDLFloat, 16},
        {"BF16", kDLBfloat, 16},
        {"F32", kDLFloat, 32},
        {"F64", kDLFloat, 64},
        {"F8_E4M3", kDLFloat8_e4m3fn, 8},
        {"F8_E5M2", kDLFloat8_e5m2, 8},
        {"F8_E8M0", kDLFloat8_e8m0fnu, 8},
        {"C64", kDLComplex, 64},
};

#define N_ST_TYPES (sizeof(st_types) / sizeof(st_types[0]))

const char *st_dtype_name(DLDataType dtype)
{
        if (dtype.lanes != 1)
                return NULL;
        for (size_t i = 0; i < N_ST_TYPES; i++)
                if (st_types[i].code == dtype.code && st_types[i].bits == dtype.bits)
                        return st_types[i].name;
        return NULL;
}

int st_dtype_from_name(const char *name, size_t len, DLDataType *ret)
{
        for (size_t i = 0; name && ret && i < N_ST_TYPES; i++) {
                if (strlen(st_types[i].name) == len && memcmp(st_types[i].name, name, len) == 0) {
                        ret->code = st_types[i].code;
                        ret->bits = st_types[i].bits;
                        ret->lanes = 1;
                        return 0;
                }
        }
        return -ENOTSUP;
}

/* ---- reading ------------------------------------------------------------------------------ */

/* One tensor entry of the header, checked; the tfile is built from these. */
struct entry {
        const char *name;
        size_t name_len;
        DLDataType dtype;
        int32_t ndim;
        json_t *shape; /* borrowed from the header */
        uint64_t begin, end;
};

/* The first -ENOTSUP and the first -EOVERFLOW met, reported only if nothing is malformed. */
struct deferred {
        int notsup, overflow;
        char notsup_why[MSG_MAX], overflow_why[MSG_MAX];
};

struct parser {
        char *why;
        size_t whysz;
        struct deferred d;
        uint64_t data_len;
};

static void quote(const char *s, size_t len, char *buf, size_t bufsz)
{
        layout_quote(s, len, buf, bufsz);
}

/* A non-negative JSON integer, or -EINVAL. */
static int uint_of(const json_t *v, uint64_t *ret)
{
        json_int_t i;

        if (!json_is_integer(v))
                return -EINVAL;
        i = json_integer_value(v);
        if (i < 0)
                return -EINVAL;
        *ret = (uint64_t)i;
        return 0;
}

static int check_metadata(struct parser *p, const json_t *meta)
{
        const char *key;
        json_t *v;

        if (!json_is_object(meta))
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "malformed safetensors header: __metadata__ is not an object");
        json_object_foreach((json_t *)meta, key, v)
        {
                char shown[64];

                if (json_is_string(v))
                        continue;
                quote(key, strlen(key), shown, sizeof(shown));
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "malformed safetensors header: __metadata__ '%s' is not a string",
                                  shown);
        }
        return 0;
}

static int check_shape(struct parser *p, const char *shown, json_t *shape, struct entry *e)
{
        size_t ndim;

        if (!json_is_array(shape))
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "malformed safetensors header: shape of '%s' is not an array",
                                  shown);
        ndim = json_array_size(shape);
        for (size_t k = 0; k < ndim; k++) {
                uint64_t dim;

                if (uint_of(json_array_get(shape, k), &dim) < 0)
                        return tfile_fail(p->why, p->whysz, -EINVAL,
                                          "malformed safetensors header: dimension %zu of '%s' "
                                          "is not a non-negative integer",
                                          k, shown);
        }
        if (ndim > TFILE_MAX_NDIM && !p->d.notsup) {
                p->d.notsup = -ENOTSUP;
                snprintf(p->d.notsup_why, sizeof(p->d.notsup_why),
                         "tensor '%s' has %zu dimensions; dlx supports at most %d", shown, ndim,
                         TFILE_MAX_NDIM);
        }
        e->shape = shape;
        e->ndim = ndim > TFILE_MAX_NDIM ? TFILE_MAX_NDIM : (int32_t)ndim;
        return ndim > TFILE_MAX_NDIM ? 1 : 0;
}

/* Checks one tensor entry into *e. Returns 0, 1 (fine but deferred: not representable), -errno. */
static int check_entry(struct parser *p, const char *name, size_t name_len, json_t *v,
                       struct entry *e)
{
        char shown[64], dshown[32];
        const char *reason, *key;
        json_t *dtype = NULL, *shape = NULL, *offs = NULL, *x;
        uint64_t bytes, numel = 1;
        bool skip = false, zero = false;
        int r;

        quote(name, name_len, shown, sizeof(shown));
        if (tfile_name_check(name, name_len, &reason) < 0)
                return tfile_fail(p->why, p->whysz, -EINVAL, "malformed safetensors header: %s",
                                  reason);
        if (!json_is_object(v))
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "malformed safetensors header: '%s' is not an object", shown);
        json_object_foreach(v, key, x)
        {
                if (strcmp(key, "dtype") == 0) {
                        dtype = x;
                } else if (strcmp(key, "shape") == 0) {
                        shape = x;
                } else if (strcmp(key, "data_offsets") == 0) {
                        offs = x;
                } else {
                        char kshown[32];

                        quote(key, strlen(key), kshown, sizeof(kshown));
                        return tfile_fail(p->why, p->whysz, -EINVAL,
                                          "malformed safetensors header: '%s' has an unknown "
                                          "key '%s'",
                                          shown, kshown);
                }
        }
        if (!dtype || !shape || !offs)
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "malformed safetensors header: '%s' lacks %s", shown,
                                  !dtype   ? "dtype"
                                  : !shape ? "shape"
                                           : "data_offsets");
        if (!json_is_string(dtype))
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "malformed safetensors header: dtype of '%s' is not a string",
                                  shown);
        r = check_shape(p, shown, shape, e);
        if (r < 0)
                return r;
        skip = r > 0;
        if (!json_is_array(offs) || json_array_size(offs) != 2 ||
            uint_of(json_array_get(offs, 0), &e->begin) < 0 ||
            uint_of(json_array_get(offs, 1), &e->end) < 0 || e->begin > e->end)
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "malformed safetensors header: data_offsets of '%s' is not "
                                  "[begin, end] with 0 <= begin <= end",
                                  shown);
        if (e->end > p->data_len)
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "truncated safetensors file: '%s' ends at byte %llu of a "
                                  "%llu-byte data area",
                                  shown, (unsigned long long)e->end,
                                  (unsigned long long)p->data_len);
        if (st_dtype_from_name(json_string_value(dtype), json_string_length(dtype), &e->dtype) <
            0) {
                const char *dn = json_string_value(dtype);
                bool sub = strcmp(dn, "F4") == 0 || strncmp(dn, "F6_", 3) == 0;

                if (!p->d.notsup) {
                        quote(dn, json_string_length(dtype), dshown, sizeof(dshown));
                        p->d.notsup = -ENOTSUP;
                        snprintf(p->d.notsup_why, sizeof(p->d.notsup_why),
                                 "tensor '%s' has safetensors dtype '%s'%s, which dlx does not "
                                 "support",
                                 shown, dshown, sub ? " (sub-byte)" : "");
                }
                return 1;
        }
        if (skip)
                return 1;
        for (int32_t k = 0; k < e->ndim; k++)
                zero |= json_integer_value(json_array_get(shape, (size_t)k)) == 0;
        bytes = e->dtype.bits / 8u;
        for (int32_t k = 0; k < e->ndim && !zero; k++) {
                uint64_t dim = (uint64_t)json_integer_value(json_array_get(shape, (size_t)k));

                if (__builtin_mul_overflow(numel, dim, &numel) ||
                    __builtin_mul_overflow(bytes, dim, &bytes) || bytes > INT64_MAX) {
                        if (!p->d.overflow) {
                                p->d.overflow = -EOVERFLOW;
                                snprintf(p->d.overflow_why, sizeof(p->d.overflow_why),
                                         "the size of tensor '%s' does not fit 64 bits", shown);
                        }
                        return 1;
                }
        }
        if (zero)
                bytes = 0;
        if (bytes != e->end - e->begin)
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "malformed safetensors header: '%s' has %llu bytes of data "
                                  "(offsets %llu..%llu), its shape and dtype make %llu",
                                  shown, (unsigned long long)(e->end - e->begin),
                                  (unsigned long long)e->begin, (unsigned long long)e->end,
                                  (unsigned long long)bytes);
        e->name = name;
        e->name_len = name_len;
        return 0;
}

static int by_region(const void *a, const void *b)
{
        const struct entry *x = a, *y = b;

        if (x->begin != y->begin)
                return x->begin < y->begin ? -1 : 1;
        if (x->end != y->end)
                return x->end < y->end ? -1 : 1;
        return 0;
}

/* The regions, sorted, must cover [0, data_len) exactly once, as the reference requires. */
static int check_tiling(struct parser *p, struct entry *e, size_t n)
{
        uint64_t at = 0;
        char a[64], b[64];

        qsort(e, n, sizeof(*e), by_region);
        for (size_t i = 0; i < n; i++) {
                if (e[i].begin == at) {
                        at = e[i].end;
                        continue;
                }
                quote(e[i].name, e[i].name_len, b, sizeof(b));
                if (i == 0)
                        return tfile_fail(p->why, p->whysz, -EINVAL,
                                          "malformed safetensors file: %llu bytes before the "
                                          "first tensor, '%s'",
                                          (unsigned long long)e[i].begin, b);
                quote(e[i - 1].name, e[i - 1].name_len, a, sizeof(a));
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  e[i].begin < at ? "malformed safetensors file: tensors '%s' "
                                                    "and '%s' overlap"
                                                  : "malformed safetensors file: a gap between "
                                                    "tensors '%s' and '%s'",
                                  a, b);
        }
        if (at != p->data_len)
                return tfile_fail(p->why, p->whysz, -EINVAL,
                                  "malformed safetensors file: %llu bytes after the last tensor",
                                  (unsigned long long)(p->data_len - at));
        return 0;
}

static int json_failure(struct parser *p, const json_error_t *err)
{
        int code = json_error_code(err) == json_error_numeric_overflow ? -EOVERFLOW
                   : json_error_code(err) == json_error_out_of_memory  ? -ENOMEM
                                                                       : -EINVAL;

        return tfile_fail(p->why, p->whysz, code,
                          "malformed safetensors header: %s (at byte %d of the header)", err->text,
                          err->position);
}

/* Parses the header of the file mapped at map (size bytes) into a new tfile pointing into it. */
static int parse(const uint8_t *map, uint64_t size, struct tfile **ret, char *why, size_t whysz)
{
        struct parser p = {.why = why, .whysz = whysz};
        uint64_t hlen = 0, ndims = 0, name_bytes = 0;
        const uint8_t *data;
        struct entry *entries = NULL;
        struct tfile *t = NULL;
        json_error_t jerr;
        json_t *root, *v;
        const char *key;
        size_t n = 0, count;
        int r = 0;

        for (int i = 0; i < ST_LEN_BYTES; i++)
                hlen |= (uint64_t)map[i] << (8 * i);
        if (hlen > ST_MAX_HEADER_LEN)
                return tfile_fail(why, whysz, -EINVAL,
                                  "safetensors header length %llu exceeds the %u-byte limit",
                                  (unsigned long long)hlen, ST_MAX_HEADER_LEN);
        if (hlen > size - ST_LEN_BYTES)
                return tfile_fail(why, whysz, -EINVAL,
                                  "truncated safetensors file: header length %llu, but only "
                                  "%llu bytes follow it",
                                  (unsigned long long)hlen,
                                  (unsigned long long)(size - ST_LEN_BYTES));
        data = map + ST_LEN_BYTES + hlen;
        p.data_len = size - ST_LEN_BYTES - hlen;

        root = json_loadb((const char *)map + ST_LEN_BYTES, (size_t)hlen, JSON_REJECT_DUPLICATES,
                          &jerr);
        if (!root)
                return json_failure(&p, &jerr);
        if (!json_is_object(root)) {
                r = tfile_fail(why, whysz, -EINVAL,
                               "malformed safetensors header: not a JSON object");
                goto out;
        }
        count = json_object_size(root);
        if (json_object_get(root, METADATA_KEY))
                count--;
        if (count > TFILE_MAX_MEMBERS) {
                r = tfile_fail(why, whysz, -EINVAL,
                               "safetensors file has %zu tensors; at most %u are accepted", count,
                               TFILE_MAX_MEMBERS);
                goto out;
        }
        entries = calloc(count + 1, sizeof(*entries));
        if (!entries) {
                r = tfile_fail(why, whysz, -ENOMEM, "out of memory for the safetensors header");
                goto out;
        }
        json_object_foreach(root, key, v)
        {
                /* jansson refuses \u0000 in keys without JSON_ALLOW_NUL; the length is exact. */
                size_t key_len = json_object_iter_key_len(json_object_key_to_iter(key));

                if (key_len == strlen(METADATA_KEY) && strcmp(key, METADATA_KEY) == 0) {
                        r = check_metadata(&p, v);
                        if (r < 0)
                                goto out;
                        continue;
                }
                r = check_entry(&p, key, key_len, v, &entries[n]);
                if (r < 0)
                        goto out;
                if (r == 0) {
                        ndims += (uint64_t)entries[n].ndim;
                        name_bytes += key_len + 1;
                        n++;
                }
        }
        r = p.d.notsup     ? tfile_fail(why, whysz, p.d.notsup, "%s", p.d.notsup_why)
            : p.d.overflow ? tfile_fail(why, whysz, p.d.overflow, "%s", p.d.overflow_why)
                           : check_tiling(&p, entries, n);
        if (r < 0)
                goto out;
        t = tfile_new(n, (size_t)ndims, (size_t)name_bytes);
        if (!t) {
                r = tfile_fail(why, whysz, -ENOMEM, "out of memory for %zu tensors", n);
                goto out;
        }
        for (size_t i = 0; i < n; i++) {
                struct tfile_member *m = &t->members[i];
                const struct entry *e = &entries[i];
                int64_t *shape = tfile_dims(t, (size_t)e->ndim);

                m->name = tfile_name(t, e->name, e->name_len);
                for (int32_t k = 0; k < e->ndim; k++)
                        shape[k] = json_integer_value(json_array_get(e->shape, (size_t)k));
                m->tensor = (DLTensor){
                        .data = (void *)(data + e->begin),
                        .device = {kDLCPU, 0},
                        .ndim = e->ndim,
                        .dtype = e->dtype,
                        .shape = e->ndim ? shape : NULL,
                };
                m->nbytes = e->end - e->begin;
        }
        r = tfile_sort(t, why, whysz);
        if (r < 0) {
                tfile_free(t);
                goto out;
        }
        *ret = t;
out:
        free(entries);
        json_decref(root);
        return r;
}

int st_open(const char *path, struct tfile **ret, char *why, size_t whysz)
{
        struct tfile *t = NULL;
        struct stat st;
        void *map;
        int fd, r;

        if (!path || !ret)
                return tfile_fail(why, whysz, -EINVAL, "st_open: NULL argument");
        if (!HOST_IS_LE)
                return tfile_fail(why, whysz, -ENOTSUP,
                                  "safetensors files are little-endian; this host is not");
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return tfile_fail(why, whysz, -errno, "%s", strerror(errno));
        if (fstat(fd, &st) < 0) {
                r = -errno;
                close(fd);
                return tfile_fail(why, whysz, r, "%s", strerror(-r));
        }
        if (!S_ISREG(st.st_mode)) {
                close(fd);
                return tfile_fail(why, whysz, -EINVAL, "not a regular file");
        }
        if (st.st_size < ST_LEN_BYTES) {
                close(fd);
                return tfile_fail(why, whysz, -EINVAL,
                                  "truncated safetensors file: %lld bytes, too short for the "
                                  "8-byte header length",
                                  (long long)st.st_size);
        }
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        r = map == MAP_FAILED ? -errno : 0;
        close(fd);
        if (r < 0)
                return tfile_fail(why, whysz, r, "mapping the file: %s", strerror(-r));
        r = parse(map, (uint64_t)st.st_size, &t, why, whysz);
        if (r < 0) {
                munmap(map, (size_t)st.st_size);
                return r;
        }
        t->map = map;
        t->map_len = (size_t)st.st_size;
        *ret = t;
        return 0;
}

/* ---- writing ------------------------------------------------------------------------------ */

/* What the writer knows of each member once it is checked. */
struct out {
        const struct tfile_member *m;
        const char *dtype;
        size_t itemsize;
        uint64_t bytes, begin;
};

/* Decreasing element size, then name: each tensor's data stays aligned to its elements. */
static int by_layout(const void *a, const void *b)
{
        const struct out *x = a, *y = b;

        if (x->itemsize != y->itemsize)
                return x->itemsize > y->itemsize ? -1 : 1;
        return strcmp(x->m->name, y->m->name);
}

static int check_member(const struct tfile_member *m, struct out *o, char *why, size_t whysz)
{
        const DLTensor *t = &m->tensor;
        char shown[64];
        bool empty = false;

        quote(m->name, strlen(m->name), shown, sizeof(shown));
        o->m = m;
        if (t->ndim < 0)
                return tfile_fail(why, whysz, -EINVAL, "tensor '%s' has negative ndim %d", shown,
                                  t->ndim);
        if (t->ndim > TFILE_MAX_NDIM)
                return tfile_fail(why, whysz, -ENOTSUP,
                                  "tensor '%s' has %d dimensions; dlx supports at most %d", shown,
                                  t->ndim, TFILE_MAX_NDIM);
        if (t->ndim > 0 && !t->shape)
                return tfile_fail(why, whysz, -EINVAL, "tensor '%s' has no shape", shown);
        if (!npy_host_memory(t->device.device_type))
                return tfile_fail(why, whysz, -EINVAL,
                                  "tensor '%s' is in device memory (device type %d): copy it to "
                                  "the host first",
                                  shown, (int)t->device.device_type);
        o->dtype = st_dtype_name(t->dtype);
        if (!o->dtype)
                return tfile_fail(why, whysz, -ENOTSUP,
                                  "tensor '%s': DLPack dtype (code %u, %u bits, %u lanes) has no "
                                  "safetensors name",
                                  shown, t->dtype.code, t->dtype.bits, t->dtype.lanes);
        o->itemsize = t->dtype.bits / 8u;
        for (int32_t k = 0; k < t->ndim; k++) {
                if (t->shape[k] < 0)
                        return tfile_fail(why, whysz, -EINVAL,
                                          "tensor '%s': dimension %d is negative (%lld)", shown, k,
                                          (long long)t->shape[k]);
                empty |= t->shape[k] == 0;
        }
        o->bytes = empty ? 0 : o->itemsize;
        for (int32_t k = 0; k < t->ndim && !empty; k++)
                if (__builtin_mul_overflow(o->bytes, (uint64_t)t->shape[k], &o->bytes) ||
                    o->bytes > INT64_MAX)
                        return tfile_fail(why, whysz, -EOVERFLOW,
                                          "the size of tensor '%s' does not fit 63 bits", shown);
        if (o->bytes > 0 && !t->data)
                return tfile_fail(why, whysz, -EINVAL, "tensor '%s' has no data", shown);
        if (o->bytes > 0 && t->strides && !npy_reach_fits(t, o->itemsize))
                return tfile_fail(why, whysz, -EOVERFLOW,
                                  "tensor '%s': strides reach beyond 64 bits", shown);
        return 0;
}

/* The header's JSON, unpadded, as a malloc'd string (free()), or an error. */
static int build_header(struct out *o, size_t n, char **ret, char *why, size_t whysz)
{
        json_t *root = json_object();
        char *text;

        if (!root)
                return tfile_fail(why, whysz, -ENOMEM, "out of memory for the header");
        for (size_t i = 0; i < n; i++) {
                const DLTensor *t = &o[i].m->tensor;
                json_t *shape = json_array();
                json_t *offs = json_array();
                json_t *e = json_object();
                bool ok = shape && offs && e;

                for (int32_t k = 0; ok && k < t->ndim; k++)
                        ok = json_array_append_new(shape, json_integer(t->shape[k])) == 0;
                ok = ok && json_array_append_new(offs, json_integer((json_int_t)o[i].begin)) == 0;
                ok = ok && json_array_append_new(
                                   offs, json_integer((json_int_t)(o[i].begin + o[i].bytes))) == 0;
                ok = ok && json_object_set_new(e, "dtype", json_string(o[i].dtype)) == 0;
                ok = ok && json_object_set_new(e, "shape", shape) == 0;
                shape = NULL;
                ok = ok && json_object_set_new(e, "data_offsets", offs) == 0;
                offs = NULL;
                ok = ok && json_object_set_new(root, o[i].m->name, e) == 0;
                e = NULL;
                if (!ok) {
                        json_decref(shape);
                        json_decref(offs);
                        json_decref(e);
                        json_decref(root);
                        return tfile_fail(why, whysz, -ENOMEM, "out of memory for the header");
                }
        }
        text = json_dumps(root, JSON_COMPACT);
        json_decref(root);
        if (!text)
                return tfile_fail(why, whysz, -ENOMEM, "out of memory for the header");
        *ret = text;
        return 0;
}

int st_write(int fd, const struct tfile_member *members, size_t n, char *why, size_t whysz)
{
        size_t *order = NULL;
        struct out *o = NULL;
        char *json = NULL, *hdr = NULL;
        uint64_t at = 0;
        size_t jlen, hlen;
        int r;

        if (!members && n > 0)
                return tfile_fail(why, whysz, -EINVAL, "st_write: NULL members");
        if (!HOST_IS_LE)
                return tfile_fail(why, whysz, -ENOTSUP,
                                  "safetensors files are little-endian; this host is not");
        if (n > TFILE_MAX_MEMBERS)
                return tfile_fail(why, whysz, -EINVAL,
                                  "%zu tensors; a safetensors file may hold at most %u", n,
                                  TFILE_MAX_MEMBERS);
        order = calloc(n + 1, sizeof(*order));
        o = calloc(n + 1, sizeof(*o));
        if (!order || !o) {
                r = tfile_fail(why, whysz, -ENOMEM, "out of memory for %zu tensors", n);
                goto out;
        }
        r = tfile_check_names(members, n, order, why, whysz);
        if (r < 0)
                goto out;
        for (size_t i = 0; i < n; i++) {
                if (strcmp(members[i].name, METADATA_KEY) == 0) {
                        r = tfile_fail(why, whysz, -EINVAL,
                                       "a tensor may not be named '" METADATA_KEY "'");
                        goto out;
                }
                r = check_member(&members[i], &o[i], why, whysz);
                if (r < 0)
                        goto out;
        }
        qsort(o, n, sizeof(*o), by_layout);
        for (size_t i = 0; i < n; i++) {
                o[i].begin = at;
                if (__builtin_add_overflow(at, o[i].bytes, &at) || at > INT64_MAX) {
                        r = tfile_fail(why, whysz, -EOVERFLOW,
                                       "the tensors' total size does not fit 63 bits");
                        goto out;
                }
        }
        r = build_header(o, n, &json, why, whysz);
        if (r < 0)
                goto out;
        jlen = strlen(json);
        /* Spaces to a multiple of 8, as the reference writer pads, so the data starts aligned. */
        hlen = jlen + (8 - jlen % 8) % 8;
        if (hlen > ST_MAX_HEADER_LEN) {
                r = tfile_fail(why, whysz, -EINVAL,
                               "the header would take %zu bytes, over the %u-byte limit", hlen,
                               ST_MAX_HEADER_LEN);
                goto out;
        }
        hdr = malloc(ST_LEN_BYTES + hlen);
        if (!hdr) {
                r = tfile_fail(why, whysz, -ENOMEM, "out of memory for the header");
                goto out;
        }
        for (int i = 0; i < ST_LEN_BYTES; i++)
                hdr[i] = (char)((uint64_t)hlen >> (8 * i));
        memcpy(hdr + ST_LEN_BYTES, json, jlen);
        memset(hdr + ST_LEN_BYTES + jlen, ' ', hlen - jlen);
        r = npy_write_all(fd, hdr, ST_LEN_BYTES + hlen);
        for (size_t i = 0; r == 0 && i < n; i++) {
                const DLTensor *t = &o[i].m->tensor;

                if (o[i].bytes == 0)
                        continue;
                r = npy_write_elements(fd, t, o[i].itemsize, o[i].bytes);
        }
        if (r < 0)
                r = tfile_fail(why, whysz, r, "writing safetensors: %s", strerror(-r));
out:
        free(hdr);
        free(json);
        free(o);
        free(order);
        return r;
}
