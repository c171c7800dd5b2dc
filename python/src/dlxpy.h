/* SPDX-License-Identifier: MIT */
/*
 * dlx._dlx — the CPython extension over libdlx. Shared declarations.
 *
 * GIL rules: every libdlx call that may block, talk to the daemon or run a
 * foreign deleter runs with the GIL released (a deleter that needs the GIL
 * takes it itself, as DLPack asks of them). Pure getters and
 * dlx_tensor_unref() of our own handles run with it held: libdlx never holds
 * a lock of its own while it calls back into foreign code, so that cannot
 * deadlock.
 */
#ifndef DLXPY_H
#define DLXPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include <dlx/dlx.h>

/* Capsule names fixed by the Python array API's DLPack protocol. */
#define DLXPY_CAPSULE "dltensor"
#define DLXPY_CAPSULE_USED "used_dltensor"
#define DLXPY_CAPSULE_VERSIONED "dltensor_versioned"
#define DLXPY_CAPSULE_VERSIONED_USED "used_dltensor_versioned"
/* The DLPack 1.3 exchange-API capsule on a type's __dlpack_c_exchange_api__. */
#define DLXPY_CAPSULE_EXCHANGE_API "dlpack_exchange_api"

/* Blocking waits are cut in slices this long, to notice signals and close(). */
#define DLXPY_SLICE_MS 200

/* ---- errors.c ---- */
extern PyObject *DlxPy_Error;
int dlxpy_errors_init(PyObject *module);
/*
 * Raises the dlx.Error subclass for err (negative errno). detail is the
 * message to show (copied by the caller from dlx_last_error() right after the
 * failing call, in the same thread); NULL or "" uses dlx_strerror(err).
 * Returns NULL.
 */
PyObject *dlxpy_raise(int err, const char *detail);
/*
 * The same for dlx_connect()'s failures, where the errno keeps its meaning
 * but a missing socket (ENOENT, ENOTDIR) is dlx.Disconnected, as a refused
 * one is, rather than dlx.NotFound, which is about names.
 */
PyObject *dlxpy_raise_connect(int err, const char *detail);

/* A copy of dlx_last_error(), taken where the GIL may not be held. */
struct dlxpy_err {
        int err;
        char msg[512];
};
void dlxpy_err_take(struct dlxpy_err *e, int err);

/* ---- dtype.c ---- */
/* Parses "float32", "bfloat16", "float8_e4m3fn", "int16x4" (lanes), ... Returns 0 or -1 (raised).
 */
int dlxpy_dtype_parse(PyObject *name, DLDataType *ret);
/* "float32", or "dtype(code=.., bits=.., lanes=..)" for codes without a name. New reference. */
PyObject *dlxpy_dtype_name(DLDataType dtype);
/* Parses "cpu", "cuda", "cuda:1", "cuda_host", or a (device_type, device_id) pair. */
int dlxpy_device_parse(PyObject *obj, DLDevice *ret);
/* "cpu", "cuda:0", "cuda_host", or "device(type=.., id=..)". New reference. */
PyObject *dlxpy_device_name(DLDevice device);

/* ---- exchange.c ---- */
/* The table on dlx.Tensor's type: its objects are dlx.Tensor instances. */
const DLPackExchangeAPI *dlxpy_exchange_api(void);
int dlxpy_exchange_init(void);
/* _dlx._exchange_counts(): calls of each slot of our table so far. */
PyObject *dlxpy_exchange_counts(PyObject *self, PyObject *unused);
/*
 * Takes a DLPack tensor out of any producer: its type's exchange-API table
 * (1.3 capsule, then 1.2 integer), else __dlpack__(max_version=(1, 3)), else
 * a capsule passed as obj. Exactly one of *ret_versioned / *ret_legacy is set;
 * the caller owns it. *ret_stream gets the producer's current stream for a
 * device tensor when stream_in is NULL. Returns 0 or -1 (raised: the error
 * names publish and name, with the producer's own exception as __cause__).
 */
int dlxpy_take_tensor(PyObject *obj, const char *name, PyObject *stream_obj,
                      DLManagedTensorVersioned **ret_versioned, DLManagedTensor **ret_legacy,
                      void **ret_stream);

/* ---- tensor.c ---- */
typedef struct {
        PyObject_HEAD
        dlx_tensor *h;       /* one reference; NULL once closed */
        uint64_t flags;      /* the wrapped tensor's DLPack flags */
        PyObject *name;      /* str, or None for tensors not from acquire */
        uint64_t version;    /* 0: none */
        const char *storage; /* static string from libdlx, or NULL */
        PyObject *weakrefs;
} DlxPy_Tensor;

extern PyTypeObject DlxPy_TensorType;
int dlxpy_tensor_init(PyObject *module);
/*
 * A new dlx.Tensor owning handle h (consumed on every path). name may be NULL.
 * Returns a new reference or NULL (raised).
 */
PyObject *dlxpy_tensor_new(dlx_tensor *h, uint64_t flags, const char *name, uint64_t version,
                           const char *storage);

/* ---- client.c ---- */
typedef struct {
        PyObject_HEAD
        dlx_client *c;   /* NULL before connect and after the real close */
        bool closing;    /* close() was called: no new call may start */
        int inflight;    /* calls running without the GIL; the last one closes */
        PyObject *stash; /* dict: watch id -> list of events read for that watch */
        PyObject *weakrefs;
} DlxPy_Client;

extern PyTypeObject DlxPy_ClientType;
int dlxpy_client_init(PyObject *module);
/* Marks a call as running (raises ValueError if the client is closed). Returns 0 or -1. */
int dlxpy_client_enter(DlxPy_Client *self);
/* Ends it; performs a close() that waited for it. GIL held. */
void dlxpy_client_leave(DlxPy_Client *self);
/* Seconds (None, a number, math.inf) to milliseconds: -1 is "no limit". Returns 0 or -1. */
int dlxpy_timeout_ms(PyObject *timeout, int64_t dflt, int64_t *ret_ms);

/* ---- watch.c ---- */
extern PyTypeObject DlxPy_WatchType;
int dlxpy_watch_init(PyObject *module);
PyObject *dlxpy_watch_new(DlxPy_Client *client, uint64_t id, PyObject *prefix, int64_t timeout_ms);
/* ---- track.c ---- */
extern PyTypeObject DlxPy_TrackType;
int dlxpy_track_init(PyObject *module);
/* A dlx.Track of client's track id, for name (a str). New reference, or NULL raised. */
PyObject *dlxpy_track_new(DlxPy_Client *client, uint32_t id, PyObject *name);

/* Turns an event into a dlx.Event. New reference. */
PyObject *dlxpy_event_new(const struct dlx_event *ev);
/* dlx.Info from a struct dlx_info. New reference. */
PyObject *dlxpy_info_new(const struct dlx_info *info);

#endif /* DLXPY_H */
