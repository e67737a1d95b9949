/* The sampler objects of the zbatch extension, for C code elsewhere in the extension (the
 * loader) that needs the zb_sampler behind a Python sampler. */
#ifndef ZBPY_EXT_SAMPLER_H
#define ZBPY_EXT_SAMPLER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "zbatch.h"
#include "zbatch_sampler.h"

/* Adds the _Sampler type and the sampler_* constructors to the module; 0, or -1 with an
 * exception set. */
int zbpy_register_sampler(PyObject *module);

/* The zb_sampler behind `obj`: a zbatch._zbatch._Sampler, or any object whose `_c` attribute
 * is one (the classes of zbatch.samplers). Returns NULL with a TypeError otherwise. The pointer
 * is borrowed: it lives as long as the _Sampler object, so the caller keeps a reference to
 * `obj` while using it. The GIL must be held for this call; using the sampler afterwards
 * without the GIL is fine as long as no Python thread uses the same object meanwhile (a
 * zb_sampler is used by one thread at a time). */
zb_sampler *zbpy_sampler_ptr(PyObject *obj);

#endif
