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

#endif
