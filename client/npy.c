/* SPDX-License-Identifier: MIT */
#include "npy.h"

#include "layout.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_ORDER '<'
#elif defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_ORDER '>'
#else
#error "npy.c needs __BYTE_ORDER__ to tell the host byte order"
#endif

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
/* numpy aligns the data so that it can be memory-mapped and read with aligned loads. */
#define NPY_ALIGN 64
/* Gather writes go through a buffer this big: large tensors never need a second full copy. */
#define NPY_GATHER_BUF (64u * 1024)
/* Long enough for any supported descr or key; longer strings are only ever quoted back. */
#define NPY_TOKEN_MAX 64
/* Brackets nested this deep in a structured descr are refused rather than tracked. */
#define NPY_MAX_NESTING 64
/* Linux transfers at most about 2 GiB per call; smaller requests keep ssize_t arithmetic safe. */
#define NPY_IO_CHUNK (1u << 30)

__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t errsz, int code,
                                                      const char *fmt, ...)
{
        if (err && errsz > 0) {
                va_list ap;

                va_start(ap, fmt);
                vsnprintf(err, errsz, fmt, ap);
                va_end(ap);
        }
        return code;
}

/* Returns the bytes read, short only at end of file, or -errno. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
        size_t got = 0;

        while (got < n) {
                ssize_t r = read(fd, (char *)buf + got, n - got);

                if (r < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (r == 0)
                        break;
                got += (size_t)r;
        }
        return (ssize_t)got;
}

int npy_write_all(int fd, const void *buf, size_t n)
{
        const char *p = buf;

        while (n > 0) {
                ssize_t w = write(fd, p, n < NPY_IO_CHUNK ? n : NPY_IO_CHUNK);

                if (w < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                /* write() returns 0 only for a zero-length request; never loop forever on it. */
                if (w == 0)
                        return -EIO;
                p += w;
                n -= (size_t)w;
        }
        return 0;
}

/* ---- dtypes ----------------------------------------------------------------------------- */

struct npy_type {
        char kind;    /* numpy kind character */
        uint8_t size; /* bytes per element */
        uint8_t code; /* DLDataTypeCode */
        uint8_t bits;
};

static const struct npy_type npy_types[] = {
        {'b', 1, kDLBool, 8},     {'i', 1, kDLInt, 8},        {'i', 2, kDLInt, 16},
        {'i', 4, kDLInt, 32},     {'i', 8, kDLInt, 64},       {'u', 1, kDLUInt, 8},
        {'u', 2, kDLUInt, 16},    {'u', 4, kDLUInt, 32},      {'u', 8, kDLUInt, 64},
        {'f', 2, kDLFloat, 16},   {'f', 4, kDLFloat, 32},     {'f', 8, kDLFloat, 64},
        {'c', 8, kDLComplex, 64}, {'c', 16, kDLComplex, 128},
};

#define N_NPY_TYPES (sizeof(npy_types) / sizeof(npy_types[0]))

int npy_dtype_from_descr(const char *descr, DLDataType *ret_dtype, bool *ret_swap)
{
        const char *p = descr;
        const char *digits;
        char order = '=';
        char kind;
        unsigned size = 0;

        if (!descr || !ret_dtype || !ret_swap)
                return -EINVAL;
        if (*p == '<' || *p == '>' || *p == '|' || *p == '=')
                order = *p++;
        kind = *p++;
        if (kind == '\0')
                return -ENOTSUP;
        digits = p;
        /* Three digits are more than any supported size: stop before size can overflow. */
        while (*p >= '0' && *p <= '9' && p - digits < 3)
                size = size * 10 + (unsigned)(*p++ - '0');
        if (p == digits || *p != '\0' || *digits == '0')
                return -ENOTSUP;
        for (size_t i = 0; i < N_NPY_TYPES; i++) {
                const struct npy_type *ty = &npy_types[i];

                if (ty->kind != kind || ty->size != size)
                        continue;
                ret_dtype->code = ty->code;
                ret_dtype->bits = ty->bits;
                ret_dtype->lanes = 1;
                /* '|' (not applicable) and '=' (native) are how numpy spells "no swap". */
                *ret_swap = size > 1 && (order == '<' || order == '>') && order != HOST_ORDER;
                return 0;
        }
        return -ENOTSUP;
}

/* What a refused numpy descr is, so the message says more than the cryptic code. */
static const char *descr_hint(const char *descr)
{
        const char *p = descr;
        unsigned long size;

        if (*p == '<' || *p == '>' || *p == '|' || *p == '=')
                p++;
        size = strtoul(p + (*p != '\0'), NULL, 10);
        switch (*p) {
        case 'O':
                return " (Python object)";
        case 'S':
        case 'a':
                return " (byte string)";
        case 'U':
                return " (unicode string)";
        case 'V':
                return " (void/record)";
        case 'M':
                return " (datetime)";
        case 'm':
                return " (timedelta)";
        case 'g':
                return " (long double)";
        case 'G':
                return " (long double complex)";
        case 'f':
                return size > 8 ? " (extended-precision float)" : "";
        case 'c':
                return size > 16 ? " (extended-precision complex)" : "";
        default:
                return "";
        }
}

int npy_descr(DLDataType dtype, char *buf, size_t bufsz)
{
        char tmp[NPY_DESCR_MAX];

        if (!buf)
                return -EINVAL;
        if (dtype.lanes != 1)
                return -ENOTSUP;
        for (size_t i = 0; i < N_NPY_TYPES; i++) {
                const struct npy_type *ty = &npy_types[i];
                int n;

                if (ty->code != dtype.code || ty->bits != dtype.bits)
                        continue;
                n = snprintf(tmp, sizeof(tmp), "%c%c%u", ty->size == 1 ? '|' : HOST_ORDER, ty->kind,
                             (unsigned)ty->size);
                if ((size_t)n >= bufsz)
                        return -ERANGE;
                memcpy(buf, tmp, (size_t)n + 1);
                return 0;
        }
        return -ENOTSUP;
}

/* ---- header dict parser ----------------------------------------------------------------- */

/*
 * The header is a Python literal; numpy evaluates it with ast.literal_eval. This accepts
 * exactly the subset numpy writes (and older numpy wrote: 3L longs, either quote), in any
 * key order, and nothing that would make literal_eval or numpy's key checks fail.
 */
struct cursor {
        const char *start;
        const char *p;
        const char *end;
        char *why;
        size_t whysz;
};

static bool is_space(char ch)
{
        return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static bool is_digit(char ch)
{
        return ch >= '0' && ch <= '9';
}

static bool is_ident(char ch)
{
        return is_digit(ch) || ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
}

static void skip_space(struct cursor *c)
{
        while (c->p < c->end && is_space(*c->p))
                c->p++;
}

/* The next character, or -1 at the end. */
static int peek(const struct cursor *c)
{
        return c->p < c->end ? (unsigned char)*c->p : -1;
}

static int syntax(const struct cursor *c, const char *what)
{
        return fail(c->why, c->whysz, -EINVAL, "malformed .npy header: %s at offset %td", what,
                    c->p - c->start);
}

static int expect(struct cursor *c, char ch, const char *what)
{
        skip_space(c);
        if (peek(c) != (unsigned char)ch)
                return syntax(c, what);
        c->p++;
        return 0;
}

/*
 * A quoted string without escapes (none of the keys or supported descrs has one). Copies at
 * most bufsz - 1 bytes NUL-terminated into buf and the full length into *ret_len.
 */
static int parse_string(struct cursor *c, char *buf, size_t bufsz, size_t *ret_len)
{
        int quote = peek(c);
        const char *s;
        size_t n;

        if (quote != '\'' && quote != '"')
                return syntax(c, "expected a string");
        s = ++c->p;
        while (c->p < c->end && *c->p != quote) {
                if (*c->p == '\\')
                        return syntax(c, "escape sequence in string");
                /* A NUL would silently cut the copy short; Python source cannot hold one. */
                if (*c->p == '\n' || *c->p == '\r' || *c->p == '\0')
                        return syntax(c, "unterminated string");
                c->p++;
        }
        if (c->p == c->end)
                return syntax(c, "unterminated string");
        n = (size_t)(c->p - s);
        c->p++;
        memcpy(buf, s, n < bufsz ? n : bufsz - 1);
        buf[n < bufsz ? n : bufsz - 1] = '\0';
        *ret_len = n;
        return 0;
}

/* Skips a bracketed literal (a structured dtype's list), minding strings and nesting. */
static int skip_bracketed(struct cursor *c)
{
        char closers[NPY_MAX_NESTING];
        size_t depth = 0;

        do {
                char ch;

                if (c->p == c->end)
                        return syntax(c, "unterminated list");
                ch = *c->p;
                if (ch == '[' || ch == '(' || ch == '{') {
                        if (depth == NPY_MAX_NESTING)
                                return syntax(c, "nesting too deep");
                        closers[depth++] = ch == '[' ? ']' : ch == '(' ? ')' : '}';
                } else if (ch == ']' || ch == ')' || ch == '}') {
                        if (depth == 0 || closers[depth - 1] != ch)
                                return syntax(c, "mismatched bracket");
                        depth--;
                } else if (ch == '\'' || ch == '"') {
                        for (c->p++; c->p < c->end && *c->p != ch; c->p++) {
                                if (*c->p == '\\' && c->p + 1 < c->end)
                                        c->p++;
                        }
                        if (c->p == c->end)
                                return syntax(c, "unterminated string");
                }
                c->p++;
        } while (depth > 0);
        return 0;
}

/*
 * A Python int: optional sign, digits with single underscores between them, no leading
 * zeros, and the Python 2 'L' suffix numpy once wrote. *ret_overflow when beyond int64.
 */
static int parse_int(struct cursor *c, int64_t *ret, bool *ret_overflow)
{
        bool neg = false, nonzero = false, overflow = false, leading_zero;
        uint64_t v = 0;

        if (peek(c) == '+' || peek(c) == '-') {
                neg = *c->p == '-';
                c->p++;
                skip_space(c);
        }
        if (!is_digit((char)peek(c)))
                return syntax(c, "expected an integer");
        leading_zero = *c->p == '0';
        while (c->p < c->end) {
                char ch = *c->p;

                if (ch == '_') {
                        if (c->p + 1 == c->end || !is_digit(c->p[1]))
                                return syntax(c, "misplaced '_' in integer");
                        c->p++;
                        continue;
                }
                if (!is_digit(ch))
                        break;
                nonzero |= ch != '0';
                if (v > (UINT64_MAX - 9) / 10)
                        overflow = true;
                else
                        v = v * 10 + (uint64_t)(ch - '0');
                c->p++;
        }
        if (leading_zero && nonzero)
                return syntax(c, "leading zero in integer");
        if (peek(c) == 'L' || peek(c) == 'l')
                c->p++;
        if (c->p < c->end && is_ident(*c->p))
                return syntax(c, "bad integer");
        overflow |= v > INT64_MAX;
        *ret_overflow = overflow;
        *ret = overflow ? 0 : neg ? -(int64_t)v : (int64_t)v;
        return 0;
}

static int parse_bool(struct cursor *c, bool *ret)
{
        const char *s = c->p;
        size_t n;

        while (c->p < c->end && is_ident(*c->p))
                c->p++;
        n = (size_t)(c->p - s);
        if (n == 4 && memcmp(s, "True", 4) == 0)
                *ret = true;
        else if (n == 5 && memcmp(s, "False", 5) == 0)
                *ret = false;
        else
                return syntax(c, "fortran_order must be True or False");
        return 0;
}

/*
 * What a syntactically sound shape may still be wrong about. Reported only once the whole
 * dict has parsed, so that a malformed header always says so, whatever it contains.
 */
struct shape_findings {
        size_t ndim;     /* as written, possibly over NPY_MAX_NDIM */
        size_t negative; /* index + 1 of the first negative dimension, or 0 */
        size_t overflow; /* index + 1 of the first dimension beyond int64, or 0 */
};

/* A tuple of ints into info->shape (the first NPY_MAX_NDIM of them). */
static int parse_shape(struct cursor *c, struct npy_info *info, struct shape_findings *found)
{
        size_t n = 0;
        bool trailing_comma = false;
        int r;

        if (peek(c) != '(')
                return syntax(c, "shape must be a tuple");
        c->p++;
        skip_space(c);
        if (peek(c) == ')') {
                c->p++;
                info->ndim = 0;
                return 0;
        }
        for (;;) {
                int64_t dim;
                bool overflow, neg;

                skip_space(c);
                neg = peek(c) == '-';
                r = parse_int(c, &dim, &overflow);
                if (r < 0)
                        return r;
                if (overflow && !neg && !found->overflow)
                        found->overflow = n + 1;
                if (neg && (dim != 0 || overflow) && !found->negative)
                        found->negative = n + 1;
                if (n < NPY_MAX_NDIM)
                        info->shape[n] = dim;
                n++;
                skip_space(c);
                if (peek(c) == ',') {
                        c->p++;
                        skip_space(c);
                        if (peek(c) == ')') {
                                c->p++;
                                trailing_comma = true;
                                break;
                        }
                        continue;
                }
                if (peek(c) == ')') {
                        c->p++;
                        break;
                }
                return syntax(c, "expected ',' or ')' in shape");
        }
        /* (5) is just 5 in Python: numpy refuses it as a shape, and so do we. */
        if (n == 1 && !trailing_comma)
                return syntax(c, "shape is not a tuple (a 1-tuple needs a trailing comma)");
        found->ndim = n;
        info->ndim = n > NPY_MAX_NDIM ? NPY_MAX_NDIM : (int32_t)n;
        return 0;
}

/* product(shape) * itemsize, bounded to INT64_MAX so offsets stay representable in off_t. */
static int data_size(const int64_t *shape, int32_t ndim, size_t itemsize, uint64_t *ret)
{
        uint64_t bytes = itemsize;

        /* A zero anywhere makes the array empty however large the other dimensions are. */
        for (int32_t k = 0; k < ndim; k++) {
                if (shape[k] == 0) {
                        *ret = 0;
                        return 0;
                }
        }
        for (int32_t k = 0; k < ndim; k++) {
                if (__builtin_mul_overflow(bytes, (uint64_t)shape[k], &bytes) || bytes > INT64_MAX)
                        return -EOVERFLOW;
        }
        *ret = bytes;
        return 0;
}

int npy_parse_header(const char *text, size_t len, struct npy_info *ret, char *why, size_t whysz)
{
        struct cursor c = {.start = text, .p = text, .end = text + len, .why = why, .whysz = whysz};
        struct npy_info info = {0};
        char descr[NPY_TOKEN_MAX] = "";
        size_t descr_len = 0;
        bool have_descr = false, have_fortran = false, have_shape = false, structured = false;
        struct shape_findings found = {0};
        char shown[NPY_TOKEN_MAX];
        int r;

        if (!text || !ret)
                return fail(why, whysz, -EINVAL, "npy_parse_header: NULL argument");
        r = expect(&c, '{', "expected '{'");
        if (r < 0)
                return r;
        for (;;) {
                char key[NPY_TOKEN_MAX];
                size_t key_len;

                skip_space(&c);
                if (peek(&c) == '}') {
                        c.p++;
                        break;
                }
                r = parse_string(&c, key, sizeof(key), &key_len);
                if (r < 0)
                        return r;
                r = expect(&c, ':', "expected ':'");
                if (r < 0)
                        return r;
                skip_space(&c);
                if (key_len == 5 && memcmp(key, "descr", 5) == 0) {
                        if (have_descr)
                                return syntax(&c, "duplicate key 'descr'");
                        have_descr = true;
                        if (peek(&c) == '[') {
                                structured = true;
                                r = skip_bracketed(&c);
                        } else {
                                r = parse_string(&c, descr, sizeof(descr), &descr_len);
                        }
                } else if (key_len == 13 && memcmp(key, "fortran_order", 13) == 0) {
                        if (have_fortran)
                                return syntax(&c, "duplicate key 'fortran_order'");
                        have_fortran = true;
                        r = parse_bool(&c, &info.fortran_order);
                } else if (key_len == 5 && memcmp(key, "shape", 5) == 0) {
                        if (have_shape)
                                return syntax(&c, "duplicate key 'shape'");
                        have_shape = true;
                        r = parse_shape(&c, &info, &found);
                } else {
                        layout_quote(key, key_len < sizeof(key) ? key_len : sizeof(key) - 1, shown,
                                     32);
                        return fail(why, whysz, -EINVAL,
                                    "malformed .npy header: unexpected key '%s'", shown);
                }
                if (r < 0)
                        return r;
                skip_space(&c);
                if (peek(&c) == ',') {
                        c.p++;
                        continue;
                }
                if (peek(&c) == '}') {
                        c.p++;
                        break;
                }
                return syntax(&c, "expected ',' or '}'");
        }
        skip_space(&c);
        if (c.p != c.end)
                return syntax(&c, "trailing characters after the dict");
        if (!have_descr || !have_fortran || !have_shape)
                return fail(why, whysz, -EINVAL, "malformed .npy header: no '%s' key",
                            !have_descr     ? "descr"
                            : !have_fortran ? "fortran_order"
                                            : "shape");
        /* Malformed first, then what dlx cannot hold, then what does not fit 64 bits. */
        if (found.negative)
                return fail(why, whysz, -EINVAL, "malformed .npy header: dimension %zu is negative",
                            found.negative - 1);
        if (structured)
                return fail(why, whysz, -ENOTSUP,
                            "numpy structured dtype (a list descr) has no DLPack equivalent");
        if (descr_len >= sizeof(descr) ||
            npy_dtype_from_descr(descr, &info.dtype, &info.swap_bytes) < 0) {
                layout_quote(descr, descr_len < sizeof(descr) ? descr_len : sizeof(descr) - 1,
                             shown, 32);
                return fail(why, whysz, -ENOTSUP, "numpy dtype '%s'%s has no DLPack equivalent",
                            shown, descr_hint(descr));
        }
        if (found.ndim > NPY_MAX_NDIM)
                return fail(why, whysz, -ENOTSUP,
                            ".npy array has %zu dimensions; dlx supports at most %d", found.ndim,
                            NPY_MAX_NDIM);
        if (found.overflow)
                return fail(why, whysz, -EOVERFLOW,
                            ".npy shape: dimension %zu does not fit 64 bits", found.overflow - 1);
        if (data_size(info.shape, info.ndim, info.dtype.bits / 8u, &info.data_bytes) < 0)
                return fail(why, whysz, -EOVERFLOW, ".npy array size does not fit 64 bits");
        *ret = info;
        return 0;
}

/* ---- reading ---------------------------------------------------------------------------- */

static int io_error(char *err, size_t errsz, int r)
{
        return fail(err, errsz, r, "reading .npy: %s", strerror(-r));
}

int npy_read_header(int fd, struct npy_info *ret, char *why, size_t whysz)
{
        uint8_t pre[12];
        size_t len_bytes, pre_len;
        uint32_t hlen;
        ssize_t n;
        char *text;
        struct npy_info info;
        struct stat st;
        int r;

        if (!ret)
                return fail(why, whysz, -EINVAL, "npy_read_header: NULL argument");
        n = read_full(fd, pre, 8);
        if (n < 0)
                return io_error(why, whysz, (int)n);
        if (memcmp(pre, NPY_MAGIC, (size_t)n < NPY_MAGIC_LEN ? (size_t)n : NPY_MAGIC_LEN) != 0)
                return fail(why, whysz, -EINVAL, "not a .npy file (bad magic)");
        if (n < 8)
                return fail(why, whysz, -EINVAL, "truncated .npy: %zd of 8 preamble bytes", n);
        if (pre[6] == 1 && pre[7] == 0)
                len_bytes = 2;
        else if ((pre[6] == 2 || pre[6] == 3) && pre[7] == 0)
                len_bytes = 4;
        else
                return fail(why, whysz, -ENOTSUP,
                            "unsupported .npy format version %u.%u (dlx reads 1.0, 2.0 and 3.0)",
                            (unsigned)pre[6], (unsigned)pre[7]);
        n = read_full(fd, pre + 8, len_bytes);
        if (n < 0)
                return io_error(why, whysz, (int)n);
        if ((size_t)n < len_bytes)
                return fail(why, whysz, -EINVAL, "truncated .npy: no header length");
        pre_len = 8 + len_bytes;
        hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
        if (len_bytes == 4)
                hlen |= (uint32_t)pre[10] << 16 | (uint32_t)pre[11] << 24;
        if (hlen > NPY_MAX_HEADER_LEN)
                return fail(why, whysz, -EINVAL, ".npy header length %u exceeds the %u-byte limit",
                            hlen, NPY_MAX_HEADER_LEN);
        text = malloc(hlen ? hlen : 1);
        if (!text)
                return fail(why, whysz, -ENOMEM, "out of memory for the .npy header");
        n = read_full(fd, text, hlen);
        if (n < 0) {
                free(text);
                return io_error(why, whysz, (int)n);
        }
        if ((size_t)n < hlen) {
                free(text);
                return fail(why, whysz, -EINVAL, "truncated .npy: header has %zd of %u bytes", n,
                            hlen);
        }
        if (pre[6] == 3 && !layout_utf8_valid(text, hlen)) {
                free(text);
                return fail(why, whysz, -EINVAL, "malformed .npy header: invalid UTF-8");
        }
        r = npy_parse_header(text, hlen, &info, why, whysz);
        free(text);
        if (r < 0)
                return r;
        info.data_offset = pre_len + hlen;

        if (fstat(fd, &st) < 0)
                return io_error(why, whysz, -errno);
        /* Only a regular file can say how much follows; a pipe's reader finds out by reading. */
        if (S_ISREG(st.st_mode)) {
                off_t pos = lseek(fd, 0, SEEK_CUR);

                if (pos < 0)
                        return io_error(why, whysz, -errno);
                if (st.st_size < pos || (uint64_t)(st.st_size - pos) < info.data_bytes)
                        return fail(why, whysz, -EINVAL,
                                    "truncated .npy: %llu bytes of data expected, %lld present",
                                    (unsigned long long)info.data_bytes,
                                    st.st_size < pos ? 0LL : (long long)(st.st_size - pos));
        }
        *ret = info;
        return 0;
}

void npy_to_native(void *data, const struct npy_info *info)
{
        uint8_t *p = data;
        size_t width, count;

        if (!data || !info || !info->swap_bytes)
                return;
        width = info->dtype.bits / 8u;
        /* A complex number is two floats, each in the file's byte order. */
        if (info->dtype.code == kDLComplex)
                width /= 2;
        if (width < 2)
                return;
        count = info->data_bytes / width;
        for (size_t i = 0; i < count; i++, p += width) {
                switch (width) {
                case 2: {
                        uint16_t v;

                        memcpy(&v, p, 2);
                        v = __builtin_bswap16(v);
                        memcpy(p, &v, 2);
                        break;
                }
                case 4: {
                        uint32_t v;

                        memcpy(&v, p, 4);
                        v = __builtin_bswap32(v);
                        memcpy(p, &v, 4);
                        break;
                }
                case 8: {
                        uint64_t v;

                        memcpy(&v, p, 8);
                        v = __builtin_bswap64(v);
                        memcpy(p, &v, 8);
                        break;
                }
                default:
                        for (size_t a = 0, b = width - 1; a < b; a++, b--) {
                                uint8_t t = p[a];

                                p[a] = p[b];
                                p[b] = t;
                        }
                        break;
                }
        }
}

void npy_strides(const struct npy_info *info, int64_t ret_strides[NPY_MAX_NDIM])
{
        int64_t s = 1;
        int32_t ndim = info->ndim > NPY_MAX_NDIM ? NPY_MAX_NDIM : info->ndim;

        for (int32_t i = 0; i < ndim; i++) {
                int32_t k = info->fortran_order ? i : ndim - 1 - i;
                int64_t dim = info->shape[k] > 0 ? info->shape[k] : 1;

                ret_strides[k] = s;
                /* Only an empty array (a zero elsewhere) can overflow; its strides are moot. */
                if (__builtin_mul_overflow(s, dim, &s))
                        s = 1;
        }
}

/* ---- writing ---------------------------------------------------------------------------- */

/*
 * Preamble and header for the given array, padded with spaces and a newline so the data
 * starts on an NPY_ALIGN boundary. Returns a malloc'd buffer or NULL.
 */
static char *build_header(const char *descr, bool fortran_order, int32_t ndim, const int64_t *shape,
                          size_t *ret_len)
{
        /* 21 bytes per dimension: a 19-digit int64 and ", ". */
        char dict[96 + NPY_MAX_NDIM * 21];
        size_t dlen, len_bytes = 2, total, pad;
        uint32_t hlen;
        char *buf;

        dlen = (size_t)snprintf(dict, sizeof(dict),
                                "{'descr': '%s', 'fortran_order': %s, 'shape': (", descr,
                                fortran_order ? "True" : "False");
        for (int32_t k = 0; k < ndim; k++)
                dlen += (size_t)snprintf(dict + dlen, sizeof(dict) - dlen, "%s%lld", k ? ", " : "",
                                         (long long)shape[k]);
        dlen += (size_t)snprintf(dict + dlen, sizeof(dict) - dlen, "%s), }", ndim == 1 ? "," : "");
        pad = (NPY_ALIGN - (8 + len_bytes + dlen + 1) % NPY_ALIGN) % NPY_ALIGN;
        /* Format 1.0 counts the header in 16 bits; only a larger one needs 2.0. */
        if (dlen + pad + 1 > 0xffff) {
                len_bytes = 4;
                pad = (NPY_ALIGN - (8 + len_bytes + dlen + 1) % NPY_ALIGN) % NPY_ALIGN;
        }
        hlen = (uint32_t)(dlen + pad + 1);
        total = 8 + len_bytes + hlen;
        buf = malloc(total);
        if (!buf)
                return NULL;
        memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
        buf[6] = len_bytes == 2 ? 1 : 2;
        buf[7] = 0;
        for (size_t i = 0; i < len_bytes; i++)
                buf[8 + i] = (char)(hlen >> (8 * i));
        memcpy(buf + 8 + len_bytes, dict, dlen);
        memset(buf + 8 + len_bytes + dlen, ' ', pad);
        buf[total - 1] = '\n';
        *ret_len = total;
        return buf;
}

bool npy_host_memory(DLDeviceType type)
{
        return type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost;
}

/* Whether strides describe compact row-major (or, with fortran, column-major) layout. */
static bool is_contiguous(const DLTensor *t, bool fortran)
{
        int64_t expect = 1;

        for (int32_t i = 0; i < t->ndim; i++) {
                int32_t k = fortran ? i : t->ndim - 1 - i;

                /* A dimension of 1 is never stepped over, so its stride does not matter. */
                if (t->shape[k] != 1 && t->strides[k] != expect)
                        return false;
                expect *= t->shape[k];
        }
        return true;
}

/*
 * Whether every element offset sum(i_k * strides_k) * itemsize fits int64. Callers own
 * their tensors, but a wild stride must fail rather than turn into pointer arithmetic UB.
 */
bool npy_reach_fits(const DLTensor *t, size_t itemsize)
{
        int64_t lo = 0, hi = 0, step;

        for (int32_t k = 0; k < t->ndim; k++) {
                if (__builtin_mul_overflow(t->strides[k], t->shape[k] - 1, &step))
                        return false;
                if (step < 0 ? __builtin_add_overflow(lo, step, &lo)
                             : __builtin_add_overflow(hi, step, &hi))
                        return false;
        }
        return !__builtin_mul_overflow(lo, (int64_t)itemsize, &lo) &&
               !__builtin_mul_overflow(hi, (int64_t)itemsize, &hi);
}

/* Copies a strided tensor out in row-major order, NPY_GATHER_BUF bytes at a time. */
static int write_gathered(int fd, const DLTensor *t, size_t itemsize, uint64_t bytes)
{
        const char *base = (const char *)t->data + t->byte_offset;
        int64_t idx[NPY_MAX_NDIM] = {0};
        int32_t outer = t->ndim;
        int64_t off = 0;
        size_t run = itemsize, cap, used = 0;
        char *buf;
        int r = 0;

        /* A unit-stride last axis is copied a row at a time instead of element by element. */
        if (t->strides[t->ndim - 1] == 1) {
                outer = t->ndim - 1;
                run = (size_t)t->shape[t->ndim - 1] * itemsize;
        }
        cap = bytes < NPY_GATHER_BUF ? (size_t)bytes : NPY_GATHER_BUF;
        buf = malloc(cap);
        if (!buf)
                return -ENOMEM;
        for (;;) {
                const char *src = base + off * (int64_t)itemsize;
                int32_t k;

                if (run > cap - used) {
                        r = npy_write_all(fd, buf, used);
                        if (r < 0)
                                break;
                        used = 0;
                }
                if (run > cap) {
                        r = npy_write_all(fd, src, run);
                        if (r < 0)
                                break;
                } else {
                        memcpy(buf + used, src, run);
                        used += run;
                }
                for (k = outer - 1; k >= 0; k--) {
                        if (++idx[k] < t->shape[k]) {
                                off += t->strides[k];
                                break;
                        }
                        off -= t->strides[k] * (t->shape[k] - 1);
                        idx[k] = 0;
                }
                if (k < 0) {
                        r = npy_write_all(fd, buf, used);
                        break;
                }
        }
        free(buf);
        return r;
}

int npy_write_elements(int fd, const DLTensor *t, size_t itemsize, uint64_t bytes)
{
        if (!t->strides || is_contiguous(t, false))
                return npy_write_all(fd, (const char *)t->data + t->byte_offset, (size_t)bytes);
        return write_gathered(fd, t, itemsize, bytes);
}

int npy_write_fd(int fd, const DLTensor *t, char *why, size_t whysz)
{
        char descr[NPY_DESCR_MAX];
        char name[48];
        uint64_t bytes;
        size_t itemsize, hdr_len;
        bool fortran = false, gather = false;
        char *hdr;
        int r;

        if (!t)
                return fail(why, whysz, -EINVAL, "npy_write_fd: NULL tensor");
        if (t->ndim < 0)
                return fail(why, whysz, -EINVAL, "tensor has negative ndim %d", t->ndim);
        if (t->ndim > NPY_MAX_NDIM)
                return fail(why, whysz, -ENOTSUP,
                            "tensor has %d dimensions; dlx supports at most %d", t->ndim,
                            NPY_MAX_NDIM);
        if (t->ndim > 0 && !t->shape)
                return fail(why, whysz, -EINVAL, "tensor has no shape");
        if (!npy_host_memory(t->device.device_type))
                return fail(
                        why, whysz, -EINVAL,
                        "tensor is in device memory (device type %d): copy it to the host first",
                        (int)t->device.device_type);
        r = npy_descr(t->dtype, descr, sizeof(descr));
        if (r < 0) {
                layout_dtype_name(t->dtype, name, sizeof(name));
                return fail(why, whysz, r, "DLPack dtype %s has no numpy equivalent%s", name,
                            t->dtype.lanes != 1                            ? " (vector lanes)"
                            : t->dtype.bits % 8 != 0 || t->dtype.bits == 0 ? " (sub-byte)"
                                                                           : "");
        }
        itemsize = t->dtype.bits / 8u;
        for (int32_t k = 0; k < t->ndim; k++) {
                if (t->shape[k] < 0)
                        return fail(why, whysz, -EINVAL, "tensor dimension %d is negative (%lld)",
                                    k, (long long)t->shape[k]);
        }
        if (data_size(t->shape, t->ndim, itemsize, &bytes) < 0 || bytes > SIZE_MAX)
                return fail(why, whysz, -EOVERFLOW, "tensor size does not fit 64 bits");
        if (bytes > 0 && !t->data)
                return fail(why, whysz, -EINVAL, "tensor has no data");
        if (bytes > 0 && t->strides) {
                if (!npy_reach_fits(t, itemsize))
                        return fail(why, whysz, -EOVERFLOW, "tensor strides reach beyond 64 bits");
                if (!is_contiguous(t, false)) {
                        /* In one dimension both checks agree, so this is for ndim >= 2. */
                        fortran = is_contiguous(t, true);
                        gather = !fortran;
                }
        }

        hdr = build_header(descr, fortran, t->ndim, t->shape, &hdr_len);
        if (!hdr)
                return fail(why, whysz, -ENOMEM, "out of memory for the .npy header");
        r = npy_write_all(fd, hdr, hdr_len);
        free(hdr);
        if (r == 0 && bytes > 0) {
                if (gather)
                        r = write_gathered(fd, t, itemsize, bytes);
                else
                        r = npy_write_all(fd, (const char *)t->data + t->byte_offset,
                                          (size_t)bytes);
        }
        if (r < 0)
                return fail(why, whysz, r, "writing .npy: %s", strerror(-r));
        return 0;
}
