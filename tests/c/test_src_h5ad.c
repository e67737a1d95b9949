/* The .h5ad source shared by threads (source.h: every read may come from several threads at once
 * on the same source and matrix). The file is written here with libhdf5 in anndata's layout: a
 * CSR X whose data (deflate + shuffle), indices (deflate) and indptr (no filter) have different
 * chunk sizes, an obs dataframe with a string index and a deflated int32 column, a var index.
 * Row r of X holds r % 23 elements at columns (r * 7 + 13 k) % N_VARS (k < r % 23), values
 * r + k / 4. Threads read the whole matrix in blocks of different sizes, obs and var at once,
 * and must each see exactly that. Meant for the sanitizer builds too (ZB_SANITIZE). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/source.h"
#include "support/h5write.h"
#include "support/testutil.h"

#define N_OBS 5000
#define N_VARS 311
#define N_THREADS 6

static int64_t
row_nnz(int64_t r)
{
    return r % 23;
}

/* ---- writing the file ------------------------------------------------------------------------ */

static void
write_file(const char *path)
{
    int64_t *indptr = malloc((N_OBS + 1) * sizeof *indptr);
    indptr[0] = 0;
    for (int64_t r = 0; r < N_OBS; r++) indptr[r + 1] = indptr[r] + row_nnz(r);
    int64_t nnz = indptr[N_OBS];
    float *data = malloc((size_t)nnz * sizeof *data);
    int32_t *indices = malloc((size_t)nnz * sizeof *indices);
    int32_t *k = malloc(N_OBS * sizeof *k);
    for (int64_t r = 0; r < N_OBS; r++) {
        k[r] = (int32_t)(r * 3 - 7000);
        for (int64_t j = 0; j < row_nnz(r); j++) {
            indices[indptr[r] + j] = (int32_t)((r * 7 + 13 * j) % N_VARS);
            data[indptr[r] + j] = (float)r + (float)j / 4;
        }
    }
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(f >= 0);
    hid_t x = zbt_h5ad_csr_group(f, N_OBS, N_VARS);
    zbt_h5_array(x, "data", H5T_NATIVE_FLOAT, (hsize_t)nnz, data, 1000, true, true);
    zbt_h5_array(x, "indices", H5T_NATIVE_INT32, (hsize_t)nnz, indices, 777, false, true);
    zbt_h5_array(x, "indptr", H5T_NATIVE_INT64, N_OBS + 1, indptr, 500, false, false);
    H5Gclose(x);

    const char *cols[] = {"k"};
    hid_t obs = H5Gcreate2(f, "obs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    zbt_h5_text_attr(obs, "encoding-type", "dataframe");
    zbt_h5_text_attr(obs, "_index", "_index");
    zbt_h5_texts_attr(obs, "column-order", cols, 1);
    zbt_h5_names(obs, "cell", N_OBS);
    zbt_h5_array(obs, "k", H5T_NATIVE_INT32, N_OBS, k, 333, true, true);
    H5Gclose(obs);
    hid_t var = H5Gcreate2(f, "var", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    zbt_h5_text_attr(var, "encoding-type", "dataframe");
    zbt_h5_text_attr(var, "_index", "_index");
    zbt_h5_texts_attr(var, "column-order", cols, 0);
    zbt_h5_names(var, "gene", N_VARS);
    H5Gclose(var);
    H5Fclose(f);
    free(indptr);
    free(data);
    free(indices);
    free(k);
}

/* ---- reading from threads -------------------------------------------------------------------- */

typedef struct reader {
    zb__src *src;
    zb__src_matrix *x;
    uint64_t block;
    int errors;
    char first_error[256];
} reader;

static void
mismatch(reader *rd, const char *what, uint64_t at)
{
    if (rd->errors++ == 0)
        snprintf(rd->first_error, sizeof rd->first_error, "block %llu: %s at %llu: %s",
                 (unsigned long long)rd->block, what, (unsigned long long)at, zb_last_error());
}

static void
check_rows(reader *rd, uint64_t start, const zb__csr_block *b)
{
    const float *data = b->data;
    for (uint64_t i = 0; i < b->n_rows; i++) {
        int64_t r = (int64_t)(start + i);
        if (b->indptr[i + 1] - b->indptr[i] != row_nnz(r)) return mismatch(rd, "row length", r);
        for (int64_t j = 0; j < row_nnz(r); j++) {
            int64_t e = b->indptr[i] + j;
            if (b->indices[e] != (uint32_t)((r * 7 + 13 * j) % N_VARS) ||
                data[e] != (float)r + (float)j / 4)
                return mismatch(rd, "element", r);
        }
    }
}

static void *
read_all(void *arg)
{
    reader *rd = arg;
    zb__csr_block b = {0};
    zb__col_block c = {0};
    zb_strings names = {0};
    for (uint64_t start = 0; start < N_OBS; start += rd->block) {
        uint64_t stop = start + rd->block < N_OBS ? start + rd->block : N_OBS;
        if (zb__src_matrix_read(rd->x, start, stop, &b) != ZB_OK)
            mismatch(rd, "X read", start);
        else
            check_rows(rd, start, &b);
        if (zb__src_read_column(rd->src, 0, start, stop, &c) != ZB_OK) {
            mismatch(rd, "obs/k read", start);
        } else {
            for (uint64_t i = 0; i < c.n; i++)
                if (((const int32_t *)c.values)[i] != (int32_t)((start + i) * 3) - 7000)
                    mismatch(rd, "obs/k value", start + i);
        }
        if (zb__src_read_obs_names(rd->src, start, stop, &names) != ZB_OK) {
            mismatch(rd, "obs names read", start);
        } else {
            char want[32];
            snprintf(want, sizeof want, "cell%llu", (unsigned long long)start);
            if (names.n != stop - start || names.offsets[1] != strlen(want) ||
                memcmp(names.data, want, strlen(want)))
                mismatch(rd, "obs name", start);
        }
        zb_strings_free(&names);
    }
    if (zb__src_matrix_var_names(rd->x, &names) != ZB_OK || names.n != N_VARS)
        mismatch(rd, "var names", 0);
    zb_strings_free(&names);
    zb__csr_block_free(&b);
    zb__col_block_free(&c);
    return NULL;
}

static void
test_threads_share_one_source(void **state)
{
    (void)state;
    char path[1100];
    snprintf(path, sizeof path, "%s/shared.h5ad", zbt_tempdir("src_h5ad"));
    write_file(path);
    zb__src *src = NULL;
    zb__src_matrix *x = NULL;
    ZB_ASSERT_OK(zb__src_open(path, &src));
    assert_string_equal(src->c.format, "h5ad");
    assert_int_equal(src->c.n_obs, N_OBS);
    assert_int_equal(src->c.n_columns, 1);
    ZB_ASSERT_OK(zb__src_matrix_get(src, "X", &x));
    assert_int_equal(zb__src_matrix_info_of(x)->n_cols, N_VARS);

    static const uint64_t blocks[N_THREADS] = {1, 37, 500, 999, 1000, N_OBS};
    reader rd[N_THREADS];
    pthread_t tid[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        rd[t] = (reader){.src = src, .x = x, .block = blocks[t]};
        assert_int_equal(pthread_create(&tid[t], NULL, read_all, &rd[t]), 0);
    }
    for (int t = 0; t < N_THREADS; t++) pthread_join(tid[t], NULL);
    for (int t = 0; t < N_THREADS; t++)
        if (rd[t].errors)
            fail_msg("thread %d: %d errors, first: %s", t, rd[t].errors, rd[t].first_error);
    zb__src_close(src);
}

static void
test_open_errors(void **state)
{
    (void)state;
    zb__src *src = (zb__src *)1;
    const char *dir = zbt_tempdir("src_h5ad_err");
    char path[1100];
    snprintf(path, sizeof path, "%s/missing.h5ad", dir);
    ZB_ASSERT_ERR(zb__src_open_h5ad(path, &src), ZB_E_NOTFOUND, "missing.h5ad");
    assert_null(src);
    /* an HDF5 file without obs is not an AnnData file */
    snprintf(path, sizeof path, "%s/empty.h5", dir);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
    ZB_ASSERT_ERR(zb__src_open(path, &src), ZB_E_UNSUPPORTED, "no obs");
    assert_null(src);
    zb__src_close(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_share_one_source),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
