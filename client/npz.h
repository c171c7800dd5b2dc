/* SPDX-License-Identifier: MIT */
/*
 * NumPy .npz files for dlxctl put/get of a tensor group: a validating reader
 * and a writer. Internal to dlxctl. The zip container is libzip's; each
 * member's .npy header and byte order are client/npy.c's.
 *
 * An .npz is a zip archive of NAME.npy entries, stored (np.savez) or
 * deflated (np.savez_compressed); numpy.load() names each array NAME.
 *
 * Error rule (tfile.h, npy.h): -EINVAL malformed, -ENOTSUP well-formed but
 * not representable, -EOVERFLOW a size that does not fit 64 bits. A one-line
 * message goes to why (may be NULL; whysz 0 writes nothing) on failure; it
 * names the entry at fault.
 */
#ifndef DLX_CLIENT_NPZ_H
#define DLX_CLIENT_NPZ_H

#include <stddef.h>

#include "tfile.h"

/*
 * Most bytes deflate can expand one compressed byte into (zlib's own bound,
 * about 1032:1): an entry declaring more than this ratio lies, and is refused
 * before anything is allocated for it.
 */
#define NPZ_MAX_DEFLATE_RATIO 1032u

/*
 * Opens and validates the .npz at path. On success *ret is a new tfile (free
 * it with tfile_free()) with one member per entry, named as the entry without
 * ".npy" and sorted by name. Every entry is decompressed into memory the
 * tfile owns (one private mapping; no descriptor stays open), each array's
 * data 64-byte aligned and writable; big-endian arrays are byte-swapped to
 * native; a Fortran-order array (ndim >= 2) becomes a strided view: its
 * tensor has column-major strides, others have strides NULL. The memory
 * taken is the sum of the entries' declared sizes, each checked against its
 * compressed size (stored: equal; deflated: at most NPZ_MAX_DEFLATE_RATIO
 * times) and against the bytes the entry really holds.
 * Returns 0;
 *   -EINVAL    not a regular file; not a zip or an inconsistent one
 *              (libzip's checks, ZIP_CHECKCONS); more than TFILE_MAX_MEMBERS
 *              entries; an entry not named NAME.npy with a NAME that
 *              tfile_name_check() accepts; two entries with one name; a
 *              declared size that lies (about the compressed size, about the
 *              bytes the entry holds, or about its .npy: header plus data
 *              must be exactly the entry); a CRC or deflate error; a malformed
 *              .npy (npy_read_header()'s -EINVAL cases);
 *   -ENOTSUP   an encrypted entry, a compression method other than stored or
 *              deflated, or a .npy that npy_read_header() refuses as
 *              unsupported (object, string and other dtypes, ndim > 32);
 *   -EOVERFLOW the entries' total size, or a .npy's, over 64 bits;
 *   -ENOMEM;   or -errno from open(), fstat(), mmap() or memfd_create().
 * *ret is untouched on failure.
 */
int npz_open(const char *path, struct tfile **ret, char *why, size_t whysz);

/*
 * Writes the n members as an .npz at path (created, or replaced: libzip
 * writes a temporary file beside it and renames it over path), one stored
 * (uncompressed) NAME.npy entry per member written by npy_write_fd(), in name
 * order; numpy.load() reads it. Tensors are borrowed, as npy_write_fd()
 * takes them (host memory, any strides). The .npy bodies are staged in an
 * unnamed temporary file in path's directory (a memfd where O_TMPFILE is not
 * supported) before libzip copies them in: the disk briefly holds the data
 * twice. An empty set writes an empty archive, as np.savez() does.
 * Returns 0;
 *   -EINVAL    path NULL, members NULL with n > 0, n over TFILE_MAX_MEMBERS,
 *              a name refused by tfile_name_check(), two members with one
 *              name, or a tensor npy_write_fd() refuses as invalid;
 *   -ENOTSUP   a dtype with no numpy equivalent (bfloat16, fp8), ndim > 32;
 *   -EOVERFLOW a tensor's size or strides over 64 bits;
 *   -ENOMEM;   -errno of a failed system call; or -EIO for a libzip failure
 *              without one. On failure path is left as it was, unless the
 *              final rename failed half-way.
 */
int npz_write(const char *path, const struct tfile_member *members, size_t n, char *why,
              size_t whysz);

#endif /* DLX_CLIENT_NPZ_H */
