/* SPDX-License-Identifier: MIT */
/*
 * Tracking: the current version of a name, read from the session's version
 * page (proto/verpage.h) without a system call, and waited for on a futex in
 * it. The daemon is the page's only writer; this side maps it read-only (the
 * seals leave nothing else possible) and trusts only what it checked: the
 * magic, the slot count against the mapping's size, and its own count of the
 * tracks it asked for.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "layout.h"
#include "verpage.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

/* A wait sleeps this long at most before it looks whether the daemon is still there. */
#define TRACK_CHECK_MS 1000

/* Maps the page whose fd came with the first track's reply. Lock held. */
static int page_map(dlx_client *c, int fd, uint32_t slots)
{
        const unsigned need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE;
        size_t size = VERPAGE_SIZE(slots);
        const struct version_page *p;
        uint32_t *refs, *gen;
        struct stat st;
        int seals;

        seals = fcntl(fd, F_GET_SEALS);
        if (seals < 0 || (seals & need) != need)
                return dlx__fail(-EPROTO, "the daemon's version page is not sealed");
        if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < size)
                return dlx__fail(-EPROTO, "the daemon's version page is smaller than its %u slots",
                                 slots);
        refs = calloc(slots, sizeof(*refs));
        gen = calloc(slots, sizeof(*gen));
        if (!refs || !gen) {
                free(refs);
                free(gen);
                return dlx__fail(-ENOMEM, "out of memory");
        }
        p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
                int err = -errno;
                free(refs);
                free(gen);
                return dlx__fail(err, "cannot map the version page: %s", strerror(-err));
        }
        if (p->magic != VERPAGE_MAGIC || p->slots != slots) {
                munmap((void *)p, size);
                free(refs);
                free(gen);
                return dlx__fail(-EPROTO, "the daemon's version page is not one");
        }
        c->vpage_size = size;
        c->track_refs = refs;
        c->track_gen = gen;
        /* readers load the page first: its refs are in place by then */
        __atomic_store_n(&c->vpage, p, __ATOMIC_RELEASE);
        return 0;
}

static int held_track(dlx_client *c, const char *name, uint32_t *ret_track)
{
        struct wire_request req = {.type = WIRE_REQ_TRACK};
        const char *why = NULL;
        struct pending p;
        bool first;
        int err;

        if (!name || !ret_track)
                return dlx__fail(-EINVAL, "NULL argument");
        if (layout_name_check(name, strlen(name), &why) < 0)
                return dlx__fail(-EINVAL, "bad name '%s': %s", DLX_QUOTED(name), why);
        err = dlx__usable(c);
        if (err < 0)
                return err;
        if (c->server_minor < 2)
                return dlx__fail(-ENOTSUP, "%s does not keep version pages (protocol 1.2)",
                                 c->server);
        snprintf(req.track.name, sizeof(req.track.name), "%s", name);
        /*
         * The page comes with the session's first track only: while there is
         * none, one track at a time, or a second one's reply (no page) could
         * be taken before the first's (the page).
         */
        first = !__atomic_load_n(&c->vpage, __ATOMIC_ACQUIRE);
        if (first)
                pthread_mutex_lock(&c->track_lock);
        err = dlx__call(c, &req, -1, &p);
        if (err == 0 && p.rep.type != WIRE_REP_TRACK)
                err = dlx__fail(-EPROTO, "the daemon answered track with something else");
        if (err == 0) {
                pthread_mutex_lock(&c->lock);
                const struct version_page *page = c->vpage;
                if (p.rep.track.page && p.fd >= 0 && !page)
                        err = page_map(c, p.fd, p.rep.track.slots);
                else if (!page || p.rep.track.page || p.fd >= 0)
                        err = dlx__fail(-EPROTO, "the daemon sent a version page %s",
                                        page ? "twice" : "without its fd");
                if (err == 0 && p.rep.track.slot >= c->vpage->slots)
                        err = dlx__fail(-EPROTO, "the daemon gave slot %u of %u", p.rep.track.slot,
                                        c->vpage->slots);
                if (err == 0) {
                        __atomic_add_fetch(&c->track_refs[p.rep.track.slot], 1, __ATOMIC_RELEASE);
                        *ret_track = p.rep.track.slot + 1;
                }
                pthread_mutex_unlock(&c->lock);
                if (err < 0 && p.rep.type == WIRE_REP_TRACK) {
                        /* the daemon counts the track: give its slot back, keep the error */
                        struct wire_request un = {.type = WIRE_REQ_UNTRACK};
                        struct pending u;
                        un.untrack.slot = p.rep.track.slot;
                        dlx__call(c, &un, -1, &u);
                        dlx__pending_done(c, &u);
                }
        }
        if (first)
                pthread_mutex_unlock(&c->track_lock);
        dlx__pending_done(c, &p);
        return err;
}

int dlx_track(dlx_client *c, const char *name, uint32_t *ret_track)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_track(c, name, ret_track));
}

/* The slot of track if c holds it (refs > 0), else NULL with -EINVAL recorded in *err. */
static const struct verpage_slot *slot_of(const dlx_client *c, uint32_t track, int *err)
{
        const struct version_page *p = __atomic_load_n(&c->vpage, __ATOMIC_ACQUIRE);

        if (!p || track == 0 || track > p->slots ||
            __atomic_load_n(&c->track_refs[track - 1], __ATOMIC_ACQUIRE) == 0) {
                *err = dlx__fail(-EINVAL, "%u is not a track of this client", track);
                return NULL;
        }
        return &p->slot[track - 1];
}

/* -ECONNRESET once the session has ended or the connection to the daemon has: else 0. */
static int ended(dlx_client *c)
{
        int broken = __atomic_load_n(&c->broken, __ATOMIC_RELAXED);

        if (__atomic_load_n(&c->vpage->closed, __ATOMIC_ACQUIRE))
                return dlx__fail(-ECONNRESET, "the session has ended: its tracks no longer change");
        if (broken)
                return dlx__fail(-ECONNRESET,
                                 "the connection to the daemon has ended (%s): its tracks no "
                                 "longer change",
                                 dlx_strerror(broken));
        return 0;
}

int dlx_track_version(dlx_client *c, uint32_t track, uint64_t *ret_version)
{
        const struct verpage_slot *s;
        int err = 0;

        if (!c || !ret_version)
                return dlx__fail(-EINVAL, "NULL argument");
        if ((err = dlx__usable(c)) < 0)
                return err;
        s = slot_of(c, track, &err);
        if (!s)
                return err;
        *ret_version = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
        return ended(c);
}

/* Whether the connection has ended under us (the daemon died without closing the page). */
static bool connection_gone(dlx_client *c)
{
        struct pollfd pfd = {.fd = c->fd, .events = POLLRDHUP};

        return poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

static int held_track_wait(dlx_client *c, uint32_t track, uint64_t version, int64_t timeout_ms,
                           uint64_t *ret_version)
{
        int64_t deadline = timeout_ms > 0 ? dlx__deadline_ms(timeout_ms) : 0;
        const struct verpage_slot *s;
        uint32_t gen;
        int err = dlx__usable(c);

        if (err < 0)
                return err;
        s = slot_of(c, track, &err);
        if (!s)
                return err;
        /* the slot may go to another name once untracked: its generation says so */
        gen = __atomic_load_n(&c->track_gen[track - 1], __ATOMIC_ACQUIRE);
        for (;;) {
                uint32_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
                uint64_t now = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
                int64_t left = TRACK_CHECK_MS;
                struct timespec ts;

                if (__atomic_load_n(&c->track_gen[track - 1], __ATOMIC_ACQUIRE) != gen)
                        return dlx__fail(-EINVAL, "track %u was untracked while waited on", track);
                /* an ended session says so first, with the last version, as dlx_track_version */
                if ((err = ended(c)) < 0 || now != version) {
                        if (ret_version)
                                *ret_version = now;
                        return err;
                }
                if (timeout_ms == 0)
                        return dlx__fail(-EAGAIN, "still version %llu",
                                         (unsigned long long)version);
                if (timeout_ms > 0) {
                        int64_t rest = deadline - dlx__now_ms();
                        if (rest <= 0)
                                return dlx__fail(-ETIMEDOUT, "still version %llu after %lld ms",
                                                 (unsigned long long)version,
                                                 (long long)timeout_ms);
                        if (rest < left)
                                left = rest;
                }
                ts.tv_sec = left / 1000;
                ts.tv_nsec = (left % 1000) * 1000000L;
                /* returns at once (EAGAIN) if seq moved since it was loaded */
                if (syscall(SYS_futex, &s->seq, FUTEX_WAIT, seq, &ts, NULL, 0) < 0 &&
                    errno == ETIMEDOUT && connection_gone(c))
                        return dlx__fail(-ECONNRESET,
                                         "the connection to the daemon has ended: tracks no "
                                         "longer change");
        }
}

int dlx_track_wait(dlx_client *c, uint32_t track, uint64_t version, int64_t timeout_ms,
                   uint64_t *ret_version)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_track_wait(c, track, version, timeout_ms, ret_version));
}

static int held_untrack(dlx_client *c, uint32_t track)
{
        struct wire_request req = {.type = WIRE_REQ_UNTRACK};
        struct pending p;
        int err = 0;

        pthread_mutex_lock(&c->lock);
        if (slot_of(c, track, &err) &&
            __atomic_sub_fetch(&c->track_refs[track - 1], 1, __ATOMIC_RELEASE) == 0)
                /* before the daemon can give the slot to another name */
                __atomic_add_fetch(&c->track_gen[track - 1], 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&c->lock);
        if (err < 0)
                return err;
        req.untrack.slot = track - 1;
        err = dlx__call(c, &req, -1, &p);
        dlx__pending_done(c, &p);
        return err;
}

int dlx_untrack(dlx_client *c, uint32_t track)
{
        if (!c)
                return dlx__fail(-EINVAL, "NULL client");
        return DLX_HOLDING(c, held_untrack(c, track));
}

void dlx__track_final(dlx_client *c)
{
        if (c->vpage)
                munmap((void *)c->vpage, c->vpage_size);
        free(c->track_refs);
        free(c->track_gen);
        c->vpage = NULL;
        c->track_refs = NULL;
        c->track_gen = NULL;
}
