/* SPDX-License-Identifier: MIT */
/*
 * dlxctl end to end: the real binary ($DLXCTL) run with fork/execv against a
 * real dlxd per test, its stdout, stderr and exit status captured. Input .npy
 * files are built by hand (preamble, dict, padding), and what get writes is
 * checked byte by byte and through client/npy's header reader, so a wrong
 * dtype, layout or byte order shows up as a mismatch rather than passing
 * through a shared helper unnoticed.
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
#include <time.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"
#include "npy.h"
#include "npz.h"
#include "safetensors.h"
#include "tfile.h"
#include "tmpfiles.h"

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST '<'
#else
#define HOST '>'
#endif

/* How long one dlxctl run may take before the test kills it and fails. */
#define CTL_TIMEOUT_MS 10000
#define MAX_ARGS 32

static char basedir[64];

/* ---- small helpers --------------------------------------------------------------------- */

static void fill(void *buf, size_t n, unsigned seed)
{
        uint8_t *p = buf;

        for (size_t i = 0; i < n; i++)
                p[i] = (uint8_t)(i * 131u + seed * 7u + 1u);
}

static unsigned count_lines(const char *s)
{
        unsigned n = 0;

        for (; *s; s++)
                n += *s == '\n';
        return n;
}

/* Line i (0-based) of s, copied into buf without its newline; "" past the end. */
static const char *line_of(const char *s, unsigned i, char *buf, size_t size)
{
        const char *end;

        for (; i > 0 && s; i--) {
                s = strchr(s, '\n');
                if (s)
                        s++;
        }
        if (!s) {
                buf[0] = '\0';
                return buf;
        }
        end = strchr(s, '\n');
        snprintf(buf, size, "%.*s", (int)(end ? end - s : (ptrdiff_t)strlen(s)), s);
        return buf;
}

/* ---- a minimal JSON syntax checker ------------------------------------------------------ */

static bool json_value(const char **p, int depth);

static void json_ws(const char **p)
{
        while (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r')
                (*p)++;
}

static bool json_string(const char **p)
{
        const char *s = *p;

        if (*s++ != '"')
                return false;
        while (*s != '"') {
                if ((unsigned char)*s < 0x20)
                        return false; /* NUL (end of text) or an unescaped control */
                if (*s == '\\') {
                        s++;
                        if (*s == 'u') {
                                for (int i = 1; i <= 4; i++)
                                        if (!strchr("0123456789abcdefABCDEF", s[i]) || !s[i])
                                                return false;
                                s += 5;
                        } else if (*s && strchr("\"\\/bfnrt", *s)) {
                                s++;
                        } else {
                                return false;
                        }
                } else {
                        s++;
                }
        }
        *p = s + 1;
        return true;
}

static bool json_number(const char **p)
{
        const char *s = *p;

        if (*s == '-')
                s++;
        if (*s == '0')
                s++;
        else if (*s >= '1' && *s <= '9')
                while (*s >= '0' && *s <= '9')
                        s++;
        else
                return false;
        if (*s == '.') {
                s++;
                if (!(*s >= '0' && *s <= '9'))
                        return false;
                while (*s >= '0' && *s <= '9')
                        s++;
        }
        if (*s == 'e' || *s == 'E') {
                s++;
                if (*s == '+' || *s == '-')
                        s++;
                if (!(*s >= '0' && *s <= '9'))
                        return false;
                while (*s >= '0' && *s <= '9')
                        s++;
        }
        *p = s;
        return true;
}

static bool json_list(const char **p, int depth, char close, bool members)
{
        (*p)++;
        json_ws(p);
        if (**p == close) {
                (*p)++;
                return true;
        }
        for (;;) {
                json_ws(p);
                if (members) {
                        if (!json_string(p))
                                return false;
                        json_ws(p);
                        if (*(*p)++ != ':')
                                return false;
                }
                if (!json_value(p, depth + 1))
                        return false;
                json_ws(p);
                if (**p == close) {
                        (*p)++;
                        return true;
                }
                if (*(*p)++ != ',')
                        return false;
        }
}

static bool json_value(const char **p, int depth)
{
        if (depth > 32)
                return false;
        json_ws(p);
        switch (**p) {
        case '{':
                return json_list(p, depth, '}', true);
        case '[':
                return json_list(p, depth, ']', false);
        case '"':
                return json_string(p);
        case 't':
        case 'f':
        case 'n': {
                static const char *const words[] = {"true", "false", "null"};

                for (int i = 0; i < 3; i++) {
                        size_t n = strlen(words[i]);

                        if (strncmp(*p, words[i], n) == 0) {
                                *p += n;
                                return true;
                        }
                }
                return false;
        }
        default:
                return json_number(p);
        }
}

/* Whether s is exactly one JSON value (surrounding whitespace allowed). */
static bool json_valid(const char *s)
{
        if (!json_value(&s, 0))
                return false;
        json_ws(&s);
        return *s == '\0';
}

/* Whether json has the member text (e.g. "\"watchers\":1") ending a value there. */
static bool json_has(const char *json, const char *member)
{
        size_t n = strlen(member);

        for (const char *p = strstr(json, member); p; p = strstr(p + 1, member))
                if (p[n] == ',' || p[n] == '}' || p[n] == ']')
                        return true;
        return false;
}

/* The unsigned number after "key": in json; fails the test if absent. */
static uint64_t json_u64(const char *json, const char *key)
{
        char pat[64];
        const char *p;

        snprintf(pat, sizeof(pat), "\"%s\":", key);
        p = strstr(json, pat);
        ck_assert_msg(p, "no \"%s\" in %s", key, json);
        return strtoull(p + strlen(pat), NULL, 10);
}

/* The object of a JSON list whose name is name, copied into buf (no nested objects in these). */
static const char *json_entry(const char *json, const char *name, char *buf, size_t size)
{
        char pat[300];
        const char *p, *end;

        snprintf(pat, sizeof(pat), "{\"name\":\"%s\"", name);
        p = strstr(json, pat);
        ck_assert_msg(p, "no entry for %s in %s", name, json);
        end = strchr(p, '}');
        ck_assert_ptr_nonnull(end);
        snprintf(buf, size, "%.*s", (int)(end - p + 1), p);
        return buf;
}

/* ---- running dlxctl -------------------------------------------------------------------- */

struct ctl {
        pid_t pid;
        int out_fd, err_fd;
        char desc[512]; /* the command line, for messages */
};

struct sbuf {
        char *data;
        size_t len, cap;
};

static void sbuf_add(struct sbuf *b, const char *data, size_t n)
{
        if (b->len + n + 1 > b->cap) {
                b->cap = (b->len + n + 1) * 2;
                b->data = realloc(b->data, b->cap);
                ck_assert_ptr_nonnull(b->data);
        }
        memcpy(b->data + b->len, data, n);
        b->len += n;
        b->data[b->len] = '\0';
}

/* Starts $DLXCTL with args (NULL-terminated); with_socket prepends --socket fx.socket. */
static void ctl_start(struct ctl *c, bool with_socket, const char *const *args)
{
        const char *bin = getenv("DLXCTL");
        const char *argv[MAX_ARGS + 4];
        int out[2], err[2], n = 0;
        size_t off;

        ck_assert_msg(bin && *bin, "DLXCTL is not set");
        argv[n++] = "dlxctl";
        if (with_socket) {
                argv[n++] = "--socket";
                argv[n++] = fx.socket;
        }
        for (int i = 0; args[i]; i++) {
                ck_assert_int_lt(n, MAX_ARGS + 2);
                argv[n++] = args[i];
        }
        argv[n] = NULL;
        off = (size_t)snprintf(c->desc, sizeof(c->desc), "dlxctl");
        for (int i = 1; i < n && off < sizeof(c->desc); i++)
                off += (size_t)snprintf(c->desc + off, sizeof(c->desc) - off, " %s", argv[i]);

        ck_assert_int_eq(pipe2(out, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(err, O_CLOEXEC), 0);
        c->pid = fork();
        ck_assert_int_ge(c->pid, 0);
        if (c->pid == 0) {
                /* only async-signal-safe calls between fork and exec */
                if (dup2(out[1], STDOUT_FILENO) < 0 || dup2(err[1], STDERR_FILENO) < 0)
                        _exit(127);
                execv(bin, (char *const *)argv);
                {
                        static const char msg[] = "test-dlxctl: cannot execute $DLXCTL\n";

                        (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
                }
                _exit(127);
        }
        close(out[1]);
        close(err[1]);
        c->out_fd = out[0];
        c->err_fd = err[0];
}

/*
 * Collects everything c writes until it exits, at most timeout_ms (then it is
 * killed and the test fails). Returns its exit status, or 128 + signal.
 * *out and *err (each may be NULL) receive malloc'd NUL-terminated text.
 */
static int ctl_finish(struct ctl *c, int timeout_ms, char **out, char **err)
{
        struct sbuf bufs[2] = {{0}, {0}};
        struct pollfd pfd[2] = {{.fd = c->out_fd, .events = POLLIN},
                                {.fd = c->err_fd, .events = POLLIN}};
        int64_t deadline = fx_now_ms() + timeout_ms;
        int open_fds = 2, status;
        char chunk[4096];

        sbuf_add(&bufs[0], "", 0);
        sbuf_add(&bufs[1], "", 0);
        while (open_fds > 0) {
                int64_t left = deadline - fx_now_ms();
                int r;

                if (left <= 0) {
                        kill(c->pid, SIGKILL);
                        waitpid(c->pid, &status, 0);
                        ck_abort_msg("%s did not finish in %d ms; stdout: %s; stderr: %s", c->desc,
                                     timeout_ms, bufs[0].data, bufs[1].data);
                }
                r = poll(pfd, 2, (int)left);
                if (r < 0 && errno == EINTR)
                        continue;
                ck_assert_int_ge(r, 0);
                for (int i = 0; i < 2; i++) {
                        ssize_t n;

                        if (pfd[i].fd < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                                continue;
                        n = read(pfd[i].fd, chunk, sizeof(chunk));
                        if (n < 0 && errno == EINTR)
                                continue;
                        if (n <= 0) {
                                close(pfd[i].fd);
                                pfd[i].fd = -1;
                                open_fds--;
                                continue;
                        }
                        sbuf_add(&bufs[i], chunk, (size_t)n);
                }
        }
        ck_assert_int_eq(waitpid(c->pid, &status, 0), c->pid);
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

/* desc (may be NULL) receives the command line, for messages. */
static int run_va(char **out, char **err, char *desc, bool with_socket, const char *arg0,
                  va_list ap)
{
        const char *args[MAX_ARGS + 1];
        struct ctl c;
        int n = 0;

        for (const char *a = arg0; a; a = va_arg(ap, const char *)) {
                ck_assert_int_lt(n, MAX_ARGS);
                args[n++] = a;
        }
        args[n] = NULL;
        ctl_start(&c, with_socket, args);
        if (desc)
                memcpy(desc, c.desc, sizeof(c.desc));
        return ctl_finish(&c, CTL_TIMEOUT_MS, out, err);
}

/*
 * Runs dlxctl --socket fx.socket arg0 ... (NULL-terminated) and returns its
 * exit status; *out and *err (each may be NULL) get its output, to free.
 */
static int run_ctl(char **out, char **err, const char *arg0, ...)
{
        va_list ap;
        int rc;

        va_start(ap, arg0);
        rc = run_va(out, err, NULL, true, arg0, ap);
        va_end(ap);
        return rc;
}

/* Same without the --socket option: the arguments are exactly arg0 .... */
static int run_ctl_bare(char **out, char **err, const char *arg0, ...)
{
        va_list ap;
        int rc;

        va_start(ap, arg0);
        rc = run_va(out, err, NULL, false, arg0, ap);
        va_end(ap);
        return rc;
}

/* Runs dlxctl --socket fx.socket arg0 ..., requires exit 0 and returns its stdout, to free. */
static char *ctl_ok(const char *arg0, ...)
{
        char desc[sizeof(((struct ctl *)0)->desc)], *out, *err;
        va_list ap;
        int rc;

        va_start(ap, arg0);
        rc = run_va(&out, &err, desc, true, arg0, ap);
        va_end(ap);
        ck_assert_msg(rc == 0, "%s: exit %d; stderr: %s", desc, rc, err);
        free(err);
        return out;
}

/*
 * Runs dlxctl as ctl_ok() does and requires cond, an expression of its
 * stdout ctl_out, to hold (the failure names the command and its output).
 */
#define CTL_EXPECT(cond, ...)                                                                      \
        do {                                                                                       \
                char *ctl_out = ctl_ok(__VA_ARGS__, NULL);                                         \
                ck_assert_msg(cond, "dlxctl %s: %s", #__VA_ARGS__, ctl_out);                       \
                free(ctl_out);                                                                     \
        } while (0)

/* The same, requiring a stdout of exactly want. */
#define CTL_EXPECT_STR(want, ...) CTL_EXPECT(strcmp(ctl_out, want) == 0, __VA_ARGS__)

/* Starts dlxctl --socket fx.socket arg0 ... in the background. */
static void ctl_spawn(struct ctl *c, const char *arg0, ...)
{
        const char *args[MAX_ARGS + 1];
        va_list ap;
        int n = 0;

        va_start(ap, arg0);
        for (const char *a = arg0; a; a = va_arg(ap, const char *)) {
                ck_assert_int_lt(n, MAX_ARGS);
                args[n++] = a;
        }
        va_end(ap);
        args[n] = NULL;
        ctl_start(c, true, args);
}

/* Requires exit status want and a stderr containing needle (if any); frees the outputs. */
static void expect_fail(int want, const char *needle, const char *what, int rc, char *out,
                        char *err)
{
        ck_assert_msg(rc == want, "%s: exit %d, expected %d; stdout: %s; stderr: %s", what, rc,
                      want, out, err);
        ck_assert_msg(strlen(err) > 0, "%s: exit %d without a message on stderr", what, rc);
        if (needle)
                ck_assert_msg(strstr(err, needle), "%s: stderr does not mention '%s': %s", what,
                              needle, err);
        free(out);
        free(err);
}

/* ---- .npy files ------------------------------------------------------------------------- */

/*
 * Writes a .npy of format major.0 with the given dict text, padded as numpy
 * pads (spaces, then a newline, data at a multiple of 64), then data.
 */
static void write_npy(const char *path, int major, const char *dict, const void *data, size_t n)
{
        size_t pre = major == 1 ? 10 : 12, dlen = strlen(dict);
        size_t pad = (64 - (pre + dlen + 1) % 64) % 64;
        size_t hlen = dlen + pad + 1, total = pre + hlen + n;
        uint8_t *buf = malloc(total ? total : 1);

        ck_assert_ptr_nonnull(buf);
        memcpy(buf, "\x93NUMPY", 6);
        buf[6] = (uint8_t)major;
        buf[7] = 0;
        for (size_t i = 0; i < pre - 8; i++)
                buf[8 + i] = (uint8_t)(hlen >> (8 * i));
        memcpy(buf + pre, dict, dlen);
        memset(buf + pre + dlen, ' ', pad);
        buf[pre + hlen - 1] = '\n';
        if (n)
                memcpy(buf + pre + hlen, data, n);
        write_file(path, buf, total);
        free(buf);
}

/* A format 1.0 .npy of descr, fortran order and shape text such as "(2, 3)". */
static void make_npy(const char *path, const char *descr, bool fortran, const char *shape,
                     const void *data, size_t n)
{
        char dict[512];

        snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr,
                 fortran ? "True" : "False", shape);
        write_npy(path, 1, dict, data, n);
}

/*
 * Checks a .npy that get wrote: the descr text, fortran_order, shape, no byte
 * swap, exactly nbytes of data equal to data, and nothing after it.
 */
static void check_npy(const char *path, const char *descr, bool fortran, int32_t ndim,
                      const int64_t *shape, const void *data, size_t nbytes)
{
        struct npy_info info;
        char errbuf[256], want[64], *hdr;
        size_t len, pre;
        uint8_t *buf = slurp(path, &len);
        int fd;

        ck_assert_msg(len >= 10 && memcmp(buf, "\x93NUMPY", 6) == 0, "%s is not a .npy", path);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        ck_assert_msg(npy_read_header(fd, &info, errbuf, sizeof(errbuf)) == 0, "%s: %s", path,
                      errbuf);
        close(fd);
        pre = buf[6] == 1 ? 10 : 12;
        hdr = strndup((const char *)buf + pre, info.data_offset - pre);
        ck_assert_ptr_nonnull(hdr);
        snprintf(want, sizeof(want), "'descr': '%s'", descr);
        ck_assert_msg(strstr(hdr, want), "%s: header lacks %s: %s", path, want, hdr);
        ck_assert_msg(strstr(hdr, fortran ? "'fortran_order': True" : "'fortran_order': False"),
                      "%s: fortran_order should be %s: %s", path, fortran ? "True" : "False", hdr);
        free(hdr);
        ck_assert_msg(!info.swap_bytes, "%s: get wrote a non-native byte order", path);
        ck_assert_int_eq(info.fortran_order, fortran);
        ck_assert_int_eq(info.ndim, ndim);
        for (int32_t i = 0; i < ndim; i++)
                ck_assert_int_eq(info.shape[i], shape[i]);
        ck_assert_uint_eq(info.data_bytes, nbytes);
        ck_assert_msg(len == info.data_offset + nbytes, "%s: %zu bytes, expected %llu + %zu", path,
                      len, (unsigned long long)info.data_offset, nbytes);
        /* one assertion, not one per byte: each ck_assert costs a message to the runner */
        if (nbytes && memcmp(buf + info.data_offset, data, nbytes) != 0) {
                size_t i = 0;

                while (buf[info.data_offset + i] == ((const uint8_t *)data)[i])
                        i++;
                ck_abort_msg("%s: data byte %zu is 0x%02x, expected 0x%02x", path, i,
                             buf[info.data_offset + i], ((const uint8_t *)data)[i]);
        }
        free(buf);
}

/* ---- fixtures --------------------------------------------------------------------------- */

/*
 * Each test case's files live in a directory of their own under basedir. A
 * failing check ends the test's process without its teardown, so basedir is
 * made and removed, with whatever is left in it, by an unchecked fixture that
 * runs in the runner's process.
 */
static void base_setup(void)
{
        snprintf(basedir, sizeof(basedir), "/tmp/dlxctl-test-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(basedir));
}

static void base_teardown(void)
{
        remove_tree(basedir);
}

static void tmp_setup(void)
{
        snprintf(tmpdir, sizeof(tmpdir), "%s/t-XXXXXX", basedir);
        ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void setup(void)
{
        fx_setup();
        tmp_setup();
}

static void teardown(void)
{
        tmpdir_remove();
        fx_teardown();
}

/* ---- round trips ------------------------------------------------------------------------ */

static const struct {
        const char *kind; /* numpy kind and size, e.g. "f4" */
        size_t size;
        uint8_t code, bits;
} dtypes[] = {
        {"b1", 1, kDLBool, 8},     {"i1", 1, kDLInt, 8},         {"i2", 2, kDLInt, 16},
        {"i4", 4, kDLInt, 32},     {"i8", 8, kDLInt, 64},        {"u1", 1, kDLUInt, 8},
        {"u2", 2, kDLUInt, 16},    {"u4", 4, kDLUInt, 32},       {"u8", 8, kDLUInt, 64},
        {"f2", 2, kDLFloat, 16},   {"f4", 4, kDLFloat, 32},      {"f8", 8, kDLFloat, 64},
        {"c8", 8, kDLComplex, 64}, {"c16", 16, kDLComplex, 128},
};

#define N_DTYPES (int)N_ELEMS(dtypes)

START_TEST(test_roundtrip_dtypes)
{
        const int64_t shape[2] = {2, 3};
        char descr[8], member[64], *out;
        size_t n = 6 * dtypes[_i].size;
        uint8_t data[6 * 16];

        snprintf(descr, sizeof(descr), "%c%s", dtypes[_i].size == 1 ? '|' : HOST, dtypes[_i].kind);
        fill(data, n, (unsigned)_i);
        if (dtypes[_i].code == kDLBool)
                for (size_t i = 0; i < n; i++)
                        data[i] = (uint8_t)(i % 3 == 1);
        make_npy(path_of("in.npy"), descr, false, "(2, 3)", data, n);

        CTL_EXPECT_STR("t/x v1\n", "put", "t/x", path_of("in.npy"));

        out = ctl_ok("--json", "stat", "t/x", NULL);
        ck_assert_msg(json_valid(out), "--json stat is not JSON: %s", out);
        snprintf(member, sizeof(member), "\"dtype_code\":%u", dtypes[_i].code);
        ck_assert_msg(json_has(out, member), "%s: want %s in %s", descr, member, out);
        snprintf(member, sizeof(member), "\"bits\":%u", dtypes[_i].bits);
        ck_assert_msg(json_has(out, member), "%s: want %s in %s", descr, member, out);
        ck_assert_msg(json_has(out, "\"shape\":[2,3]"), "%s", out);
        snprintf(member, sizeof(member), "\"nbytes\":%zu", n);
        ck_assert_msg(json_has(out, member), "%s: want %s in %s", descr, member, out);
        free(out);

        CTL_EXPECT_STR("", "get", "t/x", path_of("out.npy"));
        check_npy(path_of("out.npy"), descr, false, 2, shape, data, n);
}
END_TEST

START_TEST(test_roundtrip_0d_and_empty)
{
        const int64_t s0[1] = {0}, s30[2] = {3, 0};
        double v = -1234.5;

        /* 0-d: shape (), one element */
        make_npy(path_of("scalar.npy"), "<f8", false, "()", &v, sizeof(v));
        free(ctl_ok("put", "scalar", path_of("scalar.npy"), NULL));
        CTL_EXPECT(json_has(ctl_out, "\"shape\":[]") && json_has(ctl_out, "\"nbytes\":8"), "--json",
                   "stat", "scalar");
        free(ctl_ok("get", "scalar", path_of("scalar-out.npy"), NULL));
        check_npy(path_of("scalar-out.npy"), "<f8", false, 0, NULL, &v, sizeof(v));

        /* size 0 in one and in two dimensions */
        make_npy(path_of("e1.npy"), "<f4", false, "(0,)", NULL, 0);
        make_npy(path_of("e2.npy"), "<i2", false, "(3, 0)", NULL, 0);
        free(ctl_ok("put", "empty1", path_of("e1.npy"), NULL));
        free(ctl_ok("put", "empty2", path_of("e2.npy"), NULL));
        CTL_EXPECT(strstr(ctl_out, "shape:         (0,)\n"), "stat", "empty1");
        CTL_EXPECT(json_has(ctl_out, "\"shape\":[3,0]") && json_has(ctl_out, "\"nbytes\":0"),
                   "--json", "stat", "empty2");
        free(ctl_ok("get", "empty1", path_of("e1-out.npy"), NULL));
        free(ctl_ok("get", "empty2", path_of("e2-out.npy"), NULL));
        check_npy(path_of("e1-out.npy"), "<f4", false, 1, s0, NULL, 0);
        check_npy(path_of("e2-out.npy"), "<i2", false, 2, s30, NULL, 0);
}
END_TEST

START_TEST(test_roundtrip_fortran)
{
        /* 2x3 int32 in column-major order: a[i][j] = 10 i + j stored as a00 a10 a01 a11 ... */
        const int64_t shape[2] = {2, 3};
        int32_t data[6];
        char *out;

        for (int j = 0, k = 0; j < 3; j++)
                for (int i = 0; i < 2; i++)
                        data[k++] = 10 * i + j;
        make_npy(path_of("f.npy"), "<i4", true, "(2, 3)", data, sizeof(data));
        free(ctl_ok("put", "fort", path_of("f.npy"), NULL));
        out = ctl_ok("--json", "stat", "fort", NULL);
        ck_assert_msg(json_has(out, "\"shape\":[2,3]") && json_has(out, "\"strides\":[1,2]"),
                      "a Fortran-order array should have column-major strides: %s", out);
        free(out);
        free(ctl_ok("get", "fort", path_of("f-out.npy"), NULL));
        check_npy(path_of("f-out.npy"), "<i4", true, 2, shape, data, sizeof(data));
}
END_TEST

static void to_be(void *p, size_t width)
{
        uint8_t *b = p;

        if (HOST == '>')
                return;
        for (size_t i = 0, j = width - 1; i < j; i++, j--) {
                uint8_t t = b[i];

                b[i] = b[j];
                b[j] = t;
        }
}

static const float be_f4[6] = {1.5f, -2.25f, 3e10f, 0.0f, -0.0f, 1e-40f};
static const int16_t be_i2[4] = {1, -2, 0x1234, -32768};
static const float be_c8[4] = {1.0f, -1.0f, 0.5f, 1e20f}; /* two complex64: re, im each */

/* Big-endian input, each scalar of width bytes swapped on its own (a complex is two floats). */
static const struct be_row {
        const char *type; /* the descr after its byte order */
        size_t width;
        const void *data;
        size_t size;
        const char *shape_text;
        int ndim;
        int64_t shape[2];
} be_rows[] = {
        {"f4", 4, be_f4, sizeof(be_f4), "(2, 3)", 2, {2, 3}},
        {"i2", 2, be_i2, sizeof(be_i2), "(4,)", 1, {4}},
        {"c8", 4, be_c8, sizeof(be_c8), "(2,)", 1, {2}},
};

START_TEST(big_endian_input_comes_back_in_host_order)
{
        const struct be_row *row = &be_rows[_i];
        uint8_t be[sizeof(be_f4)];
        char descr[8], name[16];

        ck_assert_uint_le(row->size, sizeof(be));
        memcpy(be, row->data, row->size);
        for (size_t i = 0; i < row->size / row->width; i++)
                to_be(be + row->width * i, row->width);
        snprintf(descr, sizeof(descr), ">%s", row->type);
        snprintf(name, sizeof(name), "be/%s", row->type);
        make_npy(path_of("in.npy"), descr, false, row->shape_text, be, row->size);
        free(ctl_ok("put", name, path_of("in.npy"), NULL));
        free(ctl_ok("get", name, path_of("out.npy"), NULL));
        descr[0] = HOST;
        check_npy(path_of("out.npy"), descr, false, row->ndim, row->shape, row->data, row->size);
}
END_TEST

/* Format versions 1.0, 2.0 and 3.0 as input; get always writes a readable file back. */
START_TEST(test_roundtrip_versions)
{
        const int major = _i;
        const int64_t shape[2] = {3, 4};
        char dict[128], descr[8], name[32];
        int32_t data[12];

        for (int i = 0; i < 12; i++)
                data[i] = i * 1000 - 5000 + major;
        snprintf(descr, sizeof(descr), "%ci4", HOST);
        /* keys in another order than numpy's own, as the format allows */
        snprintf(dict, sizeof(dict), "{'shape': (3, 4), 'fortran_order': False, 'descr': '%s'}",
                 descr);
        write_npy(path_of("v.npy"), major, dict, data, sizeof(data));
        snprintf(name, sizeof(name), "ver/%d", major);
        free(ctl_ok("put", name, path_of("v.npy"), NULL));
        free(ctl_ok("get", name, path_of("v-out.npy"), NULL));
        check_npy(path_of("v-out.npy"), descr, false, 2, shape, data, sizeof(data));
}
END_TEST

/* Bigger than the client allocator's first segment, so the data spans a segment of its own. */
START_TEST(test_roundtrip_large)
{
        const int64_t shape[2] = {512, 300};
        size_t n = 512 * 300 * 8;
        uint8_t *data = malloc(n);
        char descr[8];

        ck_assert_ptr_nonnull(data);
        fill(data, n, 99);
        snprintf(descr, sizeof(descr), "%cf8", HOST);
        make_npy(path_of("big.npy"), descr, false, "(512, 300)", data, n);
        free(ctl_ok("put", "big", path_of("big.npy"), NULL));
        free(ctl_ok("get", "big", path_of("big-out.npy"), NULL));
        check_npy(path_of("big-out.npy"), descr, false, 2, shape, data, n);
        free(data);
}
END_TEST

/* Input read from a FIFO: no size to check up front, so a short one fails after allocating. */
struct fifo_writer {
        const char *path;
        const void *data;
        size_t n;
};

static int fifo_write(void *arg)
{
        const struct fifo_writer *w = arg;
        int fd = open(w->path, O_WRONLY | O_CLOEXEC);

        if (fd < 0)
                return 1;
        signal(SIGPIPE, SIG_IGN);
        if (write(fd, w->data, w->n) != (ssize_t)w->n)
                return 2;
        close(fd);
        return 0;
}

START_TEST(test_put_from_fifo)
{
        const int64_t shape[1] = {16};
        struct fifo_writer w;
        uint8_t *file;
        size_t len;
        char descr[8], *out, *err;
        int rc;
        pid_t pid;

        snprintf(descr, sizeof(descr), "%cu4", HOST);
        {
                uint8_t data[64];

                fill(data, sizeof(data), 5);
                make_npy(path_of("src.npy"), descr, false, "(16,)", data, sizeof(data));
                file = slurp(path_of("src.npy"), &len);
                ck_assert_int_eq(mkfifo(path_of("fifo"), 0600), 0);

                w = (struct fifo_writer){.path = path_of("fifo"), .data = file, .n = len};
                pid = fx_spawn(fifo_write, &w);
                free(ctl_ok("put", "fifo/full", path_of("fifo"), NULL));
                ck_assert_int_eq(fx_wait(pid), 0);
                free(ctl_ok("get", "fifo/full", path_of("full-out.npy"), NULL));
                check_npy(path_of("full-out.npy"), descr, false, 1, shape, data, sizeof(data));
        }

        /* the header promises 64 bytes of data; only 10 come */
        w.n = len - 54;
        pid = fx_spawn(fifo_write, &w);
        rc = run_ctl(&out, &err, "put", "fifo/short", path_of("fifo"), NULL);
        ck_assert_int_eq(fx_wait(pid), 0);
        expect_fail(1, "shorter", "put of a short FIFO", rc, out, err);
        rc = run_ctl(&out, &err, "stat", "fifo/short", NULL);
        expect_fail(1, "no tensor named", "stat after a failed put", rc, out, err);
        free(file);
}
END_TEST

/* ---- refused input ---------------------------------------------------------------------- */

static const struct {
        const char *descr; /* as written in the header; NULL for the structured one */
        const char *needle;
        size_t bytes; /* data for shape (2,) */
} unsupported[] = {
        {"<U4", "'<U4'", 32},   {"|O", "'|O'", 16},   {"<M8[s]", "'<M8[s]'", 16},
        {"<f16", "'<f16'", 32}, {"|V8", "'|V8'", 16}, {NULL, "structured", 24},
};

START_TEST(test_put_unsupported_dtype)
{
        uint8_t data[32] = {0};
        char dict[256], what[64], *out, *err;
        int rc;

        if (unsupported[_i].descr)
                snprintf(dict, sizeof(dict),
                         "{'descr': '%s', 'fortran_order': False, 'shape': (2,), }",
                         unsupported[_i].descr);
        else
                snprintf(dict, sizeof(dict),
                         "{'descr': [('a', '<i4'), ('b', '<f8')], 'fortran_order': False, "
                         "'shape': (2,), }");
        write_npy(path_of("bad.npy"), 1, dict, data, unsupported[_i].bytes);
        snprintf(what, sizeof(what), "put of %s", unsupported[_i].needle);
        rc = run_ctl(&out, &err, "put", "bad", path_of("bad.npy"), NULL);
        ck_assert_msg(strcmp(out, "") == 0, "%s printed: %s", what, out);
        expect_fail(1, unsupported[_i].needle, what, rc, out, err);

        /* nothing published, nothing even attempted */
        CTL_EXPECT_STR("[]\n", "--json", "list");
        CTL_EXPECT(json_has(ctl_out, "\"names\":0") && json_has(ctl_out, "\"publishes\":0"),
                   "--json", "stats");
}
END_TEST

START_TEST(test_put_bad_files)
{
        float data[10] = {0};
        uint8_t *file;
        size_t len;
        char *out, *err;
        int rc;

        rc = run_ctl(&out, &err, "put", "x", path_of("missing.npy"), NULL);
        expect_fail(1, "missing.npy", "put of a missing file", rc, out, err);

        /* header says 10 floats; 3 follow */
        make_npy(path_of("short.npy"), "<f4", false, "(10,)", data, 12);
        rc = run_ctl(&out, &err, "put", "x", path_of("short.npy"), NULL);
        expect_fail(1, "truncated", "put of truncated data", rc, out, err);

        /* cut inside the header */
        make_npy(path_of("full.npy"), "<f4", false, "(10,)", data, sizeof(data));
        file = slurp(path_of("full.npy"), &len);
        write_file(path_of("cut.npy"), file, 30);
        rc = run_ctl(&out, &err, "put", "x", path_of("cut.npy"), NULL);
        expect_fail(1, "truncated", "put of a truncated header", rc, out, err);

        /* one wrong magic byte */
        file[1] = 'n';
        write_file(path_of("magic.npy"), file, len);
        rc = run_ctl(&out, &err, "put", "x", path_of("magic.npy"), NULL);
        expect_fail(1, "magic", "put of a file with bad magic", rc, out, err);
        free(file);

        /* an empty file, and a directory */
        write_file(path_of("empty.npy"), "", 0);
        rc = run_ctl(&out, &err, "put", "x", path_of("empty.npy"), NULL);
        expect_fail(1, NULL, "put of an empty file", rc, out, err);
        rc = run_ctl(&out, &err, "put", "x", tmpdir, NULL);
        expect_fail(1, NULL, "put of a directory", rc, out, err);

        /* a good file under a name the daemon refuses */
        rc = run_ctl(&out, &err, "put", "a//b", path_of("full.npy"), NULL);
        expect_fail(1, "a//b", "put under a bad name", rc, out, err);

        CTL_EXPECT_STR("[]\n", "--json", "list");
        CTL_EXPECT(json_has(ctl_out, "\"names\":0") && json_has(ctl_out, "\"publishes\":0"),
                   "--json", "stats");
}
END_TEST

/* ---- groups: safetensors and .npz ---------------------------------------------------------- */

/* A safetensors file by hand: its header as given, then len bytes of data. */
static void make_safetensors(const char *path, const char *header, const void *data, size_t len)
{
        size_t hlen = strlen(header);
        uint8_t *buf = malloc(8 + hlen + len);

        ck_assert_ptr_nonnull(buf);
        for (int i = 0; i < 8; i++)
                buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
        memcpy(buf + 8, header, hlen);
        memcpy(buf + 8 + hlen, data, len);
        write_file(path, buf, 8 + hlen + len);
        free(buf);
}

/* Opens a file as a tfile by its suffix, or fails the test. */
static struct tfile *open_tfile(const char *path)
{
        struct tfile *f = NULL;
        char why[256];
        size_t len = strlen(path);
        int err = len > 4 && strcmp(path + len - 4, ".npz") == 0
                          ? npz_open(path, &f, why, sizeof(why))
                          : st_open(path, &f, why, sizeof(why));

        ck_assert_msg(err == 0, "%s: %s", path, why);
        return f;
}

/* Two tensor files hold the same members: names, dtypes, shapes and bytes. */
static void expect_same_tensors(const char *a_path, const char *b_path)
{
        struct tfile *a = open_tfile(a_path), *b = open_tfile(b_path);

        ck_assert_uint_eq(a->n, b->n);
        for (size_t i = 0; i < a->n; i++) {
                const DLTensor *x = &a->members[i].tensor, *y = &b->members[i].tensor;
                ck_assert_str_eq(a->members[i].name, b->members[i].name);
                ck_assert(memcmp(&x->dtype, &y->dtype, sizeof(x->dtype)) == 0);
                ck_assert_int_eq(x->ndim, y->ndim);
                for (int d = 0; d < x->ndim; d++)
                        ck_assert_int_eq(x->shape[d], y->shape[d]);
                ck_assert_uint_eq(a->members[i].nbytes, b->members[i].nbytes);
                ck_assert_msg(memcmp(x->data, y->data, a->members[i].nbytes) == 0,
                              "member %s differs", a->members[i].name);
        }
        tfile_free(a);
        tfile_free(b);
}

static const char st_header[] =
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
        "\"emb\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
        "\"q8\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[32,35]},"
        "\"step\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[35,43]},"
        "\"__metadata__\":{\"format\":\"pt\"}}";

static const char st_numpy_header[] =
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
        "\"step\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,32]}}";

/* put publishes a safetensors or .npz file as one group; get writes either back, same tensors. */
START_TEST(group_files_round_trip)
{
        uint8_t data[43];

        for (size_t i = 0; i < sizeof(data); i++)
                data[i] = (uint8_t)(i * 7 + 1);
        make_safetensors(path_of("m.safetensors"), st_header, data, sizeof(data));
        CTL_EXPECT_STR("model v1 (4 members)\n", "put", "model", path_of("m.safetensors"));
        CTL_EXPECT(strstr(ctl_out, "group:         4 members, ") != NULL, "stat", "model");
        CTL_EXPECT(json_has(ctl_out, "\"members\":4") && json_has(ctl_out, "\"persist\":true"),
                   "--json", "stat", "model");
        CTL_EXPECT(strstr(ctl_out, "4 members") != NULL, "list");
        CTL_EXPECT_STR("", "get", "model", path_of("out.safetensors"));
        expect_same_tensors(path_of("m.safetensors"), path_of("out.safetensors"));
        /* numpy has no bfloat16 nor fp8: .npz refuses this group, and leaves no file */
        char *out, *err;
        int rc = run_ctl(&out, &err, "get", "model", path_of("out.npz"), NULL);
        expect_fail(1, "bfloat16", "get of a bfloat16 member into .npz", rc, out, err);
        ck_assert_int_ne(access(path_of("out.npz"), F_OK), 0);

        /* what numpy holds goes through .npz, and back as a second version of a group */
        make_safetensors(path_of("n.safetensors"), st_numpy_header, data, 32);
        CTL_EXPECT_STR("np v1 (2 members)\n", "put", "np", path_of("n.safetensors"));
        CTL_EXPECT(json_has(ctl_out, "\"members\":2"), "--json", "get", "np", path_of("n.npz"));
        expect_same_tensors(path_of("n.safetensors"), path_of("n.npz"));
        CTL_EXPECT_STR("np v2 (2 members)\n", "put", "np", path_of("n.npz"));
        CTL_EXPECT_STR("", "get", "np", path_of("again.safetensors"));
        expect_same_tensors(path_of("n.safetensors"), path_of("again.safetensors"));

        /* through libdlx: one group, the bytes as the file held them */
        dlx_client *c = fx_connect(&fx, "reader");
        dlx_group *g = NULL;
        ck_assert_int_eq(dlx_acquire_group(c, "model", NULL, 0, NULL, &g), 0);
        ck_assert_uint_eq(dlx_group_count(g), 4);
        int64_t w = dlx_group_find(g, "w");
        ck_assert_int_ge(w, 0);
        ck_assert(memcmp(dlx_group_tensor(g, (size_t)w)->data, data, 24) == 0);
        dlx_group_release(g);
        dlx_close(c);
}
END_TEST

/* A group is not a tensor: get says which file it wants, and put --writable says no. */
START_TEST(group_and_tensor_files_do_not_mix)
{
        uint8_t data[43] = {0};
        float f[4] = {1, 2, 3, 4};
        char *out, *err;
        int rc;

        make_safetensors(path_of("m.safetensors"), st_header, data, sizeof(data));
        make_npy(path_of("t.npy"), "<f4", false, "(4,)", f, sizeof(f));
        CTL_EXPECT_STR("g v1 (4 members)\n", "put", "g", path_of("m.safetensors"));
        CTL_EXPECT_STR("t v1\n", "put", "t", path_of("t.npy"));
        rc = run_ctl(&out, &err, "get", "g", path_of("g.npy"), NULL);
        expect_fail(1, "group", "get of a group into .npy", rc, out, err);
        rc = run_ctl(&out, &err, "get", "t", path_of("t.safetensors"), NULL);
        expect_fail(1, "not a group", "get of a tensor into .safetensors", rc, out, err);
        ck_assert_int_ne(access(path_of("t.safetensors"), F_OK), 0);
        rc = run_ctl(&out, &err, "put", "g2", path_of("m.safetensors"), "--writable", NULL);
        expect_fail(1, "read-only", "put --writable of a group", rc, out, err);
}
END_TEST

/* Malformed files get a clear error and publish nothing. */
START_TEST(bad_group_files_publish_nothing)
{
        static const struct {
                const char *what, *header, *needle;
                size_t len; /* data bytes after the header */
        } rows[] = {
                {"offsets past the data",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", NULL, 8},
                {"overlapping tensors",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 NULL, 12},
                {"size that lies",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", NULL, 8},
                {"unknown dtype", "{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                 "Q7", 1},
                {"not an object", "[1,2,3]", NULL, 0},
                {"duplicate name",
                 "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                 "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                 NULL, 2},
                {"huge shape",
                 "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],"
                 "\"data_offsets\":[0,8]}}",
                 NULL, 8},
        };
        uint8_t data[16] = {0};
        char *out, *err;
        int rc;

        for (size_t i = 0; i < N_ELEMS(rows); i++) {
                make_safetensors(path_of("bad.safetensors"), rows[i].header, data, rows[i].len);
                rc = run_ctl(&out, &err, "put", "bad", path_of("bad.safetensors"), NULL);
                expect_fail(1, rows[i].needle, rows[i].what, rc, out, err);
        }
        /* a header length that lies: past the end of the file */
        make_safetensors(path_of("cut.safetensors"), st_header, data, sizeof(data));
        uint8_t *file;
        size_t len;
        file = slurp(path_of("cut.safetensors"), &len);
        write_file(path_of("cut.safetensors"), file, 20);
        rc = run_ctl(&out, &err, "put", "bad", path_of("cut.safetensors"), NULL);
        expect_fail(1, NULL, "a truncated safetensors file", rc, out, err);
        file[0] = 0xff;
        file[5] = 0x7f;
        write_file(path_of("lie.safetensors"), file, len);
        rc = run_ctl(&out, &err, "put", "bad", path_of("lie.safetensors"), NULL);
        expect_fail(1, NULL, "a header length that lies", rc, out, err);
        free(file);
        /* not a zip */
        static const char not_zip[] = "PK\3\4 not really";
        write_file(path_of("bad.npz"), not_zip, sizeof(not_zip) - 1);
        rc = run_ctl(&out, &err, "put", "bad", path_of("bad.npz"), NULL);
        expect_fail(1, NULL, "a broken .npz", rc, out, err);

        CTL_EXPECT_STR("[]\n", "--json", "list");
        CTL_EXPECT(json_has(ctl_out, "\"names\":0") && json_has(ctl_out, "\"publishes\":0"),
                   "--json", "stats");
}
END_TEST

/* ---- persistence, writable -------------------------------------------------------------- */

/* Acquires name through libdlx and compares its bytes; returns the tensor's flags. */
static uint64_t acquire_and_compare(dlx_client *c, const char *name, const void *data, size_t n)
{
        DLManagedTensorVersioned *t = NULL;
        uint64_t flags;
        int err = dlx_acquire(c, name, NULL, &t);

        ck_assert_msg(err == 0, "dlx_acquire %s: %s (%s)", name, dlx_strerror(err),
                      dlx_last_error());
        ck_assert_ptr_nonnull(t->dl_tensor.data);
        ck_assert_msg(memcmp((const char *)t->dl_tensor.data + t->dl_tensor.byte_offset, data, n) ==
                              0,
                      "%s: libdlx sees other bytes than the file held", name);
        flags = t->flags;
        t->deleter(t);
        return flags;
}

START_TEST(test_put_persistent)
{
        const int64_t shape[2] = {4, 5};
        struct dlx_info info;
        uint8_t data[4 * 5 * 8];
        char descr[8], *out;
        dlx_client *c;
        int err;

        fill(data, sizeof(data), 3);
        snprintf(descr, sizeof(descr), "%ci8", HOST);
        make_npy(path_of("p.npy"), descr, false, "(4, 5)", data, sizeof(data));
        free(ctl_ok("put", "keep/me", path_of("p.npy"), NULL));

        /* dlxctl has exited: the name is still there, for other dlxctl runs ... */
        out = ctl_ok("list", NULL);
        ck_assert_msg(strstr(out, "\nkeep/me "), "keep/me is not listed after put: %s", out);
        free(out);
        free(ctl_ok("get", "keep/me", path_of("p1.npy"), NULL));
        check_npy(path_of("p1.npy"), descr, false, 2, shape, data, sizeof(data));
        free(ctl_ok("get", "keep/me", path_of("p2.npy"), NULL));
        check_npy(path_of("p2.npy"), descr, false, 2, shape, data, sizeof(data));

        /* ... and for a libdlx client */
        c = fx_connect(&fx, "test-dlxctl");
        ck_assert_msg(acquire_and_compare(c, "keep/me", data, sizeof(data)) &
                              DLPACK_FLAG_BITMASK_READ_ONLY,
                      "a tensor put without --writable is writable");
        err = dlx_stat(c, "keep/me", &info);
        ck_assert_int_eq(err, 0);
        ck_assert(info.persist);
        ck_assert_uint_eq(info.version, 1);
        ck_assert_int_eq(info.ndim, 2);
        ck_assert_int_eq(info.shape[0], 4);
        ck_assert_int_eq(info.shape[1], 5);
        ck_assert_str_eq(info.producer_name, "dlxctl");
        /* the producer's session ends when dlxctl exits; the daemon notices soon after */
        for (int waited = 0; info.producer_pid != 0 && waited < 5000; waited += 10) {
                fx_sleep_ms(10);
                ck_assert_int_eq(dlx_stat(c, "keep/me", &info), 0);
        }
        ck_assert_msg(info.producer_pid == 0, "producer pid %d still alive?", info.producer_pid);
        dlx_close(c);

        out = ctl_ok("stat", "keep/me", NULL);
        ck_assert_msg(strstr(out, "persistent:    yes\n"), "%s", out);
        ck_assert_msg(strstr(out, "access:        read-only\n"), "%s", out);
        ck_assert_msg(strstr(out, "producer:      dlxctl (pid 0, gone)\n"), "%s", out);
        free(out);

        /* put again replaces: a new version with the new contents */
        fill(data, sizeof(data), 4);
        make_npy(path_of("p.npy"), descr, false, "(4, 5)", data, sizeof(data));
        CTL_EXPECT_STR("keep/me v2\n", "put", "keep/me", path_of("p.npy"));
        c = fx_connect(&fx, "test-dlxctl");
        acquire_and_compare(c, "keep/me", data, sizeof(data));
        dlx_close(c);
}
END_TEST

START_TEST(test_put_writable)
{
        const int64_t shape[1] = {8};
        DLManagedTensorVersioned *t;
        uint8_t data[8];
        char *out;
        dlx_client *c;

        fill(data, sizeof(data), 8);
        make_npy(path_of("w.npy"), "|u1", false, "(8,)", data, sizeof(data));
        CTL_EXPECT_STR("rw v1\n", "put", "rw", path_of("w.npy"), "--writable");

        CTL_EXPECT(strstr(ctl_out, "access:        writable\n"), "stat", "rw");
        CTL_EXPECT(json_has(ctl_out, "\"read_only\":false"), "--json", "stat", "rw");
        out = ctl_ok("list", NULL);
        ck_assert_msg(strstr(out, ",writable\n"), "list FLAGS should say writable: %s", out);
        free(out);

        c = fx_connect(&fx, "test-dlxctl");
        t = acquire_ok(c, "rw", NULL);
        ck_assert_msg(!(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY),
                      "put --writable gave a READ_ONLY tensor (flags 0x%llx)",
                      (unsigned long long)t->flags);
        /* a write through the mapping is what the next reader sees */
        if (!(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY)) {
                ((uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset)[3] = 0xee;
                data[3] = 0xee;
        }
        t->deleter(t);
        dlx_close(c);
        free(ctl_ok("get", "rw", path_of("w-out.npy"), NULL));
        check_npy(path_of("w-out.npy"), "|u1", false, 1, shape, data, sizeof(data));

        /* and the default stays read-only */
        free(ctl_ok("put", "ro", path_of("w.npy"), NULL));
        CTL_EXPECT(strstr(ctl_out, "access:        read-only\n"), "stat", "ro");
}
END_TEST

/* ---- list, stat, rm, stats -------------------------------------------------------------- */

static void put_three(void)
{
        float f[6] = {0};
        int64_t l[4] = {0};
        double d = 0;
        char descr[8];

        snprintf(descr, sizeof(descr), "%cf4", HOST);
        make_npy(path_of("x.npy"), descr, false, "(2, 3)", f, sizeof(f));
        snprintf(descr, sizeof(descr), "%ci8", HOST);
        make_npy(path_of("y.npy"), descr, false, "(4,)", l, sizeof(l));
        snprintf(descr, sizeof(descr), "%cf8", HOST);
        make_npy(path_of("z.npy"), descr, false, "()", &d, sizeof(d));
        /* out of name order on purpose */
        free(ctl_ok("put", "b/z", path_of("z.npy"), NULL));
        free(ctl_ok("put", "a/y", path_of("y.npy"), NULL));
        free(ctl_ok("put", "a/x", path_of("x.npy"), NULL));
}

START_TEST(test_list)
{
        char line[512], *out;

        /* an empty daemon: the header alone */
        out = ctl_ok("list", NULL);
        ck_assert_msg(count_lines(out) == 1 && strncmp(out, "NAME", 4) == 0,
                      "list of an empty daemon: %s", out);
        free(out);
        put_three();

        out = ctl_ok("list", NULL);
        ck_assert_msg(count_lines(out) == 4, "list: header and 3 names expected: %s", out);
        line_of(out, 0, line, sizeof(line));
        ck_assert_msg(strncmp(line, "NAME ", 5) == 0 && strstr(line, "VERSION") &&
                              strstr(line, "DTYPE") && strstr(line, "SHAPE") &&
                              strstr(line, "DEVICE"),
                      "list header: %s", line);
        line_of(out, 1, line, sizeof(line));
        ck_assert_msg(strncmp(line, "a/x ", 4) == 0 && strstr(line, " 1 ") &&
                              strstr(line, " float32 ") && strstr(line, " (2, 3) ") &&
                              strstr(line, " cpu:0 ") && strstr(line, " 24 ") &&
                              strstr(line, "memfd,persist"),
                      "list line for a/x: %s", line);
        line_of(out, 2, line, sizeof(line));
        ck_assert_msg(strncmp(line, "a/y ", 4) == 0 && strstr(line, " int64 ") &&
                              strstr(line, " (4,) ") && strstr(line, " 32 "),
                      "list line for a/y: %s", line);
        line_of(out, 3, line, sizeof(line));
        ck_assert_msg(strncmp(line, "b/z ", 4) == 0 && strstr(line, " float64 ") &&
                              strstr(line, " () ") && strstr(line, " 8 "),
                      "list line for b/z: %s", line);
        free(out);

        CTL_EXPECT(count_lines(ctl_out) == 3 && strstr(ctl_out, "\na/x ") &&
                           strstr(ctl_out, "\na/y ") && !strstr(ctl_out, "b/z"),
                   "list", "a/");
        CTL_EXPECT(count_lines(ctl_out) == 2 && strstr(ctl_out, "\nb/z "), "ls", "b");
        CTL_EXPECT(count_lines(ctl_out) == 1 && strncmp(ctl_out, "NAME", 4) == 0, "list",
                   "nothing/");
}
END_TEST

START_TEST(test_list_json)
{
        char entry[1024], *out;

        CTL_EXPECT_STR("[]\n", "--json", "list");
        put_three();

        out = ctl_ok("--json", "list", NULL);
        ck_assert_msg(out[0] == '[' && strlen(out) >= 2 &&
                              strcmp(out + strlen(out) - 2, "]\n") == 0,
                      "--json list should be one array: %s", out);
        ck_assert_msg(json_valid(out), "--json list is not valid JSON: %s", out);
        ck_assert_msg(strstr(out, "\"name\":\"a/x\"") && strstr(out, "\"name\":\"a/y\"") &&
                              strstr(out, "\"name\":\"b/z\""),
                      "%s", out);
        ck_assert_msg(strstr(out, "\"name\":\"a/x\"") < strstr(out, "\"name\":\"a/y\"") &&
                              strstr(out, "\"name\":\"a/y\"") < strstr(out, "\"name\":\"b/z\""),
                      "--json list is not in name order: %s", out);
        json_entry(out, "a/x", entry, sizeof(entry));
        ck_assert_msg(
                json_has(entry, "\"version\":1") && json_has(entry, "\"dtype\":\"float32\"") &&
                        json_has(entry, "\"dtype_code\":2") && json_has(entry, "\"bits\":32") &&
                        json_has(entry, "\"lanes\":1") && json_has(entry, "\"shape\":[2,3]") &&
                        json_has(entry, "\"strides\":[3,1]") &&
                        json_has(entry, "\"byte_offset\":0") &&
                        json_has(entry, "\"device\":[1,0]") &&
                        json_has(entry, "\"device_name\":\"cpu:0\"") &&
                        json_has(entry, "\"read_only\":true") &&
                        json_has(entry, "\"storage\":\"memfd\"") &&
                        json_has(entry, "\"nbytes\":24") && json_has(entry, "\"persist\":true") &&
                        json_has(entry, "\"producer\":\"dlxctl\"") &&
                        json_has(entry, "\"leases\":0"),
                "a/x in --json list: %s", entry);
        free(out);

        CTL_EXPECT(json_valid(ctl_out) && strstr(ctl_out, "\"name\":\"a/x\"") &&
                           strstr(ctl_out, "\"name\":\"a/y\"") && !strstr(ctl_out, "b/z"),
                   "--json", "list", "a/");
        CTL_EXPECT_STR("[]\n", "--json", "list", "zzz");
}
END_TEST

START_TEST(test_stat)
{
        char *out, *err;
        int rc;

        put_three();
        out = ctl_ok("stat", "a/x", NULL);
        ck_assert_msg(strstr(out, "name:          a/x\n") && strstr(out, "version:       1\n") &&
                              strstr(out, "dtype:         float32 (code 2, 32 bits, 1 lanes)\n") &&
                              strstr(out, "shape:         (2, 3)\n") &&
                              strstr(out, "strides:       (3, 1)\n") &&
                              strstr(out, "device:        cpu:0\n") &&
                              strstr(out, "access:        read-only\n") &&
                              strstr(out, "persistent:    yes\n") &&
                              strstr(out, "leases:        0\n") &&
                              strstr(out, "live versions: 1\n"),
                      "stat a/x: %s", out);
        ck_assert_msg(strstr(out, "storage:       memfd (segment ") &&
                              strstr(out, "tensor spans 24)\n"),
                      "stat a/x storage: %s", out);
        free(out);

        out = ctl_ok("--json", "stat", "a/y", NULL);
        ck_assert_msg(out[0] == '{' && json_valid(out), "--json stat is not a JSON object: %s",
                      out);
        ck_assert_msg(json_has(out, "\"name\":\"a/y\"") && json_has(out, "\"dtype\":\"int64\"") &&
                              json_has(out, "\"shape\":[4]") && json_has(out, "\"strides\":[1]") &&
                              json_has(out, "\"nbytes\":32") && json_has(out, "\"version\":1") &&
                              json_has(out, "\"device\":[1,0]") &&
                              json_has(out, "\"device_name\":\"cpu:0\"") &&
                              json_has(out, "\"persist\":true"),
                      "--json stat a/y: %s", out);
        free(out);

        rc = run_ctl(&out, &err, "stat", "a/nope", NULL);
        expect_fail(1, "no tensor named", "stat of a missing name", rc, out, err);
        rc = run_ctl(&out, &err, "--json", "stat", "a", NULL);
        expect_fail(1, "no tensor named", "--json stat of a prefix", rc, out, err);
}
END_TEST

START_TEST(test_rm)
{
        char *out, *err;
        int rc;

        put_three();
        CTL_EXPECT_STR("", "rm", "a/y");
        rc = run_ctl(&out, &err, "get", "a/y", path_of("y-out.npy"), NULL);
        expect_fail(1, "no tensor named", "get after rm", rc, out, err);
        ck_assert_msg(access(path_of("y-out.npy"), F_OK) != 0, "a failed get left a file behind");
        rc = run_ctl(&out, &err, "stat", "a/y", NULL);
        expect_fail(1, "no tensor named", "stat after rm", rc, out, err);
        rc = run_ctl(&out, &err, "rm", "a/y", NULL);
        expect_fail(1, "no tensor named", "rm twice", rc, out, err);

        out = ctl_ok("list", NULL);
        ck_assert_msg(count_lines(out) == 3 && !strstr(out, "a/y"), "list after rm: %s", out);
        free(out);
        /* the others are untouched */
        free(ctl_ok("get", "a/x", path_of("x-out.npy"), NULL));

        /* a removed name can be published again */
        free(ctl_ok("put", "a/y", path_of("y.npy"), NULL));
        free(ctl_ok("get", "a/y", path_of("y-out.npy"), NULL));
}
END_TEST

START_TEST(test_stats)
{
        char *out;

        out = ctl_ok("--json", "stats", NULL);
        ck_assert_msg(json_valid(out), "--json stats is not JSON: %s", out);
        ck_assert_msg(json_has(out, "\"names\":0") && json_has(out, "\"versions\":0") &&
                              json_has(out, "\"leases\":0") && json_has(out, "\"publishes\":0") &&
                              json_has(out, "\"acquires\":0") && json_has(out, "\"watchers\":0"),
                      "stats of a fresh daemon: %s", out);
        free(out);

        put_three();                                            /* 3 names */
        free(ctl_ok("put", "a/x", path_of("x.npy"), NULL));     /* replaced: v2 */
        free(ctl_ok("get", "a/x", path_of("x-out.npy"), NULL)); /* one acquire */
        free(ctl_ok("get", "b/z", path_of("z-out.npy"), NULL)); /* two */
        free(ctl_ok("rm", "a/y", NULL));                        /* 2 names left */

        out = ctl_ok("--json", "stats", NULL);
        ck_assert_msg(json_valid(out), "--json stats is not JSON: %s", out);
        ck_assert_msg(json_has(out, "\"names\":2") && json_has(out, "\"versions\":2") &&
                              json_has(out, "\"publishes\":4") && json_has(out, "\"acquires\":2") &&
                              json_has(out, "\"watchers\":0") && json_has(out, "\"max_bytes\":0"),
                      "stats after 4 puts, 2 gets and 1 rm: %s", out);
        ck_assert_msg(json_u64(out, "requests") >= 4 + 2 + 1, "%s", out);
        ck_assert_msg(json_u64(out, "clients") >= 1, "%s", out);
        ck_assert_msg(json_u64(out, "bytes") >= 24 + 8, "%s", out);
        /* small files are held at their size, not in a whole allocator segment each */
        ck_assert_msg(json_u64(out, "bytes") < 4096, "%s", out);
        /* the limits dlxd runs with (defaults here), and what this uid uses */
        ck_assert_msg(strstr(out, "\"limits\":{\"max_clients\":1024,") &&
                              json_has(out, "\"max_names\":1000000") &&
                              json_has(out, "\"max_leases\":65536") &&
                              json_has(out, "\"max_queued\":16777216") &&
                              json_has(out, "\"timeout_ms\":10000"),
                      "limits: %s", out);
        {
                char uid[96];
                snprintf(uid, sizeof(uid), "\"uid\":{\"uid\":%u,\"clients\":1,",
                         (unsigned)getuid());
                /* two persistent puts: two segments, a descriptor each, charged to this uid */
                ck_assert_msg(strstr(out, uid) && strstr(out, "\"names\":2,\"fds\":2}}") &&
                                      strstr(out, "},\"fds\":2,\"uid\":"),
                              "uid usage: %s", out);
        }
        free(out);

        CTL_EXPECT(strstr(ctl_out, "server:    ") && strstr(ctl_out, "names:     2 of 1000000\n") &&
                           strstr(ctl_out, "versions:  2\n") &&
                           strstr(ctl_out, "(publishes 4, acquires 2)\n") &&
                           strstr(ctl_out, "watchers:  0\n") &&
                           strstr(ctl_out, "fds:       2 of ") && strstr(ctl_out, " 2 fds of ") &&
                           strstr(ctl_out, "  --max-names            1000000\n") &&
                           strstr(ctl_out, "  --max-queued           16777216 (16 MiB)\n"),
                   "stats");
}
END_TEST

/* ---- get and waiting -------------------------------------------------------------------- */

START_TEST(test_get_timeout)
{
        char *out, *err;
        int64_t t0, dt;
        int rc;

        /* no --timeout: no waiting */
        rc = run_ctl(&out, &err, "get", "never", path_of("o.npy"), NULL);
        expect_fail(1, "no tensor named", "get of a missing name", rc, out, err);

        t0 = fx_now_ms();
        rc = run_ctl(&out, &err, "get", "never", path_of("o.npy"), "--timeout", "200", NULL);
        dt = fx_now_ms() - t0;
        expect_fail(1, "timed out", "get --timeout 200 of a missing name", rc, out, err);
        ck_assert_msg(dt >= 150 && dt < 5000, "get --timeout 200 took %lld ms", (long long)dt);
        ck_assert_msg(access(path_of("o.npy"), F_OK) != 0, "a failed get left a file behind");

        /* the option may come first too */
        rc = run_ctl(&out, &err, "--json", "get", "--timeout", "50", "never", path_of("o.npy"),
                     NULL);
        expect_fail(1, "timed out", "get --timeout 50 before NAME", rc, out, err);

        /* nothing was left behind in the daemon by the waiters */
        CTL_EXPECT_STR("[]\n", "--json", "list");
        out = ctl_ok("--json", "stats", NULL);
        ck_assert_msg(json_has(out, "\"names\":0") && json_has(out, "\"versions\":0"),
                      "stats after timed-out gets: %s", out);
        free(out);

        /* an unwritable output path */
        put_three();
        rc = run_ctl(&out, &err, "get", "a/x", "/nonexistent-dir/x.npy", NULL);
        expect_fail(1, "/nonexistent-dir/x.npy", "get into a missing directory", rc, out, err);
}
END_TEST

START_TEST(test_get_waits_for_put)
{
        const int64_t shape[1] = {5};
        struct dlx_stats s0, s;
        struct ctl get;
        uint16_t data[5] = {1, 2, 3, 4, 5};
        char descr[8], *out, *err;
        dlx_client *c;
        int64_t t0;
        int rc, i;

        snprintf(descr, sizeof(descr), "%cu2", HOST);
        make_npy(path_of("late.npy"), descr, false, "(5,)", data, sizeof(data));
        c = fx_connect(&fx, "test-dlxctl");
        ck_assert_int_eq(dlx_stats(c, &s0), 0);

        t0 = fx_now_ms();
        /* a get that timed out exits non-zero: its exit status says it did not */
        ctl_spawn(&get, "get", "late/x", path_of("late-out.npy"), "--timeout", "60000", NULL);
        /*
         * The get is waiting once the daemon has seen its hello and acquire: two
         * requests besides this client's own stats calls (each counts itself).
         */
        for (i = 1;; i++) {
                ck_assert_int_eq(dlx_stats(c, &s), 0);
                if (s.requests - s0.requests - (uint64_t)i >= 2)
                        break;
                ck_assert_msg(fx_now_ms() - t0 < 50000, "the waiting get never reached the daemon");
                fx_sleep_ms(5);
        }
        dlx_close(c);

        free(ctl_ok("put", "late/x", path_of("late.npy"), NULL));
        rc = ctl_finish(&get, CTL_TIMEOUT_MS, &out, &err);
        ck_assert_msg(rc == 0, "the waiting get: exit %d; stderr: %s", rc, err);
        free(out);
        free(err);
        check_npy(path_of("late-out.npy"), descr, false, 1, shape, data, sizeof(data));
}
END_TEST

/* ---- watch ------------------------------------------------------------------------------ */

/* Polls dlxctl --json stats until watchers is n. */
static void wait_watchers(unsigned n)
{
        int64_t t0 = fx_now_ms();
        char want[32];

        snprintf(want, sizeof(want), "\"watchers\":%u", n);
        for (;;) {
                char *out = ctl_ok("--json", "stats", NULL);
                bool done = json_has(out, want);

                free(out);
                if (done)
                        return;
                ck_assert_msg(fx_now_ms() - t0 < 5000, "watchers never reached %u", n);
                fx_sleep_ms(10);
        }
}

/* Four operations, of which the three on w/ are watched: published, replaced, unpublished. */
static void watched_ops(void)
{
        float f[2] = {1, 2};
        char descr[8];

        snprintf(descr, sizeof(descr), "%cf4", HOST);
        make_npy(path_of("w.npy"), descr, false, "(2,)", f, sizeof(f));
        free(ctl_ok("put", "other/x", path_of("w.npy"), NULL));
        free(ctl_ok("put", "w/a", path_of("w.npy"), NULL));
        free(ctl_ok("put", "w/a", path_of("w.npy"), NULL));
        free(ctl_ok("rm", "w/a", NULL));
}

START_TEST(test_watch)
{
        static const char *const want[3][3] = {{"published", "w/a", "v1"},
                                               {"replaced", "w/a", "v2"},
                                               {"unpublished", "w/a", "v2"}};
        struct ctl w;
        char line[256], kind[32], name[64], ver[32], *out, *err;
        int rc;

        ctl_spawn(&w, "watch", "w/", "--count", "3", "--timeout", "8000", NULL);
        wait_watchers(1);
        watched_ops();
        rc = ctl_finish(&w, CTL_TIMEOUT_MS, &out, &err);
        ck_assert_msg(rc == 0, "watch: exit %d; stderr: %s", rc, err);
        ck_assert_msg(count_lines(out) == 3, "watch --count 3 printed: %s", out);
        for (unsigned i = 0; i < 3; i++) {
                line_of(out, i, line, sizeof(line));
                ck_assert_msg(sscanf(line, "%31s %63s %31s", kind, name, ver) == 3, "line: %s",
                              line);
                ck_assert_msg(strcmp(kind, want[i][0]) == 0 && strcmp(name, want[i][1]) == 0 &&
                                      strcmp(ver, want[i][2]) == 0,
                              "watch line %u: '%s', expected '%s %s %s'", i, line, want[i][0],
                              want[i][1], want[i][2]);
        }
        free(out);
        free(err);
        wait_watchers(0);
}
END_TEST

START_TEST(test_watch_json)
{
        static const char *const want[3] = {
                "{\"event\":\"published\",\"name\":\"w/a\",\"version\":1}",
                "{\"event\":\"replaced\",\"name\":\"w/a\",\"version\":2}",
                "{\"event\":\"unpublished\",\"name\":\"w/a\",\"version\":2}",
        };
        struct ctl w;
        char line[256], *out, *err;
        int rc;

        ctl_spawn(&w, "--json", "watch", "w/", "--count", "3", NULL);
        wait_watchers(1);
        watched_ops();
        rc = ctl_finish(&w, CTL_TIMEOUT_MS, &out, &err);
        ck_assert_msg(rc == 0, "--json watch: exit %d; stderr: %s", rc, err);
        ck_assert_msg(count_lines(out) == 3, "--json watch --count 3 printed: %s", out);
        for (unsigned i = 0; i < 3; i++) {
                line_of(out, i, line, sizeof(line));
                ck_assert_msg(json_valid(line), "watch line %u is not JSON: %s", i, line);
                ck_assert_msg(strcmp(line, want[i]) == 0, "watch line %u: %s, expected %s", i, line,
                              want[i]);
        }
        free(out);
        free(err);
}
END_TEST

/* --timeout ends a quiet watch with success, whatever the value. */
static const char *const watch_timeouts[] = {"300", "200", "0", "400"};

START_TEST(test_watch_timeout)
{
        const char *value = watch_timeouts[_i];
        char *out, *err;
        int64_t t0, dt;
        int rc;

        t0 = fx_now_ms();
        rc = run_ctl(&out, &err, "watch", "--timeout", value, NULL);
        dt = fx_now_ms() - t0;
        ck_assert_msg(rc == 0 && strcmp(out, "") == 0,
                      "watch --timeout %s with no events: exit %d; stdout: %s; stderr: %s", value,
                      rc, out, err);
        ck_assert_msg(dt >= atoi(value) - 50 && dt < 5000, "watch --timeout %s took %lld ms", value,
                      (long long)dt);
        free(out);
        free(err);
}
END_TEST

/* ---- usage, connection, escaping -------------------------------------------------------- */

/* Options after the command mean what they mean before it, never a name or prefix. */
START_TEST(test_options_after_command)
{
        char *out, *err, *json_first;
        float f[2] = {1, 2};
        int rc;

        put_three();
        json_first = ctl_ok("--json", "list", NULL);
        out = ctl_ok("list", "--json", NULL);
        ck_assert_msg(json_valid(out) && strstr(out, "\"name\":\"a/x\""),
                      "list --json is not the JSON list: %s", out);
        ck_assert_str_eq(out, json_first);
        free(out);
        free(json_first);
        CTL_EXPECT(json_valid(ctl_out) && strstr(ctl_out, "\"name\":\"a/y\"") &&
                           !strstr(ctl_out, "b/z"),
                   "list", "a/", "-j");
        CTL_EXPECT(ctl_out[0] == '{' && json_valid(ctl_out) &&
                           json_has(ctl_out, "\"name\":\"a/x\""),
                   "stat", "a/x", "--json");

        /* --socket after the command, in both spellings, with no --socket before it */
        rc = run_ctl_bare(&out, &err, "list", "--socket", fx.socket, NULL);
        ck_assert_msg(rc == 0 && count_lines(out) == 4, "list --socket S: exit %d: %s %s", rc, out,
                      err);
        free(out);
        free(err);
        char opt[sizeof(fx.socket) + 16];
        snprintf(opt, sizeof(opt), "--socket=%s", fx.socket);
        rc = run_ctl_bare(&out, &err, "stat", "a/y", opt, "--json", NULL);
        ck_assert_msg(rc == 0 && json_valid(out) && json_has(out, "\"name\":\"a/y\""),
                      "stat a/y --socket=S --json: exit %d: %s %s", rc, out, err);
        free(out);
        free(err);

        /* every command's own options, and the global ones, mixed in any order */
        make_npy(path_of("f.npy"), "<f4", false, "(2,)", f, sizeof(f));
        CTL_EXPECT_STR("{\"name\":\"o/w\",\"version\":1}\n", "put", "--writable", "o/w", "--json",
                       path_of("f.npy"));
        out = ctl_ok("--json", "stat", "o/w", NULL);
        ck_assert_msg(json_has(out, "\"read_only\":false"), "put ... --writable: %s", out);
        free(out);
        CTL_EXPECT(json_valid(ctl_out) && json_has(ctl_out, "\"name\":\"o/w\""), "get", "o/w",
                   "--timeout", "100", path_of("o.npy"), "--json");
        CTL_EXPECT(json_valid(ctl_out) && json_has(ctl_out, "\"names\":4"), "stats", "--json");
        CTL_EXPECT_STR("", "watch", "--timeout", "0", "w/", "--json");
        CTL_EXPECT_STR("", "rm", "o/w", "--json");
        rc = run_ctl(&out, &err, "stat", "o/w", NULL);
        expect_fail(1, "no tensor named", "stat after rm NAME --json", rc, out, err);
}
END_TEST

/* A name that starts with '-' is given after "--"; before it, it is an unknown option. */
START_TEST(test_dash_names)
{
        char *out, *err, descr[8];
        float f[2] = {3, 4};
        int rc;

        snprintf(descr, sizeof(descr), "%cf4", HOST);
        make_npy(path_of("f.npy"), descr, false, "(2,)", f, sizeof(f));
        rc = run_ctl(&out, &err, "put", "-lead", path_of("f.npy"), NULL);
        expect_fail(2, NULL, "put -lead FILE", rc, out, err);
        CTL_EXPECT_STR("[]\n", "--json", "list");

        free(ctl_ok("put", "--", "-lead", path_of("f.npy"), NULL));
        CTL_EXPECT(json_has(ctl_out, "\"name\":\"-lead\""), "--json", "stat", "--", "-lead");
        CTL_EXPECT(json_valid(ctl_out) && json_has(ctl_out, "\"name\":\"-lead\""), "list", "--json",
                   "--", "-");
        free(ctl_ok("get", "--", "-lead", path_of("o.npy"), NULL));
        check_npy(path_of("o.npy"), descr, false, 1, (int64_t[]){2}, f, sizeof(f));
        rc = run_ctl(&out, &err, "rm", "-lead", NULL);
        expect_fail(2, NULL, "rm -lead", rc, out, err);
        free(ctl_ok("rm", "--", "-lead", NULL));
        CTL_EXPECT_STR("[]\n", "--json", "list");
}
END_TEST

/* Argument lists that are usage errors: exit 2, a message, nothing on stdout. */
static const char *const usage_rows[][7] = {
        {NULL},
        {"frobnicate", NULL},
        {"--no-such-option", "list", NULL},
        {"list", "a", "b", NULL},
        {"stat", NULL},
        {"stat", "a", "b", NULL},
        {"put", NULL},
        {"put", "a", NULL},
        {"put", "a", "b", "c", NULL},
        {"put", "a", "b", "--writable", "x", NULL},
        {"get", NULL},
        {"get", "a", NULL},
        {"get", "a", "b", "c", NULL},
        {"get", "a", "b", "--timeout", "abc", NULL},
        {"get", "a", "b", "--timeout", "12ms", NULL},
        {"get", "a", "b", "--timeout", "", NULL},
        {"rm", NULL},
        {"rm", "a", "b", NULL},
        {"stats", "x", NULL},
        {"watch", "--count", "0", NULL},
        {"watch", "--count", "x", NULL},
        {"watch", "--timeout", "soon", NULL},
        {"watch", "a", "b", NULL},
        /* an option a command does not take, or no option at all: never a name */
        {"list", "--writable", NULL},
        {"list", "--timeout", "5", NULL},
        {"stat", "a", "--count", "1", NULL},
        {"stats", "--writable", NULL},
        {"rm", "a", "--timeout", "5", NULL},
        {"put", "a", "b", "--timeout", "5", NULL},
        {"get", "a", "b", "--writable", NULL},
        {"list", "--no-such-option", NULL},
        {"stat", "-x", NULL},
        {"rm", "-a", NULL},
        {"get", "a", "b", "--timeout", NULL},
        {"watch", "--count", NULL},
        {"list", "--json", "--socket", NULL},
};

START_TEST(usage_error_exits_2_and_touches_nothing)
{
        const char *const *a = usage_rows[_i];
        char *out, *err, what[128] = "dlxctl";
        struct ctl c;
        int rc;

        for (const char *const *arg = a; *arg; arg++)
                snprintf(what + strlen(what), sizeof(what) - strlen(what), " '%s'", *arg);
        ctl_start(&c, true, a);
        rc = ctl_finish(&c, CTL_TIMEOUT_MS, &out, &err);
        ck_assert_msg(strcmp(out, "") == 0, "%s printed on stdout: %s", what, out);
        expect_fail(2, NULL, what, rc, out, err);
        /* it may not have touched the daemon's names */
        CTL_EXPECT(json_has(ctl_out, "\"publishes\":0"), "--json", "stats");
}
END_TEST

START_TEST(test_help_and_version)
{
        CTL_EXPECT(strstr(ctl_out, "Usage: dlxctl") && strstr(ctl_out, "watch"), "--help");
        CTL_EXPECT_STR("dlxctl 0.1.0\n", "--version");
}
END_TEST

START_TEST(test_no_daemon)
{
        static const char *const cmds[][4] = {
                {"list", NULL},      {"stats", NULL},
                {"stat", "x", NULL}, {"get", "x", "/dev/null", NULL},
                {"rm", "x", NULL},   {"watch", NULL},
        };
        char sock[PATH_MAX + 64], what[64], *out, *err;
        float f[2] = {0};
        int rc;

        snprintf(sock, sizeof(sock), "%s", path_of("dlxd.sock"));
        for (size_t i = 0; i < N_ELEMS(cmds); i++) {
                rc = run_ctl_bare(&out, &err, "--socket", sock, cmds[i][0], cmds[i][1], cmds[i][2],
                                  NULL);
                snprintf(what, sizeof(what), "%s without a daemon", cmds[i][0]);
                expect_fail(1, "cannot connect", what, rc, out, err);
        }
        make_npy(path_of("f.npy"), "<f4", false, "(2,)", f, sizeof(f));
        rc = run_ctl_bare(&out, &err, "--socket", sock, "put", "x", path_of("f.npy"), NULL);
        expect_fail(1, "cannot connect", "put without a daemon", rc, out, err);

        /* the default socket: $DLX_SOCKET, else $XDG_RUNTIME_DIR/dlx/dlxd.sock */
        unsetenv("DLX_SOCKET");
        setenv("XDG_RUNTIME_DIR", tmpdir, 1);
        rc = run_ctl_bare(&out, &err, "list", NULL);
        ck_assert_msg(strstr(err, path_of("dlx/dlxd.sock")),
                      "the message should name the socket: %s", err);
        expect_fail(1, "cannot connect", "list with $XDG_RUNTIME_DIR", rc, out, err);
}
END_TEST

START_TEST(test_socket_from_env)
{
        char *out, *err;
        int rc;

        put_three();
        setenv("DLX_SOCKET", fx.socket, 1);
        rc = run_ctl_bare(&out, &err, "list", "a/", NULL);
        ck_assert_msg(rc == 0 && count_lines(out) == 3, "list with $DLX_SOCKET: exit %d: %s %s", rc,
                      out, err);
        free(out);
        free(err);
        unsetenv("DLX_SOCKET");
}
END_TEST

/* Names may hold quotes and backslashes: every --json output must escape them. */
static const char odd_name[] = "q\"uote\\back";
static const char odd_escaped[] = "\"name\":\"q\\\"uote\\\\back\"";

static void put_odd_name(void)
{
        float f[2] = {0};

        make_npy(path_of("f.npy"), "<f4", false, "(2,)", f, sizeof(f));
        free(ctl_ok("put", odd_name, path_of("f.npy"), NULL));
}

/* Each command with --json, on odd_name (named) and a file (file: none). */
static const struct json_escaping_row {
        const char *cmd;
        bool named;
        const char *file;
} json_escaping_rows[] = {
        {"list"},
        {"stat", true},
        {"put", true, "f.npy"},
        {"get", true, "o\"ut.npy"},
};

START_TEST(json_output_escapes_names)
{
        const struct json_escaping_row *row = &json_escaping_rows[_i];
        char *out;

        put_odd_name();
        out = ctl_ok("--json", row->cmd, row->named ? odd_name : NULL,
                     row->file ? path_of(row->file) : NULL, NULL);
        ck_assert_msg(json_valid(out) && strstr(out, odd_escaped), "--json %s of %s: %s", row->cmd,
                      odd_name, out);
        free(out);
}
END_TEST

START_TEST(test_put_get_json)
{
        float f[2] = {0};

        make_npy(path_of("f.npy"), "<f4", false, "(2,)", f, sizeof(f));
        CTL_EXPECT_STR("{\"name\":\"j/x\",\"version\":1}\n", "--json", "put", "j/x",
                       path_of("f.npy"));
        CTL_EXPECT_STR("{\"name\":\"j/x\",\"version\":2}\n", "--json", "put", "j/x",
                       path_of("f.npy"));
        CTL_EXPECT(json_valid(ctl_out) && json_has(ctl_out, "\"name\":\"j/x\"") &&
                           json_has(ctl_out, "\"version\":2"),
                   "--json", "get", "j/x", path_of("o.npy"));
}
END_TEST

Suite *dlxctl_suite(void)
{
        Suite *s = suite_create("dlxctl");
        TCase *rt = tcase_create("roundtrip");
        TCase *bad = tcase_create("refused");
        TCase *cmds = tcase_create("commands");
        TCase *wait = tcase_create("waiting");
        TCase *cli = tcase_create("cli");
        TCase *nod = tcase_create("nodaemon");

        tcase_add_checked_fixture(rt, setup, teardown);
        tcase_add_loop_test(rt, test_roundtrip_dtypes, 0, N_DTYPES);
        tcase_add_test(rt, test_roundtrip_0d_and_empty);
        tcase_add_test(rt, test_roundtrip_fortran);
        tcase_add_rows(rt, big_endian_input_comes_back_in_host_order, be_rows);
        tcase_add_loop_test(rt, test_roundtrip_versions, 1, 4);
        tcase_add_test(rt, test_roundtrip_large);
        tcase_add_test(rt, test_put_from_fifo);
        tcase_add_test(rt, test_put_persistent);
        tcase_add_test(rt, test_put_writable);
        tcase_add_test(rt, group_files_round_trip);
        tcase_add_test(rt, group_and_tensor_files_do_not_mix);
        tcase_add_unchecked_fixture(rt, base_setup, base_teardown);
        suite_add_tcase(s, rt);

        tcase_add_checked_fixture(bad, setup, teardown);
        tcase_add_loop_test(bad, test_put_unsupported_dtype, 0, (int)(N_ELEMS(unsupported)));
        tcase_add_test(bad, test_put_bad_files);
        tcase_add_test(bad, bad_group_files_publish_nothing);
        tcase_add_unchecked_fixture(bad, base_setup, base_teardown);
        suite_add_tcase(s, bad);

        tcase_add_checked_fixture(cmds, setup, teardown);
        tcase_add_test(cmds, test_list);
        tcase_add_test(cmds, test_list_json);
        tcase_add_test(cmds, test_stat);
        tcase_add_test(cmds, test_rm);
        tcase_add_test(cmds, test_stats);
        tcase_add_test(cmds, test_put_get_json);
        tcase_add_rows(cmds, json_output_escapes_names, json_escaping_rows);
        tcase_add_unchecked_fixture(cmds, base_setup, base_teardown);
        suite_add_tcase(s, cmds);

        tcase_add_checked_fixture(wait, setup, teardown);
        tcase_add_test(wait, test_get_timeout);
        tcase_add_test(wait, test_get_waits_for_put);
        tcase_add_test(wait, test_watch);
        tcase_add_test(wait, test_watch_json);
        tcase_add_loop_test(wait, test_watch_timeout, 0, (int)(N_ELEMS(watch_timeouts)));
        tcase_add_unchecked_fixture(wait, base_setup, base_teardown);
        suite_add_tcase(s, wait);

        tcase_add_checked_fixture(cli, setup, teardown);
        tcase_add_rows(cli, usage_error_exits_2_and_touches_nothing, usage_rows);
        tcase_add_test(cli, test_help_and_version);
        tcase_add_test(cli, test_options_after_command);
        tcase_add_test(cli, test_dash_names);
        tcase_add_test(cli, test_socket_from_env);
        tcase_add_unchecked_fixture(cli, base_setup, base_teardown);
        suite_add_tcase(s, cli);

        tcase_add_checked_fixture(nod, tmp_setup, tmpdir_remove);
        tcase_add_test(nod, test_no_daemon);
        tcase_add_unchecked_fixture(nod, base_setup, base_teardown);
        suite_add_tcase(s, nod);
        return s;
}
