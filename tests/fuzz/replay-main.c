/* SPDX-License-Identifier: MIT */
/*
 * The main of a fuzz target built without libFuzzer (any compiler): runs
 * LLVMFuzzerTestOneInput() once over each file named on the command line,
 * and over every file of a directory named there. A broken invariant or a
 * sanitizer report aborts, so a kept crash input fails its test in every build.
 *
 * Usage: fuzz-TARGET FILE|DIR...   A path that does not exist is skipped with a
 * note (a target may have no kept inputs yet). Exit status: 0, or 1 for a file
 * it cannot read; a failing input aborts.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path, unsigned *count)
{
        FILE *f = fopen(path, "rb");
        uint8_t *data = NULL;
        size_t size = 0, cap = 0, n;

        if (!f) {
                fprintf(stderr, "%s: %s\n", path, strerror(errno));
                return -1;
        }
        do {
                if (size == cap) {
                        cap = cap ? cap * 2 : 4096;
                        data = realloc(data, cap);
                        if (!data) {
                                fprintf(stderr, "%s: out of memory\n", path);
                                fclose(f);
                                return -1;
                        }
                }
                n = fread(data + size, 1, cap - size, f);
                size += n;
        } while (n > 0);
        if (ferror(f)) {
                fprintf(stderr, "%s: read error\n", path);
                fclose(f);
                free(data);
                return -1;
        }
        fclose(f);
        /* an exact-size copy, so that a read past the input's end is a sanitizer report */
        uint8_t *exact = malloc(size ? size : 1);
        if (!exact) {
                free(data);
                return -1;
        }
        if (size)
                memcpy(exact, data, size);
        free(data);
        LLVMFuzzerTestOneInput(exact, size);
        free(exact);
        (*count)++;
        return 0;
}

static int cmp_names(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of dir, in name order so that runs repeat exactly. */
static int replay_dir(const char *dir, unsigned *count)
{
        DIR *d = opendir(dir);
        struct dirent *e;
        char **names = NULL;
        size_t n = 0, cap = 0;
        int err = 0;

        if (!d) {
                fprintf(stderr, "%s: %s\n", dir, strerror(errno));
                return -1;
        }
        while ((e = readdir(d))) {
                if (e->d_name[0] == '.')
                        continue;
                if (n == cap) {
                        cap = cap ? cap * 2 : 64;
                        char **grown = realloc(names, cap * sizeof(*names));
                        if (!grown) {
                                err = -1;
                                break;
                        }
                        names = grown;
                }
                if (asprintf(&names[n], "%s/%s", dir, e->d_name) < 0) {
                        err = -1;
                        break;
                }
                n++;
        }
        closedir(d);
        if (n)
                qsort(names, n, sizeof(*names), cmp_names);
        for (size_t i = 0; i < n; i++) {
                struct stat sb;
                if (err == 0 && stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode) &&
                    replay_file(names[i], count) < 0)
                        err = -1;
                free(names[i]);
        }
        free(names);
        return err;
}

int main(int argc, char **argv)
{
        unsigned count = 0;
        int rc = 0;

        for (int i = 1; i < argc; i++) {
                struct stat sb;

                if (stat(argv[i], &sb) < 0) {
                        int err = errno;
                        fprintf(stderr, "%s: %s%s\n", argv[i], strerror(err),
                                err == ENOENT ? ": nothing replayed" : "");
                        if (err != ENOENT)
                                rc = 1;
                } else if (S_ISDIR(sb.st_mode) ? replay_dir(argv[i], &count) < 0
                                               : replay_file(argv[i], &count) < 0) {
                        rc = 1;
                }
        }
        fprintf(stderr, "%s: %u inputs replayed\n", argv[0], count);
        return rc;
}
