/* SPDX-License-Identifier: MIT */
/*
 * client/npz: round trips of every numpy dtype, strided and Fortran-order, 0-d and empty
 * tensors and an empty set; archives made here with libzip as np.savez and
 * np.savez_compressed make them (deflated, big-endian, Fortran); one row per defect of a
 * malformed archive (built, then patched byte by byte where libzip would not write it),
 * each checking the errno, the message, and that no descriptor or mapping is left
 * behind; the writer's refusals; and, where python3 has numpy, numpy.load/np.savez.
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
#include <zip.h>

#include "npy.h"
#include "npz.h"
#include "tmpfiles.h"
#include "toolkit.h"

#define ERRSZ 256

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define OTHER '>'
#else
#define OTHER '<'
#endif

static void setup(void)
{
        tmpdir_make("npz");
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

static void write_npz(const char *name, const struct tfile_member *m, size_t n)
{
        char err[ERRSZ] = "";

        ck_assert_msg(npz_write(path_of(name), m, n, err, sizeof(err)) == 0, "npz_write: %s", err);
}

static struct tfile *read_npz(const char *name)
{
        struct tfile *t = NULL;
        char err[ERRSZ] = "";

        ck_assert_msg(npz_open(path_of(name), &t, err, sizeof(err)) == 0, "npz_open: %s", err);
        ck_assert_ptr_nonnull(t);
        return t;
}

static const struct tfile_member *find(const struct tfile *t, const char *name)
{
        for (size_t i = 0; i < t->n; i++)
                if (strcmp(t->members[i].name, name) == 0)
                        return &t->members[i];
        ck_abort_msg("no member '%s'", name);
        return NULL;
}

/* A member read back holds the same elements as the one written, whatever either's strides. */
static void check_member(const struct tfile *t, const struct tfile_member *w)
{
        const struct tfile_member *r = find(t, w->name);
        size_t isz = w->tensor.dtype.bits / 8u, bytes = numel(&w->tensor) * isz;
        uint8_t *want = malloc(bytes + 1), *got = malloc(bytes + 1);

        ck_assert(want && got);
        ck_assert_int_eq(r->tensor.dtype.code, w->tensor.dtype.code);
        ck_assert_int_eq(r->tensor.dtype.bits, w->tensor.dtype.bits);
        ck_assert_int_eq(r->tensor.ndim, w->tensor.ndim);
        for (int32_t k = 0; k < w->tensor.ndim; k++)
                ck_assert_int_eq(r->tensor.shape[k], w->tensor.shape[k]);
        ck_assert_int_eq(r->tensor.device.device_type, kDLCPU);
        ck_assert_uint_eq(r->nbytes, bytes);
        ck_assert_uint_eq((uintptr_t)r->tensor.data % 64, 0);
        if (bytes) {
                naive_gather(&w->tensor, want);
                naive_gather(&r->tensor, got);
                ck_assert_mem_eq(got, want, bytes);
        }
        free(want);
        free(got);
}

/* ---- archives made here ------------------------------------------------------------------- */

struct zentry {
        const char *name;
        const void *data;
        size_t len;
        int32_t method; /* ZIP_CM_STORE or ZIP_CM_DEFLATE */
};

static void make_zip(const char *name, const struct zentry *e, size_t n)
{
        int zerr = 0;
        zip_t *za = zip_open(path_of(name), ZIP_CREATE | ZIP_TRUNCATE, &zerr);

        ck_assert_ptr_nonnull(za);
        for (size_t i = 0; i < n; i++) {
                zip_source_t *src = zip_source_buffer(za, e[i].data, e[i].len, 0);
                zip_int64_t idx;

                ck_assert_ptr_nonnull(src);
                idx = zip_file_add(za, e[i].name, src, ZIP_FL_ENC_UTF_8);
                ck_assert_int_ge(idx, 0);
                ck_assert_int_eq(zip_set_file_compression(za, (zip_uint64_t)idx, e[i].method, 0),
                                 0);
        }
        ck_assert_int_eq(zip_close(za), 0);
}

/* The .npy npy_write_fd() makes of t, as a malloc'd buffer of *ret_len bytes. */
static void *npy_of(const DLTensor *t, size_t *ret_len)
{
        int fd = memfd_create("npy", MFD_CLOEXEC);
        off_t len;
        void *buf;

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(npy_write_fd(fd, t, NULL, 0), 0);
        len = lseek(fd, 0, SEEK_CUR);
        buf = malloc((size_t)len);
        ck_assert_ptr_nonnull(buf);
        ck_assert_int_eq(pread(fd, buf, (size_t)len, 0), len);
        close(fd);
        *ret_len = (size_t)len;
        return buf;
}

/* A format 1.0 .npy of the given dict and data, as a malloc'd buffer. */
static void *npy_raw(const char *dict, const void *data, size_t dlen, size_t *ret_len)
{
        size_t hlen = strlen(dict);
        uint8_t *buf = malloc(10 + hlen + dlen);

        ck_assert_ptr_nonnull(buf);
        memcpy(buf, "\x93NUMPY\x01\x00", 8);
        buf[8] = (uint8_t)hlen;
        buf[9] = (uint8_t)(hlen >> 8);
        memcpy(buf + 10, dict, hlen);
        memcpy(buf + 10 + hlen, data, dlen);
        *ret_len = 10 + hlen + dlen;
        return buf;
}

struct blob {
        uint8_t *p;
        size_t len;
};

/* The file tmpdir/name. */
static struct blob blob_of(const char *name)
{
        struct blob b;

        b.p = slurp(path_of(name), &b.len);
        return b;
}

static void spill(const char *name, struct blob b, size_t len)
{
        int fd = open_new(name);

        put(fd, b.p, len);
        close(fd);
        free(b.p);
}

static uint32_t get32(const uint8_t *p)
{
        return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void set16(uint8_t *p, uint16_t v)
{
        p[0] = (uint8_t)v;
        p[1] = (uint8_t)(v >> 8);
}

static void set32(uint8_t *p, uint32_t v)
{
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}

/*
 * Applies fn to the first entry's local header and central directory record alike:
 * offsets are those of the local header (the central record's are 2 further on, as its
 * "version made by" comes first). The archives here are small and not zip64.
 */
enum field { GP_FLAGS = 6, METHOD = 8, CRC = 14, CSIZE = 18, USIZE = 22 };

static void patch_first(struct blob b, enum field f, uint32_t value, bool add)
{
        uint8_t *local = b.p, *central = NULL;

        ck_assert_uint_eq(get32(local), 0x04034b50);
        for (size_t i = 0; i + 4 <= b.len; i++)
                if (get32(b.p + i) == 0x02014b50) {
                        central = b.p + i;
                        break;
                }
        ck_assert_ptr_nonnull(central);
        for (int k = 0; k < 2; k++) {
                uint8_t *p = k == 0 ? local + f : central + f + 2;

                if (f == GP_FLAGS || f == METHOD)
                        set16(p, (uint16_t)(add ? (uint16_t)(p[0] | p[1] << 8) + value : value));
                else
                        set32(p, add ? get32(p) + value : value);
        }
}

/* ---- round trips -------------------------------------------------------------------------- */

static const DLDataType np_dtypes[] = {
        {kDLBool, 8, 1},     {kDLInt, 8, 1},       {kDLInt, 16, 1},   {kDLInt, 32, 1},
        {kDLInt, 64, 1},     {kDLUInt, 8, 1},      {kDLUInt, 16, 1},  {kDLUInt, 32, 1},
        {kDLUInt, 64, 1},    {kDLFloat, 16, 1},    {kDLFloat, 32, 1}, {kDLFloat, 64, 1},
        {kDLComplex, 64, 1}, {kDLComplex, 128, 1},
};

START_TEST(test_roundtrip_all_dtypes)
{
        enum { N = N_ELEMS(np_dtypes) };
        static int64_t shape[2] = {2, 3};
        struct tfile_member m[N];
        char names[N][16];
        uint8_t data[N][6 * 16];
        struct tfile *t;

        for (size_t i = 0; i < N; i++) {
                for (size_t b = 0; b < sizeof(data[i]); b++)
                        data[i][b] = (uint8_t)(b * 7 + i + 1);
                /* Bools must be 0 or 1 for numpy; the module copies bytes either way. */
                if (np_dtypes[i].code == kDLBool)
                        for (size_t b = 0; b < sizeof(data[i]); b++)
                                data[i][b] &= 1;
                snprintf(names[i], sizeof(names[i]), "t%02zu", N - i);
                m[i] = member(names[i], data[i], np_dtypes[i], 2, shape, NULL, 0);
        }
        write_npz("all.npz", m, N);
        t = read_npz("all.npz");
        ck_assert_uint_eq(t->n, N);
        for (size_t i = 1; i < N; i++)
                ck_assert_int_lt(strcmp(t->members[i - 1].name, t->members[i].name), 0);
        for (size_t i = 0; i < N; i++) {
                check_member(t, &m[i]);
                ck_assert_ptr_null(find(t, names[i])->tensor.strides);
        }
        tfile_free(t);
        ck_assert_int_eq(count_maps("memfd:dlx-npz"), 0);
}
END_TEST

START_TEST(test_roundtrip_strided)
{
        int32_t mem[24];
        int16_t fm[6];
        int64_t s43[2] = {4, 3}, st_cols[2] = {6, 2};
        int64_t s23[2] = {2, 3}, st_f[2] = {1, 2};
        int64_t s6[1] = {6}, st_rev[1] = {-1};
        struct tfile_member m[3];
        const struct tfile_member *f;
        struct tfile *t;

        for (int i = 0; i < 24; i++)
                mem[i] = i * 3 - 20;
        /* Column-major 2x3: npy writes it as is, with fortran_order True. */
        for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++)
                        fm[i + 2 * j] = (int16_t)(10 * i + j);
        m[0] = member("cols", mem, dt(kDLInt, 32), 2, s43, st_cols, 0);
        m[1] = member("fortran", fm, dt(kDLInt, 16), 2, s23, st_f, 0);
        m[2] = member("rev", mem, dt(kDLInt, 32), 1, s6, st_rev, 5 * sizeof(int32_t));
        write_npz("strided.npz", m, 3);
        t = read_npz("strided.npz");
        for (size_t i = 0; i < 3; i++)
                check_member(t, &m[i]);
        ck_assert_ptr_null(find(t, "cols")->tensor.strides);
        /* The Fortran-order member comes back as a strided view of column-major data. */
        f = find(t, "fortran");
        ck_assert_ptr_nonnull(f->tensor.strides);
        ck_assert_int_eq(f->tensor.strides[0], 1);
        ck_assert_int_eq(f->tensor.strides[1], 2);
        ck_assert_mem_eq(f->tensor.data, fm, sizeof(fm));
        ck_assert_int_eq(((int16_t *)f->tensor.data)[1 * 1 + 2 * 2], 12);
        ck_assert_int_eq(((int32_t *)find(t, "rev")->tensor.data)[0], mem[5]);
        tfile_free(t);
}
END_TEST

START_TEST(test_roundtrip_0d_empty_none)
{
        double v = -1234.5;
        int64_t s0[1] = {0}, s203[3] = {2, 0, 3};
        struct tfile_member m[3] = {
                member("scalar", &v, dt(kDLFloat, 64), 0, NULL, NULL, 0),
                member("e1", NULL, dt(kDLFloat, 32), 1, s0, NULL, 0),
                member("dir/e3", NULL, dt(kDLComplex, 128), 3, s203, NULL, 0),
        };
        struct tfile *t;
        struct stat st;

        write_npz("small.npz", m, 3);
        t = read_npz("small.npz");
        ck_assert_uint_eq(t->n, 3);
        for (size_t i = 0; i < 3; i++)
                check_member(t, &m[i]);
        ck_assert(*(double *)find(t, "scalar")->tensor.data == -1234.5);
        ck_assert_ptr_null(find(t, "scalar")->tensor.shape);
        tfile_free(t);

        /* No arrays: an empty archive, as np.savez() with nothing writes. */
        write_npz("none.npz", NULL, 0);
        ck_assert_int_eq(stat(path_of("none.npz"), &st), 0);
        ck_assert_int_eq(st.st_size, 22);
        t = read_npz("none.npz");
        ck_assert_uint_eq(t->n, 0);
        tfile_free(t);
}
END_TEST

/* What np.savez_compressed makes: deflated entries, big-endian and Fortran arrays. */
START_TEST(test_foreign_archive)
{
        char dict[128];
        uint8_t be[12] = {0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfe, 0x12, 0x34, 0x56, 0x78};
        uint16_t fo[6] = {0, 10, 1, 11, 2, 12};
        float big[4096];
        size_t l1, l2, l3;
        void *n1, *n2, *n3;
        const struct tfile_member *m;
        struct tfile *t;
        int64_t f3[1] = {4096};

        snprintf(dict, sizeof(dict), "{'descr': '%ci4', 'fortran_order': False, 'shape': (3,), }",
                 OTHER);
        n1 = npy_raw(dict, be, sizeof(be), &l1);
        n2 = npy_raw("{'descr': '<u2', 'fortran_order': True, 'shape': (2, 3), }", fo, sizeof(fo),
                     &l2);
        for (int i = 0; i < 4096; i++)
                big[i] = (float)(i % 7);
        {
                DLTensor bt = {.data = big,
                               .device = {kDLCPU, 0},
                               .ndim = 1,
                               .dtype = dt(kDLFloat, 32),
                               .shape = f3};

                n3 = npy_of(&bt, &l3);
        }
        {
                struct zentry e[3] = {
                        {"be.npy", n1, l1, ZIP_CM_DEFLATE},
                        {"layer/fo.npy", n2, l2, ZIP_CM_DEFLATE},
                        {"big.npy", n3, l3, ZIP_CM_DEFLATE},
                };

                make_zip("foreign.npz", e, 3);
        }
        free(n1);
        free(n2);
        free(n3);
        t = read_npz("foreign.npz");
        ck_assert_int_eq(count_maps("memfd:dlx-npz"),
                         1); /* the memfd; the file is no longer mapped */
        ck_assert_uint_eq(t->n, 3);
        ck_assert_str_eq(t->members[0].name, "be");
        ck_assert_str_eq(t->members[1].name, "big");
        ck_assert_str_eq(t->members[2].name, "layer/fo");
        /* Every array's data is aligned, even where its .npy header was not padded for it. */
        for (size_t i = 0; i < t->n; i++)
                ck_assert_uint_eq((uintptr_t)t->members[i].tensor.data % 64, 0);
        m = find(t, "be");
        ck_assert_int_eq(((int32_t *)m->tensor.data)[0], 1);
        ck_assert_int_eq(((int32_t *)m->tensor.data)[1], -2);
        ck_assert_int_eq(((int32_t *)m->tensor.data)[2], 0x12345678);
        m = find(t, "layer/fo");
        ck_assert_int_eq(m->tensor.strides[0], 1);
        ck_assert_int_eq(m->tensor.strides[1], 2);
        for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++)
                        ck_assert_int_eq(((uint16_t *)m->tensor.data)[i + 2 * j], 10 * i + j);
        m = find(t, "big");
        ck_assert_mem_eq(m->tensor.data, big, sizeof(big));
        /* The data is the tfile's own, and writable: a consumer may use it in place. */
        ((float *)m->tensor.data)[0] = 42;
        tfile_free(t);
        ck_assert_int_eq(count_maps("memfd:dlx-npz"), 0);
}
END_TEST

/* ---- malformed archives ------------------------------------------------------------------- */

struct bad_npz {
        const char *what;
        int err;
        const char *says;
};

static const struct bad_npz bad_npzs[] = {
        {"empty file", -EINVAL, "empty file"},
        {"not a zip", -EINVAL, "malformed .npz"},
        {"truncated zip", -EINVAL, "malformed .npz"},
        {"entry not .npy", -EINVAL, "not named NAME.npy"},
        {"entry named .npy", -EINVAL, "not named NAME.npy"},
        {"directory entry", -EINVAL, "not named NAME.npy"},
        {"name over 255 bytes", -EINVAL, "longer than 255"},
        {"duplicate names", -EINVAL, "same name"},
        {"stored size lies", -EINVAL, "declares"},
        {"deflate bomb", -EINVAL, "more than deflate can expand"},
        {"deflated, declared short", -EINVAL, "more than its declared"},
        {"deflated, declared long", -EINVAL, "truncated"},
        {"CRC mismatch", -EINVAL, "CRC"},
        {"not a .npy", -EINVAL, "bad magic"},
        {"truncated .npy", -EINVAL, "header describes"},
        {".npy with trailing bytes", -EINVAL, "header describes"},
        {"object dtype", -ENOTSUP, "Python object"},
        {"bzip2", -ENOTSUP, "compression method 12"},
        {"encrypted", -ENOTSUP, "encrypted"},
        {"a directory", -EINVAL, "not a regular file"},
        {"missing", -ENOENT, "No such file"},
};

/* Builds row i's archive as bad.npz. */
static void build_bad(int i)
{
        static const float four[4] = {1, 2, 3, 4};
        int64_t s4[1] = {4};
        DLTensor ft = {.data = (void *)four,
                       .device = {kDLCPU, 0},
                       .ndim = 1,
                       .dtype = {kDLFloat, 32, 1},
                       .shape = s4};
        char longname[300];
        size_t len, olen;
        void *npy = npy_of(&ft, &len);
        void *obj = npy_raw("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
                            "\0\0\0\0"
                            "\0\0\0\0",
                            8, &olen);
        struct zentry one = {"a.npy", npy, len, ZIP_CM_STORE};
        struct zentry two[2] = {{"a.npy", npy, len, ZIP_CM_STORE}, {"b.npy", npy, len, 0}};
        struct blob b;
        int fd;

        switch (i) {
        case 0:
                close(open_new("bad.npz"));
                break;
        case 1:
                fd = open_new("bad.npz");
                put(fd, "this is not a zip archive, not at all", 37);
                close(fd);
                break;
        case 2:
                make_zip("bad.npz", &one, 1);
                b = blob_of("bad.npz");
                spill("bad.npz", b, b.len - 10);
                break;
        case 3:
        case 4:
        case 5:
                one.name = i == 3 ? "a.txt" : i == 4 ? ".npy" : "d/";
                make_zip("bad.npz", &one, 1);
                break;
        case 6:
                memset(longname, 'n', 256);
                strcpy(longname + 256, ".npy");
                one.name = longname;
                make_zip("bad.npz", &one, 1);
                break;
        case 7:
                /* libzip will not write two entries of one name: rename b.npy in place. */
                make_zip("bad.npz", two, 2);
                b = blob_of("bad.npz");
                for (size_t k = 0; k + 5 <= b.len; k++)
                        if (memcmp(b.p + k, "b.npy", 5) == 0)
                                b.p[k] = 'a';
                spill("bad.npz", b, b.len);
                break;
        case 8:
        case 9:
        case 10:
        case 11:
                one.method = i == 8 ? ZIP_CM_STORE : ZIP_CM_DEFLATE;
                make_zip("bad.npz", &one, 1);
                b = blob_of("bad.npz");
                if (i == 9)
                        patch_first(b, USIZE, 0x7fffffff, false);
                else
                        patch_first(b, USIZE, i == 10 ? (uint32_t)-1 : 1, true);
                spill("bad.npz", b, b.len);
                break;
        case 12:
                make_zip("bad.npz", &one, 1);
                b = blob_of("bad.npz");
                /* The last data byte: after the local header, its name and extra field. */
                b.p[30 + (b.p[26] | b.p[27] << 8) + (b.p[28] | b.p[29] << 8) + len - 1] ^= 0x40;
                spill("bad.npz", b, b.len);
                break;
        case 13:
                ((char *)npy)[1] = 'X';
                make_zip("bad.npz", &one, 1);
                break;
        case 14:
        case 15:
                one.len = i == 14 ? len - 1 : len;
                if (i == 15) {
                        one.data = realloc(npy, len + 3);
                        ck_assert_ptr_nonnull(one.data);
                        npy = (void *)one.data;
                        memset((char *)npy + len, 0, 3);
                        one.len = len + 3;
                }
                make_zip("bad.npz", &one, 1);
                break;
        case 16:
                one.data = obj;
                one.len = olen;
                make_zip("bad.npz", &one, 1);
                break;
        case 17:
        case 18:
                make_zip("bad.npz", &one, 1);
                b = blob_of("bad.npz");
                if (i == 17)
                        patch_first(b, METHOD, 12, false);
                else
                        patch_first(b, GP_FLAGS, 1, true);
                spill("bad.npz", b, b.len);
                break;
        case 19:
                ck_assert_int_eq(mkdir(path_of("bad.npz"), 0700), 0);
                break;
        default:
                break;
        }
        free(npy);
        free(obj);
}

START_TEST(test_malformed)
{
        const struct bad_npz *row = &bad_npzs[_i];
        const char *path = path_of(_i == 20 ? "missing.npz" : "bad.npz");
        struct tfile *t = (struct tfile *)0x1;
        char why[ERRSZ] = "";
        int fds, maps, r;

        if (unlink(path_of("bad.npz")) < 0)
                rmdir(path_of("bad.npz"));
        build_bad(_i);
        fds = count_fds(0);
        maps = count_maps("memfd:dlx-npz");
        r = npz_open(path, &t, why, sizeof(why));
        ck_assert_msg(r == row->err, "%s: %d, expected %d (%s)", row->what, r, row->err, why);
        ck_assert_msg(strstr(why, row->says), "%s: '%s' lacks '%s'", row->what, why, row->says);
        ck_assert_ptr_eq(t, (struct tfile *)0x1);
        ck_assert_int_eq(count_fds(0), fds);
        ck_assert_int_eq(count_maps("memfd:dlx-npz"), maps);
}
END_TEST

/* ---- the writer's refusals ---------------------------------------------------------------- */

START_TEST(test_write_refused)
{
        float f[2] = {1, 2};
        uint16_t bf[2] = {0};
        int64_t s2[1] = {2}, neg[1] = {-2};
        static const struct {
                int err;
                const char *says;
        } want[] = {
                {-ENOTSUP, "no numpy equivalent"},
                {-ENOTSUP, "no numpy equivalent"},
                {-EINVAL, "two tensors"},
                {-EINVAL, "empty"},
                {-EINVAL, "UTF-8"},
                {-EINVAL, "device memory"},
                {-EINVAL, "negative"},
        };
        struct tfile_member cases[N_ELEMS(want)][2];
        struct blob before, after;
        int fd = open_new("keep.npz");
        char why[ERRSZ];

        put(fd, "precious", 8);
        close(fd);
        for (size_t i = 0; i < N_ELEMS(want); i++) {
                cases[i][0] = member("ok", f, dt(kDLFloat, 32), 1, s2, NULL, 0);
                cases[i][1] = member("x", f, dt(kDLFloat, 32), 1, s2, NULL, 0);
        }
        cases[0][1] = member("bf", bf, dt(kDLBfloat, 16), 1, s2, NULL, 0);
        cases[1][1].tensor.dtype = dt(kDLFloat8_e4m3fn, 8);
        cases[2][1].name = "ok";
        cases[3][1].name = "";
        cases[4][1].name = "\xc0\xaf";
        cases[5][1].tensor.device.device_type = kDLCUDA;
        cases[6][1].tensor.shape = neg;
        before = blob_of("keep.npz");
        for (size_t i = 0; i < N_ELEMS(want); i++) {
                int r;

                why[0] = '\0';
                r = npz_write(path_of("keep.npz"), cases[i], 2, why, sizeof(why));
                ck_assert_msg(r == want[i].err, "case %zu: %d (%s)", i, r, why);
                ck_assert_msg(strstr(why, want[i].says), "case %zu: '%s' lacks '%s'", i, why,
                              want[i].says);
                /* A refused write leaves the file as it was. */
                after = blob_of("keep.npz");
                ck_assert_uint_eq(after.len, before.len);
                ck_assert_mem_eq(after.p, before.p, before.len);
                free(after.p);
        }
        free(before.p);
        ck_assert_int_eq(npz_write(NULL, cases[0], 1, NULL, 0), -EINVAL);
        ck_assert_int_eq(npz_write(path_of("keep.npz"), NULL, 1, NULL, 0), -EINVAL);
        /* Where the archive cannot be created, the system's errno comes back. */
        ck_assert_int_eq(npz_write(path_of("no/such/dir.npz"), cases[0] + 0, 1, why, sizeof(why)),
                         -ENOENT);
}
END_TEST

/* ---- numpy's view ------------------------------------------------------------------------- */

static const char interop_py[] =
        "import sys\n"
        "import numpy as np\n"
        "d = sys.argv[1]\n"
        "z = np.load(d + '/ours.npz')\n"
        "assert sorted(z.files) == ['c', 'e', 'f', 'g/s'], z.files\n"
        "assert (z['f'] == np.arange(6, dtype='<f4').reshape(2, 3).T).all(), z['f']\n"
        "assert z['c'].dtype == np.complex128 and z['c'][()] == 1 - 2j\n"
        "assert z['e'].shape == (0, 3) and z['e'].dtype == np.uint8\n"
        "assert z['g/s'].shape == () and z['g/s'][()] == True\n"
        "a = {'be': np.arange(-2, 3, dtype='>i4'), 'fo': np.asfortranarray(\n"
        "     np.arange(6, dtype='<u2').reshape(2, 3)), 'h': np.array([1.5, -2], dtype='<f2'),\n"
        "     'z': np.zeros((0, 2)), 's': np.float64(7.5), 'b': np.array([True, False])}\n"
        "np.savez(d + '/theirs.npz', **a)\n"
        "np.savez_compressed(d + '/theirs-z.npz', **a)\n";

static const char *python(void)
{
        const char *p = getenv("DLX_TEST_PYTHON");

        return p && *p ? p : "python3";
}

static void check_theirs(const char *name)
{
        struct tfile *t = read_npz(name);
        const struct tfile_member *m;

        ck_assert_uint_eq(t->n, 6);
        m = find(t, "be");
        for (int i = 0; i < 5; i++)
                ck_assert_int_eq(((int32_t *)m->tensor.data)[i], i - 2);
        m = find(t, "fo");
        ck_assert_ptr_nonnull(m->tensor.strides);
        for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++)
                        ck_assert_int_eq(((uint16_t *)m->tensor.data)[i * m->tensor.strides[0] +
                                                                      j * m->tensor.strides[1]],
                                         3 * i + j);
        m = find(t, "h");
        ck_assert_int_eq(((uint16_t *)m->tensor.data)[0], 0x3e00);
        ck_assert_int_eq(((uint16_t *)m->tensor.data)[1], 0xc000);
        m = find(t, "z");
        ck_assert(m->tensor.ndim == 2 && m->tensor.shape[0] == 0 && m->nbytes == 0);
        m = find(t, "s");
        ck_assert(m->tensor.ndim == 0 && *(double *)m->tensor.data == 7.5);
        m = find(t, "b");
        ck_assert(m->tensor.dtype.code == kDLBool && ((uint8_t *)m->tensor.data)[0] == 1);
        tfile_free(t);
}

START_TEST(test_numpy_interop)
{
        float f[6] = {0, 1, 2, 3, 4, 5};
        double c[2] = {1, -2};
        uint8_t s = 1;
        int64_t s32[2] = {3, 2}, st_t[2] = {1, 3}, s03[2] = {0, 3};
        struct tfile_member m[4] = {
                member("f", f, dt(kDLFloat, 32), 2, s32, st_t, 0),
                member("c", c, dt(kDLComplex, 128), 0, NULL, NULL, 0),
                member("e", NULL, dt(kDLUInt, 8), 2, s03, NULL, 0),
                member("g/s", &s, dt(kDLBool, 8), 0, NULL, NULL, 0),
        };
        char cmd[3 * PATH_MAX];
        int fd;

        snprintf(cmd, sizeof(cmd), "'%s' -c 'import numpy' >/dev/null 2>&1", python());
        if (system(cmd) != 0) {
                fprintf(stderr, "test_numpy_interop: %s with numpy not found, skipped\n", python());
                return;
        }
        write_npz("ours.npz", m, 4);
        fd = open_new("interop.py");
        put(fd, interop_py, sizeof(interop_py) - 1);
        close(fd);
        snprintf(cmd, sizeof(cmd), "'%s' '%s/interop.py' '%s'", python(), tmpdir, tmpdir);
        ck_assert_msg(system(cmd) == 0, "numpy disagreed: %s", cmd);
        check_theirs("theirs.npz");
        check_theirs("theirs-z.npz");
}
END_TEST

Suite *npz_suite(void);

Suite *npz_suite(void)
{
        Suite *s = suite_create("npz");
        TCase *rt = tcase_create("roundtrip");
        TCase *bad = tcase_create("malformed");
        TCase *interop = tcase_create("numpy");

        tcase_add_unchecked_fixture(rt, setup, teardown);
        tcase_add_test(rt, test_roundtrip_all_dtypes);
        tcase_add_test(rt, test_roundtrip_strided);
        tcase_add_test(rt, test_roundtrip_0d_empty_none);
        tcase_add_test(rt, test_foreign_archive);
        tcase_add_test(rt, test_write_refused);
        suite_add_tcase(s, rt);

        tcase_add_unchecked_fixture(bad, setup, teardown);
        tcase_add_rows(bad, test_malformed, bad_npzs);
        suite_add_tcase(s, bad);

        tcase_add_unchecked_fixture(interop, setup, teardown);
        tcase_add_test(interop, test_numpy_interop);
        suite_add_tcase(s, interop);
        return s;
}
