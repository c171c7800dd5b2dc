/* SPDX-License-Identifier: MIT */
/*
 * Tensors for the integration suites that move bytes between processes
 * (test-dtypes, test-exchange): a byte pattern over any dtype and layout,
 * tensors over malloc'd memory whose deleter counts its runs, and a consumer
 * that acquires a name in a child process (fx_spawn) with a client of its own
 * and checks everything it finds against an expectation.
 */
#ifndef DLX_TESTS_TENSORS_H
#define DLX_TESTS_TENSORS_H

#include <stdbool.h>
#include <stdint.h>

#include <dlx/dlx.h>

#define DT(code, bits, lanes) ((DLDataType){(uint8_t)(code), (uint8_t)(bits), (uint16_t)(lanes)})

/* Bytes per element, or 0 for packed sub-byte dtypes (which are addressed as whole bytes). */
uint64_t elem_size(DLDataType dt, uint64_t flags);
uint64_t numel_of(int32_t ndim, const int64_t *shape);
/* Bytes of a packed tensor: numel * bits * lanes, rounded up to whole bytes. */
uint64_t packed_bytes(DLDataType dt, uint64_t numel);

/* Writes the pattern for seed over every byte the elements of t cover (flags: the tensor's). */
void pattern_fill(const DLTensor *t, uint64_t flags, uint8_t seed);
/* The number of bytes of t that differ from the pattern for seed (0: all as written). */
uint64_t pattern_check(const DLTensor *t, uint64_t flags, uint8_t seed);

/* Whether t's strides (NULL: compact) are row-major compact. */
bool is_compact(const DLTensor *t);

/* Runs of owned tensors' deleters (each test is a process: it starts at 0). */
extern int deleter_runs;

/* A tensor over malloc'd memory whose deleter counts its runs (and poisons the bytes). */
struct owned {
        DLManagedTensorVersioned mt;
        void *buf;
        size_t bufsize;
        int64_t shape[DLX_MAX_NDIM + 1];
        int64_t strides[DLX_MAX_NDIM + 1];
};

/*
 * A CPU tensor over a malloc'd buffer of bufsize bytes whose data pointer sits
 * data_at bytes into it (bufsize 0: data NULL). strides may be NULL.
 */
struct owned *owned_new(DLDataType dt, int32_t ndim, const int64_t *shape, const int64_t *strides,
                        uint64_t byte_offset, uint64_t flags, size_t bufsize, size_t data_at);
/* A compact owned tensor, filled with the pattern for seed. */
struct owned *owned_compact(DLDataType dt, int32_t ndim, const int64_t *shape, uint64_t flags,
                            uint8_t seed);
/* The same, rows x cols. */
DLManagedTensorVersioned *owned_2d(DLDataType dt, int64_t rows, int64_t cols, uint8_t seed);

/* dlx_alloc() of a CPU tensor; the test fails if it cannot be had. */
DLManagedTensorVersioned *alloc_or_fail(dlx_client *c, DLDataType dt, int32_t ndim,
                                        const int64_t *shape);

/* What a consumer must find under a name. */
struct expect {
        const char *name;
        DLDataType dtype;
        int32_t ndim;
        int64_t shape[DLX_MAX_NDIM];
        /* exact: strides and byte_offset must match; else only the values are checked */
        bool exact;
        int64_t strides[DLX_MAX_NDIM];
        uint64_t byte_offset;
        uint64_t flags; /* exactly the acquired flags */
        uint8_t seed;
        uint64_t version; /* 0: any */
        /* after checking, write the bytes of the pattern for write_seed through the mapping */
        bool write;
        uint8_t write_seed;
};

/* The expectation for a tensor as published (its layout exactly, or values only). */
struct expect expect_of(const char *name, const DLManagedTensorVersioned *mt, bool exact,
                        bool writable, uint8_t seed);
/* A compact, read-only rows x cols tensor of dt, exactly so. */
struct expect expect_2d(const char *name, DLDataType dt, int64_t rows, int64_t cols, uint8_t seed);

/*
 * In a child: says what went wrong on stderr and, under consume_in_child(),
 * to the parent; returns 1 (the child's exit status).
 */
__attribute__((format(printf, 1, 2))) int child_fail(const char *fmt, ...);

/* Runs the consumer for e in a child and requires it to succeed (a failure quotes the child's). */
void consume_in_child(const struct expect *e);

#endif /* DLX_TESTS_TENSORS_H */
