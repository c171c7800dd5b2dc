/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int log_level = LOG_NOTICE;

/* stderr is journald's stream: lines carry their priority as "<N>", and no time of their own. */
static bool to_journal;

void log_init(void)
{
        const char *js = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;

        to_journal = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 &&
                     fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
                     (unsigned long long)st.st_ino == ino;
}

static const char *const level_names[] = {
        "emerg", "alert", "crit", "error", "warning", "notice", "info", "debug",
};

int log_parse_level(const char *s)
{
        char *end;
        long v = strtol(s, &end, 10);

        if (*s && !*end && v >= 0 && v <= LOG_DEBUG)
                return (int)v;
        for (int i = 0; i <= LOG_DEBUG; i++)
                if (strcmp(s, level_names[i]) == 0)
                        return i;
        if (strcmp(s, "warn") == 0)
                return LOG_WARNING;
        if (strcmp(s, "err") == 0)
                return LOG_ERR;
        return -1;
}

/*
 * Writes line (its first n bytes are the prefix) as one line: a control
 * character a name or path brought (a newline would start a line with no
 * priority, or forge one) is shown as '?'.
 */
static void emit(char *line, int n)
{
        for (char *c = line + n; *c; c++)
                if ((unsigned char)*c < 0x20 || *c == 0x7f)
                        *c = '?';
        /* one write per line so concurrent writers never interleave within it */
        fprintf(stderr, "%s\n", line);
}

void log_say(int level, const char *fmt, ...)
{
        char line[1024];
        va_list ap;
        int n = snprintf(line, sizeof(line), to_journal ? "<%d>dlxd: " : "dlxd: ", level & 7);

        va_start(ap, fmt);
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
        va_end(ap);
        emit(line, n);
}

void log_msg(int level, const char *fmt, ...)
{
        char line[1024];
        struct timespec ts;
        struct tm tm;
        va_list ap;
        int n;

        if (to_journal) {
                n = snprintf(line, sizeof(line), "<%d>", level & 7);
        } else {
                clock_gettime(CLOCK_REALTIME, &ts);
                gmtime_r(&ts.tv_sec, &tm);
                n = snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld dlxd %s: ", tm.tm_hour,
                             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level_names[level & 7]);
        }
        va_start(ap, fmt);
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
        va_end(ap);
        emit(line, n);
}
