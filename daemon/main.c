/* SPDX-License-Identifier: MIT */
/* dlxd: arguments, signals and the loop. Everything else lives in server/registry/store. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include "log.h"
#include "registry.h"
#include "server.h"
#include "sockpath.h"
#include "units.h"
#include "store.h"

#define DEFAULT_MAX_CLIENTS 1024

struct daemon {
        uv_loop_t loop;
        uv_signal_t sigint, sigterm;
        struct server srv;
        struct registry reg;
        struct store store;
};

static void usage(FILE *f)
{
        fprintf(f,
                "Usage: dlxd [OPTIONS]\n"
                "Keeps a namespace of named, versioned tensors shared between processes.\n"
                "\n"
                "  -s, --socket PATH      listen on PATH (default: $DLX_SOCKET, else\n"
                "                         $XDG_RUNTIME_DIR/dlx/dlxd.sock, else "
                "/tmp/dlx-$UID/dlxd.sock)\n"
                "  -r, --ready-fd N       write one byte to fd N once listening, then close it\n"
                "  -l, --log-level LEVEL  error, warning, notice (default), info or debug\n"
                "  -b, --max-bytes SIZE   limit on shared bytes held (suffixes K, M, G, T; 0: "
                "none)\n"
                "  -c, --max-clients N    limit on connected clients (default %d; 0: none)\n"
                "  -h, --help             show this help\n"
                "  -V, --version          show the version\n",
                DEFAULT_MAX_CLIENTS);
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

static void on_signal(uv_signal_t *h, int signum)
{
        struct daemon *d = h->data;

        log_notice("%s: stopping", strsignal(signum));
        server_stop(&d->srv);
        uv_signal_stop(&d->sigint);
        uv_signal_stop(&d->sigterm);
        uv_close((uv_handle_t *)&d->sigint, NULL);
        uv_close((uv_handle_t *)&d->sigterm, NULL);
}

int main(int argc, char **argv)
{
        static const struct option opts[] = {
                {"socket", required_argument, NULL, 's'},
                {"ready-fd", required_argument, NULL, 'r'},
                {"log-level", required_argument, NULL, 'l'},
                {"max-bytes", required_argument, NULL, 'b'},
                {"max-clients", required_argument, NULL, 'c'},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, 'V'},
                {0},
        };
        const char *socket_opt = NULL;
        char path[108];
        uint64_t max_bytes = 0;
        unsigned long max_clients = DEFAULT_MAX_CLIENTS, ready_fd = 0;
        bool have_ready = false;
        struct daemon d;
        int c, err;

        while ((c = getopt_long(argc, argv, "s:r:l:b:c:hV", opts, NULL)) != -1) {
                switch (c) {
                case 's':
                        socket_opt = optarg;
                        break;
                case 'r':
                        if (parse_uint(optarg, 1u << 20, &ready_fd) < 0) {
                                fprintf(stderr, "dlxd: bad --ready-fd '%s'\n", optarg);
                                return 2;
                        }
                        have_ready = true;
                        break;
                case 'l':
                        if ((log_level = log_parse_level(optarg)) < 0) {
                                fprintf(stderr, "dlxd: bad --log-level '%s'\n", optarg);
                                return 2;
                        }
                        break;
                case 'b':
                        if (units_parse_size(optarg, &max_bytes) < 0) {
                                fprintf(stderr, "dlxd: bad --max-bytes '%s'\n", optarg);
                                return 2;
                        }
                        break;
                case 'c':
                        if (parse_uint(optarg, 1u << 20, &max_clients) < 0) {
                                fprintf(stderr, "dlxd: bad --max-clients '%s'\n", optarg);
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
                        usage(stderr);
                        return 2;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "dlxd: unexpected argument '%s'\n", argv[optind]);
                usage(stderr);
                return 2;
        }
        if (sockpath_resolve(socket_opt, path, sizeof(path)) < 0) {
                fprintf(stderr, "dlxd: socket path too long\n");
                return 1;
        }

        signal(SIGPIPE, SIG_IGN);
        /* every segment and client costs a descriptor: take all the hard limit allows */
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                setrlimit(RLIMIT_NOFILE, &rl);
        }
        memset(&d, 0, sizeof(d));
        uv_loop_init(&d.loop);
        store_init(&d.store, max_bytes);
        registry_init(&d.reg, &d.loop, &d.store, (unsigned)max_clients);
        err = server_start(&d.srv, &d.loop, &d.reg, path, (unsigned)max_clients);
        if (err < 0) {
                fprintf(stderr, "dlxd: cannot start on %s: %s\n", path, strerror(-err));
                registry_done(&d.reg);
                store_done(&d.store);
                uv_loop_close(&d.loop);
                return 1;
        }
        uv_signal_init(&d.loop, &d.sigint);
        uv_signal_init(&d.loop, &d.sigterm);
        d.sigint.data = d.sigterm.data = &d;
        uv_signal_start(&d.sigint, on_signal, SIGINT);
        uv_signal_start(&d.sigterm, on_signal, SIGTERM);

        log_notice("listening on %s (max %lu clients, max bytes %llu)", path, max_clients,
                   (unsigned long long)max_bytes);
        if (have_ready) {
                (void)!write((int)ready_fd, "R", 1);
                close((int)ready_fd);
        }

        uv_run(&d.loop, UV_RUN_DEFAULT);

        registry_done(&d.reg);
        store_done(&d.store);
        /* close callbacks of whatever registry_done closed (waiter timers) */
        uv_run(&d.loop, UV_RUN_DEFAULT);
        err = uv_loop_close(&d.loop);
        if (err < 0)
                log_warn("loop not empty at exit: %s", uv_strerror(err));
        log_notice("stopped");
        return 0;
}
