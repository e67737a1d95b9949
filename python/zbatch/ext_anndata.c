/* Python bindings: the anndata writer as _zbatch.AnndataWriter, a thin handle over
 * zb_anndata_writer (include/zbatch_anndata.h). Arrays come in through the buffer protocol with
 * their NumPy typestr given alongside (the Python layer makes them C-contiguous and native);
 * strings come in as sequences of str and are packed into UTF-8 + offsets here. The GIL is
 * released around every libzbatch call; a flag refuses a second thread while one is inside. */
#include <stdlib.h>
#include <string.h>

#include "ext.h"
#include "write/codec_spec.h"

typedef struct {
    PyObject_HEAD zb_store *store;
    zb_anndata_writer *w;
    uint64_t n_vars;
    zb_dtype x_dtype;
    int busy; /* a call is running without the GIL */
} AnndataWriter;

static int
parse_axis(const char *axis, zb_anndata_axis *out)
{
    if (!strcmp(axis, "obs")) {
        *out = ZB_ANNDATA_OBS;
        return 0;
    }
    if (!strcmp(axis, "var")) {
        *out = ZB_ANNDATA_VAR;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "axis must be 'obs' or 'var', not '%s'", axis);
    return -1;
}

static int
parse_dtype(const char *typestr, zb_dtype *out)
{
    for (int d = 0; d < ZB_DT_COUNT_; d++) {
        if (d == ZB_DT_STRING) continue;
        if (!strcmp(typestr, zb_dtype_typestr((zb_dtype)d))) {
            *out = (zb_dtype)d;
            return 0;
        }
    }
    PyErr_Format(PyExc_TypeError, "unsupported dtype '%s'", typestr);
    return -1;
}

/* Claims the writer for one call; -1 with an exception if it is closed or in use. */
static int
claim(AnndataWriter *self)
{
    if (!self->w) {
        PyErr_SetString(PyExc_ValueError, "the writer is closed");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the writer is in use by another thread");
        return -1;
    }
    self->busy = 1;
    return 0;
}

/* A C-contiguous buffer of exactly `n * itemsize` bytes (n computed by the caller or from it). */
static int
get_buffer(PyObject *obj, Py_buffer *view, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous buffer", what);
        return -1;
    }
    return 0;
}

/* Packed strings: item i is data[offsets[i] .. offsets[i+1]). */
typedef struct packed {
    char *data;
    uint64_t *offsets;
    uint64_t n;
} packed;

static void
packed_free(packed *p)
{
    free(p->data);
    free(p->offsets);
    p->data = NULL;
    p->offsets = NULL;
}

/* Packs a sequence of str (UTF-8, surrogates refused by the codec) into *p. */
static int
pack_strings(PyObject *seq_in, packed *p, const char *what)
{
    memset(p, 0, sizeof *p);
    PyObject *seq = PySequence_Fast(seq_in, "expected a sequence of str");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "%s: item %zd is %.80s, not str", what, i,
                         Py_TYPE(items[i])->tp_name);
            goto fail;
        }
        Py_ssize_t len;
        if (!PyUnicode_AsUTF8AndSize(items[i], &len)) goto fail;
        total += (size_t)len;
    }
    p->data = malloc(total ? total : 1);
    p->offsets = malloc(((size_t)n + 1) * sizeof *p->offsets);
    if (!p->data || !p->offsets) {
        PyErr_NoMemory();
        goto fail;
    }
    size_t pos = 0;
    p->offsets[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(items[i], &len);
        memcpy(p->data + pos, s, (size_t)len);
        pos += (size_t)len;
        p->offsets[i + 1] = pos;
    }
    p->n = (uint64_t)n;
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    packed_free(p);
    return -1;
}

/* ------------------------------------------------------------------------------------------ */

static void
writer_release(AnndataWriter *self)
{
    zb_anndata_writer_close(self->w);
    zb_store_close(self->store);
    self->w = NULL;
    self->store = NULL;
}

static void
writer_dealloc(AnndataWriter *self)
{
    writer_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* AnndataWriter(store_path, n_vars, x_kind, x_dtype, zarr_format=3, codec=None, x_chunk=0,
 *               x_shard=0, column_chunk=0, num_threads=1, consolidate=True, path="",
 *               narrow_indices=False) */
static int
writer_init(AnndataWriter *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"store_path",     "n_vars",      "x_kind",      "x_dtype",
                             "zarr_format",    "codec",       "x_chunk",     "x_shard",
                             "column_chunk",   "num_threads", "consolidate", "path",
                             "narrow_indices", "remote",      NULL};
    const char *store_path, *x_kind, *x_dtype, *codec = NULL, *path = "";
    unsigned long long n_vars, x_chunk = 0, x_shard = 0, column_chunk = 0;
    int zarr_format = 3, num_threads = 1, consolidate = 1, narrow_indices = 0;
    PyObject *remote = NULL;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "sO&ss|izO&O&O&ipspO", kwlist, &store_path, zbpy_u64, &n_vars, &x_kind,
            &x_dtype, &zarr_format, &codec, zbpy_u64, &x_chunk, zbpy_u64, &x_shard, zbpy_u64,
            &column_chunk, &num_threads, &consolidate, &path, &narrow_indices, &remote))
        return -1;
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) return -1;
    if (self->w) {
        PyErr_SetString(PyExc_RuntimeError, "AnndataWriter is already open");
        return -1;
    }
    zb_anndata_x_kind kind;
    if (!strcmp(x_kind, "csr")) {
        kind = ZB_ANNDATA_X_CSR;
    } else if (!strcmp(x_kind, "dense")) {
        kind = ZB_ANNDATA_X_DENSE;
    } else {
        PyErr_Format(PyExc_ValueError, "x_kind must be 'csr' or 'dense', not '%s'", x_kind);
        return -1;
    }
    zb_dtype dt;
    if (parse_dtype(x_dtype, &dt) != 0) return -1;
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.zarr_format = zarr_format;
    o.codec = codec;
    o.x_chunk = x_chunk;
    o.x_shard = x_shard;
    o.column_chunk = column_chunk;
    o.num_threads = num_threads;
    o.consolidate = consolidate != 0;
    o.narrow_indices = narrow_indices != 0;
    zb_store *store = NULL;
    zb_anndata_writer *w = NULL;
    zb_status st;
    zb_store_opts so = ZB_STORE_OPTS_DEFAULT;
    so.remote = &ro;
    Py_BEGIN_ALLOW_THREADS
    st = zb_store_open_opts(store_path, &so, &store);
    if (st == ZB_OK) st = zb_anndata_writer_open(store, path, n_vars, kind, dt, &o, &w);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zb_store_close(store);
        zbpy_raise(st, NULL);
        return -1;
    }
    self->store = store;
    self->w = w;
    self->n_vars = n_vars;
    self->x_dtype = dt;
    return 0;
}

/* A CSR block for X (layer NULL) or a layer: indptr int64 [nrows+1], indices int32 [k],
 * data [k] of `dt`. */
static PyObject *
csr_call(AnndataWriter *self, const char *layer, zb_dtype dt, PyObject *o_indptr,
         PyObject *o_indices, PyObject *o_data)
{
    if (claim(self) != 0) return NULL;
    Py_buffer ip = {0}, ix = {0}, dv = {0};
    PyObject *result = NULL;
    if (get_buffer(o_indptr, &ip, "indptr") != 0) goto done;
    if (get_buffer(o_indices, &ix, "indices") != 0) goto done;
    if (get_buffer(o_data, &dv, "data") != 0) goto done;
    if (ip.len < (Py_ssize_t)sizeof(int64_t) || ip.len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "indptr must hold at least one int64");
        goto done;
    }
    uint64_t nrows = (uint64_t)ip.len / sizeof(int64_t) - 1;
    const int64_t *indptr = ip.buf;
    int64_t k = indptr[nrows] - indptr[0];
    size_t itemsize = zb_dtype_size(dt);
    if (k < 0 || (uint64_t)ix.len != (uint64_t)k * sizeof(int32_t) ||
        (uint64_t)dv.len != (uint64_t)k * itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "indices (%zd bytes) and data (%zd bytes) must hold indptr[-1] - indptr[0]"
                     " = %lld elements",
                     ix.len, dv.len, (long long)k);
        goto done;
    }
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    if (layer)
        st = zb_anndata_writer_append_layer_csr(self->w, layer, dt, nrows, indptr, ix.buf, dv.buf);
    else
        st = zb_anndata_writer_append_csr(self->w, nrows, indptr, ix.buf, dv.buf);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (ip.obj) PyBuffer_Release(&ip);
    if (ix.obj) PyBuffer_Release(&ix);
    if (dv.obj) PyBuffer_Release(&dv);
    self->busy = 0;
    return result;
}

/* append_csr(indptr: int64 buffer [nrows+1], indices: int32 buffer [k], data: buffer [k]) */
static PyObject *
writer_append_csr(AnndataWriter *self, PyObject *args)
{
    PyObject *o_indptr, *o_indices, *o_data;
    if (!PyArg_ParseTuple(args, "OOO", &o_indptr, &o_indices, &o_data)) return NULL;
    return csr_call(self, NULL, self->x_dtype, o_indptr, o_indices, o_data);
}

/* append_layer_csr(name, typestr, indptr, indices, data): rows of layers/NAME. */
static PyObject *
writer_append_layer_csr(AnndataWriter *self, PyObject *args)
{
    const char *name, *typestr;
    PyObject *o_indptr, *o_indices, *o_data;
    if (!PyArg_ParseTuple(args, "ssOOO", &name, &typestr, &o_indptr, &o_indices, &o_data))
        return NULL;
    zb_dtype dt;
    if (parse_dtype(typestr, &dt) != 0) return NULL;
    return csr_call(self, name, dt, o_indptr, o_indices, o_data);
}

/* append_dense(rows: buffer of nrows * n_vars elements of X's dtype) */
static PyObject *
writer_append_dense(AnndataWriter *self, PyObject *args)
{
    PyObject *o_rows;
    if (!PyArg_ParseTuple(args, "O", &o_rows)) return NULL;
    if (claim(self) != 0) return NULL;
    Py_buffer v = {0};
    PyObject *result = NULL;
    if (get_buffer(o_rows, &v, "rows") != 0) goto done;
    uint64_t row_bytes = self->n_vars * zb_dtype_size(self->x_dtype);
    if (row_bytes == 0 || (uint64_t)v.len % row_bytes) {
        PyErr_Format(PyExc_ValueError, "rows (%zd bytes) is not a whole number of %llu-byte rows",
                     v.len, (unsigned long long)row_bytes);
        goto done;
    }
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_anndata_writer_append_dense(self->w, (uint64_t)v.len / row_bytes, v.buf);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (v.obj) PyBuffer_Release(&v);
    self->busy = 0;
    return result;
}

/* Strings-taking methods share one shape: kind 0 names, 1 string column, 2 categories. */
static PyObject *
strings_call(AnndataWriter *self, int kind, const char *axis_s, const char *name, PyObject *seq,
             int ordered)
{
    zb_anndata_axis axis;
    if (parse_axis(axis_s, &axis) != 0) return NULL;
    if (claim(self) != 0) return NULL;
    packed p;
    PyObject *result = NULL;
    if (pack_strings(seq, &p, kind == 0 ? "names" : name) != 0) goto done;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    if (kind == 0)
        st = zb_anndata_writer_append_names(self->w, axis, p.data, p.offsets, p.n);
    else if (kind == 1)
        st = zb_anndata_writer_append_string_column(self->w, axis, name, p.data, p.offsets, p.n);
    else
        st = zb_anndata_writer_define_categorical(self->w, axis, name, p.data, p.offsets, p.n,
                                                  ordered != 0);
    Py_END_ALLOW_THREADS
    packed_free(&p);
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    self->busy = 0;
    return result;
}

/* append_names(axis: "obs"|"var", names: sequence of str) */
static PyObject *
writer_append_names(AnndataWriter *self, PyObject *args)
{
    const char *axis;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "sO", &axis, &seq)) return NULL;
    return strings_call(self, 0, axis, NULL, seq, 0);
}

/* append_string_column(axis, name, values: sequence of str) */
static PyObject *
writer_append_string_column(AnndataWriter *self, PyObject *args)
{
    const char *axis, *name;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "ssO", &axis, &name, &seq)) return NULL;
    return strings_call(self, 1, axis, name, seq, 0);
}

/* define_categorical(axis, name, categories: sequence of str, ordered: bool) */
static PyObject *
writer_define_categorical(AnndataWriter *self, PyObject *args)
{
    const char *axis, *name;
    PyObject *seq;
    int ordered = 0;
    if (!PyArg_ParseTuple(args, "ssO|p", &axis, &name, &seq, &ordered)) return NULL;
    return strings_call(self, 2, axis, name, seq, ordered);
}

/* Numeric-taking methods: kind 0 column values, 1 categorical codes. */
static PyObject *
values_call(AnndataWriter *self, PyObject *args, int kind)
{
    const char *axis_s, *name, *typestr;
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "sssO", &axis_s, &name, &typestr, &obj)) return NULL;
    zb_anndata_axis axis;
    zb_dtype dt;
    if (parse_axis(axis_s, &axis) != 0 || parse_dtype(typestr, &dt) != 0) return NULL;
    if (claim(self) != 0) return NULL;
    Py_buffer v = {0};
    PyObject *result = NULL;
    if (get_buffer(obj, &v, "values") != 0) goto done;
    size_t itemsize = zb_dtype_size(dt);
    if ((size_t)v.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of '%s' values", name,
                     v.len, typestr);
        goto done;
    }
    uint64_t n = (uint64_t)v.len / itemsize;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    if (kind == 0)
        st = zb_anndata_writer_append_column(self->w, axis, name, dt, v.buf, n);
    else
        st = zb_anndata_writer_append_codes(self->w, axis, name, dt, v.buf, n);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (v.obj) PyBuffer_Release(&v);
    self->busy = 0;
    return result;
}

/* The mask argument of the nullable calls: None (nothing missing) or a buffer of bytes. */
static int
get_mask(PyObject *obj, Py_buffer *view)
{
    if (obj == Py_None) return 0;
    return get_buffer(obj, view, "mask");
}

/* append_nullable_column(axis, name, typestr, values: buffer, mask: buffer of bytes or None) */
static PyObject *
writer_append_nullable_column(AnndataWriter *self, PyObject *args)
{
    const char *axis_s, *name, *typestr;
    PyObject *obj, *o_mask;
    if (!PyArg_ParseTuple(args, "sssOO", &axis_s, &name, &typestr, &obj, &o_mask)) return NULL;
    zb_anndata_axis axis;
    zb_dtype dt;
    if (parse_axis(axis_s, &axis) != 0 || parse_dtype(typestr, &dt) != 0) return NULL;
    if (claim(self) != 0) return NULL;
    Py_buffer v = {0}, m = {0};
    PyObject *result = NULL;
    if (get_buffer(obj, &v, "values") != 0 || get_mask(o_mask, &m) != 0) goto done;
    size_t itemsize = zb_dtype_size(dt);
    if ((size_t)v.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of '%s' values", name,
                     v.len, typestr);
        goto done;
    }
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_anndata_writer_append_nullable_column(self->w, axis, name, dt, v.buf,
                                                  (uint64_t)v.len / itemsize, m.obj ? m.buf : NULL,
                                                  (uint64_t)m.len);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (v.obj) PyBuffer_Release(&v);
    if (m.obj) PyBuffer_Release(&m);
    self->busy = 0;
    return result;
}

/* append_nullable_string_column(axis, name, values: sequence of str, mask: bytes buffer or
 * None); a missing value's str is ignored (the Python layer passes "") */
static PyObject *
writer_append_nullable_string_column(AnndataWriter *self, PyObject *args)
{
    const char *axis_s, *name;
    PyObject *seq, *o_mask;
    if (!PyArg_ParseTuple(args, "ssOO", &axis_s, &name, &seq, &o_mask)) return NULL;
    zb_anndata_axis axis;
    if (parse_axis(axis_s, &axis) != 0) return NULL;
    if (claim(self) != 0) return NULL;
    Py_buffer m = {0};
    packed p = {0};
    PyObject *result = NULL;
    if (get_mask(o_mask, &m) != 0) goto done;
    if (pack_strings(seq, &p, name) != 0) goto done;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_anndata_writer_append_nullable_string_column(
        self->w, axis, name, p.data, p.offsets, p.n, m.obj ? m.buf : NULL, (uint64_t)m.len);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    packed_free(&p);
    if (m.obj) PyBuffer_Release(&m);
    self->busy = 0;
    return result;
}

/* define_categorical_values(axis, name, typestr, categories: buffer, ordered=False) */
static PyObject *
writer_define_categorical_values(AnndataWriter *self, PyObject *args)
{
    const char *axis_s, *name, *typestr;
    PyObject *obj;
    int ordered = 0;
    if (!PyArg_ParseTuple(args, "sssO|p", &axis_s, &name, &typestr, &obj, &ordered)) return NULL;
    zb_anndata_axis axis;
    zb_dtype dt;
    if (parse_axis(axis_s, &axis) != 0 || parse_dtype(typestr, &dt) != 0) return NULL;
    if (claim(self) != 0) return NULL;
    Py_buffer v = {0};
    PyObject *result = NULL;
    if (get_buffer(obj, &v, "categories") != 0) goto done;
    size_t itemsize = zb_dtype_size(dt);
    if ((size_t)v.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of '%s' values", name,
                     v.len, typestr);
        goto done;
    }
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_anndata_writer_define_categorical_values(self->w, axis, name, dt, v.buf,
                                                     (uint64_t)v.len / itemsize, ordered != 0);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (v.obj) PyBuffer_Release(&v);
    self->busy = 0;
    return result;
}

/* append_column(axis, name, typestr, values: buffer) */
static PyObject *
writer_append_column(AnndataWriter *self, PyObject *args)
{
    return values_call(self, args, 0);
}

/* append_codes(axis, name, typestr, codes: buffer) */
static PyObject *
writer_append_codes(AnndataWriter *self, PyObject *args)
{
    return values_call(self, args, 1);
}

static PyObject *
writer_commit(AnndataWriter *self, PyObject *noargs)
{
    (void)noargs;
    if (claim(self) != 0) return NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_anndata_writer_commit(self->w);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *
writer_close(AnndataWriter *self, PyObject *noargs)
{
    (void)noargs;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the writer is in use by another thread");
        return NULL;
    }
    writer_release(self);
    Py_RETURN_NONE;
}

static PyObject *
writer_rows(AnndataWriter *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(zb_anndata_writer_rows(self->w));
}

static PyObject *
writer_nnz(AnndataWriter *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(zb_anndata_writer_nnz(self->w));
}

/* csr_codec(codec, typestr) -> str: zb_anndata_csr_codec (the codec a CSR data / indices array
 * of that dtype is written with). */
static PyObject *
writer_csr_codec(PyObject *unused, PyObject *args)
{
    (void)unused;
    const char *codec, *typestr;
    zb_dtype dt;
    if (!PyArg_ParseTuple(args, "zs", &codec, &typestr)) return NULL;
    if (parse_dtype(typestr, &dt) != 0) return NULL;
    return PyUnicode_FromString(zb_anndata_csr_codec(codec, dt));
}

static PyMethodDef writer_methods[] = {
    {"csr_codec", (PyCFunction)writer_csr_codec, METH_VARARGS | METH_STATIC,
     "csr_codec(codec, typestr) -> str: the codec string a CSR data or indices array of that "
     "dtype gets from a writer given `codec` (None: the defaults)."},
    {"append_csr", (PyCFunction)writer_append_csr, METH_VARARGS,
     "append_csr(indptr, indices, data): rows of a CSR X (int64 indptr slice, int32 ids)."},
    {"append_dense", (PyCFunction)writer_append_dense, METH_VARARGS,
     "append_dense(rows): whole rows of a dense X, C order."},
    {"append_names", (PyCFunction)writer_append_names, METH_VARARGS,
     "append_names(axis, names): obs_names or var_names."},
    {"append_column", (PyCFunction)writer_append_column, METH_VARARGS,
     "append_column(axis, name, typestr, values): a numeric or bool column."},
    {"append_string_column", (PyCFunction)writer_append_string_column, METH_VARARGS,
     "append_string_column(axis, name, values): a str column (string-array)."},
    {"define_categorical", (PyCFunction)writer_define_categorical, METH_VARARGS,
     "define_categorical(axis, name, categories, ordered=False)."},
    {"append_codes", (PyCFunction)writer_append_codes, METH_VARARGS,
     "append_codes(axis, name, typestr, codes): codes of a categorical column (-1 = missing)."},
    {"define_categorical_values", (PyCFunction)writer_define_categorical_values, METH_VARARGS,
     "define_categorical_values(axis, name, typestr, categories, ordered=False): a categorical "
     "column with numeric or bool categories."},
    {"append_nullable_column", (PyCFunction)writer_append_nullable_column, METH_VARARGS,
     "append_nullable_column(axis, name, typestr, values, mask): a nullable integer or bool "
     "column; mask bytes 1 = missing (None: nothing missing)."},
    {"append_nullable_string_column", (PyCFunction)writer_append_nullable_string_column,
     METH_VARARGS,
     "append_nullable_string_column(axis, name, values, mask): a nullable str column "
     "(nullable-string-array)."},
    {"append_layer_csr", (PyCFunction)writer_append_layer_csr, METH_VARARGS,
     "append_layer_csr(name, typestr, indptr, indices, data): rows of the CSR layer "
     "layers/NAME (int64 indptr slice, int32 ids)."},
    {"commit", (PyCFunction)writer_commit, METH_NOARGS,
     "commit(): write groups and the root, then erase the incomplete marker."},
    {"close", (PyCFunction)writer_close, METH_NOARGS,
     "close(): free the writer; an uncommitted store stays marked incomplete."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef writer_getset[] = {
    {"rows", (getter)writer_rows, NULL, "rows of X appended so far", NULL},
    {"nnz", (getter)writer_nnz, NULL, "stored elements of a CSR X appended so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AnndataWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zbatch._zbatch.AnndataWriter",
    .tp_basicsize = sizeof(AnndataWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Low-level anndata store writer (see zbatch.write_anndata).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)writer_init,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_methods = writer_methods,
    .tp_getset = writer_getset,
};

int
zbpy_register_anndata(PyObject *module)
{
    if (PyType_Ready(&AnndataWriterType) < 0) return -1;
    Py_INCREF(&AnndataWriterType);
    if (PyModule_AddObject(module, "AnndataWriter", (PyObject *)&AnndataWriterType) < 0) {
        Py_DECREF(&AnndataWriterType);
        return -1;
    }
    if (PyModule_AddStringConstant(module, "INCOMPLETE_MARKER", ZB_INCOMPLETE_MARKER) < 0 ||
        PyModule_AddIntConstant(module, "ANNDATA_DEFAULT_X_CHUNK", ZB_ANNDATA_DEFAULT_X_CHUNK) <
            0 ||
        PyModule_AddStringConstant(module, "DEFAULT_CODEC", ZB_CODEC_SPEC_DEFAULT) < 0)
        return -1;
    return 0;
}
