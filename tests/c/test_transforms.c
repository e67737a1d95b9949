/* The built-in transforms (src/loader/transforms.c: normalize_total, log1p, densify) on batches
 * of a concatenation of two anndata datasets (zb_dataset_concat) read by the loader with decode
 * threads, so the sanitizer tiers see the three together. The oracle is the CSR matrix the
 * stores were written from, transformed here the way scanpy defines it (normalize_total scales a
 * row to sum to target_sum, an all-zero row stays zero; log1p is ln(1 + x); densify scatters a
 * row into zeros, optionally keeping only some columns in the order given). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"
#include "zbatch.h"

#define NA 70 /* cells of child a */
#define NB 45 /* cells of child b */
#define NVARS 23

typedef struct csr {
    uint64_t n;
    int64_t indptr[NA + 1];
    int32_t indices[NA * NVARS];
    float data[NA * NVARS];
} csr;

typedef struct fixture {
    zb_store *store;
    csr a, b;
    zb_dataset *da, *db, *cat;
} fixture;

/* Cell i of a child keeps gene g when (i * 7 + g * 3 + seed) % 5 < 2 (every fifth cell has
 * none), with the count 1 + (i + g + seed) % 9. */
static void
make_csr(csr *m, uint64_t n, int seed)
{
    m->n = n;
    m->indptr[0] = 0;
    int64_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        for (int g = 0; g < NVARS && i % 5 != 4; g++) {
            if (((int)i * 7 + g * 3 + seed) % 5 < 2) {
                m->indices[k] = g;
                m->data[k++] = (float)(1 + ((int)i + g + seed) % 9);
            }
        }
        m->indptr[i + 1] = k;
    }
}

static void
write_child(zb_store *s, const char *path, const csr *m)
{
    zb_anndata_writer *w = NULL;
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    o.x_chunk = 37; /* rows straddle chunks */
    ZB_ASSERT_OK(zb_anndata_writer_open(s, path, NVARS, ZB_ANNDATA_X_CSR, ZB_DT_FLOAT32, &o, &w));
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, m->n, m->indptr, m->indices, m->data));
    char names[NVARS * 4];
    uint64_t off[NVARS + 1] = {0};
    for (int g = 0; g < NVARS; g++)
        off[g + 1] = off[g] + (uint64_t)snprintf(names + off[g], 4, "g%d", g);
    ZB_ASSERT_OK(zb_anndata_writer_append_names(w, ZB_ANNDATA_VAR, names, off, NVARS));
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
}

static int
setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    make_csr(&f->a, NA, 0);
    make_csr(&f->b, NB, 2);
    ZB_ASSERT_OK(zb_store_open_memory(&f->store));
    write_child(f->store, "a", &f->a);
    write_child(f->store, "b", &f->b);
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    o.num_threads = 3;
    o.x_dtype = "float32";
    ZB_ASSERT_OK(zb_dataset_open(f->store, "a", &o, &f->da));
    ZB_ASSERT_OK(zb_dataset_open(f->store, "b", &o, &f->db));
    zb_dataset *kids[2] = {f->da, f->db};
    ZB_ASSERT_OK(zb_dataset_concat(kids, 2, &o, &f->cat));
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    fixture *f = *state;
    zb_dataset_close(f->cat);
    zb_dataset_close(f->da);
    zb_dataset_close(f->db);
    zb_store_close(f->store);
    free(f);
    return 0;
}

/* The expected dense row of global cell `id` after normalize_total(target) (target <= 0: none)
 * and log1p (when `log`), computed in the same precision as the library (float values, a double
 * row sum). */
static void
expected_row(const fixture *f, uint64_t id, double target, bool log, float *row)
{
    const csr *m = id < NA ? &f->a : &f->b;
    uint64_t r = id < NA ? id : id - NA;
    memset(row, 0, NVARS * sizeof *row);
    double sum = 0;
    for (int64_t k = m->indptr[r]; k < m->indptr[r + 1]; k++) sum += m->data[k];
    for (int64_t k = m->indptr[r]; k < m->indptr[r + 1]; k++) {
        float v = m->data[k];
        if (target > 0 && sum > 0) v = (float)(v * (target / sum));
        row[m->indices[k]] = log ? log1pf(v) : v;
    }
}

static void
assert_close(float got, float want, const char *what, uint64_t id, uint64_t col)
{
    if (fabsf(got - want) > 1e-6f * fmaxf(1.0f, fabsf(want)))
        fail_msg("%s of cell %llu, column %llu: %.9g, expected %.9g", what, (unsigned long long)id,
                 (unsigned long long)col, (double)got, (double)want);
}

static zb_loader *
open_loader(fixture *f, zb_sampler **s, const zb_transform *t, size_t nt, uint64_t seed)
{
    zb_sampler_opts so = ZB_SAMPLER_OPTS_DEFAULT;
    so.n = NA + NB;
    so.batch_size = 16;
    so.seed = seed;
    ZB_ASSERT_OK(zb_sampler_new_random(&so, s));
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    lo.prefetch_factor = 2;
    lo.transforms = t;
    lo.ntransforms = nt;
    zb_loader *ld = NULL;
    ZB_ASSERT_OK(zb_loader_open(f->cat, *s, &lo, &ld));
    return ld;
}

/* normalize_total + log1p act on X/data in place (checked row by row through X/indices), and
 * densify then adds X_dense with every gene; every cell comes once per epoch with its child. */
static void
test_normalize_log1p_densify(void **state)
{
    fixture *f = *state;
    zb_transform t[3] = {{.kind = ZB_TRANSFORM_NORMALIZE_TOTAL, .target_sum = 1e4},
                         {.kind = ZB_TRANSFORM_LOG1P},
                         {.kind = ZB_TRANSFORM_DENSIFY}};
    zb_sampler *s = NULL;
    zb_loader *ld = open_loader(f, &s, t, 3, 11);
    int seen[NA + NB] = {0};
    float want[NVARS];
    zb_batch *b = NULL;
    for (;;) {
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        if (!b) break;
        const uint64_t *ids = zb_batch_index(b);
        const int32_t *child = zb_batch_dataset(b);
        zb_batch_view d, ix, dense;
        ZB_ASSERT_OK(zb_batch_find(b, "X/data", &d));
        ZB_ASSERT_OK(zb_batch_find(b, "X/indices", &ix));
        ZB_ASSERT_OK(zb_batch_find(b, "X_dense", &dense));
        assert_int_equal(dense.dtype, ZB_DT_FLOAT32);
        assert_int_equal(dense.ndim, 1);
        assert_int_equal(dense.row_shape[0], NVARS);
        for (size_t i = 0; i < zb_batch_size(b); i++) {
            assert_true(ids[i] < NA + NB);
            seen[ids[i]]++;
            assert_int_equal(child[i], ids[i] < NA ? 0 : 1);
            expected_row(f, ids[i], 1e4, true, want);
            const float *row = (const float *)dense.data + i * NVARS;
            for (uint64_t c = 0; c < NVARS; c++)
                assert_close(row[c], want[c], "X_dense", ids[i], c);
            for (int64_t k = d.ptr[i]; k < d.ptr[i + 1]; k++) {
                int64_t c = ((const int32_t *)ix.data)[k];
                assert_close(((const float *)d.data)[k], want[c], "X/data", ids[i], (uint64_t)c);
            }
        }
        zb_batch_free(b);
    }
    for (int i = 0; i < NA + NB; i++) assert_int_equal(seen[i], 1);
    zb_loader_close(ld);
    zb_sampler_free(s);
}

/* densify with a column subset keeps those genes in the order given; without normalize/log1p
 * the values are the stored counts. */
static void
test_densify_columns(void **state)
{
    fixture *f = *state;
    const uint64_t cols[5] = {22, 7, 0, 8, 13};
    zb_transform t = {.kind = ZB_TRANSFORM_DENSIFY, .columns = cols, .ncolumns = 5};
    zb_sampler *s = NULL;
    zb_loader *ld = open_loader(f, &s, &t, 1, 5);
    float want[NVARS];
    size_t cells = 0;
    zb_batch *b = NULL;
    for (;;) {
        ZB_ASSERT_OK(zb_loader_next(ld, &b));
        if (!b) break;
        zb_batch_view dense;
        ZB_ASSERT_OK(zb_batch_find(b, "X_dense", &dense));
        assert_int_equal(dense.row_shape[0], 5);
        for (size_t i = 0; i < zb_batch_size(b); i++, cells++) {
            uint64_t id = zb_batch_index(b)[i];
            expected_row(f, id, 0, false, want);
            for (size_t k = 0; k < 5; k++)
                assert_close(((const float *)dense.data)[i * 5 + k], want[cols[k]], "X_dense", id,
                             cols[k]);
        }
        zb_batch_free(b);
    }
    assert_int_equal(cells, NA + NB);
    zb_loader_close(ld);
    zb_sampler_free(s);
}

/* A densify column outside the genes, or given twice (it once came out as zeros at its first
 * place), ends the epoch with an error naming it; log1p of integer values is refused naming the
 * dtype. */
static void
test_bad_transforms(void **state)
{
    fixture *f = *state;
    const uint64_t outside[2] = {3, NVARS};
    const uint64_t twice[4] = {3, 7, 1, 7};
    const struct {
        const uint64_t *cols;
        zb_status want;
        const char *msg;
    } bad[2] = {{outside, ZB_E_RANGE, "column 23 outside [0, 23)"},
                {twice, ZB_E_INVALID, "column 7 is given twice (positions 1 and 3)"}};
    zb_sampler *s = NULL;
    zb_loader *ld = NULL;
    zb_batch *b = NULL;
    for (size_t i = 0; i < 2; i++) {
        zb_transform t = {
            .kind = ZB_TRANSFORM_DENSIFY, .columns = bad[i].cols, .ncolumns = i ? 4 : 2};
        ld = open_loader(f, &s, &t, 1, 1);
        ZB_ASSERT_ERR(zb_loader_next(ld, &b), bad[i].want, bad[i].msg);
        assert_null(b);
        zb_loader_close(ld);
        zb_sampler_free(s);
    }

    /* the same counts stored as int32 (read as stored) */
    zb_anndata_writer *w = NULL;
    zb_anndata_write_opts wo = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    ZB_ASSERT_OK(
        zb_anndata_writer_open(f->store, "ints", NVARS, ZB_ANNDATA_X_CSR, ZB_DT_INT32, &wo, &w));
    int32_t *counts = malloc((size_t)f->a.indptr[NA] * sizeof *counts);
    for (int64_t k = 0; k < f->a.indptr[NA]; k++) counts[k] = (int32_t)f->a.data[k];
    ZB_ASSERT_OK(zb_anndata_writer_append_csr(w, NA, f->a.indptr, f->a.indices, counts));
    free(counts);
    ZB_ASSERT_OK(zb_anndata_writer_commit(w));
    zb_anndata_writer_close(w);
    zb_dataset_opts o = ZB_DATASET_OPTS_DEFAULT;
    zb_dataset *ints = NULL;
    ZB_ASSERT_OK(zb_dataset_open(f->store, "ints", &o, &ints));
    zb_sampler_opts so = ZB_SAMPLER_OPTS_DEFAULT;
    so.n = NA;
    so.batch_size = 8;
    ZB_ASSERT_OK(zb_sampler_new_sequential(&so, &s));
    zb_transform lg = {.kind = ZB_TRANSFORM_LOG1P};
    zb_loader_opts lo = ZB_LOADER_OPTS_DEFAULT;
    lo.transforms = &lg;
    lo.ntransforms = 1;
    ZB_ASSERT_OK(zb_loader_open(ints, s, &lo, &ld));
    ZB_ASSERT_ERR(zb_loader_next(ld, &b), ZB_E_TYPE, "log1p needs float X/data, not int32");
    zb_loader_close(ld);
    zb_sampler_free(s);
    zb_dataset_close(ints);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normalize_log1p_densify),
        cmocka_unit_test(test_densify_columns),
        cmocka_unit_test(test_bad_transforms),
    };
    return ZBT_RUN_GROUP(tests, setup, teardown);
}
