/* SPDX-License-Identifier: MIT */
/*
 * Tests for proto/sockpath.c: where the daemon's socket is, and where the
 * federation bridge of that daemon answers dlxctl peers (dlxfed.sock beside
 * dlxd.sock, dlxfed-NAME beside any other NAME, so that two daemons in one
 * directory have two bridges' sockets).
 */
#include "sockpath.h"

#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void expect_control(const char *dlxd, const char *want)
{
        char buf[108];

        ck_assert_int_eq(sockpath_control(dlxd, buf, sizeof(buf)), 0);
        ck_assert_str_eq(buf, want);
}

START_TEST(test_control_beside_the_daemon)
{
        expect_control("/run/dlx/dlxd.sock", "/run/dlx/dlxfed.sock");
        expect_control("/tmp/x/a.sock", "/tmp/x/dlxfed-a.sock");
        expect_control("/tmp/x/b.sock", "/tmp/x/dlxfed-b.sock");
        expect_control("/dlxd.sock", "/dlxfed.sock");
        expect_control("dlxd.sock", "./dlxfed.sock");
        expect_control("rel/dir/w", "rel/dir/dlxfed-w");
}
END_TEST

START_TEST(test_control_too_long)
{
        char dlxd[102], buf[108];

        memset(dlxd, 'a', sizeof(dlxd) - 1);
        dlxd[0] = '/';
        dlxd[sizeof(dlxd) - 1] = '\0';
        /* "/dlxfed-" and a name of 100: 108 bytes, no room for the NUL */
        ck_assert_int_eq(sockpath_control(dlxd, buf, sizeof(buf)), -ENAMETOOLONG);
        ck_assert_int_eq(sockpath_control("/a/dlxd.sock", buf, 14), -ENAMETOOLONG);
        ck_assert_int_eq(sockpath_control("/a/dlxd.sock", buf, 15), 0);
        ck_assert_str_eq(buf, "/a/dlxfed.sock");
}
END_TEST

START_TEST(test_resolve_order)
{
        char buf[108];

        setenv("DLX_SOCKET", "/env/dlxd.sock", 1);
        ck_assert_int_eq(sockpath_resolve("/opt/s", buf, sizeof(buf)), 0);
        ck_assert_str_eq(buf, "/opt/s");
        ck_assert(!sockpath_is_default("/opt/s"));
        ck_assert_int_eq(sockpath_resolve(NULL, buf, sizeof(buf)), 0);
        ck_assert_str_eq(buf, "/env/dlxd.sock");
        ck_assert(!sockpath_is_default(NULL));
        unsetenv("DLX_SOCKET");
        setenv("XDG_RUNTIME_DIR", "/run/user/7", 1);
        ck_assert_int_eq(sockpath_resolve("", buf, sizeof(buf)), 0);
        ck_assert_str_eq(buf, "/run/user/7/dlx/dlxd.sock");
        ck_assert(sockpath_is_default(""));
}
END_TEST

Suite *sockpath_suite(void)
{
        Suite *s = suite_create("sockpath");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_control_beside_the_daemon);
        tcase_add_test(tc, test_control_too_long);
        tcase_add_test(tc, test_resolve_order);
        suite_add_tcase(s, tc);
        return s;
}
