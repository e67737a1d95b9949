/* Python bindings: neighbour lists (zb_neighbor_list_build; include/zbatch_neighbors.h).
 * python/zbatch/_neighbors.py checks and converts the arguments and wraps the results as numpy
 * arrays. */
#include <string.h>

#include "ext.h"

/* A float64 buffer of exactly `n` values. */
static int
f64_buffer(PyObject *o, Py_buffer *b, Py_ssize_t n, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (b->len != n * (Py_ssize_t)sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd float64 values, got %zd bytes", what, n,
                     b->len);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* The list as three new bytearrays (int64: i [E], j [E], S [E*3]). The copies, which fault in
 * fresh pages (tens of milliseconds for millions of pairs), run without the GIL: nothing else
 * holds the new objects yet. */
static PyObject *
copy_out(const zb_neighbor_list *nl)
{
    uint64_t n = nl->n_pairs;
    PyObject *i = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * 8));
    PyObject *j = i ? PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * 8)) : NULL;
    PyObject *s = j ? PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * 24)) : NULL;
    PyObject *out = s ? PyTuple_Pack(3, i, j, s) : NULL;
    if (out && n) {
        char *di = PyByteArray_AS_STRING(i), *dj = PyByteArray_AS_STRING(j);
        char *ds = PyByteArray_AS_STRING(s);
        Py_BEGIN_ALLOW_THREADS
        memcpy(di, nl->i, (size_t)n * 8);
        memcpy(dj, nl->j, (size_t)n * 8);
        memcpy(ds, nl->cell_shifts, (size_t)n * 24);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(i);
    Py_XDECREF(j);
    Py_XDECREF(s);
    return out;
}

/* neighbor_list(positions, n_atoms, cell, pbc0, pbc1, pbc2, cutoff, max_pairs)
 *   -> (i, j, S) as bytearrays of int64 ([E], [E], [E*3])
 * positions: float64 buffer [n_atoms*3]; cell: float64 buffer [9] */
static PyObject *
py_neighbor_list(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *pos_obj, *cell_obj;
    unsigned long long n, max_pairs;
    int p0, p1, p2;
    double cutoff;
    if (!PyArg_ParseTuple(args, "OO&OpppdO&", &pos_obj, zbpy_u64, &n, &cell_obj, &p0, &p1, &p2,
                          &cutoff, zbpy_u64, &max_pairs))
        return NULL;
    if (n > (unsigned long long)(PY_SSIZE_T_MAX / 24)) {
        PyErr_SetString(PyExc_OverflowError, "too many atoms");
        return NULL;
    }
    Py_buffer pos, cell;
    if (f64_buffer(pos_obj, &pos, (Py_ssize_t)(3 * n), "positions") < 0) return NULL;
    if (f64_buffer(cell_obj, &cell, 9, "cell") < 0) {
        PyBuffer_Release(&pos);
        return NULL;
    }
    zb_structure s = {n, n ? pos.buf : NULL, cell.buf, {p0 != 0, p1 != 0, p2 != 0}};
    zb_neighbor_list nl = ZB_NEIGHBOR_LIST_INIT;
    zb_status st;
    Py_BEGIN_ALLOW_THREADS
    st = zb_neighbor_list_build(&s, cutoff, max_pairs, &nl);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&pos);
    PyBuffer_Release(&cell);
    PyObject *result = st == ZB_OK ? copy_out(&nl) : zbpy_raise(st, NULL);
    zb_neighbor_list_free(&nl);
    return result;
}

static PyMethodDef neighbor_methods[] = {
    {"neighbor_list", py_neighbor_list, METH_VARARGS,
     "neighbor_list(positions, n_atoms, cell, pbc0, pbc1, pbc2, cutoff, max_pairs) -> (i, j, S)"},
    {NULL, NULL, 0, NULL},
};

int
zbpy_register_neighbors(PyObject *module)
{
    return PyModule_AddFunctions(module, neighbor_methods);
}
