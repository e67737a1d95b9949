/* The atomistic layout writer (zb_atomic_writer): nvalchemi AtomicData stores (shared FORMATS.md §8), new or
 * appended to, on top of the array writer.
 *
 * One array writer per array: the five meta arrays and one per field. add() validates a whole
 * block before handing any row on, converts neighbor_list from per-sample local indices to the
 * store-global convention (FORMATS.md §8.3) and appends to every array writer; commit() commits
 * them in the order the header documents (data arrays, atoms_mask, edges_mask, atoms_ptr,
 * edges_ptr, samples_mask, then the root document: nvalchemi's reader takes its sample count
 * from the length of samples_mask, zbatch from num_samples). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/json.h"
#include "util/status.h"
#include "write/atomistic_int.h"
#include "write/write.h"

#define MSG_CAP 1024
#define ONES_CAP 65536

typedef struct zb__at_col {
    char group[8];
    char name[ZB_AT_NAME_CAP];
    zb_atomic_level level;
    zb_dtype dtype;
    int ndim; /* of one row */
    uint64_t shape[ZB_MAX_DIMS];
    uint64_t row_elems;
    size_t row_bytes;
    bool is_nlist;
    zb_array_writer *aw;
} zb__at_col;

struct zb_atomic_writer {
    zb_store *store;
    char path[ZB_AT_PATH_CAP];
    zb__at_cfg cfg;
    bool fresh;      /* a new store whose first commit has not happened */
    bool cols_fixed; /* the field set is known */
    bool copying;    /* rows come from a store (zb__at_writer_set_copying) */
    size_t ncols;
    zb__at_col *cols;
    zb_array_writer *meta[ZB_AT_NMETA];   /* the masks of atoms/edges may be NULL (absent) */
    uint64_t n_samples, n_atoms, n_edges; /* totals, pending rows included */
    json_object *attrs;                   /* root attributes to keep (owned) */
    zb__buf scratch;                      /* converted neighbor_list of one add */
    zb__buf ptrs;                         /* pointer values of one add */
    uint8_t *ones;                        /* ONES_CAP bytes of 1 (mask rows), made on first use */
    zb_status failed;
    char failed_msg[MSG_CAP];
};

static zb_status
fail_writer(zb_atomic_writer *w, zb_status st)
{
    if (w->failed == ZB_OK) {
        w->failed = st;
        snprintf(w->failed_msg, sizeof w->failed_msg, "%s", zb_last_error());
    }
    return st;
}

void
zb__at_writer_set_copying(zb_atomic_writer *w)
{
    w->copying = true;
}

static zb_status
check_usable(const zb_atomic_writer *w)
{
    if (w->failed == ZB_OK) return ZB_OK;
    return zb__err(w->failed, "atomic writer '%s' failed earlier and cannot continue: %s", w->path,
                   w->failed_msg);
}

static zb_status
writer_alloc(zb_store *store, const char *path, zb_atomic_writer **out)
{
    *out = NULL;
    zb_atomic_writer *w = calloc(1, sizeof *w);
    if (!w) return zb__err(ZB_E_NOMEM, "atomic writer: out of memory");
    w->store = store;
    zb_status st = zb_key_normalize(path, w->path, sizeof w->path);
    if (st != ZB_OK) {
        free(w);
        return st;
    }
    *out = w;
    return ZB_OK;
}

static zb_status
open_meta_new(zb_atomic_writer *w)
{
    for (int m = 0; m < ZB_AT_NMETA; m++) {
        char apath[ZB_AT_KEY_CAP];
        ZB_TRY(zb__at_join3(apath, sizeof apath, w->path, "meta", zb__at_meta_names[m]));
        zb_array_write_opts o;
        zb_dtype dt = m < ZB_AT_SAMPLES_MASK ? ZB_DT_INT64 : ZB_DT_BOOL;
        zb__at_cfg_resolve(&w->cfg, "meta", zb__at_meta_names[m], zb_dtype_size(dt), &o);
        ZB_TRY(zb_array_writer_open(w->store, apath, dt, 1, NULL, &o, &w->meta[m]));
    }
    static const int64_t zero = 0;
    ZB_TRY(zb_array_writer_append(w->meta[ZB_AT_ATOMS_PTR], &zero, 1));
    return zb_array_writer_append(w->meta[ZB_AT_EDGES_PTR], &zero, 1);
}

/* Clears what a crashed new write left at `path` (its marker is present, no root document):
 * only the layout's own children, never anything else the directory may hold. */
static zb_status
clear_debris(zb_store *store, const char *path)
{
    static const char *const kids[3] = {"meta", "core", "custom"};
    char key[ZB_AT_KEY_CAP];
    for (int i = 0; i < 3; i++) {
        ZB_TRY(zb__at_join(key, sizeof key, path, kids[i]));
        ZB_TRY(zb__at_remove_tree(store, key));
    }
    ZB_TRY(zb__at_join(key, sizeof key, path, ZB_INCOMPLETE_MARKER));
    return zb_store_erase(store, key);
}

zb_status
zb__at_writer_open_new(zb_store *store, const char *path, const zb__at_cfg *cfg,
                       json_object *base_attrs, zb_atomic_writer **out)
{
    zb_atomic_writer *w = NULL;
    ZB_TRY(writer_alloc(store, path, &w));
    zb_status st = ZB_OK;
    char key[ZB_AT_KEY_CAP], mk[ZB_AT_KEY_CAP];
    w->cfg = *cfg; /* taken over: the caller's copy is zeroed below */
    w->fresh = true;

    st = zb__at_join(key, sizeof key, w->path, "zarr.json");
    if (st == ZB_OK) st = zb__at_join(mk, sizeof mk, w->path, ZB_INCOMPLETE_MARKER);
    if (st != ZB_OK) goto fail;
    if (zb__at_has_key(store, key)) {
        st = zb__err(ZB_E_INVALID, "'%s': a group or array already exists here", w->path);
        goto fail;
    }
    if (zb__at_has_key(store, mk)) {
        st = clear_debris(store, w->path);
        if (st != ZB_OK) goto fail;
    } else {
        static const char *const kids[4] = {"meta", "core", "custom", ".zarray"};
        for (int i = 0; i < 4; i++) {
            st = zb__at_join(key, sizeof key, w->path, kids[i]);
            if (st != ZB_OK) goto fail;
            if (zb__at_has_keys_below(store, key) || zb__at_has_key(store, key)) {
                st = zb__err(ZB_E_INVALID, "'%s': not empty (holds '%s')", w->path, kids[i]);
                goto fail;
            }
        }
    }
    w->attrs = base_attrs ? json_object_get(base_attrs) : json_object_new_object();
    if (!w->attrs) {
        st = zb__err(ZB_E_NOMEM, "atomic writer: out of memory");
        goto fail;
    }
    /* num_samples first, as nvalchemi orders them; rewritten at every commit */
    if (json_object_object_add(w->attrs, "num_samples", json_object_new_int64(0)) != 0) {
        st = zb__err(ZB_E_NOMEM, "atomic writer: out of memory");
        goto fail;
    }
    st = zb__at_fields_set(w->attrs, NULL, NULL, ZB_ATOMIC_ATOM);
    if (st != ZB_OK) goto fail;
    /* the marker goes first: from here on the path is a store being written */
    static const char marker[] =
        "{\"writer\": \"zbatch atomic\", \"version\": \"" ZB_VERSION_STRING "\"}\n";
    st = zb_store_put(store, mk, marker, sizeof marker - 1);
    if (st != ZB_OK) goto fail;
    st = open_meta_new(w);
    if (st != ZB_OK) goto fail;
    *out = w;
    return ZB_OK;
fail:
    memset(&w->cfg, 0, sizeof w->cfg); /* still the caller's */
    zb_atomic_writer_close(w);
    return st;
}

zb_status
zb_atomic_writer_open(zb_store *store, const char *path, const zb_atomic_write_config *cfg,
                      zb_atomic_writer **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_atomic_writer_open: null out");
    *out = NULL;
    if (!store || !path) return zb__err(ZB_E_INVALID, "zb_atomic_writer_open: null argument");
    char p[ZB_AT_PATH_CAP], key[ZB_AT_KEY_CAP];
    ZB_TRY(zb_key_normalize(path, p, sizeof p));
    ZB_TRY(zb__at_join(key, sizeof key, p, "zarr.json"));
    /* a new store here would win over the real one at the next recovery */
    if (!zb__at_has_key(store, key) && zb__at_parked_elsewhere(store, p))
        return zb__err(ZB_E_INVALID,
                       "'%s': a defragment was interrupted and the dataset sits under "
                       "'%s.zbatch-new' or '%s.zbatch-old'; run zb_atomic_recover first",
                       p, p, p);
    zb__at_cfg c;
    ZB_TRY(zb__at_cfg_copy(cfg, &c));
    zb_status st = zb__at_writer_open_new(store, p, &c, NULL, out);
    if (st != ZB_OK) zb__at_cfg_free(&c);
    return st;
}

static zb_status
col_from_array(zb__at_col *c, const zb__at_array *x)
{
    snprintf(c->group, sizeof c->group, "%s", x->group);
    snprintf(c->name, sizeof c->name, "%s", x->name);
    c->level = x->level;
    c->dtype = x->info.dtype;
    if (c->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_UNSUPPORTED, "%s/%s: string arrays are not atomic fields", x->group,
                       x->name);
    c->ndim = x->info.ndim - 1;
    c->row_elems = 1;
    for (int d = 0; d < c->ndim; d++) {
        c->shape[d] = x->info.shape[d + 1];
        c->row_elems *= c->shape[d]; /* the array's own element count was overflow-checked */
    }
    c->row_bytes = (size_t)c->row_elems * x->info.itemsize;
    c->is_nlist = !strcmp(c->group, "core") && !strcmp(c->name, "neighbor_list");
    return ZB_OK;
}

zb_status
zb_atomic_writer_open_append(zb_store *store, const char *path, const zb_atomic_write_config *cfg,
                             zb_atomic_writer **out)
{
    if (!out) return zb__err(ZB_E_INVALID, "zb_atomic_writer_open_append: null out");
    *out = NULL;
    if (!store || !path)
        return zb__err(ZB_E_INVALID, "zb_atomic_writer_open_append: null argument");
    zb_atomic_writer *w = NULL;
    zb__at_layout L;
    memset(&L, 0, sizeof L);
    ZB_TRY(writer_alloc(store, path, &w));
    zb_status st = zb__at_cfg_copy(cfg, &w->cfg);
    if (st != ZB_OK) goto fail;
    /* an uncommitted new store is not recoverable: say so before recovery looks at it */
    char mk[ZB_AT_KEY_CAP], key[ZB_AT_KEY_CAP];
    st = zb__at_join(mk, sizeof mk, w->path, ZB_INCOMPLETE_MARKER);
    if (st == ZB_OK) st = zb__at_join(key, sizeof key, w->path, "zarr.json");
    if (st != ZB_OK) goto fail;
    if (zb__at_has_key(store, mk) && !zb__at_has_key(store, key)) {
        st = zb__err(ZB_E_INCOMPLETE, "'%s': a new atomic store that was never committed", w->path);
        goto fail;
    }
    st = zb_atomic_recover(store, w->path);
    if (st == ZB_OK) st = zb__at_layout_open(store, w->path, &L);
    if (st != ZB_OK) goto fail;

    /* after recovery every array has exactly the rows the committed samples need */
    uint64_t n = L.num_samples;
    int64_t tail[2];
    for (int m = 0; m < ZB_AT_NMETA; m++) {
        if (!L.meta[m]) continue;
        uint64_t want = m < ZB_AT_SAMPLES_MASK ? n + 1 : n;
        if (m == ZB_AT_ATOMS_MASK || m == ZB_AT_EDGES_MASK) continue; /* checked below */
        if (L.meta_rows[m] != want) {
            st = zb__err(ZB_E_CORRUPT, "%s/meta/%s: %llu rows, num_samples %llu needs %llu",
                         w->path, zb__at_meta_names[m], (unsigned long long)L.meta_rows[m],
                         (unsigned long long)n, (unsigned long long)want);
            goto fail;
        }
    }
    st = zb__at_read_i64(L.meta[ZB_AT_ATOMS_PTR], n, n + 1, &tail[0]);
    if (st == ZB_OK) st = zb__at_read_i64(L.meta[ZB_AT_EDGES_PTR], n, n + 1, &tail[1]);
    if (st != ZB_OK) goto fail;
    if (tail[0] < 0 || tail[1] < 0) {
        st = zb__err(ZB_E_CORRUPT, "%s/meta: negative pointer at sample %llu", w->path,
                     (unsigned long long)n);
        goto fail;
    }
    w->n_samples = n;
    w->n_atoms = (uint64_t)tail[0];
    w->n_edges = (uint64_t)tail[1];
    uint64_t want_rows[3] = {w->n_atoms, w->n_edges, n};
    if ((L.meta[ZB_AT_ATOMS_MASK] && L.meta_rows[ZB_AT_ATOMS_MASK] != w->n_atoms) ||
        (L.meta[ZB_AT_EDGES_MASK] && L.meta_rows[ZB_AT_EDGES_MASK] != w->n_edges)) {
        st = zb__err(ZB_E_CORRUPT,
                     "%s/meta: atoms_mask/edges_mask lengths %llu/%llu do not "
                     "match atoms_ptr/edges_ptr totals %llu/%llu",
                     w->path, (unsigned long long)L.meta_rows[ZB_AT_ATOMS_MASK],
                     (unsigned long long)L.meta_rows[ZB_AT_EDGES_MASK],
                     (unsigned long long)w->n_atoms, (unsigned long long)w->n_edges);
        goto fail;
    }
    w->cols = calloc(L.n ? L.n : 1, sizeof *w->cols);
    if (!w->cols) {
        st = zb__err(ZB_E_NOMEM, "atomic writer: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < L.n; i++) {
        const zb__at_array *x = &L.arrays[i];
        uint64_t want = want_rows[x->level];
        if (x->info.shape[0] != want) {
            st = zb__err(ZB_E_CORRUPT,
                         "%s/%s/%s: %llu rows, but the %llu committed samples need %llu (%s "
                         "level); the array was not extended with the others",
                         w->path, x->group, x->name, (unsigned long long)x->info.shape[0],
                         (unsigned long long)n, (unsigned long long)want,
                         zb_atomic_level_name(x->level));
            goto fail;
        }
        st = col_from_array(&w->cols[i], x);
        if (st != ZB_OK) goto fail;
        w->ncols++;
    }
    w->cols_fixed = true;
    zb_array_write_opts o = ZB_ARRAY_WRITE_OPTS_DEFAULT;
    o.num_threads = w->cfg.num_threads;
    for (size_t i = 0; i < w->ncols; i++) {
        char apath[ZB_AT_KEY_CAP];
        st = zb__at_join3(apath, sizeof apath, w->path, w->cols[i].group, w->cols[i].name);
        if (st == ZB_OK) st = zb_array_writer_open_append(store, apath, &o, &w->cols[i].aw);
        if (st != ZB_OK) goto fail;
    }
    for (int m = 0; m < ZB_AT_NMETA; m++) {
        if (!L.meta[m]) continue;
        char apath[ZB_AT_KEY_CAP];
        st = zb__at_join3(apath, sizeof apath, w->path, "meta", zb__at_meta_names[m]);
        if (st == ZB_OK) st = zb_array_writer_open_append(store, apath, &o, &w->meta[m]);
        if (st != ZB_OK) goto fail;
    }
    w->attrs = json_object_get(L.attrs);
    st = zb__at_fields_set(w->attrs, NULL, NULL, ZB_ATOMIC_ATOM);
    if (st != ZB_OK) goto fail;
    zb__at_layout_close(&L);
    *out = w;
    return ZB_OK;
fail:
    zb__at_layout_close(&L);
    zb_atomic_writer_close(w);
    return st;
}

/* ------------------------------------------------------------------------------------------- */
/* add                                                                                          */
/* ------------------------------------------------------------------------------------------- */

static const char *
field_group(const zb_atomic_field *f)
{
    return f->group ? f->group : "core";
}

/* Validates one field description on its own (not against the store). */
static zb_status
check_field(const zb_atomic_field *f)
{
    const char *g = field_group(f);
    if (strcmp(g, "core") != 0 && strcmp(g, "custom") != 0)
        return zb__err(ZB_E_INVALID, "field '%s': group '%s' is neither core nor custom",
                       f->name ? f->name : "?", g);
    ZB_TRY(zb__at_check_name("field", f->name));
    if (f->level != ZB_ATOMIC_ATOM && f->level != ZB_ATOMIC_EDGE && f->level != ZB_ATOMIC_SYSTEM)
        return zb__err(ZB_E_INVALID, "field %s/%s: level %d is not atom, edge or system", g,
                       f->name, (int)f->level);
    if (f->dtype < 0 || f->dtype >= ZB_DT_COUNT_ || f->dtype == ZB_DT_STRING)
        return zb__err(ZB_E_INVALID, "field %s/%s: dtype must be a fixed-size type", g, f->name);
    if (f->ndim < 0 || f->ndim > ZB_MAX_DIMS - 1)
        return zb__err(ZB_E_INVALID, "field %s/%s: ndim %d is outside 0..%d", g, f->name, f->ndim,
                       ZB_MAX_DIMS - 1);
    if (f->ndim && !f->shape)
        return zb__err(ZB_E_INVALID, "field %s/%s: shape is NULL with ndim %d", g, f->name,
                       f->ndim);
    for (int d = 0; d < f->ndim; d++)
        if (f->shape[d] == 0)
            return zb__err(ZB_E_INVALID, "field %s/%s: row shape has a zero dimension", g, f->name);
    /* what every reader needs of the two required fields (docs/ERRORS.md, "Atomic stores") */
    if (!strcmp(g, "core") && !strcmp(f->name, "positions") &&
        (f->level != ZB_ATOMIC_ATOM || f->ndim != 1 || f->shape[0] != 3 ||
         (f->dtype != ZB_DT_FLOAT16 && f->dtype != ZB_DT_FLOAT32 && f->dtype != ZB_DT_FLOAT64)))
        return zb__err(ZB_E_INVALID, "field core/positions must be atom level, floating point, "
                                     "with rows of shape (3)");
    if (!strcmp(g, "core") && !strcmp(f->name, "atomic_numbers") &&
        (f->level != ZB_ATOMIC_ATOM || f->ndim != 0 || !zb__at_dtype_is_int(f->dtype)))
        return zb__err(ZB_E_INVALID, "field core/atomic_numbers must be atom level, an integer "
                                     "type, one value per atom");
    if (!strcmp(g, "core") && !strcmp(f->name, "neighbor_list")) {
        if (f->level != ZB_ATOMIC_EDGE || !zb__at_dtype_is_int(f->dtype) || f->ndim != 1 ||
            f->shape[0] != 2)
            return zb__err(ZB_E_INVALID, "field core/neighbor_list must be edge level, an "
                                         "integer type, with rows of shape (2)");
    }
    return ZB_OK;
}

static bool
col_matches(const zb__at_col *c, const zb_atomic_field *f)
{
    return !strcmp(c->group, field_group(f)) && !strcmp(c->name, f->name);
}

static zb_status
col_init(zb__at_col *c, const zb_atomic_field *f)
{
    memset(c, 0, sizeof *c);
    snprintf(c->group, sizeof c->group, "%s", field_group(f));
    snprintf(c->name, sizeof c->name, "%s", f->name);
    c->level = f->level;
    c->dtype = f->dtype;
    c->ndim = f->ndim;
    c->row_elems = 1;
    for (int d = 0; d < f->ndim; d++) {
        c->shape[d] = f->shape[d];
        if (!zb__mul_u64(c->row_elems, f->shape[d], &c->row_elems) || c->row_elems > ZB_BUF_MAX)
            return zb__err(ZB_E_OVERFLOW, "field %s/%s: row shape too large", c->group, c->name);
    }
    c->row_bytes = (size_t)c->row_elems * zb_dtype_size(c->dtype);
    c->is_nlist = !strcmp(c->group, "core") && !strcmp(c->name, "neighbor_list");
    return ZB_OK;
}

/* Fixes the field set from the first add of a new store and opens its array writers (which
 * writes nothing yet). */
static zb_status
fix_columns(zb_atomic_writer *w, size_t n_fields, const zb_atomic_field *fields)
{
    zb__at_col *cols = calloc(n_fields ? n_fields : 1, sizeof *cols);
    if (!cols) return zb__err(ZB_E_NOMEM, "atomic writer: out of memory");
    zb_status st = ZB_OK;
    size_t i;
    for (i = 0; i < n_fields && st == ZB_OK; i++) st = col_init(&cols[i], &fields[i]);
    for (i = 0; i < n_fields && st == ZB_OK; i++) {
        char apath[ZB_AT_KEY_CAP];
        zb_array_write_opts o;
        zb__at_cfg_resolve(&w->cfg, cols[i].group, cols[i].name, cols[i].row_bytes, &o);
        st = zb__at_join3(apath, sizeof apath, w->path, cols[i].group, cols[i].name);
        if (st == ZB_OK)
            st = zb_array_writer_open(w->store, apath, cols[i].dtype, cols[i].ndim + 1,
                                      cols[i].shape, &o, &cols[i].aw);
    }
    if (st != ZB_OK) {
        for (i = 0; i < n_fields; i++) zb_array_writer_close(cols[i].aw);
        free(cols);
        return st;
    }
    w->cols = cols;
    w->ncols = n_fields;
    w->cols_fixed = true;
    return ZB_OK;
}

/* Checks that `fields` names exactly the writer's columns, with the same levels, dtypes and row
 * shapes; map[i] is the field of column i. */
static zb_status
match_fields(const zb_atomic_writer *w, size_t n_fields, const zb_atomic_field *fields, size_t *map)
{
    /* a field the store does not have, first: adding it needs add_custom */
    for (size_t j = 0; j < n_fields; j++) {
        bool found = false;
        for (size_t i = 0; i < w->ncols && !found; i++)
            found = col_matches(&w->cols[i], &fields[j]);
        if (!found)
            return zb__err(ZB_E_INVALID,
                           "field %s/%s is not in the store '%s' (its fields are fixed; a custom "
                           "field is added to every sample with zb_atomic_add_custom)",
                           field_group(&fields[j]), fields[j].name, w->path);
    }
    for (size_t i = 0; i < w->ncols; i++) {
        const zb__at_col *c = &w->cols[i];
        size_t hit = SIZE_MAX;
        for (size_t j = 0; j < n_fields; j++)
            if (col_matches(c, &fields[j])) {
                if (hit != SIZE_MAX)
                    return zb__err(ZB_E_INVALID, "field %s/%s is given twice", c->group, c->name);
                hit = j;
            }
        if (hit == SIZE_MAX)
            return zb__err(ZB_E_INVALID,
                           "field %s/%s is missing from the appended data: every array of the "
                           "store '%s' must be extended (nothing was written)",
                           c->group, c->name, w->path);
        const zb_atomic_field *f = &fields[hit];
        if (f->level != c->level)
            return zb__err(ZB_E_INVALID, "field %s/%s: level %s, the store has %s", c->group,
                           c->name, zb_atomic_level_name(f->level), zb_atomic_level_name(c->level));
        if (f->dtype != c->dtype)
            return zb__err(ZB_E_INVALID, "field %s/%s: dtype %s, the store has %s", c->group,
                           c->name, zb_dtype_name(f->dtype), zb_dtype_name(c->dtype));
        bool same = f->ndim == c->ndim;
        for (int d = 0; same && d < f->ndim; d++) same = f->shape[d] == c->shape[d];
        if (!same)
            return zb__err(ZB_E_INVALID,
                           "field %s/%s: row shape differs from the store's "
                           "(%d dimensions given, %d stored)",
                           c->group, c->name, f->ndim, c->ndim);
        map[i] = hit;
    }
    return ZB_OK;
}

/* Validates the local neighbor_list of a block and converts it into w->scratch: each index
 * becomes local + (first atom of its sample). */
static zb_status
convert_nlist(zb_atomic_writer *w, const zb__at_col *c, const zb_atomic_field *f,
              uint64_t n_samples, const int64_t *atoms, const int64_t *edges, uint64_t n_edges)
{
    size_t isz = zb_dtype_size(c->dtype);
    ZB_TRY(zb__buf_reserve(&w->scratch, (size_t)n_edges * 2 * isz + 1));
    uint64_t atom_base = w->n_atoms, e = 0;
    for (uint64_t p = 0; p < n_samples; p++) {
        uint64_t na = (uint64_t)atoms[p];
        uint64_t ne = edges ? (uint64_t)edges[p] : 0;
        for (uint64_t k = 0; k < ne; k++, e++) {
            for (int s = 0; s < 2; s++) {
                int64_t v = zb__at_get_int(f->data, c->dtype, 2 * e + (uint64_t)s);
                if (v < 0 || (uint64_t)v >= na)
                    return zb__err(ZB_E_INVALID,
                                   "core/neighbor_list: sample %llu of this block, edge %llu: "
                                   "local index %lld outside [0, %llu) (give per-sample 0-based "
                                   "indices)",
                                   (unsigned long long)p, (unsigned long long)k, (long long)v,
                                   (unsigned long long)na);
                if (!zb__at_set_int(w->scratch.data, c->dtype, 2 * e + (uint64_t)s,
                                    v + (int64_t)atom_base))
                    return zb__err(ZB_E_OVERFLOW,
                                   "core/neighbor_list: stored index %lld does not fit %s",
                                   (long long)(v + (int64_t)atom_base), zb_dtype_name(c->dtype));
            }
        }
        atom_base += na;
    }
    return ZB_OK;
}

/* The sample of the block that owns row `row` of a field at `level`. */
static uint64_t
sample_of_row(zb_atomic_level level, uint64_t row, const int64_t *atoms, const int64_t *edges,
              uint64_t n_samples)
{
    if (level == ZB_ATOMIC_SYSTEM) return row;
    const int64_t *count = level == ZB_ATOMIC_ATOM ? atoms : edges;
    uint64_t end = 0;
    for (uint64_t p = 0; count && p < n_samples; p++)
        if (row < (end += (uint64_t)count[p])) return p;
    return n_samples;
}

uint64_t
zb__at_first_non_finite(zb_dtype dtype, const void *data, uint64_t elems)
{
    uint64_t k = 0;
    if (dtype == ZB_DT_FLOAT32) {
        const float *x = data;
        while (k < elems && isfinite(x[k])) k++;
    } else if (dtype == ZB_DT_FLOAT64) {
        const double *x = data;
        while (k < elems && isfinite(x[k])) k++;
    } else if (dtype == ZB_DT_FLOAT16) {
        const uint16_t *x = data; /* all-ones exponent: infinity or NaN */
        while (k < elems && (x[k] & 0x7c00) != 0x7c00) k++;
    } else {
        k = elems;
    }
    return k;
}

/* Every value of a floating-point field is finite: a NaN or an infinity in a stored structure
 * is refused, naming the sample and the field (nvalchemi's writer stores them silently). */
static zb_status
check_finite(const zb_atomic_field *f, uint64_t rows, uint64_t row_elems, const int64_t *atoms,
             const int64_t *edges, uint64_t n_samples)
{
    uint64_t elems = rows * row_elems, k = zb__at_first_non_finite(f->dtype, f->data, elems);
    if (k == elems) return ZB_OK;
    uint64_t row = k / row_elems;
    return zb__err(ZB_E_INVALID,
                   "sample %llu of this block: field %s/%s: a non-finite value "
                   "(NaN or infinity) in row %llu of the block's %s rows",
                   (unsigned long long)sample_of_row(f->level, row, atoms, edges, n_samples),
                   field_group(f), f->name, (unsigned long long)row,
                   zb_atomic_level_name(f->level));
}

static zb_status
append_ones(zb_atomic_writer *w, zb_array_writer *aw, uint64_t n)
{
    if (!n) return ZB_OK;
    if (!w->ones) {
        w->ones = malloc(ONES_CAP);
        if (!w->ones) return zb__err(ZB_E_NOMEM, "atomic writer: out of memory");
        memset(w->ones, 1, ONES_CAP);
    }
    while (n) {
        uint64_t k = n < ONES_CAP ? n : ONES_CAP;
        ZB_TRY(zb_array_writer_append(aw, w->ones, k));
        n -= k;
    }
    return ZB_OK;
}

zb_status
zb_atomic_writer_add(zb_atomic_writer *w, uint64_t n_samples, const int64_t *atoms_per_sample,
                     const int64_t *edges_per_sample, size_t n_fields,
                     const zb_atomic_field *fields)
{
    if (!w) return zb__err(ZB_E_INVALID, "zb_atomic_writer_add: null writer");
    ZB_TRY(check_usable(w));
    if (n_samples && !atoms_per_sample)
        return zb__err(ZB_E_INVALID, "zb_atomic_writer_add: atoms_per_sample is NULL");
    if (n_fields && !fields) return zb__err(ZB_E_INVALID, "zb_atomic_writer_add: fields is NULL");
    /* --- validation: nothing below this block may fail for a reason of the caller's --- */
    uint64_t v = 0, e = 0;
    for (uint64_t p = 0; p < n_samples; p++) {
        int64_t a = atoms_per_sample[p], b = edges_per_sample ? edges_per_sample[p] : 0;
        if (a < 0 || b < 0)
            return zb__err(ZB_E_INVALID, "sample %llu of this block: negative atom or edge count",
                           (unsigned long long)p);
        if (!zb__add_u64(v, (uint64_t)a, &v) || !zb__add_u64(e, (uint64_t)b, &e))
            return zb__err(ZB_E_OVERFLOW, "atom or edge totals overflow");
    }
    uint64_t tv, te, tn;
    if (!zb__add_u64(w->n_atoms, v, &tv) || !zb__add_u64(w->n_edges, e, &te) ||
        !zb__add_u64(w->n_samples, n_samples, &tn) || tv > (uint64_t)INT64_MAX ||
        te > (uint64_t)INT64_MAX)
        return zb__err(ZB_E_OVERFLOW, "atom or edge totals overflow int64");
    for (size_t j = 0; j < n_fields; j++) ZB_TRY(check_field(&fields[j]));
    for (size_t j = 0; j < n_fields; j++)
        for (size_t k = j + 1; k < n_fields; k++)
            if (!strcmp(field_group(&fields[j]), field_group(&fields[k])) &&
                !strcmp(fields[j].name, fields[k].name))
                return zb__err(ZB_E_INVALID, "field %s/%s is given twice", field_group(&fields[j]),
                               fields[j].name);
    bool fixing = !w->cols_fixed;
    size_t *map =
        calloc(w->cols_fixed ? (w->ncols ? w->ncols : 1) : (n_fields ? n_fields : 1), sizeof *map);
    if (!map) return zb__err(ZB_E_NOMEM, "atomic writer: out of memory");
    zb_status st = ZB_OK;
    if (w->cols_fixed) {
        st = match_fields(w, n_fields, fields, map);
    } else {
        for (size_t j = 0; j < n_fields; j++) map[j] = j;
    }
    const zb__at_col *nl_col = NULL;
    const zb_atomic_field *nl_field = NULL;
    size_t ncheck = w->cols_fixed ? w->ncols : n_fields;
    for (size_t i = 0; st == ZB_OK && i < ncheck; i++) {
        const zb_atomic_field *f = &fields[map[i]];
        uint64_t rows = f->level == ZB_ATOMIC_ATOM ? v : f->level == ZB_ATOMIC_EDGE ? e : n_samples;
        uint64_t elems = 1, bytes;
        for (int d = 0; d < f->ndim; d++)
            if (!zb__mul_u64(elems, f->shape[d], &elems)) elems = UINT64_MAX;
        if (!zb__mul_u64(rows, elems, &bytes) ||
            !zb__mul_u64(bytes, zb_dtype_size(f->dtype), &bytes))
            st =
                zb__err(ZB_E_OVERFLOW, "field %s/%s: data size overflows", field_group(f), f->name);
        else if (rows && !f->data)
            st = zb__err(ZB_E_INVALID, "field %s/%s: data is NULL for %llu rows", field_group(f),
                         f->name, (unsigned long long)rows);
        else if (f->dtype == ZB_DT_BOOL) {
            const uint8_t *b = f->data;
            for (uint64_t k = 0; k < bytes; k++)
                if (b[k] > 1) {
                    st = zb__err(ZB_E_INVALID, "field %s/%s: bool element %llu is %u, not 0 or 1",
                                 field_group(f), f->name, (unsigned long long)k, b[k]);
                    break;
                }
        }
        if (st == ZB_OK && rows && !w->copying)
            st = check_finite(f, rows, elems, atoms_per_sample, edges_per_sample, n_samples);
        if (st == ZB_OK && !strcmp(field_group(f), "core") && !strcmp(f->name, "neighbor_list")) {
            nl_field = f;
            nl_col = w->cols_fixed ? &w->cols[i] : NULL;
        }
    }
    zb__at_col tmp_nl;
    if (st == ZB_OK && nl_field && !nl_col) {
        st = col_init(&tmp_nl, nl_field);
        nl_col = &tmp_nl;
    }
    if (st == ZB_OK && nl_field)
        st = convert_nlist(w, nl_col, nl_field, n_samples, atoms_per_sample, edges_per_sample, e);
    if (st == ZB_OK) st = zb__buf_reserve(&w->ptrs, (size_t)n_samples * 16 + 1);
    if (st == ZB_OK && fixing) st = fix_columns(w, n_fields, fields);
    if (st != ZB_OK) {
        free(map);
        return st;
    }

    /* --- writing: a failure from here on leaves the array writers out of step --- */
    for (size_t i = 0; st == ZB_OK && i < w->ncols; i++) {
        const zb_atomic_field *f = &fields[map[i]];
        const zb__at_col *c = &w->cols[i];
        uint64_t rows = c->level == ZB_ATOMIC_ATOM ? v : c->level == ZB_ATOMIC_EDGE ? e : n_samples;
        const void *src = c->is_nlist ? (const void *)w->scratch.data : f->data;
        if (rows) st = zb_array_writer_append(c->aw, src, rows);
    }
    free(map);
    int64_t *ap = (int64_t *)(void *)w->ptrs.data, *ep = ap + n_samples;
    int64_t ra = (int64_t)w->n_atoms, re = (int64_t)w->n_edges;
    for (uint64_t p = 0; p < n_samples; p++) {
        ra += atoms_per_sample[p];
        re += edges_per_sample ? edges_per_sample[p] : 0;
        ap[p] = ra;
        ep[p] = re;
    }
    if (st == ZB_OK && w->meta[ZB_AT_ATOMS_MASK]) st = append_ones(w, w->meta[ZB_AT_ATOMS_MASK], v);
    if (st == ZB_OK && w->meta[ZB_AT_EDGES_MASK]) st = append_ones(w, w->meta[ZB_AT_EDGES_MASK], e);
    if (st == ZB_OK && n_samples)
        st = zb_array_writer_append(w->meta[ZB_AT_ATOMS_PTR], ap, n_samples);
    if (st == ZB_OK && n_samples)
        st = zb_array_writer_append(w->meta[ZB_AT_EDGES_PTR], ep, n_samples);
    if (st == ZB_OK) st = append_ones(w, w->meta[ZB_AT_SAMPLES_MASK], n_samples);
    if (st != ZB_OK) return fail_writer(w, st);
    w->n_samples = tn;
    w->n_atoms = tv;
    w->n_edges = te;
    return ZB_OK;
}

/* ------------------------------------------------------------------------------------------- */
/* commit, close                                                                                */
/* ------------------------------------------------------------------------------------------- */

zb_status
zb_atomic_writer_commit(zb_atomic_writer *w)
{
    if (!w) return zb__err(ZB_E_INVALID, "zb_atomic_writer_commit: null writer");
    ZB_TRY(check_usable(w));
    zb_status st = ZB_OK;
    /* data first, then the pointers, then samples_mask (nvalchemi's sample count), then the root
     * (zbatch's): each array's own commit puts its chunks before its metadata */
    for (size_t i = 0; st == ZB_OK && i < w->ncols; i++) st = zb_array_writer_commit(w->cols[i].aw);
    static const int order[ZB_AT_NMETA] = {ZB_AT_ATOMS_MASK, ZB_AT_EDGES_MASK, ZB_AT_ATOMS_PTR,
                                           ZB_AT_EDGES_PTR, ZB_AT_SAMPLES_MASK};
    for (int k = 0; st == ZB_OK && k < ZB_AT_NMETA; k++)
        if (w->meta[order[k]]) st = zb_array_writer_commit(w->meta[order[k]]);
    if (st == ZB_OK && w->fresh) {
        static const char *const groups[3] = {"meta", "core", "custom"};
        for (int g = 0; st == ZB_OK && g < 3; g++) {
            char gpath[ZB_AT_KEY_CAP];
            st = zb__at_join(gpath, sizeof gpath, w->path, groups[g]);
            if (st == ZB_OK) st = zb__write_group(w->store, gpath, 3, NULL);
        }
    }
    if (st != ZB_OK) return st; /* puts are atomic: the last commit stays readable */
    if (json_object_object_add(w->attrs, "num_samples", zb__jw_u64(w->n_samples)) != 0)
        return zb__err(ZB_E_NOMEM, "atomic writer: out of memory");
    for (size_t i = 0; i < w->ncols; i++)
        ZB_TRY(zb__at_fields_set(w->attrs, w->cols[i].group, w->cols[i].name, w->cols[i].level));
    ZB_TRY(zb__at_write_root(w->store, w->path, w->attrs)); /* the commit point */
    if (w->fresh) {
        char mk[ZB_AT_KEY_CAP];
        ZB_TRY(zb__at_join(mk, sizeof mk, w->path, ZB_INCOMPLETE_MARKER));
        ZB_TRY(zb_store_erase(w->store, mk));
        w->fresh = false;
    }
    return ZB_OK;
}

uint64_t
zb_atomic_writer_num_samples(const zb_atomic_writer *w)
{
    return w ? w->n_samples : 0;
}

void
zb_atomic_writer_close(zb_atomic_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->ncols; i++) zb_array_writer_close(w->cols[i].aw);
    free(w->cols);
    for (int m = 0; m < ZB_AT_NMETA; m++) zb_array_writer_close(w->meta[m]);
    json_object_put(w->attrs);
    zb__buf_free(&w->scratch);
    zb__buf_free(&w->ptrs);
    free(w->ones);
    zb__at_cfg_free(&w->cfg);
    free(w);
}
