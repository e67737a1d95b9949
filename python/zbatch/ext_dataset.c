/* Python bindings: datasets and batches (zb_dataset_*, zb_batch_*).
 *
 * Batch memory crosses into numpy without copies: a _Buffer exports one field's bytes through
 * the buffer protocol and holds a reference to its _Batch, so the C batch lives as long as any
 * array made from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "ext.h"

/* ---- _Batch ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD zb_batch *batch;
} BatchObject;

static void
batch_dealloc(BatchObject *self)
{
    zb_batch_free(self->batch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zbatch._zbatch._Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "owner of one C batch",
};

typedef struct {
    PyObject_HEAD PyObject *owner;
    void *ptr;
    Py_ssize_t len;
} BufferObject;

static void
buffer_dealloc(BufferObject *self)
{
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
buffer_get(BufferObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, 0, flags);
}

static PyBufferProcs buffer_procs = {(getbufferproc)buffer_get, NULL};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zbatch._zbatch._Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_buffer = &buffer_procs,
    .tp_doc = "bytes of one batch field, kept alive with their batch",
};

static PyObject *
make_buffer(PyObject *owner, const void *ptr, size_t len)
{
    BufferObject *b = PyObject_New(BufferObject, &BufferType);
    if (!b) return NULL;
    Py_INCREF(owner);
    b->owner = owner;
    b->ptr = (void *)ptr;
    b->len = (Py_ssize_t)len;
    return (PyObject *)b;
}

static PyObject *
shape_of(uint64_t rows, int ndim, const uint64_t *row_shape)
{
    PyObject *t = PyTuple_New(ndim + 1);
    if (!t) return NULL;
    PyTuple_SET_ITEM(t, 0, PyLong_FromUnsignedLongLong(rows));
    for (int d = 0; d < ndim; d++)
        PyTuple_SET_ITEM(t, d + 1, PyLong_FromUnsignedLongLong(row_shape[d]));
    return t;
}

/* Converts a batch into a dict: name -> (buffer, typestr, shape, kind, segment), a string
 * field's buffer being a list of str; plus "index", "dataset", "segments" {name: buffer of
 * int64 [B+1]} and "stats". */
PyObject *
zbpy_batch_to_dict(zb_batch *cb)
{
    BatchObject *owner = PyObject_New(BatchObject, &BatchType);
    if (!owner) {
        zb_batch_free(cb);
        return NULL;
    }
    owner->batch = cb;
    PyObject *d = zbpy_batch_dict(cb, (PyObject *)owner);
    Py_DECREF(owner);
    return d;
}

PyObject *
zbpy_batch_dict(const zb_batch *cb, PyObject *owner)
{
    PyObject *d = PyDict_New(), *fields = PyDict_New(), *segs = PyDict_New();
    if (!d || !fields || !segs) goto fail;
    size_t B = zb_batch_size(cb);
    for (size_t i = 0; i < zb_batch_nfields(cb); i++) {
        zb_batch_view v;
        zb_batch_field(cb, i, &v);
        uint64_t elems = v.nrows;
        for (int k = 0; k < v.ndim; k++) elems *= v.row_shape[k];
        PyObject *buf = v.dtype == ZB_DT_STRING
                            ? zbpy_strings(v.data, v.ptr, NULL, v.nrows, v.name)
                            : make_buffer(owner, v.data, (size_t)(elems * zb_dtype_size(v.dtype)));
        PyObject *shape = shape_of(v.nrows, v.ndim, v.row_shape);
        /* the segment a ragged field is split by: found by its pointer array */
        const char *seg = NULL;
        for (size_t k = 0; v.ptr && v.dtype != ZB_DT_STRING && k < zb_batch_nsegments(cb); k++) {
            const int64_t *ptr = NULL;
            const char *name = zb_batch_segment_at(cb, k, &ptr);
            if (ptr == v.ptr) seg = name;
        }
        PyObject *tup = buf && shape ? Py_BuildValue("(OsOiz)", buf, zb_dtype_typestr(v.dtype),
                                                     shape, (int)v.kind, seg)
                                     : NULL;
        Py_XDECREF(buf);
        Py_XDECREF(shape);
        if (!tup || PyDict_SetItemString(fields, v.name, tup) < 0) {
            Py_XDECREF(tup);
            goto fail;
        }
        Py_DECREF(tup);
    }
    for (size_t i = 0; i < zb_batch_nsegments(cb); i++) {
        const int64_t *ptr = NULL;
        const char *name = zb_batch_segment_at(cb, i, &ptr);
        PyObject *sb = make_buffer(owner, ptr, (B + 1) * sizeof(int64_t));
        if (!sb || PyDict_SetItemString(segs, name, sb) < 0) {
            Py_XDECREF(sb);
            goto fail;
        }
        Py_DECREF(sb);
    }
    PyObject *idx = make_buffer(owner, zb_batch_index(cb), B * sizeof(uint64_t));
    if (!idx || PyDict_SetItemString(d, "index", idx) < 0) {
        Py_XDECREF(idx);
        goto fail;
    }
    Py_DECREF(idx);
    if (zb_batch_dataset(cb)) {
        PyObject *ds = make_buffer(owner, zb_batch_dataset(cb), B * sizeof(int32_t));
        if (!ds || PyDict_SetItemString(d, "dataset", ds) < 0) {
            Py_XDECREF(ds);
            goto fail;
        }
        Py_DECREF(ds);
    }
    zb_read_stats st;
    zb_batch_stats(cb, &st);
    PyObject *stats = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "chunks_decoded",
        (unsigned long long)st.chunks_decoded, "chunks_cached",
        (unsigned long long)st.chunks_cached, "chunks_filled", (unsigned long long)st.chunks_filled,
        "bytes_fetched", (unsigned long long)st.bytes_fetched, "bytes_decoded",
        (unsigned long long)st.bytes_decoded, "bytes_delivered",
        (unsigned long long)st.bytes_delivered, "range_reads", (unsigned long long)st.range_reads,
        "samples_skipped", (unsigned long long)st.samples_skipped);
    if (!stats || PyDict_SetItemString(d, "stats", stats) < 0) {
        Py_XDECREF(stats);
        goto fail;
    }
    Py_DECREF(stats);
    PyDict_SetItemString(d, "fields", fields);
    PyDict_SetItemString(d, "segments", segs);
    Py_DECREF(fields);
    Py_DECREF(segs);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(fields);
    Py_XDECREF(segs);
    return NULL;
}

/* ---- _Dataset ----------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD zb_store *store;
    zb_dataset *ds;
    PyObject *keep; /* datasets a concatenation borrows from */
} DatasetObject;

static void
dataset_dealloc(DatasetObject *self)
{
    zb_dataset_close(self->ds);
    zb_store_close(self->store);
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
dataset_init(DatasetObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path",
                             "group",
                             "cache_bytes",
                             "num_threads",
                             "load_layers",
                             "use_consolidated",
                             "load_strings",
                             "layer",
                             "reorder_vars",
                             "x_dtype",
                             "index_dtype",
                             "on_invalid",
                             "max_request_bytes",
                             "mmap_bytes",
                             "remote",
                             "fetch_cache_bytes",
                             NULL};
    const char *path, *group = "", *layer = NULL, *x_dtype = NULL, *index_dtype = NULL;
    const char *on_invalid = "error";
    unsigned long long cache = 0, max_request = ZB_MAX_REQUEST_BYTES_DEFAULT;
    unsigned long long fetch_cache = ZB_FETCH_CACHE_BYTES_DEFAULT;
    int threads = 1, layers = 0, consolidated = 1, strings = 0, reorder = 0;
    PyObject *mmap_bytes = Py_None, *remote = NULL;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "s|sO&ipppzpzzsO&OOO&", kwlist, &path, &group, zbpy_u64, &cache, &threads,
            &layers, &consolidated, &strings, &layer, &reorder, &x_dtype, &index_dtype, &on_invalid,
            zbpy_u64, &max_request, &mmap_bytes, &remote, zbpy_u64, &fetch_cache))
        return -1;
    if (strcmp(on_invalid, "error") && strcmp(on_invalid, "skip")) {
        PyErr_Format(PyExc_ValueError, "on_invalid must be \"error\" or \"skip\", not \"%s\"",
                     on_invalid);
        return -1;
    }
    zb_store_opts so = ZB_STORE_OPTS_DEFAULT;
    if (mmap_bytes != Py_None) {
        so.mmap_bytes = PyLong_AsUnsignedLongLong(mmap_bytes);
        if (PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "mmap_bytes must be an integer >= 0, got %R",
                         mmap_bytes);
            return -1;
        }
    }
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) return -1;
    so.remote = &ro;
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.cache_bytes = (size_t)cache;
    o.num_threads = threads;
    o.load_layers = layers != 0;
    o.use_consolidated = consolidated != 0;
    o.load_strings = strings != 0;
    o.layer = layer;
    o.reorder_vars = reorder != 0;
    o.x_dtype = x_dtype;
    o.index_dtype = index_dtype;
    o.on_invalid = strcmp(on_invalid, "skip") ? ZB_ON_INVALID_ERROR : ZB_ON_INVALID_SKIP;
    o.max_request_bytes = max_request;
    o.fetch_cache_bytes = (size_t)fetch_cache;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_store_open_opts(path, &so, &self->store);
    if (st == ZB_OK) st = zb_dataset_open(self->store, group, &o, &self->ds);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        return -1;
    }
    return 0;
}

static PyObject *
dataset_store_stats(DatasetObject *self, PyObject *noargs)
{
    (void)noargs;
    if (!self->store) return PyDict_New(); /* a concatenation or an in-memory copy */
    return zbpy_store_stats(self->store);
}

static PyObject *
dataset_len(DatasetObject *self, PyObject *noargs)
{
    (void)noargs;
    uint64_t n = 0;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_len(self->ds, &n);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    return PyLong_FromUnsignedLongLong(n);
}

/* The decoded size of field i's stored values, from metadata: the elements of its array's
 * shape times its itemsize, summed over the children of a collection or concatenation (what a
 * decoded-chunk cache holding the whole field takes; 0 for strings) */
static unsigned long long
field_decoded_bytes(const zb_dataset *ds, size_t i)
{
    if (ds->nchildren) {
        unsigned long long sum = 0;
        for (size_t c = 0; c < ds->nchildren; c++) sum += field_decoded_bytes(ds->children[c], i);
        return sum;
    }
    zb_array_info ai;
    if (i >= ds->nfields || !ds->fields[i].arr ||
        zb_array_get_info(ds->fields[i].arr, &ai) != ZB_OK)
        return 0;
    unsigned long long n = ai.itemsize;
    for (int d = 0; d < ai.ndim; d++) n *= ai.shape[d];
    return n;
}

static PyObject *
dataset_info(DatasetObject *self, PyObject *noargs)
{
    (void)noargs;
    PyObject *fields = PyList_New(0);
    if (!fields) return NULL;
    static const char *const kinds[] = {"per_sample", "ragged", "index"};
    const zb_dataset *first = self->ds->nchildren ? self->ds->children[0] : self->ds;
    for (size_t i = 0; i < zb_dataset_nfields(self->ds); i++) {
        zb_field_info fi;
        zb_dataset_field(self->ds, i, &fi);
        /* rows per read unit (chunk, or inner chunk) of the first child's array: what a
         * chunk-aware sampler aligns its blocks to */
        zb_array_info ai;
        unsigned long long chunk_rows = 0;
        if (i < first->nfields && first->fields[i].arr &&
            zb_array_get_info(first->fields[i].arr, &ai) == ZB_OK && ai.ndim > 0)
            chunk_rows = ai.chunk_shape[0];
        PyObject *rs = PyTuple_New(fi.ndim);
        for (int d = 0; rs && d < fi.ndim; d++)
            PyTuple_SET_ITEM(rs, d, PyLong_FromUnsignedLongLong(fi.row_shape[d]));
        PyObject *o =
            rs ? Py_BuildValue("{s:s,s:s,s:s,s:O,s:z,s:z,s:O,s:s,s:z,s:K,s:K}", "name", fi.name,
                               "kind", kinds[fi.kind], "dtype", zb_dtype_name(fi.dtype),
                               "row_shape", rs, "segment", fi.segment, "target", fi.target,
                               "categorical", fi.categorical ? Py_True : Py_False, "array",
                               fi.array, "mask", fi.mask, "chunk_rows", chunk_rows, "decoded_bytes",
                               field_decoded_bytes(self->ds, i))
               : NULL;
        Py_XDECREF(rs);
        if (!o || PyList_Append(fields, o) < 0) {
            Py_XDECREF(o);
            Py_DECREF(fields);
            return NULL;
        }
        Py_DECREF(o);
    }
    /* where the var frame lies: the first child's store and var group (the collection's
     * genes are the first child's, merge.c) */
    const char *var_group = first->var_frame ? first->var_frame : "";
    PyObject *r =
        Py_BuildValue("{s:s,s:O,s:K,s:n,s:s,s:s,s:s,s:s}", "layout", zb_dataset_layout(self->ds),
                      "fields", fields, "n_vars", (unsigned long long)zb_dataset_n_vars(self->ds),
                      "nchildren", (Py_ssize_t)zb_dataset_nchildren(self->ds), "name",
                      zb_dataset_name(self->ds), "store", zb_store_name(first->store), "scheme",
                      zb_store_scheme(first->store), "var_group", var_group);
    Py_DECREF(fields);
    return r;
}

/* categories(name) -> (labels, ordered): labels a list of str, or (bytes, typestr) for
 * numbers and booleans */
static PyObject *
dataset_categories(DatasetObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    zb_category_table t;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_category_table(self->ds, name, &t);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    PyObject *labels =
        t.dtype == ZB_DT_STRING
            ? zbpy_strings(t.strings->data, NULL, t.strings->offsets, t.n, name)
            : Py_BuildValue("(y#s)", (const char *)t.values,
                            (Py_ssize_t)(t.n * zb_dtype_size(t.dtype)), zb_dtype_typestr(t.dtype));
    if (!labels) return NULL;
    return Py_BuildValue("(NO)", labels, t.ordered ? Py_True : Py_False);
}

/* read_field(name, start, stop) -> (bytearray, typestr, shape): rows [start, stop) */
static PyObject *
dataset_read_field(DatasetObject *self, PyObject *args)
{
    const char *name;
    unsigned long long start, stop;
    if (!PyArg_ParseTuple(args, "sO&O&", &name, zbpy_u64, &start, zbpy_u64, &stop)) return NULL;
    size_t i;
    zb_field_info fi;
    zb_status st = zb_dataset_find_field(self->ds, name, &i);
    if (st == ZB_OK) st = zb_dataset_field(self->ds, i, &fi);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    uint64_t row = zb_dtype_size(fi.dtype), n = stop > start ? stop - start : 0;
    for (int d = 0; d < fi.ndim; d++) row *= fi.row_shape[d];
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * row));
    if (!out) return NULL;
    char *buf = PyByteArray_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_read_field(self->ds, name, start, stop, buf, (size_t)(n * row));
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        Py_DECREF(out);
        return zbpy_raise(st, NULL);
    }
    PyObject *shape = shape_of(n, fi.ndim, fi.row_shape);
    if (!shape) {
        Py_DECREF(out);
        return NULL;
    }
    return Py_BuildValue("(NsN)", out, zb_dtype_typestr(fi.dtype), shape);
}

/* read_strings(name, start, stop) -> (list of str, bytes of missing flags) */
static PyObject *
dataset_read_strings(DatasetObject *self, PyObject *args)
{
    const char *name;
    unsigned long long start, stop;
    if (!PyArg_ParseTuple(args, "sO&O&", &name, zbpy_u64, &start, zbpy_u64, &stop)) return NULL;
    uint64_t n = stop > start ? stop - start : 0;
    uint8_t *missing = malloc((size_t)n + 1);
    if (!missing) return PyErr_NoMemory();
    zb_strings s;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_read_strings(self->ds, name, start, stop, &s, missing);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        free(missing);
        return zbpy_raise(st, NULL);
    }
    PyObject *l = zbpy_strings(s.data, NULL, s.offsets, s.n, name);
    zb_strings_free(&s);
    PyObject *r = l ? Py_BuildValue("(Ny#)", l, (const char *)missing, (Py_ssize_t)n) : NULL;
    free(missing);
    return r;
}

/* var_names() -> list of str */
static PyObject *
dataset_var_names(DatasetObject *self, PyObject *noargs)
{
    (void)noargs;
    const zb_strings *s = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_var_names(self->ds, &s);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    return zbpy_strings(s->data, NULL, s->offsets, s->n, "var/_index");
}

/* columns() -> [(name, kind, dtype)]: obs as anndata lists it */
static PyObject *
dataset_columns(DatasetObject *self, PyObject *noargs)
{
    (void)noargs;
    static const char *const kinds[] = {"values", "categorical", "nullable", "strings",
                                        "nullable_strings"};
    size_t n = zb_dataset_ncolumns(self->ds);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        zb_column_info ci;
        zb_dataset_column(self->ds, i, &ci);
        PyObject *t = Py_BuildValue("(sss)", ci.name, kinds[ci.kind], zb_dtype_name(ci.dtype));
        if (!t) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    return l;
}

/* read_many(ids: a buffer of uint64) -> dict (see batch_to_dict) */
static PyObject *
dataset_read_many(DatasetObject *self, PyObject *args)
{
    Py_buffer ids;
    if (!PyArg_ParseTuple(args, "y*", &ids)) return NULL;
    if (ids.len % (Py_ssize_t)sizeof(uint64_t)) {
        PyBuffer_Release(&ids);
        return zbpy_raise(ZB_E_INVALID, "ids must be a uint64 buffer");
    }
    zb_batch *b = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_read_many(self->ds, ids.buf, (size_t)ids.len / sizeof(uint64_t), &b);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ids);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    return zbpy_batch_to_dict(b);
}

/* segment_lengths(name) -> bytearray of uint64 [len] */
static PyObject *
dataset_segment_lengths(DatasetObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    uint64_t n = 0;
    zb_status st = zb_dataset_len(self->ds, &n);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * sizeof(uint64_t)));
    if (!out) return NULL;
    uint64_t *buf = (uint64_t *)(void *)PyByteArray_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_segment_lengths(self->ds, name, buf);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        Py_DECREF(out);
        return zbpy_raise(st, NULL);
    }
    return out;
}

static PyObject *
dataset_set_threads(DatasetObject *self, PyObject *args)
{
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_set_threads(self->ds, n);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyMethodDef dataset_methods[] = {
    {"set_threads", (PyCFunction)dataset_set_threads, METH_VARARGS, "replace the decode pool"},
    {"segment_lengths", (PyCFunction)dataset_segment_lengths, METH_VARARGS,
     "per-sample lengths of a segment"},
    {"length", (PyCFunction)dataset_len, METH_NOARGS, "number of logical samples"},
    {"store_stats", (PyCFunction)dataset_store_stats, METH_NOARGS,
     "the store's counters: requests, retries, ranges, bytes, max_in_flight"},
    {"info", (PyCFunction)dataset_info, METH_NOARGS, "layout, fields, n_vars"},
    {"categories", (PyCFunction)dataset_categories, METH_VARARGS, "category labels"},
    {"read_field", (PyCFunction)dataset_read_field, METH_VARARGS, "rows of one field"},
    {"read_strings", (PyCFunction)dataset_read_strings, METH_VARARGS, "rows of a string column"},
    {"var_names", (PyCFunction)dataset_var_names, METH_NOARGS, "var names"},
    {"columns", (PyCFunction)dataset_columns, METH_NOARGS, "obs columns"},
    {"read_many", (PyCFunction)dataset_read_many, METH_VARARGS, "one coalesced read"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DatasetType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zbatch._zbatch._Dataset",
    .tp_basicsize = sizeof(DatasetObject),
    .tp_dealloc = (destructor)dataset_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a libzbatch dataset",
    .tp_methods = dataset_methods,
    .tp_init = (initproc)dataset_init,
    .tp_new = PyType_GenericNew,
};

/* concat_datasets(list of _Dataset, num_threads, cache_bytes, reorder_vars) -> _Dataset */
static PyObject *
py_concat_datasets(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *list;
    int threads = 1, reorder = 0;
    unsigned long long cache = 0;
    if (!PyArg_ParseTuple(args, "O|iO&p", &list, &threads, zbpy_u64, &cache, &reorder)) return NULL;
    PyObject *seq = PySequence_Tuple(list);
    if (!seq) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    zb_dataset **kids = calloc((size_t)n + 1, sizeof *kids);
    if (!kids) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyTuple_GET_ITEM(seq, i);
        if (!PyObject_TypeCheck(o, &DatasetType)) {
            free(kids);
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "concat_datasets takes zbatch datasets");
            return NULL;
        }
        kids[i] = ((DatasetObject *)o)->ds;
    }
    DatasetObject *d = (DatasetObject *)DatasetType.tp_alloc(&DatasetType, 0);
    if (!d) {
        free(kids);
        Py_DECREF(seq);
        return NULL;
    }
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.num_threads = threads;
    o.cache_bytes = (size_t)cache;
    o.reorder_vars = reorder != 0;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_dataset_concat(kids, (size_t)n, &o, &d->ds);
    Py_END_ALLOW_THREADS
    free(kids);
    if (st != ZB_OK) {
        Py_DECREF(seq);
        Py_DECREF(d);
        return zbpy_raise(st, NULL);
    }
    d->keep = seq;
    return (PyObject *)d;
}

/* in_memory(dataset, num_threads, cache_bytes) -> _Dataset over a decoded copy in memory */
static PyObject *
py_in_memory(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *src;
    int threads = 1;
    unsigned long long cache = 0;
    if (!PyArg_ParseTuple(args, "O|iO&", &src, &threads, zbpy_u64, &cache)) return NULL;
    if (!PyObject_TypeCheck(src, &DatasetType)) {
        PyErr_SetString(PyExc_TypeError, "in_memory takes a zbatch dataset");
        return NULL;
    }
    zb_dataset *sd = ((DatasetObject *)src)->ds;
    if (sd->borrowed) return zbpy_raise(ZB_E_UNSUPPORTED, "in_memory: copy each child instead");
    DatasetObject *d = (DatasetObject *)DatasetType.tp_alloc(&DatasetType, 0);
    if (!d) return NULL;
    zb_copy_opts co = ZB_COPY_OPTS_DEFAULT;
    co.codec = "none";
    co.chunk_bytes = (uint64_t)256 << 10; /* small units: a row read copies little */
    co.num_threads = threads;
    zb_dataset_opts o = sd->opts;
    o.num_threads = threads;
    o.cache_bytes = (size_t)cache;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_store_open_memory(&d->store);
    if (st == ZB_OK) st = zb_store_copy(sd->store, sd->path, d->store, "", &co);
    if (st == ZB_OK) st = zb_dataset_open(d->store, "", &o, &d->ds);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        Py_DECREF(d);
        return zbpy_raise(st, NULL);
    }
    return (PyObject *)d;
}

static PyMethodDef module_methods[] = {
    {"in_memory", py_in_memory, METH_VARARGS, "a dataset decoded once into memory"},
    {"concat_datasets", py_concat_datasets, METH_VARARGS, "one dataset over several"},
    {NULL, NULL, 0, NULL},
};

zb_dataset *
zbpy_dataset_ptr(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, &DatasetType)) {
        PyErr_SetString(PyExc_TypeError, "expected a zbatch dataset (zbatch.open(...)._c)");
        return NULL;
    }
    return ((DatasetObject *)obj)->ds;
}

int
zbpy_register_dataset(PyObject *module)
{
    if (PyType_Ready(&BatchType) < 0 || PyType_Ready(&BufferType) < 0 ||
        PyType_Ready(&DatasetType) < 0)
        return -1;
    Py_INCREF(&DatasetType);
    if (PyModule_AddObject(module, "_Dataset", (PyObject *)&DatasetType) < 0) {
        Py_DECREF(&DatasetType);
        return -1;
    }
    return PyModule_AddFunctions(module, module_methods);
}
