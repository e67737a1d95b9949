/* The anndata Zarr conversion source (src/convert/src_zarr.c) on stores written by zbatch's
 * anndata writer, whose every value follows from a formula: matrix blocks, stored pointers, obs
 * columns and names read back as written, and many threads reading one source at once (each
 * read borrows its own codec context) see the same values as one thread. Stores from anndata
 * itself, corrupt stores and anndata 0.7's encoding are tested in
 * tests/python/test_convert_zarr_source.py. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/source.h"
#include "support/testutil.h"
#include "zbatch_anndata.h"

enum { NOBS = 3000, NVARS = 200, NCATS = 3, THREADS = 6, ROUNDS = 150 };

/* Row r holds r % 9 elements: column (r * 7 + 13 * k) % NVARS holds r + k / 2 (k < r % 9). */
static uint64_t
row_len(uint64_t r)
{
    return r % 9;
}

static uint32_t
col_of(uint64_t r, uint64_t k)
{
    return (uint32_t)((r * 7 + 13 * k) % NVARS);
}

static float
value_of(uint64_t r, uint64_t k)
{
    return (float)r + (float)k * 0.5f;
}

static int64_t
pointer_of(uint64_t r)
{
    int64_t p = 0; /* sum of row_len below r: whole cycles of 0..8 (36 each), then the rest */
    p += (int64_t)(r / 9) * 36;
    for (uint64_t i = r / 9 * 9; i < r; i++) p += (int64_t)row_len(i);
    return p;
}

static int32_t
code_of(uint64_t r)
{
    return (int32_t)(r % (NCATS + 1)) - 1; /* -1 (missing), 0, 1, 2 */
}

static void
name_of(uint64_t r, char *buf, size_t cap)
{
    snprintf(buf, cap, "cell-%llu", (unsigned long long)r);
}

/* Writes the store at a fresh directory and returns its path (static storage). */
static const char *
write_store(const char *name, int zarr_format, uint64_t x_shard)
{
    const char *dir = zbt_tempdir(name);
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &s));
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.zarr_format = zarr_format;
    o.x_chunk = 256;
    o.x_shard = x_shard;
    o.column_chunk = 100; /* indptr and obs in many chunks */
    zb_anndata_writer *w = NULL;
    ZB_ASSERT_OK(zb_anndata_writer_open(s, "", NVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w));

    int64_t *indptr = malloc((NOBS + 1) * sizeof *indptr);
    int32_t *indices = malloc(NOBS * 9 * sizeof *indices);
    float *data = malloc(NOBS * 9 * sizeof *data);
    int32_t *codes = malloc(NOBS * sizeof *codes), *n = malloc(NOBS * sizeof *n);
    char *names = malloc(NOBS * 16);
    uint64_t *offsets = malloc((NOBS + 1) * sizeof *offsets);
    offsets[0] = 0;
    for (uint64_t r = 0; r <= NOBS; r++) indptr[r] = pointer_of(r);
    for (uint64_t r = 0; r < NOBS; r++) {
        for (uint64_t k = 0; k < row_len(r); k++) {
            indices[indptr[r] + (int64_t)k] = (int32_t)col_of(r, k);
            data[indptr[r] + (int64_t)k] = value_of(r, k);
        }
        codes[r] = code_of(r);
        n[r] = (int32_t)(r * 3);
        name_of(r, names + offsets[r], 16);
        offsets[r + 1] = offsets[r] + strlen(names + offsets[r]);
    }
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, NOBS, indptr, indices, data));
    ZB_ASSERT_OK(zb_anndata_writer_append_names(w, ZB_ANNDATA_OBS, names, offsets, NOBS));
    ZB_ASSERT_OK(zb_anndata_writer_define_categorical(
        w, ZB_ANNDATA_OBS, "ct", "abc", (const uint64_t[]){0, 1, 2, 3}, NCATS, false));
    ZB_ASSERT_OK(zb_anndata_writer_append_codes(w, ZB_ANNDATA_OBS, "ct", ZB_DT_INT32, codes, NOBS));
    ZB_ASSERT_OK(zb_anndata_writer_append_column(w, ZB_ANNDATA_OBS, "n", ZB_DT_INT32, n, NOBS));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
    zb_store_close(s);
    free(indptr);
    free(indices);
    free(data);
    free(codes);
    free(n);
    free(names);
    free(offsets);
    return dir;
}

/* ---- checks (return a message, or NULL, so threads can report without cmocka) ------------- */

static char *
fail_text(const char *what, uint64_t start, uint64_t i)
{
    char *m = malloc(160);
    snprintf(m, 160, "%s: block from %llu, item %llu differs (%s)", what, (unsigned long long)start,
             (unsigned long long)i, zb_last_error());
    return m;
}

static char *
check_rows(zb__src_matrix *x, uint64_t start, uint64_t stop, zb__csr_block *b)
{
    if (zb__src_matrix_read(x, start, stop, b) != ZB_OK) return fail_text("read", start, 0);
    if (b->n_rows != stop - start || b->nnz != (uint64_t)(pointer_of(stop) - pointer_of(start)))
        return fail_text("block size", start, 0);
    for (uint64_t r = start; r < stop; r++) {
        int64_t lo = b->indptr[r - start];
        if (lo != pointer_of(r) - pointer_of(start)) return fail_text("indptr", start, r);
        for (uint64_t k = 0; k < row_len(r); k++)
            if (b->indices[lo + (int64_t)k] != col_of(r, k) ||
                ((const float *)b->data)[lo + (int64_t)k] != value_of(r, k))
                return fail_text("element", start, r);
    }
    return NULL;
}

static char *
check_obs(zb__src *src, size_t ct, size_t n, uint64_t start, uint64_t stop, zb__col_block *b)
{
    if (zb__src_read_column(src, ct, start, stop, b) != ZB_OK) return fail_text("ct", start, 0);
    for (uint64_t r = start; r < stop; r++)
        if (((const int32_t *)b->values)[r - start] != code_of(r)) return fail_text("ct", start, r);
    if (zb__src_read_column(src, n, start, stop, b) != ZB_OK) return fail_text("n", start, 0);
    for (uint64_t r = start; r < stop; r++)
        if (((const int32_t *)b->values)[r - start] != (int32_t)(r * 3))
            return fail_text("n", start, r);
    zb_strings names = {0};
    if (zb__src_read_obs_names(src, start, stop, &names) != ZB_OK)
        return fail_text("names", start, 0);
    char *err = NULL;
    for (uint64_t r = start; r < stop && !err; r++) {
        char want[32];
        name_of(r, want, sizeof want);
        uint64_t len = names.offsets[r - start + 1] - names.offsets[r - start];
        if (len != strlen(want) || memcmp(names.data + names.offsets[r - start], want, len))
            err = fail_text("names", start, r);
    }
    zb_strings_free(&names);
    return err;
}

/* ---- tests --------------------------------------------------------------------------------- */

static void
check_store(const char *path)
{
    zb__src *src = NULL;
    ZB_ASSERT_OK(zb__src_open(path, &src));
    assert_string_equal(src->c.format, "zarr");
    assert_int_equal(src->c.n_obs, NOBS);
    assert_int_equal(src->c.n_columns, 2);
    size_t ct, n;
    ZB_ASSERT_OK(zb__src_find_column(src, "ct", &ct));
    ZB_ASSERT_OK(zb__src_find_column(src, "n", &n));
    const zb__col_info *c = &src->c.columns[ct];
    assert_int_equal(c->kind, ZB_COL_CATEGORICAL);
    assert_int_equal(c->categories->n, NCATS);
    assert_memory_equal(c->categories->data, "abc", 3);
    assert_int_equal(src->c.columns[n].kind, ZB_COL_NUMERIC);
    assert_int_equal(src->c.columns[n].dtype, ZB_DT_INT32);

    zb__src_matrix *x = NULL;
    ZB_ASSERT_OK(zb__src_matrix_get(src, "X", &x));
    const zb__src_matrix_info *info = zb__src_matrix_info_of(x);
    assert_int_equal(info->layout, ZB_SRC_CSR);
    assert_int_equal(info->dtype, ZB_DT_FLOAT32);
    assert_int_equal(info->n_rows, NOBS);
    assert_int_equal(info->n_cols, NVARS);
    assert_int_equal(info->nnz, (uint64_t)pointer_of(NOBS));

    /* stored pointers, not rebased, across chunk borders */
    int64_t ptr[301];
    ZB_ASSERT_OK(zb__src_matrix_indptr(x, 1950, 2250, ptr));
    for (uint64_t i = 0; i <= 300; i++) assert_int_equal(ptr[i], pointer_of(1950 + i));
    ZB_ASSERT_ERR(zb__src_matrix_indptr(x, 10, NOBS + 1, ptr), ZB_E_RANGE, "X");

    zb__csr_block b = {0};
    zb__col_block cb = {0};
    static const uint64_t spans[][2] = {{0, 0},       {0, NOBS},  {NOBS - 1, NOBS},
                                        {NOBS, NOBS}, {99, 1301}, {255, 257}};
    for (size_t i = 0; i < sizeof spans / sizeof spans[0]; i++) {
        char *err = check_rows(x, spans[i][0], spans[i][1], &b);
        if (!err) err = check_obs(src, ct, n, spans[i][0], spans[i][1], &cb);
        if (err) fail_msg("%s", err);
    }
    zb_strings names = {0};
    ZB_ASSERT_OK(zb__src_matrix_var_names(x, &names));
    assert_int_equal(names.n, NVARS);
    assert_memory_equal(names.data, "0", 1); /* anndata's default names */
    zb_strings_free(&names);
    ZB_ASSERT_ERR(zb__src_read_obs_names(src, 5, NOBS + 1, &names), ZB_E_RANGE, "obs names");
    zb__csr_block_free(&b);
    zb__col_block_free(&cb);
    zb__src_close(src);
}

static void
test_reads_match_the_written_values(void **state)
{
    (void)state;
    check_store(write_store("src_zarr_v2", 2, 0));
    check_store(write_store("src_zarr_v3_sharded", 3, 1024));
}

typedef struct reader {
    zb__src *src;
    zb__src_matrix *x;
    size_t ct, n;
    uint64_t seed;
    char *err;
} reader;

static void *
read_random_blocks(void *arg)
{
    reader *r = arg;
    zb__csr_block b = {0};
    zb__col_block cb = {0};
    uint64_t s = r->seed;
    for (int i = 0; i < ROUNDS && !r->err; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t start = (s >> 33) % NOBS, len = (s >> 13) % 400;
        uint64_t stop = start + len > NOBS ? NOBS : start + len;
        r->err = check_rows(r->x, start, stop, &b);
        if (!r->err) r->err = check_obs(r->src, r->ct, r->n, start, stop, &cb);
    }
    zb__csr_block_free(&b);
    zb__col_block_free(&cb);
    return NULL;
}

static void
test_threads_share_one_source(void **state)
{
    (void)state;
    const char *path = write_store("src_zarr_threads", 3, 2048);
    zb__src *src = NULL;
    ZB_ASSERT_OK(zb__src_open(path, &src));
    reader rs[THREADS];
    pthread_t t[THREADS];
    zb__src_matrix *x = NULL;
    ZB_ASSERT_OK(zb__src_matrix_get(src, "X", &x));
    for (int i = 0; i < THREADS; i++) {
        rs[i] = (reader){src, x, 0, 0, (uint64_t)i * 7919 + 1, NULL};
        ZB_ASSERT_OK(zb__src_find_column(src, "ct", &rs[i].ct));
        ZB_ASSERT_OK(zb__src_find_column(src, "n", &rs[i].n));
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, read_random_blocks, &rs[i]), 0);
    char *err = NULL;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        if (rs[i].err && !err)
            err = rs[i].err;
        else
            free(rs[i].err);
    }
    zb__src_close(src);
    if (err) fail_msg("%s", err);
}

static void
test_not_anndata_and_missing(void **state)
{
    (void)state;
    zb__src *src = NULL;
    const char *dir = zbt_tempdir("src_zarr_plain");
    zb_store *s = NULL;
    ZB_ASSERT_OK(zb_store_open_file(dir, &s));
    zbt_put_str(s, "zarr.json", "{\"zarr_format\": 3, \"node_type\": \"group\"}");
    zb_store_close(s);
    ZB_ASSERT_ERR(zb__src_open_zarr(dir, &src), ZB_E_UNSUPPORTED, "no encoding-type");
    assert_null(src);
    char missing[1100];
    snprintf(missing, sizeof missing, "%s/none.zarr", dir);
    ZB_ASSERT_ERR(zb__src_open_zarr(missing, &src), ZB_E_NOTFOUND, "none.zarr");
    assert_null(src);
    zb__src_close(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_match_the_written_values),
        cmocka_unit_test(test_threads_share_one_source),
        cmocka_unit_test(test_not_anndata_and_missing),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
