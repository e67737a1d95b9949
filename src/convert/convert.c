/* The conversion handle (zbatch_convert.h): planning or resuming, loading a plan written
 * anywhere, the tasks' bookkeeping, and zb_convert_run, which drives the phases on a pool.
 * The phases themselves live in prepare.c, scatter.c, gather.c and finish.c. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/convert_int.h"
#include "util/json.h"
#include "util/pool.h"
#include "util/status.h"
#include "write/codec_spec.h"
#include "write/write.h"

zb_status
cv_path(const zb_convert *cv, char *buf, size_t cap, const char *fmt, ...)
{
    int n = snprintf(buf, cap, "%s/", cv->work);
    if (n < 0 || (size_t)n >= cap) return zb__err(ZB_E_INVALID, "%s: path too long", cv->work);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
    if (m < 0 || (size_t)m >= cap - (size_t)n)
        return zb__err(ZB_E_INVALID, "%s: path too long", cv->work);
    return ZB_OK;
}

static int
online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > ZB_POOL_MAX_THREADS ? ZB_POOL_MAX_THREADS : (int)n;
}

/* ---- loading a plan ------------------------------------------------------------------------ */

static zb_status
get_u64(json_object *obj, const char *key, uint64_t *out)
{
    json_object *v = zb__json_get(obj, key);
    if (!v) return zb__err(ZB_E_CORRUPT, "plan.json: no '%s'", key);
    return zb__json_u64(v, key, out);
}

static const char *
get_str(json_object *obj, const char *key)
{
    json_object *v = zb__json_get(obj, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static zb_status
dtype_of(const char *name, zb_dtype *out)
{
    for (int t = 0; t < ZB_DT_COUNT_; t++)
        if (name && !strcmp(name, zb_dtype_name((zb_dtype)t))) {
            *out = (zb_dtype)t;
            return ZB_OK;
        }
    return zb__err(ZB_E_CORRUPT, "plan.json: unknown dtype '%s'", name ? name : "(none)");
}

static int
kind_of(const char *name)
{
    static const char *const kinds[] = {"numeric", "categorical", "string", "nullable"};
    for (int k = 0; k < 4; k++)
        if (name && !strcmp(name, kinds[k])) return k;
    return -1;
}

static zb_status
strings_of(json_object *arr, zb_strings *out)
{
    cv_strbuf b = {0};
    size_t n = arr ? json_object_array_length(arr) : 0;
    zb_status st = ZB_OK;
    for (size_t i = 0; i < n && st == ZB_OK; i++) {
        json_object *v = json_object_array_get_idx(arr, i);
        st = cv_strbuf_push(&b, json_object_get_string(v), (size_t)json_object_get_string_len(v));
    }
    if (st == ZB_OK && !b.s.offsets) st = cv_strbuf_push(&b, "", 0), b.s.n = 0;
    if (st != ZB_OK) {
        zb_strings_free(&b.s);
        return st;
    }
    *out = b.s;
    return ZB_OK;
}

/* Category values of a non-string table, parsed back from their text. */
static zb_status
category_values(cv_column *c)
{
    size_t item = zb_dtype_size(c->dtype);
    c->category_values = malloc((size_t)(c->categories.n ? c->categories.n : 1) * item);
    if (!c->category_values) return zb__err(ZB_E_NOMEM, "obs column '%s'", c->name);
    for (uint64_t i = 0; i < c->categories.n; i++) {
        char buf[64];
        size_t len = (size_t)(c->categories.offsets[i + 1] - c->categories.offsets[i]);
        if (len >= sizeof buf) len = sizeof buf - 1;
        memcpy(buf, c->categories.data + c->categories.offsets[i], len);
        buf[len] = '\0';
        unsigned char *dst = (unsigned char *)c->category_values + i * item;
        if (c->dtype == ZB_DT_BOOL) {
            dst[0] = !strcmp(buf, "True");
        } else if (c->dtype >= ZB_DT_INT8 && c->dtype <= ZB_DT_INT64) {
            int64_t v = strtoll(buf, NULL, 10);
            cv_convert_values(dst, c->dtype, &v, ZB_DT_INT64, 1);
        } else if (c->dtype >= ZB_DT_UINT8 && c->dtype <= ZB_DT_UINT64) {
            uint64_t v = strtoull(buf, NULL, 10);
            cv_convert_values(dst, c->dtype, &v, ZB_DT_UINT64, 1);
        } else {
            double v = strtod(buf, NULL);
            cv_convert_values(dst, c->dtype, &v, ZB_DT_FLOAT64, 1);
        }
    }
    return ZB_OK;
}

static zb_status
load_column(zb_convert *cv, json_object *jc, cv_column *c)
{
    const char *name = get_str(jc, "name");
    int kind = kind_of(get_str(jc, "kind"));
    if (!name || kind < 0) return zb__err(ZB_E_CORRUPT, "plan.json: a malformed column");
    if (!(c->name = strdup(name))) return zb__err(ZB_E_NOMEM, "plan");
    c->kind = (zb__col_kind)kind;
    ZB_TRY(dtype_of(get_str(jc, "dtype"), &c->dtype));
    json_object *sources = zb__json_get(jc, "sources");
    if (!sources || json_object_array_length(sources) != cv->n_inputs)
        return zb__err(ZB_E_CORRUPT, "plan.json: column '%s': sources", name);
    c->src_index = calloc(cv->n_inputs, sizeof *c->src_index);
    if (!c->src_index) return zb__err(ZB_E_NOMEM, "plan");
    if (c->kind == ZB_COL_CATEGORICAL) {
        json_object *o = zb__json_get(jc, "ordered");
        c->ordered = o && json_object_get_boolean(o);
        ZB_TRY(strings_of(zb__json_get(jc, "categories"), &c->categories));
        if (c->dtype != ZB_DT_STRING) ZB_TRY(category_values(c));
        c->code_map = calloc(cv->n_inputs, sizeof *c->code_map);
        c->n_src_codes = calloc(cv->n_inputs, sizeof *c->n_src_codes);
        if (!c->code_map || !c->n_src_codes) return zb__err(ZB_E_NOMEM, "plan");
    }
    for (size_t k = 0; k < cv->n_inputs; k++) {
        json_object *s = json_object_array_get_idx(sources, k);
        uint64_t idx;
        ZB_TRY(get_u64(s, "index", &idx));
        c->src_index[k] = (size_t)idx;
        if (c->kind != ZB_COL_CATEGORICAL) continue;
        json_object *codes = zb__json_get(s, "codes");
        size_t n = codes ? json_object_array_length(codes) : 0;
        c->n_src_codes[k] = n;
        c->code_map[k] = malloc((n ? n : 1) * sizeof(int32_t));
        if (!c->code_map[k]) return zb__err(ZB_E_NOMEM, "plan");
        for (size_t i = 0; i < n; i++)
            c->code_map[k][i] = (int32_t)json_object_get_int64(json_object_array_get_idx(codes, i));
    }
    return ZB_OK;
}

static zb_status
load_inputs(zb_convert *cv, json_object *doc)
{
    json_object *ins = zb__json_get(doc, "inputs"), *mats = zb__json_get(doc, "matrices");
    if (!ins || !mats) return zb__err(ZB_E_CORRUPT, "plan.json: no inputs or matrices");
    cv->n_inputs = json_object_array_length(ins);
    cv->n_mats = json_object_array_length(mats);
    cv->inputs = calloc(cv->n_inputs, sizeof *cv->inputs);
    cv->mat_keys = calloc(cv->n_mats, sizeof *cv->mat_keys);
    cv->mat_names = calloc(cv->n_mats, sizeof *cv->mat_names);
    cv->mat_dtypes = calloc(cv->n_mats, sizeof *cv->mat_dtypes);
    if (!cv->inputs || !cv->mat_keys || !cv->mat_names || !cv->mat_dtypes)
        return zb__err(ZB_E_NOMEM, "plan");
    for (size_t j = 0; j < cv->n_mats; j++) {
        json_object *m = json_object_array_get_idx(mats, j);
        const char *key = get_str(m, "key"), *name = get_str(m, "name");
        if (!key || !name) return zb__err(ZB_E_CORRUPT, "plan.json: matrix %zu", j);
        cv->mat_keys[j] = strdup(key);
        cv->mat_names[j] = strdup(name);
        if (!cv->mat_keys[j] || !cv->mat_names[j]) return zb__err(ZB_E_NOMEM, "plan");
        ZB_TRY(dtype_of(get_str(m, "dtype"), &cv->mat_dtypes[j]));
    }
    uint64_t base = 0;
    for (size_t k = 0; k < cv->n_inputs; k++) {
        json_object *in = json_object_array_get_idx(ins, k);
        cv_input *x = &cv->inputs[k];
        const char *path = get_str(in, "path"), *format = get_str(in, "format");
        if (!path || !format) return zb__err(ZB_E_CORRUPT, "plan.json: input %zu", k);
        x->path = strdup(path);
        x->format = strdup(format);
        x->mats = calloc(cv->n_mats, sizeof *x->mats);
        if (!x->path || !x->format || !x->mats) return zb__err(ZB_E_NOMEM, "plan");
        ZB_TRY(get_u64(in, "size", &x->size));
        json_object *mt = zb__json_get(in, "mtime_ns");
        x->mtime_ns = mt ? json_object_get_int64(mt) : 0;
        ZB_TRY(get_u64(in, "n_obs", &x->n_obs));
        x->base = base;
        base += x->n_obs;
        json_object *ms = zb__json_get(in, "matrices");
        if (!ms || json_object_array_length(ms) != cv->n_mats)
            return zb__err(ZB_E_CORRUPT, "plan.json: input %zu: matrices", k);
        for (size_t j = 0; j < cv->n_mats; j++) {
            json_object *m = json_object_array_get_idx(ms, j);
            const char *layout = get_str(m, "layout");
            x->mats[j].layout = !layout || !strcmp(layout, "csr") ? ZB_SRC_CSR
                                : !strcmp(layout, "csc")          ? ZB_SRC_CSC
                                                                  : ZB_SRC_DENSE;
            ZB_TRY(dtype_of(get_str(m, "dtype"), &x->mats[j].dtype));
            ZB_TRY(get_u64(m, "n_cols", &x->mats[j].n_cols));
            ZB_TRY(get_u64(m, "nnz", &x->mats[j].nnz));
            json_object *mono = zb__json_get(m, "monotone");
            x->mats[j].monotone = mono && json_object_get_boolean(mono);
            json_object *ident = zb__json_get(m, "identity");
            x->mats[j].identity = ident && json_object_get_boolean(ident);
        }
    }
    return ZB_OK;
}

static zb_status
load_slices(zb_convert *cv, json_object *doc)
{
    json_object *sl = zb__json_get(doc, "slices");
    if (!sl) return zb__err(ZB_E_CORRUPT, "plan.json: no slices");
    cv->n_slices = json_object_array_length(sl);
    cv->slices = calloc(cv->n_slices ? cv->n_slices : 1, sizeof *cv->slices);
    if (!cv->slices) return zb__err(ZB_E_NOMEM, "plan");
    for (size_t t = 0; t < cv->n_slices; t++) {
        json_object *s = json_object_array_get_idx(sl, t);
        uint64_t v[4];
        for (size_t i = 0; i < 4; i++) {
            json_object *e = json_object_array_get_idx(s, i);
            if (!e) return zb__err(ZB_E_CORRUPT, "plan.json: slice %zu", t);
            ZB_TRY(zb__json_u64(e, "slice", &v[i]));
        }
        if (v[0] >= cv->n_inputs || v[1] >= v[2] || v[2] > cv->inputs[v[0]].n_obs)
            return zb__err(ZB_E_CORRUPT, "plan.json: slice %zu is out of range", t);
        cv->slices[t] = (cv_slice){(uint32_t)v[0], v[1], v[2], v[3]};
    }
    return ZB_OK;
}

zb_status
cv_plan_load(zb_convert *cv)
{
    char path[4200];
    ZB_TRY(cv_path(cv, path, sizeof path, "plan.json"));
    char *text;
    size_t len;
    ZB_TRY(cv_read_file(path, &text, &len));
    zb_status st = zb__json_parse(text, len, path, &cv->plan_doc);
    free(text);
    if (st != ZB_OK) return st;
    json_object *doc = cv->plan_doc, *args = zb__json_get(doc, "args");
    const char *format = get_str(doc, "format");
    uint64_t version = 0;
    if (!format || strcmp(format, "zbatch-convert-plan") || !args ||
        get_u64(doc, "version", &version) != ZB_OK || version != CV_PLAN_VERSION)
        return zb__err(ZB_E_CORRUPT, "%s: not a plan this zbatch (%s) can run", path,
                       ZB_VERSION_STRING);
    cv->args_text = json_object_to_json_string_ext(args, JSON_C_TO_STRING_PLAIN);
    ZB_TRY(load_inputs(cv, doc));
    ZB_TRY(strings_of(zb__json_get(args, "inputs"), &cv->input_names));
    if (cv->input_names.n != cv->n_inputs)
        return zb__err(ZB_E_CORRUPT, "%s: %" PRIu64 " input names for %zu inputs", path,
                       cv->input_names.n, cv->n_inputs);
    ZB_TRY(strings_of(zb__json_get(doc, "genes"), &cv->genes));
    json_object *cols = zb__json_get(doc, "columns");
    cv->n_cols = cols ? json_object_array_length(cols) : 0;
    cv->cols = calloc(cv->n_cols ? cv->n_cols : 1, sizeof *cv->cols);
    if (!cv->cols) return zb__err(ZB_E_NOMEM, "plan");
    for (size_t c = 0; c < cv->n_cols; c++)
        ZB_TRY(load_column(cv, json_object_array_get_idx(cols, c), &cv->cols[c]));
    ZB_TRY(load_slices(cv, doc));
    ZB_TRY(get_u64(doc, "n_cells", &cv->n_cells));
    ZB_TRY(get_u64(doc, "input_bytes", &cv->input_bytes));
    ZB_TRY(get_u64(doc, "memory_bytes", &cv->memory_bytes));
    ZB_TRY(get_u64(doc, "block_bytes", &cv->block_bytes));
    json_object *direct = zb__json_get(doc, "direct");
    cv->direct = direct && json_object_get_boolean(direct);
    if (cv->block_bytes < CV_MIN_BLOCK_BYTES || cv->block_bytes > CV_MAX_BLOCK_BYTES)
        return zb__err(ZB_E_CORRUPT, "%s: block_bytes %" PRIu64 " is out of range", path,
                       cv->block_bytes);
    ZB_TRY(get_u64(args, "dataset_size", &cv->dataset_size));
    ZB_TRY(get_u64(args, "seed", &cv->seed));
    ZB_TRY(get_u64(args, "x_chunk", &cv->x_chunk));
    ZB_TRY(get_u64(args, "x_shard", &cv->x_shard));
    uint64_t fmt;
    ZB_TRY(get_u64(args, "zarr_format", &fmt));
    cv->zarr_format = (int)fmt;
    json_object *sh = zb__json_get(args, "shuffle");
    cv->shuffle = !sh || json_object_get_boolean(sh);
    ZB_TRY(cv_choices_of(get_str(args, "data_dtype"), get_str(args, "index_dtype"),
                         &cv->data_choice, &cv->index_choice));
    const char *codec = get_str(args, "codec");
    if (codec && !(cv->codec = strdup(codec))) return zb__err(ZB_E_NOMEM, "plan");
    if (cv->dataset_size == 0 || cv->n_cells == 0)
        return zb__err(ZB_E_CORRUPT, "%s: no cells or no dataset size", path);
    cv->n_datasets = (cv->n_cells + cv->dataset_size - 1) / cv->dataset_size;
    zb__perm_init(&cv->perm, cv->n_cells, zb__stream_key(cv->seed, 0, ZB_TAG_CONVERT, 0, 0));
    cv->srcs = calloc(cv->n_inputs, sizeof *cv->srcs);
    cv->matrices = calloc(cv->n_inputs, sizeof *cv->matrices);
    cv->maps = calloc(cv->n_inputs, sizeof *cv->maps);
    if (!cv->srcs || !cv->matrices || !cv->maps) return zb__err(ZB_E_NOMEM, "plan");
    for (size_t k = 0; k < cv->n_inputs; k++) {
        cv->matrices[k] = calloc(cv->n_mats, sizeof **cv->matrices);
        cv->maps[k] = calloc(cv->n_mats, sizeof **cv->maps);
        if (!cv->matrices[k] || !cv->maps[k]) return zb__err(ZB_E_NOMEM, "plan");
    }
    return ZB_OK;
}

/* ---- run-time lookups ------------------------------------------------------------------------ */

zb_status
cv_source(zb_convert *cv, uint32_t k, zb__src **out)
{
    pthread_mutex_lock(&cv->lock);
    zb_status st = ZB_OK;
    if (!cv->srcs[k]) st = zb__src_open(cv->inputs[k].path, &cv->srcs[k]);
    if (st == ZB_OK && cv->srcs[k]->c.n_obs != cv->inputs[k].n_obs)
        st = zb__err(ZB_E_INVALID, "%s: %" PRIu64 " cells now, %" PRIu64 " when planned",
                     cv->inputs[k].path, cv->srcs[k]->c.n_obs, cv->inputs[k].n_obs);
    *out = cv->srcs[k];
    pthread_mutex_unlock(&cv->lock);
    return st;
}

zb_status
cv_matrix(zb_convert *cv, uint32_t k, size_t j, zb__src_matrix **out)
{
    zb__src *src;
    ZB_TRY(cv_source(cv, k, &src));
    pthread_mutex_lock(&cv->lock);
    zb_status st = ZB_OK;
    if (!cv->matrices[k][j]) {
        zb__src_matrix *m = NULL;
        st = zb__src_matrix_get(src, cv->mat_keys[j], &m);
        if (st == ZB_OK && cv->inputs[k].mats[j].layout == ZB_SRC_CSC) {
            char path[4200];
            st = cv_path(cv, path, sizeof path, "prepare/i%u-m%zu.csr", k, j);
            zb__src_matrix *t = NULL;
            if (st == ZB_OK) st = zb__csr_file_open(path, m, &t);
            m = t;
        }
        cv->matrices[k][j] = m;
    }
    *out = cv->matrices[k][j];
    pthread_mutex_unlock(&cv->lock);
    return st;
}

zb_status
cv_gene_map(zb_convert *cv, uint32_t k, size_t j, const int32_t **out)
{
    pthread_mutex_lock(&cv->lock);
    zb_status st = ZB_OK;
    if (!cv->maps[k][j]) {
        char path[4200];
        char *text = NULL;
        size_t len = 0;
        st = cv_path(cv, path, sizeof path, "maps/i%u-m%zu.bin", k, j);
        if (st == ZB_OK) st = cv_read_file(path, &text, &len);
        if (st == ZB_OK && len != cv->inputs[k].mats[j].n_cols * sizeof(int32_t))
            st = zb__err(ZB_E_CORRUPT, "%s: %zu bytes for %" PRIu64 " columns", path, len,
                         cv->inputs[k].mats[j].n_cols);
        if (st == ZB_OK) {
            const int32_t *m = (const int32_t *)text;
            for (uint64_t i = 0; i < cv->inputs[k].mats[j].n_cols && st == ZB_OK; i++)
                if (m[i] < -1 || (int64_t)m[i] >= (int64_t)cv->genes.n)
                    st = zb__err(ZB_E_CORRUPT, "%s: column %" PRIu64 " maps outside the genes",
                                 path, i);
        }
        if (st == ZB_OK)
            cv->maps[k][j] = (int32_t *)text;
        else
            free(text);
    }
    *out = cv->maps[k][j];
    pthread_mutex_unlock(&cv->lock);
    return st;
}

/* ---- the handle -------------------------------------------------------------------------------- */

/* A handle for `output`, its work directory (NULL: OUTPUT/.zbatch-convert) and its store
 * (buffered: zb_convert_opts.buffered_output). */
static zb_status
convert_alloc(const char *output, const char *work_dir, const zb_remote_opts *remote, bool buffered,
              zb_convert **out)
{
    *out = NULL;
    zb_convert *cv = calloc(1, sizeof *cv);
    if (!cv) return zb__err(ZB_E_NOMEM, "a conversion handle");
    size_t n = strlen(output);
    while (n > 1 && output[n - 1] == '/') n--;
    cv->output = strndup(output, n);
    cv->work = work_dir ? strdup(work_dir) : malloc(n + sizeof CV_WORK_DIR + 1);
    pthread_mutex_init(&cv->lock, NULL);
    cv->input_mmap_bytes = ZB_STORE_DEFAULT_MMAP_BYTES;
    cv->buffered_output = buffered;
    if (!cv->output || !cv->work) {
        zb_convert_close(cv);
        return zb__err(ZB_E_NOMEM, "a conversion handle");
    }
    if (!work_dir) sprintf(cv->work, "%s/%s", cv->output, CV_WORK_DIR);
    zb_status st = cv_output_open(cv, remote);
    if (st == ZB_OK && cv->remote && !work_dir)
        st = zb__err(ZB_E_INVALID,
                     "%s: a remote output needs a local work directory (the work_dir option; "
                     "the command's --work-dir)",
                     cv->output);
    if (st != ZB_OK) {
        zb_convert_close(cv);
        return st;
    }
    *out = cv;
    return ZB_OK;
}

zb_status
zb_convert_default_work_dir(const char *output, const char *tmpdir, char *buf, size_t cap)
{
    if (!output || !buf) return zb__err(ZB_E_INVALID, "zb_convert_default_work_dir: null argument");
    size_t n = strlen(output);
    while (n > 1 && output[n - 1] == '/') n--;
    /* one name per output URL, so a restart finds the killed run's work */
    uint64_t h = cv_crc64(0, output, n);
    int w =
        snprintf(buf, cap, "%s/zbatch-convert-%016" PRIx64, tmpdir && *tmpdir ? tmpdir : "/tmp", h);
    if (w < 0 || (size_t)w >= cap)
        return zb__err(ZB_E_INVALID, "%s: the work directory's path is too long", output);
    return ZB_OK;
}

void
zb_convert_close(zb_convert *cv)
{
    if (!cv) return;
    cv_ws_free_all(cv);
    cv_views_free(cv);
    cv_output_forget_all(cv);
    for (size_t k = 0; k < cv->n_inputs; k++) {
        for (size_t j = 0; j < cv->n_mats; j++) {
            if (cv->matrices && cv->matrices[k] && cv->matrices[k][j] &&
                cv->inputs[k].mats[j].layout == ZB_SRC_CSC)
                zb__src_matrix_close(cv->matrices[k][j]);
            if (cv->maps && cv->maps[k]) free(cv->maps[k][j]);
        }
        if (cv->matrices) free(cv->matrices[k]);
        if (cv->maps) free(cv->maps[k]);
        if (cv->srcs) zb__src_close(cv->srcs[k]);
        free(cv->inputs[k].path);
        free(cv->inputs[k].format);
        free(cv->inputs[k].mats);
    }
    for (size_t j = 0; j < cv->n_mats; j++) {
        free(cv->mat_keys[j]);
        free(cv->mat_names[j]);
    }
    for (size_t c = 0; c < cv->n_cols; c++) {
        cv_column *col = &cv->cols[c];
        free(col->name);
        zb_strings_free(&col->categories);
        free(col->category_values);
        for (size_t k = 0; col->code_map && k < cv->n_inputs; k++) free(col->code_map[k]);
        free(col->code_map);
        free(col->n_src_codes);
        free(col->src_index);
    }
    free(cv->cols);
    free(cv->mat_keys);
    free(cv->mat_names);
    free(cv->mat_dtypes);
    free(cv->stored_dtypes);
    free(cv->inputs);
    free(cv->srcs);
    free(cv->matrices);
    free(cv->maps);
    free(cv->slices);
    free(cv->codec);
    zb_strings_free(&cv->genes);
    zb_strings_free(&cv->input_names);
    json_object_put(cv->plan_doc);
    json_object_put(cv->manifest);
    zb_store_close(cv->out);
    pthread_mutex_destroy(&cv->lock);
    free(cv->output);
    free(cv->work);
    free(cv);
}

/* The options with their defaults filled in and checked. */
static zb_status
normalize(const zb_convert_opts *opts, zb_convert_opts *o)
{
    zb_convert_opts d = ZB_CONVERT_OPTS_DEFAULT;
    *o = opts ? *opts : d;
    if (!o->dataset_size) o->dataset_size = ZB_CONVERT_DEFAULT_DATASET_SIZE;
    if (!o->memory_bytes) o->memory_bytes = ZB_CONVERT_DEFAULT_MEMORY;
    if (!o->zarr_format) o->zarr_format = 3;
    if (!o->x_chunk) o->x_chunk = ZB_ANNDATA_DEFAULT_X_CHUNK;
    if (o->zarr_format == 2 || o->x_shard == UINT64_MAX)
        o->x_shard = UINT64_MAX;
    else if (!o->x_shard)
        o->x_shard = o->x_chunk * 1024;
    if (!o->num_threads) o->num_threads = online_cpus();
    if (o->memory_bytes < ZB_CONVERT_MIN_MEMORY)
        return zb__err(ZB_E_INVALID, "memory %" PRIu64 " bytes: at least %" PRIu64 " (64 MiB)",
                       o->memory_bytes, ZB_CONVERT_MIN_MEMORY);
    if (o->zarr_format != 2 && o->zarr_format != 3)
        return zb__err(ZB_E_INVALID, "zarr_format %d: 2 or 3", o->zarr_format);
    if (o->x_shard != UINT64_MAX && o->x_shard % o->x_chunk)
        return zb__err(ZB_E_INVALID,
                       "a shard of %" PRIu64 " elements is not a multiple of the "
                       "chunk (%" PRIu64 ")",
                       o->x_shard, o->x_chunk);
    if (o->var_join != ZB_VAR_OUTER && o->var_join != ZB_VAR_INNER)
        return zb__err(ZB_E_INVALID, "var_join %d", (int)o->var_join);
    if ((unsigned)o->data_dtype > ZB_CONVERT_DATA_FLOAT32)
        return zb__err(ZB_E_INVALID, "data_dtype %d", (int)o->data_dtype);
    if ((unsigned)o->index_dtype > ZB_CONVERT_INDEX_NARROW)
        return zb__err(ZB_E_INVALID, "index_dtype %d", (int)o->index_dtype);
    if (o->num_threads < 0 || o->num_threads > ZB_POOL_MAX_THREADS)
        return zb__err(ZB_E_INVALID, "num_threads %d: 0 to %d", o->num_threads,
                       ZB_POOL_MAX_THREADS);
    zb__codec codec;
    bool has;
    ZB_TRY(zb__codec_spec_parse(o->codec, o->zarr_format, &codec, &has));
    for (size_t i = 0; i < o->n_layers; i++)
        if (!o->layers[i] || !*o->layers[i] || strchr(o->layers[i], '/'))
            return zb__err(ZB_E_INVALID, "layer name '%s'", o->layers[i] ? o->layers[i] : "");
    return ZB_OK;
}

void
cv_args_difference(json_object *a, json_object *b, char *buf, size_t cap)
{
    snprintf(buf, cap, "the arguments");
    json_object_object_foreach(a, key, va)
    {
        json_object *vb = zb__json_get(b, key);
        const char *ta = va ? json_object_to_json_string(va) : "null";
        const char *tb = vb ? json_object_to_json_string(vb) : "null";
        if (strcmp(ta, tb)) {
            snprintf(buf, cap, "%s: %.200s there, %.200s now", key, ta, tb);
            return;
        }
    }
}

/* The conversion in progress in `cv` must be this one, over unchanged inputs. */
static zb_status
check_resume(zb_convert *cv, json_object *args, const char *const *inputs)
{
    const char *now = json_object_to_json_string_ext(args, JSON_C_TO_STRING_PLAIN);
    if (strcmp(now, cv->args_text)) {
        char diff[512];
        cv_args_difference(zb__json_get(cv->plan_doc, "args"), args, diff, sizeof diff);
        return zb__err(ZB_E_INVALID,
                       "%s holds a conversion of other inputs or options (%s); "
                       "run the same command again, or remove it to start afresh",
                       cv->output, diff);
    }
    for (size_t k = 0; k < cv->n_inputs; k++) {
        char real[PATH_MAX];
        if (!realpath(inputs[k], real)) snprintf(real, sizeof real, "%s", inputs[k]);
        uint64_t size;
        int64_t mtime;
        ZB_TRY(cv_fingerprint(inputs[k], &size, &mtime, NULL));
        if (strcmp(real, cv->inputs[k].path) || size != cv->inputs[k].size ||
            mtime != cv->inputs[k].mtime_ns)
            return zb__err(ZB_E_INVALID,
                           "%s changed since the conversion in %s was planned "
                           "(%s); remove %s to start afresh",
                           inputs[k], cv->output,
                           strcmp(real, cv->inputs[k].path) ? "another file"
                           : size != cv->inputs[k].size     ? "its size"
                                                            : "its modification time",
                           cv->output);
    }
    return ZB_OK;
}

static zb_status
write_root_marker(zb_convert *cv)
{
    static const char text[] = "{\"writer\": \"zbatch " ZB_VERSION_STRING
                               "\", \"layout\": \"collection\", \"state\": \"converting; the "
                               "store is not valid until this marker is gone\"}\n";
    return cv_output_put(cv, ZB_INCOMPLETE_MARKER, text, sizeof text - 1);
}

static int
any_child(void *ctx, const char *name, bool is_dir)
{
    (void)is_dir;
    (void)name;
    *(bool *)ctx = true;
    return 1;
}

/* A remote output prefix that holds nothing, or a conversion in progress (its marker; the work
 * directory of that run is gone, so the run starts again and rewrites what it left). */
static zb_status
check_remote_free(zb_convert *cv)
{
    if (cv_output_has(cv, CV_MANIFEST))
        return zb__err(ZB_E_INVALID,
                       "%s holds a finished conversion of other inputs or options; "
                       "remove it first",
                       cv->output);
    if (cv_output_has(cv, ZB_INCOMPLETE_MARKER)) return ZB_OK;
    bool any = false;
    ZB_TRY(zb_store_list(cv->out, "", any_child, &any));
    if (any) return zb__err(ZB_E_INVALID, "%s is not empty; give a new prefix", cv->output);
    return ZB_OK;
}

/* An output directory that is new, empty, or only holds what a conversion writes. */
static zb_status
check_output_free(const char *output)
{
    struct stat sb;
    if (stat(output, &sb) != 0) return ZB_OK;
    if (!S_ISDIR(sb.st_mode))
        return zb__err(ZB_E_INVALID, "%s exists and is not a directory", output);
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/%s", output, CV_MANIFEST);
    if (cv_exists(probe))
        return zb__err(ZB_E_INVALID,
                       "%s holds a finished conversion of other inputs or options; "
                       "remove it first",
                       output);
    uint64_t size;
    int64_t mtime;
    ZB_TRY(cv_fingerprint(output, &size, &mtime, NULL));
    if (size) return zb__err(ZB_E_INVALID, "%s exists and is not empty; give a new path", output);
    return ZB_OK;
}

zb_status
zb_convert_plan(const char *const *inputs, size_t n_inputs, const char *output,
                const zb_convert_opts *opts, zb_convert **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_convert_plan: null out");
    *out = NULL;
    if (!inputs || !n_inputs || !output || !*output)
        return zb__err(ZB_E_INVALID, "zb_convert_plan: no inputs or no output");
    for (size_t k = 0; k < n_inputs; k++)
        if (!inputs[k] || !*inputs[k]) return zb__err(ZB_E_INVALID, "input %zu: empty path", k);
    zb_convert_opts o;
    ZB_TRY(normalize(opts, &o));
    json_object *args = NULL;
    ZB_TRY(cv_args_json(inputs, n_inputs, &o, &args));
    zb_convert *cv = NULL;
    zb_status st = convert_alloc(output, o.work_dir, o.remote, o.buffered_output, &cv);
    char path[4200];
    if (st == ZB_OK) st = cv_path(cv, path, sizeof path, "plan.json");
    if (st == ZB_OK && cv_exists(path)) {
        st = cv_plan_load(cv);
        if (st == ZB_OK) st = check_resume(cv, args, inputs);
        if (st == ZB_OK) st = cv_output_make(cv); /* a work_dir elsewhere outlives the output */
    } else if (st == ZB_OK) {
        if (cv_output_has(cv, CV_MANIFEST) && !cv_exists(cv->work)) {
            st = cv_finished_open(cv, args);
        } else {
            if (!cv_exists(cv->work))
                st = cv->remote ? check_remote_free(cv) : check_output_free(cv->output);
            if (st == ZB_OK) st = cv_mkdirs(cv->work);
            if (st == ZB_OK) st = cv_output_make(cv);
            if (st == ZB_OK) st = write_root_marker(cv);
            zb__src **kept = NULL;
            if (st == ZB_OK && !(kept = calloc(n_inputs, sizeof *kept)))
                st = zb__err(ZB_E_NOMEM, "the plan");
            if (st == ZB_OK)
                st = cv_plan_write(inputs, n_inputs, &o, cv->work, args, o.num_threads, kept);
            if (st == ZB_OK) st = cv_plan_load(cv);
            for (size_t k = 0; kept && k < n_inputs; k++) { /* the planner's open sources */
                if (st == ZB_OK && k < cv->n_inputs && !cv->srcs[k])
                    cv->srcs[k] = kept[k];
                else
                    zb__src_close(kept[k]);
            }
            free(kept);
        }
    }
    json_object_put(args);
    if (st != ZB_OK) {
        zb_convert_close(cv);
        return st;
    }
    *out = cv;
    return ZB_OK;
}

zb_status
zb_convert_open(const char *output, zb_convert **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_convert_open: null out");
    *out = NULL;
    if (!output) return zb__err(ZB_E_INVALID, "zb_convert_open: null output");
    zb_convert *cv = NULL;
    ZB_TRY(convert_alloc(output, NULL, NULL, false, &cv));
    char path[4200];
    zb_status st = cv_path(cv, path, sizeof path, "plan.json");
    if (st == ZB_OK && !cv_exists(path))
        st = zb__err(ZB_E_NOTFOUND, "%s: no conversion is planned there", output);
    if (st == ZB_OK) st = cv_plan_load(cv);
    if (st != ZB_OK) {
        zb_convert_close(cv);
        return st;
    }
    *out = cv;
    return ZB_OK;
}

void
zb_convert_set_task_memory(zb_convert *cv, uint64_t bytes)
{
    if (cv) cv->task_memory = bytes;
}

void
zb_convert_set_input_mmap_bytes(zb_convert *cv, uint64_t bytes)
{
    if (cv) cv->input_mmap_bytes = bytes;
}

zb_status
zb_convert_set_buffered_output(zb_convert *cv, bool buffered)
{
    if (!cv) return zb__err(ZB_E_INVALID, "zb_convert_set_buffered_output: null handle");
    /* a local output open already is opened again (the new store first, so a failure leaves
     * the handle as it was); one not made yet is opened so by cv_output_make; S3 has no
     * O_DIRECT */
    if (cv->out && !cv->remote && cv->buffered_output != buffered) {
        zb_store *reopened = NULL;
        ZB_TRY(cv_output_open_dir(cv->output, buffered, &reopened));
        zb_store_close(cv->out);
        cv->out = reopened;
    }
    cv->buffered_output = buffered;
    return ZB_OK;
}

void
zb_convert_get_info(const zb_convert *cv, zb_convert_info *info)
{
    memset(info, 0, sizeof *info);
    if (!cv) return;
    info->n_cells = cv->n_cells;
    info->n_genes = cv->genes.n;
    info->n_datasets = cv->n_datasets;
    info->input_bytes = cv->input_bytes;
    info->work_dir = cv->work;
}

size_t
zb_convert_ntasks(const zb_convert *cv, zb_convert_phase phase)
{
    if (!cv || cv->finished) return 0;
    switch (phase) {
    case ZB_CONVERT_PREPARE:
        return cv->n_inputs;
    case ZB_CONVERT_SCATTER:
        return cv->n_slices;
    case ZB_CONVERT_GATHER:
        return (size_t)cv->n_datasets;
    default:
        return 0;
    }
}

static zb_status
done_path(const zb_convert *cv, zb_convert_phase phase, size_t i, char *buf, size_t cap)
{
    switch (phase) {
    case ZB_CONVERT_PREPARE:
        return cv_path(cv, buf, cap, "prepare/i%zu.json", i);
    case ZB_CONVERT_SCATTER:
        return cv_path(cv, buf, cap, "scatter/t%zu.bin", i);
    case ZB_CONVERT_GATHER:
        return cv_path(cv, buf, cap, "gather/d%zu.json", i);
    default:
        return zb__err(ZB_E_INVALID, "phase %d", (int)phase);
    }
}

bool
zb_convert_task_done(const zb_convert *cv, zb_convert_phase phase, size_t i)
{
    char path[4200];
    if (!cv || i >= zb_convert_ntasks(cv, phase)) return false;
    return done_path(cv, phase, i, path, sizeof path) == ZB_OK && cv_exists(path);
}

static bool
phase_done(const zb_convert *cv, zb_convert_phase phase)
{
    for (size_t i = 0; i < zb_convert_ntasks(cv, phase); i++)
        if (!zb_convert_task_done(cv, phase, i)) return false;
    return true;
}

zb_status
zb_convert_run_task(zb_convert *cv, zb_convert_phase phase, size_t i, int num_threads)
{
    if (!cv) return zb__err(ZB_E_INVALID, "zb_convert_run_task: null handle");
    if (i >= zb_convert_ntasks(cv, phase))
        return zb__err(ZB_E_RANGE, "task %zu of phase %d: the phase has %zu", i, (int)phase,
                       zb_convert_ntasks(cv, phase));
    if (zb_convert_task_done(cv, phase, i)) return ZB_OK;
    if (phase > ZB_CONVERT_PREPARE && !phase_done(cv, (zb_convert_phase)(phase - 1)))
        return zb__err(ZB_E_INVALID, "task %zu of phase %d: the previous phase is not finished", i,
                       (int)phase);
    zb_status st;
    switch (phase) {
    case ZB_CONVERT_PREPARE:
        st = cv_prepare_task(cv, i);
        break;
    case ZB_CONVERT_SCATTER:
        st = cv_scatter_task(cv, i);
        break;
    default:
        st = cv_gather_task(cv, i, num_threads < 1 ? 1 : num_threads);
        break;
    }
    return st;
}

/* ---- zb_convert_run: the phases on a pool ------------------------------------------------------- */

typedef struct runner {
    zb_convert *cv;
    const zb_convert_opts *o;
    pthread_mutex_t lock;
    zb_convert_progress progress;
    zb_status status; /* the first failure */
    char message[1024];
} runner;

typedef struct job {
    runner *r;
    zb_convert_phase phase;
    size_t i;
    int threads;
    uint64_t cells, bytes;
} job;

static void
run_job(void *arg, zb_ctx *ctx)
{
    (void)ctx;
    job *j = arg;
    runner *r = j->r;
    pthread_mutex_lock(&r->lock);
    bool skip = r->status != ZB_OK;
    pthread_mutex_unlock(&r->lock);
    zb_status st = skip ? ZB_OK : zb_convert_run_task(r->cv, j->phase, j->i, j->threads);
    pthread_mutex_lock(&r->lock);
    if (st != ZB_OK && r->status == ZB_OK) {
        r->status = st;
        snprintf(r->message, sizeof r->message, "%s", zb_last_error());
    }
    if (st == ZB_OK && !skip) {
        r->progress.tasks_done++;
        r->progress.cells_done += j->cells;
        r->progress.bytes_done += j->bytes;
        if (r->o->progress) r->o->progress(r->o->progress_ctx, &r->progress);
    }
    pthread_mutex_unlock(&r->lock);
}

/* Cells and bytes task i of a phase stands for (progress units). */
static void
task_size(const zb_convert *cv, zb_convert_phase phase, size_t i, uint64_t *cells, uint64_t *bytes)
{
    if (phase == ZB_CONVERT_PREPARE) {
        *cells = cv->inputs[i].n_obs;
        uint64_t b = 0;
        for (size_t t = 0; t < cv->n_slices; t++)
            if (cv->slices[t].input == i) b += cv->slices[t].bytes;
        *bytes = b;
    } else if (phase == ZB_CONVERT_SCATTER) {
        *cells = cv->slices[i].stop - cv->slices[i].start;
        *bytes = cv->slices[i].bytes;
    } else {
        *cells = cv_dataset_cells(cv, i);
        *bytes = (uint64_t)((double)cv->input_bytes * (double)*cells / (double)cv->n_cells);
    }
}

static zb_status
run_phase(runner *r, zb_convert_phase phase, int concurrency, int task_threads)
{
    zb_convert *cv = r->cv;
    size_t n = zb_convert_ntasks(cv, phase);
    job *jobs = calloc(n ? n : 1, sizeof *jobs);
    if (!jobs) return zb__err(ZB_E_NOMEM, "the task list");
    memset(&r->progress, 0, sizeof r->progress);
    r->progress.phase = phase;
    r->progress.tasks_total = n;
    for (size_t i = 0; i < n; i++) {
        jobs[i] = (job){r, phase, i, task_threads, 0, 0};
        task_size(cv, phase, i, &jobs[i].cells, &jobs[i].bytes);
        r->progress.cells_total += jobs[i].cells;
        r->progress.bytes_total += jobs[i].bytes;
        if (zb_convert_task_done(cv, phase, i)) { /* finished by an earlier run */
            r->progress.tasks_done++;
            r->progress.cells_done += jobs[i].cells;
            r->progress.bytes_done += jobs[i].bytes;
            jobs[i].phase = ZB_CONVERT_PHASES_;
        }
    }
    if (r->o->progress) r->o->progress(r->o->progress_ctx, &r->progress);
    zb__pool *pool = NULL;
    int workers = concurrency < 1 ? 1 : concurrency;
    if ((size_t)workers > n) workers = n ? (int)n : 1;
    zb_status st = zb__pool_new(workers > 1 ? workers : 0, &pool);
    for (size_t i = 0; st == ZB_OK && i < n; i++)
        if (jobs[i].phase != ZB_CONVERT_PHASES_) zb__pool_submit(pool, run_job, &jobs[i]);
    zb__pool_free(pool);
    free(jobs);
    /* the next phase's tasks need other buffers: this phase's go back to the system */
    cv_ws_free_all(cv);
    if (st != ZB_OK) return st;
    if (r->status != ZB_OK) return zb__err(r->status, "%s", r->message);
    return ZB_OK;
}

uint64_t
cv_concurrent_gathers(uint64_t memory, uint64_t writer, uint64_t n_datasets, int threads)
{
    uint64_t need = writer + ((uint64_t)32 << 20);
    uint64_t g = n_datasets < (uint64_t)threads ? n_datasets : (uint64_t)threads;
    if (memory / need < g) g = memory / need;
    return g ? g : 1;
}

/* An exclusive lock on the work directory for the run: a second `zbatch convert` into the
 * same output (which would remove a dataset the first is writing) is refused. The lock goes
 * with the process, so a killed run leaves none. -1 when the work directory is gone (a
 * finished collection: nothing to protect). */
static zb_status
lock_work(const zb_convert *cv, int *fd)
{
    *fd = -1;
    if (!cv_exists(cv->work)) return ZB_OK;
    char path[4200];
    ZB_TRY(cv_path(cv, path, sizeof path, "lock"));
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (*fd < 0) return zb__err(ZB_E_IO, "%s: %s", path, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0) return ZB_OK;
    close(*fd);
    *fd = -1;
    return zb__err(ZB_E_INVALID, "another conversion is running into %s (it holds %s)", cv->output,
                   path);
}

zb_status
zb_convert_run(const char *const *inputs, size_t n_inputs, const char *output,
               const zb_convert_opts *opts)
{
    zb_convert_opts o;
    ZB_TRY(normalize(opts, &o));
    zb_convert *cv = NULL;
    ZB_TRY(zb_convert_plan(inputs, n_inputs, output, &o, &cv));
    cv->input_mmap_bytes = o.input_mmap_bytes;
    int lock = -1;
    zb_status locked = lock_work(cv, &lock);
    if (locked != ZB_OK) {
        zb_convert_close(cv);
        return locked;
    }
    runner r = {.cv = cv, .o = &o};
    pthread_mutex_init(&r.lock, NULL);
    int t = o.num_threads;
    zb_status st = run_phase(&r, ZB_CONVERT_PREPARE, t, 1);
    /* scatter: the plan sized slices so `t` of them fit; a smaller --memory now runs fewer */
    uint64_t biggest = 1;
    for (size_t i = 0; i < cv->n_slices; i++)
        if (cv->slices[i].bytes > biggest) biggest = cv->slices[i].bytes;
    uint64_t fit = o.memory_bytes / (3 * biggest);
    int scatter = fit < (uint64_t)t ? (int)(fit ? fit : 1) : t;
    if (st == ZB_OK) st = run_phase(&r, ZB_CONVERT_SCATTER, scatter, 1);
    uint64_t gathers =
        cv_concurrent_gathers(o.memory_bytes, cv_gather_overhead(cv), cv->n_datasets, t);
    cv->task_memory = o.memory_bytes / gathers;
    if (st == ZB_OK)
        st =
            run_phase(&r, ZB_CONVERT_GATHER, (int)gathers, t / (int)gathers ? t / (int)gathers : 1);
    if (st == ZB_OK) st = zb_convert_finish(cv);
    pthread_mutex_destroy(&r.lock);
    zb_convert_close(cv);
    if (lock >= 0) close(lock); /* after finish removed the work directory, or not */
    return st;
}
