/* SPDX-License-Identifier: MIT */
/*
 * The listening socket: where it lives (and the checks on its directory),
 * accepting with peer credentials, the client limit, and an orderly stop.
 */
#ifndef DLX_DAEMON_SERVER_H
#define DLX_DAEMON_SERVER_H

#include <stdbool.h>
#include <sys/un.h>
#include <uv.h>

#include "list.h"
#include "ticker.h"

struct registry;
struct server;

struct server {
        uv_loop_t *loop;
        struct registry *reg;
        int listen_fd;
        uv_poll_t listen_poll;
        uv_timer_t backoff; /* accept paused after EMFILE/ENFILE */
        char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
        struct list conns;
        struct list doomed; /* conns to close from the loop, not from deep inside a request */
        uv_idle_t reaper;
        struct list dirty; /* conns with replies queued outside their own batch */
        uv_idle_t flusher;
        uv_idle_t closer;  /* closes what the store deferred (store.h), after the replies */
        struct list awake; /* conns whose release ring is awake: swept every CONN_QUIET_MS */
        struct ticker sweep;
        struct list stalled;   /* conns not greeted yet or inside a frame: timed out */
        struct list unread;    /* conns whose peer has output or fds to read: timed out */
        struct list lingering; /* sockets of dropped peers with fds unread (conn.c) */
        struct ticker watchdog;
        /*
         * Descriptors in flight (sent, not yet received) are charged to our uid,
         * and past RLIMIT_NOFILE of them every fd-carrying sendmsg fails
         * (ETOOMANYREFS). Peers that do not read must not spend that for the
         * others: each connection may have a few unread, all of them together a
         * budget, and a connection over either waits for its peer to read.
         */
        unsigned fds_unread; /* sum of the connections' fds_unread */
        unsigned fds_budget; /* half the descriptor limit; one uid may use half of it */
        struct list fd_wait; /* conns whose next fd waits */
        struct ticker fd_ticker;
        unsigned nconns;
        bool shared; /* --group: the socket is 0660 to this group, whose members may connect */
        gid_t group;
        bool listening;
        bool adopted; /* the socket was inherited (systemd): its file is not ours to remove */
        bool backoff_logged;
};

/*
 * Creates the socket's directory if needed (0700; 0710 to group when shared),
 * checks it (a real directory, owned by us or root, not writable by others
 * unless sticky and root's), refuses a path a live daemon answers on,
 * replaces a stale socket, and listens with mode 0600 (0660 to group when
 * shared). Only our uid and root may connect, and members of group when
 * shared; the kernel checks the socket's mode, and each peer's credentials
 * are checked again on accept. Returns 0 or -errno with a message logged.
 */
int server_start(struct server *srv, uv_loop_t *loop, struct registry *reg, const char *path,
                 bool shared, gid_t group);

/*
 * The same on fd, a listening AF_UNIX stream socket that was inherited
 * (systemd's socket activation): its file, mode and owner are its creator's,
 * and only the peers are checked. Returns 0 or -errno (fd closed on failure).
 */
int server_adopt(struct server *srv, uv_loop_t *loop, struct registry *reg, int fd, bool shared,
                 gid_t group);

/* Stops accepting, closes every connection and removes the socket file (not an adopted one's). */
void server_stop(struct server *srv);

/* A connection ended (called by conn). */
void server_conn_gone(struct server *srv);

/* Runs conn_reap() from the loop soon. */
void server_schedule_reap(struct server *srv);

/* Runs conn_flush_dirty() at the end of this loop iteration. */
void server_schedule_flush(struct server *srv);
/* Runs it now (no list walk in progress), instead of at the end of the iteration. */
void server_flush(struct server *srv);

/* Runs conn_sweep_rings() every CONN_QUIET_MS while srv->awake is not empty. */
void server_schedule_sweep(struct server *srv);

/* Runs conn_check_stalled() a few times per timeout while srv->stalled or srv->unread is not
 * empty. */
void server_schedule_watchdog(struct server *srv);

/* Runs conn_check_fd_wait() every few milliseconds while srv->fd_wait is not empty. */
void server_schedule_fd_wait(struct server *srv);

#endif /* DLX_DAEMON_SERVER_H */
