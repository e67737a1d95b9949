/* Python bindings: writing arrays (zb_array_writer_*). */
#include <string.h>

#include "ext.h"
#include "write/write.h"

static int
dtype_from_name(const char *name, zb_dtype *out)
{
    for (int i = 0; i < ZB_DT_COUNT_; i++)
        if (!strcmp(zb_dtype_name((zb_dtype)i), name)) {
            *out = (zb_dtype)i;
            return 0;
        }
    return -1;
}

/* write_array(store_path, path, dtype_name, shape, data, chunk_rows, shard_rows, codec,
 *             zarr_format, num_threads, attributes_json, write_empty_chunks, fill_bytes,
 *             index_at_start, string_offsets, remote)
 * data: a C-contiguous buffer of the elements, or for strings the concatenated UTF-8 bytes
 * with string_offsets (an int64 buffer of n+1 offsets). */
static PyObject *
py_write_array(PyObject *self, PyObject *args)
{
    (void)self;
    const char *store_path, *path, *dtype_name, *codec = NULL, *attrs = NULL;
    PyObject *shape_obj, *fill_obj, *offsets_obj, *remote = NULL;
    Py_buffer data = {0}, offsets = {0}, fill = {0};
    unsigned long long chunk_rows, shard_rows;
    int zarr_format, num_threads, write_empty, index_at_start;
    if (!PyArg_ParseTuple(args, "sssOy*O&O&ziizpOpO|O", &store_path, &path, &dtype_name, &shape_obj,
                          &data, zbpy_u64, &chunk_rows, zbpy_u64, &shard_rows, &codec, &zarr_format,
                          &num_threads, &attrs, &write_empty, &fill_obj, &index_at_start,
                          &offsets_obj, &remote))
        return NULL;
    zb_remote_opts ro;
    if (zbpy_remote_opts(remote, &ro) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    zb_store *store = NULL;
    zb_array_writer *w = NULL;
    zb_status st = ZB_OK;
    zb_dtype dtype;
    uint64_t shape[ZB_MAX_DIMS];
    Py_ssize_t ndim = PySequence_Size(shape_obj);
    if (dtype_from_name(dtype_name, &dtype) < 0) {
        zbpy_raise(ZB_E_INVALID, "unsupported dtype");
        goto done;
    }
    if (ndim < 1 || ndim > ZB_MAX_DIMS) {
        zbpy_raise(ZB_E_INVALID, "write_array needs an array with 1 to 32 dimensions");
        goto done;
    }
    for (Py_ssize_t d = 0; d < ndim; d++) {
        PyObject *o = PySequence_GetItem(shape_obj, d);
        if (!o) goto done;
        shape[d] = PyLong_AsUnsignedLongLong(o);
        Py_DECREF(o);
        if (PyErr_Occurred()) goto done;
    }
    if (fill_obj != Py_None && PyObject_GetBuffer(fill_obj, &fill, PyBUF_SIMPLE) < 0) goto done;
    if (fill.buf && fill.len != (Py_ssize_t)zb_dtype_size(dtype)) {
        zbpy_raise(ZB_E_INVALID, "fill value has the wrong size for the dtype");
        goto done;
    }
    if (dtype == ZB_DT_STRING) {
        if (offsets_obj == Py_None ||
            PyObject_GetBuffer(offsets_obj, &offsets, PyBUF_C_CONTIGUOUS) < 0) {
            if (!PyErr_Occurred()) zbpy_raise(ZB_E_INVALID, "strings need offsets");
            goto done;
        }
        if ((uint64_t)offsets.len != (shape[0] + 1) * sizeof(uint64_t) || ndim != 1) {
            zbpy_raise(ZB_E_INVALID, "string offsets do not match the shape");
            goto done;
        }
    } else {
        uint64_t n = 1;
        for (Py_ssize_t d = 0; d < ndim; d++) n *= shape[d];
        if ((uint64_t)data.len != n * zb_dtype_size(dtype)) {
            zbpy_raise(ZB_E_INVALID, "buffer size does not match shape and dtype");
            goto done;
        }
    }

    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.zarr_format = zarr_format;
    o.codec = codec;
    o.chunk_rows = chunk_rows;
    o.shard_rows = shard_rows;
    o.write_empty_chunks = write_empty != 0;
    o.shard_index_at_start = index_at_start != 0;
    o.num_threads = num_threads;
    o.attributes_json = attrs;
    o.fill_value = fill.buf;
    Py_BEGIN_ALLOW_THREADS
    st = zbpy_store_open(store_path, &ro, &store);
    if (st == ZB_OK) st = zb_array_writer_open(store, path, dtype, (int)ndim, shape + 1, &o, &w);
    if (st == ZB_OK) {
        if (dtype == ZB_DT_STRING)
            st = zb_array_writer_append_strings(w, data.buf, offsets.buf, shape[0]);
        else
            st = zb_array_writer_append(w, data.buf, shape[0]);
    }
    if (st == ZB_OK) st = zb_array_writer_commit(w);
    /* the groups after the array's commit: a failed write leaves no new group pointing at it */
    if (st == ZB_OK) st = zb__write_groups_above(store, path, zarr_format);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) {
        zbpy_raise(st, NULL);
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_BEGIN_ALLOW_THREADS
    zb_array_writer_close(w);
    zb_store_close(store);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (offsets.obj) PyBuffer_Release(&offsets);
    if (fill.obj) PyBuffer_Release(&fill);
    return result;
}

static PyMethodDef write_methods[] = {
    {"write_array", py_write_array, METH_VARARGS,
     "write_array(...) -> None (see zbatch.write_array)"},
    {NULL, NULL, 0, NULL},
};

int
zbpy_register_write(PyObject *module)
{
    return PyModule_AddFunctions(module, write_methods);
}
