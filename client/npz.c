/* SPDX-License-Identifier: MIT */
/*
 * .npz: the reader (libzip over a mapping of the file, every entry inflated
 * into one memfd mapping and its .npy header read by npy.c) and the writer
 * (npy.c's bodies staged in a temporary file, stored by libzip). See npz.h.
 */
#include "npz.h"

#include "layout.h"
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

#define NPY_SUFFIX ".npy"
#define NPY_SUFFIX_LEN 4
/* Each entry starts 64-byte aligned in the memfd, so numpy's 64-aligned data stays aligned. */
#define NPZ_ALIGN 64
/* zip_fread() takes at most this at a time: ssize-safe and bounded per call. */
#define NPZ_IO_CHUNK (1u << 30)
#define MSG_MAX 256

static int zip_errno(zip_error_t *err)
{
        if (zip_error_system_type(err) == ZIP_ET_SYS && zip_error_code_system(err) > 0)
                return -zip_error_code_system(err);
        switch (zip_error_code_zip(err)) {
        case ZIP_ER_MEMORY:
                return -ENOMEM;
        case ZIP_ER_COMPNOTSUPP:
        case ZIP_ER_ENCRNOTSUPP:
        case ZIP_ER_NOPASSWD:
        case ZIP_ER_MULTIDISK:
                return -ENOTSUP;
        default:
                return -EINVAL;
        }
}

/* ---- reading ------------------------------------------------------------------------------ */

/* An entry, as the first pass checked it and the second read it. */
struct entry {
        zip_uint64_t index;
        uint64_t size;   /* declared uncompressed bytes */
        uint64_t at;     /* where it is inflated in the memfd */
        size_t name_len; /* without ".npy" */
        const char *name;
        struct npy_info info;
};

struct reader {
        zip_t *za;
        struct entry *e;
        size_t n;
        uint64_t total;    /* bytes of the memfd */
        uint64_t name_sum; /* bytes of all names with their NULs */
        int memfd;
        uint8_t *mem;
        char *why;
        size_t whysz;
};

static uint64_t align_up(uint64_t v)
{
        return (v + NPZ_ALIGN - 1) / NPZ_ALIGN * NPZ_ALIGN;
}

/* Checks what the central directory says of entry i, before anything is inflated. */
static int check_entry(struct reader *rd, zip_uint64_t i, struct entry *e)
{
        const zip_uint64_t need = ZIP_STAT_NAME | ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE |
                                  ZIP_STAT_COMP_METHOD | ZIP_STAT_ENCRYPTION_METHOD;
        char shown[64];
        const char *reason;
        zip_stat_t st;
        size_t len;

        if (zip_stat_index(rd->za, i, 0, &st) < 0 || (st.valid & need) != need)
                return tfile_fail(rd->why, rd->whysz, -EINVAL,
                                  "malformed .npz: entry %llu has no complete directory record",
                                  (unsigned long long)i);
        len = strlen(st.name);
        layout_quote(st.name, len, shown, sizeof(shown));
        if (len <= NPY_SUFFIX_LEN || strcmp(st.name + len - NPY_SUFFIX_LEN, NPY_SUFFIX) != 0)
                return tfile_fail(rd->why, rd->whysz, -EINVAL,
                                  "malformed .npz: entry '%s' is not named NAME.npy", shown);
        if (tfile_name_check(st.name, len - NPY_SUFFIX_LEN, &reason) < 0)
                return tfile_fail(rd->why, rd->whysz, -EINVAL, "malformed .npz: entry '%s': %s",
                                  shown, reason);
        if (st.encryption_method != ZIP_EM_NONE)
                return tfile_fail(rd->why, rd->whysz, -ENOTSUP, "entry '%s' is encrypted", shown);
        if (st.comp_method == ZIP_CM_STORE) {
                if (st.size != st.comp_size)
                        return tfile_fail(rd->why, rd->whysz, -EINVAL,
                                          "malformed .npz: stored entry '%s' declares %llu bytes "
                                          "but holds %llu",
                                          shown, (unsigned long long)st.size,
                                          (unsigned long long)st.comp_size);
        } else if (st.comp_method == ZIP_CM_DEFLATE) {
                /* A zip bomb is refused here, before a byte of it is allocated or inflated. */
                if (st.size / NPZ_MAX_DEFLATE_RATIO > st.comp_size)
                        return tfile_fail(rd->why, rd->whysz, -EINVAL,
                                          "malformed .npz: entry '%s' declares %llu bytes from "
                                          "%llu compressed, more than deflate can expand",
                                          shown, (unsigned long long)st.size,
                                          (unsigned long long)st.comp_size);
        } else {
                return tfile_fail(rd->why, rd->whysz, -ENOTSUP,
                                  "entry '%s' uses zip compression method %u; .npz files are "
                                  "stored or deflated",
                                  shown, (unsigned)st.comp_method);
        }
        e->index = i;
        e->size = st.size;
        e->at = rd->total;
        e->name_len = len - NPY_SUFFIX_LEN;
        /* NPZ_ALIGN more than the entry: room to align data whose header is not padded. */
        if (st.size > INT64_MAX ||
            __builtin_add_overflow(rd->total, align_up(st.size) + NPZ_ALIGN, &rd->total) ||
            rd->total > INT64_MAX)
                return tfile_fail(rd->why, rd->whysz, -EOVERFLOW,
                                  "the .npz entries' total size does not fit 63 bits");
        rd->name_sum += e->name_len + 1;
        return 0;
}

/* Inflates entry e into the memfd mapping, exactly its declared size, checking the CRC. */
static int inflate_entry(struct reader *rd, struct entry *e, const char *shown)
{
        zip_file_t *zf = zip_fopen_index(rd->za, e->index, 0);
        uint64_t got = 0;
        zip_int64_t r = 0;
        char extra;
        int code;

        if (!zf) {
                code = zip_errno(zip_get_error(rd->za));
                return tfile_fail(rd->why, rd->whysz, code, "entry '%s': %s", shown,
                                  zip_strerror(rd->za));
        }
        while (got < e->size) {
                uint64_t want = e->size - got;

                r = zip_fread(zf, rd->mem + e->at + got, want < NPZ_IO_CHUNK ? want : NPZ_IO_CHUNK);
                if (r <= 0)
                        break;
                got += (uint64_t)r;
        }
        /* One more byte: an entry longer than it says is refused, and EOF checks the CRC. */
        if (r >= 0 && got == e->size)
                r = zip_fread(zf, &extra, 1);
        if (r < 0) {
                code = zip_errno(zip_file_get_error(zf));
                tfile_fail(rd->why, rd->whysz, code == -ENOMEM ? code : -EINVAL,
                           "malformed .npz: entry '%s': %s", shown, zip_file_strerror(zf));
                zip_fclose(zf);
                return code == -ENOMEM ? code : -EINVAL;
        }
        zip_fclose(zf);
        if (got < e->size)
                return tfile_fail(rd->why, rd->whysz, -EINVAL,
                                  "truncated .npz: entry '%s' holds %llu of its declared %llu "
                                  "bytes",
                                  shown, (unsigned long long)got, (unsigned long long)e->size);
        if (r > 0)
                return tfile_fail(rd->why, rd->whysz, -EINVAL,
                                  "malformed .npz: entry '%s' holds more than its declared %llu "
                                  "bytes",
                                  shown, (unsigned long long)e->size);
        return 0;
}

/* Reads entry e's .npy header from the memfd and fixes its data's byte order. */
static int read_npy(struct reader *rd, struct entry *e, const char *shown)
{
        char nwhy[MSG_MAX] = "";
        int r;

        if (lseek(rd->memfd, (off_t)e->at, SEEK_SET) < 0)
                return tfile_fail(rd->why, rd->whysz, -errno, "seeking the inflated data: %s",
                                  strerror(errno));
        r = npy_read_header(rd->memfd, &e->info, nwhy, sizeof(nwhy));
        /* The memfd holds every entry: a short .npy reads into the next, then fails here. */
        if (r == 0 &&
            (e->info.data_offset > e->size || e->info.data_bytes != e->size - e->info.data_offset))
                return tfile_fail(rd->why, rd->whysz, -EINVAL,
                                  "malformed .npz: entry '%s' holds %llu bytes; its .npy header "
                                  "describes %llu",
                                  shown, (unsigned long long)e->size,
                                  (unsigned long long)(e->info.data_offset + e->info.data_bytes));
        if (r < 0)
                return tfile_fail(rd->why, rd->whysz, r, "entry '%s': %s", shown, nwhy);
        /*
         * numpy pads headers so that data is 64-byte aligned; another writer may not. Such
         * data moves up to the next boundary, inside the room check_entry() left for it.
         */
        if ((e->at + e->info.data_offset) % NPZ_ALIGN) {
                uint64_t to = align_up(e->at + e->info.data_offset);

                memmove(rd->mem + to, rd->mem + e->at + e->info.data_offset,
                        (size_t)e->info.data_bytes);
                e->info.data_offset = to - e->at;
        }
        npy_to_native(rd->mem + e->at + e->info.data_offset, &e->info);
        return 0;
}

static int build(struct reader *rd, struct tfile **ret)
{
        size_t ndims = 0;
        struct tfile *t;
        int r;

        for (size_t i = 0; i < rd->n; i++)
                ndims += (size_t)rd->e[i].info.ndim * 2;
        t = tfile_new(rd->n, ndims, (size_t)rd->name_sum);
        if (!t)
                return tfile_fail(rd->why, rd->whysz, -ENOMEM, "out of memory for %zu arrays",
                                  rd->n);
        for (size_t i = 0; i < rd->n; i++) {
                const struct entry *e = &rd->e[i];
                struct tfile_member *m = &t->members[i];
                bool strided = e->info.fortran_order && e->info.ndim >= 2;
                int64_t *shape = tfile_dims(t, (size_t)e->info.ndim);
                int64_t strides[NPY_MAX_NDIM];

                memcpy(shape, e->info.shape, sizeof(int64_t) * (size_t)e->info.ndim);
                m->name = tfile_name(t, e->name, e->name_len);
                m->tensor = (DLTensor){
                        .data = rd->mem + e->at + e->info.data_offset,
                        .device = {kDLCPU, 0},
                        .ndim = e->info.ndim,
                        .dtype = e->info.dtype,
                        .shape = e->info.ndim ? shape : NULL,
                };
                if (strided) {
                        npy_strides(&e->info, strides);
                        m->tensor.strides = tfile_dims(t, (size_t)e->info.ndim);
                        memcpy(m->tensor.strides, strides, sizeof(int64_t) * (size_t)e->info.ndim);
                }
                m->nbytes = e->info.data_bytes;
        }
        r = tfile_sort(t, rd->why, rd->whysz);
        if (r < 0) {
                tfile_free(t);
                return r;
        }
        *ret = t;
        return 0;
}

static int read_archive(struct reader *rd, struct tfile **ret)
{
        zip_int64_t count = zip_get_num_entries(rd->za, 0);
        char shown[64];
        int r;

        if (count < 0 || (uint64_t)count > TFILE_MAX_MEMBERS)
                return tfile_fail(rd->why, rd->whysz, -EINVAL,
                                  ".npz has %lld entries; at most %u are accepted",
                                  (long long)count, TFILE_MAX_MEMBERS);
        rd->n = (size_t)count;
        rd->e = calloc(rd->n + 1, sizeof(*rd->e));
        if (!rd->e)
                return tfile_fail(rd->why, rd->whysz, -ENOMEM, "out of memory for %zu entries",
                                  rd->n);
        for (size_t i = 0; i < rd->n; i++) {
                r = check_entry(rd, i, &rd->e[i]);
                if (r < 0)
                        return r;
        }
        /*
         * One memfd for all: pages are only taken as entries are inflated, and one mapping
         * (not one per entry) keeps a many-member file within the process's map count.
         */
        rd->memfd = memfd_create("dlx-npz", MFD_CLOEXEC);
        if (rd->memfd < 0)
                return tfile_fail(rd->why, rd->whysz, -errno, "memfd_create: %s", strerror(errno));
        /* Never a zero-length mapping, even for an archive without entries. */
        rd->total += NPZ_ALIGN;
        if (ftruncate(rd->memfd, (off_t)rd->total) < 0)
                return tfile_fail(rd->why, rd->whysz, -errno, "sizing the memfd: %s",
                                  strerror(errno));
        rd->mem = mmap(NULL, (size_t)rd->total, PROT_READ | PROT_WRITE, MAP_SHARED, rd->memfd, 0);
        if (rd->mem == MAP_FAILED) {
                rd->mem = NULL;
                return tfile_fail(rd->why, rd->whysz, -errno, "mapping the memfd: %s",
                                  strerror(errno));
        }
        for (size_t i = 0; i < rd->n; i++) {
                struct entry *e = &rd->e[i];
                const char *name = zip_get_name(rd->za, e->index, 0);

                if (!name)
                        return tfile_fail(rd->why, rd->whysz, -EINVAL,
                                          "malformed .npz: entry %zu has no name", i);
                e->name = name;
                layout_quote(name, strlen(name), shown, sizeof(shown));
                r = inflate_entry(rd, e, shown);
                if (r == 0)
                        r = read_npy(rd, e, shown);
                if (r < 0)
                        return r;
        }
        return build(rd, ret);
}

int npz_open(const char *path, struct tfile **ret, char *why, size_t whysz)
{
        struct reader rd = {.memfd = -1, .why = why, .whysz = whysz};
        struct tfile *t = NULL;
        zip_source_t *src;
        zip_error_t zerr;
        struct stat st;
        void *map;
        int fd, r;

        if (!path || !ret)
                return tfile_fail(why, whysz, -EINVAL, "npz_open: NULL argument");
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return tfile_fail(why, whysz, -errno, "%s", strerror(errno));
        if (fstat(fd, &st) < 0) {
                r = -errno;
                close(fd);
                return tfile_fail(why, whysz, r, "%s", strerror(-r));
        }
        if (!S_ISREG(st.st_mode) || st.st_size == 0) {
                close(fd);
                return tfile_fail(why, whysz, -EINVAL,
                                  S_ISREG(st.st_mode) ? "not a zip archive (empty file)"
                                                      : "not a regular file");
        }
        /* libzip reads a mapping: no descriptor of ours outlives this call, none lacks CLOEXEC. */
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        r = map == MAP_FAILED ? -errno : 0;
        close(fd);
        if (r < 0)
                return tfile_fail(why, whysz, r, "mapping the file: %s", strerror(-r));
        zip_error_init(&zerr);
        src = zip_source_buffer_create(map, (zip_uint64_t)st.st_size, 0, &zerr);
        if (src)
                rd.za = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &zerr);
        if (!rd.za) {
                r = zip_errno(&zerr);
                /* libzip's words for it, "File already exists", would puzzle a reader. */
                tfile_fail(why, whysz, r, "malformed .npz: %s",
                           zip_error_code_zip(&zerr) == ZIP_ER_EXISTS
                                   ? "two entries have the same name"
                                   : zip_error_strerror(&zerr));
                zip_source_free(src);
                zip_error_fini(&zerr);
                munmap(map, (size_t)st.st_size);
                return r;
        }
        zip_error_fini(&zerr);
        r = read_archive(&rd, &t);
        if (r == 0) {
                t->map = rd.mem;
                t->map_len = (size_t)rd.total;
                rd.mem = NULL;
                *ret = t;
        }
        if (rd.mem)
                munmap(rd.mem, (size_t)rd.total);
        if (rd.memfd >= 0)
                close(rd.memfd);
        free(rd.e);
        zip_discard(rd.za);
        munmap(map, (size_t)st.st_size);
        return r;
}

/* ---- writing ------------------------------------------------------------------------------ */

/* One entry's .npy bytes in the staging file, as a libzip source reads them. */
struct staged {
        int fd; /* borrowed: the staging file */
        uint64_t at, len, pos;
        zip_error_t err;
};

static zip_int64_t staged_cb(void *ud, void *data, zip_uint64_t len, zip_source_cmd_t cmd)
{
        struct staged *s = ud;

        switch (cmd) {
        case ZIP_SOURCE_OPEN:
                s->pos = 0;
                return 0;
        case ZIP_SOURCE_READ: {
                uint64_t want = s->len - s->pos;
                ssize_t n;

                if (want > len)
                        want = len;
                if (want > NPZ_IO_CHUNK)
                        want = NPZ_IO_CHUNK;
                if (want == 0)
                        return 0;
                do
                        n = pread(s->fd, data, (size_t)want, (off_t)(s->at + s->pos));
                while (n < 0 && errno == EINTR);
                if (n <= 0) {
                        zip_error_set(&s->err, ZIP_ER_READ, n < 0 ? errno : EIO);
                        return -1;
                }
                s->pos += (uint64_t)n;
                return n;
        }
        case ZIP_SOURCE_CLOSE:
                return 0;
        case ZIP_SOURCE_STAT: {
                zip_stat_t *st = ZIP_SOURCE_GET_ARGS(zip_stat_t, data, len, &s->err);

                if (!st)
                        return -1;
                zip_stat_init(st);
                st->size = s->len;
                st->valid |= ZIP_STAT_SIZE;
                return sizeof(*st);
        }
        case ZIP_SOURCE_ERROR:
                return zip_error_to_data(&s->err, data, len);
        case ZIP_SOURCE_FREE:
                return 0; /* the array of struct staged is npz_write()'s */
        case ZIP_SOURCE_SUPPORTS:
                return zip_source_make_command_bitmap(ZIP_SOURCE_OPEN, ZIP_SOURCE_READ,
                                                      ZIP_SOURCE_CLOSE, ZIP_SOURCE_STAT,
                                                      ZIP_SOURCE_ERROR, ZIP_SOURCE_FREE, -1);
        default:
                zip_error_set(&s->err, ZIP_ER_OPNOTSUPP, 0);
                return -1;
        }
}

/* An unnamed file beside path for the .npy bodies, or a memfd where O_TMPFILE cannot be. */
static int staging_file(const char *path)
{
        char dir[PATH_MAX];
        int fd;

        if (strlen(path) < sizeof(dir)) {
                strcpy(dir, path);
                fd = open(dirname(dir), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
                if (fd >= 0)
                        return fd;
        }
        fd = memfd_create("dlx-npz-out", MFD_CLOEXEC);
        return fd < 0 ? -errno : fd;
}

/* np.savez() of nothing: a zip with no entries is its end-of-central-directory record alone. */
static int write_empty(const char *path, char *why, size_t whysz)
{
        static const char eocd[22] = {'P', 'K', 5, 6};
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        ssize_t w;
        int r = 0;

        if (fd < 0)
                return tfile_fail(why, whysz, -errno, "%s", strerror(errno));
        do
                w = write(fd, eocd, sizeof(eocd));
        while (w < 0 && errno == EINTR);
        if (w != (ssize_t)sizeof(eocd))
                r = w < 0 ? -errno : -EIO;
        if (close(fd) < 0 && r == 0)
                r = -errno;
        return r < 0 ? tfile_fail(why, whysz, r, "writing .npz: %s", strerror(-r)) : 0;
}

/* Writes every member's .npy into the staging file, recording where each lies. */
static int stage(int fd, const struct tfile_member *members, const size_t *order, size_t n,
                 struct staged *s, char *why, size_t whysz)
{
        off_t at = 0;

        for (size_t i = 0; i < n; i++) {
                const struct tfile_member *m = &members[order[i]];
                char nwhy[MSG_MAX] = "", shown[64];
                off_t end;
                int r = npy_write_fd(fd, &m->tensor, nwhy, sizeof(nwhy));

                if (r < 0) {
                        layout_quote(m->name, strlen(m->name), shown, sizeof(shown));
                        return tfile_fail(why, whysz, r, "tensor '%s': %s", shown, nwhy);
                }
                end = lseek(fd, 0, SEEK_CUR);
                if (end < 0)
                        return tfile_fail(why, whysz, -errno, "staging .npy data: %s",
                                          strerror(errno));
                s[i] = (struct staged){.fd = fd, .at = (uint64_t)at, .len = (uint64_t)(end - at)};
                zip_error_init(&s[i].err);
                at = end;
        }
        return 0;
}

static int fail_zip(zip_t *za, char *why, size_t whysz, const char *what)
{
        int r = zip_errno(zip_get_error(za));

        if (r == -EINVAL || r == -ENOTSUP)
                r = -EIO;
        return tfile_fail(why, whysz, r, "%s: %s", what, zip_strerror(za));
}

static int archive(const char *path, const struct tfile_member *members, const size_t *order,
                   size_t n, struct staged *s, char *why, size_t whysz)
{
        char entry[TFILE_NAME_MAX + NPY_SUFFIX_LEN + 1];
        zip_error_t zerr;
        int zcode = 0, r;
        zip_t *za = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &zcode);

        if (!za) {
                zip_error_init_with_code(&zerr, zcode);
                r = zip_errno(&zerr);
                r = r == -EINVAL ? -EIO : r;
                tfile_fail(why, whysz, r, "creating .npz: %s", zip_error_strerror(&zerr));
                zip_error_fini(&zerr);
                return r;
        }
        for (size_t i = 0; i < n; i++) {
                zip_source_t *src = zip_source_function(za, staged_cb, &s[i]);
                zip_int64_t idx;

                snprintf(entry, sizeof(entry), "%s" NPY_SUFFIX, members[order[i]].name);
                if (!src) {
                        r = fail_zip(za, why, whysz, "adding an entry");
                        zip_discard(za);
                        return r;
                }
                idx = zip_file_add(za, entry, src, ZIP_FL_ENC_UTF_8);
                if (idx < 0) {
                        zip_source_free(src);
                        r = fail_zip(za, why, whysz, "adding an entry");
                        zip_discard(za);
                        return r;
                }
                if (zip_set_file_compression(za, (zip_uint64_t)idx, ZIP_CM_STORE, 0) < 0) {
                        r = fail_zip(za, why, whysz, "storing an entry");
                        zip_discard(za);
                        return r;
                }
        }
        if (zip_close(za) < 0) {
                r = fail_zip(za, why, whysz, "writing .npz");
                zip_discard(za);
                return r;
        }
        return 0;
}

int npz_write(const char *path, const struct tfile_member *members, size_t n, char *why,
              size_t whysz)
{
        struct staged *s = NULL;
        size_t *order = NULL;
        int fd = -1, r;

        if (!path || (!members && n > 0))
                return tfile_fail(why, whysz, -EINVAL, "npz_write: NULL argument");
        if (n > TFILE_MAX_MEMBERS)
                return tfile_fail(why, whysz, -EINVAL,
                                  "%zu tensors; an .npz written by dlx holds at most %u", n,
                                  TFILE_MAX_MEMBERS);
        order = calloc(n + 1, sizeof(*order));
        s = calloc(n + 1, sizeof(*s));
        if (!order || !s) {
                r = tfile_fail(why, whysz, -ENOMEM, "out of memory for %zu tensors", n);
                goto out;
        }
        r = tfile_check_names(members, n, order, why, whysz);
        if (r < 0)
                goto out;
        if (n == 0) {
                r = write_empty(path, why, whysz);
                goto out;
        }
        fd = staging_file(path);
        if (fd < 0) {
                r = tfile_fail(why, whysz, fd, "a staging file: %s", strerror(-fd));
                fd = -1;
                goto out;
        }
        r = stage(fd, members, order, n, s, why, whysz);
        if (r == 0)
                r = archive(path, members, order, n, s, why, whysz);
        for (size_t i = 0; i < n; i++)
                zip_error_fini(&s[i].err);
out:
        if (fd >= 0)
                close(fd);
        free(s);
        free(order);
        return r;
}
