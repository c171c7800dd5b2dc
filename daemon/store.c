/* SPDX-License-Identifier: MIT */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

#include "wire_limits.h"
#include "invariant.h"
#include "log.h"
#include "wire.h"

#define REQUIRED_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

static int cmp_id(const void *key, const struct avl_node *n)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(n, struct segment, node)->id);
}

void store_init(struct store *st)
{
        avl_init(&st->segments);
        avl_init(&st->uids);
        st->next_id = 1;
        st->bytes = 0;
        st->max_bytes = 0;
        st->max_bytes_per_uid = 0;
        st->fds = 0;
        st->max_fds = 0;
        st->max_fds_per_uid = 0;
        st->vmm_dev = makedev(STORE_VMM_MAJOR, STORE_VMM_MINOR);
        st->on_gone = NULL;
        st->on_defer = NULL;
        st->defer_ctx = NULL;
        st->ndeferred = 0;
        st->deferred_closing = 0;
}

/*
 * Whether descriptor fd lies near the top of what dlxd may hold (its
 * RLIMIT_NOFILE, read now: another process may have lowered it since). The
 * kernel gives the lowest free number, so a high one says the table was
 * nearly full when fd came: a destroyed segment's descriptor then closes at
 * once, not after the reply, for the descriptors coming next need its room.
 */
static bool near_fd_limit(int fd)
{
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
                return false;
        return (rlim_t)fd + 2 * STORE_DEFER_MAX >= rl.rlim_cur;
}

static void segment_destroy(struct store *st, struct segment *seg)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &seg->known)
        {
                struct known *k = list_entry(pos, struct known, link);
                /* on_gone unlinks and frees the record */
                if (st->on_gone)
                        st->on_gone(k->session, seg->id);
                else
                        list_remove(&k->link);
        }
        avl_remove(&st->segments, &seg->node);
        if (seg->fd >= 0) {
                struct uid_use *u = quota_uid(st, seg->uid, false);
                count_take(st->bytes, seg->size);
                count_take(st->fds, 1);
                if (invariant(u)) {
                        quota_count(u, QUOTA_BYTES, -(int64_t)seg->size);
                        quota_count(u, QUOTA_FDS, -1);
                        quota_uid_put(st, u);
                }
                if (seg->size >= STORE_DEFER_BYTES && st->on_defer &&
                    st->ndeferred + st->deferred_closing < STORE_DEFER_MAX &&
                    !near_fd_limit(seg->fd)) {
                        st->deferred[st->ndeferred++] = seg->fd;
                        st->on_defer(st->defer_ctx);
                } else {
                        close(seg->fd);
                }
        }
        log_debug("segment %llu destroyed (%llu bytes)", (unsigned long long)seg->id,
                  (unsigned long long)seg->size);
        free(seg);
}

void store_close_deferred(struct store *st)
{
        while (st->ndeferred > 0)
                close(st->deferred[--st->ndeferred]);
}

void store_done(struct store *st)
{
        struct avl_node *n, *next;

        st->on_defer = NULL;
        store_close_deferred(st);
        for (n = avl_first(&st->segments); n; n = next) {
                next = avl_next(n);
                segment_destroy(st, avl_entry(n, struct segment, node));
        }
        /* sessions are gone, and so are their counts: whatever is left is free to go */
        for (n = avl_first(&st->uids); n; n = next) {
                next = avl_next(n);
                avl_remove(&st->uids, n);
                free(avl_entry(n, struct uid_use, node));
        }
}

static int insert(struct store *st, int fd, uint32_t kind, uint64_t size, uid_t uid,
                  struct segment **ret)
{
        struct segment *seg = calloc(1, sizeof(*seg));
        struct uid_use *u = fd >= 0 ? quota_uid(st, uid, true) : NULL;

        if (!seg || (fd >= 0 && !u)) {
                free(seg);
                quota_uid_put(st, u);
                return -ENOMEM;
        }
        seg->id = st->next_id++;
        seg->kind = kind;
        seg->fd = fd;
        seg->size = size;
        seg->uid = uid;
        seg->refs = 1;
        list_init(&seg->known);
        avl_insert(&st->segments, &seg->node, &seg->id, cmp_id);
        if (fd >= 0) {
                st->bytes += size;
                quota_count(u, QUOTA_BYTES, (int64_t)size);
                st->fds++;
                quota_count(u, QUOTA_FDS, 1);
        }
        *ret = seg;
        return 0;
}

/*
 * Whether one more segment of size bytes, and its descriptor, fit the limits
 * in all and for uid: 0, or -ENOSPC (bytes) or -EAGAIN (descriptors) with the
 * reason in st->why. -EINVAL for a size no segment may have.
 */
static int room_for(struct store *st, uint64_t size, uid_t uid)
{
        const struct uid_use *u = quota_uid(st, uid, false);
        uint64_t bytes = u ? u->bytes : 0, fds = u ? u->fds : 0;

        if (size == 0 || size > DLX_MAX_SEGMENT)
                return -EINVAL;
        if (st->max_fds && st->fds >= st->max_fds) {
                snprintf(st->why, sizeof(st->why),
                         "the daemon holds %llu descriptors for segments (the limit, --max-fds)",
                         (unsigned long long)st->fds);
                return -EAGAIN;
        }
        if (fds >= quota_uid_cap(st->max_fds, st->max_fds_per_uid, st->fds, fds, QUOTA_HALF)) {
                snprintf(st->why, sizeof(st->why),
                         "uid %u holds %llu descriptors for segments (%s, --max-fds-per-uid); "
                         "unpublish some, or publish from dlx_alloc() memory, which packs many "
                         "tensors into one segment",
                         (unsigned)uid, (unsigned long long)fds,
                         st->max_fds_per_uid == DLX_LIMIT_FAIR
                                 ? "its fair share: half of what other uids leave"
                                 : "the limit");
                return -EAGAIN;
        }
        if (st->max_bytes_per_uid &&
            (size > st->max_bytes_per_uid || bytes > st->max_bytes_per_uid - size)) {
                snprintf(st->why, sizeof(st->why),
                         "%llu more bytes would pass uid %u's limit of %llu shared bytes "
                         "(%llu in use)",
                         (unsigned long long)size, (unsigned)uid,
                         (unsigned long long)st->max_bytes_per_uid, (unsigned long long)bytes);
                return -ENOSPC;
        }
        if (st->max_bytes && (size > st->max_bytes || st->bytes > st->max_bytes - size)) {
                snprintf(st->why, sizeof(st->why),
                         "%llu more bytes would pass the limit of %llu shared bytes (%llu in use)",
                         (unsigned long long)size, (unsigned long long)st->max_bytes,
                         (unsigned long long)st->bytes);
                return -ENOSPC;
        }
        return 0;
}

int store_alloc(struct store *st, uint64_t size, uid_t uid, struct segment **ret,
                const char **ret_why)
{
        char name[32];
        int fd, err;

        *ret_why = NULL;
        err = room_for(st, size, uid);
        if (err == -EINVAL)
                *ret_why = "a segment is 1 byte to 1 TiB";
        else if (err < 0)
                *ret_why = st->why;
        if (err < 0)
                return err;
        snprintf(name, sizeof(name), "dlx-%llu", (unsigned long long)st->next_id);
        fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        /*
         * Only the size is sealed now: the allocating client fills it through
         * a writable mapping. A read-only publish from it seals it against
         * writing (segment_seal_ro()); no file mode is relied on, since the
         * same uid, or root, can change those.
         */
        if (ftruncate(fd, (off_t)size) < 0 || fcntl(fd, F_ADD_SEALS, REQUIRED_SEALS) < 0) {
                err = -errno;
                close(fd);
                return err;
        }
        err = insert(st, fd, WIRE_STORAGE_MEMFD, size, uid, ret);
        if (err < 0)
                close(fd);
        else
                (*ret)->ours = true;
        return err;
}

/*
 * What fd is, for a refusal: its file type and device number, and the name
 * the kernel gives it where the type says too little (a memfd is a regular
 * file; eventfd, timerfd and the other anonymous inodes have no type).
 * fl is its file status flags.
 */
static void describe_fd(int fd, const struct stat *sb, int fl, char *buf, size_t len)
{
        char path[32], link[64] = "";
        const char *anon = NULL;
        ssize_t n;

        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        n = readlink(path, link, sizeof(link) - 1);
        link[n > 0 ? n : 0] = '\0';
        if (strncmp(link, "anon_inode:", 11) == 0)
                anon = link + 11 + (link[11] == '['); /* anon_inode:[eventfd] */
        if (fl >= 0 && (fl & O_PATH))
                snprintf(buf, len, "an O_PATH descriptor, which no driver can use");
        else if (anon)
                snprintf(buf, len, "an anonymous inode (%.*s)", (int)strcspn(anon, "]"), anon);
        else if (S_ISREG(sb->st_mode))
                snprintf(buf, len, "a regular file%s",
                         strncmp(link, "/memfd:", 7) == 0 ? " (a memfd)" : "");
        else if (S_ISCHR(sb->st_mode) || S_ISBLK(sb->st_mode))
                snprintf(buf, len, "%s %u:%u",
                         S_ISCHR(sb->st_mode) ? "character device" : "block device",
                         major(sb->st_rdev), minor(sb->st_rdev));
        else if (S_ISDIR(sb->st_mode))
                snprintf(buf, len, "a directory");
        else if (S_ISFIFO(sb->st_mode))
                snprintf(buf, len, "a pipe");
        else if (S_ISSOCK(sb->st_mode))
                snprintf(buf, len, "a socket");
        else if (S_ISLNK(sb->st_mode))
                snprintf(buf, len, "a symbolic link");
        else
                snprintf(buf, len, "a file of no known type (mode %o)", (unsigned)sb->st_mode);
}

/*
 * A CUDA VMM export. dlxd cannot ask a driver what an fd holds, but the
 * driver imports only a file of its control device (nv_get_file_private()
 * checks the major and the control minor), and O_PATH files not at all.
 * Anything else (a memfd, a tmpfile, /dev/zero declared as 1 TiB) is an
 * impostor: held, charged and handed to every consumer, it could only fail
 * in each of them.
 */
static int adopt_vmm(struct store *st, int fd, const struct stat *sb, uint32_t kind,
                     uint64_t declared_size, uid_t uid, struct segment **ret, const char **ret_why)
{
        unsigned maj = major(st->vmm_dev), min = minor(st->vmm_dev);
        int fl = fcntl(fd, F_GETFL), err;
        char what[96];

        if (!S_ISCHR(sb->st_mode) || sb->st_rdev != st->vmm_dev || fl < 0 || (fl & O_PATH)) {
                describe_fd(fd, sb, fl, what, sizeof(what));
                if (maj == STORE_VMM_MAJOR && min == STORE_VMM_MINOR)
                        snprintf(st->why, sizeof(st->why),
                                 "a cuda-vmm fd must be an NVIDIA driver export (/dev/nvidiactl, "
                                 "char %u:%u), not %s",
                                 maj, min, what);
                else
                        snprintf(st->why, sizeof(st->why),
                                 "a cuda-vmm fd must be a driver export (char %u:%u, as "
                                 "--cuda-device-number says), not %s",
                                 maj, min, what);
                *ret_why = st->why;
                close(fd);
                return -EBADF;
        }
        err = room_for(st, declared_size, uid);
        if (err == -EINVAL)
                *ret_why = "a cuda-vmm segment needs a size of 1 byte to 1 TiB";
        else if (err < 0)
                *ret_why = st->why;
        if (err == 0)
                err = insert(st, fd, kind, declared_size, uid, ret);
        if (err < 0)
                close(fd);
        return err;
}

int store_adopt(struct store *st, int fd, uint32_t kind, uint64_t declared_size, uid_t uid,
                struct segment **ret, const char **ret_why)
{
        const struct storage_kind *k = storage_kind(kind);
        struct stat sb;
        int seals, err, mode;

        if (fstat(fd, &sb) < 0) {
                err = -errno;
                close(fd);
                return err;
        }
        *ret_why = NULL;
        if (k && k->check == STORAGE_CHECK_DRIVER_FD)
                return adopt_vmm(st, fd, &sb, k->id, declared_size, uid, ret, ret_why);
        if (!k || k->check != STORAGE_CHECK_MEMFD) {
                *ret_why = "this storage kind takes no fd";
                close(fd);
                return -EINVAL;
        }
        if (!S_ISREG(sb.st_mode)) {
                *ret_why = "the fd is not a memfd (not a regular file)";
        } else if ((seals = fcntl(fd, F_GET_SEALS)) < 0) {
                *ret_why = "the fd is not a memfd (it cannot carry seals)";
        } else if ((seals & REQUIRED_SEALS) != REQUIRED_SEALS) {
                *ret_why = "the memfd is not sealed against shrinking and growing";
        } else if ((mode = fcntl(fd, F_GETFL)) < 0 || (mode & O_ACCMODE) == O_WRONLY) {
                *ret_why = "the memfd is not open for reading";
        } else {
                err = room_for(st, (uint64_t)sb.st_size, uid);
                if (err == -EINVAL)
                        *ret_why = "the memfd is empty or larger than 1 TiB";
                else if (err < 0)
                        *ret_why = st->why;
                if (err < 0) {
                        close(fd);
                        return err == -EINVAL ? -EBADF : err;
                }
                err = insert(st, fd, kind, (uint64_t)sb.st_size, uid, ret);
                if (err < 0) {
                        close(fd);
                        return err;
                }
                /*
                 * Only F_SEAL_WRITE proves no writable mapping exists. A peer's
                 * memfd sealed F_SEAL_FUTURE_WRITE may still be mapped writable
                 * by whoever mapped it before (its sender; the daemon, for a
                 * version page sent back to it): segment_seal_ro() tries
                 * F_SEAL_WRITE on it like on any other.
                 */
                (*ret)->write_sealed = (seals & F_SEAL_WRITE) != 0;
                (*ret)->fd_readonly = (mode & O_ACCMODE) == O_RDONLY;
                return 0;
        }
        close(fd);
        return -EBADF;
}

int store_ipc(struct store *st, const uint8_t handle[DLX_CUDA_HANDLE], uint64_t size, uid_t uid,
              struct segment **ret)
{
        int err;

        if (size == 0 || size > DLX_MAX_SEGMENT)
                return -EINVAL;
        err = insert(st, -1, WIRE_STORAGE_CUDA_IPC, size, uid, ret);
        if (err == 0)
                memcpy((*ret)->ipc_handle, handle, DLX_CUDA_HANDLE);
        return err;
}

struct segment *store_find(struct store *st, uint64_t id)
{
        struct avl_node *n = avl_find(&st->segments, &id, cmp_id);
        return n ? avl_entry(n, struct segment, node) : NULL;
}

void segment_ref(struct segment *seg)
{
        seg->refs++;
}

void segment_unref(struct store *st, struct segment *seg)
{
        /* a count already 0 leaves the segment be: better leaked than freed twice */
        if (count_take(seg->refs, 1) && seg->refs == 0)
                segment_destroy(st, seg);
}

int segment_seal_ro(struct segment *seg, const char **ret_why)
{
        if (seg->write_sealed)
                return 0;
        if (seg->shared_rw) {
                *ret_why = "its segment carries a writable version, whose readers may map it "
                           "writable";
                return -EBUSY;
        }
        if (seg->fd_readonly) {
                *ret_why = "its memfd is not sealed against writing (F_SEAL_WRITE) and dlxd "
                           "cannot seal it (a read-only fd)";
                return -EBADF;
        }
        /*
         * A memfd of ours was only ever mapped writable by the client it was
         * made for (its allocator): the future-write seal leaves that one
         * mapping and stops every other. A memfd a peer sent may be mapped
         * writable anywhere: only F_SEAL_WRITE, which the kernel refuses
         * while any writable mapping exists, proves there is none.
         */
        if (fcntl(seg->fd, F_ADD_SEALS, seg->ours ? F_SEAL_FUTURE_WRITE : F_SEAL_WRITE) < 0) {
                if (errno == EBUSY) {
                        *ret_why = "its memfd is mapped writable somewhere (F_SEAL_WRITE "
                                   "refused): unmap it, or seal it before publishing";
                        return -EBUSY;
                }
                *ret_why = "its memfd is not sealed against writing (F_SEAL_WRITE) and dlxd "
                           "cannot seal it (F_SEAL_SEAL: memory dlxd shares writable, or its "
                           "sender, allows no new seals)";
                return -EBADF;
        }
        seg->write_sealed = true;
        return 0;
}

int segment_seal_rw(struct segment *seg, const char **ret_why)
{
        int seals;

        /* EPERM: F_SEAL_SEAL is there already (a copy libdlx made, say) */
        if (fcntl(seg->fd, F_ADD_SEALS, F_SEAL_SEAL) < 0 && errno != EPERM) {
                *ret_why = "dlxd cannot seal its memfd against further seals";
                return -EIO;
        }
        seals = fcntl(seg->fd, F_GET_SEALS);
        if (seals < 0) {
                *ret_why = "dlxd cannot read its memfd's seals";
                return -EIO;
        }
        if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
                seg->write_sealed = true;
                *ret_why = "its memfd is sealed against writing";
                return -EBUSY;
        }
        if (!(seals & F_SEAL_SEAL)) {
                *ret_why = "its memfd still takes new seals, which would let any reader seal "
                           "it against writing";
                return -EIO;
        }
        return 0;
}
