/* Datasets (internal view): fields, segments, layouts, masks, collections. */
#ifndef ZB_DATASET_DATASET_H
#define ZB_DATASET_DATASET_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "util/cache.h"
#include "util/pool.h"
#include "zarr/array.h"
#include "zbatch.h"

#define ZB_MAX_FIELDS 256
#define ZB_MAX_SEGMENTS 8

/* A pointer array ptr[N+1], read lazily chunk by chunk and kept as int64. */
typedef struct zb__segment {
    char name[32];
    zb_array *ptr;
    uint64_t chunk_rows; /* rows per cached block (the array's read unit along axis 0) */
    uint64_t nblocks;
    int64_t **blocks; /* [nblocks], NULL until loaded; guarded by mu */
    pthread_mutex_t mu;
} zb__segment;

/* A category table (the labels of a categorical field): strings, or numbers of `dtype`. */
typedef struct zb__cattab {
    zb_dtype dtype; /* ZB_DT_STRING, or the labels' numeric dtype */
    uint64_t n;
    zb_strings strings; /* ZB_DT_STRING */
    uint8_t *values;    /* numeric: n * zb_dtype_size(dtype) bytes, native order */
    bool ordered;
} zb__cattab;

void zb__cattab_free(zb__cattab *t);

/* One field of one child: the array behind it. */
typedef struct zb__field {
    char *name;
    zb_field_kind kind;
    zb_dtype dtype;
    size_t itemsize; /* 0 for strings */
    int ndim;        /* of one row */
    uint64_t row_shape[ZB_MAX_DIMS];
    uint64_t row_elems;
    int seg;            /* segment index (ragged/index), else -1 */
    int target;         /* index: target segment, else -1 */
    zb_dtype out_dtype; /* delivered in batches: dtype, or wider (zb_dataset_opts
                                         x_dtype/index_dtype, widen.c) */
    bool categorical;
    bool global_index;  /* index values are store-global (nvalchemi): subtract ptr */
    bool var_cols;      /* anndata X: values are gene ids (CSR indices), or rows
                                         of n_vars genes (dense): reorder_vars remaps them */
    uint64_t col_bound; /* CSR column ids: values lie in [0, col_bound) (the
                                         matrix's columns, validate.c); 0 = unbounded */
    zb_array *arr;      /* the values */
    char *mask;         /* nullable: the name of the companion mask field */
    char *cats_path;    /* categorical: the categories array path */
    zb_array *cats_arr; /* categorical: the categories, opened from the dataset's tree (the
                         * snapshot when it uses one); NULL: opened by path when loaded */
    bool cats_ordered;  /* categorical: the `ordered` attribute */
    zb__cattab cats;    /* loaded on first request (zb_dataset_category_table) */
    bool cats_loaded;
} zb__field;

/* An obs column as anndata lists it (zb_dataset_column). Non-string columns are read through
 * the field of the same name; string columns through their own arrays. */
typedef struct zb__column {
    char *name; /* "obs_names" or "obs/NAME" */
    zb_column_kind kind;
    zb_dtype dtype;
    zb_array *values; /* strings: the string array (NULL for the other kinds) */
    zb_array *mask;   /* nullable strings: the mask */
} zb__column;

/* A soft-delete mask: logical i is the i-th true (FORMATS.md §8.2). Loaded on first use. */
typedef struct zb__mask {
    zb_array *arr; /* NULL: no mask, logical == physical */
    bool loaded;
    uint8_t *bits;  /* [nphys] 0/1 */
    uint64_t *rank; /* [nblocks+1] trues before each block of MASK_BLOCK samples */
    uint64_t nlogical;
    uint64_t n; /* entries used: the committed samples */
    pthread_mutex_t mu;
} zb__mask;

typedef struct zb__arena_pool zb__arena_pool;

/* Reused batch memory (reader.c): a pool of blocks shared by a dataset and its batches. */
zb_status zb__arena_pool_new(zb__arena_pool **out);
void zb__arena_pool_unref(zb__arena_pool *p);

/* A unit row a read touches (zb__dataset_plan_units): unit g0 along axis 0 of `arr`, with
 * every unit of its other axes. */
typedef struct zb__plan_unit {
    const zb_array *arr;
    uint64_t g0;
} zb__plan_unit;

/* The unit rows a read of ids[0..n) touches, each listed once, exactly as the reader plans the
 * read (plan.c; string fields are not read into batches), and the stored bytes of the rows it
 * delivers. *units is malloc'd (free with free()). For `zbatch bench`'s decode-only limits. */
zb_status zb__dataset_plan_units(zb_dataset *ds, const uint64_t *ids, size_t n,
                                 zb__plan_unit **units, size_t *nunits, uint64_t *bytes_delivered);

/* Where a pool's blocks come from: malloc/free by default, page-locked memory for a loader
 * that delivers to a device (loader/device.c). `release(user)` runs when the pool is gone. */
typedef struct zb__arena_alloc {
    void *(*alloc)(size_t nbytes, void *user);
    void (*free)(void *block, void *user);
    void (*release)(void *user);
    void *user;
} zb__arena_alloc;
zb_status zb__arena_pool_new_with(const zb__arena_alloc *alloc, zb__arena_pool **out);

/* read_many's plan memory kept between requests (reader.c); freed by zb_dataset_close. */
typedef struct zb__plan_mem zb__plan_mem;
void zb__plan_mem_release_all(zb_dataset *ds);

/* How a collection delivers field f of its children (merge.c): the dtype batches carry and,
 * per child, the table its stored values go through (categorical codes: child code -> the
 * collection's code). A NULL table: the child's values are delivered as stored. */
typedef struct zb__fieldmap {
    zb_dtype dtype;          /* delivered */
    int64_t **lut;           /* [nchildren] */
    uint64_t *nlut;          /* [nchildren] entries of each table */
    zb__cattab cats;         /* categorical, when the children's tables differ: their union */
    const zb__cattab *table; /* categorical: the collection's table (cats, or the first
                                child's when every child has the same one) */
    bool ordered;            /* categorical: ordered in every child, with one table (zbatch
                                convert's rule: an order not every input has is no order) */
} zb__fieldmap;

/* A collection's var order (reorder_vars): child c's gene j is the collection's gene
 * var_lut[c][j]; var_lut[c] NULL: the child's order is the collection's. */
typedef struct zb__varmap {
    int64_t **lut; /* [nchildren] */
} zb__varmap;

struct zb_dataset {
    zb_store *store;
    char *path;
    char *name; /* zb_dataset_name */
    char layout[24];
    zb_dataset_opts opts;
    char *layer;            /* opts.layer, owned (opts.layer points here) */
    int x_want, index_want; /* opts.x_dtype/index_dtype as read at open (ZB_WANT_* or a
                                zb_dtype); opts' pointers are not kept */
    uint64_t nphys;         /* physical samples */
    uint64_t n_vars;
    zb__mask mask;
    size_t nfields;
    zb__field fields[ZB_MAX_FIELDS];
    size_t nsegs;
    zb__segment segs[ZB_MAX_SEGMENTS];
    /* anndata: obs columns (zb_dataset_column) and var names */
    size_t ncols;
    zb__column *cols;
    char *var_frame;      /* the var data frame's group (raw/var with layer "raw") */
    char *var_index;      /* the var index array's path, NULL when unknown */
    zb_strings var_names; /* loaded on first request (var_mu) */
    bool var_loaded;
    pthread_mutex_t var_mu;
    /* collections: children and their cumulative logical sizes */
    size_t nchildren;
    zb_dataset **children;
    uint64_t *child_start; /* [nchildren+1] */
    zb__fieldmap *maps;    /* [children[0]->nfields]: how each field is delivered (merge.c) */
    zb__varmap vars;       /* reorder_vars */
    /* shared by every read */
    zb__pool *pool;
    pthread_mutex_t pool_mu; /* one read_many at a time drives the pool */
    zb__cache *cache;
    zb__cache *index_cache; /* decoded shard indexes, always on (bounded) */
    zb__cache *fetch_cache; /* encoded units fetched from a store that lists ranges (exec.c) */
    zb__arena_pool *arenas; /* batch memory, reused across reads */
    pthread_mutex_t plan_mu;
    /* a request's first reads of category tables and shard indexes (plan_checks,
     * prefetch_indexes), one request at a time: two windows read together (the loader's) find
     * what the first fetched instead of fetching it too */
    pthread_mutex_t fetch_mu;
    struct zb__plan_mem *plan_free; /* read_many's plan memory, reused across reads (reader.c) */
    size_t plan_nfree;
    bool is_child;
    bool borrowed; /* children belong to the caller (zb_dataset_concat) */
};

/* zb_dataset.x_want/index_want: the default rule, or as stored (else a zb_dtype). */
#define ZB_WANT_AUTO (-2)
#define ZB_WANT_STORED (-1)

/* Collections (merge.c): checks that children agree (fields, obs columns, var names) and
 * builds ds->maps (one category table per categorical field, codes remapped) and ds->vars.
 * `code` is the status for disagreeing children (ZB_E_CORRUPT for a stored collection,
 * ZB_E_INVALID for a concatenation). */
zb_status zb__collection_merge(zb_dataset *ds, zb_status code);

/* zb_dataset_open below the normalised path `norm`, from `tree` when not NULL (loaded there
 * with opts' use_consolidated; it stays the caller's), else from the tree it loads. */
struct zb__tree;
zb_status zb__dataset_open_tree(zb_store *store, const char *norm, const struct zb__tree *tree,
                                const zb_dataset_opts *opts, zb_dataset **out);

/* The dtype batches carry for field f (the children's delivered dtype, or a collection's wider
 * codes). */
zb_dtype zb__dataset_field_dtype(const zb_dataset *ds, size_t f);

/* A collection's table for child c's values of field f (NULL: delivered as stored). */
static inline const int64_t *
zb__dataset_lut(const zb_dataset *ds, size_t f, size_t c, uint64_t *n)
{
    if (!ds->maps || !ds->maps[f].lut || !ds->maps[f].lut[c]) return NULL;
    *n = ds->maps[f].nlut[c];
    return ds->maps[f].lut[c];
}

/* Codes (any integer dtype `from`, n of them) through a table into dtype `to`: -1 (missing)
 * stays -1; others must index the table (ZB_E_CORRUPT naming `what` otherwise). A NULL table
 * converts the values as they are. */
zb_status zb__codes_convert(void *dst, zb_dtype to, const void *src, zb_dtype from, uint64_t n,
                            const int64_t *lut, uint64_t nlut, const char *what);

/* Whether dtype `to` holds every value of `from` exactly (the widenings the reader does as it
 * copies, widen.c; true when they are the same). */
bool zb__widen_exact(zb_dtype from, zb_dtype to);
/* n values of `from` at src (any alignment) into `to` at dst, when zb__widen_exact and they
 * differ; false (nothing written) for any other pair. */
bool zb__values_widen(void *dst, zb_dtype to, const void *src, zb_dtype from, uint64_t n);
/* n stored values of `from` as `to`, as batches carry them: widened (zb__values_widen) unless a
 * table is given, else codes converted through `lut` (zb__codes_convert). With `span` not
 * NULL the values are range-checked in the same pass: *span is the largest
 * (uint64_t)(v - lo) over the delivered values v of an integer widening (0 for none), so every
 * v lies in [lo, lo + k) when *span < k; UINT64_MAX when this conversion does not tell (a
 * table, another conversion, a float destination): the caller checks the values written. */
zb_status zb__values_convert(void *dst, zb_dtype to, const void *src, zb_dtype from, uint64_t n,
                             const int64_t *lut, uint64_t nlut, const char *what, int64_t lo,
                             uint64_t *span);

/* Moves one child's gene order to the collection's (reorder_vars, merge.c). A dense row of
 * n_vars values of `itemsize` bytes is permuted through `scratch` (a row's bytes). A CSR row's
 * `nnz` gene ids (`idx`, integers of dtype idx_dtype) are mapped and the row re-sorted with its
 * values (`vals`, itemsize bytes each) so the ids ascend again; ZB_E_CORRUPT (naming `what`)
 * for an id outside [0, n_vars). */
void zb__var_reorder_dense(uint8_t *row, uint64_t n_vars, size_t itemsize, const int64_t *lut,
                           uint8_t *scratch);
struct zb__buf;
zb_status zb__var_reorder_csr(void *idx, zb_dtype idx_dtype, uint8_t *vals, size_t itemsize,
                              uint64_t nnz, const int64_t *lut, uint64_t n_vars,
                              struct zb__buf *scratch, const char *what);

/* Category tables (columns.c): the field's own table, loaded once. */
zb_status zb__field_load_categories(zb_dataset *ds, zb__field *f);
/* Loads the categories of fields f[i] of datasets ds[i] (n of them; the lists are reordered);
 * at_once: each not loaded yet on a thread of its own, all at once (a remote store: their reads' round trips overlap). The first
 * failure in list order is returned. */
zb_status zb__fields_load_categories(zb_dataset **ds, zb__field **f, size_t n, bool at_once);

/* Layout builders (layouts.c). Each fills fields/segments of ds from the tree. */
struct zb__tree;
zb_status zb__layout_anndata(zb_dataset *ds, const struct zb__tree *tree, const char *base);
zb_status zb__layout_atomistic(zb_dataset *ds, const struct zb__tree *tree, const char *base);
zb_status zb__layout_generic(zb_dataset *ds, const struct zb__tree *tree, const char *base);

/* The level ("atom", "edge", "system" or the attribute's own word) of array `name` in group
 * `group` ("core" or "custom") of an atomic store whose root `fields` attribute is `fields`
 * (may be NULL), per FORMATS.md §8.1-8.2. The reader and `zbatch verify` share it. */
struct json_object;
const char *zb__atomistic_array_level(struct json_object *fields, const char *group,
                                      const char *name);

/* Metadata rules of an atomic store shared by the reader (at open) and `zbatch verify`; no
 * data is read. `store` names the store in the message.
 * zb__atomistic_check_fields_attr: the root `fields` attribute (may be NULL, read as empty, as
 * nvalchemi does) is an object of groups, each an object of name -> "atom" / "node" / "edge" /
 * "system"; ZB_E_METADATA naming the entry otherwise.
 * zb__atomistic_check_required: core/positions ([V, 3] floats) and core/atomic_numbers ([V]
 * integers) exist (NULL meta = missing) and are atom-level: nvalchemi's AtomicData requires
 * both. ZB_E_CORRUPT naming the array and what is wrong otherwise. */
zb_status zb__atomistic_check_fields_attr(const char *store, struct json_object *fields);
zb_status zb__atomistic_check_required(const char *store, struct json_object *fields,
                                       const zb__array_meta *positions,
                                       const zb__array_meta *atomic_numbers);

/* Segment access: ptr[i] for i in [0, N]; thread-safe. */
zb_status zb__segment_get(zb__segment *seg, zb_ctx *ctx, uint64_t i, int64_t *value);

/* Logical -> physical through the mask (thread-safe, loads the mask on first use). */
zb_status zb__mask_load(zb_dataset *ds);
uint64_t zb__mask_select(const zb__mask *m, uint64_t logical);

#endif
