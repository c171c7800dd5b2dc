/* SPDX-License-Identifier: MIT */
/* dlxd: arguments, signals and the loop. Everything else lives in server/registry/store. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <uv.h>

#include "log.h"
#include "registry.h"
#include "server.h"
#include "service.h"
#include "sockpath.h"
#include "units.h"
#include "store.h"

/* Descriptors one connection may hold in the daemon: its socket, a release ring on its way,
 * what its frames bring. */
#define CONN_FDS (2 + DLX_MAX_FDS_QUEUED)

struct daemon {
        uv_loop_t loop;
        uv_signal_t sigint, sigterm;
        struct server srv;
        struct registry reg;
        struct store store;
        struct service service;
};

/* The limits, each an option: --NAME VALUE, 0 meaning none. */
struct limit_opt {
        const char *name;
        const char *arg; /* "N", "SIZE" (suffixes K, M, G, T), "MS", or "N|fair" */
        size_t off;      /* in struct wire_limit_set */
        size_t width;    /* 4 or 8 bytes */
        const char *help;
};

#define LIMIT(field, arg, help)                                                                    \
        {                                                                                          \
#field, arg, offsetof(struct wire_limit_set, field),                               \
                        sizeof(((struct wire_limit_set *)0)->field), help                          \
        }

static const struct limit_opt limit_opts[] = {
        LIMIT(max_clients, "N", "connected clients"),
        LIMIT(max_clients_per_uid, "N|fair", "connected clients of one uid"),
        LIMIT(max_bytes, "SIZE", "shared bytes held (memfds dlxd keeps)"),
        LIMIT(max_bytes_per_uid, "SIZE", "shared bytes held for one uid"),
        LIMIT(max_names, "N", "published names"),
        LIMIT(max_names_per_uid, "N|fair", "published names one uid owns"),
        LIMIT(max_leases, "N", "leases one client holds at once"),
        LIMIT(max_watches, "N", "watches of one client"),
        LIMIT(max_fds, "N", "descriptors held for segments"),
        LIMIT(max_fds_per_uid, "N|fair", "descriptors held for the segments of one uid"),
        LIMIT(max_group_members, "N", "members of one group (0 or over 1048576: 1048576)"),
        LIMIT(max_group_table, "SIZE",
              "bytes of one group's table: its members' names and layouts, padded to 4 KiB"),
        LIMIT(max_queued, "SIZE",
              "output queued for a client before its requests wait (and its watch events "
              "are dropped)"),
        LIMIT(timeout_ms, "MS",
              "for hello, a started frame, and a client that reads nothing while an answer "
              "it asked for waits"),
};
#define NLIMITS (sizeof(limit_opts) / sizeof(limit_opts[0]))
/* getopt values of the limit options, and of the long options without a letter */
#define LIMIT_KEY 256
#define CUDA_DEVICE_KEY (LIMIT_KEY + 128)
#define FEDERATION_UID_KEY (LIMIT_KEY + 129)
#define METRICS_FILE_KEY (LIMIT_KEY + 130)
#define METRICS_INTERVAL_KEY (LIMIT_KEY + 131)
/* The metrics file is rewritten this often by default, and at most this often (seconds). */
#define METRICS_INTERVAL_DEFAULT 15
#define METRICS_INTERVAL_MAX 86400

static uint64_t limit_get(const struct wire_limit_set *lim, const struct limit_opt *o)
{
        const char *p = (const char *)lim + o->off;

        return o->width == 8 ? *(const uint64_t *)p : *(const uint32_t *)p;
}

static void limit_put(struct wire_limit_set *lim, const struct limit_opt *o, uint64_t v)
{
        char *p = (char *)lim + o->off;

        if (o->width == 8)
                *(uint64_t *)p = v;
        else
                *(uint32_t *)p = (uint32_t)v;
}

/* --max-bytes-per-uid from max_bytes_per_uid */
static void option_name(const struct limit_opt *o, char *buf, size_t len)
{
        snprintf(buf, len, "%s", o->name);
        for (char *c = buf; *c; c++)
                if (*c == '_')
                        *c = '-';
}

/* A per-uid limit whose default is the uid's fair share ("fair"). */
static bool is_fair(const struct limit_opt *o)
{
        return strcmp(o->arg, "N|fair") == 0;
}

static void usage(FILE *f)
{
        struct wire_limit_set def;

        registry_default_limits(&def);
        fprintf(f,
                "Usage: dlxd [OPTIONS]\n"
                "Keeps a namespace of named, versioned tensors shared between processes.\n"
                "\n"
                "  -s, --socket PATH      listen on PATH (default: $DLX_SOCKET, else\n"
                "                         $XDG_RUNTIME_DIR/dlx/dlxd.sock, else "
                "/tmp/dlx-$UID/dlxd.sock)\n"
                "  -r, --ready-fd N       write one byte to fd N once listening, then close it\n"
                "  -l, --log-level LEVEL  error, warning, notice (default), info or debug\n"
                "  -g, --group GROUP      share with GROUP (name or gid): socket 0660, its\n"
                "                         members may connect; names stay writable only by\n"
                "                         their owner (default: private to this uid)\n"
                "  --cuda-device-number MAJOR:MINOR\n"
                "                         the character device every cuda-vmm fd must be a\n"
                "                         file of (default %u:%u, /dev/nvidiactl: NVIDIA's\n"
                "                         export); for drivers or test doubles that export\n"
                "                         through another device\n"
                "  --federation-uid USER  the uid (name or number) of this host's federation\n"
                "                         bridge, dlxfed: it alone mounts '@<alias>/'\n"
                "                         prefixes and publishes peers' names there\n"
                "                         (default: none; no name under '@' is published)\n"
                "  --metrics-file PATH    keep the metrics (what dlxctl stats --prometheus\n"
                "                         prints, every uid's) in PATH, in the Prometheus\n"
                "                         text format, rewritten atomically every interval\n"
                "                         and removed at exit; for node_exporter's textfile\n"
                "                         collector, name it *.prom (default: none)\n"
                "  --metrics-interval SECONDS\n"
                "                         how often the metrics file is rewritten, 1 to %d\n"
                "                         (default %d)\n"
                "  -b SIZE                the same as --max-bytes\n"
                "  -c N                   the same as --max-clients\n"
                "  -h, --help             show this help\n"
                "  -V, --version          show the version\n"
                "\n"
                "Limits (0: none; dlxctl stats shows them):\n",
                STORE_VMM_MAJOR, STORE_VMM_MINOR, METRICS_INTERVAL_MAX, METRICS_INTERVAL_DEFAULT);
        for (size_t i = 0; i < NLIMITS; i++) {
                char opt[64], left[96];
                option_name(&limit_opts[i], opt, sizeof(opt));
                snprintf(left, sizeof(left), "--%s %s", opt, limit_opts[i].arg);
                if (is_fair(&limit_opts[i]))
                        fprintf(f, "  %-30s %s (default: fair)\n", left, limit_opts[i].help);
                else if (limit_get(&def, &limit_opts[i]) == DLX_FDS_AUTO)
                        fprintf(f, "  %-30s %s (default: from the descriptor limit)\n", left,
                                limit_opts[i].help);
                else
                        fprintf(f, "  %-30s %s (default %llu)\n", left, limit_opts[i].help,
                                (unsigned long long)limit_get(&def, &limit_opts[i]));
        }
        fprintf(f,
                "\nBy default the daemon keeps 64 descriptors and %d per --max-clients for\n"
                "itself and its connections and gives the rest (at least half the limit) to\n"
                "segments. A per-uid limit set to 'fair' (the default) is a uid's fair share\n"
                "of the limit in all: 7/8 of what the other uids leave of --max-clients or\n"
                "--max-names (all of a limit under 8), half of what they leave of --max-fds.\n"
                "Of what all clients may leave queued (16 x --max-queued) and of the\n"
                "descriptors they may have unread (half the limit), a uid gets at most half\n"
                "of what the others leave.\n"
                "\n"
                "Under systemd: with socket activation dlxd takes the one listening AF_UNIX\n"
                "stream socket it is passed (and refuses any other) instead of --socket;\n"
                "with Type=notify it reports READY=1, a STATUS= line (names, clients, bytes\n"
                "held), STOPPING=1, and watchdog keep-alives when WatchdogSec= is set; under\n"
                "journald each log line carries its priority (\"<N>\").\n",
                CONN_FDS);
}

/*
 * Descriptors for segments: what the descriptor limit leaves beside the
 * daemon's own (among them those of destroyed segments still being
 * closed, at most STORE_DEFER_MAX) and its connections' (a socket, a release
 * ring on its way, what a frame brings), so that no client can take the
 * table from connecting at all (a uid's fair share of it keeps it from the
 * others).
 */
static void derive_fd_limits(struct wire_limit_set *lim)
{
        uint64_t nofile = 1u << 20, reserve;
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                nofile = rl.rlim_cur;
        reserve =
                DAEMON_OWN_FDS + CONN_FDS * (uint64_t)(lim->max_clients ? lim->max_clients
                                                                        : DLX_DEFAULT_MAX_CLIENTS);
        if (lim->max_fds == DLX_FDS_AUTO) {
                lim->max_fds = nofile >= 2 * reserve ? nofile - reserve : nofile / 2;
                if (nofile < 2 * reserve)
                        log_warn("a descriptor limit of %llu leaves little room for %u clients: "
                                 "segments get %llu descriptors",
                                 (unsigned long long)nofile, lim->max_clients,
                                 (unsigned long long)lim->max_fds);
        }
}

static int parse_uint(const char *s, unsigned long max, unsigned long *ret)
{
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno || end == s || *end || *s == '-' || v > max)
                return -EINVAL;
        *ret = v;
        return 0;
}

/* A user (user: true) or a group by name, or by number. */
static int parse_id(const char *s, bool user, uint32_t *ret)
{
        struct passwd *pw = user ? getpwnam(s) : NULL;
        struct group *gr = user ? NULL : getgrnam(s);
        unsigned long n;

        if (pw || gr) {
                *ret = pw ? (uint32_t)pw->pw_uid : (uint32_t)gr->gr_gid;
                return 0;
        }
        if (parse_uint(s, UINT32_MAX - 1, &n) < 0)
                return -ENOENT;
        *ret = (uint32_t)n;
        return 0;
}

/* MAJOR:MINOR, each within what a Linux dev_t holds (12 and 20 bits). */
static int parse_device(const char *s, dev_t *ret)
{
        const char *colon = strchr(s, ':');
        unsigned long maj, min;
        char buf[32];

        if (!colon || (size_t)(colon - s) >= sizeof(buf))
                return -EINVAL;
        memcpy(buf, s, (size_t)(colon - s));
        buf[colon - s] = '\0';
        if (parse_uint(buf, 4095, &maj) < 0 || parse_uint(colon + 1, (1ul << 20) - 1, &min) < 0)
                return -EINVAL;
        *ret = makedev(maj, min);
        return 0;
}

static size_t limit_index(const char *name)
{
        size_t i = 0;

        while (strcmp(limit_opts[i].name, name) != 0)
                i++;
        return i;
}

/* Limit i from its option's argument: a count or milliseconds within its width, or a size. */
static int set_limit(struct wire_limit_set *lim, size_t i, const char *arg)
{
        const struct limit_opt *o = &limit_opts[i];
        unsigned long n = 0;
        uint64_t v = 0;
        int err;

        if (strcmp(o->arg, "SIZE") == 0) {
                err = units_parse_size(arg, &v);
        } else if (is_fair(o) && strcmp(arg, "fair") == 0) {
                err = 0;
                v = o->width == 8 ? DLX_LIMIT_FAIR : DLX_LIMIT_FAIR32;
        } else {
                /* the largest value of each width means "fair": one short of it is the most */
                err = parse_uint(arg, o->width == 8 ? ULONG_MAX - 1 : UINT32_MAX - 1, &n);
                v = n;
        }
        if (err < 0) {
                char name[64];
                option_name(o, name, sizeof(name));
                log_say(LOG_ERR, "bad --%s '%s'", name, arg);
                return err;
        }
        limit_put(lim, o, v);
        return 0;
}

static void stop_signals(struct daemon *d)
{
        uv_signal_stop(&d->sigint);
        uv_signal_stop(&d->sigterm);
        uv_close((uv_handle_t *)&d->sigint, NULL);
        uv_close((uv_handle_t *)&d->sigterm, NULL);
}

static void on_signal(uv_signal_t *h, int signum)
{
        struct daemon *d = h->data;

        log_notice("%s: stopping", strsignal(signum));
        service_stop(&d->service);
        server_stop(&d->srv);
        stop_signals(d);
}

static void on_leftover(uv_handle_t *h, void *arg)
{
        (void)arg;
        log_err("a %s handle is still open at exit%s", uv_handle_type_name(uv_handle_get_type(h)),
                uv_is_closing(h) ? " (closing)" : "");
}

/*
 * Frees the registry and the store, runs the close callbacks they caused, and
 * closes the loop. A handle left open is a leak: it is named and the exit
 * status says so, so that the tests (which check dlxd exits 0) notice.
 */
static int finish(struct daemon *d, int status)
{
        int err;

        registry_done(&d->reg);
        store_done(&d->store);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        err = uv_loop_close(&d->loop);
        if (err < 0) {
                uv_walk(&d->loop, on_leftover, NULL);
                log_err("the event loop did not close cleanly: %s", uv_strerror(err));
                return 1;
        }
        if (status == 0)
                log_notice("stopped");
        return status;
}

int main(int argc, char **argv)
{
        static const struct option fixed[] = {
                {"socket", required_argument, NULL, 's'},
                {"ready-fd", required_argument, NULL, 'r'},
                {"log-level", required_argument, NULL, 'l'},
                {"group", required_argument, NULL, 'g'},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, 'V'},
                {"cuda-device-number", required_argument, NULL, CUDA_DEVICE_KEY},
                {"federation-uid", required_argument, NULL, FEDERATION_UID_KEY},
                {"metrics-file", required_argument, NULL, METRICS_FILE_KEY},
                {"metrics-interval", required_argument, NULL, METRICS_INTERVAL_KEY},
        };
        enum { NFIXED = sizeof(fixed) / sizeof(fixed[0]) };
        static struct option opts[NFIXED + NLIMITS + 1];
        static char names[NLIMITS][64];
        const char *socket_opt = NULL, *metrics_file = NULL;
        unsigned long metrics_interval = METRICS_INTERVAL_DEFAULT;
        int inherited = -1;
        char path[108];
        struct wire_limit_set lim;
        unsigned long ready_fd = 0;
        bool have_ready = false, shared = false, federation = false;
        uint32_t federation_uid = 0;
        uint32_t group = 0;
        dev_t vmm_dev = makedev(STORE_VMM_MAJOR, STORE_VMM_MINOR);
        struct daemon d;
        int c, err;

        log_init();
        registry_default_limits(&lim);
        memcpy(opts, fixed, sizeof(fixed));
        for (size_t i = 0; i < NLIMITS; i++) {
                option_name(&limit_opts[i], names[i], sizeof(names[i]));
                opts[NFIXED + i] =
                        (struct option){names[i], required_argument, NULL, LIMIT_KEY + (int)i};
        }
        while ((c = getopt_long(argc, argv, "s:r:l:g:b:c:hV", opts, NULL)) != -1) {
                switch (c) {
                case 's':
                        socket_opt = optarg;
                        break;
                case 'r':
                        if (parse_uint(optarg, 1u << 20, &ready_fd) < 0) {
                                log_say(LOG_ERR, "bad --ready-fd '%s'", optarg);
                                return 2;
                        }
                        have_ready = true;
                        break;
                case 'l':
                        if ((log_level = log_parse_level(optarg)) < 0) {
                                log_say(LOG_ERR, "bad --log-level '%s'", optarg);
                                return 2;
                        }
                        break;
                case 'g':
                        if (parse_id(optarg, false, &group) < 0) {
                                log_say(LOG_ERR, "no group '%s'", optarg);
                                return 2;
                        }
                        shared = true;
                        break;
                case 'b':
                        if (set_limit(&lim, limit_index("max_bytes"), optarg) < 0)
                                return 2;
                        break;
                case 'c':
                        if (set_limit(&lim, limit_index("max_clients"), optarg) < 0)
                                return 2;
                        break;
                case CUDA_DEVICE_KEY:
                        if (parse_device(optarg, &vmm_dev) < 0) {
                                log_say(LOG_ERR,
                                        "bad --cuda-device-number '%s' (MAJOR:MINOR, "
                                        "e.g. %u:%u)",
                                        optarg, STORE_VMM_MAJOR, STORE_VMM_MINOR);
                                return 2;
                        }
                        break;
                case FEDERATION_UID_KEY:
                        if (parse_id(optarg, true, &federation_uid) < 0) {
                                log_say(LOG_ERR, "no user '%s'", optarg);
                                return 2;
                        }
                        federation = true;
                        break;
                case METRICS_FILE_KEY:
                        if (!*optarg) {
                                log_say(LOG_ERR, "--metrics-file needs a path");
                                return 2;
                        }
                        metrics_file = optarg;
                        break;
                case METRICS_INTERVAL_KEY:
                        if (parse_uint(optarg, METRICS_INTERVAL_MAX, &metrics_interval) < 0 ||
                            metrics_interval == 0) {
                                log_say(LOG_ERR, "bad --metrics-interval '%s' (seconds, 1 to %d)",
                                        optarg, METRICS_INTERVAL_MAX);
                                return 2;
                        }
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                case 'V':
                        printf("dlxd %s (protocol %d.%d)\n", DLX_VERSION, DLX_PROTO_MAJOR,
                               DLX_PROTO_MINOR);
                        return 0;
                default:
                        if (c >= LIMIT_KEY && c < LIMIT_KEY + (int)NLIMITS) {
                                if (set_limit(&lim, (size_t)(c - LIMIT_KEY), optarg) < 0)
                                        return 2;
                                break;
                        }
                        usage(stderr);
                        return 2;
                }
        }
        if (optind < argc) {
                log_say(LOG_ERR, "unexpected argument '%s'", argv[optind]);
                usage(stderr);
                return 2;
        }
        if (service_listen_fd(&inherited) < 0)
                return 1;
        if (inherited < 0 && sockpath_resolve(socket_opt, path, sizeof(path)) < 0) {
                log_say(LOG_ERR, "socket path too long");
                return 1;
        }

        signal(SIGPIPE, SIG_IGN);
        /* every segment and client costs a descriptor: take all the hard limit allows */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                setrlimit(RLIMIT_NOFILE, &rl);
        }
        derive_fd_limits(&lim);
        memset(&d, 0, sizeof(d));
        err = uv_loop_init(&d.loop);
        if (err < 0) {
                log_say(LOG_ERR, "cannot create the event loop: %s", uv_strerror(err));
                return 1;
        }
        store_init(&d.store);
        d.store.vmm_dev = vmm_dev;
        registry_init(&d.reg, &d.loop, &d.store, &lim);
        d.reg.federation = federation;
        d.reg.federation_uid = federation_uid;
        /*
         * The signals are watched before the socket exists: a SIGTERM from
         * then on stops dlxd through on_signal() (once the loop runs), which
         * removes the socket, instead of killing it with the file left.
         */
        err = uv_signal_init(&d.loop, &d.sigint);
        if (err == 0) {
                err = uv_signal_init(&d.loop, &d.sigterm);
                if (err < 0)
                        uv_close((uv_handle_t *)&d.sigint, NULL);
        }
        if (err == 0) {
                d.sigint.data = d.sigterm.data = &d;
                err = uv_signal_start(&d.sigint, on_signal, SIGINT);
                if (err == 0)
                        err = uv_signal_start(&d.sigterm, on_signal, SIGTERM);
                if (err < 0) {
                        uv_close((uv_handle_t *)&d.sigint, NULL);
                        uv_close((uv_handle_t *)&d.sigterm, NULL);
                }
        }
        if (err < 0) {
                log_say(LOG_ERR, "cannot watch SIGINT and SIGTERM: %s", uv_strerror(err));
                return finish(&d, 1);
        }
        if (inherited >= 0) {
                err = server_adopt(&d.srv, &d.loop, &d.reg, inherited, shared, group);
                snprintf(path, sizeof(path), "%s", d.srv.path);
                if (socket_opt)
                        log_notice("listening on the socket systemd passed, not --socket %s",
                                   socket_opt);
        } else {
                err = server_start(&d.srv, &d.loop, &d.reg, path, shared, group);
        }
        if (err < 0) {
                log_say(LOG_ERR, "cannot start on %s: %s", path, strerror(-err));
                stop_signals(&d);
                return finish(&d, 1);
        }
        err = service_start(&d.service, &d.loop, &d.reg, metrics_file,
                            (uint64_t)metrics_interval * 1000);
        if (err < 0) {
                stop_signals(&d);
                server_stop(&d.srv);
                return finish(&d, 1);
        }

        if (shared)
                log_notice("listening on %s, shared with group %u (max %u clients, max bytes %llu)",
                           path, (unsigned)group, lim.max_clients,
                           (unsigned long long)lim.max_bytes);
        else
                log_notice("listening on %s (max %u clients, max bytes %llu)", path,
                           lim.max_clients, (unsigned long long)lim.max_bytes);
        if (federation)
                log_notice("uid %u may mount federation prefixes ('@<alias>/')",
                           (unsigned)federation_uid);
        if (vmm_dev != makedev(STORE_VMM_MAJOR, STORE_VMM_MINOR))
                log_notice("cuda-vmm fds must be files of character device %u:%u, not "
                           "/dev/nvidiactl",
                           major(vmm_dev), minor(vmm_dev));
        if (metrics_file)
                log_notice("metrics in %s, every %lu s", metrics_file, metrics_interval);
        service_ready(&d.service);
        if (have_ready) {
                (void)!write((int)ready_fd, "R", 1);
                close((int)ready_fd);
        }

        uv_run(&d.loop, UV_RUN_DEFAULT);
        return finish(&d, 0);
}
