/* Python bindings: the pipelined loader (zb_loader_*). The GIL is released while the C loader
 * works or waits; batches cross into numpy without copies (zbpy_batch_to_dict). */
#include <string.h>

#include "ext.h"
#include "ext_sampler.h"
#include "zbatch_loader.h"
#include "dataset/batch.h"

/* A list of transforms parsed from Python, with the memory they point into. */
typedef struct transform_list {
    zb_transform *transforms;
    uint64_t *columns;
    char **cast_fields; /* [cap]: the cast transforms' field names, else NULL */
    size_t ntransforms;
    size_t cap;
} transform_list;

typedef struct {
    PyObject_HEAD zb_loader *ld;
    PyObject *dataset; /* kept alive: the C loader borrows them */
    PyObject *sampler;
    transform_list tl;
} LoaderObject;

static void
transform_list_free(transform_list *tl)
{
    for (size_t i = 0; tl->cast_fields && i < tl->cap; i++) free(tl->cast_fields[i]);
    free(tl->cast_fields);
    free(tl->transforms);
    free(tl->columns);
    memset(tl, 0, sizeof *tl);
}

static void
loader_close_c(LoaderObject *self)
{
    if (self->ld) {
        zb_loader *ld = self->ld;
        self->ld = NULL;
        Py_BEGIN_ALLOW_THREADS
        zb_loader_close(ld);
        Py_END_ALLOW_THREADS
    }
}

static void
loader_dealloc(LoaderObject *self)
{
    loader_close_c(self);
    Py_XDECREF(self->dataset);
    Py_XDECREF(self->sampler);
    transform_list_free(&self->tl);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static const char *const DTYPES[] = {"bool",    "int8",    "int16",  "int32",  "int64",
                                     "uint8",   "uint16",  "uint32", "uint64", "float16",
                                     "float32", "float64", NULL};

/* Parses a list of tuples ("log1p",), ("normalize_total", target), ("densify", cols|None),
 * ("cast", field, dtype) into tl (free with transform_list_free, also after a failure). */
static int
parse_transforms(PyObject *tlist, transform_list *tl)
{
    memset(tl, 0, sizeof *tl);
    Py_ssize_t nt = tlist && tlist != Py_None ? PySequence_Size(tlist) : 0;
    if (nt < 0) return -1;
    tl->transforms = calloc((size_t)nt + 1, sizeof *tl->transforms);
    tl->cast_fields = calloc((size_t)nt + 1, sizeof *tl->cast_fields);
    tl->cap = tl->cast_fields ? (size_t)nt + 1 : 0;
    if (!tl->transforms || !tl->cast_fields) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *t = PySequence_GetItem(tlist, i);
        if (!t) return -1;
        const char *name = NULL;
        PyObject *a1 = NULL, *a2 = NULL;
        if (!PyArg_ParseTuple(t, "s|OO", &name, &a1, &a2)) {
            Py_DECREF(t);
            return -1;
        }
        zb_transform *z = &tl->transforms[i];
        int ok = 1;
        if (!strcmp(name, "log1p")) {
            z->kind = ZB_TRANSFORM_LOG1P;
        } else if (!strcmp(name, "normalize_total")) {
            z->kind = ZB_TRANSFORM_NORMALIZE_TOTAL;
            z->target_sum = a1 && a1 != Py_None ? PyFloat_AsDouble(a1) : 1e4;
        } else if (!strcmp(name, "densify")) {
            z->kind = ZB_TRANSFORM_DENSIFY;
            if (a1 && a1 != Py_None) {
                Py_ssize_t nc = PySequence_Size(a1);
                free(tl->columns);
                tl->columns = malloc((size_t)(nc > 0 ? nc : 1) * sizeof *tl->columns);
                for (Py_ssize_t k = 0; tl->columns && k < nc; k++) {
                    PyObject *c = PySequence_GetItem(a1, k);
                    tl->columns[k] = c ? PyLong_AsUnsignedLongLong(c) : 0;
                    Py_XDECREF(c);
                }
                z->columns = tl->columns;
                z->ncolumns = (size_t)nc;
            }
        } else if (!strcmp(name, "cast") && a1 && a2 && PyUnicode_Check(a1) &&
                   PyUnicode_Check(a2)) {
            z->kind = ZB_TRANSFORM_CAST;
            tl->cast_fields[i] = strdup(PyUnicode_AsUTF8(a1));
            z->field = tl->cast_fields[i];
            const char *dt = PyUnicode_AsUTF8(a2);
            ok = 0;
            for (int k = 0; DTYPES[k]; k++)
                if (!strcmp(DTYPES[k], dt)) {
                    z->dtype = (zb_dtype)k;
                    ok = 1;
                }
        } else {
            ok = 0;
        }
        Py_DECREF(t);
        if (PyErr_Occurred()) return -1;
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "unknown transform %s", name);
            return -1;
        }
        tl->ntransforms = (size_t)i + 1;
    }
    return 0;
}

static const char *const PLACEMENTS[] = {"host", "pinned", "device"};

/* _Loader(dataset, sampler, prefetch_factor, depth, transforms, more_epochs=0,
 *         same_epoch=False, placement="host", cuda_library=None, cuda_device=0,
 *         num_streams=2, require_placement=False)
 * transforms: a list of tuples ("log1p",), ("normalize_total", target), ("densify", cols|None),
 * ("cast", field, dtype). more_epochs < 0: no end (zb_loader_opts.more_epochs = SIZE_MAX).
 * placement: zb_placement by name (zbatch_cuda.h). */
static int
loader_init(LoaderObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"dataset",     "sampler",     "prefetch_factor",
                             "depth",       "transforms",  "more_epochs",
                             "same_epoch",  "placement",   "cuda_library",
                             "cuda_device", "num_streams", "require_placement",
                             NULL};
    PyObject *dsobj, *smobj, *tlist = NULL;
    unsigned long long prefetch = 4, depth = 2, num_streams = 2;
    long long more_epochs = 0;
    int same_epoch = 0, cuda_device = 0, require = 0;
    const char *placement = "host", *library = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O&O&OLpsziO&p", kwlist, &dsobj, &smobj, zbpy_u64,
                                     &prefetch, zbpy_u64, &depth, &tlist, &more_epochs, &same_epoch,
                                     &placement, &library, &cuda_device, zbpy_u64, &num_streams,
                                     &require))
        return -1;
    int where = -1;
    for (int k = 0; k < 3; k++)
        if (!strcmp(placement, PLACEMENTS[k])) where = k;
    if (where < 0) {
        PyErr_Format(PyExc_ValueError, "placement must be 'host', 'pinned' or 'device', not '%s'",
                     placement);
        return -1;
    }
    zb_dataset *ds = zbpy_dataset_ptr(dsobj);
    if (!ds) return -1;
    zb_sampler *sm = zbpy_sampler_ptr(smobj);
    if (!sm) return -1;
    if (parse_transforms(tlist, &self->tl) < 0) return -1;
    zb_loader_opts o = ZB_LOADER_OPTS_DEFAULT;
    o.prefetch_factor = (size_t)prefetch;
    o.depth = (size_t)depth;
    o.transforms = self->tl.transforms;
    o.ntransforms = self->tl.ntransforms;
    o.more_epochs = more_epochs < 0 ? SIZE_MAX : (size_t)more_epochs;
    o.same_epoch = same_epoch != 0;
    o.placement = (zb_placement)where;
    o.cuda_library = library;
    o.cuda_device = cuda_device;
    o.num_streams = (size_t)num_streams;
    o.require_placement = require != 0;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_loader_open(ds, sm, &o, &self->ld);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        return -1;
    }
    Py_INCREF(dsobj);
    Py_INCREF(smobj);
    self->dataset = dsobj;
    self->sampler = smobj;
    return 0;
}

/* next() -> batch dict, or None at the end of the epoch */
static PyObject *
loader_next(LoaderObject *self, PyObject *noargs)
{
    (void)noargs;
    if (!self->ld) Py_RETURN_NONE;
    zb_batch *b = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_loader_next(self->ld, &b);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    if (!b) Py_RETURN_NONE;
    return zbpy_batch_to_dict(b);
}

/* next_device() -> _DeviceBatch, or None at the end of the epoch */
static PyObject *
loader_next_device(LoaderObject *self, PyObject *noargs)
{
    (void)noargs;
    if (!self->ld) Py_RETURN_NONE;
    zb_device_batch *db = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_loader_next_device(self->ld, &db);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    if (!db) Py_RETURN_NONE;
    return zbpy_device_batch_new(db);
}

/* placement() -> (name, why): where batches go, and why the loader fell back (or None) */
static PyObject *
loader_placement(LoaderObject *self, PyObject *noargs)
{
    (void)noargs;
    const char *why = NULL;
    zb_placement p = self->ld ? zb_loader_placement(self->ld, &why) : ZB_PLACE_HOST;
    return Py_BuildValue("(sz)", PLACEMENTS[p], why);
}

static PyObject *
loader_device_stats(LoaderObject *self, PyObject *noargs)
{
    (void)noargs;
    zb_device_stats s;
    zb_loader_device_stats(self->ld, &s);
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "batches_copied", (unsigned long long)s.batches_copied,
        "bytes_copied", (unsigned long long)s.bytes_copied, "host_blocks",
        (unsigned long long)s.host_blocks, "host_bytes", (unsigned long long)s.host_bytes,
        "device_blocks", (unsigned long long)s.device_blocks, "device_bytes",
        (unsigned long long)s.device_bytes, "retired_pending",
        (unsigned long long)s.retired_pending);
}

static PyObject *
loader_state(LoaderObject *self, PyObject *noargs)
{
    (void)noargs;
    zb_sampler_state s = {0, 0, 0};
    if (self->ld) zb_loader_state(self->ld, &s);
    return Py_BuildValue("{s:K,s:K,s:K}", "seed", (unsigned long long)s.seed, "epoch",
                         (unsigned long long)s.epoch, "position", (unsigned long long)s.position);
}

static PyObject *
loader_close(LoaderObject *self, PyObject *noargs)
{
    (void)noargs;
    loader_close_c(self);
    Py_RETURN_NONE;
}

/* read_transformed(dataset, ids: a uint64 buffer, transforms) -> batch dict: one coalesced
 * read_many, then the transforms the loader would run, in order (batches of Python samplers) */
static PyObject *
read_transformed(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *dsobj, *tlist;
    Py_buffer ids;
    if (!PyArg_ParseTuple(args, "Oy*O", &dsobj, &ids, &tlist)) return NULL;
    zb_dataset *ds = zbpy_dataset_ptr(dsobj);
    transform_list tl;
    if (!ds || parse_transforms(tlist, &tl) < 0) {
        if (ds) transform_list_free(&tl);
        PyBuffer_Release(&ids);
        return NULL;
    }
    if (ids.len % (Py_ssize_t)sizeof(uint64_t)) {
        transform_list_free(&tl);
        PyBuffer_Release(&ids);
        return zbpy_raise(ZB_E_INVALID, "ids must be a uint64 buffer");
    }
    zb_batch *b = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_read_many(ds, ids.buf, (size_t)ids.len / sizeof(uint64_t), &b);
    for (size_t i = 0; st == ZB_OK && i < tl.ntransforms; i++)
        st = zb__transform_apply(&tl.transforms[i], b);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ids);
    transform_list_free(&tl);
    if (st != ZB_OK) {
        zb_batch_free(b);
        return zbpy_raise(st, NULL);
    }
    return zbpy_batch_to_dict(b);
}

static PyMethodDef module_methods[] = {
    {"read_transformed", read_transformed, METH_VARARGS,
     "read_many, then transforms (for batches of Python samplers)"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef loader_methods[] = {
    {"next", (PyCFunction)loader_next, METH_NOARGS, "next batch dict or None"},
    {"next_device", (PyCFunction)loader_next_device, METH_NOARGS, "next _DeviceBatch or None"},
    {"placement", (PyCFunction)loader_placement, METH_NOARGS, "(placement, fallback reason)"},
    {"device_stats", (PyCFunction)loader_device_stats, METH_NOARGS, "device stage counters"},
    {"state", (PyCFunction)loader_state, METH_NOARGS, "sampler state after the last batch"},
    {"close", (PyCFunction)loader_close, METH_NOARGS, "stop and free the C loader"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LoaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zbatch._zbatch._Loader",
    .tp_basicsize = sizeof(LoaderObject),
    .tp_dealloc = (destructor)loader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a libzbatch loader",
    .tp_methods = loader_methods,
    .tp_init = (initproc)loader_init,
    .tp_new = PyType_GenericNew,
};

int
zbpy_register_loader(PyObject *module)
{
    if (PyType_Ready(&LoaderType) < 0) return -1;
    Py_INCREF(&LoaderType);
    if (PyModule_AddObject(module, "_Loader", (PyObject *)&LoaderType) < 0) {
        Py_DECREF(&LoaderType);
        return -1;
    }
    return PyModule_AddFunctions(module, module_methods);
}
