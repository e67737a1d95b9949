/* The two halves of the .h5ad source: src_h5ad.c (the file, obs, names) and h5ad_matrix.c
 * (X, raw/X, layers/NAME). Internal to src/convert. */
#ifndef ZB_CONVERT_H5AD_H
#define ZB_CONVERT_H5AD_H

#include <hdf5.h>

#include "convert/source.h"

/* The matrix at `key` of the open file (n_obs: the rows every matrix must have; path names the
 * file in messages and must outlive the matrix). Source method matrix_open. */
zb_status zb__h5ad_matrix_open(hid_t file, const char *path, uint64_t n_obs, const char *key,
                               zb__src_matrix **out);

/* The `n` names of the dataframe at `frame` ("var", "raw/var"): its index (the child its `_index`
 * attribute names) as text, into a new *out. ZB_E_CORRUPT when the index does not hold n
 * names. Safe from any thread (takes the libhdf5 lock). */
zb_status zb__h5ad_frame_names(hid_t file, const char *path, const char *frame, uint64_t n,
                               zb_strings *out);

#endif
