/* Shared pieces of the zbatch C extension: error conversion and the per-area registration
 * functions (one ext_*.c file per area adds its functions to the module). */
#ifndef ZBPY_EXT_H
#define ZBPY_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "zbatch.h"

/* Raises zbatch.ZbatchError for `st` with this thread's libzbatch detail message (or `detail`
 * when not NULL); returns NULL. */
PyObject *zbpy_raise(zb_status st, const char *detail);

/* n strings as a list of str: string i is data[offsets[i] .. offsets[i+1]) (int64 offsets, or
 * uint64 `uoffsets` when offsets is NULL). Bytes that are not UTF-8 raise ZbatchError
 * (ZB_E_CORRUPT) naming `what` and the string, as zarr-python refuses them; NULL then. */
PyObject *zbpy_strings(const char *data, const int64_t *offsets, const uint64_t *uoffsets,
                       uint64_t n, const char *what);

/* Fills *o from the flat dict of zbatch._remote.remote_options (None: defaults); the strings
 * are borrowed from the dict. Returns 0, or -1 with an exception set. */
int zbpy_remote_opts(PyObject *dict, zb_remote_opts *o);

/* Opens `url` with the options zbpy_remote_opts gave (a local path ignores them). Plain C: call
 * it with the GIL released. */
zb_status zbpy_store_open(const char *url, const zb_remote_opts *remote, zb_store **out);

/* The store's counters as a dict (requests, retries, ranges, bytes, max_in_flight). */
PyObject *zbpy_store_stats(zb_store *store);

/* Each adds its functions to the module; returns 0 or -1 with an exception set. */
int zbpy_register_write(PyObject *module);
int zbpy_register_anndata(PyObject *module);
int zbpy_register_atomic(PyObject *module);
int zbpy_register_dataset(PyObject *module);
int zbpy_register_loader(PyObject *module);
int zbpy_register_neighbors(PyObject *module);
int zbpy_register_sampler(PyObject *module);
int zbpy_register_source(PyObject *module);
int zbpy_register_convert(PyObject *module);
int zbpy_register_remote(PyObject *module);

/* The zb_dataset behind a zbatch._zbatch._Dataset (TypeError and NULL otherwise). */
zb_dataset *zbpy_dataset_ptr(PyObject *obj);

/* Wraps a C batch (taking ownership) into the dict zbatch.dataset.Batch reads: fields as
 * (buffer, typestr, shape, kind, segment), "segments", "index", "dataset", "stats". */
PyObject *zbpy_batch_to_dict(zb_batch *batch);

/* "O&" converter for an unsigned 64-bit argument (each "K" of the argument formats; "K" itself
 * reduces modulo 2^64, so 2**64 + 5 would be 5 and -1 would be 2**64 - 1): an int (or anything
 * with __index__) in [0, 2**64), else OverflowError or TypeError. */
int zbpy_u64(PyObject *obj, void *out);
/* The UTF-8 of str `obj` (borrowed, lives as long as obj), or NULL with an exception: TypeError
 * for a non-str, ValueError for one holding a NUL character (C would see it cut short there:
 * "a\x00b" would silently be "a"). */
const char *zbpy_str(PyObject *obj);

/* The same for an unsigned int ("I" is as unchecked): [0, 2**32). */
int zbpy_u32(PyObject *obj, void *out);
/* The same dict for a batch someone else owns: its buffers hold `owner`, which must keep the
 * batch alive. */
PyObject *zbpy_batch_dict(const zb_batch *batch, PyObject *owner);

/* Wraps a device batch (taking ownership) into a zbatch._zbatch._DeviceBatch (ext_device.c). */
PyObject *zbpy_device_batch_new(zb_device_batch *db);
int zbpy_register_device(PyObject *module);

#endif
