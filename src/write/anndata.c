/* The anndata layout writer, its core: open, close, commit, the shared helpers, the groups and
 * the consolidated metadata. X and layers are written by anndata_matrix.c, obs and var by
 * anndata_frame.c (anndata_int.h holds what they share).
 *
 * Format facts: shared FORMATS.md §6 (anndata in Zarr); the element attributes and the node
 * set follow what anndata 0.12.19 writes (checked against its v2 and v3 output).
 *
 * Determinism: nothing written depends on time, process, thread count or the order in which
 * compression threads finish (the array writer assembles every chunk and shard from its rows
 * alone), and the consolidated metadata is sorted, so the same rows give the same bytes. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/json.h"
#include "util/status.h"
#include "write/anndata_int.h"
#include "write/codec_spec.h"
#include "write/write.h"

/* ---------------------------------------------------------------------------------------------
 * Helpers shared by the writer's files (anndata_int.h)
 * ------------------------------------------------------------------------------------------- */

zb_status
zb__ad_usable(const zb_anndata_writer *w, const char *fn)
{
    if (!w) return zb__err(ZB_E_INVALID, "%s: null writer", fn);
    if (w->committed) return zb__err(ZB_E_INVALID, "%s: the writer has already committed", fn);
    if (w->failed != ZB_OK)
        return zb__err(w->failed, "%s: the writer is unusable after an earlier write failed (%s)",
                       fn, zb_status_name(w->failed));
    return ZB_OK;
}

zb_status
zb__ad_key_of(const zb_anndata_writer *w, char *buf, size_t cap, const char *rel)
{
    return zb__write_join_key(buf, cap, w->path, rel);
}

zb_status
zb__ad_add_node(zb_anndata_writer *w, const char *rel, bool is_array)
{
    if (w->nnodes == w->cap_nodes) {
        size_t cap = w->cap_nodes ? 2 * w->cap_nodes : 32;
        zb__ad_node *p = realloc(w->nodes, cap * sizeof *p);
        if (!p) return zb__err(ZB_E_NOMEM, "anndata writer: out of memory");
        w->nodes = p;
        w->cap_nodes = cap;
    }
    char *copy = strdup(rel);
    if (!copy) return zb__err(ZB_E_NOMEM, "anndata writer: out of memory");
    w->nodes[w->nnodes].rel = copy;
    w->nodes[w->nnodes].is_array = is_array;
    w->nnodes++;
    return ZB_OK;
}

void
zb__ad_encoding_attrs(char *buf, size_t cap, const char *type, const char *version)
{
    snprintf(buf, cap, "{\"encoding-type\": \"%s\", \"encoding-version\": \"%s\"}", type, version);
}

zb_status
zb__ad_open_array(zb_anndata_writer *w, const char *rel, const char *codec, zb_dtype dtype,
                  int ndim, const uint64_t *row_shape, uint64_t chunk_rows, uint64_t shard_rows,
                  int threads, const char *attrs_json, zb_array_writer **out)
{
    char key[ZB_AD_KEY_CAP];
    ZB_TRY(zb__ad_key_of(w, key, sizeof key, rel));
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.zarr_format = w->zarr_format;
    o.codec = codec;
    o.chunk_rows = chunk_rows;
    o.shard_rows = shard_rows;
    o.num_threads = threads;
    o.attributes_json = attrs_json;
    ZB_TRY(zb_array_writer_open(w->store, key, dtype, ndim, row_shape, &o, out));
    zb_status st = zb__ad_add_node(w, rel, true);
    if (st != ZB_OK) {
        zb_array_writer_close(*out);
        *out = NULL;
    }
    return st;
}

zb_status
zb__ad_write_group(zb_anndata_writer *w, const char *rel, const char *attrs)
{
    char key[ZB_AD_KEY_CAP];
    ZB_TRY(zb__ad_key_of(w, key, sizeof key, rel));
    ZB_TRY(zb__write_group(w->store, key, w->zarr_format, attrs));
    return zb__ad_add_node(w, rel, false);
}

uint64_t
zb__ad_column_chunk(const zb_anndata_writer *w, zb_anndata_axis axis)
{
    uint64_t c = w->column_chunk ? w->column_chunk : ZB_AD_DEFAULT_COLUMN_CHUNK;
    /* var has a known length: a chunk longer than the column would only be padding */
    if (axis == ZB_ANNDATA_VAR && w->n_vars && c > w->n_vars) c = w->n_vars;
    return c;
}

/* Names become keys: the reserved "__" prefix is forbidden by v3 (FORMATS.md §3.1). */
zb_status
zb__ad_check_name(const char *where, const char *name)
{
    if (!name || !*name) return zb__err(ZB_E_INVALID, "%s: empty name", where);
    if (strchr(name, '/') || strchr(name, '\\'))
        return zb__err(ZB_E_INVALID, "%s/%s: a name cannot contain '/'", where, name);
    if (!strcmp(name, ".") || !strcmp(name, ".."))
        return zb__err(ZB_E_INVALID, "%s: '%s' is not a valid name", where, name);
    if (!strncmp(name, "__", 2))
        return zb__err(ZB_E_INVALID, "%s/%s: names starting with '__' are reserved by Zarr", where,
                       name);
    if (strlen(name) > 1024) return zb__err(ZB_E_INVALID, "%s: name longer than 1024 bytes", where);
    return ZB_OK;
}

zb_status
zb__ad_check_strings(const char *what, const char *data, const uint64_t *offsets, uint64_t n,
                     const uint8_t *mask)
{
    if (n == 0) return ZB_OK;
    if (!offsets) return zb__err(ZB_E_INVALID, "%s: null offsets", what);
    for (uint64_t i = 0; i < n; i++)
        if (offsets[i + 1] < offsets[i])
            return zb__err(ZB_E_INVALID,
                           "%s: offsets decrease at string %" PRIu64 " (%" PRIu64 " after %" PRIu64
                           ")",
                           what, i, offsets[i + 1], offsets[i]);
    if (!data && offsets[n] > offsets[0]) return zb__err(ZB_E_INVALID, "%s: null data", what);
    for (uint64_t i = 0; i < n; i++) {
        if (mask && mask[i]) continue;
        uint64_t len = offsets[i + 1] - offsets[i];
        if (len > UINT32_MAX)
            return zb__err(ZB_E_INVALID,
                           "%s: string %" PRIu64 " has %" PRIu64 " bytes (vlen-utf8 allows 2^32-1)",
                           what, i, len);
        size_t bad = zb__write_utf8_check((const uint8_t *)data + offsets[i], (size_t)len);
        if (bad != len)
            return zb__err(ZB_E_INVALID, "%s: string %" PRIu64 " is not valid UTF-8 (byte %zu)",
                           what, i, bad);
    }
    return ZB_OK;
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
        char key[ZB_AD_KEY_CAP];
        ZB_TRY(zb__ad_key_of(w, key, sizeof key, docs[i]));
        zb_status st = ZB_OK;
        if (key_exists(w->store, key, &st))
            return zb__err(ZB_E_INVALID, "'%s' already holds a Zarr node (%s); remove it first",
                           w->path[0] ? w->path : "/", docs[i]);
        if (st != ZB_OK) return st;
    }
    return ZB_OK;
}

static zb_status
write_marker(zb_anndata_writer *w)
{
    char key[ZB_AD_KEY_CAP];
    ZB_TRY(zb__ad_key_of(w, key, sizeof key, ZB_INCOMPLETE_MARKER));
    /* no pid or clock: a crashed store should look the same whatever wrote it */
    static const char text[] =
        "{\"writer\": \"zbatch " ZB_VERSION_STRING "\", \"layout\": \"anndata\", "
        "\"state\": \"writing; the store is not valid until this marker is gone\"}\n";
    return zb_store_put(w->store, key, text, sizeof text - 1);
}

/* anndata's write_csr_csc_indices_with_min_possible_dtype (anndata 0.12.19,
 * _io/specs/methods.py, write_sparse_compressed): the smallest unsigned type whose maximum is
 * at least n_vars (so uint8 up to 255 columns, uint16 up to 65,535, else uint32). */
static zb_dtype
narrow_index_dtype(uint64_t n_vars)
{
    if (n_vars <= UINT8_MAX) return ZB_DT_UINT8;
    if (n_vars <= UINT16_MAX) return ZB_DT_UINT16;
    return ZB_DT_UINT32;
}

zb_status
zb_anndata_writer_open(zb_store *store, const char *path, uint64_t n_vars, zb_anndata_x_kind x_kind,
                       zb_dtype x_dtype, const zb_anndata_write_opts *opts, zb_anndata_writer **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_anndata_writer_open: null out");
    *out = NULL;
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb_anndata_writer_open: null argument");
    zb_anndata_write_opts o = ZB_ANNDATA_WRITE_OPTS_DEFAULT;
    if (opts) o = *opts;
    if (o.zarr_format != 2 && o.zarr_format != 3)
        return zb__err(ZB_E_INVALID, "anndata writer: zarr_format %d is not 2 or 3", o.zarr_format);
    if (x_kind != ZB_ANNDATA_X_CSR && x_kind != ZB_ANNDATA_X_DENSE)
        return zb__err(ZB_E_INVALID, "anndata writer: unknown X kind %d", (int)x_kind);
    if ((int)x_dtype < 0 || x_dtype >= ZB_DT_COUNT_ || x_dtype == ZB_DT_STRING)
        return zb__err(ZB_E_INVALID, "anndata writer: X must have a fixed-size dtype");
    if (x_kind == ZB_ANNDATA_X_CSR && n_vars > INT32_MAX)
        return zb__err(ZB_E_INVALID,
                       "anndata writer: n_vars %" PRIu64 " does not fit int32 column ids", n_vars);
    if (o.x_shard && o.zarr_format != 3)
        return zb__err(ZB_E_INVALID, "anndata writer: sharding needs zarr_format 3");
    if (o.x_shard) {
        uint64_t chunk =
            o.x_chunk ? o.x_chunk : (x_kind == ZB_ANNDATA_X_CSR ? ZB_ANNDATA_DEFAULT_X_CHUNK : 0);
        if (!chunk)
            return zb__err(ZB_E_INVALID, "anndata writer: a dense X shard needs x_chunk set");
        if (o.x_shard % chunk)
            return zb__err(ZB_E_INVALID,
                           "anndata writer: x_shard %" PRIu64
                           " is not a multiple of x_chunk %" PRIu64,
                           o.x_shard, chunk);
    }
    if (o.num_threads < 0)
        return zb__err(ZB_E_INVALID, "anndata writer: num_threads %d < 0", o.num_threads);
    /* a bad codec string is refused before the marker is written */
    zb__codec codec;
    bool has_codec;
    ZB_TRY(zb__codec_spec_parse(o.codec, o.zarr_format, &codec, &has_codec));

    zb_anndata_writer *w = calloc(1, sizeof *w);
    if (!w) return zb__err(ZB_E_NOMEM, "anndata writer: out of memory");
    zb_status st = zb_key_normalize(path, w->path, sizeof w->path);
    if (st != ZB_OK) goto fail;
    w->store = store;
    w->zarr_format = o.zarr_format;
    w->x_chunk = o.x_chunk;
    w->x_shard = o.x_shard;
    w->column_chunk = o.column_chunk;
    w->num_threads = o.num_threads;
    w->consolidate = o.consolidate;
    w->index_dtype = o.narrow_indices ? narrow_index_dtype(n_vars) : ZB_DT_INT32;
    w->n_vars = n_vars;
    w->x_kind = x_kind;
    w->x_dtype = x_dtype;
    w->frames[ZB_ANNDATA_OBS].name = "obs";
    w->frames[ZB_ANNDATA_VAR].name = "var";
    w->scratch = malloc(ZB_AD_STEP * sizeof *w->scratch);
    if (o.codec) w->codec = strdup(o.codec);
    if (!w->scratch || (o.codec && !w->codec)) {
        st = zb__err(ZB_E_NOMEM, "anndata writer: out of memory");
        goto fail;
    }
    st = refuse_existing_node(w);
    if (st != ZB_OK) goto fail;
    /* the marker goes first: from here on a crash leaves a store that readers refuse */
    st = write_marker(w);
    if (st != ZB_OK) goto fail;
    st = zb__ad_open_x(w);
    if (st != ZB_OK) goto fail;
    *out = w;
    return ZB_OK;
fail:
    zb_anndata_writer_close(w);
    return st;
}

void
zb_anndata_writer_close(zb_anndata_writer *w)
{
    if (!w) return;
    zb__ad_free_matrices(w);
    zb__ad_free_frame(&w->frames[0]);
    zb__ad_free_frame(&w->frames[1]);
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
    return w ? w->x.nnz : 0;
}

const char *
zb_anndata_csr_codec(const char *codec, zb_dtype dtype)
{
    if (codec) return codec;
    bool narrow_int = dtype == ZB_DT_INT8 || dtype == ZB_DT_UINT8 || dtype == ZB_DT_INT16 ||
                      dtype == ZB_DT_UINT16;
    return narrow_int ? ZB_CODEC_SPEC_NARROW_INT : ZB_CODEC_SPEC_DEFAULT;
}

zb_dtype
zb_anndata_writer_index_dtype(const zb_anndata_writer *w)
{
    return w ? w->index_dtype : ZB_DT_INT32;
}

/* ---------------------------------------------------------------------------------------------
 * Commit
 * ------------------------------------------------------------------------------------------- */

static zb_status
write_groups(zb_anndata_writer *w)
{
    ZB_TRY(zb__ad_write_matrix_groups(w));
    ZB_TRY(zb__ad_write_frame_groups(w));
    /* anndata writes every mapping, even empty (FORMATS.md §6) */
    static const char *const dicts[] = {"layers", "obsm", "obsp", "varm", "varp", "uns"};
    char attrs[128];
    zb__ad_encoding_attrs(attrs, sizeof attrs, "dict", "0.1.0");
    for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++)
        ZB_TRY(zb__ad_write_group(w, dicts[i], attrs));
    return ZB_OK;
}

/* Reads and parses the document under `rel`/`name`; *out is NULL when absent and optional. */
static zb_status
read_doc(zb_anndata_writer *w, const char *rel, const char *name, bool optional, json_object **out)
{
    *out = NULL;
    char relkey[1200], key[ZB_AD_KEY_CAP];
    ZB_TRY(zb__write_join_key(relkey, sizeof relkey, rel, name));
    ZB_TRY(zb__ad_key_of(w, key, sizeof key, relkey));
    uint8_t *text = NULL;
    uint64_t len = 0;
    zb_status st = zb_store_read_all(w->store, key, &text, &len);
    if (st == ZB_E_NOTFOUND && optional) return ZB_OK;
    if (st != ZB_OK) return st;
    st = zb__json_parse((const char *)text, (size_t)len, key, out);
    free(text);
    return st;
}

/* Adds `rel`'s node documents to the consolidated `meta` object (FORMATS.md §1.4 for v2: keys
 * with the .zarray/.zgroup/.zattrs suffix; §3.5 for v3: keys without, nested groups carrying an
 * empty consolidated_metadata as zarr-python writes them). */
static zb_status
consolidate_node(zb_anndata_writer *w, const zb__ad_node *nd, json_object *meta)
{
    int ok = 1;
    json_object *doc = NULL;
    if (w->zarr_format == 3) {
        ZB_TRY(read_doc(w, nd->rel, "zarr.json", false, &doc));
        if (!nd->is_array) zb__write_mark_nested_group(doc, &ok);
        zb__jw_add(meta, nd->rel, doc, &ok);
        return ok ? ZB_OK : zb__err(ZB_E_NOMEM, "consolidated metadata: out of memory");
    }
    const char *docname = nd->is_array ? ".zarray" : ".zgroup";
    char key[1200];
    ZB_TRY(zb__write_join_key(key, sizeof key, nd->rel, docname));
    ZB_TRY(read_doc(w, nd->rel, docname, false, &doc));
    zb__jw_add(meta, key, doc, &ok);
    ZB_TRY(zb__write_join_key(key, sizeof key, nd->rel, ".zattrs"));
    ZB_TRY(read_doc(w, nd->rel, ".zattrs", true, &doc));
    if (doc) zb__jw_add(meta, key, doc, &ok);
    return ok ? ZB_OK : zb__err(ZB_E_NOMEM, "consolidated metadata: out of memory");
}

static int
cmp_node(const void *a, const void *b)
{
    return zb__write_cmp_consolidated(((const zb__ad_node *)a)->rel, ((const zb__ad_node *)b)->rel);
}

static const char root_attrs[] =
    "{\"encoding-type\": \"anndata\", \"encoding-version\": \"0.1.0\"}";

/* Writes the root group (the commit point), with consolidated metadata when asked. */
static zb_status
write_root(zb_anndata_writer *w)
{
    if (!w->consolidate) return zb__write_group(w->store, w->path, w->zarr_format, root_attrs);
    zb_status st = ZB_OK;
    json_object *meta = json_object_new_object();
    if (!meta) return zb__err(ZB_E_NOMEM, "consolidated metadata: out of memory");
    qsort(w->nodes, w->nnodes, sizeof *w->nodes, cmp_node);
    for (size_t i = 0; i < w->nnodes && st == ZB_OK; i++)
        st = consolidate_node(w, &w->nodes[i], meta);
    if (st == ZB_OK)
        st = zb__write_consolidated_root(w->store, w->path, w->zarr_format, root_attrs, meta);
    json_object_put(meta);
    return st;
}

zb_status
zb_anndata_writer_commit(zb_anndata_writer *w)
{
    ZB_TRY(zb__ad_usable(w, "commit"));
    /* checked before anything is written, so a short column or layer can still be completed */
    ZB_TRY(zb__ad_check_frames(w));
    ZB_TRY(zb__ad_check_layers(w));
    zb_status st = zb__ad_write_default_names(w);
    if (st == ZB_OK) st = zb__ad_commit_matrices(w);
    if (st == ZB_OK) st = zb__ad_commit_frames(w);
    if (st == ZB_OK) st = write_groups(w);
    if (st == ZB_OK) st = write_root(w);
    if (st != ZB_OK) return zb__ad_broken(w, zb__err_context(st, "anndata commit"));
    /* the store is valid from the root document on; the marker goes last */
    char key[ZB_AD_KEY_CAP];
    st = zb__ad_key_of(w, key, sizeof key, ZB_INCOMPLETE_MARKER);
    if (st == ZB_OK) st = zb_store_erase(w->store, key);
    if (st != ZB_OK)
        return zb__ad_broken(w, zb__err_context(st, "anndata commit: erasing the marker"));
    w->committed = true;
    return ZB_OK;
}
