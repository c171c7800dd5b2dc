/* SPDX-License-Identifier: MIT */
/*
 * Who may connect, and what they may do: a private daemon (the default)
 * refuses every other uid, at the socket's mode and again on its own; a daemon
 * shared with a group (--group) lets its members in, primary or supplementary,
 * and its names stay writable only by their owners.
 *
 * Other users are played by forked children that drop to uid nobody with
 * chosen groups, so the suite needs root; it skips (77) otherwise.
 */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"

#define NOBODY 65534
#define NOGROUP 65534
#define USERS 100

static DLManagedTensorVersioned *vec(dlx_client *c, float v)
{
        int64_t shape[1] = {4};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}};
        DLManagedTensorVersioned *t = NULL;

        proto.shape = shape;
        ck_assert_msg(dlx_alloc(c, &proto, &t) == 0, "dlx_alloc: %s", dlx_last_error());
        for (int i = 0; i < 4; i++)
                ((float *)t->dl_tensor.data)[i] = v;
        return t;
}

/* How a child becomes someone else, and what it then does. */
struct persona {
        gid_t gid;
        int ngroups; /* supplementary */
        gid_t groups[4];
        int (*body)(dlx_client *c); /* NULL: only connect, and report how that went */
};

/*
 * Exit status: the body's result, or for a persona without a body 0 when
 * connected, 1 for -EACCES from the daemon's refusal with a reason, 2 for
 * -EACCES from the socket's mode, 3 for any other failure.
 */
static int persona_main(void *p)
{
        const struct persona *who = p;
        struct dlx_connect_options o = {.socket_path = fx.socket};
        dlx_client *c = NULL;
        int err, rc;

        if (setgroups((size_t)who->ngroups, who->groups) != 0 || setgid(who->gid) != 0 ||
            setuid(NOBODY) != 0)
                return 90;
        err = dlx_connect(&o, &c);
        if (!who->body) {
                if (c)
                        dlx_close(c);
                if (err == 0)
                        return 0;
                if (err != -EACCES)
                        return 3;
                return strstr(dlx_last_error(), "may not connect") ||
                                       strstr(dlx_last_error(), "is not in group")
                               ? 1
                               : 2;
        }
        if (err != 0)
                return 91;
        rc = who->body(c);
        dlx_close(c);
        return rc;
}

static int run_as(const struct persona *who)
{
        return fx_wait(fx_spawn(persona_main, (void *)who));
}

/* Lets others traverse to the socket, and (when open) write to it too. */
static void open_path(bool socket_too)
{
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        if (socket_too)
                ck_assert_int_eq(chmod(fx.socket, 0666), 0);
}

/* ---- private ------------------------------------------------------------------------------- */

START_TEST(private_refuses_other_uids)
{
        struct persona nobody = {.gid = NOGROUP};
        struct stat st;

        dlxd_start(&fx, NULL);
        ck_assert_int_eq(stat(fx.socket, &st), 0);
        ck_assert_uint_eq(st.st_mode & 0777, 0600);
        /* the kernel refuses first: the socket is 0600 */
        open_path(false);
        ck_assert_int_eq(run_as(&nobody), 2);
        /* with the socket opened by mistake, the daemon still refuses, saying why */
        open_path(true);
        ck_assert_int_eq(run_as(&nobody), 1);
        dlxd_stop(&fx);
}
END_TEST

/* ---- shared with a group ------------------------------------------------------------------- */

static const char *const shared_args[] = {"--group", "65534", NULL};

START_TEST(group_socket_mode)
{
        struct stat st;

        dlxd_start(&fx, shared_args);
        ck_assert_int_eq(stat(fx.socket, &st), 0);
        ck_assert_uint_eq(st.st_mode & 0777, 0660);
        ck_assert_uint_eq(st.st_gid, NOGROUP);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(group_members_only)
{
        struct persona member = {.gid = NOGROUP};
        struct persona supplementary = {.gid = USERS, .ngroups = 1, .groups = {NOGROUP}};
        struct persona outsider = {.gid = USERS};

        dlxd_start(&fx, shared_args);
        open_path(false);
        ck_assert_int_eq(run_as(&member), 0);
        ck_assert_int_eq(run_as(&supplementary), 0);
        /* not in the group: the socket's mode says no */
        ck_assert_int_eq(run_as(&outsider), 2);
        /* and so does the daemon, if the mode is opened by mistake */
        open_path(true);
        ck_assert_int_eq(run_as(&outsider), 1);
        dlxd_stop(&fx);
}
END_TEST

/* As a member: root's name is readable, not writable; its own name is its own. */
static int member_reads_and_owns(dlx_client *c)
{
        DLManagedTensorVersioned *t;
        struct dlx_publish_options persist = {.persist = true};

        if (dlx_acquire(c, "own/root", NULL, &t) != 0)
                return 10;
        int ok = ((const float *)t->dl_tensor.data)[0] == 1.0f;
        t->deleter(t);
        if (!ok)
                return 11;
        if (dlx_publish(c, "own/root", vec(c, 2), NULL, NULL) != -EACCES)
                return 12;
        if (!strstr(dlx_last_error(), "owned by uid 0"))
                return 13;
        if (dlx_unpublish(c, "own/root") != -EACCES)
                return 14;
        /* persistent, so that root can look at it once this client has gone */
        if (dlx_publish(c, "own/nobody", vec(c, 3), &persist, NULL) != 0)
                return 15;
        return 0;
}

START_TEST(names_belong_to_their_uid)
{
        struct persona member = {.gid = NOGROUP, .body = member_reads_and_owns};
        struct dlx_info info;
        dlx_client *c;

        dlxd_start(&fx, shared_args);
        open_path(false);
        c = fx_connect(&fx, "root");
        ck_assert_int_eq(dlx_publish(c, "own/root", vec(c, 1), NULL, NULL), 0);
        ck_assert_int_eq(run_as(&member), 0);
        ck_assert_int_eq(dlx_stat(c, "own/nobody", &info), 0);
        ck_assert_uint_eq(info.owner_uid, NOBODY);
        /* root may replace and remove anyone's name */
        ck_assert_int_eq(dlx_publish(c, "own/nobody", vec(c, 4), NULL, NULL), 0);
        ck_assert_int_eq(dlx_unpublish(c, "own/nobody"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

Suite *access_suite(void)
{
        Suite *s;
        TCase *tc;

        if (geteuid() != 0) {
                fprintf(stderr, "access: needs root to play other users; skipped\n");
                exit(77);
        }
        s = suite_create("access");
        tc = tcase_create("access");
        tcase_add_test(tc, private_refuses_other_uids);
        tcase_add_test(tc, group_socket_mode);
        tcase_add_test(tc, group_members_only);
        tcase_add_test(tc, names_belong_to_their_uid);
        suite_add_tcase(s, tc);
        return s;
}
