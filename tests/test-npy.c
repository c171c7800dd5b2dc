/* SPDX-License-Identifier: MIT */
/*
 * client/npy: header parser, dtype mapping, byte swapping and the writer's three
 * layouts (straight, Fortran, gathered), through real files in a mkdtemp directory.
 * Expected bytes are computed independently of the module (flat-index arithmetic,
 * hand-written big-endian bytes), so a wrong layout or swap shows up as a mismatch.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2 */
#endif
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npy.h"
#include "tmpfiles.h"
#include "toolkit.h"

#define ERRSZ 256

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST '<'
#define OTHER '>'
#else
#define HOST '>'
#define OTHER '<'
#endif

static void setup(void)
{
        tmpdir_make("npy");
}

static void teardown(void)
{
        tmpdir_remove();
}

static void get(int fd, void *buf, size_t n)
{
        ck_assert_int_eq(read(fd, buf, n), (ssize_t)n);
}

static off_t file_size(int fd)
{
        struct stat st;

        ck_assert_int_eq(fstat(fd, &st), 0);
        return st.st_size;
}

/* A file holding exactly the given preamble version, header text and data; fd at 0. */
static int raw_file(const char *name, uint8_t major, uint8_t minor, const char *hdr, size_t hlen,
                    const void *data, size_t dlen)
{
        uint8_t pre[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', major, minor};
        size_t n = 10;
        int fd = open_new(name);

        pre[8] = (uint8_t)hlen;
        pre[9] = (uint8_t)(hlen >> 8);
        if (major != 1) {
                pre[10] = (uint8_t)(hlen >> 16);
                pre[11] = (uint8_t)(hlen >> 24);
                n = 12;
        }
        put(fd, pre, n);
        put(fd, hdr, hlen);
        if (dlen)
                put(fd, data, dlen);
        ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
        return fd;
}

static int parse(const char *dict, struct npy_info *info, char *err)
{
        err[0] = '\0';
        return npy_parse_header(dict, strlen(dict), info, err, ERRSZ);
}

static DLDataType dt(uint8_t code, uint8_t bits, uint16_t lanes)
{
        DLDataType d = {code, bits, lanes};
        return d;
}

/*
 * Writes t, reads it back, checks the header against t and the data against expect
 * (expect_len bytes, in file order), and that nothing follows the data.
 */
static void check_roundtrip(const char *name, const DLTensor *t, bool expect_fortran,
                            const void *expect, size_t expect_len)
{
        char err[ERRSZ] = "";
        struct npy_info info;
        int fd = open_new(name);
        uint8_t *back = malloc(expect_len + 1);
        char extra;

        ck_assert_ptr_nonnull(back);
        ck_assert_msg(npy_write_fd(fd, t, err, sizeof(err)) == 0, "write: %s", err);
        ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
        ck_assert_msg(npy_read_header(fd, &info, err, sizeof(err)) == 0, "read: %s", err);
        ck_assert_int_eq(info.dtype.code, t->dtype.code);
        ck_assert_int_eq(info.dtype.bits, t->dtype.bits);
        ck_assert_int_eq(info.dtype.lanes, 1);
        ck_assert_int_eq(info.ndim, t->ndim);
        for (int32_t k = 0; k < t->ndim; k++)
                ck_assert_int_eq(info.shape[k], t->shape[k]);
        ck_assert(info.fortran_order == expect_fortran);
        ck_assert(!info.swap_bytes);
        ck_assert_uint_eq(info.data_offset % 64, 0);
        ck_assert_uint_eq(info.data_bytes, expect_len);
        ck_assert_int_eq(lseek(fd, 0, SEEK_CUR), (off_t)info.data_offset);
        ck_assert_int_eq(file_size(fd), (off_t)(info.data_offset + info.data_bytes));
        if (expect_len)
                get(fd, back, expect_len);
        ck_assert_int_eq(read(fd, &extra, 1), 0);
        if (expect_len)
                ck_assert_mem_eq(back, expect, expect_len);
        free(back);
        close(fd);
}

/* ---- dtype mapping ---------------------------------------------------------------------- */

struct dtype_case {
        DLDataType dtype;
        const char *descr; /* with '@' for the host byte order */
};

static const struct dtype_case supported[] = {
        {{kDLBool, 8, 1}, "|b1"},     {{kDLInt, 8, 1}, "|i1"},        {{kDLInt, 16, 1}, "@i2"},
        {{kDLInt, 32, 1}, "@i4"},     {{kDLInt, 64, 1}, "@i8"},       {{kDLUInt, 8, 1}, "|u1"},
        {{kDLUInt, 16, 1}, "@u2"},    {{kDLUInt, 32, 1}, "@u4"},      {{kDLUInt, 64, 1}, "@u8"},
        {{kDLFloat, 16, 1}, "@f2"},   {{kDLFloat, 32, 1}, "@f4"},     {{kDLFloat, 64, 1}, "@f8"},
        {{kDLComplex, 64, 1}, "@c8"}, {{kDLComplex, 128, 1}, "@c16"},
};

#define N_SUPPORTED (N_ELEMS(supported))

static void host_descr(const char *pattern, char *out)
{
        strcpy(out, pattern);
        if (out[0] == '@')
                out[0] = HOST;
}

START_TEST(test_descr_supported)
{
        for (size_t i = 0; i < N_SUPPORTED; i++) {
                char want[NPY_DESCR_MAX], buf[NPY_DESCR_MAX];
                DLDataType back;
                bool swap = true;

                host_descr(supported[i].descr, want);
                ck_assert_int_eq(npy_descr(supported[i].dtype, buf, sizeof(buf)), 0);
                ck_assert_str_eq(buf, want);
                ck_assert_int_eq(npy_dtype_from_descr(buf, &back, &swap), 0);
                ck_assert_int_eq(back.code, supported[i].dtype.code);
                ck_assert_int_eq(back.bits, supported[i].dtype.bits);
                ck_assert_int_eq(back.lanes, 1);
                ck_assert(!swap);
        }
}
END_TEST

START_TEST(test_descr_unsupported)
{
        static const DLDataType bad[] = {
                {kDLBfloat, 16, 1},       {kDLFloat8_e4m3fn, 8, 1}, {kDLFloat8_e5m2, 8, 1},
                {kDLFloat4_e2m1fn, 4, 1}, {kDLFloat6_e2m3fn, 6, 1}, {kDLInt, 4, 1},
                {kDLBool, 1, 1},          {kDLFloat, 32, 4},        {kDLInt, 8, 2},
                {kDLInt, 128, 1},         {kDLFloat, 128, 1},       {kDLFloat, 80, 1},
                {kDLComplex, 32, 1},      {kDLOpaqueHandle, 64, 1}, {99, 32, 1},
        };
        char buf[NPY_DESCR_MAX] = "x";

        for (size_t i = 0; i < N_ELEMS(bad); i++) {
                ck_assert_int_eq(npy_descr(bad[i], buf, sizeof(buf)), -ENOTSUP);
                ck_assert_str_eq(buf, "x");
        }
        /* "<c16" needs 5 bytes: 4 is too small and must leave buf alone. */
        ck_assert_int_eq(npy_descr(dt(kDLComplex, 128, 1), buf, 4), -ERANGE);
        ck_assert_str_eq(buf, "x");
        ck_assert_int_eq(npy_descr(dt(kDLComplex, 128, 1), buf, 5), 0);
        ck_assert_int_eq(npy_descr(dt(kDLFloat, 32, 1), NULL, 8), -EINVAL);
}
END_TEST

START_TEST(test_dtype_from_descr)
{
        static const struct {
                const char *descr;
                uint8_t code, bits;
                bool swap;
        } good[] = {
                {"=f8", kDLFloat, 64, false},  {"|f4", kDLFloat, 32, false},
                {"f4", kDLFloat, 32, false},   {">i1", kDLInt, 8, false},
                {"<u1", kDLUInt, 8, false},    {"|b1", kDLBool, 8, false},
                {"@i4", kDLInt, 32, false}, /* placeholder: host order, filled below */
                {"!i4", kDLInt, 32, true},  /* placeholder: other order */
                {"!c8", kDLComplex, 64, true}, {"!f2", kDLFloat, 16, true},
        };
        static const char *const bad[] = {"",     "<",    "<f",    "<f04", "<f4x", "<f3",
                                          "<i16", "<b2",  "<u3",   "f4<",  "<<f4", "<f0",
                                          "<c4",  "<f4 ", "<f999", "<F4",  "<q8",  "?"};
        DLDataType d = {7, 7, 7};
        bool swap = true;

        for (size_t i = 0; i < N_ELEMS(good); i++) {
                char descr[16];

                strcpy(descr, good[i].descr);
                if (descr[0] == '@')
                        descr[0] = HOST;
                else if (descr[0] == '!')
                        descr[0] = OTHER;
                ck_assert_msg(npy_dtype_from_descr(descr, &d, &swap) == 0, "%s", descr);
                ck_assert_int_eq(d.code, good[i].code);
                ck_assert_int_eq(d.bits, good[i].bits);
                ck_assert_int_eq(d.lanes, 1);
                ck_assert_msg(swap == good[i].swap, "%s", descr);
        }
        d = dt(7, 7, 7);
        swap = true;
        for (size_t i = 0; i < N_ELEMS(bad); i++) {
                ck_assert_msg(npy_dtype_from_descr(bad[i], &d, &swap) == -ENOTSUP, "'%s'", bad[i]);
                ck_assert(d.code == 7 && d.bits == 7 && d.lanes == 7 && swap);
        }
}
END_TEST

/* ---- round trips ------------------------------------------------------------------------ */

START_TEST(test_roundtrip_all_dtypes)
{
        int64_t shape[2] = {2, 3};

        for (size_t i = 0; i < N_SUPPORTED; i++) {
                size_t isz = supported[i].dtype.bits / 8u, n = 6 * isz;
                uint8_t data[6 * 16];
                char name[32];
                DLTensor t = host_tensor(data, supported[i].dtype, 2, shape, NULL, 0);

                for (size_t b = 0; b < n; b++)
                        data[b] = (uint8_t)(b * 7 + i + 1);
                snprintf(name, sizeof(name), "all-%zu.npy", i);
                check_roundtrip(name, &t, false, data, n);
        }
}
END_TEST

START_TEST(test_roundtrip_0d)
{
        double v = -1234.5;
        DLTensor t = host_tensor(&v, dt(kDLFloat, 64, 1), 0, NULL, NULL, 0);
        char hdr[128] = "";
        int fd;

        uint8_t flag = 1;
        DLTensor tb = host_tensor(&flag, dt(kDLBool, 8, 1), 0, NULL, NULL, 0);

        check_roundtrip("scalar.npy", &t, false, &v, sizeof(v));
        /* A single byte of data is still data. */
        check_roundtrip("scalar-b1.npy", &tb, false, &flag, 1);
        fd = open(path_of("scalar.npy"), O_RDONLY | O_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        get(fd, hdr, 127);
        ck_assert_ptr_nonnull(strstr(hdr + 10, "'shape': (), }"));
        close(fd);
}
END_TEST

START_TEST(test_roundtrip_empty)
{
        int64_t s1[1] = {0}, s3[3] = {2, 0, 3}, huge[2] = {INT64_C(1) << 40, 0};
        /* Strides are irrelevant for an empty tensor, even wild ones, and data may be NULL. */
        int64_t wild[2] = {INT64_MAX, -5};
        DLTensor a = host_tensor(NULL, dt(kDLFloat, 32, 1), 1, s1, NULL, 0);
        DLTensor b = host_tensor(NULL, dt(kDLComplex, 128, 1), 3, s3, NULL, 0);
        DLTensor c = host_tensor(NULL, dt(kDLUInt, 8, 1), 2, huge, wild, 0);

        check_roundtrip("e1.npy", &a, false, "", 0);
        check_roundtrip("e3.npy", &b, false, "", 0);
        check_roundtrip("e-huge.npy", &c, false, "", 0);
}
END_TEST

START_TEST(test_write_fortran)
{
        /* Column-major 2x3: logical a[i][j] = 10 * i + j lives at mem[i + 2 * j]. */
        int16_t mem[6];
        int64_t shape[2] = {2, 3}, strides[2] = {1, 2}, back_strides[NPY_MAX_NDIM];
        DLTensor t = host_tensor(mem, dt(kDLInt, 16, 1), 2, shape, strides, 0);
        struct npy_info info;
        char err[ERRSZ];
        int fd;

        for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++)
                        mem[i + 2 * j] = (int16_t)(10 * i + j);
        check_roundtrip("fortran.npy", &t, true, mem, sizeof(mem));

        fd = open(path_of("fortran.npy"), O_RDONLY | O_CLOEXEC);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), 0);
        npy_strides(&info, back_strides);
        ck_assert_int_eq(back_strides[0], 1);
        ck_assert_int_eq(back_strides[1], 2);
        close(fd);
        info.fortran_order = false;
        npy_strides(&info, back_strides);
        ck_assert_int_eq(back_strides[0], 3);
        ck_assert_int_eq(back_strides[1], 1);
}
END_TEST

START_TEST(test_write_unit_dims_stay_c_order)
{
        /* A dimension of 1 is never stepped over, so its stride must not force a gather. */
        float mem[5] = {1, 2, 3, 4, 5};
        int64_t s15[2] = {1, 5}, st15[2] = {99, 1}, s51[2] = {5, 1}, st51[2] = {1, -7};
        DLTensor a = host_tensor(mem, dt(kDLFloat, 32, 1), 2, s15, st15, 0);
        DLTensor b = host_tensor(mem, dt(kDLFloat, 32, 1), 2, s51, st51, 0);

        /* Column-major 2x1x3 whose middle stride is junk: still Fortran, written straight. */
        int16_t fm[6] = {1, 2, 3, 4, 5, 6};
        int64_t s213[3] = {2, 1, 3}, st213[3] = {1, 99, 2};
        DLTensor c = host_tensor(fm, dt(kDLInt, 16, 1), 3, s213, st213, 0);

        check_roundtrip("u15.npy", &a, false, mem, sizeof(mem));
        check_roundtrip("u51.npy", &b, false, mem, sizeof(mem));
        check_roundtrip("u213.npy", &c, true, fm, sizeof(fm));
}
END_TEST

START_TEST(test_write_gather_columns)
{
        /* Every other column of a 4x6 int32 matrix: element path (inner stride 2). */
        int32_t mem[24], want[12];
        int64_t shape[2] = {4, 3}, strides[2] = {6, 2};
        DLTensor t = host_tensor(mem, dt(kDLInt, 32, 1), 2, shape, strides, 0);

        for (int i = 0; i < 24; i++)
                mem[i] = i * 3 - 20;
        naive_gather(&t, want);
        ck_assert_int_eq(want[4], mem[8]); /* a[1][1] = mem[6 + 2] */
        check_roundtrip("cols.npy", &t, false, want, sizeof(want));
}
END_TEST

START_TEST(test_write_gather_rows)
{
        /* Rows 0, 2, 4 of a 6x5 matrix: unit inner stride, copied a row at a time. */
        uint16_t mem[30], want[15];
        int64_t shape[2] = {3, 5}, strides[2] = {10, 1};
        DLTensor t = host_tensor(mem, dt(kDLUInt, 16, 1), 2, shape, strides, 0);

        for (int i = 0; i < 30; i++)
                mem[i] = (uint16_t)(1000 + i);
        naive_gather(&t, want);
        ck_assert_int_eq(want[5], 1010);
        check_roundtrip("rows.npy", &t, false, want, sizeof(want));
}
END_TEST

START_TEST(test_write_negative_strides)
{
        /* A 2x3 view reversed on both axes: byte_offset points at the last element. */
        int64_t mem[6] = {1, 2, 3, 4, 5, 6}, want[6] = {6, 5, 4, 3, 2, 1};
        int64_t shape[2] = {2, 3}, strides[2] = {-3, -1};
        DLTensor t = host_tensor(mem, dt(kDLInt, 64, 1), 2, shape, strides, 5 * sizeof(int64_t));
        /* Transposed and reversed rows: a[i][j] = mem[(2 - j) * 2 + i] of a 3x2 buffer. */
        int64_t shape2[2] = {2, 3}, strides2[2] = {1, -2}, want2[6] = {5, 3, 1, 6, 4, 2};
        DLTensor t2 = host_tensor(mem, dt(kDLInt, 64, 1), 2, shape2, strides2, 4 * sizeof(int64_t));
        int64_t check[6];

        check_roundtrip("neg.npy", &t, false, want, sizeof(want));
        naive_gather(&t2, check);
        ck_assert_mem_eq(check, want2, sizeof(want2));
        check_roundtrip("neg2.npy", &t2, false, want2, sizeof(want2));
}
END_TEST

START_TEST(test_write_byte_offset)
{
        /* Contiguous data after 3 bytes of something else: written straight from the offset. */
        uint8_t mem[3 + 8] = {0xee, 0xee, 0xee, 1, 2, 3, 4, 5, 6, 7, 8};
        int64_t shape[1] = {4};
        DLTensor t = host_tensor(mem, dt(kDLUInt, 16, 1), 1, shape, NULL, 3);
        int64_t strides[1] = {1};
        DLTensor t2 = host_tensor(mem, dt(kDLUInt, 16, 1), 1, shape, strides, 3);

        check_roundtrip("off.npy", &t, false, mem + 3, 8);
        check_roundtrip("off2.npy", &t2, false, mem + 3, 8);
}
END_TEST

START_TEST(test_write_broadcast)
{
        /* Zero strides repeat data: on the outer axis (row path) and the inner one. */
        float row[4] = {1, 2, 3, 4}, col[3] = {7, 8, 9};
        float want_a[12], want_b[12];
        int64_t shape[2] = {3, 4}, sa[2] = {0, 1}, sb[2] = {1, 0};
        DLTensor a = host_tensor(row, dt(kDLFloat, 32, 1), 2, shape, sa, 0);
        DLTensor b = host_tensor(col, dt(kDLFloat, 32, 1), 2, shape, sb, 0);

        for (int i = 0; i < 3; i++)
                for (int j = 0; j < 4; j++) {
                        want_a[i * 4 + j] = row[j];
                        want_b[i * 4 + j] = col[i];
                }
        check_roundtrip("bcast-a.npy", &a, false, want_a, sizeof(want_a));
        check_roundtrip("bcast-b.npy", &b, false, want_b, sizeof(want_b));
}
END_TEST

START_TEST(test_write_gather_large)
{
        /*
         * Rows larger than the 64 KiB gather buffer (written straight from the source), then
         * a 3-d element-wise gather that refills the buffer many times.
         */
        enum { R = 3, C = 20000, A = 40, B = 50, D = 30 };
        double *mem = malloc(sizeof(double) * R * 2 * C);
        int32_t *m3 = malloc(sizeof(int32_t) * A * B * D * 2);
        double *want = malloc(sizeof(double) * R * C);
        int32_t *want3 = malloc(sizeof(int32_t) * A * B * D);
        int64_t shape[2] = {R, C}, strides[2] = {2 * C, 1};
        int64_t shape3[3] = {A, B, D}, strides3[3] = {1, A, 2 * A * B};
        DLTensor t, t3;

        ck_assert(mem && m3 && want && want3);
        for (size_t i = 0; i < (size_t)R * 2 * C; i++)
                mem[i] = (double)i * 0.5;
        for (size_t i = 0; i < (size_t)A * B * D * 2; i++)
                m3[i] = (int32_t)(i * 2654435761u);
        t = host_tensor(mem, dt(kDLFloat, 64, 1), 2, shape, strides, 0);
        t3 = host_tensor(m3, dt(kDLInt, 32, 1), 3, shape3, strides3, 0);
        naive_gather(&t, want);
        naive_gather(&t3, want3);
        check_roundtrip("big-rows.npy", &t, false, want, sizeof(double) * R * C);
        check_roundtrip("big-3d.npy", &t3, false, want3, sizeof(int32_t) * A * B * D);
        free(mem);
        free(m3);
        free(want);
        free(want3);
}
END_TEST

START_TEST(test_write_header_layout)
{
        static const char dict[] = "{'descr': '@f4', 'fortran_order': False, 'shape': (5,), }";
        float v[5] = {0};
        int64_t shape[1] = {5};
        DLTensor t = host_tensor(v, dt(kDLFloat, 32, 1), 1, shape, NULL, 0);
        char want[sizeof(dict)], buf[128];
        int fd = open_new("layout.npy");
        size_t hlen;

        ck_assert_int_eq(npy_write_fd(fd, &t, NULL, 0), 0);
        ck_assert_int_eq(pread(fd, buf, sizeof(buf), 0), sizeof(buf));
        ck_assert_mem_eq(buf, "\x93NUMPY\x01\x00", 8);
        hlen = (uint8_t)buf[8] | (size_t)(uint8_t)buf[9] << 8;
        ck_assert_uint_eq((10 + hlen) % 64, 0);
        ck_assert_uint_eq(10 + hlen, 128); /* 57-byte dict: numpy pads it to 128 as well */
        strcpy(want, dict);
        want[11] = HOST;
        ck_assert_mem_eq(buf + 10, want, strlen(want));
        for (size_t i = 10 + strlen(want); i < 127; i++)
                ck_assert_int_eq(buf[i], ' ');
        ck_assert_int_eq(buf[127], '\n');
        ck_assert_int_eq(file_size(fd), 128 + 20);
        close(fd);
}
END_TEST

/* ---- header parsing --------------------------------------------------------------------- */

START_TEST(test_parse_tolerant)
{
        static const struct {
                const char *dict;
                int32_t ndim;
                int64_t shape[4];
                bool fortran;
                uint64_t bytes;
        } ok[] = {
                {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 2, {2, 3}, 0, 24},
                {"{'shape': (2, 3), 'fortran_order': True, 'descr': '<f4'}", 2, {2, 3}, 1, 24},
                {"{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(2,3)}", 2, {2, 3}, 0, 24},
                {" \t{ 'descr' : '<f4' ,\n 'fortran_order' : False ,\r\n 'shape' : ( 2 , 3 , ) "
                 ", } \n   \n",
                 2,
                 {2, 3},
                 0,
                 24},
                {"{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }", 1, {5}, 0, 40},
                {"{'descr': '<i8', 'fortran_order': False, 'shape': ( 5 , ), }", 1, {5}, 0, 40},
                {"{'descr': '<c16', 'fortran_order': False, 'shape': (), }", 0, {0}, 0, 16},
                {"{'descr': '<c16', 'fortran_order': False, 'shape': ( ), }", 0, {0}, 0, 16},
                {"{'descr': '|u1', 'fortran_order': False, 'shape': (3L, 4L), }", 2, {3, 4}, 0, 12},
                {"{'descr': '|u1', 'fortran_order': False, 'shape': (1_000,), }",
                 1,
                 {1000},
                 0,
                 1000},
                {"{'descr': '|u1', 'fortran_order': False, 'shape': (+4, 0, 00, -0)}",
                 4,
                 {4, 0, 0, 0},
                 0,
                 0},
                {"{'descr': '|b1', 'fortran_order': True, 'shape': (1, 1, 9223372036854775807)}",
                 3,
                 {1, 1, INT64_MAX},
                 1,
                 (uint64_t)INT64_MAX},
        };

        for (size_t i = 0; i < N_ELEMS(ok); i++) {
                struct npy_info info;
                char err[ERRSZ];

                ck_assert_msg(parse(ok[i].dict, &info, err) == 0, "%s: %s", ok[i].dict, err);
                ck_assert_int_eq(info.ndim, ok[i].ndim);
                for (int32_t k = 0; k < ok[i].ndim; k++)
                        ck_assert_int_eq(info.shape[k], ok[i].shape[k]);
                ck_assert(info.fortran_order == ok[i].fortran);
                ck_assert_uint_eq(info.data_bytes, ok[i].bytes);
                ck_assert_uint_eq(info.data_offset, 0);
        }
}
END_TEST

START_TEST(test_parse_malformed)
{
#define D(s)                                                                                       \
        {                                                                                          \
                s, sizeof(s) - 1                                                                   \
        }
        static const struct {
                const char *text;
                size_t len;
        } bad[] = {
                D(""),
                D("   "),
                D("{"),
                D("}"),
                D("[]"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }x"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\0"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)"),
                D("{'descr': '<f4', 'fortran_order': False}"),
                D("{'descr': '<f4', 'shape': ()}"),
                D("{'fortran_order': False, 'shape': ()}"),
                D("{}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}"),
                D("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}"),
                D("{'descr': '<f4', 'fortran_order': False, 'fortran_order': False, 'shape': ()}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (), \"shape\": ()}"),
                D("{'descr': '<f4' 'fortran_order': False, 'shape': ()}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (), ,}"),
                D("{,'descr': '<f4', 'fortran_order': False, 'shape': ()}"),
                D("{'descr' '<f4', 'fortran_order': False, 'shape': ()}"),
                D("{'descr': '<f4', 'fortran_order': 0, 'shape': ()}"),
                D("{'descr': '<f4', 'fortran_order': false, 'shape': ()}"),
                D("{'descr': '<f4', 'fortran_order': Falsey, 'shape': ()}"),
                D("{'descr': '<f4', 'fortran_order': 'False', 'shape': ()}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (5)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': 5}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (,)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (1,,2)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (0x10,)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (007,)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (1__0,)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (1_,)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (-,)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1)}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3}"),
                D("{'descr': <f4, 'fortran_order': False, 'shape': ()}"),
                D("{'descr': '<f4\", 'fortran_order': False, 'shape': ()}"),
                D("{'descr': '<\\x66', 'fortran_order': False, 'shape': ()}"),
                D("{'descr': '<f4\0', 'fortran_order': False, 'shape': ()}"),
                D("{'descr': '<f\n4', 'fortran_order': False, 'shape': ()}"),
                D("{'descr': ('<f4', (2,)), 'fortran_order': False, 'shape': ()}"),
                D("{'descr': [('a', '<f4'), 'fortran_order': False, 'shape': ()}"),
                D("{'descr': [('a', '<f4')]], 'fortran_order': False, 'shape': ()}"),
                D("{'descr': [('a', '<f4')), 'fortran_order': False, 'shape': ()}"),
                D("{'descr': [('a', '<f4'), 'fortran_order': False, 'shape': ()}"),
                D("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, -3)}"),
                D("{'descr': '<U4', 'fortran_order': False, 'shape': (-99999999999999999999,)}"),
                D("{descr: '<f4', 'fortran_order': False, 'shape': ()}"),
                D("{'descr': '<f4', 'fortran_order': False, 'shape': (), # comment\n}"),
        };
#undef D
        for (size_t i = 0; i < N_ELEMS(bad); i++) {
                struct npy_info info, before;
                char err[ERRSZ] = "";
                int r;

                memset(&info, 0xab, sizeof(info));
                before = info;
                r = npy_parse_header(bad[i].text, bad[i].len, &info, err, sizeof(err));
                ck_assert_msg(r == -EINVAL, "case %zu '%s': %d (%s)", i, bad[i].text, r, err);
                ck_assert_msg(err[0] != '\0', "case %zu: no message", i);
                ck_assert_mem_eq(&info, &before, sizeof(info));
        }
}
END_TEST

START_TEST(test_parse_sizes)
{
        static const struct {
                const char *shape;
                const char *descr;
                int r;
        } cases[] = {
                {"(9223372036854775807,)", "|u1", 0},
                {"(9223372036854775808,)", "|u1", -EOVERFLOW},
                {"(99999999999999999999999999,)", "|u1", -EOVERFLOW},
                {"(9223372036854775807,)", "<i2", -EOVERFLOW},
                {"(4611686018427387904, 4)", "<f8", -EOVERFLOW},
                {"(4294967296, 4294967296)", "|u1", -EOVERFLOW},
                {"(4611686018427387904, 0)", "<f8", 0},
                {"(99999999999999999999999999, 0)", "<f8", -EOVERFLOW},
                {"(1152921504606846975,)", "<f8", 0},
                {"(1152921504606846976,)", "<f8", -EOVERFLOW},
        };

        for (size_t i = 0; i < N_ELEMS(cases); i++) {
                char dict[200], err[ERRSZ];
                struct npy_info info;
                int r;

                snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': %s}",
                         cases[i].descr, cases[i].shape);
                r = parse(dict, &info, err);
                ck_assert_msg(r == cases[i].r, "%s: %d (%s)", dict, r, err);
                if (r < 0)
                        ck_assert_ptr_nonnull(strstr(err, "64 bits"));
        }
}
END_TEST

START_TEST(test_parse_ndim_limit)
{
        char dict[512], err[ERRSZ];
        struct npy_info info;
        size_t n;

        for (int dims = 31; dims <= 34; dims++) {
                n = (size_t)snprintf(dict, sizeof(dict),
                                     "{'descr': '<f4', 'fortran_order': False, 'shape': (");
                for (int k = 0; k < dims; k++)
                        n += (size_t)snprintf(dict + n, sizeof(dict) - n, "1, ");
                snprintf(dict + n, sizeof(dict) - n, ")}");
                if (dims <= NPY_MAX_NDIM) {
                        ck_assert_msg(parse(dict, &info, err) == 0, "%d: %s", dims, err);
                        ck_assert_int_eq(info.ndim, dims);
                        ck_assert_uint_eq(info.data_bytes, 4);
                } else {
                        ck_assert_int_eq(parse(dict, &info, err), -ENOTSUP);
                        ck_assert_ptr_nonnull(strstr(err, "dimensions"));
                }
        }
        /* Too many dims but broken later: malformed wins over unsupported. */
        ck_assert_int_eq(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, "
                               "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
                               "1, 1, 1, 1, 1, 1, 1), 'bogus': 1}",
                               &info, err),
                         -EINVAL);
}
END_TEST

START_TEST(test_parse_priority)
{
        /* Malformed beats unsupported, which beats overflow, whatever the key order. */
        static const struct {
                const char *dict;
                int r;
                const char *says;
        } cases[] = {
                {"{'shape': (2, -3), 'descr': [('a', '<f4')], 'fortran_order': False}", -EINVAL,
                 "dimension 1 is negative"},
                {"{'shape': (99999999999999999999, -1), 'descr': '<f4', 'fortran_order': False}",
                 -EINVAL, "dimension 1 is negative"},
                {"{'shape': (99999999999999999999,), 'descr': [('a', '<f4')], 'fortran_order': "
                 "False}",
                 -ENOTSUP, "structured"},
                {"{'shape': (99999999999999999999,), 'descr': '|O', 'fortran_order': False}",
                 -ENOTSUP, "'|O'"},
                {"{'descr': '<U4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1, "
                 "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)}",
                 -ENOTSUP, "'<U4'"},
                {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1, "
                 "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
                 "99999999999999999999)}",
                 -ENOTSUP, "34 dimensions"},
                {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 99999999999999999999)}",
                 -EOVERFLOW, "dimension 1 does not fit"},
        };

        for (size_t i = 0; i < N_ELEMS(cases); i++) {
                struct npy_info info;
                char err[ERRSZ];
                int r = parse(cases[i].dict, &info, err);

                ck_assert_msg(r == cases[i].r, "case %zu: %d (%s)", i, r, err);
                ck_assert_msg(strstr(err, cases[i].says), "case %zu: '%s' lacks '%s'", i, err,
                              cases[i].says);
        }
}
END_TEST

/* The dict of a header for descr, e.g. for the rejected-dtype and v1/v2/v3 tests. */
static size_t dict_for(const char *descr, const char *shape, char *buf, size_t bufsz)
{
        return (size_t)snprintf(buf, bufsz,
                                "{'descr': %s, 'fortran_order': False, 'shape': %s, }        \n",
                                descr, shape);
}

START_TEST(test_reject_dtypes)
{
        static const struct {
                const char *descr; /* as it appears in the dict, quotes included */
                const char *says;  /* must appear in the message */
        } cases[] = {
                {"'<f16'", "'<f16' (extended-precision float)"},
                {"'>f16'", "'>f16'"},
                {"'<f12'", "'<f12'"},
                {"'<g'", "'<g' (long double)"},
                {"'<c32'", "'<c32' (extended-precision complex)"},
                {"'|O'", "'|O' (Python object)"},
                {"'|O8'", "'|O8'"},
                {"'|S5'", "'|S5' (byte string)"},
                {"'<U4'", "'<U4' (unicode string)"},
                {"'|V8'", "'|V8' (void/record)"},
                {"'<M8[ns]'", "'<M8[ns]' (datetime)"},
                {"'<m8[s]'", "'<m8[s]' (timedelta)"},
                {"'float32'", "'float32'"},
                {"''", "''"},
                {"'<f4\xc3\xa9'", "'<f4?\?'"},
                {"'<ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff4'",
                 "...'"},
                {"[('a', '<f4'), ('b', '<i4')]", "structured"},
                {"[('x', '<f4', (2,)), ('y', [('z', '|u1')]), ('\\'', 'S1')]", "structured"},
        };
        float data[2] = {0};

        for (size_t i = 0; i < N_ELEMS(cases); i++) {
                char dict[256], err[ERRSZ] = "";
                struct npy_info info;
                size_t n = dict_for(cases[i].descr, "(2,)", dict, sizeof(dict));
                int fd = raw_file("rej.npy", 1, 0, dict, n, data, sizeof(data));

                ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -ENOTSUP);
                ck_assert_msg(strstr(err, "has no DLPack equivalent"), "%s", err);
                ck_assert_msg(strstr(err, cases[i].says), "%s lacks %s", err, cases[i].says);
                close(fd);
        }
}
END_TEST

START_TEST(test_versions)
{
        /* The same array under format 1.0, 2.0 and 3.0: only the length field differs. */
        int32_t data[3] = {11, -22, 33};
        char dict[128], descr[8], err[ERRSZ];
        size_t n;

        snprintf(descr, sizeof(descr), "'%ci4'", HOST);
        n = dict_for(descr, "(3,)", dict, sizeof(dict));
        for (uint8_t major = 1; major <= 3; major++) {
                struct npy_info info;
                int32_t back[3];
                int fd = raw_file("ver.npy", major, 0, dict, n, data, sizeof(data));

                ck_assert_msg(npy_read_header(fd, &info, err, sizeof(err)) == 0, "%u: %s", major,
                              err);
                ck_assert_uint_eq(info.data_offset, (major == 1 ? 10 : 12) + n);
                ck_assert_int_eq(lseek(fd, 0, SEEK_CUR), (off_t)info.data_offset);
                ck_assert_uint_eq(info.data_bytes, sizeof(data));
                get(fd, back, sizeof(back));
                ck_assert_mem_eq(back, data, sizeof(data));
                close(fd);
        }
}
END_TEST

START_TEST(test_v3_utf8)
{
        /*
         * Latin-1 (1.0/2.0) takes any byte, so a non-ASCII descr is merely unsupported; 3.0
         * headers must be UTF-8, so the same bytes are malformed there.
         */
        static const char bad_utf8[] = "{'descr': '<f4\xff', 'fortran_order': False, 'shape': ()}";
        static const char good_utf8[] = "{'descr': '<f4\xc3\xa9', 'fortran_order': False, "
                                        "'shape': ()}";
        static const char overlong[] = "{'descr': '<f4\xc0\xaf', 'fortran_order': False, "
                                       "'shape': ()}";
        static const char surrogate[] = "{'descr': '<f4\xed\xa0\x80', 'fortran_order': False, "
                                        "'shape': ()}";
        struct npy_info info;
        char err[ERRSZ];
        int fd;

        fd = raw_file("u1.npy", 1, 0, bad_utf8, sizeof(bad_utf8) - 1, "abcd", 4);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -ENOTSUP);
        close(fd);
        fd = raw_file("u2.npy", 2, 0, bad_utf8, sizeof(bad_utf8) - 1, "abcd", 4);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -ENOTSUP);
        close(fd);
        fd = raw_file("u3.npy", 3, 0, bad_utf8, sizeof(bad_utf8) - 1, "abcd", 4);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "UTF-8"));
        close(fd);
        fd = raw_file("u3o.npy", 3, 0, overlong, sizeof(overlong) - 1, "abcd", 4);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -EINVAL);
        close(fd);
        fd = raw_file("u3s.npy", 3, 0, surrogate, sizeof(surrogate) - 1, "abcd", 4);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -EINVAL);
        close(fd);
        fd = raw_file("u3g.npy", 3, 0, good_utf8, sizeof(good_utf8) - 1, "abcd", 4);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -ENOTSUP);
        close(fd);
}
END_TEST

/* ---- file-level errors ------------------------------------------------------------------ */

START_TEST(test_truncated)
{
        /* Every proper prefix of a valid file is refused, whichever part it cuts. */
        uint8_t full[512];
        int64_t shape[2] = {3, 5};
        uint16_t v[15];
        DLTensor t = host_tensor(v, dt(kDLUInt, 16, 1), 2, shape, NULL, 0);
        int fd = open_new("whole.npy");
        off_t size;

        for (int i = 0; i < 15; i++)
                v[i] = (uint16_t)i;
        ck_assert_int_eq(npy_write_fd(fd, &t, NULL, 0), 0);
        size = file_size(fd);
        ck_assert_int_eq(size, 128 + 30);
        ck_assert_int_eq(pread(fd, full, (size_t)size, 0), size);
        close(fd);
        for (off_t len = 0; len < size; len++) {
                struct npy_info info;
                char err[ERRSZ] = "";

                fd = open_new("cut.npy");
                put(fd, full, (size_t)len);
                ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
                ck_assert_msg(npy_read_header(fd, &info, err, sizeof(err)) == -EINVAL, "len %d",
                              (int)len);
                ck_assert_msg(strstr(err, "truncated"), "len %d: %s", (int)len, err);
                close(fd);
        }
        /* Extra bytes after the data are tolerated, as numpy does. */
        fd = open_new("long.npy");
        put(fd, full, (size_t)size);
        put(fd, "zz", 2);
        ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
        {
                struct npy_info info;

                ck_assert_int_eq(npy_read_header(fd, &info, NULL, 0), 0);
        }
        close(fd);
}
END_TEST

START_TEST(test_bad_magic)
{
        static const char *const files[] = {
                "\x93NUMPZ\x01\x00\x10\x00",
                "PK\x03\x04\x14\x00\x00\x00",
                "\x93numpy\x01\x00",
                "NUMPY\x01\x00\x10\x00\x00",
                "\x92",
        };

        for (size_t i = 0; i < N_ELEMS(files); i++) {
                struct npy_info info;
                char err[ERRSZ] = "";
                int fd = open_new("magic.npy");

                put(fd, files[i], strlen(files[i]));
                ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
                ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -EINVAL);
                ck_assert_msg(strstr(err, "magic"), "%s", err);
                close(fd);
        }
}
END_TEST

START_TEST(test_bad_version_and_length)
{
        static const uint8_t versions[][2] = {{0, 0}, {1, 1}, {2, 1}, {4, 0}, {255, 0}};
        const char *dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (), }\n";
        struct npy_info info;
        char err[ERRSZ];
        int fd;

        for (size_t i = 0; i < N_ELEMS(versions); i++) {
                fd = raw_file("ver.npy", versions[i][0], versions[i][1], dict, strlen(dict), "x",
                              1);
                ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -ENOTSUP);
                ck_assert_ptr_nonnull(strstr(err, "version"));
                close(fd);
        }
        /* A length over the limit is refused before anything is allocated or read. */
        fd = raw_file("huge.npy", 2, 0, dict, 0, NULL, 0);
        ck_assert_int_eq(pwrite(fd, "\x01\x00\x10\x00", 4, 8), 4);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "limit"));
        close(fd);
        fd = raw_file("huge3.npy", 3, 0, dict, 0, NULL, 0);
        ck_assert_int_eq(pwrite(fd, "\xff\xff\xff\xff", 4, 8), 4);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -EINVAL);
        close(fd);
        /* Exactly at the limit is allowed: one MiB of dict padding. */
        {
                size_t len = NPY_MAX_HEADER_LEN;
                char *big = malloc(len);

                ck_assert_ptr_nonnull(big);
                memset(big, ' ', len);
                memcpy(big, dict, strlen(dict) - 1);
                big[len - 1] = '\n';
                fd = raw_file("edge.npy", 2, 0, big, len, "x", 1);
                ck_assert_msg(npy_read_header(fd, &info, err, sizeof(err)) == 0, "%s", err);
                ck_assert_uint_eq(info.data_offset, 12 + len);
                close(fd);
                free(big);
        }
        /* An empty header is malformed, not a crash. */
        fd = raw_file("empty.npy", 1, 0, "", 0, NULL, 0);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -EINVAL);
        close(fd);
}
END_TEST

START_TEST(test_endian_swap)
{
        /* Hand-written bytes in both orders: the native values must come out on any host. */
        static const uint8_t be_i4[] = {0, 0, 0, 1, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xfc};
        static const uint8_t le_i4[] = {1, 0, 0, 0, 2, 0, 0, 0, 0xfc, 0xff, 0xff, 0xff};
        static const uint8_t be_f2[] = {0x3c, 0x00, 0xc0, 0x00};
        static const uint8_t be_u8[] = {1, 2, 3, 4, 5, 6, 7, 8};
        /* (1 + 2j) as complex64: each float big-endian on its own, real part first. */
        static const uint8_t be_c8[] = {0x3f, 0x80, 0, 0, 0x40, 0, 0, 0};
        /* (1.5 - 2j) as complex128. */
        static const uint8_t be_c16[] = {0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0xc0, 0, 0, 0, 0, 0, 0, 0};
        static const uint8_t be_f8[] = {0x3f, 0xf8, 0, 0, 0, 0, 0, 0};
        static const uint8_t be_i1[] = {0x80, 0x7f};
        static const struct {
                const char *descr;
                const uint8_t *bytes;
                size_t len, isz;
        } files[] = {
                {"'>i4'", be_i4, sizeof(be_i4), 4}, {"'<i4'", le_i4, sizeof(le_i4), 4},
                {"'>f2'", be_f2, sizeof(be_f2), 2}, {"'>u8'", be_u8, sizeof(be_u8), 8},
                {"'>c8'", be_c8, sizeof(be_c8), 8}, {"'>c16'", be_c16, sizeof(be_c16), 16},
                {"'>f8'", be_f8, sizeof(be_f8), 8}, {"'>i1'", be_i1, sizeof(be_i1), 1},
        };
        uint8_t buf[16];

        for (size_t i = 0; i < N_ELEMS(files); i++) {
                char dict[128], shape[16], err[ERRSZ];
                struct npy_info info;
                size_t n, isz = files[i].isz;
                int fd;

                snprintf(shape, sizeof(shape), "(%zu,)", files[i].len / isz);
                n = dict_for(files[i].descr, shape, dict, sizeof(dict));
                fd = raw_file("endian.npy", 1, 0, dict, n, files[i].bytes, files[i].len);
                ck_assert_msg(npy_read_header(fd, &info, err, sizeof(err)) == 0, "%s", err);
                ck_assert(info.swap_bytes == (isz > 1 && files[i].descr[1] == OTHER));
                get(fd, buf, files[i].len);
                npy_to_native(buf, &info);
                close(fd);
                switch (i) {
                case 0:
                case 1: {
                        int32_t v[3];

                        memcpy(v, buf, sizeof(v));
                        ck_assert(v[0] == 1 && v[1] == 2 && v[2] == -4);
                        break;
                }
                case 2: {
                        uint16_t v[2];

                        memcpy(v, buf, sizeof(v));
                        ck_assert(v[0] == 0x3c00 && v[1] == 0xc000);
                        break;
                }
                case 3: {
                        uint64_t v;

                        memcpy(&v, buf, sizeof(v));
                        ck_assert(v == UINT64_C(0x0102030405060708));
                        break;
                }
                case 4: {
                        float v[2];

                        memcpy(v, buf, sizeof(v));
                        ck_assert(v[0] == 1.0f && v[1] == 2.0f);
                        break;
                }
                case 5: {
                        double v[2];

                        memcpy(v, buf, sizeof(v));
                        ck_assert(v[0] == 1.5 && v[1] == -2.0);
                        break;
                }
                case 6: {
                        double v;

                        memcpy(&v, buf, sizeof(v));
                        ck_assert(v == 1.5);
                        break;
                }
                case 7:
                        ck_assert(buf[0] == 0x80 && buf[1] == 0x7f);
                        break;
                }
        }
}
END_TEST

START_TEST(test_to_native_noop)
{
        /* No swap flag, no change; and a swap of unaligned data works. */
        uint8_t data[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
        struct npy_info info = {.dtype = {kDLInt, 32, 1}, .data_bytes = 8};

        npy_to_native(data + 1, &info);
        ck_assert_int_eq(data[1], 1);
        info.swap_bytes = true;
        npy_to_native(data + 1, &info);
        ck_assert_mem_eq(data, "\x00\x04\x03\x02\x01\x08\x07\x06\x05", 9);
        info.dtype = dt(kDLBool, 8, 1);
        npy_to_native(data, &info);
        ck_assert_mem_eq(data, "\x00\x04\x03\x02\x01\x08\x07\x06\x05", 9);
}
END_TEST

START_TEST(test_read_from_pipe)
{
        /* dlxctl may read stdin: a pipe has no size to check and no offset to seek. */
        int32_t v[4] = {5, 6, 7, 8}, back[4];
        int64_t shape[1] = {4};
        DLTensor t = host_tensor(v, dt(kDLInt, 32, 1), 1, shape, NULL, 0);
        struct npy_info info;
        char err[ERRSZ];
        int p[2];

        ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
        ck_assert_msg(npy_write_fd(p[1], &t, err, sizeof(err)) == 0, "%s", err);
        close(p[1]);
        ck_assert_msg(npy_read_header(p[0], &info, err, sizeof(err)) == 0, "%s", err);
        ck_assert_uint_eq(info.data_bytes, sizeof(v));
        get(p[0], back, sizeof(back));
        ck_assert_mem_eq(back, v, sizeof(v));
        close(p[0]);
}
END_TEST

START_TEST(test_io_errors)
{
        int32_t v[4] = {0};
        int64_t shape[1] = {4};
        DLTensor t = host_tensor(v, dt(kDLInt, 32, 1), 1, shape, NULL, 0);
        struct npy_info info;
        char err[ERRSZ];
        int fd, p[2];

        ck_assert_int_eq(npy_read_header(-1, &info, err, sizeof(err)), -EBADF);
        ck_assert_int_eq(npy_write_fd(-1, &t, err, sizeof(err)), -EBADF);
        fd = open_new("ro.npy");
        close(fd);
        fd = open(path_of("ro.npy"), O_RDONLY | O_CLOEXEC);
        ck_assert_int_eq(npy_write_fd(fd, &t, err, sizeof(err)), -EBADF);
        ck_assert_ptr_nonnull(strstr(err, "writing"));
        close(fd);
        fd = open(path_of("ro.npy"), O_WRONLY | O_CLOEXEC);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -EBADF);
        close(fd);
        /* EISDIR: reading a directory fails in read(), not in the parser. */
        fd = open(tmpdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -EISDIR);
        close(fd);

        signal(SIGPIPE, SIG_IGN);
        ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
        close(p[0]);
        ck_assert_int_eq(npy_write_fd(p[1], &t, err, sizeof(err)), -EPIPE);
        close(p[1]);
}
END_TEST

START_TEST(test_write_invalid)
{
        int32_t v[4] = {0};
        int64_t shape[2] = {2, 2}, neg[2] = {2, -1}, big[2] = {INT64_C(1) << 62, 4};
        int64_t wild[2] = {INT64_MAX / 2, 1};
        int64_t many[NPY_MAX_NDIM + 1];
        struct {
                DLTensor t;
                int r;
                const char *says;
        } cases[] = {
                {host_tensor(v, dt(kDLInt, 32, 1), -1, shape, NULL, 0), -EINVAL, "negative ndim"},
                {host_tensor(v, dt(kDLInt, 32, 1), NPY_MAX_NDIM + 1, many, NULL, 0), -ENOTSUP,
                 "at most 32"},
                {host_tensor(v, dt(kDLInt, 32, 1), 2, NULL, NULL, 0), -EINVAL, "no shape"},
                {host_tensor(v, dt(kDLInt, 32, 1), 2, neg, NULL, 0), -EINVAL, "negative"},
                {host_tensor(NULL, dt(kDLInt, 32, 1), 2, shape, NULL, 0), -EINVAL, "no data"},
                {host_tensor(v, dt(kDLInt, 32, 1), 2, big, NULL, 0), -EOVERFLOW, "64 bits"},
                {host_tensor(v, dt(kDLInt, 32, 1), 2, shape, wild, 0), -EOVERFLOW, "strides"},
                {host_tensor(v, dt(kDLBfloat, 16, 1), 2, shape, NULL, 0), -ENOTSUP,
                 "DLPack dtype bfloat16 has no numpy equivalent"},
                {host_tensor(v, dt(kDLFloat8_e4m3fn, 8, 1), 2, shape, NULL, 0), -ENOTSUP,
                 "float8_e4m3fn"},
                {host_tensor(v, dt(kDLFloat, 32, 4), 2, shape, NULL, 0), -ENOTSUP,
                 "float32x4 has no numpy equivalent (vector lanes)"},
                {host_tensor(v, dt(kDLInt, 4, 1), 2, shape, NULL, 0), -ENOTSUP,
                 "int4 has no numpy "
                 "equivalent (sub-byte)"},
                {host_tensor(v, dt(kDLBool, 1, 1), 2, shape, NULL, 0), -ENOTSUP, "bool1"},
                {host_tensor(v, dt(77, 32, 1), 2, shape, NULL, 0), -ENOTSUP, "code 77"},
        };
        DLTensor gpu = host_tensor(v, dt(kDLInt, 32, 1), 2, shape, NULL, 0);
        char err[ERRSZ];
        int fd = open_new("invalid.npy");

        for (int k = 0; k <= NPY_MAX_NDIM; k++)
                many[k] = 1;
        for (size_t i = 0; i < N_ELEMS(cases); i++) {
                err[0] = '\0';
                ck_assert_msg(npy_write_fd(fd, &cases[i].t, err, sizeof(err)) == cases[i].r,
                              "case %zu: %s", i, err);
                ck_assert_msg(strstr(err, cases[i].says), "case %zu: '%s' lacks '%s'", i, err,
                              cases[i].says);
        }
        gpu.device.device_type = kDLCUDA;
        ck_assert_int_eq(npy_write_fd(fd, &gpu, err, sizeof(err)), -EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "device"));
        ck_assert_int_eq(npy_write_fd(fd, NULL, err, sizeof(err)), -EINVAL);
        /* Refusals happen before any byte is written. */
        ck_assert_int_eq(file_size(fd), 0);
        /* Pinned host memory is host memory. */
        gpu.device.device_type = kDLCUDAHost;
        ck_assert_int_eq(npy_write_fd(fd, &gpu, err, sizeof(err)), 0);
        close(fd);
}
END_TEST

START_TEST(test_ret_untouched)
{
        const char *dict = "{'descr': '<U4', 'fortran_order': False, 'shape': (2,), }\n";
        struct npy_info info, before;
        char err[ERRSZ];
        int fd = raw_file("untouched.npy", 1, 0, dict, strlen(dict), "12345678", 8);

        memset(&info, 0x5a, sizeof(info));
        before = info;
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -ENOTSUP);
        ck_assert_mem_eq(&info, &before, sizeof(info));
        ck_assert_str_eq(err, "numpy dtype '<U4' (unicode string) has no DLPack equivalent");
        /* A NULL or empty err buffer is fine too. */
        ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
        ck_assert_int_eq(npy_read_header(fd, &info, NULL, 0), -ENOTSUP);
        ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
        err[0] = 'q';
        ck_assert_int_eq(npy_read_header(fd, &info, err, 0), -ENOTSUP);
        ck_assert_int_eq(err[0], 'q');
        close(fd);
}
END_TEST

/* ---- numpy interoperability ------------------------------------------------------------- */

static const char interop_py[] =
        "import sys\n"
        "import numpy as np\n"
        "d = sys.argv[1] + '/'\n"
        "def chk(name, want):\n"
        "    a = np.load(d + name)\n"
        "    assert a.dtype == want.dtype, (name, a.dtype, want.dtype)\n"
        "    assert a.shape == want.shape, (name, a.shape, want.shape)\n"
        "    assert np.array_equal(a, want), (name, a, want)\n"
        "chk('c_f4.npy', np.arange(6, dtype=np.float32).reshape(2, 3))\n"
        "a = np.load(d + 'f_i2.npy')\n"
        "assert a.flags.f_contiguous and not a.flags.c_contiguous\n"
        "chk('f_i2.npy', np.arange(6, dtype=np.int16).reshape(2, 3))\n"
        "chk('g_i8.npy', np.arange(6, dtype=np.int64).reshape(2, 3)[::-1, ::-1])\n"
        "chk('s_c16.npy', np.array(1.5 - 2j))\n"
        "chk('b_b1.npy', np.array([True, False, True]))\n"
        "chk('h_f2.npy', np.array([1.0, -2.0, 0.5], dtype=np.float16))\n"
        "chk('e_u8.npy', np.zeros((0, 3), dtype=np.uint64))\n"
        "np.save(d + 'np_f8.npy', np.arange(12, dtype='<f8').reshape(3, 4))\n"
        /* arithmetic on a '>i4' array gives a native one: convert last */
        "np.save(d + 'np_be.npy', (np.arange(5) - 2).astype('>i4'))\n"
        "np.save(d + 'np_fortran.npy', np.asfortranarray(np.arange(6, dtype='<u2').reshape(2, "
        "3)))\n"
        "np.save(d + 'np_0d.npy', np.array(7.5))\n"
        "np.save(d + 'np_empty.npy', np.zeros((0, 3), dtype=np.complex128))\n"
        "np.save(d + 'np_c8.npy', np.array([1 + 2j, -3.5j], dtype='>c8'))\n"
        "np.save(d + 'np_str.npy', np.array(['ab', 'c']))\n"
        "np.save(d + 'np_rec.npy', np.zeros(2, dtype=[('a', '<f4'), ('b', '<i2')]))\n";

static void save(const char *name, const DLTensor *t)
{
        char err[ERRSZ];
        int fd = open_new(name);

        ck_assert_msg(npy_write_fd(fd, t, err, sizeof(err)) == 0, "%s: %s", name, err);
        close(fd);
}

/* Opens a numpy-written file, reads its header and (native) data into a new buffer. */
static void *load(const char *name, struct npy_info *info)
{
        char err[ERRSZ];
        int fd = open(path_of(name), O_RDONLY | O_CLOEXEC);
        void *data;

        ck_assert_int_ge(fd, 0);
        ck_assert_msg(npy_read_header(fd, info, err, sizeof(err)) == 0, "%s: %s", name, err);
        data = malloc(info->data_bytes + 1);
        ck_assert_ptr_nonnull(data);
        if (info->data_bytes)
                get(fd, data, info->data_bytes);
        npy_to_native(data, info);
        close(fd);
        return data;
}

START_TEST(test_numpy_interop)
{
        float f4[6] = {0, 1, 2, 3, 4, 5};
        int16_t i2[6];
        int64_t i8[6] = {0, 1, 2, 3, 4, 5};
        double c16[2] = {1.5, -2.0};
        uint8_t b1[3] = {1, 0, 1};
        uint16_t f2[3] = {0x3c00, 0xc000, 0x3800};
        int64_t s23[2] = {2, 3}, fst[2] = {1, 2}, rev[2] = {-3, -1}, s3[1] = {3}, s03[2] = {0, 3};
        DLTensor t;
        struct npy_info info;
        char cmd[3 * PATH_MAX], err[ERRSZ];
        void *data;
        int fd;

        if (system("python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
                fprintf(stderr, "test_numpy_interop: python3 with numpy not found, skipped\n");
                return;
        }
        for (int i = 0; i < 2; i++)
                for (int j = 0; j < 3; j++)
                        i2[i + 2 * j] = (int16_t)(3 * i + j);
        t = host_tensor(f4, dt(kDLFloat, 32, 1), 2, s23, NULL, 0);
        save("c_f4.npy", &t);
        t = host_tensor(i2, dt(kDLInt, 16, 1), 2, s23, fst, 0);
        save("f_i2.npy", &t);
        t = host_tensor(i8, dt(kDLInt, 64, 1), 2, s23, rev, 5 * sizeof(int64_t));
        save("g_i8.npy", &t);
        t = host_tensor(c16, dt(kDLComplex, 128, 1), 0, NULL, NULL, 0);
        save("s_c16.npy", &t);
        t = host_tensor(b1, dt(kDLBool, 8, 1), 1, s3, NULL, 0);
        save("b_b1.npy", &t);
        t = host_tensor(f2, dt(kDLFloat, 16, 1), 1, s3, NULL, 0);
        save("h_f2.npy", &t);
        t = host_tensor(NULL, dt(kDLUInt, 64, 1), 2, s03, NULL, 0);
        save("e_u8.npy", &t);

        fd = open_new("interop.py");
        put(fd, interop_py, sizeof(interop_py) - 1);
        close(fd);
        snprintf(cmd, sizeof(cmd), "python3 '%s/interop.py' '%s'", tmpdir, tmpdir);
        ck_assert_msg(system(cmd) == 0, "numpy disagreed: %s", cmd);

        data = load("np_f8.npy", &info);
        ck_assert(info.dtype.code == kDLFloat && info.dtype.bits == 64 && info.ndim == 2);
        ck_assert(info.shape[0] == 3 && info.shape[1] == 4 && !info.fortran_order);
        for (int i = 0; i < 12; i++)
                ck_assert(((double *)data)[i] == i);
        free(data);
        data = load("np_be.npy", &info);
        ck_assert(info.dtype.code == kDLInt && info.dtype.bits == 32 && info.shape[0] == 5);
        ck_assert(info.swap_bytes == (HOST == '<'));
        for (int i = 0; i < 5; i++)
                ck_assert_int_eq(((int32_t *)data)[i], i - 2);
        free(data);
        data = load("np_fortran.npy", &info);
        ck_assert(info.fortran_order && info.shape[0] == 2 && info.shape[1] == 3);
        {
                int64_t st[NPY_MAX_NDIM];

                npy_strides(&info, st);
                for (int i = 0; i < 2; i++)
                        for (int j = 0; j < 3; j++)
                                ck_assert_int_eq(((uint16_t *)data)[i * st[0] + j * st[1]],
                                                 3 * i + j);
        }
        free(data);
        data = load("np_0d.npy", &info);
        ck_assert(info.ndim == 0 && info.data_bytes == 8 && *(double *)data == 7.5);
        free(data);
        data = load("np_empty.npy", &info);
        ck_assert(info.ndim == 2 && info.shape[0] == 0 && info.data_bytes == 0);
        ck_assert(info.dtype.code == kDLComplex && info.dtype.bits == 128);
        free(data);
        data = load("np_c8.npy", &info);
        ck_assert(((float *)data)[0] == 1 && ((float *)data)[1] == 2);
        ck_assert(((float *)data)[2] == 0 && ((float *)data)[3] == -3.5f);
        free(data);

        fd = open(path_of("np_str.npy"), O_RDONLY | O_CLOEXEC);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -ENOTSUP);
        ck_assert_ptr_nonnull(strstr(err, "unicode string"));
        close(fd);
        fd = open(path_of("np_rec.npy"), O_RDONLY | O_CLOEXEC);
        ck_assert_int_eq(npy_read_header(fd, &info, err, sizeof(err)), -ENOTSUP);
        ck_assert_ptr_nonnull(strstr(err, "structured"));
        close(fd);
}
END_TEST

Suite *npy_suite(void);

/*
 * Each test case shares one directory made and removed in the parent process, so a failing
 * test (its forked child dies before any per-test teardown) still leaves nothing behind.
 */
Suite *npy_suite(void)
{
        Suite *s = suite_create("npy");
        TCase *dtypes = tcase_create("dtypes");
        TCase *write = tcase_create("write");
        TCase *parse_tc = tcase_create("parse");
        TCase *file = tcase_create("file");
        TCase *interop = tcase_create("numpy");

        tcase_add_test(dtypes, test_descr_supported);
        tcase_add_test(dtypes, test_descr_unsupported);
        tcase_add_test(dtypes, test_dtype_from_descr);
        suite_add_tcase(s, dtypes);

        tcase_add_unchecked_fixture(write, setup, teardown);
        tcase_add_test(write, test_roundtrip_all_dtypes);
        tcase_add_test(write, test_roundtrip_0d);
        tcase_add_test(write, test_roundtrip_empty);
        tcase_add_test(write, test_write_fortran);
        tcase_add_test(write, test_write_unit_dims_stay_c_order);
        tcase_add_test(write, test_write_gather_columns);
        tcase_add_test(write, test_write_gather_rows);
        tcase_add_test(write, test_write_negative_strides);
        tcase_add_test(write, test_write_byte_offset);
        tcase_add_test(write, test_write_broadcast);
        tcase_add_test(write, test_write_gather_large);
        tcase_add_test(write, test_write_header_layout);
        tcase_add_test(write, test_write_invalid);
        suite_add_tcase(s, write);

        tcase_add_unchecked_fixture(parse_tc, setup, teardown);
        tcase_add_test(parse_tc, test_parse_tolerant);
        tcase_add_test(parse_tc, test_parse_malformed);
        tcase_add_test(parse_tc, test_parse_sizes);
        tcase_add_test(parse_tc, test_parse_ndim_limit);
        tcase_add_test(parse_tc, test_parse_priority);
        tcase_add_test(parse_tc, test_reject_dtypes);
        tcase_add_test(parse_tc, test_versions);
        tcase_add_test(parse_tc, test_v3_utf8);
        suite_add_tcase(s, parse_tc);

        tcase_add_unchecked_fixture(file, setup, teardown);
        tcase_add_test(file, test_truncated);
        tcase_add_test(file, test_bad_magic);
        tcase_add_test(file, test_bad_version_and_length);
        tcase_add_test(file, test_endian_swap);
        tcase_add_test(file, test_to_native_noop);
        tcase_add_test(file, test_read_from_pipe);
        tcase_add_test(file, test_io_errors);
        tcase_add_test(file, test_ret_untouched);
        suite_add_tcase(s, file);

        tcase_add_unchecked_fixture(interop, setup, teardown);
        tcase_add_test(interop, test_numpy_interop);
        /* numpy's import alone can take seconds on a cold cache. */
        tcase_set_timeout(interop, 60);
        suite_add_tcase(s, interop);
        return s;
}
