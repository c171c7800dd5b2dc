/* SPDX-License-Identifier: MIT */
/*
 * Internal invariants: what dlxd's own code keeps true (reference counts,
 * per-uid and per-session counts never below zero, a record on the list it
 * is removed from). After knot-resolver's kr_assert: a broken one is a bug
 * in dlxd, but one that a single peer's requests led to, so outside test
 * builds it costs that peer its session, never everyone their daemon.
 *
 *   if (!invariant(v->leases > 0))
 *           return session_break(s, "lease count");
 *
 * invariant(cond) is true when cond holds. When it does not, the expression
 * and its place are logged at error level and, when invariant_abort is set
 * (-Dinvariant_abort=true: the sanitizer and fuzz builds), dlxd aborts so a
 * test cannot miss it; otherwise it is false and the caller repairs what it
 * can (a count is left at zero, not wrapped) and ends the session at fault.
 */
#ifndef DLX_DAEMON_INVARIANT_H
#define DLX_DAEMON_INVARIANT_H

#include <stdbool.h>

/* Abort on a broken invariant (default: the build's -Dinvariant_abort). */
extern bool invariant_abort;
/* How many invariants broke since start (each one logged). */
extern unsigned long invariants_broken;

/* Logs, counts and, with invariant_abort, aborts. Returns false. */
bool invariant_broke(const char *expr, const char *file, int line, const char *func);

#define invariant(cond)                                                                            \
        (__builtin_expect(!!(cond), 1) ? true                                                      \
                                       : invariant_broke(#cond, __FILE__, __LINE__, __func__))

/*
 * Takes n from the unsigned count x, which must hold at least n; a count
 * short of n is left at 0. True when it held enough.
 */
#define count_take(x, n) (invariant((x) >= (n)) ? ((x) -= (n), true) : ((x) = 0, false))

#endif /* DLX_DAEMON_INVARIANT_H */
