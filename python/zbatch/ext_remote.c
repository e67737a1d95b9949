/* Remote store options from Python: the flat dict zbatch._remote.remote_options builds becomes
 * a zb_remote_opts, and stores open with it. The dict's strings are borrowed only until the
 * store is open (libzbatch copies them). */
#include "ext.h"
#include "write/atomistic_int.h"

#include <string.h>

static int
get_str(PyObject *d, const char *k, const char **out)
{
    PyObject *v = PyDict_GetItemString(d, k);
    if (!v || v == Py_None) return 0;
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "storage option %s must be a str", k);
        return -1;
    }
    *out = PyUnicode_AsUTF8(v);
    return *out ? 0 : -1;
}

static int
get_num(PyObject *d, const char *k, double *out, bool *found)
{
    PyObject *v = PyDict_GetItemString(d, k);
    *found = false;
    if (!v || v == Py_None) return 0;
    double x = PyFloat_AsDouble(v);
    if (x == -1.0 && PyErr_Occurred()) return -1;
    if (!(x >= 0)) {
        PyErr_Format(PyExc_ValueError, "storage option %s must be >= 0", k);
        return -1;
    }
    *out = x;
    *found = true;
    return 0;
}

int
zbpy_remote_opts(PyObject *dict, zb_remote_opts *o)
{
    zb_remote_opts d = ZB_REMOTE_OPTS_DEFAULT;
    *o = d;
    if (!dict || dict == Py_None) return 0;
    if (!PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, "remote options must be a dict");
        return -1;
    }
    if (get_str(dict, "access_key_id", &o->access_key_id) < 0 ||
        get_str(dict, "secret_access_key", &o->secret_access_key) < 0 ||
        get_str(dict, "session_token", &o->session_token) < 0 ||
        get_str(dict, "region", &o->region) < 0 ||
        get_str(dict, "endpoint_url", &o->endpoint_url) < 0)
        return -1;
    PyObject *b = PyDict_GetItemString(dict, "anonymous");
    if (b) o->anonymous = PyObject_IsTrue(b) == 1;
    b = PyDict_GetItemString(dict, "insecure");
    if (b) o->insecure = PyObject_IsTrue(b) == 1;
    double x;
    bool f;
#define NUM(key, field, type)                                                                      \
    if (get_num(dict, key, &x, &f) < 0) return -1;                                                 \
    if (f) o->field = (type)x;
    NUM("addressing", addressing, int)
    NUM("max_in_flight", max_in_flight, int)
    NUM("coalesce_gap", coalesce_gap, uint64_t)
    NUM("max_request_bytes", max_request_bytes, uint64_t)
    NUM("max_retries", max_retries, int)
    NUM("backoff_base_s", backoff_base_s, double)
    NUM("backoff_max_s", backoff_max_s, double)
    NUM("connect_timeout_s", connect_timeout_s, double)
    NUM("stall_timeout_s", stall_timeout_s, double)
    NUM("multipart_threshold", multipart_threshold, uint64_t)
    NUM("part_bytes", part_bytes, uint64_t)
#undef NUM
    return 0;
}

zb_status
zbpy_store_open(const char *url, const zb_remote_opts *remote, zb_store **out)
{
    zb_store_opts so = ZB_STORE_OPTS_DEFAULT;
    so.remote = remote;
    return zb_store_open_opts(url, &so, out);
}

PyObject *
zbpy_store_stats(zb_store *store)
{
    zb_store_stats s;
    zb_store_get_stats(store, &s);
    return Py_BuildValue("{sKsKsKsKsK}", "requests", (unsigned long long)s.requests, "retries",
                         (unsigned long long)s.retries, "ranges", (unsigned long long)s.ranges,
                         "bytes", (unsigned long long)s.bytes, "max_in_flight",
                         (unsigned long long)s.max_in_flight);
}

/* read_ranges(url, remote, ranges) -> ([(status_name, bytes, offset)], stats): one
 * zb_store_get_ranges call over a list of (key, offset, length), for tests and tools that check
 * a store's range reads (offset: where a suffix range, offset ZB_RANGE_SUFFIX, began). */
static PyObject *
py_read_ranges(PyObject *self, PyObject *args)
{
    (void)self;
    const char *url;
    PyObject *remote, *list;
    if (!PyArg_ParseTuple(args, "sOO", &url, &remote, &list)) return NULL;
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) return NULL;
    PyObject *seq = PySequence_Fast(list, "ranges must be a sequence of (key, offset, length)");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    zb_range *r = PyMem_Calloc((size_t)n + 1, sizeof *r);
    PyObject *bufs = PyList_New(n), *out = NULL;
    zb_store *store = NULL;
    if (!r || !bufs) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *key;
        unsigned long long off, len;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "sKK", &key, &off, &len)) goto done;
        PyObject *b = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)len);
        if (!b) goto done;
        PyList_SET_ITEM(bufs, i, b);
        r[i] =
            (zb_range){.key = key, .offset = off, .length = len, .dst = PyByteArray_AS_STRING(b)};
    }
    zb_status st;
    zb_store_opts so = ZB_STORE_OPTS_DEFAULT;
    so.remote = &ro;
    Py_BEGIN_ALLOW_THREADS
    st = zb_store_open_opts(url, &so, &store);
    if (st == ZB_OK) zb_store_get_ranges(store, r, (size_t)n, NULL, NULL);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *b = PyList_GET_ITEM(bufs, i);
        PyObject *data =
            PyBytes_FromStringAndSize(PyByteArray_AS_STRING(b), (Py_ssize_t)r[i].nread);
        PyObject *t = data ? Py_BuildValue("(sNK)", zb_status_name(r[i].status), data,
                                           (unsigned long long)r[i].offset)
                           : NULL;
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, t);
    }
    if (out) {
        PyObject *stats = zbpy_store_stats(store);
        PyObject *pair = stats ? PyTuple_Pack(2, out, stats) : NULL;
        Py_XDECREF(stats);
        Py_SETREF(out, pair);
    }
done:
    Py_BEGIN_ALLOW_THREADS
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    PyMem_Free(r);
    Py_XDECREF(bufs);
    Py_DECREF(seq);
    return out;
}

/* The (url, remote, name) arguments of the store_* calls: a store URL, its options dict and a
 * key or prefix. */
static int
store_call_args(PyObject *args, const char **url, zb_remote_opts *ro, const char **name)
{
    PyObject *remote;
    if (!PyArg_ParseTuple(args, "sOs", url, &remote, name)) return -1;
    return zbpy_remote_opts(remote, ro);
}

/* store_read(url, remote, key) -> bytes, or None when the object is absent: the small documents
 * (zarr.json, markers) the Python writers look at, from a local directory or a bucket alike. */
static PyObject *
py_store_read(PyObject *self, PyObject *args)
{
    (void)self;
    const char *url, *key;
    zb_remote_opts ro;
    if (store_call_args(args, &url, &ro, &key) < 0) return NULL;
    zb_store *store = NULL;
    uint8_t *data = NULL;
    uint64_t len = 0;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(url, &ro, &store);
    if (st == ZB_OK) st = zb_store_read_all(store, key, &data, &len);
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        Py_RETURN_NONE;
    }
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    PyObject *out = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)len);
    free(data);
    return out;
}

typedef struct listing {
    PyObject *list;
    int failed;
} listing;

static int
add_name(void *ctx, const char *name, bool is_dir)
{
    listing *l = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *t = Py_BuildValue("(sO)", name, is_dir ? Py_True : Py_False);
    if (!t || PyList_Append(l->list, t) < 0) l->failed = 1;
    Py_XDECREF(t);
    PyGILState_Release(g);
    return l->failed;
}

/* store_list(url, remote, prefix) -> [(name, is_dir)]: the children of `prefix`; [] when there
 * is none. */
static PyObject *
py_store_list(PyObject *self, PyObject *args)
{
    (void)self;
    const char *url, *prefix;
    zb_remote_opts ro;
    if (store_call_args(args, &url, &ro, &prefix) < 0) return NULL;
    listing l = {PyList_New(0), 0};
    if (!l.list) return NULL;
    zb_store *store = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(url, &ro, &store);
    if (st == ZB_OK) st = zb_store_list(store, prefix, add_name, &l);
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        st = ZB_OK;
    }
    if (l.failed || st != ZB_OK) {
        Py_DECREF(l.list);
        return l.failed ? NULL : zbpy_raise(st, NULL);
    }
    return l.list;
}

/* store_remove_tree(url, remote, prefix): erases every object below `prefix` (its root
 * document first, so what a failure leaves is not a store). */
static PyObject *
py_store_remove_tree(PyObject *self, PyObject *args)
{
    (void)self;
    const char *url, *prefix;
    zb_remote_opts ro;
    if (store_call_args(args, &url, &ro, &prefix) < 0) return NULL;
    zb_store *store = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(url, &ro, &store);
    if (st == ZB_OK) st = zb__at_remove_tree(store, prefix);
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static int
put_str(PyObject *d, const char *k, const char *v)
{
    if (!v) return 0;
    PyObject *o = PyUnicode_FromString(v);
    int rc = o ? PyDict_SetItemString(d, k, o) : -1;
    Py_XDECREF(o);
    return rc;
}

/* aws_profile(credentials_path, config_path, profile) -> dict: what zb_aws_profile_load read
 * ("found", and the keys given: access_key_id, secret_access_key, session_token, region,
 * endpoint_url). */
static PyObject *
py_aws_profile(PyObject *self, PyObject *args)
{
    (void)self;
    const char *cred, *conf, *profile;
    if (!PyArg_ParseTuple(args, "zzz", &cred, &conf, &profile)) return NULL;
    zb_aws_profile p;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_aws_profile_load(cred, conf, profile, &p);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    PyObject *d = PyDict_New();
    if (d && (PyDict_SetItemString(d, "found", p.found ? Py_True : Py_False) < 0 ||
              put_str(d, "access_key_id", p.access_key_id) < 0 ||
              put_str(d, "secret_access_key", p.secret_access_key) < 0 ||
              put_str(d, "session_token", p.session_token) < 0 ||
              put_str(d, "region", p.region) < 0 || put_str(d, "endpoint_url", p.endpoint_url) < 0))
        Py_CLEAR(d);
    zb_aws_profile_free(&p);
    return d;
}

static PyMethodDef remote_methods[] = {
    {"aws_profile", py_aws_profile, METH_VARARGS,
     "aws_profile(credentials_path, config_path, profile) -> dict"},
    {"store_read", py_store_read, METH_VARARGS,
     "store_read(url, remote, key) -> bytes or None (absent)"},
    {"store_list", py_store_list, METH_VARARGS,
     "store_list(url, remote, prefix) -> [(name, is_dir)]"},
    {"store_remove_tree", py_store_remove_tree, METH_VARARGS,
     "store_remove_tree(url, remote, prefix) -> None"},
    {"read_ranges", py_read_ranges, METH_VARARGS,
     "read_ranges(url, remote, [(key, offset, length)]) -> ([(status, bytes)], stats)"},
    {NULL, NULL, 0, NULL},
};

int
zbpy_register_remote(PyObject *module)
{
    return PyModule_AddFunctions(module, remote_methods);
}
