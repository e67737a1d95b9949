/* Python bindings: private hooks onto the conversion sources (src/convert/source.h), so the
 * tests can compare what zbatch reads from an .h5ad file or an anndata Zarr store with what
 * anndata itself reads. Each call opens the source, reads, and closes it; none of this is
 * public API (the names start with "_src_"). */
#include <stdlib.h>
#include <string.h>

#include "convert/source.h"
#include "ext.h"

static const char *const kind_names[] = {"numeric", "categorical", "string", "nullable"};
static const char *const layout_names[] = {"csr", "csc", "dense"};

static PyObject *
open_source(const char *path, zb__src **src)
{
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb__src_open(path, src);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    return Py_None;
}

/* s as a list of str (zbpy_strings: not UTF-8 is ZbatchError naming `what`) */
static PyObject *
strings_list(const zb_strings *s, const char *what)
{
    return zbpy_strings(s->data, NULL, s->offsets, s->n, what);
}

static PyObject *
column_dict(const zb__col_info *c)
{
    PyObject *cats = Py_None, *values = Py_None;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    if (c->categories) {
        Py_DECREF(cats);
        cats = strings_list(c->categories, c->name);
        if (!cats) goto fail;
    }
    if (c->category_values) {
        Py_DECREF(values);
        values = PyBytes_FromStringAndSize(
            c->category_values, (Py_ssize_t)(c->categories->n * zb_dtype_size(c->dtype)));
        if (!values) goto fail;
    }
    PyObject *d =
        Py_BuildValue("{s:s,s:s,s:s,s:N,s:N,s:O}", "name", c->name, "kind", kind_names[c->kind],
                      "dtype", zb_dtype_typestr(c->dtype), "categories", cats, "category_values",
                      values, "ordered", c->ordered ? Py_True : Py_False);
    return d;
fail:
    Py_XDECREF(cats);
    Py_XDECREF(values);
    return NULL;
}

/* _src_info(path) -> {"format", "n_obs", "columns": [{name, kind, dtype, categories,
 * category_values, ordered}], "skipped": ["name\treason", ...]} */
static PyObject *
py_src_info(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    zb__src *src = NULL;
    if (!open_source(path, &src)) return NULL;
    PyObject *cols = PyList_New((Py_ssize_t)src->c.n_columns), *out = NULL;
    if (!cols) goto done;
    for (size_t i = 0; i < src->c.n_columns; i++) {
        PyObject *d = column_dict(&src->c.columns[i]);
        if (!d) goto done;
        PyList_SET_ITEM(cols, (Py_ssize_t)i, d);
    }
    PyObject *skipped = PyList_New((Py_ssize_t)src->c.n_skipped);
    if (!skipped) goto done;
    for (size_t i = 0; i < src->c.n_skipped; i++) {
        PyObject *o = PyUnicode_FromString(src->c.skipped[i]);
        if (!o) {
            Py_DECREF(skipped);
            goto done;
        }
        PyList_SET_ITEM(skipped, (Py_ssize_t)i, o);
    }
    out = Py_BuildValue("{s:s,s:K,s:O,s:N}", "format", src->c.format, "n_obs",
                        (unsigned long long)src->c.n_obs, "columns", cols, "skipped", skipped);
done:
    Py_XDECREF(cols);
    zb__src_close(src);
    return out;
}

/* _src_matrix(path, key, start, stop) -> {"layout", "dtype", "shape", "nnz", "indptr" (bytes,
 * int64), "indices" (bytes, uint32), "data" (bytes), "var_names"}: rows [start, stop) (columns
 * for a CSC matrix) as zb__src_matrix_read returns them; stop < 0 = the end. */
static PyObject *
py_src_matrix(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path, *key;
    long long start, stop;
    if (!PyArg_ParseTuple(args, "ssLL", &path, &key, &start, &stop)) return NULL;
    zb__src *src = NULL;
    if (!open_source(path, &src)) return NULL;
    zb__src_matrix *m = NULL;
    zb__csr_block b = {0};
    zb_strings names = {0};
    PyObject *out = NULL;
    const zb__src_matrix_info *info = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb__src_matrix_get(src, key, &m);
    if (st == ZB_OK) {
        info = zb__src_matrix_info_of(m);
        uint64_t limit = info->layout == ZB_SRC_CSC ? info->n_cols : info->n_rows;
        uint64_t a = start < 0 ? 0 : (uint64_t)start, e = stop < 0 ? limit : (uint64_t)stop;
        st = zb__src_matrix_read(m, a, e, &b);
    }
    if (st == ZB_OK) st = zb__src_matrix_var_names(m, &names);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    PyObject *var = strings_list(&names, "the var names");
    if (!var) goto done;
    out = Py_BuildValue(
        "{s:s,s:s,s:(KK),s:K,s:y#,s:y#,s:y#,s:N}", "layout", layout_names[info->layout], "dtype",
        zb_dtype_typestr(info->dtype), "shape", (unsigned long long)info->n_rows,
        (unsigned long long)info->n_cols, "nnz", (unsigned long long)info->nnz, "indptr",
        (const char *)b.indptr, (Py_ssize_t)((b.n_rows + 1) * sizeof(int64_t)), "indices",
        (const char *)b.indices, (Py_ssize_t)(b.nnz * sizeof(uint32_t)), "data",
        (const char *)b.data, (Py_ssize_t)(b.nnz * zb_dtype_size(info->dtype)), "var_names", var);
done:
    zb_strings_free(&names);
    zb__csr_block_free(&b);
    zb__src_close(src);
    return out;
}

/* _src_column(path, name, start, stop) -> {"values": bytes or None, "strings": list or None,
 * "mask": bytes or None}; stop < 0 = n_obs. */
static PyObject *
py_src_column(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path, *name;
    long long start, stop;
    if (!PyArg_ParseTuple(args, "ssLL", &path, &name, &start, &stop)) return NULL;
    zb__src *src = NULL;
    if (!open_source(path, &src)) return NULL;
    zb__col_block b = {0};
    PyObject *out = NULL;
    size_t col = 0;
    uint64_t a = start < 0 ? 0 : (uint64_t)start, e = stop < 0 ? src->c.n_obs : (uint64_t)stop;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb__src_find_column(src, name, &col);
    if (st == ZB_OK) st = zb__src_read_column(src, col, a, e, &b);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    const zb__col_info *c = &src->c.columns[col];
    PyObject *values = Py_None, *strings = Py_None, *mask = Py_None;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    if (b.values) {
        size_t item = c->kind == ZB_COL_CATEGORICAL ? sizeof(int32_t) : zb_dtype_size(c->dtype);
        Py_DECREF(values);
        values = PyBytes_FromStringAndSize(b.values, (Py_ssize_t)(b.n * item));
    }
    if (c->kind == ZB_COL_STRING || (c->kind == ZB_COL_NULLABLE && c->dtype == ZB_DT_STRING)) {
        Py_DECREF(strings);
        strings = strings_list(&b.strings, c->name);
    }
    if (b.mask) {
        Py_DECREF(mask);
        mask = PyBytes_FromStringAndSize((const char *)b.mask, (Py_ssize_t)b.n);
    }
    if (values && strings && mask)
        out = Py_BuildValue("{s:N,s:N,s:N}", "values", values, "strings", strings, "mask", mask);
    else {
        Py_XDECREF(values);
        Py_XDECREF(strings);
        Py_XDECREF(mask);
    }
done:
    zb__col_block_free(&b);
    zb__src_close(src);
    return out;
}

/* _src_obs_names(path, start, stop) -> list[str]; stop < 0 = n_obs. */
static PyObject *
py_src_obs_names(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path;
    long long start, stop;
    if (!PyArg_ParseTuple(args, "sLL", &path, &start, &stop)) return NULL;
    zb__src *src = NULL;
    if (!open_source(path, &src)) return NULL;
    zb_strings s = {0};
    PyObject *out = NULL;
    uint64_t a = start < 0 ? 0 : (uint64_t)start;
    uint64_t e = stop < 0 ? src->c.n_obs : (uint64_t)stop;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb__src_read_obs_names(src, a, e, &s);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK)
        zbpy_raise(st, NULL);
    else
        out = strings_list(&s, "the obs names");
    zb_strings_free(&s);
    zb__src_close(src);
    return out;
}

static PyMethodDef methods[] = {
    {"_src_info", py_src_info, METH_VARARGS, "_src_info(path) -> dict (test hook)"},
    {"_src_matrix", py_src_matrix, METH_VARARGS,
     "_src_matrix(path, key, start, stop) -> dict (test hook)"},
    {"_src_column", py_src_column, METH_VARARGS,
     "_src_column(path, name, start, stop) -> dict (test hook)"},
    {"_src_obs_names", py_src_obs_names, METH_VARARGS,
     "_src_obs_names(path, start, stop) -> list[str] (test hook)"},
    {NULL, NULL, 0, NULL},
};

int
zbpy_register_source(PyObject *module)
{
    return PyModule_AddFunctions(module, methods);
}
