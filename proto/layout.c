/* SPDX-License-Identifier: MIT */
#include "layout.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int why(const char **ret_why, const char *text, int err)
{
        if (ret_why)
                *ret_why = text;
        return err;
}

/*
 * Decodes one UTF-8 scalar at s[0..len) into *ret_cp and its byte count.
 * Rejects overlong forms, surrogates and values past U+10FFFF.
 */
static int utf8_next(const unsigned char *s, size_t len, uint32_t *ret_cp, size_t *ret_n)
{
        uint32_t cp, min;
        size_t n;

        if (s[0] < 0x80) {
                *ret_cp = s[0];
                *ret_n = 1;
                return 0;
        } else if ((s[0] & 0xe0) == 0xc0) {
                cp = s[0] & 0x1f;
                n = 2;
                min = 0x80;
        } else if ((s[0] & 0xf0) == 0xe0) {
                cp = s[0] & 0x0f;
                n = 3;
                min = 0x800;
        } else if ((s[0] & 0xf8) == 0xf0) {
                cp = s[0] & 0x07;
                n = 4;
                min = 0x10000;
        } else {
                return -EINVAL;
        }
        if (n > len)
                return -EINVAL;
        for (size_t i = 1; i < n; i++) {
                if ((s[i] & 0xc0) != 0x80)
                        return -EINVAL;
                cp = cp << 6 | (s[i] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                return -EINVAL;
        *ret_cp = cp;
        *ret_n = n;
        return 0;
}

bool layout_utf8_valid(const char *str, size_t len)
{
        const unsigned char *s = (const unsigned char *)str;

        for (size_t i = 0; i < len;) {
                uint32_t cp;
                size_t n;

                if (s[i] < 0x80) {
                        i++;
                        continue;
                }
                if (utf8_next(s + i, len - i, &cp, &n) < 0)
                        return false;
                i += n;
        }
        return true;
}

/*
 * Code points that print nothing yet change how what follows reads: line and
 * paragraph separators, and the invisible format characters (soft hyphen,
 * bidirectional controls, zero-width characters, the byte-order mark). A
 * name with one could pass for another in `dlxctl list` or a log line.
 */
static bool invisible(uint32_t cp)
{
        return cp == 0xad || cp == 0x61c || cp == 0x180e || (cp >= 0x200b && cp <= 0x200f) ||
               (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x2064) ||
               (cp >= 0x2066 && cp <= 0x206f) || cp == 0xfeff;
}

/* Printable UTF-8: no C0 or C1 controls, no DEL, no NUL, nothing invisible(). */
static int printable_utf8(const char *str, size_t len, const char **ret_why)
{
        const unsigned char *s = (const unsigned char *)str;

        for (size_t i = 0; i < len;) {
                uint32_t cp;
                size_t n;

                /* printable ASCII, most names' every byte: nothing invisible is ASCII */
                if (s[i] >= 0x20 && s[i] < 0x7f) {
                        i++;
                        continue;
                }
                if (utf8_next(s + i, len - i, &cp, &n) < 0)
                        return why(ret_why, "not valid UTF-8", -EINVAL);
                if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f))
                        return why(ret_why, "contains a control character", -EINVAL);
                if (invisible(cp))
                        return why(ret_why,
                                   "contains an invisible character (a separator, bidirectional "
                                   "control, zero-width character or soft hyphen)",
                                   -EINVAL);
                i += n;
        }
        return 0;
}

/* Whether [s, s + len), a name's component, is empty, "." or "..": none may be. */
static int component_check(const char *s, size_t len, const char **ret_why)
{
        if (len == 0)
                return why(ret_why, "empty path component", -EINVAL);
        if (s[0] == '.' && (len == 1 || (len == 2 && s[1] == '.')))
                return why(ret_why, "'.' or '..' component", -EINVAL);
        return 0;
}

/*
 * Whether each of the 8 bytes of w is printable ASCII (0x20 to 0x7e) and not
 * '/': a name's bytes, most of the time, tested a word at a time (a group's
 * 20,000 names are checked on both sides of every publish). Each test is
 * exact for "some byte": a borrow or a carry only ever crosses from a byte
 * that the test itself flags.
 */
static inline bool plain8(uint64_t w)
{
        const uint64_t ones = UINT64_C(0x0101010101010101), highs = UINT64_C(0x8080808080808080);
        uint64_t below = (w - ones * 0x20) & ~w & highs; /* a byte below 0x20 */
        uint64_t above = ((w + ones) | w) & highs;       /* a byte above 0x7e */
        uint64_t x = w ^ (ones * '/');
        uint64_t slash = (x - ones) & ~x & highs; /* a '/' */

        return !(below | above | slash);
}

int layout_name_check(const char *name, size_t len, const char **ret_why)
{
        const unsigned char *s = (const unsigned char *)name;
        const char *cwhy = NULL;
        size_t comp = 0; /* start of the current component */
        bool ascii = true;
        int err, cerr = 0;

        if (len == 0)
                return why(ret_why, "empty name", -EINVAL);
        if (len > DLX_NAME_MAX)
                return why(ret_why, "name longer than 255 bytes", -EINVAL);
        /*
         * One pass for printable ASCII, most names' every byte; the rest are
         * decoded. Encoding errors come first, as the reasons go.
         */
        for (size_t i = 0; i < len; i++) {
                uint64_t w;
                if (len - i >= 8 && (memcpy(&w, s + i, 8), plain8(w))) {
                        i += 7; /* nothing to note in these 8 */
                        continue;
                }
                if (s[i] == '/') {
                        if (!cerr)
                                cerr = component_check(name + comp, i - comp, &cwhy);
                        comp = i + 1;
                } else if (s[i] < 0x20 || s[i] >= 0x7f) {
                        ascii = false;
                }
        }
        if (!cerr)
                cerr = component_check(name + comp, len - comp, &cwhy);
        if (!ascii && (err = printable_utf8(name, len, ret_why)) < 0)
                return err;
        return cerr ? why(ret_why, cwhy, cerr) : 0;
}

void layout_quote(const char *s, size_t len, char *buf, size_t bufsz)
{
        size_t keep = len < bufsz - 1 ? len : bufsz - 4;
        size_t i;

        for (i = 0; i < keep; i++)
                buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
        if (keep < len) {
                memcpy(buf + i, "...", 3);
                i += 3;
        }
        buf[i] = '\0';
}

int layout_prefix_check(const char *prefix, size_t len, const char **ret_why)
{
        if (len > DLX_NAME_MAX)
                return why(ret_why, "prefix longer than 255 bytes", -EINVAL);
        return printable_utf8(prefix, len, ret_why);
}

int layout_dtype_check(DLDataType dtype, const char **ret_why)
{
        unsigned bits = dtype.bits;

        if (dtype.lanes == 0)
                return why(ret_why, "dtype with zero lanes", -EINVAL);
        if (bits == 0)
                return why(ret_why, "dtype with zero bits", -EINVAL);
        switch (dtype.code) {
        case kDLInt:
        case kDLUInt:
                if (bits < 8 || bits == 16 || bits == 32 || bits == 64 || bits == 8)
                        return 0;
                break;
        case kDLFloat:
                if (bits == 16 || bits == 32 || bits == 64)
                        return 0;
                break;
        case kDLBfloat:
                if (bits == 16)
                        return 0;
                break;
        case kDLComplex:
                if (bits == 32 || bits == 64 || bits == 128)
                        return 0;
                break;
        case kDLBool:
                if (bits == 8 || bits == 1)
                        return 0;
                break;
        case kDLOpaqueHandle:
                return why(ret_why, "opaque handles are process-local and cannot be shared",
                           -EINVAL);
        case kDLFloat8_e3m4:
        case kDLFloat8_e4m3:
        case kDLFloat8_e4m3b11fnuz:
        case kDLFloat8_e4m3fn:
        case kDLFloat8_e4m3fnuz:
        case kDLFloat8_e5m2:
        case kDLFloat8_e5m2fnuz:
        case kDLFloat8_e8m0fnu:
                if (bits == 8)
                        return 0;
                break;
        case kDLFloat6_e2m3fn:
        case kDLFloat6_e3m2fn:
                if (bits == 6)
                        return 0;
                break;
        case kDLFloat4_e2m1fn:
                if (bits == 4)
                        return 0;
                break;
        default:
                return why(ret_why, "unknown dtype code", -EINVAL);
        }
        return why(ret_why, "bit width does not fit the dtype code", -EINVAL);
}

int layout_numel(int32_t ndim, const int64_t *shape, uint64_t *ret_numel)
{
        uint64_t n = 1;
        bool empty = false;

        for (int32_t i = 0; i < ndim; i++) {
                if (shape[i] < 0)
                        return -EINVAL;
                empty |= shape[i] == 0;
        }
        /* a zero dimension empties the tensor, however large the others are */
        for (int32_t i = 0; i < ndim && !empty; i++)
                if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n))
                        return -EOVERFLOW;
        if (empty)
                n = 0;
        if (n > (uint64_t)INT64_MAX)
                return -EOVERFLOW;
        *ret_numel = n;
        return 0;
}

void layout_compact_strides(int32_t ndim, const int64_t *shape, int64_t *ret_strides)
{
        int64_t s = 1;

        for (int32_t i = ndim - 1; i >= 0; i--) {
                ret_strides[i] = s;
                /* saturate rather than overflow: such a shape fails layout_numel() anyway */
                if (shape[i] > 1 && __builtin_mul_overflow(s, shape[i], &s))
                        s = INT64_MAX;
        }
}

bool layout_is_compact(int32_t ndim, const int64_t *shape, const int64_t *strides)
{
        int64_t s = 1;

        if (!strides)
                return true;
        for (int32_t i = 0; i < ndim; i++)
                if (shape[i] == 0)
                        return true; /* no element: any strides describe it */
        for (int32_t i = ndim - 1; i >= 0; i--) {
                /* a dimension of extent 1 may carry any stride */
                if (shape[i] != 1 && strides[i] != s)
                        return false;
                if (shape[i] > 1 && __builtin_mul_overflow(s, shape[i], &s))
                        return false;
        }
        return true;
}

/*
 * Sub-byte elements (bits < 8) are packed, little bit-endian, unless the
 * IS_SUBBYTE_TYPE_PADDED flag gives every lane a byte of its own.
 */
static bool padded(DLDataType dtype, uint64_t flags)
{
        return dtype.bits < 8 && (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
}

static bool packed(DLDataType dtype, uint64_t flags)
{
        return ((unsigned)dtype.bits * dtype.lanes) % 8 != 0 && !padded(dtype, flags);
}

/* Bytes per element when elements are byte-addressable. */
static uint64_t itemsize(DLDataType dtype, uint64_t flags)
{
        if (padded(dtype, flags))
                return dtype.lanes;
        return ((uint64_t)dtype.bits * dtype.lanes) / 8;
}

uint64_t layout_compact_bytes(DLDataType dtype, uint64_t numel, uint64_t flags)
{
        if (packed(dtype, flags)) {
                unsigned __int128 bits = (unsigned __int128)numel * dtype.bits * dtype.lanes;
                return (uint64_t)((bits + 7) / 8);
        }
        return numel * itemsize(dtype, flags);
}

int layout_extent(DLDataType dtype, int32_t ndim, const int64_t *shape, const int64_t *strides,
                  uint64_t byte_offset, uint64_t flags, int64_t *ret_lo, int64_t *ret_hi,
                  const char **ret_why)
{
        uint64_t numel;
        int64_t lo = 0, hi = 0, off, size;
        int err;

        if (ndim < 0 || ndim > DLX_MAX_NDIM)
                return why(ret_why, "ndim out of range", -EINVAL);
        err = layout_dtype_check(dtype, ret_why);
        if (err < 0)
                return err;
        err = layout_numel(ndim, shape, &numel);
        if (err == -EINVAL)
                return why(ret_why, "negative dimension", err);
        if (err < 0)
                return why(ret_why, "element count overflows", err);
        if (byte_offset > (uint64_t)INT64_MAX)
                return why(ret_why, "byte_offset overflows", -EOVERFLOW);
        off = (int64_t)byte_offset;
        if (numel == 0) {
                *ret_lo = *ret_hi = 0;
                return 0;
        }

        if (packed(dtype, flags)) {
                if (!layout_is_compact(ndim, shape, strides))
                        return why(ret_why, "packed sub-byte dtype with non-compact strides",
                                   -EINVAL);
                uint64_t bytes = layout_compact_bytes(dtype, numel, flags);
                if (bytes > (uint64_t)INT64_MAX || __builtin_add_overflow(off, (int64_t)bytes, &hi))
                        return why(ret_why, "extent overflows", -EOVERFLOW);
                *ret_lo = off;
                *ret_hi = hi;
                return 0;
        }

        size = (int64_t)itemsize(dtype, flags);
        for (int32_t i = 0; i < ndim; i++) {
                int64_t stride = strides ? strides[i] : 0, span;

                if (!strides) {
                        /* compact row-major: the whole extent is numel items */
                        break;
                }
                if (shape[i] <= 1)
                        continue;
                if (__builtin_mul_overflow(stride, shape[i] - 1, &span) ||
                    __builtin_mul_overflow(span, size, &span))
                        return why(ret_why, "stride extent overflows", -EOVERFLOW);
                if (span < 0 ? __builtin_add_overflow(lo, span, &lo)
                             : __builtin_add_overflow(hi, span, &hi))
                        return why(ret_why, "stride extent overflows", -EOVERFLOW);
        }
        if (!strides && __builtin_mul_overflow((int64_t)numel - 1, size, &hi))
                return why(ret_why, "extent overflows", -EOVERFLOW);
        if (__builtin_add_overflow(hi, size, &hi) || __builtin_add_overflow(hi, off, &hi) ||
            __builtin_add_overflow(lo, off, &lo))
                return why(ret_why, "extent overflows", -EOVERFLOW);
        *ret_lo = lo;
        *ret_hi = hi;
        return 0;
}

/* A DLPack dtype in words for messages: "bfloat16", "float32x4", "float8_e4m3fn". */
void layout_dtype_name(DLDataType d, char *buf, size_t bufsz)
{
        static const char *const names[] = {
                [kDLInt] = "int",
                [kDLUInt] = "uint",
                [kDLFloat] = "float",
                [kDLOpaqueHandle] = "handle",
                [kDLBfloat] = "bfloat",
                [kDLComplex] = "complex",
                [kDLBool] = "bool",
                [kDLFloat8_e3m4] = "float8_e3m4",
                [kDLFloat8_e4m3] = "float8_e4m3",
                [kDLFloat8_e4m3b11fnuz] = "float8_e4m3b11fnuz",
                [kDLFloat8_e4m3fn] = "float8_e4m3fn",
                [kDLFloat8_e4m3fnuz] = "float8_e4m3fnuz",
                [kDLFloat8_e5m2] = "float8_e5m2",
                [kDLFloat8_e5m2fnuz] = "float8_e5m2fnuz",
                [kDLFloat8_e8m0fnu] = "float8_e8m0fnu",
                [kDLFloat6_e2m3fn] = "float6_e2m3fn",
                [kDLFloat6_e3m2fn] = "float6_e3m2fn",
                [kDLFloat4_e2m1fn] = "float4_e2m1fn",
        };
        const char *name = d.code < sizeof(names) / sizeof(names[0]) ? names[d.code] : NULL;
        int n;

        if (!name)
                n = snprintf(buf, bufsz, "(code %u, %u bits)", (unsigned)d.code, (unsigned)d.bits);
        else if (d.code >= kDLFloat8_e3m4 || (d.code == kDLBool && d.bits == 8))
                /* the width is part of these names; bool is a byte by convention */
                n = snprintf(buf, bufsz, "%s", name);
        else
                n = snprintf(buf, bufsz, "%s%u", name, (unsigned)d.bits);
        if (n >= 0 && (size_t)n < bufsz && d.lanes != 1)
                snprintf(buf + n, bufsz - (size_t)n, "x%u", (unsigned)d.lanes);
}

void layout_device_name(DLDevice d, char *buf, size_t bufsz)
{
        static const char *const names[] = {
                [kDLCPU] = "cpu",
                [kDLCUDA] = "cuda",
                [kDLCUDAHost] = "cuda_host",
                [kDLOpenCL] = "opencl",
                [kDLVulkan] = "vulkan",
                [kDLMetal] = "metal",
                [kDLVPI] = "vpi",
                [kDLROCM] = "rocm",
                [kDLROCMHost] = "rocm_host",
                [kDLExtDev] = "ext_dev",
                [kDLCUDAManaged] = "cuda_managed",
                [kDLOneAPI] = "oneapi",
                [kDLWebGPU] = "webgpu",
                [kDLHexagon] = "hexagon",
                [kDLMAIA] = "maia",
                [kDLTrn] = "trn",
        };
        unsigned type = (unsigned)d.device_type;
        const char *name = type < sizeof(names) / sizeof(names[0]) ? names[type] : NULL;

        /* a type newer than this table keeps its number rather than passing for another */
        if (name)
                snprintf(buf, bufsz, "%s:%d", name, (int)d.device_id);
        else
                snprintf(buf, bufsz, "(type %u):%d", type, (int)d.device_id);
}
