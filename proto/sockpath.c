/* SPDX-License-Identifier: MIT */
#include "sockpath.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int sockpath_resolve(const char *opt, char *buf, size_t size)
{
        const char *env;
        int n;

        if (opt && *opt)
                n = snprintf(buf, size, "%s", opt);
        else if ((env = getenv("DLX_SOCKET")) && *env)
                n = snprintf(buf, size, "%s", env);
        else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
                n = snprintf(buf, size, "%s/dlx/dlxd.sock", env);
        else
                n = snprintf(buf, size, "/tmp/dlx-%u/dlxd.sock", (unsigned)getuid());
        return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

bool sockpath_is_default(const char *opt)
{
        const char *env = getenv("DLX_SOCKET");

        return !(opt && *opt) && !(env && *env);
}

int sockpath_control(const char *dlxd, char *buf, size_t size)
{
        const char *slash = strrchr(dlxd, '/');
        const char *base = slash ? slash + 1 : dlxd;
        int dirlen = slash ? (int)(slash - dlxd) : 1;
        const char *dir = slash ? dlxd : ".";
        int n;

        if (slash == dlxd)
                dirlen = 0; /* "/dlxd.sock": the root */
        if (strcmp(base, "dlxd.sock") == 0)
                n = snprintf(buf, size, "%.*s/dlxfed.sock", dirlen, dir);
        else
                n = snprintf(buf, size, "%.*s/dlxfed-%s", dirlen, dir, base);
        return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}
