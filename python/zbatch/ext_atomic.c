/* Python bindings: atomic (functions are added by zbpy_register_atomic). */
#include "ext.h"

int
zbpy_register_atomic(PyObject *module)
{
    (void)module;
    return 0;
}
