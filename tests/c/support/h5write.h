/* Writing .h5ad files with libhdf5 in anndata's layout, for the tests of the h5ad source and of
 * the conversion. Every call asserts its own success (cmocka). */
#ifndef ZB_TEST_H5WRITE_H
#define ZB_TEST_H5WRITE_H

#include <hdf5.h>
#include <stdbool.h>
#include <stdint.h>

/* A variable-length UTF-8 string type (closed by the caller). */
hid_t zbt_h5_vlen_str(void);

/* A scalar string attribute. */
void zbt_h5_text_attr(hid_t obj, const char *name, const char *value);

/* A 1-d string attribute of n values. */
void zbt_h5_texts_attr(hid_t obj, const char *name, const char **values, hsize_t n);

/* A 1-d dataset of n elements of `type`; chunk 0 = contiguous (the filters need chunks). */
void zbt_h5_array(hid_t loc, const char *name, hid_t type, hsize_t n, const void *data,
                  hsize_t chunk, bool shuffle, bool deflate);

/* A dataframe's string index `_index`: PREFIX0, PREFIX1, ... (deflated chunks). */
void zbt_h5_names(hid_t g, const char *prefix, int n);

/* The group `X` of file f as anndata's CSR matrix [n_obs, n_vars]: encoding attributes and
 * shape, no arrays yet (closed by the caller). */
hid_t zbt_h5ad_csr_group(hid_t f, int64_t n_obs, int64_t n_vars);

/* An .h5ad of a CSR X [n_obs, n_vars] (float32 data, int32 indices, int64 indptr; contiguous,
 * unfiltered: the conversion's direct path reads its rows in place), obs names cellI, var
 * names geneJ, no other column. */
void zbt_h5ad_write_csr(const char *path, int n_obs, int n_vars, const int64_t *indptr,
                        const int32_t *indices, const float *data);

#endif
