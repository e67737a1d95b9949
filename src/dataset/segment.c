/* Segments (pointer arrays read lazily by chunk) and soft-delete masks. */
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "util/intload.h"
#include "util/status.h"
#include "util/search.h"

static zb_status
load_block(zb__segment *seg, zb_ctx *ctx, uint64_t b)
{
    const zb_array *a = seg->ptr;
    uint64_t total = a->meta.shape[0];
    uint64_t r0 = b * seg->chunk_rows, r1 = r0 + seg->chunk_rows;
    if (r1 > total) r1 = total;
    uint64_t n = r1 - r0;
    size_t isz = a->meta.itemsize;
    uint8_t *raw = malloc((size_t)(n * isz) + 1);
    int64_t *vals = malloc((size_t)(n * sizeof(int64_t)) + 1);
    if (!raw || !vals) {
        free(raw);
        free(vals);
        return zb__err(ZB_E_NOMEM, "%s: out of memory for pointer block", a->path);
    }
    zb_status st = zb_array_read_rows(a, r0, r1, raw, (size_t)(n * isz), ctx);
    if (st != ZB_OK) {
        free(raw);
        free(vals);
        return st;
    }
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *p = raw + i * isz;
        int64_t v;
        if (a->meta.dtype == ZB_DT_BOOL || !zb__load_int(p, a->meta.dtype, &v)) {
            uint64_t t = 0;
            if (a->meta.dtype == ZB_DT_UINT64) memcpy(&t, p, 8); /* before raw goes */
            free(raw);
            free(vals);
            if (a->meta.dtype == ZB_DT_UINT64)
                return zb__err(ZB_E_CORRUPT, "%s: pointer %llu at row %llu exceeds int64", a->path,
                               (unsigned long long)t, (unsigned long long)(r0 + i));
            return zb__err(ZB_E_TYPE, "%s: a pointer array must be integer, not %s", a->path,
                           zb_dtype_name(a->meta.dtype));
        }
        vals[i] = v;
    }
    free(raw);
    seg->blocks[b] = vals;
    return ZB_OK;
}

zb_status
zb__segment_get(zb__segment *seg, zb_ctx *ctx, uint64_t i, int64_t *value)
{
    uint64_t total = seg->ptr->meta.shape[0];
    if (i >= total)
        return zb__err(ZB_E_RANGE, "%s: pointer %llu outside [0, %llu)", seg->ptr->path,
                       (unsigned long long)i, (unsigned long long)total);
    uint64_t b = i / seg->chunk_rows;
    zb_status st = ZB_OK;
    pthread_mutex_lock(&seg->mu);
    if (!seg->blocks[b]) st = load_block(seg, ctx, b);
    if (st == ZB_OK) *value = seg->blocks[b][i - b * seg->chunk_rows];
    pthread_mutex_unlock(&seg->mu);
    return st;
}

/* ---- masks -------------------------------------------------------------------------------- */

/* Samples per rank entry: a select scans at most this many mask bytes (8 bytes of rank per
 * 256 samples). A block with every sample kept is not scanned at all. */
#define MASK_BLOCK 256

zb_status
zb__mask_load(zb_dataset *ds)
{
    zb__mask *m = &ds->mask;
    if (!m->arr) return ZB_OK;
    zb_status st = ZB_OK;
    pthread_mutex_lock(&m->mu);
    if (m->loaded) goto out;
    uint64_t n = ds->nphys; /* entries past the committed samples are ignored */
    if (m->arr->meta.itemsize != 1) {
        st = zb__err(ZB_E_TYPE, "%s: a mask must be bool", m->arr->path);
        goto out;
    }
    uint64_t nblocks = (n + MASK_BLOCK - 1) / MASK_BLOCK;
    m->bits = malloc((size_t)n + 1);
    m->rank = calloc((size_t)nblocks + 1, sizeof *m->rank);
    if (!m->bits || !m->rank) {
        st = zb__err(ZB_E_NOMEM, "%s: out of memory for the mask", m->arr->path);
        goto out;
    }
    st = zb_array_read_rows(m->arr, 0, n, m->bits, (size_t)n, NULL);
    if (st != ZB_OK) goto out;
    uint64_t count = 0;
    for (uint64_t b = 0; b < nblocks; b++) {
        m->rank[b] = count;
        uint64_t e = (b + 1) * MASK_BLOCK < n ? (b + 1) * MASK_BLOCK : n;
        for (uint64_t i = b * MASK_BLOCK; i < e; i++) count += m->bits[i] != 0;
    }
    m->rank[nblocks] = count;
    m->nlogical = count;
    m->n = n;
    m->loaded = true;
out:
    if (st != ZB_OK) {
        free(m->bits);
        free(m->rank);
        m->bits = NULL;
        m->rank = NULL;
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

uint64_t
zb__mask_select(const zb__mask *m, uint64_t logical)
{
    if (!m->arr) return logical;
    /* the block holding the logical-th true: the last block whose rank is <= logical */
    uint64_t n = m->n;
    uint64_t nblocks = (n + MASK_BLOCK - 1) / MASK_BLOCK;
    uint64_t lo = zb__last_le(m->rank, (size_t)nblocks, logical);
    uint64_t need = logical - m->rank[lo];
    uint64_t start = lo * MASK_BLOCK, len = n - start < MASK_BLOCK ? n - start : MASK_BLOCK;
    if (m->rank[lo + 1] - m->rank[lo] == len) return start + need; /* nothing deleted here */
    for (uint64_t i = start; i < n; i++) {
        if (m->bits[i]) {
            if (need == 0) return i;
            need--;
        }
    }
    return n; /* not reached for logical < nlogical */
}
