/* SPDX-License-Identifier: MIT */
/*
 * Two hosts on the loopback for the federation suites: each a dlxd of its
 * own (struct dlxd_fixture) and a dlxfed, UCX over TCP on lo (UCX_TLS=tcp,
 * UCX_NET_DEVICES=lo, always pinned). A bridge dies with the test process
 * that started it (PR_SET_PDEATHSIG); its log is checked for aborts, broken
 * invariants, sanitizer reports and settings UCX refused when it stops.
 */
#ifndef DLX_TESTS_FEDHOSTS_H
#define DLX_TESTS_FEDHOSTS_H

#include <stdint.h>
#include <sys/types.h>

#include "fixture.h"

#define DLXV(call)                                                                                 \
        do {                                                                                       \
                int err_ = (call);                                                                 \
                ck_assert_msg(err_ == 0, "%s: %s (%s)", #call, dlx_strerror(err_),                 \
                              dlx_last_error());                                                   \
        } while (0)

struct host {
        struct dlxd_fixture d;
        pid_t fed;
        int port;
        char log[128];
};

extern struct host A, B;

/* A free TCP port on the loopback (the kernel's choice, given back at once). */
int free_port(void);
/* path, mode 0600, holding text. */
void write_secret(const char *path, const char *text);
/*
 * Starts h's dlxfed: alias, the secret's text, then extra arguments; waits
 * until it serves. Returns 0, or its exit status when it would not start.
 */
int fed_start(struct host *h, const char *alias, const char *secret, const char *const *extra);
/* SIGTERM; it must exit 0. */
void fed_stop(struct host *h);
void fed_kill(struct host *h);
/* Both dlxd (--federation-uid: this uid) and two free ports; no bridge yet. */
void hosts_up(void);
/* The same, A's dlxd with one more option (key value) */
void hosts_up_a(const char *key, const char *value);
/* The log of h's bridge holds nothing alarming; it and the secrets go. */
void log_clean(struct host *h);
/* Both bridges stopped (exit 0), their logs checked, both dlxd stopped. */
void hosts_down(void);
#define FED_SECRET "a shared secret of the pair"
/* "a=127.0.0.1:PORT" and "b=...": each host's peer entry, once set_peers() has run. */
extern char peer_a[64], peer_b[64];
void set_peers(void);
/*
 * Both bridges, with FED_SECRET: A with --peer b and a_extra, B with --peer
 * a and b_extra (each NULL-terminated, at most 20; NULL: none).
 */
void pair_up(const char *const *a_extra, const char *const *b_extra);
/* B's bridge again (after it stopped or died), on a new port: --peer a and b_extra. */
void b_again(const char *const *b_extra);
/* The usual pair: A exports "model/" and "kv/"; B pulls from A (A's peer list admits B). */
void feds_up(void);
/* Waits up to ms (15 s) for c's name to be at version (0: to be gone); its info. */
struct dlx_info wait_for_ms(dlx_client *c, const char *name, uint64_t version, int ms);
struct dlx_info wait_for(dlx_client *c, const char *name, uint64_t version);
DLManagedTensorVersioned *acquire_at(dlx_client *c, const char *name, uint64_t min_version,
                                     int64_t timeout_ms, int *ret_err);
/* A big tensor on host A: 1 GiB (256 MiB under valgrind), every byte set; its size. */
int64_t publish_big(dlx_client *pa, const char *name);
/* Waits until A's bridge holds a lease: the pull has begun. */
void wait_pull_started(dlx_client *pa);
/* Occurrences of needle in h's bridge's log so far. */
int log_count(struct host *h, const char *needle);

/*
 * A tensor over malloc()ed bytes of ours (byte i is i * 7 + 3), any layout:
 * published by copy.
 */
DLManagedTensorVersioned *raw_new(DLDataType dt, int ndim, const int64_t *shape,
                                  const int64_t *strides, size_t nbytes, uint64_t byte_offset);
/* a and b hold the same elements, each through its own layout. */
void expect_same(const DLTensor *a, const DLTensor *b, const char *what);

#endif /* DLX_TESTS_FEDHOSTS_H */
