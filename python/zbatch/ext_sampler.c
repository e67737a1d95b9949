/* Python bindings: samplers (zbatch_sampler.h). A _Sampler owns one zb_sampler; the classes in
 * zbatch/samplers.py wrap it. Ids cross as bytearrays of native uint64, which numpy views
 * without copying. */
#include <string.h>

#include "ext.h"
#include "ext_sampler.h"

typedef struct {
    PyObject_HEAD zb_sampler *s;
} SamplerObject;

static void
sampler_dealloc(SamplerObject *self)
{
    zb_sampler_free(self->s);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
sampler_next(SamplerObject *self, PyObject *unused)
{
    (void)unused;
    size_t cap = zb_sampler_max_batch(self->s), n = 0;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(cap * sizeof(uint64_t)));
    if (!out) return NULL;
    zb_status st = zb_sampler_next(self->s, (uint64_t *)PyByteArray_AS_STRING(out), cap, &n);
    if (st != ZB_OK) {
        Py_DECREF(out);
        return zbpy_raise(st, NULL);
    }
    if (n == 0) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (PyByteArray_Resize(out, (Py_ssize_t)(n * sizeof(uint64_t))) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *
sampler_num_batches(SamplerObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(zb_sampler_num_batches(self->s));
}

static PyObject *
sampler_remaining(SamplerObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(zb_sampler_remaining(self->s));
}

static PyObject *
sampler_epoch_batches(SamplerObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(zb_sampler_epoch_batches(self->s));
}

static PyObject *
sampler_max_batch(SamplerObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSize_t(zb_sampler_max_batch(self->s));
}

static PyObject *
sampler_length(SamplerObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(zb_sampler_len(self->s));
}

static PyObject *
sampler_set_epoch(SamplerObject *self, PyObject *arg)
{
    unsigned long long e = PyLong_AsUnsignedLongLong(arg);
    if (e == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    zb_status st = zb_sampler_set_epoch(self->s, e);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *
sampler_get_state(SamplerObject *self, PyObject *unused)
{
    (void)unused;
    zb_sampler_state st;
    zb_sampler_get_state(self->s, &st);
    return Py_BuildValue("(KKK)", (unsigned long long)st.seed, (unsigned long long)st.epoch,
                         (unsigned long long)st.position);
}

static PyObject *
sampler_restore(SamplerObject *self, PyObject *args)
{
    unsigned long long seed, epoch, position;
    if (!PyArg_ParseTuple(args, "O&O&O&", zbpy_u64, &seed, zbpy_u64, &epoch, zbpy_u64, &position))
        return NULL;
    zb_sampler_state state = {seed, epoch, position};
    zb_status st = zb_sampler_restore(self->s, &state);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    Py_RETURN_NONE;
}

static PyObject *
sampler_request_replacement(SamplerObject *self, PyObject *args)
{
    unsigned long long ra, re;
    if (!PyArg_ParseTuple(args, "O&O&", zbpy_u64, &ra, zbpy_u64, &re)) return NULL;
    uint64_t id = 0;
    bool found = false;
    zb_status st = zb_sampler_request_replacement(self->s, ra, re, &id, &found);
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    if (!found) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(id);
}

static PyObject *
sampler_child_counts(SamplerObject *self, PyObject *unused)
{
    (void)unused;
    size_t k = zb_sampler_child_counts(self->s, NULL, 0);
    PyObject *t = PyTuple_New((Py_ssize_t)k);
    if (!t || k == 0) return t;
    uint64_t *c = PyMem_Malloc(k * sizeof *c);
    if (!c) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    zb_sampler_child_counts(self->s, c, k);
    for (size_t i = 0; i < k; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(c[i]);
        if (!v) {
            PyMem_Free(c);
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, (Py_ssize_t)i, v);
    }
    PyMem_Free(c);
    return t;
}

static PyMethodDef sampler_methods[] = {
    {"next", (PyCFunction)sampler_next, METH_NOARGS,
     "next() -> bytearray of native uint64 ids, or None at the end of the epoch"},
    {"num_batches", (PyCFunction)sampler_num_batches, METH_NOARGS, "batches per epoch, rank"},
    {"remaining", (PyCFunction)sampler_remaining, METH_NOARGS, "batches left this epoch"},
    {"epoch_batches", (PyCFunction)sampler_epoch_batches, METH_NOARGS,
     "global batches of the epoch"},
    {"max_batch", (PyCFunction)sampler_max_batch, METH_NOARGS, "largest batch"},
    {"length", (PyCFunction)sampler_length, METH_NOARGS, "dataset length n"},
    {"set_epoch", (PyCFunction)sampler_set_epoch, METH_O, "set_epoch(epoch)"},
    {"get_state", (PyCFunction)sampler_get_state, METH_NOARGS, "(seed, epoch, position)"},
    {"restore", (PyCFunction)sampler_restore, METH_VARARGS, "restore(seed, epoch, position)"},
    {"request_replacement", (PyCFunction)sampler_request_replacement, METH_VARARGS,
     "request_replacement(room_atoms, room_edges) -> id or None"},
    {"child_counts", (PyCFunction)sampler_child_counts, METH_NOARGS,
     "samples per batch of each child (multi-dataset)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SamplerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zbatch._zbatch._Sampler",
    .tp_basicsize = sizeof(SamplerObject),
    .tp_dealloc = (destructor)sampler_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = sampler_methods,
    .tp_doc = "one C sampler (zb_sampler); see zbatch.samplers",
};

zb_sampler *
zbpy_sampler_ptr(PyObject *obj)
{
    if (obj && PyObject_TypeCheck(obj, &SamplerType)) return ((SamplerObject *)obj)->s;
    if (obj && PyObject_HasAttrString(obj, "_c")) {
        PyObject *c = PyObject_GetAttrString(obj, "_c");
        if (!c) return NULL;
        zb_sampler *s = PyObject_TypeCheck(c, &SamplerType) ? ((SamplerObject *)c)->s : NULL;
        Py_DECREF(c); /* obj keeps _c alive */
        if (s) return s;
    }
    PyErr_Format(PyExc_TypeError, "expected a zbatch sampler, got %s",
                 obj ? Py_TYPE(obj)->tp_name : "NULL");
    return NULL;
}

/* ---- constructors ---------------------------------------------------------------------------- */

/* A C-contiguous buffer of n 8-byte elements; `kinds` lists the acceptable struct format
 * letters. None leaves view->buf NULL. */
static int
get_array(PyObject *o, Py_buffer *view, const char *kinds, uint64_t n, const char *name)
{
    memset(view, 0, sizeof *view);
    if (o == Py_None) return 0;
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    while (*f == '<' || *f == '=' || *f == '@') f++;
    if (view->itemsize != 8 || strlen(f) != 1 || !strchr(kinds, *f)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a contiguous array of 8-byte '%s' items, "
                     "got format '%s'",
                     name, kinds, view->format ? view->format : "B");
        goto fail;
    }
    if ((uint64_t)view->len != n * 8) {
        PyErr_Format(PyExc_ValueError, "%s: expected %llu items, got %lld", name,
                     (unsigned long long)n, (long long)(view->len / 8));
        goto fail;
    }
    return 0;
fail:
    PyBuffer_Release(view);
    memset(view, 0, sizeof *view);
    return -1;
}

static void
release(Py_buffer *v)
{
    if (v->obj) PyBuffer_Release(v);
}

static PyObject *
wrap(zb_status st, zb_sampler *s)
{
    if (st != ZB_OK) return zbpy_raise(st, NULL);
    SamplerObject *o = PyObject_New(SamplerObject, &SamplerType);
    if (!o) {
        zb_sampler_free(s);
        return NULL;
    }
    o->s = s;
    return (PyObject *)o;
}

#define BASE_KW "n", "batch_size", "drop_last", "seed", "rank", "world_size", "drop"
#define BASE_FMT "O&O&pO&O&O&p"
#define BASE_ARGS                                                                                  \
    zbpy_u64, &n, zbpy_u64, &b, &drop_last, zbpy_u64, &seed, zbpy_u32, &rank, zbpy_u32, &world,    \
        &drop

static void
fill_base(zb_sampler_opts *o, unsigned long long n, unsigned long long b, int drop_last,
          unsigned long long seed, unsigned int rank, unsigned int world, int drop)
{
    o->n = n;
    o->batch_size = b;
    o->drop_last = drop_last != 0;
    o->seed = seed;
    o->rank = rank;
    o->world_size = world;
    o->pad_or_drop = drop ? ZB_SAMPLER_DROP : ZB_SAMPLER_PAD;
}

static PyObject *
py_sampler_stream(PyObject *args, PyObject *kw, int random)
{
    static char *kws[] = {BASE_KW, NULL};
    unsigned long long n, b, seed;
    unsigned int rank, world;
    int drop_last, drop;
    if (!PyArg_ParseTupleAndKeywords(args, kw, BASE_FMT, kws, BASE_ARGS)) return NULL;
    zb_sampler_opts o = ZB_SAMPLER_OPTS_DEFAULT;
    fill_base(&o, n, b, drop_last, seed, rank, world, drop);
    zb_sampler *s = NULL;
    zb_status st = random ? zb_sampler_new_random(&o, &s) : zb_sampler_new_sequential(&o, &s);
    return wrap(st, s);
}

static PyObject *
py_sampler_sequential(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    return py_sampler_stream(args, kw, 0);
}

static PyObject *
py_sampler_random(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    return py_sampler_stream(args, kw, 1);
}

static PyObject *
py_sampler_block(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kws[] = {BASE_KW, "block_size", "blocks_per_window", NULL};
    unsigned long long n, b, seed, bs, bpw;
    unsigned int rank, world;
    int drop_last, drop;
    if (!PyArg_ParseTupleAndKeywords(args, kw, BASE_FMT "O&O&", kws, BASE_ARGS, zbpy_u64, &bs,
                                     zbpy_u64, &bpw))
        return NULL;
    zb_block_sampler_opts o = ZB_BLOCK_SAMPLER_OPTS_DEFAULT;
    fill_base(&o.base, n, b, drop_last, seed, rank, world, drop);
    o.block_size = bs;
    o.blocks_per_window = bpw;
    zb_sampler *s = NULL;
    zb_status st = zb_sampler_new_block(&o, &s);
    return wrap(st, s);
}

static PyObject *
py_sampler_weighted(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kws[] = {BASE_KW,       "weights",    "class_codes", "class_weights",
                          "num_samples", "block_size", "block_draws", NULL};
    unsigned long long n, b, seed, num_samples, bs, draws;
    unsigned int rank, world;
    int drop_last, drop;
    PyObject *wo, *co, *cwo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, BASE_FMT "OOOO&O&O&", kws, BASE_ARGS, &wo, &co, &cwo,
                                     zbpy_u64, &num_samples, zbpy_u64, &bs, zbpy_u64, &draws))
        return NULL;
    Py_buffer w, c, cw;
    memset(&c, 0, sizeof c);
    memset(&cw, 0, sizeof cw);
    if (get_array(wo, &w, "d", n, "weights") < 0) return NULL;
    if (get_array(co, &c, "lq", n, "class_codes") < 0) goto fail;
    if (cwo != Py_None) {
        Py_ssize_t k = PyObject_Length(cwo);
        if (k < 0 || get_array(cwo, &cw, "d", (uint64_t)k, "class_weights") < 0) goto fail;
    }
    zb_weighted_sampler_opts o = ZB_WEIGHTED_SAMPLER_OPTS_DEFAULT;
    fill_base(&o.base, n, b, drop_last, seed, rank, world, drop);
    o.weights = w.buf;
    o.class_codes = c.buf;
    o.class_weights = cw.buf;
    o.num_class_weights = cw.buf ? (size_t)(cw.len / 8) : 0;
    o.num_samples = num_samples;
    o.block_size = bs;
    o.block_draws = draws;
    zb_sampler *s = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_sampler_new_weighted(&o, &s);
    Py_END_ALLOW_THREADS
    release(&w);
    release(&c);
    release(&cw);
    return wrap(st, s);
fail:
    release(&w);
    release(&c);
    release(&cw);
    return NULL;
}

static PyObject *
py_sampler_size_aware(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kws[] = {BASE_KW,   "num_atoms",   "max_atoms", "num_edges",  "max_edges", "nnz",
                          "max_nnz", "window_size", "shuffle",   "block_size", NULL};
    unsigned long long n, b, seed, ma, me, mn, window, block = 0;
    unsigned int rank, world;
    int drop_last, drop, shuffle;
    PyObject *ao, *eo, *no;
    if (!PyArg_ParseTupleAndKeywords(args, kw, BASE_FMT "OO&OO&OO&O&p|O&", kws, BASE_ARGS, &ao,
                                     zbpy_u64, &ma, &eo, zbpy_u64, &me, &no, zbpy_u64, &mn,
                                     zbpy_u64, &window, &shuffle, zbpy_u64, &block))
        return NULL;
    Py_buffer a, e, z;
    memset(&e, 0, sizeof e);
    memset(&z, 0, sizeof z);
    if (get_array(ao, &a, "LQ", n, "num_atoms") < 0) return NULL;
    if (get_array(eo, &e, "LQ", n, "num_edges") < 0 || get_array(no, &z, "LQ", n, "nnz") < 0) {
        release(&a);
        release(&e);
        return NULL;
    }
    zb_size_sampler_opts o = ZB_SIZE_SAMPLER_OPTS_DEFAULT;
    fill_base(&o.base, n, b, drop_last, seed, rank, world, drop);
    o.num_atoms = a.buf;
    o.max_atoms = ma;
    o.num_edges = e.buf;
    o.max_edges = me;
    o.nnz = z.buf;
    o.max_nnz = mn;
    o.window_size = window;
    o.shuffle = shuffle != 0;
    o.block_size = block;
    zb_sampler *s = NULL;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_sampler_new_size_aware(&o, &s);
    Py_END_ALLOW_THREADS
    release(&a);
    release(&e);
    release(&z);
    return wrap(st, s);
}

static PyObject *
py_sampler_multi(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kws[] = {BASE_KW,       "child_sizes", "per_sample",   "counts",
                          "ratios",      "balanced",    "epoch_policy", "num_batches",
                          "num_samples", "replacement", "shuffle",      NULL};
    unsigned long long n, b, seed, num_batches, num_samples;
    unsigned int rank, world;
    int drop_last, drop, per_sample, balanced, policy, replacement, shuffle;
    PyObject *so, *co, *ro;
    if (!PyArg_ParseTupleAndKeywords(args, kw, BASE_FMT "OpOOpiO&O&pp", kws, BASE_ARGS, &so,
                                     &per_sample, &co, &ro, &balanced, &policy, zbpy_u64,
                                     &num_batches, zbpy_u64, &num_samples, &replacement, &shuffle))
        return NULL;
    Py_ssize_t k = PyObject_Length(so);
    if (k < 0) return NULL;
    Py_buffer sz, c, r;
    memset(&c, 0, sizeof c);
    memset(&r, 0, sizeof r);
    if (get_array(so, &sz, "LQ", (uint64_t)k, "child_sizes") < 0) return NULL;
    if (get_array(co, &c, "LQ", (uint64_t)k, "counts") < 0 ||
        get_array(ro, &r, "d", (uint64_t)k, "ratios") < 0) {
        release(&sz);
        release(&c);
        return NULL;
    }
    zb_multi_sampler_opts o = ZB_MULTI_SAMPLER_OPTS_DEFAULT;
    fill_base(&o.base, n, b, drop_last, seed, rank, world, drop);
    o.num_children = (size_t)k;
    o.child_sizes = sz.buf;
    o.mode = per_sample ? ZB_MULTI_SAMPLE : ZB_MULTI_BATCH;
    o.counts = c.buf;
    o.ratios = r.buf;
    o.balanced = balanced != 0;
    o.epoch_policy = (zb_epoch_policy)policy;
    o.num_batches = num_batches;
    o.num_samples = num_samples;
    o.replacement = replacement != 0;
    o.shuffle = shuffle != 0;
    zb_sampler *s = NULL;
    zb_status st = zb_sampler_new_multi(&o, &s);
    release(&sz);
    release(&c);
    release(&r);
    return wrap(st, s);
}

static PyMethodDef sampler_module_methods[] = {
    {"sampler_sequential", (PyCFunction)(void (*)(void))py_sampler_sequential,
     METH_VARARGS | METH_KEYWORDS, "a sequential _Sampler"},
    {"sampler_random", (PyCFunction)(void (*)(void))py_sampler_random, METH_VARARGS | METH_KEYWORDS,
     "a random _Sampler"},
    {"sampler_block", (PyCFunction)(void (*)(void))py_sampler_block, METH_VARARGS | METH_KEYWORDS,
     "a block _Sampler"},
    {"sampler_weighted", (PyCFunction)(void (*)(void))py_sampler_weighted,
     METH_VARARGS | METH_KEYWORDS, "a weighted _Sampler"},
    {"sampler_size_aware", (PyCFunction)(void (*)(void))py_sampler_size_aware,
     METH_VARARGS | METH_KEYWORDS, "a size-aware _Sampler"},
    {"sampler_multi", (PyCFunction)(void (*)(void))py_sampler_multi, METH_VARARGS | METH_KEYWORDS,
     "a multi-dataset _Sampler"},
    {NULL, NULL, 0, NULL},
};

int
zbpy_register_sampler(PyObject *module)
{
    if (PyType_Ready(&SamplerType) < 0) return -1;
    Py_INCREF(&SamplerType);
    if (PyModule_AddObject(module, "_Sampler", (PyObject *)&SamplerType) < 0) {
        Py_DECREF(&SamplerType);
        return -1;
    }
    return PyModule_AddFunctions(module, sampler_module_methods);
}
