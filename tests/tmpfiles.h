/* SPDX-License-Identifier: MIT */
/*
 * What the suites that work on files (test-npy, test-npz, test-safetensors,
 * test-dlxctl, test-group-files) share: a mkdtemp directory per test, removed
 * with what is in it, the files in it, and host tensors with a reference
 * gather that is deliberately not the writers' own loop.
 */
#ifndef DLX_TESTS_TMPFILES_H
#define DLX_TESTS_TMPFILES_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include <dlx/dlpack.h>

/* The current test's directory, made by tmpdir_make(). */
extern char tmpdir[PATH_MAX];

/* Makes $TMPDIR/dlx-<tag>-XXXXXX (TMPDIR unset: /tmp): a suite's setup. */
void tmpdir_make(const char *tag);
/* Removes it, with everything in it: a suite's teardown. */
void tmpdir_remove(void);
/* Removes path and everything under it; the test fails if it is still there. */
void remove_tree(const char *path);
/* tmpdir/name, in one of four static buffers used in turn: a call may take several. */
const char *path_of(const char *name);
/* Creates (or truncates) path with the n bytes at buf, or the test fails. */
void write_file(const char *path, const void *buf, size_t n);
/* The whole file at path, NUL-terminated for text searches; *ret_len excludes the NUL. Free it. */
uint8_t *slurp(const char *path, size_t *ret_len);
/* Creates (or truncates) tmpdir/name for reading and writing; the test fails if it cannot. */
int open_new(const char *name);
/* Writes n bytes to fd, all of them, or the test fails. */
void put(int fd, const void *buf, size_t n);
/*
 * Mappings in /proc/self/maps of the test's files, or whose name holds also
 * (NULL: none): what a failed open must not leave behind.
 */
int count_maps(const char *also);

/* A host (kDLCPU) tensor over data. */
DLTensor host_tensor(void *data, DLDataType dtype, int32_t ndim, int64_t *shape, int64_t *strides,
                     uint64_t byte_offset);
/* Its elements: the product of its shape. */
size_t numel(const DLTensor *t);
/* Copies t's elements to out in row-major order, by flat-index decomposition. */
void naive_gather(const DLTensor *t, void *out);

#endif /* DLX_TESTS_TMPFILES_H */
