/* SPDX-License-Identifier: MIT */
/* Broken invariants: logged and counted, and fatal where the build asks (invariant.h). */
#include "invariant.h"

#include <stdlib.h>

#include "log.h"

#ifndef DLX_INVARIANT_ABORT
#define DLX_INVARIANT_ABORT 0
#endif

bool invariant_abort = DLX_INVARIANT_ABORT;
unsigned long invariants_broken;

bool invariant_broke(const char *expr, const char *file, int line, const char *func)
{
        invariants_broken++;
        log_msg(LOG_ERR, "internal invariant broken: %s (%s:%d, %s)%s", expr, file, line, func,
                invariant_abort ? "; aborting" : "");
        if (invariant_abort)
                abort();
        return false;
}
