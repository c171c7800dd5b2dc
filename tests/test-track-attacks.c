/* SPDX-License-Identifier: MIT */
/*
 * Tracking, read by a second reader: every promise of README "Tracking" and
 * of dlx.h "tracking" attacked, each test naming the promise it checks.
 * test-track.c is the author's own suite; nothing here repeats it.
 *
 * The promises (quoted where they are pinned):
 *  P1 "The daemon writes the page before it answers the publish or unpublish
 *     that changed the version, so once dlx_publish() has returned anywhere,
 *     every tracker reads that version or a newer one."
 *  P2 "Version 0 means none (not published, or unpublished), and a tracked
 *     name keeps counting versions across an unpublish."
 *  P3 "Tracking says what exists, not what you hold": no lease, no name, no
 *     memory held for a tracked name; leases stay exact.
 *  P4 "The page is safe from every other process: each session has its own,
 *     sealed (F_SEAL_FUTURE_WRITE) so that not even its client can map it
 *     writable, write it or resize it"; "no client can change what another
 *     sees" (proto/verpage.h).
 *  P5 "A client tracks at most --max-watches names (counted apart from its
 *     watches); the same name twice is one track, each dlx_track() needing
 *     its dlx_untrack()"; "65536 at most".
 *  P6 dlx_track_wait(): "Waits until the tracked version is no longer
 *     version ... up to timeout_ms (0: no wait, < 0: no limit)", "the daemon
 *     wakes it without a message", "Any number of threads may wait on one
 *     track", -EINVAL when "untracked while waited on", -ECONNRESET when "the
 *     session ended, or the daemon is gone".
 *  P7 Lifetimes: dlx_close() ("When dlx_close() returns, the daemon has ended
 *     what it ends"), fork (-ESTALE, the parent's session untouched), a
 *     process's exit, a daemon stopped, killed or restarted; the daemon
 *     keeps no descriptor, mapping or memory of a session that ended.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "pbwrite.h"
#include "rawpeer.h"
#include "verpage.h"

#define DLXV(call) ck_assert_int_eq((call), 0)
#define NOBODY 65534
#define OTHER_UID 65533 /* a second non-root uid, in group nobody too */
#define REPLY_MS 10000

/* ---- helpers -------------------------------------------------------------------------------- */

/* A copy publish (plain heap memory): no allocator segment stays behind. */
static void publish_copy(dlx_client *c, const char *name, uint64_t *ret_version)
{
        publish_ok(c, name, fx_plain_f32(16, 1, NULL), NULL, ret_version);
}

/* Sends req (no fd) and reads its answer (events skipped); returns the status. */
static int raw_call(int sock, const struct wire_request *req, struct wire_reply *rep, int *ret_fd)
{
        int r;

        rp_send(sock, req, -1);
        r = rp_read_answer(sock, rep, REPLY_MS * fx_slowdown(), ret_fd);
        ck_assert_msg(r == 1, "request %llu: no answer (%d)", (unsigned long long)req->id, r);
        ck_assert_uint_eq(rep->id, req->id);
        return rep->status;
}

static __attribute__((noinline)) void track_req(struct wire_request *req, uint64_t id,
                                                const char *name)
{
        size_t n = strlen(name);

        ck_assert_uint_le(n, DLX_NAME_MAX);
        memset(req, 0, sizeof(*req));
        req->id = id;
        req->type = WIRE_REQ_TRACK;
        memcpy(req->track.name, name, n + 1);
}

static void untrack_req(struct wire_request *req, uint64_t id, uint32_t slot)
{
        memset(req, 0, sizeof(*req));
        req->id = id;
        req->type = WIRE_REQ_UNTRACK;
        req->untrack.slot = slot;
}

/* A Track from a raw peer: its status; the reply in *rep, the page fd (or -1) in *ret_fd. */
static int raw_track(int sock, uint64_t id, const char *name, struct wire_reply *rep, int *ret_fd)
{
        struct wire_request req;
        int fd = -1, st;

        track_req(&req, id, name);
        st = raw_call(sock, &req, rep, &fd);
        if (ret_fd)
                *ret_fd = fd;
        else if (fd >= 0)
                close(fd);
        return st;
}

static int raw_untrack(int sock, uint64_t id, uint32_t slot)
{
        struct wire_request req;
        struct wire_reply rep;

        untrack_req(&req, id, slot);
        return raw_call(sock, &req, &rep, NULL);
}

/* The page a raw peer got, mapped read-only. */
struct rpage {
        int fd;
        size_t size;
        uint32_t slots;
        const struct version_page *pg;
};

static void rpage_map(struct rpage *p, int fd, uint32_t slots)
{
        struct stat st;

        ck_assert_int_ge(fd, 0);
        p->fd = fd;
        p->slots = slots;
        p->size = VERPAGE_SIZE(slots);
        ck_assert_int_eq(fstat(fd, &st), 0);
        ck_assert_msg((uint64_t)st.st_size >= p->size, "page of %lld bytes for %u slots",
                      (long long)st.st_size, slots);
        p->pg = mmap(NULL, p->size, PROT_READ, MAP_SHARED, fd, 0);
        ck_assert_ptr_ne(p->pg, MAP_FAILED);
        ck_assert_uint_eq(p->pg->magic, VERPAGE_MAGIC);
        ck_assert_uint_eq(p->pg->slots, slots);
}

static void rpage_unmap(struct rpage *p)
{
        munmap((void *)p->pg, p->size);
        close(p->fd);
}

static uint64_t slot_version(const struct version_page *pg, uint32_t slot)
{
        return __atomic_load_n(&pg->slot[slot].version, __ATOMIC_ACQUIRE);
}

static uint32_t page_closed(const struct version_page *pg)
{
        return __atomic_load_n(&pg->closed, __ATOMIC_ACQUIRE);
}

/* Whether sock has anything to read within ms. */
static bool readable_within(int sock, int ms)
{
        struct pollfd p = {.fd = sock, .events = POLLIN};

        return poll(&p, 1, ms) == 1;
}

/* A line of /proc/<pid>/status ("VmRSS:") as a number (kB), or -1. */
static long proc_status_kb(pid_t pid, const char *key)
{
        char path[64], line[256];
        long v = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, key, strlen(key)) == 0)
                        v = strtol(line + strlen(key), NULL, 10);
        fclose(f);
        return v;
}

/* Mappings of memfds in a process (lines of /proc/<pid>/maps naming "memfd:"). */
static int memfd_maps(pid_t pid)
{
        char path[64], line[512];
        int n = 0;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
        f = fopen(path, "re");
        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f))
                if (strstr(line, "memfd:"))
                        n++;
        fclose(f);
        return n;
}

static int wait_memfd_maps(pid_t pid, int n, int timeout_ms)
{
        int count = memfd_maps(pid);

        for (int waited = 0; count > n && waited < timeout_ms; waited += 10) {
                fx_sleep_ms(10);
                count = memfd_maps(pid);
        }
        return count;
}

struct waiter {
        dlx_client *c;
        uint32_t track;
        uint64_t after;
        int64_t timeout_ms;
        int err;
        uint64_t seen;
        int64_t ended_ms;
        pid_t tid;
};

static void *wait_thread(void *arg)
{
        struct waiter *w = arg;

        __atomic_store_n(&w->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
        w->err = dlx_track_wait(w->c, w->track, w->after, w->timeout_ms, &w->seen);
        w->ended_ms = fx_now_ms();
        return NULL;
}

/* Whether the waiter's thread sleeps in futex(2) now, as dlx_track_wait() does (up to 2 s). */
static bool waiter_asleep(const struct waiter *w)
{
        for (int i = 0; i < 2000; i++) {
                pid_t tid = __atomic_load_n(&w->tid, __ATOMIC_ACQUIRE);
                char path[64], line[64] = "";
                FILE *f;

                if (tid > 0) {
                        snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
                        f = fopen(path, "re");
                        if (f) {
                                if (!fgets(line, sizeof(line), f))
                                        line[0] = '\0';
                                fclose(f);
                        }
                        if (strtol(line, NULL, 10) == SYS_futex && w->err == 1)
                                return true;
                }
                fx_sleep_ms(1);
        }
        return false;
}

static void start_waiter(pthread_t *th, struct waiter *w)
{
        w->err = 1;
        w->seen = ~0ull;
        w->tid = 0;
        ck_assert_int_eq(pthread_create(th, NULL, wait_thread, w), 0);
}

/* Lets other uids in group nobody reach the fixture's socket (the daemon runs --group 65534). */
static void open_to_others(void)
{
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        ck_assert_int_eq(chmod(fx.socket, 0666), 0);
}

/* In a forked child: becomes uid (group nobody) and connects; NULL if it cannot. */
static dlx_client *connect_as(uid_t uid)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "other-uid"};
        dlx_client *c = NULL;

        if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(uid) != 0)
                return NULL;
        return dlx_connect(&o, &c) == 0 ? c : NULL;
}

/* ---- a hostile raw peer --------------------------------------------------------------------- */

/* P5/dlx.h "-EINVAL a bad name": every name publish refuses is refused to Track, and the
 * session goes on; a refused Track sends no page. */
START_TEST(raw_bad_names_refused)
{
        static const char *const bad[] = {
                "",
                "/a",
                "a/",
                "a//b",
                ".",
                "..",
                "a/./b",
                "a/../b",
                "bad\x7fname",
                "c1\xc2\x85name",
                "zw\xe2\x80\x8bsp",
                "bidi\xe2\x80\xaex",
                "bom\xef\xbb\xbf",
                "bad\xffutf8",
                "half\xe2\x80",
        };
        int sock = rp_connect(fx.socket, "hostile");
        dlx_client *q = fx_connect(&fx, "lib");
        struct wire_reply rep;
        uint64_t id = 2;
        uint32_t t = 0;
        int fd;

        for (size_t i = 0; i < N_ELEMS(bad); i++) {
                ck_assert_msg(raw_track(sock, id++, bad[i], &rep, &fd) == WIRE_INVALID,
                              "raw Track of bad name #%zu: status %d", i, rep.status);
                ck_assert_int_eq(fd, -1);
                ck_assert_msg(rep.error[0], "no reason given for bad name #%zu", i);
                ck_assert_msg(dlx_track(q, bad[i], &t) == -EINVAL, "dlx_track of bad name #%zu", i);
        }
        /* a NUL inside the name and 256 bytes: payloads the codec will not make */
        {
                char longname[300];
                struct pb p, body;
                uint8_t hdr[FRAME_HEADER_SIZE];

                memset(longname, 'x', sizeof(longname));
                for (int k = 0; k < 2; k++) {
                        pb_init(&p);
                        pb_init(&body);
                        if (k == 0)
                                pb_bytes(&body, 1, "nul\0inside", 10);
                        else
                                pb_bytes(&body, 1, longname, DLX_NAME_MAX + 1);
                        pb_uint(&p, 1, id);
                        pb_msg(&p, 17, &body);
                        frame_header_put(hdr, (uint32_t)p.n, 0);
                        ck_assert_int_eq(rp_send_raw(sock, hdr, sizeof(hdr), NULL, 0), 0);
                        ck_assert_int_eq(rp_send_raw(sock, p.b, p.n, NULL, 0), 0);
                        pb_done(&p);
                        pb_done(&body);
                        ck_assert_int_eq(rp_read_answer(sock, &rep, REPLY_MS, &fd), 1);
                        ck_assert_uint_eq(rep.id, id);
                        ck_assert_int_eq(rep.status, WIRE_INVALID);
                        ck_assert_int_eq(fd, -1);
                        id++;
                }
                longname[DLX_NAME_MAX] = '\0';
                ck_assert_int_eq(raw_track(sock, id++, longname, &rep, &fd), WIRE_OK);
                ck_assert(rep.track.page); /* the first track that succeeded brings the page */
                close(fd);
        }
        rp_ping(sock, id++);
        ck_assert_uint_eq(fx_stats(q).names, 0);
        close(sock);
        dlx_close(q);
}
END_TEST

/* P4/P7: a Track frame that carries a descriptor: the daemon keeps nothing of it, and the
 * peer's session (its page) is not built on the peer's memfd. */
START_TEST(raw_track_with_fd)
{
        int sock = rp_connect(fx.socket, "hostile"), bogus = make_memfd(4096, 0), fd = -1;
        dlx_client *p = fx_connect(&fx, "producer");
        struct wire_request req;
        struct wire_reply rep;
        struct rpage pg;
        int r;

        track_req(&req, 2, "fd/x");
        rp_send(sock, &req, bogus);
        r = rp_read_answer(sock, &rep, REPLY_MS, &fd);
        if (r == 1 && rep.status == WIRE_OK) {
                struct stat a, b;
                /* accepted: the page must be the daemon's own, not the peer's memfd */
                ck_assert(rep.track.page);
                ck_assert_int_ge(fd, 0);
                ck_assert_int_eq(fstat(fd, &a), 0);
                ck_assert_int_eq(fstat(bogus, &b), 0);
                ck_assert_msg(a.st_ino != b.st_ino, "the daemon made the peer's memfd its page");
                rpage_map(&pg, fd, rep.track.slots);
                publish_copy(p, "fd/x", NULL);
                ck_assert_uint_eq(slot_version(pg.pg, rep.track.slot), 1);
                rpage_unmap(&pg);
        } else if (r == 1) {
                ck_assert_int_eq(fd, -1);
        }
        close(bogus);
        close(sock);
        dlx_close(p);
        /* dlxd_stop (teardown) checks the daemon is back to its descriptors */
}
END_TEST

/* P4/P5: untracks of slots never tracked, tracked by another session, or untracked already:
 * NOT_FOUND each, and no other session's track is touched. */
START_TEST(raw_untrack_never_tracked)
{
        int a = rp_connect(fx.socket, "a"), b = rp_connect(fx.socket, "b"), fd;
        dlx_client *p = fx_connect(&fx, "producer");
        struct wire_reply rep;
        struct rpage pa;
        uint32_t slot;

        /* before any page */
        ck_assert_int_eq(raw_untrack(b, 2, 0), WIRE_NOT_FOUND);
        ck_assert_int_eq(raw_untrack(b, 3, 1), WIRE_NOT_FOUND);
        ck_assert_int_eq(raw_untrack(b, 4, UINT32_MAX), WIRE_NOT_FOUND);
        /* a's track; b untracks "its" slot of that number */
        ck_assert_int_eq(raw_track(a, 2, "un/a", &rep, &fd), WIRE_OK);
        slot = rep.track.slot;
        rpage_map(&pa, fd, rep.track.slots);
        ck_assert_int_eq(raw_untrack(b, 5, slot), WIRE_NOT_FOUND);
        ck_assert_int_eq(raw_untrack(b, 6, 0), WIRE_NOT_FOUND);
        publish_copy(p, "un/a", NULL);
        ck_assert_uint_eq(slot_version(pa.pg, slot), 1);
        /* a's slot 0 (never handed out?) and the last slot of the page */
        ck_assert_int_eq(raw_untrack(a, 3, pa.slots - 1), WIRE_NOT_FOUND);
        ck_assert_int_eq(raw_untrack(a, 4, pa.slots), WIRE_NOT_FOUND);
        if (slot != 0)
                ck_assert_int_eq(raw_untrack(a, 5, 0), WIRE_NOT_FOUND);
        /* b tracks and untracks twice: a is unaffected */
        ck_assert_int_eq(raw_track(b, 7, "un/b", &rep, NULL), WIRE_OK);
        ck_assert_int_eq(raw_untrack(b, 8, rep.track.slot), WIRE_OK);
        ck_assert_int_eq(raw_untrack(b, 9, rep.track.slot), WIRE_NOT_FOUND);
        publish_copy(p, "un/a", NULL);
        ck_assert_uint_eq(slot_version(pa.pg, slot), 2);
        /* a: three tracks of one name need three untracks, the fourth is refused */
        ck_assert_int_eq(raw_track(a, 6, "un/a", &rep, NULL), WIRE_OK);
        ck_assert_uint_eq(rep.track.slot, slot);
        ck_assert_uint_eq(rep.track.version, 2);
        ck_assert_int_eq(raw_track(a, 7, "un/a", &rep, NULL), WIRE_OK);
        ck_assert_uint_eq(rep.track.slot, slot);
        ck_assert_int_eq(raw_untrack(a, 8, slot), WIRE_OK);
        ck_assert_int_eq(raw_untrack(a, 9, slot), WIRE_OK);
        publish_copy(p, "un/a", NULL);
        ck_assert_uint_eq(slot_version(pa.pg, slot), 3); /* still tracked once */
        ck_assert_int_eq(raw_untrack(a, 10, slot), WIRE_OK);
        ck_assert_int_eq(raw_untrack(a, 11, slot), WIRE_NOT_FOUND);
        rp_ping(a, 12);
        rp_ping(b, 13);
        rpage_unmap(&pa);
        close(a);
        close(b);
        dlx_close(p);
}
END_TEST

/* P5: the same name tracked 70000 times (pipelined) is one slot with 70000 untracks owed; no
 * narrow counter wraps. */
START_TEST(raw_refcount_does_not_wrap)
{
        enum { N = 70000, CHUNK = 5000 };
        int sock, fd = -1;
        struct wire_request req;
        struct wire_reply rep;
        uint8_t *buf = NULL;
        size_t len, cap = 0;
        uint32_t slot;
        uint64_t id = 10;

        /* counting, not memory: 140000 requests take minutes under valgrind (ASan runs it) */
        if (fx_slowdown() > 1)
                return;
        sock = rp_connect(fx.socket, "dup");
        ck_assert_int_eq(raw_track(sock, 2, "dup/x", &rep, &fd), WIRE_OK);
        slot = rep.track.slot;
        close(fd);
        /* N - 1 more tracks, then N - 1 untracks: the slot must still be tracked once */
        for (int phase = 0; phase < 2; phase++) {
                for (int done = 0; done < N - 1; done += CHUNK) {
                        int n = N - 1 - done < CHUNK ? N - 1 - done : CHUNK;
                        len = 0;
                        for (int i = 0; i < n; i++) {
                                if (phase == 0)
                                        track_req(&req, id + (uint64_t)i, "dup/x");
                                else
                                        untrack_req(&req, id + (uint64_t)i, slot);
                                rp_frame_append(&buf, &len, &cap, &req);
                        }
                        ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
                        for (int i = 0; i < n; i++) {
                                fd = -1;
                                ck_assert_int_eq(rp_read_answer(sock, &rep, REPLY_MS, &fd), 1);
                                if (fd >= 0)
                                        close(fd);
                                ck_assert_uint_eq(rep.id, id + (uint64_t)i);
                                ck_assert_msg(rep.status == WIRE_OK,
                                              "phase %d request %d: status %d (%s)", phase,
                                              done + i, rep.status, rep.error);
                                if (phase == 0)
                                        ck_assert_uint_eq(rep.track.slot, slot);
                        }
                        id += (uint64_t)n;
                }
        }
        ck_assert_int_eq(raw_untrack(sock, id++, slot), WIRE_OK);
        ck_assert_int_eq(raw_untrack(sock, id++, slot), WIRE_NOT_FOUND);
        free(buf);
        close(sock);
}
END_TEST

/* P2/P4: a slot given back and handed to another name starts at that name's version, and the
 * old name's changes no longer reach it. */
START_TEST(raw_slot_reuse_starts_clean)
{
        int sock = rp_connect(fx.socket, "reuse"), fd;
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "lib");
        struct wire_reply rep;
        struct rpage pg;
        uint32_t sa, sb, ta, tb;

        for (int i = 0; i < 3; i++)
                publish_copy(p, "re/a", NULL);
        ck_assert_int_eq(raw_track(sock, 2, "re/a", &rep, &fd), WIRE_OK);
        sa = rep.track.slot;
        rpage_map(&pg, fd, rep.track.slots);
        ck_assert_uint_eq(slot_version(pg.pg, sa), 3);
        ck_assert_uint_eq(rep.track.version, 3);
        ck_assert_int_eq(raw_untrack(sock, 3, sa), WIRE_OK);
        ck_assert_int_eq(raw_track(sock, 4, "re/b", &rep, NULL), WIRE_OK);
        sb = rep.track.slot;
        ck_assert_uint_eq(rep.track.version, 0);
        ck_assert_uint_eq(slot_version(pg.pg, sb), 0);
        publish_copy(p, "re/a", NULL);
        ck_assert_uint_eq(slot_version(pg.pg, sb), 0);
        DLXV(dlx_unpublish(p, "re/a"));
        ck_assert_uint_eq(slot_version(pg.pg, sb), 0);
        publish_copy(p, "re/b", NULL);
        ck_assert_uint_eq(slot_version(pg.pg, sb), 1);
        rpage_unmap(&pg);
        close(sock);

        /* the same through libdlx */
        publish_copy(p, "re/c", NULL);
        publish_copy(p, "re/c", NULL);
        ta = track_ok(q, "re/c");
        ck_assert_uint_eq(tracked_version(q, ta), 2);
        DLXV(dlx_untrack(q, ta));
        tb = track_ok(q, "re/d");
        ck_assert_uint_eq(tracked_version(q, tb), 0);
        publish_copy(p, "re/c", NULL);
        ck_assert_uint_eq(tracked_version(q, tb), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P5: pipelined tracks past --max-watches (256): the first 256 distinct names are granted,
 * the rest refused with LIMIT and a message; untracking all gives all the room back. */
START_TEST(raw_pipelined_past_limit)
{
        enum { N = 300, MAXW = 256 };
        int sock = rp_connect(fx.socket, "pipeline"), fd = -1;
        struct wire_request req;
        struct wire_reply rep;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        uint32_t slots[N];
        char name[32];
        int granted = 0;

        for (int round = 0; round < 2; round++) {
                len = 0;
                for (int i = 0; i < N; i++) {
                        snprintf(name, sizeof(name), "pl/%d", i);
                        track_req(&req, 100 + (uint64_t)i, name);
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
                granted = 0;
                for (int i = 0; i < N; i++) {
                        fd = -1;
                        ck_assert_int_eq(rp_read_answer(sock, &rep, REPLY_MS, &fd), 1);
                        if (fd >= 0)
                                close(fd);
                        ck_assert_uint_eq(rep.id, 100 + (uint64_t)i);
                        if (i < MAXW) {
                                ck_assert_msg(rep.status == WIRE_OK, "round %d track %d: %d %s",
                                              round, i, rep.status, rep.error);
                                ck_assert_uint_lt(rep.track.slot, rep.track.slots);
                                slots[granted++] = rep.track.slot;
                        } else {
                                ck_assert_msg(rep.status == WIRE_LIMIT && rep.error[0],
                                              "round %d track %d: %d %s", round, i, rep.status,
                                              rep.error);
                        }
                }
                for (int i = 0; i < granted; i++)
                        for (int j = i + 1; j < granted; j++)
                                ck_assert_uint_ne(slots[i], slots[j]);
                len = 0;
                for (int i = 0; i < granted; i++) {
                        untrack_req(&req, 1000 + (uint64_t)i, slots[i]);
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
                for (int i = 0; i < granted; i++) {
                        ck_assert_int_eq(rp_read_answer(sock, &rep, REPLY_MS, NULL), 1);
                        ck_assert_int_eq(rep.status, WIRE_OK);
                }
        }
        free(buf);
        close(sock);
}
END_TEST

/* P6 "the daemon wakes it without a message": a tracked name's changes send the tracker
 * nothing on its socket, and its page still follows them. */
START_TEST(raw_no_message_on_change)
{
        int sock = rp_connect(fx.socket, "quiet"), fd;
        dlx_client *p = fx_connect(&fx, "producer");
        struct wire_reply rep;
        struct rpage pg;

        ck_assert_int_eq(raw_track(sock, 2, "quiet/x", &rep, &fd), WIRE_OK);
        rpage_map(&pg, fd, rep.track.slots);
        for (int i = 0; i < 50; i++)
                publish_copy(p, "quiet/x", NULL);
        DLXV(dlx_unpublish(p, "quiet/x"));
        publish_copy(p, "quiet/x", NULL);
        ck_assert_uint_eq(slot_version(pg.pg, rep.track.slot), 51);
        ck_assert_msg(!readable_within(sock, 200), "the tracker was sent a message");
        rpage_unmap(&pg);
        close(sock);
        dlx_close(p);
}
END_TEST

/* P4: every way a holder of the page's descriptor might write it fails, and the daemon's
 * page stays intact and current. */
START_TEST(raw_page_hardening)
{
        int sock = rp_connect(fx.socket, "hostile"), fd = -1, rw, seals, mem, src;
        dlx_client *p = fx_connect(&fx, "producer");
        struct wire_reply rep;
        struct rpage pg;
        char path[64];
        uint8_t junk[64];
        void *m;

        memset(junk, 0xee, sizeof(junk));
        ck_assert_int_eq(raw_track(sock, 2, "hard/x", &rep, &fd), WIRE_OK);
        rpage_map(&pg, fd, rep.track.slots);
        seals = fcntl(fd, F_GET_SEALS);
        ck_assert_int_ge(seals, 0);
        ck_assert_msg((seals & (F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) ==
                              (F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW),
                      "page seals 0x%x", seals);
        /* reopened read-write through /proc */
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        rw = open(path, O_RDWR | O_CLOEXEC);
        if (rw >= 0) {
                ck_assert_ptr_eq(mmap(NULL, pg.size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0),
                                 MAP_FAILED);
                ck_assert_int_eq(pwrite(rw, junk, sizeof(junk), 0), -1);
                ck_assert_int_eq(write(rw, junk, sizeof(junk)), -1);
                ck_assert_int_eq(ftruncate(rw, 0), -1);
                ck_assert_int_eq(ftruncate(rw, (off_t)pg.size * 4), -1);
                ck_assert_int_eq(fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                           (off_t)pg.size),
                                 -1);
                ck_assert_int_eq(fallocate(rw, 0, 0, (off_t)pg.size * 4), -1);
                src = make_memfd(4096, 0);
                ck_assert_int_eq(pwrite(src, junk, sizeof(junk), 0), (ssize_t)sizeof(junk));
                {
                        loff_t in = 0, out = 0;
                        ck_assert_int_le(copy_file_range(src, &in, rw, &out, sizeof(junk), 0), 0);
                }
                close(src);
                m = mmap(NULL, pg.size, PROT_READ, MAP_SHARED, rw, 0);
                ck_assert_ptr_ne(m, MAP_FAILED);
                ck_assert_int_eq(mprotect(m, pg.size, PROT_READ | PROT_WRITE), -1);
                ck_assert_int_ne(madvise(m, pg.size, MADV_REMOVE), 0);
                munmap(m, pg.size);
                ck_assert_int_eq(fcntl(rw, F_ADD_SEALS, F_SEAL_WRITE), -1);
                close(rw);
        }
        /* the read-only mapping, through /proc/self/mem (FOLL_FORCE) */
        mem = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
        if (mem >= 0) {
                ck_assert_int_eq(pwrite(mem, junk, sizeof(junk), (off_t)(uintptr_t)pg.pg), -1);
                close(mem);
        }
        ck_assert_int_ne(madvise((void *)pg.pg, pg.size, MADV_REMOVE), 0);
        /* MADV_DONTNEED drops only this mapping's view: the page is still the daemon's */
        madvise((void *)pg.pg, pg.size, MADV_DONTNEED);
        ck_assert_uint_eq(pg.pg->magic, VERPAGE_MAGIC);
        ck_assert_uint_eq(pg.pg->slots, pg.slots);
        ck_assert_uint_eq(page_closed(pg.pg), 0);
        publish_copy(p, "hard/x", NULL);
        ck_assert_uint_eq(slot_version(pg.pg, rep.track.slot), 1);
        rp_ping(sock, 3);
        rpage_unmap(&pg);
        close(sock);
        dlx_close(p);
}
END_TEST

/* P4 + README "Read-only is read-only" ("cannot change under any reader"; "one mapped
 * writable (by anybody) is refused read-only with -EBUSY"): a tracker publishes its own
 * version page, which dlxd maps writable and keeps writing, as a read-only tensor. */
START_TEST(raw_page_published_as_segment)
{
        int sock = rp_connect(fx.socket, "hostile"), fd = -1;
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "reader");
        struct wire_request req;
        struct wire_reply rep;
        struct rpage pg;
        DLManagedTensorVersioned *t = NULL;
        uint32_t slot;

        ck_assert_int_eq(raw_track(sock, 2, "seg/x", &rep, &fd), WIRE_OK);
        slot = rep.track.slot;
        rpage_map(&pg, fd, rep.track.slots);
        rp_publish_req(&req, 3, "seg/page", pg.size, 0, DLPACK_FLAG_BITMASK_READ_ONLY);
        rp_send(sock, &req, fd);
        ck_assert_int_eq(rp_read_answer(sock, &rep, REPLY_MS, NULL), 1);
        if (rep.status == WIRE_OK) {
                /* accepted read-only: a reader now holds memory the daemon keeps writing */
                const struct version_page *seen;
                uint64_t before, after;

                t = acquire_ok(q, "seg/page", NULL);
                ck_assert_int_eq(dlx_tensor_write_protected(t), 1);
                seen = t->dl_tensor.data;
                before = slot_version(seen, slot);
                publish_copy(p, "seg/x", NULL);
                after = slot_version(seen, slot);
                t->deleter(t);
                ck_assert_msg(before == after,
                              "a read-only version changed under its reader (%llu -> %llu): a "
                              "tracker published its own version page read-only and dlxd took it",
                              (unsigned long long)before, (unsigned long long)after);
        }
        /* README: a memfd dlxd cannot seal (F_SEAL_SEAL, as the page is) is -EBADF */
        ck_assert_msg(rep.status == WIRE_BAD_FD, "read-only publish of the page: status %d (%s)",
                      rep.status, rep.error);
        publish_copy(p, "seg/x", NULL);
        ck_assert_uint_eq(slot_version(pg.pg, slot), 1);
        rp_ping(sock, 5);
        rpage_unmap(&pg);
        close(sock);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* README "Read-only is read-only" ("one mapped writable (by anybody) is refused read-only with
 * -EBUSY"), the seal the version page relies on: a producer's memfd sealed
 * F_SEAL_FUTURE_WRITE while the producer still maps it writable is no read-only segment. Not
 * tracking's own promise, but the same hole as the test above, without a page. */
START_TEST(raw_future_write_memfd_not_read_only)
{
        int sock = rp_connect(fx.socket, "sly"), fd = sealed_memfd(4096);
        dlx_client *q = fx_connect(&fx, "reader");
        struct wire_request req;
        struct wire_reply rep;
        DLManagedTensorVersioned *t;
        volatile float *mine;

        mine = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ck_assert_ptr_ne((void *)mine, MAP_FAILED);
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
        rp_publish_req(&req, 2, "sly/x", 64, 0, DLPACK_FLAG_BITMASK_READ_ONLY);
        rp_send(sock, &req, fd);
        ck_assert_int_eq(rp_read_answer(sock, &rep, REPLY_MS, NULL), 1);
        if (rep.status == WIRE_OK) {
                float before, after;

                t = acquire_ok(q, "sly/x", NULL);
                before = ((const volatile float *)t->dl_tensor.data)[0];
                mine[0] = before + 1;
                after = ((const volatile float *)t->dl_tensor.data)[0];
                t->deleter(t);
                ck_assert_msg(before == after,
                              "a read-only version changed under its reader (%g -> %g)",
                              (double)before, (double)after);
        }
        ck_assert_msg(rep.status == WIRE_BUSY, "status %d (%s)", rep.status, rep.error);
        munmap((void *)mine, 4096);
        close(fd);
        close(sock);
        dlx_close(q);
}
END_TEST

/* P7 + verpage.h "When the session ends ... the daemon sets closed ... nothing here changes
 * any more": a bye ends the session at once; an ended session's page is frozen, and is
 * never handed to, or written for, another session. */
START_TEST(raw_ended_session_page_frozen)
{
        int a = rp_connect(fx.socket, "bye"), b = rp_connect(fx.socket, "gone"), c, fa, fb, fc;
        dlx_client *p = fx_connect(&fx, "producer");
        struct wire_request req = {.id = 3, .type = WIRE_REQ_BYE};
        struct wire_reply rep;
        struct rpage pa, pb, pc;
        uint8_t snap_a[256], snap_b[256];
        uint32_t sa, sb;

        publish_copy(p, "end/x", NULL);
        ck_assert_int_eq(raw_track(a, 2, "end/x", &rep, &fa), WIRE_OK);
        sa = rep.track.slot;
        rpage_map(&pa, fa, rep.track.slots);
        ck_assert_int_eq(raw_track(b, 2, "end/x", &rep, &fb), WIRE_OK);
        sb = rep.track.slot;
        rpage_map(&pb, fb, rep.track.slots);
        /* a says bye: answered only once its session has ended */
        rp_send(a, &req, -1);
        rp_expect_ok(a, 3, WIRE_REP_NONE, NULL, NULL);
        ck_assert_msg(page_closed(pa.pg) == 1, "bye answered, page not closed");
        ck_assert_int_eq(raw_track(a, 4, "end/y", &rep, NULL), WIRE_CLOSED);
        ck_assert_int_eq(raw_untrack(a, 5, sa), WIRE_CLOSED);
        /* b hangs up without a word */
        close(b);
        for (int i = 0; i < 2000 && page_closed(pb.pg) != 1; i++)
                fx_sleep_ms(1);
        ck_assert_uint_eq(page_closed(pb.pg), 1);
        memcpy(snap_a, pa.pg, sizeof(snap_a) < pa.size ? sizeof(snap_a) : pa.size);
        memcpy(snap_b, pb.pg, sizeof(snap_b) < pb.size ? sizeof(snap_b) : pb.size);
        /* a new session tracks the same name, and another; the name changes */
        c = rp_connect(fx.socket, "new");
        ck_assert_int_eq(raw_track(c, 2, "end/z", &rep, &fc), WIRE_OK);
        rpage_map(&pc, fc, rep.track.slots);
        ck_assert_int_eq(raw_track(c, 3, "end/x", &rep, NULL), WIRE_OK);
        for (int i = 0; i < 5; i++)
                publish_copy(p, "end/x", NULL);
        publish_copy(p, "end/z", NULL);
        ck_assert_uint_eq(slot_version(pc.pg, rep.track.slot), 6);
        ck_assert_msg(memcmp(snap_a, pa.pg, sizeof(snap_a) < pa.size ? sizeof(snap_a) : pa.size) ==
                              0,
                      "an ended session's page changed (bye)");
        ck_assert_msg(memcmp(snap_b, pb.pg, sizeof(snap_b) < pb.size ? sizeof(snap_b) : pb.size) ==
                              0,
                      "an ended session's page changed (hang-up)");
        {
                struct stat sta, stb, stc;
                ck_assert_int_eq(fstat(pa.fd, &sta), 0);
                ck_assert_int_eq(fstat(pb.fd, &stb), 0);
                ck_assert_int_eq(fstat(pc.fd, &stc), 0);
                ck_assert(stc.st_ino != sta.st_ino && stc.st_ino != stb.st_ino);
        }
        /* dlx.h: after the session, "*ret_version is the last version seen" */
        ck_assert_msg(slot_version(pa.pg, sa) == 1 && slot_version(pb.pg, sb) == 1,
                      "an ended session's page lost its last versions (after bye: %llu, after "
                      "hang-up: %llu; both were 1)",
                      (unsigned long long)slot_version(pa.pg, sa),
                      (unsigned long long)slot_version(pb.pg, sb));
        rpage_unmap(&pa);
        rpage_unmap(&pb);
        rpage_unmap(&pc);
        close(a);
        close(c);
        dlx_close(p);
}
END_TEST

/* P1/P4 + README "Flow control": a peer that stops reading is still a tracker: its page
 * follows every change while the daemon reads no more of its requests; dropped after
 * --timeout-ms, its page says the session ended; nobody else waits on it. */
START_TEST(raw_stalled_peer_page_current)
{
        static const char *const args[] = {"--timeout-ms", "500", "--max-queued", "64K", NULL};
        int sock, fd = -1;
        dlx_client *p, *q;
        struct wire_request req;
        struct wire_reply rep;
        struct rpage pg;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        uint32_t slot, tq;
        int64_t t0;

        dlxd_start(&fx, args);
        sock = rp_connect(fx.socket, "stalled");
        p = fx_connect(&fx, "producer");
        q = fx_connect(&fx, "lib");
        ck_assert_int_eq(raw_track(sock, 2, "stall/x", &rep, &fd), WIRE_OK);
        slot = rep.track.slot;
        rpage_map(&pg, fd, rep.track.slots);
        tq = track_ok(q, "stall/x");
        /* fill its output: stats replies it never reads */
        for (int i = 0; i < 4000; i++) {
                req = (struct wire_request){.id = 100 + (uint64_t)i, .type = WIRE_REQ_STATS};
                rp_frame_append(&buf, &len, &cap, &req);
        }
        ck_assert_int_ge(fcntl(sock, F_SETFL, O_NONBLOCK), 0);
        rp_send_until_stalled(sock, buf, len, 300);
        t0 = fx_now_ms();
        for (int v = 1; v <= 20; v++) {
                uint64_t got;
                publish_copy(p, "stall/x", &got);
                ck_assert_uint_eq(got, (uint64_t)v);
                ck_assert_uint_eq(slot_version(pg.pg, slot), (uint64_t)v);
                ck_assert_uint_eq(tracked_version(q, tq), (uint64_t)v);
        }
        ck_assert_int_lt(fx_now_ms() - t0, 5000);
        /* dropped for not reading: its session ends, and says so */
        for (int i = 0; i < 10000 && page_closed(pg.pg) != 1; i += 10)
                fx_sleep_ms(10);
        ck_assert_msg(page_closed(pg.pg) == 1, "a dropped peer's page is not marked closed");
        publish_copy(p, "stall/x", NULL);
        ck_assert_uint_eq(tracked_version(q, tq), 21);
        ck_assert_msg(slot_version(pg.pg, slot) == 20,
                      "a dropped session's page lost its last version: reads %llu, was 20",
                      (unsigned long long)slot_version(pg.pg, slot));
        free(buf);
        rpage_unmap(&pg);
        close(sock);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* P1: a raw producer pipelining 200 publishes: whenever it has read the answer of one, every
 * tracker already reads that version (or newer); after pipelined publish/unpublish pairs,
 * the answer of the last unpublish means 0 everywhere. */
START_TEST(raw_pipelined_publish_ordering)
{
        enum { N = 200 };
        int prod = rp_connect(fx.socket, "raw-producer"), tr = rp_connect(fx.socket, "raw-tr"),
            fd = -1;
        dlx_client *q = fx_connect(&fx, "lib"), *q2 = fx_connect(&fx, "lib2");
        struct wire_request req;
        struct wire_reply rep;
        struct rpage pg;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        uint64_t seg = rp_alloc(prod, 2, 4096, NULL);
        uint32_t t1, t2, slot;

        t1 = track_ok(q, "pipe/x");
        t2 = track_ok(q2, "pipe/x");
        ck_assert_int_eq(raw_track(tr, 2, "pipe/x", &rep, &fd), WIRE_OK);
        slot = rep.track.slot;
        rpage_map(&pg, fd, rep.track.slots);
        /* publishes alone: each answer means every tracker reads at least its version */
        for (int i = 0; i < N; i++) {
                rp_publish_req(&req, 100 + (uint64_t)i, "pipe/x", 64, seg,
                               DLPACK_FLAG_BITMASK_READ_ONLY);
                rp_frame_append(&buf, &len, &cap, &req);
        }
        ck_assert_int_eq(rp_send_raw(prod, buf, len, NULL, 0), 0);
        for (int i = 0; i < N; i++) {
                uint64_t want, v1, v2, v3;
                ck_assert_int_eq(rp_read_answer(prod, &rep, REPLY_MS, NULL), 1);
                ck_assert_uint_eq(rep.id, 100 + (uint64_t)i);
                ck_assert_msg(rep.status == WIRE_OK, "request %d: %d %s", i, rep.status, rep.error);
                want = rep.publish.version;
                ck_assert_uint_eq(want, (uint64_t)i + 1);
                v1 = tracked_version(q, t1);
                v2 = tracked_version(q2, t2);
                v3 = slot_version(pg.pg, slot);
                ck_assert_msg(v1 >= want && v2 >= want && v3 >= want,
                              "publish answered v%llu, trackers read %llu %llu %llu",
                              (unsigned long long)want, (unsigned long long)v1,
                              (unsigned long long)v2, (unsigned long long)v3);
        }
        /* publish, unpublish, ...: once the last unpublish is answered, every tracker reads 0 */
        len = 0;
        for (int i = 0; i < 40; i++) {
                if (i % 2) {
                        memset(&req, 0, sizeof(req));
                        req.id = 1000 + (uint64_t)i;
                        req.type = WIRE_REQ_UNPUBLISH;
                        snprintf(req.unpublish.name, sizeof(req.unpublish.name), "pipe/x");
                } else {
                        rp_publish_req(&req, 1000 + (uint64_t)i, "pipe/x", 64, seg,
                                       DLPACK_FLAG_BITMASK_READ_ONLY);
                }
                rp_frame_append(&buf, &len, &cap, &req);
        }
        ck_assert_int_eq(rp_send_raw(prod, buf, len, NULL, 0), 0);
        for (int i = 0; i < 40; i++) {
                ck_assert_int_eq(rp_read_answer(prod, &rep, REPLY_MS, NULL), 1);
                ck_assert_int_eq(rep.status, WIRE_OK);
        }
        ck_assert_uint_eq(tracked_version(q, t1), 0);
        ck_assert_uint_eq(tracked_version(q2, t2), 0);
        ck_assert_uint_eq(slot_version(pg.pg, slot), 0);
        free(buf);
        rpage_unmap(&pg);
        close(tr);
        close(prod);
        dlx_close(q2);
        dlx_close(q);
}
END_TEST

/* ---- versions -------------------------------------------------------------------------------- */

/* P1: a publisher in another process: when its dlx_publish() has returned, every tracker
 * here reads that version; likewise an unpublish reads 0. */
struct child_pub {
        const char *socket;
        int to_parent, from_parent;
};

static int child_publisher(void *arg)
{
        struct child_pub *a = arg;
        struct dlx_connect_options o = {.socket_path = a->socket, .client_name = "child-pub"};
        dlx_client *c;
        uint64_t v = 0;
        char ack;

        if (dlx_connect(&o, &c) != 0)
                return 2;
        for (int i = 0; i < 100; i++) {
                if (i % 7 == 6) {
                        if (dlx_unpublish(c, "any/x") != 0)
                                return 3;
                        v = 0;
                } else if (dlx_publish(c, "any/x", fx_plain_f32(4, 0, NULL), NULL, &v) != 0) {
                        return 4;
                }
                if (write(a->to_parent, &v, sizeof(v)) != sizeof(v) ||
                    read(a->from_parent, &ack, 1) != 1)
                        return 5;
        }
        dlx_close(c);
        return 0;
}

START_TEST(visible_after_publish_in_any_process)
{
        enum { NT = 8 };
        dlx_client *t[NT];
        uint32_t tr[NT];
        int up[2], down[2];
        struct child_pub a;
        pid_t pid;
        uint64_t v;

        for (int i = 0; i < NT; i++) {
                t[i] = fx_connect(&fx, "tracker");
                tr[i] = track_ok(t[i], "any/x");
        }
        ck_assert_int_eq(pipe2(up, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(down, O_CLOEXEC), 0);
        a = (struct child_pub){fx.socket, up[1], down[0]};
        pid = fx_spawn(child_publisher, &a);
        for (int i = 0; i < 100; i++) {
                ck_assert_int_eq(read(up[0], &v, sizeof(v)), (ssize_t)sizeof(v));
                for (int k = 0; k < NT; k++)
                        ck_assert_msg(tracked_version(t[k], tr[k]) == v,
                                      "step %d: the child's call returned %llu, tracker %d reads "
                                      "%llu",
                                      i, (unsigned long long)v, k,
                                      (unsigned long long)tracked_version(t[k], tr[k]));
                ck_assert_int_eq(write(down[1], "k", 1), 1);
        }
        ck_assert_int_eq(fx_wait(pid), 0);
        close(up[0]);
        close(up[1]);
        close(down[0]);
        close(down[1]);
        for (int i = 0; i < NT; i++)
                dlx_close(t[i]);
}
END_TEST

/* P1/P3 "Tracking says what exists ... acquire with min_version": a version a tracker reads
 * is there to acquire (the name is never unpublished here). */
struct churn {
        dlx_client *p;
        volatile int stop;
};

static void *churn_thread(void *arg)
{
        struct churn *c = arg;

        for (int i = 0; i < 300 && !c->stop; i++)
                if (dlx_publish(c->p, "acq/x", fx_plain_f32(4, 0, NULL), NULL, NULL) != 0)
                        return (void *)1;
        return NULL;
}

START_TEST(tracked_version_is_acquirable)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        struct churn c = {.p = p};
        pthread_t th;
        uint32_t t = track_ok(q, "acq/x");
        void *res;
        int checks = 0;

        publish_copy(p, "acq/x", NULL);
        ck_assert_int_eq(pthread_create(&th, NULL, churn_thread, &c), 0);
        for (int i = 0; i < 300; i++) {
                uint64_t v = tracked_version(q, t), got = 0;
                struct dlx_acquire_options o = {.min_version = v};
                DLManagedTensorVersioned *x = NULL;
                int err = dlx_acquire(q, "acq/x", &o, &x);

                ck_assert_msg(err == 0, "tracker read v%llu, acquire(min_version) failed: %s",
                              (unsigned long long)v, dlx_strerror(err));
                ck_assert_int_eq(dlx_tensor_info(x, NULL, &got, NULL), 0);
                ck_assert_uint_ge(got, v);
                x->deleter(x);
                checks++;
        }
        c.stop = 1;
        pthread_join(th, &res);
        ck_assert_ptr_null(res);
        ck_assert_int_eq(checks, 300);
        /* the leases are all given back: tracking held none */
        ck_assert_int_eq(fx_wait_leases(q, 0, 2000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P1 + dlx_close(): "its non-persistent tensors are unpublished before it returns (the daemon
 * confirms)", and the page is written before the daemon answers: read 0 at once. */
START_TEST(close_unpublishes_before_return)
{
        dlx_client *q = fx_connect(&fx, "tracker");
        uint32_t ta = track_ok(q, "close/a"), tb = track_ok(q, "close/b");

        for (int round = 0; round < 5; round++) {
                dlx_client *p = fx_connect(&fx, "producer");
                uint64_t va, vb;

                publish_ok(p, "close/a", fx_vec_f32(p, 16, 1), NULL, &va);
                publish_copy(p, "close/b", &vb);
                ck_assert_uint_eq(tracked_version(q, ta), va);
                dlx_close(p);
                ck_assert_msg(tracked_version(q, ta) == 0 && tracked_version(q, tb) == 0,
                              "round %d: dlx_close() returned, tracker still reads %llu/%llu",
                              round, (unsigned long long)tracked_version(q, ta),
                              (unsigned long long)tracked_version(q, tb));
        }
        dlx_close(q);
}
END_TEST

/* P2/P6 + README "Persistence": a producer killed outright: its non-persistent name reads 0
 * (a waiter wakes), its persistent one stays; publishing again keeps counting. */
static int child_publish_then_hang(void *arg)
{
        const char *socket = ((const char **)arg)[0];
        int ready = *(const int *)((void **)arg)[1];
        struct dlx_connect_options o = {.socket_path = socket, .client_name = "doomed"};
        struct dlx_publish_options keep = {.persist = true};
        dlx_client *c;

        if (dlx_connect(&o, &c) != 0)
                return 2;
        if (dlx_publish(c, "kill/x", fx_plain_f32(4, 0, NULL), NULL, NULL) != 0 ||
            dlx_publish(c, "kill/p", fx_plain_f32(4, 0, NULL), &keep, NULL) != 0)
                return 3;
        if (write(ready, "r", 1) != 1)
                return 4;
        for (;;)
                pause();
}

START_TEST(producer_killed_and_persistent)
{
        dlx_client *q = fx_connect(&fx, "tracker"), *p2;
        uint32_t tx = track_ok(q, "kill/x"), tp = track_ok(q, "kill/p");
        int pfd[2];
        const void *args[2];
        struct waiter w;
        pthread_t th;
        pid_t pid;
        char b;
        int64_t t0;
        uint64_t v;

        ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
        args[0] = fx.socket;
        args[1] = &pfd[1];
        pid = fx_spawn(child_publish_then_hang, args);
        ck_assert_int_eq(read(pfd[0], &b, 1), 1);
        ck_assert_uint_eq(tracked_version(q, tx), 1);
        ck_assert_uint_eq(tracked_version(q, tp), 1);
        w = (struct waiter){.c = q, .track = tx, .after = 1, .timeout_ms = 20000};
        start_waiter(&th, &w);
        fx_sleep_ms(50);
        t0 = fx_now_ms();
        kill(pid, SIGKILL);
        ck_assert_int_eq(fx_wait(pid), 128 + SIGKILL);
        pthread_join(th, NULL);
        ck_assert_int_eq(w.err, 0);
        ck_assert_uint_eq(w.seen, 0);
        ck_assert_int_lt(w.ended_ms - t0, 2000 * fx_slowdown());
        ck_assert_uint_eq(tracked_version(q, tp), 1);
        p2 = fx_connect(&fx, "producer2");
        publish_copy(p2, "kill/x", &v);
        ck_assert_uint_eq(v, 2);
        ck_assert_uint_eq(tracked_version(q, tx), 2);
        publish_copy(p2, "kill/p", &v);
        ck_assert_uint_eq(v, 2);
        ck_assert_uint_eq(tracked_version(q, tp), 2);
        DLXV(dlx_unpublish(p2, "kill/p"));
        ck_assert_uint_eq(tracked_version(q, tp), 0);
        close(pfd[0]);
        close(pfd[1]);
        dlx_close(p2);
        dlx_close(q);
}
END_TEST

/* P1/P2: a name replaced by a second producer stays current when the first one leaves: only
 * the first's (replaced) version dies with it; the tracker is not told 0. */
START_TEST(replaced_then_old_producer_leaves)
{
        dlx_client *q = fx_connect(&fx, "tracker"), *p1 = fx_connect(&fx, "p1"),
                   *p2 = fx_connect(&fx, "p2");
        uint32_t t = track_ok(q, "rep/x");
        uint64_t v;

        publish_copy(p1, "rep/x", NULL);
        publish_copy(p2, "rep/x", &v);
        ck_assert_uint_eq(v, 2);
        dlx_close(p1);
        ck_assert_uint_eq(tracked_version(q, t), 2);
        ck_assert_int_eq(dlx_track_wait(q, t, 2, 200, &v), -ETIMEDOUT);
        dlx_close(p2);
        ck_assert_uint_eq(tracked_version(q, t), 0);
        dlx_close(q);
}
END_TEST

/* P2 "a tracked name keeps counting versions across an unpublish": with its trackers coming
 * and going, as long as one tracks it; stat and acquire agree with the page. */
START_TEST(counting_survives_tracker_churn)
{
        dlx_client *p = fx_connect(&fx, "producer"), *a = fx_connect(&fx, "a"),
                   *b = fx_connect(&fx, "b");
        uint32_t ta = track_ok(a, "cnt/x"), tb = track_ok(b, "cnt/x");
        struct dlx_info info;
        struct dlx_acquire_options o = {.min_version = 4};
        DLManagedTensorVersioned *x;
        uint64_t v;

        for (int i = 0; i < 3; i++)
                publish_copy(p, "cnt/x", NULL);
        DLXV(dlx_unpublish(p, "cnt/x"));
        ck_assert_uint_eq(tracked_version(a, ta), 0);
        DLXV(dlx_untrack(a, ta));
        dlx_close(a);
        publish_copy(p, "cnt/x", &v);
        ck_assert_uint_eq(v, 4);
        ck_assert_uint_eq(tracked_version(b, tb), 4);
        DLXV(dlx_stat(b, "cnt/x", &info));
        ck_assert_uint_eq(info.version, 4);
        x = acquire_ok(b, "cnt/x", &o);
        x->deleter(x);
        /* the producer leaves (name gone), a new one publishes: still counting */
        dlx_close(p);
        ck_assert_uint_eq(tracked_version(b, tb), 0);
        p = fx_connect(&fx, "producer2");
        publish_copy(p, "cnt/x", &v);
        ck_assert_uint_eq(v, 5);
        ck_assert_uint_eq(tracked_version(b, tb), 5);
        dlx_close(b);
        dlx_close(p);
}
END_TEST

/* P6/P2: changes that fail change nothing: a failed unpublish of a tracked, unpublished name
 * (-ENOENT), a publish over the byte limit (-ENOSPC): no version, no wake, no gap. */
START_TEST(failed_changes_do_not_bump)
{
        static const char *const args[] = {"--max-bytes", "64K", NULL};
        dlx_client *p, *q;
        struct waiter w;
        pthread_t th;
        uint32_t t;
        uint64_t v;

        dlxd_start(&fx, args);
        p = fx_connect(&fx, "producer");
        q = fx_connect(&fx, "tracker");
        t = track_ok(q, "fail/x");
        ck_assert_int_eq(dlx_unpublish(p, "fail/x"), -ENOENT);
        publish_copy(p, "fail/x", &v);
        ck_assert_uint_eq(v, 1);
        DLXV(dlx_unpublish(p, "fail/x"));
        ck_assert_int_eq(dlx_unpublish(p, "fail/x"), -ENOENT);
        ck_assert_int_eq(dlx_unpublish(q, "fail/x"), -ENOENT);
        publish_copy(p, "fail/x", &v);
        ck_assert_uint_eq(v, 2);
        w = (struct waiter){.c = q, .track = t, .after = 2, .timeout_ms = 600};
        start_waiter(&th, &w);
        ck_assert_int_eq(dlx_publish(p, "fail/x", fx_plain_f32(1 << 20, 0, NULL), NULL, NULL),
                         -ENOSPC);
        pthread_join(th, NULL);
        ck_assert_msg(w.err == -ETIMEDOUT, "a failed publish woke the waiter: %s, v%llu",
                      dlx_strerror(w.err), (unsigned long long)w.seen);
        ck_assert_uint_eq(tracked_version(q, t), 2);
        publish_copy(p, "fail/x", &v);
        ck_assert_uint_eq(v, 3);
        ck_assert_uint_eq(tracked_version(q, t), 3);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* P2/P3 "Tracking says what exists, not what you hold": a version unpublished (or replaced)
 * under a reader's lease is not what the tracker reads. */
START_TEST(leased_but_gone_reads_current)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "lease/x");
        DLManagedTensorVersioned *x;

        publish_copy(p, "lease/x", NULL);
        x = acquire_ok(q, "lease/x", NULL);
        publish_copy(p, "lease/x", NULL);
        ck_assert_uint_eq(tracked_version(q, t), 2);
        DLXV(dlx_unpublish(p, "lease/x"));
        ck_assert_uint_eq(tracked_version(q, t), 0);
        x->deleter(x);
        ck_assert_int_eq(fx_wait_leases(q, 0, 2000), 0);
        ck_assert_uint_eq(tracked_version(q, t), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- leases, names and memory ---------------------------------------------------------------- */

/* P3 "leases stay exact": tracking takes no lease, and keeps no version, segment, byte or
 * descriptor alive; a zero-copy version's deleter runs when it is gone, tracked or not. */
START_TEST(tracking_holds_no_lease_or_memory)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        struct dlx_stats base = fx_stats(q), s;
        int deleted = 0;
        uint32_t t;

        publish_copy(p, "mem/a", NULL);
        s = fx_stats(q);
        ck_assert_uint_eq(s.versions, base.versions + 1);
        for (int i = 0; i < 100; i++)
                ck_assert_uint_eq(track_ok(q, "mem/a") != 0, 1);
        t = track_ok(q, "mem/a");
        for (int i = 0; i < 50; i++) {
                char name[32];
                snprintf(name, sizeof(name), "mem/other/%d", i);
                track_ok(q, name);
        }
        s = fx_stats(q);
        ck_assert_uint_eq(s.leases, 0);
        ck_assert_uint_eq(s.names, base.names + 1);
        ck_assert_uint_eq(s.uid_names, base.uid_names + 1);
        ck_assert_uint_eq(s.versions, base.versions + 1);
        DLXV(dlx_unpublish(p, "mem/a"));
        ck_assert_uint_eq(tracked_version(q, t), 0);
        s = fx_stats(q);
        ck_assert_uint_eq(s.names, base.names);
        ck_assert_uint_eq(s.uid_names, base.uid_names);
        ck_assert_uint_eq(s.versions, base.versions);
        ck_assert_uint_eq(s.segments, base.segments);
        ck_assert_uint_eq(s.bytes, base.bytes);
        ck_assert_uint_eq(s.fds, base.fds);
        ck_assert_uint_eq(s.leases, 0);

        /* zero-copy: replaced and unpublished versions reach the producer's deleter */
        publish_ok(p, "mem/z", fx_counted(fx_vec_f32(p, 16, 1), &deleted), NULL, NULL);
        t = track_ok(q, "mem/z");
        publish_ok(p, "mem/z", fx_counted(fx_vec_f32(p, 16, 2), &deleted), NULL, NULL);
        for (int i = 0; i < 2000 && __atomic_load_n(&deleted, __ATOMIC_ACQUIRE) < 1; i++) {
                dlx_process_events(p);
                fx_sleep_ms(1);
        }
        ck_assert_int_eq(deleted, 1);
        DLXV(dlx_unpublish(p, "mem/z"));
        for (int i = 0; i < 2000 && __atomic_load_n(&deleted, __ATOMIC_ACQUIRE) < 2; i++) {
                dlx_process_events(p);
                fx_sleep_ms(1);
        }
        ck_assert_int_eq(deleted, 2);
        ck_assert_uint_eq(tracked_version(q, t), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

static int count_entry(void *ctx, const struct dlx_info *info)
{
        (void)ctx;
        (void)info;
        return 0;
}

/* P3: names only tracked (or tracked and unpublished) are not names: not listed, not stat'ed,
 * not acquired, not counted, no watch event. */
START_TEST(tracked_names_not_listed_or_watched)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker"),
                   *w = fx_connect(&fx, "watcher");
        DLManagedTensorVersioned *x = NULL;
        struct dlx_info info;
        struct dlx_event ev;
        struct dlx_stats s;
        char name[32];

        DLXV(dlx_watch(w, "tl/", NULL));
        for (int i = 0; i < 20; i++) {
                snprintf(name, sizeof(name), "tl/%d", i);
                track_ok(q, name);
        }
        track_ok(q, "tl/pub");
        publish_copy(p, "tl/pub", NULL);
        DLXV(dlx_unpublish(p, "tl/pub"));
        DLXV(dlx_next_event(w, &ev, 2000));
        ck_assert_int_eq(ev.kind, DLX_EVENT_PUBLISHED);
        ck_assert_str_eq(ev.name, "tl/pub");
        DLXV(dlx_next_event(w, &ev, 2000));
        ck_assert_int_eq(ev.kind, DLX_EVENT_UNPUBLISHED);
        ck_assert_int_eq(dlx_next_event(w, &ev, 200), -ETIMEDOUT);
        ck_assert_int_eq(dlx_list(q, "tl/", count_entry, NULL), 0);
        ck_assert_int_eq(dlx_list(q, "", count_entry, NULL), 0);
        ck_assert_int_eq(dlx_stat(q, "tl/3", &info), -ENOENT);
        ck_assert_int_eq(dlx_stat(q, "tl/pub", &info), -ENOENT);
        ck_assert_int_eq(dlx_acquire(q, "tl/pub", NULL, &x), -ENOENT);
        ck_assert_int_eq(dlx_acquire(q, "tl/3", NULL, &x), -ENOENT);
        s = fx_stats(q);
        ck_assert_uint_eq(s.names, 0);
        ck_assert_uint_eq(s.uid_names, 0);
        ck_assert_uint_eq(s.versions, 0);
        dlx_close(w);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P3 + README "Limits" (--max-names bounds published names): a uid's tracks, published or
 * not, count against no name limit, its own or the daemon's. */
START_TEST(tracked_names_not_charged)
{
        static const char *const args[] = {"--max-names-per-uid", "3", "--max-names", "4", NULL};
        dlx_client *p, *q;
        char name[32];

        dlxd_start(&fx, args);
        p = fx_connect(&fx, "producer");
        q = fx_connect(&fx, "tracker");
        for (int i = 0; i < 200; i++) {
                snprintf(name, sizeof(name), "ch/t/%d", i);
                track_ok(q, name);
        }
        for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof(name), "ch/p/%d", i);
                track_ok(q, name);
                publish_copy(p, name, NULL);
        }
        ck_assert_int_eq(dlx_publish(p, "ch/p/3", fx_plain_f32(4, 0, NULL), NULL, NULL), -EAGAIN);
        for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof(name), "ch/p/%d", i);
                DLXV(dlx_unpublish(p, name));
        }
        /* tracked, unpublished names still counting their versions are no names */
        for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof(name), "ch/q/%d", i);
                publish_copy(p, name, NULL);
        }
        ck_assert_uint_eq(fx_stats(p).uid_names, 3);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* P3/P4 + README "Access" (a name belongs to the uid that published it): tracking gives no
 * uid any hold on a name: another uid's track does not own it, an unpublished tracked name
 * may be published by anyone, and a publish refused for ownership changes no page. */
struct uid_tracker {
        const char *name;
        int ready;
};

static int tracker_as_other(void *arg)
{
        struct uid_tracker *a = arg;
        dlx_client *c = connect_as(OTHER_UID);
        uint32_t t;
        uint64_t v = 0;

        if (!c)
                return 90;
        if (dlx_track(c, a->name, &t) != 0)
                return 91;
        if (write(a->ready, "r", 1) != 1)
                return 92;
        if (dlx_track_wait(c, t, 0, 10000, &v) != 0)
                return 93;
        dlx_close(c);
        return v == 1 ? 0 : 94;
}

static int publish_as_nobody(void *arg)
{
        dlx_client *c = connect_as(NOBODY);
        struct dlx_publish_options keep = {.persist = true};
        uint64_t v = 0;
        int err;

        if (!c)
                return 90;
        err = dlx_publish(c, arg, fx_plain_f32(4, 0, NULL), &keep, &v);
        dlx_close(c);
        if (err == -EACCES)
                return 50;
        if (err)
                return 40;
        return (int)v;
}

START_TEST(other_uid_tracking_does_not_own)
{
        static const char *const args[] = {"--group", "65534", NULL};
        struct uid_tracker a = {.name = "own/x"};
        dlx_client *p, *q;
        struct waiter w;
        pthread_t th;
        int pfd[2];
        pid_t tracker;
        uint32_t t;
        char b;

        if (geteuid() != 0)
                return;
        dlxd_start(&fx, args);
        open_to_others();
        p = fx_connect(&fx, "root-producer");
        q = fx_connect(&fx, "root-tracker");
        /* uid 65533 tracks a name first; uid 65534 publishes it */
        ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
        a.ready = pfd[1];
        tracker = fx_spawn(tracker_as_other, &a);
        ck_assert_int_eq(read(pfd[0], &b, 1), 1);
        ck_assert_int_eq(fx_wait(fx_spawn(publish_as_nobody, (void *)"own/x")), 1);
        ck_assert_int_eq(fx_wait(tracker), 0);
        close(pfd[0]);
        close(pfd[1]);
        /* root publishes and unpublishes a name it tracks; nobody may publish it after */
        t = track_ok(q, "own/y");
        publish_copy(p, "own/y", NULL);
        DLXV(dlx_unpublish(p, "own/y"));
        ck_assert_int_eq(fx_wait(fx_spawn(publish_as_nobody, (void *)"own/y")), 2);
        ck_assert_uint_eq(tracked_version(q, t), 2);
        /* refused for ownership: no change, no wake */
        t = track_ok(q, "own/z");
        publish_copy(p, "own/z", NULL);
        w = (struct waiter){.c = q, .track = t, .after = 1, .timeout_ms = 500};
        start_waiter(&th, &w);
        ck_assert_int_eq(fx_wait(fx_spawn(publish_as_nobody, (void *)"own/z")), 50);
        pthread_join(th, NULL);
        ck_assert_int_eq(w.err, -ETIMEDOUT);
        publish_copy(p, "own/z", NULL);
        ck_assert_uint_eq(tracked_version(q, t), 2);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* ---- waits ------------------------------------------------------------------------------------
 */

/* P6 "up to timeout_ms (0: no wait, < 0: no limit)": at the edges of the range. */
START_TEST(wait_timeout_edges)
{
        static const int64_t forever[] = {-1,
                                          -1000,
                                          INT64_MIN,
                                          INT64_MAX,
                                          INT64_MAX / 2,
                                          (int64_t)1 << 53,
                                          100000000000000LL};
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "edge/x");
        uint64_t v = 99;
        int64_t t0;

        ck_assert_int_eq(dlx_track_wait(q, t, 0, 0, &v), -EAGAIN);
        ck_assert_uint_eq(v, 99);
        ck_assert_int_eq(dlx_track_wait(q, t, 0, 0, NULL), -EAGAIN);
        t0 = fx_now_ms();
        ck_assert_int_eq(dlx_track_wait(q, t, 0, 1, &v), -ETIMEDOUT);
        ck_assert_int_lt(fx_now_ms() - t0, 1000 * fx_slowdown());
        ck_assert_int_eq(dlx_track_wait(q, t, 0, 1, NULL), -ETIMEDOUT);
        for (size_t i = 0; i < N_ELEMS(forever); i++) {
                struct waiter w = {.c = q, .track = t, .after = i, .timeout_ms = forever[i]};
                pthread_t th;
                uint64_t pv;

                start_waiter(&th, &w);
                fx_sleep_ms(100);
                ck_assert_msg(w.err == 1, "timeout %lld: the wait ended early: %s",
                              (long long)forever[i], dlx_strerror(w.err));
                publish_copy(p, "edge/x", &pv);
                pthread_join(th, NULL);
                ck_assert_msg(w.err == 0, "timeout %lld: %s", (long long)forever[i],
                              dlx_strerror(w.err));
                ck_assert_uint_eq(w.seen, pv);
        }
        /* a version other than the current one: news at once, whatever the timeout */
        ck_assert_int_eq(dlx_track_wait(q, t, 12345, 0, &v), 0);
        ck_assert_uint_eq(v, N_ELEMS(forever));
        ck_assert_int_eq(dlx_track_wait(q, t, 0, 1, NULL), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P6 "the daemon wakes it": every kind of change wakes a waiter at once, not at the next
 * once-a-second look (each measured several times, bound generous). */
static int64_t wake_latency(dlx_client *q, uint32_t t, uint64_t after, dlx_client *p,
                            const char *name, int what, int *ret_err, uint64_t *ret_seen)
{
        struct waiter w = {.c = q, .track = t, .after = after, .timeout_ms = 20000};
        pthread_t th;
        int64_t t0;

        start_waiter(&th, &w);
        fx_sleep_ms(30);
        t0 = fx_now_ms();
        if (what == 0)
                publish_copy(p, name, NULL);
        else if (what == 1)
                DLXV(dlx_unpublish(p, name));
        else
                DLXV(dlx_untrack(q, t));
        pthread_join(th, NULL);
        *ret_err = w.err;
        *ret_seen = w.seen;
        return w.ended_ms - t0;
}

START_TEST(wait_wakes_promptly)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "prompt/x");
        int64_t bound = 400 * fx_slowdown(), lat;
        uint64_t seen, v = 0;
        int err;

        for (int i = 0; i < 5; i++) {
                lat = wake_latency(q, t, v, p, "prompt/x", 0, &err, &seen);
                ck_assert_int_eq(err, 0);
                ck_assert_uint_eq(seen, v + 1);
                v = seen;
                ck_assert_msg(lat < bound, "publish %d woke the waiter after %lld ms", i,
                              (long long)lat);
        }
        for (int i = 0; i < 3; i++) {
                lat = wake_latency(q, t, v, p, "prompt/x", 1, &err, &seen);
                ck_assert_int_eq(err, 0);
                ck_assert_uint_eq(seen, 0);
                ck_assert_msg(lat < bound, "unpublish woke the waiter after %lld ms",
                              (long long)lat);
                publish_copy(p, "prompt/x", &v);
        }
        for (int i = 0; i < 3; i++) {
                dlx_client *pp = fx_connect(&fx, "leaver");
                struct waiter w = {.c = q, .track = t, .timeout_ms = 20000};
                pthread_t th;
                int64_t t0;

                publish_copy(pp, "prompt/x", &v);
                w.after = v;
                start_waiter(&th, &w);
                fx_sleep_ms(30);
                t0 = fx_now_ms();
                dlx_close(pp);
                pthread_join(th, NULL);
                ck_assert_int_eq(w.err, 0);
                ck_assert_uint_eq(w.seen, 0);
                ck_assert_msg(w.ended_ms - t0 < bound, "a producer's close woke after %lld ms",
                              (long long)(w.ended_ms - t0));
        }
        for (int i = 0; i < 3; i++) {
                uint32_t tt = track_ok(q, "prompt/u");
                lat = wake_latency(q, tt, 0, p, "prompt/u", 2, &err, &seen);
                ck_assert_msg(err == -EINVAL, "untracked under a wait: %s", dlx_strerror(err));
                ck_assert_msg(lat < bound, "an untrack woke the waiter after %lld ms",
                              (long long)lat);
        }
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P6 "Any number of threads may wait on one track": 24 threads over 6 tracks of one client,
 * and 8 threads of another client on the same names. */
START_TEST(many_threads_many_tracks)
{
        enum { NN = 6, PER = 4, NW = NN * PER, NO = 8 };
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker"),
                   *o = fx_connect(&fx, "other");
        struct waiter w[NW + NO];
        pthread_t th[NW + NO];
        uint32_t t[NN], to[NN];
        char name[32];

        for (int i = 0; i < NN; i++) {
                snprintf(name, sizeof(name), "mt/%d", i);
                t[i] = track_ok(q, name);
                to[i] = track_ok(o, name);
        }
        for (int i = 0; i < NW; i++) {
                w[i] = (struct waiter){.c = q, .track = t[i % NN], .timeout_ms = 30000};
                start_waiter(&th[i], &w[i]);
        }
        for (int i = 0; i < NO; i++) {
                w[NW + i] = (struct waiter){.c = o, .track = to[i % NN], .timeout_ms = 30000};
                start_waiter(&th[NW + i], &w[NW + i]);
        }
        fx_sleep_ms(100);
        for (int i = 0; i < NN; i++) {
                snprintf(name, sizeof(name), "mt/%d", i);
                for (int k = 0; k <= i; k++)
                        publish_copy(p, name, NULL);
        }
        for (int i = 0; i < NW + NO; i++) {
                pthread_join(th[i], NULL);
                ck_assert_msg(w[i].err == 0, "waiter %d: %s", i, dlx_strerror(w[i].err));
                ck_assert_uint_ge(w[i].seen, 1);
                ck_assert_uint_le(w[i].seen, (uint64_t)(i % NN) + 1);
        }
        dlx_close(o);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P6 "-EINVAL ... untracked while waited on": a waiter whose track is untracked and whose slot
 * goes at once to another name must not report that name's version as its own. */
START_TEST(untrack_under_wait_no_aba)
{
        /* one slot: an untracked slot is the next track's, whatever the daemon's order */
        static const char *const args[] = {"--max-watches", "1", NULL};
        dlx_client *p, *q;
        char name[32];
        const int ROUNDS = fx_slowdown() > 1 ? 40 : 200; /* under valgrind, fewer */
        int wrong = 0, reused = 0;
        uint64_t wrong_seen = 0;

        dlxd_start(&fx, args);
        p = fx_connect(&fx, "producer");
        q = fx_connect(&fx, "tracker");
        for (int i = 0; i < ROUNDS; i++) {
                uint32_t ta, tb;
                struct waiter w;
                pthread_t th;

                snprintf(name, sizeof(name), "aba/a%d", i);
                ta = track_ok(q, name);
                w = (struct waiter){.c = q, .track = ta, .after = 0, .timeout_ms = 3000};
                start_waiter(&th, &w);
                /* asleep in the wait before the untrack: else it would wait on b's track */
                ck_assert(waiter_asleep(&w));
                fx_sleep_ms(i % 4);
                DLXV(dlx_untrack(q, ta));
                snprintf(name, sizeof(name), "aba/b%d", i);
                tb = track_ok(q, name);
                publish_copy(p, name, NULL);
                pthread_join(th, NULL);
                reused += tb == ta;
                if (w.err == 0) {
                        wrong++;
                        wrong_seen = w.seen;
                } else
                        ck_assert_msg(w.err == -EINVAL, "round %d: %s", i, dlx_strerror(w.err));
                DLXV(dlx_untrack(q, tb));
        }
        ck_assert_int_eq(reused, ROUNDS);
        ck_assert_msg(wrong == 0,
                      "%d of %d waits on an untracked track returned 0 (v%llu: the version of the "
                      "name tracked after it in the same slot)",
                      wrong, ROUNDS, (unsigned long long)wrong_seen);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* P6/P7 dlx_close(): "calls still running in other threads fail with -ECONNRESET": waits on
 * tracks included, at once. */
START_TEST(close_under_wait)
{
        enum { N = 4 };
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "cw/x"), tp = track_ok(q, "cw/published");
        struct waiter w[N];
        pthread_t th[N];
        int64_t t0;

        publish_copy(p, "cw/published", NULL);
        for (int i = 0; i < N; i++) {
                /* half on a name with no version, half on a published one (v1) */
                w[i] = (struct waiter){.c = q,
                                       .track = i % 2 ? tp : t,
                                       .after = i % 2 ? 1 : 0,
                                       .timeout_ms = i < 2 ? -1 : 30000};
                start_waiter(&th[i], &w[i]);
        }
        fx_sleep_ms(100);
        t0 = fx_now_ms();
        dlx_close(q);
        for (int i = 0; i < N; i++) {
                pthread_join(th[i], NULL);
                ck_assert_msg(w[i].err == -ECONNRESET,
                              "waiter %d (on %s): %s, v%llu: the close reads as %s", i,
                              i % 2 ? "a published name" : "a name with no version",
                              w[i].err ? dlx_strerror(w[i].err) : "success",
                              (unsigned long long)w[i].seen,
                              w[i].err == 0 && w[i].seen == 0 ? "an unpublish" : "?");
                ck_assert_int_lt(w[i].ended_ms - t0, 2000 * fx_slowdown());
        }
        dlx_close(p);
}
END_TEST

/* P6 "-ECONNRESET the session ended, or the daemon is gone", with P2 (0 means unpublished):
 * a daemon that stops ends waits with -ECONNRESET, not with a made-up unpublish (0). */
START_TEST(daemon_stop_is_not_an_unpublish)
{
        dlx_client *p, *q;
        struct waiter w;
        pthread_t th;
        uint32_t t;
        int status;

        dlxd_start(&fx, NULL);
        p = fx_connect(&fx, "producer");
        q = fx_connect(&fx, "tracker");
        t = track_ok(q, "ds/x");
        publish_copy(p, "ds/x", NULL);
        w = (struct waiter){.c = q, .track = t, .after = 1, .timeout_ms = 30000};
        start_waiter(&th, &w);
        fx_sleep_ms(100);
        kill(fx.pid, SIGTERM);
        pthread_join(th, NULL);
        ck_assert_int_eq(waitpid(fx.pid, &status, 0), fx.pid);
        fx.pid = 0;
        ck_assert_msg(w.err == -ECONNRESET, "a wait across dlxd's stop: %s, v%llu",
                      w.err ? dlx_strerror(w.err) : "success", (unsigned long long)w.seen);
        dlx_close(q);
        dlx_close(p);
        dlxd_restart(&fx, NULL);
        dlxd_stop(&fx);
}
END_TEST

/* P5 "the same name twice is one track, each dlx_track() needing its dlx_untrack()", from
 * threads at once: no thread ever loses its own track, and at the end the name holds no
 * slot (--max-watches 2 leaves room for two other names). */
struct churner {
        dlx_client *q;
        int iters;
        int bad;
        char msg[512];
};

static void *track_churn(void *arg)
{
        struct churner *c = arg;

        for (int i = 0; i < c->iters && !c->bad; i++) {
                uint32_t t = 0;
                uint64_t v = 0;
                int err = dlx_track(c->q, "same/x", &t);

                if (err) {
                        c->bad = 1;
                        snprintf(c->msg, sizeof(c->msg), "iter %d: track: %s (%s)", i,
                                 dlx_strerror(err), dlx_last_error());
                        break;
                }
                err = dlx_track_version(c->q, t, &v);
                if (err || v != 7) {
                        c->bad = 1;
                        snprintf(c->msg, sizeof(c->msg),
                                 "iter %d: version of own track %u: %s v%llu", i, t,
                                 dlx_strerror(err), (unsigned long long)v);
                        break;
                }
                err = dlx_untrack(c->q, t);
                if (err) {
                        c->bad = 1;
                        snprintf(c->msg, sizeof(c->msg), "iter %d: untrack: %s (%s)", i,
                                 dlx_strerror(err), dlx_last_error());
                }
        }
        return NULL;
}

START_TEST(threads_track_untrack_same_name)
{
        static const char *const args[] = {"--max-watches", "2", NULL};
        enum { NT = 4 };
        struct churner c[NT];
        pthread_t th[NT];
        dlx_client *p, *q;
        uint32_t a, b, extra = 0;
        uint64_t v;

        dlxd_start(&fx, args);
        p = fx_connect(&fx, "producer");
        q = fx_connect(&fx, "tracker");
        for (int i = 0; i < 7; i++)
                publish_copy(p, "same/x", NULL);
        /* the page is in place first (concurrent first tracks: concurrent_first_tracks) */
        DLXV(dlx_untrack(q, track_ok(q, "same/x")));
        for (int i = 0; i < NT; i++) {
                c[i] = (struct churner){.q = q, .iters = fx_slowdown() > 1 ? 300 : 1500};
                ck_assert_int_eq(pthread_create(&th[i], NULL, track_churn, &c[i]), 0);
        }
        for (int i = 0; i < NT; i++) {
                pthread_join(th[i], NULL);
                ck_assert_msg(!c[i].bad, "thread %d: %s", i, c[i].msg);
        }
        a = track_ok(q, "same/a");
        b = track_ok(q, "same/b");
        ck_assert_int_eq(dlx_track(q, "same/c", &extra), -EAGAIN);
        ck_assert_int_eq(dlx_track_version(q, a, &v), 0);
        ck_assert_int_eq(dlx_track_version(q, b, &v), 0);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* P5/P6 "each dlx_track() needing its dlx_untrack()": a track taken twice and untracked once
 * is still a track: a wait on it goes on, and wakes for the next version. */
START_TEST(partial_untrack_keeps_waiting)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "pu/x");
        struct waiter w = {.c = q, .track = t, .after = 0, .timeout_ms = 10000};
        pthread_t th;

        ck_assert_uint_eq(track_ok(q, "pu/x"), t);
        start_waiter(&th, &w);
        fx_sleep_ms(50);
        DLXV(dlx_untrack(q, t));
        fx_sleep_ms(50);
        ck_assert_msg(w.err == 1, "the wait ended on a partial untrack: %s", dlx_strerror(w.err));
        publish_copy(p, "pu/x", NULL);
        pthread_join(th, NULL);
        ck_assert_int_eq(w.err, 0);
        ck_assert_uint_eq(w.seen, 1);
        DLXV(dlx_untrack(q, t));
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P1: a client tracking what it publishes itself reads each version as its publish returns. */
START_TEST(own_publish_visible)
{
        dlx_client *q = fx_connect(&fx, "both");
        uint32_t t = track_ok(q, "self/x");
        uint64_t v;

        for (int i = 0; i < 20; i++) {
                publish_ok(q, "self/x", fx_vec_f32(q, 8, (float)i), NULL, &v);
                ck_assert_uint_eq(tracked_version(q, t), v);
        }
        DLXV(dlx_unpublish(q, "self/x"));
        ck_assert_uint_eq(tracked_version(q, t), 0);
        dlx_close(q);
}
END_TEST

/* ---- the daemon stopped, killed, restarted
 * ------------------------------------------------------- */

/* P6 + README "No call waits forever": a daemon stopped (SIGSTOP) is still there: a wait
 * runs its whole timeout (not shorter, not ended by the client's own timeout), reads need
 * no daemon, and once it resumes the client is as it was. */
START_TEST(daemon_stopped_wait)
{
        struct dlx_connect_options o = {.client_name = "tracker", .timeout_ms = 300};
        dlx_client *p, *q;
        struct waiter w;
        pthread_t th;
        uint32_t t;
        int64_t t0;
        uint64_t v;

        dlxd_start(&fx, NULL);
        o.socket_path = fx.socket;
        p = fx_connect(&fx, "producer");
        DLXV(dlx_connect(&o, &q));
        t = track_ok(q, "stop/x");
        publish_copy(p, "stop/x", NULL);
        fx_stop_daemon(&fx);
        for (int i = 0; i < 1000; i++)
                ck_assert_uint_eq(tracked_version(q, t), 1);
        t0 = fx_now_ms();
        ck_assert_int_eq(dlx_track_wait(q, t, 1, 1500, &v), -ETIMEDOUT);
        ck_assert_int_ge(fx_now_ms() - t0, 1500);
        ck_assert_int_lt(fx_now_ms() - t0, 4000 * fx_slowdown());
        /* a waiter across the resume wakes for the next publish */
        w = (struct waiter){.c = q, .track = t, .after = 1, .timeout_ms = 20000};
        start_waiter(&th, &w);
        fx_sleep_ms(1200);
        kill(fx.pid, SIGCONT);
        publish_copy(p, "stop/x", NULL);
        pthread_join(th, NULL);
        ck_assert_msg(w.err == 0, "wait across SIGSTOP/SIGCONT: %s", dlx_strerror(w.err));
        ck_assert_uint_eq(w.seen, 2);
        ck_assert_msg(dlx_ping(q) == 0, "the tracker is unusable after its waits: %s",
                      dlx_last_error());
        DLXV(dlx_untrack(q, t));
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* P6/P7 dlx_track_version(): "-ECONNRESET the session has ended (closed, or dlxd stopped):
 * *ret_version is the last version seen". Row 0: stopped with SIGTERM; row 1: killed
 * outright, once the client has learned of it (a failed ping); then a restarted daemon
 * gives a fresh page. */
START_TEST(daemon_gone_last_version)
{
        {
                int how = _i;
                dlx_client *p, *q;
                uint32_t t;
                uint64_t v = 0;
                int status;

                dlxd_start(&fx, NULL);
                p = fx_connect(&fx, "producer");
                q = fx_connect(&fx, "tracker");
                t = track_ok(q, "gone/x");
                for (int i = 0; i < 3; i++)
                        publish_copy(p, "gone/x", NULL);
                if (how == 1) {
                        /* killed: a waiter notices within its slice (about a second) */
                        struct waiter w = {.c = q, .track = t, .after = 3, .timeout_ms = 30000};
                        pthread_t th;
                        int64_t t0;

                        start_waiter(&th, &w);
                        ck_assert(waiter_asleep(&w));
                        t0 = fx_now_ms();
                        kill(fx.pid, SIGKILL);
                        pthread_join(th, NULL);
                        ck_assert_int_eq(w.err, -ECONNRESET);
                        ck_assert_msg(w.ended_ms - t0 < 3000 * fx_slowdown(),
                                      "a waiter saw the daemon die after %lld ms",
                                      (long long)(w.ended_ms - t0));
                } else {
                        kill(fx.pid, SIGTERM);
                }
                ck_assert_int_eq(waitpid(fx.pid, &status, 0), fx.pid);
                fx.pid = 0;
                if (how == 1) /* the client learns: its next call fails */
                        ck_assert_int_eq(dlx_ping(q), -ECONNRESET);
                ck_assert_msg(dlx_track_version(q, t, &v) == -ECONNRESET,
                              "%s: dlx_track_version after the daemon went: %s",
                              how ? "SIGKILL" : "SIGTERM",
                              dlx_strerror(dlx_track_version(q, t, &v)));
                ck_assert_msg(v == 3, "%s: -ECONNRESET with v%llu, the last version seen was 3",
                              how ? "SIGKILL" : "SIGTERM", (unsigned long long)v);
                ck_assert_int_eq(dlx_track_wait(q, t, 3, 5000, &v), -ECONNRESET);
                ck_assert_int_eq(dlx_track_wait(q, t, 0, 0, &v), -ECONNRESET);
                dlx_close(q);
                dlx_close(p);
                dlxd_restart(&fx, NULL);
                p = fx_connect(&fx, "producer");
                q = fx_connect(&fx, "tracker");
                t = track_ok(q, "gone/x");
                ck_assert_uint_eq(tracked_version(q, t), 0);
                publish_copy(p, "gone/x", &v);
                ck_assert_uint_eq(v, 1);
                ck_assert_uint_eq(tracked_version(q, t), 1);
                dlx_close(q);
                dlx_close(p);
                dlxd_stop(&fx);
        }
}
END_TEST

/* ---- lifetimes
 * ------------------------------------------------------------------------------------ */

/* P7 fork: "every call on such a client fails with -ESTALE", "dlx_close() closes only the
 * child's copies": a child can neither untrack nor track on its parent's client, and its
 * close leaves the parent's tracks alive. */
static int child_meddles(void *arg)
{
        dlx_client *q = ((void **)arg)[0];
        uint32_t t = *(uint32_t *)((void **)arg)[1], t2 = 0;
        const char *socket = ((void **)arg)[2];
        struct dlx_connect_options o = {.socket_path = socket, .client_name = "child-own"};
        dlx_client *own;
        uint64_t v;

        if (dlx_untrack(q, t) != -ESTALE)
                return 2;
        if (dlx_track(q, "fork/y", &t2) != -ESTALE)
                return 3;
        dlx_close(q);
        if (dlx_connect(&o, &own) != 0)
                return 4;
        if (dlx_track(own, "fork/x", &t2) != 0 || dlx_track_version(own, t2, &v) != 0 || v != 1)
                return 5;
        if (dlx_untrack(own, t2) != 0)
                return 6;
        dlx_close(own);
        return 0;
}

START_TEST(fork_child_cannot_touch_parent_tracks)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "fork/x");
        void *args[3] = {q, &t, fx.socket};
        uint64_t v;

        publish_copy(p, "fork/x", NULL);
        ck_assert_int_eq(fx_wait(fx_spawn(child_meddles, args)), 0);
        ck_assert_uint_eq(tracked_version(q, t), 1);
        publish_copy(p, "fork/x", &v);
        ck_assert_uint_eq(tracked_version(q, t), 2);
        ck_assert_int_eq(dlx_track_wait(q, t, 1, 1000, &v), 0);
        ck_assert_uint_eq(v, 2);
        DLXV(dlx_untrack(q, t));
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P7 "A fork while other threads are inside libdlx is safe": a fork while a thread sleeps in
 * dlx_track_wait(): the child connects, tracks and waits on its own. */
static int child_tracks_alone(void *arg)
{
        struct dlx_connect_options o = {.socket_path = arg, .client_name = "child"};
        dlx_client *c;
        uint32_t t;
        uint64_t v;

        if (dlx_connect(&o, &c) != 0)
                return 2;
        if (dlx_track(c, "fw/x", &t) != 0)
                return 3;
        if (dlx_track_wait(c, t, 0, 0, &v) != 0 || v != 1)
                return 4;
        if (dlx_track_wait(c, t, 1, 50, &v) != -ETIMEDOUT)
                return 5;
        dlx_close(c);
        return 0;
}

START_TEST(fork_while_waiting)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "fw/x");
        struct waiter w = {.c = q, .track = t, .after = 1, .timeout_ms = 30000};
        pthread_t th;
        pid_t pid;

        publish_copy(p, "fw/x", NULL);
        start_waiter(&th, &w);
        fx_sleep_ms(50);
        pid = fx_spawn(child_tracks_alone, fx.socket);
        ck_assert_int_eq(fx_wait(pid), 0);
        publish_copy(p, "fw/x", NULL);
        pthread_join(th, NULL);
        ck_assert_int_eq(w.err, 0);
        ck_assert_uint_eq(w.seen, 2);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P7: sessions that track and end (closed, hung up, killed, by bye) leave the daemon
 * nothing: descriptors (teardown), memfd mappings, memory. */
static int child_tracks_and_dies(void *arg)
{
        struct dlx_connect_options o = {.socket_path = arg, .client_name = "dies"};
        dlx_client *c;
        char name[32];
        uint32_t t;

        if (dlx_connect(&o, &c) != 0)
                return 2;
        for (int i = 0; i < 40; i++) {
                snprintf(name, sizeof(name), "die/%d", i);
                if (dlx_track(c, name, &t) != 0)
                        return 3;
        }
        _exit(0); /* no close */
}

START_TEST(no_leak_after_many_sessions)
{
        dlx_client *p = fx_connect(&fx, "producer"), *s;
        int maps0, maps, fd;
        long rss0, rss;
        char name[64];
        struct wire_reply rep;

        publish_copy(p, "die/0", NULL);
        /* warm up: one of each */
        s = fx_connect(&fx, "warm");
        track_ok(s, "die/0");
        dlx_close(s);
        fx_wait_clients(p, 1, 5000);
        maps0 = memfd_maps(fx.pid);
        rss0 = proc_status_kb(fx.pid, "VmRSS:");
        for (int round = 0; round < (fx_slowdown() > 1 ? 40 : 200); round++) {
                switch (round % 4) {
                case 0:
                        s = fx_connect(&fx, "closer");
                        for (int i = 0; i < 40; i++) {
                                snprintf(name, sizeof(name), "die/%d/%d", round, i);
                                track_ok(s, name);
                        }
                        dlx_close(s);
                        break;
                case 1: {
                        int sock = rp_connect(fx.socket, "hangup");
                        ck_assert_int_eq(raw_track(sock, 2, "die/0", &rep, &fd), WIRE_OK);
                        close(fd);
                        close(sock);
                        break;
                }
                case 2: {
                        /* the page fd left unread in the socket */
                        int sock = rp_connect(fx.socket, "unread");
                        struct wire_request req;
                        track_req(&req, 2, "die/1");
                        rp_send(sock, &req, -1);
                        ck_assert(readable_within(sock, REPLY_MS));
                        close(sock);
                        break;
                }
                default:
                        if (round % 20 == 3)
                                ck_assert_int_eq(
                                        fx_wait(fx_spawn(child_tracks_and_dies, fx.socket)), 0);
                        break;
                }
        }
        ck_assert_int_eq(fx_wait_clients(p, 1, 5000), 1);
        maps = wait_memfd_maps(fx.pid, maps0, 3000);
        ck_assert_msg(maps <= maps0, "dlxd maps %d memfds, %d before 200 sessions", maps, maps0);
        rss = proc_status_kb(fx.pid, "VmRSS:");
        /* a sanitizer's quarantine, or valgrind, keeps freed memory: RSS says nothing there */
        if (!TOOLKIT_SANITIZED && fx_slowdown() == 1)
                ck_assert_msg(rss - rss0 < 8192, "dlxd grew from %ld to %ld kB over 200 sessions",
                              rss0, rss);
        ck_assert_uint_eq(fx_stats(p).names, 1);
        dlx_close(p);
}
END_TEST

/* P5/P7: tens of thousands of names tracked and untracked (long names, pipelined): the
 * daemon's memory comes back, and no name stays behind. */
START_TEST(no_leak_track_untrack_cycles)
{
        enum { BATCH = 200 };
        const int ROUNDS = fx_slowdown() > 1 ? 25 : 250; /* under valgrind, fewer */
        int sock = rp_connect(fx.socket, "cycler"), fd = -1;
        dlx_client *q = fx_connect(&fx, "lib");
        struct wire_request req;
        struct wire_reply rep;
        uint8_t *buf = NULL;
        size_t len, cap = 0;
        uint32_t slots[BATCH];
        char name[DLX_NAME_MAX + 1];
        long rss0 = 0, rss;
        uint64_t id = 2;

        memset(name, 'n', 200);
        name[200] = '\0';
        for (int round = 0; round < ROUNDS; round++) {
                if (round == 5)
                        rss0 = proc_status_kb(fx.pid, "VmRSS:");
                len = 0;
                for (int i = 0; i < BATCH; i++) {
                        snprintf(name + 180, 20, "/%08d", round * BATCH + i);
                        track_req(&req, id + (uint64_t)i, name);
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
                for (int i = 0; i < BATCH; i++) {
                        fd = -1;
                        ck_assert_int_eq(rp_read_answer(sock, &rep, REPLY_MS, &fd), 1);
                        if (fd >= 0)
                                close(fd);
                        ck_assert_msg(rep.status == WIRE_OK, "round %d: %d %s", round, rep.status,
                                      rep.error);
                        slots[i] = rep.track.slot;
                }
                id += BATCH;
                len = 0;
                for (int i = 0; i < BATCH; i++) {
                        untrack_req(&req, id + (uint64_t)i, slots[i]);
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
                for (int i = 0; i < BATCH; i++) {
                        ck_assert_int_eq(rp_read_answer(sock, &rep, REPLY_MS, NULL), 1);
                        ck_assert_int_eq(rep.status, WIRE_OK);
                }
                id += BATCH;
        }
        rss = proc_status_kb(fx.pid, "VmRSS:");
        /* a sanitizer's quarantine, or valgrind, keeps freed memory: RSS says nothing there */
        if (!TOOLKIT_SANITIZED && fx_slowdown() == 1)
                ck_assert_msg(rss - rss0 < 4096,
                              "dlxd grew from %ld to %ld kB over %d tracked names", rss0, rss,
                              BATCH * ROUNDS);
        /* libdlx too: distinct names, tracked and untracked */
        for (int i = 0; i < 2000; i++) {
                uint32_t t;
                snprintf(name, sizeof(name), "lcyc/%d", i);
                t = track_ok(q, name);
                DLXV(dlx_untrack(q, t));
        }
        ck_assert_uint_eq(fx_stats(q).names, 0);
        free(buf);
        close(sock);
        dlx_close(q);
}
END_TEST

/* P5 "-EAGAIN this client tracks dlxd --max-watches names already (65536 at most ...)":
 * --max-watches 0 (none) and 100000 both stop a client at 65536 tracked names, not before. */
START_TEST(max_watches_none_and_big)
{
        /* counting, not memory: 2 x 65536 tracks take minutes under valgrind (ASan runs it) */
        if (fx_slowdown() > 1)
                return;
        static const char *const none[] = {"--max-watches", "0", NULL};
        static const char *const big[] = {"--max-watches", "100000", NULL};
        enum { MAXT = 65536, CHUNK = 4096 };

        for (int d = 0; d < 2; d++) {
                struct wire_request req;
                struct wire_reply rep;
                uint8_t *buf = NULL;
                size_t len, cap = 0;
                char name[32];
                int sock, fd, granted = 0, refused = 0;
                uint32_t slots = 0, first_refused = 0;
                uint64_t id = 2;

                dlxd_start(&fx, d == 0 ? none : big);
                sock = rp_connect(fx.socket, "many");
                for (int done = 0; done < MAXT + 8; done += CHUNK) {
                        int n = MAXT + 8 - done < CHUNK ? MAXT + 8 - done : CHUNK;
                        len = 0;
                        for (int i = 0; i < n; i++) {
                                snprintf(name, sizeof(name), "w/%d", done + i);
                                track_req(&req, id + (uint64_t)i, name);
                                rp_frame_append(&buf, &len, &cap, &req);
                        }
                        ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
                        for (int i = 0; i < n; i++) {
                                fd = -1;
                                ck_assert_int_eq(rp_read_answer(sock, &rep, REPLY_MS, &fd), 1);
                                if (fd >= 0)
                                        close(fd);
                                if (rep.status == WIRE_OK) {
                                        granted++;
                                        if (!slots)
                                                slots = rep.track.slots;
                                        ck_assert_uint_lt(rep.track.slot, slots);
                                } else {
                                        ck_assert_msg(rep.status == WIRE_LIMIT, "track %d: %d %s",
                                                      done + i, rep.status, rep.error);
                                        if (!refused++)
                                                first_refused = (uint32_t)(done + i);
                                }
                        }
                        id += (uint64_t)n;
                }
                ck_assert_msg(granted == MAXT && refused == 8,
                              "--max-watches %s: %d tracks granted, the first refused was #%u "
                              "(page of %u slots)",
                              d == 0 ? "0" : "100000", granted, first_refused, slots);
                free(buf);
                close(sock);
                dlxd_stop(&fx);
        }
}
END_TEST

/* P4 "memory ... this client alone maps": no descriptor of the page (or any other libdlx
 * opened) survives an exec. */
START_TEST(page_fd_cloexec)
{
        bool before[1024] = {false};
        dlx_client *q;
        int nfd = 0;

        for (int fd = 0; fd < 1024; fd++)
                before[fd] = fd_is_open(fd);
        q = fx_connect(&fx, "tracker");
        track_ok(q, "exec/x");
        for (int fd = 0; fd < 1024; fd++) {
                if (before[fd] || !fd_is_open(fd))
                        continue;
                nfd++;
                ck_assert_msg(fcntl(fd, F_GETFD) & FD_CLOEXEC, "fd %d of libdlx lacks CLOEXEC", fd);
        }
        ck_assert_int_gt(nfd, 0);
        dlx_close(q);
}
END_TEST

/* dlx.h "-EINVAL ... not a track of this client": another client's track numbers are nothing
 * to this one, and using them changes nothing for their owner. */
START_TEST(other_client_track_id)
{
        dlx_client *p = fx_connect(&fx, "producer"), *a = fx_connect(&fx, "a"),
                   *b = fx_connect(&fx, "b");
        uint32_t t1 = track_ok(a, "oc/1"), t2 = track_ok(a, "oc/2"), tb;
        uint64_t v;

        ck_assert_int_eq(dlx_track_version(b, t1, &v), -EINVAL);
        ck_assert_int_eq(dlx_track_wait(b, t1, 0, 10, &v), -EINVAL);
        ck_assert_int_eq(dlx_untrack(b, t1), -EINVAL);
        tb = track_ok(b, "oc/b");
        if (tb != t2) {
                ck_assert_int_eq(dlx_track_version(b, t2, &v), -EINVAL);
                ck_assert_int_eq(dlx_untrack(b, t2), -EINVAL);
        }
        publish_copy(p, "oc/1", NULL);
        publish_copy(p, "oc/2", NULL);
        ck_assert_uint_eq(tracked_version(a, t1), 1);
        ck_assert_uint_eq(tracked_version(a, t2), 1);
        ck_assert_uint_eq(tracked_version(b, tb), 0);
        dlx_close(b);
        dlx_close(a);
        dlx_close(p);
}
END_TEST

/* ---- a client given up on a stopped daemon -------------------------------------------------- */

/* README "No call waits forever" and "Lifetimes": a client that gave up on a silent daemon
 * (-ETIMEDOUT) "says bye ... (its names, watches and waits end as at dlx_close())", and is
 * unusable: a track wait on it, even without a limit, ends then, not when the daemon resumes. */
START_TEST(gave_up_client_wait_ends)
{
        struct dlx_connect_options o = {.client_name = "giving-up", .timeout_ms = 300};
        struct timespec until;
        dlx_client *p, *q;
        struct waiter w;
        pthread_t th;
        uint32_t t;
        int64_t t0;
        bool ended_while_stopped;
        int joined;

        dlxd_start(&fx, NULL);
        o.socket_path = fx.socket;
        p = fx_connect(&fx, "producer");
        DLXV(dlx_connect(&o, &q));
        t = track_ok(q, "gu/x");
        publish_copy(p, "gu/x", NULL);
        publish_copy(p, "gu/x", NULL);
        fx_stop_daemon(&fx);
        ck_assert_int_eq(dlx_ping(q), -ETIMEDOUT);
        w = (struct waiter){.c = q, .track = t, .after = 2, .timeout_ms = -1};
        t0 = fx_now_ms();
        start_waiter(&th, &w);
        while (__atomic_load_n(&w.err, __ATOMIC_ACQUIRE) == 1 && fx_now_ms() - t0 < 3000)
                fx_sleep_ms(10);
        ended_while_stopped = __atomic_load_n(&w.err, __ATOMIC_ACQUIRE) != 1;
        kill(fx.pid, SIGCONT);
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 10;
        joined = pthread_timedjoin_np(th, NULL, &until);
        ck_assert_msg(ended_while_stopped,
                      "a wait (timeout -1) on a client that had given up (-ETIMEDOUT, bye said) "
                      "was still asleep 3 s later; it ended only %s the daemon resumed (%s)",
                      joined == 0 ? "after" : "not even 10 s after",
                      joined == 0 ? dlx_strerror(w.err) : "still waiting");
        ck_assert_int_eq(joined, 0);
        ck_assert_msg(w.err == -ECONNRESET || w.err == -ETIMEDOUT, "%s", dlx_strerror(w.err));
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* dlx.h track_version "-ECONNRESET the session has ended", with the README: a client given up
 * on (-ETIMEDOUT) has said bye and is "unusable": its page no longer answers as if alive. */
START_TEST(gave_up_client_version_says_ended)
{
        struct dlx_connect_options o = {.client_name = "giving-up", .timeout_ms = 300};
        dlx_client *p, *q;
        uint32_t t;
        uint64_t v = 0;
        int err;

        dlxd_start(&fx, NULL);
        o.socket_path = fx.socket;
        p = fx_connect(&fx, "producer");
        DLXV(dlx_connect(&o, &q));
        t = track_ok(q, "gv/x");
        publish_copy(p, "gv/x", NULL);
        fx_stop_daemon(&fx);
        ck_assert_int_eq(dlx_ping(q), -ETIMEDOUT);
        err = dlx_track_version(q, t, &v);
        kill(fx.pid, SIGCONT);
        ck_assert_msg(err == -ECONNRESET,
                      "dlx_track_version on a client given up on (bye said): %s, v%llu",
                      err ? dlx_strerror(err) : "success", (unsigned long long)v);
        ck_assert_uint_eq(v, 1);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* P6 + the issue ("without a system call ... in <= 1 us"): reading a version makes no system
 * call and takes well under a microsecond, even with other threads of the client asleep in
 * dlx_track_wait() on the same track. */
START_TEST(version_read_is_a_load)
{
        enum { N = 1000000 };
        dlx_client *q = fx_connect(&fx, "tracker"), *p = fx_connect(&fx, "producer");
        uint32_t t = track_ok(q, "load/x");
        struct waiter w[2];
        pthread_t th[2];
        struct rusage r0, r1;
        int64_t t0, elapsed;
        long sys_us, vcsw;
        uint64_t v, sum = 0;

        publish_copy(p, "load/x", NULL);
        for (int i = 0; i < 2; i++) {
                w[i] = (struct waiter){.c = q, .track = t, .after = 1, .timeout_ms = 30000};
                start_waiter(&th[i], &w[i]);
        }
        fx_sleep_ms(50);
        getrusage(RUSAGE_THREAD, &r0);
        t0 = fx_now_ms();
        for (int i = 0; i < N; i++) {
                if (dlx_track_version(q, t, &v) != 0)
                        ck_abort_msg("dlx_track_version failed at %d", i);
                sum += v;
        }
        elapsed = fx_now_ms() - t0;
        getrusage(RUSAGE_THREAD, &r1);
        ck_assert_uint_eq(sum, N);
        sys_us = (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1000000L +
                 (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
        vcsw = r1.ru_nvcsw - r0.ru_nvcsw;
        ck_assert_msg(elapsed < 1000L * fx_slowdown(), "%d reads took %lld ms", N,
                      (long long)elapsed);
        ck_assert_msg(sys_us < 100000 && vcsw < 100,
                      "%d reads spent %ld us in the kernel, %ld voluntary switches", N, sys_us,
                      vcsw);
        publish_copy(p, "load/x", NULL);
        for (int i = 0; i < 2; i++) {
                pthread_join(th[i], NULL);
                ck_assert_int_eq(w[i].err, 0);
                ck_assert_uint_eq(w[i].seen, 2);
        }
        dlx_close(p);
        dlx_close(q);
}
END_TEST

/* P6: a waiter that waits again with what it saw never misses a change and never times out
 * while changes keep coming (the seq/futex handshake loses no wake). */
struct pubber {
        dlx_client *p;
        int n;
};

static void *publish_n(void *arg)
{
        struct pubber *b = arg;

        for (int i = 0; i < b->n; i++) {
                if (dlx_publish(b->p, "miss/x", fx_plain_f32(4, 0, NULL), NULL, NULL) != 0)
                        return (void *)1;
                if (i % 50 == 0)
                        fx_sleep_ms(1);
        }
        return NULL;
}

START_TEST(wait_never_misses_a_change)
{
        enum { N = 1500 };
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "miss/x");
        struct pubber b = {p, N};
        pthread_t th;
        uint64_t seen = 0, v;
        int wakes = 0;
        void *res;

        ck_assert_int_eq(pthread_create(&th, NULL, publish_n, &b), 0);
        while (seen < N) {
                int err = dlx_track_wait(q, t, seen, 5000 * fx_slowdown(), &v);
                ck_assert_msg(err == 0, "wait after v%llu: %s", (unsigned long long)seen,
                              dlx_strerror(err));
                ck_assert_msg(v > seen, "woke with v%llu after v%llu", (unsigned long long)v,
                              (unsigned long long)seen);
                seen = v;
                wakes++;
        }
        pthread_join(th, &res);
        ck_assert_ptr_null(res);
        ck_assert_uint_eq(seen, N);
        ck_assert_int_ge(wakes, 1);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* P5: a session has one page: untracking everything and tracking again sends no second one. A
 * Track before hello gets no page either. libdlx refuses a 256-byte name, takes 255. */
START_TEST(one_page_per_session)
{
        int sock = rp_connect(fx.socket, "once"), fd = -1, raw = fx_raw_connect(&fx), r;
        dlx_client *q = fx_connect(&fx, "lib");
        struct wire_request req;
        struct wire_reply rep;
        char name[DLX_NAME_MAX + 2];
        uint32_t t;

        ck_assert_int_eq(raw_track(sock, 2, "once/a", &rep, &fd), WIRE_OK);
        ck_assert(rep.track.page);
        close(fd);
        ck_assert_int_eq(raw_untrack(sock, 3, rep.track.slot), WIRE_OK);
        for (int i = 0; i < 3; i++) {
                ck_assert_int_eq(raw_track(sock, 4 + 2 * (uint64_t)i, "once/b", &rep, &fd),
                                 WIRE_OK);
                ck_assert(!rep.track.page);
                ck_assert_int_eq(fd, -1);
                ck_assert_int_eq(raw_untrack(sock, 5 + 2 * (uint64_t)i, rep.track.slot), WIRE_OK);
        }
        close(sock);
        /* before hello */
        track_req(&req, 7, "once/c");
        rp_send(raw, &req, -1);
        fd = -1;
        r = rp_read(raw, &rep, REPLY_MS, &fd);
        ck_assert_msg(r <= 0 || rep.status != WIRE_OK, "a Track before hello was granted");
        ck_assert_int_eq(fd, -1);
        close(raw);
        memset(name, 'n', sizeof(name));
        name[DLX_NAME_MAX + 1] = '\0';
        ck_assert_int_eq(dlx_track(q, name, &t), -EINVAL);
        name[DLX_NAME_MAX] = '\0';
        t = track_ok(q, name);
        ck_assert_uint_eq(tracked_version(q, t), 0);
        dlx_close(q);
}
END_TEST

/* dlx.h conventions ("A dlx_client is thread-safe: any number of threads may call into the
 * same client at once") with P5: the first dlx_track() calls of a client, made by several
 * threads at once, all succeed (only one of their replies brings the page). */
struct first_track {
        dlx_client *q;
        pthread_barrier_t *go;
        const char *name;
        int err;
        char why[256];
};

static void *first_track_thread(void *arg)
{
        struct first_track *f = arg;
        uint32_t t;

        pthread_barrier_wait(f->go);
        f->err = dlx_track(f->q, f->name, &t);
        if (f->err)
                snprintf(f->why, sizeof(f->why), "%s", dlx_last_error());
        return NULL;
}

START_TEST(concurrent_first_tracks)
{
        enum { NT = 4, ROUNDS = 40 };
        static const char *const names[NT] = {"ft/a", "ft/b", "ft/a", "ft/c"};
        int failed = 0, unusable = 0, room = -1, expected_room = -1;
        char first[512] = "";

        for (int round = 0; round < ROUNDS; round++) {
                dlx_client *q = fx_connect(&fx, "fresh");
                struct first_track f[NT];
                pthread_barrier_t go;
                pthread_t th[NT];
                bool bad = false;

                pthread_barrier_init(&go, NULL, NT);
                for (int i = 0; i < NT; i++) {
                        f[i] = (struct first_track){.q = q, .go = &go, .name = names[i]};
                        ck_assert_int_eq(pthread_create(&th[i], NULL, first_track_thread, &f[i]),
                                         0);
                }
                for (int i = 0; i < NT; i++) {
                        pthread_join(th[i], NULL);
                        if (f[i].err) {
                                bad = true;
                                if (!first[0])
                                        snprintf(first, sizeof(first), "round %d: %s (%s)", round,
                                                 dlx_strerror(f[i].err), f[i].why);
                        }
                }
                pthread_barrier_destroy(&go);
                if (bad) {
                        failed++;
                        if (dlx_ping(q) != 0)
                                unusable++;
                        if (room < 0) {
                                /* how many more names it may track (256 less what it holds) */
                                char name[32];
                                uint32_t t;
                                int held = 0;
                                for (int i = 0; i < NT; i++)
                                        if (!f[i].err && (i != 2 || f[0].err))
                                                held++;
                                room = 0;
                                for (int k = 0; k < 300; k++) {
                                        snprintf(name, sizeof(name), "ft/room/%d", k);
                                        if (dlx_track(q, name, &t) != 0)
                                                break;
                                        room++;
                                }
                                expected_room = 256 - held;
                        }
                }
                dlx_close(q);
        }
        ck_assert_msg(failed == 0,
                      "%d of %d clients failed a first dlx_track() made by %d threads at once "
                      "(%d left unusable; the first could track %d more names, %d expected); "
                      "first: %s",
                      failed, ROUNDS, NT, unusable, room, expected_room, first);
}
END_TEST

Suite *track_attacks_suite(void)
{
        Suite *s = suite_create("track-attacks");
        TCase *raw = tcase_create("raw-peer");
        TCase *tc = tcase_create("promises");
        TCase *own = tcase_create("own-daemon");

        tcase_add_unchecked_fixture(raw, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(raw, fx_setup, fx_teardown);
        tcase_set_timeout(raw, 120);
        tcase_add_test(raw, raw_bad_names_refused);
        tcase_add_test(raw, raw_track_with_fd);
        tcase_add_test(raw, raw_untrack_never_tracked);
        tcase_add_test(raw, raw_refcount_does_not_wrap);
        tcase_add_test(raw, raw_slot_reuse_starts_clean);
        tcase_add_test(raw, raw_pipelined_past_limit);
        tcase_add_test(raw, raw_no_message_on_change);
        tcase_add_test(raw, raw_page_hardening);
        tcase_add_test(raw, raw_page_published_as_segment);
        tcase_add_test(raw, raw_future_write_memfd_not_read_only);
        tcase_add_test(raw, raw_ended_session_page_frozen);
        tcase_add_test(raw, raw_pipelined_publish_ordering);
        suite_add_tcase(s, raw);

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, visible_after_publish_in_any_process);
        tcase_add_test(tc, tracked_version_is_acquirable);
        tcase_add_test(tc, close_unpublishes_before_return);
        tcase_add_test(tc, producer_killed_and_persistent);
        tcase_add_test(tc, replaced_then_old_producer_leaves);
        tcase_add_test(tc, counting_survives_tracker_churn);
        tcase_add_test(tc, leased_but_gone_reads_current);
        tcase_add_test(tc, tracking_holds_no_lease_or_memory);
        tcase_add_test(tc, tracked_names_not_listed_or_watched);
        tcase_add_test(tc, wait_timeout_edges);
        tcase_add_test(tc, wait_wakes_promptly);
        tcase_add_test(tc, many_threads_many_tracks);
        tcase_add_test(tc, close_under_wait);
        tcase_add_test(tc, fork_child_cannot_touch_parent_tracks);
        tcase_add_test(tc, fork_while_waiting);
        tcase_add_test(tc, no_leak_after_many_sessions);
        tcase_add_test(tc, no_leak_track_untrack_cycles);
        tcase_add_test(tc, page_fd_cloexec);
        tcase_add_test(tc, other_client_track_id);
        tcase_add_test(tc, version_read_is_a_load);
        tcase_add_test(tc, wait_never_misses_a_change);
        tcase_add_test(tc, one_page_per_session);
        tcase_add_test(tc, concurrent_first_tracks);
        tcase_add_test(tc, partial_untrack_keeps_waiting);
        tcase_add_test(tc, own_publish_visible);
        suite_add_tcase(s, tc);

        tcase_add_unchecked_fixture(own, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(own, 120);
        tcase_add_test(own, raw_stalled_peer_page_current);
        tcase_add_test(own, failed_changes_do_not_bump);
        tcase_add_test(own, tracked_names_not_charged);
        tcase_add_test(own, other_uid_tracking_does_not_own);
        tcase_add_test(own, threads_track_untrack_same_name);
        tcase_add_test(own, daemon_stopped_wait);
        tcase_add_loop_test(own, daemon_gone_last_version, 0, 2);
        tcase_add_test(own, untrack_under_wait_no_aba);
        tcase_add_test(own, gave_up_client_wait_ends);
        tcase_add_test(own, daemon_stop_is_not_an_unpublish);
        tcase_add_test(own, gave_up_client_version_says_ended);
        tcase_add_test(own, max_watches_none_and_big);
        suite_add_tcase(s, own);
        return s;
}
