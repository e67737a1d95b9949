/* Python bindings: zbatch convert (include/zbatch_convert.h). Options come as a dict whose keys
 * are zb_convert_opts' fields; the GIL is released while C works, and re-taken only to call
 * the progress callable. Each call opens what it needs and closes it: a Dask task gets the
 * output directory, a phase and a task number, and finds the plan there. */
#include <stdlib.h>
#include <string.h>

#include "ext.h"

/* Borrowed C strings of a list of str (valid while `list` lives). */
static const char **
string_list(PyObject *list, size_t *n, const char *what)
{
    PyObject *seq = PySequence_Fast(list, what);
    if (!seq) return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    const char **out = calloc((size_t)len + 1, sizeof *out);
    if (!out) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        out[i] = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
        if (!out[i]) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s must be a list of str", what);
            free(out);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq); /* the items stay alive in `list` */
    *n = (size_t)len;
    return out;
}

typedef struct parsed {
    zb_convert_opts o;
    zb_remote_opts remote; /* strings borrowed from the options dict */
    const char **inputs, **obs, **layers;
    size_t n_inputs;
} parsed;

static void
parsed_free(parsed *p)
{
    free(p->inputs);
    free(p->obs);
    free(p->layers);
}

static int
get_u64(PyObject *d, const char *key, uint64_t *out)
{
    PyObject *v = PyDict_GetItemString(d, key);
    if (!v || v == Py_None) return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

static const char *
get_str(PyObject *d, const char *key)
{
    PyObject *v = PyDict_GetItemString(d, key);
    return v && v != Py_None && PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
}

/* inputs: list[str]; opts: dict with dataset_size, var_join ("outer"/"inner"), genes (path),
 * obs (list or None), x, layers (list), memory_bytes, seed, shuffle, zarr_format, codec,
 * x_chunk, x_shard (0 = default, -1 = unsharded), num_threads, data_dtype ("auto", "keep",
 * "uint8", "uint16", "float32"; checked by the caller), index_dtype ("auto", "int32",
 * "narrow"), work_dir (str or None), input_mmap_bytes (int or None), scratch_path and
 * buffered_output (bool; absent: false), remote (the dict of zbatch._remote.remote_options, or
 * None). */
static int
parse(PyObject *inputs, PyObject *opts, parsed *p)
{
    memset(p, 0, sizeof *p);
    zb_convert_opts d = ZB_CONVERT_OPTS_DEFAULT;
    p->o = d;
    if (!PyDict_Check(opts)) {
        PyErr_SetString(PyExc_TypeError, "options must be a dict");
        return -1;
    }
    if (!(p->inputs = string_list(inputs, &p->n_inputs, "inputs"))) return -1;
    uint64_t v = 0;
    if (get_u64(opts, "dataset_size", &p->o.dataset_size) < 0 ||
        get_u64(opts, "memory_bytes", &p->o.memory_bytes) < 0 ||
        get_u64(opts, "seed", &p->o.seed) < 0 || get_u64(opts, "x_chunk", &p->o.x_chunk) < 0)
        return -1;
    PyObject *shard = PyDict_GetItemString(opts, "x_shard");
    if (shard && shard != Py_None) {
        long long s = PyLong_AsLongLong(shard);
        if (PyErr_Occurred()) return -1;
        p->o.x_shard = s < 0 ? UINT64_MAX : (uint64_t)s;
    }
    v = 3;
    if (get_u64(opts, "zarr_format", &v) < 0) return -1;
    p->o.zarr_format = (int)v;
    v = 0;
    if (get_u64(opts, "num_threads", &v) < 0) return -1;
    p->o.num_threads = (int)v;
    const char *join = get_str(opts, "var_join");
    p->o.var_join = join && !strcmp(join, "inner") ? ZB_VAR_INNER : ZB_VAR_OUTER;
    p->o.genes = get_str(opts, "genes");
    p->o.x_key = get_str(opts, "x");
    p->o.codec = get_str(opts, "codec");
    static const char *const data_names[] = {"auto", "keep", "uint8", "uint16", "float32"};
    static const char *const index_names[] = {"auto", "int32", "narrow"};
    const char *data = get_str(opts, "data_dtype"), *index = get_str(opts, "index_dtype");
    for (int i = 0; data && i < 5; i++)
        if (!strcmp(data, data_names[i])) p->o.data_dtype = (zb_convert_data_dtype)i;
    for (int i = 0; index && i < 3; i++)
        if (!strcmp(index, index_names[i])) p->o.index_dtype = (zb_convert_index_dtype)i;
    PyObject *sh = PyDict_GetItemString(opts, "shuffle");
    p->o.shuffle = !sh || PyObject_IsTrue(sh);
    PyObject *scratch = PyDict_GetItemString(opts, "scratch_path");
    p->o.scratch_path = scratch && PyObject_IsTrue(scratch);
    PyObject *buffered = PyDict_GetItemString(opts, "buffered_output");
    p->o.buffered_output = buffered && PyObject_IsTrue(buffered);
    PyObject *obs = PyDict_GetItemString(opts, "obs");
    if (obs && obs != Py_None) {
        if (!(p->obs = string_list(obs, &p->o.n_obs, "obs"))) return -1;
        p->o.obs = p->obs;
    }
    if (get_u64(opts, "input_mmap_bytes", &p->o.input_mmap_bytes) < 0) return -1;
    p->o.work_dir = get_str(opts, "work_dir");
    PyObject *remote = PyDict_GetItemString(opts, "remote");
    if (remote && remote != Py_None) {
        if (zbpy_remote_opts(remote, &p->remote) < 0) return -1;
        p->o.remote = &p->remote;
    }
    PyObject *layers = PyDict_GetItemString(opts, "layers");
    if (layers && layers != Py_None) {
        if (!(p->layers = string_list(layers, &p->o.n_layers, "layers"))) return -1;
        p->o.layers = p->layers;
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* The (inputs, output, opts) arguments every call but convert_task takes; -1 with an exception
 * set (p freed) on failure. */
static int
parse_args(PyObject *args, const char **output, parsed *p)
{
    PyObject *inputs, *opts;
    if (!PyArg_ParseTuple(args, "OsO", &inputs, output, &opts)) return -1;
    if (parse(inputs, opts, p) < 0) {
        parsed_free(p);
        return -1;
    }
    return 0;
}

static void
call_progress(void *ctx, const zb_convert_progress *p)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(
        (PyObject *)ctx, "iKKKKKK", (int)p->phase, (unsigned long long)p->tasks_done,
        (unsigned long long)p->tasks_total, (unsigned long long)p->cells_done,
        (unsigned long long)p->cells_total, (unsigned long long)p->bytes_done,
        (unsigned long long)p->bytes_total);
    if (!r)
        PyErr_WriteUnraisable((PyObject *)ctx); /* a broken progress bar must not stop the job */
    Py_XDECREF(r);
    PyGILState_Release(g);
}

/* convert_run(inputs, output, opts, progress or None) */
static PyObject *
py_convert_run(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *inputs, *opts, *progress;
    const char *output;
    if (!PyArg_ParseTuple(args, "OsOO", &inputs, &output, &opts, &progress)) return NULL;
    parsed p;
    if (parse(inputs, opts, &p) < 0) {
        parsed_free(&p);
        return NULL;
    }
    if (progress != Py_None) {
        p.o.progress = call_progress;
        p.o.progress_ctx = progress;
    }
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_convert_run(p.inputs, p.n_inputs, output, &p.o);
    Py_END_ALLOW_THREADS
    parsed_free(&p);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* convert_plan(inputs, output, opts) -> {"tasks": [prepare, scatter, gather], "n_cells",
 * "n_genes", "n_datasets", "work_dir", "bytes": [per task, per phase]} */
static PyObject *
py_convert_plan(PyObject *self, PyObject *args)
{
    (void)self;
    const char *output;
    parsed p;
    if (parse_args(args, &output, &p) < 0) return NULL;
    zb_convert *cv = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_convert_plan(p.inputs, p.n_inputs, output, &p.o, &cv);
    Py_END_ALLOW_THREADS
    parsed_free(&p);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    zb_convert_info info;
    zb_convert_get_info(cv, &info);
    PyObject *out = Py_BuildValue(
        "{s:(nnn),s:K,s:K,s:K,s:s}", "tasks", (Py_ssize_t)zb_convert_ntasks(cv, ZB_CONVERT_PREPARE),
        (Py_ssize_t)zb_convert_ntasks(cv, ZB_CONVERT_SCATTER),
        (Py_ssize_t)zb_convert_ntasks(cv, ZB_CONVERT_GATHER), "n_cells",
        (unsigned long long)info.n_cells, "n_genes", (unsigned long long)info.n_genes, "n_datasets",
        (unsigned long long)info.n_datasets, "work_dir", info.work_dir ? info.work_dir : "");
    zb_convert_close(cv);
    return out;
}

/* convert_task(output, phase, i, num_threads, memory_bytes, input_mmap_bytes=None,
 * buffered_output=False) -> bool (False: it had finished) */
static PyObject *
py_convert_task(PyObject *self, PyObject *args)
{
    (void)self;
    const char *output;
    int phase, threads;
    Py_ssize_t i;
    unsigned long long memory, mapped = ZB_STORE_DEFAULT_MMAP_BYTES;
    PyObject *mapped_arg = Py_None;
    int buffered = 0;
    if (!PyArg_ParseTuple(args, "siniO&|Op", &output, &phase, &i, &threads, zbpy_u64, &memory,
                          &mapped_arg, &buffered))
        return NULL;
    if (mapped_arg != Py_None && !zbpy_u64(mapped_arg, &mapped)) return NULL;
    if (phase < 0 || phase >= ZB_CONVERT_PHASES_ || i < 0)
        return zbpy_raise(ZB_E_INVALID, "convert_task: no such phase or task");
    zb_convert *cv = NULL;
    bool ran = false;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_convert_open(output, &cv);
    if (st == ZB_OK) {
        zb_convert_set_task_memory(cv, memory);
        zb_convert_set_input_mmap_bytes(cv, mapped);
        st = zb_convert_set_buffered_output(cv, buffered);
    }
    if (st == ZB_OK) {
        ran = !zb_convert_task_done(cv, (zb_convert_phase)phase, (size_t)i);
        st = zb_convert_run_task(cv, (zb_convert_phase)phase, (size_t)i, threads);
    }
    zb_convert_close(cv);
    Py_END_ALLOW_THREADS
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    return PyBool_FromLong(ran);
}

/* convert_finish(inputs, output, opts): the plan (or the finished collection) found again,
 * then finished or verified. */
static PyObject *
py_convert_finish(PyObject *self, PyObject *args)
{
    (void)self;
    const char *output;
    parsed p;
    if (parse_args(args, &output, &p) < 0) return NULL;
    zb_convert *cv = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_convert_plan(p.inputs, p.n_inputs, output, &p.o, &cv);
    if (st == ZB_OK) st = zb_convert_finish(cv);
    zb_convert_close(cv);
    Py_END_ALLOW_THREADS
    parsed_free(&p);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

/* convert_limit(inputs, output, opts) -> dict */
static PyObject *
py_convert_limit(PyObject *self, PyObject *args)
{
    (void)self;
    const char *output;
    parsed p;
    if (parse_args(args, &output, &p) < 0) return NULL;
    zb_convert_limit l;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_convert_measure_limit(p.inputs, p.n_inputs, output, &p.o, &l);
    Py_END_ALLOW_THREADS
    parsed_free(&p);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    return Py_BuildValue("{s:d,s:d,s:K,s:K,s:K}", "read_s", l.read_s, "compress_s", l.compress_s,
                         "cells", (unsigned long long)l.cells, "input_bytes",
                         (unsigned long long)l.input_bytes, "output_bytes",
                         (unsigned long long)l.output_bytes);
}

/* convert_default_work_dir(output, tmpdir) -> str */
static PyObject *
py_default_work_dir(PyObject *self, PyObject *args)
{
    (void)self;
    const char *output, *tmpdir;
    if (!PyArg_ParseTuple(args, "ss", &output, &tmpdir)) return NULL;
    char buf[4096];
    zb_status st = zb_convert_default_work_dir(output, tmpdir, buf, sizeof buf);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    return PyUnicode_FromString(buf);
}

static PyMethodDef methods[] = {
    {"convert_default_work_dir", py_default_work_dir, METH_VARARGS,
     "convert_default_work_dir(output, tmpdir) -> str"},
    {"convert_run", py_convert_run, METH_VARARGS, "convert_run(inputs, output, opts, progress)"},
    {"convert_plan", py_convert_plan, METH_VARARGS, "convert_plan(inputs, output, opts) -> dict"},
    {"convert_task", py_convert_task, METH_VARARGS,
     "convert_task(output, phase, i, num_threads, memory_bytes, input_mmap_bytes=None, "
     "buffered_output=False) -> bool"},
    {"convert_finish", py_convert_finish, METH_VARARGS, "convert_finish(inputs, output, opts)"},
    {"convert_limit", py_convert_limit, METH_VARARGS,
     "convert_limit(inputs, output, opts) -> dict"},
    {NULL, NULL, 0, NULL},
};

int
zbpy_register_convert(PyObject *module)
{
    return PyModule_AddFunctions(module, methods);
}
