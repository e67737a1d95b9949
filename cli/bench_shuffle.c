/* Shuffle quality for `zbatch bench` (see bench_common.h): how well the batches a sampler
 * produced mix a categorical column, next to batches of uniformly random ids, and how far apart
 * neighbouring ids within a batch are. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "dataset/dataset.h"
#include "util/status.h"

#define READ_ROWS 65536      /* physical rows read per block */
#define MAX_CODES (1u << 24) /* histogram bound: a column with a wider range is refused */
#define MIN_REF_BATCHES 256  /* reference batches, at least (the figure's noise) */

static bool
integer_dtype(zb_dtype t)
{
    return t == ZB_DT_INT8 || t == ZB_DT_INT16 || t == ZB_DT_INT32 || t == ZB_DT_INT64 ||
           t == ZB_DT_UINT8 || t == ZB_DT_UINT16 || t == ZB_DT_UINT32 || t == ZB_DT_UINT64 ||
           t == ZB_DT_BOOL;
}

static int64_t
value_at(const uint8_t *p, zb_dtype t)
{
    switch (t) {
    case ZB_DT_BOOL:
    case ZB_DT_UINT8:
        return *p;
    case ZB_DT_INT8:
        return *(const int8_t *)p;
    case ZB_DT_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case ZB_DT_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case ZB_DT_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case ZB_DT_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case ZB_DT_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    default: {
        uint64_t v;
        memcpy(&v, p, 8);
        return v > INT64_MAX ? INT64_MAX : (int64_t)v;
    }
    }
}

/* Reads field f's value of every logical sample [0, n) of one (non-collection) dataset into
 * out[], block by block of physical rows (the mask keeps physical rows increasing). */
static zb_status
read_child(zb_dataset *ds, size_t f, uint64_t n, int64_t *out)
{
    const zb__field *fd = &ds->fields[f];
    size_t isz = fd->itemsize;
    uint8_t *buf = malloc(READ_ROWS * isz);
    if (!buf) return zb__err(ZB_E_NOMEM, "bench: out of memory");
    uint64_t b0 = 0, b1 = 0, rows = fd->arr->meta.shape[0];
    zb_status st = ZB_OK;
    for (uint64_t i = 0; i < n && st == ZB_OK; i++) {
        uint64_t p = zb__mask_select(&ds->mask, i);
        if (p >= rows) {
            st = zb__err(ZB_E_CORRUPT, "%s: sample row %llu past its %llu rows", fd->arr->path,
                         (unsigned long long)p, (unsigned long long)rows);
            break;
        }
        if (p < b0 || p >= b1) {
            b0 = p;
            b1 = p + READ_ROWS < rows ? p + READ_ROWS : rows;
            st = zb_array_read_rows(fd->arr, b0, b1, buf, (size_t)(b1 - b0) * isz, NULL);
        }
        if (st == ZB_OK) out[i] = value_at(buf + (p - b0) * isz, fd->dtype);
    }
    free(buf);
    return st;
}

zb_status
zb__bench_codes_read(zb_dataset *ds, const char *field, zb__bench_codes *out)
{
    memset(out, 0, sizeof *out);
    size_t f = 0;
    ZB_TRY(zb_dataset_find_field(ds, field, &f));
    const zb_dataset *pr = ds->nchildren ? ds->children[0] : ds;
    const zb__field *fd = &pr->fields[f];
    if (fd->kind != ZB_FIELD_PER_SAMPLE || fd->ndim != 0 || !integer_dtype(fd->dtype))
        return zb__err(ZB_E_TYPE,
                       "%s: the shuffle column must be a per-sample integer scalar "
                       "(categorical codes)",
                       field);
    uint64_t n = 0;
    ZB_TRY(zb_dataset_len(ds, &n));
    int64_t *raw = malloc((size_t)n * sizeof *raw + 1);
    if (!raw)
        return zb__err(ZB_E_NOMEM, "bench: out of memory for %llu codes", (unsigned long long)n);
    zb_status st = ZB_OK;
    if (ds->nchildren) {
        for (size_t c = 0; c < ds->nchildren && st == ZB_OK; c++) {
            zb_dataset *ch = ds->children[c];
            st = zb__mask_load(ch);
            if (st == ZB_OK)
                st = read_child(ch, f, ds->child_start[c + 1] - ds->child_start[c],
                                raw + ds->child_start[c]);
        }
    } else {
        st = read_child(ds, f, n, raw);
    }
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    bool negative = false;
    for (uint64_t i = 0; st == ZB_OK && i < n; i++) {
        if (raw[i] < 0) {
            negative = true;
            continue;
        }
        if (raw[i] < lo) lo = raw[i];
        if (raw[i] > hi) hi = raw[i];
    }
    uint64_t ncodes = lo <= hi ? (uint64_t)(hi - lo) + 1 : 0;
    if (negative) ncodes++;
    if (st == ZB_OK && ncodes > MAX_CODES)
        st = zb__err(ZB_E_TYPE, "%s: values span %llu codes (at most %u)", field,
                     (unsigned long long)ncodes, MAX_CODES);
    if (st == ZB_OK) {
        out->code = malloc((size_t)n * sizeof *out->code + 1);
        if (!out->code) st = zb__err(ZB_E_NOMEM, "bench: out of memory for codes");
    }
    if (st == ZB_OK) {
        /* "missing" (negative) codes share the last value */
        for (uint64_t i = 0; i < n; i++)
            out->code[i] = raw[i] < 0 ? (uint32_t)(ncodes - 1) : (uint32_t)(raw[i] - lo);
        out->n = n;
        out->ncodes = (uint32_t)ncodes;
    }
    free(raw);
    if (st != ZB_OK) zb__bench_codes_free(out);
    return st;
}

void
zb__bench_codes_free(zb__bench_codes *c)
{
    free(c->code);
    memset(c, 0, sizeof *c);
}

/* ---- figures -------------------------------------------------------------------------------- */

static uint64_t
splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct acc {
    double entropy, gap;
    uint64_t nent, ngap;
} acc;

/* Adds one batch's entropy (bits of the empirical code distribution) and mean neighbour gap.
 * `hist` has ncodes zeroed counters and is left zeroed. */
static void
measure_batch(const uint64_t *ids, size_t B, const zb__bench_codes *codes, uint32_t *hist, acc *a)
{
    if (!B) return;
    if (codes) {
        for (size_t i = 0; i < B; i++) hist[codes->code[ids[i]]]++;
        double h = 0;
        for (size_t i = 0; i < B; i++) {
            uint32_t *c = &hist[codes->code[ids[i]]];
            if (!*c) continue;
            double p = (double)*c / (double)B;
            h -= p * log2(p);
            *c = 0;
        }
        a->entropy += h;
        a->nent++;
    }
    if (B >= 2) {
        double g = 0;
        for (size_t i = 0; i + 1 < B; i++)
            g += (double)(ids[i + 1] > ids[i] ? ids[i + 1] - ids[i] : ids[i] - ids[i + 1]);
        a->gap += g / (double)(B - 1);
        a->ngap++;
    }
}

zb_status
zb__bench_shuffle_measure(const uint64_t *ids, const size_t *off, size_t nbatches, uint64_t n,
                          const zb__bench_codes *codes, uint64_t seed, size_t max_ref,
                          zb__bench_shuffle *out)
{
    out->entropy = out->random_entropy = NAN;
    out->gap_score = out->random_gap_score = NAN;
    out->batches = nbatches;
    out->random_batches = 0;
    if (!nbatches || !n) return ZB_OK;
    size_t maxb = 0;
    for (size_t b = 0; b < nbatches; b++)
        if (off[b + 1] - off[b] > maxb) maxb = off[b + 1] - off[b];
    uint32_t *hist = codes ? calloc(codes->ncodes + 1, sizeof *hist) : NULL;
    uint64_t *ref = malloc((maxb + 1) * sizeof *ref);
    if ((codes && !hist) || !ref) {
        free(hist);
        free(ref);
        return zb__err(ZB_E_NOMEM, "bench: out of memory");
    }
    double expected_gap = (double)n / 3.0;
    acc a = {0};
    for (size_t b = 0; b < nbatches; b++)
        measure_batch(ids + off[b], off[b + 1] - off[b], codes, hist, &a);
    if (a.nent) out->entropy = a.entropy / (double)a.nent;
    if (a.ngap) out->gap_score = a.gap / (double)a.ngap / expected_gap;

    size_t nref = nbatches < MIN_REF_BATCHES ? MIN_REF_BATCHES : nbatches;
    if (nref > max_ref) nref = max_ref;
    uint64_t x = seed ^ 0x243F6A8885A308D3ull; /* a stream apart from the samplers' keys */
    acc r = {0};
    for (size_t k = 0; k < nref; k++) {
        size_t B = off[k % nbatches + 1] - off[k % nbatches];
        /* uniform in [0, n): the modulo bias is below n / 2^64 */
        for (size_t i = 0; i < B; i++) ref[i] = splitmix64(&x) % n;
        measure_batch(ref, B, codes, hist, &r);
    }
    out->random_batches = nref;
    if (r.nent) out->random_entropy = r.entropy / (double)r.nent;
    if (r.ngap) out->random_gap_score = r.gap / (double)r.ngap / expected_gap;
    free(hist);
    free(ref);
    return ZB_OK;
}
