/* SPDX-License-Identifier: MIT */
/*
 * `dlxctl put/get PREFIX FILE.safetensors|.npz` (README "dlxctl"), as a
 * second reader wrote them from the promises: every file is built here byte by byte (safetensors)
 * or with libzip (.npz), fed to the real $DLXCTL against a real dlxd, and what was published is
 * read back through libdlx, independently of dlxctl's own readers. The promises: a file's tensors
 * are ONE persistent read-only group, every safetensors dtype maps to DLPack and back, round trips
 * keep the tensors' bytes, and a malformed file gets a one-line reason on stderr, a non-zero exit
 * and publishes nothing (an existing version stays as it was).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zip.h>

#include <dlx/dlx.h>

#include "fixture.h"
#include "npz.h"
#include "safetensors.h"
#include "tfile.h"
#include "tmpfiles.h"

#define CTL_TIMEOUT_MS 20000

/* ---- files ------------------------------------------------------------------------------- */

/* A safetensors file: the 8-byte length (hlen, as given: it may lie), the header, the data. */
static void make_st_len(const char *path, uint64_t hlen, const char *header, const void *data,
                        size_t len)
{
        size_t n = strlen(header);
        uint8_t *buf = malloc(8 + n + len + 1);

        ck_assert_ptr_nonnull(buf);
        for (int i = 0; i < 8; i++)
                buf[i] = (uint8_t)(hlen >> (8 * i));
        memcpy(buf + 8, header, n);
        if (len)
                memcpy(buf + 8 + n, data, len);
        write_file(path, buf, 8 + n + len);
        free(buf);
}

static void make_st(const char *path, const char *header, const void *data, size_t len)
{
        make_st_len(path, strlen(header), header, data, len);
}

/* A .npy body (format 1.0, numpy's padding) in a malloc'd buffer. */
static uint8_t *npy_body(const char *dict, const void *data, size_t n, size_t *ret_len)
{
        size_t dlen = strlen(dict), pad = (64 - (10 + dlen + 1) % 64) % 64;
        size_t hlen = dlen + pad + 1, total = 10 + hlen + n;
        uint8_t *buf = malloc(total);

        ck_assert_ptr_nonnull(buf);
        memcpy(buf, "\x93NUMPY\x01\x00", 8);
        buf[8] = (uint8_t)hlen;
        buf[9] = (uint8_t)(hlen >> 8);
        memcpy(buf + 10, dict, dlen);
        memset(buf + 10 + dlen, ' ', pad);
        buf[10 + hlen - 1] = '\n';
        if (n)
                memcpy(buf + 10 + hlen, data, n);
        *ret_len = total;
        return buf;
}

struct zentry {
        const char *name;
        const void *body;
        size_t len;
        bool deflate;
};

/* An archive of the entries, by libzip (bodies copied). */
static void make_zip(const char *path, const struct zentry *e, size_t n)
{
        int err = 0;
        zip_t *za = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &err);

        ck_assert_msg(za, "zip_open %s: %d", path, err);
        for (size_t i = 0; i < n; i++) {
                /* an empty body is no buffer: libzip would not free one of 0 bytes */
                void *copy = e[i].len ? malloc(e[i].len) : NULL;
                zip_source_t *src;
                zip_int64_t idx;

                ck_assert(copy || !e[i].len);
                if (copy)
                        memcpy(copy, e[i].body, e[i].len);
                src = zip_source_buffer(za, copy, e[i].len, copy != NULL);
                ck_assert_ptr_nonnull(src);
                idx = zip_file_add(za, e[i].name, src, ZIP_FL_ENC_UTF_8);
                ck_assert_msg(idx >= 0, "zip_file_add %s: %s", e[i].name, zip_strerror(za));
                ck_assert_int_eq(
                        zip_set_file_compression(za, (zip_uint64_t)idx,
                                                 e[i].deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0),
                        0);
        }
        ck_assert_msg(zip_close(za) == 0, "zip_close %s: %s", path, zip_strerror(za));
}

/* One .npy entry named name in an .npz at path. */
static void make_npz1(const char *path, const char *name, const char *dict, const void *data,
                      size_t n, bool deflate)
{
        size_t len;
        uint8_t *body = npy_body(dict, data, n, &len);
        struct zentry e = {name, body, len, deflate};

        make_zip(path, &e, 1);
        free(body);
}

/* ---- running dlxctl ------------------------------------------------------------------------ */

struct sbuf {
        char *data;
        size_t len;
};

static void sbuf_add(struct sbuf *b, const char *data, size_t n)
{
        b->data = realloc(b->data, b->len + n + 1);
        ck_assert_ptr_nonnull(b->data);
        memcpy(b->data + b->len, data, n);
        b->len += n;
        b->data[b->len] = '\0';
}

/* Runs $DLXCTL --socket fx.socket args... (NULL-terminated); its exit status, 128+sig if killed. */
static int run_ctl(char **out, char **err, const char *arg0, ...)
{
        const char *bin = getenv("DLXCTL"), *argv[32];
        struct sbuf bufs[2] = {{0}, {0}};
        int o[2], e[2], n = 0, status, open_fds = 2;
        int64_t deadline = fx_now_ms() + CTL_TIMEOUT_MS;
        va_list ap;
        pid_t pid;

        ck_assert_msg(bin && *bin, "DLXCTL is not set");
        argv[n++] = "dlxctl";
        argv[n++] = "--socket";
        argv[n++] = fx.socket;
        va_start(ap, arg0);
        for (const char *a = arg0; a; a = va_arg(ap, const char *)) {
                ck_assert_int_lt(n, 30);
                argv[n++] = a;
        }
        va_end(ap);
        argv[n] = NULL;
        ck_assert_int_eq(pipe2(o, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(e, O_CLOEXEC), 0);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                if (dup2(o[1], STDOUT_FILENO) < 0 || dup2(e[1], STDERR_FILENO) < 0)
                        _exit(127);
                execv(bin, (char *const *)argv);
                _exit(127);
        }
        close(o[1]);
        close(e[1]);
        struct pollfd pfd[2] = {{.fd = o[0], .events = POLLIN}, {.fd = e[0], .events = POLLIN}};
        sbuf_add(&bufs[0], "", 0);
        sbuf_add(&bufs[1], "", 0);
        while (open_fds > 0) {
                int64_t left = deadline - fx_now_ms();
                char chunk[4096];

                if (left <= 0) {
                        kill(pid, SIGKILL);
                        waitpid(pid, &status, 0);
                        ck_abort_msg("dlxctl %s %s did not finish", arg0, argv[4]);
                }
                if (poll(pfd, 2, (int)left) < 0) {
                        ck_assert_int_eq(errno, EINTR);
                        continue;
                }
                for (int i = 0; i < 2; i++) {
                        ssize_t r;

                        if (pfd[i].fd < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                                continue;
                        r = read(pfd[i].fd, chunk, sizeof(chunk));
                        if (r < 0 && errno == EINTR)
                                continue;
                        if (r <= 0) {
                                close(pfd[i].fd);
                                pfd[i].fd = -1;
                                open_fds--;
                                continue;
                        }
                        sbuf_add(&bufs[i], chunk, (size_t)r);
                }
        }
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        if (out)
                *out = bufs[0].data;
        else
                free(bufs[0].data);
        if (err)
                *err = bufs[1].data;
        else
                free(bufs[1].data);
        return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

static void put_ok(const char *name, const char *path)
{
        char *out, *err;
        int rc = run_ctl(&out, &err, "put", name, path, NULL);

        ck_assert_msg(rc == 0, "put %s %s: exit %d: %s", name, path, rc, err);
        free(out);
        free(err);
}

static void get_ok(const char *name, const char *path)
{
        char *out, *err;
        int rc = run_ctl(&out, &err, "get", name, path, NULL);

        ck_assert_msg(rc == 0, "get %s %s: exit %d: %s", name, path, rc, err);
        free(out);
        free(err);
}

/*
 * A refused put: exit 1, nothing on stdout, and exactly one line on stderr
 * ("a one-line reason"), printable: no control character but its final newline.
 */
static void put_refused(const char *what, const char *name, const char *path)
{
        char *out, *err;
        int rc = run_ctl(&out, &err, "put", name, path, NULL);
        size_t len = strlen(err);

        ck_assert_msg(rc == 1, "%s: put exited %d, expected 1; stdout: %s; stderr: %s", what, rc,
                      out, err);
        ck_assert_msg(out[0] == '\0', "%s: a refused put printed '%s'", what, out);
        ck_assert_msg(len > 1 && err[len - 1] == '\n', "%s: no one-line reason on stderr: '%s'",
                      what, err);
        if (getenv("DLX_TEST_VERBOSE"))
                fprintf(stderr, "[%s] %s", what, err);
        for (size_t i = 0; i + 1 < len; i++)
                ck_assert_msg((unsigned char)err[i] >= 0x20 && err[i] != 0x7f,
                              "%s: the reason is not one printable line: byte %zu is 0x%02x in "
                              "'%s'",
                              what, i, (unsigned char)err[i], err);
        free(out);
        free(err);
}

/* ---- what the daemon holds ----------------------------------------------------------------- */

static int count_cb(void *ctx, const struct dlx_info *info)
{
        (void)info;
        (*(int *)ctx)++;
        return 0;
}

static int count_names(dlx_client *c)
{
        int n = 0;

        ck_assert_int_ge(dlx_list(c, "", count_cb, &n), 0);
        return n;
}

/* t's elements in row-major order equal want (numel * itemsize bytes). */
static void expect_elements(const char *what, const DLTensor *t, const void *want, size_t nbytes)
{
        size_t item = (size_t)t->dtype.bits * t->dtype.lanes / 8;
        uint8_t *got = malloc(nbytes + 1);

        ck_assert_ptr_nonnull(got);
        ck_assert_uint_eq(numel(t) * item, nbytes);
        naive_gather(t, got);
        for (size_t k = 0; k < numel(t); k++)
                ck_assert_msg(memcmp(got + k * item, (const uint8_t *)want + k * item, item) == 0,
                              "%s: element %zu differs", what, k);
        free(got);
}

/* ---- fixtures ------------------------------------------------------------------------------ */

static void setup(void)
{
        tmpdir_make("group-files");
        fx_setup();
}

static void teardown(void)
{
        fx_teardown();
        tmpdir_remove();
}

/* ---- safetensors: every dtype, both ways --------------------------------------------------- */

static const struct st_dtype_row {
        const char *name;
        uint8_t code, bits;
} st_dtypes[] = {
        {"BOOL", kDLBool, 8},
        {"U8", kDLUInt, 8},
        {"I8", kDLInt, 8},
        {"U16", kDLUInt, 16},
        {"I16", kDLInt, 16},
        {"U32", kDLUInt, 32},
        {"I32", kDLInt, 32},
        {"U64", kDLUInt, 64},
        {"I64", kDLInt, 64},
        {"F16", kDLFloat, 16},
        {"BF16", kDLBfloat, 16},
        {"F32", kDLFloat, 32},
        {"F64", kDLFloat, 64},
        {"F8_E4M3", kDLFloat8_e4m3fn, 8},
        {"F8_E5M2", kDLFloat8_e5m2, 8},
        {"F8_E8M0", kDLFloat8_e8m0fnu, 8},
        {"C64", kDLComplex, 64},
};

/*
 * One file with a member of every safetensors dtype (shape [3], then a 0-d
 * and an empty member), laid out back to back at odd offsets: put publishes
 * one group whose members have the right DLPack dtypes and the file's bytes;
 * get writes a .safetensors with the same tensors; putting that back gives
 * the same group again.
 */
START_TEST(every_safetensors_dtype_round_trips)
{
        char header[4096], entry[160];
        uint8_t data[1024];
        size_t off = 0, hl = 0;
        dlx_client *c;
        dlx_group *g = NULL;

        hl += (size_t)snprintf(header + hl, sizeof(header) - hl, "{");
        for (size_t i = 0; i < N_ELEMS(st_dtypes); i++) {
                size_t bytes = 3u * st_dtypes[i].bits / 8;
                snprintf(entry, sizeof(entry),
                         "\"m.%s\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[%zu,%zu]},",
                         st_dtypes[i].name, st_dtypes[i].name, off, off + bytes);
                hl += (size_t)snprintf(header + hl, sizeof(header) - hl, "%s", entry);
                off += bytes;
        }
        hl += (size_t)snprintf(header + hl, sizeof(header) - hl,
                               "\"scalar\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[%zu,%"
                               "zu]},"
                               "\"empty\":{\"dtype\":\"BF16\",\"shape\":[2,0,3],\"data_offsets\":"
                               "[%zu,%zu]},"
                               "\"__metadata__\":{\"format\":\"pt\"}}",
                               off, off + 8, off + 8, off + 8);
        off += 8;
        ck_assert_uint_lt(off, sizeof(data));
        for (size_t i = 0; i < off; i++)
                data[i] = (uint8_t)(i * 37u + 11u);
        /* BOOL holds 0 or 1 */
        data[0] = 1;
        data[1] = 0;
        data[2] = 1;
        make_st(path_of("all.safetensors"), header, data, off);
        put_ok("all", path_of("all.safetensors"));

        c = fx_connect(&fx, "reader");
        ck_assert_int_eq(dlx_acquire_group(c, "all", NULL, 0, NULL, &g), 0);
        ck_assert_uint_eq(dlx_group_count(g), N_ELEMS(st_dtypes) + 2);
        ck_assert_uint_eq(dlx_group_version(g), 1);
        off = 0;
        for (size_t i = 0; i < N_ELEMS(st_dtypes); i++) {
                char mname[32];
                size_t bytes = 3u * st_dtypes[i].bits / 8;
                snprintf(mname, sizeof(mname), "m.%s", st_dtypes[i].name);
                int64_t k = dlx_group_find(g, mname);
                ck_assert_msg(k >= 0, "member %s missing", mname);
                const DLTensor *t = dlx_group_tensor(g, (size_t)k);
                ck_assert_msg(t->dtype.code == st_dtypes[i].code &&
                                      t->dtype.bits == st_dtypes[i].bits && t->dtype.lanes == 1,
                              "%s: DLPack dtype (%u, %u, %u)", mname, t->dtype.code, t->dtype.bits,
                              t->dtype.lanes);
                ck_assert_int_eq(t->ndim, 1);
                ck_assert_int_eq(t->shape[0], 3);
                expect_elements(mname, t, data + off, bytes);
                off += bytes;
        }
        int64_t k = dlx_group_find(g, "scalar");
        ck_assert_int_ge(k, 0);
        ck_assert_int_eq(dlx_group_tensor(g, (size_t)k)->ndim, 0);
        expect_elements("scalar", dlx_group_tensor(g, (size_t)k), data + off, 8);
        k = dlx_group_find(g, "empty");
        ck_assert_int_ge(k, 0);
        ck_assert_int_eq(dlx_group_tensor(g, (size_t)k)->ndim, 3);
        ck_assert_int_eq(dlx_group_tensor(g, (size_t)k)->shape[1], 0);
        ck_assert_int_eq(dlx_group_find(g, "__metadata__"), -ENOENT);
        dlx_group_release(g);

        /* get writes the same tensors; the file it writes goes back in as the same group */
        get_ok("all", path_of("out.safetensors"));
        put_ok("again", path_of("out.safetensors"));
        dlx_group *a = NULL, *b = NULL;
        ck_assert_int_eq(dlx_acquire_group(c, "all", NULL, 0, NULL, &a), 0);
        ck_assert_int_eq(dlx_acquire_group(c, "again", NULL, 0, NULL, &b), 0);
        ck_assert_uint_eq(dlx_group_count(a), dlx_group_count(b));
        for (size_t i = 0; i < dlx_group_count(a); i++) {
                const DLTensor *x = dlx_group_tensor(a, i), *y = dlx_group_tensor(b, i);
                size_t n = (size_t)(numel(x) * x->dtype.bits / 8);
                uint8_t *buf = malloc(n + 1);
                ck_assert_str_eq(dlx_group_name(a, i), dlx_group_name(b, i));
                ck_assert(memcmp(&x->dtype, &y->dtype, sizeof(x->dtype)) == 0);
                ck_assert_int_eq(x->ndim, y->ndim);
                for (int32_t d = 0; d < x->ndim; d++)
                        ck_assert_int_eq(x->shape[d], y->shape[d]);
                naive_gather(x, buf);
                expect_elements(dlx_group_name(b, i), y, buf, n);
                free(buf);
        }
        dlx_group_release(a);
        dlx_group_release(b);
        dlx_close(c);
}
END_TEST

/* A put group is persistent (it outlives dlxctl) and read-only, as `dlxctl --help` says. */
START_TEST(put_group_is_persistent_and_read_only)
{
        static const char hdr[] =
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
        const float w[2] = {1.5f, -2.0f};
        struct dlx_info info;
        DLManagedTensorVersioned *t = NULL;
        dlx_group *g = NULL;
        dlx_client *c;

        make_st(path_of("w.safetensors"), hdr, w, sizeof(w));
        put_ok("p/w", path_of("w.safetensors"));
        c = fx_connect(&fx, "reader");
        ck_assert_int_eq(dlx_stat(c, "p/w", &info), 0);
        ck_assert(info.persist);
        ck_assert_uint_eq(info.members, 1);
        ck_assert_int_eq(dlx_acquire_group(c, "p/w", NULL, 0, NULL, &g), 0);
        ck_assert_int_eq(dlx_group_take(g, 0, &t), 0);
        ck_assert_msg(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, "a put group's member is writable");
        ck_assert(memcmp(t->dl_tensor.data, w, sizeof(w)) == 0);
        t->deleter(t);
        dlx_group_release(g);
        dlx_close(c);
}
END_TEST

/* ---- .npz: numpy's kinds, both ways ------------------------------------------------------ */

/*
 * Entries stored and deflated, C and Fortran order, big-endian, bool,
 * complex128, 0-d and empty, a nested name: put gives the logical values
 * (whatever the order or byte order in the file), get .npz and get
 * .safetensors (for what safetensors can hold) give them back.
 */
START_TEST(npz_kinds_round_trip)
{
        const float f[6] = {0, 1, 2, 3, 4, 5};
        /* Fortran order: element (i, j) of the (2, 3) array is at i + 2 j */
        const float f_rowmajor[6] = {0, 2, 4, 1, 3, 5};
        uint8_t be[4] = {0x12, 0x34, 0xff, 0xfe}; /* >i2: 0x1234, -2 */
        const int16_t be_native[2] = {0x1234, -2};
        const uint8_t bools[3] = {1, 0, 1};
        const double c16[2] = {1.5, -2.25};
        const double scalar = 6.25;
        size_t lens[7];
        uint8_t *bodies[7];
        struct {
                const char *name, *dict;
                const void *data;
                size_t n;
                bool deflate;
        } in[7] = {
                {"c.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f,
                 sizeof(f), false},
                {"fo.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f,
                 sizeof(f), true},
                {"be.npy", "{'descr': '>i2', 'fortran_order': False, 'shape': (2,), }", be,
                 sizeof(be), false},
                {"flags.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", bools,
                 sizeof(bools), true},
                {"z.npy", "{'descr': '<c16', 'fortran_order': False, 'shape': (1,), }", c16,
                 sizeof(c16), false},
                {"sub/s.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", &scalar,
                 sizeof(scalar), false},
                {"e.npy", "{'descr': '<f2', 'fortran_order': False, 'shape': (0, 4), }", NULL, 0,
                 true},
        };
        struct zentry ze[7];
        dlx_client *c;
        dlx_group *g = NULL;

        for (int i = 0; i < 7; i++) {
                bodies[i] = npy_body(in[i].dict, in[i].data, in[i].n, &lens[i]);
                ze[i] = (struct zentry){in[i].name, bodies[i], lens[i], in[i].deflate};
        }
        make_zip(path_of("in.npz"), ze, 7);
        for (int i = 0; i < 7; i++)
                free(bodies[i]);
        put_ok("np", path_of("in.npz"));
        get_ok("np", path_of("out.npz"));
        put_ok("np2", path_of("out.npz"));

        c = fx_connect(&fx, "reader");
        for (int round = 0; round < 2; round++) {
                const char *gname = round ? "np2" : "np";
                int64_t k;

                ck_assert_int_eq(dlx_acquire_group(c, gname, NULL, 0, NULL, &g), 0);
                ck_assert_uint_eq(dlx_group_count(g), 7);
                k = dlx_group_find(g, "c");
                ck_assert_int_ge(k, 0);
                expect_elements("c", dlx_group_tensor(g, (size_t)k), f, sizeof(f));
                k = dlx_group_find(g, "fo");
                ck_assert_int_ge(k, 0);
                expect_elements("fo (Fortran order)", dlx_group_tensor(g, (size_t)k), f_rowmajor,
                                sizeof(f_rowmajor));
                k = dlx_group_find(g, "be");
                ck_assert_int_ge(k, 0);
                expect_elements("be (big-endian)", dlx_group_tensor(g, (size_t)k), be_native,
                                sizeof(be_native));
                k = dlx_group_find(g, "flags");
                ck_assert_int_ge(k, 0);
                ck_assert_int_eq(dlx_group_tensor(g, (size_t)k)->dtype.code, kDLBool);
                expect_elements("flags", dlx_group_tensor(g, (size_t)k), bools, sizeof(bools));
                k = dlx_group_find(g, "z");
                ck_assert_int_ge(k, 0);
                ck_assert_int_eq(dlx_group_tensor(g, (size_t)k)->dtype.code, kDLComplex);
                ck_assert_int_eq(dlx_group_tensor(g, (size_t)k)->dtype.bits, 128);
                expect_elements("z", dlx_group_tensor(g, (size_t)k), c16, sizeof(c16));
                k = dlx_group_find(g, "sub/s");
                ck_assert_int_ge(k, 0);
                ck_assert_int_eq(dlx_group_tensor(g, (size_t)k)->ndim, 0);
                expect_elements("sub/s", dlx_group_tensor(g, (size_t)k), &scalar, sizeof(scalar));
                k = dlx_group_find(g, "e");
                ck_assert_int_ge(k, 0);
                ck_assert_int_eq(dlx_group_tensor(g, (size_t)k)->shape[0], 0);
                ck_assert_int_eq(dlx_group_tensor(g, (size_t)k)->shape[1], 4);
                dlx_group_release(g);
        }
        dlx_close(c);
}
END_TEST

/* A Fortran-order .npz member comes out of get .safetensors in row-major order. */
START_TEST(fortran_npz_to_safetensors_is_row_major)
{
        const float f[6] = {0, 1, 2, 3, 4, 5};
        const float f_rowmajor[6] = {0, 2, 4, 1, 3, 5};
        struct tfile *t = NULL;
        char why[256];

        make_npz1(path_of("fo.npz"), "fo.npy",
                  "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f, sizeof(f),
                  false);
        put_ok("fo", path_of("fo.npz"));
        get_ok("fo", path_of("fo.safetensors"));
        ck_assert_msg(st_open(path_of("fo.safetensors"), &t, why, sizeof(why)) == 0, "%s", why);
        ck_assert_uint_eq(t->n, 1);
        ck_assert_int_eq(t->members[0].tensor.shape[0], 2);
        ck_assert_int_eq(t->members[0].tensor.shape[1], 3);
        ck_assert(memcmp(t->members[0].tensor.data, f_rowmajor, sizeof(f_rowmajor)) == 0);
        tfile_free(t);
}
END_TEST

/* ---- malformed safetensors --------------------------------------------------------------- */

/* The header length a bad_st row's file says: the header's own, or one that lies. */
#define HLEN_EXACT (-1)
#define HLEN_2_63 (-2)
#define HLEN_2_64_MINUS_1 (-3)
#define HLEN_ONE_SHORT (-4)
#define HLEN_TWO_NULS (-5) /* the header, then two NUL bytes counted in its length */

#define U8A "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}"

static const struct bad_st {
        const char *what, *header;
        size_t data;    /* bytes of data after the header */
        int64_t hlen;   /* what the 8 bytes say: >= 0 as is, or one of the HLEN_* below */
        bool keep_name; /* put under "keep", the group that exists; else under a bad prefix */
} bad_st[] = {
        {"header length 0", "", 0, 0, true},
        {"header length past EOF", "{\"a\":" U8A "}", 1, 4096, true},
        {"header length 2^63", "{}", 0, HLEN_2_63, true},
        {"header length 2^64-1", "{}", 0, HLEN_2_64_MINUS_1, true},
        {"header length one short", "{\"a\":" U8A "}", 1, HLEN_ONE_SHORT, true},
        {"not JSON", "hello world", 0, HLEN_EXACT, true},
        {"JSON array", "[1,2,3]", 0, HLEN_EXACT, true},
        {"JSON string", "\"abc\"", 0, HLEN_EXACT, true},
        {"JSON with trailing garbage", "{\"a\":" U8A "} x", 1, HLEN_EXACT, true},
        {"entry not an object", "{\"a\":[1,2]}", 0, HLEN_EXACT, true},
        {"entry without dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, HLEN_EXACT,
         true},
        {"entry without shape", "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, HLEN_EXACT,
         true},
        {"entry without offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, HLEN_EXACT, true},
        {"entry with an extra key",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1, HLEN_EXACT,
         true},
        {"dtype not a string", "{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
         HLEN_EXACT, true},
        {"shape not an array", "{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1,
         HLEN_EXACT, true},
        {"negative dimension", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}",
         1, HLEN_EXACT, true},
        {"fractional dimension",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, HLEN_EXACT, true},
        {"three offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,1]}}", 1,
         HLEN_EXACT, true},
        {"begin after end", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]}}", 1,
         HLEN_EXACT, true},
        {"offsets past the data",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, HLEN_EXACT, true},
        {"offsets past 2^64",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,"
         "18446744073709551616]}}",
         1, HLEN_EXACT, true},
        {"overlap",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, HLEN_EXACT, true},
        {"same region twice",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, HLEN_EXACT, true},
        {"a gap",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
         3, HLEN_EXACT, true},
        {"trailing bytes", "{\"a\":" U8A "}", 2, HLEN_EXACT, true},
        {"size smaller than shape",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, HLEN_EXACT, true},
        {"size larger than shape",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, HLEN_EXACT, true},
        {"unknown dtype", "{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
         HLEN_EXACT, true},
        {"lower-case dtype", "{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         HLEN_EXACT, true},
        {"sub-byte dtype", "{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1,
         HLEN_EXACT, true},
        {"33 dimensions",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
         "1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
         1, HLEN_EXACT, true},
        {"size past 64 bits",
         "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
         HLEN_EXACT, true},
        {"size past 63 bits",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,2],\"data_offsets\":[0,8]}}", 8,
         HLEN_EXACT, true},
        {"dimension past 2^64",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", 1,
         HLEN_EXACT, true},
        {"duplicate names", "{\"a\":" U8A ",\"a\":" U8A "}", 1, HLEN_EXACT, true},
        {"__metadata__ not an object", "{\"__metadata__\":[],\"a\":" U8A "}", 1, HLEN_EXACT, true},
        {"__metadata__ value not a string", "{\"__metadata__\":{\"k\":1},\"a\":" U8A "}", 1,
         HLEN_EXACT, true},
        {"__metadata__ alone", "{\"__metadata__\":{\"k\":\"v\"}}", 0, HLEN_EXACT, true},
        {"no tensors", "{}", 0, HLEN_EXACT, true},
        {"empty name", "{\"\":" U8A "}", 1, HLEN_EXACT, true},
        {"name over 255 bytes",
         "{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "a"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""
         ":" U8A "}",
         1, HLEN_EXACT, true},
        {"name '..'", "{\"..\":" U8A "}", 1, HLEN_EXACT, true},
        {"name 'a//b'", "{\"a//b\":" U8A "}", 1, HLEN_EXACT, true},
        {"name '/a'", "{\"/a\":" U8A "}", 1, HLEN_EXACT, true},
        {"name 'a/'", "{\"a/\":" U8A "}", 1, HLEN_EXACT, true},
        {"name 'a/./b'", "{\"a/./b\":" U8A "}", 1, HLEN_EXACT, true},
        {"invalid UTF-8 name", "{\"\xff\":" U8A "}", 1, HLEN_EXACT, true},
        {"NUL in a name", "{\"a\\u0000b\":" U8A "}", 1, HLEN_EXACT, true},
        {"a name with a newline", "{\"a\\nb\":" U8A "}", 1, HLEN_EXACT, true},
        {"a name with an escape", "{\"a\\u001b[2Jb\":" U8A "}", 1, HLEN_EXACT, true},
        {"NULs after the JSON", "{\"a\":" U8A "}", 1, HLEN_TWO_NULS, true},
        {"a bad prefix", "{\"a\":" U8A "}", 1, HLEN_EXACT, false},
};

/*
 * Each malformed file: exit 1 with one printable line on stderr, and the
 * group "keep" it was put over is still version 1 with its bytes; nothing
 * else is published, and the daemon counted no publish.
 */
START_TEST(malformed_safetensors_publish_nothing)
{
        const struct bad_st *row = &bad_st[_i];
        static const char keep_hdr[] =
                "{\"k\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
        const uint8_t keep[4] = {9, 8, 7, 6};
        uint8_t data[64] = {0};
        const char *path = path_of("bad.safetensors");
        struct dlx_info info;
        dlx_group *g = NULL;
        dlx_client *c;
        size_t hl = strlen(row->header), body = hl + (row->hlen == HLEN_TWO_NULS ? 2 : 0);
        uint64_t len = row->hlen >= 0                   ? (uint64_t)row->hlen
                       : row->hlen == HLEN_2_63         ? UINT64_C(1) << 63
                       : row->hlen == HLEN_2_64_MINUS_1 ? UINT64_MAX
                       : row->hlen == HLEN_ONE_SHORT    ? hl - 1
                                                        : body;
        uint8_t *buf = calloc(1, 8 + body + row->data + 1);

        ck_assert_ptr_nonnull(buf);
        for (int i = 0; i < 8; i++)
                buf[i] = (uint8_t)(len >> (8 * i));
        memcpy(buf + 8, row->header, hl);
        memcpy(buf + 8 + body, data, row->data);
        write_file(path, buf, 8 + body + row->data);
        free(buf);
        make_st(path_of("keep.safetensors"), keep_hdr, keep, sizeof(keep));
        put_ok("keep", path_of("keep.safetensors"));
        c = fx_connect(&fx, "reader");
        struct dlx_stats before = fx_stats(c);
        if (row->keep_name) {
                put_refused(row->what, "keep", path);
                put_refused(row->what, "fresh", path);
        } else {
                put_refused(row->what, "bad//prefix", path);
                put_refused(row->what, "x/../y", path);
        }

        ck_assert_int_eq(dlx_stat(c, "keep", &info), 0);
        ck_assert_msg(info.version == 1, "%s: 'keep' went to version %llu", row->what,
                      (unsigned long long)info.version);
        ck_assert_int_eq(dlx_acquire_group(c, "keep", NULL, 0, NULL, &g), 0);
        ck_assert_uint_eq(dlx_group_count(g), 1);
        ck_assert(memcmp(dlx_group_tensor(g, 0)->data, keep, sizeof(keep)) == 0);
        dlx_group_release(g);
        ck_assert_int_eq(dlx_stat(c, "fresh", &info), -ENOENT);
        ck_assert_int_eq(count_names(c), 1);
        ck_assert_uint_eq(fx_stats(c).publishes, before.publishes);
        dlx_close(c);
}
END_TEST

/* Files too short for the length, and an empty one. */
START_TEST(short_safetensors_publish_nothing)
{
        static const uint8_t seven[7] = {2, 0, 0, 0, 0, 0, 0};
        dlx_client *c;

        write_file(path_of("empty.safetensors"), "", 0);
        put_refused("an empty file", "x", path_of("empty.safetensors"));
        write_file(path_of("seven.safetensors"), seven, sizeof(seven));
        put_refused("a 7-byte file", "x", path_of("seven.safetensors"));
        make_st(path_of("hdr.safetensors"), "{}", NULL, 0);
        put_refused("a header and nothing", "x", path_of("hdr.safetensors"));
        ck_assert_int_eq(mkdir(path_of("dir.safetensors"), 0755), 0);
        put_refused("a directory", "x", path_of("dir.safetensors"));
        put_refused("no such file", "x", path_of("none.safetensors"));
        c = fx_connect(&fx, "reader");
        ck_assert_int_eq(count_names(c), 0);
        ck_assert_uint_eq(fx_stats(c).publishes, 0);
        dlx_close(c);
}
END_TEST

/* ---- malformed .npz ------------------------------------------------------------------------ */

enum npz_bad {
        NPZ_NOT_ZIP,
        NPZ_EMPTY_FILE,
        NPZ_TRUNCATED,
        NPZ_EMPTY_ARCHIVE,
        NPZ_TXT_MEMBER,
        NPZ_DIR_MEMBER,
        NPZ_BARE_SUFFIX,
        NPZ_DOTDOT,
        NPZ_NEWLINE_NAME,
        NPZ_OBJECT,
        NPZ_UNICODE,
        NPZ_STRUCTURED,
        NPZ_DATETIME,
        NPZ_BAD_MAGIC,
        NPZ_EMPTY_ENTRY,
        NPZ_SHORT_DATA,
        NPZ_LONG_DATA,
        NPZ_CRC,
        NPZ_DEFLATE_CORRUPT,
        NPZ_METHOD,
        NPZ_DUP_NAMES,
        NPZ_NDIM33,
        NPZ_SHAPE_OVERFLOW,
        NPZ_NEG_DIM,
        NPZ_GOOD_THEN_BAD,
        NPZ_N
};

static const char f4_dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
static const float f4_data[6] = {1, 2, 3, 4, 5, 6};

/* Flips the first byte of the first entry's data in a stored archive. */
static void corrupt_after(const char *path, const char *needle, size_t skip, uint8_t xor)
{
        size_t len;
        uint8_t *b = slurp(path, &len);
        uint8_t *p = memmem(b, len, needle, strlen(needle));

        ck_assert_ptr_nonnull(p);
        ck_assert_uint_lt((size_t)(p - b) + skip, len);
        p[skip] ^= xor;
        write_file(path, b, len);
        free(b);
}

static void make_bad_npz(enum npz_bad k, const char *path)
{
        size_t len, len2;
        uint8_t *body = npy_body(f4_dict, f4_data, sizeof(f4_data), &len), *other;

        switch (k) {
        case NPZ_NOT_ZIP:
                write_file(path, "PK\3\4 not really a zip", 22);
                break;
        case NPZ_EMPTY_FILE:
                write_file(path, "", 0);
                break;
        case NPZ_TRUNCATED: {
                uint8_t *b;
                make_npz1(path, "a.npy", f4_dict, f4_data, sizeof(f4_data), false);
                b = slurp(path, &len2);
                write_file(path, b, len2 - 10);
                free(b);
                break;
        }
        case NPZ_EMPTY_ARCHIVE:
                make_zip(path, NULL, 0);
                /* libzip writes no file for an empty archive: write the end record by hand */
                if (access(path, F_OK) != 0) {
                        static const uint8_t eocd[22] = {'P', 'K', 5, 6};
                        write_file(path, eocd, sizeof(eocd));
                }
                break;
        case NPZ_TXT_MEMBER: {
                struct zentry e[2] = {{"a.npy", body, len, false}, {"readme.txt", "hi", 2, false}};
                make_zip(path, e, 2);
                break;
        }
        case NPZ_DIR_MEMBER: {
                struct zentry e[2] = {{"d/", "", 0, false}, {"a.npy", body, len, false}};
                make_zip(path, e, 2);
                break;
        }
        case NPZ_BARE_SUFFIX: {
                struct zentry e = {".npy", body, len, false};
                make_zip(path, &e, 1);
                break;
        }
        case NPZ_DOTDOT: {
                struct zentry e = {"../a.npy", body, len, false};
                make_zip(path, &e, 1);
                break;
        }
        case NPZ_NEWLINE_NAME: {
                struct zentry e = {"a\nb.npy", body, len, false};
                make_zip(path, &e, 1);
                break;
        }
        case NPZ_OBJECT:
                make_npz1(path, "a.npy", "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
                          "\0\0\0\0\0\0\0\0", 8, false);
                break;
        case NPZ_UNICODE:
                make_npz1(path, "a.npy",
                          "{'descr': '<U2', 'fortran_order': False, 'shape': (1,), }",
                          "\0\0\0\0\0\0\0\0", 8, false);
                break;
        case NPZ_STRUCTURED:
                make_npz1(path, "a.npy",
                          "{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                          "\0\0\0\0", 4, false);
                break;
        case NPZ_DATETIME:
                make_npz1(path, "a.npy",
                          "{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (1,), }",
                          "\0\0\0\0\0\0\0\0", 8, false);
                break;
        case NPZ_BAD_MAGIC: {
                struct zentry e = {"a.npy", "this is not a .npy at all", 25, false};
                make_zip(path, &e, 1);
                break;
        }
        case NPZ_EMPTY_ENTRY: {
                struct zentry e = {"a.npy", "", 0, false};
                make_zip(path, &e, 1);
                break;
        }
        case NPZ_SHORT_DATA: {
                struct zentry e = {"a.npy", body, len - 4, false};
                make_zip(path, &e, 1);
                break;
        }
        case NPZ_LONG_DATA: {
                uint8_t *longer = malloc(len + 4);
                ck_assert_ptr_nonnull(longer);
                memcpy(longer, body, len);
                memcpy(longer + len, "xxxx", 4);
                struct zentry e = {"a.npy", longer, len + 4, true};
                make_zip(path, &e, 1);
                free(longer);
                break;
        }
        case NPZ_CRC:
                make_npz1(path, "a.npy", f4_dict, f4_data, sizeof(f4_data), false);
                /* the last float's top byte, inside the stored entry */
                corrupt_after(path, "\x93NUMPY", len - 1, 0x40);
                break;
        case NPZ_DEFLATE_CORRUPT: {
                struct zentry e = {"a.npy", body, len, true};
                make_zip(path, &e, 1);
                /* local header (30 bytes) + "a.npy": the deflate stream's first bytes */
                corrupt_after(path, "PK\3\4", 30 + 5 + 1, 0xff);
                break;
        }
        case NPZ_METHOD:
                make_npz1(path, "a.npy", f4_dict, f4_data, sizeof(f4_data), false);
                /* method 12 (bzip2) in the local and the central header: data that is not bzip2 */
                corrupt_after(path, "PK\3\4", 8, 12);
                corrupt_after(path, "PK\1\2", 10, 12);
                break;
        case NPZ_DUP_NAMES: {
                /* libzip will not write two entries of one name: rename the second by hand */
                struct zentry e[2] = {{"a.npy", body, len, false}, {"b.npy", body, len, false}};
                make_zip(path, e, 2);
                corrupt_after(path, "b.npy", 0, 'a' ^ 'b');
                corrupt_after(path, "b.npy", 0, 'a' ^ 'b');
                break;
        }
        case NPZ_NDIM33:
                make_npz1(path, "a.npy",
                          "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, "
                          "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
                          "1, 1, 1), }",
                          "\0", 1, false);
                break;
        case NPZ_SHAPE_OVERFLOW:
                make_npz1(path, "a.npy",
                          "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, "
                          "4294967296), }",
                          NULL, 0, false);
                break;
        case NPZ_NEG_DIM:
                make_npz1(path, "a.npy",
                          "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", f4_data,
                          sizeof(f4_data), false);
                break;
        case NPZ_GOOD_THEN_BAD: {
                other = npy_body("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
                                 "\0\0\0\0\0\0\0\0", 8, &len2);
                struct zentry e[2] = {{"a.npy", body, len, false}, {"z.npy", other, len2, true}};
                make_zip(path, e, 2);
                free(other);
                break;
        }
        case NPZ_N:
                break;
        }
        free(body);
}

START_TEST(malformed_npz_publish_nothing)
{
        static const char keep_hdr[] =
                "{\"k\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
        const uint8_t keep[4] = {9, 8, 7, 6};
        const char *path = path_of("bad.npz");
        char what[32];
        struct dlx_info info;
        dlx_client *c;

        snprintf(what, sizeof(what), "npz case %d", _i);
        make_st(path_of("keep.safetensors"), keep_hdr, keep, sizeof(keep));
        put_ok("keep", path_of("keep.safetensors"));
        make_bad_npz((enum npz_bad)_i, path);
        c = fx_connect(&fx, "reader");
        struct dlx_stats before = fx_stats(c);
        put_refused(what, "keep", path);
        put_refused(what, "fresh", path);
        ck_assert_int_eq(dlx_stat(c, "keep", &info), 0);
        ck_assert_msg(info.version == 1, "%s: 'keep' went to version %llu", what,
                      (unsigned long long)info.version);
        ck_assert_int_eq(dlx_stat(c, "fresh", &info), -ENOENT);
        ck_assert_int_eq(count_names(c), 1);
        ck_assert_uint_eq(fx_stats(c).publishes, before.publishes);
        dlx_close(c);
}
END_TEST

/* The control case: the .npz those bad ones are made from is fine. */
START_TEST(the_good_npz_is_accepted)
{
        dlx_group *g = NULL;
        dlx_client *c;

        make_npz1(path_of("good.npz"), "a.npy", f4_dict, f4_data, sizeof(f4_data), true);
        put_ok("good", path_of("good.npz"));
        c = fx_connect(&fx, "reader");
        ck_assert_int_eq(dlx_acquire_group(c, "good", NULL, 0, NULL, &g), 0);
        expect_elements("a", dlx_group_tensor(g, 0), f4_data, sizeof(f4_data));
        dlx_group_release(g);
        dlx_close(c);
}
END_TEST

Suite *group_files_suite(void)
{
        Suite *s = suite_create("group-files");
        TCase *rt = tcase_create("round-trips");
        TCase *bad = tcase_create("malformed");

        tcase_add_checked_fixture(rt, setup, teardown);
        tcase_add_test(rt, every_safetensors_dtype_round_trips);
        tcase_add_test(rt, put_group_is_persistent_and_read_only);
        tcase_add_test(rt, npz_kinds_round_trip);
        tcase_add_test(rt, fortran_npz_to_safetensors_is_row_major);
        tcase_add_test(rt, the_good_npz_is_accepted);
        suite_add_tcase(s, rt);

        tcase_add_checked_fixture(bad, setup, teardown);
        tcase_add_rows(bad, malformed_safetensors_publish_nothing, bad_st);
        tcase_add_test(bad, short_safetensors_publish_nothing);
        tcase_add_loop_test(bad, malformed_npz_publish_nothing, 0, NPZ_N);
        suite_add_tcase(s, bad);
        return s;
}
