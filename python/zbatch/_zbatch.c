/* The C extension behind the zbatch Python package: a thin layer over libzbatch. The logic
 * lives in the library; this file converts arguments, releases the GIL while C works, and turns
 * zb_status codes into zbatch.ZbatchError with the detail message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ext.h"

static PyObject *ZbatchError;

int
zbpy_u64(PyObject *obj, void *out)
{
    PyObject *i = PyNumber_Index(obj);
    if (!i) return 0;
    int sign = 0; /* -1: below LLONG_MIN, +1: above LLONG_MAX */
    long long sv = PyLong_AsLongLongAndOverflow(i, &sign);
    bool neg = sign < 0 || (sign == 0 && sv < 0);
    unsigned long long v = neg || PyErr_Occurred() ? 0 : PyLong_AsUnsignedLongLong(i);
    Py_DECREF(i);
    if (PyErr_Occurred() && !neg && v != (unsigned long long)-1) return 0;
    if (neg) {
        PyErr_Format(PyExc_OverflowError, "%R is negative: expected an integer in [0, 2**64)", obj);
        return 0;
    }
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_OverflowError,
                     "%R does not fit 64 bits: expected an integer in "
                     "[0, 2**64)",
                     obj);
        return 0;
    }
    *(unsigned long long *)out = v;
    return 1;
}

const char *
zbpy_str(PyObject *obj)
{
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(obj, &n);
    if (u && strlen(u) != (size_t)n) {
        PyErr_Format(PyExc_ValueError, "%R: a name may not contain a NUL character", obj);
        return NULL;
    }
    return u;
}

int
zbpy_u32(PyObject *obj, void *out)
{
    unsigned long long v;
    if (!zbpy_u64(obj, &v)) return 0;
    if (v > UINT_MAX) {
        PyErr_Format(PyExc_OverflowError,
                     "%R does not fit 32 bits: expected an integer in "
                     "[0, 2**32)",
                     obj);
        return 0;
    }
    *(unsigned int *)out = (unsigned int)v;
    return 1;
}

/* Raises ZbatchError(message) with .status (the code's name) and .code set; the message is
 * `detail`, or this thread's libzbatch detail message when NULL. */
static PyObject *
raise_detail(zb_status st, const char *detail)
{
    if (!detail) detail = zb_last_error();
    PyObject *msg = PyUnicode_FromFormat("%s: %s", zb_strerror(st),
                                         detail && *detail ? detail : zb_strerror(st));
    if (!msg) return NULL;
    PyObject *exc = PyObject_CallOneArg(ZbatchError, msg);
    Py_DECREF(msg);
    if (!exc) return NULL;
    PyObject *name = PyUnicode_FromString(zb_status_name(st));
    PyObject *code = PyLong_FromLong((long)st);
    if (name && code) {
        PyObject_SetAttrString(exc, "status", name);
        PyObject_SetAttrString(exc, "code", code);
    }
    Py_XDECREF(name);
    Py_XDECREF(code);
    PyErr_SetObject(ZbatchError, exc);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *
raise_status(zb_status st)
{
    return raise_detail(st, NULL);
}

PyObject *
zbpy_raise(zb_status st, const char *detail)
{
    return raise_detail(st, detail);
}

PyObject *
zbpy_strings(const char *data, const int64_t *offsets, const uint64_t *uoffsets, uint64_t n,
             const char *what)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (uint64_t i = 0; l && i < n; i++) {
        uint64_t a = offsets ? (uint64_t)offsets[i] : uoffsets[i];
        uint64_t e = offsets ? (uint64_t)offsets[i + 1] : uoffsets[i + 1];
        PyObject *o = PyUnicode_DecodeUTF8(data + a, (Py_ssize_t)(e - a), NULL);
        if (!o && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            char msg[512];
            snprintf(msg, sizeof msg,
                     "%s: string %llu (%llu bytes) is not UTF-8 (vlen-utf8 strings must be; "
                     "zarr-python refuses it too)",
                     what, (unsigned long long)i, (unsigned long long)(e - a));
            zbpy_raise(ZB_E_CORRUPT, msg);
        }
        if (!o) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, o);
    }
    return l;
}

static PyObject *
shape_tuple(const zb_array_info *info, uint64_t rows)
{
    PyObject *t = PyTuple_New(info->ndim);
    if (!t) return NULL;
    for (int d = 0; d < info->ndim; d++) {
        uint64_t v = d == 0 ? rows : info->shape[d];
        PyObject *o = PyLong_FromUnsignedLongLong(v);
        if (!o) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, d, o);
    }
    return t;
}

/* read_array(store_path, array_path, start, stop) -> (bytearray | list[str], typestr, shape)
 * stop < 0 means the end of axis 0. */
static PyObject *
py_read_array(PyObject *self, PyObject *args)
{
    (void)self;
    const char *store_path, *array_path;
    long long start_ll, stop_ll;
    if (!PyArg_ParseTuple(args, "ssLL", &store_path, &array_path, &start_ll, &stop_ll)) return NULL;
    zb_store *store = NULL;
    zb_array *array = NULL;
    zb_status st;
    PyObject *result = NULL, *data = NULL, *shape = NULL;

    Py_BEGIN_ALLOW_THREADS
    st = zb_store_open(store_path, &store);
    if (st == ZB_OK) st = zb_array_open(store, array_path, &array);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) goto fail_status;

    zb_array_info info;
    zb_array_get_info(array, &info);
    uint64_t rows = info.ndim == 0 ? 1 : info.shape[0];
    uint64_t start = (uint64_t)start_ll;
    if (start_ll < 0 || stop_ll < -1) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: rows [%lld, %lld): negative %s", array_path, start_ll,
                 stop_ll, start_ll < 0 ? "start" : "stop");
        zb_array_close(array);
        zb_store_close(store);
        return raise_detail(ZB_E_RANGE, msg);
    }
    uint64_t stop = stop_ll == -1 ? rows : (uint64_t)stop_ll;
    if (info.ndim == 0) {
        start = 0;
        stop = 1;
    }

    if (info.dtype == ZB_DT_STRING) {
        zb_strings s;
        Py_BEGIN_ALLOW_THREADS
        st = zb_array_read_strings(array, start, stop, &s, NULL);
        Py_END_ALLOW_THREADS
        if (st != ZB_OK) goto fail_status;
        data = zbpy_strings(s.data, NULL, s.offsets, s.n, array_path);
        zb_strings_free(&s);
        if (!data) goto fail;
    } else {
        uint64_t nbytes = info.itemsize;
        bool over = info.ndim != 0 &&
                    (__builtin_mul_overflow(start <= stop && stop <= rows ? stop - start : 0,
                                            zb_array_row_elems(array), &nbytes) ||
                     __builtin_mul_overflow(nbytes, info.itemsize, &nbytes));
        /* a shape from a damaged store may claim any size: a status naming it, never a bare
         * MemoryError or a size reduced modulo 2^64 (rows out of range: zb_array_read_rows
         * says so) */
        const char *name = *array_path ? array_path : store_path;
        char msg[700];
        if (over || nbytes > (uint64_t)PY_SSIZE_T_MAX) {
            if (over)
                snprintf(msg, sizeof msg, "%s: rows [%llu, %llu): the byte size overflows 64 bits",
                         name, (unsigned long long)start, (unsigned long long)stop);
            else
                snprintf(msg, sizeof msg,
                         "%s: rows [%llu, %llu): %llu bytes, more than one read "
                         "can hold",
                         name, (unsigned long long)start, (unsigned long long)stop,
                         (unsigned long long)nbytes);
            raise_detail(ZB_E_OVERFLOW, msg);
            goto fail;
        }
        data = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)nbytes);
        if (!data && PyErr_ExceptionMatches(PyExc_MemoryError)) {
            PyErr_Clear();
            snprintf(msg, sizeof msg, "%s: rows [%llu, %llu): %llu bytes", name,
                     (unsigned long long)start, (unsigned long long)stop,
                     (unsigned long long)nbytes);
            raise_detail(ZB_E_NOMEM, msg);
        }
        if (!data) goto fail;
        char *buf = PyByteArray_AS_STRING(data);
        Py_BEGIN_ALLOW_THREADS
        st = zb_array_read_rows(array, start, stop, buf, (size_t)nbytes, NULL);
        Py_END_ALLOW_THREADS
        if (st != ZB_OK) goto fail_status;
    }
    shape = shape_tuple(&info, stop >= start ? stop - start : 0);
    if (!shape) goto fail;
    result = Py_BuildValue("(OsO)", data, zb_dtype_typestr(info.dtype), shape);
    goto done;

fail_status:
    raise_status(st);
fail:
    result = NULL;
done:
    Py_XDECREF(data);
    Py_XDECREF(shape);
    zb_array_close(array);
    zb_store_close(store);
    return result;
}

/* info_json(path) -> str: what `zbatch info PATH --json` prints. */
static PyObject *
py_info_json(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    zb_store *store = NULL;
    char *json = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_store_open(path, &store);
    if (st == ZB_OK) st = zb_info_json(store, "", &json);
    Py_END_ALLOW_THREADS
    zb_store_close(store);
    if (st != ZB_OK) return raise_status(st);
    PyObject *r = PyUnicode_FromString(json);
    free(json);
    return r;
}

static PyObject *
py_status_names(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
#define ZB_PY_STATUS_(name, value, text)                                                           \
    do {                                                                                           \
        PyObject *v = PyLong_FromLong(value);                                                      \
        if (!v || PyDict_SetItemString(d, #name, v) < 0) {                                         \
            Py_XDECREF(v);                                                                         \
            Py_DECREF(d);                                                                          \
            return NULL;                                                                           \
        }                                                                                          \
        Py_DECREF(v);                                                                              \
    } while (0);
    ZB_STATUS_LIST(ZB_PY_STATUS_)
#undef ZB_PY_STATUS_
    return d;
}

static PyMethodDef methods[] = {
    {"read_array", py_read_array, METH_VARARGS,
     "read_array(store_path, array_path, start, stop) -> (data, typestr, shape)"},
    {"info_json", py_info_json, METH_VARARGS, "info_json(path) -> str"},
    {"status_names", py_status_names, METH_NOARGS, "status_names() -> dict name -> code"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "zbatch._zbatch",
    "libzbatch bindings",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__zbatch(void);

PyMODINIT_FUNC
PyInit__zbatch(void)
{
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    ZbatchError = PyErr_NewExceptionWithDoc(
        "zbatch.ZbatchError",
        "An error from libzbatch. `.status` is the status name (e.g. 'ZB_E_CORRUPT'), `.code`\n"
        "its number; the message names the key, codec and byte offset involved.",
        NULL, NULL);
    if (!ZbatchError || PyModule_AddObjectRef(m, "ZbatchError", ZbatchError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (zbpy_register_write(m) < 0 || zbpy_register_anndata(m) < 0 || zbpy_register_atomic(m) < 0 ||
        zbpy_register_dataset(m) < 0 || zbpy_register_sampler(m) < 0 ||
        zbpy_register_loader(m) < 0 || zbpy_register_source(m) < 0 ||
        zbpy_register_convert(m) < 0 || zbpy_register_neighbors(m) < 0 ||
        zbpy_register_remote(m) < 0 || zbpy_register_device(m) < 0 ||
        PyModule_AddStringConstant(m, "__version__", ZB_VERSION_STRING) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
