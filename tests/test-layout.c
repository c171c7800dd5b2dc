/* SPDX-License-Identifier: MIT */
/*
 * Tests for proto/layout.c: name and prefix rules, dtype rules, and the byte
 * extent of a shape/strides/byte_offset layout. Expected extents are worked
 * out by hand in the comments so a wrong formula cannot agree with itself.
 */
#include "layout.h"
#include "units.h"

#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "toolkit.h"

static DLDataType dt(uint8_t code, uint8_t bits, uint16_t lanes)
{
        DLDataType d = {.code = code, .bits = bits, .lanes = lanes};
        return d;
}

#define F32 dt(kDLFloat, 32, 1)
#define F64 dt(kDLFloat, 64, 1)
#define I16 dt(kDLInt, 16, 1)
#define U8 dt(kDLUInt, 8, 1)
#define FP4 dt(kDLFloat4_e2m1fn, 4, 1)
#define FP6 dt(kDLFloat6_e2m3fn, 6, 1)
#define PADDED DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED

static int name_check(const char *s)
{
        const char *why = NULL;
        int r = layout_name_check(s, strlen(s), &why);

        if (r < 0)
                ck_assert_ptr_nonnull(why);
        return r;
}

static int prefix_check(const char *s)
{
        const char *why = NULL;
        int r = layout_prefix_check(s, strlen(s), &why);

        if (r < 0)
                ck_assert_ptr_nonnull(why);
        return r;
}

/* ---- names -------------------------------------------------------------------------------- */

START_TEST(test_name_accepts)
{
        static const char *const good[] = {
                "a",
                "a/b/c",
                "\xc3\xbc"
                "n\xc3\xaf"
                "code/\xe5\x90\x8d\xe5\x89\x8d", /* "ünïcode/名前" */
                "...",
                ".a",
                "a.",
                "a/..b/c..",
                "with space",
                "x~!@#$%^&*()_+-={}[]|\\:;\"'<>,?",
                "\xc2\xa0",         /* U+00A0, first code point past C1 */
                "\xed\x9f\xbf",     /* U+D7FF, just below the surrogates */
                "\xee\x80\x80",     /* U+E000, just above them */
                "\xf0\x9f\x98\x80", /* U+1F600 */
                "\xf4\x8f\xbf\xbf", /* U+10FFFF, the last scalar */
                "\xc2\xac",         /* U+00AC, beside the soft hyphen */
                "\xc2\xae",         /* U+00AE */
                "\xe2\x80\x8a",     /* U+200A hair space, before the zero-width ones */
                "\xe2\x80\x90",     /* U+2010 hyphen, after the marks */
                "\xe2\x80\xa7",     /* U+2027, before the line separator */
                "\xe2\x80\xaf",     /* U+202F, after the bidi embeddings */
                "\xe2\x81\x9f",     /* U+205F, before the word joiner */
                "\xe2\x81\xb0",     /* U+2070, after the deprecated format characters */
                "\xef\xbb\xbe",     /* U+FEFE */
        };

        for (size_t i = 0; i < N_ELEMS(good); i++)
                ck_assert_msg(name_check(good[i]) == 0, "rejected good name #%zu", i);
        /* a NULL ret_why is allowed */
        ck_assert_int_eq(layout_name_check("a/b", 3, NULL), 0);
}
END_TEST

START_TEST(test_name_lengths)
{
        char buf[DLX_NAME_MAX + 2];

        memset(buf, 'x', sizeof(buf));
        buf[DLX_NAME_MAX] = '\0';
        ck_assert_int_eq(name_check(buf), 0); /* 255 bytes */
        buf[DLX_NAME_MAX] = 'x';
        buf[DLX_NAME_MAX + 1] = '\0';
        ck_assert_int_eq(name_check(buf), -EINVAL); /* 256 bytes */

        /* 255 bytes of three-byte characters, with separators */
        for (int i = 0; i < 85; i++)
                memcpy(buf + 3 * i, "\xe5\x90\x8d", 3);
        buf[255] = '\0';
        ck_assert_int_eq(name_check(buf), 0);
        buf[3 * 40] = '/';
        buf[3 * 40 + 1] = 'a';
        buf[3 * 40 + 2] = 'b';
        ck_assert_int_eq(name_check(buf), 0);

        ck_assert_int_eq(name_check(""), -EINVAL);
        ck_assert_int_eq(layout_name_check("abc", 0, NULL), -EINVAL);
        /* len is honoured: only the first byte is looked at */
        ck_assert_int_eq(layout_name_check("a/", 1, NULL), 0);
        ck_assert_int_eq(layout_name_check("a\x01", 1, NULL), 0);
}
END_TEST

/*
 * Every byte value at every place of a 24-byte ASCII name (three words, read
 * a word at a time where nothing stands out): a '/' divides it unless it
 * makes an empty component, and any other byte outside printable ASCII, a
 * lone byte of 0x80 or more included, is refused. Then two of each at once.
 */
START_TEST(test_name_every_byte_everywhere)
{
        char buf[25] = "abcdefghijklmnopqrstuvwx";
        const size_t len = 24;

        for (size_t p = 0; p < len; p++) {
                for (unsigned b = 0; b < 256; b++) {
                        bool want = (b >= 0x20 && b < 0x7f && b != '/') ||
                                    (b == '/' && p > 0 && p < len - 1);
                        buf[p] = (char)b;
                        ck_assert_msg((layout_name_check(buf, len, NULL) == 0) == want,
                                      "byte 0x%02x at %zu: %s", b, p,
                                      want ? "refused" : "accepted");
                        buf[p] = (char)('a' + p);
                }
        }
        for (size_t p = 1; p + 1 < len; p++) {
                for (size_t q = p + 1; q + 1 < len; q++) {
                        buf[p] = buf[q] = '/';
                        ck_assert_msg((layout_name_check(buf, len, NULL) == 0) == (q > p + 1),
                                      "slashes at %zu and %zu", p, q);
                        buf[p] = (char)('a' + p);
                        buf[q] = (char)('a' + q);
                }
        }
        memcpy(buf, "abcdefg/../hijklmnopqrst", len);
        ck_assert_int_eq(layout_name_check(buf, len, NULL), -EINVAL);
        memcpy(buf, "abcdefgh/./ijklmnopqrst", len);
        ck_assert_int_eq(layout_name_check(buf, 23, NULL), -EINVAL);
}
END_TEST

START_TEST(test_name_rejects)
{
        static const char *const bad[] = {
                "/a",
                "a/",
                "/",
                "//",
                "a//b",
                ".",
                "..",
                "./a",
                "a/.",
                "a/..",
                "../a",
                "a/./b",
                "a/../b",
                "a\x01",
                "\x1f",
                "a\tb",
                "a\nb",
                "a\x7f",
                "\xc2\x80",  /* U+0080, C1 */
                ("a\xc2\x85" /* U+0085 NEL, C1; split so that 'b' is no hex digit */
                 "b"),
                "\xc2\x9f",         /* U+009F, C1 */
                "\xc0\x80",         /* overlong NUL */
                "\xc1\xbf",         /* overlong 0x7f */
                "\xe0\x80\xaf",     /* overlong '/' */
                "\xe0\x9f\xbf",     /* overlong U+07FF */
                "\xf0\x80\x80\x80", /* overlong */
                "\xf0\x8f\xbf\xbf", /* overlong U+FFFF */
                "\xed\xa0\x80",     /* U+D800 */
                "\xed\xbf\xbf",     /* U+DFFF */
                "\xf4\x90\x80\x80", /* U+110000 */
                "\xf5\x80\x80\x80",
                "\xf7\xbf\xbf\xbf",
                "\xf8\x88\x80\x80\x80", /* five-byte form */
                "\xfc\x84\x80\x80\x80\x80",
                "\xfe",
                "\xff",
                "\x80", /* lone continuation */
                "a\xbf",
                "\xc3",         /* truncated two-byte */
                "a\xe5\x90",    /* truncated three-byte */
                "\xf0\x9f\x98", /* truncated four-byte */
                "\xe5\x90/b",   /* truncated before a separator */
                "\xc3(",        /* bad continuation */
                "\xe5(\x8d",
                "\xf0\x9f\x98(",
                "a\xc2\xad",             /* U+00AD soft hyphen */
                "\xd8\x9c",              /* U+061C Arabic letter mark */
                "\xe1\xa0\x8e",          /* U+180E Mongolian vowel separator */
                "\xe2\x80\x8b",          /* U+200B zero-width space */
                "a\xe2\x80\x8f",         /* U+200F right-to-left mark */
                "\xe2\x80\xa8",          /* U+2028 line separator */
                "\xe2\x80\xa9",          /* U+2029 paragraph separator */
                "v/\xe2\x80\xaetxt.exe", /* U+202E right-to-left override */
                "\xe2\x81\xa0",          /* U+2060 word joiner */
                "\xe2\x81\xa4",          /* U+2064 */
                "\xe2\x81\xa6",          /* U+2066 left-to-right isolate */
                "\xe2\x81\xaf",          /* U+206F */
                "\xef\xbb\xbf",          /* U+FEFF byte-order mark */
        };

        for (size_t i = 0; i < N_ELEMS(bad); i++)
                ck_assert_msg(name_check(bad[i]) == -EINVAL, "accepted bad name #%zu", i);
        /* an embedded NUL inside len */
        ck_assert_int_eq(layout_name_check("a\0b", 3, NULL), -EINVAL);
        /* a sequence cut by len, though the bytes after it would complete it */
        ck_assert_int_eq(layout_name_check("a\xe5\x90\x8d", 3, NULL), -EINVAL);
}
END_TEST

/* Valid UTF-8 as the tensor files' readers take it: controls and NUL pass, bad forms do not. */
START_TEST(test_utf8_valid)
{
        static const struct {
                const char *s;
                size_t len;
                bool ok;
        } cases[] = {
                {"", 0, true},
                {"a\0b", 3, true},
                {"\x01\x7f", 2, true},
                {"\xc3\xa9", 2, true},          /* U+00E9 */
                {"\xef\xbf\xbf", 3, true},      /* U+FFFF */
                {"\xf4\x8f\xbf\xbf", 4, true},  /* U+10FFFF */
                {"\xc3", 1, false},             /* cut short */
                {"\xe2\x82", 2, false},         /* cut short */
                {"\xc3\x28", 2, false},         /* not a continuation */
                {"\x80", 1, false},             /* a continuation first */
                {"\xc0\x80", 2, false},         /* overlong NUL */
                {"\xe0\x9f\xbf", 3, false},     /* overlong U+07FF */
                {"\xed\xa0\x80", 3, false},     /* U+D800 */
                {"\xf4\x90\x80\x80", 4, false}, /* past U+10FFFF */
                {"\xf8\x88\x80\x80\x80", 5, false},
                {"ok\xff", 3, false},
        };

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
                ck_assert_msg(layout_utf8_valid(cases[i].s, cases[i].len) == cases[i].ok,
                              "case %zu", i);
}
END_TEST

START_TEST(test_prefix)
{
        char buf[DLX_NAME_MAX + 2];

        ck_assert_int_eq(prefix_check(""), 0);
        ck_assert_int_eq(layout_prefix_check(NULL, 0, NULL), 0);
        ck_assert_int_eq(prefix_check("a"), 0);
        /* prefixes need not be names: they may end inside a component or with '/' */
        ck_assert_int_eq(prefix_check("a/"), 0);
        ck_assert_int_eq(prefix_check("models/re"), 0);
        ck_assert_int_eq(prefix_check("\xe5\x90\x8d/"), 0);
        memset(buf, 'p', sizeof(buf));
        buf[DLX_NAME_MAX] = '\0';
        ck_assert_int_eq(prefix_check(buf), 0);
        buf[DLX_NAME_MAX] = 'p';
        buf[DLX_NAME_MAX + 1] = '\0';
        ck_assert_int_eq(prefix_check(buf), -EINVAL);

        ck_assert_int_eq(prefix_check("a\x01"), -EINVAL);
        ck_assert_int_eq(prefix_check("\x7f"), -EINVAL);
        ck_assert_int_eq(prefix_check("\xc2\x85"), -EINVAL);
        ck_assert_int_eq(prefix_check("\xc0\x80"), -EINVAL);
        ck_assert_int_eq(prefix_check("\xed\xa0\x80"), -EINVAL);
        ck_assert_int_eq(prefix_check("\xf4\x90\x80\x80"), -EINVAL);
        ck_assert_int_eq(prefix_check("ab\xe5\x90"), -EINVAL);
        ck_assert_int_eq(layout_prefix_check("a\0", 2, NULL), -EINVAL);
}
END_TEST

/* ---- dtypes ------------------------------------------------------------------------------- */

/* The bit widths each code allows, per the contract in layout.h. */
static int dtype_bits_ok(unsigned code, unsigned bits)
{
        switch (code) {
        case kDLInt:
        case kDLUInt:
                return (bits >= 1 && bits <= 8) || bits == 16 || bits == 32 || bits == 64;
        case kDLFloat:
                return bits == 16 || bits == 32 || bits == 64;
        case kDLOpaqueHandle:
                return 0;
        case kDLBfloat:
                return bits == 16;
        case kDLComplex:
                return bits == 32 || bits == 64 || bits == 128;
        case kDLBool:
                return bits == 1 || bits == 8;
        case kDLFloat8_e3m4:
        case kDLFloat8_e4m3:
        case kDLFloat8_e4m3b11fnuz:
        case kDLFloat8_e4m3fn:
        case kDLFloat8_e4m3fnuz:
        case kDLFloat8_e5m2:
        case kDLFloat8_e5m2fnuz:
        case kDLFloat8_e8m0fnu:
                return bits == 8;
        case kDLFloat6_e2m3fn:
        case kDLFloat6_e3m2fn:
                return bits == 6;
        case kDLFloat4_e2m1fn:
                return bits == 4;
        default:
                return 0;
        }
}

START_TEST(test_dtype_table)
{
        static const uint16_t lanes[] = {1, 2, 4, 16, 65535};

        for (unsigned code = 0; code <= 255; code++) {
                for (unsigned bits = 0; bits <= 255; bits++) {
                        for (size_t l = 0; l < N_ELEMS(lanes); l++) {
                                const char *why = NULL;
                                int want = dtype_bits_ok(code, bits) ? 0 : -EINVAL;
                                int got = layout_dtype_check(
                                        dt((uint8_t)code, (uint8_t)bits, lanes[l]), &why);

                                if (got != want)
                                        ck_abort_msg("code %u bits %u lanes %u: %d, want %d", code,
                                                     bits, lanes[l], got, want);
                                if (got < 0 && !why)
                                        ck_abort_msg("code %u bits %u: no reason", code, bits);
                        }
                }
        }
}
END_TEST

START_TEST(test_dtype_specific)
{
        const char *why = NULL;

        ck_assert_int_eq(layout_dtype_check(F32, NULL), 0);
        ck_assert_int_eq(layout_dtype_check(dt(kDLInt, 4, 1), NULL), 0);
        ck_assert_int_eq(layout_dtype_check(dt(kDLBool, 8, 1), NULL), 0);
        ck_assert_int_eq(layout_dtype_check(dt(kDLComplex, 128, 1), NULL), 0);
        ck_assert_int_eq(layout_dtype_check(dt(kDLFloat8_e8m0fnu, 8, 1), NULL), 0);
        ck_assert_int_eq(layout_dtype_check(FP6, NULL), 0);
        ck_assert_int_eq(layout_dtype_check(dt(kDLFloat6_e3m2fn, 6, 1), NULL), 0);
        ck_assert_int_eq(layout_dtype_check(FP4, NULL), 0);

        /* lanes 0, for codes and widths that are otherwise fine */
        ck_assert_int_eq(layout_dtype_check(dt(kDLFloat, 32, 0), &why), -EINVAL);
        ck_assert_ptr_nonnull(why);
        ck_assert_int_eq(layout_dtype_check(dt(kDLInt, 8, 0), NULL), -EINVAL);
        ck_assert_int_eq(layout_dtype_check(dt(kDLFloat4_e2m1fn, 4, 0), NULL), -EINVAL);
        /* opaque handles are never shareable, whatever the width */
        for (unsigned bits = 0; bits <= 255; bits++)
                ck_assert_int_eq(layout_dtype_check(dt(kDLOpaqueHandle, (uint8_t)bits, 1), NULL),
                                 -EINVAL);
        why = NULL;
        ck_assert_int_eq(layout_dtype_check(dt(kDLOpaqueHandle, 64, 1), &why), -EINVAL);
        ck_assert_ptr_nonnull(why);
        /* past the last known code */
        ck_assert_int_eq(layout_dtype_check(dt(kDLFloat4_e2m1fn + 1, 8, 1), NULL), -EINVAL);
        ck_assert_int_eq(layout_dtype_check(dt(255, 8, 1), NULL), -EINVAL);
        ck_assert_int_eq(layout_dtype_check(dt(kDLFloat, 8, 1), NULL), -EINVAL);
        ck_assert_int_eq(layout_dtype_check(dt(kDLBfloat, 32, 1), NULL), -EINVAL);
        ck_assert_int_eq(layout_dtype_check(dt(kDLBool, 2, 1), NULL), -EINVAL);
        ck_assert_int_eq(layout_dtype_check(dt(kDLInt, 128, 1), NULL), -EINVAL);
        ck_assert_int_eq(layout_dtype_check(dt(kDLComplex, 16, 1), NULL), -EINVAL);
}
END_TEST

/* ---- extent ------------------------------------------------------------------------------- */

struct extent {
        int rc;
        int64_t lo, hi;
};

static struct extent extent_of(DLDataType d, int32_t ndim, const int64_t *shape,
                               const int64_t *strides, uint64_t byte_offset, uint64_t flags)
{
        struct extent e = {.lo = 0x5a5a, .hi = 0x5a5a};
        const char *why = NULL;

        e.rc = layout_extent(d, ndim, shape, strides, byte_offset, flags, &e.lo, &e.hi, &why);
        if (e.rc < 0) {
                ck_assert_ptr_nonnull(why);
                /* out-params untouched on failure */
                ck_assert_int_eq(e.lo, 0x5a5a);
                ck_assert_int_eq(e.hi, 0x5a5a);
        }
        return e;
}

#define ck_extent(e, want_lo, want_hi)                                                             \
        do {                                                                                       \
                struct extent e_ = (e);                                                            \
                ck_assert_int_eq(e_.rc, 0);                                                        \
                ck_assert_int_eq(e_.lo, (want_lo));                                                \
                ck_assert_int_eq(e_.hi, (want_hi));                                                \
        } while (0)

START_TEST(test_extent_scalar)
{
        /* 0-d: one element at the data pointer; shape and strides are never read */
        ck_extent(extent_of(F32, 0, NULL, NULL, 0, 0), 0, 4);
        ck_extent(extent_of(F64, 0, NULL, NULL, 24, 0), 24, 32);
        ck_extent(extent_of(dt(kDLComplex, 128, 1), 0, NULL, NULL, 0, 0), 0, 16);
        ck_extent(extent_of(dt(kDLFloat, 32, 4), 0, NULL, NULL, 0, 0), 0, 16);
        /* a single fp4 still touches a whole byte */
        ck_extent(extent_of(FP4, 0, NULL, NULL, 3, 0), 3, 4);
}
END_TEST

START_TEST(test_extent_empty)
{
        static const int64_t shape[] = {3, 0, 5};
        static const int64_t strides[] = {-7, 100, 1};
        static const int64_t shape1[] = {0};

        ck_extent(extent_of(F32, 3, shape, NULL, 0, 0), 0, 0);
        ck_extent(extent_of(F32, 3, shape, strides, 0, 0), 0, 0);
        /* an empty tensor touches nothing, whatever its offset */
        ck_extent(extent_of(F32, 3, shape, strides, 4096, 0), 0, 0);
        ck_extent(extent_of(F64, 1, shape1, NULL, 8, 0), 0, 0);
        ck_extent(extent_of(FP4, 1, shape1, NULL, 0, 0), 0, 0);
}
END_TEST

START_TEST(test_extent_compact)
{
        static const int64_t shape[] = {2, 3, 4};
        static const int64_t strides[] = {12, 4, 1};
        static const int64_t vec[] = {7};
        static const int64_t one[] = {1};

        /* 24 float32 = 96 bytes */
        ck_extent(extent_of(F32, 3, shape, NULL, 0, 0), 0, 96);
        ck_extent(extent_of(F32, 3, shape, strides, 0, 0), 0, 96);
        ck_extent(extent_of(F32, 3, shape, strides, 100, 0), 100, 196);
        ck_extent(extent_of(I16, 1, vec, NULL, 1, 0), 1, 15);
        ck_extent(extent_of(U8, 1, one, NULL, 0, 0), 0, 1);
        /* lanes multiply the element size: 7 x (float16 x 2) */
        ck_extent(extent_of(dt(kDLFloat, 16, 2), 1, vec, NULL, 0, 0), 0, 28);
        /* byte-aligned sub-byte vectors are not packed: int4 x 2 is one byte */
        ck_extent(extent_of(dt(kDLInt, 4, 2), 1, vec, NULL, 0, 0), 0, 7);
}
END_TEST

START_TEST(test_extent_strided)
{
        static const int64_t shape[] = {3, 4};
        static const int64_t transposed[] = {1, 3};
        static const int64_t gapped[] = {10, 2};
        static const int64_t neg_rows[] = {-4, 1};
        static const int64_t neg_all[] = {-4, -1};
        static const int64_t bcast[] = {0, 1};
        static const int64_t bcast_all[] = {0, 0};
        static const int64_t vec[] = {5};
        static const int64_t neg_vec[] = {-1};

        /* last element at 2*1 + 3*3 = 11: 12 float32 */
        ck_extent(extent_of(F32, 2, shape, transposed, 0, 0), 0, 48);
        /* last element at 2*10 + 3*2 = 26 */
        ck_extent(extent_of(F32, 2, shape, gapped, 0, 0), 0, 108);
        /* rows walk backwards from the data pointer: first row at -8 elements */
        ck_extent(extent_of(F64, 2, shape, neg_rows, 0, 0), -64, 32);
        ck_extent(extent_of(F64, 2, shape, neg_rows, 64, 0), 0, 96);
        /* everything backwards: lowest element at -(2*4 + 3) = -11 */
        ck_extent(extent_of(F32, 2, shape, neg_all, 0, 0), -44, 4);
        ck_extent(extent_of(I16, 1, vec, neg_vec, 0, 0), -8, 2);
        ck_extent(extent_of(I16, 1, vec, neg_vec, 8, 0), 0, 10);
        /* broadcast rows: only one row of memory */
        ck_extent(extent_of(F32, 2, shape, bcast, 0, 0), 0, 16);
        ck_extent(extent_of(F32, 2, shape, bcast_all, 40, 0), 40, 44);
}
END_TEST

START_TEST(test_extent_size_one_dims)
{
        static const int64_t shape[] = {1, 3, 1};
        static const int64_t strides[] = {12345, 2, -999};

        /* a dimension of extent 1 never moves, whatever its stride */
        ck_extent(extent_of(F32, 3, shape, strides, 0, 0), 0, 20);
}
END_TEST

START_TEST(test_extent_packed)
{
        static const int64_t s3[] = {3};
        static const int64_t s7[] = {7};
        static const int64_t s23[] = {2, 3};
        static const int64_t compact23[] = {3, 1};
        static const int64_t strided23[] = {4, 1};
        static const int64_t transposed23[] = {1, 2};
        static const int64_t s131[] = {1, 3, 1};
        static const int64_t odd131[] = {77, 1, 5};
        static const int64_t s9[] = {9};
        static const int64_t s5[] = {5};

        /* packed: ceil(numel * bits / 8) */
        ck_extent(extent_of(FP4, 1, s3, NULL, 0, 0), 0, 2);
        ck_extent(extent_of(FP4, 1, s7, NULL, 10, 0), 10, 14);
        ck_extent(extent_of(FP4, 2, s23, NULL, 0, 0), 0, 3);
        ck_extent(extent_of(FP4, 2, s23, compact23, 0, 0), 0, 3);
        ck_extent(extent_of(FP4, 3, s131, odd131, 0, 0), 0, 2);
        ck_extent(extent_of(FP6, 1, s5, NULL, 0, 0), 0, 4); /* 30 bits */
        ck_extent(extent_of(dt(kDLBool, 1, 1), 1, s9, NULL, 0, 0), 0, 2);
        ck_extent(extent_of(dt(kDLUInt, 3, 1), 1, s3, NULL, 0, 0), 0, 2); /* 9 bits */
        ck_extent(extent_of(dt(kDLInt, 4, 3), 1, s3, NULL, 0, 0), 0, 5);  /* 36 bits */

        /* packed elements have no byte address: only compact layouts are allowed */
        ck_assert_int_eq(extent_of(FP4, 2, s23, strided23, 0, 0).rc, -EINVAL);
        ck_assert_int_eq(extent_of(FP4, 2, s23, transposed23, 0, 0).rc, -EINVAL);
        ck_assert_int_eq(extent_of(FP6, 2, s23, strided23, 0, 0).rc, -EINVAL);
        ck_assert_int_eq(extent_of(dt(kDLBool, 1, 1), 2, s23, transposed23, 0, 0).rc, -EINVAL);
}
END_TEST

START_TEST(test_extent_padded)
{
        static const int64_t s3[] = {3};
        static const int64_t st2[] = {2};
        static const int64_t s23[] = {2, 3};
        static const int64_t transposed23[] = {1, 2};

        /* padded sub-byte: one byte per element, and strides are byte-addressable again */
        ck_extent(extent_of(FP4, 1, s3, NULL, 0, PADDED), 0, 3);
        ck_extent(extent_of(FP4, 1, s3, st2, 0, PADDED), 0, 5);
        ck_extent(extent_of(FP6, 2, s23, transposed23, 0, PADDED), 0, 6);
        ck_extent(extent_of(dt(kDLBool, 1, 1), 1, s3, NULL, 4, PADDED), 4, 7);
        /* the flag means nothing to byte-sized types */
        ck_extent(extent_of(F32, 1, s3, NULL, 0, PADDED), 0, 12);
}
END_TEST

/*
 * However padding is counted (per lane, as layout.c's itemsize does for odd
 * bit counts, or per element), a padded vector of more lanes never takes
 * fewer bytes than one of fewer lanes, and never fewer than packed would.
 */
START_TEST(test_extent_padded_lanes_monotonic)
{
        static const uint8_t codes[] = {kDLInt, kDLFloat6_e2m3fn, kDLBool};
        static const uint8_t bits[] = {4, 6, 1};

        for (size_t c = 0; c < N_ELEMS(codes); c++) {
                uint64_t prev = 0;

                for (uint16_t lanes = 1; lanes <= 16; lanes++) {
                        DLDataType d = dt(codes[c], bits[c], lanes);
                        uint64_t b = layout_compact_bytes(d, 1, PADDED);

                        ck_assert_msg(b >= prev && b * 8 >= (uint64_t)bits[c] * lanes,
                                      "padded %u-bit x %u: %llu bytes per element, %llu for "
                                      "one lane fewer",
                                      bits[c], lanes, (unsigned long long)b,
                                      (unsigned long long)prev);
                        prev = b;
                }
        }
}
END_TEST

START_TEST(test_extent_overflow)
{
        static const int64_t huge_numel[] = {INT64_C(1) << 32, INT64_C(1) << 32};
        static const int64_t numel_2_63[] = {INT64_C(1) << 62, 2};
        static const int64_t numel_2_62[] = {INT64_C(1) << 62};
        static const int64_t numel_2_61[] = {INT64_C(1) << 61};
        static const int64_t s3[] = {3};
        static const int64_t big_stride[] = {INT64_MAX / 2};
        static const int64_t s22[] = {2, 2};
        static const int64_t sum_pos[] = {INT64_C(1) << 62, INT64_C(1) << 62};
        static const int64_t sum_neg_ok[] = {-(INT64_C(1) << 62), -(INT64_C(1) << 62)};
        static const int64_t sum_neg[] = {-(INT64_C(1) << 62), -(INT64_C(1) << 62) - 1};
        static const int64_t one[] = {1};
        static const int64_t s2[] = {2};
        static const int64_t stride_2_62[] = {INT64_C(1) << 62};

        ck_assert_int_eq(extent_of(U8, 2, huge_numel, NULL, 0, 0).rc, -EOVERFLOW);
        ck_assert_int_eq(extent_of(U8, 2, numel_2_63, NULL, 0, 0).rc, -EOVERFLOW);
        /* 2^62 elements fit, 2^64 bytes do not */
        ck_assert_int_eq(extent_of(F32, 1, numel_2_62, NULL, 0, 0).rc, -EOVERFLOW);
        /* (2^61 - 1) * 4 fits; adding the last element's 4 bytes reaches 2^63 */
        ck_assert_int_eq(extent_of(F32, 1, numel_2_61, NULL, 0, 0).rc, -EOVERFLOW);
        ck_extent(extent_of(U8, 1, numel_2_62, NULL, 0, 0), 0, INT64_C(1) << 62);
        /* packed: 2^62 fp4 is 2^61 bytes, fine; at the end of the range it is not */
        ck_extent(extent_of(FP4, 1, numel_2_62, NULL, 0, 0), 0, INT64_C(1) << 61);
        ck_assert_int_eq(extent_of(FP4, 1, numel_2_62, NULL, INT64_C(3) << 61, 0).rc, -EOVERFLOW);

        ck_assert_int_eq(extent_of(F32, 1, s3, big_stride, 0, 0).rc, -EOVERFLOW);
        ck_assert_int_eq(extent_of(U8, 2, s22, sum_pos, 0, 0).rc, -EOVERFLOW);
        ck_extent(extent_of(U8, 2, s22, sum_neg_ok, 0, 0), INT64_MIN, 1);
        ck_assert_int_eq(extent_of(U8, 2, s22, sum_neg, 0, 0).rc, -EOVERFLOW);
        /* stride fits, stride * itemsize does not */
        ck_assert_int_eq(extent_of(F32, 1, s2, stride_2_62, 0, 0).rc, -EOVERFLOW);

        /* byte_offset: the last byte must stay within INT64_MAX */
        ck_extent(extent_of(F32, 1, one, NULL, INT64_MAX - 4, 0), INT64_MAX - 4, INT64_MAX);
        ck_assert_int_eq(extent_of(F32, 1, one, NULL, INT64_MAX - 3, 0).rc, -EOVERFLOW);
        ck_assert_int_eq(extent_of(F32, 1, one, NULL, INT64_MAX, 0).rc, -EOVERFLOW);
        ck_assert_int_eq(extent_of(F32, 1, one, NULL, (uint64_t)INT64_MAX + 1, 0).rc, -EOVERFLOW);
        ck_assert_int_eq(extent_of(F32, 1, one, NULL, UINT64_MAX, 0).rc, -EOVERFLOW);
        ck_assert_int_eq(extent_of(F32, 0, NULL, NULL, UINT64_MAX - 3, 0).rc, -EOVERFLOW);
        ck_assert_int_eq(extent_of(FP4, 1, s3, NULL, INT64_MAX - 1, 0).rc, -EOVERFLOW);
        ck_assert_int_eq(extent_of(F32, 1, s3, big_stride, INT64_MAX, 0).rc, -EOVERFLOW);
}
END_TEST

START_TEST(test_extent_invalid)
{
        static const int64_t neg[] = {3, -1};
        static const int64_t neg_after_zero[] = {0, -1};
        static const int64_t strides[] = {1, 1};
        static const int64_t shape33[DLX_MAX_NDIM + 1] = {0};

        ck_assert_int_eq(extent_of(F32, 2, neg, NULL, 0, 0).rc, -EINVAL);
        ck_assert_int_eq(extent_of(F32, 2, neg, strides, 0, 0).rc, -EINVAL);
        /* a zero dimension does not hide a negative one */
        ck_assert_int_eq(extent_of(F32, 2, neg_after_zero, NULL, 0, 0).rc, -EINVAL);
        ck_assert_int_eq(extent_of(F32, -1, NULL, NULL, 0, 0).rc, -EINVAL);
        ck_assert_int_eq(extent_of(F32, DLX_MAX_NDIM + 1, shape33, NULL, 0, 0).rc, -EINVAL);
        ck_assert_int_eq(extent_of(dt(kDLOpaqueHandle, 64, 1), 0, NULL, NULL, 0, 0).rc, -EINVAL);
        ck_assert_int_eq(extent_of(dt(kDLFloat, 32, 0), 0, NULL, NULL, 0, 0).rc, -EINVAL);
        ck_assert_int_eq(extent_of(dt(kDLFloat, 7, 1), 0, NULL, NULL, 0, 0).rc, -EINVAL);
        /* a NULL ret_why is allowed */
        int64_t lo, hi;
        ck_assert_int_eq(layout_extent(F32, 2, neg, NULL, 0, 0, &lo, &hi, NULL), -EINVAL);
}
END_TEST

START_TEST(test_extent_max_ndim)
{
        int64_t shape[DLX_MAX_NDIM], strides[DLX_MAX_NDIM];

        /* 2^32 elements over 32 dims of 2, compact: 2^32 bytes of uint8 */
        for (int i = 0; i < DLX_MAX_NDIM; i++)
                shape[i] = 2;
        layout_compact_strides(DLX_MAX_NDIM, shape, strides);
        ck_extent(extent_of(U8, DLX_MAX_NDIM, shape, NULL, 0, 0), 0, INT64_C(1) << 32);
        ck_extent(extent_of(U8, DLX_MAX_NDIM, shape, strides, 0, 0), 0, INT64_C(1) << 32);
        /* reversed strides touch the same bytes */
        for (int i = 0; i < DLX_MAX_NDIM; i++)
                strides[i] = INT64_C(1) << i;
        ck_extent(extent_of(U8, DLX_MAX_NDIM, shape, strides, 0, 0), 0, INT64_C(1) << 32);
}
END_TEST

/* ---- helpers ------------------------------------------------------------------------------ */

START_TEST(test_numel)
{
        static const int64_t s234[] = {2, 3, 4};
        static const int64_t s05[] = {0, 5};
        static const int64_t smax[] = {INT64_MAX};
        static const int64_t s2_63[] = {INT64_C(1) << 62, 2};
        static const int64_t s2_64[] = {INT64_C(1) << 32, INT64_C(1) << 32};
        static const int64_t neg[] = {4, -2};
        uint64_t n;

        ck_assert_int_eq(layout_numel(0, NULL, &n), 0);
        ck_assert_uint_eq(n, 1);
        ck_assert_int_eq(layout_numel(3, s234, &n), 0);
        ck_assert_uint_eq(n, 24);
        ck_assert_int_eq(layout_numel(2, s05, &n), 0);
        ck_assert_uint_eq(n, 0);
        ck_assert_int_eq(layout_numel(1, smax, &n), 0);
        ck_assert_uint_eq(n, (uint64_t)INT64_MAX);

        n = 77;
        ck_assert_int_eq(layout_numel(2, s2_63, &n), -EOVERFLOW);
        ck_assert_int_eq(layout_numel(2, s2_64, &n), -EOVERFLOW);
        ck_assert_int_eq(layout_numel(2, neg, &n), -EINVAL);
        ck_assert_uint_eq(n, 77);
}
END_TEST

START_TEST(test_is_compact)
{
        static const int64_t s234[] = {2, 3, 4};
        static const int64_t c234[] = {12, 4, 1};
        static const int64_t bad_last[] = {12, 4, 2};
        static const int64_t bad_first[] = {13, 4, 1};
        static const int64_t fortran[] = {1, 2, 6};
        static const int64_t bcast[] = {0, 4, 1};
        static const int64_t s131[] = {1, 3, 1};
        static const int64_t odd131[] = {-5, 1, 999};
        static const int64_t s213[] = {2, 1, 3};
        static const int64_t odd213[] = {3, 77, 1};
        static const int64_t bad213[] = {4, 77, 1};
        static const int64_t s11[] = {1, 1};
        static const int64_t any11[] = {0, -1};

        ck_assert(layout_is_compact(3, s234, NULL));
        ck_assert(layout_is_compact(3, s234, c234));
        ck_assert(!layout_is_compact(3, s234, bad_last));
        ck_assert(!layout_is_compact(3, s234, bad_first));
        ck_assert(!layout_is_compact(3, s234, fortran));
        ck_assert(!layout_is_compact(3, s234, bcast));
        ck_assert(layout_is_compact(0, NULL, NULL));
        ck_assert(layout_is_compact(0, NULL, c234));
        /* size-1 dims may carry any stride */
        ck_assert(layout_is_compact(3, s131, odd131));
        ck_assert(layout_is_compact(3, s213, odd213));
        ck_assert(!layout_is_compact(3, s213, bad213));
        ck_assert(layout_is_compact(2, s11, any11));
}
END_TEST

/* What layout_compact_strides() produces, layout_is_compact() must accept. */
START_TEST(test_compact_strides_are_compact)
{
        static const int64_t shapes[][4] = {
                {2, 3, 4, 5}, {1, 1, 1, 1}, {7, 1, 3, 1}, {0, 3, 4, 5},
                {3, 0, 4, 5}, {3, 4, 5, 0}, {2, 0, 0, 2},
        };

        for (size_t i = 0; i < N_ELEMS(shapes); i++) {
                int64_t strides[4];

                layout_compact_strides(4, shapes[i], strides);
                ck_assert_msg(layout_is_compact(4, shapes[i], strides),
                              "shape {%lld,%lld,%lld,%lld}: strides {%lld,%lld,%lld,%lld} from "
                              "layout_compact_strides() not compact",
                              (long long)shapes[i][0], (long long)shapes[i][1],
                              (long long)shapes[i][2], (long long)shapes[i][3],
                              (long long)strides[0], (long long)strides[1], (long long)strides[2],
                              (long long)strides[3]);
        }
}
END_TEST

START_TEST(test_compact_strides)
{
        static const int64_t s234[] = {2, 3, 4};
        static const int64_t s5[] = {5};
        static const int64_t s302[] = {3, 0, 2};
        int64_t st[4] = {-1, -1, -1, -1};

        layout_compact_strides(3, s234, st);
        ck_assert_int_eq(st[0], 12);
        ck_assert_int_eq(st[1], 4);
        ck_assert_int_eq(st[2], 1);
        ck_assert_int_eq(st[3], -1);
        layout_compact_strides(1, s5, st);
        ck_assert_int_eq(st[0], 1);
        /* a zero dimension counts as one, as torch does, so strides stay non-zero */
        layout_compact_strides(3, s302, st);
        ck_assert_int_eq(st[0], 2);
        ck_assert_int_eq(st[1], 2);
        ck_assert_int_eq(st[2], 1);
        st[0] = -1;
        layout_compact_strides(0, NULL, st);
        ck_assert_int_eq(st[0], -1);
}
END_TEST

START_TEST(test_compact_bytes)
{
        ck_assert_uint_eq(layout_compact_bytes(F32, 10, 0), 40);
        ck_assert_uint_eq(layout_compact_bytes(F32, 0, 0), 0);
        ck_assert_uint_eq(layout_compact_bytes(dt(kDLComplex, 128, 1), 3, 0), 48);
        ck_assert_uint_eq(layout_compact_bytes(dt(kDLFloat, 32, 4), 3, 0), 48);
        ck_assert_uint_eq(layout_compact_bytes(dt(kDLBool, 8, 1), 5, 0), 5);
        ck_assert_uint_eq(layout_compact_bytes(FP4, 1, 0), 1);
        ck_assert_uint_eq(layout_compact_bytes(FP4, 3, 0), 2);
        ck_assert_uint_eq(layout_compact_bytes(FP4, 4, 0), 2);
        ck_assert_uint_eq(layout_compact_bytes(FP4, 0, 0), 0);
        ck_assert_uint_eq(layout_compact_bytes(FP4, 3, PADDED), 3);
        ck_assert_uint_eq(layout_compact_bytes(FP6, 4, 0), 3);
        ck_assert_uint_eq(layout_compact_bytes(FP6, 5, 0), 4);
        ck_assert_uint_eq(layout_compact_bytes(FP6, 5, PADDED), 5);
        ck_assert_uint_eq(layout_compact_bytes(dt(kDLBool, 1, 1), 9, 0), 2);
        ck_assert_uint_eq(layout_compact_bytes(dt(kDLBool, 1, 1), 16, 0), 2);
        /* no intermediate overflow in the bit count */
        ck_assert_uint_eq(layout_compact_bytes(FP4, UINT64_C(1) << 62, 0), UINT64_C(1) << 61);
        ck_assert_uint_eq(layout_compact_bytes(FP4, UINT64_MAX, 0), UINT64_C(1) << 63);
}
END_TEST

START_TEST(test_units_parse_size)
{
        uint64_t v = 7;

        ck_assert_int_eq(units_parse_size("4096", &v), 0);
        ck_assert_uint_eq(v, 4096);
        ck_assert_int_eq(units_parse_size("64M", &v), 0);
        ck_assert_uint_eq(v, 64ull << 20);
        ck_assert_int_eq(units_parse_size("1GiB", &v), 0);
        ck_assert_uint_eq(v, 1ull << 30);
        ck_assert_int_eq(units_parse_size("2tb", &v), -EINVAL);
        ck_assert_int_eq(units_parse_size("2TB", &v), 0);
        ck_assert_uint_eq(v, 2ull << 40);
        ck_assert_int_eq(units_parse_size("3k", &v), 0);
        ck_assert_uint_eq(v, 3072);
        v = 7;
        ck_assert_int_eq(units_parse_size("", &v), -EINVAL);
        ck_assert_int_eq(units_parse_size("-1", &v), -EINVAL);
        ck_assert_int_eq(units_parse_size("12X", &v), -EINVAL);
        ck_assert_int_eq(units_parse_size("1Mx", &v), -EINVAL);
        ck_assert_int_eq(units_parse_size("16777216T", &v), -EINVAL); /* 2^64 */
        ck_assert_int_eq(units_parse_size("99999999999999999999", &v), -EINVAL);
        ck_assert_uint_eq(v, 7); /* untouched on failure */
}
END_TEST

/* ---- names in words ----------------------------------------------------------------------- */

START_TEST(test_device_name)
{
        static const struct {
                DLDevice device;
                const char *want;
        } cases[] = {
                {{kDLCPU, 0}, "cpu:0"},
                {{kDLCUDA, 1}, "cuda:1"},
                {{kDLCUDAHost, 0}, "cuda_host:0"},
                {{kDLCUDAManaged, 3}, "cuda_managed:3"},
                {{kDLROCM, 2}, "rocm:2"},
                {{kDLROCMHost, 0}, "rocm_host:0"},
                {{kDLOpenCL, 0}, "opencl:0"},
                {{kDLVulkan, 0}, "vulkan:0"},
                {{kDLMetal, 0}, "metal:0"},
                {{kDLVPI, 0}, "vpi:0"},
                {{kDLExtDev, 0}, "ext_dev:0"},
                {{kDLOneAPI, 0}, "oneapi:0"},
                {{kDLWebGPU, 0}, "webgpu:0"},
                {{kDLHexagon, 0}, "hexagon:0"},
                {{kDLMAIA, 0}, "maia:0"},
                {{kDLTrn, 5}, "trn:5"},
                /* the holes in DLPack's numbering, and past its end, keep their numbers */
                {{(DLDeviceType)5, 0}, "(type 5):0"},
                {{(DLDeviceType)0, 0}, "(type 0):0"},
                {{(DLDeviceType)99, 7}, "(type 99):7"},
        };
        char buf[48], small[6];

        for (size_t i = 0; i < N_ELEMS(cases); i++) {
                layout_device_name(cases[i].device, buf, sizeof(buf));
                ck_assert_str_eq(buf, cases[i].want);
        }
        /* a short buffer is cut, not overrun */
        layout_device_name((DLDevice){kDLCUDAHost, 0}, small, sizeof(small));
        ck_assert_str_eq(small, "cuda_");
}
END_TEST

Suite *layout_suite(void)
{
        Suite *s = suite_create("layout");
        TCase *tc = tcase_create("names");

        tcase_add_test(tc, test_name_accepts);
        tcase_add_test(tc, test_units_parse_size);
        tcase_add_test(tc, test_name_lengths);
        tcase_add_test(tc, test_name_rejects);
        tcase_add_test(tc, test_name_every_byte_everywhere);
        tcase_add_test(tc, test_prefix);
        tcase_add_test(tc, test_utf8_valid);
        suite_add_tcase(s, tc);

        tc = tcase_create("dtypes");
        tcase_add_test(tc, test_dtype_table);
        tcase_add_test(tc, test_dtype_specific);
        suite_add_tcase(s, tc);

        tc = tcase_create("extent");
        tcase_add_test(tc, test_extent_scalar);
        tcase_add_test(tc, test_extent_empty);
        tcase_add_test(tc, test_extent_compact);
        tcase_add_test(tc, test_extent_strided);
        tcase_add_test(tc, test_extent_size_one_dims);
        tcase_add_test(tc, test_extent_packed);
        tcase_add_test(tc, test_extent_padded);
        tcase_add_test(tc, test_extent_padded_lanes_monotonic);
        tcase_add_test(tc, test_extent_overflow);
        tcase_add_test(tc, test_extent_invalid);
        tcase_add_test(tc, test_extent_max_ndim);
        suite_add_tcase(s, tc);

        tc = tcase_create("helpers");
        tcase_add_test(tc, test_numel);
        tcase_add_test(tc, test_is_compact);
        tcase_add_test(tc, test_compact_strides_are_compact);
        tcase_add_test(tc, test_compact_strides);
        tcase_add_test(tc, test_compact_bytes);
        tcase_add_test(tc, test_device_name);
        suite_add_tcase(s, tc);
        return s;
}
