/* SPDX-License-Identifier: MIT */
/*
 * What dlxctl peers reads: a local socket (by default next to dlxd's,
 * "dlxfed.sock", mode 0660) that answers every connection with one JSON
 * object, then closes it. Nothing is read from the client: there is no
 * request to get wrong, and nothing it can change.
 *
 *   {"alias": "b", "listen": "192.0.2.2:7770", "uptime_ms": 5120,
 *    "peers": [{"alias": "a", "address": "192.0.2.1:7770",
 *               "state": "connected", "transport": "tcp/eth1",
 *               "pulls": 3, "bytes_in": 4000, "failures": 0, "follows": 1}],
 *    "clients": [{"alias": "a", "address": "192.0.2.1:40112",
 *                 "state": "connected", "transport": "tcp/eth1",
 *                 "served": 2, "bytes_out": 64, "follows": 0}]}
 *
 * peers are those this host pulls from (its peer list; state "idle" until
 * first wanted), clients the endpoints of peers that pull from it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "fed.h"
#include "sockpath.h"

static json_t *conn_state(const struct conn *c)
{
        return json_string(!c           ? "idle"
                           : c->closing ? "closing"
                           : c->authed  ? "connected"
                                        : "handshake");
}

static char *report(struct fed *f)
{
        json_t *o = json_object(), *peers = json_array(), *clients = json_array();
        char *text;

        json_object_set_new(o, "alias", json_string(f->cfg.alias));
        json_object_set_new(o, "listen", f->cfg.listen ? json_string(f->cfg.listen) : json_null());
        json_object_set_new(o, "uptime_ms",
                            json_integer((json_int_t)(uv_now(f->loop) - f->started_ms)));
        for (unsigned i = 0; i < f->cfg.npeers; i++) {
                const struct peer *p = &f->cfg.peers[i];
                json_t *e = json_object();
                json_object_set_new(e, "alias", json_string(p->alias));
                json_object_set_new(e, "address", json_string(p->where));
                json_object_set_new(e, "state", conn_state(p->conn));
                json_object_set_new(e, "transport", json_string(p->conn ? p->conn->transport : ""));
                json_object_set_new(e, "pulls", json_integer((json_int_t)p->pulls));
                json_object_set_new(e, "bytes_in", json_integer((json_int_t)p->bytes_in));
                json_object_set_new(e, "failures", json_integer((json_int_t)p->failures));
                json_object_set_new(e, "follows", json_integer(fed_follow_count(f, p)));
                json_array_append_new(peers, e);
        }
        for (const struct list *pos = f->conns.next; pos != &f->conns; pos = pos->next) {
                const struct conn *c = list_entry(pos, struct conn, link);
                json_t *e;
                if (c->client)
                        continue;
                e = json_object();
                json_object_set_new(e, "alias", json_string(c->their_alias));
                json_object_set_new(e, "address", json_string(c->addr));
                json_object_set_new(e, "state", conn_state(c));
                json_object_set_new(e, "transport", json_string(c->transport));
                json_object_set_new(e, "served", json_integer((json_int_t)c->served));
                json_object_set_new(e, "bytes_out", json_integer((json_int_t)c->bytes_out));
                json_object_set_new(e, "follows", json_integer(fed_rfollow_count(f, c)));
                json_array_append_new(clients, e);
        }
        json_object_set_new(o, "peers", peers);
        json_object_set_new(o, "clients", clients);
        text = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        return text;
}

struct answer {
        uv_pipe_t pipe;
        uv_write_t write;
        char *text;
};

static void answer_closed(uv_handle_t *h)
{
        struct answer *a = h->data;

        free(a->text);
        free(a);
}

static void answer_written(uv_write_t *w, int status)
{
        struct answer *a = w->data;

        (void)status;
        uv_close((uv_handle_t *)&a->pipe, answer_closed);
}

static void on_control(uv_stream_t *server, int status)
{
        struct fed *f = server->data;
        struct answer *a;
        uv_buf_t buf;
        size_t len;

        if (status < 0)
                return;
        a = calloc(1, sizeof(*a));
        if (!a)
                return; /* the connection waits in the backlog; the next one may fare better */
        uv_pipe_init(f->loop, &a->pipe, 0);
        a->pipe.data = a;
        if (uv_accept(server, (uv_stream_t *)&a->pipe) < 0 || !(a->text = report(f))) {
                uv_close((uv_handle_t *)&a->pipe, answer_closed);
                return;
        }
        len = strlen(a->text);
        a->text[len] = '\n'; /* json_dumps' terminator: a line, not a C string, goes out */
        buf = uv_buf_init(a->text, (unsigned)len + 1);
        a->write.data = a;
        if (uv_write(&a->write, (uv_stream_t *)&a->pipe, &buf, 1, answer_written) < 0)
                uv_close((uv_handle_t *)&a->pipe, answer_closed);
}

/* Whether something listens on the socket at path (a stale one refuses the connection). */
static bool socket_answers(const char *path)
{
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool alive;

        if (s < 0)
                return true; /* cannot tell: leave it be */
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        alive = connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0 || errno != ECONNREFUSED;
        close(s);
        return alive;
}

int fed_control_start(struct fed *f)
{
        char dlxd[108];
        mode_t old;
        int err;

        f->started_ms = uv_now(f->loop);
        if (f->cfg.control) {
                size_t len = strlen(f->cfg.control);
                err = len >= sizeof(f->control_path) ? -ENAMETOOLONG : 0;
                if (err == 0)
                        memcpy(f->control_path, f->cfg.control, len + 1);
        } else {
                err = sockpath_resolve(f->cfg.socket, dlxd, sizeof(dlxd));
                if (err == 0)
                        err = sockpath_control(dlxd, f->control_path, sizeof(f->control_path));
        }
        if (err < 0) {
                fprintf(stderr, "dlxfed: no room for the control socket's path: %s\n",
                        strerror(-err));
                return err;
        }
        uv_pipe_init(f->loop, &f->control, 0);
        f->control.data = f;
        f->control_on = true;
        /* a predecessor's socket goes (one bridge per dlxd); a live one is not ours to take */
        struct stat st;
        if (lstat(f->control_path, &st) == 0 && S_ISSOCK(st.st_mode)) {
                if (socket_answers(f->control_path)) {
                        fprintf(stderr,
                                "dlxfed: %s is a live socket (another dlxfed's, or dlxd's own): "
                                "give this bridge --control PATH of its own\n",
                                f->control_path);
                        return -EADDRINUSE;
                }
                unlink(f->control_path);
        }
        old = umask(0117);
        err = uv_pipe_bind(&f->control, f->control_path);
        umask(old);
        if (err == 0)
                err = uv_listen((uv_stream_t *)&f->control, 16, on_control);
        if (err == 0 && lstat(f->control_path, &st) == 0) {
                f->control_dev = st.st_dev;
                f->control_ino = st.st_ino;
        }
        if (err < 0) {
                fprintf(stderr, "dlxfed: cannot serve %s: %s\n", f->control_path, uv_strerror(err));
                return err;
        }
        return 0;
}

void fed_control_stop(struct fed *f)
{
        struct stat st;

        if (!f->control_on)
                return;
        f->control_on = false;
        uv_close((uv_handle_t *)&f->control, NULL);
        /* only if it is still ours: another may have taken the path meanwhile */
        if (lstat(f->control_path, &st) == 0 && st.st_dev == f->control_dev &&
            st.st_ino == f->control_ino)
                unlink(f->control_path);
}
