/* SPDX-License-Identifier: MIT */
/* An intrusive circular doubly linked list: a head is a node pointing at itself when empty. */
#ifndef DLX_DAEMON_LIST_H
#define DLX_DAEMON_LIST_H

#include <stdbool.h>
#include <stddef.h>

#include "invariant.h"

struct list {
        struct list *next, *prev;
};

#define list_entry(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void list_init(struct list *l)
{
        l->next = l->prev = l;
}

static inline bool list_empty(const struct list *l)
{
        return l->next == l;
}

/* A node that was initialised or removed is not linked. */
static inline bool list_linked(const struct list *n)
{
        return n->next != n;
}

static inline void list_insert_tail(struct list *head, struct list *n)
{
        n->prev = head->prev;
        n->next = head;
        head->prev->next = n;
        head->prev = n;
}

/*
 * Unlinks n, which must be on a list (its neighbours point back at it) or
 * unlinked already; a node that is neither is left alone (see invariant.h).
 */
static inline void list_remove(struct list *n)
{
        if (!invariant(n->next->prev == n && n->prev->next == n))
                return;
        n->prev->next = n->next;
        n->next->prev = n->prev;
        n->next = n->prev = n;
}

#define list_for_each_safe(pos, tmp, head)                                                         \
        for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                           \
             (pos) = (tmp), (tmp) = (pos)->next)

#endif /* DLX_DAEMON_LIST_H */
