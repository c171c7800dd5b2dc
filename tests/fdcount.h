/* SPDX-License-Identifier: MIT */
/* Counting a process's open fds, for leak checks; no libdlx needed (unit suites use it too). */
#ifndef DLX_TESTS_FDCOUNT_H
#define DLX_TESTS_FDCOUNT_H

#include <dirent.h>
#include <stdio.h>
#include <sys/types.h>

/* Open fds of a process (0: this one), or -1. */
static inline int count_fds(pid_t pid)
{
        char path[64];
        struct dirent *d;
        DIR *dir;
        int n = 0;

        if (pid)
                snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
        else
                snprintf(path, sizeof(path), "/proc/self/fd");
        dir = opendir(path);
        if (!dir)
                return -1;
        while ((d = readdir(dir)))
                if (d->d_name[0] != '.')
                        n++;
        closedir(dir);
        /* opendir's own fd is counted for ourselves */
        return pid ? n : n - 1;
}

#endif /* DLX_TESTS_FDCOUNT_H */
