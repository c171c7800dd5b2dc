/* SPDX-License-Identifier: MIT */
/*
 * daemon/log.c for fuzz-session: every log line is formatted (so that its
 * format and arguments run under the sanitizers, as in test-registry) and
 * dropped, unless DLX_FUZZ_LOG is set in the environment: a fuzzer writing a
 * line per request to stderr would mostly measure the terminal.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int log_level = LOG_DEBUG;

void log_msg(int level, const char *fmt, ...)
{
        static int verbose = -1;
        char line[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        if (verbose < 0)
                verbose = getenv("DLX_FUZZ_LOG") != NULL;
        if (verbose)
                fprintf(stderr, "dlxd <%d> %s\n", level, line);
}
