/* The .h5ad source shared by threads (source.h: every read may come from several threads at once
 * on the same source and matrix). The file is written here with libhdf5 in anndata's layout: a
 * CSR X whose data (deflate + shuffle), indices (deflate) and indptr (no filter) have different
 * chunk sizes, an obs dataframe with a string index and a deflated int32 column, a var index.
 * Row r of X holds r % 23 elements at columns (r * 7 + 13 k) % N_VARS (k < r % 23), values
 * r + k / 4. Threads read the whole matrix in blocks of different sizes, obs and var at once,
 * and must each see exactly that. Meant for the sanitizer builds too (ZB_SANITIZE). */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/h5ad_io.h"
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

/* ---- chunk tables (zb__h5_chunk_table) ------------------------------------------------------- */

#define TABLE_N 10007 /* int32 elements: 157 chunks of 64, the last one partial */
#define TABLE_CHUNK 64

/* A file holding "a" (TABLE_N int32, a[i] = 3i + 1, chunks of TABLE_CHUNK) written in two
 * halves with "b" (the same shape, b[i] = -i) written between them, so a's chunks do not lie in
 * one run; `userblock` bytes before HDF5's own (0: none); `partial`: a's second half never
 * written, so its chunks are not allocated. */
static void
write_table_file(const char *path, hsize_t userblock, bool partial)
{
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    if (userblock) H5Pset_userblock(fcpl, userblock);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
    assert_true(f >= 0);
    int32_t *v = malloc(TABLE_N * sizeof *v);
    hsize_t n = TABLE_N, chunk = TABLE_CHUNK, half = TABLE_N / 2, start = 0;
    hid_t space = H5Screate_simple(1, &n, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &chunk);
    hid_t a = H5Dcreate2(f, "a", H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    assert_true(a >= 0);
    for (int i = 0; i < TABLE_N; i++) v[i] = 3 * i + 1;
    hid_t mem = H5Screate_simple(1, &half, NULL);
    H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, NULL, &half, NULL);
    assert_true(H5Dwrite(a, H5T_NATIVE_INT32, mem, space, H5P_DEFAULT, v) >= 0);
    for (int i = 0; i < TABLE_N; i++) v[i] = -i;
    zbt_h5_array(f, "b", H5T_STD_I32LE, n, v, TABLE_CHUNK, false, false);
    for (int i = 0; i < TABLE_N; i++) v[i] = 3 * i + 1;
    if (!partial) {
        hsize_t rest = n - half;
        H5Sclose(mem);
        mem = H5Screate_simple(1, &rest, NULL);
        H5Sselect_hyperslab(space, H5S_SELECT_SET, &half, NULL, &rest, NULL);
        assert_true(H5Dwrite(a, H5T_NATIVE_INT32, mem, space, H5P_DEFAULT, v + half) >= 0);
    }
    H5Sclose(mem);
    H5Dclose(a);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
    H5Pclose(fcpl);
    free(v);
}

/* The table of "a" in path: zb__h5_chunk_table's answer, and each chunk's bytes at its offset
 * against the values written (read with pread, not libhdf5); libhdf5's own addresses (the
 * oracle) are the table's less the user block. */
static void
check_table(const char *path, hsize_t userblock)
{
    hid_t f;
    zb__h5_ds d;
    zb__h5_lock();
    ZB_ASSERT_OK(zb__h5_file_open(path, &f));
    ZB_ASSERT_OK(zb__h5_ds_open(f, "a", path, "a", &d));
    uint64_t n = (TABLE_N + TABLE_CHUNK - 1) / TABLE_CHUNK, *table = malloc(n * 8);
    assert_int_equal(zb__h5_chunk_table(&d, n, table), 1);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    uint64_t previous = 0, jumps = 0;
    for (uint64_t c = 0; c < n; c++) {
        hsize_t off[1] = {c * TABLE_CHUNK}, size = 0;
        haddr_t addr = HADDR_UNDEF;
        unsigned mask = 1;
        assert_true(H5Dget_chunk_info_by_coord(d.id, off, &mask, &addr, &size) >= 0);
        assert_int_equal(mask, 0);
        assert_int_equal(size, TABLE_CHUNK * 4);
        assert_true(table[c] == addr + userblock || table[c] == addr); /* 1.10: relative */
        int32_t got[TABLE_CHUNK];
        assert_int_equal(pread(fd, got, sizeof got, (off_t)table[c]), sizeof got);
        for (uint64_t i = 0; i < TABLE_CHUNK && c * TABLE_CHUNK + i < TABLE_N; i++)
            assert_int_equal(got[i], 3 * (int32_t)(c * TABLE_CHUNK + i) + 1);
        jumps += c && table[c] != previous + TABLE_CHUNK * 4;
        previous = table[c];
    }
    assert_true(jumps >= 1); /* "b" lies between a's halves: a real table, not one run */
    close(fd);
    free(table);
    zb__h5_ds_close(&d);
    H5Fclose(f);
    zb__h5_unlock();
}

static void
test_chunk_table_is_libhdf5s(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("src_h5ad_table");
    char path[1100];
    snprintf(path, sizeof path, "%s/a.h5", dir);
    write_table_file(path, 0, false);
    check_table(path, 0);
    snprintf(path, sizeof path, "%s/userblock.h5", dir);
    write_table_file(path, 512, false);
    check_table(path, 512);
}

/* zb__h5_chunk_table of dataset `name` in the file at `path`, opened read-only as a source
 * opens it. */
static int
table_of(const char *path, const char *name, uint64_t n, uint64_t *table)
{
    hid_t f;
    zb__h5_ds d;
    zb__h5_lock();
    ZB_ASSERT_OK(zb__h5_file_open(path, &f));
    ZB_ASSERT_OK(zb__h5_ds_open(f, name, path, name, &d));
    int made = zb__h5_chunk_table(&d, n, table);
    zb__h5_ds_close(&d);
    H5Fclose(f);
    zb__h5_unlock();
    return made;
}

/* Chunks never written, or stored compressed, are not a raw table (0); a dataset that is not
 * chunked, or an empty table, is not one this function makes (-1). */
static void
test_chunk_table_refuses(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("src_h5ad_table_no");
    char partial[1100], filtered[1100];
    snprintf(partial, sizeof partial, "%s/partial.h5", dir);
    write_table_file(partial, 0, true);
    uint64_t n = (TABLE_N + TABLE_CHUNK - 1) / TABLE_CHUNK, *table = malloc(n * 8);
    assert_int_equal(table_of(partial, "a", n, table), 0);
    assert_int_equal(table_of(partial, "a", 0, table), -1);
    assert_int_equal(table_of(partial, "b", n, table), 1); /* written whole: a table */
    snprintf(filtered, sizeof filtered, "%s/filtered.h5", dir);
    hid_t f = H5Fcreate(filtered, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    int32_t *v = calloc(TABLE_N, sizeof *v);
    for (int i = 0; i < TABLE_N; i++) v[i] = i;
    zbt_h5_array(f, "deflated", H5T_STD_I32LE, TABLE_N, v, TABLE_CHUNK, false, true);
    zbt_h5_array(f, "contiguous", H5T_STD_I32LE, TABLE_N, v, 0, false, false);
    H5Fclose(f);
    assert_int_equal(table_of(filtered, "deflated", n, table), 0);
    assert_int_equal(table_of(filtered, "contiguous", n, table), -1);
    free(v);
    free(table);
}

/* Overwrites the stored size of chunk c of "a" in its v1 B-tree record (key: size u32, filter
 * mask u32, the chunk's offset and a 0 as u64s, then the chunk's address) with `size`. */
static void
damage_chunk_size(const char *path, uint64_t c, uint32_t size)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), a = H5Dopen2(f, "a", H5P_DEFAULT);
    hsize_t off[1] = {c * TABLE_CHUNK}, stored = 0;
    haddr_t addr = HADDR_UNDEF;
    unsigned mask = 0;
    assert_true(H5Dget_chunk_info_by_coord(a, off, &mask, &addr, &stored) >= 0);
    H5Dclose(a);
    H5Fclose(f);
    uint8_t rec[32];
    uint32_t head[2] = {(uint32_t)stored, 0};
    uint64_t tail[3] = {c * TABLE_CHUNK, 0, (uint64_t)addr};
    memcpy(rec, head, 8);
    memcpy(rec + 8, tail, 24);
    int fd = open(path, O_RDWR);
    struct stat sb;
    assert_true(fd >= 0 && fstat(fd, &sb) == 0);
    uint8_t *file = malloc((size_t)sb.st_size);
    assert_int_equal(pread(fd, file, (size_t)sb.st_size, 0), sb.st_size);
    int found = 0;
    for (off_t i = 0; i + 32 <= sb.st_size; i++)
        if (!memcmp(file + i, rec, 32)) {
            assert_int_equal(pwrite(fd, &size, 4, i), 4);
            found++;
        }
    assert_int_equal(found, 1);
    free(file);
    close(fd);
}

/* A chunk index that claims more bytes for an unfiltered chunk than the chunk holds: libhdf5
 * 1.10's H5Dget_chunk_storage_size still says the nominal size, H5Dread_chunk would read the
 * claimed one (past the buffer, which ASan sees). The reader reads the chunk's nominal bytes
 * (the values written), and the chunk table is refused (0: the direct path is not taken). */
static void
test_damaged_chunk_size_reads_no_more_than_the_chunk(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("src_h5ad_damaged_size");
    char path[1100];
    snprintf(path, sizeof path, "%s/a.h5", dir);
    write_table_file(path, 0, false);
    damage_chunk_size(path, 40, TABLE_CHUNK * 4 + 4096);
    hid_t f;
    zb__h5_ds d;
    zb__h5_lock();
    ZB_ASSERT_OK(zb__h5_file_open(path, &f));
    ZB_ASSERT_OK(zb__h5_ds_open(f, "a", path, "a", &d));
    zb__h5_unlock();
    int32_t *got = calloc(TABLE_N, sizeof *got);
    ZB_ASSERT_OK(zb__h5_ds_read(&d, 0, TABLE_N, got));
    for (int i = 0; i < TABLE_N; i++) assert_int_equal(got[i], 3 * i + 1);
    memset(got, 0, TABLE_N * sizeof *got); /* a range that starts and ends in the chunk */
    ZB_ASSERT_OK(zb__h5_ds_read(&d, 40 * TABLE_CHUNK + 3, 41 * TABLE_CHUNK - 2, got));
    for (int i = 0; i < TABLE_CHUNK - 5; i++)
        assert_int_equal(got[i], 3 * (40 * TABLE_CHUNK + 3 + i) + 1);
    zb__h5_lock();
    zb__h5_ds_close(&d);
    H5Fclose(f);
    zb__h5_unlock();
    uint64_t n = (TABLE_N + TABLE_CHUNK - 1) / TABLE_CHUNK, *table = malloc(n * 8);
    assert_int_equal(table_of(path, "a", n, table), 0);
    free(table);
    free(got);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_share_one_source),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_chunk_table_is_libhdf5s),
        cmocka_unit_test(test_chunk_table_refuses),
        cmocka_unit_test(test_damaged_chunk_size_reads_no_more_than_the_chunk),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
