/* placeholder */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_zbatch", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__zbatch(void);
PyMODINIT_FUNC
PyInit__zbatch(void)
{
    return PyModule_Create(&mod);
}
