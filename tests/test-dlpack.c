/* SPDX-License-Identifier: MIT */
/*
 * The DLPack header, built twice by meson: as found (the system header when
 * installed) and with DLX_DLPACK_BUNDLED (the project's own definitions).
 * Either way every DLPack 1.3 name must exist with the specified value and
 * layout, and a later #include <dlpack/dlpack.h> must not clash.
 */
#include <check.h>
#include <stddef.h>

#include <dlx/dlpack.h>
#if defined(__has_include)
#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
#define HAVE_SYSTEM_DLPACK 1
#endif
#endif

START_TEST(source_is_the_expected_one)
{
#if defined(DLX_DLPACK_BUNDLED)
        ck_assert_int_eq(DLX_DLPACK_SOURCE, DLX_DLPACK_OWN);
#elif defined(HAVE_SYSTEM_DLPACK)
        ck_assert(DLX_DLPACK_SOURCE == DLX_DLPACK_SYSTEM ||
                  DLX_DLPACK_SOURCE == DLX_DLPACK_SYSTEM_0X);
#else
        ck_assert_int_eq(DLX_DLPACK_SOURCE, DLX_DLPACK_OWN);
#endif
        /* whatever the source, code may fill a version from the 1.x macros */
        DLPackVersion v = {.major = DLPACK_MAJOR_VERSION, .minor = DLPACK_MINOR_VERSION};
        ck_assert_uint_eq(v.major, 1);
        ck_assert_uint_ge(v.minor, 2);
}
END_TEST

START_TEST(device_codes)
{
        ck_assert_int_eq(kDLCPU, 1);
        ck_assert_int_eq(kDLCUDA, 2);
        ck_assert_int_eq(kDLCUDAHost, 3);
        ck_assert_int_eq(kDLOpenCL, 4);
        ck_assert_int_eq(kDLVulkan, 7);
        ck_assert_int_eq(kDLMetal, 8);
        ck_assert_int_eq(kDLVPI, 9);
        ck_assert_int_eq(kDLROCM, 10);
        ck_assert_int_eq(kDLROCMHost, 11);
        ck_assert_int_eq(kDLExtDev, 12);
        ck_assert_int_eq(kDLCUDAManaged, 13);
        ck_assert_int_eq(kDLOneAPI, 14);
        ck_assert_int_eq(kDLWebGPU, 15);
        ck_assert_int_eq(kDLHexagon, 16);
        ck_assert_int_eq(kDLMAIA, 17);
        ck_assert_int_eq(kDLTrn, 18);
}
END_TEST

START_TEST(dtype_codes)
{
        ck_assert_int_eq(kDLInt, 0);
        ck_assert_int_eq(kDLUInt, 1);
        ck_assert_int_eq(kDLFloat, 2);
        ck_assert_int_eq(kDLOpaqueHandle, 3);
        ck_assert_int_eq(kDLBfloat, 4);
        ck_assert_int_eq(kDLComplex, 5);
        ck_assert_int_eq(kDLBool, 6);
        ck_assert_int_eq(kDLFloat8_e3m4, 7);
        ck_assert_int_eq(kDLFloat8_e4m3, 8);
        ck_assert_int_eq(kDLFloat8_e4m3b11fnuz, 9);
        ck_assert_int_eq(kDLFloat8_e4m3fn, 10);
        ck_assert_int_eq(kDLFloat8_e4m3fnuz, 11);
        ck_assert_int_eq(kDLFloat8_e5m2, 12);
        ck_assert_int_eq(kDLFloat8_e5m2fnuz, 13);
        ck_assert_int_eq(kDLFloat8_e8m0fnu, 14);
        ck_assert_int_eq(kDLFloat6_e2m3fn, 15);
        ck_assert_int_eq(kDLFloat6_e3m2fn, 16);
        ck_assert_int_eq(kDLFloat4_e2m1fn, 17);
}
END_TEST

START_TEST(flag_bits)
{
        ck_assert_uint_eq(DLPACK_FLAG_BITMASK_READ_ONLY, 1);
        ck_assert_uint_eq(DLPACK_FLAG_BITMASK_IS_COPIED, 2);
        ck_assert_uint_eq(DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, 4);
}
END_TEST

START_TEST(struct_layout)
{
        ck_assert_uint_eq(sizeof(DLPackVersion), 8);
        ck_assert_uint_eq(offsetof(DLPackVersion, minor), 4);
        ck_assert_uint_eq(sizeof(DLDataType), 4);
        ck_assert_uint_eq(offsetof(DLDataType, bits), 1);
        ck_assert_uint_eq(offsetof(DLDataType, lanes), 2);
        ck_assert_uint_eq(sizeof(DLDevice), 8);
        ck_assert_uint_eq(offsetof(DLDevice, device_id), 4);
        ck_assert_uint_eq(offsetof(DLTensor, data), 0);
        ck_assert_uint_eq(offsetof(DLTensor, device), 8);
        ck_assert_uint_eq(offsetof(DLTensor, ndim), 16);
        ck_assert_uint_eq(offsetof(DLTensor, dtype), 20);
        ck_assert_uint_eq(offsetof(DLTensor, shape), 24);
        ck_assert_uint_eq(offsetof(DLTensor, strides), 32);
        ck_assert_uint_eq(offsetof(DLTensor, byte_offset), 40);
        ck_assert_uint_eq(sizeof(DLTensor), 48);
        ck_assert_uint_eq(offsetof(DLManagedTensor, manager_ctx), 48);
        ck_assert_uint_eq(offsetof(DLManagedTensor, deleter), 56);
        ck_assert_uint_eq(offsetof(DLManagedTensorVersioned, version), 0);
        ck_assert_uint_eq(offsetof(DLManagedTensorVersioned, manager_ctx), 8);
        ck_assert_uint_eq(offsetof(DLManagedTensorVersioned, deleter), 16);
        ck_assert_uint_eq(offsetof(DLManagedTensorVersioned, flags), 24);
        ck_assert_uint_eq(offsetof(DLManagedTensorVersioned, dl_tensor), 32);
        ck_assert_uint_eq(sizeof(DLManagedTensorVersioned), 80);
        ck_assert_uint_eq(sizeof(DLPackExchangeAPIHeader), 16);
        ck_assert_uint_eq(offsetof(DLPackExchangeAPIHeader, prev_api), 8);
        ck_assert_uint_eq(offsetof(DLPackExchangeAPI, managed_tensor_allocator), 16);
        ck_assert_uint_eq(offsetof(DLPackExchangeAPI, managed_tensor_from_py_object_no_sync), 24);
        ck_assert_uint_eq(offsetof(DLPackExchangeAPI, managed_tensor_to_py_object_no_sync), 32);
        ck_assert_uint_eq(offsetof(DLPackExchangeAPI, dltensor_from_py_object_no_sync), 40);
        ck_assert_uint_eq(offsetof(DLPackExchangeAPI, current_work_stream), 48);
        ck_assert_uint_eq(sizeof(DLPackExchangeAPI), 56);
}
END_TEST

static int fake_stream(DLDeviceType type, int32_t id, void **out)
{
        *out = (void *)(intptr_t)(type * 100 + id);
        return 0;
}

START_TEST(exchange_table_is_usable)
{
        DLPackExchangeAPI api = {
                .header = {.version = {DLX_DLPACK_MAJOR, DLX_DLPACK_MINOR}, .prev_api = NULL},
                .current_work_stream = fake_stream,
        };
        void *s = NULL;

        ck_assert_int_eq(api.current_work_stream(kDLCUDA, 3, &s), 0);
        ck_assert_ptr_eq(s, (void *)(intptr_t)203);
        ck_assert_uint_eq(api.header.version.major, 1);
        ck_assert_uint_eq(api.header.version.minor, 3);
}
END_TEST

Suite *dlpack_suite(void)
{
        Suite *s = suite_create("dlpack");
        TCase *tc = tcase_create("header");

        tcase_add_test(tc, source_is_the_expected_one);
        tcase_add_test(tc, device_codes);
        tcase_add_test(tc, dtype_codes);
        tcase_add_test(tc, flag_bits);
        tcase_add_test(tc, struct_layout);
        tcase_add_test(tc, exchange_table_is_usable);
        suite_add_tcase(s, tc);
        return s;
}
