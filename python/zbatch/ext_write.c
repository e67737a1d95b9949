/* Python bindings: write (functions are added by zbpy_register_write). */
#include "ext.h"

int
zbpy_register_write(PyObject *module)
{
    (void)module;
    return 0;
}
