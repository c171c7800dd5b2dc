/* SPDX-License-Identifier: MIT */
/*
 * safetensors files for dlxctl put/get of a tensor group: a validating
 * reader that maps the file, and a writer for host DLTensors. Internal to
 * dlxctl. The JSON is jansson's.
 *
 * A safetensors file is:
 *
 *   u64 LE header length N | N bytes of UTF-8 JSON | data area
 *
 * where the JSON is an object mapping each tensor's name to
 * {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, offsets
 * relative to the start of the data area, data compact row-major and
 * little-endian, plus an optional "__metadata__" object of string values.
 * As in the reference implementation (huggingface/safetensors), the
 * tensors' regions must tile the data area exactly: no overlap, no gap, no
 * trailing bytes.
 *
 * Error rule (tfile.h, npy.h): -EINVAL malformed, -ENOTSUP well-formed but
 * not representable (a dtype, more than TFILE_MAX_NDIM dimensions),
 * -EOVERFLOW a size that does not fit 64 bits. When a file has several
 * problems, -EINVAL wins over -ENOTSUP, which wins over -EOVERFLOW. A one-line
 * message goes to why (may be NULL; whysz 0 writes nothing) on failure.
 */
#ifndef DLX_CLIENT_SAFETENSORS_H
#define DLX_CLIENT_SAFETENSORS_H

#include <stddef.h>

#include <dlx/dlpack.h>

#include "tfile.h"

/* Largest header accepted or written: the reference implementation's 100,000,000 bytes. */
#define ST_MAX_HEADER_LEN 100000000u

/*
 * Opens and validates the safetensors file at path and maps it read-only
 * (MAP_PRIVATE, PROT_READ; no descriptor stays open). On success *ret is a
 * new tfile (free it with tfile_free()) whose members' data point into the
 * mapping: read-only, little-endian as stored (dlx runs on little-endian
 * hosts), and not necessarily aligned. Truncating the file while it is
 * mapped makes reading the lost pages raise SIGBUS, as with any mapping.
 * __metadata__ is checked (an object of strings) and dropped.
 * Returns 0;
 *   -EINVAL    not a regular file; truncated; header length over
 *              ST_MAX_HEADER_LEN or beyond the file; header not a JSON object
 *              (or invalid UTF-8, or a duplicate name); a tensor entry not
 *              exactly {dtype, shape, data_offsets}; a shape not an array of
 *              non-negative integers; data_offsets not [begin, end] with
 *              begin <= end <= the data area; a size that disagrees with
 *              end - begin; regions that overlap, leave a gap or do not reach
 *              the end of the file; a name empty, over TFILE_NAME_MAX bytes or
 *              holding a NUL; more than TFILE_MAX_MEMBERS tensors;
 *   -ENOTSUP   a dtype dlx cannot represent (the message names it: sub-byte
 *              F4/F6, or an unknown one), or more than TFILE_MAX_NDIM dims;
 *   -EOVERFLOW a number in the header or a tensor's byte size over 64 bits;
 *   -ENOMEM;   or -errno from open(), fstat() or mmap().
 * *ret is untouched on failure.
 */
int st_open(const char *path, struct tfile **ret, char *why, size_t whysz);

/*
 * Writes the n members as a safetensors file at fd's current position (fd
 * borrowed). Each tensor is borrowed and must be in host memory (kDLCPU,
 * kDLCUDAHost, kDLROCMHost); strides may be NULL, negative or zero and
 * byte_offset is honoured: elements are written in row-major order. As the
 * reference writer does, tensors are laid out by decreasing alignment then
 * name, and the header is padded with spaces to a multiple of 8 bytes, so
 * that each tensor's data is aligned to its element size. No __metadata__
 * is written.
 * Returns 0;
 *   -EINVAL    members NULL with n > 0, n over TFILE_MAX_MEMBERS, a name
 *              refused by tfile_name_check() or "__metadata__", two members
 *              with one name, a negative ndim or dimension, NULL shape or
 *              data, a tensor outside host memory, a header over
 *              ST_MAX_HEADER_LEN;
 *   -ENOTSUP   a dtype safetensors cannot name (st_dtype_name() returns NULL),
 *              or ndim > TFILE_MAX_NDIM;
 *   -EOVERFLOW a size, the total or a tensor's strides' reach over 63 bits;
 *   -ENOMEM;   or -errno from write() (-EPIPE needs SIGPIPE ignored).
 * After a write error part of the file may have been written.
 */
int st_write(int fd, const struct tfile_member *members, size_t n, char *why, size_t whysz);

/* The safetensors name of a dtype ("F32", "BF16", "F8_E4M3"), or NULL if it has none. */
const char *st_dtype_name(DLDataType dtype);

/*
 * The DLPack dtype of a safetensors dtype name of len bytes. Returns 0 or
 * -ENOTSUP (unknown, or sub-byte F4/F6); *ret untouched on failure.
 */
int st_dtype_from_name(const char *name, size_t len, DLDataType *ret);

#endif /* DLX_CLIENT_SAFETENSORS_H */
