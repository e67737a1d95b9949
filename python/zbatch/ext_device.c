/* Python bindings: device batches (zbatch_cuda.h). A _DeviceBatch owns one zb_device_batch:
 * host() gives the host copy as the dict zbatch.dataset.Batch reads (its buffers keep the
 * device batch alive), pointers() the device addresses zbatch._cuda turns into torch tensors
 * (whose __cuda_array_interface__ owners keep it alive too), wait(stream) queues the
 * consumer stream's wait for the copies, and the batch is released when the last of these
 * references goes. A pinned batch (no device copy) is given release_on(stream_of): its
 * release then fences the stream stream_of() names at that moment (torch's current stream),
 * so a copy the script queued out of the batch runs before its memory is reused. */
#include "ext.h"
#include "zbatch_cuda.h"

typedef struct {
    PyObject_HEAD zb_device_batch *db;
    PyObject *stream_of; /* NULL, or a callable giving the stream the release fences */
} DeviceBatchObject;

/* Releases with the stream stream_of() gives now (an exception being raised is kept aside;
 * one from stream_of is reported as unraisable, and the consumer stream fenced instead). */
static void
release_on_current(zb_device_batch *db, PyObject *stream_of)
{
#if PY_VERSION_HEX >= 0x030C0000 /* PyErr_Fetch is deprecated from 3.12 */
    PyObject *raised = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
#endif
    PyObject *r = PyObject_CallNoArgs(stream_of);
    void *stream = r ? PyLong_AsVoidPtr(r) : NULL;
    Py_XDECREF(r);
    if (PyErr_Occurred()) {
        PyErr_WriteUnraisable(stream_of);
        zb_device_batch_release(db);
    } else {
        zb_device_batch_release_on(db, stream); /* records a fence; never waits */
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(raised);
#else
    PyErr_Restore(type, value, tb);
#endif
}

static void
device_batch_dealloc(DeviceBatchObject *self)
{
    PyObject *stream_of = self->stream_of;
    self->stream_of = NULL;
    if (stream_of)
        release_on_current(self->db, stream_of);
    else
        zb_device_batch_release(self->db); /* records on the consumer stream; never waits */
    Py_XDECREF(stream_of);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
device_batch_host(DeviceBatchObject *self, PyObject *noargs)
{
    (void)noargs;
    return zbpy_batch_dict(zb_device_batch_host(self->db), (PyObject *)self);
}

static PyObject *
address(const void *p)
{
    if (!p) Py_RETURN_NONE;
    return PyLong_FromVoidPtr((void *)p);
}

/* pointers() -> {"fields": {name: int|None}, "segments": {name: int}, "index": int,
 * "dataset": int|None, "event": int}; None when the batch has no device copy */
static PyObject *
device_batch_pointers(DeviceBatchObject *self, PyObject *noargs)
{
    (void)noargs;
    const zb_device_batch *db = self->db;
    if (!zb_device_batch_on_device(db)) Py_RETURN_NONE;
    const zb_batch *h = zb_device_batch_host(db);
    PyObject *fields = PyDict_New(), *segs = PyDict_New(), *out = NULL;
    if (!fields || !segs) goto done;
    for (size_t i = 0; i < zb_batch_nfields(h); i++) {
        zb_batch_view v;
        zb_batch_field(h, i, &v);
        PyObject *a = address(zb_device_batch_field(db, i));
        int bad = !a || PyDict_SetItemString(fields, v.name, a) < 0;
        Py_XDECREF(a);
        if (bad) goto done;
    }
    for (size_t i = 0; i < zb_batch_nsegments(h); i++) {
        const int64_t *ptr = NULL;
        const char *name = zb_batch_segment_at(h, i, &ptr);
        PyObject *a = address(zb_device_batch_segment(db, i));
        int bad = !a || PyDict_SetItemString(segs, name, a) < 0;
        Py_XDECREF(a);
        if (bad) goto done;
    }
    out = Py_BuildValue("{s:O,s:O,s:N,s:N,s:N}", "fields", fields, "segments", segs, "index",
                        address(zb_device_batch_index(db)), "dataset",
                        address(zb_device_batch_dataset(db)), "event",
                        address(zb_device_batch_event(db)));
done:
    Py_XDECREF(fields);
    Py_XDECREF(segs);
    return out;
}

/* wait(stream: int) -> None: the stream (a cudaStream_t as an int; 0 the legacy default
 * stream) waits for the batch's copies on the GPU and becomes its consumer stream */
static PyObject *
device_batch_wait(DeviceBatchObject *self, PyObject *args)
{
    unsigned long long stream = 0;
    if (!PyArg_ParseTuple(args, "K", &stream)) return NULL;
    zb_status st = zb_device_batch_wait(self->db, (void *)(uintptr_t)stream);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* release_on(stream_of) -> None: stream_of() (a cudaStream_t as an int), called when the
 * batch is released, is the stream its release fences */
static PyObject *
device_batch_release_on(DeviceBatchObject *self, PyObject *stream_of)
{
    if (!PyCallable_Check(stream_of)) {
        PyErr_SetString(PyExc_TypeError, "release_on needs a callable returning a stream");
        return NULL;
    }
    Py_INCREF(stream_of);
    Py_XSETREF(self->stream_of, stream_of);
    Py_RETURN_NONE;
}

static PyObject *
device_batch_on_device(DeviceBatchObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(zb_device_batch_on_device(self->db));
}

static PyMethodDef device_batch_methods[] = {
    {"host", (PyCFunction)device_batch_host, METH_NOARGS, "the host copy as a batch dict"},
    {"pointers", (PyCFunction)device_batch_pointers, METH_NOARGS, "device addresses"},
    {"wait", (PyCFunction)device_batch_wait, METH_VARARGS, "a stream waits for the copies"},
    {"release_on", (PyCFunction)device_batch_release_on, METH_O,
     "the stream a callable gives at release is fenced before the memory is reused"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef device_batch_getset[] = {
    {"on_device", (getter)device_batch_on_device, NULL, "has a device copy", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DeviceBatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zbatch._zbatch._DeviceBatch",
    .tp_basicsize = sizeof(DeviceBatchObject),
    .tp_dealloc = (destructor)device_batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "one batch of a loader, in page-locked host memory and on the device",
    .tp_methods = device_batch_methods,
    .tp_getset = device_batch_getset,
};

PyObject *
zbpy_device_batch_new(zb_device_batch *db)
{
    DeviceBatchObject *o = PyObject_New(DeviceBatchObject, &DeviceBatchType);
    if (!o) {
        zb_device_batch_release(db);
        return NULL;
    }
    o->db = db;
    o->stream_of = NULL;
    return (PyObject *)o;
}

/* cuda_probe(library=None, device=0) -> None when usable, else the reason (a str) */
static PyObject *
cuda_probe(PyObject *module, PyObject *args)
{
    (void)module;
    const char *library = NULL;
    int device = 0;
    if (!PyArg_ParseTuple(args, "|zi", &library, &device)) return NULL;
    zb_cuda *c = NULL;
    zb_status st = zb_cuda_open(library, device, &c);
    zb_cuda_close(c);
    if (st == ZB_OK) Py_RETURN_NONE;
    return PyUnicode_FromString(zb_last_error());
}

static PyMethodDef module_methods[] = {
    {"cuda_probe", cuda_probe, METH_VARARGS, "why the CUDA runtime cannot be used, or None"},
    {NULL, NULL, 0, NULL},
};

int
zbpy_register_device(PyObject *module)
{
    if (PyType_Ready(&DeviceBatchType) < 0) return -1;
    Py_INCREF(&DeviceBatchType);
    if (PyModule_AddObject(module, "_DeviceBatch", (PyObject *)&DeviceBatchType) < 0) {
        Py_DECREF(&DeviceBatchType);
        return -1;
    }
    return PyModule_AddFunctions(module, module_methods);
}
