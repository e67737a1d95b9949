/* The anndata layout writer: X (CSR or dense) streamed row block by row block, obs/var
 * dataframes streamed column by column, then groups, consolidated metadata and the root.
 * Format facts: shared FORMATS.md §6 (anndata in Zarr); the element attributes and the node
 * set follow what anndata 0.12.19 writes (checked against its v2 and v3 output). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/json.h"
#include "util/status.h"
#include "write/codec_spec.h"
#include "write/write.h"

/* Elements converted per step when indptr or codes are rebased / narrowed (bounds scratch). */
#define STEP 65536
/* Default rows per chunk of X/indptr and of every obs/var array: one row count for all columns
 * of a dataframe, which FORMATS.md §6 recommends (columns should share chunking). */
#define DEFAULT_COLUMN_CHUNK 65536

typedef enum col_kind { COL_NUMERIC, COL_STRING, COL_CATEGORICAL } col_kind;

typedef struct column {
    char *name;
    col_kind kind;
    zb_dtype dtype;         /* numeric: the values; categorical: the stored codes */
    zb_array_writer *array; /* values, strings or codes */
    uint64_t n;             /* values appended */
    uint64_t n_categories;  /* categorical only */
    bool ordered;
} column;

typedef struct frame {
    const char *name;       /* "obs" or "var" */
    zb_array_writer *index; /* _index, created by the first append_names (or at commit) */
    uint64_t n_index;
    column *cols;
    size_t ncols, cap;
} frame;

/* A node written below the root, for consolidated metadata. */
typedef struct node {
    char *rel; /* relative to the writer's path */
    bool is_array;
} node;

struct zb_anndata_writer {
    zb_store *store;
    char path[4096]; /* normalised; "" = store root */
    int zarr_format;
    char *codec; /* copied option, NULL = the array writer's default */
    uint64_t x_chunk, x_shard, column_chunk;
    int num_threads;
    bool consolidate;

    uint64_t n_vars;
    zb_anndata_x_kind x_kind;
    zb_dtype x_dtype;
    zb_array_writer *x;       /* dense X, or X/data */
    zb_array_writer *indices; /* CSR */
    zb_array_writer *indptr;  /* CSR */
    uint64_t rows, nnz;

    frame frames[2];
    node *nodes;
    size_t nnodes, cap_nodes;

    int64_t *scratch; /* STEP elements */
    zb_status failed; /* non-OK once an array write failed: the writer is unusable */
    bool committed;
};

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

static zb_status
usable(const zb_anndata_writer *w, const char *fn)
{
    if (!w) return zb_err(ZB_E_INVALID, "%s: null writer", fn);
    if (w->committed) return zb_err(ZB_E_INVALID, "%s: the writer has already committed", fn);
    if (w->failed != ZB_OK)
        return zb_err(w->failed, "%s: the writer is unusable after an earlier write failed (%s)",
                      fn, zb_status_name(w->failed));
    return ZB_OK;
}

/* Marks the writer unusable after a failed array write; returns st unchanged. */
static zb_status
broken(zb_anndata_writer *w, zb_status st)
{
    if (st != ZB_OK) w->failed = st;
    return st;
}

/* The dataframe of `axis` (already checked by check_axis). */
static frame *
frame_of(zb_anndata_writer *w, zb_anndata_axis axis)
{
    return &w->frames[axis == ZB_ANNDATA_VAR ? 1 : 0];
}

static zb_status
key_of(const zb_anndata_writer *w, char *buf, size_t cap, const char *rel)
{
    return zb_write_join_key(buf, cap, w->path, rel);
}

static zb_status
add_node(zb_anndata_writer *w, const char *rel, bool is_array)
{
    if (w->nnodes == w->cap_nodes) {
        size_t cap = w->cap_nodes ? 2 * w->cap_nodes : 32;
        node *p = realloc(w->nodes, cap * sizeof *p);
        if (!p) return zb_err(ZB_E_NOMEM, "anndata writer: out of memory");
        w->nodes = p;
        w->cap_nodes = cap;
    }
    char *copy = strdup(rel);
    if (!copy) return zb_err(ZB_E_NOMEM, "anndata writer: out of memory");
    w->nodes[w->nnodes].rel = copy;
    w->nodes[w->nnodes].is_array = is_array;
    w->nnodes++;
    return ZB_OK;
}

/* Attributes of an anndata element: {"encoding-type": type, "encoding-version": version}. */
static void
encoding_attrs(char *buf, size_t cap, const char *type, const char *version)
{
    snprintf(buf, cap, "{\"encoding-type\": \"%s\", \"encoding-version\": \"%s\"}", type, version);
}

/* Opens an array writer at `rel` (relative to the writer's path) and records the node. */
static zb_status
open_array(zb_anndata_writer *w, const char *rel, zb_dtype dtype, int ndim,
           const uint64_t *row_shape, uint64_t chunk_rows, uint64_t shard_rows, int threads,
           const char *attrs_json, zb_array_writer **out)
{
    char key[4200];
    ZB_TRY(key_of(w, key, sizeof key, rel));
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.zarr_format = w->zarr_format;
    o.codec = w->codec;
    o.chunk_rows = chunk_rows;
    o.shard_rows = shard_rows;
    o.num_threads = threads;
    o.attributes_json = attrs_json;
    ZB_TRY(zb_array_writer_open(w->store, key, dtype, ndim, row_shape, &o, out));
    zb_status st = add_node(w, rel, true);
    if (st != ZB_OK) {
        zb_array_writer_close(*out);
        *out = NULL;
    }
    return st;
}

static uint64_t
column_chunk_for(const zb_anndata_writer *w, zb_anndata_axis axis)
{
    uint64_t c = w->column_chunk ? w->column_chunk : DEFAULT_COLUMN_CHUNK;
    /* var has a known length: a chunk longer than the column would only be padding */
    if (axis == ZB_ANNDATA_VAR && w->n_vars && c > w->n_vars) c = w->n_vars;
    return c;
}

/* Checks `offsets[0..n]` of a string block: non-decreasing. */
static zb_status
check_offsets(const uint64_t *offsets, uint64_t n, const char *what)
{
    if (!offsets) return zb_err(ZB_E_INVALID, "%s: null offsets", what);
    for (uint64_t i = 0; i < n; i++)
        if (offsets[i + 1] < offsets[i])
            return zb_err(ZB_E_INVALID,
                          "%s: offsets decrease at string %" PRIu64 " (%" PRIu64 " after %" PRIu64
                          ")",
                          what, i, offsets[i + 1], offsets[i]);
    return ZB_OK;
}

static zb_status
check_axis(zb_anndata_axis axis, const char *fn)
{
    if (axis != ZB_ANNDATA_OBS && axis != ZB_ANNDATA_VAR)
        return zb_err(ZB_E_INVALID, "%s: axis %d is neither obs nor var", fn, (int)axis);
    return ZB_OK;
}

/* var columns cannot outgrow n_vars. */
static zb_status
check_room(const zb_anndata_writer *w, zb_anndata_axis axis, uint64_t have, uint64_t add,
           const char *what)
{
    if (axis == ZB_ANNDATA_VAR && (add > w->n_vars || have > w->n_vars - add))
        return zb_err(ZB_E_INVALID,
                      "var/%s: %" PRIu64 " + %" PRIu64 " values exceed n_vars %" PRIu64, what, have,
                      add, w->n_vars);
    return ZB_OK;
}

/* Column names become keys: non-empty, no '/', not `_index`, no reserved "__" prefix (v3
 * forbids it, FORMATS.md §3.1), and not "." or "..". */
static zb_status
check_name(const char *frame_name, const char *name)
{
    if (!name || !*name) return zb_err(ZB_E_INVALID, "%s: empty column name", frame_name);
    if (strchr(name, '/') || strchr(name, '\\'))
        return zb_err(ZB_E_INVALID, "%s/%s: a column name cannot contain '/'", frame_name, name);
    if (!strcmp(name, "_index") || !strcmp(name, ".") || !strcmp(name, ".."))
        return zb_err(ZB_E_INVALID, "%s: '%s' is not a valid column name", frame_name, name);
    if (!strncmp(name, "__", 2))
        return zb_err(ZB_E_INVALID, "%s/%s: names starting with '__' are reserved by Zarr",
                      frame_name, name);
    if (strlen(name) > 1024)
        return zb_err(ZB_E_INVALID, "%s: column name longer than 1024 bytes", frame_name);
    return ZB_OK;
}

static column *
find_column(frame *f, const char *name)
{
    for (size_t i = 0; i < f->ncols; i++)
        if (!strcmp(f->cols[i].name, name)) return &f->cols[i];
    return NULL;
}

static zb_status
new_column(frame *f, const char *name, col_kind kind, zb_dtype dtype, column **out)
{
    if (f->ncols == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        column *p = realloc(f->cols, cap * sizeof *p);
        if (!p) return zb_err(ZB_E_NOMEM, "%s/%s: out of memory", f->name, name);
        f->cols = p;
        f->cap = cap;
    }
    column *c = &f->cols[f->ncols];
    memset(c, 0, sizeof *c);
    c->name = strdup(name);
    if (!c->name) return zb_err(ZB_E_NOMEM, "%s/%s: out of memory", f->name, name);
    c->kind = kind;
    c->dtype = dtype;
    f->ncols++;
    *out = c;
    return ZB_OK;
}

/* Drops the last column (its creation failed half-way). */
static void
drop_last_column(frame *f)
{
    column *c = &f->cols[--f->ncols];
    zb_array_writer_close(c->array);
    free(c->name);
}

/* ---------------------------------------------------------------------------------------------
 * Open and close
 * ------------------------------------------------------------------------------------------- */

/* True if `key` exists; an error other than not-found is returned in *st. */
static bool
key_exists(zb_store *store, const char *key, zb_status *st)
{
    uint64_t size;
    zb_status s = zb_store_size(store, key, &size);
    if (s == ZB_OK) return true;
    if (s != ZB_E_NOTFOUND) *st = s;
    return false;
}

static zb_status
refuse_existing_node(zb_anndata_writer *w)
{
    static const char *const docs[] = {"zarr.json", ".zgroup", ".zarray"};
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        char key[4200];
        ZB_TRY(key_of(w, key, sizeof key, docs[i]));
        zb_status st = ZB_OK;
        if (key_exists(w->store, key, &st))
            return zb_err(ZB_E_INVALID, "'%s' already holds a Zarr node (%s); remove it first",
                          w->path[0] ? w->path : "/", docs[i]);
        if (st != ZB_OK) return st;
    }
    return ZB_OK;
}

static zb_status
write_marker(zb_anndata_writer *w)
{
    char key[4200];
    ZB_TRY(key_of(w, key, sizeof key, ZB_INCOMPLETE_MARKER));
    /* no pid or clock: a crashed store should look the same whatever wrote it */
    static const char text[] =
        "{\"writer\": \"zbatch " ZB_VERSION_STRING "\", \"layout\": \"anndata\", "
        "\"state\": \"writing; the store is not valid until this marker is gone\"}\n";
    return zb_store_put(w->store, key, text, sizeof text - 1);
}

static zb_status
open_x(zb_anndata_writer *w)
{
    if (w->x_kind == ZB_ANNDATA_X_DENSE) {
        char attrs[128];
        encoding_attrs(attrs, sizeof attrs, "array", "0.2.0");
        uint64_t row[1] = {w->n_vars};
        return open_array(w, "X", w->x_dtype, 2, row, w->x_chunk, w->x_shard, w->num_threads, attrs,
                          &w->x);
    }
    uint64_t chunk = w->x_chunk ? w->x_chunk : ZB_ANNDATA_DEFAULT_X_CHUNK;
    /* the arrays inside a sparse group carry no encoding attributes (FORMATS.md §6) */
    ZB_TRY(open_array(w, "X/data", w->x_dtype, 1, NULL, chunk, w->x_shard, w->num_threads, NULL,
                      &w->x));
    ZB_TRY(open_array(w, "X/indices", ZB_DT_INT32, 1, NULL, chunk, w->x_shard, w->num_threads, NULL,
                      &w->indices));
    ZB_TRY(open_array(w, "X/indptr", ZB_DT_INT64, 1, NULL, column_chunk_for(w, ZB_ANNDATA_OBS), 0,
                      1, NULL, &w->indptr));
    int64_t zero = 0;
    return zb_array_writer_append(w->indptr, &zero, 1);
}

zb_status
zb_anndata_writer_open(zb_store *store, const char *path, uint64_t n_vars, zb_anndata_x_kind x_kind,
                       zb_dtype x_dtype, const zb_anndata_write_opts *opts, zb_anndata_writer **out)
{
    if (!out) return zb_err(ZB_E_INVALID, "zb_anndata_writer_open: null out");
    *out = NULL;
    if (!store || !path) return zb_err(ZB_E_INVALID, "zb_anndata_writer_open: null argument");
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    if (opts) o = *opts;
    if (o.zarr_format != 2 && o.zarr_format != 3)
        return zb_err(ZB_E_INVALID, "anndata writer: zarr_format %d is not 2 or 3", o.zarr_format);
    if (x_kind != ZB_ANNDATA_X_CSR && x_kind != ZB_ANNDATA_X_DENSE)
        return zb_err(ZB_E_INVALID, "anndata writer: unknown X kind %d", (int)x_kind);
    if ((int)x_dtype < 0 || x_dtype >= ZB_DT_COUNT_ || x_dtype == ZB_DT_STRING)
        return zb_err(ZB_E_INVALID, "anndata writer: X must have a fixed-size dtype");
    if (x_kind == ZB_ANNDATA_X_CSR && n_vars > INT32_MAX)
        return zb_err(ZB_E_INVALID,
                      "anndata writer: n_vars %" PRIu64 " does not fit int32 column ids", n_vars);
    if (o.x_shard && o.zarr_format != 3)
        return zb_err(ZB_E_INVALID, "anndata writer: sharding needs zarr_format 3");
    if (o.x_shard) {
        uint64_t chunk =
            o.x_chunk ? o.x_chunk : (x_kind == ZB_ANNDATA_X_CSR ? ZB_ANNDATA_DEFAULT_X_CHUNK : 0);
        if (!chunk)
            return zb_err(ZB_E_INVALID, "anndata writer: a dense X shard needs x_chunk set");
        if (o.x_shard % chunk)
            return zb_err(ZB_E_INVALID,
                          "anndata writer: x_shard %" PRIu64
                          " is not a multiple of x_chunk %" PRIu64,
                          o.x_shard, chunk);
    }
    if (o.num_threads < 0)
        return zb_err(ZB_E_INVALID, "anndata writer: num_threads %d < 0", o.num_threads);
    /* a bad codec string is refused before the marker is written */
    zb_codec codec;
    bool has_codec;
    ZB_TRY(zb_codec_spec_parse(o.codec, o.zarr_format, &codec, &has_codec));

    zb_anndata_writer *w = calloc(1, sizeof *w);
    if (!w) return zb_err(ZB_E_NOMEM, "anndata writer: out of memory");
    zb_status st = zb_key_normalize(path, w->path, sizeof w->path);
    if (st != ZB_OK) goto fail;
    w->store = store;
    w->zarr_format = o.zarr_format;
    w->x_chunk = o.x_chunk;
    w->x_shard = o.x_shard;
    w->column_chunk = o.column_chunk;
    w->num_threads = o.num_threads;
    w->consolidate = o.consolidate;
    w->n_vars = n_vars;
    w->x_kind = x_kind;
    w->x_dtype = x_dtype;
    w->frames[ZB_ANNDATA_OBS].name = "obs";
    w->frames[ZB_ANNDATA_VAR].name = "var";
    w->scratch = malloc(STEP * sizeof *w->scratch);
    if (o.codec) w->codec = strdup(o.codec);
    if (!w->scratch || (o.codec && !w->codec)) {
        st = zb_err(ZB_E_NOMEM, "anndata writer: out of memory");
        goto fail;
    }
    st = refuse_existing_node(w);
    if (st != ZB_OK) goto fail;
    /* the marker goes first: from here on a crash leaves a store that readers refuse */
    st = write_marker(w);
    if (st != ZB_OK) goto fail;
    st = open_x(w);
    if (st != ZB_OK) goto fail;
    *out = w;
    return ZB_OK;
fail:
    zb_anndata_writer_close(w);
    return st;
}

static void
free_frame(frame *f)
{
    zb_array_writer_close(f->index);
    for (size_t i = 0; i < f->ncols; i++) {
        zb_array_writer_close(f->cols[i].array);
        free(f->cols[i].name);
    }
    free(f->cols);
}

void
zb_anndata_writer_close(zb_anndata_writer *w)
{
    if (!w) return;
    zb_array_writer_close(w->x);
    zb_array_writer_close(w->indices);
    zb_array_writer_close(w->indptr);
    free_frame(&w->frames[0]);
    free_frame(&w->frames[1]);
    for (size_t i = 0; i < w->nnodes; i++) free(w->nodes[i].rel);
    free(w->nodes);
    free(w->scratch);
    free(w->codec);
    free(w);
}

uint64_t
zb_anndata_writer_rows(const zb_anndata_writer *w)
{
    return w ? w->rows : 0;
}

uint64_t
zb_anndata_writer_nnz(const zb_anndata_writer *w)
{
    return w ? w->nnz : 0;
}

/* ---------------------------------------------------------------------------------------------
 * X
 * ------------------------------------------------------------------------------------------- */

zb_status
zb_anndata_writer_append_csr(zb_anndata_writer *w, uint64_t nrows, const int64_t *indptr,
                             const int32_t *indices, const void *data)
{
    ZB_TRY(usable(w, "append_csr"));
    if (w->x_kind != ZB_ANNDATA_X_CSR)
        return zb_err(ZB_E_TYPE, "append_csr: X is dense (use append_dense)");
    if (nrows == 0) return ZB_OK;
    if (!indptr) return zb_err(ZB_E_INVALID, "append_csr: null indptr");
    if (indptr[0] < 0)
        return zb_err(ZB_E_INVALID, "append_csr: indptr[0] = %" PRId64 " is negative", indptr[0]);
    /* validate the whole block before writing any of it */
    for (uint64_t r = 0; r < nrows; r++)
        if (indptr[r + 1] < indptr[r])
            return zb_err(ZB_E_INVALID,
                          "append_csr: indptr decreases at row %" PRIu64 " of the block (%" PRId64
                          " after %" PRId64 ")",
                          r, indptr[r + 1], indptr[r]);
    uint64_t k = (uint64_t)(indptr[nrows] - indptr[0]);
    uint64_t total;
    if (!zb_add_u64(w->nnz, k, &total) || total > (uint64_t)INT64_MAX)
        return zb_err(ZB_E_OVERFLOW, "append_csr: more than 2^63 stored elements");
    if (k && (!indices || !data))
        return zb_err(ZB_E_INVALID, "append_csr: null indices or data for %" PRIu64 " elements", k);
    uint64_t r = 0;
    for (uint64_t e = 0; e < k; e++) {
        if ((uint64_t)indices[e] < w->n_vars) continue; /* negative ids wrap and fail too */
        while (r + 1 < nrows && (uint64_t)(indptr[r + 1] - indptr[0]) <= e) r++;
        return zb_err(ZB_E_INVALID,
                      "append_csr: column id %" PRId32 " of element %" PRIu64 " (row %" PRIu64
                      " of the block) is outside [0, %" PRIu64 ")",
                      indices[e], e, r, w->n_vars);
    }

    zb_status st = zb_array_writer_append(w->indices, indices, k);
    if (st == ZB_OK) st = zb_array_writer_append(w->x, data, k);
    /* indptr rebased onto the elements already written, STEP entries at a time */
    for (uint64_t r0 = 0; st == ZB_OK && r0 < nrows; r0 += STEP) {
        uint64_t m = nrows - r0 < STEP ? nrows - r0 : STEP;
        for (uint64_t i = 0; i < m; i++)
            w->scratch[i] = (int64_t)w->nnz + (indptr[r0 + i + 1] - indptr[0]);
        st = zb_array_writer_append(w->indptr, w->scratch, m);
    }
    if (st != ZB_OK) return broken(w, st);
    w->nnz = total;
    w->rows += nrows;
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_dense(zb_anndata_writer *w, uint64_t nrows, const void *rows)
{
    ZB_TRY(usable(w, "append_dense"));
    if (w->x_kind != ZB_ANNDATA_X_DENSE)
        return zb_err(ZB_E_TYPE, "append_dense: X is CSR (use append_csr)");
    if (nrows == 0) return ZB_OK;
    if (!rows && w->n_vars) return zb_err(ZB_E_INVALID, "append_dense: null rows");
    zb_status st = zb_array_writer_append(w->x, rows, nrows);
    if (st != ZB_OK) return broken(w, st);
    w->rows += nrows;
    return ZB_OK;
}

/* ---------------------------------------------------------------------------------------------
 * obs and var
 * ------------------------------------------------------------------------------------------- */

static zb_status
open_index(zb_anndata_writer *w, zb_anndata_axis axis)
{
    frame *f = frame_of(w, axis);
    if (f->index) return ZB_OK;
    char rel[64], attrs[128];
    snprintf(rel, sizeof rel, "%s/_index", f->name);
    encoding_attrs(attrs, sizeof attrs, "string-array", "0.2.0");
    return open_array(w, rel, ZB_DT_STRING, 1, NULL, column_chunk_for(w, axis), 0, 1, attrs,
                      &f->index);
}

zb_status
zb_anndata_writer_append_names(zb_anndata_writer *w, zb_anndata_axis axis, const char *data,
                               const uint64_t *offsets, uint64_t n)
{
    ZB_TRY(usable(w, "append_names"));
    ZB_TRY(check_axis(axis, "append_names"));
    frame *f = frame_of(w, axis);
    ZB_TRY(check_room(w, axis, f->n_index, n, "_index"));
    if (n == 0) return ZB_OK;
    ZB_TRY(check_offsets(offsets, n, f->name));
    if (!data && offsets[n] > offsets[0])
        return zb_err(ZB_E_INVALID, "%s/_index: null data", f->name);
    ZB_TRY(broken(w, open_index(w, axis)));
    ZB_TRY(broken(w, zb_array_writer_append_strings(f->index, data, offsets, n)));
    f->n_index += n;
    return ZB_OK;
}

/* The column `name`, created as `kind`/`dtype` (numeric and string columns) if it does not
 * exist yet; ZB_E_TYPE when it exists with another kind or dtype. */
static zb_status
get_column(zb_anndata_writer *w, zb_anndata_axis axis, const char *name, col_kind kind,
           zb_dtype dtype, column **out)
{
    frame *f = frame_of(w, axis);
    ZB_TRY(check_name(f->name, name));
    column *c = find_column(f, name);
    if (c) {
        if (c->kind != kind || c->dtype != dtype)
            return zb_err(ZB_E_TYPE, "%s/%s: the column exists as a %s column", f->name, name,
                          c->kind == COL_CATEGORICAL ? "categorical" : zb_dtype_name(c->dtype));
        *out = c;
        return ZB_OK;
    }
    ZB_TRY(new_column(f, name, kind, dtype, &c));
    char rel[1100], attrs[128];
    snprintf(rel, sizeof rel, "%s/%s", f->name, name);
    encoding_attrs(attrs, sizeof attrs, kind == COL_STRING ? "string-array" : "array", "0.2.0");
    zb_status st =
        open_array(w, rel, dtype, 1, NULL, column_chunk_for(w, axis), 0, 1, attrs, &c->array);
    if (st != ZB_OK) {
        drop_last_column(f);
        return broken(w, st);
    }
    *out = c;
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_column(zb_anndata_writer *w, zb_anndata_axis axis, const char *name,
                                zb_dtype dtype, const void *values, uint64_t n)
{
    ZB_TRY(usable(w, "append_column"));
    ZB_TRY(check_axis(axis, "append_column"));
    const char *fname = frame_of(w, axis)->name;
    if ((int)dtype < 0 || dtype >= ZB_DT_COUNT_ || dtype == ZB_DT_STRING)
        return zb_err(ZB_E_INVALID,
                      "%s/%s: a numeric column needs a fixed-size dtype "
                      "(append_string_column takes strings)",
                      fname, name ? name : "");
    ZB_TRY(check_name(fname, name));
    if (n && !values) return zb_err(ZB_E_INVALID, "%s/%s: null values", fname, name);
    if (dtype == ZB_DT_BOOL) {
        const uint8_t *b = values;
        for (uint64_t i = 0; i < n; i++)
            if (b[i] > 1)
                return zb_err(ZB_E_INVALID, "%s/%s: bool value %u at %" PRIu64 " is not 0 or 1",
                              fname, name, b[i], i);
    }
    column *c = find_column(frame_of(w, axis), name);
    ZB_TRY(check_room(w, axis, c ? c->n : 0, n, name));
    ZB_TRY(get_column(w, axis, name, COL_NUMERIC, dtype, &c));
    if (n) ZB_TRY(broken(w, zb_array_writer_append(c->array, values, n)));
    c->n += n;
    return ZB_OK;
}

zb_status
zb_anndata_writer_append_string_column(zb_anndata_writer *w, zb_anndata_axis axis, const char *name,
                                       const char *data, const uint64_t *offsets, uint64_t n)
{
    ZB_TRY(usable(w, "append_string_column"));
    ZB_TRY(check_axis(axis, "append_string_column"));
    const char *fname = frame_of(w, axis)->name;
    ZB_TRY(check_name(fname, name));
    if (n) {
        ZB_TRY(check_offsets(offsets, n, name));
        if (!data && offsets[n] > offsets[0])
            return zb_err(ZB_E_INVALID, "%s/%s: null data", fname, name);
    }
    column *c = find_column(frame_of(w, axis), name);
    ZB_TRY(check_room(w, axis, c ? c->n : 0, n, name));
    ZB_TRY(get_column(w, axis, name, COL_STRING, ZB_DT_STRING, &c));
    if (n) ZB_TRY(broken(w, zb_array_writer_append_strings(c->array, data, offsets, n)));
    c->n += n;
    return ZB_OK;
}

/* One category, for the distinctness check. */
typedef struct strref {
    const char *p;
    uint64_t len;
} strref;

static int
cmp_strref(const void *a, const void *b)
{
    const strref *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->len ? memcmp(x->p, y->p, x->len) : 0;
}

/* pandas gives codes the smallest signed type with max > n_categories
 * (pandas.core.dtypes.cast.coerce_indexer_dtype: int8 below 127, int16 below 32767, ...). */
static zb_dtype
codes_dtype_for(uint64_t n_categories)
{
    if (n_categories < INT8_MAX) return ZB_DT_INT8;
    if (n_categories < INT16_MAX) return ZB_DT_INT16;
    return ZB_DT_INT32;
}

static zb_status
check_distinct(const char *fname, const char *name, const char *data, const uint64_t *offsets,
               uint64_t n)
{
    if (n < 2) return ZB_OK;
    strref *v = malloc(n * sizeof *v);
    if (!v) return zb_err(ZB_E_NOMEM, "%s/%s: out of memory", fname, name);
    for (uint64_t i = 0; i < n; i++) {
        v[i].p = data + (offsets[i] - offsets[0]);
        v[i].len = offsets[i + 1] - offsets[i];
    }
    qsort(v, n, sizeof *v, cmp_strref);
    zb_status st = ZB_OK;
    for (uint64_t i = 1; i < n && st == ZB_OK; i++)
        if (!cmp_strref(&v[i - 1], &v[i]))
            st = zb_err(ZB_E_INVALID, "%s/%s: category '%.*s' appears more than once", fname, name,
                        (int)(v[i].len > 64 ? 64 : v[i].len), v[i].p);
    free(v);
    return st;
}

/* Writes the categories array of a categorical column whole and commits it. */
static zb_status
write_categories(zb_anndata_writer *w, zb_anndata_axis axis, const char *name, const char *data,
                 const uint64_t *offsets, uint64_t n)
{
    char rel[1100], attrs[128];
    snprintf(rel, sizeof rel, "%s/%s/categories", frame_of(w, axis)->name, name);
    encoding_attrs(attrs, sizeof attrs, "string-array", "0.2.0");
    uint64_t chunk = w->column_chunk ? w->column_chunk : DEFAULT_COLUMN_CHUNK;
    if (n && chunk > n) chunk = n;
    zb_array_writer *a = NULL;
    ZB_TRY(open_array(w, rel, ZB_DT_STRING, 1, NULL, chunk, 0, 1, attrs, &a));
    zb_status st = n ? zb_array_writer_append_strings(a, data, offsets, n) : ZB_OK;
    if (st == ZB_OK) st = zb_array_writer_commit(a);
    zb_array_writer_close(a);
    return st;
}

zb_status
zb_anndata_writer_define_categorical(zb_anndata_writer *w, zb_anndata_axis axis, const char *name,
                                     const char *categories, const uint64_t *offsets,
                                     uint64_t n_categories, bool ordered)
{
    ZB_TRY(usable(w, "define_categorical"));
    ZB_TRY(check_axis(axis, "define_categorical"));
    frame *f = frame_of(w, axis);
    ZB_TRY(check_name(f->name, name));
    if (find_column(f, name))
        return zb_err(ZB_E_INVALID, "%s/%s: a column of that name exists", f->name, name);
    if (n_categories >= INT32_MAX)
        return zb_err(ZB_E_INVALID, "%s/%s: %" PRIu64 " categories are too many", f->name, name,
                      n_categories);
    if (n_categories) {
        ZB_TRY(check_offsets(offsets, n_categories, name));
        if (!categories && offsets[n_categories] > offsets[0])
            return zb_err(ZB_E_INVALID, "%s/%s: null categories", f->name, name);
        ZB_TRY(check_distinct(f->name, name, categories, offsets, n_categories));
    }
    column *c;
    zb_dtype dt = codes_dtype_for(n_categories);
    ZB_TRY(new_column(f, name, COL_CATEGORICAL, dt, &c));
    c->n_categories = n_categories;
    c->ordered = ordered;
    char rel[1100], attrs[128];
    snprintf(rel, sizeof rel, "%s/%s", f->name, name);
    /* from the categories' put on, a failure has touched the store: the writer is broken */
    zb_status st = write_categories(w, axis, name, categories, offsets, n_categories);
    if (st == ZB_OK) st = add_node(w, rel, false);
    if (st == ZB_OK) {
        snprintf(rel, sizeof rel, "%s/%s/codes", f->name, name);
        encoding_attrs(attrs, sizeof attrs, "array", "0.2.0");
        st = open_array(w, rel, dt, 1, NULL, column_chunk_for(w, axis), 0, 1, attrs, &c->array);
    }
    if (st != ZB_OK) {
        drop_last_column(f);
        return broken(w, st);
    }
    return ZB_OK;
}

/* Code i of a block of `dtype` as int64. */
static int64_t
code_at(const void *codes, zb_dtype dtype, uint64_t i)
{
    switch (dtype) {
    case ZB_DT_INT8:
        return ((const int8_t *)codes)[i];
    case ZB_DT_INT16:
        return ((const int16_t *)codes)[i];
    case ZB_DT_INT32:
        return ((const int32_t *)codes)[i];
    default:
        return ((const int64_t *)codes)[i];
    }
}

zb_status
zb_anndata_writer_append_codes(zb_anndata_writer *w, zb_anndata_axis axis, const char *name,
                               zb_dtype codes_dtype, const void *codes, uint64_t n)
{
    ZB_TRY(usable(w, "append_codes"));
    ZB_TRY(check_axis(axis, "append_codes"));
    frame *f = frame_of(w, axis);
    if (!name) return zb_err(ZB_E_INVALID, "append_codes: null name");
    column *c = find_column(f, name);
    if (!c) return zb_err(ZB_E_NOTFOUND, "%s/%s: no such categorical column", f->name, name);
    if (c->kind != COL_CATEGORICAL)
        return zb_err(ZB_E_TYPE, "%s/%s: not a categorical column", f->name, name);
    if (codes_dtype != ZB_DT_INT8 && codes_dtype != ZB_DT_INT16 && codes_dtype != ZB_DT_INT32 &&
        codes_dtype != ZB_DT_INT64)
        return zb_err(ZB_E_TYPE, "%s/%s: codes must be int8, int16, int32 or int64", f->name, name);
    ZB_TRY(check_room(w, axis, c->n, n, name));
    if (n && !codes) return zb_err(ZB_E_INVALID, "%s/%s: null codes", f->name, name);
    int64_t ncat = (int64_t)c->n_categories;
    for (uint64_t i = 0; i < n; i++) {
        int64_t v = code_at(codes, codes_dtype, i);
        if (v < -1 || v >= ncat)
            return zb_err(ZB_E_INVALID,
                          "%s/%s: code %" PRId64 " at %" PRIu64 " is outside [-1, %" PRId64 ")",
                          f->name, name, v, i, ncat);
    }
    if (codes_dtype == c->dtype) {
        if (n) ZB_TRY(broken(w, zb_array_writer_append(c->array, codes, n)));
    } else {
        /* narrow (or widen) to the stored type, STEP codes at a time; values are in range */
        for (uint64_t i0 = 0; i0 < n; i0 += STEP) {
            uint64_t m = n - i0 < STEP ? n - i0 : STEP;
            void *dst = w->scratch;
            for (uint64_t i = 0; i < m; i++) {
                int64_t v = code_at(codes, codes_dtype, i0 + i);
                switch (c->dtype) {
                case ZB_DT_INT8:
                    ((int8_t *)dst)[i] = (int8_t)v;
                    break;
                case ZB_DT_INT16:
                    ((int16_t *)dst)[i] = (int16_t)v;
                    break;
                default:
                    ((int32_t *)dst)[i] = (int32_t)v;
                    break;
                }
            }
            ZB_TRY(broken(w, zb_array_writer_append(c->array, dst, m)));
        }
    }
    c->n += n;
    return ZB_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Commit
 * ------------------------------------------------------------------------------------------- */

static zb_status
check_lengths(const zb_anndata_writer *w)
{
    for (int a = 0; a < 2; a++) {
        const frame *f = &w->frames[a];
        uint64_t want = a == ZB_ANNDATA_OBS ? w->rows : w->n_vars;
        const char *what = a == ZB_ANNDATA_OBS ? "n_obs (rows of X)" : "n_vars";
        if (f->index && f->n_index != want)
            return zb_err(ZB_E_INVALID, "%s/_index: %" PRIu64 " names, %s is %" PRIu64, f->name,
                          f->n_index, what, want);
        for (size_t i = 0; i < f->ncols; i++)
            if (f->cols[i].n != want)
                return zb_err(ZB_E_INVALID, "%s/%s: %" PRIu64 " values, %s is %" PRIu64, f->name,
                              f->cols[i].name, f->cols[i].n, what, want);
    }
    return ZB_OK;
}

/* anndata's default row names for a frame written without them: "0", "1", ... */
static zb_status
write_default_index(zb_anndata_writer *w, zb_anndata_axis axis, uint64_t n)
{
    frame *f = frame_of(w, axis);
    ZB_TRY(open_index(w, axis));
    enum { BLOCK = 4096 };
    char *text = malloc(BLOCK * 21);
    uint64_t *offs = malloc((BLOCK + 1) * sizeof *offs);
    zb_status st = text && offs ? ZB_OK : zb_err(ZB_E_NOMEM, "%s/_index: out of memory", f->name);
    for (uint64_t i0 = 0; st == ZB_OK && i0 < n; i0 += BLOCK) {
        uint64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        uint64_t pos = 0;
        offs[0] = 0;
        for (uint64_t i = 0; i < m; i++) {
            pos += (uint64_t)snprintf(text + pos, 21, "%" PRIu64, i0 + i);
            offs[i + 1] = pos;
        }
        st = zb_array_writer_append_strings(f->index, text, offs, m);
    }
    free(text);
    free(offs);
    if (st == ZB_OK) f->n_index = n;
    return st;
}

static zb_status
commit_arrays(zb_anndata_writer *w)
{
    zb_array_writer *x[3] = {w->x, w->indices, w->indptr};
    for (int i = 0; i < 3; i++)
        if (x[i]) ZB_TRY(zb_array_writer_commit(x[i]));
    for (int a = 0; a < 2; a++) {
        frame *f = &w->frames[a];
        ZB_TRY(zb_array_writer_commit(f->index));
        for (size_t i = 0; i < f->ncols; i++) ZB_TRY(zb_array_writer_commit(f->cols[i].array));
    }
    return ZB_OK;
}

/* Writes the group at `rel` with attributes `attrs` (a JSON object text) and records it. */
static zb_status
write_group(zb_anndata_writer *w, const char *rel, const char *attrs)
{
    char key[4200];
    ZB_TRY(key_of(w, key, sizeof key, rel));
    ZB_TRY(zb_write_group(w->store, key, w->zarr_format, attrs));
    return add_node(w, rel, false);
}

/* {"_index": "_index", "column-order": [...], "encoding-type": "dataframe", ...} */
static zb_status
write_frame_group(zb_anndata_writer *w, const frame *f)
{
    int ok = 1;
    json_object *attrs = json_object_new_object();
    zb_jw_add(attrs, "_index", json_object_new_string("_index"), &ok);
    json_object *order = zb_jw_add(attrs, "column-order", json_object_new_array(), &ok);
    for (size_t i = 0; i < f->ncols && ok; i++)
        zb_jw_push(order, json_object_new_string(f->cols[i].name), &ok);
    zb_jw_add(attrs, "encoding-type", json_object_new_string("dataframe"), &ok);
    zb_jw_add(attrs, "encoding-version", json_object_new_string("0.2.0"), &ok);
    zb_status st = ok ? write_group(w, f->name, zb_json_text(attrs))
                      : zb_err(ZB_E_NOMEM, "%s: out of memory", f->name);
    json_object_put(attrs);
    return st;
}

static zb_status
write_groups(zb_anndata_writer *w)
{
    char attrs[256];
    if (w->x_kind == ZB_ANNDATA_X_CSR) {
        snprintf(attrs, sizeof attrs,
                 "{\"encoding-type\": \"csr_matrix\", \"encoding-version\": \"0.1.0\", "
                 "\"shape\": [%" PRIu64 ", %" PRIu64 "]}",
                 w->rows, w->n_vars);
        ZB_TRY(write_group(w, "X", attrs));
    }
    for (int a = 0; a < 2; a++) {
        const frame *f = &w->frames[a];
        for (size_t i = 0; i < f->ncols; i++) {
            const column *c = &f->cols[i];
            if (c->kind != COL_CATEGORICAL) continue;
            char rel[1100];
            snprintf(rel, sizeof rel, "%s/%s", f->name, c->name);
            snprintf(attrs, sizeof attrs,
                     "{\"encoding-type\": \"categorical\", \"encoding-version\": \"0.2.0\", "
                     "\"ordered\": %s}",
                     c->ordered ? "true" : "false");
            char key[4200];
            ZB_TRY(key_of(w, key, sizeof key, rel));
            /* the node was recorded by define_categorical */
            ZB_TRY(zb_write_group(w->store, key, w->zarr_format, attrs));
        }
        ZB_TRY(write_frame_group(w, f));
    }
    /* anndata writes every mapping, even empty (FORMATS.md §6) */
    static const char *const dicts[] = {"layers", "obsm", "obsp", "varm", "varp", "uns"};
    encoding_attrs(attrs, sizeof attrs, "dict", "0.1.0");
    for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++)
        ZB_TRY(write_group(w, dicts[i], attrs));
    return ZB_OK;
}

/* Reads and parses the document under `rel`/`name`; *out is NULL when absent and optional. */
static zb_status
read_doc(zb_anndata_writer *w, const char *rel, const char *name, bool optional, json_object **out)
{
    *out = NULL;
    char relkey[1200], key[4200];
    ZB_TRY(zb_write_join_key(relkey, sizeof relkey, rel, name));
    ZB_TRY(key_of(w, key, sizeof key, relkey));
    uint8_t *text = NULL;
    uint64_t len = 0;
    zb_status st = zb_store_read_all(w->store, key, &text, &len);
    if (st == ZB_E_NOTFOUND && optional) return ZB_OK;
    if (st != ZB_OK) return st;
    st = zb_json_parse((const char *)text, (size_t)len, key, out);
    free(text);
    return st;
}

/* Adds `rel`'s node documents to the consolidated `meta` object (FORMATS.md §1.4 for v2: keys
 * with the .zarray/.zgroup/.zattrs suffix; §3.5 for v3: keys without, nested groups carrying an
 * empty consolidated_metadata as zarr-python writes them). */
static zb_status
consolidate_node(zb_anndata_writer *w, const node *nd, json_object *meta)
{
    int ok = 1;
    json_object *doc = NULL;
    if (w->zarr_format == 3) {
        ZB_TRY(read_doc(w, nd->rel, "zarr.json", false, &doc));
        if (!nd->is_array) {
            json_object *cm =
                zb_jw_add(doc, "consolidated_metadata", json_object_new_object(), &ok);
            zb_jw_add(cm, "kind", json_object_new_string("inline"), &ok);
            zb_jw_add(cm, "must_understand", json_object_new_boolean(0), &ok);
            zb_jw_add(cm, "metadata", json_object_new_object(), &ok);
        }
        zb_jw_add(meta, nd->rel, doc, &ok);
        return ok ? ZB_OK : zb_err(ZB_E_NOMEM, "consolidated metadata: out of memory");
    }
    const char *docname = nd->is_array ? ".zarray" : ".zgroup";
    char key[1200];
    ZB_TRY(zb_write_join_key(key, sizeof key, nd->rel, docname));
    ZB_TRY(read_doc(w, nd->rel, docname, false, &doc));
    zb_jw_add(meta, key, doc, &ok);
    ZB_TRY(zb_write_join_key(key, sizeof key, nd->rel, ".zattrs"));
    ZB_TRY(read_doc(w, nd->rel, ".zattrs", true, &doc));
    if (doc) zb_jw_add(meta, key, doc, &ok);
    return ok ? ZB_OK : zb_err(ZB_E_NOMEM, "consolidated metadata: out of memory");
}

static int
depth_of(const char *path)
{
    int d = 0;
    for (; *path; path++) d += *path == '/';
    return d;
}

/* zarr-python rebuilds the nested tree from the flat keys by grouping consecutive keys of one
 * parent after a stable sort by depth (zarr/core/group.py, _flat_to_nested), so siblings must be
 * adjacent: sort by depth, then by path (keys sharing a prefix are contiguous in byte order). */
static int
cmp_node(const void *a, const void *b)
{
    const node *x = a, *y = b;
    int dx = depth_of(x->rel), dy = depth_of(y->rel);
    if (dx != dy) return dx < dy ? -1 : 1;
    return strcmp(x->rel, y->rel);
}

static const char root_attrs[] =
    "{\"encoding-type\": \"anndata\", \"encoding-version\": \"0.1.0\"}";

/* Writes the root group (the commit point), with consolidated metadata when asked. */
static zb_status
write_root(zb_anndata_writer *w)
{
    if (!w->consolidate) return zb_write_group(w->store, w->path, w->zarr_format, root_attrs);

    zb_status st = ZB_OK;
    int ok = 1;
    json_object *meta = json_object_new_object();
    json_object *doc = NULL, *attrs = NULL;
    if (!meta) return zb_err(ZB_E_NOMEM, "consolidated metadata: out of memory");
    qsort(w->nodes, w->nnodes, sizeof *w->nodes, cmp_node);
    for (size_t i = 0; i < w->nnodes && st == ZB_OK; i++)
        st = consolidate_node(w, &w->nodes[i], meta);
    if (st == ZB_OK) st = zb_write_parse_attrs(root_attrs, "root attributes", &attrs);
    if (st != ZB_OK) goto done;
    char key[4200];
    if (w->zarr_format == 3) {
        doc = json_object_new_object();
        zb_jw_add(doc, "zarr_format", json_object_new_int(3), &ok);
        zb_jw_add(doc, "node_type", json_object_new_string("group"), &ok);
        zb_jw_add(doc, "attributes", json_object_get(attrs), &ok);
        json_object *cm = zb_jw_add(doc, "consolidated_metadata", json_object_new_object(), &ok);
        zb_jw_add(cm, "kind", json_object_new_string("inline"), &ok);
        zb_jw_add(cm, "must_understand", json_object_new_boolean(0), &ok);
        zb_jw_add(cm, "metadata", json_object_get(meta), &ok);
        if (!ok) {
            st = zb_err(ZB_E_NOMEM, "root group: out of memory");
            goto done;
        }
        st = key_of(w, key, sizeof key, "zarr.json");
        if (st == ZB_OK) st = zb_write_json(w->store, key, doc);
        goto done;
    }
    /* v2: .zmetadata is written before the root .zgroup, which stays the commit point */
    json_object *zgroup = json_object_new_object();
    zb_jw_add(zgroup, "zarr_format", json_object_new_int(2), &ok);
    zb_jw_add(meta, ".zgroup", zgroup, &ok);
    zb_jw_add(meta, ".zattrs", json_object_get(attrs), &ok);
    doc = json_object_new_object();
    zb_jw_add(doc, "metadata", json_object_get(meta), &ok);
    zb_jw_add(doc, "zarr_consolidated_format", json_object_new_int(1), &ok);
    if (!ok) {
        st = zb_err(ZB_E_NOMEM, "consolidated metadata: out of memory");
        goto done;
    }
    st = key_of(w, key, sizeof key, ".zmetadata");
    if (st == ZB_OK) st = zb_write_json(w->store, key, doc);
    if (st == ZB_OK) st = zb_write_group(w->store, w->path, 2, root_attrs);
done:
    json_object_put(doc);
    json_object_put(attrs);
    json_object_put(meta);
    return st;
}

zb_status
zb_anndata_writer_commit(zb_anndata_writer *w)
{
    ZB_TRY(usable(w, "commit"));
    /* checked before anything is written, so a short column can still be completed */
    ZB_TRY(check_lengths(w));
    zb_status st = ZB_OK;
    if (!w->frames[ZB_ANNDATA_OBS].index) st = write_default_index(w, ZB_ANNDATA_OBS, w->rows);
    if (st == ZB_OK && !w->frames[ZB_ANNDATA_VAR].index)
        st = write_default_index(w, ZB_ANNDATA_VAR, w->n_vars);
    if (st == ZB_OK) st = commit_arrays(w);
    if (st == ZB_OK) st = write_groups(w);
    if (st == ZB_OK) st = write_root(w);
    if (st != ZB_OK) return broken(w, zb_err_context(st, "anndata commit"));
    /* the store is valid from the root document on; the marker goes last */
    char key[4200];
    st = key_of(w, key, sizeof key, ZB_INCOMPLETE_MARKER);
    if (st == ZB_OK) st = zb_store_erase(w->store, key);
    if (st != ZB_OK) return broken(w, zb_err_context(st, "anndata commit: erasing the marker"));
    w->committed = true;
    return ZB_OK;
}
