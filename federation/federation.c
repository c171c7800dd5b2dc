/* SPDX-License-Identifier: MIT */
/* dlxfed: options and config file, the loop, signals, and what the local dlxd sends. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fed.h"
#include "invariant.h"
#include "layout.h"

int fed_log_level = FED_NOTICE;

/* daemon/list.h checks its links as dlxd does (invariant.h): here a broken one is logged. */
bool invariant_abort;
unsigned long invariants_broken;

bool invariant_broke(const char *expr, const char *file, int line, const char *func)
{
        invariants_broken++;
        fed_log(FED_ERR, "broken invariant '%s' at %s:%d (%s): a bug in dlxfed", expr, file, line,
                func);
        if (invariant_abort)
                abort();
        return false;
}

void fed_log(int level, const char *fmt, ...)
{
        static const char *const names[] = {[FED_ERR] = "error",
                                            [FED_WARN] = "warning",
                                            [FED_NOTICE] = "notice",
                                            [FED_INFO] = "info",
                                            [FED_DEBUG] = "debug"};
        struct timespec ts;
        struct tm tm;
        va_list ap;

        if (level > fed_log_level)
                return;
        clock_gettime(CLOCK_REALTIME, &ts);
        localtime_r(&ts.tv_sec, &tm);
        fprintf(stderr, "%02d:%02d:%02d.%03ld dlxfed %s: ", tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, names[level]);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
}

/* HOST:PORT or [HOST6]:PORT, numeric addresses only: what UCX binds and connects to. */
struct peer *fed_peer_of(struct fed_config *cfg, const char *name)
{
        const char *slash = strchr(name, '/');
        size_t len;

        if (name[0] != '@' || !slash)
                return NULL;
        len = (size_t)(slash - name - 1);
        for (unsigned i = 0; i < cfg->npeers; i++)
                if (strlen(cfg->peers[i].alias) == len &&
                    memcmp(cfg->peers[i].alias, name + 1, len) == 0)
                        return &cfg->peers[i];
        return NULL;
}

int fed_parse_addr(const char *s, struct fed_addr *ret)
{
        char host[80];
        const char *colon = strrchr(s, ':');
        struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                                 .ai_socktype = SOCK_STREAM},
                        *ai = NULL;
        size_t hl;

        if (!colon || colon == s || !colon[1])
                return -EINVAL;
        hl = (size_t)(colon - s);
        if (s[0] == '[' && hl >= 2 && s[hl - 1] == ']') {
                s++;
                hl -= 2;
        }
        if (hl >= sizeof(host))
                return -EINVAL;
        memcpy(host, s, hl);
        host[hl] = '\0';
        /* a port of 1 to 65535, digits only */
        char *pend;
        unsigned long port = strtoul(colon + 1, &pend, 10);
        if (colon[1] < '0' || colon[1] > '9' || *pend || port == 0 || port > 65535)
                return -EINVAL;
        if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
                return -EINVAL;
        memcpy(&ret->sa, ai->ai_addr, ai->ai_addrlen);
        ret->len = ai->ai_addrlen;
        freeaddrinfo(ai);
        return 0;
}

/* ADDR[/BITS]. */
static int parse_net(const char *s, struct fed_net *ret)
{
        char buf[64];
        const char *slash = strchr(s, '/');
        size_t len = slash ? (size_t)(slash - s) : strlen(s);
        char *end;

        if (len >= sizeof(buf))
                return -EINVAL;
        memcpy(buf, s, len);
        buf[len] = '\0';
        memset(ret, 0, sizeof(*ret));
        if (inet_pton(AF_INET, buf, ret->addr) == 1) {
                ret->family = AF_INET;
                ret->bits = 32;
        } else if (inet_pton(AF_INET6, buf, ret->addr) == 1) {
                ret->family = AF_INET6;
                ret->bits = 128;
        } else {
                return -EINVAL;
        }
        if (slash) {
                unsigned long b = strtoul(slash + 1, &end, 10);
                if (slash[1] < '0' || slash[1] > '9' || *end || b > ret->bits)
                        return -EINVAL;
                ret->bits = (unsigned)b;
        }
        return 0;
}

static int parse_ms(const char *s, uint32_t *ret)
{
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno || end == s || *end || *s == '-' || v == 0 || v > 86400000ul)
                return -EINVAL;
        *ret = (uint32_t)v;
        return 0;
}

static bool alias_valid(const char *a)
{
        size_t n = strlen(a);

        if (n == 0 || n > FED_ALIAS_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if ((unsigned char)a[i] <= ' ' || a[i] == '/' || a[i] == '@' || a[i] == 0x7f ||
                    (unsigned char)a[i] >= 0x80)
                        return false;
        return true;
}

static void usage(FILE *out)
{
        fprintf(out,
                "Usage: dlxfed [OPTIONS]\n"
                "Shares this host's dlx names with peers over UCX, and theirs here: a peer's\n"
                "name N is acquired here as '@<alias>/N', pulled on first want and kept as a\n"
                "read-only mirror with the peer's version number.\n"
                "\n"
                "  -a, --alias NAME          this host's alias, as its peers list it (required)\n"
                "  -L, --listen ADDR:PORT    serve the exported names there (numeric address)\n"
                "  -p, --peer ALIAS=ADDR:PORT  a peer to pull from (repeatable, at most %d)\n"
                "  -e, --export PREFIX       let peers take names starting with PREFIX\n"
                "                            (repeatable; default: nothing is exported)\n"
                "  -f, --follow @ALIAS/PREFIX  pull the peer's names under PREFIX as they are\n"
                "                            published there, and drop them when they go\n"
                "                            (repeatable; default: pull on first want only)\n"
                "  -A, --allow ADDR[/BITS]   accept connections from there only (repeatable;\n"
                "                            default: the peers' addresses)\n"
                "  -k, --secret-file FILE    the shared secret (0600, at least 16 bytes)\n"
                "                            every peer proves it holds (required)\n"
                "  -s, --socket PATH         the local dlxd's socket (default: as dlxctl)\n"
                "  --control PATH            answer dlxctl peers there (default: dlxfed.sock\n"
                "                            next to dlxd's socket, dlxfed-NAME next to one\n"
                "                            named NAME other than dlxd.sock; mode 0660)\n"
                "  -c, --config FILE         read options from FILE: one per line, the long\n"
                "                            name without '--', then its value ('#' comments)\n"
                "  --wait-ms MS              how long a peer waits for a version not there yet\n"
                "                            (default 10000)\n"
                "  --lease-ms MS             how long a peer may take to read what it was\n"
                "                            given (default 60000)\n"
                "  --pull-ms MS              how long a pull may take beyond --wait-ms\n"
                "                            (default 60000)\n"
                "  --allow-ucx-mismatch      talk to peers of another UCX minor version\n"
                "  --require-rdma            refuse a peer reached without RDMA (UCX's\n"
                "                            software-emulated RMA over TCP, say)\n"
                "  -r, --ready-fd N          write one byte to fd N once serving, then close it\n"
                "  -l, --log-level LEVEL     error, warning, notice (default), info or debug\n"
                "  -h, --help                show this help\n"
                "  -V, --version             show the version\n"
                "\n"
                "dlxd must run with --federation-uid set to dlxfed's uid. UCX over TCP\n"
                "protects no memory from its peers: run dlxfed on a network only peers reach,\n"
                "with UCX_TCP_PORT_RANGE pinned, and UCX_NET_DEVICES set.\n",
                FED_MAX_PEERS);
}

enum { OPT_WAIT = 256, OPT_LEASE, OPT_PULL, OPT_MISMATCH, OPT_CONTROL, OPT_RDMA };

static const struct option long_opts[] = {
        {"alias", required_argument, NULL, 'a'},
        {"listen", required_argument, NULL, 'L'},
        {"peer", required_argument, NULL, 'p'},
        {"export", required_argument, NULL, 'e'},
        {"follow", required_argument, NULL, 'f'},
        {"allow", required_argument, NULL, 'A'},
        {"secret-file", required_argument, NULL, 'k'},
        {"socket", required_argument, NULL, 's'},
        {"control", required_argument, NULL, OPT_CONTROL},
        {"config", required_argument, NULL, 'c'},
        {"wait-ms", required_argument, NULL, OPT_WAIT},
        {"lease-ms", required_argument, NULL, OPT_LEASE},
        {"pull-ms", required_argument, NULL, OPT_PULL},
        {"allow-ucx-mismatch", no_argument, NULL, OPT_MISMATCH},
        {"require-rdma", no_argument, NULL, OPT_RDMA},
        {"ready-fd", required_argument, NULL, 'r'},
        {"log-level", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
};

static int read_config(struct fed_config *cfg, const char *path, int depth);

static void config_free(struct fed_config *cfg)
{
        for (unsigned i = 0; i < cfg->nexports; i++)
                free(cfg->exports[i]);
        for (unsigned i = 0; i < cfg->nfollows; i++)
                free(cfg->follows[i]);
        free((char *)cfg->alias);
        free((char *)cfg->listen);
        free((char *)cfg->socket);
        free((char *)cfg->secret_file);
        free((char *)cfg->control);
        memset(cfg, 0, sizeof(*cfg));
}

/* One option: c its key (getopt's), v its value (a copy): 1 when v is kept, 0 or -errno. */
static int take(struct fed_config *cfg, int c, char *v, int depth)
{
        const char *why = NULL;

        switch (c) {
        case 'a':
                if (!alias_valid(v)) {
                        fprintf(stderr,
                                "dlxfed: bad alias '%s' (1-32 printable ASCII bytes, no "
                                "'/' or '@')\n",
                                v);
                        return -EINVAL;
                }
                free((char *)cfg->alias);
                cfg->alias = v;
                return 1;
        case 'L':
                free((char *)cfg->listen);
                cfg->listen = v;
                return 1;
        case 'p': {
                char *eq = strchr(v, '=');
                struct peer *p = &cfg->peers[cfg->npeers];
                if (cfg->npeers >= FED_MAX_PEERS || !eq) {
                        fprintf(stderr, "dlxfed: bad --peer '%s' (ALIAS=ADDR:PORT)\n", v);
                        return -EINVAL;
                }
                *eq = '\0';
                if (!alias_valid(v) || fed_parse_addr(eq + 1, &p->addr) < 0) {
                        fprintf(stderr, "dlxfed: bad --peer '%s=%s' (ALIAS=ADDR:PORT)\n", v,
                                eq + 1);
                        return -EINVAL;
                }
                for (unsigned i = 0; i < cfg->npeers; i++)
                        if (strcmp(cfg->peers[i].alias, v) == 0) {
                                fprintf(stderr, "dlxfed: peer '%s' given twice\n", v);
                                return -EINVAL;
                        }
                snprintf(p->alias, sizeof(p->alias), "%s", v);
                snprintf(p->where, sizeof(p->where), "%s", eq + 1);
                cfg->npeers++;
                return 0;
        }
        case 'e':
                if (cfg->nexports >= FED_MAX_EXPORTS || v[0] == '@' || !v[0] ||
                    layout_prefix_check(v, strlen(v), &why) < 0) {
                        fprintf(stderr, "dlxfed: bad --export '%s'%s\n", v,
                                v[0] == '@' ? ": names under '@' are never exported" : "");
                        return -EINVAL;
                }
                cfg->exports[cfg->nexports++] = v;
                return 1;
        case 'f':
                /* its alias is checked against the peers once all options are read */
                if (cfg->nfollows >= FED_MAX_FOLLOWS || v[0] != '@' || !strchr(v, '/') ||
                    layout_prefix_check(v, strlen(v), &why) < 0) {
                        fprintf(stderr, "dlxfed: bad --follow '%s' (@ALIAS/PREFIX)\n", v);
                        return -EINVAL;
                }
                cfg->follows[cfg->nfollows++] = v;
                return 1;
        case 'A':
                if (cfg->nallow >= FED_MAX_ALLOW || parse_net(v, &cfg->allow[cfg->nallow]) < 0) {
                        fprintf(stderr, "dlxfed: bad --allow '%s' (ADDR[/BITS])\n", v);
                        return -EINVAL;
                }
                cfg->nallow++;
                return 0;
        case 'k':
                free((char *)cfg->secret_file);
                cfg->secret_file = v;
                return 1;
        case 's':
                free((char *)cfg->socket);
                cfg->socket = v;
                return 1;
        case OPT_CONTROL:
                free((char *)cfg->control);
                cfg->control = v;
                return 1;
        case 'c':
                if (depth > 0) {
                        fprintf(stderr, "dlxfed: a config file may not name another\n");
                        return -EINVAL;
                }
                return read_config(cfg, v, depth + 1);
        case OPT_WAIT:
        case OPT_LEASE:
        case OPT_PULL: {
                uint32_t *dst = c == OPT_WAIT    ? &cfg->wait_ms
                                : c == OPT_LEASE ? &cfg->lease_ms
                                                 : &cfg->pull_ms;
                int err = parse_ms(v, dst);
                if (err < 0)
                        fprintf(stderr, "dlxfed: bad milliseconds '%s'\n", v);
                return err;
        }
        case OPT_MISMATCH:
                cfg->allow_ucx_mismatch = true;
                return 0;
        case OPT_RDMA:
                cfg->require_rdma = true;
                return 0;
        case 'r': {
                char *end;
                long fd = strtol(v, &end, 10);
                if (end == v || *end || fd < 0 || fd > 65535) {
                        fprintf(stderr, "dlxfed: bad --ready-fd '%s'\n", v);
                        return -EINVAL;
                }
                cfg->ready_fd = (int)fd;
                return 0;
        }
        case 'l':
                if (strcmp(v, "error") == 0)
                        fed_log_level = FED_ERR;
                else if (strcmp(v, "warning") == 0)
                        fed_log_level = FED_WARN;
                else if (strcmp(v, "notice") == 0)
                        fed_log_level = FED_NOTICE;
                else if (strcmp(v, "info") == 0)
                        fed_log_level = FED_INFO;
                else if (strcmp(v, "debug") == 0)
                        fed_log_level = FED_DEBUG;
                else {
                        fprintf(stderr, "dlxfed: bad --log-level '%s'\n", v);
                        return -EINVAL;
                }
                return 0;
        }
        return -EINVAL;
}

static int apply(struct fed_config *cfg, int c, const char *arg, int depth)
{
        char *v = arg ? strdup(arg) : NULL;
        int r;

        if (arg && !v)
                return -ENOMEM;
        r = take(cfg, c, v, depth);
        if (r != 1)
                free(v);
        return r < 0 ? r : 0;
}

static int read_config(struct fed_config *cfg, const char *path, int depth)
{
        FILE *in = fopen(path, "re");
        char line[1024];
        unsigned n = 0;
        int err = 0;

        if (!in) {
                fprintf(stderr, "dlxfed: cannot read %s: %s\n", path, strerror(errno));
                return -errno;
        }
        while (err == 0 && fgets(line, sizeof(line), in)) {
                char *key = line, *val, *end;
                const struct option *o;

                n++;
                key += strspn(key, " \t");
                /* '#' starts a comment at the line's start or after white space: a name may hold
                 * one */
                end = key;
                while (*end && *end != '\r' && *end != '\n' &&
                       !(*end == '#' && (end == key || end[-1] == ' ' || end[-1] == '\t')))
                        end++;
                while (end > key && (end[-1] == ' ' || end[-1] == '\t'))
                        end--;
                *end = '\0';
                if (!*key)
                        continue;
                val = key + strcspn(key, " \t=");
                if (*val) {
                        *val++ = '\0';
                        val += strspn(val, " \t=");
                }
                for (o = long_opts; o->name && strcmp(o->name, key) != 0; o++)
                        ;
                if (!o->name || o->val == 'h' || o->val == 'V' ||
                    (o->has_arg == required_argument && !*val) ||
                    (o->has_arg == no_argument && *val)) {
                        fprintf(stderr, "dlxfed: %s:%u: bad line '%s'\n", path, n, key);
                        err = -EINVAL;
                        break;
                }
                err = apply(cfg, o->val, o->has_arg ? val : NULL, depth);
                if (err < 0)
                        fprintf(stderr, "dlxfed: %s:%u: in this line\n", path, n);
        }
        fclose(in);
        return err;
}

/* The secret: a regular file of ours, 0600 or stricter, 16 to 256 bytes (a last newline dropped).
 */
static int load_secret(struct fed *f)
{
        struct stat st;
        ssize_t n;
        int fd = open(f->cfg.secret_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

        if (fd < 0 || fstat(fd, &st) < 0) {
                fprintf(stderr, "dlxfed: cannot read the secret %s: %s\n", f->cfg.secret_file,
                        strerror(errno));
                if (fd >= 0)
                        close(fd);
                return -errno;
        }
        if (!S_ISREG(st.st_mode) || (st.st_mode & 077) || st.st_uid != geteuid()) {
                fprintf(stderr,
                        "dlxfed: the secret %s must be a file of this user's, mode 0600 or "
                        "stricter\n",
                        f->cfg.secret_file);
                close(fd);
                return -EACCES;
        }
        n = read(fd, f->secret, sizeof(f->secret));
        close(fd);
        if (n > 0 && f->secret[n - 1] == '\n')
                n--;
        if (n < 16 || n >= (ssize_t)sizeof(f->secret)) {
                fprintf(stderr, "dlxfed: the secret %s must hold 16 to 255 bytes\n",
                        f->cfg.secret_file);
                return -EINVAL;
        }
        f->secret_len = (size_t)n;
        return 0;
}

/* ---- the local dlxd ---- */

static void mount_all(struct fed *f)
{
        for (unsigned i = 0; i < f->cfg.npeers; i++) {
                char prefix[FED_ALIAS_MAX + 3];
                snprintf(prefix, sizeof(prefix), "@%s/", f->cfg.peers[i].alias);
                int err = dlx_mount(f->dlx, prefix);
                if (err < 0)
                        fed_log(FED_ERR, "cannot mount %s: %s", prefix, dlx_last_error());
        }
}

static void stop(struct fed *f);

static void on_dlx(uv_poll_t *h, int status, int events)
{
        struct fed *f = h->data;
        struct dlx_event ev;
        int n;

        (void)status;
        (void)events;
        n = dlx_process_events(f->dlx);
        if (n < 0) {
                fed_log(FED_ERR, "the local dlxd went away: %s", dlx_strerror(n));
                f->dlxd_lost = true; /* a failure: a service manager restarts it */
                stop(f);
                return;
        }
        while (!f->stopping && dlx_next_event(f->dlx, &ev, 0) == 0) {
                if (ev.kind == DLX_EVENT_WANTED) {
                        fed_import_wanted(f, ev.name, ev.version);
                        continue;
                }
                if (ev.kind == DLX_EVENT_LOST)
                        mount_all(f);     /* hear of every waiting acquire again */
                fed_export_event(f, &ev); /* peers' follows */
        }
}

static uv_signal_t sigint_h, sigterm_h;

static void stop(struct fed *f)
{
        if (f->stopping)
                return;
        fed_log(FED_NOTICE, "stopping");
        fed_control_stop(f);
        fed_follow_stop(f);
        fed_import_stop(f);
        fed_ucx_stop(f);
        uv_poll_stop(&f->dlx_poll);
        uv_close((uv_handle_t *)&f->dlx_poll, NULL);
        /* lookups waiting on the thread pool end now, not at their peers' leisure */
        dlx_close(f->dlx);
        f->dlx = NULL;
        uv_close((uv_handle_t *)&sigint_h, NULL);
        uv_close((uv_handle_t *)&sigterm_h, NULL);
}

static void on_signal(uv_signal_t *h, int signum)
{
        (void)signum;
        stop(h->data);
}

static struct fed f;

/* Everything but freeing the configuration, which main() does on every path. */
static int run(int argc, char **argv)
{
        uv_loop_t loop;
        int c, err;

        f.cfg.wait_ms = 10000;
        f.cfg.lease_ms = 60000;
        f.cfg.pull_ms = 60000;
        f.cfg.ready_fd = -1;
        while ((c = getopt_long(argc, argv, "a:L:p:e:f:A:k:s:c:r:l:hV", long_opts, NULL)) != -1) {
                if (c == 'h') {
                        usage(stdout);
                        return 0;
                }
                if (c == 'V') {
                        unsigned a, b, r;
                        ucp_get_version(&a, &b, &r);
                        printf("dlxfed %s (protocol %d.%d, UCX %u.%u.%u)\n", DLX_VERSION,
                               FED_PROTO_MAJOR, FED_PROTO_MINOR, a, b, r);
                        return 0;
                }
                if (c == '?' || apply(&f.cfg, c, optarg, 0) < 0) {
                        if (c == '?')
                                usage(stderr);
                        return 2;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "dlxfed: unexpected argument '%s'\n", argv[optind]);
                return 2;
        }
        if (!f.cfg.alias || !f.cfg.secret_file) {
                fprintf(stderr, "dlxfed: --alias and --secret-file are required (see --help)\n");
                return 2;
        }
        for (unsigned i = 0; i < f.cfg.nfollows; i++)
                if (!fed_peer_of(&f.cfg, f.cfg.follows[i])) {
                        fprintf(stderr, "dlxfed: --follow '%s': its alias is not a --peer\n",
                                f.cfg.follows[i]);
                        return 2;
                }
        if (load_secret(&f) < 0)
                return 1;
        signal(SIGPIPE, SIG_IGN);

        struct dlx_connect_options co = {.socket_path = f.cfg.socket, .client_name = "dlxfed"};
        err = dlx_connect(&co, &f.dlx);
        if (err < 0) {
                fprintf(stderr, "dlxfed: cannot connect to dlxd: %s\n", dlx_last_error());
                return 1;
        }
        for (unsigned i = 0; i < f.cfg.npeers; i++) {
                char prefix[FED_ALIAS_MAX + 3];
                snprintf(prefix, sizeof(prefix), "@%s/", f.cfg.peers[i].alias);
                err = dlx_mount(f.dlx, prefix);
                if (err < 0) {
                        fprintf(stderr, "dlxfed: cannot mount %s: %s\n", prefix, dlx_last_error());
                        dlx_close(f.dlx);
                        return 1;
                }
        }
        /* lookups that wait for a version take a thread each (exporter.c) */
        setenv("UV_THREADPOOL_SIZE", FED_THREADPOOL, 0);
        uv_loop_init(&loop);
        f.loop = &loop;
        list_init(&f.conns);
        list_init(&f.closing);
        list_init(&f.wants);
        list_init(&f.leases);
        list_init(&f.waitings);
        list_init(&f.follows);
        list_init(&f.eager);
        list_init(&f.rfollows);
        uv_timer_init(&loop, &f.eager_timer);
        f.eager_timer.data = &f;
        err = fed_control_start(&f);
        if (err < 0) {
                /* nothing of UCX's yet: what there is closes, and the loop with it */
                fed_control_stop(&f);
                uv_close((uv_handle_t *)&f.eager_timer, NULL);
                dlx_close(f.dlx);
                uv_run(&loop, UV_RUN_DEFAULT);
                uv_loop_close(&loop);
                return 1;
        }
        if ((err = fed_ucx_start(&f)) < 0) {
                fed_control_stop(&f);
                dlx_close(f.dlx);
                return 1;
        }
        uv_poll_init(&loop, &f.dlx_poll, dlx_fd(f.dlx));
        f.dlx_poll.data = &f;
        uv_poll_start(&f.dlx_poll, UV_READABLE, on_dlx);
        uv_signal_init(&loop, &sigint_h);
        uv_signal_init(&loop, &sigterm_h);
        sigint_h.data = sigterm_h.data = &f;
        uv_signal_start(&sigint_h, on_signal, SIGINT);
        uv_signal_start(&sigterm_h, on_signal, SIGTERM);
        fed_log(FED_NOTICE, "'%s' %s%s, %u peers, %u exported prefixes, UCX %u.%u.%u", f.cfg.alias,
                f.cfg.listen ? "listening on " : "not listening", f.cfg.listen ? f.cfg.listen : "",
                f.cfg.npeers, f.cfg.nexports, f.ucx_major, f.ucx_minor, f.ucx_release);
        if (f.cfg.ready_fd >= 0) {
                (void)!write(f.cfg.ready_fd, "R", 1);
                close(f.cfg.ready_fd);
        }
        fed_follow_start(&f);
        /* a want that came before the poll started */
        on_dlx(&f.dlx_poll, 0, 0);
        uv_run(&loop, UV_RUN_DEFAULT);
        if (f.listen_failed) {
                stop(&f);
                err = -EADDRINUSE;
        }
        if (f.dlxd_lost)
                err = -ECONNRESET;
        if (f.dlx)
                dlx_close(f.dlx);
        uv_run(&loop, UV_RUN_DEFAULT);
        int closed = uv_loop_close(&loop);
        fed_log(FED_NOTICE, "stopped");
        return closed < 0 || err < 0 ? 1 : 0;
}

/*
 * dlxfed's UCX defaults, for what the environment does not say: TCP
 * segments of 256 KiB (UCX's own are 8 KiB sent and 64 KiB received: as
 * good on loopback here, measured at half a stream by the design study on
 * faster links), and no signal handlers of UCX's
 * (the process's signals are its own). UCX takes its transports' settings
 * from the environment (ucp_config_modify() leaves them unused: UCX warns
 * "invalid configuration"), and its signal handlers at load, before main():
 * so they go into the environment, and dlxfed runs itself again with it.
 */
static void fed_env_defaults(char **argv)
{
        static const char *const defaults[][2] = {
                {"UCX_TCP_TX_SEG_SIZE", "256k"},
                {"UCX_TCP_RX_SEG_SIZE", "256k"},
                {"UCX_ERROR_SIGNALS", ""},
        };
        bool all = true;

        for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
                if (!getenv(defaults[i][0])) {
                        setenv(defaults[i][0], defaults[i][1], 0);
                        all = false;
                }
        if (!all)
                execv("/proc/self/exe", argv); /* failing that, UCX's own defaults */
}

int main(int argc, char **argv)
{
        int rc;

        fed_env_defaults(argv);
        rc = run(argc, argv);

        config_free(&f.cfg);
        return rc;
}
