/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <check.h>

#include "tables.h"

static uint64_t align_up(uint64_t v, uint64_t a)
{
        return (v + a - 1) / a * a;
}

void gbuild(struct gseg *g, const struct gspec *s, uint32_t n, uint64_t data_bytes, bool apart)
{
        uint64_t ndims = 0, names_size = 0, members_off, dims_off, names_off, data_off;

        for (uint32_t i = 0; i < n; i++) {
                ndims += 2 * (uint64_t)s[i].ndim;
                names_size += strlen(s[i].name) + 1;
        }
        members_off = align_up(sizeof(struct group_head), 8);
        dims_off = align_up(members_off + n * sizeof(struct group_member), 8);
        names_off = dims_off + ndims * 8;
        data_off =
                apart ? names_off + names_size : align_up(names_off + names_size, GROUP_DATA_ALIGN);
        g->size = data_off + (apart ? 0 : data_bytes);
        g->count = n;
        g->data_bytes = data_bytes;
        g->apart = apart;
        g->p = calloc(1, g->size);
        ck_assert_ptr_nonnull(g->p);
        struct group_head *h = ghead(g);
        memcpy(h->magic, GROUP_MAGIC, 8);
        h->format = apart ? GROUP_FORMAT_APART : GROUP_FORMAT;
        h->count = n;
        h->members_off = members_off;
        h->dims_off = dims_off;
        h->ndims = ndims;
        h->names_off = names_off;
        h->names_size = names_size;
        h->data_off = data_off;
        uint64_t d = 0, no = 0;
        int64_t *dims = (int64_t *)(g->p + dims_off);
        for (uint32_t i = 0; i < n; i++) {
                struct group_member *m = gmember(g, i);
                size_t len = strlen(s[i].name);
                m->offset = (apart ? 0 : data_off) + s[i].data_at;
                m->byte_offset = s[i].byte_offset;
                m->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
                m->dims = d;
                m->name_off = (uint32_t)no;
                m->name_len = (uint16_t)len;
                m->ndim = (uint8_t)s[i].ndim;
                m->dtype_code = s[i].dt.code;
                m->dtype_bits = s[i].dt.bits;
                m->dtype_lanes = s[i].dt.lanes;
                for (int k = 0; k < s[i].ndim; k++) {
                        dims[d + (uint64_t)k] = s[i].shape[k];
                        dims[d + (uint64_t)s[i].ndim + (uint64_t)k] = s[i].strides[k];
                }
                d += 2 * (uint64_t)s[i].ndim;
                memcpy(g->p + names_off + no, s[i].name, len + 1);
                no += len + 1;
        }
        for (uint64_t i = 0; !apart && i < data_bytes; i++)
                g->p[data_off + i] = (uint8_t)i;
}

int gmemfd(const struct gseg *g, int extra_seals)
{
        int fd = memfd_create("group-table", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, (off_t)g->size), 0);
        ck_assert_int_eq(pwrite(fd, g->p, g->size, 0), (ssize_t)g->size);
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | extra_seals), 0);
        return fd;
}

static void publish_req(struct wire_request *req, uint64_t id, const char *name,
                        const struct gseg *g)
{
        struct wire_tensor *t = &req->publish.tensor;

        memset(req, 0, sizeof(*req));
        req->id = id;
        req->type = WIRE_REQ_PUBLISH;
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->dtype = (DLDataType){kDLUInt, 8, 1};
        t->ndim = 1;
        t->shape[0] = (int64_t)g->data_bytes;
        t->strides[0] = 1;
        t->length = g->data_bytes;
        t->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        t->members = g->count;
}

void group_publish_req(struct wire_request *req, uint64_t id, const char *name,
                       const struct gseg *g)
{
        const struct group_head *h = (const struct group_head *)g->p;

        publish_req(req, id, name, g);
        req->publish.tensor.device_type = kDLCPU;
        req->publish.tensor.storage = WIRE_STORAGE_MEMFD;
        req->publish.tensor.offset = h->data_off < g->size ? h->data_off : 0;
}

void device_group_publish_req(struct wire_request *req, uint64_t id, const char *name,
                              const struct gseg *g, uint64_t segment)
{
        struct wire_tensor *t = &req->publish.tensor;

        publish_req(req, id, name, g);
        t->device_type = kDLCUDA;
        t->segment = segment;
        t->has_device_uuid = true;
        memset(t->device_uuid, 0x5a, sizeof(t->device_uuid));
        t->has_event = true;
        memset(t->event, 0xe7, sizeof(t->event));
        if (segment) {
                t->storage = WIRE_STORAGE_CUDA_VMM;
        } else {
                t->storage = WIRE_STORAGE_CUDA_IPC;
                t->has_ipc_handle = true;
                memset(t->ipc_handle, 0x1c, sizeof(t->ipc_handle));
                req->publish.segment_size = g->data_bytes;
        }
}
