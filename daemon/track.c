/* SPDX-License-Identifier: MIT */
/*
 * Tracks: the names a session follows in its version page (proto/verpage.h).
 * An entry lists its tracks; whenever its current version changes
 * (entry_set_current, the one place it does) each track's slot is rewritten
 * and its futex woken. A session's page is made at its first track, with a
 * slot for each track it may have (--max-watches, at most TRACK_SLOTS_MAX).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "namespace.h"
#include "verpage.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

/* Slots of one page when --max-watches sets no smaller number (16 bytes each). */
#define TRACK_SLOTS_MAX 65536u

struct track {
        struct list elink; /* in entry.tracks */
        struct entry *e;
        struct session *s;
        uint32_t slot;
        uint32_t refs; /* tracks of the name by this session: one slot */
};

/* Wakes whoever sleeps on slot: something there changed. */
static void slot_wake(struct session *s, uint32_t slot)
{
        struct verpage_slot *v = &s->vpage->slot[slot];

        __atomic_add_fetch(&v->seq, 1, __ATOMIC_RELEASE);
        /* nothing to check: no waiter is fine, and the page is ours */
        syscall(SYS_futex, &v->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* A closed page keeps the versions it had: nothing is written there any more. */
static void slot_set(struct session *s, uint32_t slot, uint64_t version)
{
        if (s->vpage->closed)
                return;
        __atomic_store_n(&s->vpage->slot[slot].version, version, __ATOMIC_RELEASE);
        slot_wake(s, slot);
}

/* Closes s's page, its versions as they are, and wakes its waiters to see it. */
static void page_close(struct session *s)
{
        if (!s->vpage || s->vpage->closed)
                return;
        __atomic_store_n(&s->vpage->closed, 1, __ATOMIC_RELEASE);
        for (uint32_t i = 0; i < s->vpage->slots; i++)
                if (s->tracks[i])
                        slot_wake(s, i);
}

void registry_pages_close(struct registry *reg)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &reg->sessions)
                page_close(list_entry(pos, struct session, link));
}

void tracks_update(struct entry *e)
{
        uint64_t version = e->current ? e->current->version : 0;
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &e->tracks)
        {
                struct track *t = list_entry(pos, struct track, elink);
                slot_set(t->s, t->slot, version);
        }
}

/* Makes s's page: its fd (to send once, then close), or -errno. */
static int page_create(struct session *s)
{
        uint32_t max = s->reg->lim.max_watches, slots;
        size_t size;
        void *p;
        int fd;

        slots = max && max < TRACK_SLOTS_MAX ? max : TRACK_SLOTS_MAX;
        size = VERPAGE_SIZE(slots);
        s->tracks = calloc(slots, sizeof(*s->tracks));
        if (!s->tracks)
                return -ENOMEM;
        fd = memfd_create("dlx-versions", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || ftruncate(fd, (off_t)size) < 0 ||
            (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
                int err = -errno;
                if (fd >= 0)
                        close(fd);
                free(s->tracks);
                s->tracks = NULL;
                return err;
        }
        /* from here the only writable mapping there will ever be is this one */
        if (fcntl(fd, F_ADD_SEALS,
                  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0) {
                int err = -errno;
                munmap(p, size);
                close(fd);
                free(s->tracks);
                s->tracks = NULL;
                return err;
        }
        s->vpage = p;
        s->vpage_size = size;
        s->vpage->magic = VERPAGE_MAGIC;
        s->vpage->slots = slots;
        return fd;
}

/* A free slot of s, or -1 (all in use: the limit). */
static int64_t slot_take(struct session *s)
{
        uint32_t slots = s->vpage->slots;

        for (uint32_t i = 0; i < slots; i++) {
                uint32_t k = (s->track_hint + i) % slots;
                if (!s->tracks[k]) {
                        s->track_hint = k + 1;
                        return k;
                }
        }
        return -1;
}

void registry_track(struct session *s, const struct wire_request *req)
{
        struct registry *reg = s->reg;
        struct wire_reply rep;
        struct entry *e;
        struct track *t = NULL;
        struct list *pos, *tmp;
        int fd = -1;
        int64_t slot;

        if (!s->vpage) {
                fd = page_create(s);
                if (fd < 0) {
                        session_fail(s, req->id, fd, "cannot make the version page: %s",
                                     strerror(-fd));
                        return;
                }
        }
        e = entry_get(reg, req->track.name, s->uid);
        if (!e) {
                session_fail(s, req->id, -ENOMEM, "out of memory");
                goto out;
        }
        list_for_each_safe(pos, tmp, &e->tracks)
        {
                struct track *x = list_entry(pos, struct track, elink);
                if (x->s == s) {
                        t = x;
                        break;
                }
        }
        if (t) {
                t->refs++;
        } else {
                slot = slot_take(s);
                if (slot < 0) {
                        entry_maybe_free(reg, e);
                        session_fail(s, req->id, -EAGAIN,
                                     "this client tracks %u names already (dlxd --max-watches)",
                                     s->vpage->slots);
                        goto out;
                }
                t = calloc(1, sizeof(*t));
                if (!t) {
                        entry_maybe_free(reg, e);
                        session_fail(s, req->id, -ENOMEM, "out of memory");
                        goto out;
                }
                t->e = e;
                t->s = s;
                t->slot = (uint32_t)slot;
                t->refs = 1;
                list_insert_tail(&e->tracks, &t->elink);
                s->tracks[slot] = t;
                s->ntracks++;
                slot_set(s, t->slot, e->current ? e->current->version : 0);
        }
        reply_init(&rep, req->id, WIRE_REP_TRACK);
        rep.track.slot = t->slot;
        rep.track.version = e->current ? e->current->version : 0;
        rep.track.slots = s->vpage->slots;
        rep.track.page = fd >= 0;
        /* a reply that cannot be queued ends the session: the page goes with it */
        session_send(s, &rep, fd);
out:
        if (fd >= 0)
                close(fd);
}

/* Ends t: an untrack clears its slot for the next name; a session's end leaves it as it was. */
static void track_end(struct track *t, bool clear)
{
        struct session *s = t->s;
        struct entry *e = t->e;

        s->tracks[t->slot] = NULL;
        s->ntracks--;
        list_remove(&t->elink);
        if (clear)
                slot_set(s, t->slot, 0);
        free(t);
        entry_maybe_free(s->reg, e);
}

void registry_untrack(struct session *s, const struct wire_request *req)
{
        uint32_t slot = req->untrack.slot;
        struct wire_reply rep;
        struct track *t;

        if (!s->vpage || slot >= s->vpage->slots || !(t = s->tracks[slot])) {
                session_fail(s, req->id, -ENOENT, "no track in slot %u", slot);
                return;
        }
        if (--t->refs == 0)
                track_end(t, true);
        reply_init(&rep, req->id, WIRE_REP_NONE);
        session_send(s, &rep, -1);
}

void track_session_drop(struct session *s, bool unmap)
{
        if (!s->vpage)
                return;
        page_close(s);
        for (uint32_t i = 0; i < s->vpage->slots && s->ntracks; i++)
                if (s->tracks[i])
                        track_end(s->tracks[i], false);
        if (!unmap)
                return;
        munmap(s->vpage, s->vpage_size);
        s->vpage = NULL;
        free(s->tracks);
        s->tracks = NULL;
}
