/* SPDX-License-Identifier: MIT */
/*
 * Attacks on dlxfed, by an independent tester, against what README.md
 * ("Federation: tensors across hosts"), dlxfed --help, include/dlx/dlx.h and
 * federation/fed.proto promise. The fixture (two dlxd and two dlxfed on
 * loopback, UCX_TLS=tcp, UCX_NET_DEVICES=lo) is tests/fedhosts.h.
 * Each test names the promise it checks; a failing test is a finding.
 * The hostile-peer attacks need a UCX client: tests/fedattack/hostile.c.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fedhosts.h"

/* A tensor of n bytes on host A, every byte set. */
static void publish_bytes(dlx_client *pa, const char *name, int64_t n)
{
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = &n};
        DLManagedTensorVersioned *t;

        DLXV(dlx_alloc(pa, &proto, &t));
        memset(t->dl_tensor.data, 0x5a, (size_t)n);
        publish_ok(pa, name, t, NULL, NULL);
}

/*
 * README: "A peer that dies takes its mirrors with it (copies consumers hold
 * stay readable)"; the issue: "the waiting acquire completes normally or
 * fails with the fetch's error". Here the endpoint goes (A's --lease-ms
 * passes during a big transfer), B's mirror of model/w is unpublished while a
 * consumer holds it, and the next want of model/w pulls v1 again: the
 * bridge's publish gets -EEXIST (the held v1 is the name's last version),
 * which importer.c's publish_mirror() takes as success, so the waiter hears
 * nothing and times out, and every later want costs a full copy on A.
 */
START_TEST(a_held_mirror_can_be_pulled_again)
{
        const char *a_args[] = {"--export", "model/", "--peer", peer_b, "--lease-ms", "30", NULL};
        const char *b_args[] = {"--peer", peer_a, NULL};
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *held, *t;
        struct dlx_info in;
        int err;

        hosts_up();
        set_peers();
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, a_args), 0);
        ck_assert_int_eq(fed_start(&B, "b", FED_SECRET, b_args), 0);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 1), NULL, NULL);
        publish_bytes(pa, "model/big", 256 << 20);
        held = acquire_at(pb, "@a/model/w", 0, 10000 * fx_slowdown(), &err);
        DLXV(err);
        /* a transfer longer than 30 ms: A closes the endpoint, B loses peer a's mirrors */
        t = acquire_at(pb, "@a/model/big", 0, 20000 * fx_slowdown(), &err);
        ck_assert_msg(err != 0, "the 256 MiB pull beat A's 30 ms lease deadline; no test");
        for (int i = 0; i < 200 && dlx_stat(pb, "@a/model/w", &in) == 0; i++)
                fx_sleep_ms(50);
        ck_assert_int_eq(dlx_stat(pb, "@a/model/w", &in), -ENOENT);
        ck_assert(fx_vec_is(held, 64, 1));
        /* peer a is alive: a new want reconnects and gets model/w, or fails saying why */
        t = acquire_at(pb, "@a/model/w", 0, 5000 * fx_slowdown(), &err);
        ck_assert_msg(err == 0 || err != -ETIMEDOUT,
                      "a want of a name the peer serves timed out with no word from the bridge: "
                      "%s (%s); A served it %d times",
                      dlx_strerror(err), dlx_last_error(), log_count(&A, "on v1 (256 bytes)"));
        if (t)
                t->deleter(t);
        held->deleter(held);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "one network copy per host per version. Wants of one name are
 * coalesced into one pull." A has v3; one consumer on B waits for any
 * version, another (while that pull runs) for v2 or later: both are served
 * by v3, yet importer.c starts a second pull for the higher min_version.
 */
START_TEST(one_version_is_one_pull)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int i = 0; i < 3; i++)
                publish_bytes(pa, "model/big", 256 << 20);
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                dlx_client *c = fx_connect(&B.d, "first");
                DLManagedTensorVersioned *x = acquire_at(c, "@a/model/big", 0, 30000, &err);
                if (x)
                        x->deleter(x);
                fx_child_exit(err == 0 ? 0 : 1);
        }
        wait_pull_started(pa);
        t = acquire_at(pb, "@a/model/big", 2, 30000 * fx_slowdown(), &err);
        DLXV(err);
        t->deleter(t);
        ck_assert_int_eq(fx_wait(child), 0);
        ck_assert_msg(log_count(&A, "on v3 (") == 1, "A sent v3 to B %d times",
                      log_count(&A, "on v3 ("));
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "A restarted bridge mounts its prefixes again and hears of every
 * acquire still waiting"; the issue: "If dlxfed restarts, it reconnects
 * lazily". A bridge stopped cleanly (SIGTERM) after serving one pull cannot
 * listen again on its --listen port for TCP's TIME_WAIT (60 s): UCX binds
 * without SO_REUSEADDR, and dlxfed exits 1, "address in use".
 */
START_TEST(a_stopped_bridge_starts_again_on_its_port)
{
        const char *a_args[] = {"--export", "model/", "--peer", peer_b, NULL};
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        feds_up();
        set_peers();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 1), NULL, NULL);
        t = acquire_at(pb, "@a/model/w", 0, 10000 * fx_slowdown(), &err);
        DLXV(err);
        t->deleter(t);
        fed_stop(&A);
        ck_assert_msg(fed_start(&A, "a", FED_SECRET, a_args) == 0,
                      "dlxfed A would not start again on its port (see %s)", A.log);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "dlxfed sets UCX's TCP segments to 256 KiB ... and leaves the
 * process's signals alone (UCX_ERROR_SIGNALS)". transport.c sets them with
 * ucp_config_modify(), which UCX 1.13 takes and then reports, at
 * ucp_worker_create(), as "invalid configurations: TCP_TX_SEG_SIZE=256k,
 * TCP_RX_SEG_SIZE=256k,ERROR_SIGNALS=": none applies, and UCX installs its
 * SIGSEGV, SIGBUS, SIGILL and SIGFPE handlers in dlxfed.
 */
START_TEST(ucx_leaves_the_signals_alone)
{
        char path[64], line[256];
        unsigned long long caught = 0;
        FILE *in;

#ifdef __SANITIZE_ADDRESS__
        return; /* ASan catches SIGSEGV and SIGBUS itself */
#endif
        hosts_up();
        unsetenv("UCX_ERROR_SIGNALS");
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, NULL), 0);
        snprintf(path, sizeof(path), "/proc/%d/status", (int)A.fed);
        in = fopen(path, "re");
        ck_assert_ptr_nonnull(in);
        while (fgets(line, sizeof(line), in))
                if (strncmp(line, "SigCgt:", 7) == 0)
                        caught = strtoull(line + 7, NULL, 16);
        fclose(in);
        int segv = (caught >> (SIGSEGV - 1)) & 1, bus = (caught >> (SIGBUS - 1)) & 1;
        int invalid = log_count(&A, "invalid configuration");
        fed_stop(&A);
        ck_assert_msg(!segv && !bus, "dlxfed catches SIGSEGV %d, SIGBUS %d (SigCgt %llx)", segv,
                      bus, caught);
        ck_assert_msg(invalid == 0, "UCX called dlxfed's settings invalid");
        hosts_down();
}
END_TEST

/*
 * README: "--config FILE takes the same options, one per line (... export
 * model/, # comments)" and "By default nothing is [exported]". A '#' inside a
 * value (a legal name byte) cuts the line there: "export my#model/" exports
 * "my", and with it every name starting "my".
 */
START_TEST(a_hash_in_a_config_value_does_not_widen_an_export)
{
        char cfg[160], line[128];
        const char *a_args[] = {"--config", cfg, NULL};
        const char *b_args[] = {"--peer", line, NULL};
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        FILE *out;
        int err;

        hosts_up();
        set_peers();
        snprintf(cfg, sizeof(cfg), "%s/fed.conf", A.d.dir);
        out = fopen(cfg, "we");
        ck_assert_ptr_nonnull(out);
        fprintf(out, "# A's bridge\npeer %s\nexport my#model/\n", peer_b);
        fclose(out);
        snprintf(line, sizeof(line), "a=127.0.0.1:%d", A.port);
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, a_args), 0);
        ck_assert_int_eq(fed_start(&B, "b", FED_SECRET, b_args), 0);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "mysecrets/key", fx_vec_f32(pa, 8, 0), NULL, NULL);
        t = acquire_at(pb, "@a/mysecrets/key", 0, 10000 * fx_slowdown(), &err);
        if (t)
                t->deleter(t);
        ck_assert_msg(err != 0, "'mysecrets/key' left A under 'export my#model/'");
        unlink(cfg);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * The issue: "dlxd A restarted under a running dlxfed A: a clear exit or
 * error?" dlxfed logs "the local dlxd went away" and exits 0: to a service
 * manager (Restart=on-failure) a clean stop, so the host stops exporting.
 */
START_TEST(a_lost_dlxd_is_a_failed_exit)
{
        int status;
        pid_t fed;

        hosts_up();
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, NULL), 0);
        fed = A.fed;
        /* dlxd stops (SIGTERM) under its running bridge, then comes back */
        ck_assert_int_eq(kill(A.d.pid, SIGTERM), 0);
        ck_assert_int_eq(waitpid(A.d.pid, NULL, 0), A.d.pid);
        A.d.pid = 0;
        ck_assert_int_eq(waitpid(fed, &status, 0), fed);
        A.fed = 0;
        ck_assert_msg(log_count(&A, "the local dlxd went away") == 1, "no word of it in the log");
        dlxd_restart(&A.d, (const char *const[]){"--federation-uid", "0", NULL});
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0,
                      "dlxfed exited 0x%x when its dlxd went away", status);
        hosts_down();
}
END_TEST

Suite *federation_attacks_suite(void)
{
        Suite *s = suite_create("federation-attacks");
        TCase *tc = tcase_create("loopback");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, a_held_mirror_can_be_pulled_again);
        tcase_add_test(tc, one_version_is_one_pull);
        tcase_add_test(tc, a_stopped_bridge_starts_again_on_its_port);
        tcase_add_test(tc, ucx_leaves_the_signals_alone);
        tcase_add_test(tc, a_hash_in_a_config_value_does_not_widen_an_export);
        tcase_add_test(tc, a_lost_dlxd_is_a_failed_exit);
        suite_add_tcase(s, tc);
        return s;
}
