/* Python bindings: anndata (functions are added by zbpy_register_anndata). */
#include "ext.h"

int
zbpy_register_anndata(PyObject *module)
{
    (void)module;
    return 0;
}
