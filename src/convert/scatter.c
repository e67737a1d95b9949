/* The scatter phase (zbatch_convert.h): one task per slice of an input's rows. The task reads
 * its cells (matrices, obs columns, names), gives each its output position, remaps genes and
 * category codes to the output's tables, converts values to the output types, and writes the
 * cells sorted by position as one scratch file with a section per output dataset (the format
 * is described in convert_int.h). The file is the task's only output and appears by rename,
 * so a killed task leaves nothing behind. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert_int.h"
#include "util/buf.h"
#include "util/status.h"

size_t
cv_arrays(const zb_convert *cv, cv_array *out, size_t *col_start)
{
    size_t n = 0;
    out[n++] = (cv_array){8, -1}; /* row in the dataset */
    out[n++] = (cv_array){8, -1}; /* row in the input */
    out[n++] = (cv_array){4, -1}; /* name lengths */
    out[n++] = (cv_array){1, CV_A_NAME_LEN};
    for (size_t j = 0; j < cv->n_mats; j++) {
        int nnz = (int)n;
        out[n++] = (cv_array){4, -1};
        if (cv->direct) { /* the row's first element in the input and its elements there */
            out[n++] = (cv_array){8, -1};
            out[n++] = (cv_array){4, -1};
            continue;
        }
        out[n++] = (cv_array){4, nnz};
        out[n++] = (cv_array){zb_dtype_size(cv->mat_dtypes[j]), nnz};
    }
    for (size_t c = 0; c < cv->n_cols; c++) {
        const cv_column *col = &cv->cols[c];
        col_start[c] = n;
        if (col->kind == ZB_COL_CATEGORICAL) {
            out[n++] = (cv_array){4, -1};
        } else if (col->dtype == ZB_DT_STRING) {
            int lens = (int)n;
            out[n++] = (cv_array){4, -1};
            out[n++] = (cv_array){1, lens};
        } else {
            out[n++] = (cv_array){zb_dtype_size(col->dtype), -1};
        }
        if (col->kind == ZB_COL_NULLABLE) out[n++] = (cv_array){1, -1};
    }
    return n;
}

/* ---- sorting ------------------------------------------------------------------------------------ */

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts keys (gene << 32 | position) by gene: LSD radix on the gene's bytes, skipping bytes
 * that are equal everywhere (two passes for the usual < 65,536 genes). */
void
cv_sort_by_gene(uint64_t *keys, uint64_t *tmp, size_t n)
{
    if (n < 32) { /* insertion sort: rows this short are common and cheap */
        for (size_t i = 1; i < n; i++) {
            uint64_t k = keys[i];
            size_t j = i;
            for (; j > 0 && (keys[j - 1] >> 32) > (k >> 32); j--) keys[j] = keys[j - 1];
            keys[j] = k;
        }
        return;
    }
    uint64_t all_or = 0;
    for (size_t i = 0; i < n; i++) all_or |= keys[i];
    for (int shift = 32; shift < 64; shift += 8) {
        if (!((all_or >> shift) & 0xff)) continue;
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++) count[((keys[i] >> shift) & 0xff) + 1]++;
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (size_t i = 0; i < n; i++) tmp[count[(keys[i] >> shift) & 0xff]++] = keys[i];
        memcpy(keys, tmp, n * sizeof *keys);
    }
}

/* ---- the task's state --------------------------------------------------------------------------- */

typedef struct scatter {
    zb_convert *cv;
    cv_ws *ws; /* every buffer below lives in it */
    size_t t, n_arrays, col_start[CV_MAX_ARRAYS];
    cv_array arrays[CV_MAX_ARRAYS];
    cv_slice s;
    uint64_t n;          /* cells */
    zb__csr_block *mats; /* [n_mats] as read */
    zb__col_block *cols; /* [n_cols] as read */
    zb_strings names;
    uint64_t *order;   /* [2n]: (position, input index) pairs, then the input indices */
    uint64_t *pos;     /* [n]: the output position of each cell in sorted order */
    uint64_t *section; /* [n_datasets + 1]: first sorted cell of each dataset */
    unsigned char *buf[CV_MAX_ARRAYS]; /* the arrays, all sections */
    uint64_t count[CV_MAX_ARRAYS];     /* elements in each */
    uint64_t *starts[CV_MAX_ARRAYS];   /* count arrays' prefix sums [n + 1], by count array */
    bool index[CV_MAX_ARRAYS];         /* index arrays (cv_index_arrays) */
    cv_value_stats stats[65];          /* [n_mats] what the values are (dtypes.c) */
    bool folded[65]; /* [n_mats] the prepare task folded the input's values (prepare.c) */
} scatter;

static zb_status
grow(scatter *sc, size_t slot, uint64_t bytes, void *out)
{
    if (bytes > ZB_BUF_MAX)
        return zb__err(ZB_E_OVERFLOW, "a scatter task of %" PRIu64 " bytes", bytes);
    return cv_ws_grow(sc->ws, slot, (size_t)bytes, (void **)out);
}

static zb_status
read_cells(scatter *sc)
{
    zb_convert *cv = sc->cv;
    uint32_t k = sc->s.input;
    zb__src *src;
    ZB_TRY(cv_source(cv, k, &src));
    for (size_t j = 0; j < cv->n_mats && !cv->direct; j++) {
        zb__src_matrix *m;
        ZB_TRY(cv_matrix(cv, k, j, &m));
        ZB_TRY(zb__src_matrix_read(m, sc->s.start, sc->s.stop, &sc->mats[j]));
    }
    for (size_t c = 0; c < cv->n_cols; c++)
        ZB_TRY(zb__src_read_column(src, cv->cols[c].src_index[k], sc->s.start, sc->s.stop,
                                   &sc->cols[c]));
    return zb__src_read_obs_names(src, sc->s.start, sc->s.stop, &sc->names);
}

/* Output positions, the sorted order and where each dataset's section starts. */
static zb_status
sort_cells(scatter *sc)
{
    zb_convert *cv = sc->cv;
    uint64_t base = cv->inputs[sc->s.input].base + sc->s.start;
    ZB_TRY(grow(sc, CV_WS_ORDER, sc->n * 2 * sizeof *sc->order, &sc->order));
    ZB_TRY(grow(sc, CV_WS_POS, sc->n * sizeof *sc->pos, &sc->pos));
    ZB_TRY(grow(sc, CV_WS_SECTION, (cv->n_datasets + 1) * sizeof *sc->section, &sc->section));
    /* pairs (position, input index), sorted by position (positions are distinct) */
    uint64_t *pairs = sc->order;
    for (uint64_t i = 0; i < sc->n; i++) {
        uint64_t d, r;
        cv_position(cv, base + i, &d, &r);
        pairs[2 * i] = d * cv->dataset_size + r;
        pairs[2 * i + 1] = i;
    }
    qsort(pairs, (size_t)sc->n, 2 * sizeof *pairs, cmp_u64);
    for (uint64_t q = 0; q < sc->n; q++) {
        sc->pos[q] = pairs[2 * q];
        sc->order[q] = pairs[2 * q + 1];
    }
    /* section boundaries: first sorted cell of each dataset */
    uint64_t q = 0;
    for (uint64_t d = 0; d <= cv->n_datasets; d++) {
        while (q < sc->n && sc->pos[q] / cv->dataset_size < d) q++;
        sc->section[d] = q;
    }
    return ZB_OK;
}

static zb_status
alloc_array(scatter *sc, size_t a, uint64_t count)
{
    sc->count[a] = count;
    return grow(sc, a, count * sc->arrays[a].item + 1, &sc->buf[a]);
}

/* The fixed part: rows, input rows, names. */
static zb_status
fill_fixed(scatter *sc)
{
    uint64_t n = sc->n;
    const zb_strings *nm = &sc->names;
    ZB_TRY(alloc_array(sc, CV_A_ROW, n));
    ZB_TRY(alloc_array(sc, CV_A_SRC_ROW, n));
    ZB_TRY(alloc_array(sc, CV_A_NAME_LEN, n));
    ZB_TRY(alloc_array(sc, CV_A_NAME, nm->offsets[n] - nm->offsets[0]));
    uint64_t *row = (uint64_t *)sc->buf[CV_A_ROW], *src = (uint64_t *)sc->buf[CV_A_SRC_ROW];
    uint32_t *len = (uint32_t *)sc->buf[CV_A_NAME_LEN];
    char *bytes = (char *)sc->buf[CV_A_NAME];
    for (uint64_t q = 0; q < n; q++) {
        uint64_t i = sc->order[q];
        row[q] = sc->pos[q] % sc->cv->dataset_size;
        src[q] = sc->s.start + i;
        uint64_t l = nm->offsets[i + 1] - nm->offsets[i];
        if (l > UINT32_MAX) return zb__err(ZB_E_INVALID, "an obs name of %" PRIu64 " bytes", l);
        len[q] = (uint32_t)l;
        memcpy(bytes, nm->data + nm->offsets[i], (size_t)l);
        bytes += l;
    }
    return ZB_OK;
}

uint64_t
cv_remap_row(const cv_row_map *rm, const uint32_t *ids, const void *vals, uint64_t m,
             uint64_t *keys, unsigned char *raw, uint32_t *out_ids, void *out_vals)
{
    size_t in_item = zb_dtype_size(rm->from);
    if (rm->identity) { /* the same genes in the same order: the row is copied as it is */
        memcpy(out_ids, ids, (size_t)m * 4);
        cv_convert_values(out_vals, rm->to, vals, rm->from, m);
        return m;
    }
    uint64_t kept = 0;
    for (uint64_t e = 0; e < m; e++) {
        int32_t g = rm->map[ids[e]];
        if (g >= 0) keys[kept++] = (uint64_t)g << 32 | e;
    }
    if (!rm->monotone) cv_sort_by_gene(keys, keys + m, (size_t)kept);
    const unsigned char *row = vals;
    for (uint64_t x = 0; x < kept; x++) {
        out_ids[x] = (uint32_t)(keys[x] >> 32);
        memcpy(raw + x * in_item, row + (keys[x] & 0xffffffffu) * in_item, in_item);
    }
    cv_convert_values(out_vals, rm->to, raw, rm->from, kept);
    return kept;
}

/* Matrix j: each cell's elements with genes remapped (dropped genes left out), in gene order
 * when the map reorders them, values converted to the output dtype. */
static zb_status
fill_matrix(scatter *sc, size_t j)
{
    zb_convert *cv = sc->cv;
    const zb__csr_block *b = &sc->mats[j];
    const cv_in_matrix *im = &cv->inputs[sc->s.input].mats[j];
    cv_row_map rm = {NULL, im->identity, im->monotone, b->dtype, cv->mat_dtypes[j]};
    ZB_TRY(cv_gene_map(cv, sc->s.input, j, &rm.map));
    size_t a = cv_matrix_array(j);
    size_t in_item = zb_dtype_size(b->dtype), out_item = sc->arrays[a + 2].item;
    /* kept elements per cell, in sorted order */
    ZB_TRY(alloc_array(sc, a, sc->n));
    uint32_t *nnz = (uint32_t *)sc->buf[a];
    uint64_t total = 0, longest = 0;
    for (uint64_t q = 0; q < sc->n; q++) {
        uint64_t i = sc->order[q], kept = 0;
        if (rm.identity) kept = (uint64_t)(b->indptr[i + 1] - b->indptr[i]);
        for (int64_t e = b->indptr[i]; !rm.identity && e < b->indptr[i + 1]; e++)
            kept += rm.map[b->indices[e]] >= 0;
        nnz[q] = (uint32_t)kept;
        total += kept;
        uint64_t m = (uint64_t)(b->indptr[i + 1] - b->indptr[i]);
        if (m > longest) longest = m;
    }
    ZB_TRY(alloc_array(sc, a + 1, total));
    ZB_TRY(alloc_array(sc, a + 2, total));
    uint64_t *keys;
    unsigned char *raw;
    ZB_TRY(grow(sc, CV_WS_KEYS, (2 * longest + 1) * sizeof *keys, &keys));
    ZB_TRY(grow(sc, CV_WS_RAW, (longest + 1) * in_item, &raw));
    uint32_t *idx = (uint32_t *)sc->buf[a + 1];
    unsigned char *data = sc->buf[a + 2];
    const unsigned char *vals = b->data;
    for (uint64_t q = 0; q < sc->n; q++) {
        uint64_t i = sc->order[q], m = (uint64_t)(b->indptr[i + 1] - b->indptr[i]);
        uint64_t kept =
            cv_remap_row(&rm, b->indices + b->indptr[i], vals + (size_t)b->indptr[i] * in_item, m,
                         keys, raw, idx, data);
        idx += kept;
        data += kept * out_item;
    }
    return ZB_OK;
}

/* The error for a value that the explicit data dtype `asked` cannot hold: matrix j, input row
 * `row` (of the task's input), the value at `value` of `dtype`. */
static zb_status
misfit_error(const scatter *sc, size_t j, uint64_t row, const void *value, zb_dtype dtype,
             zb_dtype asked)
{
    const zb_convert *cv = sc->cv;
    double v = 0;
    cv_convert_values(&v, ZB_DT_FLOAT64, value, dtype, 1);
    return zb__err(ZB_E_INVALID,
                   "%s: %s, row %" PRIu64 ": the value %.17g is not an integer in "
                   "[0, %s], so %s cannot hold it exactly (choose a wider data dtype, or auto)",
                   cv->inputs[sc->s.input].path, cv->mat_keys[j], row, v,
                   asked == ZB_DT_UINT8 ? "255" : "65535", zb_dtype_name(asked));
}

/* What matrix j's values are, into the task's stats. An explicit uint8/uint16 that does not
 * hold one of them exactly fails the task, naming the first such value in input order: the
 * store is never written with values changed. */
static zb_status
check_values(scatter *sc, size_t j)
{
    zb_convert *cv = sc->cv;
    size_t a = cv_matrix_array(j);
    zb_dtype dtype = cv->mat_dtypes[j], asked = cv_explicit_dtype(cv->data_choice);
    const unsigned char *vals = sc->buf[a + 2];
    cv_stats_add(&sc->stats[j], vals, dtype, sc->count[a + 2]);
    if (asked == ZB_DT_COUNT_ || asked == ZB_DT_FLOAT32 || cv_stats_fit(&sc->stats[j], asked))
        return ZB_OK;
    /* the offender with the lowest input row (cells are in output order here) */
    const uint32_t *nnz = (const uint32_t *)sc->buf[a];
    size_t item = zb_dtype_size(dtype);
    uint64_t row = UINT64_MAX, at = 0, value_at = 0;
    for (uint64_t q = 0; q < sc->n; at += nnz[q++]) {
        if (sc->order[q] >= row) continue;
        uint64_t e = cv_first_misfit(vals + at * item, dtype, nnz[q], asked);
        if (e < nnz[q]) {
            row = sc->order[q];
            value_at = at + e;
        }
    }
    return misfit_error(sc, j, sc->s.start + row, vals + value_at * item, dtype, asked);
}

/* Matrix j on the direct path (the plan's "direct"; docs/CONVERT.md): the gather reads the rows
 * from the input itself, so the task only records where each cell's row lies — the elements
 * it keeps, its first element in the input and its elements there — and, when the stored type
 * depends on them, folds the kept values into the task's stats, checking them against an
 * explicit data dtype as check_values does. */
static zb_status
fill_matrix_direct(scatter *sc, size_t j)
{
    zb_convert *cv = sc->cv;
    uint32_t k = sc->s.input;
    const cv_in_matrix *im = &cv->inputs[k].mats[j];
    zb__src_matrix *m;
    ZB_TRY(cv_matrix(cv, k, j, &m));
    zb__src_raw raw;
    if (!zb__src_matrix_raw(m, &raw))
        return zb__err(ZB_E_CORRUPT,
                       "%s: %s is not stored as the plan found it (contiguous, "
                       "uncompressed)",
                       cv->inputs[k].path, cv->mat_keys[j]);
    const int32_t *map;
    ZB_TRY(cv_gene_map(cv, k, j, &map));
    zb_dtype from = zb__src_matrix_info_of(m)->dtype;
    size_t item = zb_dtype_size(from);
    uint64_t n = sc->n;
    int64_t *ptr;
    ZB_TRY(grow(sc, CV_WS_INDPTR, (n + 1) * 8, &ptr));
    ZB_TRY(zb__src_matrix_indptr(m, sc->s.start, sc->s.stop, ptr));
    uint64_t lo = (uint64_t)ptr[0], count = (uint64_t)ptr[n] - lo;
    /* the values matter only to a choice that depends on them (auto, uint8, uint16), and
     * only when the prepare task did not fold them already */
    bool values = cv->data_choice != ZB_CONVERT_DATA_KEEP &&
                  cv->data_choice != ZB_CONVERT_DATA_FLOAT32 && !sc->folded[j];
    unsigned char *vals = NULL;
    uint32_t *ids = NULL, *kept;
    if (values) ZB_TRY(grow(sc, CV_WS_RAW, count * item + 1, &vals));
    if (!im->identity) ZB_TRY(grow(sc, CV_WS_KEYS, count * 4 + 4, &ids));
    ZB_TRY(grow(sc, CV_WS_TEXT, n * 4 + 4, &kept));
    if (vals) ZB_TRY(zb__src_raw_read(raw.fd, raw.path, &raw.data, item, lo, count, vals));
    if (ids) ZB_TRY(zb__src_raw_read(raw.fd, raw.path, &raw.indices, 4, lo, count, ids));
    for (uint64_t e = 0; ids && e < count; e++)
        if (ids[e] >= im->n_cols)
            return zb__err(ZB_E_CORRUPT,
                           "%s: %s/indices: element %" PRIu64 ": index %" PRId32
                           " is outside [0, %" PRIu64 ")",
                           cv->inputs[k].path, cv->mat_keys[j], lo + e, (int32_t)ids[e],
                           im->n_cols);
    /* kept elements per cell in input order; the kept values packed in front for the stats */
    uint64_t w = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t b = (uint64_t)ptr[i] - lo, e = (uint64_t)ptr[i + 1] - lo, c = e - b;
        if (c > UINT32_MAX)
            return zb__err(ZB_E_UNSUPPORTED, "%s: %s, row %" PRIu64 ": %" PRIu64 " elements",
                           cv->inputs[k].path, cv->mat_keys[j], sc->s.start + i, c);
        if (!im->identity) {
            c = 0;
            for (uint64_t x = b; x < e; x++) {
                if (map[ids[x]] < 0) continue;
                if (vals) memmove(vals + (w + c) * item, vals + x * item, item);
                c++;
            }
        }
        kept[i] = (uint32_t)c;
        w += c;
    }
    if (vals) cv_stats_add(&sc->stats[j], vals, from, w);
    zb_dtype asked = cv_explicit_dtype(cv->data_choice);
    if (asked != ZB_DT_COUNT_ && asked != ZB_DT_FLOAT32 && !cv_stats_fit(&sc->stats[j], asked)) {
        for (uint64_t i = 0, at = 0; i < n; at += kept[i++]) {
            uint64_t e = cv_first_misfit(vals + at * item, from, kept[i], asked);
            if (e < kept[i])
                return misfit_error(sc, j, sc->s.start + i, vals + (at + e) * item, from, asked);
        }
    }
    size_t a = cv_matrix_array(j);
    ZB_TRY(alloc_array(sc, a, n));
    ZB_TRY(alloc_array(sc, a + 1, n));
    ZB_TRY(alloc_array(sc, a + 2, n));
    uint32_t *nnz = (uint32_t *)sc->buf[a], *len = (uint32_t *)sc->buf[a + 2];
    uint64_t *first = (uint64_t *)sc->buf[a + 1];
    for (uint64_t q = 0; q < n; q++) {
        uint64_t i = sc->order[q];
        nnz[q] = kept[i];
        first[q] = (uint64_t)ptr[i];
        len[q] = (uint32_t)(ptr[i + 1] - ptr[i]);
    }
    return ZB_OK;
}

/* Column c: values converted and permuted, codes remapped, strings, masks. */
static zb_status
fill_column(scatter *sc, size_t c)
{
    zb_convert *cv = sc->cv;
    const cv_column *col = &cv->cols[c];
    const zb__col_block *b = &sc->cols[c];
    size_t a = sc->col_start[c];
    uint32_t k = sc->s.input;
    if (col->kind == ZB_COL_CATEGORICAL) {
        ZB_TRY(alloc_array(sc, a, sc->n));
        int32_t *out = (int32_t *)sc->buf[a];
        const int32_t *codes = b->values;
        for (uint64_t q = 0; q < sc->n; q++) {
            int32_t code = codes[sc->order[q]];
            if (code >= 0 && (uint64_t)code >= col->n_src_codes[k])
                return zb__err(ZB_E_CORRUPT,
                               "%s: obs column '%s', row %" PRIu64 ": code %d of "
                               "%" PRIu64 " categories",
                               cv->inputs[k].path, col->name, sc->s.start + sc->order[q], code,
                               col->n_src_codes[k]);
            out[q] = code < 0 ? -1 : col->code_map[k][code];
        }
        return ZB_OK;
    }
    if (col->dtype == ZB_DT_STRING) {
        const zb_strings *s = &b->strings;
        ZB_TRY(alloc_array(sc, a, sc->n));
        ZB_TRY(alloc_array(sc, a + 1, s->offsets[sc->n] - s->offsets[0]));
        uint32_t *len = (uint32_t *)sc->buf[a];
        char *bytes = (char *)sc->buf[a + 1];
        for (uint64_t q = 0; q < sc->n; q++) {
            uint64_t i = sc->order[q], l = s->offsets[i + 1] - s->offsets[i];
            if (l > UINT32_MAX)
                return zb__err(ZB_E_INVALID, "obs column '%s': a string of %" PRIu64 " bytes",
                               col->name, l);
            len[q] = (uint32_t)l;
            memcpy(bytes, s->data + s->offsets[i], (size_t)l);
            bytes += l;
        }
        a += 2;
    } else {
        zb_dtype from = sc->cv->srcs[k]->c.columns[col->src_index[k]].dtype;
        size_t item = zb_dtype_size(col->dtype), in_item = zb_dtype_size(from);
        ZB_TRY(alloc_array(sc, a, sc->n));
        unsigned char *out = sc->buf[a];
        for (uint64_t q = 0; q < sc->n; q++)
            cv_convert_values(out + q * item, col->dtype,
                              (const unsigned char *)b->values + sc->order[q] * in_item, from, 1);
        a += 1;
    }
    if (col->kind == ZB_COL_NULLABLE) {
        ZB_TRY(alloc_array(sc, a, sc->n));
        for (uint64_t q = 0; q < sc->n; q++) sc->buf[a][q] = b->mask ? b->mask[sc->order[q]] : 0;
    }
    return ZB_OK;
}

void
cv_scratch_codec(zb__codec *codec)
{
    memset(codec, 0, sizeof *codec);
    codec->id = ZB_CODEC_BLOSC;
    codec->level = 5;
    memcpy(codec->cname, "lz4", 4);
    codec->shuffle = ZB_SHUFFLE_BYTE;
}

/* Element offsets of every sorted cell in each array: starts[a][q] for q in [0, n]. Fixed
 * arrays need none (q itself); variable ones are prefix sums of their count array. */
static zb_status
element_starts(scatter *sc)
{
    size_t k = 0;
    for (size_t a = 0; a < sc->n_arrays; a++) {
        int c = sc->arrays[a].count;
        if (c < 0 || sc->starts[c]) continue;
        if (k == CV_WS_STARTS_N)
            return zb__err(ZB_E_UNSUPPORTED,
                           "more than %d variable-length obs columns and "
                           "matrices",
                           CV_WS_STARTS_N);
        ZB_TRY(grow(sc, CV_WS_STARTS0 + k++, (sc->n + 1) * 8, &sc->starts[c]));
        const uint32_t *counts = (const uint32_t *)sc->buf[c];
        sc->starts[c][0] = 0;
        for (uint64_t q = 0; q < sc->n; q++) sc->starts[c][q + 1] = sc->starts[c][q] + counts[q];
    }
    return ZB_OK;
}

static uint64_t
elem_at(const scatter *sc, size_t a, uint64_t q)
{
    int c = sc->arrays[a].count;
    return c < 0 ? q : sc->starts[c][q];
}

void
cv_index_arrays(const cv_array *arrays, size_t n, bool *index)
{
    for (size_t a = 0; a < n; a++) index[a] = a == CV_A_ROW;
    for (size_t a = 0; a < n; a++)
        if (arrays[a].count >= 0) index[arrays[a].count] = true;
}

/* Compresses elements [e0, e1) of array a and appends them to the blob; returns the
 * compressed length. */
static zb_status
append_piece(scatter *sc, size_t a, uint64_t e0, uint64_t e1, uint32_t *clen)
{
    zb__codec codec;
    cv_scratch_codec(&codec);
    size_t item = sc->arrays[a].item;
    ZB_TRY(zb__codec_encode(&codec, sc->ws->ctx, sc->buf[a] + e0 * item, (size_t)((e1 - e0) * item),
                            item, &sc->ws->piece));
    if (sc->ws->piece.len > UINT32_MAX)
        return zb__err(ZB_E_OVERFLOW, "a scratch piece of %zu bytes", sc->ws->piece.len);
    *clen = (uint32_t)sc->ws->piece.len;
    return zb__buf_append(&sc->ws->blob, sc->ws->piece.data, sc->ws->piece.len);
}

/* Uncompressed bytes of sorted cell q in the blocks (the non-index arrays). */
static uint64_t
cell_bytes(const scatter *sc, uint64_t q)
{
    uint64_t bytes = 0;
    for (size_t a = 0; a < sc->n_arrays; a++)
        if (!sc->index[a])
            bytes += (elem_at(sc, a, q + 1) - elem_at(sc, a, q)) * sc->arrays[a].item;
    return bytes;
}

/* Section d (sorted cells [s0, s1)) into the blob: its index part, then its blocks.
 * row[] gets the section's table row. */
static zb_status
write_section(scatter *sc, uint64_t s0, uint64_t s1, uint64_t base, uint64_t *row)
{
    size_t na = sc->n_arrays, n_index = 0;
    for (size_t a = 0; a < na; a++) n_index += sc->index[a];
    /* where the blocks end: every block_bytes of block data, at least one cell */
    uint64_t *cuts, n_blocks = 0;
    ZB_TRY(grow(sc, CV_WS_CUTS, (s1 - s0 + 1) * 8, &cuts));
    for (uint64_t q = s0, bytes = 0; q < s1; q++) {
        bytes += cell_bytes(sc, q);
        if (bytes >= sc->cv->block_bytes || q + 1 == s1) {
            cuts[n_blocks++] = q + 1;
            bytes = 0;
        }
    }
    zb__buf *blob = &sc->ws->blob;
    size_t start = blob->len, head = (n_index + n_blocks * (1 + na)) * 4;
    ZB_TRY(zb__buf_reserve(blob, start + head));
    memset(blob->data + start, 0, head);
    blob->len = start + head;
    uint32_t clen;
    for (size_t a = 0, k = 0; a < na; a++) {
        if (!sc->index[a]) continue;
        ZB_TRY(append_piece(sc, a, elem_at(sc, a, s0), elem_at(sc, a, s1), &clen));
        memcpy(blob->data + start + 4 * k++, &clen, 4);
    }
    uint64_t index_bytes = blob->len - start;
    for (uint64_t b = 0, q0 = s0; b < n_blocks; q0 = cuts[b++]) {
        size_t at = start + (n_index + b * (1 + na)) * 4;
        uint32_t cells = (uint32_t)(cuts[b] - q0);
        memcpy(blob->data + at, &cells, 4);
        for (size_t a = 0; a < na; a++) {
            if (sc->index[a]) continue;
            ZB_TRY(append_piece(sc, a, elem_at(sc, a, q0), elem_at(sc, a, cuts[b]), &clen));
            memcpy(blob->data + at + 4 * (1 + a), &clen, 4);
        }
    }
    row[0] = s1 - s0;
    row[1] = n_blocks;
    row[2] = base + start;
    row[3] = index_bytes;
    return ZB_OK;
}

static zb_status
write_sections(scatter *sc)
{
    zb_convert *cv = sc->cv;
    uint64_t nd = cv->n_datasets;
    ZB_TRY(element_starts(sc));
    cv_index_arrays(sc->arrays, sc->n_arrays, sc->index);
    uint64_t *sections;
    ZB_TRY(grow(sc, CV_WS_TABLE, nd * 4 * 8, &sections));
    cv_scatter_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CV_SCATTER_MAGIC, 8);
    h.version = CV_SCATTER_VERSION;
    h.n_arrays = (uint32_t)sc->n_arrays;
    h.n_datasets = nd;
    h.input = sc->s.input;
    h.n_cells = sc->n;
    h.block_bytes = cv->block_bytes;
    size_t stats_len = cv->n_mats * sizeof(cv_value_stats);
    uint64_t base = sizeof h + nd * 4 * 8 + stats_len;
    sc->ws->blob.len = 0;
    zb_status st = ZB_OK;
    for (uint64_t d = 0; d < nd && st == ZB_OK; d++) {
        sections[4 * d] = 0;
        if (sc->section[d + 1] == sc->section[d]) {
            memset(sections + 4 * d, 0, 32);
            continue;
        }
        st = write_section(sc, sc->section[d], sc->section[d + 1], base, sections + 4 * d);
    }
    if (st == ZB_OK) {
        zb__buf *blob = &sc->ws->blob;
        const void *bufs[4] = {&h, sections, sc->stats, blob->data ? blob->data : (const void *)""};
        size_t lens[4] = {sizeof h, (size_t)(nd * 4 * 8), stats_len, blob->len};
        char path[4200];
        st = cv_path(cv, path, sizeof path, "scatter/t%zu.bin", sc->t);
        if (st == ZB_OK) st = cv_write_file(path, bufs, lens, 4);
    }
    return st;
}

zb_status
cv_scatter_task(zb_convert *cv, size_t t)
{
    char dir[4200];
    ZB_TRY(cv_path(cv, dir, sizeof dir, "scatter"));
    ZB_TRY(cv_mkdirs(dir));
    scatter sc;
    memset(&sc, 0, sizeof sc);
    sc.cv = cv;
    sc.t = t;
    sc.s = cv->slices[t];
    sc.n = sc.s.stop - sc.s.start;
    sc.n_arrays = cv_arrays(cv, sc.arrays, sc.col_start);
    zb_status st = cv_ws_take(cv, &sc.ws);
    if (st != ZB_OK) return st;
    st = cv_ws_blocks(sc.ws, cv->n_mats, cv->n_cols);
    sc.mats = sc.ws->mats;
    sc.cols = sc.ws->cols;
    cv_value_stats prepared[65];
    if (st == ZB_OK && cv->direct) st = cv_prepared_values(cv, sc.s.input, prepared, sc.folded);
    if (st == ZB_OK) st = read_cells(&sc);
    if (st == ZB_OK) st = sort_cells(&sc);
    if (st == ZB_OK) st = fill_fixed(&sc);
    for (size_t j = 0; st == ZB_OK && j < cv->n_mats; j++) {
        if (cv->direct) {
            st = fill_matrix_direct(&sc, j);
            continue;
        }
        st = fill_matrix(&sc, j);
        if (st == ZB_OK) st = check_values(&sc, j);
    }
    for (size_t c = 0; st == ZB_OK && c < cv->n_cols; c++) st = fill_column(&sc, c);
    if (st == ZB_OK) st = write_sections(&sc);
    zb_strings_free(&sc.names);
    cv_ws_give(cv, sc.ws);
    if (st != ZB_OK)
        return zb__err_context(st, "scatter task %zu (%s, rows %" PRIu64 "-%" PRIu64 ")", t,
                               cv->inputs[cv->slices[t].input].path, cv->slices[t].start,
                               cv->slices[t].stop);
    return ZB_OK;
}
