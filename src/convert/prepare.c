/* The prepare phase (zbatch_convert.h): one task per input — its CRC-64 for the manifest, and
 * each of its CSC matrices transposed out of core into a CSR scratch file the scatter tasks
 * read by rows.
 *
 * The CRC-64 reads every byte of the input, so on the direct path the task also folds the
 * values of each matrix into the stats the stored types are chosen from (dtypes.c), as it
 * reads past them: the scatter tasks then need not read X/data at all. That is exact only
 * where every stored value of the matrix reaches the output — a gene map that keeps every
 * gene (the values of dropped genes must not count) and the elements [indptr[0],
 * indptr[n_obs]) — and only for auto's choice (an explicit uint8/uint16 must name the first
 * value in input order that it cannot hold, which the scatter does row by row). Elsewhere the
 * scatter folds the values as before. The stats go into prepare/i<k>.json, written by rename
 * like every done file, so a restart finds them. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_int.h"
#include "util/json.h"
#include "util/status.h"

/* Whether input k's matrix j has its values folded by prepare; *raw gets where they lie, *lo and
 * *hi the elements that reach the output. */
static zb_status
folds_values(zb_convert *cv, size_t k, size_t j, zb__src_raw *raw, uint64_t *lo, uint64_t *hi,
             bool *yes)
{
    *yes = false;
    const cv_in_matrix *im = &cv->inputs[k].mats[j];
    if (!cv->direct || cv->data_choice != ZB_CONVERT_DATA_AUTO || im->layout != ZB_SRC_CSR)
        return ZB_OK;
    zb__src_matrix *m;
    ZB_TRY(cv_matrix(cv, (uint32_t)k, j, &m));
    if (!zb__src_matrix_raw(m, raw)) return ZB_OK;
    const int32_t *map;
    ZB_TRY(cv_gene_map(cv, (uint32_t)k, j, &map));
    for (uint64_t g = 0; g < im->n_cols; g++)
        if (map[g] < 0) return ZB_OK;
    int64_t first, last;
    uint64_t n = cv->inputs[k].n_obs;
    ZB_TRY(zb__src_matrix_indptr(m, 0, 0, &first));
    ZB_TRY(zb__src_matrix_indptr(m, n, n, &last));
    *lo = (uint64_t)first;
    *hi = (uint64_t)last;
    *yes = true;
    return ZB_OK;
}

/* Appends the extents of elements [lo, hi) of raw array a to folds (merging one that goes on
 * where the last ended). */
static zb_status
add_extents(const zb__src_raw_array *a, zb_dtype dtype, uint64_t lo, uint64_t hi,
            cv_value_stats *stats, cv_fold **folds, size_t *n, size_t *cap)
{
    size_t item = zb_dtype_size(dtype);
    for (uint64_t e = lo; e < hi;) {
        uint64_t run, at = zb__src_raw_at(a, item, e, &run);
        uint64_t count = hi - e < run ? hi - e : run;
        cv_fold *last = *n ? &(*folds)[*n - 1] : NULL;
        if (last && last->stats == stats && last->at + last->len == at) {
            last->len += count * item;
        } else {
            if (*n == *cap) {
                size_t c = *cap ? 2 * *cap : 64;
                cv_fold *p = realloc(*folds, c * sizeof *p);
                if (!p) return zb__err(ZB_E_NOMEM, "the prepare task's value extents");
                *folds = p;
                *cap = c;
            }
            (*folds)[(*n)++] = (cv_fold){at, count * item, dtype, stats};
        }
        e += count;
    }
    return ZB_OK;
}

static int
cmp_fold(const void *a, const void *b)
{
    uint64_t x = ((const cv_fold *)a)->at, y = ((const cv_fold *)b)->at;
    return x < y ? -1 : x > y;
}

/* The folds of input k (sorted by offset); have[j] says which matrices they cover. Extents that
 * overlap or pass the end of the file (a damaged chunk table) fold nothing: the scatter then
 * reads the values itself and reports what is wrong with them. */
static zb_status
plan_folds(zb_convert *cv, size_t k, cv_value_stats *stats, bool *have, cv_fold **folds, size_t *n)
{
    size_t cap = 0;
    *folds = NULL;
    *n = 0;
    for (size_t j = 0; j < cv->n_mats; j++) {
        zb__src_raw raw;
        uint64_t lo = 0, hi = 0;
        zb_status st = folds_values(cv, k, j, &raw, &lo, &hi, &have[j]);
        if (st == ZB_OK && have[j]) {
            zb__src_matrix *m;
            st = cv_matrix(cv, (uint32_t)k, j, &m);
            if (st == ZB_OK)
                st = add_extents(&raw.data, zb__src_matrix_info_of(m)->dtype, lo, hi, &stats[j],
                                 folds, n, &cap);
        }
        if (st != ZB_OK) return st;
    }
    if (*n) qsort(*folds, *n, sizeof **folds, cmp_fold);
    bool ok = true;
    for (size_t i = 0; i < *n; i++)
        if ((i && (*folds)[i - 1].at + (*folds)[i - 1].len > (*folds)[i].at) ||
            (*folds)[i].at + (*folds)[i].len > cv->inputs[k].size)
            ok = false;
    if (!ok) {
        memset(have, 0, cv->n_mats * sizeof *have);
        *n = 0;
    }
    return ZB_OK;
}

/* prepare/i<k>.json: the CRC-64, the size and the folded values (null where not folded). */
static zb_status
write_done(zb_convert *cv, size_t k, uint64_t crc, uint64_t size, const cv_value_stats *stats,
           const bool *have)
{
    size_t cap = 128 + cv->n_mats * 48;
    char *text = malloc(cap), path[4200];
    if (!text) return zb__err(ZB_E_NOMEM, "the prepare task's record");
    size_t len = (size_t)snprintf(
        text, cap, "{\"crc64\": \"%016" PRIx64 "\", \"size\": %" PRIu64 ", \"values\": [", crc,
        size);
    for (size_t j = 0; j < cv->n_mats; j++) {
        const char *sep = j ? ", " : "";
        if (have[j])
            len += (size_t)snprintf(text + len, cap - len, "%s[%" PRIu64 ", %" PRIu64 "]", sep,
                                    stats[j].flags, stats[j].max);
        else
            len += (size_t)snprintf(text + len, cap - len, "%snull", sep);
    }
    len += (size_t)snprintf(text + len, cap - len, "]}\n");
    zb_status st = cv_path(cv, path, sizeof path, "prepare/i%zu.json", k);
    const void *bufs[1] = {text};
    if (st == ZB_OK) st = cv_write_file(path, bufs, &len, 1);
    free(text);
    return st;
}

zb_status
cv_prepared_values(const zb_convert *cv, size_t k, cv_value_stats *stats, bool *have)
{
    memset(have, 0, cv->n_mats * sizeof *have);
    memset(stats, 0, cv->n_mats * sizeof *stats);
    char path[4200], *text;
    size_t len;
    ZB_TRY(cv_path(cv, path, sizeof path, "prepare/i%zu.json", k));
    ZB_TRY(cv_read_file(path, &text, &len));
    json_object *doc = NULL;
    zb_status st = zb__json_parse(text, len, path, &doc);
    free(text);
    json_object *values = st == ZB_OK ? zb__json_get(doc, "values") : NULL;
    if (values && (!json_object_is_type(values, json_type_array) ||
                   json_object_array_length(values) != cv->n_mats))
        st = zb__err(ZB_E_CORRUPT, "%s: \"values\" is not an array of %zu", path, cv->n_mats);
    for (size_t j = 0; st == ZB_OK && values && j < cv->n_mats; j++) {
        json_object *v = json_object_array_get_idx(values, j);
        if (!v) continue;
        if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) != 2) {
            st = zb__err(ZB_E_CORRUPT, "%s: values of matrix %zu are not [flags, max]", path, j);
            break;
        }
        st = zb__json_u64(json_object_array_get_idx(v, 0), "the values' flags", &stats[j].flags);
        if (st == ZB_OK)
            st = zb__json_u64(json_object_array_get_idx(v, 1), "the values' max", &stats[j].max);
        have[j] = st == ZB_OK;
    }
    json_object_put(doc);
    return st;
}

zb_status
cv_prepare_task(zb_convert *cv, size_t k)
{
    char dir[4200], path[4200];
    ZB_TRY(cv_path(cv, dir, sizeof dir, "prepare"));
    ZB_TRY(cv_mkdirs(dir));
    const cv_input *in = &cv->inputs[k];
    uint64_t size = in->size, crc = 0;
    int64_t mtime;
    ZB_TRY(cv_input_unchanged(in));
    zb__src *src;
    ZB_TRY(cv_source(cv, (uint32_t)k, &src));
    for (size_t j = 0; j < cv->n_mats; j++) {
        if (in->mats[j].layout != ZB_SRC_CSC) continue;
        zb__src_matrix *m;
        ZB_TRY(zb__src_matrix_get(src, cv->mat_keys[j], &m));
        ZB_TRY(cv_path(cv, path, sizeof path, "prepare/i%zu-m%zu.csr", k, j));
        if (!cv_exists(path)) ZB_TRY(zb__csc_transpose(m, path, cv->memory_bytes / 2, 1));
    }
    cv_value_stats *stats = calloc(cv->n_mats, sizeof *stats);
    bool *have = calloc(cv->n_mats, sizeof *have);
    cv_fold *folds = NULL;
    size_t n = 0;
    zb_status st = stats && have ? ZB_OK : zb__err(ZB_E_NOMEM, "the prepare task");
    if (st == ZB_OK && strcmp(in->format, "h5ad") == 0)
        st = plan_folds(cv, k, stats, have, &folds, &n);
    if (st == ZB_OK && strcmp(in->format, "h5ad") == 0)
        st = cv_file_crc(in->path, folds, n, &crc);
    else if (st == ZB_OK)
        st = cv_fingerprint(in->path, &size, &mtime, &crc);
    if (st == ZB_OK) st = write_done(cv, k, crc, size, stats, have);
    free(folds);
    free(stats);
    free(have);
    return st;
}
