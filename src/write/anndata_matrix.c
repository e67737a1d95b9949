/* The anndata writer's matrices: X (CSR or dense) and the CSR layers, each streamed row block by
 * row block. A CSR matrix is three arrays below its group (FORMATS.md §6): data [nnz] (the
 * matrix's dtype), indices [nnz] (column ids: int32, or the narrow unsigned type of
 * zb_anndata_write_opts.narrow_indices) and indptr [rows+1] (int64); the arrays carry no
 * encoding attributes, the group (written at commit) carries the shape. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/status.h"
#include "write/anndata_int.h"

/* Opens the three arrays of a CSR matrix at `rel` ("X", "layers/NAME"). They take X's chunking
 * in elements when X is CSR; with a dense X (whose x_chunk and x_shard count rows) a layer gets
 * ZB_ANNDATA_DEFAULT_X_CHUNK elements per chunk and no shards. */
static zb_status
open_csr(zb_anndata_writer *w, const char *rel, zb__ad_csr *m)
{
    bool csr_x = w->x_kind == ZB_ANNDATA_X_CSR;
    uint64_t chunk = csr_x && w->x_chunk ? w->x_chunk : ZB_ANNDATA_DEFAULT_X_CHUNK;
    uint64_t shard = csr_x ? w->x_shard : 0;
    char sub[ZB_AD_REL_CAP + 16];
    /* the arrays inside a sparse group carry no encoding attributes (FORMATS.md §6) */
    snprintf(sub, sizeof sub, "%s/data", rel);
    ZB_TRY(zb__ad_open_array(w, sub, zb_anndata_csr_codec(w->codec, m->dtype), m->dtype, 1, NULL,
                             chunk, shard, w->num_threads, NULL, &m->data));
    snprintf(sub, sizeof sub, "%s/indices", rel);
    ZB_TRY(zb__ad_open_array(w, sub, zb_anndata_csr_codec(w->codec, w->index_dtype), w->index_dtype,
                             1, NULL, chunk, shard, w->num_threads, NULL, &m->indices));
    snprintf(sub, sizeof sub, "%s/indptr", rel);
    ZB_TRY(zb__ad_open_array(w, sub, w->codec, ZB_DT_INT64, 1, NULL,
                             zb__ad_column_chunk(w, ZB_ANNDATA_OBS), 0, 1, NULL, &m->indptr));
    int64_t zero = 0;
    return zb_array_writer_append(m->indptr, &zero, 1);
}

zb_status
zb__ad_open_x(zb_anndata_writer *w)
{
    if (w->x_kind == ZB_ANNDATA_X_DENSE) {
        char attrs[128];
        zb__ad_encoding_attrs(attrs, sizeof attrs, "array", "0.2.0");
        uint64_t row[1] = {w->n_vars};
        return zb__ad_open_array(w, "X", w->codec, w->x_dtype, 2, row, w->x_chunk, w->x_shard,
                                 w->num_threads, attrs, &w->dense);
    }
    w->x.dtype = w->x_dtype;
    return open_csr(w, "X", &w->x);
}

static void
free_csr(zb__ad_csr *m)
{
    zb_array_writer_close(m->data);
    zb_array_writer_close(m->indices);
    zb_array_writer_close(m->indptr);
    free(m->name);
}

void
zb__ad_free_matrices(zb_anndata_writer *w)
{
    zb_array_writer_close(w->dense);
    free_csr(&w->x);
    for (size_t i = 0; i < w->nlayers; i++) free_csr(&w->layers[i]);
    free(w->layers);
}

/* ---------------------------------------------------------------------------------------------
 * Appending rows
 * ------------------------------------------------------------------------------------------- */

/* Checks a block of `nrows` rows for matrix `m` (`what` prefixes messages): indptr
 * non-negative and non-decreasing, every column id in [0, n_vars), the element count within
 * 2^63. Nothing of the block is written unless all of it is valid. *k is its element count. */
static zb_status
check_csr_block(const zb_anndata_writer *w, const zb__ad_csr *m, const char *what, uint64_t nrows,
                const int64_t *indptr, const int32_t *indices, const void *data, uint64_t *k)
{
    *k = 0;
    if (nrows == 0) return ZB_OK;
    if (!indptr) return zb__err(ZB_E_INVALID, "%s: null indptr", what);
    if (indptr[0] < 0)
        return zb__err(ZB_E_INVALID, "%s: indptr[0] = %" PRId64 " is negative", what, indptr[0]);
    for (uint64_t r = 0; r < nrows; r++)
        if (indptr[r + 1] < indptr[r])
            return zb__err(ZB_E_INVALID,
                           "%s: indptr decreases at row %" PRIu64 " of the block (%" PRId64
                           " after %" PRId64 ")",
                           what, r, indptr[r + 1], indptr[r]);
    uint64_t n = (uint64_t)(indptr[nrows] - indptr[0]);
    uint64_t total;
    if (!zb__add_u64(m->nnz, n, &total) || total > (uint64_t)INT64_MAX)
        return zb__err(ZB_E_OVERFLOW, "%s: more than 2^63 stored elements", what);
    if (n && (!indices || !data))
        return zb__err(ZB_E_INVALID, "%s: null indices or data for %" PRIu64 " elements", what, n);
    uint64_t r = 0;
    for (uint64_t e = 0; e < n; e++) {
        if ((uint64_t)indices[e] < w->n_vars) continue; /* negative ids wrap and fail too */
        while (r + 1 < nrows && (uint64_t)(indptr[r + 1] - indptr[0]) <= e) r++;
        return zb__err(ZB_E_INVALID,
                       "%s: column id %" PRId32 " of element %" PRIu64 " (row %" PRIu64
                       " of the block) is outside [0, %" PRIu64 ")",
                       what, indices[e], e, r, w->n_vars);
    }
    *k = n;
    return ZB_OK;
}

/* Appends `n` column ids in the stored index type, narrowing them ZB_AD_STEP at a time (they
 * were checked to lie in [0, n_vars), so every narrow type holds them). */
static zb_status
append_indices(zb_anndata_writer *w, zb_array_writer *a, const int32_t *indices, uint64_t n)
{
    if (w->index_dtype == ZB_DT_INT32) return zb_array_writer_append(a, indices, n);
    for (uint64_t i0 = 0; i0 < n; i0 += ZB_AD_STEP) {
        uint64_t m = n - i0 < ZB_AD_STEP ? n - i0 : ZB_AD_STEP;
        const int32_t *src = indices + i0;
        void *dst = w->scratch;
        for (uint64_t i = 0; i < m; i++) {
            switch (w->index_dtype) {
            case ZB_DT_UINT8:
                ((uint8_t *)dst)[i] = (uint8_t)src[i];
                break;
            case ZB_DT_UINT16:
                ((uint16_t *)dst)[i] = (uint16_t)src[i];
                break;
            default:
                ((uint32_t *)dst)[i] = (uint32_t)src[i];
                break;
            }
        }
        ZB_TRY(zb_array_writer_append(a, dst, m));
    }
    return ZB_OK;
}

/* Writes a checked block of k elements: indices, data, then indptr rebased onto the elements
 * already written, ZB_AD_STEP entries at a time. A failure here is a write failure. */
static zb_status
write_csr_block(zb_anndata_writer *w, zb__ad_csr *m, uint64_t nrows, const int64_t *indptr,
                const int32_t *indices, const void *data, uint64_t k)
{
    if (nrows == 0) return ZB_OK;
    zb_status st = append_indices(w, m->indices, indices, k);
    if (st == ZB_OK) st = zb_array_writer_append(m->data, data, k);
    for (uint64_t r0 = 0; st == ZB_OK && r0 < nrows; r0 += ZB_AD_STEP) {
        uint64_t n = nrows - r0 < ZB_AD_STEP ? nrows - r0 : ZB_AD_STEP;
        for (uint64_t i = 0; i < n; i++)
            w->scratch[i] = (int64_t)m->nnz + (indptr[r0 + i + 1] - indptr[0]);
        st = zb_array_writer_append(m->indptr, w->scratch, n);
    }
    if (st != ZB_OK) return zb__ad_broken(w, st);
    m->nnz += k;
    m->rows += nrows;
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_csr(zb_anndata_writer *w, uint64_t nrows, const int64_t *indptr,
                             const int32_t *indices, const void *data)
{
    ZB_TRY(zb__ad_usable(w, "append_csr"));
    if (w->x_kind != ZB_ANNDATA_X_CSR)
        return zb__err(ZB_E_TYPE, "append_csr: X is dense (use append_dense)");
    uint64_t k;
    ZB_TRY(check_csr_block(w, &w->x, "append_csr", nrows, indptr, indices, data, &k));
    ZB_TRY(write_csr_block(w, &w->x, nrows, indptr, indices, data, k));
    w->rows = w->x.rows;
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_dense(zb_anndata_writer *w, uint64_t nrows, const void *rows)
{
    ZB_TRY(zb__ad_usable(w, "append_dense"));
    if (w->x_kind != ZB_ANNDATA_X_DENSE)
        return zb__err(ZB_E_TYPE, "append_dense: X is CSR (use append_csr)");
    if (nrows == 0) return ZB_OK;
    if (!rows && w->n_vars) return zb__err(ZB_E_INVALID, "append_dense: null rows");
    ZB_TRY(zb__ad_broken(w, zb_array_writer_append(w->dense, rows, nrows)));
    w->rows += nrows;
    return ZB_OK;
}

static zb__ad_csr *
find_layer(zb_anndata_writer *w, const char *name)
{
    for (size_t i = 0; i < w->nlayers; i++)
        if (!strcmp(w->layers[i].name, name)) return &w->layers[i];
    return NULL;
}

/* Creates layer `name` (its arrays opened, nothing written yet). */
static zb_status
new_layer(zb_anndata_writer *w, const char *name, zb_dtype dtype, zb__ad_csr **out)
{
    if (w->nlayers == w->cap_layers) {
        size_t cap = w->cap_layers ? 2 * w->cap_layers : 4;
        zb__ad_csr *p = realloc(w->layers, cap * sizeof *p);
        if (!p) return zb__err(ZB_E_NOMEM, "layers/%s: out of memory", name);
        w->layers = p;
        w->cap_layers = cap;
    }
    zb__ad_csr *m = &w->layers[w->nlayers];
    memset(m, 0, sizeof *m);
    m->dtype = dtype;
    m->name = strdup(name);
    if (!m->name) return zb__err(ZB_E_NOMEM, "layers/%s: out of memory", name);
    w->nlayers++;
    char rel[ZB_AD_REL_CAP];
    snprintf(rel, sizeof rel, "layers/%s", name);
    zb_status st = open_csr(w, rel, m);
    if (st != ZB_OK) {
        /* its nodes may be recorded already: the writer cannot commit consistently */
        free_csr(&w->layers[--w->nlayers]);
        return zb__ad_broken(w, st);
    }
    *out = m;
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_layer_csr(zb_anndata_writer *w, const char *name, zb_dtype dtype,
                                   uint64_t nrows, const int64_t *indptr, const int32_t *indices,
                                   const void *data)
{
    ZB_TRY(zb__ad_usable(w, "append_layer_csr"));
    ZB_TRY(zb__ad_check_name("layers", name));
    if ((int)dtype < 0 || dtype >= ZB_DT_COUNT_ || dtype == ZB_DT_STRING)
        return zb__err(ZB_E_INVALID, "layers/%s: a layer needs a fixed-size dtype", name);
    if (w->n_vars > INT32_MAX)
        return zb__err(ZB_E_INVALID, "layers/%s: n_vars %" PRIu64 " does not fit int32 column ids",
                       name, w->n_vars);
    zb__ad_csr *m = find_layer(w, name);
    if (m && m->dtype != dtype)
        return zb__err(ZB_E_TYPE, "layers/%s: the layer exists with dtype %s, not %s", name,
                       zb_dtype_name(m->dtype), zb_dtype_name(dtype));
    char what[ZB_AD_REL_CAP];
    snprintf(what, sizeof what, "layers/%s", name);
    /* a refused first block creates no layer */
    zb__ad_csr probe = {.dtype = dtype};
    uint64_t k;
    ZB_TRY(check_csr_block(w, m ? m : &probe, what, nrows, indptr, indices, data, &k));
    if (!m) ZB_TRY(new_layer(w, name, dtype, &m));
    return write_csr_block(w, m, nrows, indptr, indices, data, k);
}

/* ---------------------------------------------------------------------------------------------
 * Commit
 * ------------------------------------------------------------------------------------------- */

zb_status
zb__ad_check_layers(const zb_anndata_writer *w)
{
    for (size_t i = 0; i < w->nlayers; i++)
        if (w->layers[i].rows != w->rows)
            return zb__err(ZB_E_INVALID,
                           "layers/%s: %" PRIu64 " rows, n_obs (rows of X) is %" PRIu64,
                           w->layers[i].name, w->layers[i].rows, w->rows);
    return ZB_OK;
}

static zb_status
commit_csr(zb__ad_csr *m)
{
    ZB_TRY(zb_array_writer_commit(m->data));
    ZB_TRY(zb_array_writer_commit(m->indices));
    return zb_array_writer_commit(m->indptr);
}

zb_status
zb__ad_commit_matrices(zb_anndata_writer *w)
{
    if (w->x_kind == ZB_ANNDATA_X_DENSE)
        ZB_TRY(zb_array_writer_commit(w->dense));
    else
        ZB_TRY(commit_csr(&w->x));
    for (size_t i = 0; i < w->nlayers; i++) ZB_TRY(commit_csr(&w->layers[i]));
    return ZB_OK;
}

static zb_status
write_csr_group(zb_anndata_writer *w, const char *rel)
{
    char attrs[256];
    snprintf(attrs, sizeof attrs,
             "{\"encoding-type\": \"csr_matrix\", \"encoding-version\": \"0.1.0\", "
             "\"shape\": [%" PRIu64 ", %" PRIu64 "]}",
             w->rows, w->n_vars);
    return zb__ad_write_group(w, rel, attrs);
}

zb_status
zb__ad_write_matrix_groups(zb_anndata_writer *w)
{
    if (w->x_kind == ZB_ANNDATA_X_CSR) ZB_TRY(write_csr_group(w, "X"));
    for (size_t i = 0; i < w->nlayers; i++) {
        char rel[ZB_AD_REL_CAP];
        snprintf(rel, sizeof rel, "layers/%s", w->layers[i].name);
        ZB_TRY(write_csr_group(w, rel));
    }
    return ZB_OK;
}
