/* SPDX-License-Identifier: MIT */
#include "dispatch.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "registry.h"
#include "wire.h"

static enum dispatch_result hello(struct session *s, const struct wire_request *req)
{
        struct wire_reply rep;

        if (s->greeted) {
                session_fail(s, req->id, -EPROTO, "hello sent twice");
                return DISPATCH_CLOSE;
        }
        if (req->hello.major != DLX_PROTO_MAJOR) {
                session_fail(s, req->id, -EPROTONOSUPPORT,
                             "protocol version %u.%u is not supported: dlxd " DLX_VERSION
                             " speaks %d.%d",
                             req->hello.major, req->hello.minor, DLX_PROTO_MAJOR, DLX_PROTO_MINOR);
                return DISPATCH_CLOSE;
        }
        s->greeted = true;
        s->minor = req->hello.minor;
        snprintf(s->name, sizeof(s->name), "%s", req->hello.client_name);
        log_session(info, s, "hello from '%s' (protocol %u.%u)", s->name, req->hello.major,
                    req->hello.minor);

        memset(&rep, 0, sizeof(rep));
        rep.id = req->id;
        rep.type = WIRE_REP_HELLO;
        rep.hello.major = DLX_PROTO_MAJOR;
        rep.hello.minor = DLX_PROTO_MINOR;
        rep.hello.session = s->id;
        snprintf(rep.hello.server, sizeof(rep.hello.server), "dlxd %s", DLX_VERSION);
        rep.hello.uid = (uint32_t)s->uid;
        rep.hello.max_frame = DLX_MAX_FRAME;
        rep.hello.max_inflight = DLX_MAX_INFLIGHT;
        registry_limits_for(s, &rep.hello.limits);
        /* releases without a system call; without a ring they simply travel as frames */
        int ring = registry_ring_create(s);
        if (ring >= 0 &&
            (registry_ring_spare_fd(ring) < 0 || (s->io.fd_room && !s->io.fd_room(s->io.ctx)))) {
                /*
                 * Short of descriptors, or of room to send one without waiting:
                 * greet without a ring rather than late or not at all.
                 */
                registry_ring_destroy(s);
                close(ring);
                ring = -1;
        }
        rep.hello.release_ring = ring >= 0;
        session_send(s, &rep, ring);
        if (ring >= 0)
                close(ring);
        return DISPATCH_OK;
}

enum dispatch_result dispatch_frame(struct session *s, struct frame *f)
{
        struct wire_request req;
        char err[DLX_ERROR_MAX + 1];
        int fd = -1, r;

        r = wire_request_decode(f->payload, f->len, &req, err, sizeof(err));
        /* a request refused at decode still counts as its type, where that could be read */
        s->cur = (struct req_ctx){.id = req.id,
                                  .type = (unsigned)req.type < WIRE_REQ_COUNT ? req.type
                                                                              : WIRE_REQ_NONE};
        if (s->cur.type == WIRE_REQ_ACQUIRE || s->cur.type == WIRE_REQ_PUBLISH)
                s->cur.t0_ns = metrics_now_ns();
        s->reg->metrics.requests[s->cur.type]++;
        if (r < 0) {
                frame_close_fds(f);
                if (r == -EPROTO || req.id == 0 || !s->greeted) {
                        log_session(notice, s, "dropped: %s", err);
                        if (req.id)
                                session_fail(s, req.id, r, "%s", err);
                        else
                                session_fail(s, 0, -EPROTO, "%s", err);
                        return DISPATCH_CLOSE;
                }
                session_fail(s, req.id, r, "%s", err);
                return DISPATCH_OK;
        }
        s->reg->requests++;
        if (s->broken) {
                /* its connection is ending: nothing more from it is acted on */
                frame_close_fds(f);
                return DISPATCH_CLOSE;
        }

        if (!s->greeted && req.type != WIRE_REQ_HELLO) {
                frame_close_fds(f);
                session_fail(s, req.id, -EPROTO, "%s before hello", wire_request_name(req.type));
                return DISPATCH_CLOSE;
        }
        /* a client bug, not malice: the leases it still holds are worth keeping */
        if (s->retired && req.type != WIRE_REQ_RELEASE && req.type != WIRE_REQ_PING) {
                frame_close_fds(f);
                session_fail(s, req.id, -ECONNRESET, "%s after bye: this client is closed",
                             wire_request_name(req.type));
                return DISPATCH_OK;
        }
        if (f->nfds > (req.type == WIRE_REQ_PUBLISH || req.type == WIRE_REQ_ALLOC ? 1u : 0u)) {
                unsigned nfds = f->nfds;

                frame_close_fds(f);
                session_fail(s, req.id, -EPROTO, "%u fds attached to a %s request", nfds,
                             wire_request_name(req.type));
                return DISPATCH_CLOSE;
        }
        if (f->nfds == 1) {
                fd = f->fds[0];
                f->nfds = 0;
        }

        switch (req.type) {
        case WIRE_REQ_HELLO:
                return hello(s, &req);
        case WIRE_REQ_PUBLISH:
                registry_publish(s, &req, fd);
                break;
        case WIRE_REQ_ACQUIRE:
                registry_acquire(s, &req);
                break;
        case WIRE_REQ_RELEASE:
                registry_release(s, &req);
                break;
        case WIRE_REQ_UNPUBLISH:
                registry_unpublish(s, &req);
                break;
        case WIRE_REQ_LIST:
                registry_list(s, &req);
                break;
        case WIRE_REQ_STAT:
                registry_stat(s, &req);
                break;
        case WIRE_REQ_WATCH:
                registry_watch(s, &req);
                break;
        case WIRE_REQ_UNWATCH:
                registry_unwatch(s, &req);
                break;
        case WIRE_REQ_TRACK:
                registry_track(s, &req);
                break;
        case WIRE_REQ_UNTRACK:
                registry_untrack(s, &req);
                break;
        case WIRE_REQ_ALLOC:
                registry_alloc(s, &req, fd);
                break;
        case WIRE_REQ_FREE:
                registry_free(s, &req);
                break;
        case WIRE_REQ_FORGET:
                registry_forget(s, &req);
                break;
        case WIRE_REQ_STATS:
                registry_stats(s, &req);
                break;
        case WIRE_REQ_METRICS:
                registry_metrics(s, &req);
                break;
        case WIRE_REQ_BYE:
                registry_bye(s, &req);
                break;
        case WIRE_REQ_MOUNT:
                registry_mount(s, &req);
                break;
        case WIRE_REQ_FETCH_FAILED:
                registry_fetch_failed(s, &req);
                break;
        case WIRE_REQ_PING: {
                struct wire_reply rep = {.id = req.id, .type = WIRE_REP_PONG};
                rep.pong.nonce = req.ping.nonce;
                session_send(s, &rep, -1);
                break;
        }
        default:
                session_fail(s, req.id, -EINVAL, "unknown request type");
                break;
        }
        return s->broken ? DISPATCH_CLOSE : DISPATCH_OK;
}
