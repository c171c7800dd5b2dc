/* SPDX-License-Identifier: MIT */
/*
 * Tests for proto/frame.c: the header codec and the sans-I/O frame reader.
 * Bytes are fed through frame_reader_space()/frame_reader_commit() exactly as
 * the connection code does after recvmsg(), in every chunking we can think
 * of, and fds are real descriptors so that "closed" can be checked with
 * fcntl(F_GETFD).
 */
#include "frame.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "toolkit.h"

static bool fd_is_closed(int fd)
{
        errno = 0;
        return fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

static int count_open_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        int n = 0;

        ck_assert_ptr_nonnull(d);
        while ((e = readdir(d)))
                if (e->d_name[0] != '.')
                        n++;
        closedir(d);
        return n - 1; /* the directory's own fd */
}

static int new_fd(void)
{
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

        ck_assert_int_ge(fd, 0);
        return fd;
}

/* Writes one frame (header + payload) into out; returns its total size. */
static size_t build_frame(uint8_t *out, const uint8_t *payload, uint32_t len, unsigned nfds)
{
        frame_header_put(out, len, nfds);
        if (len)
                memcpy(out + FRAME_HEADER_SIZE, payload, len);
        return FRAME_HEADER_SIZE + (size_t)len;
}

/* Copies n bytes into the reader the way the connection does after recvmsg(). */
static void feed(struct frame_reader *r, const uint8_t *data, size_t n)
{
        while (n > 0) {
                uint8_t *p;
                size_t avail;

                ck_assert_int_eq(frame_reader_space(r, &p, &avail), 0);
                expect(avail > 0, "avail %zu", avail);
                size_t k = n < avail ? n : avail;
                memcpy(p, data, k);
                frame_reader_commit(r, k);
                data += k;
                n -= k;
        }
}

static void fill_pattern(uint8_t *buf, size_t n, uint32_t seed)
{
        for (size_t i = 0; i < n; i++)
                buf[i] = (uint8_t)(seed * 31u + i * 7u + (i >> 8));
}

/* ---- header ------------------------------------------------------------------------------- */

START_TEST(test_header_roundtrip)
{
        static const struct {
                uint32_t len;
                unsigned nfds;
        } cases[] = {
                {0, 0},
                {1, 1},
                {255, 2},
                {256, 3},
                {0x12345, 4},
                {DLX_MAX_FRAME, 0},
                {DLX_MAX_FRAME - 1, DLX_MAX_FDS_PER_FRAME},
        };

        for (size_t i = 0; i < N_ELEMS(cases); i++) {
                uint8_t hdr[FRAME_HEADER_SIZE];
                uint32_t len = 0xdeadbeef;
                unsigned nfds = 0xdead;

                memset(hdr, 0xaa, sizeof(hdr));
                frame_header_put(hdr, cases[i].len, cases[i].nfds);
                ck_assert_int_eq(frame_header_get(hdr, &len, &nfds), 0);
                ck_assert_uint_eq(len, cases[i].len);
                ck_assert_uint_eq(nfds, cases[i].nfds);
                ck_assert_uint_eq(hdr[6], 0);
                ck_assert_uint_eq(hdr[7], 0);
        }
}
END_TEST

START_TEST(test_header_layout)
{
        uint8_t hdr[FRAME_HEADER_SIZE];
        static const uint8_t want[FRAME_HEADER_SIZE] = {0x04, 0x03, 0x02, 0x00, 0x03, 0x00, 0, 0};

        /* little-endian u32 length, u16 fd count, u16 reserved */
        frame_header_put(hdr, 0x020304, 3);
        ck_assert_mem_eq(hdr, want, sizeof(want));
}
END_TEST

START_TEST(test_header_too_long)
{
        uint8_t hdr[FRAME_HEADER_SIZE];
        uint32_t len = 7;
        unsigned nfds = 9;

        frame_header_put(hdr, DLX_MAX_FRAME + 1, 0);
        ck_assert_int_eq(frame_header_get(hdr, &len, &nfds), -EMSGSIZE);
        frame_header_put(hdr, UINT32_MAX, 1);
        ck_assert_int_eq(frame_header_get(hdr, &len, &nfds), -EMSGSIZE);
        /* out-params untouched on failure */
        ck_assert_uint_eq(len, 7);
        ck_assert_uint_eq(nfds, 9);
}
END_TEST

START_TEST(test_header_too_many_fds)
{
        uint8_t hdr[FRAME_HEADER_SIZE];
        uint32_t len = 7;
        unsigned nfds = 9;

        frame_header_put(hdr, 16, DLX_MAX_FDS_PER_FRAME + 1);
        ck_assert_int_eq(frame_header_get(hdr, &len, &nfds), -E2BIG);
        frame_header_put(hdr, 16, 0xffff);
        ck_assert_int_eq(frame_header_get(hdr, &len, &nfds), -E2BIG);
        /* a high byte in the fd count must not wrap to a small number */
        frame_header_put(hdr, 16, 0x100);
        ck_assert_int_eq(frame_header_get(hdr, &len, &nfds), -E2BIG);
        ck_assert_uint_eq(len, 7);
        ck_assert_uint_eq(nfds, 9);
}
END_TEST

START_TEST(test_header_reserved)
{
        for (int byte = 6; byte < 8; byte++) {
                for (int bit = 0; bit < 8; bit++) {
                        uint8_t hdr[FRAME_HEADER_SIZE];
                        uint32_t len = 7;
                        unsigned nfds = 9;

                        frame_header_put(hdr, 16, 1);
                        hdr[byte] = (uint8_t)(1u << bit);
                        ck_assert_int_eq(frame_header_get(hdr, &len, &nfds), -EPROTO);
                        ck_assert_uint_eq(len, 7);
                        ck_assert_uint_eq(nfds, 9);
                }
        }
}
END_TEST

/* ---- reader: byte streams ----------------------------------------------------------------- */

START_TEST(test_reader_single_frame)
{
        struct frame_reader r;
        struct frame f;
        uint8_t buf[64], payload[20];

        fill_pattern(payload, sizeof(payload), 1);
        size_t n = build_frame(buf, payload, sizeof(payload), 0);
        ck_assert_int_eq(frame_reader_init(&r), 0);
        ck_assert_uint_eq(frame_reader_pending(&r), 0);
        ck_assert_int_eq(frame_reader_next(&r, &f), 0);
        feed(&r, buf, n);
        ck_assert_uint_eq(frame_reader_pending(&r), n);
        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_uint_eq(f.len, sizeof(payload));
        ck_assert_uint_eq(f.nfds, 0);
        ck_assert_mem_eq(f.payload, payload, sizeof(payload));
        ck_assert_uint_eq(frame_reader_pending(&r), 0);
        ck_assert_int_eq(frame_reader_next(&r, &f), 0);
        frame_reader_done(&r);
}
END_TEST

START_TEST(test_reader_byte_by_byte)
{
        enum { NFRAMES = 40 };
        static uint8_t stream[NFRAMES * (FRAME_HEADER_SIZE + 300)];
        size_t ends[NFRAMES], total = 0;
        uint32_t lens[NFRAMES];
        struct frame_reader r;
        int got = 0;

        for (int i = 0; i < NFRAMES; i++) {
                uint8_t payload[300];

                lens[i] = (uint32_t)((i * 37) % 300);
                if (i % 5 == 0)
                        lens[i] = 0;
                fill_pattern(payload, lens[i], (uint32_t)i);
                total += build_frame(stream + total, payload, lens[i], 0);
                ends[i] = total;
        }

        ck_assert_int_eq(frame_reader_init(&r), 0);
        for (size_t pos = 0; pos < total; pos++) {
                struct frame f;
                int rc;

                feed(&r, stream + pos, 1);
                rc = frame_reader_next(&r, &f);
                if (got < NFRAMES && pos + 1 == ends[got]) {
                        uint8_t want[300];

                        expect(rc == 1, "frame %d at byte %zu: rc %d", got, pos, rc);
                        expect(f.len == lens[got], "frame %d len %u", got, f.len);
                        expect(f.nfds == 0, "frame %d nfds %u", got, f.nfds);
                        fill_pattern(want, lens[got], (uint32_t)got);
                        expect(f.len == 0 || memcmp(f.payload, want, f.len) == 0,
                               "frame %d payload", got);
                        expect(frame_reader_pending(&r) == 0, "pending %zu",
                               frame_reader_pending(&r));
                        got++;
                        ck_assert_int_eq(frame_reader_next(&r, &f), 0);
                } else {
                        size_t start = got ? ends[got - 1] : 0;

                        expect(rc == 0, "byte %zu: rc %d", pos, rc);
                        expect(frame_reader_pending(&r) == pos + 1 - start, "byte %zu: pending %zu",
                               pos, frame_reader_pending(&r));
                }
        }
        ck_assert_int_eq(got, NFRAMES);
        frame_reader_done(&r);
}
END_TEST

START_TEST(test_reader_zero_length)
{
        struct frame_reader r;
        struct frame f;
        uint8_t buf[3 * FRAME_HEADER_SIZE];

        for (int i = 0; i < 3; i++)
                frame_header_put(buf + i * FRAME_HEADER_SIZE, 0, 0);
        ck_assert_int_eq(frame_reader_init(&r), 0);
        feed(&r, buf, sizeof(buf));
        for (int i = 0; i < 3; i++) {
                ck_assert_int_eq(frame_reader_next(&r, &f), 1);
                ck_assert_uint_eq(f.len, 0);
                ck_assert_uint_eq(f.nfds, 0);
                ck_assert_uint_eq(frame_reader_pending(&r), (size_t)(2 - i) * FRAME_HEADER_SIZE);
        }
        ck_assert_int_eq(frame_reader_next(&r, &f), 0);
        frame_reader_done(&r);
}
END_TEST

/*
 * Many frames with random payload sizes (zero included) and random fd counts,
 * delivered in random chunks. Each frame's fds are pushed with the chunk that
 * holds its first byte, as SCM_RIGHTS delivers them; a chunk stops before a
 * frame start whose fds would overflow the queue, as the kernel does with
 * the sendmsg() boundaries of a well-behaved peer.
 */
START_TEST(test_reader_random_chunks)
{
        enum { NFRAMES = 400, MAXLEN = 6000 };
        struct spec {
                size_t start, end;
                uint32_t len;
                unsigned nfds;
                int fds[DLX_MAX_FDS_PER_FRAME];
        } *specs = calloc(NFRAMES, sizeof(*specs));
        uint8_t *stream = malloc((size_t)NFRAMES * (FRAME_HEADER_SIZE + MAXLEN));
        uint8_t *payload = malloc(MAXLEN);
        uint64_t rng = 0x5eed0001;
        struct frame_reader r;
        size_t total = 0, pos = 0;
        int next_push = 0, got = 0, base = count_open_fds();

        ck_assert_ptr_nonnull(specs);
        ck_assert_ptr_nonnull(stream);
        ck_assert_ptr_nonnull(payload);
        for (int i = 0; i < NFRAMES; i++) {
                uint64_t k = rng_below(&rng, 10);
                /* mostly small, some empty, some larger than the initial buffer */
                uint32_t len = k < 2   ? 0
                               : k < 8 ? (uint32_t)rng_below(&rng, 200)
                                       : (uint32_t)rng_below(&rng, MAXLEN);

                specs[i].len = len;
                specs[i].nfds = (unsigned)rng_below(&rng, DLX_MAX_FDS_PER_FRAME + 1);
                specs[i].start = total;
                fill_pattern(payload, len, (uint32_t)i);
                total += build_frame(stream + total, payload, len, specs[i].nfds);
                specs[i].end = total;
        }

        ck_assert_int_eq(frame_reader_init(&r), 0);
        while (pos < total) {
                size_t chunk = 1 + rng_below(&rng, rng_below(&rng, 4) == 0 ? 9000 : 64);
                size_t stop = pos + chunk < total ? pos + chunk : total;
                unsigned queued = r.nfds;
                struct frame f;
                int rc;

                /* fds of the frames starting in [pos, stop), while the queue has room */
                while (next_push < NFRAMES && specs[next_push].start < stop) {
                        struct spec *s = &specs[next_push];
                        int fds[DLX_MAX_FDS_PER_FRAME];

                        if (queued + s->nfds > DLX_MAX_FDS_QUEUED) {
                                stop = s->start;
                                break;
                        }
                        for (unsigned j = 0; j < s->nfds; j++)
                                fds[j] = s->fds[j] = new_fd();
                        ck_assert_int_eq(frame_reader_push_fds(&r, fds, s->nfds), 0);
                        queued += s->nfds;
                        next_push++;
                }
                ck_assert_uint_gt(stop, pos);
                feed(&r, stream + pos, stop - pos);
                pos = stop;

                while ((rc = frame_reader_next(&r, &f)) == 1) {
                        struct spec *s = &specs[got];

                        expect(s->end <= pos, "frame %d returned before its end", got);
                        expect(f.len == s->len, "frame %d: len %u, want %u", got, f.len, s->len);
                        expect(f.nfds == s->nfds, "frame %d: nfds %u, want %u", got, f.nfds,
                               s->nfds);
                        fill_pattern(payload, s->len, (uint32_t)got);
                        expect(f.len == 0 || memcmp(f.payload, payload, f.len) == 0,
                               "frame %d: payload differs", got);
                        for (unsigned j = 0; j < f.nfds; j++)
                                expect(f.fds[j] == s->fds[j], "frame %d fd %u: %d, want %d", got, j,
                                       f.fds[j], s->fds[j]);
                        frame_close_fds(&f);
                        expect(f.nfds == 0, "frame %d: nfds %u after close", got, f.nfds);
                        for (unsigned j = 0; j < s->nfds; j++)
                                expect(fd_is_closed(s->fds[j]), "frame %d fd %d still open", got,
                                       s->fds[j]);
                        got++;
                }
                expect(rc == 0, "at byte %zu: rc %d", pos, rc);
                /* every complete frame was taken: what remains is one partial frame */
                size_t head = got < NFRAMES ? specs[got].start : total;
                expect(frame_reader_pending(&r) == pos - head, "pending %zu, want %zu",
                       frame_reader_pending(&r), pos - head);
        }
        ck_assert_int_eq(got, NFRAMES);
        ck_assert_uint_eq(r.nfds, 0);
        frame_reader_done(&r);
        ck_assert_int_eq(count_open_fds(), base);
        free(payload);
        free(stream);
        free(specs);
}
END_TEST

START_TEST(test_reader_bad_header_in_stream)
{
        struct frame_reader r;
        struct frame f;
        uint8_t buf[2 * FRAME_HEADER_SIZE + 4] = {0};
        size_t n = build_frame(buf, (const uint8_t *)"abcd", 4, 0);

        ck_assert_int_eq(frame_reader_init(&r), 0);
        frame_header_put(buf + n, DLX_MAX_FRAME + 1, 0);
        feed(&r, buf, n + FRAME_HEADER_SIZE);
        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_uint_eq(f.len, 4);
        ck_assert_int_eq(frame_reader_next(&r, &f), -EMSGSIZE);
        frame_reader_done(&r);

        ck_assert_int_eq(frame_reader_init(&r), 0);
        frame_header_put(buf, 4, DLX_MAX_FDS_PER_FRAME + 1);
        feed(&r, buf, FRAME_HEADER_SIZE);
        ck_assert_int_eq(frame_reader_next(&r, &f), -E2BIG);
        frame_reader_done(&r);

        ck_assert_int_eq(frame_reader_init(&r), 0);
        frame_header_put(buf, 4, 0);
        buf[7] = 1;
        feed(&r, buf, FRAME_HEADER_SIZE);
        ck_assert_int_eq(frame_reader_next(&r, &f), -EPROTO);
        frame_reader_done(&r);
}
END_TEST

/* ---- reader: fd queue --------------------------------------------------------------------- */

START_TEST(test_fds_in_order)
{
        struct frame_reader r;
        struct frame f;
        uint8_t buf[3 * (FRAME_HEADER_SIZE + 4)];
        int fds[DLX_MAX_FDS_QUEUED];
        size_t n = 0;
        int base = count_open_fds();

        _Static_assert(DLX_MAX_FDS_QUEUED >= 4, "the queue holds two frames' fds");
        for (int i = 0; i < 4; i++)
                fds[i] = new_fd();
        n += build_frame(buf + n, (const uint8_t *)"aaaa", 4, 2);
        n += build_frame(buf + n, (const uint8_t *)"bbbb", 4, 0);
        n += build_frame(buf + n, (const uint8_t *)"cccc", 4, 2);

        ck_assert_int_eq(frame_reader_init(&r), 0);
        /* all four arrive with the first byte, split over two pushes */
        ck_assert_int_eq(frame_reader_push_fds(&r, fds, 1), 0);
        ck_assert_int_eq(frame_reader_push_fds(&r, fds + 1, 3), 0);
        ck_assert_uint_eq(r.nfds, 4);
        feed(&r, buf, n);

        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_mem_eq(f.payload, "aaaa", 4);
        ck_assert_uint_eq(f.nfds, 2);
        ck_assert_int_eq(f.fds[0], fds[0]);
        ck_assert_int_eq(f.fds[1], fds[1]);
        frame_close_fds(&f);
        ck_assert(fd_is_closed(fds[0]));
        ck_assert(fd_is_closed(fds[1]));
        ck_assert(fd_is_open(fds[2]));

        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_mem_eq(f.payload, "bbbb", 4);
        ck_assert_uint_eq(f.nfds, 0);

        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_mem_eq(f.payload, "cccc", 4);
        ck_assert_uint_eq(f.nfds, 2);
        for (int i = 0; i < 2; i++)
                ck_assert_int_eq(f.fds[i], fds[2 + i]);
        ck_assert_uint_eq(r.nfds, 0);
        frame_close_fds(&f);
        frame_reader_done(&r);
        ck_assert_int_eq(count_open_fds(), base);
}
END_TEST

START_TEST(test_fds_missing)
{
        struct frame_reader r;
        struct frame f;
        uint8_t buf[FRAME_HEADER_SIZE + 4];
        size_t n = build_frame(buf, (const uint8_t *)"xxxx", 4, 2);
        int fd = new_fd();

        ck_assert_int_eq(frame_reader_init(&r), 0);
        ck_assert_int_eq(frame_reader_push_fds(&r, &fd, 1), 0);
        /* incomplete: more bytes may still come, so not an error yet */
        feed(&r, buf, n - 1);
        ck_assert_int_eq(frame_reader_next(&r, &f), 0);
        feed(&r, buf + n - 1, 1);
        ck_assert_int_eq(frame_reader_next(&r, &f), -EPROTO);
        /* the queued fd stays with the reader, which closes it */
        ck_assert(fd_is_open(fd));
        frame_reader_done(&r);
        ck_assert(fd_is_closed(fd));
}
END_TEST

START_TEST(test_fds_no_fds_at_all)
{
        struct frame_reader r;
        struct frame f;
        uint8_t buf[FRAME_HEADER_SIZE];

        frame_header_put(buf, 0, 1);
        ck_assert_int_eq(frame_reader_init(&r), 0);
        feed(&r, buf, sizeof(buf));
        ck_assert_int_eq(frame_reader_next(&r, &f), -EPROTO);
        frame_reader_done(&r);
}
END_TEST

START_TEST(test_fds_queue_full)
{
        struct frame_reader r;
        int fds[DLX_MAX_FDS_QUEUED], extra[3];
        int base = count_open_fds();

        for (int i = 0; i < DLX_MAX_FDS_QUEUED; i++)
                fds[i] = new_fd();
        for (int i = 0; i < 3; i++)
                extra[i] = new_fd();
        ck_assert_int_eq(frame_reader_init(&r), 0);
        ck_assert_int_eq(frame_reader_push_fds(&r, fds, DLX_MAX_FDS_QUEUED - 2), 0);
        /* three more would make 17: all three are closed, the queue is kept */
        ck_assert_int_eq(frame_reader_push_fds(&r, extra, 3), -EMFILE);
        for (int i = 0; i < 3; i++)
                ck_assert_msg(fd_is_closed(extra[i]), "fd %d left open", extra[i]);
        ck_assert_uint_eq(r.nfds, DLX_MAX_FDS_QUEUED - 2);
        /* exactly full is fine */
        ck_assert_int_eq(frame_reader_push_fds(&r, fds + DLX_MAX_FDS_QUEUED - 2, 2), 0);
        ck_assert_uint_eq(r.nfds, DLX_MAX_FDS_QUEUED);
        extra[0] = new_fd();
        ck_assert_int_eq(frame_reader_push_fds(&r, extra, 1), -EMFILE);
        ck_assert(fd_is_closed(extra[0]));
        for (int i = 0; i < DLX_MAX_FDS_QUEUED; i++)
                ck_assert(fd_is_open(fds[i]));
        frame_reader_done(&r);
        for (int i = 0; i < DLX_MAX_FDS_QUEUED; i++)
                ck_assert_msg(fd_is_closed(fds[i]), "fd %d left open by done", fds[i]);
        ck_assert_int_eq(count_open_fds(), base);
}
END_TEST

START_TEST(test_done_closes_queued)
{
        struct frame_reader r;
        uint8_t buf[FRAME_HEADER_SIZE + 2];
        int fds[4];

        for (int i = 0; i < 4; i++)
                fds[i] = new_fd();
        ck_assert_int_eq(frame_reader_init(&r), 0);
        ck_assert_int_eq(frame_reader_push_fds(&r, fds, 4), 0);
        /* a partial frame pending as well */
        build_frame(buf, (const uint8_t *)"zz", 2, 4);
        feed(&r, buf, 5);
        ck_assert_uint_eq(frame_reader_pending(&r), 5);
        frame_reader_done(&r);
        for (int i = 0; i < 4; i++)
                ck_assert(fd_is_closed(fds[i]));
        ck_assert_ptr_null(r.buf);
        ck_assert_uint_eq(r.nfds, 0);
}
END_TEST

/* ---- reader: buffer management ------------------------------------------------------------ */

START_TEST(test_reader_max_frame)
{
        struct frame_reader r;
        struct frame f;
        uint8_t *buf = malloc(FRAME_HEADER_SIZE + DLX_MAX_FRAME + FRAME_HEADER_SIZE + 3);
        size_t n;

        ck_assert_ptr_nonnull(buf);
        fill_pattern(buf + FRAME_HEADER_SIZE, DLX_MAX_FRAME, 42);
        frame_header_put(buf, DLX_MAX_FRAME, 0);
        n = FRAME_HEADER_SIZE + DLX_MAX_FRAME;
        n += build_frame(buf + n, (const uint8_t *)"end", 3, 0);

        ck_assert_int_eq(frame_reader_init(&r), 0);
        size_t cap0 = r.cap;
        ck_assert_uint_lt(cap0, DLX_MAX_FRAME);
        /* in uneven pieces so growth happens with a partial frame buffered */
        for (size_t pos = 0; pos < n;) {
                size_t k = n - pos < 70001 ? n - pos : 70001;
                feed(&r, buf + pos, k);
                pos += k;
                if (pos < FRAME_HEADER_SIZE + DLX_MAX_FRAME)
                        ck_assert_int_eq(frame_reader_next(&r, &f), 0);
        }
        ck_assert_uint_ge(r.cap, (size_t)FRAME_HEADER_SIZE + DLX_MAX_FRAME);
        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_uint_eq(f.len, DLX_MAX_FRAME);
        ck_assert_int_eq(memcmp(f.payload, buf + FRAME_HEADER_SIZE, DLX_MAX_FRAME), 0);
        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_uint_eq(f.len, 3);
        ck_assert_mem_eq(f.payload, "end", 3);
        ck_assert_int_eq(frame_reader_next(&r, &f), 0);
        ck_assert_uint_eq(frame_reader_pending(&r), 0);
        frame_reader_done(&r);
        free(buf);
}
END_TEST

START_TEST(test_reader_grows_only_as_needed)
{
        struct frame_reader r;
        uint8_t *p;
        size_t avail;
        uint8_t hdr[FRAME_HEADER_SIZE];

        ck_assert_int_eq(frame_reader_init(&r), 0);
        size_t cap0 = r.cap;
        ck_assert_int_eq(frame_reader_space(&r, &p, &avail), 0);
        ck_assert_uint_eq(avail, cap0);
        /* a header announcing a frame larger than the buffer: room for it all at once */
        frame_header_put(hdr, (uint32_t)(3 * cap0), 0);
        feed(&r, hdr, sizeof(hdr));
        ck_assert_int_eq(frame_reader_space(&r, &p, &avail), 0);
        ck_assert_uint_ge(avail, 3 * cap0);
        ck_assert_ptr_eq(p, r.buf + FRAME_HEADER_SIZE);
        ck_assert_mem_eq(r.buf, hdr, sizeof(hdr));
        frame_reader_done(&r);
}
END_TEST

START_TEST(test_reader_compaction)
{
        struct frame_reader r;
        struct frame f;
        uint8_t *p;
        size_t avail;

        ck_assert_int_eq(frame_reader_init(&r), 0);
        size_t cap = r.cap;
        /* A fills the first quarter; B (three quarters plus) does not fit after it */
        uint32_t alen = (uint32_t)(cap / 4 - FRAME_HEADER_SIZE);
        uint32_t blen = (uint32_t)(cap - cap / 8 - FRAME_HEADER_SIZE);
        size_t asz = FRAME_HEADER_SIZE + alen, bsz = FRAME_HEADER_SIZE + blen;
        uint8_t *buf = malloc(asz + bsz);
        size_t part = cap - asz;

        ck_assert_ptr_nonnull(buf);
        fill_pattern(buf + FRAME_HEADER_SIZE, alen, 1);
        frame_header_put(buf, alen, 0);
        fill_pattern(buf + asz + FRAME_HEADER_SIZE, blen, 2);
        frame_header_put(buf + asz, blen, 0);
        ck_assert_uint_lt(part, bsz);

        /* exactly fill the buffer: A and the start of B */
        feed(&r, buf, asz + part);
        ck_assert_uint_eq(r.cap, cap);
        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_uint_eq(f.len, alen);
        ck_assert_uint_eq(r.start, asz);
        ck_assert_uint_eq(frame_reader_pending(&r), part);

        /* B fits the buffer once A's bytes are dropped: compaction, no growth */
        ck_assert_int_eq(frame_reader_space(&r, &p, &avail), 0);
        ck_assert_uint_eq(r.cap, cap);
        ck_assert_uint_eq(r.start, 0);
        ck_assert_uint_eq(r.end, part);
        ck_assert_ptr_eq(p, r.buf + part);
        ck_assert_uint_eq(avail, cap - part);
        ck_assert_uint_eq(frame_reader_pending(&r), part);
        ck_assert_int_eq(memcmp(r.buf, buf + asz, part), 0);

        feed(&r, buf + asz + part, bsz - part);
        ck_assert_uint_eq(r.cap, cap);
        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_uint_eq(f.len, blen);
        ck_assert_int_eq(memcmp(f.payload, buf + asz + FRAME_HEADER_SIZE, blen), 0);
        ck_assert_uint_eq(frame_reader_pending(&r), 0);
        frame_reader_done(&r);
        free(buf);
}
END_TEST

START_TEST(test_reader_pending_partial_header)
{
        struct frame_reader r;
        struct frame f;
        uint8_t buf[FRAME_HEADER_SIZE + 10];
        size_t n = build_frame(buf, (const uint8_t *)"0123456789", 10, 0);

        ck_assert_int_eq(frame_reader_init(&r), 0);
        for (size_t i = 1; i <= n; i++) {
                feed(&r, buf + i - 1, 1);
                if (i < n) {
                        ck_assert_int_eq(frame_reader_next(&r, &f), 0);
                        ck_assert_uint_eq(frame_reader_pending(&r), i);
                }
        }
        ck_assert_int_eq(frame_reader_next(&r, &f), 1);
        ck_assert_uint_eq(frame_reader_pending(&r), 0);
        frame_reader_done(&r);
}
END_TEST

Suite *frame_suite(void)
{
        Suite *s = suite_create("frame");
        TCase *tc = tcase_create("header");

        tcase_add_test(tc, test_header_roundtrip);
        tcase_add_test(tc, test_header_layout);
        tcase_add_test(tc, test_header_too_long);
        tcase_add_test(tc, test_header_too_many_fds);
        tcase_add_test(tc, test_header_reserved);
        suite_add_tcase(s, tc);

        tc = tcase_create("reader");
        tcase_add_test(tc, test_reader_single_frame);
        tcase_add_test(tc, test_reader_byte_by_byte);
        tcase_add_test(tc, test_reader_zero_length);
        tcase_add_test(tc, test_reader_random_chunks);
        tcase_add_test(tc, test_reader_bad_header_in_stream);
        tcase_add_test(tc, test_reader_pending_partial_header);
        suite_add_tcase(s, tc);

        tc = tcase_create("fds");
        tcase_add_test(tc, test_fds_in_order);
        tcase_add_test(tc, test_fds_missing);
        tcase_add_test(tc, test_fds_no_fds_at_all);
        tcase_add_test(tc, test_fds_queue_full);
        tcase_add_test(tc, test_done_closes_queued);
        suite_add_tcase(s, tc);

        tc = tcase_create("buffer");
        tcase_add_test(tc, test_reader_max_frame);
        tcase_add_test(tc, test_reader_grows_only_as_needed);
        tcase_add_test(tc, test_reader_compaction);
        suite_add_tcase(s, tc);
        return s;
}
