/* SPDX-License-Identifier: MIT */
/*
 * What the fuzz targets share: reading an input field by field, descriptors of
 * every kind a peer could attach, counting open fds, and a check that aborts
 * (so that libFuzzer keeps the input) when an invariant breaks.
 *
 * Each target defines LLVMFuzzerTestOneInput(). Built with -Dfuzz=enabled it
 * links libFuzzer; otherwise replay-main.c runs it over files, so that the
 * inputs kept in tests/fuzz/regressions/ replay in every build.
 */
#ifndef DLX_TESTS_FUZZ_H
#define DLX_TESTS_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An input read front to back; reading past its end gives zeros and nothing more. */
struct fuzz_input {
        const uint8_t *p;
        size_t left;
};

uint8_t fuzz_u8(struct fuzz_input *in);
/* Little endian, as the seed generator writes them. */
uint16_t fuzz_u16(struct fuzz_input *in);
uint32_t fuzz_u32(struct fuzz_input *in);
uint64_t fuzz_u64(struct fuzz_input *in);
/* Up to n bytes, borrowed from the input: returns how many there are. */
size_t fuzz_bytes(struct fuzz_input *in, size_t n, const uint8_t **ret);

void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
        __attribute__((noreturn, format(printf, 4, 5)));

/* An invariant: aborts with the condition and a message when it does not hold. */
#define FUZZ_CHECK(cond, ...)                                                                      \
        do {                                                                                       \
                if (!(cond))                                                                       \
                        fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                         \
        } while (0)

/* Descriptors this process has open (a scan of /proc/self/fd, not counting its own). */
int fuzz_count_fds(void);
/* True when fd is not open (EBADF). */
bool fuzz_fd_is_closed(int fd);

/*
 * Kinds of descriptor a peer may attach, chosen by one input byte: the low 4
 * bits pick the kind, the high 4 a parameter. Memfd sizes are a size class,
 * param & 7: 1, 24, 4096 bytes, 64 KiB, 1 MiB, 16 MiB, 1 GiB, 1 TiB. Every fd
 * is close-on-exec.
 */
enum fuzz_fd_kind {
        FUZZ_FD_MEMFD = 0,     /* sealed against shrink and grow; param & 8: write-sealed too */
        FUZZ_FD_MEMFD_RO = 1,  /* the same, reopened read-only */
        FUZZ_FD_MEMFD_WO = 2,  /* the same, reopened write-only */
        FUZZ_FD_UNSEALED = 3,  /* memfd without seals (param & 8: shrink only) */
        FUZZ_FD_NOSEAL = 4,    /* memfd made without MFD_ALLOW_SEALING */
        FUZZ_FD_EMPTY = 5,     /* sealed memfd of size 0 */
        FUZZ_FD_PIPE = 6,      /* param & 1: the write end */
        FUZZ_FD_SOCKET = 7,    /* connected AF_UNIX stream socket */
        FUZZ_FD_DEVNULL = 8,   /* /dev/null */
        FUZZ_FD_DIR = 9,       /* "/" (param & 1: an O_PATH fd instead) */
        FUZZ_FD_EVENTFD = 10,  /* eventfd */
        FUZZ_FD_TMPFILE = 11,  /* regular tmpfile in /tmp, not a memfd */
        FUZZ_FD_FUTURE = 12,   /* sealed memfd with F_SEAL_FUTURE_WRITE */
        FUZZ_FD_TIMERFD = 13,  /* timerfd */
        FUZZ_FD_UNBOUND = 14,  /* unconnected AF_UNIX socket */
        FUZZ_FD_MEMFD_BIG = 15 /* sealed memfd of 1 TiB, 1 TiB + 4 KiB, 1 PiB or 3 bytes */
};

/* The fd kind byte for a kind and its parameter. */
#define FUZZ_FD(kind, param) ((uint8_t)((kind) | (param) << 4))

/* A new fd of the kind byte says; -1 when the system refused (the caller attaches none). */
int fuzz_make_fd(uint8_t byte);

/* Operations of a fuzz-frame input (fuzz-frame.c says what each reads). */
enum frame_op {
        FRAME_OP_BYTES,
        FRAME_OP_REPEAT,
        FRAME_OP_HEADER,
        FRAME_OP_FDS,
        FRAME_OP_CMSG,
        FRAME_OP_SPACE,
        FRAME_OP_COUNT
};

/* Operations of a fuzz-session input (fuzz-session.c): the byte is kind << 2 | peer. */
enum session_op {
        SESSION_OP_DATA,
        SESSION_OP_FDS,
        SESSION_OP_POST,
        SESSION_OP_HEAD,
        SESSION_OP_SWEEP,
        SESSION_OP_TICK,
        SESSION_OP_CLOSE,
        SESSION_OP_STALL,
        SESSION_OP_REQUEST,
        SESSION_OP_COUNT
};

#endif /* DLX_TESTS_FUZZ_H */
