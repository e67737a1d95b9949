/* zbatch_atomic.h — part of the public C API (included by zbatch.h): the atomic layout writer.
 * Conventions, status codes and thread-safety rules are those of zbatch.h. */
#ifndef ZBATCH_ATOMIC_H
#define ZBATCH_ATOMIC_H

#include "zbatch.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
