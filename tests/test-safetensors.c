/* SPDX-License-Identifier: MIT */
/*
 * client/safetensors: round trips of every dtype (bf16 and fp8 included), strided, 0-d
 * and empty tensors; the exact bytes of a written header; one row per defect of a
 * malformed file, each checking the errno, the message, and that no descriptor or
 * mapping is left behind; the writer's refusals; and, where python3 has numpy, the
 * files as Python sees them. Files are real, in a mkdtemp directory.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "tmpfiles.h"
#include "toolkit.h"

#define ERRSZ 256

static void setup(void)
{
        tmpdir_make("st");
}

static void teardown(void)
{
        tmpdir_remove();
}

static DLDataType dt(uint8_t code, uint8_t bits)
{
        DLDataType d = {code, bits, 1};
        return d;
}

static struct tfile_member member(const char *name, void *data, DLDataType dtype, int32_t ndim,
                                  int64_t *shape, int64_t *strides, uint64_t byte_offset)
{
        return (struct tfile_member){name,
                                     host_tensor(data, dtype, ndim, shape, strides, byte_offset)};
}

static void write_st(const char *name, const struct tfile_member *m, size_t n)
{
        char err[ERRSZ] = "";
        int fd = open_new(name);

        ck_assert_msg(st_write(fd, m, n, err, sizeof(err)) == 0, "st_write: %s", err);
        close(fd);
}

static struct tfile *read_file(const char *name)
{
        struct tfile *t = NULL;
        char err[ERRSZ] = "";

        ck_assert_msg(st_open(path_of(name), &t, err, sizeof(err)) == 0, "st_open: %s", err);
        ck_assert_ptr_nonnull(t);
        return t;
}

/* Finds a member by name in a file read back; the test fails if it is not there. */
static const struct tfile_member *find(const struct tfile *t, const char *name)
{
        for (size_t i = 0; i < t->n; i++)
                if (strcmp(t->members[i].name, name) == 0)
                        return &t->members[i];
        ck_abort_msg("no member '%s'", name);
        return NULL;
}

/* A member read back matches what was written: dtype, shape, compact, and its elements. */
static void check_member(const struct tfile *t, const struct tfile_member *w)
{
        const struct tfile_member *r = find(t, w->name);
        size_t isz = w->tensor.dtype.bits / 8u, bytes = numel(&w->tensor) * isz;
        void *want = malloc(bytes + 1);

        ck_assert_ptr_nonnull(want);
        ck_assert_int_eq(r->tensor.dtype.code, w->tensor.dtype.code);
        ck_assert_int_eq(r->tensor.dtype.bits, w->tensor.dtype.bits);
        ck_assert_int_eq(r->tensor.dtype.lanes, 1);
        ck_assert_int_eq(r->tensor.ndim, w->tensor.ndim);
        for (int32_t k = 0; k < w->tensor.ndim; k++)
                ck_assert_int_eq(r->tensor.shape[k], w->tensor.shape[k]);
        ck_assert_ptr_null(r->tensor.strides);
        ck_assert_uint_eq(r->tensor.byte_offset, 0);
        ck_assert_int_eq(r->tensor.device.device_type, kDLCPU);
        ck_assert_uint_eq(r->nbytes, bytes);
        if (bytes) {
                naive_gather(&w->tensor, want);
                ck_assert_mem_eq(r->tensor.data, want, bytes);
        }
        free(want);
}

/* ---- dtypes ------------------------------------------------------------------------------- */

static const struct {
        const char *name;
        DLDataType dtype;
} dtypes[] = {
        {"BOOL", {kDLBool, 8, 1}},
        {"U8", {kDLUInt, 8, 1}},
        {"I8", {kDLInt, 8, 1}},
        {"U16", {kDLUInt, 16, 1}},
        {"I16", {kDLInt, 16, 1}},
        {"U32", {kDLUInt, 32, 1}},
        {"I32", {kDLInt, 32, 1}},
        {"U64", {kDLUInt, 64, 1}},
        {"I64", {kDLInt, 64, 1}},
        {"F16", {kDLFloat, 16, 1}},
        {"BF16", {kDLBfloat, 16, 1}},
        {"F32", {kDLFloat, 32, 1}},
        {"F64", {kDLFloat, 64, 1}},
        {"F8_E4M3", {kDLFloat8_e4m3fn, 8, 1}},
        {"F8_E5M2", {kDLFloat8_e5m2, 8, 1}},
        {"F8_E8M0", {kDLFloat8_e8m0fnu, 8, 1}},
        {"C64", {kDLComplex, 64, 1}},
};

START_TEST(test_dtype_names)
{
        static const char *const unknown[] = {"F4", "F6_E2M3", "F6_E3M2",     "f32",  "F32 ",
                                              "",   "C128",    "F8_E4M3FNUZ", "I128", "U1"};
        static const DLDataType nameless[] = {
                {kDLFloat, 128, 1},       {kDLComplex, 128, 1},   {kDLFloat, 32, 4},
                {kDLFloat4_e2m1fn, 4, 1}, {kDLFloat8_e4m3, 8, 1}, {kDLFloat8_e5m2fnuz, 8, 1},
                {kDLOpaqueHandle, 64, 1}, {kDLBool, 1, 1},        {kDLInt, 4, 1},
                {kDLFloat6_e2m3fn, 6, 1},
        };
        DLDataType d;

        for (size_t i = 0; i < N_ELEMS(dtypes); i++) {
                ck_assert_str_eq(st_dtype_name(dtypes[i].dtype), dtypes[i].name);
                ck_assert_int_eq(st_dtype_from_name(dtypes[i].name, strlen(dtypes[i].name), &d), 0);
                ck_assert(d.code == dtypes[i].dtype.code && d.bits == dtypes[i].dtype.bits &&
                          d.lanes == 1);
        }
        d = dt(99, 99);
        for (size_t i = 0; i < N_ELEMS(unknown); i++) {
                ck_assert_int_eq(st_dtype_from_name(unknown[i], strlen(unknown[i]), &d), -ENOTSUP);
                ck_assert(d.code == 99 && d.bits == 99);
        }
        /* Length-counted: "F32" is not a prefix match of "F3". */
        ck_assert_int_eq(st_dtype_from_name("F32", 2, &d), -ENOTSUP);
        for (size_t i = 0; i < N_ELEMS(nameless); i++)
                ck_assert_ptr_null(st_dtype_name(nameless[i]));
}
END_TEST

/* ---- round trips -------------------------------------------------------------------------- */

START_TEST(test_roundtrip_all_dtypes)
{
        enum { N = N_ELEMS(dtypes) };
        static int64_t shapes[3][3] = {{2, 3, 1}, {5, 1, 1}, {1, 2, 2}};
        static const int32_t ndims[3] = {2, 1, 3};
        struct tfile_member m[N];
        uint8_t data[N][6 * 8];
        struct tfile *t;

        for (size_t i = 0; i < N; i++) {
                for (size_t b = 0; b < sizeof(data[i]); b++)
                        data[i][b] = (uint8_t)(b * 13 + i * 7 + 1);
                m[i] = member(dtypes[i].name, data[i], dtypes[i].dtype, ndims[i % 3], shapes[i % 3],
                              NULL, 0);
        }
        write_st("all.safetensors", m, N);
        t = read_file("all.safetensors");
        ck_assert_uint_eq(t->n, N);
        for (size_t i = 1; i < N; i++)
                ck_assert_int_lt(strcmp(t->members[i - 1].name, t->members[i].name), 0);
        for (size_t i = 0; i < N; i++) {
                const struct tfile_member *r = find(t, dtypes[i].name);
                size_t off = (size_t)((const uint8_t *)r->tensor.data - (const uint8_t *)t->map);

                check_member(t, &m[i]);
                /* Laid out by decreasing element size, so every tensor is aligned to its own. */
                ck_assert_uint_eq(off % (dtypes[i].dtype.bits / 8u), 0);
        }
        tfile_free(t);
}
END_TEST

START_TEST(test_roundtrip_strided)
{
        /* Every other column, a transpose, a reversed view, a broadcast, a byte_offset. */
        int32_t mem[24];
        uint16_t bf[6] = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0};
        uint8_t f8[12];
        int64_t s43[2] = {4, 3}, st_cols[2] = {6, 2};
        int64_t s32[2] = {3, 2}, st_t[2] = {1, 3};
        int64_t s6[1] = {6}, st_rev[1] = {-1};
        int64_t s34[2] = {3, 4}, st_b[2] = {0, 1};
        int64_t s222[3] = {2, 2, 2}, st_3[3] = {1, 4, 2};
        struct tfile_member m[5];
        struct tfile *t;

        for (int i = 0; i < 24; i++)
                mem[i] = i * 3 - 20;
        for (int i = 0; i < 12; i++)
                f8[i] = (uint8_t)(0x30 + i);
        m[0] = member("cols", mem, dt(kDLInt, 32), 2, s43, st_cols, 0);
        m[1] = member("bf16.T", bf, dt(kDLBfloat, 16), 2, s32, st_t, 0);
        m[2] = member("rev", mem, dt(kDLInt, 32), 1, s6, st_rev, 5 * sizeof(int32_t));
        m[3] = member("bcast", f8, dt(kDLFloat8_e4m3fn, 8), 2, s34, st_b, 1);
        m[4] = member("3d", f8, dt(kDLFloat8_e5m2, 8), 3, s222, st_3, 0);
        write_st("strided.safetensors", m, 5);
        t = read_file("strided.safetensors");
        ck_assert_uint_eq(t->n, 5);
        for (size_t i = 0; i < 5; i++)
                check_member(t, &m[i]);
        /* Spot checks computed by hand, not by naive_gather. */
        ck_assert_int_eq(((int32_t *)find(t, "cols")->tensor.data)[4], mem[8]);
        ck_assert_int_eq(((uint16_t *)find(t, "bf16.T")->tensor.data)[1], 0x4080);
        ck_assert_int_eq(((int32_t *)find(t, "rev")->tensor.data)[0], mem[5]);
        ck_assert_int_eq(((uint8_t *)find(t, "bcast")->tensor.data)[5], f8[1 + 1]);
        tfile_free(t);
}
END_TEST

START_TEST(test_roundtrip_0d_and_empty)
{
        double v = -1234.5;
        uint8_t flag = 1;
        int64_t s0[1] = {0}, s203[3] = {2, 0, 3}, huge[2] = {INT64_C(1) << 40, 0};
        int64_t wild[2] = {INT64_MAX, -5};
        struct tfile_member m[5] = {
                member("scalar", &v, dt(kDLFloat, 64), 0, NULL, NULL, 0),
                member("flag", &flag, dt(kDLBool, 8), 0, NULL, NULL, 0),
                member("e1", NULL, dt(kDLBfloat, 16), 1, s0, NULL, 0),
                member("e3", NULL, dt(kDLComplex, 64), 3, s203, NULL, 0),
                member("e-huge", NULL, dt(kDLUInt, 8), 2, huge, wild, 0),
        };
        struct tfile *t;

        write_st("small.safetensors", m, 5);
        t = read_file("small.safetensors");
        ck_assert_uint_eq(t->n, 5);
        for (size_t i = 0; i < 5; i++)
                check_member(t, &m[i]);
        ck_assert_ptr_null(find(t, "scalar")->tensor.shape);
        ck_assert(*(double *)find(t, "scalar")->tensor.data == -1234.5);
        tfile_free(t);

        /* No tensors at all: a header of {} padded to 8, and nothing else. */
        write_st("none.safetensors", NULL, 0);
        t = read_file("none.safetensors");
        ck_assert_uint_eq(t->n, 0);
        tfile_free(t);
}
END_TEST

START_TEST(test_header_bytes)
{
        static const char json[] =
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"I16\",\"shape\":[],\"data_offsets\":[8,10]}}";
        float a[2] = {1.5f, -2};
        int16_t b = 7;
        int64_t s2[1] = {2};
        struct tfile_member m[2] = {
                member("b", &b, dt(kDLInt, 16), 0, NULL, NULL, 0),
                member("a", a, dt(kDLFloat, 32), 1, s2, NULL, 0),
        };
        size_t hlen = (sizeof(json) - 1 + 7) / 8 * 8;
        char buf[256];
        struct stat st;
        int fd;

        write_st("exact.safetensors", m, 2);
        fd = open(path_of("exact.safetensors"), O_RDONLY | O_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(fstat(fd, &st), 0);
        ck_assert_int_eq(st.st_size, (off_t)(8 + hlen + 10));
        ck_assert_int_eq(read(fd, buf, sizeof(buf)), st.st_size);
        close(fd);
        for (int i = 0; i < 8; i++)
                ck_assert_int_eq((uint8_t)buf[i], (uint8_t)(hlen >> (8 * i)));
        ck_assert_mem_eq(buf + 8, json, sizeof(json) - 1);
        for (size_t i = sizeof(json) - 1; i < hlen; i++)
                ck_assert_int_eq(buf[8 + i], ' ');
        ck_assert_mem_eq(buf + 8 + hlen, a, 8);
        ck_assert_mem_eq(buf + 8 + hlen + 8, &b, 2);
}
END_TEST

/* A file as another writer might make it: metadata, any key order, unpadded, unicode names. */
START_TEST(test_foreign_file)
{
        static const char json[] =
                " {\"__metadata__\": {\"format\": \"pt\", \"note\": \"\\u00e9\"},\n"
                "  \"z\\u00e9\": {\"data_offsets\": [4, 6], \"shape\": [1], \"dtype\": \"BF16\"},"
                "  \"layer.0/w\": {\"shape\": [2, 2], \"dtype\": \"U8\", \"data_offsets\": [0, "
                "4]}} ";
        uint8_t data[6] = {1, 2, 3, 4, 0x80, 0x3f};
        uint64_t hlen = sizeof(json) - 1;
        int fd = open_new("foreign.safetensors");
        struct tfile *t;

        put(fd, &hlen, 8);
        put(fd, json, hlen);
        put(fd, data, sizeof(data));
        close(fd);
        t = read_file("foreign.safetensors");
        /* The file stays mapped, and no descriptor open, until tfile_free(). */
        ck_assert_int_eq(count_maps(NULL), 1);
        ck_assert_uint_eq(t->n, 2);
        ck_assert_str_eq(t->members[0].name, "layer.0/w");
        ck_assert_str_eq(t->members[1].name, "z\xc3\xa9");
        ck_assert_int_eq(t->members[0].tensor.shape[1], 2);
        ck_assert_mem_eq(t->members[0].tensor.data, data, 4);
        ck_assert_int_eq(t->members[1].tensor.dtype.code, kDLBfloat);
        ck_assert_mem_eq(t->members[1].tensor.data, data + 4, 2);
        tfile_free(t);
        ck_assert_int_eq(count_maps(NULL), 0);
}
END_TEST

/* ---- malformed files ---------------------------------------------------------------------- */

#define T1(body) "{\"t\":" body "}"
#define F32X2 "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

struct bad_file {
        const char *what;
        const char *json; /* the header; NULL: raw bytes only */
        uint64_t hlen;    /* 0: strlen(json) */
        size_t data_len;  /* zero bytes after the header */
        size_t file_len;  /* when json is NULL: this many bytes of hlen's encoding */
        int err;
        const char *says;
};

static const struct bad_file bad_files[] = {
        {"empty file", NULL, 0, 0, 0, -EINVAL, "truncated"},
        {"shorter than the length", NULL, 16, 0, 5, -EINVAL, "truncated"},
        {"length over the bound", NULL, ST_MAX_HEADER_LEN + 1ull, 0, 8, -EINVAL, "limit"},
        {"length beyond the file", "{}", 100, 0, 0, -EINVAL, "truncated"},
        {"length of 2^64-1", "{}", UINT64_MAX, 0, 0, -EINVAL, "limit"},
        {"empty header", "", 0, 0, 0, -EINVAL, "malformed"},
        {"not JSON", "nope", 0, 0, 0, -EINVAL, "malformed"},
        {"JSON array", "[]", 0, 0, 0, -EINVAL, "not a JSON object"},
        {"JSON then junk", "{} x", 0, 0, 0, -EINVAL, "malformed"},
        {"invalid UTF-8", "{\"\xff\":" F32X2 "}", 0, 8, 0, -EINVAL, "malformed"},
        {"duplicate names", "{\"t\":" F32X2 ",\"t\":" F32X2 "}", 0, 8, 0, -EINVAL, "duplicate"},
        {"entry not an object", T1("[1]"), 0, 0, 0, -EINVAL, "not an object"},
        {"no dtype", T1("{\"shape\":[2],\"data_offsets\":[0,8]}"), 0, 8, 0, -EINVAL, "dtype"},
        {"no shape", T1("{\"dtype\":\"F32\",\"data_offsets\":[0,8]}"), 0, 8, 0, -EINVAL, "shape"},
        {"no offsets", T1("{\"dtype\":\"F32\",\"shape\":[2]}"), 0, 8, 0, -EINVAL, "data_offsets"},
        {"unknown key", T1("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}"), 0,
         8, 0, -EINVAL, "unknown key 'x'"},
        {"dtype not a string", T1("{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}"), 0, 8, 0,
         -EINVAL, "dtype"},
        {"shape not an array", T1("{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}"), 0, 8,
         0, -EINVAL, "not an array"},
        {"non-integer dim", T1("{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}"), 0, 8,
         0, -EINVAL, "dimension 0"},
        {"string dim", T1("{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}"), 0, 8, 0,
         -EINVAL, "dimension 0"},
        {"negative dim", T1("{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}"), 0, 8, 0,
         -EINVAL, "dimension 1"},
        {"33 dims",
         T1("{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
            "1,1,1,1,1,1],\"data_offsets\":[0,1]}"),
         0, 1, 0, -ENOTSUP, "33 dimensions"},
        {"offsets not a pair", T1("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}"), 0, 8,
         0, -EINVAL, "[begin, end]"},
        {"three offsets", T1("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}"), 0, 8, 0,
         -EINVAL, "[begin, end]"},
        {"begin after end", T1("{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}"), 0, 8, 0,
         -EINVAL, "[begin, end]"},
        {"negative offset", T1("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}"), 0, 8,
         0, -EINVAL, "[begin, end]"},
        {"end beyond data", T1(F32X2), 0, 7, 0, -EINVAL, "7-byte data area"},
        {"size mismatch", T1("{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}"), 0, 8, 0,
         -EINVAL, "make 12"},
        {"overlap",
         "{\"a\":" F32X2 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12,
         0, -EINVAL, "overlap"},
        {"gap", "{\"a\":" F32X2 ",\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[9,11]}}",
         0, 11, 0, -EINVAL, "gap"},
        {"bytes before", T1("{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}"), 0, 3, 0,
         -EINVAL, "before the first"},
        {"trailing bytes", T1(F32X2), 0, 9, 0, -EINVAL, "1 bytes after"},
        {"unknown dtype", T1("{\"dtype\":\"F128\",\"shape\":[2],\"data_offsets\":[0,32]}"), 0, 32,
         0, -ENOTSUP, "'F128'"},
        {"sub-byte dtype", T1("{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}"), 0, 1, 0,
         -ENOTSUP, "sub-byte"},
        {"size over 64 bits",
         T1("{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}"), 0, 8,
         0, -EOVERFLOW, "64 bits"},
        {"number over 64 bits",
         T1("{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}"), 0, 8, 0,
         -EOVERFLOW, "too big"},
        {"empty name", "{\"\":" F32X2 "}", 0, 8, 0, -EINVAL, "empty"},
        {"NUL in name", "{\"a\\u0000b\":" F32X2 "}", 0, 8, 0, -EINVAL, "NUL"},
        {"metadata not an object", "{\"__metadata__\":[]}", 0, 0, 0, -EINVAL, "__metadata__"},
        {"metadata not strings", "{\"__metadata__\":{\"k\":1}}", 0, 0, 0, -EINVAL, "'k'"},
        /* Several problems: malformed wins over unsupported, which wins over overflow. */
        {"unsupported then malformed",
         "{\"a\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]},\"b\":[]}", 0, 1, 0,
         -EINVAL, "not an object"},
        {"overflow then unsupported",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[8,9]}}",
         0, 9, 0, -ENOTSUP, "'Q8'"},
};

/* Opens path expecting err and a message holding says; nothing may be left open or mapped. */
static void expect_refused(const char *path, int err, const char *says)
{
        struct tfile *t = (struct tfile *)0x1;
        char why[ERRSZ] = "";
        int fds = count_fds(0), maps = count_maps(NULL);
        int r = st_open(path, &t, why, sizeof(why));

        ck_assert_msg(r == err, "%d, expected %d (%s)", r, err, why);
        ck_assert_msg(strstr(why, says), "'%s' lacks '%s'", why, says);
        ck_assert_ptr_eq(t, (struct tfile *)0x1);
        ck_assert_int_eq(count_fds(0), fds);
        ck_assert_int_eq(count_maps(NULL), maps);
}

START_TEST(test_malformed)
{
        const struct bad_file *b = &bad_files[_i];
        uint64_t hlen = b->hlen ? b->hlen : (b->json ? strlen(b->json) : 0);
        int fd = open_new("bad.safetensors");
        if (b->json) {
                char *zeros = calloc(1, b->data_len + 1);

                put(fd, &hlen, 8);
                put(fd, b->json, strlen(b->json));
                put(fd, zeros, b->data_len);
                free(zeros);
        } else {
                put(fd, &hlen, b->file_len);
        }
        close(fd);
        expect_refused(path_of("bad.safetensors"), b->err, b->says);
}
END_TEST

START_TEST(test_malformed_name_length)
{
        char json[600], name[300];
        uint64_t hlen;
        int fd;

        for (int len = 255; len <= 256; len++) {
                struct tfile *t = NULL;

                memset(name, 'n', (size_t)len);
                name[len] = '\0';
                hlen = (uint64_t)snprintf(json, sizeof(json), "{\"%s\":" F32X2 "}", name);
                fd = open_new("long.safetensors");
                put(fd, &hlen, 8);
                put(fd, json, hlen);
                put(fd, "01234567", 8);
                close(fd);
                if (len == 255) {
                        t = read_file("long.safetensors");
                        ck_assert_uint_eq(strlen(t->members[0].name), 255);
                        tfile_free(t);
                } else {
                        expect_refused(path_of("long.safetensors"), -EINVAL, "longer than 255");
                }
        }
}
END_TEST

START_TEST(test_malformed_not_a_file)
{
        ck_assert_int_eq(mkdir(path_of("dir.safetensors"), 0700), 0);
        expect_refused(path_of("dir.safetensors"), -EINVAL, "not a regular file");
        expect_refused(path_of("missing.safetensors"), -ENOENT, "No such file");
}
END_TEST

START_TEST(test_malformed_too_many)
{
        /* One more tensor than the bound, each as small as JSON allows: refused by count. */
        size_t cap = (size_t)(TFILE_MAX_MEMBERS + 1) * 12 + 16, n = 0;
        char *json = malloc(cap);
        uint64_t hlen;
        int fd;

        ck_assert_ptr_nonnull(json);
        json[n++] = '{';
        for (uint32_t i = 0; i <= TFILE_MAX_MEMBERS; i++)
                n += (size_t)snprintf(json + n, cap - n, "%s\"%x\":0", i ? "," : "", i);
        json[n++] = '}';
        hlen = n;
        fd = open_new("many.safetensors");
        put(fd, &hlen, 8);
        put(fd, json, n);
        close(fd);
        free(json);
        expect_refused(path_of("many.safetensors"), -EINVAL, "1048577 tensors");
}
END_TEST

/* ---- the writer's refusals ---------------------------------------------------------------- */

START_TEST(test_write_refused)
{
        float f[4] = {0};
        int64_t s2[1] = {2}, neg[1] = {-1}, big[2] = {INT64_C(1) << 62, 4}, wild[1] = {INT64_MAX};
        int64_t s33[33];
        char longname[300];
        static const struct {
                int err;
                const char *says;
        } want[] = {
                {-EINVAL, "empty"},
                {-EINVAL, "two tensors"},
                {-EINVAL, "__metadata__"},
                {-EINVAL, "device memory"},
                {-ENOTSUP, "safetensors name"},
                {-ENOTSUP, "33 dimensions"},
                {-EINVAL, "negative"},
                {-EINVAL, "no data"},
                {-EOVERFLOW, "63 bits"},
                {-EOVERFLOW, "strides"},
                {-EINVAL, "longer"},
                {-EINVAL, "UTF-8"},
                {-EINVAL, "no shape"},
        };
        struct tfile_member cases[N_ELEMS(want)][2];
        int fd = open_new("refused.safetensors");

        for (int k = 0; k < 33; k++)
                s33[k] = 1;
        memset(longname, 'x', 256);
        longname[256] = '\0';
        for (size_t i = 0; i < N_ELEMS(want); i++) {
                cases[i][0] = member("ok", f, dt(kDLFloat, 32), 1, s2, NULL, 0);
                cases[i][1] = member("x", f, dt(kDLFloat, 32), 1, s2, NULL, 0);
        }
        cases[0][1].name = "";
        cases[1][1].name = "ok";
        cases[2][1].name = "__metadata__";
        cases[3][1].tensor.device.device_type = kDLCUDA;
        cases[4][1].tensor.dtype = dt(kDLFloat, 128);
        cases[5][1].tensor.ndim = 33;
        cases[5][1].tensor.shape = s33;
        cases[6][1].tensor.shape = neg;
        cases[7][1].tensor.data = NULL;
        cases[8][1].tensor.ndim = 2;
        cases[8][1].tensor.shape = big;
        cases[9][1].tensor.strides = wild;
        cases[10][1].name = longname;
        cases[11][1].name = "bad\xff";
        cases[12][1].tensor.shape = NULL;
        for (size_t i = 0; i < N_ELEMS(want); i++) {
                char why[ERRSZ] = "";
                struct stat st;
                int r = st_write(fd, cases[i], 2, why, sizeof(why));

                ck_assert_msg(r == want[i].err, "case %zu: %d (%s)", i, r, why);
                ck_assert_msg(strstr(why, want[i].says), "case %zu: '%s' lacks '%s'", i, why,
                              want[i].says);
                /* Everything is checked before the first byte is written. */
                ck_assert_int_eq(fstat(fd, &st), 0);
                ck_assert_int_eq(st.st_size, 0);
        }
        ck_assert_int_eq(st_write(fd, NULL, 1, NULL, 0), -EINVAL);
        close(fd);
        /* A write error is returned as such. */
        ck_assert_int_eq(st_write(fd, cases[0], 1, NULL, 0), -EBADF);
}
END_TEST

/* ---- Python's view ------------------------------------------------------------------------ */

static const char interop_py[] =
        "import json, struct, sys\n"
        "import numpy as np\n"
        "d = sys.argv[1]\n"
        "def load(path):\n"
        "    buf = open(path, 'rb').read()\n"
        "    n = struct.unpack('<Q', buf[:8])[0]\n"
        "    assert n % 8 == 0, n\n"
        "    hdr = json.loads(buf[8:8 + n])\n"
        "    data = buf[8 + n:]\n"
        "    out, end = {}, 0\n"
        "    kinds = {'F32': '<f4', 'I16': '<i2', 'U8': 'u1', 'C64': '<c8', 'BOOL': '?'}\n"
        "    for k, v in sorted(hdr.items(), key=lambda kv: kv[1]['data_offsets']):\n"
        "        b, e = v['data_offsets']\n"
        "        assert b == end, (k, b, end)\n"
        "        end = e\n"
        "        dt = np.dtype(kinds.get(v['dtype'], 'u1'))\n"
        "        a = np.frombuffer(data[b:e], dtype=dt)\n"
        "        out[k] = a.reshape(v['shape']) if v['dtype'] in kinds else a\n"
        "    assert end == len(data)\n"
        "    return out\n"
        "t = load(d + '/ours.safetensors')\n"
        "assert (t['f'] == np.arange(6, dtype='<f4').reshape(2, 3).T).all(), t['f']\n"
        "assert t['c'].shape == () and t['c'][()] == 1 - 2j\n"
        "assert t['e'].shape == (0, 3)\n"
        "assert list(t['bf']) == [0x80, 0x3f, 0x00, 0x40]\n"
        "try:\n"
        "    from safetensors.numpy import save_file, load_file\n"
        "except ImportError:\n"
        "    save_file = None\n"
        "x = {'w': np.arange(12, dtype='<i2').reshape(3, 4), 'b': np.array([True, False]),\n"
        "     's': np.array(2.5, dtype='<f4')}\n"
        "if save_file:\n"
        "    save_file(x, d + '/theirs.safetensors', metadata={'format': 'np'})\n"
        "    assert (load_file(d + '/ours.safetensors')['f'] == t['f']).all()\n"
        "else:\n"
        "    print('safetensors (Python) not installed: only our reading of theirs is checked')\n"
        "    items, off, hdr = sorted(x.items(), key=lambda kv: (-kv[1].itemsize, kv[0])), 0, {}\n"
        "    names = {'<i2': 'I16', '|b1': 'BOOL', '<f4': 'F32'}\n"
        "    for k, v in items:\n"
        "        hdr[k] = {'dtype': names[v.dtype.str], 'shape': list(v.shape),\n"
        "                  'data_offsets': [off, off + v.nbytes]}\n"
        "        off += v.nbytes\n"
        "    h = json.dumps(hdr).encode()\n"
        "    with open(d + '/theirs.safetensors', 'wb') as f:\n"
        "        f.write(struct.pack('<Q', len(h)) + h + b''.join(v.tobytes() for k, v in "
        "items))\n";

static const char *python(void)
{
        const char *p = getenv("DLX_TEST_PYTHON");

        return p && *p ? p : "python3";
}

START_TEST(test_python_interop)
{
        float f[6] = {0, 1, 2, 3, 4, 5};
        float c[2] = {1, -2};
        uint16_t bf[2] = {0x3f80, 0x4000};
        int64_t s32[2] = {3, 2}, st_t[2] = {1, 3}, s03[2] = {0, 3}, s2[1] = {2};
        struct tfile_member m[4] = {
                member("f", f, dt(kDLFloat, 32), 2, s32, st_t, 0),
                member("c", c, dt(kDLComplex, 64), 0, NULL, NULL, 0),
                member("e", NULL, dt(kDLUInt, 8), 2, s03, NULL, 0),
                member("bf", bf, dt(kDLBfloat, 16), 1, s2, NULL, 0),
        };
        char cmd[3 * PATH_MAX];
        const struct tfile_member *w;
        struct tfile *t;
        float fv;
        int fd;

        snprintf(cmd, sizeof(cmd), "'%s' -c 'import numpy' >/dev/null 2>&1", python());
        if (system(cmd) != 0) {
                fprintf(stderr, "test_python_interop: %s with numpy not found, skipped\n",
                        python());
                return;
        }
        write_st("ours.safetensors", m, 4);
        fd = open_new("interop.py");
        put(fd, interop_py, sizeof(interop_py) - 1);
        close(fd);
        snprintf(cmd, sizeof(cmd), "'%s' '%s/interop.py' '%s'", python(), tmpdir, tmpdir);
        ck_assert_msg(system(cmd) == 0, "Python disagreed: %s", cmd);

        t = read_file("theirs.safetensors");
        ck_assert_uint_eq(t->n, 3);
        w = find(t, "w");
        ck_assert(w->tensor.ndim == 2 && w->tensor.shape[0] == 3 && w->tensor.shape[1] == 4);
        /* Another writer need not pad its header: the data may be unaligned, so memcpy. */
        for (int i = 0; i < 12; i++) {
                int16_t v;

                memcpy(&v, (const char *)w->tensor.data + 2 * i, 2);
                ck_assert_int_eq(v, i);
        }
        ck_assert_int_eq(((uint8_t *)find(t, "b")->tensor.data)[0], 1);
        memcpy(&fv, find(t, "s")->tensor.data, 4);
        ck_assert(fv == 2.5f);
        ck_assert_int_eq(find(t, "s")->tensor.ndim, 0);
        tfile_free(t);
}
END_TEST

Suite *safetensors_suite(void);

Suite *safetensors_suite(void)
{
        Suite *s = suite_create("safetensors");
        TCase *dtype_tc = tcase_create("dtypes");
        TCase *rt = tcase_create("roundtrip");
        TCase *bad = tcase_create("malformed");
        TCase *interop = tcase_create("python");

        tcase_add_test(dtype_tc, test_dtype_names);
        suite_add_tcase(s, dtype_tc);

        tcase_add_unchecked_fixture(rt, setup, teardown);
        tcase_add_test(rt, test_roundtrip_all_dtypes);
        tcase_add_test(rt, test_roundtrip_strided);
        tcase_add_test(rt, test_roundtrip_0d_and_empty);
        tcase_add_test(rt, test_header_bytes);
        tcase_add_test(rt, test_foreign_file);
        tcase_add_test(rt, test_write_refused);
        suite_add_tcase(s, rt);

        tcase_add_unchecked_fixture(bad, setup, teardown);
        tcase_add_rows(bad, test_malformed, bad_files);
        tcase_add_test(bad, test_malformed_name_length);
        tcase_add_test(bad, test_malformed_not_a_file);
        tcase_add_test(bad, test_malformed_too_many);
        /* A million-entry header takes seconds natively, much longer under valgrind. */
        tcase_set_timeout(bad, 120);
        suite_add_tcase(s, bad);

        tcase_add_unchecked_fixture(interop, setup, teardown);
        tcase_add_test(interop, test_python_interop);
        suite_add_tcase(s, interop);
        return s;
}
