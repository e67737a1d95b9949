/* The out-of-core CSC -> CSR transposition (convert/transpose.c) and its scratch file
 * (convert/csr_file.c). The source is a mock CSC zb__src_matrix serving columns from arrays; the
 * expected CSR is computed independently here from a dense copy of the matrix (presence mask +
 * value bytes), scanned row by row, columns ascending. Values are random bytes, so every
 * comparison is bit for bit (NaN payloads included). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/csr_file.h"
#include "convert/source.h"
#include "support/testutil.h"
#include "util/status.h"

/* ---- a mock CSC matrix ----------------------------------------------------------------------- */

typedef struct mock {
    zb__src_matrix base;
    size_t item;
    int64_t *colptr;      /* [n_cols + 1] */
    uint32_t *rows;       /* [nnz] row ids */
    uint8_t *vals;        /* [nnz * item] */
    int64_t fail_column;  /* a read covering it fails with ZB_E_IO (-1: none) */
    int64_t short_column; /* a read covering it returns one element too few (-1: none) */
    atomic_int reads;
} mock;

static zb_status
mock_indptr(zb__src_matrix *m, uint64_t start, uint64_t stop, int64_t *out)
{
    mock *k = (mock *)m;
    memcpy(out, k->colptr + start, (size_t)(stop - start + 1) * 8);
    return ZB_OK;
}

static zb_status
mock_read(zb__src_matrix *m, uint64_t start, uint64_t stop, zb__csr_block *out)
{
    mock *k = (mock *)m;
    atomic_fetch_add(&k->reads, 1);
    if (k->fail_column >= (int64_t)start && k->fail_column < (int64_t)stop)
        return zb__err(ZB_E_IO, "mock: reading column %lld failed", (long long)k->fail_column);
    int64_t lo = k->colptr[start], hi = k->colptr[stop];
    if (k->short_column >= (int64_t)start && k->short_column < (int64_t)stop && hi > lo) hi--;
    uint64_t nnz = (uint64_t)(hi - lo);
    ZB_TRY(zb__csr_block_reserve(out, stop - start, nnz, m->info.dtype));
    for (uint64_t c = start; c <= stop; c++) {
        int64_t p = k->colptr[c] - lo;
        out->indptr[c - start] = p < (int64_t)nnz ? p : (int64_t)nnz;
    }
    memcpy(out->indices, k->rows + lo, (size_t)nnz * 4);
    memcpy(out->data, k->vals + (size_t)lo * k->item, (size_t)nnz * k->item);
    out->n_rows = stop - start;
    out->nnz = nnz;
    return ZB_OK;
}

static zb_status
mock_var_names(zb__src_matrix *m, zb_strings *out)
{
    uint64_t n = m->info.n_cols;
    out->n = n;
    out->offsets = malloc((size_t)(n + 1) * sizeof *out->offsets);
    out->data = malloc((size_t)n * 24 + 1);
    assert_non_null(out->offsets);
    assert_non_null(out->data);
    out->offsets[0] = 0;
    for (uint64_t i = 0; i < n; i++)
        out->offsets[i + 1] =
            out->offsets[i] +
            (uint64_t)sprintf(out->data + out->offsets[i], "gene%llu", (unsigned long long)i);
    return ZB_OK;
}

static void
mock_close(zb__src_matrix *m)
{
    mock *k = (mock *)m;
    free(k->colptr);
    free(k->rows);
    free(k->vals);
    free(k);
}

static const zb__src_matrix_methods mock_methods = {mock_indptr, mock_read, mock_var_names,
                                                    mock_close, NULL};

/* ---- random matrices and their dense reference ------------------------------------------------
 */

static uint64_t
next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct spec {
    uint64_t n_rows, n_cols;
    double density;
    zb_dtype dtype;
    uint64_t seed;
    bool shuffled;       /* row ids within a column in random order (non-canonical storage) */
    uint64_t dense_rows; /* rows r < dense_rows are full (skew: bands too dense for memory) */
} spec;

/* The matrix as a dense table: present[r * n_cols + c] and the value's bytes. */
typedef struct dense {
    uint64_t n_rows, n_cols;
    size_t item;
    uint8_t *present;
    uint8_t *vals;
} dense;

/* Rows r % 7 == 3 and columns c % 5 == 1 stay empty. */
static mock *
make_matrix(const spec *sp, dense *ref)
{
    size_t item = zb_dtype_size(sp->dtype);
    uint64_t cells = sp->n_rows * sp->n_cols, s = sp->seed;
    ref->n_rows = sp->n_rows;
    ref->n_cols = sp->n_cols;
    ref->item = item;
    ref->present = calloc(cells + 1, 1);
    ref->vals = calloc(cells + 1, item);
    mock *k = calloc(1, sizeof *k);
    assert_true(ref->present && ref->vals && k);
    k->colptr = calloc(sp->n_cols + 1, 8);
    uint64_t cap = 16, nnz = 0;
    k->rows = malloc(cap * 4);
    k->vals = malloc(cap * item);
    assert_true(k->colptr && k->rows && k->vals);
    for (uint64_t c = 0; c < sp->n_cols; c++) {
        uint64_t first = nnz;
        for (uint64_t r = 0; r < sp->n_rows; r++) {
            bool on =
                r < sp->dense_rows || (double)(next(&s) >> 11) / 9007199254740992.0 < sp->density;
            if (!on || r % 7 == 3 || c % 5 == 1) continue;
            if (nnz == cap) {
                cap *= 2;
                k->rows = realloc(k->rows, cap * 4);
                k->vals = realloc(k->vals, cap * item);
                assert_true(k->rows && k->vals);
            }
            uint64_t bits = next(&s);
            k->rows[nnz] = (uint32_t)r;
            memcpy(k->vals + nnz * item, &bits, item);
            ref->present[r * sp->n_cols + c] = 1;
            memcpy(ref->vals + (r * sp->n_cols + c) * item, &bits, item);
            nnz++;
        }
        for (uint64_t i = nnz - first; sp->shuffled && i > 1; i--) { /* Fisher-Yates */
            uint64_t j = next(&s) % i, a = first + i - 1, b = first + j;
            uint32_t t = k->rows[a];
            k->rows[a] = k->rows[b];
            k->rows[b] = t;
            uint8_t tmp[8];
            memcpy(tmp, k->vals + a * item, item);
            memcpy(k->vals + a * item, k->vals + b * item, item);
            memcpy(k->vals + b * item, tmp, item);
        }
        k->colptr[c + 1] = (int64_t)nnz;
    }
    k->item = item;
    k->fail_column = -1;
    k->short_column = -1;
    k->base.methods = &mock_methods;
    k->base.info = (zb__src_matrix_info){ZB_SRC_CSC, sp->dtype, sp->n_rows, sp->n_cols, nnz};
    k->base.key = "X";
    k->base.path = "mock.h5ad";
    return k;
}

static void
dense_free(dense *d)
{
    free(d->present);
    free(d->vals);
}

/* Rows [a, b) of the file read through zb__src_matrix_read, against the dense reference. */
static void
check_rows(zb__src_matrix *m, const dense *ref, uint64_t a, uint64_t b, zb__csr_block *blk)
{
    ZB_ASSERT_OK(zb__src_matrix_read(m, a, b, blk));
    assert_int_equal(blk->n_rows, b - a);
    assert_int_equal(blk->dtype, m->info.dtype);
    uint64_t k = 0;
    for (uint64_t r = a; r < b; r++) {
        if ((int64_t)k != blk->indptr[r - a])
            fail_msg("row %llu starts at %lld, expected %llu", (unsigned long long)r,
                     (long long)blk->indptr[r - a], (unsigned long long)k);
        for (uint64_t c = 0; c < ref->n_cols; c++) {
            if (!ref->present[r * ref->n_cols + c]) continue;
            if (k >= blk->nnz) fail_msg("row %llu: too few elements", (unsigned long long)r);
            if (blk->indices[k] != c)
                fail_msg("row %llu element %llu: column %u, expected %llu", (unsigned long long)r,
                         (unsigned long long)k, blk->indices[k], (unsigned long long)c);
            if (memcmp((uint8_t *)blk->data + k * ref->item,
                       ref->vals + (r * ref->n_cols + c) * ref->item, ref->item) != 0)
                fail_msg("row %llu column %llu: value differs", (unsigned long long)r,
                         (unsigned long long)c);
            k++;
        }
    }
    assert_int_equal(blk->nnz, k);
    assert_int_equal(blk->indptr[b - a], (int64_t)k);
}

/* Opens `path` and checks its facts, its indptr and several row ranges against ref. */
static void
check_file(const char *path, mock *k, const dense *ref)
{
    zb__src_matrix *m = NULL;
    ZB_ASSERT_OK(zb__csr_file_open(path, &k->base, &m));
    const zb__src_matrix_info *info = zb__src_matrix_info_of(m);
    assert_int_equal(info->layout, ZB_SRC_CSR);
    assert_int_equal(info->dtype, k->base.info.dtype);
    assert_int_equal(info->n_rows, ref->n_rows);
    assert_int_equal(info->n_cols, ref->n_cols);
    assert_int_equal(info->nnz, k->base.info.nnz);
    uint64_t n = ref->n_rows;
    int64_t *ptr = malloc((size_t)(n + 1) * 8);
    assert_non_null(ptr);
    ZB_ASSERT_OK(zb__src_matrix_indptr(m, 0, n, ptr));
    int64_t want = 0;
    for (uint64_t r = 0; r <= n; r++) {
        assert_int_equal(ptr[r], want);
        for (uint64_t c = 0; r < n && c < ref->n_cols; c++)
            want += ref->present[r * ref->n_cols + c];
    }
    free(ptr);
    zb__csr_block blk = {0};
    check_rows(m, ref, 0, n, &blk);
    uint64_t s = n * 31 + 7;
    for (int i = 0; i < 6 && n > 0; i++) {
        uint64_t a = next(&s) % n, b = a + next(&s) % (n - a + 1);
        check_rows(m, ref, a, b, &blk);
    }
    if (n > 0) check_rows(m, ref, n - 1, n, &blk);
    check_rows(m, ref, n, n, &blk);
    zb__csr_block_free(&blk);
    zb_strings names = {0};
    ZB_ASSERT_OK(zb__src_matrix_var_names(m, &names));
    assert_int_equal(names.n, ref->n_cols);
    if (names.n > 2) assert_memory_equal(names.data + names.offsets[2], "gene2", 5);
    zb_strings_free(&names);
    zb__src_matrix_close(m);
}

static uint8_t *
slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc(*len + 1);
    assert_non_null(d);
    assert_int_equal(fread(d, 1, *len, f), *len);
    fclose(f);
    return d;
}

/* Entries in `dir` other than . and .. */
static int
entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* zb__csc_transpose_ex with the default band size. */
static zb_status
transpose(mock *k, const char *path, uint64_t memory_bytes, int threads, zb__transpose_stats *st)
{
    zb__transpose_opts o = {memory_bytes, threads, 0};
    return zb__csc_transpose_ex(&k->base, path, &o, st);
}

/* ---- tests ----------------------------------------------------------------------------------- */

/* Every shape (empty, 1x1, a 0-row matrix, no columns, tall, wide) and dtype, in memory and
 * with a memory bound that forces the scratch file, by 1 and 2 threads. */
static void
test_shapes_and_dtypes(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_shapes");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.csr", dir);
    static const zb_dtype dtypes[] = {ZB_DT_FLOAT32, ZB_DT_FLOAT64, ZB_DT_INT32, ZB_DT_UINT16};
    static const uint64_t shapes[][2] = {{1, 1},  {0, 4},   {0, 0},    {5, 0},     {9, 1},
                                         {1, 40}, {37, 11}, {600, 90}, {2500, 300}};
    for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            spec sp = {shapes[s][0], shapes[s][1], 0.08, dtypes[d], 11 * d + s + 1, false, 0};
            if (sp.n_rows == 1 && sp.n_cols == 1) sp.density = 1.0;
            dense ref;
            mock *k = make_matrix(&sp, &ref);
            for (int threads = 1; threads <= 2; threads++) {
                for (int small = 0; small <= 1; small++) {
                    zb__transpose_stats st;
                    ZB_ASSERT_OK(transpose(k, path, small ? 64 << 10 : 1 << 30, threads, &st));
                    if (!small) assert_true(st.in_memory);
                    check_file(path, k, &ref);
                    assert_int_equal(entries(dir), 1); /* no temporary left */
                }
            }
            mock_close(&k->base);
            dense_free(&ref);
        }
    }
}

/* A 1x1 matrix holding one element, and a 1x1 holding none. */
static void
test_one_by_one(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_1x1");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.csr", dir);
    for (int full = 0; full <= 1; full++) {
        spec sp = {1, 1, full ? 1.0 : 0.0, ZB_DT_FLOAT64, 5, false, 0};
        dense ref;
        mock *k = make_matrix(&sp, &ref);
        assert_int_equal(k->base.info.nnz, full);
        ZB_ASSERT_OK(zb__csc_transpose(&k->base, path, 1 << 20, 1));
        check_file(path, k, &ref);
        size_t len;
        uint8_t *bytes = slurp(path, &len);
        assert_int_equal(len, 64 + 16 + (size_t)full * 12);
        assert_memory_equal(bytes, "ZBCSR\r\n\x1a", 8);
        assert_string_equal((char *)bytes + 16, "float64");
        if (full) assert_memory_equal(bytes + 84, k->vals, 8);
        free(bytes);
        mock_close(&k->base);
        dense_free(&ref);
    }
}

/* A memory bound far below the matrix: many bands through the scratch file, the same bytes as
 * in memory, and the data held never far above the bound. */
static void
test_memory_bound(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_bound");
    char big[1200], small[1200];
    snprintf(big, sizeof big, "%s/big.csr", dir);
    snprintf(small, sizeof small, "%s/small.csr", dir);
    spec sp = {20000, 700, 0.05, ZB_DT_FLOAT32, 42, false, 0}; /* ~470k elements, ~3.9 MB */
    dense ref;
    mock *k = make_matrix(&sp, &ref);
    uint64_t matrix_bytes = k->base.info.nnz * 8 + (sp.n_rows + 1) * 8;
    zb__transpose_stats a, b;
    ZB_ASSERT_OK(transpose(k, big, 1ull << 30, 1, &a));
    assert_true(a.in_memory);
    assert_int_equal(a.scratch_bytes, 0);
    for (uint64_t bound = 256 << 10; bound >= 64 << 10; bound /= 2) {
        ZB_ASSERT_OK(transpose(k, small, bound, 1, &b));
        assert_false(b.in_memory);
        assert_true(b.bands >= 8);
        assert_true(b.scratch_bytes >= k->base.info.nnz * 12); /* more when bands split */
        if (b.peak_bytes > bound)
            fail_msg("bound %llu: %llu bytes held (matrix %llu)", (unsigned long long)bound,
                     (unsigned long long)b.peak_bytes, (unsigned long long)matrix_bytes);
        size_t la, lb;
        uint8_t *x = slurp(big, &la), *y = slurp(small, &lb);
        assert_int_equal(la, lb);
        assert_memory_equal(x, y, la);
        free(x);
        free(y);
    }
    check_file(small, k, &ref);
    assert_int_equal(entries(dir), 2);
    mock_close(&k->base);
    dense_free(&ref);
}

/* Rows far denser than the rest overflow their band, which is distributed again into narrower
 * bands (down to single rows): through the scratch file under a small bound, and in memory with
 * small bands under a large one. */
static void
test_dense_rows_split_bands(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_skew");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.csr", dir);
    spec sp = {30000, 900, 0.002, ZB_DT_INT32, 9, false, 40};
    dense ref;
    mock *k = make_matrix(&sp, &ref);
    for (int threads = 1; threads <= 2; threads++) {
        for (int in_memory = 0; in_memory <= 1; in_memory++) {
            zb__transpose_opts o = {in_memory ? 1 << 30 : 128 << 10, threads,
                                    in_memory ? 16 << 10 : 0};
            zb__transpose_stats st;
            ZB_ASSERT_OK(zb__csc_transpose_ex(&k->base, path, &o, &st));
            assert_int_equal(st.in_memory, in_memory);
            assert_true(st.bands_split > 0);
            if (!in_memory) assert_true(st.peak_bytes <= o.memory_bytes);
            check_file(path, k, &ref);
        }
    }
    mock_close(&k->base);
    dense_free(&ref);
}

/* 1, 2, 3 and 8 threads write the same bytes, in memory and through the scratch file. */
static void
test_thread_counts_identical(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_threads");
    char first[1200], path[1200];
    snprintf(first, sizeof first, "%s/t1.csr", dir);
    snprintf(path, sizeof path, "%s/tn.csr", dir);
    spec sp = {7000, 500, 0.04, ZB_DT_FLOAT64, 3, false, 0};
    dense ref;
    mock *k = make_matrix(&sp, &ref);
    static const uint64_t bounds[] = {1ull << 30, 192 << 10};
    static const int threads[] = {2, 3, 8};
    for (size_t b = 0; b < 2; b++) {
        ZB_ASSERT_OK(zb__csc_transpose(&k->base, first, bounds[b], 1));
        size_t l1;
        uint8_t *one = slurp(first, &l1);
        for (size_t t = 0; t < 3; t++) {
            zb__transpose_stats st;
            ZB_ASSERT_OK(transpose(k, path, bounds[b], threads[t], &st));
            assert_int_equal(st.in_memory, b == 0);
            size_t ln;
            uint8_t *many = slurp(path, &ln);
            assert_int_equal(l1, ln);
            assert_memory_equal(one, many, l1);
            free(many);
        }
        free(one);
    }
    check_file(path, k, &ref);
    mock_close(&k->base);
    dense_free(&ref);
}

/* Row ids stored out of order within columns (a non-canonical CSC): each row's columns still
 * come out ascending. */
static void
test_unsorted_columns(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_unsorted");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.csr", dir);
    spec sp = {3000, 200, 0.1, ZB_DT_UINT16, 17, true, 0};
    dense ref;
    mock *k = make_matrix(&sp, &ref);
    bool out_of_order = false;
    for (int64_t e = 1; e < (int64_t)k->base.info.nnz; e++)
        out_of_order |= k->rows[e] < k->rows[e - 1] && k->colptr[1] > e;
    assert_true(out_of_order); /* the first column really is unsorted */
    ZB_ASSERT_OK(zb__csc_transpose(&k->base, path, 1 << 30, 2));
    check_file(path, k, &ref);
    ZB_ASSERT_OK(zb__csc_transpose(&k->base, path, 64 << 10, 2));
    check_file(path, k, &ref);
    mock_close(&k->base);
    dense_free(&ref);
}

/* A source whose reads fail, or that returns fewer elements than its pointers promise, makes
 * the transposition fail with its error and leave nothing behind (in memory and through the
 * scratch file, 1 and 2 threads). A CSR source is refused. */
static void
test_failing_source_leaves_no_file(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_fail");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.csr", dir);
    spec sp = {4000, 300, 0.05, ZB_DT_FLOAT32, 23, false, 0};
    dense ref;
    mock *k = make_matrix(&sp, &ref);
    for (int threads = 1; threads <= 2; threads++) {
        for (int small = 0; small <= 1; small++) {
            uint64_t bound = small ? 64 << 10 : 1 << 30;
            k->fail_column = 250;
            ZB_ASSERT_ERR(zb__csc_transpose(&k->base, path, bound, threads), ZB_E_IO,
                          "reading column 250 failed");
            assert_int_equal(entries(dir), 0);
            k->fail_column = -1;
            k->short_column = 120;
            ZB_ASSERT_ERR(zb__csc_transpose(&k->base, path, bound, threads), ZB_E_CORRUPT,
                          "mock.h5ad: X: columns [");
            assert_int_equal(entries(dir), 0);
            k->short_column = -1;
        }
    }
    k->base.info.layout = ZB_SRC_CSR;
    ZB_ASSERT_ERR(zb__csc_transpose(&k->base, path, 1 << 20, 1), ZB_E_INVALID, "not a CSC");
    k->base.info.layout = ZB_SRC_CSC;
    assert_int_equal(entries(dir), 0);
    /* an existing file at path is left as it was when the transposition fails */
    FILE *f = fopen(path, "w");
    fputs("old", f);
    fclose(f);
    k->fail_column = 3;
    ZB_ASSERT_ERR(zb__csc_transpose(&k->base, path, 1 << 20, 2), ZB_E_IO, "mock");
    size_t len;
    uint8_t *old = slurp(path, &len);
    assert_int_equal(len, 3);
    free(old);
    assert_int_equal(entries(dir), 1);
    mock_close(&k->base);
    dense_free(&ref);
}

/* Every write-like call (reserving the output, scratch chunks, band outputs, header, fsyncs)
 * failing in turn with ENOSPC: an error naming the disk being full, and no file left. */
static void
test_full_disk(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_enospc");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.csr", dir);
    spec sp = {3000, 200, 0.05, ZB_DT_FLOAT32, 31, false, 0};
    dense ref;
    mock *k = make_matrix(&sp, &ref);
    for (int small = 0; small <= 1; small++) {
        for (int threads = 1; threads <= 2; threads++) {
            int64_t n = 0;
            for (;; n++) {
                assert_true(n < 2000);
                zb__transpose_fail_write(n, ENOSPC);
                zb_status st =
                    zb__csc_transpose(&k->base, path, small ? 64 << 10 : 1 << 30, threads);
                zb__transpose_fail_write(-1, 0);
                if (st == ZB_OK) break;
                ZB_ASSERT_ERR(st, ZB_E_IO, "No space left on device");
                assert_int_equal(entries(dir), 0);
            }
            assert_true(n >= (small ? 10 : 5)); /* failures at many distinct places */
            check_file(path, k, &ref);
            unlink(path);
        }
    }
    mock_close(&k->base);
    dense_free(&ref);
}

/* Writes a small valid file to `path` and returns its bytes. */
static uint8_t *
valid_file(const char *path, mock **k, dense *ref, size_t *len)
{
    spec sp = {50, 20, 0.2, ZB_DT_FLOAT32, 77, false, 0};
    *k = make_matrix(&sp, ref);
    ZB_ASSERT_OK(zb__csc_transpose(&(*k)->base, path, 1 << 20, 1));
    return slurp(path, len);
}

static void
write_bytes(const char *path, const uint8_t *d, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(d, 1, len, f), len);
    fclose(f);
}

/* Foreign, damaged and truncated files are refused at open with ZB_E_CORRUPT naming them. */
static void
test_corrupt_header_refused(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_corrupt");
    char path[1200], bad[1200];
    snprintf(path, sizeof path, "%s/x.csr", dir);
    snprintf(bad, sizeof bad, "%s/bad.csr", dir);
    mock *k;
    dense ref;
    size_t len;
    uint8_t *good = valid_file(path, &k, &ref, &len);
    uint8_t *b = malloc(len + 16);
    assert_non_null(b);
    struct {
        size_t at; /* byte changed, or SIZE_MAX: none */
        uint8_t value;
        long resize; /* bytes added (negative: cut) */
        const char *msg;
    } cases[] = {
        {0, 'z', 0, "bad magic"},
        {6, 0, 0, "bad magic"},
        {8, 2, 0, "version"},
        {12, 5, 0, "byte order"},
        {16, 'F', 0, "unknown dtype"},
        {20, 0, 0, "unknown dtype"},     /* "floa" */
        {32, 51, 0, "bytes long"},       /* n_rows */
        {44, 0xff, 0, "at most 2^32"},   /* n_cols */
        {48, 250, 0, "bytes long"},      /* nnz */
        {55, 0x80, 0, "bytes long"},     /* nnz beyond 2^63 */
        {SIZE_MAX, 0, -1, "bytes long"}, /* truncated */
        {SIZE_MAX, 0, 1, "bytes long"},  /* extended */
        {SIZE_MAX, 0, -(long)len + 40, "shorter than a CSR scratch file header"},
        {SIZE_MAX, 0, -(long)len, "shorter than a CSR scratch file header"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memcpy(b, good, len);
        memset(b + len, 0, 16);
        if (cases[i].at != SIZE_MAX) b[cases[i].at] = cases[i].value;
        write_bytes(bad, b, (size_t)((long)len + cases[i].resize));
        zb__src_matrix *m = &k->base; /* must come back NULL */
        ZB_ASSERT_ERR(zb__csr_file_open(bad, &k->base, &m), ZB_E_CORRUPT, cases[i].msg);
        assert_true(zbt_mentions(bad));
        assert_null(m);
    }
    char text[200]; /* a CSV file as long as a small CSR file */
    for (size_t i = 0; i < sizeof text; i++) text[i] = "col1,col2\n1,2\n"[i % 14];
    write_bytes(bad, (const uint8_t *)text, sizeof text);
    zb__src_matrix *m = NULL;
    ZB_ASSERT_ERR(zb__csr_file_open(bad, &k->base, &m), ZB_E_CORRUPT, "bad magic");
    ZB_ASSERT_ERR(zb__csr_file_open("/nonexistent/x.csr", &k->base, &m), ZB_E_NOTFOUND,
                  "/nonexistent/x.csr");
    /* var names from a matrix of another width */
    k->base.info.n_cols++;
    ZB_ASSERT_ERR(zb__csr_file_open(path, &k->base, &m), ZB_E_INVALID, "var names");
    k->base.info.n_cols--;
    free(b);
    free(good);
    mock_close(&k->base);
    dense_free(&ref);
}

/* Row pointers damaged inside the file, and a file cut after it was opened: reads fail with
 * ZB_E_CORRUPT, never read out of bounds. */
static void
test_damaged_body(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_body");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.csr", dir);
    mock *k;
    dense ref;
    size_t len;
    uint8_t *good = valid_file(path, &k, &ref, &len);
    int64_t v = 1 << 20; /* indptr[10] beyond nnz */
    memcpy(good + 64 + 10 * 8, &v, 8);
    write_bytes(path, good, len);
    zb__src_matrix *m = NULL;
    ZB_ASSERT_OK(zb__csr_file_open(path, &k->base, &m));
    zb__csr_block blk = {0};
    ZB_ASSERT_ERR(zb__src_matrix_read(m, 5, 20, &blk), ZB_E_CORRUPT, "indptr[10]");
    ZB_ASSERT_OK(zb__src_matrix_read(m, 0, 9, &blk));
    v = 0; /* a decrease */
    memcpy(good + 64 + 10 * 8, &v, 8);
    write_bytes(path, good, len);
    ZB_ASSERT_ERR(zb__src_matrix_read(m, 5, 20, &blk), ZB_E_CORRUPT, "indptr[10]");
    assert_int_equal(truncate(path, 200), 0);
    ZB_ASSERT_ERR(zb__src_matrix_read(m, 40, 50, &blk), ZB_E_CORRUPT, "truncated since open");
    zb__csr_block_free(&blk);
    zb__src_matrix_close(m);
    zb__src_matrix_close(NULL);
    free(good);
    mock_close(&k->base);
    dense_free(&ref);
}

/* Several threads reading rows of one opened file at once get the right rows. */
typedef struct reader_arg {
    zb__src_matrix *m;
    const dense *ref;
    uint64_t seed;
} reader_arg;

static void *
reader_main(void *p)
{
    reader_arg *a = p;
    zb__csr_block blk = {0};
    uint64_t n = a->ref->n_rows;
    for (int i = 0; i < 40; i++) {
        uint64_t lo = next(&a->seed) % n, hi = lo + next(&a->seed) % (n - lo + 1);
        check_rows(a->m, a->ref, lo, hi, &blk);
    }
    zb__csr_block_free(&blk);
    return NULL;
}

static void
test_concurrent_reads(void **state)
{
    (void)state;
    const char *dir = zbt_tempdir("transpose_readers");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.csr", dir);
    spec sp = {2000, 150, 0.1, ZB_DT_FLOAT32, 5, false, 0};
    dense ref;
    mock *k = make_matrix(&sp, &ref);
    ZB_ASSERT_OK(zb__csc_transpose(&k->base, path, 1 << 20, 2));
    zb__src_matrix *m = NULL;
    ZB_ASSERT_OK(zb__csr_file_open(path, &k->base, &m));
    pthread_t t[4];
    reader_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (reader_arg){m, &ref, (uint64_t)i + 100};
        assert_int_equal(pthread_create(&t[i], NULL, reader_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    zb__src_matrix_close(m);
    mock_close(&k->base);
    dense_free(&ref);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes_and_dtypes),
        cmocka_unit_test(test_one_by_one),
        cmocka_unit_test(test_memory_bound),
        cmocka_unit_test(test_dense_rows_split_bands),
        cmocka_unit_test(test_thread_counts_identical),
        cmocka_unit_test(test_unsorted_columns),
        cmocka_unit_test(test_failing_source_leaves_no_file),
        cmocka_unit_test(test_full_disk),
        cmocka_unit_test(test_corrupt_header_refused),
        cmocka_unit_test(test_damaged_body),
        cmocka_unit_test(test_concurrent_reads),
    };
    return ZBT_RUN_GROUP(tests, NULL, NULL);
}
