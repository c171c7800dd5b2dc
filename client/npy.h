/* SPDX-License-Identifier: MIT */
/*
 * NumPy .npy files for dlxctl put/get: a header reader, an element byte
 * swapper and a writer for any host-memory DLTensor. Internal to dlxctl.
 *
 * A .npy file is:
 *
 *   "\x93NUMPY" | u8 major | u8 minor | header length (u16 LE for 1.0,
 *   u32 LE for 2.0 and 3.0) | header | array data
 *
 * where the header is a Python dict literal such as
 * {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with
 * spaces and a newline (3.0 only allows UTF-8 in it). Only the plain numeric
 * and boolean dtypes map onto DLPack; everything else is refused with -ENOTSUP.
 *
 * Error rule: -EINVAL means the file is malformed, -ENOTSUP means it is
 * well-formed but holds something dlx cannot represent (a dtype, a format
 * version, more than NPY_MAX_NDIM dimensions), -EOVERFLOW means its sizes do
 * not fit 64 bits. Where a function takes why/whysz, a one-line message is
 * written there on failure (why may be NULL; whysz 0 writes nothing).
 */
#ifndef DLX_CLIENT_NPY_H
#define DLX_CLIENT_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <dlx/dlpack.h>

/* Same as the protocol's DLX_MAX_NDIM: a file with more cannot become a dlx tensor. */
#define NPY_MAX_NDIM 32
/* Largest header a file may announce; a supported array's header is under 1 KiB. */
#define NPY_MAX_HEADER_LEN (1u << 20)
/* Room for the longest descr npy_descr() produces ("<c16") plus its NUL. */
#define NPY_DESCR_MAX 8

struct npy_info {
        DLDataType dtype; /* native-endian DLPack dtype */
        int32_t ndim;
        int64_t shape[NPY_MAX_NDIM];
        bool fortran_order;
        bool swap_bytes;      /* file is the other endianness: call npy_to_native after reading */
        uint64_t data_offset; /* where the array data starts in the file */
        uint64_t data_bytes;  /* product(shape) * itemsize, overflow-checked */
};

/*
 * Reads and validates the header from fd, which must be positioned at the
 * start of the .npy (offset 0 for a file). fd is borrowed; it may be a pipe.
 * On success fills *ret and leaves fd positioned at ret->data_offset; for a
 * regular file it also checks that data_bytes of data follow the header.
 * Returns 0;
 *   -EINVAL    malformed or truncated (bad magic, bad dict, negative dim,
 *              header over NPY_MAX_HEADER_LEN, file shorter than its data);
 *   -ENOTSUP   a dtype with no DLPack equivalent (the message names it, e.g.
 *              "numpy dtype '<U4' (unicode string) has no DLPack equivalent"),
 *              a format version other than 1.0/2.0/3.0, or ndim > NPY_MAX_NDIM;
 *   -EOVERFLOW a dimension or the data size does not fit 64 bits;
 *   -ENOMEM;   or -errno from read(), fstat() or lseek().
 * *ret is untouched on failure; the fd offset is then unspecified.
 */
int npy_read_header(int fd, struct npy_info *ret, char *why, size_t whysz);

/*
 * Parses the dict text of a header (len bytes, not NUL-terminated) into
 * dtype, ndim, shape, fortran_order, swap_bytes and data_bytes of *ret;
 * data_offset is set to 0. Sans-I/O half of npy_read_header(), same returns
 * (without the I/O ones); *ret untouched on failure. When a header has several
 * problems, -EINVAL (malformed) wins over -ENOTSUP, which wins over -EOVERFLOW.
 */
int npy_parse_header(const char *text, size_t len, struct npy_info *ret, char *why, size_t whysz);

/*
 * Maps a numpy descr ("<f4", "|b1", ">c16", "=i8") to a native-endian DLPack
 * dtype, and tells whether its elements need a byte swap on this host.
 * Returns 0, -ENOTSUP for any descr without a DLPack equivalent (or not in
 * numpy's "<kind><size>" form), or -EINVAL for a NULL argument. Outputs are
 * untouched on failure.
 */
int npy_dtype_from_descr(const char *descr, DLDataType *ret_dtype, bool *ret_swap);

/*
 * Writes the numpy descr of a dtype, in host byte order ("<f4" on little-endian,
 * "|b1" for one-byte types), into buf.
 * Returns 0, -ENOTSUP (no numpy equivalent: bfloat16, fp8/fp6/fp4, lanes > 1,
 * sub-byte or odd widths, opaque handles), -EINVAL (buf NULL) or -ERANGE
 * (bufsz too small; NPY_DESCR_MAX is always enough).
 */
int npy_descr(DLDataType dtype, char *buf, size_t bufsz);

/*
 * In-place byte swap of each element (each half of a complex) of the
 * info->data_bytes bytes at data, when info->swap_bytes; otherwise nothing.
 * data need not be aligned.
 */
void npy_to_native(void *data, const struct npy_info *info);

/*
 * Element strides (in elements, as DLTensor.strides) of the data described by
 * info: row-major, or column-major when info->fortran_order.
 */
void npy_strides(const struct npy_info *info, int64_t ret_strides[NPY_MAX_NDIM]);

/*
 * Writes tensor t as a .npy at fd's current position. t is borrowed and must
 * be in host memory (kDLCPU, kDLCUDAHost or kDLROCMHost); strides may be NULL
 * (compact row-major), negative or zero; byte_offset is honoured. C-contiguous
 * data is written as is, F-contiguous data as is with fortran_order True,
 * anything else is gathered into row-major order through a bounded buffer.
 * The file is format 1.0 (2.0 if the header would exceed 65535 bytes), with
 * the data aligned to 64 bytes as numpy does. fd is borrowed.
 * Returns 0;
 *   -EINVAL    t NULL, negative ndim or dimension, NULL shape or data, or a
 *              tensor outside host memory;
 *   -ENOTSUP   a dtype with no numpy equivalent, or ndim > NPY_MAX_NDIM;
 *   -EOVERFLOW the data size or the strides' reach does not fit 64 bits;
 *   -ENOMEM;   or -errno from write() (-EPIPE needs SIGPIPE ignored).
 * After a write error part of the file may have been written.
 */
int npy_write_fd(int fd, const DLTensor *t, char *why, size_t whysz);

/* ---- shared with the other tensor files' writers (safetensors) ---------------------------- */

/* Whether tensors of this device type are host memory the writers may read. */
bool npy_host_memory(DLDeviceType type);

/* Writes the n bytes at buf to fd, whatever the short writes. Returns 0 or -errno (-EIO). */
int npy_write_all(int fd, const void *buf, size_t n);

/*
 * Whether every element's byte offset, sum(i_k * strides_k) * itemsize, fits
 * int64: a wild stride must fail rather than turn into pointer overflow.
 * t->strides must not be NULL.
 */
bool npy_reach_fits(const DLTensor *t, size_t itemsize);

/*
 * Writes the bytes (> 0) of t's elements to fd in row-major order: as they
 * are where t is compact row-major, else gathered through a bounded buffer
 * (a unit-stride last axis a row at a time). t's strides must pass
 * npy_reach_fits(). Returns 0, -ENOMEM or -errno.
 */
int npy_write_elements(int fd, const DLTensor *t, size_t itemsize, uint64_t bytes);

#endif /* DLX_CLIENT_NPY_H */
