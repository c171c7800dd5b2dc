/* SPDX-License-Identifier: MIT */
/*
 * UCX for dlxfed: one context and one worker, progressed from the libuv loop
 * (the worker's event fd polled, drained before the loop sleeps); a listener
 * whose connection handler checks the allow-list before any endpoint exists;
 * endpoints to peers made on first use; control messages as active
 * messages; and the handshake, which serves nothing to an endpoint until
 * both ends have proved they hold the shared secret:
 *
 *   client                              server
 *   Hello{alias, versions, nonce_c}  ->
 *                                    <- HelloReply{alias, versions, nonce_s, mac_s}
 *   Auth{mac_c}                      ->
 *
 * mac = HMAC-SHA256(secret, role || nonce_c || nonce_s || aliases || versions),
 * the role byte differing so that neither proof can be replayed as the other.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "fed.h"
#include "fed.pb-c.h"

static const char *status_str(ucs_status_t s)
{
        return ucs_status_string(s);
}

static void addr_str(const struct sockaddr_storage *sa, char *buf, size_t len)
{
        char host[INET6_ADDRSTRLEN] = "?";
        unsigned port = 0;

        if (sa->ss_family == AF_INET) {
                const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
                inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
                port = ntohs(in->sin_port);
        } else if (sa->ss_family == AF_INET6) {
                const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)sa;
                inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
                port = ntohs(in->sin6_port);
        }
        snprintf(buf, len, sa->ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, port);
}

/* Whether sa is on the allow-list (empty: the peers' own addresses). */
static bool allowed(const struct fed *f, const struct sockaddr_storage *sa)
{
        const uint8_t *a;
        size_t alen;

        if (sa->ss_family == AF_INET) {
                a = (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
                alen = 4;
        } else if (sa->ss_family == AF_INET6) {
                a = (const uint8_t *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
                alen = 16;
        } else {
                return false;
        }
        for (unsigned i = 0; i < f->cfg.nallow; i++) {
                const struct fed_net *n = &f->cfg.allow[i];
                unsigned bits = n->bits, full = bits / 8;

                if (n->family != sa->ss_family)
                        continue;
                if (memcmp(n->addr, a, full) != 0)
                        continue;
                if (bits % 8 && ((n->addr[full] ^ a[full]) & (0xff00 >> (bits % 8)) & 0xff))
                        continue;
                return true;
        }
        if (f->cfg.nallow)
                return false;
        for (unsigned i = 0; i < f->cfg.npeers; i++) {
                const struct sockaddr_storage *p = &f->cfg.peers[i].addr.sa;
                if (p->ss_family != sa->ss_family)
                        continue;
                if (sa->ss_family == AF_INET &&
                    memcmp(&((const struct sockaddr_in *)p)->sin_addr, a, alen) == 0)
                        return true;
                if (sa->ss_family == AF_INET6 &&
                    memcmp(&((const struct sockaddr_in6 *)p)->sin6_addr, a, alen) == 0)
                        return true;
        }
        return false;
}

/* ---- the worker on the loop ---- */

static void conn_free(struct conn *c);

/*
 * Frees the endpoints UCX is done with. Only from the loop: a send that
 * fails at once may close its endpoint under its caller, which must find
 * it still there (closing), with its leases and pulls as they were.
 */
static void conns_reap(struct fed *f)
{
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &f->closing)
        {
                struct conn *c = list_entry(pos, struct conn, link);
                if (c->closed)
                        conn_free(c);
        }
}

static void drain(uv_prepare_t *h)
{
        struct fed *f = h->data;

        for (;;) {
                while (ucp_worker_progress(f->worker))
                        ;
                conns_reap(f);
                if (ucp_worker_arm(f->worker) != UCS_ERR_BUSY)
                        break;
        }
}

static void on_efd(uv_poll_t *h, int status, int events)
{
        (void)status;
        (void)events;
        drain((uv_prepare_t *)&((struct fed *)h->data)->ucx_prepare);
}

/* ---- endpoints ---- */

static struct conn *conn_of(struct fed *f, ucp_ep_h ep)
{
        struct list *pos;

        for (pos = f->conns.next; pos != &f->conns; pos = pos->next) {
                struct conn *c = list_entry(pos, struct conn, link);
                if (c->ep == ep)
                        return c;
        }
        return NULL;
}

static void conn_free(struct conn *c)
{
        list_remove(&c->link);
        if (!c->client)
                fed_export_conn_gone(c);
        free(c);
}

static void on_closed(void *req, ucs_status_t status, void *arg)
{
        struct conn *c = arg;

        (void)status;
        ucp_request_free(req);
        c->close_req = NULL;
        c->closed = true;
}

/* force: at once, dropping what is unsent; else once what was sent has left. */
static void conn_close(struct conn *c, const char *why, bool force)
{
        struct fed *f = c->fed;
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                 UCP_OP_ATTR_FIELD_USER_DATA |
                                                 UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
                                 .cb.send = on_closed,
                                 .user_data = c};
        void *r;

        if (c->closing)
                return;
        c->closing = true;
        fed_log(c->authed ? FED_NOTICE : FED_INFO, "%s: closed: %s", c->who, why);
        if (c->client) {
                if (c->peer && c->peer->conn == c)
                        c->peer->conn = NULL;
                fed_import_conn_lost(c, why);
                fed_follow_conn_lost(c);
        }
        list_remove(&c->link);
        list_insert_tail(&f->closing, &c->link);
        r = ucp_ep_close_nbx(c->ep, &p);
        if (r == NULL || UCS_PTR_IS_ERR(r))
                c->closed = true;
        else
                c->close_req = r;
}

void fed_close(struct conn *c, const char *why)
{
        conn_close(c, why, true);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
        struct conn *c = arg;
        char why[256];

        (void)ep;
        c->error = status;
        snprintf(why, sizeof(why), "peer %s lost: %s", c->peer ? c->peer->alias : c->who,
                 status_str(status));
        fed_close(c, why);
}

static struct conn *conn_new(struct fed *f, bool client)
{
        struct conn *c = calloc(1, sizeof(*c));

        if (!c)
                return NULL;
        c->fed = f;
        c->client = client;
        c->born_ms = uv_now(f->loop);
        randombytes_buf(c->nonce_mine, sizeof(c->nonce_mine));
        list_insert_tail(&f->conns, &c->link);
        return c;
}

static void on_conn_request(ucp_conn_request_h req, void *arg)
{
        struct fed *f = arg;
        ucp_conn_request_attr_t attr = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
        char who[64] = "?";
        struct conn *c;
        ucs_status_t s;

        s = ucp_conn_request_query(req, &attr);
        if (s == UCS_OK)
                addr_str(&attr.client_address, who, sizeof(who));
        unsigned unproven = 0;
        for (struct list *pos = f->conns.next; pos != &f->conns; pos = pos->next)
                unproven += !list_entry(pos, struct conn, link)->authed;
        if (s == UCS_OK && unproven >= FED_MAX_UNPROVEN) {
                fed_log(FED_WARN, "connection from %s refused: %u connections without a handshake",
                        who, unproven);
                ucp_listener_reject(f->listener, req);
                return;
        }
        if (s != UCS_OK || f->stopping || !allowed(f, &attr.client_address)) {
                fed_log(FED_WARN, "connection from %s refused: %s", who,
                        s != UCS_OK   ? status_str(s)
                        : f->stopping ? "stopping"
                                      : "not on the allow-list");
                ucp_listener_reject(f->listener, req);
                return;
        }
        c = conn_new(f, false);
        if (!c) {
                ucp_listener_reject(f->listener, req);
                return;
        }
        snprintf(c->who, sizeof(c->who), "client %s", who);
        snprintf(c->addr, sizeof(c->addr), "%s", who);
        ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                                            UCP_EP_PARAM_FIELD_ERR_HANDLER |
                                            UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                              .conn_request = req,
                              .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                              .err_handler = {.cb = on_ep_error, .arg = c}};
        s = ucp_ep_create(f->worker, &ep, &c->ep);
        if (s != UCS_OK) {
                fed_log(FED_WARN, "%s: cannot make an endpoint: %s", c->who, status_str(s));
                list_remove(&c->link);
                free(c);
                return;
        }
        fed_log(FED_INFO, "%s: connected", c->who);
}

struct conn *fed_connect(struct fed *f, struct peer *p, char *why, size_t whysz)
{
        struct conn *c;
        ucs_status_t s;
        uint8_t buf[256];
        Dlxf__Hello h = DLXF__HELLO__INIT;

        if (p->conn)
                return p->conn;
        c = conn_new(f, true);
        if (!c) {
                snprintf(why, whysz, "out of memory");
                return NULL;
        }
        c->peer = p;
        snprintf(c->who, sizeof(c->who), "peer %s (%s)", p->alias, p->where);
        snprintf(c->addr, sizeof(c->addr), "%s", p->where);
        ucp_ep_params_t ep = {
                .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                              UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                .sockaddr = {.addr = (const struct sockaddr *)&p->addr.sa, .addrlen = p->addr.len},
                .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                .err_handler = {.cb = on_ep_error, .arg = c}};
        s = ucp_ep_create(f->worker, &ep, &c->ep);
        if (s != UCS_OK) {
                snprintf(why, whysz, "cannot connect to peer %s (%s): %s", p->alias, p->where,
                         status_str(s));
                list_remove(&c->link);
                free(c);
                return NULL;
        }
        p->conn = c;
        h.major = f->proto_major;
        h.minor = f->proto_minor;
        h.alias = (char *)f->cfg.alias;
        h.ucx_major = f->ucx_major;
        h.ucx_minor = f->ucx_minor;
        h.ucx_release = f->ucx_release;
        h.nonce.data = c->nonce_mine;
        h.nonce.len = FED_NONCE;
        fed_send(c, FED_AM_HELLO, buf, dlxf__hello__pack(&h, buf));
        return c;
}

/* ---- messages ---- */

static void on_sent(void *req, ucs_status_t status, void *arg)
{
        (void)status;
        free(arg);
        ucp_request_free(req);
}

uint32_t fed_minor(const struct conn *c)
{
        return c->their_proto[1] < c->fed->proto_minor ? c->their_proto[1] : c->fed->proto_minor;
}

int fed_send(struct conn *c, enum fed_am id, const void *buf, size_t len)
{
        void *copy = malloc(len ? len : 1);
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                 UCP_OP_ATTR_FIELD_USER_DATA |
                                                 UCP_OP_ATTR_FIELD_FLAGS,
                                 /* never by rendezvous: on_am() takes control messages whole */
                                 .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                                 .cb.send = on_sent,
                                 .user_data = copy};
        void *r;

        if (!copy)
                return -ENOMEM;
        if (c->closing) {
                free(copy);
                return -ENOTCONN;
        }
        memcpy(copy, buf, len);
        r = ucp_am_send_nbx(c->ep, (unsigned)id, NULL, 0, copy, len, &p);
        if (r == NULL) {
                free(copy);
                return 0;
        }
        if (UCS_PTR_IS_ERR(r)) {
                free(copy);
                return -EIO;
        }
        return 0;
}

static void refuse(struct conn *c, int errnum, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static void refuse(struct conn *c, int errnum, const char *fmt, ...)
{
        Dlxf__Refused r = DLXF__REFUSED__INIT;
        char msg[256];
        uint8_t buf[320];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        r.errnum = errnum;
        r.error = msg;
        /* logged first: once the peer has it, whoever it tells may look here */
        fed_log(FED_WARN, "%s: refused: %s", c->who, msg);
        fed_send(c, FED_AM_REFUSED, buf, dlxf__refused__pack(&r, buf));
        /* the endpoint goes once the refusal has left */
        conn_close(c, msg, false);
}

/* The handshake's proof, for role 'S' (server) or 'C' (client). */
static void transcript_mac(const struct fed *f, const struct conn *c, char role,
                           uint8_t mac[FED_MAC])
{
        crypto_auth_hmacsha256_state st;
        const uint8_t *nc = c->client ? c->nonce_mine : c->nonce_theirs;
        const uint8_t *ns = c->client ? c->nonce_theirs : c->nonce_mine;
        const char *ac = c->client ? f->cfg.alias : c->their_alias;
        const char *as = c->client ? c->their_alias : f->cfg.alias;
        /* both sides' protocol and UCX versions, the client's first, little-endian */
        uint32_t mine[5] = {htole32(f->proto_major), htole32(f->proto_minor), htole32(f->ucx_major),
                            htole32(f->ucx_minor), htole32(f->ucx_release)};
        uint32_t theirs[5] = {htole32(c->their_proto[0]), htole32(c->their_proto[1]),
                              htole32(c->their_ucx[0]), htole32(c->their_ucx[1]),
                              htole32(c->their_ucx[2])};

        crypto_auth_hmacsha256_init(&st, f->secret, f->secret_len);
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)"dlxfed hello", 12);
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)&role, 1);
        crypto_auth_hmacsha256_update(&st, nc, FED_NONCE);
        crypto_auth_hmacsha256_update(&st, ns, FED_NONCE);
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)ac, strlen(ac) + 1);
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)as, strlen(as) + 1);
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)(c->client ? mine : theirs),
                                      sizeof(mine));
        crypto_auth_hmacsha256_update(&st, (const uint8_t *)(c->client ? theirs : mine),
                                      sizeof(mine));
        crypto_auth_hmacsha256_final(&st, mac);
}

/* Versions both ways: another protocol major, or a UCX minor, is refused. */
static int versions_ok(struct conn *c, uint32_t major, const unsigned ucx[3])
{
        struct fed *f = c->fed;

        if (major != FED_PROTO_MAJOR) {
                refuse(c, EPROTONOSUPPORT, "protocol %u: dlxfed %s speaks %d", major, DLX_VERSION,
                       FED_PROTO_MAJOR);
                return -1;
        }
        if ((ucx[0] != f->ucx_major || ucx[1] != f->ucx_minor) && !f->cfg.allow_ucx_mismatch) {
                refuse(c, EPROTONOSUPPORT,
                       "UCX %u.%u.%u here and %u.%u.%u there: minors must match "
                       "(--allow-ucx-mismatch overrides)",
                       f->ucx_major, f->ucx_minor, f->ucx_release, ucx[0], ucx[1], ucx[2]);
                return -1;
        }
        return 0;
}

static bool alias_ok(const char *a)
{
        size_t n = a ? strlen(a) : 0;

        if (n == 0 || n > FED_ALIAS_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if ((unsigned char)a[i] <= ' ' || a[i] == '/' || a[i] == '@' || a[i] == 0x7f ||
                    (unsigned char)a[i] >= 0x80)
                        return false;
        return true;
}

/* A client's alias is one of our peers' (any, for a bridge that lists none: it only serves). */
static bool alias_known(const struct fed *f, const char *alias)
{
        if (f->cfg.npeers == 0)
                return true;
        for (unsigned i = 0; i < f->cfg.npeers; i++)
                if (strcmp(f->cfg.peers[i].alias, alias) == 0)
                        return true;
        return false;
}

/* A lane's transport in words ("tcp/lo") from a line of ucp_ep_print_info(), into buf. */
static bool lane_transport(const char *line, char *buf, size_t len)
{
        const char *lane = strstr(line, "lane["), *tl;

        tl = lane ? strchr(lane, ':') : NULL;
        tl = tl ? strchr(tl + 1, ':') : NULL;
        if (!tl)
                return false;
        tl++;
        snprintf(buf, len, "%.*s", (int)strcspn(tl, " ."), tl);
        return true;
}

/* The endpoint's transport in words: its first lane that does RMA, else its first lane. */
static void find_transport(struct conn *c)
{
        char *text = NULL, *save = NULL, first[sizeof(c->transport)] = "unknown";
        size_t len = 0;
        bool have_first = false;
        FILE *m = open_memstream(&text, &len);

        snprintf(c->transport, sizeof(c->transport), "unknown");
        if (!m)
                return;
        ucp_ep_print_info(c->ep, m);
        fclose(m);
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                if (strstr(line, "rma") && lane_transport(line, c->transport, sizeof(c->transport)))
                        break;
                if (!have_first)
                        have_first = lane_transport(line, first, sizeof(first));
        }
        if (strcmp(c->transport, "unknown") == 0)
                snprintf(c->transport, sizeof(c->transport), "%s", first);
        free(text);
}

/*
 * Whether c's RMA goes over RDMA: a lane of an InfiniBand or RoCE transport
 * (rc, dc: UCX's rc_verbs, rc_mlx5, dc_mlx5). Over TCP UCX emulates RMA in
 * software, from the peer's worker.
 */
static bool over_rdma(const struct conn *c)
{
        return strncmp(c->transport, "rc", 2) == 0 || strncmp(c->transport, "dc", 2) == 0;
}

/* The handshake is over: with --require-rdma, a peer without RDMA is refused. */
static bool transport_ok(struct conn *c)
{
        find_transport(c);
        if (!c->fed->cfg.require_rdma || over_rdma(c))
                return true;
        refuse(c, EPROTONOSUPPORT,
               "%s is reached over ucx %s, not RDMA, and %s requires RDMA (--require-rdma)", c->who,
               c->transport, c->fed->cfg.alias);
        return false;
}

static void on_hello(struct conn *c, const void *buf, size_t len)
{
        Dlxf__Hello *h = dlxf__hello__unpack(NULL, len, buf);
        Dlxf__HelloReply r = DLXF__HELLO_REPLY__INIT;
        uint8_t mac[FED_MAC], out[512];
        unsigned ucx[3];

        if (!h || c->client || c->hello_seen || h->nonce.len != FED_NONCE || !alias_ok(h->alias)) {
                if (h)
                        dlxf__hello__free_unpacked(h, NULL);
                refuse(c, EPROTO, "a bad hello");
                return;
        }
        c->hello_seen = true;
        memcpy(c->nonce_theirs, h->nonce.data, FED_NONCE);
        snprintf(c->their_alias, sizeof(c->their_alias), "%s", h->alias);
        snprintf(c->who + strlen(c->who), sizeof(c->who) - strlen(c->who), " '%s'", h->alias);
        ucx[0] = h->ucx_major;
        ucx[1] = h->ucx_minor;
        ucx[2] = h->ucx_release;
        memcpy(c->their_ucx, ucx, sizeof(ucx));
        c->their_proto[0] = h->major;
        c->their_proto[1] = h->minor;
        uint32_t major = h->major;
        dlxf__hello__free_unpacked(h, NULL);
        if (versions_ok(c, major, ucx) < 0)
                return;
        if (!alias_known(c->fed, c->their_alias)) {
                refuse(c, EACCES, "'%s' is not in the peer list of '%s'", c->their_alias,
                       c->fed->cfg.alias);
                return;
        }
        transcript_mac(c->fed, c, 'S', mac);
        r.major = c->fed->proto_major;
        r.minor = c->fed->proto_minor;
        r.alias = (char *)c->fed->cfg.alias;
        r.ucx_major = c->fed->ucx_major;
        r.ucx_minor = c->fed->ucx_minor;
        r.ucx_release = c->fed->ucx_release;
        r.nonce.data = c->nonce_mine;
        r.nonce.len = FED_NONCE;
        r.mac.data = mac;
        r.mac.len = FED_MAC;
        fed_send(c, FED_AM_HELLO_REPLY, out, dlxf__hello_reply__pack(&r, out));
}

static void on_hello_reply(struct conn *c, const void *buf, size_t len)
{
        Dlxf__HelloReply *r = dlxf__hello_reply__unpack(NULL, len, buf);
        Dlxf__Auth a = DLXF__AUTH__INIT;
        uint8_t mac[FED_MAC], out[128];
        unsigned ucx[3];
        bool good;

        if (!r || !c->client || c->hello_seen || r->nonce.len != FED_NONCE ||
            r->mac.len != FED_MAC || !alias_ok(r->alias)) {
                if (r)
                        dlxf__hello_reply__free_unpacked(r, NULL);
                refuse(c, EPROTO, "a bad hello reply");
                return;
        }
        c->hello_seen = true;
        memcpy(c->nonce_theirs, r->nonce.data, FED_NONCE);
        snprintf(c->their_alias, sizeof(c->their_alias), "%s", r->alias);
        ucx[0] = r->ucx_major;
        ucx[1] = r->ucx_minor;
        ucx[2] = r->ucx_release;
        memcpy(c->their_ucx, ucx, sizeof(ucx));
        c->their_proto[0] = r->major;
        c->their_proto[1] = r->minor;
        transcript_mac(c->fed, c, 'S', mac);
        good = sodium_memcmp(mac, r->mac.data, FED_MAC) == 0;
        uint32_t major = r->major;
        dlxf__hello_reply__free_unpacked(r, NULL);
        if (!good) {
                refuse(c, EACCES, "%s does not hold our secret (HMAC mismatch)", c->who);
                return;
        }
        if (versions_ok(c, major, ucx) < 0)
                return;
        if (strcmp(c->their_alias, c->peer->alias) != 0) {
                refuse(c, EACCES, "%s calls itself '%s'", c->who, c->their_alias);
                return;
        }
        transcript_mac(c->fed, c, 'C', mac);
        a.mac.data = mac;
        a.mac.len = FED_MAC;
        fed_send(c, FED_AM_AUTH, out, dlxf__auth__pack(&a, out));
        if (!transport_ok(c))
                return;
        c->authed = true;
        fed_log(FED_NOTICE, "%s: connected over ucx %s", c->who, c->transport);
        fed_import_authed(c);
        fed_follow_authed(c);
}

static void on_auth(struct conn *c, const void *buf, size_t len)
{
        Dlxf__Auth *a = dlxf__auth__unpack(NULL, len, buf);
        uint8_t mac[FED_MAC];
        bool good;

        if (!a || c->client || !c->hello_seen || c->authed || a->mac.len != FED_MAC) {
                if (a)
                        dlxf__auth__free_unpacked(a, NULL);
                refuse(c, EPROTO, "a bad auth");
                return;
        }
        transcript_mac(c->fed, c, 'C', mac);
        good = sodium_memcmp(mac, a->mac.data, FED_MAC) == 0;
        dlxf__auth__free_unpacked(a, NULL);
        if (!good) {
                refuse(c, EACCES, "%s does not hold our secret (HMAC mismatch)", c->who);
                return;
        }
        if (!transport_ok(c))
                return;
        c->authed = true;
        fed_log(FED_NOTICE, "%s: authenticated, over ucx %s", c->who, c->transport);
}

static void on_refused(struct conn *c, const void *buf, size_t len)
{
        Dlxf__Refused *r = dlxf__refused__unpack(NULL, len, buf);
        char why[320];

        snprintf(why, sizeof(why), "%s refused us: %s", c->who,
                 r && r->error ? r->error : "(no reason)");
        if (r)
                dlxf__refused__free_unpacked(r, NULL);
        fed_log(FED_WARN, "%s", why);
        fed_close(c, why);
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
        struct fed *f = ((void **)arg)[0];
        enum fed_am id = (enum fed_am)(uintptr_t)((void **)arg)[1];
        struct conn *c;

        if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
                return UCS_OK;
        c = conn_of(f, param->reply_ep);
        if (!c || c->closing)
                return UCS_OK;
        if (id == FED_AM_DATA) {
                if (c->authed && c->client)
                        return fed_import_data(c, header, header_length, data, length, param);
                refuse(c, EPROTO, "data nobody asked for");
                return UCS_OK;
        }
        /* a Describe (its group's members) is the longest, and bounded by its sender */
        if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > FED_CONTROL_MAX) {
                refuse(c, EMSGSIZE, "a control message of %zu bytes", length);
                return UCS_OK;
        }
        switch (id) {
        case FED_AM_HELLO:
                on_hello(c, data, length);
                break;
        case FED_AM_HELLO_REPLY:
                on_hello_reply(c, data, length);
                break;
        case FED_AM_AUTH:
                on_auth(c, data, length);
                break;
        case FED_AM_REFUSED:
                on_refused(c, data, length);
                break;
        case FED_AM_LOOKUP:
        case FED_AM_RELEASE:
        case FED_AM_FOLLOW:
                if (!c->authed || c->client) {
                        refuse(c, EACCES, "a request before the handshake");
                        break;
                }
                if (id == FED_AM_LOOKUP)
                        fed_export_lookup(c, data, length);
                else if (id == FED_AM_RELEASE)
                        fed_export_release(c, data, length);
                else
                        fed_export_follow(c, data, length);
                break;
        case FED_AM_DESCRIBE:
        case FED_AM_CHANGE:
                if (!c->authed || !c->client) {
                        refuse(c, EPROTO, "an answer to nothing");
                        break;
                }
                if (id == FED_AM_DESCRIBE)
                        fed_import_describe(c, data, length);
                else
                        fed_follow_change(c, data, length);
                break;
        default:
                break;
        }
        return UCS_OK;
}

/* ---- start and stop ---- */

static void *am_args[FED_AM_COUNT][2];

static int start_listening(struct fed *f);

/* Each second: an endpoint without its handshake done after FED_HANDSHAKE_MS goes. */
static void on_sweep(uv_timer_t *t)
{
        struct fed *f = t->data;
        uint64_t now = uv_now(f->loop);
        struct list *pos, *tmp;

        list_for_each_safe(pos, tmp, &f->conns)
        {
                struct conn *c = list_entry(pos, struct conn, link);
                if (!c->authed && now - c->born_ms > FED_HANDSHAKE_MS)
                        fed_close(c, c->client ? "no handshake from the peer in time"
                                               : "no handshake in time");
        }
}

int fed_ucx_start(struct fed *f)
{
        ucp_config_t *cfg;
        ucs_status_t s;

        if (sodium_init() < 0) {
                fed_log(FED_ERR, "libsodium cannot start");
                return -EIO;
        }
        ucp_get_version(&f->ucx_major, &f->ucx_minor, &f->ucx_release);
        f->proto_major = FED_PROTO_MAJOR;
        f->proto_minor = FED_PROTO_MINOR;
        /* for the tests only: "PMAJOR.PMINOR UCXMAJOR.UCXMINOR.UCXRELEASE", claimed on the wire */
        const char *claim = getenv("DLXFED_TEST_CLAIM");
        if (claim && sscanf(claim, "%u.%u %u.%u.%u", &f->proto_major, &f->proto_minor,
                            &f->ucx_major, &f->ucx_minor, &f->ucx_release) == 5)
                fed_log(FED_WARN, "claiming protocol %u.%u and UCX %u.%u.%u (DLXFED_TEST_CLAIM)",
                        f->proto_major, f->proto_minor, f->ucx_major, f->ucx_minor, f->ucx_release);
        s = ucp_config_read(NULL, NULL, &cfg);
        if (s != UCS_OK) {
                fed_log(FED_ERR, "UCX configuration: %s", status_str(s));
                return -EINVAL;
        }
        /* dlxfed's own settings came in the environment: fed_env_defaults() */
        fed_log(FED_INFO, "UCX %u.%u.%u, TCP segments %s sent and %s received", f->ucx_major,
                f->ucx_minor, f->ucx_release, getenv("UCX_TCP_TX_SEG_SIZE"),
                getenv("UCX_TCP_RX_SEG_SIZE"));
        ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
                          .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                          .name = "dlxfed"};
        s = ucp_init(&p, cfg, &f->ctx);
        ucp_config_release(cfg);
        if (s != UCS_OK) {
                fed_log(FED_ERR, "UCX cannot start: %s", status_str(s));
                return -EIO;
        }
        ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                  .thread_mode = UCS_THREAD_MODE_SINGLE};
        s = ucp_worker_create(f->ctx, &wp, &f->worker);
        if (s == UCS_OK)
                s = ucp_worker_get_efd(f->worker, &f->efd);
        if (s != UCS_OK) {
                fed_log(FED_ERR, "UCX worker: %s", status_str(s));
                return -EIO;
        }
        for (int id = FED_AM_HELLO; id < FED_AM_COUNT; id++) {
                am_args[id][0] = f;
                am_args[id][1] = (void *)(uintptr_t)id;
                ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                                           UCP_AM_HANDLER_PARAM_FIELD_CB |
                                                           UCP_AM_HANDLER_PARAM_FIELD_ARG |
                                                           UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
                                             .id = (unsigned)id,
                                             .flags = UCP_AM_FLAG_WHOLE_MSG,
                                             .cb = on_am,
                                             .arg = am_args[id]};
                s = ucp_worker_set_am_recv_handler(f->worker, &hp);
                if (s != UCS_OK) {
                        fed_log(FED_ERR, "UCX active messages: %s", status_str(s));
                        return -EIO;
                }
        }
        uv_timer_init(f->loop, &f->sweep);
        f->sweep.data = f;
        uv_timer_start(&f->sweep, on_sweep, 1000, 1000);
        uv_prepare_init(f->loop, &f->ucx_prepare);
        f->ucx_prepare.data = f;
        uv_prepare_start(&f->ucx_prepare, drain);
        uv_poll_init(f->loop, &f->ucx_poll, f->efd);
        f->ucx_poll.data = f;
        uv_poll_start(&f->ucx_poll, UV_READABLE, on_efd);

        if (f->cfg.listen) {
                if (fed_parse_addr(f->cfg.listen, &f->listen_addr) < 0) {
                        fed_log(FED_ERR, "bad --listen '%s' (ADDR:PORT)", f->cfg.listen);
                        return -EINVAL;
                }
                uv_timer_init(f->loop, &f->listen_timer);
                f->listen_timer.data = f;
                return start_listening(f) == -EINVAL ? -EADDRINUSE : 0;
        }
        return 0;
}

#define LISTEN_RETRIES 120 /* seconds */

static void on_listen_retry(uv_timer_t *t)
{
        struct fed *f = t->data;

        if (start_listening(f) == -EINVAL) {
                fed_log(FED_ERR, "cannot listen on %s for %d s: stopping", f->cfg.listen,
                        LISTEN_RETRIES);
                f->listen_failed = true;
                uv_stop(f->loop);
        }
}

/*
 * The listener. An address in use may be a dlxfed that stopped a moment
 * ago: its closed connections keep the port (TIME_WAIT) for a minute, and
 * UCX binds without SO_REUSEADDR. So that a restart is not refused, it is
 * tried again each second for LISTEN_RETRIES seconds (pulls from peers work
 * meanwhile). Returns 0 (listening, or to be tried again) or -EINVAL: give up.
 */
static int start_listening(struct fed *f)
{
        ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                                                  UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                    .sockaddr = {.addr = (struct sockaddr *)&f->listen_addr.sa,
                                                 .addrlen = f->listen_addr.len},
                                    .conn_handler = {.cb = on_conn_request, .arg = f}};
        ucs_status_t s = ucp_listener_create(f->worker, &lp, &f->listener);

        if (s == UCS_OK) {
                if (f->listen_tries)
                        fed_log(FED_NOTICE, "listening on %s", f->cfg.listen);
                return 0;
        }
        f->listener = NULL;
        if (s != UCS_ERR_BUSY || f->listen_tries >= LISTEN_RETRIES) {
                fed_log(FED_ERR, "cannot listen on %s: %s", f->cfg.listen,
                        s == UCS_ERR_BUSY ? "address in use" : status_str(s));
                return -EINVAL;
        }
        if (f->listen_tries++ == 0)
                fed_log(FED_WARN,
                        "%s is in use (a dlxfed that stopped a moment ago?): trying again each "
                        "second for %d s",
                        f->cfg.listen, LISTEN_RETRIES);
        uv_timer_start(&f->listen_timer, on_listen_retry, 1000, 0);
        return 0;
}

void fed_ucx_stop(struct fed *f)
{
        struct list *pos, *tmp;

        f->stopping = true;
        if (f->listener)
                ucp_listener_destroy(f->listener);
        f->listener = NULL;
        if (f->cfg.listen) {
                uv_timer_stop(&f->listen_timer);
                uv_close((uv_handle_t *)&f->listen_timer, NULL);
        }
        uv_timer_stop(&f->sweep);
        uv_close((uv_handle_t *)&f->sweep, NULL);
        list_for_each_safe(pos, tmp, &f->conns)
                fed_close(list_entry(pos, struct conn, link), "dlxfed is stopping");
        /* every endpoint closed, UCX done with every registration */
        while (!list_empty(&f->closing)) {
                ucp_worker_progress(f->worker);
                conns_reap(f);
        }
        fed_export_stop(f);
        uv_prepare_stop(&f->ucx_prepare);
        uv_poll_stop(&f->ucx_poll);
        uv_close((uv_handle_t *)&f->ucx_prepare, NULL);
        uv_close((uv_handle_t *)&f->ucx_poll, NULL);
        ucp_worker_destroy(f->worker);
        ucp_cleanup(f->ctx);
}
