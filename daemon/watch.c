/* SPDX-License-Identifier: MIT */
#include "watch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "wire_limits.h"

struct watch {
        struct list ilink; /* in watch_index.all */
        struct list slink; /* in session.watches */
        struct session *s;
        uint64_t id;
        size_t plen;
        char prefix[];
};

void watch_index_init(struct watch_index *ix)
{
        list_init(&ix->all);
        ix->next_id = 1;
        ix->count = 0;
}

int watch_add(struct watch_index *ix, struct session *s, const char *prefix, uint64_t *ret_id)
{
        size_t plen = strlen(prefix);
        struct watch *w;

        if (plen > DLX_NAME_MAX)
                return -EINVAL;
        w = calloc(1, sizeof(*w) + plen + 1);
        if (!w)
                return -ENOMEM;
        w->s = s;
        w->id = ix->next_id++;
        w->plen = plen;
        memcpy(w->prefix, prefix, plen + 1);
        list_insert_tail(&ix->all, &w->ilink);
        list_insert_tail(&s->watches, &w->slink);
        ix->count++;
        s->nwatches++;
        *ret_id = w->id;
        return 0;
}

static void watch_free(struct watch_index *ix, struct watch *w)
{
        list_remove(&w->ilink);
        list_remove(&w->slink);
        ix->count--;
        w->s->nwatches--;
        free(w);
}

int watch_remove(struct watch_index *ix, struct session *s, uint64_t id)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &s->watches)
        {
                struct watch *w = list_entry(pos, struct watch, slink);
                if (w->id == id) {
                        watch_free(ix, w);
                        return 0;
                }
        }
        return -ENOENT;
}

void watch_session_drop(struct watch_index *ix, struct session *s)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &s->watches)
                watch_free(ix, list_entry(pos, struct watch, slink));
}

void watch_notify(struct watch_index *ix, enum wire_event_kind kind, const char *name, size_t len,
                  uint64_t version)
{
        struct wire_reply rep;
        struct list *pos;

        /* one event for all: only the watch id differs from one watcher to the next */
        rep.id = 0;
        rep.status = WIRE_OK;
        rep.error[0] = '\0';
        rep.type = WIRE_REP_EVENT;
        rep.event.kind = kind;
        memcpy(rep.event.name, name, len + 1);
        rep.event.version = version;
        rep.event.token = 0;
        rep.event.segment = 0;
        rep.event.events = NULL;
        rep.event.nevents = 0;
        /* session_send() never ends a session on the spot (a connection is doomed for later),
         * so no watch goes away while we walk them */
        for (pos = ix->all.next; pos != &ix->all; pos = pos->next) {
                struct watch *w = list_entry(pos, struct watch, ilink);
                if (w->plen <= len && memcmp(w->prefix, name, w->plen) == 0) {
                        rep.event.watch = w->id;
                        session_send(w->s, &rep, -1);
                }
        }
}
