/* Writing .h5ad files with libhdf5 (h5write.h). */
#include "support/h5write.h"

#include <stdio.h>
#include <stdlib.h>

#include "support/testutil.h"

hid_t
zbt_h5_vlen_str(void)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    return t;
}

void
zbt_h5_text_attr(hid_t obj, const char *name, const char *value)
{
    hid_t t = zbt_h5_vlen_str(), s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(a >= 0 && H5Awrite(a, t, &value) >= 0);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
}

void
zbt_h5_texts_attr(hid_t obj, const char *name, const char **values, hsize_t n)
{
    hid_t t = zbt_h5_vlen_str(), s = H5Screate_simple(1, &n, NULL);
    hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(a >= 0 && H5Awrite(a, t, values) >= 0);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
}

void
zbt_h5_array(hid_t loc, const char *name, hid_t type, hsize_t n, const void *data, hsize_t chunk,
             bool shuffle, bool deflate)
{
    hid_t s = H5Screate_simple(1, &n, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (chunk) {
        H5Pset_chunk(dcpl, 1, &chunk);
        if (shuffle) H5Pset_shuffle(dcpl);
        if (deflate) H5Pset_deflate(dcpl, 4);
    }
    hid_t d = H5Dcreate2(loc, name, type, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    assert_true(d >= 0 && H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(s);
}

void
zbt_h5_names(hid_t g, const char *prefix, int n)
{
    char **names = malloc((size_t)n * sizeof *names);
    for (int i = 0; i < n; i++) {
        names[i] = malloc(32);
        snprintf(names[i], 32, "%s%d", prefix, i);
    }
    hid_t t = zbt_h5_vlen_str();
    zbt_h5_array(g, "_index", t, (hsize_t)n, names, n < 1000 ? (hsize_t)n : 1000, false, true);
    H5Tclose(t);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* A dataframe group with only its index. */
static void
names_frame(hid_t f, const char *group, const char *prefix, int n)
{
    hid_t g = H5Gcreate2(f, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(g >= 0);
    zbt_h5_text_attr(g, "encoding-type", "dataframe");
    zbt_h5_text_attr(g, "encoding-version", "0.2.0");
    zbt_h5_text_attr(g, "_index", "_index");
    const char *none[1] = {""}; /* libhdf5 wants a buffer even for no values */
    zbt_h5_texts_attr(g, "column-order", none, 0);
    zbt_h5_names(g, prefix, n);
    H5Gclose(g);
}

hid_t
zbt_h5ad_csr_group(hid_t f, int64_t n_obs, int64_t n_vars)
{
    hid_t x = H5Gcreate2(f, "X", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(x >= 0);
    zbt_h5_text_attr(x, "encoding-type", "csr_matrix");
    zbt_h5_text_attr(x, "encoding-version", "0.1.0");
    int64_t shape[2] = {n_obs, n_vars};
    hsize_t two = 2;
    hid_t s = H5Screate_simple(1, &two, NULL);
    hid_t a = H5Acreate2(x, "shape", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, shape) >= 0);
    H5Aclose(a);
    H5Sclose(s);
    return x;
}

void
zbt_h5ad_write_csr(const char *path, int n_obs, int n_vars, const int64_t *indptr,
                   const int32_t *indices, const float *data)
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(f >= 0);
    hid_t x = zbt_h5ad_csr_group(f, n_obs, n_vars);
    hsize_t nnz = (hsize_t)indptr[n_obs];
    zbt_h5_array(x, "data", H5T_NATIVE_FLOAT, nnz, data, 0, false, false);
    zbt_h5_array(x, "indices", H5T_NATIVE_INT32, nnz, indices, 0, false, false);
    zbt_h5_array(x, "indptr", H5T_NATIVE_INT64, (hsize_t)n_obs + 1, indptr, 0, false, false);
    H5Gclose(x);
    names_frame(f, "obs", "cell", n_obs);
    names_frame(f, "var", "gene", n_vars);
    H5Fclose(f);
}
