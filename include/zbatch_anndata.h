/* zbatch_anndata.h — part of the public C API (included by zbatch.h): the anndata layout writer.
 * Conventions, status codes and thread-safety rules are those of zbatch.h. */
#ifndef ZBATCH_ANNDATA_H
#define ZBATCH_ANNDATA_H

#include "zbatch.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
