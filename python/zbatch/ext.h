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

/* The zb_dataset behind a zbatch._zbatch._Dataset (TypeError and NULL otherwise). */
zb_dataset *zbpy_dataset_ptr(PyObject *obj);

/* Wraps a C batch (taking ownership) into the dict zbatch.dataset.Batch reads: fields as
 * (buffer, typestr, shape, kind, segment), "segments", "index", "dataset", "stats". */
PyObject *zbpy_batch_to_dict(zb_batch *batch);

/* The same dict for a batch someone else owns: its buffers hold `owner`, which must keep the
 * batch alive. */
PyObject *zbpy_batch_dict(const zb_batch *batch, PyObject *owner);

/* Wraps a device batch (taking ownership) into a zbatch._zbatch._DeviceBatch (ext_device.c). */
PyObject *zbpy_device_batch_new(zb_device_batch *db);
int zbpy_register_device(PyObject *module);

#endif
