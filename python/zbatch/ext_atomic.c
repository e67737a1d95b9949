/* Python bindings: the atomic layout writer (zb_atomic_*; include/zbatch_atomic.h).
 *
 * A writer is a capsule holding the store and the zb_atomic_writer; python/zbatch/_atomic.py
 * turns samples into per-field buffers and drives it. Configs arrive as dicts:
 *   {"meta"|"core"|"custom": {"codec": str|None, "chunk_rows": int, "shard_rows": int},
 *    "field_overrides": {name: {...}}, "num_threads": int}
 * Every string is copied before the GIL is released. */
#include <stdlib.h>
#include <string.h>

#include "ext.h"

#define CAPSULE_NAME "zbatch.atomic_writer"

/* ------------------------------------------------------------------------------------------- */
/* Arguments                                                                                    */
/* ------------------------------------------------------------------------------------------- */

/* Strings copied out of Python objects, freed together. */
typedef struct str_pool {
    char **s;
    size_t n;
} str_pool;

static const char *
pool_dup(str_pool *p, PyObject *o)
{
    const char *u = zbpy_str(o);
    if (!u) return NULL;
    char **ns = realloc(p->s, (p->n + 1) * sizeof *ns);
    if (!ns) {
        PyErr_NoMemory();
        return NULL;
    }
    p->s = ns;
    char *d = strdup(u);
    if (!d) {
        PyErr_NoMemory();
        return NULL;
    }
    p->s[p->n++] = d;
    return d;
}

static void
pool_free(str_pool *p)
{
    for (size_t i = 0; i < p->n; i++) free(p->s[i]);
    free(p->s);
    p->s = NULL;
    p->n = 0;
}

/* A config dict, parsed. */
typedef struct py_cfg {
    zb_atomic_write_config cfg;
    zb_atomic_override *ov;
    str_pool strs;
} py_cfg;

static void
py_cfg_free(py_cfg *c)
{
    free(c->ov);
    pool_free(&c->strs);
}

static int
get_u64(PyObject *d, const char *key, uint64_t *out)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (!v || v == Py_None) return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

static int
array_config(PyObject *d, str_pool *strs, zb_atomic_array_config *out, const char *what)
{
    memset(out, 0, sizeof *out);
    if (!d || d == Py_None) return 0;
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "config '%s' must be a dict", what);
        return -1;
    }
    PyObject *codec = PyDict_GetItemString(d, "codec");
    if (codec && codec != Py_None && !(out->codec = pool_dup(strs, codec))) return -1;
    if (get_u64(d, "chunk_rows", &out->chunk_rows) < 0) return -1;
    if (get_u64(d, "shard_rows", &out->shard_rows) < 0) return -1;
    return 0;
}

/* Parses `o` (a dict or None); *use is 0 for None. */
static int
parse_config(PyObject *o, py_cfg *c, int *use)
{
    memset(c, 0, sizeof *c);
    zb_atomic_write_config def = ZB_ATOMIC_WRITE_CONFIG_DEFAULT;
    c->cfg = def;
    *use = o && o != Py_None;
    if (!*use) return 0;
    if (!PyDict_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "config must be a dict or None");
        return -1;
    }
    if (array_config(PyDict_GetItemString(o, "meta"), &c->strs, &c->cfg.meta, "meta") < 0 ||
        array_config(PyDict_GetItemString(o, "core"), &c->strs, &c->cfg.core, "core") < 0 ||
        array_config(PyDict_GetItemString(o, "custom"), &c->strs, &c->cfg.custom, "custom") < 0)
        return -1;
    PyObject *nt = PyDict_GetItemString(o, "num_threads");
    if (nt && nt != Py_None) {
        long v = PyLong_AsLong(nt);
        if (PyErr_Occurred()) return -1;
        c->cfg.num_threads = (int)v;
    }
    PyObject *ov = PyDict_GetItemString(o, "field_overrides");
    if (ov && ov != Py_None) {
        if (!PyDict_Check(ov)) {
            PyErr_SetString(PyExc_TypeError, "config 'field_overrides' must be a dict");
            return -1;
        }
        Py_ssize_t n = PyDict_Size(ov), pos = 0, i = 0;
        c->ov = calloc(n ? (size_t)n : 1, sizeof *c->ov);
        if (!c->ov) {
            PyErr_NoMemory();
            return -1;
        }
        PyObject *k, *v;
        while (PyDict_Next(ov, &pos, &k, &v)) {
            if (!(c->ov[i].name = pool_dup(&c->strs, k))) return -1;
            if (array_config(v, &c->strs, &c->ov[i].config, c->ov[i].name) < 0) return -1;
            i++;
        }
        c->cfg.overrides = c->ov;
        c->cfg.n_overrides = (size_t)i;
    }
    return 0;
}

static int
level_from_str(const char *s, zb_atomic_level *out)
{
    if (!strcmp(s, "atom"))
        *out = ZB_ATOMIC_ATOM;
    else if (!strcmp(s, "edge"))
        *out = ZB_ATOMIC_EDGE;
    else if (!strcmp(s, "system"))
        *out = ZB_ATOMIC_SYSTEM;
    else {
        PyErr_Format(PyExc_ValueError, "level '%s' is not 'atom', 'edge' or 'system'", s);
        return -1;
    }
    return 0;
}

static int
dtype_from_str(const char *s, zb_dtype *out)
{
    for (int i = 0; i < ZB_DT_COUNT_; i++)
        if (!strcmp(zb_dtype_name((zb_dtype)i), s) && i != ZB_DT_STRING) {
            *out = (zb_dtype)i;
            return 0;
        }
    PyErr_Format(PyExc_TypeError, "dtype '%s' cannot be stored in an atomic field", s);
    return -1;
}

/* Fields given as a list of (group, name, level, dtype, row_shape, buffer). */
typedef struct py_fields {
    size_t n;
    zb_atomic_field *f;
    uint64_t *shapes; /* n * ZB_MAX_DIMS */
    Py_buffer *bufs;
    str_pool strs;
} py_fields;

static void
py_fields_free(py_fields *pf)
{
    for (size_t i = 0; i < pf->n; i++)
        if (pf->bufs && pf->bufs[i].obj) PyBuffer_Release(&pf->bufs[i]);
    free(pf->f);
    free(pf->shapes);
    free(pf->bufs);
    pool_free(&pf->strs);
    memset(pf, 0, sizeof *pf);
}

static int
parse_field(PyObject *t, py_fields *pf, size_t i)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "a field is a tuple (group, name, level, dtype, row_shape, buffer)");
        return -1;
    }
    zb_atomic_field *f = &pf->f[i];
    const char *level, *dtype;
    if (!(f->group = pool_dup(&pf->strs, PyTuple_GET_ITEM(t, 0))) ||
        !(f->name = pool_dup(&pf->strs, PyTuple_GET_ITEM(t, 1))) ||
        !(level = zbpy_str(PyTuple_GET_ITEM(t, 2))) || !(dtype = zbpy_str(PyTuple_GET_ITEM(t, 3))))
        return -1;
    if (level_from_str(level, &f->level) < 0 || dtype_from_str(dtype, &f->dtype) < 0) return -1;
    PyObject *shape = PyTuple_GET_ITEM(t, 4);
    Py_ssize_t nd = PySequence_Size(shape);
    if (nd < 0) return -1;
    if (nd > ZB_MAX_DIMS - 1) {
        PyErr_SetString(PyExc_ValueError, "row shape has too many dimensions");
        return -1;
    }
    uint64_t *sh = pf->shapes + i * ZB_MAX_DIMS;
    for (Py_ssize_t d = 0; d < nd; d++) {
        PyObject *o = PySequence_GetItem(shape, d);
        if (!o) return -1;
        sh[d] = PyLong_AsUnsignedLongLong(o);
        Py_DECREF(o);
        if (PyErr_Occurred()) return -1;
    }
    f->ndim = (int)nd;
    f->shape = sh;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 5), &pf->bufs[i], PyBUF_C_CONTIGUOUS) < 0) return -1;
    f->data = pf->bufs[i].len ? pf->bufs[i].buf : NULL;
    return 0;
}

static int
parse_fields(PyObject *list, py_fields *pf)
{
    memset(pf, 0, sizeof *pf);
    PyObject *seq = PySequence_Fast(list, "fields must be a sequence");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    pf->f = calloc(n ? (size_t)n : 1, sizeof *pf->f);
    pf->shapes = calloc((n ? (size_t)n : 1) * ZB_MAX_DIMS, sizeof *pf->shapes);
    pf->bufs = calloc(n ? (size_t)n : 1, sizeof *pf->bufs);
    if (!pf->f || !pf->shapes || !pf->bufs) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    pf->n = (size_t)n;
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_field(PySequence_Fast_GET_ITEM(seq, i), pf, (size_t)i) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    Py_DECREF(seq);
    return 0;
}

/* An int64 buffer of exactly n items (or None for n == 0 / no edges). */
static int
i64_buffer(PyObject *o, Py_buffer *b, uint64_t n, const char *what)
{
    memset(b, 0, sizeof *b);
    if (o == Py_None) return 0;
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if ((uint64_t)b->len != n * 8) {
        PyErr_Format(PyExc_ValueError, "%s: expected %llu int64 values", what,
                     (unsigned long long)n);
        PyBuffer_Release(b);
        memset(b, 0, sizeof *b);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------- */
/* The writer capsule                                                                           */
/* ------------------------------------------------------------------------------------------- */

typedef struct py_writer {
    zb_store *store;
    zb_atomic_writer *w;
    int busy; /* set (under the GIL) while C works without it */
} py_writer;

static void
writer_release(py_writer *pw)
{
    zb_atomic_writer_close(pw->w);
    zb_store_close(pw->store);
    pw->w = NULL;
    pw->store = NULL;
}

static void
capsule_destructor(PyObject *cap)
{
    py_writer *pw = PyCapsule_GetPointer(cap, CAPSULE_NAME);
    if (!pw) {
        PyErr_Clear();
        return;
    }
    writer_release(pw);
    free(pw);
}

static py_writer *
get_writer(PyObject *cap)
{
    py_writer *pw = PyCapsule_GetPointer(cap, CAPSULE_NAME);
    if (!pw) return NULL;
    if (!pw->w) {
        PyErr_SetString(PyExc_ValueError, "the atomic writer is closed");
        return NULL;
    }
    if (pw->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the atomic writer is in use by another thread");
        return NULL;
    }
    return pw;
}

/* atomic_writer_open(store_root, path, append, config) -> capsule */
static PyObject *
py_writer_open(PyObject *self, PyObject *args)
{
    (void)self;
    const char *root, *path;
    PyObject *remote = NULL;
    int append;
    PyObject *cfg_obj;
    if (!PyArg_ParseTuple(args, "sspO|O", &root, &path, &append, &cfg_obj, &remote)) return NULL;
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) return NULL;
    py_cfg c;
    int use;
    if (parse_config(cfg_obj, &c, &use) < 0) {
        py_cfg_free(&c);
        return NULL;
    }
    py_writer *pw = calloc(1, sizeof *pw);
    if (!pw) {
        py_cfg_free(&c);
        return PyErr_NoMemory();
    }
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(root, &ro, &pw->store);
    if (st == ZB_OK)
        st = append ? zb_atomic_writer_open_append(pw->store, path, use ? &c.cfg : NULL, &pw->w)
                    : zb_atomic_writer_open(pw->store, path, use ? &c.cfg : NULL, &pw->w);
    Py_END_ALLOW_THREADS
    py_cfg_free(&c);
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        writer_release(pw);
        free(pw);
        return NULL;
    }
    PyObject *cap = PyCapsule_New(pw, CAPSULE_NAME, capsule_destructor);
    if (!cap) {
        writer_release(pw);
        free(pw);
    }
    return cap;
}

/* atomic_writer_add(capsule, n_samples, atoms_counts, edges_counts|None, fields) -> None */
static PyObject *
py_writer_add(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *atoms_obj, *edges_obj, *fields_obj;
    unsigned long long n;
    if (!PyArg_ParseTuple(args, "OO&OOO", &cap, zbpy_u64, &n, &atoms_obj, &edges_obj, &fields_obj))
        return NULL;
    py_writer *pw = get_writer(cap);
    if (!pw) return NULL;
    Py_buffer atoms = {0}, edges = {0};
    py_fields pf;
    memset(&pf, 0, sizeof pf);
    PyObject *result = NULL;
    if (i64_buffer(atoms_obj, &atoms, n, "atoms_per_sample") < 0 ||
        i64_buffer(edges_obj, &edges, n, "edges_per_sample") < 0 ||
        parse_fields(fields_obj, &pf) < 0)
        goto done;
    if (n && !atoms.buf) {
        PyErr_SetString(PyExc_ValueError, "atoms_per_sample is required");
        goto done;
    }
    zb_status st;
    pw->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    st = zb_atomic_writer_add(pw->w, n, atoms.buf, edges.buf, pf.n, pf.f);
    Py_END_ALLOW_THREADS
    pw->busy = 0;
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    if (atoms.obj) PyBuffer_Release(&atoms);
    if (edges.obj) PyBuffer_Release(&edges);
    py_fields_free(&pf);
    return result;
}

/* atomic_writer_commit(capsule) -> int (samples in the dataset) */
static PyObject *
py_writer_commit(PyObject *self, PyObject *cap)
{
    (void)self;
    py_writer *pw = get_writer(cap);
    if (!pw) return NULL;
    zb_status st;
    pw->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    st = zb_atomic_writer_commit(pw->w);
    Py_END_ALLOW_THREADS
    pw->busy = 0;
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    return PyLong_FromUnsignedLongLong(zb_atomic_writer_num_samples(pw->w));
}

/* atomic_writer_close(capsule) -> None; closing twice is fine */
static PyObject *
py_writer_close(PyObject *self, PyObject *cap)
{
    (void)self;
    py_writer *pw = PyCapsule_GetPointer(cap, CAPSULE_NAME);
    if (!pw) return NULL;
    if (pw->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the atomic writer is in use by another thread");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    writer_release(pw);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------- */
/* Store operations                                                                             */
/* ------------------------------------------------------------------------------------------- */

/* atomic_delete(store_root, path, ids) ; ids: a uint64 buffer */
static PyObject *
py_delete(PyObject *self, PyObject *args)
{
    (void)self;
    const char *root, *path;
    PyObject *remote = NULL;
    Py_buffer ids = {0};
    if (!PyArg_ParseTuple(args, "ssy*|O", &root, &path, &ids, &remote)) return NULL;
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) {
        PyBuffer_Release(&ids);
        return NULL;
    }
    if (ids.len % 8) {
        PyBuffer_Release(&ids);
        PyErr_SetString(PyExc_ValueError, "ids must be a uint64 buffer");
        return NULL;
    }
    zb_store *store = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(root, &ro, &store);
    if (st == ZB_OK) st = zb_atomic_delete(store, path, ids.buf, (size_t)ids.len / 8);
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ids);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* atomic_defragment(store_root, path, config|None) */
static PyObject *
py_defragment(PyObject *self, PyObject *args)
{
    (void)self;
    const char *root, *path;
    PyObject *remote = NULL;
    PyObject *cfg_obj;
    if (!PyArg_ParseTuple(args, "ssO|O", &root, &path, &cfg_obj, &remote)) return NULL;
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) return NULL;
    py_cfg c;
    int use;
    if (parse_config(cfg_obj, &c, &use) < 0) {
        py_cfg_free(&c);
        return NULL;
    }
    zb_store *store = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(root, &ro, &store);
    if (st == ZB_OK) st = zb_atomic_defragment(store, path, use ? &c.cfg : NULL);
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    py_cfg_free(&c);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* atomic_add_custom(store_root, path, config|None, field_tuple, n_rows) */
static PyObject *
py_add_custom(PyObject *self, PyObject *args)
{
    (void)self;
    const char *root, *path;
    PyObject *remote = NULL;
    PyObject *cfg_obj, *field;
    unsigned long long n_rows;
    if (!PyArg_ParseTuple(args, "ssOOO&|O", &root, &path, &cfg_obj, &field, zbpy_u64, &n_rows,
                          &remote))
        return NULL;
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) return NULL;
    py_cfg c;
    int use;
    py_fields pf;
    memset(&pf, 0, sizeof pf);
    PyObject *list = NULL, *result = NULL;
    if (parse_config(cfg_obj, &c, &use) < 0) goto done;
    list = PyList_New(1);
    if (!list) goto done;
    Py_INCREF(field);
    PyList_SET_ITEM(list, 0, field);
    if (parse_fields(list, &pf) < 0) goto done;
    zb_store *store = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(root, &ro, &store);
    if (st == ZB_OK) st = zb_atomic_add_custom(store, path, use ? &c.cfg : NULL, &pf.f[0], n_rows);
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(list);
    py_fields_free(&pf);
    py_cfg_free(&c);
    return result;
}

/* atomic_check(store_root, path) -> dict */
static PyObject *
py_check(PyObject *self, PyObject *args)
{
    (void)self;
    const char *root, *path;
    PyObject *remote = NULL;
    if (!PyArg_ParseTuple(args, "ss|O", &root, &path, &remote)) return NULL;
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) return NULL;
    zb_store *store = NULL;
    zb_atomic_summary sum;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(root, &ro, &store);
    if (st == ZB_OK) st = zb_atomic_check(store, path, &sum);
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    return Py_BuildValue("{sKsKsKsKsKsO}", "num_samples", (unsigned long long)sum.num_samples,
                         "num_live", (unsigned long long)sum.num_live, "num_atoms",
                         (unsigned long long)sum.num_atoms, "num_edges",
                         (unsigned long long)sum.num_edges, "num_fields",
                         (unsigned long long)sum.num_fields, "uncommitted_tail",
                         sum.uncommitted_tail ? Py_True : Py_False);
}

/* atomic_recover(store_root, path) */
static PyObject *
py_recover(PyObject *self, PyObject *args)
{
    (void)self;
    const char *root, *path;
    PyObject *remote = NULL;
    if (!PyArg_ParseTuple(args, "ss|O", &root, &path, &remote)) return NULL;
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) return NULL;
    zb_store *store = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(root, &ro, &store);
    if (st == ZB_OK) st = zb_atomic_recover(store, path);
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyMethodDef atomic_methods[] = {
    {"atomic_writer_open", py_writer_open, METH_VARARGS,
     "atomic_writer_open(store_root, path, append, config, remote=None) -> writer"},
    {"atomic_writer_add", py_writer_add, METH_VARARGS,
     "atomic_writer_add(writer, n_samples, atoms_counts, edges_counts, fields) -> None"},
    {"atomic_writer_commit", py_writer_commit, METH_O, "atomic_writer_commit(writer) -> int"},
    {"atomic_writer_close", py_writer_close, METH_O, "atomic_writer_close(writer) -> None"},
    {"atomic_delete", py_delete, METH_VARARGS,
     "atomic_delete(store_root, path, ids, remote=None) -> None"},
    {"atomic_defragment", py_defragment, METH_VARARGS,
     "atomic_defragment(store_root, path, config, remote=None) -> None"},
    {"atomic_add_custom", py_add_custom, METH_VARARGS,
     "atomic_add_custom(store_root, path, config, field, n_rows, remote=None) -> None"},
    {"atomic_check", py_check, METH_VARARGS, "atomic_check(store_root, path, remote=None) -> dict"},
    {"atomic_recover", py_recover, METH_VARARGS,
     "atomic_recover(store_root, path, remote=None) -> None"},
    {NULL, NULL, 0, NULL},
};

int
zbpy_register_atomic(PyObject *module)
{
    return PyModule_AddFunctions(module, atomic_methods);
}
