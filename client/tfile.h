/* SPDX-License-Identifier: MIT */
/*
 * A tensor file: the named tensors of one multi-tensor file (safetensors,
 * .npz), as client/safetensors.h and client/npz.h read and write them for
 * dlxctl put/get of a tensor group. Internal to dlxctl.
 *
 * A struct tfile owns everything its members point at: names, shapes,
 * strides and the data (a private read-only mapping of the file for
 * safetensors, a private read-write mapping of decompressed data for .npz).
 * Members are sorted by name (strcmp order) and their names are unique.
 * Readers and writers share one error rule, npy.h's: -EINVAL malformed,
 * -ENOTSUP well-formed but not representable in dlx, -EOVERFLOW a size that
 * does not fit 64 bits; a one-line message goes to why/whysz on failure.
 */
#ifndef DLX_CLIENT_TFILE_H
#define DLX_CLIENT_TFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <dlx/dlpack.h>

/* Longest member name, in bytes; names are 1..TFILE_NAME_MAX bytes of UTF-8 without NUL. */
#define TFILE_NAME_MAX 255
/* Most members a file may hold: a bound on what a hostile header can make us allocate. */
#define TFILE_MAX_MEMBERS (1u << 20)
/* Most dimensions of a member: the protocol's DLX_MAX_NDIM, as NPY_MAX_NDIM. */
#define TFILE_MAX_NDIM 32

struct tfile_member {
        const char *name; /* NUL-terminated */
        /*
         * Host memory (kDLCPU). Read from a file: data points into memory the
         * tfile owns (not necessarily aligned for safetensors; 64-byte
         * aligned for .npz), byte_offset 0, strides NULL (compact row-major)
         * or, for a Fortran-order .npy member only, column-major strides.
         * Given to a writer: any host DLTensor, any strides and byte_offset.
         */
        DLTensor tensor;
        uint64_t nbytes; /* product(shape) * itemsize: the bytes of its data */
};

struct tfile {
        size_t n;
        struct tfile_member *members; /* n of them, sorted by name */

        /* Private to tfile.c, safetensors.c and npz.c. */
        void *map; /* the data's mapping, munmap()ed by tfile_free(), or NULL */
        size_t map_len;
        int64_t *dims; /* shapes and strides of all members, back to back */
        size_t dims_used, dims_cap;
        char *names; /* names of all members, NUL-terminated, back to back */
        size_t names_used, names_cap;
};

/* Frees t and everything it owns (the members' data included). NULL-safe. */
void tfile_free(struct tfile *t);

/* ---- for the readers and writers ---------------------------------------------------------- */

/*
 * A tfile for n members (zeroed) with room for ndims int64 dimensions and
 * name_bytes bytes of names (their NULs included). Returns NULL on ENOMEM.
 */
struct tfile *tfile_new(size_t n, size_t ndims, size_t name_bytes);

/* count dimensions from t's pool (their room was promised to tfile_new()); NULL if it is out. */
int64_t *tfile_dims(struct tfile *t, size_t count);

/* A copy of the len bytes at name, NUL-terminated, in t's pool; NULL if it is out. */
const char *tfile_name(struct tfile *t, const char *name, size_t len);

/* Sorts t's members by name; -EINVAL (the message names it) if two have the same name. */
int tfile_sort(struct tfile *t, char *why, size_t whysz);

/*
 * Checks a member name: 1..TFILE_NAME_MAX bytes of valid UTF-8 without NUL.
 * Returns 0 or -EINVAL with a static reason in *ret_why.
 */
int tfile_name_check(const char *name, size_t len, const char **ret_why);

/*
 * Sorts the indices 0..n-1 of members by name into ret_order (n of them) and
 * checks each name with tfile_name_check(), and that no two are the same.
 * Returns 0 or -EINVAL (the message names the member).
 */
int tfile_check_names(const struct tfile_member *members, size_t n, size_t *ret_order, char *why,
                      size_t whysz);

/* Formats the message into why (if why && whysz) and returns code. */
int tfile_fail(char *why, size_t whysz, int code, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

#endif /* DLX_CLIENT_TFILE_H */
