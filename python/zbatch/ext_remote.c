/* Remote store options from Python: the flat dict zbatch._remote.remote_options builds becomes
 * a zb_remote_opts, and stores open with it. The dict's strings are borrowed only until the
 * store is open (libzbatch copies them). */
#include "ext.h"

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
#define NUM(key, field, type)                                                                    \
    if (get_num(dict, key, &x, &f) < 0) return -1;                                               \
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
