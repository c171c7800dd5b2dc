/* SPDX-License-Identifier: MIT */
/*
 * One main for every Check binary: the build names the suite with
 * -DDLX_SUITE=<area>_suite. Exit status: 0 all passed, 1 a failure,
 * 77 (meson's skip) when the suite's setup says this host has nothing to test.
 */
#include <check.h>
#include <stdlib.h>

Suite *DLX_SUITE(void);

int main(void)
{
        SRunner *sr = srunner_create(DLX_SUITE());
        srunner_run_all(sr, CK_NORMAL);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
