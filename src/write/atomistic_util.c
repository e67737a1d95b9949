/* Shared pieces of the atomistic layout writer: the configuration, opening an existing dataset,
 * levels, and the key/tree helpers the crash-safe operations are built from.
 * Format facts: shared FORMATS.md §8.1 (tree, attributes), §8.2 (level key sets). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "util/json.h"
#include "util/status.h"
#include "write/atomistic_int.h"
#include "write/codec_spec.h"
#include "write/write.h"
#include "zarr/array.h"

const char *const zb__at_meta_names[ZB_AT_NMETA] = {"atoms_ptr", "edges_ptr", "samples_mask",
                                                    "atoms_mask", "edges_mask"};

const char *
zb_atomic_level_name(zb_atomic_level level)
{
    switch (level) {
    case ZB_ATOMIC_ATOM:
        return "atom";
    case ZB_ATOMIC_EDGE:
        return "edge";
    case ZB_ATOMIC_SYSTEM:
        return "system";
    }
    return "?";
}

/* ------------------------------------------------------------------------------------------- */
/* Configuration                                                                                */
/* ------------------------------------------------------------------------------------------- */

static zb_status
dup_str(const char *s, const char **out)
{
    *out = NULL;
    if (!s) return ZB_OK;
    char *d = strdup(s);
    if (!d) return zb__err(ZB_E_NOMEM, "atomic writer config: out of memory");
    *out = d;
    return ZB_OK;
}

static zb_status
check_array_config(const char *what, const zb_atomic_array_config *c)
{
    if (c->codec) {
        zb__codec codec;
        bool has;
        zb_status st = zb__codec_spec_parse(c->codec, 3, &codec, &has);
        if (st != ZB_OK) return zb__err_context(st, "atomic writer config '%s'", what);
    }
    if (c->shard_rows && c->shard_rows != ZB_ATOMIC_NO_SHARDS && c->chunk_rows &&
        c->shard_rows % c->chunk_rows)
        return zb__err(ZB_E_INVALID,
                       "atomic writer config '%s': shard_rows %llu is not a multiple of "
                       "chunk_rows %llu",
                       what, (unsigned long long)c->shard_rows, (unsigned long long)c->chunk_rows);
    return ZB_OK;
}

zb_status
zb__at_cfg_add_override(zb__at_cfg *cfg, const char *name, const zb_atomic_array_config *c)
{
    if (!name || !*name)
        return zb__err(ZB_E_INVALID, "atomic writer config: override without a name");
    ZB_TRY(check_array_config(name, c));
    zb_atomic_override *ov = realloc(cfg->ov, (cfg->n_ov + 1) * sizeof *ov);
    if (!ov) return zb__err(ZB_E_NOMEM, "atomic writer config: out of memory");
    cfg->ov = ov;
    zb_atomic_override *o = &ov[cfg->n_ov];
    memset(o, 0, sizeof *o);
    zb_status st = dup_str(name, &o->name);
    if (st == ZB_OK) st = dup_str(c->codec, &o->config.codec);
    if (st != ZB_OK) {
        free((void *)o->name);
        return st;
    }
    o->config.chunk_rows = c->chunk_rows;
    o->config.shard_rows = c->shard_rows;
    cfg->n_ov++;
    return ZB_OK;
}

zb_status
zb__at_cfg_copy(const zb_atomic_write_config *src, zb__at_cfg *dst)
{
    static const zb_atomic_write_config defaults = ZB_ATOMIC_WRITE_CONFIG_DEFAULT;
    static const char *const group_names[3] = {"meta", "core", "custom"};
    if (!src) src = &defaults;
    memset(dst, 0, sizeof *dst);
    if (src->num_threads < 0 || src->num_threads > 256)
        return zb__err(ZB_E_INVALID, "atomic writer config: num_threads %d is outside 0..256",
                       src->num_threads);
    if (src->n_overrides && !src->overrides)
        return zb__err(ZB_E_INVALID, "atomic writer config: n_overrides %zu with no overrides",
                       src->n_overrides);
    dst->num_threads = src->num_threads;
    const zb_atomic_array_config *groups[3] = {&src->meta, &src->core, &src->custom};
    zb_status st = ZB_OK;
    for (int g = 0; g < 3 && st == ZB_OK; g++) {
        st = check_array_config(group_names[g], groups[g]);
        if (st == ZB_OK) st = dup_str(groups[g]->codec, &dst->group[g].codec);
        dst->group[g].chunk_rows = groups[g]->chunk_rows;
        dst->group[g].shard_rows = groups[g]->shard_rows;
    }
    for (size_t i = 0; i < src->n_overrides && st == ZB_OK; i++)
        st = zb__at_cfg_add_override(dst, src->overrides[i].name, &src->overrides[i].config);
    if (st != ZB_OK) zb__at_cfg_free(dst);
    return st;
}

void
zb__at_cfg_free(zb__at_cfg *cfg)
{
    if (!cfg) return;
    for (int g = 0; g < 3; g++) free((void *)cfg->group[g].codec);
    for (size_t i = 0; i < cfg->n_ov; i++) {
        free((void *)cfg->ov[i].name);
        free((void *)cfg->ov[i].config.codec);
    }
    free(cfg->ov);
    memset(cfg, 0, sizeof *cfg);
}

void
zb__at_cfg_resolve(const zb__at_cfg *cfg, const char *group, const char *name, size_t row_bytes,
                   zb_array_write_opts *o)
{
    static const zb_array_write_opts defaults = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    *o = defaults;
    int g = !strcmp(group, "meta") ? 0 : !strcmp(group, "core") ? 1 : 2;
    const zb_atomic_array_config *grp = &cfg->group[g];
    /* "core/positions" wins over "positions" */
    const zb_atomic_array_config *ov = NULL;
    char qual[ZB_AT_NAME_CAP + 16];
    snprintf(qual, sizeof qual, "%s/%s", group, name);
    for (size_t i = 0; i < cfg->n_ov; i++)
        if (!strcmp(cfg->ov[i].name, qual)) ov = &cfg->ov[i].config;
    for (size_t i = 0; !ov && i < cfg->n_ov; i++)
        if (!strcmp(cfg->ov[i].name, name)) ov = &cfg->ov[i].config;
    o->codec = ov && ov->codec ? ov->codec : grp->codec;
    o->chunk_rows = ov && ov->chunk_rows ? ov->chunk_rows : grp->chunk_rows;
    uint64_t shard = ov && ov->shard_rows ? ov->shard_rows : grp->shard_rows;
    o->shard_rows = shard == ZB_ATOMIC_NO_SHARDS ? 0 : shard;
    if (g != 0 && o->chunk_rows == 0 && shard == 0) {
        /* a data array configured nowhere: small inner chunks in shards (zbatch_atomic.h) */
        uint64_t rows = row_bytes ? ZB_ATOMIC_DEFAULT_CHUNK_BYTES / row_bytes : 0;
        o->chunk_rows = rows ? rows : 1;
        o->shard_rows = o->chunk_rows * ZB_ATOMIC_DEFAULT_SHARD_CHUNKS;
    }
    /* nvalchemi's ZarrArrayConfig default (write_empty_chunks=True), FORMATS.md §8.4 */
    o->write_empty_chunks = true;
    o->num_threads = cfg->num_threads;
    /* a group-level chunk that does not divide an override's shard: let the writer pick */
    if (o->shard_rows && o->chunk_rows && o->shard_rows % o->chunk_rows) o->chunk_rows = 0;
}

/* ------------------------------------------------------------------------------------------- */
/* Names, keys, levels                                                                          */
/* ------------------------------------------------------------------------------------------- */

zb_status
zb__at_check_name(const char *what, const char *name)
{
    if (!name || !*name) return zb__err(ZB_E_INVALID, "%s: empty name", what);
    if (strlen(name) >= ZB_AT_NAME_CAP)
        return zb__err(ZB_E_INVALID, "%s '%.32s...': name longer than %d bytes", what, name,
                       ZB_AT_NAME_CAP - 1);
    if (strchr(name, '/') || strchr(name, '\\'))
        return zb__err(ZB_E_INVALID, "%s '%s': a name may not contain '/'", what, name);
    if (name[0] == '.' || !strncmp(name, "__", 2))
        return zb__err(ZB_E_INVALID, "%s '%s': a name may not start with '.' or '__'", what, name);
    return ZB_OK;
}

zb_status
zb__at_join(char *buf, size_t cap, const char *path, const char *name)
{
    return zb__write_join_key(buf, cap, path, name);
}

zb_status
zb__at_join3(char *buf, size_t cap, const char *path, const char *a, const char *b)
{
    char mid[ZB_AT_KEY_CAP];
    ZB_TRY(zb__write_join_key(mid, sizeof mid, path, a));
    return zb__write_join_key(buf, cap, mid, b);
}

/* The reader's rule (zb__atomistic_array_level: the fields attribute, else FORMATS.md §8.2's key
 * sets in core and "system" in custom), so an append files every array where a read will look
 * for it; a level string the reader does not know reads as per-sample, and so it is here. */
zb_atomic_level
zb__at_level_of(json_object *fields, const char *group, const char *name)
{
    const char *lv = zb__atomistic_array_level(fields, group, name);
    if (!strcmp(lv, "atom")) return ZB_ATOMIC_ATOM;
    if (!strcmp(lv, "edge")) return ZB_ATOMIC_EDGE;
    return ZB_ATOMIC_SYSTEM;
}

zb_status
zb__at_fields_set(json_object *attrs, const char *group, const char *name, zb_atomic_level level)
{
    json_object *fields = zb__json_get(attrs, "fields");
    if (!fields || !json_object_is_type(fields, json_type_object)) {
        fields = json_object_new_object();
        if (!fields || json_object_object_add(attrs, "fields", fields) != 0) goto nomem;
    }
    /* both groups always present, as nvalchemi writes them */
    static const char *const groups[2] = {"core", "custom"};
    for (int i = 0; i < 2; i++) {
        json_object *g = zb__json_get(fields, groups[i]);
        if (!g || !json_object_is_type(g, json_type_object)) {
            g = json_object_new_object();
            if (!g || json_object_object_add(fields, groups[i], g) != 0) goto nomem;
        }
    }
    if (!group) return ZB_OK;
    json_object *g = zb__json_get(fields, group);
    json_object *v = json_object_new_string(zb_atomic_level_name(level));
    if (!v || json_object_object_add(g, name, v) != 0) goto nomem;
    return ZB_OK;
nomem:
    return zb__err(ZB_E_NOMEM, "fields attribute: out of memory");
}

/* ------------------------------------------------------------------------------------------- */
/* Integer access                                                                               */
/* ------------------------------------------------------------------------------------------- */

bool
zb__at_dtype_is_int(zb_dtype dt)
{
    return dt >= ZB_DT_INT8 && dt <= ZB_DT_UINT64;
}

int64_t
zb__at_get_int(const void *base, zb_dtype dt, uint64_t i)
{
    switch (dt) {
    case ZB_DT_INT8:
        return ((const int8_t *)base)[i];
    case ZB_DT_INT16:
        return ((const int16_t *)base)[i];
    case ZB_DT_INT32:
        return ((const int32_t *)base)[i];
    case ZB_DT_INT64:
        return ((const int64_t *)base)[i];
    case ZB_DT_UINT8:
        return ((const uint8_t *)base)[i];
    case ZB_DT_UINT16:
        return ((const uint16_t *)base)[i];
    case ZB_DT_UINT32:
        return ((const uint32_t *)base)[i];
    case ZB_DT_UINT64: {
        uint64_t u = ((const uint64_t *)base)[i];
        return u > (uint64_t)INT64_MAX ? -1 : (int64_t)u; /* -1: out of every valid range */
    }
    default:
        return -1;
    }
}

bool
zb__at_set_int(void *base, zb_dtype dt, uint64_t i, int64_t v)
{
    switch (dt) {
    case ZB_DT_INT8:
        if (v < INT8_MIN || v > INT8_MAX) return false;
        ((int8_t *)base)[i] = (int8_t)v;
        return true;
    case ZB_DT_INT16:
        if (v < INT16_MIN || v > INT16_MAX) return false;
        ((int16_t *)base)[i] = (int16_t)v;
        return true;
    case ZB_DT_INT32:
        if (v < INT32_MIN || v > INT32_MAX) return false;
        ((int32_t *)base)[i] = (int32_t)v;
        return true;
    case ZB_DT_INT64:
        ((int64_t *)base)[i] = v;
        return true;
    case ZB_DT_UINT8:
        if (v < 0 || v > UINT8_MAX) return false;
        ((uint8_t *)base)[i] = (uint8_t)v;
        return true;
    case ZB_DT_UINT16:
        if (v < 0 || v > UINT16_MAX) return false;
        ((uint16_t *)base)[i] = (uint16_t)v;
        return true;
    case ZB_DT_UINT32:
        if (v < 0 || v > (int64_t)UINT32_MAX) return false;
        ((uint32_t *)base)[i] = (uint32_t)v;
        return true;
    case ZB_DT_UINT64:
        if (v < 0) return false;
        ((uint64_t *)base)[i] = (uint64_t)v;
        return true;
    default:
        return false;
    }
}

zb_status
zb__at_read_i64(const zb_array *a, uint64_t start, uint64_t stop, int64_t *dst)
{
    zb_array_info info;
    ZB_TRY(zb_array_get_info(a, &info));
    if (!zb__at_dtype_is_int(info.dtype) || info.ndim != 1)
        return zb__err(ZB_E_CORRUPT,
                       "%s: a pointer array must be a 1-d integer array, not %s "
                       "with %d dimensions",
                       a->path, zb_dtype_name(info.dtype), info.ndim);
    uint64_t n = stop - start;
    if (info.dtype == ZB_DT_INT64 || info.dtype == ZB_DT_UINT64) {
        ZB_TRY(zb_array_read_rows(a, start, stop, dst, (size_t)n * 8, NULL));
        if (info.dtype == ZB_DT_UINT64)
            for (uint64_t i = 0; i < n; i++)
                if ((uint64_t)dst[i] > (uint64_t)INT64_MAX) dst[i] = -1;
        return ZB_OK;
    }
    /* narrower types: read into the tail of dst, widen from the front (never overlapping
     * a value not yet read, as itemsize < 8) */
    size_t isz = info.itemsize;
    uint8_t *raw = (uint8_t *)dst + (size_t)n * (8 - isz);
    ZB_TRY(zb_array_read_rows(a, start, stop, raw, (size_t)n * isz, NULL));
    for (uint64_t i = 0; i < n; i++) dst[i] = zb__at_get_int(raw, info.dtype, i);
    return ZB_OK;
}

/* ------------------------------------------------------------------------------------------- */
/* Keys and trees                                                                               */
/* ------------------------------------------------------------------------------------------- */

bool
zb__at_has_key(zb_store *store, const char *key)
{
    uint64_t size;
    return zb_store_size(store, key, &size) == ZB_OK;
}

typedef struct any_ctx {
    bool any;
    bool dirs_only_seen;
    zb_store *store;
    const char *prefix;
} any_ctx;

static bool has_keys_rec(zb_store *store, const char *prefix, int depth);

static int
any_cb(void *vctx, const char *name, bool is_dir)
{
    any_ctx *c = vctx;
    if (!is_dir) {
        c->any = true;
        return 1;
    }
    char sub[ZB_AT_KEY_CAP];
    if (zb__at_join(sub, sizeof sub, c->prefix, name) != ZB_OK) return 0;
    if (has_keys_rec(c->store, sub, 1)) {
        c->any = true;
        return 1;
    }
    return 0;
}

static bool
has_keys_rec(zb_store *store, const char *prefix, int depth)
{
    if (depth > 64) return true; /* deeper than any layout: assume something is there */
    any_ctx c = {false, false, store, prefix};
    zb_status st = zb_store_list(store, prefix, any_cb, &c);
    if (st != ZB_OK) zb_clear_error();
    return c.any;
}

bool
zb__at_has_keys_below(zb_store *store, const char *prefix)
{
    return has_keys_rec(store, prefix, 0);
}

bool
zb__at_is_complete(zb_store *store, const char *path)
{
    char key[ZB_AT_KEY_CAP];
    if (zb__at_join(key, sizeof key, path, "zarr.json") != ZB_OK) return false;
    if (!zb__at_has_key(store, key)) return false;
    if (zb__at_join(key, sizeof key, path, ZB_INCOMPLETE_MARKER) != ZB_OK) return false;
    return !zb__at_has_key(store, key);
}

/* A list of keys collected by a recursive walk. */
typedef struct key_list {
    char **keys;
    bool *is_dir;
    size_t n, cap;
    zb_status st;
} key_list;

static void
key_list_free(key_list *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->keys[i]);
    free(l->keys);
    free(l->is_dir);
    memset(l, 0, sizeof *l);
}

static zb_status
key_list_push(key_list *l, const char *key, bool is_dir)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **k = realloc(l->keys, cap * sizeof *k);
        if (!k) return zb__err(ZB_E_NOMEM, "out of memory listing '%s'", key);
        l->keys = k;
        bool *d = realloc(l->is_dir, cap * sizeof *d);
        if (!d) return zb__err(ZB_E_NOMEM, "out of memory listing '%s'", key);
        l->is_dir = d;
        l->cap = cap;
    }
    char *s = strdup(key);
    if (!s) return zb__err(ZB_E_NOMEM, "out of memory listing '%s'", key);
    l->keys[l->n] = s;
    l->is_dir[l->n++] = is_dir;
    return ZB_OK;
}

typedef struct walk_ctx {
    key_list *l;
    const char *prefix;
    char **dirs;
    size_t ndirs, capdirs;
} walk_ctx;

static int
walk_cb(void *vctx, const char *name, bool is_dir)
{
    walk_ctx *c = vctx;
    char key[ZB_AT_KEY_CAP];
    zb_status st = zb__at_join(key, sizeof key, c->prefix, name);
    if (st == ZB_OK && !is_dir) st = key_list_push(c->l, key, false);
    if (st == ZB_OK && is_dir) {
        if (c->ndirs == c->capdirs) {
            size_t cap = c->capdirs ? 2 * c->capdirs : 16;
            char **d = realloc(c->dirs, cap * sizeof *d);
            if (!d)
                st = zb__err(ZB_E_NOMEM, "out of memory listing '%s'", key);
            else {
                c->dirs = d;
                c->capdirs = cap;
            }
        }
        if (st == ZB_OK) {
            c->dirs[c->ndirs] = strdup(key);
            if (!c->dirs[c->ndirs])
                st = zb__err(ZB_E_NOMEM, "out of memory listing '%s'", key);
            else
                c->ndirs++;
        }
    }
    if (st != ZB_OK) {
        c->l->st = st;
        return 1;
    }
    return 0;
}

/* Every object below `prefix` (files first within a directory, then its subdirectories), and
 * after the objects of each directory the directory itself (post-order). */
static zb_status
walk(zb_store *store, const char *prefix, key_list *l, int depth)
{
    if (depth > 64) return zb__err(ZB_E_INVALID, "'%s': tree deeper than 64 levels", prefix);
    walk_ctx c = {l, prefix, NULL, 0, 0};
    zb_status st = zb_store_list(store, prefix, walk_cb, &c);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        st = ZB_OK;
    }
    if (st == ZB_OK) st = l->st;
    for (size_t i = 0; i < c.ndirs; i++) {
        if (st == ZB_OK) st = walk(store, c.dirs[i], l, depth + 1);
        if (st == ZB_OK) st = key_list_push(l, c.dirs[i], true);
        free(c.dirs[i]);
    }
    free(c.dirs);
    return st;
}

zb_status
zb__at_remove_tree(zb_store *store, const char *prefix)
{
    char key[ZB_AT_KEY_CAP];
    /* the root document first: what is left of a half-removed store is not a store */
    ZB_TRY(zb__at_join(key, sizeof key, prefix, "zarr.json"));
    zb_status st = zb_store_erase(store, key);
    if (st != ZB_OK && st != ZB_E_NOTFOUND) return st;
    zb_clear_error();
    key_list l = {0};
    st = walk(store, prefix, &l, 0);
    for (size_t i = 0; st == ZB_OK && i < l.n; i++) {
        zb_status e = zb_store_erase(store, l.keys[i]);
        /* a directory: backends that cannot erase directories keep the empty ones */
        if (l.is_dir[i]) {
            zb_clear_error();
            continue;
        }
        if (e != ZB_OK && e != ZB_E_NOTFOUND) st = e;
    }
    if (st == ZB_OK && prefix[0]) {
        zb_store_erase(store, prefix);
        zb_clear_error();
    }
    key_list_free(&l);
    return st;
}

zb_status
zb__at_rename_tree(zb_store *store, const char *from, const char *to)
{
    zb_status st = zb_store_rename(store, from, to);
    if (st != ZB_E_NOTFOUND) return st;
    /* not one object: a backend whose rename moves single keys (memory) */
    zb_clear_error();
    key_list l = {0};
    st = walk(store, from, &l, 0);
    size_t nfiles = 0;
    size_t flen = strlen(from);
    for (size_t i = 0; st == ZB_OK && i < l.n; i++) {
        if (l.is_dir[i]) continue;
        char dst[ZB_AT_KEY_CAP];
        int n = snprintf(dst, sizeof dst, "%s%s", to, l.keys[i] + flen);
        if (n < 0 || (size_t)n >= sizeof dst) {
            st = zb__err(ZB_E_INVALID, "'%s': renamed key too long", l.keys[i]);
            break;
        }
        st = zb_store_rename(store, l.keys[i], dst);
        nfiles++;
    }
    key_list_free(&l);
    if (st == ZB_OK && nfiles == 0) return zb__err(ZB_E_NOTFOUND, "'%s': nothing to rename", from);
    return st;
}

/* ------------------------------------------------------------------------------------------- */
/* Documents                                                                                    */
/* ------------------------------------------------------------------------------------------- */

zb_status
zb__at_write_root(zb_store *store, const char *path, json_object *attrs)
{
    const char *text = json_object_to_json_string_ext(attrs, JSON_C_TO_STRING_PLAIN |
                                                                 JSON_C_TO_STRING_NOSLASHESCAPE);
    if (!text) return zb__err(ZB_E_NOMEM, "'%s': cannot serialise the root attributes", path);
    return zb__write_group(store, path, 3, text);
}

static zb_status
read_json(zb_store *store, const char *key, json_object **out)
{
    uint8_t *text = NULL;
    uint64_t len = 0;
    ZB_TRY(zb_store_read_all(store, key, &text, &len));
    zb_status st = zb__json_parse((const char *)text, (size_t)len, key, out);
    free(text);
    return st;
}

zb_status
zb__at_truncate_array(zb_store *store, const char *array_path, uint64_t rows)
{
    char key[ZB_AT_KEY_CAP];
    ZB_TRY(zb__at_join(key, sizeof key, array_path, "zarr.json"));
    if (!zb__at_has_key(store, key)) ZB_TRY(zb__at_join(key, sizeof key, array_path, ".zarray"));
    json_object *doc = NULL;
    ZB_TRY(read_json(store, key, &doc));
    json_object *shape = zb__json_get(doc, "shape");
    zb_status st = ZB_OK;
    if (!shape || !json_object_is_type(shape, json_type_array) ||
        json_object_array_length(shape) < 1)
        st = zb__err(ZB_E_METADATA, "%s: no shape to cut back", key);
    else if (json_object_array_put_idx(shape, 0, zb__jw_u64(rows)) != 0)
        st = zb__err(ZB_E_NOMEM, "%s: out of memory", key);
    if (st == ZB_OK) st = zb__write_json(store, key, doc);
    json_object_put(doc);
    return st;
}

/* ------------------------------------------------------------------------------------------- */
/* Opening an existing dataset                                                                  */
/* ------------------------------------------------------------------------------------------- */

typedef struct names_ctx {
    char **names;
    size_t n, cap;
    zb_status st;
} names_ctx;

static int
names_cb(void *vctx, const char *name, bool is_dir)
{
    names_ctx *c = vctx;
    if (!is_dir || name[0] == '.') return 0; /* temporaries and markers are not fields */
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 32;
        char **p = realloc(c->names, cap * sizeof *p);
        if (!p) {
            c->st = zb__err(ZB_E_NOMEM, "out of memory listing arrays");
            return 1;
        }
        c->names = p;
        c->cap = cap;
    }
    c->names[c->n] = strdup(name);
    if (!c->names[c->n]) {
        c->st = zb__err(ZB_E_NOMEM, "out of memory listing arrays");
        return 1;
    }
    c->n++;
    return 0;
}

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Opens every array directly below `<path>/<group>`, sorted by name. A missing group is
 * empty. Subgroups are skipped. */
static zb_status
open_group_arrays(zb_store *store, zb__at_layout *L, const char *group, json_object *fields)
{
    char gpath[ZB_AT_KEY_CAP];
    ZB_TRY(zb__at_join(gpath, sizeof gpath, L->path, group));
    names_ctx c = {0};
    zb_status st = zb_store_list(store, gpath, names_cb, &c);
    if (st == ZB_E_NOTFOUND) {
        zb_clear_error();
        st = ZB_OK;
    }
    if (st == ZB_OK) st = c.st;
    if (c.n) qsort(c.names, c.n, sizeof *c.names, cmp_str);
    for (size_t i = 0; st == ZB_OK && i < c.n; i++) {
        char apath[ZB_AT_KEY_CAP], key[ZB_AT_KEY_CAP + 16];
        st = zb__at_join(apath, sizeof apath, gpath, c.names[i]);
        if (st != ZB_OK) break;
        /* only arrays: a directory without an array document (a group, stale chunks of an
         * array whose write never committed) is not a field */
        bool is_array = false;
        if (zb__at_join(key, sizeof key, apath, "zarr.json") == ZB_OK &&
            zb__at_has_key(store, key)) {
            json_object *doc = NULL;
            st = read_json(store, key, &doc);
            if (st != ZB_OK) break;
            json_object *nt = zb__json_get(doc, "node_type");
            is_array = nt && json_object_is_type(nt, json_type_string) &&
                       !strcmp(json_object_get_string(nt), "array");
            json_object_put(doc);
        } else if (zb__at_join(key, sizeof key, apath, ".zarray") == ZB_OK &&
                   zb__at_has_key(store, key)) {
            is_array = true;
        }
        if (!is_array) continue;
        if (strlen(c.names[i]) >= ZB_AT_NAME_CAP) {
            st = zb__err(ZB_E_UNSUPPORTED, "%s: array name too long", apath);
            break;
        }
        zb__at_array *arr = realloc(L->arrays, (L->n + 1) * sizeof *arr);
        if (!arr) {
            st = zb__err(ZB_E_NOMEM, "out of memory opening %s", apath);
            break;
        }
        L->arrays = arr;
        zb__at_array *x = &arr[L->n];
        memset(x, 0, sizeof *x);
        snprintf(x->group, sizeof x->group, "%s", group);
        snprintf(x->name, sizeof x->name, "%s", c.names[i]);
        x->level = zb__at_level_of(fields, group, c.names[i]);
        st = zb_array_open(store, apath, &x->a);
        if (st != ZB_OK) break;
        L->n++;
        zb_array_get_info(x->a, &x->info);
        if (x->info.ndim < 1) {
            st = zb__err(ZB_E_CORRUPT, "%s: a field array needs at least one dimension", apath);
            break;
        }
    }
    for (size_t i = 0; i < c.n; i++) free(c.names[i]);
    free(c.names);
    return st;
}

zb_status
zb__at_layout_open(zb_store *store, const char *path, zb__at_layout *L)
{
    memset(L, 0, sizeof *L);
    ZB_TRY(zb_key_normalize(path, L->path, sizeof L->path));
    char key[ZB_AT_KEY_CAP];
    zb_status st = ZB_OK;
    json_object *doc = NULL;

    ZB_TRY(zb__at_join(key, sizeof key, L->path, "zarr.json"));
    if (!zb__at_has_key(store, key)) {
        char mk[ZB_AT_KEY_CAP];
        ZB_TRY(zb__at_join(mk, sizeof mk, L->path, ZB_INCOMPLETE_MARKER));
        if (zb__at_has_key(store, mk))
            return zb__err(ZB_E_INCOMPLETE,
                           "'%s': a new atomic store that was never committed "
                           "(%s present, no zarr.json)",
                           L->path, ZB_INCOMPLETE_MARKER);
        ZB_TRY(zb__at_join(mk, sizeof mk, L->path, ".zgroup"));
        if (zb__at_has_key(store, mk))
            return zb__err(ZB_E_UNSUPPORTED, "'%s': a Zarr v2 group; atomic stores are Zarr v3",
                           L->path);
        return zb__err(ZB_E_NOTFOUND, "'%s': no atomic store here (no zarr.json)", L->path);
    }
    st = read_json(store, key, &doc);
    if (st != ZB_OK) goto fail;
    json_object *nt = zb__json_get(doc, "node_type");
    if (!nt || !json_object_is_type(nt, json_type_string) ||
        strcmp(json_object_get_string(nt), "group") != 0) {
        st = zb__err(ZB_E_METADATA, "%s: not a group document", key);
        goto fail;
    }
    json_object *attrs = zb__json_get(doc, "attributes");
    L->attrs = attrs && json_object_is_type(attrs, json_type_object) ? json_object_get(attrs)
                                                                     : json_object_new_object();
    if (!L->attrs) {
        st = zb__err(ZB_E_NOMEM, "out of memory");
        goto fail;
    }
    json_object *ns = zb__json_get(L->attrs, "num_samples");
    if (!ns) {
        st = zb__err(ZB_E_METADATA, "%s: the root attributes have no num_samples", key);
        goto fail;
    }
    st = zb__json_u64(ns, "root attribute num_samples", &L->num_samples);
    if (st != ZB_OK) goto fail;
    json_object *fields = zb__json_get(L->attrs, "fields");
    if (fields && !json_object_is_type(fields, json_type_object)) {
        st = zb__err(ZB_E_METADATA, "%s: the root attribute 'fields' is not an object", key);
        goto fail;
    }
    for (int m = 0; m < ZB_AT_NMETA; m++) {
        char apath[ZB_AT_KEY_CAP];
        st = zb__at_join3(apath, sizeof apath, L->path, "meta", zb__at_meta_names[m]);
        if (st != ZB_OK) goto fail;
        st = zb_array_open(store, apath, &L->meta[m]);
        if (st == ZB_E_NOTFOUND && m >= ZB_AT_ATOMS_MASK) {
            /* written by nvalchemi but never read upstream: tolerate their absence */
            zb_clear_error();
            st = ZB_OK;
            continue;
        }
        if (st != ZB_OK) {
            if (st == ZB_E_NOTFOUND) st = zb__err(ZB_E_CORRUPT, "%s: missing", apath);
            goto fail;
        }
        zb_array_info info;
        zb_array_get_info(L->meta[m], &info);
        bool mask = m >= ZB_AT_SAMPLES_MASK;
        if (info.ndim != 1 ||
            (mask ? info.dtype != ZB_DT_BOOL : !zb__at_dtype_is_int(info.dtype))) {
            st = zb__err(ZB_E_CORRUPT, "%s: expected a 1-d %s array, found %s with %d dimensions",
                         apath, mask ? "bool" : "integer", zb_dtype_name(info.dtype), info.ndim);
            goto fail;
        }
        L->meta_rows[m] = info.shape[0];
    }
    st = open_group_arrays(store, L, "core", fields);
    if (st == ZB_OK) st = open_group_arrays(store, L, "custom", fields);
    if (st != ZB_OK) goto fail;
    json_object_put(doc);
    return ZB_OK;
fail:
    json_object_put(doc);
    zb__at_layout_close(L);
    return st;
}

void
zb__at_layout_close(zb__at_layout *L)
{
    if (!L) return;
    json_object_put(L->attrs);
    for (int m = 0; m < ZB_AT_NMETA; m++) zb_array_close(L->meta[m]);
    for (size_t i = 0; i < L->n; i++) zb_array_close(L->arrays[i].a);
    free(L->arrays);
    memset(L, 0, sizeof *L);
}
