/* SPDX-License-Identifier: MIT */
/* dlxd logs one line per event to stderr at syslog levels. */
#ifndef DLX_DAEMON_LOG_H
#define DLX_DAEMON_LOG_H

#include <syslog.h>

extern int log_level;

/*
 * Looks at where stderr goes: to journald (JOURNAL_STREAM names it), each
 * line is "<N>message" (N the syslog priority, which journald takes off and
 * keeps); elsewhere "HH:MM:SS.mmm dlxd LEVEL: message", UTC.
 */
void log_init(void);

/* Parses "debug", "info", "notice", "warning", "error" (or 0-7). Returns the level or -1. */
int log_parse_level(const char *s);

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * What dlxd says before (or instead of) serving, whatever the log level: a
 * bad option, a socket it cannot take. "dlxd: message", and under journald
 * "<N>dlxd: message".
 */
void log_say(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) (log_level >= LOG_DEBUG ? log_msg(LOG_DEBUG, __VA_ARGS__) : (void)0)
#define log_info(...) (log_level >= LOG_INFO ? log_msg(LOG_INFO, __VA_ARGS__) : (void)0)
#define log_notice(...) (log_level >= LOG_NOTICE ? log_msg(LOG_NOTICE, __VA_ARGS__) : (void)0)
#define log_warn(...) (log_level >= LOG_WARNING ? log_msg(LOG_WARNING, __VA_ARGS__) : (void)0)
#define log_err(...) (log_level >= LOG_ERR ? log_msg(LOG_ERR, __VA_ARGS__) : (void)0)

/* One line about a session: "session ID pid PID uid UID: ...". */
#define log_session(level, s, fmt, ...)                                                            \
        log_##level("session %llu pid %d uid %u: " fmt, (unsigned long long)(s)->id,               \
                    (int)(s)->pid, (unsigned)(s)->uid, ##__VA_ARGS__)

#endif /* DLX_DAEMON_LOG_H */
